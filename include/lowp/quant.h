/* Quantize, dequantize and amax: the entry points that turn a high-precision tensor into a
 * lowp_qtensor (scale.h) and back. Every recipe in lowp quantizes through lowp_quantize; the
 * rules are docs/numerics.md sections 3-5 (NVFP4: 4b), and every kernel agrees with the scalar
 * reference bit for bit. Implemented in src/ops/quant.c (argument checks, backend dispatch); the
 * CPU kernels are src/cpu/quant*.c. Scale layouts of devices are layout.h, delayed scaling
 * delayed.h.
 *
 *   // X[M,K] float32 -> MXFP8 rowwise copy (for the forward GEMM) and columnwise copy
 *   // (X^T [K,M] quantized along M, for the weight-gradient GEMM), from one read of X.
 *   lowp_tensor x = {LOWP_FORMAT_F32, M, K, xdata, LOWP_DEVICE_HOST};
 *   lowp_qtensor row = {LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, M, K};
 *   lowp_qtensor col = {LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, K, M};
 *   size_t db, sb;
 *   lowp_qtensor_nbytes(&row, &db, &sb);   // allocate row.data (db) and row.scales (sb)
 *   ...
 *   lowp_quant_cfg cfg;
 *   lowp_quant_cfg_init(&cfg);              // RCEIL for MX, FLOOR for 32x32, eps 0, RNE
 *   lowp_quantize(&x, &row, &col, &cfg);
 *
 * Aliasing: no output buffer (data or scales of row_out, col_out; out of lowp_dequantize) may
 * overlap an input buffer or another output; such calls return LOWP_ERR_INVALID_ARG.
 */
#ifndef LOWP_QUANT_H
#define LOWP_QUANT_H

#include "cast.h"
#include "scale.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lowp_quant_cfg {
    /* NV16 and NV16X16 (NVFP4) take none of scale_mode, pow2_scales, eps and scale: their rules
     * have no options (docs/numerics.md 4b). */
    lowp_scale_mode scale_mode; /* E8M0 kinds; default per kind */
    int32_t pow2_scales;        /* binary32 kinds: -1 default (on for ROW, off otherwise), 0, 1 */
    float eps;                  /* binary32 kinds: amax floor, default 0 */
    /* TENSOR only: when non-NULL, quantize with this scale (delayed scaling) instead of one
     * computed from the amax; *scale must be finite and > 0. */
    const float *scale;
    /* TENSOR only: when non-NULL, receives the tensor's amax (NaN if any element is NaN). */
    float *amax_out;
    int32_t threads;       /* 0: all cores */
    lowp_kernel_path path; /* AUTO, REFERENCE or AVX512 */
    /* Element rounding: RNE (default) or SR (E2M1 elements of NV16, NV16X16 and MX32 only;
     * scales are computed as with RNE). SR: element i of a copy (its row-major index in the
     * copy's own [rows, cols]) uses word offset + i of Philox stream seed (rng.h). */
    lowp_rounding rounding;
    uint64_t seed;   /* SR: Philox key */
    uint64_t offset; /* SR: the first Philox word used */
} lowp_quant_cfg;

LOWP_API lowp_status lowp_quant_cfg_init(lowp_quant_cfg *cfg);

/* Quantize x (F32 or BF16, [R, C]) into a rowwise copy ([R, C]) and/or a columnwise copy
 * ([C, R], see above), from one read of x. Either output may be NULL, not both. Both outputs
 * must use the same format and scaling. */
LOWP_API lowp_status lowp_quantize(const lowp_tensor *x, lowp_qtensor *row_out,
                                   lowp_qtensor *col_out, const lowp_quant_cfg *cfg);

/* MoE experts' inputs: quantize x [M, K] (tokens x features) into the grouped columnwise copy
 * col_out [K, M] (for the weight-gradient GEMM) with col_out->group_offs/groups set (offs:
 * int32, cumulative, non-decreasing, offs[G-1] <= M) and, when row_out is not NULL, the
 * rowwise copy row_out [M, K] (for the forward GEMM, no group_offs), from one read of x, as
 * lowp_quantize does for an ungrouped pair. Scaling MX32, BLOCK128 or NV16, the same in both:
 * no block of col_out straddles a group boundary (NV16's tensor scale of col_out is that of the
 * tokens in groups, rows [0, offs[G-1]) of x; row_out's is that of all of x). Each output has
 * the bytes that lowp_quantize(x, row_out, NULL) and a grouped call without row_out give.
 *
 *   lowp_qtensor row = {LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, M, K};
 *   lowp_qtensor col = {LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, K, M};
 *   col.group_offs = offs;                  // offs[G]: the end row of each expert's tokens
 *   col.groups = G;
 *   ...                                     // buffers as above (lowp_qtensor_nbytes)
 *   lowp_quantize_grouped(&x, &row, &col, &cfg);
 */
LOWP_API lowp_status lowp_quantize_grouped(const lowp_tensor *x, lowp_qtensor *row_out,
                                           lowp_qtensor *col_out, const lowp_quant_cfg *cfg);

/* Decode q into out (F32, same shape as q). */
LOWP_API lowp_status lowp_dequantize(const lowp_qtensor *q, lowp_tensor *out);

/* amax of x (F32 or BF16) at the granularity of `scaling`, into out (a float32 array with the
 * canonical scale shape of that kind for a [R, C] tensor). NaN wins over every number. */
LOWP_API lowp_status lowp_amax(const lowp_tensor *x, lowp_scaling scaling, float *out,
                               size_t out_count);

#ifdef __cplusplus
}
#endif
#endif
