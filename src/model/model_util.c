/* Helpers that both models (moe.c, dense.c) use, kept apart from either so that neither
 * model file calls into the other's: the parameter table with its initialization and size
 * limits, the activation arena's bump allocator and the cross-entropy loss with its gradient
 * (model_internal.h). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model_internal.h"

/* ---------------------------------------------------------------- the parameter table */

/* Bytes of physical memory, or 0 when unknown. */
static double physical_memory(void) {
    const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (double) pages * (double) size : 0.0;
}

lowp_status model_size_check(const lowp_moe_config *c, const char *fn, double total) {
    /* The parameter table counts 3 + layers * MOE_LAYER_PARAMS entries in an int32. */
    if (c->layers > LOWP_MOE_MAX_LAYERS)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: cfg.layers (%d) > %d", fn, c->layers,
                         LOWP_MOE_MAX_LAYERS);
    /* Before any allocation: the weights and gradients (and the optimizer's two moments the
     * trainer adds) must fit the machine, so a typo does not end in a swap storm. */
    const double need = 16.0 * total + 8.0 * (double) c->seq_len * (double) c->dim;
    const double have = physical_memory();
    if (have > 0 && need > have)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: the configuration needs about %.3g GB for %.3g parameters (weights, "
                         "gradients, Adam moments and RoPE tables), more than the %.3g GB of "
                         "physical memory",
                         fn, need / 1e9, total, have / 1e9);
    return LOWP_OK;
}

lowp_status model_params_alloc(model_params *p, int32_t cap, const char *fn) {
    p->n = 0;
    p->cap = cap;
    p->params = calloc((size_t) cap, sizeof *p->params);
    p->names = calloc((size_t) cap, sizeof *p->names);
    p->init_std = calloc((size_t) cap, sizeof *p->init_std);
    if (!p->params || !p->names || !p->init_std)
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: parameter tables", fn);
    return LOWP_OK;
}

void model_params_add(model_params *p, int64_t groups, int64_t rows, int64_t cols, float std,
                      const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->names[p->n], MODEL_NAME_MAX, fmt, ap);
    va_end(ap);
    p->params[p->n].groups = (int32_t) groups;
    p->params[p->n].rows = rows;
    p->params[p->n].cols = cols;
    p->init_std[p->n++] = std;
}

/* Every parameter's place in the arena starts on a 64-byte line. */
static int64_t padded(int64_t n) {
    return (n + 15) / 16 * 16;
}

/* N(0, std) from Philox words through Box-Muller in binary64, so the weights are the same on
 * every machine and for any thread count: words base + 2p and base + 2p + 1 give the radius
 * and the angle of elements 2p (cosine) and 2p + 1 (sine). */
static void init_normal(float *w, int64_t n, float std, uint64_t seed, uint64_t base,
                        int nthreads) {
    enum { CHUNK = 4096 }; /* elements per task, even */
    const int64_t chunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (n >= MOE_PARALLEL_MIN)
    for (int64_t ci = 0; ci < chunks; ci++) {
        uint32_t words[CHUNK];
        const int64_t i0 = ci * CHUNK, m = n - i0 < CHUNK ? n - i0 : CHUNK;
        /* cannot fail: the buffer is ours and not empty */
        (void) lowp_philox_fill(seed, base + (uint64_t) i0, words, (size_t) (m + 1) / 2 * 2);
        for (int64_t i = 0; i < m; i += 2) {
            const double u1 = ((double) words[i] + 0.5) / 4294967296.0; /* (0, 1) */
            const double angle = 6.283185307179586 * ((double) words[i + 1] / 4294967296.0);
            const double r = std * sqrt(-2.0 * log(u1));
            w[i0 + i] = (float) (r * cos(angle));
            if (i + 1 < m) w[i0 + i + 1] = (float) (r * sin(angle));
        }
    }
}

lowp_status model_params_init(model_params *p, uint64_t seed, int64_t extra, const char *fn) {
    int64_t data_floats = 0;
    for (int32_t i = 0; i < p->n; i++) data_floats += padded(lowp_param_numel(&p->params[i]));
    const size_t bytes = (size_t) (2 * data_floats + extra) * sizeof(float);
    p->arena = lowp_host_alloc(bytes);
    if (p->arena == NULL)
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: %zu bytes of parameters", fn, bytes);
    memset(p->arena, 0, bytes);
    int64_t off = 0;
    uint64_t word = 0; /* Philox words used so far */
    const int nthreads = lowp_thread_count(0);
    for (int32_t i = 0; i < p->n; i++) {
        lowp_param *q = &p->params[i];
        q->name = p->names[i];
        q->data = p->arena + off;
        q->grad = p->arena + data_floats + off;
        q->device = LOWP_DEVICE_HOST;
        const int64_t n = lowp_param_numel(q);
        if (p->init_std[i] < 0.0f)
            for (int64_t j = 0; j < n; j++) q->data[j] = 1.0f;
        else
            init_normal(q->data, n, p->init_std[i], seed, word, nthreads);
        word += (uint64_t) padded(n);
        off += padded(n);
    }
    p->extra = p->arena + 2 * data_floats;
    free(p->init_std);
    p->init_std = NULL;
    return LOWP_OK;
}

void model_params_free(model_params *p) {
    for (int32_t i = 0; p->params && i < p->n; i++) lowp_param_cache_free(&p->params[i]);
    free(p->arena);
    free(p->params);
    free(p->names);
    free(p->init_std);
    memset(p, 0, sizeof *p);
}

/* ---------------------------------------------------------------- activations and loss */

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
