/* The random Hadamard transform of the FP4 recipes (docs/numerics.md 4b): each contiguous
 * 16-element block of a row of x becomes H16 . diag(s) . block / 4, H16 the 16x16 Sylvester
 * Hadamard matrix and s a +-1 sign vector from one Philox word, in binary32 with a fixed order
 * of operations, so every device gives the same bits. The training layer applies it along the
 * tokens to both operands of the weight-gradient GEMM (lowp_linear_cfg.wgrad_hadamard), with
 * the same signs, before their quantization: the transform is orthogonal per block, so the
 * product is unchanged up to rounding. Implemented in src/ops/hadamard.c (host tensors).
 *
 *   // dY^T [N, T] and X^T [K, T], binary32: the wgrad GEMM's operands, K = T (tokens)
 *   lowp_hadamard_cfg hc;
 *   lowp_hadamard_cfg_init(&hc);
 *   hc.seed = seed;                          // the sign word: word `offset` of stream `seed`
 *   hc.offset = offset;
 *   lowp_tensor a = {LOWP_FORMAT_F32, N, T, dyt, LOWP_DEVICE_HOST};
 *   lowp_tensor ha = {LOWP_FORMAT_F32, N, T, dyt_h, LOWP_DEVICE_HOST};
 *   lowp_hadamard16(&a, &ha, &hc);           // then the same for X^T, then quantize both
 *
 * The exact rule per block x[0..15]: t_i = s_i * x_i (s_i = -1 where bit i of the word is
 * set); four butterfly stages h = 1, 2, 4, 8: for every i with (i & h) == 0,
 * (t_i, t_{i+h}) = (t_i + t_{i+h}, t_i - t_{i+h}), each a rounded binary32 add or subtract;
 * y_i = t_i * 0.25f. A partial last block (cols % 16 != 0) is copied unchanged. NaN and Inf
 * propagate as IEEE arithmetic does (a block holding a NaN becomes all NaN).
 */
#ifndef LOWP_HADAMARD_H
#define LOWP_HADAMARD_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lowp_hadamard_cfg {
    uint64_t seed;   /* the sign word is word `offset` of Philox stream `seed` (rng.h) */
    uint64_t offset; /* one word per call: the caller advances its state by 1 */
    /* NULL: blocks start at column 0. Else the columns are tokens split into `groups` groups
     * (int32, cumulative ends, non-decreasing, offs[groups-1] <= cols, as lowp_quantize_grouped
     * takes them): each group's blocks start at its first column, a group's short last block
     * and the columns past offs[groups-1] are copied unchanged. */
    const int32_t *group_offs;
    int32_t groups;
    int32_t threads; /* 0: all cores */
} lowp_hadamard_cfg;

LOWP_API lowp_status lowp_hadamard_cfg_init(lowp_hadamard_cfg *cfg); /* seed 0, offset 0 */

/* y [rows, cols] (F32) = the transform of x [rows, cols] (F32, or BF16 widened exactly) along
 * its rows. Host tensors; y may not overlap x. cfg NULL: the defaults. */
LOWP_API lowp_status lowp_hadamard16(const lowp_tensor *x, lowp_tensor *y,
                                     const lowp_hadamard_cfg *cfg);

#ifdef __cplusplus
}
#endif
#endif
