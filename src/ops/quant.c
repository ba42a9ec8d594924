/* lowp_quantize, lowp_quantize_grouped, lowp_dequantize, lowp_amax: validate every argument
 * (nothing is written on error), then run on the backend of the tensors' device. */
#include <math.h>

#include "ops/alias.h"
#include "lowp/quant.h"
#include "ops_internal.h"

lowp_status lowp_quant_cfg_init(lowp_quant_cfg *cfg) {
    LOWP_CHECK_PTR("lowp_quant_cfg_init", cfg);
    memset(cfg, 0, sizeof *cfg);
    cfg->scale_mode = LOWP_SCALE_MODE_DEFAULT;
    cfg->pow2_scales = -1;
    cfg->eps = 0.0f;
    cfg->path = LOWP_KERNEL_PATH_AUTO;
    return LOWP_OK;
}

static lowp_status check_input(const char *fn, const lowp_tensor *x) {
    LOWP_CHECK_PTR(fn, x);
    if (x->format != LOWP_FORMAT_F32 && x->format != LOWP_FORMAT_BF16)
        return lowp_fail(LOWP_ERR_UNSUPPORTED, "%s: x.format (%d) is not f32 or bf16", fn,
                         (int) x->format);
    if (x->cols <= 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: x.cols (%lld) must be > 0", fn,
                         (long long) x->cols);
    if (x->rows < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: x.rows (%lld) < 0", fn, (long long) x->rows);
    size_t n;
    lowp_status st = lowp_tensor_nbytes(x, &n);
    if (st != LOWP_OK) return st;
    if (n && !x->data) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: x.data is NULL", fn);
    return LOWP_OK;
}

static lowp_status check_cfg(const char *fn, const lowp_quant_cfg *cfg, lowp_scaling scaling) {
    if (cfg->scale_mode < LOWP_SCALE_MODE_DEFAULT || cfg->scale_mode > LOWP_SCALE_MODE_EVEN)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.scale_mode (%d) is not a lowp_scale_mode",
                         fn, (int) cfg->scale_mode);
    if (cfg->pow2_scales < -1 || cfg->pow2_scales > 1)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.pow2_scales (%d) is not -1, 0 or 1", fn,
                         cfg->pow2_scales);
    if (!(cfg->eps >= 0.0f) || isinf(cfg->eps))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.eps (%g) must be finite and >= 0", fn,
                         (double) cfg->eps);
    if (cfg->scale) {
        if (scaling != LOWP_SCALING_TENSOR)
            return lowp_fail(LOWP_ERR_INVALID_ARG,
                             "%s: cfg.scale is set but the scaling (%s) is not tensor", fn,
                             lowp_scaling_name(scaling));
        if (!(*cfg->scale > 0.0f) || isinf(*cfg->scale))
            return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: *cfg.scale (%g) must be finite and > 0", fn,
                             (double) *cfg->scale);
    }
    return lowp_op_check_threads_path(fn, cfg->threads, cfg->path);
}

/* cfg.rounding: RNE, or SR for E2M1 elements of MX32, NV16 and NV16X16 on the host. */
static lowp_status check_rounding(const char *fn, const lowp_quant_cfg *cfg, const lowp_qtensor *q,
                                  const lowp_tensor *x) {
    if (cfg->rounding == LOWP_ROUNDING_RNE) return LOWP_OK;
    if (cfg->rounding != LOWP_ROUNDING_SR)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.rounding (%d) is not rne or sr", fn,
                         (int) cfg->rounding);
    const int kind = q->scaling == LOWP_SCALING_MX32 || q->scaling == LOWP_SCALING_NV16 ||
                     q->scaling == LOWP_SCALING_NV16X16;
    if (q->format != LOWP_FORMAT_E2M1 || !kind)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: cfg.rounding is sr, which quantization implements for e2m1 "
                         "elements of mx32, nv16 and nv16x16 only (not format %d, scaling %s)",
                         fn, (int) q->format, lowp_scaling_name(q->scaling));
    if (x->device.type != LOWP_DEVICE_CPU)
        return lowp_fail(LOWP_ERR_UNSUPPORTED,
                         "%s: cfg.rounding is sr, which only the host backend implements (x is on "
                         "device %d:%d)",
                         fn, x->device.type, x->device.index);
    return LOWP_OK;
}

/* Format/scaling support, shape [rows, cols], buffers present. */
static lowp_status check_q(const char *fn, const char *name, const lowp_qtensor *q, int64_t rows,
                           int64_t cols) {
    if ((unsigned) q->scaling >= LOWP_SCALING_COUNT)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s.scaling (%d) is not a lowp_scaling", fn,
                         name, (int) q->scaling);
    const int nv = q->scaling == LOWP_SCALING_NV16 || q->scaling == LOWP_SCALING_NV16X16;
    int ok = q->scaling != LOWP_SCALING_NONE &&
             (nv ? q->format == LOWP_FORMAT_E2M1
                 : (q->format == LOWP_FORMAT_E4M3 || q->format == LOWP_FORMAT_E5M2 ||
                    (q->format == LOWP_FORMAT_E2M1 && q->scaling == LOWP_SCALING_MX32)));
    if (!ok) {
        const lowp_format_traits *t;
        const char *fname = lowp_format_get(q->format, &t) == LOWP_OK ? t->name : "?";
        return lowp_fail(LOWP_ERR_UNSUPPORTED,
                         "%s: %s.format (%s) is not supported by scaling %s (%s)", fn, name, fname,
                         lowp_scaling_name(q->scaling),
                         nv                                ? "e2m1"
                         : q->scaling == LOWP_SCALING_MX32 ? "e4m3, e5m2, e2m1"
                                                           : "e4m3, e5m2");
    }
    if (q->rows != rows || q->cols != cols)
        return lowp_fail(
            LOWP_ERR_INVALID_ARG, "%s: %s shape (%lld x %lld) != expected (%lld x %lld)", fn, name,
            (long long) q->rows, (long long) q->cols, (long long) rows, (long long) cols);
    size_t db, sb;
    lowp_status st = lowp_qtensor_nbytes(q, &db, &sb);
    if (st != LOWP_OK) return st;
    if (db && !q->data) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s.data is NULL", fn, name);
    if (sb && !q->scales) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s.scales is NULL", fn, name);
    return LOWP_OK;
}

/* An ungrouped output `name` of x: [rows, cols], on x's device. */
static lowp_status check_out(const char *fn, const char *name, const lowp_qtensor *q,
                             const lowp_tensor *x, int64_t rows, int64_t cols) {
    if (q->group_offs)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: %s.group_offs is set; use lowp_quantize_grouped", fn, name);
    lowp_status st = check_q(fn, name, q, rows, cols);
    if (st != LOWP_OK) return st;
    if (!lowp_same_device(q->device, x->device))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s.device (%d:%d) != x.device (%d:%d)", fn,
                         name, q->device.type, q->device.index, x->device.type, x->device.index);
    return LOWP_OK;
}

/* Both outputs of a dual-axis call use one format and scaling. */
static lowp_status check_pair(const char *fn, const lowp_qtensor *row_out,
                              const lowp_qtensor *col_out) {
    if (row_out && col_out &&
        (row_out->format != col_out->format || row_out->scaling != col_out->scaling))
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: row_out (format %d, scaling %d) and col_out (format %d, scaling %d) "
                         "differ",
                         fn, (int) row_out->format, (int) row_out->scaling, (int) col_out->format,
                         (int) col_out->scaling);
    return LOWP_OK;
}

/* No output overlaps x or another output; then the backend's quantize slot. */
static lowp_status run_quantize(const char *fn, const lowp_tensor *x, lowp_qtensor *row_out,
                                lowp_qtensor *col_out, const lowp_quant_cfg *cfg) {
    lowp_span outs[4], in = lowp_tensor_span(x, "x.data");
    lowp_qtensor_spans(row_out, "row_out.data", "row_out.scales", outs);
    lowp_qtensor_spans(col_out, "col_out.data", "col_out.scales", outs + 2);
    lowp_status st = lowp_check_no_alias(fn, outs, 4, &in, 1);
    if (st != LOWP_OK) return st;
    lowp_op_call c;
    if ((st = lowp_op_begin(&c, fn, "x.device", x->device, LOWP_OP_SLOT(quantize))) != LOWP_OK)
        return st;
    st = c.iface->quantize(c.ctx, x->device.index, x, row_out, col_out, cfg);
    return lowp_op_end(&c, st);
}

lowp_status lowp_quantize(const lowp_tensor *x, lowp_qtensor *row_out, lowp_qtensor *col_out,
                          const lowp_quant_cfg *cfg) {
    const char *fn = "lowp_quantize";
    lowp_status st = check_input(fn, x);
    if (st != LOWP_OK) return st;
    if (!row_out && !col_out)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: row_out and col_out are both NULL", fn);
    lowp_quant_cfg defaults;
    if (!cfg) {
        lowp_quant_cfg_init(&defaults);
        cfg = &defaults;
    }
    const lowp_qtensor *q0 = row_out ? row_out : col_out;
    if ((st = check_pair(fn, row_out, col_out)) != LOWP_OK) return st;
    if ((st = check_cfg(fn, cfg, q0->scaling)) != LOWP_OK) return st;
    if ((st = check_rounding(fn, cfg, q0, x)) != LOWP_OK) return st;
    if (row_out && (st = check_out(fn, "row_out", row_out, x, x->rows, x->cols)) != LOWP_OK)
        return st;
    if (col_out && (st = check_out(fn, "col_out", col_out, x, x->cols, x->rows)) != LOWP_OK)
        return st;
    return run_quantize(fn, x, row_out, col_out, cfg);
}

/* The backend's quantize slot takes the grouped col_out (group_offs set) with or without
 * row_out: one read of x where the backend can (device.h). */
lowp_status lowp_quantize_grouped(const lowp_tensor *x, lowp_qtensor *row_out,
                                  lowp_qtensor *col_out, const lowp_quant_cfg *cfg) {
    const char *fn = "lowp_quantize_grouped";
    lowp_status st = check_input(fn, x);
    if (st != LOWP_OK) return st;
    LOWP_CHECK_PTR(fn, col_out);
    lowp_quant_cfg defaults;
    if (!cfg) {
        lowp_quant_cfg_init(&defaults);
        cfg = &defaults;
    }
    if ((st = check_pair(fn, row_out, col_out)) != LOWP_OK) return st;
    if ((st = check_cfg(fn, cfg, col_out->scaling)) != LOWP_OK) return st;
    if ((st = check_rounding(fn, cfg, col_out, x)) != LOWP_OK) return st;
    if (!col_out->group_offs)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: col_out.group_offs is NULL", fn);
    if (col_out->scaling != LOWP_SCALING_MX32 && col_out->scaling != LOWP_SCALING_BLOCK128 &&
        col_out->scaling != LOWP_SCALING_NV16)
        return lowp_fail(LOWP_ERR_UNSUPPORTED,
                         "%s: col_out.scaling (%s) is not mx32, block128 or nv16 (other kinds need "
                         "no group boundaries: use lowp_quantize)",
                         fn, lowp_scaling_name(col_out->scaling));
    if ((st = check_q(fn, "col_out", col_out, x->cols, x->rows)) != LOWP_OK) return st;
    if (!lowp_same_device(col_out->device, x->device))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: col_out.device (%d:%d) != x.device (%d:%d)", fn,
                         col_out->device.type, col_out->device.index, x->device.type,
                         x->device.index);
    if (row_out && (st = check_out(fn, "row_out", row_out, x, x->rows, x->cols)) != LOWP_OK)
        return st;
    return run_quantize(fn, x, row_out, col_out, cfg);
}

lowp_status lowp_dequantize(const lowp_qtensor *q, lowp_tensor *out) {
    const char *fn = "lowp_dequantize";
    LOWP_CHECK_PTR(fn, q);
    LOWP_CHECK_PTR(fn, out);
    lowp_status st = check_q(fn, "q", q, q->rows, q->cols);
    if (st != LOWP_OK) return st;
    if (out->format != LOWP_FORMAT_F32)
        return lowp_fail(LOWP_ERR_UNSUPPORTED, "%s: out.format (%d) is not f32", fn,
                         (int) out->format);
    if (out->rows != q->rows || out->cols != q->cols)
        return lowp_fail(
            LOWP_ERR_INVALID_ARG, "%s: out shape (%lld x %lld) != q shape (%lld x %lld)", fn,
            (long long) out->rows, (long long) out->cols, (long long) q->rows, (long long) q->cols);
    if (q->rows * q->cols > 0 && !out->data)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: out.data is NULL", fn);
    if (!lowp_same_device(out->device, q->device))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: out.device (%d:%d) != q.device (%d:%d)", fn,
                         out->device.type, out->device.index, q->device.type, q->device.index);
    lowp_span ins[2], outspan = lowp_tensor_span(out, "out.data");
    lowp_qtensor_spans(q, "q.data", "q.scales", ins);
    if ((st = lowp_check_no_alias(fn, &outspan, 1, ins, 2)) != LOWP_OK) return st;
    lowp_op_call c;
    if ((st = lowp_op_begin(&c, fn, "q.device", q->device, LOWP_OP_SLOT(dequantize))) != LOWP_OK)
        return st;
    st = c.iface->dequantize(c.ctx, q->device.index, q, out);
    return lowp_op_end(&c, st);
}

lowp_status lowp_amax(const lowp_tensor *x, lowp_scaling scaling, float *out, size_t out_count) {
    const char *fn = "lowp_amax";
    lowp_status st = check_input(fn, x);
    if (st != LOWP_OK) return st;
    LOWP_CHECK_PTR(fn, out);
    lowp_qtensor shape = {LOWP_FORMAT_E4M3, scaling, x->rows, x->cols, NULL, NULL,
                          x->device,        NULL,    0};
    int64_t sr, sc;
    if ((st = lowp_qtensor_scale_shape(&shape, &sr, &sc, NULL)) != LOWP_OK) return st;
    if ((size_t) (sr * sc) != out_count)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: out_count (%zu) != %lld x %lld for scaling %s",
                         fn, out_count, (long long) sr, (long long) sc, lowp_scaling_name(scaling));
    lowp_op_call c;
    if ((st = lowp_op_begin(&c, fn, "x.device", x->device, LOWP_OP_SLOT(amax))) != LOWP_OK)
        return st;
    st = c.iface->amax(c.ctx, x->device.index, x, (int32_t) scaling, out, out_count);
    return lowp_op_end(&c, st);
}
