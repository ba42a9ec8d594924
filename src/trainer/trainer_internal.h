/* The trainer's state, shared by trainer.c (the loop) and checkpoint.c (what a
 * checkpoint saves and restores). Not installed. */
#ifndef LOWP_TRAINER_INTERNAL_H
#define LOWP_TRAINER_INTERNAL_H

#include "core/internal.h"
#include "lowp/safetensors.h"
#include "lowp/trainer.h"

struct lowp_trainer {
    lowp_moe *model;       /* borrowed */
    const lowp_data *data; /* borrowed */
    lowp_moe_config mcfg;
    lowp_trainer_cfg cfg; /* seq_len resolved */
    lowp_recipe recipe;   /* name "none" when created without one */
    int32_t prepared;     /* 1: lowp_train_prepare succeeded, convert on free */
    lowp_param *params;   /* the model's, [n] */
    int32_t n;
    lowp_adamw *opt;
    lowp_rng_tracker rng;      /* dropout; saved in checkpoints */
    int64_t step;              /* updates done */
    uint64_t data_pos;         /* micro-batches drawn from the training stream */
    uint64_t model_seed;       /* recorded in checkpoints */
    int32_t *tokens, *targets; /* [B, T] */
    int32_t skipped_run;       /* consecutive skipped updates up to now (src/trainer/guard.c) */
    /* Timing of this process's part of the run (not saved: a resumed run starts afresh). */
    double t0;
    int64_t run_steps;
};

/* src/trainer/optim.c: work over every parameter in one parallel loop. fn(ctx, i, item, j0,
 * len) is called once for each span [j0, j0 + len) of `unit` elements of parameter i (count[i]
 * elements), item numbering the spans in parameter order (lowp_param_span_count of them); on
 * nt threads when the elements are at least parallel_min, else on this thread. */
typedef void (*lowp_span_fn)(void *ctx, int32_t i, int64_t item, int64_t j0, int64_t len);
LOWP_HIDDEN lowp_status lowp_param_spans(const int64_t *count, int32_t n, int64_t unit, int nt,
                                         int64_t parallel_min, lowp_span_fn fn, void *ctx);
LOWP_HIDDEN int64_t lowp_param_span_count(const int64_t *count, int32_t n, int64_t unit);
/* [n] element counts of params (malloc'd; NULL when out of memory). */
LOWP_HIDDEN int64_t *lowp_param_counts(const lowp_param *params, int32_t n);
/* Every gradient times factor, on nt threads. */
LOWP_HIDDEN lowp_status lowp_grads_scale(lowp_param *params, int32_t n, float factor, int nt);

/* src/trainer/optim.c: lowp_grad_clip without touching the gradients: the norm, and in *scale
 * the factor clipping would multiply every gradient by (1 when it would not), on nt threads
 * (the caller's count: the norm is the same for every nt). */
LOWP_HIDDEN lowp_status lowp_grad_norm_scale(lowp_param *params, int32_t n, float max_norm,
                                             float *norm, float *scale, int nt);
/* src/trainer/optim.c: lowp_adamw_step on the gradients times gscale (each g * gscale rounded
 * once, as lowp_grad_clip's scaling in memory would store it), the gradients left as they are. */
LOWP_HIDDEN lowp_status lowp_adamw_step_scaled(lowp_adamw *opt, lowp_param *params, int32_t n,
                                               float lr, float gscale);

/* Snapshots of every wrapped parameter's extra state (evaluation and checkpoint loading
 * restore them). */
typedef struct trainer_extra_state {
    int32_t n;
    unsigned char **blob; /* [n], NULL for plain parameters */
    size_t *len;          /* [n] */
} trainer_extra_state;

LOWP_HIDDEN lowp_status lowp_trainer_extra_state_save(lowp_trainer *t, trainer_extra_state *x);
LOWP_HIDDEN lowp_status lowp_trainer_extra_state_load(lowp_trainer *t,
                                                      const trainer_extra_state *x);
LOWP_HIDDEN void lowp_trainer_extra_state_free(trainer_extra_state *x);

/* src/trainer/guard.c: LOWP_ERR_DIVERGED (message starting with `fn`, naming the tensor) when
 * a weight, an Adam moment or an FP8 delayed-scaling value is not finite (or a second moment
 * is negative); pulls the FP8 state from its device first. */
LOWP_HIDDEN lowp_status lowp_trainer_state_check(lowp_trainer *t, const char *fn);
/* src/trainer/guard.c: LOWP_ERR_DIVERGED when the loss of the update about to be applied is
 * not finite. */
LOWP_HIDDEN lowp_status lowp_trainer_guard_loss(const lowp_trainer *t, float loss);
/* src/trainer/guard.c: counts consecutive skipped updates (call after t->step++);
 * LOWP_ERR_DIVERGED when the streak reaches cfg.max_skipped. */
LOWP_HIDDEN lowp_status lowp_trainer_guard_skips(lowp_trainer *t, int skipped);

/* src/trainer/checkpoint_check.c: checksums and value checks of checkpoints (format version 2,
 * described there). Keys and tensor names are shorter than LOWP_CKPT_KEYLEN. */
#define LOWP_CKPT_KEYLEN 320
LOWP_HIDDEN uint32_t lowp_ckpt_tensor_crc(const lowp_st_tensor *t);
/* Over every entry but "crc32c.__metadata__", in key order. */
LOWP_HIDDEN lowp_status lowp_ckpt_meta_crc(const lowp_st_meta *m, int32_t n, uint32_t *crc);
/* Every checksum of a file: LOWP_ERR_CORRUPT naming the tensor or the metadata. */
LOWP_HIDDEN lowp_status lowp_ckpt_verify(const lowp_safetensors *f, const char *path);
/* The n binary32 values at v (any alignment) finite (and >= 0 with nonneg), else
 * LOWP_ERR_CORRUPT naming `name`. */
LOWP_HIDDEN lowp_status lowp_ckpt_check_values(const char *path, const char *name, const void *v,
                                               int64_t n, int nonneg);
/* Every number of info in the range lowp_trainer_create and the loop accept. */
LOWP_HIDDEN lowp_status lowp_ckpt_check_info(const char *path, const lowp_checkpoint_info *info);

/* Seconds on a monotonic clock. */
LOWP_HIDDEN double lowp_trainer_now(void);

/* Elements of a parameter: (groups or 1) x rows x cols. */
static inline int64_t lowp_param_numel(const lowp_param *p) {
    return (p->groups > 0 ? p->groups : 1) * p->rows * p->cols;
}

#endif
