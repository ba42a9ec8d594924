/* The blocked BF16 GEMM driver (see gemm_blk.h): decodes A strips and packs B panels into
 * BF16 tile layouts, decides per tile whether MX scales can be folded into the elements, runs
 * the kernel's micro-kernel and applies each pair's scales in binary32 (docs/numerics.md section
 * 6). Compiled with AVX-512 F/BW/VL/DQ. */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>

#include "gemm_blk.h"
#include "transpose_avx512.h"

/* MX scales fold into the elements while every block exponent of a strip (panel) lies within
 * FOLD_SPAN of the strip's centre r. Then a folded FP8 value is a * 2^d with |d| <= 37: the
 * smallest nonzero product (E5M2 subnormals, 2^-16 each) is >= 2^(-32 - 74) = 2^-106 and every
 * partial sum is a multiple of it, so nothing reaches the binary32 denormals that AMX and
 * VDPBF16PS flush; the largest (57344^2 * 2^74 per product) cannot overflow for K < 2^21. */
#define FOLD_SPAN  37
#define FOLD_MAX_K ((int64_t) 1 << 21)

/* Plain BF16 tiles run on the IEEE micro-kernel (the reference's operation sequence) when
 * the fast kernels could differ in more than rounding: a denormal input (read as zero), the
 * largest products below 2^-100 (denormal products flushed), or products and sums that could
 * overflow (with Inf - Inf = NaN depending on order). maxe is the biased exponent of the
 * largest |x|, so every product is below 2^(maxe_a + maxe_b - 252). */
#define TINY_EXP_SUM 152

typedef struct dec_table {
    __m512i t0, t1, t2, t3; /* FP8: |code| 0..127 -> BF16 bits; E2M1: t0 = 16 signed codes */
} dec_table;

typedef struct tile_facts {
    int32_t folded; /* MX: the scales are folded into the elements (relative to r) */
    int32_t r;      /* MX: the exponent left to apply (2^r) when folded */
    int32_t hi;     /* MX: the largest block exponent (code - 127) of a live block, or -127 */
    int32_t exact;  /* plain BF16: holds a denormal: needs the IEEE micro-kernel */
    int32_t maxe;   /* plain BF16: largest biased exponent (of |x|, 0..255) */
} tile_facts;

static int plain_needs_exact(const tile_facts *s, const tile_facts *p, int64_t K) {
    int lg = 0;
    while (((int64_t) 1 << lg) < K) lg++;
    const int e = s->maxe + p->maxe;
    return s->exact || p->exact || e <= TINY_EXP_SUM || e - 252 + lg >= 127;
}

typedef struct blk_ctx {
    const lowp_gemm_job *j;
    const lowp_gemm_blk_kernel *kern;
    int64_t K, nkt, nc;
    int64_t nb0;      /* first column of the current B block */
    int64_t nba, nbb; /* scale columns of a and b */
    uint16_t *bblock, *astrip, *tmp;
    float *P, *acc;
    tile_facts *pfacts;
    int64_t nb128;        /* 128-blocks of the job's K (BLOCK128 pairs) */
    float *sa128, *sb128; /* scale_invs: strip [blk][32 rows], block [panel][blk][32 cols] */
    dec_table ta, tb;
    /* NVFP4: nvlut[c][e] = BF16 of E2M1 code e times E4M3 scale code c (exact), and the
     * tensor decode scales of a and b */
    int nv;
    float nv_da, nv_db;
    uint16_t nvlut[256][16]; /* last: lowp_gemm_blk_run clears the context up to it */
} blk_ctx;

static int64_t rup32(int64_t x) {
    return (x + 31) / 32 * 32;
}

static int64_t nc_cols(const lowp_gemm_job *j, const lowp_gemm_blk_kernel *k) {
    const int64_t kp = rup32(j->k1 - j->k0 > 0 ? j->k1 - j->k0 : 1);
    int64_t nc = (int64_t) (k->b_budget_bytes / (2 * (size_t) kp)) / 32 * 32;
    const int64_t lo = k->min_cols > 32 ? k->min_cols / 32 * 32 : 32;
    if (nc < lo) nc = lo;
    const int64_t ncap = rup32(j->n1 - j->n0 > 0 ? j->n1 - j->n0 : 1);
    if ((size_t) ncap * 2 * (size_t) kp <= k->whole_n_bytes) return ncap;
    return nc < ncap ? nc : ncap;
}

size_t lowp_gemm_blk_ws_floats(const lowp_gemm_job *j, const lowp_gemm_blk_kernel *k) {
    const int64_t K = j->k1 - j->k0 > 0 ? j->k1 - j->k0 : 0, kp = rup32(K), nc = nc_cols(j, k);
    return (size_t) (nc * kp / 2 + 16 * kp + 3 * 1024 + nc / 8 + 16 + (nc + 32) * (kp / 128 + 1));
}

int lowp_gemm_blk_supports(const lowp_gemm_job *j) {
    /* NVFP4 B given [K, N]: panels start on a 16-column tile (every job of lowp_gemm). */
    if (j->pair == LOWP_PAIR_NV && j->b_kn && (j->n0 & 15) != 0) return 0;
    return !(j->pair == LOWP_PAIR_PLAIN && j->a->format == LOWP_FORMAT_F32);
}

/* ---- decoding ---- */

static uint16_t bf16_bits(float x) {
    if (x != x) return 0x7FC0;
    return (uint16_t) (lowp_f2u(x) >> 16); /* exact: every FP8/FP4 value is a BF16 value */
}

static void build_table(lowp_format f, dec_table *t) {
    uint16_t tab[128];
    memset(tab, 0, sizeof tab);
    const lowp_format_traits *tr;
    if (f == LOWP_FORMAT_E4M3 || f == LOWP_FORMAT_E5M2) {
        lowp_format_get(f, &tr);
        for (uint32_t c = 0; c < 128; c++) tab[c] = bf16_bits(tr->decode(c));
    } else if (f == LOWP_FORMAT_E2M1) {
        lowp_format_get(f, &tr);
        for (uint32_t c = 0; c < 16; c++) tab[c] = bf16_bits(tr->decode(c));
    }
    t->t0 = _mm512_loadu_si512(tab);
    t->t1 = _mm512_loadu_si512(tab + 32);
    t->t2 = _mm512_loadu_si512(tab + 64);
    t->t3 = _mm512_loadu_si512(tab + 96);
}

static __mmask32 len_mask32(int len) {
    return len >= 32 ? 0xFFFFFFFFu : (1u << len) - 1u;
}
static __mmask16 len_mask16(int len) {
    return (__mmask16) (len >= 16 ? 0xFFFFu : (1u << len) - 1u);
}

/* len (1 <= len <= 32) consecutive BF16, E4M3 or E5M2 elements at p as 32 BF16 (zeros past
 * len). */
static inline __m512i dec_run(lowp_format f, const dec_table *t, const void *p, int len) {
    if (f == LOWP_FORMAT_BF16) return _mm512_maskz_loadu_epi16(len_mask32(len), p);
    /* 7-bit magnitude through the table, sign from bit 7 */
    __m512i c = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(len_mask32(len), p));
    __m512i lo = _mm512_permutex2var_epi16(t->t0, c, t->t1);
    __m512i hi = _mm512_permutex2var_epi16(t->t2, c, t->t3);
    __m512i v = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(c, _mm512_set1_epi16(0x40)), lo, hi);
    return _mm512_ternarylogic_epi32(v, _mm512_slli_epi16(c, 8), _mm512_set1_epi16((short) 0x8000),
                                     0xF8);
}

/* v with 2^d folded into every nonzero finite value, d per 16-bit lane as d * 128 (the
 * exponent field's unit; |d| <= FOLD_SPAN). Adding it to the exponent field is exact, since
 * the result stays normal. */
static inline __m512i fold_add(__m512i v, __m512i d128) {
    __m512i x = _mm512_and_si512(v, _mm512_set1_epi16(0x7FFF));
    __mmask32 fin = _mm512_cmplt_epu16_mask(_mm512_sub_epi16(x, _mm512_set1_epi16(1)),
                                            _mm512_set1_epi16(0x7F7F));
    return _mm512_mask_add_epi16(v, fin, v, d128);
}

/* Columns [k, k + len) (1 <= len <= 32) of row r of q as 32 BF16 (zeros past len), with the
 * power of two 2^d folded into every nonzero finite value (|d| <= FOLD_SPAN). */
static inline __m512i dec_block(const lowp_qtensor *q, const dec_table *t, int64_t r, int64_t k,
                                int len, int d, const __m512i *nvt) {
    __m512i v;
    switch (q->format) {
    case LOWP_FORMAT_BF16: {
        const uint16_t *p = (const uint16_t *) q->data + (size_t) r * (size_t) q->cols + k;
        return dec_run(LOWP_FORMAT_BF16, t, p, len);
    }
    case LOWP_FORMAT_E2M1: {
        const uint8_t *p = (const uint8_t *) q->data + (size_t) r * (size_t) ((q->cols + 1) / 2);
        __m512i idx;
        if ((k & 1) == 0) {
            /* Byte i holds elements 2i (low nibble) and 2i+1: dword i -> words (lo, hi). */
            __m128i b8 = _mm_maskz_loadu_epi8(len_mask16((len + 1) / 2), p + (k >> 1));
            __m512i w = _mm512_cvtepu8_epi32(b8);
            idx = _mm512_ternarylogic_epi32(w, _mm512_slli_epi32(w, 12),
                                            _mm512_set1_epi32(0x000F000F), 0xA8);
        } else {
            /* Odd start: pair i is (high nibble of byte s+i, low nibble of byte s+i+1). */
            const uint8_t *s = p + (k >> 1);
            __m512i w0 = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(len_mask16((len + 1) / 2), s));
            __m512i w1 = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(len_mask16(len / 2), s + 1));
            idx = _mm512_ternarylogic_epi32(_mm512_srli_epi32(w0, 4), _mm512_slli_epi32(w1, 16),
                                            _mm512_set1_epi32(0x000F0000), 0xF8);
        }
        /* Past len: a row's padding nibble may be anything. NVFP4: lanes 16-31 read the
         * second block's half of the table. */
        if (nvt) idx = _mm512_or_si512(idx, _mm512_maskz_set1_epi32(0xFF00, 0x00100010));
        v = _mm512_maskz_permutexvar_epi16(len_mask32(len), idx, nvt ? *nvt : t->t0);
        break;
    }
    default: { /* E4M3, E5M2 */
        const uint8_t *p = (const uint8_t *) q->data + (size_t) r * (size_t) q->cols + k;
        v = dec_run(q->format, t, p, len);
        break;
    }
    }
    return d != 0 ? fold_add(v, _mm512_set1_epi16((short) (d * 128))) : v;
}

/* ---- MX scale facts ---- */

static int mx_is_b32(const lowp_qtensor *q) {
    return q->scaling == LOWP_SCALING_BLOCK32X32;
}

static const uint8_t *mx_codes(const lowp_qtensor *q, int64_t r, int64_t blk0, int64_t nbq) {
    const int64_t srow = mx_is_b32(q) ? r / 32 : r;
    return (const uint8_t *) q->scales + (size_t) (srow * nbq + blk0);
}

/* The E8M0 code of row r's K block blk (kn: q is a BLOCK32X32 copy given [K, N] and r is its
 * column, so the tile is found with the indices' roles swapped). */
static int mx_code(const lowp_qtensor *q, int kn, int64_t r, int64_t blk, int64_t nbq) {
    if (kn) return ((const uint8_t *) q->scales)[(size_t) (blk * nbq + r / 32)];
    return mx_codes(q, r, blk, nbq)[0];
}

/* Whether columns [k, k + len) of row r hold only zeros (codes of +-0); kn as in mx_code. */
static int block_all_zero(const lowp_qtensor *q, int kn, int64_t r, int64_t k, int64_t len) {
    for (int64_t i = k; i < k + len; i++) {
        uint8_t c;
        if (kn) {
            c = ((const uint8_t *) q->data)[(size_t) i * (size_t) q->cols + (size_t) r] & 0x7F;
        } else if (q->format == LOWP_FORMAT_E2M1) {
            const uint8_t *p =
                (const uint8_t *) q->data + (size_t) r * (size_t) ((q->cols + 1) / 2);
            c = (uint8_t) ((p[i >> 1] >> (4 * (i & 1))) & 0x7);
        } else {
            c = ((const uint8_t *) q->data)[(size_t) r * (size_t) q->cols + (size_t) i] & 0x7F;
        }
        if (c) return 0;
    }
    return 1;
}

/* Fold decision for rows [r0, r1) of MX operand q over the job's K blocks (kn as in mx_code). */
static void mx_facts(const blk_ctx *x, const lowp_qtensor *q, int kn, int64_t r0, int64_t r1,
                     int64_t blk0, int64_t nbq, tile_facts *f) {
    const lowp_gemm_job *j = x->j;
    int lo = 255, hi = -1, nan = 0;
    if (!kn) {
        /* A row's codes are contiguous: 64 at a time, the smallest and largest of the codes
         * that are neither 0 nor 0xFF kept in vectors (255 and 0 where there are none). The
         * scalar scan this replaces was 2-3% of an all_mxfp8 update on an AMX machine. */
        __m512i vlo = _mm512_set1_epi8((char) 0xFF), vhi = _mm512_setzero_si512();
        const __m512i ff = _mm512_set1_epi8((char) 0xFF);
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *c = mx_codes(q, r, blk0, nbq);
            for (int64_t b0 = 0; b0 < x->nkt; b0 += 64) {
                const int64_t n = x->nkt - b0 < 64 ? x->nkt - b0 : 64;
                const __mmask64 in = n == 64 ? ~(__mmask64) 0 : ((__mmask64) 1 << n) - 1;
                const __m512i v = _mm512_maskz_loadu_epi8(in, c + b0);
                const __mmask64 isff = _mm512_mask_cmpeq_epi8_mask(in, v, ff);
                __mmask64 zero = _mm512_mask_cmpeq_epi8_mask(in, v, _mm512_setzero_si512());
                const __mmask64 ok = in & ~isff & ~zero;
                nan |= isff != 0;
                vlo = _mm512_mask_min_epu8(vlo, ok, vlo, v);
                vhi = _mm512_mask_max_epu8(vhi, ok, vhi, v);
                /* Scale 2^-127 of an all-zero block (amax 0) does not matter. */
                for (; zero && lo != 0; zero &= zero - 1) {
                    const int64_t k = j->k0 + 32 * (b0 + __builtin_ctzll(zero)),
                                  len = j->k1 - k < 32 ? j->k1 - k : 32;
                    if (!block_all_zero(q, 0, r, k, len)) lo = 0;
                }
            }
        }
        uint8_t l8[64], h8[64];
        _mm512_storeu_si512(l8, vlo);
        _mm512_storeu_si512(h8, vhi);
        for (int i = 0; i < 64; i++) {
            if (l8[i] < lo) lo = l8[i];
            if (h8[i] != 0 && h8[i] > hi) hi = h8[i];
        }
    } else {
        for (int64_t r = r0; r < r1; r++) {
            for (int64_t b = 0; b < x->nkt; b++) {
                int v = mx_code(q, kn, r, blk0 + b, nbq);
                if (v == 0xFF) {
                    nan = 1;
                } else if (v == 0) {
                    int64_t k = j->k0 + 32 * b, len = j->k1 - k < 32 ? j->k1 - k : 32;
                    if (!block_all_zero(q, kn, r, k, len)) lo = 0;
                } else {
                    if (v < lo) lo = v;
                    if (v > hi) hi = v;
                }
            }
        }
    }
    if (lo == 0 && hi < 0) hi = 0;
    memset(f, 0, sizeof *f);
    if (nan || (hi >= 0 && hi - lo > 2 * FOLD_SPAN) || x->K >= FOLD_MAX_K) return;
    f->folded = 1;
    f->r = hi < 0 ? 0 : (lo + hi) / 2 - 127;
    f->hi = hi < 0 ? -127 : hi - 127;
}

/* Whether an MX tile may run folded: both sides folded, and no value of the reference's
 * sequence can overflow. Folded, the tile sums every product before the final 2^r; the
 * reference multiplies each 32-block sum by its own power of two and adds the blocks in order,
 * so a block value or a partial sum at 2^128 gives Inf there (and Inf - Inf = NaN) where the
 * folded sum can stay finite. A block sum is below 2^37 (32 E5M2 products) and there are at
 * most 2^lg blocks, so below the bound nothing overflows on either side. */
static int mx_fold_pair(const tile_facts *s, const tile_facts *p, int64_t K) {
    int lg = 0;
    while (((int64_t) 1 << lg) < (K + 31) / 32) lg++;
    return s->folded && p->folded && s->hi + p->hi + 37 + lg < 127;
}

/* The shift folded into a block of E8M0 code c (0 for all-zero blocks outside the window). */
static inline int fold_d(int c, const tile_facts *f) {
    int d = c - 127 - f->r;
    return d < -FOLD_SPAN || d > FOLD_SPAN ? 0 : d;
}

/* The shift folded into row r's block b (kn as in mx_code). */
static int fold_shift(const lowp_qtensor *q, int kn, int64_t r, int64_t b, int64_t blk0,
                      int64_t nbq, const tile_facts *f) {
    if (!f->folded) return 0;
    return fold_d(mx_code(q, kn, r, blk0 + b, nbq), f);
}

/* ---- NVFP4: the E4M3 block scales folded into the elements ---- */

/* E2M1 times E4M3 is exact in BF16: at most 2 + 4 significant bits, within [2^-10, 2688] (the
 * normal range, which AMX and VDPBF16PS read as IEEE does). Products of two folded elements are
 * then exact in binary32 (within [2^-20, 2^23]) and every partial sum is a multiple of 2^-20,
 * so nothing reaches the denormals, and nothing overflows below K = 2^100: the only change
 * from the reference is the summation order (docs/numerics.md section 6). */

/* The E4M3 code of row r's K block blk of NVFP4 operand q (kn: q is an NV16X16 copy given
 * [K, N] and r is its column). */
static int nv_code(const lowp_qtensor *q, int kn, int64_t r, int64_t blk, int64_t nbq) {
    const uint8_t *s = (const uint8_t *) q->scales;
    if (q->scaling == LOWP_SCALING_NV16X16)
        return kn ? s[blk * nbq + r / 16] : s[(r / 16) * nbq + blk];
    return s[r * nbq + blk]; /* NV16 */
}

/* The 32-entry table of a run whose lanes 0-15 have scale code c0 and lanes 16-31 code c1. */
static inline __m512i nv_table(const blk_ctx *x, int c0, int c1) {
    const __m256i lo = _mm256_loadu_si256((const __m256i *) x->nvlut[c0]);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo),
                              _mm256_loadu_si256((const __m256i *) x->nvlut[c1]), 1);
}

/* The table of row r's run kt (the job's K blocks 2 kt and 2 kt + 1; a run of 16 or fewer
 * elements has one). */
static inline __m512i nv_run_table(const blk_ctx *x, const lowp_qtensor *q, int64_t blk0,
                                   int64_t nbq, int64_t r, int64_t kt, int len) {
    const int c0 = nv_code(q, 0, r, blk0 + 2 * kt, nbq);
    return nv_table(x, c0, len > 16 ? nv_code(q, 0, r, blk0 + 2 * kt + 1, nbq) : c0);
}

static float nv_tensor_dec(const lowp_qtensor *q) {
    size_t off;
    float d;
    lowp_qtensor_tensor_scale_offset(q, &off);
    memcpy(&d, (const uint8_t *) q->scales + off, sizeof d);
    return d;
}

/* The folded values of every (scale code, element code), and the tensor decode scales. A NaN
 * scale (0x7F, 0xFF) makes every element of its block NaN, zeros included, as the reference's
 * block product is NaN. */
static void nv_setup(blk_ctx *x) {
    const lowp_format_traits *e2, *e4;
    lowp_format_get(LOWP_FORMAT_E2M1, &e2);
    lowp_format_get(LOWP_FORMAT_E4M3, &e4);
    float v[16];
    for (uint32_t e = 0; e < 16; e++) v[e] = e2->decode(e);
    const __m512 ve = _mm512_loadu_ps(v);
    for (uint32_t c = 0; c < 256; c++) {
        float sc = e4->decode(c);
        if (sc != sc) sc = NAN; /* quiet: its upper half is a BF16 NaN */
        const __m512 p = _mm512_mul_ps(ve, _mm512_set1_ps(sc));
        _mm256_storeu_si256((__m256i *) x->nvlut[c],
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(p), 16)));
    }
    x->nv_da = nv_tensor_dec(x->j->a);
    x->nv_db = nv_tensor_dec(x->j->b);
}

/* Columns [n0, n0 + w) (n0 a multiple of 16, w <= 32) of stored row k of an NV16X16 b given
 * [K, N], whose tile row in the scales is blk, as 32 folded BF16 (zeros past w). */
static inline __m512i nv_dec_kn(const blk_ctx *x, const lowp_qtensor *q, int64_t k, int64_t blk,
                                int64_t n0, int w) {
    const uint8_t *s = (const uint8_t *) q->scales + (size_t) (blk * x->nbb + n0 / 16);
    const __m512i t = nv_table(x, s[0], w > 16 ? s[1] : s[0]);
    const uint8_t *p =
        (const uint8_t *) q->data + (size_t) k * (size_t) ((q->cols + 1) / 2) + (size_t) (n0 / 2);
    const __m512i b = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(len_mask16((w + 1) / 2), p));
    __m512i idx =
        _mm512_ternarylogic_epi32(b, _mm512_slli_epi32(b, 12), _mm512_set1_epi32(0x000F000F), 0xA8);
    idx = _mm512_or_si512(idx, _mm512_maskz_set1_epi32(0xFF00, 0x00100010));
    return _mm512_maskz_permutexvar_epi16(len_mask32(w), idx, t);
}

/* ---- packing ---- */

/* The binary32 scale_inv of row r's K block blk (kn as in mx_code). */
static float fp32_scale(const lowp_qtensor *q, int kn, int64_t r, int64_t blk, int64_t nb) {
    const float *s = (const float *) q->scales;
    switch (q->scaling) {
    case LOWP_SCALING_TENSOR: return s[0];
    case LOWP_SCALING_ROW: return s[r];
    case LOWP_SCALING_BLOCK128X128: return kn ? s[blk * nb + r / 128] : s[(r / 128) * nb + blk];
    default: return s[r * nb + blk]; /* BLOCK128 */
    }
}

static void plain_stats(__m512i v, __mmask32 *denorm, __m512i *maxmag) {
    __m512i x = _mm512_and_si512(v, _mm512_set1_epi16(0x7FFF));
    *denorm |=
        _mm512_cmplt_epu16_mask(_mm512_sub_epi16(x, _mm512_set1_epi16(1)), _mm512_set1_epi16(0x7F));
    *maxmag = _mm512_max_epu16(*maxmag, x);
}

static int max_exp(__m512i maxmag) {
    uint16_t m[32];
    _mm512_storeu_si512(m, maxmag);
    int e = 0;
    for (int i = 0; i < 32; i++)
        if ((m[i] >> 7) > e) e = m[i] >> 7;
    return e;
}

/* pack_panel's codes for b given [K, N] (b_kn): rows k and k + 1 of the stored copy, 32
 * columns each, interleave into the VNNI pairs directly (unpacks, then one permute per half of
 * the panel to put the 16 columns of each half in order): no transpose. */
static void pack_panel_kn(blk_ctx *x, int64_t n0, int w, uint16_t *dst, const tile_facts *f, int mx,
                          __mmask32 *denorm, __m512i *maxmag) {
    const lowp_gemm_job *j = x->j;
    const lowp_qtensor *b = j->b;
    const size_t es = b->format == LOWP_FORMAT_BF16 ? 2 : 1;
    const __m512i h0 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    const __m512i h1 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    for (int64_t kt = 0; kt < x->nkt; kt++) {
        /* the fold shift of each column (its 32x32 tile's code), as exponent-field units */
        int16_t d[32] = {0};
        for (int i = 0; i < w && mx && f->folded; i++)
            d[i] = (int16_t) (128 * fold_shift(b, 1, n0 + i, kt, j->b_blk, x->nbb, f));
        const __m512i d128 = _mm512_loadu_si512(d);
        uint16_t *o = dst + kt * LOWP_BLK_TILE_U16;
        for (int p = 0; p < 16; p++) {
            __m512i r[2];
            for (int h = 0; h < 2; h++) {
                const int64_t k = j->k0 + 32 * kt + 2 * p + h;
                r[h] = _mm512_setzero_si512();
                if (k >= j->k1) continue;
                const char *src =
                    (const char *) b->data + es * ((size_t) k * (size_t) b->cols + (size_t) n0);
                if (x->nv) {
                    r[h] = nv_dec_kn(x, b, k, j->b_blk + (k - j->k0) / 16, n0, w);
                    continue;
                }
                r[h] = dec_run(b->format, &x->tb, src, w);
                if (mx)
                    r[h] = fold_add(r[h], d128);
                else
                    plain_stats(r[h], denorm, maxmag);
            }
            const __m512i lo = _mm512_unpacklo_epi16(r[0], r[1]);
            const __m512i hi = _mm512_unpackhi_epi16(r[0], r[1]);
            _mm512_store_si512(o + 32 * p, _mm512_permutex2var_epi64(lo, h0, hi));
            _mm512_store_si512(o + 512 + 32 * p, _mm512_permutex2var_epi64(lo, h1, hi));
        }
    }
}

/* Pack rows [n0, n0 + w) of b (w <= 32; b_kn: columns) into a panel at dst. */
static void pack_panel(blk_ctx *x, int64_t n0, int w, uint16_t *dst, tile_facts *f) {
    const lowp_gemm_job *j = x->j;
    const lowp_qtensor *b = j->b;
    const int mx = j->pair == LOWP_PAIR_MX || j->pair == LOWP_PAIR_MX_B32;
    memset(f, 0, sizeof *f);
    if (mx) mx_facts(x, b, j->b_kn, n0, n0 + w, j->b_blk, x->nbb, f);
    __mmask32 denorm = 0;
    __m512i maxmag = _mm512_setzero_si512();
    if (j->b_kn) pack_panel_kn(x, n0, w, dst, f, mx, &denorm, &maxmag);
    /* Each column's codes of the job's K blocks, found once (kn: not used). */
    const uint8_t *bc[32];
    for (int i = 0; i < w && mx && !j->b_kn; i++) bc[i] = mx_codes(b, n0 + i, j->b_blk, x->nbb);
    for (int64_t kt = 0; kt < x->nkt && !j->b_kn; kt++) {
        const int64_t k = j->k0 + 32 * kt;
        const int len = (int) (j->k1 - k < 32 ? j->k1 - k : 32);
        for (int i = 0; i < 32; i++) {
            __m512i v = _mm512_setzero_si512();
            if (i < w) {
                int d = mx && f->folded ? fold_d(bc[i][kt], f) : 0;
                if (x->nv) {
                    const __m512i t = nv_run_table(x, b, j->b_blk, x->nbb, n0 + i, kt, len);
                    v = dec_block(b, &x->tb, n0 + i, k, len, 0, &t);
                } else {
                    v = dec_block(b, &x->tb, n0 + i, k, len, d, NULL);
                }
                if (!mx && !x->nv) plain_stats(v, &denorm, &maxmag);
            }
            _mm512_store_si512(x->tmp + 32 * i, v);
        }
        uint16_t *o = dst + kt * LOWP_BLK_TILE_U16;
        lowp_transpose16x16_u32((const uint32_t *) x->tmp, 16, (uint32_t *) o, 16);
        lowp_transpose16x16_u32((const uint32_t *) (x->tmp + 16 * 32), 16, (uint32_t *) (o + 512),
                                16);
    }
    if (!mx) {
        f->exact = denorm != 0;
        f->maxe = max_exp(maxmag);
    }
    if (j->pair == LOWP_PAIR_B128_W || j->pair == LOWP_PAIR_B128_B128) {
        float *sb = x->sb128 + (n0 - x->nb0) / 32 * 32 * x->nb128;
        for (int64_t blk = 0; blk < x->nb128; blk++)
            for (int i = 0; i < 32; i++)
                sb[32 * blk + i] =
                    i < w ? fp32_scale(b, j->b_kn, n0 + i, j->b_blk + blk, x->nbb) : 0.0f;
    }
}

/* Decode rows [m0, m0 + rows) of a into the strip (rows past `rows` are zero). */
static void decode_strip(blk_ctx *x, int64_t m0, int rows, tile_facts *f) {
    const lowp_gemm_job *j = x->j;
    const lowp_qtensor *a = j->a;
    const int mx = j->pair == LOWP_PAIR_MX || j->pair == LOWP_PAIR_MX_B32;
    memset(f, 0, sizeof *f);
    if (mx) mx_facts(x, a, 0, m0, m0 + rows, j->a_blk, x->nba, f);
    __mmask32 denorm = 0;
    __m512i maxmag = _mm512_setzero_si512();
    const uint8_t *ac[32]; /* each row's codes of the job's K blocks, found once */
    for (int i = 0; i < rows && mx; i++) ac[i] = mx_codes(a, m0 + i, j->a_blk, x->nba);
    for (int64_t kt = 0; kt < x->nkt; kt++) {
        const int64_t k = j->k0 + 32 * kt;
        const int len = (int) (j->k1 - k < 32 ? j->k1 - k : 32);
        uint16_t *o = x->astrip + kt * LOWP_BLK_TILE_U16;
        for (int i = 0; i < rows; i++) {
            int d = mx && f->folded ? fold_d(ac[i][kt], f) : 0;
            __m512i v;
            if (x->nv) {
                const __m512i t = nv_run_table(x, a, j->a_blk, x->nba, m0 + i, kt, len);
                v = dec_block(a, &x->ta, m0 + i, k, len, 0, &t);
            } else {
                v = dec_block(a, &x->ta, m0 + i, k, len, d, NULL);
            }
            if (!mx && !x->nv) plain_stats(v, &denorm, &maxmag);
            _mm512_store_si512(o + 32 * i, v);
        }
        for (int i = rows; i < 32; i++) _mm512_store_si512(o + 32 * i, _mm512_setzero_si512());
    }
    if (j->pair == LOWP_PAIR_B128_W || j->pair == LOWP_PAIR_B128_B128)
        for (int64_t blk = 0; blk < x->nb128; blk++)
            for (int i = 0; i < 32; i++)
                x->sa128[32 * blk + i] =
                    i < rows ? fp32_scale(a, 0, m0 + i, j->a_blk + blk, x->nba) : 0.0f;
    if (!mx) {
        f->exact = denorm != 0;
        f->maxe = max_exp(maxmag);
    }
}

/* ---- epilogues ---- */

/* lowp_gemm_store_tile, with v scaled by 2^e on the way (scaled) as the folded MX tiles want:
 * the same scalef the tile applied in place before, one pass over the tile fewer. */
static inline __attribute__((always_inline)) void store_tile(const lowp_gemm_job *j, int64_t m0,
                                                             int64_t m1, int64_t n0, int w,
                                                             const float *v, int scaled, __m512 e) {
    const int64_t ldc = j->c->cols;
    const int bf16 = j->c->format == LOWP_FORMAT_BF16;
    /* A C much larger than the caches is written with streaming stores (no read for
     * ownership; the job ends with SFENCE), when whole aligned 64-byte lines are written. */
    const size_t cbytes = (size_t) (j->c->rows * ldc) * (bf16 ? 2 : 4);
    const int nt = !j->accumulate && !bf16 && w == 32 && cbytes >= LOWP_GEMM_NT_BYTES &&
                   ((uintptr_t) j->c->data & 63) == 0 && (ldc & 15) == 0 && (n0 & 15) == 0;
    if (nt) {
        for (int64_t m = m0; m < m1; m++) {
            float *c = (float *) j->c->data + (size_t) (j->c_row_base + m) * (size_t) ldc + n0;
            __m512 lo = _mm512_loadu_ps(v + (m - m0) * 32),
                   hi = _mm512_loadu_ps(v + (m - m0) * 32 + 16);
            if (scaled) lo = _mm512_scalef_ps(lo, e), hi = _mm512_scalef_ps(hi, e);
            _mm512_stream_ps(c, lo);
            _mm512_stream_ps(c + 16, hi);
        }
        return;
    }
    for (int64_t m = m0; m < m1; m++) {
        const float *src = v + (m - m0) * 32;
        const size_t row = (size_t) (j->c_row_base + m) * (size_t) ldc + (size_t) n0;
        for (int h = 0; h < 2 && 16 * h < w; h++) {
            const __mmask16 mk = len_mask16(w - 16 * h);
            __m512 s = _mm512_loadu_ps(src + 16 * h);
            if (scaled) s = _mm512_scalef_ps(s, e);
            if (!bf16) {
                float *c = (float *) j->c->data + row + 16 * h;
                if (j->accumulate) s = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, c), s);
                /* Masked stores are slow on some cores: only for the last columns. */
                if (mk == 0xFFFF)
                    _mm512_storeu_ps(c, s);
                else
                    _mm512_mask_storeu_ps(c, mk, s);
                continue;
            }
            uint16_t *c = (uint16_t *) j->c->data + row + 16 * h;
            if (j->accumulate) {
                __m512i old = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, c));
                s = _mm512_add_ps(s, _mm512_castsi512_ps(_mm512_slli_epi32(old, 16)));
            }
            /* lowp's BF16 encoder, NONSAT: RNE on the bits, NaN -> 0x7FC0 with its sign. */
            __m512i u = _mm512_castps_si512(s);
            __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
            __m512i odd = _mm512_and_si512(_mm512_srli_epi32(a, 16), _mm512_set1_epi32(1));
            __m512i r = _mm512_srli_epi32(
                _mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32(0x7FFF)), odd), 16);
            __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000));
            r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
            r = _mm512_or_si512(r, _mm512_srli_epi32(_mm512_andnot_si512(a, u), 16));
            if (mk == 0xFFFF)
                _mm256_storeu_si256((__m256i *) c, _mm512_cvtepi32_epi16(r));
            else
                _mm256_mask_storeu_epi16(c, mk, _mm512_cvtepi32_epi16(r));
        }
    }
}

void lowp_gemm_store_tile(const lowp_gemm_job *j, int64_t m0, int64_t m1, int64_t n0, int w,
                          const float *v) {
    store_tile(j, m0, m1, n0, w, v, 0, _mm512_setzero_ps());
}

/* Column scales of the panel at n0 (w columns) for K block `blk`, binary32 kinds. */
static void col_scales(const blk_ctx *x, int64_t n0, int w, int64_t blk, float *sb) {
    for (int i = 0; i < 32; i++)
        sb[i] = i < w ? fp32_scale(x->j->b, x->j->b_kn, n0 + i, x->j->b_blk + blk, x->nbb) : 0.0f;
}

/* acc rows [0, rows) += (P * sa[r]) * sb, the reference's order (first block: acc = ...). */
static void acc_b128(float *acc, const float *P, int rows, const float *sa, const float *sb,
                     int first) {
    const __m512 sb0 = _mm512_loadu_ps(sb), sb1 = _mm512_loadu_ps(sb + 16);
    for (int r = 0; r < rows; r++) {
        const __m512 s = _mm512_set1_ps(sa[r]);
        float *o = acc + 32 * r;
        const float *p = P + 32 * r;
        __m512 y0 = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(p), s), sb0);
        __m512 y1 = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(p + 16), s), sb1);
        if (!first) {
            y0 = _mm512_add_ps(_mm512_loadu_ps(o), y0);
            y1 = _mm512_add_ps(_mm512_loadu_ps(o + 16), y1);
        }
        _mm512_storeu_ps(o, y0);
        _mm512_storeu_ps(o + 16, y1);
    }
}

/* acc rows += P * 2^(xa[r] + xb[c]), NaN where either block scale is 0xFF. */
static void acc_mx(float *acc, const float *P, int rows, const float *xa, const uint8_t *nan_a,
                   const float *xb, uint32_t nan_b) {
    const __m512 xb0 = _mm512_loadu_ps(xb), xb1 = _mm512_loadu_ps(xb + 16);
    const __m512 qnan = _mm512_set1_ps(NAN);
    for (int r = 0; r < rows; r++) {
        float *o = acc + 32 * r;
        const float *p = P + 32 * r;
        if (nan_a[r]) {
            _mm512_storeu_ps(o, qnan);
            _mm512_storeu_ps(o + 16, qnan);
            continue;
        }
        const __m512 e = _mm512_set1_ps(xa[r]);
        __m512 y0 = _mm512_scalef_ps(_mm512_loadu_ps(p), _mm512_add_ps(e, xb0));
        __m512 y1 = _mm512_scalef_ps(_mm512_loadu_ps(p + 16), _mm512_add_ps(e, xb1));
        y0 = _mm512_mask_mov_ps(y0, (__mmask16) nan_b, qnan);
        y1 = _mm512_mask_mov_ps(y1, (__mmask16) (nan_b >> 16), qnan);
        _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), y0));
        _mm512_storeu_ps(o + 16, _mm512_add_ps(_mm512_loadu_ps(o + 16), y1));
    }
}

/* One 32x32 tile of C: strip rows [m0, m0 + rows), panel columns [n0, n0 + w). */
static void tile(blk_ctx *x, int64_t m0, int rows, const tile_facts *sf, int64_t n0, int w,
                 const uint16_t *panel, const tile_facts *pf) {
    const lowp_gemm_job *j = x->j;
    const lowp_gemm_blk_kernel *kern = x->kern;
    const int ra = kern->rows_align;
    const int mr = (rows + ra - 1) / ra * ra;
    float *P = x->P;
    const uint16_t *a = x->astrip;

    switch (j->pair) {
    case LOWP_PAIR_PLAIN: {
        (plain_needs_exact(sf, pf, x->K) ? kern->micro_exact : kern->micro)(a, panel, x->nkt, 0, mr,
                                                                            P);
        lowp_gemm_store_tile(j, m0, m0 + rows, n0, w, P);
        return;
    }
    case LOWP_PAIR_TENSOR:
    case LOWP_PAIR_ROW: {
        kern->micro(a, panel, x->nkt, 0, mr, P);
        float sb[32];
        col_scales(x, n0, w, 0, sb);
        const __m512 sb0 = _mm512_loadu_ps(sb), sb1 = _mm512_loadu_ps(sb + 16);
        for (int r = 0; r < rows; r++) {
            const __m512 s = _mm512_set1_ps(fp32_scale(j->a, 0, m0 + r, 0, 1));
            float *p = P + 32 * r;
            _mm512_storeu_ps(p, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(p), s), sb0));
            _mm512_storeu_ps(p + 16, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(p + 16), s), sb1));
        }
        lowp_gemm_store_tile(j, m0, m0 + rows, n0, w, P);
        return;
    }
    case LOWP_PAIR_MX:
    case LOWP_PAIR_MX_B32: {
        if (mx_fold_pair(sf, pf, x->K)) {
            kern->micro(a, panel, x->nkt, 0, mr, P);
            store_tile(j, m0, m0 + rows, n0, w, P, 1, _mm512_set1_ps((float) (sf->r + pf->r)));
            return;
        }
        /* Block by block: each 32-K partial sum gets its own power of two. */
        memset(x->acc, 0, sizeof(float) * 32 * (size_t) rows);
        float xa[32], xb[32];
        uint8_t nan_a[32];
        for (int64_t kt = 0; kt < x->nkt; kt++) {
            uint32_t nan_b = 0;
            for (int r = 0; r < rows; r++) {
                int c = mx_codes(j->a, m0 + r, j->a_blk, x->nba)[kt];
                nan_a[r] = !sf->folded && c == 0xFF;
                xa[r] = (float) (sf->folded ? sf->r : c - 127);
            }
            for (int i = 0; i < 32; i++) {
                int c = i < w ? mx_code(j->b, j->b_kn, n0 + i, j->b_blk + kt, x->nbb) : 127;
                if (!pf->folded && c == 0xFF) nan_b |= 1u << i;
                xb[i] = (float) (pf->folded ? pf->r : c - 127);
            }
            kern->micro(a + kt * LOWP_BLK_TILE_U16, panel + kt * LOWP_BLK_TILE_U16, 1, 0, mr, P);
            acc_mx(x->acc, P, rows, xa, nan_a, xb, nan_b);
        }
        lowp_gemm_store_tile(j, m0, m0 + rows, n0, w, x->acc);
        return;
    }
    case LOWP_PAIR_B128_W:
    case LOWP_PAIR_B128_B128: {
        const float *sb = x->sb128 + (n0 - x->nb0) / 32 * 32 * x->nb128;
        if (x->nkt == 0) memset(x->acc, 0, sizeof(float) * 32 * (size_t) rows);
        for (int64_t kt = 0, blk = 0; kt < x->nkt; kt += 4, blk++) {
            const int64_t n = x->nkt - kt < 4 ? x->nkt - kt : 4;
            kern->micro(a + kt * LOWP_BLK_TILE_U16, panel + kt * LOWP_BLK_TILE_U16, n, 0, mr, P);
            acc_b128(x->acc, P, rows, x->sa128 + 32 * blk, sb + 32 * blk, blk == 0);
        }
        lowp_gemm_store_tile(j, m0, m0 + rows, n0, w, x->acc);
        return;
    }
    case LOWP_PAIR_NV: {
        /* Block scales folded: one sum over K, then the reference's ((acc D_A) D_B). */
        kern->micro(a, panel, x->nkt, 0, mr, P);
        const __m512 da = _mm512_set1_ps(x->nv_da), db = _mm512_set1_ps(x->nv_db);
        for (int r = 0; r < rows; r++) {
            float *p = P + 32 * r;
            _mm512_storeu_ps(p, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(p), da), db));
            _mm512_storeu_ps(p + 16, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(p + 16), da), db));
        }
        lowp_gemm_store_tile(j, m0, m0 + rows, n0, w, P);
        return;
    }
    }
}

/* The next strip's codes are prefetched during the last PREFETCH_PANELS tiles of a strip:
 * earlier, the stream of B panels would evict them again before they are decoded. */
#define PREFETCH_PANELS 2

/* Bytes of row r of q from column k0 to k1, and where they start. */
static const char *row_bytes(const lowp_qtensor *q, int64_t r, int64_t k0, int64_t k1,
                             size_t *len) {
    const char *base = q->data;
    switch (q->format) {
    case LOWP_FORMAT_F32:
        *len = 4 * (size_t) (k1 - k0);
        return base + 4 * ((size_t) r * (size_t) q->cols + (size_t) k0);
    case LOWP_FORMAT_BF16:
        *len = 2 * (size_t) (k1 - k0);
        return base + 2 * ((size_t) r * (size_t) q->cols + (size_t) k0);
    case LOWP_FORMAT_E2M1:
        *len = (size_t) ((k1 + 1) / 2 - k0 / 2); /* the bytes that hold elements k0..k1-1 */
        return base + (size_t) r * (size_t) ((q->cols + 1) / 2) + (size_t) (k0 / 2);
    default: *len = (size_t) (k1 - k0); return base + (size_t) r * (size_t) q->cols + (size_t) k0;
    }
}

void lowp_gemm_prefetch_rows(const lowp_qtensor *q, int64_t r0, int64_t r1, int64_t k0, int64_t k1,
                             int64_t part, int64_t parts) {
    size_t len;
    row_bytes(q, r0, k0, k1, &len);
    const size_t lines = (len + 63) / 64, total = lines * (size_t) (r1 - r0);
    const size_t lo = total * (size_t) part / (size_t) parts,
                 hi = total * (size_t) (part + 1) / (size_t) parts;
    if (lo >= hi) return;
    unsigned sink = 0;
    /* Row by row, the row's start found once: a division and the format switch per 64-byte
     * line were 3% of a `medium` update on an AMX machine, whose tiles leave the driver's
     * loops exposed. */
    int64_t r = r0 + (int64_t) (lo / lines);
    size_t l = lo % lines;
    for (size_t i = lo; i < hi; r++, l = 0) {
        size_t unused;
        const char *row = row_bytes(q, r, k0, k1, &unused);
        const size_t lend = hi - i < lines - l ? l + (hi - i) : lines;
        for (; l < lend; l++, i++) {
            const char *p = row + 64 * l;
            /* A real load on each new page: a prefetch that misses the TLB may be dropped. */
            if (i == lo || ((uintptr_t) p & 4095) < 64) sink += *(const volatile unsigned char *) p;
            _mm_prefetch(p, _MM_HINT_T1);
        }
    }
    (void) sink;
}

__attribute__((target("prfchw"))) void lowp_gemm_prefetch_c(const lowp_gemm_job *j, int64_t m0,
                                                            int rows, int64_t n0, int w) {
    const size_t es = j->c->format == LOWP_FORMAT_F32 ? 4 : 2;
    for (int r = 0; r < rows; r++) {
        const char *p =
            (const char *) j->c->data +
            es * ((size_t) (j->c_row_base + m0 + r) * (size_t) j->c->cols + (size_t) n0);
        __builtin_prefetch(p, 1, 3);
        __builtin_prefetch(p + es * (size_t) w - 1, 1, 3);
    }
}

void lowp_gemm_blk_run(const lowp_gemm_job *j, const lowp_gemm_blk_kernel *kern) {
    blk_ctx x;
    memset(&x, 0, offsetof(blk_ctx, nvlut)); /* the table is written only for NVFP4 jobs */
    x.j = j;
    x.kern = kern;
    x.K = j->k1 - j->k0 > 0 ? j->k1 - j->k0 : 0;
    x.nkt = (x.K + 31) / 32;
    x.nc = nc_cols(j, kern);
    int64_t sr;
    if (j->a->scaling != LOWP_SCALING_NONE) lowp_qtensor_scale_shape(j->a, &sr, &x.nba, NULL);
    if (j->b->scaling != LOWP_SCALING_NONE) lowp_qtensor_scale_shape(j->b, &sr, &x.nbb, NULL);
    const int64_t kp = 32 * x.nkt;
    float *ws = j->ws;
    x.bblock = (uint16_t *) ws;
    ws += x.nc * kp / 2;
    x.astrip = (uint16_t *) ws;
    ws += 16 * kp;
    x.P = ws;
    x.acc = ws + 1024;
    x.tmp = (uint16_t *) (ws + 2048);
    x.pfacts = (tile_facts *) (ws + 3072);
    x.nb128 = (x.K + 127) / 128;
    x.sa128 = ws + 3072 + x.nc / 8 + 16;
    x.sb128 = x.sa128 + 32 * x.nb128;
    build_table(j->a->format, &x.ta);
    build_table(j->b->format, &x.tb);
    x.nv = j->pair == LOWP_PAIR_NV;
    if (x.nv) nv_setup(&x);

    const int nt_c = !j->accumulate && j->c->format == LOWP_FORMAT_F32 &&
                     (size_t) (j->c->rows * j->c->cols) * 4 >= LOWP_GEMM_NT_BYTES;
    for (int64_t nb0 = j->n0; nb0 < j->n1; nb0 += x.nc) {
        const int64_t ncols = j->n1 - nb0 < x.nc ? j->n1 - nb0 : x.nc;
        const int64_t npan = (ncols + 31) / 32;
        x.nb0 = nb0;
        /* The block the thread's previous job packed, when it is this one (pieces of one GEMM
         * along m share their B): the panels, their facts and scales are still in place. */
        lowp_gemm_pack_tag *tg = j->tag;
        const int packed = tg && tg->valid && tg->kern == (const void *) kern && tg->b == j->b &&
                           tg->b_kn == j->b_kn && tg->nb0 == nb0 && tg->ncols == ncols &&
                           tg->nc == x.nc && tg->k0 == j->k0 && tg->k1 == j->k1 &&
                           tg->b_blk == j->b_blk;
        for (int64_t p = 0; p < npan && !packed; p++) {
            const int w = (int) (ncols - 32 * p < 32 ? ncols - 32 * p : 32);
            pack_panel(&x, nb0 + 32 * p, w, x.bblock + p * kp * 32, &x.pfacts[p]);
        }
        if (tg && !packed) {
            tg->valid = 1;
            tg->kern = kern;
            tg->b = j->b;
            tg->b_kn = j->b_kn;
            tg->nb0 = nb0, tg->ncols = ncols, tg->nc = x.nc;
            tg->k0 = j->k0, tg->k1 = j->k1, tg->b_blk = j->b_blk;
        }
        for (int64_t m0 = j->m0; m0 < j->m1; m0 += 32) {
            const int rows = (int) (j->m1 - m0 < 32 ? j->m1 - m0 : 32);
            tile_facts sf;
            decode_strip(&x, m0, rows, &sf);
            const int64_t next = m0 + 32, next_rows = j->m1 - next < 32 ? j->m1 - next : 32;
            const int64_t pf_parts = npan < PREFETCH_PANELS ? npan : PREFETCH_PANELS;
            for (int64_t p = 0; p < npan; p++) {
                const int w = (int) (ncols - 32 * p < 32 ? ncols - 32 * p : 32);
                /* The next strip's codes, a share per panel, so that its decode does not
                 * wait on memory; and this tile's C rows, so that the stores do not. */
                if (next_rows > 0 && p >= npan - pf_parts)
                    lowp_gemm_prefetch_rows(j->a, next, next + next_rows, j->k0, j->k1,
                                            p - (npan - pf_parts), pf_parts);
                if (!nt_c) lowp_gemm_prefetch_c(j, m0, rows, nb0 + 32 * p, w);
                tile(&x, m0, rows, &sf, nb0 + 32 * p, w, x.bblock + p * kp * 32, &x.pfacts[p]);
            }
        }
    }
    _mm_sfence(); /* order the streaming stores of C before the job ends */
}
