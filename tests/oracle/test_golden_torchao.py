"""torchao's golden MXFP8 cases, byte for byte, and the worked examples of docs/numerics.md section 3.

The cases below are DATA transcribed from torchao's testing utilities (inputs as bit patterns,
expected E8M0 scale codes and E4M3 element codes); none of torchao's code is used:

- `make_mxfp8_semantic_cases(input_dtype, scaling_mode)` and `make_f32_to_e8m0_rceil_cases()`
  from pytorch/ao, torchao/testing/_mxfp8_test_utils.py at commit
  6b78bb4f7028b7104f33e49ed65d0005ea3ee64b (the FLOOR and RCEIL variants, 18 cases each);
- the four extra RCEIL cases (fp32/bf16 subnormals and realistic values, migrated from
  torchao's test_to_mx_rceil) of the version copied into pytorch/pytorch,
  torch/testing/_internal/mxfp8_test_utils.py at commit 3a6406a6050cfaa8f007c6d29017d2d057b9f730
  (itself "copied from" pytorch/ao at 3972ed015091f659418dedf12edb980a8ca56b53).

Each case is one 1x32 MX block. lowp must give exactly the expected scale and codes (torchao's
checker also accepts the E4M3 NaN 0xFF for 0x7F; docs/numerics.md pins 0x7F, so lowp gets no such
slack). The blocks are quantized as the rowwise copy (MX 1x32), as the columnwise copy of the
transposed input (MX 32x1), and as 32x32 tiles made of 32 copies of the block (BLOCK32X32),
which must all give the same bytes; on every CPU kernel path.
"""

import numpy as np

import quant_ref as Q

lib = Q.Lib()
rep = Q.Report()

# ---- make_mxfp8_semantic_cases (pytorch/ao 6b78bb4f) ----
# Inputs: (fill, {index: value}) as bit patterns, for float32 and for bfloat16 inputs (torch's
# bfloat16 values of the same case: finfo(bf16).tiny/max, and RNE casts of the fp32 patterns).
# Expected: per (mode, dtype) -> (scale code, data fill, {index: code}); "*" is any dtype.

FLOOR, RCEIL = "floor", "rceil"

SEMANTIC_CASES = [
    # name, f32 input, bf16 input, expected
    ("zero", (0x00000000, {}), (0x0000, {}),
     {(FLOOR, "*"): (0, 0x00, {}), (RCEIL, "*"): (0, 0x00, {})}),
    ("smallest_normal", (0x00800000, {}), (0x0080, {}),
     {(FLOOR, "*"): (0, 0x40, {}), (RCEIL, "*"): (0, 0x40, {})}),
    ("mixed_inf", (0x3F800000, {0: 0x7F800000}), (0x3F80, {0: 0x7F80}),
     {(FLOOR, "*"): (255, 0x7F, {}), (RCEIL, "*"): (255, 0x7F, {})}),
    ("mixed_nan", (0x3F800000, {0: 0x7FC00000}), (0x3F80, {0: 0x7FC0}),
     {(FLOOR, "*"): (255, 0x7F, {}), (RCEIL, "*"): (255, 0x7F, {})}),
    ("positive_fp8_max", (0x43E00000, {}), (0x43E0, {}),
     {(FLOOR, "*"): (127, 0x7E, {}), (RCEIL, "*"): (127, 0x7E, {})}),
    ("negative_fp8_max", (0xC3E00000, {}), (0xC3E0, {}),
     {(FLOOR, "*"): (127, 0xFE, {}), (RCEIL, "*"): (127, 0xFE, {})}),
    ("positive_dtype_max", (0x7F7FFFFF, {}), (0x7F7F, {}),
     {(FLOOR, "*"): (246, 0x7E, {}), (RCEIL, "*"): (247, 0x78, {})}),
    ("negative_dtype_max", (0xFF7FFFFF, {}), (0xFF7F, {}),
     {(FLOOR, "*"): (246, 0xFE, {}), (RCEIL, "*"): (247, 0xF8, {})}),
    ("positive_smallest_subnormal", (0x00000001, {}), (0x0001, {}),
     {(FLOOR, "f32"): (0, 0x00, {}), (FLOOR, "bf16"): (0, 0x08, {}),
      (RCEIL, "f32"): (0, 0x00, {}), (RCEIL, "bf16"): (0, 0x08, {})}),
    ("negative_smallest_subnormal", (0x80000001, {}), (0x8001, {}),
     {(FLOOR, "f32"): (0, 0x80, {}), (FLOOR, "bf16"): (0, 0x88, {}),
      (RCEIL, "f32"): (0, 0x80, {}), (RCEIL, "bf16"): (0, 0x88, {})}),
    ("mixed_positive_underflow", (0x3F800000, {0: 0x00000001}), (0x3F80, {0: 0x0001}),
     {(FLOOR, "*"): (119, 0x78, {0: 0x00}), (RCEIL, "*"): (119, 0x78, {0: 0x00})}),
    ("mixed_negative_underflow", (0x3F800000, {0: 0x80000001}), (0x3F80, {0: 0x8001}),
     {(FLOOR, "*"): (119, 0x78, {0: 0x80}), (RCEIL, "*"): (119, 0x78, {0: 0x80})}),
    ("mixed_saturation_and_underflow", (0x3F800000, {0: 0x7F7FFFFF}), (0x3F80, {0: 0x7F7F}),
     {(FLOOR, "*"): (246, 0x00, {0: 0x7E}), (RCEIL, "*"): (247, 0x00, {0: 0x78})}),
    ("rceil_premature_bf16_lowers_scale", (0x40600001, {}), (0x4060, {}),
     {(FLOOR, "*"): (120, 0x7E, {}), (RCEIL, "f32"): (121, 0x76, {}),
      (RCEIL, "bf16"): (120, 0x7E, {})}),
    ("floor_premature_bf16_raises_scale", (0x43FFFFFF, {}), (0x4400, {}),
     {(FLOOR, "f32"): (127, 0x7E, {}), (FLOOR, "bf16"): (128, 0x78, {}),
      (RCEIL, "*"): (128, 0x78, {})}),
    ("all_nan", (0x7FC00000, {}), (0x7FC0, {}),
     {(FLOOR, "*"): (255, 0x7F, {}), (RCEIL, "*"): (255, 0x7F, {})}),
    ("positive_satfinite", (0x43F00000, {}), (0x43F0, {}),
     {(FLOOR, "*"): (127, 0x7E, {}), (RCEIL, "*"): (128, 0x77, {})}),
    ("negative_satfinite", (0xC3F00000, {}), (0xC3F0, {}),
     {(FLOOR, "*"): (127, 0xFE, {}), (RCEIL, "*"): (128, 0xF7, {})}),
]

# ---- the extra RCEIL cases of pytorch/pytorch 3a6406a6 (one dtype each) ----
# (name, dtype, {index: input bits} over zeros, scale code, {index: element code} over 0x00)
EXTRA_RCEIL_CASES = [
    ("fp32_subnormals", "f32", {0: 6142315, 1: 5096174, 2: 3345704, 3: 33075},
     0, {0: 60, 1: 58, 2: 53, 3: 4}),
    ("fp32_realistic_vals", "f32", {0: 1037408064, 1: 1058534842, 2: 994704128, 3: 1064831570},
     119, {0: 93, 1: 113, 2: 53, 3: 120}),
    ("bf16_subnormals", "bf16", {0: 101, 1: 3, 2: 47, 3: 120},
     0, {0: 61, 1: 20, 2: 52, 3: 63}),
    ("bf16_realistic_vals", "bf16", {0: 16223, 1: 16248, 2: 15696, 3: 15956},
     119, {0: 118, 1: 120, 2: 85, 3: 101}),
]

# ---- make_f32_to_e8m0_rceil_cases (pytorch/ao 6b78bb4f): bits of d = amax/fmax -> code ----
RCEIL_D_CASES = [
    (0x00000000, 0), (0x00000001, 0), (0x00400000, 0), (0x00400001, 1), (0x007FFFFF, 1),
    (0x00800000, 1), (0x1F800000, 63), (0x1F800001, 64), (0x3F7FFFFF, 127), (0x3F800000, 127),
    (0x3F800001, 128), (0x5F800000, 191), (0x5F800001, 192), (0x7F000000, 254),
    (0x7F000001, 255), (0x7F7FFFFF, 255), (0x7F800000, 255), (0x7FC00000, 255),
]

PATHS = [(Q.PATH_REFERENCE, 0), (Q.PATH_AUTO, 0), (Q.PATH_AVX512, 0)]
MODE_ID = {FLOOR: Q.FLOOR, RCEIL: Q.RCEIL}


def block(fill, overrides, dtype):
    v = np.full(32, fill, np.uint32 if dtype == "f32" else np.uint16)
    for i, b in overrides.items():
        v[i] = b
    return v.view(np.float32) if dtype == "f32" else v


def expected_codes(fill, overrides):
    v = np.full(32, fill, np.uint8)
    for i, c in overrides.items():
        v[i] = c
    return v


def build(mode, dtype):
    """All cases of one (mode, dtype): inputs [n, 32], names, scales [n], codes [n, 32]."""
    names, rows, scales, codes = [], [], [], []
    for name, in32, in16, exp in SEMANTIC_CASES:
        e = exp.get((mode, dtype), exp.get((mode, "*")))
        fill, ov = in32 if dtype == "f32" else in16
        names.append(name)
        rows.append(block(fill, ov, dtype))
        scales.append(e[0])
        codes.append(expected_codes(e[1], e[2]))
    if mode == RCEIL:
        for name, dt, ov, sc, cov in EXTRA_RCEIL_CASES:
            if dt == dtype:
                names.append(name)
                rows.append(block(0, ov, dtype))
                scales.append(sc)
                codes.append(expected_codes(0, cov))
    return names, np.stack(rows), np.array(scales, np.uint8), np.stack(codes)


def quantize_or_skip(x, kind, orient, xfmt, mode, path):
    try:
        return lib.quantize(x, Q.E4M3, kind, orient, xfmt=xfmt, mode=mode, path=path)
    except Q.LowpError as e:
        if path == Q.PATH_AVX512 and e.status == Q.ERR_UNSUPPORTED:
            return None
        raise


def check_case_rows(tag, names, got_scales, got_codes, want_scales, want_codes):
    for i, name in enumerate(names):
        rep.check(f"{tag} {name}: scale", got_scales[i] == want_scales[i],
                  [f"lowp {int(got_scales[i])} expected {int(want_scales[i])}"])
        rep.check(f"{tag} {name}: data", np.array_equal(got_codes[i], want_codes[i]),
                  [f"lowp     {[hex(int(c)) for c in got_codes[i]]}",
                   f"expected {[hex(int(c)) for c in want_codes[i]]}"])


def test_semantic_cases():
    for mode in (FLOOR, RCEIL):
        for dtype in ("f32", "bf16"):
            names, x, want_s, want_c = build(mode, dtype)
            xfmt = Q.F32 if dtype == "f32" else Q.BF16
            n = len(names)
            for path, _ in PATHS:
                tag = f"torchao {mode} {dtype} path={path}"
                r = quantize_or_skip(x, Q.MX32, "row", xfmt, MODE_ID[mode], path)
                if r is None:
                    continue
                data, scales, _ = r["row"]
                check_case_rows(tag + " mx 1x32", names, scales[:, 0], data, want_s, want_c)
                # The columnwise copy of the transposed input is the same blocks.
                xt = np.ascontiguousarray(x.T)
                r = quantize_or_skip(xt, Q.MX32, "col", xfmt, MODE_ID[mode], path)
                if r is not None:
                    data, scales, _ = r["col"]
                    check_case_rows(tag + " mx 32x1", names, scales[:, 0], data, want_s, want_c)
                # 32x32 tiles of 32 identical rows have the block's amax: the same bytes.
                tiles = np.repeat(x, 32, axis=0)  # [n*32, 32]
                r = quantize_or_skip(tiles, Q.BLOCK32X32, "row", xfmt, MODE_ID[mode], path)
                if r is not None:
                    data, scales, _ = r["row"]
                    check_case_rows(tag + " block32x32", names, scales[:, 0],
                                    data.reshape(n, 32, 32)[:, 0, :], want_s, want_c)
                    rep.check(tag + " block32x32 rows of a tile agree",
                              np.all(data.reshape(n, 32, 32) == data.reshape(n, 32, 32)[:, :1, :]))
            # The scalar scale function agrees on each case's amax.
            for i, name in enumerate(names):
                xv = x[i].astype(np.float32) if dtype == "f32" else Q.bf16_bits_to_f32(x[i])
                amax = np.max(np.abs(xv))
                got = lib.e8m0_scale(amax, Q.E4M3, MODE_ID[mode])
                rep.check(f"lowp_e8m0_scale torchao {mode} {dtype} {name}", got == want_s[i],
                          [f"amax {float(amax)!r}: lowp {got} expected {int(want_s[i])}"])


def amax_for_d(d_bits, fmt):
    """A float32 amax whose RCEIL quotient fl32(amax * fl32(1/fmax)) has the bits d_bits, or
    None where no finite amax gets there."""
    c = np.float32(1.0) / Q.ELEM[fmt].fmax
    d = Q.f32(np.uint32(d_bits))[()]
    if d == 0:
        return np.float32(0.0)
    with np.errstate(over="ignore"):
        a0 = np.float32(float(d) / float(c))
    if not np.isfinite(a0):
        return None
    for k in range(-4, 5):
        a = Q.f32(np.uint32(int(Q.bits32(a0)[()]) + k))[()]
        with np.errstate(over="ignore"):
            if np.isfinite(a) and Q.bits32(np.float32(a * c))[()] == d_bits:
                return a
    return None


def test_rceil_d_cases():
    """make_f32_to_e8m0_rceil_cases: each d is reached through an amax of some element format
    (the function torchao tests takes d = amax/fmax itself). d above 2^127 needs an amax past
    FLT_MAX: no finite block gets there (docs/numerics.md: torchao's function says 255 there, TE
    caps at 254); tests/c/test_quant.c checks those patterns on lowp's rounding rule directly.
    Inf and NaN d come from an Inf or NaN amax."""
    unreachable = []
    for d_bits, want in RCEIL_D_CASES:
        name = f"torchao f32_to_e8m0_rceil d=0x{d_bits:08X}"
        if d_bits >= 0x7F800000:
            amax = Q.f32(np.uint32(d_bits))[()]
            for fmt in (Q.E4M3, Q.E5M2, Q.E2M1):
                got = lib.e8m0_scale(amax, fmt, Q.RCEIL)
                rep.check(f"{name} via amax {float(amax)} {Q.FMT_NAMES[fmt]}", got == want,
                          [f"lowp {got} expected {want}"])
            continue
        reached = False
        for fmt in (Q.E4M3, Q.E5M2, Q.E2M1):
            amax = amax_for_d(d_bits, fmt)
            if amax is None:
                continue
            reached = True
            got = lib.e8m0_scale(amax, fmt, Q.RCEIL)
            rep.check(f"{name} via amax 0x{int(Q.bits32(amax)[()]):08X} {Q.FMT_NAMES[fmt]}",
                      got == want, [f"lowp {got} expected {want}"])
            # ... and through a quantized block whose amax it is.
            x = np.zeros((1, 32), np.float32)
            x[0, 7] = amax
            x[0, 8] = -amax / np.float32(3)
            r = lib.quantize(x, fmt, Q.MX32, "row", mode=Q.RCEIL)
            rep.check(f"{name} via lowp_quantize {Q.FMT_NAMES[fmt]}", r["row"][1][0, 0] == want,
                      [f"lowp {int(r['row'][1][0, 0])} expected {want}"])
        if not reached:
            unreachable.append(f"0x{d_bits:08X}")
    print(f"note: d patterns no finite amax reaches (checked in test_quant.c): {', '.join(unreachable)}")
    rep.check("only d >= 2^127 is unreachable", all(int(u, 16) >= 0x7F000000 for u in unreachable),
              [f"unreachable: {unreachable}"])


def test_numerics_examples():
    """docs/numerics.md section 3: a block whose amax is 480 gives FLOOR code 127 with element 0x7E
    (448) and RCEIL code 128 with element 0x77 (240); amax 2^-126 gives FLOOR code 0 with
    element 0x40."""
    cases = [(480.0, Q.FLOOR, 127, 0x7E), (480.0, Q.RCEIL, 128, 0x77),
             (2.0 ** -126, Q.FLOOR, 0, 0x40)]
    for amax, mode, code, elem in cases:
        name = f"docs/numerics.md amax={amax!r} {Q.MODE_NAMES[mode]}"
        rep.check(name + " lowp_e8m0_scale", lib.e8m0_scale(np.float32(amax), Q.E4M3, mode) == code)
        x = np.zeros((2, 32), np.float32)
        x[0, 5] = amax
        x[1, :] = amax  # a block of amax everywhere
        for path, _ in PATHS:
            r = quantize_or_skip(x, Q.MX32, "row", Q.F32, mode, path)
            if r is None:
                continue
            data, scales, _ = r["row"]
            rep.check(f"{name} path={path} scale", np.all(scales[:, 0] == code),
                      [f"lowp {scales[:, 0].tolist()} expected {code}"])
            rep.check(f"{name} path={path} element", data[0, 5] == elem and np.all(data[1] == elem),
                      [f"lowp 0x{int(data[0, 5]):02X} expected 0x{elem:02X}"])


def main():
    test_semantic_cases()
    test_rceil_d_cases()
    test_numerics_examples()
    rep.finish()


if __name__ == "__main__":
    main()
