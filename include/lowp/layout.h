/* Scale layouts used by devices: the canonical E8M0 scale array of an MX32 / BLOCK32X32
 * qtensor (scale.h) converted to and from the cuBLAS / TransformerEngine swizzled layout and
 * the Ascend NPU pair layout. Pure byte shuffles on host memory. Implemented in
 * src/core/layout.c.
 */
#ifndef LOWP_LAYOUT_H
#define LOWP_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef __cplusplus
}
#endif
#endif
