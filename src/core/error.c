/* Status strings and the thread-local last-error message. */
#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

#define LOWP_ERROR_CAP 1024

static _Thread_local char g_last_error[LOWP_ERROR_CAP];

const char *lowp_status_str(lowp_status status) {
    switch (status) {
    case LOWP_OK: return "LOWP_OK: success";
    case LOWP_ERR_INVALID_ARG: return "LOWP_ERR_INVALID_ARG: invalid argument";
    case LOWP_ERR_UNSUPPORTED: return "LOWP_ERR_UNSUPPORTED: unsupported";
    case LOWP_ERR_OUT_OF_MEMORY: return "LOWP_ERR_OUT_OF_MEMORY: out of memory";
    case LOWP_ERR_DEVICE: return "LOWP_ERR_DEVICE: device failure";
    case LOWP_ERR_IO: return "LOWP_ERR_IO: input/output error";
    case LOWP_ERR_CORRUPT: return "LOWP_ERR_CORRUPT: corrupt or truncated data";
    case LOWP_ERR_VERSION: return "LOWP_ERR_VERSION: version mismatch";
    case LOWP_ERR_NOT_FOUND: return "LOWP_ERR_NOT_FOUND: not found";
    case LOWP_ERR_INTERNAL: return "LOWP_ERR_INTERNAL: internal error";
    case LOWP_ERR_DIVERGED: return "LOWP_ERR_DIVERGED: training diverged";
    }
    return "LOWP_ERR_UNKNOWN: unknown status";
}

const char *lowp_last_error(void) {
    return g_last_error;
}

void lowp_clear_error(void) {
    g_last_error[0] = '\0';
}

lowp_status lowp_fail(lowp_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
    return status;
}

void lowp_error_append(const char *fmt, ...) {
    size_t len = strlen(g_last_error);
    if (len + 3 >= sizeof g_last_error) return;
    if (len > 0) {
        g_last_error[len++] = ';';
        g_last_error[len++] = ' ';
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error + len, sizeof g_last_error - len, fmt, ap);
    va_end(ap);
}

const char *lowp_version(void) {
    return LOWP_VERSION_STRING;
}
