/* The AVX2 NVFP4 quantization kernel (docs/numerics.md section 4b, bit for bit the
 * reference's): nv16 rowwise, columnwise or both from one read, and nv16x16, for CPUs without
 * AVX-512 (lowp_cpu_quant_avx2 hands it the nv jobs), and nv16's grouped columnwise copy under
 * RNE (lowp_cpu_quant_grouped_avx2_nv; under SR the grouped copy stays on the reference).
 *
 * The input is taken 16x16 tiles at a time (rows [rb, rb + 16) from a multiple of 16 when a
 * columnwise copy or tiles are asked; any rows for the rowwise copy alone), two 8-lane binary32
 * vectors per tile row. Block maxima are maxima of |x| bit patterns (NaN above Inf above every
 * number): per row by a horizontal maximum, per column lane by lane. The block scale code and
 * the element factor are the scalar rules of core/scale_rules.h (one per 16 elements), and each
 * element is x times its factor in binary32, then rounded to E2M1 by the reference encoder's
 * integer algorithm (src/core/format.c: RNE, SATFINITE, the sign of zero kept) on eight lanes.
 * A NaN block's codes are 0. The codes of a tile are stored to a 16x16 byte array and packed
 * two a byte along the rows of each copy (the pad nibble of an odd row 0). */
#include <immintrin.h>
#include <string.h>

#include "core/scale_rules.h"
#include "cpu.h"
#include "quant_kernels.h"

#define AI static inline __attribute__((always_inline))

/* Elements [c, c + n) of input row r as binary32 (exact for BF16), zeros past n (n <= 8). */
AI __m256 nv_ld8(const lowp_quant_job *j, int64_t r, int64_t c, int64_t n, const int BF) {
    if (n <= 0) return _mm256_setzero_ps();
    const size_t i = (size_t) r * (size_t) j->cols + (size_t) c;
    if (BF) {
        uint16_t t[8] = {0};
        if (n < 8) memcpy(t, (const uint16_t *) j->x + i, (size_t) n * 2);
        const __m128i h = _mm_loadu_si128(n < 8 ? (const __m128i *) t
                                                : (const __m128i *) ((const uint16_t *) j->x + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    const float *p = (const float *) j->x + i;
    if (n >= 8) return _mm256_loadu_ps(p);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32((int) n), lane));
}

AI __m256i nv_abs8(__m256 v) {
    return _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7FFFFFFF));
}

AI uint32_t nv_hmax8(__m256i m) {
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xB1));
    return (uint32_t) _mm_cvtsi128_si32(h);
}

/* E2M1 codes (sign at bit 3, one per 32-bit lane) of v, RNE, SATFINITE: small_encode of
 * src/core/format.c with 1 mantissa bit and bias 1, lane by lane. A zero or binary32 denormal
 * shifts past the significand to code 0; Inf and overflow saturate at 7; NaN (a NaN block's,
 * whose codes are replaced) gives 0. */
AI __m256i nv_e2m1(__m256 v) {
    const __m256i one = _mm256_set1_epi32(1);
    const __m256i u = _mm256_castps_si256(v);
    const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    const __m256i sbit = _mm256_and_si256(_mm256_srli_epi32(u, 28), _mm256_set1_epi32(0x8));
    const __m256i m24 = _mm256_or_si256(_mm256_and_si256(a, _mm256_set1_epi32(0x7FFFFF)),
                                        _mm256_set1_epi32(0x800000));
    const __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(a, 23), _mm256_set1_epi32(126));
    /* shift = 22 + max(0, 1 - e) */
    const __m256i sub = _mm256_max_epi32(_mm256_sub_epi32(one, e), _mm256_setzero_si256());
    const __m256i shift = _mm256_add_epi32(_mm256_set1_epi32(22), sub);
    const __m256i half_m1 =
        _mm256_sub_epi32(_mm256_sllv_epi32(one, _mm256_sub_epi32(shift, one)), one);
    const __m256i odd = _mm256_and_si256(_mm256_srlv_epi32(m24, shift), one);
    const __m256i q =
        _mm256_srlv_epi32(_mm256_add_epi32(_mm256_add_epi32(m24, half_m1), odd), shift);
    const __m256i base = _mm256_slli_epi32(_mm256_sub_epi32(_mm256_max_epi32(e, one), one), 1);
    const __m256i code = _mm256_min_epu32(_mm256_add_epi32(base, q), _mm256_set1_epi32(7));
    const __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
    return _mm256_andnot_si256(nan, _mm256_or_si256(sbit, code));
}

/* Eight codes of x * f into dst, 0 in the lanes of `zero` (NaN blocks). */
AI void nv_enc8(__m256 x, __m256 f, __m256i zero, uint8_t *dst) {
    const __m256i c = _mm256_andnot_si256(zero, nv_e2m1(_mm256_mul_ps(x, f)));
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
    const uint64_t b = (uint64_t) _mm_cvtsi128_si64(_mm_packus_epi16(w, w));
    memcpy(dst, &b, 8);
}

/* Step 2 and 3 of one block of maximum pattern `amax`: its code, and its factor. */
AI uint8_t nv_block(const lowp_quant_job *j, uint32_t amax, float *f) {
    const uint8_t code = lowp_rule_nv_block_code(lowp_u2f(amax), j->nv_enc, j->e4m3);
    *f = lowp_rule_nv_elem_factor(code, j->nv_dec, j->e4m3);
    return code;
}

/* Byte k of a run of n codes c[0], c[step], ...: two codes, the first in the low nibble. */
AI void nv_pack_run(uint8_t *dst, const uint8_t *c, int step, int64_t n) {
    for (int64_t k = 0; 2 * k < n; k++) {
        const uint8_t hi = 2 * k + 1 < n ? c[(2 * k + 1) * step] : 0;
        dst[k] = (uint8_t) (c[2 * k * step] | hi << 4);
    }
}

/* The tile rows [rb, rb + nr) x columns [c0, c0 + nc): its scales and codes in both copies. */
AI void nv_tile2(const lowp_quant_job *j, int64_t rb, int64_t nr, int64_t c0, int64_t nc,
                 const int BF) {
    __m256 x[16][2];
    __m256i cm0 = _mm256_setzero_si256(), cm1 = cm0;
    uint32_t rmax[16];
    for (int i = 0; i < 16; i++) {
        x[i][0] = i < nr ? nv_ld8(j, rb + i, c0, nc, BF) : _mm256_setzero_ps();
        x[i][1] = i < nr ? nv_ld8(j, rb + i, c0 + 8, nc - 8, BF) : _mm256_setzero_ps();
        const __m256i a0 = nv_abs8(x[i][0]), a1 = nv_abs8(x[i][1]);
        rmax[i] = nv_hmax8(_mm256_max_epu32(a0, a1));
        cm0 = _mm256_max_epu32(cm0, a0);
        cm1 = _mm256_max_epu32(cm1, a1);
    }
    const int tiles = j->scaling == LOWP_SCALING_NV16X16;
    _Alignas(32) uint32_t cmax[16];
    _mm256_store_si256((__m256i *) cmax, cm0);
    _mm256_store_si256((__m256i *) (cmax + 8), cm1);
    _Alignas(32) float fc[16] = {0};
    uint8_t sc[16], sr[16], cd[16][16];
    float fr[16] = {0};
    if (tiles) {
        uint32_t m = 0;
        for (int i = 0; i < 16; i++) m = cmax[i] > m ? cmax[i] : m;
        sc[0] = sr[0] = nv_block(j, m, &fr[0]);
        for (int i = 0; i < 16; i++) fr[i] = fc[i] = fr[0], sr[i] = sc[i] = sc[0];
    } else {
        for (int i = 0; i < 16; i++) sr[i] = j->row ? nv_block(j, rmax[i], &fr[i]) : 0;
        for (int i = 0; i < 16; i++) sc[i] = j->col ? nv_block(j, cmax[i], &fc[i]) : 0;
    }
    if (j->row) { /* rows' factors: one per tile row (nv16), or the tile's */
        for (int i = 0; i < nr; i++) {
            const __m256i z = _mm256_set1_epi32(sr[i] == 0x7F ? -1 : 0);
            nv_enc8(x[i][0], _mm256_set1_ps(fr[i]), z, cd[i]);
            nv_enc8(x[i][1], _mm256_set1_ps(fr[i]), z, cd[i] + 8);
        }
        const size_t ob = ((size_t) j->cols + 1) / 2;
        const int64_t nbc = (j->cols + 15) / 16;
        for (int i = 0; i < nr; i++)
            nv_pack_run((uint8_t *) j->row->data + (size_t) (rb + i) * ob + c0 / 2, cd[i], 1, nc);
        uint8_t *s = (uint8_t *) j->row->scales;
        if (tiles)
            s[(rb / 16) * nbc + c0 / 16] = sr[0];
        else
            for (int i = 0; i < nr; i++) s[(rb + i) * nbc + c0 / 16] = sr[i];
    }
    if (j->col) { /* columns' factors: one per column lane (nv16), or the tile's */
        const __m256 f0 = _mm256_load_ps(fc), f1 = _mm256_load_ps(fc + 8);
        const __m256i nan = _mm256_set1_epi32(0x7F);
        __m256i z0 = _mm256_cmpeq_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((__m128i *) sc)), nan);
        __m256i z1 =
            _mm256_cmpeq_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((__m128i *) (sc + 8))), nan);
        for (int i = 0; i < 16; i++) {
            nv_enc8(x[i][0], f0, z0, cd[i]);
            nv_enc8(x[i][1], f1, z1, cd[i] + 8);
        }
        uint8_t *s = (uint8_t *) j->col->scales;
        for (int c = 0; c < nc; c++)
            nv_pack_run((uint8_t *) j->col->data + (size_t) (c0 + c) * j->col_ob + rb / 2,
                        &cd[0][c], 16, nr);
        if (tiles)
            s[(c0 / 16) * j->col_nbr + rb / 16] = sc[0];
        else
            for (int c = 0; c < nc; c++) s[(c0 + c) * j->col_nbr + rb / 16] = sc[c];
    }
}

AI void nv_run(const lowp_quant_job *j, int64_t r0, int64_t r1, const int BF) {
    for (int64_t rb = r0; rb < r1; rb += 16)
        for (int64_t c0 = 0; c0 < j->cols; c0 += 16)
            nv_tile2(j, rb, r1 - rb < 16 ? r1 - rb : 16, c0, j->cols - c0 < 16 ? j->cols - c0 : 16,
                     BF);
}

static __attribute__((noinline)) void nv_run_f32(const lowp_quant_job *j, int64_t r0, int64_t r1) {
    nv_run(j, r0, r1, 0);
}
static __attribute__((noinline)) void nv_run_bf16(const lowp_quant_job *j, int64_t r0, int64_t r1) {
    nv_run(j, r0, r1, 1);
}

void lowp_cpu_quant_avx2_nv(const lowp_quant_job *j, int64_t r0, int64_t r1) {
    if (j->xfmt == LOWP_FORMAT_BF16)
        nv_run_bf16(j, r0, r1);
    else
        nv_run_f32(j, r0, r1);
}

/* ---- NV16's grouped columnwise copy (quant_avx512_nv.c's design on eight lanes) ---- */

/* Writes the n codes c[0], c[16], ... at element s of an output row: an odd s completes the
 * byte whose low nibble the previous group wrote; an odd end leaves a high nibble of 0 for the
 * next group to complete. */
AI void nv_put_run(uint8_t *row, int64_t s, int64_t n, const uint8_t *c) {
    if (n > 0 && (s & 1)) {
        row[s / 2] = (uint8_t) ((row[s / 2] & 0x0F) | c[0] << 4);
        c += 16;
        s++;
        n--;
    }
    nv_pack_run(row + s / 2, c, 16, n);
}

/* The blocks of input columns [c0, c0 + nc) over tokens [s, s + n) of one group (n <= 16),
 * block index blk of each output row (nbt blocks a row). */
AI void nv_group_block(const lowp_quant_job *j, int64_t s, int64_t n, int64_t c0, int64_t nc,
                       int64_t blk, int64_t nbt, const int BF) {
    const lowp_qtensor *q = j->col;
    __m256 x[16][2];
    __m256i cm0 = _mm256_setzero_si256(), cm1 = cm0;
    for (int i = 0; i < n; i++) {
        x[i][0] = nv_ld8(j, s + i, c0, nc, BF);
        x[i][1] = nv_ld8(j, s + i, c0 + 8, nc - 8, BF);
        cm0 = _mm256_max_epu32(cm0, nv_abs8(x[i][0]));
        cm1 = _mm256_max_epu32(cm1, nv_abs8(x[i][1]));
    }
    _Alignas(32) uint32_t cmax[16];
    _mm256_store_si256((__m256i *) cmax, cm0);
    _mm256_store_si256((__m256i *) (cmax + 8), cm1);
    _Alignas(32) float fc[16];
    uint8_t sc[16], cd[16][16];
    for (int c = 0; c < 16; c++) sc[c] = nv_block(j, cmax[c], &fc[c]);
    const __m256 f0 = _mm256_load_ps(fc), f1 = _mm256_load_ps(fc + 8);
    const __m256i nan = _mm256_set1_epi32(0x7F);
    const __m256i z0 =
        _mm256_cmpeq_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((__m128i *) sc)), nan);
    const __m256i z1 =
        _mm256_cmpeq_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((__m128i *) (sc + 8))), nan);
    for (int i = 0; i < n; i++) {
        nv_enc8(x[i][0], f0, z0, cd[i]);
        nv_enc8(x[i][1], f1, z1, cd[i] + 8);
    }
    const size_t ob = ((size_t) j->rows + 1) / 2;
    for (int c = 0; c < nc; c++) {
        ((uint8_t *) q->scales)[(c0 + c) * nbt + blk] = sc[c];
        nv_put_run((uint8_t *) q->data + (size_t) (c0 + c) * ob, s, n, &cd[0][c]);
    }
}

/* Output rows (input columns) [c0, c1): each group's blocks restart at its first token, the
 * last one short; the tokens past offs[G-1] get code 0. */
AI void nv_grouped_run(const lowp_quant_job *j, int64_t c0, int64_t c1, const int BF) {
    const lowp_qtensor *q = j->col;
    int64_t nbt = 0, used = 0; /* blocks per output row, over every group */
    for (int32_t g = 0; g < q->groups; g++) {
        nbt += (q->group_offs[g] - used + 15) / 16;
        used = q->group_offs[g];
    }
    const size_t ob = ((size_t) j->rows + 1) / 2, u0 = ((size_t) used + 1) / 2;
    for (int64_t cc = c0; cc < c1; cc += 16) {
        const int64_t nc = c1 - cc < 16 ? c1 - cc : 16;
        int64_t start = 0, blk = 0;
        for (int32_t g = 0; g < q->groups; g++) {
            const int64_t end = q->group_offs[g];
            for (int64_t s = start; s < end; s += 16, blk++)
                nv_group_block(j, s, end - s < 16 ? end - s : 16, cc, nc, blk, nbt, BF);
            start = end;
        }
        if (u0 < ob) /* tokens past offs[G-1]: code 0 */
            for (int64_t i = 0; i < nc; i++)
                memset((uint8_t *) q->data + (size_t) (cc + i) * ob + u0, 0, ob - u0);
    }
}

static __attribute__((noinline)) void nvg_run_f32(const lowp_quant_job *j, int64_t c0, int64_t c1) {
    nv_grouped_run(j, c0, c1, 0);
}
static __attribute__((noinline)) void nvg_run_bf16(const lowp_quant_job *j, int64_t c0,
                                                   int64_t c1) {
    nv_grouped_run(j, c0, c1, 1);
}

void lowp_cpu_quant_grouped_avx2_nv(const lowp_quant_job *j, int64_t c0, int64_t c1) {
    if (j->xfmt == LOWP_FORMAT_BF16)
        nvg_run_bf16(j, c0, c1);
    else
        nvg_run_f32(j, c0, c1);
}
