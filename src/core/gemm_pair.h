/* Classification of a GEMM operand pair (docs/numerics.md section 6), shared by the ops layer,
 * which refuses unsupported pairs, and every backend's kernels. */
#ifndef LOWP_GEMM_PAIR_H
#define LOWP_GEMM_PAIR_H

#include "internal.h"
#include "lowp/scale.h"

/* How the scales of a pair combine along K. */
typedef enum lowp_gemm_pair {
    LOWP_PAIR_PLAIN = 0,     /* NONE x NONE: no scales */
    LOWP_PAIR_TENSOR = 1,    /* TENSOR x TENSOR: scale once at the end */
    LOWP_PAIR_ROW = 2,       /* ROW x ROW: scale once at the end, per row and column */
    LOWP_PAIR_MX = 3,        /* MX32 x MX32: 2^(eA+eB) per 32-block */
    LOWP_PAIR_MX_B32 = 4,    /* MX32 x BLOCK32X32: 2^(eA+eB) per 32-block, B per 32x32 tile */
    LOWP_PAIR_B128_W = 5,    /* BLOCK128 x BLOCK128X128: sA.sB per 128-block */
    LOWP_PAIR_B128_B128 = 6, /* BLOCK128 x BLOCK128: sA.sB per 128-block */
    LOWP_PAIR_NV = 7         /* NV16 / NV16X16 x NV16 / NV16X16 (E2M1): E4M3 sA.sB per 16-block,
                                the tensor decode scales once at the end */
} lowp_gemm_pair;

/* The pair of (a, b) and its K block (16, 32, 128, or 0 for none); LOWP_ERR_UNSUPPORTED with a
 * message naming both operands when the pair is not one lowp multiplies. */
LOWP_HIDDEN lowp_status lowp_gemm_classify(const char *fn, const lowp_qtensor *a,
                                           const lowp_qtensor *b, lowp_gemm_pair *pair,
                                           int64_t *bk);

#endif
