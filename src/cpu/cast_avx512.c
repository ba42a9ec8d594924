/* AVX-512 element-conversion kernels: the bulk fast paths behind lowp_cast.
 *
 * Every kernel must equal the scalar golden model (src/core/format.c) bit for bit, so each
 * mirrors its integer algorithm 16 lanes at a time: sign, biased exponent, significand,
 * rounding of the dropped bits, carry into the exponent, clamp against the largest code.
 *   - RNE takes two exact shortcuts. In the target's normal range it rounds the binary32 bit
 *     pattern itself (the mantissa's carry lands in the exponent field, as in the reference).
 *     In the target's subnormal range it is one binary32 addition of a power of two whose ulp
 *     is the target's quantum, with round-to-nearest-even fixed in the instruction (so MXCSR's
 *     rounding mode does not matter; DAZ does not either, as binary32 subnormals round to 0 in
 *     every 16-, 8- and 4-bit format).
 *   - Stochastic rounding uses the reference's fixed-point formulation directly (32 fraction
 *     bits, add the Philox word, keep the carry), with Philox4x32-10 evaluated on 16 counters
 *     at once and transposed into word order.
 *   - Decoding is integer field arithmetic plus one exact binary32 multiply for subnormal
 *     codes (whose results are binary32 normals, so FTZ cannot touch them).
 * Built with -mavx512f -mavx512bw -mavx512vl -mavx512dq and only called when the CPU has them
 * (the dispatcher in cast.c checks). The kernels never fail: the ops layer validated the
 * arguments, and the dispatcher only hands over pairs lowp_cpu_cast_avx512_supports accepts.
 */
#include <immintrin.h>

#include "cpu.h"
#include "philox_avx512.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define V32(x)        _mm512_set1_epi32((int) (uint32_t) (x))

/* ---- source loads: 16 elements as binary32 bit patterns ---- */

/* Loads elements i .. i+15 (lanes outside `m` read as +0, touching no memory). BF16 widens
 * exactly to binary32 by a shift, which is what the reference's load (bf16_decode) does. */
ALWAYS_INLINE __m512i load_src(const void *src, lowp_format sf, size_t i, __mmask16 m, int full) {
    if (sf == LOWP_FORMAT_F32) {
        const int32_t *s = (const int32_t *) src + i;
        return full ? _mm512_loadu_si512(s) : _mm512_maskz_loadu_epi32(m, s);
    }
    const uint16_t *s = (const uint16_t *) src + i;
    __m256i h = full ? _mm256_loadu_si256((const __m256i *) s) : _mm256_maskz_loadu_epi16(m, s);
    return _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
}

/* ---- encoders: binary32 bits -> target code in each 32-bit lane ---- */

/* Constants of the sign-exponent-mantissa targets (match small_spec in format.c). */
typedef struct small_fmt {
    int bits, mbits, bias;
    uint32_t max_code, over_code, nan_code;
} small_fmt;

ALWAYS_INLINE small_fmt small_of(lowp_format df) {
    switch (df) {
    case LOWP_FORMAT_E4M3: return (small_fmt){8, 3, 7, 0x7E, 0x7F, 0x7F};
    case LOWP_FORMAT_E5M2: return (small_fmt){8, 2, 15, 0x7B, 0x7C, 0x7E};
    case LOWP_FORMAT_E2M1: return (small_fmt){4, 1, 1, 0x7, 0x7, 0x0};
    default: return (small_fmt){16, 10, 15, 0x7BFF, 0x7C00, 0x7E00}; /* F16 */
    }
}

/* Final steps shared by RNE and SR: clamp the magnitude code to `lim` (fmax's code under
 * satfinite, the Inf/NaN code under nonsat; Inf inputs arrive here as huge codes, so the same
 * clamp implements the Inf rule), replace NaN lanes, attach the sign. */
ALWAYS_INLINE __m512i small_finish(__m512i u, __m512i a, __m512i code, small_fmt f, __m512i lim) {
    code = _mm512_min_epu32(code, lim);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(a, V32(0x7F800000));
    __m512i sign = _mm512_srli_epi32(u, 32 - f.bits);
    /* (sign & signbit) | code in one ternary-logic op (0xEA: (A & B) | C). */
    __m512i res = _mm512_ternarylogic_epi32(sign, V32(1u << (f.bits - 1)), code, 0xEA);
    if (f.nan_code == 0) return _mm512_maskz_mov_epi32((__mmask16) ~nan, res); /* E2M1: NaN -> +0 */
    /* NaN keeps its sign: (res & signbit) | nan_code. */
    return _mm512_mask_ternarylogic_epi32(res, nan, V32(1u << (f.bits - 1)), V32(f.nan_code), 0xEA);
}

ALWAYS_INLINE __m512i small_rne(__m512i u, small_fmt f, __m512i lim) {
    const int d = 23 - f.mbits; /* significand bits dropped in the target's normal range */
    __m512i a = _mm512_and_si512(u, V32(0x7FFFFFFF));
    /* Normal range (target exponent e >= 1): RNE on the bit pattern, folded with the rebias
     * (a multiple of 2^23, so it does not disturb the rounding of the low bits): the shifted
     * result is directly (e << mbits) + mantissa, with the mantissa's carry in e. */
    uint32_t k = ((1u << (d - 1)) - 1u) - ((uint32_t) (127 - f.bias) << 23);
    /* The ties-to-even term (the kept lsb) as a mask: one add of k or k + 1. */
    __mmask16 odd = _mm512_test_epi32_mask(a, V32(1u << d));
    __m512i cn = _mm512_srli_epi32(
        _mm512_mask_add_epi32(_mm512_add_epi32(a, V32(k)), odd, a, V32(k + 1)), d);
    /* Subnormal range: |x| + C with ulp(C) = the target's quantum 2^(1-bias-mbits), rounded
     * once to nearest-even by the hardware; the count of quanta is bits(sum) - bits(C). */
    uint32_t cbits = (uint32_t) (127 + 24 - f.bias - f.mbits) << 23;
    __m512 sum = _mm512_add_round_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(V32(cbits)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512i cs = _mm512_sub_epi32(_mm512_castps_si512(sum), V32(cbits));
    __mmask16 sub = _mm512_cmplt_epu32_mask(a, V32((uint32_t) (128 - f.bias) << 23));
    __m512i code = _mm512_mask_mov_epi32(cn, sub, cs);
    return small_finish(u, a, code, f, lim);
}

/* Stochastic rounding, the reference's algorithm lane by lane: the significand as a number of
 * target quanta with 32 fraction bits (hi.lo), plus the random word; the carry out of the
 * fraction rounds up. Variable shifts by >= 32 give 0, which is exactly the reference's
 * "v = 0" and "q = 0" for tiny inputs. */
ALWAYS_INLINE __m512i small_sr(__m512i u, __m512i r, small_fmt f, __m512i lim) {
    __m512i a = _mm512_and_si512(u, V32(0x7FFFFFFF));
    __m512i e32 = _mm512_srli_epi32(a, 23);
    __m512i m24 = _mm512_or_si512(_mm512_and_si512(a, V32(0x7FFFFF)), V32(0x800000));
    /* e - 1 with e the target's biased exponent; below 1 the quantum is fixed (subnormals). */
    __m512i em1 = _mm512_sub_epi32(e32, V32(128 - f.bias));
    __m512i extra =
        _mm512_max_epi32(_mm512_sub_epi32(_mm512_setzero_si512(), em1), _mm512_setzero_si512());
    __m512i shift = _mm512_add_epi32(extra, V32(23 - f.mbits));
    __m512i hi = _mm512_srlv_epi32(m24, shift);
    /* Counts are unsigned: a "negative" one is >= 32 and yields 0, so exactly one of the two
     * terms is nonzero (both equal m24 when shift == 32). */
    __m512i lo = _mm512_or_si512(_mm512_sllv_epi32(m24, _mm512_sub_epi32(V32(32), shift)),
                                 _mm512_srlv_epi32(m24, _mm512_sub_epi32(shift, V32(32))));
    __m512i sum = _mm512_add_epi32(lo, r);
    __mmask16 carry = _mm512_cmplt_epu32_mask(sum, lo);
    __m512i q = _mm512_mask_add_epi32(hi, carry, hi, V32(1));
    __m512i ebase = _mm512_slli_epi32(_mm512_max_epi32(em1, _mm512_setzero_si512()), f.mbits);
    __m512i code = _mm512_add_epi32(ebase, q);
    return small_finish(u, a, code, f, lim);
}

/* BF16: RNE (or SR with the top 16 random bits) on the low half, NaN -> 0x7FC0 with sign. */
ALWAYS_INLINE __m512i bf16_enc(__m512i u, __m512i r, int sr, __m512i lim) {
    __m512i a = _mm512_and_si512(u, V32(0x7FFFFFFF));
    __m512i add =
        sr ? _mm512_srli_epi32(r, 16)
           : _mm512_add_epi32(V32(0x7FFF), _mm512_and_si512(_mm512_srli_epi32(a, 16), V32(1)));
    __m512i code = _mm512_min_epu32(_mm512_srli_epi32(_mm512_add_epi32(a, add), 16), lim);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(a, V32(0x7F800000));
    code = _mm512_mask_mov_epi32(code, nan, V32(0x7FC0));
    return _mm512_ternarylogic_epi32(_mm512_srli_epi32(u, 16), V32(0x8000), code, 0xEA);
}

/* E8M0 (format.c's e8m0_encode): the value rounded half up to a power of two, i.e.
 * (u + 2^22) >> 23 for a normal input and (u + 2^21) >> 23 for a binary32 subnormal (whose
 * midpoint between 2^-127 and 2^-126 is 1.5 * 2^-127 = bits 0x600000); zero, negatives and NaN
 * give 0xFF. u - 1 >= 0x7F800000 (unsigned) catches exactly zero, negatives and NaN. */
ALWAYS_INLINE __m512i e8m0_enc(__m512i u, __m512i lim) {
    __mmask16 bad = _mm512_cmpge_epu32_mask(_mm512_sub_epi32(u, V32(1)), V32(0x7F800000));
    __mmask16 tiny = _mm512_cmplt_epu32_mask(u, V32(0x800000));
    __m512i half = _mm512_mask_mov_epi32(V32(0x400000), tiny, V32(0x200000));
    __m512i t = _mm512_add_epi32(u, half);
    __m512i code = _mm512_min_epu32(_mm512_srli_epi32(t, 23), lim);
    return _mm512_mask_mov_epi32(code, bad, V32(0xFF));
}

/* Clamp code of the nonsat/satfinite policy for df. */
static __m512i limit_of(lowp_format df, lowp_overflow ov) {
    int sat = ov == LOWP_OVERFLOW_SATFINITE;
    switch (df) {
    case LOWP_FORMAT_BF16: return V32(sat ? 0x7F7F : 0x7F80);
    case LOWP_FORMAT_E8M0: return V32(sat ? 0xFE : 0xFF);
    default: {
        small_fmt f = small_of(df);
        return V32(sat ? f.max_code : f.over_code);
    }
    }
}

ALWAYS_INLINE __m512i encode16(__m512i u, __m512i r, lowp_format df, int sr, __m512i lim) {
    switch (df) {
    case LOWP_FORMAT_BF16: return bf16_enc(u, r, sr, lim);
    case LOWP_FORMAT_E8M0: return e8m0_enc(u, lim);
    default: return sr ? small_sr(u, r, small_of(df), lim) : small_rne(u, small_of(df), lim);
    }
}

/* ---- stores of 16 codes at element i ---- */

/* E2M1: lanes 2k and 2k+1 share a byte (low, high nibble): fold each 64-bit lane's high dword
 * onto bit 4 and keep the low byte. */
ALWAYS_INLINE __m512i fp4_pairs(__m512i codes) {
    return _mm512_or_si512(codes, _mm512_srli_epi64(codes, 28));
}

/* Stores the first k (1..16) codes; k == 16 is a full store. For E2M1 with odd k, the last
 * byte's high nibble is the row's padding, which lowp always writes as 0 (tensor.h), as the
 * reference does: the lanes past k are zeroed before pairing. */
ALWAYS_INLINE void store_codes(void *dst, lowp_format df, size_t i, __m512i codes, unsigned k) {
    __mmask16 m = (__mmask16) ((1u << k) - 1u);
    switch (df) {
    case LOWP_FORMAT_BF16:
    case LOWP_FORMAT_F16: {
        uint16_t *d = (uint16_t *) dst + i;
        if (k == 16)
            _mm256_storeu_si256((__m256i *) d, _mm512_cvtepi32_epi16(codes));
        else
            _mm512_mask_cvtepi32_storeu_epi16(d, m, codes);
        break;
    }
    case LOWP_FORMAT_E2M1: {
        uint8_t *d = (uint8_t *) dst + i / 2;
        __m512i pairs = fp4_pairs(codes);
        if (k == 16) {
            _mm_storel_epi64((__m128i *) d, _mm512_cvtepi64_epi8(pairs));
        } else {
            pairs = fp4_pairs(_mm512_maskz_mov_epi32(m, codes));
            _mm512_mask_cvtepi64_storeu_epi8(d, (__mmask8) ((1u << ((k + 1) / 2)) - 1u), pairs);
        }
        break;
    }
    default: {
        uint8_t *d = (uint8_t *) dst + i;
        if (k == 16)
            _mm_storeu_si128((__m128i *) d, _mm512_cvtepi32_epi8(codes));
        else
            _mm512_mask_cvtepi32_storeu_epi8(d, m, codes);
        break;
    }
    }
}

/* Four vectors of byte codes (64 elements) as one 64-byte store. Two saturating packs
 * (values are <= 0xFF, so nothing saturates) interleave the vectors per 128-bit lane;
 * one dword permute restores element order. Cheaper than four vpmovdb. */
ALWAYS_INLINE void store_bytes64(uint8_t *d, __m512i c0, __m512i c1, __m512i c2, __m512i c3) {
    __m512i w01 = _mm512_packus_epi32(c0, c1);
    __m512i w23 = _mm512_packus_epi32(c2, c3);
    __m512i b = _mm512_packus_epi16(w01, w23);
    /* Lane q of b holds dwords (c0[q], c1[q], c2[q], c3[q]) (each 4 elements); element
     * dword v*4+q must come from q*4+v. */
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_si512(d, _mm512_permutexvar_epi32(idx, b));
}

/* ---- vectorized Philox4x32-10 ---- */

/* The word stream from word j0 on, 64 words per call, in element order. Philox runs on 16
 * consecutive counters (one per lane); the 4x16 outputs are transposed into 64 words of
 * 4 aligned blocks each, and since j0 need not be a multiple of 4, each output vector is
 * the window [s, s+16) of two consecutive aligned vectors (s = j0 % 4). */
typedef struct sr_stream {
    uint64_t blk; /* next block to generate */
    uint64_t seed;
    __m512i window; /* lane t selects word s + t of (cur[m], cur[m+1]) */
    __m512i cur[4]; /* words 4*(blk-16) .. 4*blk - 1 */
} sr_stream;

static void philox64(sr_stream *st, __m512i out[4]) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    uint64_t b = st->blk;
    st->blk += 16;
    /* Counter {lo32(b), hi32(b)} with the carry of lo + lane; the stream's block index is
     * word / 4 < 2^62, so the high word wraps at 2^30 exactly as j / 4 does in uint64. */
    __m512i c0 = _mm512_add_epi32(V32((uint32_t) b), lane);
    __mmask16 cy = _mm512_cmplt_epu32_mask(c0, V32((uint32_t) b));
    __m512i c1 =
        _mm512_mask_add_epi32(V32((uint32_t) (b >> 32)), cy, V32((uint32_t) (b >> 32)), V32(1));
    c1 = _mm512_and_si512(c1, V32(0x3FFFFFFF));
    __m512i w[4];
    lowp_philox16(st->seed, c0, c1, w);
    /* 4x4 transpose within each 128-bit lane: T_k lane q = block 4q+k, words 0..3. */
    __m512i t0 = _mm512_unpacklo_epi32(w[0], w[1]), t1 = _mm512_unpackhi_epi32(w[0], w[1]);
    __m512i t2 = _mm512_unpacklo_epi32(w[2], w[3]), t3 = _mm512_unpackhi_epi32(w[2], w[3]);
    __m512i T0 = _mm512_unpacklo_epi64(t0, t2), T1 = _mm512_unpackhi_epi64(t0, t2);
    __m512i T2 = _mm512_unpacklo_epi64(t1, t3), T3 = _mm512_unpackhi_epi64(t1, t3);
    /* Then a 4x4 transpose of 128-bit lanes: out[m] = (T0.m, T1.m, T2.m, T3.m). */
    __m512i u0 = _mm512_shuffle_i32x4(T0, T1, _MM_SHUFFLE(1, 0, 1, 0));
    __m512i u1 = _mm512_shuffle_i32x4(T2, T3, _MM_SHUFFLE(1, 0, 1, 0));
    __m512i u2 = _mm512_shuffle_i32x4(T0, T1, _MM_SHUFFLE(3, 2, 3, 2));
    __m512i u3 = _mm512_shuffle_i32x4(T2, T3, _MM_SHUFFLE(3, 2, 3, 2));
    out[0] = _mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(2, 0, 2, 0));
    out[1] = _mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(3, 1, 3, 1));
    out[2] = _mm512_shuffle_i32x4(u2, u3, _MM_SHUFFLE(2, 0, 2, 0));
    out[3] = _mm512_shuffle_i32x4(u2, u3, _MM_SHUFFLE(3, 1, 3, 1));
}

static void sr_init(sr_stream *st, uint64_t seed, uint64_t j0) {
    st->seed = seed;
    st->blk = j0 >> 2;
    st->window =
        _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         V32((uint32_t) (j0 & 3)));
    philox64(st, st->cur);
}

/* The next 64 words of the stream. */
static void sr_next(sr_stream *st, __m512i r[4]) {
    __m512i nxt[4];
    philox64(st, nxt);
    r[0] = _mm512_permutex2var_epi32(st->cur[0], st->window, st->cur[1]);
    r[1] = _mm512_permutex2var_epi32(st->cur[1], st->window, st->cur[2]);
    r[2] = _mm512_permutex2var_epi32(st->cur[2], st->window, st->cur[3]);
    r[3] = _mm512_permutex2var_epi32(st->cur[3], st->window, nxt[0]);
    for (int k = 0; k < 4; k++) st->cur[k] = nxt[k];
}

/* ---- encode driver ---- */

ALWAYS_INLINE void encode_piece(const lowp_cast_piece *p, lowp_format sf, lowp_format df, int sr) {
    /* Locals, not p->src/p->dst: the stores could alias *p as far as the compiler knows. */
    const void *const src = p->src;
    void *const dst = p->dst;
    const size_t n = p->n;
    const __m512i lim = limit_of(df, p->cfg->overflow);
    size_t i = 0;
    if (sr) {
        sr_stream st;
        sr_init(&st, p->cfg->seed, p->cfg->offset + p->idx);
        __m512i r[4];
        for (; i + 64 <= n; i += 64) {
            sr_next(&st, r);
            for (int k = 0; k < 4; k++) {
                __m512i u = load_src(src, sf, i + 16 * (size_t) k, 0xFFFF, 1);
                store_codes(dst, df, i + 16 * (size_t) k, encode16(u, r[k], df, 1, lim), 16);
            }
        }
        if (i < n) {
            sr_next(&st, r);
            for (int k = 0; k < 4 && i < n; k++, i += 16) {
                unsigned cnt = n - i < 16 ? (unsigned) (n - i) : 16;
                __m512i u = load_src(src, sf, i, (__mmask16) ((1u << cnt) - 1u), cnt == 16);
                store_codes(dst, df, i, encode16(u, r[k], df, 1, lim), cnt);
            }
        }
        return;
    }
    const __m512i zero = _mm512_setzero_si512();
    if (df == LOWP_FORMAT_E4M3 || df == LOWP_FORMAT_E5M2 || df == LOWP_FORMAT_E8M0) {
        /* The hot loop: 64 elements -> one 64-byte store, no branches. */
        uint8_t *d = (uint8_t *) dst;
        for (; i + 64 <= n; i += 64) {
            __m512i c0 = encode16(load_src(src, sf, i, 0xFFFF, 1), zero, df, 0, lim);
            __m512i c1 = encode16(load_src(src, sf, i + 16, 0xFFFF, 1), zero, df, 0, lim);
            __m512i c2 = encode16(load_src(src, sf, i + 32, 0xFFFF, 1), zero, df, 0, lim);
            __m512i c3 = encode16(load_src(src, sf, i + 48, 0xFFFF, 1), zero, df, 0, lim);
            store_bytes64(d + i, c0, c1, c2, c3);
        }
    }
    for (; i + 16 <= n; i += 16)
        store_codes(dst, df, i, encode16(load_src(src, sf, i, 0xFFFF, 1), zero, df, 0, lim), 16);
    if (i < n) {
        unsigned cnt = (unsigned) (n - i);
        __m512i u = load_src(src, sf, i, (__mmask16) ((1u << cnt) - 1u), 0);
        store_codes(dst, df, i, encode16(u, zero, df, 0, lim), cnt);
    }
}

/* ---- decoders: code in each 32-bit lane -> binary32 bits ---- */

/* Sign-exponent-mantissa formats (format.c's small_decode): normal codes move into the
 * binary32 fields by a shift and a rebias; subnormal codes are mf * 2^(1-bias-mbits), exact
 * in binary32; NaN codes give the default NaN 0x7FC00000 with the code's sign (the reference
 * returns -NAN for a negative NaN code), Inf codes give Inf. */
ALWAYS_INLINE __m512i small_dec(__m512i c, lowp_format sf) {
    small_fmt f = small_of(sf);
    int ebits = f.bits - 1 - f.mbits;
    uint32_t magmask = (1u << (f.bits - 1)) - 1u;
    __m512i mag = _mm512_and_si512(c, V32(magmask));
    __m512i sign = _mm512_slli_epi32(_mm512_and_si512(c, V32(1u << (f.bits - 1))), 32 - f.bits);
    __m512i v = _mm512_add_epi32(_mm512_slli_epi32(mag, 23 - f.mbits),
                                 V32((uint32_t) (127 - f.bias) << 23));
    __m512 subf =
        _mm512_mul_ps(_mm512_cvtepi32_ps(mag),
                      _mm512_castsi512_ps(V32((uint32_t) (128 - f.bias - f.mbits) << 23)));
    __mmask16 sub = _mm512_cmplt_epu32_mask(mag, V32(1u << f.mbits));
    v = _mm512_mask_mov_epi32(v, sub, _mm512_castps_si512(subf));
    if (sf == LOWP_FORMAT_E4M3) {
        v = _mm512_mask_mov_epi32(v, _mm512_cmpeq_epu32_mask(mag, V32(magmask)), V32(0x7FC00000));
    } else if (sf != LOWP_FORMAT_E2M1) { /* E5M2, F16: all-ones exponent is Inf or NaN */
        uint32_t infcode = ((1u << ebits) - 1u) << f.mbits;
        v = _mm512_mask_mov_epi32(v, _mm512_cmpeq_epu32_mask(mag, V32(infcode)), V32(0x7F800000));
        v = _mm512_mask_mov_epi32(v, _mm512_cmpgt_epu32_mask(mag, V32(infcode)), V32(0x7FC00000));
    }
    return _mm512_or_si512(v, sign);
}

ALWAYS_INLINE __m512i decode16(__m512i c, lowp_format sf) {
    switch (sf) {
    case LOWP_FORMAT_BF16: return _mm512_slli_epi32(c, 16);
    case LOWP_FORMAT_E8M0: {
        /* 2^(c-127); c == 0 is the binary32 subnormal 2^-127, 0xFF is NaN. */
        __m512i v = _mm512_slli_epi32(c, 23);
        v = _mm512_mask_mov_epi32(v, _mm512_cmpeq_epu32_mask(c, _mm512_setzero_si512()),
                                  V32(0x00400000));
        return _mm512_mask_mov_epi32(v, _mm512_cmpeq_epu32_mask(c, V32(0xFF)), V32(0x7FC00000));
    }
    default: return small_dec(c, sf);
    }
}

/* Codes of elements i .. i+k-1 (k in 1..16) zero-extended into 32-bit lanes. */
ALWAYS_INLINE __m512i load_codes(const void *src, lowp_format sf, size_t i, unsigned k) {
    __mmask16 m = (__mmask16) ((1u << k) - 1u);
    switch (sf) {
    case LOWP_FORMAT_BF16:
    case LOWP_FORMAT_F16: {
        const uint16_t *s = (const uint16_t *) src + i;
        return _mm512_cvtepu16_epi32(k == 16 ? _mm256_loadu_si256((const __m256i *) s)
                                             : _mm256_maskz_loadu_epi16(m, s));
    }
    case LOWP_FORMAT_E2M1: {
        /* (k+1)/2 bytes; split each into (low, high) nibble, in element order. */
        const uint8_t *s = (const uint8_t *) src + i / 2;
        __m128i b = k == 16 ? _mm_loadl_epi64((const __m128i *) s)
                            : _mm_maskz_loadu_epi8((__mmask16) ((1u << ((k + 1) / 2)) - 1u), s);
        __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
        __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
        return _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
    }
    default: {
        const uint8_t *s = (const uint8_t *) src + i;
        return _mm512_cvtepu8_epi32(k == 16 ? _mm_loadu_si128((const __m128i *) s)
                                            : _mm_maskz_loadu_epi8(m, s));
    }
    }
}

ALWAYS_INLINE void decode_piece(const lowp_cast_piece *p, lowp_format sf) {
    const void *const src = p->src; /* locals: see encode_piece */
    const size_t n = p->n;
    float *d = (float *) p->dst;
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_si512(d + i, decode16(load_codes(src, sf, i, 16), sf));
    if (i < n) {
        unsigned k = (unsigned) (n - i);
        _mm512_mask_storeu_epi32(d + i, (__mmask16) ((1u << k) - 1u),
                                 decode16(load_codes(src, sf, i, k), sf));
    }
}

/* ---- entry points ---- */

int lowp_cpu_cast_avx512_supports(lowp_format src, lowp_format dst, lowp_rounding rounding) {
    int sr = rounding == LOWP_ROUNDING_SR;
    if (dst == LOWP_FORMAT_F32) /* decode; no rounding happens */
        return src == LOWP_FORMAT_E4M3 || src == LOWP_FORMAT_E5M2 || src == LOWP_FORMAT_E2M1 ||
               src == LOWP_FORMAT_E8M0 || src == LOWP_FORMAT_BF16 || src == LOWP_FORMAT_F16;
    if (src != LOWP_FORMAT_F32 && src != LOWP_FORMAT_BF16) return 0;
    switch (dst) {
    case LOWP_FORMAT_E4M3:
    case LOWP_FORMAT_E5M2:
    case LOWP_FORMAT_E2M1:
    case LOWP_FORMAT_F16: return 1;
    case LOWP_FORMAT_BF16: return src == LOWP_FORMAT_F32;
    case LOWP_FORMAT_E8M0: return !sr; /* E8M0 has no stochastic rounding */
    default: return 0;
    }
}

/* One specialized loop per (source, target, rounding): encode_piece is always inlined with
 * constant formats, so the format switches fold away. */
#define ENC_CASES(SF)                                                                              \
    switch (p->dst_format) {                                                                       \
    case LOWP_FORMAT_E4M3:                                                                         \
        sr ? encode_piece(p, SF, LOWP_FORMAT_E4M3, 1) : encode_piece(p, SF, LOWP_FORMAT_E4M3, 0);  \
        return;                                                                                    \
    case LOWP_FORMAT_E5M2:                                                                         \
        sr ? encode_piece(p, SF, LOWP_FORMAT_E5M2, 1) : encode_piece(p, SF, LOWP_FORMAT_E5M2, 0);  \
        return;                                                                                    \
    case LOWP_FORMAT_E2M1:                                                                         \
        sr ? encode_piece(p, SF, LOWP_FORMAT_E2M1, 1) : encode_piece(p, SF, LOWP_FORMAT_E2M1, 0);  \
        return;                                                                                    \
    case LOWP_FORMAT_F16:                                                                          \
        sr ? encode_piece(p, SF, LOWP_FORMAT_F16, 1) : encode_piece(p, SF, LOWP_FORMAT_F16, 0);    \
        return;                                                                                    \
    case LOWP_FORMAT_E8M0: encode_piece(p, SF, LOWP_FORMAT_E8M0, 0); return;                       \
    default: break;                                                                                \
    }

void lowp_cpu_cast_avx512(const lowp_cast_piece *p) {
    int sr = p->cfg->rounding == LOWP_ROUNDING_SR;
    if (p->dst_format == LOWP_FORMAT_F32) {
        switch (p->src_format) {
        case LOWP_FORMAT_E4M3: decode_piece(p, LOWP_FORMAT_E4M3); return;
        case LOWP_FORMAT_E5M2: decode_piece(p, LOWP_FORMAT_E5M2); return;
        case LOWP_FORMAT_E2M1: decode_piece(p, LOWP_FORMAT_E2M1); return;
        case LOWP_FORMAT_E8M0: decode_piece(p, LOWP_FORMAT_E8M0); return;
        case LOWP_FORMAT_BF16: decode_piece(p, LOWP_FORMAT_BF16); return;
        case LOWP_FORMAT_F16: decode_piece(p, LOWP_FORMAT_F16); return;
        default: break;
        }
    } else if (p->src_format == LOWP_FORMAT_F32) {
        if (p->dst_format == LOWP_FORMAT_BF16) {
            sr ? encode_piece(p, LOWP_FORMAT_F32, LOWP_FORMAT_BF16, 1)
               : encode_piece(p, LOWP_FORMAT_F32, LOWP_FORMAT_BF16, 0);
            return;
        }
        ENC_CASES(LOWP_FORMAT_F32)
    } else if (p->src_format == LOWP_FORMAT_BF16) {
        ENC_CASES(LOWP_FORMAT_BF16)
    }
    /* Not a pair this file handles (supports() said so): the reference is always right. */
    lowp_cpu_cast_ref(p);
}
