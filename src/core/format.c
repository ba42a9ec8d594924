/* The format traits table and the scalar reference encoders/decoders (docs/numerics.md 1-2).
 *
 * All narrow float formats share one integer algorithm: split the binary32 input into sign,
 * biased exponent and 24-bit significand, find how many low significand bits the target
 * drops (more when the result is subnormal in the target), round those bits away (RNE or
 * stochastically) and add the rounded significand to the target exponent field, so that a
 * carry out of the mantissa bumps the exponent for free. Overflow is then a comparison of
 * the magnitude code against the largest finite code. E8M0 and BF16 have their own rules.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "internal.h"
#include "lowp/format.h"

/* Parameters of a sign-exponent-mantissa format with fewer bits than binary32. */
typedef struct small_spec {
    int bits, mbits, bias;
    uint32_t max_code;  /* magnitude code of fmax */
    uint32_t nan_code;  /* magnitude code emitted for NaN input (0 for E2M1) */
    uint32_t over_code; /* magnitude code of nonsat overflow: Inf, or NaN, or fmax */
} small_spec;

static const small_spec SPEC_F16 = {16, 10, 15, 0x7BFF, 0x7E00, 0x7C00};
static const small_spec SPEC_E4M3 = {8, 3, 7, 0x7E, 0x7F, 0x7F};
static const small_spec SPEC_E5M2 = {8, 2, 15, 0x7B, 0x7E, 0x7C};
static const small_spec SPEC_E2M1 = {4, 1, 1, 0x7, 0x0, 0x7};

/* sr == 0: RNE; otherwise stochastic rounding with the random word rbits. */
static uint32_t small_encode(const small_spec *s, float x, lowp_overflow ov, int sr,
                             uint32_t rbits) {
    uint32_t u = lowp_f2u(x);
    uint32_t a = u & 0x7FFFFFFFu;
    uint32_t sbit = (u >> 31) << (s->bits - 1);
    if (a > 0x7F800000u) return s->nan_code == 0 ? 0 : (sbit | s->nan_code);
    if (a == 0x7F800000u)
        return sbit | (ov == LOWP_OVERFLOW_SATFINITE ? s->max_code : s->over_code);
    int e32 = (int) (a >> 23);
    if (e32 == 0) return sbit; /* binary32 zero or subnormal: far below half the min subnormal */
    uint32_t m24 = (a & 0x7FFFFFu) | 0x800000u;
    int e = e32 - 127 + s->bias; /* biased exponent in the target */
    /* Number of significand bits below the target's quantum at this exponent. */
    int shift = 23 - s->mbits + (e >= 1 ? 0 : 1 - e);
    uint32_t q; /* the rounded value, in units of the quantum */
    if (!sr) {
        if (shift > 25) {
            q = 0; /* m24 < 2^24 <= half a quantum */
        } else {
            uint32_t half_minus_1 = (1u << (shift - 1)) - 1u;
            q = (m24 + half_minus_1 + ((m24 >> shift) & 1u)) >> shift;
        }
    } else {
        /* m24 as a fixed-point number of quanta with 32 fraction bits, plus a uniform
         * 32-bit integer: the carry into the integer part happens with probability equal to
         * the discarded fraction (exactly the "add d random bits, truncate" rule). */
        uint64_t v;
        if (shift <= 32)
            v = (uint64_t) m24 << (32 - shift);
        else if (shift - 32 < 32)
            v = (uint64_t) (m24 >> (shift - 32));
        else
            v = 0;
        q = (uint32_t) ((v + rbits) >> 32);
    }
    uint32_t code = e >= 1 ? ((uint32_t) (e - 1) << s->mbits) + q : q;
    if (code > s->max_code) code = ov == LOWP_OVERFLOW_SATFINITE ? s->max_code : s->over_code;
    return sbit | code;
}

static float small_decode(const small_spec *s, int ebits, int has_inf, int has_nan_all_ones,
                          uint32_t code) {
    uint32_t mag_mask = (1u << (s->bits - 1)) - 1u;
    uint32_t mag = code & mag_mask;
    int neg = (code >> (s->bits - 1)) & 1u;
    uint32_t mmask = (1u << s->mbits) - 1u;
    uint32_t ef = mag >> s->mbits, mf = mag & mmask;
    uint32_t emask = (1u << ebits) - 1u;
    float v;
    if (has_inf && ef == emask) {
        v = mf == 0 ? INFINITY : NAN;
    } else if (has_nan_all_ones && mag == mag_mask) {
        v = NAN;
    } else if (ef == 0) {
        v = ldexpf((float) mf, 1 - s->bias - s->mbits);
    } else {
        v = ldexpf((float) (mf | (1u << s->mbits)), (int) ef - s->bias - s->mbits);
    }
    return neg ? -v : v;
}

/* ---- per-format entry points ---- */

static uint32_t f32_encode(float x, lowp_overflow ov) {
    (void) ov; /* nothing overflows binary32 */
    return lowp_f2u(x);
}
static float f32_decode(uint32_t c) {
    return lowp_u2f(c);
}

static uint32_t bf16_round(float x, lowp_overflow ov, int sr, uint32_t rbits) {
    uint32_t u = lowp_f2u(x);
    uint32_t a = u & 0x7FFFFFFFu, sign = u & 0x80000000u;
    if (a > 0x7F800000u) return (sign >> 16) | 0x7FC0u;
    if (a == 0x7F800000u) return (sign >> 16) | (ov == LOWP_OVERFLOW_SATFINITE ? 0x7F7Fu : 0x7F80u);
    uint32_t r = sr ? (a + (rbits >> 16)) >> 16 : (a + 0x7FFFu + ((a >> 16) & 1u)) >> 16;
    if (r >= 0x7F80u) r = ov == LOWP_OVERFLOW_SATFINITE ? 0x7F7Fu : 0x7F80u;
    return (sign >> 16) | r;
}
static uint32_t bf16_encode(float x, lowp_overflow ov) {
    return bf16_round(x, ov, 0, 0);
}
static uint32_t bf16_encode_sr(float x, uint32_t r, lowp_overflow ov) {
    return bf16_round(x, ov, 1, r);
}
static float bf16_decode(uint32_t c) {
    return lowp_u2f((c & 0xFFFFu) << 16);
}

#define SMALL_FORMAT(NAME, SPEC, EBITS, HAS_INF, NAN_ALL_ONES)                                     \
    static uint32_t NAME##_encode(float x, lowp_overflow ov) {                                     \
        return small_encode(&SPEC, x, ov, 0, 0);                                                   \
    }                                                                                              \
    static uint32_t NAME##_encode_sr(float x, uint32_t r, lowp_overflow ov) {                      \
        return small_encode(&SPEC, x, ov, 1, r);                                                   \
    }                                                                                              \
    static float NAME##_decode(uint32_t c) {                                                       \
        return small_decode(&SPEC, EBITS, HAS_INF, NAN_ALL_ONES, c);                               \
    }

SMALL_FORMAT(f16, SPEC_F16, 5, 1, 0)
SMALL_FORMAT(e4m3, SPEC_E4M3, 4, 0, 1)
SMALL_FORMAT(e5m2, SPEC_E5M2, 5, 1, 0)
SMALL_FORMAT(e2m1, SPEC_E2M1, 2, 0, 0)

/* E8M0 as a value format (scale computation has its own rules, docs/numerics.md section 3).
 * Matches ml_dtypes' float8_e8m0fnu (0.7 and later): the value rounds half up to a power of two,
 * the midpoint being 1.5 * 2^k: a normal input gives code = E + (M >= 0x400000); a binary32
 * subnormal gives 1 from 1.5 * 2^-127 (M >= 0x600000) up, else 0 (2^-127; there is no zero to
 * round to); zero, negatives and NaN give NaN (0xFF); overflow and +Inf
 * give 0xFF under nonsat and 0xFE (2^127) under satfinite. */
static uint32_t e8m0_encode(float x, lowp_overflow ov) {
    uint32_t u = lowp_f2u(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u || (u >> 31) || u == 0) return 0xFF;
    if (u == 0x7F800000u) return ov == LOWP_OVERFLOW_SATFINITE ? 0xFE : 0xFF;
    uint32_t e = u >> 23, m = u & 0x7FFFFFu;
    uint32_t code = e == 0 ? (m >= 0x600000u ? 1u : 0u) : e + (m >= 0x400000u ? 1u : 0u);
    if (code > 0xFE) code = ov == LOWP_OVERFLOW_SATFINITE ? 0xFE : 0xFF;
    return code;
}
static float e8m0_decode(uint32_t c) {
    c &= 0xFF;
    if (c == 0xFF) return NAN;
    return lowp_u2f(c == 0 ? 0x00400000u : c << 23);
}

static const lowp_format_traits g_traits[LOWP_FORMAT_COUNT] = {
    [LOWP_FORMAT_F32] = {LOWP_FORMAT_F32, "f32", 32, 8, 23, 127, 1, 1, FLT_MAX, 127, FLT_MIN,
                         0x1p-149f, 0x7F7FFFFFu, 0x7FC00000u, f32_encode, NULL, f32_decode},
    [LOWP_FORMAT_BF16] = {LOWP_FORMAT_BF16, "bf16", 16, 8, 7, 127, 1, 1, 0x1.FEp127f, 127, FLT_MIN,
                          0x1p-133f, 0x7F7Fu, 0x7FC0u, bf16_encode, bf16_encode_sr, bf16_decode},
    [LOWP_FORMAT_F16] = {LOWP_FORMAT_F16, "f16", 16, 5, 10, 15, 1, 1, 65504.0f, 15, 0x1p-14f,
                         0x1p-24f, 0x7BFFu, 0x7E00u, f16_encode, f16_encode_sr, f16_decode},
    [LOWP_FORMAT_E4M3] = {LOWP_FORMAT_E4M3, "e4m3", 8, 4, 3, 7, 1, 0, 448.0f, 8, 0x1p-6f, 0x1p-9f,
                          0x7Eu, 0x7Fu, e4m3_encode, e4m3_encode_sr, e4m3_decode},
    [LOWP_FORMAT_E5M2] = {LOWP_FORMAT_E5M2, "e5m2", 8, 5, 2, 15, 1, 1, 57344.0f, 15, 0x1p-14f,
                          0x1p-16f, 0x7Bu, 0x7Eu, e5m2_encode, e5m2_encode_sr, e5m2_decode},
    [LOWP_FORMAT_E2M1] = {LOWP_FORMAT_E2M1, "e2m1", 4, 2, 1, 1, 1, 0, 6.0f, 2, 1.0f, 0.5f, 0x7u,
                          0x0u, e2m1_encode, e2m1_encode_sr, e2m1_decode},
    [LOWP_FORMAT_E8M0] = {LOWP_FORMAT_E8M0, "e8m0", 8, 8, 0, 127, 0, 0, 0x1p127f, 127, 0x1p-127f,
                          0x1p-127f, 0xFEu, 0xFFu, e8m0_encode, NULL, e8m0_decode},
};

lowp_status lowp_format_get(lowp_format format, const lowp_format_traits **out) {
    LOWP_CHECK_PTR("lowp_format_get", out);
    if ((unsigned) format >= LOWP_FORMAT_COUNT)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_format_get: format (%d) is not a lowp_format",
                         (int) format);
    *out = &g_traits[format];
    return LOWP_OK;
}

lowp_status lowp_format_from_name(const char *name, lowp_format *out) {
    LOWP_CHECK_PTR("lowp_format_from_name", name);
    LOWP_CHECK_PTR("lowp_format_from_name", out);
    for (int f = 0; f < LOWP_FORMAT_COUNT; f++) {
        if (strcmp(name, g_traits[f].name) == 0) {
            *out = (lowp_format) f;
            return LOWP_OK;
        }
    }
    return lowp_fail(LOWP_ERR_INVALID_ARG,
                     "lowp_format_from_name: name (\"%s\") is not one of f32, bf16, f16, e4m3, "
                     "e5m2, e2m1, e8m0",
                     name);
}

int lowp_overflow_resolve(int format, int overflow) {
    if (overflow != LOWP_OVERFLOW_DEFAULT) return overflow;
    return format == LOWP_FORMAT_BF16 || format == LOWP_FORMAT_F16 ? LOWP_OVERFLOW_NONSAT
                                                                   : LOWP_OVERFLOW_SATFINITE;
}

static lowp_status check_overflow(const char *fn, lowp_overflow ov) {
    if (ov != LOWP_OVERFLOW_SATFINITE && ov != LOWP_OVERFLOW_NONSAT && ov != LOWP_OVERFLOW_DEFAULT)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "%s: overflow (%d) is not a lowp_overflow", fn,
                         (int) ov);
    return LOWP_OK;
}

lowp_status lowp_encode(lowp_format format, float x, lowp_overflow overflow, uint32_t *code) {
    const lowp_format_traits *t;
    lowp_status st = lowp_format_get(format, &t);
    if (st != LOWP_OK) return st;
    LOWP_CHECK_PTR("lowp_encode", code);
    if ((st = check_overflow("lowp_encode", overflow)) != LOWP_OK) return st;
    *code = t->encode(x, (lowp_overflow) lowp_overflow_resolve(format, overflow));
    return LOWP_OK;
}

lowp_status lowp_encode_sr(lowp_format format, float x, uint32_t rbits, lowp_overflow overflow,
                           uint32_t *code) {
    const lowp_format_traits *t;
    lowp_status st = lowp_format_get(format, &t);
    if (st != LOWP_OK) return st;
    LOWP_CHECK_PTR("lowp_encode_sr", code);
    if ((st = check_overflow("lowp_encode_sr", overflow)) != LOWP_OK) return st;
    if (!t->encode_sr)
        return lowp_fail(LOWP_ERR_UNSUPPORTED,
                         "lowp_encode_sr: format (%s) has no stochastic rounding", t->name);
    *code = t->encode_sr(x, rbits, (lowp_overflow) lowp_overflow_resolve(format, overflow));
    return LOWP_OK;
}

lowp_status lowp_decode(lowp_format format, uint32_t code, float *out) {
    const lowp_format_traits *t;
    lowp_status st = lowp_format_get(format, &t);
    if (st != LOWP_OK) return st;
    LOWP_CHECK_PTR("lowp_decode", out);
    if (t->bits < 32 && (code >> t->bits) != 0)
        return lowp_fail(LOWP_ERR_INVALID_ARG, "lowp_decode: code (0x%X) has more than %d bits",
                         code, t->bits);
    *out = t->decode(code);
    return LOWP_OK;
}

lowp_status lowp_fp4_pack(const uint8_t *codes, size_t n, uint8_t *packed) {
    if (n == 0) return LOWP_OK;
    LOWP_CHECK_PTR("lowp_fp4_pack", codes);
    LOWP_CHECK_PTR("lowp_fp4_pack", packed);
    for (size_t i = 0; i + 1 < n; i += 2)
        packed[i / 2] = (uint8_t) ((codes[i] & 0xF) | ((codes[i + 1] & 0xF) << 4));
    if (n & 1) packed[n / 2] = codes[n - 1] & 0xF;
    return LOWP_OK;
}

lowp_status lowp_fp4_unpack(const uint8_t *packed, size_t n, uint8_t *codes) {
    if (n == 0) return LOWP_OK;
    LOWP_CHECK_PTR("lowp_fp4_unpack", packed);
    LOWP_CHECK_PTR("lowp_fp4_unpack", codes);
    for (size_t i = 0; i < n; i++) codes[i] = (packed[i / 2] >> (4 * (i & 1))) & 0xF;
    return LOWP_OK;
}
