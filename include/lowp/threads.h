/* CPU thread counts: one rule for every `threads` setting of lowp (lowp_cast_cfg,
 * lowp_quant_cfg, lowp_gemm_cfg, lowp_linear_opts, lowp_model_run, lowp_adamw_cfg,
 * lowp_trainer_cfg, lowp_sample_cfg) and for the `--threads` option of every `lowp` command.
 * Implemented in src/core/threads.c.
 *
 *   threads < 0                      an error of the function that takes it (LOWP_ERR_INVALID_ARG)
 *   threads == 0                     every core (omp_get_num_procs)
 *   1 <= threads <= LOWP_MAX_THREADS that many
 *   threads > LOWP_MAX_THREADS       clamped to LOWP_MAX_THREADS
 *
 * and never more than the OpenMP thread limit (omp_get_thread_limit, OMP_THREAD_LIMIT). The
 * library clamps rather than refuses: a thread count is a request, and OpenMP runtimes crash
 * or fail to create threads far above the core count. The `lowp` command refuses a --threads
 * outside [0, LOWP_MAX_THREADS] with a usage error instead, so that a typo is seen.
 *
 *   int32_t n = lowp_thread_count(cfg.threads);   // what a kernel will run with
 */
#ifndef LOWP_THREADS_H
#define LOWP_THREADS_H

#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOWP_MAX_THREADS 256

/* The thread count that `threads` (>= 0) stands for, by the rule above; at least 1. A negative
 * value is treated as 0 here (the functions that take one refuse it first). */
LOWP_API int32_t lowp_thread_count(int32_t threads);

#ifdef __cplusplus
}
#endif
#endif
