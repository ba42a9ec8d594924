/* The dense GPT of model_internal.h (cfg.experts == 0), forward and backward side by side:
 * the shapes of nanoGPT's CPU recipe (LayerNorm, fused QKV projection, causal attention, GELU
 * MLP, learned positions, an output head tied to the token embedding), trained through the
 * same lowp_model API (model_ops, model_internal.h), trainer and recipes as the MoE model.
 *
 *   x_0 = wte[tokens] + wpe[t]
 *   h = ln_1(x);  q | k | v = h Wqkv^T;  o = causal softmax attention;  x_mid = x + o Wo^T
 *   g = gelu(ln_2(x_mid) Wfc^T);  x_out = x_mid + g Wproj^T
 *   logits = ln_f(x_L) wte^T;  loss = mean cross-entropy
 *
 * Every projection, the tied head included, is a lowp linear, so a recipe applies by name
 * (embed and the norms stay high precision under every built-in recipe). LayerNorm, GELU
 * (the exact erf form, nn.GELU's default) and the softmaxes compute in binary32 with binary64
 * row sums; the LayerNorm weight gradient sums rows in order, so no value depends on the
 * thread count. Dropout and activation checkpointing are refused (nanoGPT's CPU recipe has
 * dropout 0 and keeps its activations). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/profile_internal.h"
#include "cpu/host.h"
#include "model_internal.h"

/* One layer's activations, kept for the backward. */
typedef struct dense_acts {
    float *h1, *mean1, *rstd1;   /* [N, D], [N], [N]  ln_1(x) and its statistics */
    float *qkv;                  /* [N, 3 D]           h1 Wqkv^T */
    float *q, *k, *v;            /* [N, D]             its three column blocks */
    float *att;                  /* [B, nh, T, T]      attention probabilities */
    float *o;                    /* [N, D]             attention output (the input of wo) */
    float *x_mid;                /* [N, D]             x + o Wo^T */
    float *h2, *mean2, *rstd2;   /* [N, D], [N], [N]  ln_2(x_mid) */
    float *u, *g;                /* [N, H]             h2 Wfc^T and gelu(u) */
    float *gd;                   /* [N, H]             gelu'(u), made with g (one erff each) */
    lowp_linear_saved *saved[4]; /* wqkv, wo, fc, proj */
} dense_acts;

typedef struct dense_model {
    lowp_moe_config cfg;
    model_params p;
    char *arena; /* the activations, laid out anew for each (B, T) */
    size_t cap;
    moe_dims d;
    moe_exec ex;
    int can_backward;
    int32_t *tokens, *targets; /* [N] */
    float *xs;                 /* [L + 1, N, D] the residual stream */
    dense_acts *acts;          /* [L] */
    float *hf, *meanf, *rstdf; /* [N, D], [N], [N]  ln_f(x_L) */
    float *logits, *lse;       /* [N, V], [N] */
    double *row_loss;          /* [N] */
    float *dlogits;            /* [N, V] */
    float *dres, *dh, *dtmp;   /* [N, D] */
    float *dqkv;               /* [N, 3 D] */
    float *dq, *dk, *dv, *do_; /* [N, D] */
    float *dg;                 /* [N, H] */
    lowp_linear_saved *head_saved;
    double ce;
} dense_model;

/* ---------------------------------------------------------------- the model and its parameters */

/* No routing fields, a plain MLP of width shared_hidden. */
static lowp_status config_check(const lowp_moe_config *c, const char *fn) {
    const struct {
        const char *name;
        int32_t value;
    } positive[] = {{"vocab", c->vocab},     {"dim", c->dim},
                    {"layers", c->layers},   {"heads", c->heads},
                    {"seq_len", c->seq_len}, {"shared_hidden", c->shared_hidden}};
    for (size_t i = 0; i < sizeof positive / sizeof positive[0]; i++)
        if (positive[i].value <= 0)
            return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.%s (%d) must be > 0", fn,
                             positive[i].name, positive[i].value);
    if (c->top_k != 0 || c->expert_hidden != 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: cfg.experts (0) selects the dense model, so cfg.top_k (%d) and "
                         "cfg.expert_hidden (%d) must be 0",
                         fn, c->top_k, c->expert_hidden);
    if (c->dim % c->heads != 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: cfg.dim (%d) is not a multiple of cfg.heads (%d)", fn, c->dim,
                         c->heads);
    if (!(c->norm_eps > 0.0f) || !isfinite(c->norm_eps))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.norm_eps (%g) must be > 0", fn,
                         (double) c->norm_eps);
    if (c->dropout != 0.0f || c->aux_loss_coef != 0.0f)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: the dense model (cfg.experts = 0) has no dropout and no "
                         "load-balancing loss: cfg.dropout (%g) and cfg.aux_loss_coef (%g) must "
                         "be 0",
                         fn, (double) c->dropout, (double) c->aux_loss_coef);
    const double total = (4.0 * c->dim * c->dim + 2.0 * c->shared_hidden * c->dim) * c->layers +
                         ((double) c->vocab + c->seq_len) * c->dim;
    if (total > 1e10)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: the configuration has %.3g parameters (> 1e10)",
                         fn, total);
    return model_size_check(c, fn, total);
}

/* nanoGPT's block, in the order of model_internal.h; N(0, 0.02), the projections into the
 * residual stream (wo, proj) scaled by 1/sqrt(2 L), norm weights 1. The head is the
 * embedding (tied), so there is no "head". */
static void describe_params(dense_model *s) {
    const lowp_moe_config *cfg = &s->cfg;
    const int32_t L = cfg->layers;
    const int64_t D = cfg->dim, Hs = cfg->shared_hidden;
    const float std = 0.02f, std_out = 0.02f / sqrtf(2.0f * (float) L);
    model_params *p = &s->p;
    model_params_add(p, 0, cfg->vocab, D, std, "embed");
    model_params_add(p, 0, cfg->seq_len, D, std, "pos_embed");
    for (int32_t l = 0; l < L; l++) {
        model_params_add(p, 0, 1, D, -1.0f, "layers.%d.attn_norm", l);
        model_params_add(p, 0, 3 * D, D, std, "layers.%d.attn.wqkv", l);
        model_params_add(p, 0, D, D, std_out, "layers.%d.attn.wo", l);
        model_params_add(p, 0, 1, D, -1.0f, "layers.%d.ffn_norm", l);
        model_params_add(p, 0, Hs, D, std, "layers.%d.mlp.fc", l);
        model_params_add(p, 0, D, Hs, std_out, "layers.%d.mlp.proj", l);
    }
    model_params_add(p, 0, 1, D, -1.0f, "final_norm");
}

static void dense_free(void *ctx);

static lowp_status dense_create(const char *fn, const lowp_moe_config *cfg, uint64_t seed,
                                void **ctx) {
    lowp_status st = config_check(cfg, fn);
    if (st != LOWP_OK) return st;
    dense_model *s = calloc(1, sizeof *s);
    if (s) s->acts = calloc((size_t) cfg->layers, sizeof *s->acts);
    if (!s || !s->acts) {
        free(s);
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: dense model state", fn);
    }
    s->cfg = *cfg;
    s->ce = NAN;
    st = model_params_alloc(&s->p, 3 + cfg->layers * DENSE_LAYER_PARAMS, fn);
    if (st == LOWP_OK) {
        describe_params(s);
        st = model_params_init(&s->p, seed, 0, fn);
    }
    if (st != LOWP_OK) {
        dense_free(s);
        return st;
    }
    *ctx = s;
    return LOWP_OK;
}

static void release_saved(dense_model *s) {
    for (int32_t l = 0; l < s->cfg.layers; l++)
        for (int i = 0; i < 4; i++) {
            lowp_linear_saved_free(s->acts[l].saved[i]);
            s->acts[l].saved[i] = NULL;
        }
    lowp_linear_saved_free(s->head_saved);
    s->head_saved = NULL;
    s->can_backward = 0;
}

static void dense_free(void *ctx) {
    dense_model *s = ctx;
    if (!s) return;
    release_saved(s);
    model_params_free(&s->p);
    free(s->arena);
    free(s->acts);
    free(s);
}

/* ---------------------------------------------------------------- the activation arena */

static float *carve_f(moe_carver *c, int64_t n) {
    return moe_carve(c, n, sizeof(float));
}

static void layout(dense_model *s, int grads, moe_carver *c) {
    const moe_dims *d = &s->d;
    const int64_t N = d->N, D = d->D, H = d->Hs, L = d->L;
    s->tokens = moe_carve(c, N, sizeof(int32_t));
    s->targets = moe_carve(c, N, sizeof(int32_t));
    s->xs = carve_f(c, (L + 1) * N * D);
    for (int64_t l = 0; l < L; l++) {
        dense_acts *a = &s->acts[l];
        a->h1 = carve_f(c, N * D);
        a->mean1 = carve_f(c, N);
        a->rstd1 = carve_f(c, N);
        a->qkv = carve_f(c, N * 3 * D);
        a->q = carve_f(c, N * D);
        a->k = carve_f(c, N * D);
        a->v = carve_f(c, N * D);
        a->att = carve_f(c, d->B * d->nh * d->T * d->T);
        a->o = carve_f(c, N * D);
        a->x_mid = carve_f(c, N * D);
        a->h2 = carve_f(c, N * D);
        a->mean2 = carve_f(c, N);
        a->rstd2 = carve_f(c, N);
        a->u = carve_f(c, N * H);
        a->g = carve_f(c, N * H);
        a->gd = carve_f(c, N * H);
    }
    s->hf = carve_f(c, N * D);
    s->meanf = carve_f(c, N);
    s->rstdf = carve_f(c, N);
    s->logits = carve_f(c, N * d->V);
    s->lse = carve_f(c, N);
    s->row_loss = moe_carve(c, N, sizeof(double));
    if (!grads) return;
    s->dlogits = carve_f(c, N * d->V);
    s->dres = carve_f(c, N * D);
    s->dh = carve_f(c, N * D);
    s->dtmp = carve_f(c, N * D);
    s->dqkv = carve_f(c, N * 3 * D);
    s->dq = carve_f(c, N * D);
    s->dk = carve_f(c, N * D);
    s->dv = carve_f(c, N * D);
    s->do_ = carve_f(c, N * D);
    s->dg = carve_f(c, N * H);
}

static lowp_status prepare(const char *fn, dense_model *s, int grads) {
    moe_carver measure = {NULL, 0};
    layout(s, grads, &measure);
    const size_t need = (measure.off + 63) / 64 * 64;
    if (need > s->cap) {
        free(s->arena);
        s->cap = 0;
        s->arena = lowp_host_alloc(need);
        if (!s->arena)
            return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: %zu bytes of activations (B*T = %lld)",
                             fn, need, (long long) s->d.N);
        s->cap = need;
    }
    moe_carver place = {s->arena, 0};
    layout(s, grads, &place);
    return LOWP_OK;
}

/* ---------------------------------------------------------------- LayerNorm and GELU */

/* y [N, D] = (x - mean) * rstd * w per row; mean, rstd [N] kept. */
static void layernorm_forward(const float *x, const float *w, float eps, int64_t N, int64_t D,
                              float *y, float *mean, float *rstd, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (N * D >= MOE_PARALLEL_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * D;
        double sum = 0.0;
        for (int64_t i = 0; i < D; i++) sum += xr[i];
        const float mu = (float) (sum / (double) D);
        double var = 0.0;
        for (int64_t i = 0; i < D; i++) {
            const double c = (double) xr[i] - mu;
            var += c * c;
        }
        const float rs = (float) (1.0 / sqrt(var / (double) D + (double) eps));
        mean[n] = mu;
        rstd[n] = rs;
        float *yr = y + n * D;
#pragma omp simd
        for (int64_t i = 0; i < D; i++) yr[i] = (xr[i] - mu) * rs * w[i];
    }
}

/* From dy [N, D]: dx [N, D] (overwritten) and dw [D] += sum_n dy * xhat. With xhat the
 * normalized row and dxh = dy * w: dx = rstd (dxh - mean(dxh) - xhat mean(dxh xhat)). */
static void layernorm_backward(const float *x, const float *w, const float *mean, const float *rstd,
                               const float *dy, int64_t N, int64_t D, float *dx, float *dw,
                               int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (N * D >= MOE_PARALLEL_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * D, *dyr = dy + n * D;
        const float mu = mean[n], rs = rstd[n];
        double s1 = 0.0, s2 = 0.0;
        for (int64_t i = 0; i < D; i++) {
            const float dxh = dyr[i] * w[i], xh = (xr[i] - mu) * rs;
            s1 += dxh;
            s2 += (double) dxh * xh;
        }
        const float a = (float) (s1 / (double) D), b = (float) (s2 / (double) D);
        float *dxr = dx + n * D;
#pragma omp simd
        for (int64_t i = 0; i < D; i++) {
            const float xh = (xr[i] - mu) * rs;
            dxr[i] = rs * (dyr[i] * w[i] - a - xh * b);
        }
    }
    /* Rows in order: the same sums for every thread count. */
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * D, *dyr = dy + n * D;
        const float mu = mean[n], rs = rstd[n];
#pragma omp simd
        for (int64_t i = 0; i < D; i++) dw[i] += dyr[i] * ((xr[i] - mu) * rs);
    }
}

#define DENSE_SQRT1_2     0.70710678118654752f
#define DENSE_INV_SQRT2PI 0.39894228040143268f

/* g = gelu(u) = u Phi(u) over n elements, and gd = gelu'(u) = Phi(u) + u phi(u) for the
 * backward (when gd is not NULL): the erff is the costly part, so it is computed once. */
static void gelu_forward(const float *u, float *g, float *gd, int64_t n, int nthreads) {
    const lowp_cpu_vmath *vm = lowp_cpu_vmath_pick();
    if (vm) {
        /* spans of whole vectors per thread, so that no vector straddles two threads */
        const int64_t span = 4096, spans = (n + span - 1) / span;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (n >= MOE_PARALLEL_MIN)
        for (int64_t s = 0; s < spans; s++) {
            const int64_t i = s * span, len = n - i < span ? n - i : span;
            vm->gelu(u + i, g + i, gd ? gd + i : NULL, len);
        }
        return;
    }
#pragma omp parallel for num_threads(nthreads) schedule(static) if (n >= MOE_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float x = u[i], cdf = 0.5f * (1.0f + erff(x * DENSE_SQRT1_2));
        g[i] = x * cdf;
        if (gd) gd[i] = cdf + x * (DENSE_INV_SQRT2PI * expf(-0.5f * x * x));
    }
}

/* du = dg * gelu'(u), in place over dg. */
static void gelu_backward(const float *gd, float *dg, int64_t n, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (n >= MOE_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) dg[i] *= gd[i];
}

/* dst [N, D] = columns [c0, c0 + D) of src [N, W], or the reverse (to_wide). */
static void copy_cols(float *wide, int64_t W, int64_t c0, float *narrow, int64_t N, int64_t D,
                      int to_wide) {
    for (int64_t n = 0; n < N; n++) {
        float *a = wide + n * W + c0, *b = narrow + n * D;
        if (to_wide)
            memcpy(a, b, (size_t) D * sizeof(float));
        else
            memcpy(b, a, (size_t) D * sizeof(float));
    }
}

/* ---------------------------------------------------------------- one layer */

static lowp_param *layer_params(lowp_param *params, int64_t l) {
    return params + 2 + l * DENSE_LAYER_PARAMS;
}

static lowp_status layer_forward(dense_model *s, lowp_param *params, int64_t l, int keep) {
    const moe_dims *d = &s->d;
    const moe_exec *ex = &s->ex;
    const int64_t N = d->N, D = d->D, H = d->Hs, ND = N * D;
    lowp_param *lp = layer_params(params, l);
    dense_acts *a = &s->acts[l];
    const float *x = s->xs + l * ND;
    float *x_out = s->xs + (l + 1) * ND;
    lowp_status st;

    /* h1 = ln_1(x);  qkv [N, 3 D] = h1 Wqkv^T, split into q, k, v [N, D] */
    layernorm_forward(x, lp[DENSE_ATTN_NORM].data, d->eps, N, D, a->h1, a->mean1, a->rstd1,
                      ex->nthreads);
    st = moe_linear_fwd(&lp[DENSE_WQKV], a->h1, N, a->qkv, ex, keep ? &a->saved[0] : NULL);
    if (st != LOWP_OK) return st;
    lowp_prof_push(LOWP_PHASE_ATTENTION);
    copy_cols(a->qkv, 3 * D, 0, a->q, N, D, 0);
    copy_cols(a->qkv, 3 * D, D, a->k, N, D, 0);
    copy_cols(a->qkv, 3 * D, 2 * D, a->v, N, D, 0);
    st = moe_attention_core_forward(d, a->q, a->k, a->v, a->att, a->o, ex->nthreads);
    lowp_prof_pop();
    if (st != LOWP_OK) return st;

    /* x_mid = x + o Wo^T (the branch output lands in x_mid, then x is added) */
    st = moe_linear_fwd(&lp[DENSE_WO], a->o, N, a->x_mid, ex, keep ? &a->saved[1] : NULL);
    if (st != LOWP_OK) return st;
    moe_add(a->x_mid, x, ND, ex->nthreads);

    /* h2 = ln_2(x_mid);  u [N, H] = h2 Wfc^T;  g = gelu(u);  x_out = x_mid + g Wproj^T */
    layernorm_forward(a->x_mid, lp[DENSE_FFN_NORM].data, d->eps, N, D, a->h2, a->mean2, a->rstd2,
                      ex->nthreads);
    st = moe_linear_fwd(&lp[DENSE_FC], a->h2, N, a->u, ex, keep ? &a->saved[2] : NULL);
    if (st != LOWP_OK) return st;
    gelu_forward(a->u, a->g, keep ? a->gd : NULL, N * H, ex->nthreads);
    st = moe_linear_fwd(&lp[DENSE_PROJ], a->g, N, x_out, ex, keep ? &a->saved[3] : NULL);
    if (st != LOWP_OK) return st;
    moe_add(x_out, a->x_mid, ND, ex->nthreads);
    return LOWP_OK;
}

/* s->dres: dLoss/dx_{l+1} on entry, dLoss/dx_l on return. */
static lowp_status layer_backward(dense_model *s, lowp_param *params, int64_t l) {
    const moe_dims *d = &s->d;
    const moe_exec *ex = &s->ex;
    const int64_t N = d->N, D = d->D, H = d->Hs, ND = N * D;
    lowp_param *lp = layer_params(params, l);
    dense_acts *a = &s->acts[l];
    const float *x = s->xs + l * ND;
    lowp_status st;

    /* x_out = x_mid + gelu(h2 Wfc^T) Wproj^T */
    st = moe_linear_bwd(&lp[DENSE_PROJ], a->g, N, s->dres, s->dg, ex, &a->saved[3]);
    if (st != LOWP_OK) return st;
    gelu_backward(a->gd, s->dg, N * H, ex->nthreads);
    st = moe_linear_bwd(&lp[DENSE_FC], a->h2, N, s->dg, s->dh, ex, &a->saved[2]);
    if (st != LOWP_OK) return st;
    layernorm_backward(a->x_mid, lp[DENSE_FFN_NORM].data, a->mean2, a->rstd2, s->dh, N, D, s->dtmp,
                       lp[DENSE_FFN_NORM].grad, ex->nthreads);
    moe_add(s->dres, s->dtmp, ND, ex->nthreads); /* dLoss/dx_mid */

    /* x_mid = x + attn(ln_1(x)) Wo^T */
    st = moe_linear_bwd(&lp[DENSE_WO], a->o, N, s->dres, s->do_, ex, &a->saved[1]);
    if (st != LOWP_OK) return st;
    lowp_prof_push(LOWP_PHASE_ATTENTION);
    st = moe_attention_core_backward(d, a->q, a->k, a->v, a->att, s->do_, s->dq, s->dk, s->dv,
                                     ex->nthreads);
    if (st == LOWP_OK) {
        copy_cols(s->dqkv, 3 * D, 0, s->dq, N, D, 1);
        copy_cols(s->dqkv, 3 * D, D, s->dk, N, D, 1);
        copy_cols(s->dqkv, 3 * D, 2 * D, s->dv, N, D, 1);
    }
    lowp_prof_pop();
    if (st != LOWP_OK) return st;
    st = moe_linear_bwd(&lp[DENSE_WQKV], a->h1, N, s->dqkv, s->dh, ex, &a->saved[0]);
    if (st != LOWP_OK) return st;
    layernorm_backward(x, lp[DENSE_ATTN_NORM].data, a->mean1, a->rstd1, s->dh, N, D, s->dtmp,
                       lp[DENSE_ATTN_NORM].grad, ex->nthreads);
    moe_add(s->dres, s->dtmp, ND, ex->nthreads); /* dLoss/dx_l */
    return LOWP_OK;
}

/* ---------------------------------------------------------------- the model */

static lowp_status with_context(lowp_status st, const char *fn, int64_t layer) {
    if (st != LOWP_OK) {
        if (layer >= 0)
            lowp_error_append("in %s, layer %lld (dense)", fn, (long long) layer);
        else
            lowp_error_append("in %s (dense)", fn);
    }
    return st;
}

/* Arguments checked by lowp_model_forward (model.c). */
static lowp_status dense_forward(void *ctx, const char *fn, const int32_t *tokens,
                                 const int32_t *targets, int32_t B, int32_t T,
                                 const lowp_model_run *run, float *loss) {
    dense_model *s = ctx;
    lowp_param *params = s->p.params;
    const lowp_moe_config *c = &s->cfg;
    if (run->activation_checkpoint && run->training)
        return lowp_fail(LOWP_ERR_UNSUPPORTED,
                         "%s: run.activation_checkpoint is not supported by the dense model "
                         "(cfg.experts = 0)",
                         fn);
    release_saved(s);
    s->ce = NAN;
    const int training = run->training != 0;
    moe_exec ex;
    memset(&ex, 0, sizeof ex);
    ex.lin.threads = run->threads;
    ex.lin.fp32_plain = run->fp32_plain;
    ex.lin.cache_plain = 1;
    ex.lin.rng = training ? run->rng : NULL; /* the FP4 recipes' SR and Hadamard signs */
    ex.nthreads = lowp_thread_count(run->threads);
    s->ex = ex;

    moe_dims *d = &s->d;
    memset(d, 0, sizeof *d);
    d->B = B;
    d->T = T;
    d->N = (int64_t) B * T;
    d->D = c->dim;
    d->nh = c->heads;
    d->hd = c->dim / c->heads;
    d->Hs = c->shared_hidden;
    d->V = c->vocab;
    d->L = c->layers;
    d->eps = c->norm_eps;
    lowp_status st = prepare(fn, s, training);
    if (st != LOWP_OK) return st;
    const int64_t N = d->N, D = d->D;
    memcpy(s->tokens, tokens, (size_t) N * sizeof(int32_t));
    if (targets) memcpy(s->targets, targets, (size_t) N * sizeof(int32_t));

    /* x_0 [N, D] = wte[tokens] + wpe[position] */
    const float *wte = params[0].data, *wpe = params[1].data;
    for (int64_t n = 0; n < N; n++) {
        const float *e = wte + (int64_t) tokens[n] * D, *p = wpe + (n % T) * D;
        float *x = s->xs + n * D;
        for (int64_t i = 0; i < D; i++) x[i] = e[i] + p[i];
    }
    for (int64_t l = 0; l < d->L; l++)
        if ((st = layer_forward(s, params, l, training)) != LOWP_OK) return with_context(st, fn, l);

    /* hf = ln_f(x_L);  logits [N, V] = hf wte^T (the tied head) */
    lowp_param *fnorm = &params[2 + d->L * DENSE_LAYER_PARAMS];
    layernorm_forward(s->xs + d->L * N * D, fnorm->data, d->eps, N, D, s->hf, s->meanf, s->rstdf,
                      ex.nthreads);
    st = moe_linear_fwd(&params[0], s->hf, N, s->logits, &s->ex, training ? &s->head_saved : NULL);
    if (st != LOWP_OK) return with_context(st, fn, -1);
    if (!targets) return LOWP_OK;
    s->ce = moe_cross_entropy(d, s->logits, targets, s->lse, s->row_loss, ex.nthreads);
    if (loss) *loss = (float) s->ce;
    s->can_backward = training;
    return LOWP_OK;
}

static lowp_status dense_backward(void *ctx, const char *fn) {
    dense_model *s = ctx;
    lowp_param *params = s->p.params;
    if (!s->can_backward)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: no training forward with targets to differentiate (run.training "
                         "was 0, targets were NULL, the forward failed, or its backward ran)",
                         fn);
    s->can_backward = 0;
    const moe_dims *d = &s->d;
    const int64_t N = d->N, D = d->D, T = d->T;
    lowp_status st;
    moe_cross_entropy_backward(d, s->logits, s->targets, s->lse, s->dlogits, s->ex.nthreads);

    /* logits = hf wte^T:  dh = dlogits wte, wte.grad += dlogits^T hf;  hf = ln_f(x_L) */
    st = moe_linear_bwd(&params[0], s->hf, N, s->dlogits, s->dh, &s->ex, &s->head_saved);
    if (st != LOWP_OK) return with_context(st, fn, -1);
    lowp_param *fnorm = &params[2 + d->L * DENSE_LAYER_PARAMS];
    layernorm_backward(s->xs + d->L * N * D, fnorm->data, s->meanf, s->rstdf, s->dh, N, D, s->dres,
                       fnorm->grad, s->ex.nthreads);
    for (int64_t l = d->L - 1; l >= 0; l--)
        if ((st = layer_backward(s, params, l)) != LOWP_OK) return with_context(st, fn, l);

    /* x_0 = wte[tokens] + wpe[t]: rows in token order (a repeated token adds up the same way
     * on every run) */
    float *dwte = params[0].grad, *dwpe = params[1].grad;
    for (int64_t n = 0; n < N; n++) {
        const float *g = s->dres + n * D;
        float *e = dwte + (int64_t) s->tokens[n] * D, *p = dwpe + (n % T) * D;
        for (int64_t i = 0; i < D; i++) {
            e[i] += g[i];
            p[i] += g[i];
        }
    }
    return LOWP_OK;
}

static void dense_params(void *ctx, lowp_param **params, int32_t *n) {
    dense_model *s = ctx;
    *params = s->p.params;
    *n = s->p.n;
}

static const float *dense_logits(const void *ctx) {
    return ((const dense_model *) ctx)->logits;
}

static void dense_loss_terms(const void *ctx, double *ce, double *aux) {
    *ce = ((const dense_model *) ctx)->ce;
    *aux = 0.0;
}

/* Every parameter is active. */
static int64_t dense_idle_params(const lowp_moe_config *c) {
    (void) c;
    return 0;
}

/* The head is the embedding table used as a GEMM weight: only the positions are a lookup. */
static double dense_lookup_params(const lowp_moe_config *c) {
    return (double) c->seq_len * c->dim;
}

const model_ops dense_model_ops = {
    .create = dense_create,
    .free = dense_free,
    .params = dense_params,
    .forward = dense_forward,
    .backward = dense_backward,
    .logits = dense_logits,
    .loss_terms = dense_loss_terms,
    .idle_params = dense_idle_params,
    .lookup_params = dense_lookup_params,
};
