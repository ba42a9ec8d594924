"""An independent Python reference of lowp's NVFP4 quantization and GEMM (docs/numerics.md
section 4b and section 6), written from the document only (not from the C code).

Arithmetic: every binary32 rounding step of the rules is computed in numpy float64 and rounded
once to float32. For one +, -, * or / of binary32 operands that is the correctly rounded binary32
result: float64 has 53 >= 2 * 24 + 2 bits, so the double rounding is innocuous (Figueroa, "When
is double rounding innocuous?", 1995). Element and scale conversions are ml_dtypes casts
(float8_e4m3fn, float4_e2m1fn, both round to nearest even), after clamping to the format's
largest finite value (satfinite).

Arrays: inputs are 2-D float32; element codes are uint8, one 4-bit code per element (unpacked);
block scales are uint8 E4M3 codes in lowp's canonical layout ([rows, ceil(cols/16)] for 1x16
blocks, [ceil(rows/16), ceil(cols/16)] for 16x16 tiles); the tensor decode scale is a float32.
"""

import ml_dtypes
import numpy as np

FLT_MAX = np.float64(np.finfo(np.float32).max)
BS = 16  # block length and tile side
SIXTH = np.float64(np.float32(1.0 / 6.0))  # the binary32 constant 1/6


def cdiv(a, b):
    return -(-a // b)


def r32(x):
    """Round float64 values to binary32 (RNE; overflow to +-Inf as IEEE), kept as float64."""
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float64).astype(np.float32).astype(np.float64)


def tensor_scale(amax):
    """Step 1: (encode scale S, decode scale 1/S) of a tensor whose amax is `amax`."""
    amax = np.float64(amax)
    if not (amax > 0) or np.isinf(amax):
        s = np.float64(1.0)
    else:
        with np.errstate(over="ignore", divide="ignore"):
            s = r32(2688.0 / amax)
        if np.isinf(s):
            s = FLT_MAX
    return s, r32(1.0 / s)


def e4m3_codes(v):
    """RNE satfinite E4M3 codes of non-negative finite values."""
    v = np.minimum(np.asarray(v, np.float64), 448.0).astype(np.float32)
    return np.ascontiguousarray(v.astype(ml_dtypes.float8_e4m3fn)).view(np.uint8)


def e4m3_values(codes):
    c = np.ascontiguousarray(np.asarray(codes, np.uint8))
    return c.view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def e2m1_codes(v):
    """RNE satfinite E2M1 codes (low nibble) of non-NaN values; the sign of zero is kept."""
    v = np.clip(np.asarray(v, np.float64), -6.0, 6.0).astype(np.float32)
    return np.ascontiguousarray(v.astype(ml_dtypes.float4_e2m1fn)).view(np.uint8) & 0xF


def e2m1_values(codes):
    c = np.ascontiguousarray(np.asarray(codes, np.uint8) & 0xF)
    return c.view(ml_dtypes.float4_e2m1fn).astype(np.float64)


def block_codes(bamax, s_enc):
    """Step 2: E4M3 codes of blocks whose amaxes are `bamax` (0x7F where NaN or Inf)."""
    bamax = np.asarray(bamax, np.float64)
    bad = ~np.isfinite(bamax)
    v = r32(np.where(bad, 0.0, bamax) * r32(np.float64(s_enc) * SIXTH))
    codes = e4m3_codes(v)
    codes[bad] = 0x7F
    return codes


def elem_factor(codes, s_dec):
    """Step 3: 1 / (decode(code) * s_dec), FLT_MAX where that is +Inf."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        f = r32(1.0 / r32(e4m3_values(codes) * np.float64(s_dec)))
    return np.where(np.isinf(f), FLT_MAX, f)


def _blocks(x, br, bc):
    """x zero-padded to whole [br, bc] blocks, as [nbr, nbc, br*bc] (padding never changes an
    amax), and the padded shape."""
    R, C = x.shape
    pr, pc = -(-R // br) * br, -(-C // bc) * bc
    p = np.zeros((pr, pc), np.float64)
    p[:R, :C] = x
    return p.reshape(pr // br, br, pc // bc, bc).transpose(0, 2, 1, 3).reshape(
        pr // br, pc // bc, br * bc), (pr, pc)


def _unblocks(b, br, bc, shape, R, C):
    pr, pc = shape
    return b.reshape(pr // br, pc // bc, br, bc).transpose(0, 2, 1, 3).reshape(pr, pc)[:R, :C]


def tensor_amax(x):
    x = np.asarray(x, np.float64)
    if x.size == 0:
        return 0.0
    return np.nan if np.isnan(x).any() else float(np.max(np.abs(x)))


def quantize_blocks(x, s_enc, s_dec, br, bc):
    """Steps 2-4 on blocks of [br, bc]: (element codes [R, C], block scale codes)."""
    x = np.asarray(x, np.float64)
    R, C = x.shape
    b, shape = _blocks(x, br, bc)
    with np.errstate(invalid="ignore"):
        bamax = np.max(np.abs(b), axis=2) if b.size else np.zeros(b.shape[:2])
    bamax = np.where(np.isnan(b).any(axis=2), np.nan, bamax) if b.size else bamax
    codes = block_codes(bamax, s_enc)
    f = elem_factor(codes, s_dec)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = r32(b * f[:, :, None])
    nanblk = (codes == 0x7F)[:, :, None]
    e = e2m1_codes(np.where(nanblk, 0.0, scaled))
    e = np.where(nanblk, 0, e).astype(np.uint8)
    return _unblocks(e, br, bc, shape, R, C).astype(np.uint8), codes


def quantize(x, tiles=False):
    """NVFP4 of x [R, C] along its rows: 1x16 blocks, or 16x16 tiles when `tiles`.
    Returns (element codes [R, C], block scale codes, tensor decode scale)."""
    s_enc, s_dec = tensor_scale(tensor_amax(x))
    codes, scales = quantize_blocks(x, s_enc, s_dec, BS if tiles else 1, BS)
    return codes, scales, s_dec


def quantize_grouped(x, offs):
    """The columnwise copy of x [M, K] along tokens with blocks restarting at every group:
    (codes [K, M], scales [K, sum_g ceil(size_g/16)], tensor decode scale). The tensor scale is
    that of the tokens in groups (rows [0, offs[-1]) of x); tokens past offs[-1] hold code 0."""
    x = np.asarray(x, np.float64)
    M, K = x.shape
    used = int(offs[-1]) if len(offs) else 0
    s_enc, s_dec = tensor_scale(tensor_amax(x[:used]))
    codes = np.zeros((K, M), np.uint8)
    scales, start = [], 0
    for end in offs:
        end = int(end)
        if end > start:
            c, s = quantize_blocks(x[start:end].T, s_enc, s_dec, 1, BS)
            codes[:, start:end] = c
            scales.append(s)
        start = end
    sc = np.concatenate(scales, axis=1) if scales else np.zeros((K, 0), np.uint8)
    return codes, sc, s_dec


def expand_scales(scales, R, C, tiles=False):
    """Per-element block scale codes [R, C] of canonical scales."""
    br = BS if tiles else 1
    return np.repeat(np.repeat(scales, br, axis=0), BS, axis=1)[:R, :C]


def dequantize(codes, scales, s_dec, tiles=False):
    """Step 5: (decode(q) * decode(s)) * s_dec, rounded once to binary32 (the first product is
    exact); a NaN block scale gives NaN."""
    R, C = codes.shape
    sv = e4m3_values(expand_scales(scales, R, C, tiles))
    with np.errstate(invalid="ignore"):
        return r32(e2m1_values(codes) * sv * np.float64(s_dec)).astype(np.float32)


def pack(codes):
    """Two E2M1 codes a byte along each row, element 2i in the low nibble."""
    codes = np.asarray(codes, np.uint8)
    R, C = codes.shape
    p = np.zeros((R, (C + 1) // 2), np.uint8)
    p |= codes[:, 0::2]
    p[:, : C // 2] |= codes[:, 1::2] << 4
    return p


def unpack(packed, cols):
    packed = np.asarray(packed, np.uint8)
    out = np.zeros((packed.shape[0], packed.shape[1] * 2), np.uint8)
    out[:, 0::2] = packed & 0xF
    out[:, 1::2] = packed >> 4
    return out[:, :cols]
