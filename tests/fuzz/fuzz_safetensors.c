/* libFuzzer target: the safetensors reader (src/io/safetensors.c) on any bytes. Every tensor of a
 * file that parses must lie inside the buffer, and every metadata entry must be readable. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lowp/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lowp_safetensors *f = NULL;
    if (lowp_safetensors_parse(data, size, &f) != LOWP_OK) return 0;
    int32_t nt = 0, nm = 0;
    if (lowp_safetensors_count(f, &nt, &nm) != LOWP_OK) abort();
    volatile uint8_t sink = 0;
    for (int32_t i = 0; i < nt; i++) {
        lowp_st_tensor t;
        size_t nb = 0;
        if (lowp_safetensors_tensor(f, i, &t) != LOWP_OK ||
            lowp_st_tensor_nbytes(&t, &nb) != LOWP_OK)
            abort();
        const uint8_t *p = t.data;
        if (nb) sink ^= p[0] ^ p[nb - 1]; /* ASan: the bytes are inside a live buffer */
        lowp_st_tensor again;
        if (lowp_safetensors_find(f, t.name, &again) != LOWP_OK) abort();
    }
    for (int32_t i = 0; i < nm; i++) {
        const char *k, *v;
        if (lowp_safetensors_meta_at(f, i, &k, &v) != LOWP_OK) abort();
        sink ^= (uint8_t) strlen(k) ^ (uint8_t) strlen(v);
    }
    (void) sink;
    lowp_safetensors_free(f);
    return 0;
}
