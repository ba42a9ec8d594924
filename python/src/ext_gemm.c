/* lowp._lowp: GEMM, grouped GEMM split-M and split-K, through one entry point. */
#include <string.h>

#include "ext.h"

enum { GEMM_PLAIN = 0, GEMM_SPLIT_M = 1, GEMM_SPLIT_K = 2 };

/* The three GEMMs of gemm.h from Python arguments:
 *   GEMM_PLAIN: lowp_gemm (groups 1, offs None);
 *   GEMM_SPLIT_M: lowp_grouped_gemm: b describes one expert [N, K], its data and scales hold
 *           `groups` experts one after the other; offs int32 [groups];
 *   GEMM_SPLIT_K: lowp_grouped_gemm_wgrad: a = dY^T [N, M], b = X^T [K, M] (columnwise
 *           copies, grouped for MX32 and BLOCK128), out [groups * N, K].
 * With kn (GEMM_PLAIN and GEMM_SPLIT_M only), b is given [K, N]: lowp_gemm_kn and
 * lowp_grouped_gemm_kn. */
static PyObject *run_gemm(int kind, int kn, PyObject *a_o, PyObject *b_o, long long groups,
                          PyObject *offs_o, PyObject *c_o, const char *cfmt, long long crows,
                          long long ccols, int accumulate, int threads, int path) {
    const char *fn = kind == GEMM_PLAIN ? (kn ? "lowp.gemm_kn" : "lowp.gemm")
                                        : (kn ? "lowp.grouped_gemm_kn" : "lowp.grouped_gemm");
    if (kind < GEMM_PLAIN || kind > GEMM_SPLIT_K || groups < 1 || groups > INT32_MAX)
        return PyErr_Format(PyExc_ValueError, "%s: bad kind (%d) or groups (%lld)", fn, kind,
                            groups);
    ext_qdesc a, b;
    ext_buf cb, ob;
    memset(&cb, 0, sizeof cb), memset(&ob, 0, sizeof ob);
    lowp_qtensor *bs = NULL;
    PyObject *ret = NULL;
    if (ext_qdesc_get(a_o, &a, 0, 1, fn, "a")) return NULL;
    if (ext_qdesc_get(b_o, &b, 0, kind == GEMM_SPLIT_M ? groups : 1, fn, "b")) {
        ext_qdesc_release(&a);
        return NULL;
    }
    if (ext_buf_get(offs_o, &ob, 0, kind == GEMM_PLAIN, fn, "offs")) goto done;
    if (kind != GEMM_PLAIN && ob.view.len != groups * 4) {
        PyErr_Format(PyExc_ValueError, "%s: offs holds %zd bytes, not %lld int32 values", fn,
                     ob.view.len, groups);
        goto done;
    }
    lowp_format f;
    if (ext_format(cfmt, &f) || ext_buf_get(c_o, &cb, 1, 0, fn, "out")) goto done;
    lowp_tensor c = {f, crows, ccols, cb.view.buf, LOWP_DEVICE_HOST};
    lowp_status st = LOWP_OK;
    if (ext_tensor_need(&cb, &c, fn, "out")) goto done;
    if (kind == GEMM_SPLIT_M) {
        bs = PyMem_RawMalloc(sizeof *bs * (size_t) groups);
        if (!bs) {
            PyErr_NoMemory();
            goto done;
        }
        for (long long g = 0; g < groups; g++) {
            bs[g] = b.q;
            bs[g].data = b.q.data ? (char *) b.q.data + b.data_bytes * (size_t) g : NULL;
            bs[g].scales = b.q.scales ? (char *) b.q.scales + b.scale_bytes * (size_t) g : NULL;
        }
    }
    lowp_gemm_cfg cfg;
    lowp_gemm_cfg_init(&cfg);
    cfg.accumulate = accumulate;
    cfg.threads = threads;
    cfg.path = (lowp_kernel_path) path;
    const int32_t *offs = ob.held ? ob.view.buf : NULL;
    Py_BEGIN_ALLOW_THREADS;
    if (kind == GEMM_PLAIN)
        st = kn ? lowp_gemm_kn(&a.q, &b.q, &c, &cfg) : lowp_gemm(&a.q, &b.q, &c, &cfg);
    else if (kind == GEMM_SPLIT_M)
        st = kn ? lowp_grouped_gemm_kn(&a.q, bs, offs, (int32_t) groups, &c, &cfg)
                : lowp_grouped_gemm(&a.q, bs, offs, (int32_t) groups, &c, &cfg);
    else
        st = lowp_grouped_gemm_wgrad(&a.q, &b.q, offs, (int32_t) groups, &c, &cfg);
    Py_END_ALLOW_THREADS;
    ret = ext_none_or_raise(st);
done:
    PyMem_RawFree(bs);
    ext_buf_release(&cb);
    ext_buf_release(&ob);
    ext_qdesc_release(&a);
    ext_qdesc_release(&b);
    return ret;
}

/* gemm(a, b, out, out_fmt, out_rows, out_cols, accumulate, threads, path[, kn]) */
static PyObject *py_gemm(PyObject *self, PyObject *args) {
    (void) self;
    PyObject *a_o, *b_o, *c_o;
    const char *cfmt;
    long long crows, ccols;
    int accumulate, threads, path, kn = 0;
    if (!PyArg_ParseTuple(args, "OOOsLLpii|p", &a_o, &b_o, &c_o, &cfmt, &crows, &ccols, &accumulate,
                          &threads, &path, &kn))
        return NULL;
    return run_gemm(GEMM_PLAIN, kn, a_o, b_o, 1, Py_None, c_o, cfmt, crows, ccols, accumulate,
                    threads, path);
}

/* grouped_gemm(a, b, groups, offs, out, out_fmt, out_rows, out_cols, accumulate, threads,
 * path[, kn]) */
static PyObject *py_grouped_gemm(PyObject *self, PyObject *args) {
    (void) self;
    PyObject *a_o, *b_o, *offs_o, *c_o;
    const char *cfmt;
    long long groups, crows, ccols;
    int accumulate, threads, path, kn = 0;
    if (!PyArg_ParseTuple(args, "OOLOOsLLpii|p", &a_o, &b_o, &groups, &offs_o, &c_o, &cfmt, &crows,
                          &ccols, &accumulate, &threads, &path, &kn))
        return NULL;
    return run_gemm(GEMM_SPLIT_M, kn, a_o, b_o, groups, offs_o, c_o, cfmt, crows, ccols, accumulate,
                    threads, path);
}

/* grouped_gemm_wgrad(a, b, offs, out, out_fmt, out_rows, out_cols, accumulate, threads, path) */
static PyObject *py_grouped_gemm_wgrad(PyObject *self, PyObject *args) {
    (void) self;
    PyObject *a_o, *b_o, *offs_o, *c_o;
    const char *cfmt;
    long long crows, ccols;
    int accumulate, threads, path;
    if (!PyArg_ParseTuple(args, "OOOOsLLpii", &a_o, &b_o, &offs_o, &c_o, &cfmt, &crows, &ccols,
                          &accumulate, &threads, &path))
        return NULL;
    /* groups: the int32 values of offs (a buffer or raw memory) */
    ext_buf ob;
    if (ext_buf_get(offs_o, &ob, 0, 0, "lowp.grouped_gemm", "offs")) return NULL;
    Py_ssize_t n = ob.view.len / 4;
    ext_buf_release(&ob);
    return run_gemm(GEMM_SPLIT_K, 0, a_o, b_o, (long long) n, offs_o, c_o, cfmt, crows, ccols,
                    accumulate, threads, path);
}

PyMethodDef ext_gemm_methods[] = {
    {"gemm", py_gemm, METH_VARARGS,
     "gemm(a, b, out, out_fmt, out_rows, out_cols, accumulate, threads, path[, kn])"},
    {"grouped_gemm", py_grouped_gemm, METH_VARARGS,
     "grouped_gemm(a, b, groups, offs, out, out_fmt, out_rows, out_cols, accumulate, threads, "
     "path[, kn])"},
    {"grouped_gemm_wgrad", py_grouped_gemm_wgrad, METH_VARARGS,
     "grouped_gemm_wgrad(a, b, offs, out, out_fmt, out_rows, out_cols, accumulate, threads, "
     "path)"},
    {NULL, NULL, 0, NULL},
};
