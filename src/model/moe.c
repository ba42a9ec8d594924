/* The MoE transformer of model.h, top to bottom: configuration presets, the parameter arena
 * and its initialization, the activation arena, and the pass over the model
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
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model_internal.h"

#define MOE_NAME_MAX 48

struct lowp_moe {
    lowp_moe_config cfg;
    int32_t nparams;
    lowp_param *params;          /* [nparams]: embed, L x MOE_LAYER_PARAMS, final_norm, head */
    char (*names)[MOE_NAME_MAX]; /* [nparams] */
    float *param_arena;          /* every data, then every grad, then the RoPE tables */
    float *rope_cos, *rope_sin;  /* [seq_len, hd / 2] */

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

    dense_state *dense; /* cfg.experts == 0: the dense GPT's activations (dense.c) */
};

/* ---------------------------------------------------------------- presets and checks */

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

/* Bytes of physical memory, or 0 when unknown. */
static double physical_memory(void) {
    const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (double) pages * (double) size : 0.0;
}

/* The limits both models share: the layer count of the parameter table and the memory of the
 * machine, given the parameter count. */
static lowp_status size_check(const lowp_moe_config *c, const char *fn, double total) {
    /* The parameter table counts 3 + layers * MOE_LAYER_PARAMS entries in an int32. */
    if (c->layers > LOWP_MOE_MAX_LAYERS)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.layers (%d) > %d", fn, c->layers,
                         LOWP_MOE_MAX_LAYERS);
    /* Before any allocation: the weights and gradients (and the optimizer's two moments the
     * trainer adds) must fit the machine, so a typo does not end in a swap storm. */
    const double need = 16.0 * total + 8.0 * (double) c->seq_len * (double) c->dim;
    const double have = physical_memory();
    if (have > 0 && need > have)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: the configuration needs about %.3g GB for %.3g parameters (weights, "
                         "gradients, Adam moments and RoPE tables), more than the %.3g GB of "
                         "physical memory",
                         fn, need / 1e9, total, have / 1e9);
    return LOWP_OK;
}

/* The dense GPT (experts == 0): no routing fields, a plain MLP of width shared_hidden. */
static lowp_status dense_config_check(const lowp_moe_config *c, const char *fn) {
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
    return size_check(c, fn, total);
}

static lowp_status config_check(const lowp_moe_config *c, const char *fn) {
    if (c->experts == 0) return dense_config_check(c, fn);
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
    return size_check(c, fn, total);
}

/* ---------------------------------------------------------------- parameters */

/* Every parameter's place in the arena starts on a 64-byte line. */
static int64_t padded(int64_t n) {
    return (n + 15) / 16 * 16;
}

/* N(0, std) from Philox words through Box-Muller in binary64, so the weights are the same on
 * every machine and for any thread count: words base + 2p and base + 2p + 1 give the radius
 * and the angle of elements 2p (cosine) and 2p + 1 (sine). */
static void init_normal(float *w, int64_t n, float std, uint64_t seed, uint64_t base,
                        int nthreads) {
    enum { CHUNK = 4096 }; /* elements per task, even */
    const int64_t chunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (n >= MOE_PARALLEL_MIN)
    for (int64_t ci = 0; ci < chunks; ci++) {
        uint32_t words[CHUNK];
        const int64_t i0 = ci * CHUNK, m = n - i0 < CHUNK ? n - i0 : CHUNK;
        /* cannot fail: the buffer is ours and not empty */
        (void) lowp_philox_fill(seed, base + (uint64_t) i0, words, (size_t) (m + 1) / 2 * 2);
        for (int64_t i = 0; i < m; i += 2) {
            const double u1 = ((double) words[i] + 0.5) / 4294967296.0; /* (0, 1) */
            const double angle = 6.283185307179586 * ((double) words[i + 1] / 4294967296.0);
            const double r = std * sqrt(-2.0 * log(u1));
            w[i0 + i] = (float) (r * cos(angle));
            if (i + 1 < m) w[i0 + i + 1] = (float) (r * sin(angle));
        }
    }
}

/* Appends parameter *np: its name (printf-style), shape and initial standard deviation
 * (< 0: ones). */
static void add_param(lowp_moe *m, float *init_std, int32_t *np, int64_t groups, int64_t rows,
                      int64_t cols, float std, const char *fmt, ...) LOWP_PRINTF(8, 9);
static void add_param(lowp_moe *m, float *init_std, int32_t *np, int64_t groups, int64_t rows,
                      int64_t cols, float std, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->names[*np], MOE_NAME_MAX, fmt, ap);
    va_end(ap);
    m->params[*np].groups = (int32_t) groups;
    m->params[*np].rows = rows;
    m->params[*np].cols = cols;
    init_std[(*np)++] = std;
}

static lowp_param *layer_params(lowp_moe *m, int64_t l) {
    return m->params + 1 + l * MOE_LAYER_PARAMS;
}

/* The parameter tables and the per-layer state, sized for the configuration. */
static lowp_status alloc_tables(lowp_moe *m) {
    const int32_t L = m->cfg.layers;
    const int dense = m->cfg.experts == 0;
    m->nparams = dense ? 3 + L * DENSE_LAYER_PARAMS : 3 + L * MOE_LAYER_PARAMS;
    m->params = calloc((size_t) m->nparams, sizeof *m->params);
    m->names = calloc((size_t) m->nparams, sizeof *m->names);
    m->x_mid = calloc((size_t) L, sizeof *m->x_mid);
    m->attn = calloc((size_t) L, sizeof *m->attn);
    m->ffn = calloc((size_t) L, sizeof *m->ffn);
    m->rng_states = calloc((size_t) L + 1, sizeof *m->rng_states);
    if (!m->params || !m->names || !m->x_mid || !m->attn || !m->ffn || !m->rng_states)
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "lowp_moe_create: parameter tables");
    return LOWP_OK;
}

/* Names, shapes and initial scales, in the order lowp_moe_params reports. Linears and the
 * embedding draw N(0, 0.02); the projections that write into the residual stream (wo, w2)
 * are scaled down by sqrt(2 L) so the stream's variance does not grow with depth; norm
 * weights start at 1 (init_std < 0). */
static void describe_params(lowp_moe *m, float *init_std) {
    const lowp_moe_config *cfg = &m->cfg;
    const int32_t L = cfg->layers;
    const int dense = cfg->experts == 0;
    const int64_t D = cfg->dim, V = cfg->vocab, E = cfg->experts;
    const int64_t H = cfg->expert_hidden, Hs = cfg->shared_hidden;
    const float std = 0.02f, std_out = 0.02f / sqrtf(2.0f * (float) L);
    int32_t np = 0;
    add_param(m, init_std, &np, 0, V, D, std, "embed");
    if (dense) {
        /* nanoGPT's block; the head is the embedding (tied), so there is no "head" */
        add_param(m, init_std, &np, 0, cfg->seq_len, D, std, "pos_embed");
        for (int32_t l = 0; l < L; l++) {
            add_param(m, init_std, &np, 0, 1, D, -1.0f, "layers.%d.attn_norm", l);
            add_param(m, init_std, &np, 0, 3 * D, D, std, "layers.%d.attn.wqkv", l);
            add_param(m, init_std, &np, 0, D, D, std_out, "layers.%d.attn.wo", l);
            add_param(m, init_std, &np, 0, 1, D, -1.0f, "layers.%d.ffn_norm", l);
            add_param(m, init_std, &np, 0, Hs, D, std, "layers.%d.mlp.fc", l);
            add_param(m, init_std, &np, 0, D, Hs, std_out, "layers.%d.mlp.proj", l);
        }
        add_param(m, init_std, &np, 0, 1, D, -1.0f, "final_norm");
    }
    for (int32_t l = 0; !dense && l < L; l++) {
        add_param(m, init_std, &np, 0, 1, D, -1.0f, "layers.%d.attn_norm", l);
        add_param(m, init_std, &np, 0, D, D, std, "layers.%d.attn.wq", l);
        add_param(m, init_std, &np, 0, D, D, std, "layers.%d.attn.wk", l);
        add_param(m, init_std, &np, 0, D, D, std, "layers.%d.attn.wv", l);
        add_param(m, init_std, &np, 0, D, D, std_out, "layers.%d.attn.wo", l);
        add_param(m, init_std, &np, 0, 1, D, -1.0f, "layers.%d.ffn_norm", l);
        add_param(m, init_std, &np, 0, E, D, std, "layers.%d.moe.router", l);
        add_param(m, init_std, &np, 0, Hs, D, std, "layers.%d.moe.shared.w1", l);
        add_param(m, init_std, &np, 0, Hs, D, std, "layers.%d.moe.shared.w3", l);
        add_param(m, init_std, &np, 0, D, Hs, std_out, "layers.%d.moe.shared.w2", l);
        add_param(m, init_std, &np, E, H, D, std, "layers.%d.moe.experts.w1", l);
        add_param(m, init_std, &np, E, H, D, std, "layers.%d.moe.experts.w3", l);
        add_param(m, init_std, &np, E, D, H, std_out, "layers.%d.moe.experts.w2", l);
    }
    if (!dense) {
        add_param(m, init_std, &np, 0, 1, D, -1.0f, "final_norm");
        add_param(m, init_std, &np, 0, V, D, std, "head");
    }
    m->nparams = np;
}

/* One arena: all data, then all grads (same offsets), then the RoPE tables; the data drawn
 * from the seed's Philox streams (each parameter's stream follows the last). */
static lowp_status alloc_arena(lowp_moe *m, const float *init_std, uint64_t seed) {
    const int32_t np = m->nparams;
    int64_t data_floats = 0;
    for (int32_t i = 0; i < np; i++) data_floats += padded(lowp_param_numel(&m->params[i]));
    const int64_t half = m->cfg.dim / m->cfg.heads / 2;
    const int64_t rope_floats = padded((int64_t) m->cfg.seq_len * half);
    const size_t bytes = (size_t) (2 * data_floats + 2 * rope_floats) * sizeof(float);
    m->param_arena = lowp_host_alloc(bytes);
    if (m->param_arena == NULL)
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "lowp_moe_create: %zu bytes of parameters", bytes);
    memset(m->param_arena, 0, bytes);
    int64_t off = 0;
    uint64_t word = 0; /* Philox words used so far */
    const int nthreads = lowp_thread_count(0);
    for (int32_t i = 0; i < np; i++) {
        lowp_param *p = &m->params[i];
        p->name = m->names[i];
        p->data = m->param_arena + off;
        p->grad = m->param_arena + data_floats + off;
        p->device = LOWP_DEVICE_HOST;
        const int64_t n = lowp_param_numel(p);
        if (init_std[i] < 0.0f)
            for (int64_t j = 0; j < n; j++) p->data[j] = 1.0f;
        else
            init_normal(p->data, n, init_std[i], seed, word, nthreads);
        word += (uint64_t) padded(n);
        off += padded(n);
    }
    m->rope_cos = m->param_arena + 2 * data_floats;
    m->rope_sin = m->rope_cos + rope_floats;
    return LOWP_OK;
}

/* RoPE: position t, pair i turns by t * theta^(-2i / hd), computed in binary64. */
static void fill_rope(lowp_moe *m) {
    const int64_t half = m->cfg.dim / m->cfg.heads / 2;
    for (int64_t t = 0; t < m->cfg.seq_len; t++)
        for (int64_t i = 0; i < half; i++) {
            const double angle =
                (double) t * pow((double) m->cfg.rope_theta, -(double) i / (double) half);
            m->rope_cos[t * half + i] = (float) cos(angle);
            m->rope_sin[t * half + i] = (float) sin(angle);
        }
}

/* The steps of lowp_moe_create after the checks, on a zeroed model holding its cfg (the
 * caller frees it on failure). */
static lowp_status build(lowp_moe *m, uint64_t seed) {
    lowp_status st = alloc_tables(m);
    if (st != LOWP_OK) return st;
    float *init_std = calloc((size_t) m->nparams, sizeof *init_std);
    if (init_std == NULL)
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "lowp_moe_create: parameter tables");
    describe_params(m, init_std);
    st = alloc_arena(m, init_std, seed);
    free(init_std);
    if (st != LOWP_OK) return st;
    fill_rope(m);
    if (m->cfg.experts == 0) return dense_state_create(&m->cfg, &m->dense);
    return LOWP_OK;
}

lowp_status lowp_moe_create(const lowp_moe_config *cfg, uint64_t seed, lowp_moe **out) {
    LOWP_CHECK_PTR("lowp_moe_create", cfg);
    LOWP_CHECK_PTR("lowp_moe_create", out);
    *out = NULL;
    lowp_status st = config_check(cfg, "lowp_moe_create");
    if (st != LOWP_OK) return st;

    lowp_moe *m = calloc(1, sizeof *m);
    if (m == NULL) return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "lowp_moe_create: model struct");
    m->cfg = *cfg;
    if ((st = build(m, seed)) != LOWP_OK) {
        lowp_moe_free(m);
        return st;
    }
    *out = m;
    return LOWP_OK;
}

/* Frees what the linear layers saved for a backward that will not come. */
static void release_saved(lowp_moe *m) {
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

void lowp_moe_free(lowp_moe *m) {
    if (m == NULL) return;
    if (m->attn && m->ffn) release_saved(m);
    for (int32_t i = 0; m->params && i < m->nparams; i++) lowp_param_cache_free(&m->params[i]);
    dense_state_free(m->dense);
    free(m->param_arena);
    free(m->act_arena);
    free(m->params);
    free(m->names);
    free(m->x_mid);
    free(m->attn);
    free(m->ffn);
    free(m->rng_states);
    free(m);
    /* The blocks its updates released (GEMM workspaces, quantized copies) go back too; another
     * model's next update refills the cache. */
    lowp_host_empty_cache();
}

lowp_status lowp_moe_get_config(const lowp_moe *m, lowp_moe_config *out) {
    LOWP_CHECK_PTR("lowp_moe_get_config", m);
    LOWP_CHECK_PTR("lowp_moe_get_config", out);
    *out = m->cfg;
    return LOWP_OK;
}

lowp_status lowp_moe_params(lowp_moe *m, lowp_param **params, int32_t *n) {
    LOWP_CHECK_PTR("lowp_moe_params", m);
    LOWP_CHECK_PTR("lowp_moe_params", params);
    LOWP_CHECK_PTR("lowp_moe_params", n);
    *params = m->params;
    *n = m->nparams;
    return LOWP_OK;
}

lowp_status lowp_moe_active_params(const lowp_moe *m, int64_t *active, int64_t *total) {
    LOWP_CHECK_PTR("lowp_moe_active_params", m);
    LOWP_CHECK_PTR("lowp_moe_active_params", active);
    LOWP_CHECK_PTR("lowp_moe_active_params", total);
    int64_t all = 0;
    for (int32_t i = 0; i < m->nparams; i++) all += lowp_param_numel(&m->params[i]);
    const lowp_moe_config *c = &m->cfg;
    const int64_t idle_experts = (int64_t) c->experts - c->top_k; /* 0 for the dense model */
    *total = all;
    *active = all - (int64_t) c->layers * idle_experts * 3 * c->expert_hidden * c->dim;
    return LOWP_OK;
}

lowp_status lowp_moe_flops_per_token(const lowp_moe *m, int32_t T, double *flops) {
    LOWP_CHECK_PTR("lowp_moe_flops_per_token", m);
    LOWP_CHECK_PTR("lowp_moe_flops_per_token", flops);
    if (T <= 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_moe_flops_per_token: T (%d) must be > 0", T);
    int64_t active, total;
    lowp_status st = lowp_moe_active_params(m, &active, &total);
    if (st != LOWP_OK) return st;
    /* The embedding is a lookup, not a GEMM: its table costs no multiply-adds (the dense model's
     * head is the same table, used as a GEMM weight: there only the positions are a lookup). */
    const double lookup =
        m->dense ? (double) m->cfg.seq_len * m->cfg.dim : (double) m->cfg.vocab * m->cfg.dim;
    const double gemm_params = (double) active - lookup;
    *flops = 6.0 * gemm_params + 12.0 * m->cfg.layers * m->cfg.dim * (double) T;
    return LOWP_OK;
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
static void act_layout(lowp_moe *m, const moe_dims *d, int shared, int grads, int dropout,
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
static lowp_status act_prepare(lowp_moe *m, const moe_dims *d, int shared, int grads, int dropout) {
    moe_carver measure = {NULL, 0};
    act_layout(m, d, shared, grads, dropout, &measure);
    const size_t need = (measure.off + 63) / 64 * 64;
    if (need > m->act_cap) {
        free(m->act_arena);
        m->act_cap = 0;
        m->act_arena = lowp_host_alloc(need);
        if (m->act_arena == NULL)
            return lowp_fail(LOWP_ERR_OUT_OF_MEMORY,
                             "lowp_moe_forward: %zu bytes of activations (B*T = %lld)", need,
                             (long long) d->N);
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
static lowp_status layer_forward(lowp_moe *m, int64_t l, const moe_exec *ex, int keep) {
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
static lowp_status layer_backward(lowp_moe *m, int64_t l, const moe_exec *ex) {
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

static lowp_status check_ids(const int32_t *ids, int64_t n, int32_t V, const char *what) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return lowp_fail(LOWP_ERR_INVALID_ARG,
                             "lowp_moe_forward: %s[%lld] (%d) is outside [0, vocab = %d)", what,
                             (long long) i, ids[i], V);
    return LOWP_OK;
}

static lowp_status save_rng(lowp_moe *m, int64_t row) {
    return lowp_rng_tracker_get_states(m->ex.rng, m->rng_states[row], LOWP_RNG_MAX_STATES,
                                       &m->rng_nstates);
}

static lowp_status with_context(lowp_status st, const char *fn, int64_t layer) {
    if (st == LOWP_OK) return st;
    if (layer >= 0)
        lowp_error_append("in %s, layer %lld", fn, (long long) layer);
    else
        lowp_error_append("in %s", fn);
    return st;
}

lowp_status lowp_moe_forward(lowp_moe *m, const int32_t *tokens, const int32_t *targets, int32_t B,
                             int32_t T, const lowp_moe_run *run, float *loss) {
    static const char fn[] = "lowp_moe_forward";
    LOWP_CHECK_PTR(fn, m);
    LOWP_CHECK_PTR(fn, tokens);
    const lowp_moe_config *c = &m->cfg;
    if (B <= 0) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: B (%d) must be > 0", fn, B);
    if (T <= 0 || T > c->seq_len)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: T (%d) must be in [1, cfg.seq_len = %d]", fn, T,
                         c->seq_len);
    const int64_t N = (int64_t) B * T;
    if (N * c->top_k > INT32_MAX / 2)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: B * T * top_k (%lld) overflows the experts' int32 row offsets", fn,
                         (long long) (N * c->top_k));
    lowp_status st = check_ids(tokens, N, c->vocab, "tokens");
    if (st != LOWP_OK) return st;
    if (targets && (st = check_ids(targets, N, c->vocab, "targets")) != LOWP_OK) return st;
    const lowp_moe_run none = {0};
    if (run == NULL) run = &none;
    if (run->threads < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: run.threads (%d) must be >= 0", fn,
                         run->threads);
    if (m->dense) return dense_forward(m->dense, m->params, tokens, targets, B, T, run, loss);

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
    st = act_prepare(m, d, checkpoint || !training, training, ex.rng != NULL);
    if (st != LOWP_OK) return st;
    memcpy(m->tokens, tokens, (size_t) N * sizeof(int32_t));
    if (targets) memcpy(m->targets, targets, (size_t) N * sizeof(int32_t));

    /* x_0 [N, D] = embed[tokens] */
    embedding(d, m->params[0].data, tokens, m->xs);

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
    st = lowp_rmsnorm_forward_nt(&xt, m->params[m->nparams - 2].data, d->eps, &ht, m->rstdf,
                                 ex.autocast, ex.nthreads);
    if (st != LOWP_OK) return with_context(st, fn, -1);
    st = moe_linear_fwd(&m->params[m->nparams - 1], m->hf, N, m->logits, &ex,
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

lowp_status lowp_moe_backward(lowp_moe *m) {
    static const char fn[] = "lowp_moe_backward";
    LOWP_CHECK_PTR(fn, m);
    if (m->dense) return dense_backward(m->dense, m->params);
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
    st = moe_linear_bwd(&m->params[m->nparams - 1], m->hf, N, m->dlogits, g->dh, &ex,
                        &m->head_saved);
    if (st != LOWP_OK) return with_context(st, fn, -1);
    lowp_tensor xt = moe_tensor(m->xs + d->L * N * D, N, D), dht = moe_tensor(g->dh, N, D);
    lowp_tensor drt = moe_tensor(g->dres, N, D);
    lowp_param *fnorm = &m->params[m->nparams - 2];
    st = lowp_rmsnorm_backward_nt(&xt, fnorm->data, m->rstdf, &dht, &drt, fnorm->grad, ex.nthreads);
    if (st != LOWP_OK) return with_context(st, fn, -1);

    /* The layers in reverse. A checkpointed layer first runs its forward again, with the
     * dropout generator rewound to where that layer's first forward found it, and with
     * recompute set so the FP8 amax histories see the layer once per step. */
    for (int64_t l = d->L - 1; l >= 0; l--) {
        if (m->checkpoint) {
            if (ex.rng && (st = lowp_rng_tracker_set_states(ex.rng, m->rng_states[l],
                                                            m->rng_nstates)) != LOWP_OK)
                return with_context(st, fn, l);
            ex.lin.recompute = 1;
            st = layer_forward(m, l, &ex, 1);
            ex.lin.recompute = 0;
            if (st != LOWP_OK) return with_context(st, fn, l);
        }
        if ((st = layer_backward(m, l, &ex)) != LOWP_OK) return with_context(st, fn, l);
    }
    if (m->checkpoint && ex.rng) {
        /* Leave the generator where the forward left it, as without checkpointing. */
        st = lowp_rng_tracker_set_states(ex.rng, m->rng_states[d->L], m->rng_nstates);
        if (st != LOWP_OK) return with_context(st, fn, -1);
    }

    /* x_0 = embed[tokens]:  embed.grad += */
    embedding_backward(d, m->tokens, g->dres, m->params[0].grad);
    return LOWP_OK;
}

lowp_status lowp_moe_logits(const lowp_moe *m, const float **logits) {
    LOWP_CHECK_PTR("lowp_moe_logits", m);
    LOWP_CHECK_PTR("lowp_moe_logits", logits);
    if (m->dense) {
        if ((*logits = dense_logits(m->dense)) == NULL)
            return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_moe_logits: no forward has run");
        return LOWP_OK;
    }
    if (m->logits == NULL)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_moe_logits: no forward has run");
    *logits = m->logits;
    return LOWP_OK;
}

lowp_status lowp_moe_loss_terms(const lowp_moe *m, float *cross_entropy, float *aux) {
    LOWP_CHECK_PTR("lowp_moe_loss_terms", m);
    if (m->dense) {
        if (dense_logits(m->dense) == NULL)
            return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_moe_loss_terms: no forward has run");
        if (cross_entropy) *cross_entropy = (float) dense_cross_entropy(m->dense);
        if (aux) *aux = 0.0f;
        return LOWP_OK;
    }
    if (m->logits == NULL)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_moe_loss_terms: no forward has run");
    if (cross_entropy) *cross_entropy = (float) m->ce;
    if (aux) *aux = (float) m->aux;
    return LOWP_OK;
}

double moe_loss_f64(const lowp_moe *m) {
    if (m->dense) return dense_cross_entropy(m->dense);
    return m->ce + (double) m->cfg.aux_loss_coef * m->aux;
}
