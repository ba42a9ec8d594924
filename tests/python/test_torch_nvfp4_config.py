"""NVFP4QuantizeConfig (issue 38 point 3): a torchao-style frozen config whose spec is the C
preset nvfp4 (src/train/recipe.c, through lowp.rules) with TransformerEngine's switches
(2-D weight tiles, stochastic rounding of the gradient, the wgrad Hadamard transform); usable
with ParamSwapConfig / torchao's quantize_, the preset name "nvfp4" and the recipe nvfp4."""

import dataclasses

import pytest
import torch
import torch.nn as nn

import lowp.torch as lt
from lowp import rules
from lowp.torch import NVFP4QuantizeConfig, ParamSwapConfig
from lowp.torch.ops import native

pytestmark = pytest.mark.skipif("nvfp4" not in rules.TABLES["presets"],
                                reason="the C preset nvfp4 is not in this build's tables")


def _operand(s):
    return (s.format, s.scaling, s.rounding)


def test_default_is_the_c_preset_nvfp4():
    spec = NVFP4QuantizeConfig().to_spec()
    c = rules.preset("nvfp4")
    assert spec.name == "nvfp4"
    for role in ("input", "weight", "grad_output"):
        want = (c[role]["format"], c[role]["scaling"], c[role]["rounding"])
        assert _operand(getattr(spec, role)) == want
    assert _operand(spec.input) == ("e2m1", "nv16", "rne")
    assert _operand(spec.weight) == ("e2m1", "nv16x16", "rne")
    assert _operand(spec.grad_output) == ("e2m1", "nv16", "sr")
    assert spec.wgrad_hadamard is True and c["wgrad_hadamard"] is True
    assert lt.resolve_config("nvfp4") == spec  # the preset name


@pytest.mark.parametrize("kw,changed", [
    (dict(weight_2d=False), {"weight": ("e2m1", "nv16", "rne")}),
    (dict(grad_output_rounding="rne"), {"grad_output": ("e2m1", "nv16", "rne")}),
    (dict(wgrad_hadamard=False), {"wgrad_hadamard": False, "keep_quantized": True})])
def test_switches_turn_off_one_thing_each(kw, changed):
    """Each switch changes its own field of the preset's spec (without the transform, X's
    quantized wgrad copy is kept from the forward), nothing else."""
    te = NVFP4QuantizeConfig().to_spec()
    spec = NVFP4QuantizeConfig(**kw).to_spec()
    for field, want in changed.items():
        got = getattr(spec, field)
        assert (got if isinstance(got, bool) else _operand(got)) == want
    assert spec.name == "custom" and te.keep_quantized is False
    same = [f.name for f in dataclasses.fields(te) if f.name not in (*changed, "name")]
    assert all(getattr(spec, f) == getattr(te, f) for f in same)


@pytest.mark.parametrize("kw,err,match", [
    (dict(grad_output_rounding="stochastic"), ValueError, "grad_output_rounding"),
    (dict(wgrad_hadamard=1), TypeError, "wgrad_hadamard"),
    (dict(weight_2d="yes"), TypeError, "weight_2d"),
    (dict(kernel_preference="fastest"), ValueError, "kernel_preference")])
def test_bad_fields_are_refused_by_name(kw, err, match):
    with pytest.raises(err, match=match):
        NVFP4QuantizeConfig(**kw)


def test_frozen_torchao_config_exported():
    from torchao.core.config import AOBaseConfig
    cfg = NVFP4QuantizeConfig()
    assert isinstance(cfg, AOBaseConfig) and "NVFP4QuantizeConfig" in lt.__all__
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.weight_2d = False
    with pytest.raises(ValueError, match="input scaling \\(nv16x16\\) is a weight tiling"):
        lt.resolve_config("mxfp8", activation_config=dataclasses.replace(
            NVFP4QuantizeConfig().to_spec(),
            input=NVFP4QuantizeConfig().to_spec().weight))


@pytest.mark.skipif(not native.available(), reason="needs lowp's C extension")
def test_param_swap_forward_is_the_nvfp4_gemm():
    """quantize_ with ParamSwapConfig(weight_config=NVFP4QuantizeConfig()): the forward is
    the NVFP4 GEMM of the nv16 input copy and the nv16x16 weight copy."""
    from torchao.quantization import quantize_
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(48, 40, bias=False))
    w = m[0].weight.detach().clone()
    quantize_(m, ParamSwapConfig(weight_config=NVFP4QuantizeConfig()),
              filter_fn=lt.param_swap_filter)
    assert isinstance(m[0].weight, lt.LowpWeight)
    x = torch.randn(7, 48)
    y = m(x)
    xd, xs, _, _ = torch.ops.lowp.quantize(x, "e2m1", "nv16", "", -1, 0.0, "row")
    wd, ws, _, _ = torch.ops.lowp.quantize(w, "e2m1", "nv16x16", "", -1, 0.0, "row")
    want = torch.ops.lowp.scaled_mm(xd, xs, "e2m1", "nv16", wd, ws, "e2m1", "nv16x16", 48)
    assert torch.equal(y.float(), want.to(y.dtype).float())


def test_recipe_nvfp4_maps_weights_to_the_config_and_the_last_block_to_bf16():
    names = ["tok_embeddings.weight", "layers.0.attention.wq.weight",
             "layers.1.attention.wq.weight", "layers.1.feed_forward.w1.weight",
             "norm.weight", "output.weight"]
    plan = lt.plan_recipe(names, "nvfp4")
    assert isinstance(plan["layers.0.attention.wq.weight"], NVFP4QuantizeConfig)
    assert plan["layers.1.attention.wq.weight"] is None  # the last block
    assert plan["layers.1.feed_forward.w1.weight"] is None
    assert plan["output.weight"] is None and plan["tok_embeddings.weight"] is None


@pytest.mark.skipif(not native.available(), reason="needs lowp's C extension")
@pytest.mark.parametrize("K", [33, 48])
def test_linear_with_odd_in_features_runs_its_dgrad_on_the_tile_copy(K):
    """The input gradient reads the forward's 16x16 weight copy as stored [N_out, K_in] (packed
    E2M1 codes along K_in, which may be odd): dX = the NVFP4 GEMM of dY's nv16 copy and it."""
    torch.manual_seed(K)
    w = torch.randn(40, K)
    x = torch.randn(7, K, requires_grad=True)
    cfg = NVFP4QuantizeConfig(grad_output_rounding="rne", wgrad_hadamard=False)
    y = lt.linear(x, w, config=cfg)
    dy = torch.randn_like(y)
    y.backward(dy)
    gd, gs, _, _ = torch.ops.lowp.quantize(dy, "e2m1", "nv16", "", -1, 0.0, "row")
    wd, ws, _, _ = torch.ops.lowp.quantize(w, "e2m1", "nv16x16", "", -1, 0.0, "row")
    want = torch.ops.lowp.scaled_mm(gd, gs, "e2m1", "nv16", wd, ws, "e2m1", "nv16x16", 40,
                                    "f32", True, K)
    assert x.grad.shape == (7, K)
    assert torch.equal(x.grad.float(), want.to(x.grad.dtype).float())
