/* The MoE transformer of model.h behind model_ops (model_internal.h), top to bottom: its
 * configuration check, its parameters, the activation arena, and the pass over the model
 *
 *   x_0 = embed[tokens]
 *   x_{l+1} = x_mid + drop(moe(ffn_norm(x_mid))),  x_mid = x_l + drop(attn(attn_norm(x_l)))
 *   logits = final_norm(x_L) Head^T;  loss = mean cross-entropy + aux_coef * mean_l aux_l
 *
 * with its backward in reverse order and optional activation checkpointing. The two halves of
 * a layer live in moe_attention.c and moe_ffn.c; the linear-layer wrappers that all three
 * use, in moe_linear.c. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

typedef struct moe_model {
    lowp_moe_config cfg;
    model_params p;             /* embed, L x MOE_LAYER_PARAMS, final_norm, head; the RoPE
                                   tables in p.extra */
    float *rope_cos, *rope_sin; /* [seq_len, hd / 2] */

    /* The activation arena, laid out anew for each forward's (B, T) and mode. */
    char *act_arena;
    size_t act_cap;
    moe_dims d;                /* of the last forward */
    moe_exec ex;               /* of the last forward, for its backward */
    int32_t checkpoint;        /* the last forward kept only the layer inputs */
    int32_t can_backward;      /* the last forward was a training forward with targets */
    int32_t *tokens, *targets; /* [N] copies for the backward */
    float *xs;                 /* [L + 1, N, D] the residual stream: each layer's input */
    float **x_mid;             /* [L] -> [N, D] x + attention branch */
    moe_attn_acts *attn;       /* [L] (buffers shared by all layers when checkpointing) */
    moe_ffn_acts *ffn;         /* [L] */
    float *hf, *rstdf;         /* [N, D], [N]  final_norm(x_L) */
    float *logits;             /* [N, V] */
    float *lse;                /* [N]    log-sum-exp of each row of logits */
    double *row_loss;          /* [N] */
    float *dlogits;            /* [N, V] */
    moe_grads g;
    lowp_linear_saved *head_saved;
    double ce, aux; /* of the last forward with targets; aux = mean_l aux_l */

    /* Dropout replay for checkpointing: the tracker's states before each layer's forward
     * (rows 0 .. L - 1) and after the last one (row L). */
    lowp_rng_state (*rng_states)[LOWP_RNG_MAX_STATES]; /* [L + 1] */
    int32_t rng_nstates;
} moe_model;

/* ---------------------------------------------------------------- the configuration */

static lowp_status config_check(const lowp_moe_config *c, const char *fn) {
    const struct {
        const char *name;
        int32_t value;
    } positive[] = {{"vocab", c->vocab},
                    {"dim", c->dim},
                    {"layers", c->layers},
                    {"heads", c->heads},
                    {"seq_len", c->seq_len},
                    {"experts", c->experts},
                    {"top_k", c->top_k},
                    {"expert_hidden", c->expert_hidden},
                    {"shared_hidden", c->shared_hidden}};
    for (size_t i = 0; i < sizeof positive / sizeof positive[0]; i++)
        if (positive[i].value <= 0)
            return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.%s (%d) must be > 0", fn,
                             positive[i].name, positive[i].value);
    if (c->dim % c->heads != 0 || (c->dim / c->heads) % 2 != 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: cfg.dim (%d) / cfg.heads (%d) must be a whole, even head width "
                         "(RoPE rotates pairs)",
                         fn, c->dim, c->heads);
    if (c->top_k > c->experts)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.top_k (%d) > cfg.experts (%d)", fn,
                         c->top_k, c->experts);
    if (!(c->rope_theta > 1.0f) || !isfinite(c->rope_theta))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.rope_theta (%g) must be > 1", fn,
                         (double) c->rope_theta);
    if (!(c->norm_eps > 0.0f) || !isfinite(c->norm_eps))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.norm_eps (%g) must be > 0", fn,
                         (double) c->norm_eps);
    if (!(c->aux_loss_coef >= 0.0f) || !isfinite(c->aux_loss_coef))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.aux_loss_coef (%g) must be >= 0", fn,
                         (double) c->aux_loss_coef);
    if (!(c->dropout >= 0.0f && c->dropout < 1.0f))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.dropout (%g) must be in [0, 1)", fn,
                         (double) c->dropout);
    /* Keep every buffer's element count well inside int32 row offsets and size_t. */
    const double per_layer = 4.0 * c->dim * c->dim + 3.0 * c->experts * c->expert_hidden * c->dim +
                             3.0 * c->shared_hidden * c->dim + (double) c->experts * c->dim;
    const double total = per_layer * c->layers + 2.0 * c->vocab * c->dim;
    if (total > 1e10)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: the configuration has %.3g parameters (> 1e10)",
                         fn, total);
    return model_size_check(c, fn, total);
}

/* ---------------------------------------------------------------- parameters */

static lowp_param *layer_params(moe_model *m, int64_t l) {
    return m->p.params + 1 + l * MOE_LAYER_PARAMS;
}

/* The parameter tables and the per-layer state, sized for the configuration. */
static lowp_status alloc_tables(moe_model *m, const char *fn) {
    const int32_t L = m->cfg.layers;
    lowp_status st = model_params_alloc(&m->p, 3 + L * MOE_LAYER_PARAMS, fn);
    if (st != LOWP_OK) return st;
    m->x_mid = calloc((size_t) L, sizeof *m->x_mid);
    m->attn = calloc((size_t) L, sizeof *m->attn);
    m->ffn = calloc((size_t) L, sizeof *m->ffn);
    m->rng_states = calloc((size_t) L + 1, sizeof *m->rng_states);
    if (!m->x_mid || !m->attn || !m->ffn || !m->rng_states)
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: parameter tables", fn);
    return LOWP_OK;
}

/* Names, shapes and initial scales, in the order lowp_model_params reports. Linears and the
 * embedding draw N(0, 0.02); the projections that write into the residual stream (wo, w2)
 * are scaled down by sqrt(2 L) so the stream's variance does not grow with depth; norm
 * weights start at 1 (init_std < 0). */
static void describe_params(moe_model *m) {
    const lowp_moe_config *cfg = &m->cfg;
    const int32_t L = cfg->layers;
    const int64_t D = cfg->dim, V = cfg->vocab, E = cfg->experts;
    const int64_t H = cfg->expert_hidden, Hs = cfg->shared_hidden;
    const float std = 0.02f, std_out = 0.02f / sqrtf(2.0f * (float) L);
    model_params *p = &m->p;
    model_params_add(p, 0, V, D, std, "embed");
    for (int32_t l = 0; l < L; l++) {
        model_params_add(p, 0, 1, D, -1.0f, "layers.%d.attn_norm", l);
        model_params_add(p, 0, D, D, std, "layers.%d.attn.wq", l);
        model_params_add(p, 0, D, D, std, "layers.%d.attn.wk", l);
        model_params_add(p, 0, D, D, std, "layers.%d.attn.wv", l);
        model_params_add(p, 0, D, D, std_out, "layers.%d.attn.wo", l);
        model_params_add(p, 0, 1, D, -1.0f, "layers.%d.ffn_norm", l);
        model_params_add(p, 0, E, D, std, "layers.%d.moe.router", l);
        model_params_add(p, 0, Hs, D, std, "layers.%d.moe.shared.w1", l);
        model_params_add(p, 0, Hs, D, std, "layers.%d.moe.shared.w3", l);
        model_params_add(p, 0, D, Hs, std_out, "layers.%d.moe.shared.w2", l);
        model_params_add(p, E, H, D, std, "layers.%d.moe.experts.w1", l);
        model_params_add(p, E, H, D, std, "layers.%d.moe.experts.w3", l);
        model_params_add(p, E, D, H, std_out, "layers.%d.moe.experts.w2", l);
    }
    model_params_add(p, 0, 1, D, -1.0f, "final_norm");
    model_params_add(p, 0, V, D, std, "head");
}

/* RoPE: position t, pair i turns by t * theta^(-2i / hd), computed in binary64. */
static void fill_rope(moe_model *m) {
    const int64_t half = m->cfg.dim / m->cfg.heads / 2;
    for (int64_t t = 0; t < m->cfg.seq_len; t++)
        for (int64_t i = 0; i < half; i++) {
            const double angle =
                (double) t * pow((double) m->cfg.rope_theta, -(double) i / (double) half);
            m->rope_cos[t * half + i] = (float) cos(angle);
            m->rope_sin[t * half + i] = (float) sin(angle);
        }
}

static void moe_free(void *ctx);

/* The steps of moe_create after the checks, on a zeroed model holding its cfg (the caller
 * frees it on failure): the tables, the weights, the RoPE tables after the gradients. */
static lowp_status build(moe_model *m, uint64_t seed, const char *fn) {
    lowp_status st = alloc_tables(m, fn);
    if (st != LOWP_OK) return st;
    describe_params(m);
    const int64_t rope_floats =
        (m->cfg.seq_len * (int64_t) (m->cfg.dim / m->cfg.heads / 2) + 15) / 16 * 16;
    if ((st = model_params_init(&m->p, seed, 2 * rope_floats, fn)) != LOWP_OK) return st;
    m->rope_cos = m->p.extra;
    m->rope_sin = m->rope_cos + rope_floats;
    fill_rope(m);
    return LOWP_OK;
}

static lowp_status moe_create(const char *fn, const lowp_moe_config *cfg, uint64_t seed,
                              void **ctx) {
    lowp_status st = config_check(cfg, fn);
    if (st != LOWP_OK) return st;
    moe_model *m = calloc(1, sizeof *m);
    if (m == NULL) return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: model struct", fn);
    m->cfg = *cfg;
    if ((st = build(m, seed, fn)) != LOWP_OK) {
        moe_free(m);
        return st;
    }
    *ctx = m;
    return LOWP_OK;
}

/* Frees what the linear layers saved for a backward that will not come. */
static void release_saved(moe_model *m) {
    for (int32_t l = 0; l < m->cfg.layers; l++) {
        lowp_linear_saved **as = m->attn[l].saved, **fs = m->ffn[l].saved;
        for (size_t i = 0; i < sizeof m->attn[l].saved / sizeof *as; i++) {
            lowp_linear_saved_free(as[i]);
            as[i] = NULL;
        }
        for (size_t i = 0; i < sizeof m->ffn[l].saved / sizeof *fs; i++) {
            lowp_linear_saved_free(fs[i]);
            fs[i] = NULL;
        }
    }
    lowp_linear_saved_free(m->head_saved);
    m->head_saved = NULL;
    m->can_backward = 0;
}

static void moe_free(void *ctx) {
    moe_model *m = ctx;
    if (m == NULL) return;
    if (m->attn && m->ffn) release_saved(m);
    model_params_free(&m->p);
    free(m->act_arena);
    free(m->x_mid);
    free(m->attn);
    free(m->ffn);
    free(m->rng_states);
    free(m);
}

static void moe_params(void *ctx, lowp_param **params, int32_t *n) {
    moe_model *m = ctx;
    *params = m->p.params;
    *n = m->p.n;
}

/* The E - top_k experts a token skips, in every layer. */
static int64_t moe_idle_params(const lowp_moe_config *c) {
    return (int64_t) c->layers * (c->experts - c->top_k) * 3 * c->expert_hidden * c->dim;
}

/* The embedding is a lookup, not a GEMM: its table costs no multiply-adds. */
static double moe_lookup_params(const lowp_moe_config *c) {
    return (double) c->vocab * c->dim;
}

/* ---------------------------------------------------------------- the activation arena */

static float *carve_f(moe_carver *c, int64_t n) {
    return moe_carve(c, n, sizeof(float));
}
static int32_t *carve_i(moe_carver *c, int64_t n) {
    return moe_carve(c, n, sizeof(int32_t));
}

/* Lays the arena out for dims d (c->base NULL: only measures). shared: every layer's buffers
 * are one scratch set (checkpointing, inference); grads: with the backward's scratch;
 * dropout: with masks. The residual stream xs is always per layer. */
static void act_layout(moe_model *m, const moe_dims *d, int shared, int grads, int dropout,
                       moe_carver *c) {
    const int64_t N = d->N, D = d->D, S = d->S, L = d->L;
    m->tokens = carve_i(c, N);
    m->targets = carve_i(c, N);
    m->xs = carve_f(c, (L + 1) * N * D);
    for (int64_t l = 0; l < L; l++) {
        if (shared && l > 0) {
            /* Same buffers as layer 0; only the linear layers' saved state is per layer. */
            m->x_mid[l] = m->x_mid[0];
            moe_attn_acts a0 = m->attn[0];
            moe_ffn_acts f0 = m->ffn[0];
            memcpy(a0.saved, m->attn[l].saved, sizeof a0.saved);
            memcpy(f0.saved, m->ffn[l].saved, sizeof f0.saved);
            m->attn[l] = a0;
            m->ffn[l] = f0;
            continue;
        }
        moe_attn_acts *a = &m->attn[l];
        a->h = carve_f(c, N * D);
        a->rstd = carve_f(c, N);
        a->q = carve_f(c, N * D);
        a->k = carve_f(c, N * D);
        a->v = carve_f(c, N * D);
        a->att = carve_f(c, d->B * d->nh * d->T * d->T);
        a->o = carve_f(c, N * D);
        a->y = carve_f(c, N * D);
        a->mask = dropout ? moe_carve(c, N * D, 1) : NULL;
        m->x_mid[l] = carve_f(c, N * D);
        moe_ffn_acts *f = &m->ffn[l];
        f->h = carve_f(c, N * D);
        f->rstd = carve_f(c, N);
        f->probs = carve_f(c, N * d->E);
        f->idx = carve_i(c, S);
        f->gate = carve_f(c, S);
        f->pos = carve_i(c, S);
        f->offs = carve_i(c, d->E);
        f->frac = carve_f(c, d->E);
        f->xp = carve_f(c, S * D);
        f->u1 = carve_f(c, S * d->H);
        f->u3 = carve_f(c, S * d->H);
        f->s = carve_f(c, S * d->H);
        f->eo = carve_f(c, S * D);
        f->su1 = carve_f(c, N * d->Hs);
        f->su3 = carve_f(c, N * d->Hs);
        f->ss = carve_f(c, N * d->Hs);
        f->y = carve_f(c, N * D);
        f->mask = dropout ? moe_carve(c, N * D, 1) : NULL;
    }
    m->hf = carve_f(c, N * D);
    m->rstdf = carve_f(c, N);
    m->logits = carve_f(c, N * d->V);
    m->lse = carve_f(c, N);
    m->row_loss = moe_carve(c, N, sizeof(double));
    moe_grads *g = &m->g;
    memset(g, 0, sizeof *g);
    m->dlogits = NULL;
    if (!grads) return;
    m->dlogits = carve_f(c, N * d->V);
    g->dres = carve_f(c, N * D);
    g->dbranch = carve_f(c, N * D);
    g->dh = carve_f(c, N * D);
    g->dtmp = carve_f(c, N * D);
    g->dq = carve_f(c, N * D);
    g->dk = carve_f(c, N * D);
    g->dv = carve_f(c, N * D);
    g->do_ = carve_f(c, N * D);
    g->dgate = carve_f(c, S);
    g->dprobs = carve_f(c, N * d->E);
    g->deo = carve_f(c, S * D);
    g->dxp = carve_f(c, S * D);
    g->dxp3 = carve_f(c, S * D);
    g->ds = carve_f(c, S * d->H);
    g->du1 = carve_f(c, S * d->H);
    g->du3 = carve_f(c, S * d->H);
    g->dss = carve_f(c, N * d->Hs);
    g->dsu1 = carve_f(c, N * d->Hs);
    g->dsu3 = carve_f(c, N * d->Hs);
}

/* Grows the arena when this pass needs more than it holds, then lays it out. */
static lowp_status act_prepare(const char *fn, moe_model *m, const moe_dims *d, int shared,
                               int grads, int dropout) {
    moe_carver measure = {NULL, 0};
    act_layout(m, d, shared, grads, dropout, &measure);
    const size_t need = (measure.off + 63) / 64 * 64;
    if (need > m->act_cap) {
        free(m->act_arena);
        m->act_cap = 0;
        m->act_arena = lowp_host_alloc(need);
        if (m->act_arena == NULL)
            return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: %zu bytes of activations (B*T = %lld)",
                             fn, need, (long long) d->N);
        m->act_cap = need;
    }
    moe_carver place = {m->act_arena, 0};
    act_layout(m, d, shared, grads, dropout, &place);
    return LOWP_OK;
}

/* ---------------------------------------------------------------- one decoder layer */

/* Inverted dropout of a residual branch, in place; off when ex->rng is NULL. */
static lowp_status branch_dropout(const moe_exec *ex, float *y, uint8_t *mask, int64_t n) {
    if (ex->rng == NULL) return LOWP_OK;
    return lowp_dropout_forward(ex->rng, y, mask, y, (size_t) n, ex->dropout);
}

/* x_{l+1} = x_mid + drop(moe(x_mid)),  x_mid = x_l + drop(attn(x_l)). keep: the linear layers
 * save their state for a backward. */
static lowp_status layer_forward(moe_model *m, int64_t l, const moe_exec *ex, int keep) {
    const moe_dims *d = &m->d;
    const int64_t ND = d->N * d->D;
    lowp_param *lp = layer_params(m, l);
    const float *x = m->xs + l * ND;
    float *x_mid = m->x_mid[l], *x_out = m->xs + (l + 1) * ND;
    lowp_status st;

    st = moe_attention_forward(lp, d, ex, m->rope_cos, m->rope_sin, x, &m->attn[l], keep);
    if (st != LOWP_OK) return st;
    if ((st = branch_dropout(ex, m->attn[l].y, m->attn[l].mask, ND)) != LOWP_OK) return st;
    moe_sum(x_mid, x, m->attn[l].y, ND, ex->nthreads);

    st = moe_ffn_forward(lp, d, ex, x_mid, &m->ffn[l], keep);
    if (st != LOWP_OK) return st;
    if ((st = branch_dropout(ex, m->ffn[l].y, m->ffn[l].mask, ND)) != LOWP_OK) return st;
    moe_sum(x_out, x_mid, m->ffn[l].y, ND, ex->nthreads);
    return LOWP_OK;
}

/* The branch's gradient: dres through dropout's backward into g->dbranch. */
static lowp_status branch_dropout_backward(const moe_exec *ex, const uint8_t *mask,
                                           const float *dres, float *dbranch, int64_t n) {
    if (ex->rng == NULL) {
        moe_copy(dbranch, dres, n, ex->nthreads);
        return LOWP_OK;
    }
    return lowp_dropout_backward(mask, dres, dbranch, (size_t) n, ex->dropout);
}

/* g->dres: dLoss/dx_{l+1} on entry, dLoss/dx_l on return. */
static lowp_status layer_backward(moe_model *m, int64_t l, const moe_exec *ex) {
    const moe_dims *d = &m->d;
    const int64_t ND = d->N * d->D;
    lowp_param *lp = layer_params(m, l);
    moe_grads *g = &m->g;
    lowp_status st;

    /* x_{l+1} = x_mid + drop(moe(x_mid)): dres += moe's backward, giving dLoss/dx_mid */
    st = branch_dropout_backward(ex, m->ffn[l].mask, g->dres, g->dbranch, ND);
    if (st != LOWP_OK) return st;
    const double daux = (double) d->aux_coef / (double) d->L;
    st = moe_ffn_backward(lp, d, ex, m->x_mid[l], &m->ffn[l], g->dbranch, daux, g->dres, g);
    if (st != LOWP_OK) return st;

    /* x_mid = x_l + drop(attn(x_l)): dres += attention's backward, giving dLoss/dx_l */
    st = branch_dropout_backward(ex, m->attn[l].mask, g->dres, g->dbranch, ND);
    if (st != LOWP_OK) return st;
    return moe_attention_backward(lp, d, ex, m->rope_cos, m->rope_sin, m->xs + l * ND, &m->attn[l],
                                  g->dbranch, g->dres, g);
}

/* ---------------------------------------------------------------- embedding and loss */

/* x [N, D]: row n = embed[tokens[n]] ([V, D]). */
static void embedding(const moe_dims *d, const float *embed, const int32_t *tokens, float *x) {
    for (int64_t n = 0; n < d->N; n++)
        memcpy(x + n * d->D, embed + (int64_t) tokens[n] * d->D, (size_t) d->D * sizeof(float));
}

/* dembed [V, D] += dx[n] at row tokens[n], in token order (a repeated token's rows add up in
 * the same order on every run). */
static void embedding_backward(const moe_dims *d, const int32_t *tokens, const float *dx,
                               float *dembed) {
    for (int64_t n = 0; n < d->N; n++) {
        float *row = dembed + (int64_t) tokens[n] * d->D;
        const float *src = dx + n * d->D;
        for (int64_t c = 0; c < d->D; c++) row[c] += src[c];
    }
}

/* ---------------------------------------------------------------- the model */

static lowp_status save_rng(moe_model *m, int64_t row) {
    return lowp_rng_tracker_get_states(m->ex.rng, m->rng_states[row], LOWP_RNG_MAX_STATES,
                                       &m->rng_nstates);
}

/* Rewind the generator to a saved row for a recomputed forward, except the states that the
 * linear layers' backward draws from (the FP4 recipes' "stochastic_rounding" and "hadamard"):
 * those keep their offsets, so no backward reuses another's random bits. */
static lowp_status rewind_rng(moe_model *m, int64_t row) {
    lowp_rng_state in[LOWP_RNG_MAX_STATES], now[LOWP_RNG_MAX_STATES];
    int32_t n = m->rng_nstates, nn = 0;
    lowp_status st = lowp_rng_tracker_get_states(m->ex.rng, now, LOWP_RNG_MAX_STATES, &nn);
    if (st != LOWP_OK) return st;
    memcpy(in, m->rng_states[row], (size_t) n * sizeof *in);
    for (int32_t i = 0; i < n; i++)
        if (strcmp(in[i].name, "stochastic_rounding") == 0 || strcmp(in[i].name, "hadamard") == 0)
            for (int32_t j = 0; j < nn; j++)
                if (strcmp(now[j].name, in[i].name) == 0) in[i].offset = now[j].offset;
    return lowp_rng_tracker_set_states(m->ex.rng, in, n);
}

static lowp_status with_context(lowp_status st, const char *fn, int64_t layer) {
    if (st == LOWP_OK) return st;
    if (layer >= 0)
        lowp_error_append("in %s, layer %lld", fn, (long long) layer);
    else
        lowp_error_append("in %s", fn);
    return st;
}

/* Arguments checked by lowp_model_forward (model.c), all but the routed slots' count. */
static lowp_status moe_forward(void *ctx, const char *fn, const int32_t *tokens,
                               const int32_t *targets, int32_t B, int32_t T,
                               const lowp_model_run *run, float *loss) {
    moe_model *m = ctx;
    const lowp_moe_config *c = &m->cfg;
    const int64_t N = (int64_t) B * T;
    if (N * c->top_k > INT32_MAX / 2)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: B * T * top_k (%lld) overflows the experts' int32 row offsets", fn,
                         (long long) (N * c->top_k));
    lowp_status st;
    release_saved(m);
    m->ce = NAN;
    const int training = run->training != 0;
    const int checkpoint = training && run->activation_checkpoint;

    moe_exec ex;
    memset(&ex, 0, sizeof ex);
    ex.lin.threads = run->threads;
    ex.lin.fp32_plain = run->fp32_plain;
    ex.lin.cache_plain = 1; /* plain weights' BF16 copies once per version (freed with m) */
    ex.nthreads = lowp_thread_count(run->threads);
    ex.autocast = run->autocast;
    ex.rng = training && c->dropout > 0.0f ? run->rng : NULL;
    ex.lin.rng = training ? run->rng : NULL; /* the FP4 recipes' SR and Hadamard signs */
    ex.dropout = c->dropout;
    m->ex = ex;
    m->checkpoint = checkpoint;

    moe_dims *d = &m->d;
    d->B = B;
    d->T = T;
    d->N = N;
    d->D = c->dim;
    d->nh = c->heads;
    d->hd = c->dim / c->heads;
    d->E = c->experts;
    d->K = c->top_k;
    d->S = N * c->top_k;
    d->H = c->expert_hidden;
    d->Hs = c->shared_hidden;
    d->V = c->vocab;
    d->L = c->layers;
    d->eps = c->norm_eps;
    d->aux_coef = c->aux_loss_coef;
    /* Without a backward to come, the layers can share one set of buffers too. */
    st = act_prepare(fn, m, d, checkpoint || !training, training, ex.rng != NULL);
    if (st != LOWP_OK) return st;
    memcpy(m->tokens, tokens, (size_t) N * sizeof(int32_t));
    if (targets) memcpy(m->targets, targets, (size_t) N * sizeof(int32_t));

    /* x_0 [N, D] = embed[tokens] */
    embedding(d, m->p.params[0].data, tokens, m->xs);

    /* The layers. A checkpointed pass keeps nothing but x_l (and the dropout generator's
     * state before each layer, to replay the same masks when recomputing). */
    const int keep = training && !checkpoint;
    double aux = 0.0;
    for (int64_t l = 0; l < d->L; l++) {
        if (checkpoint && ex.rng && (st = save_rng(m, l)) != LOWP_OK)
            return with_context(st, fn, l);
        if ((st = layer_forward(m, l, &ex, keep)) != LOWP_OK) return with_context(st, fn, l);
        aux += m->ffn[l].aux;
    }
    if (checkpoint && ex.rng && (st = save_rng(m, d->L)) != LOWP_OK)
        return with_context(st, fn, -1);

    /* hf [N, D] = final_norm(x_L); logits [N, V] = hf Head^T */
    const int64_t D = d->D;
    lowp_tensor xt = moe_tensor(m->xs + d->L * N * D, N, D), ht = moe_tensor(m->hf, N, D);
    st = lowp_rmsnorm_forward_nt(&xt, m->p.params[m->p.n - 2].data, d->eps, &ht, m->rstdf,
                                 ex.autocast, ex.nthreads);
    if (st != LOWP_OK) return with_context(st, fn, -1);
    st = moe_linear_fwd(&m->p.params[m->p.n - 1], m->hf, N, m->logits, &ex,
                        training ? &m->head_saved : NULL);
    if (st != LOWP_OK) return with_context(st, fn, -1);
    m->aux = aux / (double) d->L;
    if (targets == NULL) return LOWP_OK;

    /* loss = mean cross-entropy + aux_coef * mean_l aux_l */
    m->ce = moe_cross_entropy(d, m->logits, targets, m->lse, m->row_loss, ex.nthreads);
    if (loss) *loss = (float) (m->ce + (double) c->aux_loss_coef * m->aux);
    m->can_backward = training;
    return LOWP_OK;
}

static lowp_status moe_backward(void *ctx, const char *fn) {
    moe_model *m = ctx;
    if (!m->can_backward)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: no training forward with targets to differentiate (run.training "
                         "was 0, targets were NULL, the forward failed, or its backward ran)",
                         fn);
    m->can_backward = 0;
    moe_exec ex = m->ex;
    const moe_dims *d = &m->d;
    const int64_t N = d->N, D = d->D;
    moe_grads *g = &m->g;
    lowp_status st;

    /* dlogits [N, V] */
    moe_cross_entropy_backward(d, m->logits, m->targets, m->lse, m->dlogits, ex.nthreads);

    /* logits = hf Head^T:  dh [N, D] = dlogits Head;  hf = final_norm(x_L):  dres [N, D] */
    st = moe_linear_bwd(&m->p.params[m->p.n - 1], m->hf, N, m->dlogits, g->dh, &ex, &m->head_saved);
    if (st != LOWP_OK) return with_context(st, fn, -1);
    lowp_tensor xt = moe_tensor(m->xs + d->L * N * D, N, D), dht = moe_tensor(g->dh, N, D);
    lowp_tensor drt = moe_tensor(g->dres, N, D);
    lowp_param *fnorm = &m->p.params[m->p.n - 2];
    st = lowp_rmsnorm_backward_nt(&xt, fnorm->data, m->rstdf, &dht, &drt, fnorm->grad, ex.nthreads);
    if (st != LOWP_OK) return with_context(st, fn, -1);

    /* The layers in reverse. A checkpointed layer first runs its forward again, with the
     * dropout generator rewound to where that layer's first forward found it, and with
     * recompute set so the FP8 amax histories see the layer once per step. */
    for (int64_t l = d->L - 1; l >= 0; l--) {
        if (m->checkpoint) {
            if (ex.rng && (st = rewind_rng(m, l)) != LOWP_OK) return with_context(st, fn, l);
            ex.lin.recompute = 1;
            st = layer_forward(m, l, &ex, 1);
            ex.lin.recompute = 0;
            if (st != LOWP_OK) return with_context(st, fn, l);
        }
        if ((st = layer_backward(m, l, &ex)) != LOWP_OK) return with_context(st, fn, l);
    }
    if (m->checkpoint && ex.rng) {
        /* Leave the generator where the forward left it, as without checkpointing. */
        if ((st = rewind_rng(m, d->L)) != LOWP_OK) return with_context(st, fn, -1);
    }

    /* x_0 = embed[tokens]:  embed.grad += */
    embedding_backward(d, m->tokens, g->dres, m->p.params[0].grad);
    return LOWP_OK;
}

static const float *moe_logits(const void *ctx) {
    return ((const moe_model *) ctx)->logits;
}

static void moe_loss_terms(const void *ctx, double *ce, double *aux) {
    const moe_model *m = ctx;
    *ce = m->ce;
    *aux = m->aux;
}

const model_ops moe_model_ops = {
    .create = moe_create,
    .free = moe_free,
    .params = moe_params,
    .forward = moe_forward,
    .backward = moe_backward,
    .logits = moe_logits,
    .loss_terms = moe_loss_terms,
    .idle_params = moe_idle_params,
    .lookup_params = moe_lookup_params,
};
