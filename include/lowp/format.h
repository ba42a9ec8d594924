/* Number formats: the traits table and the scalar reference encode/decode. Implemented in
 * src/core/format.c.
 *
 * Every format lowp knows is an entry of an append-only enum; its traits (name, bits, bias,
 * fmax, emax and the scalar encode/decode functions) live in one table. The scalar functions
 * are the golden model of docs/numerics.md sections 1-2: every SIMD, AMX or device kernel is tested
 * against them bit for bit.
 *
 *   uint32_t code;
 *   lowp_encode(LOWP_FORMAT_E4M3, 480.0f, LOWP_OVERFLOW_SATFINITE, &code);  // code == 0x7E
 *   float back;
 *   lowp_decode(LOWP_FORMAT_E4M3, code, &back);                             // back == 448
 *
 * Codes are returned in the low bits of a uint32_t: 8 bits for the FP8 formats and E8M0,
 * 4 bits for E2M1 (packing two per byte is the job of lowp_fp4_pack), 16 bits for BF16/F16
 * and the binary32 bit pattern for F32.
 */
#ifndef LOWP_FORMAT_H
#define LOWP_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Append-only: new formats go at the end, values never change (they are stored in files). */
typedef enum lowp_format {
    LOWP_FORMAT_F32 = 0,  /* IEEE binary32 */
    LOWP_FORMAT_BF16 = 1, /* top 16 bits of binary32 */
    LOWP_FORMAT_F16 = 2,  /* IEEE binary16 */
    LOWP_FORMAT_E4M3 = 3, /* OCP FP8 E4M3 ("fn": no Inf, NaN is S.1111.111 only) */
    LOWP_FORMAT_E5M2 = 4, /* OCP FP8 E5M2 (IEEE-like, Inf and NaN) */
    LOWP_FORMAT_E2M1 = 5, /* OCP MXFP4 element, no Inf or NaN */
    LOWP_FORMAT_E8M0 = 6, /* OCP MX scale: unsigned power of two 2^(code-127), 0xFF is NaN */
    LOWP_FORMAT_COUNT
} lowp_format;

/* What happens to a finite value that rounds past fmax, and to +-Inf. LOWP_OVERFLOW_DEFAULT
 * (what lowp_cast_cfg_init picks) is each format's own rule: IEEE for BF16 and F16 (overflow
 * rounds to +-Inf and +-Inf stays, as torch's .to() and ml_dtypes), satfinite for the 8- and
 * 4-bit formats and E8M0. */
typedef enum lowp_overflow {
    LOWP_OVERFLOW_SATFINITE = 0, /* clamp to +-fmax; NaN stays NaN */
    LOWP_OVERFLOW_NONSAT = 1,    /* Inf where the format has it, else NaN */
    LOWP_OVERFLOW_DEFAULT = 2,   /* NONSAT for BF16 and F16, SATFINITE for the others */
} lowp_overflow;

typedef enum lowp_rounding {
    LOWP_ROUNDING_RNE = 0, /* round to nearest, ties to even */
    LOWP_ROUNDING_SR = 1,  /* stochastic rounding with Philox bits (docs/numerics.md section 2) */
} lowp_rounding;

/* Scalar kernels of a format. `encode` rounds RNE; `encode_sr` rounds stochastically with
 * the 32 random bits `rbits` (NULL where the format has no SR: F32, E8M0). */
typedef uint32_t (*lowp_encode_fn)(float x, lowp_overflow overflow);
typedef uint32_t (*lowp_encode_sr_fn)(float x, uint32_t rbits, lowp_overflow overflow);
typedef float (*lowp_decode_fn)(uint32_t code);

typedef struct lowp_format_traits {
    lowp_format format;
    const char *name;    /* "e4m3", "bf16", ... as on the command line */
    int bits;            /* storage bits of one element: 32, 16, 8 or 4 */
    int ebits;           /* exponent bits */
    int mbits;           /* explicit mantissa bits */
    int bias;            /* exponent bias */
    int is_signed;       /* 0 only for E8M0 */
    int has_inf;         /* E5M2, F16, BF16, F32 */
    float fmax;          /* largest finite value */
    int emax;            /* floor(log2(fmax)) */
    float min_normal;    /* smallest positive normal (E8M0: 2^-127) */
    float min_subnormal; /* smallest positive value */
    uint32_t max_code;   /* code of +fmax */
    uint32_t nan_code;   /* the NaN this library emits (positive sign) */
    lowp_encode_fn encode;
    lowp_encode_sr_fn encode_sr;
    lowp_decode_fn decode;
} lowp_format_traits;

/* The traits of `format`; *out points into a static table. */
LOWP_API lowp_status lowp_format_get(lowp_format format, const lowp_format_traits **out);

/* Parse a command-line name ("f32", "bf16", "f16", "e4m3", "e5m2", "e2m1", "e8m0"). */
LOWP_API lowp_status lowp_format_from_name(const char *name, lowp_format *out);

/* Scalar reference conversions (docs/numerics.md sections 1-2). */
LOWP_API lowp_status lowp_encode(lowp_format format, float x, lowp_overflow overflow,
                                 uint32_t *code);
LOWP_API lowp_status lowp_encode_sr(lowp_format format, float x, uint32_t rbits,
                                    lowp_overflow overflow, uint32_t *code);
LOWP_API lowp_status lowp_decode(lowp_format format, uint32_t code, float *out);

/* E2M1 packing: element 2i in the low nibble of byte i, element 2i+1 in the high nibble.
 * `codes` holds one 4-bit code per byte (high nibble ignored); `packed` holds (n+1)/2 bytes,
 * the high nibble of the last byte is 0 when n is odd. */
LOWP_API lowp_status lowp_fp4_pack(const uint8_t *codes, size_t n, uint8_t *packed);
LOWP_API lowp_status lowp_fp4_unpack(const uint8_t *packed, size_t n, uint8_t *codes);

#ifdef __cplusplus
}
#endif
#endif
