/* The CPU GEMM kernels' interface. The ops layer (src/ops/gemm.c) validates and classifies
 * the operand pair; the dispatcher (src/cpu/gemm.c) turns a GEMM, a split-M group or a split-K
 * group into jobs over row ranges and runs them on the threads. */
#ifndef LOWP_GEMM_KERNELS_H
#define LOWP_GEMM_KERNELS_H

#include "core/gemm_pair.h"
#include "core/internal.h"
#include "lowp/gemm.h"

/* What a thread's workspace holds packed (gemm_blk.c): the B block a job left there, so that
 * the next job on the same thread with the same B block (a piece of the same GEMM along m)
 * uses it instead of packing it again. Valid within one run of a job list. */
typedef struct lowp_gemm_pack_tag {
    int valid;
    const void *kern;
    const lowp_qtensor *b;
    int b_kn;
    int64_t nb0, ncols, nc, k0, k1, b_blk;
} lowp_gemm_pack_tag;

typedef struct lowp_gemm_job {
    const lowp_qtensor *a; /* [*, Ka] */
    const lowp_qtensor *b; /* [*, Kb], or with b_kn [Kb, *]: element (n, k) stored at (k, n) */
    int b_kn;
    lowp_tensor *c;
    lowp_gemm_pair pair;
    int64_t bk;           /* K block of the pair: 32, 128, or 0 (no blocks) */
    int64_t m0, m1;       /* rows of a to compute */
    int64_t n0, n1;       /* rows of b to compute (b_kn: columns) */
    int64_t k0, k1;       /* contraction range (columns of a and b; b_kn: rows of b) */
    int64_t a_blk, b_blk; /* scale-block index of column k0 in a's and b's scale rows */
    int64_t c_row_base;   /* C element of (m, n) is c[(c_row_base + m) * c->cols + n] */
    int accumulate;
    float *ws;               /* workspace of lowp_gemm_ref_ws_floats(job) floats */
    lowp_gemm_pack_tag *tag; /* this thread's workspace tag (NULL: pack every B block) */
} lowp_gemm_job;

/* Workspace the reference needs for a job (decoded A row and a panel of B rows). */
#define LOWP_GEMM_REF_PANEL 64
static inline size_t lowp_gemm_ref_ws_floats(const lowp_gemm_job *j) {
    return (size_t) (LOWP_GEMM_REF_PANEL + 1) * (size_t) (j->k1 - j->k0);
}

LOWP_HIDDEN void lowp_cpu_gemm_ref(const lowp_gemm_job *j);

/* The reference's element and scale readers (gemm_ref.c), shared with the AVX2 kernel. */
/* lut[c] = the value of code c of an 8-bit (or 4-bit) format f; nothing for wider formats. */
LOWP_HIDDEN void lowp_gemm_decode_lut(lowp_format f, float lut[256]);
/* out[i] = element (r, k0 + i) of q for k0 + i < k1, exactly (codes only, no scales). */
LOWP_HIDDEN void lowp_gemm_decode_row(const lowp_qtensor *q, int64_t r, int64_t k0, int64_t k1,
                                      const float *lut, float *out);
/* Scale of operand q's row r for K-block `blk` (binary32 kinds: TENSOR, ROW, BLOCK128,
 * BLOCK128X128; nb scale blocks a row); kn: q is given [K, N] and r is its column, so a
 * 128x128 tile's scale is found with the roles of the indices swapped. */
LOWP_HIDDEN float lowp_gemm_scale_f32(const lowp_qtensor *q, int kn, int64_t r, int64_t blk,
                                      int64_t nb);
/* E8M0 code of operand q's row r for K-block `blk` (MX32, BLOCK32X32; kn as above). */
LOWP_HIDDEN uint8_t lowp_gemm_scale_e8m0(const lowp_qtensor *q, int kn, int64_t r, int64_t blk,
                                         int64_t nb);
/* E4M3 block scale code of NVFP4 operand q's row r for K-block `blk` (NV16, NV16X16; kn as
 * above), and q's binary32 tensor decode scale. */
LOWP_HIDDEN uint8_t lowp_gemm_scale_nv(const lowp_qtensor *q, int kn, int64_t r, int64_t blk,
                                       int64_t nb);
LOWP_HIDDEN float lowp_gemm_tensor_dec_nv(const lowp_qtensor *q);

/* Whether a binary32 FMA sum over K of products of elements whose largest biased exponents are
 * ea and eb may differ from the reference's rounded multiply and add beyond rounding: when
 * products or sums could overflow (a product rounded to Inf there, Inf - Inf = NaN) or reach
 * the denormals. */
static inline int lowp_gemm_fma_needs_seq(int ea, int eb, int64_t K) {
    int lg = 0;
    while (((int64_t) 1 << lg) < K) lg++;
    const int e = ea + eb;
    return e - 252 + lg >= 127 || e <= 152;
}

/* Fast kernels; supports() says which jobs they take, ws_floats() how much workspace. */
LOWP_HIDDEN int lowp_cpu_gemm_amx_supports(const lowp_gemm_job *j);
LOWP_HIDDEN size_t lowp_cpu_gemm_amx_ws_floats(const lowp_gemm_job *j);
LOWP_HIDDEN void lowp_cpu_gemm_amx(const lowp_gemm_job *j);
LOWP_HIDDEN int lowp_cpu_gemm_avx512_supports(const lowp_gemm_job *j);
LOWP_HIDDEN size_t lowp_cpu_gemm_avx512_ws_floats(const lowp_gemm_job *j);
LOWP_HIDDEN void lowp_cpu_gemm_avx512(const lowp_gemm_job *j);
LOWP_HIDDEN int lowp_cpu_gemm_avx2_supports(const lowp_gemm_job *j);
LOWP_HIDDEN size_t lowp_cpu_gemm_avx2_ws_floats(const lowp_gemm_job *j);
LOWP_HIDDEN void lowp_cpu_gemm_avx2(const lowp_gemm_job *j);

#endif
