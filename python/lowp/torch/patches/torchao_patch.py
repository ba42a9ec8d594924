"""Install and remove lowp's replacements in torchao's training modules.

The patch rebinds names where torchao LOOKS THEM UP at call time, not only where they are
defined: `tensor.py` imported `_to_mxfp8_then_scaled_mm` into its own globals, and
`utils._quantize_then_scaled_grouped_mm` imports the grouped functions from the
`torchao.prototype.moe_training` package at each call, so each of those bindings is replaced.
Before anything is changed every target is checked (the torchao version, each module, each
attribute, and the parameters each callable must accept); on any mismatch `patch_torchao`
raises `RuntimeError` naming the version and the missing piece and changes nothing.
`unpatch_torchao` puts every original object back.
"""

from __future__ import annotations

import importlib
import inspect
import threading
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from . import ops as _rep

__all__ = ["TESTED_VERSIONS", "patch_torchao", "unpatch_torchao", "is_patched",
           "patched_targets"]

# torchao 0.17 was read (its 0.17.0 wheel): its training modules differ (the MXFP8 linear is
# `torchao.prototype.mx_formats.mx_linear`, there is no `moe_training.mxfp8_linear`, and the
# grouped mm takes `block_size` and no `bias`), so these targets do not apply to it and it is
# not listed. Only 0.18 is tested.
TESTED_VERSIONS: Tuple[str, ...] = ("0.18",)

_MOE = "torchao.prototype.moe_training"


@dataclass(frozen=True)
class _Target:
    module: str  # a module, or "module:Class" for an attribute of a class
    name: str
    make: Callable[[object], object]  # original -> replacement (after all checks)
    params: Tuple[str, ...] = ()  # parameters the original must accept (its signature check)
    method: Optional[str] = None  # check the signature of this attribute of the original


def _tensor_cls_for_config(config):
    """`conversion_utils._get_tensor_cls_for_config` without its torch-nightly assert (the
    assert guards DTensor sharding strategies of torchao's GPU kernels, which lowp's ops do not
    use)."""
    from torchao.prototype.moe_training.config import (Float8TrainingOpConfig,
                                                       MXFP8TrainingOpConfig)
    from torchao.prototype.moe_training.tensor import (Float8TrainingWeightWrapperTensor,
                                                       MXFP8TrainingWeightWrapperTensor)
    if isinstance(config, MXFP8TrainingOpConfig):
        return MXFP8TrainingWeightWrapperTensor
    if isinstance(config, Float8TrainingOpConfig):
        return Float8TrainingWeightWrapperTensor
    raise ValueError(f"Unsupported config type: {type(config)}")


_LIN = ("input_hp", "weight_hp", "kernel_preference", "scale_calculation_mode", "wgrad_with_hp")
_MXMM = ("input_hp", "weight_hp", "in_elem_dtype", "w_elem_dtype", "grad_elem_dtype",
         "block_size", "kernel_preference", "mxfp8_dim0_cast_kernel_choice",
         "mxfp8_dim1_cast_kernel_choice", "scale_calculation_mode", "wgrad_with_hp")
_GMM = ("A", "B_t", "offs", "bias", "out_dtype", "kernel_preference", "wgrad_with_hp",
        "scale_calculation_mode", "pad_token_groups_for_grouped_mm")
_GMM_FN = ("input_act", "weight_t", "group_end_offsets", "out_dtype", "kernel_preference",
           "wgrad_with_hp", "scale_calculation_mode", "pad_token_groups_for_grouped_mm")
_FP8 = _FP8_FN = ("A", "B_t", "offs", "out_dtype", "float8_dtype",
                  "pad_token_groups_for_grouped_mm")

def _rebind(modules: Tuple[str, ...], name: str, fn, params, method=None):
    """One target per module that binds `name` (each is where some caller looks it up)."""
    return tuple(_Target(m, name, lambda o, fn=fn: fn, params, method) for m in modules)


_TENSOR, _UTILS_PKG = f"{_MOE}.tensor", _MOE
TARGETS: Tuple[_Target, ...] = (
    # MXFP8 linear: where it is defined (MXFP8Linear.forward looks it up there) and where the
    # weight wrapper's __torch_function__ looks it up (tensor.py's imported name).
    *_rebind((f"{_MOE}.mxfp8_linear", _TENSOR), "_to_mxfp8_then_scaled_mm",
             _rep.to_mxfp8_then_scaled_mm, _LIN),
    *_rebind((f"{_MOE}.mxfp8_linear",), "mx_mm", _rep.MXMM, _MXMM, "forward"),
    # MXFP8 grouped mm: its module and the package (utils imports it from there per call).
    *_rebind((f"{_MOE}.mxfp8_grouped_mm", _UTILS_PKG), "_to_mxfp8_then_scaled_grouped_mm",
             _rep.to_mxfp8_then_scaled_grouped_mm, _GMM),
    *_rebind((f"{_MOE}.mxfp8_grouped_mm",), "_MXFP8GroupedMM", _rep.MXFP8GroupedMM, _GMM_FN,
             "forward"),
    # FP8 rowwise grouped mm, the same way.
    *_rebind((f"{_MOE}.fp8_grouped_mm", _UTILS_PKG), "_to_fp8_rowwise_then_scaled_grouped_mm",
             _rep.to_fp8_rowwise_then_scaled_grouped_mm, _FP8),
    *_rebind((f"{_MOE}.fp8_grouped_mm",), "_Float8GroupedMM", _rep.Float8GroupedMM, _FP8_FN,
             "forward"),
    # FP8 linear of Float8TrainingOpConfig (tensor.py's own helper).
    *_rebind((_TENSOR,), "_to_fp8_then_scaled_mm", _rep.to_fp8_then_scaled_mm,
             ("input", "weight", "config")),
    # The wrapper's unwrap (tensor.py's imported name): remembers each weight's wrapper.
    _Target(_TENSOR, "unwrap_weight", _rep.make_unwrap_weight, ("wrapper_tensor",)),
    # The MXFP8 weight wrapper's dispatch: torchao 0.18 drops F.linear's bias there and
    # asserts on addmm (mm / matmul keep torchao's x W^T).
    _Target(f"{_TENSOR}:MXFP8TrainingWeightWrapperTensor", "__torch_function__",
            _rep.make_mx_torch_function, ("func", "types", "args", "kwargs")),
    # Capability gate of quantize_ (asserts a torch nightly for MXFP8 configs).
    *_rebind((f"{_MOE}.conversion_utils",), "_get_tensor_cls_for_config",
             _tensor_cls_for_config, ("config",)),
)

# Internals the replacements and torchao's dispatch rely on without replacing them.
_REQUIRED: Tuple[Tuple[str, str], ...] = (
    (f"{_MOE}.tensor", "MXFP8TrainingWeightWrapperTensor"),
    (f"{_MOE}.tensor", "Float8TrainingWeightWrapperTensor"),
    (f"{_MOE}.tensor", "_quantize_then_scaled_grouped_mm"),
    (f"{_MOE}.utils", "unwrap_weight"),
    (f"{_MOE}.config", "MXFP8TrainingOpConfig"),
    (f"{_MOE}.config", "MXFP8TrainingRecipe"),
    (f"{_MOE}.config", "Float8TrainingOpConfig"),
    ("torchao.prototype.mx_formats.config", "ScaleCalculationMode"),
    ("torchao.prototype.mx_formats.mx_tensor", "MXTensor"),
    ("torchao.quantization.quantize_.common", "KernelPreference"),
)
_FP8_CONFIG_FIELDS = ("float8_dtype", "out_dtype", "pad_token_groups_for_grouped_mm",
                      "float8_linear_recipe")
_CONFIG_FIELDS = ("kernel_preference", "out_dtype", "wgrad_with_hp", "scale_calculation_mode",
                  "pad_token_groups_for_grouped_mm")

_LOCK = threading.RLock()
_ORIGINALS: List[Tuple[object, str, object]] = []  # (module, name, original object)


def _version() -> str:
    try:
        import torchao
    except Exception as e:
        raise RuntimeError(f"lowp.torch.patch_torchao: torchao is not importable "
                           f"({type(e).__name__}: {e}); nothing was patched") from None
    return str(getattr(torchao, "__version__", "unknown"))


def _tested(version: str) -> bool:
    parts = version.split("+")[0].split(".")
    return ".".join(parts[:2]) in TESTED_VERSIONS


def resolve(module: str):
    """The object a target's `module` names: the module, or the class of "module:Class"."""
    mname, _, cname = module.partition(":")
    m = importlib.import_module(mname)
    return getattr(m, cname) if cname else m


def binding(owner, name: str):
    """What `owner.name` is bound to: for a class, the raw attribute in its own namespace (the
    classmethod object, not a new bound method at each lookup), so identity compares."""
    if isinstance(owner, type):
        return vars(owner)[name] if name in vars(owner) else None
    return getattr(owner, name, None)


def _params(obj, method: Optional[str]):
    f = getattr(obj, method) if method else obj
    f = inspect.unwrap(f)
    return set(inspect.signature(f).parameters)


def _check(version: str):
    """[(module object, target)] for every target, or RuntimeError naming what is wrong."""
    where = f"torchao {version}"
    if not _tested(version):
        raise RuntimeError(f"lowp.torch.patch_torchao: {where} is not a tested version "
                           f"(tested: {', '.join(TESTED_VERSIONS)}); nothing was patched")
    mods = {}

    def mod(name):
        if name not in mods:
            try:
                mods[name] = resolve(name)
            except Exception as e:
                raise RuntimeError(f"lowp.torch.patch_torchao: {where} has no module {name} "
                                   f"({type(e).__name__}: {e}); nothing was patched") from None
        return mods[name]

    for mname, attr in _REQUIRED:
        if not hasattr(mod(mname), attr):
            raise RuntimeError(f"lowp.torch.patch_torchao: {where} lacks {mname}.{attr}; "
                               "nothing was patched")
    cfg_cls = getattr(mod(f"{_MOE}.config"), "MXFP8TrainingOpConfig")
    fields = getattr(cfg_cls, "__dataclass_fields__", {})
    for f in _CONFIG_FIELDS:
        if f not in fields:
            raise RuntimeError(f"lowp.torch.patch_torchao: {where} lacks the setting "
                               f"MXFP8TrainingOpConfig.{f}; nothing was patched")
    fp8_cls = getattr(mod(f"{_MOE}.config"), "Float8TrainingOpConfig")
    for f in _FP8_CONFIG_FIELDS:
        if f not in getattr(fp8_cls, "__dataclass_fields__", {}):
            raise RuntimeError(f"lowp.torch.patch_torchao: {where} lacks the setting "
                               f"Float8TrainingOpConfig.{f}; nothing was patched")
    plan = []
    for t in TARGETS:
        m = mod(t.module)
        if binding(m, t.name) is None:
            raise RuntimeError(f"lowp.torch.patch_torchao: {where} lacks {t.module}.{t.name}; "
                               "nothing was patched")
        orig = getattr(m, t.name)  # for a class's classmethod, bound: its signature
        if t.params:
            try:
                have = _params(orig, t.method)
            except (TypeError, ValueError, AttributeError):
                have = set()
            missing = [p for p in t.params if p not in have]
            if missing:
                raise RuntimeError(f"lowp.torch.patch_torchao: {where}: {t.module}.{t.name}"
                                   f"{'.' + t.method if t.method else ''} does not take "
                                   f"{', '.join(missing)}; nothing was patched")
        plan.append((m, t))
    return plan


def patch_torchao() -> None:
    """Route torchao 0.18's MXFP8 training linear and grouped mm, its FP8 rowwise grouped mm
    and its capability gate through lowp's ops, and give the MXFP8 weight wrapper linear's
    bias and addmm (torchao 0.18 drops the bias and asserts on addmm; mm / matmul / @ keep
    torchao's x W^T). Idempotent; `unpatch_torchao()` undoes it.
    Raises RuntimeError (and patches nothing) on an untested torchao version or a missing
    internal."""
    with _LOCK:
        if _ORIGINALS:
            return
        plan = _check(_version())
        # build every replacement before changing anything
        repl = [(m, t, t.make(binding(m, t.name))) for m, t in plan]
        saved = []
        try:
            for m, t, new in repl:
                saved.append((m, t.name, binding(m, t.name)))
                setattr(m, t.name, new)
        except BaseException:
            for m, name, orig in reversed(saved):
                setattr(m, name, orig)
            raise
        _ORIGINALS.extend(saved)


def unpatch_torchao() -> None:
    """Put back every object `patch_torchao()` replaced (no-op when not patched)."""
    with _LOCK:
        while _ORIGINALS:
            m, name, orig = _ORIGINALS.pop()
            setattr(m, name, orig)
        _rep.clear_caches()


def is_patched() -> bool:
    return bool(_ORIGINALS)


def patched_targets() -> List[str]:
    """'module.name' of every binding the patch replaces."""
    return [f"{t.module.replace(':', '.')}.{t.name}" for t in TARGETS]
