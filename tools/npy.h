/* NumPy .npy files (format versions 1.0, 2.0 and 3.0) for the `lowp` tool: read a whole
 * array into memory, or write one atomically.
 *
 *   lowp_npy a;
 *   char err[512];
 *   if (lowp_npy_read("x.npy", LOWP_NPY_F4, &a, err, sizeof err) != LOWP_OK) {
 *       fprintf(stderr, "lowp cast: %s\n", err);      // e.g. "x.npy: dtype is '<f8' ..."
 *       return 2;
 *   }
 *   ... a.shape[0 .. a.ndim-1], a.count elements at a.data ...
 *   lowp_npy_write("y.npy", LOWP_NPY_U1, a.ndim, a.shape, codes, err, sizeof err);
 *   lowp_npy_free(&a);
 *
 * Only little-endian simple dtypes ('<f4', '|u1', '<u2', '<i4') in C order are supported;
 * anything else is refused with a message that names what the file holds. Every failure
 * returns a lowp_status (LOWP_ERR_IO: the file could not be opened, read or written;
 * LOWP_ERR_CORRUPT: not an .npy file, a malformed header or truncated data;
 * LOWP_ERR_UNSUPPORTED: a valid file with another dtype or Fortran order;
 * LOWP_ERR_OUT_OF_MEMORY) and leaves one line of text, naming the file, in `err`.
 */
#ifndef LOWP_TOOLS_NPY_H
#define LOWP_TOOLS_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "lowp/status.h"

/* NumPy itself allows at most 64 dimensions. */
#define LOWP_NPY_MAX_DIMS 64

typedef enum lowp_npy_dtype {
    LOWP_NPY_ANY = -1, /* lowp_npy_read: accept any supported dtype */
    LOWP_NPY_F4 = 0,   /* '<f4' float32 */
    LOWP_NPY_U1 = 1,   /* '|u1' uint8 */
    LOWP_NPY_U2 = 2,   /* '<u2' uint16 */
    LOWP_NPY_I4 = 3,   /* '<i4' int32 */
    LOWP_NPY_DTYPE_COUNT
} lowp_npy_dtype;

typedef struct lowp_npy {
    lowp_npy_dtype dtype;
    int ndim;                         /* 0 for a scalar array, shape () */
    int64_t shape[LOWP_NPY_MAX_DIMS]; /* shape[0 .. ndim-1] */
    size_t count;                     /* number of elements (1 for shape ()) */
    size_t nbytes;                    /* count * item size */
    void *data;                       /* malloc'd, never NULL after a successful read */
} lowp_npy;

/* The dtype string ("<f4"), the NumPy name ("float32") and the item size (4) of a dtype. */
const char *lowp_npy_descr(lowp_npy_dtype dtype);
const char *lowp_npy_dtype_name(lowp_npy_dtype dtype);
size_t lowp_npy_itemsize(lowp_npy_dtype dtype);

/* Read the array at `path`. `want` is the required dtype, or LOWP_NPY_ANY for any supported
 * one (then check out->dtype). On failure *out is left empty (data NULL). */
lowp_status lowp_npy_read(const char *path, lowp_npy_dtype want, lowp_npy *out, char *err,
                          size_t err_size);

/* Parse the preamble and header of an .npy file held in buf[0 .. len-1] (never reads past
 * it). On success *header_bytes is the offset of the data, and out->dtype, ndim, shape,
 * count and nbytes are set (out->data is left NULL). `name` is used in messages. */
lowp_status lowp_npy_parse_header(const uint8_t *buf, size_t len, const char *name,
                                  lowp_npy_dtype want, lowp_npy *out, size_t *header_bytes,
                                  char *err, size_t err_size);

/* Write `data` (count = product of shape elements of `dtype`) to `path` in C order: first to
 * "PATH.tmp", which is flushed, fsync'ed and renamed over `path`. */
lowp_status lowp_npy_write(const char *path, lowp_npy_dtype dtype, int ndim, const int64_t *shape,
                           const void *data, char *err, size_t err_size);

/* Element count of a shape, or -1 if a dimension is negative or the product (times
 * `itemsize`) does not fit a size_t. */
int lowp_npy_count(int ndim, const int64_t *shape, size_t itemsize, size_t *count);

/* Free out->data and reset *a. Safe on an empty or already freed array. */
void lowp_npy_free(lowp_npy *a);

#endif
