/* The attention half of a decoder layer, forward and backward side by side:
 *
 *   h = attn_norm(x)                       RMSNorm (lowp_rmsnorm_*, autocast applies)
 *   q, k, v = h Wq^T, h Wk^T, h Wv^T        lowp linears (recipes apply by name)
 *   q, k = rope(q), rope(k)                 rotary positions, pairs (2i, 2i+1) of each head
 *   o[t] = sum_{j<=t} softmax_j(q[t] . k[j] / sqrt(hd)) v[j]     per head, binary32
 *   y = o Wo^T
 *
 * The attention core is plain C parallelized over (sequence, head) tasks: each task owns its
 * rows and head columns of every output and gradient, so no sum depends on the thread count.
 * The softmax probabilities are kept ([B, nh, T, T]) for the backward. `omp simd` marks the
 * elementwise inner loops, whose rows never overlap, so they vectorize at -O2 without alias
 * checks (elementwise, so the bits do not change). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/profile_internal.h"
#include "model_internal.h"

/* Rotates each pair (2i, 2i+1) of every head of row n by the angle t * theta^(-2i / hd), where
 * t = n % T is the position in the sequence; sign -1 rotates by minus the angle, which is the
 * transpose of the rotation and so its backward. cosv, sinv: [seq_len, hd / 2]. */
static void rope_rotate(float *x, const moe_dims *d, const float *cosv, const float *sinv,
                        float sign, int nthreads) {
    const int64_t half = d->hd / 2;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (d->N * d->D >= MOE_PARALLEL_MIN)
    for (int64_t n = 0; n < d->N; n++) {
        const float *c = cosv + (n % d->T) * half;
        const float *s = sinv + (n % d->T) * half;
        for (int64_t h = 0; h < d->nh; h++) {
            float *p = x + n * d->D + h * d->hd;
            for (int64_t i = 0; i < half; i++) {
                const float a = p[2 * i], b = p[2 * i + 1], sn = sign * s[i];
                p[2 * i] = a * c[i] - b * sn;
                p[2 * i + 1] = a * sn + b * c[i];
            }
        }
    }
}

/* a . b in eight interleaved partial sums: the compiler can keep them in one vector register
 * (a single running sum would serialize), and the order is fixed, so every machine and thread
 * count gets the same bits. */
static float dot(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

/* xt [hd, T] = the T rows of one head's columns of x (row stride D), transposed. */
static void head_transpose(const float *x, int64_t D, int64_t T, int64_t hd, float *xt) {
    for (int64_t j = 0; j < T; j++)
        for (int64_t i = 0; i < hd; i++) xt[i * T + j] = x[j * D + i];
}

/* p[j] = a . b_j for j <= t, with bt [hd, T] the b rows transposed: the sums run over i in
 * order for every j at once, so the loop vectorizes across j with no horizontal sums (the
 * row-by-row dot products of short heads spent most of their time reducing). */
static void row_dots(const float *a, const float *bt, int64_t T, int64_t hd, int64_t t, float *p) {
    for (int64_t j = 0; j <= t; j++) p[j] = 0.0f;
    for (int64_t i = 0; i < hd; i++) {
        const float ai = a[i];
        const float *br = bt + i * T;
#pragma omp simd
        for (int64_t j = 0; j <= t; j++) p[j] += ai * br[j];
    }
}

/* Causal attention. q, k, v, o: [N, D] with head h in columns [h * hd, (h + 1) * hd);
 * att: [B, nh, T, T]. Task (b, h) covers rows b * T .. b * T + T - 1 of head h. Each thread
 * transposes its task's keys once into scratch (without scratch: row-by-row dot products,
 * which give other bits). */
void moe_attention_core_forward(const moe_dims *d, const float *q, const float *k, const float *v,
                                float *att, float *o, int nthreads) {
    const int64_t T = d->T, D = d->D, hd = d->hd;
    const float scale = 1.0f / sqrtf((float) hd);
    const int64_t work = d->N * d->T * d->D; /* ~ twice the multiply-adds */
#pragma omp parallel num_threads(nthreads) if (work >= MOE_PARALLEL_MIN)
    {
        float *kt = malloc((size_t) (T * hd) * sizeof(float));
#pragma omp for schedule(static)
        for (int64_t task = 0; task < d->B * d->nh; task++) {
            const int64_t base = (task / d->nh) * T * D + (task % d->nh) * hd;
            if (kt) head_transpose(k + base, D, T, hd, kt);
            for (int64_t t = 0; t < T; t++) {
                const float *qt = q + base + t * D;
                float *p = att + (task * T + t) * T; /* [T]: scores, then probabilities */
                float mx = -INFINITY;
                if (kt) row_dots(qt, kt, T, hd, t, p);
                for (int64_t j = 0; j <= t; j++) {
                    p[j] = (kt ? p[j] : dot(qt, k + base + j * D, hd)) * scale;
                    if (p[j] > mx) mx = p[j];
                }
                float sum = 0.0f;
                for (int64_t j = 0; j <= t; j++) {
                    p[j] = expf(p[j] - mx);
                    sum += p[j];
                }
                const float inv = 1.0f / sum;
                for (int64_t j = 0; j <= t; j++) p[j] *= inv;
                for (int64_t j = t + 1; j < T; j++)
                    p[j] = 0.0f; /* masked: the buffer stays defined */

                float *ot = o + base + t * D;
                memset(ot, 0, (size_t) hd * sizeof(float));
                for (int64_t j = 0; j <= t; j++) {
                    const float *vj = v + base + j * D;
#pragma omp simd
                    for (int64_t i = 0; i < hd; i++) ot[i] += p[j] * vj[i];
                }
            }
        }
        free(kt);
    }
}

/* Backward of moe_attention_core_forward: from do_ [N, D], dq, dk, dv [N, D] (overwritten).
 * With P the probabilities of row t and dP[j] = do[t] . v[j]:
 *   dv[j] += P[j] do[t];   dS[j] = P[j] (dP[j] - sum_i P[i] dP[i]);
 *   dq[t] += scale sum_j dS[j] k[j];   dk[j] += scale dS[j] q[t].
 * datt: [B * nh, T], one row of dP per task. */
void moe_attention_core_backward(const moe_dims *d, const float *q, const float *k, const float *v,
                                 const float *att, const float *do_, float *dq, float *dk,
                                 float *dv, float *datt, int nthreads) {
    const int64_t T = d->T, D = d->D, hd = d->hd;
    const float scale = 1.0f / sqrtf((float) hd);
    const int64_t work = d->N * d->T * d->D; /* ~ twice the multiply-adds */
#pragma omp parallel num_threads(nthreads) if (work >= MOE_PARALLEL_MIN)
    {
        float *vt = malloc((size_t) (T * hd) * sizeof(float));
#pragma omp for schedule(static)
        for (int64_t task = 0; task < d->B * d->nh; task++) {
            const int64_t base = (task / d->nh) * T * D + (task % d->nh) * hd;
            float *dp = datt + task * T;
            if (vt) head_transpose(v + base, D, T, hd, vt);
            for (int64_t t = 0; t < T; t++) {
                memset(dq + base + t * D, 0, (size_t) hd * sizeof(float));
                memset(dk + base + t * D, 0, (size_t) hd * sizeof(float));
                memset(dv + base + t * D, 0, (size_t) hd * sizeof(float));
            }
            for (int64_t t = 0; t < T; t++) {
                const float *p = att + (task * T + t) * T;
                const float *dot_ = do_ + base + t * D;
                float pdp = 0.0f; /* sum_j P[j] dP[j] */
                if (vt) row_dots(dot_, vt, T, hd, t, dp);
                for (int64_t j = 0; j <= t; j++) {
                    if (!vt) dp[j] = dot(dot_, v + base + j * D, hd);
                    pdp += p[j] * dp[j];
                    float *dvj = dv + base + j * D;
#pragma omp simd
                    for (int64_t i = 0; i < hd; i++) dvj[i] += p[j] * dot_[i];
                }
                const float *qt = q + base + t * D;
                float *dqt = dq + base + t * D;
                for (int64_t j = 0; j <= t; j++) {
                    const float ds = p[j] * (dp[j] - pdp) * scale;
                    const float *kj = k + base + j * D;
                    float *dkj = dk + base + j * D;
#pragma omp simd
                    for (int64_t i = 0; i < hd; i++) {
                        dqt[i] += ds * kj[i];
                        dkj[i] += ds * qt[i];
                    }
                }
            }
        }
        free(vt);
    }
}

lowp_status moe_attention_forward(lowp_param *lp, const moe_dims *d, const moe_exec *ex,
                                  const float *rope_cos, const float *rope_sin, const float *x,
                                  moe_attn_acts *a, int keep) {
    const int64_t N = d->N, D = d->D;
    lowp_status st;

    /* h [N, D] = attn_norm(x [N, D]) */
    lowp_tensor xt = moe_tensor(x, N, D), ht = moe_tensor(a->h, N, D);
    st = lowp_rmsnorm_forward(&xt, lp[MOE_ATTN_NORM].data, d->eps, &ht, a->rstd, ex->autocast);
    if (st != LOWP_OK) return st;

    /* q, k, v [N, D] = h Wq^T, h Wk^T, h Wv^T; then RoPE on q and k */
    st = moe_linear_fwd(&lp[MOE_WQ], a->h, N, a->q, ex, keep ? &a->saved[0] : NULL);
    if (st != LOWP_OK) return st;
    st = moe_linear_fwd(&lp[MOE_WK], a->h, N, a->k, ex, keep ? &a->saved[1] : NULL);
    if (st != LOWP_OK) return st;
    st = moe_linear_fwd(&lp[MOE_WV], a->h, N, a->v, ex, keep ? &a->saved[2] : NULL);
    if (st != LOWP_OK) return st;
    lowp_prof_push(LOWP_PHASE_ATTENTION);
    rope_rotate(a->q, d, rope_cos, rope_sin, 1.0f, ex->nthreads);
    rope_rotate(a->k, d, rope_cos, rope_sin, 1.0f, ex->nthreads);

    /* o [N, D] = causal softmax attention; att [B, nh, T, T] kept */
    moe_attention_core_forward(d, a->q, a->k, a->v, a->att, a->o, ex->nthreads);
    lowp_prof_pop();

    /* y [N, D] = o Wo^T */
    return moe_linear_fwd(&lp[MOE_WO], a->o, N, a->y, ex, keep ? &a->saved[3] : NULL);
}

lowp_status moe_attention_backward(lowp_param *lp, const moe_dims *d, const moe_exec *ex,
                                   const float *rope_cos, const float *rope_sin, const float *x,
                                   moe_attn_acts *a, const float *dy, float *dx, moe_grads *g) {
    const int64_t N = d->N, D = d->D;
    lowp_status st;

    /* y = o Wo^T:  do_ [N, D] = dy Wo;  Wo.grad += dy^T o */
    st = moe_linear_bwd(&lp[MOE_WO], a->o, N, dy, g->do_, ex, &a->saved[3]);
    if (st != LOWP_OK) return st;

    /* attention core: dq, dk, dv [N, D]; then RoPE's transpose on dq and dk */
    lowp_prof_push(LOWP_PHASE_ATTENTION);
    moe_attention_core_backward(d, a->q, a->k, a->v, a->att, g->do_, g->dq, g->dk, g->dv, g->datt,
                                ex->nthreads);
    rope_rotate(g->dq, d, rope_cos, rope_sin, -1.0f, ex->nthreads);
    rope_rotate(g->dk, d, rope_cos, rope_sin, -1.0f, ex->nthreads);
    lowp_prof_pop();

    /* q, k, v = h W^T:  dh [N, D] = dq Wq + dk Wk + dv Wv */
    st = moe_linear_bwd(&lp[MOE_WQ], a->h, N, g->dq, g->dh, ex, &a->saved[0]);
    if (st != LOWP_OK) return st;
    st = moe_linear_bwd(&lp[MOE_WK], a->h, N, g->dk, g->dtmp, ex, &a->saved[1]);
    if (st != LOWP_OK) return st;
    moe_add(g->dh, g->dtmp, N * D, ex->nthreads);
    st = moe_linear_bwd(&lp[MOE_WV], a->h, N, g->dv, g->dtmp, ex, &a->saved[2]);
    if (st != LOWP_OK) return st;
    moe_add(g->dh, g->dtmp, N * D, ex->nthreads);

    /* h = attn_norm(x):  dx [N, D] += the norm's backward; attn_norm.grad += */
    lowp_tensor xt = moe_tensor(x, N, D), dht = moe_tensor(g->dh, N, D);
    lowp_tensor dxt = moe_tensor(g->dtmp, N, D);
    st = lowp_rmsnorm_backward(&xt, lp[MOE_ATTN_NORM].data, a->rstd, &dht, &dxt,
                               lp[MOE_ATTN_NORM].grad);
    if (st != LOWP_OK) return st;
    moe_add(dx, g->dtmp, N * D, ex->nthreads);
    return LOWP_OK;
}
