/* lowp._lowp: the module object, buffer and error helpers, and lowp.info(). */
#include <string.h>

#include "ext.h"

int ext_buf_get(PyObject *obj, ext_buf *out, int writable, int optional, const char *fn,
                const char *arg) {
    memset(out, 0, sizeof *out);
    if (obj == Py_None && optional) return 0;
    if (PyTuple_CheckExact(obj) && PyTuple_GET_SIZE(obj) == 2) {
        void *p = PyLong_AsVoidPtr(PyTuple_GET_ITEM(obj, 0));
        Py_ssize_t n = PyErr_Occurred() ? -1 : PyLong_AsSsize_t(PyTuple_GET_ITEM(obj, 1));
        if (n < 0 || (!p && n > 0)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s: %s as raw memory must be (address, nbytes >= 0)", fn,
                         arg);
            return -1;
        }
        out->view.buf = p;
        out->view.len = n;
        out->held = out->raw = 1;
        return 0;
    }
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (!PyObject_CheckBuffer(obj) || PyObject_GetBuffer(obj, &out->view, flags) != 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: %s must be a C-contiguous%s buffer, got %.100s", fn, arg,
                     writable ? " writable" : "", Py_TYPE(obj)->tp_name);
        return -1;
    }
    out->held = 1;
    return 0;
}

void ext_buf_release(ext_buf *b) {
    if (b->held && !b->raw) PyBuffer_Release(&b->view);
    b->held = b->raw = 0;
}

int ext_buf_need(const ext_buf *b, size_t need, const char *fn, const char *arg) {
    size_t have = b->held ? (size_t) b->view.len : 0;
    if (need > 0 && (!b->held || have < need)) {
        PyErr_Format(PyExc_ValueError, "%s: %s holds %zu bytes, needs %zu", fn, arg, have, need);
        return -1;
    }
    return 0;
}

PyObject *ext_none_or_raise(lowp_status st) {
    return st == LOWP_OK ? Py_NewRef(Py_None) : ext_raise(st);
}

int ext_tensor_need(const ext_buf *b, const lowp_tensor *t, const char *fn, const char *arg) {
    size_t need = 0;
    lowp_status st = lowp_tensor_nbytes(t, &need);
    if (st != LOWP_OK) {
        ext_raise(st);
        return -1;
    }
    return ext_buf_need(b, need, fn, arg);
}

PyObject *ext_raise(lowp_status st) {
    const char *msg = lowp_last_error();
    PyObject *exc = PyExc_RuntimeError;
    switch (st) {
    case LOWP_ERR_INVALID_ARG:
    case LOWP_ERR_UNSUPPORTED:
    case LOWP_ERR_CORRUPT:
    case LOWP_ERR_VERSION:
    case LOWP_ERR_NOT_FOUND: exc = PyExc_ValueError; break;
    case LOWP_ERR_OUT_OF_MEMORY: exc = PyExc_MemoryError; break;
    default: break;
    }
    PyErr_SetString(exc, msg && *msg ? msg : lowp_status_str(st));
    return NULL;
}

int ext_format(const char *name, lowp_format *out) {
    lowp_status st = lowp_format_from_name(name, out);
    if (st != LOWP_OK) return ext_raise(st), -1;
    return 0;
}

int ext_scaling(const char *name, lowp_scaling *out) {
    lowp_status st = lowp_scaling_from_name(name, out);
    if (st != LOWP_OK) return ext_raise(st), -1;
    return 0;
}

int ext_scale_mode(const char *name, lowp_scale_mode *out) {
    lowp_status st = lowp_scale_mode_from_name(name, out);
    if (st != LOWP_OK) return ext_raise(st), -1;
    return 0;
}

/* ---- info ---- */

static int dict_set(PyObject *d, const char *key, PyObject *v) {
    if (!v) return -1;
    int r = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return r;
}

static PyObject *caps_dict(const lowp_caps *caps) {
    char desc[512];
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    if (lowp_caps_describe(caps, desc, sizeof desc) != LOWP_OK) desc[0] = '\0';
    PyObject *flags = PyUnicode_FromString(desc);
    PyObject *list = flags ? PyUnicode_Split(flags, NULL, -1) : NULL;
    Py_XDECREF(flags);
    if (dict_set(d, "name", PyUnicode_FromString(caps->name)) || dict_set(d, "caps", list) ||
        dict_set(d, "cores", PyLong_FromLong(caps->cores)) ||
        dict_set(d, "mem_bytes", PyLong_FromUnsignedLongLong(caps->mem_bytes))) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

static PyObject *py_info(PyObject *self, PyObject *noargs) {
    (void) self, (void) noargs;
    int32_t types[LOWP_DEVICE_MAX_TYPES], n = 0;
    lowp_status st = lowp_backend_list(types, LOWP_DEVICE_MAX_TYPES, &n);
    if (st != LOWP_OK) return ext_raise(st);
    if (n > LOWP_DEVICE_MAX_TYPES) n = LOWP_DEVICE_MAX_TYPES;
    PyObject *out = PyDict_New(), *backends = PyList_New(0);
    if (!out || !backends) goto fail;
    for (int32_t i = 0; i < n; i++) {
        const char *name = "";
        int32_t count = 0;
        if (lowp_backend_name(types[i], &name) != LOWP_OK) name = "?";
        if (lowp_device_count(types[i], &count) != LOWP_OK) count = 0;
        PyObject *b = PyDict_New(), *devs = PyList_New(0);
        if (!b || !devs || dict_set(b, "name", PyUnicode_FromString(name)) ||
            dict_set(b, "type", PyLong_FromLong(types[i]))) {
            Py_XDECREF(b);
            Py_XDECREF(devs);
            goto fail;
        }
        for (int32_t j = 0; j < count; j++) {
            lowp_caps caps;
            memset(&caps, 0, sizeof caps);
            if (lowp_device_caps((lowp_device){types[i], j}, &caps) != LOWP_OK) continue;
            PyObject *c = caps_dict(&caps);
            if (!c || PyList_Append(devs, c)) {
                Py_XDECREF(c);
                Py_DECREF(b);
                Py_DECREF(devs);
                goto fail;
            }
            Py_DECREF(c);
        }
        if (dict_set(b, "devices", devs) || PyList_Append(backends, b)) {
            Py_DECREF(b);
            goto fail;
        }
        Py_DECREF(b);
    }
    if (dict_set(out, "version", PyUnicode_FromString(lowp_version())) ||
        PyDict_SetItemString(out, "backends", backends) ||
        dict_set(out, "backend_errors", PyUnicode_FromString(lowp_backend_env_errors())))
        goto fail;
    Py_DECREF(backends);
    return out;
fail:
    Py_XDECREF(out);
    Py_XDECREF(backends);
    return NULL;
}

static PyObject *py_version(PyObject *self, PyObject *noargs) {
    (void) self, (void) noargs;
    return PyUnicode_FromString(lowp_version());
}

static PyObject *py_host_cache_bytes(PyObject *self, PyObject *noargs) {
    (void) self, (void) noargs;
    return PyLong_FromSize_t(lowp_host_cache_bytes());
}

static PyObject *py_host_empty_cache(PyObject *self, PyObject *noargs) {
    (void) self, (void) noargs;
    Py_BEGIN_ALLOW_THREADS lowp_host_empty_cache();
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

/* The built-in training corpus (src/model/default_corpus.c; no public accessor yet). */
extern const char lowp_default_corpus[];
extern const size_t lowp_default_corpus_len;

static PyObject *py_default_corpus(PyObject *self, PyObject *noargs) {
    (void) self, (void) noargs;
    return PyBytes_FromStringAndSize(lowp_default_corpus, (Py_ssize_t) lowp_default_corpus_len);
}

static PyMethodDef module_methods[] = {
    {"default_corpus", py_default_corpus, METH_NOARGS,
     "default_corpus() -> bytes: the built-in training corpus of lowp_data_default"},
    {"host_cache_bytes", py_host_cache_bytes, METH_NOARGS,
     "host_cache_bytes() -> int: bytes held by the host block cache (lowp_host_cache_bytes)"},
    {"host_empty_cache", py_host_empty_cache, METH_NOARGS,
     "host_empty_cache() -> None: frees the host block cache (lowp_host_empty_cache)"},
    {"info", py_info, METH_NOARGS, "info() -> dict: version, backends, devices and capabilities"},
    {"version", py_version, METH_NOARGS, "version() -> the library version string"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_lowp",
    .m_doc = "liblowp's C API for the lowp package (private: use the functions of `lowp`).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__lowp(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    if (PyModule_AddFunctions(m, ext_quant_methods) || PyModule_AddFunctions(m, ext_gemm_methods) ||
        PyModule_AddFunctions(m, ext_train_methods) ||
        PyModule_AddFunctions(m, ext_tables_methods) || ext_types_add(m)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
