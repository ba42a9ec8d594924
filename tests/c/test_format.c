/* The scalar reference of docs/numerics.md sections 1-2, on the hand-picked cases the document
 * names (ties at the top, NaN codes, E8M0 subnormal scale, E2M1 rules, SR thresholds) and the
 * traits table. The exhaustive comparison with ml_dtypes is in test_oracle_formats.py. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "lowp/format.h"
#include "testutil.h"

static uint32_t enc(lowp_format f, float x, lowp_overflow ov) {
    uint32_t c = 0xDEADBEEF;
    CHECK(lowp_encode(f, x, ov, &c) == LOWP_OK);
    return c;
}
static uint32_t enc_sr(lowp_format f, float x, uint32_t r, lowp_overflow ov) {
    uint32_t c = 0xDEADBEEF;
    CHECK(lowp_encode_sr(f, x, r, ov, &c) == LOWP_OK);
    return c;
}
static float dec(lowp_format f, uint32_t c) {
    float v = -12345.0f;
    CHECK(lowp_decode(f, c, &v) == LOWP_OK);
    return v;
}

#define SAT    LOWP_OVERFLOW_SATFINITE
#define NONSAT LOWP_OVERFLOW_NONSAT
#define EQ(f, x, ov, want)                                                                         \
    do {                                                                                           \
        uint32_t got_ = enc(f, x, ov);                                                             \
        CHECKF(got_ == (uint32_t) (want), "encode(%d, %a, %d) = 0x%X, want 0x%X", (int) f,         \
               (double) (x), (int) ov, got_, (uint32_t) (want));                                   \
    } while (0)

static void test_traits(void) {
    const lowp_format_traits *t;
    CHECK(lowp_format_get(LOWP_FORMAT_E4M3, &t) == LOWP_OK);
    CHECK(t->fmax == 448.0f && t->emax == 8 && t->bias == 7 && t->bits == 8);
    CHECK(lowp_format_get(LOWP_FORMAT_E5M2, &t) == LOWP_OK);
    CHECK(t->fmax == 57344.0f && t->emax == 15 && t->bias == 15);
    CHECK(lowp_format_get(LOWP_FORMAT_E2M1, &t) == LOWP_OK);
    CHECK(t->fmax == 6.0f && t->emax == 2 && t->bits == 4);
    CHECK(lowp_format_get(LOWP_FORMAT_E8M0, &t) == LOWP_OK);
    CHECK(t->fmax == 0x1p127f && !t->is_signed && t->encode_sr == NULL);
    /* Every entry: fmax is the decode of max_code, emax = floor(log2(fmax)), names parse. */
    for (int f = 0; f < LOWP_FORMAT_COUNT; f++) {
        CHECK(lowp_format_get((lowp_format) f, &t) == LOWP_OK);
        CHECK((int) t->format == f);
        CHECKF(t->decode(t->max_code) == t->fmax, "%s", t->name);
        int e2;
        frexpf(t->fmax, &e2);
        CHECKF(e2 - 1 == t->emax, "%s", t->name);
        CHECKF(t->decode(t->nan_code) != t->decode(t->nan_code) || f == LOWP_FORMAT_E2M1, "%s",
               t->name);
        lowp_format back;
        CHECK(lowp_format_from_name(t->name, &back) == LOWP_OK && (int) back == f);
    }
    lowp_format back;
    CHECK(lowp_format_from_name("fp8", &back) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "fp8") != NULL);
    CHECK(lowp_format_get(LOWP_FORMAT_COUNT, &t) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "format (7)") != NULL);
}

static void test_e4m3(void) {
    lowp_format f = LOWP_FORMAT_E4M3;
    EQ(f, 448.0f, SAT, 0x7E);
    EQ(f, 464.0f, NONSAT, 0x7E); /* tie between 448 and 480 goes to even (448) */
    EQ(f, 464.0f, SAT, 0x7E);
    EQ(f, nextafterf(464.0f, 1e9f), NONSAT, 0x7F);
    EQ(f, nextafterf(464.0f, 1e9f), SAT, 0x7E);
    EQ(f, 480.0f, NONSAT, 0x7F);
    EQ(f, -1e30f, SAT, 0xFE);
    EQ(f, INFINITY, SAT, 0x7E);
    EQ(f, -INFINITY, SAT, 0xFE);
    EQ(f, INFINITY, NONSAT, 0x7F);
    EQ(f, -INFINITY, NONSAT, 0xFF);
    EQ(f, NAN, SAT, 0x7F);
    EQ(f, -NAN, SAT, 0xFF);
    EQ(f, 0.0f, SAT, 0x00);
    EQ(f, -0.0f, SAT, 0x80);
    EQ(f, 0x1p-9f, SAT, 0x01);  /* min subnormal */
    EQ(f, 0x1p-10f, SAT, 0x00); /* half of it: tie to even (0) */
    EQ(f, 0x1.8p-10f, SAT, 0x01);
    EQ(f, 0x1.8p-9f, SAT, 0x02);        /* 1.5 quanta: tie to even (2) */
    EQ(f, 0x1.cp-7f, SAT, 0x08 - 0x01); /* largest subnormal 7 * 2^-9 */
    EQ(f, u2f(0x00000001), SAT, 0x00);  /* binary32 subnormals become zero, sign kept */
    EQ(f, -u2f(0x007FFFFF), SAT, 0x80);
    EQ(f, 240.0f, SAT, 0x77);
    EQ(f, 256.0f, SAT, 0x78); /* S.1111.000 is finite in E4M3 */
    CHECK(dec(f, 0x7E) == 448.0f && dec(f, 0x78) == 256.0f && dec(f, 0x01) == 0x1p-9f);
    CHECK(isnan(dec(f, 0x7F)) && isnan(dec(f, 0xFF)));
    CHECK(signbit(dec(f, 0x80)) && dec(f, 0x80) == 0.0f);
}

static void test_e5m2(void) {
    lowp_format f = LOWP_FORMAT_E5M2;
    EQ(f, 57344.0f, NONSAT, 0x7B);
    EQ(f, 61440.0f, NONSAT, 0x7C); /* tie between 57344 (odd) and "65536" rounds up to Inf */
    EQ(f, 61440.0f, SAT, 0x7B);
    EQ(f, nextafterf(61440.0f, 0.0f), NONSAT, 0x7B);
    EQ(f, INFINITY, NONSAT, 0x7C);
    EQ(f, -INFINITY, NONSAT, 0xFC);
    EQ(f, INFINITY, SAT, 0x7B);
    EQ(f, NAN, NONSAT, 0x7E);
    EQ(f, -NAN, SAT, 0xFE);
    EQ(f, 0x1p-16f, SAT, 0x01);
    EQ(f, 0x1p-17f, SAT, 0x00);
    CHECK(isinf(dec(f, 0x7C)) && isnan(dec(f, 0x7D)) && isnan(dec(f, 0x7F)));
    CHECK(dec(f, 0xFC) == -INFINITY);
}

static void test_e2m1(void) {
    lowp_format f = LOWP_FORMAT_E2M1;
    const float vals[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (uint32_t c = 0; c < 16; c++) {
        float want = (c & 8) ? -vals[c & 7] : vals[c & 7];
        CHECK(dec(f, c) == want);
        CHECK(enc(f, want, SAT) == c);
    }
    EQ(f, 0.25f, SAT, 0x0);   /* tie to even: 0 */
    EQ(f, 0.75f, SAT, 0x2);   /* tie between 0.5 (odd) and 1.0: even */
    EQ(f, 5.0f, SAT, 0x6);    /* tie between 4 (even) and 6 */
    EQ(f, 7.0f, NONSAT, 0x7); /* no Inf: overflow saturates under both policies */
    EQ(f, INFINITY, NONSAT, 0x7);
    EQ(f, -INFINITY, SAT, 0xF);
    EQ(f, NAN, SAT, 0x0); /* NaN encodes as 0; the MX block scale carries the NaN */
    EQ(f, -NAN, NONSAT, 0x0);
    EQ(f, -0.0f, SAT, 0x8);
}

static void test_e8m0(void) {
    lowp_format f = LOWP_FORMAT_E8M0;
    /* Decode: 0x00 is 2^-127, a binary32 subnormal (bits 0x00400000), not zero. */
    CHECK(f2u(dec(f, 0x00)) == 0x00400000u);
    CHECK(dec(f, 127) == 1.0f && dec(f, 0xFE) == 0x1p127f && isnan(dec(f, 0xFF)));
    EQ(f, 1.0f, SAT, 127);
    EQ(f, 1.5f, SAT, 128); /* ml_dtypes: half up in the exponent */
    EQ(f, 3.0f, SAT, 129);
    EQ(f, 1.25f, SAT, 127);
    EQ(f, u2f(0x00400000), SAT, 0);
    EQ(f, u2f(0x00400001), SAT, 0); /* subnormal midpoint is 1.5 * 2^-127 (0x00600000) */
    EQ(f, u2f(0x005FFFFF), SAT, 0);
    EQ(f, u2f(0x00600000), SAT, 1);
    EQ(f, u2f(0x00200000), SAT, 0);
    EQ(f, u2f(0x7F400000), NONSAT, 0xFF);
    EQ(f, u2f(0x7F400000), SAT, 0xFE);
    EQ(f, INFINITY, SAT, 0xFE);
    EQ(f, INFINITY, NONSAT, 0xFF);
    EQ(f, 0.0f, SAT, 0xFF);
    EQ(f, -2.0f, SAT, 0xFF);
    EQ(f, NAN, SAT, 0xFF);
}

static void test_bf16_f16(void) {
    lowp_format b = LOWP_FORMAT_BF16, h = LOWP_FORMAT_F16;
    EQ(b, 1.0f, SAT, 0x3F80);
    EQ(b, u2f(0x3F808000), SAT, 0x3F80); /* tie to even */
    EQ(b, u2f(0x3F818000), SAT, 0x3F82);
    EQ(b, u2f(0x7F7FFFFF), NONSAT, 0x7F80);
    EQ(b, u2f(0x7F7FFFFF), SAT, 0x7F7F);
    EQ(b, INFINITY, NONSAT, 0x7F80);
    EQ(b, -INFINITY, SAT, 0xFF7F);
    EQ(b, NAN, SAT, 0x7FC0);
    EQ(b, -NAN, NONSAT, 0xFFC0);
    EQ(b, u2f(0x7F800001), NONSAT, 0x7FC0); /* signalling NaN: canonical quiet NaN */
    EQ(b, u2f(0x00018000), SAT, 0x0002);    /* subnormals are rounded, not flushed */
    EQ(b, u2f(0x00008000), SAT, 0x0000);
    CHECK(f2u(dec(b, 0x0001)) == 0x00010000u);
    EQ(h, 65504.0f, NONSAT, 0x7BFF);
    EQ(h, 65520.0f, NONSAT, 0x7C00);
    EQ(h, 65520.0f, SAT, 0x7BFF);
    EQ(h, 0x1p-24f, SAT, 0x0001);
    EQ(h, 0x1p-25f, SAT, 0x0000);
    EQ(h, 0x1.8p-24f, SAT, 0x0002);
    EQ(h, NAN, SAT, 0x7E00);
    EQ(h, -1.0f, SAT, 0xBC00);
    CHECK(dec(h, 0x7C00) == INFINITY && isnan(dec(h, 0x7E01)) && dec(h, 0x0001) == 0x1p-24f);
}

static void test_sr(void) {
    lowp_format f = LOWP_FORMAT_E4M3;
    /* 1.0625 is halfway between 1.0 (0x38) and 1.125 (0x39): 20 bits are discarded, and the
     * top bit of the random word decides. */
    CHECK(enc_sr(f, 1.0625f, 0x00000000u, SAT) == 0x38);
    CHECK(enc_sr(f, 1.0625f, 0x7FFFFFFFu, SAT) == 0x38);
    CHECK(enc_sr(f, 1.0625f, 0x80000000u, SAT) == 0x39);
    CHECK(enc_sr(f, -1.0625f, 0xFFFFFFFFu, SAT) == 0xB9);
    /* A quarter of the way: rounds up for r >= 3/4 * 2^32. */
    CHECK(enc_sr(f, 1.03125f, 0xBFFFFFFFu, SAT) == 0x38);
    CHECK(enc_sr(f, 1.03125f, 0xC0000000u, SAT) == 0x39);
    /* Representable values never move, whatever the bits. */
    CHECK(enc_sr(f, 1.0f, 0xFFFFFFFFu, SAT) == 0x38);
    CHECK(enc_sr(f, 448.0f, 0xFFFFFFFFu, NONSAT) == 0x7E);
    /* Saturation applies after rounding. */
    CHECK(enc_sr(f, 450.0f, 0xFFFFFFFFu, SAT) == 0x7E);
    CHECK(enc_sr(f, 450.0f, 0xFFFFFFFFu, NONSAT) == 0x7F);
    CHECK(enc_sr(f, 450.0f, 0x00000000u, NONSAT) == 0x7E);
    CHECK(enc_sr(f, NAN, 0x12345678u, SAT) == 0x7F);
    /* Subnormal target: 0.5 * 2^-9 rounds to 2^-9 half of the time. */
    CHECK(enc_sr(f, 0x1p-10f, 0x7FFFFFFFu, SAT) == 0x00);
    CHECK(enc_sr(f, 0x1p-10f, 0x80000000u, SAT) == 0x01);
    /* BF16: 16 discarded bits, the top 16 of the random word. */
    CHECK(enc_sr(LOWP_FORMAT_BF16, u2f(0x3F808000), 0x7FFFFFFFu, SAT) == 0x3F80);
    CHECK(enc_sr(LOWP_FORMAT_BF16, u2f(0x3F808000), 0x80000000u, SAT) == 0x3F81);
    CHECK(enc_sr(LOWP_FORMAT_BF16, u2f(0x7F7FFFFF), 0xFFFFFFFFu, SAT) == 0x7F7F);
    CHECK(enc_sr(LOWP_FORMAT_BF16, u2f(0x7F7FFFFF), 0xFFFFFFFFu, NONSAT) == 0x7F80);
    /* E2M1: 2.5 between 2 and 3. */
    CHECK(enc_sr(LOWP_FORMAT_E2M1, 2.5f, 0x7FFFFFFFu, SAT) == 0x4);
    CHECK(enc_sr(LOWP_FORMAT_E2M1, 2.5f, 0x80000000u, SAT) == 0x5);
    uint32_t c;
    CHECK(lowp_encode_sr(LOWP_FORMAT_E8M0, 1.0f, 0, SAT, &c) == LOWP_ERR_UNSUPPORTED);
    CHECK(strstr(lowp_last_error(), "e8m0") != NULL);
}

static void test_errors_and_packing(void) {
    uint32_t c;
    float v;
    CHECK(lowp_encode(LOWP_FORMAT_E4M3, 1.0f, SAT, NULL) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "code") != NULL);
    CHECK(lowp_encode((lowp_format) 99, 1.0f, SAT, &c) == LOWP_ERR_INVALID_ARG);
    CHECK(lowp_encode(LOWP_FORMAT_E4M3, 1.0f, (lowp_overflow) 5, &c) == LOWP_ERR_INVALID_ARG);
    CHECK(strstr(lowp_last_error(), "overflow (5)") != NULL);
    CHECK(lowp_decode(LOWP_FORMAT_E4M3, 0x100, &v) == LOWP_ERR_INVALID_ARG);
    CHECK(lowp_decode(LOWP_FORMAT_E2M1, 0x10, &v) == LOWP_ERR_INVALID_ARG);
    CHECK(lowp_decode(LOWP_FORMAT_E2M1, 0x1, NULL) == LOWP_ERR_INVALID_ARG);

    const uint8_t codes[5] = {0x1, 0x2, 0x3, 0x4, 0xF};
    uint8_t packed[3] = {0xAA, 0xAA, 0xAA}, back[5];
    CHECK(lowp_fp4_pack(codes, 5, packed) == LOWP_OK);
    CHECK(packed[0] == 0x21 && packed[1] == 0x43 && packed[2] == 0x0F);
    CHECK(lowp_fp4_unpack(packed, 5, back) == LOWP_OK);
    CHECK(memcmp(back, codes, 5) == 0);
    CHECK(lowp_fp4_pack(NULL, 5, packed) == LOWP_ERR_INVALID_ARG);
    CHECK(lowp_fp4_pack(NULL, 0, NULL) == LOWP_OK);
}

int main(void) {
    test_traits();
    test_e4m3();
    test_e5m2();
    test_e2m1();
    test_e8m0();
    test_bf16_f16();
    test_sr();
    test_errors_and_packing();
    return testutil_finish();
}
