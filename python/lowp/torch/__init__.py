"""lowp for PyTorch: low-precision mm / linear / grouped mm with autograd, the lowp::* torch
operators, and the quantization configs. CPU tensors run lowp's native kernels; tensors on any
other device run the portable torch implementation, which gives the same bytes.

Each helper appends its own imports below (keep this file a plain list of imports)."""

from .config import (Block128Config, BlockQuantizeConfig, Float8RowwiseConfig,
                     Float8TensorwiseConfig, MatmulSpec, MXQuantizeConfig, OperandSpec, PRESETS,
                     resolve_config)
from .ops import (WeightCache, force_portable, grouped_mm, linear, mm, native_available,
                  reset_stats, stats)
from . import portable

__all__ = [
    "Block128Config",
    "BlockQuantizeConfig",
    "Float8RowwiseConfig",
    "Float8TensorwiseConfig",
    "MatmulSpec",
    "MXQuantizeConfig",
    "OperandSpec",
    "PRESETS",
    "resolve_config",
    "WeightCache",
    "force_portable",
    "grouped_mm",
    "linear",
    "mm",
    "native_available",
    "reset_stats",
    "stats",
    "portable",
]
