/* The AVX2 quantization kernel, for x86-64 CPUs without AVX-512: E4M3 and E5M2 outputs of
 * binary32 or BF16 input, every scaling but the grouped ones' E2M1 (E2M1 stays on the
 * reference), bit for bit the reference's (docs/numerics.md sections 3-4).
 *
 * Eight lanes at a time: each block's amax is a maximum of |x| bit patterns (NaN patterns sort
 * above Inf above every number, and any NaN amax gives the same scale), its scale comes from
 * the rules of core/scale_rules.h as the reference's, and each element is x times the block's
 * factor in binary32, then rounded to the element format by the reference encoder's integer
 * algorithm (src/core/format.c, small_encode: RNE, SATFINITE) on eight lanes. The columnwise
 * copy is written eight input rows by eight columns at a time: the 8x8 block of codes is
 * transposed in registers and each column's eight codes stored as one run of its output row.
 * Output pitches of the columnwise copy are the job's (col_ob, col_nbr), so the grouped path
 * runs it on a group's span of a larger output. */
#include <immintrin.h>
#include <string.h>

#include "core/scale_rules.h"
#include "cpu.h"
#include "quant_kernels.h"

#define AI static inline __attribute__((always_inline))

int lowp_cpu_quant_avx2_supports(const lowp_quant_job *j) {
    const uint32_t need = LOWP_CAP_AVX2 | LOWP_CAP_FMA;
    const int nv = j->efmt == LOWP_FORMAT_E2M1 &&
                   (j->xfmt == LOWP_FORMAT_F32 || j->xfmt == LOWP_FORMAT_BF16) &&
                   (j->scaling == LOWP_SCALING_NV16 || j->scaling == LOWP_SCALING_NV16X16);
    return (lowp_cpu_caps()->flags & need) == need && (lowp_quant_job_fp8(j) || nv);
}

/* ---- loads ---- */

/* Elements (r, c .. c + n) of the input as binary32, zeros past n (n <= 8). The input format
 * is the job's; the kernel's instances (run_*) fix it, so the test folds away. */
#define ld8(j, r, c, n) ld8_(j, r, c, n, BF)
AI __m256 ld8_(const lowp_quant_job *j, int64_t r, int64_t c, int n, const int BF) {
    const size_t i = (size_t) r * (size_t) j->cols + (size_t) c;
    if (BF) {
        const uint16_t *p = (const uint16_t *) j->x + i;
        __m128i h;
        if (n == 8) {
            h = _mm_loadu_si128((const __m128i *) p);
        } else {
            uint16_t t[8] = {0};
            memcpy(t, p, (size_t) n * 2);
            h = _mm_loadu_si128((const __m128i *) t);
        }
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    const float *p = (const float *) j->x + i;
    if (n == 8) return _mm256_loadu_ps(p);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane));
}

AI __m256i abs_bits(__m256 v) {
    return _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7FFFFFFF));
}

AI uint32_t hmax(__m256i m) {
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xB1));
    return (uint32_t) _mm_cvtsi128_si32(h);
}

/* Lane-wise maxima of |x| bits over rows [r0, r1) of the 8 (n) columns from c. */
AI __m256i col_amax8(const lowp_quant_job *j, int64_t r0, int64_t r1, int64_t c, int n,
                     const int BF) {
    __m256i m = _mm256_setzero_si256();
    for (int64_t r = r0; r < r1; r++) m = _mm256_max_epu32(m, abs_bits(ld8(j, r, c, n)));
    return m;
}

/* Maximum of |x| bits over [r0, r1) x [c0, c1). */
AI uint32_t rect_amax(const lowp_quant_job *j, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                      const int BF) {
    __m256i m = _mm256_setzero_si256();
    for (int64_t r = r0; r < r1; r++) {
        int64_t c = c0;
        for (; c + 8 <= c1; c += 8) m = _mm256_max_epu32(m, abs_bits(ld8(j, r, c, 8)));
        if (c < c1) m = _mm256_max_epu32(m, abs_bits(ld8(j, r, c, (int) (c1 - c))));
    }
    return hmax(m);
}

/* As a float for the scale rules (any NaN pattern: they give the same scale). */
static float amax_of(uint32_t bits) {
    return lowp_u2f(bits);
}

/* ---- the element encoder ---- */

/* Codes (one per 32-bit lane) of v in E4M3 (E5 = 0) or E5M2 (E5 = 1), RNE, SATFINITE: the
 * reference's small_encode, lane by lane. A zero or binary32-denormal input needs no case of
 * its own: its shift is past the significand, so it rounds to a zero code. */
AI __m256i enc8_int(__m256 v, const int E5) {
    const int mbits = E5 ? 2 : 3, bias = E5 ? 15 : 7;
    const __m256i max_code = _mm256_set1_epi32(E5 ? 0x7B : 0x7E);
    const __m256i nan_code = _mm256_set1_epi32(E5 ? 0x7E : 0x7F);
    const __m256i one = _mm256_set1_epi32(1);
    const __m256i u = _mm256_castps_si256(v);
    const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    const __m256i sbit = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
    const __m256i m24 = _mm256_or_si256(_mm256_and_si256(a, _mm256_set1_epi32(0x7FFFFF)),
                                        _mm256_set1_epi32(0x800000));
    const __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(a, 23), _mm256_set1_epi32(127 - bias));
    /* shift = 23 - mbits + max(0, 1 - e) */
    const __m256i sub = _mm256_max_epi32(_mm256_sub_epi32(one, e), _mm256_setzero_si256());
    const __m256i shift = _mm256_add_epi32(_mm256_set1_epi32(23 - mbits), sub);
    const __m256i half_m1 =
        _mm256_sub_epi32(_mm256_sllv_epi32(one, _mm256_sub_epi32(shift, one)), one);
    const __m256i odd = _mm256_and_si256(_mm256_srlv_epi32(m24, shift), one);
    const __m256i q =
        _mm256_srlv_epi32(_mm256_add_epi32(_mm256_add_epi32(m24, half_m1), odd), shift);
    /* code = (max(e, 1) - 1) << mbits + q, then at most max_code (Inf and overflow too) */
    const __m256i base = _mm256_slli_epi32(_mm256_sub_epi32(_mm256_max_epi32(e, one), one), mbits);
    const __m256i code = _mm256_min_epu32(_mm256_add_epi32(base, q), max_code);
    const __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
    return _mm256_or_si256(sbit, _mm256_blendv_epi8(code, nan_code, nan));
}

/* The same codes with fewer operations, where the MXCSR rounds to nearest (checked once a
 * call, lowp_cpu_quant_avx2): a target normal (|v| >= 2^(1 - bias)) is |v|'s pattern rounded to
 * nearest even at the target's mantissa width, the carry running into the exponent, then
 * rebiased; a target subnormal is |v| + 2^(23 - bias + 1 - mbits) rounded by the binary32 add
 * (its unit in the last place is the target's quantum, so the add rounds |v| to nearest even
 * there) minus that constant's pattern. A binary32 denormal |v| (read as 0 under DAZ) gives 0
 * either way, as the reference's. Overflow, Inf and NaN as enc8_int. */
AI __m256i enc8_rne(__m256 v, const int E5) {
    const int mbits = E5 ? 2 : 3, bias = E5 ? 15 : 7;
    const __m256i u = _mm256_castps_si256(v);
    const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    const __m256i sbit = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
    const int sh = 23 - mbits;
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, sh), _mm256_set1_epi32(1));
    const __m256i rn = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32((1 << (sh - 1)) - 1)), odd), sh);
    const __m256i norm = _mm256_sub_epi32(rn, _mm256_set1_epi32((127 - bias) << mbits));
    const float magic = E5 ? 0x1p7f : 0x1p14f; /* 2^(23 + 1 - bias - mbits) */
    const __m256 mg = _mm256_set1_ps(magic);
    const __m256i subn = _mm256_sub_epi32(
        _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), mg)), _mm256_castps_si256(mg));
    const __m256i is_norm = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(((128 - bias) << 23) - 1));
    const __m256i code = _mm256_min_epu32(_mm256_blendv_epi8(subn, norm, is_norm),
                                          _mm256_set1_epi32(E5 ? 0x7B : 0x7E));
    const __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
    return _mm256_or_si256(sbit,
                           _mm256_blendv_epi8(code, _mm256_set1_epi32(E5 ? 0x7E : 0x7F), nan));
}

/* FMT: bit 0 E5M2 (else E4M3), bit 1 the MXCSR rounds to nearest (enc8_rne). */
AI __m256i enc8(__m256 v, const int FMT) {
    return FMT & 2 ? enc8_rne(v, FMT & 1) : enc8_int(v, FMT & 1);
}

/* Eight 32-bit codes to eight bytes. */
AI uint64_t pack8(__m256i c) {
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
    return (uint64_t) _mm_cvtsi128_si64(_mm_packus_epi16(w, w));
}

AI void put_bytes(uint8_t *dst, uint64_t v, int n) {
    if (n == 8)
        memcpy(dst, &v, 8);
    else
        memcpy(dst, &v, (size_t) n);
}

/* ---- writing a rectangle of codes ---- */

/* The factors and NaN lanes of eight columns: x * f[l] in lane l, and lanes whose block
 * scale code is 0xFF give the format's NaN code (unsigned), as the reference's enc_e8m0. */
typedef struct lanes {
    __m256 f;
    __m256i nan;
} lanes;

AI __m256i enc_lanes(__m256 x, const lanes *ln, const int E5) {
    const __m256i c = enc8(_mm256_mul_ps(x, ln->f), E5);
    return _mm256_blendv_epi8(c, _mm256_set1_epi32(E5 & 1 ? 0x7E : 0x7F), ln->nan);
}

/* Row r, columns [c0, c1), into the rowwise copy; one factor set for all of them. */
AI void emit_row(const lowp_quant_job *j, int64_t r, int64_t c0, int64_t c1, const lanes *ln,
                 const int E5, const int BF) {
    uint8_t *o = (uint8_t *) j->row->data + (size_t) r * (size_t) j->cols;
    int64_t c = c0;
    for (; c + 8 <= c1; c += 8) {
        const uint64_t v = pack8(enc_lanes(ld8(j, r, c, 8), ln, E5));
        memcpy(o + c, &v, 8);
    }
    if (c < c1) {
        const int n = (int) (c1 - c);
        put_bytes(o + c, pack8(enc_lanes(ld8(j, r, c, n), ln, E5)), n);
    }
}

/* Rows [r0, r1) x the n (<= 8) columns from c into the columnwise copy, lane l's factors for
 * column c + l. */
AI void emit_cols(const lowp_quant_job *j, int64_t r0, int64_t r1, int64_t c, int n,
                  const lanes *ln, const int E5, const int BF) {
    uint8_t *o = (uint8_t *) j->col->data;
    const size_t ob = j->col_ob;
    for (int64_t r = r0; r < r1; r += 8) {
        const int h = r1 - r < 8 ? (int) (r1 - r) : 8;
        __m256i t[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            t[i] = i < h ? enc_lanes(ld8(j, r + i, c, n), ln, E5) : _mm256_setzero_si256();
        /* to bytes: each 128-bit half of b0 (rows 0-3) and b1 (rows 4-7) holds four rows of four
         * columns (columns 0-3 in the low half, 4-7 in the high), row-major */
        __m256i b0 =
            _mm256_packus_epi16(_mm256_packus_epi32(t[0], t[1]), _mm256_packus_epi32(t[2], t[3]));
        __m256i b1 =
            _mm256_packus_epi16(_mm256_packus_epi32(t[4], t[5]), _mm256_packus_epi32(t[6], t[7]));
        /* each 4x4 byte block transposed: dword k of a half is column k's four rows */
        const __m256i tr = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0,
                                            4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        b0 = _mm256_shuffle_epi8(b0, tr);
        b1 = _mm256_shuffle_epi8(b1, tr);
        /* a column's eight rows as one qword: columns 0, 1, 4, 5, then 2, 3, 6, 7 */
        uint64_t q[8];
        _mm256_storeu_si256((__m256i *) q, _mm256_unpacklo_epi32(b0, b1));
        _mm256_storeu_si256((__m256i *) (q + 4), _mm256_unpackhi_epi32(b0, b1));
        static const int at[8] = {0, 1, 4, 5, 2, 3, 6, 7};
        uint8_t *d = o + (size_t) c * ob + (size_t) r;
        if (n == 8 && h == 8) {
#pragma GCC unroll 8
            for (int l = 0; l < 8; l++) memcpy(d + (size_t) l * ob, &q[at[l]], 8);
        } else {
            for (int l = 0; l < n; l++) put_bytes(d + (size_t) l * ob, q[at[l]], h);
        }
    }
}

static lanes uniform(float f, int nan) {
    lanes ln = {_mm256_set1_ps(f), _mm256_set1_epi32(nan ? -1 : 0)};
    return ln;
}

/* ---- the scalings ---- */

/* MX32 or BLOCK128 along rows: block b of row r. */
AI void row_blocks(const lowp_quant_job *j, int64_t r0, int64_t r1, int64_t bs, const int E5,
                   const int BF) {
    const int64_t C = j->cols, nb = (C + bs - 1) / bs;
    const int e8 = j->scaling == LOWP_SCALING_MX32;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t b = 0; b < nb; b++) {
            const int64_t c0 = b * bs, c1 = c0 + bs < C ? c0 + bs : C;
            const float amax = amax_of(rect_amax(j, r, r + 1, c0, c1, BF));
            lanes ln;
            if (e8) {
                const uint8_t code = lowp_rule_e8m0_code(amax, j->et, j->mode);
                ((uint8_t *) j->row->scales)[r * nb + b] = code;
                ln = uniform(lowp_rule_e8m0_quant_factor(code), code == 0xFF);
            } else {
                const float s = lowp_rule_fp32_scale(amax, j->et->fmax, j->eps, j->pow2);
                ((float *) j->row->scales)[r * nb + b] = 1.0f / s;
                ln = uniform(s, 0);
            }
            emit_row(j, r, c0, c1, &ln, E5, BF);
        }
}

/* MX32 or BLOCK128 along columns: the blocks of input rows [rb * bs, ...) within [r0, r1). */
AI void col_blocks(const lowp_quant_job *j, int64_t r0, int64_t r1, int64_t bs, const int E5,
                   const int BF) {
    const int64_t R = j->rows, C = j->cols;
    const int e8 = j->scaling == LOWP_SCALING_MX32;
    for (int64_t rb = r0 / bs; rb * bs < r1; rb++) {
        const int64_t ra = rb * bs, re = ra + bs < R ? ra + bs : R;
        for (int64_t c = 0; c < C; c += 8) {
            const int n = C - c < 8 ? (int) (C - c) : 8;
            uint32_t m[8];
            _mm256_storeu_si256((__m256i *) m, col_amax8(j, ra, re, c, n, BF));
            float f[8] = {0};
            int32_t nan[8] = {0};
            for (int l = 0; l < n; l++) {
                const size_t si = (size_t) (c + l) * (size_t) j->col_nbr + (size_t) rb;
                if (e8) {
                    const uint8_t code = lowp_rule_e8m0_code(amax_of(m[l]), j->et, j->mode);
                    ((uint8_t *) j->col->scales)[si] = code;
                    f[l] = lowp_rule_e8m0_quant_factor(code);
                    nan[l] = code == 0xFF ? -1 : 0;
                } else {
                    f[l] = lowp_rule_fp32_scale(amax_of(m[l]), j->et->fmax, j->eps, j->pow2);
                    ((float *) j->col->scales)[si] = 1.0f / f[l];
                }
            }
            const lanes ln = {_mm256_loadu_ps(f), _mm256_loadu_si256((const __m256i *) nan)};
            emit_cols(j, ra, re, c, n, &ln, E5, BF);
        }
    }
}

/* BLOCK128X128 or BLOCK32X32: one scale per tile, both copies. */
AI void tiles(const lowp_quant_job *j, int64_t r0, int64_t r1, int64_t bs, const int E5,
              const int BF) {
    const int64_t R = j->rows, C = j->cols, nbr = (R + bs - 1) / bs, nbc = (C + bs - 1) / bs;
    const int e8 = j->scaling == LOWP_SCALING_BLOCK32X32;
    for (int64_t tr = r0 / bs; tr * bs < r1; tr++) {
        const int64_t ra = tr * bs, re = ra + bs < R ? ra + bs : R;
        for (int64_t tc = 0; tc < nbc; tc++) {
            const int64_t ca = tc * bs, ce = ca + bs < C ? ca + bs : C;
            const float amax = amax_of(rect_amax(j, ra, re, ca, ce, BF));
            lanes ln;
            if (e8) {
                const uint8_t code = lowp_rule_e8m0_code(amax, j->et, j->mode);
                if (j->row) ((uint8_t *) j->row->scales)[tr * nbc + tc] = code;
                if (j->col) ((uint8_t *) j->col->scales)[tc * nbr + tr] = code;
                ln = uniform(lowp_rule_e8m0_quant_factor(code), code == 0xFF);
            } else {
                const float s = lowp_rule_fp32_scale(amax, j->et->fmax, j->eps, j->pow2);
                if (j->row) ((float *) j->row->scales)[tr * nbc + tc] = 1.0f / s;
                if (j->col) ((float *) j->col->scales)[tc * nbr + tr] = 1.0f / s;
                ln = uniform(s, 0);
            }
            if (j->row)
                for (int64_t r = ra; r < re; r++) emit_row(j, r, ca, ce, &ln, E5, BF);
            if (j->col)
                for (int64_t c = ca; c < ce; c += 8)
                    emit_cols(j, ra, re, c, ce - c < 8 ? (int) (ce - c) : 8, &ln, E5, BF);
        }
    }
}

#define WHOLE_ROWS 64

/* TENSOR (the job's scale) and ROW (a scale per row; the columnwise copy's per column). */
AI void whole(const lowp_quant_job *j, int64_t r0, int64_t r1, const int E5, const int BF) {
    const int64_t C = j->cols;
    const int rowwise = j->scaling == LOWP_SCALING_ROW;
    if (j->row)
        for (int64_t r = r0; r < r1; r++) {
            float s = j->tensor_scale;
            if (rowwise) {
                s = lowp_rule_fp32_scale(amax_of(rect_amax(j, r, r + 1, 0, C, BF)), j->et->fmax,
                                         j->eps, j->pow2);
                ((float *) j->row->scales)[r] = 1.0f / s;
            }
            const lanes ln = uniform(s, 0);
            emit_row(j, r, 0, C, &ln, E5, BF);
        }
    /* The columnwise copy by blocks of WHOLE_ROWS rows: down all of a thread's rows eight
     * columns at a time, each read took a line of its own (8192x4096: 0.05 of memcpy). */
    for (int64_t rb = r0; j->col && rb < r1; rb += WHOLE_ROWS) {
        const int64_t re = r1 - rb < WHOLE_ROWS ? r1 : rb + WHOLE_ROWS;
        for (int64_t c = 0; c < C; c += 8) {
            const int n = C - c < 8 ? (int) (C - c) : 8;
            lanes ln = uniform(j->tensor_scale, 0);
            if (rowwise) {
                float f[8] = {0};
                memcpy(f, j->col_scale + c, (size_t) n * sizeof(float));
                ln.f = _mm256_loadu_ps(f);
            }
            emit_cols(j, rb, re, c, n, &ln, E5, BF);
        }
    }
}

AI void run(const lowp_quant_job *j, int64_t r0, int64_t r1, const int E5, const int BF) {
    switch (j->scaling) {
    case LOWP_SCALING_TENSOR:
    case LOWP_SCALING_ROW: whole(j, r0, r1, E5, BF); break;
    case LOWP_SCALING_MX32:
    case LOWP_SCALING_BLOCK128: {
        const int64_t bs = j->scaling == LOWP_SCALING_MX32 ? 32 : 128;
        if (j->row) row_blocks(j, r0, r1, bs, E5, BF);
        if (j->col) col_blocks(j, r0, r1, bs, E5, BF);
        break;
    }
    case LOWP_SCALING_BLOCK128X128: tiles(j, r0, r1, 128, E5, BF); break;
    case LOWP_SCALING_BLOCK32X32: tiles(j, r0, r1, 32, E5, BF); break;
    default: break;
    }
}

/* The instances: element format and rounding path (FMT, enc8), input format (BF). */
#define RUN_INSTANCE(NAME, FMT, BF)                                                                \
    static void NAME(const lowp_quant_job *j, int64_t r0, int64_t r1) {                            \
        run(j, r0, r1, FMT, BF);                                                                   \
    }
RUN_INSTANCE(run_e4m3_f32, 0, 0)
RUN_INSTANCE(run_e5m2_f32, 1, 0)
RUN_INSTANCE(run_e4m3_bf16, 0, 1)
RUN_INSTANCE(run_e5m2_bf16, 1, 1)
RUN_INSTANCE(run_e4m3_f32_rne, 2, 0)
RUN_INSTANCE(run_e5m2_f32_rne, 3, 0)
RUN_INSTANCE(run_e4m3_bf16_rne, 2, 1)
RUN_INSTANCE(run_e5m2_bf16_rne, 3, 1)

void lowp_cpu_quant_avx2(const lowp_quant_job *j, int64_t r0, int64_t r1) {
    typedef void (*fn)(const lowp_quant_job *, int64_t, int64_t);
    static const fn k[2][2][2] = {
        {{run_e4m3_f32, run_e5m2_f32}, {run_e4m3_bf16, run_e5m2_bf16}},
        {{run_e4m3_f32_rne, run_e5m2_f32_rne}, {run_e4m3_bf16_rne, run_e5m2_bf16_rne}}};
    if (j->efmt == LOWP_FORMAT_E2M1) { /* NVFP4 (supports) */
        lowp_cpu_quant_avx2_nv(j, r0, r1);
        return;
    }
    const int rne = (_mm_getcsr() & 0x6000u) == 0; /* MXCSR.RC: round to nearest */
    k[rne][j->xfmt == LOWP_FORMAT_BF16][j->efmt == LOWP_FORMAT_E5M2](j, r0, r1);
}

/* The whole-tensor passes of the dispatcher (quant.c), as the AVX-512 ones. */
uint32_t lowp_cpu_amax_bits_avx2(const lowp_quant_job *j, int64_t r0, int64_t r1) {
    return j->xfmt == LOWP_FORMAT_BF16 ? rect_amax(j, r0, r1, 0, j->cols, 1)
                                       : rect_amax(j, r0, r1, 0, j->cols, 0);
}

void lowp_cpu_colamax_bits_avx2(const lowp_quant_job *j, int64_t r0, int64_t r1, uint32_t *acc) {
    const int bf = j->xfmt == LOWP_FORMAT_BF16;
    for (int64_t rb = r0; rb < r1; rb += WHOLE_ROWS) { /* by blocks of rows, as whole() */
        const int64_t re = r1 - rb < WHOLE_ROWS ? r1 : rb + WHOLE_ROWS;
        for (int64_t c = 0; c < j->cols; c += 8) {
            const int n = j->cols - c < 8 ? (int) (j->cols - c) : 8;
            uint32_t m[8];
            _mm256_storeu_si256((__m256i *) m,
                                bf ? col_amax8(j, rb, re, c, n, 1) : col_amax8(j, rb, re, c, n, 0));
            for (int l = 0; l < n; l++) acc[c + l] = m[l] > acc[c + l] ? m[l] : acc[c + l];
        }
    }
}
