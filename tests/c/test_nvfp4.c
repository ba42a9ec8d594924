/* NVFP4 (scalings nv16 and nv16x16, docs/numerics.md section 4b) on hand-worked examples, for
 * builds without the Python oracle (tests/oracle/test_oracle_nvfp4.py checks the rules
 * exhaustively): buffer sizes and the tensor scale's offset, the document's example, a tile, an
 * exact GEMM, and the errors for unsupported formats, pairs and grouped kinds. */
#include <math.h>
#include <string.h>

#include "lowp/lowp.h"
#include "testutil.h"

static float tensor_dec(const lowp_qtensor *q) {
    size_t off;
    float g = NAN;
    if (lowp_qtensor_tensor_scale_offset(q, &off) == LOWP_OK)
        memcpy(&g, (const uint8_t *) q->scales + off, sizeof g);
    return g;
}

/* 2 x 33 in nv16: 2 x 17 code bytes; 2 x 3 block scales rounded up to 8 bytes, then 4. */
static void test_sizes(void) {
    lowp_qtensor q = {
        LOWP_FORMAT_E2M1, LOWP_SCALING_NV16, 2, 33, NULL, NULL, LOWP_DEVICE_HOST, NULL, 0};
    size_t db, sb, off;
    CHECK_OK(lowp_qtensor_nbytes(&q, &db, &sb));
    CHECK_OK(lowp_qtensor_tensor_scale_offset(&q, &off));
    CHECKF(db == 34 && sb == 12 && off == 8, "%zu %zu %zu", db, sb, off);
    q.scaling = LOWP_SCALING_NV16X16; /* 1 x 3 tiles: 3 bytes, offset 4 */
    CHECK_OK(lowp_qtensor_nbytes(&q, &db, &sb));
    CHECK_OK(lowp_qtensor_tensor_scale_offset(&q, &off));
    CHECKF(db == 34 && sb == 8 && off == 4, "%zu %zu %zu", db, sb, off);
    q.scaling = LOWP_SCALING_MX32;
    CHECK_FAIL(lowp_qtensor_tensor_scale_offset(&q, &off), LOWP_ERR_INVALID_ARG, "mx32");
}

/* Section 4b's example: tensor amax 2688 gives S = D = 1; a block of amax 2688 gets 0x7E and
 * its small elements round to 0; a block of amax 6 gets 0x38 and the E2M1 ties 0.75, 1.25,
 * 2.5, 5 go to 1, 1, 2, 4 (codes 2, 2, 4, 6); -0 keeps its sign (code 8). */
static void test_example(void) {
    float x[2 * 16] = {0};
    const float r0[5] = {2688, 0.75f, 1.25f, 2.5f, 5}, r1[6] = {6, 0.75f, 1.25f, 2.5f, 5, -0.0f};
    memcpy(x, r0, sizeof r0);
    memcpy(x + 16, r1, sizeof r1);
    uint8_t data[16], scales[8];
    lowp_tensor t = {LOWP_FORMAT_F32, 2, 16, x, LOWP_DEVICE_HOST};
    lowp_qtensor q = {LOWP_FORMAT_E2M1, LOWP_SCALING_NV16, 2,    16, data,
                      scales,           LOWP_DEVICE_HOST,  NULL, 0};
    CHECK_OK(lowp_quantize(&t, &q, NULL, NULL));
    const uint8_t want[16] = {0x07, 0, 0, 0, 0, 0, 0, 0, 0x27, 0x42, 0x86, 0, 0, 0, 0, 0};
    CHECK(memcmp(data, want, 16) == 0);
    CHECKF(scales[0] == 0x7E && scales[1] == 0x38, "%02X %02X", scales[0], scales[1]);
    CHECK(tensor_dec(&q) == 1.0f);
    float back[32];
    lowp_tensor out = {LOWP_FORMAT_F32, 2, 16, back, LOWP_DEVICE_HOST};
    CHECK_OK(lowp_dequantize(&q, &out));
    CHECK(back[0] == 2688 && back[1] == 0 && back[16] == 6 && back[17] == 1 && back[19] == 2 &&
          back[20] == 4 && back[21] == 0 && signbit(back[21]));
}

/* A 16 x 16 tile of amax 5.25 = 2688 / 512: S = 512, D = 2^-9, code 0x7E (448), so every
 * element decodes to e2m1 * 0.875; elements 5.25, 0.875 and -1.75 are exact. The columnwise
 * copy is the rowwise one transposed. The GEMM of two such rows is 41 * 0.875^2, exactly. */
static void test_tile_and_gemm(void) {
    static float x[16 * 16];
    memset(x, 0, sizeof x);
    for (int r = 0; r < 16; r++) {
        x[r * 16 + r] = 5.25f;
        x[r * 16 + (r + 1) % 16] = 0.875f;
        x[r * 16 + (r + 2) % 16] = -1.75f;
    }
    uint8_t rd[128], cd[128], rs[8], cs[8];
    lowp_tensor t = {LOWP_FORMAT_F32, 16, 16, x, LOWP_DEVICE_HOST};
    lowp_qtensor row = {
        LOWP_FORMAT_E2M1, LOWP_SCALING_NV16X16, 16, 16, rd, rs, LOWP_DEVICE_HOST, NULL, 0};
    lowp_qtensor col = row;
    col.data = cd;
    col.scales = cs;
    CHECK_OK(lowp_quantize(&t, &row, &col, NULL));
    CHECKF(rs[0] == 0x7E && cs[0] == 0x7E && tensor_dec(&row) == 0x1p-9f, "%02X %g", rs[0],
           (double) tensor_dec(&row));
    int transposed = 1;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) {
            const int a = (rd[r * 8 + c / 2] >> (4 * (c & 1))) & 0xF;
            const int b = (cd[c * 8 + r / 2] >> (4 * (r & 1))) & 0xF;
            transposed &= a == b;
        }
    CHECK(transposed);
    CHECK(rd[0] == 0x27 && rd[1] == 0x0C); /* row 0: 6, 1, -2, 0 */
    float c[16 * 16];
    lowp_tensor ct = {LOWP_FORMAT_F32, 16, 16, c, LOWP_DEVICE_HOST};
    CHECK_OK(lowp_gemm(&row, &row, &ct, NULL));
    CHECKF(c[0] == 41 * 0.765625f && c[1] == (6 * 0 + 1 * 6 - 2 * 1) * 0.765625f, "%g %g",
           (double) c[0], (double) c[1]);
    float c2[16 * 16];
    lowp_tensor ct2 = {LOWP_FORMAT_F32, 16, 16, c2, LOWP_DEVICE_HOST};
    CHECK_OK(lowp_gemm_kn(&row, &col, &ct2, NULL));
    CHECK(memcmp(c, c2, sizeof c) == 0);
}

static void test_errors(void) {
    float x[32] = {1};
    uint8_t data[64], scales[64];
    lowp_tensor t = {LOWP_FORMAT_F32, 1, 32, x, LOWP_DEVICE_HOST};
    lowp_qtensor q = {LOWP_FORMAT_E4M3, LOWP_SCALING_NV16, 1,    32, data,
                      scales,           LOWP_DEVICE_HOST,  NULL, 0};
    CHECK_FAIL(lowp_quantize(&t, &q, NULL, NULL), LOWP_ERR_UNSUPPORTED,
               "row_out.format (e4m3) is not supported by scaling nv16 (e2m1)");
    const int32_t offs[1] = {1};
    lowp_qtensor g = {LOWP_FORMAT_E2M1, LOWP_SCALING_NV16X16, 32,   1, data,
                      scales,           LOWP_DEVICE_HOST,     offs, 1};
    CHECK_FAIL(lowp_quantize_grouped(&t, NULL, &g, NULL), LOWP_ERR_UNSUPPORTED, "nv16x16");
    lowp_qtensor a = {
        LOWP_FORMAT_E2M1, LOWP_SCALING_NV16, 0, 0, NULL, NULL, LOWP_DEVICE_HOST, NULL, 0};
    lowp_qtensor b = {
        LOWP_FORMAT_E2M1, LOWP_SCALING_MX32, 0, 0, NULL, NULL, LOWP_DEVICE_HOST, NULL, 0};
    CHECK_FAIL(lowp_gemm_pair_check(&a, &b), LOWP_ERR_UNSUPPORTED, "a (nv16 e2m1) x b (mx32 e2m1)");
    uint8_t code;
    CHECK_FAIL(lowp_nvfp4_block_scale(1.0f, INFINITY, &code), LOWP_ERR_INVALID_ARG, "encode_scale");
    float s;
    CHECK_OK(lowp_nvfp4_tensor_scale(NAN, &s));
    CHECK(s == 1.0f);
    CHECK_OK(lowp_nvfp4_tensor_scale(1e-40f, &s));
    CHECK(s == 3.40282347e38f);
}

int main(void) {
    test_sizes();
    test_example();
    test_tile_and_gemm();
    test_errors();
    return testutil_finish();
}
