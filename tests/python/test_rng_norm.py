"""RNGStatesTracker (issue 12 point 8), RMSNorm and the autocast rule (point 9), and the
no-CUDA-leak check: with every torch.cuda function made to raise, a CPU model with delayed
scaling saves and loads its state dict, forks the tracker and runs RMSNorm under CPU autocast."""

import contextlib
import inspect
import io

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lowp.torch as lt
from lowp.torch import RMSNorm, RNGStatesTracker
from lowp.torch.trainer.model import RMSNorm as MoERMSNorm


# ---- point 8 ----


def test_add_refuses_duplicates():
    t = RNGStatesTracker("cpu")
    t.add("tp", 123)
    with pytest.raises(ValueError, match="name"):
        t.add("tp", 7)
    with pytest.raises(ValueError, match="seed"):
        t.add("other", 123)
    with pytest.raises(TypeError, match="seed"):
        t.add("x", 1.5)
    with pytest.raises(ValueError, match="name"):
        with t.fork("missing"):
            pass


def test_fork_draws_from_the_named_state_and_restores_the_default():
    t = RNGStatesTracker(torch.device("cpu"))
    t.add("tp", 1234)
    x = torch.ones(1000)
    torch.manual_seed(5)
    with t.fork("tp"):
        a = F.dropout(x, p=0.5)
    after = torch.rand(8)
    # the named state is a torch.Generator seeded with the seed: the same mask
    g = torch.Generator(device="cpu").manual_seed(1234)
    saved = torch.get_rng_state()
    torch.set_rng_state(g.get_state())
    ref = F.dropout(x, p=0.5)
    torch.set_rng_state(saved)
    assert torch.equal(a, ref)
    # the default sequence is as if the fork had not happened
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(8))
    # a second fork continues the named stream
    with t.fork("tp"):
        b = F.dropout(x, p=0.5)
    assert not torch.equal(a, b)


def test_get_set_states_replay_for_recomputation():
    t = RNGStatesTracker("cpu")
    t.add("tp", 99)
    x = torch.ones(256)
    st = t.get_states()
    with t.fork("tp"):
        a = F.dropout(x, 0.3)
    t.set_states(st)
    with t.fork("tp"):
        b = F.dropout(x, 0.3)
    assert torch.equal(a, b)
    with pytest.raises(TypeError, match="states"):
        t.set_states([1])


def test_tracker_uses_the_device_module_for_other_devices(monkeypatch):
    """A tracker for another device type swaps that device's default state through its own
    module (here a fake torch.xpu), never torch.cuda."""
    store = {}

    def get_rng_state(device=None):
        return store.get("s", torch.zeros(16, dtype=torch.uint8)).clone()

    def set_rng_state(state, device=None):
        store["s"] = state.clone()

    monkeypatch.setattr(torch.xpu, "get_rng_state", get_rng_state)
    monkeypatch.setattr(torch.xpu, "set_rng_state", set_rng_state)
    monkeypatch.setattr(torch.cuda, "get_rng_state", _boom)
    monkeypatch.setattr(torch.cuda, "set_rng_state", _boom)
    t = RNGStatesTracker.__new__(RNGStatesTracker)
    t.device = torch.device("xpu", 0)
    t.reset()
    t._states["tp"] = torch.full((16,), 7, dtype=torch.uint8)
    with t.fork("tp"):
        assert torch.equal(store["s"], torch.full((16,), 7, dtype=torch.uint8))
        store["s"] = torch.full((16,), 9, dtype=torch.uint8)  # "draws" advance the state
    assert torch.equal(t._states["tp"], torch.full((16,), 9, dtype=torch.uint8))
    assert torch.equal(store["s"], torch.zeros(16, dtype=torch.uint8))


# ---- point 9 ----


def _ref_rms(x, w, eps):
    xd = x.double()
    return (xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * w.double())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_against_float64(dtype):
    torch.manual_seed(0)
    n = RMSNorm(48, eps=1e-5)
    with torch.no_grad():
        n.weight.uniform_(0.5, 1.5)
    x = (torch.randn(3, 5, 48) * 10).to(dtype)
    x[0, 0] = 0  # an all-zero row: 0, not NaN
    y = n(x)
    assert y.dtype == dtype
    ref = _ref_rms(x.float(), n.weight, 1e-5)
    tol = 1e-6 if dtype == torch.float32 else 8e-3
    assert torch.allclose(y.double(), ref, rtol=tol, atol=tol)
    assert torch.equal(y[0, 0].float(), torch.zeros(48))
    y.float().sum().backward()
    assert n.weight.grad is not None
    with pytest.raises(ValueError, match="dim"):
        n(torch.randn(2, 47))


def test_rmsnorm_follows_autocast_of_the_tensor_device():
    n = RMSNorm(32)
    x = torch.randn(4, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert n(x).dtype == torch.bfloat16
        assert lt.autocast_dtype("cpu", torch.float32) == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.float16):
        assert n(x).dtype == torch.float16
    assert n(x).dtype == torch.float32
    assert lt.autocast_dtype("cpu", torch.float32) == torch.float32


def test_no_hard_coded_cuda_in_h12_modules():
    """No "cuda" string and no torch.cuda attribute in the code (docstrings aside)."""
    import ast

    import importlib
    import pkgutil

    import lowp.torch

    names = [m.name for m in pkgutil.walk_packages(lowp.torch.__path__, "lowp.torch.")]
    # the torchao / torchtitan patches name CUDA-only code paths they replace; the CUDA
    # kernel adapters are CUDA's
    names = [n for n in names if not n.startswith(("lowp.torch.patches", "lowp.torch.interfaces",
                                                   "lowp.torch.adapters.cuda"))]
    assert "lowp.torch.ops.linear" in names and "lowp.torch.state" in names
    for mod in map(importlib.import_module, names):
        tree = ast.parse(inspect.getsource(mod))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value.strip().lower() not in ("cuda", "cuda:0"), mod.__name__
            if isinstance(node, ast.Attribute) and node.attr == "cuda":
                raise AssertionError("%s uses .cuda" % mod.__name__)


# ---- no torch.cuda for a CPU model ----


def _boom(*a, **k):
    raise AssertionError("torch.cuda was called")


def test_cpu_model_never_calls_torch_cuda(monkeypatch):
    # Train a little first (torch's own optimizer and manual_seed ask torch.cuda whether it is
    # there), then make every public torch.cuda function raise.
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 32), RMSNorm(32), nn.Linear(32, 32))
    m2 = nn.Sequential(nn.Linear(32, 32), RMSNorm(32), nn.Linear(32, 32))
    lt.apply_recipe(m, "fp8_delayed")
    lt.apply_recipe(m2, "fp8_delayed")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    for _ in range(2):
        m(torch.randn(8, 32)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    patched = 0
    for name in dir(torch.cuda):
        obj = getattr(torch.cuda, name)
        if not name.startswith("_") and (inspect.isfunction(obj) or inspect.isbuiltin(obj)):
            monkeypatch.setattr(torch.cuda, name, _boom)
            patched += 1
    assert patched > 50 and torch.cuda.synchronize is _boom
    tracker = RNGStatesTracker("cpu")
    tracker.add("tp", 17)
    x = torch.randn(8, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with tracker.fork("tp"):
            y = F.dropout(m(x), 0.1)  # the step's first forward: the delayed update runs
        assert m[1](x).dtype == torch.bfloat16
        # every lowp op outside a GEMM under CPU autocast: the ops (native and portable),
        # the param swap's routes, the MoE model's norm
        w, W3 = torch.randn(16, 32), torch.randn(2, 16, 32)
        offs = torch.tensor([3, 8], dtype=torch.int32)
        for ctx in (lambda: lt.kernel_preference("portable"), contextlib.nullcontext):
            with ctx():
                assert lt.linear(x, w, torch.randn(16)).dtype == torch.bfloat16
                assert lt.mm(x, w.t(), "block32x32").dtype == torch.bfloat16
                assert lt.grouped_mm(x, W3.transpose(-2, -1), offs).dtype == torch.bfloat16
        assert torch.addmm(torch.randn(32), x, m[2].weight.t()).dtype == torch.bfloat16
        assert MoERMSNorm(32, 1e-5)(x).dtype == torch.bfloat16
    y.float().pow(2).mean().backward()
    assert m[0]._lowp_fp8_state.updates == 2
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    m2.load_state_dict(torch.load(buf, weights_only=True))
    for i in (0, 2):
        a, b = m[i]._lowp_fp8_state, m2[i]._lowp_fp8_state
        assert torch.equal(a.scales, b.scales) and torch.equal(a.amax_history, b.amax_history)
    tracker.set_states(tracker.get_states())
