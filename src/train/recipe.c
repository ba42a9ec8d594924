/* Recipes: the built-in linear-layer presets, the built-in recipes made of them, shell-glob
 * name matching (first rule wins), and the validation every configuration passes before it
 * can wrap a weight: a configuration whose GEMM operand pairs lowp_gemm does not multiply is
 * refused here, when the recipe is built, not in the middle of a training step. */
#include <math.h>
#include <stdio.h>

#include "core/gemm_pair.h"
#include "train_internal.h"

/* ---- Presets ---- */

static void set_spec(lowp_operand_spec *s, lowp_format format, lowp_scaling scaling,
                     int32_t delayed) {
    s->format = format;
    s->scaling = scaling;
    s->scale_mode = LOWP_SCALE_MODE_DEFAULT;
    s->pow2_scales = -1;
    s->delayed = delayed;
    s->rounding = LOWP_ROUNDING_RNE;
}

static void base_cfg(lowp_linear_cfg *c) {
    memset(c, 0, sizeof *c);
    lowp_delayed_cfg_init(&c->delayed, LOWP_FORMAT_E4M3);
}

static void preset_bf16(lowp_linear_cfg *c) {
    base_cfg(c);
    set_spec(&c->input, LOWP_FORMAT_BF16, LOWP_SCALING_NONE, 0);
    set_spec(&c->weight, LOWP_FORMAT_BF16, LOWP_SCALING_NONE, 0);
    set_spec(&c->grad_output, LOWP_FORMAT_BF16, LOWP_SCALING_NONE, 0);
}

/* HYBRID: E4M3 for the forward operands, E5M2 for the gradient (wider range, less precision). */
static void preset_fp8_tensor(lowp_linear_cfg *c, int32_t delayed) {
    base_cfg(c);
    set_spec(&c->input, LOWP_FORMAT_E4M3, LOWP_SCALING_TENSOR, delayed);
    set_spec(&c->weight, LOWP_FORMAT_E4M3, LOWP_SCALING_TENSOR, delayed);
    set_spec(&c->grad_output, LOWP_FORMAT_E5M2, LOWP_SCALING_TENSOR, delayed);
    c->keep_quantized = 1; /* TE saves the FP8 input for the backward */
}
static void preset_fp8_delayed(lowp_linear_cfg *c) {
    preset_fp8_tensor(c, 1);
}
static void preset_fp8_current(lowp_linear_cfg *c) {
    preset_fp8_tensor(c, 0);
}

static void preset_fp8_rowwise(lowp_linear_cfg *c) {
    base_cfg(c);
    set_spec(&c->input, LOWP_FORMAT_E4M3, LOWP_SCALING_ROW, 0);
    set_spec(&c->weight, LOWP_FORMAT_E4M3, LOWP_SCALING_ROW, 0);
    set_spec(&c->grad_output, LOWP_FORMAT_E4M3, LOWP_SCALING_ROW, 0);
    c->keep_quantized = 0; /* torchao's rowwise recipe requantizes along the other axis */
}

static void preset_mxfp8(lowp_linear_cfg *c) {
    base_cfg(c);
    set_spec(&c->input, LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, 0);
    set_spec(&c->weight, LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, 0);
    set_spec(&c->grad_output, LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, 0);
    c->input.scale_mode = c->weight.scale_mode = c->grad_output.scale_mode = LOWP_SCALE_MODE_RCEIL;
    c->keep_quantized = 1;
}

static void preset_block128(lowp_linear_cfg *c) {
    base_cfg(c);
    set_spec(&c->input, LOWP_FORMAT_E4M3, LOWP_SCALING_BLOCK128, 0);
    set_spec(&c->weight, LOWP_FORMAT_E4M3, LOWP_SCALING_BLOCK128X128, 0);
    set_spec(&c->grad_output, LOWP_FORMAT_E4M3, LOWP_SCALING_BLOCK128, 0);
    c->keep_quantized = 1; /* DeepSeek-V3 caches the FP8 activations for the backward */
}

/* NPU Block FP8: one 32x32-tiled weight copy serves the forward and the dgrad GEMM. */
static void preset_block_fp8(lowp_linear_cfg *c) {
    base_cfg(c);
    set_spec(&c->input, LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, 0);
    set_spec(&c->weight, LOWP_FORMAT_E4M3, LOWP_SCALING_BLOCK32X32, 0);
    set_spec(&c->grad_output, LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, 0);
    c->keep_quantized = 1;
}

static void preset_block_fp8_fp4(lowp_linear_cfg *c) {
    preset_block_fp8(c);
    c->fake_quant_mxfp4 = 1;
}

/* TransformerEngine's NVFP4BlockScaling for one linear layer: 1x16 activations and gradients,
 * 16x16 weight tiles (one copy serves forward and dgrad), stochastic rounding of the gradient's
 * elements and the random Hadamard transform on both wgrad operands (docs/numerics.md 4b). X is
 * requantized in the backward: its wgrad copy is taken after the transform. */
static void preset_nvfp4(lowp_linear_cfg *c) {
    base_cfg(c);
    set_spec(&c->input, LOWP_FORMAT_E2M1, LOWP_SCALING_NV16, 0);
    set_spec(&c->weight, LOWP_FORMAT_E2M1, LOWP_SCALING_NV16X16, 0);
    set_spec(&c->grad_output, LOWP_FORMAT_E2M1, LOWP_SCALING_NV16, 0);
    c->grad_output.rounding = LOWP_ROUNDING_SR;
    c->wgrad_hadamard = 1;
}

/* MXFP4 after Tseng et al. 2025 ("Training LLMs with MXFP4"): E2M1 in MX 1x32 blocks with RCEIL
 * scales (no block maximum beyond 6, so SR needs no 3/4 prescale), SR of the gradient, and the
 * random Hadamard transform on the wgrad operands (docs/numerics.md 4b). */
static void preset_mxfp4(lowp_linear_cfg *c) {
    base_cfg(c);
    set_spec(&c->input, LOWP_FORMAT_E2M1, LOWP_SCALING_MX32, 0);
    set_spec(&c->weight, LOWP_FORMAT_E2M1, LOWP_SCALING_MX32, 0);
    set_spec(&c->grad_output, LOWP_FORMAT_E2M1, LOWP_SCALING_MX32, 0);
    c->input.scale_mode = c->weight.scale_mode = c->grad_output.scale_mode = LOWP_SCALE_MODE_RCEIL;
    c->grad_output.rounding = LOWP_ROUNDING_SR;
    c->wgrad_hadamard = 1;
}

typedef struct preset {
    const char *name;
    void (*make)(lowp_linear_cfg *);
} preset;

static const preset k_presets[] = {
    {"bf16", preset_bf16},
    {"fp8_delayed", preset_fp8_delayed},
    {"fp8_current", preset_fp8_current},
    {"fp8_rowwise", preset_fp8_rowwise},
    {"mxfp8", preset_mxfp8},
    {"block128", preset_block128},
    {"block_fp8", preset_block_fp8},
    {"block_fp8_fp4", preset_block_fp8_fp4},
    {"nvfp4", preset_nvfp4},
    {"mxfp4", preset_mxfp4},
};
#define N_PRESETS ((int) (sizeof k_presets / sizeof k_presets[0]))

lowp_status lowp_linear_cfg_preset(const char *name, lowp_linear_cfg *cfg) {
    const char *fn = "lowp_linear_cfg_preset";
    LOWP_CHECK_PTR(fn, name);
    LOWP_CHECK_PTR(fn, cfg);
    for (int i = 0; i < N_PRESETS; i++)
        if (strcmp(name, k_presets[i].name) == 0) {
            k_presets[i].make(cfg);
            return LOWP_OK;
        }
    return lowp_fail(LOWP_ERR_NOT_FOUND,
                     "%s: name (\"%s\") is not a preset (bf16, fp8_delayed, fp8_current, "
                     "fp8_rowwise, mxfp8, block128, block_fp8, block_fp8_fp4, nvfp4, mxfp4)",
                     fn, name);
}

const char *lowp_linear_cfg_preset_name(int32_t index) {
    return index >= 0 && index < N_PRESETS ? k_presets[index].name : NULL;
}

/* ---- The linear plan ---- */

static void gemm_plan(lowp_linear_gemm_plan *g, int32_t quantized, lowp_role a, int32_t a_col,
                      lowp_role b, int32_t b_col) {
    g->quantized = quantized;
    g->a_role = (int32_t) a, g->a_columnwise = a_col;
    g->b_role = (int32_t) b, g->b_columnwise = b_col;
    g->b_kn = 0;
}

lowp_status lowp_linear_plan_get(const lowp_linear_cfg *cfg, lowp_linear_plan *plan) {
    LOWP_CHECK_PTR("lowp_linear_plan_get", cfg);
    LOWP_CHECK_PTR("lowp_linear_plan_get", plan);
    const int32_t qi = lowp_spec_quantized(&cfg->input), qw = lowp_spec_quantized(&cfg->weight),
                  qg = lowp_spec_quantized(&cfg->grad_output);
    const int32_t fwd = qi && qw, dgrad = qg && qw, wgrad = qg && qi && !cfg->wgrad_hp;
    lowp_linear_gemm_plan *g = plan->gemm;
    gemm_plan(&g[LOWP_LINEAR_FORWARD], fwd, LOWP_ROLE_INPUT, 0, LOWP_ROLE_WEIGHT, 0);
    gemm_plan(&g[LOWP_LINEAR_DGRAD], dgrad, LOWP_ROLE_GRAD_OUTPUT, 0, LOWP_ROLE_WEIGHT, 1);
    gemm_plan(&g[LOWP_LINEAR_WGRAD], wgrad, LOWP_ROLE_GRAD_OUTPUT, 1, LOWP_ROLE_INPUT, 1);
    /* Both GEMMs take the weight in the same kind, and a copy of W^T in that kind would hold
     * the codes and scales of W's copy, transposed: then one copy serves both. */
    const lowp_scaling_traits *t = NULL;
    if ((unsigned) cfg->weight.scaling < LOWP_SCALING_COUNT)
        lowp_scaling_get(cfg->weight.scaling, &t);
    const int transposes = t && t->transposes;
    if (fwd == dgrad && (!dgrad || transposes)) {
        g[LOWP_LINEAR_DGRAD].b_kn = 1;
        g[LOWP_LINEAR_DGRAD].b_columnwise = 0;
    }
    return LOWP_OK;
}

static int spec_equal(const lowp_operand_spec *a, const lowp_operand_spec *b) {
    return a->format == b->format && a->scaling == b->scaling && a->scale_mode == b->scale_mode &&
           a->pow2_scales == b->pow2_scales && a->delayed == b->delayed &&
           a->rounding == b->rounding;
}

static int cfg_equal(const lowp_linear_cfg *a, const lowp_linear_cfg *b) {
    return spec_equal(&a->input, &b->input) && spec_equal(&a->weight, &b->weight) &&
           spec_equal(&a->grad_output, &b->grad_output) && a->keep_quantized == b->keep_quantized &&
           a->wgrad_hp == b->wgrad_hp && a->fake_quant_mxfp4 == b->fake_quant_mxfp4 &&
           a->delayed.history_len == b->delayed.history_len &&
           a->delayed.margin == b->delayed.margin && a->delayed.algo == b->delayed.algo &&
           a->wgrad_hadamard == b->wgrad_hadamard;
}

const char *lowp_linear_cfg_name(const lowp_linear_cfg *cfg) {
    for (int i = 0; i < N_PRESETS; i++) {
        lowp_linear_cfg p;
        k_presets[i].make(&p);
        if (cfg_equal(cfg, &p)) return k_presets[i].name;
    }
    return "custom";
}

/* ---- Validation ---- */

static lowp_status check_spec(const char *fn, const char *role, const lowp_operand_spec *s,
                              int activation) {
    if (s->format == LOWP_FORMAT_BF16) return LOWP_OK; /* not quantized: the rest is ignored */
    if (s->format != LOWP_FORMAT_E4M3 && s->format != LOWP_FORMAT_E5M2 &&
        s->format != LOWP_FORMAT_E2M1)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: cfg.%s.format (%d) is not e4m3, e5m2, e2m1 or bf16", fn, role,
                         (int) s->format);
    if ((unsigned) s->scaling >= LOWP_SCALING_COUNT || s->scaling == LOWP_SCALING_NONE)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: cfg.%s.scaling (%d) is not a quantized lowp_scaling", fn, role,
                         (int) s->scaling);
    const int nv = s->scaling == LOWP_SCALING_NV16 || s->scaling == LOWP_SCALING_NV16X16;
    if (s->format == LOWP_FORMAT_E2M1 && s->scaling != LOWP_SCALING_MX32 && !nv)
        return lowp_fail(LOWP_ERR_UNSUPPORTED,
                         "%s: cfg.%s is e2m1 with scaling %s (e2m1 is mx32, nv16 or nv16x16)", fn,
                         role, lowp_scaling_name(s->scaling));
    if (nv && s->format != LOWP_FORMAT_E2M1)
        return lowp_fail(LOWP_ERR_UNSUPPORTED, "%s: cfg.%s.scaling (%s) takes e2m1 elements only",
                         fn, role, lowp_scaling_name(s->scaling));
    if (s->rounding != LOWP_ROUNDING_RNE && s->rounding != LOWP_ROUNDING_SR)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.%s.rounding (%d) is not rne or sr", fn,
                         role, (int) s->rounding);
    if (s->rounding == LOWP_ROUNDING_SR && s->format != LOWP_FORMAT_E2M1)
        return lowp_fail(LOWP_ERR_UNSUPPORTED,
                         "%s: cfg.%s.rounding is sr but its format is not e2m1 (stochastic "
                         "rounding is implemented for e2m1 elements)",
                         fn, role);
    if (!activation && s->rounding == LOWP_ROUNDING_SR)
        return lowp_fail(LOWP_ERR_UNSUPPORTED,
                         "%s: cfg.%s.rounding is sr, which the training layer implements for "
                         "input and grad_output only",
                         fn, role);
    if (activation && (s->scaling == LOWP_SCALING_BLOCK128X128 ||
                       s->scaling == LOWP_SCALING_BLOCK32X32 || s->scaling == LOWP_SCALING_NV16X16))
        return lowp_fail(LOWP_ERR_UNSUPPORTED,
                         "%s: cfg.%s.scaling (%s) is a weight tiling; activations and gradients "
                         "are quantized along one axis",
                         fn, role, lowp_scaling_name(s->scaling));
    if (s->scale_mode < LOWP_SCALE_MODE_DEFAULT || s->scale_mode > LOWP_SCALE_MODE_EVEN)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: cfg.%s.scale_mode (%d) is not a lowp_scale_mode", fn, role,
                         (int) s->scale_mode);
    if (s->pow2_scales < -1 || s->pow2_scales > 1)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.%s.pow2_scales (%d) is not -1, 0 or 1", fn,
                         role, s->pow2_scales);
    if (s->delayed != 0 && s->delayed != 1)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.%s.delayed (%d) is not 0 or 1", fn, role,
                         s->delayed);
    if (s->delayed && s->scaling != LOWP_SCALING_TENSOR)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: cfg.%s.delayed is 1 but its scaling (%s) is not tensor (delayed "
                         "scaling keeps one amax history per tensor)",
                         fn, role, lowp_scaling_name(s->scaling));
    if (s->delayed && s->format == LOWP_FORMAT_E2M1)
        return lowp_fail(LOWP_ERR_UNSUPPORTED, "%s: cfg.%s: delayed scaling needs e4m3 or e5m2", fn,
                         role);
    return LOWP_OK;
}

/* One GEMM of the layer, when both of its operands are quantized. */
static lowp_status check_pair(const char *fn, const char *gemm, const char *ra,
                              const lowp_operand_spec *a, const char *rb,
                              const lowp_operand_spec *b) {
    if (!lowp_spec_quantized(a) || !lowp_spec_quantized(b)) return LOWP_OK; /* runs in BF16 */
    lowp_qtensor qa = {a->format, a->scaling, 0, 0, NULL, NULL, LOWP_DEVICE_HOST, NULL, 0};
    lowp_qtensor qb = {b->format, b->scaling, 0, 0, NULL, NULL, LOWP_DEVICE_HOST, NULL, 0};
    lowp_gemm_pair pair;
    int64_t bk;
    lowp_status st = lowp_gemm_classify(fn, &qa, &qb, &pair, &bk);
    if (st != LOWP_OK) {
        lowp_error_append("in the %s GEMM (a = cfg.%s, b = cfg.%s)", gemm, ra, rb);
        return st;
    }
    return LOWP_OK;
}

static lowp_status check_flag(const char *fn, const char *name, int32_t v) {
    if (v != 0 && v != 1)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.%s (%d) is not 0 or 1", fn, name, v);
    return LOWP_OK;
}

lowp_status lowp_linear_cfg_check(const char *fn, const lowp_linear_cfg *cfg) {
    LOWP_CHECK_PTR(fn, cfg);
    lowp_status st;
    if ((st = check_spec(fn, "input", &cfg->input, 1)) != LOWP_OK) return st;
    if ((st = check_spec(fn, "weight", &cfg->weight, 0)) != LOWP_OK) return st;
    if ((st = check_spec(fn, "grad_output", &cfg->grad_output, 1)) != LOWP_OK) return st;
    if ((st = check_flag(fn, "keep_quantized", cfg->keep_quantized)) != LOWP_OK) return st;
    if ((st = check_flag(fn, "wgrad_hp", cfg->wgrad_hp)) != LOWP_OK) return st;
    if ((st = check_flag(fn, "fake_quant_mxfp4", cfg->fake_quant_mxfp4)) != LOWP_OK) return st;
    if ((st = check_flag(fn, "wgrad_hadamard", cfg->wgrad_hadamard)) != LOWP_OK) return st;
    if (cfg->wgrad_hadamard &&
        (cfg->keep_quantized || cfg->wgrad_hp || !lowp_spec_quantized(&cfg->input) ||
         !lowp_spec_quantized(&cfg->grad_output)))
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: cfg.wgrad_hadamard is 1 but the wgrad GEMM is not quantized from "
                         "the backward (it needs quantized input and grad_output, wgrad_hp 0 and "
                         "keep_quantized 0: X's wgrad copy is made after the transform)",
                         fn);
    if (lowp_spec_delayed(&cfg->input) || lowp_spec_delayed(&cfg->weight) ||
        lowp_spec_delayed(&cfg->grad_output)) {
        if ((st = lowp_delayed_cfg_check(fn, "cfg.delayed", &cfg->delayed)) != LOWP_OK) return st;
    }
    if ((st = check_pair(fn, "forward", "input", &cfg->input, "weight", &cfg->weight)) != LOWP_OK)
        return st;
    if ((st = check_pair(fn, "dgrad", "grad_output", &cfg->grad_output, "weight", &cfg->weight)) !=
        LOWP_OK)
        return st;
    if (!cfg->wgrad_hp && (st = check_pair(fn, "wgrad", "grad_output", &cfg->grad_output, "input",
                                           &cfg->input)) != LOWP_OK)
        return st;
    return LOWP_OK;
}

/* ---- Name patterns ---- */

/* Does the bracket expression starting after '[' at *pp match c? Advances *pp past ']'.
 * Returns -1 when the expression is unterminated (then '[' is an ordinary character). */
static int match_set(const char **pp, char c) {
    const char *p = *pp;
    int negate = 0, hit = 0;
    if (*p == '!' || *p == '^') negate = 1, p++;
    const char *start = p; /* a ']' right after '[' or '[!' is a member, not the end */
    while (*p && (p == start || *p != ']')) {
        unsigned char lo = (unsigned char) *p++;
        if (lo == '\\' && *p) lo = (unsigned char) *p++;
        unsigned char hi = lo;
        if (p[0] == '-' && p[1] && p[1] != ']') {
            hi = (unsigned char) p[1];
            p += 2;
        }
        if ((unsigned char) c >= lo && (unsigned char) c <= hi) hit = 1;
    }
    if (*p != ']') return -1;
    *pp = p + 1;
    return hit != negate;
}

/* Shell glob: `*` any run, `?` one character, `[...]` a set (`!` or `^` negates, ranges
 * a-z), `\` escapes. Iterative: on a mismatch, the last `*` takes one more character. */
static int glob_match(const char *pat, const char *s) {
    const char *star_p = NULL, *star_s = NULL;
    while (*s) {
        const char *p = pat;
        int ok = 0;
        if (*p == '*') {
            while (*p == '*') p++;
            star_p = p;
            star_s = s;
            pat = p;
            continue;
        }
        if (*p == '?') {
            ok = 1;
            p++;
        } else if (*p == '[') {
            const char *q = p + 1;
            int m = match_set(&q, *s);
            if (m < 0)
                ok = *s == '[', p++;
            else
                ok = m, p = q;
        } else if (*p == '\\' && p[1]) {
            ok = p[1] == *s;
            p += 2;
        } else if (*p) {
            ok = *p == *s;
            p++;
        }
        if (ok) {
            pat = p;
            s++;
        } else if (star_p) {
            pat = star_p;
            s = ++star_s;
        } else {
            return 0;
        }
    }
    while (*pat == '*') pat++;
    return *pat == '\0';
}

/* ---- Recipes ---- */

static lowp_status add_rule(lowp_recipe *r, const char *pattern, const lowp_linear_cfg *cfg) {
    const char *fn = "lowp_recipe_append";
    if (r->nrules < 0 || r->nrules >= LOWP_RECIPE_MAX_RULES)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: recipe.nrules (%d) is not in [0, %d)", fn,
                         r->nrules, LOWP_RECIPE_MAX_RULES);
    size_t len = strlen(pattern);
    if (len == 0) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: pattern is empty", fn);
    if (len >= LOWP_RECIPE_PATTERN_MAX)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: pattern (\"%.20s...\", %zu chars) is longer than %d", fn, pattern,
                         len, LOWP_RECIPE_PATTERN_MAX - 1);
    if (cfg) {
        lowp_status st = lowp_linear_cfg_check(fn, cfg);
        if (st != LOWP_OK) return st;
    }
    lowp_recipe_rule *rule = &r->rules[r->nrules];
    memset(rule, 0, sizeof *rule);
    memcpy(rule->pattern, pattern, len + 1);
    rule->high_precision = cfg == NULL;
    if (cfg) rule->cfg = *cfg;
    r->nrules++;
    return LOWP_OK;
}

/* What every built-in recipe keeps in high precision: MoE routers, embeddings and the output
 * head are small GEMMs whose errors feed every token (and, for the router, the expert choice
 * itself); norms are no GEMM operands. The names are lowp's models' (src/model: embed, head,
 * final_norm) and torchtitan's, before 0.3.0 and in it (tok_embeddings, output, lm_head, norm),
 * which lowp.torch reads from this table too. */
static const char *const k_hp_patterns[] = {"*router*", "*embed*",    "head*",     "*.head",
                                            "output*",  "*.output.*", "*lm_head*", "*norm*"};

/* Routed experts: lowp's models and torchtitan before 0.3.0 (layers.N.moe.experts.w1), and
 * torchtitan 0.3.0 (layers.N.moe.routed_experts.inner_experts.w1_EFD); shared experts: lowp's
 * (layers.N.moe.shared.w1) and torchtitan's (layers.N.moe.shared_experts.w1.weight). */
static const char *const k_expert_patterns[] = {"*.moe.experts.*", "*.moe.routed_experts.*"};
static const char *const k_shared_patterns[] = {"*.moe.shared_experts.*", "*.moe.shared.*"};

/* The FP4 recipes keep the last transformer block in high precision, as NVIDIA's NVFP4
 * pretraining keeps its last blocks in BF16. `{last}` stands for that block's index, resolved
 * from the parameter names by lowp_recipe_bind_last (lowp_train_prepare does it): lowp's and
 * torchtitan's names both read layers.N. ... */
static const char *const k_last_patterns[] = {"layers.{last}.*", "*.layers.{last}.*"};

typedef struct builtin {
    const char *name;
    const char *all;     /* preset of every other weight */
    const char *shared;  /* preset of shared experts (NULL: as `all`) */
    const char *experts; /* preset of routed experts (NULL: as `all`) */
    int hp_last;         /* 1: the last transformer block stays in high precision */
} builtin;

static const builtin k_recipes[] = {
    {"bf16", "bf16", NULL, NULL, 0},
    {"fp8_delayed", "fp8_delayed", NULL, NULL, 0},
    {"fp8_current", "fp8_current", NULL, NULL, 0},
    {"fp8_rowwise", "fp8_rowwise", NULL, NULL, 0},
    {"all_mxfp8", "mxfp8", NULL, NULL, 0},
    {"block128", "block128", NULL, NULL, 0},
    {"all_block_fp8", "block_fp8", NULL, NULL, 0},
    {"mix", "mxfp8", "mxfp8", "block_fp8", 0},
    {"mix_fp4", "mxfp8", "mxfp8", "block_fp8_fp4", 0},
    {"nvfp4", "nvfp4", NULL, NULL, 1},
    {"mxfp4", "mxfp4", NULL, NULL, 1},
};
#define N_RECIPES ((int) (sizeof k_recipes / sizeof k_recipes[0]))

const char *lowp_recipe_name_at(int32_t index) {
    return index >= 0 && index < N_RECIPES ? k_recipes[index].name : NULL;
}

const char *lowp_recipe_names(void) {
    return "bf16,fp8_delayed,fp8_current,fp8_rowwise,all_mxfp8,block128,all_block_fp8,mix,"
           "mix_fp4,nvfp4,mxfp4";
}

lowp_status lowp_recipe_init(lowp_recipe *recipe, const char *name) {
    const char *fn = "lowp_recipe_init";
    LOWP_CHECK_PTR(fn, recipe);
    LOWP_CHECK_PTR(fn, name);
    const builtin *b = NULL;
    for (int i = 0; i < N_RECIPES; i++)
        if (strcmp(name, k_recipes[i].name) == 0) b = &k_recipes[i];
    if (!b && strcmp(name, "custom") != 0)
        return lowp_fail(LOWP_ERR_NOT_FOUND, "%s: name (\"%s\") is not a recipe (%s, custom)", fn,
                         name, lowp_recipe_names());
    memset(recipe, 0, sizeof *recipe);
    snprintf(recipe->name, sizeof recipe->name, "%s", name);
    if (!b) return LOWP_OK;
    lowp_status st;
    for (size_t i = 0; i < sizeof k_hp_patterns / sizeof k_hp_patterns[0]; i++)
        if ((st = add_rule(recipe, k_hp_patterns[i], NULL)) != LOWP_OK) return st;
    for (size_t i = 0; b->hp_last && i < sizeof k_last_patterns / sizeof k_last_patterns[0]; i++)
        if ((st = add_rule(recipe, k_last_patterns[i], NULL)) != LOWP_OK) return st;
    lowp_linear_cfg c;
    if (b->experts) {
        lowp_linear_cfg_preset(b->experts, &c);
        for (size_t i = 0; i < sizeof k_expert_patterns / sizeof k_expert_patterns[0]; i++)
            if ((st = add_rule(recipe, k_expert_patterns[i], &c)) != LOWP_OK) return st;
    }
    if (b->shared) {
        lowp_linear_cfg_preset(b->shared, &c);
        for (size_t i = 0; i < sizeof k_shared_patterns / sizeof k_shared_patterns[0]; i++)
            if ((st = add_rule(recipe, k_shared_patterns[i], &c)) != LOWP_OK) return st;
    }
    lowp_linear_cfg_preset(b->all, &c);
    return add_rule(recipe, "*", &c);
}

lowp_status lowp_recipe_bind_last(lowp_recipe *recipe, int32_t last) {
    const char *fn = "lowp_recipe_bind_last";
    LOWP_CHECK_PTR(fn, recipe);
    if (recipe->nrules < 0 || recipe->nrules > LOWP_RECIPE_MAX_RULES)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: recipe.nrules (%d) is not in [0, %d]", fn,
                         recipe->nrules, LOWP_RECIPE_MAX_RULES);
    if (last < 0) return LOWP_OK; /* no blocks: `{last}` stays literal and matches no name */
    char out[LOWP_RECIPE_PATTERN_MAX];
    for (int32_t i = 0; i < recipe->nrules; i++) {
        char *pat = recipe->rules[i].pattern;
        if (memchr(pat, '\0', LOWP_RECIPE_PATTERN_MAX) == NULL)
            return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: recipe.rules[%d].pattern is not terminated",
                             fn, i);
        size_t o = 0;
        for (const char *p = pat; *p;) {
            int w = 1;
            if (strncmp(p, "{last}", 6) == 0)
                w = snprintf(out + o, o < sizeof out ? sizeof out - o : 0, "%d", (int) last),
                p += 6;
            else if (o + 1 < sizeof out)
                out[o] = *p++;
            else
                p++;
            o += (size_t) w;
        }
        if (o >= sizeof out)
            return lowp_fail(LOWP_ERR_INVALID_ARG,
                             "%s: recipe.rules[%d].pattern (\"%.20s...\") with last %d is longer "
                             "than %d",
                             fn, i, pat, (int) last, LOWP_RECIPE_PATTERN_MAX - 1);
        out[o] = '\0';
        memcpy(pat, out, o + 1);
    }
    return LOWP_OK;
}

lowp_status lowp_recipe_append(lowp_recipe *recipe, const char *pattern,
                               const lowp_linear_cfg *cfg) {
    LOWP_CHECK_PTR("lowp_recipe_append", recipe);
    LOWP_CHECK_PTR("lowp_recipe_append", pattern);
    return add_rule(recipe, pattern, cfg);
}

lowp_status lowp_recipe_match(const lowp_recipe *recipe, const char *param_name,
                              const lowp_recipe_rule **rule) {
    const char *fn = "lowp_recipe_match";
    LOWP_CHECK_PTR(fn, recipe);
    LOWP_CHECK_PTR(fn, param_name);
    LOWP_CHECK_PTR(fn, rule);
    *rule = NULL;
    if (recipe->nrules < 0 || recipe->nrules > LOWP_RECIPE_MAX_RULES)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: recipe.nrules (%d) is not in [0, %d]", fn,
                         recipe->nrules, LOWP_RECIPE_MAX_RULES);
    for (int32_t i = 0; i < recipe->nrules; i++) {
        const lowp_recipe_rule *r = &recipe->rules[i];
        if (memchr(r->pattern, '\0', sizeof r->pattern) == NULL)
            return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: recipe.rules[%d].pattern is not terminated",
                             fn, i);
        if (glob_match(r->pattern, param_name)) {
            *rule = r;
            return LOWP_OK;
        }
    }
    return LOWP_OK;
}
