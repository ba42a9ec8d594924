/* Tests of the FP8 delayed-scaling state of a wrapped module (train.h, src/train/fp8_state.c):
 * init and its argument errors, record, the update against three independent
 * lowp_delayed_state references (every role, every step, bit for bit), the device image
 * layout, the amax reduction hook (a fake two-rank MAX all-reduce, a failing hook, a bad
 * result), and push/pull on the asynchronous testdev plugin (a push is queued and snapshots
 * the mirror; a pull synchronizes the state's device and keeps amaxes recorded since the last
 * push; free releases the device memory). */
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "lowp/lowp.h"
#include "testdev_hooks.h"
#include "testutil.h"

static const lowp_format k_hybrid[LOWP_ROLE_COUNT] = {LOWP_FORMAT_E4M3, LOWP_FORMAT_E4M3,
                                                      LOWP_FORMAT_E5M2};

/* Bitwise equality of everything a state holds, the device image included (host memory for
 * the CPU and for testdev). */
static int same_state(const lowp_fp8_state *a, const lowp_fp8_state *b_copy, const float *b_image) {
    if (a->device.type != b_copy->device.type || a->device.index != b_copy->device.index ||
        a->history_len != b_copy->history_len || a->host_buf != b_copy->host_buf ||
        a->dev_buf != b_copy->dev_buf)
        return 0;
    for (int r = 0; r < LOWP_ROLE_COUNT; r++) {
        const lowp_delayed_state *x = &a->roles[r], *y = &b_copy->roles[r];
        if (x->history != y->history || f2u(x->scale) != f2u(y->scale) ||
            f2u(x->scale_inv) != f2u(y->scale_inv) || x->cfg.format != y->cfg.format ||
            x->cfg.history_len != y->cfg.history_len || f2u(x->cfg.margin) != f2u(y->cfg.margin) ||
            x->cfg.algo != y->cfg.algo)
            return 0;
    }
    size_t n = (size_t) LOWP_ROLE_COUNT * ((size_t) a->history_len + 1);
    return memcmp(a->host_buf, b_image, n * sizeof(float)) == 0;
}

/* ---- init, record ------------------------------------------------------------------------ */

static void test_init(void) {
    lowp_delayed_cfg c = delayed_cfg(8, 0.0f, LOWP_AMAX_ALGO_MAX);
    lowp_fp8_state st;
    CHECK_OK(lowp_fp8_state_init(&st, &c, k_hybrid, LOWP_DEVICE_HOST));
    CHECK(st.history_len == 8);
    CHECK(st.device.type == LOWP_DEVICE_CPU && st.device.index == 0);
    CHECK(st.dev_buf == st.host_buf); /* the CPU state is its own device copy */
    for (int r = 0; r < LOWP_ROLE_COUNT; r++) {
        CHECK(st.roles[r].cfg.format == k_hybrid[r]);
        CHECK(st.roles[r].cfg.history_len == 8);
        CHECK(st.roles[r].history == st.host_buf + r * 9);
        CHECK(st.roles[r].scale == 1.0f && st.roles[r].scale_inv == 1.0f);
        for (int i = 0; i < 8; i++) CHECK(st.roles[r].history[i] == 0.0f);
        CHECK(st.host_buf[r * 9 + 8] == 1.0f); /* the image's scale slot */
    }
    lowp_fp8_state_free(&st);
    CHECK(st.host_buf == NULL && st.dev_buf == NULL);
    lowp_fp8_state_free(&st); /* twice: nothing */
    lowp_fp8_state_free(NULL);

    lowp_format bad[3] = {LOWP_FORMAT_E4M3, LOWP_FORMAT_E2M1, LOWP_FORMAT_E5M2};
    CHECK_FAIL(lowp_fp8_state_init(&st, &c, bad, LOWP_DEVICE_HOST), LOWP_ERR_INVALID_ARG,
               "formats[1] (5)");
    CHECK(st.host_buf == NULL); /* a failed init leaves a state that free ignores */
    lowp_fp8_state_free(&st);
    CHECK_FAIL(lowp_fp8_state_init(NULL, &c, k_hybrid, LOWP_DEVICE_HOST), LOWP_ERR_INVALID_ARG,
               "st is NULL");
    CHECK_FAIL(lowp_fp8_state_init(&st, NULL, k_hybrid, LOWP_DEVICE_HOST), LOWP_ERR_INVALID_ARG,
               "cfg is NULL");
    CHECK_FAIL(lowp_fp8_state_init(&st, &c, NULL, LOWP_DEVICE_HOST), LOWP_ERR_INVALID_ARG,
               "formats is NULL");
    lowp_delayed_cfg z = delayed_cfg(0, 0.0f, LOWP_AMAX_ALGO_MAX);
    CHECK_FAIL(lowp_fp8_state_init(&st, &z, k_hybrid, LOWP_DEVICE_HOST), LOWP_ERR_INVALID_ARG,
               "cfg.history_len (0) < 1");
    z = delayed_cfg(4, NAN, LOWP_AMAX_ALGO_MAX);
    CHECK_FAIL(lowp_fp8_state_init(&st, &z, k_hybrid, LOWP_DEVICE_HOST), LOWP_ERR_INVALID_ARG,
               "cfg.margin");
    z = delayed_cfg(4, 0.0f, (lowp_amax_algo) 7);
    CHECK_FAIL(lowp_fp8_state_init(&st, &z, k_hybrid, LOWP_DEVICE_HOST), LOWP_ERR_INVALID_ARG,
               "cfg.algo (7)");
    CHECK_FAIL(lowp_fp8_state_init(&st, &c, k_hybrid, (lowp_device){LOWP_DEVICE_CPU, 1}),
               LOWP_ERR_NOT_FOUND, "lowp_fp8_state_init: device.index (1)");
    CHECK_FAIL(lowp_fp8_state_init(&st, &c, k_hybrid, (lowp_device){LOWP_DEVICE_MAX_TYPES, 0}),
               LOWP_ERR_INVALID_ARG, "device.type");

    /* An uninitialized (zeroed) state is refused by every function. */
    lowp_fp8_state zero;
    memset(&zero, 0, sizeof zero);
    CHECK_FAIL(lowp_fp8_state_record(&zero, LOWP_ROLE_INPUT, 1.0f), LOWP_ERR_INVALID_ARG,
               "not an initialized state");
    CHECK_FAIL(lowp_fp8_state_update(&zero, NULL), LOWP_ERR_INVALID_ARG, "lowp_fp8_state_update");
    CHECK_FAIL(lowp_fp8_state_push(&zero), LOWP_ERR_INVALID_ARG, "lowp_fp8_state_push");
    CHECK_FAIL(lowp_fp8_state_pull(&zero), LOWP_ERR_INVALID_ARG, "lowp_fp8_state_pull");
    CHECK_FAIL(lowp_fp8_state_pull(NULL), LOWP_ERR_INVALID_ARG, "st is NULL");
}

static void test_record(void) {
    lowp_delayed_cfg c = delayed_cfg(4, 0.0f, LOWP_AMAX_ALGO_MAX);
    lowp_fp8_state st;
    CHECK_OK(lowp_fp8_state_init(&st, &c, k_hybrid, LOWP_DEVICE_HOST));
    CHECK_OK(lowp_fp8_state_record(&st, LOWP_ROLE_INPUT, 2.0f));
    CHECK_OK(lowp_fp8_state_record(&st, LOWP_ROLE_INPUT, 1.0f));  /* smaller: kept max */
    CHECK_OK(lowp_fp8_state_record(&st, LOWP_ROLE_INPUT, -3.0f)); /* |amax| */
    CHECK(st.roles[LOWP_ROLE_INPUT].history[0] == 3.0f);
    CHECK_OK(lowp_fp8_state_record(&st, LOWP_ROLE_WEIGHT, NAN));
    CHECK_OK(lowp_fp8_state_record(&st, LOWP_ROLE_WEIGHT, 5.0f)); /* NaN sticks */
    CHECK(isnan(st.roles[LOWP_ROLE_WEIGHT].history[0]));
    CHECK(st.roles[LOWP_ROLE_GRAD_OUTPUT].history[0] == 0.0f); /* other roles untouched */
    CHECK_FAIL(lowp_fp8_state_record(&st, (lowp_role) 3, 1.0f), LOWP_ERR_INVALID_ARG, "role (3)");
    CHECK_FAIL(lowp_fp8_state_record(&st, (lowp_role) -1, 1.0f), LOWP_ERR_INVALID_ARG, "role (-1)");
    lowp_fp8_state_free(&st);
}

/* ---- update against the reference -------------------------------------------------------- */

/* `steps` steps of random amaxes (some zero: the tensor was unused; a few huge) through the
 * state and through three plain lowp_delayed_state references; everything must agree bit for
 * bit after every step, the device image included. */
static void run_update_vs_reference(int32_t len, float margin, lowp_amax_algo algo, int steps) {
    lowp_delayed_cfg c = delayed_cfg(len, margin, algo);
    lowp_fp8_state st;
    CHECK_OK(lowp_fp8_state_init(&st, &c, k_hybrid, LOWP_DEVICE_HOST));
    lowp_delayed_state ref[LOWP_ROLE_COUNT];
    float *hist = calloc((size_t) LOWP_ROLE_COUNT * (size_t) len, sizeof(float));
    for (int r = 0; r < LOWP_ROLE_COUNT; r++) {
        lowp_delayed_cfg rc = c;
        rc.format = k_hybrid[r];
        CHECK_OK(lowp_delayed_init(&ref[r], &rc, hist + r * len));
    }
    int mismatches = 0;
    for (int s = 0; s < steps; s++) {
        for (int r = 0; r < LOWP_ROLE_COUNT; r++) {
            uint32_t k = xorshift32() % 16;
            int records = k == 0 ? 0 : 1 + (int) (xorshift32() % 3); /* 0: unused this step */
            for (int i = 0; i < records; i++) {
                float a = ldexpf((float) (xorshift32() % 1000 + 1) / 1000.0f,
                                 (int) (xorshift32() % 40) - 20);
                if (k == 1) a = 1e-30f; /* scale overflows binary32: FLT_MAX */
                CHECK_OK(lowp_fp8_state_record(&st, (lowp_role) r, a));
                lowp_delayed_record(&ref[r], a);
            }
        }
        CHECK_OK(lowp_fp8_state_update(&st, NULL));
        for (int r = 0; r < LOWP_ROLE_COUNT; r++) {
            lowp_delayed_update(&ref[r]);
            if (f2u(st.roles[r].scale) != f2u(ref[r].scale) ||
                f2u(st.roles[r].scale_inv) != f2u(ref[r].scale_inv) ||
                memcmp(st.roles[r].history, ref[r].history, (size_t) len * sizeof(float)) != 0 ||
                f2u(st.dev_buf[r * (len + 1) + len]) != f2u(ref[r].scale))
                mismatches++;
        }
    }
    CHECKF(mismatches == 0, "len %d margin %g algo %d: %d role-steps differ", len, (double) margin,
           (int) algo, mismatches);
    free(hist);
    lowp_fp8_state_free(&st);
}

static void test_update(void) {
    run_update_vs_reference(1, 0.0f, LOWP_AMAX_ALGO_MAX, 50);
    run_update_vs_reference(4, 0.0f, LOWP_AMAX_ALGO_MAX, 200);
    run_update_vs_reference(16, 1.0f, LOWP_AMAX_ALGO_MAX, 200);
    run_update_vs_reference(16, 0.0f, LOWP_AMAX_ALGO_MOST_RECENT, 200);
    run_update_vs_reference(1024, 2.0f, LOWP_AMAX_ALGO_MAX, 60);

    /* A worked example: E4M3 input, amax 4 -> scale 112; E5M2 grad amax 2 -> 28672. */
    lowp_delayed_cfg c = delayed_cfg(4, 0.0f, LOWP_AMAX_ALGO_MAX);
    lowp_fp8_state st;
    CHECK_OK(lowp_fp8_state_init(&st, &c, k_hybrid, LOWP_DEVICE_HOST));
    CHECK_OK(lowp_fp8_state_record(&st, LOWP_ROLE_INPUT, 4.0f));
    CHECK_OK(lowp_fp8_state_record(&st, LOWP_ROLE_GRAD_OUTPUT, 2.0f));
    CHECK_OK(lowp_fp8_state_update(&st, NULL));
    CHECK(st.roles[0].scale == 112.0f && st.roles[0].scale_inv == 1.0f / 112.0f);
    CHECK(st.roles[2].scale == 28672.0f);
    CHECK(st.roles[1].scale == 1.0f); /* unused weight: previous scale, no roll */
    CHECK(st.roles[0].history[0] == 0.0f && st.roles[0].history[3] == 4.0f);
    CHECK(st.roles[1].history[3] == 0.0f);
    lowp_reduce_hook none = {NULL, NULL}; /* a hook without a function: one process */
    CHECK_OK(lowp_fp8_state_record(&st, LOWP_ROLE_INPUT, 8.0f));
    CHECK_OK(lowp_fp8_state_update(&st, &none));
    CHECK(st.roles[0].scale == 56.0f);
    CHECK(st.roles[0].history[2] == 4.0f && st.roles[0].history[3] == 8.0f);
    lowp_fp8_state_free(&st);
}

/* ---- the reduction hook ------------------------------------------------------------------ */

/* A fake two-rank MAX all-reduce: each rank's hook sees the peer's staging amaxes (what the
 * collective would bring in) and takes the elementwise max in place. */
typedef struct fake_group {
    float peer[LOWP_ROLE_COUNT];
    int calls;
    int32_t last_count;
    lowp_status fail_with; /* non-OK: the collective fails */
    float force;           /* non-zero: return this in amax[1] (a broken hook) */
} fake_group;

static lowp_status fake_max_reduce(float *amax, int32_t count, void *user) {
    fake_group *g = user;
    g->calls++;
    g->last_count = count;
    if (g->fail_with != LOWP_OK) return g->fail_with;
    for (int32_t i = 0; i < count; i++)
        if (g->peer[i] != g->peer[i] || g->peer[i] > amax[i]) amax[i] = g->peer[i];
    if (g->force != 0.0f) amax[1] = g->force;
    return LOWP_OK;
}

static void snapshot(const lowp_fp8_state *st, lowp_fp8_state *copy, float *image) {
    *copy = *st;
    memcpy(image, st->host_buf,
           (size_t) LOWP_ROLE_COUNT * ((size_t) st->history_len + 1) * sizeof(float));
}

static void test_reduce_hook(void) {
    lowp_delayed_cfg c = delayed_cfg(4, 0.0f, LOWP_AMAX_ALGO_MAX);
    lowp_fp8_state a, b;
    CHECK_OK(lowp_fp8_state_init(&a, &c, k_hybrid, LOWP_DEVICE_HOST));
    CHECK_OK(lowp_fp8_state_init(&b, &c, k_hybrid, LOWP_DEVICE_HOST));
    /* Rank 0 saw small inputs, rank 1 large ones; the weight amax agrees; grads differ. */
    const float a_amax[3] = {1.0f, 0.5f, 4.0f}, b_amax[3] = {8.0f, 0.5f, 2.0f};
    for (int r = 0; r < 3; r++) {
        CHECK_OK(lowp_fp8_state_record(&a, (lowp_role) r, a_amax[r]));
        CHECK_OK(lowp_fp8_state_record(&b, (lowp_role) r, b_amax[r]));
    }
    fake_group ga = {{8.0f, 0.5f, 2.0f}, 0, 0, LOWP_OK, 0.0f};
    fake_group gb = {{1.0f, 0.5f, 4.0f}, 0, 0, LOWP_OK, 0.0f};
    lowp_reduce_hook ha = {fake_max_reduce, &ga}, hb = {fake_max_reduce, &gb};
    CHECK_OK(lowp_fp8_state_update(&a, &ha));
    CHECK_OK(lowp_fp8_state_update(&b, &hb));
    CHECK(ga.calls == 1 && gb.calls == 1);
    CHECK(ga.last_count == LOWP_ROLE_COUNT); /* one call for all roles */
    /* The reduced amax is what the update used: 448/8 = 56, not rank 0's own 448/1. */
    CHECK(a.roles[0].scale == 56.0f);
    CHECK(a.roles[2].scale == 57344.0f / 4.0f);
    CHECK(a.roles[0].history[3] == 8.0f); /* and what the history keeps */
    int same = 1;
    for (int r = 0; r < 3; r++)
        same &= f2u(a.roles[r].scale) == f2u(b.roles[r].scale) &&
                memcmp(a.roles[r].history, b.roles[r].history, 4 * sizeof(float)) == 0;
    CHECK(same); /* both ranks hold the same state after the reduction */

    /* Without the hook, rank 0 would have used its own amax. */
    lowp_fp8_state solo;
    CHECK_OK(lowp_fp8_state_init(&solo, &c, k_hybrid, LOWP_DEVICE_HOST));
    CHECK_OK(lowp_fp8_state_record(&solo, LOWP_ROLE_INPUT, 1.0f));
    CHECK_OK(lowp_fp8_state_update(&solo, NULL));
    CHECK(solo.roles[0].scale == 448.0f);
    lowp_fp8_state_free(&solo);

    /* A failing collective: its status comes back and the state is untouched. */
    lowp_fp8_state copy;
    float image[3 * 5];
    CHECK_OK(lowp_fp8_state_record(&a, LOWP_ROLE_INPUT, 3.0f));
    snapshot(&a, &copy, image);
    ga.fail_with = LOWP_ERR_DEVICE;
    CHECK_FAIL(lowp_fp8_state_update(&a, &ha), LOWP_ERR_DEVICE, "amax reduce hook returned");
    CHECK(same_state(&a, &copy, image));
    /* A hook that returns a negative amax is refused, state untouched. */
    ga.fail_with = LOWP_OK;
    ga.force = -1.0f;
    CHECK_FAIL(lowp_fp8_state_update(&a, &ha), LOWP_ERR_INVALID_ARG, "amax[1] = -1");
    CHECK(same_state(&a, &copy, image));
    ga.force = 0.0f;
    CHECK_OK(lowp_fp8_state_update(&a, &ha));
    CHECK(a.roles[0].history[3] == 8.0f); /* max(3, peer 8) */
    lowp_fp8_state_free(&a);
    lowp_fp8_state_free(&b);
}

/* ---- an asynchronous device -------------------------------------------------------------- */

static void test_device(testdev_hooks *td) {
    const lowp_device d1 = {td->type, 1};
    long allocs = td->live_allocs(1);
    lowp_delayed_cfg c = delayed_cfg(4, 0.0f, LOWP_AMAX_ALGO_MAX);
    lowp_fp8_state st;
    CHECK_OK(lowp_fp8_state_init(&st, &c, k_hybrid, d1));
    CHECK(td->live_allocs(1) == allocs + 1);
    CHECK(st.dev_buf != st.host_buf);
    CHECK(td->queued(1) == 0); /* init leaves the initial state in place */
    CHECK(st.dev_buf[4] == 1.0f && st.dev_buf[0] == 0.0f);

    /* A push is queued on the state's device, not done when update returns. */
    int s0 = td->sync_count(0);
    CHECK(td->hold(1, 1) == 0);
    CHECK_OK(lowp_fp8_state_record(&st, LOWP_ROLE_INPUT, 4.0f));
    CHECK_OK(lowp_fp8_state_update(&st, NULL));
    CHECK(td->queued(1) == 1);
    CHECK(st.dev_buf[4] == 1.0f && st.dev_buf[3] == 0.0f); /* device copy not yet written */
    /* The push copied a snapshot: recording into the mirror now must not reach the device
     * through the pending copy. */
    CHECK_OK(lowp_fp8_state_record(&st, LOWP_ROLE_INPUT, 100.0f));
    CHECK(td->hold(1, 0) == 0);
    CHECK_OK(lowp_device_synchronize(d1));
    CHECK(st.dev_buf[4] == 112.0f && st.dev_buf[3] == 4.0f);
    CHECK(st.dev_buf[0] == 0.0f); /* the snapshot's staging row, not the later 100 */

    /* pull keeps the amax recorded since (it pushes the mirror before reading back). */
    int s1 = td->sync_count(1);
    CHECK_OK(lowp_fp8_state_pull(&st));
    CHECK(td->sync_count(1) >= s1 + 2);
    CHECK(st.roles[0].history[0] == 100.0f && st.dev_buf[0] == 100.0f);
    CHECK(st.roles[0].scale == 112.0f && st.roles[0].scale_inv == 1.0f / 112.0f);

    /* pull returns what the device holds: a value written on the device (as a kernel would)
     * and still queued when pull is called is what the mirror gets. */
    td->set_delay_us(20000);
    float dev_amax = 7.0f;
    CHECK(td->hold(1, 1) == 0);
    CHECK_OK(lowp_memcpy(d1, &st.dev_buf[5 + 0], LOWP_DEVICE_HOST, &dev_amax, sizeof dev_amax));
    CHECK(st.dev_buf[5] == 0.0f); /* still queued */
    CHECK(td->hold(1, 0) == 0);   /* released, but 20 ms from done */
    CHECK_OK(lowp_fp8_state_pull(&st));
    CHECK(st.roles[1].history[0] == 7.0f);
    CHECK(td->queued(1) == 0);

    /* Two pushes in a row: the second waits for the first before reusing its stage. */
    CHECK_OK(lowp_fp8_state_update(&st, NULL));
    int s2 = td->sync_count(1);
    CHECK_OK(lowp_fp8_state_push(&st));
    CHECK(td->sync_count(1) == s2 + 1);
    td->set_delay_us(2000);
    CHECK_OK(lowp_fp8_state_pull(&st)); /* nothing of ours pending from here */

    /* A held device with a pending push: a pull must wait for it (it returns only once the
     * hold is released by another thread, with the pushed values). */
    CHECK(td->hold(1, 1) == 0);
    CHECK_OK(lowp_fp8_state_record(&st, LOWP_ROLE_GRAD_OUTPUT, 0.5f));
    CHECK_OK(lowp_fp8_state_update(&st, NULL));
    float want = st.roles[2].scale;
    st.roles[2].scale = 12345.0f; /* clobber the mirror: the value must come from the device */
    pthread_t th;
    testdev_release_arg ra = {td, 1, 30000};
    CHECK(pthread_create(&th, NULL, testdev_release_later, &ra) == 0);
    CHECK_OK(lowp_fp8_state_pull(&st));
    pthread_join(th, NULL);
    CHECK(st.roles[2].scale == want && want == 57344.0f / 0.5f);
    CHECK(td->sync_count(0) == s0); /* the other device was never synchronized */

    lowp_fp8_state_free(&st);
    CHECK(td->live_allocs(1) == allocs);
    CHECK(td->queued(1) == 0);

    CHECK_FAIL(lowp_fp8_state_init(&st, &c, k_hybrid, (lowp_device){td->type, 2}),
               LOWP_ERR_NOT_FOUND, "device.index (2)");
}

int main(void) {
    tu_seed(0x9E3779B97F4A7C15ull);
    testdev_hooks td;
    int have_td = testdev_open(&td);
    CHECK(have_td);
    test_init();
    test_record();
    test_update();
    test_reduce_hook();
    if (have_td) test_device(&td);
    return testutil_finish();
}
