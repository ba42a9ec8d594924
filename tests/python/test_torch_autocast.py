"""lowp's autocast rule (issue 12 point 9, python/lowp/torch/_autocast.py): under
torch.autocast the lowp ops return the dtype torch's own ops return (F.linear, torch.mm,
torch.matmul, torch.addmm, torch.bmm; the gradients in the inputs' dtypes), with one rounding of
the binary32 result, and only the autocast state of the tensor's own device type counts. The
lowp:: operators and the portable path stay exact under autocast."""

import pytest
import torch
import torch.nn.functional as F

import lowp.torch as lt
from lowp.torch import LowpWeight
from lowp.torch.trainer.model import RMSNorm as MoERMSNorm

AC_DTYPES = [torch.bfloat16, torch.float16]
CONFIGS = ["mxfp8", "block32x32", "fp8_rowwise", "bf16"]


def paths():
    """The native path (when built) and the portable path on the CPU."""
    import contextlib

    out = [("portable", lambda: lt.kernel_preference("portable"))]
    if lt.native_available():
        out.append(("native", contextlib.nullcontext))
    return out


def bits(t):
    return t.detach().contiguous().view(torch.uint8)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def torch_dtype(fn, ac):
    """The dtype torch's own op returns under CPU autocast with dtype ac."""
    with torch.autocast("cpu", dtype=ac):
        return fn().dtype


@pytest.mark.parametrize("ac", AC_DTYPES, ids=["bf16", "f16"])
@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("path", [p[0] for p in paths()])
def test_linear_mm_under_cpu_autocast_give_torchs_dtype_and_one_rounding(cfg, ac, path):
    ctx = dict(paths())[path]
    torch.manual_seed(0)
    x = torch.randn(2, 19, 64)
    w = torch.randn(40, 64)
    b = torch.randn(40)
    with ctx():
        ref = lt.linear(x, w, b, cfg)  # float32 outside autocast
        ref_nb = lt.linear(x, w, None, cfg)
        ref_mm = lt.mm(x[0], w.t(), cfg)
        with torch.autocast("cpu", dtype=ac):
            y = lt.linear(x, w, b, cfg)
            y_nb = lt.linear(x, w, None, cfg)
            y_mm = lt.mm(x[0], w.t(), cfg)
    assert ref.dtype == torch.float32
    assert y.dtype == torch_dtype(lambda: F.linear(x, w, b), ac) == ac
    assert y_mm.dtype == torch_dtype(lambda: torch.mm(x[0], w.t()), ac) == ac
    # the autocast dtype is one rounding of the binary32 result (bias added before it), and
    # the GEMM is the recipe's, not autocast's
    assert same(y, ref.to(ac))
    assert same(y_nb, ref_nb.to(ac))
    assert same(y_mm, ref_mm.to(ac))


@pytest.mark.parametrize("path", [p[0] for p in paths()])
def test_gradients_and_grouped_mm_under_cpu_autocast(path):
    ctx = dict(paths())[path]
    torch.manual_seed(1)
    x0, w0, b0 = torch.randn(33, 64), torch.randn(24, 64), torch.randn(24)
    x, w, b = (t.clone().requires_grad_() for t in (x0, w0, b0))
    xr, wr, br = (t.clone().requires_grad_() for t in (x0, w0, b0))
    with ctx():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = lt.linear(x, w, b, "mxfp8")
        yr = lt.linear(xr, wr, br, "mxfp8")
        g = torch.randn(33, 24)
        y.backward(g.bfloat16())
        yr.backward(g.bfloat16().float())
    # torch: F.linear under autocast gives the float32 leaves float32 gradients
    xt, wt, bt = (t.clone().requires_grad_() for t in (x0, w0, b0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yt = F.linear(xt, wt, bt)
    yt.backward(g.bfloat16())
    for got, ref, tt in ((x.grad, xr.grad, xt.grad), (w.grad, wr.grad, wt.grad),
                         (b.grad, br.grad, bt.grad)):
        assert got.dtype == tt.dtype == torch.float32
        assert same(got, ref)  # the backward runs as without autocast on the same dY
    # grouped mm: the same rule (the autocast dtype), one rounding of the float32 result
    W = torch.randn(3, 16, 64)
    offs = torch.tensor([10, 10, 30], dtype=torch.int32)
    with ctx():
        ref = lt.grouped_mm(x0, W.transpose(-2, -1), offs, "mxfp8")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = lt.grouped_mm(x0, W.transpose(-2, -1), offs, "mxfp8")
    assert same(got, ref.to(torch.bfloat16))


def test_float64_and_other_device_types_are_left_alone():
    x, w = torch.randn(8, 32), torch.randn(16, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # torch's autocast never casts float64, neither does lowp's rule
        assert lt.linear(x.double(), w.double()).dtype == F.linear(x.double(),
                                                                   w.double()).dtype
        assert lt.autocast_dtype("cpu", torch.float64) == torch.float64
        assert lt.RMSNorm(32)(x.double()).dtype == torch.float64
    # autocast on for another device type only (set directly: no such device is needed):
    # CPU tensors keep their dtype, as F.linear's do
    prev = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", torch.float16)
    try:
        assert F.linear(x, w).dtype == torch.float32
        assert lt.linear(x, w).dtype == torch.float32
        assert lt.RMSNorm(32)(x).dtype == torch.float32
        assert MoERMSNorm(32, 1e-5)(x).dtype == torch.float32
        assert lt.autocast_dtype("cpu", torch.float32) == torch.float32
        assert lt.autocast_dtype("cuda", torch.float32) == torch.float16
    finally:
        torch.set_autocast_enabled("cuda", prev[0])
        torch.set_autocast_dtype("cuda", prev[1])
    assert lt.autocast_dtype("meta", torch.float32) == torch.float32  # no autocast there


def test_lowp_operators_and_portable_gemm_are_exact_under_autocast():
    torch.manual_seed(2)
    a, b = torch.randn(37, 96), torch.randn(29, 96)
    q = lambda t: torch.ops.lowp.quantize(t, "e4m3", "mx32", "", -1, 0.0, "row", None, None)
    ad, asc, _, _ = q(a)
    bd, bsc, _, _ = q(b)
    none = torch.empty(0, dtype=torch.uint8)  # the scales of an unquantized operand

    def run():
        return (torch.ops.lowp.scaled_mm(ad, asc, "e4m3", "mx32", bd, bsc, "e4m3", "mx32", 96),
                torch.ops.lowp.scaled_mm(a.bfloat16(), none, "bf16", "none", b.bfloat16(), none,
                                         "bf16", "none", 96),
                torch.ops.lowp.dequantize(ad, asc, "e4m3", "mx32", 37, 96))

    for _, ctx in paths():
        with ctx():
            want = run()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                got = run()
        for g, w in zip(got, want):
            assert g.dtype == torch.float32 and same(g, w)


@pytest.mark.parametrize("kind", ["linear", "linear_bias", "matmul", "matmul_op", "mm_t",
                                  "mm_left", "addmm", "addmm_scaled", "bmm"])
def test_param_swap_routes_give_torchs_dtype_under_autocast(kind):
    torch.manual_seed(3)
    w0, b0 = torch.randn(48, 64), torch.randn(48)
    x = torch.randn(2, 40, 64) if kind in ("matmul", "matmul_op", "bmm") else torch.randn(40, 64)
    W3 = torch.randn(2, 48, 64)
    wrapped = (LowpWeight(w0.clone(), "mxfp8"), LowpWeight(W3.clone(), "mxfp8"))
    plain = (w0.clone(), W3.clone())

    def call(w, w3):
        return {
            "linear": lambda: F.linear(x, w),
            "linear_bias": lambda: F.linear(x, w, b0),
            "matmul": lambda: torch.matmul(x, w.t()),
            "matmul_op": lambda: x @ w.t(),
            "mm_t": lambda: torch.mm(x, w.t()),
            "mm_left": lambda: torch.mm(w, x.t()),
            "addmm": lambda: torch.addmm(b0, x, w.t()),
            "addmm_scaled": lambda: torch.addmm(b0, x, w.t(), beta=0.5, alpha=2.0),
            "bmm": lambda: torch.bmm(x, w3.transpose(-2, -1)),
        }[kind]()

    for ac in AC_DTYPES:
        with torch.autocast("cpu", dtype=ac):
            want = call(*plain)
            got = call(*wrapped)
        assert type(got) is torch.Tensor
        assert got.dtype == want.dtype == ac, (kind, ac)
        assert got.shape == want.shape
        out = call(*wrapped)  # outside autocast: float32 as before
        assert out.dtype == torch.float32
        if kind in ("addmm", "addmm_scaled", "linear_bias", "linear", "mm_t"):
            assert same(got, out.to(ac))  # one rounding of the float32 sum


@pytest.mark.parametrize("norm", ["lowp", "moe"])
def test_norms_follow_autocast(norm):
    n = lt.RMSNorm(32) if norm == "lowp" else MoERMSNorm(32, 1e-5)
    x = torch.randn(4, 32)
    ref = n(x)
    assert ref.dtype == torch.float32
    for ac in AC_DTYPES:
        with torch.autocast("cpu", dtype=ac):
            y = n(x)
        assert y.dtype == ac and same(y, ref.to(ac))
