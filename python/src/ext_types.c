/* lowp._lowp's typed descriptors, the C API's structs as Python objects:
 *
 *   QDesc(format, scaling, rows, cols, data, scale=None, offs=None)   an operand: lowp_qtensor,
 *       or a plain lowp_tensor with scaling "none" (then scale and offs are None)
 *   QuantCfg(scale_mode="default", pow2=-1, eps=0.0, scale=None, amax=False, threads=0, path=0)
 *       lowp_quant_cfg (amax: return the tensor's amax, cfg.amax_out)
 *   GemmCfg(out_dtype="f32", accumulate=False, threads=0, path=0, b_layout="nk")
 *       lowp_gemm_cfg, the output's format, and whether b is given [N, K] or [K, N]
 *
 * Each is immutable and checks its fields once, when built: a wrong type raises TypeError, a
 * wrong value ValueError, both naming the type and the field (names are parsed with the
 * library's own parsers). A buffer field is a C-contiguous buffer-protocol object or raw memory,
 * (address, nbytes) (see ext_buf_get). The calls (ext_quant.c, ext_gemm.c) then only acquire the
 * buffers and check that they hold the bytes the library will touch (ext_qdesc_get). The objects
 * hold names, numbers and buffers, never another object of theirs, so they need no cycle GC. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "ext.h"

#include <structmember.h> /* after Python.h (ext.h) */

/* ---- field checks: 0, or -1 with TypeError / ValueError naming `tn`.`field` ---- */

static int field_int(PyObject *v, const char *tn, const char *field, long long lo, long long hi,
                     long long *out) {
    if (!PyLong_Check(v) || PyBool_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be an int, got %.100s", tn, field,
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (overflow || x < lo || x > hi) {
        PyErr_Format(PyExc_ValueError, "%s: %s (%R) must be in [%lld, %lld]", tn, field, v, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

static int field_bool(PyObject *v, const char *tn, const char *field, int *out) {
    if (!PyBool_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a bool, got %.100s", tn, field,
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    *out = v == Py_True;
    return 0;
}

/* A float field (an int is taken too). */
static int field_float(PyObject *v, const char *tn, const char *field, double *out) {
    if (PyBool_Check(v) || !(PyFloat_Check(v) || PyLong_Check(v))) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a float, got %.100s", tn, field,
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    *out = PyFloat_AsDouble(v);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* A str field; `parse` (one of the library's *_from_name) gives its code. */
typedef lowp_status (*name_parser)(const char *name, int *code);

static lowp_status parse_format(const char *n, int *c) {
    lowp_format f = LOWP_FORMAT_F32;
    lowp_status st = lowp_format_from_name(n, &f);
    *c = (int) f;
    return st;
}

static lowp_status parse_scaling(const char *n, int *c) {
    lowp_scaling s = LOWP_SCALING_NONE;
    lowp_status st = lowp_scaling_from_name(n, &s);
    *c = (int) s;
    return st;
}

static lowp_status parse_scale_mode(const char *n, int *c) {
    lowp_scale_mode m = LOWP_SCALE_MODE_DEFAULT;
    lowp_status st = lowp_scale_mode_from_name(n, &m);
    *c = (int) m;
    return st;
}

static int field_name(PyObject *v, const char *tn, const char *field, name_parser parse,
                      int *code) {
    if (!PyUnicode_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a str, got %.100s", tn, field,
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    const char *s = PyUnicode_AsUTF8(v);
    if (!s) return -1;
    if (parse(s, code) != LOWP_OK) {
        PyErr_Format(PyExc_ValueError, "%s: %s (%R): %s", tn, field, v, lowp_last_error());
        return -1;
    }
    return 0;
}

/* One of two names: *which = 0 for `a`, 1 for `b`. */
static int field_choice(PyObject *v, const char *tn, const char *field, const char *a,
                        const char *b, int *which) {
    if (!PyUnicode_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a str, got %.100s", tn, field,
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    if (PyUnicode_CompareWithASCIIString(v, a) == 0 ||
        PyUnicode_CompareWithASCIIString(v, b) == 0) {
        *which = PyUnicode_CompareWithASCIIString(v, b) == 0;
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "%s: %s (%R) must be '%s' or '%s'", tn, field, v, a, b);
    return -1;
}

/* A buffer field: what ext_buf_get takes (None when `optional`), acquired once to check it. */
static int field_buf(PyObject *v, const char *tn, const char *field, int optional) {
    ext_buf b;
    if (ext_buf_get(v, &b, 0, optional, tn, field)) return -1;
    ext_buf_release(&b);
    return 0;
}

/* ---- QDesc ---- */

static void qdesc_dealloc(PyObject *self) {
    ext_QDesc *d = (ext_QDesc *) self;
    Py_XDECREF(d->format_name);
    Py_XDECREF(d->scaling_name);
    Py_XDECREF(d->data);
    Py_XDECREF(d->scale);
    Py_XDECREF(d->offs);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *qdesc_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"format", "scaling", "rows", "cols", "data", "scale", "offs", NULL};
    const char *tn = "lowp._lowp.QDesc";
    PyObject *fmt, *scaling, *rows, *cols, *data, *scale = Py_None, *offs = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOO|OO:QDesc", kw, &fmt, &scaling, &rows, &cols,
                                     &data, &scale, &offs))
        return NULL;
    int f = 0, s = 0;
    long long r = 0, c = 0;
    if (field_name(fmt, tn, "format", parse_format, &f) ||
        field_name(scaling, tn, "scaling", parse_scaling, &s) ||
        field_int(rows, tn, "rows", 0, INT64_MAX, &r) ||
        field_int(cols, tn, "cols", 0, INT64_MAX, &c) || field_buf(data, tn, "data", 0) ||
        field_buf(scale, tn, "scale", 1) || field_buf(offs, tn, "offs", 1))
        return NULL;
    if (s == LOWP_SCALING_NONE && (scale != Py_None || offs != Py_None))
        return PyErr_Format(PyExc_ValueError, "%s: a plain operand (scaling 'none') takes no %s",
                            tn, scale != Py_None ? "scale" : "offs");
    ext_QDesc *d = (ext_QDesc *) type->tp_alloc(type, 0);
    if (!d) return NULL;
    d->format = (lowp_format) f;
    d->scaling = (lowp_scaling) s;
    d->rows = r;
    d->cols = c;
    d->format_name = Py_NewRef(fmt);
    d->scaling_name = Py_NewRef(scaling);
    d->data = Py_NewRef(data);
    d->scale = Py_NewRef(scale);
    d->offs = Py_NewRef(offs);
    return (PyObject *) d;
}

static PyObject *qdesc_repr(PyObject *self) {
    ext_QDesc *d = (ext_QDesc *) self;
    return PyUnicode_FromFormat("QDesc(format=%R, scaling=%R, rows=%lld, cols=%lld, data=%R, "
                                "scale=%R, offs=%R)",
                                d->format_name, d->scaling_name, (long long) d->rows,
                                (long long) d->cols, d->data, d->scale, d->offs);
}

static PyMemberDef qdesc_members[] = {
    {"format", T_OBJECT, offsetof(ext_QDesc, format_name), READONLY, "element format name"},
    {"scaling", T_OBJECT, offsetof(ext_QDesc, scaling_name), READONLY, "scaling name"},
    {"rows", T_LONGLONG, offsetof(ext_QDesc, rows), READONLY, "rows of this copy"},
    {"cols", T_LONGLONG, offsetof(ext_QDesc, cols), READONLY, "cols (the quantized dimension)"},
    {"data", T_OBJECT, offsetof(ext_QDesc, data), READONLY, "the codes (or plain values)"},
    {"scale", T_OBJECT, offsetof(ext_QDesc, scale), READONLY, "the scales, or None"},
    {"offs", T_OBJECT, offsetof(ext_QDesc, offs), READONLY, "int32 group ends, or None"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject ext_QDesc_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lowp._lowp.QDesc",
    .tp_basicsize = sizeof(ext_QDesc),
    .tp_dealloc = qdesc_dealloc,
    .tp_repr = qdesc_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "QDesc(format, scaling, rows, cols, data, scale=None, offs=None): one operand "
              "[rows, cols] (lowp_qtensor; scaling 'none': a plain tensor). Buffers: "
              "C-contiguous buffer objects or raw memory (address, nbytes).",
    .tp_members = qdesc_members,
    .tp_new = qdesc_new,
};

int ext_qdesc_get(PyObject *obj, ext_qdesc *out, int writable, int64_t count, const char *fn,
                  const char *arg) {
    memset(out, 0, sizeof *out);
    if (!Py_IS_TYPE(obj, &ext_QDesc_type)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a lowp._lowp.QDesc, got %.100s", fn, arg,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    const ext_QDesc *d = (const ext_QDesc *) obj;
    char what[96];
    lowp_qtensor *q = &out->q;
    q->format = d->format;
    q->scaling = d->scaling;
    q->rows = d->rows;
    q->cols = d->cols;
    q->device = LOWP_DEVICE_HOST;
    snprintf(what, sizeof what, "%s.data", arg);
    if (ext_buf_get(d->data, &out->data, writable, 0, fn, what)) goto fail;
    snprintf(what, sizeof what, "%s.scale", arg);
    if (ext_buf_get(d->scale, &out->scales, writable, 1, fn, what)) goto fail;
    snprintf(what, sizeof what, "%s.offs", arg);
    if (ext_buf_get(d->offs, &out->offs, 0, 1, fn, what)) goto fail;
    if (out->offs.held) {
        if (out->offs.view.len % 4 != 0 || out->offs.view.len / 4 > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "%s: %s.offs must hold int32 values (%zd bytes)", fn,
                         arg, out->offs.view.len);
            goto fail;
        }
        q->group_offs = (const int32_t *) out->offs.view.buf;
        q->groups = (int32_t) (out->offs.view.len / 4);
    }
    lowp_status st = lowp_qtensor_nbytes(q, &out->data_bytes, &out->scale_bytes);
    if (st != LOWP_OK) {
        ext_raise(st);
        goto fail;
    }
    if (count < 1 || (out->data_bytes && (size_t) count > SIZE_MAX / out->data_bytes) ||
        (out->scale_bytes && (size_t) count > SIZE_MAX / out->scale_bytes)) {
        PyErr_Format(PyExc_ValueError, "%s: %s: bad count (%lld)", fn, arg, (long long) count);
        goto fail;
    }
    snprintf(what, sizeof what, "%s.data", arg);
    if (ext_buf_need(&out->data, out->data_bytes * (size_t) count, fn, what)) goto fail;
    snprintf(what, sizeof what, "%s.scale", arg);
    if (ext_buf_need(&out->scales, out->scale_bytes * (size_t) count, fn, what)) goto fail;
    q->data = out->data.held ? out->data.view.buf : NULL;
    q->scales = out->scales.held ? out->scales.view.buf : NULL;
    return 0;
fail:
    ext_qdesc_release(out);
    return -1;
}

void ext_qdesc_release(ext_qdesc *d) {
    ext_buf_release(&d->data);
    ext_buf_release(&d->scales);
    ext_buf_release(&d->offs);
}

int ext_tensor_get(PyObject *obj, ext_buf *buf, lowp_tensor *t, int writable, const char *fn,
                   const char *arg) {
    memset(buf, 0, sizeof *buf);
    if (!Py_IS_TYPE(obj, &ext_QDesc_type)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a lowp._lowp.QDesc, got %.100s", fn, arg,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    const ext_QDesc *d = (const ext_QDesc *) obj;
    if (d->scaling != LOWP_SCALING_NONE) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be a plain tensor (scaling 'none'), got %R", fn,
                     arg, d->scaling_name);
        return -1;
    }
    if (ext_buf_get(d->data, buf, writable, 0, fn, arg)) return -1;
    *t = (lowp_tensor){d->format, d->rows, d->cols, buf->view.buf, LOWP_DEVICE_HOST};
    if (ext_tensor_need(buf, t, fn, arg)) {
        ext_buf_release(buf);
        return -1;
    }
    return 0;
}

/* ---- QuantCfg ---- */

_Static_assert(sizeof(lowp_kernel_path) == sizeof(int), "lowp_kernel_path is read as an int");
_Static_assert(sizeof(int32_t) == sizeof(int), "int32_t fields are read as ints");

static void quantcfg_dealloc(PyObject *self) {
    Py_XDECREF(((ext_QuantCfg *) self)->mode_name);
    Py_XDECREF(((ext_QuantCfg *) self)->scale_o);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *quantcfg_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"scale_mode", "pow2", "eps",  "scale",  "amax", "threads",
                         "path",       "sr",   "seed", "offset", NULL};
    const char *tn = "lowp._lowp.QuantCfg";
    PyObject *mode = NULL, *pow2 = NULL, *eps = NULL, *scale = Py_None, *amax = Py_False;
    PyObject *threads = NULL, *path = NULL, *sr = Py_False;
    unsigned long long seed = 0, offset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OOOOOOOOKK:QuantCfg", kw, &mode, &pow2, &eps,
                                     &scale, &amax, &threads, &path, &sr, &seed, &offset))
        return NULL;
    int want_sr = 0;
    if (field_bool(sr, tn, "sr", &want_sr)) return NULL;
    lowp_quant_cfg cfg;
    lowp_quant_cfg_init(&cfg);
    int m = (int) cfg.scale_mode, want_amax = 0;
    long long p2 = cfg.pow2_scales, thr = cfg.threads, kp = cfg.path;
    double e = cfg.eps, s = 0.0;
    if ((mode && field_name(mode, tn, "scale_mode", parse_scale_mode, &m)) ||
        (pow2 && field_int(pow2, tn, "pow2", -1, 1, &p2)) ||
        (eps && field_float(eps, tn, "eps", &e)) ||
        (scale != Py_None && field_float(scale, tn, "scale", &s)) ||
        field_bool(amax, tn, "amax", &want_amax) ||
        (threads && field_int(threads, tn, "threads", 0, INT32_MAX, &thr)) ||
        (path && field_int(path, tn, "path", 0, LOWP_KERNEL_PATH_COUNT - 1, &kp)))
        return NULL;
    ext_QuantCfg *o = (ext_QuantCfg *) type->tp_alloc(type, 0);
    if (!o) return NULL;
    o->cfg = cfg;
    o->cfg.scale_mode = (lowp_scale_mode) m;
    o->cfg.pow2_scales = (int32_t) p2;
    o->cfg.eps = (float) e;
    o->cfg.threads = (int32_t) thr;
    o->cfg.path = (lowp_kernel_path) kp;
    o->cfg.rounding = want_sr ? LOWP_ROUNDING_SR : LOWP_ROUNDING_RNE;
    o->cfg.seed = seed;
    o->cfg.offset = offset;
    o->scale = (float) s;
    o->has_scale = scale != Py_None;
    o->amax = (char) want_amax;
    o->mode_name = mode ? Py_NewRef(mode) : PyUnicode_FromString("default");
    o->scale_o = Py_NewRef(scale);
    if (!o->mode_name) return Py_DECREF(o), NULL;
    return (PyObject *) o;
}

static PyObject *quantcfg_repr(PyObject *self) {
    ext_QuantCfg *o = (ext_QuantCfg *) self;
    PyObject *eps = PyFloat_FromDouble((double) o->cfg.eps);
    if (!eps) return NULL;
    PyObject *r = PyUnicode_FromFormat(
        "QuantCfg(scale_mode=%R, pow2=%d, eps=%R, scale=%R, amax=%s, threads=%d, path=%d)",
        o->mode_name, (int) o->cfg.pow2_scales, eps, o->scale_o, o->amax ? "True" : "False",
        (int) o->cfg.threads, (int) o->cfg.path);
    Py_DECREF(eps);
    return r;
}

static PyMemberDef quantcfg_members[] = {
    {"scale_mode", T_OBJECT, offsetof(ext_QuantCfg, mode_name), READONLY, "E8M0 scale mode"},
    {"pow2", T_INT, offsetof(ext_QuantCfg, cfg.pow2_scales), READONLY, "-1, 0 or 1"},
    {"eps", T_FLOAT, offsetof(ext_QuantCfg, cfg.eps), READONLY, "amax floor (binary32 kinds)"},
    {"scale", T_OBJECT, offsetof(ext_QuantCfg, scale_o), READONLY, "delayed scale, or None"},
    {"amax", T_BOOL, offsetof(ext_QuantCfg, amax), READONLY, "return the tensor's amax"},
    {"threads", T_INT, offsetof(ext_QuantCfg, cfg.threads), READONLY, "0: all cores"},
    {"path", T_INT, offsetof(ext_QuantCfg, cfg.path), READONLY, "lowp_kernel_path"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject ext_QuantCfg_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lowp._lowp.QuantCfg",
    .tp_basicsize = sizeof(ext_QuantCfg),
    .tp_dealloc = quantcfg_dealloc,
    .tp_repr = quantcfg_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "QuantCfg(scale_mode='default', pow2=-1, eps=0.0, scale=None, amax=False, "
              "threads=0, path=0): lowp_quant_cfg (amax=True: quantize returns the amax).",
    .tp_members = quantcfg_members,
    .tp_new = quantcfg_new,
};

int ext_quant_cfg_get(PyObject *obj, lowp_quant_cfg *cfg, float *scale, float *amax, int *want_amax,
                      const char *fn) {
    if (!Py_IS_TYPE(obj, &ext_QuantCfg_type)) {
        PyErr_Format(PyExc_TypeError, "%s: cfg must be a lowp._lowp.QuantCfg, got %.100s", fn,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    const ext_QuantCfg *o = (const ext_QuantCfg *) obj;
    *cfg = o->cfg;
    *scale = o->scale;
    *amax = 0.0f;
    cfg->scale = o->has_scale ? scale : NULL;
    cfg->amax_out = o->amax ? amax : NULL;
    *want_amax = o->amax;
    return 0;
}

/* ---- GemmCfg ---- */

static void gemmcfg_dealloc(PyObject *self) {
    Py_XDECREF(((ext_GemmCfg *) self)->out_name);
    Py_XDECREF(((ext_GemmCfg *) self)->layout_name);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *gemmcfg_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"out_dtype", "accumulate", "threads", "path", "b_layout", NULL};
    const char *tn = "lowp._lowp.GemmCfg";
    PyObject *out = NULL, *acc = Py_False, *threads = NULL, *path = NULL, *layout = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OOOOO:GemmCfg", kw, &out, &acc, &threads, &path,
                                     &layout))
        return NULL;
    lowp_gemm_cfg cfg;
    lowp_gemm_cfg_init(&cfg);
    int bf16 = 0, kn = 0, accumulate = 0;
    long long thr = cfg.threads, kp = cfg.path;
    if ((out && field_choice(out, tn, "out_dtype", "f32", "bf16", &bf16)) ||
        field_bool(acc, tn, "accumulate", &accumulate) ||
        (threads && field_int(threads, tn, "threads", 0, INT32_MAX, &thr)) ||
        (path && field_int(path, tn, "path", 0, LOWP_KERNEL_PATH_COUNT - 1, &kp)) ||
        (layout && field_choice(layout, tn, "b_layout", "nk", "kn", &kn)))
        return NULL;
    ext_GemmCfg *o = (ext_GemmCfg *) type->tp_alloc(type, 0);
    if (!o) return NULL;
    o->cfg = cfg;
    o->cfg.accumulate = accumulate;
    o->cfg.threads = (int32_t) thr;
    o->cfg.path = (lowp_kernel_path) kp;
    o->out_format = bf16 ? LOWP_FORMAT_BF16 : LOWP_FORMAT_F32;
    o->kn = kn;
    o->out_name = out ? Py_NewRef(out) : PyUnicode_FromString("f32");
    o->layout_name = layout ? Py_NewRef(layout) : PyUnicode_FromString("nk");
    if (!o->out_name || !o->layout_name) return Py_DECREF(o), NULL;
    return (PyObject *) o;
}

static PyObject *gemmcfg_repr(PyObject *self) {
    ext_GemmCfg *o = (ext_GemmCfg *) self;
    return PyUnicode_FromFormat(
        "GemmCfg(out_dtype=%R, accumulate=%s, threads=%d, path=%d, b_layout=%R)", o->out_name,
        o->cfg.accumulate ? "True" : "False", (int) o->cfg.threads, (int) o->cfg.path,
        o->layout_name);
}

static PyObject *gemmcfg_accumulate(PyObject *self, void *closure) {
    (void) closure;
    return PyBool_FromLong(((ext_GemmCfg *) self)->cfg.accumulate);
}

static PyGetSetDef gemmcfg_getset[] = {
    {"accumulate", gemmcfg_accumulate, NULL, "C = C + A.B^T", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef gemmcfg_members[] = {
    {"out_dtype", T_OBJECT, offsetof(ext_GemmCfg, out_name), READONLY, "'f32' or 'bf16'"},
    {"threads", T_INT, offsetof(ext_GemmCfg, cfg.threads), READONLY, "0: all cores"},
    {"path", T_INT, offsetof(ext_GemmCfg, cfg.path), READONLY, "lowp_kernel_path"},
    {"b_layout", T_OBJECT, offsetof(ext_GemmCfg, layout_name), READONLY, "'nk' or 'kn'"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject ext_GemmCfg_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lowp._lowp.GemmCfg",
    .tp_basicsize = sizeof(ext_GemmCfg),
    .tp_dealloc = gemmcfg_dealloc,
    .tp_repr = gemmcfg_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "GemmCfg(out_dtype='f32', accumulate=False, threads=0, path=0, b_layout='nk'): "
              "lowp_gemm_cfg, the output's format, and b's layout ('kn': b given [K, N]).",
    .tp_members = gemmcfg_members,
    .tp_getset = gemmcfg_getset,
    .tp_new = gemmcfg_new,
};

const ext_GemmCfg *ext_gemm_cfg_get(PyObject *obj, const char *fn) {
    if (!Py_IS_TYPE(obj, &ext_GemmCfg_type)) {
        PyErr_Format(PyExc_TypeError, "%s: cfg must be a lowp._lowp.GemmCfg, got %.100s", fn,
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return (const ext_GemmCfg *) obj;
}

int ext_types_add(PyObject *m) {
    PyTypeObject *types[] = {&ext_QDesc_type, &ext_QuantCfg_type, &ext_GemmCfg_type};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (PyModule_AddType(m, types[i])) return -1;
    return 0;
}
