/* Philox4x32-10 (core/philox.h) on 16 counters at once, for the AVX-512 kernels that draw one
 * random word per element (stochastic rounding in cast_avx512.c and quant_avx512_nv.c).
 * Include only from files compiled with the AVX-512 flags. */
#ifndef LOWP_CPU_PHILOX_AVX512_H
#define LOWP_CPU_PHILOX_AVX512_H

#include <immintrin.h>
#include <stdint.h>

#include "core/philox.h"

/* 32x32 -> 64-bit products of the 16 lanes of a by m: mul_epu32 multiplies the even lanes, the
 * odd lanes are shifted down for a second multiply. The high halves; the low ones in *lo. */
static inline __attribute__((always_inline)) __m512i lowp_philox16_mulhilo(__m512i a, __m512i m,
                                                                           __m512i *lo) {
    const __m512i pe = _mm512_mul_epu32(a, m);
    const __m512i po = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
    *lo = _mm512_mask_blend_epi32(0xAAAA, pe, _mm512_slli_epi64(po, 32));
    return _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(pe, 32), po);
}

/* The Philox blocks of the 16 counters {c0, c1, 0, 0} under the key `seed`: words 0-3 of
 * each lane's block into w[0..3] (lane i of w[k] is word k of counter i's block). */
static inline __attribute__((always_inline)) void lowp_philox16(uint64_t seed, __m512i c0,
                                                                __m512i c1, __m512i w[4]) {
    uint32_t k0 = (uint32_t) seed, k1 = (uint32_t) (seed >> 32);
    const __m512i m0 = _mm512_set1_epi32((int) LOWP_PHILOX_M0);
    const __m512i m1 = _mm512_set1_epi32((int) LOWP_PHILOX_M1);
    __m512i c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
    for (int round = 0; round < 10; round++) {
        __m512i lo0, lo1;
        const __m512i hi0 = lowp_philox16_mulhilo(c0, m0, &lo0);
        const __m512i hi1 = lowp_philox16_mulhilo(c2, m1, &lo1);
        /* three-way xor */
        c0 = _mm512_ternarylogic_epi32(hi1, c1, _mm512_set1_epi32((int) k0), 0x96);
        c2 = _mm512_ternarylogic_epi32(hi0, c3, _mm512_set1_epi32((int) k1), 0x96);
        c1 = lo1;
        c3 = lo0;
        k0 += LOWP_PHILOX_W0;
        k1 += LOWP_PHILOX_W1;
    }
    w[0] = c0, w[1] = c1, w[2] = c2, w[3] = c3;
}

#endif
