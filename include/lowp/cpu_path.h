/* The CPU backend's kernel paths: the lowp_kernel_path values (device.h) past the two every
 * backend knows, AUTO and REFERENCE, each forcing one instruction set on the CPU device through
 * an op's cfg.path (lowp_cast_cfg, lowp_quant_cfg, lowp_gemm_cfg). Other backends ignore them.
 * The CPU's dispatcher (src/cpu/dispatch.c) picks or refuses them:
 *
 *   lowp_gemm_cfg cfg;
 *   lowp_gemm_cfg_init(&cfg);
 *   cfg.path = LOWP_KERNEL_PATH_AVX2;   // LOWP_ERR_UNSUPPORTED, naming why, where AVX2 cannot run
 */
#ifndef LOWP_CPU_PATH_H
#define LOWP_CPU_PATH_H

#include "device.h"

/* Plain int constants (as enum constants are in C), so that assigning one to a cfg.path or
 * comparing it with one warns on no compiler. */
#define LOWP_KERNEL_PATH_AVX512 2 /* AVX-512F/BW/VL/DQ */
/* AMX-BF16 (GEMM only: cast and quantize have no AMX kernel) */
#define LOWP_KERNEL_PATH_AMX 3
/* AVX2 and FMA (GEMM; quantize to E4M3/E5M2; F32 <-> BF16 casts) */
#define LOWP_KERNEL_PATH_AVX2  4
#define LOWP_KERNEL_PATH_COUNT 5 /* one past the last path, of every backend */

#endif
