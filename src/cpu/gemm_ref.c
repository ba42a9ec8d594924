/* The scalar reference GEMM (docs/numerics.md section 6): for every output element, products are
 * summed in binary32 sequentially in k within a block, each block's sum is scaled as the pair
 * requires and added to the binary32 accumulator in increasing k; tensorwise and rowwise
 * scales are applied once at the end. Elements are decoded exactly (a table per format); the
 * only memory it uses is the job's workspace: one decoded A row and a panel of B rows. */
#include <math.h>

#include "core/scale_rules.h"
#include "gemm_kernels.h"

void lowp_gemm_decode_row(const lowp_qtensor *q, int64_t r, int64_t k0, int64_t k1,
                          const float *lut, float *out) {
    const int64_t n = k1 - k0;
    switch (q->format) {
    case LOWP_FORMAT_F32: {
        const float *p = (const float *) q->data + (size_t) r * (size_t) q->cols + k0;
        for (int64_t i = 0; i < n; i++) out[i] = p[i];
        break;
    }
    case LOWP_FORMAT_BF16: {
        const uint16_t *p = (const uint16_t *) q->data + (size_t) r * (size_t) q->cols + k0;
        for (int64_t i = 0; i < n; i++) out[i] = lowp_u2f((uint32_t) p[i] << 16);
        break;
    }
    case LOWP_FORMAT_E2M1: {
        const uint8_t *p = (const uint8_t *) q->data + (size_t) r * (size_t) ((q->cols + 1) / 2);
        for (int64_t i = 0; i < n; i++) {
            int64_t k = k0 + i;
            out[i] = lut[(p[k / 2] >> (4 * (k & 1))) & 0xF];
        }
        break;
    }
    default: {
        const uint8_t *p = (const uint8_t *) q->data + (size_t) r * (size_t) q->cols + k0;
        for (int64_t i = 0; i < n; i++) out[i] = lut[p[i]];
        break;
    }
    }
}

/* The same for b given [K, N] (b_kn): elements (n, k0..k1) are column n of rows k0..k1 (E2M1:
 * NV16X16, the one E2M1 kind b_kn takes; its rows are packed along N). */
static void decode_col(const lowp_qtensor *q, int64_t n, int64_t k0, int64_t k1, const float *lut,
                       float *out) {
    const size_t ld = (size_t) q->cols;
    for (int64_t k = k0; k < k1; k++) {
        const size_t i = (size_t) k * ld + (size_t) n;
        switch (q->format) {
        case LOWP_FORMAT_F32: out[k - k0] = ((const float *) q->data)[i]; break;
        case LOWP_FORMAT_BF16:
            out[k - k0] = lowp_u2f((uint32_t) ((const uint16_t *) q->data)[i] << 16);
            break;
        case LOWP_FORMAT_E2M1: {
            const uint8_t *row = (const uint8_t *) q->data + (size_t) k * ((ld + 1) / 2);
            out[k - k0] = lut[(row[n / 2] >> (4 * (n & 1))) & 0xF];
            break;
        }
        default: out[k - k0] = lut[((const uint8_t *) q->data)[i]]; break;
        }
    }
}

void lowp_gemm_decode_lut(lowp_format f, float lut[256]) {
    const lowp_format_traits *t;
    lowp_format_get(f, &t);
    if (t->bits > 8) return;
    for (uint32_t c = 0; c < (1u << t->bits); c++) lut[c] = t->decode(c);
}

float lowp_gemm_scale_f32(const lowp_qtensor *q, int kn, int64_t r, int64_t blk, int64_t nb) {
    const float *s = (const float *) q->scales;
    switch (q->scaling) {
    case LOWP_SCALING_TENSOR: return s[0];
    case LOWP_SCALING_ROW: return s[r];
    case LOWP_SCALING_BLOCK128X128: return kn ? s[blk * nb + r / 128] : s[(r / 128) * nb + blk];
    default: return s[r * nb + blk]; /* BLOCK128 */
    }
}

/* E4M3 code of an NVFP4 operand's row r for K-block `blk` (kn as above), and its tensor
 * decode scale. */
uint8_t lowp_gemm_scale_nv(const lowp_qtensor *q, int kn, int64_t r, int64_t blk, int64_t nb) {
    const uint8_t *s = (const uint8_t *) q->scales;
    if (q->scaling == LOWP_SCALING_NV16X16)
        return kn ? s[blk * nb + r / 16] : s[(r / 16) * nb + blk];
    return s[r * nb + blk]; /* NV16 */
}

float lowp_gemm_tensor_dec_nv(const lowp_qtensor *q) {
    size_t off;
    float g;
    lowp_qtensor_tensor_scale_offset(q, &off);
    memcpy(&g, (const uint8_t *) q->scales + off, sizeof g);
    return g;
}

uint8_t lowp_gemm_scale_e8m0(const lowp_qtensor *q, int kn, int64_t r, int64_t blk, int64_t nb) {
    const uint8_t *s = (const uint8_t *) q->scales;
    if (q->scaling == LOWP_SCALING_BLOCK32X32)
        return kn ? s[blk * nb + r / 32] : s[(r / 32) * nb + blk];
    return s[r * nb + blk]; /* MX32 */
}

/* What the reference reads for every output element of a job: the pair's kind, the decode
 * tables of the E4M3 block scales, the operands' scale pitches and NVFP4 tensor scales. */
typedef struct ref_ctx {
    const lowp_gemm_job *j;
    int64_t K, bk, nba, nbb;
    int e8, blk128, nv;
    float lut_e4m3[256];
    float ga, gb; /* NVFP4 tensor decode scales of a and b */
} ref_ctx;

/* C[m, n] before the output's rounding: block sums scaled as the pair requires, added in
 * increasing k; tensorwise, rowwise and NVFP4 tensor scales applied at the end. */
static float dot_blocks(const ref_ctx *x, const float *arow, const float *bp, int64_t m,
                        int64_t n) {
    const lowp_gemm_job *j = x->j;
    const lowp_qtensor *a = j->a, *b = j->b;
    float acc = 0.0f;
    for (int64_t k = 0, blk = 0; k < x->K; k += x->bk, blk++) {
        const int64_t ke = k + x->bk < x->K ? k + x->bk : x->K;
        float s = 0.0f;
        for (int64_t i = k; i < ke; i++) s += arow[i] * bp[i];
        if (x->e8) {
            uint8_t ca = lowp_gemm_scale_e8m0(a, 0, m, j->a_blk + blk, x->nba);
            uint8_t cb = lowp_gemm_scale_e8m0(b, j->b_kn, n, j->b_blk + blk, x->nbb);
            /* Combine the exponents as integers: 2^-127 * 2^-127 underflows. */
            acc += (ca == 0xFF || cb == 0xFF) ? NAN : ldexpf(s, (int) ca + (int) cb - 254);
        } else if (x->nv) {
            /* Exact: a 16-block sum has at most 12 significant bits, the product of two E4M3
             * values at most 8 (section 6). */
            float sa = x->lut_e4m3[lowp_gemm_scale_nv(a, 0, m, j->a_blk + blk, x->nba)];
            float sb = x->lut_e4m3[lowp_gemm_scale_nv(b, j->b_kn, n, j->b_blk + blk, x->nbb)];
            acc += s * (sa * sb);
        } else if (x->blk128) {
            float sa = lowp_gemm_scale_f32(a, 0, m, j->a_blk + blk, x->nba);
            float sb = lowp_gemm_scale_f32(b, j->b_kn, n, j->b_blk + blk, x->nbb);
            acc += s * sa * sb;
        } else {
            acc += s;
        }
    }
    if (x->nv) acc = acc * x->ga * x->gb;
    if (j->pair == LOWP_PAIR_TENSOR || j->pair == LOWP_PAIR_ROW)
        acc = acc * lowp_gemm_scale_f32(a, 0, m, 0, 1) * lowp_gemm_scale_f32(b, j->b_kn, n, 0, 1);
    return acc;
}

/* Write (or add) C[m, n] in C's format. */
static void store_c(const lowp_gemm_job *j, int64_t m, int64_t n, float acc,
                    const lowp_format_traits *bf16) {
    const size_t ci = (size_t) (j->c_row_base + m) * (size_t) j->c->cols + (size_t) n;
    if (j->c->format == LOWP_FORMAT_BF16) {
        uint16_t *c = (uint16_t *) j->c->data;
        if (j->accumulate) acc += lowp_u2f((uint32_t) c[ci] << 16);
        c[ci] = (uint16_t) bf16->encode(acc, LOWP_OVERFLOW_NONSAT);
    } else {
        float *c = (float *) j->c->data;
        c[ci] = j->accumulate ? c[ci] + acc : acc;
    }
}

void lowp_cpu_gemm_ref(const lowp_gemm_job *j) {
    const lowp_qtensor *a = j->a, *b = j->b;
    ref_ctx x;
    x.j = j;
    x.K = j->k1 - j->k0;
    x.bk = j->bk > 0 ? j->bk : (x.K > 0 ? x.K : 1);
    int64_t sra, srb;
    lowp_qtensor_scale_shape(a, &sra, &x.nba, NULL);
    lowp_qtensor_scale_shape(b, &srb, &x.nbb, NULL);
    x.e8 = j->pair == LOWP_PAIR_MX || j->pair == LOWP_PAIR_MX_B32;
    x.blk128 = j->pair == LOWP_PAIR_B128_W || j->pair == LOWP_PAIR_B128_B128;
    x.nv = j->pair == LOWP_PAIR_NV;
    lowp_gemm_decode_lut(LOWP_FORMAT_E4M3, x.lut_e4m3);
    x.ga = x.nv ? lowp_gemm_tensor_dec_nv(a) : 1.0f;
    x.gb = x.nv ? lowp_gemm_tensor_dec_nv(b) : 1.0f;
    float lut_a[256], lut_b[256];
    lowp_gemm_decode_lut(a->format, lut_a);
    lowp_gemm_decode_lut(b->format, lut_b);
    const int64_t K = x.K;
    float *arow = j->ws, *bpanel = j->ws + K;
    const lowp_format_traits *bf16;
    lowp_format_get(LOWP_FORMAT_BF16, &bf16);

    for (int64_t n0 = j->n0; n0 < j->n1; n0 += LOWP_GEMM_REF_PANEL) {
        const int64_t n1 = n0 + LOWP_GEMM_REF_PANEL < j->n1 ? n0 + LOWP_GEMM_REF_PANEL : j->n1;
        for (int64_t n = n0; n < n1; n++)
            (j->b_kn ? decode_col : lowp_gemm_decode_row)(b, n, j->k0, j->k1, lut_b,
                                                          bpanel + (size_t) (n - n0) * (size_t) K);
        for (int64_t m = j->m0; m < j->m1; m++) {
            lowp_gemm_decode_row(a, m, j->k0, j->k1, lut_a, arow);
            for (int64_t n = n0; n < n1; n++)
                store_c(j, m, n,
                        dot_blocks(&x, arow, bpanel + (size_t) (n - n0) * (size_t) K, m, n), bf16);
        }
    }
}
