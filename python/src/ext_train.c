/* lowp._lowp: private thin wrappers over the training layer, for the PyTorch package's tests:
 * the delayed-scaling record/update of quant.h, the extra-state blob of checkpoint.h, and one
 * forward + backward of the C training layer's linear / grouped linear (train_linear). */
#include <string.h>

#include "ext.h"

static int parse_algo(const char *name, lowp_amax_algo *out) {
    if (strcmp(name, "max") == 0)
        *out = LOWP_AMAX_ALGO_MAX;
    else if (strcmp(name, "most_recent") == 0)
        *out = LOWP_AMAX_ALGO_MOST_RECENT;
    else {
        PyErr_Format(PyExc_ValueError, "amax_compute_algo ('%s') is not max or most_recent", name);
        return -1;
    }
    return 0;
}

/* A delayed-scaling state over a caller's float32 history buffer. */
static int delayed_state(PyObject *hist_o, ext_buf *hb, const char *fmt, float margin,
                         const char *algo, float scale, lowp_delayed_state *st, const char *fn) {
    lowp_format f;
    if (ext_format(fmt, &f)) return -1;
    if (ext_buf_get(hist_o, hb, 1, 0, fn, "history")) return -1;
    if (hb->view.len < 4 || hb->view.len % 4 != 0 || hb->view.len / 4 > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: history must hold at least one float32", fn);
        ext_buf_release(hb);
        return -1;
    }
    memset(st, 0, sizeof *st);
    lowp_status s = lowp_delayed_cfg_init(&st->cfg, f);
    if (s == LOWP_OK && parse_algo(algo, &st->cfg.algo)) {
        ext_buf_release(hb);
        return -1;
    }
    if (s != LOWP_OK) {
        ext_buf_release(hb);
        return ext_raise(s), -1;
    }
    st->cfg.history_len = (int32_t) (hb->view.len / 4);
    st->cfg.margin = margin;
    st->history = hb->view.buf;
    st->scale = scale;
    st->scale_inv = 1.0f / scale;
    return 0;
}

/* delayed_record(history, amax, format) */
static PyObject *py_delayed_record(PyObject *self, PyObject *args) {
    (void) self;
    PyObject *hist_o;
    float amax;
    const char *fmt;
    if (!PyArg_ParseTuple(args, "Ofs", &hist_o, &amax, &fmt)) return NULL;
    ext_buf hb;
    lowp_delayed_state st;
    if (delayed_state(hist_o, &hb, fmt, 0.0f, "max", 1.0f, &st, "delayed_record")) return NULL;
    lowp_status s = lowp_delayed_record(&st, amax);
    ext_buf_release(&hb);
    if (s != LOWP_OK) return ext_raise(s);
    Py_RETURN_NONE;
}

/* delayed_update(history, scale, format, margin, algo) -> (scale, scale_inv); the history is
 * updated in place (rolled when this step's amax is nonzero). */
static PyObject *py_delayed_update(PyObject *self, PyObject *args) {
    (void) self;
    PyObject *hist_o;
    float scale, margin;
    const char *fmt, *algo;
    if (!PyArg_ParseTuple(args, "Ofsfs", &hist_o, &scale, &fmt, &margin, &algo)) return NULL;
    ext_buf hb;
    lowp_delayed_state st;
    if (delayed_state(hist_o, &hb, fmt, margin, algo, scale, &st, "delayed_update")) return NULL;
    lowp_status s = lowp_delayed_update(&st);
    ext_buf_release(&hb);
    if (s != LOWP_OK) return ext_raise(s);
    return Py_BuildValue("ff", st.scale, st.scale_inv);
}

/* An FP8 state on the host from (history_len, margin, algo, formats). */
static int fp8_state(lowp_fp8_state *st, int history_len, float margin, const char *algo,
                     PyObject *formats_o) {
    memset(st, 0, sizeof *st);
    lowp_delayed_cfg cfg;
    lowp_format formats[LOWP_ROLE_COUNT];
    if (!PyTuple_Check(formats_o) || PyTuple_Size(formats_o) != LOWP_ROLE_COUNT) {
        PyErr_SetString(PyExc_TypeError, "formats must be a tuple of 3 format names");
        return -1;
    }
    for (int r = 0; r < LOWP_ROLE_COUNT; r++) {
        const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(formats_o, r));
        if (!name || ext_format(name, &formats[r])) return -1;
    }
    lowp_status s = lowp_delayed_cfg_init(&cfg, formats[0]);
    if (s != LOWP_OK) return ext_raise(s), -1;
    if (parse_algo(algo, &cfg.algo)) return -1;
    cfg.history_len = history_len;
    cfg.margin = margin;
    s = lowp_fp8_state_init(st, &cfg, formats, LOWP_DEVICE_HOST);
    if (s != LOWP_OK) return ext_raise(s), -1;
    return 0;
}

/* extra_state_pack(history_len, margin, algo, formats, histories, scales) -> bytes.
 * histories: float32 [3, history_len]; scales: float32 [3]. */
static PyObject *py_extra_state_pack(PyObject *self, PyObject *args) {
    (void) self;
    const char *fn = "extra_state_pack";
    int L;
    float margin;
    const char *algo;
    PyObject *formats_o, *hist_o, *scales_o;
    if (!PyArg_ParseTuple(args, "ifsOOO", &L, &margin, &algo, &formats_o, &hist_o, &scales_o))
        return NULL;
    lowp_fp8_state st;
    if (fp8_state(&st, L, margin, algo, formats_o)) return NULL;
    ext_buf hb, sb;
    memset(&sb, 0, sizeof sb);
    PyObject *ret = NULL;
    if (ext_buf_get(hist_o, &hb, 0, 0, fn, "histories")) goto free_state;
    if (ext_buf_get(scales_o, &sb, 0, 0, fn, "scales")) goto done;
    if (ext_buf_need(&hb, (size_t) L * LOWP_ROLE_COUNT * 4, fn, "histories") ||
        ext_buf_need(&sb, LOWP_ROLE_COUNT * 4, fn, "scales"))
        goto done;
    for (int r = 0; r < LOWP_ROLE_COUNT; r++) {
        memcpy(st.roles[r].history, (const float *) hb.view.buf + (size_t) r * L,
               sizeof(float) * (size_t) L);
        st.roles[r].scale = ((const float *) sb.view.buf)[r];
        st.roles[r].scale_inv = 1.0f / st.roles[r].scale;
    }
    /* the mirror is what we filled; the image (the "device" copy) is what save reads */
    lowp_status s = lowp_fp8_state_push(&st);
    size_t len = 0;
    if (s == LOWP_OK) s = lowp_fp8_state_extra_state_size(&st, &len);
    if (s != LOWP_OK) {
        ext_raise(s);
        goto done;
    }
    ret = PyBytes_FromStringAndSize(NULL, (Py_ssize_t) len);
    if (!ret) goto done;
    s = lowp_fp8_state_extra_state_save(&st, PyBytes_AS_STRING(ret), len, &len);
    if (s != LOWP_OK) {
        Py_CLEAR(ret);
        ext_raise(s);
    }
done:
    ext_buf_release(&hb);
    ext_buf_release(&sb);
free_state:
    lowp_fp8_state_free(&st);
    return ret;
}

/* extra_state_unpack(blob, history_len, margin, algo, formats, histories_out, scales_out):
 * loads the blob into a fresh state of that configuration (lowp_fp8_state_extra_state_load's rules)
 * and copies its histories [3, history_len] and scales [3] out. */
static PyObject *py_extra_state_unpack(PyObject *self, PyObject *args) {
    (void) self;
    const char *fn = "extra_state_unpack";
    PyObject *blob_o, *formats_o, *hist_o, *scales_o;
    int L;
    float margin;
    const char *algo;
    if (!PyArg_ParseTuple(args, "OifsOOO", &blob_o, &L, &margin, &algo, &formats_o, &hist_o,
                          &scales_o))
        return NULL;
    lowp_fp8_state st;
    if (fp8_state(&st, L, margin, algo, formats_o)) return NULL;
    ext_buf bb, hb, sb;
    memset(&hb, 0, sizeof hb), memset(&sb, 0, sizeof sb);
    PyObject *ret = NULL;
    if (ext_buf_get(blob_o, &bb, 0, 0, fn, "blob")) goto free_state;
    if (ext_buf_get(hist_o, &hb, 1, 0, fn, "histories") ||
        ext_buf_get(scales_o, &sb, 1, 0, fn, "scales"))
        goto done;
    if (ext_buf_need(&hb, (size_t) L * LOWP_ROLE_COUNT * 4, fn, "histories") ||
        ext_buf_need(&sb, LOWP_ROLE_COUNT * 4, fn, "scales"))
        goto done;
    lowp_status s = lowp_fp8_state_extra_state_load(&st, bb.view.buf, (size_t) bb.view.len);
    if (s != LOWP_OK) {
        ext_raise(s);
        goto done;
    }
    for (int r = 0; r < LOWP_ROLE_COUNT; r++) {
        memcpy((float *) hb.view.buf + (size_t) r * L, st.roles[r].history,
               sizeof(float) * (size_t) L);
        ((float *) sb.view.buf)[r] = st.roles[r].scale;
    }
    ret = Py_NewRef(Py_None);
done:
    ext_buf_release(&bb);
    ext_buf_release(&hb);
    ext_buf_release(&sb);
free_state:
    lowp_fp8_state_free(&st);
    return ret;
}

/* train_linear(preset, x, M, K, w, G, N, dy, bias, offs, y, dx, dw, dbias, keep_quantized,
 *              wgrad_hp, fp32_plain, threads):
 * one forward and backward of the C training layer's linear (G = 0) or grouped linear (G
 * experts, offs) with the linear-layer preset (or built-in recipe) `preset`. All arrays
 * float32: x [M, K], w [max(G,1), N, K], dy [M, N], bias [N] or None (G = 0 only); outputs y
 * [M, N], dx [M, K], dw (+= the weight gradient, same shape as w), dbias [N] (+=) or None.
 * keep_quantized / wgrad_hp: -1 keeps the preset's choice. Stochastic rounding and the
 * Hadamard signs (the FP4 presets) draw from a tracker made for the call, so a call is
 * reproducible. */
static PyObject *py_train_linear(PyObject *self, PyObject *args) {
    (void) self;
    const char *fn = "train_linear";
    const char *preset;
    PyObject *x_o, *w_o, *dy_o, *bias_o, *offs_o, *y_o, *dx_o, *dw_o, *db_o;
    long long M, K, G, N;
    int keep, wgrad_hp, fp32_plain, threads;
    if (!PyArg_ParseTuple(args, "sOLLOLLOOOOOOOiiii", &preset, &x_o, &M, &K, &w_o, &G, &N, &dy_o,
                          &bias_o, &offs_o, &y_o, &dx_o, &dw_o, &db_o, &keep, &wgrad_hp,
                          &fp32_plain, &threads))
        return NULL;
    if (M < 0 || K < 1 || N < 1 || G < 0 || G > 4096)
        return PyErr_Format(PyExc_ValueError, "%s: bad shape M=%lld K=%lld N=%lld G=%lld", fn, M, K,
                            N, G);
    lowp_recipe r;
    lowp_status s = lowp_recipe_init(&r, "custom");
    lowp_linear_cfg cfg;
    if (s == LOWP_OK && strcmp(preset, "bf16") == 0)
        s = lowp_recipe_append(&r, "*", NULL);
    else if (s == LOWP_OK && lowp_linear_cfg_preset(preset, &cfg) == LOWP_OK) {
        if (keep >= 0) cfg.keep_quantized = keep;
        if (wgrad_hp >= 0) cfg.wgrad_hp = wgrad_hp;
        s = lowp_recipe_append(&r, "*", &cfg);
    } else if (s == LOWP_OK)
        s = lowp_recipe_init(&r, preset);
    if (s != LOWP_OK) return ext_raise(s);

    const size_t ng = (size_t) (G > 0 ? G : 1);
    ext_buf xb, wb, dyb, bb, ob, yb, dxb, dwb, dbb;
    ext_buf *all[] = {&xb, &wb, &dyb, &bb, &ob, &yb, &dxb, &dwb, &dbb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) memset(all[i], 0, sizeof *all[i]);
    PyObject *ret = NULL;
    if (ext_buf_get(x_o, &xb, 0, 0, fn, "x") || ext_buf_get(w_o, &wb, 0, 0, fn, "w") ||
        ext_buf_get(dy_o, &dyb, 0, 0, fn, "dy") || ext_buf_get(bias_o, &bb, 0, 1, fn, "bias") ||
        ext_buf_get(offs_o, &ob, 0, 1, fn, "offs") || ext_buf_get(y_o, &yb, 1, 0, fn, "y") ||
        ext_buf_get(dx_o, &dxb, 1, 0, fn, "dx") || ext_buf_get(dw_o, &dwb, 1, 0, fn, "dw") ||
        ext_buf_get(db_o, &dbb, 1, 1, fn, "dbias"))
        goto done;
    const size_t f = sizeof(float);
    if (ext_buf_need(&xb, (size_t) (M * K) * f, fn, "x") ||
        ext_buf_need(&wb, ng * (size_t) (N * K) * f, fn, "w") ||
        ext_buf_need(&dyb, (size_t) (M * N) * f, fn, "dy") ||
        (bb.held && ext_buf_need(&bb, (size_t) N * f, fn, "bias")) ||
        ext_buf_need(&yb, (size_t) (M * N) * f, fn, "y") ||
        ext_buf_need(&dxb, (size_t) (M * K) * f, fn, "dx") ||
        ext_buf_need(&dwb, ng * (size_t) (N * K) * f, fn, "dw") ||
        (dbb.held && ext_buf_need(&dbb, (size_t) N * f, fn, "dbias")) ||
        (G > 0 && ext_buf_need(&ob, (size_t) G * 4, fn, "offs")))
        goto done;
    if (G > 0 && (bb.held || dbb.held)) {
        PyErr_Format(PyExc_ValueError, "%s: the grouped linear has no bias", fn);
        goto done;
    }
    lowp_param p;
    memset(&p, 0, sizeof p);
    p.name = "layer";
    p.groups = (int32_t) G;
    p.rows = N, p.cols = K;
    p.data = wb.view.buf;
    p.grad = dwb.view.buf;
    p.device = LOWP_DEVICE_HOST;
    lowp_tensor x = {LOWP_FORMAT_F32, M, K, xb.view.buf, LOWP_DEVICE_HOST};
    lowp_tensor y = {LOWP_FORMAT_F32, M, N, yb.view.buf, LOWP_DEVICE_HOST};
    lowp_tensor dy = {LOWP_FORMAT_F32, M, N, dyb.view.buf, LOWP_DEVICE_HOST};
    lowp_tensor dx = {LOWP_FORMAT_F32, M, K, dxb.view.buf, LOWP_DEVICE_HOST};
    /* The FP4 presets' SR and Hadamard signs: a fresh tracker per call, states
     * "stochastic_rounding" (seed 1) and "hadamard" (seed 2) at offset 0. */
    lowp_rng_tracker rng;
    s = lowp_rng_tracker_init(&rng, 0);
    if (s == LOWP_OK) s = lowp_rng_tracker_add(&rng, "stochastic_rounding", 1);
    if (s == LOWP_OK) s = lowp_rng_tracker_add(&rng, "hadamard", 2);
    lowp_linear_opts opts = {.recompute = 0, .threads = threads, .fp32_plain = fp32_plain};
    opts.rng = &rng;
    const int32_t *offs = ob.held ? ob.view.buf : NULL;
    const float *bias = bb.held ? bb.view.buf : NULL;
    float *dbias = dbb.held ? dbb.view.buf : NULL;
    Py_BEGIN_ALLOW_THREADS;
    lowp_linear_saved *saved = NULL;
    if (s == LOWP_OK) s = lowp_train_prepare(&p, 1, &r);
    if (s == LOWP_OK)
        s = G > 0 ? lowp_grouped_linear_forward(&p, &x, offs, &y, &opts, &saved)
                  : lowp_linear_forward(&p, bias, &x, &y, &opts, &saved);
    if (s == LOWP_OK)
        s = G > 0 ? lowp_grouped_linear_backward(&p, &x, offs, &dy, &dx, &opts, saved)
                  : lowp_linear_backward(&p, &x, &dy, &dx, dbias, &opts, saved);
    else
        lowp_linear_saved_free(saved);
    if (p.wrap) {
        /* keep the first failure's message */
        lowp_status s2 = lowp_train_convert(&p, 1);
        if (s == LOWP_OK) s = s2;
    }
    Py_END_ALLOW_THREADS;
    if (s != LOWP_OK) {
        ext_raise(s);
        goto done;
    }
    ret = Py_NewRef(Py_None);
done:
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ext_buf_release(all[i]);
    return ret;
}

/* The C trainer's checkpoint integrity code (src/io/crc32c.h, src/trainer/checkpoint_check.h:
 * internal to liblowp, linked here from the static library; declared here because the
 * extension does not see src/). The PyTorch trainer (lowp.torch.trainer.checkpoint) writes the same
 * format and checks its files with this checker. */
uint32_t lowp_crc32c(uint32_t crc, const void *p, size_t n);
lowp_status lowp_ckpt_verify(const lowp_safetensors *f, const char *path);

/* crc32c(data, crc=0) -> int: the CRC-32C of data's bytes, continued from crc. */
static PyObject *py_crc32c(PyObject *self, PyObject *args) {
    (void) self;
    PyObject *data_o;
    unsigned int crc = 0;
    if (!PyArg_ParseTuple(args, "O|I", &data_o, &crc)) return NULL;
    ext_buf b;
    if (ext_buf_get(data_o, &b, 0, 0, "crc32c", "data")) return NULL;
    uint32_t c;
    Py_BEGIN_ALLOW_THREADS;
    c = lowp_crc32c((uint32_t) crc, b.view.buf, (size_t) b.view.len);
    Py_END_ALLOW_THREADS;
    ext_buf_release(&b);
    return PyLong_FromUnsignedLong(c);
}

/* checkpoint_verify(data, path): parse a safetensors file's bytes (every structural check of
 * lowp_safetensors_parse) and verify its CRC-32C checksums (lowp_ckpt_verify); ValueError
 * naming the tensor, the metadata or the malformed part. */
static PyObject *py_checkpoint_verify(PyObject *self, PyObject *args) {
    (void) self;
    PyObject *data_o;
    const char *path;
    if (!PyArg_ParseTuple(args, "Os", &data_o, &path)) return NULL;
    ext_buf b;
    if (ext_buf_get(data_o, &b, 0, 0, "checkpoint_verify", "data")) return NULL;
    lowp_safetensors *f = NULL;
    lowp_status s;
    Py_BEGIN_ALLOW_THREADS;
    s = lowp_safetensors_parse(b.view.buf, (size_t) b.view.len, &f);
    if (s == LOWP_OK) s = lowp_ckpt_verify(f, path);
    lowp_safetensors_free(f);
    Py_END_ALLOW_THREADS;
    ext_buf_release(&b);
    if (s != LOWP_OK) return ext_raise(s);
    Py_RETURN_NONE;
}

PyMethodDef ext_train_methods[] = {
    {"crc32c", py_crc32c, METH_VARARGS, "crc32c(data, crc=0) -> int (CRC-32C)"},
    {"checkpoint_verify", py_checkpoint_verify, METH_VARARGS,
     "checkpoint_verify(data, path): the C trainer's checkpoint checksum check"},
    {"delayed_record", py_delayed_record, METH_VARARGS, "delayed_record(history, amax, format)"},
    {"delayed_update", py_delayed_update, METH_VARARGS,
     "delayed_update(history, scale, format, margin, algo) -> (scale, scale_inv)"},
    {"extra_state_pack", py_extra_state_pack, METH_VARARGS,
     "extra_state_pack(history_len, margin, algo, formats, histories, scales) -> bytes"},
    {"extra_state_unpack", py_extra_state_unpack, METH_VARARGS,
     "extra_state_unpack(blob, history_len, margin, algo, formats, histories_out, scales_out)"},
    {"train_linear", py_train_linear, METH_VARARGS,
     "train_linear(preset, x, M, K, w, G, N, dy, bias, offs, y, dx, dw, dbias, keep_quantized, "
     "wgrad_hp, fp32_plain, threads)"},
    {NULL, NULL, 0, NULL},
};
