/* The CPU backend's internal interface: capability detection, the backend registration and
 * the element-conversion kernels (reference and AVX-512), which the dispatcher in cast.c
 * splits into pieces and runs on threads. */
#ifndef LOWP_CPU_H
#define LOWP_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
#include "lowp/cast.h"
#include "lowp/device.h"

/* Detected once (CPUID, XGETBV, and the AMX permission request); thread-safe. */
LOWP_HIDDEN const lowp_caps *lowp_cpu_caps(void);

/* The AVX-512 subsets every lowp AVX-512 kernel is compiled for (F, BW, VL, DQ). */
#define LOWP_CAPS_AVX512_KERNELS                                                                   \
    (LOWP_CAP_AVX512F | LOWP_CAP_AVX512BW | LOWP_CAP_AVX512VL | LOWP_CAP_AVX512DQ)
static inline int lowp_cpu_has_avx512(void) {
    return (lowp_cpu_caps()->flags & LOWP_CAPS_AVX512_KERNELS) == LOWP_CAPS_AVX512_KERNELS;
}

/* dst [cols, rows] (row stride ldd) = src [rows, cols] (row stride lds) transposed, binary32
 * bits moved unchanged, in 16x16 register blocks (vmath_avx512.c; lowp_cpu_has_avx512()). */
LOWP_HIDDEN void lowp_cpu_transpose_f32_avx512(const float *src, int64_t rows, int64_t cols,
                                               int64_t lds, float *dst, int64_t ldd);

/* The same for 16-bit elements (BF16 bits). */
LOWP_HIDDEN void lowp_cpu_transpose_u16_avx512(const uint16_t *src, int64_t rows, int64_t cols,
                                               int64_t lds, uint16_t *dst, int64_t ldd);

/* GELU of n elements (g = u Phi(u); gd = gelu'(u) when not NULL) on libmvec's AVX-512 erff
 * and expf (vmath_avx512.c); only where LOWP_HAVE_LIBMVEC and lowp_cpu_has_avx512(). */
LOWP_HIDDEN void lowp_cpu_gelu_avx512(const float *u, float *g, float *gd, int64_t n);
/* x[i] = expf(x[i]) in place, the same way. */
LOWP_HIDDEN void lowp_cpu_expf_avx512(float *x, int64_t n);
/* SwiGLU's s = silu(u1) u3, and its backward du1, du3 from ds (moe_ffn.c's formulas), the same
 * way (sigmoid on libmvec's expf). */
LOWP_HIDDEN void lowp_cpu_swiglu_fwd_avx512(const float *u1, const float *u3, float *s, int64_t n);
LOWP_HIDDEN void lowp_cpu_swiglu_bwd_avx512(const float *u1, const float *u3, const float *ds,
                                            float *du1, float *du3, int64_t n);

/* The vector forms of the models' transcendental kernels on libmvec: AVX-512 (vmath_avx512.c)
 * or AVX2 (vmath_avx2.c, 8 lanes). */
LOWP_HIDDEN void lowp_cpu_gelu_avx2(const float *u, float *g, float *gd, int64_t n);
LOWP_HIDDEN void lowp_cpu_expf_avx2(float *x, int64_t n);
LOWP_HIDDEN void lowp_cpu_swiglu_fwd_avx2(const float *u1, const float *u3, float *s, int64_t n);
LOWP_HIDDEN void lowp_cpu_swiglu_bwd_avx2(const float *u1, const float *u3, const float *ds,
                                          float *du1, float *du3, int64_t n);

typedef struct lowp_cpu_vmath {
    const char *name; /* "avx512" or "avx2" */
    void (*gelu)(const float *u, float *g, float *gd, int64_t n);
    void (*expf)(float *x, int64_t n);
    void (*swiglu_fwd)(const float *u1, const float *u3, float *s, int64_t n);
    void (*swiglu_bwd)(const float *u1, const float *u3, const float *ds, float *du1, float *du3,
                       int64_t n);
} lowp_cpu_vmath;

/* The set this CPU runs (AVX-512 first, then AVX2 and FMA), or NULL where the scalar libm code
 * runs (built without libmvec, or neither). `lowp_cpu_vmath_of(1)` is the AVX2 set wherever
 * the CPU has it, for tests. */
LOWP_HIDDEN const lowp_cpu_vmath *lowp_cpu_vmath_pick(void);
LOWP_HIDDEN const lowp_cpu_vmath *lowp_cpu_vmath_of(int avx2);

/* The kernel a CPU dispatcher runs. */
typedef enum lowp_cpu_kernel {
    LOWP_CPU_KERNEL_REFERENCE = 0,
    LOWP_CPU_KERNEL_AVX512 = 1,
    LOWP_CPU_KERNEL_AMX = 2,
    LOWP_CPU_KERNEL_AVX2 = 3,
} lowp_cpu_kernel;

/* The one kernel-path rule of lowp_kernel_path (lowp/device.h) for the three dispatchers
 * (cast.c, quant.c, gemm.c; src/cpu/dispatch.c). avx512_job / amx_job / avx2_job: whether that
 * kernel handles this job (its format, scaling, pair); whether the CPU has it is checked here.
 * A forced path that cannot run fails with a message naming `fn`, the path and the reason. */
LOWP_HIDDEN lowp_status lowp_cpu_pick_kernel(const char *fn, lowp_kernel_path path, int avx512_job,
                                             int amx_job, int avx2_job, lowp_cpu_kernel *out);

/* The threads a dispatcher runs with for cfg.threads = `want`: lowp_thread_count
 * (lowp/threads.h), then no more than `work` pieces of work when work >= 1. */
LOWP_HIDDEN int lowp_cpu_threads(int32_t want, int64_t work);

/* The CPU backend's registration (src/cpu/backend.c). */
LOWP_HIDDEN lowp_status lowp_cpu_backend_entry(lowp_backend_reg *reg);

/* Host-side cast entry, used by the CPU backend's vtable and by the ops layer. */
LOWP_HIDDEN lowp_status lowp_cpu_cast(const lowp_tensor *src, lowp_tensor *dst,
                                      const lowp_cast_cfg *cfg);

/* A piece of a cast: n consecutive elements of one row. `idx` is the row-major index of the
 * piece's first element (the Philox word offset is cfg->offset + idx). E2M1 pieces start at
 * an even element and src/dst point at the byte that holds it. */
typedef struct lowp_cast_piece {
    const void *src;
    void *dst;
    size_t n;
    uint64_t idx;
    lowp_format src_format;
    lowp_format dst_format;
    const lowp_cast_cfg *cfg;
} lowp_cast_piece;

LOWP_HIDDEN void lowp_cpu_cast_ref(const lowp_cast_piece *p);

/* Returns 1 when the AVX-512 kernels handle (src_format, dst_format, rounding), else 0. */
LOWP_HIDDEN int lowp_cpu_cast_avx512_supports(lowp_format src, lowp_format dst,
                                              lowp_rounding rounding);
LOWP_HIDDEN void lowp_cpu_cast_avx512(const lowp_cast_piece *p);
/* The AVX2 kernel: binary32 <-> BF16 (no stochastic rounding). */
LOWP_HIDDEN int lowp_cpu_cast_avx2_supports(lowp_format src, lowp_format dst,
                                            lowp_rounding rounding);
LOWP_HIDDEN void lowp_cpu_cast_avx2(const lowp_cast_piece *p);

/* Quantization entry points (src/cpu/quant.c), arguments validated by src/ops/quant.c. */
struct lowp_qtensor;
struct lowp_quant_cfg;
LOWP_HIDDEN lowp_status lowp_cpu_quantize(const lowp_tensor *x, struct lowp_qtensor *row,
                                          struct lowp_qtensor *col,
                                          const struct lowp_quant_cfg *cfg);
LOWP_HIDDEN lowp_status lowp_cpu_quantize_grouped(const lowp_tensor *x, struct lowp_qtensor *col,
                                                  const struct lowp_quant_cfg *cfg);
/* One thread's GEMM over part of its operands, for the attention core's per-head products on
 * the [N, D] activations as they lie: C (m, n) = c[m * c->cols + n] = the sum over k in [k0, k1)
 * of a (m, k) b (n, k), for m < `m` and n in [n0, n1); a [>= m, >= k1] row-major (row stride
 * a->cols); b [>= n1, >= k1], or with b_kn [>= k1, >= n1] (element (n, k) at (k, n)). The same
 * kernels and, for each element, the same operations as a GEMM of the parts copied out
 * contiguously. Plain F32 or BF16 host operands the caller made; no OpenMP region. */
LOWP_HIDDEN lowp_status lowp_cpu_gemm_part(const struct lowp_qtensor *a,
                                           const struct lowp_qtensor *b, int b_kn, lowp_tensor *c,
                                           int64_t m, int64_t n0, int64_t n1, int64_t k0,
                                           int64_t k1);

/* Binary32 products whose right operand serves many calls (the attention core's heads): B
 * packed once into panels of 32 columns n, then C (m, n) = c[m * ldc + n] = the sum over k in
 * [k0, k1) of a[m * lda + k - k0] b (n, k), for m < `m` and n < n1. Each element is the same
 * sequence of operations as lowp_cpu_gemm_part's on the AVX-512 kernels (fused multiply-adds in k
 * order from +0, or the exact sequence where products could overflow or reach the denormals), so
 * the bits match it. b: [n, k] (row stride ldb) or, kn, [k, n]. The panels take
 * lowp_cpu_sgp_floats(n, k) floats at a 64-byte boundary. One thread; only where
 * lowp_cpu_has_avx512(). */
LOWP_HIDDEN size_t lowp_cpu_sgp_floats(int64_t n, int64_t k);
LOWP_HIDDEN void lowp_cpu_sgp_pack(const float *b, int64_t ldb, int kn, int64_t n, int64_t k,
                                   float *panels);
LOWP_HIDDEN void lowp_cpu_sgp_mul(const float *a, int64_t lda, int64_t m, const float *panels,
                                  int64_t n, int64_t k, int64_t n1, int64_t k0, int64_t k1,
                                  float *c, int64_t ldc);

/* The training layer's dual-axis copies of expert inputs: the rowwise copy `row` of x and the
 * grouped columnwise copy `col` (group_offs set) from one read, as lowp_cpu_quantize(x, row,
 * NULL) and lowp_cpu_quantize_grouped(x, col) would make them, bit for bit. Host tensors whose
 * shapes and buffers the caller made; returns 1 when done, 0 (nothing written) when the
 * AVX-512 kernels do not take the job (E2M1, another scaling, a reference path) or memory ran
 * out: the caller then makes the copies one by one. */
LOWP_HIDDEN int lowp_cpu_quantize_grouped_dual(const lowp_tensor *x, struct lowp_qtensor *row,
                                               struct lowp_qtensor *col,
                                               const struct lowp_quant_cfg *cfg);
/* Host-side dequantize on `threads` (lowp/threads.h; lowp_dequantize passes 0, every core). */
LOWP_HIDDEN lowp_status lowp_cpu_dequantize(const struct lowp_qtensor *q, lowp_tensor *out,
                                            int32_t threads);
LOWP_HIDDEN lowp_status lowp_cpu_amax(const lowp_tensor *x, int scaling, float *out);

/* GEMM entry points (src/cpu/gemm.c), arguments validated by src/ops/gemm.c. b_kn: b is given
 * [K, N] (lowp_gemm_kn, lowp_grouped_gemm_kn), else [N, K]. */
struct lowp_gemm_cfg;
LOWP_HIDDEN lowp_status lowp_cpu_gemm(const struct lowp_qtensor *a, const struct lowp_qtensor *b,
                                      int b_kn, lowp_tensor *c, const struct lowp_gemm_cfg *cfg);
LOWP_HIDDEN lowp_status lowp_cpu_grouped_gemm(const struct lowp_qtensor *a,
                                              const struct lowp_qtensor *b, int b_kn,
                                              const int32_t *offs, int32_t groups, lowp_tensor *c,
                                              const struct lowp_gemm_cfg *cfg);
LOWP_HIDDEN lowp_status lowp_cpu_grouped_gemm_wgrad(const struct lowp_qtensor *a,
                                                    const struct lowp_qtensor *b, int b_kn,
                                                    const int32_t *offs, int32_t groups,
                                                    lowp_tensor *c,
                                                    const struct lowp_gemm_cfg *cfg);

#endif
