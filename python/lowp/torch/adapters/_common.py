"""Pieces the adapters share: the FP8 dtypes of lowp's format names, idempotent registration,
and torch._scaled_mm on tensorwise and rowwise operands (lowp's scales are the dequantization
multipliers, binary32, as torch._scaled_mm's scale_a and scale_b)."""

from __future__ import annotations

from typing import Callable, Iterable, Tuple

import torch
from torch import Tensor

from ..device_kernels import KernelKey, register_kernel

FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
OUT_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def register_once(device_type: str, kernels: Iterable[Tuple[str, str, Callable, Callable]]):
    """Register (op, name, fn, supports) entries not registered yet (nor removed by the
    user with unregister_kernel)."""
    from ..device_kernels import _TABLE, _UNREGISTERED  # available_kernels() would reload
    have = {k.name for k in _TABLE} | _UNREGISTERED
    for op, name, fn, supports in kernels:
        if name not in have:
            register_kernel(device_type, op, fn, name=name, supports=supports)


def fp8(codes: Tensor, fmt: str) -> Tensor:
    """uint8 codes viewed as torch's FP8 dtype (same bytes: E4M3FN and E5M2 are OCP's)."""
    return codes.view(FP8_DTYPES[fmt])


def tensor_row_supports(out_dtypes=("f32", "bf16"), formats=tuple(FP8_DTYPES)):
    """supports() of a tensorwise/rowwise scaled_mm: FP8 codes, a and b scaled alike."""

    def supports(key: KernelKey) -> bool:
        return (key.op == "scaled_mm" and key.scaling == key.b_scaling
                and key.scaling in ("tensor", "row") and key.format in formats
                and key.b_format in formats and key.out_dtype in out_dtypes
                and (not key.b_kn or key.scaling == "tensor"))

    return supports


def scaled_mm_tensor_row(a, a_scale, a_format, a_scaling, b, b_scale, b_format, b_scaling, k,
                         out_dtype="f32", b_kn=False, *, pad_to: int = 1, col_major_b=False):
    """lowp::scaled_mm of tensorwise or rowwise FP8 operands through torch._scaled_mm.
    pad_to: K and N padded with zero codes to a multiple (CUDA's alignment; a zero code adds
    nothing); col_major_b: b passed column-major, as cuBLASLt wants it."""
    M = a.shape[0]
    bn = b.t() if b_kn else b  # [N, k] (a view)
    N = bn.shape[0]
    odt = OUT_DTYPES[out_dtype]
    if M == 0 or N == 0 or k == 0:
        return torch.zeros((M, N), dtype=odt, device=a.device)
    Kp, Np = -(-k // pad_to) * pad_to, -(-N // pad_to) * pad_to
    a8, b8 = a, bn
    if Kp != k or Np != N:
        a8 = torch.nn.functional.pad(a, (0, Kp - k))
        b8 = torch.nn.functional.pad(bn, (0, Kp - k, 0, Np - N))
    if a_scaling == "tensor":
        sa, sb = a_scale.reshape(()), b_scale.reshape(())
    else:
        sa = a_scale.reshape(M, 1)
        sb = torch.nn.functional.pad(b_scale.reshape(1, N), (0, Np - N), value=1.0)
    b8 = b8.contiguous()
    bt = fp8(b8, b_format).t()  # [Kp, Np], column-major
    if not col_major_b:
        bt = bt.contiguous()
    out = torch._scaled_mm(fp8(a8.contiguous(), a_format), bt, scale_a=sa, scale_b=sb,
                           out_dtype=odt)
    return out[:, :N] if Np != N else out
