/* Tests of autocast and RMSNorm (train.h, src/train/autocast.c):
 *  - the policy: init (all off), set per device type, the dtype query, argument errors;
 *  - RMSNorm forward with autocast off (NULL, or on only for another device type): binary32
 *    results equal to a sequential-sum reference bit for bit, close to a binary64 one, and not
 *    all BF16-representable;
 *  - with BF16 (and F16) autocast on for the CPU device type: every output is representable in
 *    the dtype and equals the reference computed from the rounded input and weight, rounded
 *    once; rstd is the binary32 statistic of the rounded input;
 *  - y aliasing x; the backward against central finite differences in binary64, dweight
 *    accumulation, dx aliasing dy; shape, format, device and eps errors (a tensor on another
 *    device type is LOWP_ERR_UNSUPPORTED). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lowp/lowp.h"
#include "testutil.h"

enum { M = 7, D = 96 };

/* The format's round trip, from the library's scalar reference (what a cast does). */
static float round_fmt(lowp_format f, float v) {
    uint32_t c = 0;
    float out = 0.0f;
    lowp_encode(f, v, LOWP_OVERFLOW_NONSAT, &c);
    lowp_decode(f, c, &out);
    return out;
}
static int representable(lowp_format f, float v) {
    return f2u(round_fmt(f, v)) == f2u(v);
}

static void fill(float *x, float *w) {
    uint32_t s = 12345;
    for (int i = 0; i < M * D; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = ((float) (s >> 8) / 16777216.0f - 0.5f) * 6.0f; /* not BF16-representable */
    }
    for (int d = 0; d < D; d++) w[d] = 0.75f + 0.01f * (float) d + 1.0f / 3.0f;
}

/* The forward as the library defines it: rounding through `f` (F32: none), sums in binary32,
 * sequential along the row; rows x cols. */
static void reference_rc(lowp_format f, const float *x, const float *w, float eps, float *y,
                         float *rstd, int rows, int cols) {
    for (int m = 0; m < rows; m++) {
        float ss = 0.0f;
        for (int d = 0; d < cols; d++) {
            float v = f == LOWP_FORMAT_F32 ? x[m * cols + d] : round_fmt(f, x[m * cols + d]);
            ss += v * v;
        }
        float r = 1.0f / sqrtf(ss / (float) cols + eps);
        rstd[m] = r;
        for (int d = 0; d < cols; d++) {
            float xv = f == LOWP_FORMAT_F32 ? x[m * cols + d] : round_fmt(f, x[m * cols + d]);
            float wv = f == LOWP_FORMAT_F32 ? w[d] : round_fmt(f, w[d]);
            float v = xv * r * wv;
            y[m * cols + d] = f == LOWP_FORMAT_F32 ? v : round_fmt(f, v);
        }
    }
}

static void reference(lowp_format f, const float *x, const float *w, float eps, float *y,
                      float *rstd) {
    reference_rc(f, x, w, eps, y, rstd, M, D);
}

/* The backward as the library defines it (train.h): per row, dot = sum of (dy * w) * x in
 * binary32 along the row, c = r^3 * (dot / D), dweight[d] += (dy * x) * r over the rows in
 * order, dx = r * (dy * w) - x * c. */
static void reference_bwd(const float *x, const float *w, const float *rstd, const float *g,
                          float *dx, float *dw, int rows, int cols) {
    for (int m = 0; m < rows; m++) {
        const float r = rstd[m];
        float dot = 0.0f;
        for (int d = 0; d < cols; d++) dot += g[m * cols + d] * w[d] * x[m * cols + d];
        const float c = r * r * r * (dot / (float) cols);
        for (int d = 0; d < cols; d++) dw[d] += g[m * cols + d] * x[m * cols + d] * r;
        for (int d = 0; d < cols; d++)
            dx[m * cols + d] = r * (g[m * cols + d] * w[d]) - x[m * cols + d] * c;
    }
}

static void test_policy(void) {
    lowp_autocast ac;
    CHECK_OK(lowp_autocast_init(&ac));
    lowp_format f = LOWP_FORMAT_E4M3;
    CHECK_OK(lowp_autocast_dtype(&ac, LOWP_DEVICE_HOST, &f));
    CHECK(f == LOWP_FORMAT_F32);
    int all_off = 1;
    for (int t = 0; t < LOWP_DEVICE_MAX_TYPES; t++) all_off &= ac.type[t].enabled == 0;
    CHECK(all_off);

    CHECK_OK(lowp_autocast_set(&ac, LOWP_DEVICE_CPU, 1, LOWP_FORMAT_BF16));
    CHECK_OK(lowp_autocast_dtype(&ac, LOWP_DEVICE_HOST, &f));
    CHECK(f == LOWP_FORMAT_BF16);
    CHECK_OK(lowp_autocast_dtype(&ac, (lowp_device){LOWP_DEVICE_CUDA, 0}, &f));
    CHECK(f == LOWP_FORMAT_F32);                                            /* per device type */
    CHECK_OK(lowp_autocast_set(&ac, LOWP_DEVICE_CUDA, 5, LOWP_FORMAT_F16)); /* any non-zero */
    CHECK_OK(lowp_autocast_dtype(&ac, (lowp_device){LOWP_DEVICE_CUDA, 3}, &f));
    CHECK(f == LOWP_FORMAT_F16 && ac.type[LOWP_DEVICE_CUDA].enabled == 1);
    CHECK_OK(lowp_autocast_set(&ac, LOWP_DEVICE_CPU, 0, LOWP_FORMAT_BF16));
    CHECK_OK(lowp_autocast_dtype(&ac, LOWP_DEVICE_HOST, &f));
    CHECK(f == LOWP_FORMAT_F32);

    CHECK_FAIL(lowp_autocast_set(&ac, -1, 1, LOWP_FORMAT_BF16), LOWP_ERR_INVALID_ARG,
               "device_type (-1) is not in [0, 32)");
    CHECK_FAIL(lowp_autocast_set(&ac, LOWP_DEVICE_MAX_TYPES, 1, LOWP_FORMAT_BF16),
               LOWP_ERR_INVALID_ARG, "device_type (32)");
    CHECK_FAIL(lowp_autocast_set(&ac, 0, 1, LOWP_FORMAT_E4M3), LOWP_ERR_INVALID_ARG,
               "dtype (3) is not bf16");
    CHECK_FAIL(lowp_autocast_set(&ac, 0, 1, LOWP_FORMAT_F32), LOWP_ERR_INVALID_ARG, "dtype (0)");
    CHECK_FAIL(lowp_autocast_set(NULL, 0, 1, LOWP_FORMAT_BF16), LOWP_ERR_INVALID_ARG, "ac is NULL");
    CHECK_FAIL(lowp_autocast_init(NULL), LOWP_ERR_INVALID_ARG, "ac is NULL");
    CHECK_FAIL(lowp_autocast_dtype(&ac, (lowp_device){40, 0}, &f), LOWP_ERR_INVALID_ARG,
               "dev.type (40)");
    CHECK_FAIL(lowp_autocast_dtype(&ac, LOWP_DEVICE_HOST, NULL), LOWP_ERR_INVALID_ARG,
               "dtype is NULL");
    CHECK_FAIL(lowp_autocast_dtype(NULL, LOWP_DEVICE_HOST, &f), LOWP_ERR_INVALID_ARG, "ac is NULL");
}

/* lowp_rmsnorm_forward's refusals, on the inputs of test_forward. */
static void check_forward_errors(float *x, const float *w, float *y) {
    const float eps = 1e-6f;
    lowp_tensor tx = {LOWP_FORMAT_F32, M, D, x, LOWP_DEVICE_HOST};
    lowp_tensor ty = {LOWP_FORMAT_F32, M, D, y, LOWP_DEVICE_HOST};
    lowp_tensor bad = tx;
    bad.format = LOWP_FORMAT_BF16;
    CHECK_FAIL(lowp_rmsnorm_forward(&bad, w, eps, &ty, NULL, NULL), LOWP_ERR_INVALID_ARG,
               "x.format (1) is not f32");
    bad = ty;
    bad.cols = D - 1;
    CHECK_FAIL(lowp_rmsnorm_forward(&tx, w, eps, &bad, NULL, NULL), LOWP_ERR_INVALID_ARG,
               "y shape (7 x 95) != x shape (7 x 96)");
    bad = tx;
    bad.device = (lowp_device){LOWP_DEVICE_CUDA, 0};
    CHECK_FAIL(lowp_rmsnorm_forward(&bad, w, eps, &ty, NULL, NULL), LOWP_ERR_UNSUPPORTED,
               "x.device.type (1) is not the CPU");
    bad = ty;
    bad.device = (lowp_device){LOWP_DEVICE_CPU, 1};
    CHECK_FAIL(lowp_rmsnorm_forward(&tx, w, eps, &bad, NULL, NULL), LOWP_ERR_INVALID_ARG,
               "y.device.index (1)");
    CHECK_FAIL(lowp_rmsnorm_forward(&tx, w, -1.0f, &ty, NULL, NULL), LOWP_ERR_INVALID_ARG,
               "eps (-1)");
    CHECK_FAIL(lowp_rmsnorm_forward(&tx, w, NAN, &ty, NULL, NULL), LOWP_ERR_INVALID_ARG,
               "eps (nan)");
    CHECK_FAIL(lowp_rmsnorm_forward(&tx, NULL, eps, &ty, NULL, NULL), LOWP_ERR_INVALID_ARG,
               "weight is NULL");
    CHECK_FAIL(lowp_rmsnorm_forward(NULL, w, eps, &ty, NULL, NULL), LOWP_ERR_INVALID_ARG,
               "x is NULL");
    bad = tx;
    bad.data = NULL;
    CHECK_FAIL(lowp_rmsnorm_forward(&bad, w, eps, &ty, NULL, NULL), LOWP_ERR_INVALID_ARG,
               "x.data is NULL");
    lowp_tensor empty_cols = {LOWP_FORMAT_F32, 2, 0, x, LOWP_DEVICE_HOST};
    CHECK_FAIL(lowp_rmsnorm_forward(&empty_cols, w, eps, &empty_cols, NULL, NULL),
               LOWP_ERR_INVALID_ARG, "x.cols is 0");
    lowp_tensor no_rows = {LOWP_FORMAT_F32, 0, D, NULL, LOWP_DEVICE_HOST};
    CHECK_OK(lowp_rmsnorm_forward(&no_rows, NULL, eps, &no_rows, NULL, NULL));
}

static void test_forward(void) {
    static float x[M * D], w[D], y[M * D], ref[M * D], y_off[M * D];
    float rstd[M], rref[M];
    fill(x, w);
    const float eps = 1e-6f;
    lowp_tensor tx = {LOWP_FORMAT_F32, M, D, x, LOWP_DEVICE_HOST};
    lowp_tensor ty = {LOWP_FORMAT_F32, M, D, y, LOWP_DEVICE_HOST};

    /* Off (NULL): binary32, equal to the reference, close to binary64. */
    CHECK_OK(lowp_rmsnorm_forward(&tx, w, eps, &ty, rstd, NULL));
    reference(LOWP_FORMAT_F32, x, w, eps, ref, rref);
    CHECK(memcmp(y, ref, sizeof y) == 0 && memcmp(rstd, rref, sizeof rstd) == 0);
    double worst = 0.0;
    for (int m = 0; m < M; m++) {
        double ss = 0.0;
        for (int d = 0; d < D; d++) ss += (double) x[m * D + d] * x[m * D + d];
        double r = 1.0 / sqrt(ss / D + eps);
        for (int d = 0; d < D; d++) {
            double e = fabs(y[m * D + d] - x[m * D + d] * r * w[d]) /
                       (fabs(x[m * D + d] * r * w[d]) + 1e-6);
            if (e > worst) worst = e;
        }
    }
    CHECKF(worst < 1e-5, "binary32 RMSNorm relative error %g", worst);
    int not_bf16 = 0;
    for (int i = 0; i < M * D; i++) not_bf16 += !representable(LOWP_FORMAT_BF16, y[i]);
    CHECK(not_bf16 > M * D / 2);
    memcpy(y_off, y, sizeof y);

    /* BF16 autocast on for the CPU device type: every output is BF16, and is the reference. */
    lowp_autocast ac;
    CHECK_OK(lowp_autocast_init(&ac));
    CHECK_OK(lowp_autocast_set(&ac, LOWP_DEVICE_CPU, 1, LOWP_FORMAT_BF16));
    CHECK_OK(lowp_rmsnorm_forward(&tx, w, eps, &ty, rstd, &ac));
    reference(LOWP_FORMAT_BF16, x, w, eps, ref, rref);
    int all_bf16 = 1;
    for (int i = 0; i < M * D; i++) all_bf16 &= representable(LOWP_FORMAT_BF16, y[i]);
    CHECK(all_bf16);
    CHECK(memcmp(y, ref, sizeof y) == 0 && memcmp(rstd, rref, sizeof rstd) == 0);
    CHECK(memcmp(y, y_off, sizeof y) != 0);
    int close = 1; /* within BF16's half-ulp-ish distance of the binary32 result */
    for (int i = 0; i < M * D; i++)
        close &= fabsf(y[i] - y_off[i]) <= 0.02f * fabsf(y_off[i]) + 1e-3f;
    CHECK(close);

    /* Autocast on only for another device type (CUDA, and a plugin type): CPU stays binary32. */
    lowp_autocast other;
    CHECK_OK(lowp_autocast_init(&other));
    CHECK_OK(lowp_autocast_set(&other, LOWP_DEVICE_CUDA, 1, LOWP_FORMAT_BF16));
    CHECK_OK(lowp_autocast_set(&other, LOWP_DEVICE_PLUGIN_FIRST, 1, LOWP_FORMAT_F16));
    CHECK_OK(lowp_rmsnorm_forward(&tx, w, eps, &ty, rstd, &other));
    CHECK(memcmp(y, y_off, sizeof y) == 0);
    /* Off again on the CPU after having been on. */
    CHECK_OK(lowp_autocast_set(&ac, LOWP_DEVICE_CPU, 0, LOWP_FORMAT_BF16));
    CHECK_OK(lowp_rmsnorm_forward(&tx, w, eps, &ty, NULL, &ac));
    CHECK(memcmp(y, y_off, sizeof y) == 0);

    /* F16 autocast. */
    CHECK_OK(lowp_autocast_set(&ac, LOWP_DEVICE_CPU, 1, LOWP_FORMAT_F16));
    CHECK_OK(lowp_rmsnorm_forward(&tx, w, eps, &ty, rstd, &ac));
    reference(LOWP_FORMAT_F16, x, w, eps, ref, rref);
    int all_f16 = 1;
    for (int i = 0; i < M * D; i++) all_f16 &= representable(LOWP_FORMAT_F16, y[i]);
    CHECK(all_f16 && memcmp(y, ref, sizeof y) == 0);

    /* y aliasing x. */
    static float inplace[M * D];
    memcpy(inplace, x, sizeof x);
    lowp_tensor tin = {LOWP_FORMAT_F32, M, D, inplace, LOWP_DEVICE_HOST};
    CHECK_OK(lowp_rmsnorm_forward(&tin, w, eps, &tin, NULL, &ac));
    CHECK(memcmp(inplace, y, sizeof y) == 0);

    /* A zero row with eps = 0: 0 * Inf, NaN (as the formula gives); with eps > 0: zeros. */
    float zrow[D] = {0}, zy[D];
    lowp_tensor tz = {LOWP_FORMAT_F32, 1, D, zrow, LOWP_DEVICE_HOST};
    lowp_tensor tzy = {LOWP_FORMAT_F32, 1, D, zy, LOWP_DEVICE_HOST};
    CHECK_OK(lowp_rmsnorm_forward(&tz, w, 1e-5f, &tzy, NULL, NULL));
    CHECK(zy[0] == 0.0f && zy[D - 1] == 0.0f);

    check_forward_errors(x, w, y);
}

/* Loss = sum(y * g) for a fixed g; the backward's dx and dweight against binary64 central
 * differences of the binary64 forward. */
static double loss64(const float *x, const float *w, const float *g, int m, int d_x, double hx,
                     int d_w, double hw) {
    double ss = 0.0, out = 0.0;
    for (int d = 0; d < D; d++) {
        double v = x[m * D + d] + (d == d_x ? hx : 0.0);
        ss += v * v;
    }
    double r = 1.0 / sqrt(ss / D + 1e-6);
    for (int d = 0; d < D; d++) {
        double v = x[m * D + d] + (d == d_x ? hx : 0.0);
        double wv = w[d] + (d == d_w ? hw : 0.0);
        out += v * r * wv * g[m * D + d];
    }
    return out;
}

static void test_backward(void) {
    static float x[M * D], w[D], y[M * D], g[M * D], dx[M * D], dw[D], dw2[D];
    float rstd[M];
    fill(x, w);
    for (int i = 0; i < M * D; i++) g[i] = (float) ((i * 37) % 19 - 9) / 7.0f;
    lowp_tensor tx = {LOWP_FORMAT_F32, M, D, x, LOWP_DEVICE_HOST};
    lowp_tensor ty = {LOWP_FORMAT_F32, M, D, y, LOWP_DEVICE_HOST};
    lowp_tensor tg = {LOWP_FORMAT_F32, M, D, g, LOWP_DEVICE_HOST};
    lowp_tensor tdx = {LOWP_FORMAT_F32, M, D, dx, LOWP_DEVICE_HOST};
    CHECK_OK(lowp_rmsnorm_forward(&tx, w, 1e-6f, &ty, rstd, NULL));
    for (int d = 0; d < D; d++) dw[d] = 1.0f; /* accumulates into this */
    CHECK_OK(lowp_rmsnorm_backward(&tx, w, rstd, &tg, &tdx, dw));

    double worst_dx = 0.0, worst_dw = 0.0;
    const double h = 1e-3;
    for (int m = 0; m < M; m++)
        for (int d = 0; d < D; d += 5) {
            double num =
                (loss64(x, w, g, m, d, h, -1, 0) - loss64(x, w, g, m, d, -h, -1, 0)) / (2 * h);
            double e = fabs(dx[m * D + d] - num) / (fabs(num) + 1e-2);
            if (e > worst_dx) worst_dx = e;
        }
    for (int d = 0; d < D; d += 3) {
        double num = 0.0;
        for (int m = 0; m < M; m++)
            num += (loss64(x, w, g, m, -1, 0, d, h) - loss64(x, w, g, m, -1, 0, d, -h)) / (2 * h);
        double e = fabs((dw[d] - 1.0) - num) / (fabs(num) + 1e-2);
        if (e > worst_dw) worst_dw = e;
    }
    CHECKF(worst_dx < 1e-3, "dx relative error %g", worst_dx);
    CHECKF(worst_dw < 1e-3, "dweight relative error %g", worst_dw);

    /* dx aliasing dy, dweight NULL: the same dx. */
    static float gcopy[M * D];
    memcpy(gcopy, g, sizeof g);
    lowp_tensor tgc = {LOWP_FORMAT_F32, M, D, gcopy, LOWP_DEVICE_HOST};
    CHECK_OK(lowp_rmsnorm_backward(&tx, w, rstd, &tgc, &tgc, NULL));
    CHECK(memcmp(gcopy, dx, sizeof dx) == 0);
    /* Twice into dweight: accumulates. */
    memset(dw2, 0, sizeof dw2);
    CHECK_OK(lowp_rmsnorm_backward(&tx, w, rstd, &tg, &tdx, dw2));
    CHECK_OK(lowp_rmsnorm_backward(&tx, w, rstd, &tg, &tdx, dw2));
    int acc = 1;
    for (int d = 0; d < D; d++)
        acc &= fabsf(dw2[d] - 2.0f * (dw[d] - 1.0f)) <= 1e-4f * (1.0f + fabsf(dw2[d]));
    CHECK(acc);

    CHECK_FAIL(lowp_rmsnorm_backward(&tx, w, NULL, &tg, &tdx, NULL), LOWP_ERR_INVALID_ARG,
               "rstd is NULL");
    lowp_tensor bad = tdx;
    bad.rows = M - 1;
    CHECK_FAIL(lowp_rmsnorm_backward(&tx, w, rstd, &tg, &bad, NULL), LOWP_ERR_INVALID_ARG,
               "dx shape (6 x 96)");
    bad = tg;
    bad.device = (lowp_device){LOWP_DEVICE_PLUGIN_FIRST, 0};
    CHECK_FAIL(lowp_rmsnorm_backward(&tx, w, rstd, &bad, &tdx, NULL), LOWP_ERR_UNSUPPORTED,
               "dy.device.type (16)");
}

/* Shapes where the rows run eight at a time and across threads (the public functions use
 * every core), with a partial last block: forward and backward equal the sequential
 * definitions bit for bit, autocast off and BF16, dx aliasing dy included. */
static void test_row_blocks(void) {
    static const int shapes[][2] = {{203, 384}, {403, 97}, {9, 5}, {16, 4096}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int R = shapes[si][0], C = shapes[si][1];
        const size_t n = (size_t) R * (size_t) C;
        float *x = malloc(n * 4), *y = malloc(n * 4), *ref = malloc(n * 4), *g = malloc(n * 4);
        float *dx = malloc(n * 4), *dxr = malloc(n * 4), *w = malloc((size_t) C * 4);
        float *dw = malloc((size_t) C * 4), *dwr = malloc((size_t) C * 4);
        float *rstd = malloc((size_t) R * 4), *rref = malloc((size_t) R * 4);
        uint32_t s = 777u + (uint32_t) si;
        for (size_t i = 0; i < n; i++) {
            s = s * 1664525u + 1013904223u;
            /* row scales spread over binades, so that the sums round differently by order */
            const float row = ldexpf(1.0f, (int) ((i / (size_t) C) % 23) - 11);
            x[i] = ((float) (s >> 8) / 16777216.0f - 0.5f) * 6.0f * row;
            s = s * 1664525u + 1013904223u;
            g[i] = ((float) (s >> 8) / 16777216.0f - 0.5f) * 3.0f;
        }
        for (int d = 0; d < C; d++) w[d] = 0.5f + (float) (d % 17) / 9.0f;
        lowp_tensor tx = {LOWP_FORMAT_F32, R, C, x, LOWP_DEVICE_HOST};
        lowp_tensor ty = {LOWP_FORMAT_F32, R, C, y, LOWP_DEVICE_HOST};
        lowp_tensor tg = {LOWP_FORMAT_F32, R, C, g, LOWP_DEVICE_HOST};
        lowp_tensor tdx = {LOWP_FORMAT_F32, R, C, dx, LOWP_DEVICE_HOST};
        lowp_autocast ac;
        CHECK_OK(lowp_autocast_init(&ac));
        CHECK_OK(lowp_autocast_set(&ac, LOWP_DEVICE_CPU, 1, LOWP_FORMAT_BF16));
        for (int on = 0; on <= 1; on++) {
            CHECK_OK(lowp_rmsnorm_forward(&tx, w, 1e-5f, &ty, rstd, on ? &ac : NULL));
            reference_rc(on ? LOWP_FORMAT_BF16 : LOWP_FORMAT_F32, x, w, 1e-5f, ref, rref, R, C);
            CHECKF(memcmp(y, ref, n * 4) == 0 && memcmp(rstd, rref, (size_t) R * 4) == 0,
                   "forward %dx%d autocast %d: not the sequential definition", R, C, on);
        }
        CHECK_OK(lowp_rmsnorm_forward(&tx, w, 1e-5f, &ty, rstd, NULL));
        for (int d = 0; d < C; d++) dw[d] = dwr[d] = 0.25f;
        CHECK_OK(lowp_rmsnorm_backward(&tx, w, rstd, &tg, &tdx, dw));
        reference_bwd(x, w, rstd, g, dxr, dwr, R, C);
        CHECKF(memcmp(dx, dxr, n * 4) == 0, "backward %dx%d: dx not the definition", R, C);
        CHECKF(memcmp(dw, dwr, (size_t) C * 4) == 0, "backward %dx%d: dweight not the definition",
               R, C);
        /* dx aliasing dy, no dweight */
        memcpy(dx, g, n * 4);
        lowp_tensor tga = {LOWP_FORMAT_F32, R, C, dx, LOWP_DEVICE_HOST};
        CHECK_OK(lowp_rmsnorm_backward(&tx, w, rstd, &tga, &tga, NULL));
        CHECKF(memcmp(dx, dxr, n * 4) == 0, "backward %dx%d, dx aliasing dy: not the definition", R,
               C);
        free(x), free(y), free(ref), free(g), free(dx), free(dxr), free(w), free(dw), free(dwr);
        free(rstd), free(rref);
    }
}

int main(void) {
    test_policy();
    test_forward();
    test_backward();
    test_row_blocks();
    return testutil_finish();
}
