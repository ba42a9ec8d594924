/* The optimizer side of trainer.h: the warm-up + cosine learning-rate schedule, AdamW with
 * FP32 moments, and global-norm gradient clipping. Element-wise updates and fixed-order
 * reductions: the results do not depend on the thread count. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "lowp/threads.h"
#include "train/train_internal.h"
#include "optim.h"

/* ---- AdamW's element-wise update ---- */

typedef struct adamw_coef {
    float b1, b2, c1, c2, eps, lr, wd;
} adamw_coef;

/* Elements per task of the parallel update (a multiple of 64 bytes of every array). */
#define ADAMW_SPAN 4096

/* A clone of the update for AVX-512 beside the baseline one, picked at load time where the
 * toolchain and the object format support it (GCC and Clang on x86-64 ELF): the loop is the
 * same element-wise IEEE sequence (no contraction in ISO C mode, correctly rounded division
 * and square root in every lane), so both clones give the bits of the scalar formula
 * (tests/c/test_trainer_units.c checks them); the AVX-512 one runs 16 lanes where the baseline
 * has 4. The file is built with -fno-math-errno (src/trainer/CMakeLists.txt) so that sqrtf can
 * vectorize: that only stops sqrtf from setting errno for negative inputs, which v * c2 >= 0
 * never is. */
#if defined(__x86_64__) && defined(__ELF__) && (defined(__GNUC__) || defined(__clang__)) &&        \
    !defined(LOWP_NO_CLONES)
#define ADAMW_CLONES __attribute__((target_clones("avx512f", "default")))
#else
#define ADAMW_CLONES
#endif

/* gs scales the gradient on the way (the clipping factor, 1 for none): the same rounded product
 * that scaling g in memory first would store. */
ADAMW_CLONES static void adamw_span(float *restrict w, float *restrict m, float *restrict v,
                                    const float *restrict g, int64_t len, const adamw_coef *k,
                                    float gs) {
    const float b1 = k->b1, b2 = k->b2, c1 = k->c1, c2 = k->c2, eps = k->eps, lr = k->lr,
                wd = k->wd;
#pragma omp simd
    for (int64_t j = 0; j < len; j++) {
        float gj = g[j] * gs;
        float mj = b1 * m[j] + (1.0f - b1) * gj;
        float vj = b2 * v[j] + (1.0f - b2) * (gj * gj);
        m[j] = mj;
        v[j] = vj;
        float upd = (mj * c1) / (sqrtf(vj * c2) + eps) + wd * w[j];
        w[j] = w[j] - lr * upd;
    }
}

/* ---- Schedule ---- */

lowp_status lowp_lr_at(const lowp_lr_schedule *s, int64_t step, float *lr) {
    const char *fn = "lowp_lr_at";
    LOWP_CHECK_PTR(fn, s);
    LOWP_CHECK_PTR(fn, lr);
    if (step < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: step (%lld) < 0", fn, (long long) step);
    if (s->warmup < 0 || s->steps < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: warmup (%d) and steps (%d) must be >= 0", fn,
                         (int) s->warmup, (int) s->steps);
    if (!(s->lr >= 0) || !(s->min_lr >= 0) || !isfinite(s->lr) || !isfinite(s->min_lr))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: lr (%g) and min_lr (%g) must be finite, >= 0",
                         fn, (double) s->lr, (double) s->min_lr);
    if (step < s->warmup) {
        *lr = (float) ((double) s->lr * (double) (step + 1) / (double) s->warmup);
        return LOWP_OK;
    }
    int64_t span = (int64_t) s->steps - s->warmup;
    double p = span > 0 ? (double) (step - s->warmup) / (double) span : 1.0;
    if (p >= 1.0) {
        *lr = s->min_lr;
        return LOWP_OK;
    }
    const double pi = 3.14159265358979323846;
    *lr = (float) (s->min_lr + 0.5 * (1.0 + cos(pi * p)) * ((double) s->lr - s->min_lr));
    return LOWP_OK;
}

/* ---- AdamW ---- */

struct lowp_adamw {
    lowp_adamw_cfg cfg;
    int32_t n;
    int64_t *count; /* [n] elements of each parameter */
    float **m, **v; /* [n] moments, into one arena */
    float *arena;
    int64_t t;
};

lowp_status lowp_adamw_cfg_init(lowp_adamw_cfg *cfg) {
    LOWP_CHECK_PTR("lowp_adamw_cfg_init", cfg);
    cfg->beta1 = 0.9f;
    cfg->beta2 = 0.95f;
    cfg->eps = 1e-8f;
    cfg->weight_decay = 0.1f;
    cfg->threads = 0;
    return LOWP_OK;
}

/* The parameters the optimizer and clipping update: an array (lowp_param_array_check), each
 * with data and grad and a shape that is not negative. */
static lowp_status check_trainable(const char *fn, const lowp_param *params, int32_t n) {
    lowp_status st = lowp_param_array_check(fn, params, n);
    if (st != LOWP_OK) return st;
    for (int32_t i = 0; i < n; i++) {
        const lowp_param *p = &params[i];
        if (!p->data || !p->grad || p->rows < 0 || p->cols < 0 || p->groups < 0)
            return lowp_fail(LOWP_ERR_INVALID_ARG,
                             "%s: params[%d] ('%s') has no data or grad, or a negative shape", fn,
                             (int) i, p->name ? p->name : "?");
    }
    return LOWP_OK;
}

lowp_status lowp_adamw_create(const lowp_param *params, int32_t n, const lowp_adamw_cfg *cfg,
                              lowp_adamw **out) {
    const char *fn = "lowp_adamw_create";
    LOWP_CHECK_PTR(fn, cfg);
    LOWP_CHECK_PTR(fn, out);
    *out = NULL;
    lowp_status st = check_trainable(fn, params, n);
    if (st != LOWP_OK) return st;
    if (!(cfg->beta1 >= 0 && cfg->beta1 < 1) || !(cfg->beta2 >= 0 && cfg->beta2 < 1))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: beta1 (%g) and beta2 (%g) must be in [0, 1)",
                         fn, (double) cfg->beta1, (double) cfg->beta2);
    if (!(cfg->eps > 0) || !(cfg->weight_decay >= 0) || !isfinite(cfg->eps) ||
        !isfinite(cfg->weight_decay))
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: eps (%g) must be > 0 and weight_decay (%g) >= 0, both finite", fn,
                         (double) cfg->eps, (double) cfg->weight_decay);
    lowp_adamw *o = calloc(1, sizeof *o);
    if (!o) return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    o->cfg = *cfg;
    o->n = n;
    size_t k = (size_t) (n > 0 ? n : 1);
    o->count = calloc(k, sizeof *o->count);
    o->m = calloc(k, sizeof *o->m);
    o->v = calloc(k, sizeof *o->v);
    int64_t total = 0;
    for (int32_t i = 0; i < n; i++) total += lowp_param_numel(&params[i]);
    o->arena = lowp_host_zalloc((size_t) (2 * total + 1) * sizeof(float));
    if (!o->count || !o->m || !o->v || !o->arena) {
        lowp_adamw_free(o);
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: no memory for %lld moments", fn,
                         (long long) (2 * total));
    }
    float *p = o->arena;
    for (int32_t i = 0; i < n; i++) {
        o->count[i] = lowp_param_numel(&params[i]);
        o->m[i] = p;
        o->v[i] = p + o->count[i];
        p += 2 * o->count[i];
    }
    *out = o;
    return LOWP_OK;
}

void lowp_adamw_free(lowp_adamw *o) {
    if (!o) return;
    free(o->count);
    free(o->m);
    free(o->v);
    free(o->arena);
    free(o);
}

/* The first of the work items (spans of `unit` elements, per parameter) of each parameter,
 * and their total: first[i] .. first[i + 1] - 1 are parameter i's. */
static int64_t *work_items(const int64_t *count, int32_t n, int64_t unit, int64_t *total) {
    int64_t *first = malloc((size_t) (n + 1) * sizeof *first);
    if (!first) return NULL;
    first[0] = 0;
    for (int32_t i = 0; i < n; i++) first[i + 1] = first[i] + (count[i] + unit - 1) / unit;
    *total = first[n];
    return first;
}

/* The parameter that work item s belongs to (first as work_items made it). */
static int32_t item_param(const int64_t *first, int32_t n, int64_t s) {
    int32_t lo = 0, hi = n; /* first[lo] <= s < first[hi] */
    while (hi - lo > 1) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (first[mid] <= s)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

int64_t lowp_param_span_count(const int64_t *count, int32_t n, int64_t unit) {
    int64_t total = 0;
    for (int32_t i = 0; i < n; i++) total += (count[i] + unit - 1) / unit;
    return total;
}

lowp_status lowp_param_spans(const int64_t *count, int32_t n, int64_t unit, int nt,
                             int64_t parallel_min, lowp_span_fn fn, void *ctx) {
    int64_t items, elems = 0;
    int64_t *first = work_items(count, n, unit, &items);
    if (!first) return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "parameter spans: out of memory");
    for (int32_t i = 0; i < n; i++) elems += count[i];
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1 && elems >= parallel_min)
    for (int64_t s = 0; s < items; s++) {
        const int32_t i = item_param(first, n, s);
        const int64_t j0 = (s - first[i]) * unit;
        fn(ctx, i, s, j0, count[i] - j0 < unit ? count[i] - j0 : unit);
    }
    free(first);
    return LOWP_OK;
}

int64_t *lowp_param_counts(const lowp_param *params, int32_t n) {
    int64_t *count = malloc((size_t) (n > 0 ? n : 1) * sizeof *count);
    if (count)
        for (int32_t i = 0; i < n; i++) count[i] = lowp_param_numel(&params[i]);
    return count;
}

/* Elements below which the update and the norm stay on the calling thread. */
#define OPTIM_PARALLEL_MIN 65536

typedef struct adamw_job {
    lowp_adamw *o;
    lowp_param *params;
    adamw_coef k;
    float gscale;
} adamw_job;

/* One span of the update (lowp_param_spans). */
static void adamw_item(void *ctx, int32_t i, int64_t item, int64_t j0, int64_t len) {
    (void) item;
    const adamw_job *b = ctx;
    const lowp_param *p = &b->params[i];
    adamw_coef ki = b->k;
    ki.wd = (p->rows > 1 || p->groups > 0) ? b->o->cfg.weight_decay : 0.0f;
    adamw_span(p->data + j0, b->o->m[i] + j0, b->o->v[i] + j0, p->grad + j0, len, &ki, b->gscale);
}

lowp_status lowp_adamw_step_scaled(lowp_adamw *o, lowp_param *params, int32_t n, float lr,
                                   float gscale) {
    const char *fn = "lowp_adamw_step";
    LOWP_CHECK_PTR(fn, o);
    lowp_status st = check_trainable(fn, params, n);
    if (st != LOWP_OK) return st;
    if (n != o->n)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: n (%d) != the optimizer's (%d)", fn, (int) n,
                         (int) o->n);
    for (int32_t i = 0; i < n; i++)
        if (lowp_param_numel(&params[i]) != o->count[i])
            return lowp_fail(LOWP_ERR_INVALID_ARG,
                             "%s: params[%d] ('%s') has %lld elements, the optimizer %lld", fn,
                             (int) i, params[i].name ? params[i].name : "?",
                             (long long) lowp_param_numel(&params[i]), (long long) o->count[i]);
    if (!(lr >= 0) || !isfinite(lr))
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: lr (%g) must be finite and >= 0", fn,
                         (double) lr);
    o->t++;
    const float b1 = o->cfg.beta1, b2 = o->cfg.beta2, eps = o->cfg.eps;
    /* The bias corrections in double, rounded once: the same on every run and thread. */
    const float c1 = (float) (1.0 / (1.0 - pow((double) b1, (double) o->t)));
    const float c2 = (float) (1.0 / (1.0 - pow((double) b2, (double) o->t)));
    adamw_job job = {o, params, {b1, b2, c1, c2, eps, lr, 0.0f}, gscale};
    /* Every parameter's spans in one parallel loop: one team start for the whole update
     * instead of one per parameter (each start wakes the sleeping threads). */
    st = lowp_param_spans(o->count, n, ADAMW_SPAN, (int) lowp_thread_count(o->cfg.threads),
                          OPTIM_PARALLEL_MIN, adamw_item, &job);
    if (st != LOWP_OK) o->t--; /* nothing was updated */
    return st;
}

lowp_status lowp_adamw_step(lowp_adamw *o, lowp_param *params, int32_t n, float lr) {
    return lowp_adamw_step_scaled(o, params, n, lr, 1.0f);
}

lowp_status lowp_adamw_moments(lowp_adamw *o, int32_t i, float **m, float **v, int64_t *count) {
    LOWP_CHECK_PTR("lowp_adamw_moments", o);
    if (i < 0 || i >= o->n)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_adamw_moments: i (%d) not in [0, %d)", (int) i,
                         (int) o->n);
    if (m) *m = o->m[i];
    if (v) *v = o->v[i];
    if (count) *count = o->count[i];
    return LOWP_OK;
}

lowp_status lowp_adamw_get_t(const lowp_adamw *o, int64_t *t) {
    LOWP_CHECK_PTR("lowp_adamw_get_t", o);
    LOWP_CHECK_PTR("lowp_adamw_get_t", t);
    *t = o->t;
    return LOWP_OK;
}

lowp_status lowp_adamw_set_t(lowp_adamw *o, int64_t t) {
    LOWP_CHECK_PTR("lowp_adamw_set_t", o);
    if (t < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_adamw_set_t: t (%lld) < 0", (long long) t);
    o->t = t;
    return LOWP_OK;
}

/* ---- Gradient clipping ---- */

/* Sums of squares over fixed chunks, then the chunks in order: the norm is the same whatever
 * the thread count. */
#define CLIP_CHUNK 16384

/* sum g[i]^2 over [0, n) in binary64 (every square is exact there), in 8 interleaved partial
 * sums added pairwise at the end: a fixed order, but not one serial chain of dependent adds,
 * which took 4 cycles an element (a tenth of `medium`'s optimizer phase). The partial sums are
 * the lanes of one vector in both clones (lane l adds the elements i = l mod 8 in order), so
 * they give the same bits; the baseline clone ran 2 lanes an operation (SSE2), at 2% of a
 * `medium` update. */
ADAMW_CLONES static double sum_squares(const float *g, int64_t n) {
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += (double) g[i + l] * (double) g[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += (double) g[i] * (double) g[i];
    for (int w = 4; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

typedef struct norm_job {
    lowp_param *params;
    double *part; /* [chunks] */
} norm_job;

static void norm_item(void *ctx, int32_t i, int64_t item, int64_t j0, int64_t len) {
    const norm_job *b = ctx;
    b->part[item] = sum_squares(b->params[i].grad + j0, len);
}

typedef struct scale_job {
    lowp_param *params;
    float factor;
} scale_job;

static void scale_item(void *ctx, int32_t i, int64_t item, int64_t j0, int64_t len) {
    (void) item;
    const scale_job *b = ctx;
    float *g = b->params[i].grad + j0;
    for (int64_t j = 0; j < len; j++) g[j] *= b->factor;
}

lowp_status lowp_grads_scale(lowp_param *params, int32_t n, float factor, int nt) {
    int64_t *count = lowp_param_counts(params, n);
    if (!count) return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "gradient scaling: out of memory");
    scale_job job = {params, factor};
    lowp_status st =
        lowp_param_spans(count, n, CLIP_CHUNK, nt, OPTIM_PARALLEL_MIN, scale_item, &job);
    free(count);
    return st;
}

lowp_status lowp_grad_norm_scale(lowp_param *params, int32_t n, float max_norm, float *norm,
                                 float *scale, int nt) {
    const char *fn = "lowp_grad_clip";
    lowp_status st = check_trainable(fn, params, n);
    if (st != LOWP_OK) return st;
    int64_t *count = lowp_param_counts(params, n);
    const int64_t chunks = count ? lowp_param_span_count(count, n, CLIP_CHUNK) : 0;
    double *part = count ? malloc((size_t) (chunks > 0 ? chunks : 1) * sizeof *part) : NULL;
    norm_job job = {params, part};
    /* Every parameter's chunks in one parallel loop; the partial sums then in order,
     * parameter by parameter and chunk by chunk. */
    st = part ? lowp_param_spans(count, n, CLIP_CHUNK, nt, OPTIM_PARALLEL_MIN, norm_item, &job)
              : lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    double total = 0.0;
    for (int64_t c = 0; st == LOWP_OK && c < chunks; c++) total += part[c];
    free(part);
    free(count);
    if (st != LOWP_OK) return st;
    const double nrm = sqrt(total);
    if (norm) *norm = (float) nrm;
    *scale = 1.0f;
    if (max_norm > 0 && isfinite(nrm) && nrm > (double) max_norm)
        *scale = (float) ((double) max_norm / nrm);
    return LOWP_OK;
}

lowp_status lowp_grad_clip(lowp_param *params, int32_t n, float max_norm, float *norm) {
    /* No thread setting in this entry point: every core (lowp/threads.h, threads == 0). */
    const int nt = (int) lowp_thread_count(0);
    float scale;
    lowp_status st = lowp_grad_norm_scale(params, n, max_norm, norm, &scale, nt);
    if (st != LOWP_OK || scale == 1.0f) return st;
    return lowp_grads_scale(params, n, scale, nt);
}
