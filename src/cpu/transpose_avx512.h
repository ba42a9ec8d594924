/* A 16x16 transpose of 32-bit elements in AVX-512 registers, for the files compiled with the
 * AVX-512 flags (src/cpu/CMakeLists.txt). */
#ifndef LOWP_TRANSPOSE_AVX512_H
#define LOWP_TRANSPOSE_AVX512_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

/* dst row p (at dst + p * ldd) = column p of the 16 rows at src (row i at src + i * lds);
 * strides in elements. */
static inline __attribute__((always_inline)) void
lowp_transpose16x16_u32(const uint32_t *src, size_t lds, uint32_t *dst, size_t ldd) {
    __m512i r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(src + lds * (size_t) i);
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    /* r[4i + j], 128-bit lane L: column 4L + j of rows 4i..4i+3. */
    for (int jj = 0; jj < 4; jj++) {
        __m512i a = _mm512_shuffle_i32x4(r[jj], r[4 + jj], 0x88);
        __m512i b = _mm512_shuffle_i32x4(r[jj], r[4 + jj], 0xDD);
        __m512i c = _mm512_shuffle_i32x4(r[8 + jj], r[12 + jj], 0x88);
        __m512i d = _mm512_shuffle_i32x4(r[8 + jj], r[12 + jj], 0xDD);
        _mm512_storeu_si512(dst + ldd * (size_t) jj, _mm512_shuffle_i32x4(a, c, 0x88));
        _mm512_storeu_si512(dst + ldd * (size_t) (8 + jj), _mm512_shuffle_i32x4(a, c, 0xDD));
        _mm512_storeu_si512(dst + ldd * (size_t) (4 + jj), _mm512_shuffle_i32x4(b, d, 0x88));
        _mm512_storeu_si512(dst + ldd * (size_t) (12 + jj), _mm512_shuffle_i32x4(b, d, 0xDD));
    }
}

#endif
