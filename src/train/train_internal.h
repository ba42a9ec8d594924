/* The training layer's internal interface: what lowp_train_prepare attaches to a parameter.
 * Shared by the recipes (recipe.c), the linear layers (linear.c), prepare/convert (wrap.c) and
 * the extra-state checkpoint (extra_state.c), autocast (autocast.c, rmsnorm.c). */
#ifndef LOWP_TRAIN_INTERNAL_H
#define LOWP_TRAIN_INTERNAL_H

#include "core/internal.h"
#include "lowp/checkpoint.h"
#include "lowp/train.h"

/* The quantized copies of a wrapped weight for one parameter version (linear.c). */
struct lowp_weight_cache;

struct lowp_wrap {
    lowp_linear_cfg cfg; /* from the recipe rule that matched */
    char cfg_name[32];
    lowp_fp8_state *fp8; /* delayed-scaling state, NULL when no operand is delayed */
    lowp_wrap_stats stats;
    /* The weight's cached quantized (or BF16) copies, made on first use after every version
     * change; NULL until the first forward or backward. */
    struct lowp_weight_cache *cache;
};

/* Whether an operand spec is quantized (anything but BF16). */
static inline int lowp_spec_quantized(const lowp_operand_spec *s) {
    return s->format != LOWP_FORMAT_BF16;
}

/* Whether an operand spec uses delayed scaling (TENSOR scaling, delayed = 1, quantized). */
static inline int lowp_spec_delayed(const lowp_operand_spec *s) {
    return lowp_spec_quantized(s) && s->scaling == LOWP_SCALING_TENSOR && s->delayed;
}

/* recipe.c: check that every field of `cfg` is valid and that each of its three GEMMs is a
 * pair lowp_gemm multiplies; the message names `fn` and the offending operand. */
LOWP_HIDDEN lowp_status lowp_linear_cfg_check(const char *fn, const lowp_linear_cfg *cfg);

/* rmsnorm.c: lowp_rmsnorm_forward / _backward on `threads` threads (0: all cores; the
 * public functions pass 0). The bits do not depend on the count. */
LOWP_HIDDEN lowp_status lowp_rmsnorm_forward_nt(const lowp_tensor *x, const float *weight,
                                                float eps, lowp_tensor *y, float *rstd,
                                                const lowp_autocast *ac, int32_t threads);
LOWP_HIDDEN lowp_status lowp_rmsnorm_backward_nt(const lowp_tensor *x, const float *weight,
                                                 const float *rstd, const lowp_tensor *dy,
                                                 lowp_tensor *dx, float *dweight, int32_t threads);

/* autocast.c, rmsnorm.c: the dtype the policy gives device type `type` (checked by the
 * caller to be in [0, LOWP_DEVICE_MAX_TYPES)); F32 when ac is NULL (ops take NULL for "off")
 * or autocast is off for that type. */
static inline lowp_format lowp_autocast_dtype_for(const lowp_autocast *ac, int32_t type) {
    if (!ac || !ac->type[type].enabled) return LOWP_FORMAT_F32;
    return ac->type[type].dtype;
}

/* wrap.c: `params` [n] is an array the functions taking (params, n) accept: n >= 0, params
 * non-NULL when n > 0 (the optimizer adds its own per-parameter checks). */
LOWP_HIDDEN lowp_status lowp_param_array_check(const char *fn, const lowp_param *params, int32_t n);

/* linear.c: free a weight cache (NULL allowed). */
LOWP_HIDDEN void lowp_weight_cache_free(struct lowp_weight_cache *cache);

#endif
