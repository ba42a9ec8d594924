/* The quantization API's edge rules (include/lowp/quant.h, docs/numerics.md sections 3-5):
 *
 * - lowp_qtensor_nbytes / lowp_qtensor_scale_shape / lowp_scaling_block for every kind and
 *   format, grouped tensors included, and the names of kinds and scale modes;
 * - bad arguments: a status, a message naming the argument, and nothing written (outputs,
 *   scales and amax_out keep their sentinel bytes);
 * - RCEIL's rounding of d = amax/fmax (lowp_rule_rceil_code_from_d), with docs/numerics.md's
 *   examples and torchao's make_f32_to_e8m0_rceil_cases patterns (pytorch/ao
 *   torchao/testing/_mxfp8_test_utils.py at 6b78bb4f7028b7104f33e49ed65d0005ea3ee64b);
 *   a finite amax never gets a scale code above 254;
 * - TENSOR scaling with a given cfg.scale (delayed scaling) and amax_out, in a small training
 *   loop with lowp_delayed_record/update;
 * - grouped columns past offs[G-1] are code 0 and dequantize to 0; MXFP4 of an amax near
 *   FLT_MAX decodes to Inf (docs/numerics.md section 3, step 5).
 *
 * Bit-exact agreement of every kind with an independent reference is
 * tests/oracle/test_oracle_quant.py.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/scale_rules.h"
#include "lowp/lowp.h"
#include "testutil.h"

/* Roughly Gaussian in [-6, 6). */
static float rnd_gauss(void) {
    double s = 0;
    for (int i = 0; i < 12; i++) s += (double) (rnd64() >> 11) * (1.0 / 9007199254740992.0);
    return (float) (s - 6.0);
}

static int64_t cdiv(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

static int is_e8(lowp_scaling s) {
    return s == LOWP_SCALING_MX32 || s == LOWP_SCALING_BLOCK32X32;
}

/* ---- sizes and shapes ---- */

/* Scale shape of a kind for a [rows, cols] copy, from quant.h's table. */
static void expected_scale_shape(lowp_scaling s, int64_t rows, int64_t cols, int64_t *sr,
                                 int64_t *sc) {
    switch (s) {
    case LOWP_SCALING_TENSOR: *sr = 1, *sc = 1; break;
    case LOWP_SCALING_ROW: *sr = rows, *sc = 1; break;
    case LOWP_SCALING_MX32: *sr = rows, *sc = cdiv(cols, 32); break;
    case LOWP_SCALING_BLOCK128: *sr = rows, *sc = cdiv(cols, 128); break;
    case LOWP_SCALING_BLOCK128X128: *sr = cdiv(rows, 128), *sc = cdiv(cols, 128); break;
    default: *sr = cdiv(rows, 32), *sc = cdiv(cols, 32); break;
    }
}

/* The six quantization kinds (lowp_scaling also has NONE, the unscaled GEMM operand). */
enum { NKINDS = 6 };

static const lowp_format k_fmts[] = {LOWP_FORMAT_E4M3, LOWP_FORMAT_E5M2, LOWP_FORMAT_E2M1};
/* Group offsets of sizes 0 1 31 33 100 0 64 5. */
static const int32_t k_offs[] = {0, 1, 32, 65, 165, 165, 229, 234};
enum { K_GROUPS = 8 };

/* Data bytes, scale shapes and scale bytes of every scaling and format on awkward shapes. */
static void check_plain_sizes(void) {
    static const int64_t shapes[][2] = {{1, 1},   {3, 31},   {33, 65},  {129, 257}, {128, 128},
                                        {32, 32}, {1, 1030}, {1000, 1}, {0, 7},     {7, 0}};
    for (int s = 0; s < NKINDS; s++) {
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            for (int f = 0; f < 3; f++) {
                if (k_fmts[f] == LOWP_FORMAT_E2M1 && s != LOWP_SCALING_MX32) continue;
                int64_t R = shapes[i][0], C = shapes[i][1];
                lowp_qtensor q = {k_fmts[f], (lowp_scaling) s, R,    C, NULL,
                                  NULL,      LOWP_DEVICE_HOST, NULL, 0};
                size_t db = 0, sb = 0;
                int64_t sr = -1, sc = -1, wr, wc;
                int e8 = -1;
                CHECK(lowp_qtensor_nbytes(&q, &db, &sb) == LOWP_OK);
                CHECK(lowp_qtensor_scale_shape(&q, &sr, &sc, &e8) == LOWP_OK);
                expected_scale_shape((lowp_scaling) s, R, C, &wr, &wc);
                size_t wdb =
                    (size_t) R * (size_t) (k_fmts[f] == LOWP_FORMAT_E2M1 ? (C + 1) / 2 : C);
                CHECKF(db == wdb, "%s %lldx%lld fmt %d: data bytes %zu != %zu",
                       lowp_scaling_name((lowp_scaling) s), (long long) R, (long long) C,
                       (int) k_fmts[f], db, wdb);
                CHECKF(sr == wr && sc == wc, "%s %lldx%lld: scale shape %lldx%lld != %lldx%lld",
                       lowp_scaling_name((lowp_scaling) s), (long long) R, (long long) C,
                       (long long) sr, (long long) sc, (long long) wr, (long long) wc);
                CHECK(e8 == is_e8((lowp_scaling) s));
                CHECK(sb == (size_t) (wr * wc) * (is_e8((lowp_scaling) s) ? 1u : 4u));
                /* NULL outputs are allowed for the ones not wanted. */
                CHECK(lowp_qtensor_nbytes(&q, NULL, &sb) == LOWP_OK);
                CHECK(lowp_qtensor_scale_shape(&q, &sr, &sc, NULL) == LOWP_OK);
            }
        }
    }
}

/* Each scaling's block, names both ways, scale modes by name. */
static void check_block_sizes(void) {
    static const int64_t blocks[NKINDS][2] = {{0, 0},   {1, 0},     {1, 32},
                                              {1, 128}, {128, 128}, {32, 32}};
    for (int s = 0; s < NKINDS; s++) {
        int64_t br = -1, bc = -1;
        CHECK(lowp_scaling_block((lowp_scaling) s, &br, &bc) == LOWP_OK);
        CHECKF(br == blocks[s][0] && bc == blocks[s][1], "block of %s: %lldx%lld",
               lowp_scaling_name((lowp_scaling) s), (long long) br, (long long) bc);
        lowp_scaling back;
        CHECK(lowp_scaling_from_name(lowp_scaling_name((lowp_scaling) s), &back) == LOWP_OK &&
              back == (lowp_scaling) s);
    }
    int64_t br, bc;
    CHECK(lowp_scaling_block(LOWP_SCALING_COUNT, &br, &bc) == LOWP_ERR_INVALID_ARG);
    lowp_scaling sk;
    CHECK(lowp_scaling_from_name("mx64", &sk) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "mx64") != NULL);
    static const char *const modes[] = {"rceil", "floor", "ceil", "even"};
    for (int m = 0; m < 4; m++) {
        lowp_scale_mode mode;
        CHECK(lowp_scale_mode_from_name(modes[m], &mode) == LOWP_OK &&
              mode == (lowp_scale_mode) (m + 1));
    }
    lowp_scale_mode mode;
    CHECK(lowp_scale_mode_from_name("round", &mode) == LOWP_ERR_INVALID_ARG);
}

/* Grouped: blocks restart at every group boundary. */
static void check_grouped_sizes(void) {
    const int32_t *offs = k_offs;
    const int G = K_GROUPS;
    for (int k = 0; k < 2; k++) {
        lowp_scaling s = k ? LOWP_SCALING_BLOCK128 : LOWP_SCALING_MX32;
        int64_t bs = k ? 128 : 32, want = 0, prev = 0;
        for (int g = 0; g < G; g++) {
            want += cdiv(offs[g] - prev, bs);
            prev = offs[g];
        }
        for (int f = 0; f < 3; f++) {
            if (k_fmts[f] == LOWP_FORMAT_E2M1 && k) continue;
            lowp_qtensor q = {k_fmts[f], s, 7, 241, NULL, NULL, LOWP_DEVICE_HOST, offs, G};
            size_t db, sb;
            int64_t sr, sc;
            int e8;
            CHECK(lowp_qtensor_scale_shape(&q, &sr, &sc, &e8) == LOWP_OK);
            CHECKF(sr == 7 && sc == want, "grouped %s: scale shape %lldx%lld, want 7x%lld",
                   lowp_scaling_name(s), (long long) sr, (long long) sc, (long long) want);
            CHECK(lowp_qtensor_nbytes(&q, &db, &sb) == LOWP_OK);
            CHECK(db == (size_t) 7 * (k_fmts[f] == LOWP_FORMAT_E2M1 ? 121u : 241u));
            CHECK(sb == (size_t) (7 * want) * (k ? 4u : 1u));
        }
    }
}

/* Grouped shapes that are refused. */
static void check_grouped_refused(void) {
    const int32_t *offs = k_offs;
    const int G = K_GROUPS;
    const int32_t bad_dec[] = {10, 5, 20};
    const int32_t bad_big[] = {10, 300};
    lowp_qtensor q = {LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, 4, 241, NULL, NULL,
                      LOWP_DEVICE_HOST, bad_dec,           3};
    int64_t sr, sc;
    CHECK(lowp_qtensor_scale_shape(&q, &sr, &sc, NULL) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "group_offs[1]") != NULL);
    q.group_offs = bad_big;
    q.groups = 2;
    CHECK(lowp_qtensor_scale_shape(&q, &sr, &sc, NULL) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "group_offs[1]") != NULL);
    q.group_offs = offs;
    q.groups = 0;
    CHECK(lowp_qtensor_scale_shape(&q, &sr, &sc, NULL) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "groups") != NULL);
    q.groups = G;
    q.scaling = LOWP_SCALING_TENSOR;
    CHECK(lowp_qtensor_scale_shape(&q, &sr, &sc, NULL) == LOWP_ERR_UNSUPPORTED);
    q.scaling = LOWP_SCALING_BLOCK32X32;
    CHECK(lowp_qtensor_scale_shape(&q, &sr, &sc, NULL) == LOWP_ERR_UNSUPPORTED);
    q.scaling = (lowp_scaling) 17;
    q.group_offs = NULL;
    CHECK(lowp_qtensor_scale_shape(&q, &sr, &sc, NULL) == LOWP_ERR_INVALID_ARG);
    q.scaling = LOWP_SCALING_MX32;
    q.rows = -1;
    CHECK(lowp_qtensor_scale_shape(&q, &sr, &sc, NULL) == LOWP_ERR_INVALID_ARG);
}

static void test_sizes(void) {
    check_plain_sizes();
    check_block_sizes();
    check_grouped_sizes();
    check_grouped_refused();
}

/* ---- bad arguments: status, message, nothing written ---- */

enum { R = 4, C = 64, SENT = 0xA5 };
static float g_x[R * C];
static uint8_t g_rd[R * C + 64], g_rs[R * C * 4 + 64], g_cd[R * C + 64], g_cs[R * C * 4 + 64];
static float g_amax_out;

static void reset_outputs(void) {
    memset(g_rd, SENT, sizeof g_rd);
    memset(g_rs, SENT, sizeof g_rs);
    memset(g_cd, SENT, sizeof g_cd);
    memset(g_cs, SENT, sizeof g_cs);
    g_amax_out = -123.0f;
}

static int untouched(void) {
    for (size_t i = 0; i < sizeof g_rd; i++)
        if (g_rd[i] != SENT || g_cd[i] != SENT) return 0;
    for (size_t i = 0; i < sizeof g_rs; i++)
        if (g_rs[i] != SENT || g_cs[i] != SENT) return 0;
    return g_amax_out == -123.0f;
}

/* One refused call: the status, a message naming `what`, and nothing written. */
static void expect_refused(const char *label, lowp_status got, lowp_status want, const char *what) {
    const char *msg = lowp_last_error();
    CHECKF(got == want, "%s: status %d, want %d (%s)", label, (int) got, (int) want, msg);
    CHECKF(strstr(msg, what) != NULL, "%s: message \"%s\" does not name \"%s\"", label, msg, what);
    CHECKF(untouched(), "%s: an output was written", label);
    lowp_clear_error();
    reset_outputs();
}

typedef struct setup {
    lowp_tensor x;
    lowp_qtensor row, col;
    lowp_quant_cfg cfg;
} setup;

static setup good(lowp_format f, lowp_scaling s) {
    setup u;
    u.x = (lowp_tensor){LOWP_FORMAT_F32, R, C, g_x, LOWP_DEVICE_HOST};
    u.row = (lowp_qtensor){f, s, R, C, g_rd, g_rs, LOWP_DEVICE_HOST, NULL, 0};
    u.col = (lowp_qtensor){f, s, C, R, g_cd, g_cs, LOWP_DEVICE_HOST, NULL, 0};
    lowp_quant_cfg_init(&u.cfg);
    u.cfg.amax_out = &g_amax_out;
    return u;
}

/* A call that must be refused (expect_refused). */
#define REFUSE(label, call, want, what)                                                            \
    do {                                                                                           \
        lowp_status st_ = (call);                                                                  \
        expect_refused(label, st_, want, what);                                                    \
    } while (0)

/* x, row_out and col_out: shapes, formats, scalings, data, devices. */
static void test_bad_tensors(void) {
    setup u;
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32);
    u.x.cols = 0;
    u.row.cols = 0;
    u.col.rows = 0;
    REFUSE("cols of 0", lowp_quantize(&u.x, &u.row, &u.col, &u.cfg), LOWP_ERR_INVALID_ARG,
           "x.cols");
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32);
    u.x.rows = -1;
    REFUSE("negative rows", lowp_quantize(&u.x, &u.row, NULL, &u.cfg), LOWP_ERR_INVALID_ARG,
           "rows");
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32);
    u.row.rows = R + 1;
    REFUSE("row_out shape mismatch", lowp_quantize(&u.x, &u.row, &u.col, &u.cfg),
           LOWP_ERR_INVALID_ARG, "row_out shape");
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32);
    u.col.rows = R; /* not transposed */
    u.col.cols = C;
    REFUSE("col_out not transposed", lowp_quantize(&u.x, &u.row, &u.col, &u.cfg),
           LOWP_ERR_INVALID_ARG, "col_out shape");
    static const lowp_scaling non_mx[] = {LOWP_SCALING_TENSOR, LOWP_SCALING_ROW,
                                          LOWP_SCALING_BLOCK128, LOWP_SCALING_BLOCK128X128,
                                          LOWP_SCALING_BLOCK32X32};
    for (int k = 0; k < 5; k++) {
        u = good(LOWP_FORMAT_E2M1, non_mx[k]);
        char label[64];
        snprintf(label, sizeof label, "e2m1 with %s", lowp_scaling_name(non_mx[k]));
        REFUSE(label, lowp_quantize(&u.x, &u.row, NULL, &u.cfg), LOWP_ERR_UNSUPPORTED,
               "row_out.format");
        REFUSE(label, lowp_quantize(&u.x, NULL, &u.col, &u.cfg), LOWP_ERR_UNSUPPORTED,
               "col_out.format");
    }
    u = good(LOWP_FORMAT_BF16, LOWP_SCALING_MX32);
    REFUSE("bf16 element format", lowp_quantize(&u.x, &u.row, NULL, &u.cfg), LOWP_ERR_UNSUPPORTED,
           "format");
    u = good(LOWP_FORMAT_E4M3, (lowp_scaling) 9);
    REFUSE("bad scaling", lowp_quantize(&u.x, &u.row, NULL, &u.cfg), LOWP_ERR_INVALID_ARG,
           "scaling");
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32);
    u.x.format = LOWP_FORMAT_F16;
    REFUSE("f16 input", lowp_quantize(&u.x, &u.row, NULL, &u.cfg), LOWP_ERR_UNSUPPORTED,
           "x.format");
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32);
    u.x.data = NULL;
    REFUSE("NULL x.data", lowp_quantize(&u.x, &u.row, NULL, &u.cfg), LOWP_ERR_INVALID_ARG,
           "x.data");
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32);
    u.row.data = NULL;
    REFUSE("NULL row_out.data", lowp_quantize(&u.x, &u.row, &u.col, &u.cfg), LOWP_ERR_INVALID_ARG,
           "row_out.data");
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_BLOCK128);
    u.col.scales = NULL;
    REFUSE("NULL col_out.scales", lowp_quantize(&u.x, &u.row, &u.col, &u.cfg), LOWP_ERR_INVALID_ARG,
           "col_out.scales");
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32);
    REFUSE("no outputs", lowp_quantize(&u.x, NULL, NULL, &u.cfg), LOWP_ERR_INVALID_ARG,
           "row_out and col_out");
    REFUSE("NULL x", lowp_quantize(NULL, &u.row, NULL, &u.cfg), LOWP_ERR_INVALID_ARG, "x");
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32);
    u.col.format = LOWP_FORMAT_E5M2;
    REFUSE("row/col formats differ", lowp_quantize(&u.x, &u.row, &u.col, &u.cfg),
           LOWP_ERR_INVALID_ARG, "differ");
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32);
    u.col.scaling = LOWP_SCALING_BLOCK32X32;
    REFUSE("row/col scalings differ", lowp_quantize(&u.x, &u.row, &u.col, &u.cfg),
           LOWP_ERR_INVALID_ARG, "differ");
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32);
    u.row.device = (lowp_device){LOWP_DEVICE_CPU, 3};
    REFUSE("row_out on another device", lowp_quantize(&u.x, &u.row, NULL, &u.cfg),
           LOWP_ERR_INVALID_ARG, "row_out.device");
}

/* The quantize cfg: scale, eps, scale_mode, pow2_scales, threads, path. */
static void test_bad_cfg(void) {
    setup u;
    float scale = 2.0f;
    static const lowp_scaling not_tensor[] = {LOWP_SCALING_ROW, LOWP_SCALING_MX32,
                                              LOWP_SCALING_BLOCK128, LOWP_SCALING_BLOCK128X128,
                                              LOWP_SCALING_BLOCK32X32};
    for (int k = 0; k < 5; k++) {
        u = good(LOWP_FORMAT_E4M3, not_tensor[k]);
        u.cfg.scale = &scale;
        char label[64];
        snprintf(label, sizeof label, "cfg.scale with %s", lowp_scaling_name(not_tensor[k]));
        REFUSE(label, lowp_quantize(&u.x, &u.row, &u.col, &u.cfg), LOWP_ERR_INVALID_ARG,
               "cfg.scale");
    }
    const float bad_scales[] = {0.0f, -0.0f, -1.0f, INFINITY, -INFINITY, NAN};
    for (int k = 0; k < 6; k++) {
        u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_TENSOR);
        u.cfg.scale = &bad_scales[k];
        REFUSE("bad *cfg.scale", lowp_quantize(&u.x, &u.row, &u.col, &u.cfg), LOWP_ERR_INVALID_ARG,
               "cfg.scale");
    }
    const float bad_eps[] = {-1.0f, -FLT_MIN, INFINITY, NAN};
    for (int k = 0; k < 4; k++) {
        u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_ROW);
        u.cfg.eps = bad_eps[k];
        REFUSE("bad cfg.eps", lowp_quantize(&u.x, &u.row, &u.col, &u.cfg), LOWP_ERR_INVALID_ARG,
               "cfg.eps");
    }
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32);
    u.cfg.scale_mode = (lowp_scale_mode) 5;
    REFUSE("bad cfg.scale_mode", lowp_quantize(&u.x, &u.row, NULL, &u.cfg), LOWP_ERR_INVALID_ARG,
           "cfg.scale_mode");
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_ROW);
    u.cfg.pow2_scales = 2;
    REFUSE("bad cfg.pow2_scales", lowp_quantize(&u.x, &u.row, NULL, &u.cfg), LOWP_ERR_INVALID_ARG,
           "cfg.pow2_scales");
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32);
    u.cfg.threads = -1;
    REFUSE("bad cfg.threads", lowp_quantize(&u.x, &u.row, NULL, &u.cfg), LOWP_ERR_INVALID_ARG,
           "cfg.threads");
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32);
    u.cfg.path = (lowp_kernel_path) 7;
    REFUSE("bad cfg.path", lowp_quantize(&u.x, &u.row, NULL, &u.cfg), LOWP_ERR_INVALID_ARG,
           "cfg.path");
}

/* Grouped quantization: offsets, groups, scalings. */
static void test_bad_grouped(void) {
    setup u;
    const int32_t offs_ok[] = {1, 3};
    const int32_t offs_dec[] = {3, 1};
    const int32_t offs_big[] = {1, R + 1};
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32);
    u.col.group_offs = offs_dec;
    u.col.groups = 2;
    REFUSE("group_offs decreasing", lowp_quantize_grouped(&u.x, NULL, &u.col, &u.cfg),
           LOWP_ERR_INVALID_ARG, "group_offs[1]");
    u.col.group_offs = offs_big;
    REFUSE("group_offs > rows", lowp_quantize_grouped(&u.x, NULL, &u.col, &u.cfg),
           LOWP_ERR_INVALID_ARG, "group_offs[1]");
    u.col.group_offs = offs_ok;
    u.col.groups = 0;
    REFUSE("groups of 0", lowp_quantize_grouped(&u.x, NULL, &u.col, &u.cfg), LOWP_ERR_INVALID_ARG,
           "groups");
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32);
    REFUSE("grouped without offs", lowp_quantize_grouped(&u.x, NULL, &u.col, &u.cfg),
           LOWP_ERR_INVALID_ARG, "group_offs");
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_BLOCK32X32);
    u.col.group_offs = offs_ok;
    u.col.groups = 2;
    REFUSE("grouped block32x32", lowp_quantize_grouped(&u.x, NULL, &u.col, &u.cfg),
           LOWP_ERR_UNSUPPORTED, "block32x32");
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_TENSOR);
    u.col.group_offs = offs_ok;
    u.col.groups = 2;
    REFUSE("grouped tensor", lowp_quantize_grouped(&u.x, NULL, &u.col, &u.cfg),
           LOWP_ERR_UNSUPPORTED, "tensor");
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32);
    u.col.group_offs = offs_ok;
    u.col.groups = 2;
    REFUSE("group_offs through lowp_quantize", lowp_quantize(&u.x, NULL, &u.col, &u.cfg),
           LOWP_ERR_INVALID_ARG, "lowp_quantize_grouped");
    u.cfg.eps = -1.0f;
    REFUSE("grouped negative eps", lowp_quantize_grouped(&u.x, NULL, &u.col, &u.cfg),
           LOWP_ERR_INVALID_ARG, "cfg.eps");
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32);
    u.col.group_offs = offs_ok;
    u.col.groups = 2;
    u.col.rows = C + 1;
    REFUSE("grouped shape mismatch", lowp_quantize_grouped(&u.x, NULL, &u.col, &u.cfg),
           LOWP_ERR_INVALID_ARG, "col_out shape");
    /* the rowwise copy beside the grouped one */
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32);
    u.col.group_offs = offs_ok;
    u.col.groups = 2;
    u.row.format = LOWP_FORMAT_E5M2;
    REFUSE("grouped row_out of another format", lowp_quantize_grouped(&u.x, &u.row, &u.col, &u.cfg),
           LOWP_ERR_INVALID_ARG, "row_out (format 4, scaling 2) and col_out");
    u.row.format = LOWP_FORMAT_E4M3;
    u.row.rows = R + 1;
    REFUSE("grouped row_out shape", lowp_quantize_grouped(&u.x, &u.row, &u.col, &u.cfg),
           LOWP_ERR_INVALID_ARG, "row_out shape");
    u.row.rows = R;
    u.row.group_offs = offs_ok;
    u.row.groups = 2;
    REFUSE("grouped row_out with group_offs", lowp_quantize_grouped(&u.x, &u.row, &u.col, &u.cfg),
           LOWP_ERR_INVALID_ARG, "row_out.group_offs is set");
    u.row.group_offs = NULL;
    u.row.groups = 0;
    u.row.data = u.col.data;
    REFUSE("grouped row_out over col_out", lowp_quantize_grouped(&u.x, &u.row, &u.col, &u.cfg),
           LOWP_ERR_INVALID_ARG, "row_out.data");
    u.row.data = g_rd;
    u.row.device = (lowp_device){LOWP_DEVICE_CPU, 1};
    REFUSE("grouped row_out device", lowp_quantize_grouped(&u.x, &u.row, &u.col, &u.cfg),
           LOWP_ERR_INVALID_ARG, "row_out.device");
}

/* Dequantize: output format and shape, scales, formats; nothing written. */
static void test_bad_dequantize(void) {
    setup u;
    float out[R * C + 8];
    for (int i = 0; i < R * C + 8; i++) out[i] = -7.0f;
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32);
    lowp_tensor t = {LOWP_FORMAT_F32, R, C, out, LOWP_DEVICE_HOST};
    lowp_tensor tb = t;
    tb.format = LOWP_FORMAT_BF16;
    REFUSE("dequantize to bf16", lowp_dequantize(&u.row, &tb), LOWP_ERR_UNSUPPORTED, "out.format");
    tb = t;
    tb.cols = C - 1;
    REFUSE("dequantize shape mismatch", lowp_dequantize(&u.row, &tb), LOWP_ERR_INVALID_ARG,
           "out shape");
    u.row.scales = NULL;
    REFUSE("dequantize NULL scales", lowp_dequantize(&u.row, &t), LOWP_ERR_INVALID_ARG, "q.scales");
    u = good(LOWP_FORMAT_E2M1, LOWP_SCALING_BLOCK128);
    REFUSE("dequantize e2m1 block128", lowp_dequantize(&u.row, &t), LOWP_ERR_UNSUPPORTED,
           "q.format");
    int out_ok = 1;
    for (int i = 0; i < R * C + 8; i++) out_ok &= out[i] == -7.0f;
    CHECKF(out_ok, "a refused lowp_dequantize wrote its output");
}

/* Amax and the scalar scale functions. */
static void test_bad_scalar(void) {
    float am[R + 1];
    for (int i = 0; i < R + 1; i++) am[i] = -5.0f;
    lowp_tensor x = {LOWP_FORMAT_F32, R, C, g_x, LOWP_DEVICE_HOST};
    REFUSE("amax out_count", lowp_amax(&x, LOWP_SCALING_ROW, am, R + 1), LOWP_ERR_INVALID_ARG,
           "out_count");
    CHECK(am[0] == -5.0f && am[R] == -5.0f);
    uint8_t code = 77;
    REFUSE("e8m0 scale of f32",
           lowp_e8m0_scale(1.0f, LOWP_FORMAT_F32, LOWP_SCALE_MODE_RCEIL, &code),
           LOWP_ERR_INVALID_ARG, "format");
    REFUSE("e8m0 scale bad mode",
           lowp_e8m0_scale(1.0f, LOWP_FORMAT_E4M3, (lowp_scale_mode) 9, &code),
           LOWP_ERR_INVALID_ARG, "mode");
    CHECK(code == 77);
}

/* Delayed scaling configurations. */
static void test_bad_delayed(void) {
    float hist[4] = {9, 9, 9, 9};
    lowp_delayed_cfg dc;
    lowp_delayed_state ds;
    memset(&ds, 0, sizeof ds);
    lowp_delayed_cfg_init(&dc, LOWP_FORMAT_E4M3);
    CHECK(dc.history_len == 1024 && dc.margin == 0.0f && dc.algo == LOWP_AMAX_ALGO_MAX);
    dc.history_len = 0;
    REFUSE("delayed history_len 0", lowp_delayed_init(&ds, &dc, hist), LOWP_ERR_INVALID_ARG,
           "history_len");
    dc.history_len = 4;
    dc.margin = INFINITY;
    REFUSE("delayed margin inf", lowp_delayed_init(&ds, &dc, hist), LOWP_ERR_INVALID_ARG, "margin");
    dc.margin = 0.0f;
    dc.format = LOWP_FORMAT_E2M1;
    REFUSE("delayed e2m1", lowp_delayed_init(&ds, &dc, hist), LOWP_ERR_INVALID_ARG, "format");
    dc.format = LOWP_FORMAT_E4M3;
    dc.algo = (lowp_amax_algo) 3;
    REFUSE("delayed bad algo", lowp_delayed_init(&ds, &dc, hist), LOWP_ERR_INVALID_ARG, "algo");
    REFUSE("delayed NULL history", lowp_delayed_init(&ds, &dc, NULL), LOWP_ERR_INVALID_ARG,
           "history");
    CHECK(hist[0] == 9 && hist[3] == 9);
}

/* Scale layout conversions. */
static void test_bad_layouts(void) {
    uint8_t canon[6] = {1, 2, 3, 4, 5, 6}, swz[512];
    memset(swz, SENT, sizeof swz);
    REFUSE("to_cublas short buffer", lowp_scales_to_cublas(canon, 2, 3, swz, 511),
           LOWP_ERR_INVALID_ARG, "out_bytes");
    REFUSE("to_npu bad axis", lowp_scales_to_npu(canon, 2, 3, (lowp_npu_axis) 2, swz, 512),
           LOWP_ERR_INVALID_ARG, "axis");
    int swz_ok = 1;
    for (int i = 0; i < 512; i++) swz_ok &= swz[i] == SENT;
    CHECKF(swz_ok, "a refused layout conversion wrote its output");
}

static void test_bad_arguments(void) {
    for (int i = 0; i < R * C; i++) g_x[i] = rnd_gauss();
    reset_outputs();
    setup u;

    /* Sanity: the good setup works (and does write). */
    u = good(LOWP_FORMAT_E4M3, LOWP_SCALING_MX32);
    CHECK(lowp_quantize(&u.x, &u.row, &u.col, &u.cfg) == LOWP_OK);
    CHECK(!untouched());
    reset_outputs();
    test_bad_tensors();
    test_bad_cfg();
    test_bad_grouped();
    test_bad_dequantize();
    test_bad_scalar();
    test_bad_delayed();
    test_bad_layouts();
}

/* ---- RCEIL rounding of d ---- */

static void test_rceil_rule(void) {
    /* docs/numerics.md section 3. */
    CHECK(lowp_rule_rceil_code_from_d(0x3F800001u) == 128);
    CHECK(lowp_rule_rceil_code_from_d(0x00400001u) == 1);
    CHECK(lowp_rule_rceil_code_from_d(0x007FFFFFu) == 1);
    /* torchao make_f32_to_e8m0_rceil_cases (finite d and +Inf; d above 2^127 gives 255 as in
     * torchao: lowp caps the code at 254 after this step, and no finite amax gets there). */
    static const uint32_t cases[][2] = {
        {0x00000000u, 0},   {0x00000001u, 0},   {0x00400000u, 0},   {0x00400001u, 1},
        {0x007FFFFFu, 1},   {0x00800000u, 1},   {0x1F800000u, 63},  {0x1F800001u, 64},
        {0x3F7FFFFFu, 127}, {0x3F800000u, 127}, {0x3F800001u, 128}, {0x5F800000u, 191},
        {0x5F800001u, 192}, {0x7F000000u, 254}, {0x7F000001u, 255}, {0x7F7FFFFFu, 255},
        {0x7F800000u, 255},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECKF(lowp_rule_rceil_code_from_d(cases[i][0]) == (int) cases[i][1],
               "rceil d=0x%08X: %d, want %u", cases[i][0], lowp_rule_rceil_code_from_d(cases[i][0]),
               cases[i][1]);
    /* Exhaustive over the exponent: exact powers of two keep their code, one ulp above
     * goes up by one. */
    for (uint32_t e = 1; e < 255; e++) {
        CHECK(lowp_rule_rceil_code_from_d(e << 23) == (int) e);
        CHECK(lowp_rule_rceil_code_from_d((e << 23) | 1u) == (int) e + 1);
        CHECK(lowp_rule_rceil_code_from_d((e << 23) | 0x7FFFFFu) == (int) e + 1);
    }
    /* The public function: a finite amax never gives a code above 254, in any mode. */
    static const lowp_format fmts[] = {LOWP_FORMAT_E4M3, LOWP_FORMAT_E5M2, LOWP_FORMAT_E2M1};
    for (int f = 0; f < 3; f++)
        for (int m = 0; m <= 4; m++) {
            uint8_t code = 0;
            CHECK(lowp_e8m0_scale(FLT_MAX, fmts[f], (lowp_scale_mode) m, &code) == LOWP_OK);
            CHECKF(code <= 254, "fmt %d mode %d: amax FLT_MAX gives code %u", (int) fmts[f], m,
                   (unsigned) code);
            CHECK(lowp_e8m0_scale(INFINITY, fmts[f], (lowp_scale_mode) m, &code) == LOWP_OK &&
                  code == 255);
            CHECK(lowp_e8m0_scale(NAN, fmts[f], (lowp_scale_mode) m, &code) == LOWP_OK &&
                  code == 255);
            CHECK(lowp_e8m0_scale(0.0f, fmts[f], (lowp_scale_mode) m, &code) == LOWP_OK &&
                  code == 0);
            CHECK(lowp_e8m0_scale(u2f(1), fmts[f], (lowp_scale_mode) m, &code) == LOWP_OK &&
                  code == 0);
        }
    /* The worked examples: amax 480 -> FLOOR 127, RCEIL 128; amax 2^-126 -> FLOOR 0. */
    uint8_t c;
    CHECK(lowp_e8m0_scale(480.0f, LOWP_FORMAT_E4M3, LOWP_SCALE_MODE_FLOOR, &c) == LOWP_OK &&
          c == 127);
    CHECK(lowp_e8m0_scale(480.0f, LOWP_FORMAT_E4M3, LOWP_SCALE_MODE_RCEIL, &c) == LOWP_OK &&
          c == 128);
    CHECK(lowp_e8m0_scale(480.0f, LOWP_FORMAT_E4M3, LOWP_SCALE_MODE_DEFAULT, &c) == LOWP_OK &&
          c == 128);
    CHECK(lowp_e8m0_scale(FLT_MIN, LOWP_FORMAT_E4M3, LOWP_SCALE_MODE_FLOOR, &c) == LOWP_OK &&
          c == 0);

    /* MXFP4 of 3e38: RCEIL picks 2^126, and 6 * 2^126 is past FLT_MAX: it decodes to Inf. */
    float x[32] = {0};
    x[0] = 3e38f;
    x[1] = -1.0f;
    uint8_t data[16], sc;
    lowp_tensor t = {LOWP_FORMAT_F32, 1, 32, x, LOWP_DEVICE_HOST};
    lowp_qtensor q = {
        LOWP_FORMAT_E2M1, LOWP_SCALING_MX32, 1, 32, data, &sc, LOWP_DEVICE_HOST, NULL, 0};
    CHECK(lowp_quantize(&t, &q, NULL, NULL) == LOWP_OK);
    /* 3e38 * 2^-126 = 3.53 rounds to 4 (code 0x6); 4 * 2^126 = 2^128 overflows binary32. */
    CHECKF(sc == 253 && (data[0] & 0xF) == 0x6, "mxfp4 of 3e38: scale %u code 0x%X", sc,
           data[0] & 0xF);
    float back[32];
    lowp_tensor o = {LOWP_FORMAT_F32, 1, 32, back, LOWP_DEVICE_HOST};
    CHECK(lowp_dequantize(&q, &o) == LOWP_OK);
    CHECKF(isinf(back[0]) && back[0] > 0, "mxfp4 of 3e38 decodes to %g", (double) back[0]);
    CHECK(back[1] == -0.0f && signbit(back[1])); /* -1 underflows to -0 at this scale */
}

/* ---- TENSOR with a given (delayed) scale and amax_out ---- */

/* amax_out with a computed scale, and on every input format. */
static void check_amax_out(void) {
    float y[64], amax = -1, s_inv;
    uint16_t yb[64];
    uint8_t d[64];
    for (int i = 0; i < 64; i++) y[i] = (float) (i - 40) * 0.25f;
    for (int i = 0; i < 64; i++) yb[i] = (uint16_t) (f2u(y[i]) >> 16);
    lowp_quant_cfg cfg;
    lowp_quant_cfg_init(&cfg);
    cfg.amax_out = &amax;
    lowp_tensor t = {LOWP_FORMAT_F32, 2, 32, y, LOWP_DEVICE_HOST};
    lowp_qtensor q = {LOWP_FORMAT_E5M2, LOWP_SCALING_TENSOR, 2,    32, d,
                      &s_inv,           LOWP_DEVICE_HOST,    NULL, 0};
    CHECK(lowp_quantize(&t, &q, NULL, &cfg) == LOWP_OK);
    CHECK(amax == 10.0f);
    CHECK(f2u(s_inv) == f2u(1.0f / (57344.0f / 10.0f)));
    amax = -1;
    t.format = LOWP_FORMAT_BF16;
    t.data = yb;
    CHECK(lowp_quantize(&t, &q, NULL, &cfg) == LOWP_OK);
    CHECK(amax == 10.0f);
}

static void test_delayed_tensor(void) {
    enum { M = 37, N = 53, STEPS = 12 };
    static float x[M * N];
    static uint8_t rd[M * N], cd[M * N];
    float rs, cs, hist[8];
    lowp_delayed_cfg dc;
    lowp_delayed_state st;
    CHECK(lowp_delayed_cfg_init(&dc, LOWP_FORMAT_E4M3) == LOWP_OK);
    dc.history_len = 8;
    CHECK(lowp_delayed_init(&st, &dc, hist) == LOWP_OK);
    CHECK(st.scale == 1.0f && st.scale_inv == 1.0f && hist[7] == 0.0f);
    const lowp_format_traits *et;
    lowp_format_get(LOWP_FORMAT_E4M3, &et);
    for (int step = 0; step < STEPS; step++) {
        float mag = ldexpf(1.0f, step - 4);
        float want_amax = 0.0f;
        for (int i = 0; i < M * N; i++) {
            x[i] = rnd_gauss() * mag;
            if (fabsf(x[i]) > want_amax) want_amax = fabsf(x[i]);
        }
        if (step == 7) {
            x[100] = NAN;
            want_amax = NAN;
        }
        /* Delayed scaling: this step uses the scale derived from earlier steps' amaxes. */
        float scale = st.scale, amax = -1.0f;
        lowp_quant_cfg cfg;
        lowp_quant_cfg_init(&cfg);
        cfg.scale = &scale;
        cfg.amax_out = &amax;
        lowp_tensor t = {LOWP_FORMAT_F32, M, N, x, LOWP_DEVICE_HOST};
        lowp_qtensor row = {
            LOWP_FORMAT_E4M3, LOWP_SCALING_TENSOR, M, N, rd, &rs, LOWP_DEVICE_HOST, NULL, 0};
        lowp_qtensor col = {
            LOWP_FORMAT_E4M3, LOWP_SCALING_TENSOR, N, M, cd, &cs, LOWP_DEVICE_HOST, NULL, 0};
        CHECK(lowp_quantize(&t, &row, &col, &cfg) == LOWP_OK);
        CHECKF(f2u(rs) == f2u(1.0f / scale) && f2u(cs) == f2u(1.0f / scale),
               "step %d: scale_inv %a / %a, want %a", step, (double) rs, (double) cs,
               (double) (1.0f / scale));
        CHECKF(f2u(rs) == f2u(st.scale_inv), "step %d: scale_inv %a != state's %a", step,
               (double) rs, (double) st.scale_inv);
        CHECKF(isnan(want_amax) ? isnan(amax) : amax == want_amax, "step %d: amax_out %g != %g",
               step, (double) amax, (double) want_amax);
        int bad = 0;
        for (int r = 0; r < M; r++)
            for (int c = 0; c < N; c++) {
                uint32_t code;
                lowp_encode(LOWP_FORMAT_E4M3, x[r * N + c] * scale, LOWP_OVERFLOW_SATFINITE, &code);
                bad += rd[r * N + c] != code || cd[c * M + r] != code;
            }
        CHECKF(bad == 0, "step %d: %d codes differ from encode(x * scale)", step, bad);
        /* The given scale lags the data: once the data grows past it, codes saturate. */
        if (step > 0 && !isnan(want_amax) && want_amax * scale > et->fmax) {
            int sat = 0;
            for (int i = 0; i < M * N; i++) sat += (rd[i] & 0x7F) == 0x7E;
            CHECK(sat > 0);
        }
        CHECK(lowp_delayed_record(&st, amax) == LOWP_OK);
        float before = st.scale;
        CHECK(lowp_delayed_update(&st) == LOWP_OK);
        /* Section 5: fmax / the history's max, which after the roll is the max of the
         * rolled history; a NaN in the window keeps the previous scale. */
        float hmax = 0.0f;
        int hnan = 0;
        for (int i = 0; i < 8; i++) {
            if (isnan(hist[i]))
                hnan = 1;
            else if (hist[i] > hmax)
                hmax = hist[i];
        }
        CHECK(hist[0] == 0.0f && f2u(hist[7]) == f2u(amax)); /* rolled: newest at the end */
        if (step >= 7) {
            /* The NaN recorded at step 7 stays in the 8-step window: the scale stays put. */
            CHECKF(f2u(st.scale) == f2u(before), "step %d: scale changed with NaN in history",
                   step);
            CHECK(hnan);
        } else {
            CHECKF(f2u(st.scale) == f2u(et->fmax / hmax), "step %d: scale %a, want %a", step,
                   (double) st.scale, (double) (et->fmax / hmax));
        }
        CHECK(f2u(st.scale_inv) == f2u(1.0f / st.scale));
    }
    check_amax_out();
}

/* ---- grouped: tokens past offs[G-1] ---- */

static void test_grouped_tail(void) {
    enum { M = 50, K = 3 };
    float x[M * K], back[K * M];
    uint8_t d[K * M], s[K * 4];
    for (int i = 0; i < M * K; i++) x[i] = rnd_gauss() + 100.0f;
    const int32_t offs[] = {0, 33, 40}; /* an empty group, then 33 and 7 tokens; 10 ignored */
    lowp_tensor t = {LOWP_FORMAT_F32, M, K, x, LOWP_DEVICE_HOST};
    lowp_qtensor q = {LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, K, M, d, s, LOWP_DEVICE_HOST, offs, 3};
    memset(d, SENT, sizeof d);
    CHECK(lowp_quantize_grouped(&t, NULL, &q, NULL) == LOWP_OK);
    int zeros = 1, nonzero = 1;
    for (int k = 0; k < K; k++) {
        for (int m = 40; m < M; m++) zeros &= d[k * M + m] == 0;
        for (int m = 0; m < 40; m++) nonzero &= d[k * M + m] != 0 && d[k * M + m] != SENT;
    }
    CHECK(zeros);
    CHECK(nonzero);
    lowp_tensor o = {LOWP_FORMAT_F32, K, M, back, LOWP_DEVICE_HOST};
    CHECK(lowp_dequantize(&q, &o) == LOWP_OK);
    int tail = 1;
    double err = 0;
    for (int k = 0; k < K; k++) {
        for (int m = 40; m < M; m++) tail &= f2u(back[k * M + m]) == 0;
        for (int m = 0; m < 40; m++) err = fmax(err, fabs(back[k * M + m] - x[m * K + k]));
    }
    CHECK(tail);
    CHECKF(err <= 100.0 * 0.0625 + 1e-6, "grouped round trip error %g", err);
}

/* ---- empty inputs ---- */

static void test_empty(void) {
    float x[1] = {0};
    uint8_t d[1], s[8];
    lowp_tensor t = {LOWP_FORMAT_F32, 0, 40, x, LOWP_DEVICE_HOST};
    lowp_qtensor row = {
        LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, 0, 40, d, s, LOWP_DEVICE_HOST, NULL, 0};
    size_t db, sb;
    CHECK(lowp_qtensor_nbytes(&row, &db, &sb) == LOWP_OK && db == 0 && sb == 0);
    CHECK(lowp_quantize(&t, &row, NULL, NULL) == LOWP_OK);
}

int main(void) {
    tu_seed(0x243F6A8885A308D3ull);
    test_sizes();
    test_bad_arguments();
    test_rceil_rule();
    test_delayed_tensor();
    test_grouped_tail();
    test_empty();
    return testutil_finish();
}
