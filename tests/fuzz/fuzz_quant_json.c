/* libFuzzer target: the flat-object lookup of the io layer's JSON reader (src/io/json.c) and
 * the integer reader of the `lowp` tool built on it (tools/cli_common.c), which
 * `lowp dequantize` uses on OUT.json, for every key OUT.json holds and for keys that are
 * prefixes or extensions of them. Values must fit the buffer and be NUL-terminated. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "io/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    static const char *const keys[] = {"format", "scaling",   "scale_mode", "pow2",  "eps",
                                       "rows",   "cols",      "axis",       "scale", "r",
                                       "",       "data_hash", "scale_hash", "rowsx"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        char v[64];
        memset(v, 'x', sizeof v);
        if (lowp_json_find(text, keys[k], v, sizeof v) && strlen(v) >= sizeof v) abort();
        int64_t n;
        if (lowp_cli_json_int(text, keys[k], &n) && n < 0) abort();
    }
    free(text);
    return 0;
}
