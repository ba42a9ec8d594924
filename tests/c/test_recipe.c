/* Recipes: every built-in recipe and preset builds and passes validation, name patterns match
 * as shell globs with the first rule winning, the built-ins keep embeddings, the output head
 * and routers in high precision and send each part of a MoE model to its format, and bad
 * recipes and configurations are refused with messages. */
#include <string.h>

#include "lowp/lowp.h"
#include "testutil.h"
#include "train/train_internal.h"

/* The preset a recipe gives `name`, "hp" for high precision, "none" when no rule matches. */
static const char *decide(const lowp_recipe *r, const char *name) {
    const lowp_recipe_rule *rule = NULL;
    if (lowp_recipe_match(r, name, &rule) != LOWP_OK) return "error";
    if (!rule) return "none";
    if (rule->high_precision) return "hp";
    return lowp_linear_cfg_name(&rule->cfg);
}

static void test_builtins(void) {
    static const char *const names[] = {"bf16",      "fp8_delayed", "fp8_current",   "fp8_rowwise",
                                        "all_mxfp8", "block128",    "all_block_fp8", "mix",
                                        "mix_fp4",   "nvfp4",       "mxfp4"};
    static const char *const presets[] = {"bf16",  "fp8_delayed", "fp8_current", "fp8_rowwise",
                                          "mxfp8", "block128",    "block_fp8",   "mxfp8",
                                          "mxfp8", "nvfp4",       "mxfp4"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        lowp_recipe r;
        CHECKF(lowp_recipe_init(&r, names[i]) == LOWP_OK, "%s: %s", names[i], lowp_last_error());
        CHECK(strcmp(r.name, names[i]) == 0);
        CHECK(strstr(lowp_recipe_names(), names[i]) != NULL);
        for (int32_t k = 0; k < r.nrules; k++)
            if (!r.rules[k].high_precision)
                CHECKF(lowp_linear_cfg_check("test", &r.rules[k].cfg) == LOWP_OK, "%s rule %d: %s",
                       names[i], k, lowp_last_error());
        /* High precision in every built-in recipe. */
        CHECK(strcmp(decide(&r, "embed.tokens"), "hp") == 0);
        CHECK(strcmp(decide(&r, "model.embed_tokens"), "hp") == 0);
        CHECK(strcmp(decide(&r, "head"), "hp") == 0);
        CHECK(strcmp(decide(&r, "model.lm_head"), "hp") == 0);
        CHECK(strcmp(decide(&r, "layers.3.moe.router"), "hp") == 0);
        /* Everything else: the recipe's dense preset. */
        CHECKF(strcmp(decide(&r, "layers.0.attn.wq"), presets[i]) == 0, "%s: attn.wq -> %s",
               names[i], decide(&r, "layers.0.attn.wq"));
        CHECK(strcmp(decide(&r, "layers.0.mlp.fc1"), presets[i]) == 0);
        /* torchtitan's names (lowp.torch reads this table): the head is `output`, or
         * `lm_head`; embeddings, norms and routers as above. */
        CHECK(strcmp(decide(&r, "output.weight"), "hp") == 0);
        CHECK(strcmp(decide(&r, "lm_head.weight"), "hp") == 0);
        CHECK(strcmp(decide(&r, "tok_embeddings.weight"), "hp") == 0);
        CHECK(strcmp(decide(&r, "layers.1.attention_norm.weight"), "hp") == 0);
        CHECK(strcmp(decide(&r, "layers.1.moe.router.gate.weight"), "hp") == 0);
        CHECK(strcmp(decide(&r, "layers.0.attention.wq.weight"), presets[i]) == 0);
        CHECK(strcmp(decide(&r, "layers.0.feed_forward.w1.weight"), presets[i]) == 0);
    }
    /* torchtitan 0.3.0 names routed experts layers.N.moe.routed_experts.inner_experts.w1_EFD;
     * older versions layers.N.moe.experts.w1 (as lowp's models) */
    static const char *const routed[] = {"layers.1.moe.routed_experts.inner_experts.w1_EFD",
                                         "layers.1.moe.routed_experts.inner_experts.w2_EDF",
                                         "layers.1.moe.experts.w3"};
    static const char *const shared[] = {"layers.1.moe.shared_experts.w1.weight",
                                         "layers.1.moe.shared.w2"};
    for (int k = 0; k < 2; k++) {
        lowp_recipe m;
        CHECK(lowp_recipe_init(&m, k ? "mix_fp4" : "mix") == LOWP_OK);
        for (size_t i = 0; i < sizeof routed / sizeof routed[0]; i++)
            CHECKF(strcmp(decide(&m, routed[i]), k ? "block_fp8_fp4" : "block_fp8") == 0, "%s",
                   routed[i]);
        for (size_t i = 0; i < sizeof shared / sizeof shared[0]; i++)
            CHECKF(strcmp(decide(&m, shared[i]), "mxfp8") == 0, "%s", shared[i]);
    }
    lowp_recipe r;
    CHECK(lowp_recipe_init(&r, "mix") == LOWP_OK);
    CHECK(strcmp(decide(&r, "layers.1.moe.shared_experts.w1"), "mxfp8") == 0);
    CHECK(strcmp(decide(&r, "layers.1.moe.experts.w1"), "block_fp8") == 0);
    CHECK(strcmp(decide(&r, "layers.1.attn.wo"), "mxfp8") == 0);
    /* lowp's own model (model.h) names them moe.shared.* and moe.experts.*; norms stay plain. */
    CHECK(strcmp(decide(&r, "layers.1.moe.shared.w3"), "mxfp8") == 0);
    CHECK(strcmp(decide(&r, "layers.1.moe.experts.w3"), "block_fp8") == 0);
    CHECK(strcmp(decide(&r, "layers.1.ffn_norm"), "hp") == 0);
    CHECK(strcmp(decide(&r, "final_norm"), "hp") == 0);
    CHECK(lowp_recipe_init(&r, "mix_fp4") == LOWP_OK);
    CHECK(strcmp(decide(&r, "layers.1.moe.experts.w2"), "block_fp8_fp4") == 0);
    CHECK(strcmp(decide(&r, "layers.1.moe.shared_expert.w2"), "mxfp8") == 0);
    CHECK(lowp_recipe_init(&r, "all_block_fp8") == LOWP_OK);
    CHECK(strcmp(decide(&r, "layers.1.moe.experts.w1"), "block_fp8") == 0);

    CHECK(lowp_recipe_init(&r, "custom") == LOWP_OK);
    CHECK(r.nrules == 0);
    CHECK(strcmp(decide(&r, "anything"), "none") == 0);
}

static void test_presets(void) {
    static const char *const names[] = {"bf16",  "fp8_delayed", "fp8_current", "fp8_rowwise",
                                        "mxfp8", "block128",    "block_fp8",   "block_fp8_fp4",
                                        "nvfp4", "mxfp4"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        lowp_linear_cfg c;
        CHECKF(lowp_linear_cfg_preset(names[i], &c) == LOWP_OK, "%s", lowp_last_error());
        CHECKF(lowp_linear_cfg_check("test", &c) == LOWP_OK, "%s: %s", names[i], lowp_last_error());
        CHECK(strcmp(lowp_linear_cfg_name(&c), names[i]) == 0);
    }
    lowp_linear_cfg c;
    CHECK(lowp_linear_cfg_preset("fp8_delayed", &c) == LOWP_OK);
    CHECK(c.input.format == LOWP_FORMAT_E4M3 && c.weight.format == LOWP_FORMAT_E4M3 &&
          c.grad_output.format == LOWP_FORMAT_E5M2); /* HYBRID */
    CHECK(c.input.delayed && c.weight.delayed && c.grad_output.delayed);
    CHECK(c.delayed.history_len == 1024 && c.delayed.algo == LOWP_AMAX_ALGO_MAX);
    CHECK(lowp_linear_cfg_preset("fp8_current", &c) == LOWP_OK);
    CHECK(!c.input.delayed && c.grad_output.format == LOWP_FORMAT_E5M2);
    CHECK(lowp_linear_cfg_preset("block128", &c) == LOWP_OK);
    CHECK(c.weight.scaling == LOWP_SCALING_BLOCK128X128 &&
          c.input.scaling == LOWP_SCALING_BLOCK128);
    CHECK(lowp_linear_cfg_preset("block_fp8", &c) == LOWP_OK);
    CHECK(c.weight.scaling == LOWP_SCALING_BLOCK32X32 && c.input.scaling == LOWP_SCALING_MX32 &&
          !c.fake_quant_mxfp4);
    CHECK(lowp_linear_cfg_preset("block_fp8_fp4", &c) == LOWP_OK);
    CHECK(c.fake_quant_mxfp4 == 1);
    c.keep_quantized ^= 1;
    CHECK(strcmp(lowp_linear_cfg_name(&c), "custom") == 0);

    CHECK(lowp_linear_cfg_preset("fp9", &c) == LOWP_ERR_NOT_FOUND);
    CHECK(strstr(lowp_last_error(), "fp9") != NULL);
    CHECK(lowp_linear_cfg_preset(NULL, &c) == LOWP_ERR_INVALID_ARG);
    CHECK(lowp_linear_cfg_preset("mxfp8", NULL) == LOWP_ERR_INVALID_ARG);
}

static void test_globs(void) {
    lowp_recipe r;
    lowp_linear_cfg mx, blk;
    lowp_linear_cfg_preset("mxfp8", &mx);
    lowp_linear_cfg_preset("block_fp8", &blk);
    CHECK(lowp_recipe_init(&r, "custom") == LOWP_OK);
    CHECK(lowp_recipe_append(&r, "*router*", NULL) == LOWP_OK);
    CHECK(lowp_recipe_append(&r, "layers.[0-3].*.w?", &blk) == LOWP_OK);
    CHECK(lowp_recipe_append(&r, "layers.[!0-3].attn.*", &mx) == LOWP_OK);
    CHECK(lowp_recipe_append(&r, "exact\\*name", &blk) == LOWP_OK);
    CHECK(lowp_recipe_append(&r, "*", &mx) == LOWP_OK); /* first match wins: this is last */
    CHECK(r.nrules == 5);
    CHECK(strcmp(decide(&r, "layers.2.router"), "hp") == 0);
    CHECK(strcmp(decide(&r, "layers.2.attn.wq"), "block_fp8") == 0);
    CHECK(strcmp(decide(&r, "layers.2.attn.wqk"), "mxfp8") == 0); /* ? is one character */
    CHECK(strcmp(decide(&r, "layers.7.attn.wq"), "mxfp8") == 0);
    CHECK(strcmp(decide(&r, "exact*name"), "block_fp8") == 0);
    CHECK(strcmp(decide(&r, "exactXname"), "mxfp8") == 0);
    const lowp_recipe_rule *rule;
    CHECK(lowp_recipe_match(&r, "layers.7.attn.wq", &rule) == LOWP_OK && rule == &r.rules[2]);

    /* Glob corner cases through a recipe with a single rule. */
    struct {
        const char *pat, *name;
        int hit;
    } cases[] = {
        {"a*b*c", "aXXbYYc", 1},
        {"a*b*c", "aXXbYY", 0},
        {"*", "", 1},
        {"*.w1", "x.w1", 1},
        {"*.w1", "x.w12", 0},
        {"a**b", "ab", 1},
        {"[]x]", "]", 1},
        {"[]x]", "x", 1},
        {"[]x]", "y", 0},
        {"[^a]b", "cb", 1},
        {"[^a]b", "ab", 0},
        {"[a", "[a", 1},
        {"?", "", 0},
        {"*a", "aaaa", 1},
        {"*ab", "aab", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lowp_recipe one;
        lowp_recipe_init(&one, "custom");
        CHECK(lowp_recipe_append(&one, cases[i].pat, NULL) == LOWP_OK);
        CHECK(lowp_recipe_match(&one, cases[i].name, &rule) == LOWP_OK);
        CHECKF((rule != NULL) == cases[i].hit, "pattern \"%s\" on \"%s\"", cases[i].pat,
               cases[i].name);
    }
}

static void test_bad(void) {
    lowp_recipe r;
    lowp_linear_cfg mx;
    lowp_linear_cfg_preset("mxfp8", &mx);
    CHECK(lowp_recipe_init(&r, "fp7") == LOWP_ERR_NOT_FOUND);
    CHECK(strstr(lowp_last_error(), "fp7") != NULL && strstr(lowp_last_error(), "all_mxfp8"));
    CHECK(lowp_recipe_init(NULL, "mix") == LOWP_ERR_INVALID_ARG);
    CHECK(lowp_recipe_init(&r, NULL) == LOWP_ERR_INVALID_ARG);
    CHECK(lowp_recipe_init(&r, "custom") == LOWP_OK);
    CHECK(lowp_recipe_append(&r, NULL, &mx) == LOWP_ERR_INVALID_ARG);
    CHECK(lowp_recipe_append(&r, "", &mx) == LOWP_ERR_INVALID_ARG);
    char longp[80];
    memset(longp, 'a', sizeof longp - 1);
    longp[sizeof longp - 1] = '\0';
    CHECK(lowp_recipe_append(&r, longp, &mx) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "pattern") != NULL);
    for (int i = 0; i < LOWP_RECIPE_MAX_RULES; i++)
        CHECK(lowp_recipe_append(&r, "*", &mx) == LOWP_OK);
    CHECK(lowp_recipe_append(&r, "*", &mx) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "nrules") != NULL);
    const lowp_recipe_rule *rule;
    CHECK(lowp_recipe_match(&r, NULL, &rule) == LOWP_ERR_INVALID_ARG);
    CHECK(lowp_recipe_match(&r, "x", NULL) == LOWP_ERR_INVALID_ARG);

    /* Configurations whose GEMMs lowp cannot multiply, or whose fields are out of range. */
    lowp_recipe_init(&r, "custom");
    lowp_linear_cfg c = mx;
    c.weight.scaling = LOWP_SCALING_ROW; /* MX32 x ROW */
    CHECK(lowp_recipe_append(&r, "*", &c) == LOWP_ERR_UNSUPPORTED);
    CHECKF(strstr(lowp_last_error(), "forward") && strstr(lowp_last_error(), "cfg.weight"), "%s",
           lowp_last_error());
    c = mx;
    c.grad_output.scaling = LOWP_SCALING_TENSOR; /* dgrad TENSOR x MX32 */
    CHECK(lowp_recipe_append(&r, "*", &c) == LOWP_ERR_UNSUPPORTED);
    CHECK(strstr(lowp_last_error(), "dgrad") != NULL);
    c.wgrad_hp = 1; /* the wgrad in BF16 does not save the dgrad pair */
    CHECK(lowp_recipe_append(&r, "*", &c) == LOWP_ERR_UNSUPPORTED);
    c = mx;
    c.input.scaling = LOWP_SCALING_BLOCK32X32; /* a weight tiling for an activation */
    CHECK(lowp_recipe_append(&r, "*", &c) == LOWP_ERR_UNSUPPORTED);
    CHECK(strstr(lowp_last_error(), "cfg.input.scaling") != NULL);
    c = mx;
    c.input.delayed = 1; /* delayed needs tensor scaling */
    CHECK(lowp_recipe_append(&r, "*", &c) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "delayed") != NULL);
    c = mx;
    c.weight.format = LOWP_FORMAT_F32;
    CHECK(lowp_recipe_append(&r, "*", &c) == LOWP_ERR_INVALID_ARG);
    c = mx;
    c.keep_quantized = 2;
    CHECK(lowp_recipe_append(&r, "*", &c) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "keep_quantized") != NULL);
    lowp_linear_cfg_preset("fp8_delayed", &c);
    c.delayed.history_len = 0;
    CHECK(lowp_recipe_append(&r, "*", &c) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "history_len") != NULL);
    CHECK(r.nrules == 0); /* nothing refused was added */

    /* Mixed precision that is allowed: a BF16 input makes the forward and wgrad BF16. */
    c = mx;
    c.input.format = LOWP_FORMAT_BF16;
    CHECKF(lowp_recipe_append(&r, "*", &c) == LOWP_OK, "%s", lowp_last_error());
    /* MXFP4 weights and activations (MX32 x MX32 e2m1). */
    c = mx;
    c.weight.format = LOWP_FORMAT_E2M1;
    CHECKF(lowp_recipe_append(&r, "*", &c) == LOWP_OK, "%s", lowp_last_error());
    c.weight.scaling = LOWP_SCALING_BLOCK32X32;
    CHECK(lowp_recipe_append(&r, "*", &c) == LOWP_ERR_UNSUPPORTED);
}

/* The FP4 presets (docs/numerics.md 4b) and the recipes' last-block rule: `{last}` bound from the
 * names by lowp_train_prepare (the highest N of a `layers.N.`), not before. */
static void test_fp4(void) {
    lowp_linear_cfg c;
    CHECK_OK(lowp_linear_cfg_preset("nvfp4", &c));
    CHECK(c.input.format == LOWP_FORMAT_E2M1 && c.input.scaling == LOWP_SCALING_NV16 &&
          c.weight.format == LOWP_FORMAT_E2M1 && c.weight.scaling == LOWP_SCALING_NV16X16 &&
          c.grad_output.format == LOWP_FORMAT_E2M1 && c.grad_output.scaling == LOWP_SCALING_NV16);
    CHECK(c.input.rounding == LOWP_ROUNDING_RNE && c.weight.rounding == LOWP_ROUNDING_RNE &&
          c.grad_output.rounding == LOWP_ROUNDING_SR && c.wgrad_hadamard == 1 &&
          c.keep_quantized == 0 && c.wgrad_hp == 0);
    lowp_linear_plan plan;
    CHECK_OK(lowp_linear_plan_get(&c, &plan));
    CHECK(plan.gemm[LOWP_LINEAR_FORWARD].quantized && plan.gemm[LOWP_LINEAR_DGRAD].quantized &&
          plan.gemm[LOWP_LINEAR_WGRAD].quantized && plan.gemm[LOWP_LINEAR_DGRAD].b_kn);
    CHECK_OK(lowp_linear_cfg_preset("mxfp4", &c));
    CHECK(c.input.format == LOWP_FORMAT_E2M1 && c.input.scaling == LOWP_SCALING_MX32 &&
          c.weight.scaling == LOWP_SCALING_MX32 && c.grad_output.scaling == LOWP_SCALING_MX32 &&
          c.grad_output.scale_mode == LOWP_SCALE_MODE_RCEIL &&
          c.grad_output.rounding == LOWP_ROUNDING_SR && c.input.rounding == LOWP_ROUNDING_RNE &&
          c.wgrad_hadamard == 1 && c.keep_quantized == 0);
    /* Changing either new field makes it another configuration. */
    c.wgrad_hadamard = 0;
    CHECK(strcmp(lowp_linear_cfg_name(&c), "custom") == 0);
    c.wgrad_hadamard = 1;
    c.grad_output.rounding = LOWP_ROUNDING_RNE;
    CHECK(strcmp(lowp_linear_cfg_name(&c), "custom") == 0);
    /* Refused: SR of a non-e2m1 operand, a bad rounding, the transform with a saved X copy or
     * a BF16 wgrad, NV kinds with other elements, 16x16 tiles for an activation. */
    lowp_linear_cfg_preset("nvfp4", &c);
    lowp_linear_cfg bad = c;
    bad.grad_output.rounding = (lowp_rounding) 7;
    CHECK_FAIL(lowp_linear_cfg_check("t", &bad), LOWP_ERR_INVALID_ARG, "cfg.grad_output.rounding");
    lowp_linear_cfg_preset("mxfp8", &bad);
    bad.grad_output.rounding = LOWP_ROUNDING_SR;
    CHECK_FAIL(lowp_linear_cfg_check("t", &bad), LOWP_ERR_UNSUPPORTED, "cfg.grad_output.rounding");
    bad = c;
    bad.keep_quantized = 1;
    CHECK_FAIL(lowp_linear_cfg_check("t", &bad), LOWP_ERR_INVALID_ARG, "cfg.wgrad_hadamard");
    bad = c;
    bad.wgrad_hp = 1;
    CHECK_FAIL(lowp_linear_cfg_check("t", &bad), LOWP_ERR_INVALID_ARG, "cfg.wgrad_hadamard");
    bad = c;
    bad.wgrad_hadamard = 2;
    CHECK_FAIL(lowp_linear_cfg_check("t", &bad), LOWP_ERR_INVALID_ARG, "cfg.wgrad_hadamard");
    bad = c;
    bad.input.format = LOWP_FORMAT_E4M3;
    CHECK_FAIL(lowp_linear_cfg_check("t", &bad), LOWP_ERR_UNSUPPORTED, "cfg.input.scaling");
    bad = c;
    bad.input.scaling = LOWP_SCALING_NV16X16;
    CHECK_FAIL(lowp_linear_cfg_check("t", &bad), LOWP_ERR_UNSUPPORTED, "cfg.input.scaling");

    /* The recipes: the last block in high precision once bound, every other weight FP4. */
    for (int k = 0; k < 2; k++) {
        const char *name = k ? "mxfp4" : "nvfp4";
        lowp_recipe r;
        CHECK_OK(lowp_recipe_init(&r, name));
        CHECK(strcmp(decide(&r, "layers.3.attn.wq"), name) == 0); /* unbound: literal {last} */
        CHECK_OK(lowp_recipe_bind_last(&r, 3));
        CHECK(strcmp(decide(&r, "layers.3.attn.wq"), "hp") == 0);
        CHECK(strcmp(decide(&r, "model.layers.3.moe.experts.w1"), "hp") == 0);
        CHECK(strcmp(decide(&r, "layers.2.attn.wq"), name) == 0);
        CHECK(strcmp(decide(&r, "layers.31.attn.wq"), name) == 0);
        CHECK(strcmp(decide(&r, "layers.2.moe.experts.w1"), name) == 0);
        CHECK(strcmp(decide(&r, "layers.0.feed_forward.w1.weight"), name) == 0);
        CHECK(strcmp(decide(&r, "output.weight"), "hp") == 0);
    }
    lowp_recipe r;
    CHECK_OK(lowp_recipe_init(&r, "mix"));
    const lowp_recipe before = r;
    CHECK_OK(lowp_recipe_bind_last(&r, 5)); /* no {last}: unchanged */
    CHECK(memcmp(&before, &r, sizeof r) == 0);
    CHECK_FAIL(lowp_recipe_bind_last(NULL, 1), LOWP_ERR_INVALID_ARG, "recipe");

    /* lowp_train_prepare binds {last} from the names it is given: of blocks 0..2, block 2. */
    float w[16 * 16] = {0}, g[16 * 16] = {0};
    lowp_param ps[4];
    static const char *const names[] = {"layers.0.attn.wq", "layers.1.attn.wq", "layers.2.attn.wq",
                                        "head"};
    for (int i = 0; i < 4; i++)
        ps[i] = (lowp_param){.name = names[i],
                             .rows = 16,
                             .cols = 16,
                             .data = w,
                             .grad = g,
                             .device = LOWP_DEVICE_HOST};
    CHECK_OK(lowp_recipe_init(&r, "nvfp4"));
    CHECK_OK(lowp_train_prepare(ps, 4, &r));
    CHECK(ps[0].wrap && ps[1].wrap && !ps[2].wrap && !ps[3].wrap);
    CHECK(strcmp(r.rules[8].pattern, "layers.{last}.*") == 0); /* the caller's recipe unchanged */
    CHECK_OK(lowp_train_convert(ps, 4));
    CHECK_OK(lowp_train_prepare(ps, 2, &r)); /* only blocks 0 and 1: block 1 is the last */
    CHECK(ps[0].wrap && !ps[1].wrap);
    CHECK_OK(lowp_train_convert(ps, 2));
}

int main(void) {
    test_builtins();
    test_fp4();
    test_presets();
    test_globs();
    test_bad();
    return testutil_finish();
}
