/* File helpers of the io layer (src/io/fileio.c), for the loaders that parse from a buffer
 * (text corpora in src/data/, safetensors files in src/io/). Not installed. */
#ifndef LOWP_IO_FILEIO_H
#define LOWP_IO_FILEIO_H

#include "core/internal.h"

/* Read the whole regular file `path` into a malloc'd *buf (*len bytes); messages start with
 * `fn` and name the path. */
LOWP_HIDDEN lowp_status lowp_file_read_all(const char *fn, const char *path, unsigned char **buf,
                                           size_t *len);

#endif
