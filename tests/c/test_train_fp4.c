/* The FP4 presets in the training layer (docs/numerics.md 4b): an nvfp4 linear layer's forward,
 * dX and dW against a float64 model of the same quantizations and GEMMs (each copy made by
 * lowp_quantize / lowp_hadamard16 with the Philox words the spec assigns, dequantized, multiplied
 * in binary64) within section 6's bound; stochastic rounding and the Hadamard signs drawn from
 * the tracker's states, reproducible for a fixed state and different for another; the mxfp4
 * preset and grouped (MoE) layers against the unquantized layer (SQNR); errors without a
 * tracker. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lowp/lowp.h"
#include "ops/ops_internal.h"
#include "testutil.h"

static float *gauss_array(int64_t n, float sigma) {
    float *a = malloc(sizeof(float) * (size_t) (n + 1));
    for (int64_t i = 0; i < n; i++) a[i] = sigma * gauss();
    return a;
}

/* q: a fresh copy of [rows, cols] in `scaling` (E2M1) with its buffers. */
static lowp_qtensor new_q(lowp_scaling scaling, int64_t rows, int64_t cols) {
    lowp_qtensor q = {LOWP_FORMAT_E2M1, scaling, rows, cols, NULL, NULL, LOWP_DEVICE_HOST, NULL, 0};
    size_t db, sb;
    CHECK_OK(lowp_qtensor_nbytes(&q, &db, &sb));
    q.data = malloc(db + 1);
    q.scales = malloc(sb + 1);
    return q;
}

/* The dequantized rowwise copy of x [R, C] (F32) in `scaling`, elements RNE or SR with
 * (seed, offset). */
static float *deq_copy(const float *x, int64_t R, int64_t C, lowp_scaling scaling,
                       lowp_rounding rounding, uint64_t seed, uint64_t offset) {
    lowp_tensor t = {LOWP_FORMAT_F32, R, C, (void *) x, LOWP_DEVICE_HOST};
    lowp_qtensor q = new_q(scaling, R, C);
    lowp_quant_cfg qc;
    lowp_quant_cfg_init(&qc);
    qc.rounding = rounding, qc.seed = seed, qc.offset = offset;
    if (scaling == LOWP_SCALING_MX32) qc.scale_mode = LOWP_SCALE_MODE_RCEIL;
    CHECK_OK(lowp_quantize(&t, &q, NULL, &qc));
    float *out = malloc(sizeof(float) * (size_t) (R * C + 1));
    lowp_tensor o = {LOWP_FORMAT_F32, R, C, out, LOWP_DEVICE_HOST};
    CHECK_OK(lowp_dequantize(&q, &o));
    free(q.data), free(q.scales);
    return out;
}

/* t [C, R] = x [R, C]^T, then (when h) the transform along its rows with (seed, offset). */
static float *transposed(const float *x, int64_t R, int64_t C, int h, uint64_t seed,
                         uint64_t offset) {
    float *t = malloc(sizeof(float) * (size_t) (R * C + 1));
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) t[c * R + r] = x[r * C + c];
    if (!h) return t;
    float *y = malloc(sizeof(float) * (size_t) (R * C + 1));
    lowp_hadamard_cfg hc;
    lowp_hadamard_cfg_init(&hc);
    hc.seed = seed, hc.offset = offset;
    lowp_tensor a = {LOWP_FORMAT_F32, C, R, t, LOWP_DEVICE_HOST};
    lowp_tensor b = {LOWP_FORMAT_F32, C, R, y, LOWP_DEVICE_HOST};
    CHECK_OK(lowp_hadamard16(&a, &b, &hc));
    free(t);
    return y;
}

/* got [M, N] against a . b^T (a [M, K], b [N, K]) + bias in float64, within
 * (ceil(K/16) + 8) . 2^-24 . (|a| . |b|^T + |bias|); returns the worst ratio error / bound. */
static double worst_vs_bound(const float *got, const float *a, const float *b, const float *bias,
                             int64_t M, int64_t N, int64_t K) {
    double worst = 0.0;
    const double u = ldexp((double) ((K + 15) / 16 + 8), -24);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = bias ? bias[n] : 0.0, mag = bias ? fabs(bias[n]) : 0.0;
            for (int64_t k = 0; k < K; k++) {
                s += (double) a[m * K + k] * b[n * K + k];
                mag += fabs((double) a[m * K + k] * b[n * K + k]);
            }
            const double e = fabs(got[m * N + n] - s), bound = u * mag + 1e-30;
            if (!(e <= bound * 1e9)) return INFINITY; /* NaN or wildly off */
            if (e / bound > worst) worst = e / bound;
        }
    return worst;
}

static uint64_t state_offset(const lowp_rng_tracker *t, const char *name) {
    for (int32_t i = 0; i < t->count; i++)
        if (strcmp(t->states[i].name, name) == 0) return t->states[i].offset;
    return ~0ull;
}

static lowp_rng_tracker fp4_tracker(uint64_t seed) {
    lowp_rng_tracker t;
    CHECK_OK(lowp_rng_tracker_init(&t, seed));
    CHECK_OK(lowp_rng_tracker_add(&t, "stochastic_rounding", seed + 1));
    CHECK_OK(lowp_rng_tracker_add(&t, "hadamard", seed + 2));
    return t;
}

typedef struct step_out {
    float *y, *dx, *dw;
} step_out;

/* One forward + backward of w (wrapped) on x, dy with the tracker: y, dx and dW. */
static step_out run_step(lowp_param *w, const float *bias, const float *x, const float *dy,
                         int64_t M, lowp_rng_tracker *t) {
    const int64_t N = w->rows, K = w->cols;
    step_out o = {malloc(sizeof(float) * (size_t) (M * N)),
                  malloc(sizeof(float) * (size_t) (M * K)), w->grad};
    memset(w->grad, 0, sizeof(float) * (size_t) (N * K));
    lowp_linear_opts opts = {0};
    opts.threads = 1;
    opts.rng = t;
    lowp_tensor xt = {LOWP_FORMAT_F32, M, K, (void *) x, LOWP_DEVICE_HOST};
    lowp_tensor yt = {LOWP_FORMAT_F32, M, N, o.y, LOWP_DEVICE_HOST};
    lowp_tensor dyt = {LOWP_FORMAT_F32, M, N, (void *) dy, LOWP_DEVICE_HOST};
    lowp_tensor dxt = {LOWP_FORMAT_F32, M, K, o.dx, LOWP_DEVICE_HOST};
    lowp_linear_saved *s = NULL;
    CHECK_OK(lowp_linear_forward(w, bias, &xt, &yt, &opts, &s));
    CHECK_OK(lowp_linear_backward(w, &xt, &dyt, &dxt, NULL, &opts, s));
    return o;
}

static lowp_param make_param(const char *name, int64_t N, int64_t K, const char *preset) {
    lowp_param p = {.name = name, .rows = N, .cols = K, .device = LOWP_DEVICE_HOST};
    p.data = gauss_array(N * K, 0.05f);
    p.grad = calloc((size_t) (N * K + 1), sizeof(float));
    lowp_recipe r;
    lowp_linear_cfg c;
    CHECK_OK(lowp_recipe_init(&r, "custom"));
    CHECK_OK(lowp_linear_cfg_preset(preset, &c));
    CHECK_OK(lowp_recipe_append(&r, "*", &c));
    CHECK_OK(lowp_train_prepare(&p, 1, &r));
    return p;
}

/* (1) nvfp4 against the float64 model of its own quantizations. */
static void check_nvfp4_model(int64_t M, int64_t N, int64_t K) {
    lowp_param w = make_param("layers.0.mlp.fc", N, K, "nvfp4");
    float *x = gauss_array(M * K, 1.0f), *dy = gauss_array(M * N, 1.0f);
    float *bias = gauss_array(N, 0.1f);
    lowp_rng_tracker t = fp4_tracker(100), before = t;
    step_out o = run_step(&w, bias, x, dy, M, &t);
    /* The draws: one Hadamard word, then dY's two copies (2 M N SR words); X rounds RNE. */
    CHECKF(state_offset(&t, "hadamard") == 1 &&
               state_offset(&t, "stochastic_rounding") == (uint64_t) (2 * M * N),
           "offsets %llu %llu", (unsigned long long) state_offset(&t, "hadamard"),
           (unsigned long long) state_offset(&t, "stochastic_rounding"));
    CHECK(state_offset(&t, "default") == 0);
    const uint64_t ss = before.states[1].seed, hs = before.states[2].seed;
    float *xq = deq_copy(x, M, K, LOWP_SCALING_NV16, LOWP_ROUNDING_RNE, 0, 0);
    float *wq = deq_copy(w.data, N, K, LOWP_SCALING_NV16X16, LOWP_ROUNDING_RNE, 0, 0);
    double e = worst_vs_bound(o.y, xq, wq, bias, M, N, K);
    CHECKF(e <= 1.0, "nvfp4 y: worst error %.3g of the bound", e);
    /* dX = dY_q (SR, words 0 ..) . W_q, the nv16x16 copy read transposed. */
    float *dyq = deq_copy(dy, M, N, LOWP_SCALING_NV16, LOWP_ROUNDING_SR, ss, 0);
    float *wqt = transposed(wq, N, K, 0, 0, 0);
    e = worst_vs_bound(o.dx, dyq, wqt, NULL, M, K, N);
    CHECKF(e <= 1.0, "nvfp4 dx: worst error %.3g of the bound", e);
    /* dW = H(dY^T)_q (SR, words M N ..) . H(X^T)_q^T, both transformed with word 0. */
    float *dyt = transposed(dy, M, N, 1, hs, 0), *xt = transposed(x, M, K, 1, hs, 0);
    float *gq = deq_copy(dyt, N, M, LOWP_SCALING_NV16, LOWP_ROUNDING_SR, ss, (uint64_t) (M * N));
    float *xtq = deq_copy(xt, K, M, LOWP_SCALING_NV16, LOWP_ROUNDING_RNE, 0, 0);
    e = worst_vs_bound(o.dw, gq, xtq, NULL, N, K, M);
    CHECKF(e <= 1.0, "nvfp4 dw: worst error %.3g of the bound", e);
    /* The model is sharp: without the transform (or another SR stream) dW is off the bound. */
    float *g0 =
        deq_copy(dyt, N, M, LOWP_SCALING_NV16, LOWP_ROUNDING_SR, ss + 7, (uint64_t) (M * N));
    e = worst_vs_bound(o.dw, g0, xtq, NULL, N, K, M);
    CHECKF(e > 1.0, "nvfp4 dw matches another SR stream too (%.3g)", e);
    free(g0);

    /* Reproducible: the same tracker state gives the same bits; another state other bits. */
    float *y1 = malloc(sizeof(float) * (size_t) (M * N)),
          *dx1 = malloc(sizeof(float) * (size_t) (M * K));
    float *dw1 = malloc(sizeof(float) * (size_t) (N * K));
    memcpy(y1, o.y, sizeof(float) * (size_t) (M * N));
    memcpy(dx1, o.dx, sizeof(float) * (size_t) (M * K));
    memcpy(dw1, o.dw, sizeof(float) * (size_t) (N * K));
    free(o.y), free(o.dx);
    t = before;
    o = run_step(&w, bias, x, dy, M, &t);
    CHECK(memcmp(y1, o.y, sizeof(float) * (size_t) (M * N)) == 0 &&
          memcmp(dx1, o.dx, sizeof(float) * (size_t) (M * K)) == 0 &&
          memcmp(dw1, o.dw, sizeof(float) * (size_t) (N * K)) == 0);
    free(o.y), free(o.dx);
    o = run_step(&w, bias, x, dy, M, &t);                          /* the next draws */
    CHECK(memcmp(y1, o.y, sizeof(float) * (size_t) (M * N)) == 0); /* forward: RNE only */
    CHECK(memcmp(dx1, o.dx, sizeof(float) * (size_t) (M * K)) != 0 &&
          memcmp(dw1, o.dw, sizeof(float) * (size_t) (N * K)) != 0);
    free(o.y), free(o.dx);
    free(y1), free(dx1), free(dw1);
    free(xq), free(wq), free(dyq), free(wqt), free(dyt), free(xt), free(gq), free(xtq);
    free(x), free(dy), free(bias);
    CHECK_OK(lowp_train_convert(&w, 1));
    free(w.data), free(w.grad);
}

static double sqnr_vs(const double *ref, const float *x, int64_t n) {
    double s = 0, e = 0;
    for (int64_t i = 0; i < n; i++) {
        s += ref[i] * ref[i];
        e += (ref[i] - x[i]) * (ref[i] - x[i]);
    }
    return 10.0 * log10(s / (e > 0 ? e : 1e-300));
}

/* (2) mxfp4 and nvfp4, linear and grouped, against the unquantized float64 layer. */
static void check_sqnr(const char *preset, int32_t G, int64_t N, int64_t K, double floor_db) {
    const int32_t sizes[3] = {37, 0, 90};
    const int64_t M = G ? 37 + 90 + 5 : 128;
    int32_t offs[3] = {37, 37, 127};
    lowp_param w = make_param(G ? "layers.0.moe.experts.w1" : "layers.0.attn.wq", N, K, preset);
    const int64_t ng = G ? G : 1;
    if (G) {
        free(w.data), free(w.grad);
        CHECK_OK(lowp_train_convert(&w, 1));
        w.groups = G;
        w.data = gauss_array(ng * N * K, 0.05f);
        w.grad = calloc((size_t) (ng * N * K), sizeof(float));
        lowp_recipe r;
        lowp_linear_cfg c;
        CHECK_OK(lowp_recipe_init(&r, "custom"));
        CHECK_OK(lowp_linear_cfg_preset(preset, &c));
        CHECK_OK(lowp_recipe_append(&r, "*", &c));
        CHECK_OK(lowp_train_prepare(&w, 1, &r));
    }
    (void) sizes;
    float *x = gauss_array(M * K, 1.0f), *dy = gauss_array(M * N, 1.0f);
    float *y = calloc((size_t) (M * N), sizeof(float)),
          *dx = calloc((size_t) (M * K), sizeof(float));
    lowp_rng_tracker t = fp4_tracker(7);
    lowp_linear_opts opts = {0};
    opts.rng = &t;
    lowp_tensor xt = {LOWP_FORMAT_F32, M, K, x, LOWP_DEVICE_HOST};
    lowp_tensor yt = {LOWP_FORMAT_F32, M, N, y, LOWP_DEVICE_HOST};
    lowp_tensor dyt = {LOWP_FORMAT_F32, M, N, dy, LOWP_DEVICE_HOST};
    lowp_tensor dxt = {LOWP_FORMAT_F32, M, K, dx, LOWP_DEVICE_HOST};
    lowp_linear_saved *s = NULL;
    if (G) {
        CHECK_OK(lowp_grouped_linear_forward(&w, &xt, offs, &yt, &opts, &s));
        CHECK_OK(lowp_grouped_linear_backward(&w, &xt, offs, &dyt, &dxt, &opts, s));
    } else {
        CHECK_OK(lowp_linear_forward(&w, NULL, &xt, &yt, &opts, &s));
        CHECK_OK(lowp_linear_backward(&w, &xt, &dyt, &dxt, NULL, &opts, s));
    }
    double *ry = calloc((size_t) (M * N), sizeof(double)),
           *rdx = calloc((size_t) (M * K), sizeof(double));
    double *rdw = calloc((size_t) (ng * N * K), sizeof(double));
    int64_t start = 0;
    for (int64_t g = 0; g < ng; g++) {
        const int64_t end = G ? offs[g] : M;
        const float *wg = w.data + g * N * K;
        for (int64_t m = start; m < end; m++)
            for (int64_t n = 0; n < N; n++) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++) {
                    acc += (double) x[m * K + k] * wg[n * K + k];
                    rdx[m * K + k] += (double) dy[m * N + n] * wg[n * K + k];
                    rdw[g * N * K + n * K + k] += (double) dy[m * N + n] * x[m * K + k];
                }
                ry[m * N + n] = acc;
            }
        start = end;
    }
    const double so = sqnr_vs(ry, y, M * N), sdx = sqnr_vs(rdx, dx, M * K),
                 sdw = sqnr_vs(rdw, w.grad, ng * N * K);
    printf("  %-6s %-7s SQNR out %6.2f dX %6.2f dW %6.2f dB\n", preset, G ? "grouped" : "linear",
           so, sdx, sdw);
    CHECKF(so >= floor_db && sdx >= floor_db && sdw >= floor_db, "%s %s: %.2f %.2f %.2f < %.0f",
           preset, G ? "grouped" : "linear", so, sdx, sdw, floor_db);
    if (G) { /* rows past the last group stay 0 */
        int zero = 1;
        for (int64_t i = 127 * N; i < M * N; i++) zero &= y[i] == 0.0f;
        CHECK(zero);
    }
    free(ry), free(rdx), free(rdw), free(x), free(dy), free(y), free(dx);
    CHECK_OK(lowp_train_convert(&w, 1));
    free(w.data), free(w.grad);
}

/* (3) Without a tracker, or without its state, the call fails naming what is missing. */
static void check_errors(void) {
    const int64_t M = 32, N = 16, K = 32;
    lowp_param w = make_param("layers.0.fc", N, K, "nvfp4");
    float *x = gauss_array(M * K, 1.0f), *dy = gauss_array(M * N, 1.0f);
    float *y = calloc((size_t) (M * N), sizeof(float)),
          *dx = calloc((size_t) (M * K), sizeof(float));
    lowp_tensor xt = {LOWP_FORMAT_F32, M, K, x, LOWP_DEVICE_HOST};
    lowp_tensor yt = {LOWP_FORMAT_F32, M, N, y, LOWP_DEVICE_HOST};
    lowp_tensor dyt = {LOWP_FORMAT_F32, M, N, dy, LOWP_DEVICE_HOST};
    lowp_tensor dxt = {LOWP_FORMAT_F32, M, K, dx, LOWP_DEVICE_HOST};
    CHECK_OK(lowp_linear_forward(&w, NULL, &xt, &yt, NULL, NULL)); /* RNE forward: no draws */
    CHECK_FAIL(lowp_linear_backward(&w, &xt, &dyt, &dxt, NULL, NULL, NULL), LOWP_ERR_INVALID_ARG,
               "opts.rng is NULL");
    lowp_rng_tracker t;
    CHECK_OK(lowp_rng_tracker_init(&t, 1));
    CHECK_OK(lowp_rng_tracker_add(&t, "stochastic_rounding", 2));
    lowp_linear_opts opts = {0};
    opts.rng = &t;
    CHECK_FAIL(lowp_linear_backward(&w, &xt, &dyt, &dxt, NULL, &opts, NULL), LOWP_ERR_INVALID_ARG,
               "\"hadamard\"");
    free(x), free(dy), free(y), free(dx);
    CHECK_OK(lowp_train_convert(&w, 1));
    free(w.data), free(w.grad);
}

/* lowp_hadamard16_tokens (the layer's transform of dY and X along the tokens, down their
 * columns) against lowp_hadamard16 between two transposes, bit for bit: partial blocks, groups
 * (empty, shorter than a block, tokens past the last), NaN and Inf, 1 and 2 threads. */
static void check_hadamard_tokens(void) {
    static const struct {
        int64_t T, C;
        int32_t G, go[4];
    } cases[] = {{1, 1, 0, {0}},          {16, 3, 0, {0}},         {37, 70, 0, {0}},
                 {300, 129, 0, {0}},      {50, 9, 3, {0, 20, 41}}, {100, 64, 4, {16, 16, 47, 90}},
                 {64, 1100, 2, {48, 64}}, {33, 17, 1, {33}}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int64_t T = cases[k].T, C = cases[k].C, n = T * C;
        float *x = malloc((size_t) n * 4), *xt = malloc((size_t) n * 4),
              *yt = malloc((size_t) n * 4);
        float *got = malloc((size_t) n * 4);
        for (int64_t i = 0; i < n; i++) x[i] = (float) (urand() * 8.0 - 4.0);
        if (n > 40) x[rnd_below((uint32_t) n)] = NAN, x[rnd_below((uint32_t) n)] = -INFINITY;
        for (int64_t t = 0; t < T; t++)
            for (int64_t c = 0; c < C; c++) xt[c * T + t] = x[t * C + c];
        for (int threads = 1; threads <= 2; threads++) {
            const uint64_t seed = 1000 + k, offset = 3 * k + (uint64_t) threads;
            lowp_hadamard_cfg hc;
            CHECK_OK(lowp_hadamard_cfg_init(&hc));
            hc.seed = seed, hc.offset = offset, hc.threads = threads;
            hc.group_offs = cases[k].G ? (int32_t *) cases[k].go : NULL;
            hc.groups = cases[k].G;
            lowp_tensor a = {LOWP_FORMAT_F32, C, T, xt, LOWP_DEVICE_HOST};
            lowp_tensor b = {LOWP_FORMAT_F32, C, T, yt, LOWP_DEVICE_HOST};
            CHECK_OK(lowp_hadamard16(&a, &b, &hc));
            lowp_hadamard16_tokens(x, T, C, hc.group_offs, hc.groups, seed, offset, threads, got);
            int64_t bad = -1;
            for (int64_t i = 0; i < n && bad < 0; i++)
                if (memcmp(&got[i], &yt[(i % C) * T + i / C], 4) != 0) bad = i;
            CHECKF(bad < 0, "hadamard tokens %lldx%lld G %d threads %d: element %lld differs",
                   (long long) T, (long long) C, cases[k].G, threads, (long long) bad);
        }
        free(x), free(xt), free(yt), free(got);
    }
}

int main(void) {
    tu_seed(38);
    check_hadamard_tokens();
    check_nvfp4_model(72, 48, 80);
    check_nvfp4_model(40, 33, 19); /* partial blocks everywhere */
    printf("FP4 presets against the float64 unquantized layer:\n");
    check_sqnr("nvfp4", 0, 64, 96, 13.0);
    check_sqnr("mxfp4", 0, 64, 96, 12.0);
    check_sqnr("nvfp4", 3, 48, 64, 13.0);
    check_sqnr("mxfp4", 3, 48, 64, 12.0);
    check_errors();
    return testutil_finish();
}
