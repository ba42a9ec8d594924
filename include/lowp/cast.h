/* Bulk element conversion: encode F32 or BF16 arrays into any format, or decode any format
 * back to F32, on the device that holds the tensors. Implemented in src/ops/cast.c (checks
 * and backend dispatch); the CPU kernels are src/cpu/cast*.c.
 *
 *   lowp_tensor src = {LOWP_FORMAT_F32, rows, cols, x, LOWP_DEVICE_HOST};
 *   lowp_tensor dst = {LOWP_FORMAT_E4M3, rows, cols, codes, LOWP_DEVICE_HOST};
 *   lowp_cast_cfg cfg;
 *   lowp_cast_cfg_init(&cfg);   // RNE, each format's overflow rule, automatic path
 *   lowp_status st = lowp_cast(&src, &dst, &cfg);
 *
 * Allowed pairs: F32 -> any format; BF16 -> any 8- or 4-bit format and F16; any format -> F32.
 * Results equal the scalar reference (lowp_encode / lowp_decode) bit for bit on every path.
 *
 * dst may not overlap src (LOWP_ERR_INVALID_ARG): a cast is never in place.
 *
 * Stochastic rounding draws one 32-bit Philox word per element: element i (row-major index
 * r * cols + c) uses word offset + i of the stream (seed), see rng.h.
 */
#ifndef LOWP_CAST_H
#define LOWP_CAST_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lowp_cast_cfg {
    lowp_overflow
        overflow; /* default LOWP_OVERFLOW_DEFAULT: IEEE Inf for BF16/F16, else satfinite */
    lowp_rounding rounding; /* default LOWP_ROUNDING_RNE */
    uint64_t seed;          /* SR: Philox key */
    uint64_t offset;        /* SR: index of the first Philox word used */
    int32_t threads;        /* 0: all cores; otherwise that many threads */
    lowp_kernel_path path;  /* default LOWP_KERNEL_PATH_AUTO */
} lowp_cast_cfg;

LOWP_API lowp_status lowp_cast_cfg_init(lowp_cast_cfg *cfg);

/* Convert src into dst (same shape, same device). cfg may be NULL for the defaults. */
LOWP_API lowp_status lowp_cast(const lowp_tensor *src, lowp_tensor *dst, const lowp_cast_cfg *cfg);

#ifdef __cplusplus
}
#endif
#endif
