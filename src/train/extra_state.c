/* Extra-state checkpoints (checkpoint.h): the FP8 delayed-scaling state of a module as a
 * versioned little-endian blob with a CRC-32.
 *
 * Every field is written and read byte by byte with shifts, so the blob is the same on any
 * host, whatever its byte order or struct padding. A load parses and validates the whole blob
 * into temporaries before it touches the module: a truncated or corrupt blob is reported and
 * the state stays exactly as it was.
 *
 * What the module's recipe decides wins over the blob: the history length (a blob with another
 * length is padded or truncated), the margin and the amax algorithm (the blob's are validated,
 * then ignored, so that a run may resume with a tuned recipe). The element formats must match,
 * because a scale is only meaningful for the format whose fmax made it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "train_internal.h"

#define XST_MAGIC        "LOWPXST1"
#define XST_HEAD_BYTES   16u /* magic, version, payload bytes */
#define XST_FIXED_BYTES  16u /* role count, history length, margin, algorithm */
#define XST_CRC_BYTES    4u
#define XST_ROLES_OFFSET 32u /* the formats; the role records follow them */

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char) v;
    p[1] = (unsigned char) (v >> 8);
    p[2] = (unsigned char) (v >> 16);
    p[3] = (unsigned char) (v >> 24);
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24;
}

/* CRC-32 as zlib's crc32: polynomial 0x04C11DB7 reflected (0xEDB88320), initial value and
 * final xor 0xFFFFFFFF. Bitwise: blobs are small and a table would need setup or a literal. */
static uint32_t crc32_ieee(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return c ^ 0xFFFFFFFFu;
}

/* Payload bytes (after the 16-byte head, before the CRC) for history length L. In 64 bits: a
 * corrupt blob may claim L up to 2^32 - 1. */
static uint64_t payload_bytes(uint64_t history_len) {
    return XST_FIXED_BYTES + 4u * LOWP_ROLE_COUNT + 4u * LOWP_ROLE_COUNT * (history_len + 1u);
}

static lowp_status check_state(const char *fn, const lowp_fp8_state *st) {
    LOWP_CHECK_PTR(fn, st);
    if (!st->host_buf || !st->dev_buf || st->history_len < 1)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: st is not an initialized state", fn);
    return LOWP_OK;
}

lowp_status lowp_fp8_state_blob_size(const lowp_fp8_state *st, size_t *len) {
    const char *fn = "lowp_fp8_state_blob_size";
    lowp_status s = check_state(fn, st);
    if (s != LOWP_OK) return s;
    LOWP_CHECK_PTR(fn, len);
    *len = (size_t) (XST_HEAD_BYTES + payload_bytes((uint64_t) st->history_len) + XST_CRC_BYTES);
    return LOWP_OK;
}

lowp_status lowp_fp8_state_save(lowp_fp8_state *st, void *blob, size_t cap, size_t *len) {
    const char *fn = "lowp_fp8_state_save";
    size_t need = 0;
    lowp_status s = check_state(fn, st);
    if (s != LOWP_OK) return s;
    LOWP_CHECK_PTR(fn, len);
    lowp_fp8_state_blob_size(st, &need);
    *len = need; /* also on a short buffer: the caller learns the size to allocate */
    if (cap < need)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cap (%zu) < the blob's size (%zu)", fn, cap,
                         need);
    LOWP_CHECK_PTR(fn, blob);
    /* The device copy is the state of record: wait for the work queued on the state's device
     * (and only that device) and read it back before serializing. */
    if ((s = lowp_fp8_state_pull(st)) != LOWP_OK) {
        lowp_error_append("%s: reading the state from its device", fn);
        return s;
    }
    unsigned char *p = blob;
    const uint32_t L = (uint32_t) st->history_len;
    memcpy(p, XST_MAGIC, 8);
    put_u32(p + 8, LOWP_EXTRA_STATE_VERSION);
    put_u32(p + 12, (uint32_t) payload_bytes(L));
    put_u32(p + 16, LOWP_ROLE_COUNT);
    put_u32(p + 20, L);
    put_u32(p + 24, lowp_f2u(st->roles[0].cfg.margin));
    put_u32(p + 28, (uint32_t) st->roles[0].cfg.algo);
    size_t off = XST_ROLES_OFFSET;
    for (int r = 0; r < LOWP_ROLE_COUNT; r++, off += 4)
        put_u32(p + off, (uint32_t) st->roles[r].cfg.format);
    for (int r = 0; r < LOWP_ROLE_COUNT; r++) {
        for (uint32_t i = 0; i < L; i++, off += 4)
            put_u32(p + off, lowp_f2u(st->roles[r].history[i]));
        put_u32(p + off, lowp_f2u(st->roles[r].scale));
        off += 4;
    }
    put_u32(p + off, crc32_ieee(p, off));
    return LOWP_OK;
}

/* Validate the blob completely. On success *hist_out (malloc'd, LOWP_ROLE_COUNT x
 * st->history_len floats, padded or truncated) and scales[] hold the state to install. */
static lowp_status parse(const char *fn, const lowp_fp8_state *st, const unsigned char *p,
                         size_t len, float **hist_out, float scales[LOWP_ROLE_COUNT]) {
    const size_t min_len = XST_HEAD_BYTES + XST_CRC_BYTES;
    if (len < min_len)
        return lowp_fail(LOWP_ERR_CORRUPT, "%s: len (%zu) < %zu: the blob is truncated", fn, len,
                         min_len);
    if (memcmp(p, XST_MAGIC, 8) != 0)
        return lowp_fail(LOWP_ERR_CORRUPT, "%s: bad magic (the blob does not start with \"%s\")",
                         fn, XST_MAGIC);
    const uint32_t version = get_u32(p + 8);
    /* Version 1 is the only one so far; later versions keep a branch for each older one. */
    if (version != 1u)
        return lowp_fail(version > LOWP_EXTRA_STATE_VERSION ? LOWP_ERR_VERSION : LOWP_ERR_CORRUPT,
                         "%s: version (%u) is not one this library reads (1 to %u)", fn,
                         (unsigned) version, (unsigned) LOWP_EXTRA_STATE_VERSION);
    const uint32_t payload = get_u32(p + 12);
    if ((uint64_t) XST_HEAD_BYTES + payload + XST_CRC_BYTES != (uint64_t) len)
        return lowp_fail(LOWP_ERR_CORRUPT,
                         "%s: payload bytes (%u) + %u != len (%zu): the blob is truncated or "
                         "has trailing bytes",
                         fn, (unsigned) payload, XST_HEAD_BYTES + XST_CRC_BYTES, len);
    const uint32_t crc = get_u32(p + len - XST_CRC_BYTES),
                   want = crc32_ieee(p, len - XST_CRC_BYTES);
    if (crc != want)
        return lowp_fail(LOWP_ERR_CORRUPT, "%s: CRC-32 (0x%08x) != computed (0x%08x)", fn,
                         (unsigned) crc, (unsigned) want);
    if (payload < XST_FIXED_BYTES)
        return lowp_fail(LOWP_ERR_CORRUPT, "%s: payload bytes (%u) < %u", fn, (unsigned) payload,
                         XST_FIXED_BYTES);
    const uint32_t roles = get_u32(p + 16), L = get_u32(p + 20);
    if (roles != LOWP_ROLE_COUNT)
        return lowp_fail(LOWP_ERR_CORRUPT, "%s: role count (%u) != %d", fn, (unsigned) roles,
                         LOWP_ROLE_COUNT);
    if (L < 1) return lowp_fail(LOWP_ERR_CORRUPT, "%s: history length (%u) < 1", fn, (unsigned) L);
    if (payload_bytes(L) != payload)
        return lowp_fail(LOWP_ERR_CORRUPT, "%s: payload bytes (%u) != %llu for history length %u",
                         fn, (unsigned) payload, (unsigned long long) payload_bytes(L),
                         (unsigned) L);
    const float margin = lowp_u2f(get_u32(p + 24));
    if (!isfinite(margin))
        return lowp_fail(LOWP_ERR_CORRUPT, "%s: margin (%g) is not finite", fn, (double) margin);
    const uint32_t algo = get_u32(p + 28);
    if (algo != LOWP_AMAX_ALGO_MAX && algo != LOWP_AMAX_ALGO_MOST_RECENT)
        return lowp_fail(LOWP_ERR_CORRUPT,
                         "%s: amax algorithm (%u) is not 0 (max) or 1 (most_recent)", fn,
                         (unsigned) algo);
    for (int r = 0; r < LOWP_ROLE_COUNT; r++) {
        const uint32_t f = get_u32(p + XST_ROLES_OFFSET + 4u * (uint32_t) r);
        if (f != LOWP_FORMAT_E4M3 && f != LOWP_FORMAT_E5M2)
            return lowp_fail(LOWP_ERR_CORRUPT,
                             "%s: format of role %d (%u) is not e4m3 (%d) or e5m2 (%d)", fn, r,
                             (unsigned) f, LOWP_FORMAT_E4M3, LOWP_FORMAT_E5M2);
        if (f != (uint32_t) st->roles[r].cfg.format)
            return lowp_fail(LOWP_ERR_INVALID_ARG,
                             "%s: format of role %d in the blob (%u) != the module's (%d)", fn, r,
                             (unsigned) f, (int) st->roles[r].cfg.format);
    }
    /* The values: amaxes are >= 0 or NaN (record stores |amax|; NaN sticks), scales finite
     * and > 0 (the update never makes another). */
    const unsigned char *rec = p + XST_ROLES_OFFSET + 4u * LOWP_ROLE_COUNT;
    for (int r = 0; r < LOWP_ROLE_COUNT; r++) {
        const unsigned char *q = rec + (size_t) r * 4u * ((size_t) L + 1u);
        for (uint32_t i = 0; i < L; i++) {
            const float a = lowp_u2f(get_u32(q + 4u * (size_t) i));
            if (a < 0.0f)
                return lowp_fail(LOWP_ERR_CORRUPT, "%s: amax history of role %d, row %u (%g) < 0",
                                 fn, r, (unsigned) i, (double) a);
        }
        const float sc = lowp_u2f(get_u32(q + 4u * (size_t) L));
        if (!isfinite(sc) || !(sc > 0.0f))
            return lowp_fail(LOWP_ERR_CORRUPT, "%s: scale of role %d (%g) is not finite and > 0",
                             fn, r, (double) sc);
        scales[r] = sc;
    }

    /* Into the module's history length: row 0 (this step's staging row) stays row 0; rows
     * 1.. hold the past steps oldest first (the update rolls the newest into the last row), so
     * the most recent rows are aligned at the end and the oldest are dropped or zero-padded. */
    const size_t Lm = (size_t) st->history_len;
    float *hist = calloc((size_t) LOWP_ROLE_COUNT * Lm, sizeof(float));
    if (!hist)
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu floats", fn,
                         (size_t) LOWP_ROLE_COUNT * Lm);
    const size_t keep = (Lm < L ? Lm : L) - 1; /* past rows that fit */
    for (int r = 0; r < LOWP_ROLE_COUNT; r++) {
        const unsigned char *q = rec + (size_t) r * 4u * ((size_t) L + 1u);
        float *h = hist + (size_t) r * Lm;
        h[0] = lowp_u2f(get_u32(q));
        for (size_t k = 1; k <= keep; k++) h[Lm - k] = lowp_u2f(get_u32(q + 4u * (L - k)));
    }
    *hist_out = hist;
    return LOWP_OK;
}

lowp_status lowp_fp8_state_load(lowp_fp8_state *st, const void *blob, size_t len) {
    const char *fn = "lowp_fp8_state_load";
    lowp_status s = check_state(fn, st);
    if (s != LOWP_OK) return s;
    if (len > 0) LOWP_CHECK_PTR(fn, blob);
    if (len == 0)
        return lowp_fail(LOWP_ERR_CORRUPT,
                         "%s: len is 0 (the empty blob of a stateless module), but this module "
                         "has delayed-scaling state",
                         fn);
    float *hist = NULL, scales[LOWP_ROLE_COUNT];
    if ((s = parse(fn, st, blob, len, &hist, scales)) != LOWP_OK) return s;

    /* Keep the current mirror, to put it back if the device refuses the new state. */
    const size_t L = (size_t) st->history_len;
    float *old = malloc((size_t) LOWP_ROLE_COUNT * L * sizeof(float));
    if (!old) {
        free(hist);
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu floats", fn,
                         (size_t) LOWP_ROLE_COUNT * L);
    }
    float old_scale[LOWP_ROLE_COUNT], old_inv[LOWP_ROLE_COUNT];
    for (int r = 0; r < LOWP_ROLE_COUNT; r++) {
        memcpy(old + (size_t) r * L, st->roles[r].history, L * sizeof(float));
        old_scale[r] = st->roles[r].scale;
        old_inv[r] = st->roles[r].scale_inv;
        memcpy(st->roles[r].history, hist + (size_t) r * L, L * sizeof(float));
        st->roles[r].scale = scales[r];
        st->roles[r].scale_inv = 1.0f / scales[r]; /* derived, never stored */
    }
    free(hist);
    /* On the module's own device, finished before returning: the caller may free or reuse
     * the blob, and the next kernel on any queue sees the loaded scales. */
    s = lowp_fp8_state_push(st);
    if (s == LOWP_OK) s = lowp_device_synchronize(st->device);
    if (s != LOWP_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", lowp_last_error());
        for (int r = 0; r < LOWP_ROLE_COUNT; r++) {
            memcpy(st->roles[r].history, old + (size_t) r * L, L * sizeof(float));
            st->roles[r].scale = old_scale[r];
            st->roles[r].scale_inv = old_inv[r];
        }
        lowp_fp8_state_push(st); /* best effort: the device failed already */
        lowp_fail(s, "%s", why);
        lowp_error_append("%s: placing the loaded state on the device (state kept)", fn);
    }
    free(old);
    return s;
}

/* ---- per parameter ---- */

static lowp_fp8_state *param_state(const lowp_param *param) {
    return param->wrap ? param->wrap->fp8 : NULL;
}

static const char *param_name(const lowp_param *param) {
    return param->name ? param->name : "(unnamed)";
}

lowp_status lowp_param_extra_state_size(const lowp_param *param, size_t *len) {
    const char *fn = "lowp_param_extra_state_size";
    LOWP_CHECK_PTR(fn, param);
    LOWP_CHECK_PTR(fn, len);
    lowp_fp8_state *st = param_state(param);
    if (!st) {
        *len = 0;
        return LOWP_OK;
    }
    lowp_status s = lowp_fp8_state_blob_size(st, len);
    if (s != LOWP_OK) lowp_error_append("%s: param \"%s\"", fn, param_name(param));
    return s;
}

lowp_status lowp_param_extra_state_save(lowp_param *param, void *blob, size_t cap, size_t *len) {
    const char *fn = "lowp_param_extra_state_save";
    LOWP_CHECK_PTR(fn, param);
    LOWP_CHECK_PTR(fn, len);
    lowp_fp8_state *st = param_state(param);
    if (!st) { /* stateless: the empty blob; blob may be NULL */
        *len = 0;
        return LOWP_OK;
    }
    lowp_status s = lowp_fp8_state_save(st, blob, cap, len);
    if (s != LOWP_OK) lowp_error_append("%s: param \"%s\"", fn, param_name(param));
    return s;
}

lowp_status lowp_param_extra_state_load(lowp_param *param, const void *blob, size_t len) {
    const char *fn = "lowp_param_extra_state_load";
    LOWP_CHECK_PTR(fn, param);
    lowp_fp8_state *st = param_state(param);
    if (!st) {
        if (len == 0) return LOWP_OK;
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: len (%zu) != 0, but param \"%s\" has no delayed-scaling state "
                         "(it loads only an empty blob)",
                         fn, len, param_name(param));
    }
    lowp_status s = lowp_fp8_state_load(st, blob, len);
    if (s != LOWP_OK) lowp_error_append("%s: param \"%s\"", fn, param_name(param));
    return s;
}
