/* The training loop of trainer.h: the trainer (micro-batches, update, evaluation). The
 * schedule, AdamW and clipping are in optim.c, sampling in sample.c, checkpoints in
 * checkpoint.c.
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

#include "core/profile_internal.h"
#include "lowp/threads.h"
#include "guard.h"
#include "optim.h"
#include "trainer_internal.h"

double lowp_trainer_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
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
    cfg->max_skipped = 10;
    return LOWP_OK;
}

static lowp_status check_cfg(const char *fn, const lowp_trainer_cfg *c, const lowp_moe_config *mc) {
    if (c->steps < 0 || c->batch <= 0 || c->accum <= 0 || c->seq_len < 0 || c->warmup < 0 ||
        c->eval_every < 0 || c->eval_batches <= 0 || c->threads < 0 || c->max_skipped < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: cfg has steps %d, batch %d, accum %d, seq_len %d, warmup %d, "
                         "eval_every %d, eval_batches %d, threads %d, max_skipped %d (batch, "
                         "accum and eval_batches must be positive, the rest >= 0)",
                         fn, (int) c->steps, (int) c->batch, (int) c->accum, (int) c->seq_len,
                         (int) c->warmup, (int) c->eval_every, (int) c->eval_batches,
                         (int) c->threads, (int) c->max_skipped);
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

/* A recipe with stochastic rounding or the Hadamard transform (the FP4 recipes) draws from the
 * tracker's states "stochastic_rounding" (seed + 1) and "hadamard" (seed + 2), which the
 * trainer adds after "default" (seed); lowp.torch's trainer adds the same (docs/numerics.md
 * 4b). Other recipes leave the tracker as it was, so their checkpoints do not change. */
static lowp_status add_fp4_states(lowp_trainer *t, const lowp_recipe *recipe) {
    int need = 0;
    for (int32_t i = 0; i < recipe->nrules && i < LOWP_RECIPE_MAX_RULES; i++) {
        const lowp_recipe_rule *r = &recipe->rules[i];
        need |= !r->high_precision &&
                (r->cfg.wgrad_hadamard || r->cfg.input.rounding == LOWP_ROUNDING_SR ||
                 r->cfg.grad_output.rounding == LOWP_ROUNDING_SR);
    }
    if (!need) return LOWP_OK;
    lowp_status st = lowp_rng_tracker_add(&t->rng, "stochastic_rounding", t->cfg.seed + 1);
    if (st == LOWP_OK) st = lowp_rng_tracker_add(&t->rng, "hadamard", t->cfg.seed + 2);
    return st;
}

lowp_status lowp_trainer_create(lowp_model *model, const lowp_data *data, const lowp_recipe *recipe,
                                const lowp_trainer_cfg *cfg, lowp_trainer **out) {
    const char *fn = "lowp_trainer_create";
    LOWP_CHECK_PTR(fn, model);
    LOWP_CHECK_PTR(fn, data);
    LOWP_CHECK_PTR(fn, cfg);
    LOWP_CHECK_PTR(fn, out);
    *out = NULL;
    lowp_moe_config mc;
    lowp_status st = lowp_model_get_config(model, &mc);
    if (st != LOWP_OK) return st;
    if ((st = check_cfg(fn, cfg, &mc)) != LOWP_OK) return st;
    lowp_data_info di;
    lowp_data_get_info(data, &di);
    if (di.vocab != mc.vocab)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: the model's vocab (%d) != the data's (%d distinct bytes in %s)", fn,
                         (int) mc.vocab, (int) di.vocab, di.name);
    const int32_t T = cfg->seq_len > 0 ? cfg->seq_len : mc.seq_len;
    if ((st = lowp_data_check_seq_len(data, T)) != LOWP_OK) {
        lowp_error_append("%s", fn);
        return st;
    }
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
    if ((st = lowp_model_params(model, &t->params, &t->n)) != LOWP_OK) goto fail;
    if (recipe) {
        if ((st = lowp_train_prepare(t->params, t->n, recipe)) != LOWP_OK) {
            lowp_error_append("%s: preparing the parameters with recipe '%s'", fn, recipe->name);
            goto fail;
        }
        t->prepared = 1;
    }
    lowp_adamw_cfg acfg = t->cfg.adamw;
    acfg.threads = t->cfg.threads; /* the trainer's thread count rules the optimizer too */
    if ((st = lowp_adamw_create(t->params, t->n, &acfg, &t->opt)) != LOWP_OK) goto fail;
    if ((st = lowp_rng_tracker_init(&t->rng, t->cfg.seed)) != LOWP_OK) goto fail;
    if (recipe && (st = add_fp4_states(t, recipe)) != LOWP_OK) goto fail;
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

void lowp_trainer_extra_state_free(trainer_extra_state *x) {
    if (!x) return;
    for (int32_t i = 0; i < x->n && x->blob; i++) free(x->blob[i]);
    free(x->blob);
    free(x->len);
    memset(x, 0, sizeof *x);
}

lowp_status lowp_trainer_extra_state_save(lowp_trainer *t, trainer_extra_state *x) {
    memset(x, 0, sizeof *x);
    x->blob = calloc((size_t) (t->n > 0 ? t->n : 1), sizeof *x->blob);
    x->len = calloc((size_t) (t->n > 0 ? t->n : 1), sizeof *x->len);
    if (!x->blob || !x->len) {
        lowp_trainer_extra_state_free(x);
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
            lowp_trainer_extra_state_free(x);
            return st;
        }
    }
    return LOWP_OK;
}

lowp_status lowp_trainer_extra_state_load(lowp_trainer *t, const trainer_extra_state *x) {
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

static lowp_model_run train_run(lowp_trainer *t, int training) {
    lowp_model_run r;
    memset(&r, 0, sizeof r);
    r.training = training;
    r.activation_checkpoint = training ? t->cfg.activation_checkpoint : 0;
    r.rng = (training && (t->mcfg.dropout > 0 || t->rng.count > 1)) ? &t->rng : NULL;
    r.autocast = NULL;
    r.threads = t->cfg.threads;
    return r;
}

static lowp_status eval_raw(lowp_trainer *t, float *val_loss) {
    const int32_t B = t->cfg.batch, T = t->cfg.seq_len;
    lowp_model_run run = train_run(t, 0);
    double sum = 0.0;
    for (int32_t i = 0; i < t->cfg.eval_batches; i++) {
        lowp_status st = lowp_data_batch(t->data, LOWP_SPLIT_VAL, t->cfg.eval_seed, (uint64_t) i, B,
                                         T, t->tokens, t->targets);
        if (st != LOWP_OK) return st;
        float loss, ce;
        if ((st = lowp_model_forward(t->model, t->tokens, t->targets, B, T, &run, &loss)) !=
                LOWP_OK ||
            (st = lowp_model_loss_terms(t->model, &ce, NULL)) != LOWP_OK)
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
    trainer_extra_state snap;
    lowp_status st = lowp_trainer_extra_state_save(t, &snap);
    if (st != LOWP_OK) return st;
    st = eval_raw(t, val_loss);
    lowp_status st2 = lowp_trainer_extra_state_load(t, &snap);
    lowp_trainer_extra_state_free(&snap);
    /* The evaluation also quantized the weights of this version, and a weight's amax is
     * recorded when its copies are made, once per version: the restore just dropped that
     * record, and the cache would keep the next training forward from making it again. Marking
     * the weights changed makes that forward quantize them afresh (the same codes, the same
     * scale) and record their amax, as a run that did not evaluate here (or resumed here) does. */
    for (int32_t i = 0; i < t->n && st2 == LOWP_OK; i++)
        if (t->params[i].wrap) st2 = lowp_param_updated(&t->params[i]);
    return st != LOWP_OK ? st : st2;
}

/* One span of the gradient zeroing (lowp_param_spans). */
static void zero_item(void *ctx, int32_t i, int64_t item, int64_t j0, int64_t len) {
    (void) item;
    memset(((lowp_param *) ctx)[i].grad + j0, 0, (size_t) len * sizeof(float));
}

/* Every gradient zeroed, in one parallel loop over spans of all of them. */
static lowp_status zero_grads(lowp_param *params, int32_t n, int nt) {
    int64_t *count = lowp_param_counts(params, n);
    if (!count) return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "lowp_trainer_step: out of memory");
    lowp_status st = lowp_param_spans(count, n, 65536, nt, 4 * 65536, zero_item, params);
    free(count);
    return st;
}

lowp_status lowp_trainer_step(lowp_trainer *t, lowp_step_report *rep) {
    const char *fn = "lowp_trainer_step";
    LOWP_CHECK_PTR(fn, t);
    LOWP_CHECK_PTR(fn, rep);
    memset(rep, 0, sizeof *rep);
    const int32_t B = t->cfg.batch, T = t->cfg.seq_len, A = t->cfg.accum;
    const double t_begin = lowp_trainer_now();
    lowp_prof_push(LOWP_PHASE_OPTIMIZER);
    const int nt = (int) lowp_thread_count(t->cfg.threads);
    lowp_status st = zero_grads(t->params, t->n, nt);
    lowp_prof_pop();
    if (st != LOWP_OK) return st;
    lowp_model_run run = train_run(t, 1);
    double ce_sum = 0.0, aux_sum = 0.0;
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
        if ((st = lowp_model_forward(t->model, t->tokens, t->targets, B, T, &run, &loss)) ==
                LOWP_OK &&
            (st = lowp_model_loss_terms(t->model, &ce, &aux)) == LOWP_OK)
            st = lowp_model_backward(t->model);
        lowp_prof_pop();
        if (st != LOWP_OK) return st;
        ce_sum += (double) ce;
        aux_sum += (double) aux;
    }
    lowp_prof_push(LOWP_PHASE_OPTIMIZER);
    /* The model's gradients are of a mean over one micro-batch; the update wants the mean over
     * all of them. */
    if (A > 1 && (st = lowp_grads_scale(t->params, t->n, 1.0f / (float) A, nt)) != LOWP_OK)
        return st;
    if ((st = lowp_trainer_guard_loss(t, (float) (ce_sum / (double) A))) != LOWP_OK) return st;
    /* The clipping factor goes into the update (lowp_adamw_step_scaled) instead of a pass that
     * scales every gradient in memory first: the same products, one pass over them fewer. */
    float norm = 0.0f, gscale = 1.0f;
    if ((st = lowp_grad_norm_scale(t->params, t->n, t->cfg.clip, &norm, &gscale, nt)) != LOWP_OK)
        return st;
    lowp_lr_schedule sched = {t->cfg.lr, t->cfg.min_lr, t->cfg.warmup, t->cfg.steps};
    float lr;
    if ((st = lowp_lr_at(&sched, t->step, &lr)) != LOWP_OK) return st;
    /* A non-finite gradient would poison the weights and both moments for good: skip the
     * update, as dynamic loss scaling does, and let the caller see it in the report. */
    rep->skipped = !isfinite(norm);
    if (!rep->skipped &&
        (st = lowp_adamw_step_scaled(t->opt, t->params, t->n, lr, gscale)) != LOWP_OK)
        return st;
    st = lowp_train_step_end(t->params, t->n, NULL);
    lowp_prof_pop();
    if (st != LOWP_OK) return st;
    t->step++;
    if ((st = lowp_trainer_guard_skips(t, rep->skipped)) != LOWP_OK) return st;
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
