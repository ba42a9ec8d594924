/* Library-internal helpers shared by every layer: error reporting and bit casts.
 * Not installed; nothing here is part of the ABI. */
#ifndef LOWP_INTERNAL_H
#define LOWP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "lowp/status.h"

#if defined(__GNUC__)
#define LOWP_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define LOWP_HIDDEN       __attribute__((visibility("hidden")))
#else
#define LOWP_PRINTF(a, b)
#define LOWP_HIDDEN
#endif

/* Record "fmt..." as this thread's last error and return `status`. Messages name the
 * function, the argument and the bad value: lowp_fail(LOWP_ERR_INVALID_ARG,
 * "lowp_cast: dst.rows (%lld) != src.rows (%lld)", ...). */
LOWP_HIDDEN lowp_status lowp_fail(lowp_status status, const char *fmt, ...) LOWP_PRINTF(2, 3);

/* Append "; fmt..." to the last error (for adding context on the way up). */
LOWP_HIDDEN void lowp_error_append(const char *fmt, ...) LOWP_PRINTF(1, 2);

static inline uint32_t lowp_f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float lowp_u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#define LOWP_CHECK_PTR(fn, p)                                                                      \
    do {                                                                                           \
        if ((p) == NULL) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s is NULL", fn, #p);         \
    } while (0)

#endif
