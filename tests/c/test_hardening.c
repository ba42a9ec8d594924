/* Hardening of the library's argument checks (issue 10); each case failed before its fix:
 *  - item 6: lowp_qtensor_scale_shape at rows / cols near INT64_MAX (signed overflow, caught
 *    by UBSan in `make sanitize`; wrong values otherwise), lowp_qtensor_nbytes for ROW
 *    [2^62, 1] (returned OK with a wrapped scale_bytes), lowp_moe_create with huge layers;
 *  - item 7: outputs that overlap inputs (an in-place decode, quantizing into the input, a GEMM
 *    writing over an operand) are refused with LOWP_ERR_INVALID_ARG naming both buffers, and
 *    distinct buffers still work;
 *  - item 9: lowp_fp32_scale refuses an eps of -1 or NaN, as lowp_quantize does.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lowp/lowp.h"
#include "lowp/model.h"
#include "testutil.h"

static void test_size_arithmetic(void) {
    const int64_t big = INT64_MAX;
    struct {
        lowp_scaling s;
        int64_t rows, cols, want_r, want_c;
    } cases[] = {
        {LOWP_SCALING_ROW, big, 1, big, 1},
        {LOWP_SCALING_MX32, 1, big, 1, big / 32 + 1},
        {LOWP_SCALING_BLOCK128X128, big, big, big / 128 + 1, big / 128 + 1},
        {LOWP_SCALING_BLOCK32X32, big - 5, 64, (big - 5) / 32 + 1, 2},
        {LOWP_SCALING_BLOCK128, 3, big, 3, big / 128 + 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lowp_qtensor q = {LOWP_FORMAT_E4M3, cases[i].s, cases[i].rows,
                          cases[i].cols,    NULL,       NULL,
                          LOWP_DEVICE_HOST, NULL,       0};
        int64_t sr = 0, sc = 0;
        CHECK(lowp_qtensor_scale_shape(&q, &sr, &sc, NULL) == LOWP_OK);
        CHECKF(sr == cases[i].want_r && sc == cases[i].want_c, "case %zu: %lld x %lld", i,
               (long long) sr, (long long) sc);
        size_t db, sb;
        CHECK(lowp_qtensor_nbytes(&q, &db, &sb) != LOWP_OK); /* cannot fit a size_t */
    }
    /* ROW [2^62, 1]: 2^62 data bytes fit, 2^62 binary32 scales (2^64 bytes) do not. */
    lowp_qtensor r = {LOWP_FORMAT_E4M3,
                      LOWP_SCALING_ROW,
                      (int64_t) 1 << 62,
                      1,
                      NULL,
                      NULL,
                      LOWP_DEVICE_HOST,
                      NULL,
                      0};
    size_t db = 0, sb = 0;
    CHECK(lowp_qtensor_nbytes(&r, &db, &sb) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "SIZE_MAX") != NULL);
    r.rows = (int64_t) 1 << 40; /* fits: 2^40 codes, 2^42 bytes of scales */
    CHECK(lowp_qtensor_nbytes(&r, &db, &sb) == LOWP_OK && db == (size_t) 1 << 40 &&
          sb == (size_t) 1 << 42);

    lowp_moe_config mc;
    CHECK(lowp_moe_config_preset("tiny", 60, &mc) == LOWP_OK);
    mc.dim = 2, mc.heads = 1, mc.experts = 1, mc.top_k = 1, mc.expert_hidden = 1;
    mc.shared_hidden = 1, mc.vocab = 2, mc.seq_len = 2;
    mc.layers = 200000000; /* 3 + 13 L overflows int32; 30 parameters per layer pass 1e10 */
    lowp_moe *m = NULL;
    CHECK(lowp_moe_create(&mc, 1, &m) == LOWP_ERR_INVALID_ARG && m == NULL);
    CHECK(strstr(lowp_last_error(), "layers") != NULL);
}

static void test_aliasing(void) {
    enum { R = 4, C = 64 };
    float *x = calloc(R * C * 2, sizeof *x);
    uint8_t *codes = calloc(R * C * 4, 1);
    for (int i = 0; i < R * C; i++) x[i] = (float) (i % 13) - 6.0f;
    /* An in-place decode: E4M3 codes in the first bytes of the float output. */
    lowp_tensor src = {LOWP_FORMAT_E4M3, R, C, x, LOWP_DEVICE_HOST};
    lowp_tensor dst = {LOWP_FORMAT_F32, R, C, x, LOWP_DEVICE_HOST};
    CHECK(lowp_cast(&src, &dst, NULL) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "dst.data overlaps src.data") != NULL);
    lowp_tensor f = {LOWP_FORMAT_F32, R, C, x, LOWP_DEVICE_HOST};
    lowp_tensor e = {LOWP_FORMAT_E4M3, R, C, (uint8_t *) x + 7, LOWP_DEVICE_HOST};
    CHECK(lowp_cast(&f, &e, NULL) == LOWP_ERR_INVALID_ARG); /* partial overlap */
    e.data = codes;
    CHECK(lowp_cast(&f, &e, NULL) == LOWP_OK); /* distinct buffers */

    /* Quantizing into the input buffer, and row and col copies that share their scales. */
    lowp_qtensor q = {LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, R,    C, x,
                      codes + R * C,    LOWP_DEVICE_HOST,  NULL, 0};
    CHECK(lowp_quantize(&f, &q, NULL, NULL) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "row_out.data overlaps x.data") != NULL);
    q.data = codes;
    lowp_qtensor qc = {LOWP_FORMAT_E4M3, LOWP_SCALING_MX32, C,    R, codes + 2 * R * C,
                       codes + R * C,    LOWP_DEVICE_HOST,  NULL, 0};
    CHECK(lowp_quantize(&f, &q, &qc, NULL) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "two outputs") != NULL);
    CHECK(lowp_quantize(&f, &q, NULL, NULL) == LOWP_OK);

    /* Dequantizing over the codes. */
    lowp_tensor out = {LOWP_FORMAT_F32, R, C, codes, LOWP_DEVICE_HOST};
    CHECK(lowp_dequantize(&q, &out) == LOWP_ERR_INVALID_ARG);
    out.data = x + R * C;
    CHECK(lowp_dequantize(&q, &out) == LOWP_OK);

    /* A GEMM whose C is one of its operands' buffers. */
    lowp_qtensor a = {LOWP_FORMAT_F32, LOWP_SCALING_NONE, R, C, x, NULL, LOWP_DEVICE_HOST, NULL, 0};
    lowp_tensor c = {LOWP_FORMAT_F32, R, R, x, LOWP_DEVICE_HOST};
    CHECK(lowp_gemm(&a, &a, &c, NULL) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "c.data overlaps a.data") != NULL);
    c.data = x + R * C;
    CHECK(lowp_gemm(&a, &a, &c, NULL) == LOWP_OK);
    free(x);
    free(codes);
}

static void test_eps(void) {
    float s = 0;
    CHECK(lowp_fp32_scale(2.0f, LOWP_FORMAT_E4M3, -1.0f, 0, &s) == LOWP_ERR_INVALID_ARG);
    CHECK(lowp_fp32_scale(2.0f, LOWP_FORMAT_E4M3, NAN, 0, &s) == LOWP_ERR_INVALID_ARG);
    CHECK(lowp_fp32_scale(2.0f, LOWP_FORMAT_E4M3, INFINITY, 0, &s) == LOWP_ERR_INVALID_ARG);
    CHECK(lowp_fp32_scale(2.0f, LOWP_FORMAT_E4M3, 1e-12f, 0, &s) == LOWP_OK && s == 224.0f);
}

int main(void) {
    test_size_arithmetic();
    test_aliasing();
    test_eps();
    return testutil_finish();
}
