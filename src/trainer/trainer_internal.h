/* What src/trainer/trainer.c owns and shares: the trainer's state (read by checkpoint.c, what a
 * checkpoint saves and restores, and guard.c), the snapshots of the parameters' extra state and
 * the clock. The optimizer's internals are in optim.h, the divergence guard's in guard.h, the
 * checkpoint checks in checkpoint_check.h. Not installed. */
#ifndef LOWP_TRAINER_INTERNAL_H
#define LOWP_TRAINER_INTERNAL_H

#include "core/internal.h"
#include "lowp/trainer.h"

struct lowp_trainer {
    lowp_model *model;     /* borrowed */
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

/* Seconds on a monotonic clock. */
LOWP_HIDDEN double lowp_trainer_now(void);

#endif
