/* AVX-512 quantization kernels (NUMERICS.md sections 3-4), bit-exact with quant_ref.c.
 *
 * Structure. Every kind is built from a few 16-lane pieces:
 *   - loads of 32 consecutive input elements as two binary32 vectors. F32 keeps natural order;
 *     BF16 is widened by unpacking with a zero vector (no shift needed), which interleaves
 *     groups of four elements across the two vectors. Packing and the column addresses of the
 *     transposed copy undo that order, so no permute is spent on the loads;
 *   - amax as an unsigned maximum of |x| bit patterns: NaN patterns sort above Inf above every
 *     finite value, so the integer maximum is NaN-propagating like lowp_amax_acc, and one test
 *     (>= 0x7F800000) finds the blocks whose E8M0 scale is 0xFF;
 *   - per-block maxima of 16 blocks reduced together by a transposing tree (3 ops a level);
 *   - the E8M0 scale rule vectorized over 16 blocks (mirrors lowp_rule_e8m0_code; the test
 *     sweeps amax bit patterns against the reference) and the binary32 rules, which are cheap
 *     per 128 elements or per row, called as the scalar functions of scale_rules.h;
 *   - a 16-lane integer encoder (enc16) with one hardware rounding: |y| + C, where C is a
 *     power of two whose ulp is the target's quantum at |y|'s exponent (the quantum stops
 *     shrinking at the target's smallest normal exponent, so subnormal targets come out of
 *     the same add). The add is pinned to round-to-nearest-even, so MXCSR cannot change it;
 *   - byte packing with two saturating packs and one permute per 64 codes (cheaper than four
 *     vpmovdb), nibble merging for E2M1, and for the columnwise copy a register transpose:
 *     4x4 byte tiles by vpshufb, then an 8x16 dword transpose by unpacks and vpermt2q.
 *
 * E8M0 kinds need no NaN logic in the encoder: a block holding NaN or Inf gets scale 0xFF, and
 * every other block's scaled values are bounded by 2^(emax+1). Such blocks are encoded with a
 * dummy factor and then overwritten with the NaN code, outside the inner loops. The binary32
 * kinds keep the per-element NaN and Inf rules (NaN keeps its sign there).
 *
 * Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq; quant.c calls it only when the CPU
 * has AVX-512F/BW. It never fails: the ops layer validated the arguments.
 */
#include <immintrin.h>

#include "core/scale_rules.h"
#include "quant_kernels.h"

#define AI static inline __attribute__((always_inline))
#define V32(x) _mm512_set1_epi32((int) (uint32_t) (x))

static const lowp_format F32 = LOWP_FORMAT_F32;
static const lowp_format E2M1 = LOWP_FORMAT_E2M1;

/* ---- small helpers ---- */

AI __mmask16 mask16(int64_t n) {
    return n <= 0 ? 0 : n >= 16 ? (__mmask16) 0xFFFF : (__mmask16) ((1u << n) - 1u);
}
AI __mmask32 mask32(int64_t n) {
    return n <= 0 ? 0 : n >= 32 ? (__mmask32) 0xFFFFFFFFu : (__mmask32) ((1u << n) - 1u);
}
AI __mmask64 mask64(int64_t n) {
    return n <= 0 ? 0 : n >= 64 ? (__mmask64) ~0ull : (__mmask64) ((1ull << n) - 1ull);
}
AI size_t xsize(lowp_format xf) { return xf == F32 ? 4 : 2; }
/* Bytes of one output row of n codes (E2M1 packs two per byte). */
AI size_t code_bytes(lowp_format ef, int64_t n) {
    return ef == E2M1 ? (size_t) (n + 1) / 2 : (size_t) n;
}
AI const char *xrow(const lowp_quant_job *j, lowp_format xf, int64_t r) {
    return (const char *) j->x + (size_t) r * (size_t) j->cols * xsize(xf);
}

/* ---- element formats ---- */

AI int ef_mbits(lowp_format ef) { return ef == LOWP_FORMAT_E4M3 ? 3 : ef == E2M1 ? 1 : 2; }
AI int ef_bias(lowp_format ef) { return ef == LOWP_FORMAT_E4M3 ? 7 : ef == E2M1 ? 1 : 15; }
AI int ef_emax(lowp_format ef) { return ef == LOWP_FORMAT_E4M3 ? 8 : ef == E2M1 ? 2 : 15; }
AI uint32_t ef_maxcode(lowp_format ef) {
    return ef == LOWP_FORMAT_E4M3 ? 0x7E : ef == E2M1 ? 0x7 : 0x7B;
}
AI uint32_t ef_nancode(lowp_format ef) {
    return ef == LOWP_FORMAT_E4M3 ? 0x7F : ef == E2M1 ? 0x0 : 0x7E;
}
AI int ef_bits(lowp_format ef) { return ef == E2M1 ? 4 : 8; }

/* Satfinite RNE codes of the 16 binary32 values y (NUMERICS.md section 2), in 32-bit lanes.
 * With `special` set, NaN gives sign|NaN code and Inf and overflow give sign|max code, as the
 * reference does; without it the caller guarantees finite |y| < 2^(emax+2) (E8M0 blocks). */
AI __m512i enc16(__m512 y, lowp_format ef, int special) {
    const int m = ef_mbits(ef), b = ef_bias(ef);
    const uint32_t minn = (uint32_t) (128 - b) << 23;     /* bits of the smallest normal */
    const uint32_t k = (uint32_t) (128 - b) << m;         /* exponent part of that code */
    const __m512i u = _mm512_castps_si512(y);
    __m512i a = _mm512_and_si512(u, V32(0x7FFFFFFF));
    __m512i ac = a;
    /* Everything at or above 2^(emax+2) saturates; clamping keeps C's exponent in range. */
    if (special) ac = _mm512_min_epu32(a, V32((uint32_t) (127 + ef_emax(ef) + 2) << 23));
    __m512i e = _mm512_max_epu32(_mm512_and_si512(ac, V32(0x7F800000)), V32(minn));
    __m512i c = _mm512_add_epi32(e, V32((uint32_t) (23 - m) << 23)); /* ulp(C) = quantum */
    __m512 s = _mm512_add_round_ps(_mm512_castsi512_ps(ac), _mm512_castsi512_ps(c),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* quanta above C (0 .. 2^(m+1)), plus the exponent field: the carry of a rounding that
     * reaches the next binade lands in the exponent for free. */
    __m512i code = _mm512_add_epi32(_mm512_sub_epi32(_mm512_castps_si512(s), c),
                                    _mm512_srli_epi32(e, 23 - m));
    code = _mm512_sub_epi32(_mm512_min_epu32(code, V32(ef_maxcode(ef) + k)), V32(k));
    if (special) {
        __mmask16 nan = _mm512_cmpgt_epu32_mask(a, V32(0x7F800000));
        code = _mm512_mask_mov_epi32(code, nan, V32(ef_nancode(ef)));
    }
    /* sign | code in one ternary op ((A & B) | C). */
    const int bits = ef_bits(ef);
    return _mm512_ternarylogic_epi32(_mm512_srli_epi32(u, 32 - bits), V32(1u << (bits - 1)), code,
                                     0xEA);
}

/* ---- loads ---- */

/* Input elements [0, n) at p (n <= 32; the rest read as +0 and touch no memory) as two
 * binary32 vectors. F32: lo = elements 0-15, hi = 16-31. BF16 (unpack with zero): lo holds
 * elements 0-3, 8-11, 16-19, 24-27 and hi the other groups of four. `full` says n == 32. */
AI void ld32(const void *p, lowp_format xf, int64_t n, int full, __m512 *lo, __m512 *hi) {
    if (xf == F32) {
        const float *f = (const float *) p;
        *lo = full ? _mm512_loadu_ps(f) : _mm512_maskz_loadu_ps(mask16(n), f);
        *hi = full ? _mm512_loadu_ps(f + 16) : _mm512_maskz_loadu_ps(mask16(n - 16), f + 16);
    } else {
        __m512i v = full ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(mask32(n), p);
        *lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), v));
        *hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), v));
    }
}

/* One half (h = 0: lo, 1: hi) of ld32. */
AI __m512 ld_half(const void *p, lowp_format xf, int h, int64_t n, int full) {
    if (xf == F32) {
        const float *f = (const float *) p + 16 * h;
        return full ? _mm512_loadu_ps(f) : _mm512_maskz_loadu_ps(mask16(n - 16 * h), f);
    }
    __m512i v = full ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(mask32(n), p);
    return _mm512_castsi512_ps(h ? _mm512_unpackhi_epi16(_mm512_setzero_si512(), v)
                                 : _mm512_unpacklo_epi16(_mm512_setzero_si512(), v));
}

/* The column (0..31) that lane k of half h of ld32 holds. */
AI int lane_col(lowp_format xf, int h, int k) {
    return xf == F32 ? 16 * h + k : 8 * (k >> 2) + 4 * h + (k & 3);
}

/* |x| bit patterns of 32 elements folded to 16 lanes (each the max of two elements). */
AI __m512i amax32(const void *p, lowp_format xf, int64_t n, int full) {
    if (xf == F32) {
        __m512 lo, hi;
        ld32(p, xf, n, full, &lo, &hi);
        return _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(lo), V32(0x7FFFFFFF)),
                                _mm512_and_si512(_mm512_castps_si512(hi), V32(0x7FFFFFFF)));
    }
    __m512i v = full ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(mask32(n), p);
    __m512i a = _mm512_and_si512(v, V32(0x7FFF7FFF));
    return _mm512_max_epu32(_mm512_slli_epi32(a, 16), _mm512_and_si512(a, V32(0xFFFF0000)));
}

/* Horizontal maximum of one vector of |x| patterns, as a float (NaN if any lane is NaN). */
AI float hmax(__m512i m) { return lowp_u2f(_mm512_reduce_max_epu32(m)); }

/* The maxima of 16 vectors, lane b = max over m[b]. Each level pairs vectors and halves the
 * lanes each contributes (256-bit halves, 128-bit lanes, qwords, dwords), 3 ops per pair. */
AI __m512i tree16(const __m512i m[16]) {
    __m512i n[8], o[4], p[2];
    for (int i = 0; i < 8; i++)
        n[i] = _mm512_max_epu32(_mm512_shuffle_i32x4(m[2 * i], m[2 * i + 1], 0x44),
                                _mm512_shuffle_i32x4(m[2 * i], m[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++) /* 128-bit lanes: blocks 4i .. 4i+3 */
        o[i] = _mm512_max_epu32(_mm512_shuffle_i32x4(n[2 * i], n[2 * i + 1], 0x88),
                                _mm512_shuffle_i32x4(n[2 * i], n[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++) /* lane L: dwords 0-1 block 8i+L, dwords 2-3 block 8i+4+L */
        p[i] = _mm512_max_epu32(_mm512_unpacklo_epi64(o[2 * i], o[2 * i + 1]),
                                _mm512_unpackhi_epi64(o[2 * i], o[2 * i + 1]));
    /* dwords (0,2) of each lane against (1,3): lane 4L+t holds block L + 4t */
    const __m512 p0 = _mm512_castsi512_ps(p[0]), p1 = _mm512_castsi512_ps(p[1]);
    __m512i q = _mm512_max_epu32(_mm512_castps_si512(_mm512_shuffle_ps(p0, p1, 0x88)),
                                 _mm512_castps_si512(_mm512_shuffle_ps(p0, p1, 0xDD)));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_epi32(idx, q);
}

/* ---- E8M0 scales ---- */

/* lowp_rule_e8m0_code of 16 amax patterns a (|amax| bits), lane by lane. */
AI __m512i e8m0_codes(__m512i a, const lowp_format_traits *t, lowp_scale_mode mode) {
    __m512i e;
    switch (mode) {
    case LOWP_SCALE_FLOOR: e = _mm512_sub_epi32(_mm512_srli_epi32(a, 23), V32(t->emax)); break;
    case LOWP_SCALE_CEIL:
        e = _mm512_srli_epi32(a, 23);
        e = _mm512_mask_add_epi32(e, _mm512_test_epi32_mask(a, V32(0x7FFFFF)), e, V32(1));
        e = _mm512_sub_epi32(e, V32(t->emax));
        break;
    case LOWP_SCALE_EVEN: {
        __m512i b = _mm512_and_si512(_mm512_add_epi32(a, V32(1u << (22 - t->mbits))),
                                     V32(0xFF800000));
        e = _mm512_sub_epi32(_mm512_srli_epi32(b, 23), V32(t->emax));
        break;
    }
    default: { /* RCEIL: the same binary32 multiply by the same constant 1/fmax */
        const float inv = 1.0f / t->fmax;
        __m512i d = _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(inv)));
        __m512i de = _mm512_srli_epi32(d, 23), dm = _mm512_and_si512(d, V32(0x7FFFFF));
        e = _mm512_mask_add_epi32(de, _mm512_test_epi32_mask(dm, dm), de, V32(1));
        __m512i sub = _mm512_maskz_mov_epi32(_mm512_cmpgt_epu32_mask(dm, V32(0x400000)), V32(1));
        e = _mm512_mask_mov_epi32(e, _mm512_cmpeq_epi32_mask(de, _mm512_setzero_si512()), sub);
        break;
    }
    }
    e = _mm512_min_epi32(_mm512_max_epi32(e, _mm512_setzero_si512()), V32(254));
    return _mm512_mask_mov_epi32(e, _mm512_cmpge_epu32_mask(a, V32(0x7F800000)), V32(0xFF));
}

/* lowp_rule_e8m0_quant_factor of 16 codes; 0xFF (NaN) blocks get 1.0, as they are
 * overwritten afterwards. */
AI __m512 e8m0_factors(__m512i code) {
    __m512i be = _mm512_sub_epi32(V32(254), code);
    __m512i f = _mm512_slli_epi32(be, 23);
    f = _mm512_mask_mov_epi32(f, _mm512_cmpeq_epi32_mask(be, _mm512_setzero_si512()),
                              V32(0x00400000));
    f = _mm512_mask_mov_epi32(f, _mm512_cmpeq_epi32_mask(code, V32(0xFF)), V32(0x3F800000));
    return _mm512_castsi512_ps(f);
}

/* Codes [p, p+n) of an output row: the NaN block's codes (E2M1: 0, pad nibble included). */
AI void fill_nan(uint8_t *orow, int64_t p, int64_t n, lowp_format ef) {
    if (ef == E2M1) memset(orow + p / 2, 0, code_bytes(ef, n));
    else memset(orow + p, (int) ef_nancode(ef), (size_t) n);
}

/* ---- packing and stores of the rowwise copy ---- */

/* 32 codes (the two halves of ld32) as 32 bytes in element order. */
AI __m256i pack2(__m512i lo, __m512i hi, lowp_format xf) {
    __m512i w = _mm512_packus_epi32(lo, hi); /* lane L: lo dwords 4L..4L+3, hi 4L..4L+3 */
    if (xf == F32) /* natural halves: the qwords come as lo0 hi0 lo1 hi1 ... */
        w = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), w);
    return _mm512_cvtepi16_epi8(w);
}

/* 64 codes (two ld32 pairs) as 64 bytes in element order. */
AI __m512i pack4(__m512i l0, __m512i h0, __m512i l1, __m512i h1, lowp_format xf) {
    __m512i b = _mm512_packus_epi16(_mm512_packus_epi32(l0, h0), _mm512_packus_epi32(l1, h1));
    if (xf == F32) /* lane L dwords: run0 group L, run0 group 4+L, run1 L, run1 4+L */
        return _mm512_permutexvar_epi32(
            _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), b);
    /* BF16: each packus_epi32 is already in order; lane L qwords: run0 L, run1 L */
    return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), b);
}

/* Stores 64 codes (n valid, element 0 at codes index p of the row). */
AI void st64(uint8_t *orow, int64_t p, __m512i b, lowp_format ef, int64_t n, int full) {
    if (ef == E2M1) { /* byte 2i | byte 2i+1 << 4, then words to bytes */
        __m256i h = _mm512_cvtepi16_epi8(_mm512_or_si512(b, _mm512_srli_epi16(b, 4)));
        if (full) _mm256_storeu_si256((__m256i *) (orow + p / 2), h);
        else _mm256_mask_storeu_epi8(orow + p / 2, mask32((n + 1) / 2), h);
    } else {
        if (full) _mm512_storeu_si512(orow + p, b);
        else _mm512_mask_storeu_epi8(orow + p, mask64(n), b);
    }
}

AI void st32(uint8_t *orow, int64_t p, __m256i b, lowp_format ef, int64_t n, int full) {
    if (ef == E2M1) {
        __m128i h = _mm256_cvtepi16_epi8(_mm256_or_si256(b, _mm256_srli_epi16(b, 4)));
        if (full) _mm_storeu_si128((__m128i *) (orow + p / 2), h);
        else _mm_mask_storeu_epi8(orow + p / 2, mask16((n + 1) / 2), h);
    } else {
        if (full) _mm256_storeu_si256((__m256i *) (orow + p), b);
        else _mm256_mask_storeu_epi8(orow + p, mask32(n), b);
    }
}

/* Codes of row elements [p, p+n) with one binary32 scale s (special values handled). */
AI void enc_run(const char *xr, uint8_t *orow, int64_t p, int64_t n, __m512 s, lowp_format xf,
                lowp_format ef) {
    const size_t es = xsize(xf);
    int64_t i = 0;
    __m512 a, b, c, d;
    for (; i + 64 <= n; i += 64) {
        ld32(xr + (size_t) (p + i) * es, xf, 32, 1, &a, &b);
        ld32(xr + (size_t) (p + i + 32) * es, xf, 32, 1, &c, &d);
        st64(orow, p + i,
             pack4(enc16(_mm512_mul_ps(a, s), ef, 1), enc16(_mm512_mul_ps(b, s), ef, 1),
                   enc16(_mm512_mul_ps(c, s), ef, 1), enc16(_mm512_mul_ps(d, s), ef, 1), xf),
             ef, 64, 1);
    }
    if (i < n) {
        const int64_t k = n - i;
        ld32(xr + (size_t) (p + i) * es, xf, k, 0, &a, &b);
        if (k > 32) ld32(xr + (size_t) (p + i + 32) * es, xf, k - 32, 0, &c, &d);
        else c = d = _mm512_setzero_ps();
        st64(orow, p + i,
             pack4(enc16(_mm512_mul_ps(a, s), ef, 1), enc16(_mm512_mul_ps(b, s), ef, 1),
                   enc16(_mm512_mul_ps(c, s), ef, 1), enc16(_mm512_mul_ps(d, s), ef, 1), xf),
             ef, k, 0);
    }
}

/* Codes of row elements [p, p+32*nblk) (clipped at C) in 32-element blocks, block k scaled by
 * the E8M0 factor f[k] (no special values: see the file comment). Pairs of blocks make one
 * 64-byte store. */
AI void enc_blocks32(const char *xr, uint8_t *orow, int64_t p, int nblk, int64_t C,
                     const float *f, lowp_format xf, lowp_format ef, int full) {
    const size_t es = xsize(xf);
    __m512 a, b, c, d;
    for (int k = 0; k < nblk; k += 2) {
        const int64_t q = p + 32 * k, n = full ? 64 : C - q;
        if (full || n >= 64) {
            ld32(xr + (size_t) q * es, xf, 32, 1, &a, &b);
            ld32(xr + (size_t) (q + 32) * es, xf, 32, 1, &c, &d);
        } else {
            ld32(xr + (size_t) q * es, xf, n, 0, &a, &b);
            if (n > 32) ld32(xr + (size_t) (q + 32) * es, xf, n - 32, 0, &c, &d);
            else c = d = _mm512_setzero_ps();
        }
        const __m512 f0 = _mm512_set1_ps(f[k]), f1 = _mm512_set1_ps(f[k + 1]);
        st64(orow, q,
             pack4(enc16(_mm512_mul_ps(a, f0), ef, 0), enc16(_mm512_mul_ps(b, f0), ef, 0),
                   enc16(_mm512_mul_ps(c, f1), ef, 0), enc16(_mm512_mul_ps(d, f1), ef, 0), xf),
             ef, n, full || n >= 64);
    }
}

/* ---- the columnwise copy: encode and transpose ---- */

/* The columnwise codes of input rows [r0, r0+nr) (nr <= 32) and the 16 columns of half h of the
 * 32-column segment at c0 (ncv of its columns exist), each lane scaled by its factor in f:
 * output row c (an input column) receives nr codes at codes index r0. */
AI void col_half(const lowp_quant_job *j, int64_t r0, int64_t nr, int64_t c0, int64_t ncv, int h,
                 __m512 f, lowp_format xf, lowp_format ef, int special, int full) {
    const size_t es = xsize(xf), stride = (size_t) j->cols * es;
    const char *base = (const char *) j->x + ((size_t) r0 * (size_t) j->cols + (size_t) c0) * es;
    const __m512i tr4 = _mm512_broadcast_i32x4(
        _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    __m512i t[8];
    for (int g = 0; g < 8; g++) {
        __m512i c[4];
        for (int u = 0; u < 4; u++) {
            const int i = 4 * g + u;
            __m512 v = full ? ld_half(base + (size_t) i * stride, xf, h, 32, 1)
                            : ld_half(base + (size_t) (i < nr ? i : 0) * stride, xf, h,
                                      i < nr ? ncv : 0, 0);
            c[u] = enc16(_mm512_mul_ps(v, f), ef, special);
        }
        /* lane L: a 4x4 byte tile (rows 4g.., lanes 4L..) row-major, shuffled to column-major:
         * dword k = the four rows' codes of lane k. */
        t[g] = _mm512_shuffle_epi8(_mm512_packus_epi16(_mm512_packus_epi32(c[0], c[1]),
                                                       _mm512_packus_epi32(c[2], c[3])),
                                   tr4);
    }
    /* 8 x 16 dword transpose: v[jj][q] lane L = rows 16q..16q+15 of lane 4L+jj. */
    __m512i ulo[4], uhi[4], v[4][2];
    for (int pp = 0; pp < 4; pp++) {
        ulo[pp] = _mm512_unpacklo_epi32(t[2 * pp], t[2 * pp + 1]);
        uhi[pp] = _mm512_unpackhi_epi32(t[2 * pp], t[2 * pp + 1]);
    }
    for (int q = 0; q < 2; q++) {
        v[0][q] = _mm512_unpacklo_epi64(ulo[2 * q], ulo[2 * q + 1]);
        v[1][q] = _mm512_unpackhi_epi64(ulo[2 * q], ulo[2 * q + 1]);
        v[2][q] = _mm512_unpacklo_epi64(uhi[2 * q], uhi[2 * q + 1]);
        v[3][q] = _mm512_unpackhi_epi64(uhi[2 * q], uhi[2 * q + 1]);
    }
    const __m512i ia = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    const __m512i ib = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    uint8_t *out = (uint8_t *) j->col->data;
    const size_t orow = code_bytes(ef, j->rows);
    const size_t off = ef == E2M1 ? (size_t) r0 / 2 : (size_t) r0;
    for (int jj = 0; jj < 4; jj++) {
        for (int w = 0; w < 2; w++) {
            /* 32 bytes for lane 4(2w)+jj, then 32 for lane 4(2w+1)+jj */
            __m512i z = _mm512_permutex2var_epi64(v[jj][0], w ? ib : ia, v[jj][1]);
            const int k0 = 8 * w + jj, k1 = k0 + 4;
            const int cc0 = lane_col(xf, h, k0), cc1 = lane_col(xf, h, k1);
            uint8_t *d0 = out + (size_t) (c0 + cc0) * orow + off;
            uint8_t *d1 = out + (size_t) (c0 + cc1) * orow + off;
            if (ef == E2M1) {
                __m256i n = _mm512_cvtepi16_epi8(_mm512_or_si512(z, _mm512_srli_epi16(z, 4)));
                __m128i n0 = _mm256_castsi256_si128(n), n1 = _mm256_extracti128_si256(n, 1);
                if (full) {
                    _mm_storeu_si128((__m128i *) d0, n0);
                    _mm_storeu_si128((__m128i *) d1, n1);
                } else {
                    const __mmask16 m = mask16((nr + 1) / 2);
                    if (cc0 < ncv) _mm_mask_storeu_epi8(d0, m, n0);
                    if (cc1 < ncv) _mm_mask_storeu_epi8(d1, m, n1);
                }
            } else {
                __m256i z0 = _mm512_castsi512_si256(z), z1 = _mm512_extracti64x4_epi64(z, 1);
                if (full) {
                    _mm256_storeu_si256((__m256i *) d0, z0);
                    _mm256_storeu_si256((__m256i *) d1, z1);
                } else {
                    const __mmask32 m = mask32(nr);
                    if (cc0 < ncv) _mm256_mask_storeu_epi8(d0, m, z0);
                    if (cc1 < ncv) _mm256_mask_storeu_epi8(d1, m, z1);
                }
            }
        }
    }
}

/* Both halves of a 32-column segment, skipping a half with no existing column. */
AI void col_seg(const lowp_quant_job *j, int64_t r0, int64_t nr, int64_t c0, int64_t ncv,
                __m512 flo, __m512 fhi, lowp_format xf, lowp_format ef, int special) {
    if (nr == 32 && ncv == 32) {
        col_half(j, r0, 32, c0, 32, 0, flo, xf, ef, special, 1);
        col_half(j, r0, 32, c0, 32, 1, fhi, xf, ef, special, 1);
    } else {
        col_half(j, r0, nr, c0, ncv, 0, flo, xf, ef, special, 0);
        if (ncv > (xf == F32 ? 16 : 4)) col_half(j, r0, nr, c0, ncv, 1, fhi, xf, ef, special, 0);
    }
}

/* The columnwise copy of rows [r0, r1) with binary32 scales per column given as natural-order
 * values (cs != NULL, ROW) or one scale s for all (TENSOR), in 32-row chunks. */
AI void col_fp32(const lowp_quant_job *j, int64_t r0, int64_t r1, const float *cs, float s,
                 lowp_format xf, lowp_format ef) {
    const int64_t C = j->cols;
    __m512i ilo = _mm512_setzero_si512(), ihi = ilo;
    if (xf != F32) { /* the BF16 lane order of the columns */
        ilo = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
        ihi = _mm512_add_epi32(ilo, V32(4));
    }
    for (int64_t c0 = 0; c0 < C; c0 += 32) {
        const int64_t ncv = C - c0 < 32 ? C - c0 : 32;
        __m512 flo = _mm512_set1_ps(s), fhi = flo;
        if (cs) {
            __m512 s0 = _mm512_maskz_loadu_ps(mask16(ncv), cs + c0);
            __m512 s1 = _mm512_maskz_loadu_ps(mask16(ncv - 16), cs + c0 + 16);
            if (xf == F32) {
                flo = s0;
                fhi = s1;
            } else {
                flo = _mm512_permutex2var_ps(s0, ilo, s1);
                fhi = _mm512_permutex2var_ps(s0, ihi, s1);
            }
        }
        for (int64_t r = r0; r < r1; r += 32)
            col_seg(j, r, r1 - r < 32 ? r1 - r : 32, c0, ncv, flo, fhi, xf, ef, 1);
    }
}

/* ---- the kinds ---- */

/* MX32 rowwise copy of rows [r0, r1): per row, groups of 16 blocks: maxima, scales (stored as
 * one 16-byte vector), factors, codes. */
AI void mx_group(const lowp_quant_job *j, const char *xr, uint8_t *orow, uint8_t *srow,
                 int64_t b0, lowp_format xf, lowp_format ef, int full) {
    const int64_t C = j->cols, nb = (C + 31) / 32;
    const int g = nb - b0 < 16 ? (int) (nb - b0) : 16;
    const size_t es = xsize(xf);
    __m512i m[16];
    for (int k = 0; k < 16; k++) {
        const int64_t q = 32 * (b0 + k), n = full ? 32 : C - q;
        m[k] = full || n >= 32 ? amax32(xr + (size_t) q * es, xf, 32, 1)
               : n > 0         ? amax32(xr + (size_t) q * es, xf, n, 0)
                               : _mm512_setzero_si512();
    }
    const __m512i code = e8m0_codes(tree16(m), j->et, j->mode);
    if (full) _mm_storeu_si128((__m128i *) (srow + b0), _mm512_cvtepi32_epi8(code));
    else _mm512_mask_cvtepi32_storeu_epi8(srow + b0, mask16(g), code);
    float f[16];
    _mm512_storeu_ps(f, e8m0_factors(code));
    enc_blocks32(xr, orow, 32 * b0, g, C, f, xf, ef, full);
    unsigned nan = _mm512_cmpeq_epi32_mask(code, V32(0xFF)) & mask16(g);
    while (nan) {
        const int k = __builtin_ctz(nan);
        nan &= nan - 1;
        const int64_t q = 32 * (b0 + k);
        fill_nan(orow, q, C - q < 32 ? C - q : 32, ef);
    }
}

AI void mx_rows(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf,
                           lowp_format ef) {
    const int64_t C = j->cols, nb = (C + 31) / 32;
    const size_t ob = code_bytes(ef, C);
    for (int64_t r = r0; r < r1; r++) {
        const char *xr = xrow(j, xf, r);
        uint8_t *orow = (uint8_t *) j->row->data + (size_t) r * ob;
        uint8_t *srow = (uint8_t *) j->row->scales + (size_t) r * (size_t) nb;
        for (int64_t b0 = 0; b0 < nb; b0 += 16) {
            if (32 * (b0 + 16) <= C) mx_group(j, xr, orow, srow, b0, xf, ef, 1);
            else mx_group(j, xr, orow, srow, b0, xf, ef, 0);
        }
    }
}

/* MX32 with a columnwise copy: a 32x32 tile (rows [r0, r0+nr), columns [c0, c0+ncv)) holds
 * 32 row blocks and 32 column blocks. One pass takes both kinds of maxima (row maxima by the
 * tree, column maxima by a running vertical max), then the row codes and the transposed
 * column codes are produced from the tile, which is still in L1. */
AI void mx_tile(const lowp_quant_job *j, int64_t r0, int64_t nr, int64_t c0, int64_t ncv,
                lowp_format xf, lowp_format ef, int full) {
    const int64_t C = j->cols, R = j->rows;
    const size_t es = xsize(xf), stride = (size_t) C * es;
    const char *base = (const char *) j->x + ((size_t) r0 * (size_t) C + (size_t) c0) * es;
    __m512i rm[32], clo = _mm512_setzero_si512(), chi = clo;
    for (int i = 0; i < 32; i++) {
        const char *p = base + (size_t) (i < nr ? i : 0) * stride;
        const int64_t n = full ? 32 : i < nr ? ncv : 0;
        /* 32 rows a page apart are 32 streams, more than the hardware prefetchers follow:
         * fetch this row's piece of the tile two tiles ahead. */
        _mm_prefetch(p + 2 * 32 * es, _MM_HINT_T0);
        if (xf == F32) _mm_prefetch(p + 2 * 32 * es + 64, _MM_HINT_T0);
        if (xf == F32) {
            __m512 lo, hi;
            ld32(p, xf, n, full, &lo, &hi);
            __m512i alo = _mm512_and_si512(_mm512_castps_si512(lo), V32(0x7FFFFFFF));
            __m512i ahi = _mm512_and_si512(_mm512_castps_si512(hi), V32(0x7FFFFFFF));
            rm[i] = _mm512_max_epu32(alo, ahi);
            clo = _mm512_max_epu32(clo, alo);
            chi = _mm512_max_epu32(chi, ahi);
        } else { /* clo collects 16-bit column maxima here, unpacked below */
            __m512i v = full ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(mask32(n), p);
            __m512i a = _mm512_and_si512(v, V32(0x7FFF7FFF));
            rm[i] = _mm512_max_epu32(_mm512_slli_epi32(a, 16), _mm512_and_si512(a, V32(0xFFFF0000)));
            clo = _mm512_max_epu16(clo, a);
        }
    }
    if (xf != F32) { /* the same lane order as ld32 */
        chi = _mm512_unpackhi_epi16(_mm512_setzero_si512(), clo);
        clo = _mm512_unpacklo_epi16(_mm512_setzero_si512(), clo);
    }
    if (j->row) {
        const int64_t nbc = (C + 31) / 32;
        uint8_t *sc = (uint8_t *) j->row->scales + (size_t) (c0 / 32);
        uint8_t *out = (uint8_t *) j->row->data;
        const size_t ob = code_bytes(ef, C);
        float f[32];
        uint8_t code[32];
        for (int h = 0; h < 2; h++) {
            __m512i cv = e8m0_codes(tree16(rm + 16 * h), j->et, j->mode);
            _mm512_storeu_ps(f + 16 * h, e8m0_factors(cv));
            _mm_storeu_si128((__m128i *) (code + 16 * h), _mm512_cvtepi32_epi8(cv));
        }
        for (int i = 0; i < nr; i++) sc[(size_t) (r0 + i) * (size_t) nbc] = code[i];
        for (int i = 0; i < (full ? 32 : nr); i++) {
            __m512 lo, hi;
            ld32(base + (size_t) i * stride, xf, full ? 32 : ncv, full, &lo, &hi);
            const __m512 fi = _mm512_set1_ps(f[i]);
            st32(out + (size_t) (r0 + i) * ob, c0,
                 pack2(enc16(_mm512_mul_ps(lo, fi), ef, 0), enc16(_mm512_mul_ps(hi, fi), ef, 0),
                       xf),
                 ef, ncv, full);
        }
        for (int i = 0; i < nr; i++)
            if (code[i] == 0xFF) fill_nan(out + (size_t) (r0 + i) * ob, c0, ncv, ef);
    }
    if (j->col) {
        const int64_t nbr = (R + 31) / 32;
        uint8_t *sc = (uint8_t *) j->col->scales + (size_t) (r0 / 32);
        __m512i cl = e8m0_codes(clo, j->et, j->mode), ch = e8m0_codes(chi, j->et, j->mode);
        uint8_t code[32];
        _mm_storeu_si128((__m128i *) code, _mm512_cvtepi32_epi8(cl));
        _mm_storeu_si128((__m128i *) (code + 16), _mm512_cvtepi32_epi8(ch));
        for (int k = 0; k < 32; k++) {
            const int cc = lane_col(xf, k >> 4, k & 15);
            if (cc < ncv) sc[(size_t) (c0 + cc) * (size_t) nbr] = code[k];
        }
        col_seg(j, r0, nr, c0, ncv, e8m0_factors(cl), e8m0_factors(ch), xf, ef, 0);
        uint8_t *out = (uint8_t *) j->col->data;
        const size_t ob = code_bytes(ef, R);
        for (int k = 0; k < 32; k++) {
            const int cc = lane_col(xf, k >> 4, k & 15);
            if (code[k] == 0xFF && cc < ncv) fill_nan(out + (size_t) (c0 + cc) * ob, r0, nr, ef);
        }
    }
}

AI void mx_bands(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf,
                            lowp_format ef) {
    for (int64_t r = r0; r < r1; r += 32) {
        const int64_t nr = r1 - r < 32 ? r1 - r : 32;
        for (int64_t c0 = 0; c0 < j->cols; c0 += 32) {
            const int64_t ncv = j->cols - c0 < 32 ? j->cols - c0 : 32;
            if (nr == 32 && ncv == 32) mx_tile(j, r, 32, c0, 32, xf, ef, 1);
            else mx_tile(j, r, nr, c0, ncv, xf, ef, 0);
        }
    }
}

/* BLOCK128 rowwise copy: per row, per 128 columns: maximum, the scalar binary32 rule, codes. */
AI void b128_rows(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf,
                             lowp_format ef) {
    const int64_t C = j->cols, nb = (C + 127) / 128;
    const size_t es = xsize(xf), ob = code_bytes(ef, C);
    for (int64_t r = r0; r < r1; r++) {
        const char *xr = xrow(j, xf, r);
        uint8_t *orow = (uint8_t *) j->row->data + (size_t) r * ob;
        float *sc = (float *) j->row->scales + (size_t) r * (size_t) nb;
        for (int64_t b = 0; b < nb; b++) {
            const int64_t p = 128 * b, n = C - p < 128 ? C - p : 128;
            __m512i m = _mm512_setzero_si512();
            if (n == 128) {
                for (int k = 0; k < 4; k++)
                    m = _mm512_max_epu32(m, amax32(xr + (size_t) (p + 32 * k) * es, xf, 32, 1));
            } else {
                for (int k = 0; 32 * k < n; k++)
                    m = _mm512_max_epu32(m, amax32(xr + (size_t) (p + 32 * k) * es, xf, n - 32 * k, 0));
            }
            const float s = lowp_rule_fp32_scale(hmax(m), j->et->fmax, j->eps, j->pow2);
            sc[b] = 1.0f / s;
            enc_run(xr, orow, p, n, _mm512_set1_ps(s), xf, ef);
        }
    }
}

/* BLOCK128 columnwise copy of the band [r0, r0+nr) (nr <= 128): per 32-column segment, the
 * vertical maxima of the band, the scalar rule per column, then 32-row chunks of codes. */
AI void b128_cols(const lowp_quant_job *j, int64_t r0, int64_t nr, lowp_format xf,
                             lowp_format ef) {
    const int64_t C = j->cols, nbr = (j->rows + 127) / 128;
    const size_t es = xsize(xf), stride = (size_t) C * es;
    float *sc = (float *) j->col->scales + (size_t) (r0 / 128);
    for (int64_t c0 = 0; c0 < C; c0 += 32) {
        const int64_t ncv = C - c0 < 32 ? C - c0 : 32;
        const char *base = (const char *) j->x + ((size_t) r0 * (size_t) C + (size_t) c0) * es;
        __m512i lo = _mm512_setzero_si512(), hi = lo;
        for (int64_t i = 0; i < nr; i++) {
            const char *p = base + (size_t) i * stride;
            if (xf == F32) {
                __m512 a, b;
                ld32(p, xf, ncv, ncv == 32, &a, &b);
                lo = _mm512_max_epu32(lo, _mm512_and_si512(_mm512_castps_si512(a), V32(0x7FFFFFFF)));
                hi = _mm512_max_epu32(hi, _mm512_and_si512(_mm512_castps_si512(b), V32(0x7FFFFFFF)));
            } else {
                __m512i v = ncv == 32 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(mask32(ncv), p);
                lo = _mm512_max_epu16(lo, _mm512_and_si512(v, V32(0x7FFF7FFF)));
            }
        }
        if (xf != F32) {
            hi = _mm512_unpackhi_epi16(_mm512_setzero_si512(), lo);
            lo = _mm512_unpacklo_epi16(_mm512_setzero_si512(), lo);
        }
        uint32_t am[32];
        float s[32];
        _mm512_storeu_si512(am, lo);
        _mm512_storeu_si512(am + 16, hi);
        for (int k = 0; k < 32; k++) {
            const int cc = lane_col(xf, k >> 4, k & 15);
            s[k] = lowp_rule_fp32_scale(lowp_u2f(am[k]), j->et->fmax, j->eps, j->pow2);
            if (cc < ncv) sc[(size_t) (c0 + cc) * (size_t) nbr] = 1.0f / s[k];
        }
        const __m512 flo = _mm512_loadu_ps(s), fhi = _mm512_loadu_ps(s + 16);
        for (int64_t i = 0; i < nr; i += 32)
            col_seg(j, r0 + i, nr - i < 32 ? nr - i : 32, c0, ncv, flo, fhi, xf, ef, 1);
    }
}

/* BLOCK32X32 and BLOCK128X128 over the band [r0, r0+nr) (nr <= bs), in chunks of 512 columns:
 * the tile maxima in one row-major pass (sequential reads), then the row codes row by row and
 * the column codes in 32x32 transposes. */
AI void tiles(const lowp_quant_job *j, int64_t r0, int64_t nr, lowp_format xf,
                         lowp_format ef) {
    const int e8 = j->scaling == LOWP_SCALING_BLOCK32X32;
    const int64_t bs = e8 ? 32 : 128, C = j->cols, R = j->rows;
    const int64_t nbc = (C + bs - 1) / bs, nbr = (R + bs - 1) / bs, tr = r0 / bs;
    const size_t es = xsize(xf);
    for (int64_t c0 = 0; c0 < C; c0 += 512) {
        const int64_t w = C - c0 < 512 ? C - c0 : 512;
        const int nt = (int) ((w + bs - 1) / bs), tc0 = (int) (c0 / bs);
        const int full = w == 512;
        __m512i m[16];
        for (int k = 0; k < 16; k++) m[k] = _mm512_setzero_si512();
        for (int64_t i = 0; i < nr; i++) {
            const char *xr = xrow(j, xf, r0 + i) + (size_t) c0 * es;
            for (int k = 0; k < 16; k++) { /* 32-column pieces; piece k is in tile k*32/bs */
                const int t = e8 ? k : k / 4;
                if (full) m[t] = _mm512_max_epu32(m[t], amax32(xr + (size_t) (32 * k) * es, xf, 32, 1));
                else if (32 * k < w)
                    m[t] = _mm512_max_epu32(m[t], amax32(xr + (size_t) (32 * k) * es, xf, w - 32 * k, 0));
            }
        }
        float f[16]; /* factor (E8M0) or scale (binary32) of each tile */
        uint8_t code[16];
        if (e8) {
            const __m512i cv = e8m0_codes(tree16(m), j->et, j->mode);
            _mm512_storeu_ps(f, e8m0_factors(cv));
            _mm_storeu_si128((__m128i *) code, _mm512_cvtepi32_epi8(cv));
            for (int t = 0; t < nt; t++) {
                if (j->row) ((uint8_t *) j->row->scales)[(size_t) (tr * nbc + tc0 + t)] = code[t];
                if (j->col) ((uint8_t *) j->col->scales)[(size_t) ((tc0 + t) * nbr + tr)] = code[t];
            }
        } else {
            for (int t = 0; t < nt; t++) {
                f[t] = lowp_rule_fp32_scale(hmax(m[t]), j->et->fmax, j->eps, j->pow2);
                if (j->row) ((float *) j->row->scales)[(size_t) (tr * nbc + tc0 + t)] = 1.0f / f[t];
                if (j->col) ((float *) j->col->scales)[(size_t) ((tc0 + t) * nbr + tr)] = 1.0f / f[t];
            }
        }
        if (j->row) {
            const size_t ob = code_bytes(ef, C);
            for (int64_t i = 0; i < nr; i++) {
                const char *xr = xrow(j, xf, r0 + i);
                uint8_t *orow = (uint8_t *) j->row->data + (size_t) (r0 + i) * ob;
                if (e8) {
                    if (full) enc_blocks32(xr, orow, c0, 16, C, f, xf, ef, 1);
                    else enc_blocks32(xr, orow, c0, nt, C, f, xf, ef, 0);
                    for (int t = 0; t < nt; t++)
                        if (code[t] == 0xFF) {
                            const int64_t p = c0 + 32 * t;
                            fill_nan(orow, p, C - p < 32 ? C - p : 32, ef);
                        }
                } else {
                    for (int t = 0; t < nt; t++) {
                        const int64_t p = c0 + 128 * t;
                        enc_run(xr, orow, p, C - p < 128 ? C - p : 128, _mm512_set1_ps(f[t]), xf, ef);
                    }
                }
            }
        }
        if (j->col) {
            const size_t ob = code_bytes(ef, R);
            for (int64_t s = 0; s < w; s += 32) {
                const int t = (int) (s / bs);
                const int64_t ncv = w - s < 32 ? w - s : 32;
                const __m512 ft = _mm512_set1_ps(f[t]);
                for (int64_t i = 0; i < nr; i += 32) {
                    const int64_t n = nr - i < 32 ? nr - i : 32;
                    col_seg(j, r0 + i, n, c0 + s, ncv, ft, ft, xf, ef, !e8);
                    if (e8 && code[t] == 0xFF)
                        for (int64_t c = 0; c < ncv; c++)
                            fill_nan((uint8_t *) j->col->data + (size_t) (c0 + s + c) * ob, r0 + i,
                                     n, ef);
                }
            }
        }
    }
}

/* ROW rowwise copy: per row, the maximum, the scalar rule (stored as scale_inv), codes; the
 * row is reread from L1. */
AI void row_rows(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf,
                            lowp_format ef) {
    const int64_t C = j->cols;
    const size_t es = xsize(xf), ob = code_bytes(ef, C);
    for (int64_t r = r0; r < r1; r++) {
        const char *xr = xrow(j, xf, r);
        __m512i m0 = _mm512_setzero_si512(), m1 = m0;
        int64_t c = 0;
        for (; c + 64 <= C; c += 64) {
            m0 = _mm512_max_epu32(m0, amax32(xr + (size_t) c * es, xf, 32, 1));
            m1 = _mm512_max_epu32(m1, amax32(xr + (size_t) (c + 32) * es, xf, 32, 1));
        }
        for (; c < C; c += 32) m0 = _mm512_max_epu32(m0, amax32(xr + (size_t) c * es, xf, C - c, 0));
        const float s = lowp_rule_fp32_scale(hmax(_mm512_max_epu32(m0, m1)), j->et->fmax, j->eps,
                                             j->pow2);
        ((float *) j->row->scales)[r] = 1.0f / s;
        enc_run(xr, (uint8_t *) j->row->data + (size_t) r * ob, 0, C, _mm512_set1_ps(s), xf, ef);
    }
}

/* ---- entry points ---- */

AI void run(const lowp_quant_job *j, int64_t r0, int64_t r1, lowp_format xf,
                       lowp_format ef) {
    switch (j->scaling) {
    case LOWP_SCALING_TENSOR:
        if (j->row) {
            const size_t ob = code_bytes(ef, j->cols);
            for (int64_t r = r0; r < r1; r++)
                enc_run(xrow(j, xf, r), (uint8_t *) j->row->data + (size_t) r * ob, 0, j->cols,
                        _mm512_set1_ps(j->tensor_scale), xf, ef);
        }
        if (j->col) col_fp32(j, r0, r1, NULL, j->tensor_scale, xf, ef);
        break;
    case LOWP_SCALING_ROW:
        if (j->row) row_rows(j, r0, r1, xf, ef);
        if (j->col) col_fp32(j, r0, r1, j->col_scale, 0.0f, xf, ef);
        break;
    case LOWP_SCALING_MX32:
        if (j->col) mx_bands(j, r0, r1, xf, ef); /* also writes the row copy, if any */
        else mx_rows(j, r0, r1, xf, ef);
        break;
    case LOWP_SCALING_BLOCK128:
        if (j->row) b128_rows(j, r0, r1, xf, ef);
        if (j->col)
            for (int64_t r = r0; r < r1; r += 128) b128_cols(j, r, r1 - r < 128 ? r1 - r : 128, xf, ef);
        break;
    case LOWP_SCALING_BLOCK32X32:
    case LOWP_SCALING_BLOCK128X128: {
        const int64_t bs = j->scaling == LOWP_SCALING_BLOCK32X32 ? 32 : 128;
        for (int64_t r = r0; r < r1; r += bs) tiles(j, r, r1 - r < bs ? r1 - r : bs, xf, ef);
        break;
    }
    default: break;
    }
}

int lowp_cpu_quant_avx512_supports(const lowp_quant_job *j) {
    if (j->xfmt != LOWP_FORMAT_F32 && j->xfmt != LOWP_FORMAT_BF16) return 0;
    if (j->efmt == E2M1) return j->scaling == LOWP_SCALING_MX32;
    if (j->efmt != LOWP_FORMAT_E4M3 && j->efmt != LOWP_FORMAT_E5M2) return 0;
    switch (j->scaling) {
    case LOWP_SCALING_TENSOR:
    case LOWP_SCALING_ROW:
    case LOWP_SCALING_MX32:
    case LOWP_SCALING_BLOCK128:
    case LOWP_SCALING_BLOCK128X128:
    case LOWP_SCALING_BLOCK32X32: return 1;
    default: return 0;
    }
}

/* One specialized instance per (input, element) format pair: the format arguments are
 * compile-time constants inside, so their switches fold away and shifts are immediates. */
#define INSTANCE(NAME, XF, EF)                                                                    \
    static __attribute__((noinline)) void NAME(const lowp_quant_job *j, int64_t r0, int64_t r1) { \
        run(j, r0, r1, XF, EF);                                                                   \
    }
INSTANCE(run_f32_e4m3, LOWP_FORMAT_F32, LOWP_FORMAT_E4M3)
INSTANCE(run_f32_e5m2, LOWP_FORMAT_F32, LOWP_FORMAT_E5M2)
INSTANCE(run_f32_e2m1, LOWP_FORMAT_F32, LOWP_FORMAT_E2M1)
INSTANCE(run_bf16_e4m3, LOWP_FORMAT_BF16, LOWP_FORMAT_E4M3)
INSTANCE(run_bf16_e5m2, LOWP_FORMAT_BF16, LOWP_FORMAT_E5M2)
INSTANCE(run_bf16_e2m1, LOWP_FORMAT_BF16, LOWP_FORMAT_E2M1)

void lowp_cpu_quant_avx512(const lowp_quant_job *j, int64_t r0, int64_t r1) {
    const int bf = j->xfmt == LOWP_FORMAT_BF16;
    switch (j->efmt) {
    case LOWP_FORMAT_E4M3: bf ? run_bf16_e4m3(j, r0, r1) : run_f32_e4m3(j, r0, r1); return;
    case LOWP_FORMAT_E5M2: bf ? run_bf16_e5m2(j, r0, r1) : run_f32_e5m2(j, r0, r1); return;
    case LOWP_FORMAT_E2M1: bf ? run_bf16_e2m1(j, r0, r1) : run_f32_e2m1(j, r0, r1); return;
    default: lowp_cpu_quant_ref(j, r0, r1); return;
    }
}
