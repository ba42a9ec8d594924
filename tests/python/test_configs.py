"""The configs as torchao writes them (issue 36 point 2): frozen dataclasses on torchao's
AOBaseConfig and FakeQuantizeConfigBase, Enum fields (ScaleCalculationMode, KernelPreference,
QATStep), torch.dtype element types, strings normalized in __post_init__, and the
kernel preference carried into the MatmulSpec. The MatmulSpecs are checked against the recipe
table of config.py's docstring (the C presets), written out here by hand."""

import dataclasses

import pytest
import torch
from torchao.core.config import AOBaseConfig
from torchao.prototype.mx_formats.config import ScaleCalculationMode as AOScaleMode
from torchao.quantization.qat import FakeQuantizeConfigBase, QATStep

import lowp.torch as lt
from lowp.torch.config import KernelPreference, OperandSpec, ScaleCalculationMode

FP4 = torch.float4_e2m1fn_x2
CONFIGS = (lt.MXQuantizeConfig, lt.BlockQuantizeConfig, lt.Block128Config,
           lt.Float8RowwiseConfig, lt.Float8TensorwiseConfig)


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_frozen_dataclasses_on_torchao_bases(cls):
    c = cls()
    assert dataclasses.is_dataclass(c)
    assert isinstance(c, AOBaseConfig) and isinstance(c, FakeQuantizeConfigBase)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.kernel_preference = KernelPreference.NATIVE
    assert [f.name for f in dataclasses.fields(c)][-1] == "kernel_preference"
    assert c.kernel_preference is KernelPreference.AUTO
    assert c == cls() and hash(c) == hash(cls()) and len({c, cls()}) == 1
    assert repr(c).startswith(cls.__name__ + "(")


def test_strings_become_enums_and_dtypes():
    a = lt.MXQuantizeConfig(dtype="fp4", scale_mode="FLOOR", kernel_preference="Portable")
    b = lt.MXQuantizeConfig(dtype=FP4, scale_mode=ScaleCalculationMode.FLOOR,
                            kernel_preference=KernelPreference.PORTABLE)
    assert a == b and hash(a) == hash(b)
    assert a.dtype is FP4 and a.scale_mode is ScaleCalculationMode.FLOOR
    assert a.kernel_preference is KernelPreference.PORTABLE
    assert lt.MXQuantizeConfig("e5m2").dtype is torch.float8_e5m2
    # torchao's own ScaleCalculationMode is taken for lowp's
    assert lt.MXQuantizeConfig(scale_mode=AOScaleMode.EVEN).scale_mode is ScaleCalculationMode.EVEN
    assert lt.Float8TensorwiseConfig(margin=2).margin == 2.0
    assert type(lt.Float8TensorwiseConfig(margin=2).margin) is float
    fq = lt.BlockQuantizeConfig(mxfp4_fake_quantize_config=True)
    assert fq == lt.BlockQuantizeConfig(lt.MXQuantizeConfig(dtype=FP4))
    assert lt.BlockQuantizeConfig(False) == lt.BlockQuantizeConfig()
    # dataclasses.replace validates again
    with pytest.raises(ValueError, match="block_size"):
        dataclasses.replace(lt.MXQuantizeConfig(), block_size=16)


def test_bad_enum_fields_name_the_argument():
    with pytest.raises(ValueError, match="kernel_preference .*auto, portable, native"):
        lt.Block128Config(kernel_preference="cuda")
    with pytest.raises(TypeError, match="kernel_preference"):
        lt.Float8RowwiseConfig(kernel_preference=1)
    with pytest.raises(ValueError, match="scale_mode .*rceil, floor, ceil, even"):
        lt.MXQuantizeConfig(scale_mode="nearest")
    with pytest.raises(TypeError, match="scale_mode"):
        lt.MXQuantizeConfig(scale_mode=None)
    with pytest.raises(TypeError):  # keyword-only
        lt.MXQuantizeConfig(torch.float8_e4m3fn, 32, "rceil", "native")


def _op(fmt, scaling, mode=None, delayed=False):
    return OperandSpec(fmt, scaling, mode, None, delayed)


# config -> (input, weight, grad_output, keep_quantized, name): config.py's recipe table
TABLE = [
    (lt.MXQuantizeConfig(), (_op("e4m3", "mx32", "rceil"),) * 3 + (True, "mxfp8")),
    (lt.MXQuantizeConfig("fp4"), (_op("e2m1", "mx32", "rceil"),) * 3 + (True, "mxfp4")),
    (lt.MXQuantizeConfig(scale_mode="ceil"), (_op("e4m3", "mx32", "ceil"),) * 3 + (True, "custom")),
    (lt.BlockQuantizeConfig(), (_op("e4m3", "mx32", "rceil"), _op("e4m3", "block32x32", "floor"),
                                _op("e4m3", "mx32", "rceil"), True, "block32x32")),
    (lt.Block128Config(), (_op("e4m3", "block128"), _op("e4m3", "block128x128"),
                           _op("e4m3", "block128"), True, "block128")),
    (lt.Float8RowwiseConfig(), (_op("e4m3", "row"),) * 3 + (False, "fp8_rowwise")),
    (lt.Float8TensorwiseConfig(delayed=True),
     (_op("e4m3", "tensor", delayed=True),) * 2 + (_op("e5m2", "tensor", delayed=True), True,
                                                    "fp8_delayed")),
]


@pytest.mark.parametrize("cfg,want", TABLE)
def test_specs_keep_plain_strings_and_the_preference(cfg, want):
    s = lt.resolve_config(cfg)
    assert (s.input, s.weight, s.grad_output, s.keep_quantized, s.name) == want
    for op in (s.input, s.weight, s.grad_output):  # the ops read plain strings
        assert type(op.format) is str and (op.scale_mode is None or type(op.scale_mode) is str)
    assert s.kernel_preference is KernelPreference.AUTO
    p = lt.resolve_config(dataclasses.replace(cfg, kernel_preference="native"))
    assert p.kernel_preference is KernelPreference.NATIVE
    assert p == dataclasses.replace(s, kernel_preference=KernelPreference.NATIVE)


def test_activation_config_preference_joins_the_weight_configs():
    nat, por = KernelPreference.NATIVE, KernelPreference.PORTABLE
    blk = lt.BlockQuantizeConfig(kernel_preference="native")
    assert lt.resolve_config(blk, lt.MXQuantizeConfig()).kernel_preference is nat
    assert lt.resolve_config(lt.BlockQuantizeConfig(),
                             lt.MXQuantizeConfig(kernel_preference=por)).kernel_preference is por
    assert lt.resolve_config(blk, "mxfp8").kernel_preference is nat
    with pytest.raises(ValueError, match="kernel_preference"):
        lt.resolve_config(blk, lt.MXQuantizeConfig(kernel_preference=por))
    assert lt.resolve_config("mxfp8").kernel_preference is KernelPreference.AUTO
    # a MatmulSpec made or replaced with a name (or another Enum's member) holds the member
    spec = lt.resolve_config("mxfp8").replace(kernel_preference="PORTABLE")
    assert spec.kernel_preference is KernelPreference.PORTABLE
    with pytest.raises(ValueError, match="kernel_preference"):
        lt.resolve_config("mxfp8").replace(kernel_preference="cuda")


def test_param_swap_config_step_is_qatstep():
    for step in ("convert", "CONVERT", QATStep.CONVERT):
        c = lt.ParamSwapConfig(step=step)
        assert c.step is QATStep.CONVERT
    assert lt.ParamSwapConfig(step="convert") == lt.ParamSwapConfig(step=QATStep.CONVERT)
    assert lt.ParamSwapConfig(weight_config="mxfp8").step is QATStep.PREPARE
    # positional: base_config, activation_config, weight_config; step keyword-only
    c = lt.ParamSwapConfig(None, "mxfp8", lt.BlockQuantizeConfig())
    assert c.activation_config == "mxfp8" and c.weight_config == lt.BlockQuantizeConfig()
    b = lt.ParamSwapConfig(lt.MXQuantizeConfig())  # base_config is taken as the weight config
    assert b.base_config is None and b.weight_config == lt.MXQuantizeConfig()
    with pytest.raises(TypeError):
        lt.ParamSwapConfig(None, None, "mxfp8", "convert")
    with pytest.raises(ValueError, match="step"):
        lt.ParamSwapConfig(weight_config="mxfp8", step=1)
