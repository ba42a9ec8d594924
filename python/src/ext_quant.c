/* lowp._lowp: element casts, quantize, grouped quantize, dequantize, scale rules. */
#include <string.h>

#include "ext.h"

/* Storage bytes of one element as Python passes it: E2M1 one code per byte (unpacked). */
static size_t elem_bytes(lowp_format f) {
    const lowp_format_traits *t = NULL;
    if (lowp_format_get(f, &t) != LOWP_OK) return 1;
    return t->bits >= 8 ? (size_t) t->bits / 8 : 1;
}

static PyObject *py_cast(PyObject *self, PyObject *args) {
    (void) self;
    const char *fn = "lowp.cast";
    PyObject *src_o, *dst_o;
    const char *sfmt, *dfmt;
    long long n;
    int overflow, rounding, threads, path;
    unsigned long long seed, offset;
    if (!PyArg_ParseTuple(args, "OsOsLiiKKii", &src_o, &sfmt, &dst_o, &dfmt, &n, &overflow,
                          &rounding, &seed, &offset, &threads, &path))
        return NULL;
    lowp_format sf, df;
    if (ext_format(sfmt, &sf) || ext_format(dfmt, &df)) return NULL;
    if (n < 0) return PyErr_Format(PyExc_ValueError, "%s: n (%lld) < 0", fn, n);
    ext_buf src, dst;
    if (ext_buf_get(src_o, &src, 0, 0, fn, "x")) return NULL;
    if (ext_buf_get(dst_o, &dst, 1, 0, fn, "out")) {
        ext_buf_release(&src);
        return NULL;
    }
    PyObject *ret = NULL;
    uint8_t *packed = NULL;
    if (ext_buf_need(&src, (size_t) n * elem_bytes(sf), fn, "x") ||
        ext_buf_need(&dst, (size_t) n * elem_bytes(df), fn, "out"))
        goto done;
    const int src4 = sf == LOWP_FORMAT_E2M1, dst4 = df == LOWP_FORMAT_E2M1;
    if (src4 || dst4) {
        packed = PyMem_RawMalloc((size_t) n / 2 + 1);
        if (!packed) {
            PyErr_NoMemory();
            goto done;
        }
    }
    lowp_cast_cfg cfg;
    lowp_cast_cfg_init(&cfg);
    cfg.overflow = overflow ? LOWP_OVERFLOW_NONSAT : LOWP_OVERFLOW_SATFINITE;
    cfg.rounding = rounding ? LOWP_ROUNDING_SR : LOWP_ROUNDING_RNE;
    cfg.seed = seed;
    cfg.offset = offset;
    cfg.threads = threads;
    cfg.path = (lowp_kernel_path) path;
    lowp_tensor s = {sf, 1, n, src4 ? (void *) packed : src.view.buf, LOWP_DEVICE_HOST};
    lowp_tensor d = {df, 1, n, dst4 ? (void *) packed : dst.view.buf, LOWP_DEVICE_HOST};
    lowp_status st = LOWP_OK;
    Py_BEGIN_ALLOW_THREADS;
    if (src4) st = lowp_fp4_pack(src.view.buf, (size_t) n, packed);
    if (st == LOWP_OK) st = lowp_cast(&s, &d, &cfg);
    if (st == LOWP_OK && dst4) st = lowp_fp4_unpack(packed, (size_t) n, dst.view.buf);
    Py_END_ALLOW_THREADS;
    ret = ext_none_or_raise(st);
done:
    PyMem_RawFree(packed);
    ext_buf_release(&src);
    ext_buf_release(&dst);
    return ret;
}

/* layout(format, scaling, rows, cols, offs) -> (data_bytes, scale_bytes, scale_rows, scale_cols,
 * scale_is_e8m0) */
static PyObject *py_layout(PyObject *self, PyObject *args) {
    (void) self;
    const char *fmt, *scaling;
    long long rows, cols;
    PyObject *offs_o;
    if (!PyArg_ParseTuple(args, "ssLLO", &fmt, &scaling, &rows, &cols, &offs_o)) return NULL;
    lowp_qtensor q;
    memset(&q, 0, sizeof q);
    q.rows = rows, q.cols = cols, q.device = LOWP_DEVICE_HOST;
    if (ext_format(fmt, &q.format) || ext_scaling(scaling, &q.scaling)) return NULL;
    ext_buf offs;
    if (ext_buf_get(offs_o, &offs, 0, 1, "lowp.quantize", "offs")) return NULL;
    if (offs.held) {
        q.group_offs = offs.view.buf;
        q.groups = (int32_t) (offs.view.len / 4);
    }
    size_t db = 0, sb = 0;
    int64_t sr = 0, sc = 0;
    int e8 = 0;
    lowp_status st = lowp_qtensor_nbytes(&q, &db, &sb);
    if (st == LOWP_OK) st = lowp_qtensor_scale_shape(&q, &sr, &sc, &e8);
    ext_buf_release(&offs);
    if (st != LOWP_OK) return ext_raise(st);
    return Py_BuildValue("nnLLi", (Py_ssize_t) db, (Py_ssize_t) sb, (long long) sr, (long long) sc,
                         e8);
}

/* quantize(x, row, col, cfg) -> amax (cfg.amax) or None: x a plain QDesc [R, C] (f32 or bf16),
 * row [R, C] and col [C, R] the QDescs of the copies to write (None: not wanted), cfg a
 * QuantCfg (lowp_quantize). */
static PyObject *py_quantize(PyObject *self, PyObject *args, PyObject *kwds) {
    (void) self;
    static char *kw[] = {"x", "row", "col", "cfg", NULL};
    const char *fn = "lowp.quantize";
    PyObject *x_o, *row_o, *col_o, *cfg_o;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO:quantize", kw, &x_o, &row_o, &col_o, &cfg_o))
        return NULL;
    lowp_quant_cfg cfg;
    float scale = 0.0f, amax = 0.0f;
    int want_amax = 0;
    if (ext_quant_cfg_get(cfg_o, &cfg, &scale, &amax, &want_amax, fn)) return NULL;
    lowp_tensor x;
    ext_buf xb;
    ext_qdesc row, col;
    memset(&row, 0, sizeof row), memset(&col, 0, sizeof col);
    PyObject *ret = NULL;
    if (ext_tensor_get(x_o, &xb, &x, 0, fn, "x")) return NULL;
    if ((row_o != Py_None && ext_qdesc_get(row_o, &row, 1, 1, fn, "row")) ||
        (col_o != Py_None && ext_qdesc_get(col_o, &col, 1, 1, fn, "col")))
        goto done;
    lowp_status st;
    Py_BEGIN_ALLOW_THREADS;
    st =
        lowp_quantize(&x, row_o != Py_None ? &row.q : NULL, col_o != Py_None ? &col.q : NULL, &cfg);
    Py_END_ALLOW_THREADS;
    if (st != LOWP_OK)
        ext_raise(st);
    else
        ret = want_amax ? PyFloat_FromDouble((double) amax) : Py_NewRef(Py_None);
done:
    ext_buf_release(&xb);
    ext_qdesc_release(&row), ext_qdesc_release(&col);
    return ret;
}

/* quantize_grouped(x, col, cfg): x a plain QDesc [M, K], col the QDesc [K, M] of the grouped
 * columnwise copy (its offs: the int32 group ends along M), cfg a QuantCfg
 * (lowp_quantize_grouped). */
static PyObject *py_quantize_grouped(PyObject *self, PyObject *args, PyObject *kwds) {
    (void) self;
    static char *kw[] = {"x", "col", "cfg", NULL};
    const char *fn = "lowp.quantize";
    PyObject *x_o, *col_o, *cfg_o;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO:quantize_grouped", kw, &x_o, &col_o, &cfg_o))
        return NULL;
    lowp_quant_cfg cfg;
    float scale = 0.0f, amax = 0.0f;
    int want_amax = 0;
    if (ext_quant_cfg_get(cfg_o, &cfg, &scale, &amax, &want_amax, fn)) return NULL;
    lowp_tensor x;
    ext_buf xb;
    ext_qdesc col;
    PyObject *ret = NULL;
    if (ext_tensor_get(x_o, &xb, &x, 0, fn, "x")) return NULL;
    if (ext_qdesc_get(col_o, &col, 1, 1, fn, "col")) {
        ext_buf_release(&xb);
        return NULL;
    }
    if (!col.offs.held) {
        PyErr_Format(PyExc_ValueError, "%s: col.offs is None: a grouped copy needs offs", fn);
        goto done;
    }
    lowp_status st;
    Py_BEGIN_ALLOW_THREADS;
    st = lowp_quantize_grouped(&x, NULL, &col.q, &cfg);
    Py_END_ALLOW_THREADS;
    ret = st != LOWP_OK ? ext_raise(st)
          : want_amax   ? PyFloat_FromDouble((double) amax)
                        : Py_NewRef(Py_None);
done:
    ext_buf_release(&xb);
    ext_qdesc_release(&col);
    return ret;
}

/* dequantize(q, out): q a QDesc [rows, cols], out a float32 [rows, cols] buffer. */
static PyObject *py_dequantize(PyObject *self, PyObject *args) {
    (void) self;
    const char *fn = "lowp.dequantize";
    PyObject *q_o, *out_o;
    if (!PyArg_ParseTuple(args, "OO", &q_o, &out_o)) return NULL;
    ext_qdesc q;
    if (ext_qdesc_get(q_o, &q, 0, 1, fn, "q")) return NULL;
    ext_buf ob;
    PyObject *ret = NULL;
    if (ext_buf_get(out_o, &ob, 1, 0, fn, "out")) goto done;
    lowp_tensor out = {LOWP_FORMAT_F32, q.q.rows, q.q.cols, ob.view.buf, LOWP_DEVICE_HOST};
    if (ext_tensor_need(&ob, &out, fn, "out")) goto rel;
    lowp_status st;
    Py_BEGIN_ALLOW_THREADS;
    st = lowp_dequantize(&q.q, &out);
    Py_END_ALLOW_THREADS;
    if (st != LOWP_OK) {
        ext_raise(st);
        goto rel;
    }
    ret = Py_NewRef(Py_None);
rel:
    ext_buf_release(&ob);
done:
    ext_qdesc_release(&q);
    return ret;
}

static PyObject *py_e8m0_scale(PyObject *self, PyObject *args) {
    (void) self;
    float amax;
    const char *fmt, *mode;
    if (!PyArg_ParseTuple(args, "fss", &amax, &fmt, &mode)) return NULL;
    lowp_format f;
    lowp_scale_mode m;
    if (ext_format(fmt, &f) || ext_scale_mode(mode, &m)) return NULL;
    uint8_t code = 0;
    lowp_status st = lowp_e8m0_scale(amax, f, m, &code);
    if (st != LOWP_OK) return ext_raise(st);
    return PyLong_FromLong(code);
}

static PyObject *py_fp32_scale(PyObject *self, PyObject *args) {
    (void) self;
    float amax, eps;
    const char *fmt;
    int pow2;
    if (!PyArg_ParseTuple(args, "fsfi", &amax, &fmt, &eps, &pow2)) return NULL;
    lowp_format f;
    if (ext_format(fmt, &f)) return NULL;
    float scale = 0.0f;
    lowp_status st = lowp_fp32_scale(amax, f, eps, pow2, &scale);
    if (st != LOWP_OK) return ext_raise(st);
    return PyFloat_FromDouble((double) scale);
}

/* scale_layout(src, srows, scols, layout, to_canonical, dst): convert the canonical E8M0 scales
 * [srows, scols] to layout "cublas", "npu_last" (a rowwise copy) or "npu_first" (a columnwise
 * copy), or back (to_canonical = 1). Returns the bytes of the layout when dst is None. */
static PyObject *py_scale_layout(PyObject *self, PyObject *args) {
    (void) self;
    const char *fn = "lowp.quantize";
    PyObject *src_o, *dst_o;
    long long srows, scols;
    const char *layout;
    int back;
    if (!PyArg_ParseTuple(args, "OLLspO", &src_o, &srows, &scols, &layout, &back, &dst_o))
        return NULL;
    const int cublas = strcmp(layout, "cublas") == 0;
    const int npu_last = strcmp(layout, "npu_last") == 0,
              npu_first = strcmp(layout, "npu_first") == 0;
    if (!cublas && !npu_last && !npu_first)
        return PyErr_Format(PyExc_ValueError, "%s: layout ('%s') is not cublas or npu", fn, layout);
    const lowp_npu_axis axis = npu_last ? LOWP_NPU_AXIS_LAST : LOWP_NPU_AXIS_FIRST;
    size_t lay = 0;
    lowp_status st = cublas ? lowp_scales_cublas_nbytes(srows, scols, &lay)
                            : lowp_scales_npu_nbytes(srows, scols, &lay);
    if (st != LOWP_OK) return ext_raise(st);
    if (dst_o == Py_None) return PyLong_FromSize_t(lay);
    const size_t canon = (size_t) srows * (size_t) scols;
    ext_buf src, dst;
    if (ext_buf_get(src_o, &src, 0, 0, fn, "scale")) return NULL;
    PyObject *ret = NULL;
    if (ext_buf_get(dst_o, &dst, 1, 0, fn, "scale")) goto done_src;
    if (ext_buf_need(&src, back ? lay : canon, fn, "scale") ||
        ext_buf_need(&dst, back ? canon : lay, fn, "scale"))
        goto done;
    if (cublas)
        st = back ? lowp_scales_from_cublas(src.view.buf, lay, srows, scols, dst.view.buf)
                  : lowp_scales_to_cublas(src.view.buf, srows, scols, dst.view.buf, lay);
    else
        st = back ? lowp_scales_from_npu(src.view.buf, lay, srows, scols, axis, dst.view.buf)
                  : lowp_scales_to_npu(src.view.buf, srows, scols, axis, dst.view.buf, lay);
    ret = ext_none_or_raise(st);
done:
    ext_buf_release(&dst);
done_src:
    ext_buf_release(&src);
    return ret;
}

/* hadamard16(x, x_fmt, y, rows, cols, seed, offset, offs, threads): y (F32 [rows, cols]) = the
 * random Hadamard transform of x (F32 or BF16) along its rows (lowp_hadamard16); offs None or
 * int32 group ends along the columns. */
static PyObject *py_hadamard16(PyObject *self, PyObject *args) {
    (void) self;
    const char *fn = "lowp.hadamard16", *xfmt;
    PyObject *x_o, *y_o, *offs_o;
    long long rows, cols;
    unsigned long long seed, offset;
    int threads;
    if (!PyArg_ParseTuple(args, "OsOLLKKOi", &x_o, &xfmt, &y_o, &rows, &cols, &seed, &offset,
                          &offs_o, &threads))
        return NULL;
    lowp_format xf;
    if (ext_format(xfmt, &xf)) return NULL;
    ext_buf x, y, o;
    if (ext_buf_get(x_o, &x, 0, 0, fn, "x")) return NULL;
    if (ext_buf_get(y_o, &y, 1, 0, fn, "y")) return ext_buf_release(&x), NULL;
    if (ext_buf_get(offs_o, &o, 0, 1, fn, "offs"))
        return ext_buf_release(&x), ext_buf_release(&y), NULL;
    lowp_tensor xt = {xf, rows, cols, x.view.buf, LOWP_DEVICE_HOST};
    lowp_tensor yt = {LOWP_FORMAT_F32, rows, cols, y.view.buf, LOWP_DEVICE_HOST};
    PyObject *ret = NULL;
    if (!ext_tensor_need(&x, &xt, fn, "x") && !ext_tensor_need(&y, &yt, fn, "y")) {
        lowp_hadamard_cfg hc;
        lowp_hadamard_cfg_init(&hc);
        hc.seed = seed;
        hc.offset = offset;
        hc.group_offs = o.held ? (const int32_t *) o.view.buf : NULL;
        hc.groups = o.held ? (int32_t) (o.view.len / (Py_ssize_t) sizeof(int32_t)) : 0;
        hc.threads = threads;
        lowp_status st;
        Py_BEGIN_ALLOW_THREADS;
        st = lowp_hadamard16(&xt, &yt, &hc);
        Py_END_ALLOW_THREADS;
        ret = ext_none_or_raise(st);
    }
    ext_buf_release(&o);
    ext_buf_release(&y);
    ext_buf_release(&x);
    return ret;
}

/* philox_fill(seed, offset, out, n): words offset .. offset + n - 1 of stream seed into out
 * (uint32 [n]), lowp_philox_fill. */
static PyObject *py_philox_fill(PyObject *self, PyObject *args) {
    (void) self;
    const char *fn = "lowp.philox_fill";
    unsigned long long seed, offset;
    PyObject *out_o;
    long long n;
    if (!PyArg_ParseTuple(args, "KKOL", &seed, &offset, &out_o, &n)) return NULL;
    if (n < 0) return PyErr_Format(PyExc_ValueError, "%s: n (%lld) < 0", fn, n);
    ext_buf out;
    if (ext_buf_get(out_o, &out, 1, 0, fn, "out")) return NULL;
    PyObject *ret = NULL;
    if (!ext_buf_need(&out, (size_t) n * sizeof(uint32_t), fn, "out"))
        ret = ext_none_or_raise(lowp_philox_fill(seed, offset, out.view.buf, (size_t) n));
    ext_buf_release(&out);
    return ret;
}

PyMethodDef ext_quant_methods[] = {
    {"hadamard16", py_hadamard16, METH_VARARGS,
     "hadamard16(x, x_fmt, y, rows, cols, seed, offset, offs, threads)"},
    {"philox_fill", py_philox_fill, METH_VARARGS, "philox_fill(seed, offset, out, n)"},
    {"scale_layout", py_scale_layout, METH_VARARGS,
     "scale_layout(src, srows, scols, layout, to_canonical, dst) -> None, or the layout's bytes "
     "when dst is None"},
    {"cast", py_cast, METH_VARARGS,
     "cast(src, src_fmt, dst, dst_fmt, n, nonsat, sr, seed, offset, threads, path)"},
    {"layout", py_layout, METH_VARARGS,
     "layout(format, scaling, rows, cols, offs) -> (data_bytes, scale_bytes, scale_rows, "
     "scale_cols, scale_is_e8m0)"},
    {"quantize", (PyCFunction) (void (*)(void)) py_quantize, METH_VARARGS | METH_KEYWORDS,
     "quantize(x: QDesc, row: QDesc | None, col: QDesc | None, cfg: QuantCfg) -> amax or None"},
    {"quantize_grouped", (PyCFunction) (void (*)(void)) py_quantize_grouped,
     METH_VARARGS | METH_KEYWORDS,
     "quantize_grouped(x: QDesc, col: QDesc (with offs), cfg: QuantCfg) -> amax or None"},
    {"dequantize", py_dequantize, METH_VARARGS, "dequantize(q: QDesc, out)"},
    {"e8m0_scale", py_e8m0_scale, METH_VARARGS, "e8m0_scale(amax, format, mode) -> code"},
    {"fp32_scale", py_fp32_scale, METH_VARARGS, "fp32_scale(amax, format, eps, pow2) -> scale"},
    {NULL, NULL, 0, NULL},
};
