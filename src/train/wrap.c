/* The param swap: lowp_train_prepare attaches a lowp_wrap (the matching rule's linear
 * configuration, its FP8 delayed-scaling state, a cache of quantized weight copies) to every
 * parameter a recipe quantizes, lowp_train_convert takes it off again. The master weights
 * themselves are never touched, so convert restores them bit for bit by construction. Also
 * the end-of-step bookkeeping: versions (which invalidate the weight caches) and the
 * delayed-scaling update, and the element count of a parameter (lowp_param_numel). */
#include <stdlib.h>

#include "train_internal.h"

int64_t lowp_param_numel(const lowp_param *param) {
    if (!param) return -1;
    return (param->groups > 0 ? param->groups : 1) * param->rows * param->cols;
}

static void wrap_free(struct lowp_wrap *w) {
    if (!w) return;
    if (w->fp8) {
        lowp_fp8_state_free(w->fp8);
        free(w->fp8);
    }
    lowp_weight_cache_free(w->cache);
    free(w);
}

/* A new wrap for `p` with configuration `cfg`; its FP8 state (when some operand is delayed)
 * lives on p's device. */
static lowp_status wrap_new(const char *fn, const lowp_param *p, const lowp_linear_cfg *cfg,
                            struct lowp_wrap **out) {
    struct lowp_wrap *w = calloc(1, sizeof *w);
    if (!w) return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: wrap of \"%s\"", fn, p->name);
    w->cfg = *cfg;
    const char *name = lowp_linear_cfg_name(cfg);
    memcpy(w->cfg_name, name, strlen(name) + 1);
    memcpy(w->stats.cfg_name, w->cfg_name, sizeof w->cfg_name);
    const lowp_operand_spec *specs[LOWP_ROLE_COUNT];
    specs[LOWP_ROLE_INPUT] = &cfg->input;
    specs[LOWP_ROLE_WEIGHT] = &cfg->weight;
    specs[LOWP_ROLE_GRAD_OUTPUT] = &cfg->grad_output;
    int delayed = 0;
    lowp_format formats[LOWP_ROLE_COUNT];
    for (int r = 0; r < LOWP_ROLE_COUNT; r++) {
        delayed |= lowp_spec_delayed(specs[r]);
        /* A role without delayed scaling never records an amax, so its history stays empty;
         * it still needs an FP8 format for the state's (unused) scale. */
        formats[r] = lowp_spec_delayed(specs[r]) ? specs[r]->format : LOWP_FORMAT_E4M3;
    }
    if (delayed) {
        w->fp8 = calloc(1, sizeof *w->fp8);
        if (!w->fp8) {
            wrap_free(w);
            return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: FP8 state of \"%s\"", fn, p->name);
        }
        lowp_status st = lowp_fp8_state_init(w->fp8, &cfg->delayed, formats, p->device);
        if (st != LOWP_OK) {
            free(w->fp8);
            w->fp8 = NULL;
            wrap_free(w);
            lowp_error_append("%s: FP8 state of \"%s\"", fn, p->name);
            return st;
        }
    }
    *out = w;
    return LOWP_OK;
}

lowp_status lowp_param_array_check(const char *fn, const lowp_param *params, int32_t n) {
    if (n < 0) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: n (%d) < 0", fn, n);
    if (n > 0 && !params)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: params is NULL (n = %d)", fn, n);
    return LOWP_OK;
}

/* The index of the last transformer block: the highest N over the names holding "layers.N."
 * at their start or after a '.', or -1. */
static int32_t last_block(const lowp_param *params, int32_t n) {
    long best = -1;
    for (int32_t i = 0; i < n; i++) {
        const char *name = params[i].name;
        for (const char *p = name; p && (p = strstr(p, "layers.")) != NULL; p++) {
            if (p != name && p[-1] != '.') continue;
            const char *d = p + 7, *e = d;
            long v = 0;
            while (*e >= '0' && *e <= '9' && v < 100000000) v = v * 10 + (*e++ - '0');
            if (e > d && *e == '.' && v > best) best = v;
        }
    }
    return (int32_t) best;
}

static lowp_status prepare(const char *fn, lowp_param *params, int32_t n,
                           const lowp_recipe *recipe);

lowp_status lowp_train_prepare(lowp_param *params, int32_t n, const lowp_recipe *recipe) {
    const char *fn = "lowp_train_prepare";
    lowp_status st = lowp_param_array_check(fn, params, n);
    if (st != LOWP_OK) return st;
    LOWP_CHECK_PTR(fn, recipe);
    for (int32_t i = 0; i < n; i++)
        if (!params[i].name)
            return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: params[%d].name is NULL", fn, i);
    lowp_recipe *bound = malloc(sizeof *bound);
    if (!bound) return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: recipe copy", fn);
    *bound = *recipe;
    st = lowp_recipe_bind_last(bound, last_block(params, n));
    if (st == LOWP_OK) st = prepare(fn, params, n, bound);
    free(bound);
    return st;
}

static lowp_status prepare(const char *fn, lowp_param *params, int32_t n,
                           const lowp_recipe *recipe) {
    lowp_status st;
    /* Check everything first: a refused call wraps nothing. */
    for (int32_t i = 0; i < n; i++) {
        const lowp_param *p = &params[i];
        if (!p->name) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: params[%d].name is NULL", fn, i);
        if (p->wrap)
            return lowp_fail(LOWP_ERR_INVALID_ARG,
                             "%s: params[%d] (\"%s\") is already wrapped (prepare called twice "
                             "without convert?)",
                             fn, i, p->name);
        const lowp_recipe_rule *rule;
        if ((st = lowp_recipe_match(recipe, p->name, &rule)) != LOWP_OK) return st;
        if (!rule || rule->high_precision) continue;
        if (p->groups < 0)
            return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: params[%d] (\"%s\").groups (%d) < 0", fn, i,
                             p->name, p->groups);
        if (p->rows <= 0 || p->cols <= 0)
            return lowp_fail(LOWP_ERR_INVALID_ARG,
                             "%s: params[%d] (\"%s\") shape (%lld x %lld) must be positive", fn, i,
                             p->name, (long long) p->rows, (long long) p->cols);
        if (!p->data)
            return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: params[%d] (\"%s\").data is NULL", fn, i,
                             p->name);
        if ((st = lowp_linear_cfg_check(fn, &rule->cfg)) != LOWP_OK) {
            lowp_error_append("recipe rule \"%s\" matching params[%d] (\"%s\")", rule->pattern, i,
                              p->name);
            return st;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        const lowp_recipe_rule *rule;
        lowp_recipe_match(recipe, params[i].name, &rule);
        if (!rule || rule->high_precision) continue;
        struct lowp_wrap *w = NULL;
        if ((st = wrap_new(fn, &params[i], &rule->cfg, &w)) != LOWP_OK) {
            for (int32_t j = 0; j < i; j++) {
                wrap_free(params[j].wrap);
                params[j].wrap = NULL;
            }
            return st;
        }
        params[i].wrap = w;
    }
    return LOWP_OK;
}

lowp_status lowp_train_convert(lowp_param *params, int32_t n) {
    lowp_status st = lowp_param_array_check("lowp_train_convert", params, n);
    if (st != LOWP_OK) return st;
    for (int32_t i = 0; i < n; i++) {
        wrap_free(params[i].wrap);
        params[i].wrap = NULL;
    }
    return LOWP_OK;
}

lowp_status lowp_train_step_end(lowp_param *params, int32_t n, const lowp_reduce_hook *hook) {
    const char *fn = "lowp_train_step_end";
    lowp_status st = lowp_param_array_check(fn, params, n);
    if (st != LOWP_OK) return st;
    lowp_status first = LOWP_OK;
    for (int32_t i = 0; i < n; i++) {
        params[i].version++;
        if (!params[i].wrap || !params[i].wrap->fp8) continue;
        /* Keep going after a failure: every other module's versions and scales still move on,
         * and the first failure is what the caller sees. */
        st = lowp_fp8_state_update(params[i].wrap->fp8, hook);
        if (st != LOWP_OK && first == LOWP_OK) {
            lowp_error_append("%s: params[%d] (\"%s\")", fn, i,
                              params[i].name ? params[i].name : "?");
            first = st;
        }
    }
    return first;
}

lowp_status lowp_param_updated(lowp_param *param) {
    LOWP_CHECK_PTR("lowp_param_updated", param);
    param->version++;
    return LOWP_OK;
}

lowp_status lowp_param_stats(const lowp_param *param, lowp_wrap_stats *out) {
    LOWP_CHECK_PTR("lowp_param_stats", param);
    LOWP_CHECK_PTR("lowp_param_stats", out);
    if (!param->wrap) {
        memset(out, 0, sizeof *out);
        memcpy(out->cfg_name, "plain", sizeof "plain");
        return LOWP_OK;
    }
    *out = param->wrap->stats;
    return LOWP_OK;
}
