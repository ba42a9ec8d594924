/* safetensors files: write (atomically) and read (validating everything) the format that
 * training checkpoints use. Implemented in src/io/safetensors.c.
 *
 * The format: an 8-byte little-endian header length N, N bytes of a UTF-8 JSON object
 * {"NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]}, ...,
 *  "__metadata__": {"KEY": "VALUE", ...}}, then the data, each tensor's bytes at
 * [BEGIN, END) of the data section, little-endian, C order. Reading validates everything:
 * the JSON syntax, duplicate names, dtypes, that END - BEGIN = elements x item size, and that
 * the tensors cover the data section exactly, without gaps or overlaps.
 *
 *   lowp_st_tensor w = {"w", LOWP_ST_F32, 2, {2, 3}, data};
 *   lowp_st_meta meta = {"step", "100"};
 *   lowp_safetensors_write("w.safetensors", &w, 1, &meta, 1);
 *   lowp_safetensors *f;
 *   lowp_safetensors_read("w.safetensors", &f);
 *   lowp_st_tensor got;
 *   lowp_safetensors_find(f, "w", &got);       // got.data points into f, maybe unaligned
 *   lowp_safetensors_free(f);
 */
#ifndef LOWP_SAFETENSORS_H
#define LOWP_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lowp_st_dtype {
    LOWP_ST_BOOL = 0,
    LOWP_ST_U8,
    LOWP_ST_I8,
    LOWP_ST_F8_E4M3,
    LOWP_ST_F8_E5M2,
    LOWP_ST_F8_E8M0,
    LOWP_ST_U16,
    LOWP_ST_I16,
    LOWP_ST_F16,
    LOWP_ST_BF16,
    LOWP_ST_U32,
    LOWP_ST_I32,
    LOWP_ST_F32,
    LOWP_ST_U64,
    LOWP_ST_I64,
    LOWP_ST_F64,
    LOWP_ST_DTYPE_COUNT
} lowp_st_dtype;

#define LOWP_ST_MAX_DIMS 8

typedef struct lowp_st_tensor {
    const char *name;
    lowp_st_dtype dtype;
    int32_t ndim; /* 0 (a scalar) to LOWP_ST_MAX_DIMS */
    int64_t shape[LOWP_ST_MAX_DIMS];
    const void *data; /* elements x item size bytes */
} lowp_st_tensor;

typedef struct lowp_st_meta {
    const char *key, *value; /* UTF-8 */
} lowp_st_meta;

/* The dtype's name in the format ("F32") and its item size in bytes. */
LOWP_API const char *lowp_st_dtype_name(lowp_st_dtype dtype);
LOWP_API size_t lowp_st_dtype_size(lowp_st_dtype dtype);
/* Elements x item size of a tensor (checks the shape and overflow). */
LOWP_API lowp_status lowp_st_tensor_nbytes(const lowp_st_tensor *t, size_t *out);

/* Write atomically: PATH.tmp, fsync, rename to PATH, fsync the directory. Names must be
 * unique, non-empty and not "__metadata__"; metadata keys unique. */
LOWP_API lowp_status lowp_safetensors_write(const char *path, const lowp_st_tensor *tensors,
                                            int32_t n, const lowp_st_meta *meta, int32_t nmeta);

typedef struct lowp_safetensors lowp_safetensors;
/* Read and validate a whole file (LOWP_ERR_IO: unreadable; LOWP_ERR_CORRUPT: malformed). */
LOWP_API lowp_status lowp_safetensors_read(const char *path, lowp_safetensors **out);
/* The same from bytes in memory (copied). */
LOWP_API lowp_status lowp_safetensors_parse(const void *bytes, size_t len, lowp_safetensors **out);
LOWP_API void lowp_safetensors_free(lowp_safetensors *f);

LOWP_API lowp_status lowp_safetensors_count(const lowp_safetensors *f, int32_t *tensors,
                                            int32_t *meta);
/* Tensor i in the order of the data section. Pointers stay valid until the free. */
LOWP_API lowp_status lowp_safetensors_tensor(const lowp_safetensors *f, int32_t i,
                                             lowp_st_tensor *out);
LOWP_API lowp_status lowp_safetensors_find(const lowp_safetensors *f, const char *name,
                                           lowp_st_tensor *out); /* LOWP_ERR_NOT_FOUND */
LOWP_API lowp_status lowp_safetensors_meta_at(const lowp_safetensors *f, int32_t i,
                                              const char **key, const char **value);
LOWP_API lowp_status lowp_safetensors_meta(const lowp_safetensors *f, const char *key,
                                           const char **value); /* LOWP_ERR_NOT_FOUND */

#ifdef __cplusplus
}
#endif
#endif
