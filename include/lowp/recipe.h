/* Recipes: which parameters train in which low-precision format. Implemented in
 * src/train/recipe.c.
 *
 * A recipe is an ordered list of rules; each rule maps a parameter-name pattern (shell glob:
 * `*`, `?`, `[...]`) to a linear-layer configuration, or to "high precision" (plain BF16
 * GEMMs). The first rule whose pattern matches a parameter's name decides; a parameter no rule
 * matches stays plain. Built-in recipes start with rules that keep MoE routers (`*router*`),
 * embeddings (`*embed*`), the output head (`head*`, `*.head`, `output*`, `*.output.*`,
 * `*lm_head*`) and normalization weights (`*norm*`, which are not GEMM operands at all) in high
 * precision; mix and mix_fp4 then send routed experts (`*.moe.experts.*`, and torchtitan 0.3.0's
 * `*.moe.routed_experts.*`) to NPU Block FP8 and shared experts (`*.moe.shared_experts.*`,
 * `*.moe.shared.*`) to MXFP8, and every recipe ends with `*`. The names are those of lowp's
 * models and of torchtitan (lowp.torch's recipes are this table).
 *
 *   lowp_recipe r;
 *   lowp_recipe_init(&r, "mix");                       // a built-in recipe by name
 *
 *   lowp_recipe mine;                                  // or composed from presets
 *   lowp_recipe_init(&mine, "custom");                 // no rules
 *   lowp_linear_cfg mx, blk;
 *   lowp_linear_cfg_preset("mxfp8", &mx);
 *   lowp_linear_cfg_preset("block_fp8", &blk);
 *   lowp_recipe_append(&mine, "*router*", NULL);       // high precision
 *   lowp_recipe_append(&mine, "*.experts.*", &blk);
 *   lowp_recipe_append(&mine, "*", &mx);
 *
 * Built-in recipes: bf16, fp8_delayed (HYBRID: E4M3 forward, E5M2 gradients, delayed
 * tensorwise scaling), fp8_current (HYBRID, current tensorwise scaling), fp8_rowwise,
 * all_mxfp8, block128 (DeepSeek-V3 1x128 activations, 128x128 weights), all_block_fp8 (NPU
 * 32x32 E8M0 weights, MX32 activations), mix (attention and shared experts MXFP8, routed
 * experts NPU Block FP8), mix_fp4 (mix with MXFP4 fake quantization of the routed experts),
 * nvfp4 and mxfp4 (every weight in that preset but the last transformer block, `layers.{last}.*`,
 * kept in high precision; see lowp_recipe_bind_last).
 * Presets: bf16, fp8_delayed, fp8_current, fp8_rowwise, mxfp8, block128, block_fp8,
 * block_fp8_fp4 (block_fp8 with MXFP4 fake quantization of the weight), nvfp4 (TE's
 * NVFP4BlockScaling: nv16 activations and gradients, nv16x16 weights, SR gradients, random
 * Hadamard transform on the wgrad operands), mxfp4 (E2M1 MX32 RCEIL, SR gradients, the same
 * transform); docs/numerics.md 4b.
 */
#ifndef LOWP_RECIPE_H
#define LOWP_RECIPE_H

#include "delayed.h"
#include "quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How one operand of a linear layer is quantized. format BF16 means not quantized (the
 * operand goes to a BF16 GEMM). */
typedef struct lowp_operand_spec {
    lowp_format format;         /* E4M3, E5M2, E2M1 (MX32, NV16, NV16X16) or BF16 */
    lowp_scaling scaling;       /* ignored for BF16 */
    lowp_scale_mode scale_mode; /* E8M0 kinds */
    int32_t pow2_scales;        /* binary32 kinds: -1 default, 0, 1 */
    int32_t delayed;            /* TENSOR only: 1 = delayed scaling from the amax history */
    lowp_rounding rounding;     /* elements: RNE (default) or SR (e2m1 only; the training layer
                                   draws the bits from the RNG tracker's "stochastic_rounding") */
} lowp_operand_spec;

/* The three operands of a linear layer's GEMMs:
 *   forward  Y  = X . W^T      input (rowwise)       x weight (rowwise)
 *   dgrad    dX = dY . W       grad_output (rowwise) x weight (columnwise copy)
 *   wgrad    dW = dY^T . X     grad_output (columnwise copy) x input (columnwise copy) */
typedef struct lowp_linear_cfg {
    lowp_operand_spec input, weight, grad_output;
    int32_t keep_quantized;   /* 1: backward reuses the forward's quantized X (the NPU way);
                                 0: backward requantizes X from high precision (torchao) */
    int32_t wgrad_hp;         /* 1: the weight-gradient GEMM runs in BF16 */
    int32_t fake_quant_mxfp4; /* 1: weight -> MXFP4 -> dequantize, then quantized as `weight` */
    lowp_delayed_cfg delayed; /* history length, margin, algorithm (format per role) */
    int32_t wgrad_hadamard;   /* 1: the random Hadamard transform (lowp_hadamard16) on both
                                 wgrad operands along the tokens, before their quantization */
} lowp_linear_cfg;

#define LOWP_RECIPE_MAX_RULES   16
#define LOWP_RECIPE_PATTERN_MAX 64

typedef struct lowp_recipe_rule {
    char pattern[LOWP_RECIPE_PATTERN_MAX];
    int32_t high_precision; /* 1: matching parameters stay plain (BF16 GEMMs) */
    lowp_linear_cfg cfg;    /* when high_precision is 0 */
} lowp_recipe_rule;

typedef struct lowp_recipe {
    char name[32];
    int32_t nrules;
    lowp_recipe_rule rules[LOWP_RECIPE_MAX_RULES];
} lowp_recipe;

/* A built-in recipe by name, or "custom" for an empty one. */
LOWP_API lowp_status lowp_recipe_init(lowp_recipe *recipe, const char *name);
/* Add a rule at the end; cfg NULL means high precision. */
LOWP_API lowp_status lowp_recipe_append(lowp_recipe *recipe, const char *pattern,
                                        const lowp_linear_cfg *cfg);
/* Replace every `{last}` in recipe's patterns by the decimal `last`: the index of the model's
 * last transformer block (the FP4 recipes keep it in high precision). lowp_train_prepare does
 * this itself on a copy, with `last` the highest N of the names that hold `layers.N.` at their
 * start or after a '.'. last < 0 (no blocks) changes nothing: an unbound `{last}` is literal
 * text that no parameter name holds. */
LOWP_API lowp_status lowp_recipe_bind_last(lowp_recipe *recipe, int32_t last);
/* The rule that decides `param_name` (*rule = NULL when none matches). */
LOWP_API lowp_status lowp_recipe_match(const lowp_recipe *recipe, const char *param_name,
                                       const lowp_recipe_rule **rule);
/* A linear configuration by preset name. */
LOWP_API lowp_status lowp_linear_cfg_preset(const char *name, lowp_linear_cfg *cfg);
/* Comma-separated names of the built-in recipes, for help texts. */
LOWP_API const char *lowp_recipe_names(void);
/* The name of built-in recipe `index` (0, 1, ... in lowp_recipe_names' order; NULL past the
 * last), and of built-in preset `index`: how a caller walks the tables.
 *
 *   for (int32_t i = 0; lowp_linear_cfg_preset_name(i); i++) ...
 */
LOWP_API const char *lowp_recipe_name_at(int32_t index);
LOWP_API const char *lowp_linear_cfg_preset_name(int32_t index);
/* The name of the preset `cfg` equals field by field, or "custom". */
LOWP_API const char *lowp_linear_cfg_name(const lowp_linear_cfg *cfg);

/* The GEMMs of a linear layer (see lowp_linear_cfg), in the order of the plan below. */
typedef enum lowp_linear_gemm {
    LOWP_LINEAR_FORWARD = 0, /* Y = X . W^T */
    LOWP_LINEAR_DGRAD = 1,   /* dX = dY . W */
    LOWP_LINEAR_WGRAD = 2,   /* dW = dY^T . X */
    LOWP_LINEAR_GEMM_COUNT = 3
} lowp_linear_gemm;

/* How a configuration runs one GEMM C = A . B^T of a linear layer. */
typedef struct lowp_linear_gemm_plan {
    int32_t quantized;    /* 1: both operands quantized per cfg; 0: both rounded to BF16 */
    int32_t a_role;       /* operand A: 0 input, 1 weight, 2 grad_output (lowp_role's values) */
    int32_t a_columnwise; /* 1: A is that operand's columnwise copy (quantized along tokens) */
    int32_t b_role;
    int32_t b_columnwise;
    int32_t b_kn; /* 1: B is the forward's copy read as stored [K, N] (lowp_gemm_kn): no second
                     weight copy (both GEMMs take W in one kind whose copy of W^T is W's copy
                     transposed) */
} lowp_linear_gemm_plan;

typedef struct lowp_linear_plan {
    lowp_linear_gemm_plan gemm[LOWP_LINEAR_GEMM_COUNT];
} lowp_linear_plan;

/* The plan of `cfg` (which need not be checked: only its formats, the weight's scaling and
 * wgrad_hp are read). The training layer's linear forward and backward follow it. */
LOWP_API lowp_status lowp_linear_plan_get(const lowp_linear_cfg *cfg, lowp_linear_plan *plan);

#ifdef __cplusplus
}
#endif
#endif
