"""lowp's quantization against the independent Python reference of tests/oracle/quant_ref.py
(docs/numerics.md sections 3-5), bit for bit: element codes, E8M0 codes and binary32 scale_invs of
every scaling kind, scale mode, pow2/eps option, element format, input format and orientation,
on every CPU kernel path; dequantization, grouped (MoE) quantization, amax, the scale layout
converters and delayed scaling; and the round-trip SQNR of each kind on Gaussian data.

Run by ctest with LOWP_LIB set (LOWP_SANITIZE shrinks the sizes). Prints "N passed, M failed".
"""

import ctypes
import sys
import time

import numpy as np

import quant_ref as Q

lib = Q.Lib()
rep = Q.Report()
rng = np.random.default_rng(20240611)
SAN = Q.SANITIZE

# Kernel paths to compare with the reference: (path, threads). AVX512 is skipped where it
# answers LOWP_ERR_UNSUPPORTED (no AVX-512 on this CPU, or no fast kernel for the job).
PATHS = [(Q.PATH_REFERENCE, 0), (Q.PATH_AUTO, 0), (Q.PATH_AUTO, 3), (Q.PATH_AVX512, 0)]
skipped = {}  # what the AVX-512 path did not take, for the summary


def configs():
    """(kind, fmt, mode, pow2, eps) of every option combination."""
    out = []
    for kind in Q.FP32_KINDS:
        for fmt in (Q.E4M3, Q.E5M2):
            for pow2 in (-1, 0, 1):
                for eps in (0.0, 1e-4):
                    out.append((kind, fmt, Q.SCALE_DEFAULT, pow2, eps))
    for kind in Q.E8M0_KINDS:
        for fmt in ((Q.E4M3, Q.E5M2, Q.E2M1) if kind == Q.MX32 else (Q.E4M3, Q.E5M2)):
            for mode in (Q.SCALE_DEFAULT, Q.RCEIL, Q.FLOOR, Q.CEIL, Q.EVEN):
                out.append((kind, fmt, mode, -1, 0.0))
    return out


def cfg_name(kind, fmt, mode, pow2, eps):
    s = f"{Q.KIND_NAMES[kind]}/{Q.FMT_NAMES[fmt]}"
    if kind in Q.E8M0_KINDS:
        return s + f"/{Q.MODE_NAMES[mode]}"
    return s + f"/pow2={pow2}/eps={eps:g}"


def as_input(x32, xfmt):
    """The lowp input array and the exact float32 values the reference sees."""
    if xfmt == Q.BF16:
        b = Q.to_bf16_bits(x32)
        return b, Q.bf16_bits_to_f32(b)
    return np.ascontiguousarray(x32, np.float32), np.ascontiguousarray(x32, np.float32)


def ref_storage(ref, fmt):
    codes, scales = ref
    return Q.storage(codes, fmt), scales


def compare_copy(name, got, ref, fmt):
    data, scales, guards = got
    want_data, want_scales = ref_storage(ref, fmt)
    rep.arrays_equal(name + " codes", data, want_data)
    rep.arrays_equal(name + " scales", scales, want_scales)
    rep.check(name + " nothing written past the buffers", guards)


def run_lowp(x_in, xfmt, cfg, orient, path, threads, **extra):
    kind, fmt, mode, pow2, eps = cfg
    try:
        return lib.quantize(x_in, fmt, kind, orient, xfmt=xfmt, mode=mode, pow2=pow2, eps=eps,
                            path=path, threads=threads, **extra)
    except Q.LowpError as e:
        if path == Q.PATH_AVX512 and e.status == Q.ERR_UNSUPPORTED:
            key = cfg_name(*cfg) + f" in={Q.FMT_NAMES[xfmt]}"
            skipped[key] = e.message
            return None
        raise


def check_all_orientations(tag, x32, xfmt, cfg, paths=PATHS, dequant=True):
    """Quantize x with lowp as row, col and both on every path; compare with the reference."""
    kind, fmt, mode, pow2, eps = cfg
    x_in, xv = as_input(x32, xfmt)
    ref = Q.quantize(xv, fmt, kind, mode, pow2, eps)
    base = f"{tag} {x32.shape[0]}x{x32.shape[1]} in={Q.FMT_NAMES[xfmt]} {cfg_name(*cfg)}"
    for path, threads in paths:
        pn = f"path={path} threads={threads}"
        try:
            both = run_lowp(x_in, xfmt, cfg, "both", path, threads)
            if both is None:
                continue
            row = run_lowp(x_in, xfmt, cfg, "row", path, threads)
            col = run_lowp(x_in, xfmt, cfg, "col", path, threads)
        except Q.LowpError as e:
            rep.fail(f"{base} {pn}: lowp_quantize failed", [str(e)])
            continue
        compare_copy(f"{base} {pn} both/row", both["row"], ref["row"], fmt)
        compare_copy(f"{base} {pn} both/col", both["col"], ref["col"], fmt)
        compare_copy(f"{base} {pn} row", row["row"], ref["row"], fmt)
        compare_copy(f"{base} {pn} col", col["col"], ref["col"], fmt)
        # Dual-axis must equal the two single-axis calls, byte for byte.
        for o, single in (("row", row), ("col", col)):
            rep.check(f"{base} {pn} both.{o} == single {o}",
                      np.array_equal(both[o][0], single[o][0]) and
                      np.array_equal(both[o][1].view(np.uint8), single[o][1].view(np.uint8)))
    if dequant:
        for o, shape in (("row", x32.shape), ("col", x32.shape[::-1])):
            d, s = ref_storage(ref[o], fmt)
            try:
                got = lib.dequantize(d, s, fmt, kind, shape[0], shape[1])
            except Q.LowpError as e:
                rep.fail(f"{base} dequantize {o}", [str(e)])
                continue
            want = Q.dequantize(ref[o][0], ref[o][1], fmt, kind)
            rep.arrays_equal(f"{base} dequantize {o}", got, want)
    return ref


# ---- data ----


def random_tensor(R, C):
    """Gaussian values with magnitudes that vary by row and by column, so that every block of
    every kind gets its own scale, plus a sprinkle of exact powers of two and of +-0."""
    x = rng.standard_normal((R, C)) * 10.0 ** rng.uniform(-4, 4, (R, 1)) * 10.0 ** rng.uniform(-1, 1, (1, C))
    x = x.astype(np.float32)
    m = rng.random((R, C))
    x[m < 0.02] = np.ldexp(1.0, rng.integers(-20, 20, size=int(np.sum(m < 0.02)))).astype(np.float32)
    x[(m >= 0.02) & (m < 0.03)] = 0.0
    x[(m >= 0.03) & (m < 0.035)] = -0.0
    return x


def subnormals(n):
    b = rng.integers(1, 0x800000, size=n, dtype=np.uint32) | (rng.integers(0, 2, size=n, dtype=np.uint32) << 31)
    return Q.f32(b)


PATTERNS = [
    "zeros", "one_huge", "subnormal", "above_fmax", "nan", "pos_inf", "neg_inf_and_nan",
    "wide_range", "powers_of_two", "rceil_boundaries", "flt_max", "negative", "ones",
    "tiny_normals", "gaussian",
]


def pattern(name, shape):
    n = int(np.prod(shape))
    g = rng.standard_normal(n).astype(np.float32)
    if name == "zeros":
        v = np.where(rng.random(n) < 0.5, np.float32(0.0), np.float32(-0.0)).astype(np.float32)
    elif name == "one_huge":
        v = g.copy()
        v[rng.integers(n)] = np.float32(3.0e38) * np.float32(rng.choice([-1, 1]))
    elif name == "subnormal":
        v = subnormals(n)
    elif name == "above_fmax":
        choices = np.array([448, 449, 463.99, 464, 464.01, 480, 500, 511.9, 512, 520, 57344,
                            57345, 61439, 61440, 61441, 65536, 6.0, 6.5, 7.0, 8.0], np.float32)
        v = rng.choice(choices, n) * rng.choice(np.array([-1, 1], np.float32), n)
        v = v.astype(np.float32)
    elif name == "nan":
        v = g.copy()
        v[rng.integers(n)] = np.nan
    elif name == "pos_inf":
        v = g.copy()
        v[rng.integers(n)] = np.inf
    elif name == "neg_inf_and_nan":
        v = g.copy()
        i, j = rng.choice(n, 2, replace=False)
        v[i] = -np.inf
        v[j] = -np.nan
    elif name == "wide_range":
        v = (10.0 ** rng.uniform(-30, 30, n) * rng.choice([-1, 1], n)).astype(np.float32)
    elif name == "powers_of_two":
        v = np.ldexp(1.0, rng.integers(-140, 128, n)).astype(np.float32) * rng.choice(np.array([-1, 1], np.float32), n)
    elif name == "rceil_boundaries":
        base = np.array([448, 57344, 6, 3.5, 1, 0.5], np.float32)
        b = Q.bits32(rng.choice(base, n) * np.ldexp(np.float32(1), rng.integers(-100, 100, n)).astype(np.float32))
        v = Q.f32(b.astype(np.int64) + rng.integers(-1, 2, n))
    elif name == "flt_max":
        v = g.copy()
        k = rng.choice(n, max(1, n // 8), replace=False)
        v[k] = Q.FLT_MAX * rng.choice(np.array([-1, 1], np.float32), k.size)
    elif name == "negative":
        v = -np.abs(g)
    elif name == "ones":
        v = np.ones(n, np.float32)
    elif name == "tiny_normals":
        v = (np.ldexp(1.0, rng.integers(-126, -118, n)) * rng.uniform(1, 2, n)).astype(np.float32)
    else:
        v = g
    return np.asarray(v, np.float32).reshape(shape)


def mosaic():
    """96 x 160: one 32x32 tile per pattern (3 x 5 tiles)."""
    x = np.zeros((96, 160), np.float32)
    for i, name in enumerate(PATTERNS):
        r, c = divmod(i, 5)
        x[r * 32:(r + 1) * 32, c * 32:(c + 1) * 32] = pattern(name, (32, 32))
    return x


# ---- A1: every option on awkward shapes ----


def test_random_shapes():
    shapes = [(1, 1), (3, 31), (33, 65), (129, 257), (1000, 1030)]
    if SAN:
        shapes = [(1, 1), (3, 31), (33, 65), (70, 130)]
    big = shapes[-1]
    n0 = rep.passed + rep.failed
    for shape in shapes:
        x = random_tensor(*shape)
        for xfmt in (Q.F32, Q.BF16):
            for cfg in configs():
                kind, fmt, mode, pow2, eps = cfg
                if shape == big and not (pow2 == -1 and eps == 0.0):
                    continue  # the big shape: every kind/format/mode with default pow2/eps
                paths = [p for p in PATHS if p[1] == 0] if shape == big else PATHS
                check_all_orientations("random", x, xfmt, cfg, paths=paths)
    print(f"[random shapes] {rep.passed + rep.failed - n0} checks")


# ---- A2: special values ----


def test_special_values():
    n0 = rep.passed + rep.failed
    m = mosaic()
    for xfmt in (Q.F32, Q.BF16):
        for cfg in configs():
            check_all_orientations("mosaic", m, xfmt, cfg)
    # Each pattern on its own, so that the one-scale kinds (tensor, 128x128) see it whole.
    for name in PATTERNS:
        x = pattern(name, (33, 65))
        for xfmt in (Q.F32, Q.BF16):
            for cfg in configs():
                check_all_orientations(f"pattern {name}", x, xfmt, cfg,
                                       paths=PATHS[:2] + PATHS[3:])
    print(f"[special values] {rep.passed + rep.failed - n0} checks")


def test_nan_inf_blocks():
    """The documented codes, checked directly: a NaN or Inf block has scale 0xFF and element
    NaN codes E4M3 0x7F / E5M2 0x7E / E2M1 0, whatever the element's sign; a zero block has
    scale 0x00 and keeps each zero's sign."""
    n0 = rep.passed + rep.failed
    want_elem = {Q.E4M3: 0x7F, Q.E5M2: 0x7E, Q.E2M1: 0x00}
    for kind, fmts in ((Q.MX32, (Q.E4M3, Q.E5M2, Q.E2M1)), (Q.BLOCK32X32, (Q.E4M3, Q.E5M2))):
        for fmt in fmts:
            for mode in (Q.RCEIL, Q.FLOOR, Q.CEIL, Q.EVEN):
                for bad in (np.nan, -np.nan, np.inf, -np.inf):
                    x = -np.abs(rng.standard_normal((32, 64)).astype(np.float32))
                    x[5, 3] = bad
                    x[:, 32:] = 0.0
                    x[::2, 32:] = -0.0
                    for path, threads in PATHS:
                        r = run_lowp(x, Q.F32, (kind, fmt, mode, -1, 0.0), "row", path, threads)
                        if r is None:
                            continue
                        data, scales, _ = r["row"]
                        codes = Q.unpack_e2m1(data, 64) if fmt == Q.E2M1 else data
                        name = f"nan/inf block {Q.KIND_NAMES[kind]} {Q.FMT_NAMES[fmt]} {Q.MODE_NAMES[mode]} x={bad} path={path}"
                        if kind == Q.MX32:
                            rep.check(name + " scale 0xFF", scales[5, 0] == 0xFF, [f"got 0x{scales[5, 0]:02X}"])
                            rep.check(name + " elements NaN code", np.all(codes[5, :32] == want_elem[fmt]),
                                      [f"got {[hex(v) for v in codes[5, :32]]}"])
                            rep.check(name + " other blocks finite", np.all(scales[np.arange(32) != 5, 0] != 0xFF))
                        else:
                            rep.check(name + " scale 0xFF", scales[0, 0] == 0xFF, [f"got 0x{scales[0, 0]:02X}"])
                            rep.check(name + " elements NaN code", np.all(codes[:, :32] == want_elem[fmt]))
                        rep.check(name + " zero block scale 0", np.all(scales[:, -1] == 0))
                        zc = codes[:, 32:]
                        if fmt == Q.E2M1:
                            want = np.where(np.arange(32)[:, None] % 2 == 0, 0x8, 0x0)
                        else:
                            want = np.where(np.arange(32)[:, None] % 2 == 0, 0x80, 0x00)
                        rep.check(name + " zeros keep their sign", np.all(zc == want))
    print(f"[nan/inf/zero blocks] {rep.passed + rep.failed - n0} checks")


# ---- scalar scale functions ----


def test_scalar_scales():
    n0 = rep.passed + rep.failed
    n = 600 if SAN else 3000
    b = np.concatenate([
        rng.integers(0, 0x7F800000, size=n, dtype=np.uint32),
        np.array([0, 1, 0x00400000, 0x00400001, 0x007FFFFF, 0x00800000, 0x3F800000, 0x3F800001,
                  0x43E00000, 0x43E00001, 0x43F00000, 0x47600000, 0x7F000000, 0x7F7FFFFF,
                  0x7F800000, 0x7FC00000, 0x40C00000, 0x40C00001], np.uint32)])
    amaxes = Q.f32(b)
    for fmt in (Q.E4M3, Q.E5M2, Q.E2M1):
        for mode in (Q.SCALE_DEFAULT, Q.RCEIL, Q.FLOOR, Q.CEIL, Q.EVEN):
            rmode = Q.RCEIL if mode == Q.SCALE_DEFAULT else mode
            want = Q.e8m0_code(amaxes, fmt, rmode)
            got = np.array([lib.e8m0_scale(a, fmt, mode) for a in amaxes], np.uint8)
            rep.arrays_equal(f"lowp_e8m0_scale {Q.FMT_NAMES[fmt]} {Q.MODE_NAMES[mode]}", got, want,
                             context=lambda i: f"amax=0x{int(b[i[0]]):08X}")
        for eps in (0.0, 1e-3, 1e30):
            for pow2 in (0, 1):
                want = Q.fp32_scale(amaxes, fmt, eps, pow2)
                got = np.array([lib.fp32_scale(a, fmt, eps, pow2) for a in amaxes], np.float32)
                rep.arrays_equal(f"lowp_fp32_scale {Q.FMT_NAMES[fmt]} eps={eps:g} pow2={pow2}", got, want,
                                 context=lambda i: f"amax=0x{int(b[i[0]]):08X}")
    print(f"[scalar scales] {rep.passed + rep.failed - n0} checks")


# ---- tensor scaling with a given scale (delayed) and amax_out ----


def test_tensor_given_scale():
    n0 = rep.passed + rep.failed
    for fmt in (Q.E4M3, Q.E5M2):
        for scale in (np.float32(1.0), np.float32(3.7), np.float32(2.0 ** -20), np.float32(1e30),
                      Q.FLT_MAX, Q.f32(1)[()]):
            for xfmt in (Q.F32, Q.BF16):
                x = random_tensor(37, 45)
                x[3, 4] = np.nan if scale == 1 else x[3, 4]
                x_in, xv = as_input(x, xfmt)
                ref = Q.quantize(xv, fmt, Q.TENSOR, scale=scale)
                want_amax = np.max(np.abs(xv))
                for path, threads in PATHS:
                    amax = np.full(1, -1.0, np.float32)
                    r = run_lowp(x_in, xfmt, (Q.TENSOR, fmt, 0, -1, 0.0), "both", path, threads,
                                 scale=scale, amax_out=amax)
                    if r is None:
                        continue
                    name = f"tensor given scale {scale!r} {Q.FMT_NAMES[fmt]} in={Q.FMT_NAMES[xfmt]} path={path}"
                    compare_copy(name + " row", r["row"], ref["row"], fmt)
                    compare_copy(name + " col", r["col"], ref["col"], fmt)
                    rep.arrays_equal(name + " amax_out", amax, np.array([want_amax], np.float32))
                    # amax_out also when the scale is computed
                    amax2 = np.full(1, -1.0, np.float32)
                    r2 = run_lowp(x_in, xfmt, (Q.TENSOR, fmt, 0, -1, 0.0), "row", path, threads,
                                  amax_out=amax2)
                    rep.arrays_equal(name + " amax_out (computed scale)", amax2,
                                     np.array([want_amax], np.float32))
                    compare_copy(name + " computed", r2["row"], Q.quantize(xv, fmt, Q.TENSOR)["row"], fmt)
    print(f"[tensor given scale / amax_out] {rep.passed + rep.failed - n0} checks")


# ---- grouped ----


def test_grouped():
    n0 = rep.passed + rep.failed
    layouts = [
        [0, 1, 31, 33, 100, 0, 64, 5],  # sizes; the offsets are their running sums
        [100],
        [0, 0],
        [1] * 7 + [33],
        [31, 0, 33, 1],
    ]
    K = 37 if not SAN else 9
    cfgs = [(Q.MX32, f, m, -1, 0.0) for f in (Q.E4M3, Q.E5M2, Q.E2M1)
            for m in (Q.SCALE_DEFAULT, Q.FLOOR, Q.CEIL, Q.EVEN)]
    cfgs += [(Q.BLOCK128, f, 0, p, e) for f in (Q.E4M3, Q.E5M2) for p in (-1, 1) for e in (0.0, 1e-4)]
    for sizes in layouts:
        offs = np.cumsum(sizes).astype(np.int32)
        M = int(offs[-1]) + 7  # tokens past offs[G-1] are ignored
        for variant in ("random", "special"):
            x = random_tensor(M, K) if variant == "random" else mosaic_like(M, K)
            for xfmt in (Q.F32, Q.BF16):
                x_in, xv = as_input(x, xfmt)
                for cfg in cfgs:
                    kind, fmt, mode, pow2, eps = cfg
                    name = f"grouped sizes={sizes} {variant} in={Q.FMT_NAMES[xfmt]} {cfg_name(*cfg)}"
                    want_codes, want_scales = Q.quantize_grouped(xv, offs, fmt, kind, mode, pow2, eps)
                    for path in (Q.PATH_REFERENCE, Q.PATH_AUTO, Q.PATH_AVX512):
                        try:
                            data, scales, guards = lib.quantize_grouped(
                                x_in, offs, fmt, kind, xfmt=xfmt, mode=mode, pow2=pow2, eps=eps, path=path)
                        except Q.LowpError as e:
                            if path == Q.PATH_AVX512 and e.status == Q.ERR_UNSUPPORTED:
                                continue
                            rep.fail(name + f" path={path}", [str(e)])
                            continue
                        rep.arrays_equal(name + f" path={path} codes", data, Q.storage(want_codes, fmt))
                        rep.arrays_equal(name + f" path={path} scales", scales, want_scales)
                        rep.check(name + f" path={path} guards", guards)
                    # Each group's part equals lowp quantizing that group's columnwise slice alone.
                    data, scales, _ = lib.quantize_grouped(x_in, offs, fmt, kind, xfmt=xfmt, mode=mode,
                                                           pow2=pow2, eps=eps, path=Q.PATH_REFERENCE)
                    codes = Q.unpack_e2m1(data, M) if fmt == Q.E2M1 else data
                    start, sb = 0, 0
                    bs = Q.BLOCK[kind][1]
                    for g, end in enumerate(offs):
                        end = int(end)
                        if end > start:
                            one = lib.quantize(np.ascontiguousarray(x_in[start:end]), fmt, kind, "col",
                                               xfmt=xfmt, mode=mode, pow2=pow2, eps=eps)["col"]
                            oc = Q.unpack_e2m1(one[0], end - start) if fmt == Q.E2M1 else one[0]
                            nb = Q.cdiv(end - start, bs)
                            rep.arrays_equal(name + f" group {g} codes == alone", codes[:, start:end], oc)
                            rep.arrays_equal(name + f" group {g} scales == alone", scales[:, sb:sb + nb], one[1])
                            sb += nb
                        start = end
                    rep.check(name + " tokens past offs[G-1] are code 0", np.all(codes[:, start:] == 0))
                    # Dequantize the grouped copy.
                    try:
                        got = lib.dequantize(Q.storage(want_codes, fmt), want_scales, fmt, kind, K, M, offs=offs)
                        want = Q.dequantize_grouped(want_codes, want_scales, offs, fmt, kind)
                        rep.arrays_equal(name + " dequantize", got, want)
                    except Q.LowpError as e:
                        rep.fail(name + " dequantize", [str(e)])
    print(f"[grouped] {rep.passed + rep.failed - n0} checks")


def mosaic_like(R, C):
    """Special values in 8-row bands, so that grouped token blocks see them."""
    x = np.zeros((R, C), np.float32)
    for r0 in range(0, R, 8):
        name = PATTERNS[(r0 // 8) % len(PATTERNS)]
        x[r0:r0 + 8] = pattern(name, (min(8, R - r0), C))
    return x


# ---- amax ----


def test_amax():
    n0 = rep.passed + rep.failed
    tensors = [random_tensor(33, 65), random_tensor(129, 257), mosaic(), random_tensor(1, 1),
               pattern("nan", (40, 300)), pattern("subnormal", (31, 33))]
    for x in tensors:
        for xfmt in (Q.F32, Q.BF16):
            x_in, xv = as_input(x, xfmt)
            for kind in range(6):
                got = lib.amax(x_in, kind, xfmt)
                rep.arrays_equal(f"lowp_amax {Q.KIND_NAMES[kind]} {x.shape} in={Q.FMT_NAMES[xfmt]}",
                                 got, Q.block_amax(xv, kind))
    print(f"[amax] {rep.passed + rep.failed - n0} checks")


# ---- layouts ----


def test_layouts():
    n0 = rep.passed + rep.failed
    d = lib.dll
    shapes = [(1, 1), (1, 4), (127, 3), (128, 4), (129, 5), (300, 9), (31, 32), (256, 8), (5, 0), (0, 3)]
    for sr, sc in shapes:
        canon = rng.integers(0, 256, size=(sr, sc), dtype=np.uint8)
        cb = ctypes.c_size_t()
        lib.check(d.lowp_scales_cublas_nbytes(sr, sc, ctypes.byref(cb)))
        want = Q.cublas_swizzle(canon)
        rep.check(f"cublas nbytes {sr}x{sc}", cb.value == want.size, [f"{cb.value} != {want.size}"])
        out = np.full(cb.value + Q.GUARD, Q.SENTINEL, np.uint8)
        lib.check(d.lowp_scales_to_cublas(canon.ctypes.data if canon.size else None, sr, sc,
                                          out.ctypes.data, cb.value))
        rep.arrays_equal(f"to_cublas {sr}x{sc} == numpy swizzle", out[:cb.value], want)
        rep.check(f"to_cublas {sr}x{sc} guard", np.all(out[cb.value:] == Q.SENTINEL))
        back = np.full(sr * sc + 8, 0x5A, np.uint8)
        lib.check(d.lowp_scales_from_cublas(out.ctypes.data, cb.value, sr, sc, back.ctypes.data))
        rep.arrays_equal(f"from_cublas {sr}x{sc} round trip", back[:sr * sc].reshape(sr, sc), canon)
        rep.check(f"from_cublas {sr}x{sc} guard", np.all(back[sr * sc:] == 0x5A))
        # from_cublas of an arbitrary swizzled buffer equals the numpy unswizzle.
        swz = rng.integers(0, 256, size=cb.value, dtype=np.uint8)
        back2 = np.zeros(max(sr * sc, 1), np.uint8)
        lib.check(d.lowp_scales_from_cublas(swz.ctypes.data if swz.size else None, cb.value, sr, sc,
                                            back2.ctypes.data))
        rep.arrays_equal(f"from_cublas {sr}x{sc} == numpy unswizzle", back2[:sr * sc].reshape(sr, sc),
                         Q.cublas_unswizzle(swz, sr, sc))
        # NPU pairs, both axes.
        nb = ctypes.c_size_t()
        lib.check(d.lowp_scales_npu_nbytes(sr, sc, ctypes.byref(nb)))
        for axis in (Q.NPU_AXIS_LAST, Q.NPU_AXIS_FIRST):
            want = Q.npu_pairs(canon, axis)
            rep.check(f"npu nbytes {sr}x{sc}", nb.value == want.size, [f"{nb.value} != {want.size}"])
            out = np.full(nb.value + Q.GUARD, Q.SENTINEL, np.uint8)
            lib.check(d.lowp_scales_to_npu(canon.ctypes.data if canon.size else None, sr, sc, axis,
                                           out.ctypes.data, nb.value))
            rep.arrays_equal(f"to_npu {sr}x{sc} axis={axis}", out[:nb.value], want)
            rep.check(f"to_npu {sr}x{sc} axis={axis} guard", np.all(out[nb.value:] == Q.SENTINEL))
            back = np.full(sr * sc + 8, 0x5A, np.uint8)
            lib.check(d.lowp_scales_from_npu(out.ctypes.data, nb.value, sr, sc, axis, back.ctypes.data))
            rep.arrays_equal(f"from_npu {sr}x{sc} axis={axis} round trip",
                             back[:sr * sc].reshape(sr, sc), canon)
    # Too-small output buffers are refused.
    canon = np.zeros((3, 3), np.uint8)
    out = np.zeros(4096, np.uint8)
    rep.check("to_cublas short buffer refused",
              d.lowp_scales_to_cublas(canon.ctypes.data, 3, 3, out.ctypes.data, 511) == Q.ERR_INVALID_ARG)
    rep.check("to_npu short buffer refused",
              d.lowp_scales_to_npu(canon.ctypes.data, 3, 3, 0, out.ctypes.data, 11) == Q.ERR_INVALID_ARG)
    rep.check("to_npu bad axis refused",
              d.lowp_scales_to_npu(canon.ctypes.data, 3, 3, 2, out.ctypes.data, 12) == Q.ERR_INVALID_ARG)
    # The real thing: MX scales of a quantized tensor through both layouts.
    x = random_tensor(257, 200)
    r = lib.quantize(x, Q.E4M3, Q.MX32, "both")
    for o, axis in (("row", Q.NPU_AXIS_LAST), ("col", Q.NPU_AXIS_FIRST)):
        s = np.ascontiguousarray(r[o][1])
        sr, sc = s.shape
        lib.check(d.lowp_scales_cublas_nbytes(sr, sc, ctypes.byref(cb)))
        out = np.zeros(cb.value, np.uint8)
        lib.check(d.lowp_scales_to_cublas(s.ctypes.data, sr, sc, out.ctypes.data, cb.value))
        rep.arrays_equal(f"mx32 {o} scales to cublas", out, Q.cublas_swizzle(s))
        lib.check(d.lowp_scales_npu_nbytes(sr, sc, ctypes.byref(nb)))
        out = np.zeros(nb.value, np.uint8)
        lib.check(d.lowp_scales_to_npu(s.ctypes.data, sr, sc, axis, out.ctypes.data, nb.value))
        rep.arrays_equal(f"mx32 {o} scales to npu", out, Q.npu_pairs(s, axis))
    print(f"[layouts] {rep.passed + rep.failed - n0} checks")


# ---- delayed scaling ----


def delayed_scenario(fmt, hlen, margin, algo, steps):
    d = lib.dll
    cfg = Q.DelayedCfg()
    lib.check(d.lowp_delayed_cfg_init(ctypes.byref(cfg), fmt))
    cfg.history_len, cfg.margin, cfg.algo = hlen, float(margin), algo
    hist = np.full(hlen, np.float32(123.0), np.float32)
    stt = Q.DelayedState()
    lib.check(d.lowp_delayed_init(ctypes.byref(stt), ctypes.byref(cfg), hist.ctypes.data))
    model = Q.DelayedModel(fmt, hlen, margin, algo)
    name = f"delayed {Q.FMT_NAMES[fmt]} len={hlen} margin={margin} algo={'max' if algo == 0 else 'most_recent'}"
    ok = rep.arrays_equal(name + " init history", hist, model.hist)
    ok &= rep.check(name + " init scale", stt.scale == 1.0 and stt.scale_inv == 1.0)
    for step, amaxes in enumerate(steps):
        for a in amaxes:
            lib.check(d.lowp_delayed_record(ctypes.byref(stt), float(a)))
            model.record(a)
        lib.check(d.lowp_delayed_update(ctypes.byref(stt)))
        model.update()
        good = (np.all(Q.same_floats(hist, model.hist)) and
                Q.same_floats(np.float32(stt.scale), model.scale) and
                Q.same_floats(np.float32(stt.scale_inv), model.scale_inv))
        if not good:
            rep.fail(f"{name} step {step} (recorded {[float(a) for a in amaxes]})", [
                f"lowp scale={np.float32(stt.scale)!r} scale_inv={np.float32(stt.scale_inv)!r} "
                f"hist[:4]={hist[:4].tolist()} hist[-2:]={hist[-2:].tolist()}",
                f"model scale={model.scale!r} scale_inv={model.scale_inv!r} "
                f"hist[:4]={model.hist[:4].tolist()} hist[-2:]={model.hist[-2:].tolist()}"])
            return
        rep.ok()


def test_delayed():
    n0 = rep.passed + rep.failed
    for hlen in (1, 31, 1024):
        nsteps = hlen + 60 if not SAN else min(hlen + 60, 200)
        for fmt in (Q.E4M3, Q.E5M2):
            for algo in (Q.AMAX_MAX, Q.AMAX_MOST_RECENT):
                for margin in (0, 1, 3):
                    # A plain run: log-uniform amaxes, sometimes several records per step,
                    # sometimes an unused step (amax 0: no roll), extremes that overflow the
                    # scale to FLT_MAX or make it tiny.
                    steps = []
                    for s in range(nsteps):
                        u = rng.random()
                        if u < 0.1:
                            steps.append([0.0])
                        elif u < 0.12:
                            steps.append([1e-44])
                        elif u < 0.14:
                            steps.append([3e38])
                        else:
                            k = rng.integers(1, 4)
                            steps.append(list((10.0 ** rng.uniform(-3, 3, k) *
                                               rng.choice([-1, 1], k)).astype(np.float32)))
                    delayed_scenario(fmt, hlen, margin, algo, steps)
                    # Inf and NaN keep the previous scale (while they are in the window).
                    steps = [[1.0], [2.0], [np.inf], [0.5], [0.0], [np.nan, 3.0], [4.0], [0.0], [0.25]]
                    steps += [[float(v)] for v in 10.0 ** rng.uniform(-2, 2, min(hlen + 5, 80 if SAN else hlen + 5))]
                    steps += [[-np.inf], [7.0], [np.nan], [8.0]]
                    delayed_scenario(fmt, hlen, margin, algo, steps)
    print(f"[delayed scaling] {rep.passed + rep.failed - n0} checks")


# ---- accuracy ----


def test_sqnr():
    n = 256 if SAN else 1024
    x = np.random.default_rng(7).standard_normal((n, n)).astype(np.float32)
    floors = {  # loose floors (dB) below the expected figures
        (Q.MX32, Q.E4M3): 29, (Q.MX32, Q.E5M2): 23, (Q.MX32, Q.E2M1): 15,
        (Q.BLOCK32X32, Q.E4M3): 29, (Q.BLOCK32X32, Q.E5M2): 23,
        (Q.TENSOR, Q.E4M3): 29, (Q.TENSOR, Q.E5M2): 23,
        (Q.ROW, Q.E4M3): 29, (Q.ROW, Q.E5M2): 23,
        (Q.BLOCK128, Q.E4M3): 29, (Q.BLOCK128, Q.E5M2): 23,
        (Q.BLOCK128X128, Q.E4M3): 29, (Q.BLOCK128X128, Q.E5M2): 23,
    }
    print(f"[sqnr] round trip lowp_quantize -> lowp_dequantize, Gaussian {n}x{n}, default options:")
    for (kind, fmt), floor in floors.items():
        r = lib.quantize(x, fmt, kind, "row")
        data, scales, _ = r["row"]
        back = lib.dequantize(data, scales, fmt, kind, n, n)
        db = Q.sqnr_db(x, back)
        print(f"  {Q.KIND_NAMES[kind]:13s} {Q.FMT_NAMES[fmt]}: {db:6.2f} dB (floor {floor})")
        rep.check(f"sqnr {Q.KIND_NAMES[kind]} {Q.FMT_NAMES[fmt]} {db:.2f} >= {floor}", db >= floor)


def main():
    t0 = time.time()
    print(f"lowp {lib.version()}; sanitizer sizes: {SAN}")
    for fn in (test_scalar_scales, test_nan_inf_blocks, test_random_shapes, test_special_values,
               test_tensor_given_scale, test_grouped, test_amax, test_layouts, test_delayed,
               test_sqnr):
        t = time.time()
        fn()
        print(f"  ({fn.__name__}: {time.time() - t:.1f} s)")
        sys.stdout.flush()
    if skipped:
        print(f"note: the AVX-512 path answered LOWP_ERR_UNSUPPORTED for {len(skipped)} configurations "
              f"(compared on the other paths), e.g. {next(iter(skipped.items()))}")
    print(f"total {time.time() - t0:.1f} s")
    rep.finish()


if __name__ == "__main__":
    main()
