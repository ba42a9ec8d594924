/* RMSNorm forward and backward on F32 host tensors, under the autocast policy of autocast.c:
 * with autocast on for x's device type, input, weight and output are rounded to the autocast
 * dtype (RNE, overflow to Inf) while the statistics stay in binary32, summed sequentially
 * along the row so that every run gives the same bits. CPU tensors only (no backend has an
 * RMSNorm slot yet): another device type gets LOWP_ERR_UNSUPPORTED. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lowp/threads.h"
#include "train_internal.h"

/* Round through the autocast dtype; the identity for F32. */
typedef struct rounder {
    const lowp_format_traits *t; /* NULL: F32 */
} rounder;

static float round_to(const rounder *r, float v) {
    if (!r->t) return v;
    return r->t->decode(r->t->encode(v, LOWP_OVERFLOW_NONSAT));
}

/* ---- the row loops ----
 * Every statistic is the row's sequential binary32 sum (the documented order); the loops
 * below keep each row's operations and their order and only change which rows run side by
 * side: RMS_ROWS rows' sums as independent chains (one chain waits on the adder's latency at
 * every element), and blocks of rows across threads. The weight gradient sums over rows in
 * row order, so it is split by columns instead. The file is compiled with -ffp-contract=off
 * (CMakeLists.txt): a fused multiply-add would change the bits. */

#define RMS_ROWS 8
/* Rows x columns below which a call stays on the calling thread. */
#define RMS_PARALLEL_MIN 32768

/* ss[r] = sum over d of x[r][d]^2 for RMS_ROWS rows D apart, each sequential along d. */
static void sumsq_rows(const float *x, int64_t D, float *ss) {
    float s[RMS_ROWS] = {0};
    for (int64_t d = 0; d < D; d++)
        for (int r = 0; r < RMS_ROWS; r++) {
            const float v = x[r * D + d];
            s[r] += v * v;
        }
    memcpy(ss, s, sizeof s);
}

/* dot[r] = sum over d of (g[r][d] * w[d]) * x[r][d], each sequential along d. */
static void dot_rows(const float *g, const float *w, const float *x, int64_t D, float *dot) {
    float s[RMS_ROWS] = {0};
    for (int64_t d = 0; d < D; d++)
        for (int r = 0; r < RMS_ROWS; r++) s[r] += g[r * D + d] * w[d] * x[r * D + d];
    memcpy(dot, s, sizeof s);
}

static lowp_status rms_forward(const float *xd, const float *weight, float eps, int64_t M,
                               int64_t D, float *yd, float *rstd, const rounder *r, int nt) {
    const int64_t nb = (M + RMS_ROWS - 1) / RMS_ROWS;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && M * D >= RMS_PARALLEL_MIN)
    for (int64_t b = 0; b < nb; b++) {
        const int64_t m0 = b * RMS_ROWS, n = M - m0 < RMS_ROWS ? M - m0 : RMS_ROWS;
        float ss[RMS_ROWS];
        if (!r->t && n == RMS_ROWS) {
            sumsq_rows(xd + m0 * D, D, ss);
        } else {
            for (int64_t i = 0; i < n; i++) {
                const float *xr = xd + (m0 + i) * D;
                float s = 0.0f;
                for (int64_t d = 0; d < D; d++) {
                    const float v = round_to(r, xr[d]);
                    s += v * v;
                }
                ss[i] = s;
            }
        }
        for (int64_t i = 0; i < n; i++) {
            const int64_t m = m0 + i;
            const float *xr = xd + m * D;
            float *yr = yd + m * D;
            const float inv = 1.0f / sqrtf(ss[i] / (float) D + eps);
            if (rstd) rstd[m] = inv;
            /* Elementwise from here on: y may alias x. */
            if (!r->t)
                for (int64_t d = 0; d < D; d++) yr[d] = xr[d] * inv * weight[d];
            else
                for (int64_t d = 0; d < D; d++)
                    yr[d] = round_to(r, round_to(r, xr[d]) * inv * round_to(r, weight[d]));
        }
    }
    return LOWP_OK;
}

static lowp_status rms_backward(const float *xd, const float *weight, const float *rstd,
                                const float *gd, int64_t M, int64_t D, float *od, float *dweight,
                                int nt) {
    float *c = malloc((size_t) M * sizeof *c);
    if (!c)
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "lowp_rmsnorm_backward: %lld floats of scratch",
                         (long long) M);
    const int64_t nb = (M + RMS_ROWS - 1) / RMS_ROWS;
    /* Column spans of the weight gradient: whole 16-float vectors per thread. */
    if (!(nt > 1 && M * D >= RMS_PARALLEL_MIN)) nt = 1;
    const int64_t span = ((D + nt - 1) / nt + 15) / 16 * 16, ns = (D + span - 1) / span;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        /* c[m] = r^3 * mean(dy * w * x) */
#pragma omp for schedule(static)
        for (int64_t b = 0; b < nb; b++) {
            const int64_t m0 = b * RMS_ROWS, n = M - m0 < RMS_ROWS ? M - m0 : RMS_ROWS;
            float dot[RMS_ROWS];
            if (n == RMS_ROWS) {
                dot_rows(gd + m0 * D, weight, xd + m0 * D, D, dot);
            } else {
                for (int64_t i = 0; i < n; i++) {
                    const float *xr = xd + (m0 + i) * D, *gr = gd + (m0 + i) * D;
                    float s = 0.0f;
                    for (int64_t d = 0; d < D; d++) s += gr[d] * weight[d] * xr[d];
                    dot[i] = s;
                }
            }
            for (int64_t i = 0; i < n; i++) {
                const float r = rstd[m0 + i];
                c[m0 + i] = r * r * r * (dot[i] / (float) D);
            }
        }
        /* dweight[d] += dy * x * r, over the rows in order (before dx may overwrite dy) */
        if (dweight) {
#pragma omp for schedule(static)
            for (int64_t k = 0; k < ns; k++) {
                const int64_t d0 = k * span, d1 = d0 + span < D ? d0 + span : D;
                for (int64_t m = 0; m < M; m++) {
                    const float *xr = xd + m * D, *gr = gd + m * D;
                    const float r = rstd[m];
                    for (int64_t d = d0; d < d1; d++) dweight[d] += gr[d] * xr[d] * r;
                }
            }
        }
        /* Elementwise after the sums: dx may alias dy. */
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) {
            const float *xr = xd + m * D, *gr = gd + m * D;
            float *orow = od + m * D;
            const float r = rstd[m], cm = c[m];
            for (int64_t d = 0; d < D; d++) orow[d] = r * (gr[d] * weight[d]) - xr[d] * cm;
        }
    }
    free(c);
    return LOWP_OK;
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

lowp_status lowp_rmsnorm_forward_nt(const lowp_tensor *x, const float *weight, float eps,
                                    lowp_tensor *y, float *rstd, const lowp_autocast *ac,
                                    int32_t threads) {
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

    return rms_forward(x->data, weight, eps, M, D, y->data, rstd, &r, lowp_thread_count(threads));
}

/* The gradient of y = x * r * w with r = (mean(x^2) + eps)^-1/2, per row:
 *   dx = r * (dy * w) - x * r^3 * mean(dy * w * x),   dweight += dy * x * r.
 * Sums in binary32, sequential along the row (deterministic). The backward takes no autocast:
 * it sees the binary32 rstd of the forward and the caller's x. */
lowp_status lowp_rmsnorm_backward_nt(const lowp_tensor *x, const float *weight, const float *rstd,
                                     const lowp_tensor *dy, lowp_tensor *dx, float *dweight,
                                     int32_t threads) {
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
    return rms_backward(x->data, weight, rstd, dy->data, M, D, dx->data, dweight,
                        lowp_thread_count(threads));
}

lowp_status lowp_rmsnorm_forward(const lowp_tensor *x, const float *weight, float eps,
                                 lowp_tensor *y, float *rstd, const lowp_autocast *ac) {
    return lowp_rmsnorm_forward_nt(x, weight, eps, y, rstd, ac, 0);
}

lowp_status lowp_rmsnorm_backward(const lowp_tensor *x, const float *weight, const float *rstd,
                                  const lowp_tensor *dy, lowp_tensor *dx, float *dweight) {
    return lowp_rmsnorm_backward_nt(x, weight, rstd, dy, dx, dweight, 0);
}
