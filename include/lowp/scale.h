/* Scaling kinds, the quantized-tensor descriptor (lowp_qtensor) and its sizes, and the scalar
 * scale rules (docs/numerics.md sections 3 and 4). Implemented in src/core/scale.c, on the
 * shared rules of src/core/scale_rules.h that every kernel uses.
 *
 * A quantized tensor is a non-owning descriptor: element format, scaling kind, logical shape,
 * element codes, scales, device. Sizes come from lowp_qtensor_nbytes, never from callers'
 * arithmetic.
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
#ifndef LOWP_SCALE_H
#define LOWP_SCALE_H

#include <stddef.h>
#include <stdint.h>

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
    LOWP_SCALING_NV16 = 7,         /* NVFP4: 1x16 blocks, E4M3 scales, binary32 tensor scale */
    LOWP_SCALING_NV16X16 = 8,      /* NVFP4 weights: 16x16 tiles, E4M3 scale, tensor scale */
    LOWP_SCALING_COUNT
} lowp_scaling;

/* How an E8M0 scale is derived from a block's amax (docs/numerics.md section 3). */
typedef enum lowp_scale_mode {
    LOWP_SCALE_MODE_DEFAULT = 0, /* RCEIL for MX32, FLOOR for BLOCK32X32 */
    LOWP_SCALE_MODE_RCEIL = 1,
    LOWP_SCALE_MODE_FLOOR = 2,
    LOWP_SCALE_MODE_CEIL = 3,
    LOWP_SCALE_MODE_EVEN = 4,
} lowp_scale_mode;

typedef struct lowp_qtensor {
    lowp_format format; /* E4M3, E5M2, or E2M1 (MX32, NV16, NV16X16) */
    lowp_scaling scaling;
    int64_t rows; /* logical shape of this copy */
    int64_t cols; /* the quantized (reduction) dimension */
    void *data;   /* codes, see the layouts above */
    void *scales; /* E8M0 codes (uint8) or binary32 scale_inv */
    lowp_device device;
    const int32_t *group_offs; /* NULL, or G cumulative group ends along cols (host memory) */
    int32_t groups;            /* G when group_offs is set */
} lowp_qtensor;

/* The traits of a scaling kind, one row of the table in src/core/scale.c that every rule about
 * kinds reads (the Python package exports it, lowp._lowp.tables()). */
typedef struct lowp_scaling_traits {
    lowp_scaling scaling;
    const char *name;   /* "tensor", "mx32", ... as on the command line */
    int64_t block_rows; /* scale block along the rows: 1, 32 or 128 (0: the whole tensor) */
    int64_t block_cols; /* along the quantized dimension: 32 or 128 (0: the whole row) */
    int scale_is_e8m0;  /* 1: uint8 E8M0 scales; 0: binary32 scale_inv, E4M3 or none */
    int grouped;        /* 1: a grouped copy (group_offs) restarts its blocks at every group */
    int transposes;     /* 1: the copy of X^T is the copy of X transposed, scales included
                           (lowp_gemm_kn can read the copy of X as stored) */
    lowp_scale_mode default_mode; /* what LOWP_SCALE_MODE_DEFAULT means (E8M0 kinds) */
    int default_pow2;             /* what pow2_scales = -1 means (binary32 kinds) */
    lowp_format scale_format;     /* of the block scales: E8M0, F32 (scale_inv) or E4M3 */
    int tensor_scale;             /* 1: a binary32 tensor decode scale follows (NVFP4) */
} lowp_scaling_traits;

/* The traits of `scaling`; *out points into a static table. */
LOWP_API lowp_status lowp_scaling_get(lowp_scaling scaling, const lowp_scaling_traits **out);
/* "default", "rceil", "floor", "ceil", "even"; "?" for a value that is no lowp_scale_mode. */
LOWP_API const char *lowp_scale_mode_name(lowp_scale_mode mode);

/* Bytes of the element codes and of the scales of `q` (its format, scaling, shape, groups). */
LOWP_API lowp_status lowp_qtensor_nbytes(const lowp_qtensor *q, size_t *data_bytes,
                                         size_t *scale_bytes);
/* Byte offset of the binary32 tensor decode scale in q->scales (NV16, NV16X16: the block
 * scales' bytes rounded up to a multiple of 4); LOWP_ERR_INVALID_ARG for the other kinds. */
LOWP_API lowp_status lowp_qtensor_tensor_scale_offset(const lowp_qtensor *q, size_t *offset);
/* Shape of the canonical scale array; *scale_is_e8m0 tells uint8 E8M0 from the others (the
 * traits' scale_format tells binary32 from E4M3). */
LOWP_API lowp_status lowp_qtensor_scale_shape(const lowp_qtensor *q, int64_t *scale_rows,
                                              int64_t *scale_cols, int *scale_is_e8m0);
/* Block size of a scaling kind along the quantized dimension (1x32 -> 32; TENSOR and ROW:
 * the whole row, reported as 0). */
LOWP_API lowp_status lowp_scaling_block(lowp_scaling scaling, int64_t *block_rows,
                                        int64_t *block_cols);
LOWP_API lowp_status lowp_scaling_from_name(const char *name, lowp_scaling *out);
LOWP_API const char *lowp_scaling_name(lowp_scaling scaling);
LOWP_API lowp_status lowp_scale_mode_from_name(const char *name, lowp_scale_mode *out);

/* The E8M0 scale code of a block whose amax is `amax`, for element format `format`
 * (docs/numerics.md section 3, steps 1-3). */
LOWP_API lowp_status lowp_e8m0_scale(float amax, lowp_format format, lowp_scale_mode mode,
                                     uint8_t *code);
/* NVFP4 (docs/numerics.md section 4b): the binary32 tensor encode scale of a tensor whose amax
 * is `amax`, and the E4M3 code of a block whose amax is `block_amax` under that encode scale. */
LOWP_API lowp_status lowp_nvfp4_tensor_scale(float amax, float *encode_scale);
LOWP_API lowp_status lowp_nvfp4_block_scale(float block_amax, float encode_scale, uint8_t *code);
/* The binary32 scale of a group (docs/numerics.md section 4, steps 1-3). */
LOWP_API lowp_status lowp_fp32_scale(float amax, lowp_format format, float eps, int pow2,
                                     float *scale);

#ifdef __cplusplus
}
#endif
#endif
