/* The thread-count rule (lowp/threads.h) and the backend's amax slot.
 *
 * - lowp_thread_count: 0 is every core, 1..LOWP_MAX_THREADS as given, more clamped.
 * - cfg.threads far above any machine (65536, INT32_MAX) in lowp_cast, lowp_quantize and
 *   lowp_gemm, and in lowp_moe_run: the result equals the single-threaded one (before the
 *   clamp, libgomp crashed or failed to create the threads).
 * - lowp_amax goes through the backend's amax slot: on a backend without one it is
 *   LOWP_ERR_UNSUPPORTED naming the slot, while the CPU result equals a plain loop (backends of
 *   older API versions: test_device_compat.c). */
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "lowp/lowp.h"
#include "testutil.h"

static void test_count(void) {
    const int procs = omp_get_num_procs();
    const int all = procs < LOWP_MAX_THREADS ? procs : LOWP_MAX_THREADS;
    CHECK(lowp_thread_count(0) == all);
    CHECK(lowp_thread_count(-5) == all);
    CHECK(lowp_thread_count(1) == 1);
    CHECK(lowp_thread_count(3) == 3);
    CHECK(lowp_thread_count(LOWP_MAX_THREADS) == LOWP_MAX_THREADS);
    CHECK(lowp_thread_count(LOWP_MAX_THREADS + 1) == LOWP_MAX_THREADS);
    CHECK(lowp_thread_count(65536) == LOWP_MAX_THREADS);
    CHECK(lowp_thread_count(INT32_MAX) == LOWP_MAX_THREADS);
}

#define R 64
#define C 1024 /* 64K elements: several pieces of work, so the parallel regions do start */

static void test_huge_threads(void) {
    static float x[R * C];
    static uint8_t c1[R * C], c2[R * C], d1[R * C], d2[R * C];
    static uint8_t s1[R * (C / 32)], s2[R * (C / 32)];
    for (int i = 0; i < R * C; i++) x[i] = sinf((float) i * 0.37f) * (float) (1 + i % 300);
    const int32_t huge[] = {65536, INT32_MAX};
    lowp_tensor xt = {LOWP_FORMAT_F32, R, C, x, LOWP_DEVICE_HOST};

    /* cast */
    lowp_tensor e1 = {LOWP_FORMAT_E4M3, R, C, c1, LOWP_DEVICE_HOST};
    lowp_tensor e2 = {LOWP_FORMAT_E4M3, R, C, c2, LOWP_DEVICE_HOST};
    lowp_cast_cfg cc;
    lowp_cast_cfg_init(&cc);
    cc.threads = 1;
    CHECK_OK(lowp_cast(&xt, &e1, &cc));
    for (int h = 0; h < 2; h++) {
        cc.threads = huge[h];
        memset(c2, 0, sizeof c2);
        CHECK_OK(lowp_cast(&xt, &e2, &cc));
        CHECKF(memcmp(c1, c2, sizeof c1) == 0, "cast with threads %d", (int) huge[h]);
    }

    /* quantize (MX32, both copies' rowwise half) */
    lowp_qtensor q1 = {
        LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, R, C, d1, s1, LOWP_DEVICE_HOST, NULL, 0};
    lowp_qtensor q2 = {
        LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, R, C, d2, s2, LOWP_DEVICE_HOST, NULL, 0};
    lowp_quant_cfg qc;
    lowp_quant_cfg_init(&qc);
    qc.threads = 1;
    CHECK_OK(lowp_quantize(&xt, &q1, NULL, &qc));
    for (int h = 0; h < 2; h++) {
        qc.threads = huge[h];
        memset(d2, 0, sizeof d2);
        CHECK_OK(lowp_quantize(&xt, &q2, NULL, &qc));
        CHECKF(memcmp(d1, d2, sizeof d1) == 0 && memcmp(s1, s2, sizeof s1) == 0,
               "quantize with threads %d", (int) huge[h]);
    }

    /* GEMM of the quantized copy with itself: [R, R], large enough to run in parallel */
    static float g1[R * R], g2[R * R];
    lowp_tensor o1 = {LOWP_FORMAT_F32, R, R, g1, LOWP_DEVICE_HOST};
    lowp_tensor o2 = {LOWP_FORMAT_F32, R, R, g2, LOWP_DEVICE_HOST};
    lowp_gemm_cfg gc;
    lowp_gemm_cfg_init(&gc);
    gc.threads = 1;
    CHECK_OK(lowp_gemm(&q1, &q1, &o1, &gc));
    for (int h = 0; h < 2; h++) {
        gc.threads = huge[h];
        memset(g2, 0, sizeof g2);
        CHECK_OK(lowp_gemm(&q1, &q1, &o2, &gc));
        CHECKF(memcmp(g1, g2, sizeof g1) == 0, "gemm with threads %d", (int) huge[h]);
    }
}

/* ---- the amax slot ---- */

static lowp_status v1_device_count(void *ctx, int32_t *count) {
    (void) ctx;
    *count = 1;
    return LOWP_OK;
}
static lowp_status v1_synchronize(void *ctx, int32_t index) {
    (void) ctx;
    (void) index;
    return LOWP_OK;
}
static lowp_status v1_alloc(void *ctx, int32_t index, size_t nbytes, void **ptr) {
    (void) ctx;
    (void) index;
    (void) nbytes;
    *ptr = NULL;
    return LOWP_ERR_OUT_OF_MEMORY;
}
static lowp_status v1_free(void *ctx, int32_t index, void *ptr) {
    (void) ctx;
    (void) index;
    (void) ptr;
    return LOWP_OK;
}
static int g_amax_calls;
static lowp_status v1_amax(void *ctx, int32_t index, const lowp_tensor *x, int32_t scaling,
                           float *out, size_t n) {
    (void) ctx;
    (void) index;
    (void) x;
    (void) scaling;
    (void) out;
    (void) n;
    g_amax_calls++;
    return LOWP_OK;
}

static void test_amax_slot(void) {
    /* CPU: through the slot, equal to a plain loop (NaN-free input). */
    static float x[3 * 40];
    for (int i = 0; i < 3 * 40; i++) x[i] = (float) ((i * 7919) % 101) - 50.0f;
    lowp_tensor xt = {LOWP_FORMAT_F32, 3, 40, x, LOWP_DEVICE_HOST};
    float row[3];
    CHECK_OK(lowp_amax(&xt, LOWP_SCALING_ROW, row, 3));
    for (int r = 0; r < 3; r++) {
        float m = 0.0f;
        for (int c = 0; c < 40; c++) m = fmaxf(m, fabsf(x[r * 40 + c]));
        CHECKF(row[r] == m, "row %d: %g != %g", r, (double) row[r], (double) m);
    }

    /* A backend with no amax slot: LOWP_ERR_UNSUPPORTED naming it, the slot never called
     * (older versions: test_device_compat). */
    lowp_backend_iface f = {0};
    f.device_count = v1_device_count;
    f.synchronize = v1_synchronize;
    f.alloc = v1_alloc;
    f.free = v1_free;
    lowp_backend_reg reg = {LOWP_BACKEND_API_VERSION, sizeof reg, "noamax", &f, NULL};
    int32_t type = -1;
    CHECK_OK(lowp_backend_register(&reg, &type));
    lowp_tensor dt = {LOWP_FORMAT_F32, 3, 40, x, {type, 0}};
    CHECK_FAIL(lowp_amax(&dt, LOWP_SCALING_ROW, row, 3), LOWP_ERR_UNSUPPORTED,
               "backend \"noamax\" has no amax kernel");
    f.amax = v1_amax;
    lowp_backend_reg reg2 = {LOWP_BACKEND_API_VERSION, sizeof reg2, "withamax", &f, NULL};
    CHECK_OK(lowp_backend_register(&reg2, &type));
    lowp_tensor dt2 = {LOWP_FORMAT_F32, 3, 40, x, {type, 0}};
    CHECK_OK(lowp_amax(&dt2, LOWP_SCALING_ROW, row, 3));
    CHECK(g_amax_calls == 1);
}

int main(void) {
    test_count();
    test_huge_threads();
    test_amax_slot();
    return testutil_finish();
}
