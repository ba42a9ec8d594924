"""Quantization configs of lowp.torch and the matmul recipe each one stands for.

A config names how the three operands of a linear layer's GEMMs are quantized (the weight, the
activation and the output gradient); `resolve_config` turns a config (or a preset name) into a
`MatmulSpec`, the internal description the autograd ops follow. The recipes are the C training
layer's presets (src/train/recipe.c): each ``to_spec`` builds its MatmulSpec from the C preset
table (``lowp.rules``), and the GEMM pairs checked are the C library's:

  preset           weight                  input / grad_output           keep_quantized
  mxfp8            MX32 e4m3 RCEIL         MX32 e4m3 RCEIL               yes
  mxfp4            MX32 e2m1 RCEIL         MX32 e2m1 RCEIL               yes
  block32x32       32x32 E8M0 e4m3 FLOOR   MX32 e4m3 RCEIL (NPU Block FP8)  yes
  block128         128x128 fp32 e4m3       1x128 fp32 e4m3 (DeepSeek-V3)  yes
  fp8_rowwise      rowwise e4m3, pow2      rowwise e4m3, pow2            no (requantize)
  fp8_tensorwise   tensorwise e4m3         e4m3 / e5m2 gradient (HYBRID)  yes
  bf16             BF16 GEMMs, nothing quantized

The configs are frozen dataclasses on torchao's ``AOBaseConfig`` (the base of every config
``quantize_`` takes) and ``FakeQuantizeConfigBase`` (what torchao's ``QATConfig`` types its
weight and activation configs as), with Enum fields as torchao writes them
(:class:`ScaleCalculationMode`, :class:`KernelPreference`, :class:`QATStep`) and
``torch.dtype`` element types. Strings keep working where users pass them
(``scale_mode="rceil"``, ``dtype="fp4"``, ``step="convert"``, preset names): ``__post_init__``
turns them into the Enum or dtype, so equal configs compare and hash equal. Without torchao
they are plain frozen dataclasses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import KW_ONLY, dataclass
from enum import Enum
from typing import Callable, Optional, Union

import torch

from .. import rules

try:
    from torchao.core.config import AOBaseConfig
    from torchao.quantization.qat import FakeQuantizeConfigBase, QATStep
    _BASES = (AOBaseConfig, FakeQuantizeConfigBase)
    _SWAP_BASES = (AOBaseConfig,)
except Exception:  # torchao absent: plain dataclasses, lowp's own QATStep
    _BASES = _SWAP_BASES = ()

    class QATStep(str, Enum):
        """The param swap's step (torchao's ``QATStep`` where torchao is installed)."""

        PREPARE = "prepare"
        CONVERT = "convert"

__all__ = [
    "ScaleCalculationMode",
    "KernelPreference",
    "QATStep",
    "OperandSpec",
    "MatmulSpec",
    "MXQuantizeConfig",
    "NVFP4QuantizeConfig",
    "BlockQuantizeConfig",
    "Block128Config",
    "Float8RowwiseConfig",
    "Float8TensorwiseConfig",
    "PRESETS",
    "resolve_config",
    "ParamSwapConfig",
]


class ScaleCalculationMode(str, Enum):
    """How an E8M0 block scale is chosen from the block's amax (docs/numerics.md): RCEIL (the
    ratio to the format's max rounded up to a power of two), FLOOR (OCP MX 1.0), CEIL, EVEN.
    torchao's ``ScaleCalculationMode`` members are accepted for it."""

    RCEIL = "rceil"
    FLOOR = "floor"
    CEIL = "ceil"
    EVEN = "even"


class KernelPreference(str, Enum):
    """Which kernels run a config's quantizations and GEMMs: AUTO (the dispatcher's choice for
    the tensors' device: native where registered, else portable), PORTABLE (lowp's portable
    torch kernels on any device), NATIVE (the device's own kernels; an error where it has
    none). The results are the same bytes."""

    AUTO = "auto"
    PORTABLE = "portable"
    NATIVE = "native"


_FP4 = getattr(torch, "float4_e2m1fn_x2", None)
_FORMAT_OF_DTYPE = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
if _FP4 is not None:
    _FORMAT_OF_DTYPE[_FP4] = "e2m1"
# Names users pass for element types; "e2m1" stays a name where torch has no FP4 dtype.
_DTYPE_OF_NAME = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2,
                  "e2m1": _FP4 or "e2m1", "fp4": _FP4 or "e2m1"}


@dataclass(frozen=True)
class OperandSpec:
    """How one GEMM operand is quantized. format "bf16" means not quantized."""

    format: str = "bf16"  # e4m3, e5m2, e2m1, bf16
    scaling: str = "none"  # tensor, row, mx32, block128, block128x128, block32x32, none
    scale_mode: Optional[str] = None  # E8M0 kinds (None: RCEIL, FLOOR for block32x32)
    pow2: Optional[bool] = None  # binary32 kinds (None: on for row, off otherwise)
    delayed: bool = False  # tensorwise only: scale from the fp8_state history
    rounding: str = "rne"  # elements: "rne" or "sr" (stochastic, C's lowp_operand_spec.rounding)

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
    kernel_preference: KernelPreference = KernelPreference.AUTO  # the config's: which kernels
    wgrad_hadamard: bool = False  # the random Hadamard transform on both wgrad operands

    def __post_init__(self):
        _set(self, "kernel_preference",
             _enum_of(KernelPreference, self.kernel_preference, "kernel_preference"))

    def replace(self, **kw) -> "MatmulSpec":
        return dataclasses.replace(self, **kw)


def _enum_of(cls, value, field):
    """``value`` (a member, an Enum member with the same value, e.g. torchao's, or its value
    as a string, any case) as a member of ``cls``."""
    names = ", ".join(m.value for m in cls)
    if isinstance(value, cls):
        return value
    v = value.value if isinstance(value, Enum) else value
    if not isinstance(v, str):
        raise TypeError(f"{field} ({value!r}) must be a {cls.__name__} or a string, one of "
                        f"{names}")
    try:
        return cls(v.lower())
    except ValueError:
        raise ValueError(f"{field} ({value!r}) is not one of {names}") from None


def _dtype_of(dtype, field="dtype"):
    """The element dtype ``dtype`` names (a torch.dtype or "e4m3", "e5m2", "e2m1", "fp4")."""
    d = _DTYPE_OF_NAME.get(dtype.lower()) if isinstance(dtype, str) else dtype
    if d not in _FORMAT_OF_DTYPE and d != "e2m1":
        raise ValueError(f"{field} ({dtype!r}) is not torch.float8_e4m3fn, torch.float8_e5m2, "
                         "torch.float4_e2m1fn_x2 or 'fp4'")
    return d


def _format_of(dtype) -> str:
    return _FORMAT_OF_DTYPE.get(dtype, "e2m1")


def _check_fp4_backward(cfg, fmt: str) -> None:
    """A config's grad_output_rounding ("rne" or "sr") and wgrad_hadamard (a bool); both are
    for FP4 elements (C's stochastic rounding takes E2M1 only)."""
    r, h = cfg.grad_output_rounding, cfg.wgrad_hadamard
    if r not in ("rne", "sr"):
        raise ValueError(f"grad_output_rounding ({r!r}) is not one of rne, sr")
    if not isinstance(h, bool):
        raise TypeError(f"wgrad_hadamard ({h!r}) must be a bool")
    if (r == "sr" or h) and fmt != "e2m1":
        raise ValueError(f"grad_output_rounding {r!r} / wgrad_hadamard {h} are for FP4 "
                         f"elements (e2m1), not {fmt}")


def _set(cfg, name, value):
    object.__setattr__(cfg, name, value)  # __post_init__'s normalization of a frozen field


def _operand_of(s: dict) -> OperandSpec:
    """An operand of a C preset (``lowp.rules.preset(name)["input"]``...) as an OperandSpec, a
    default E8M0 mode spelled out as the kind's own (RCEIL for mx32, FLOOR for block32x32)."""
    if s["format"] == "bf16":
        return OperandSpec()
    kind = rules.TABLES["scalings"][s["scaling"]]
    mode = None
    if kind["scale"] == "e8m0":
        mode = kind["default_mode"] if s["scale_mode"] == "default" else s["scale_mode"]
    return OperandSpec(s["format"], s["scaling"], mode, s["pow2"], s["delayed"],
                       s.get("rounding", "rne"))


def _preset_spec(preset: str, name: str, kernel_preference, **fields) -> MatmulSpec:
    """The MatmulSpec of the C linear preset ``preset`` (src/train/recipe.c, through
    lowp.rules), named ``name``, with ``fields`` replaced."""
    c = rules.preset(preset)
    spec = MatmulSpec(*(_operand_of(c[r]) for r in ("input", "weight", "grad_output")),
                      keep_quantized=c["keep_quantized"], wgrad_hp=c["wgrad_hp"],
                      fake_quant_mxfp4=c["fake_quant_mxfp4"], history_len=c["history_len"],
                      margin=c["margin"], amax_compute_algo=c["amax_compute_algo"], name=name,
                      kernel_preference=kernel_preference,
                      wgrad_hadamard=bool(c.get("wgrad_hadamard", False)))
    return spec.replace(**fields) if fields else spec


class _LowpConfig(*_BASES):
    """What every matmul config has: a keyword-only ``kernel_preference`` field (the last one,
    declared by each config), a :class:`KernelPreference` or its name."""

    def __post_init__(self):
        _set(self, "kernel_preference",
             _enum_of(KernelPreference, self.kernel_preference, "kernel_preference"))


@dataclass(frozen=True)
class MXQuantizeConfig(_LowpConfig):
    """OCP MX: 1x32 blocks with E8M0 scales for the weight, the activation and the gradient.
    ``dtype``: torch.float8_e4m3fn (default), torch.float8_e5m2 or torch.float4_e2m1fn_x2
    (also "e4m3", "e5m2", "e2m1", "fp4"); ``scale_mode``: a :class:`ScaleCalculationMode` or
    its name. FP4 only: ``grad_output_rounding="sr"`` rounds the gradient's elements
    stochastically and ``wgrad_hadamard=True`` applies the random Hadamard transform to both
    weight-gradient operands (C's ``rounding`` and ``wgrad_hadamard``); both together with
    RCEIL are the C preset ``mxfp4`` (Tseng et al. 2025), the ``mxfp4`` recipe's config."""

    dtype: torch.dtype = torch.float8_e4m3fn
    block_size: int = 32
    scale_mode: ScaleCalculationMode = ScaleCalculationMode.RCEIL
    _: KW_ONLY
    grad_output_rounding: str = "rne"
    wgrad_hadamard: bool = False
    kernel_preference: KernelPreference = KernelPreference.AUTO

    def __post_init__(self):
        super().__post_init__()
        _set(self, "dtype", _dtype_of(self.dtype))
        _check_fp4_backward(self, _format_of(self.dtype))
        b = self.block_size
        if isinstance(b, bool) or not isinstance(b, int):
            raise TypeError(f"block_size ({b!r}) must be an int")
        if b != 32:
            raise ValueError(f"block_size ({b}) must be 32 (lowp's MX block)")
        _set(self, "scale_mode", _enum_of(ScaleCalculationMode, self.scale_mode, "scale_mode"))

    @property
    def format(self) -> str:
        """lowp's name of the element format: "e4m3", "e5m2" or "e2m1"."""
        return _format_of(self.dtype)

    def to_spec(self) -> MatmulSpec:
        """The C preset mxfp8 in this config's element format and scale mode (the C preset
        mxfp4 with its gradient SR and wgrad Hadamard transform)."""
        rceil = self.scale_mode is ScaleCalculationMode.RCEIL
        if (self.format == "e2m1" and rceil and self.grad_output_rounding == "sr" and
                self.wgrad_hadamard):
            return _preset_spec("mxfp4", "mxfp4", self.kernel_preference)
        name = {"e4m3": "mxfp8", "e2m1": "mxfp4"}.get(self.format, "custom")
        if not rceil or self.grad_output_rounding != "rne" or self.wgrad_hadamard:
            name = "custom"
        spec = _preset_spec("mxfp8", name, self.kernel_preference)
        s = dataclasses.replace(spec.input, format=self.format, scale_mode=self.scale_mode.value)
        g = dataclasses.replace(s, rounding=self.grad_output_rounding)
        return spec.replace(input=s, weight=s, grad_output=g, wgrad_hadamard=self.wgrad_hadamard,
                            keep_quantized=spec.keep_quantized and not self.wgrad_hadamard)


@dataclass(frozen=True)
class NVFP4QuantizeConfig(_LowpConfig):
    """NVIDIA's NVFP4 (TransformerEngine's ``NVFP4BlockScaling``): E2M1 elements in 1x16
    blocks with E4M3 block scales under one binary32 tensor scale (docs/numerics.md 4b) for the
    activation and the gradient, and 16x16 tiles for the weight, so that one quantized weight
    serves the forward and the input-gradient GEMM. TE's recipe switches, on by default as in
    TE: ``weight_2d`` (False: 1x16 weight blocks, quantized again along the other axis for the
    input gradient), ``grad_output_rounding`` ("sr": stochastic rounding of the gradient's
    elements; "rne") and ``wgrad_hadamard`` (the random Hadamard transform on both
    weight-gradient operands). All three on: the C preset ``nvfp4``, the ``nvfp4`` recipe's
    config."""

    weight_2d: bool = True
    _: KW_ONLY
    grad_output_rounding: str = "sr"
    wgrad_hadamard: bool = True
    kernel_preference: KernelPreference = KernelPreference.AUTO

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.weight_2d, bool):
            raise TypeError(f"weight_2d ({self.weight_2d!r}) must be a bool")
        _check_fp4_backward(self, "e2m1")

    @property
    def format(self) -> str:
        """lowp's name of the element format: "e2m1"."""
        return "e2m1"

    def to_spec(self) -> MatmulSpec:
        """The C preset nvfp4, with the switches that are off turned off in it (without the
        transform, X's wgrad copy is kept from the forward, as in the other presets)."""
        te = self.weight_2d and self.grad_output_rounding == "sr" and self.wgrad_hadamard
        spec = _preset_spec("nvfp4", "nvfp4" if te else "custom", self.kernel_preference)
        if te:
            return spec
        w = spec.weight if self.weight_2d else dataclasses.replace(spec.weight, scaling="nv16")
        g = dataclasses.replace(spec.grad_output, rounding=self.grad_output_rounding)
        return spec.replace(weight=w, grad_output=g, wgrad_hadamard=self.wgrad_hadamard,
                            keep_quantized=not self.wgrad_hadamard)


@dataclass(frozen=True)
class BlockQuantizeConfig(_LowpConfig):
    """The NPU's Block FP8: 32x32 E8M0 (FLOOR) e4m3 weight tiles, one copy for the forward and
    the input-gradient GEMM; MX32 e4m3 RCEIL activations and gradients. With
    `mxfp4_fake_quantize_config` (an fp4 `MXQuantizeConfig`, or True) the weight first goes
    through MXFP4 and back."""

    mxfp4_fake_quantize_config: Optional[MXQuantizeConfig] = None
    _: KW_ONLY
    kernel_preference: KernelPreference = KernelPreference.AUTO

    def __post_init__(self):
        super().__post_init__()
        c = self.mxfp4_fake_quantize_config
        if c is True:
            c = MXQuantizeConfig(dtype="fp4")
        if c is not None and c is not False:
            if not isinstance(c, MXQuantizeConfig):
                raise TypeError(f"mxfp4_fake_quantize_config ({c!r}) must be None, True or an "
                                "MXQuantizeConfig")
            if c.format != "e2m1" or c.scale_mode is not ScaleCalculationMode.RCEIL:
                raise ValueError(f"mxfp4_fake_quantize_config ({c!r}) must have dtype fp4 and "
                                 "scale_mode rceil")
        else:
            c = None
        _set(self, "mxfp4_fake_quantize_config", c)

    def to_spec(self) -> MatmulSpec:
        """The C preset block_fp8 (block_fp8_fp4 with the MXFP4 fake quantization)."""
        fq = self.mxfp4_fake_quantize_config is not None
        return _preset_spec("block_fp8_fp4" if fq else "block_fp8",
                            "block32x32_fp4" if fq else "block32x32", self.kernel_preference)


@dataclass(frozen=True)
class Block128Config(_LowpConfig):
    """DeepSeek-V3 Block FP8: 1x128 activations and gradients, 128x128 weights, binary32
    scale_inv, e4m3."""

    _: KW_ONLY
    kernel_preference: KernelPreference = KernelPreference.AUTO

    def to_spec(self) -> MatmulSpec:
        """The C preset block128."""
        return _preset_spec("block128", "block128", self.kernel_preference)


@dataclass(frozen=True)
class Float8RowwiseConfig(_LowpConfig):
    """Rowwise e4m3 with power-of-two scales; the backward requantizes X along the other axis."""

    _: KW_ONLY
    kernel_preference: KernelPreference = KernelPreference.AUTO

    def to_spec(self) -> MatmulSpec:
        """The C preset fp8_rowwise."""
        return _preset_spec("fp8_rowwise", "fp8_rowwise", self.kernel_preference)


@dataclass(frozen=True)
class Float8TensorwiseConfig(_LowpConfig):
    """HYBRID tensorwise FP8: e4m3 input and weight, e5m2 gradient; current scaling, or delayed
    scaling (TE DelayedScaling) from the `fp8_state` the op is given."""

    delayed: bool = False
    history_len: int = 1024
    margin: float = 0.0
    amax_compute_algo: str = "max"
    _: KW_ONLY
    kernel_preference: KernelPreference = KernelPreference.AUTO

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.delayed, bool):
            raise TypeError(f"delayed ({self.delayed!r}) must be a bool")
        n = self.history_len
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"history_len ({n!r}) must be an int")
        if not 1 <= n <= (1 << 20):
            raise ValueError(f"history_len ({n}) is not in [1, {1 << 20}]")
        m = self.margin
        if isinstance(m, bool) or not isinstance(m, (int, float)):
            raise TypeError(f"margin ({m!r}) must be a number")
        if m != m or m in (float("inf"), float("-inf")):
            raise ValueError(f"margin ({m}) is not finite")
        _set(self, "margin", float(m))
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"amax_compute_algo ({self.amax_compute_algo!r}) is not 'max' or "
                             "'most_recent'")

    def to_spec(self) -> MatmulSpec:
        """The C preset fp8_delayed or fp8_current, with this config's history settings."""
        d = self.delayed
        return _preset_spec("fp8_delayed" if d else "fp8_current",
                            "fp8_delayed" if d else "fp8_tensorwise", self.kernel_preference,
                            history_len=self.history_len, margin=self.margin,
                            amax_compute_algo=self.amax_compute_algo)


PRESETS = {
    "mxfp8": lambda: MXQuantizeConfig(),
    "nvfp4": lambda: NVFP4QuantizeConfig(),
    "mxfp4": lambda: MXQuantizeConfig(dtype="fp4"),
    "block32x32": lambda: BlockQuantizeConfig(),
    "block128": lambda: Block128Config(),
    "fp8_rowwise": lambda: Float8RowwiseConfig(),
    "fp8_tensorwise": lambda: Float8TensorwiseConfig(),
    "bf16": None,
}

_CONFIG_TYPES = (MXQuantizeConfig, BlockQuantizeConfig, Block128Config, Float8RowwiseConfig,
                 Float8TensorwiseConfig, NVFP4QuantizeConfig)

# The GEMM operand pairs lowp multiplies, (a format, a scaling, b format, b scaling): the C
# library's (src/core/gemm_pair.c, through lowp.rules).
_PAIRS = frozenset(rules.TABLES["gemm_pairs"])


def _check_pair(gemm: str, ra: str, a: OperandSpec, rb: str, b: OperandSpec):
    if not (a.quantized and b.quantized):
        return
    if (a.format, a.scaling, b.format, b.scaling) not in _PAIRS:
        raise ValueError(f"the {gemm} GEMM pairs {ra} ({a.scaling} {a.format}) with {rb} "
                         f"({b.scaling} {b.format}), which lowp does not multiply")


def _spec_of(config) -> MatmulSpec:
    if config is None:
        return _preset_spec("bf16", "bf16", KernelPreference.AUTO)
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


def _joint_preference(w: MatmulSpec, a: MatmulSpec) -> KernelPreference:
    """The weight config's and the activation config's kernel preferences as one: AUTO gives
    way to the other; two different others are an error."""
    p, q = KernelPreference(w.kernel_preference), KernelPreference(a.kernel_preference)
    if p is KernelPreference.AUTO or q in (KernelPreference.AUTO, p):
        return q if p is KernelPreference.AUTO else p
    raise ValueError(f"kernel_preference: the weight config's ({p.value}) and the activation "
                     f"config's ({q.value}) differ; give one, or the same in both")


def resolve_config(config_or_preset: Union[str, object, None],
                   activation_config: Optional[object] = None) -> MatmulSpec:
    """The MatmulSpec of a config or preset name. `activation_config` (a config) replaces the
    input and grad_output quantization with its own; the GEMM pairs are checked here."""
    spec = _spec_of(config_or_preset)
    if activation_config is not None:
        act = _spec_of(activation_config)
        spec = spec.replace(input=act.input, grad_output=act.grad_output, name="custom",
                            kernel_preference=_joint_preference(spec, act))
    for role in ("input", "grad_output"):
        s = getattr(spec, role)
        if s.scaling in ("block128x128", "block32x32", "nv16x16"):
            raise ValueError(f"{role} scaling ({s.scaling}) is a weight tiling; activations and "
                             "gradients are quantized along one axis")
    _check_pair("forward", "input", spec.input, "weight", spec.weight)
    _check_pair("dgrad", "grad_output", spec.grad_output, "weight", spec.weight)
    if not spec.wgrad_hp:
        _check_pair("wgrad", "grad_output", spec.grad_output, "input", spec.input)
    return spec


# ---- the param swap's config (its handler is lowp.torch.quantize's) ----


def _is_lowp_config(cfg):
    return isinstance(cfg, (str,) + _CONFIG_TYPES)


def _step_of(step):
    v = step.value if isinstance(step, Enum) else step
    if not isinstance(v, str) or v.lower() not in [s.value for s in QATStep]:
        raise ValueError("step must be one of %s, got %r" % ([s.value for s in QATStep], step))
    return QATStep(v.lower())


@dataclass(frozen=True)
class ParamSwapConfig(*_SWAP_BASES):
    """Prepare (wrap) or convert (unwrap) a model's weights for lowp's low-precision matmuls.

    Args:
        base_config: a lowp config (or preset name) used as ``weight_config``.
        activation_config: optional config for the activations and gradients (default: the
            weight config's own recipe).
        weight_config: a lowp config (``MXQuantizeConfig()``, ``BlockQuantizeConfig()``,
            ``Block128Config()``, ``Float8RowwiseConfig()``, ``Float8TensorwiseConfig()``) or a
            preset name (``"mxfp8"``...). Accepted (and ignored) by ``step="convert"``.
        step: ``QATStep.PREPARE`` (default) or ``QATStep.CONVERT`` (torchao's ``QATStep``), or
            their names ``"prepare"`` / ``"convert"``; kept as a ``QATStep``.
        params_filter_fn: ``(param, fqn) -> bool``, which parameters to wrap. Default: the
            weights of ``nn.Linear`` modules and 3-D parameters (MoE expert weights) of modules
            that are not convolutions. ``fqn`` is relative to the module the handler is given
            (the whole model with ``filter_fn=param_swap_filter``).
    """

    base_config: Union[str, _LowpConfig, None] = None
    activation_config: Union[str, _LowpConfig, None] = None
    weight_config: Union[str, _LowpConfig, None] = None
    _: KW_ONLY
    step: QATStep = QATStep.PREPARE
    params_filter_fn: Optional[Callable[[torch.Tensor, str], bool]] = None

    def __post_init__(self):
        _set(self, "step", _step_of(self.step))
        if self.base_config is not None and self.weight_config is not None:
            raise ValueError("base_config and weight_config: give one of them, not both")
        if self.base_config is not None:
            if not _is_lowp_config(self.base_config):
                raise TypeError("base_config must be a lowp config or preset name, got %s" %
                                type(self.base_config).__name__)
            _set(self, "weight_config", self.base_config)
            _set(self, "base_config", None)
        self._check_configs()
        if self.params_filter_fn is not None and not callable(self.params_filter_fn):
            raise TypeError("params_filter_fn must be callable (param, fqn) -> bool")
        if self.step is QATStep.PREPARE:  # a name that is no preset fails here, not at prepare
            for arg in ("weight_config", "activation_config"):
                v = getattr(self, arg)
                if isinstance(v, str) and v not in PRESETS:
                    raise ValueError("%s (%r) is not a preset (%s)" % (arg, v, ", ".join(PRESETS)))
            self.matmul_config()

    def _check_configs(self):
        if self.weight_config is not None and not _is_lowp_config(self.weight_config):
            raise TypeError(
                "weight_config must be a lowp config (MXQuantizeConfig, NVFP4QuantizeConfig, "
                "BlockQuantizeConfig, Block128Config, Float8RowwiseConfig, "
                "Float8TensorwiseConfig) or a preset name, got %s" %
                type(self.weight_config).__name__)
        if self.activation_config is not None and not _is_lowp_config(self.activation_config):
            raise TypeError("activation_config must be a lowp config or preset name, got %s" %
                            type(self.activation_config).__name__)
        if self.step is QATStep.PREPARE and self.weight_config is None:
            raise ValueError("step='prepare' needs weight_config (or base_config)")

    def matmul_config(self):
        """What the wrapped weights carry: the MatmulSpec of the weight (and activation)
        config, resolved (and so checked) once at prepare."""
        return resolve_config(self.weight_config, self.activation_config)
