/* The RNG tracker (rng.h): named Philox (seed, offset) states, fork/restore of the current one,
 * get/set of all of them, and inverted dropout drawing from the current state.
 *
 * All randomness is Philox words addressed by (seed, word index) (docs/numerics.md section 7), so a
 * state is just where the next word is: saving and restoring it replays the same masks
 * (activation recomputation), and two ranks that hold the same named state draw the same
 * masks inside a forked region while their default states stay apart. */
#include <math.h>
#include <string.h>

#include "core/internal.h"
#include "core/philox.h"
#include "lowp/rng_tracker.h"

static lowp_status check_tracker(const char *fn, const lowp_rng_tracker *t) {
    LOWP_CHECK_PTR(fn, t);
    if (t->count < 1 || t->count > LOWP_RNG_MAX_STATES || t->current < 0 || t->current >= t->count)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: t is not an initialized tracker (count %d, current %d)", fn,
                         (int) t->count, (int) t->current);
    return LOWP_OK;
}

static int32_t find_name(const lowp_rng_tracker *t, const char *name) {
    for (int32_t i = 0; i < t->count; i++)
        if (strncmp(t->states[i].name, name, LOWP_RNG_NAME_MAX) == 0) return i;
    return -1;
}

lowp_status lowp_rng_tracker_init(lowp_rng_tracker *t, uint64_t seed) {
    LOWP_CHECK_PTR("lowp_rng_tracker_init", t);
    memset(t, 0, sizeof *t);
    memcpy(t->states[0].name, "default", sizeof "default");
    t->states[0].seed = seed;
    t->count = 1;
    t->current = 0;
    return LOWP_OK;
}

lowp_status lowp_rng_tracker_add(lowp_rng_tracker *t, const char *name, uint64_t seed) {
    const char *fn = "lowp_rng_tracker_add";
    lowp_status s = check_tracker(fn, t);
    if (s != LOWP_OK) return s;
    LOWP_CHECK_PTR(fn, name);
    size_t len = strnlen(name, LOWP_RNG_NAME_MAX);
    if (len == 0 || len >= LOWP_RNG_NAME_MAX)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: name (\"%.*s%s\") must have 1 to %d characters",
                         fn, LOWP_RNG_NAME_MAX - 1, name, len ? "..." : "", LOWP_RNG_NAME_MAX - 1);
    if (find_name(t, name) >= 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: name (\"%s\") is already a state", fn, name);
    /* Two states with one seed would draw the same words: the independence a named state
     * exists for would be silently lost. */
    for (int32_t i = 0; i < t->count; i++)
        if (t->states[i].seed == seed)
            return lowp_fail(LOWP_ERR_INVALID_ARG,
                             "%s: seed (%llu) of \"%s\" is already used by state \"%s\"", fn,
                             (unsigned long long) seed, name, t->states[i].name);
    if (t->count >= LOWP_RNG_MAX_STATES)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: the tracker is full (%d states) for \"%s\"", fn,
                         LOWP_RNG_MAX_STATES, name);
    lowp_rng_state *n = &t->states[t->count];
    memset(n, 0, sizeof *n);
    memcpy(n->name, name, len);
    n->seed = seed;
    n->offset = 0;
    t->count++;
    return LOWP_OK;
}

lowp_status lowp_rng_tracker_fork(lowp_rng_tracker *t, const char *name, int32_t *prev) {
    const char *fn = "lowp_rng_tracker_fork";
    lowp_status s = check_tracker(fn, t);
    if (s != LOWP_OK) return s;
    LOWP_CHECK_PTR(fn, name);
    LOWP_CHECK_PTR(fn, prev);
    int32_t i = find_name(t, name);
    if (i < 0)
        return lowp_fail(LOWP_ERR_NOT_FOUND, "%s: name (\"%.*s\") is not a state of the tracker",
                         fn, LOWP_RNG_NAME_MAX, name);
    *prev = t->current;
    t->current = i;
    return LOWP_OK;
}

lowp_status lowp_rng_tracker_restore(lowp_rng_tracker *t, int32_t prev) {
    const char *fn = "lowp_rng_tracker_restore";
    lowp_status s = check_tracker(fn, t);
    if (s != LOWP_OK) return s;
    if (prev < 0 || prev >= t->count)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: prev (%d) is not in [0, %d)", fn, (int) prev,
                         (int) t->count);
    t->current = prev;
    return LOWP_OK;
}

/* Like lowp_backend_list: up to cap states copied, *n the full count (the caller compares). */
lowp_status lowp_rng_tracker_get_states(const lowp_rng_tracker *t, lowp_rng_state *out, int32_t cap,
                                        int32_t *n) {
    const char *fn = "lowp_rng_tracker_get_states";
    lowp_status s = check_tracker(fn, t);
    if (s != LOWP_OK) return s;
    LOWP_CHECK_PTR(fn, n);
    if (cap < 0) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cap (%d) < 0", fn, (int) cap);
    if (cap > 0) LOWP_CHECK_PTR(fn, out);
    int32_t m = cap < t->count ? cap : t->count;
    for (int32_t i = 0; i < m; i++) out[i] = t->states[i];
    *n = t->count;
    return LOWP_OK;
}

/* Every state gets its (seed, offset) back by name; in any order, each name once. All
 * checks come first, so a refused set changes nothing. */
lowp_status lowp_rng_tracker_set_states(lowp_rng_tracker *t, const lowp_rng_state *in, int32_t n) {
    const char *fn = "lowp_rng_tracker_set_states";
    lowp_status s = check_tracker(fn, t);
    if (s != LOWP_OK) return s;
    if (n != t->count)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: n (%d) != the tracker's state count (%d)", fn,
                         (int) n, (int) t->count);
    LOWP_CHECK_PTR(fn, in);
    int32_t where[LOWP_RNG_MAX_STATES];
    int seen[LOWP_RNG_MAX_STATES] = {0};
    for (int32_t i = 0; i < n; i++) {
        int32_t j = -1;
        if (memchr(in[i].name, '\0', LOWP_RNG_NAME_MAX)) j = find_name(t, in[i].name);
        if (j < 0)
            return lowp_fail(LOWP_ERR_INVALID_ARG,
                             "%s: in[%d].name (\"%.*s\") is not a state of the tracker", fn,
                             (int) i, LOWP_RNG_NAME_MAX, in[i].name);
        if (seen[j])
            return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: in[%d].name (\"%s\") appears twice", fn,
                             (int) i, in[i].name);
        seen[j] = 1;
        where[i] = j;
        for (int32_t k = 0; k < i; k++)
            if (in[k].seed == in[i].seed)
                return lowp_fail(LOWP_ERR_INVALID_ARG,
                                 "%s: in[%d].seed (%llu) is also the seed of in[%d] (\"%s\")", fn,
                                 (int) i, (unsigned long long) in[i].seed, (int) k, in[k].name);
    }
    for (int32_t i = 0; i < n; i++) {
        t->states[where[i]].seed = in[i].seed;
        t->states[where[i]].offset = in[i].offset;
    }
    return LOWP_OK;
}

/* The current state's next n words, or an error when its offset would wrap. */
static lowp_status take(const char *fn, lowp_rng_tracker *t, size_t n, uint64_t *first) {
    lowp_rng_state *c = &t->states[t->current];
    if ((uint64_t) n > UINT64_MAX - c->offset)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: n (%zu) words from offset %llu of state \"%s\" pass 2^64", fn, n,
                         (unsigned long long) c->offset, c->name);
    *first = c->offset;
    c->offset += n;
    return LOWP_OK;
}

/* Words first .. first + n - 1 of `seed`, one Philox block per four words. */
static void words(uint64_t seed, uint64_t first, size_t n, void (*use)(void *, size_t, uint32_t),
                  void *arg) {
    const uint32_t key[2] = {(uint32_t) seed, (uint32_t) (seed >> 32)};
    uint32_t blk[4];
    uint64_t have = UINT64_MAX; /* block index held in blk */
    for (size_t i = 0; i < n; i++) {
        const uint64_t j = first + i, b = j >> 2;
        if (b != have) {
            const uint32_t ctr[4] = {(uint32_t) b, (uint32_t) (b >> 32), 0, 0};
            lowp_philox_block(ctr, key, blk);
            have = b;
        }
        use(arg, i, blk[j & 3]);
    }
}

static void store_word(void *arg, size_t i, uint32_t w) {
    ((uint32_t *) arg)[i] = w;
}

lowp_status lowp_rng_tracker_draw(lowp_rng_tracker *t, uint32_t *out, size_t n) {
    const char *fn = "lowp_rng_tracker_draw";
    lowp_status s = check_tracker(fn, t);
    if (s != LOWP_OK || n == 0) return s;
    LOWP_CHECK_PTR(fn, out);
    uint64_t first = 0;
    if ((s = take(fn, t, n, &first)) != LOWP_OK) return s;
    words(t->states[t->current].seed, first, n, store_word, out);
    return LOWP_OK;
}

static lowp_status check_p(const char *fn, float p) {
    if (!(p >= 0.0f && p <= 1.0f))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: p (%g) is not in [0, 1]", fn, (double) p);
    return LOWP_OK;
}

/* 1 / (1 - p), the factor of the kept elements; p = 1 keeps none, so the factor is unused. */
static float keep_scale(float p) {
    return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
}

typedef struct dropout_arg {
    const float *x;
    uint8_t *mask;
    float *y;
    double threshold; /* p * 2^32, exact in binary64 */
    float scale;
} dropout_arg;

/* Dropped elements become exactly 0 (not x * 0, which would keep a NaN or Inf of x). */
static void dropout_one(void *arg, size_t i, uint32_t w) {
    dropout_arg *a = arg;
    const int keep = (double) w >= a->threshold;
    const float xi = a->x[i];
    if (a->mask) a->mask[i] = (uint8_t) keep;
    a->y[i] = keep ? xi * a->scale : 0.0f;
}

lowp_status lowp_dropout_forward(lowp_rng_tracker *t, const float *x, uint8_t *mask, float *y,
                                 size_t n, float p) {
    const char *fn = "lowp_dropout_forward";
    lowp_status s = check_tracker(fn, t);
    if (s == LOWP_OK) s = check_p(fn, p);
    if (s != LOWP_OK || n == 0) return s;
    LOWP_CHECK_PTR(fn, x);
    LOWP_CHECK_PTR(fn, y);
    uint64_t first = 0;
    if ((s = take(fn, t, n, &first)) != LOWP_OK) return s;
    dropout_arg a = {x, mask, y, ldexp((double) p, 32), keep_scale(p)};
    words(t->states[t->current].seed, first, n, dropout_one, &a);
    return LOWP_OK;
}

lowp_status lowp_dropout_backward(const uint8_t *mask, const float *dy, float *dx, size_t n,
                                  float p) {
    const char *fn = "lowp_dropout_backward";
    lowp_status s = check_p(fn, p);
    if (s != LOWP_OK || n == 0) return s;
    LOWP_CHECK_PTR(fn, mask);
    LOWP_CHECK_PTR(fn, dy);
    LOWP_CHECK_PTR(fn, dx);
    const float scale = keep_scale(p);
    for (size_t i = 0; i < n; i++) dx[i] = mask[i] ? dy[i] * scale : 0.0f;
    return LOWP_OK;
}
