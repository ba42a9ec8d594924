/* Helpers of the models compiled with the AVX-512 flags and called only where the CPU has
 * AVX-512 (cpu.h): strided transposes of 32- and 16-bit elements (bits moved unchanged), the
 * BF16 row and column copies of a binary32 matrix from one read, and
 * element-wise transcendental kernels (GELU, SwiGLU, the attention softmax's exponentials) on
 * glibc's libmvec (its AVX-512 erff and expf, 16 lanes a call) where the build found it
 * (LOWP_HAVE_LIBMVEC). Every element goes through the same vector call, the last partial vector
 * included (masked loads, zero lanes), so a value never depends on its position, on the thread
 * count or on n. libmvec's erff and expf are within 4 ulp (glibc's manual), the scalar libm
 * functions they replace within 1-2 (tests/c/test_dense.c bounds the GELU,
 * tests/c/test_trainer_units.c the SwiGLU and expf, against binary64). */
#include "cpu.h"
#include "transpose_avx512.h"

void lowp_cpu_transpose_f32_avx512(const float *src, int64_t rows, int64_t cols, int64_t lds,
                                   float *dst, int64_t ldd) {
    int64_t r0 = 0;
    for (; r0 + 16 <= rows; r0 += 16) {
        int64_t c0 = 0;
        for (; c0 + 16 <= cols; c0 += 16)
            lowp_transpose16x16_u32((const uint32_t *) (src + r0 * lds + c0), (size_t) lds,
                                    (uint32_t *) (dst + c0 * ldd + r0), (size_t) ldd);
        for (; c0 < cols; c0++)
            for (int64_t r = r0; r < r0 + 16; r++) dst[c0 * ldd + r] = src[r * lds + c0];
    }
    for (; r0 < rows; r0++)
        for (int64_t c = 0; c < cols; c++) dst[c * ldd + r0] = src[r0 * lds + c];
}

void lowp_cpu_transpose_u16_avx512(const uint16_t *src, int64_t rows, int64_t cols, int64_t lds,
                                   uint16_t *dst, int64_t ldd) {
    _Alignas(64) uint32_t a[256], b[256]; /* a 16x16 block widened to 32 bits, and transposed */
    int64_t r0 = 0;
    for (; r0 + 16 <= rows; r0 += 16) {
        int64_t c0 = 0;
        for (; c0 + 16 <= cols; c0 += 16) {
            for (int i = 0; i < 16; i++)
                _mm512_store_si512(a + 16 * i, _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                                   (const __m256i *) (src + (r0 + i) * lds + c0))));
            lowp_transpose16x16_u32(a, 16, b, 16);
            for (int p = 0; p < 16; p++)
                _mm256_storeu_si256((__m256i *) (dst + (c0 + p) * ldd + r0),
                                    _mm512_cvtepi32_epi16(_mm512_load_si512(b + 16 * p)));
        }
        for (; c0 < cols; c0++)
            for (int64_t r = r0; r < r0 + 16; r++) dst[c0 * ldd + r] = src[r * lds + c0];
    }
    for (; r0 < rows; r0++)
        for (int64_t c = 0; c < cols; c++) dst[c * ldd + r0] = src[r0 * lds + c];
}

/* F32 bits -> BF16 code in the low half of each lane: cast_avx512.c's bf16_enc with RNE and
 * the default overflow (Inf), NaN -> 0x7FC0 with the sign. */
static inline __m512i bf16_rne16(__m512i u) {
    const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
    const __m512i add =
        _mm512_add_epi32(_mm512_set1_epi32(0x7FFF),
                         _mm512_and_si512(_mm512_srli_epi32(a, 16), _mm512_set1_epi32(1)));
    __m512i code = _mm512_min_epu32(_mm512_srli_epi32(_mm512_add_epi32(a, add), 16),
                                    _mm512_set1_epi32(0x7F80));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000));
    code = _mm512_mask_mov_epi32(code, nan, _mm512_set1_epi32(0x7FC0));
    return _mm512_ternarylogic_epi32(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x8000), code,
                                     0xEA);
}

/* Bands of 32 rows: the band's row copy first (a stream), then its transpose from that copy
 * while it is in cache, 32 rows x 16 columns at a time, so that every column line is one whole
 * 64-byte line, stored non-temporally where aligned: the column lines lie ldc * 2 bytes apart
 * (4 KiB at 2,048 tokens), which thrashes the cache when stored in pieces. */
void lowp_cpu_bf16_dual_avx512(const float *src, int64_t rows, int64_t cols, int64_t lds,
                               uint16_t *row, int64_t ldr, uint16_t *col, int64_t ldc) {
    _Alignas(64) uint32_t a[2][256], b[2][256];
    for (int64_t r0 = 0; r0 < rows; r0 += 32) {
        const int nr = rows - r0 < 32 ? (int) (rows - r0) : 32;
        const __mmask32 rm = nr == 32 ? ~(__mmask32) 0 : (__mmask32) ((1u << nr) - 1);
        for (int64_t r = r0; r < r0 + nr; r++)
            for (int64_t c0 = 0; c0 < cols; c0 += 16) {
                const __mmask16 cm =
                    cols - c0 >= 16 ? 0xFFFF : (__mmask16) ((1u << (cols - c0)) - 1);
                const __m512i v = bf16_rne16(_mm512_maskz_loadu_epi32(cm, src + r * lds + c0));
                _mm256_mask_storeu_epi16(row + r * ldr + c0, cm, _mm512_cvtepi32_epi16(v));
            }
        for (int64_t c0 = 0; c0 < cols; c0 += 16) {
            const int nc = cols - c0 < 16 ? (int) (cols - c0) : 16;
            const __mmask16 cm = (__mmask16) ((1u << nc) - 1);
            for (int i = 0; i < 32; i++)
                _mm512_store_si512(a[i >> 4] + 16 * (i & 15),
                                   i < nr ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                                                cm, row + (r0 + i) * ldr + c0))
                                          : _mm512_setzero_si512());
            lowp_transpose16x16_u32(a[0], 16, b[0], 16);
            lowp_transpose16x16_u32(a[1], 16, b[1], 16);
            for (int p = 0; p < nc; p++) {
                const __m256i lo = _mm512_cvtepi32_epi16(_mm512_load_si512(b[0] + 16 * p));
                const __m256i hi = _mm512_cvtepi32_epi16(_mm512_load_si512(b[1] + 16 * p));
                const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                uint16_t *d = col + (c0 + p) * ldc + r0;
                if (nr == 32 && ((uintptr_t) d & 63) == 0)
                    _mm512_stream_si512((void *) d, v);
                else
                    _mm512_mask_storeu_epi16(d, rm, v);
            }
        }
    }
    _mm_sfence(); /* the streamed lines are visible before the caller reads them */
}

#if LOWP_HAVE_LIBMVEC
#include <immintrin.h>

extern __m512 _ZGVeN16v_erff(__m512 x);
extern __m512 _ZGVeN16v_expf(__m512 x);

static inline __mmask16 tail16(int64_t left) {
    return left >= 16 ? (__mmask16) 0xFFFF : (__mmask16) ((1u << left) - 1);
}

/* sigmoid(u) = 1 / (1 + expf(-u)), moe_ffn.c's formula */
static inline __m512 sigmoid16(__m512 u) {
    const __m512 one = _mm512_set1_ps(1.0f);
    return _mm512_div_ps(
        one, _mm512_add_ps(one, _ZGVeN16v_expf(_mm512_xor_ps(u, _mm512_set1_ps(-0.0f)))));
}

void lowp_cpu_expf_avx512(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail16(n - i);
        _mm512_mask_storeu_ps(x + i, m, _ZGVeN16v_expf(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

void lowp_cpu_swiglu_fwd_avx512(const float *u1, const float *u3, float *s, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail16(n - i);
        const __m512 a = _mm512_maskz_loadu_ps(m, u1 + i), b = _mm512_maskz_loadu_ps(m, u3 + i);
        _mm512_mask_storeu_ps(s + i, m, _mm512_mul_ps(_mm512_mul_ps(a, sigmoid16(a)), b));
    }
}

void lowp_cpu_swiglu_bwd_avx512(const float *u1, const float *u3, const float *ds, float *du1,
                                float *du3, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail16(n - i);
        const __m512 a = _mm512_maskz_loadu_ps(m, u1 + i), b = _mm512_maskz_loadu_ps(m, u3 + i);
        const __m512 d = _mm512_maskz_loadu_ps(m, ds + i), sg = sigmoid16(a);
        const __m512 t = _mm512_add_ps(one, _mm512_mul_ps(a, _mm512_sub_ps(one, sg)));
        _mm512_mask_storeu_ps(du1 + i, m, _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(d, b), sg), t));
        _mm512_mask_storeu_ps(du3 + i, m, _mm512_mul_ps(_mm512_mul_ps(d, a), sg));
    }
}
void lowp_cpu_gelu_avx512(const float *u, float *g, float *gd, int64_t n) {
    const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    const __m512 r2 = _mm512_set1_ps(0.70710678118654752f);
    const __m512 ir2pi = _mm512_set1_ps(0.39894228040143268f), mhalf = _mm512_set1_ps(-0.5f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail16(n - i);
        const __m512 x = _mm512_maskz_loadu_ps(m, u + i);
        /* cdf = 0.5 (1 + erf(x / sqrt 2)), the scalar code's operations in its order */
        const __m512 cdf =
            _mm512_mul_ps(half, _mm512_add_ps(one, _ZGVeN16v_erff(_mm512_mul_ps(x, r2))));
        _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(x, cdf));
        if (gd) {
            const __m512 e = _ZGVeN16v_expf(_mm512_mul_ps(_mm512_mul_ps(mhalf, x), x));
            _mm512_mask_storeu_ps(gd + i, m,
                                  _mm512_add_ps(cdf, _mm512_mul_ps(x, _mm512_mul_ps(ir2pi, e))));
        }
    }
}
#endif
