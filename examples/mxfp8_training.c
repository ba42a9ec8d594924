/* A two-layer MLP trained with MXFP8 GEMMs: the smallest complete use of lowp's training layer.
 *
 * The model learns to imitate a fixed random "teacher" network on Gaussian inputs
 * (regression, mean squared error):
 *
 *   h = relu(x . W1^T + b1)      x [B, 64], W1 [256, 64], h [B, 256]
 *   y = h . W2^T + b2            W2 [64, 256], y [B, 64]
 *
 * The weights are FP32 master copies owned by this program. lowp_train_prepare wraps them
 * with the all_mxfp8 recipe, so every GEMM of the forward and the backward runs in MXFP8
 * (E4M3 elements, one power-of-two scale per 32 values); Adam updates the FP32 masters; and
 * lowp_train_step_end tells lowp that the weights changed, so each weight is quantized once
 * per step. lowp_train_convert unwraps them at the end. The program prints the loss every 25
 * steps and exits with status 1 unless the loss of the last steps is well below the first. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lowp/lowp.h"

enum { B = 128, D_IN = 64, D_HID = 256, D_OUT = 64, STEPS = 300 };

/* ---- Small helpers: random numbers, Adam ---- */

static uint64_t g_rng = 0x853C49E6748FEA9Bull;
static float gauss(void) {
    double u[2];
    for (int i = 0; i < 2; i++) {
        g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
        u[i] = ((double) (g_rng >> 11) + 0.5) / 9007199254740992.0;
    }
    return (float) (sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]));
}
static void fill_gauss(float *a, int n, float sigma) {
    for (int i = 0; i < n; i++) a[i] = sigma * gauss();
}

typedef struct adam {
    float *m, *v; /* first and second moments, one per weight */
    int n;
} adam;

static void adam_step(adam *a, float *w, const float *g, int t, float lr) {
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    const float c1 = 1.0f - powf(b1, (float) t), c2 = 1.0f - powf(b2, (float) t);
    for (int i = 0; i < a->n; i++) {
        a->m[i] = b1 * a->m[i] + (1.0f - b1) * g[i];
        a->v[i] = b2 * a->v[i] + (1.0f - b2) * g[i] * g[i];
        w[i] -= lr * (a->m[i] / c1) / (sqrtf(a->v[i] / c2) + eps);
    }
}

/* lowp never prints: turn a failed status into a message; nonzero when it failed. */
static int failed(lowp_status st) {
    if (st == LOWP_OK) return 0;
    fprintf(stderr, "%s: %s\n", lowp_status_str(st), lowp_last_error());
    return 1;
}

/* The teacher: a fixed random network of the same shape, in plain float. */
static void teacher(const float *x, const float *t1, const float *t2, float *out) {
    static float h[B * D_HID];
    for (int b = 0; b < B; b++)
        for (int j = 0; j < D_HID; j++) {
            float s = 0.0f;
            for (int k = 0; k < D_IN; k++) s += x[b * D_IN + k] * t1[j * D_IN + k];
            h[b * D_HID + j] = tanhf(s);
        }
    for (int b = 0; b < B; b++)
        for (int o = 0; o < D_OUT; o++) {
            float s = 0.0f;
            for (int j = 0; j < D_HID; j++) s += h[b * D_HID + j] * t2[o * D_HID + j];
            out[b * D_OUT + o] = s;
        }
}

int main(void) {
    /* Model parameters (FP32 masters) and their gradients. */
    static float w1[D_HID * D_IN], g1[D_HID * D_IN], b1[D_HID], gb1[D_HID];
    static float w2[D_OUT * D_HID], g2[D_OUT * D_HID], b2[D_OUT], gb2[D_OUT];
    /* Activations and their gradients for one batch. */
    static float x[B * D_IN], target[B * D_OUT];
    static float hpre[B * D_HID], h[B * D_HID], dh[B * D_HID], y[B * D_OUT], dy[B * D_OUT];
    static float t1[D_HID * D_IN], t2[D_OUT * D_HID];

    fill_gauss(w1, D_HID * D_IN, 1.0f / sqrtf((float) D_IN));
    fill_gauss(w2, D_OUT * D_HID, 1.0f / sqrtf((float) D_HID));
    fill_gauss(t1, D_HID * D_IN, 1.5f / sqrtf((float) D_IN));
    fill_gauss(t2, D_OUT * D_HID, 1.0f / sqrtf((float) D_HID));

    lowp_param params[2] = {
        {.name = "mlp.fc1",
         .rows = D_HID,
         .cols = D_IN,
         .data = w1,
         .grad = g1,
         .device = LOWP_DEVICE_HOST},
        {.name = "mlp.fc2",
         .rows = D_OUT,
         .cols = D_HID,
         .data = w2,
         .grad = g2,
         .device = LOWP_DEVICE_HOST},
    };
    lowp_recipe recipe;
    if (failed(lowp_recipe_init(&recipe, "all_mxfp8"))) return 1;
    if (failed(lowp_train_prepare(params, 2, &recipe)))
        return 1; /* both layers now run MXFP8 GEMMs */

    static float mw1[D_HID * D_IN], vw1[D_HID * D_IN], mw2[D_OUT * D_HID], vw2[D_OUT * D_HID];
    static float mb1[D_HID], vb1[D_HID], mb2[D_OUT], vb2[D_OUT];
    adam opt_w1 = {mw1, vw1, D_HID * D_IN}, opt_w2 = {mw2, vw2, D_OUT * D_HID};
    adam opt_b1 = {mb1, vb1, D_HID}, opt_b2 = {mb2, vb2, D_OUT};

    lowp_tensor tx = {LOWP_FORMAT_F32, B, D_IN, x, LOWP_DEVICE_HOST};
    lowp_tensor thpre = {LOWP_FORMAT_F32, B, D_HID, hpre, LOWP_DEVICE_HOST};
    lowp_tensor th = {LOWP_FORMAT_F32, B, D_HID, h, LOWP_DEVICE_HOST};
    lowp_tensor tdh = {LOWP_FORMAT_F32, B, D_HID, dh, LOWP_DEVICE_HOST};
    lowp_tensor ty = {LOWP_FORMAT_F32, B, D_OUT, y, LOWP_DEVICE_HOST};
    lowp_tensor tdy = {LOWP_FORMAT_F32, B, D_OUT, dy, LOWP_DEVICE_HOST};

    double first = 0.0, last = 0.0; /* loss of step 1; mean loss of the last 25 steps */
    for (int step = 1; step <= STEPS; step++) {
        fill_gauss(x, B * D_IN, 1.0f); /* a fresh batch */
        teacher(x, t1, t2, target);

        /* Forward: each linear keeps what its backward needs in `saved`. */
        lowp_linear_saved *s1, *s2;
        if (failed(lowp_linear_forward(&params[0], b1, &tx, &thpre, NULL, &s1))) return 1;
        for (int i = 0; i < B * D_HID; i++) h[i] = hpre[i] > 0.0f ? hpre[i] : 0.0f;
        if (failed(lowp_linear_forward(&params[1], b2, &th, &ty, NULL, &s2))) return 1;
        double loss = 0.0;
        for (int i = 0; i < B * D_OUT; i++) {
            const float d = y[i] - target[i];
            loss += (double) d * d;
            dy[i] = 2.0f * d / (float) (B * D_OUT); /* d(mean squared error)/dy */
        }
        loss /= B * D_OUT;

        /* Backward: lowp adds dW into g1/g2 (so zero them first) and db into gb1/gb2. */
        memset(g1, 0, sizeof g1), memset(g2, 0, sizeof g2);
        memset(gb1, 0, sizeof gb1), memset(gb2, 0, sizeof gb2);
        if (failed(lowp_linear_backward(&params[1], &th, &tdy, &tdh, gb2, NULL, s2))) return 1;
        for (int i = 0; i < B * D_HID; i++) dh[i] = hpre[i] > 0.0f ? dh[i] : 0.0f; /* relu' */
        if (failed(lowp_linear_backward(&params[0], &tx, &tdh, NULL, gb1, NULL, s1))) return 1;

        /* Optimizer on the FP32 masters, then tell lowp: the cached MXFP8 copies are stale. */
        const float lr = 2e-3f;
        adam_step(&opt_w1, w1, g1, step, lr);
        adam_step(&opt_w2, w2, g2, step, lr);
        adam_step(&opt_b1, b1, gb1, step, lr);
        adam_step(&opt_b2, b2, gb2, step, lr);
        if (failed(lowp_train_step_end(params, 2, NULL))) return 1;

        if (step == 1) first = loss;
        if (step > STEPS - 25) last += loss / 25;
        if (step == 1 || step % 25 == 0) printf("step %4d  loss %.5f\n", step, loss);
    }

    lowp_wrap_stats st;
    if (failed(lowp_param_stats(&params[0], &st))) return 1;
    printf("mlp.fc1: %s, quantized %lld times in %d steps\n", st.cfg_name,
           (long long) st.weight_quantizations, STEPS);
    if (failed(lowp_train_convert(params, 2))) return 1; /* plain FP32 weights again */

    printf("loss %.5f -> %.5f\n", first, last);
    if (!(last < 0.3 * first)) {
        fprintf(stderr, "the loss did not fall enough (%.5f -> %.5f)\n", first, last);
        return 1;
    }
    return 0;
}
