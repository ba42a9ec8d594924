/* A minimal test harness for lowp's C tests: CHECK macros that count, and a summary line
 * "N passed, M failed" that ctest's log shows; main returns testutil_finish(). */
#ifndef LOWP_TESTUTIL_H
#define LOWP_TESTUTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
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

#endif
