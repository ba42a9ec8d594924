/* libFuzzer target: the FP8 extra-state loader (src/train/extra_state.c). The first input byte
 * chooses the state's history length (1 to 8) and whether the blob's trailing CRC-32 is fixed
 * up first, so that mutations reach the checks behind the CRC. A blob that loads must leave a
 * state whose scales are finite and positive and that re-saves and reloads. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lowp/lowp.h"

static uint32_t crc32_ieee(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int32_t len = 1 + (data[0] & 7);
    const int fix_crc = data[0] & 8;
    data++;
    size--;
    uint8_t *blob = malloc(size + 1);
    if (!blob) return 0;
    memcpy(blob, data, size);
    if (fix_crc && size >= 4) {
        const uint32_t c = crc32_ieee(blob, size - 4);
        for (int k = 0; k < 4; k++) blob[size - 4 + k] = (uint8_t) (c >> (8 * k));
    }
    static const lowp_format fmts[LOWP_ROLE_COUNT] = {LOWP_FORMAT_E4M3, LOWP_FORMAT_E4M3,
                                                      LOWP_FORMAT_E5M2};
    lowp_delayed_cfg cfg;
    lowp_delayed_cfg_init(&cfg, LOWP_FORMAT_E4M3);
    cfg.history_len = len;
    lowp_fp8_state st;
    if (lowp_fp8_state_init(&st, &cfg, fmts, LOWP_DEVICE_HOST) != LOWP_OK) abort();
    if (lowp_fp8_state_load(&st, blob, size) == LOWP_OK) {
        for (int r = 0; r < LOWP_ROLE_COUNT; r++)
            if (!(st.roles[r].scale > 0.0f) || !isfinite(st.roles[r].scale)) abort();
        size_t n = 0;
        if (lowp_fp8_state_blob_size(&st, &n) != LOWP_OK) abort();
        uint8_t *again = malloc(n + 1);
        if (!again || lowp_fp8_state_save(&st, again, n, &n) != LOWP_OK ||
            lowp_fp8_state_load(&st, again, n) != LOWP_OK)
            abort();
        free(again);
    }
    lowp_fp8_state_free(&st);
    free(blob);
    return 0;
}
