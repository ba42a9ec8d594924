"""lowp.torch.patch_torchao(): torchao 0.18's own MXFP8 / FP8 training recipes on lowp's ops.

Models are converted with torchao's own `quantize_` and `MXFP8TrainingOpConfig.from_recipe`.
With the patch: outputs and gradients identical (torch.equal) to lowp.torch's ops with the
equivalent config on copies of the same weights. Without it: torchao's own emulated path (AUTO
refuses on the CPU); each path against a float64 reference and against each other to the SQNR
thresholds of NUMERICS.md section 8. Patch / unpatch / patch again (object identity), refusal
of an untested version and of a missing internal with nothing patched, settings lowp cannot
honour, and activation checkpointing reusing the weight copies."""

import warnings

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import lowp.torch as lt
from lowp.torch import patches as LP
from lowp.torch.patches import torchao_patch as TP

warnings.filterwarnings("ignore")
torchao = pytest.importorskip("torchao")
from torchao.prototype import moe_training as MOE  # noqa: E402
from torchao.prototype.moe_training import fp8_grouped_mm as FGM  # noqa: E402
from torchao.prototype.moe_training import mxfp8_grouped_mm as GMM  # noqa: E402
from torchao.prototype.moe_training import mxfp8_linear as ML  # noqa: E402
from torchao.prototype.moe_training import tensor as TT  # noqa: E402
from torchao.prototype.moe_training.config import (MXFP8TrainingOpConfig,  # noqa: E402
                                                   MXFP8TrainingRecipe as R)
from torchao.quantization import quantize_  # noqa: E402

BF = torch.bfloat16
RECIPES = [R.MXFP8_RCEIL, R.MXFP8_EMULATED_RCEIL, R.MXFP8_RCEIL_WGRAD_WITH_HP]
THRESH = (27.0, 25.0, 24.0)  # NUMERICS.md 8, MXFP8: out, dX, dW


@pytest.fixture(autouse=True)
def _unpatched():
    lt.unpatch_torchao()
    yield
    lt.unpatch_torchao()


def sqnr(ref, x):
    ref, x = ref.double(), x.double()
    return (20 * torch.log10(ref.norm() / (ref - x).norm())).item()


class Experts(nn.Module):
    """Routed experts: one [G, N, K] weight through torch._grouped_mm with offsets."""

    def __init__(self, w):
        super().__init__()
        self.w = nn.Parameter(w.clone())

    def forward(self, x, offs):
        return torch._grouped_mm(x, self.w.transpose(-2, -1), offs=offs)


def _data():
    g = torch.Generator().manual_seed(15)
    return dict(
        w=(torch.randn(96, 64, generator=g) * 0.1).to(BF),
        x=torch.randn(2, 48, 64, generator=g).to(BF),  # 96 tokens (torchao: a multiple of 32)
        dy=torch.randn(2, 48, 96, generator=g).to(BF),
        we=(torch.randn(3, 64, 96, generator=g) * 0.1).to(BF),  # G=3, N=64, K=96
        xe=torch.randn(128, 96, generator=g).to(BF),  # torchao: tokens a multiple of 32
        dye=torch.randn(128, 64, generator=g).to(BF),
    )


D = _data()
OFFS_ALIGNED = torch.tensor([32, 32, 128], dtype=torch.int32)  # with an empty group
OFFS_RAGGED = torch.tensor([20, 57, 128], dtype=torch.int32)
OFFS_TAIL = torch.tensor([20, 57, 100], dtype=torch.int32)  # rows 100.. belong to no group


def torchao_linear(recipe):
    m = nn.Linear(64, 96, bias=False).to(BF)
    with torch.no_grad():
        m.weight.copy_(D["w"])
    quantize_(m, MXFP8TrainingOpConfig.from_recipe(recipe))
    assert isinstance(m.weight, TT.MXFP8TrainingWeightWrapperTensor)
    return m


def run_linear(m, x=None):
    x = (D["x"] if x is None else x).clone().requires_grad_()
    y = m(x)
    y.backward(D["dy"])
    return y.detach(), x.grad, m.weight.grad.detach()


def lowp_linear(recipe):
    w = D["w"].clone().requires_grad_()
    x = D["x"].clone().requires_grad_()
    y = lt.linear(x, w, None, lt.MXQuantizeConfig(scale_mode="rceil"),
                  wgrad_hp=recipe == R.MXFP8_RCEIL_WGRAD_WITH_HP)
    y.backward(D["dy"])
    return y.detach(), x.grad, w.grad


def torchao_experts(recipe, pad=False):
    m = Experts(D["we"])
    cfg = MXFP8TrainingOpConfig.from_recipe(recipe)
    cfg.pad_token_groups_for_grouped_mm = pad
    quantize_(m, cfg, filter_fn=lambda mod, fqn: isinstance(mod, Experts))
    assert isinstance(m.w, TT.MXFP8TrainingWeightWrapperTensor)
    return m


def run_experts(m, offs):
    x = D["xe"].clone().requires_grad_()
    y = m(x, offs)
    y.backward(D["dye"])
    return y.detach(), x.grad, m.w.grad.detach()


def lowp_experts(recipe, offs):
    w = D["we"].clone().requires_grad_()
    x = D["xe"].clone().requires_grad_()
    y = lt.grouped_mm(x, w.transpose(-2, -1), offs, lt.MXQuantizeConfig(),
                      wgrad_hp=recipe == R.MXFP8_RCEIL_WGRAD_WITH_HP)
    y.backward(D["dye"])
    return y.detach(), x.grad, w.grad


def ref_linear():
    x, w, dy = D["x"].double().reshape(-1, 64), D["w"].double(), D["dy"].double().reshape(-1, 96)
    return (x @ w.t()).reshape(2, 48, 96), (dy @ w).reshape(2, 48, 64), dy.t() @ x


def ref_experts(offs):
    x, w, dy = D["xe"].double(), D["we"].double(), D["dye"].double()
    y, dx, dw = torch.zeros(128, 64, dtype=torch.float64), torch.zeros_like(x), torch.zeros_like(w)
    lo = 0
    for g, hi in enumerate(offs.tolist()):
        y[lo:hi] = x[lo:hi] @ w[g].t()
        dx[lo:hi] = dy[lo:hi] @ w[g]
        dw[g] = dy[lo:hi].t() @ x[lo:hi]
        lo = hi
    return y, dx, dw


def identical(a, b):
    for p, q in zip(a, b):
        assert p.dtype == q.dtype and p.shape == q.shape
        assert torch.equal(p, q)


# ---- with the patch: identical to lowp.torch's ops ----


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.name)
def test_linear_patched_identical_to_lowp(recipe):
    lt.patch_torchao()
    lt.reset_stats()
    got = run_linear(torchao_linear(recipe))
    assert lt.stats()["native"] > 0  # lowp's kernels ran
    identical(got, lowp_linear(recipe))


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.name)
@pytest.mark.parametrize("offs", [OFFS_ALIGNED, OFFS_RAGGED, OFFS_TAIL],
                         ids=["aligned", "ragged", "tail"])
def test_experts_patched_identical_to_lowp(recipe, offs):
    lt.patch_torchao()
    lt.reset_stats()
    got = run_experts(torchao_experts(recipe), offs)
    assert lt.stats()["scaled_grouped_mm.native"] > 0
    identical(got, lowp_experts(recipe, offs))


def test_patched_portable_path_identical():
    """Inside kernel_preference("portable") (lowp's path for non-CPU devices) the same bytes come out."""
    lt.patch_torchao()
    native = run_experts(torchao_experts(R.MXFP8_RCEIL), OFFS_RAGGED)
    lt.reset_stats()
    with lt.kernel_preference("portable"):
        port = run_experts(torchao_experts(R.MXFP8_RCEIL), OFFS_RAGGED)
    assert lt.stats()["native"] == 0 and lt.stats()["portable"] > 0
    identical(native, port)


# ---- without it: torchao's own path; agreement to NUMERICS 8 ----


def test_unpatched_auto_refuses_on_cpu():
    """torchao's AUTO kernels need Triton / SM100: on the CPU they assert."""
    with pytest.raises(AssertionError):
        run_linear(torchao_linear(R.MXFP8_RCEIL))
    with pytest.raises(AssertionError, match="SM100"):
        run_experts(torchao_experts(R.MXFP8_RCEIL), OFFS_ALIGNED)
    with pytest.raises(Exception):  # the FP8 rowwise grouped mm is Triton kernels only
        MOE._to_fp8_rowwise_then_scaled_grouped_mm(
            D["xe"], D["we"].transpose(-2, -1), OFFS_ALIGNED,
            pad_token_groups_for_grouped_mm=False)


def _check_sqnr(ref, a, b, label):
    for r, p, q, t, name in zip(ref, a, b, THRESH, ("out", "dX", "dW")):
        assert sqnr(r, p) >= t, f"{label} lowp {name}: {sqnr(r, p):.1f} dB"
        assert sqnr(r, q) >= t, f"{label} torchao {name}: {sqnr(r, q):.1f} dB"
        assert sqnr(q, p) >= t, f"{label} lowp vs torchao {name}: {sqnr(q, p):.1f} dB"


def test_linear_unpatched_emulated_agrees():
    ao = run_linear(torchao_linear(R.MXFP8_EMULATED_RCEIL))
    lt.patch_torchao()
    lp = run_linear(torchao_linear(R.MXFP8_EMULATED_RCEIL))
    _check_sqnr(ref_linear(), lp, ao, "linear")
    # bf16 input: both quantize every block alike; the outputs differ at most by the order of
    # binary32 accumulation before the bf16 rounding
    assert sqnr(ao[0], lp[0]) > 40


@pytest.mark.parametrize("offs,pad", [(OFFS_ALIGNED, False), (OFFS_RAGGED, True)],
                         ids=["aligned", "ragged_padded"])
def test_experts_unpatched_emulated_agrees(offs, pad):
    """Ragged groups: torchao pads each group to 32 tokens (pad_token_groups_for_grouped_mm),
    which is what lowp's per-group token blocks compute without padding."""
    ao = run_experts(torchao_experts(R.MXFP8_EMULATED_RCEIL, pad), offs)
    lt.patch_torchao()
    lp = run_experts(torchao_experts(R.MXFP8_EMULATED_RCEIL, pad), offs)
    _check_sqnr(ref_experts(offs), lp, ao, "experts")
    assert sqnr(ao[2], lp[2]) > 40


def test_fp8_rowwise_grouped_mm_patched():
    """torchao's FP8 rowwise grouped mm (Triton-only unpatched) = lowp's fp8_rowwise."""
    lt.patch_torchao()
    w = D["we"].clone().requires_grad_()
    x = D["xe"].clone().requires_grad_()
    y = MOE._to_fp8_rowwise_then_scaled_grouped_mm(x, w.transpose(-2, -1), OFFS_RAGGED,
                                                   pad_token_groups_for_grouped_mm=False)
    y.backward(D["dye"])
    w2 = D["we"].clone().requires_grad_()
    x2 = D["xe"].clone().requires_grad_()
    y2 = lt.grouped_mm(x2, w2.transpose(-2, -1), OFFS_RAGGED, "fp8_rowwise")
    y2.backward(D["dye"])
    identical((y, x.grad, w.grad), (y2, x2.grad, w2.grad))
    for r, p, t in zip(ref_experts(OFFS_RAGGED), (y, x.grad, w.grad), (25.0, 24.0, 23.0)):
        assert sqnr(r, p) >= t
    with pytest.raises(ValueError, match="float8_dtype"):
        MOE._to_fp8_rowwise_then_scaled_grouped_mm(x, w.transpose(-2, -1), OFFS_RAGGED,
                                                   float8_dtype=torch.float8_e5m2)


# ---- patch, unpatch, patch again ----


def _bindings():
    return [TP.binding(TP.resolve(t.module), t.name) for t in TP.TARGETS]


def test_patch_unpatch_identity_and_behaviour():
    orig = _bindings()
    assert tt_orig_is(orig)
    lt.patch_torchao()
    first = _bindings()
    assert all(a is not b for a, b in zip(orig, first))
    assert TT._to_mxfp8_then_scaled_mm is LP.ops.to_mxfp8_then_scaled_mm
    lt.patch_torchao()  # idempotent: nothing re-saved or replaced
    assert all(a is b for a, b in zip(first, _bindings())) and len(TP._ORIGINALS) == len(orig)
    assert run_linear(torchao_linear(R.MXFP8_RCEIL)) is not None
    lt.unpatch_torchao()
    assert all(a is b for a, b in zip(orig, _bindings())) and not lt.torchao_patched()
    with pytest.raises(AssertionError):
        run_linear(torchao_linear(R.MXFP8_RCEIL))
    ao = run_linear(torchao_linear(R.MXFP8_EMULATED_RCEIL))
    lt.patch_torchao()
    identical(run_linear(torchao_linear(R.MXFP8_RCEIL)), lowp_linear(R.MXFP8_RCEIL))
    lt.unpatch_torchao()
    identical(run_linear(torchao_linear(R.MXFP8_EMULATED_RCEIL)), ao)
    lt.unpatch_torchao()  # no-op
    assert all(a is b for a, b in zip(orig, _bindings()))


def tt_orig_is(orig):
    return TT._to_mxfp8_then_scaled_mm is ML._to_mxfp8_then_scaled_mm and orig[0] is orig[1]


def test_untested_version_refused(monkeypatch):
    orig = _bindings()
    monkeypatch.setattr(torchao, "__version__", "0.99.0")
    with pytest.raises(RuntimeError, match=r"torchao 0\.99\.0 is not a tested version"):
        lt.patch_torchao()
    assert not lt.torchao_patched()
    monkeypatch.undo()
    assert all(a is b for a, b in zip(orig, _bindings()))


def test_torchao_missing_refused(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "torchao", None)  # import torchao now raises
    with pytest.raises(RuntimeError, match="torchao is not importable"):
        lt.patch_torchao()
    assert not lt.torchao_patched()


@pytest.mark.parametrize("mod,name", [(GMM, "_MXFP8GroupedMM"), (FGM, "_Float8GroupedMM"),
                                      (TT, "_to_mxfp8_then_scaled_mm")])
def test_missing_internal_refused(monkeypatch, mod, name):
    orig = _bindings()
    monkeypatch.delattr(mod, name)
    with pytest.raises(RuntimeError, match=rf"torchao 0\.18.* lacks .*{name}; nothing"):
        lt.patch_torchao()
    assert not lt.torchao_patched() and not TP._ORIGINALS
    # the last target in the table is still torchao's (nothing was applied before the check)
    import torchao.prototype.moe_training.conversion_utils as CU
    assert CU._get_tensor_cls_for_config is orig[-1]
    monkeypatch.undo()
    assert all(a is b for a, b in zip(orig, _bindings()))


def test_changed_signature_refused(monkeypatch):
    def other(input_hp, weight_hp, kernel_preference):  # lost two parameters
        raise AssertionError("not called")

    monkeypatch.setattr(ML, "_to_mxfp8_then_scaled_mm", other)
    with pytest.raises(RuntimeError, match="scale_calculation_mode, wgrad_with_hp"):
        lt.patch_torchao()
    assert not lt.torchao_patched() and ML._to_mxfp8_then_scaled_mm is other


# ---- settings lowp cannot honour ----


def test_settings_lowp_cannot_honour():
    from torchao.quantization.quantize_.common import KernelPreference as KP
    lt.patch_torchao()
    x = D["xe"].clone()
    wt = D["we"].transpose(-2, -1)
    with pytest.raises(ValueError, match="out_dtype"):
        MOE._to_mxfp8_then_scaled_grouped_mm(x, wt, OFFS_ALIGNED, out_dtype=torch.float16)
    with pytest.raises(ValueError, match="kernel_preference"):
        MOE._to_mxfp8_then_scaled_grouped_mm(x, wt, OFFS_ALIGNED, kernel_preference=KP.TRITON)
    with pytest.raises(ValueError, match="wgrad_with_hp"):
        MOE._to_mxfp8_then_scaled_grouped_mm(x.float(), wt.float(), OFFS_ALIGNED,
                                             out_dtype=torch.float32, wgrad_with_hp=True)
    with pytest.raises(ValueError, match="offs"):
        MOE._to_mxfp8_then_scaled_grouped_mm(x, wt, None)
    with pytest.raises(ValueError, match="scale_calculation_mode"):
        TT._to_mxfp8_then_scaled_mm(D["x"], D["w"], KP.AUTO, "round_half")
    with pytest.raises(ValueError, match="block_size"):
        ML.mx_mm.apply(D["x"], D["w"], torch.float8_e4m3fn, torch.float8_e4m3fn,
                       torch.float8_e4m3fn, 16, KP.AUTO, None, None, "rceil", False)


def test_mx_mm_and_mxfp8_linear_module():
    """Callers of mx_mm.apply and torchao's MXFP8Linear module (AUTO) reach lowp too."""
    from torchao.quantization.quantize_.common import KernelPreference as KP
    lt.patch_torchao()
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    y = ML.mx_mm.apply(D["x"], D["w"], e4, e4, e4, 32, KP.AUTO, None, None, "rceil", False)
    assert torch.equal(y, lt.linear(D["x"], D["w"], None, "mxfp8"))
    y = ML.mx_mm.apply(D["x"], D["w"], e4, e4, e5, 32, KP.EMULATED, None, None, "rceil", False)
    op = lt.OperandSpec("e4m3", "mx32", "rceil")
    spec = lt.MatmulSpec(op, op, lt.OperandSpec("e5m2", "mx32", "rceil"))
    assert torch.equal(y, lt.linear(D["x"], D["w"], None, spec))
    m = ML.MXFP8Linear(64, 96, bias=True).to(BF)
    with torch.no_grad():
        m.weight.copy_(D["w"])
        m.bias.normal_()
    x = D["x"].clone().requires_grad_()
    y = m(x)
    y.backward(D["dy"])
    x2 = D["x"].clone().requires_grad_()
    w2 = D["w"].clone().requires_grad_()
    y2 = lt.linear(x2, w2, None, "mxfp8") + m.bias.detach()
    y2.backward(D["dy"])
    identical((y.detach(), x.grad, m.weight.grad), (y2.detach(), x2.grad, w2.grad))
    assert LP.weight_cache(m.weight).quantizations == 1  # a plain weight: keyed by itself


def test_mxfp8_linear_bias():
    """torchao 0.18's MXFP8 weight wrapper drops F.linear's bias (unpatched: the output is the
    bias-free one); patched, the bias is added after lowp's product and gets its gradient."""
    b = torch.linspace(-1, 1, 96).to(BF)

    def with_bias(recipe):
        m = nn.Linear(64, 96, bias=True).to(BF)
        with torch.no_grad():
            m.weight.copy_(D["w"])
            m.bias.copy_(b)
        quantize_(m, MXFP8TrainingOpConfig.from_recipe(recipe))
        assert isinstance(m.weight, TT.MXFP8TrainingWeightWrapperTensor)
        return m

    no_bias = run_linear(torchao_linear(R.MXFP8_EMULATED_RCEIL))
    identical(run_linear(with_bias(R.MXFP8_EMULATED_RCEIL)), no_bias)  # torchao's own
    lt.patch_torchao()
    for recipe in (R.MXFP8_RCEIL, R.MXFP8_EMULATED_RCEIL):
        m = with_bias(recipe)
        y, dx, dw = run_linear(m)
        ref = lowp_linear(recipe)
        identical((y, dx, dw), ((ref[0] + b),) + tuple(ref[1:]))
        assert not torch.equal(y, ref[0])
        assert torch.equal(m.bias.grad, D["dy"].sum((0, 1)))
        # the keyword form takes the same path
        x = D["x"].clone()
        assert torch.equal(torch.nn.functional.linear(x, m.weight, bias=m.bias).detach(), y)
    lt.unpatch_torchao()
    identical(run_linear(with_bias(R.MXFP8_EMULATED_RCEIL)), no_bias)


def _wrapped(w, config):
    """An nn.Linear holding weight w [N, K], converted by torchao's quantize_ with config."""
    m = nn.Linear(w.shape[1], w.shape[0], bias=False).to(BF)
    with torch.no_grad():
        m.weight.copy_(w)
    quantize_(m, config)
    return m


_MM_OPS = {"mm": torch.mm, "matmul": torch.matmul, "at": lambda a, b: a @ b}
_W_SHAPES = {"square": (64, 64), "nonsquare": (96, 64)}  # [N, K]


def _mm_case(shape, seed=4):
    g = torch.Generator().manual_seed(seed)
    N, K = shape
    return ((torch.randn(N, K, generator=g) * 0.1).to(BF), torch.randn(32, K, generator=g).to(BF),
            torch.randn(32, N, generator=g).to(BF))


def _run_mm(op, x, weight, dy):
    xp = x.clone().requires_grad_()
    y = op(xp, weight)
    y.backward(dy)
    return y.detach(), xp.grad


@pytest.mark.parametrize("shape", list(_W_SHAPES.values()), ids=list(_W_SHAPES))
@pytest.mark.parametrize("opname", list(_MM_OPS))
def test_mxfp8_wrapper_mm_is_x_wt(opname, shape):
    """torchao's contract for its MXFP8 wrapper (as for its FP8 one): torch.mm(x, W),
    torch.matmul(x, W) and x @ W are x W^T for an [N, K] weight. Patched: the bits of
    lowp.torch.linear(x, W) with MXQuantizeConfig(rceil), gradients included, and within
    NUMERICS 8 of x W^T in float64 and of torchao's own emulated path."""
    op = _MM_OPS[opname]
    w, x, dy = _mm_case(shape)
    ao_m = _wrapped(w, MXFP8TrainingOpConfig.from_recipe(R.MXFP8_EMULATED_RCEIL))
    ao = _run_mm(op, x, ao_m.weight, dy) + (ao_m.weight.grad,)
    lt.patch_torchao()
    m = _wrapped(w, MXFP8TrainingOpConfig.from_recipe(R.MXFP8_RCEIL))
    got = _run_mm(op, x, m.weight, dy) + (m.weight.grad,)
    assert got[0].shape == (32, shape[0])
    wr, xr = w.clone().requires_grad_(), x.clone().requires_grad_()
    ref = lt.linear(xr, wr, None, lt.MXQuantizeConfig(scale_mode="rceil"))
    ref.backward(dy)
    identical(got, (ref.detach(), xr.grad, wr.grad))
    x64, w64, dy64 = x.double(), w.double(), dy.double()
    exact = (x64 @ w64.t(), dy64 @ w64, dy64.t() @ x64)
    _check_sqnr(exact, got, ao, f"{opname} {shape}")


@pytest.mark.parametrize("shape", list(_W_SHAPES.values()), ids=list(_W_SHAPES))
@pytest.mark.parametrize("opname", list(_MM_OPS))
def test_fp8_wrapper_mm_is_x_wt(opname, shape):
    """The same contract for torchao's FP8 wrapper (rowwise recipe): patched, torch.mm /
    matmul / @ are lowp.torch.linear(x, W, "fp8_rowwise"), and agree with torchao's own."""
    from torchao.prototype.moe_training.config import Float8TrainingOpConfig
    op = _MM_OPS[opname]
    w, x, dy = _mm_case(shape, 6)
    ao = _run_mm(op, x, _wrapped(w, Float8TrainingOpConfig(float8_linear_recipe="rowwise"))
                 .weight, dy)
    lt.patch_torchao()
    got = _run_mm(op, x, _wrapped(w, Float8TrainingOpConfig(float8_linear_recipe="rowwise"))
                  .weight, dy)
    xr = x.clone().requires_grad_()
    ref = lt.linear(xr, w, None, "fp8_rowwise")
    ref.backward(dy)
    identical(got, (ref.detach(), xr.grad))
    exact = (x.double() @ w.double().t(), dy.double() @ w.double())
    for r, p, q, t in zip(exact, got, ao, (25.0, 24.0)):  # NUMERICS 8, FP8 rowwise
        assert sqnr(r, p) >= t and sqnr(r, q) >= t and sqnr(q, p) >= t


def test_mxfp8_wrapper_addmm():
    """torchao 0.18 asserts on torch.addmm(b, x, W) with its MXFP8 wrapper; patched it is
    b + torch.mm(x, W) = b + x W^T (beta = alpha = 1), the bits of lowp's linear plus b."""
    w, x, _ = _mm_case(_W_SHAPES["nonsquare"])
    b = torch.linspace(-1, 1, w.shape[0]).to(BF)
    with pytest.raises(AssertionError):
        torch.addmm(b, x, _wrapped(w, MXFP8TrainingOpConfig.from_recipe(
            R.MXFP8_EMULATED_RCEIL)).weight)
    lt.patch_torchao()
    m = _wrapped(w, MXFP8TrainingOpConfig.from_recipe(R.MXFP8_RCEIL))
    ref = lt.linear(x, w, None, lt.MXQuantizeConfig(scale_mode="rceil"))
    assert torch.equal(torch.addmm(b, x, m.weight), ref + b)
    assert torch.equal(torch.addmm(b, x, m.weight), torch.mm(x, m.weight) + b)


def test_settings_mapped():
    """FLOOR maps to lowp's FLOOR; out_dtype float32 keeps binary32; padding changes nothing."""
    from torchao.prototype.mx_formats.config import ScaleCalculationMode as SCM
    from torchao.quantization.quantize_.common import KernelPreference as KP
    lt.patch_torchao()
    x = D["x"].clone().requires_grad_()
    w = D["w"].clone().requires_grad_()
    y = TT._to_mxfp8_then_scaled_mm(x, w, KP.EMULATED, SCM.FLOOR)
    yl = lt.linear(D["x"], D["w"], None, lt.MXQuantizeConfig(scale_mode="floor"))
    assert torch.equal(y, yl)
    wt = D["we"].transpose(-2, -1)
    y32 = MOE._to_mxfp8_then_scaled_grouped_mm(D["xe"], wt, OFFS_RAGGED, out_dtype=torch.float32)
    ref = lt.grouped_mm(D["xe"].float(), wt, OFFS_RAGGED, "mxfp8")
    assert y32.dtype == torch.float32 and torch.equal(y32, ref)
    yp = MOE._to_mxfp8_then_scaled_grouped_mm(D["xe"], wt, OFFS_RAGGED,
                                              pad_token_groups_for_grouped_mm=True)
    assert torch.equal(yp, ref.to(BF))


# ---- recomputation: checkpointing reuses the weight copies ----


class Block(nn.Module):
    def __init__(self, lin):
        super().__init__()
        self.lin = lin

    def forward(self, x):
        return torch.nn.functional.gelu(self.lin(x))


@pytest.mark.parametrize("selective", [False, True], ids=["full", "selective"])
def test_checkpoint_reuses_weight_cache(selective):
    lt.patch_torchao()
    plain = Block(torchao_linear(R.MXFP8_RCEIL))
    x0 = D["x"].clone().requires_grad_()
    y0 = plain(x0)
    y0.backward(D["dy"])
    c0 = LP.weight_cache(plain.lin.weight)
    # forward makes; the dgrad reads its own forward's copies (autograd ctx), not the cache
    assert (c0.quantizations, c0.hits) == (1, 0)

    blk = Block(torchao_linear(R.MXFP8_RCEIL))
    kw = {}
    if selective:
        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

        def policy(ctx, op, *args, **kwargs):
            save = op is torch.ops.lowp.scaled_mm.default
            return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

        kw["context_fn"] = lambda: create_selective_checkpoint_contexts(policy)
    x = D["x"].clone().requires_grad_()
    y = checkpoint(blk, x, use_reentrant=False, **kw)
    c = LP.weight_cache(blk.lin.weight)
    assert (c.quantizations, c.hits) == (1, 0)
    y.backward(D["dy"])
    # the recomputed forward reuses the one copy: quantized once, recorded once
    assert (c.quantizations, c.hits) == (1, 1)
    identical((y.detach(), x.grad, blk.lin.weight.grad), (y0.detach(), x0.grad,
                                                           plain.lin.weight.grad))
    # an optimizer step changes the weight in place: a new copy next time
    torch.optim.SGD(blk.parameters(), lr=0.1).step()
    checkpoint(blk, x, use_reentrant=False, **kw).backward(D["dy"])
    assert (c.quantizations, c.hits) == (2, 2)


def test_checkpoint_experts_reuses_weight_cache():
    lt.patch_torchao()
    m = torchao_experts(R.MXFP8_RCEIL)
    x = D["xe"].clone().requires_grad_()
    y = checkpoint(m, x, OFFS_RAGGED, use_reentrant=False)
    y.backward(D["dye"])
    c = LP.weight_cache(m.w)
    assert (c.quantizations, c.hits) == (1, 1)  # the recomputed forward's reuse
    identical((y.detach(), x.grad, m.w.grad), lowp_experts(R.MXFP8_RCEIL, OFFS_RAGGED))
    torch.optim.SGD(m.parameters(), lr=0.5).step()
    y2 = m(D["xe"], OFFS_RAGGED)
    w_now = m.w._data.detach().clone()
    assert not torch.equal(w_now, D["we"]) and c.quantizations == 2
    assert torch.equal(y2, lt.grouped_mm(D["xe"], w_now.transpose(-2, -1), OFFS_RAGGED, "mxfp8"))


def test_optimizer_step_invalidates_weight_copies():
    """An in-place update of torchao's wrapper bumps the wrapper's version, not its _data's:
    the patched ops still see it and requantize (a stale copy would give the old output)."""
    lt.patch_torchao()
    m = torchao_linear(R.MXFP8_RCEIL)
    run_linear(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    opt.step()
    assert m.weight._data._version == 0  # torchao's wrapper: the inner counter stays put
    y = m(D["x"])
    w_now = m.weight._data.detach().clone()
    assert not torch.equal(w_now, D["w"])
    assert torch.equal(y, lt.linear(D["x"], w_now, None, "mxfp8"))
    assert LP.weight_cache(m.weight).quantizations == 2


# ---- Float8TrainingOpConfig: its linears (FP8_ROWWISE recipe) ----


def torchao_fp8_linear(recipe_name):
    from torchao.prototype.moe_training.config import Float8TrainingOpConfig
    m = nn.Linear(64, 96, bias=True).to(BF)
    with torch.no_grad():
        m.weight.copy_(D["w"])
        m.bias.copy_(torch.linspace(-1, 1, 96))
    quantize_(m, Float8TrainingOpConfig(float8_linear_recipe=recipe_name))
    assert isinstance(m.weight, TT.Float8TrainingWeightWrapperTensor)
    return m


@pytest.mark.parametrize("name,preset", [("rowwise", "fp8_rowwise"),
                                         ("tensorwise", "fp8_tensorwise")])
def test_fp8_linear_patched(name, preset):
    ao = run_linear(torchao_fp8_linear(name))  # torchao's own float8 linear runs on the CPU
    lt.patch_torchao()
    lt.reset_stats()
    lp = run_linear(torchao_fp8_linear(name))
    assert lt.stats()["native"] > 0
    x = D["x"].clone().requires_grad_()
    w = D["w"].clone().requires_grad_()
    y = lt.linear(x, w, None, preset) + torch.linspace(-1, 1, 96).to(BF)
    y.backward(D["dy"])
    identical(lp, (y.detach(), x.grad, w.grad))
    for p, q in zip(lp, ao):  # same scales and elements; only the accumulation order may differ
        assert sqnr(q, p) > 40
    if name == "rowwise":  # NUMERICS 8, FP8 rowwise
        ref = ref_linear()
        ref = (ref[0] + torch.linspace(-1, 1, 96).to(BF).double(),) + ref[1:]
        for r, p, q, t in zip(ref, lp, ao, (25.0, 24.0, 23.0)):
            assert sqnr(r, p) >= t and sqnr(r, q) >= t and sqnr(q, p) >= t


# columns 2^-20..1: under one tensorwise scale the smallest fall below E4M3's subnormals
# (power-of-two per-column scales would keep them; otherwise the two round alike)
_SPREAD_W = (D["w"].float() * torch.logspace(-20, 0, 64, base=2)).to(BF)


@pytest.mark.parametrize("w", [D["w"], _SPREAD_W], ids=["plain", "spread"])
def test_fp8_linear_rowwise_with_gw_hp(w):
    """torchao's rowwise_with_gw_hp: out = X rowwise . W rowwise^T, dX = dY rowwise . W
    tensorwise, dW = dY^T X in high precision (E4M3, power-of-two scales). Patched: within
    accumulation order of torchao's own CPU path; out and dW the bits of lowp's fp8_rowwise
    with wgrad_hp; dX that of dY's rowwise and W's tensorwise copies (not lowp's per-column
    copy of W: the spread weight tells them apart)."""
    b = torch.linspace(-1, 1, 96).to(BF)

    def module():
        m = torchao_fp8_linear("rowwise_with_gw_hp")
        with torch.no_grad():
            m.weight.copy_(w)
        return m

    ao = run_linear(module())  # torchao's own float8 linear runs on the CPU
    lt.patch_torchao()
    lp = run_linear(module())
    x2, w2 = D["x"].clone().requires_grad_(), w.clone().requires_grad_()
    y2 = lt.linear(x2, w2, None, "fp8_rowwise", wgrad_hp=True) + b
    y2.backward(D["dy"])
    assert torch.equal(lp[0], y2.detach()) and torch.equal(lp[2], w2.grad)
    assert torch.equal(lp[1], x2.grad) == torch.equal(w, D["w"])  # per-column W = tensorwise?
    dy2 = D["dy"].reshape(-1, 96)
    gd, gs, _, _ = torch.ops.lowp.quantize(dy2, "e4m3", "row", "", 1, 0.0, "row", None, None)
    td, ts, _, _ = torch.ops.lowp.quantize(w.t().contiguous(), "e4m3", "tensor", "", 1, 0.0,
                                           "row", None, None)
    deq = torch.ops.lowp.dequantize
    dx = deq(gd, gs, "e4m3", "row", dy2.shape[0], 96, None).double() @ \
        deq(td, ts, "e4m3", "tensor", 64, 96, None).double().t()
    assert sqnr(dx, lp[1].reshape(-1, 64)) > 45  # the bf16 rounding of the output only
    x64, w64, d64 = D["x"].double().reshape(-1, 64), w.double(), dy2.double()
    ref = ((x64 @ w64.t()).reshape(2, 48, 96) + b.double(), (d64 @ w64).reshape(2, 48, 64),
           d64.t() @ x64)
    for r, p, q, t in zip(ref, lp, ao, (25.0, 24.0, 40.0)):  # NUMERICS 8, FP8 rowwise; hp dW
        assert sqnr(r, p) >= t and sqnr(r, q) >= t and sqnr(q, p) > 40
    with pytest.raises(ValueError, match="rowwise_with_gw_hp.*bfloat16"):
        TT._to_fp8_then_scaled_mm(D["x"].float(), D["w"].float(), module().weight.config)


# ---- pre-quantized MXTensor activations (torchao's wgrad_with_hp path) ----


def _mx_act(x, mode="rceil", block=32, elem=torch.float8_e4m3fn, swizzled=False):
    """An MXTensor (torchao's from_qdata_and_scales) over lowp's MXFP8 rowwise bytes of x."""
    from torchao.prototype.mx_formats.mx_tensor import MXTensor
    r, rs, _, _ = torch.ops.lowp.quantize(x, "e4m3", "mx32", mode, -1, 0.0, "row", None, None)
    if block != 32:
        rs = rs.repeat_interleave(32 // block, dim=1)
    return MXTensor.from_qdata_and_scales(r.view(elem), rs.view(torch.float8_e8m0fnu), BF,
                                          block_size=block, is_swizzled_scales=swizzled)


def test_prequantized_mxtensor_grouped_mm():
    """A = MXTensor over lowp's bytes of X: forward and dX are the bits of lowp's grouped mm of
    X (MXFP8, wgrad_hp); dW is lowp's BF16 GEMM of dY^T and A dequantized (what torchao's
    high-precision weight gradient of such an input computes), the bits of lowp's grouped mm of
    dequant(A). Against float64 and torchao's own emulated forward of the same MXTensor."""
    from torchao.quantization.quantize_.common import KernelPreference as KP
    x, dy, offs = D["xe"], D["dye"], OFFS_RAGGED
    ao = MOE._to_mxfp8_then_scaled_grouped_mm(_mx_act(x), D["we"].transpose(-2, -1), offs,
                                              kernel_preference=KP.EMULATED, wgrad_with_hp=True)
    lt.patch_torchao()
    a = _mx_act(x).requires_grad_()
    w = D["we"].clone().requires_grad_()
    y = MOE._to_mxfp8_then_scaled_grouped_mm(a, w.transpose(-2, -1), offs, wgrad_with_hp=True)
    y.backward(dy)
    assert type(a.grad) is torch.Tensor and a.grad.dtype == BF
    lx, lw = x.clone().requires_grad_(), D["we"].clone().requires_grad_()
    ly = lt.grouped_mm(lx, lw.transpose(-2, -1), offs, "mxfp8", wgrad_hp=True)
    ly.backward(dy)
    identical((y.detach(), a.grad), (ly.detach(), lx.grad))
    xd = _mx_act(x).dequantize(torch.float32)
    dx, dw = xd.to(BF).requires_grad_(), D["we"].clone().requires_grad_()
    lt.grouped_mm(dx, dw.transpose(-2, -1), offs, "mxfp8", wgrad_hp=True).backward(dy)
    assert torch.equal(w.grad, dw.grad) and not torch.equal(w.grad, lw.grad)
    ref = ref_experts(offs)
    for r, p, t in zip(ref, (y, a.grad, w.grad), THRESH):
        assert sqnr(r, p) >= t
    assert sqnr(ao, y) > 40  # same bytes; binary32 sums in another order
    dwd = torch.zeros_like(ref[2])
    lo = 0
    for g, hi in enumerate(offs.tolist()):  # dY^T dequant(A) per group, float64
        dwd[g] = dy[lo:hi].double().t() @ xd[lo:hi].double()
        lo = hi
    assert sqnr(dwd, w.grad) > 40


def test_prequantized_mxtensor_refused():
    from torchao.prototype.mx_formats.mx_tensor import MXTensor
    lt.patch_torchao()
    x, wt = D["xe"], D["we"].transpose(-2, -1)
    gmm = MOE._to_mxfp8_then_scaled_grouped_mm
    with pytest.raises(ValueError, match="wgrad_with_hp.*MXFP8_RCEIL_WGRAD_WITH_HP"):
        gmm(_mx_act(x), wt, OFFS_RAGGED)
    with pytest.raises(ValueError, match="is_swizzled_scales.*is_swizzled_scales=False"):
        gmm(_mx_act(x, swizzled=True), wt, OFFS_RAGGED, wgrad_with_hp=True)
    with pytest.raises(ValueError, match="block_size \\(16\\).*high-precision"):
        gmm(_mx_act(x, block=16), wt, OFFS_RAGGED, wgrad_with_hp=True)
    r, rs, _, _ = torch.ops.lowp.quantize(x, "e5m2", "mx32", "rceil", -1, 0.0, "row", None, None)
    e5 = MXTensor.from_qdata_and_scales(r.view(torch.float8_e5m2),
                                        rs.view(torch.float8_e8m0fnu), BF)
    with pytest.raises(ValueError, match="elem_dtype.*float8_e4m3fn"):
        gmm(e5, wt, OFFS_RAGGED, wgrad_with_hp=True)
    with pytest.raises(ValueError, match="pre-quantized MXTensor.*high-precision"):
        TT._to_mxfp8_then_scaled_mm(_mx_act(D["x"][0]), D["w"], None, "rceil")
