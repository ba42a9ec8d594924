/* Delayed scaling (docs/numerics.md section 5; TransformerEngine's DelayedScaling): an amax
 * history per quantized tensor role, a scale derived from it before each cast, and the
 * history rolled after each step that used the tensor. */
#include <float.h>
#include <math.h>

#include "internal.h"
#include "lowp/delayed.h"

lowp_status lowp_delayed_cfg_init(lowp_delayed_cfg *cfg, lowp_format format) {
    LOWP_CHECK_PTR("lowp_delayed_cfg_init", cfg);
    cfg->format = format;
    cfg->history_len = 1024;
    cfg->margin = 0.0f;
    cfg->algo = LOWP_AMAX_ALGO_MAX;
    return LOWP_OK;
}

lowp_status lowp_delayed_cfg_check(const char *fn, const char *arg, const lowp_delayed_cfg *cfg) {
    if (cfg->history_len < 1)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s.history_len (%d) < 1", fn, arg,
                         (int) cfg->history_len);
    if (cfg->history_len > LOWP_DELAYED_MAX_HISTORY)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s.history_len (%d) > %d", fn, arg,
                         (int) cfg->history_len, LOWP_DELAYED_MAX_HISTORY);
    if (!isfinite(cfg->margin))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s.margin (%g) is not finite", fn, arg,
                         (double) cfg->margin);
    if (cfg->algo != LOWP_AMAX_ALGO_MAX && cfg->algo != LOWP_AMAX_ALGO_MOST_RECENT)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s.algo (%d) is not a lowp_amax_algo", fn, arg,
                         (int) cfg->algo);
    return LOWP_OK;
}

lowp_status lowp_delayed_init(lowp_delayed_state *st, const lowp_delayed_cfg *cfg, float *history) {
    const char *fn = "lowp_delayed_init";
    LOWP_CHECK_PTR(fn, st);
    LOWP_CHECK_PTR(fn, cfg);
    LOWP_CHECK_PTR(fn, history);
    if (cfg->format != LOWP_FORMAT_E4M3 && cfg->format != LOWP_FORMAT_E5M2)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.format (%d) is not e4m3 or e5m2", fn,
                         (int) cfg->format);
    lowp_status s = lowp_delayed_cfg_check(fn, "cfg", cfg);
    if (s != LOWP_OK) return s;
    st->cfg = *cfg;
    st->history = history;
    for (int32_t i = 0; i < cfg->history_len; i++) history[i] = 0.0f;
    st->scale = 1.0f;
    st->scale_inv = 1.0f;
    return LOWP_OK;
}

lowp_status lowp_delayed_record(lowp_delayed_state *st, float amax) {
    LOWP_CHECK_PTR("lowp_delayed_record", st);
    LOWP_CHECK_PTR("lowp_delayed_record", st->history);
    float a = fabsf(amax);
    float *h0 = &st->history[0];
    if (a != a || a > *h0) *h0 = a; /* NaN sticks: a NaN row 0 is never replaced */
    return LOWP_OK;
}

lowp_status lowp_delayed_update(lowp_delayed_state *st) {
    LOWP_CHECK_PTR("lowp_delayed_update", st);
    LOWP_CHECK_PTR("lowp_delayed_update", st->history);
    const lowp_format_traits *t;
    lowp_status s = lowp_format_get(st->cfg.format, &t);
    if (s != LOWP_OK) return s;
    float *h = st->history;
    const int32_t len = st->cfg.history_len;
    /* 1. amax over the history (NaN wins, as torch.max), or the most recent. */
    float amax = h[0];
    if (st->cfg.algo == LOWP_AMAX_ALGO_MAX)
        for (int32_t i = 1; i < len && amax == amax; i++)
            if (h[i] != h[i] || h[i] > amax) amax = h[i];
    /* 2. scale = scaled_max / amax when amax is finite and > 0; else keep the previous one. */
    const float scaled_max = t->fmax * exp2f(-st->cfg.margin);
    if (isfinite(amax) && amax > 0.0f) {
        float scale = scaled_max / amax;
        st->scale = isinf(scale) ? FLT_MAX : scale;
    }
    /* 3. Roll by one (torch.roll(h, -1)) and clear the staging row, unless the tensor was not
     *    used this step (amax 0). */
    const float newest = h[0];
    if (newest != 0.0f) {
        for (int32_t i = 0; i + 1 < len; i++) h[i] = h[i + 1];
        h[len - 1] = newest;
        h[0] = 0.0f;
    }
    /* 4. */
    st->scale_inv = 1.0f / st->scale;
    return LOWP_OK;
}
