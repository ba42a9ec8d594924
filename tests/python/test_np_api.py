"""The numpy API of lowp (numpy only: these tests also run under ASan in `make sanitize`).

Oracles: ml_dtypes and numpy for element casts and decodes; the `lowp` command for the bytes
of cast and quantize (the API must give exactly its bytes); an independent numpy decoder
(conftest.py) for dequantize; a float64 product of the dequantized operands for every GEMM
pair and the grouped GEMMs (relative error at most 1e-5 of |C|); per-group quantization for
the grouped columnwise copies.
"""

import threading

import ml_dtypes
import numpy as np
import pytest

import lowp
from np_ref import SANITIZE, cli, ref_dequantize, sqnr  # noqa: F401 (cli: a fixture)

rng = np.random.default_rng(11)
FMAX = {"e4m3": 448.0, "e5m2": 57344.0, "e2m1": 6.0}
MLD = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
       "e2m1": ml_dtypes.float4_e2m1fn}


def awkward_f32(n):
    """Random values of every magnitude plus zeros, subnormals, maxima, ties, Inf and NaN."""
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n))).astype(np.float32)
    special = np.array([0.0, -0.0, 1e-40, -1e-45, 448, 464, 480, -500, 57344, 61440, 6, 7,
                        np.inf, -np.inf, np.nan, 3.4e38, 1.5, 2.5, 0.25, 2**-9, 2**-10],
                       np.float32)
    x[:special.size] = special
    return x


# ---- cast / decode ----

@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1"])
def test_cast_satfinite_matches_ml_dtypes(fmt):
    x = awkward_f32(5000)
    codes = lowp.cast(x, fmt)
    assert codes.dtype == np.uint8 and codes.shape == x.shape
    fin = ~np.isnan(x)
    want = np.clip(x[fin], -FMAX[fmt], FMAX[fmt]).astype(MLD[fmt]).view(np.uint8)
    if fmt == "e2m1":
        want = want & 0xF
    assert np.array_equal(codes[fin], want)
    nan_code = {"e4m3": 0x7F, "e5m2": 0x7E, "e2m1": 0x0}[fmt]
    assert np.all(codes[~fin] & 0x7F == nan_code)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_cast_nonsat_matches_ml_dtypes(fmt):
    x = awkward_f32(3000)
    codes = lowp.cast(x, fmt, saturate="nonsat")
    fin = ~np.isnan(x)
    want = x[fin].astype(MLD[fmt])
    got = codes[fin].view(MLD[fmt])
    both_nan = np.isnan(want.astype(np.float32)) & np.isnan(got.astype(np.float32))
    assert np.array_equal(got.view(np.uint8)[~both_nan], want.view(np.uint8)[~both_nan])
    assert np.array_equal(np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32)))


def test_cast_bf16_f16_follow_ieee_by_default():
    x = awkward_f32(3000)
    b = lowp.cast(x, "bf16")
    assert b.dtype == np.uint16
    fin = ~np.isnan(x)
    assert np.array_equal(b[fin], x[fin].astype(ml_dtypes.bfloat16).view(np.uint16))
    assert np.all(b[~fin] & 0x7FFF == 0x7FC0)
    h = lowp.cast(x, "f16")
    with np.errstate(over="ignore"):
        assert np.array_equal(h[fin], x[fin].astype(np.float16).view(np.uint16))
    # overflow and Inf give Inf; satfinite on request gives the largest finite value
    big = np.array([np.inf, -np.inf, 3.4e38, 70000.0], np.float32)
    assert list(lowp.cast(big, "f16")) == [0x7C00, 0xFC00, 0x7C00, 0x7C00]
    assert list(lowp.cast(big, "f16", saturate="satfinite")) == [0x7BFF, 0xFBFF, 0x7BFF, 0x7BFF]
    assert lowp.cast(big[:1], "bf16")[0] == 0x7F80
    assert lowp.cast(big[:1], "bf16", saturate=True)[0] == 0x7F7F


def test_cast_from_bf16_input_equals_cast_of_its_f32_values():
    x = awkward_f32(2000).astype(ml_dtypes.bfloat16)
    for fmt in ("e4m3", "e5m2", "e2m1", "f16"):
        assert np.array_equal(lowp.cast(x, fmt), lowp.cast(x.astype(np.float32), fmt))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1", "bf16", "f16"])
def test_decode_every_code_matches_ml_dtypes(fmt):
    if fmt in ("bf16", "f16"):
        codes = np.arange(65536, dtype=np.uint32).astype(np.uint16)
        want = codes.view(ml_dtypes.bfloat16 if fmt == "bf16" else np.float16).astype(np.float32)
    else:
        codes = np.arange(16 if fmt == "e2m1" else 256, dtype=np.uint8)
        want = codes.view(MLD[fmt]).astype(np.float32)
    got = lowp.decode(codes, fmt)
    assert got.dtype == np.float32
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(want))


def test_decode_e8m0_and_shapes_kept():
    codes = np.arange(256, dtype=np.uint8).reshape(4, 8, 8)
    got = lowp.decode(codes, "e8m0")
    assert got.shape == (4, 8, 8)
    flat = got.reshape(-1)
    assert flat[0] == np.float32(2.0**-127) and flat[127] == 1.0 and flat[254] == 2.0**127
    assert np.isnan(flat[255])
    assert np.array_equal(lowp.decode(lowp.cast(flat[:255], "e8m0"), "e8m0"), flat[:255])


def test_cast_sr_reproducible_and_between_neighbours():
    x = np.full(20000, 1.0 + 2**-5, np.float32)  # between 1 and 1.125 in E4M3, 1/4 of the way
    a = lowp.cast(x, "e4m3", round="sr", seed=7)
    assert np.array_equal(a, lowp.cast(x, "e4m3", round="sr", seed=7))
    assert not np.array_equal(a, lowp.cast(x, "e4m3", round="sr", seed=8))
    assert set(np.unique(a)) == {0x38, 0x39}
    assert abs(np.mean(a == 0x39) - 0.25) < 0.02
    # element i uses word offset + i: an offset of 10 shifts the stream by ten elements
    b = lowp.cast(x, "e4m3", round="sr", seed=7, offset=10)
    assert np.array_equal(b[:-10], a[10:])


@pytest.mark.parametrize("args", [["e4m3"], ["e5m2", "--saturate", "nonsat"], ["e2m1"],
                                  ["bf16"], ["e4m3", "--round", "sr", "--seed", "99"]])
def test_cast_equals_the_lowp_command(cli, args):
    x = awkward_f32(777).reshape(7, 111)
    np.save(cli.dir / "in.npy", x)
    cli("cast", "--to", *args, "in.npy", "out.npy")
    kw = {}
    if "--saturate" in args:
        kw["saturate"] = "nonsat"
    if "--round" in args:
        kw.update(round="sr", seed=99)
    fmt = args[0]
    got = lowp.cast(x, fmt, **kw)
    want = np.load(cli.dir / "out.npy")
    if fmt == "bf16":  # the command's default saturates (issue 10 item 12); compare finite
        fin = np.abs(x) < 3e38
        assert np.array_equal(got[fin], want[fin])
    else:
        assert np.array_equal(got, want)


# ---- quantize / dequantize ----

def configs():
    out = []
    for kind in ("tensor", "row", "block128", "block128x128"):
        for fmt in ("e4m3", "e5m2"):
            out.append((fmt, kind, None))
    for fmt in ("e4m3", "e5m2", "e2m1"):
        for mode in ("rceil", "floor", "ceil", "even"):
            out.append((fmt, "mx32", mode))
    for fmt in ("e4m3", "e5m2"):
        out.append((fmt, "block32x32", "floor"))
        out.append((fmt, "block32x32", "rceil"))
    return out


@pytest.mark.parametrize("fmt,kind,mode", configs())
def test_quantize_equals_the_lowp_command(cli, fmt, kind, mode):
    x = (rng.standard_normal((37, 150)) * 3).astype(np.float32)
    np.save(cli.dir / "in.npy", x)
    args = ["quantize", "--format", fmt, "--scaling", kind, "--axis", "both"]
    if mode:
        args += ["--scale-mode", mode]
    cli(*args, "in.npy", "out")
    q = lowp.quantize(x, fmt, kind, scale_mode=mode, axis="both")
    for got, name in ((q.data, "data"), (q.scale, "scale"), (q.data_col, "col.data"),
                      (q.scale_col, "col.scale")):
        want = np.load(cli.dir / f"out.{name}.npy")
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert np.array_equal(got, want), name
    # bfloat16 input: the same bytes as its float32 values
    xb = x.astype(ml_dtypes.bfloat16)
    qb = lowp.quantize(xb, fmt, kind, scale_mode=mode, axis="both")
    qf = lowp.quantize(xb.astype(np.float32), fmt, kind, scale_mode=mode, axis="both")
    for a, b in ((qb.data, qf.data), (qb.scale, qf.scale), (qb.data_col, qf.data_col)):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("fmt,kind,mode", configs())
def test_dequantize_matches_independent_decoder(fmt, kind, mode):
    R, C = (33, 130) if SANITIZE else (131, 260)
    x = (rng.standard_normal((R, C)) * np.exp2(rng.integers(-8, 8, (R, 1)))).astype(np.float32)
    q = lowp.quantize(x, fmt, kind, scale_mode=mode, axis="both")
    assert q.shape == (R, C) and q.format == fmt and q.scaling == kind
    assert q.scale_mode == (None if kind not in ("mx32", "block32x32") else mode)
    y = lowp.dequantize(q)
    assert y.dtype == np.float32 and y.shape == (R, C)
    assert np.array_equal(y, ref_dequantize(q.data, q.scale, fmt, kind, R, C).astype(np.float32))
    yc = lowp.dequantize(q, axis="col")
    ref_c = ref_dequantize(q.data_col, q.scale_col, fmt, kind, C, R).T.astype(np.float32)
    assert np.array_equal(yc, ref_c)
    floor_db = {"e4m3": 25, "e5m2": 20, "e2m1": 8}[fmt]
    assert sqnr(x, y) > floor_db and sqnr(x, yc) > floor_db
    # q.col(): the columnwise copy as a rowwise one, shape transposed
    v = q.col()
    assert v.shape == (C, R) and v.data is q.data_col and v.data_col is None
    assert np.array_equal(lowp.dequantize(v), yc.T)


def test_quantize_3d_is_per_matrix():
    x = rng.standard_normal((3, 40, 64)).astype(np.float32)
    for kind in ("mx32", "tensor", "block128x128"):
        q = lowp.quantize(x, "e4m3", kind, axis="both")
        assert q.shape == (3, 40, 64)
        for g in range(3):
            qg = lowp.quantize(x[g], "e4m3", kind, axis="both")
            assert np.array_equal(q.data[g], qg.data) and np.array_equal(q.scale[g], qg.scale)
            assert np.array_equal(q.data_col[g], qg.data_col)
            assert np.array_equal(q.scale_col[g], qg.scale_col)
        assert np.array_equal(lowp.dequantize(q)[1], lowp.dequantize(lowp.quantize(x[1], "e4m3",
                                                                                  kind)))
    qt = lowp.quantize(x, "e4m3", "tensor")
    assert qt.amax.shape == (3,) and np.array_equal(qt.amax, np.abs(x).max(axis=(1, 2)))


def test_tensor_scaling_amax_and_given_scale():
    x = rng.standard_normal((16, 48)).astype(np.float32)
    q = lowp.quantize(x, "e4m3", "tensor")
    assert q.amax == np.abs(x).max()
    qs = lowp.quantize(x, "e4m3", "tensor", scale=2.0)  # delayed scaling: the scale is given
    assert qs.scale.item() == 0.5 and qs.amax == np.abs(x).max()
    want = np.clip(x * np.float32(2.0), -448, 448).astype(ml_dtypes.float8_e4m3fn)
    assert np.array_equal(qs.data, want.view(np.uint8))


def group_sizes_offs(sizes):
    return np.cumsum(sizes).astype(np.int32)


@pytest.mark.parametrize("fmt,kind", [("e4m3", "mx32"), ("e5m2", "mx32"), ("e4m3", "block128")])
def test_grouped_columnwise_copy_restarts_blocks_at_groups(fmt, kind):
    sizes = [0, 1, 45, 0, 200, 33]
    offs = group_sizes_offs(sizes)
    M, K = int(offs[-1]) + 7, 64        # tokens past offs[-1] are ignored
    x = rng.standard_normal((M, K)).astype(np.float32)
    q = lowp.quantize(x, fmt, kind, axis="both", offs=offs)
    assert q.offs is not None and np.array_equal(q.offs, offs)
    bs = 32 if kind == "mx32" else 128
    start, blk = 0, 0
    for e in offs:
        n = int(e) - start
        nb = -(-n // bs)
        if n:
            qg = lowp.quantize(np.ascontiguousarray(x[start:e]), fmt, kind, axis="col")
            assert np.array_equal(q.data_col[:, start:e], qg.data_col)
            assert np.array_equal(q.scale_col[:, blk:blk + nb], qg.scale_col)
        start, blk = int(e), blk + nb
    assert q.scale_col.shape == (K, blk)
    assert np.all(q.data_col[:, offs[-1]:] == 0)
    # the rowwise copy is the plain one
    assert np.array_equal(q.data, lowp.quantize(x, fmt, kind).data)


# ---- GEMMs ----

GEMM_PAIRS = [
    (("e4m3", "tensor"), ("e4m3", "tensor")), (("e5m2", "tensor"), ("e4m3", "tensor")),
    (("e4m3", "row"), ("e4m3", "row")), (("e5m2", "row"), ("e5m2", "row")),
    (("e4m3", "mx32"), ("e4m3", "mx32")), (("e5m2", "mx32"), ("e5m2", "mx32")),
    (("e2m1", "mx32"), ("e2m1", "mx32")),
    (("e4m3", "block128"), ("e4m3", "block128x128")), (("e4m3", "block128"), ("e4m3", "block128")),
    (("e4m3", "mx32"), ("e4m3", "block32x32")),
]


def deq64(q):
    R, C = q.shape
    return ref_dequantize(q.data, q.scale, q.format, q.scaling, R, C)


def rel_err(c, ref):
    return np.linalg.norm(np.asarray(c, np.float64) - ref) / max(np.linalg.norm(ref), 1e-300)


@pytest.mark.parametrize("pa,pb", GEMM_PAIRS)
def test_gemm_every_pair_against_float64(pa, pb):
    M, N, K = (9, 20, 96) if SANITIZE else (67, 72, 288)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((N, K)).astype(np.float32)
    qa = lowp.quantize(a, pa[0], pa[1])
    qb = lowp.quantize(b, pb[0], pb[1])
    ref = deq64(qa) @ deq64(qb).T
    c = lowp.gemm(qa, qb)
    assert c.dtype == np.float32 and c.shape == (M, N)
    assert rel_err(c, ref) <= 1e-5
    # accumulate into a given out, and a bf16 out
    out = np.ones((M, N), np.float32)
    assert lowp.gemm(qa, qb, out=out, accumulate=True) is out
    assert rel_err(out, ref + 1) <= 1e-5
    ob = np.zeros((M, N), ml_dtypes.bfloat16)
    lowp.gemm(qa, qb, out=ob)
    assert np.array_equal(ob, c.astype(ml_dtypes.bfloat16)) or rel_err(ob.astype(np.float32),
                                                                       ref) <= 1e-2


def test_gemm_plain_operands_and_col_views():
    a = rng.standard_normal((30, 64)).astype(np.float32)
    b = rng.standard_normal((20, 64)).astype(np.float32)
    c = lowp.gemm(a, b)
    assert rel_err(c, a.astype(np.float64) @ b.T) <= 1e-5
    ab, bb = a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)
    ref = ab.astype(np.float64) @ bb.astype(np.float64).T
    assert rel_err(lowp.gemm(ab, bb), ref) <= 1e-5
    # the weight gradient's shape of use: dW = dY^T X from the columnwise copies
    dy = rng.standard_normal((64, 30)).astype(np.float32)    # [tokens, N]
    x = rng.standard_normal((64, 40)).astype(np.float32)     # [tokens, K]
    qdy = lowp.quantize(dy, "e4m3", "mx32", axis="col")
    qx = lowp.quantize(x, "e4m3", "mx32", axis="both")
    dw = lowp.gemm(qdy.col(), qx.col())
    ref = deq64(qdy.col()) @ deq64(qx.col()).T
    assert dw.shape == (30, 40) and rel_err(dw, ref) <= 1e-5


@pytest.mark.parametrize("fmt,kind,bkind", [("e4m3", "mx32", "mx32"), ("e2m1", "mx32", "mx32"),
                                            ("e4m3", "block128", "block128x128"),
                                            ("e4m3", "mx32", "block32x32"),
                                            ("e4m3", "row", "row"), (None, None, None)])
def test_grouped_gemm_split_m(fmt, kind, bkind):
    sizes = [5, 0, 1, 40, 0, 19]
    offs = group_sizes_offs(sizes)
    G, N, K = len(sizes), 24, 160
    M = int(offs[-1]) + 3
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((G, N, K)).astype(np.float32)
    if fmt is None:
        qa, qw, da, dws = x, w, x.astype(np.float64), w.astype(np.float64)
    else:
        qa, qw = lowp.quantize(x, fmt, kind), lowp.quantize(w, fmt, bkind)
        da = deq64(qa)
        dws = np.stack([ref_dequantize(qw.data[g], qw.scale[g], fmt, bkind, N, K)
                        for g in range(G)])
    c = lowp.grouped_gemm(qa, qw, offs)
    assert c.shape == (M, N)
    ref = np.zeros((M, N))
    s = 0
    for g, e in enumerate(offs):
        ref[s:e] = da[s:e] @ dws[g].T
        s = e
    assert rel_err(c, ref) <= 1e-5
    assert np.all(c[offs[-1]:] == 0)


@pytest.mark.parametrize("fmt,kind", [("e4m3", "mx32"), ("e5m2", "mx32"), ("e4m3", "block128"),
                                      ("e4m3", "row"), ("e5m2", "tensor"), (None, None)])
def test_grouped_gemm_split_k(fmt, kind):
    sizes = [0, 1, 37, 64, 0, 10]
    offs = group_sizes_offs(sizes)
    G, N, K = len(sizes), 24, 40
    M = int(offs[-1])
    dy = rng.standard_normal((M, N)).astype(np.float32)
    x = rng.standard_normal((M, K)).astype(np.float32)
    if fmt is None:
        a, b, ddy, dx = dy, x, dy.astype(np.float64).T, x.astype(np.float64).T
    else:
        go = offs if kind in ("mx32", "block128") else None  # blocks along the tokens
        a = lowp.quantize(dy, fmt, kind, axis="col", offs=go)
        b = lowp.quantize(x, fmt, kind, axis="both", offs=go)
        ddy = lowp.dequantize(a, axis="col").astype(np.float64).T    # [N, M]
        dx = lowp.dequantize(b, axis="col").astype(np.float64).T     # [K, M]
    dw = lowp.grouped_gemm(a, b, offs)
    assert dw.shape == (G, N, K)
    s = 0
    for g, e in enumerate(offs):
        ref = ddy[:, s:e] @ dx[:, s:e].T
        if e == s:
            assert np.all(dw[g] == 0)
        else:
            assert rel_err(dw[g], ref) <= 1e-5
        s = e
    if fmt is not None:  # the q.col() views give the same
        assert np.array_equal(lowp.grouped_gemm(a.col(), b.col(), offs), dw)


# ---- threads, info, concurrency ----

def test_threads_setting_and_results_independent_of_it():
    x = rng.standard_normal((300, 256)).astype(np.float32)
    w = rng.standard_normal((100, 256)).astype(np.float32)
    try:
        lowp.set_threads(1)
        assert lowp.get_threads() == 1
        q1 = lowp.quantize(x, "e4m3", "mx32", axis="both")
        c1 = lowp.gemm(q1, lowp.quantize(w, "e4m3", "mx32"))
        lowp.set_threads(2)
        q2 = lowp.quantize(x, "e4m3", "mx32", axis="both")
        c2 = lowp.gemm(q2, lowp.quantize(w, "e4m3", "mx32"))
    finally:
        lowp.set_threads(None)
    assert np.array_equal(q1.data_col, q2.data_col)
    assert rel_err(c1, c2.astype(np.float64)) <= 1e-6


def test_info():
    d = lowp.info()
    assert d["version"] == lowp.__version__
    names = [b["name"] for b in d["backends"]]
    assert names[0] == "cpu"
    assert d["cpu"]["cores"] >= 1 and isinstance(d["cpu"]["caps"], list)
    assert "threads" in d


def test_host_block_cache_emptied():
    """A GEMM's workspaces go to lowp's host block cache (on glibc with huge pages and the
    cache on); empty_cache() hands them back and the next GEMM still gives the same result."""
    import os
    import sys
    cache_on = (sys.platform.startswith("linux") and os.environ.get("LOWP_HUGEPAGES") != "0"
                and os.environ.get("LOWP_HOST_CACHE_MB") != "0")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((1024, 1024)).astype(np.float32)
    b = rng.standard_normal((1024, 1024)).astype(np.float32)
    qa, qb = lowp.quantize(a, "e4m3", "mx32"), lowp.quantize(b, "e4m3", "mx32")
    lowp.empty_cache()
    assert lowp.cached_bytes() == 0
    c1 = lowp.gemm(qa, qb)
    if cache_on:
        assert lowp.cached_bytes() >= 256 << 10  # LOWP_HOST_CACHE_MIN
    lowp.empty_cache()
    assert lowp.cached_bytes() == 0
    assert np.array_equal(lowp.gemm(qa, qb), c1)
    lowp.empty_cache()


def test_concurrent_calls_from_python_threads():
    """The GIL is released around kernels: calls from several threads run side by side and
    give the serial results, and each thread's error carries its own message."""
    xs = [rng.standard_normal((128, 256)).astype(np.float32) for _ in range(4)]
    serial = [lowp.quantize(x, "e4m3", "mx32", axis="both") for x in xs]
    results, errors = [None] * 4, [None] * 4
    widths = [32, 64, 96, 256]

    def work(i):
        for _ in range(3):
            results[i] = lowp.quantize(xs[i], "e4m3", "mx32", axis="both")
            try:  # the C library's message (thread-local), not a Python-side check
                lowp.quantize(xs[i], "e4m3", "row", eps=-float(widths[i]) if i < 3 else 0.0)
            except ValueError as e:
                errors[i] = str(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for i in range(4):
        assert np.array_equal(results[i].data, serial[i].data)
        assert np.array_equal(results[i].data_col, serial[i].data_col)
    for i in range(3):
        assert errors[i] == f"lowp_quantize: cfg.eps (-{widths[i]}) must be finite and >= 0"
    assert errors[3] is None


def npu_ref(canon, is_col):
    """Ascend pair layout (include/lowp/layout.h): the block axis padded to even, in pairs."""
    sr, sc = canon.shape
    p = np.zeros((sr, sc + sc % 2), np.uint8)
    p[:, :sc] = canon
    pairs = p.reshape(sr, -1, 2)                     # [sr, ceil(sc/2), 2]
    return np.ascontiguousarray(pairs.transpose(1, 0, 2)) if is_col else pairs


@pytest.mark.parametrize("layout", ["cublas", "npu"])
def test_scale_layouts_roundtrip_and_gemm(layout):
    x = rng.standard_normal((70, 200)).astype(np.float32)
    w = rng.standard_normal((3, 40, 200)).astype(np.float32)
    qc = lowp.quantize(x, "e4m3", "mx32", axis="both")
    q = lowp.quantize(x, "e4m3", "mx32", axis="both", layout=layout)
    assert q.layout == layout and np.array_equal(q.data, qc.data)
    if layout == "npu":
        assert np.array_equal(q.scale, npu_ref(qc.scale, False))
        assert np.array_equal(q.scale_col, npu_ref(qc.scale_col, True))
    else:
        assert q.scale.shape == (128, 8) and q.scale_col.shape == (256, 4)
    for ax in ("row", "col"):
        assert np.array_equal(lowp.dequantize(q, ax), lowp.dequantize(qc, ax))
    assert np.array_equal(lowp.dequantize(q.col()), lowp.dequantize(qc.col()))
    wq, wc = lowp.quantize(w, "e4m3", "mx32", layout=layout), lowp.quantize(w, "e4m3", "mx32")
    offs = np.array([10, 10, 70], np.int32)
    assert np.array_equal(lowp.grouped_gemm(q, wq, offs), lowp.grouped_gemm(qc, wc, offs))
    assert np.array_equal(lowp.gemm(q, q), lowp.gemm(qc, qc))
    with pytest.raises(ValueError, match="layout npu applies to mx32 scales only"):
        lowp.quantize(x, "e4m3", "row", layout="npu")


def test_gil_released_while_a_kernel_runs():
    """A Python thread keeps running while another thread is inside a long GEMM: with the GIL
    held, the main loop would stall for the whole kernel."""
    import time
    n = 768 if SANITIZE else 1536
    lowp.set_threads(1)
    try:
        # Grow the GEMM until one call takes long enough to tell a stall from scheduling noise
        # (a quiet machine runs the first size in a few tens of milliseconds).
        while True:
            a = lowp.quantize(rng.standard_normal((n, 1024)).astype(np.float32), "e4m3", "mx32")
            t0 = time.perf_counter()
            lowp.gemm(a, a)
            kernel = time.perf_counter() - t0
            if kernel > 0.2 or n >= 12288:
                break
            n *= 2
        inside = threading.Event()
        done = threading.Event()

        def run():
            inside.set()
            lowp.gemm(a, a)
            done.set()

        th = threading.Thread(target=run)
        th.start()
        inside.wait()
        last, gap, loops = time.perf_counter(), 0.0, 0
        while not done.is_set():
            now = time.perf_counter()
            gap, last, loops = max(gap, now - last), now, loops + 1
            time.sleep(0.001)
        th.join()
    finally:
        lowp.set_threads(None)
    assert kernel > 0.05, "the kernel is too short to tell"
    assert loops >= 3, "the main thread did not run while the kernel ran"
    assert gap < 0.5 * kernel, f"main thread stalled {gap:.3f} s of a {kernel:.3f} s kernel"


@pytest.mark.parametrize("fa,sa,sb", [("e4m3", "block128", "block128x128"),
                                      ("e4m3", "mx32", "block32x32"),
                                      ("e5m2", "tensor", "tensor"), (None, None, None)])
def test_gemm_kn_reads_b_as_stored(fa, sa, sb):
    """gemm_kn(a, q) for q [K, N] has the bits of gemm(a, q.col()) (the columnwise copy of the
    same input) and is A . B against the float64 product of the dequantized operands."""
    M, N, K = (9, 40, 70) if SANITIZE else (67, 150, 260)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = (rng.standard_normal((K, N)) * np.exp2(rng.integers(-8, 8, (K, 1)))).astype(np.float32)
    if fa is None:
        qa, qb = a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)
        ref = qa.astype(np.float64) @ qb.astype(np.float64)
        col = np.ascontiguousarray(qb.T)
    else:
        qa, qb = lowp.quantize(a, fa, sa), lowp.quantize(b, "e4m3", sb, axis="both")
        ref = deq64(qa) @ deq64(qb)
        col = qb.col()
    c = lowp.gemm_kn(qa, qb)
    assert c.shape == (M, N) and rel_err(c, ref) <= 1e-5
    assert np.array_equal(c.view(np.uint32), lowp.gemm(qa, col).view(np.uint32))


def test_gemm_kn_refuses_one_axis_kinds():
    qa = lowp.quantize(rng.standard_normal((8, 64)).astype(np.float32), "e4m3", "mx32")
    qb = lowp.quantize(rng.standard_normal((64, 32)).astype(np.float32), "e4m3", "mx32")
    with pytest.raises(ValueError, match=r"b.scaling \(mx32\) runs along one axis"):
        lowp.gemm_kn(qa, qb)
    with pytest.raises(ValueError, match=r"a.shape\[1\] \(64\) != b.shape\[0\] \(32\)"):
        lowp.gemm_kn(qa, lowp.quantize(rng.standard_normal((32, 64)).astype(np.float32),
                                       "e4m3", "block32x32"))
