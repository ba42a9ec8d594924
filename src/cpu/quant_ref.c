/* The scalar reference of quantization and dequantization (docs/numerics.md sections 3-4b): plain
 * loops, one element at a time, in the order the document states the rules. It is the golden
 * model the AVX-512 kernels and every other backend are compared with.
 *
 * Packed E2M1 outputs are written in ascending element order along each output row: an even
 * element sets its byte (clearing the high nibble, so the pad nibble of an odd-length row is
 * 0), an odd element ORs its nibble in.
 *
 * Stochastic rounding (job->sr, E2M1 elements of MX32, NV16 and NV16X16) replaces the element
 * encode's RNE by section 2's SR with word offset + i of the Philox stream, i the element's
 * row-major index in its own copy: r * cols + c in the row copy, c * rows + r in the col copy
 * (grouped too: rows counts every token). */
#include "core/philox.h"
#include "core/scale_rules.h"
#include "quant_kernels.h"

static size_t row_bytes(const lowp_qtensor *q) {
    return q->format == LOWP_FORMAT_E2M1 ? ((size_t) q->cols + 1) / 2 : (size_t) q->cols;
}

static void put(const lowp_qtensor *q, int64_t r, int64_t c, uint32_t code) {
    uint8_t *row = (uint8_t *) q->data + (size_t) r * row_bytes(q);
    if (q->format != LOWP_FORMAT_E2M1)
        row[c] = (uint8_t) code;
    else if ((c & 1) == 0)
        row[c / 2] = (uint8_t) (code & 0xF);
    else
        row[c / 2] |= (uint8_t) ((code & 0xF) << 4);
}

static uint32_t get(const lowp_qtensor *q, int64_t r, int64_t c) {
    const uint8_t *row = (const uint8_t *) q->data + (size_t) r * row_bytes(q);
    if (q->format != LOWP_FORMAT_E2M1) return row[c];
    return (row[c / 2] >> (4 * (c & 1))) & 0xF;
}

/* Word w of stream seed (section 7). A Philox block gives four consecutive words and the
 * kernels visit a copy's elements in index order, so the thread keeps its last block. */
static uint32_t sr_word(uint64_t seed, uint64_t w) {
    static _Thread_local struct {
        int valid;
        uint64_t seed, blk;
        uint32_t out[4];
    } c;
    const uint64_t blk = w >> 2;
    if (!c.valid || c.seed != seed || c.blk != blk) {
        const uint32_t ctr[4] = {(uint32_t) blk, (uint32_t) (blk >> 32), 0, 0};
        const uint32_t key[2] = {(uint32_t) seed, (uint32_t) (seed >> 32)};
        lowp_philox_block(ctr, key, c.out);
        c.valid = 1, c.seed = seed, c.blk = blk;
    }
    return c.out[w & 3];
}

/* The satfinite element code of a scaled value v: RNE, or SR with word offset + i. */
static uint32_t enc_elem(const lowp_quant_job *j, float v, uint64_t i) {
    if (j->sr) return j->et->encode_sr(v, sr_word(j->seed, j->offset + i), LOWP_OVERFLOW_SATFINITE);
    return j->et->encode(v, LOWP_OVERFLOW_SATFINITE);
}

/* Element code of x (element i of its copy) in a block whose E8M0 scale code is `code`
 * (section 3, steps 1 and 4). */
static uint32_t enc_e8m0(const lowp_quant_job *j, float x, uint8_t code, uint64_t i) {
    if (code == 0xFF) return j->et->nan_code; /* 0 for E2M1 */
    return enc_elem(j, x * lowp_rule_e8m0_quant_factor(code), i);
}

static uint32_t enc_fp32(const lowp_quant_job *j, float x, float scale) {
    return j->et->encode(x * scale, LOWP_OVERFLOW_SATFINITE);
}

/* NVFP4 element code of x (element i of its copy) in a block whose E4M3 scale code is `code`
 * and element factor `f` (section 4b, step 3): a NaN block's elements are 0, as in an MX
 * block. */
static uint32_t enc_nv(const lowp_quant_job *j, float x, uint8_t code, float f, uint64_t i) {
    if ((code & 0x7F) == 0x7F) return 0;
    return enc_elem(j, x * f, i);
}

static int is_nv(lowp_scaling s) {
    return s == LOWP_SCALING_NV16 || s == LOWP_SCALING_NV16X16;
}

static int byte_scales(lowp_scaling s) {
    return s == LOWP_SCALING_MX32 || s == LOWP_SCALING_BLOCK32X32 || is_nv(s);
}

/* The code of x (element i of its copy) under a block's scale: E8M0 code, NVFP4 E4M3 code and
 * factor, or binary32. */
static uint32_t enc_any(const lowp_quant_job *j, float x, int kind, uint8_t code, float s,
                        uint64_t i) {
    return kind == 1   ? enc_e8m0(j, x, code, i)
           : kind == 2 ? enc_nv(j, x, code, s, i)
                       : enc_fp32(j, x, s);
}

/* amax of the input rectangle [r0, r1) x [c0, c1). */
static float rect_amax(const lowp_quant_job *j, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    float m = 0.0f;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) m = lowp_amax_acc(m, lowp_job_x(j, r, c));
    return m;
}

static int64_t min64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

/* Quantize the input rectangle [r0,r1) x [c0,c1) with one scale into the row copy (at
 * [r, c]) and/or the col copy (at [c, r]); returns the scale's stored form through *code or
 * *scale_inv. Used for every block shape: a 1xN block along a row, an Nx1 block along a
 * column, or a 2-D tile. `to_row`/`to_col` choose the destinations. */
typedef struct block_out {
    uint8_t code;    /* E8M0 kinds */
    float scale_inv; /* binary32 kinds */
} block_out;

static block_out quant_block(const lowp_quant_job *j, int64_t r0, int64_t r1, int64_t c0,
                             int64_t c1, int to_row, int to_col) {
    block_out b = {0, 1.0f};
    float amax = rect_amax(j, r0, r1, c0, c1);
    /* kind: 0 binary32 scale_inv, 1 E8M0 code, 2 NVFP4 E4M3 code (s is its element factor) */
    const int kind = is_nv(j->scaling) ? 2 : byte_scales(j->scaling) ? 1 : 0;
    float s = 1.0f;
    if (kind == 1) {
        b.code = lowp_rule_e8m0_code(amax, j->et, j->mode);
    } else if (kind == 2) {
        b.code = lowp_rule_nv_block_code(amax, j->nv_enc, j->e4m3);
        s = lowp_rule_nv_elem_factor(b.code, j->nv_dec, j->e4m3);
    } else {
        s = lowp_rule_fp32_scale(amax, j->et->fmax, j->eps, j->pow2);
        b.scale_inv = 1.0f / s;
    }
    /* Column-major visiting within the block when writing the col copy keeps its packed
     * nibbles in ascending order; the row copy needs row-major order. */
    if (to_row) {
        for (int64_t r = r0; r < r1; r++)
            for (int64_t c = c0; c < c1; c++)
                put(j->row, r, c,
                    enc_any(j, lowp_job_x(j, r, c), kind, b.code, s, (uint64_t) (r * j->cols + c)));
    }
    if (to_col) {
        for (int64_t c = c0; c < c1; c++)
            for (int64_t r = r0; r < r1; r++)
                put(j->col, c, r,
                    enc_any(j, lowp_job_x(j, r, c), kind, b.code, s, (uint64_t) (c * j->rows + r)));
    }
    return b;
}

static void store_scale(const lowp_qtensor *q, size_t idx, block_out b) {
    if (byte_scales(q->scaling))
        ((uint8_t *) q->scales)[idx] = b.code;
    else
        ((float *) q->scales)[idx] = b.scale_inv;
}

void lowp_cpu_quant_ref(const lowp_quant_job *j, int64_t r0, int64_t r1) {
    const int64_t R = j->rows, C = j->cols;
    switch (j->scaling) {
    case LOWP_SCALING_TENSOR:
        for (int64_t r = r0; r < r1; r++)
            for (int64_t c = 0; c < C; c++) {
                uint32_t q = enc_fp32(j, lowp_job_x(j, r, c), j->tensor_scale);
                if (j->row) put(j->row, r, c, q);
            }
        if (j->col)
            for (int64_t c = 0; c < C; c++)
                for (int64_t r = r0; r < r1; r++)
                    put(j->col, c, r, enc_fp32(j, lowp_job_x(j, r, c), j->tensor_scale));
        break;
    case LOWP_SCALING_ROW:
        if (j->row)
            for (int64_t r = r0; r < r1; r++)
                store_scale(j->row, (size_t) r, quant_block(j, r, r + 1, 0, C, 1, 0));
        if (j->col)
            for (int64_t c = 0; c < C; c++)
                for (int64_t r = r0; r < r1; r++)
                    put(j->col, c, r, enc_fp32(j, lowp_job_x(j, r, c), j->col_scale[c]));
        break;
    case LOWP_SCALING_MX32:
    case LOWP_SCALING_BLOCK128:
    case LOWP_SCALING_NV16: {
        const int64_t bs = lowp_quant_block_cols(j->scaling);
        if (j->row) {
            const int64_t nb = (C + bs - 1) / bs;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t b = 0; b < nb; b++)
                    store_scale(j->row, (size_t) (r * nb + b),
                                quant_block(j, r, r + 1, b * bs, min64(b * bs + bs, C), 1, 0));
        }
        if (j->col) {
            const int64_t nb = (R + bs - 1) / bs; /* blocks along the input's rows */
            for (int64_t rb = r0 / bs; rb * bs < r1; rb++)
                for (int64_t c = 0; c < C; c++)
                    store_scale(j->col, (size_t) (c * nb + rb),
                                quant_block(j, rb * bs, min64(rb * bs + bs, R), c, c + 1, 0, 1));
        }
        break;
    }
    case LOWP_SCALING_BLOCK128X128:
    case LOWP_SCALING_BLOCK32X32:
    case LOWP_SCALING_NV16X16: {
        const int64_t bs = lowp_quant_block_cols(j->scaling);
        const int64_t nbr = (R + bs - 1) / bs, nbc = (C + bs - 1) / bs;
        for (int64_t tr = r0 / bs; tr * bs < r1; tr++)
            for (int64_t tc = 0; tc < nbc; tc++) {
                block_out b = quant_block(j, tr * bs, min64(tr * bs + bs, R), tc * bs,
                                          min64(tc * bs + bs, C), j->row != NULL, j->col != NULL);
                if (j->row) store_scale(j->row, (size_t) (tr * nbc + tc), b);
                if (j->col) store_scale(j->col, (size_t) (tc * nbr + tr), b);
            }
        break;
    }
    default: break;
    }
}

void lowp_cpu_quant_grouped_ref(const lowp_quant_job *j, int64_t c0, int64_t c1) {
    const lowp_qtensor *q = j->col;
    const int64_t bs = lowp_quant_block_cols(j->scaling);
    int64_t nbt = 0, prev = 0; /* total blocks per output row */
    for (int32_t g = 0; g < q->groups; g++) {
        nbt += (q->group_offs[g] - prev + bs - 1) / bs;
        prev = q->group_offs[g];
    }
    const int64_t used = prev; /* tokens past offs[G-1] are ignored */
    for (int64_t c = c0; c < c1; c++) {
        int64_t blk = 0, start = 0;
        for (int32_t g = 0; g < q->groups; g++) {
            const int64_t end = q->group_offs[g];
            for (int64_t s = start; s < end; s += bs, blk++)
                store_scale(q, (size_t) (c * nbt + blk),
                            quant_block(j, s, min64(s + bs, end), c, c + 1, 0, 1));
            start = end;
        }
        for (int64_t r = used; r < j->rows; r++) put(q, c, r, 0);
    }
}

/* Block index of column c along a grouped row; -1 past the last group. */
static int64_t grouped_block(const lowp_qtensor *q, int64_t c, int64_t bs) {
    int64_t start = 0, blk = 0;
    for (int32_t g = 0; g < q->groups; g++) {
        const int64_t end = q->group_offs[g];
        if (c < end) return blk + (c - start) / bs;
        blk += (end - start + bs - 1) / bs;
        start = end;
    }
    return -1;
}

/* The NVFP4 tensor decode scale of q (after its block scales). */
static float nv_tensor_dec(const lowp_qtensor *q) {
    size_t off;
    float g;
    lowp_qtensor_tensor_scale_offset(q, &off);
    memcpy(&g, (const uint8_t *) q->scales + off, sizeof g);
    return g;
}

/* Decode factor of element (r, c) of q; *ignored is set for grouped columns past the last
 * group, which decode to 0. NVFP4 kinds return the block scale's value; the caller applies
 * the tensor decode scale after it (section 4b, step 5). */
static float dequant_factor(const lowp_qtensor *q, int64_t r, int64_t c, int64_t nbt,
                            const lowp_format_traits *e4m3, int *ignored) {
    const float *fs = (const float *) q->scales;
    const uint8_t *es = (const uint8_t *) q->scales;
    *ignored = 0;
    switch (q->scaling) {
    case LOWP_SCALING_TENSOR: return fs[0];
    case LOWP_SCALING_ROW: return fs[r];
    case LOWP_SCALING_BLOCK128X128: return fs[(r / 128) * ((q->cols + 127) / 128) + c / 128];
    case LOWP_SCALING_BLOCK32X32:
        return lowp_rule_e8m0_value(es[(r / 32) * ((q->cols + 31) / 32) + c / 32]);
    case LOWP_SCALING_NV16X16: return e4m3->decode(es[(r / 16) * ((q->cols + 15) / 16) + c / 16]);
    default: break;
    }
    /* MX32, BLOCK128 and NV16, possibly grouped. */
    const int64_t bs = lowp_quant_block_cols(q->scaling);
    int64_t blk = q->group_offs ? grouped_block(q, c, bs) : c / bs;
    if (blk < 0) {
        *ignored = 1;
        return 0.0f;
    }
    size_t idx = (size_t) (r * nbt + blk);
    if (q->scaling == LOWP_SCALING_NV16) return e4m3->decode(es[idx]);
    return q->scaling == LOWP_SCALING_MX32 ? lowp_rule_e8m0_value(es[idx]) : fs[idx];
}

void lowp_cpu_dequant_ref(const lowp_qtensor *q, float *out, int64_t r0, int64_t r1) {
    const lowp_format_traits *t, *e4m3;
    lowp_format_get(q->format, &t);
    lowp_format_get(LOWP_FORMAT_E4M3, &e4m3);
    int64_t sr, sc;
    lowp_qtensor_scale_shape(q, &sr, &sc, NULL);
    const int nv = is_nv(q->scaling);
    const float g = nv ? nv_tensor_dec(q) : 1.0f;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = 0; c < q->cols; c++) {
            int ignored;
            float f = dequant_factor(q, r, c, sc, e4m3, &ignored);
            float v = ignored ? 0.0f : t->decode(get(q, r, c)) * f;
            out[(size_t) r * (size_t) q->cols + (size_t) c] = nv && !ignored ? v * g : v;
        }
}
