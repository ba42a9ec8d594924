"""lowp.torch and the numpy API against careless input (issue 40, points 5-8 and 10): no stale
quantized input, `.data =` on a prepared weight, negative views, the custom ops and QTensor
checking their arguments against each other, and ValueErrors where KeyError, RuntimeError or
a huge allocation came first. Every reference here is computed apart from the path under test:
a fresh copy of the same values, the negated tensor materialized, F.linear's own autograd."""

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lowp
import lowp.torch as lt

native = pytest.mark.skipif(not lt.native_available(), reason="lowp's C extension is not built")

CONFIGS = ["mxfp8", "mxfp4", "block32x32", "block128", "fp8_rowwise", "fp8_tensorwise"]
OFFS = torch.tensor([5, 5, 24], dtype=torch.int32)


def _linear(x, w, cfg):
    return lt.linear(x, w, None, cfg)


def _mm(x, w, cfg):
    return lt.mm(x, w.t(), cfg)


def _grouped(x, w, cfg):
    w3 = torch.stack([w, 0.5 * w, -w])  # [G, N, K]
    return lt.grouped_mm(x, w3.transpose(-2, -1), OFFS, cfg)


OPS = {"linear": _linear, "mm": _mm, "grouped": _grouped}


def _prepared(w, cfg):
    """An nn.Linear holding w, prepared by the param swap (forward: lowp.torch.linear)."""
    pytest.importorskip("torchao")
    from torchao.quantization import quantize_
    m = nn.Linear(w.shape[1], w.shape[0], bias=False)
    with torch.no_grad():
        m.weight.copy_(w)
    quantize_(m, lt.ParamSwapConfig(weight_config=cfg))
    return m


# ---- 5: a buffer refilled without a version bump is quantized again ----

@native
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("op", list(OPS) + ["module"])
@pytest.mark.parametrize("cfg", CONFIGS)
def test_refilled_numpy_buffer_is_not_stale(cfg, op, grad):
    """A data pipeline's torch.from_numpy(buf), refilled by numpy between forwards (the tensor's
    version never moves): each forward gives what a fresh copy of the same values gives."""
    rng = np.random.default_rng(0)
    buf = rng.standard_normal((24, 64)).astype(np.float32)
    x = torch.from_numpy(buf)
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    run = _prepared(w, cfg) if op == "module" else (lambda t: OPS[op](t, w, cfg))
    with torch.set_grad_enabled(grad):
        first = run(x)
        for step in range(3):
            buf[:] = rng.standard_normal(buf.shape).astype(np.float32)
            got = run(x)
            want = run(x.clone())
            assert torch.equal(got, want), (step, (got - want).abs().max())
            assert not torch.equal(got, first)


@native
@pytest.mark.parametrize("op", list(OPS))
def test_write_through_data_is_not_stale(op):
    """x.data.copy_(...) bypasses x's version counter: the next forward on x quantizes x
    again, with and without autograd."""
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    x = torch.randn(24, 64, requires_grad=True)
    y0 = OPS[op](x, w, "mxfp8")
    x.data.copy_(torch.randn(24, 64))
    y1 = OPS[op](x, w, "mxfp8")
    assert torch.equal(y1, OPS[op](x.detach().clone().requires_grad_(), w, "mxfp8"))
    assert not torch.equal(y0, y1)
    with torch.no_grad():
        x.data.mul_(-1)
        assert torch.equal(OPS[op](x, w, "mxfp8"), OPS[op](x.clone(), w, "mxfp8"))


@native
@pytest.mark.parametrize("op", list(OPS))
def test_graph_tensor_written_under_no_grad_is_not_stale(op):
    """An activation made with autograd (it has a grad_fn), then evaluated under no_grad after
    a `.data` write: no graph vouches for its values there, so the memo is not used."""
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    h = torch.randn(24, 64, requires_grad=True) * 1.0  # an op's output: has a grad_fn
    with torch.no_grad():
        y0 = OPS[op](h, w, "mxfp8")
        h.data.copy_(torch.randn(24, 64))
        y1 = OPS[op](h, w, "mxfp8")
        assert torch.equal(y1, OPS[op](h.clone(), w, "mxfp8"))
        assert not torch.equal(y0, y1)


@native
@pytest.mark.parametrize("op", list(OPS))
def test_inference_mode_inputs(op):
    """Tensors made under inference_mode have no version counter (reading it raises): they
    are quantized at every call, with the results no_grad gives."""
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    x = torch.randn(24, 64)
    with torch.no_grad():
        want = OPS[op](x, w, "mxfp8")
    with torch.inference_mode():
        xi = x.clone()
        assert torch.equal(OPS[op](xi, w, "mxfp8"), want)
        xi.mul_(2)
        assert torch.equal(OPS[op](xi, w, "mxfp8"), OPS[op](x * 2, w, "mxfp8"))


# ---- 6: `.data =` on a prepared weight ----

@native
def test_data_assignment_on_a_prepared_weight_is_honoured():
    """m.weight.data = t: the forward, the state dict and the optimizer all use t, as they do
    on a plain nn.Linear; vector_to_parameters too."""
    g = torch.Generator().manual_seed(0)
    w0, t = torch.randn(32, 64, generator=g), torch.randn(32, 64, generator=g)
    x = torch.randn(8, 64, generator=g)
    m = _prepared(w0, "mxfp8")
    m(x)  # the old master's copies are now cached
    m.weight.data = t
    assert torch.equal(m(x), lt.linear(x, t, None, "mxfp8"))
    assert torch.equal(m.state_dict()["weight"], t)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    t_before = t.clone()
    m(x).square().sum().backward()
    grad = m.weight.grad.clone()
    opt.step()
    assert torch.equal(t, t_before - 0.5 * grad)  # shared, as .data = shares on a plain tensor
    assert torch.equal(m(x), lt.linear(x, t, None, "mxfp8"))
    v = torch.randn(32 * 64, generator=g)
    nn.utils.vector_to_parameters(v, m.parameters())
    assert torch.equal(m.state_dict()["weight"], v.view(32, 64))
    assert torch.equal(m(x), lt.linear(x, v.view(32, 64), None, "mxfp8"))


@native
def test_data_assignment_that_cannot_be_honoured_names_the_parameter():
    m = _prepared(torch.randn(32, 64), "mxfp8")
    with pytest.raises(ValueError, match=r"^weight: .data = a tensor of shape \(16, 64\)"):
        m.weight.data = torch.randn(16, 64)
    with pytest.raises(ValueError, match=r"^weight: .*dtype torch.float64"):
        m.weight.data = torch.randn(32, 64, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"^weight: .data must be set to a torch.Tensor"):
        m.weight.data = np.zeros((32, 64), np.float32)


# ---- 7: negative views ----

@native
@pytest.mark.parametrize("op", list(OPS))
def test_negative_views_are_read_with_their_sign(op):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(24, 64, generator=g), torch.randn(32, 64, generator=g)
    want = OPS[op](-x, w, "mxfp8")
    assert torch.equal(OPS[op](torch._neg_view(x), w, "mxfp8"), want)
    assert torch.equal(OPS[op](x, torch._neg_view(w), "mxfp8"), OPS[op](x, -w, "mxfp8"))


@native
def test_negative_views_in_the_ops_and_the_numpy_api():
    x = torch.randn(16, 64)
    got = torch.ops.lowp.quantize(torch._neg_view(x), "e4m3", "mx32", "", -1, 0.0, "both")
    want = torch.ops.lowp.quantize(-x, "e4m3", "mx32", "", -1, 0.0, "both")
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    q = lowp.quantize(torch._neg_view(x), "e4m3", "row")
    assert torch.equal(lowp.dequantize(q), lowp.dequantize(lowp.quantize(-x, "e4m3", "row")))
    assert torch.equal(lowp.gemm(torch._neg_view(x), x), lowp.gemm(-x, x))
    with pytest.raises(ValueError, match="lowp.gemm: out is a negative or conjugate view"):
        lowp.gemm(x, x, out=torch._neg_view(torch.zeros(16, 16)))


# ---- 8: the ops check their arguments against each other (eager and fake alike) ----

def _q(x, fmt="e4m3", kind="mx32", axis="row"):
    return torch.ops.lowp.quantize(x, fmt, kind, "", -1, 0.0, axis, None, None)


def _bad_op_calls():
    a, b = _q(torch.randn(8, 64)), _q(torch.randn(16, 64))
    b3 = (torch.stack([b[0]] * 3), torch.stack([b[1]] * 3))
    mm, gmm, dq = (torch.ops.lowp.scaled_mm, torch.ops.lowp.scaled_grouped_mm,
                   torch.ops.lowp.dequantize)
    f = torch.randn(8, 64)
    return {
        "k smaller": (r"k \(32\) does not match a of shape \(8, 64\)",
                      lambda: mm(a[0], a[1], "e4m3", "mx32", b[0], b[1], "e4m3", "mx32", 32)),
        "k larger": (r"k \(128\) does not match a",
                     lambda: mm(a[0], a[1], "e4m3", "mx32", b[0], b[1], "e4m3", "mx32", 128)),
        "f32 as codes": (r"a holds e4m3 codes and must be torch.uint8, not torch.float32",
                         lambda: mm(f, a[1], "e4m3", "mx32", b[0], b[1], "e4m3", "mx32", 64)),
        "b rows": (r"b_scale .* does not match b",
                   lambda: mm(a[0], a[1], "e4m3", "mx32", b[0], a[1], "e4m3", "mx32", 64)),
        "fewer groups": (r"offs holds 2 groups but b \(b.shape\[0\]\) has 3",
                         lambda: gmm(a[0], a[1], "e4m3", "mx32", b3[0], b3[1], "e4m3", "mx32",
                                     torch.tensor([4, 8], dtype=torch.int32), 64, False)),
        "dequantize rows": (r"data has shape \(8, 64\), but \[rows, cols\] = \[4, 64\]",
                            lambda: dq(a[0], a[1], "e4m3", "mx32", 4, 64, None)),
        "dequantize f32": (r"data holds e4m3 codes and must be torch.uint8",
                           lambda: dq(f, a[1], "e4m3", "mx32", 8, 64, None)),
        "out_dtype": (r"out_dtype \('f16'\) is not one of f32, bf16",
                      lambda: mm(a[0], a[1], "e4m3", "mx32", b[0], b[1], "e4m3", "mx32", 64,
                                 "f16")),
        "axis": (r"axis \('diag'\) is not one of row, col, both",
                 lambda: _q(f, axis="diag")),
        "4-D x": (r"x must be 2-D \(or 3-D, stacked matrices, without offs\), got shape "
                  r"\(1, 1, 8, 64\)", lambda: _q(f[None, None])),
        "3-D x, offs": (r"x must be 2-D \(or 3-D, stacked matrices, without offs\), got shape "
                        r"\(1, 8, 64\)",
                        lambda: torch.ops.lowp.quantize(f[None], "e4m3", "mx32", "", -1, 0.0,
                                                        "col", torch.tensor([4, 8],
                                                                            dtype=torch.int32))),
        "offs, tensor": (r"offs \(grouped copies\) needs scaling mx32 or block128 or nv16, not "
                         r"tensor",
                         lambda: torch.ops.lowp.quantize(f, "e4m3", "tensor", "", -1, 0.0, "col",
                                                         torch.tensor([4, 8], dtype=torch.int32),
                                                         None)),
        "eps": (r"eps \(-1.0\) must be finite and >= 0",
                lambda: torch.ops.lowp.quantize(f, "e4m3", "row", "", -1, -1.0, "row")),
    }


@native
@pytest.mark.parametrize("case", list(_bad_op_calls()))
def test_ops_refuse_mismatched_arguments(case):
    match, call = _bad_op_calls()[case]
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("case", list(_bad_op_calls()))
def test_fake_kernels_refuse_what_the_ops_refuse(case):
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        match, call = _bad_op_calls()[case]
        with pytest.raises(ValueError, match=match):
            call()


def test_portable_ops_refuse_bad_values():
    """The portable path (every non-CPU device) has no C library behind it to check values."""
    with lt.kernel_preference("portable"):
        with pytest.raises(ValueError, match=r"offs\[1\] \(99\) is not in \[4, 8\]"):
            torch.ops.lowp.quantize(torch.randn(8, 64), "e4m3", "mx32", "", -1, 0.0, "col",
                                    torch.tensor([4, 99], dtype=torch.int32), None)
        with pytest.raises(ValueError, match=r"scale \(-1.0\) must be finite and > 0"):
            torch.ops.lowp.quantize(torch.randn(8, 64), "e4m3", "tensor", "", -1, 0.0, "row",
                                    None, torch.tensor(-1.0))


def test_qtensor_checks_its_arrays():
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    q = lowp.quantize(x, "e4m3", "mx32", axis="both")
    with pytest.raises(ValueError, match=r"lowp.QTensor: data must be uint8, got float32"):
        lowp.QTensor(x, q.scale, "e4m3", "mx32", x.shape)
    with pytest.raises(ValueError, match=r"data has shape \(8, 64\), expected \(8, 32\)"):
        lowp.QTensor(q.data, q.scale, "e2m1", "mx32", x.shape)
    with pytest.raises(ValueError, match=r"scale must be uint8, got float32"):
        lowp.QTensor(q.data, q.scale.astype(np.float32), "e4m3", "mx32", x.shape)
    with pytest.raises(ValueError, match=r"data_col has shape \(64, 8\), expected \(32, 16\)"):
        lowp.QTensor(None, None, "e4m3", "mx32", (16, 32), data_col=q.data_col,
                     scale_col=q.scale_col)
    with pytest.raises(ValueError, match=r"data is given without scale"):
        lowp.QTensor(q.data, None, "e4m3", "mx32", x.shape)
    ok = lowp.QTensor(q.data, q.scale, "e4m3", "mx32", x.shape, data_col=q.data_col,
                      scale_col=q.scale_col)
    assert np.array_equal(lowp.dequantize(ok), lowp.dequantize(q))


def test_bad_names_are_refused_where_they_are_given():
    """A preset name that is no preset fails at ParamSwapConfig (on 1d86a9d: at prepare, as
    a bare 'config' error); a QTensor shape that is no tuple of ints names shape."""
    pytest.importorskip("torchao")
    with pytest.raises(ValueError, match=r"^weight_config \('nope'\) is not a preset"):
        lt.ParamSwapConfig(weight_config="nope")
    with pytest.raises(ValueError, match=r"^activation_config \('zz'\) is not a preset"):
        lt.ParamSwapConfig(weight_config="mxfp8", activation_config="zz")
    with pytest.raises(TypeError, match=r"lowp.QTensor: shape \('ab'\) must be a tuple"):
        lowp.QTensor(np.zeros((4, 32), np.uint8), np.zeros((4, 1), np.uint8), "e4m3", "mx32",
                     "ab")


# ---- 10: no products, and ValueError before any allocation ----

@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("cfg", ["mxfp8", "bf16"])
def test_zero_input_features_follow_f_linear(cfg, bias):
    x = torch.randn(3, 4, 0, requires_grad=True)
    w = torch.randn(5, 0, requires_grad=True)
    b = torch.randn(5, requires_grad=True) if bias else None
    dy = torch.randn(3, 4, 5)
    y = lt.linear(x, w, b, cfg)
    y.backward(dy)
    got = (y.detach(), x.grad, w.grad, None if b is None else b.grad)
    for t in (x, w, b):
        if t is not None:
            t.grad = None
    y2 = F.linear(x, w, b)
    y2.backward(dy)
    want = (y2.detach(), x.grad, w.grad, None if b is None else b.grad)
    for g, e in zip(got, want):
        assert (g is None) == (e is None)
        if g is not None:
            assert g.shape == e.shape and g.dtype == e.dtype and torch.equal(g, e)


def test_zero_products_in_mm_and_grouped_mm():
    x = torch.randn(6, 0)
    assert torch.equal(lt.mm(x, torch.randn(0, 3)), torch.zeros(6, 3))
    offs = torch.tensor([2, 6], dtype=torch.int32)
    assert torch.equal(lt.grouped_mm(x, torch.randn(2, 0, 3), offs), torch.zeros(6, 3))
    xk = torch.randn(6, 4, requires_grad=True)
    y = lt.grouped_mm(xk, torch.randn(0, 4, 3), torch.zeros(0, dtype=torch.int32))
    assert torch.equal(y, torch.zeros(6, 3))
    y.sum().backward()
    assert torch.equal(xk.grad, torch.zeros(6, 4))
    with pytest.raises(ValueError, match="config"):
        lt.linear(torch.randn(2, 0), torch.randn(3, 0), None, "mxfp7")


@native
def test_gemm_checks_k_before_allocating_the_output():
    """M x N here would be 4 TiB of float32: a mismatched K must be refused first."""
    M = N = 1 << 20
    a = np.zeros((M, 1), np.float32)
    b = np.zeros((N, 2), np.float32)
    with pytest.raises(ValueError, match=r"lowp.gemm: a.shape\[1\] \(1\) != b.shape\[1\] \(2\)"):
        lowp.gemm(a, b)
    with pytest.raises(ValueError, match=r"lowp.gemm_kn: a.shape\[1\] \(1\) != b.shape\[0\]"):
        lowp.gemm_kn(a, np.zeros((2, N), np.float32))
    with pytest.raises(ValueError, match=r"lowp.grouped_gemm: a.shape\[1\] \(1\) != b.shape\[2\]"):
        lowp.grouped_gemm(a, np.zeros((2, 1 << 19, 2), np.float32), [4, M])


@pytest.mark.parametrize("scaling,mode,pow2,what", [
    ("row", "floor", -1, "scale_mode"), ("tensor", "rceil", -1, "scale_mode"),
    ("block128", "even", -1, "scale_mode"), ("mx32", "", 1, "pow2"),
    ("block32x32", "", 0, "pow2"), ("row", "", 2, "pow2")])
def test_quantize_op_refuses_settings_its_scaling_ignores(scaling, mode, pow2, what):
    """lowp::quantize took scale_mode on the binary32 scalings and pow2 on the E8M0 ones and
    ignored them; the numpy API refuses both, and so does the op now."""
    x = torch.randn(64, 128)
    with pytest.raises(ValueError, match=what):
        torch.ops.lowp.quantize(x, "e4m3", scaling, mode, pow2, 0.0, "row", None, None)


def test_grouped_mm_offs_out_of_range_names_the_bound():
    x = torch.randn(10, 64)
    w = torch.randn(3, 64, 32)
    with pytest.raises(ValueError, match=r"offs\[2\] \(11\) is not in \[5, x.shape\[0\] \(10\)\]"):
        lt.grouped_mm(x, w, torch.tensor([2, 5, 11], dtype=torch.int32), "mxfp8")
