"""torch.compile(fullgraph=True) of lowp.torch.grouped_mm and of torchao 0.18's MXFP8 grouped
mm under `patch_torchao()` (issue 41, point 2): forward and backward identical (torch.equal)
to eager, with a tail of rows past offs[-1], empty groups and all groups empty, on one
compiled graph. The backends are aot_eager (Dynamo plus AOTAutograd: what fullgraph needs,
seconds here) and inductor behind LOWP_TEST_INDUCTOR=1 (about a minute of C++ per graph)."""

import dataclasses
import os
import warnings

import pytest
import torch
import torch.nn as nn

import lowp.torch as lt

warnings.filterwarnings("ignore")

BF = torch.bfloat16
BACKENDS = ["aot_eager", pytest.param("inductor", marks=pytest.mark.skipif(
    not os.environ.get("LOWP_TEST_INDUCTOR"),
    reason="inductor compiles C++ for about a minute here; set LOWP_TEST_INDUCTOR=1"))]
# a tail (rows 56.. in no group), a full cover, all groups empty, an empty first group
OFFS = ([16, 40, 56], [16, 40, 64], [0, 0, 0], [0, 30, 30])


def _case():
    g = torch.Generator().manual_seed(41)
    x = torch.randn(64, 64, generator=g).to(BF)
    w = (torch.randn(3, 32, 64, generator=g) * 0.1).to(BF)  # [G, N, K]
    dy = torch.randn(64, 32, generator=g).to(BF)
    return x, w, dy


X, W, DY = _case()


def _run(fn, offs):
    x, w = X.clone().requires_grad_(), W.clone().requires_grad_()
    y = fn(x, w, torch.tensor(offs, dtype=torch.int32))
    y.backward(DY)
    return y.detach(), x.grad, w.grad


def _ref(offs):
    """x W_g^T per group in float64 (rows past the last group 0), and both gradients."""
    x, w, dy = X.double(), W.double(), DY.double()
    y, dx, dw = torch.zeros(64, 32, dtype=torch.float64), torch.zeros_like(x), torch.zeros_like(w)
    lo = 0
    for g, hi in enumerate(offs):
        y[lo:hi], dx[lo:hi], dw[g] = x[lo:hi] @ w[g].t(), dy[lo:hi] @ w[g], dy[lo:hi].t() @ x[lo:hi]
        lo = hi
    return y, dx, dw


def sqnr(ref, x):
    ref, x = ref.double(), x.double()
    return float(20 * torch.log10(ref.norm() / (ref - x).norm()))


def _same(a, b):
    for p, q in zip(a, b):
        assert p.dtype == q.dtype and p.shape == q.shape and torch.equal(p, q)


def _check(compiled, eager):
    for offs in OFFS:
        got, want = _run(compiled, offs), _run(eager, offs)
        _same(got, want)
        if offs[-1]:  # not a zero gradient: the compiled backward computes (20 dB: any recipe)
            for r, p in zip(_ref(offs), got):
                assert sqnr(r, p) > 20


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("config,wgrad_hp", [("mxfp8", False), ("mxfp8", True),
                                             ("fp8_rowwise", False), ("fp8_tensorwise", False),
                                             ("block128", False)])
def test_grouped_mm_fullgraph_equals_eager(backend, config, wgrad_hp):
    def f(x, w, offs):
        return lt.grouped_mm(x, w.transpose(-2, -1), offs, config, wgrad_hp=wgrad_hp)

    _check(torch.compile(f, fullgraph=True, backend=backend), f)


torchao = pytest.importorskip("torchao")


@pytest.fixture
def patched():
    lt.unpatch_torchao()
    lt.patch_torchao()
    yield
    lt.unpatch_torchao()


@pytest.mark.parametrize("wgrad_with_hp", [False, True])
def test_patched_torchao_grouped_mm_fullgraph(patched, wgrad_with_hp):
    """torchao's own test compiles `_to_mxfp8_then_scaled_grouped_mm` with fullgraph=True;
    patched, that is lowp's grouped mm, and equals lowp.torch.grouped_mm in eager mode."""
    from torchao.prototype import moe_training as MOE
    fn = MOE._to_mxfp8_then_scaled_grouped_mm

    def f(x, w, offs):
        return fn(x, w.transpose(-2, -1), offs, wgrad_with_hp=wgrad_with_hp)

    def lowp_eager(x, w, offs):
        return lt.grouped_mm(x, w.transpose(-2, -1), offs, lt.MXQuantizeConfig(),
                             wgrad_hp=wgrad_with_hp)

    _check(torch.compile(f, fullgraph=True, backend="aot_eager"), lowp_eager)


def test_patched_torchao_experts_module_fullgraph(patched):
    """A module whose expert weight torchao's quantize_ wrapped: torch._grouped_mm on the
    wrapper compiles into one graph too."""
    from torchao.prototype.moe_training.config import (MXFP8TrainingOpConfig,
                                                       MXFP8TrainingRecipe as R)
    from torchao.quantization import quantize_

    class Experts(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(W.clone())

        def forward(self, x, offs):
            return torch._grouped_mm(x, self.w.transpose(-2, -1), offs=offs)

    def module():
        m = Experts()
        quantize_(m, MXFP8TrainingOpConfig.from_recipe(R.MXFP8_RCEIL),
                  filter_fn=lambda mod, fqn: isinstance(mod, Experts))
        return m

    def run(m, offs):
        x = X.clone().requires_grad_()
        y = m(x, torch.tensor(offs, dtype=torch.int32))
        y.backward(DY)
        return y.detach(), x.grad, m.w.grad

    m = module()
    cm = torch.compile(m, fullgraph=True, backend="aot_eager")
    for offs in OFFS[:2]:
        m.w.grad = None
        got = run(cm, offs)
        lw = lt.grouped_mm(X, W.transpose(-2, -1), torch.tensor(offs, dtype=torch.int32),
                           "mxfp8")
        assert torch.equal(got[0], lw)
        _same(got, run(module(), offs))


@pytest.mark.parametrize("config", ["mxfp8", "fp8_rowwise", "block128"])
def test_portable_grouped_mm_fullgraph_equals_eager(config):
    """Issue 35.1: the portable grouped GEMMs (every group in one torch._grouped_mm) under
    torch.compile(fullgraph=True) equal eager, forward and backward, tail and empty groups."""
    cfg = dataclasses.replace(lt.resolve_config(config),
                              kernel_preference=lt.KernelPreference.PORTABLE)

    def f(x, w, offs):
        return lt.grouped_mm(x, w.transpose(-2, -1), offs, cfg)

    before = lt.stats()["portable"]
    _check(torch.compile(f, fullgraph=True, backend="aot_eager"), f)
    assert lt.stats()["portable"] > before
