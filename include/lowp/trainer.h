/* Training the MoE model of model.h: character-level text data, the AdamW optimizer with FP32
 * master weights and moments, global-norm gradient clipping, a warm-up + cosine learning-rate
 * schedule, gradient accumulation, evaluation on a held-out split, sampling, and checkpoints
 * in the safetensors format from which a run resumes bit for bit.
 *
 *   lowp_data *data;
 *   lowp_data_from_file("input.txt", &data);       // or lowp_data_default(&data)
 *   lowp_data_info di;
 *   lowp_data_get_info(data, &di);
 *   lowp_moe_config mc;
 *   lowp_moe_config_preset("tiny", di.vocab, &mc);
 *   lowp_moe *m;
 *   lowp_moe_create(&mc, 1234, &m);
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
#include "model.h"
#include "rng.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Text data: a byte-level vocabulary and a 90/10 train/validation split ----
 *
 * The vocabulary is the sorted set of distinct bytes of the text (token i is the i-th
 * smallest byte value present), so "character level" means byte level: UTF-8 text trains
 * fine, a multi-byte character being several tokens. The first 90% of the bytes (rounded
 * down) are the training split, the rest the validation split. */

typedef struct lowp_data lowp_data;

typedef enum lowp_split { LOWP_SPLIT_TRAIN = 0, LOWP_SPLIT_VAL = 1 } lowp_split;

/* From text in memory (copied), from a file, or from the built-in corpus (a few tens of KB of
 * English prose compiled into the library, so that training needs nothing else). */
LOWP_API lowp_status lowp_data_from_text(const void *text, size_t len, const char *name,
                                         lowp_data **out);
LOWP_API lowp_status lowp_data_from_file(const char *path, lowp_data **out);
LOWP_API lowp_status lowp_data_default(lowp_data **out);
LOWP_API void lowp_data_free(lowp_data *data);

typedef struct lowp_data_info {
    const char *name;     /* the file path, "built-in" or the name given; valid with the data */
    int32_t vocab;        /* distinct bytes, 1 to 256 */
    int64_t bytes;        /* tokens in all */
    int64_t train_tokens; /* bytes * 9 / 10 */
    int64_t val_tokens;   /* the rest */
    uint64_t hash;        /* FNV-1a 64 of the text: checkpoints refuse other data */
} lowp_data_info;
LOWP_API lowp_status lowp_data_get_info(const lowp_data *data, lowp_data_info *out);
/* LOWP_OK when both splits hold a window of seq_len + 1 tokens; else LOWP_ERR_INVALID_ARG with
 * a message that names the data and both split sizes. Cheap: call it before building a model. */
LOWP_API lowp_status lowp_data_check_seq_len(const lowp_data *data, int32_t seq_len);

/* The vocabulary: symbols[i] is the byte of token i, for i < vocab. */
LOWP_API lowp_status lowp_data_vocab(const lowp_data *data, const uint8_t **symbols,
                                     int32_t *vocab);
/* Bytes -> tokens (a byte outside the vocabulary is an error naming it) and back. */
LOWP_API lowp_status lowp_data_encode(const lowp_data *data, const char *text, size_t len,
                                      int32_t *tokens);
LOWP_API lowp_status lowp_data_decode(const lowp_data *data, const int32_t *tokens, size_t n,
                                      char *text);

/* Batch `index` of the stream (split, seed): B windows of T + 1 tokens of the split, window b
 * starting at a uniform position drawn from Philox words 2 (index B + b) and 2 (index B + b)
 * + 1 of stream seed (train) or seed ^ LOWP_DATA_VAL_KEY (validation). tokens [B, T] are the
 * windows' first T tokens and targets [B, T] the next ones. The split must hold T + 1 tokens. */
#define LOWP_DATA_VAL_KEY 0x76616c6964617465ull
LOWP_API lowp_status lowp_data_batch(const lowp_data *data, lowp_split split, uint64_t seed,
                                     uint64_t index, int32_t B, int32_t T, int32_t *tokens,
                                     int32_t *targets);

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
 * non-finite norm leaves the gradients as they are. */
LOWP_API lowp_status lowp_grad_clip(lowp_param *params, int32_t n, float max_norm, float *norm);

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
LOWP_API lowp_status lowp_trainer_create(lowp_moe *model, const lowp_data *data,
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
LOWP_API lowp_status lowp_sample_text(lowp_moe *model, const lowp_data *data,
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
 * left as it was. */
#define LOWP_TRAIN_CHECKPOINT_FORMAT  "lowp.train"
#define LOWP_TRAIN_CHECKPOINT_VERSION 1

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

/* ---- safetensors files ----
 *
 * The format: an 8-byte little-endian header length N, N bytes of a UTF-8 JSON object
 * {"NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]}, ...,
 *  "__metadata__": {"KEY": "VALUE", ...}}, then the data, each tensor's bytes at
 * [BEGIN, END) of the data section, little-endian, C order. Reading validates everything:
 * the JSON syntax, duplicate names, dtypes, that END - BEGIN = elements x item size, and that
 * the tensors cover the data section exactly, without gaps or overlaps.
 *
 *   lowp_st_tensor w = {"w", LOWP_ST_F32, 2, {2, 3}, data};
 *   lowp_st_meta meta = {"step", "100"};
 *   lowp_safetensors_write("w.safetensors", &w, 1, &meta, 1);
 *   lowp_safetensors *f;
 *   lowp_safetensors_read("w.safetensors", &f);
 *   lowp_st_tensor got;
 *   lowp_safetensors_find(f, "w", &got);       // got.data points into f, maybe unaligned
 *   lowp_safetensors_free(f);
 */
typedef enum lowp_st_dtype {
    LOWP_ST_BOOL = 0,
    LOWP_ST_U8,
    LOWP_ST_I8,
    LOWP_ST_F8_E4M3,
    LOWP_ST_F8_E5M2,
    LOWP_ST_F8_E8M0,
    LOWP_ST_U16,
    LOWP_ST_I16,
    LOWP_ST_F16,
    LOWP_ST_BF16,
    LOWP_ST_U32,
    LOWP_ST_I32,
    LOWP_ST_F32,
    LOWP_ST_U64,
    LOWP_ST_I64,
    LOWP_ST_F64,
    LOWP_ST_DTYPE_COUNT
} lowp_st_dtype;

#define LOWP_ST_MAX_DIMS 8

typedef struct lowp_st_tensor {
    const char *name;
    lowp_st_dtype dtype;
    int32_t ndim; /* 0 (a scalar) to LOWP_ST_MAX_DIMS */
    int64_t shape[LOWP_ST_MAX_DIMS];
    const void *data; /* elements x item size bytes */
} lowp_st_tensor;

typedef struct lowp_st_meta {
    const char *key, *value; /* UTF-8 */
} lowp_st_meta;

/* The dtype's name in the format ("F32") and its item size in bytes. */
LOWP_API const char *lowp_st_dtype_name(lowp_st_dtype dtype);
LOWP_API size_t lowp_st_dtype_size(lowp_st_dtype dtype);
/* Elements x item size of a tensor (checks the shape and overflow). */
LOWP_API lowp_status lowp_st_tensor_nbytes(const lowp_st_tensor *t, size_t *out);

/* Write atomically: PATH.tmp, fsync, rename to PATH, fsync the directory. Names must be
 * unique, non-empty and not "__metadata__"; metadata keys unique. */
LOWP_API lowp_status lowp_safetensors_write(const char *path, const lowp_st_tensor *tensors,
                                            int32_t n, const lowp_st_meta *meta, int32_t nmeta);

typedef struct lowp_safetensors lowp_safetensors;
/* Read and validate a whole file (LOWP_ERR_IO: unreadable; LOWP_ERR_CORRUPT: malformed). */
LOWP_API lowp_status lowp_safetensors_read(const char *path, lowp_safetensors **out);
/* The same from bytes in memory (copied). */
LOWP_API lowp_status lowp_safetensors_parse(const void *bytes, size_t len, lowp_safetensors **out);
LOWP_API void lowp_safetensors_free(lowp_safetensors *f);

LOWP_API lowp_status lowp_safetensors_count(const lowp_safetensors *f, int32_t *tensors,
                                            int32_t *meta);
/* Tensor i in the order of the data section. Pointers stay valid until the free. */
LOWP_API lowp_status lowp_safetensors_tensor(const lowp_safetensors *f, int32_t i,
                                             lowp_st_tensor *out);
LOWP_API lowp_status lowp_safetensors_find(const lowp_safetensors *f, const char *name,
                                           lowp_st_tensor *out); /* LOWP_ERR_NOT_FOUND */
LOWP_API lowp_status lowp_safetensors_meta_at(const lowp_safetensors *f, int32_t i,
                                              const char **key, const char **value);
LOWP_API lowp_status lowp_safetensors_meta(const lowp_safetensors *f, const char *key,
                                           const char **value); /* LOWP_ERR_NOT_FOUND */

#ifdef __cplusplus
}
#endif
#endif
