"""Stochastic rounding of FP4 quantization and the random Hadamard transform (docs/numerics.md
4b), against independent references written from the document: a numpy Philox4x32-10 (checked
against the Random123 known-answer vector), section 2's SR rule on exact integers, the NVFP4
scale rules of nvfp4_ref.py and the MX rules of quant_ref.py; the transform as a numpy float32
butterfly (bit for bit) and as float64 matrices (H16 diag(s) x / 4, and its inverse).

Checked: SR codes of nv16, nv16x16 and mx32 (E2M1, RCEIL) copies, rowwise, columnwise and
grouped, several seeds and offsets, byte for byte, with the scales equal to RNE's; zeros,
binary32 subnormals, Inf and NaN blocks; SR unbiased (the mean of many draws); the errors naming
cfg.rounding; lowp_hadamard16 on partial blocks, groups, BF16 input, NaN and Inf, and its errors.

Run by ctest with LOWP_LIB set. Prints "N passed, M failed".
"""

import ctypes

import ml_dtypes
import numpy as np

import nvfp4_ref as N
import quant_ref as Q

NV16, NV16X16, MX32 = 7, 8, Q.MX32
RNE, SR = 0, 1
lib = Q.Lib()
d = lib.dll
rep = Q.Report()
rng = np.random.default_rng(38)
P = ctypes.POINTER


class HadamardCfg(ctypes.Structure):  # lowp_hadamard_cfg
    _fields_ = [("seed", ctypes.c_uint64), ("offset", ctypes.c_uint64),
                ("group_offs", ctypes.c_void_p), ("groups", ctypes.c_int32),
                ("threads", ctypes.c_int32)]


for name, args in {
    "lowp_qtensor_nbytes": [P(Q.QTensor), P(ctypes.c_size_t), P(ctypes.c_size_t)],
    "lowp_qtensor_tensor_scale_offset": [P(Q.QTensor), P(ctypes.c_size_t)],
    "lowp_hadamard16": [P(Q.Tensor), P(Q.Tensor), P(HadamardCfg)],
    "lowp_hadamard_cfg_init": [P(HadamardCfg)],
    "lowp_philox_fill": [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t],
}.items():
    getattr(d, name).argtypes = args
    getattr(d, name).restype = ctypes.c_int


# ---- Philox4x32-10 (Salmon et al. 2011), numpy, from the paper's definition ----

def philox_blocks(ctr_lo, ctr_hi, seed):
    """Philox4x32-10 of the counters {lo, hi, 0, 0} (uint64 arrays of uint32 values), key
    {lo32(seed), hi32(seed)}: the four output lanes."""
    m0, m1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    mask = np.uint64(0xFFFFFFFF)
    c = [np.asarray(ctr_lo, np.uint64), np.asarray(ctr_hi, np.uint64),
         np.zeros_like(ctr_lo, np.uint64), np.zeros_like(ctr_lo, np.uint64)]
    k0, k1 = seed & 0xFFFFFFFF, seed >> 32
    for rnd in range(10):
        p0, p1 = m0 * c[0], m1 * c[2]
        hi0, lo0, hi1, lo1 = p0 >> np.uint64(32), p0 & mask, p1 >> np.uint64(32), p1 & mask
        c = [hi1 ^ c[1] ^ np.uint64(k0), lo1, hi0 ^ c[3] ^ np.uint64(k1), lo0]
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return c


def philox_words(seed, offset, n):
    """Words offset .. offset + n - 1 of stream seed (docs/numerics.md section 7)."""
    j = np.arange(offset, offset + n, dtype=np.uint64)
    b = j >> np.uint64(2)
    lanes = philox_blocks(b & np.uint64(0xFFFFFFFF), b >> np.uint64(32), seed)
    lane = (j & np.uint64(3)).astype(np.int64)
    out = np.choose(lane, lanes) if n else np.zeros(0, np.uint64)
    return out.astype(np.uint32)


def check_philox():
    kat = philox_blocks(np.zeros(1, np.uint64), np.zeros(1, np.uint64), 0)
    rep.check("philox: Random123 KAT (ctr 0, key 0)",
              [int(v[0]) for v in kat] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8])
    for seed, off in [(0, 0), (1234, 7), ((5 << 32) | 99, (1 << 34) + 3)]:
        got = np.zeros(41, np.uint32)
        d.lowp_philox_fill(seed, off, got.ctypes.data, 41)
        rep.check("philox: words of seed %d offset %d" % (seed, off),
                  np.array_equal(got, philox_words(seed, off, 41)))


# ---- section 2's SR, E2M1, on exact integers ----

MAG_CODE = {0.0: 0, 0.5: 1, 1.0: 2, 1.5: 3, 2.0: 4, 3.0: 5, 4.0: 6, 6.0: 7}


def sr_e2m1(v, r):
    """E2M1 codes of binary32 values v (no NaN) with 32-bit random words r: |v| as a fixed-point
    number of target quanta (0.5 below 2, 1 in [2, 4), 2 from 4) with 32 fraction bits,
    truncated, plus r, the fraction truncated; then saturation at 6; the sign kept."""
    v = np.asarray(v, np.float32).ravel()
    r = np.asarray(r, np.uint32).ravel()
    out = np.zeros(v.size, np.uint8)
    for i, (x, w) in enumerate(zip(v.astype(np.float64), r.astype(np.int64))):
        a = abs(x)
        if np.isinf(a) or a >= 8.0:
            m = 6.0
        else:
            quantum = 0.5 if a < 2.0 else 1.0 if a < 4.0 else 2.0
            fixed = int(np.floor(a / quantum * 2.0 ** 32))  # exact: a power-of-two scaling
            m = min(((fixed + int(w)) >> 32) * quantum, 6.0)
        out[i] = MAG_CODE[m] | (8 if np.signbit(x) else 0)
    return out


# ---- scaled values of each rule (the input of the element encode) ----

def nv_scaled(x, tiles, s_enc, s_dec):
    """NVFP4 steps 2-3 on x along its rows: (x * f per element [R, C], NaN-block mask)."""
    x = np.asarray(x, np.float64)
    R, C = x.shape
    br = N.BS if tiles else 1
    b, shape = N._blocks(x, br, N.BS)
    with np.errstate(invalid="ignore"):
        bamax = np.max(np.abs(b), axis=2)
    bamax = np.where(np.isnan(b).any(axis=2), np.nan, bamax)
    codes = N.block_codes(bamax, s_enc)
    f = N.elem_factor(codes, s_dec)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = N.r32(b * f[:, :, None])
    nanblk = np.broadcast_to((codes == 0x7F)[:, :, None], b.shape)
    return (N._unblocks(scaled, br, N.BS, shape, R, C),
            N._unblocks(nanblk.astype(np.float64), br, N.BS, shape, R, C) > 0)


def mx_scaled(x):
    """MX32 E2M1 RCEIL along x's rows: (x * 2^(127-code) per element, NaN-block mask)."""
    x = np.asarray(x, np.float32)
    R, C = x.shape
    amax = Q.block_amax(x, MX32)
    codes = Q.e8m0_code(amax, Q.E2M1, Q.RCEIL)
    f = Q.pow2_f32(127 - np.where(codes == 255, 0, codes).astype(np.int64))
    with np.errstate(all="ignore"):
        scaled = (x * Q.expand(f, 1, 32, R, C)).astype(np.float32)
    return scaled, Q.expand(codes == 255, 1, 32, R, C)


def sr_codes(scaled, nanblk, seed, offset):
    """SR codes of a copy [R, C]: element i (row-major) uses word offset + i; a NaN block's
    elements are 0."""
    R, C = scaled.shape
    words = philox_words(seed, offset, R * C).reshape(R, C)
    safe = np.where(nanblk, 0.0, scaled).astype(np.float32)
    codes = sr_e2m1(safe, words).reshape(R, C)
    codes[nanblk] = 0
    return codes


def oracle_copy(x, kind, seed, offset, s=None):
    """Expected SR codes of the rowwise quantization of x [R, C] (pass x^T for a col copy);
    s: the tensor scales (S, D) for NVFP4 kinds, those of x itself when None."""
    if kind == MX32:
        scaled, nanblk = mx_scaled(x)
    else:
        s = s or N.tensor_scale(N.tensor_amax(x))
        scaled, nanblk = nv_scaled(x, kind == NV16X16, *s)
    return sr_codes(scaled, nanblk, seed, offset)


# ---- ctypes ----

def new_q(kind, rows, cols, offs=None):
    q = Q.QTensor(Q.E2M1, kind, rows, cols, None, None, Q.Device(0, 0), None, 0)
    keep = {}
    if offs is not None:
        keep["offs"] = np.ascontiguousarray(offs, np.int32)
        q.group_offs, q.groups = keep["offs"].ctypes.data, len(offs)
    db, sb = ctypes.c_size_t(), ctypes.c_size_t()
    lib.check(d.lowp_qtensor_nbytes(ctypes.byref(q), ctypes.byref(db), ctypes.byref(sb)))
    keep["data"] = np.full(db.value, 0xA5, np.uint8)
    keep["scales"] = np.full(max(sb.value, 1), 0xA5, np.uint8)
    q.data, q.scales = keep["data"].ctypes.data, keep["scales"].ctypes.data
    return q, keep


def cfg(rounding, seed=0, offset=0, mode=Q.SCALE_DEFAULT):
    c = Q.QuantCfg()
    lib.check(d.lowp_quant_cfg_init(ctypes.byref(c)))
    c.rounding, c.seed, c.offset, c.scale_mode = rounding, seed, offset, mode
    return c


def quantize(x, kind, orient, rounding, seed=0, offset=0, mode=Q.SCALE_DEFAULT):
    """(status, {orient: (codes unpacked [rows, cols], scale bytes)})."""
    x = np.ascontiguousarray(x, np.float32)
    R, C = x.shape
    t = Q.Tensor(Q.F32, R, C, x.ctypes.data, Q.Device(0, 0))
    outs = {}
    if orient in ("row", "both"):
        outs["row"] = new_q(kind, R, C)
    if orient in ("col", "both"):
        outs["col"] = new_q(kind, C, R)
    c = cfg(rounding, seed, offset, mode)
    st = d.lowp_quantize(ctypes.byref(t), ctypes.byref(outs["row"][0]) if "row" in outs else None,
                         ctypes.byref(outs["col"][0]) if "col" in outs else None, ctypes.byref(c))
    res = {}
    for k, (q, keep) in outs.items():
        res[k] = (N.unpack(keep["data"][: q.rows * ((q.cols + 1) // 2)].reshape(q.rows, -1),
                           q.cols), keep["scales"].copy())
    return st, res


def quantize_grouped(x, offs, kind, rounding, seed=0, offset=0):
    """lowp_quantize_grouped's columnwise copy of x [M, K]: (codes [K, M], scale bytes, status).
    The call takes (x, col, cfg), or (x, row, col, cfg) where quant_ref's Lib declares four
    arguments (row None here)."""
    x = np.ascontiguousarray(x, np.float32)
    M, K = x.shape
    t = Q.Tensor(Q.F32, M, K, x.ctypes.data, Q.Device(0, 0))
    q, keep = new_q(kind, K, M, offs)
    c = cfg(rounding, seed, offset, Q.RCEIL if kind == MX32 else Q.SCALE_DEFAULT)
    f = d.lowp_quantize_grouped
    if len(f.argtypes or []) == 4:
        st = f(ctypes.byref(t), None, ctypes.byref(q), ctypes.byref(c))
    else:
        st = f(ctypes.byref(t), ctypes.byref(q), ctypes.byref(c))
    codes = N.unpack(keep["data"][: K * ((M + 1) // 2)].reshape(K, -1), M)
    return codes, keep["scales"].copy(), st


# ---- the SR tests ----

def awkward(R, C, scale=3.0):
    x = (rng.standard_normal((R, C)) * scale).astype(np.float32)
    x[0, :5] = [0.0, -0.0, 1e-40, -1e-42, 2.5]  # zeros, binary32 subnormals, a tie
    return x


def check_sr_copies():
    for kind, name in [(NV16, "nv16"), (NV16X16, "nv16x16"), (MX32, "mx32")]:
        for (R, C), seed, offset in [((37, 50), 1, 0), ((16, 64), 2 ** 40 + 5, 12345),
                                     ((5, 33), 77, 2 ** 33 + 1)]:
            x = awkward(R, C)
            if kind != NV16X16:
                x[2, 32:48] = np.nan  # a NaN block (rowwise)
                x[3, 5] = np.inf
            for orient in ("row", "col", "both"):
                st, got = quantize(x, kind, orient, SR, seed, offset)
                _, rne = quantize(x, kind, orient, RNE)
                label = "%s %s %dx%d seed %d offset %d" % (name, orient, R, C, seed, offset)
                if st != 0:
                    rep.fail(label, [lib.last_error()])
                    continue
                s = None if kind == MX32 else N.tensor_scale(N.tensor_amax(x))
                for k, src in (("row", x), ("col", x.T)):
                    if k not in got:
                        continue
                    want = oracle_copy(np.ascontiguousarray(src), kind, seed, offset, s)
                    codes, scales = got[k]
                    bad = np.argwhere(codes != want)
                    rep.check("sr %s: %s codes" % (label, k), bad.size == 0,
                              ["first differences at %s: got %s want %s" % (
                                  bad[:3].tolist(), codes[tuple(bad[:3].T)].tolist(),
                                  want[tuple(bad[:3].T)].tolist())] if bad.size else [])
                    rep.check("sr %s: %s scales equal RNE's" % (label, k),
                              np.array_equal(scales, rne[k][1]))
                    rep.check("sr %s: %s differs from RNE somewhere" % (label, k),
                              not np.array_equal(codes, rne[k][0]))


def check_sr_grouped():
    M, K = 70, 24
    x = awkward(M, K)
    for kind, offs in [(NV16, [10, 10, 43, 60]), (MX32, [33, 70])]:
        for seed, offset in [(9, 0), (123456789, 999)]:
            codes, scales, st = quantize_grouped(x, offs, kind, SR, seed, offset)
            _, rne_scales, _ = quantize_grouped(x, offs, kind, RNE)
            used = offs[-1]
            s = N.tensor_scale(N.tensor_amax(x[:used])) if kind != MX32 else None
            want = np.zeros((K, M), np.uint8)
            start = 0
            for end in offs:
                if end > start:  # each group's block rule, words by index in the whole copy
                    xt = np.ascontiguousarray(x[start:end].T)
                    if kind == MX32:
                        sc, nb = mx_scaled(xt)
                    else:
                        sc, nb = nv_scaled(xt, False, *s)
                    words = philox_words(seed, offset, K * M).reshape(K, M)[:, start:end]
                    g = sr_e2m1(np.where(nb, 0.0, sc).astype(np.float32), words).reshape(
                        K, end - start)
                    g[nb] = 0
                    want[:, start:end] = g
                start = end
            label = "sr grouped kind %d seed %d offset %d" % (kind, seed, offset)
            rep.check(label + ": codes", st == 0 and np.array_equal(codes, want),
                      [lib.last_error()])
            rep.check(label + ": scales equal RNE's", np.array_equal(scales, rne_scales))


def check_unbiased():
    """The mean of many SR draws of one tensor approaches x: for each element the error of a
    draw is at most one quantum q and has mean 0, so the mean of n draws has a standard
    deviation below q / (2 sqrt(n)); over all elements the mean error is checked within 5
    sigma, and each element within 6 sigma. RNE's error does not shrink with n (its bias on
    this data is checked to exceed the bound, so the test can fail). Each block's largest element
    is left out (see below)."""
    R, C, n = 4, 64, 400
    x = (rng.uniform(-5.0, 5.0, (R, C))).astype(np.float32)
    s_enc, s_dec = N.tensor_scale(N.tensor_amax(x))
    acc = np.zeros((R, C))
    for k in range(n):
        st, got = quantize(x, NV16, "row", SR, 2026, k * R * C)
        codes, scales = got["row"]
        sb = scales[: R * (C // 16)].reshape(R, C // 16)
        acc += N.dequantize(codes, sb, np.float32(s_dec))
    mean = acc / n
    _, rne = quantize(x, NV16, "row", RNE)
    rcodes, rsc = rne["row"]
    deq_rne = N.dequantize(rcodes, rsc[: R * (C // 16)].reshape(R, C // 16), np.float32(s_dec))
    q = N.e4m3_values(N.expand_scales(rsc[: R * (C // 16)].reshape(R, C // 16), R, C)) * \
        np.float64(s_dec) * 2.0  # the largest E2M1 quantum (2) times the block's scale
    sigma = q / (2.0 * np.sqrt(n))
    # A block's maximum may scale past 6 by the rounding of its E4M3 scale (4b step 2) and
    # saturate there: SR is unbiased below saturation only, so those elements are left out.
    bmax = np.repeat(np.abs(x).reshape(R, C // 16, 16).max(axis=2), 16, axis=1)
    keep = np.abs(x) < bmax
    err = np.where(keep, mean - x, 0.0)
    sigma = np.where(keep, sigma, 0.0)
    q = np.where(keep, q, 1.0)
    rep.check("sr unbiased: every element within 6 sigma", np.all(np.abs(err) <= 6 * sigma),
              ["worst |err|/sigma %.2f" % np.max(np.abs(err) / np.where(keep, sigma, 1.0))])
    tot = np.sum(err) / np.sqrt(np.sum(sigma ** 2))
    rep.check("sr unbiased: total error within 5 sigma (%.2f)" % tot, abs(tot) < 5)
    rne_tot = np.sum(np.where(keep, np.abs(deq_rne - x), 0.0)) / np.sqrt(np.sum(sigma ** 2))
    print("sr unbiased: %d draws, total error %.2f sigma, worst element %.2f sigma; RNE %.1f sigma"
          % (n, tot, np.max(np.abs(err) / np.where(keep, sigma, 1.0)), rne_tot))
    rep.check("sr unbiased: RNE's error is beyond that bound (%.1f sigma)" % rne_tot,
              rne_tot > 5)


def check_sr_errors():
    x = awkward(4, 32)
    t = Q.Tensor(Q.F32, 4, 32, x.ctypes.data, Q.Device(0, 0))
    for fmt, kind, rounding, status in [(Q.E4M3, MX32, SR, 1), (Q.E2M1, NV16, 5, 1),
                                        (Q.E4M3, Q.BLOCK128, SR, 1)]:
        q = Q.QTensor(fmt, kind, 4, 32, None, None, Q.Device(0, 0), None, 0)
        buf = np.zeros(4096, np.uint8)
        q.data = q.scales = None
        q.data, q.scales = buf.ctypes.data, buf[2048:].ctypes.data
        st = d.lowp_quantize(ctypes.byref(t), ctypes.byref(q), None,
                             ctypes.byref(cfg(rounding, 1, 0)))
        msg = lib.last_error()
        rep.check("sr error: format %d kind %d rounding %d names cfg.rounding" % (
            fmt, kind, rounding), st == Q.ERR_INVALID_ARG and "cfg.rounding" in msg, [msg])


# ---- the Hadamard transform ----

def signs(seed, offset):
    w = int(philox_words(seed, offset, 1)[0])
    return np.array([-1.0 if (w >> i) & 1 else 1.0 for i in range(16)])


def butterfly32(x, s, offs=None):
    """The spec's transform in numpy float32: sign flips, stages h = 1, 2, 4, 8, times 0.25f;
    blocks from each group's start, partial blocks and columns past the groups copied."""
    x = np.asarray(x, np.float32)
    y = x.copy()
    bounds = list(zip([0] + list(offs[:-1]), offs)) if offs is not None else [(0, x.shape[1])]
    s32 = s.astype(np.float32)
    for a, b in bounds:
        for c0 in range(a, b - 15, 16):
            t = x[:, c0:c0 + 16] * s32
            with np.errstate(invalid="ignore", over="ignore"):
                for h in (1, 2, 4, 8):
                    t2 = t.copy()
                    for i in range(16):
                        if i & h == 0:
                            t2[:, i] = t[:, i] + t[:, i + h]
                            t2[:, i + h] = t[:, i] - t[:, i + h]
                    t = t2
            y[:, c0:c0 + 16] = t * np.float32(0.25)
    return y


H16 = np.array([[(-1.0) ** bin(i & j).count("1") for j in range(16)] for i in range(16)])


def hadamard(x, seed, offset, offs=None, xfmt=Q.F32, threads=0, y=None):
    x = np.ascontiguousarray(x)
    R, C = x.shape
    y = np.full((R, C), np.nan, np.float32) if y is None else y
    t = Q.Tensor(xfmt, R, C, x.ctypes.data, Q.Device(0, 0))
    u = Q.Tensor(Q.F32, R, C, y.ctypes.data, Q.Device(0, 0))
    hc = HadamardCfg()
    d.lowp_hadamard_cfg_init(ctypes.byref(hc))
    hc.seed, hc.offset, hc.threads = seed, offset, threads
    ob = None
    if offs is not None:
        ob = np.ascontiguousarray(offs, np.int32)
        hc.group_offs, hc.groups = ob.ctypes.data, len(ob)
    st = d.lowp_hadamard16(ctypes.byref(t), ctypes.byref(u), ctypes.byref(hc))
    return st, y


def same_bits(a, b):
    return np.array_equal(np.asarray(a, np.float32).view(np.uint32),
                          np.asarray(b, np.float32).view(np.uint32))


def check_hadamard():
    for (R, C), seed, offset in [((3, 16), 0, 0), ((7, 37), 5, 11), ((64, 300), 2 ** 35, 9),
                                 ((300, 64), 17, 3), ((300, 250), 4, 1)]:
        x = (rng.standard_normal((R, C)) * 10).astype(np.float32)
        st, y = hadamard(x, seed, offset)
        s = signs(seed, offset)
        label = "hadamard %dx%d seed %d offset %d" % (R, C, seed, offset)
        rep.check(label + ": status", st == 0, [lib.last_error()])
        rep.check(label + ": bits of the float32 butterfly", same_bits(y, butterfly32(x, s)))
        nb = C // 16 * 16
        xb = x[:, :nb].astype(np.float64).reshape(R, -1, 16)
        ref = np.einsum("ij,rbj->rbi", H16 * s[None, :] / 4.0, xb).reshape(R, nb)
        tol = 8 * 2.0 ** -24 * np.repeat(np.abs(xb).sum(axis=2), 16, axis=1)
        rep.check(label + ": float64 H16 diag(s) x / 4 within rounding",
                  np.all(np.abs(y[:, :nb] - ref) <= tol))
        back = np.einsum("ij,rbj->rbi", (H16 * s[:, None]) / 4.0,
                         y[:, :nb].astype(np.float64).reshape(R, -1, 16)).reshape(R, nb)
        rep.check(label + ": D H y / 4 gives x back within rounding",
                  np.all(np.abs(back - x[:, :nb]) <= tol))
        rep.check(label + ": partial block copied", same_bits(y[:, nb:], x[:, nb:]))
        if R * C >= 65536:  # the parallel path (all cores) against one thread, F32 and BF16
            st1, y1 = hadamard(x, seed, offset, threads=1)
            rep.check(label + ": one thread, same bits", st1 == 0 and same_bits(y, y1))
            xb = x.astype(ml_dtypes.bfloat16)
            st2, y2 = hadamard(xb.view(np.uint16), seed, offset, xfmt=Q.BF16, threads=2)
            rep.check(label + ": bf16 on two threads, bits of the butterfly",
                      st2 == 0 and same_bits(y2, butterfly32(xb.astype(np.float32), s)))
    # groups: blocks restart at each group, short ends and columns past the last group copied
    x = (rng.standard_normal((5, 90)) * 3).astype(np.float32)
    offs = [0, 20, 20, 52, 85]
    st, y = hadamard(x, 3, 4, offs=offs)
    rep.check("hadamard grouped: bits", st == 0 and same_bits(y, butterfly32(x, signs(3, 4), offs)))
    # BF16 input, widened exactly
    xb = (rng.standard_normal((4, 48)) * 2).astype(ml_dtypes.bfloat16)
    st, y = hadamard(xb.view(np.uint16), 8, 1, xfmt=Q.BF16)
    rep.check("hadamard bf16 input: bits of the float32 butterfly of its values",
              st == 0 and same_bits(y, butterfly32(xb.astype(np.float32), signs(8, 1))))
    # NaN and Inf propagate as IEEE arithmetic
    x = np.ones((2, 32), np.float32)
    x[0, 3] = np.nan
    x[1, 20] = np.inf
    st, y = hadamard(x, 1, 0)
    want = butterfly32(x, signs(1, 0))
    rep.check("hadamard nan: the block is all NaN, the other block finite",
              st == 0 and np.all(np.isnan(y[0, :16])) and np.all(np.isfinite(y[0, 16:])))
    rep.check("hadamard inf: as the float32 butterfly (Inf and NaN)",
              same_bits(np.nan_to_num(y[1], nan=7.0), np.nan_to_num(want[1], nan=7.0)) and
              np.array_equal(np.isnan(y[1]), np.isnan(want[1])))


def check_hadamard_errors():
    x = np.ones((2, 32), np.float32)
    t = Q.Tensor(Q.F32, 2, 32, x.ctypes.data, Q.Device(0, 0))
    st = d.lowp_hadamard16(ctypes.byref(t), ctypes.byref(t), None)
    rep.check("hadamard in place: refused naming y.data",
              st == Q.ERR_INVALID_ARG and "y.data" in lib.last_error(), [lib.last_error()])
    y = np.zeros((2, 31), np.float32)
    u = Q.Tensor(Q.F32, 2, 31, y.ctypes.data, Q.Device(0, 0))
    st = d.lowp_hadamard16(ctypes.byref(t), ctypes.byref(u), None)
    rep.check("hadamard shape: refused naming y", st == Q.ERR_INVALID_ARG and
              "y shape" in lib.last_error(), [lib.last_error()])
    st, _ = hadamard(np.ones((2, 32), np.float32), 0, 0, offs=[20, 10])
    rep.check("hadamard offs decreasing: refused", st == Q.ERR_INVALID_ARG, [lib.last_error()])
    st, _ = hadamard(np.ones((2, 32), np.float32), 0, 0, offs=[40])
    rep.check("hadamard offs past cols: refused", st == Q.ERR_INVALID_ARG, [lib.last_error()])


check_philox()
check_sr_copies()
check_sr_grouped()
check_unbiased()
check_sr_errors()
check_hadamard()
check_hadamard_errors()
rep.finish()
