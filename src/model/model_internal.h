/* The models' internal interface: model_ops, what each model implements behind lowp_model
 * (model.c), the parameter table every model owns (model_util.c), and the MoE transformer's
 * pieces: the views of one layer's activations and the two halves of a decoder layer that
 * moe.c strings together (moe_attention.c: RMSNorm + causal attention with RoPE; moe_ffn.c:
 * RMSNorm + the MoE feed-forward). Shapes use N = B * T tokens and S = N * top_k routed
 * token-slots. Not installed. */
#ifndef LOWP_MODEL_INTERNAL_H
#define LOWP_MODEL_INTERNAL_H

#include "core/internal.h"
#include "lowp/model.h"
#include "lowp/threads.h"
#include "train/train_internal.h" /* lowp_rmsnorm_*_nt */

/* Loops over less work than this (in elements) stay on the calling thread: waking the team
 * would cost more than the loop. Which thread computes an element never changes its value. */
#define MOE_PARALLEL_MIN 32768

/* One layer's parameters, in the order lowp_model_params lists them. */
enum {
    MOE_ATTN_NORM,
    MOE_WQ,
    MOE_WK,
    MOE_WV,
    MOE_WO,
    MOE_FFN_NORM,
    MOE_ROUTER,
    MOE_SHARED_W1,
    MOE_SHARED_W3,
    MOE_SHARED_W2,
    MOE_EXPERTS_W1,
    MOE_EXPERTS_W3,
    MOE_EXPERTS_W2,
    MOE_LAYER_PARAMS
};

/* The sizes of one pass. */
typedef struct moe_dims {
    int64_t B, T, N;   /* batch, sequence, tokens */
    int64_t D, nh, hd; /* model width, heads, head width */
    int64_t E, K, S;   /* routed experts, experts per token, routed slots N * K */
    int64_t H, Hs, V;  /* expert hidden, shared-expert hidden, vocabulary */
    int64_t L;         /* layers (the load-balancing loss is their mean) */
    float eps, aux_coef;
} moe_dims;

/* How one pass runs; derived from lowp_model_run and kept for the backward, which has no run
 * argument of its own. */
typedef struct moe_exec {
    lowp_linear_opts lin;          /* recompute is 1 while a checkpointed layer is recomputed */
    int nthreads;                  /* the model's own OpenMP loops */
    const lowp_autocast *autocast; /* RMSNorm */
    lowp_rng_tracker *rng;         /* non-NULL when dropout runs */
    float dropout;
} moe_exec;

/* Attention half of a layer. The linear layers' saved state (wq, wk, wv, wo) is per layer
 * even when the buffers are shared scratch (activation checkpointing). */
typedef struct moe_attn_acts {
    float *h;         /* [N, D]  attn_norm(x) */
    float *rstd;      /* [N]     its 1/rms */
    float *q, *k, *v; /* [N, D]  projections; q and k after RoPE */
    float *att;       /* [B, nh, T, T] softmax probabilities (row t: columns 0..t) */
    float *o;         /* [N, D]  attention output, heads side by side: the input of wo */
    float *y;         /* [N, D]  the branch output o Wo^T (dropped out in place) */
    uint8_t *mask;    /* [N, D]  dropout mask, NULL without dropout */
    lowp_linear_saved *saved[4];
} moe_attn_acts;

/* MoE half of a layer. */
typedef struct moe_ffn_acts {
    float *h;         /* [N, D]   ffn_norm(x_mid) */
    float *rstd;      /* [N] */
    float *probs;     /* [N, E]   router softmax (the logits are computed in place) */
    int32_t *idx;     /* [N, K]   chosen experts, most probable first */
    float *gate;      /* [N, K]   their probabilities renormalized to sum 1 */
    int32_t *pos;     /* [N, K]   row of slot (n, j) in the expert-sorted buffers */
    int32_t *offs;    /* [E]      cumulative ends of each expert's rows */
    float *frac;      /* [E]      f_e: fraction of the slots routed to e */
    float *xp;        /* [S, D]   h gathered in expert order */
    float *u1, *u3;   /* [S, H]   xp W1[e]^T, xp W3[e]^T */
    float *s;         /* [S, H]   silu(u1) * u3 */
    float *eo;        /* [S, D]   s W2[e]^T: each slot's expert output */
    float *su1, *su3; /* [N, H_s] shared expert: h Ws1^T, h Ws3^T */
    float *ss;        /* [N, H_s] silu(su1) * su3 */
    float *y;         /* [N, D]   shared + gated routed outputs (dropped out in place) */
    uint8_t *mask;    /* [N, D]   dropout mask, NULL without dropout */
    double aux;       /* E * sum_e f_e P_e of this layer */
    lowp_linear_saved *saved[7];
} moe_ffn_acts;

/* Backward scratch, reused by every layer (one layer's backward runs at a time). */
typedef struct moe_grads {
    float *dres;               /* [N, D]   dLoss/d(residual stream) at the current point */
    float *dbranch;            /* [N, D]   dLoss/d(branch output), after dropout's backward */
    float *dh;                 /* [N, D]   dLoss/d(norm output) */
    float *dtmp;               /* [N, D] */
    float *dq, *dk, *dv, *do_; /* [N, D] */
    float *dgate;              /* [N, K] */
    float *dprobs;             /* [N, E] */
    float *deo;                /* [S, D] */
    float *dxp, *dxp3;         /* [S, D] */
    float *ds, *du1, *du3;     /* [S, H] */
    float *dss, *dsu1, *dsu3;  /* [N, H_s] */
} moe_grads;

/* A bump allocator over an arena (base NULL: only measures the size); 64-byte aligned. */
typedef struct moe_carver {
    char *base;
    size_t off;
} moe_carver;
LOWP_HIDDEN void *moe_carve(moe_carver *c, int64_t count, size_t elem);

/* Mean over rows of logsumexp(logits[n]) - logits[n, targets[n]] (lse [N], row_loss [N] kept),
 * and its gradient dlogits [N, V] = (softmax - onehot) / N. */
LOWP_HIDDEN double moe_cross_entropy(const moe_dims *d, const float *logits, const int32_t *targets,
                                     float *lse, double *row_loss, int nthreads);
LOWP_HIDDEN void moe_cross_entropy_backward(const moe_dims *d, const float *logits,
                                            const int32_t *targets, const float *lse,
                                            float *dlogits, int nthreads);

/* ---- The model interface. A model is one file (or folder) of src/model/ that fills a
 * model_ops; lowp_model (model.c) checks every argument the API documents (pointers, B, T,
 * token ids, run.threads) before calling it, and picks the model by cfg.experts. ctx is the
 * model's own state. */
typedef struct model_ops {
    /* Checks cfg (messages start "FN: cfg.FIELD", fn the public name called), allocates and
     * initializes from seed; on failure nothing is left allocated. */
    lowp_status (*create)(const char *fn, const lowp_moe_config *cfg, uint64_t seed, void **ctx);
    void (*free)(void *ctx);
    void (*params)(void *ctx, lowp_param **params, int32_t *n);
    lowp_status (*forward)(void *ctx, const char *fn, const int32_t *tokens, const int32_t *targets,
                           int32_t B, int32_t T, const lowp_model_run *run, float *loss);
    lowp_status (*backward)(void *ctx, const char *fn);
    const float *(*logits)(const void *ctx); /* NULL before the first forward */
    /* The last forward's cross-entropy (NaN without targets) and load-balancing loss. */
    void (*loss_terms)(const void *ctx, double *ce, double *aux);
    /* Parameters a token does not touch (idle experts), and those read by lookup rather
     * than as GEMM weights (for lowp_model_flops_per_token). */
    int64_t (*idle_params)(const lowp_moe_config *cfg);
    double (*lookup_params)(const lowp_moe_config *cfg);
} model_ops;

LOWP_HIDDEN extern const model_ops moe_model_ops;   /* moe.c */
LOWP_HIDDEN extern const model_ops dense_model_ops; /* dense.c */

/* The last forward's loss in binary64 (the float that lowp_model_forward returns rounds it):
 * finite-difference gradient checks resolve much smaller changes with it. */
LOWP_HIDDEN double model_loss_f64(const lowp_model *m);

/* ---- The parameter table a model owns (model_util.c): names, shapes, one arena holding
 * every weight, then every gradient (same offsets, zeroed), then `extra` floats the model
 * uses as it likes (the MoE's RoPE tables); each parameter starts on a 64-byte line. */
#define MODEL_NAME_MAX 48
typedef struct model_params {
    int32_t n, cap;
    lowp_param *params;            /* [cap] */
    char (*names)[MODEL_NAME_MAX]; /* [cap] */
    float *init_std;               /* [cap] until model_params_init: < 0 means ones */
    float *arena, *extra;
} model_params;
/* Room for cap parameters (fn names the caller in the message). */
LOWP_HIDDEN lowp_status model_params_alloc(model_params *p, int32_t cap, const char *fn);
/* Appends a parameter: its name (printf-style), shape and initial standard deviation. */
LOWP_HIDDEN void model_params_add(model_params *p, int64_t groups, int64_t rows, int64_t cols,
                                  float std, const char *fmt, ...) LOWP_PRINTF(6, 7);
/* The arena, each weight drawn N(0, std) from the seed's Philox streams (each parameter's
 * stream follows the last) through Box-Muller in binary64: the same on every machine. */
LOWP_HIDDEN lowp_status model_params_init(model_params *p, uint64_t seed, int64_t extra,
                                          const char *fn);
LOWP_HIDDEN void model_params_free(model_params *p);
/* The limits every model shares: the layer count of the parameter table, and the memory of
 * the machine given `total` parameters. */
LOWP_HIDDEN lowp_status model_size_check(const lowp_moe_config *c, const char *fn, double total);

/* ---- The dense GPT (cfg.experts == 0; dense.c): nanoGPT's block
 *   x_0 = wte[tokens] + wpe[t];  x_mid = x + attn(ln_1(x));  x_out = x_mid + mlp(ln_2(x_mid))
 *   mlp(h) = gelu(h Wfc^T) Wproj^T;  logits = ln_f(x_L) wte^T (the head is tied to wte)
 * Its parameters, in lowp_model_params order: embed [V, D], pos_embed [seq_len, D], per layer
 * attn_norm [1, D], attn.wqkv [3 D, D], attn.wo [D, D], ffn_norm [1, D], mlp.fc [H_s, D],
 * mlp.proj [D, H_s]; then final_norm [1, D]. LayerNorms without bias, as nanoGPT's
 * bias = False. */
enum {
    DENSE_ATTN_NORM,
    DENSE_WQKV,
    DENSE_WO,
    DENSE_FFN_NORM,
    DENSE_FC,
    DENSE_PROJ,
    DENSE_LAYER_PARAMS
};

/* A plain F32 host tensor over a buffer. */
static inline lowp_tensor moe_tensor(const float *p, int64_t rows, int64_t cols) {
    lowp_tensor t = {LOWP_FORMAT_F32, rows, cols, (void *) p, LOWP_DEVICE_HOST};
    return t;
}

/* dst[i] += src[i] over n floats, with the pass's threads. */
LOWP_HIDDEN void moe_add(float *dst, const float *src, int64_t n, int nthreads);
/* dst[i] = a[i] + b[i] (the same bits as a copy of a and moe_add of b, one pass fewer). */
LOWP_HIDDEN void moe_sum(float *dst, const float *a, const float *b, int64_t n, int nthreads);
/* memcpy of n floats in spans across the pass's threads. */
LOWP_HIDDEN void moe_copy(float *dst, const float *src, int64_t n, int nthreads);

/* The linear layers of the model, on F32 host buffers: y[M, w.rows] = x[M, w.cols] . W^T, and
 * the backward (dx [M, w.cols] overwritten, may be NULL; w.grad +=). The backward consumes
 * *saved and sets it to NULL. */
LOWP_HIDDEN lowp_status moe_linear_fwd(lowp_param *w, const float *x, int64_t M, float *y,
                                       const moe_exec *ex, lowp_linear_saved **saved);
LOWP_HIDDEN lowp_status moe_linear_bwd(lowp_param *w, const float *x, int64_t M, const float *dy,
                                       float *dx, const moe_exec *ex, lowp_linear_saved **saved);
/* moe_linear_fwd (moe_grouped_fwd) on the x of the forward just before it, unchanged (k and v
 * after q, w3 after w1): that forward's quantized copies of x are reused (opts.reuse_input). */
LOWP_HIDDEN lowp_status moe_linear_fwd_again(lowp_param *w, const float *x, int64_t M, float *y,
                                             const moe_exec *ex, lowp_linear_saved **saved);
LOWP_HIDDEN lowp_status moe_grouped_fwd_again(lowp_param *w, const float *x, int64_t M,
                                              const int32_t *offs, float *y, const moe_exec *ex,
                                              lowp_linear_saved **saved);
/* Grouped (the routed experts, w.groups = E): rows of x split by offs [E]. */
LOWP_HIDDEN lowp_status moe_grouped_fwd(lowp_param *w, const float *x, int64_t M,
                                        const int32_t *offs, float *y, const moe_exec *ex,
                                        lowp_linear_saved **saved);
LOWP_HIDDEN lowp_status moe_grouped_bwd(lowp_param *w, const float *x, int64_t M,
                                        const int32_t *offs, const float *dy, float *dx,
                                        const moe_exec *ex, lowp_linear_saved **saved);

/* Attention half: a->y from x [N, D]. keep: save the linear layers' state for a backward.
 * rope_cos, rope_sin [seq_len, hd / 2]. */
LOWP_HIDDEN lowp_status moe_attention_forward(lowp_param *lp, const moe_dims *d, const moe_exec *ex,
                                              const float *rope_cos, const float *rope_sin,
                                              const float *x, moe_attn_acts *a, int keep);
/* From dy = dLoss/da->y [N, D]: every weight's grad +=, and dx [N, D] += dLoss/dx. */
LOWP_HIDDEN lowp_status moe_attention_backward(lowp_param *lp, const moe_dims *d,
                                               const moe_exec *ex, const float *rope_cos,
                                               const float *rope_sin, const float *x,
                                               moe_attn_acts *a, const float *dy, float *dx,
                                               moe_grads *g);

/* The causal attention core (no projections, no RoPE): q, k, v, o [N, D] with head h in
 * columns [h * hd, (h + 1) * hd); att [B, nh, T, T] the probabilities, kept for the backward,
 * which overwrites dq, dk, dv [N, D] from do_ [N, D]. Each thread allocates its scratch
 * (LOWP_ERR_OUT_OF_MEMORY when it cannot). */
LOWP_HIDDEN lowp_status moe_attention_core_forward(const moe_dims *d, const float *q,
                                                   const float *k, const float *v, float *att,
                                                   float *o, int nthreads);
LOWP_HIDDEN lowp_status moe_attention_core_backward(const moe_dims *d, const float *q,
                                                    const float *k, const float *v,
                                                    const float *att, const float *do_, float *dq,
                                                    float *dk, float *dv, int nthreads);

/* The attention core's row passes over a block of rows (src/model/moe_attention.c), exposed
 * for the tests. moe_softmax_block: rows [0, r) of sb (row stride L) hold the scores of
 * queries i0 .. i0 + r - 1; each becomes the causal softmax of its scores times scale (0 past
 * the query), the maximum and the sum taken in key order. moe_ds_block: rows [0, r) of db
 * (stride L) hold dP; each becomes dS = P (dP - sum_j P dP) scale over the visible keys (the
 * sum in key order; P row i0 + t of p, stride T), 0 past them. */
LOWP_HIDDEN void moe_softmax_block(float *sb, int64_t r, int64_t L, int64_t i0, float scale);
LOWP_HIDDEN void moe_ds_block(const float *p, int64_t T, float *db, int64_t r, int64_t L,
                              int64_t i0, float scale);

/* MoE half: a->y and a->aux from x [N, D]. */
LOWP_HIDDEN lowp_status moe_ffn_forward(lowp_param *lp, const moe_dims *d, const moe_exec *ex,
                                        const float *x, moe_ffn_acts *a, int keep);
/* From dy = dLoss/da->y [N, D] and daux = dLoss/d(this layer's aux): grads +=, dx +=. */
LOWP_HIDDEN lowp_status moe_ffn_backward(lowp_param *lp, const moe_dims *d, const moe_exec *ex,
                                         const float *x, moe_ffn_acts *a, const float *dy,
                                         double daux, float *dx, moe_grads *g);

#endif
