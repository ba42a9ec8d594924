/* Low-precision GEMM and grouped GEMM (docs/numerics.md section 6). Implemented in
 * src/ops/gemm.c (checks and backend dispatch; the operand pairs it accepts are
 * src/core/gemm_pair.c); the CPU kernels are src/cpu/gemm*.c.
 *
 *   C[M,N] = A[M,K] . B[N,K]^T      both operands K-major (quantized along K)
 *
 * Operands are lowp_qtensor descriptors: quantized (E4M3/E5M2/E2M1 codes plus scales) or plain
 * (format F32 or BF16 with scaling LOWP_SCALING_NONE and no scales). The supported pairs
 * (A scaling x B scaling):
 *
 *   NONE x NONE            F32 x F32 or BF16 x BF16 (the baselines)
 *   TENSOR x TENSOR        E4M3/E5M2 in any combination (E5M2 x E4M3 is the HYBRID dgrad)
 *   ROW x ROW              E4M3/E5M2
 *   MX32 x MX32            E4M3, E5M2, E2M1 elements
 *   BLOCK128 x BLOCK128X128   DeepSeek-V3 forward and dgrad (activation 1x128, weight 128x128)
 *   BLOCK128 x BLOCK128       DeepSeek-V3 wgrad
 *   MX32 x BLOCK32X32      NPU Block FP8 weights with MX activations
 *   NV16 or NV16X16 x NV16 or NV16X16   NVFP4, E2M1 elements (activations 1x16, weights 16x16;
 *                          on the CPU's AMX, AVX-512 and AVX2 kernels)
 *
 * cfg.b_layout = LOWP_LAYOUT_KN takes B in its stored [K, N] orientation instead (the kinds
 * whose scales do not depend on the orientation), as TransformerEngine's transb; one grouped
 * entry, lowp_grouped_gemm, runs split-M (cfg.split = LOWP_GROUPED_SPLIT_M, the default) or split-K
 * (LOWP_GROUPED_SPLIT_K). The former twins (lowp_gemm_kn, lowp_grouped_gemm_kn,
 * lowp_grouped_gemm_wgrad, lowp_grouped_gemm_wgrad_kn) stay one release in deprecated.h.
 *
 * Any other pair is LOWP_ERR_UNSUPPORTED, never a silent fallback. C may not overlap the data
 * or scales of any operand (LOWP_ERR_INVALID_ARG); with accumulate, C is read and written.
 *
 *   lowp_gemm_cfg cfg;
 *   lowp_gemm_cfg_init(&cfg);                 // F32 output, overwrite C, fastest kernel
 *   lowp_tensor c = {LOWP_FORMAT_F32, M, N, cdata, LOWP_DEVICE_HOST};
 *   lowp_gemm(&a, &b, &c, &cfg);
 */
#ifndef LOWP_GEMM_H
#define LOWP_GEMM_H

#include "quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How B is laid out (lowp_gemm_cfg.b_layout). NK: b's rows run along the output columns and
 * its columns along the contraction (C = A . B^T); KN: B as stored, its rows along the
 * contraction (C = A . B). b's scaling must then be one whose copy of B^T is the transpose of
 * its copy: NONE (F32 or BF16), TENSOR, BLOCK128X128, BLOCK32X32 or NV16X16; the split-K GEMM
 * takes NONE or TENSOR only (other kinds: LOWP_ERR_UNSUPPORTED; quantize a columnwise copy and
 * use NK). The result has the bits of the NK call on that transposed copy. */
typedef enum lowp_gemm_layout {
    LOWP_LAYOUT_NK = 0,
    LOWP_LAYOUT_KN = 1,
} lowp_gemm_layout;

/* Which grouped GEMM lowp_grouped_gemm runs (lowp_gemm_cfg.split). */
typedef enum lowp_grouped_split {
    LOWP_GROUPED_SPLIT_M = 0, /* MoE forward and dgrad: row groups of A and C, a B per group */
    LOWP_GROUPED_SPLIT_K = 1, /* MoE weight gradient: groups of the contraction, a C block each */
} lowp_grouped_split;

typedef struct lowp_gemm_cfg {
    int32_t accumulate;    /* 0: C = A.B^T; 1: C = C + A.B^T (weight-gradient accumulation) */
    int32_t threads;       /* 0: all cores */
    lowp_kernel_path path; /* LOWP_ERR_UNSUPPORTED when a forced path cannot run here */
    int32_t b_layout;      /* a lowp_gemm_layout; 0 (NK) by default */
    int32_t split;         /* a lowp_grouped_split, for lowp_grouped_gemm; 0 (split-M) by default */
} lowp_gemm_cfg;

LOWP_API lowp_status lowp_gemm_cfg_init(lowp_gemm_cfg *cfg);

/* C = A . B^T (+ C). a: [M, K], b: [N, K] (b_layout KN: [K, N]), c: [M, N] of format F32 or
 * BF16 (rounded RNE at the end; with accumulate, the old C is read in c's format and added in
 * binary32 first). cfg.split must be LOWP_GROUPED_SPLIT_M (0). */
LOWP_API lowp_status lowp_gemm(const lowp_qtensor *a, const lowp_qtensor *b, lowp_tensor *c,
                               const lowp_gemm_cfg *cfg);

/* Grouped GEMM. cfg.split = LOWP_GROUPED_SPLIT_M (MoE forward and dgrad), torch._grouped_mm
 * semantics: offs is int32, length G, cumulative group ends along M; group g owns rows
 * [offs[g-1], offs[g]) of a and c (offs[-1] = 0) and multiplies them by b[g] ([N, K], or [K, N]
 * with b_layout KN; one descriptor per expert). Empty groups are allowed; rows of c past
 * offs[G-1] are left untouched.
 *
 * cfg.split = LOWP_GROUPED_SPLIT_K (MoE weight gradient): dW[g] = dY^T[:, rows_g] . X[rows_g] for
 * every group, contracting over each group's tokens; b is one descriptor. a = dY^T [N, M] and
 * b = X^T [K, M] are the columnwise copies (for MX32 and BLOCK128, quantized with
 * lowp_quantize_grouped over the same offs, so no block straddles a group); with b_layout KN,
 * b = X as stored, [M, K]. c is [G * N, K], group g's dW in rows [g*N, (g+1)*N). An empty group
 * gives dW[g] = 0 (or leaves it unchanged with accumulate). */
LOWP_API lowp_status lowp_grouped_gemm(const lowp_qtensor *a, const lowp_qtensor *b,
                                       const int32_t *offs, int32_t groups, lowp_tensor *c,
                                       const lowp_gemm_cfg *cfg);

/* LOWP_OK when lowp_gemm multiplies the pair a x b (their formats and scalings: one of the pairs
 * above; shapes and buffers are not looked at), else LOWP_ERR_UNSUPPORTED naming both. */
LOWP_API lowp_status lowp_gemm_pair_check(const lowp_qtensor *a, const lowp_qtensor *b);

#ifdef __cplusplus
}
#endif

#include "deprecated.h" /* the GEMM twins, one more release */
#endif
