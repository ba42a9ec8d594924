"""lowp's torch operators and the low-precision autograd matmuls.

- `library`: the `lowp::` custom ops (quantize, dequantize, scaled_mm, scaled_grouped_mm),
  their checks, fake kernels, the portable kernels and the per-device registration;
- `native`: their CPU kernels on lowp's C extension;
- `qtensor`: `LowpQTensor`, the one quantized operand type;
- `layout`: the shapes and dtypes of codes and scales;
- `linear`: the spec-driven autograd function behind `lowp.torch.linear`, `mm` and
  `grouped_mm` (the functions stay in that module: `lowp.torch.ops.linear` is the module);
- `cache`: the weight cache and what invalidates it;
- `portable`: the same numerics in plain torch ops, for every device.
"""

from . import portable
from .cache import WeightCache, invalidate_weight_caches
from .library import (KernelPreference, has_native_kernel, kernel_preference,
                      native_available, reset_stats, stats)
from .qtensor import LowpQTensor

__all__ = [
    "KernelPreference",
    "LowpQTensor",
    "WeightCache",
    "has_native_kernel",
    "kernel_preference",
    "invalidate_weight_caches",
    "native_available",
    "portable",
    "reset_stats",
    "stats",
]
