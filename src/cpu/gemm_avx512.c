/* AVX-512 GEMM kernels: the F32 x F32 SGEMM (FMA, 12x32 register blocks on packed B panels)
 * and, for every other pair, the blocked BF16 driver (gemm_blk.c) on a VDPBF16PS
 * micro-kernel (CPUs with AVX512_BF16) or on a binary32 FMA micro-kernel (without it); both
 * fall back, tile by tile, on the exact micro-kernel (the reference's operation sequence)
 * where DAZ/FTZ or fused products could change a result beyond rounding. The attention core's
 * products, whose right operands serve many calls, run the SGEMM's micro-kernels on panels
 * packed once per head (lowp_cpu_sgp_*).
 *
 * SGEMM workspace (floats): NC * Kp16 packed B ([K][32] panels; Kp16 = K rounded up to 16,
 * NC = B_BUDGET_BYTES / (4 Kp16) rounded down to 32, at least 32, at most N rounded up)
 * + 12 * 32 + 256 + NC / 32. */
#include <immintrin.h>

#include "cpu.h"
#include "gemm_blk.h"

#define B_BUDGET_BYTES ((size_t) 1024 << 10) /* packed B per column block (about an L2) */

/* ---- IEEE binary32 micro-kernel on the BF16 layouts ---- */

/* Rows [r0, r0 + MR) of P over nkt tiles, summed sequentially in k. FUSED = 0: a rounded
 * multiply and a rounded add per product, the reference's exact operation sequence, so that
 * products that overflow to Inf, and denormals, come out exactly as there. FUSED = 1: FMA. */
static inline __attribute__((always_inline)) void f32x_rows(const uint16_t *a, const uint16_t *b,
                                                            int64_t nkt, int r0, float *p,
                                                            const int MR, const int FUSED) {
    __m512 c[8][2];
    const __m512i hi = _mm512_set1_epi32((int) 0xFFFF0000u);
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) c[i][0] = c[i][1] = _mm512_setzero_ps();
    for (int64_t kt = 0; kt < nkt; kt++) {
        const uint16_t *ak = a + kt * LOWP_BLK_TILE_U16 + 32 * r0;
        const uint16_t *bk = b + kt * LOWP_BLK_TILE_U16;
        for (int q = 0; q < 16; q++) {
            const __m512i b0 = _mm512_load_si512(bk + 32 * q);
            const __m512i b1 = _mm512_load_si512(bk + 512 + 32 * q);
            const __m512 b0e = _mm512_castsi512_ps(_mm512_slli_epi32(b0, 16));
            const __m512 b0o = _mm512_castsi512_ps(_mm512_and_si512(b0, hi));
            const __m512 b1e = _mm512_castsi512_ps(_mm512_slli_epi32(b1, 16));
            const __m512 b1o = _mm512_castsi512_ps(_mm512_and_si512(b1, hi));
#pragma GCC unroll 8
            for (int i = 0; i < MR; i++) {
                uint32_t pr;
                memcpy(&pr, ak + 32 * i + 2 * q, 4);
                const __m512 ae = _mm512_castsi512_ps(_mm512_set1_epi32((int) (pr << 16)));
                const __m512 ao = _mm512_castsi512_ps(_mm512_set1_epi32((int) (pr & 0xFFFF0000u)));
                if (FUSED) {
                    c[i][0] = _mm512_fmadd_ps(ae, b0e, c[i][0]);
                    c[i][1] = _mm512_fmadd_ps(ae, b1e, c[i][1]);
                    c[i][0] = _mm512_fmadd_ps(ao, b0o, c[i][0]);
                    c[i][1] = _mm512_fmadd_ps(ao, b1o, c[i][1]);
                } else {
                    c[i][0] = _mm512_add_ps(c[i][0], _mm512_mul_ps(ae, b0e));
                    c[i][1] = _mm512_add_ps(c[i][1], _mm512_mul_ps(ae, b1e));
                    c[i][0] = _mm512_add_ps(c[i][0], _mm512_mul_ps(ao, b0o));
                    c[i][1] = _mm512_add_ps(c[i][1], _mm512_mul_ps(ao, b1o));
                }
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
        _mm512_storeu_ps(p + 32 * (r0 + i), c[i][0]);
        _mm512_storeu_ps(p + 32 * (r0 + i) + 16, c[i][1]);
    }
}

static void f32x_8(const uint16_t *a, const uint16_t *b, int64_t nkt, int r0, float *p) {
    f32x_rows(a, b, nkt, r0, p, 8, 0);
}
static void f32x_4(const uint16_t *a, const uint16_t *b, int64_t nkt, int r0, float *p) {
    f32x_rows(a, b, nkt, r0, p, 4, 0);
}
static void fma_8(const uint16_t *a, const uint16_t *b, int64_t nkt, int r0, float *p) {
    f32x_rows(a, b, nkt, r0, p, 8, 1);
}
static void fma_4(const uint16_t *a, const uint16_t *b, int64_t nkt, int r0, float *p) {
    f32x_rows(a, b, nkt, r0, p, 4, 1);
}

void lowp_gemm_micro_f32x(const uint16_t *a, const uint16_t *b, int64_t nkt, int r0, int mr,
                          float *p) {
    int r = r0;
    for (; r + 8 <= r0 + mr; r += 8) f32x_8(a, b, nkt, r, p);
    for (; r < r0 + mr; r += 4) f32x_4(a, b, nkt, r, p);
}

/* The same with FMA: the fast kernel of CPUs without AVX512_BF16 (FP8/FP4 products never
 * overflow or reach the denormals, so FMA only changes rounding). */
void lowp_gemm_micro_f32fma(const uint16_t *a, const uint16_t *b, int64_t nkt, int r0, int mr,
                            float *p) {
    int r = r0;
    for (; r + 8 <= r0 + mr; r += 8) fma_8(a, b, nkt, r, p);
    for (; r < r0 + mr; r += 4) fma_4(a, b, nkt, r, p);
}

/* ---- VDPBF16PS micro-kernel ---- */

#define DP_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

static inline __attribute__((always_inline)) DP_TARGET void
dp_rows(const uint16_t *a, const uint16_t *b, int64_t nkt, int r0, float *p, const int MR) {
    __m512 c[12][2];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) c[i][0] = c[i][1] = _mm512_setzero_ps();
    for (int64_t kt = 0; kt < nkt; kt++) {
        const uint16_t *ak = a + kt * LOWP_BLK_TILE_U16 + 32 * r0;
        const uint16_t *bk = b + kt * LOWP_BLK_TILE_U16;
#pragma GCC unroll 2
        for (int q = 0; q < 16; q++) {
            const __m512bh b0 = (__m512bh) _mm512_load_si512(bk + 32 * q);
            const __m512bh b1 = (__m512bh) _mm512_load_si512(bk + 512 + 32 * q);
#pragma GCC unroll 12
            for (int i = 0; i < MR; i++) {
                uint32_t pr;
                memcpy(&pr, ak + 32 * i + 2 * q, 4);
                const __m512bh av = (__m512bh) _mm512_set1_epi32((int) pr);
                c[i][0] = _mm512_dpbf16_ps(c[i][0], av, b0);
                c[i][1] = _mm512_dpbf16_ps(c[i][1], av, b1);
            }
        }
    }
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
        _mm512_storeu_ps(p + 32 * (r0 + i), c[i][0]);
        _mm512_storeu_ps(p + 32 * (r0 + i) + 16, c[i][1]);
    }
}

static DP_TARGET void dp_12(const uint16_t *a, const uint16_t *b, int64_t nkt, int r0, float *p) {
    dp_rows(a, b, nkt, r0, p, 12);
}
static DP_TARGET void dp_8(const uint16_t *a, const uint16_t *b, int64_t nkt, int r0, float *p) {
    dp_rows(a, b, nkt, r0, p, 8);
}
static DP_TARGET void dp_4(const uint16_t *a, const uint16_t *b, int64_t nkt, int r0, float *p) {
    dp_rows(a, b, nkt, r0, p, 4);
}

void lowp_gemm_micro_dpbf16(const uint16_t *a, const uint16_t *b, int64_t nkt, int r0, int mr,
                            float *p) {
    int r = r0;
    const int end = r0 + mr;
    for (; end - r >= 12 && end - r != 16; r += 12) dp_12(a, b, nkt, r, p);
    for (; end - r >= 8; r += 8) dp_8(a, b, nkt, r, p);
    for (; r < end; r += 4) dp_4(a, b, nkt, r, p);
}

/* B blocks of at least 512 columns: 199 against 169 GFLOP/s at M=4096 K=4096 N=1024 (MXFP8,
 * one Zen 4 core), no loss at small K (docs/bench-log/gemm.md, "Column blocks"). */
#define B_MIN_COLS 512
static const lowp_gemm_blk_kernel k_dp = {lowp_gemm_micro_dpbf16, lowp_gemm_micro_f32x, 4,
                                          B_BUDGET_BYTES,         B_MIN_COLS,           0};
static const lowp_gemm_blk_kernel k_f32x = {lowp_gemm_micro_f32fma, lowp_gemm_micro_f32x, 4,
                                            B_BUDGET_BYTES,         B_MIN_COLS,           0};

/* ---- SGEMM: F32 x F32 ---- */

#define SG_MR 12
#define SG_NR 32

/* Columns of B per packed block: panels of [K][32] floats within the budget. */
static int64_t sg_nc(const lowp_gemm_job *j) {
    const int64_t K = j->k1 - j->k0 > 0 ? j->k1 - j->k0 : 1;
    const int64_t kp = (K + 15) / 16 * 16;
    int64_t nc = (int64_t) (B_BUDGET_BYTES / (4 * (size_t) kp)) / SG_NR * SG_NR;
    if (nc < SG_NR) nc = SG_NR;
    const int64_t n = j->n1 - j->n0 > 0 ? j->n1 - j->n0 : 1, ncap = (n + 31) / 32 * 32;
    return nc < ncap ? nc : ncap;
}

static size_t sg_ws_floats(const lowp_gemm_job *j) {
    const int64_t K = j->k1 - j->k0 > 0 ? j->k1 - j->k0 : 0, kp = (K + 15) / 16 * 16;
    return (size_t) (sg_nc(j) * kp + SG_MR * SG_NR + 256 + sg_nc(j) / SG_NR);
}

/* 16x16 transpose of floats: dst[c * 16 + r] = src[r * 16 + c]. */
static void tr16(const float *src, float *dst, int64_t dst_stride) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + 16 * i);
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_castpd_ps(
            _mm512_unpacklo_pd(_mm512_castps_pd(t[4 * i]), _mm512_castps_pd(t[4 * i + 2])));
        r[4 * i + 1] = _mm512_castpd_ps(
            _mm512_unpackhi_pd(_mm512_castps_pd(t[4 * i]), _mm512_castps_pd(t[4 * i + 2])));
        r[4 * i + 2] = _mm512_castpd_ps(
            _mm512_unpacklo_pd(_mm512_castps_pd(t[4 * i + 1]), _mm512_castps_pd(t[4 * i + 3])));
        r[4 * i + 3] = _mm512_castpd_ps(
            _mm512_unpackhi_pd(_mm512_castps_pd(t[4 * i + 1]), _mm512_castps_pd(t[4 * i + 3])));
    }
    for (int jj = 0; jj < 4; jj++) {
        __m512 a = _mm512_shuffle_f32x4(r[jj], r[4 + jj], 0x88);
        __m512 b = _mm512_shuffle_f32x4(r[jj], r[4 + jj], 0xDD);
        __m512 c = _mm512_shuffle_f32x4(r[8 + jj], r[12 + jj], 0x88);
        __m512 d = _mm512_shuffle_f32x4(r[8 + jj], r[12 + jj], 0xDD);
        _mm512_storeu_ps(dst + dst_stride * jj, _mm512_shuffle_f32x4(a, c, 0x88));
        _mm512_storeu_ps(dst + dst_stride * (8 + jj), _mm512_shuffle_f32x4(a, c, 0xDD));
        _mm512_storeu_ps(dst + dst_stride * (4 + jj), _mm512_shuffle_f32x4(b, d, 0x88));
        _mm512_storeu_ps(dst + dst_stride * (12 + jj), _mm512_shuffle_f32x4(b, d, 0xDD));
    }
}

/* The masks of a panel's two 16-lane halves for its first w columns (w <= 32). */
static void half_masks(int w, __mmask16 *m0, __mmask16 *m1) {
    *m0 = (__mmask16) (w >= 16 ? 0xFFFF : (1u << w) - 1);
    *m1 = (__mmask16) (w >= 32 ? 0xFFFF : w > 16 ? (1u << (w - 16)) - 1 : 0);
}

/* Pack rows [n0, n0 + w) of B (w <= 32), columns [k0, k1), as [kp][32] floats. */
static void sg_pack(const lowp_gemm_job *j, int64_t n0, int w, float *dst, float *tmp) {
    const float *B = (const float *) j->b->data;
    const int64_t K = j->k1 - j->k0, ldb = j->b->cols;
    if (j->b_kn) { /* stored [K, N]: each k's 32 columns are one stretch of row k */
        __mmask16 m0, m1;
        half_masks(w, &m0, &m1);
        const int64_t kp = (K + 15) / 16 * 16;
        for (int64_t k = 0; k < kp; k++) {
            const float *src = B + (j->k0 + k) * ldb + n0;
            _mm512_storeu_ps(dst + k * SG_NR,
                             k < K ? _mm512_maskz_loadu_ps(m0, src) : _mm512_setzero_ps());
            _mm512_storeu_ps(dst + k * SG_NR + 16,
                             k < K ? _mm512_maskz_loadu_ps(m1, src + 16) : _mm512_setzero_ps());
        }
        return;
    }
    for (int64_t k = 0; k < K; k += 16) {
        const int len = (int) (K - k < 16 ? K - k : 16);
        const __mmask16 mk = (__mmask16) (len >= 16 ? 0xFFFF : (1u << len) - 1);
        for (int h = 0; h < 2; h++) {
            for (int i = 0; i < 16; i++) {
                const int n = 16 * h + i;
                __m512 v = _mm512_setzero_ps();
                if (n < w) v = _mm512_maskz_loadu_ps(mk, B + (n0 + n) * ldb + j->k0 + k);
                _mm512_storeu_ps(tmp + 16 * i, v);
            }
            tr16(tmp, dst + k * SG_NR + 16 * h, SG_NR);
        }
    }
}

/* P[MR][32] = rows a_rows[0..MR) of A . panel over K; FMA, or (FUSED = 0) a rounded multiply
 * and add per product in k order, the reference's exact sequence. */
static inline __attribute__((always_inline)) void sg_rows(const float *const *ar,
                                                          const float *panel, int64_t K, float *p,
                                                          const int MR, const int FUSED) {
    __m512 c[SG_MR][2];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) c[i][0] = c[i][1] = _mm512_setzero_ps();
    const float *a[SG_MR];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) a[i] = ar[i];
#pragma GCC unroll 2
    for (int64_t k = 0; k < K; k++) {
        const __m512 b0 = _mm512_load_ps(panel + SG_NR * k);
        const __m512 b1 = _mm512_load_ps(panel + SG_NR * k + 16);
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++) {
            const __m512 av = _mm512_set1_ps(a[i][k]);
            if (FUSED) {
                c[i][0] = _mm512_fmadd_ps(av, b0, c[i][0]);
                c[i][1] = _mm512_fmadd_ps(av, b1, c[i][1]);
            } else {
                c[i][0] = _mm512_add_ps(c[i][0], _mm512_mul_ps(av, b0));
                c[i][1] = _mm512_add_ps(c[i][1], _mm512_mul_ps(av, b1));
            }
        }
    }
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
        _mm512_storeu_ps(p + 32 * i, c[i][0]);
        _mm512_storeu_ps(p + 32 * i + 16, c[i][1]);
    }
}

static void sg_12(const float *const *ar, const float *panel, int64_t K, float *p) {
    sg_rows(ar, panel, K, p, 12, 1);
}
static void sg_4(const float *const *ar, const float *panel, int64_t K, float *p) {
    sg_rows(ar, panel, K, p, 4, 1);
}
static void sg_12_seq(const float *const *ar, const float *panel, int64_t K, float *p) {
    sg_rows(ar, panel, K, p, 12, 0);
}

/* Biased exponent of the largest |x| of n floats (255 for Inf/NaN). */
static int max_exp_f32(const float *x, int64_t n) {
    __m512i m = _mm512_setzero_si512();
    const __m512i abs = _mm512_set1_epi32(0x7FFFFFFF);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_loadu_si512(x + i), abs));
    if (i < n)
        m = _mm512_max_epu32(
            m, _mm512_and_si512(_mm512_maskz_loadu_epi32((__mmask16) ((1u << (n - i)) - 1), x + i),
                                abs));
    return (int) (_mm512_reduce_max_epu32(m) >> 23);
}

static void sgemm(const lowp_gemm_job *j) {
    const int64_t K = j->k1 - j->k0 > 0 ? j->k1 - j->k0 : 0, kp = (K + 15) / 16 * 16;
    const int64_t nc = sg_nc(j), lda = j->a->cols;
    float *blk = j->ws, *P = j->ws + nc * kp, *tmp = P + SG_MR * SG_NR;
    int *pexp = (int *) (tmp + 256);
    const float *A = (const float *) j->a->data + j->k0;
    for (int64_t nb0 = j->n0; nb0 < j->n1; nb0 += nc) {
        const int64_t ncols = j->n1 - nb0 < nc ? j->n1 - nb0 : nc;
        const int64_t npan = (ncols + 31) / 32;
        for (int64_t p = 0; p < npan; p++) {
            const int w = (int) (ncols - 32 * p < 32 ? ncols - 32 * p : 32);
            sg_pack(j, nb0 + 32 * p, w, blk + p * kp * SG_NR, tmp);
            pexp[p] = max_exp_f32(blk + p * kp * SG_NR, K * SG_NR);
        }
        for (int64_t m0 = j->m0; m0 < j->m1; m0 += SG_MR) {
            const int rows = (int) (j->m1 - m0 < SG_MR ? j->m1 - m0 : SG_MR);
            /* Rows past the end repeat the last row; their results are not stored. */
            const float *ar[SG_MR];
            int ea = 0;
            for (int i = 0; i < SG_MR; i++) {
                ar[i] = A + (m0 + (i < rows ? i : rows - 1)) * lda;
                if (i < rows) {
                    int e = max_exp_f32(ar[i], K);
                    ea = e > ea ? e : ea;
                }
            }
            const int64_t next = m0 + SG_MR,
                          next_rows = j->m1 - next < SG_MR ? j->m1 - next : SG_MR;
            const int64_t pf_parts = npan < 2 ? npan : 2;
            for (int64_t p = 0; p < npan; p++) {
                const int w = (int) (ncols - 32 * p < 32 ? ncols - 32 * p : 32);
                const float *panel = blk + p * kp * SG_NR;
                /* The next strip's rows, during the last two panels (see gemm_blk.c). */
                if (next_rows > 0 && p >= npan - pf_parts)
                    lowp_gemm_prefetch_rows(j->a, next, next + next_rows, j->k0, j->k1,
                                            p - (npan - pf_parts), pf_parts);
                if (lowp_gemm_fma_needs_seq(ea, pexp[p], K)) {
                    sg_12_seq(ar, panel, K, P);
                } else if (rows > 4) {
                    sg_12(ar, panel, K, P);
                } else {
                    sg_4(ar, panel, K, P);
                }
                lowp_gemm_store_tile(j, m0, m0 + rows, nb0 + 32 * p, w, P);
            }
        }
    }
    _mm_sfence(); /* order the streaming stores of C before the job ends */
}

/* ---- SGEMM on panels packed once (lowp_cpu_sgp_*, cpu.h) ---- */

size_t lowp_cpu_sgp_floats(int64_t n, int64_t k) {
    const int64_t np = (n + SG_NR - 1) / SG_NR;
    return (size_t) (np * k * SG_NR + np * k);
}

void lowp_cpu_sgp_pack(const float *b, int64_t ldb, int kn, int64_t n, int64_t k, float *pk) {
    const int64_t np = (n + SG_NR - 1) / SG_NR;
    int *ex = (int *) (pk + np * k * SG_NR);
    for (int64_t p = 0; p < np; p++) {
        const int w = (int) (n - SG_NR * p < SG_NR ? n - SG_NR * p : SG_NR);
        float *dst = pk + p * k * SG_NR;
        if (kn) { /* b [k, n]: each k's columns are one stretch of row k */
            __mmask16 m0, m1;
            half_masks(w, &m0, &m1);
            for (int64_t kk = 0; kk < k; kk++) {
                const float *src = b + kk * ldb + SG_NR * p;
                _mm512_store_ps(dst + kk * SG_NR, _mm512_maskz_loadu_ps(m0, src));
                _mm512_store_ps(dst + kk * SG_NR + 16, _mm512_maskz_loadu_ps(m1, src + 16));
            }
        } else { /* b [n, k]: the panel's w rows, transposed */
            lowp_cpu_transpose_f32_avx512(b + SG_NR * p * ldb, w, k, ldb, dst, SG_NR);
            for (int64_t kk = 0; w < SG_NR && kk < k; kk++)
                for (int i = w; i < SG_NR; i++) dst[kk * SG_NR + i] = 0.0f;
        }
        for (int64_t kk = 0; kk < k; kk++) ex[p * k + kk] = max_exp_f32(dst + kk * SG_NR, SG_NR);
    }
}

/* Strips of rows whose largest exponents sgp_mul finds before it walks the panels. */
#define SGP_STRIPS 16

void lowp_cpu_sgp_mul(const float *a, int64_t lda, int64_t m, const float *pk, int64_t n, int64_t k,
                      int64_t n1, int64_t k0, int64_t k1, float *c, int64_t ldc) {
    const int64_t np = (n + SG_NR - 1) / SG_NR, K = k1 - k0;
    const int *ex = (const int *) (pk + np * k * SG_NR);
    _Alignas(64) float P[SG_MR * SG_NR];
    for (int64_t s0 = 0; s0 < m; s0 += SG_MR * SGP_STRIPS) {
        const int64_t s1 = m - s0 < SG_MR * SGP_STRIPS ? m : s0 + SG_MR * SGP_STRIPS;
        int ea[SGP_STRIPS];
        for (int64_t m0 = s0; m0 < s1; m0 += SG_MR) {
            const int64_t rows = s1 - m0 < SG_MR ? s1 - m0 : SG_MR;
            int e = 0;
            for (int64_t i = 0; i < rows; i++) {
                const int ei = max_exp_f32(a + (m0 + i) * lda, K);
                e = ei > e ? ei : e;
            }
            ea[(m0 - s0) / SG_MR] = e;
        }
        for (int64_t p = 0; SG_NR * p < n1; p++) {
            const float *panel = pk + (p * k + k0) * SG_NR;
            int eb = 0;
            for (int64_t kk = k0; kk < k1; kk++) eb = ex[p * k + kk] > eb ? ex[p * k + kk] : eb;
            const int64_t c0 = SG_NR * p;
            const int w = (int) (n1 - c0 < SG_NR ? n1 - c0 : SG_NR);
            __mmask16 m0k, m1k;
            half_masks(w, &m0k, &m1k);
            for (int64_t m0 = s0; m0 < s1; m0 += SG_MR) {
                const int rows = (int) (s1 - m0 < SG_MR ? s1 - m0 : SG_MR);
                const float *ar[SG_MR]; /* rows past the end repeat the last; not stored */
                for (int i = 0; i < SG_MR; i++) ar[i] = a + (m0 + (i < rows ? i : rows - 1)) * lda;
                if (lowp_gemm_fma_needs_seq(ea[(m0 - s0) / SG_MR], eb, K))
                    sg_12_seq(ar, panel, K, P);
                else if (rows > 4)
                    sg_12(ar, panel, K, P);
                else
                    sg_4(ar, panel, K, P);
                for (int i = 0; i < rows; i++) {
                    float *cr = c + (m0 + i) * ldc + c0;
                    if (w == SG_NR) {
                        _mm512_storeu_ps(cr, _mm512_load_ps(P + SG_NR * i));
                        _mm512_storeu_ps(cr + 16, _mm512_load_ps(P + SG_NR * i + 16));
                    } else {
                        _mm512_mask_storeu_ps(cr, m0k, _mm512_load_ps(P + SG_NR * i));
                        _mm512_mask_storeu_ps(cr + 16, m1k, _mm512_load_ps(P + SG_NR * i + 16));
                    }
                }
            }
        }
    }
}

/* ---- entry points ---- */

static int plain_f32(const lowp_gemm_job *j) {
    return j->pair == LOWP_PAIR_PLAIN && j->a->format == LOWP_FORMAT_F32;
}

int lowp_cpu_gemm_avx512_supports(const lowp_gemm_job *j) {
    /* SGEMM for F32, the BF16 driver for the rest */
    const uint32_t need = LOWP_CAP_AVX512F | LOWP_CAP_AVX512BW | LOWP_CAP_AVX512VL;
    return (lowp_cpu_caps()->flags & need) == need && (plain_f32(j) || lowp_gemm_blk_supports(j));
}

size_t lowp_cpu_gemm_avx512_ws_floats(const lowp_gemm_job *j) {
    return plain_f32(j) ? sg_ws_floats(j) : lowp_gemm_blk_ws_floats(j, &k_dp);
}

void lowp_cpu_gemm_avx512(const lowp_gemm_job *j) {
    if (plain_f32(j)) {
        if (j->tag) j->tag->valid = 0; /* its panels overwrite the workspace */
        sgemm(j);
        return;
    }
    const int bf16 = (lowp_cpu_caps()->flags & LOWP_CAP_AVX512_BF16) != 0;
    lowp_gemm_blk_run(j, bf16 ? &k_dp : &k_f32x);
}
