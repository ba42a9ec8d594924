/* A minimal test harness for lowp's C tests: CHECK macros that count, and a summary line
 * "N passed, M failed" that ctest's log shows; main returns testutil_finish(). */
#ifndef LOWP_TESTUTIL_H
#define LOWP_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/internal.h"
#include "lowp/delayed.h"
#include "lowp/status.h"

static int tu_passed, tu_failed;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (cond)                                                                                  \
            tu_passed++;                                                                           \
        else {                                                                                     \
            tu_failed++;                                                                           \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

/* Like CHECK, with a printf-style explanation on failure. */
#define CHECKF(cond, ...)                                                                          \
    do {                                                                                           \
        if (cond)                                                                                  \
            tu_passed++;                                                                           \
        else {                                                                                     \
            tu_failed++;                                                                           \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

static inline int testutil_finish(void) {
    printf("%d passed, %d failed\n", tu_passed, tu_failed);
    return tu_failed ? 1 : 0;
}

/* A lowp call that must succeed (the message is printed when it does not). */
#define CHECK_OK(call) CHECKF((call) == LOWP_OK, "%s", lowp_last_error())

/* A lowp call that must fail with `want` and leave a message containing `has`. */
#define CHECK_FAIL(call, want, has)                                                                \
    do {                                                                                           \
        lowp_clear_error();                                                                        \
        lowp_status got_ = (call);                                                                 \
        CHECKF(got_ == (want) && strstr(lowp_last_error(), (has)) != NULL,                         \
               "got %s, want %s; message \"%s\" should contain \"%s\"", lowp_status_str(got_),     \
               lowp_status_str(want), lowp_last_error(), (has));                                   \
    } while (0)

/* The binary32 bit pattern of a float and back (the library's own, src/core/internal.h). */
static inline uint32_t f2u(float f) {
    return lowp_f2u(f);
}
static inline float u2f(uint32_t u) {
    return lowp_u2f(u);
}

/* LOWP_TEST_QUICK=1 (the sanitizer run) asks for smaller sizes. */
static inline int testutil_quick(void) {
    const char *q = getenv("LOWP_TEST_QUICK");
    return q && q[0] == '1';
}

/* ---- pseudo-random numbers ----------------------------------------------------------------
 * One state per test program (each test file is its own program), set by tu_seed() at the
 * start of main; each file keeps the seed it always had, so its data are unchanged. Two
 * generators share the state: a file uses one of them. */
static uint64_t tu_rng = 0x9E3779B97F4A7C15ull;

static inline void tu_seed(uint64_t seed) {
    tu_rng = seed;
}

/* Marsaglia's xorshift64 (13, 7, 17): the next state, and numbers made from it. */
static inline uint64_t xorshift64(void) {
    tu_rng ^= tu_rng << 13;
    tu_rng ^= tu_rng >> 7;
    tu_rng ^= tu_rng << 17;
    return tu_rng;
}
static inline uint32_t xorshift32(void) {
    return (uint32_t) (xorshift64() >> 16);
}
/* Uniform in [0, 1), 53 bits. */
static inline double urand(void) {
    return (double) (xorshift64() >> 11) / 9007199254740992.0;
}
/* Standard normal (Box-Muller, the cosine half). */
static inline float gauss(void) {
    double u = urand() + 1e-300, v = urand();
    return (float) (sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* SplitMix64, and numbers made from it. */
static inline uint64_t rnd64(void) {
    uint64_t z = (tu_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline uint32_t rnd32(void) {
    return (uint32_t) (rnd64() >> 32);
}
/* Uniform in [0, n). */
static inline uint32_t rnd_below(uint32_t n) {
    return (uint32_t) (((rnd64() >> 32) * n) >> 32);
}

/* A delayed-scaling configuration for E4M3 with the given history, margin and algorithm. */
static inline lowp_delayed_cfg delayed_cfg(int32_t len, float margin, lowp_amax_algo algo) {
    lowp_delayed_cfg c;
    lowp_delayed_cfg_init(&c, LOWP_FORMAT_E4M3);
    c.history_len = len;
    c.margin = margin;
    c.algo = algo;
    return c;
}

/* ---- time ---- */
static inline double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) t.tv_sec + 1e-9 * (double) t.tv_nsec;
}

/* |got - want| in units of (ulp(want) + abs_ulp): a binary32 result against the binary64 value
 * it approximates, abs_ulp covering a formula's own absolute rounding (a cancellation). */
static inline double testutil_err_units(float got, double want, double abs_ulp) {
    const double a = fabs(want) > 0x1p-126 ? fabs(want) : 0x1p-126;
    return fabs((double) got - want) / (ldexp(1.0, ilogb(a) - 23) + abs_ulp);
}

#endif
