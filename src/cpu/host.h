/* The CPU backend's host interface to the layers above it (ggml's ggml-cpu.h role): the math
 * that the models (src/model/) and the training layer (src/train/) run themselves on host
 * memory, beside the ops they reach through the backend's vtable. It is the one header of
 * src/cpu/ that code outside src/cpu/ may include (and only from model/ and train/; the
 * registry, which lists the backend as built in, includes cpu.h): tools/check_layers.py
 * enforces it, and checks that every lowp_cpu_ function called from outside src/cpu/ is
 * declared here.
 *
 *   CPU features            lowp_cpu_caps, lowp_cpu_has_avx512
 *   transposes              lowp_cpu_transpose_f32_avx512, lowp_cpu_transpose_u16_avx512,
 *                           lowp_cpu_bf16_dual_avx512 (both BF16 copies from one read)
 *   activation math         lowp_cpu_vmath (GELU, expf, SwiGLU on libmvec), lowp_cpu_vmath_pick
 *   attention core GEMMs    lowp_cpu_gemm_part, the packed panels lowp_cpu_sgp_*
 *   host dequantization     lowp_cpu_dequantize on the caller's threads
 */
#ifndef LOWP_CPU_HOST_H
#define LOWP_CPU_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
#include "lowp/device.h"
#include "lowp/tensor.h"

struct lowp_qtensor;

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

/* Both BF16 copies of a binary32 src [rows, cols] (row stride lds) from one read: row [rows,
 * cols] (stride ldr) and col [cols, rows] (stride ldc), the bits of lowp_cast's default (RNE,
 * Inf on overflow, NaN 0x7FC0 with its sign) and of its transpose (vmath_avx512.c;
 * lowp_cpu_has_avx512()). */
LOWP_HIDDEN void lowp_cpu_bf16_dual_avx512(const float *src, int64_t rows, int64_t cols,
                                           int64_t lds, uint16_t *row, int64_t ldr, uint16_t *col,
                                           int64_t ldc);

/* The vector forms of the models' transcendental kernels (cpu.h declares each one). */
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

/* Host-side dequantize on `threads` (lowp/threads.h; lowp_dequantize passes 0, every core). */
LOWP_HIDDEN lowp_status lowp_cpu_dequantize(const struct lowp_qtensor *q, lowp_tensor *out,
                                            int32_t threads);

#endif
