/* The models that `lowp train` trains, behind one handle: lowp_model, created from a
 * lowp_moe_config (cfg.experts > 0: the MoE transformer; 0: the dense GPT). Implemented in
 * src/model/ (model.c: the handle and its checks; moe.c with moe_attention.c, moe_ffn.c and
 * moe_linear.c: the MoE; dense.c: the dense GPT). Each model fills the interface of
 * src/model/model_internal.h (model_ops: create, free, params, forward, backward, logits,
 * loss terms); the trainer (trainer.h) sees only lowp_model.
 *
 * The MoE transformer, a small DeepSeek-style decoder in plain C:
 *
 *   embed -> L x [ RMSNorm -> causal MHA with RoPE -> + ; RMSNorm -> MoE FFN -> + ] -> RMSNorm
 *   -> head -> cross-entropy
 *
 * The MoE feed-forward has one shared SwiGLU expert and E routed SwiGLU experts with top-k
 * routing (softmax gates over the chosen experts) and a load-balancing auxiliary loss. Every
 * linear goes through lowp_linear_* / lowp_grouped_linear_*, so a recipe applies by parameter
 * name:
 *   embed                       [V, D]
 *   layers.L.attn_norm          [1, D]
 *   layers.L.attn.wq|wk|wv|wo   [D, D]
 *   layers.L.ffn_norm           [1, D]
 *   layers.L.moe.router         [E, D]
 *   layers.L.moe.shared.w1|w3   [H_s, D]    layers.L.moe.shared.w2    [D, H_s]
 *   layers.L.moe.experts.w1|w3  [E, H, D]   layers.L.moe.experts.w2   [E, D, H]
 *   final_norm                  [1, D]
 *   head                        [V, D]
 *
 *   lowp_moe_config cfg;
 *   lowp_moe_config_preset("tiny", 65, &cfg);
 *   lowp_model *m;
 *   lowp_model_create(&cfg, 1234, &m);
 *   lowp_param *params; int32_t n;
 *   lowp_model_params(m, &params, &n);        // prepare them with a recipe, feed the optimizer
 *   float loss;
 *   lowp_model_forward(m, tokens, targets, B, T, &run, &loss);
 *   lowp_model_backward(m);                   // grads += into params[i].grad
 *   lowp_model_free(m);
 */
#ifndef LOWP_MODEL_H
#define LOWP_MODEL_H

#include "rng_tracker.h"
#include "train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lowp_moe_config {
    int32_t vocab;         /* V */
    int32_t dim;           /* D */
    int32_t layers;        /* L */
    int32_t heads;         /* D % heads == 0; head dim even (RoPE) */
    int32_t seq_len;       /* longest T */
    int32_t experts;       /* E routed experts */
    int32_t top_k;         /* experts per token */
    int32_t expert_hidden; /* H */
    int32_t shared_hidden; /* H_s */
    float rope_theta;      /* 10000 */
    float norm_eps;        /* 1e-5 */
    float aux_loss_coef;   /* load-balancing loss weight, e.g. 0.01 */
    float dropout;         /* on the residual branches, 0 to disable */
} lowp_moe_config;

/* Presets (override any field afterwards; dropout 0, aux_loss_coef 0.01, rope_theta 1e4):
 *   tiny    D 64,  L 2, 4 heads, T 32,  E 4 (top 2), H 64,  H_s 64    a CI run of seconds
 *   small   D 128, L 4, 4 heads, T 64,  E 8 (top 2), H 128, H_s 128   minutes on two cores
 *   medium  D 384, L 6, 6 heads, T 256, E 8 (top 2), H 512, H_s 512   benchmarks
 *   nanogpt D 128, L 4, 4 heads, T 64,  dense (E 0), MLP 512          nanoGPT's CPU recipe
 *
 * experts = 0 selects the dense GPT instead of the MoE (nanoGPT's block): embed [V, D] plus
 * learned positions pos_embed [seq_len, D]; per layer LayerNorm (no bias) -> causal attention
 * with a fused layers.L.attn.wqkv [3 D, D] and layers.L.attn.wo [D, D]; LayerNorm -> MLP
 * layers.L.mlp.fc [H_s, D], GELU, layers.L.mlp.proj [D, H_s]; final LayerNorm; the output head
 * is embed itself (tied). The norms are named attn_norm, ffn_norm and final_norm as in the MoE.
 * top_k, expert_hidden, dropout and aux_loss_coef must be 0 and rope_theta is unused; the dense
 * model has no activation checkpointing. */
LOWP_API lowp_status lowp_moe_config_preset(const char *name, int32_t vocab, lowp_moe_config *out);

/* A model: the MoE or the dense GPT, chosen by cfg.experts. */
typedef struct lowp_model lowp_model;

/* At most this many layers (the parameter table's entries stay inside int32). */
#define LOWP_MOE_MAX_LAYERS 65536

/* Allocate the model (one arena: every weight, then every gradient, zeroed) and initialize
 * the weights from `seed`, the same on every machine: N(0, 0.02) from Philox through
 * Box-Muller, wo and w2 scaled by 1/sqrt(2 L), norm weights 1. Refuses, before allocating, a
 * configuration whose weights, gradients, Adam moments and RoPE tables would not fit the
 * physical memory (LOWP_ERR_INVALID_ARG). */
LOWP_API lowp_status lowp_model_create(const lowp_moe_config *cfg, uint64_t seed, lowp_model **out);
/* Frees the model, and the library's cache of host blocks released by its updates (GEMM
 * workspaces, quantized copies; LOWP_HOST_CACHE_MB in the README). NULL is ignored. */
LOWP_API void lowp_model_free(lowp_model *m);
LOWP_API lowp_status lowp_model_get_config(const lowp_model *m, lowp_moe_config *out);

/* Every parameter, in a fixed order (the pointers stay valid for the model's life). */
LOWP_API lowp_status lowp_model_params(lowp_model *m, lowp_param **params, int32_t *n);

/* How one forward (and the backward that follows it) runs. The backward reuses the forward's
 * run, so `rng` and `autocast` must stay valid until it returns. */
typedef struct lowp_model_run {
    int32_t training;              /* dropout on, activations kept for backward */
    int32_t activation_checkpoint; /* keep only layer inputs; recompute in backward (same
                                      losses and gradients, bit for bit) */
    lowp_rng_tracker *rng;         /* dropout's generator (NULL: no dropout), and in training
                                      the linear layers' (lowp_linear_opts.rng: the FP4
                                      recipes' SR and Hadamard signs) */
    const lowp_autocast *autocast; /* for RMSNorm (NULL: off); the softmaxes, SwiGLU and the
                                      loss always compute in binary32 */
    int32_t threads;               /* 0: all cores */
    int32_t fp32_plain;            /* 1: unwrapped linears run F32 GEMMs instead of BF16
                                      (lowp_linear_opts.fp32_plain; gradient checks) */
} lowp_model_run;

/* Forward over tokens [B, T] (int32 in [0, V)), 1 <= T <= seq_len. With targets [B, T]:
 * *loss = mean cross-entropy + aux_loss_coef * load-balancing loss, where the load-balancing
 * loss is the mean over layers of E * sum_e f_e P_e (f_e: share of the token-slots routed to
 * expert e, P_e: mean router probability of e; 1 when perfectly balanced). targets and loss
 * may be NULL (no loss). The logits of the last call stay readable with lowp_model_logits.
 * run NULL: inference on all cores. The activation arena grows when a larger B * T comes. */
LOWP_API lowp_status lowp_model_forward(lowp_model *m, const int32_t *tokens,
                                        const int32_t *targets, int32_t B, int32_t T,
                                        const lowp_model_run *run, float *loss);
/* Backward of the last training forward (with targets): every params[i].grad += dLoss/dW. */
LOWP_API lowp_status lowp_model_backward(lowp_model *m);
/* Logits [B, T, V] of the last forward (valid until the next forward). */
LOWP_API lowp_status lowp_model_logits(const lowp_model *m, const float **logits);
/* The two terms of the last forward's loss: mean cross-entropy (NaN when it had no targets)
 * and the load-balancing loss before aux_loss_coef (0 for the dense model). Either pointer
 * may be NULL. */
LOWP_API lowp_status lowp_model_loss_terms(const lowp_model *m, float *cross_entropy, float *aux);

/* Parameters that one token touches (all but the E - top_k idle experts of each layer), and
 * the training FLOPs of one token at sequence length T: 6 x the active parameters that are
 * GEMM weights (the embedding is a lookup) + attention (12 x L x D x T). */
LOWP_API lowp_status lowp_model_active_params(const lowp_model *m, int64_t *active, int64_t *total);
LOWP_API lowp_status lowp_model_flops_per_token(const lowp_model *m, int32_t T, double *flops);

/* Deprecated (removed in lowp 0.3): the names of 0.2, when lowp_moe hosted both models.
 * lowp_moe is lowp_model, lowp_moe_run is lowp_model_run, and each lowp_moe_X function calls
 * lowp_model_X (lowp_moe_config and its preset keep their names). Define LOWP_NO_DEPRECATED
 * to check that code no longer uses them; to update code in one go:
 *   sed -i -e 's/\blowp_moe_\(create\|free\|get_config\|params\)\b/lowp_model_\1/g' \
 *          -e 's/\blowp_moe_\(forward\|backward\|logits\|loss_terms\)\b/lowp_model_\1/g' \
 *          -e 's/\blowp_moe_\(active_params\|flops_per_token\|run\)\b/lowp_model_\1/g' \
 *          -e 's/\blowp_moe\b/lowp_model/g' FILES */
#ifndef LOWP_NO_DEPRECATED
typedef lowp_model lowp_moe;
typedef lowp_model_run lowp_moe_run;
LOWP_API lowp_status lowp_moe_create(const lowp_moe_config *cfg, uint64_t seed, lowp_moe **out);
LOWP_API void lowp_moe_free(lowp_moe *m);
LOWP_API lowp_status lowp_moe_get_config(const lowp_moe *m, lowp_moe_config *out);
LOWP_API lowp_status lowp_moe_params(lowp_moe *m, lowp_param **params, int32_t *n);
LOWP_API lowp_status lowp_moe_forward(lowp_moe *m, const int32_t *tokens, const int32_t *targets,
                                      int32_t B, int32_t T, const lowp_moe_run *run, float *loss);
LOWP_API lowp_status lowp_moe_backward(lowp_moe *m);
LOWP_API lowp_status lowp_moe_logits(const lowp_moe *m, const float **logits);
LOWP_API lowp_status lowp_moe_loss_terms(const lowp_moe *m, float *cross_entropy, float *aux);
LOWP_API lowp_status lowp_moe_active_params(const lowp_moe *m, int64_t *active, int64_t *total);
LOWP_API lowp_status lowp_moe_flops_per_token(const lowp_moe *m, int32_t T, double *flops);
#endif

#ifdef __cplusplus
}
#endif
#endif
