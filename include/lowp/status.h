/* lowp status codes and the thread-local error message. Implemented in src/core/error.c.
 *
 * Every public lowp function reports through a lowp_status. On failure the library also
 * leaves a one-line message in a thread-local buffer that names the function, the argument
 * and the bad value, e.g. "lowp_cast: dst.rows (3) != src.rows (4)".
 *
 *   lowp_status st = lowp_cast(&src, &dst, &cfg);
 *   if (st != LOWP_OK) fprintf(stderr, "%s: %s\n", lowp_status_str(st), lowp_last_error());
 *
 * The library never exits, aborts or prints to stdout.
 */
#ifndef LOWP_STATUS_H
#define LOWP_STATUS_H

#include "deprecated.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define LOWP_API __declspec(dllexport)
#else
#define LOWP_API __attribute__((visibility("default")))
#endif

typedef enum lowp_status {
    LOWP_OK = 0,
    LOWP_ERR_INVALID_ARG = 1, /* a null pointer, a bad shape, a value out of range */
    LOWP_ERR_UNSUPPORTED = 2, /* valid request that this backend/format/path cannot do */
    LOWP_ERR_OUT_OF_MEMORY = 3,
    LOWP_ERR_DEVICE = 4,    /* a backend reported a failure */
    LOWP_ERR_IO = 5,        /* a file could not be read or written */
    LOWP_ERR_CORRUPT = 6,   /* a file or blob is truncated or malformed */
    LOWP_ERR_VERSION = 7,   /* an ABI or file version mismatch */
    LOWP_ERR_NOT_FOUND = 8, /* no such backend, device, name or symbol */
    LOWP_ERR_INTERNAL = 9,
    LOWP_ERR_DIVERGED = 10, /* training met a non-finite loss, gradient streak or state */
} lowp_status;

/* A short constant name for a status ("LOWP_ERR_INVALID_ARG: invalid argument"). */
LOWP_API const char *lowp_status_str(lowp_status status);

/* The message of the last failure on this thread ("" when none). The pointer stays valid
 * until the next lowp call on the same thread. */
LOWP_API const char *lowp_last_error(void);

/* Forget the last message on this thread. */
LOWP_API void lowp_clear_error(void);

/* The library version, "MAJOR.MINOR.PATCH". */
LOWP_API const char *lowp_version(void);

#ifdef __cplusplus
}
#endif
#endif
