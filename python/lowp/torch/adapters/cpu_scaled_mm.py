"""torch's own `torch._scaled_mm` on the CPU as a lowp scaled_mm kernel ("torch.scaled_mm"):
FP8 (E4M3, E5M2) tensorwise and rowwise operands, binary32 or BF16 output. A real third-party
kernel (oneDNN under torch) that `check_device("cpu", kernels=["torch.scaled_mm"])` holds to
docs/numerics.md section 6's bound. lowp's native kernels keep precedence on the CPU unless
it is forced (`use_device_kernels(only=["torch.scaled_mm"])`)."""

from __future__ import annotations

import torch

from ..device_kernels import KernelKey
from ._common import register_once, scaled_mm_tensor_row, tensor_row_supports

NAME = "torch.scaled_mm"
_PROBED = {}


def _rowwise_runs() -> bool:
    """Whether this torch's CPU _scaled_mm takes rowwise scales (torch 2.11's took per-tensor
    scales only): one 2x16 . 16x2 product, once."""
    if "row" not in _PROBED:
        a = torch.zeros(2, 16, dtype=torch.float8_e4m3fn)
        try:
            torch._scaled_mm(a, a.t(), scale_a=torch.ones(2, 1), scale_b=torch.ones(1, 2),
                             out_dtype=torch.float32)
            _PROBED["row"] = True
        except RuntimeError:
            _PROBED["row"] = False
    return _PROBED["row"]


def register() -> None:
    if not hasattr(torch, "_scaled_mm"):
        return
    both = tensor_row_supports()
    row = _rowwise_runs()

    def supports(key: KernelKey) -> bool:
        return both(key) and (row or key.scaling == "tensor")

    register_once("cpu", [("scaled_mm", NAME, scaled_mm_tensor_row, supports)])
