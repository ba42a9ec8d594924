/* Linear and grouped-linear (MoE experts) layers, forward and backward, in the low-precision
 * formats of a wrapped weight's configuration, or in BF16 for a plain weight.
 *
 * The three GEMMs of a layer, K-major (C = A . B^T) but for the dgrad of most weights:
 *   forward  Y  = X W^T    a = X rowwise [M, K]          b = W rowwise [N, K]
 *   dgrad    dX = dY W     a = dY rowwise [M, N]         b = W columnwise copy [K, N], or, where
 *                                                        that copy would be the transpose of
 *                                                        the forward's (plain weights, tensor
 *                                                        and tile scales), the forward's copy
 *                                                        read as stored (lowp_gemm_kn)
 *   wgrad    dW = dY^T X   a = dY columnwise copy [N, M] b = X columnwise copy [K, M]
 * A GEMM runs quantized when both of its operands' specs are quantized (and, for the wgrad,
 * wgrad_hp is off); otherwise both operands are rounded to BF16 from high precision. The
 * gradients are straight-through: dX and dW come from the quantized operands and dW is added
 * to the FP32 master gradient.
 *
 * A wrapped weight's copies (forward and dgrad operands, every expert) are made in one pass per
 * parameter version and cached in its wrap, so micro-batches and recomputed forwards reuse
 * them; a plain weight is rounded to BF16 on every call, or, with opts.cache_plain, once per
 * version into param->plain_cache (or, with opts.fp32_plain, multiplied in F32: the float
 * references of gradient checks). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "lowp/threads.h"
#include "core/profile_internal.h"
#include "cpu/host.h"
#include "ops/ops_internal.h"
#include "train_internal.h"

/* A GEMM operand: quantized per its spec, or high precision (BF16, or F32 for fp32_plain). */
enum copy_kind { COPY_Q = 1, COPY_BF16 = 2, COPY_F32 = 3 };

/* What the configuration asks of this call. */
typedef struct plan {
    lowp_linear_cfg cfg; /* the wrap's, or the bf16 preset for a plain weight */
    lowp_fp8_state *fp8; /* NULL when no operand is delayed */
    int fwd_q, dgrad_q, wgrad_q;
    int dgrad_kn;    /* the dgrad reads the forward copy (lowp_gemm_kn): no second copy */
    int hp;          /* the kind of the GEMMs that are not quantized: COPY_BF16 or COPY_F32 */
    int cache_plain; /* a plain weight keeps its BF16 copies in param->plain_cache */
} plan;

static void plan_of(const lowp_param *w, const lowp_linear_opts *opts, plan *p) {
    memset(p, 0, sizeof *p);
    p->hp = COPY_BF16;
    if (w->wrap) {
        p->cfg = w->wrap->cfg;
        p->fp8 = w->wrap->fp8;
    } else {
        lowp_linear_cfg_preset("bf16", &p->cfg);
        if (opts && opts->fp32_plain) p->hp = COPY_F32;
        p->cache_plain = opts && opts->cache_plain && p->hp == COPY_BF16;
    }
    lowp_linear_plan lp; /* the rule, in recipe.c */
    lowp_linear_plan_get(&p->cfg, &lp);
    p->fwd_q = lp.gemm[LOWP_LINEAR_FORWARD].quantized;
    p->dgrad_q = lp.gemm[LOWP_LINEAR_DGRAD].quantized;
    p->wgrad_q = lp.gemm[LOWP_LINEAR_WGRAD].quantized;
    p->dgrad_kn = lp.gemm[LOWP_LINEAR_DGRAD].b_kn;
}

/* The delayed scale of a role, or NULL when the role is current-scaled. */
static const float *delayed_scale(const plan *p, const lowp_operand_spec *s, lowp_role role) {
    return p->fp8 && lowp_spec_delayed(s) ? &p->fp8->roles[role].scale : NULL;
}

/* ---- Random bits: stochastic rounding and the Hadamard signs ---- */

/* Where a stochastically rounded copy takes its Philox words (NULL: RNE). */
typedef struct sr_draw {
    uint64_t seed, offset;
} sr_draw;

/* (seed, offset) of the named state of opts->rng, whose offset then moves on by `words`. */
static lowp_status rng_take(const char *fn, const lowp_linear_opts *opts, const char *state,
                            const char *why, uint64_t words, sr_draw *out) {
    lowp_rng_tracker *t = opts ? opts->rng : NULL;
    if (!t)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: opts.rng is NULL, but %s draws from its state \"%s\"", fn, why,
                         state);
    for (int32_t i = 0; i < t->count && i < LOWP_RNG_MAX_STATES; i++)
        if (strncmp(t->states[i].name, state, LOWP_RNG_NAME_MAX) == 0) {
            out->seed = t->states[i].seed;
            out->offset = t->states[i].offset;
            t->states[i].offset += words;
            return LOWP_OK;
        }
    return lowp_fail(LOWP_ERR_INVALID_ARG,
                     "%s: opts.rng has no state \"%s\" (lowp_rng_tracker_add), which %s draws from",
                     fn, state, why);
}

/* The draw of `copies` quantized copies of a [rows, cols] operand with spec s: *sr points at d
 * when s rounds stochastically (words rows * cols per copy), else NULL. */
static lowp_status sr_take(const char *fn, const lowp_linear_opts *opts, const lowp_operand_spec *s,
                           const char *role, int64_t rows, int64_t cols, int copies, sr_draw *d,
                           const sr_draw **sr) {
    *sr = NULL;
    if (s->rounding != LOWP_ROUNDING_SR || copies == 0 || rows * cols == 0) return LOWP_OK;
    char why[64];
    snprintf(why, sizeof why, "cfg.%s.rounding (sr)", role);
    lowp_status st = rng_take(fn, opts, "stochastic_rounding", why,
                              (uint64_t) copies * (uint64_t) (rows * cols), d);
    if (st == LOWP_OK) *sr = d;
    return st;
}

/* ---- Owned operand buffers ---- */

/* Set up q as a copy of kind `kind` ([rows, cols], quantized per s or BF16) and allocate its
 * buffers. A quantized columnwise copy of a grouped layer gets the groups (offs) when its
 * blocks run along the tokens. */
static lowp_status qt_alloc(const char *fn, lowp_qtensor *q, const lowp_operand_spec *s, int kind,
                            int64_t rows, int64_t cols, const int32_t *offs, int32_t groups) {
    memset(q, 0, sizeof *q);
    q->rows = rows;
    q->cols = cols;
    q->device = LOWP_DEVICE_HOST;
    if (kind == COPY_Q) {
        q->format = s->format;
        q->scaling = s->scaling;
        if (offs && (s->scaling == LOWP_SCALING_MX32 || s->scaling == LOWP_SCALING_BLOCK128 ||
                     s->scaling == LOWP_SCALING_NV16)) {
            q->group_offs = offs;
            q->groups = groups;
        }
    } else {
        q->format = kind == COPY_F32 ? LOWP_FORMAT_F32 : LOWP_FORMAT_BF16;
        q->scaling = LOWP_SCALING_NONE;
    }
    size_t db, sb;
    lowp_status st = lowp_qtensor_nbytes(q, &db, &sb);
    if (st != LOWP_OK) return st;
    q->data = lowp_host_alloc(db);
    q->scales = sb ? lowp_host_alloc(sb) : NULL;
    if (!q->data || (sb && !q->scales)) {
        free(q->data);
        free(q->scales);
        q->data = q->scales = NULL;
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: %zu + %zu bytes for a %lld x %lld operand",
                         fn, db, sb, (long long) rows, (long long) cols);
    }
    return LOWP_OK;
}

/* Releases a qt_alloc copy; its blocks go to the cache of released host blocks (most copies
 * live for one update, and the next update allocates the same sizes again). */
static void qt_free(lowp_qtensor *q) {
    lowp_host_free(q->data);
    lowp_host_free(q->scales);
    q->data = q->scales = NULL;
}

/* dst [cols, rows] = src [rows, cols]^T for 2- or 4-byte elements, in 32x32 tiles: a tile is
 * read row by row into a local buffer, then written one whole destination run (up to 64 or
 * 128 bytes) at a time. Writing element by element down a column touched 32 lines per tile
 * at a stride of `rows` elements, which at rows = 2048 (a 4 KiB stride) all map to one L1 set:
 * the BF16 recipe's transposes took a quarter of an update. Row tiles run on the threads. */
#define TR_TILE 32
static void transpose_tile(const char *src, int64_t rows, int64_t cols, size_t es, int64_t r0,
                           int64_t c0, char *dst) {
    const int64_t nr = rows - r0 < TR_TILE ? rows - r0 : TR_TILE;
    const int64_t nc = cols - c0 < TR_TILE ? cols - c0 : TR_TILE;
    uint32_t t[TR_TILE][TR_TILE], line[TR_TILE];
    for (int64_t r = 0; r < nr; r++) {
        const char *sr = src + ((size_t) (r0 + r) * (size_t) cols + (size_t) c0) * es;
        if (es == 2)
            for (int64_t c = 0; c < nc; c++) t[r][c] = ((const uint16_t *) sr)[c];
        else
            memcpy(t[r], sr, (size_t) nc * 4);
    }
    for (int64_t c = 0; c < nc; c++) {
        char *dc = dst + ((size_t) (c0 + c) * (size_t) rows + (size_t) r0) * es;
        if (es == 2) {
            uint16_t l16[TR_TILE];
            for (int64_t r = 0; r < nr; r++) l16[r] = (uint16_t) t[r][c];
            memcpy(dc, l16, (size_t) nr * 2);
        } else {
            for (int64_t r = 0; r < nr; r++) line[r] = t[r][c];
            memcpy(dc, line, (size_t) nr * 4);
        }
    }
}

/* Where the CPU has AVX-512, bands of TR_TILE rows go through its register transposes
 * (src/cpu, the same bits): `nanogpt` bf16 spent a tenth of an update in transpose_tile. */
static void transpose_es(const void *src, int64_t rows, int64_t cols, size_t es, void *dst,
                         int32_t threads) {
    const int64_t tiles = (rows + TR_TILE - 1) / TR_TILE;
    const int nt = (int) lowp_thread_count(threads);
    const int fast = lowp_cpu_has_avx512();
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && rows * cols >= 65536)
    for (int64_t i = 0; i < tiles; i++) {
        const int64_t r0 = i * TR_TILE, nr = rows - r0 < TR_TILE ? rows - r0 : TR_TILE;
        if (fast && es == 4)
            lowp_cpu_transpose_f32_avx512((const float *) src + r0 * cols, nr, cols, cols,
                                          (float *) dst + r0, rows);
        else if (fast)
            lowp_cpu_transpose_u16_avx512((const uint16_t *) src + r0 * cols, nr, cols, cols,
                                          (uint16_t *) dst + r0, rows);
        else
            for (int64_t c0 = 0; c0 < cols; c0 += TR_TILE)
                transpose_tile(src, rows, cols, es, r0, c0, dst);
    }
}

static void transpose_u16(const uint16_t *src, int64_t rows, int64_t cols, uint16_t *dst,
                          int32_t threads) {
    transpose_es(src, rows, cols, 2, dst, threads);
}

static void transpose_f32(const float *src, int64_t rows, int64_t cols, float *dst,
                          int32_t threads) {
    transpose_es(src, rows, cols, 4, dst, threads);
}

/* Both BF16 copies of x [rows, cols] (row [rows, cols], col [cols, rows]) from one read, in
 * bands of TR_TILE rows: the bits of lowp_cast and transpose_u16 (AVX-512 only). */
static void bf16_dual(const float *x, int64_t rows, int64_t cols, uint16_t *row, uint16_t *col,
                      int32_t threads) {
    const int64_t tiles = (rows + TR_TILE - 1) / TR_TILE;
    const int nt = (int) lowp_thread_count(threads);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && rows * cols >= 65536)
    for (int64_t i = 0; i < tiles; i++) {
        const int64_t r0 = i * TR_TILE, nr = rows - r0 < TR_TILE ? rows - r0 : TR_TILE;
        lowp_cpu_bf16_dual_avx512(x + r0 * cols, nr, cols, cols, row + r0 * cols, cols, col + r0,
                                  rows);
    }
}

/* Fill copies of x [R, C] from one read where the kernels allow: `row` ([R, C]) and `col`
 * ([C, R]), either NULL, each already set up by qt_alloc (quantized per s, or BF16). `scale`:
 * the delayed scale for a TENSOR spec (NULL: current scaling). `amax` (may be NULL) receives
 * the amax of x, for the delayed-scaling history. */
static lowp_status fill_copies_raw(const char *fn, const lowp_tensor *x, const lowp_operand_spec *s,
                                   lowp_qtensor *row, lowp_qtensor *col, const float *scale,
                                   float *amax, int32_t threads, const sr_draw *sr) {
    lowp_qtensor *rq = row && row->scaling != LOWP_SCALING_NONE ? row : NULL;
    lowp_qtensor *cq = col && col->scaling != LOWP_SCALING_NONE ? col : NULL;
    lowp_qtensor *rb = row && row->scaling == LOWP_SCALING_NONE ? row : NULL;
    lowp_qtensor *cb = col && col->scaling == LOWP_SCALING_NONE ? col : NULL;
    lowp_quant_cfg qc;
    lowp_quant_cfg_init(&qc);
    qc.scale_mode = s->scale_mode;
    qc.pow2_scales = s->pow2_scales;
    qc.threads = threads;
    qc.scale = scale;
    qc.amax_out = amax;
    if (sr) qc.rounding = LOWP_ROUNDING_SR, qc.seed = sr->seed, qc.offset = sr->offset;
    lowp_status st = LOWP_OK;
    int have_amax = 0;
    if (cq && cq->group_offs) { /* experts' inputs, dual-axis where rq is set: one read */
        st = lowp_quantize_grouped(x, rq, cq, &qc);
        have_amax = 1;
    } else if (rq || cq) {
        st = lowp_quantize(x, rq, cq, &qc); /* dual-axis when both: one read of x */
        have_amax = 1;
    }
    if (st == LOWP_OK && amax && !have_amax) st = lowp_amax(x, LOWP_SCALING_TENSOR, amax, 1);
    if (st != LOWP_OK || (!rb && !cb)) return st;
    const lowp_qtensor *hp = rb ? rb : cb;
    if (hp->format == LOWP_FORMAT_F32) {
        if (rb) memcpy(rb->data, x->data, (size_t) (x->rows * x->cols) * sizeof(float));
        if (cb) transpose_f32(x->data, x->rows, x->cols, cb->data, threads);
        return LOWP_OK;
    }
    if (rb && cb && lowp_cpu_has_avx512()) { /* 1.4-2.3x the cast and transpose below */
        bf16_dual(x->data, x->rows, x->cols, rb->data, cb->data, threads);
        return LOWP_OK;
    }
    uint16_t *b16 = rb ? rb->data : malloc((size_t) (x->rows * x->cols) * 2 + 1);
    if (!b16)
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: BF16 copy of %lld x %lld", fn,
                         (long long) x->rows, (long long) x->cols);
    lowp_cast_cfg cc;
    lowp_cast_cfg_init(&cc);
    cc.threads = threads;
    lowp_tensor t = {LOWP_FORMAT_BF16, x->rows, x->cols, b16, LOWP_DEVICE_HOST};
    st = lowp_cast(x, &t, &cc);
    if (st == LOWP_OK && cb) transpose_u16(b16, x->rows, x->cols, cb->data, threads);
    if (!rb) free(b16);
    return st;
}

/* With sr (quantized copies only): the row copy takes words [offset, offset + R*C), then the col
 * copy the next R*C, in two calls (one dual call would give both copies the same words). */
static lowp_status fill_copies(const char *fn, const lowp_tensor *x, const lowp_operand_spec *s,
                               lowp_qtensor *row, lowp_qtensor *col, const float *scale,
                               float *amax, int32_t threads, const sr_draw *sr) {
    lowp_prof_push(LOWP_PHASE_QUANT);
    lowp_status st;
    if (sr && row && col) {
        const sr_draw second = {sr->seed, sr->offset + (uint64_t) (x->rows * x->cols)};
        st = fill_copies_raw(fn, x, s, row, NULL, scale, amax, threads, sr);
        if (st == LOWP_OK) st = fill_copies_raw(fn, x, s, NULL, col, scale, NULL, threads, &second);
    } else {
        st = fill_copies_raw(fn, x, s, row, col, scale, amax, threads, sr);
    }
    lowp_prof_pop();
    return st;
}

/* Which GEMM: C = A . B^T (lowp_gemm, lowp_grouped_gemm split-M), the split-K weight gradient,
 * or either with B as stored (cfg.b_layout KN). */
enum gemm_kind { GEMM_NT = 0, GEMM_WGRAD = 1, GEMM_KN = 2, GEMM_WGRAD_KN = 3 };

/* The GEMMs of the layers, timed as one phase: gc with the kind's layout and split. */
static lowp_status gemm_timed(const lowp_qtensor *a, const lowp_qtensor *b, const int32_t *offs,
                              int32_t G, int kind, lowp_tensor *c, const lowp_gemm_cfg *gc) {
    lowp_gemm_cfg cfg = *gc;
    cfg.b_layout = kind == GEMM_KN || kind == GEMM_WGRAD_KN ? LOWP_LAYOUT_KN : LOWP_LAYOUT_NK;
    cfg.split = offs && (kind == GEMM_WGRAD || kind == GEMM_WGRAD_KN) ? LOWP_GROUPED_SPLIT_K
                                                                      : LOWP_GROUPED_SPLIT_M;
    lowp_prof_push(LOWP_PHASE_GEMM);
    lowp_status st = offs ? lowp_grouped_gemm(a, b, offs, G, c, &cfg) : lowp_gemm(a, b, c, &cfg);
    lowp_prof_pop();
    return st;
}

/* ---- The weight's copies ---- */

struct lowp_weight_cache {
    uint64_t version; /* the param version the copies were made from */
    int valid;
    int32_t groups;     /* G; 1 for a plain matrix */
    int64_t rows, cols; /* N, K of each expert */
    lowp_qtensor *fwd;  /* [G] forward operands b: W_g [N, K] (NULL buffers: not made) */
    lowp_qtensor *dgr;  /* [G] dgrad operands b: W_g^T [K, N], the columnwise copies (not made
                         * when the dgrad reads fwd: plan.dgrad_kn) */
};

void lowp_weight_cache_free(struct lowp_weight_cache *c) {
    if (!c) return;
    for (int32_t g = 0; g < c->groups; g++) {
        if (c->fwd) qt_free(&c->fwd[g]);
        if (c->dgr) qt_free(&c->dgr[g]);
    }
    free(c->fwd);
    free(c->dgr);
    free(c);
}

static lowp_status cache_new(const char *fn, const lowp_param *w, const plan *p, int want_fwd,
                             int want_dgr, struct lowp_weight_cache **out) {
    const int32_t G = w->groups > 0 ? w->groups : 1;
    struct lowp_weight_cache *c = calloc(1, sizeof *c);
    if (c) {
        c->groups = G;
        c->rows = w->rows;
        c->cols = w->cols;
        c->fwd = calloc((size_t) G, sizeof *c->fwd);
        c->dgr = calloc((size_t) G, sizeof *c->dgr);
    }
    if (!c || !c->fwd || !c->dgr) {
        lowp_weight_cache_free(c);
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: weight cache of \"%s\"", fn, w->name);
    }
    lowp_status st = LOWP_OK;
    for (int32_t g = 0; g < G && st == LOWP_OK; g++) {
        if (want_fwd)
            st = qt_alloc(fn, &c->fwd[g], &p->cfg.weight, p->fwd_q ? COPY_Q : p->hp, w->rows,
                          w->cols, NULL, 0);
        if (want_dgr && st == LOWP_OK)
            st = qt_alloc(fn, &c->dgr[g], &p->cfg.weight, p->dgrad_q ? COPY_Q : p->hp, w->cols,
                          w->rows, NULL, 0);
    }
    if (st != LOWP_OK) {
        lowp_weight_cache_free(c);
        return st;
    }
    *out = c;
    return LOWP_OK;
}

/* cache_fill_raw for experts (G > 1) on nt > 1 threads: the experts' copies side by side,
 * each on one thread, in one parallel loop (an expert's copies are the same bits on any
 * thread count; one team start instead of one or two per expert). The amaxes are recorded in
 * expert order afterwards, as the serial loop does. */
static lowp_status cache_fill_experts(const char *fn, const lowp_param *w, const plan *p,
                                      struct lowp_weight_cache *c, const float *scale, int32_t nt) {
    const int64_t N = w->rows, K = w->cols;
    const int32_t G = c->groups;
    lowp_status *sts = malloc((size_t) G * sizeof *sts);
    float *amax = calloc((size_t) G, sizeof *amax);
    if (!sts || !amax) {
        free(sts);
        free(amax);
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: copies of \"%s\"", fn, w->name);
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int32_t g = 0; g < G; g++) {
        lowp_tensor src = {LOWP_FORMAT_F32, N, K, w->data + (size_t) g * (size_t) (N * K),
                           LOWP_DEVICE_HOST};
        sts[g] = fill_copies_raw(fn, &src, &p->cfg.weight, c->fwd[g].data ? &c->fwd[g] : NULL,
                                 c->dgr[g].data ? &c->dgr[g] : NULL, scale, scale ? &amax[g] : NULL,
                                 1, NULL);
    }
    lowp_status st = LOWP_OK;
    for (int32_t g = 0; g < G && st == LOWP_OK; g++) {
        if (sts[g] != LOWP_OK) /* the message stayed on the thread that failed */
            st = lowp_fail(sts[g], "%s: the copies of expert %d of \"%s\" failed", fn, (int) g,
                           w->name);
        else if (scale)
            st = lowp_fp8_state_record(p->fp8, LOWP_ROLE_WEIGHT, amax[g]);
    }
    free(sts);
    free(amax);
    return st;
}

/* Make every copy the cache holds from the master weights, expert by expert. With MXFP4 fake
 * quantization the weight first goes through MXFP4 and back (straight-through: the gradient
 * still reaches the FP32 master). The weight's amax is recorded here, once per version. */
static lowp_status cache_fill_raw(const char *fn, const lowp_param *w, const plan *p,
                                  struct lowp_weight_cache *c, int32_t threads) {
    const int64_t N = w->rows, K = w->cols;
    const lowp_operand_spec *ws = &p->cfg.weight;
    const float *scale = delayed_scale(p, ws, LOWP_ROLE_WEIGHT);
    lowp_status st = LOWP_OK;
    float *fq = NULL;
    lowp_qtensor fp4;
    memset(&fp4, 0, sizeof fp4);
    if (p->cfg.fake_quant_mxfp4) {
        const lowp_operand_spec mxfp4 = {
            LOWP_FORMAT_E2M1, LOWP_SCALING_MX32, LOWP_SCALE_DEFAULT, -1, 0, LOWP_ROUNDING_RNE};
        fq = malloc((size_t) (N * K) * sizeof *fq);
        if (!fq) return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: fake-quantized weight", fn);
        if ((st = qt_alloc(fn, &fp4, &mxfp4, COPY_Q, N, K, NULL, 0)) != LOWP_OK) {
            free(fq);
            return st;
        }
    }
    const int32_t nt = lowp_thread_count(threads);
    if (!fq && c->groups > 1 && nt > 1) return cache_fill_experts(fn, w, p, c, scale, nt);
    for (int32_t g = 0; g < c->groups && st == LOWP_OK; g++) {
        lowp_tensor src = {LOWP_FORMAT_F32, N, K, w->data + (size_t) g * (size_t) (N * K),
                           LOWP_DEVICE_HOST};
        if (fq) {
            lowp_quant_cfg qc;
            lowp_quant_cfg_init(&qc);
            qc.threads = threads;
            lowp_tensor deq = {LOWP_FORMAT_F32, N, K, fq, LOWP_DEVICE_HOST};
            if ((st = lowp_quantize(&src, &fp4, NULL, &qc)) != LOWP_OK) break;
            /* Both host buffers, just quantized: the CPU decode, on the caller's threads. */
            if ((st = lowp_cpu_dequantize(&fp4, &deq, threads)) != LOWP_OK) break;
            src.data = fq;
        }
        float amax = 0.0f;
        st = fill_copies(fn, &src, ws, c->fwd[g].data ? &c->fwd[g] : NULL,
                         c->dgr[g].data ? &c->dgr[g] : NULL, scale, scale ? &amax : NULL, threads,
                         NULL);
        if (st == LOWP_OK && scale) st = lowp_fp8_state_record(p->fp8, LOWP_ROLE_WEIGHT, amax);
    }
    free(fq);
    qt_free(&fp4);
    return st;
}

static lowp_status cache_fill(const char *fn, const lowp_param *w, const plan *p,
                              struct lowp_weight_cache *c, int32_t threads) {
    lowp_prof_push(LOWP_PHASE_QUANT);
    lowp_status st = cache_fill_raw(fn, w, p, c, threads);
    lowp_prof_pop();
    return st;
}

/* *slot made current for w's version: both orientations at once, one read of the master
 * weights per version, whichever GEMM comes first. stats (may be NULL) counts the remakes. */
static lowp_status cached_copies(const char *fn, const lowp_param *w, const plan *p,
                                 struct lowp_weight_cache **slot, int32_t threads,
                                 lowp_wrap_stats *stats) {
    lowp_status st;
    if (*slot && ((*slot)->groups != (w->groups > 0 ? w->groups : 1) || (*slot)->rows != w->rows ||
                  (*slot)->cols != w->cols)) {
        lowp_weight_cache_free(*slot); /* the caller changed the shape: start over */
        *slot = NULL;
    }
    if (!*slot && (st = cache_new(fn, w, p, 1, !p->dgrad_kn, slot)) != LOWP_OK) return st;
    struct lowp_weight_cache *c = *slot;
    if (!c->valid || c->version != w->version) {
        c->valid = 0;
        if ((st = cache_fill(fn, w, p, c, threads)) != LOWP_OK) return st;
        c->valid = 1;
        c->version = w->version;
        if (stats) stats->weight_quantizations++;
    }
    return LOWP_OK;
}

void lowp_param_cache_free(lowp_param *w) {
    if (!w) return;
    lowp_weight_cache_free(w->plain_cache);
    w->plain_cache = NULL;
}

/* The weight's operands for this call: a wrapped weight's cache (remade when the parameter's
 * version moved on), or, for a plain weight, fresh BF16 (or F32) copies that the caller frees
 * (*owned set). */
static lowp_status weight_operands(const char *fn, lowp_param *w, const plan *p, int want_fwd,
                                   int want_dgr, int32_t threads, struct lowp_weight_cache **out,
                                   int *owned) {
    lowp_status st;
    *owned = 0;
    if (!w->wrap && p->cache_plain) {
        /* Kept in the parameter, per version, as a wrapped weight's quantized copies are. */
        if ((st = cached_copies(fn, w, p, &w->plain_cache, threads, NULL)) != LOWP_OK) return st;
        *out = w->plain_cache;
        return LOWP_OK;
    }
    if (!w->wrap) {
        const int fwd = want_fwd || (want_dgr && p->dgrad_kn), dgr = want_dgr && !p->dgrad_kn;
        if ((st = cache_new(fn, w, p, fwd, dgr, out)) != LOWP_OK) return st;
        if ((st = cache_fill(fn, w, p, *out, threads)) != LOWP_OK) {
            lowp_weight_cache_free(*out);
            return st;
        }
        *owned = 1;
        return LOWP_OK;
    }
    struct lowp_wrap *wr = w->wrap;
    if ((st = cached_copies(fn, w, p, &wr->cache, threads, &wr->stats)) != LOWP_OK) return st;
    *out = wr->cache;
    return LOWP_OK;
}

/* ---- Argument checks ---- */

static lowp_status check_param(const char *fn, const lowp_param *w, int grouped) {
    LOWP_CHECK_PTR(fn, w);
    const char *name = w->name ? w->name : "?";
    if (grouped && w->groups < 1)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: w (\"%s\").groups (%d) < 1 (a single matrix goes to %s)", fn, name,
                         w->groups, "lowp_linear_forward/backward");
    if (!grouped && w->groups != 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: w (\"%s\").groups (%d) != 0 (experts go to %s)",
                         fn, name, w->groups, "lowp_grouped_linear_forward/backward");
    if (w->rows <= 0 || w->cols <= 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: w (\"%s\") shape (%lld x %lld) must be positive", fn, name,
                         (long long) w->rows, (long long) w->cols);
    if (!w->data) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: w (\"%s\").data is NULL", fn, name);
    return LOWP_OK;
}

/* An F32 host tensor of shape [rows, cols]. */
static lowp_status check_tensor(const char *fn, const char *arg, const lowp_tensor *t, int64_t rows,
                                int64_t cols) {
    if (!t) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s is NULL", fn, arg);
    if (t->format != LOWP_FORMAT_F32)
        return lowp_fail(LOWP_ERR_UNSUPPORTED, "%s: %s.format (%d) is not f32", fn, arg,
                         (int) t->format);
    if (t->device.type != LOWP_DEVICE_CPU)
        return lowp_fail(LOWP_ERR_UNSUPPORTED, "%s: %s.device (%d:%d) is not the host", fn, arg,
                         t->device.type, t->device.index);
    if (t->rows < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s.rows (%lld) < 0", fn, arg,
                         (long long) t->rows);
    if (t->rows != rows || t->cols != cols)
        return lowp_fail(
            LOWP_ERR_INVALID_ARG, "%s: %s shape (%lld x %lld) != expected (%lld x %lld)", fn, arg,
            (long long) t->rows, (long long) t->cols, (long long) rows, (long long) cols);
    if (rows > 0 && !t->data)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: %s.data is NULL", fn, arg);
    return LOWP_OK;
}

static lowp_status check_opts(const char *fn, const lowp_linear_opts *o) {
    if (!o) return LOWP_OK;
    if (o->recompute != 0 && o->recompute != 1)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: opts.recompute (%d) is not 0 or 1", fn,
                         o->recompute);
    if (o->threads < 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: opts.threads (%d) < 0", fn, o->threads);
    if (o->fp32_plain != 0 && o->fp32_plain != 1)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: opts.fp32_plain (%d) is not 0 or 1", fn,
                         o->fp32_plain);
    if (o->cache_plain != 0 && o->cache_plain != 1)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: opts.cache_plain (%d) is not 0 or 1", fn,
                         o->cache_plain);
    if (o->reuse_input != 0 && o->reuse_input != 1)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: opts.reuse_input (%d) is not 0 or 1", fn,
                         o->reuse_input);
    return LOWP_OK;
}

/* ---- X's copies, shared ---- */

/* A copy of X that several holders keep (the saved state of each forward that read it, and the
 * input memo): freed with the last reference, whichever thread drops it (a backward may run on
 * another thread than its forward). `offs` is its own copy of the groups. */
typedef struct shared_copy {
    atomic_int refs;
    lowp_qtensor q;
    int32_t *offs;
} shared_copy;

static shared_copy *sc_ref(shared_copy *c) {
    if (c) atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
    return c;
}

static void sc_release(shared_copy *c) {
    if (!c || atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) > 1) return;
    qt_free(&c->q);
    free(c->offs);
    free(c);
}

/* A new copy of X for spec s and kind, one reference; attach: its groups are offs (a copy
 * along the tokens), else offs is kept only to recognize x's groups. */
static lowp_status sc_alloc(const char *fn, const lowp_operand_spec *s, int kind, int64_t rows,
                            int64_t cols, const int32_t *offs, int32_t groups, int attach,
                            shared_copy **out) {
    shared_copy *c = calloc(1, sizeof *c);
    if (c && offs) c->offs = malloc((size_t) groups * sizeof *offs);
    if (!c || (offs && !c->offs)) {
        free(c);
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: X copy", fn);
    }
    if (offs) memcpy(c->offs, offs, (size_t) groups * sizeof *offs);
    atomic_init(&c->refs, 1);
    lowp_status st =
        qt_alloc(fn, &c->q, s, kind, rows, cols, attach ? c->offs : NULL, attach ? groups : 0);
    if (st != LOWP_OK) {
        free(c->offs);
        free(c);
        return st;
    }
    *out = c;
    return LOWP_OK;
}

/* The last forward input's copies on this thread, for a forward whose caller says (opts
 * reuse_input) that x is that input again: the q, k and v projections of one h, the w1 and w3
 * of a SwiGLU. Reused when x's address, shape, groups, the input spec and the copy kinds match
 * (and the spec is not delayed: each weight's delayed input scale is its own); dropped by the
 * next forward that makes copies of its own and by every backward. */
static _Thread_local struct input_memo {
    const void *data;
    int64_t rows, cols, T;
    int32_t groups;
    lowp_operand_spec spec;
    int kind;
    shared_copy *row, *col; /* col: NULL when the forward that made them kept none */
} t_memo;

static void memo_clear(void) {
    sc_release(t_memo.row);
    sc_release(t_memo.col);
    memset(&t_memo, 0, sizeof t_memo);
}

static int spec_equal(const lowp_operand_spec *a, const lowp_operand_spec *b) {
    return a->format == b->format && a->scaling == b->scaling && a->scale_mode == b->scale_mode &&
           a->pow2_scales == b->pow2_scales && a->delayed == b->delayed;
}

/* ---- Forward ---- */

struct lowp_linear_saved {
    const lowp_param *param; /* the forward's weight, and its wrap then */
    const struct lowp_wrap *wrap;
    int grouped;
    int64_t rows, cols; /* x's shape */
    int32_t groups;
    int32_t *offs;      /* grouped: the forward's offs (the X copy's groups point here) */
    shared_copy *xcol;  /* keep_quantized: X's columnwise copy [K, T], quantized (or NULL) */
    shared_copy *xbf16; /* both X GEMMs in BF16: the forward's row copy [T, K], which the
                           backward reads instead of rounding x again (the same bits) */
};

void lowp_linear_saved_free(lowp_linear_saved *s) {
    if (!s) return;
    sc_release(s->xcol);
    sc_release(s->xbf16);
    free(s->offs);
    free(s);
}

static void zero_rows(const lowp_tensor *t, int64_t from) {
    if (t->rows > from)
        memset((float *) t->data + from * t->cols, 0,
               (size_t) ((t->rows - from) * t->cols) * sizeof(float));
}

static lowp_status forward(const char *fn, int grouped, lowp_param *w, const float *bias,
                           const lowp_tensor *x, const int32_t *offs, lowp_tensor *y,
                           const lowp_linear_opts *opts, lowp_linear_saved **saved) {
    if (saved) *saved = NULL;
    lowp_status st = check_param(fn, w, grouped);
    if (st != LOWP_OK) return st;
    const int64_t N = w->rows, K = w->cols;
    if (!x) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: x is NULL", fn);
    const int64_t M = x->rows;
    if ((st = check_tensor(fn, "x", x, M, K)) != LOWP_OK) return st;
    if ((st = check_tensor(fn, "y", y, M, N)) != LOWP_OK) return st;
    if ((st = check_opts(fn, opts)) != LOWP_OK) return st;
    const int32_t G = grouped ? w->groups : 1;
    if (grouped && (st = lowp_check_offs(fn, offs, G, M, "x.rows")) != LOWP_OK) return st;
    const int32_t threads = opts ? opts->threads : 0;
    const int recompute = opts ? opts->recompute : 0;
    const int64_t T = grouped ? offs[G - 1] : M; /* rows past the last group are ignored */

    plan p;
    plan_of(w, opts, &p);
    lowp_linear_saved *s = NULL;
    if (saved) {
        s = calloc(1, sizeof *s);
        if (s && grouped) s->offs = malloc((size_t) G * sizeof *s->offs);
        if (!s || (grouped && !s->offs)) {
            free(s);
            return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: saved state", fn);
        }
        s->param = w;
        s->wrap = w->wrap;
        s->grouped = grouped;
        s->rows = M;
        s->cols = K;
        s->groups = G;
        if (grouped) memcpy(s->offs, offs, (size_t) G * sizeof *offs);
    }
    /* The backward of a BF16 wgrad reads x itself, so only a quantized X copy is worth keeping. */
    const int keep = s && p.cfg.keep_quantized && p.wgrad_q && T > 0;
    struct lowp_weight_cache *wc = NULL;
    int owned = 0;
    shared_copy *xrow = NULL, *xcol = NULL;
    if (T > 0) {
        if ((st = weight_operands(fn, w, &p, 1, 0, threads, &wc, &owned)) != LOWP_OK) goto done;
        const lowp_operand_spec *is = &p.cfg.input;
        const int kind = p.fwd_q ? COPY_Q : p.hp;
        const float *scale = delayed_scale(&p, is, LOWP_ROLE_INPUT);
        struct input_memo *mo = &t_memo;
        if (opts && opts->reuse_input && !scale && mo->row && mo->data == x->data &&
            mo->rows == M && mo->cols == K && mo->T == T && mo->groups == (grouped ? G : 0) &&
            spec_equal(&mo->spec, is) && mo->kind == kind && (!keep || mo->col) &&
            (!grouped || memcmp(mo->row->offs, offs, (size_t) G * sizeof *offs) == 0)) {
            xrow = sc_ref(mo->row); /* x's copies from the forward before this one */
            xcol = keep ? sc_ref(mo->col) : NULL;
        } else {
            memo_clear();
            if ((st = sc_alloc(fn, is, kind, T, K, grouped ? offs : NULL, G, 0, &xrow)) != LOWP_OK)
                goto done;
            if (keep && (st = sc_alloc(fn, is, COPY_Q, K, T, grouped ? offs : NULL, G, 1, &xcol)) !=
                            LOWP_OK)
                goto done;
            float amax = 0.0f;
            lowp_tensor xv = {LOWP_FORMAT_F32, T, K, x->data, LOWP_DEVICE_HOST};
            sr_draw d;
            const sr_draw *sr;
            if ((st = sr_take(fn, opts, is, "input", T, K, 1 + keep, &d, &sr)) != LOWP_OK)
                goto done;
            st = fill_copies(fn, &xv, is, &xrow->q, keep ? &xcol->q : NULL, scale,
                             scale ? &amax : NULL, threads, sr);
            if (st != LOWP_OK) goto done;
            /* A recomputed forward sees the same x again: its amax is already in the history. */
            if (scale && !recompute &&
                (st = lowp_fp8_state_record(p.fp8, LOWP_ROLE_INPUT, amax)) != LOWP_OK)
                goto done;
            if (!scale) { /* for the next forward on the same x */
                mo->data = x->data;
                mo->rows = M;
                mo->cols = K;
                mo->T = T;
                mo->groups = grouped ? G : 0;
                mo->spec = *is;
                mo->kind = kind;
                mo->row = sc_ref(xrow);
                mo->col = sc_ref(xcol);
            }
        }
        lowp_gemm_cfg gc;
        lowp_gemm_cfg_init(&gc);
        gc.threads = threads;
        lowp_tensor yv = {LOWP_FORMAT_F32, T, N, y->data, LOWP_DEVICE_HOST};
        st = gemm_timed(&xrow->q, wc->fwd, grouped ? offs : NULL, G, GEMM_NT, &yv, &gc);
        if (st != LOWP_OK) goto done;
        if (keep) s->xcol = sc_ref(xcol);
        if (s && !p.fwd_q && !p.wgrad_q && p.hp == COPY_BF16)
            s->xbf16 = sc_ref(xrow); /* the backward's wgrad reads the same rounding of x */
    }
    if (grouped) zero_rows(y, T);
    if (bias) {
        float *yd = y->data;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) yd[m * N + n] += bias[n];
    }
    if (w->wrap) w->wrap->stats.forward_calls++;
done:
    sc_release(xrow);
    sc_release(xcol);
    if (owned) lowp_weight_cache_free(wc);
    if (st != LOWP_OK) {
        lowp_error_append("%s: w \"%s\"", fn, w->name ? w->name : "?");
        lowp_linear_saved_free(s);
        return st;
    }
    if (saved) *saved = s;
    return LOWP_OK;
}

lowp_status lowp_linear_forward(lowp_param *w, const float *bias, const lowp_tensor *x,
                                lowp_tensor *y, const lowp_linear_opts *opts,
                                lowp_linear_saved **saved) {
    return forward("lowp_linear_forward", 0, w, bias, x, NULL, y, opts, saved);
}

lowp_status lowp_grouped_linear_forward(lowp_param *w, const lowp_tensor *x, const int32_t *offs,
                                        lowp_tensor *y, const lowp_linear_opts *opts,
                                        lowp_linear_saved **saved) {
    return forward("lowp_grouped_linear_forward", 1, w, NULL, x, offs, y, opts, saved);
}

/* ---- Backward ---- */

static lowp_status check_saved(const char *fn, const lowp_linear_saved *s, const lowp_param *w,
                               int grouped, int64_t M, int64_t K, const int32_t *offs) {
    if (!s) return LOWP_OK;
    if (s->param != w || s->wrap != w->wrap)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: saved comes from the forward of another weight (or of w before a "
                         "prepare or convert)",
                         fn);
    if (s->grouped != grouped || s->rows != M || s->cols != K)
        return lowp_fail(LOWP_ERR_INVALID_ARG,
                         "%s: saved is from a %s forward of x (%lld x %lld), not this x (%lld x "
                         "%lld)",
                         fn, s->grouped ? "grouped" : "linear", (long long) s->rows,
                         (long long) s->cols, (long long) M, (long long) K);
    if (grouped)
        for (int32_t g = 0; g < s->groups; g++)
            if (s->offs[g] != offs[g])
                return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: offs[%d] (%d) != the forward's (%d)",
                                 fn, g, offs[g], s->offs[g]);
    return LOWP_OK;
}

/* Every argument of a backward, before any work. */
static lowp_status check_backward(const char *fn, int grouped, const lowp_param *w,
                                  const lowp_tensor *x, const int32_t *offs, const lowp_tensor *dy,
                                  const lowp_tensor *dx, const lowp_linear_opts *opts,
                                  const lowp_linear_saved *saved) {
    lowp_status st = check_param(fn, w, grouped);
    if (st != LOWP_OK) return st;
    const int64_t N = w->rows, K = w->cols;
    if (!x) return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: x is NULL", fn);
    const int64_t M = x->rows;
    const int32_t G = grouped ? w->groups : 1;
    if ((st = check_tensor(fn, "x", x, M, K)) != LOWP_OK ||
        (st = check_tensor(fn, "dy", dy, M, N)) != LOWP_OK ||
        (dx && (st = check_tensor(fn, "dx", dx, M, K)) != LOWP_OK) ||
        (st = check_opts(fn, opts)) != LOWP_OK ||
        (grouped && (st = lowp_check_offs(fn, offs, G, M, "x.rows")) != LOWP_OK) ||
        (st = check_saved(fn, saved, w, grouped, M, K, offs)) != LOWP_OK)
        return st;
    if (!w->grad)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: w (\"%s\").grad is NULL", fn,
                         w->name ? w->name : "?");
    return LOWP_OK;
}

/* *out [T, C] (F32, the caller frees it) = x [T, C] with the random Hadamard transform along
 * its tokens under the sign word of h: lowp_hadamard16 of x^T (blocks restarting at each group
 * of go) transposed back, computed down x's columns without the transposes, so that the
 * columnwise copy made from *out is the quantization of the transformed x^T. */
static lowp_status hadamard_tokens(const char *fn, const lowp_tensor *x, const int32_t *go,
                                   int32_t G, const sr_draw *h, int32_t threads, float **out) {
    const int64_t T = x->rows, C = x->cols;
    float *a = lowp_host_alloc((size_t) (T * C) * sizeof *a);
    *out = a;
    if (!a)
        return lowp_fail(LOWP_ERR_OUT_OF_MEMORY, "%s: Hadamard transform of %lld x %lld", fn,
                         (long long) T, (long long) C);
    lowp_prof_push(LOWP_PHASE_QUANT);
    lowp_hadamard16_tokens((const float *) x->data, T, C, go, go ? G : 0, h->seed, h->offset,
                           threads, a);
    lowp_prof_pop();
    return LOWP_OK;
}

/* dY's copies for the backward's two GEMMs: row-wise for dgrad (when dyrow is not NULL),
 * column-wise per group for wgrad (after the Hadamard transform under h, when not NULL);
 * records dY's amax in the delayed-scaling state (not when recomputing). T rows of N. With
 * SR the dgrad copy takes its words first, then the wgrad copy. */
static lowp_status grad_output_copies(const char *fn, const plan *p, const lowp_tensor *dy,
                                      int64_t T, int64_t N, const int32_t *go, int32_t G,
                                      const lowp_linear_opts *opts, const sr_draw *h,
                                      lowp_qtensor *dyrow, lowp_qtensor *dycol) {
    const lowp_operand_spec *gs = &p->cfg.grad_output;
    const int32_t threads = opts ? opts->threads : 0;
    const int recompute = opts ? opts->recompute : 0;
    lowp_status st;
    if (dyrow &&
        (st = qt_alloc(fn, dyrow, gs, p->dgrad_q ? COPY_Q : p->hp, T, N, NULL, 0)) != LOWP_OK)
        return st;
    if ((st = qt_alloc(fn, dycol, gs, p->wgrad_q ? COPY_Q : p->hp, N, T, go, G)) != LOWP_OK)
        return st;
    const float *scale = delayed_scale(p, gs, LOWP_ROLE_GRAD_OUTPUT);
    float amax = 0.0f;
    lowp_tensor dyv = {LOWP_FORMAT_F32, T, N, dy->data, LOWP_DEVICE_HOST};
    sr_draw d;
    const sr_draw *sr;
    if ((st = sr_take(fn, opts, gs, "grad_output", T, N, 1 + (dyrow != NULL), &d, &sr)) != LOWP_OK)
        return st;
    if (!h) {
        st = fill_copies(fn, &dyv, gs, dyrow, dycol, scale, scale ? &amax : NULL, threads, sr);
    } else {
        float *z = NULL;
        st = dyrow
                 ? fill_copies(fn, &dyv, gs, dyrow, NULL, scale, scale ? &amax : NULL, threads, sr)
                 : LOWP_OK;
        if (st == LOWP_OK) st = hadamard_tokens(fn, &dyv, go, G, h, threads, &z);
        if (st == LOWP_OK) {
            const sr_draw next = {d.seed, d.offset + (dyrow ? (uint64_t) (T * N) : 0)};
            lowp_tensor zv = {LOWP_FORMAT_F32, T, N, z, LOWP_DEVICE_HOST};
            st = fill_copies(fn, &zv, gs, NULL, dycol, scale, NULL, threads, sr ? &next : NULL);
        }
        lowp_host_free(z);
    }
    if (st != LOWP_OK) return st;
    if (scale && !recompute) return lowp_fp8_state_record(p->fp8, LOWP_ROLE_GRAD_OUTPUT, amax);
    return LOWP_OK;
}

/* X column-wise for wgrad, into *xc: the forward's saved copy, the transpose of its saved BF16
 * copy, or X requantized from high precision into xcol with the same scale the forward used
 * (the role's scale moves only at the end of the step; its amax is already recorded). */
static lowp_status input_columns(const char *fn, const plan *p, const lowp_tensor *x,
                                 const lowp_linear_saved *saved, int64_t T, int64_t K,
                                 const int32_t *go, int32_t G, const lowp_linear_opts *opts,
                                 const sr_draw *h, lowp_qtensor *xcol, const lowp_qtensor **xc,
                                 int *kn) {
    const int32_t threads = opts ? opts->threads : 0;
    const lowp_operand_spec *is = &p->cfg.input;
    lowp_status st;
    *xc = xcol;
    *kn = 0;
    if (saved && saved->xcol) {
        *xc = &saved->xcol->q;
    } else if (saved && saved->xbf16 && !p->wgrad_q && p->hp == COPY_BF16) {
        /* read as stored, [T, K] (lowp_gemm_kn, lowp_grouped_gemm_wgrad_kn): no transpose */
        *xc = &saved->xbf16->q;
        *kn = 1;
    } else {
        if ((st = qt_alloc(fn, xcol, is, p->wgrad_q ? COPY_Q : p->hp, K, T, go, G)) != LOWP_OK)
            return st;
        lowp_tensor xv = {LOWP_FORMAT_F32, T, K, x->data, LOWP_DEVICE_HOST};
        float *z = NULL; /* X after the Hadamard transform along the tokens */
        if (h && (st = hadamard_tokens(fn, &xv, go, G, h, threads, &z)) != LOWP_OK) return st;
        if (z) xv.data = z;
        sr_draw d;
        const sr_draw *sr;
        st = sr_take(fn, opts, is, "input", T, K, 1, &d, &sr);
        if (st == LOWP_OK)
            st = fill_copies(fn, &xv, is, NULL, xcol, delayed_scale(p, is, LOWP_ROLE_INPUT), NULL,
                             threads, sr);
        lowp_host_free(z);
        return st;
    }
    return LOWP_OK;
}

/* dbias[n] += the sum over the M rows of dY's column n (in binary64). */
static void add_dbias(const lowp_tensor *dy, int64_t M, int64_t N, float *dbias) {
    const float *d = dy->data;
    for (int64_t n = 0; n < N; n++) {
        double sum = 0.0;
        for (int64_t m = 0; m < M; m++) sum += d[m * N + n];
        dbias[n] += (float) sum;
    }
}

/* Consumes `saved` on every path, so that a failed backward leaks nothing. */
static lowp_status backward(const char *fn, int grouped, lowp_param *w, const lowp_tensor *x,
                            const int32_t *offs, const lowp_tensor *dy, lowp_tensor *dx,
                            float *dbias, const lowp_linear_opts *opts, lowp_linear_saved *saved) {
    lowp_qtensor dyrow, dycol, xcol;
    memset(&dyrow, 0, sizeof dyrow);
    memset(&dycol, 0, sizeof dycol);
    memset(&xcol, 0, sizeof xcol);
    struct lowp_weight_cache *wc = NULL;
    int owned = 0;
    memo_clear(); /* a forward after this reads another x */
    lowp_status st = check_backward(fn, grouped, w, x, offs, dy, dx, opts, saved);
    if (st != LOWP_OK) goto out;
    const int64_t N = w->rows, K = w->cols, M = x->rows;
    const int32_t G = grouped ? w->groups : 1;
    const int32_t threads = opts ? opts->threads : 0;
    const int64_t T = grouped ? offs[G - 1] : M;
    plan p;
    plan_of(w, opts, &p);
    if (T > 0) {
        if ((st = weight_operands(fn, w, &p, 0, dx != NULL, threads, &wc, &owned)) != LOWP_OK)
            goto out;
        const int32_t *go = grouped ? offs : NULL;
        /* One sign word per backward, for both wgrad operands, before any SR words. */
        sr_draw hd;
        const sr_draw *h = NULL;
        if (p.cfg.wgrad_hadamard && p.wgrad_q) {
            if ((st = rng_take(fn, opts, "hadamard", "cfg.wgrad_hadamard", 1, &hd)) != LOWP_OK)
                goto out;
            h = &hd;
        }
        st = grad_output_copies(fn, &p, dy, T, N, go, G, opts, h, dx ? &dyrow : NULL, &dycol);
        if (st != LOWP_OK) goto out;
        lowp_gemm_cfg gc;
        lowp_gemm_cfg_init(&gc);
        gc.threads = threads;
        if (dx) {
            lowp_tensor dxv = {LOWP_FORMAT_F32, T, K, dx->data, LOWP_DEVICE_HOST};
            st = p.dgrad_kn
                     ? gemm_timed(&dyrow, wc->fwd, grouped ? offs : NULL, G, GEMM_KN, &dxv, &gc)
                     : gemm_timed(&dyrow, wc->dgr, grouped ? offs : NULL, G, GEMM_NT, &dxv, &gc);
            if (st != LOWP_OK) goto out;
        }
        const lowp_qtensor *xc = NULL;
        int xkn = 0;
        st = input_columns(fn, &p, x, saved, T, K, go, G, opts, h, &xcol, &xc, &xkn);
        if (st != LOWP_OK) goto out;
        gc.accumulate = 1; /* dW adds into the FP32 gradient: micro-batches add up */
        lowp_tensor gt = {LOWP_FORMAT_F32, (int64_t) G * N, K, w->grad, LOWP_DEVICE_HOST};
        st = gemm_timed(&dycol, xc, grouped ? offs : NULL, G, xkn ? GEMM_WGRAD_KN : GEMM_WGRAD, &gt,
                        &gc);
        if (st != LOWP_OK) goto out;
    }
    if (dx && grouped) zero_rows(dx, T);
    if (dbias) add_dbias(dy, M, N, dbias);
    if (w->wrap) w->wrap->stats.backward_calls++;
out:
    qt_free(&dyrow);
    qt_free(&dycol);
    qt_free(&xcol);
    if (owned) lowp_weight_cache_free(wc);
    lowp_linear_saved_free(saved);
    if (st != LOWP_OK && w) lowp_error_append("%s: w \"%s\"", fn, w->name ? w->name : "?");
    return st;
}

lowp_status lowp_linear_backward(lowp_param *w, const lowp_tensor *x, const lowp_tensor *dy,
                                 lowp_tensor *dx, float *dbias, const lowp_linear_opts *opts,
                                 lowp_linear_saved *saved) {
    return backward("lowp_linear_backward", 0, w, x, NULL, dy, dx, dbias, opts, saved);
}

lowp_status lowp_grouped_linear_backward(lowp_param *w, const lowp_tensor *x, const int32_t *offs,
                                         const lowp_tensor *dy, lowp_tensor *dx,
                                         const lowp_linear_opts *opts, lowp_linear_saved *saved) {
    return backward("lowp_grouped_linear_backward", 1, w, x, offs, dy, dx, NULL, opts, saved);
}
