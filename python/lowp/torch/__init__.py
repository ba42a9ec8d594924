"""lowp for PyTorch: low-precision mm / linear / grouped mm with autograd, the lowp::* torch
operators, and the quantization configs. CPU tensors run lowp's native kernels; tensors on any
other device run the portable torch implementation, which gives the same bytes.

Each helper appends its own imports below (keep this file a plain list of imports)."""

from .config import (Block128Config, BlockQuantizeConfig, Float8RowwiseConfig,
                     Float8TensorwiseConfig, MatmulSpec, MXQuantizeConfig, NVFP4QuantizeConfig,
                     OperandSpec, PRESETS, resolve_config)
from .ops import (KernelPreference, LowpQTensor, WeightCache, has_native_kernel,
                  kernel_preference, native_available, portable, reset_stats, stats)
from .ops.linear import grouped_mm, linear, mm

__all__ = [
    "Block128Config",
    "BlockQuantizeConfig",
    "Float8RowwiseConfig",
    "Float8TensorwiseConfig",
    "MatmulSpec",
    "MXQuantizeConfig",
    "NVFP4QuantizeConfig",
    "OperandSpec",
    "PRESETS",
    "resolve_config",
    "WeightCache",
    "KernelPreference",
    "LowpQTensor",
    "has_native_kernel",
    "kernel_preference",
    "grouped_mm",
    "linear",
    "mm",
    "native_available",
    "reset_stats",
    "stats",
    "portable",
]

# The param swap, recipes, FP8 state, RNG tracker, RMSNorm.
from .config import ParamSwapConfig
from .quantize import convert, param_swap_filter, wrapped_parameters
from .tensor import LowpWeight
from .recipes import RECIPES, apply_recipe, plan_recipe
from .state import DelayedScalingState, RNGStatesTracker, fp8_states
from .norm import RMSNorm, rms_norm
from .hadamard import hadamard
from .ops.philox import PhiloxStates, philox_states
from ._autocast import autocast_dtype

__all__ += [
    "LowpWeight",
    "ParamSwapConfig",
    "param_swap_filter",
    "wrapped_parameters",
    "convert",
    "RECIPES",
    "apply_recipe",
    "plan_recipe",
    "DelayedScalingState",
    "fp8_states",
    "RNGStatesTracker",
    "RMSNorm",
    "autocast_dtype",
    "rms_norm",
    "hadamard",
    "PhiloxStates",
    "philox_states",
]

from .patches import is_patched as torchao_patched, patch_torchao, unpatch_torchao
from .patches import patch_torchtitan, torchtitan_patched, unpatch_torchtitan

__all__ += ["patch_torchao", "unpatch_torchao", "torchao_patched", "patch_torchtitan",
            "unpatch_torchtitan", "torchtitan_patched"]

from .ops import invalidate_weight_caches

__all__ += ["invalidate_weight_caches"]

# The configs' Enums: the scale mode, and the param swap's step (torchao's QATStep).
from .config import QATStep, ScaleCalculationMode

__all__ += ["QATStep", "ScaleCalculationMode"]

# The end of an optimizer update (lowp.torch.trainer): every FP8 delayed-scaling state's update.
from .state import update_all as update_fp8_states

__all__ += ["update_fp8_states"]

# The device kernel table and its conformance check (docs/torch.md).
# check_device loads on first use, so that `python -m lowp.torch.check_device` runs it once.
from .device_kernels import (available_kernels, register_kernel, unregister_kernel,
                             use_device_kernels)


def __getattr__(name):
    if name == "check_device":
        from .check_device import check_device as fn
        globals()["check_device"] = fn
        return fn
    raise AttributeError(f"module 'lowp.torch' has no attribute {name!r}")


__all__ += ["available_kernels", "register_kernel", "unregister_kernel", "use_device_kernels",
            "check_device"]
