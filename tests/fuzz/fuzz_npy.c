/* libFuzzer target: the .npy header parser of the `lowp` tool (tools/npy.c), on any bytes, for
 * every wanted dtype. A parse that succeeds must describe a size that fits the input's claims. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int want = LOWP_NPY_ANY; want < LOWP_NPY_DTYPE_COUNT; want++) {
        lowp_npy a;
        size_t header = 0;
        char err[512];
        if (lowp_npy_parse_header(data, size, "fuzz.npy", (lowp_npy_dtype) want, &a, &header, err,
                                  sizeof err) != LOWP_OK)
            continue;
        if (header > size || a.nbytes != a.count * lowp_npy_itemsize(a.dtype)) abort();
    }
    return 0;
}
