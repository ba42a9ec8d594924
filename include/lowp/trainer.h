/* Training a model of model.h (lowp_model: the MoE or the dense GPT): the trainer (gradient
 * accumulation, clipping, AdamW, the schedule, evaluation on a held-out split), sampling, and
 * checkpoints in the safetensors format from which a run resumes bit for bit. Implemented in
 * src/trainer/ (trainer.c: the loop and evaluation; sample.c; checkpoint.c). The data it trains on
 * is data.h, the optimizer optim.h, the file format safetensors.h.
 *
 *   lowp_data *data;
 *   lowp_data_from_file("input.txt", &data);       // or lowp_data_default(&data)
 *   lowp_data_info di;
 *   lowp_data_get_info(data, &di);
 *   lowp_moe_config mc;
 *   lowp_moe_config_preset("tiny", di.vocab, &mc);
 *   lowp_model *m;
 *   lowp_model_create(&mc, 1234, &m);
 *   lowp_recipe r;
 *   lowp_recipe_init(&r, "all_mxfp8");
 *   lowp_trainer_cfg tc;
 *   lowp_trainer_cfg_init(&tc);                      // then set steps, batch, lr, ...
 *   lowp_trainer *t;
 *   lowp_trainer_create(m, data, &r, &tc, &t);       // wraps the weights by the recipe
 *   lowp_trainer_run(t, 0, on_step, user);           // on_step prints progress, saves checkpoints
 *   lowp_trainer_checkpoint_save(t, "run.safetensors");
 *   lowp_trainer_free(t);                            // unwraps the weights
 *
 * Everything a run depends on is a function of its inputs and seeds: the batches of step s
 * come from (seed, micro-batch index) through Philox, the dropout masks from the RNG tracker,
 * reductions run in a fixed order. So N steps, a checkpoint, a resume and N more steps equal
 * 2N steps, bit for bit (with the same thread count).
 */
#ifndef LOWP_TRAINER_H
#define LOWP_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoint.h"
#include "data.h"
#include "model.h"
#include "optim.h"
#include "rng_tracker.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- The trainer ---- */

typedef struct lowp_trainer_cfg {
    int32_t steps;        /* optimizer updates in the run (and the schedule's length) */
    int32_t batch;        /* B sequences per micro-batch */
    int32_t seq_len;      /* T tokens per sequence (<= the model's seq_len; 0: the model's) */
    int32_t accum;        /* micro-batches per update (gradient accumulation) */
    float lr, min_lr;     /* the schedule's peak and floor */
    int32_t warmup;       /* updates of warm-up */
    lowp_adamw_cfg adamw; /* betas, eps, weight decay */
    float clip;           /* global-norm clipping threshold (0: off) */
    int32_t eval_every;   /* evaluate every N updates and after the last (0: only the last) */
    int32_t eval_batches; /* validation batches per evaluation */
    uint64_t seed;        /* data order and dropout */
    uint64_t eval_seed;   /* the validation batches (the same at every evaluation) */
    int32_t threads;      /* 0: all cores */
    int32_t activation_checkpoint; /* recompute layer activations in the backward */
    int32_t max_skipped;           /* stop (LOWP_ERR_DIVERGED) after this many consecutive skipped
                                      updates; 0: never. A non-finite loss always stops the run. */
} lowp_trainer_cfg;
/* Defaults: 200 steps, batch 8, the model's seq_len, accum 1, lr 3e-3 -> 3e-4, warm-up 20,
 * AdamW defaults, clip 1, eval every 50 steps on 8 batches, seed 1234, eval_seed 0,
 * max_skipped 10. */
LOWP_API lowp_status lowp_trainer_cfg_init(lowp_trainer_cfg *cfg);

typedef struct lowp_trainer lowp_trainer;

/* The trainer borrows the model and the data (keep them alive until lowp_trainer_free). It
 * wraps the model's parameters by `recipe` (NULL: none, recorded as "none"), which must not be
 * wrapped already, and the model's vocabulary must equal the data's. */
LOWP_API lowp_status lowp_trainer_create(lowp_model *model, const lowp_data *data,
                                         const lowp_recipe *recipe, const lowp_trainer_cfg *cfg,
                                         lowp_trainer **out);
/* Unwraps the parameters and frees the optimizer state. */
LOWP_API void lowp_trainer_free(lowp_trainer *t);

/* What one optimizer update did. */
typedef struct lowp_step_report {
    int64_t step;        /* updates done, counting this one (1-based) */
    int64_t steps;       /* cfg.steps */
    float loss;          /* mean cross-entropy over this update's micro-batches */
    float aux_loss;      /* mean load-balancing loss (before aux_loss_coef) */
    float lr;            /* the learning rate used */
    float grad_norm;     /* global gradient norm before clipping */
    float val_loss;      /* validation cross-entropy when this update evaluated, else NaN */
    int32_t evaluated;   /* 1 when val_loss is set */
    int32_t skipped;     /* 1: the gradient was not finite and the update was skipped */
    int64_t tokens;      /* training tokens of this update (accum x B x T) */
    double step_s;       /* seconds of the update (forward, backward, optimizer) */
    double eval_s;       /* seconds of the evaluation (0 when none) */
    double tokens_per_s; /* tokens / step_s */
    double elapsed_s;    /* since the trainer was created or resumed */
    double eta_s;        /* estimate of the seconds left to cfg.steps */
} lowp_step_report;

/* One update: accum micro-batches of forward and backward, clipping, AdamW,
 * lowp_train_step_end; then an evaluation when due (every eval_every updates and after the
 * last). Evaluation leaves no trace in the training state (the FP8 scaling state is restored
 * after it). */
LOWP_API lowp_status lowp_trainer_step(lowp_trainer *t, lowp_step_report *report);

/* Called after every update; a nonzero return stops lowp_trainer_run (which then returns
 * LOWP_OK; the caller knows why it stopped). */
typedef int (*lowp_progress_fn)(const lowp_step_report *report, void *user);
/* Updates until `until` are done (0: cfg.steps), calling `fn` (may be NULL) after each. */
LOWP_API lowp_status lowp_trainer_run(lowp_trainer *t, int64_t until, lowp_progress_fn fn,
                                      void *user);
/* The mean cross-entropy over cfg.eval_batches validation batches (no trace, as above). */
LOWP_API lowp_status lowp_trainer_eval(lowp_trainer *t, float *val_loss);

/* Updates done so far. */
LOWP_API lowp_status lowp_trainer_get_step(const lowp_trainer *t, int64_t *step);
/* The model's parameters, as wrapped by the trainer. */
LOWP_API lowp_status lowp_trainer_params(lowp_trainer *t, lowp_param **params, int32_t *n);
LOWP_API lowp_status lowp_trainer_get_cfg(const lowp_trainer *t, lowp_trainer_cfg *out);

/* ---- Sampling ----
 *
 * Generates n bytes after `prompt` (bytes of the vocabulary; NULL or "" starts from a newline,
 * or token 0 when the vocabulary has none), feeding the model the last seq_len tokens each
 * time. temperature <= 0 picks the most likely token; top_k > 0 keeps the k most likely. */
typedef struct lowp_sample_cfg {
    float temperature; /* 0.8 */
    int32_t top_k;     /* 0: all */
    uint64_t seed;     /* Philox stream of the draws */
    int32_t threads;   /* 0: all cores */
} lowp_sample_cfg;
LOWP_API lowp_status lowp_sample_cfg_init(lowp_sample_cfg *cfg);
/* out receives n bytes and a terminating NUL (n + 1 bytes). */
LOWP_API lowp_status lowp_sample_text(lowp_model *model, const lowp_data *data,
                                      const lowp_sample_cfg *cfg, const char *prompt, int32_t n,
                                      char *out);

/* ---- Checkpoints ----
 *
 * One safetensors file holds the run: every parameter as F32 under its own name (loadable as
 * a plain state dict), AdamW's moments as optim.exp_avg.NAME and optim.exp_avg_sq.NAME, each
 * wrapped parameter's extra state (checkpoint.h) as a U8 tensor NAME._extra_state, and in
 * __metadata__ the step, the data position, the optimizer's t, the RNG tracker's states, the
 * model configuration (config.*), the recipe, the data's vocabulary and hash, and the settings
 * that fix the data order (train.*). Written atomically (PATH.tmp, fsync, rename, fsync of
 * the directory): an interrupted save leaves the previous file whole.
 *
 * Loading refuses, with an error naming the field and both values, a checkpoint whose model
 * configuration, recipe, data or data order (batch, seq_len, accum, seed) differ from the
 * trainer's; a corrupt or truncated file is LOWP_ERR_CORRUPT. On any failure the trainer is
 * left as it was.
 *
 * Integrity (format version 2, src/trainer/checkpoint_check.c): __metadata__ holds a CRC-32C
 * of every tensor ("crc32c.NAME", 8 hex digits) and one over every other metadata entry
 * ("crc32c.__metadata__", entries in bytewise key order, each KEY NUL VALUE NUL), verified
 * before anything is read; weights and moments must be finite (second moments >= 0), every
 * train.* number in range and the step, optimizer t and data position consistent, else
 * LOWP_ERR_CORRUPT naming the tensor or the field. Version 1 files are refused
 * (LOWP_ERR_VERSION). A save refuses a state with a non-finite weight, moment or FP8 value
 * (LOWP_ERR_DIVERGED). */
#define LOWP_TRAIN_CHECKPOINT_FORMAT  "lowp.train"
#define LOWP_TRAIN_CHECKPOINT_VERSION 2

LOWP_API lowp_status lowp_trainer_checkpoint_save(lowp_trainer *t, const char *path);
LOWP_API lowp_status lowp_trainer_checkpoint_load(lowp_trainer *t, const char *path);

/* What a checkpoint was written with, read without a trainer (to rebuild a matching one). */
typedef struct lowp_checkpoint_info {
    char recipe[32];
    char data_name[256];
    uint64_t data_hash; /* lowp_data_info.hash of the data it trained on */
    lowp_moe_config config;
    lowp_trainer_cfg train; /* the settings of the run that wrote it */
    int64_t step;           /* updates done */
    uint64_t model_seed;    /* the initialization seed, when recorded (else 0) */
} lowp_checkpoint_info;
LOWP_API lowp_status lowp_trainer_checkpoint_info(const char *path, lowp_checkpoint_info *out);

/* Recorded in the checkpoint's metadata (the model cannot tell its own seed). */
LOWP_API lowp_status lowp_trainer_set_model_seed(lowp_trainer *t, uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif
