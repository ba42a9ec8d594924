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

/* Host buffers (hostmem.c): 64-byte aligned; from LOWP_HUGE_MIN bytes up 2 MiB aligned and
 * advised for transparent huge pages (unless LOWP_HUGEPAGES=0). NULL when out of memory;
 * release with free() or lowp_host_free. lowp_host_zalloc zeroes the nbytes. */
#define LOWP_HUGE_MIN ((size_t) 4 << 20)
LOWP_HIDDEN void *lowp_host_alloc(size_t nbytes);
LOWP_HIDDEN void *lowp_host_zalloc(size_t nbytes);
/* Releases a buffer of lowp_host_alloc (or of malloc) into the cache of released blocks from
 * LOWP_HOST_CACHE_MIN bytes up, for the next lowp_host_alloc of about its size; smaller
 * blocks, and those the cache has no room for, are freed. For buffers that live for one call
 * or one update. NULL is ignored. The public lowp_host_empty_cache frees every cached block
 * (lowp_model_free calls it, so that freeing a model gives its updates' blocks back);
 * lowp_host_cache_bytes is what the cache holds. */
#define LOWP_HOST_CACHE_MIN ((size_t) 256 << 10)
LOWP_HIDDEN void lowp_host_free(void *p);
/* Whether the environment leaves the huge-page advice on (LOWP_HUGEPAGES is not "0"). */
LOWP_HIDDEN int lowp_hugepages_enabled(void);

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

/* Checked size arithmetic: 1 and *out = a * b (or a + b) when it fits, else 0.
 * Every buffer size computed from a caller's shape goes through these. */
static inline int lowp_mul_size(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline int lowp_add_size(size_t a, size_t b, size_t *out) {
    return !__builtin_add_overflow(a, b, out);
}
/* ceil(n / d) for n >= 0, d > 0, without the overflow of (n + d - 1) / d near INT64_MAX. */
static inline int64_t lowp_cdiv64(int64_t n, int64_t d) {
    return n / d + (n % d != 0);
}

/* LOWP_OVERFLOW_DEFAULT made concrete for `format` (format.h); other values unchanged. */
LOWP_HIDDEN int lowp_overflow_resolve(int format, int overflow);

/* The checks of a lowp_delayed_cfg's history_len, margin and algo (src/core/delayed.c), for
 * every function that takes one; `arg` names it in messages ("cfg", "cfg.delayed"). */
struct lowp_delayed_cfg;
LOWP_HIDDEN lowp_status lowp_delayed_cfg_check(const char *fn, const char *arg,
                                               const struct lowp_delayed_cfg *cfg);

/* The LOWP_CAP_* bit called `name` (the first `len` characters; lowp_caps_describe's
 * spelling, case-insensitive), or 0 when there is none (src/core/caps.c). */
LOWP_HIDDEN uint32_t lowp_cap_from_name(const char *name, size_t len);

#define LOWP_CHECK_PTR(fn, p)                                                                      \
    do {                                                                                           \
        if ((p) == NULL) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s is NULL", fn, #p);         \
    } while (0)

#endif
