/* The scale rules of docs/numerics.md sections 3-4 as inline functions, shared by the reference
 * and the fast kernels so that there is one statement of each rule. */
#ifndef LOWP_SCALE_RULES_H
#define LOWP_SCALE_RULES_H

#include <float.h>
#include <math.h>

#include "internal.h"
#include "lowp/format.h"
#include "lowp/scale.h"

/* NaN-propagating max of |x| accumulation: NaN wins over every number. */
static inline float lowp_amax_acc(float m, float x) {
    float a = fabsf(x);
    return (a > m || a != a) ? a : m;
}

/* RCEIL's rounding of d = amax / fmax to a scale code: the smallest power of two >= d. */
static inline int lowp_rule_rceil_code_from_d(uint32_t d) {
    uint32_t de = (d & 0x7FFFFFFFu) >> 23, dm = d & 0x7FFFFFu;
    if (de == 0) return dm > 0x400000u ? 1 : 0;
    return (int) de + (dm != 0);
}

/* Scale code of a block with amax `amax` (0xFF for NaN/Inf, 0x00 for 0). `mode` is resolved
 * (not DEFAULT). */
static inline uint8_t lowp_rule_e8m0_code(float amax, const lowp_format_traits *t,
                                          lowp_scale_mode mode) {
    uint32_t a = lowp_f2u(amax) & 0x7FFFFFFFu;
    if (a >= 0x7F800000u) return 0xFF;
    if (a == 0) return 0x00;
    int e; /* the biased scale code before clamping: e_unbiased + 127 */
    switch (mode) {
    case LOWP_SCALE_MODE_FLOOR: e = (int) (a >> 23) - t->emax; break;
    case LOWP_SCALE_MODE_CEIL: e = (int) (a >> 23) + ((a & 0x7FFFFFu) != 0) - t->emax; break;
    case LOWP_SCALE_MODE_EVEN: {
        uint32_t b = (a + (1u << (22 - t->mbits))) & 0xFF800000u;
        e = (int) (b >> 23) - t->emax;
        break;
    }
    default: { /* RCEIL: one binary32 multiply by the binary32 constant 1/fmax */
        float inv = 1.0f / t->fmax;
        e = lowp_rule_rceil_code_from_d(lowp_f2u(amax * inv));
        break;
    }
    }
    if (e < 0) e = 0;
    if (e > 254) e = 254;
    return (uint8_t) e;
}

/* 2^(127 - code): the factor that brings a block into the element range (code 254 gives the
 * binary32 subnormal 2^-127, code 0 gives 2^127). */
static inline float lowp_rule_e8m0_quant_factor(uint8_t code) {
    uint32_t be = 254u - code; /* biased exponent of 2^(127-code) */
    return lowp_u2f(be == 0 ? 0x00400000u : be << 23);
}

/* 2^(code - 127): the decode factor (NaN for 0xFF). */
static inline float lowp_rule_e8m0_value(uint8_t code) {
    if (code == 0xFF) return NAN;
    return lowp_u2f(code == 0 ? 0x00400000u : (uint32_t) code << 23);
}

/* docs/numerics.md section 4, steps 1-3. */
static inline float lowp_rule_fp32_scale(float amax, float fmax, float eps, int pow2) {
    float a = amax > eps ? amax : (amax != amax ? amax : eps);
    if (a == 0.0f || a != a || a == INFINITY) return 1.0f;
    float s = fmax / a;
    if (s == INFINITY) s = FLT_MAX;
    if (pow2) s = lowp_u2f(lowp_f2u(s) & 0xFF800000u);
    return s;
}

/* NVFP4 (docs/numerics.md section 4b, steps 1-4). The constants are binary32: 2688 = 448 * 6
 * (E4M3 fmax times E2M1 fmax), and 1/6 rounded to binary32. */
#define LOWP_NV_ENC_NUM 2688.0f
#define LOWP_NV_SIXTH   (1.0f / 6.0f)

/* Step 1: the tensor encode scale S = 2688 / amax (one rounded division), FLT_MAX when that is
 * +Inf; 1 when amax is 0, Inf or NaN. */
static inline float lowp_rule_nv_tensor_scale(float amax) {
    if (!(amax > 0.0f) || amax == INFINITY) return 1.0f;
    float s = LOWP_NV_ENC_NUM / amax;
    return s == INFINITY ? FLT_MAX : s;
}

/* Step 2: the E4M3 code of a block: 0x7F (NaN) when the block holds a NaN or an Inf (bamax is
 * then NaN or Inf), else RNE satfinite of bamax * (S * (1/6)). */
static inline uint8_t lowp_rule_nv_block_code(float bamax, float s_enc,
                                              const lowp_format_traits *e4m3) {
    if (!(lowp_f2u(bamax) < 0x7F800000u)) return 0x7F;
    return (uint8_t) e4m3->encode(bamax * (s_enc * LOWP_NV_SIXTH), LOWP_OVERFLOW_SATFINITE);
}

/* Step 3: the element factor 1 / (decode(code) * s_dec), FLT_MAX when that is +Inf (code 0, or
 * a product that underflows); s_dec = 1 / S is the tensor decode scale. */
static inline float lowp_rule_nv_elem_factor(uint8_t code, float s_dec,
                                             const lowp_format_traits *e4m3) {
    float f = 1.0f / (e4m3->decode(code) * s_dec);
    return f == INFINITY ? FLT_MAX : f;
}

#endif
