/* The blocked BF16 GEMM driver shared by the AMX and AVX-512 BF16 kernels (gemm_blk.c).
 *
 * Every pair but F32 x F32 runs on BF16 arithmetic: FP8 and FP4 codes decode exactly into
 * BF16, so a product of two elements is exact in binary32 and only the summation order
 * differs from the reference. The driver, per job:
 *
 *   for each block of NC columns of C (NC from the kernel's B budget):
 *       pack the B rows of the block into 32-column panels, VNNI layout (below)
 *       for each strip of 32 rows of A:
 *           decode the strip into the A layout (below)
 *           for each panel: micro-kernel over K (or per K block), epilogue into C
 *
 * Layouts (uint16 BF16 bits, K padded with zeros to a multiple of 32, "kt" = 32 K):
 *   A strip: [kt][32 rows][32 k]                    (an AMX A tile is 16 rows of it)
 *   B panel: [kt][2 halves of 16 columns][16 k-pairs][16 columns][2 k]
 *            (an AMX B tile is one half: row p holds (B[n][2p], B[n][2p+1]) for 16 n)
 * Both layouts give VDPBF16PS its operands directly: a 32-bit broadcast of an A pair and
 * a 64-byte row of a B half.
 *
 * Accuracy (docs/numerics.md section 6): AMX and VDPBF16PS read BF16 denormals as zero and flush
 * binary32 denormal results. FP8/FP4 values and products are far from that range; MX block
 * scales are folded into the decoded elements only while every exponent of a strip (panel)
 * lies within FOLD_SPAN of a centre (then no folded value or product is denormal), else the
 * tile is computed block by block with the scale applied in binary32. NVFP4's E4M3 block scales
 * are always folded (E2M1 x E4M3 is exact in BF16 and normal; the tensor scales come last), so
 * its tiles sum all of K: bound (K + 6) u |A||B|^T, not the reference's. Plain BF16 tiles that
 * hold denormals, Inf or NaN, or whose products could all be tiny or could overflow, use
 * micro_exact: the reference's operation sequence (a rounded multiply and add per product,
 * in k order) on the same layouts, so that Inf - Inf and flushed products cannot differ. */
#ifndef LOWP_GEMM_BLK_H
#define LOWP_GEMM_BLK_H

#include "gemm_kernels.h"

#define LOWP_BLK_KT       32   /* K per tile step */
#define LOWP_BLK_ROWS     32   /* rows of an A strip, and columns of a B panel */
#define LOWP_BLK_TILE_U16 1024 /* uint16 of one kt of a strip or of a panel */

/* P[r][c] (rows r0 <= r < r0 + mr, all 32 columns; row stride 32 floats) = the dot products
 * of strip rows and panel columns over `nkt` K tiles starting at `a` and `b`. */
typedef void (*lowp_gemm_micro_fn)(const uint16_t *a, const uint16_t *b, int64_t nkt, int r0,
                                   int mr, float *p);

typedef struct lowp_gemm_blk_kernel {
    lowp_gemm_micro_fn micro;       /* the fast kernel (DAZ/FTZ arithmetic allowed) */
    lowp_gemm_micro_fn micro_exact; /* the reference's sequence, for tiles micro could miss */
    int rows_align;                 /* micro's row granularity: 32 (AMX: whole tiles) or 4 */
    size_t b_budget_bytes;          /* bytes of packed B per column block */
    /* Columns of a B block at least (0: 32), above the budget when K is large: every B block
     * decodes each A strip again, so a narrow block (128 columns at K = 4096 on a 1 MiB
     * budget) spends an eighth of the GEMM decoding A. */
    int64_t min_cols;
    /* 0, or bytes: when all of a job's columns fit in this much packed B, one block takes them
     * all, above the budget (a second block would decode every A strip again). */
    size_t whole_n_bytes;
} lowp_gemm_blk_kernel;

/* Workspace (floats) of a job on kernel k, with Kp = K rounded up to 32 and NC = the columns of
 * a B block (b_budget_bytes / (2 Kp), rounded down to 32, at least
 * min_cols, at most N rounded up; N rounded up when that fits in whole_n_bytes):
 *   NC * Kp / 2                  the packed B block (BF16)
 *   16 * Kp                      the decoded A strip (32 rows of Kp BF16)
 *   3 * 1024                     P tile, accumulator tile, packing scratch
 *   NC / 8 + 16                  per-panel facts (fold exponents, denormal flags)
 *   (NC + 32) * (Kp / 128 + 1)   BLOCK128 scale_invs of the block's columns and the strip's rows
 * Bounded by the budget for any M and N; linear in K (like the reference's 65 K). */
LOWP_HIDDEN size_t lowp_gemm_blk_ws_floats(const lowp_gemm_job *j, const lowp_gemm_blk_kernel *k);
LOWP_HIDDEN void lowp_gemm_blk_run(const lowp_gemm_job *j, const lowp_gemm_blk_kernel *k);
/* Pairs the driver handles (all but PLAIN F32). */
LOWP_HIDDEN int lowp_gemm_blk_supports(const lowp_gemm_job *j);

/* The IEEE binary32 micro-kernel (gemm_avx512.c, AVX-512F), shared by both BF16 kernels. */
LOWP_HIDDEN void lowp_gemm_micro_f32x(const uint16_t *a, const uint16_t *b, int64_t nkt, int r0,
                                      int mr, float *p);

/* The same on FMA: the fast micro-kernel of AVX-512 CPUs without AVX512_BF16. */
LOWP_HIDDEN void lowp_gemm_micro_f32fma(const uint16_t *a, const uint16_t *b, int64_t nkt, int r0,
                                        int mr, float *p);

/* The VDPBF16PS micro-kernel (gemm_avx512.c; needs AVX512_BF16). */
LOWP_HIDDEN void lowp_gemm_micro_dpbf16(const uint16_t *a, const uint16_t *b, int64_t nkt, int r0,
                                        int mr, float *p);

/* Prefetch (to L2) share `part` of `parts` of the bytes of rows [r0, r1), columns [k0, k1),
 * of q; and (for writing) the C rows [m0, m0 + rows) x [n0, n0 + w) of a job. */
LOWP_HIDDEN void lowp_gemm_prefetch_rows(const lowp_qtensor *q, int64_t r0, int64_t r1, int64_t k0,
                                         int64_t k1, int64_t part, int64_t parts);
LOWP_HIDDEN void lowp_gemm_prefetch_c(const lowp_gemm_job *j, int64_t m0, int rows, int64_t n0,
                                      int w);

/* C outputs of at least this many bytes are written with streaming stores where possible:
 * about a core's L2 here (1 MiB on Zen 4 and 5), which the output could not stay in anyway.
 * Ordinary stores read every line of C first and stalled the driver's epilogue (a third of its
 * samples in a `medium` update); the threshold was 16 MiB, which no GEMM of a `medium` update
 * reached. Measured in the trainer: GEMM phase 1.07x on one thread (docs/bench-log/train-step.md).
 */
#define LOWP_GEMM_NT_BYTES ((size_t) 1 << 20)

/* Store rows [m0, m1) x columns [n0, n0 + w) (w <= 32) of C from v (row stride 32 floats,
 * v[0] is (m0, n0)), honouring accumulate and BF16 output (RNE, NaN -> 0x7FC0 | sign, as
 * lowp's BF16 encoder with NONSAT). */
LOWP_HIDDEN void lowp_gemm_store_tile(const lowp_gemm_job *j, int64_t m0, int64_t m1, int64_t n0,
                                      int w, const float *v);

#endif
