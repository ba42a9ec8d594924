"""Shapes and dtypes of the `lowp::` ops' tensors: how lowp stores codes and scales (the C
layouts), shared by the fake kernels, the native kernels and the portable ones.

An NVFP4 copy (kinds nv16, nv16x16) has two levels of scales, which the ops carry in one
uint8 tensor laid out as the C library stores them (`lowp_qtensor_nbytes`,
`lowp_qtensor_tensor_scale_offset`): the E4M3 block codes in their canonical 2-D order, row
by row, zero bytes up to a multiple of 4, then the 4 bytes of the binary32 tensor decode
scale D. A grouped copy's blocks are padded to the static bound first ([K, bound], as for
every grouped kind), then D follows. `nv_split` and `nv_join` convert between that tensor and
a `LowpQTensor`'s `scale` (the block codes, 2-D) and `tensor_scale` (D, shape [1])."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from ... import rules
from . import portable as P

__all__ = ["KN_KINDS", "OUT_DTYPES", "data_shape", "scale_dtype", "grouped_scale_bound",
           "empty", "trim_scale", "kn_check", "kn_cols", "op_scale_shape", "nv_nbytes", "nv_split",
           "nv_join"]

OUT_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}

# b_kn: the kinds whose columnwise copy is the rowwise copy transposed (lowp_gemm with b_layout
# KN): the C scaling table's (lowp.rules), plain operands first.
KN_KINDS = ("none",) + rules.kinds(transposes=True)


def data_shape(fmt: str, rows: int, cols: int):
    """The stored shape of [rows, cols] codes (E2M1: two per byte)."""
    return (rows, (cols + 1) // 2) if fmt == "e2m1" else (rows, cols)


def scale_dtype(scaling: str):
    return torch.uint8 if scaling in P.E8M0_KINDS + P.NV_KINDS else torch.float32


def grouped_scale_bound(scaling: str, tokens: int, groups: int) -> int:
    """Scale columns of a copy quantized along `tokens` in `groups` groups: the static bound
    the ops pad to (the real count depends on the offsets)."""
    bs = P.block_of(scaling)
    return (tokens + bs - 1) // bs + groups


def nv_nbytes(blocks: int) -> int:
    """Bytes of an NVFP4 scale tensor holding `blocks` E4M3 codes: the codes, zero-padded to a
    multiple of 4, then D."""
    return (blocks + 3) // 4 * 4 + 4


def op_scale_shape(scaling: str, rows: int, cols: int, groups: Optional[int] = None):
    """The shape of the ops' scale tensor of one [rows, cols] copy (`groups`: a copy quantized
    along its columns in groups, padded to the static bound)."""
    if groups is not None:
        sh = (rows, grouped_scale_bound(scaling, cols, groups))
    else:
        sh = tuple(P.scale_shape(scaling, rows, cols))
    return (nv_nbytes(sh[0] * sh[1]),) if scaling in P.NV_KINDS else sh


def nv_join(blocks: Tensor, d: Tensor) -> Tensor:
    """The ops' NVFP4 scale tensor of block codes `blocks` (2-D) and tensor scale `d`."""
    n = blocks.numel()
    pad = torch.zeros(nv_nbytes(n) - 4 - n, dtype=torch.uint8, device=blocks.device)
    tail = d.reshape(1).to(torch.float32).view(torch.uint8)
    return torch.cat([blocks.reshape(-1).to(torch.uint8), pad, tail])


def nv_split(scale: Tensor, sr: int, sc: int):
    """(block codes [sr, sc] uint8, D float32 [1]) of the ops' NVFP4 scale tensor."""
    d = scale[scale.shape[0] - 4:].clone().view(torch.float32)
    return scale[: sr * sc].reshape(sr, sc), d


def empty(dev) -> Tensor:
    """The ops' placeholder for a copy (or scales) not asked for."""
    return torch.empty(0, dtype=torch.uint8, device=dev)


def trim_scale(scale: Tensor, scaling: str, rows: int, cols: int,
               offs: Optional[Sequence[int]]) -> Tensor:
    """The real blocks of a (possibly padded) grouped scale array."""
    if offs is None:
        return scale
    nb = P.scale_shape(scaling, rows, cols, offs)[1]
    if scaling in P.NV_KINDS:
        blocks, d = nv_split(scale, rows, grouped_scale_bound(scaling, cols, len(offs)))
        return nv_join(blocks[:, :nb], d)
    return scale[:, :nb].contiguous()


def kn_cols(b: Tensor, b_format: str, n: int = -1) -> int:
    """N of an operand b given as stored, [K, N] (or a stack of them): `n` when given (>= 0);
    else b's stored columns, twice them for E2M1 codes (packed two a byte along N: the caller
    of an odd N passes n, or the pad nibble would read as one more column)."""
    if n >= 0:
        return n
    return b.shape[-1] * 2 if b_format == "e2m1" else b.shape[-1]


def kn_check(b_scaling: str, fn: str) -> None:
    if b_scaling not in KN_KINDS:
        raise ValueError(f"{fn}: b_scaling ({b_scaling}) runs along one axis, so b cannot be "
                         f"read as stored [K, N] (kinds that can: {', '.join(KN_KINDS)})")
