/* Helpers that both models (moe.c, dense.c) use, kept apart from either so that neither
 * model file calls into the other's: the activation arena's bump allocator and the
 * cross-entropy loss with its gradient (model_internal.h). */
#include <math.h>

#include "model_internal.h"

void *moe_carve(moe_carver *c, int64_t count, size_t elem) {
    const size_t at = (c->off + 63) / 64 * 64;
    c->off = at + (size_t) count * elem;
    return c->base ? c->base + at : NULL;
}

/* Mean over rows of logsumexp(logits[n]) - logits[n, targets[n]]; lse [N] and row_loss [N]
 * kept. Sums in binary64, the mean in row order. */
double moe_cross_entropy(const moe_dims *d, const float *logits, const int32_t *targets, float *lse,
                         double *row_loss, int nthreads) {
    const int64_t V = d->V;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (d->N * V >= MOE_PARALLEL_MIN)
    for (int64_t n = 0; n < d->N; n++) {
        const float *z = logits + n * V;
        float mx = z[0];
        for (int64_t v = 1; v < V; v++) mx = z[v] > mx ? z[v] : mx;
        double sum = 0.0;
        for (int64_t v = 0; v < V; v++) sum += exp((double) (z[v] - mx));
        const double l = (double) mx + log(sum);
        lse[n] = (float) l;
        row_loss[n] = l - (double) z[targets[n]];
    }
    double total = 0.0;
    for (int64_t n = 0; n < d->N; n++) total += row_loss[n];
    return total / (double) d->N;
}

/* dlogits [N, V] = (softmax(logits[n]) - onehot(targets[n])) / N. */
void moe_cross_entropy_backward(const moe_dims *d, const float *logits, const int32_t *targets,
                                const float *lse, float *dlogits, int nthreads) {
    const int64_t V = d->V;
    const float inv_n = 1.0f / (float) d->N;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (d->N * V >= MOE_PARALLEL_MIN)
    for (int64_t n = 0; n < d->N; n++) {
        const float *z = logits + n * V;
        float *dz = dlogits + n * V;
        for (int64_t v = 0; v < V; v++) dz[v] = expf(z[v] - lse[n]) * inv_n;
        dz[targets[n]] -= inv_n;
    }
}
