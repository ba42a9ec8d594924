/* The training loop of trainer.h: the learning-rate schedule, AdamW, gradient clipping, the
 * trainer (micro-batches, update, evaluation) and sampling.
 *
 * Reproducibility is the design constraint throughout. Every reduction that decides a number
 * (the gradient norm, the mean loss) runs in a fixed order that does not depend on the thread
 * count; the optimizer is element-wise; batches and dropout come from counters saved in
 * checkpoints; and evaluation restores the FP8 scaling state it touched, so that whether a run
 * evaluated at a step, or was stopped and resumed there, leaves no trace in what follows.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/philox.h"
#include "core/profile_internal.h"
#include "trainer_internal.h"

double lowp_trainer_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

/* ---- Schedule ---- */

lowp_status lowp_lr_at(const lowp_lr_schedule *s, int64_t step, float *lr) {
    const char *fn = "lowp_lr_at";
    LOWP_CHECK_PTR(fn, s);
    LOWP_CHECK_PTR(fn, lr);
    if (step < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: step (%lld) < 0", fn, (long long) step);
    if (s->warmup < 0 || s->steps < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: warmup (%d) and steps (%d) must be >= 0", fn,
                         (int) s->warmup, (int) s->steps);
    if (!(s->lr >= 0) || !(s->min_lr >= 0) || !isfinite(s->lr) || !isfinite(s->min_lr))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: lr (%g) and min_lr (%g) must be finite, >= 0",
                         fn, (double) s->lr, (double) s->min_lr);
    if (step < s->warmup) {
        *lr = (float) ((double) s->lr * (double) (step + 1) / (double) s->warmup);
        return LOWP_OK;
    }
    int64_t span = (int64_t) s->steps - s->warmup;
    double p = span > 0 ? (double) (step - s->warmup) / (double) span : 1.0;
    if (p >= 1.0) {
        *lr = s->min_lr;
        return LOWP_OK;
    }
    const double pi = 3.14159265358979323846;
    *lr = (float) (s->min_lr + 0.5 * (1.0 + cos(pi * p)) * ((double) s->lr - s->min_lr));
    return LOWP_OK;
}

/* ---- AdamW ---- */

struct lowp_adamw {
    lowp_adamw_cfg cfg;
    int32_t n;
    int64_t *count; /* [n] elements of each parameter */
    float **m, **v; /* [n] moments, into one arena */
    float *arena;
    int64_t t;
};

lowp_status lowp_adamw_cfg_init(lowp_adamw_cfg *cfg) {
    LOWP_CHECK_PTR("lowp_adamw_cfg_init", cfg);
    cfg->beta1 = 0.9f;
    cfg->beta2 = 0.95f;
    cfg->eps = 1e-8f;
    cfg->weight_decay = 0.1f;
    cfg->threads = 0;
    return LOWP_OK;
}

static lowp_status check_params(const char *fn, const lowp_param *params, int32_t n) {
    if (n < 0) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: n (%d) < 0", fn, (int) n);
    if (n > 0) LOWP_CHECK_PTR(fn, params);
    for (int32_t i = 0; i < n; i++) {
        const lowp_param *p = &params[i];
        if (!p->data || !p->grad || p->rows < 0 || p->cols < 0 || p->groups < 0)
            return lowp_fail(LOWP_ERR_INVALID_ARG,
                             "%s: params[%d] ('%s') has no data or grad, or a negative shape", fn,
                             (int) i, p->name ? p->name : "?");
    }
    return LOWP_OK;
}

lowp_status lowp_adamw_create(const lowp_param *params, int32_t n, const lowp_adamw_cfg *cfg,
                              lowp_adamw **out) {
    const char *fn = "lowp_adamw_create";
    LOWP_CHECK_PTR(fn, cfg);
    LOWP_CHECK_PTR(fn, out);
    *out = NULL;
    lowp_status st = check_params(fn, params, n);
    if (st != LOWP_OK) return st;
    if (!(cfg->beta1 >= 0 && cfg->beta1 < 1) || !(cfg->beta2 >= 0 && cfg->beta2 < 1))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: beta1 (%g) and beta2 (%g) must be in [0, 1)",
                         fn, (double) cfg->beta1, (double) cfg->beta2);
    if (!(cfg->eps > 0) || !(cfg->weight_decay >= 0) || !isfinite(cfg->eps) ||
        !isfinite(cfg->weight_decay))
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: eps (%g) must be > 0 and weight_decay (%g) >= 0, both finite", fn,
                         (double) cfg->eps, (double) cfg->weight_decay);
    lowp_adamw *o = calloc(1, sizeof *o);
    if (!o) return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    o->cfg = *cfg;
    o->n = n;
    size_t k = (size_t) (n > 0 ? n : 1);
    o->count = calloc(k, sizeof *o->count);
    o->m = calloc(k, sizeof *o->m);
    o->v = calloc(k, sizeof *o->v);
    int64_t total = 0;
    for (int32_t i = 0; i < n; i++) total += lowp_param_numel(&params[i]);
    o->arena = calloc((size_t) (2 * total + 1), sizeof(float));
    if (!o->count || !o->m || !o->v || !o->arena) {
        lowp_adamw_free(o);
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld moments", fn,
                         (long long) (2 * total));
    }
    float *p = o->arena;
    for (int32_t i = 0; i < n; i++) {
        o->count[i] = lowp_param_numel(&params[i]);
        o->m[i] = p;
        o->v[i] = p + o->count[i];
        p += 2 * o->count[i];
    }
    *out = o;
    return LOWP_OK;
}

void lowp_adamw_free(lowp_adamw *o) {
    if (!o) return;
    free(o->count);
    free(o->m);
    free(o->v);
    free(o->arena);
    free(o);
}

lowp_status lowp_adamw_step(lowp_adamw *o, lowp_param *params, int32_t n, float lr) {
    const char *fn = "lowp_adamw_step";
    LOWP_CHECK_PTR(fn, o);
    lowp_status st = check_params(fn, params, n);
    if (st != LOWP_OK) return st;
    if (n != o->n)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: n (%d) != the optimizer's (%d)", fn, (int) n,
                         (int) o->n);
    for (int32_t i = 0; i < n; i++)
        if (lowp_param_numel(&params[i]) != o->count[i])
            return lowp_fail(LOWP_ERR_INVALID_ARG,
                             "%s: params[%d] ('%s') has %lld elements, the optimizer %lld", fn,
                             (int) i, params[i].name ? params[i].name : "?",
                             (long long) lowp_param_numel(&params[i]), (long long) o->count[i]);
    if (!(lr >= 0) || !isfinite(lr))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: lr (%g) must be finite and >= 0", fn,
                         (double) lr);
    o->t++;
    const float b1 = o->cfg.beta1, b2 = o->cfg.beta2, eps = o->cfg.eps;
    /* The bias corrections in double, rounded once: the same on every run and thread. */
    const float c1 = (float) (1.0 / (1.0 - pow((double) b1, (double) o->t)));
    const float c2 = (float) (1.0 / (1.0 - pow((double) b2, (double) o->t)));
    const int nth = o->cfg.threads > 0 ? o->cfg.threads : omp_get_max_threads();
    for (int32_t i = 0; i < n; i++) {
        lowp_param *p = &params[i];
        const float wd = (p->rows > 1 || p->groups > 0) ? o->cfg.weight_decay : 0.0f;
        float *w = p->data, *m = o->m[i], *v = o->v[i];
        const float *g = p->grad;
        const int64_t cnt = o->count[i];
#pragma omp parallel for schedule(static) num_threads(nth) if (cnt > 65536)
        for (int64_t j = 0; j < cnt; j++) {
            float gj = g[j];
            float mj = b1 * m[j] + (1.0f - b1) * gj;
            float vj = b2 * v[j] + (1.0f - b2) * (gj * gj);
            m[j] = mj;
            v[j] = vj;
            float upd = (mj * c1) / (sqrtf(vj * c2) + eps) + wd * w[j];
            w[j] = w[j] - lr * upd;
        }
    }
    return LOWP_OK;
}

lowp_status lowp_adamw_moments(lowp_adamw *o, int32_t i, float **m, float **v, int64_t *count) {
    LOWP_CHECK_PTR("lowp_adamw_moments", o);
    if (i < 0 || i >= o->n)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_adamw_moments: i (%d) not in [0, %d)", (int) i,
                         (int) o->n);
    if (m) *m = o->m[i];
    if (v) *v = o->v[i];
    if (count) *count = o->count[i];
    return LOWP_OK;
}

lowp_status lowp_adamw_get_t(const lowp_adamw *o, int64_t *t) {
    LOWP_CHECK_PTR("lowp_adamw_get_t", o);
    LOWP_CHECK_PTR("lowp_adamw_get_t", t);
    *t = o->t;
    return LOWP_OK;
}

lowp_status lowp_adamw_set_t(lowp_adamw *o, int64_t t) {
    LOWP_CHECK_PTR("lowp_adamw_set_t", o);
    if (t < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_adamw_set_t: t (%lld) < 0", (long long) t);
    o->t = t;
    return LOWP_OK;
}

/* ---- Gradient clipping ---- */

/* Sums of squares over fixed chunks, then the chunks in order: the norm is the same whatever
 * the thread count. */
#define CLIP_CHUNK 16384

lowp_status lowp_grad_clip(lowp_param *params, int32_t n, float max_norm, float *norm) {
    const char *fn = "lowp_grad_clip";
    lowp_status st = check_params(fn, params, n);
    if (st != LOWP_OK) return st;
    double total = 0.0;
    for (int32_t i = 0; i < n; i++) {
        const float *g = params[i].grad;
        const int64_t cnt = lowp_param_numel(&params[i]);
        const int64_t chunks = (cnt + CLIP_CHUNK - 1) / CLIP_CHUNK;
        double *part = malloc((size_t) (chunks > 0 ? chunks : 1) * sizeof *part);
        if (!part) return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
#pragma omp parallel for schedule(static) if (chunks > 4)
        for (int64_t c = 0; c < chunks; c++) {
            int64_t lo = c * CLIP_CHUNK, hi = lo + CLIP_CHUNK < cnt ? lo + CLIP_CHUNK : cnt;
            double s = 0.0;
            for (int64_t j = lo; j < hi; j++) s += (double) g[j] * (double) g[j];
            part[c] = s;
        }
        for (int64_t c = 0; c < chunks; c++) total += part[c];
        free(part);
    }
    const double nrm = sqrt(total);
    if (norm) *norm = (float) nrm;
    if (max_norm > 0 && isfinite(nrm) && nrm > (double) max_norm) {
        const float scale = (float) ((double) max_norm / nrm);
        for (int32_t i = 0; i < n; i++) {
            float *g = params[i].grad;
            const int64_t cnt = lowp_param_numel(&params[i]);
#pragma omp parallel for schedule(static) if (cnt > 65536)
            for (int64_t j = 0; j < cnt; j++) g[j] *= scale;
        }
    }
    return LOWP_OK;
}

/* ---- The trainer ---- */

lowp_status lowp_trainer_cfg_init(lowp_trainer_cfg *cfg) {
    LOWP_CHECK_PTR("lowp_trainer_cfg_init", cfg);
    memset(cfg, 0, sizeof *cfg);
    cfg->steps = 200;
    cfg->batch = 8;
    cfg->seq_len = 0;
    cfg->accum = 1;
    cfg->lr = 3e-3f;
    cfg->min_lr = 3e-4f;
    cfg->warmup = 20;
    lowp_adamw_cfg_init(&cfg->adamw);
    cfg->clip = 1.0f;
    cfg->eval_every = 50;
    cfg->eval_batches = 8;
    cfg->seed = 1234;
    cfg->eval_seed = 0;
    cfg->threads = 0;
    cfg->activation_checkpoint = 0;
    return LOWP_OK;
}

static lowp_status check_cfg(const char *fn, const lowp_trainer_cfg *c, const lowp_moe_config *mc) {
    if (c->steps < 0 || c->batch <= 0 || c->accum <= 0 || c->seq_len < 0 || c->warmup < 0 ||
        c->eval_every < 0 || c->eval_batches <= 0 || c->threads < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: cfg has steps %d, batch %d, accum %d, seq_len %d, warmup %d, "
                         "eval_every %d, eval_batches %d, threads %d (batch, accum and "
                         "eval_batches must be positive, the rest >= 0)",
                         fn, (int) c->steps, (int) c->batch, (int) c->accum, (int) c->seq_len,
                         (int) c->warmup, (int) c->eval_every, (int) c->eval_batches,
                         (int) c->threads);
    if (c->seq_len > mc->seq_len)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.seq_len (%d) > the model's seq_len (%d)",
                         fn, (int) c->seq_len, (int) mc->seq_len);
    if (!(c->clip >= 0) || !isfinite(c->clip))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.clip (%g) must be finite and >= 0", fn,
                         (double) c->clip);
    if (!(c->lr >= 0) || !(c->min_lr >= 0) || !isfinite(c->lr) || !isfinite(c->min_lr))
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: cfg.lr (%g) and cfg.min_lr (%g) must be finite and >= 0", fn,
                         (double) c->lr, (double) c->min_lr);
    return LOWP_OK;
}

void lowp_trainer_free(lowp_trainer *t) {
    if (!t) return;
    if (t->prepared) lowp_train_convert(t->params, t->n);
    lowp_adamw_free(t->opt);
    free(t->tokens);
    free(t->targets);
    free(t);
}

lowp_status lowp_trainer_create(lowp_moe *model, const lowp_data *data, const lowp_recipe *recipe,
                                const lowp_trainer_cfg *cfg, lowp_trainer **out) {
    const char *fn = "lowp_trainer_create";
    LOWP_CHECK_PTR(fn, model);
    LOWP_CHECK_PTR(fn, data);
    LOWP_CHECK_PTR(fn, cfg);
    LOWP_CHECK_PTR(fn, out);
    *out = NULL;
    lowp_moe_config mc;
    lowp_status st = lowp_moe_get_config(model, &mc);
    if (st != LOWP_OK) return st;
    if ((st = check_cfg(fn, cfg, &mc)) != LOWP_OK) return st;
    lowp_data_info di;
    lowp_data_get_info(data, &di);
    if (di.vocab != mc.vocab)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: the model's vocab (%d) != the data's (%d distinct bytes in %s)", fn,
                         (int) mc.vocab, (int) di.vocab, di.name);
    const int32_t T = cfg->seq_len > 0 ? cfg->seq_len : mc.seq_len;
    if (di.train_tokens < (int64_t) T + 1 || di.val_tokens < (int64_t) T + 1)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: %s is too short for sequences of %d tokens: the training split has "
                         "%lld tokens and the validation split %lld, and each needs T + 1",
                         fn, di.name, (int) T, (long long) di.train_tokens,
                         (long long) di.val_tokens);
    lowp_trainer *t = calloc(1, sizeof *t);
    if (!t) return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    t->model = model;
    t->data = data;
    t->mcfg = mc;
    t->cfg = *cfg;
    if (t->cfg.seq_len == 0) t->cfg.seq_len = mc.seq_len;
    if (recipe) {
        t->recipe = *recipe;
    } else {
        memset(&t->recipe, 0, sizeof t->recipe);
        strcpy(t->recipe.name, "none");
    }
    if ((st = lowp_moe_params(model, &t->params, &t->n)) != LOWP_OK) goto fail;
    if (recipe) {
        if ((st = lowp_train_prepare(t->params, t->n, recipe)) != LOWP_OK) {
            lowp_error_append("%s: preparing the parameters with recipe '%s'", fn, recipe->name);
            goto fail;
        }
        t->prepared = 1;
    }
    if ((st = lowp_adamw_create(t->params, t->n, &t->cfg.adamw, &t->opt)) != LOWP_OK) goto fail;
    t->opt->cfg.threads = t->cfg.threads;
    if ((st = lowp_rng_tracker_init(&t->rng, t->cfg.seed)) != LOWP_OK) goto fail;
    size_t bt = (size_t) t->cfg.batch * (size_t) t->cfg.seq_len;
    t->tokens = malloc(bt * sizeof *t->tokens);
    t->targets = malloc(bt * sizeof *t->targets);
    if (!t->tokens || !t->targets) {
        st = lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        goto fail;
    }
    t->t0 = lowp_trainer_now();
    *out = t;
    return LOWP_OK;
fail:
    lowp_trainer_free(t);
    return st;
}

lowp_status lowp_trainer_set_model_seed(lowp_trainer *t, uint64_t seed) {
    LOWP_CHECK_PTR("lowp_trainer_set_model_seed", t);
    t->model_seed = seed;
    return LOWP_OK;
}

lowp_status lowp_trainer_get_step(const lowp_trainer *t, int64_t *step) {
    LOWP_CHECK_PTR("lowp_trainer_get_step", t);
    LOWP_CHECK_PTR("lowp_trainer_get_step", step);
    *step = t->step;
    return LOWP_OK;
}

lowp_status lowp_trainer_params(lowp_trainer *t, lowp_param **params, int32_t *n) {
    LOWP_CHECK_PTR("lowp_trainer_params", t);
    if (params) *params = t->params;
    if (n) *n = t->n;
    return LOWP_OK;
}

lowp_status lowp_trainer_get_cfg(const lowp_trainer *t, lowp_trainer_cfg *out) {
    LOWP_CHECK_PTR("lowp_trainer_get_cfg", t);
    LOWP_CHECK_PTR("lowp_trainer_get_cfg", out);
    *out = t->cfg;
    return LOWP_OK;
}

/* ---- Extra-state snapshots ---- */

void lowp_trainer_xstate_free(trainer_xstate *x) {
    if (!x) return;
    for (int32_t i = 0; i < x->n && x->blob; i++) free(x->blob[i]);
    free(x->blob);
    free(x->len);
    memset(x, 0, sizeof *x);
}

lowp_status lowp_trainer_xstate_save(lowp_trainer *t, trainer_xstate *x) {
    memset(x, 0, sizeof *x);
    x->blob = calloc((size_t) (t->n > 0 ? t->n : 1), sizeof *x->blob);
    x->len = calloc((size_t) (t->n > 0 ? t->n : 1), sizeof *x->len);
    if (!x->blob || !x->len) {
        lowp_trainer_xstate_free(x);
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "lowp_trainer: out of memory");
    }
    x->n = t->n;
    for (int32_t i = 0; i < t->n; i++) {
        lowp_param *p = &t->params[i];
        if (!p->wrap) continue;
        size_t len = 0;
        lowp_status st = lowp_param_extra_state_size(p, &len);
        if (st == LOWP_OK) {
            x->blob[i] = malloc(len ? len : 1);
            if (!x->blob[i]) st = lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "lowp_trainer: out of memory");
        }
        if (st == LOWP_OK) st = lowp_param_extra_state_save(p, x->blob[i], len, &x->len[i]);
        if (st != LOWP_OK) {
            lowp_error_append("saving the extra state of '%s'", p->name);
            lowp_trainer_xstate_free(x);
            return st;
        }
    }
    return LOWP_OK;
}

lowp_status lowp_trainer_xstate_load(lowp_trainer *t, const trainer_xstate *x) {
    for (int32_t i = 0; i < t->n && i < x->n; i++) {
        if (!x->blob[i]) continue;
        lowp_status st = lowp_param_extra_state_load(&t->params[i], x->blob[i], x->len[i]);
        if (st != LOWP_OK) {
            lowp_error_append("restoring the extra state of '%s'", t->params[i].name);
            return st;
        }
    }
    return LOWP_OK;
}

/* ---- Steps ---- */

static lowp_moe_run train_run(lowp_trainer *t, int training) {
    lowp_moe_run r;
    memset(&r, 0, sizeof r);
    r.training = training;
    r.activation_checkpoint = training ? t->cfg.activation_checkpoint : 0;
    r.rng = (training && t->mcfg.dropout > 0) ? &t->rng : NULL;
    r.autocast = NULL;
    r.threads = t->cfg.threads;
    return r;
}

static lowp_status eval_raw(lowp_trainer *t, float *val_loss) {
    const int32_t B = t->cfg.batch, T = t->cfg.seq_len;
    lowp_moe_run run = train_run(t, 0);
    double sum = 0.0;
    for (int32_t i = 0; i < t->cfg.eval_batches; i++) {
        lowp_status st = lowp_data_batch(t->data, LOWP_SPLIT_VAL, t->cfg.eval_seed, (uint64_t) i, B,
                                         T, t->tokens, t->targets);
        if (st != LOWP_OK) return st;
        float loss, ce;
        if ((st = lowp_moe_forward(t->model, t->tokens, t->targets, B, T, &run, &loss)) !=
                LOWP_OK ||
            (st = lowp_moe_loss_terms(t->model, &ce, NULL)) != LOWP_OK)
            return st;
        sum += (double) ce;
    }
    *val_loss = (float) (sum / (double) t->cfg.eval_batches);
    return LOWP_OK;
}

lowp_status lowp_trainer_eval(lowp_trainer *t, float *val_loss) {
    LOWP_CHECK_PTR("lowp_trainer_eval", t);
    LOWP_CHECK_PTR("lowp_trainer_eval", val_loss);
    /* An evaluation's forward passes may record amaxes into the FP8 state; the uninterrupted
     * run and the resumed one must not differ by whether that happened. */
    trainer_xstate snap;
    lowp_status st = lowp_trainer_xstate_save(t, &snap);
    if (st != LOWP_OK) return st;
    st = eval_raw(t, val_loss);
    lowp_status st2 = lowp_trainer_xstate_load(t, &snap);
    lowp_trainer_xstate_free(&snap);
    /* The evaluation also quantized the weights of this version, and a weight's amax is
     * recorded when its copies are made, once per version: the restore just dropped that
     * record, and the cache would keep the next training forward from making it again. Marking
     * the weights changed makes that forward quantize them afresh (the same codes, the same
     * scale) and record their amax, as a run that did not evaluate here (or resumed here) does. */
    for (int32_t i = 0; i < t->n && st2 == LOWP_OK; i++)
        if (t->params[i].wrap) st2 = lowp_param_updated(&t->params[i]);
    return st != LOWP_OK ? st : st2;
}

lowp_status lowp_trainer_step(lowp_trainer *t, lowp_step_report *rep) {
    const char *fn = "lowp_trainer_step";
    LOWP_CHECK_PTR(fn, t);
    LOWP_CHECK_PTR(fn, rep);
    memset(rep, 0, sizeof *rep);
    const int32_t B = t->cfg.batch, T = t->cfg.seq_len, A = t->cfg.accum;
    const double t_begin = lowp_trainer_now();
    lowp_prof_push(LOWP_PHASE_OPTIMIZER);
    for (int32_t i = 0; i < t->n; i++)
        memset(t->params[i].grad, 0, (size_t) lowp_param_numel(&t->params[i]) * sizeof(float));
    lowp_prof_pop();
    lowp_moe_run run = train_run(t, 1);
    double ce_sum = 0.0, aux_sum = 0.0;
    lowp_status st;
    for (int32_t a = 0; a < A; a++) {
        lowp_prof_push(LOWP_PHASE_DATA);
        st = lowp_data_batch(t->data, LOWP_SPLIT_TRAIN, t->cfg.seed, t->data_pos, B, T, t->tokens,
                             t->targets);
        lowp_prof_pop();
        if (st != LOWP_OK) return st;
        t->data_pos++;
        float loss, ce, aux;
        /* The model's own loops (norms, activations, routing, loss) are the elementwise phase;
         * the training layer marks its GEMMs and quantization, the attention its core. */
        lowp_prof_push(LOWP_PHASE_ELEMENTWISE);
        if ((st = lowp_moe_forward(t->model, t->tokens, t->targets, B, T, &run, &loss)) ==
                LOWP_OK &&
            (st = lowp_moe_loss_terms(t->model, &ce, &aux)) == LOWP_OK)
            st = lowp_moe_backward(t->model);
        lowp_prof_pop();
        if (st != LOWP_OK) return st;
        ce_sum += (double) ce;
        aux_sum += (double) aux;
    }
    lowp_prof_push(LOWP_PHASE_OPTIMIZER);
    /* The model's gradients are of a mean over one micro-batch; the update wants the mean over
     * all of them. */
    if (A > 1) {
        const float inv = 1.0f / (float) A;
        for (int32_t i = 0; i < t->n; i++) {
            float *g = t->params[i].grad;
            const int64_t cnt = lowp_param_numel(&t->params[i]);
            for (int64_t j = 0; j < cnt; j++) g[j] *= inv;
        }
    }
    float norm = 0.0f;
    if ((st = lowp_grad_clip(t->params, t->n, t->cfg.clip, &norm)) != LOWP_OK) return st;
    lowp_lr_schedule sched = {t->cfg.lr, t->cfg.min_lr, t->cfg.warmup, t->cfg.steps};
    float lr;
    if ((st = lowp_lr_at(&sched, t->step, &lr)) != LOWP_OK) return st;
    /* A non-finite gradient would poison the weights and both moments for good: skip the
     * update, as dynamic loss scaling does, and let the caller see it in the report. */
    rep->skipped = !isfinite(norm);
    if (!rep->skipped && (st = lowp_adamw_step(t->opt, t->params, t->n, lr)) != LOWP_OK) return st;
    st = lowp_train_step_end(t->params, t->n, NULL);
    lowp_prof_pop();
    if (st != LOWP_OK) return st;
    t->step++;
    const double t_update = lowp_trainer_now();

    rep->step = t->step;
    rep->steps = t->cfg.steps;
    rep->loss = (float) (ce_sum / (double) A);
    rep->aux_loss = (float) (aux_sum / (double) A);
    rep->lr = lr;
    rep->grad_norm = norm;
    rep->val_loss = NAN;
    rep->tokens = (int64_t) A * B * T;
    rep->step_s = t_update - t_begin;
    rep->tokens_per_s = rep->step_s > 0 ? (double) rep->tokens / rep->step_s : 0.0;
    const int due =
        t->step == t->cfg.steps || (t->cfg.eval_every > 0 && t->step % t->cfg.eval_every == 0);
    if (due) {
        if ((st = lowp_trainer_eval(t, &rep->val_loss)) != LOWP_OK) return st;
        rep->evaluated = 1;
        rep->eval_s = lowp_trainer_now() - t_update;
    }
    t->run_steps++;
    const double now = lowp_trainer_now();
    rep->elapsed_s = now - t->t0;
    const int64_t left = t->cfg.steps > t->step ? t->cfg.steps - t->step : 0;
    rep->eta_s = rep->elapsed_s / (double) t->run_steps * (double) left;
    return LOWP_OK;
}

lowp_status lowp_trainer_run(lowp_trainer *t, int64_t until, lowp_progress_fn fn, void *user) {
    LOWP_CHECK_PTR("lowp_trainer_run", t);
    if (until < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_trainer_run: until (%lld) < 0",
                         (long long) until);
    if (until == 0) until = t->cfg.steps;
    while (t->step < until) {
        lowp_step_report rep;
        lowp_status st = lowp_trainer_step(t, &rep);
        if (st != LOWP_OK) return st;
        if (fn && fn(&rep, user)) break;
    }
    return LOWP_OK;
}

/* ---- Sampling ---- */

lowp_status lowp_sample_cfg_init(lowp_sample_cfg *cfg) {
    LOWP_CHECK_PTR("lowp_sample_cfg_init", cfg);
    cfg->temperature = 0.8f;
    cfg->top_k = 0;
    cfg->seed = 42;
    cfg->threads = 0;
    return LOWP_OK;
}

/* The next token from logits [V]: argmax at temperature <= 0, else a draw from the softmax of
 * the top_k largest (ties broken by the lower token) at the temperature. u in [0, 1). */
static int32_t pick(const float *logits, int32_t V, float temperature, int32_t top_k, double u,
                    int32_t *order, double *prob) {
    int32_t best = 0;
    for (int32_t v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (!(temperature > 0)) return best;
    int32_t k = (top_k > 0 && top_k < V) ? top_k : V;
    /* Selection of the k largest by insertion into order[0 .. k-1]: V is at most 256. */
    int32_t have = 0;
    for (int32_t v = 0; v < V; v++) {
        if (have == k && !(logits[v] > logits[order[k - 1]])) continue;
        int32_t j = have < k ? have++ : k - 1;
        while (j > 0 && logits[v] > logits[order[j - 1]]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = v;
    }
    double mx = logits[order[0]], sum = 0.0;
    for (int32_t j = 0; j < k; j++) {
        prob[j] = exp(((double) logits[order[j]] - mx) / (double) temperature);
        sum += prob[j];
    }
    double acc = 0.0, target = u * sum;
    for (int32_t j = 0; j < k; j++) {
        acc += prob[j];
        if (target < acc) return order[j];
    }
    return order[k - 1];
}

lowp_status lowp_sample_text(lowp_moe *model, const lowp_data *data, const lowp_sample_cfg *cfg,
                             const char *prompt, int32_t n, char *out) {
    const char *fn = "lowp_sample_text";
    LOWP_CHECK_PTR(fn, model);
    LOWP_CHECK_PTR(fn, data);
    LOWP_CHECK_PTR(fn, cfg);
    LOWP_CHECK_PTR(fn, out);
    if (n < 0) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: n (%d) < 0", fn, (int) n);
    if (!isfinite(cfg->temperature))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: temperature (%g) is not finite", fn,
                         (double) cfg->temperature);
    lowp_moe_config mc;
    lowp_status st = lowp_moe_get_config(model, &mc);
    if (st != LOWP_OK) return st;
    const uint8_t *symbols;
    int32_t V;
    lowp_data_vocab(data, &symbols, &V);
    if (V != mc.vocab)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: the model's vocab (%d) != the data's (%d)", fn,
                         (int) mc.vocab, (int) V);
    size_t plen = prompt ? strlen(prompt) : 0;
    const size_t cap = plen + (size_t) n + 1;
    int32_t *ctx = malloc(cap * sizeof *ctx);
    int32_t *order = malloc((size_t) V * sizeof *order);
    double *prob = malloc((size_t) V * sizeof *prob);
    if (!ctx || !order || !prob) {
        free(ctx);
        free(order);
        free(prob);
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    size_t len = 0;
    if (plen) {
        st = lowp_data_encode(data, prompt, plen, ctx);
        len = plen;
    } else {
        ctx[0] = 0;
        for (int32_t v = 0; v < V; v++)
            if (symbols[v] == '\n') ctx[0] = v;
        len = 1;
    }
    lowp_moe_run run;
    memset(&run, 0, sizeof run);
    run.threads = cfg->threads;
    for (int32_t i = 0; i < n && st == LOWP_OK; i++) {
        const size_t T = len < (size_t) mc.seq_len ? len : (size_t) mc.seq_len;
        const int32_t *window = ctx + (len - T);
        float unused;
        st = lowp_moe_forward(model, window, NULL, 1, (int32_t) T, &run, &unused);
        const float *logits = NULL;
        if (st == LOWP_OK) st = lowp_moe_logits(model, &logits);
        if (st != LOWP_OK) break;
        const uint64_t w = 2 * (uint64_t) i;
        const uint64_t r = ((uint64_t) lowp_philox_word(cfg->seed, w) << 21) ^
                           (uint64_t) lowp_philox_word(cfg->seed, w + 1);
        const double u = (double) (r & ((1ull << 53) - 1)) / 9007199254740992.0;
        const int32_t next =
            pick(logits + (T - 1) * (size_t) V, V, cfg->temperature, cfg->top_k, u, order, prob);
        ctx[len++] = next;
        out[i] = (char) symbols[next];
    }
    if (st == LOWP_OK) out[n] = '\0';
    free(ctx);
    free(order);
    free(prob);
    return st;
}
