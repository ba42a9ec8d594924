/* The AVX2 cast kernel, for x86-64 CPUs without AVX-512: binary32 to BF16 (round to nearest
 * even, either overflow mode) and BF16 to binary32, eight elements at a time, bit for bit the
 * reference's (src/core/format.c, bf16_round and bf16_decode). The other pairs, and stochastic
 * rounding, stay on the reference. */
#include <immintrin.h>
#include <string.h>

#include "cpu.h"

int lowp_cpu_cast_avx2_supports(lowp_format src, lowp_format dst, lowp_rounding rounding) {
    const uint32_t need = LOWP_CAP_AVX2 | LOWP_CAP_FMA;
    if ((lowp_cpu_caps()->flags & need) != need) return 0;
    if (src == LOWP_FORMAT_BF16 && dst == LOWP_FORMAT_F32) return 1;
    return src == LOWP_FORMAT_F32 && dst == LOWP_FORMAT_BF16 && rounding != LOWP_ROUNDING_SR;
}

/* BF16 codes (in the low half of each lane) of eight binary32 bit patterns: NaN -> 0x7FC0 with
 * the sign; the rounded magnitude from 0x7F80 up (Inf and overflow) -> `over`. */
static inline __attribute__((always_inline)) __m256i bf16_of(__m256i u, __m256i over) {
    const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32(0x7FFF)), odd), 16);
    r = _mm256_blendv_epi8(r, over, _mm256_cmpgt_epi32(r, _mm256_set1_epi32(0x7F7F)));
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0),
                           _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000)));
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x8000));
    return _mm256_or_si256(r, sign);
}

void lowp_cpu_cast_avx2(const lowp_cast_piece *p) {
    const size_t n = p->n;
    if (p->src_format == LOWP_FORMAT_BF16) { /* widen: the pattern shifted into the top half */
        const uint16_t *s = (const uint16_t *) p->src;
        uint32_t *d = (uint32_t *) p->dst;
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            const __m128i h = _mm_loadu_si128((const __m128i *) (s + i));
            _mm256_storeu_si256((__m256i *) (d + i),
                                _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        }
        for (; i < n; i++) d[i] = (uint32_t) s[i] << 16;
        return;
    }
    const __m256i over =
        _mm256_set1_epi32(p->cfg->overflow == LOWP_OVERFLOW_SATFINITE ? 0x7F7F : 0x7F80);
    const uint32_t *s = (const uint32_t *) p->src;
    uint16_t *d = (uint16_t *) p->dst;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i lo = bf16_of(_mm256_loadu_si256((const __m256i *) (s + i)), over);
        const __m256i hi = bf16_of(_mm256_loadu_si256((const __m256i *) (s + i + 8)), over);
        /* packus works within 128-bit halves: put the eight results of each input in order */
        _mm256_storeu_si256((__m256i *) (d + i),
                            _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8));
    }
    if (i < n) { /* the tail through a buffer: the same arithmetic, no reads past the end */
        uint32_t t[16] = {0};
        uint16_t o[16];
        memcpy(t, s + i, (n - i) * 4);
        const __m256i lo = bf16_of(_mm256_loadu_si256((const __m256i *) t), over);
        const __m256i hi = bf16_of(_mm256_loadu_si256((const __m256i *) (t + 8)), over);
        _mm256_storeu_si256((__m256i *) o,
                            _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8));
        memcpy(d + i, o, (n - i) * 2);
    }
}
