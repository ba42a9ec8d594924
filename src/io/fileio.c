/* Reading a whole regular file into memory, for the loaders that parse from a buffer (text
 * corpora, safetensors checkpoints), with one set of error messages. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "io/fileio.h"

lowp_status lowp_file_read_all(const char *fn, const char *path, unsigned char **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) return lowp_fail(LOWP_ERR_IO, "%s: cannot open %s: %s", fn, path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(fp);
        return lowp_fail(LOWP_ERR_IO, "%s: %s is not a regular file", fn, path);
    }
    size_t n = (size_t) sb.st_size;
    unsigned char *b = malloc(n ? n : 1);
    if (!b) {
        fclose(fp);
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: no memory for %s (%zu bytes)", fn, path, n);
    }
    size_t got = n ? fread(b, 1, n, fp) : 0;
    int err = ferror(fp);
    fclose(fp);
    if (got != n || err) {
        free(b);
        return lowp_fail(LOWP_ERR_IO, "%s: reading %s failed (%zu of %zu bytes)", fn, path, got, n);
    }
    *buf = b;
    *len = n;
    return LOWP_OK;
}
