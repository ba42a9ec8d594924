/* The optimizer's internals that the training loop (trainer.c) shares with optim.c, which
 * owns them: the parallel loop over parameter spans, gradient scaling, and clipping folded
 * into the AdamW step. Not installed. */
#ifndef LOWP_TRAINER_OPTIM_H
#define LOWP_TRAINER_OPTIM_H

#include "core/internal.h"
#include "lowp/optim.h"

/* Work over every parameter in one parallel loop. fn(ctx, i, item, j0,
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

/* lowp_grad_clip without touching the gradients: the norm, and in *scale
 * the factor clipping would multiply every gradient by (1 when it would not), on nt threads
 * (the caller's count: the norm is the same for every nt). */
LOWP_HIDDEN lowp_status lowp_grad_norm_scale(lowp_param *params, int32_t n, float max_norm,
                                             float *norm, float *scale, int nt);
/* lowp_adamw_step on the gradients times gscale (each g * gscale rounded
 * once, as lowp_grad_clip's scaling in memory would store it), the gradients left as they are. */
LOWP_HIDDEN lowp_status lowp_adamw_step_scaled(lowp_adamw *opt, lowp_param *params, int32_t n,
                                               float lr, float gscale);

#endif
