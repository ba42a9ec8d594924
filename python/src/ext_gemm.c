/* lowp._lowp: GEMM, grouped GEMM split-M and split-K, through one entry point. */
#include <string.h>

#include "ext.h"

enum { GEMM_PLAIN = 0, GEMM_SPLIT_M = 1, GEMM_SPLIT_K = 2 };

/* One descriptor per expert of b, whose data and scales hold `groups` experts one after the
 * other; NULL with MemoryError. */
static lowp_qtensor *experts(const ext_qdesc *b, Py_ssize_t groups) {
    lowp_qtensor *bs = PyMem_RawMalloc(sizeof *bs * (size_t) groups);
    if (!bs) return PyErr_NoMemory(), NULL;
    for (Py_ssize_t i = 0; i < groups; i++) {
        bs[i] = b->q;
        bs[i].data = b->q.data ? (char *) b->q.data + b->data_bytes * (size_t) i : NULL;
        bs[i].scales = b->q.scales ? (char *) b->q.scales + b->scale_bytes * (size_t) i : NULL;
    }
    return bs;
}

/* The output's shape, from a and b: [a.rows, N] (N = b.rows, or b.cols with kn); split-K
 * [groups * a.rows, b.rows]. */
static int out_shape(int kind, int kn, const lowp_qtensor *a, const lowp_qtensor *b,
                     Py_ssize_t groups, lowp_tensor *c, const char *fn) {
    c->rows = a->rows, c->cols = kn ? b->cols : b->rows;
    if (kind != GEMM_SPLIT_K) return 0;
    if (a->rows > INT64_MAX / groups) {
        PyErr_Format(PyExc_ValueError, "%s: a.rows (%lld) x groups overflows", fn,
                     (long long) a->rows);
        return -1;
    }
    c->rows = a->rows * groups;
    return 0;
}

/* The library call of `kind` (run without the GIL). */
static lowp_status gemm_call(int kind, int kn, const ext_qdesc *a, const ext_qdesc *b,
                             const lowp_qtensor *bs, const int32_t *offs, int32_t groups,
                             lowp_tensor *c, const lowp_gemm_cfg *cfg) {
    lowp_gemm_cfg gc = *cfg;
    gc.b_layout = kn ? LOWP_LAYOUT_KN : LOWP_LAYOUT_NK;
    gc.split = kind == GEMM_SPLIT_K ? LOWP_GROUPED_SPLIT_K : LOWP_GROUPED_SPLIT_M;
    if (kind == GEMM_PLAIN) return lowp_gemm(&a->q, &b->q, c, &gc);
    return lowp_grouped_gemm(&a->q, kind == GEMM_SPLIT_M ? bs : &b->q, offs, groups, c, &gc);
}

/* The three GEMMs of gemm.h from Python arguments (a, b QDescs, cfg a GemmCfg, out a buffer
 * in cfg.out_dtype, its shape given by a and b):
 *   GEMM_PLAIN: lowp_gemm: a [M, K], b [N, K], out [M, N] (offs None);
 *   GEMM_SPLIT_M: lowp_grouped_gemm: a [T, K], b describes one expert [N, K], its data and
 *           scales hold `groups` experts one after the other; offs int32 [groups]; out [T, N];
 *   GEMM_SPLIT_K: lowp_grouped_gemm split-K: a = dY^T [N, M], b = X^T [K, M] (columnwise
 *           copies, grouped for MX32 and BLOCK128), out [groups * N, K].
 * With cfg.b_layout "kn" (GEMM_PLAIN and GEMM_SPLIT_M only), b is given [K, N]: the C config's
 * b_layout LOWP_LAYOUT_KN. The groups are offs's int32 values. */
static PyObject *run_gemm(int kind, PyObject *a_o, PyObject *b_o, PyObject *offs_o, PyObject *c_o,
                          PyObject *cfg_o) {
    const char *fn = kind == GEMM_PLAIN ? "lowp.gemm" : "lowp.grouped_gemm";
    const ext_GemmCfg *g = ext_gemm_cfg_get(cfg_o, fn);
    if (!g) return NULL;
    const int kn = g->kn;
    if (kn && kind == GEMM_SPLIT_K)
        return PyErr_Format(PyExc_ValueError, "%s: cfg.b_layout must be 'nk' for the split-K GEMM",
                            fn);
    if (kn) fn = kind == GEMM_PLAIN ? "lowp.gemm_kn" : "lowp.grouped_gemm_kn";
    ext_qdesc a, b;
    ext_buf cb, ob;
    memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
    memset(&cb, 0, sizeof cb);
    lowp_qtensor *bs = NULL;
    PyObject *ret = NULL;
    if (ext_buf_get(offs_o, &ob, 0, kind == GEMM_PLAIN, fn, "offs")) return NULL;
    const Py_ssize_t groups = ob.held ? ob.view.len / 4 : 1;
    if (kind != GEMM_PLAIN && (ob.view.len % 4 != 0 || groups < 1 || groups > INT32_MAX)) {
        PyErr_Format(PyExc_ValueError, "%s: offs holds %zd bytes, not 1 or more int32 values", fn,
                     ob.view.len);
        goto done;
    }
    lowp_tensor c = {g->out_format, 0, 0, NULL, LOWP_DEVICE_HOST};
    if (ext_qdesc_get(a_o, &a, 0, 1, fn, "a") ||
        ext_qdesc_get(b_o, &b, 0, kind == GEMM_SPLIT_M ? groups : 1, fn, "b") ||
        out_shape(kind, kn, &a.q, &b.q, groups, &c, fn) || ext_buf_get(c_o, &cb, 1, 0, fn, "out"))
        goto done;
    c.data = cb.view.buf;
    if (ext_tensor_need(&cb, &c, fn, "out")) goto done;
    if (kind == GEMM_SPLIT_M && !(bs = experts(&b, groups))) goto done;
    const lowp_gemm_cfg cfg = g->cfg;
    const int32_t *offs = ob.held ? ob.view.buf : NULL;
    lowp_status st;
    Py_BEGIN_ALLOW_THREADS;
    st = gemm_call(kind, kn, &a, &b, bs, offs, (int32_t) groups, &c, &cfg);
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

/* gemm(a, b, out, cfg) */
static PyObject *py_gemm(PyObject *self, PyObject *args, PyObject *kwds) {
    (void) self;
    static char *kw[] = {"a", "b", "out", "cfg", NULL};
    PyObject *a_o, *b_o, *c_o, *cfg_o;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO:gemm", kw, &a_o, &b_o, &c_o, &cfg_o))
        return NULL;
    return run_gemm(GEMM_PLAIN, a_o, b_o, Py_None, c_o, cfg_o);
}

/* grouped_gemm(a, b, offs, out, cfg): split-M */
static PyObject *py_grouped_gemm(PyObject *self, PyObject *args, PyObject *kwds) {
    (void) self;
    static char *kw[] = {"a", "b", "offs", "out", "cfg", NULL};
    PyObject *a_o, *b_o, *offs_o, *c_o, *cfg_o;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOO:grouped_gemm", kw, &a_o, &b_o, &offs_o,
                                     &c_o, &cfg_o))
        return NULL;
    return run_gemm(GEMM_SPLIT_M, a_o, b_o, offs_o, c_o, cfg_o);
}

/* grouped_gemm_wgrad(a, b, offs, out, cfg): split-K */
static PyObject *py_grouped_gemm_wgrad(PyObject *self, PyObject *args, PyObject *kwds) {
    (void) self;
    static char *kw[] = {"a", "b", "offs", "out", "cfg", NULL};
    PyObject *a_o, *b_o, *offs_o, *c_o, *cfg_o;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOO:grouped_gemm_wgrad", kw, &a_o, &b_o,
                                     &offs_o, &c_o, &cfg_o))
        return NULL;
    return run_gemm(GEMM_SPLIT_K, a_o, b_o, offs_o, c_o, cfg_o);
}

#define KW_METHOD(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS | METH_KEYWORDS

PyMethodDef ext_gemm_methods[] = {
    {"gemm", KW_METHOD(py_gemm),
     "gemm(a: QDesc, b: QDesc, out, cfg: GemmCfg): out = a . b^T (b_layout 'kn': a . b)"},
    {"grouped_gemm", KW_METHOD(py_grouped_gemm),
     "grouped_gemm(a: QDesc, b: QDesc (one expert; data holds them all), offs, out, "
     "cfg: GemmCfg): split-M"},
    {"grouped_gemm_wgrad", KW_METHOD(py_grouped_gemm_wgrad),
     "grouped_gemm_wgrad(a: QDesc, b: QDesc, offs, out, cfg: GemmCfg): split-K, out [G*N, K]"},
    {NULL, NULL, 0, NULL},
};
