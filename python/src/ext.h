/* Shared helpers of the extension module lowp._lowp: buffers, descriptors, errors.
 *
 * The extension is a thin layer over liblowp's public API. Python (python/lowp/__init__.py)
 * allocates every output as a numpy array and passes it in as a writable buffer, so this
 * layer needs no numpy headers: it takes objects with the buffer protocol (numpy arrays,
 * bytes, bytearray), checks that each holds the bytes liblowp will touch, releases the GIL
 * and calls the library. Failures raise ValueError (bad argument, unsupported request),
 * MemoryError or RuntimeError with the library's lowp_last_error() message.
 */
#ifndef LOWP_PY_EXT_H
#define LOWP_PY_EXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "lowp/lowp.h"

/* A buffer argument: `held` says whether one was given (view.buf, view.len), `raw` that it
 * is raw memory (nothing to release) rather than a Py_buffer. */
typedef struct ext_buf {
    Py_buffer view;
    int held, raw;
} ext_buf;

/* Acquire `obj` (None allowed when `optional`) as a C-contiguous buffer, writable when asked.
 * Raises TypeError naming `fn` and `arg`. `obj` may also be raw memory, the tuple
 * (address, nbytes) of two ints: lowp.torch passes a contiguous CPU tensor's memory so
 * (data_ptr(), its byte count), without a numpy view per argument, and holds the tensor for
 * the call. */
int ext_buf_get(PyObject *obj, ext_buf *out, int writable, int optional, const char *fn,
                const char *arg);
void ext_buf_release(ext_buf *b);

/* Raise ValueError unless b holds at least `need` bytes. */
int ext_buf_need(const ext_buf *b, size_t need, const char *fn, const char *arg);

/* Raise unless b holds the bytes of tensor t (its size from lowp_tensor_nbytes). */
int ext_tensor_need(const ext_buf *b, const lowp_tensor *t, const char *fn, const char *arg);

/* Raise the Python exception of a failed lowp call, with lowp_last_error() as its message. */
PyObject *ext_raise(lowp_status st);
/* Py_None (a new reference) when st is LOWP_OK, else ext_raise(st) (NULL). */
PyObject *ext_none_or_raise(lowp_status st);

/* Parse names with the library's own parsers (errors carry the C message). */
int ext_format(const char *name, lowp_format *out);
int ext_scaling(const char *name, lowp_scaling *out);
int ext_scale_mode(const char *name, lowp_scale_mode *out);

/* A quantized (or plain) GEMM operand passed from Python as the tuple
 *   (format, scaling, rows, cols, data, scales, offs)
 * format/scaling names, rows/cols ints, data and scales buffers (scales None for scaling
 * "none"), offs an int32 buffer of group ends or None. `count` descriptors of the same shape
 * are laid out one after the other in data and scales (grouped GEMM experts). */
typedef struct ext_qdesc {
    lowp_qtensor q;
    ext_buf data, scales, offs;
    size_t data_bytes, scale_bytes; /* of one descriptor */
} ext_qdesc;

int ext_qdesc_get(PyObject *tuple, ext_qdesc *out, int writable, int64_t count, const char *fn,
                  const char *arg);
void ext_qdesc_release(ext_qdesc *d);

/* Method tables of the parts. */
extern PyMethodDef ext_quant_methods[];
extern PyMethodDef ext_gemm_methods[];
extern PyMethodDef ext_train_methods[];
extern PyMethodDef ext_tables_methods[];

#endif
