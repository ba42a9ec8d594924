/* RMSNorm forward and backward on F32 host tensors, under the autocast policy of autocast.c:
 * with autocast on for x's device type, input, weight and output are rounded to the autocast
 * dtype (RNE, overflow to Inf) while the statistics stay in binary32, summed sequentially
 * along the row so that every run gives the same bits. CPU tensors only (no backend has an
 * RMSNorm slot yet): another device type gets LOWP_ERR_UNSUPPORTED. */
#include <math.h>

#include "train_internal.h"

/* Round through the autocast dtype; the identity for F32. */
typedef struct rounder {
    const lowp_format_traits *t; /* NULL: F32 */
} rounder;

static float round_to(const rounder *r, float v) {
    if (!r->t) return v;
    return r->t->decode(r->t->encode(v, LOWP_OVERFLOW_NONSAT));
}

static lowp_status check_f32_2d(const char *fn, const char *arg, const lowp_tensor *t) {
    if (t->format != LOWP_FORMAT_F32)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s.format (%d) is not f32", fn, arg,
                         (int) t->format);
    if (t->rows < 0 || t->cols < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s shape (%lld x %lld) is negative", fn, arg,
                         (long long) t->rows, (long long) t->cols);
    if (t->device.type != LOWP_DEVICE_CPU)
        return lowp_fail(LOWP_ERR_UNSUPPORTED,
                         "%s: %s.device.type (%d) is not the CPU: RMSNorm runs on host memory "
                         "only",
                         fn, arg, (int) t->device.type);
    if (t->device.index != 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s.device.index (%d) != 0 for the CPU", fn, arg,
                         (int) t->device.index);
    if (t->rows > 0 && t->cols > 0 && !t->data)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s.data is NULL", fn, arg);
    return LOWP_OK;
}

static lowp_status check_same_shape(const char *fn, const char *a, const lowp_tensor *x,
                                    const char *b, const lowp_tensor *y) {
    if (x->rows != y->rows || x->cols != y->cols)
        return lowp_fail(
            LOWP_ERR_INVALID_ARG, "%s: %s shape (%lld x %lld) != %s shape (%lld x %lld)", fn, b,
            (long long) y->rows, (long long) y->cols, a, (long long) x->rows, (long long) x->cols);
    return LOWP_OK;
}

lowp_status lowp_rmsnorm_forward(const lowp_tensor *x, const float *weight, float eps,
                                 lowp_tensor *y, float *rstd, const lowp_autocast *ac) {
    const char *fn = "lowp_rmsnorm_forward";
    LOWP_CHECK_PTR(fn, x);
    LOWP_CHECK_PTR(fn, y);
    lowp_status s = check_f32_2d(fn, "x", x);
    if (s == LOWP_OK) s = check_f32_2d(fn, "y", y);
    if (s == LOWP_OK) s = check_same_shape(fn, "x", x, "y", y);
    if (s != LOWP_OK) return s;
    if (!(eps >= 0.0f) || !isfinite(eps))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: eps (%g) is not finite and >= 0", fn,
                         (double) eps);
    const int64_t M = x->rows, D = x->cols;
    if (M == 0) return LOWP_OK;
    if (D == 0) { /* mean of nothing: no finite statistic to report */
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: x.cols is 0 (RMSNorm needs D >= 1)", fn);
    }
    LOWP_CHECK_PTR(fn, weight);
    rounder r = {NULL};
    const lowp_format dt = lowp_autocast_dtype_for(ac, x->device.type);
    if (dt != LOWP_FORMAT_F32 && (dt != LOWP_FORMAT_BF16 && dt != LOWP_FORMAT_F16))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: ac.type[%d].dtype (%d) is not bf16 or f16", fn,
                         (int) x->device.type, (int) dt);
    if (dt != LOWP_FORMAT_F32) lowp_format_get(dt, &r.t);

    const float *xd = x->data;
    float *yd = y->data;
    for (int64_t m = 0; m < M; m++) {
        const float *xr = xd + m * D;
        float *yr = yd + m * D;
        float ss = 0.0f;
        for (int64_t d = 0; d < D; d++) {
            const float v = round_to(&r, xr[d]);
            ss += v * v;
        }
        const float inv = 1.0f / sqrtf(ss / (float) D + eps);
        if (rstd) rstd[m] = inv;
        /* Elementwise from here on: y may alias x. */
        for (int64_t d = 0; d < D; d++)
            yr[d] = round_to(&r, round_to(&r, xr[d]) * inv * round_to(&r, weight[d]));
    }
    return LOWP_OK;
}

/* The gradient of y = x * r * w with r = (mean(x^2) + eps)^-1/2, per row:
 *   dx = r * (dy * w) - x * r^3 * mean(dy * w * x),   dweight += dy * x * r.
 * Sums in binary32, sequential along the row (deterministic). The backward takes no autocast:
 * it sees the binary32 rstd of the forward and the caller's x. */
lowp_status lowp_rmsnorm_backward(const lowp_tensor *x, const float *weight, const float *rstd,
                                  const lowp_tensor *dy, lowp_tensor *dx, float *dweight) {
    const char *fn = "lowp_rmsnorm_backward";
    LOWP_CHECK_PTR(fn, x);
    LOWP_CHECK_PTR(fn, dy);
    LOWP_CHECK_PTR(fn, dx);
    lowp_status s = check_f32_2d(fn, "x", x);
    if (s == LOWP_OK) s = check_f32_2d(fn, "dy", dy);
    if (s == LOWP_OK) s = check_f32_2d(fn, "dx", dx);
    if (s == LOWP_OK) s = check_same_shape(fn, "x", x, "dy", dy);
    if (s == LOWP_OK) s = check_same_shape(fn, "x", x, "dx", dx);
    if (s != LOWP_OK) return s;
    const int64_t M = x->rows, D = x->cols;
    if (M == 0) return LOWP_OK;
    if (D == 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: x.cols is 0 (RMSNorm needs D >= 1)", fn);
    LOWP_CHECK_PTR(fn, weight);
    LOWP_CHECK_PTR(fn, rstd);
    const float *xd = x->data, *gd = dy->data;
    float *od = dx->data;
    for (int64_t m = 0; m < M; m++) {
        const float *xr = xd + m * D, *gr = gd + m * D;
        float *orow = od + m * D;
        const float r = rstd[m];
        float dot = 0.0f;
        for (int64_t d = 0; d < D; d++) dot += gr[d] * weight[d] * xr[d];
        const float c = r * r * r * (dot / (float) D);
        if (dweight)
            for (int64_t d = 0; d < D; d++) dweight[d] += gr[d] * xr[d] * r;
        /* Elementwise after the row's sums: dx may alias dy. */
        for (int64_t d = 0; d < D; d++) orow[d] = r * (gr[d] * weight[d]) - xr[d] * c;
    }
    return LOWP_OK;
}
