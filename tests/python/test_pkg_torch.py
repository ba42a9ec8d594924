"""torch CPU tensors through the numpy API: torch in, torch out, sharing memory; bfloat16
tensors; the thread default that follows torch; errors for tensors lowp cannot take."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lowp  # noqa: E402


def test_torch_in_torch_out_zero_copy():
    x = torch.randn(64, 96)
    q = lowp.quantize(x, "e4m3", "mx32", axis="both")
    for t in (q.data, q.scale, q.data_col, q.scale_col):
        assert isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.device.type == "cpu"
    qn = lowp.quantize(x.numpy(), "e4m3", "mx32", axis="both")
    assert np.array_equal(q.data.numpy(), qn.data) and np.array_equal(q.scale_col.numpy(),
                                                                      qn.scale_col)
    y = lowp.dequantize(q)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32
    # outputs are torch tensors the kernels wrote into; an out= tensor is written in place
    out = torch.zeros(64, 64)
    ptr = out.data_ptr()
    r = lowp.gemm(q, q, out=out)
    assert r is out and out.data_ptr() == ptr and out.abs().sum() > 0
    # the input itself is read in place (a view of the tensor's memory)
    c = lowp.cast(x, "e4m3")
    assert c.dtype == torch.uint8 and c.shape == x.shape


def test_bf16_tensors_and_requires_grad():
    x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
    q = lowp.quantize(x, "e4m3", "mx32")
    q32 = lowp.quantize(x.detach().float(), "e4m3", "mx32")
    assert torch.equal(q.data, q32.data) and torch.equal(q.scale, q32.scale)
    b = lowp.cast(x.detach().float(), "bf16")
    assert b.dtype == torch.uint16
    assert torch.equal(b.view(torch.int16), x.detach().view(torch.int16))
    c = lowp.gemm(x, x)
    ref = x.detach().double() @ x.detach().double().T
    assert c.dtype == torch.float32 and torch.allclose(c.double(), ref, rtol=1e-5, atol=1e-4)
    # bf16 output
    ob = torch.zeros(32, 32, dtype=torch.bfloat16)
    lowp.gemm(x, x, out=ob)
    assert torch.equal(ob, c.to(torch.bfloat16))


def test_decode_torch_float8_tensors():
    x = torch.randn(100) * 50
    f8 = x.to(torch.float8_e4m3fn)
    assert torch.equal(lowp.decode(f8, "e4m3"), f8.float())
    assert torch.equal(lowp.decode(f8.view(torch.uint8), torch.float8_e4m3fn), f8.float())
    assert torch.equal(lowp.cast(x, torch.float8_e5m2), x.to(torch.float8_e5m2).view(torch.uint8))


def test_qtensor_from_torch_tensors_and_grouped():
    sizes = [3, 0, 40, 21]
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    M, N, K = int(offs[-1]), 32, 64
    x, w, dy = torch.randn(M, K), torch.randn(4, N, K), torch.randn(M, N)
    qw = lowp.quantize(w, "e4m3", "mx32")
    # rebuild the weight's QTensor from its tensors, as a custom op would
    qw2 = lowp.QTensor(qw.data, qw.scale, "e4m3", "mx32", tuple(w.shape))
    c = lowp.grouped_gemm(lowp.quantize(x, "e4m3", "mx32"), qw2, offs)
    assert isinstance(c, torch.Tensor) and c.shape == (M, N)
    qx = lowp.quantize(x, "e4m3", "mx32", axis="both", offs=offs)
    qdy = lowp.quantize(dy, "e4m3", "mx32", axis="col", offs=offs)
    assert isinstance(qx.offs, torch.Tensor)
    dw = lowp.grouped_gemm(qdy, qx, offs)
    assert isinstance(dw, torch.Tensor) and dw.shape == (4, N, K)
    assert torch.all(dw[1] == 0)


def test_tensors_stay_resizable():
    """Inputs are read through their memory, not Tensor.numpy(), which would make a storage
    non-resizable (FSDP2 frees its all-gather buffers with untyped_storage().resize_(0));
    outputs are allocated by torch. Zero-copy both ways."""
    from lowp import _arrays

    x, w = torch.randn(64, 96), torch.randn(40, 96)
    xb = torch.randn(64, 96).bfloat16()
    offs = torch.tensor([10, 10, 64], dtype=torch.int32)
    w3 = torch.randn(3, 40, 96)
    f8 = torch.randn(33).to(torch.float8_e4m3fn)
    out = torch.zeros(64, 40)
    for t in (x, xb, offs, f8, x[3]):
        a = _arrays.to_numpy(t, "test", "t")[0]
        assert a.ctypes.data == t.data_ptr() and a.nbytes == t.numel() * t.element_size()
    qx = lowp.quantize(x, "e4m3", "mx32", axis="both")
    qw = lowp.quantize(w, "e4m3", "mx32")
    qb = lowp.quantize(xb, "e5m2", "block128", axis="col")
    q3 = lowp.quantize(w3, "e4m3", "mx32")
    qg = lowp.quantize(x, "e4m3", "mx32", axis="col", offs=offs)
    qs = lowp.quantize(x, "e4m3", "mx32", layout="cublas")
    ref = lowp.gemm(qx, qw)
    outs = [qx.data, qx.scale, qx.data_col, qx.scale_col, qw.data, qw.scale, qb.data_col,
            qb.scale_col, q3.data, q3.scale, qg.data_col, qg.scale_col, qs.scale, ref,
            lowp.gemm(xb, w.bfloat16()), lowp.gemm(qx, qw, out=out),
            lowp.grouped_gemm(qx, q3, offs), lowp.dequantize(qx), lowp.dequantize(qx, "col"),
            lowp.dequantize(qs), lowp.cast(x, "bf16"), lowp.cast(xb, "e4m3"),
            lowp.decode(f8, "e4m3")]
    assert lowp.gemm(qx, qw).equal(ref) and out.equal(ref)
    # the same values as from numpy (a copy's .numpy(): x's own would pin its storage)
    assert np.array_equal(lowp.dequantize(qx).clone().numpy(),
                          lowp.dequantize(lowp.quantize(x.clone().numpy(), "e4m3", "mx32")))
    for t in [x, xb, offs, w, w3, f8, out] + outs:
        assert isinstance(t, torch.Tensor)
        t.untyped_storage().resize_(0)  # raised "not resizable" when read through .numpy()


def test_threads_follow_torch():
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert lowp.get_threads() == 1
        lowp.set_threads(2)
        assert lowp.get_threads() == 2
        lowp.set_threads(None)
        assert lowp.get_threads() == 1
    finally:
        torch.set_num_threads(old)
        lowp.set_threads(None)


def test_tensors_lowp_cannot_take():
    with pytest.raises(ValueError, match=r"lowp.quantize: x is on device meta"):
        lowp.quantize(torch.empty(4, 32, device="meta"))
    with pytest.raises(ValueError, match=r"lowp.quantize: x must be contiguous"):
        lowp.quantize(torch.randn(32, 8).t())
    with pytest.raises(TypeError, match=r"lowp.quantize: x must be float32 or bfloat16, got "
                                        r"torch.float16"):
        lowp.quantize(torch.randn(4, 32, dtype=torch.float16))
    with pytest.raises(TypeError, match=r"lowp.grouped_gemm: offs must be int32, got torch.int64"):
        lowp.grouped_gemm(torch.randn(4, 32), torch.randn(2, 8, 32), torch.tensor([2, 4]))
    with pytest.raises(ValueError, match=r"out must not require grad"):
        lowp.gemm(torch.randn(4, 32), torch.randn(4, 32),
                  out=torch.zeros(4, 4, requires_grad=True))
