"""Stochastic rounding on the portable and native quantize paths and the linear op of the FP4
recipes (SR gradients, the wgrad Hadamard transform), issue 38 point 3. References: C's
``encode_sr`` through ``lowp.cast(round="sr")``, the native kernels (C reference with
``rounding=SR``) against the portable ones, float64 products.
"""

import numpy as np
import pytest
import torch

import lowp
import lowp.torch as lt
from lowp.torch.config import resolve_config
from lowp.torch.ops import portable as P
from lowp.torch.ops.philox import philox_states, philox_words

try:
    from lowp._numpy_api import _lowp as _ext
except Exception:  # pragma: no cover - depends on the build
    _ext = None

needs_ext = pytest.mark.skipif(_ext is None, reason="needs lowp's C extension")


# ---- stochastic rounding ----

def _special_values(n, g):
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-12, 12, (n,), generator=g))
    x[:12] = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf"), 6.0, -6.5,
                           1e-40, 0.25, 0.75, 5.0, 3e38])
    return x


@needs_ext
@pytest.mark.parametrize("fmt", ["e2m1", "e4m3", "e5m2"])
def test_encode_sr_equals_c_cast(fmt):
    g = torch.Generator().manual_seed(3)
    x = _special_values(4099, g)
    seed, off = 99, 2**33 + 7
    want = lowp.cast(x.numpy(), fmt, round="sr", seed=seed, offset=off)
    got = P.encode_sr(x, fmt, philox_words(seed, off, x.numel()))
    np.testing.assert_array_equal(got.numpy().astype(np.uint8), want)


def test_encode_sr_is_unbiased():
    v = torch.tensor([0.3, 1.2, 2.6, 4.4, -5.1])  # E2M1 neighbours: 0/0.5, 1/1.5, 2/3, 4/6
    r = philox_words(5, 0, 20000 * 5).reshape(20000, 5)
    codes = P.encode_sr(v.expand(20000, 5), "e2m1", r)
    mean = P.decode(codes, "e2m1").double().mean(0)
    assert torch.allclose(mean, v.double(), atol=0.03)


SR_CASES = [("mx32", 45, 70), ("nv16", 37, 50), ("nv16", 16, 16), ("nv16x16", 33, 47)]


def _sr_input(R, C, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(R, C, generator=g) * torch.exp2(torch.randint(-8, 8, (R, C), generator=g))
    x[0, :3] = torch.tensor([0.0, -0.0, 1e-40])
    x[1, 5] = float("nan")
    x[2, 7] = float("inf")
    return x


@needs_ext
@pytest.mark.parametrize("scaling,R,C", SR_CASES)
@pytest.mark.parametrize("axis", ["row", "col", "both"])
def test_quantize_sr_portable_equals_native(scaling, R, C, axis):
    x = _sr_input(R, C, R + C)
    args = (x, "e2m1", scaling, "", -1, 0.0, axis, None, None, "sr", 31, 1000)
    nat = torch.ops.lowp.quantize.default(*args)
    por = torch.ops.lowp.quantize.portable(*args)
    rne = torch.ops.lowp.quantize.default(*args[:9])
    for a, b in zip(nat, por):
        assert torch.equal(a, b)
    k = 0 if axis != "col" else 2
    assert not torch.equal(nat[k], rne[k])  # SR changed some elements...
    assert torch.equal(nat[k + 1], rne[k + 1])  # ...and no scale


@needs_ext
@pytest.mark.parametrize("scaling", ["mx32", "nv16"])
def test_quantize_grouped_sr_portable_equals_native(scaling):
    x = _sr_input(70, 24, 5)
    offs = torch.tensor([20, 20, 53, 66], dtype=torch.int32)
    args = (x, "e2m1", scaling, "", -1, 0.0, "col", offs, None, "sr", 8, 3)
    nat = torch.ops.lowp.quantize.default(*args)
    por = torch.ops.lowp.quantize.portable(*args)
    for a, b in zip(nat, por):
        assert torch.equal(a, b)


def test_quantize_sr_word_index_is_the_copys_own():
    """Element (i, j) of a copy [rows, cols] takes word offset + i * cols + j: the rowwise copy
    of x^T with offset o equals the columnwise copy of x with offset o."""
    x = _sr_input(20, 48, 1)
    _, _, cd, cs = torch.ops.lowp.quantize.portable(x, "e2m1", "nv16", "", -1, 0.0, "col",
                                                    None, None, "sr", 4, 17)
    rd, rs, _, _ = torch.ops.lowp.quantize.portable(x.t().contiguous(), "e2m1", "nv16", "", -1,
                                                    0.0, "row", None, None, "sr", 4, 17)
    assert torch.equal(cd, rd) and torch.equal(cs, rs)


def test_quantize_sr_bad_arguments():
    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match="rounding"):
        torch.ops.lowp.quantize(x, "e2m1", "mx32", "", -1, 0.0, "row", None, None, "sto", 0, 0)
    with pytest.raises(ValueError, match="offset"):
        torch.ops.lowp.quantize(x, "e2m1", "mx32", "", -1, 0.0, "row", None, None, "sr", 0, -2)


# ---- the linear op ----

def _fp4_spec(pref, scaling="mx32"):
    if scaling == "mx32":
        return resolve_config(lt.MXQuantizeConfig(dtype="fp4", grad_output_rounding="sr",
                                                  wgrad_hadamard=True, kernel_preference=pref))
    return resolve_config("nvfp4").replace(kernel_preference=pref)


def _grads(spec, x, w, dy, seed=1234):
    philox_states().reset(seed)
    xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = lt.linear(xx, ww, None, spec)
    y.backward(dy)
    return y.detach(), xx.grad, ww.grad


def test_linear_fp4_backward_draws_and_is_unbiased():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(64, 96, generator=g), torch.randn(40, 96, generator=g)
    dy = torch.randn(64, 40, generator=g)
    spec = _fp4_spec("portable")
    _, dx1, dw1 = _grads(spec, x, w, dy)
    st = philox_states().get_states()
    assert st["hadamard"][1] == 1 and st["stochastic_rounding"][1] == 2 * 64 * 40
    _, dx2, dw2 = _grads(spec, x, w, dy, seed=99)
    assert not torch.equal(dw1, dw2) and not torch.equal(dx1, dx2)
    _, dx3, dw3 = _grads(spec, x, w, dy)
    assert torch.equal(dw1, dw3) and torch.equal(dx1, dx3)  # reproducible
    ref = dy.double().t() @ x.double()
    rel = ((dw1.double() - ref).norm() / ref.norm()).item()
    assert rel < 0.35  # FP4 on both operands: about 0.2 measured


@needs_ext
@pytest.mark.parametrize("scaling", ["mx32"])
def test_linear_fp4_native_equals_portable(scaling):
    try:
        spec_n = _fp4_spec("auto", scaling)
    except KeyError:
        pytest.skip("the C preset is not built into this extension")
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(50, 80, generator=g), torch.randn(24, 80, generator=g)
    dy = torch.randn(50, 24, generator=g)
    a = _grads(spec_n, x, w, dy)
    b = _grads(spec_n.replace(kernel_preference="portable"), x, w, dy)
    for u, v in zip(a, b):
        assert torch.equal(u, v)


# ---- the recipes ----

def test_last_block_of_names():
    from lowp.torch.recipes import _last_block
    assert _last_block(["tok_embeddings.weight", "layers.0.attention.wq.weight",
                        "layers.11.moe.experts.w1", "norm.weight"]) == 11
    assert _last_block(["model.layers.3.mlp.w", "x.layers.12b.w", "mylayers.9.w"]) == 3
    assert _last_block(["head.weight"]) == -1


@pytest.mark.skipif("mxfp4" not in lt.RECIPES, reason="the C tables have no mxfp4 recipe")
@pytest.mark.parametrize("recipe", ["mxfp4", "nvfp4"])
def test_fp4_recipes_keep_the_last_block_high_precision(recipe):
    if recipe not in lt.RECIPES or (recipe == "nvfp4" and not hasattr(lt, "NVFP4QuantizeConfig")):
        pytest.skip(f"no {recipe} recipe")
    names = ["tok_embeddings.weight", "layers.0.attention.wq.weight", "layers.0.moe.experts.w1",
             "layers.3.attention.wo.weight", "layers.3.moe.experts.w2",
             "layers.2.moe.router.gate.weight", "output.weight"]
    plan = lt.plan_recipe(names, recipe)
    hp = {n for n, c in plan.items() if c is None}
    assert hp == {"tok_embeddings.weight", "layers.3.attention.wo.weight",
                  "layers.3.moe.experts.w2", "layers.2.moe.router.gate.weight", "output.weight"}
    spec = resolve_config(plan["layers.0.moe.experts.w1"])
    assert spec.grad_output.rounding == "sr" and spec.wgrad_hadamard and not spec.keep_quantized
    assert spec.input.rounding == spec.weight.rounding == "rne"


def test_fp4_backward_config_fields():
    with pytest.raises(ValueError, match="grad_output_rounding"):
        lt.MXQuantizeConfig(grad_output_rounding="sr")  # e4m3: C rounds E2M1 only
    with pytest.raises(ValueError, match="grad_output_rounding"):
        lt.MXQuantizeConfig(dtype="fp4", grad_output_rounding="up")
    with pytest.raises(TypeError, match="wgrad_hadamard"):
        lt.MXQuantizeConfig(dtype="fp4", wgrad_hadamard=1)
    spec = resolve_config(lt.MXQuantizeConfig(dtype="fp4", grad_output_rounding="sr"))
    assert spec.grad_output.rounding == "sr" and not spec.wgrad_hadamard and spec.name == "custom"
    assert resolve_config(lt.MXQuantizeConfig(dtype="fp4")).grad_output.rounding == "rne"
    with pytest.raises(ValueError, match="rounding"):
        torch.ops.lowp.quantize(torch.randn(4, 32), "e4m3", "mx32", "", -1, 0.0, "row", None,
                                None, "sr", 0, 0)


@pytest.mark.parametrize("pref", ["portable", "auto"])
def test_linear_fp4_backward_compiled_equals_eager(pref):
    """torch.compile gives the eager bytes, and a second compiled call takes new Philox words
    (the positions are drawn at run time, never baked into the graph)."""
    if pref == "auto" and _ext is None:
        pytest.skip("needs lowp's C extension")
    g = torch.Generator().manual_seed(6)
    x, w = torch.randn(48, 64, generator=g), torch.randn(32, 64, generator=g)
    dy = torch.randn(48, 32, generator=g)
    cfg = lt.MXQuantizeConfig(dtype="fp4", grad_output_rounding="sr", wgrad_hadamard=True,
                              kernel_preference=pref)

    def step(xx, ww):
        y = lt.linear(xx, ww, None, cfg)
        y.backward(dy)
        return y

    compiled = torch.compile(step)
    out = []
    for fn in (step, compiled, compiled):
        if fn is step or not out[1:]:
            philox_states().reset(5)
        xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = fn(xx, ww)
        out.append((y.detach(), xx.grad, ww.grad))
    for a, b in zip(out[0], out[1]):
        assert torch.equal(a, b)
    assert not torch.equal(out[1][2], out[2][2])  # the second call's words are new
    assert philox_states().get_states()["stochastic_rounding"][1] == 2 * 2 * 48 * 32


# ---- the trainer ----

@needs_ext
@pytest.mark.parametrize("recipe", ["all_mxfp8", "mxfp4"])
def test_trainer_resume_keeps_the_philox_positions(tmp_path, recipe):
    """A resumed mxfp4 run continues the SR and Hadamard streams where the checkpoint left
    them: the same weights as the run without the stop (bit for bit, as for every recipe)."""
    from lowp.torch.trainer import CharData, MoEConfig, MoETransformer, TrainConfig, Trainer

    def trainer():
        data = CharData.builtin()
        cfg = TrainConfig(steps=4, batch=2, warmup=1, eval_every=0, eval_batches=1, seed=7)
        return Trainer(MoETransformer(MoEConfig.preset("tiny", data.vocab), 7), data, recipe,
                       cfg)

    whole = trainer()
    whole.run(4)
    want = {k: v.clone() for k, v in whole.model.state_dict().items()}
    first = trainer()
    first.run(2)
    path = str(tmp_path / "run.ckpt")
    first.save(path)
    second = trainer()  # its Philox states start again from the seed...
    second.load(path)  # ...until the checkpoint's positions are restored
    assert lt.philox_states().get_states() == first_states(path)
    second.run(4)  # (until step 4)
    for k, v in second.model.state_dict().items():
        assert torch.equal(v, want[k]), k


def first_states(path):
    from lowp.torch.trainer.checkpoint import read_checkpoint
    return read_checkpoint(path)["philox"]


@needs_ext
@pytest.mark.parametrize("shape,offs", [((5, 48), None), ((3, 37), None), ((4, 70), [16, 33, 60]),
                                        ((3, 40), [])])
def test_hadamard_op_native_equals_portable(shape, offs):
    x = _sr_input(*shape, 9)
    o = None if offs is None else torch.tensor(offs, dtype=torch.int32)
    for xx in (x, x.to(torch.bfloat16)):
        nat = torch.ops.lowp.hadamard16.default(xx, 12, 34, o)
        por = torch.ops.lowp.hadamard16.portable(xx, 12, 34, o)
        assert nat.dtype == torch.float32
        assert torch.equal(nat.view(torch.int32), por.view(torch.int32))
    with pytest.raises(ValueError, match="offs"):
        torch.ops.lowp.hadamard16(x, 0, 0, torch.tensor([9, 3], dtype=torch.int32))
