/* threads = 1 means one thread (issue 42 point 4): every parallel region takes the caller's
 * thread count, so a one-thread run never starts a second OpenMP thread. The threads a run used
 * are counted as the entries of /proc/self/task: the OpenMP runtime keeps a team's threads alive
 * once they have started, so a region that ran on two threads even once leaves a second entry.
 * The test must run in a fresh process (ctest starts one), before anything parallel ran.
 *
 * - A fake-quantized MXFP4 weight (lowp_linear_cfg.fake_quant_mxfp4) of 128K elements, forward
 *   and backward with opts.threads = 1: the decode of the MXFP4 copy took every core.
 * - Two trainer updates of the `tiny` model (all_mxfp8) with lowp_trainer_cfg.threads = 1: the
 *   gradient norm of the clipping took every core.
 * - The counter itself: the same trainer with threads = 2 does start a second thread (where the
 *   machine has two cores), so the counts above can fail. */
#include <dirent.h>
#include <omp.h>
#include <stdlib.h>

#include "lowp/lowp.h"
#include "lowp/trainer.h"
#include "testutil.h"

#ifdef __linux__
/* Threads of this process (entries of /proc/self/task); -1 where it cannot be read. */
static int task_count(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e = readdir(d); e; e = readdir(d))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

static void fake_quant_linear(void) {
    enum { M = 64, N = 512, K = 256 };
    lowp_linear_cfg cfg;
    CHECK_OK(lowp_linear_cfg_preset("block_fp8_fp4", &cfg));
    lowp_recipe r;
    CHECK_OK(lowp_recipe_init(&r, "custom"));
    CHECK_OK(lowp_recipe_append(&r, "*", &cfg));
    float *w = malloc(sizeof(float) * N * K), *g = calloc((size_t) N * K, sizeof(float));
    float *x = malloc(sizeof(float) * M * K), *y = malloc(sizeof(float) * M * N);
    float *dx = malloc(sizeof(float) * M * K);
    for (int i = 0; i < N * K; i++) w[i] = (float) ((i * 37) % 101 - 50) * 1e-3f;
    for (int i = 0; i < M * K; i++) x[i] = (float) ((i * 13) % 29 - 14) * 0.05f;
    lowp_param p = {
        .name = "w", .rows = N, .cols = K, .data = w, .grad = g, .device = LOWP_DEVICE_HOST};
    CHECK_OK(lowp_train_prepare(&p, 1, &r));
    lowp_linear_opts o = {0};
    o.threads = 1;
    lowp_tensor xt = {LOWP_FORMAT_F32, M, K, x, LOWP_DEVICE_HOST};
    lowp_tensor yt = {LOWP_FORMAT_F32, M, N, y, LOWP_DEVICE_HOST};
    lowp_tensor dxt = {LOWP_FORMAT_F32, M, K, dx, LOWP_DEVICE_HOST};
    lowp_linear_saved *saved = NULL;
    CHECK_OK(lowp_linear_forward(&p, NULL, &xt, &yt, &o, &saved));
    CHECK_OK(lowp_linear_backward(&p, &xt, &yt, &dxt, NULL, &o, saved));
    int n = task_count();
    CHECKF(n == 1, "a fake-quantized MXFP4 linear on 1 thread left %d threads", n);
    lowp_train_convert(&p, 1);
    free(w), free(g), free(x), free(y), free(dx);
}

/* steps updates of `tiny` (all_mxfp8) on `threads`; the thread count after them. */
static int trainer_threads(int32_t threads, int steps) {
    lowp_data *data = NULL;
    CHECK_OK(lowp_data_default(&data));
    lowp_data_info di;
    lowp_data_get_info(data, &di);
    lowp_moe_config mc;
    CHECK_OK(lowp_moe_config_preset("tiny", di.vocab, &mc));
    lowp_moe *m = NULL;
    CHECK_OK(lowp_moe_create(&mc, 1, &m));
    lowp_recipe r;
    CHECK_OK(lowp_recipe_init(&r, "all_mxfp8"));
    lowp_trainer_cfg tc;
    lowp_trainer_cfg_init(&tc);
    tc.steps = 10;
    tc.batch = 2;
    tc.threads = threads;
    tc.clip = 1e-6f; /* the norm and the clipped update on every step */
    lowp_trainer *t = NULL;
    CHECK_OK(lowp_trainer_create(m, data, &r, &tc, &t));
    const int before = task_count();
    CHECKF(threads > 1 || before == 1, "%d threads before the first update", before);
    lowp_step_report rep;
    for (int s = 0; s < steps && t; s++) CHECK_OK(lowp_trainer_step(t, &rep));
    const int n = task_count();
    lowp_trainer_free(t);
    lowp_moe_free(m);
    lowp_data_free(data);
    return n;
}

int main(void) {
    const int start = task_count();
    CHECKF(start == 1, "%d threads at the start (not a fresh process?)", start);
    fake_quant_linear();
    const int one = trainer_threads(1, 2);
    CHECKF(one == 1, "two trainer updates on 1 thread left %d threads", one);
    if (omp_get_num_procs() >= 2) {
        const int two = trainer_threads(2, 1);
        CHECKF(two >= 2, "the counter saw %d threads after an update on 2", two);
    } else {
        printf("one core: the 2-thread control is skipped\n");
    }
    return testutil_finish();
}
#else
int main(void) {
    printf("no /proc/self/task: skipped\n");
    return 0;
}
#endif
