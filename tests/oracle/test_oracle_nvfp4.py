"""lowp's NVFP4 (scalings nv16 and nv16x16, docs/numerics.md section 4b) against the independent
reference of tests/oracle/nvfp4_ref.py, bit for bit: the tensor scale and block scale rules over every
E4M3 code and its rounding boundaries, E2M1 element codes at every code boundary, zeros, binary32
subnormals, Inf and NaN, amax at the top and at the bottom of binary32; rowwise, columnwise and
dual-axis copies, 16x16 tiles, grouped (MoE) copies along tokens, dequantization; the GEMM, the
grouped GEMMs and the [K, N] form against float64 products of the dequantized operands within
section 6's bound; and the errors for unsupported formats, pairs and kernel paths.

Run by ctest with LOWP_LIB set. Prints "N passed, M failed".
"""

import ctypes
import os
import subprocess
import tempfile

import numpy as np

import nvfp4_ref as N
import quant_ref as Q

NV16, NV16X16 = 7, 8
lib = Q.Lib()
d = lib.dll
rep = Q.Report()
rng = np.random.default_rng(20261205)
P = ctypes.POINTER
for name, args in {
    "lowp_qtensor_tensor_scale_offset": [P(Q.QTensor), P(ctypes.c_size_t)],
    "lowp_nvfp4_tensor_scale": [ctypes.c_float, P(ctypes.c_float)],
    "lowp_nvfp4_block_scale": [ctypes.c_float, ctypes.c_float, P(ctypes.c_uint8)],
    "lowp_gemm": [P(Q.QTensor), P(Q.QTensor), P(Q.Tensor), ctypes.c_void_p],
    "lowp_gemm_kn": [P(Q.QTensor), P(Q.QTensor), P(Q.Tensor), ctypes.c_void_p],
    "lowp_grouped_gemm": [P(Q.QTensor), P(Q.QTensor), ctypes.c_void_p, ctypes.c_int32,
                          P(Q.Tensor), ctypes.c_void_p],
    "lowp_grouped_gemm_wgrad": [P(Q.QTensor), P(Q.QTensor), ctypes.c_void_p, ctypes.c_int32,
                                P(Q.Tensor), ctypes.c_void_p],
}.items():
    getattr(d, name).argtypes = args
    getattr(d, name).restype = ctypes.c_int


class GemmCfg(ctypes.Structure):  # lowp_gemm_cfg
    _fields_ = [("accumulate", ctypes.c_int32), ("threads", ctypes.c_int32), ("path", ctypes.c_int)]


# ---- ctypes helpers ----

def new_q(kind, rows, cols, offs=None):
    """A qtensor of E2M1 codes with sentinel-filled buffers of lowp_qtensor_nbytes's sizes."""
    q = Q.QTensor(Q.E2M1, kind, rows, cols, None, None, Q.Device(0, 0), None, 0)
    h = {"q": q, "rows": rows, "cols": cols, "kind": kind}
    if offs is not None:
        h["offs"] = np.ascontiguousarray(offs, np.int32)
        q.group_offs, q.groups = h["offs"].ctypes.data, len(offs)
    db, sb = ctypes.c_size_t(), ctypes.c_size_t()
    lib.check(d.lowp_qtensor_nbytes(ctypes.byref(q), ctypes.byref(db), ctypes.byref(sb)))
    off = ctypes.c_size_t()
    lib.check(d.lowp_qtensor_tensor_scale_offset(ctypes.byref(q), ctypes.byref(off)))
    h["data"], h["scales"] = lib.alloc(db.value), lib.alloc(sb.value)
    h["db"], h["sb"], h["off"] = db.value, sb.value, off.value
    q.data, q.scales = h["data"].ctypes.data, h["scales"].ctypes.data
    return h


def read_q(h):
    """(codes [rows, cols] unpacked, canonical block scales, tensor decode scale, guards intact)."""
    rb = (h["cols"] + 1) // 2
    codes = N.unpack(h["data"][:h["db"]].reshape(h["rows"], rb), h["cols"])
    if h["kind"] == NV16X16:
        sr, sc = N.cdiv(h["rows"], 16), N.cdiv(h["cols"], 16)
    elif "offs" in h:
        sizes = np.diff(np.concatenate([[0], h["offs"].astype(np.int64)]))
        sr, sc = h["rows"], int(sum(N.cdiv(int(n), 16) for n in sizes))
    else:
        sr, sc = h["rows"], N.cdiv(h["cols"], 16)
    scales = h["scales"][:sr * sc].reshape(sr, sc).copy()
    g = h["scales"][h["off"]:h["off"] + 4].view(np.float32)[0]
    guards = bool(np.all(h["data"][h["db"]:] == Q.SENTINEL) and
                  np.all(h["scales"][h["sb"]:] == Q.SENTINEL))
    return codes, scales, g, guards


def quantize(x, kind, orient="both", xfmt=Q.F32, path=Q.PATH_AUTO, threads=0):
    xin = Q.to_bf16_bits(x) if xfmt == Q.BF16 else np.ascontiguousarray(x, np.float32)
    xin, t = lib.input_tensor(xin, xfmt)
    R, C = x.shape
    hr = new_q(kind, R, C) if orient in ("row", "both") else None
    hc = new_q(kind, C, R) if orient in ("col", "both") else None
    c, keep = lib.cfg(path=path, threads=threads)
    lib.check(d.lowp_quantize(ctypes.byref(t), ctypes.byref(hr["q"]) if hr else None,
                              ctypes.byref(hc["q"]) if hc else None, ctypes.byref(c)))
    return {"row": hr, "col": hc}


def check_copy(name, h, x_view, tiles):
    """One copy of lowp's against the reference's quantization of x_view (its rows along K)."""
    codes, scales, g, guards = read_q(h)
    want_c, want_s, want_g = N.quantize(x_view, tiles)
    rep.check(f"{name}: guards", guards)
    rep.arrays_equal(f"{name}: tensor scale", np.float32(g), np.float32(want_g))
    rep.arrays_equal(f"{name}: block scales", scales, want_s)
    rep.arrays_equal(f"{name}: codes", codes, want_c)
    got = dequantize(h)
    rep.arrays_equal(f"{name}: dequantize", got, N.dequantize(want_c, want_s, want_g, tiles))
    return got


def dequantize(h):
    out = np.full(h["rows"] * h["cols"] + 8, np.float32(-7.0), np.float32)
    t = Q.Tensor(Q.F32, h["rows"], h["cols"], out.ctypes.data, Q.Device(0, 0))
    lib.check(d.lowp_dequantize(ctypes.byref(h["q"]), ctypes.byref(t)))
    assert np.all(out[h["rows"] * h["cols"]:] == np.float32(-7.0))
    return out[:h["rows"] * h["cols"]].reshape(h["rows"], h["cols"])


def fast_paths():
    """The fast quantization paths this CPU has, forced (one thread): a refusal fails the test.
    AVX-512 where /proc/cpuinfo lists avx512f, bw and vl, AVX2 (path 4; grouped copies too,
    RNE) where it lists avx2 and fma (unreadable: both assumed)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        flags = ["avx512f", "avx512bw", "avx512vl", "avx2", "fma"]
    has = all(x in flags for x in ("avx512f", "avx512bw", "avx512vl"))
    avx2 = all(x in flags for x in ("avx2", "fma"))
    return (((Q.PATH_AVX512, 1),) if has else ()) + (((4, 1),) if avx2 else ())


def check_all(name, x, kinds=(NV16, NV16X16), xfmts=(Q.F32, Q.BF16)):
    for kind in kinds:
        for xfmt in xfmts:
            xv = Q.bf16_bits_to_f32(Q.to_bf16_bits(x)) if xfmt == Q.BF16 else x
            for orient in ("row", "col", "both"):
                for path, threads in ((Q.PATH_REFERENCE, 1), (Q.PATH_AUTO, 0), (Q.PATH_AUTO, 3)) \
                        + fast_paths():
                    out = quantize(x, kind, orient, xfmt, path, threads)
                    tag = f"{name}/{'nv16' if kind == NV16 else 'nv16x16'}/{Q.FMT_NAMES[xfmt]}"
                    tag += f"/{orient}/path{path}t{threads}"
                    if out["row"]:
                        check_copy(tag + "/row", out["row"], xv, kind == NV16X16)
                    if out["col"]:
                        check_copy(tag + "/col", out["col"], xv.T, kind == NV16X16)


# ---- the scalar rules ----

def test_rules():
    amaxes = [0.0, -0.0, np.inf, np.nan, 2688.0, 1.0, 448.0, 6.0, 1e-45, 1e-40, 1.2e-38,
              np.finfo(np.float32).max, np.finfo(np.float32).tiny, 0.1, 3e38]
    exps = rng.integers(-149, 128, 3000)
    amaxes += list(np.ldexp(rng.uniform(1, 2, 3000), exps).astype(np.float32))
    for a in amaxes:
        a = np.float32(a)
        s = ctypes.c_float()
        lib.check(d.lowp_nvfp4_tensor_scale(float(a), ctypes.byref(s)))
        want = N.tensor_scale(a)[0]
        rep.arrays_equal(f"tensor scale of {a!r}", np.float32(s.value), np.float32(want))
    # Block scales: block amaxes at every E4M3 value, every midpoint between neighbours (the RNE
    # ties), and 1 and 2 ulps either side, under tensor scales from several amaxes.
    vals = N.e4m3_values(np.arange(0, 0x7F, dtype=np.uint8))
    mids = np.concatenate([(vals[:-1] + vals[1:]) / 2, [464.0, 480.0, 1000.0, 2.0 ** -11]])
    pts = np.concatenate([vals, mids]).astype(np.float32)
    near = [pts]
    for k in (1, 2):
        near += [pts.view(np.uint32) + k, np.maximum(pts.view(np.uint32), k) - k]
    pts = np.unique(np.concatenate([p.view(np.float32) if p.dtype == np.uint32 else p
                                    for p in near]))
    for tensor_amax in (np.float32(2688.0), np.float32(1.0), np.float32(3.7e5), np.float32(1e-30)):
        s_enc = N.tensor_scale(tensor_amax)[0]
        t = N.r32(s_enc * N.SIXTH)
        bam = N.r32(pts.astype(np.float64) / t).astype(np.float32)  # land on the points
        bam = np.concatenate([bam, [0.0, np.inf, np.nan]]).astype(np.float32)
        got = np.empty(bam.size, np.uint8)
        for i, b in enumerate(bam):
            c = ctypes.c_uint8()
            lib.check(d.lowp_nvfp4_block_scale(float(b), float(s_enc), ctypes.byref(c)))
            got[i] = c.value
        rep.arrays_equal(f"block scales under amax {tensor_amax}", got,
                         N.block_codes(bam, s_enc))
    c = ctypes.c_uint8()
    rep.check("block scale: encode_scale 0 is refused",
              d.lowp_nvfp4_block_scale(1.0, 0.0, ctypes.byref(c)) == Q.ERR_INVALID_ARG and
              "encode_scale" in lib.last_error())


# ---- quantization ----

def every_scale_code_tensor():
    """Rows of 16: block amaxes at every E4M3 code point and boundary under S = 1 (tensor amax
    2688), elements spread over [-amax, amax] including the E2M1 ties of a power-of-two scale."""
    vals = N.e4m3_values(np.arange(1, 0x7F, dtype=np.uint8))
    mids = (vals[:-1] + vals[1:]) / 2
    pts = np.concatenate([vals, mids, [2.0 ** -10, 2.0 ** -11, 3 * 2.0 ** -11]]) * 6
    pts = pts.astype(np.float32)
    pts = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)),
                          np.nextafter(pts, np.float32(0))])
    rows = []
    fr = np.array([1, -1, 0.5, 0.25, 0.75, 1 / 6, 5 / 6, 0.0, -0.0, 0.125, 7 / 12, 3 / 12,
                   -5 / 12, 2 / 3, 1 / 3, 11 / 12], np.float64)
    for b in pts:
        rows.append(np.float32(b) * rng.permutation(fr).astype(np.float32))
    x = np.array(rows, np.float32)
    x[0, 0] = 2688.0  # the tensor amax: S = 1 exactly
    return x


def e2m1_ties_tensor():
    """Blocks with power-of-two scales 2^k (amax 6 * 2^k) whose elements sit exactly on every
    E2M1 value, every midpoint between neighbours and 1 ulp either side."""
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float64)
    pts = np.concatenate([grid, (grid[:-1] + grid[1:]) / 2])
    pts = np.concatenate([pts, -pts]).astype(np.float32)
    pts = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)),
                          np.nextafter(pts, np.float32(-np.inf))])
    rows = []
    for k in range(-8, 7):
        for i in range(0, pts.size, 15):
            r = np.zeros(16, np.float32)
            chunk = pts[i:i + 15] * np.float32(2.0 ** k)
            r[:chunk.size] = chunk
            r[15] = np.float32(6 * 2.0 ** k)
            rows.append(r)
    x = np.array(rows, np.float32)
    x[0, 15] = 2688.0
    return x


def wide_range_tensor(R, C):
    """Gaussian blocks with magnitudes from 2^-60 to 2^20: block scales from E4M3 0 through the
    subnormals to 448."""
    x = rng.standard_normal((R, C)).astype(np.float32)
    x *= np.exp2(rng.integers(-60, 21, (R, 1))).astype(np.float32)
    x *= np.exp2(rng.integers(-3, 4, (1, C))).astype(np.float32)
    return x


def special_tensors():
    f = np.finfo(np.float32)
    out = {}
    out["zeros"] = np.zeros((5, 33), np.float32)
    z = np.zeros((4, 32), np.float32)
    z[1::2] = -0.0
    z[0, 3] = 1.5
    out["signed zeros"] = z
    x = rng.standard_normal((6, 40)).astype(np.float32)
    x[0, 5], x[2, 17], x[4, 33] = np.nan, np.inf, -np.inf
    out["nan and inf"] = x
    x = rng.standard_normal((3, 48)).astype(np.float32)
    x[1, 7] = -np.inf
    out["inf only"] = x
    x = (rng.standard_normal((4, 20)) * 1e-40).astype(np.float32)  # binary32 subnormals
    out["subnormal input"] = x
    x = rng.standard_normal((4, 36)).astype(np.float32) * np.float32(1e-44)
    out["tiny amax"] = x
    x = rng.uniform(-1, 1, (5, 23)).astype(np.float32) * f.max
    x[2, 4] = f.max
    out["amax at the top"] = x
    x = rng.standard_normal((3, 17)).astype(np.float32)
    x[1, 1] = f.max
    out["one huge element"] = x
    return out


def test_quantize():
    check_all("every E4M3 scale code", every_scale_code_tensor(), kinds=(NV16,))
    check_all("every E2M1 tie", e2m1_ties_tensor(), kinds=(NV16,))
    check_all("wide range", wide_range_tensor(48, 80))
    for shape in ((1, 1), (1, 15), (17, 16), (31, 47), (16, 16), (33, 65), (64, 96)):
        check_all(f"gaussian {shape}", rng.standard_normal(shape).astype(np.float32))
    # above the dispatcher's 32768 elements: bands of rows on several threads
    check_all("threads", wide_range_tensor(262, 161), xfmts=(Q.F32,))
    for name, x in special_tensors().items():
        check_all(name, x)


def quantize_grouped(x, offs, xfmt=Q.F32, path=Q.PATH_AUTO, rounding=0):
    """lowp_quantize_grouped's nv16 copy of x [M, K] (rounding 0 RNE, 1 SR)."""
    xin = Q.to_bf16_bits(x) if xfmt == Q.BF16 else np.ascontiguousarray(x, np.float32)
    xin, t = lib.input_tensor(xin, xfmt)
    M, K = x.shape
    h = new_q(NV16, K, M, offs)
    c, keep = lib.cfg(path=path)
    c.rounding = rounding
    lib.check(d.lowp_quantize_grouped(ctypes.byref(t), None, ctypes.byref(h["q"]),
                                      ctypes.byref(c)))
    return h


def test_grouped():
    cases = [(70, 24, [0, 17, 17, 50, 64]), (40, 16, [40]), (33, 20, [1, 2, 3, 33]),
             (48, 8, [16, 32])]
    for M, K, offs in cases:
        x = wide_range_tensor(M, K)
        x[M - 1, 0] = 1e30  # past offs[-1] when offs[-1] < M: must not set the tensor scale
        for xfmt in (Q.F32, Q.BF16):
            xv = Q.bf16_bits_to_f32(Q.to_bf16_bits(x)) if xfmt == Q.BF16 else x
            wc, ws, wg = N.quantize_grouped(xv, offs)
            for path in (Q.PATH_REFERENCE, Q.PATH_AUTO) + tuple(p for p, _ in fast_paths()):
                h = quantize_grouped(x, offs, xfmt, path)
                check_grouped(f"grouped {M}x{K} offs {offs} {Q.FMT_NAMES[xfmt]} path {path}",
                              h, offs, wc, ws, wg)


def check_grouped(tag, h, offs, wc, ws, wg):
    """A grouped copy h against the oracle's codes wc, block scales ws and tensor scale wg."""
    K, M = wc.shape
    codes, scales, g, guards = read_q(h)
    rep.check(tag + ": guards", guards)
    rep.arrays_equal(tag + ": tensor scale", np.float32(g), np.float32(wg))
    rep.arrays_equal(tag + ": block scales", scales, ws)
    rep.arrays_equal(tag + ": codes", codes, wc)
    # dequantize: each group's blocks, tokens past the last group decode to 0
    want = np.zeros((K, M), np.float32)
    start, col = 0, 0
    for end in offs:
        nb = N.cdiv(end - start, 16)
        if end > start:
            want[:, start:end] = N.dequantize(wc[:, start:end], ws[:, col:col + nb], wg)
        col += nb
        start = end
    rep.arrays_equal(tag + ": dequantize", dequantize(h), want)


# ---- GEMM ----

def gemm_bound(a, b, K, fast=False):
    """Section 6: each 16-block's scaled sum is exact, the K/16 block sums are added in binary32
    and the two tensor decode scales are applied by two rounded multiplies; the dequantized
    operands are each rounded once. Elementwise bound: (K/16 + 6) u (|A| |B|^T), u = 2^-24;
    the fast kernels (fast) add every product: (K + 6) u (|A| |B|^T)."""
    return ((K if fast else N.cdiv(K, 16)) + 6) * 2.0 ** -24 * (np.abs(a) @ np.abs(b).T)


def check_gemm(tag, got, a, b, K, fast=False):
    want = a.astype(np.float64) @ b.astype(np.float64).T
    nan_ok = np.array_equal(np.isnan(got), np.isnan(want))
    fin = ~np.isnan(want)
    err = np.abs(got.astype(np.float64) - want)
    bound = gemm_bound(a, b, K, fast)
    ok = nan_ok and bool(np.all(err[fin] <= bound[fin]))
    over = err[fin] - bound[fin]
    worst = float(np.max(over)) if over.size else 0.0
    rep.check(tag, ok, [f"NaN positions equal: {nan_ok}; largest error - bound {worst:.3g}"])


def out_tensor(M, Nn):
    c = np.full((M, Nn), np.float32(-9.0), np.float32)
    return c, Q.Tensor(Q.F32, M, Nn, c.ctypes.data, Q.Device(0, 0))


def test_gemm():
    # the last one has more than 2^22 multiply-adds: pieces on several threads
    for M, Nn, K in ((1, 1, 16), (7, 5, 33), (33, 17, 64), (20, 48, 160), (200, 190, 112)):
        x = wide_range_tensor(M, K) if K > 33 else rng.standard_normal((M, K)).astype(np.float32)
        w = rng.standard_normal((Nn, K)).astype(np.float32) * np.float32(3e-3)
        for kb in (NV16, NV16X16):
            ha = quantize(x, NV16, "row")["row"]
            hb = quantize(w, kb, "both")
            deq_a = dequantize(ha)
            c, t = out_tensor(M, Nn)
            cfg = GemmCfg(0, 0, Q.PATH_AUTO)
            lib.check(d.lowp_gemm(ctypes.byref(ha["q"]), ctypes.byref(hb["row"]["q"]),
                                  ctypes.byref(t), ctypes.byref(cfg)))
            check_gemm(f"gemm {M}x{Nn}x{K} nv16 x {kb}", c, deq_a, dequantize(hb["row"]), K)
            if kb == NV16X16:  # the weight's [K, N] copy read as stored: the same bytes
                c2, t2 = out_tensor(M, Nn)
                lib.check(d.lowp_gemm_kn(ctypes.byref(ha["q"]), ctypes.byref(hb["col"]["q"]),
                                         ctypes.byref(t2), ctypes.byref(cfg)))
                rep.arrays_equal(f"gemm_kn {M}x{Nn}x{K} == gemm", c2, c)
    # NaN and Inf blocks propagate as NaN
    x = rng.standard_normal((4, 32)).astype(np.float32)
    x[1, 20] = np.nan
    x[3, 3] = np.inf
    ha = quantize(x, NV16, "row")["row"]
    hb = quantize(rng.standard_normal((3, 32)).astype(np.float32), NV16, "row")["row"]
    c, t = out_tensor(4, 3)
    lib.check(d.lowp_gemm(ctypes.byref(ha["q"]), ctypes.byref(hb["q"]), ctypes.byref(t), None))
    rep.check("gemm: NaN/Inf rows are NaN", bool(np.isnan(c[[1, 3]]).all() and
                                                 np.isfinite(c[[0, 2]]).all()))


def test_grouped_gemm():
    M, Nn, K, G = 50, 12, 48, 3
    offs = np.array([10, 10, 37], np.int32)
    x = rng.standard_normal((M, K)).astype(np.float32)
    ha = quantize(x, NV16, "row")["row"]
    ws = [quantize(rng.standard_normal((Nn, K)).astype(np.float32), NV16X16, "row")["row"]
          for _ in range(G)]
    arr = (Q.QTensor * G)(*[w["q"] for w in ws])
    c, t = out_tensor(M, Nn)
    lib.check(d.lowp_grouped_gemm(ctypes.byref(ha["q"]), arr, offs.ctypes.data, G,
                                  ctypes.byref(t), None))
    deq = dequantize(ha)
    start = 0
    for g in range(G):
        end = int(offs[g])
        if end > start:
            check_gemm(f"grouped gemm group {g}", c[start:end], deq[start:end],
                       dequantize(ws[g]), K)
        start = end
    rep.check("grouped gemm: rows past offs untouched", bool(np.all(c[37:] == -9.0)))
    # split-K wgrad: dW[g] = dY_g^T X_g, both quantized along tokens per group
    dy = rng.standard_normal((M, Nn)).astype(np.float32)
    offs2 = np.array([5, 21, 21, 50], np.int32)
    hdy, hx = quantize_grouped(dy, offs2), quantize_grouped(x, offs2)
    c, t = out_tensor(4 * Nn, K)
    lib.check(d.lowp_grouped_gemm_wgrad(ctypes.byref(hdy["q"]), ctypes.byref(hx["q"]),
                                        offs2.ctypes.data, 4, ctypes.byref(t), None))
    ddy, dx = dequantize(hdy), dequantize(hx)
    start = 0
    for g in range(4):
        end = int(offs2[g])
        check_gemm(f"wgrad group {g}", c[g * Nn:(g + 1) * Nn], ddy[:, start:end],
                   dx[:, start:end], max(end - start, 1))
        start = end


def raw_operand(codes, scales, kind=NV16):
    """An NVFP4 operand from E2M1 codes [rows, cols] and E4M3 block scale codes, D = 1."""
    h = new_q(kind, *codes.shape)
    packed = N.pack(codes).reshape(-1)
    h["data"][:packed.size] = packed
    h["scales"][:scales.size] = scales.reshape(-1)
    h["scales"][h["off"]:h["off"] + 4] = np.array([1.0], np.float32).view(np.uint8)
    return h


def cpu_has(name):
    """Whether /proc/cpuinfo lists the instructions of kernel path `name` (unknown: True)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        return True
    need = {"avx512": ("avx512f", "avx512bw", "avx512vl"), "amx": ("amx_bf16", "avx512f"),
            "avx2": ("avx2", "fma")}
    return all(x in flags for x in need[name])


def test_gemm_fast_paths():
    """The AVX-512 and AMX kernels fold each E4M3 block scale into the E2M1 elements (exact in
    BF16) and sum all of K in binary32, so every addition may round: against float64 their
    bound is (K + 6) u (|A| |B|^T), where the reference's is (ceil(K/16) + 6) u (section 6). The
    last case loses its small blocks' products one by one against a large partial sum, where
    the reference adds each block's exact sum once. The AVX2 kernel sums by blocks as the
    reference does: its bound."""
    for path, name in ((Q.PATH_AVX512, "avx512"), (3, "amx"), (4, "avx2")):
        for M, Nn, K, kb in ((5, 3, 7, NV16), (33, 17, 1000, NV16X16), (64, 48, 4096, NV16X16),
                             (40, 70, 129, NV16)):
            x = wide_range_tensor(M, K) if K > 33 else rng.standard_normal((M, K)).astype(np.float32)
            w = rng.standard_normal((Nn, K)).astype(np.float32)
            ha, hb = quantize(x, NV16, "row")["row"], quantize(w, kb, "row")["row"]
            c, t = out_tensor(M, Nn)
            st = d.lowp_gemm(ctypes.byref(ha["q"]), ctypes.byref(hb["q"]), ctypes.byref(t),
                             ctypes.byref(GemmCfg(0, 1, path)))
            if st == Q.ERR_UNSUPPORTED and not cpu_has(name):
                print(f"test_gemm_fast_paths: no {name} on this CPU: skipped")
                break
            lib.check(st)
            check_gemm(f"{name} gemm {M}x{Nn}x{K} nv16 x {kb}", c, dequantize(ha),
                       dequantize(hb), K, fast=name != "avx2")
        else:
            # Block 0: two products 2688^2 (the partial sum 14450688, ulp 1); blocks 1-7: eight
            # products 0.5 each (even k; odd k zero), each a tie that a sequential sum loses.
            K = 128
            ca, cb = np.zeros((1, K), np.uint8), np.zeros((1, K), np.uint8)
            ca[0, :2] = cb[0, :2] = 7  # 6
            ca[0, 16::2] = 1           # 0.5
            cb[0, 16::2] = 2           # 1
            sa = np.full((1, K // 16), 0x38, np.uint8)  # 1
            sa[0, 0] = 0x7E                             # 448
            ha, hb = raw_operand(ca, sa), raw_operand(cb, sa.copy())
            want = 2 * 2688.0 ** 2 + 56 * 0.5
            for p in (Q.PATH_REFERENCE, path):
                c, t = out_tensor(1, 1)
                lib.check(d.lowp_gemm(ctypes.byref(ha["q"]), ctypes.byref(hb["q"]),
                                      ctypes.byref(t), ctypes.byref(GemmCfg(0, 1, p))))
                ok = c[0, 0] == want if p in (Q.PATH_REFERENCE, 4) else \
                    abs(c[0, 0] - want) <= (K + 6) * 2.0 ** -24 * want
                rep.check(f"{name} ties lost against a large sum, path {p}", ok,
                          [f"got {c[0, 0]!r}, exact {want!r}"])


# ---- errors ----

def status_of(fn):
    try:
        fn()
    except Q.LowpError as e:
        return e.status, e.message
    return Q.OK, ""


def test_errors():
    x = rng.standard_normal((4, 32)).astype(np.float32)
    xin, t = lib.input_tensor(x, Q.F32)
    h = new_q(NV16, 4, 32)
    h["q"].format = Q.E4M3
    c, keep = lib.cfg()
    st = d.lowp_quantize(ctypes.byref(t), ctypes.byref(h["q"]), None, ctypes.byref(c))
    msg = lib.last_error()
    rep.check("nv16 with e4m3 elements is refused", st == Q.ERR_UNSUPPORTED and
              "row_out.format (e4m3)" in msg and "nv16" in msg, [msg])
    st, msg = status_of(lambda: quantize_grouped(x, [4], path=4, rounding=1))  # AVX2, SR
    rep.check("grouped nv16 SR on the AVX2 path is refused", st == Q.ERR_UNSUPPORTED and
              "AVX2" in msg, [msg])
    ha = quantize(x, NV16, "row")["row"]
    hm = Q.Lib.alloc(0)  # an mx32 e2m1 operand
    qm = Q.QTensor(Q.E2M1, Q.MX32, 3, 32, hm.ctypes.data, hm.ctypes.data, Q.Device(0, 0), None, 0)
    c, t = out_tensor(4, 3)
    st = d.lowp_gemm(ctypes.byref(ha["q"]), ctypes.byref(qm), ctypes.byref(t), None)
    msg = lib.last_error()
    rep.check("nv16 x mx32 is refused", st == Q.ERR_UNSUPPORTED and "nv16" in msg, [msg])
    st = d.lowp_gemm_kn(ctypes.byref(ha["q"]), ctypes.byref(quantize(
        rng.standard_normal((32, 3)).astype(np.float32), NV16, "row")["row"]["q"]),
        ctypes.byref(t), None)
    msg = lib.last_error()
    rep.check("gemm_kn with an nv16 b is refused", st == Q.ERR_UNSUPPORTED and "nv16" in msg,
              [msg])
    off = ctypes.c_size_t()
    qm.format, qm.scaling = Q.E4M3, Q.MX32
    st = d.lowp_qtensor_tensor_scale_offset(ctypes.byref(qm), ctypes.byref(off))
    rep.check("tensor scale offset of mx32 is refused", st == Q.ERR_INVALID_ARG and
              "mx32" in lib.last_error(), [lib.last_error()])


def test_sizes():
    for kind, R, C, blk in ((NV16, 5, 33, 5 * 3), (NV16, 1, 16, 1), (NV16X16, 17, 33, 2 * 3),
                            (NV16X16, 16, 16, 1)):
        h = new_q(kind, R, C)
        want_off = -(-blk // 4) * 4
        rep.check(f"nbytes {kind} {R}x{C}", h["db"] == R * ((C + 1) // 2) and
                  h["off"] == want_off and h["sb"] == want_off + 4,
                  [f"data {h['db']} scales {h['sb']} offset {h['off']}"])


# ---- the command line ----

def test_cli():
    """`lowp gemm --format e2m1 --scaling nv16 --b-scaling nv16x16` writes lowp_gemm's bytes."""
    cli = os.environ.get("LOWP_CLI")
    if not cli:
        return
    a = wide_range_tensor(24, 80)
    b = rng.standard_normal((9, 80)).astype(np.float32)
    with tempfile.TemporaryDirectory() as d:
        pa, pb, pc = (os.path.join(d, n) for n in ("a.npy", "b.npy", "c.npy"))
        np.save(pa, a)
        np.save(pb, b)
        for kb in ("nv16", "nv16x16"):
            r = subprocess.run([cli, "gemm", "--format", "e2m1", "--scaling", "nv16",
                                "--b-scaling", kb, pa, pb, pc], capture_output=True, text=True)
            if not rep.check(f"lowp gemm nv16 x {kb}: exit 0", r.returncode == 0, [r.stderr]):
                continue
            ha = quantize(a, NV16, "row")["row"]
            hb = quantize(b, NV16 if kb == "nv16" else NV16X16, "row")["row"]
            c, t = out_tensor(24, 9)
            lib.check(d_gemm(ha, hb, t))
            rep.arrays_equal(f"lowp gemm nv16 x {kb} == lowp_gemm", np.load(pc), c)
        r = subprocess.run([cli, "gemm", "--format", "e2m1", "--scaling", "nv32", pa, pb, pc],
                           capture_output=True, text=True)
        rep.check("lowp gemm --scaling nv32 is refused naming nv16", r.returncode == 2 and
                  "nv16" in r.stderr, [r.stderr])


def d_gemm(ha, hb, t):
    return d.lowp_gemm(ctypes.byref(ha["q"]), ctypes.byref(hb["q"]), ctypes.byref(t), None)


if __name__ == "__main__":
    test_sizes()
    test_rules()
    test_quantize()
    test_grouped()
    test_gemm()
    test_grouped_gemm()
    test_gemm_fast_paths()
    test_errors()
    test_cli()
    rep.finish()
