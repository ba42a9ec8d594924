/* The training layer: the "param swap" (prepare / convert), low-precision linear and grouped
 * linear forward and backward, FP8 delayed-scaling state, autocast and RMSNorm. Implemented in
 * src/train/ (wrap.c: prepare / convert; linear.c; fp8_state.c; autocast.c; rmsnorm.c).
 *
 *   lowp_param params[] = {                                   // the model's weights
 *       {.name = "mlp.fc1", .rows = 256, .cols = 64, .data = w1, .grad = g1,
 *        .device = LOWP_DEVICE_HOST},
 *       ...};
 *   lowp_recipe r;
 *   lowp_recipe_init(&r, "all_mxfp8");
 *   lowp_train_prepare(params, n, &r);                        // wrap matching weights
 *   for (step...) {
 *       lowp_linear_saved *s;
 *       lowp_linear_forward(&params[0], b1, &x, &y, NULL, &s);  // MXFP8 GEMM
 *       ...
 *       lowp_linear_backward(&params[0], &x, &dy, &dx, db1, NULL, s);  // dW += into grad
 *       optimizer_update(params);                             // FP32 master weights
 *       lowp_train_step_end(params, n, NULL);                 // versions, delayed scaling
 *   }
 *   lowp_train_convert(params, n);                            // plain weights again
 *
 * Master weights and gradients are FP32 host arrays owned by the caller; lowp never changes
 * `data`. Gradients are straight-through: dW is computed from the quantized operands and
 * accumulated into `grad` (so micro-batches add up). A wrapped weight's quantized copies are
 * made once per `version` of the parameter and reused by every micro-batch and by
 * recomputation; lowp_train_step_end (or lowp_param_updated) bumps the version.
 */
#ifndef LOWP_TRAIN_H
#define LOWP_TRAIN_H

#include "gemm.h"
#include "recipe.h"
#include "rng_tracker.h"

#ifdef __cplusplus
extern "C" {
#endif

struct lowp_wrap;         /* the state prepare attaches to a parameter (opaque) */
struct lowp_weight_cache; /* cached GEMM operands of a weight (opaque) */

typedef struct lowp_param {
    const char *name;       /* e.g. "layers.0.attn.wq"; matched against recipe patterns */
    int32_t groups;         /* 0: one [rows, cols] matrix; G > 0: G experts, [G, rows, cols] */
    int64_t rows, cols;     /* out features N x in features K (per expert) */
    float *data;            /* FP32 master weights, host */
    float *grad;            /* FP32 gradient, host, same shape */
    lowp_device device;     /* where the parameter's state (FP8 history, scales) lives */
    uint64_t version;       /* bumped after every optimizer update */
    struct lowp_wrap *wrap; /* set by lowp_train_prepare; NULL when plain */
    /* BF16 copies of a plain weight, per version (lowp_linear_opts.cache_plain); freed by
     * lowp_param_cache_free. NULL until then. */
    struct lowp_weight_cache *plain_cache;
} lowp_param;

/* Elements of a parameter's data (and of its gradient): (groups, or 1 when 0) x rows x cols;
 * -1 when param is NULL. */
LOWP_API int64_t lowp_param_numel(const lowp_param *param);

/* Wrap every parameter that a non-high-precision rule of `recipe` matches (parameters with
 * `wrap` already set are refused). */
LOWP_API lowp_status lowp_train_prepare(lowp_param *params, int32_t n, const lowp_recipe *recipe);
/* Unwrap: free what prepare attached; the weights are untouched. */
LOWP_API lowp_status lowp_train_convert(lowp_param *params, int32_t n);

/* MAX-reduction of amaxes across the process group that shards a tensor (distributed runs):
 * called in place on `count` floats before the delayed-scaling update. NULL: one process. */
typedef lowp_status (*lowp_amax_reduce_fn)(float *amax, int32_t count, void *user);
typedef struct lowp_reduce_hook {
    lowp_amax_reduce_fn fn;
    void *user;
} lowp_reduce_hook;

/* After the optimizer has updated the master weights: bump every parameter's version (its
 * cached quantized copies become stale) and run the delayed-scaling update of every wrapped
 * parameter's FP8 state (after the reduction hook). */
LOWP_API lowp_status lowp_train_step_end(lowp_param *params, int32_t n,
                                         const lowp_reduce_hook *hook);
/* Free a plain weight's cached BF16 copies (lowp_linear_opts.cache_plain); NULL is a no-op. */
LOWP_API void lowp_param_cache_free(lowp_param *param);
/* Mark one parameter's master weights as changed. */
LOWP_API lowp_status lowp_param_updated(lowp_param *param);

typedef struct lowp_wrap_stats {
    int64_t weight_quantizations; /* times the weight's quantized copies were (re)made */
    int64_t forward_calls, backward_calls;
    char cfg_name[32]; /* the preset or recipe rule that wrapped it */
} lowp_wrap_stats;
/* A plain (unwrapped) parameter gives zero counts and cfg_name "plain". */
LOWP_API lowp_status lowp_param_stats(const lowp_param *param, lowp_wrap_stats *out);

typedef struct lowp_linear_opts {
    int32_t recompute;   /* 1: activation recomputation: no amax is recorded */
    int32_t threads;     /* 0: all cores */
    int32_t fp32_plain;  /* 1: unwrapped weights run F32 GEMMs instead of BF16 (gradient
                            checks and float references); wrapped weights are unaffected */
    int32_t cache_plain; /* 1: an unwrapped weight's BF16 copies (both orientations) are made
                            once per version and kept in param->plain_cache, as a wrapped
                            weight's quantized copies are (the same bits as remaking them);
                            the owner frees them with lowp_param_cache_free */
    int32_t reuse_input; /* 1: x is the same tensor, with the same values, as the x of the last
                            forward on this thread (the q, k and v of one input): that forward's
                            quantized copies of x are reused when x's address, shape, groups and
                            input spec match (not for delayed scaling); a backward in between
                            drops them. 0: quantize x (the default) */
    /* The RNG tracker of a wrapped weight whose configuration rounds stochastically or has
     * wgrad_hadamard (NULL otherwise; such a call then fails naming opts.rng). Its state
     * "stochastic_rounding" gives the SR words (each quantized copy of an [R, C] operand
     * takes the next R * C: in a forward X's copy, then X's wgrad copy when kept; in a
     * backward dY's dgrad copy, dY's wgrad copy, then X's wgrad copy), its state "hadamard"
     * one sign word per backward, taken first (docs/numerics.md 4b). */
    lowp_rng_tracker *rng;
} lowp_linear_opts;

/* What a forward keeps for its backward (opaque; freed by the backward or lowp_linear_saved_free).
 */
typedef struct lowp_linear_saved lowp_linear_saved;

/* y[M, N] = x[M, K] . W^T + bias. x and y F32 host tensors; bias [N] or NULL. `saved` may be
 * NULL when no backward follows (inference, or a forward to be recomputed). */
LOWP_API lowp_status lowp_linear_forward(lowp_param *w, const float *bias, const lowp_tensor *x,
                                         lowp_tensor *y, const lowp_linear_opts *opts,
                                         lowp_linear_saved **saved);
/* From dy[M, N]: dx[M, K] (may be NULL), dbias[N] += column sums of dy (may be NULL), and
 * w->grad += dW. Consumes `saved`, also when it fails (from the matching forward of this same
 * lowp_param, same x shape and offs; NULL allowed when the forward was not asked to save: x is
 * then requantized). */
LOWP_API lowp_status lowp_linear_backward(lowp_param *w, const lowp_tensor *x,
                                          const lowp_tensor *dy, lowp_tensor *dx, float *dbias,
                                          const lowp_linear_opts *opts, lowp_linear_saved *saved);

/* MoE experts: w has groups = G ([G, N, K]); offs (int32, G cumulative ends) splits the rows
 * of x [M, K] into groups; y[rows_g] = x[rows_g] . W[g]^T; rows past offs[G-1] of y (and of
 * dx in the backward) are 0. The backward adds dW[g] into grad [G, N, K]. */
LOWP_API lowp_status lowp_grouped_linear_forward(lowp_param *w, const lowp_tensor *x,
                                                 const int32_t *offs, lowp_tensor *y,
                                                 const lowp_linear_opts *opts,
                                                 lowp_linear_saved **saved);
LOWP_API lowp_status lowp_grouped_linear_backward(lowp_param *w, const lowp_tensor *x,
                                                  const int32_t *offs, const lowp_tensor *dy,
                                                  lowp_tensor *dx, const lowp_linear_opts *opts,
                                                  lowp_linear_saved *saved);
LOWP_API void lowp_linear_saved_free(lowp_linear_saved *saved);

/* ---- FP8 delayed-scaling state of one wrapped module ---- */

typedef enum lowp_role {
    LOWP_ROLE_INPUT = 0,
    LOWP_ROLE_WEIGHT = 1,
    LOWP_ROLE_GRAD_OUTPUT = 2,
    LOWP_ROLE_COUNT = 3
} lowp_role;

/* The state lives on `device`: `dev_buf` holds, per role, history_len amax rows then the scale
 * (LOWP_ROLE_COUNT * (history_len + 1) floats). Computation reads and writes the host mirror
 * (`roles[r].history`, `roles[r].scale`); lowp_fp8_state_push copies the mirror to the device
 * (queued on the device's queue) and lowp_fp8_state_pull reads it back after synchronizing
 * that device. A push first synchronizes the device if an earlier push may still be pending;
 * a pull first pushes amaxes recorded since the last push, so that a save taken between
 * record and update loses nothing. */
typedef struct lowp_fp8_state {
    lowp_device device;
    int32_t history_len;
    lowp_delayed_state roles[LOWP_ROLE_COUNT]; /* host mirror; cfg.format per role */
    float *host_buf;                           /* backing of the mirror's histories */
    float *dev_buf;                            /* on `device` (== host_buf on the CPU) */
} lowp_fp8_state;

/* cfg gives history_len, margin and algo; formats[r] the element format of each role. */
LOWP_API lowp_status lowp_fp8_state_init(lowp_fp8_state *st, const lowp_delayed_cfg *cfg,
                                         const lowp_format formats[LOWP_ROLE_COUNT],
                                         lowp_device device);
LOWP_API void lowp_fp8_state_free(lowp_fp8_state *st);
/* Record a role's amax for this step (max with what is recorded; NaN sticks). */
LOWP_API lowp_status lowp_fp8_state_record(lowp_fp8_state *st, lowp_role role, float amax);
/* Reduce (hook), update every role (docs/numerics.md section 5), push to the device. */
LOWP_API lowp_status lowp_fp8_state_update(lowp_fp8_state *st, const lowp_reduce_hook *hook);
LOWP_API lowp_status lowp_fp8_state_push(lowp_fp8_state *st);
LOWP_API lowp_status lowp_fp8_state_pull(lowp_fp8_state *st);

/* ---- Autocast and the non-GEMM ops ---- */

/* Per device type: whether autocast is on there and its dtype (BF16 or F16). */
typedef struct lowp_autocast {
    struct {
        int32_t enabled;
        lowp_format dtype;
    } type[LOWP_DEVICE_MAX_TYPES];
} lowp_autocast;

LOWP_API lowp_status lowp_autocast_init(lowp_autocast *ac); /* all off */
LOWP_API lowp_status lowp_autocast_set(lowp_autocast *ac, int32_t device_type, int32_t enabled,
                                       lowp_format dtype);
/* The dtype ops on `dev` compute in: the autocast dtype of dev's type when enabled, else F32. */
LOWP_API lowp_status lowp_autocast_dtype(const lowp_autocast *ac, lowp_device dev,
                                         lowp_format *dtype);

/* RMSNorm over rows: y = x / sqrt(mean(x^2) + eps) * weight. x, y [M, D] F32 on the same
 * device; weight [D]; rstd [M] (may be NULL) receives 1/sqrt(mean + eps) for the backward.
 * When autocast is on for x's device type, the input, the weight and the output are rounded to
 * its dtype (the statistics are computed in binary32). ac may be NULL (off). CPU tensors only
 * for now: other device types give LOWP_ERR_UNSUPPORTED. Both functions run on all cores;
 * every sum keeps its sequential order, so the bits do not depend on the thread count. */
LOWP_API lowp_status lowp_rmsnorm_forward(const lowp_tensor *x, const float *weight, float eps,
                                          lowp_tensor *y, float *rstd, const lowp_autocast *ac);
/* dx [M, D] from dy; dweight [D] += (may be NULL). */
LOWP_API lowp_status lowp_rmsnorm_backward(const lowp_tensor *x, const float *weight,
                                           const float *rstd, const lowp_tensor *dy,
                                           lowp_tensor *dx, float *dweight);

#ifdef __cplusplus
}
#endif
#endif
