/* lowp._lowp.tables(): the C library's rule tables as Python data, read from the library's own
 * tables and functions (nothing here states a rule): the format traits, the scaling traits,
 * the scale-mode names, the GEMM operand pairs lowp_gemm multiplies, the linear presets, the
 * built-in recipes and the linear plan. python/lowp/rules.py serves them to the package, and
 * tools/gen_tables.py writes them to python/lowp/_tables.py for hosts without the extension. */
#include "ext.h"

static const char *const k_roles[LOWP_ROLE_COUNT] = {"input", "weight", "grad_output"};
static const char *const k_gemms[LOWP_LINEAR_GEMM_COUNT] = {"forward", "dgrad", "wgrad"};

/* Steals `v`; -1 (an exception set) when v is NULL or the insertion fails. */
static int put(PyObject *d, const char *key, PyObject *v) {
    if (!v) return -1;
    int r = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return r;
}

static PyObject *format_dict(const lowp_format_traits *t) {
    return Py_BuildValue("{s:i,s:i,s:i,s:i,s:i,s:O,s:O,s:d,s:i,s:d,s:d,s:I,s:I}", "code",
                         (int) t->format, "bits", t->bits, "ebits", t->ebits, "mbits", t->mbits,
                         "bias", t->bias, "signed", t->is_signed ? Py_True : Py_False, "has_inf",
                         t->has_inf ? Py_True : Py_False, "fmax", (double) t->fmax, "emax", t->emax,
                         "min_normal", (double) t->min_normal, "min_subnormal",
                         (double) t->min_subnormal, "max_code", (unsigned) t->max_code, "nan_code",
                         (unsigned) t->nan_code);
}

static PyObject *formats(void) {
    PyObject *d = PyDict_New();
    for (int f = 0; d && f < LOWP_FORMAT_COUNT; f++) {
        const lowp_format_traits *t;
        if (lowp_format_get((lowp_format) f, &t) != LOWP_OK)
            return Py_DECREF(d), ext_raise(LOWP_ERR_INVALID_ARG);
        if (put(d, t->name, format_dict(t))) Py_CLEAR(d);
    }
    return d;
}

/* scale: "e8m0", "f32" (binary32 scale_inv), "e4m3" (NVFP4) or None (no scales); tile: 2-D
 * blocks; tensor_scale: a binary32 tensor decode scale follows the block scales. */
static PyObject *scaling_dict(const lowp_scaling_traits *t) {
    const char *scale = t->scaling == LOWP_SCALING_NONE       ? NULL
                        : t->scale_format == LOWP_FORMAT_E8M0 ? "e8m0"
                        : t->scale_format == LOWP_FORMAT_E4M3 ? "e4m3"
                                                              : "f32";
    return Py_BuildValue(
        "{s:i,s:L,s:L,s:z,s:O,s:O,s:O,s:z,s:O,s:O}", "code", (int) t->scaling, "block_rows",
        (long long) t->block_rows, "block_cols", (long long) t->block_cols, "scale", scale,
        "grouped", t->grouped ? Py_True : Py_False, "tile", t->block_rows > 1 ? Py_True : Py_False,
        "transposes", t->transposes ? Py_True : Py_False, "default_mode",
        t->scale_is_e8m0 ? lowp_scale_mode_name(t->default_mode) : NULL, "default_pow2",
        t->default_pow2 ? Py_True : Py_False, "tensor_scale", t->tensor_scale ? Py_True : Py_False);
}

static PyObject *scalings(void) {
    PyObject *d = PyDict_New();
    for (int s = 0; d && s < LOWP_SCALING_COUNT; s++) {
        const lowp_scaling_traits *t;
        if (lowp_scaling_get((lowp_scaling) s, &t) != LOWP_OK)
            return Py_DECREF(d), ext_raise(LOWP_ERR_INVALID_ARG);
        if (put(d, t->name, scaling_dict(t))) Py_CLEAR(d);
    }
    return d;
}

static PyObject *scale_modes(void) {
    PyObject *d = PyDict_New();
    for (int m = 0; d && strcmp(lowp_scale_mode_name((lowp_scale_mode) m), "?") != 0; m++)
        if (put(d, lowp_scale_mode_name((lowp_scale_mode) m), PyLong_FromLong(m))) Py_CLEAR(d);
    return d;
}

/* Every (a format, a scaling, b format, b scaling) that lowp_gemm multiplies. */
static PyObject *gemm_pairs(void) {
    PyObject *l = PyList_New(0);
    lowp_qtensor a = {0}, b = {0};
    for (int fa = 0; l && fa < LOWP_FORMAT_COUNT * LOWP_SCALING_COUNT; fa++)
        for (int fb = 0; l && fb < LOWP_FORMAT_COUNT * LOWP_SCALING_COUNT; fb++) {
            a.format = (lowp_format) (fa / LOWP_SCALING_COUNT);
            a.scaling = (lowp_scaling) (fa % LOWP_SCALING_COUNT);
            b.format = (lowp_format) (fb / LOWP_SCALING_COUNT);
            b.scaling = (lowp_scaling) (fb % LOWP_SCALING_COUNT);
            if (lowp_gemm_pair_check(&a, &b) != LOWP_OK) continue;
            const lowp_format_traits *ta, *tb;
            lowp_format_get(a.format, &ta), lowp_format_get(b.format, &tb);
            PyObject *t = Py_BuildValue("(ssss)", ta->name, lowp_scaling_name(a.scaling), tb->name,
                                        lowp_scaling_name(b.scaling));
            if (!t || PyList_Append(l, t)) Py_CLEAR(l);
            Py_XDECREF(t);
        }
    return l;
}

/* pow2: None (the kind's default), False or True; rounding: "rne" or "sr". */
static PyObject *spec_dict(const lowp_operand_spec *s) {
    const lowp_format_traits *t;
    if (lowp_format_get(s->format, &t) != LOWP_OK) return ext_raise(LOWP_ERR_INVALID_ARG);
    PyObject *pow2 = s->pow2_scales < 0 ? Py_None : s->pow2_scales ? Py_True : Py_False;
    const char *rounding = s->rounding == LOWP_ROUNDING_SR ? "sr" : "rne";
    return Py_BuildValue("{s:s,s:s,s:s,s:O,s:O,s:s}", "format", t->name, "scaling",
                         lowp_scaling_name(s->scaling), "scale_mode",
                         lowp_scale_mode_name(s->scale_mode), "pow2", pow2, "delayed",
                         s->delayed ? Py_True : Py_False, "rounding", rounding);
}

static PyObject *cfg_dict(const lowp_linear_cfg *c) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    const lowp_operand_spec *specs[LOWP_ROLE_COUNT] = {&c->input, &c->weight, &c->grad_output};
    for (int r = 0; r < LOWP_ROLE_COUNT; r++)
        if (put(d, k_roles[r], spec_dict(specs[r]))) return Py_DECREF(d), NULL;
    const char *algo = c->delayed.algo == LOWP_AMAX_ALGO_MAX ? "max" : "most_recent";
    if (put(d, "keep_quantized", PyBool_FromLong(c->keep_quantized)) ||
        put(d, "wgrad_hp", PyBool_FromLong(c->wgrad_hp)) ||
        put(d, "fake_quant_mxfp4", PyBool_FromLong(c->fake_quant_mxfp4)) ||
        put(d, "wgrad_hadamard", PyBool_FromLong(c->wgrad_hadamard)) ||
        put(d, "history_len", PyLong_FromLong(c->delayed.history_len)) ||
        put(d, "margin", PyFloat_FromDouble(c->delayed.margin)) ||
        put(d, "amax_compute_algo", PyUnicode_FromString(algo)))
        return Py_DECREF(d), NULL;
    return d;
}

static PyObject *presets(void) {
    PyObject *d = PyDict_New();
    const char *name;
    for (int32_t i = 0; d && (name = lowp_linear_cfg_preset_name(i)) != NULL; i++) {
        lowp_linear_cfg c;
        lowp_status st = lowp_linear_cfg_preset(name, &c);
        if (st != LOWP_OK) return Py_DECREF(d), ext_raise(st);
        if (put(d, name, cfg_dict(&c))) Py_CLEAR(d);
    }
    return d;
}

/* {recipe: [(pattern, preset name, or None for high precision), ...]} in matching order. */
static PyObject *recipe_rules(const lowp_recipe *r) {
    PyObject *l = PyList_New(0);
    for (int32_t i = 0; l && i < r->nrules; i++) {
        const lowp_recipe_rule *u = &r->rules[i];
        const char *preset = u->high_precision ? NULL : lowp_linear_cfg_name(&u->cfg);
        PyObject *t = Py_BuildValue("(sz)", u->pattern, preset);
        if (!t || PyList_Append(l, t)) Py_CLEAR(l);
        Py_XDECREF(t);
    }
    return l;
}

static PyObject *recipes(void) {
    PyObject *d = PyDict_New();
    const char *name;
    lowp_recipe *r = PyMem_Malloc(sizeof *r);
    if (!r) return Py_XDECREF(d), PyErr_NoMemory();
    for (int32_t i = 0; d && (name = lowp_recipe_name_at(i)) != NULL; i++) {
        lowp_status st = lowp_recipe_init(r, name);
        if (st != LOWP_OK) {
            Py_CLEAR(d);
            ext_raise(st);
        } else if (put(d, name, recipe_rules(r))) {
            Py_CLEAR(d);
        }
    }
    PyMem_Free(r);
    return d;
}

static PyObject *gemm_plan_dict(const lowp_linear_gemm_plan *g) {
    return Py_BuildValue("{s:O,s:s,s:O,s:s,s:O,s:O}", "quantized",
                         g->quantized ? Py_True : Py_False, "a", k_roles[g->a_role], "a_columnwise",
                         g->a_columnwise ? Py_True : Py_False, "b", k_roles[g->b_role],
                         "b_columnwise", g->b_columnwise ? Py_True : Py_False, "b_kn",
                         g->b_kn ? Py_True : Py_False);
}

/* The plan of one (input quantized, grad_output quantized, wgrad_hp, weight scaling) case. */
static PyObject *plan_entry(int qi, int qg, int hp, int ws) {
    lowp_linear_cfg c;
    lowp_linear_cfg_preset("bf16", &c);
    if (qi) c.input.format = LOWP_FORMAT_E4M3;
    if (qg) c.grad_output.format = LOWP_FORMAT_E4M3;
    if (ws != LOWP_SCALING_NONE) c.weight.format = LOWP_FORMAT_E4M3;
    c.weight.scaling = (lowp_scaling) ws;
    c.wgrad_hp = hp;
    lowp_linear_plan p;
    lowp_status st = lowp_linear_plan_get(&c, &p);
    if (st != LOWP_OK) return ext_raise(st);
    PyObject *d = PyDict_New();
    for (int g = 0; d && g < LOWP_LINEAR_GEMM_COUNT; g++)
        if (put(d, k_gemms[g], gemm_plan_dict(&p.gemm[g]))) Py_CLEAR(d);
    return d;
}

/* {(input quantized, grad_output quantized, wgrad_hp, weight scaling or "none"):
 *  {"forward" | "dgrad" | "wgrad": gemm plan}}: every case lowp_linear_plan_get tells apart. */
static PyObject *linear_plan(void) {
    PyObject *d = PyDict_New();
    for (int i = 0; d && i < 8 * LOWP_SCALING_COUNT; i++) {
        const int qi = i & 1, qg = (i >> 1) & 1, hp = (i >> 2) & 1, ws = i >> 3;
        PyObject *key =
            Py_BuildValue("(OOOs)", qi ? Py_True : Py_False, qg ? Py_True : Py_False,
                          hp ? Py_True : Py_False, lowp_scaling_name((lowp_scaling) ws));
        PyObject *v = key ? plan_entry(qi, qg, hp, ws) : NULL;
        if (!v || PyDict_SetItem(d, key, v)) Py_CLEAR(d);
        Py_XDECREF(key);
        Py_XDECREF(v);
    }
    return d;
}

/* tables() -> dict, see the top of this file. */
static PyObject *py_tables(PyObject *self, PyObject *noargs) {
    (void) self, (void) noargs;
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    if (put(d, "formats", formats()) || put(d, "scalings", scalings()) ||
        put(d, "scale_modes", scale_modes()) || put(d, "gemm_pairs", gemm_pairs()) ||
        put(d, "presets", presets()) || put(d, "recipes", recipes()) ||
        put(d, "linear_plan", linear_plan()))
        Py_CLEAR(d);
    return d;
}

PyMethodDef ext_tables_methods[] = {
    {"tables", py_tables, METH_NOARGS,
     "tables() -> dict: the C library's formats, scalings, scale modes, GEMM pairs, linear "
     "presets, recipes and linear plan"},
    {NULL, NULL, 0, NULL},
};
