/* The optimizer side of training: a warm-up + cosine learning-rate schedule, AdamW with FP32
 * moments over lowp_param arrays (train.h), and global-norm gradient clipping. Implemented in
 * src/trainer/optim.c.
 *
 *   lowp_adamw_cfg oc;
 *   lowp_adamw_cfg_init(&oc);
 *   lowp_adamw *opt;
 *   lowp_adamw_create(params, n, &oc, &opt);
 *   lowp_lr_schedule sched = {3e-3f, 3e-4f, 20, 200};
 *   float lr, norm;
 *   lowp_lr_at(&sched, step, &lr);
 *   lowp_grad_clip(params, n, 1.0f, &norm);
 *   lowp_adamw_step(opt, params, n, lr);          // then lowp_train_step_end(params, n, NULL)
 *   lowp_adamw_free(opt);
 */
#ifndef LOWP_OPTIM_H
#define LOWP_OPTIM_H

#include <stdint.h>

#include "train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Learning-rate schedule: linear warm-up, then cosine decay ----
 *
 * Update s (0-based) uses lr * (s + 1) / warmup while s < warmup, then
 * min_lr + (lr - min_lr) (1 + cos(pi p)) / 2 with p = (s - warmup) / (steps - warmup), held at
 * min_lr once p >= 1. */
typedef struct lowp_lr_schedule {
    float lr;       /* peak */
    float min_lr;   /* floor of the cosine */
    int32_t warmup; /* updates of linear warm-up (0: none) */
    int32_t steps;  /* the schedule's length in updates */
} lowp_lr_schedule;
LOWP_API lowp_status lowp_lr_at(const lowp_lr_schedule *sched, int64_t step, float *lr);

/* ---- AdamW over lowp_param arrays, with FP32 moments ----
 *
 * Decoupled weight decay (Loshchilov & Hutter) applies to matrices only: a parameter with
 * rows == 1 and no groups (a norm's weight) is not decayed. Bias-corrected:
 *   m = b1 m + (1 - b1) g ;  v = b2 v + (1 - b2) g^2
 *   w -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd w)
 * Element-wise and in binary32, so the result does not depend on the thread count. */
typedef struct lowp_adamw_cfg {
    float beta1, beta2, eps; /* 0.9, 0.95, 1e-8 */
    float weight_decay;      /* 0.1 */
    int32_t threads;         /* 0: all cores */
} lowp_adamw_cfg;
LOWP_API lowp_status lowp_adamw_cfg_init(lowp_adamw_cfg *cfg);

typedef struct lowp_adamw lowp_adamw;
/* Moments sized for params[0 .. n-1] (zeroed; t = 0). */
LOWP_API lowp_status lowp_adamw_create(const lowp_param *params, int32_t n,
                                       const lowp_adamw_cfg *cfg, lowp_adamw **out);
LOWP_API void lowp_adamw_free(lowp_adamw *opt);
/* One update of params[i].data from params[i].grad at learning rate lr (t += 1). The caller
 * then calls lowp_train_step_end. */
LOWP_API lowp_status lowp_adamw_step(lowp_adamw *opt, lowp_param *params, int32_t n, float lr);
/* The moments of parameter i ([groups or 1] x rows x cols floats each), for checkpoints. */
LOWP_API lowp_status lowp_adamw_moments(lowp_adamw *opt, int32_t i, float **m, float **v,
                                        int64_t *count);
/* Updates done (the t of the bias correction). */
LOWP_API lowp_status lowp_adamw_get_t(const lowp_adamw *opt, int64_t *t);
LOWP_API lowp_status lowp_adamw_set_t(lowp_adamw *opt, int64_t t);

/* The global L2 norm of every gradient (*norm, may be NULL), summed in a fixed order. When
 * max_norm > 0 and the norm exceeds it, every gradient is scaled by max_norm / norm. A
 * non-finite norm leaves the gradients as they are. It runs on every core (threads 0 in
 * lowp/threads.h; the result does not depend on the count); the trainer's clipping runs on
 * lowp_trainer_cfg.threads. */
LOWP_API lowp_status lowp_grad_clip(lowp_param *params, int32_t n, float max_norm, float *norm);

#ifdef __cplusplus
}
#endif
#endif
