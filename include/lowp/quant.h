/* Quantized tensors: scaling kinds, quantize, dequantize, amax, scale layouts, delayed scaling.
 *
 * A quantized tensor (lowp_qtensor) is a non-owning descriptor: element format, scaling kind,
 * logical shape, element codes, scales, device. Every recipe in lowp quantizes through
 * lowp_quantize; the rules are NUMERICS.md sections 3-5, and every kernel agrees with the
 * scalar reference bit for bit.
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
 *   lowp_quant_cfg_init(&cfg);              // RCEIL for MX, FLOOR for 32x32, eps 0
 *   lowp_quantize(&x, &row, &col, &cfg);
 *
 * Layouts. Codes are row-major [rows, cols] (E2M1 packed two per byte along the row, each
 * row starting on a byte). Scales are row-major in lowp's canonical layout:
 *
 *   kind             scale type            scale shape
 *   TENSOR           float32 scale_inv     [1, 1]
 *   ROW              float32 scale_inv     [rows, 1]
 *   MX32             uint8 E8M0            [rows, ceil(cols/32)]
 *   BLOCK128         float32 scale_inv     [rows, ceil(cols/128)]
 *   BLOCK128x128     float32 scale_inv     [ceil(rows/128), ceil(cols/128)]
 *   BLOCK32x32       uint8 E8M0            [ceil(rows/32), ceil(cols/32)]
 *   NONE             (no scales)           [0, 0]   plain F32/BF16 operand of a GEMM
 *
 * A grouped tensor (group_offs != NULL, for MoE weight gradients) is quantized along its
 * columns (the tokens) in blocks that restart at every group boundary: group g owns columns
 * [offs[g-1], offs[g]) and ceil(size_g / bs) blocks, the scale row holds the groups' blocks
 * one after the other ([rows, sum_g ceil(size_g/bs)]), and columns past offs[G-1] hold code 0.
 *
 * Orientation. The "columnwise" copy of X[R,C] is the rowwise quantization of X^T: a qtensor
 * of shape [C, R], so that both GEMM operands are K-major. For the 2-D tile kinds
 * (BLOCK128x128, BLOCK32x32) it is exactly the transpose of the rowwise copy, scales included.
 */
#ifndef LOWP_QUANT_H
#define LOWP_QUANT_H

#include "cast.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Append-only (stored in files). */
typedef enum lowp_scaling {
    LOWP_SCALING_TENSOR = 0,       /* one binary32 scale per tensor */
    LOWP_SCALING_ROW = 1,          /* one binary32 scale per row */
    LOWP_SCALING_MX32 = 2,         /* 1x32 blocks along the row, E8M0 scales (OCP MX) */
    LOWP_SCALING_BLOCK128 = 3,     /* 1x128 blocks, binary32 scale_inv (DeepSeek-V3 acts) */
    LOWP_SCALING_BLOCK128X128 = 4, /* 128x128 tiles, binary32 scale_inv (DeepSeek-V3 weights) */
    LOWP_SCALING_BLOCK32X32 = 5,   /* 32x32 tiles, E8M0 scale (Ascend NPU Block FP8) */
    LOWP_SCALING_NONE = 6,         /* not quantized: F32 or BF16 elements, no scales (GEMM) */
    LOWP_SCALING_COUNT
} lowp_scaling;

/* How an E8M0 scale is derived from a block's amax (NUMERICS.md section 3). */
typedef enum lowp_scale_mode {
    LOWP_SCALE_DEFAULT = 0, /* RCEIL for MX32, FLOOR for BLOCK32X32 */
    LOWP_SCALE_RCEIL = 1,
    LOWP_SCALE_FLOOR = 2,
    LOWP_SCALE_CEIL = 3,
    LOWP_SCALE_EVEN = 4,
} lowp_scale_mode;

typedef struct lowp_qtensor {
    lowp_format format; /* E4M3, E5M2, or E2M1 (MX32 only) */
    lowp_scaling scaling;
    int64_t rows; /* logical shape of this copy */
    int64_t cols; /* the quantized (reduction) dimension */
    void *data;   /* codes, see the layouts above */
    void *scales; /* E8M0 codes (uint8) or binary32 scale_inv */
    lowp_device device;
    const int32_t *group_offs; /* NULL, or G cumulative group ends along cols (host memory) */
    int32_t groups;            /* G when group_offs is set */
} lowp_qtensor;

/* Bytes of the element codes and of the scales of `q` (its format, scaling, shape, groups). */
LOWP_API lowp_status lowp_qtensor_nbytes(const lowp_qtensor *q, size_t *data_bytes,
                                         size_t *scale_bytes);
/* Shape of the canonical scale array; *scale_is_e8m0 tells uint8 E8M0 from binary32. */
LOWP_API lowp_status lowp_qtensor_scale_shape(const lowp_qtensor *q, int64_t *scale_rows,
                                              int64_t *scale_cols, int *scale_is_e8m0);
/* Block size of a scaling kind along the quantized dimension (1x32 -> 32; TENSOR and ROW:
 * the whole row, reported as 0). */
LOWP_API lowp_status lowp_scaling_block(lowp_scaling scaling, int64_t *block_rows,
                                        int64_t *block_cols);
LOWP_API lowp_status lowp_scaling_from_name(const char *name, lowp_scaling *out);
LOWP_API const char *lowp_scaling_name(lowp_scaling scaling);
LOWP_API lowp_status lowp_scale_mode_from_name(const char *name, lowp_scale_mode *out);

typedef struct lowp_quant_cfg {
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
} lowp_quant_cfg;

LOWP_API lowp_status lowp_quant_cfg_init(lowp_quant_cfg *cfg);

/* Quantize x (F32 or BF16, [R, C]) into a rowwise copy ([R, C]) and/or a columnwise copy
 * ([C, R], see above), from one read of x. Either output may be NULL, not both. Both outputs
 * must use the same format and scaling. */
LOWP_API lowp_status lowp_quantize(const lowp_tensor *x, lowp_qtensor *row_out,
                                   lowp_qtensor *col_out, const lowp_quant_cfg *cfg);

/* MoE weight gradients: quantize x [M, K] (tokens x features) into the columnwise copy
 * col_out [K, M] with col_out->group_offs/groups set (offs: int32, cumulative, non-decreasing,
 * offs[G-1] <= M). Scaling MX32 or BLOCK128: no block straddles a group boundary. */
LOWP_API lowp_status lowp_quantize_grouped(const lowp_tensor *x, lowp_qtensor *col_out,
                                           const lowp_quant_cfg *cfg);

/* Decode q into out (F32, same shape as q). */
LOWP_API lowp_status lowp_dequantize(const lowp_qtensor *q, lowp_tensor *out);

/* amax of x (F32 or BF16) at the granularity of `scaling`, into out (a float32 array with the
 * canonical scale shape of that kind for a [R, C] tensor). NaN wins over every number. */
LOWP_API lowp_status lowp_amax(const lowp_tensor *x, lowp_scaling scaling, float *out,
                               size_t out_count);

/* The E8M0 scale code of a block whose amax is `amax`, for element format `format`
 * (NUMERICS.md section 3, steps 1-3). */
LOWP_API lowp_status lowp_e8m0_scale(float amax, lowp_format format, lowp_scale_mode mode,
                                     uint8_t *code);
/* The binary32 scale of a group (NUMERICS.md section 4, steps 1-3). */
LOWP_API lowp_status lowp_fp32_scale(float amax, lowp_format format, float eps, int pow2,
                                     float *scale);

/* ---- Scale layouts used by devices ---- */

/* cuBLAS / TE "swizzled" MX scales: the canonical [srows, scols] E8M0 array, zero-padded to
 * [ceil(srows/128)*128, ceil(scols/4)*4], stored as 128x4 tiles in row-major tile order, each
 * tile as 32 rows of 16 bytes: element (r, c) of a tile at byte (r % 32) * 16 + (r / 32) * 4 + c.
 */
LOWP_API lowp_status lowp_scales_cublas_nbytes(int64_t srows, int64_t scols, size_t *out);
LOWP_API lowp_status lowp_scales_to_cublas(const uint8_t *canon, int64_t srows, int64_t scols,
                                           uint8_t *out, size_t out_bytes);
LOWP_API lowp_status lowp_scales_from_cublas(const uint8_t *swz, size_t swz_bytes, int64_t srows,
                                             int64_t scols, uint8_t *canon);

/* Ascend NPU pair layout (npu_dynamic_mx_quant's mxscale): the block axis is zero-padded to an
 * even count and split into pairs, trailing dimension 2. For a rowwise copy (quantized along
 * the last axis, canonical [srows, scols]) it is [srows, ceil(scols/2), 2]; for a columnwise
 * copy of X[M,N] (canonical [N, nbM]) the NPU keeps the input's orientation:
 * [ceil(nbM/2), N, 2]. */
typedef enum lowp_npu_axis {
    LOWP_NPU_AXIS_LAST = 0,  /* rowwise copy, axis = -1 */
    LOWP_NPU_AXIS_FIRST = 1, /* columnwise copy, axis = -2 */
} lowp_npu_axis;
LOWP_API lowp_status lowp_scales_npu_nbytes(int64_t srows, int64_t scols, size_t *out);
LOWP_API lowp_status lowp_scales_to_npu(const uint8_t *canon, int64_t srows, int64_t scols,
                                        lowp_npu_axis axis, uint8_t *out, size_t out_bytes);
LOWP_API lowp_status lowp_scales_from_npu(const uint8_t *npu, size_t npu_bytes, int64_t srows,
                                          int64_t scols, lowp_npu_axis axis, uint8_t *canon);

/* ---- Delayed scaling (NUMERICS.md section 5, TE DelayedScaling) ---- */

typedef enum lowp_amax_algo {
    LOWP_AMAX_MAX = 0,         /* max over the whole history */
    LOWP_AMAX_MOST_RECENT = 1, /* row 0 */
} lowp_amax_algo;

typedef struct lowp_delayed_cfg {
    lowp_format format;  /* E4M3 or E5M2: fmax */
    int32_t history_len; /* >= 1, default 1024 */
    float margin;        /* default 0 */
    lowp_amax_algo algo; /* default MAX */
} lowp_delayed_cfg;

/* State of one quantized tensor role. The caller owns `history` (history_len floats). */
typedef struct lowp_delayed_state {
    lowp_delayed_cfg cfg;
    float *history; /* row 0 is the staging slot the current step writes */
    float scale;
    float scale_inv;
} lowp_delayed_state;

LOWP_API lowp_status lowp_delayed_cfg_init(lowp_delayed_cfg *cfg, lowp_format format);
/* Zero the history, scale = scale_inv = 1. */
LOWP_API lowp_status lowp_delayed_init(lowp_delayed_state *st, const lowp_delayed_cfg *cfg,
                                       float *history);
/* Record this step's amax into row 0 (keeps the max of what row 0 holds; NaN sticks). */
LOWP_API lowp_status lowp_delayed_record(lowp_delayed_state *st, float amax);
/* The update of NUMERICS.md section 5 (after amaxes are recorded and reduced). */
LOWP_API lowp_status lowp_delayed_update(lowp_delayed_state *st);

#ifdef __cplusplus
}
#endif
#endif
