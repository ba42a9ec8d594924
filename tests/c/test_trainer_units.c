/* Unit tests of the trainer's parts that need no model (trainer.h):
 * - data: the sorted byte vocabulary, the 90/10 split, encode/decode, batches that are a pure
 *   function of (split, seed, index), targets = tokens shifted by one, training batches from
 *   the first 90% only and validation batches from the rest, a split too short for T, the
 *   built-in corpus, a file equal to the same text in memory;
 * - the learning-rate schedule: warm-up, peak, cosine midpoint, floor, no warm-up;
 * - AdamW: the first update against the formula, convergence on a quadratic, weight decay on
 *   matrices but not on norm weights, bit-identical results on 1 and 2 threads;
 * - gradient clipping: the norm against a double reference, scaling to the threshold, no change
 *   below it or for a non-finite norm, the same on 1 and 2 threads;
 * - the trainer's update (one parallel loop over every parameter's spans, the clipping factor
 *   applied inside it): the scalar formula on g * factor for each of several parameters of
 *   odd sizes, the bits of lowp_grad_clip then lowp_adamw_step, the gradients left as they are.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/cpu.h"
#include "lowp/trainer.h"
#include "testutil.h"
#include "trainer/optim.h"

static void test_data(void) {
    /* 900 lowercase bytes, then 100 uppercase: the split separates them exactly. */
    char text[1000];
    for (int i = 0; i < 900; i++) text[i] = (char) ('a' + (i * 7) % 26);
    for (int i = 900; i < 1000; i++) text[i] = (char) ('A' + (i * 5) % 26);
    lowp_data *d = NULL;
    CHECK(lowp_data_from_text(text, sizeof text, "mixed", &d) == LOWP_OK);
    if (!d) return;
    lowp_data_info di;
    lowp_data_get_info(d, &di);
    CHECK(di.vocab == 52 && di.bytes == 1000 && di.train_tokens == 900 && di.val_tokens == 100);
    CHECK(strcmp(di.name, "mixed") == 0);
    const uint8_t *sym;
    int32_t V;
    lowp_data_vocab(d, &sym, &V);
    CHECK(V == 52 && sym[0] == 'A' && sym[25] == 'Z' && sym[26] == 'a' && sym[51] == 'z');
    int32_t tok[5];
    char back[6] = {0};
    CHECK(lowp_data_encode(d, "Hello", 5, tok) == LOWP_OK);
    CHECK(tok[0] == 'H' - 'A' && tok[1] == 26 + 'e' - 'a');
    CHECK(lowp_data_decode(d, tok, 5, back) == LOWP_OK && strcmp(back, "Hello") == 0);
    CHECK(lowp_data_encode(d, "a b", 3, tok) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "0x20") != NULL);
    tok[0] = 52;
    CHECK(lowp_data_decode(d, tok, 1, back) == LOWP_ERR_INVALID_ARG);

    enum { B = 4, T = 16 };
    int32_t x1[B * T], y1[B * T], x2[B * T], y2[B * T];
    CHECK(lowp_data_batch(d, LOWP_SPLIT_TRAIN, 7, 3, B, T, x1, y1) == LOWP_OK);
    CHECK(lowp_data_batch(d, LOWP_SPLIT_TRAIN, 7, 3, B, T, x2, y2) == LOWP_OK);
    CHECK(memcmp(x1, x2, sizeof x1) == 0 && memcmp(y1, y2, sizeof y1) == 0);
    int shifted = 1, lower = 1;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            if (t + 1 < T && x1[b * T + t + 1] != y1[b * T + t]) shifted = 0;
            if (x1[b * T + t] < 26 || y1[b * T + t] < 26) lower = 0;
        }
    CHECK(shifted && lower);
    CHECK(lowp_data_batch(d, LOWP_SPLIT_TRAIN, 7, 4, B, T, x2, y2) == LOWP_OK);
    CHECK(memcmp(x1, x2, sizeof x1) != 0);
    CHECK(lowp_data_batch(d, LOWP_SPLIT_TRAIN, 8, 3, B, T, x2, y2) == LOWP_OK);
    CHECK(memcmp(x1, x2, sizeof x1) != 0);
    /* Batch b of index i with B rows equals row b of the words a B = 1 stream draws at
     * index i * B + b: the stream is numbered by window, not by call. */
    int32_t x3[T], y3[T];
    CHECK(lowp_data_batch(d, LOWP_SPLIT_TRAIN, 7, 3 * B + 2, 1, T, x3, y3) == LOWP_OK);
    CHECK(memcmp(x3, x1 + 2 * T, sizeof x3) == 0);
    int upper = 1;
    for (int k = 0; k < 50; k++) {
        CHECK(lowp_data_batch(d, LOWP_SPLIT_VAL, 0, (uint64_t) k, B, T, x2, y2) == LOWP_OK);
        for (int i = 0; i < B * T; i++)
            if (x2[i] >= 26 || y2[i] >= 26) upper = 0;
    }
    CHECK(upper);
    /* The validation split has 100 tokens: T = 99 fits, T = 100 does not. */
    int32_t big[100], bigy[100];
    CHECK(lowp_data_batch(d, LOWP_SPLIT_VAL, 0, 0, 1, 99, big, bigy) == LOWP_OK);
    CHECK(lowp_data_batch(d, LOWP_SPLIT_VAL, 0, 0, 1, 100, big, bigy) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "validation") != NULL);
    CHECK(lowp_data_batch(d, LOWP_SPLIT_TRAIN, 0, 0, 0, 4, big, bigy) == LOWP_ERR_INVALID_ARG);

    /* The same text from a file: same vocabulary and hash. */
    char path[] = "/tmp/lowp_data_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) {
        CHECK(write(fd, text, sizeof text) == (ssize_t) sizeof text);
        close(fd);
        lowp_data *e = NULL;
        CHECK(lowp_data_from_file(path, &e) == LOWP_OK);
        if (e) {
            lowp_data_info ei;
            lowp_data_get_info(e, &ei);
            CHECK(ei.hash == di.hash && ei.vocab == di.vocab && strcmp(ei.name, path) == 0);
            lowp_data_free(e);
        }
        unlink(path);
        CHECK(lowp_data_from_file(path, &e) == LOWP_ERR_IO);
        CHECK(strstr(lowp_last_error(), path) != NULL);
    }
    lowp_data_free(d);
    CHECK(lowp_data_from_text("short", 5, "tiny", &d) == LOWP_ERR_INVALID_ARG);

    CHECK(lowp_data_default(&d) == LOWP_OK);
    if (d) {
        lowp_data_get_info(d, &di);
        CHECK(di.bytes > 20000 && di.vocab > 40 && di.vocab < 100);
        CHECK(strcmp(di.name, "built-in") == 0);
        int32_t *xs = malloc(8 * 256 * sizeof *xs), *ys = malloc(8 * 256 * sizeof *ys);
        CHECK(lowp_data_batch(d, LOWP_SPLIT_VAL, 0, 0, 8, 256, xs, ys) == LOWP_OK);
        free(xs);
        free(ys);
        lowp_data_free(d);
    }
}

static void test_schedule(void) {
    lowp_lr_schedule s = {1e-2f, 1e-3f, 10, 110};
    float lr;
    CHECK(lowp_lr_at(&s, 0, &lr) == LOWP_OK && lr == (float) ((double) 1e-2f * 1 / 10));
    CHECK(lowp_lr_at(&s, 4, &lr) == LOWP_OK && lr == (float) ((double) 1e-2f * 5 / 10));
    CHECK(lowp_lr_at(&s, 9, &lr) == LOWP_OK && lr == 1e-2f);
    CHECK(lowp_lr_at(&s, 10, &lr) == LOWP_OK && lr == 1e-2f);
    CHECK(lowp_lr_at(&s, 60, &lr) == LOWP_OK && fabsf(lr - 5.5e-3f) < 1e-8f);
    CHECK(lowp_lr_at(&s, 110, &lr) == LOWP_OK && lr == 1e-3f);
    CHECK(lowp_lr_at(&s, 500, &lr) == LOWP_OK && lr == 1e-3f);
    float prev = 1.0f;
    int mono = 1;
    for (int i = 10; i <= 110; i++) {
        lowp_lr_at(&s, i, &lr);
        if (lr > prev) mono = 0;
        prev = lr;
    }
    CHECK(mono);
    lowp_lr_schedule nw = {1e-2f, 0.0f, 0, 100};
    CHECK(lowp_lr_at(&nw, 0, &lr) == LOWP_OK && lr == 1e-2f);
    CHECK(lowp_lr_at(&s, -1, &lr) == LOWP_ERR_INVALID_ARG);
}

static void make_param(lowp_param *p, const char *name, int64_t rows, int64_t cols) {
    memset(p, 0, sizeof *p);
    p->name = name;
    p->rows = rows;
    p->cols = cols;
    p->data = calloc((size_t) (rows * cols), sizeof(float));
    p->grad = calloc((size_t) (rows * cols), sizeof(float));
    p->device = LOWP_DEVICE_HOST;
}

static void free_param(lowp_param *p) {
    free(p->data);
    free(p->grad);
}

static void test_adamw(void) {
    lowp_param p[2];
    make_param(&p[0], "w", 8, 16);
    make_param(&p[1], "norm", 1, 16);
    lowp_adamw_cfg cfg;
    lowp_adamw_cfg_init(&cfg);
    CHECK(cfg.beta1 == 0.9f && cfg.beta2 == 0.95f && cfg.weight_decay == 0.1f);
    cfg.weight_decay = 0.0f;
    lowp_adamw *o = NULL;
    CHECK(lowp_adamw_create(p, 2, &cfg, &o) == LOWP_OK);
    /* First update: m/(1-b1) = g, v/(1-b2) = g^2, so w -= lr g / (|g| + eps). */
    for (int i = 0; i < 128; i++) p[0].grad[i] = (float) (i - 64) * 0.01f;
    CHECK(lowp_adamw_step(o, p, 2, 0.1f) == LOWP_OK);
    int first_ok = 1;
    for (int i = 0; i < 128; i++) {
        float g = (float) (i - 64) * 0.01f;
        float want = -0.1f * (g / (fabsf(g) + 1e-8f));
        if (fabsf(p[0].data[i] - want) > 1e-6f) first_ok = 0;
    }
    CHECK(first_ok);
    int64_t t;
    lowp_adamw_get_t(o, &t);
    CHECK(t == 1);
    lowp_adamw_free(o);

    /* A quadratic 0.5 |w - c|^2 converges to c. */
    CHECK(lowp_adamw_create(p, 2, &cfg, &o) == LOWP_OK);
    for (int i = 0; i < 128; i++) p[0].data[i] = 0.0f;
    for (int s = 0; s < 600; s++) {
        for (int i = 0; i < 128; i++) p[0].grad[i] = p[0].data[i] - (float) (i % 7) * 0.3f;
        for (int i = 0; i < 16; i++) p[1].grad[i] = p[1].data[i] - 1.0f;
        lowp_lr_schedule sch = {0.05f, 0.001f, 20, 600};
        float lr;
        lowp_lr_at(&sch, s, &lr);
        lowp_adamw_step(o, p, 2, lr);
    }
    double err = 0;
    for (int i = 0; i < 128; i++) err = fmax(err, fabs(p[0].data[i] - (i % 7) * 0.3));
    for (int i = 0; i < 16; i++) err = fmax(err, fabs(p[1].data[i] - 1.0));
    CHECKF(err < 1e-2, "quadratic: max error %g", err);
    lowp_adamw_free(o);

    /* Weight decay with a zero gradient: matrices shrink by lr wd, norm weights stay. */
    cfg.weight_decay = 0.5f;
    CHECK(lowp_adamw_create(p, 2, &cfg, &o) == LOWP_OK);
    for (int i = 0; i < 128; i++) p[0].data[i] = 2.0f, p[0].grad[i] = 0.0f;
    for (int i = 0; i < 16; i++) p[1].data[i] = 2.0f, p[1].grad[i] = 0.0f;
    lowp_adamw_step(o, p, 2, 0.1f);
    CHECK(fabsf(p[0].data[0] - (2.0f - 0.1f * 0.5f * 2.0f)) < 1e-6f);
    CHECK(p[1].data[0] == 2.0f);
    lowp_adamw_free(o);
    cfg.beta1 = 1.0f;
    CHECK(lowp_adamw_create(p, 2, &cfg, &o) == LOWP_ERR_INVALID_ARG);
    free_param(&p[0]);
    free_param(&p[1]);

    /* Thread count does not change a bit (a parameter large enough to run in parallel). */
    lowp_param q[2];
    make_param(&q[0], "big", 512, 512);
    make_param(&q[1], "big2", 512, 512);
    lowp_adamw_cfg_init(&cfg);
    float *res[2];
    for (int th = 1; th <= 2; th++) {
        cfg.threads = th;
        for (int i = 0; i < 512 * 512; i++) {
            q[0].data[i] = q[1].data[i] = (float) ((i * 37) % 101) * 0.01f;
            q[0].grad[i] = q[1].grad[i] = (float) ((i * 13) % 97 - 48) * 0.001f;
        }
        CHECK(lowp_adamw_create(q, 2, &cfg, &o) == LOWP_OK);
        for (int s = 0; s < 3; s++) lowp_adamw_step(o, q, 2, 1e-3f);
        res[th - 1] = malloc(512 * 512 * sizeof(float));
        memcpy(res[th - 1], q[0].data, 512 * 512 * sizeof(float));
        lowp_adamw_free(o);
    }
    CHECK(memcmp(res[0], res[1], 512 * 512 * sizeof(float)) == 0);
    free(res[0]);
    free(res[1]);
    free_param(&q[0]);
    free_param(&q[1]);

    /* The (vectorized) update gives the bits of the scalar formula, element by element, over
     * a length that is not a multiple of the lanes or of the parallel spans, with decay. */
    lowp_param r;
    const int rows = 3, cols = 4099, n = rows * cols;
    make_param(&r, "odd", rows, cols);
    float *w = malloc(sizeof(float) * (size_t) n), *m = calloc((size_t) n, sizeof(float)),
          *v = calloc((size_t) n, sizeof(float));
    lowp_adamw_cfg_init(&cfg);
    cfg.threads = 2;
    for (int i = 0; i < n; i++) w[i] = r.data[i] = (float) ((i * 29) % 83 - 41) * 0.013f;
    CHECK(lowp_adamw_create(&r, 1, &cfg, &o) == LOWP_OK);
    for (int s = 1; s <= 3; s++) {
        for (int i = 0; i < n; i++)
            r.grad[i] = (float) ((i * 11 + s * 5) % 89 - 44) * 1e-3f * (i % 5 == 0 ? 1e-6f : 1.0f);
        const float lr = 2e-3f * (float) s, b1 = cfg.beta1, b2 = cfg.beta2, eps = cfg.eps;
        const float c1 = (float) (1.0 / (1.0 - pow((double) b1, (double) s)));
        const float c2 = (float) (1.0 / (1.0 - pow((double) b2, (double) s)));
        for (int i = 0; i < n; i++) {
            const float g = r.grad[i];
            m[i] = b1 * m[i] + (1.0f - b1) * g;
            v[i] = b2 * v[i] + (1.0f - b2) * (g * g);
            const float upd = (m[i] * c1) / (sqrtf(v[i] * c2) + eps) + cfg.weight_decay * w[i];
            w[i] = w[i] - lr * upd;
        }
        CHECK(lowp_adamw_step(o, &r, 1, lr) == LOWP_OK);
    }
    CHECKF(memcmp(w, r.data, sizeof(float) * (size_t) n) == 0,
           "AdamW differs from the scalar "
           "formula in %s",
           "some element");
    lowp_adamw_free(o);
    free(w), free(m), free(v);
    free_param(&r);
}

static void test_clip(void) {
    lowp_param p[2];
    make_param(&p[0], "a", 300, 300);
    make_param(&p[1], "b", 1, 10);
    double ref = 0;
    for (int i = 0; i < 90000; i++) {
        p[0].grad[i] = (float) ((i * 31) % 17 - 8) * 0.01f;
        ref += (double) p[0].grad[i] * p[0].grad[i];
    }
    for (int i = 0; i < 10; i++) {
        p[1].grad[i] = 1.0f;
        ref += 1.0;
    }
    ref = sqrt(ref);
    float norm;
    CHECK(lowp_grad_clip(p, 2, 0.0f, &norm) == LOWP_OK && fabs(norm - ref) < 1e-5 * ref);
    CHECK(lowp_grad_clip(p, 2, 1e6f, &norm) == LOWP_OK && p[1].grad[0] == 1.0f);
    omp_set_num_threads(1);
    float n1;
    lowp_grad_clip(p, 2, 0.0f, &n1);
    omp_set_num_threads(2);
    float n2;
    lowp_grad_clip(p, 2, 0.0f, &n2);
    CHECK(n1 == n2);
    CHECK(lowp_grad_clip(p, 2, 1.0f, &norm) == LOWP_OK);
    float after;
    lowp_grad_clip(p, 2, 0.0f, &after);
    CHECKF(fabsf(after - 1.0f) < 1e-4f, "clipped norm %g", (double) after);
    p[1].grad[3] = NAN;
    CHECK(lowp_grad_clip(p, 2, 1.0f, &norm) == LOWP_OK && isnan(norm));
    CHECK(p[1].grad[0] == p[1].grad[1]); /* untouched */
    free_param(&p[0]);
    free_param(&p[1]);
}

/* lowp_grad_norm_scale + lowp_adamw_step_scaled (the trainer's path) against the scalar AdamW
 * formula on g * factor, per parameter (spans of one loop mapped back to their parameters),
 * and against lowp_grad_clip + lowp_adamw_step, bit for bit; the gradients stay unscaled. */
static void test_clip_into_update(void) {
    enum { NP = 4 };
    const int64_t shape[NP][2] = {{3, 4099}, {1, 5}, {7, 10001}, {1, 70001}};
    lowp_param a[NP], b[NP];
    float *w[NP], *m[NP], *v[NP], *g0[NP];
    for (int k = 0; k < NP; k++) {
        make_param(&a[k], "a", shape[k][0], shape[k][1]);
        make_param(&b[k], "b", shape[k][0], shape[k][1]);
        const int64_t n = shape[k][0] * shape[k][1];
        w[k] = malloc(sizeof(float) * (size_t) n);
        m[k] = calloc((size_t) n, sizeof(float));
        v[k] = calloc((size_t) n, sizeof(float));
        g0[k] = malloc(sizeof(float) * (size_t) n);
        for (int64_t i = 0; i < n; i++)
            w[k][i] = a[k].data[i] = b[k].data[i] = (float) ((i * 29 + k) % 83 - 41) * 0.013f;
    }
    lowp_adamw_cfg cfg;
    lowp_adamw_cfg_init(&cfg);
    cfg.threads = 2;
    lowp_adamw *oa = NULL, *ob = NULL;
    CHECK(lowp_adamw_create(a, NP, &cfg, &oa) == LOWP_OK);
    CHECK(lowp_adamw_create(b, NP, &cfg, &ob) == LOWP_OK);
    int formula_ok = 1, same_ok = 1, grads_ok = 1, clipped = 0;
    for (int s = 1; s <= 3; s++) {
        for (int k = 0; k < NP; k++) {
            const int64_t n = shape[k][0] * shape[k][1];
            for (int64_t i = 0; i < n; i++)
                g0[k][i] = a[k].grad[i] = b[k].grad[i] =
                    (float) ((i * 11 + s * 5 + k) % 89 - 44) * 3e-3f * (i % 5 == 0 ? 1e-6f : 1.0f);
        }
        const float lr = 2e-3f * (float) s, max_norm = 0.5f;
        float na, nb, gs;
        CHECK(lowp_grad_clip(a, NP, max_norm, &na) == LOWP_OK);
        CHECK(lowp_adamw_step(oa, a, NP, lr) == LOWP_OK);
        CHECK(lowp_grad_norm_scale(b, NP, max_norm, &nb, &gs, 2) == LOWP_OK);
        CHECK(lowp_adamw_step_scaled(ob, b, NP, lr, gs) == LOWP_OK);
        CHECK(na == nb);
        if (gs != 1.0f) clipped++;
        const float b1 = cfg.beta1, b2 = cfg.beta2, eps = cfg.eps;
        const float c1 = (float) (1.0 / (1.0 - pow((double) b1, (double) s)));
        const float c2 = (float) (1.0 / (1.0 - pow((double) b2, (double) s)));
        for (int k = 0; k < NP; k++) {
            const int64_t n = shape[k][0] * shape[k][1];
            const float wd = shape[k][0] > 1 ? cfg.weight_decay : 0.0f;
            for (int64_t i = 0; i < n; i++) {
                const float g = g0[k][i] * gs;
                m[k][i] = b1 * m[k][i] + (1.0f - b1) * g;
                v[k][i] = b2 * v[k][i] + (1.0f - b2) * (g * g);
                const float upd = (m[k][i] * c1) / (sqrtf(v[k][i] * c2) + eps) + wd * w[k][i];
                w[k][i] = w[k][i] - lr * upd;
            }
            if (memcmp(w[k], b[k].data, sizeof(float) * (size_t) n) != 0) formula_ok = 0;
            if (memcmp(a[k].data, b[k].data, sizeof(float) * (size_t) n) != 0) same_ok = 0;
            if (memcmp(g0[k], b[k].grad, sizeof(float) * (size_t) n) != 0) grads_ok = 0;
        }
    }
    CHECKF(clipped == 3, "the gradients were clipped in %d of 3 updates", clipped);
    CHECK(formula_ok);
    CHECK(same_ok);
    CHECK(grads_ok);
    lowp_adamw_free(oa);
    lowp_adamw_free(ob);
    for (int k = 0; k < NP; k++) {
        free_param(&a[k]);
        free_param(&b[k]);
        free(w[k]), free(m[k]), free(v[k]), free(g0[k]);
    }
}

#if LOWP_HAVE_LIBMVEC
/* The vector SwiGLU (sigmoid on libmvec's expf) against binary64, beside moe_ffn.c's scalar
 * formula on libm's expf: u1 swept over -30 .. 30 (sigmoid saturating both ways), u3 and ds
 * random; s, du1, du3 within a few units of the formula's rounding (du1's 1 - sigmoid(u1)
 * cancels for large u1: an absolute |u1| 2^-24 of its factor); a length ending mid-vector. Each
 * vector set the CPU has (libmvec's AVX-512 and AVX2 variants). */
static void vector_swiglu(const lowp_cpu_vmath *vm) {
    enum { N = 30011 };
    static float u1[N], u3[N], ds[N], s[N], du1[N], du3[N];
    uint64_t r = 12345;
    for (int i = 0; i < N; i++) {
        const double t = (double) i / (N - 1);
        u1[i] = (float) (30.0 * (2 * t - 1) * fabs(2 * t - 1));
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        u3[i] = (float) ((double) (r >> 40) / (1 << 24) * 4.0 - 2.0);
        ds[i] = (float) ((double) ((r >> 16) & 0xFFFFFF) / (1 << 24) * 2.0 - 1.0);
    }
    u1[0] = 0.0f;
    u1[1] = -0.0f;
    vm->swiglu_fwd(u1, u3, s, N);
    vm->swiglu_bwd(u1, u3, ds, du1, du3, N);
    double worst[2][3] = {{0}};
    for (int i = 0; i < N; i++) {
        const double a = u1[i], b = u3[i], d = ds[i], sg = 1.0 / (1.0 + exp(-a));
        const double ws = a * sg * b, w1 = d * b * sg * (1.0 + a * (1.0 - sg)), w3 = d * a * sg;
        const double cancel = fabs(d * b * sg) * (1.0 + fabs(a)) * 0x1p-24;
        const float fs = 1.0f / (1.0f + expf(-u1[i])); /* moe_ffn.c's scalar formula */
        const float got[2][3] = {{s[i], du1[i], du3[i]},
                                 {u1[i] * fs * u3[i],
                                  ds[i] * u3[i] * fs * (1.0f + u1[i] * (1.0f - fs)),
                                  ds[i] * u1[i] * fs}};
        for (int k = 0; k < 2; k++) {
            const double e[3] = {testutil_err_units(got[k][0], ws, 0),
                                 testutil_err_units(got[k][1], w1, cancel),
                                 testutil_err_units(got[k][2], w3, 0)};
            for (int q = 0; q < 3; q++)
                if (e[q] > worst[k][q]) worst[k][q] = e[q];
        }
    }
    printf("SwiGLU worst error units (s, du1, du3): vector (%s) %.2f %.2f %.2f, scalar %.2f %.2f "
           "%.2f\n",
           vm->name, worst[0][0], worst[0][1], worst[0][2], worst[1][0], worst[1][1], worst[1][2]);
    for (int k = 0; k < 2; k++)
        for (int q = 0; q < 3; q++)
            CHECKF(worst[k][q] <= 6.0, "%s %d: %.2f", k ? "scalar" : "vector", q, worst[k][q]);
    static float s2[N];
    vm->swiglu_fwd(u1 + 3, u3 + 3, s2, 21); /* shifted, short: same values */
    CHECK(memcmp(s2, s + 3, 21 * sizeof *s) == 0);
    /* the attention softmax's exponentials: x - max <= 0, down to where expf underflows */
    static float x[N];
    for (int i = 0; i < N; i++) x[i] = (float) (-110.0 * i / (N - 1));
    x[N - 1] = -INFINITY; /* a masked-out score gives 0 */
    memcpy(s2, x, sizeof x);
    vm->expf(x, N);
    double we = 0;
    for (int i = 0; i < N - 1; i++) {
        const double e = testutil_err_units(x[i], exp((double) s2[i]), 0x1p-149);
        if (e > we) we = e;
    }
    printf("vector expf (%s): worst %.2f ulp over [-110, 0]\n", vm->name, we);
    CHECKF(we <= 4.0, "expf: %.2f ulp", we);
    CHECK(x[N - 1] == 0.0f);
}

static void test_vector_swiglu(void) {
    for (int v = 0; v < 2; v++) {
        const lowp_cpu_vmath *vm = lowp_cpu_vmath_of(v);
        if (vm)
            vector_swiglu(vm);
        else
            printf("vector SwiGLU: no %s here, skipped\n", v ? "AVX2" : "AVX-512");
    }
}
#else
static void test_vector_swiglu(void) {
    printf("vector SwiGLU: built without libmvec, skipped\n");
}
#endif

/* The AVX-512 strided transposes (32- and 16-bit) against the scalar one, bit for bit (NaN
 * payloads, -0, subnormals), on shapes with and without whole 16x16 blocks and with padded strides.
 */
/* lowp_cpu_bf16_dual_avx512 (train/linear.c's BF16 row and column copies from one read) against
 * the scalar reference cast and a scalar transpose, bit for bit: NaN payloads and signs, Inf,
 * -0, subnormals, the binary32 maximum and BF16 rounding ties; bands with and without the
 * aligned whole column lines the kernel streams, partial 16-column blocks, padded strides. */
static size_t up64(size_t n) {
    return (n + 63) / 64 * 64; /* aligned_alloc wants a multiple of the alignment */
}

static void test_bf16_dual(void) {
    if (!lowp_cpu_has_avx512()) {
        printf("AVX-512 BF16 dual copy: not here, skipped\n");
        return;
    }
    static const uint32_t special[] = {0x7F800000u, 0xFF800000u, 0x7FC00001u, 0xFF812345u,
                                       0x00000001u, 0x807FFFFFu, 0x7F7FFFFFu, 0xFF7F8000u,
                                       0x3F808000u, 0x3F818000u, 0x80000000u, 0x7F7F7FFFu};
    static const int64_t shapes[][3] = {{1, 1, 0},   {37, 53, 3},  {64, 48, 0},  {64, 48, 5},
                                        {96, 17, 0}, {33, 130, 0}, {256, 256, 0}};
    uint32_t r = 11;
    for (int si = 0; si < 7; si++) {
        const int64_t R = shapes[si][0], C = shapes[si][1], pad = shapes[si][2];
        const int64_t lds = C + pad, ldr = C + pad, ldc = R + pad;
        float *src = aligned_alloc(64, up64((size_t) (R * lds) * 4));
        uint16_t *want_r = malloc((size_t) (R * C) * 2);
        uint16_t *row = aligned_alloc(64, up64((size_t) (R * ldr) * 2));
        uint16_t *col = aligned_alloc(64, up64((size_t) (C * ldc) * 2));
        uint16_t *want_c = malloc((size_t) (C * ldc) * 2);
        float *dense = malloc((size_t) (R * C) * 4);
        for (int64_t i = 0; i < R * lds; i++) {
            r = r * 1664525u + 1013904223u;
            const uint32_t u = i % 5 == 0 ? special[(r >> 8) % 12] : r;
            memcpy(&src[i], &u, 4);
        }
        for (int64_t i = 0; i < R; i++) memcpy(dense + i * C, src + i * lds, (size_t) C * 4);
        lowp_cast_cfg cc;
        lowp_cast_cfg_init(&cc);
        cc.path = LOWP_KERNEL_PATH_REFERENCE;
        lowp_tensor x = {LOWP_FORMAT_F32, R, C, dense, LOWP_DEVICE_HOST};
        lowp_tensor b = {LOWP_FORMAT_BF16, R, C, want_r, LOWP_DEVICE_HOST};
        CHECK(lowp_cast(&x, &b, &cc) == LOWP_OK);
        memset(row, 0x5A, (size_t) (R * ldr) * 2);
        memset(col, 0x5A, (size_t) (C * ldc) * 2);
        memset(want_c, 0x5A, (size_t) (C * ldc) * 2);
        for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < C; j++) want_c[j * ldc + i] = want_r[i * C + j];
        lowp_cpu_bf16_dual_avx512(src, R, C, lds, row, ldr, col, ldc);
        int bad = 0;
        for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < ldr; j++)
                bad += row[i * ldr + j] != (j < C ? want_r[i * C + j] : 0x5A5A);
        CHECKF(bad == 0, "BF16 dual %lldx%lld (pad %lld): %d row elements differ", (long long) R,
               (long long) C, (long long) pad, bad);
        CHECKF(memcmp(col, want_c, (size_t) (C * ldc) * 2) == 0,
               "BF16 dual %lldx%lld (pad %lld): the column copy differs", (long long) R,
               (long long) C, (long long) pad);
        free(src);
        free(want_r);
        free(row);
        free(col);
        free(want_c);
        free(dense);
    }
}

static void test_transpose(void) {
    if (!lowp_cpu_has_avx512()) {
        printf("AVX-512 transpose: not here, skipped\n");
        return;
    }
    static const int64_t shapes[][2] = {{1, 1}, {16, 16}, {37, 53}, {64, 32}, {256, 256}, {15, 33}};
    uint32_t r = 7;
    for (int si = 0; si < 6; si++) {
        const int64_t R = shapes[si][0], C = shapes[si][1], lds = C + 3, ldd = R + 5;
        uint32_t *src = malloc((size_t) (R * lds) * 4), *got = malloc((size_t) (C * ldd) * 4);
        uint32_t *want = malloc((size_t) (C * ldd) * 4);
        for (int64_t i = 0; i < R * lds; i++) {
            r = r * 1664525u + 1013904223u;
            src[i] = i % 7 == 0 ? 0x7FC00001u + (r & 0xFF) : i % 11 == 0 ? 0x80000000u : r;
        }
        memset(got, 0xA5, (size_t) (C * ldd) * 4);
        memcpy(want, got, (size_t) (C * ldd) * 4);
        for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < C; j++) want[j * ldd + i] = src[i * lds + j];
        lowp_cpu_transpose_f32_avx512((const float *) src, R, C, lds, (float *) got, ldd);
        CHECKF(memcmp(got, want, (size_t) (C * ldd) * 4) == 0, "transpose %lldx%lld differs",
               (long long) R, (long long) C);
        /* 16-bit elements: the low halves of the same patterns */
        uint16_t *s16 = malloc((size_t) (R * lds) * 2), *g16 = malloc((size_t) (C * ldd) * 2);
        uint16_t *w16 = malloc((size_t) (C * ldd) * 2);
        for (int64_t i = 0; i < R * lds; i++) s16[i] = (uint16_t) (src[i] >> (i % 3 ? 16 : 0));
        memset(g16, 0x5A, (size_t) (C * ldd) * 2);
        memcpy(w16, g16, (size_t) (C * ldd) * 2);
        for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < C; j++) w16[j * ldd + i] = s16[i * lds + j];
        lowp_cpu_transpose_u16_avx512(s16, R, C, lds, g16, ldd);
        CHECKF(memcmp(g16, w16, (size_t) (C * ldd) * 2) == 0, "u16 transpose %lldx%lld differs",
               (long long) R, (long long) C);
        free(s16);
        free(g16);
        free(w16);
        free(src);
        free(got);
        free(want);
    }
}

int main(void) {
    test_transpose();
    test_bf16_dual();
    test_vector_swiglu();
    test_data();
    test_schedule();
    test_adamw();
    test_clip_into_update();
    test_clip();
    return testutil_finish();
}
