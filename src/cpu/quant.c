/* CPU quantization dispatcher: settles the job (modes, defaults, whole-tensor scales), picks
 * the kernel (reference, AVX-512 or AVX2) and runs bands of rows on the threads. Arguments were
 * validated by the ops layer (src/ops/quant.c). */
#include <omp.h>
#include <stdlib.h>

#include "core/scale_rules.h"
#include "cpu.h"
#include "quant_kernels.h"

typedef void (*band_kernel)(const lowp_quant_job *, int64_t, int64_t);

/* The AVX-512 forms of the two whole-tensor passes below (quant_avx512.c): maxima of |x| bit
 * patterns, where NaN patterns sort above Inf above every number. Used when the AVX-512
 * kernel was picked, so the CPU has it. */
LOWP_HIDDEN uint32_t lowp_cpu_amax_bits_avx512(const lowp_quant_job *j, int64_t r0, int64_t r1);
LOWP_HIDDEN void lowp_cpu_colamax_bits_avx512(const lowp_quant_job *j, int64_t r0, int64_t r1,
                                              uint32_t *acc);
/* The same on AVX2 (quant_avx2.c). */
LOWP_HIDDEN uint32_t lowp_cpu_amax_bits_avx2(const lowp_quant_job *j, int64_t r0, int64_t r1);
LOWP_HIDDEN void lowp_cpu_colamax_bits_avx2(const lowp_quant_job *j, int64_t r0, int64_t r1,
                                            uint32_t *acc);

typedef uint32_t (*amax_bits_fn)(const lowp_quant_job *, int64_t, int64_t);
typedef void (*colamax_bits_fn)(const lowp_quant_job *, int64_t, int64_t, uint32_t *);

/* The whole-tensor passes' vector forms for the kernel that was picked (NULL: scalar). */
static amax_bits_fn amax_bits_of(band_kernel k) {
    return k == lowp_cpu_quant_avx512 ? lowp_cpu_amax_bits_avx512
           : k == lowp_cpu_quant_avx2 ? lowp_cpu_amax_bits_avx2
                                      : NULL;
}

static colamax_bits_fn colamax_bits_of(band_kernel k) {
    return k == lowp_cpu_quant_avx512 ? lowp_cpu_colamax_bits_avx512
           : k == lowp_cpu_quant_avx2 ? lowp_cpu_colamax_bits_avx2
                                      : NULL;
}

/* amax over the whole input (NaN wins), in parallel. */
static float tensor_amax(const lowp_quant_job *j, int threads, amax_bits_fn fast) {
    float m = 0.0f;
    int nan = 0;
#pragma omp parallel for num_threads(threads) reduction(max                                        \
                                                        : m) reduction(|                           \
                                                                       : nan)                      \
    schedule(static) if (j->rows * j->cols > 65536)
    for (int64_t r = 0; r < j->rows; r++) {
        float mr = 0.0f;
        if (fast) {
            uint32_t b = fast(j, r, r + 1);
            mr = b > 0x7F800000u ? NAN : lowp_u2f(b);
        } else {
            for (int64_t c = 0; c < j->cols; c++) mr = lowp_amax_acc(mr, lowp_job_x(j, r, c));
        }
        if (mr != mr)
            nan = 1;
        else if (mr > m)
            m = mr;
    }
    return nan ? NAN : m;
}

/* Per-column amax (for the columnwise copy of ROW scaling), NaN wins (its payload is not
 * kept: any NaN gives the same scale). The fast form splits the rows among the threads, each
 * with its own maxima, merged after: a maximum is exact in any order. */
static lowp_status column_amax(const lowp_quant_job *j, float *amax, int threads,
                               colamax_bits_fn fast) {
    if (fast) {
        const int64_t C = j->cols;
        int nt = j->rows * C > 65536 ? threads : 1;
        if (nt > j->rows) nt = (int) j->rows;
        if (nt < 1) nt = 1;
        uint32_t *acc = calloc((size_t) C * (size_t) nt, sizeof *acc);
        if (!acc)
            return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "lowp_quantize: %lld column maxima",
                             (long long) C);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
        for (int t = 0; t < nt; t++)
            fast(j, j->rows * t / nt, j->rows * (t + 1) / nt, acc + (size_t) t * (size_t) C);
        for (int64_t c = 0; c < C; c++) {
            uint32_t b = acc[c];
            for (int t = 1; t < nt; t++)
                b = acc[(size_t) t * (size_t) C + c] > b ? acc[(size_t) t * (size_t) C + c] : b;
            amax[c] = lowp_u2f(b);
        }
        free(acc);
        return LOWP_OK;
    }
    for (int64_t c = 0; c < j->cols; c++) amax[c] = 0.0f;
    for (int64_t r = 0; r < j->rows; r++)
        for (int64_t c = 0; c < j->cols; c++) amax[c] = lowp_amax_acc(amax[c], lowp_job_x(j, r, c));
    return LOWP_OK;
}

static lowp_status setup_job(lowp_quant_job *j, const lowp_tensor *x, lowp_qtensor *row,
                             lowp_qtensor *col, const lowp_quant_cfg *cfg) {
    const lowp_qtensor *q = row ? row : col;
    memset(j, 0, sizeof *j);
    j->x = x->data;
    j->xfmt = x->format;
    j->rows = x->rows;
    j->cols = x->cols;
    j->row = row;
    j->col = col;
    j->efmt = q->format;
    j->scaling = q->scaling;
    lowp_format_get(q->format, &j->et);
    const lowp_scaling_traits *kt;
    lowp_scaling_get(q->scaling, &kt); /* q->scaling was checked by the ops layer */
    j->mode = cfg->scale_mode;
    if (j->mode == LOWP_SCALE_MODE_DEFAULT) j->mode = kt->default_mode;
    if (j->mode == LOWP_SCALE_MODE_DEFAULT) j->mode = LOWP_SCALE_MODE_RCEIL; /* binary32 kinds */
    j->pow2 = cfg->pow2_scales < 0 ? kt->default_pow2 : cfg->pow2_scales;
    j->eps = cfg->eps;
    j->sr = cfg->rounding == LOWP_ROUNDING_SR; /* the reference kernel's (pick_kernel) */
    j->seed = cfg->seed;
    j->offset = cfg->offset;
    j->tensor_scale = 1.0f;
    switch (q->scaling) {
    /* 64 (two MX blocks) so that the fast kernel's columnwise lines of 64 codes stay whole */
    case LOWP_SCALING_MX32: j->band_rows = col ? 64 : 1; break;
    case LOWP_SCALING_BLOCK128: j->band_rows = col ? 128 : 1; break;
    case LOWP_SCALING_BLOCK128X128: j->band_rows = 128; break;
    case LOWP_SCALING_BLOCK32X32: j->band_rows = 32; break;
    case LOWP_SCALING_NV16: j->band_rows = col ? 16 : 1; break;
    case LOWP_SCALING_NV16X16: j->band_rows = 16; break;
    default: j->band_rows = 1; break;
    }
    const int64_t bs = lowp_quant_block_cols(q->scaling); /* input rows per scale of a col row */
    lowp_format_get(LOWP_FORMAT_E4M3, &j->e4m3);
    j->col_ob = q->format == LOWP_FORMAT_E2M1 ? (size_t) (j->rows + 1) / 2 : (size_t) j->rows;
    j->col_nbr = (j->rows + bs - 1) / bs;
    return LOWP_OK;
}

/* NVFP4: the tensor encode and decode scales from the tensor's amax (section 4b, step 1), into
 * the job and after the block scales of each output. */
static void nv_tensor_scales(lowp_quant_job *j, float amax) {
    j->nv_enc = lowp_rule_nv_tensor_scale(amax);
    j->nv_dec = 1.0f / j->nv_enc;
    lowp_qtensor *outs[2] = {j->row, j->col};
    for (int i = 0; i < 2; i++) {
        size_t off;
        if (outs[i] && lowp_qtensor_tensor_scale_offset(outs[i], &off) == LOWP_OK)
            memcpy((uint8_t *) outs[i]->scales + off, &j->nv_dec, sizeof j->nv_dec);
    }
}

/* The passes over the whole input before the bands: TENSOR's scale (given, or from the amax)
 * and NVFP4's tensor scale, written next to the outputs' scales, and cfg->amax_out. */
static void whole_tensor_scales(lowp_quant_job *j, const lowp_quant_cfg *cfg, int threads,
                                amax_bits_fn fast) {
    float amax = 0.0f;
    int have_amax = 0;
    if (j->scaling == LOWP_SCALING_TENSOR) {
        if (cfg->scale) {
            j->tensor_scale = *cfg->scale;
        } else {
            amax = tensor_amax(j, threads, fast);
            have_amax = 1;
            j->tensor_scale = lowp_rule_fp32_scale(amax, j->et->fmax, j->eps, j->pow2);
            j->tensor_fin = lowp_f2u(amax) < 0x7F800000u; /* finite (amax is >= 0 or NaN) */
        }
        if (j->row) ((float *) j->row->scales)[0] = 1.0f / j->tensor_scale;
        if (j->col) ((float *) j->col->scales)[0] = 1.0f / j->tensor_scale;
    }
    if (j->scaling == LOWP_SCALING_NV16 || j->scaling == LOWP_SCALING_NV16X16) {
        amax = tensor_amax(j, threads, fast);
        have_amax = 1;
        nv_tensor_scales(j, amax);
    }
    if (cfg->amax_out) *cfg->amax_out = have_amax ? amax : tensor_amax(j, threads, fast);
}

/* Whether the AVX-512 kernel takes the job's rounding: RNE, or SR of the E2M1 elements of
 * NV16, NV16X16 and MX32 (quant_avx512_nv.c), the only SR jobs the ops layer lets through. */
static int avx512_rounding(const lowp_quant_job *j) {
    return !j->sr || j->scaling == LOWP_SCALING_NV16 || j->scaling == LOWP_SCALING_NV16X16 ||
           j->scaling == LOWP_SCALING_MX32;
}

static band_kernel pick_kernel(const lowp_quant_job *j, lowp_kernel_path path, const char *fn,
                               lowp_status *st) {
    lowp_cpu_kernel which;
    *st = lowp_cpu_pick_kernel(fn, path, avx512_rounding(j) && lowp_cpu_quant_avx512_supports(j), 0,
                               !j->sr && lowp_cpu_quant_avx2_supports(j), &which);
    if (*st != LOWP_OK) return NULL;
    return which == LOWP_CPU_KERNEL_AVX512 ? lowp_cpu_quant_avx512
           : which == LOWP_CPU_KERNEL_AVX2 ? lowp_cpu_quant_avx2
                                           : lowp_cpu_quant_ref;
}

lowp_status lowp_cpu_quantize(const lowp_tensor *x, lowp_qtensor *row, lowp_qtensor *col,
                              const lowp_quant_cfg *cfg) {
    lowp_quant_job j;
    setup_job(&j, x, row, col, cfg);
    const int threads = lowp_cpu_threads(cfg->threads, 0);
    lowp_status st;
    band_kernel kernel = pick_kernel(&j, cfg->path, "lowp_quantize", &st);
    if (!kernel) return st;

    whole_tensor_scales(&j, cfg, threads, amax_bits_of(kernel));
    float *colsc = NULL;
    if (j.scaling == LOWP_SCALING_ROW && col && j.cols > 0) {
        colsc = malloc((size_t) j.cols * sizeof *colsc);
        if (!colsc)
            return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "lowp_quantize: %lld column scales",
                             (long long) j.cols);
        lowp_status cst = column_amax(&j, colsc, threads, colamax_bits_of(kernel));
        if (cst != LOWP_OK) {
            free(colsc);
            return cst;
        }
        j.col_fin = 1;
        for (int64_t c = 0; c < j.cols; c++) {
            if (!(lowp_f2u(colsc[c]) < 0x7F800000u)) j.col_fin = 0; /* Inf or NaN */
            colsc[c] = lowp_rule_fp32_scale(colsc[c], j.et->fmax, j.eps, j.pow2);
            ((float *) col->scales)[c] = 1.0f / colsc[c];
        }
        j.col_scale = colsc;
    }
    /* Bands of band_rows rows; each thread takes a contiguous run of bands. */
    const int64_t nbands = (j.rows + j.band_rows - 1) / j.band_rows;
    int64_t per = (nbands + threads - 1) / threads;
    if (per < 1) per = 1;
    const int64_t nchunks = (nbands + per - 1) / per;
#pragma omp parallel for num_threads(threads)                                                      \
    schedule(static) if (nchunks > 1 && j.rows * j.cols > 32768)
    for (int64_t t = 0; t < nchunks; t++) {
        int64_t r0 = t * per * j.band_rows;
        int64_t r1 = r0 + per * j.band_rows;
        if (r1 > j.rows) r1 = j.rows;
        kernel(&j, r0, r1);
    }
    free(colsc);
    return LOWP_OK;
}

/* Grouped columnwise quantization on a fast kernel (AVX-512 or AVX2). A group's blocks run along
 * its own tokens [start, end), exactly as the blocks of an ungrouped columnwise copy of just those
 * rows do, so each group is quantized as an ungrouped job on its rows whose columnwise copy
 * is the group's span of the grouped output: codes from column start of each output row,
 * scales from the group's first block, at the whole output's pitches (col_ob, col_nbr).
 * Edge blocks are written with masked stores, so neighbouring groups' spans, on other threads,
 * are never touched. Bit-exact with lowp_cpu_quant_grouped_ref since the kernel is bit-exact
 * with the reference. 8-bit codes only: an E2M1 group may start in the middle of a byte. With
 * `row` (a rowwise copy of all of x, the same format and scaling), each group's job fills its
 * rows of it too, from the same read. Returns 1 (it cannot fail). */
static int quantize_grouped_fast(const lowp_quant_job *j, lowp_qtensor *row,
                                 const lowp_quant_cfg *cfg, int threads, band_kernel kernel) {
    const lowp_qtensor *q = j->col;
    const int64_t bs = j->scaling == LOWP_SCALING_MX32 ? 32 : 128, C = j->cols;
    const size_t ss = j->scaling == LOWP_SCALING_MX32 ? 1 : sizeof(float); /* scale bytes */
    int64_t nbt = 0, prev = 0; /* blocks per output row, over every group */
    for (int32_t g = 0; g < q->groups; g++) {
        nbt += (q->group_offs[g] - prev + bs - 1) / bs;
        prev = q->group_offs[g];
    }
    const int64_t used = prev; /* tokens past offs[G-1] are ignored (codes 0) */
    const size_t xs = j->xfmt == LOWP_FORMAT_BF16 ? 2 : 4;
#pragma omp parallel for num_threads(threads) schedule(dynamic) if (used * C > 32768)
    for (int32_t g = 0; g < q->groups; g++) {
        int64_t start = 0, blk0 = 0;
        for (int32_t h = 0; h < g; h++) {
            blk0 += (q->group_offs[h] - start + bs - 1) / bs;
            start = q->group_offs[h];
        }
        const int64_t n = q->group_offs[g] - start;
        if (n == 0) continue;
        lowp_qtensor sub = *q;
        sub.rows = C;
        sub.cols = n;
        sub.group_offs = NULL;
        sub.groups = 0;
        sub.data = (uint8_t *) q->data + (size_t) start;
        sub.scales = (uint8_t *) q->scales + (size_t) blk0 * ss;
        lowp_tensor xv = {j->xfmt, n, C, (char *) j->x + (size_t) (start * C) * xs,
                          LOWP_DEVICE_HOST};
        /* The rowwise copy's rows of the group, in place: its blocks run along the row. */
        lowp_qtensor rsub;
        if (row) {
            const int64_t nbc = (C + bs - 1) / bs;
            rsub = *row;
            rsub.rows = n;
            rsub.data = (uint8_t *) row->data + (size_t) (start * C);
            rsub.scales = (uint8_t *) row->scales + (size_t) (start * nbc) * ss;
        }
        lowp_quant_job sj;
        setup_job(&sj, &xv, row ? &rsub : NULL, &sub, cfg);
        sj.col_ob = (size_t) j->rows;
        sj.col_nbr = nbt;
        kernel(&sj, 0, n);
    }
    if (used < j->rows)
        for (int64_t c = 0; c < C; c++)
            memset((uint8_t *) q->data + (size_t) (c * j->rows + used), 0,
                   (size_t) (j->rows - used));
    return 1;
}

/* Both copies from one read (quantize_grouped_fast with row), for MX32 or BLOCK128 on a fast
 * kernel (8-bit codes) when every row of x is in a group (the rowwise copy has the rows past
 * the last group too). Returns 1 when done, 0 (nothing written) when the job is not one of
 * those. */
static int quantize_grouped_dual(const lowp_quant_job *j, lowp_qtensor *row,
                                 const lowp_quant_cfg *cfg, int threads, band_kernel fast) {
    const lowp_qtensor *col = j->col;
    if (!fast || col->groups < 1 || col->group_offs[col->groups - 1] != j->rows ||
        (j->scaling != LOWP_SCALING_MX32 && j->scaling != LOWP_SCALING_BLOCK128))
        return 0;
    if (cfg->amax_out) *cfg->amax_out = tensor_amax(j, threads, amax_bits_of(fast));
    return quantize_grouped_fast(j, row, cfg, threads, fast);
}

/* With row: both copies from one read where quantize_grouped_dual takes the job, else the
 * rowwise copy (lowp_cpu_quantize) and then the grouped one, once the grouped one's kernel is
 * known to run (nothing is written when a forced path refuses). */
lowp_status lowp_cpu_quantize_grouped(const lowp_tensor *x, lowp_qtensor *row, lowp_qtensor *col,
                                      const lowp_quant_cfg *cfg) {
    lowp_quant_job j;
    setup_job(&j, x, NULL, col, cfg);
    const int threads = lowp_cpu_threads(cfg->threads, 0);
    lowp_cpu_kernel which;
    /* NV16's E2M1 codes on their own kernels: AVX-512 (RNE or SR), AVX2 (RNE) */
    const int nv = j.scaling == LOWP_SCALING_NV16;
    lowp_status st = lowp_cpu_pick_kernel(
        "lowp_quantize_grouped", cfg->path,
        (j.efmt != LOWP_FORMAT_E2M1 || nv) && lowp_cpu_quant_avx512_supports(&j), 0,
        (j.efmt != LOWP_FORMAT_E2M1 || (nv && !j.sr)) && lowp_cpu_quant_avx2_supports(&j), &which);
    if (st != LOWP_OK) return st;
    const band_kernel fast = which == LOWP_CPU_KERNEL_AVX512 ? lowp_cpu_quant_avx512
                             : which == LOWP_CPU_KERNEL_AVX2 ? lowp_cpu_quant_avx2
                                                             : NULL;
    if (row) {
        if (quantize_grouped_dual(&j, row, cfg, threads, fast)) return LOWP_OK;
        if ((st = lowp_cpu_quantize(x, row, NULL, cfg)) != LOWP_OK) return st;
    }
    if (cfg->amax_out) *cfg->amax_out = tensor_amax(&j, threads, amax_bits_of(fast));
    if (j.scaling == LOWP_SCALING_NV16) { /* the tensor scale of the tokens in groups */
        lowp_quant_job used = j;
        used.rows = col->group_offs[col->groups - 1];
        nv_tensor_scales(&j, tensor_amax(&used, threads, amax_bits_of(fast)));
    }
    if (nv && fast) { /* 16 output rows at a time: no byte shared */
        void (*nvk)(const lowp_quant_job *, int64_t, int64_t) =
            fast == lowp_cpu_quant_avx512 ? lowp_cpu_quant_grouped_avx512_nv
                                          : lowp_cpu_quant_grouped_avx2_nv;
#pragma omp parallel for num_threads(threads) schedule(static) if (j.rows * j.cols > 32768)
        for (int64_t c = 0; c < j.cols; c += 16) nvk(&j, c, c + 16 < j.cols ? c + 16 : j.cols);
        return LOWP_OK;
    }
    if (fast && quantize_grouped_fast(&j, NULL, cfg, threads, fast)) return LOWP_OK;
#pragma omp parallel for num_threads(threads) schedule(static) if (j.rows * j.cols > 32768)
    for (int64_t c = 0; c < j.cols; c++) lowp_cpu_quant_grouped_ref(&j, c, c + 1);
    return LOWP_OK;
}

lowp_status lowp_cpu_dequantize(const lowp_qtensor *q, lowp_tensor *out, int32_t threads) {
    int64_t br = q->scaling == LOWP_SCALING_BLOCK128X128 ? 128
                 : q->scaling == LOWP_SCALING_BLOCK32X32 ? 32
                 : q->scaling == LOWP_SCALING_NV16X16    ? 16
                                                         : 1;
    const int64_t nbands = (q->rows + br - 1) / br;
    const int nt = lowp_cpu_threads(threads, nbands);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && q->rows * q->cols > 65536)
    for (int64_t b = 0; b < nbands; b++) {
        int64_t r1 = (b + 1) * br < q->rows ? (b + 1) * br : q->rows;
        lowp_cpu_dequant_ref(q, (float *) out->data, b * br, r1);
    }
    return LOWP_OK;
}

lowp_status lowp_cpu_amax(const lowp_tensor *x, int scaling_, float *out) {
    lowp_scaling scaling = (lowp_scaling) scaling_;
    lowp_qtensor shape = {LOWP_FORMAT_E4M3, scaling, x->rows, x->cols, NULL, NULL,
                          x->device,        NULL,    0};
    int64_t sr, sc;
    lowp_status st = lowp_qtensor_scale_shape(&shape, &sr, &sc, NULL);
    if (st != LOWP_OK) return st;
    int64_t br, bc;
    lowp_scaling_block(scaling, &br, &bc);
    if (br == 0) br = x->rows > 0 ? x->rows : 1;
    if (bc == 0) bc = x->cols > 0 ? x->cols : 1;
    lowp_quant_job j;
    memset(&j, 0, sizeof j);
    j.x = x->data;
    j.xfmt = x->format;
    j.rows = x->rows;
    j.cols = x->cols;
    for (int64_t i = 0; i < sr * sc; i++) out[i] = 0.0f;
    for (int64_t r = 0; r < x->rows; r++)
        for (int64_t c = 0; c < x->cols; c++) {
            float *m = &out[(r / br) * sc + c / bc];
            *m = lowp_amax_acc(*m, lowp_job_x(&j, r, c));
        }
    return LOWP_OK;
}
