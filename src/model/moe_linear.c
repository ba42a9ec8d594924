/* The model's calls into the training layer: linear and grouped-linear forward and backward
 * on F32 host buffers, and the element-wise residual add, shared by moe.c, moe_attention.c
 * and moe_ffn.c (model_internal.h). The training layer names the parameter in its own failure
 * messages, so these wrappers add nothing to them. */
#include <omp.h>

#include <string.h>

#include "model_internal.h"

lowp_status moe_linear_fwd(lowp_param *w, const float *x, int64_t M, float *y, const moe_exec *ex,
                           lowp_linear_saved **saved) {
    lowp_tensor xt = moe_tensor(x, M, w->cols), yt = moe_tensor(y, M, w->rows);
    return lowp_linear_forward(w, NULL, &xt, &yt, &ex->lin, saved);
}

lowp_status moe_linear_fwd_again(lowp_param *w, const float *x, int64_t M, float *y,
                                 const moe_exec *ex, lowp_linear_saved **saved) {
    lowp_tensor xt = moe_tensor(x, M, w->cols), yt = moe_tensor(y, M, w->rows);
    lowp_linear_opts o = ex->lin;
    o.reuse_input = 1;
    return lowp_linear_forward(w, NULL, &xt, &yt, &o, saved);
}

lowp_status moe_linear_bwd(lowp_param *w, const float *x, int64_t M, const float *dy, float *dx,
                           const moe_exec *ex, lowp_linear_saved **saved) {
    lowp_tensor xt = moe_tensor(x, M, w->cols), dyt = moe_tensor(dy, M, w->rows);
    lowp_tensor dxt = moe_tensor(dx, M, w->cols);
    lowp_linear_saved *s = *saved;
    *saved = NULL; /* consumed, whatever the outcome */
    return lowp_linear_backward(w, &xt, &dyt, dx ? &dxt : NULL, NULL, &ex->lin, s);
}

lowp_status moe_grouped_fwd(lowp_param *w, const float *x, int64_t M, const int32_t *offs, float *y,
                            const moe_exec *ex, lowp_linear_saved **saved) {
    lowp_tensor xt = moe_tensor(x, M, w->cols), yt = moe_tensor(y, M, w->rows);
    return lowp_grouped_linear_forward(w, &xt, offs, &yt, &ex->lin, saved);
}

lowp_status moe_grouped_fwd_again(lowp_param *w, const float *x, int64_t M, const int32_t *offs,
                                  float *y, const moe_exec *ex, lowp_linear_saved **saved) {
    lowp_tensor xt = moe_tensor(x, M, w->cols), yt = moe_tensor(y, M, w->rows);
    lowp_linear_opts o = ex->lin;
    o.reuse_input = 1;
    return lowp_grouped_linear_forward(w, &xt, offs, &yt, &o, saved);
}

lowp_status moe_grouped_bwd(lowp_param *w, const float *x, int64_t M, const int32_t *offs,
                            const float *dy, float *dx, const moe_exec *ex,
                            lowp_linear_saved **saved) {
    lowp_tensor xt = moe_tensor(x, M, w->cols), dyt = moe_tensor(dy, M, w->rows);
    lowp_tensor dxt = moe_tensor(dx, M, w->cols);
    lowp_linear_saved *s = *saved;
    *saved = NULL;
    return lowp_grouped_linear_backward(w, &xt, offs, &dyt, dx ? &dxt : NULL, &ex->lin, s);
}

void moe_add(float *dst, const float *src, int64_t n, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (n >= MOE_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

void moe_sum(float *dst, const float *a, const float *b, int64_t n, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (n >= MOE_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) dst[i] = a[i] + b[i];
}

void moe_copy(float *dst, const float *src, int64_t n, int nthreads) {
    const int64_t span = 16384; /* floats */
#pragma omp parallel for num_threads(nthreads) schedule(static) if (n >= 4 * span)
    for (int64_t i = 0; i < n; i += span)
        memcpy(dst + i, src + i, (size_t) (n - i < span ? n - i : span) * sizeof(float));
}
