"""torch's own `torch._scaled_mm` on the CPU as a lowp scaled_mm kernel ("torch.scaled_mm"):
FP8 (E4M3, E5M2) tensorwise and rowwise operands, binary32 or BF16 output. A real third-party
kernel (oneDNN under torch) that `check_device("cpu", kernels=["torch.scaled_mm"])` holds to
docs/numerics.md section 6's bound. lowp's native kernels keep precedence on the CPU unless
it is forced (`use_device_kernels(only=["torch.scaled_mm"])`)."""

from __future__ import annotations

import torch

from ._common import register_once, scaled_mm_tensor_row, tensor_row_supports

NAME = "torch.scaled_mm"


def register() -> None:
    if not hasattr(torch, "_scaled_mm"):
        return
    register_once("cpu", [("scaled_mm", NAME, scaled_mm_tensor_row, tensor_row_supports())])
