/* lowp._lowp: GEMM, grouped GEMM split-M and split-K. */
#include <string.h>

#include "ext.h"

static int gemm_cfg(lowp_gemm_cfg *cfg, int accumulate, int threads, int path) {
    lowp_gemm_cfg_init(cfg);
    cfg->accumulate = accumulate;
    cfg->threads = threads;
    cfg->path = (lowp_gemm_path) path;
    return 0;
}

/* The output C [rows, cols] of format c_fmt ("f32" or "bf16"). */
static int out_tensor(PyObject *o, const char *cfmt, int64_t rows, int64_t cols, ext_buf *b,
                      lowp_tensor *c, const char *fn) {
    memset(b, 0, sizeof *b);
    lowp_format f;
    if (ext_format(cfmt, &f)) return -1;
    if (ext_buf_get(o, b, 1, 0, fn, "out")) return -1;
    *c = (lowp_tensor){f, rows, cols, b->view.buf, LOWP_DEVICE_HOST};
    size_t need = 0;
    lowp_status st = lowp_tensor_nbytes(c, &need);
    if (st != LOWP_OK) return ext_raise(st), -1;
    return ext_buf_need(b, need, fn, "out");
}

/* gemm(a, b, out, out_fmt, out_rows, out_cols, accumulate, threads, path) */
static PyObject *py_gemm(PyObject *self, PyObject *args) {
    (void) self;
    const char *fn = "lowp.gemm";
    PyObject *a_o, *b_o, *c_o;
    const char *cfmt;
    long long crows, ccols;
    int accumulate, threads, path;
    if (!PyArg_ParseTuple(args, "OOOsLLpii", &a_o, &b_o, &c_o, &cfmt, &crows, &ccols,
                          &accumulate, &threads, &path))
        return NULL;
    ext_qdesc a, b;
    ext_buf cb;
    memset(&cb, 0, sizeof cb);
    PyObject *ret = NULL;
    if (ext_qdesc_get(a_o, &a, 0, 1, fn, "a")) return NULL;
    if (ext_qdesc_get(b_o, &b, 0, 1, fn, "b")) {
        ext_qdesc_release(&a);
        return NULL;
    }
    lowp_tensor c;
    lowp_gemm_cfg cfg;
    gemm_cfg(&cfg, accumulate, threads, path);
    if (out_tensor(c_o, cfmt, crows, ccols, &cb, &c, fn)) goto done;
    lowp_status st;
    Py_BEGIN_ALLOW_THREADS;
    st = lowp_gemm(&a.q, &b.q, &c, &cfg);
    Py_END_ALLOW_THREADS;
    if (st != LOWP_OK) {
        ext_raise(st);
        goto done;
    }
    ret = Py_NewRef(Py_None);
done:
    ext_buf_release(&cb);
    ext_qdesc_release(&a);
    ext_qdesc_release(&b);
    return ret;
}

/* grouped_gemm(a, b, groups, offs, out, out_fmt, out_rows, out_cols, accumulate, threads, path):
 * b describes one expert [N, K]; its data and scales hold `groups` experts one after the
 * other. */
static PyObject *py_grouped_gemm(PyObject *self, PyObject *args) {
    (void) self;
    const char *fn = "lowp.grouped_gemm";
    PyObject *a_o, *b_o, *offs_o, *c_o;
    const char *cfmt;
    long long groups, crows, ccols;
    int accumulate, threads, path;
    if (!PyArg_ParseTuple(args, "OOLOOsLLpii", &a_o, &b_o, &groups, &offs_o, &c_o, &cfmt,
                          &crows, &ccols, &accumulate, &threads, &path))
        return NULL;
    if (groups < 1 || groups > INT32_MAX)
        return PyErr_Format(PyExc_ValueError, "%s: groups (%lld) must be in [1, 2^31)", fn,
                            groups);
    ext_qdesc a, b;
    ext_buf cb, ob;
    memset(&cb, 0, sizeof cb), memset(&ob, 0, sizeof ob);
    lowp_qtensor *bs = NULL;
    PyObject *ret = NULL;
    if (ext_qdesc_get(a_o, &a, 0, 1, fn, "a")) return NULL;
    if (ext_qdesc_get(b_o, &b, 0, groups, fn, "b")) {
        ext_qdesc_release(&a);
        return NULL;
    }
    if (ext_buf_get(offs_o, &ob, 0, 0, fn, "offs")) goto done;
    if (ob.view.len != groups * 4) {
        PyErr_Format(PyExc_ValueError, "%s: offs holds %zd int32 values, b has %lld groups", fn,
                     ob.view.len / 4, groups);
        goto done;
    }
    lowp_tensor c;
    lowp_gemm_cfg cfg;
    gemm_cfg(&cfg, accumulate, threads, path);
    if (out_tensor(c_o, cfmt, crows, ccols, &cb, &c, fn)) goto done;
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
    lowp_status st;
    Py_BEGIN_ALLOW_THREADS;
    st = lowp_grouped_gemm(&a.q, bs, ob.view.buf, (int32_t) groups, &c, &cfg);
    Py_END_ALLOW_THREADS;
    if (st != LOWP_OK) {
        ext_raise(st);
        goto done;
    }
    ret = Py_NewRef(Py_None);
done:
    PyMem_RawFree(bs);
    ext_buf_release(&cb);
    ext_buf_release(&ob);
    ext_qdesc_release(&a);
    ext_qdesc_release(&b);
    return ret;
}

/* grouped_gemm_wgrad(a, b, offs, out, out_fmt, out_rows, out_cols, accumulate, threads, path):
 * a = dY^T [N, M], b = X^T [K, M] (grouped columnwise copies), out [G * N, K]. */
static PyObject *py_grouped_gemm_wgrad(PyObject *self, PyObject *args) {
    (void) self;
    const char *fn = "lowp.grouped_gemm";
    PyObject *a_o, *b_o, *offs_o, *c_o;
    const char *cfmt;
    long long crows, ccols;
    int accumulate, threads, path;
    if (!PyArg_ParseTuple(args, "OOOOsLLpii", &a_o, &b_o, &offs_o, &c_o, &cfmt, &crows, &ccols,
                          &accumulate, &threads, &path))
        return NULL;
    ext_qdesc a, b;
    ext_buf cb, ob;
    memset(&cb, 0, sizeof cb), memset(&ob, 0, sizeof ob);
    PyObject *ret = NULL;
    if (ext_qdesc_get(a_o, &a, 0, 1, fn, "a")) return NULL;
    if (ext_qdesc_get(b_o, &b, 0, 1, fn, "b")) {
        ext_qdesc_release(&a);
        return NULL;
    }
    if (ext_buf_get(offs_o, &ob, 0, 0, fn, "offs")) goto done;
    if (ob.view.len % 4 != 0 || ob.view.len / 4 > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: offs must hold int32 values", fn);
        goto done;
    }
    lowp_tensor c;
    lowp_gemm_cfg cfg;
    gemm_cfg(&cfg, accumulate, threads, path);
    if (out_tensor(c_o, cfmt, crows, ccols, &cb, &c, fn)) goto done;
    lowp_status st;
    Py_BEGIN_ALLOW_THREADS;
    st = lowp_grouped_gemm_wgrad(&a.q, &b.q, ob.view.buf, (int32_t) (ob.view.len / 4), &c, &cfg);
    Py_END_ALLOW_THREADS;
    if (st != LOWP_OK) {
        ext_raise(st);
        goto done;
    }
    ret = Py_NewRef(Py_None);
done:
    ext_buf_release(&cb);
    ext_buf_release(&ob);
    ext_qdesc_release(&a);
    ext_qdesc_release(&b);
    return ret;
}

PyMethodDef ext_gemm_methods[] = {
    {"gemm", py_gemm, METH_VARARGS,
     "gemm(a, b, out, out_fmt, out_rows, out_cols, accumulate, threads, path)"},
    {"grouped_gemm", py_grouped_gemm, METH_VARARGS,
     "grouped_gemm(a, b, groups, offs, out, out_fmt, out_rows, out_cols, accumulate, threads, "
     "path)"},
    {"grouped_gemm_wgrad", py_grouped_gemm_wgrad, METH_VARARGS,
     "grouped_gemm_wgrad(a, b, offs, out, out_fmt, out_rows, out_cols, accumulate, threads, "
     "path)"},
    {NULL, NULL, 0, NULL},
};
