/* Plain tensors: a non-owning descriptor of a 2-D row-major array on a device. Implemented in
 * src/core/tensor.c.
 *
 *   float host[6] = {...};
 *   lowp_tensor x = {LOWP_FORMAT_F32, 2, 3, host, LOWP_DEVICE_HOST};
 *   size_t bytes;
 *   lowp_tensor_nbytes(&x, &bytes);       // 24
 *
 * E2M1 rows are packed two codes per byte (element 2i in the low nibble), each row starting
 * on a byte boundary: a row takes (cols + 1) / 2 bytes. Every other format takes
 * bits / 8 bytes per element. Sizes come from lowp_tensor_nbytes, never from callers'
 * arithmetic. A 1-D array is a tensor with rows = 1. When an E2M1 row has an odd length, the
 * high nibble of its last byte is padding, and every lowp writer sets it to 0.
 */
#ifndef LOWP_TENSOR_H
#define LOWP_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "device.h"
#include "format.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lowp_tensor {
    lowp_format format;
    int64_t rows; /* >= 0 */
    int64_t cols; /* >= 0 */
    void *data;   /* rows x row_bytes bytes on `device` */
    lowp_device device;
} lowp_tensor;

/* Bytes of one row of `cols` elements of `format`. */
LOWP_API lowp_status lowp_row_nbytes(lowp_format format, int64_t cols, size_t *out);

/* Bytes of the whole tensor (rows x row bytes); checks the shape and overflow. */
LOWP_API lowp_status lowp_tensor_nbytes(const lowp_tensor *t, size_t *out);

#ifdef __cplusplus
}
#endif
#endif
