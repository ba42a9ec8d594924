/* The MoE transformer that `lowp train` trains: a small DeepSeek-style decoder in plain C.
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
 *   lowp_moe *m;
 *   lowp_moe_create(&cfg, 1234, &m);
 *   lowp_param *params; int32_t n;
 *   lowp_moe_params(m, &params, &n);          // prepare them with a recipe, feed the optimizer
 *   float loss;
 *   lowp_moe_forward(m, tokens, targets, B, T, &run, &loss);
 *   lowp_moe_backward(m);                     // grads += into params[i].grad
 */
#ifndef LOWP_MODEL_H
#define LOWP_MODEL_H

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

/* Presets: "tiny" (a CI run of seconds), "small" (minutes on two cores), "medium" (benchmarks). */
LOWP_API lowp_status lowp_moe_config_preset(const char *name, int32_t vocab, lowp_moe_config *out);

typedef struct lowp_moe lowp_moe;

/* Allocate the model (one arena) and initialize the weights from `seed`. */
LOWP_API lowp_status lowp_moe_create(const lowp_moe_config *cfg, uint64_t seed, lowp_moe **out);
LOWP_API void lowp_moe_free(lowp_moe *m);
LOWP_API lowp_status lowp_moe_get_config(const lowp_moe *m, lowp_moe_config *out);

/* Every parameter, in a fixed order (the pointers stay valid for the model's life). */
LOWP_API lowp_status lowp_moe_params(lowp_moe *m, lowp_param **params, int32_t *n);

typedef struct lowp_moe_run {
    int32_t training;              /* dropout on, activations kept for backward */
    int32_t activation_checkpoint; /* keep only layer inputs; recompute in backward */
    lowp_rng_tracker *rng;         /* dropout's generator (NULL: no dropout) */
    const lowp_autocast *autocast; /* for RMSNorm and the other non-GEMM ops (NULL: off) */
    int32_t threads;               /* 0: all cores */
} lowp_moe_run;

/* Forward over tokens [B, T] (int32 in [0, V)). With targets [B, T]: *loss = mean
 * cross-entropy + aux_loss_coef * load-balancing loss (targets may be NULL: no loss). The
 * logits of the last call stay readable with lowp_moe_logits. */
LOWP_API lowp_status lowp_moe_forward(lowp_moe *m, const int32_t *tokens, const int32_t *targets,
                                      int32_t B, int32_t T, const lowp_moe_run *run, float *loss);
/* Backward of the last training forward (with targets): every params[i].grad += dLoss/dW. */
LOWP_API lowp_status lowp_moe_backward(lowp_moe *m);
/* Logits [B, T, V] of the last forward. */
LOWP_API lowp_status lowp_moe_logits(const lowp_moe *m, const float **logits);

/* Parameters that one token touches (top-k of the experts), and the training FLOPs of one
 * token at sequence length T: 6 x active parameters + attention (12 x L x D x T). */
LOWP_API lowp_status lowp_moe_active_params(const lowp_moe *m, int64_t *active, int64_t *total);
LOWP_API lowp_status lowp_moe_flops_per_token(const lowp_moe *m, int32_t T, double *flops);

#ifdef __cplusplus
}
#endif
#endif
