"""Quantization configs of lowp.torch and the matmul recipe each one stands for.

A config names how the three operands of a linear layer's GEMMs are quantized (the weight, the
activation and the output gradient); `resolve_config` turns a config (or a preset name) into a
`MatmulSpec`, the internal description the autograd ops follow. The recipes are the C training
layer's presets (src/train/recipe.c):

  preset           weight                  input / grad_output           keep_quantized
  mxfp8            MX32 e4m3 RCEIL         MX32 e4m3 RCEIL               yes
  mxfp4            MX32 e2m1 RCEIL         MX32 e2m1 RCEIL               yes
  block32x32       32x32 E8M0 e4m3 FLOOR   MX32 e4m3 RCEIL (NPU Block FP8)  yes
  block128         128x128 fp32 e4m3       1x128 fp32 e4m3 (DeepSeek-V3)  yes
  fp8_rowwise      rowwise e4m3, pow2      rowwise e4m3, pow2            no (requantize)
  fp8_tensorwise   tensorwise e4m3         e4m3 / e5m2 gradient (HYBRID)  yes
  bf16             BF16 GEMMs, nothing quantized

The configs subclass torchao's `FakeQuantizeConfigBase` (so torchao's QAT machinery accepts
them); without torchao they are plain classes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Union

import torch

try:
    from torchao.quantization.qat import FakeQuantizeConfigBase as _Base
    from torchao.quantization.qat import QATConfig as _QATBase
except Exception:  # torchao absent: plain objects
    _Base = _QATBase = object

__all__ = [
    "OperandSpec",
    "MatmulSpec",
    "MXQuantizeConfig",
    "BlockQuantizeConfig",
    "Block128Config",
    "Float8RowwiseConfig",
    "Float8TensorwiseConfig",
    "PRESETS",
    "resolve_config",
    "ParamSwapConfig",
]

_FP4 = getattr(torch, "float4_e2m1fn_x2", None)
_DTYPE_FORMATS = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2", "fp4": "e2m1",
                  "e4m3": "e4m3", "e5m2": "e5m2", "e2m1": "e2m1"}
if _FP4 is not None:
    _DTYPE_FORMATS[_FP4] = "e2m1"
_SCALE_MODES = ("rceil", "floor", "ceil", "even")


@dataclass(frozen=True)
class OperandSpec:
    """How one GEMM operand is quantized. format "bf16" means not quantized."""

    format: str = "bf16"  # e4m3, e5m2, e2m1, bf16
    scaling: str = "none"  # tensor, row, mx32, block128, block128x128, block32x32, none
    scale_mode: Optional[str] = None  # E8M0 kinds (None: RCEIL, FLOOR for block32x32)
    pow2: Optional[bool] = None  # binary32 kinds (None: on for row, off otherwise)
    delayed: bool = False  # tensorwise only: scale from the fp8_state history

    @property
    def quantized(self) -> bool:
        return self.format != "bf16"


@dataclass(frozen=True)
class MatmulSpec:
    """A full matmul recipe (C's lowp_linear_cfg)."""

    input: OperandSpec
    weight: OperandSpec
    grad_output: OperandSpec
    keep_quantized: bool = True
    wgrad_hp: bool = False
    fake_quant_mxfp4: bool = False
    history_len: int = 1024
    margin: float = 0.0
    amax_compute_algo: str = "max"
    name: str = "custom"

    def replace(self, **kw) -> "MatmulSpec":
        return dataclasses.replace(self, **kw)


def _format_of(dtype, field="dtype") -> str:
    try:
        return _DTYPE_FORMATS[dtype]
    except (KeyError, TypeError):
        raise ValueError(f"{field} ({dtype!r}) is not torch.float8_e4m3fn, torch.float8_e5m2, "
                         "torch.float4_e2m1fn_x2 or 'fp4'") from None


def _check_mode(mode, field="scale_mode"):
    if not isinstance(mode, str):
        raise TypeError(f"{field} ({mode!r}) must be a string, one of {', '.join(_SCALE_MODES)}")
    if mode.lower() not in _SCALE_MODES:
        raise ValueError(f"{field} ({mode!r}) is not one of {', '.join(_SCALE_MODES)}")
    return mode.lower()


class _Config(_Base):
    """Shared behaviour: comparison and repr over the fields."""

    _fields = ()  # shown by repr
    _eq_fields = None  # compared (default: _fields)

    def _key(self):
        return tuple(getattr(self, f) for f in (self._eq_fields or self._fields))

    def __eq__(self, other):
        return type(self) is type(other) and self._key() == other._key()

    def __hash__(self):
        return hash((type(self).__name__,) + tuple(str(v) for v in self._key()))

    def __repr__(self):
        args = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__name__}({args})"


class MXQuantizeConfig(_Config):
    """OCP MX: 1x32 blocks with E8M0 scales for the weight, the activation and the gradient."""

    _fields = ("dtype", "block_size", "scale_mode")
    _eq_fields = ("format", "block_size", "scale_mode")  # torch.float8_e4m3fn == "e4m3"

    def __init__(self, dtype=torch.float8_e4m3fn, block_size: int = 32, scale_mode: str = "rceil"):
        self.format = _format_of(dtype)
        self.dtype = dtype
        if isinstance(block_size, bool) or not isinstance(block_size, int):
            raise TypeError(f"block_size ({block_size!r}) must be an int")
        if block_size != 32:
            raise ValueError(f"block_size ({block_size}) must be 32 (lowp's MX block)")
        self.block_size = block_size
        self.scale_mode = _check_mode(scale_mode)

    def _operand(self) -> OperandSpec:
        return OperandSpec(self.format, "mx32", self.scale_mode)

    def to_spec(self) -> MatmulSpec:
        s = self._operand()
        name = {"e4m3": "mxfp8", "e2m1": "mxfp4"}.get(self.format, "custom")
        if self.scale_mode != "rceil":
            name = "custom"
        return MatmulSpec(s, s, s, keep_quantized=True, name=name)


class BlockQuantizeConfig(_Config):
    """The NPU's Block FP8: 32x32 E8M0 (FLOOR) e4m3 weight tiles, one copy for the forward and
    the input-gradient GEMM; MX32 e4m3 RCEIL activations and gradients. With
    `mxfp4_fake_quantize_config` (an fp4 `MXQuantizeConfig`, or True) the weight first goes
    through MXFP4 and back."""

    _fields = ("mxfp4_fake_quantize_config",)

    def __init__(self, mxfp4_fake_quantize_config=None):
        c = mxfp4_fake_quantize_config
        if c is True:
            c = MXQuantizeConfig(dtype="fp4")
        if c is not None and c is not False:
            if not isinstance(c, MXQuantizeConfig):
                raise TypeError(f"mxfp4_fake_quantize_config ({c!r}) must be None, True or an "
                                "MXQuantizeConfig")
            if c.format != "e2m1" or c.scale_mode != "rceil":
                raise ValueError(f"mxfp4_fake_quantize_config ({c!r}) must have dtype fp4 and "
                                 "scale_mode rceil")
        else:
            c = None
        self.mxfp4_fake_quantize_config = c

    def to_spec(self) -> MatmulSpec:
        act = OperandSpec("e4m3", "mx32", "rceil")
        w = OperandSpec("e4m3", "block32x32", "floor")
        fq = self.mxfp4_fake_quantize_config is not None
        return MatmulSpec(act, w, act, keep_quantized=True, fake_quant_mxfp4=fq,
                          name="block32x32_fp4" if fq else "block32x32")


class Block128Config(_Config):
    """DeepSeek-V3 Block FP8: 1x128 activations and gradients, 128x128 weights, binary32
    scale_inv, e4m3."""

    _fields = ()

    def to_spec(self) -> MatmulSpec:
        act = OperandSpec("e4m3", "block128")
        return MatmulSpec(act, OperandSpec("e4m3", "block128x128"), act, keep_quantized=True,
                          name="block128")


class Float8RowwiseConfig(_Config):
    """Rowwise e4m3 with power-of-two scales; the backward requantizes X along the other axis."""

    _fields = ()

    def to_spec(self) -> MatmulSpec:
        s = OperandSpec("e4m3", "row")
        return MatmulSpec(s, s, s, keep_quantized=False, name="fp8_rowwise")


class Float8TensorwiseConfig(_Config):
    """HYBRID tensorwise FP8: e4m3 input and weight, e5m2 gradient; current scaling, or delayed
    scaling (TE DelayedScaling) from the `fp8_state` the op is given."""

    _fields = ("delayed", "history_len", "margin", "amax_compute_algo")

    def __init__(self, delayed: bool = False, history_len: int = 1024, margin: float = 0,
                 amax_compute_algo: str = "max"):
        if not isinstance(delayed, bool):
            raise TypeError(f"delayed ({delayed!r}) must be a bool")
        if isinstance(history_len, bool) or not isinstance(history_len, int):
            raise TypeError(f"history_len ({history_len!r}) must be an int")
        if not 1 <= history_len <= (1 << 20):
            raise ValueError(f"history_len ({history_len}) is not in [1, {1 << 20}]")
        if isinstance(margin, bool) or not isinstance(margin, (int, float)):
            raise TypeError(f"margin ({margin!r}) must be a number")
        if margin != margin or margin in (float("inf"), float("-inf")):
            raise ValueError(f"margin ({margin}) is not finite")
        if amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"amax_compute_algo ({amax_compute_algo!r}) is not 'max' or "
                             "'most_recent'")
        self.delayed = delayed
        self.history_len = history_len
        self.margin = float(margin)
        self.amax_compute_algo = amax_compute_algo

    def to_spec(self) -> MatmulSpec:
        d = self.delayed
        fwd = OperandSpec("e4m3", "tensor", delayed=d)
        return MatmulSpec(fwd, fwd, OperandSpec("e5m2", "tensor", delayed=d), keep_quantized=True,
                          history_len=self.history_len, margin=self.margin,
                          amax_compute_algo=self.amax_compute_algo,
                          name="fp8_delayed" if d else "fp8_tensorwise")


_BF16 = OperandSpec()
PRESETS = {
    "mxfp8": lambda: MXQuantizeConfig(),
    "mxfp4": lambda: MXQuantizeConfig(dtype="fp4"),
    "block32x32": lambda: BlockQuantizeConfig(),
    "block128": lambda: Block128Config(),
    "fp8_rowwise": lambda: Float8RowwiseConfig(),
    "fp8_tensorwise": lambda: Float8TensorwiseConfig(),
    "bf16": None,
}

_CONFIG_TYPES = (MXQuantizeConfig, BlockQuantizeConfig, Block128Config, Float8RowwiseConfig,
                 Float8TensorwiseConfig)

# GEMM operand pairs lowp multiplies (a scaling, b scaling), as src/core/gemm_pair.c.
_PAIRS = {("tensor", "tensor"), ("row", "row"), ("mx32", "mx32"), ("mx32", "block32x32"),
          ("block128", "block128x128"), ("block128", "block128")}


def _check_pair(gemm: str, ra: str, a: OperandSpec, rb: str, b: OperandSpec):
    if not (a.quantized and b.quantized):
        return
    ok = (a.scaling, b.scaling) in _PAIRS
    if ok and (a.format == "e2m1" or b.format == "e2m1"):
        ok = a.scaling == b.scaling == "mx32"
    if not ok:
        raise ValueError(f"the {gemm} GEMM pairs {ra} ({a.scaling} {a.format}) with {rb} "
                         f"({b.scaling} {b.format}), which lowp does not multiply")


def _spec_of(config) -> MatmulSpec:
    if config is None:
        return MatmulSpec(_BF16, _BF16, _BF16, keep_quantized=False, name="bf16")
    if isinstance(config, MatmulSpec):
        return config
    if isinstance(config, str):
        if config not in PRESETS:
            raise ValueError(f"config ({config!r}) is not a preset ({', '.join(PRESETS)})")
        make = PRESETS[config]
        return _spec_of(make() if make else None)
    if isinstance(config, _CONFIG_TYPES):
        return config.to_spec()
    raise TypeError(f"config ({config!r}) must be a preset name, a lowp.torch config "
                    f"({', '.join(t.__name__ for t in _CONFIG_TYPES)}) or None")


def resolve_config(config_or_preset: Union[str, object, None],
                   activation_config: Optional[object] = None) -> MatmulSpec:
    """The MatmulSpec of a config or preset name. `activation_config` (a config) replaces the
    input and grad_output quantization with its own; the GEMM pairs are checked here."""
    spec = _spec_of(config_or_preset)
    if activation_config is not None:
        act = _spec_of(activation_config)
        spec = spec.replace(input=act.input, grad_output=act.grad_output, name="custom")
    for role in ("input", "grad_output"):
        s = getattr(spec, role)
        if s.scaling in ("block128x128", "block32x32"):
            raise ValueError(f"{role} scaling ({s.scaling}) is a weight tiling; activations and "
                             "gradients are quantized along one axis")
    _check_pair("forward", "input", spec.input, "weight", spec.weight)
    _check_pair("dgrad", "grad_output", spec.grad_output, "weight", spec.weight)
    if not spec.wgrad_hp:
        _check_pair("wgrad", "grad_output", spec.grad_output, "input", spec.input)
    return spec


# ---- the param swap's config (its handler is lowp.torch.quantize's) ----

_STEPS = ("prepare", "convert")


def _is_lowp_config(cfg):
    return isinstance(cfg, (str, MXQuantizeConfig, BlockQuantizeConfig,
                            Block128Config, Float8RowwiseConfig,
                            Float8TensorwiseConfig))


class ParamSwapConfig(_QATBase):
    """Prepare (wrap) or convert (unwrap) a model's weights for lowp's low-precision matmuls.

    Args:
        base_config: a lowp config (or preset name) used as ``weight_config``.
        activation_config: optional config for the activations and gradients (default: the
            weight config's own recipe).
        weight_config: a lowp config (``MXQuantizeConfig()``, ``BlockQuantizeConfig()``,
            ``Block128Config()``, ``Float8RowwiseConfig()``, ``Float8TensorwiseConfig()``) or a
            preset name (``"mxfp8"``...). Accepted (and ignored) by ``step="convert"``.
        step: ``"prepare"`` or ``"convert"``.
        params_filter_fn: ``(param, fqn) -> bool``, which parameters to wrap. Default: the
            weights of ``nn.Linear`` modules and 3-D parameters (MoE expert weights) of modules
            that are not convolutions. ``fqn`` is relative to the module the handler is given
            (the whole model with ``filter_fn=param_swap_filter``).
    """

    def __init__(self, base_config=None, activation_config=None, weight_config=None, *,
                 step="prepare", params_filter_fn=None):
        self.base_config = base_config
        self.activation_config = activation_config
        self.weight_config = weight_config
        self.step = step
        self.params_filter_fn = params_filter_fn
        self.__post_init__()

    def __post_init__(self):
        if not isinstance(self.step, str) or self.step.lower() not in _STEPS:
            raise ValueError("step must be one of %s, got %r" % (list(_STEPS), self.step))
        self.step = self.step.lower()
        if self.base_config is not None and self.weight_config is not None:
            raise ValueError("base_config and weight_config: give one of them, not both")
        if self.base_config is not None:
            if not _is_lowp_config(self.base_config):
                raise TypeError("base_config must be a lowp config or preset name, got %s" %
                                type(self.base_config).__name__)
            self.weight_config, self.base_config = self.base_config, None
        if self.weight_config is not None and not _is_lowp_config(self.weight_config):
            raise TypeError(
                "weight_config must be a lowp config (MXQuantizeConfig, BlockQuantizeConfig, "
                "Block128Config, Float8RowwiseConfig, Float8TensorwiseConfig) or a preset "
                "name, got %s" % type(self.weight_config).__name__)
        if self.activation_config is not None and not _is_lowp_config(self.activation_config):
            raise TypeError("activation_config must be a lowp config or preset name, got %s" %
                            type(self.activation_config).__name__)
        if self.step == "prepare" and self.weight_config is None:
            raise ValueError("step='prepare' needs weight_config (or base_config)")
        if self.params_filter_fn is not None and not callable(self.params_filter_fn):
            raise TypeError("params_filter_fn must be callable (param, fqn) -> bool")
        if self.step == "prepare":  # a name that is no preset fails here, not at prepare
            presets = PRESETS
            for arg in ("weight_config", "activation_config"):
                v = getattr(self, arg)
                if isinstance(v, str) and v not in presets:
                    raise ValueError("%s (%r) is not a preset (%s)" % (arg, v, ", ".join(presets)))
            self.matmul_config()

    def matmul_config(self):
        """What the wrapped weights carry: the MatmulSpec of the weight (and activation)
        config, resolved (and so checked) once at prepare."""
        return resolve_config(self.weight_config, self.activation_config)
