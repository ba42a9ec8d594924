/* The CPU backend's internal interface, for src/cpu/ and the registry only: the backend
 * registration, the kernel-path rule, and the entry points and kernels of the casts,
 * quantization and GEMMs. What the layers above may use (CPU features, transposes, the
 * models' vector math and attention GEMMs, host quantization) is host.h, included here. */
#ifndef LOWP_CPU_H
#define LOWP_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
#include "host.h"
#include "lowp/cast.h"
#include "lowp/device.h"

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
/* The grouped columnwise copy col (group_offs set) and, when row is not NULL, the rowwise copy
 * row of x: from one read where a fast kernel takes the job (MX32 and BLOCK128 8-bit codes,
 * every row of x in a group), else one copy after the other; the same bytes either way. */
LOWP_HIDDEN lowp_status lowp_cpu_quantize_grouped(const lowp_tensor *x, struct lowp_qtensor *row,
                                                  struct lowp_qtensor *col,
                                                  const struct lowp_quant_cfg *cfg);
LOWP_HIDDEN lowp_status lowp_cpu_amax(const lowp_tensor *x, int scaling, float *out);

/* GEMM entry points (src/cpu/gemm.c), arguments validated by src/ops/gemm.c. b_kn: b is given
 * [K, N] (cfg.b_layout LOWP_LAYOUT_KN), else [N, K]. */
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
