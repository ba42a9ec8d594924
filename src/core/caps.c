/* Names of the capability bits: one table that lowp_caps_describe prints from and that
 * LOWP_CPU_DISABLE (src/cpu/caps.c) parses with, so the two spellings cannot drift apart. In
 * core, below both the CPU backend and the device registry, so that neither calls the other
 * for it. */
#include <stdio.h>
#include <strings.h>

#include "internal.h"
#include "lowp/device.h"

/* Indexed by bit number; NULL for bits that have no meaning yet. */
static const char *const k_cap_names[32] = {
    [0] = "avx512f",      [1] = "avx512bw",  [2] = "avx512vl",  [3] = "avx512_bf16",
    [4] = "avx512_fp16",  [5] = "amx_tile",  [6] = "amx_bf16",  [7] = "amx_permitted",
    [8] = "avx2",         [9] = "fma",       [10] = "avx512dq", [11] = "avx512_vbmi",
    [16] = "async_queue", [17] = "fp8_math", [18] = "mx_math",
};

uint32_t lowp_cap_from_name(const char *name, size_t len) {
    for (int bit = 0; bit < 32; bit++) {
        const char *n = k_cap_names[bit];
        if (n && strlen(n) == len && strncasecmp(n, name, len) == 0) return 1u << bit;
    }
    return 0;
}

lowp_status lowp_caps_describe(const lowp_caps *caps, char *buf, size_t buf_size) {
    LOWP_CHECK_PTR("lowp_caps_describe", caps);
    LOWP_CHECK_PTR("lowp_caps_describe", buf);
    if (buf_size == 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_caps_describe: buf_size (0) leaves no room");
    /* Keep counting past the end of buf so that the message can say how much is needed. */
    size_t len = 0;
    buf[0] = '\0';
    for (int bit = 0; bit < 32; bit++) {
        if (!(caps->flags & (1u << bit))) continue;
        char unknown[8];
        const char *n = k_cap_names[bit];
        if (!n) {
            /* A bit from a newer backend: show it rather than hide it. */
            snprintf(unknown, sizeof unknown, "bit%d", bit);
            n = unknown;
        }
        const char *sep = len ? " " : "";
        int w = snprintf(len < buf_size ? buf + len : NULL, len < buf_size ? buf_size - len : 0,
                         "%s%s", sep, n);
        len += (size_t) w;
    }
    if (len >= buf_size) {
        buf[buf_size - 1] = '\0';
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "lowp_caps_describe: buf_size (%zu) < needed (%zu) for flags 0x%x",
                         buf_size, len + 1, (unsigned) caps->flags);
    }
    return LOWP_OK;
}
