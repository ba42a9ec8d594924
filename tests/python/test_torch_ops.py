"""lowp.torch's operators and autograd ops: the native path (lowp's C kernels) against the
portable torch path byte for byte, SQNR of linear and grouped mm against float64 at
NUMERICS.md section 8's thresholds, equality with the C training layer, torch.compile, the
weight cache and fp8_state hooks, and bad input."""

import contextlib
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import lowp.torch as lt
from lowp.torch import portable as P

from test_torch_ops_portable import awkward

native = pytest.mark.skipif(not lt.native_available(), reason="lowp's C extension is not built")


def sqnr(ref, x):
    ref, x = ref.double(), x.double()
    return float(20 * torch.log10(ref.norm() / (ref - x).norm()))


def qop(x, fmt, kind, mode="", axis="both", offs=None, scale=None, pow2=-1, eps=0.0):
    return torch.ops.lowp.quantize(x, fmt, kind, mode, pow2, eps, axis, offs, scale)


# ---- native == portable, byte for byte ----

KINDS = [("e4m3", "tensor", ""), ("e5m2", "row", ""), ("e4m3", "block128", ""),
         ("e4m3", "block128x128", ""), ("e4m3", "block32x32", "floor"),
         ("e5m2", "block32x32", "even")]
KINDS += [(f, "mx32", m) for f in ("e4m3", "e5m2", "e2m1") for m in ("rceil", "floor", "ceil",
                                                                        "even")]


@native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("fmt,kind,mode", KINDS)
def test_quantize_native_equals_portable(fmt, kind, mode, dtype):
    for shape, seed in (((67, 150), 1), ((33, 31), 2), ((1, 1), 3), ((130, 257), 4),
                        ((64, 64), 5)):
        x = torch.from_numpy(awkward(*shape, seed)).to(dtype)
        for pow2 in ((-1, 0, 1) if kind in P.FP32_KINDS else (-1,)):
            lt.reset_stats()
            got = qop(x, fmt, kind, mode, pow2=pow2)
            assert lt.stats()["quantize.native"] == 1
            with lt.kernel_preference("portable"):
                want = qop(x, fmt, kind, mode, pow2=pow2)
            assert lt.stats()["quantize.portable"] == 1
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and g.shape == w.shape, (shape, kind)
                assert torch.equal(g.view(torch.uint8), w.view(torch.uint8)), (shape, kind)


@native
@pytest.mark.parametrize("fmt,kind", [("e4m3", "mx32"), ("e2m1", "mx32"), ("e5m2", "block128")])
def test_grouped_quantize_native_equals_portable(fmt, kind):
    x = torch.from_numpy(awkward(100, 45, 7))
    for offs in ([0, 37, 38, 38, 100], [5], [64, 64, 96], [0, 0], [1, 2, 3, 100]):
        o = torch.tensor(offs, dtype=torch.int32)
        got = qop(x, fmt, kind, axis="col", offs=o)
        with lt.kernel_preference("portable"):
            want = qop(x, fmt, kind, axis="col", offs=o)
        assert torch.equal(got[2], want[2]) and torch.equal(got[3].view(torch.uint8),
                                                            want[3].view(torch.uint8)), offs
        d1 = torch.ops.lowp.dequantize(got[2], got[3], fmt, kind, 45, 100, o)
        with lt.kernel_preference("portable"):
            d2 = torch.ops.lowp.dequantize(got[2], got[3], fmt, kind, 45, 100, o)
        assert torch.equal(d1.isnan(), d2.isnan()) and torch.equal(d1.nan_to_num(), d2.nan_to_num())


@native
def test_delayed_scale_native_equals_portable():
    x = torch.from_numpy(awkward(40, 70, 3))
    s = torch.tensor(0.0123, dtype=torch.float32)
    got = qop(x, "e5m2", "tensor", scale=s)
    with lt.kernel_preference("portable"):
        want = qop(x, "e5m2", "tensor", scale=s)
    for g, w in zip(got, want):
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8))


GEMM_PAIRS = [("e4m3", "mx32", "e4m3", "mx32"), ("e2m1", "mx32", "e2m1", "mx32"),
              ("e4m3", "mx32", "e4m3", "block32x32"), ("e4m3", "block128", "e4m3", "block128x128"),
              ("e4m3", "block128", "e4m3", "block128"), ("e5m2", "tensor", "e4m3", "tensor"),
              ("e4m3", "row", "e4m3", "row")]


@native
@pytest.mark.parametrize("fa,sa,fb,sb", GEMM_PAIRS)
def test_scaled_mm_native_vs_portable(fa, sa, fb, sb):
    g = torch.Generator().manual_seed(0)
    for M, N, K in ((37, 50, 300), (1, 1, 1), (64, 129, 256)):
        a = torch.randn(M, K, generator=g) * 3
        b = torch.randn(N, K, generator=g) * 1e-3
        if M > 1:
            a[1, K // 2] = float("nan")
        qa, qb = qop(a, fa, sa, axis="row"), qop(b, fb, sb, axis="row")
        args = (qa[0], qa[1], fa, sa, qb[0], qb[1], fb, sb, K)
        c1 = torch.ops.lowp.scaled_mm(*args)
        with lt.kernel_preference("portable"):
            c2 = torch.ops.lowp.scaled_mm(*args)
        assert torch.equal(c1.isnan(), c2.isnan())
        ok = ~c1.isnan()
        assert (c1[ok] - c2[ok]).norm() <= 1e-5 * c2[ok].norm() + 1e-30


KN_PAIRS = [("e4m3", "block128", "block128x128", ""), ("e4m3", "mx32", "block32x32", "floor"),
            ("e5m2", "tensor", "tensor", ""), ("bf16", "none", "none", "")]


def kn_operands(fa, sa, sb, mode, M, N, K, seed):
    """a [M, K] rowwise; b's input [K, N] quantized both ways: its rowwise copy (read as stored
    by b_kn) and its columnwise copy [N, K] (what lowp_gemm reads)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g) * 3
    b = torch.randn(K, N, generator=g) * torch.exp2(torch.randint(-6, 6, (K, 1), generator=g))
    if M > 1:
        a[1, K // 2] = float("nan")
        b[K // 3, N // 2] = float("inf")
    if sb == "none":
        e = torch.empty(0)
        return (a.bfloat16(), e, b.bfloat16(), e, b.t().contiguous().bfloat16(), e)
    qa = qop(a, fa, sa, "rceil" if sa == "mx32" else "", axis="row")
    qb = qop(b, "e4m3", sb, mode, axis="both")
    return qa[0], qa[1], qb[0], qb[1], qb[2], qb[3]


@native
@pytest.mark.parametrize("fa,sa,sb,mode", KN_PAIRS)
def test_scaled_mm_b_kn_is_the_columnwise_copy(fa, sa, sb, mode):
    """b_kn reads b's rowwise copy [K, N] as stored: the bits of scaled_mm on its columnwise
    copy, on the native and on the portable path, plain and grouped."""
    fb = "bf16" if sb == "none" else "e4m3"
    for M, N, K, seed in ((37, 50, 300, 0), (1, 1, 1, 1), (64, 129, 256, 2)):
        ad, as_, bd, bs, cd, cs = kn_operands(fa, sa, sb, mode, M, N, K, seed)
        want = torch.ops.lowp.scaled_mm(ad, as_, fa, sa, cd, cs, fb, sb, K)
        got = torch.ops.lowp.scaled_mm(ad, as_, fa, sa, bd, bs, fb, sb, K, "f32", True)
        with lt.kernel_preference("portable"):
            port = torch.ops.lowp.scaled_mm(ad, as_, fa, sa, bd, bs, fb, sb, K, "f32", True)
            pwant = torch.ops.lowp.scaled_mm(ad, as_, fa, sa, cd, cs, fb, sb, K)
        assert got.shape == (M, N)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (M, N, K)
        assert torch.equal(port.view(torch.int32), pwant.view(torch.int32)), (M, N, K)
        # grouped: three experts (the same copy), one of them empty
        offs = torch.tensor([M // 2, M // 2, M], dtype=torch.int32)
        st = (lambda t: torch.stack([t] * 3)) if sb != "none" else (lambda t: t)
        gw = torch.ops.lowp.scaled_grouped_mm(ad, as_, fa, sa, torch.stack([cd] * 3), st(cs), fb,
                                              sb, offs, K, False)
        gg = torch.ops.lowp.scaled_grouped_mm(ad, as_, fa, sa, torch.stack([bd] * 3), st(bs), fb,
                                              sb, offs, K, False, "f32", True)
        assert torch.equal(gg.view(torch.int32), gw.view(torch.int32))
        with lt.kernel_preference("portable"):
            gp = torch.ops.lowp.scaled_grouped_mm(ad, as_, fa, sa, torch.stack([bd] * 3), st(bs),
                                                  fb, sb, offs, K, False, "f32", True)
        assert torch.equal(gp.isnan(), gg.isnan()) and torch.equal(gp.isinf(), gg.isinf())
        ok = gg.isfinite()
        assert (gp[ok] - gg[ok]).norm() <= 1e-5 * gg[ok].norm() + 1e-30


def test_scaled_mm_b_kn_refuses_one_axis_kinds():
    a = qop(torch.randn(8, 64), "e4m3", "mx32", axis="row")
    b = qop(torch.randn(64, 32), "e4m3", "mx32", axis="row")
    for ctx in (contextlib.nullcontext, lambda: lt.kernel_preference("portable")):
        with ctx():
            with pytest.raises(ValueError, match=r"b_scaling \(mx32\) runs along one axis"):
                torch.ops.lowp.scaled_mm(a[0], a[1], "e4m3", "mx32", b[0], b[1], "e4m3",
                                         "mx32", 64, "f32", True)


@pytest.mark.parametrize("config,one_copy", [("block128", True), ("block32x32", True),
                                             ("fp8_tensorwise", True), ("bf16", True),
                                             ("mxfp8", False), ("fp8_rowwise", False)])
def test_tile_scaled_weights_are_stored_once(config, one_copy):
    """The weight cache of a recipe whose dgrad reads the forward copy as stored holds that
    copy alone (the second, transposed one is not made); the one-axis kinds keep both."""
    x, w, b, dy = linear_case(40, 160, 136, torch.float32)
    cache = lt.WeightCache()
    run_linear(config, x, w, b, dy, cache=cache)
    (entry,) = cache._entries.values()
    wf, wd = entry[2]
    assert wf is not None and (wd is None) == one_copy


# ---- linear and grouped mm ----

PRESETS = ["mxfp8", "mxfp4", "block32x32", "block128", "fp8_rowwise", "fp8_tensorwise", "bf16"]
# NUMERICS.md section 8 (out, dX, dW), Gaussian dY
THRESHOLDS = {"mxfp8": (27, 25, 24), "fp8_rowwise": (25, 24, 23), "block128": (25, 28, 28),
              "block32x32": (17, 17, 17), "block32x32_fp4": (12, 12, 12)}


def config_of(name):
    if name == "block32x32_fp4":
        return lt.BlockQuantizeConfig(mxfp4_fake_quantize_config=lt.MXQuantizeConfig("fp4"))
    return name


def linear_case(M, K, N, dtype, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype).requires_grad_()
    b = torch.randn(N, generator=g).to(dtype).requires_grad_() if bias else None
    dy = torch.randn(M, N, generator=g).to(dtype)
    return x, w, b, dy


def run_linear(config, x, w, b, dy, **kw):
    for t in (x, w, b):
        if t is not None:
            t.grad = None
    y = lt.linear(x, w, b, config, **kw)
    y.backward(dy)
    return y.detach(), x.grad, w.grad, (b.grad if b is not None else None)


def ref_linear(x, w, b, dy):
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    br = b.detach().double().requires_grad_() if b is not None else None
    y = F.linear(xr, wr, br)
    y.backward(dy.double())
    return y.detach(), xr.grad, wr.grad, (br.grad if br is not None else None)


@pytest.mark.parametrize("path", ["native", "portable"])
@pytest.mark.parametrize("name", list(THRESHOLDS))
def test_linear_sqnr(name, path):
    if path == "native" and not lt.native_available():
        pytest.skip("no extension")
    x, w, b, dy = linear_case(256, 320, 192, torch.float32, seed=1)
    ctx = lt.kernel_preference("portable") if path == "portable" else torch.enable_grad()
    with ctx:
        got = run_linear(config_of(name), x, w, b, dy)
    ref = ref_linear(x, w, b, dy)
    t = THRESHOLDS[name]
    s = [sqnr(r, g) for r, g in zip(ref[:3], got[:3])]
    print(name, path, "SQNR out/dX/dW %.1f %.1f %.1f dB" % tuple(s))
    assert all(v >= th for v, th in zip(s, t)), (name, s)
    assert sqnr(ref[3], got[3]) > 100  # the bias gradient is a float64 sum


def grouped_case(offs, K, N, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = offs[-1] + 5
    x = torch.randn(T, K, generator=g).to(dtype).requires_grad_()
    wp = (torch.randn(len(offs), N, K, generator=g) / K ** 0.5).to(dtype).requires_grad_()
    dy = torch.randn(T, N, generator=g).to(dtype)
    return x, wp, dy, torch.tensor(offs, dtype=torch.int32)


def run_grouped(config, x, wp, dy, offs, **kw):
    x.grad = wp.grad = None
    y = lt.grouped_mm(x, wp.transpose(-2, -1), offs, config, **kw)
    y.backward(dy)
    return y.detach(), x.grad, wp.grad


def ref_grouped(x, wp, dy, offs):
    xr, wr = x.detach().double().requires_grad_(), wp.detach().double().requires_grad_()
    parts, start = [], 0
    for gi, end in enumerate(offs.tolist()):
        parts.append(xr[start:end] @ wr[gi].t())
        start = end
    parts.append(torch.zeros(x.shape[0] - start, wp.shape[1], dtype=torch.float64))
    y = torch.cat(parts)
    y.backward(dy.double())
    return y.detach(), xr.grad, wr.grad


OFFS = [0, 70, 71, 71, 200, 333]  # empty, one-token and uneven groups, 5 tokens past the end


@pytest.mark.parametrize("path", ["native", "portable"])
@pytest.mark.parametrize("name", list(THRESHOLDS))
def test_grouped_mm_sqnr(name, path):
    if path == "native" and not lt.native_available():
        pytest.skip("no extension")
    x, wp, dy, offs = grouped_case(OFFS, 256, 160, torch.float32, seed=2)
    with (lt.kernel_preference("portable") if path == "portable" else torch.enable_grad()):
        got = run_grouped(config_of(name), x, wp, dy, offs)
    ref = ref_grouped(x, wp, dy, offs)
    t = THRESHOLDS[name]
    T = OFFS[-1]
    s = [sqnr(ref[0][:T], got[0][:T]), sqnr(ref[1][:T], got[1][:T])]
    # every expert's weight gradient with many tokens (group 2 has one, 0 and 3 none)
    s.append(min(sqnr(ref[2][g], got[2][g]) for g in (1, 4, 5)))
    print(name, path, "grouped SQNR out/dX/dW %.1f %.1f %.1f dB" % tuple(s))
    assert all(v >= th for v, th in zip(s, t)), (name, s)
    assert (got[0][T:] == 0).all() and (got[1][T:] == 0).all()
    assert (got[2][0] == 0).all() and (got[2][3] == 0).all()
    # the one-token group's gradient: one outer product of two quantized vectors
    assert sqnr(ref[2][2], got[2][2]) > t[2]


def within_bound(a, c):
    """NUMERICS.md 6: within 1e-5 of ||C||. BF16 outputs are rounded once from binary32 sums
    that may be added in another order, so an element may also land on the neighbouring BF16
    number: one BF16 ulp of each element is allowed on top of the bound."""
    d = (a.float() - c.float()).abs()
    if a.dtype == torch.bfloat16:
        ulp = torch.ldexp((c != 0).float(), torch.frexp(c.float())[1] - 8)  # |c| in [2^(e-1), 2^e)
        d = (d - ulp).clamp(min=0)
    return d.norm() <= 1e-5 * c.float().norm() + 1e-30


@native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", PRESETS + ["block32x32_fp4"])
def test_native_equals_portable(name, dtype):
    x, w, b, dy = linear_case(100, 96, 72, dtype, seed=3)
    x.data[3, 4] = 0.0
    nat = run_linear(config_of(name), x, w, b, dy)
    with lt.kernel_preference("portable"):
        por = run_linear(config_of(name), x, w, b, dy)
    for a, c in zip(nat, por):
        assert a.dtype == c.dtype
        assert within_bound(a, c)
    xg, wp, dyg, offs = grouped_case([0, 30, 31, 90], 64, 48, dtype, seed=4)
    nat = run_grouped(config_of(name), xg, wp, dyg, offs)
    with lt.kernel_preference("portable"):
        por = run_grouped(config_of(name), xg, wp, dyg, offs)
    for a, c in zip(nat, por):
        assert within_bound(a, c)


C_PRESET = {"mxfp8": "mxfp8", "block32x32": "block_fp8", "block32x32_fp4": "block_fp8_fp4",
            "block128": "block128", "fp8_rowwise": "fp8_rowwise",
            "fp8_tensorwise": "fp8_current", "bf16": "bf16"}


@native
@pytest.mark.parametrize("opts", [{}, {"keep_quantized": False}, {"keep_quantized": True},
                                  {"wgrad_hp": True}], ids=["default", "requant", "keep", "hp"])
@pytest.mark.parametrize("name", list(C_PRESET))
def test_equals_c_training_layer(name, opts):
    from lowp import _testing
    if name == "bf16" and opts:
        pytest.skip("bf16 has no quantized operands")
    x, w, b, dy = linear_case(96, 160, 64, torch.float32, seed=5)
    got = run_linear(config_of(name), x, w, b, dy, **opts)
    want = _testing.train_linear(C_PRESET[name], x.detach(), w.detach(), dy, b.detach(),
                                 keep_quantized=opts.get("keep_quantized"),
                                 wgrad_hp=opts.get("wgrad_hp"))
    for a, c, what in zip(got, want, ("y", "dx", "dw", "dbias")):
        assert torch.equal(a, c), (name, what, float((a - c).abs().max()))
    xg, wp, dyg, offs = grouped_case([0, 50, 51, 120], 96, 64, torch.float32, seed=6)
    got = run_grouped(config_of(name), xg, wp, dyg, offs, **opts)
    want = _testing.train_linear(C_PRESET[name], xg.detach(), wp.detach(), dyg, offs=offs,
                                 keep_quantized=opts.get("keep_quantized"),
                                 wgrad_hp=opts.get("wgrad_hp"))
    for a, c, what in zip(got, want, ("y", "dx", "dw")):
        assert torch.equal(a, c), (name, "grouped", what, float((a - c).abs().max()))


def test_mm_is_linear_of_the_transpose():
    x, w, _, dy = linear_case(40, 64, 48, torch.float32, bias=False)
    wkn = w.detach().t().requires_grad_()  # a transposed view [K, N] of the [N, K] weight
    y = lt.mm(x, wkn, "mxfp8")
    y.backward(dy)
    y2, dx2, dw2, _ = run_linear("mxfp8", x.detach().requires_grad_(), w, None, dy)
    assert torch.equal(y, y2) and torch.equal(wkn.grad, dw2.t())


def test_bf16_inputs_give_bf16_grads():
    x, w, b, dy = linear_case(64, 64, 32, torch.bfloat16)
    y, dx, dw, db = run_linear("mxfp8", x, w, b, dy)
    assert y.dtype == dx.dtype == dw.dtype == db.dtype == torch.bfloat16


def test_keep_quantized_vs_requantize_differ_only_in_wgrad_for_rowwise():
    # fp8_rowwise requantizes X along tokens by default; keeping the forward's copy changes
    # nothing for a columnwise quantization of the same values: the two agree.
    x, w, b, dy = linear_case(64, 96, 32, torch.float32)
    a = run_linear("fp8_rowwise", x, w, b, dy, keep_quantized=True)
    c = run_linear("fp8_rowwise", x, w, b, dy, keep_quantized=False)
    assert all(torch.equal(u, v) for u, v in zip(a, c))
    h = run_linear("mxfp8", x, w, b, dy, wgrad_hp=True)
    q = run_linear("mxfp8", x, w, b, dy)
    assert torch.equal(h[0], q[0]) and torch.equal(h[1], q[1]) and not torch.equal(h[2], q[2])
    ref = ref_linear(x, w, b, dy)
    assert sqnr(ref[2], h[2]) > sqnr(ref[2], q[2])


@native
@pytest.mark.parametrize("config", ["mxfp8", "block32x32", "bf16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_native_ops_leave_storages_resizable(config, dtype):
    """The native path reads CPU tensors without Tensor.numpy() (which pins a storage's size):
    FSDP2 frees its all-gather buffers with untyped_storage().resize_(0) after the ops read
    them. Grouped too, with the split-K weight gradient."""
    x, w, b, dy = linear_case(64, 96, 40, dtype)
    lt.reset_stats()
    y, dx, dw, db = run_linear(config, x, w, b, dy, cache=lt.WeightCache())
    xg = torch.randn(40, 96, dtype=dtype, requires_grad=True)
    W3 = torch.randn(3, 24, 96, dtype=dtype, requires_grad=True)
    offs = torch.tensor([7, 7, 40], dtype=torch.int32)
    yg = lt.grouped_mm(xg, W3.transpose(-2, -1), offs, config)
    yg.backward(torch.randn_like(yg))
    assert lt.stats()["portable"] == 0 and lt.stats()["native"] > 0
    for t in (x, w, b, dy, y, dx, dw, db, xg, W3, offs, yg, xg.grad, W3.grad):
        t.untyped_storage().resize_(0)


def test_weight_cache_reuses_only_in_a_backward():
    """A forward always quantizes the weight afresh (each backward reads its own forward's
    copies from the autograd context); only a forward run again inside a backward (activation
    checkpointing) reuses the copies of the forward before it."""
    x, w, b, dy = linear_case(64, 64, 32, torch.float32)
    cache = lt.WeightCache()
    run_linear("mxfp8", x, w, b, dy, cache=cache)
    run_linear("mxfp8", x, w, b, dy, cache=cache)  # a second micro-batch
    assert cache.quantizations == 2 and cache.hits == 0
    xc = x.detach().clone().requires_grad_()
    y = torch.utils.checkpoint.checkpoint(lambda t: lt.linear(t, w, b, "mxfp8", cache=cache),
                                          xc, use_reentrant=False)
    y.backward(dy)
    assert cache.quantizations == 3 and cache.hits == 1  # the recomputation reused
    with torch.no_grad():
        w.add_(0.01)  # an optimizer step
    out = run_linear("mxfp8", x, w, b, dy, cache=cache)
    assert cache.quantizations == 4
    assert all(torch.equal(u, v) for u, v in zip(out, run_linear("mxfp8", x, w, b, dy)))


@pytest.mark.parametrize("how", ["data_copy", "numpy"])
def test_weight_cache_never_serves_a_weight_written_behind_its_version(how):
    """Writes that move no version counter (through `.data`, or numpy filling the weight's
    memory) between two forwards: the second forward sees the new values (issue 40's rule for
    caches; before, the cache served the first weight's copies)."""
    torch.manual_seed(3)
    buf = np.random.default_rng(0).standard_normal((48, 64)).astype(np.float32)
    w = torch.from_numpy(buf).requires_grad_() if how == "numpy" else torch.randn(48, 64,
                                                                                 requires_grad=True)
    x = torch.randn(16, 64)
    cache = lt.WeightCache()
    with torch.no_grad():
        lt.linear(x, w, None, "mxfp8", cache=cache)
        new = torch.randn(48, 64)
        if how == "numpy":
            buf[...] = new.numpy()
        else:
            w.data.copy_(new)
        got = lt.linear(x, w, None, "mxfp8", cache=cache)
    assert torch.equal(got, lt.linear(x, new, None, "mxfp8"))


@native
@pytest.mark.parametrize("grouped", [False, True], ids=["linear", "grouped"])
def test_shared_input_quantized_once(grouped):
    """Matmuls in a row on one input of an autograd graph (q, k, v; w1, w3: a norm's output)
    quantize it once; the results and gradients are those of separate inputs; an in-place
    change of the input, a new input (even at a reused address) or another recipe quantizes
    afresh."""
    torch.manual_seed(0)
    K, N = 64, 40
    offs = torch.tensor([9, 9, 50], dtype=torch.int32)
    ws = [torch.randn((3, N, K) if grouped else (N, K), requires_grad=True) for _ in range(3)]

    def mm(x, w, config="mxfp8"):
        if grouped:
            return lt.grouped_mm(x, w.transpose(-2, -1), offs, config)
        return lt.linear(x, w, None, config)

    def run(shared):
        x = torch.randn(50, K, generator=torch.Generator().manual_seed(1), requires_grad=True)
        xs = [x] * 3 if shared else [x.detach().clone().requires_grad_() for _ in range(3)]
        lt.reset_stats()
        h = x * 1.0  # an op's output: the memo's only kind of input
        ys = [mm(h if shared else xi * 1.0, w) for xi, w in zip(xs, ws)]
        n = lt.stats().get("quantize.native", 0)
        sum((y * (i + 1)).sum() for i, y in enumerate(ys)).backward()
        dx = sum(xi.grad for xi in xs) if not shared else x.grad
        grads = [w.grad.clone() for w in ws]
        for w in ws:
            w.grad = None
        return ys, dx, grads, n

    ys1, dx1, g1, n1 = run(True)
    ys2, dx2, g2, n2 = run(False)
    assert n1 == n2 - 2 * (2 if grouped else 1)  # weights: one quantization each; inputs
    assert all(torch.equal(a, b) for a, b in zip(ys1, ys2))
    assert torch.equal(dx1, dx2) and all(torch.equal(a, b) for a, b in zip(g1, g2))
    x = torch.randn(50, K, requires_grad=True) * 1.0
    y1 = mm(x, ws[0])
    with torch.no_grad():
        x.mul_(2)  # in place: a new version
    assert torch.equal(mm(x, ws[0]), mm(x.clone(), ws[0]))
    assert not torch.equal(mm(x, ws[0]), y1)
    assert torch.equal(mm(x, ws[1], "block32x32"), mm(x.clone(), ws[1], "block32x32"))
    for step in range(3):  # fresh inputs, possibly at a freed one's address, version 0
        xt = torch.randn(50, K, requires_grad=True) * 1.0
        assert torch.equal(mm(xt, ws[0]), mm(xt.clone(), ws[0])), step
        del xt


def test_weight_cache_never_hits_a_new_tensor_at_a_reused_address():
    x, w, b, dy = linear_case(64, 64, 32, torch.float32)
    cache = lt.WeightCache()
    for step in range(4):
        wt = (w.detach() * (1 + step)).requires_grad_()  # a fresh tensor, version 0, each time
        got = run_linear("mxfp8", x, wt, b, dy, cache=cache)
        want = run_linear("mxfp8", x, wt, b, dy)
        assert all(torch.equal(u, v) for u, v in zip(got, want)), step
        del wt, got
    assert cache.quantizations == 4 and len(cache) <= 1


def test_weight_cache_version_fn():
    x, w, b, dy = linear_case(64, 64, 32, torch.float32)
    master = w.detach().clone()
    op_w = master.clone().requires_grad_()  # the tensor the op sees: its own version counter
    for fn in (None, lambda: master._version):
        cache = lt.WeightCache(version_fn=fn)
        for step in range(3):
            op_w.data.copy_(master)  # `.data` writes do not move op_w._version
            got = run_linear("mxfp8", x, op_w, b, dy, cache=cache)
            # a forward outside a backward never reuses, whatever the version says
            assert torch.equal(got[0], run_linear("mxfp8", x, op_w, b, dy)[0]), step
            with torch.no_grad():
                master.mul_(1.5)
        assert cache.quantizations == 3 and cache.hits == 0
    calls = []
    cache = lt.WeightCache(version_fn=lambda: calls.append(1) or master._version)
    xc = x.detach().clone().requires_grad_()
    y = torch.utils.checkpoint.checkpoint(lambda t: lt.linear(t, op_w, b, "mxfp8", cache=cache),
                                          xc, use_reentrant=False)
    y.backward(dy)
    assert cache.hits == 1 and len(calls) == 2  # the recomputation compared version_fn's
    with pytest.raises(TypeError, match="version_fn"):
        lt.WeightCache(version_fn=3)


class _State:
    """A delayed-scaling state stand-in: fixed scales, recorded amaxes."""

    def __init__(self, scales):
        self.scales = scales
        self.records = []

    def scale(self, role):
        return torch.tensor(self.scales[role], dtype=torch.float32)

    def record(self, role, amax):
        self.records.append((role, float(amax)))


def test_fp8_state_delayed_scaling():
    cfg = lt.Float8TensorwiseConfig(delayed=True)
    x, w, b, dy = linear_case(64, 64, 32, torch.float32)
    st = _State({"input": 50.0, "weight": 300.0, "grad_output": 4000.0})
    y, dx, dw, _ = run_linear(cfg, x, w, b, dy, fp8_state=st)
    roles = [r for r, _ in st.records]
    assert sorted(roles) == ["grad_output", "input", "weight"]
    amax = dict(st.records)
    assert amax["input"] == float(x.detach().abs().max())
    assert amax["grad_output"] == float(dy.abs().max())
    # the forward GEMM used the given scales: compare with the portable quantization
    qx = P.quantize(x.detach(), "e4m3", "tensor", scale=torch.tensor(50.0))[0]
    qw = P.quantize(w.detach(), "e4m3", "tensor", scale=torch.tensor(300.0))[0]
    want = P.gemm(qx, qw) + b.detach()
    assert (y - want).norm() <= 1e-5 * want.norm()
    ref = ref_linear(x, w, b, dy)
    assert sqnr(ref[0], y) > 20


def test_fp8_state_needs_delayed_config():
    x, w, b, dy = linear_case(8, 32, 8, torch.float32)
    with pytest.raises(ValueError, match="fp8_state"):
        lt.linear(x, w, b, "fp8_tensorwise", fp8_state=_State({}))


def test_stats_and_kernel_preference():
    x, w, b, dy = linear_case(8, 32, 8, torch.float32)
    lt.reset_stats()
    with lt.kernel_preference("portable"):
        lt.linear(x, w, b, "mxfp8")
    s = lt.stats()
    assert s["portable"] > 0 and s["native"] == 0
    if lt.native_available():
        lt.reset_stats()
        lt.linear(x, w, b, "mxfp8")
        assert lt.stats()["native"] > 0 and lt.stats()["portable"] == 0


@pytest.mark.parametrize("backend", [
    "aot_eager",
    pytest.param("inductor", marks=pytest.mark.skipif(
        not os.environ.get("LOWP_TEST_INDUCTOR"),
        reason="inductor compiles C++ for about a minute here; set LOWP_TEST_INDUCTOR=1"))])
def test_torch_compile_matches_eager(backend):
    x, w, b, dy = linear_case(64, 96, 48, torch.float32, seed=9)

    def f(x, w, b):
        return lt.linear(x, w, b, "mxfp8").relu()

    eager = f(x, w, b)
    eager.backward(dy)
    ge = (x.grad.clone(), w.grad.clone(), b.grad.clone())
    x.grad = w.grad = b.grad = None
    cf = torch.compile(f, backend=backend, fullgraph=True)
    out = cf(x, w, b)
    out.backward(dy)
    assert torch.equal(out, eager)
    for a, c in zip((x.grad, w.grad, b.grad), ge):
        assert torch.equal(a, c)


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(70, 100)
        d, s, dc, sc = torch.ops.lowp.quantize(x, "e2m1", "mx32", "", -1, 0.0, "both", None, None)
        assert d.shape == (70, 50) and s.shape == (70, 4) and dc.shape == (100, 35)
        assert sc.shape == (100, 3)
        c = torch.ops.lowp.scaled_mm(d, s, "e2m1", "mx32", d, s, "e2m1", "mx32", 100)
        assert c.shape == (70, 70) and c.dtype == torch.float32


# ---- bad input, one case each ----

def test_bad_config_fields():
    with pytest.raises(ValueError, match="block_size"):
        lt.MXQuantizeConfig(block_size=16)
    with pytest.raises(ValueError, match="dtype"):
        lt.MXQuantizeConfig(dtype=torch.float16)
    with pytest.raises(ValueError, match="scale_mode"):
        lt.MXQuantizeConfig(scale_mode="nearest")
    with pytest.raises(TypeError, match="scale_mode"):
        lt.MXQuantizeConfig(scale_mode=3)
    with pytest.raises(TypeError, match="block_size"):
        lt.MXQuantizeConfig(block_size="32")
    with pytest.raises(ValueError, match="history_len"):
        lt.Float8TensorwiseConfig(history_len=0)
    with pytest.raises(ValueError, match="margin"):
        lt.Float8TensorwiseConfig(margin=float("nan"))
    with pytest.raises(ValueError, match="amax_compute_algo"):
        lt.Float8TensorwiseConfig(amax_compute_algo="mean")
    with pytest.raises(TypeError, match="delayed"):
        lt.Float8TensorwiseConfig(delayed=1)
    with pytest.raises(TypeError, match="mxfp4_fake_quantize_config"):
        lt.BlockQuantizeConfig(mxfp4_fake_quantize_config="fp4")
    with pytest.raises(ValueError, match="mxfp4_fake_quantize_config"):
        lt.BlockQuantizeConfig(mxfp4_fake_quantize_config=lt.MXQuantizeConfig())


def test_bad_preset_and_activation_config():
    with pytest.raises(ValueError, match="config"):
        lt.resolve_config("mxfp7")
    with pytest.raises(TypeError, match="config"):
        lt.resolve_config(42)
    with pytest.raises(ValueError, match="forward"):
        lt.resolve_config("block128", activation_config=lt.MXQuantizeConfig())
    spec = lt.resolve_config("block32x32", activation_config="mxfp8")
    assert spec.weight.scaling == "block32x32" and spec.input.scaling == "mx32"


def test_configs_are_torchao_configs():
    from torchao.quantization.qat import FakeQuantizeConfigBase
    for c in (lt.MXQuantizeConfig(), lt.BlockQuantizeConfig(), lt.Block128Config(),
              lt.Float8RowwiseConfig(), lt.Float8TensorwiseConfig()):
        assert isinstance(c, FakeQuantizeConfigBase)
    assert lt.MXQuantizeConfig() == lt.MXQuantizeConfig("e4m3")
    assert lt.resolve_config(lt.MXQuantizeConfig("fp4")).weight.format == "e2m1"


def test_bad_linear_arguments():
    x, w, b, _ = linear_case(8, 32, 16, torch.float32)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        lt.linear(np.zeros((8, 32)), w)
    with pytest.raises(TypeError, match="x.dtype"):
        lt.linear(x.detach().to(torch.int32), w)
    with pytest.raises(ValueError, match="w must have 2"):
        lt.linear(x, w[None])
    with pytest.raises(ValueError, match=r"x.shape\[-1\]"):
        lt.linear(x, w[:, :16])
    with pytest.raises(ValueError, match="bias.shape"):
        lt.linear(x, w, b[:3])
    with pytest.raises(TypeError, match="cache"):
        lt.linear(x, w, b, cache={})
    with pytest.raises(TypeError, match="keep_quantized"):
        lt.linear(x, w, b, keep_quantized=1)
    with pytest.raises(TypeError, match="fp8_state"):
        lt.linear(x, w, b, lt.Float8TensorwiseConfig(delayed=True), fp8_state=object())
    with pytest.raises(ValueError, match=r"x.shape\[1\]"):
        lt.mm(x, w)


def test_bad_grouped_arguments():
    x, wp, _, offs = grouped_case([0, 3, 9], 32, 16, torch.float32)
    w = wp.transpose(-2, -1)
    with pytest.raises(TypeError, match="offs.dtype"):
        lt.grouped_mm(x, w, offs.long())
    with pytest.raises(ValueError, match="offs.shape"):
        lt.grouped_mm(x, w, offs[:2])
    with pytest.raises(ValueError, match=r"offs\[1\]"):
        lt.grouped_mm(x, w, torch.tensor([5, 3, 9], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"offs\[2\]"):
        lt.grouped_mm(x, w, torch.tensor([0, 3, 99], dtype=torch.int32))
    with pytest.raises(TypeError, match="offs must be"):
        lt.grouped_mm(x, w, [0, 3, 9])
    with pytest.raises(ValueError, match="w must have 3"):
        lt.grouped_mm(x, w[0], offs)


def test_raw_memory_buffers():
    """lowp.torch hands contiguous CPU tensors to the extension as (address, nbytes); other
    layouts go through a numpy view of a contiguous copy. Both give the same bytes, and bad raw
    memory is refused with a TypeError naming the descriptor's field."""
    import lowp
    from lowp import _lowp as ext
    from lowp.torch.ops import native as O
    x = torch.randn(96, 64)
    xt = x.t()  # not contiguous
    assert isinstance(O._buf(x), tuple) and not isinstance(O._buf(xt), tuple)
    got = torch.ops.lowp.quantize(xt, "e4m3", "mx32", "", -1, 0.0, "both")
    want = torch.ops.lowp.quantize(xt.contiguous(), "e4m3", "mx32", "", -1, 0.0, "both")
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    row = lowp.quantize(xt.contiguous(), "e4m3", "mx32")  # the numpy API, as the oracle here
    assert torch.equal(got[0], row.data) and torch.equal(got[1], row.scale)
    for bad in ((0, 16), (x.data_ptr(), -1)):
        with pytest.raises(TypeError, match="QDesc: data as raw memory"):
            ext.QDesc("f32", "none", 4, 4, bad)
