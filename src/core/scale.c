/* Scale rules (docs/numerics.md sections 3-4), the scaling kinds' names, block sizes and buffer
 * sizes of quantized tensors. Kernels call the inline forms in scale_rules.h; the public
 * functions here wrap them with argument checks. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "internal.h"
#include "lowp/scale.h"
#include "scale_rules.h"

#define RCEIL  LOWP_SCALE_MODE_RCEIL
#define FLOOR  LOWP_SCALE_MODE_FLOOR
#define NOMODE LOWP_SCALE_MODE_DEFAULT

/* Every rule about a scaling kind: blocks, scale type, grouped copies, orientation, defaults. */
#define E8 LOWP_FORMAT_E8M0
#define F4 LOWP_FORMAT_F32
#define E4 LOWP_FORMAT_E4M3

/* Every rule about a scaling kind: blocks, scale type, grouped copies, orientation, defaults. */
static const lowp_scaling_traits g_scalings[LOWP_SCALING_COUNT] = {
    /* scaling, name, block_rows, block_cols, scale_is_e8m0, grouped, transposes, default_mode,
     * default_pow2, scale_format, tensor_scale */
    {LOWP_SCALING_TENSOR, "tensor", 0, 0, 0, 0, 1, NOMODE, 0, F4, 0},
    {LOWP_SCALING_ROW, "row", 1, 0, 0, 0, 0, NOMODE, 1, F4, 0},
    {LOWP_SCALING_MX32, "mx32", 1, 32, 1, 1, 0, RCEIL, 0, E8, 0},
    {LOWP_SCALING_BLOCK128, "block128", 1, 128, 0, 1, 0, NOMODE, 0, F4, 0},
    {LOWP_SCALING_BLOCK128X128, "block128x128", 128, 128, 0, 0, 1, NOMODE, 0, F4, 0},
    {LOWP_SCALING_BLOCK32X32, "block32x32", 32, 32, 1, 0, 1, FLOOR, 0, E8, 0},
    {LOWP_SCALING_NONE, "none", 0, 0, 0, 0, 1, NOMODE, 0, F4, 0},
    {LOWP_SCALING_NV16, "nv16", 1, 16, 0, 1, 0, NOMODE, 0, E4, 1},
    {LOWP_SCALING_NV16X16, "nv16x16", 16, 16, 0, 0, 1, NOMODE, 0, E4, 1},
};

static const char *const g_mode_names[] = {"default", "rceil", "floor", "ceil", "even"};

lowp_status lowp_scaling_get(lowp_scaling scaling, const lowp_scaling_traits **out) {
    LOWP_CHECK_PTR("lowp_scaling_get", out);
    if ((unsigned) scaling >= LOWP_SCALING_COUNT)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "lowp_scaling_get: scaling (%d) is not a lowp_scaling", (int) scaling);
    *out = &g_scalings[scaling];
    return LOWP_OK;
}

const char *lowp_scaling_name(lowp_scaling scaling) {
    return (unsigned) scaling < LOWP_SCALING_COUNT ? g_scalings[scaling].name : "?";
}

const char *lowp_scale_mode_name(lowp_scale_mode mode) {
    return (unsigned) mode <= LOWP_SCALE_MODE_EVEN ? g_mode_names[mode] : "?";
}

lowp_status lowp_scaling_from_name(const char *name, lowp_scaling *out) {
    LOWP_CHECK_PTR("lowp_scaling_from_name", name);
    LOWP_CHECK_PTR("lowp_scaling_from_name", out);
    for (int s = 0; s < LOWP_SCALING_COUNT; s++) {
        if (strcmp(name, g_scalings[s].name) == 0) {
            *out = (lowp_scaling) s;
            return LOWP_OK;
        }
    }
    return lowp_fail(LOWP_ERR_INVALID_ARG,
                     "lowp_scaling_from_name: name (\"%s\") is not one of tensor, row, mx32, "
                     "block128, block128x128, block32x32, none, nv16, nv16x16",
                     name);
}

lowp_status lowp_scale_mode_from_name(const char *name, lowp_scale_mode *out) {
    LOWP_CHECK_PTR("lowp_scale_mode_from_name", name);
    LOWP_CHECK_PTR("lowp_scale_mode_from_name", out);
    for (int m = 0; m < 5; m++) {
        if (strcmp(name, g_mode_names[m]) == 0) {
            *out = (lowp_scale_mode) m;
            return LOWP_OK;
        }
    }
    return lowp_fail(LOWP_ERR_INVALID_ARG,
                     "lowp_scale_mode_from_name: name (\"%s\") is not one of rceil, floor, ceil, "
                     "even",
                     name);
}

lowp_status lowp_scaling_block(lowp_scaling scaling, int64_t *block_rows, int64_t *block_cols) {
    LOWP_CHECK_PTR("lowp_scaling_block", block_rows);
    LOWP_CHECK_PTR("lowp_scaling_block", block_cols);
    if ((unsigned) scaling >= LOWP_SCALING_COUNT)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "lowp_scaling_block: scaling (%d) is not a lowp_scaling", (int) scaling);
    *block_rows = g_scalings[scaling].block_rows;
    *block_cols = g_scalings[scaling].block_cols;
    return LOWP_OK;
}

/* Blocks along the columns of a (possibly grouped) qtensor. */
static lowp_status col_blocks(const char *fn, const lowp_qtensor *q, int64_t bc, int64_t *out) {
    if (!q->group_offs) {
        *out = bc == 0 ? 1 : lowp_cdiv64(q->cols, bc);
        return LOWP_OK;
    }
    if (!g_scalings[q->scaling].grouped)
        return lowp_fail(LOWP_ERR_UNSUPPORTED,
                         "%s: q.group_offs is set but q.scaling (%s) is not mx32, block128 or nv16",
                         fn, lowp_scaling_name(q->scaling));
    if (q->groups < 1)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: q.groups (%d) < 1", fn, q->groups);
    int64_t n = 0, prev = 0;
    for (int32_t g = 0; g < q->groups; g++) {
        int64_t end = q->group_offs[g];
        if (end < prev || end > q->cols)
            return lowp_fail(LOWP_ERR_INVALID_ARG,
                             "%s: q.group_offs[%d] (%lld) is not in [%lld, cols (%lld)]", fn, g,
                             (long long) end, (long long) prev, (long long) q->cols);
        n += lowp_cdiv64(end - prev, bc);
        prev = end;
    }
    *out = n;
    return LOWP_OK;
}

lowp_status lowp_qtensor_scale_shape(const lowp_qtensor *q, int64_t *scale_rows,
                                     int64_t *scale_cols, int *scale_is_e8m0) {
    const char *fn = "lowp_qtensor_scale_shape";
    LOWP_CHECK_PTR(fn, q);
    LOWP_CHECK_PTR(fn, scale_rows);
    LOWP_CHECK_PTR(fn, scale_cols);
    int64_t br, bc;
    if (lowp_scaling_block(q->scaling, &br, &bc) != LOWP_OK)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: q.scaling (%d) is not a lowp_scaling", fn,
                         (int) q->scaling);
    if (q->rows < 0 || q->cols < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: q shape (%lld x %lld) is negative", fn,
                         (long long) q->rows, (long long) q->cols);
    if (q->scaling == LOWP_SCALING_NONE) {
        if (q->group_offs)
            return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: q.group_offs is set on an unscaled tensor",
                             fn);
        *scale_rows = 0;
        *scale_cols = 0;
        if (scale_is_e8m0) *scale_is_e8m0 = 0;
        return LOWP_OK;
    }
    *scale_rows = br == 0 ? 1 : lowp_cdiv64(q->rows, br);
    lowp_status st = col_blocks(fn, q, bc, scale_cols);
    if (st != LOWP_OK) return st;
    if (scale_is_e8m0) *scale_is_e8m0 = g_scalings[q->scaling].scale_is_e8m0;
    return LOWP_OK;
}

lowp_status lowp_qtensor_nbytes(const lowp_qtensor *q, size_t *data_bytes, size_t *scale_bytes) {
    const char *fn = "lowp_qtensor_nbytes";
    LOWP_CHECK_PTR(fn, q);
    int64_t sr, sc;
    lowp_status st = lowp_qtensor_scale_shape(q, &sr, &sc, NULL);
    if (st != LOWP_OK) return st;
    lowp_tensor t = {q->format, q->rows, q->cols, NULL, q->device};
    size_t db;
    if ((st = lowp_tensor_nbytes(&t, &db)) != LOWP_OK) return st;
    const lowp_scaling_traits *kt = &g_scalings[q->scaling];
    const size_t esz = kt->scale_format == LOWP_FORMAT_F32 ? 4u : 1u;
    size_t sb;
    if (!lowp_mul_size((size_t) sr, (size_t) sc, &sb) || !lowp_mul_size(sb, esz, &sb) ||
        (kt->tensor_scale && !lowp_add_size((sb + 3) & ~(size_t) 3, 4, &sb)))
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: the scales of q (%lld x %lld, %s) take more than SIZE_MAX bytes", fn,
                         (long long) sr, (long long) sc, lowp_scaling_name(q->scaling));
    if (data_bytes) *data_bytes = db;
    if (scale_bytes) *scale_bytes = sb;
    return LOWP_OK;
}

lowp_status lowp_qtensor_tensor_scale_offset(const lowp_qtensor *q, size_t *offset) {
    const char *fn = "lowp_qtensor_tensor_scale_offset";
    LOWP_CHECK_PTR(fn, q);
    LOWP_CHECK_PTR(fn, offset);
    size_t sb;
    lowp_status st = lowp_qtensor_nbytes(q, NULL, &sb);
    if (st != LOWP_OK) return st;
    if (!g_scalings[q->scaling].tensor_scale)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: q.scaling (%s) has no tensor scale (nv16, nv16x16)", fn,
                         lowp_scaling_name(q->scaling));
    *offset = sb - 4;
    return LOWP_OK;
}

lowp_status lowp_nvfp4_tensor_scale(float amax, float *encode_scale) {
    LOWP_CHECK_PTR("lowp_nvfp4_tensor_scale", encode_scale);
    *encode_scale = lowp_rule_nv_tensor_scale(amax);
    return LOWP_OK;
}

lowp_status lowp_nvfp4_block_scale(float block_amax, float encode_scale, uint8_t *code) {
    LOWP_CHECK_PTR("lowp_nvfp4_block_scale", code);
    if (!(encode_scale > 0.0f) || encode_scale == INFINITY)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "lowp_nvfp4_block_scale: encode_scale (%g) must be finite and > 0",
                         (double) encode_scale);
    const lowp_format_traits *e4m3;
    lowp_format_get(LOWP_FORMAT_E4M3, &e4m3);
    *code = lowp_rule_nv_block_code(fabsf(block_amax), encode_scale, e4m3);
    return LOWP_OK;
}

lowp_status lowp_e8m0_scale(float amax, lowp_format format, lowp_scale_mode mode, uint8_t *code) {
    LOWP_CHECK_PTR("lowp_e8m0_scale", code);
    const lowp_format_traits *t;
    if (lowp_format_get(format, &t) != LOWP_OK || t->bits > 8 || format == LOWP_FORMAT_E8M0)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "lowp_e8m0_scale: format (%d) is not an element format (e4m3, e5m2, e2m1)",
                         (int) format);
    if (mode < LOWP_SCALE_MODE_DEFAULT || mode > LOWP_SCALE_MODE_EVEN)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "lowp_e8m0_scale: mode (%d) is not a lowp_scale_mode", (int) mode);
    if (mode == LOWP_SCALE_MODE_DEFAULT) mode = LOWP_SCALE_MODE_RCEIL;
    *code = lowp_rule_e8m0_code(amax, t, mode);
    return LOWP_OK;
}

lowp_status lowp_fp32_scale(float amax, lowp_format format, float eps, int pow2, float *scale) {
    LOWP_CHECK_PTR("lowp_fp32_scale", scale);
    const lowp_format_traits *t;
    if (lowp_format_get(format, &t) != LOWP_OK || t->bits > 8 || format == LOWP_FORMAT_E8M0)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "lowp_fp32_scale: format (%d) is not an element format", (int) format);
    /* The same rule as lowp_quantize's cfg.eps. */
    if (!(eps >= 0.0f) || eps == INFINITY)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_fp32_scale: eps (%g) must be finite and >= 0",
                         (double) eps);
    *scale = lowp_rule_fp32_scale(amax, t->fmax, eps, pow2);
    return LOWP_OK;
}
