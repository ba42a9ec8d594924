/* The CPU quantization kernels' interface. The dispatcher (quant.c) resolves the
 * configuration into a job (modes and defaults settled, tensor and column scales computed
 * where a whole-tensor pass is needed), then hands bands of input rows to a kernel on each
 * thread. Bands start on a multiple of job->band_rows, so no two threads share a scale block
 * or a byte of packed E2M1 output. */
#ifndef LOWP_QUANT_KERNELS_H
#define LOWP_QUANT_KERNELS_H

#include "core/internal.h"
#include "lowp/quant.h"

typedef struct lowp_quant_job {
    const void *x;    /* input [rows, cols], F32 or BF16, row-major */
    lowp_format xfmt; /* LOWP_FORMAT_F32 or LOWP_FORMAT_BF16 */
    int64_t rows, cols;
    lowp_qtensor *row; /* rowwise output [rows, cols] or NULL */
    lowp_qtensor *col; /* columnwise output [cols, rows] or NULL */
    lowp_format efmt;  /* element format of the outputs */
    lowp_scaling scaling;
    const lowp_format_traits *et; /* traits of efmt */
    lowp_scale_mode mode;         /* resolved (never DEFAULT) */
    int pow2;                     /* resolved */
    float eps;
    float tensor_scale;     /* TENSOR: the scale to apply (computed or given) */
    int tensor_fin;         /* TENSOR: computed from this input's maximum, which is finite */
    const float *col_scale; /* ROW with a columnwise copy: scale per input column [cols] */
    int col_fin;            /* ROW with a columnwise copy: every column's maximum is finite */
    float nv_enc;           /* NV16, NV16X16: the tensor encode scale S (section 4b) */
    float nv_dec;           /* and the decode scale 1/S stored after the block scales */
    const lowp_format_traits *e4m3; /* NV16, NV16X16: the block scales' format */
    int64_t band_rows;              /* bands start on multiples of this */
    /* The columnwise copy's pitches (AVX-512 kernels): code bytes and scale entries from one of
     * its rows to the next. setup_job sets those of col itself; the grouped path points col
     * at a group's span of a larger output and sets that output's. */
    size_t col_ob;
    int64_t col_nbr;
    /* Stochastic rounding of the elements (the reference; NV16 and NV16X16 on AVX-512 too):
     * element i of a copy uses Philox word offset + i of stream seed (quant_ref.c). */
    int sr;
    uint64_t seed, offset;
} lowp_quant_job;

/* Quantize input rows [r0, r1) into the job's outputs. */
LOWP_HIDDEN void lowp_cpu_quant_ref(const lowp_quant_job *j, int64_t r0, int64_t r1);

/* Grouped columnwise quantization: output rows (input columns) [c0, c1). */
/* The K block of a kind along its quantized dimension (32, 128 or 16; 1 for TENSOR, ROW). */
static inline int64_t lowp_quant_block_cols(lowp_scaling s) {
    switch (s) {
    case LOWP_SCALING_MX32:
    case LOWP_SCALING_BLOCK32X32: return 32;
    case LOWP_SCALING_BLOCK128:
    case LOWP_SCALING_BLOCK128X128: return 128;
    case LOWP_SCALING_NV16:
    case LOWP_SCALING_NV16X16: return 16;
    default: return 1;
    }
}

LOWP_HIDDEN void lowp_cpu_quant_grouped_ref(const lowp_quant_job *j, int64_t c0, int64_t c1);

/* Dequantize output rows [r0, r1) of q into out (F32, q's shape). r0 is a multiple of the
 * scaling's block rows. */
LOWP_HIDDEN void lowp_cpu_dequant_ref(const lowp_qtensor *q, float *out, int64_t r0, int64_t r1);

/* The AVX-512 kernels, bit-exact with the reference; supports() says which jobs they take. */
LOWP_HIDDEN int lowp_cpu_quant_avx512_supports(const lowp_quant_job *j);
LOWP_HIDDEN void lowp_cpu_quant_avx512(const lowp_quant_job *j, int64_t r0, int64_t r1);
/* NV16's grouped columnwise copy on AVX-512 (quant_avx512_nv.c): output rows (input columns)
 * [c0, c1), c0 a multiple of 16; the tensor scale set. */
LOWP_HIDDEN void lowp_cpu_quant_grouped_avx512_nv(const lowp_quant_job *j, int64_t c0, int64_t c1);

/* The AVX2 kernel (E4M3 and E5M2 outputs), bit-exact with the reference. */
LOWP_HIDDEN int lowp_cpu_quant_avx2_supports(const lowp_quant_job *j);
LOWP_HIDDEN void lowp_cpu_quant_avx2(const lowp_quant_job *j, int64_t r0, int64_t r1);
/* Its NVFP4 part (quant_avx2_nv.c): nv16 (not grouped) and nv16x16 with E2M1 elements. */
LOWP_HIDDEN void lowp_cpu_quant_avx2_nv(const lowp_quant_job *j, int64_t r0, int64_t r1);
/* NV16's grouped columnwise copy on AVX2 under RNE, as lowp_cpu_quant_grouped_avx512_nv. */
LOWP_HIDDEN void lowp_cpu_quant_grouped_avx2_nv(const lowp_quant_job *j, int64_t c0, int64_t c1);

/* Whether the job quantizes binary32 or BF16 input to E4M3 or E5M2 with a scaling of
 * lowp_quantize's (the jobs both fast kernels take; the AVX-512 one takes E2M1 MX32 too). */
static inline int lowp_quant_job_fp8(const lowp_quant_job *j) {
    if (j->xfmt != LOWP_FORMAT_F32 && j->xfmt != LOWP_FORMAT_BF16) return 0;
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

/* Element x[r][c] of a job's input as binary32 (exact for BF16). */
static inline float lowp_job_x(const lowp_quant_job *j, int64_t r, int64_t c) {
    size_t i = (size_t) r * (size_t) j->cols + (size_t) c;
    if (j->xfmt == LOWP_FORMAT_BF16) return lowp_u2f((uint32_t) ((const uint16_t *) j->x)[i] << 16);
    return ((const float *) j->x)[i];
}

#endif
