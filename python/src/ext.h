/* Shared helpers of the extension module lowp._lowp: buffers, typed descriptors, errors.
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

/* The typed descriptors of ext_types.c, the C API's structs as Python objects (immutable; each
 * field checked when the object is built, errors naming it):
 *   lowp._lowp.QDesc(format, scaling, rows, cols, data, scale=None, offs=None): one operand,
 *     a lowp_qtensor, or a plain lowp_tensor with scaling "none";
 *   lowp._lowp.QuantCfg(scale_mode, pow2, eps, scale, amax, threads, path): lowp_quant_cfg;
 *   lowp._lowp.GemmCfg(out_dtype, accumulate, threads, path, b_layout): lowp_gemm_cfg. */
typedef struct ext_QDesc {
    PyObject ob_base;
    lowp_format format;
    lowp_scaling scaling;
    long long rows, cols;
    PyObject *format_name, *scaling_name; /* the names given */
    PyObject *data, *scale, *offs;        /* buffers (what ext_buf_get takes); Py_None if absent */
} ext_QDesc;

typedef struct ext_QuantCfg {
    PyObject ob_base;
    lowp_quant_cfg cfg; /* scale and amax_out NULL: ext_quant_cfg_get sets them */
    float scale;        /* cfg.scale's value when has_scale */
    int has_scale;
    char amax; /* return the amax (cfg.amax_out) */
    PyObject *mode_name, *scale_o;
} ext_QuantCfg;

typedef struct ext_GemmCfg {
    PyObject ob_base;
    lowp_gemm_cfg cfg;
    lowp_format out_format; /* F32 or BF16 */
    int kn;                 /* b is given [K, N] (lowp_gemm_cfg.b_layout LOWP_LAYOUT_KN) */
    PyObject *out_name, *layout_name;
} ext_GemmCfg;

extern PyTypeObject ext_QDesc_type, ext_QuantCfg_type, ext_GemmCfg_type;

/* Add the three types to the module. */
int ext_types_add(PyObject *module);

/* The operand `obj` (a QDesc, else TypeError naming `fn` and `arg`) as a lowp_qtensor, its
 * buffers acquired (writable when asked) and checked to hold `count` descriptors of its shape
 * one after the other (grouped GEMM experts); release with ext_qdesc_release. */
typedef struct ext_qdesc {
    lowp_qtensor q;
    ext_buf data, scales, offs;
    size_t data_bytes, scale_bytes; /* of one descriptor */
} ext_qdesc;

int ext_qdesc_get(PyObject *obj, ext_qdesc *out, int writable, int64_t count, const char *fn,
                  const char *arg);
void ext_qdesc_release(ext_qdesc *d);

/* The plain operand `obj` (a QDesc of scaling "none") as a lowp_tensor over `buf`, which holds
 * its bytes; release buf with ext_buf_release. */
int ext_tensor_get(PyObject *obj, ext_buf *buf, lowp_tensor *t, int writable, const char *fn,
                   const char *arg);

/* A QuantCfg's lowp_quant_cfg, cfg->scale pointing at *scale and cfg->amax_out at *amax when
 * set (*want_amax). TypeError unless obj is a QuantCfg. */
int ext_quant_cfg_get(PyObject *obj, lowp_quant_cfg *cfg, float *scale, float *amax, int *want_amax,
                      const char *fn);

/* obj as a GemmCfg (borrowed), or NULL with a TypeError. */
const ext_GemmCfg *ext_gemm_cfg_get(PyObject *obj, const char *fn);

/* Method tables of the parts. */
extern PyMethodDef ext_quant_methods[];
extern PyMethodDef ext_gemm_methods[];
extern PyMethodDef ext_train_methods[];
extern PyMethodDef ext_tables_methods[];

#endif
