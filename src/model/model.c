/* The lowp_model handle of model.h: the configuration presets, the choice of a model by its
 * configuration, the argument checks every model shares, and the calls through its model_ops
 * (model_internal.h); then the lowp_moe_* names of 0.2, each a call of its lowp_model_*
 * twin. The models themselves live in moe.c (cfg.experts > 0) and dense.c (0). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

struct lowp_model {
    const model_ops *ops;
    void *ctx; /* the model's own state */
    lowp_moe_config cfg;
};

lowp_status lowp_moe_config_preset(const char *name, int32_t vocab, lowp_moe_config *out) {
    LOWP_CHECK_PTR("lowp_moe_config_preset", name);
    LOWP_CHECK_PTR("lowp_moe_config_preset", out);
    if (vocab <= 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_moe_config_preset: vocab (%d) must be > 0",
                         vocab);
    static const struct {
        const char *name;
        int32_t dim, layers, heads, seq_len, experts, top_k, hidden, shared;
    } presets[] = {
        {"tiny", 64, 2, 4, 32, 4, 2, 64, 64},
        {"small", 128, 4, 4, 64, 8, 2, 128, 128},
        {"medium", 384, 6, 6, 256, 8, 2, 512, 512},
        /* dense (no experts): nanoGPT's CPU recipe, MLP 4 x 128 */
        {"nanogpt", 128, 4, 4, 64, 0, 0, 0, 512},
    };
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(name, presets[i].name) != 0) continue;
        lowp_moe_config c = {0};
        c.vocab = vocab;
        c.dim = presets[i].dim;
        c.layers = presets[i].layers;
        c.heads = presets[i].heads;
        c.seq_len = presets[i].seq_len;
        c.experts = presets[i].experts;
        c.top_k = presets[i].top_k;
        c.expert_hidden = presets[i].hidden;
        c.shared_hidden = presets[i].shared;
        c.rope_theta = 10000.0f;
        c.norm_eps = 1e-5f;
        c.aux_loss_coef = c.experts > 0 ? 0.01f : 0.0f;
        c.dropout = 0.0f;
        *out = c;
        return LOWP_OK;
    }
    return lowp_fail(LOWP_ERR_NOT_FOUND,
                     "lowp_moe_config_preset: name \"%s\" is not a preset (tiny, small, medium, "
                     "nanogpt)",
                     name);
}

/* lowp_model_create under the name `fn` the caller used (so lowp_model_forward's and
 * lowp_model_backward's twins below). */
static lowp_status create(const char *fn, const lowp_moe_config *cfg, uint64_t seed,
                          lowp_model **out) {
    LOWP_CHECK_PTR(fn, cfg);
    LOWP_CHECK_PTR(fn, out);
    *out = NULL;
    lowp_model *m = calloc(1, sizeof *m);
    if (m == NULL) return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: model struct", fn);
    /* A new model is a new entry here: the configuration says which one it is. */
    m->ops = cfg->experts == 0 ? &dense_model_ops : &moe_model_ops;
    m->cfg = *cfg;
    lowp_status st = m->ops->create(fn, cfg, seed, &m->ctx);
    if (st != LOWP_OK) {
        free(m);
        return st;
    }
    *out = m;
    return LOWP_OK;
}

lowp_status lowp_model_create(const lowp_moe_config *cfg, uint64_t seed, lowp_model **out) {
    return create("lowp_model_create", cfg, seed, out);
}

void lowp_model_free(lowp_model *m) {
    if (m == NULL) return;
    m->ops->free(m->ctx);
    free(m);
    /* The blocks its updates released (GEMM workspaces, quantized copies) go back too; another
     * model's next update refills the cache. */
    lowp_host_empty_cache();
}

lowp_status lowp_model_get_config(const lowp_model *m, lowp_moe_config *out) {
    LOWP_CHECK_PTR("lowp_model_get_config", m);
    LOWP_CHECK_PTR("lowp_model_get_config", out);
    *out = m->cfg;
    return LOWP_OK;
}

lowp_status lowp_model_params(lowp_model *m, lowp_param **params, int32_t *n) {
    LOWP_CHECK_PTR("lowp_model_params", m);
    LOWP_CHECK_PTR("lowp_model_params", params);
    LOWP_CHECK_PTR("lowp_model_params", n);
    m->ops->params(m->ctx, params, n);
    return LOWP_OK;
}

static lowp_status check_ids(const char *fn, const int32_t *ids, int64_t n, int32_t V,
                             const char *what) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s[%lld] (%d) is outside [0, vocab = %d)",
                             fn, what, (long long) i, ids[i], V);
    return LOWP_OK;
}

/* lowp_model_forward under the name `fn` the caller used. */
static lowp_status forward(const char *fn, lowp_model *m, const int32_t *tokens,
                           const int32_t *targets, int32_t B, int32_t T, const lowp_model_run *run,
                           float *loss) {
    LOWP_CHECK_PTR(fn, m);
    LOWP_CHECK_PTR(fn, tokens);
    const lowp_moe_config *c = &m->cfg;
    if (B <= 0) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: B (%d) must be > 0", fn, B);
    if (T <= 0 || T > c->seq_len)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: T (%d) must be in [1, cfg.seq_len = %d]", fn, T,
                         c->seq_len);
    const int64_t N = (int64_t) B * T;
    lowp_status st = check_ids(fn, tokens, N, c->vocab, "tokens");
    if (st != LOWP_OK) return st;
    if (targets && (st = check_ids(fn, targets, N, c->vocab, "targets")) != LOWP_OK) return st;
    const lowp_model_run none = {0};
    if (run == NULL) run = &none;
    if (run->threads < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: run.threads (%d) must be >= 0", fn,
                         run->threads);
    return m->ops->forward(m->ctx, fn, tokens, targets, B, T, run, loss);
}

lowp_status lowp_model_forward(lowp_model *m, const int32_t *tokens, const int32_t *targets,
                               int32_t B, int32_t T, const lowp_model_run *run, float *loss) {
    return forward("lowp_model_forward", m, tokens, targets, B, T, run, loss);
}

static lowp_status backward(const char *fn, lowp_model *m) {
    LOWP_CHECK_PTR(fn, m);
    return m->ops->backward(m->ctx, fn);
}

lowp_status lowp_model_backward(lowp_model *m) {
    return backward("lowp_model_backward", m);
}

lowp_status lowp_model_logits(const lowp_model *m, const float **logits) {
    LOWP_CHECK_PTR("lowp_model_logits", m);
    LOWP_CHECK_PTR("lowp_model_logits", logits);
    if ((*logits = m->ops->logits(m->ctx)) == NULL)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_model_logits: no forward has run");
    return LOWP_OK;
}

lowp_status lowp_model_loss_terms(const lowp_model *m, float *cross_entropy, float *aux) {
    LOWP_CHECK_PTR("lowp_model_loss_terms", m);
    if (m->ops->logits(m->ctx) == NULL)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_model_loss_terms: no forward has run");
    double ce, a;
    m->ops->loss_terms(m->ctx, &ce, &a);
    if (cross_entropy) *cross_entropy = (float) ce;
    if (aux) *aux = (float) a;
    return LOWP_OK;
}

double model_loss_f64(const lowp_model *m) {
    double ce, aux;
    m->ops->loss_terms(m->ctx, &ce, &aux);
    return ce + (double) m->cfg.aux_loss_coef * aux;
}

lowp_status lowp_model_active_params(const lowp_model *m, int64_t *active, int64_t *total) {
    LOWP_CHECK_PTR("lowp_model_active_params", m);
    LOWP_CHECK_PTR("lowp_model_active_params", active);
    LOWP_CHECK_PTR("lowp_model_active_params", total);
    lowp_param *ps;
    int32_t n;
    m->ops->params(m->ctx, &ps, &n);
    int64_t all = 0;
    for (int32_t i = 0; i < n; i++) all += lowp_param_numel(&ps[i]);
    *total = all;
    *active = all - m->ops->idle_params(&m->cfg);
    return LOWP_OK;
}

lowp_status lowp_model_flops_per_token(const lowp_model *m, int32_t T, double *flops) {
    LOWP_CHECK_PTR("lowp_model_flops_per_token", m);
    LOWP_CHECK_PTR("lowp_model_flops_per_token", flops);
    if (T <= 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_model_flops_per_token: T (%d) must be > 0", T);
    int64_t active, total;
    lowp_status st = lowp_model_active_params(m, &active, &total);
    if (st != LOWP_OK) return st;
    /* A lookup table (an embedding) costs no multiply-adds. */
    const double gemm_params = (double) active - m->ops->lookup_params(&m->cfg);
    *flops = 6.0 * gemm_params + 12.0 * m->cfg.layers * m->cfg.dim * (double) T;
    return LOWP_OK;
}

/* ---------------------------------------------------------------- the names of 0.2 */

lowp_status lowp_moe_create(const lowp_moe_config *cfg, uint64_t seed, lowp_moe **out) {
    return create("lowp_moe_create", cfg, seed, out);
}
void lowp_moe_free(lowp_moe *m) {
    lowp_model_free(m);
}
lowp_status lowp_moe_get_config(const lowp_moe *m, lowp_moe_config *out) {
    return lowp_model_get_config(m, out);
}
lowp_status lowp_moe_params(lowp_moe *m, lowp_param **params, int32_t *n) {
    return lowp_model_params(m, params, n);
}
lowp_status lowp_moe_forward(lowp_moe *m, const int32_t *tokens, const int32_t *targets, int32_t B,
                             int32_t T, const lowp_moe_run *run, float *loss) {
    return forward("lowp_moe_forward", m, tokens, targets, B, T, run, loss);
}
lowp_status lowp_moe_backward(lowp_moe *m) {
    return backward("lowp_moe_backward", m);
}
lowp_status lowp_moe_logits(const lowp_moe *m, const float **logits) {
    return lowp_model_logits(m, logits);
}
lowp_status lowp_moe_loss_terms(const lowp_moe *m, float *cross_entropy, float *aux) {
    return lowp_model_loss_terms(m, cross_entropy, aux);
}
lowp_status lowp_moe_active_params(const lowp_moe *m, int64_t *active, int64_t *total) {
    return lowp_model_active_params(m, active, total);
}
lowp_status lowp_moe_flops_per_token(const lowp_moe *m, int32_t T, double *flops) {
    return lowp_model_flops_per_token(m, T, flops);
}
