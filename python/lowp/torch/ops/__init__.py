"""lowp's torch operators and the low-precision autograd matmuls.

- `library`: the `lowp::` custom ops (quantize, dequantize, scaled_mm, scaled_grouped_mm),
  their checks, fake kernels and per-device kernels;
- `linear`: the spec-driven autograd function behind `lowp.torch.linear`, `mm` and
  `grouped_mm` (the functions stay in that module: `lowp.torch.ops.linear` is the module);
- `cache`: the weight cache and what invalidates it;
- `portable`: the same numerics in plain torch ops, for every device.
"""

from . import portable
from .cache import WeightCache, invalidate_weight_caches
from .library import force_portable, native_available, reset_stats, stats

__all__ = [
    "WeightCache",
    "force_portable",
    "invalidate_weight_caches",
    "native_available",
    "portable",
    "reset_stats",
    "stats",
]
