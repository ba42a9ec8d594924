"""Shapes and dtypes of the `lowp::` ops' tensors: how lowp stores codes and scales (the C
layouts), shared by the fake kernels, the native kernels and the portable ones."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from ... import rules
from . import portable as P

__all__ = ["KN_KINDS", "OUT_DTYPES", "data_shape", "scale_dtype", "grouped_scale_bound",
           "empty", "trim_scale", "kn_check"]

OUT_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}

# b_kn: the kinds whose columnwise copy is the rowwise copy transposed (lowp_gemm with b_layout
# KN): the C scaling table's (lowp.rules), plain operands first.
KN_KINDS = ("none",) + rules.kinds(transposes=True, tensor_scale=False)  # NVFP4: C-only


def data_shape(fmt: str, rows: int, cols: int):
    """The stored shape of [rows, cols] codes (E2M1: two per byte)."""
    return (rows, (cols + 1) // 2) if fmt == "e2m1" else (rows, cols)


def scale_dtype(scaling: str):
    return torch.uint8 if scaling in P.E8M0_KINDS else torch.float32


def grouped_scale_bound(scaling: str, tokens: int, groups: int) -> int:
    """Scale columns of a copy quantized along `tokens` in `groups` groups: the static bound
    the ops pad to (the real count depends on the offsets)."""
    bs = P.block_of(scaling)
    return (tokens + bs - 1) // bs + groups


def empty(dev) -> Tensor:
    """The ops' placeholder for a copy (or scales) not asked for."""
    return torch.empty(0, dtype=torch.uint8, device=dev)


def trim_scale(scale: Tensor, scaling: str, rows: int, cols: int,
               offs: Optional[Sequence[int]]) -> Tensor:
    """The real blocks of a (possibly padded) grouped scale array."""
    if offs is None:
        return scale
    nb = P.scale_shape(scaling, rows, cols, offs)[1]
    return scale[:, :nb].contiguous()


def kn_check(b_scaling: str, fn: str) -> None:
    if b_scaling not in KN_KINDS:
        raise ValueError(f"{fn}: b_scaling ({b_scaling}) runs along one axis, so b cannot be "
                         f"read as stored [K, N] (kinds that can: {', '.join(KN_KINDS)})")
