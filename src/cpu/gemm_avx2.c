/* The AVX2 + FMA GEMM kernel, for x86-64 CPUs without AVX-512 (AMD Zen 1 to 3, Intel client
 * parts and servers before Skylake-SP): every pair on binary32 arithmetic, 6x16 register
 * blocks on packed B panels. Per job:
 *
 *   for each block of NC columns of C (B_BUDGET_BYTES of packed binary32 B):
 *       decode the block's B rows exactly into panels of 16 columns, [K][16] floats
 *       for each strip of 6 rows of A: decode them exactly (binary32 A is read in place)
 *           for each panel: the pair's K blocks (16 for NVFP4, 32 for MX, 128 for BLOCK128,
 *           else all of K), each summed from +0 in k order and added to the tile's
 *           accumulator as docs/numerics.md section 6 says; then the tensorwise, rowwise or
 *           NVFP4 tensor scales, and C.
 *
 * Numerics. Each lane sums one element of C in k order, as the reference does. FP8 and FP4
 * products are exact in binary32, so a fused multiply-add rounds where the reference's
 * multiply and add round: for every pair with 8-bit or 4-bit elements the result is the
 * reference's, bit for bit (NaN payloads aside). BLOCK128 scales multiply as the reference's
 * ((s sA) sB). MX multiplies a block sum s by 2^(eA - 127), then by 2^(eB - 127): that is
 * ldexpf(s, eA + eB - 254) whenever the first product is exact, which holds for A codes in
 * [MX_SAFE_LO, MX_SAFE_HI] (a nonzero MX block sum lies within [2^-32, 2^37]); strips with
 * other codes multiply in binary64 (exact) and round once. Plain BF16 and binary32 tiles use
 * FMA, or the reference's rounded multiply and add where products or sums could overflow or
 * reach the denormals (lowp_gemm_fma_needs_seq), as the AVX-512 SGEMM does.
 *
 * Workspace (floats), with NC from the budget (a multiple of 16, at least 16, at most N rounded
 * up) and nkb K blocks: NC K (packed B) + 6 K (A strip) + K (B row scratch) + (NC + 6) nkb
 * (scales) + NC / 16 (panel exponents) + 96 (accumulator tile). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "gemm_kernels.h"

#define MR             6
#define NR             16
#define B_BUDGET_BYTES ((size_t) 1024 << 10) /* packed B per column block (see nc_cols) */
#define MX_SAFE_LO     33
#define MX_SAFE_HI     217
#define AI             static inline __attribute__((always_inline))

static int64_t kdim(const lowp_gemm_job *j) {
    return j->k1 - j->k0 > 0 ? j->k1 - j->k0 : 0;
}

static int64_t kblock(const lowp_gemm_job *j) {
    const int64_t K = kdim(j);
    return j->bk > 0 ? j->bk : (K > 0 ? K : 1);
}

/* Whether the pair sums all of K as one block (PLAIN, TENSOR, ROW). */
static int one_block(const lowp_gemm_job *j) {
    return j->pair == LOWP_PAIR_PLAIN || j->pair == LOWP_PAIR_TENSOR || j->pair == LOWP_PAIR_ROW;
}

/* K blocks of the job (the scaled pairs: none when K = 0); one for the other pairs, whose
 * TENSOR and ROW scales are kept in block 0's place. */
static int64_t nblocks(const lowp_gemm_job *j) {
    return one_block(j) ? 1 : (kdim(j) + kblock(j) - 1) / kblock(j);
}

/* Columns of B per packed block: B_BUDGET_BYTES of panels, at least B_MIN_COLS (every block
 * decodes each strip of A again). Measured on a Zen 2 core (512 KiB L2), one thread, GFLOP/s
 * MXFP8 / BF16: 384 KiB and 16 columns 70.6 / 82.1 at 2048x1152x384 and 56.8 / 73.6 at
 * 384x1152x2048; 1 MiB and 128 columns 70.1 / 85.1 and 64.8 / 78.2. */
#define B_MIN_COLS 128
static int64_t nc_cols(const lowp_gemm_job *j) {
    const int64_t K = kdim(j) > 0 ? kdim(j) : 1;
    int64_t nc = (int64_t) (B_BUDGET_BYTES / (4 * (size_t) K)) / NR * NR;
    if (nc < B_MIN_COLS) nc = B_MIN_COLS;
    const int64_t n = j->n1 - j->n0 > 0 ? j->n1 - j->n0 : 1, ncap = (n + NR - 1) / NR * NR;
    return nc < ncap ? nc : ncap;
}

int lowp_cpu_gemm_avx2_supports(const lowp_gemm_job *j) {
    (void) j; /* every pair */
    const uint32_t need = LOWP_CAP_AVX2 | LOWP_CAP_FMA;
    return (lowp_cpu_caps()->flags & need) == need;
}

size_t lowp_cpu_gemm_avx2_ws_floats(const lowp_gemm_job *j) {
    const int64_t K = kdim(j), nc = nc_cols(j), nkb = nblocks(j);
    return (size_t) (nc * K + (MR + 1) * K + (nc + MR) * nkb + nc / NR + MR * NR + 64);
}

/* ---- decoding ---- */

/* Biased exponent of the largest |x| of n floats (255 for Inf/NaN). */
static int max_exp(const float *x, int64_t n) {
    __m256i m = _mm256_setzero_si256();
    const __m256i abs = _mm256_set1_epi32(0x7FFFFFFF);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        m = _mm256_max_epu32(m,
                             _mm256_and_si256(_mm256_loadu_si256((const __m256i *) (x + i)), abs));
    uint32_t v[8];
    _mm256_storeu_si256((__m256i *) v, m);
    uint32_t r = 0;
    for (int l = 0; l < 8; l++) r = v[l] > r ? v[l] : r;
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, 4);
        u &= 0x7FFFFFFFu;
        r = u > r ? u : r;
    }
    return (int) (r >> 23);
}

/* Eight FP8 codes (E5 = 0: E4M3, 1: E5M2) as their exact binary32 values: a normal code's
 * exponent and mantissa fields moved into binary32's and rebiased, a subnormal one's mantissa
 * times the smallest quantum, E4M3's 0x7F / 0xFF NaN and E5M2's all-ones exponent (Inf, NaN)
 * as binary32's. The values of lowp_gemm_decode_lut, without its table. */
static inline __attribute__((always_inline)) __m256 fp8_values(__m128i codes8, const int E5) {
    const int mb = E5 ? 2 : 3, bias = E5 ? 15 : 7;
    const __m256i c = _mm256_cvtepu8_epi32(codes8);
    const __m256i mag = _mm256_and_si256(c, _mm256_set1_epi32(0x7F));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);
    const __m256i norm =
        _mm256_add_epi32(_mm256_slli_epi32(mag, 23 - mb), _mm256_set1_epi32((127 - bias) << 23));
    const __m256i mant = _mm256_and_si256(mag, _mm256_set1_epi32((1 << mb) - 1));
    const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(mant),
                                     _mm256_set1_ps(E5 ? 0x1p-16f : 0x1p-9f)); /* exact */
    const __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(1 << mb), mag);
    __m256i v = _mm256_blendv_epi8(norm, _mm256_castps_si256(sub), is_sub);
    if (E5) { /* exponent 31: Inf (mantissa 0) or NaN */
        const __m256i top = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7B));
        const __m256i special =
            _mm256_or_si256(_mm256_set1_epi32(0x7F800000), _mm256_slli_epi32(mant, 21));
        v = _mm256_blendv_epi8(v, special, top);
    } else { /* 0x7F: NaN */
        const __m256i nan = _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F));
        v = _mm256_blendv_epi8(v, _mm256_set1_epi32(0x7FC00000), nan);
    }
    return _mm256_castsi256_ps(_mm256_or_si256(v, sign));
}

/* out[i] = element (r, k0 + i) of q, i < k1 - k0: BF16 widened and FP8 decoded eight at a time,
 * the rest (binary32, E2M1) as the reference decodes it. */
static void decode(const lowp_qtensor *q, int64_t r, int64_t k0, int64_t k1, const float *lut,
                   float *out) {
    const int64_t n = k1 - k0;
    int64_t i = 0;
    if (q->format == LOWP_FORMAT_E4M3 || q->format == LOWP_FORMAT_E5M2) {
        const uint8_t *p = (const uint8_t *) q->data + (size_t) r * (size_t) q->cols + k0;
        if (q->format == LOWP_FORMAT_E4M3)
            for (; i + 8 <= n; i += 8)
                _mm256_storeu_ps(out + i,
                                 fp8_values(_mm_loadl_epi64((const __m128i *) (p + i)), 0));
        else
            for (; i + 8 <= n; i += 8)
                _mm256_storeu_ps(out + i,
                                 fp8_values(_mm_loadl_epi64((const __m128i *) (p + i)), 1));
        for (; i < n; i++) out[i] = lut[p[i]];
        return;
    }
    if (q->format != LOWP_FORMAT_BF16) {
        lowp_gemm_decode_row(q, r, k0, k1, lut, out);
        return;
    }
    const uint16_t *p = (const uint16_t *) q->data + (size_t) r * (size_t) q->cols + k0;
    for (; i + 8 <= n; i += 8) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *) (p + i)));
        _mm256_storeu_si256((__m256i *) (out + i), _mm256_slli_epi32(w, 16));
    }
    for (; i < n; i++) out[i] = lowp_u2f((uint32_t) p[i] << 16);
}

/* An MX scale code as the factor 2^(code - 127) (exact; 2^-127 is a binary32 denormal), or NaN
 * for 0xFF. */
static float e8m0_factor(uint8_t c) {
    return c == 0xFF ? NAN : c == 0 ? lowp_u2f(0x00400000u) : lowp_u2f((uint32_t) c << 23);
}

typedef struct ctx {
    const lowp_gemm_job *j;
    int64_t K, bk, nkb, nba, nbb;
    int mx, f32_scales; /* MX pair; binary32 scales (TENSOR, ROW, BLOCK128 pairs) */
    int nv;             /* NVFP4: E4M3 block scales, and the tensor decode scales da, db */
    float da, db;
    float lut_a[256], lut_b[256], lut_e4m3[256];
} ctx;

/* The scale factor of A's row r (is_b: of B's row or, b_kn, column r) for the job's K block
 * `blk`. */
static float scale_of(const ctx *x, int is_b, int64_t r, int64_t blk) {
    const lowp_gemm_job *j = x->j;
    const lowp_qtensor *q = is_b ? j->b : j->a;
    const int kn = is_b && j->b_kn;
    const int64_t b = blk + (is_b ? j->b_blk : j->a_blk), nb = is_b ? x->nbb : x->nba;
    if (x->mx) return e8m0_factor(lowp_gemm_scale_e8m0(q, kn, r, b, nb));
    if (x->nv) return x->lut_e4m3[lowp_gemm_scale_nv(q, kn, r, b, nb)];
    return lowp_gemm_scale_f32(q, kn, r, b, nb);
}

/* Pack columns [n0, n0 + w) of the job's B (w <= 16) as [K][16] floats (zeros past w), their
 * scales as sb[blk][16]; returns the panel's largest biased exponent. */
static int pack_panel(const ctx *x, int64_t n0, int w, float *dst, float *sb, float *tmp) {
    const lowp_gemm_job *j = x->j;
    const int64_t K = x->K;
    if (j->b_kn) { /* [K, N]: each k's columns are a stretch of row k */
        for (int64_t k = 0; k < K; k++) {
            float *d = dst + k * NR;
            lowp_gemm_decode_row(j->b, j->k0 + k, n0, n0 + w, x->lut_b, d);
            for (int i = w; i < NR; i++) d[i] = 0.0f;
        }
    } else {
        for (int i = 0; i < NR; i++) {
            if (i < w) {
                decode(j->b, n0 + i, j->k0, j->k1, x->lut_b, tmp);
                for (int64_t k = 0; k < K; k++) dst[k * NR + i] = tmp[k];
            } else {
                for (int64_t k = 0; k < K; k++) dst[k * NR + i] = 0.0f;
            }
        }
    }
    if (x->mx || x->f32_scales || x->nv)
        for (int64_t blk = 0; blk < x->nkb; blk++)
            for (int i = 0; i < NR; i++)
                sb[blk * NR + i] = i < w ? scale_of(x, 1, n0 + i, blk) : 1.0f;
    return j->pair == LOWP_PAIR_PLAIN ? max_exp(dst, K * NR) : 0;
}

/* ---- micro-kernel ---- */

/* s[i][h] = the sum over k in [kb, ke) of a[i][k] b[16 k + 8 h + lane], from +0 in k order:
 * FMA (FUSED) or a rounded multiply and add, the reference's sequence. */
AI void block_sum(const float *const *a, const float *b, int64_t kb, int64_t ke, __m256 s[MR][2],
                  const int FUSED) {
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++) s[i][0] = s[i][1] = _mm256_setzero_ps();
    const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5];
    for (int64_t k = kb; k < ke; k++) {
        const __m256 b0 = _mm256_load_ps(b + NR * k), b1 = _mm256_load_ps(b + NR * k + 8);
        const float *ak[MR] = {a0 + k, a1 + k, a2 + k, a3 + k, a4 + k, a5 + k};
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            const __m256 av = _mm256_broadcast_ss(ak[i]);
            if (FUSED) {
                s[i][0] = _mm256_fmadd_ps(av, b0, s[i][0]);
                s[i][1] = _mm256_fmadd_ps(av, b1, s[i][1]);
            } else {
                s[i][0] = _mm256_add_ps(s[i][0], _mm256_mul_ps(av, b0));
                s[i][1] = _mm256_add_ps(s[i][1], _mm256_mul_ps(av, b1));
            }
        }
    }
}

/* P[6][16] = the tile's sum over all of K in one block (PLAIN, TENSOR, ROW): 0 + s, as the
 * reference adds its one block sum to a zero accumulator. */
AI void tile_one(const float *const *a, const float *b, int64_t K, float *P, const int FUSED) {
    __m256 s[MR][2];
    block_sum(a, b, 0, K, s, FUSED);
    const __m256 z = _mm256_setzero_ps();
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++) {
        _mm256_storeu_ps(P + NR * i, _mm256_add_ps(z, s[i][0]));
        _mm256_storeu_ps(P + NR * i + 8, _mm256_add_ps(z, s[i][1]));
    }
}

static void tile_one_fma(const float *const *a, const float *b, int64_t K, float *P) {
    tile_one(a, b, K, P, 1);
}
static void tile_one_seq(const float *const *a, const float *b, int64_t K, float *P) {
    tile_one(a, b, K, P, 0);
}

/* The scaled pairs (MX, BLOCK128, NVFP4): P = 0, then for each K block P += (s sa[i]) sb[lane]
 * in binary32 (WIDE = 0) or round((s sa[i] sb[lane]) in binary64) (WIDE = 1). sa: [nkb][6],
 * sb: [nkb][16]. NVFP4: a block sum s has at most 12 significant bits and an E4M3 scale 4, so
 * both products are exact and equal the reference's s (sa sb) (NaN scales give NaN in both). */
AI void tile_blocks(const float *const *a, const float *b, int64_t K, int64_t bk, const float *sa,
                    const float *sb, float *P, const int WIDE) {
    for (int i = 0; i < MR * NR; i += 8) _mm256_storeu_ps(P + i, _mm256_setzero_ps());
    for (int64_t kb = 0, blk = 0; kb < K; kb += bk, blk++) {
        __m256 s[MR][2];
        block_sum(a, b, kb, kb + bk < K ? kb + bk : K, s, 1);
        const __m256 b0 = _mm256_loadu_ps(sb + NR * blk), b1 = _mm256_loadu_ps(sb + NR * blk + 8);
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            __m256 t[2];
            if (!WIDE) {
                const __m256 av = _mm256_broadcast_ss(sa + MR * blk + i);
                t[0] = _mm256_mul_ps(_mm256_mul_ps(s[i][0], av), b0);
                t[1] = _mm256_mul_ps(_mm256_mul_ps(s[i][1], av), b1);
            } else {
                const __m256d ad = _mm256_set1_pd((double) sa[MR * blk + i]);
                for (int h = 0; h < 2; h++) {
                    const __m256 bh = h ? b1 : b0;
                    const __m256d lo = _mm256_mul_pd(
                        _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(s[i][h])), ad),
                        _mm256_cvtps_pd(_mm256_castps256_ps128(bh)));
                    const __m256d hi = _mm256_mul_pd(
                        _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(s[i][h], 1)), ad),
                        _mm256_cvtps_pd(_mm256_extractf128_ps(bh, 1)));
                    t[h] = _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
                }
            }
            _mm256_storeu_ps(P + NR * i, _mm256_add_ps(_mm256_loadu_ps(P + NR * i), t[0]));
            _mm256_storeu_ps(P + NR * i + 8, _mm256_add_ps(_mm256_loadu_ps(P + NR * i + 8), t[1]));
        }
    }
}

static void tile_scaled(const float *const *a, const float *b, int64_t K, int64_t bk,
                        const float *sa, const float *sb, float *P) {
    tile_blocks(a, b, K, bk, sa, sb, P, 0);
}
static void tile_scaled_wide(const float *const *a, const float *b, int64_t K, int64_t bk,
                             const float *sa, const float *sb, float *P) {
    tile_blocks(a, b, K, bk, sa, sb, P, 1);
}

/* ---- epilogue ---- */

/* BF16 of x, round to nearest even, NaN -> 0x7FC0 with x's sign (lowp's encoder, NONSAT). */
static uint16_t to_bf16(float x) {
    uint32_t u = lowp_f2u(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t) (((u >> 16) & 0x8000u) | 0x7FC0u);
    return (uint16_t) ((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* Rows [m0, m0 + rows) x columns [n0, n0 + w) of C from P (row stride 16), honouring
 * accumulate and BF16 output; TENSOR and ROW scale first, (P sa[i]) sb[c], and NVFP4
 * (P D_A) D_B, as the reference. */
static void store(const ctx *x, int64_t m0, int rows, int64_t n0, int w, float *P, const float *sa,
                  const float *sb) {
    const lowp_gemm_job *j = x->j;
    if (j->pair == LOWP_PAIR_TENSOR || j->pair == LOWP_PAIR_ROW)
        for (int i = 0; i < rows; i++)
            for (int c = 0; c < w; c++) P[NR * i + c] = P[NR * i + c] * sa[i] * sb[c];
    if (x->nv)
        for (int i = 0; i < rows; i++)
            for (int c = 0; c < w; c++) P[NR * i + c] = P[NR * i + c] * x->da * x->db;
    for (int i = 0; i < rows; i++) {
        const size_t ci = (size_t) (j->c_row_base + m0 + i) * (size_t) j->c->cols + (size_t) n0;
        const float *v = P + NR * i;
        if (j->c->format == LOWP_FORMAT_BF16) {
            uint16_t *c = (uint16_t *) j->c->data + ci;
            for (int n = 0; n < w; n++)
                c[n] = to_bf16(j->accumulate ? v[n] + lowp_u2f((uint32_t) c[n] << 16) : v[n]);
        } else {
            float *c = (float *) j->c->data + ci;
            int n = 0;
            if (j->accumulate) {
                for (; n + 8 <= w; n += 8)
                    _mm256_storeu_ps(c + n,
                                     _mm256_add_ps(_mm256_loadu_ps(c + n), _mm256_loadu_ps(v + n)));
                for (; n < w; n++) c[n] = c[n] + v[n];
            } else {
                for (; n + 8 <= w; n += 8) _mm256_storeu_ps(c + n, _mm256_loadu_ps(v + n));
                for (; n < w; n++) c[n] = v[n];
            }
        }
    }
}

/* ---- the job ---- */

void lowp_cpu_gemm_avx2(const lowp_gemm_job *j) {
    if (j->tag) j->tag->valid = 0; /* the blocked driver's packed B is overwritten */
    ctx x;
    x.j = j;
    x.K = kdim(j);
    x.bk = kblock(j);
    x.nkb = nblocks(j);
    x.mx = j->pair == LOWP_PAIR_MX || j->pair == LOWP_PAIR_MX_B32;
    x.f32_scales = j->pair == LOWP_PAIR_TENSOR || j->pair == LOWP_PAIR_ROW ||
                   j->pair == LOWP_PAIR_B128_W || j->pair == LOWP_PAIR_B128_B128;
    x.nv = j->pair == LOWP_PAIR_NV;
    lowp_gemm_decode_lut(LOWP_FORMAT_E4M3, x.lut_e4m3);
    x.da = x.nv ? lowp_gemm_tensor_dec_nv(j->a) : 1.0f;
    x.db = x.nv ? lowp_gemm_tensor_dec_nv(j->b) : 1.0f;
    lowp_gemm_decode_lut(j->a->format, x.lut_a);
    lowp_gemm_decode_lut(j->b->format, x.lut_b);
    int64_t sr;
    lowp_qtensor_scale_shape(j->a, &sr, &x.nba, NULL);
    lowp_qtensor_scale_shape(j->b, &sr, &x.nbb, NULL);
    const int64_t K = x.K, nkb = x.nkb, nc = nc_cols(j);
    const int one = one_block(j);
    const int a_f32 = j->a->format == LOWP_FORMAT_F32;

    float *bpk = j->ws;                   /* [nc / 16][K][16] */
    float *astrip = bpk + nc * K;         /* [6][K] */
    float *tmp = astrip + MR * K;         /* [K] */
    float *sbv = tmp + K;                 /* [nc / 16][nkb][16] */
    float *sav = sbv + nc * nkb;          /* [nkb][6] */
    int *pexp = (int *) (sav + MR * nkb); /* [nc / 16] */
    float *P = (float *) (pexp + nc / NR);
    P = (float *) (((uintptr_t) P + 31) & ~(uintptr_t) 31);

    for (int64_t nb0 = j->n0; nb0 < j->n1; nb0 += nc) {
        const int64_t ncols = j->n1 - nb0 < nc ? j->n1 - nb0 : nc, npan = (ncols + NR - 1) / NR;
        for (int64_t p = 0; p < npan; p++) {
            const int w = (int) (ncols - NR * p < NR ? ncols - NR * p : NR);
            pexp[p] = pack_panel(&x, nb0 + NR * p, w, bpk + p * K * NR, sbv + p * nkb * NR, tmp);
        }
        for (int64_t m0 = j->m0; m0 < j->m1; m0 += MR) {
            const int rows = (int) (j->m1 - m0 < MR ? j->m1 - m0 : MR);
            const float *ar[MR]; /* rows past the end repeat the last; their results are dropped */
            int ea = 0, safe = 1;
            for (int i = 0; i < rows; i++) {
                if (a_f32) {
                    ar[i] = (const float *) j->a->data + (size_t) (m0 + i) * (size_t) j->a->cols +
                            j->k0;
                } else {
                    decode(j->a, m0 + i, j->k0, j->k1, x.lut_a, astrip + i * K);
                    ar[i] = astrip + i * K;
                }
                if (j->pair == LOWP_PAIR_PLAIN) {
                    const int e = max_exp(ar[i], K);
                    ea = e > ea ? e : ea;
                }
                if (x.mx || x.f32_scales || x.nv)
                    for (int64_t blk = 0; blk < nkb; blk++) {
                        sav[MR * blk + i] = scale_of(&x, 0, m0 + i, blk);
                        if (x.mx) {
                            const int c =
                                lowp_gemm_scale_e8m0(j->a, 0, m0 + i, j->a_blk + blk, x.nba);
                            safe &= c == 0xFF || (c >= MX_SAFE_LO && c <= MX_SAFE_HI);
                        }
                    }
            }
            for (int i = rows; i < MR; i++) {
                ar[i] = ar[rows - 1];
                for (int64_t blk = 0; (x.mx || x.f32_scales || x.nv) && blk < nkb; blk++)
                    sav[MR * blk + i] = 1.0f;
            }
            float sa_end[MR]; /* TENSOR, ROW: the row's scale */
            for (int i = 0; i < MR; i++) sa_end[i] = x.f32_scales && one ? sav[i] : 1.0f;
            for (int64_t p = 0; p < npan; p++) {
                const int w = (int) (ncols - NR * p < NR ? ncols - NR * p : NR);
                const float *panel = bpk + p * K * NR, *sb = sbv + p * nkb * NR;
                if (one) {
                    if (j->pair == LOWP_PAIR_PLAIN && lowp_gemm_fma_needs_seq(ea, pexp[p], K))
                        tile_one_seq(ar, panel, K, P);
                    else
                        tile_one_fma(ar, panel, K, P);
                } else if (!x.mx || safe) {
                    tile_scaled(ar, panel, K, x.bk, sav, sb, P);
                } else {
                    tile_scaled_wide(ar, panel, K, x.bk, sav, sb, P);
                }
                store(&x, m0, rows, nb0 + NR * p, w, P, sa_end, sb);
            }
        }
    }
}
