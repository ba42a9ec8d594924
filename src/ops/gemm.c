/* lowp_gemm and lowp_grouped_gemm (split-M or split-K, B as NK or KN): validate every argument
 * (nothing is written on error) and run on the backend of the operands' device; the deprecated
 * twins (deprecated.h) as thin wrappers over them. */
#include <stdio.h>

#include "core/gemm_pair.h"
#include "ops/alias.h"
#include "lowp/gemm.h"
#include "ops_internal.h"

lowp_status lowp_gemm_cfg_init(lowp_gemm_cfg *cfg) {
    LOWP_CHECK_PTR("lowp_gemm_cfg_init", cfg);
    memset(cfg, 0, sizeof *cfg);
    cfg->path = LOWP_KERNEL_PATH_AUTO;
    return LOWP_OK;
}

static lowp_status check_cfg(const char *fn, const lowp_gemm_cfg *cfg) {
    if (cfg->accumulate != 0 && cfg->accumulate != 1)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.accumulate (%d) is not 0 or 1", fn,
                         cfg->accumulate);
    if (cfg->b_layout != LOWP_LAYOUT_NK && cfg->b_layout != LOWP_LAYOUT_KN)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: cfg.b_layout (%d) is not LOWP_LAYOUT_NK (0) or LOWP_LAYOUT_KN (1)",
                         fn, cfg->b_layout);
    if (cfg->split != LOWP_GROUPED_SPLIT_M && cfg->split != LOWP_GROUPED_SPLIT_K)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: cfg.split (%d) is not LOWP_GROUPED_SPLIT_M (0) or "
                         "LOWP_GROUPED_SPLIT_K (1)",
                         fn, cfg->split);
    return lowp_op_check_threads_path(fn, cfg->threads, cfg->path);
}

/* cfg, or the defaults in *defaults when NULL. */
static const lowp_gemm_cfg *cfg_or_defaults(const lowp_gemm_cfg *cfg, lowp_gemm_cfg *defaults) {
    if (cfg) return cfg;
    lowp_gemm_cfg_init(defaults);
    return defaults;
}

/* An operand: buffers present for its size, on `dev`. */
static lowp_status check_operand(const char *fn, const char *name, const lowp_qtensor *q,
                                 lowp_device dev) {
    if (!q) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s is NULL", fn, name);
    if (q->rows < 0 || q->cols < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s shape (%lld x %lld) is negative", fn, name,
                         (long long) q->rows, (long long) q->cols);
    size_t db, sb;
    lowp_status st = lowp_qtensor_nbytes(q, &db, &sb);
    if (st != LOWP_OK) {
        lowp_error_append("%s: operand %s", fn, name);
        return st;
    }
    if (db && !q->data) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s.data is NULL", fn, name);
    if (sb && !q->scales) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s.scales is NULL", fn, name);
    if (!lowp_same_device(q->device, dev))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s.device (%d:%d) != a.device (%d:%d)", fn,
                         name, q->device.type, q->device.index, dev.type, dev.index);
    return LOWP_OK;
}

static lowp_status check_c(const char *fn, const lowp_tensor *c, int64_t rows, int64_t cols,
                           lowp_device dev) {
    if (!c) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: c is NULL", fn);
    if (c->format != LOWP_FORMAT_F32 && c->format != LOWP_FORMAT_BF16)
        return lowp_fail(LOWP_ERR_UNSUPPORTED, "%s: c.format (%d) is not f32 or bf16", fn,
                         (int) c->format);
    if (c->rows != rows || c->cols != cols)
        return lowp_fail(
            LOWP_ERR_INVALID_ARG, "%s: c shape (%lld x %lld) != expected (%lld x %lld)", fn,
            (long long) c->rows, (long long) c->cols, (long long) rows, (long long) cols);
    if (rows * cols > 0 && !c->data)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: c.data is NULL", fn);
    if (!lowp_same_device(c->device, dev))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: c.device (%d:%d) != a.device (%d:%d)", fn,
                         c->device.type, c->device.index, dev.type, dev.index);
    return LOWP_OK;
}

/* C may not overlap the operands a and b[0 .. nb-1]. */
static lowp_status check_c_alias(const char *fn, const lowp_tensor *c, const lowp_qtensor *a,
                                 const lowp_qtensor *b, int32_t nb) {
    lowp_span cs = lowp_tensor_span(c, "c.data"), ins[2];
    lowp_qtensor_spans(a, "a.data", "a.scales", ins);
    lowp_status st = lowp_check_no_alias(fn, &cs, 1, ins, 2);
    for (int32_t g = 0; st == LOWP_OK && g < nb; g++) {
        lowp_qtensor_spans(&b[g], "b.data", "b.scales", ins);
        st = lowp_check_no_alias(fn, &cs, 1, ins, 2);
    }
    return st;
}

lowp_status lowp_gemm_pair_check(const lowp_qtensor *a, const lowp_qtensor *b) {
    LOWP_CHECK_PTR("lowp_gemm_pair_check", a);
    LOWP_CHECK_PTR("lowp_gemm_pair_check", b);
    lowp_gemm_pair pair;
    int64_t bk;
    return lowp_gemm_classify("lowp_gemm_pair_check", a, b, &pair, &bk);
}

/* b of lowp_gemm_kn: a kind whose copy of the transpose is the transpose of its copy;
 * `instead` names the entry point that takes the columnwise copy. */
static lowp_status check_kn(const char *fn, const char *name, const lowp_qtensor *b,
                            const char *instead) {
    const lowp_scaling_traits *t;
    if (lowp_scaling_get(b->scaling, &t) == LOWP_OK && t->transposes) return LOWP_OK;
    return lowp_fail(LOWP_ERR_UNSUPPORTED,
                     "%s: %s.scaling (%s) runs along one axis, so b cannot be read as stored "
                     "[K, N] (kinds that can: none, tensor, block128x128, block32x32, nv16x16); "
                     "quantize a columnwise copy and call %s",
                     fn, name, lowp_scaling_name(b->scaling), instead);
}

/* lowp_gemm (cfg.b_layout NK: b is [N, K]; KN: b is [K, N]); `fn` names the entry point. */
static lowp_status gemm_op(const char *fn, const lowp_qtensor *a, const lowp_qtensor *b,
                           lowp_tensor *c, const lowp_gemm_cfg *cfg) {
    LOWP_CHECK_PTR(fn, a);
    lowp_gemm_cfg defaults;
    cfg = cfg_or_defaults(cfg, &defaults);
    lowp_status st;
    if ((st = check_cfg(fn, cfg)) != LOWP_OK) return st;
    if (cfg->split != LOWP_GROUPED_SPLIT_M)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: cfg.split (%d) is set; split-K runs in lowp_grouped_gemm", fn,
                         cfg->split);
    const int kn = cfg->b_layout == LOWP_LAYOUT_KN;
    if ((st = check_operand(fn, "a", a, a->device)) != LOWP_OK) return st;
    if ((st = check_operand(fn, "b", b, a->device)) != LOWP_OK) return st;
    if (a->group_offs || b->group_offs)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: %s.group_offs is set; use lowp_grouped_gemm (split-K)", fn,
                         a->group_offs ? "a" : "b");
    lowp_gemm_pair pair;
    int64_t bk;
    if ((st = lowp_gemm_classify(fn, a, b, &pair, &bk)) != LOWP_OK) return st;
    if (kn && (st = check_kn(fn, "b", b, "lowp_gemm with b_layout NK")) != LOWP_OK) return st;
    const int64_t bK = kn ? b->rows : b->cols, bN = kn ? b->cols : b->rows;
    if (a->cols != bK)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: a.cols (%lld) != b.%s (%lld)", fn,
                         (long long) a->cols, kn ? "rows" : "cols", (long long) bK);
    if ((st = check_c(fn, c, a->rows, bN, a->device)) != LOWP_OK) return st;
    if ((st = check_c_alias(fn, c, a, b, 1)) != LOWP_OK) return st;
    lowp_op_call call;
    if ((st = lowp_op_begin(&call, fn, "a.device", a->device, LOWP_OP_SLOT(gemm))) != LOWP_OK)
        return st;
    st = call.iface->gemm(call.ctx, a->device.index, a, b, c, cfg);
    return lowp_op_end(&call, st);
}

lowp_status lowp_gemm(const lowp_qtensor *a, const lowp_qtensor *b, lowp_tensor *c,
                      const lowp_gemm_cfg *cfg) {
    return gemm_op("lowp_gemm", a, b, c, cfg);
}

/* The backend's grouped slot, both splits. */
static lowp_status grouped_call(const char *fn, const lowp_qtensor *a, const lowp_qtensor *b,
                                const int32_t *offs, int32_t groups, lowp_tensor *c,
                                const lowp_gemm_cfg *cfg) {
    lowp_op_call call;
    lowp_status st = lowp_op_begin(&call, fn, "a.device", a->device, LOWP_OP_SLOT(grouped_gemm));
    if (st != LOWP_OK) return st;
    st = call.iface->grouped_gemm(call.ctx, a->device.index, a, b, offs, groups, c, cfg);
    return lowp_op_end(&call, st);
}

/* lowp_grouped_gemm split-M (cfg.b_layout NK: every b[g] is [N, K]; KN: [K, N]); cfg checked. */
static lowp_status grouped_op(const char *fn, const lowp_qtensor *a, const lowp_qtensor *b,
                              const int32_t *offs, int32_t groups, lowp_tensor *c,
                              const lowp_gemm_cfg *cfg) {
    LOWP_CHECK_PTR(fn, b);
    const int kn = cfg->b_layout == LOWP_LAYOUT_KN;
    lowp_status st;
    if ((st = check_operand(fn, "a", a, a->device)) != LOWP_OK) return st;
    if (a->group_offs)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: a.group_offs is set (split-M groups come from offs)", fn);
    if ((st = lowp_check_offs(fn, offs, groups, a->rows, "a.rows")) != LOWP_OK) return st;
    /* b[g] is [N, K] (kn: [K, N]); every expert has b[0]'s N */
    const int64_t N = kn ? b[0].cols : b[0].rows;
    for (int32_t g = 0; g < groups; g++) {
        char name[32];
        snprintf(name, sizeof name, "b[%d]", g);
        if ((st = check_operand(fn, name, &b[g], a->device)) != LOWP_OK) return st;
        if (b[g].group_offs)
            return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s.group_offs is set", fn, name);
        const int64_t bN = kn ? b[g].cols : b[g].rows, bK = kn ? b[g].rows : b[g].cols;
        if (bN != N || bK != a->cols)
            return lowp_fail(LOWP_ERR_INVALID_ARG,
                             kn ? "%s: %s shape (%lld x %lld) != a.cols x b[0] cols (%lld x %lld)"
                                : "%s: %s shape (%lld x %lld) != b[0] rows x a.cols (%lld x %lld)",
                             fn, name, (long long) b[g].rows, (long long) b[g].cols,
                             (long long) (kn ? a->cols : N), (long long) (kn ? N : a->cols));
        lowp_gemm_pair pair;
        int64_t bk;
        if ((st = lowp_gemm_classify(fn, a, &b[g], &pair, &bk)) != LOWP_OK) return st;
        if (kn && (st = check_kn(fn, name, &b[g], "lowp_grouped_gemm with b_layout NK")) != LOWP_OK)
            return st;
    }
    if ((st = check_c(fn, c, a->rows, N, a->device)) != LOWP_OK) return st;
    if ((st = check_c_alias(fn, c, a, b, groups)) != LOWP_OK) return st;
    return grouped_call(fn, a, b, offs, groups, c, cfg);
}

/* For the block kinds, a wgrad operand must be quantized with the same groups as offs. */
static lowp_status check_grouping(const char *fn, const char *name, const lowp_qtensor *q,
                                  int64_t bk, const int32_t *offs, int32_t groups) {
    if (bk == 0) {
        if (q->group_offs)
            return lowp_fail(LOWP_ERR_INVALID_ARG,
                             "%s: %s.group_offs is set but scaling %s has no token blocks", fn,
                             name, lowp_scaling_name(q->scaling));
        return LOWP_OK;
    }
    if (!q->group_offs)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: %s (scaling %s) must be quantized with lowp_quantize_grouped over "
                         "the same offs (its group_offs is NULL)",
                         fn, name, lowp_scaling_name(q->scaling));
    if (q->groups != groups)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s.groups (%d) != groups (%d)", fn, name,
                         q->groups, groups);
    for (int32_t g = 0; g < groups; g++)
        if (q->group_offs[g] != offs[g])
            return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s.group_offs[%d] (%d) != offs[%d] (%d)",
                             fn, name, g, q->group_offs[g], g, offs[g]);
    return LOWP_OK;
}

/* lowp_grouped_gemm split-K (cfg.b_layout NK: b = X^T [K, M]; KN: b = X [M, K] as stored);
 * cfg checked. */
static lowp_status wgrad_op(const char *fn, const lowp_qtensor *a, const lowp_qtensor *b,
                            const int32_t *offs, int32_t groups, lowp_tensor *c,
                            const lowp_gemm_cfg *cfg) {
    const int kn = cfg->b_layout == LOWP_LAYOUT_KN;
    lowp_status st;
    if ((st = check_operand(fn, "a", a, a->device)) != LOWP_OK) return st;
    if ((st = check_operand(fn, "b", b, a->device)) != LOWP_OK) return st;
    lowp_gemm_pair pair;
    int64_t bk;
    if ((st = lowp_gemm_classify(fn, a, b, &pair, &bk)) != LOWP_OK) return st;
    if (pair == LOWP_PAIR_B128_W || pair == LOWP_PAIR_MX_B32)
        return lowp_fail(LOWP_ERR_UNSUPPORTED,
                         "%s: b (scaling %s) is a weight tiling, not a token-blocked activation",
                         fn, lowp_scaling_name(b->scaling));
    if (kn && b->scaling != LOWP_SCALING_NONE && b->scaling != LOWP_SCALING_TENSOR)
        return lowp_fail(LOWP_ERR_UNSUPPORTED,
                         "%s: b.scaling (%s) is not none or tensor: X's rowwise copy is another "
                         "quantization than the columnwise copy along the tokens; pass that with "
                         "b_layout NK",
                         fn, lowp_scaling_name(b->scaling));
    const int64_t bT = kn ? b->rows : b->cols, bK = kn ? b->cols : b->rows;
    if (a->cols != bT)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: a.cols (%lld tokens) != b.%s (%lld tokens)", fn,
                         (long long) a->cols, kn ? "rows" : "cols", (long long) bT);
    if ((st = lowp_check_offs(fn, offs, groups, a->cols, "a.cols")) != LOWP_OK) return st;
    if ((st = check_grouping(fn, "a", a, bk, offs, groups)) != LOWP_OK) return st;
    if ((st = check_grouping(fn, "b", b, bk, offs, groups)) != LOWP_OK) return st;
    if ((st = check_c(fn, c, (int64_t) groups * a->rows, bK, a->device)) != LOWP_OK) return st;
    if ((st = check_c_alias(fn, c, a, b, 1)) != LOWP_OK) return st;
    return grouped_call(fn, a, b, offs, groups, c, cfg);
}

/* lowp_grouped_gemm and the deprecated twins: the split picks the checks. */
static lowp_status grouped_entry(const char *fn, const lowp_qtensor *a, const lowp_qtensor *b,
                                 const int32_t *offs, int32_t groups, lowp_tensor *c,
                                 const lowp_gemm_cfg *cfg) {
    LOWP_CHECK_PTR(fn, a);
    lowp_gemm_cfg defaults;
    cfg = cfg_or_defaults(cfg, &defaults);
    lowp_status st = check_cfg(fn, cfg);
    if (st != LOWP_OK) return st;
    return cfg->split == LOWP_GROUPED_SPLIT_K ? wgrad_op(fn, a, b, offs, groups, c, cfg)
                                              : grouped_op(fn, a, b, offs, groups, c, cfg);
}

lowp_status lowp_grouped_gemm(const lowp_qtensor *a, const lowp_qtensor *b, const int32_t *offs,
                              int32_t groups, lowp_tensor *c, const lowp_gemm_cfg *cfg) {
    return grouped_entry("lowp_grouped_gemm", a, b, offs, groups, c, cfg);
}

/* ---- The deprecated twins (deprecated.h): cfg with b_layout and split set ---- */

static lowp_gemm_cfg twin_cfg(const lowp_gemm_cfg *cfg, int32_t b_layout, int32_t split) {
    lowp_gemm_cfg out;
    if (cfg)
        out = *cfg;
    else
        lowp_gemm_cfg_init(&out);
    out.b_layout = b_layout;
    out.split = split;
    return out;
}

lowp_status lowp_gemm_kn(const lowp_qtensor *a, const lowp_qtensor *b, lowp_tensor *c,
                         const lowp_gemm_cfg *cfg) {
    const lowp_gemm_cfg t = twin_cfg(cfg, LOWP_LAYOUT_KN, LOWP_GROUPED_SPLIT_M);
    return gemm_op("lowp_gemm_kn", a, b, c, &t);
}

lowp_status lowp_grouped_gemm_kn(const lowp_qtensor *a, const lowp_qtensor *b, const int32_t *offs,
                                 int32_t groups, lowp_tensor *c, const lowp_gemm_cfg *cfg) {
    const lowp_gemm_cfg t = twin_cfg(cfg, LOWP_LAYOUT_KN, LOWP_GROUPED_SPLIT_M);
    return grouped_entry("lowp_grouped_gemm_kn", a, b, offs, groups, c, &t);
}

lowp_status lowp_grouped_gemm_wgrad(const lowp_qtensor *a, const lowp_qtensor *b,
                                    const int32_t *offs, int32_t groups, lowp_tensor *c,
                                    const lowp_gemm_cfg *cfg) {
    const lowp_gemm_cfg t = twin_cfg(cfg, LOWP_LAYOUT_NK, LOWP_GROUPED_SPLIT_K);
    return grouped_entry("lowp_grouped_gemm_wgrad", a, b, offs, groups, c, &t);
}

lowp_status lowp_grouped_gemm_wgrad_kn(const lowp_qtensor *a, const lowp_qtensor *b,
                                       const int32_t *offs, int32_t groups, lowp_tensor *c,
                                       const lowp_gemm_cfg *cfg) {
    const lowp_gemm_cfg t = twin_cfg(cfg, LOWP_LAYOUT_KN, LOWP_GROUPED_SPLIT_K);
    return grouped_entry("lowp_grouped_gemm_wgrad_kn", a, b, offs, groups, c, &t);
}
