"""The extension's typed descriptors (python/src/ext_types.c): `lowp._lowp.QDesc`, `QuantCfg`
and `GemmCfg` check each field once, when built, with a TypeError (wrong type) or ValueError
(wrong value) naming the field; the calls take them (and nothing positional beyond them), check
that every buffer holds the bytes the library touches, and pass each field through: results are
checked against numpy and the independent quantization reference (tests/oracle/quant_ref.py). numpy
only (also run under ASan)."""

import ml_dtypes
import numpy as np
import pytest

import quant_ref as Q
from lowp import _numpy_api

E = _numpy_api._lowp
TN = "lowp._lowp."
rng = np.random.default_rng(11)


def ints(shape, lo=-4, hi=5):
    """float32 small integers: every product and sum below is exact in binary32."""
    return rng.integers(lo, hi, shape).astype(np.float32)


def raw(a):
    """An array's memory as raw memory, (address, nbytes)."""
    return (a.ctypes.data, a.nbytes)


def mx32_operand(x):
    """x [R, C] quantized to e4m3 mx32 through the descriptors: (QDesc, codes, scales)."""
    R, C = x.shape
    _, _, sr, sc, _ = E.layout("e4m3", "mx32", R, C, None)
    d, s = np.zeros((R, C), np.uint8), np.zeros((sr, sc), np.uint8)
    E.quantize(E.QDesc("f32", "none", R, C, x), E.QDesc("e4m3", "mx32", R, C, d, s), None,
               E.QuantCfg())
    return E.QDesc("e4m3", "mx32", R, C, d, s), d, s


# ---- fields checked when built, the field named ----

DATA = np.zeros(16, np.uint8)
QDESC = dict(format="e4m3", scaling="mx32", rows=4, cols=4, data=DATA)


@pytest.mark.parametrize("field,value,exc,match", [
    ("format", 3, TypeError, "QDesc: format must be a str, got int"),
    ("format", "e9m9", ValueError, r"QDesc: format \('e9m9'\): .*not one of"),
    ("scaling", None, TypeError, "QDesc: scaling must be a str, got NoneType"),
    ("scaling", "mx64", ValueError, r"QDesc: scaling \('mx64'\): .*not one of"),
    ("rows", 4.0, TypeError, "QDesc: rows must be an int, got float"),
    ("rows", True, TypeError, "QDesc: rows must be an int, got bool"),
    ("cols", -1, ValueError, r"QDesc: cols \(-1\) must be in \[0, "),
    ("cols", 2**70, ValueError, r"QDesc: cols \(\d+\) must be in \[0, "),
    ("data", None, TypeError, "QDesc: data must be a C-contiguous buffer, got NoneType"),
    ("data", [1, 2], TypeError, "QDesc: data must be a C-contiguous buffer, got list"),
    ("data", (0, 16), TypeError, r"QDesc: data as raw memory must be \(address, nbytes >= 0\)"),
    ("data", (DATA.ctypes.data, -1), TypeError, "QDesc: data as raw memory"),
    ("scale", np.zeros((4, 4), np.uint8)[:, ::2], TypeError,
     "QDesc: scale must be a C-contiguous buffer"),
    ("offs", "abc", TypeError, "QDesc: offs must be a C-contiguous buffer, got str"),
])
def test_qdesc_field_named(field, value, exc, match):
    with pytest.raises(exc, match=match):
        E.QDesc(**{**QDESC, field: value})


def test_qdesc_arity_and_plain_operands():
    with pytest.raises(TypeError, match="rows"):  # missing: Python names the argument
        E.QDesc("e4m3", "mx32")
    with pytest.raises(TypeError, match="'shape'"):
        E.QDesc(**QDESC, shape=(4, 4))
    with pytest.raises(ValueError, match=r"QDesc: a plain operand \(scaling 'none'\) takes no "
                                         "scale"):
        E.QDesc("f32", "none", 2, 2, DATA, DATA)
    with pytest.raises(ValueError, match="takes no offs"):
        E.QDesc("f32", "none", 2, 2, DATA, None, np.zeros(1, np.int32))


@pytest.mark.parametrize("field,value,exc,match", [
    ("scale_mode", 1, TypeError, "QuantCfg: scale_mode must be a str, got int"),
    ("scale_mode", "round", ValueError, r"QuantCfg: scale_mode \('round'\): .*rceil"),
    ("pow2", True, TypeError, "QuantCfg: pow2 must be an int, got bool"),
    ("pow2", 2, ValueError, r"QuantCfg: pow2 \(2\) must be in \[-1, 1\]"),
    ("eps", "0", TypeError, "QuantCfg: eps must be a float, got str"),
    ("scale", [1.0], TypeError, "QuantCfg: scale must be a float, got list"),
    ("amax", 1, TypeError, "QuantCfg: amax must be a bool, got int"),
    ("threads", -1, ValueError, r"QuantCfg: threads \(-1\) must be in \[0, "),
    ("threads", 1.0, TypeError, "QuantCfg: threads must be an int, got float"),
    ("path", 99, ValueError, r"QuantCfg: path \(99\) must be in \[0, "),
])
def test_quant_cfg_field_named(field, value, exc, match):
    with pytest.raises(exc, match=match):
        E.QuantCfg(**{field: value})


@pytest.mark.parametrize("field,value,exc,match", [
    ("out_dtype", "e4m3", ValueError, r"GemmCfg: out_dtype \('e4m3'\) must be 'f32' or 'bf16'"),
    ("out_dtype", np.float32, TypeError, "GemmCfg: out_dtype must be a str, got type"),
    ("accumulate", 0, TypeError, "GemmCfg: accumulate must be a bool, got int"),
    ("threads", "1", TypeError, "GemmCfg: threads must be an int, got str"),
    ("path", -1, ValueError, r"GemmCfg: path \(-1\) must be in \[0, "),
    ("b_layout", "nt", ValueError, r"GemmCfg: b_layout \('nt'\) must be 'nk' or 'kn'"),
])
def test_gemm_cfg_field_named(field, value, exc, match):
    with pytest.raises(exc, match=match):
        E.GemmCfg(**{field: value})


def test_fields_read_back_and_immutable():
    s = np.zeros(1, np.float32)
    d = E.QDesc("e5m2", "tensor", 3, 4, DATA, s)
    assert (d.format, d.scaling, d.rows, d.cols, d.data is DATA, d.scale is s, d.offs) == \
        ("e5m2", "tensor", 3, 4, True, True, None)
    c = E.QuantCfg(scale_mode="floor", pow2=0, eps=0.5, scale=2.0, amax=True, threads=3, path=1)
    assert (c.scale_mode, c.pow2, c.eps, c.scale, c.amax, c.threads, c.path) == \
        ("floor", 0, 0.5, 2.0, True, 3, 1)
    g = E.GemmCfg(out_dtype="bf16", accumulate=True, threads=2, b_layout="kn")
    assert (g.out_dtype, g.accumulate, g.threads, g.path, g.b_layout) == ("bf16", True, 2, 0, "kn")
    assert repr(E.GemmCfg()) == ("GemmCfg(out_dtype='f32', accumulate=False, threads=0, path=0, "
                                 "b_layout='nk')")
    assert repr(d).startswith("QDesc(format='e5m2', scaling='tensor', rows=3, cols=4, data=")
    for obj, field in ((d, "rows"), (c, "eps"), (g, "accumulate")):
        with pytest.raises(AttributeError):
            setattr(obj, field, 1)


# ---- the calls: descriptors only, buffers checked in C ----

def test_calls_take_descriptors_only():
    a = E.QDesc("f32", "none", 2, 3, np.zeros((2, 3), np.float32))
    out = np.zeros((2, 2), np.float32)
    with pytest.raises(TypeError, match=f"lowp.gemm: b must be a {TN}QDesc, got tuple"):
        E.gemm(a, ("f32", "none", 2, 3, np.zeros((2, 3), np.float32), None, None), out,
               E.GemmCfg())
    with pytest.raises(TypeError, match=f"lowp.gemm: cfg must be a {TN}GemmCfg, got {TN}QuantCfg"):
        E.gemm(a, a, out, E.QuantCfg())
    with pytest.raises(TypeError, match=f"lowp.quantize: cfg must be a {TN}QuantCfg"):
        E.quantize(a, None, None, E.GemmCfg())
    with pytest.raises(TypeError, match=f"lowp.dequantize: q must be a {TN}QDesc, got "
                                        "numpy.ndarray"):
        E.dequantize(np.zeros(4, np.uint8), out)
    with pytest.raises(TypeError, match="takes at most 4 arguments"):
        E.gemm(a, a, out, E.GemmCfg(), True)


def test_buffer_sizes_checked_at_the_call():
    x = np.zeros((4, 64), np.float32)
    cfg = E.QuantCfg()
    short = E.QDesc("e4m3", "mx32", 4, 64, np.zeros(255, np.uint8), np.zeros(8, np.uint8))
    with pytest.raises(ValueError, match="lowp.quantize: row.data holds 255 bytes, needs 256"):
        E.quantize(E.QDesc("f32", "none", 4, 64, x), short, None, cfg)
    with pytest.raises(ValueError, match="lowp.quantize: x holds 1020 bytes, needs 1024"):
        E.quantize(E.QDesc("f32", "none", 4, 64, x.reshape(-1)[:255]), short, None, cfg)
    with pytest.raises(TypeError, match="lowp.quantize: col.data must be a C-contiguous "
                                        "writable buffer, got bytes"):
        E.quantize(E.QDesc("f32", "none", 4, 64, x), None,
                   E.QDesc("e4m3", "mx32", 64, 4, bytes(256), bytearray(64)), cfg)
    with pytest.raises(ValueError, match=r"lowp.quantize: x must be a plain tensor \(scaling "
                                         r"'none'\), got 'mx32'"):
        E.quantize(short, short, None, cfg)
    a, _, _ = mx32_operand(ints((8, 64)))
    with pytest.raises(ValueError, match="lowp.gemm: out holds 252 bytes, needs 256"):
        E.gemm(a, a, np.zeros(63, np.float32), E.GemmCfg())


def test_grouped_calls_checked():
    a = E.QDesc("f32", "none", 6, 4, ints((6, 4)))
    b = E.QDesc("f32", "none", 3, 4, ints((2, 3, 4)))  # one expert [3, 4], two in data
    out = np.zeros((6, 3), np.float32)
    with pytest.raises(ValueError, match="lowp.grouped_gemm: offs holds 0 bytes"):
        E.grouped_gemm(a, b, np.zeros(0, np.int32), out, E.GemmCfg())
    with pytest.raises(ValueError, match="lowp.grouped_gemm: b.data holds 96 bytes, needs 144"):
        E.grouped_gemm(a, b, np.array([2, 4, 6], np.int32), out, E.GemmCfg())
    with pytest.raises(ValueError, match="cfg.b_layout must be 'nk' for the split-K GEMM"):
        E.grouped_gemm_wgrad(a, a, np.array([6], np.int32), np.zeros((4, 4), np.float32),
                             E.GemmCfg(b_layout="kn"))
    col = E.QDesc("e4m3", "mx32", 64, 4, np.zeros(256, np.uint8), np.zeros(64, np.uint8))
    with pytest.raises(ValueError, match="lowp.quantize: col.offs is None"):
        E.quantize_grouped(E.QDesc("f32", "none", 4, 64, np.zeros((4, 64), np.float32)), col,
                           E.QuantCfg())


# ---- each field reaches the library (independent references) ----

@pytest.mark.parametrize("path", [0, 1])
def test_gemm_cfg_fields_reach_the_gemm(path):
    a, b, bk = ints((5, 7)), ints((3, 7)), ints((7, 3))
    da = E.QDesc("f32", "none", 5, 7, a)
    out = np.zeros((5, 3), np.float32)
    E.gemm(da, E.QDesc("f32", "none", 3, 7, raw(b)), raw(out), E.GemmCfg(threads=1, path=path))
    assert np.array_equal(out, a @ b.T)
    E.gemm(da, E.QDesc("f32", "none", 7, 3, bk), out, E.GemmCfg(accumulate=True, b_layout="kn"))
    assert np.array_equal(out, a @ b.T + a @ bk)
    o16 = np.zeros((5, 3), np.uint16)
    E.gemm(da, E.QDesc("f32", "none", 3, 7, b), o16, E.GemmCfg(out_dtype="bf16"))
    assert np.array_equal(o16.view(ml_dtypes.bfloat16).astype(np.float32), a @ b.T)


def test_grouped_gemms_through_descriptors():
    x, w = ints((6, 4)), ints((2, 3, 4))
    offs = np.array([2, 5], np.int32)  # group 0: rows 0-1, group 1: rows 2-4, row 5 untouched
    out = np.full((6, 3), 7.0, np.float32)
    E.grouped_gemm(E.QDesc("f32", "none", 6, 4, x), E.QDesc("f32", "none", 3, 4, w), offs, out,
                   E.GemmCfg())
    want = np.concatenate([x[:2] @ w[0].T, x[2:5] @ w[1].T, np.full((1, 3), 7.0)])
    assert np.array_equal(out, want)
    dy = ints((6, 3))
    dw = np.zeros((2 * 3, 4), np.float32)  # split-K: a = dY^T [3, 6], b = X^T [4, 6]
    E.grouped_gemm_wgrad(E.QDesc("f32", "none", 3, 6, np.ascontiguousarray(dy.T)),
                         E.QDesc("f32", "none", 4, 6, np.ascontiguousarray(x.T)), offs, dw,
                         E.GemmCfg())
    assert np.array_equal(dw.reshape(2, 3, 4), np.stack([dy[:2].T @ x[:2], dy[2:5].T @ x[2:5]]))


@pytest.mark.parametrize("kind,cfg,ref", [
    ("mx32", dict(scale_mode="floor"), dict(mode=Q.FLOOR)),
    ("mx32", dict(scale_mode="even", threads=1, path=1), dict(mode=Q.EVEN)),
    ("tensor", dict(pow2=1), dict(pow2=1)),
    ("row", dict(pow2=0, eps=3.0), dict(pow2=0, eps=3.0)),
    ("tensor", dict(scale=0.375), dict(scale=0.375)),
])
def test_quant_cfg_fields_reach_the_quantizer(kind, cfg, ref):
    x = (rng.standard_normal((33, 70)) * 2).astype(np.float32)
    x[0, 0] = 0.5  # row 0's amax, under eps = 3
    x[0, 1:] = 0.25
    R, C = x.shape
    want = Q.quantize(x, Q.E4M3, {v: k for k, v in Q.KIND_NAMES.items()}[kind], **ref)
    copies = {}
    for name, (r, c) in (("row", (R, C)), ("col", (C, R))):
        _, _, sr, sc, e8 = E.layout("e4m3", kind, r, c, None)
        copies[name] = (np.zeros((r, c), np.uint8), np.zeros((sr, sc), np.uint8 if e8 else
                                                              np.float32))
    amax = E.quantize(E.QDesc("f32", "none", R, C, x),
                      E.QDesc("e4m3", kind, R, C, *copies["row"]),
                      E.QDesc("e4m3", kind, C, R, *copies["col"]),
                      E.QuantCfg(amax=kind == "tensor", **cfg))
    for name in ("row", "col"):
        assert np.array_equal(copies[name][0], want[name][0]), name
        assert np.array_equal(copies[name][1], want[name][1]), name
    assert amax == (np.abs(x).max() if kind == "tensor" else None)


def test_dequantize_and_grouped_quantize_through_descriptors():
    x = np.array([0.5, -0.25, 1.0, 0.0, -1.0, 0.125, 0.75, -0.5], np.float32)
    x = np.tile(x, (6, 8))  # [6, 64]: every value exact in e4m3 at each block's mx32 scale
    q, _, _ = mx32_operand(x)
    out = np.zeros((6, 64), np.float32)
    E.dequantize(q, out)
    assert np.array_equal(out, x)
    offs = np.array([2, 6], np.int32)
    _, _, sr, sc, _ = E.layout("e4m3", "mx32", 64, 6, offs)
    cd, cs = np.zeros((64, 6), np.uint8), np.zeros((sr, sc), np.uint8)
    E.quantize_grouped(E.QDesc("f32", "none", 6, 64, x), E.QDesc("e4m3", "mx32", 64, 6, cd, cs,
                                                                 offs), E.QuantCfg())
    back = np.zeros((64, 6), np.float32)
    E.dequantize(E.QDesc("e4m3", "mx32", 64, 6, cd, cs, offs), back)
    assert np.array_equal(back, x.T)
