/* Tests of the RNG tracker and dropout (rng.h, src/train/rng_tracker.c):
 *  - draw: words come from the current state's Philox stream at its offset (lowp_philox_fill
 *    is the reference), and the offset advances by the count;
 *  - add refuses a duplicate name, a duplicate seed (the default state's included), bad names
 *    and a full tracker; fork/restore switch the current state and back, leaving the other
 *    states' offsets alone;
 *  - two simulated tensor-parallel ranks (default seeds differ, a shared "model-parallel"
 *    state): identical dropout masks inside the forked region, different ones outside it;
 *  - recomputation: get_states before a forward, set_states, the same forward again gives
 *    the same mask and leaves the same states; set_states refuses mismatches and changes
 *    nothing then;
 *  - dropout: mask[i] is exactly (word >= p * 2^32), kept values are x / (1 - p) bit for bit,
 *    dropped ones 0, the keep rate is 1 - p, p = 0 and p = 1, y aliasing x, the backward. */
#include <math.h>
#include <string.h>

#include "lowp/lowp.h"
#include "testutil.h"

static int same_tracker(const lowp_rng_tracker *a, const lowp_rng_tracker *b) {
    if (a->count != b->count || a->current != b->current) return 0;
    for (int32_t i = 0; i < a->count; i++)
        if (strcmp(a->states[i].name, b->states[i].name) != 0 ||
            a->states[i].seed != b->states[i].seed || a->states[i].offset != b->states[i].offset)
            return 0;
    return 1;
}

/* get_states and set_states on the tracker test_draw_and_states built (three states); *tp
 * ends as it was when every check passes. */
static void check_get_set(lowp_rng_tracker *tp) {
    lowp_rng_tracker t = *tp;
    /* get: all, or a truncated copy with the full count. */
    lowp_rng_state st[LOWP_RNG_MAX_STATES];
    int32_t n = 0;
    CHECK_OK(lowp_rng_tracker_get_states(&t, st, LOWP_RNG_MAX_STATES, &n));
    CHECK(n == 3 && strcmp(st[1].name, "model-parallel") == 0 && st[1].offset == 6);
    CHECK(st[0].offset == 38 && st[0].seed == 1234);
    lowp_rng_state one[1];
    CHECK_OK(lowp_rng_tracker_get_states(&t, one, 1, &n));
    CHECK(n == 3 && strcmp(one[0].name, "default") == 0);
    CHECK_OK(lowp_rng_tracker_get_states(&t, NULL, 0, &n));
    CHECK(n == 3);
    CHECK_FAIL(lowp_rng_tracker_get_states(&t, st, -1, &n), LOWP_ERR_INVALID_ARG, "cap (-1)");
    CHECK_FAIL(lowp_rng_tracker_get_states(&t, st, 4, NULL), LOWP_ERR_INVALID_ARG, "n is NULL");

    /* set: by name, in any order; a refused set changes nothing. */
    lowp_rng_tracker before = t;
    lowp_rng_state in[3] = {st[2], st[0], st[1]};
    in[1].offset = 1000;
    CHECK_OK(lowp_rng_tracker_set_states(&t, in, 3));
    CHECK(t.states[0].offset == 1000 && t.states[1].offset == 6 && t.states[2].seed == 7);
    t = before;
    CHECK_FAIL(lowp_rng_tracker_set_states(&t, in, 2), LOWP_ERR_INVALID_ARG,
               "n (2) != the tracker's state count (3)");
    lowp_rng_state badname[3] = {st[0], st[1], st[2]};
    strcpy(badname[2].name, "unknown");
    badname[0].offset = 5;
    CHECK_FAIL(lowp_rng_tracker_set_states(&t, badname, 3), LOWP_ERR_INVALID_ARG,
               "in[2].name (\"unknown\")");
    CHECK(same_tracker(&t, &before));
    lowp_rng_state twice[3] = {st[0], st[1], st[1]};
    CHECK_FAIL(lowp_rng_tracker_set_states(&t, twice, 3), LOWP_ERR_INVALID_ARG, "appears twice");
    lowp_rng_state dupseed[3] = {st[0], st[1], st[2]};
    dupseed[2].seed = dupseed[0].seed;
    CHECK_FAIL(lowp_rng_tracker_set_states(&t, dupseed, 3), LOWP_ERR_INVALID_ARG,
               "in[2].seed (1234)");
    lowp_rng_state unterminated[3] = {st[0], st[1], st[2]};
    memset(unterminated[1].name, 'x', LOWP_RNG_NAME_MAX);
    CHECK_FAIL(lowp_rng_tracker_set_states(&t, unterminated, 3), LOWP_ERR_INVALID_ARG,
               "in[1].name");
    CHECK(same_tracker(&t, &before));
    *tp = t;
}

/* A full tracker, uninitialized ones, NULLs and an offset at the end, with t from
 * test_draw_and_states. */
static void check_refusals(lowp_rng_tracker *tp) {
    lowp_rng_tracker t = *tp;
    uint32_t got[4];
    /* A full tracker. */
    lowp_rng_tracker f;
    CHECK_OK(lowp_rng_tracker_init(&f, 0));
    char name[16];
    for (int i = 1; i < LOWP_RNG_MAX_STATES; i++) {
        snprintf(name, sizeof name, "s%d", i);
        CHECK_OK(lowp_rng_tracker_add(&f, name, (uint64_t) i));
    }
    CHECK_FAIL(lowp_rng_tracker_add(&f, "one-more", 500), LOWP_ERR_INVALID_ARG, "full (16 states)");

    /* Uninitialized trackers and NULLs. */
    lowp_rng_tracker z;
    memset(&z, 0, sizeof z);
    CHECK_FAIL(lowp_rng_tracker_draw(&z, got, 1), LOWP_ERR_INVALID_ARG, "not an initialized");
    CHECK_FAIL(lowp_rng_tracker_add(NULL, "x", 1), LOWP_ERR_INVALID_ARG, "t is NULL");
    CHECK_FAIL(lowp_rng_tracker_init(NULL, 1), LOWP_ERR_INVALID_ARG, "t is NULL");
    CHECK_FAIL(lowp_rng_tracker_draw(&t, NULL, 4), LOWP_ERR_INVALID_ARG, "out is NULL");
    /* An offset that would pass 2^64. */
    t.states[t.current].offset = UINT64_MAX - 2;
    CHECK_FAIL(lowp_rng_tracker_draw(&t, got, 4), LOWP_ERR_INVALID_ARG, "pass 2^64");
    CHECK(t.states[t.current].offset == UINT64_MAX - 2);
}

static void test_draw_and_states(void) {
    lowp_rng_tracker t;
    CHECK_OK(lowp_rng_tracker_init(&t, 1234));
    CHECK(t.count == 1 && t.current == 0 && strcmp(t.states[0].name, "default") == 0);
    CHECK(t.states[0].seed == 1234 && t.states[0].offset == 0);

    uint32_t got[37], want[37];
    CHECK_OK(lowp_rng_tracker_draw(&t, got, 5));
    CHECK_OK(lowp_rng_tracker_draw(&t, got + 5, 32)); /* continues at word 5, across blocks */
    CHECK_OK(lowp_philox_fill(1234, 0, want, 37));
    CHECK(memcmp(got, want, sizeof got) == 0);
    CHECK(t.states[0].offset == 37);
    CHECK_OK(lowp_rng_tracker_draw(&t, NULL, 0)); /* nothing: no pointer needed */
    CHECK(t.states[0].offset == 37);

    /* add: names and seeds are unique. */
    CHECK_OK(lowp_rng_tracker_add(&t, "model-parallel", 99));
    CHECK(t.count == 2 && t.states[1].seed == 99 && t.states[1].offset == 0);
    CHECK_FAIL(lowp_rng_tracker_add(&t, "model-parallel", 100), LOWP_ERR_INVALID_ARG,
               "name (\"model-parallel\") is already a state");
    CHECK_FAIL(lowp_rng_tracker_add(&t, "expert-parallel", 99), LOWP_ERR_INVALID_ARG,
               "seed (99) of \"expert-parallel\" is already used by state \"model-parallel\"");
    CHECK_FAIL(lowp_rng_tracker_add(&t, "other", 1234), LOWP_ERR_INVALID_ARG,
               "already used by state \"default\"");
    CHECK_FAIL(lowp_rng_tracker_add(&t, "default", 5), LOWP_ERR_INVALID_ARG, "already a state");
    CHECK_FAIL(lowp_rng_tracker_add(&t, "", 5), LOWP_ERR_INVALID_ARG, "1 to 31 characters");
    CHECK_FAIL(lowp_rng_tracker_add(&t, "a-name-that-is-far-too-long-for-it", 5),
               LOWP_ERR_INVALID_ARG, "1 to 31 characters");
    CHECK_FAIL(lowp_rng_tracker_add(&t, NULL, 5), LOWP_ERR_INVALID_ARG, "name is NULL");
    CHECK(t.count == 2); /* nothing added by the refusals */
    CHECK_OK(lowp_rng_tracker_add(&t, "a-name-of-exactly-31-characters", 7));

    /* fork / restore: draws come from the forked state; the default keeps its offset. */
    int32_t prev = -1;
    CHECK_OK(lowp_rng_tracker_fork(&t, "model-parallel", &prev));
    CHECK(prev == 0 && t.current == 1);
    CHECK_OK(lowp_rng_tracker_draw(&t, got, 6));
    CHECK_OK(lowp_philox_fill(99, 0, want, 6));
    CHECK(memcmp(got, want, 6 * sizeof(uint32_t)) == 0);
    CHECK(t.states[1].offset == 6 && t.states[0].offset == 37);
    int32_t prev2 = -1; /* nested */
    CHECK_OK(lowp_rng_tracker_fork(&t, "default", &prev2));
    CHECK(prev2 == 1 && t.current == 0);
    CHECK_OK(lowp_rng_tracker_restore(&t, prev2));
    CHECK(t.current == 1);
    CHECK_OK(lowp_rng_tracker_restore(&t, prev));
    CHECK(t.current == 0);
    CHECK_OK(lowp_rng_tracker_draw(&t, got, 1));
    CHECK_OK(lowp_philox_fill(1234, 37, want, 1));
    CHECK(got[0] == want[0]);
    CHECK_FAIL(lowp_rng_tracker_fork(&t, "nope", &prev), LOWP_ERR_NOT_FOUND, "name (\"nope\")");
    CHECK_FAIL(lowp_rng_tracker_fork(&t, "default", NULL), LOWP_ERR_INVALID_ARG, "prev is NULL");
    CHECK_FAIL(lowp_rng_tracker_restore(&t, 3), LOWP_ERR_INVALID_ARG, "prev (3) is not in [0, 3)");
    CHECK_FAIL(lowp_rng_tracker_restore(&t, -1), LOWP_ERR_INVALID_ARG, "prev (-1)");
    check_get_set(&t);
    check_refusals(&t);
}

/* ---- dropout ----------------------------------------------------------------------------- */

enum { N = 4099 }; /* not a multiple of 4: blocks straddle calls */

static void fill_x(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = (float) ((int) (i % 13) - 6) * 0.37f + 0.01f;
}

static void test_dropout_exact(void) {
    static float x[N], y[N], y2[N], dx[N];
    static uint8_t mask[N];
    static uint32_t w[N];
    fill_x(x, N);
    const float p = 0.3f;
    lowp_rng_tracker t;
    CHECK_OK(lowp_rng_tracker_init(&t, 42));
    CHECK_OK(lowp_rng_tracker_draw(&t, w, 3)); /* start at offset 3 */
    CHECK_OK(lowp_dropout_forward(&t, x, mask, y, N, p));
    CHECK(t.states[0].offset == 3 + N);
    CHECK_OK(lowp_philox_fill(42, 3, w, N));
    const double thr = ldexp((double) p, 32);
    const float scale = 1.0f / (1.0f - p);
    int exact = 1, kept = 0;
    for (size_t i = 0; i < N; i++) {
        int k = (double) w[i] >= thr;
        kept += k;
        exact &= mask[i] == k;
        exact &= k ? y[i] == x[i] * scale : (y[i] == 0.0f && !signbit(y[i]));
    }
    CHECK(exact);
    double rate = (double) kept / N;
    CHECKF(fabs(rate - 0.7) < 0.03, "keep rate %g", rate);

    /* Backward: dx = dy * mask / (1 - p). */
    CHECK_OK(lowp_dropout_backward(mask, x, dx, N, p));
    int back = 1;
    for (size_t i = 0; i < N; i++) back &= dx[i] == (mask[i] ? x[i] * scale : 0.0f);
    CHECK(back);

    /* y aliasing x, no mask: the same values as the next draw would give. */
    lowp_rng_tracker a, b;
    CHECK_OK(lowp_rng_tracker_init(&a, 7));
    CHECK_OK(lowp_rng_tracker_init(&b, 7));
    memcpy(y2, x, sizeof x);
    CHECK_OK(lowp_dropout_forward(&a, y2, NULL, y2, N, 0.5f));
    CHECK_OK(lowp_dropout_forward(&b, x, mask, y, N, 0.5f));
    CHECK(memcmp(y, y2, sizeof y) == 0);

    /* p = 0 keeps everything unchanged; p = 1 drops everything. Both advance the offset. */
    CHECK_OK(lowp_dropout_forward(&a, x, mask, y, N, 0.0f));
    int all = 1;
    for (size_t i = 0; i < N; i++) all &= mask[i] == 1 && y[i] == x[i];
    CHECK(all);
    CHECK_OK(lowp_dropout_forward(&a, x, mask, y, N, 1.0f));
    int none = 1;
    for (size_t i = 0; i < N; i++) none &= mask[i] == 0 && y[i] == 0.0f;
    CHECK(none);
    CHECK(a.states[0].offset == 3 * (uint64_t) N);
    /* A NaN input that is dropped gives 0, not NaN. */
    float nan_x[8], nan_y[8];
    uint8_t m8[8];
    for (int i = 0; i < 8; i++) nan_x[i] = NAN;
    CHECK_OK(lowp_dropout_forward(&a, nan_x, m8, nan_y, 8, 0.5f));
    int nan_ok = 1;
    for (int i = 0; i < 8; i++) nan_ok &= m8[i] ? isnan(nan_y[i]) : nan_y[i] == 0.0f;
    CHECK(nan_ok);

    /* Errors. */
    CHECK_FAIL(lowp_dropout_forward(&a, x, mask, y, N, -0.1f), LOWP_ERR_INVALID_ARG,
               "p (-0.1) is not in [0, 1]");
    CHECK_FAIL(lowp_dropout_forward(&a, x, mask, y, N, 1.5f), LOWP_ERR_INVALID_ARG, "p (1.5)");
    CHECK_FAIL(lowp_dropout_forward(&a, x, mask, y, N, NAN), LOWP_ERR_INVALID_ARG, "p (nan)");
    CHECK_FAIL(lowp_dropout_forward(&a, NULL, mask, y, N, 0.1f), LOWP_ERR_INVALID_ARG, "x is NULL");
    CHECK_FAIL(lowp_dropout_forward(&a, x, mask, NULL, N, 0.1f), LOWP_ERR_INVALID_ARG, "y is NULL");
    CHECK_FAIL(lowp_dropout_forward(NULL, x, mask, y, N, 0.1f), LOWP_ERR_INVALID_ARG, "t is NULL");
    CHECK_FAIL(lowp_dropout_backward(NULL, x, dx, N, 0.1f), LOWP_ERR_INVALID_ARG, "mask is NULL");
    CHECK_FAIL(lowp_dropout_backward(mask, x, dx, N, 2.0f), LOWP_ERR_INVALID_ARG, "p (2)");
    CHECK(a.states[0].offset == 3 * (uint64_t) N + 8); /* refused calls drew nothing */
    CHECK_OK(lowp_dropout_forward(&a, NULL, NULL, NULL, 0, 0.1f));
}

/* Two tensor-parallel ranks: default seeds differ per rank, "model-parallel" is shared. */
static void test_tensor_parallel(void) {
    static float x[N], y0[N], y1[N];
    static uint8_t m0[N], m1[N], o0[N], o1[N];
    fill_x(x, N);
    lowp_rng_tracker rank[2];
    for (int r = 0; r < 2; r++) {
        CHECK_OK(lowp_rng_tracker_init(&rank[r], 1234 + (uint64_t) r));
        CHECK_OK(lowp_rng_tracker_add(&rank[r], "model-parallel", 99));
    }
    uint8_t *in_mask[2] = {m0, m1}, *out_mask[2] = {o0, o1};
    float *ys[2] = {y0, y1};
    for (int step = 0; step < 3; step++) {
        for (int r = 0; r < 2; r++) {
            /* Outside: the rank's own default state. */
            CHECK_OK(lowp_dropout_forward(&rank[r], x, out_mask[r], ys[r], N, 0.1f));
            int32_t prev;
            CHECK_OK(lowp_rng_tracker_fork(&rank[r], "model-parallel", &prev));
            CHECK_OK(lowp_dropout_forward(&rank[r], x, in_mask[r], ys[r], N, 0.1f));
            CHECK_OK(lowp_rng_tracker_restore(&rank[r], prev));
        }
        CHECKF(memcmp(m0, m1, N) == 0, "step %d: masks differ inside the forked region", step);
        CHECKF(memcmp(y0, y1, sizeof y0) == 0, "step %d: outputs differ inside", step);
        CHECKF(memcmp(o0, o1, N) != 0, "step %d: masks agree outside the forked region", step);
        size_t differ = 0;
        for (size_t i = 0; i < N; i++) differ += o0[i] != o1[i];
        CHECKF(differ > N / 20, "step %d: only %zu of %d outside elements differ", step, differ, N);
    }
    /* Each region's sequence moved on: step 2's inside mask is not step 0's. */
    CHECK(rank[0].states[1].offset == 3 * (uint64_t) N);
    CHECK(rank[0].states[0].offset == 3 * (uint64_t) N);
}

/* Activation recomputation: replaying a forward from saved states gives the same masks. */
static void test_recompute(void) {
    static float x[N], y[N], y_again[N];
    static uint8_t m_out[N], m_in[N], r_out[N], r_in[N];
    fill_x(x, N);
    lowp_rng_tracker t;
    CHECK_OK(lowp_rng_tracker_init(&t, 2024));
    CHECK_OK(lowp_rng_tracker_add(&t, "model-parallel", 77));
    CHECK_OK(lowp_dropout_forward(&t, x, m_out, y, 100, 0.2f)); /* earlier layers */

    lowp_rng_state saved[LOWP_RNG_MAX_STATES];
    int32_t n = 0;
    CHECK_OK(lowp_rng_tracker_get_states(&t, saved, LOWP_RNG_MAX_STATES, &n));
    /* The forward of the checkpointed block: one default-state and one forked dropout. */
    int32_t prev;
    CHECK_OK(lowp_dropout_forward(&t, x, m_out, y, N, 0.2f));
    CHECK_OK(lowp_rng_tracker_fork(&t, "model-parallel", &prev));
    CHECK_OK(lowp_dropout_forward(&t, y, m_in, y, N, 0.2f));
    CHECK_OK(lowp_rng_tracker_restore(&t, prev));
    lowp_rng_tracker after = t;
    /* Later layers draw more. */
    CHECK_OK(lowp_dropout_forward(&t, x, r_out, y_again, 500, 0.2f));

    /* Backward: rewind to the saved states, recompute, compare. */
    lowp_rng_state now[LOWP_RNG_MAX_STATES];
    int32_t n_now = 0;
    CHECK_OK(lowp_rng_tracker_get_states(&t, now, LOWP_RNG_MAX_STATES, &n_now));
    CHECK_OK(lowp_rng_tracker_set_states(&t, saved, n));
    CHECK_OK(lowp_dropout_forward(&t, x, r_out, y_again, N, 0.2f));
    CHECK_OK(lowp_rng_tracker_fork(&t, "model-parallel", &prev));
    CHECK_OK(lowp_dropout_forward(&t, y_again, r_in, y_again, N, 0.2f));
    CHECK_OK(lowp_rng_tracker_restore(&t, prev));
    CHECK(memcmp(m_out, r_out, N) == 0);
    CHECK(memcmp(m_in, r_in, N) == 0);
    CHECK(memcmp(y, y_again, sizeof y) == 0);
    CHECK(same_tracker(&t, &after)); /* the replay consumed exactly what the forward did */
    /* And back to where the run really was. */
    CHECK_OK(lowp_rng_tracker_set_states(&t, now, n_now));
    CHECK(t.states[0].offset == after.states[0].offset + 500);
}

int main(void) {
    test_draw_and_states();
    test_dropout_exact();
    test_tensor_parallel();
    test_recompute();
    return testutil_finish();
}
