/* The MoE half of a decoder layer, forward and backward side by side:
 *
 *   h = ffn_norm(x)                                  RMSNorm
 *   p = softmax(h Wr^T)                              router (its own linear, high precision)
 *   idx = top_k(p); gate = p[idx] / sum p[idx]       per token, K experts
 *   y = shared(h) + sum_j gate[j] expert_idx[j](h)   every expert a SwiGLU: (silu(h W1^T) *
 *                                                    (h W3^T)) W2^T
 *   aux = E * sum_e f_e P_e                          load balancing (Switch / DeepSeek):
 *                                                    f_e = share of the N*K slots routed to e,
 *                                                    P_e = mean router probability of e
 *
 * The routed experts run as grouped linears: the K slots of every token are sorted by expert
 * (tokens in order within an expert) into [S, D] buffers whose row ranges offs[e-1]..offs[e]
 * belong to expert e. f_e is a count, so aux's gradient reaches the router only through P_e:
 * dAux/dp[n, e] = E f_e / N. */
#include <math.h>
#include <string.h>

#include "cpu/host.h"
#include "model_internal.h"

static float sigmoidf(float u) {
    return 1.0f / (1.0f + expf(-u));
}

/* s = silu(u1) * u3 over n elements. */
/* Spans of whole vectors per thread for the vector kernels (cpu.h), so that no vector
 * straddles two threads. */
#define VSPAN 4096

static void swiglu_forward(const float *u1, const float *u3, float *s, int64_t n, int nthreads) {
    const lowp_cpu_vmath *vm = lowp_cpu_vmath_pick();
    if (vm) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (n >= MOE_PARALLEL_MIN)
        for (int64_t i = 0; i < n; i += VSPAN)
            vm->swiglu_fwd(u1 + i, u3 + i, s + i, n - i < VSPAN ? n - i : VSPAN);
        return;
    }
#pragma omp parallel for num_threads(nthreads) schedule(static) if (n >= MOE_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) s[i] = u1[i] * sigmoidf(u1[i]) * u3[i];
}

/* With silu'(u) = sig(u) (1 + u (1 - sig(u))):
 *   du1 = ds * u3 * silu'(u1),   du3 = ds * silu(u1). */
static void swiglu_backward(const float *u1, const float *u3, const float *ds, float *du1,
                            float *du3, int64_t n, int nthreads) {
    const lowp_cpu_vmath *vm = lowp_cpu_vmath_pick();
    if (vm) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (n >= MOE_PARALLEL_MIN)
        for (int64_t i = 0; i < n; i += VSPAN) {
            const int64_t len = n - i < VSPAN ? n - i : VSPAN;
            vm->swiglu_bwd(u1 + i, u3 + i, ds + i, du1 + i, du3 + i, len);
        }
        return;
    }
#pragma omp parallel for num_threads(nthreads) schedule(static) if (n >= MOE_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float sg = sigmoidf(u1[i]);
        du1[i] = ds[i] * u3[i] * sg * (1.0f + u1[i] * (1.0f - sg));
        du3[i] = ds[i] * u1[i] * sg;
    }
}

/* Router: p [N, E] (holding the logits on entry) -> softmax in place; idx, gate [N, K]. Ties
 * go to the lower expert index, so the choice is the same everywhere. */
static void route(const moe_dims *d, float *p, int32_t *idx, float *gate, int nthreads) {
    const int64_t E = d->E, K = d->K;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (d->N * E >= MOE_PARALLEL_MIN)
    for (int64_t n = 0; n < d->N; n++) {
        float *pn = p + n * E;
        float mx = pn[0];
        for (int64_t e = 1; e < E; e++) mx = pn[e] > mx ? pn[e] : mx;
        float sum = 0.0f;
        for (int64_t e = 0; e < E; e++) {
            pn[e] = expf(pn[e] - mx);
            sum += pn[e];
        }
        for (int64_t e = 0; e < E; e++) pn[e] /= sum;

        int32_t *in = idx + n * K;
        float chosen = 0.0f;
        for (int64_t j = 0; j < K; j++) {
            int32_t best = -1;
            for (int32_t e = 0; e < (int32_t) E; e++) {
                int taken = 0;
                for (int64_t i = 0; i < j; i++) taken |= in[i] == e;
                if (!taken && (best < 0 || pn[e] > pn[best])) best = e;
            }
            in[j] = best;
            chosen += pn[best];
        }
        for (int64_t j = 0; j < K; j++) gate[n * K + j] = pn[in[j]] / chosen;
    }
}

/* Backward of route and of the load-balancing loss, into dp [N, E] = dLoss/dlogits:
 *   gate_j = p_j / C (C = sum of the chosen p):  dp_j = (dgate_j - sum_m dgate_m gate_m) / C
 *   aux:  dp_e += daux * E f_e / N
 *   softmax:  dlogit_e = p_e (dp_e - sum_e' p_e' dp_e') */
static void route_backward(const moe_dims *d, const moe_ffn_acts *a, const float *dgate,
                           double daux, float *dprobs, int nt) {
    const int64_t N = d->N, E = d->E, K = d->K;
#pragma omp parallel for num_threads(nt) schedule(static) if (N * E >= MOE_PARALLEL_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *pn = a->probs + n * E;
        float *dp = dprobs + n * E;
        for (int64_t e = 0; e < E; e++) dp[e] = (float) (daux * E * a->frac[e] / (double) N);
        float chosen = 0.0f, dgg = 0.0f;
        for (int64_t j = 0; j < K; j++) {
            chosen += pn[a->idx[n * K + j]];
            dgg += dgate[n * K + j] * a->gate[n * K + j];
        }
        for (int64_t j = 0; j < K; j++) dp[a->idx[n * K + j]] += (dgate[n * K + j] - dgg) / chosen;
        float pdp = 0.0f;
        for (int64_t e = 0; e < E; e++) pdp += pn[e] * dp[e];
        for (int64_t e = 0; e < E; e++) dp[e] = pn[e] * (dp[e] - pdp);
    }
}

/* Sorts the slots by expert: offs [E] cumulative ends, pos [N, K] each slot's row, frac [E]
 * f_e. Returns aux = E * sum_e f_e P_e. Serial: O(N K + N E), and the order is fixed. */
static double dispatch(const moe_dims *d, const float *p, const int32_t *idx, int32_t *offs,
                       int32_t *pos, float *frac) {
    const int64_t E = d->E, S = d->S;
    for (int64_t e = 0; e < E; e++) offs[e] = 0;
    for (int64_t i = 0; i < S; i++) offs[idx[i]]++;
    for (int64_t e = 0; e < E; e++) frac[e] = (float) ((double) offs[e] / (double) S);

    /* offs[e] becomes e's first row, then slot i = n * K + j takes the next row of its expert,
     * which leaves offs[e] at e's end. */
    int32_t start = 0;
    for (int64_t e = 0; e < E; e++) {
        const int32_t count = offs[e];
        offs[e] = start;
        start += count;
    }
    for (int64_t i = 0; i < S; i++) pos[i] = offs[idx[i]]++;

    double aux = 0.0;
    for (int64_t e = 0; e < E; e++) {
        double mean_p = 0.0; /* P_e */
        for (int64_t n = 0; n < d->N; n++) mean_p += p[n * E + e];
        aux += (double) frac[e] * (mean_p / (double) d->N);
    }
    return (double) E * aux;
}

/* xp [S, D]: row pos[n, j] = h[n] (each token once per chosen expert). */
static void gather(const moe_dims *d, const float *h, const int32_t *pos, float *xp, int nt) {
    const int64_t D = d->D, K = d->K;
#pragma omp parallel for num_threads(nt) schedule(static) if (d->S * D >= MOE_PARALLEL_MIN)
    for (int64_t i = 0; i < d->S; i++)
        memcpy(xp + (int64_t) pos[i] * D, h + (i / K) * D, (size_t) D * sizeof(float));
}

/* Backward of gather for both expert inputs: dh[n] += sum_j dxp[pos] + dxp3[pos]. */
static void gather_backward(const moe_dims *d, const int32_t *pos, const float *dxp,
                            const float *dxp3, float *dh, int nt) {
    const int64_t D = d->D, K = d->K;
#pragma omp parallel for num_threads(nt) schedule(static) if (d->N * K * D >= MOE_PARALLEL_MIN)
    for (int64_t n = 0; n < d->N; n++) {
        float *dhn = dh + n * D;
        for (int64_t j = 0; j < K; j++) {
            const int64_t r = pos[n * K + j];
            for (int64_t c = 0; c < D; c++) dhn[c] += dxp[r * D + c] + dxp3[r * D + c];
        }
    }
}

/* y[n] += sum_j gate[n, j] eo[pos[n, j]]. */
static void combine(const moe_dims *d, const moe_ffn_acts *a, float *y, int nt) {
    const int64_t D = d->D, K = d->K;
#pragma omp parallel for num_threads(nt) schedule(static) if (d->N * K * D >= MOE_PARALLEL_MIN)
    for (int64_t n = 0; n < d->N; n++) {
        float *yn = y + n * D;
        for (int64_t j = 0; j < K; j++) {
            const float g = a->gate[n * K + j];
            const float *e = a->eo + (int64_t) a->pos[n * K + j] * D;
            for (int64_t c = 0; c < D; c++) yn[c] += g * e[c];
        }
    }
}

/* Backward of combine: deo [S, D] = gate * dy[n] at each slot's row; dgate [N, K] =
 * dy[n] . eo[pos]. */
static void combine_backward(const moe_dims *d, const moe_ffn_acts *a, const float *dy, float *deo,
                             float *dgate, int nt) {
    const int64_t D = d->D, K = d->K;
#pragma omp parallel for num_threads(nt) schedule(static) if (d->N * K * D >= MOE_PARALLEL_MIN)
    for (int64_t n = 0; n < d->N; n++) {
        const float *dyn = dy + n * D;
        for (int64_t j = 0; j < K; j++) {
            const int64_t r = a->pos[n * K + j];
            const float gt = a->gate[n * K + j];
            const float *e = a->eo + r * D;
            float *de = deo + r * D;
            float dg = 0.0f;
            for (int64_t c = 0; c < D; c++) {
                de[c] = gt * dyn[c];
                dg += dyn[c] * e[c];
            }
            dgate[n * K + j] = dg;
        }
    }
}

lowp_status moe_ffn_forward(lowp_param *lp, const moe_dims *d, const moe_exec *ex, const float *x,
                            moe_ffn_acts *a, int keep) {
    const int64_t N = d->N, D = d->D, S = d->S, nt = ex->nthreads;
    lowp_status st;

    /* h [N, D] = ffn_norm(x [N, D]) */
    lowp_tensor xt = moe_tensor(x, N, D), ht = moe_tensor(a->h, N, D);
    st = lowp_rmsnorm_forward_nt(&xt, lp[MOE_FFN_NORM].data, d->eps, &ht, a->rstd, ex->autocast,
                                 ex->nthreads);
    if (st != LOWP_OK) return st;

    /* probs [N, E] = softmax(h Wr^T); idx, gate [N, K]; offs, frac [E]; pos [N, K] */
    st = moe_linear_fwd(&lp[MOE_ROUTER], a->h, N, a->probs, ex, keep ? &a->saved[0] : NULL);
    if (st != LOWP_OK) return st;
    route(d, a->probs, a->idx, a->gate, (int) nt);
    a->aux = dispatch(d, a->probs, a->idx, a->offs, a->pos, a->frac);

    /* routed experts: xp [S, D] = h in expert order; u1, u3 [S, H]; s [S, H]; eo [S, D] */
    gather(d, a->h, a->pos, a->xp, (int) nt);
    st = moe_grouped_fwd(&lp[MOE_EXPERTS_W1], a->xp, S, a->offs, a->u1, ex,
                         keep ? &a->saved[1] : NULL);
    if (st != LOWP_OK) return st;
    st = moe_grouped_fwd_again(&lp[MOE_EXPERTS_W3], a->xp, S, a->offs, a->u3, ex,
                               keep ? &a->saved[2] : NULL);
    if (st != LOWP_OK) return st;
    swiglu_forward(a->u1, a->u3, a->s, S * d->H, (int) nt);
    st = moe_grouped_fwd(&lp[MOE_EXPERTS_W2], a->s, S, a->offs, a->eo, ex,
                         keep ? &a->saved[3] : NULL);
    if (st != LOWP_OK) return st;

    /* shared expert: su1, su3, ss [N, H_s]; y [N, D] = ss Ws2^T */
    st = moe_linear_fwd(&lp[MOE_SHARED_W1], a->h, N, a->su1, ex, keep ? &a->saved[4] : NULL);
    if (st != LOWP_OK) return st;
    st = moe_linear_fwd_again(&lp[MOE_SHARED_W3], a->h, N, a->su3, ex, keep ? &a->saved[5] : NULL);
    if (st != LOWP_OK) return st;
    swiglu_forward(a->su1, a->su3, a->ss, N * d->Hs, (int) nt);
    st = moe_linear_fwd(&lp[MOE_SHARED_W2], a->ss, N, a->y, ex, keep ? &a->saved[6] : NULL);
    if (st != LOWP_OK) return st;

    /* y [N, D] += sum_j gate[n, j] eo[pos[n, j]] */
    combine(d, a, a->y, (int) nt);
    return LOWP_OK;
}

lowp_status moe_ffn_backward(lowp_param *lp, const moe_dims *d, const moe_exec *ex, const float *x,
                             moe_ffn_acts *a, const float *dy, double daux, float *dx,
                             moe_grads *g) {
    const int64_t N = d->N, D = d->D, S = d->S, nt = ex->nthreads;
    lowp_status st;

    /* shared expert:  dss [N, H_s] = dy Ws2;  dsu1, dsu3 [N, H_s];  dh [N, D] = dsu1 Ws1 +
     * dsu3 Ws3 */
    st = moe_linear_bwd(&lp[MOE_SHARED_W2], a->ss, N, dy, g->dss, ex, &a->saved[6]);
    if (st != LOWP_OK) return st;
    swiglu_backward(a->su1, a->su3, g->dss, g->dsu1, g->dsu3, N * d->Hs, (int) nt);
    st = moe_linear_bwd(&lp[MOE_SHARED_W1], a->h, N, g->dsu1, g->dh, ex, &a->saved[4]);
    if (st != LOWP_OK) return st;
    st = moe_linear_bwd(&lp[MOE_SHARED_W3], a->h, N, g->dsu3, g->dtmp, ex, &a->saved[5]);
    if (st != LOWP_OK) return st;
    moe_add(g->dh, g->dtmp, N * D, (int) nt);

    /* gated combine:  deo [S, D], dgate [N, K] */
    combine_backward(d, a, dy, g->deo, g->dgate, (int) nt);

    /* routed experts:  ds [S, H] = deo W2;  du1, du3 [S, H];  dxp [S, D] = du1 W1 + du3 W3 */
    st = moe_grouped_bwd(&lp[MOE_EXPERTS_W2], a->s, S, a->offs, g->deo, g->ds, ex, &a->saved[3]);
    if (st != LOWP_OK) return st;
    swiglu_backward(a->u1, a->u3, g->ds, g->du1, g->du3, S * d->H, (int) nt);
    st = moe_grouped_bwd(&lp[MOE_EXPERTS_W1], a->xp, S, a->offs, g->du1, g->dxp, ex, &a->saved[1]);
    if (st != LOWP_OK) return st;
    st = moe_grouped_bwd(&lp[MOE_EXPERTS_W3], a->xp, S, a->offs, g->du3, g->dxp3, ex, &a->saved[2]);
    if (st != LOWP_OK) return st;

    /* back to token order:  dh [N, D] += sum_j dxp[pos] + dxp3[pos] */
    gather_backward(d, a->pos, g->dxp, g->dxp3, g->dh, (int) nt);

    /* router:  dprobs [N, E] = dLoss/dlogits (gates and aux);  dh += dprobs Wr */
    route_backward(d, a, g->dgate, daux, g->dprobs, (int) nt);
    st = moe_linear_bwd(&lp[MOE_ROUTER], a->h, N, g->dprobs, g->dtmp, ex, &a->saved[0]);
    if (st != LOWP_OK) return st;
    moe_add(g->dh, g->dtmp, N * D, (int) nt);

    /* h = ffn_norm(x):  dx [N, D] += the norm's backward; ffn_norm.grad += */
    lowp_tensor xt = moe_tensor(x, N, D), dht = moe_tensor(g->dh, N, D);
    lowp_tensor dxt = moe_tensor(g->dtmp, N, D);
    st = lowp_rmsnorm_backward_nt(&xt, lp[MOE_FFN_NORM].data, a->rstd, &dht, &dxt,
                                  lp[MOE_FFN_NORM].grad, ex->nthreads);
    if (st != LOWP_OK) return st;
    moe_add(dx, g->dtmp, N * D, (int) nt);
    return LOWP_OK;
}
