/* Tests of the MoE transformer (model.h): a finite-difference gradient check of the whole
 * model with F32 GEMMs, activation checkpointing giving the same losses and gradients bit for
 * bit (FP8 delayed scaling and dropout on), the loss falling on a repeated sequence, forwards
 * that are deterministic across runs and thread counts, and argument errors. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "lowp/lowp.h"
#include "lowp/model.h"
#include "testutil.h"
#include "model_testutil.h"
#include "core/internal.h"
#include "cpu/cpu.h"
#include "model/model_internal.h"
#include "train/train_internal.h"

/* A small configuration every test can afford (the gradient check runs many forwards). */
static lowp_moe_config small_cfg(void) {
    lowp_moe_config c;
    lowp_moe_config_preset("tiny", 13, &c);
    c.dim = 16;
    c.heads = 2;
    c.seq_len = 8;
    c.experts = 4;
    c.top_k = 2;
    c.expert_hidden = 12;
    c.shared_hidden = 8;
    return c;
}

/* The inputs of the gradient check. */
typedef struct gc_case {
    lowp_moe *m;
    const int32_t *tok, *tgt;
    int32_t B, T;
    lowp_moe_run eval;
} gc_case;

/* (L(w + h d) - L(w - h d)) / 2h, with d = sign(grad) on the entries at[0 .. ns-1]. */
static double central_difference(const gc_case *g, lowp_param *p, const int64_t *at, int ns,
                                 float h) {
    double l[2];
    for (int side = 0; side < 2; side++) {
        float saved[64];
        const float step = side == 0 ? h : -h;
        for (int k = 0; k < ns; k++) saved[k] = p->data[at[k]];
        for (int k = 0; k < ns; k++) p->data[at[k]] += p->grad[at[k]] >= 0.0f ? step : -step;
        l[side] = loss64(g->m, g->tok, g->tgt, g->B, g->T, &g->eval);
        for (int k = ns - 1; k >= 0; k--) p->data[at[k]] = saved[k];
    }
    return (l[0] - l[1]) / (2.0 * h);
}

/* (1) Central differences against the analytic gradient, on every parameter: for each, a
 * directional derivative along sign(grad) over a sample of entries (a strong signal), and
 * the largest-gradient entries one by one (catches a gradient landing on the wrong index).
 * Top-k routing makes the loss piecewise smooth: a step large enough to flip an expert choice
 * jumps, a step too small drowns in binary32 rounding. So each check tries four steps and
 * takes the best agreement; a wrong gradient disagrees at all of them. */
static void test_gradient_check(float aux_coef, int32_t top_k, float router_scale) {
    lowp_moe_config c = small_cfg();
    c.aux_loss_coef = aux_coef;
    c.top_k = top_k;
    lowp_moe *m;
    CHECK(lowp_moe_create(&c, 7, &m) == LOWP_OK);
    lowp_param *ps;
    int32_t np;
    lowp_moe_params(m, &ps, &np);
    enum { B = 2, T = 6 };
    int32_t tok[B * T], tgt[B * T];
    fill_ids(tok, B * T, c.vocab, 1);
    fill_ids(tgt, B * T, c.vocab, 2);
    lowp_moe_run train = {0};
    train.training = 1;
    train.threads = 1;
    train.fp32_plain = 1;
    gc_case g = {m, tok, tgt, B, T, train};
    g.eval.training = 0;

    /* A router larger than its initialization leaves clear gaps between the expert
     * probabilities, so fewer choices sit near a tie. */
    for (int32_t i = 0; i < np; i++)
        if (strstr(ps[i].name, "router"))
            for (int64_t j = 0; j < numel(&ps[i]); j++) ps[i].data[j] *= router_scale;

    zero_grads(ps, np);
    loss_of(m, tok, tgt, B, T, &train);
    CHECK(lowp_moe_backward(m) == LOWP_OK);

    static const float steps[4] = {3e-3f, 1e-3f, 3e-4f, 1e-4f};
    double worst_dir = 0.0, worst_one = 0.0;
    for (int32_t i = 0; i < np; i++) {
        lowp_param *p = &ps[i];
        const int64_t n = numel(p);
        /* Directional check over up to 64 distinct entries spread across the parameter. */
        int64_t at[64];
        int ns = 0;
        for (int64_t j = 0; j < 64 && j < n; j++) at[ns++] = n <= 64 ? j : (j * n) / 64 + (i % 7);
        double analytic = 0.0;
        for (int k = 0; k < ns; k++) analytic += fabs((double) p->grad[at[k]]);
        double rel = INFINITY, numeric = 0.0;
        for (int si = 0; si < 4; si++) {
            const double num = central_difference(&g, p, at, ns, steps[si]);
            const double r = fabs(num - analytic) / fmax(analytic, 1e-3);
            if (r < rel) rel = r, numeric = num;
        }
        if (rel > worst_dir) worst_dir = rel;
        CHECKF(rel < 1e-2, "%s: directional derivative %.6g, numeric %.6g (rel %.3g)", p->name,
               analytic, numeric, rel);

        /* The two largest-gradient entries, one at a time. */
        float gmax = 0.0f;
        for (int64_t j = 0; j < n; j++) gmax = fmaxf(gmax, fabsf(p->grad[j]));
        int64_t best[2] = {-1, -1};
        for (int r = 0; r < 2; r++)
            for (int64_t j = 0; j < n; j++)
                if (j != best[0] && (best[r] < 0 || fabsf(p->grad[j]) > fabsf(p->grad[best[r]])))
                    best[r] = j;
        for (int r = 0; r < 2 && r < n; r++) {
            double err = INFINITY, num = 0.0;
            for (int si = 0; si < 4; si++) {
                const double d = central_difference(&g, p, &best[r], 1, steps[si]);
                /* one entry's difference carries a few 1e-6 of binary32 noise: the floor */
                const double e = fabs(d - fabs(p->grad[best[r]])) / fmax((double) gmax, 2.5e-4);
                if (e < err) err = e, num = d;
            }
            if (err > worst_one) worst_one = err;
            CHECKF(err < 2e-2, "%s[%lld]: |grad| %.6g, numeric %.6g (err %.3g of max |grad| %.3g)",
                   p->name, (long long) best[r], fabs((double) p->grad[best[r]]), num, err,
                   (double) gmax);
        }
    }
    printf("gradient check (aux %.2f, top %d of 4): worst directional rel. error %.2e, worst "
           "entry error %.2e\n",
           (double) aux_coef, top_k, worst_dir, worst_one);
    lowp_moe_free(m);
}

/* One training step of a model: zero grads, forward, backward; returns the loss. */
static float train_step(lowp_moe *m, lowp_param *ps, int32_t np, const int32_t *tok,
                        const int32_t *tgt, int32_t B, int32_t T, const lowp_moe_run *run) {
    zero_grads(ps, np);
    const float loss = loss_of(m, tok, tgt, B, T, run);
    lowp_status st = lowp_moe_backward(m);
    if (st != LOWP_OK) CHECKF(st == LOWP_OK, "backward: %s", lowp_last_error());
    return loss;
}

static void sgd(lowp_param *ps, int32_t np, float lr) {
    for (int32_t i = 0; i < np; i++)
        for (int64_t j = 0; j < numel(&ps[i]); j++) ps[i].data[j] -= lr * ps[i].grad[j];
}

static int same_bits(const void *a, const void *b, size_t n) {
    return memcmp(a, b, n) == 0;
}

/* (2) Activation checkpointing on and off: the same losses, gradients, FP8 delayed-scaling
 * histories and generator states (dropout's, and nvfp4's SR and Hadamard states), bit for bit,
 * over a few steps. */
static void test_checkpoint_equal(const char *recipe_name) {
    lowp_moe_config c = small_cfg();
    c.dim = 32; /* MX and block formats quantize in blocks of 32 */
    c.expert_hidden = 32;
    c.shared_hidden = 32;
    c.dropout = 0.1f;
    lowp_moe *m[2];
    lowp_param *ps[2];
    int32_t np[2];
    lowp_rng_tracker rng[2];
    lowp_recipe r;
    CHECK(lowp_recipe_init(&r, recipe_name) == LOWP_OK);
    for (int k = 0; k < 2; k++) {
        CHECK(lowp_moe_create(&c, 11, &m[k]) == LOWP_OK);
        lowp_moe_params(m[k], &ps[k], &np[k]);
        lowp_status st = lowp_train_prepare(ps[k], np[k], &r);
        CHECKF(st == LOWP_OK, "prepare %s: %s", recipe_name, lowp_last_error());
        lowp_rng_tracker_init(&rng[k], 99);
        if (strcmp(recipe_name, "nvfp4") == 0) { /* SR and the Hadamard signs draw too */
            CHECK_OK(lowp_rng_tracker_add(&rng[k], "stochastic_rounding", 100));
            CHECK_OK(lowp_rng_tracker_add(&rng[k], "hadamard", 101));
        }
    }
    enum { B = 3, T = 8 };
    int32_t tok[B * T], tgt[B * T];
    fill_ids(tok, B * T, c.vocab, 3);
    fill_ids(tgt, B * T, c.vocab, 4);
    int wrapped = 0;
    for (int32_t i = 0; i < np[0]; i++) wrapped += ps[0][i].wrap != NULL;

    int equal_loss = 1, equal_grads = 1, equal_rng = 1, equal_fp8 = 1;
    for (int step = 0; step < 3; step++) {
        float loss[2];
        for (int k = 0; k < 2; k++) {
            lowp_moe_run run = {0};
            run.training = 1;
            run.activation_checkpoint = k;
            run.rng = &rng[k];
            run.threads = 1; /* a busy CI machine makes idle OpenMP teams slow, not wrong */
            loss[k] = train_step(m[k], ps[k], np[k], tok, tgt, B, T, &run);
        }
        equal_loss &= same_bits(&loss[0], &loss[1], sizeof(float));
        for (int32_t i = 0; i < np[0]; i++)
            if (!same_bits(ps[0][i].grad, ps[1][i].grad, (size_t) numel(&ps[0][i]) * 4)) {
                if (equal_grads)
                    fprintf(stderr, "step %d: grads of %s differ\n", step, ps[0][i].name);
                equal_grads = 0;
            }
        equal_rng &= same_bits(&rng[0], &rng[1], sizeof rng[0]);
        for (int k = 0; k < 2; k++) {
            sgd(ps[k], np[k], 0.05f);
            CHECK(lowp_train_step_end(ps[k], np[k], NULL) == LOWP_OK);
        }
        for (int32_t i = 0; i < np[0]; i++) {
            const struct lowp_wrap *w0 = ps[0][i].wrap, *w1 = ps[1][i].wrap;
            if (!w0 || !w0->fp8) continue;
            const size_t n = (size_t) LOWP_ROLE_COUNT * (w0->fp8->history_len + 1);
            equal_fp8 &= same_bits(w0->fp8->host_buf, w1->fp8->host_buf, n * sizeof(float));
            for (int role = 0; role < LOWP_ROLE_COUNT; role++)
                equal_fp8 &= same_bits(&w0->fp8->roles[role].scale, &w1->fp8->roles[role].scale,
                                       sizeof(float));
        }
    }
    CHECKF(equal_loss, "%s: checkpointed losses differ", recipe_name);
    CHECKF(equal_grads, "%s: checkpointed gradients differ", recipe_name);
    CHECKF(equal_rng, "%s: dropout generators end in different states", recipe_name);
    CHECKF(equal_fp8, "%s: FP8 delayed-scaling states differ", recipe_name);
    if (strcmp(recipe_name, "bf16") != 0)
        CHECKF(wrapped > 0, "%s: no parameter was wrapped", recipe_name);
    for (int k = 0; k < 2; k++) {
        lowp_train_convert(ps[k], np[k]);
        lowp_moe_free(m[k]);
    }
}

/* (3) Adam on a repeated sequence: the loss falls well below its start. */
static void test_loss_falls(void) {
    lowp_moe_config c;
    lowp_moe_config_preset("tiny", 16, &c);
    lowp_moe *m;
    CHECK(lowp_moe_create(&c, 5, &m) == LOWP_OK);
    lowp_param *ps;
    int32_t np;
    lowp_moe_params(m, &ps, &np);
    enum { B = 4, T = 32 };
    int32_t tok[B * (T + 1)], in[B * T], tgt[B * T];
    for (int i = 0; i < B * (T + 1); i++) tok[i] = (i * 5 + i / 7) % 16; /* a fixed pattern */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            in[b * T + t] = tok[b * (T + 1) + t];
            tgt[b * T + t] = tok[b * (T + 1) + t + 1];
        }
    /* Adam moments */
    int64_t total = 0;
    for (int32_t i = 0; i < np; i++) total += numel(&ps[i]);
    float *mo = calloc((size_t) total, sizeof(float)), *ve = calloc((size_t) total, sizeof(float));
    lowp_moe_run run = {0};
    run.training = 1;
    run.threads = 1;
    float first = 0.0f, last = 0.0f;
    const int steps = testutil_quick() ? 30 : 50;
    for (int step = 1; step <= steps; step++) {
        last = train_step(m, ps, np, in, tgt, B, T, &run);
        if (step == 1) first = last;
        const float lr = 1e-2f, b1 = 0.9f, b2 = 0.99f;
        const float c1 = 1.0f - powf(b1, (float) step), c2 = 1.0f - powf(b2, (float) step);
        int64_t k = 0;
        for (int32_t i = 0; i < np; i++)
            for (int64_t j = 0; j < numel(&ps[i]); j++, k++) {
                const float g = ps[i].grad[j];
                mo[k] = b1 * mo[k] + (1 - b1) * g;
                ve[k] = b2 * ve[k] + (1 - b2) * g * g;
                ps[i].data[j] -= lr * (mo[k] / c1) / (sqrtf(ve[k] / c2) + 1e-8f);
            }
        lowp_train_step_end(ps, np, NULL);
    }
    float ce = NAN, aux = NAN;
    CHECK(lowp_moe_loss_terms(m, &ce, &aux) == LOWP_OK);
    printf("loss falls: %.4f -> %.4f (cross-entropy %.4f, load balance %.4f)\n", first, last, ce,
           aux);
    CHECKF(first > 2.5f && last < 0.5f * first, "loss %.4f -> %.4f", first, last);
    CHECK(aux >= 1.0f - 1e-4f && aux < 4.0f); /* 1 when balanced, E when collapsed */
    free(mo);
    free(ve);
    /* lowp_moe_free empties the cache of released host blocks (a block put there now, where
     * the cache is on: glibc, huge pages and LOWP_HOST_CACHE_MB not 0) */
    void *blk = lowp_host_alloc((size_t) 3 << 20);
    CHECK(blk != NULL);
    lowp_host_free(blk);
    const char *env = getenv("LOWP_HOST_CACHE_MB");
#ifdef __GLIBC__
    if (!(env && strcmp(env, "0") == 0) && lowp_hugepages_enabled())
        CHECK(lowp_host_cache_bytes() >= ((size_t) 3 << 20));
#else
    (void) env;
#endif
    lowp_moe_free(m);
    CHECK(lowp_host_cache_bytes() == 0);
}

/* (4) The same seed gives the same weights; a forward and backward give the same bits across
 * runs and thread counts; the arena grows for a larger batch and shrinks back. */
static void test_deterministic(void) {
    lowp_moe_config c;
    lowp_moe_config_preset("tiny", 65, &c);
    lowp_moe *a, *b;
    CHECK(lowp_moe_create(&c, 42, &a) == LOWP_OK);
    CHECK(lowp_moe_create(&c, 42, &b) == LOWP_OK);
    lowp_param *pa, *pb;
    int32_t na, nb;
    lowp_moe_params(a, &pa, &na);
    lowp_moe_params(b, &pb, &nb);
    CHECK(na == nb && na == 3 + 2 * 13);
    int same_init = 1;
    for (int32_t i = 0; i < na; i++)
        same_init &= same_bits(pa[i].data, pb[i].data, (size_t) numel(&pa[i]) * 4);
    CHECK(same_init);
    /* N(0, 0.02) */
    double s2 = 0.0;
    for (int64_t j = 0; j < numel(&pa[0]); j++) s2 += (double) pa[0].data[j] * pa[0].data[j];
    const double sd = sqrt(s2 / (double) numel(&pa[0]));
    CHECKF(fabs(sd - 0.02) < 0.002, "embed std %.4f", sd);
    CHECK(strcmp(pa[0].name, "embed") == 0 && strcmp(pa[na - 1].name, "head") == 0);
    CHECK(strcmp(pa[1 + 12].name, "layers.0.moe.experts.w2") == 0 && pa[1 + 12].groups == 4);

    enum { B = 3, T = 32 };
    int32_t tok[B * T], tgt[B * T];
    fill_ids(tok, B * T, c.vocab, 8);
    fill_ids(tgt, B * T, c.vocab, 9);
    const float *la, *lb;
    float loss[2];
    for (int k = 0; k < 2; k++) {
        lowp_moe_run run = {0};
        run.training = 1;
        run.threads = k + 1;
        loss[k] = train_step(k ? b : a, k ? pb : pa, na, tok, tgt, B, T, &run);
    }
    lowp_moe_logits(a, &la);
    lowp_moe_logits(b, &lb);
    CHECK(same_bits(&loss[0], &loss[1], 4));
    CHECKF(same_bits(la, lb, (size_t) B * T * c.vocab * 4),
           "logits differ between 1 and 2 threads");
    int same_grads = 1;
    for (int32_t i = 0; i < na; i++)
        same_grads &= same_bits(pa[i].grad, pb[i].grad, (size_t) numel(&pa[i]) * 4);
    CHECKF(same_grads, "gradients differ between 1 and 2 threads");

    /* An inference forward of a larger batch, then the original again: same logits. */
    float *keep = malloc((size_t) B * T * c.vocab * sizeof(float));
    memcpy(keep, la, (size_t) B * T * c.vocab * sizeof(float));
    int32_t big[8 * T];
    fill_ids(big, 8 * T, c.vocab, 10);
    CHECK(lowp_moe_forward(a, big, NULL, 8, T, NULL, NULL) == LOWP_OK);
    lowp_moe_run run = {0};
    run.training = 1;
    run.threads = 2;
    float again;
    CHECK(lowp_moe_forward(a, tok, tgt, B, T, &run, &again) == LOWP_OK);
    lowp_moe_logits(a, &la);
    CHECK(same_bits(&again, &loss[0], 4));
    CHECK(same_bits(la, keep, (size_t) B * T * c.vocab * 4));
    /* A forward without its backward, then another: the saved state is released (ASan). */
    CHECK(lowp_moe_forward(a, tok, tgt, B, T, &run, &again) == LOWP_OK);
    free(keep);
    lowp_moe_free(a);
    lowp_moe_free(b);
}

static int mentions(const char *s) {
    return strstr(lowp_last_error(), s) != NULL;
}

/* (5) Bad arguments give statuses and messages that name them. */
static void test_errors(void) {
    lowp_moe_config c;
    CHECK(lowp_moe_config_preset("huge", 65, &c) == LOWP_ERR_NOT_FOUND && mentions("huge"));
    CHECK(lowp_moe_config_preset("tiny", 0, &c) == LOWP_ERR_INVALID_ARG && mentions("vocab"));
    CHECK(lowp_moe_config_preset(NULL, 65, &c) == LOWP_ERR_INVALID_ARG);
    CHECK(lowp_moe_config_preset("tiny", 65, NULL) == LOWP_ERR_INVALID_ARG);
    lowp_moe *m = NULL;
    CHECK(lowp_moe_create(NULL, 1, &m) == LOWP_ERR_INVALID_ARG && mentions("cfg"));
    lowp_moe_config_preset("tiny", 65, &c);
    CHECK(lowp_moe_create(&c, 1, NULL) == LOWP_ERR_INVALID_ARG && mentions("out"));
    lowp_moe_config bad = c;
    bad.heads = 3;
    CHECK(lowp_moe_create(&bad, 1, &m) == LOWP_ERR_INVALID_ARG && mentions("cfg.heads") && !m);
    bad = c;
    bad.dim = 40;
    bad.heads = 8; /* head width 5: RoPE rotates pairs */
    CHECK(lowp_moe_create(&bad, 1, &m) == LOWP_ERR_INVALID_ARG && mentions("even"));
    bad = c;
    bad.top_k = 5;
    CHECK(lowp_moe_create(&bad, 1, &m) == LOWP_ERR_INVALID_ARG && mentions("cfg.top_k (5)"));
    bad = c;
    bad.dropout = 1.0f;
    CHECK(lowp_moe_create(&bad, 1, &m) == LOWP_ERR_INVALID_ARG && mentions("cfg.dropout"));
    bad = c;
    bad.experts = 0;
    CHECK(lowp_moe_create(&bad, 1, &m) == LOWP_ERR_INVALID_ARG && mentions("cfg.experts (0)"));

    CHECK(lowp_moe_create(&c, 1, &m) == LOWP_OK);
    int32_t tok[2 * 33] = {0}, tgt[2 * 33] = {0};
    float loss;
    CHECK(lowp_moe_forward(m, tok, tgt, 2, 33, NULL, &loss) == LOWP_ERR_INVALID_ARG &&
          mentions("T (33)") && mentions("seq_len = 32"));
    CHECK(lowp_moe_forward(m, tok, tgt, 0, 8, NULL, &loss) == LOWP_ERR_INVALID_ARG &&
          mentions("B (0)"));
    CHECK(lowp_moe_forward(NULL, tok, tgt, 2, 8, NULL, &loss) == LOWP_ERR_INVALID_ARG &&
          mentions("m is NULL"));
    CHECK(lowp_moe_forward(m, NULL, tgt, 2, 8, NULL, &loss) == LOWP_ERR_INVALID_ARG &&
          mentions("tokens is NULL"));
    tok[5] = 65;
    CHECK(lowp_moe_forward(m, tok, tgt, 2, 8, NULL, &loss) == LOWP_ERR_INVALID_ARG &&
          mentions("tokens[5] (65)"));
    tok[5] = 0;
    tgt[3] = -1;
    CHECK(lowp_moe_forward(m, tok, tgt, 2, 8, NULL, &loss) == LOWP_ERR_INVALID_ARG &&
          mentions("targets[3] (-1)"));
    tgt[3] = 0;
    lowp_moe_run run = {0};
    run.threads = -2;
    CHECK(lowp_moe_forward(m, tok, tgt, 2, 8, &run, &loss) == LOWP_ERR_INVALID_ARG &&
          mentions("run.threads (-2)"));
    /* No backward without a training forward with targets. */
    CHECK(lowp_moe_backward(m) == LOWP_ERR_INVALID_ARG && mentions("lowp_moe_backward"));
    CHECK(lowp_moe_forward(m, tok, tgt, 2, 8, NULL, &loss) == LOWP_OK);
    CHECK(lowp_moe_backward(m) == LOWP_ERR_INVALID_ARG);
    run.threads = 0;
    run.training = 1;
    CHECK(lowp_moe_forward(m, tok, NULL, 2, 8, &run, NULL) == LOWP_OK);
    CHECK(lowp_moe_backward(m) == LOWP_ERR_INVALID_ARG);
    CHECK(lowp_moe_forward(m, tok, tgt, 2, 8, &run, &loss) == LOWP_OK);
    CHECK(lowp_moe_backward(m) == LOWP_OK);
    CHECK(lowp_moe_backward(m) == LOWP_ERR_INVALID_ARG); /* once per forward */
    CHECK(lowp_moe_backward(NULL) == LOWP_ERR_INVALID_ARG);
    CHECK(lowp_moe_logits(m, NULL) == LOWP_ERR_INVALID_ARG);
    CHECK(lowp_moe_flops_per_token(m, 0, &(double){0}) == LOWP_ERR_INVALID_ARG);
    int64_t active, total;
    CHECK(lowp_moe_active_params(m, &active, &total) == LOWP_OK && active < total);
    CHECK(total - active == 2 * 2 * 3 * 64 * 64); /* 2 idle experts per layer */
    lowp_moe_free(m);
    lowp_moe_free(NULL);
}

/* (6) The attention core against a binary64 reference at a sequence long enough for its
 * causal row blocks (T = 200: four 48-row blocks and one of 8): the probabilities (0 above
 * the diagonal), the output and dQ, dK, dV. */
static void test_attention_blocks(void) {
    moe_dims d;
    memset(&d, 0, sizeof d);
    d.B = 1, d.T = 200, d.nh = 2, d.hd = 16, d.D = 32, d.N = 200;
    const int64_t n = d.N * d.D, T = d.T, hd = d.hd, D = d.D;
    float *q = malloc(sizeof(float) * (size_t) n), *k = malloc(sizeof(float) * (size_t) n);
    float *v = malloc(sizeof(float) * (size_t) n), *dO = malloc(sizeof(float) * (size_t) n);
    float *o = malloc(sizeof(float) * (size_t) n), *g[3];
    float *att = malloc(sizeof(float) * (size_t) (d.nh * T * T));
    for (int i = 0; i < 3; i++) g[i] = malloc(sizeof(float) * (size_t) n);
    for (int64_t i = 0; i < n; i++) q[i] = gauss(), k[i] = gauss(), v[i] = gauss(), dO[i] = gauss();
    CHECK_OK(moe_attention_core_forward(&d, q, k, v, att, o, 2));
    CHECK_OK(moe_attention_core_backward(&d, q, k, v, att, dO, g[0], g[1], g[2], 2));
    double *P = malloc(sizeof(double) * (size_t) (T * T)),
           *dS = malloc(sizeof(double) * (size_t) (T * T));
    double *ref[4]; /* o, dq, dk, dv */
    for (int i = 0; i < 4; i++) ref[i] = calloc((size_t) n, sizeof(double));
    const double sc = 1.0 / sqrt((double) hd);
    int upper_zero = 1;
    double perr = 0.0;
    for (int64_t h = 0; h < d.nh; h++) {
#define X(a, t, c) ((double) (a)[(t) *D + h * hd + (c)])
        for (int64_t t = 0; t < T; t++) {
            double mx = -INFINITY, sum = 0.0;
            for (int64_t j = 0; j <= t; j++) {
                double s = 0.0;
                for (int64_t c = 0; c < hd; c++) s += X(q, t, c) * X(k, j, c);
                P[t * T + j] = s * sc;
                if (P[t * T + j] > mx) mx = P[t * T + j];
            }
            for (int64_t j = 0; j <= t; j++) sum += P[t * T + j] = exp(P[t * T + j] - mx);
            for (int64_t j = 0; j < T; j++) {
                P[t * T + j] = j <= t ? P[t * T + j] / sum : 0.0;
                const float got = att[h * T * T + t * T + j];
                if (j > t && got != 0.0f) upper_zero = 0;
                perr = fmax(perr, fabs(got - P[t * T + j]));
            }
            for (int64_t c = 0; c < hd; c++) {
                double acc = 0.0;
                for (int64_t j = 0; j <= t; j++) acc += P[t * T + j] * X(v, j, c);
                ref[0][t * D + h * hd + c] = acc;
            }
            double pdp = 0.0;
            for (int64_t j = 0; j <= t; j++) {
                double dp = 0.0;
                for (int64_t c = 0; c < hd; c++) dp += X(dO, t, c) * X(v, j, c);
                dS[t * T + j] = dp;
                pdp += P[t * T + j] * dp;
            }
            for (int64_t j = 0; j <= t; j++)
                dS[t * T + j] = P[t * T + j] * (dS[t * T + j] - pdp) * sc;
        }
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j <= t; j++)
                for (int64_t c = 0; c < hd; c++) {
                    ref[1][t * D + h * hd + c] += dS[t * T + j] * X(k, j, c);
                    ref[2][j * D + h * hd + c] += dS[t * T + j] * X(q, t, c);
                    ref[3][j * D + h * hd + c] += P[t * T + j] * X(dO, t, c);
                }
#undef X
    }
    CHECKF(upper_zero && perr < 1e-5,
           "attention probabilities: max error %g, zero above the diagonal %d", perr, upper_zero);
    const float *got[4] = {o, g[0], g[1], g[2]};
    const char *names[4] = {"o", "dq", "dk", "dv"};
    for (int i = 0; i < 4; i++) {
        double num = 0.0, den = 0.0;
        for (int64_t e = 0; e < n; e++) {
            num += (got[i][e] - ref[i][e]) * (got[i][e] - ref[i][e]);
            den += ref[i][e] * ref[i][e];
        }
        CHECKF(sqrt(num / den) < 1e-5, "attention %s: relative error %g against binary64", names[i],
               sqrt(num / den));
    }
    for (int i = 0; i < 4; i++) free(ref[i]);
    for (int i = 0; i < 3; i++) free(g[i]);
    free(P), free(dS), free(q), free(k), free(v), free(dO), free(o), free(att);
}

/* (7) The attention core's row passes, eight rows at a time, against one row at a time in key
 * order (softmax: scale, running maximum, the exponentials as the library takes them, sum,
 * normalize; dS: sum of P dP, then P (dP - sum) scale), bit for bit: blocks of 48 and of 13
 * rows (a remainder of the eight), starting at query 0 and at query 100, scores with ties,
 * exact zeros and a large spread. */
static void test_attention_rows(void) {
    const int64_t T = 160, R = 48;
    const float scale = 0.125f;
    float *s = malloc(sizeof(float) * (size_t) (R * T)),
          *ref = malloc(sizeof(float) * (size_t) (R * T));
    float *p = malloc(sizeof(float) * (size_t) (T * T));
    int same = 1;
    for (int pass = 0; pass < 4; pass++) {
        const int64_t i0 = pass & 1 ? 100 : 0, r = pass & 2 ? 13 : R, L = i0 + r;
        for (int64_t i = 0; i < r * L; i++) {
            const uint32_t u = (uint32_t) rnd_below(100);
            s[i] = u < 5 ? 0.0f : u < 10 ? 1.5f : gauss() * (u < 20 ? 40.0f : 3.0f);
        }
        for (int64_t i = 0; i < T * T; i++) p[i] = (float) rnd_below(1000) / 1000.0f;
        memcpy(ref, s, sizeof(float) * (size_t) (r * L));
        /* the softmax of each row on its own */
        for (int64_t t = 0; t < r; t++) {
            float *x = ref + t * L, mx = -INFINITY, sum = 0.0f;
            const int64_t n = i0 + t + 1;
            for (int64_t j = 0; j < n; j++) {
                x[j] *= scale;
                if (x[j] > mx) mx = x[j];
            }
            for (int64_t j = 0; j < n; j++) x[j] -= mx;
            const lowp_cpu_vmath *vm = lowp_cpu_vmath_pick();
            if (vm)
                vm->expf(x, n);
            else
                for (int64_t j = 0; j < n; j++) x[j] = expf(x[j]);
            for (int64_t j = 0; j < n; j++) sum += x[j];
            const float inv = 1.0f / sum;
            for (int64_t j = 0; j < n; j++) x[j] *= inv;
            for (int64_t j = n; j < L; j++) x[j] = 0.0f;
        }
        moe_softmax_block(s, r, L, i0, scale);
        same &= memcmp(s, ref, sizeof(float) * (size_t) (r * L)) == 0;
        /* dS of each row on its own, from dP = the probabilities just made */
        for (int64_t t = 0; t < r; t++) {
            const float *pr = p + (i0 + t) * T;
            float *rw = ref + t * L, pdp = 0.0f;
            for (int64_t j = 0; j <= i0 + t; j++) pdp += pr[j] * rw[j];
            for (int64_t j = 0; j <= i0 + t; j++) rw[j] = pr[j] * (rw[j] - pdp) * scale;
            for (int64_t j = i0 + t + 1; j < L; j++) rw[j] = 0.0f;
        }
        moe_ds_block(p, T, s, r, L, i0, scale);
        same &= memcmp(s, ref, sizeof(float) * (size_t) (r * L)) == 0;
    }
    CHECKF(same, "attention row passes differ from one row at a time in key order");
    free(s), free(ref), free(p);
}

int main(void) {
    test_errors();
    test_deterministic();
    test_gradient_check(0.1f, 2, 50.0f); /* the load-balancing gradient visible */
    test_gradient_check(0.0f, 2, 10.0f); /* the gates' alone */
    test_gradient_check(0.0f, 3, 10.0f);
    test_checkpoint_equal("bf16");
    test_checkpoint_equal("fp8_delayed");
    test_checkpoint_equal("mix");
    test_checkpoint_equal("nvfp4"); /* the backward's draws are not rewound with dropout's */
    test_loss_falls();
    test_attention_blocks();
    test_attention_rows();
    return testutil_finish();
}
