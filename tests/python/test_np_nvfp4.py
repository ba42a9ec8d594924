"""The NVFP4 kinds (nv16, nv16x16: issue 38) in the Python package: the C tables list them, the
lowp.torch ops serve them (tests/python/test_torch_nvfp4.py), and the numpy API's quantize,
dequantize and GEMMs serve them, checked against tests/oracle/nvfp4_ref.py (ml_dtypes and
numpy float64, written from docs/numerics.md 4b) and float64 GEMMs, never against lowp."""

import numpy as np
import pytest

import lowp
import nvfp4_ref as R
from lowp import rules


def test_tables_list_the_nvfp4_kinds():
    sc = rules.TABLES["scalings"]
    assert (sc["nv16"]["block_cols"], sc["nv16"]["scale"], sc["nv16"]["tensor_scale"]) == (
        16, "e4m3", True)
    assert (sc["nv16x16"]["block_rows"], sc["nv16x16"]["transposes"]) == (16, True)
    assert ("e2m1", "nv16", "e2m1", "nv16x16") in rules.TABLES["gemm_pairs"]


def _awkward(rows, cols, seed, huge=True):
    """Normal values over many binades with zeros, a block of binary32 subnormals and (huge) one
    value near binary32's maximum (GEMM inputs leave it out: its products overflow)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-12, 12, (rows, cols)))
    x[0, : min(cols, 16)] = 0.0
    if rows > 2:
        x[1, : min(cols, 16)] = 1e-38  # binary32 subnormal range
        x[2, -1] = 3.0e38 if huge else 1.0
    return x.astype(np.float32)


def _check_copy(codes, blocks, d, x, tiles):
    """One NVFP4 copy against the oracle's quantization of x."""
    c, s, sd = R.quantize(x, tiles)
    np.testing.assert_array_equal(codes, R.pack(c))
    np.testing.assert_array_equal(blocks, s)
    assert d.dtype == np.float32 and d.shape == (1,)
    assert d.view(np.uint32)[0] == np.float32(sd).view(np.uint32)


@pytest.mark.parametrize("kind", ["nv16", "nv16x16"])
@pytest.mark.parametrize("shape", [(33, 40), (1, 17), (16, 16), (48, 129)])
def test_numpy_quantize_nvfp4_matches_oracle(kind, shape):
    assert kind in lowp.SCALINGS
    tiles = kind == "nv16x16"
    x = _awkward(*shape, seed=shape[0] * 1000 + shape[1])
    q = lowp.quantize(x, "e2m1", kind, axis="both")
    _check_copy(q.data, q.scale, q.tensor_scale, x, tiles)
    _check_copy(q.data_col, q.scale_col, q.tensor_scale_col, np.ascontiguousarray(x.T), tiles)
    c, s, sd = R.quantize(x, tiles)
    want = R.dequantize(c, s, sd, tiles)
    np.testing.assert_array_equal(q.dequantize().view(np.uint32), want.view(np.uint32))
    cc, sc, sdc = R.quantize(np.ascontiguousarray(x.T), tiles)
    want_col = R.dequantize(cc, sc, sdc, tiles).T
    np.testing.assert_array_equal(q.dequantize("col").view(np.uint32),
                                  want_col.view(np.uint32))


@pytest.mark.parametrize("kind", ["nv16", "nv16x16"])
def test_numpy_quantize_nvfp4_nan_inf_and_stack(kind):
    tiles = kind == "nv16x16"
    x = np.stack([_awkward(20, 35, 7), _awkward(20, 35, 8)])
    x[0, 5, 3] = np.nan  # tensor 0: S = 1, its block NaN (0x7F), the rest by S = 1
    x[1, 17, 30] = -np.inf
    q = lowp.quantize(x, "e2m1", kind)
    assert q.tensor_scale.shape == (2, 1)
    for g in range(2):
        _check_copy(q.data[g], q.scale[g], q.tensor_scale[g], x[g], tiles)
        c, s, sd = R.quantize(x[g], tiles)
        np.testing.assert_array_equal(q.dequantize()[g], R.dequantize(c, s, sd, tiles))
    assert q.tensor_scale[0, 0] == 1.0 and 0x7F in q.scale[0]


@pytest.mark.parametrize("kind", ["nv16", "nv16x16"])
def test_numpy_quantize_nvfp4_bf16_input(kind):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = _awkward(24, 50, 9, huge=False).astype(ml_dtypes.bfloat16)
    q = lowp.quantize(x, "e2m1", kind, axis="both")
    xf = x.astype(np.float32)  # exact widening: the oracle sees the same values
    _check_copy(q.data, q.scale, q.tensor_scale, xf, kind == "nv16x16")
    _check_copy(q.data_col, q.scale_col, q.tensor_scale_col, np.ascontiguousarray(xf.T),
                kind == "nv16x16")


def test_numpy_quantize_nv16_grouped_along_tokens():
    x = _awkward(70, 24, 3, huge=False)
    x[65:] = 1.0e30  # tokens past offs[-1]: their amax must not reach the grouped copy's D
    offs = np.array([0, 20, 37, 37, 65], np.int32)
    q = lowp.quantize(x, "e2m1", "nv16", axis="both", offs=offs)
    codes, scales, sd = R.quantize_grouped(x, offs)
    np.testing.assert_array_equal(q.data_col, R.pack(codes))
    np.testing.assert_array_equal(q.scale_col, scales)
    assert q.tensor_scale_col[0] == np.float32(sd)
    _check_copy(q.data, q.scale, q.tensor_scale, x, False)
    assert q.tensor_scale_col[0] != q.tensor_scale[0]
    assert q.col().tensor_scale is q.tensor_scale_col


def _deq(q, which="row"):
    """The oracle's dequantization of a copy of q, float64."""
    data, s, d = ((q.data, q.scale, q.tensor_scale) if which == "row"
                  else (q.data_col, q.scale_col, q.tensor_scale_col))
    rows = q.shape[0] if which == "row" else q.shape[1]
    cols = q.shape[1] if which == "row" else q.shape[0]
    codes = R.unpack(data, cols)[:rows]
    return R.dequantize(codes, s, d[0], q.scaling == "nv16x16").astype(np.float64)


def _deq_grouped(q, offs):
    """The oracle's dequantization of q's grouped columnwise copy [features, tokens]: each
    group's 1x16 blocks restart at its first token."""
    K, M = q.shape[1], q.shape[0]
    codes = R.unpack(q.data_col, M)
    out = np.zeros((K, M))
    lo, b = 0, 0
    for hi in (int(e) for e in offs):
        nb = -(-(hi - lo) // 16)
        out[:, lo:hi] = R.dequantize(codes[:, lo:hi], q.scale_col[:, b:b + nb],
                                     q.tensor_scale_col[0])
        lo, b = hi, b + nb
    return out


def _assert_within(c, a, b):
    """section 6's bound of the fast kernels: (K + 6) 2^-24 (|A| |B|^T), elementwise."""
    want = a @ b.T
    bound = (a.shape[1] + 6) * 2.0**-24 * (np.abs(a) @ np.abs(b).T)
    assert np.all(np.abs(c.astype(np.float64) - want) <= bound)


@pytest.mark.parametrize("b_kind", ["nv16", "nv16x16"])
def test_numpy_gemm_nvfp4_against_float64(b_kind):
    x = _awkward(37, 100, 11, huge=False)
    w = _awkward(29, 100, 12, huge=False)
    qa = lowp.quantize(x, "e2m1", "nv16")
    qb = lowp.quantize(w, "e2m1", b_kind, axis="both")
    c = lowp.gemm(qa, qb)
    assert c.shape == (37, 29) and c.dtype == np.float32
    _assert_within(c, _deq(qa), _deq(qb))
    if b_kind == "nv16x16":  # the weight as stored: dX = dY . W
        dy = _awkward(37, 29, 13, huge=False)
        qd = lowp.quantize(dy, "e2m1", "nv16")
        kn = lowp.gemm_kn(qd, qb)
        np.testing.assert_array_equal(kn, lowp.gemm(qd, qb.col()))
        _assert_within(kn, _deq(qd), _deq(qb, "col"))


def test_numpy_grouped_gemm_nvfp4_split_m_and_k():
    offs = np.array([10, 10, 33], np.int32)
    x = _awkward(40, 48, 21, huge=False)
    w = np.stack([_awkward(24, 48, 22 + g, huge=False) for g in range(3)])
    qx = lowp.quantize(x, "e2m1", "nv16")
    qw = lowp.quantize(w, "e2m1", "nv16x16")
    out = lowp.grouped_gemm(qx, qw, offs)
    a = _deq(qx)
    for g, (lo, hi) in enumerate(zip([0, 10, 10], offs)):
        wg = R.dequantize(R.unpack(qw.data[g], 48), qw.scale[g], qw.tensor_scale[g, 0], True)
        _assert_within(out[lo:hi], a[lo:hi], wg.astype(np.float64))
    assert not out[33:].any()
    dy = _awkward(40, 24, 31, huge=False)
    qdy = lowp.quantize(dy, "e2m1", "nv16", axis="col", offs=offs)
    qxc = lowp.quantize(x, "e2m1", "nv16", axis="col", offs=offs)
    dw = lowp.grouped_gemm(qdy, qxc, offs)
    assert dw.shape == (3, 24, 48)
    da, db = _deq_grouped(qdy, offs), _deq_grouped(qxc, offs)  # [features, tokens]
    for g, (lo, hi) in enumerate(zip([0, 10, 10], offs)):
        _assert_within(dw[g], da[:, lo:hi], db[:, lo:hi])


def test_numpy_nvfp4_torch_tensors_round_trip():
    torch = pytest.importorskip("torch")
    x = _awkward(20, 48, 41, huge=False)
    qn = lowp.quantize(x, "e2m1", "nv16x16", axis="both")
    qt = lowp.quantize(torch.from_numpy(x), "e2m1", "nv16x16", axis="both")
    assert isinstance(qt.tensor_scale, torch.Tensor) and qt.tensor_scale.dtype == torch.float32
    for a in ("data", "scale", "tensor_scale", "data_col", "scale_col", "tensor_scale_col"):
        np.testing.assert_array_equal(getattr(qt, a).numpy(), getattr(qn, a))
    np.testing.assert_array_equal(lowp.gemm(qt, qt).numpy(), lowp.gemm(qn, qn))


@pytest.mark.parametrize("kw, arg", [({"pow2": True}, "pow2"), ({"eps": 1e-12}, "eps"),
                                     ({"scale_mode": "floor"}, "scale_mode"),
                                     ({"scale": 2.0}, "scale")])
def test_numpy_quantize_nvfp4_refuses_options(kw, arg):
    with pytest.raises(ValueError, match=rf"lowp.quantize: {arg} applies"):
        lowp.quantize(np.ones((2, 16), np.float32), "e2m1", "nv16", **kw)


def test_numpy_qtensor_nvfp4_tensor_scale_checked():
    q = lowp.quantize(_awkward(16, 32, 5, huge=False), "e2m1", "nv16")
    with pytest.raises(ValueError, match=r"tensor_scale is needed with scaling nv16"):
        lowp.QTensor(q.data, q.scale, "e2m1", "nv16", q.shape)
    with pytest.raises(ValueError, match=r"tensor_scale has shape \(\), expected \(1,\)"):
        lowp.QTensor(q.data, q.scale, "e2m1", "nv16", q.shape,
                     tensor_scale=np.array(1.0, np.float32))
    m = lowp.quantize(_awkward(16, 32, 5), "e2m1", "mx32")
    with pytest.raises(ValueError, match=r"tensor_scale applies to .* not mx32"):
        lowp.QTensor(m.data, m.scale, "e2m1", "mx32", m.shape, tensor_scale=q.tensor_scale)
    r = lowp.QTensor(q.data, q.scale, "e2m1", "nv16", q.shape, tensor_scale=q.tensor_scale * 2)
    np.testing.assert_array_equal(r.dequantize(), q.dequantize() * 2)


def test_portable_path_lists_nvfp4():
    pytest.importorskip("torch")
    from lowp.torch.ops import portable as P
    assert {"nv16", "nv16x16"} <= set(P.SCALINGS)
    assert "nv16x16" in P.TILE_KINDS and "nv16" in P.TOKEN_BLOCK_KINDS


def test_check_device_asks_nvfp4_kernels():
    pytest.importorskip("torch")
    import importlib
    C = importlib.import_module("lowp.torch.check_device")  # the module, not the function
    keys = [k for op in ("scaled_mm", "scaled_grouped_mm") for k in C._gemm_keys(op)]
    assert {k.b_scaling for k in keys if k.scaling == "nv16"} == {"nv16", "nv16x16"}
