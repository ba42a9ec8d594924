/* The tables the Python package reads (lowp._lowp.tables()): the scaling traits against the
 * kinds' documented rules (scale.h's layout table) and against what the kernels do with the
 * defaults, the scale-mode names, the GEMM pairs of gemm.h, the walk over presets and recipes,
 * and the linear plan of every preset and of the mixed cases, written out here by hand. */
#include <string.h>

#include "lowp/lowp.h"
#include "testutil.h"

typedef struct kind_row {
    lowp_scaling s;
    const char *name;
    int64_t br, bc;
    int e8m0, grouped, transposes;
    lowp_scale_mode mode;
    int pow2;
    lowp_format scale_format;
    int tensor_scale;
} kind_row;

/* scale.h: block shapes and scale types; grouped copies for the 1-D token-blocked kinds; the
 * kinds whose copy of X^T is X's copy transposed (lowp_gemm_kn); RCEIL for MX, FLOOR for 32x32
 * tiles, pow2 on for ROW only. */
static const kind_row k_kinds[] = {
    {LOWP_SCALING_TENSOR, "tensor", 0, 0, 0, 0, 1, LOWP_SCALE_MODE_DEFAULT, 0, LOWP_FORMAT_F32, 0},
    {LOWP_SCALING_ROW, "row", 1, 0, 0, 0, 0, LOWP_SCALE_MODE_DEFAULT, 1, LOWP_FORMAT_F32, 0},
    {LOWP_SCALING_MX32, "mx32", 1, 32, 1, 1, 0, LOWP_SCALE_MODE_RCEIL, 0, LOWP_FORMAT_E8M0, 0},
    {LOWP_SCALING_BLOCK128, "block128", 1, 128, 0, 1, 0, LOWP_SCALE_MODE_DEFAULT, 0,
     LOWP_FORMAT_F32, 0},
    {LOWP_SCALING_BLOCK128X128, "block128x128", 128, 128, 0, 0, 1, LOWP_SCALE_MODE_DEFAULT, 0,
     LOWP_FORMAT_F32, 0},
    {LOWP_SCALING_BLOCK32X32, "block32x32", 32, 32, 1, 0, 1, LOWP_SCALE_MODE_FLOOR, 0,
     LOWP_FORMAT_E8M0, 0},
    {LOWP_SCALING_NONE, "none", 0, 0, 0, 0, 1, LOWP_SCALE_MODE_DEFAULT, 0, LOWP_FORMAT_F32, 0},
    {LOWP_SCALING_NV16, "nv16", 1, 16, 0, 1, 0, LOWP_SCALE_MODE_DEFAULT, 0, LOWP_FORMAT_E4M3, 1},
    {LOWP_SCALING_NV16X16, "nv16x16", 16, 16, 0, 0, 1, LOWP_SCALE_MODE_DEFAULT, 0, LOWP_FORMAT_E4M3,
     1},
};

/* The scale of a 32x32 block of value v quantized to e4m3 in kind s with mode / pow2. */
static void one_block(lowp_scaling s, lowp_scale_mode mode, int32_t pow2, float v, uint8_t *e8,
                      float *f32) {
    static float x[32 * 32];
    static uint8_t data[32 * 32];
    static float scales[32];
    for (int i = 0; i < 32 * 32; i++) x[i] = v;
    lowp_tensor t = {LOWP_FORMAT_F32, 32, 32, x, LOWP_DEVICE_HOST};
    lowp_qtensor q = {LOWP_FORMAT_E4M3, s, 32, 32, data, scales, LOWP_DEVICE_HOST, NULL, 0};
    lowp_quant_cfg cfg;
    lowp_quant_cfg_init(&cfg);
    cfg.scale_mode = mode;
    cfg.pow2_scales = pow2;
    CHECK_OK(lowp_quantize(&t, &q, NULL, &cfg));
    *e8 = ((uint8_t *) scales)[0];
    *f32 = scales[0];
}

static void test_scalings(void) {
    CHECK(sizeof k_kinds / sizeof k_kinds[0] == LOWP_SCALING_COUNT);
    static const int32_t offs[2] = {40, 64};
    for (int i = 0; i < LOWP_SCALING_COUNT; i++) {
        const kind_row *k = &k_kinds[i];
        const lowp_scaling_traits *t;
        CHECK_OK(lowp_scaling_get(k->s, &t));
        CHECKF(t->scaling == k->s && strcmp(t->name, k->name) == 0 && t->block_rows == k->br &&
                   t->block_cols == k->bc && t->scale_is_e8m0 == k->e8m0 &&
                   t->grouped == k->grouped && t->transposes == k->transposes &&
                   t->default_mode == k->mode && t->default_pow2 == k->pow2 &&
                   t->scale_format == k->scale_format && t->tensor_scale == k->tensor_scale,
               "%s", k->name);
        /* grouped: what lowp_qtensor_scale_shape accepts */
        lowp_qtensor g = {LOWP_FORMAT_E4M3, k->s, 16, 64, NULL, NULL, LOWP_DEVICE_HOST, offs, 2};
        int64_t sr, sc;
        CHECKF((lowp_qtensor_scale_shape(&g, &sr, &sc, NULL) == LOWP_OK) == k->grouped, "%s",
               k->name);
    }
    const lowp_scaling_traits *t;
    CHECK_FAIL(lowp_scaling_get(LOWP_SCALING_COUNT, &t), LOWP_ERR_INVALID_ARG, "scaling (9)");
    CHECK_FAIL(lowp_scaling_get(LOWP_SCALING_MX32, NULL), LOWP_ERR_INVALID_ARG, "out");
}

/* The defaults as the kernels apply them: amax 500 in e4m3 is 2^1 under RCEIL (500/448 rounds
 * up) and 2^0 under FLOOR (floor(log2 500) - 8); a row scale 448/500 is 0.896, or 0.5 as a power
 * of two. */
static void test_defaults(void) {
    uint8_t e8, e8_want;
    float f, f_want;
    one_block(LOWP_SCALING_MX32, LOWP_SCALE_MODE_DEFAULT, -1, 500.0f, &e8, &f);
    one_block(LOWP_SCALING_MX32, LOWP_SCALE_MODE_RCEIL, -1, 500.0f, &e8_want, &f);
    CHECK(e8 == e8_want && e8 == 128);
    one_block(LOWP_SCALING_BLOCK32X32, LOWP_SCALE_MODE_DEFAULT, -1, 500.0f, &e8, &f);
    one_block(LOWP_SCALING_BLOCK32X32, LOWP_SCALE_MODE_FLOOR, -1, 500.0f, &e8_want, &f);
    CHECK(e8 == e8_want && e8 == 127);
    one_block(LOWP_SCALING_ROW, LOWP_SCALE_MODE_DEFAULT, -1, 500.0f, &e8, &f);
    one_block(LOWP_SCALING_ROW, LOWP_SCALE_MODE_DEFAULT, 1, 500.0f, &e8, &f_want);
    CHECK(f == f_want && f == 2.0f); /* scale_inv of 0.5 */
    one_block(LOWP_SCALING_TENSOR, LOWP_SCALE_MODE_DEFAULT, -1, 500.0f, &e8, &f);
    one_block(LOWP_SCALING_TENSOR, LOWP_SCALE_MODE_DEFAULT, 0, 500.0f, &e8, &f_want);
    CHECK(f == f_want && f != 2.0f);
}

static void test_mode_names(void) {
    static const char *const names[] = {"default", "rceil", "floor", "ceil", "even"};
    for (int m = 0; m < 5; m++) {
        lowp_scale_mode back;
        CHECK(strcmp(lowp_scale_mode_name((lowp_scale_mode) m), names[m]) == 0);
        CHECK(lowp_scale_mode_from_name(names[m], &back) == LOWP_OK && (int) back == m);
    }
    CHECK(strcmp(lowp_scale_mode_name((lowp_scale_mode) 5), "?") == 0);
    CHECK(strcmp(lowp_scale_mode_name((lowp_scale_mode) -1), "?") == 0);
}

static int pair_ok(lowp_format fa, lowp_scaling sa, lowp_format fb, lowp_scaling sb) {
    lowp_qtensor a = {fa, sa, 0, 0, NULL, NULL, LOWP_DEVICE_HOST, NULL, 0};
    lowp_qtensor b = {fb, sb, 0, 0, NULL, NULL, LOWP_DEVICE_HOST, NULL, 0};
    return lowp_gemm_pair_check(&a, &b) == LOWP_OK;
}

/* gemm.h's list of pairs. */
static void test_pairs(void) {
    const lowp_format E4 = LOWP_FORMAT_E4M3, E5 = LOWP_FORMAT_E5M2, F4 = LOWP_FORMAT_E2M1;
    CHECK(pair_ok(LOWP_FORMAT_F32, LOWP_SCALING_NONE, LOWP_FORMAT_F32, LOWP_SCALING_NONE));
    CHECK(pair_ok(LOWP_FORMAT_BF16, LOWP_SCALING_NONE, LOWP_FORMAT_BF16, LOWP_SCALING_NONE));
    CHECK(!pair_ok(LOWP_FORMAT_F32, LOWP_SCALING_NONE, LOWP_FORMAT_BF16, LOWP_SCALING_NONE));
    CHECK(pair_ok(E5, LOWP_SCALING_TENSOR, E4, LOWP_SCALING_TENSOR));
    CHECK(pair_ok(E4, LOWP_SCALING_ROW, E5, LOWP_SCALING_ROW));
    CHECK(pair_ok(F4, LOWP_SCALING_MX32, E4, LOWP_SCALING_MX32));
    CHECK(pair_ok(E4, LOWP_SCALING_MX32, E4, LOWP_SCALING_BLOCK32X32));
    CHECK(pair_ok(E4, LOWP_SCALING_BLOCK128, E4, LOWP_SCALING_BLOCK128X128));
    CHECK(pair_ok(E4, LOWP_SCALING_BLOCK128, E4, LOWP_SCALING_BLOCK128));
    CHECK(!pair_ok(E4, LOWP_SCALING_BLOCK32X32, E4, LOWP_SCALING_MX32));
    CHECK(!pair_ok(E4, LOWP_SCALING_ROW, E4, LOWP_SCALING_TENSOR));
    CHECK(!pair_ok(F4, LOWP_SCALING_TENSOR, F4, LOWP_SCALING_TENSOR));
    CHECK(!pair_ok(E4, LOWP_SCALING_BLOCK128, F4, LOWP_SCALING_BLOCK128X128));
    CHECK(pair_ok(F4, LOWP_SCALING_NV16, F4, LOWP_SCALING_NV16));
    CHECK(pair_ok(F4, LOWP_SCALING_NV16, F4, LOWP_SCALING_NV16X16));
    CHECK(pair_ok(F4, LOWP_SCALING_NV16X16, F4, LOWP_SCALING_NV16));
    CHECK(!pair_ok(E4, LOWP_SCALING_NV16, E4, LOWP_SCALING_NV16));
    CHECK(!pair_ok(F4, LOWP_SCALING_NV16, F4, LOWP_SCALING_MX32));
    lowp_qtensor a = {E4, LOWP_SCALING_ROW, 0, 0, NULL, NULL, LOWP_DEVICE_HOST, NULL, 0};
    lowp_qtensor b = {E4, LOWP_SCALING_MX32, 0, 0, NULL, NULL, LOWP_DEVICE_HOST, NULL, 0};
    CHECK_FAIL(lowp_gemm_pair_check(&a, &b), LOWP_ERR_UNSUPPORTED, "a (row e4m3) x b (mx32 e4m3)");
    CHECK_FAIL(lowp_gemm_pair_check(&a, NULL), LOWP_ERR_INVALID_ARG, "b");
}

/* The walks give every name the comma lists and the parsers know, and stop with NULL. */
static void test_walks(void) {
    int32_t n = 0;
    size_t len = 0;
    for (const char *r; (r = lowp_recipe_name_at(n)) != NULL; n++) {
        lowp_recipe rec;
        CHECKF(lowp_recipe_init(&rec, r) == LOWP_OK, "%s", r);
        CHECK(strstr(lowp_recipe_names(), r) != NULL);
        len += strlen(r) + 1;
    }
    CHECK(n == 11 && len == strlen(lowp_recipe_names()) + 1);
    CHECK(lowp_recipe_name_at(-1) == NULL);
    static const char *const presets[] = {"bf16",  "fp8_delayed", "fp8_current", "fp8_rowwise",
                                          "mxfp8", "block128",    "block_fp8",   "block_fp8_fp4",
                                          "nvfp4", "mxfp4"};
    for (n = 0; lowp_linear_cfg_preset_name(n) != NULL; n++) {
        const char *p = lowp_linear_cfg_preset_name(n);
        lowp_linear_cfg c;
        CHECKF(n < 10 && strcmp(p, presets[n]) == 0, "preset %d: %s", n, p);
        CHECK(lowp_linear_cfg_preset(p, &c) == LOWP_OK);
        CHECKF(strcmp(lowp_linear_cfg_name(&c), p) == 0, "%s", p);
    }
    CHECK(n == 10 && lowp_linear_cfg_preset_name(-1) == NULL);
}

/* One expected plan: quantized forward, dgrad, wgrad, and whether the dgrad reads W as stored. */
static void check_plan(const lowp_linear_cfg *c, int fwd, int dgrad, int wgrad, int kn,
                       const char *what) {
    lowp_linear_plan p;
    CHECK_OK(lowp_linear_plan_get(c, &p));
    const lowp_linear_gemm_plan *g = p.gemm;
    CHECKF(g[LOWP_LINEAR_FORWARD].quantized == fwd && g[LOWP_LINEAR_DGRAD].quantized == dgrad &&
               g[LOWP_LINEAR_WGRAD].quantized == wgrad && g[LOWP_LINEAR_DGRAD].b_kn == kn,
           "%s: %d %d %d kn %d", what, g[0].quantized, g[1].quantized, g[2].quantized, g[1].b_kn);
    /* the operands: X . W^T, dY . W (W's columnwise copy unless kn), dY^T . X on both
     * columnwise copies */
    CHECK(g[0].a_role == LOWP_ROLE_INPUT && !g[0].a_columnwise);
    CHECK(g[0].b_role == LOWP_ROLE_WEIGHT && !g[0].b_columnwise && !g[0].b_kn);
    CHECK(g[1].a_role == LOWP_ROLE_GRAD_OUTPUT && !g[1].a_columnwise);
    CHECK(g[1].b_role == LOWP_ROLE_WEIGHT && g[1].b_columnwise == !kn);
    CHECK(g[2].a_role == LOWP_ROLE_GRAD_OUTPUT && g[2].a_columnwise);
    CHECK(g[2].b_role == LOWP_ROLE_INPUT && g[2].b_columnwise && !g[2].b_kn);
}

static void test_plan(void) {
    static const struct {
        const char *preset;
        int kn;
    } all_q[] = {{"fp8_delayed", 1}, {"fp8_current", 1}, {"fp8_rowwise", 0},  {"mxfp8", 0},
                 {"block128", 1},    {"block_fp8", 1},   {"block_fp8_fp4", 1}};
    lowp_linear_cfg c;
    for (size_t i = 0; i < sizeof all_q / sizeof all_q[0]; i++) {
        CHECK_OK(lowp_linear_cfg_preset(all_q[i].preset, &c));
        check_plan(&c, 1, 1, 1, all_q[i].kn, all_q[i].preset);
        c.wgrad_hp = 1;
        check_plan(&c, 1, 1, 0, all_q[i].kn, all_q[i].preset);
    }
    CHECK_OK(lowp_linear_cfg_preset("bf16", &c));
    check_plan(&c, 0, 0, 0, 1, "bf16"); /* both BF16: the forward's copy serves the dgrad */
    CHECK_OK(lowp_linear_cfg_preset("block_fp8", &c));
    c.input.format = LOWP_FORMAT_BF16; /* forward BF16, dgrad quantized: two weight copies */
    check_plan(&c, 0, 1, 0, 0, "block_fp8, bf16 input");
    CHECK_OK(lowp_linear_cfg_preset("mxfp8", &c));
    c.grad_output.format = LOWP_FORMAT_BF16;
    check_plan(&c, 1, 0, 0, 0, "mxfp8, bf16 grad_output");
    c.weight.format = LOWP_FORMAT_BF16;
    check_plan(&c, 0, 0, 0, 1, "mxfp8, bf16 weight and grad_output");
    lowp_linear_plan p;
    CHECK_FAIL(lowp_linear_plan_get(NULL, &p), LOWP_ERR_INVALID_ARG, "cfg");
    CHECK_FAIL(lowp_linear_plan_get(&c, NULL), LOWP_ERR_INVALID_ARG, "plan");
}

int main(void) {
    test_scalings();
    test_defaults();
    test_mode_names();
    test_pairs();
    test_walks();
    test_plan();
    return testutil_finish();
}
