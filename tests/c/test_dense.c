/* Tests of the dense GPT (model.h, cfg.experts = 0; src/model/dense.c): a finite-difference
 * check of every parameter's gradient with F32 GEMMs, the loss falling under every recipe on a
 * repeated sequence, forwards identical across thread counts, the nanogpt preset's shapes,
 * and the arguments the dense model refuses. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "lowp/lowp.h"
#include "cpu/cpu.h"
#include "model/model_internal.h"
#include "testutil.h"
#include "model_testutil.h"

static lowp_moe_config small_cfg(void) {
    lowp_moe_config c;
    lowp_moe_config_preset("nanogpt", 11, &c);
    c.dim = 12;
    c.heads = 3; /* head width 4 */
    c.layers = 2;
    c.seq_len = 7;
    c.shared_hidden = 20;
    return c;
}

/* (1) Central differences in binary64 loss against the analytic gradient: a directional
 * derivative along sign(grad) over up to 48 entries of every parameter, and its two
 * largest-gradient entries one at a time (a gradient on the wrong index fails there). The
 * model is smooth, so one step suffices; the best of two guards against rounding. */
static void test_gradient_check(void) {
    lowp_moe_config c = small_cfg();
    lowp_moe *m;
    CHECK_OK(lowp_moe_create(&c, 3, &m));
    lowp_param *ps;
    int32_t np;
    CHECK_OK(lowp_moe_params(m, &ps, &np));
    CHECK(np == 3 + 2 * DENSE_LAYER_PARAMS);
    /* Larger weights than the initialization, so every path carries a clear signal (the tiny
     * initial residual branches would hide a wrong gradient in the noise); norms off one. */
    for (int32_t i = 0; i < np; i++)
        for (int64_t j = 0; j < numel(&ps[i]); j++) {
            const float f = 1.0f + 0.37f * sinf(0.7f * (float) (j + 3 * i));
            ps[i].data[j] = ps[i].rows == 1 ? f : ps[i].data[j] * 10.0f * f;
        }
    enum { B = 2, T = 7 };
    int32_t tok[B * T], tgt[B * T];
    fill_ids(tok, B * T, c.vocab, 5);
    fill_ids(tgt, B * T, c.vocab, 6);
    tok[3] = tok[9] = tok[12]; /* a repeated token: its embedding gradients add up */
    lowp_moe_run train = {0};
    train.training = 1;
    train.threads = 1;
    train.fp32_plain = 1;
    lowp_moe_run eval = train;
    eval.training = 0;
    zero_grads(ps, np);
    loss64(m, tok, tgt, B, T, &train);
    CHECK_OK(lowp_moe_backward(m));
    static const float steps[2] = {1e-3f, 3e-4f};
    double worst_dir = 0, worst_one = 0;
    for (int32_t i = 0; i < np; i++) {
        lowp_param *p = &ps[i];
        const int64_t n = numel(p);
        int64_t at[48];
        int ns = 0;
        for (int64_t j = 0; j < 48 && j < n; j++) at[ns++] = n <= 48 ? j : (j * n) / 48 + (i % 5);
        double analytic = 0;
        for (int k = 0; k < ns; k++) analytic += fabs((double) p->grad[at[k]]);
        double rel = INFINITY;
        for (int si = 0; si < 2; si++) {
            double l[2];
            for (int side = 0; side < 2; side++) {
                float saved[48];
                const float h = side == 0 ? steps[si] : -steps[si];
                for (int k = 0; k < ns; k++) saved[k] = p->data[at[k]];
                for (int k = 0; k < ns; k++) p->data[at[k]] += p->grad[at[k]] >= 0 ? h : -h;
                l[side] = loss64(m, tok, tgt, B, T, &eval);
                for (int k = ns - 1; k >= 0; k--) p->data[at[k]] = saved[k];
            }
            const double num = (l[0] - l[1]) / (2.0 * steps[si]);
            rel = fmin(rel, fabs(num - analytic) / fmax(analytic, 1e-3));
        }
        worst_dir = fmax(worst_dir, rel);
        CHECKF(rel < 1e-2, "%s: directional derivative %.6g, rel. error %.3g", p->name, analytic,
               rel);
        float gmax = 0;
        for (int64_t j = 0; j < n; j++) gmax = fmaxf(gmax, fabsf(p->grad[j]));
        int64_t best[2] = {-1, -1};
        for (int r = 0; r < 2; r++)
            for (int64_t j = 0; j < n; j++)
                if (j != best[0] && (best[r] < 0 || fabsf(p->grad[j]) > fabsf(p->grad[best[r]])))
                    best[r] = j;
        for (int r = 0; r < 2 && r < n; r++) {
            double err = INFINITY;
            for (int si = 0; si < 2; si++) {
                double l[2];
                const float keep = p->data[best[r]];
                for (int side = 0; side < 2; side++) {
                    p->data[best[r]] = keep + (side == 0 ? steps[si] : -steps[si]);
                    l[side] = loss64(m, tok, tgt, B, T, &eval);
                }
                p->data[best[r]] = keep;
                const double num = (l[0] - l[1]) / (2.0 * steps[si]);
                err =
                    fmin(err, fabs(num - (double) p->grad[best[r]]) / fmax((double) gmax, 2.5e-4));
            }
            worst_one = fmax(worst_one, err);
            CHECKF(err < 2e-2, "%s[%lld]: grad %.6g, err %.3g of max |grad|", p->name,
                   (long long) best[r], (double) p->grad[best[r]], err);
        }
    }
    printf("dense gradient check: worst directional rel. error %.2e, worst entry error %.2e\n",
           worst_dir, worst_one);
    lowp_moe_free(m);
}

/* (2) Every recipe trains the dense model: plain SGD on one repeated batch lowers the loss,
 * with no NaN; the expected parameters are wrapped. */
static void test_recipes_train(void) {
    const char *names = lowp_recipe_names();
    char buf[256];
    snprintf(buf, sizeof buf, "%s", names);
    for (char *r = strtok(buf, ","); r; r = strtok(NULL, ",")) {
        lowp_moe_config c;
        CHECK_OK(lowp_moe_config_preset("nanogpt", 16, &c));
        c.dim = 64;
        c.layers = 2;
        c.seq_len = 32;
        c.shared_hidden = 256;
        lowp_moe *m;
        CHECK_OK(lowp_moe_create(&c, 11, &m));
        lowp_param *ps;
        int32_t np;
        CHECK_OK(lowp_moe_params(m, &ps, &np));
        lowp_recipe rec;
        CHECK_OK(lowp_recipe_init(&rec, r));
        CHECK_OK(lowp_train_prepare(ps, np, &rec));
        int wrapped = 0;
        for (int32_t i = 0; i < np; i++) wrapped += ps[i].wrap != NULL;
        /* wqkv, wo, fc, proj; embed and the norms stay plain, and the FP4 recipes keep the last
         * block (layers.1) in high precision */
        const int fp4 = strcmp(r, "nvfp4") == 0 || strcmp(r, "mxfp4") == 0;
        const int expect = 4 * (c.layers - fp4);
        CHECKF(wrapped == expect, "%s: %d parameters wrapped, expected %d", r, wrapped, expect);
        enum { B = 4, T = 32 };
        int32_t tok[B * T], tgt[B * T];
        fill_ids(tok, B * T, 16, 9);
        for (int i = 0; i < B * T; i++) tgt[i] = (tok[i] + 1) % 16; /* learnable: next id */
        lowp_moe_run run = {0};
        run.training = 1;
        run.threads = 1;
        lowp_rng_tracker tr; /* the FP4 recipes' SR and Hadamard signs */
        CHECK_OK(lowp_rng_tracker_init(&tr, 5));
        CHECK_OK(lowp_rng_tracker_add(&tr, "stochastic_rounding", 6));
        CHECK_OK(lowp_rng_tracker_add(&tr, "hadamard", 7));
        if (fp4) run.rng = &tr;
        float first = NAN, last = NAN;
        for (int step = 0; step < 40; step++) {
            zero_grads(ps, np);
            CHECK_OK(lowp_moe_forward(m, tok, tgt, B, T, &run, &last));
            CHECK_OK(lowp_moe_backward(m));
            if (step == 0) first = last;
            for (int32_t i = 0; i < np; i++)
                for (int64_t j = 0; j < numel(&ps[i]); j++) ps[i].data[j] -= 0.5f * ps[i].grad[j];
            CHECK_OK(lowp_train_step_end(ps, np, NULL));
        }
        CHECKF(isfinite(last) && last < 0.6f * first, "%s: loss %.4f -> %.4f", r, (double) first,
               (double) last);
        CHECK_OK(lowp_train_convert(ps, np));
        lowp_moe_free(m);
    }
}

/* (3) The forward is the same for 1 and 2 threads, bit for bit; the preset's shapes. */
static void test_threads_and_preset(void) {
    lowp_moe_config c;
    CHECK_OK(lowp_moe_config_preset("nanogpt", 65, &c));
    CHECK(c.experts == 0 && c.dim == 128 && c.layers == 4 && c.heads == 4 && c.seq_len == 64 &&
          c.shared_hidden == 512);
    lowp_moe *m;
    CHECK_OK(lowp_moe_create(&c, 1, &m));
    int64_t active, total;
    CHECK_OK(lowp_moe_active_params(m, &active, &total));
    /* nanoGPT: 0.80M without the positions; 65 x 128 + 64 x 128 + 4 x 12 x 128^2 + 9 x 128 */
    CHECK(total == 65 * 128 + 64 * 128 + 4 * (12 * 128 * 128 + 2 * 128) + 128 && active == total);
    enum { B = 3, T = 64 };
    int32_t tok[B * T], tgt[B * T];
    fill_ids(tok, B * T, 65, 1);
    fill_ids(tgt, B * T, 65, 2);
    float loss[2];
    static float logits[2][B * T * 65];
    for (int k = 0; k < 2; k++) {
        lowp_moe_run run = {0};
        run.threads = k + 1;
        CHECK_OK(lowp_moe_forward(m, tok, tgt, B, T, &run, &loss[k]));
        const float *lg;
        CHECK_OK(lowp_moe_logits(m, &lg));
        memcpy(logits[k], lg, sizeof logits[k]);
    }
    CHECK(memcmp(&loss[0], &loss[1], sizeof(float)) == 0);
    CHECK(memcmp(logits[0], logits[1], sizeof logits[0]) == 0);
    CHECKF(fabsf(loss[0] - logf(65.0f)) < 0.1f, "initial loss %.4f, log V %.4f", (double) loss[0],
           (double) logf(65.0f));
    float ce = 0, aux = 1;
    CHECK_OK(lowp_moe_loss_terms(m, &ce, &aux));
    CHECK(ce == loss[0] && aux == 0.0f);
    /* No activation checkpointing. */
    lowp_moe_run ck = {0};
    ck.training = 1;
    ck.activation_checkpoint = 1;
    CHECK(lowp_moe_forward(m, tok, tgt, B, T, &ck, NULL) == LOWP_ERR_UNSUPPORTED);
    CHECK(strstr(lowp_last_error(), "activation_checkpoint") != NULL);
    CHECK(lowp_moe_backward(m) == LOWP_ERR_INVALID_ARG);
    lowp_moe_free(m);

    /* Refused configurations name the field. */
    static const char *const fields[] = {"top_k", "dropout", "heads"};
    for (int f = 0; f < 3; f++) {
        lowp_moe_config b;
        lowp_moe_config_preset("nanogpt", 65, &b);
        if (f == 0) b.top_k = 2;
        if (f == 1) b.dropout = 0.1f;
        if (f == 2) b.heads = 3;
        lowp_moe *bad = NULL;
        CHECK(lowp_moe_create(&b, 1, &bad) == LOWP_ERR_INVALID_ARG && bad == NULL);
        CHECKF(strstr(lowp_last_error(), fields[f]) != NULL, "%s", lowp_last_error());
    }
}

/* The lowp_model handle (model.h) over both models: before any forward, logits and backward
 * are refused; lowp_model_* and the lowp_moe_* names of 0.2 give the same bits (parameters,
 * loss, logits, gradients); the counts match the parameter shapes; a bad T is refused naming
 * the function that was called. */
static void interface_on(const char *preset) {
    lowp_moe_config c;
    CHECK_OK(lowp_moe_config_preset(preset, 65, &c));
    c.layers = 1;
    c.seq_len = 16;
    lowp_model *a = NULL;
    lowp_moe *b = NULL;
    CHECK_OK(lowp_model_create(&c, 7, &a));
    CHECK_OK(lowp_moe_create(&c, 7, &b));
    const float *la = NULL, *lb = NULL;
    CHECK(lowp_model_logits(a, &la) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "lowp_model_logits: no forward") != NULL);
    CHECK(lowp_model_loss_terms(a, NULL, NULL) == LOWP_ERR_INVALID_ARG);
    CHECK(lowp_model_backward(a) == LOWP_ERR_INVALID_ARG);
    lowp_param *pa, *pb;
    int32_t na, nb;
    CHECK_OK(lowp_model_params(a, &pa, &na));
    CHECK_OK(lowp_moe_params(b, &pb, &nb));
    CHECK(na == nb && na == 3 + (c.experts ? MOE_LAYER_PARAMS : DENSE_LAYER_PARAMS));
    int64_t all = 0;
    for (int32_t i = 0; i < na; i++) {
        CHECK(strcmp(pa[i].name, pb[i].name) == 0 && numel(&pa[i]) == numel(&pb[i]));
        CHECK(memcmp(pa[i].data, pb[i].data, (size_t) numel(&pa[i]) * 4) == 0);
        all += numel(&pa[i]);
    }
    enum { B = 2, T = 16 };
    int32_t tok[B * T], tgt[B * T];
    fill_ids(tok, B * T, 65, 3);
    fill_ids(tgt, B * T, 65, 4);
    lowp_model_run run = {0};
    run.training = 1;
    run.threads = 1;
    float loss_a = NAN, loss_b = NAN, ce = NAN, aux = NAN;
    CHECK_OK(lowp_model_forward(a, tok, tgt, B, T, &run, &loss_a));
    CHECK_OK(lowp_moe_forward(b, tok, tgt, B, T, &run, &loss_b));
    CHECK(memcmp(&loss_a, &loss_b, sizeof loss_a) == 0 && isfinite(loss_a));
    CHECK_OK(lowp_model_loss_terms(a, &ce, &aux));
    CHECK(c.experts ? aux > 0.0f : (aux == 0.0f && ce == loss_a));
    CHECK_OK(lowp_model_logits(a, &la));
    CHECK_OK(lowp_moe_logits(b, &lb));
    CHECK(memcmp(la, lb, (size_t) B * T * 65 * 4) == 0);
    CHECK_OK(lowp_model_backward(a));
    CHECK_OK(lowp_moe_backward(b));
    for (int32_t i = 0; i < na; i++)
        CHECK(memcmp(pa[i].grad, pb[i].grad, (size_t) numel(&pa[i]) * 4) == 0);
    int64_t active, total;
    CHECK_OK(lowp_model_active_params(a, &active, &total));
    CHECK(total == all);
    CHECK(active == all - (int64_t) (c.experts - c.top_k) * 3 * c.expert_hidden * c.dim);
    CHECK(lowp_model_forward(a, tok, tgt, 1, c.seq_len + 1, &run, NULL) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "lowp_model_forward: T (17)") != NULL);
    CHECK(lowp_moe_forward(b, tok, tgt, 1, c.seq_len + 1, &run, NULL) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "lowp_moe_forward: T (17)") != NULL);
    CHECK(lowp_model_forward(NULL, tok, tgt, B, T, &run, NULL) == LOWP_ERR_INVALID_ARG);
    lowp_model_free(a);
    lowp_moe_free(b);
    lowp_model_free(NULL);
}

static void test_interface(void) {
    interface_on("tiny");    /* the MoE */
    interface_on("nanogpt"); /* the dense GPT */
}

#if LOWP_HAVE_LIBMVEC
/* The vector GELU (libmvec's erff and expf) against binary64: g and gd over a sweep of
 * magnitudes (and zero, the tails where Phi saturates, a length that ends mid-vector), within a
 * few units of the formula's binary32 rounding; the same value wherever an element sits. The
 * scalar libm path meets the same bound (checked here too). Each vector set the CPU has
 * (libmvec's AVX-512 and AVX2 variants). */
static void vector_gelu(const lowp_cpu_vmath *vm) {
    enum { N = 20003 };
    static float u[N], g[N], gd[N], g2[N];
    for (int i = 0; i < N; i++) {
        const double t = (double) i / (N - 1); /* -12 .. 12, denser near 0 */
        const double v = 12.0 * (2 * t - 1) * fabs(2 * t - 1);
        u[i] = (float) v;
    }
    u[0] = 0.0f;
    u[1] = -0.0f;
    u[2] = 1e-30f;
    u[3] = -20.0f;
    u[4] = 20.0f;
    vm->gelu(u, g, gd, N);
    double worst_g = 0, worst_d = 0, worst_sg = 0, worst_sd = 0;
    for (int i = 0; i < N; i++) {
        const double x = u[i], cdf = 0.5 * (1.0 + erf(x * 0.70710678118654752440));
        const double wg = x * cdf, wd = cdf + x * 0.39894228040143267794 * exp(-0.5 * x * x);
        /* cdf = 0.5 (1 + erf) carries an absolute error of a few 2^-25 (1 + erf cancels for
         * negative x, in any binary32 evaluation of the formula, scalar or vector) */
        const double eg = testutil_err_units(g[i], wg, fabs(x) * 0x1p-24);
        const double ed = testutil_err_units(gd[i], wd, 0x1p-24);
        if (eg > worst_g) worst_g = eg;
        if (ed > worst_d) worst_d = ed;
        const float sc = 0.5f * (1.0f + erff(u[i] * 0.70710678118654752f)); /* dense.c's */
        const float sg = u[i] * sc;
        const float sd = sc + u[i] * (0.39894228040143268f * expf(-0.5f * u[i] * u[i]));
        const double es = testutil_err_units(sg, wg, fabs(x) * 0x1p-24);
        const double esd = testutil_err_units(sd, wd, 0x1p-24);
        if (es > worst_sg) worst_sg = es;
        if (esd > worst_sd) worst_sd = esd;
    }
    printf("scalar GELU (libm): worst error g %.2f, gelu' %.2f units\n", worst_sg, worst_sd);
    CHECKF(worst_sg <= 4.0 && worst_sd <= 4.0, "the bound is not the formula's: scalar %.2f %.2f",
           worst_sg, worst_sd);
    printf("vector GELU (%s): worst error g %.2f, gelu' %.2f units over %d values\n", vm->name,
           worst_g, worst_d, N);
    CHECKF(worst_g <= 4.0, "g: %.2f units", worst_g);
    CHECKF(worst_d <= 4.0, "gelu': %.2f units", worst_d);
    /* position: the same inputs shifted by 5 elements, without gd */
    static float us[N + 5];
    memcpy(us + 5, u, sizeof u);
    for (int i = 0; i < 5; i++) us[i] = 1.0f;
    static float gs[N + 5];
    vm->gelu(us, gs, NULL, N + 5);
    vm->gelu(u, g2, NULL, 7); /* a short call: one partial vector */
    CHECK(memcmp(gs + 5, g, sizeof g) == 0);
    CHECK(memcmp(g2, g, 7 * sizeof *g) == 0);
}

static void test_vector_gelu(void) {
    for (int v = 0; v < 2; v++) {
        const lowp_cpu_vmath *vm = lowp_cpu_vmath_of(v);
        if (vm)
            vector_gelu(vm);
        else
            printf("vector GELU: no %s here, skipped\n", v ? "AVX2" : "AVX-512");
    }
}
#else
static void test_vector_gelu(void) {
    printf("vector GELU: built without libmvec, skipped\n");
}
#endif

int main(void) {
    test_vector_gelu();
    test_gradient_check();
    test_threads_and_preset();
    test_recipes_train();
    test_interface();
    return testutil_finish();
}
