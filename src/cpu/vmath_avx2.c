/* The models' element-wise transcendental kernels (GELU, SwiGLU, the attention softmax's
 * exponentials) on glibc's libmvec AVX2 variants (erff and expf, 8 lanes a call), for CPUs
 * without AVX-512; the same formulas, in the same order, as vmath_avx512.c and the scalar code.
 * Every element goes through the same vector call, the last partial vector included (masked
 * loads, zero lanes), so a value never depends on its position, on the thread count or on n.
 * Only where LOWP_HAVE_LIBMVEC and the CPU has AVX2 and FMA (lowp_cpu_vmath_pick, cpu.h). */
#include "cpu.h"

#if LOWP_HAVE_LIBMVEC
#include <immintrin.h>

extern __m256 _ZGVdN8v_erff(__m256 x);
extern __m256 _ZGVdN8v_expf(__m256 x);

static inline __m256i tail8(int64_t left) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int) (left < 8 ? left : 8)), lane);
}

/* sigmoid(u) = 1 / (1 + expf(-u)), moe_ffn.c's formula */
static inline __m256 sigmoid8(__m256 u) {
    const __m256 one = _mm256_set1_ps(1.0f);
    return _mm256_div_ps(
        one, _mm256_add_ps(one, _ZGVdN8v_expf(_mm256_xor_ps(u, _mm256_set1_ps(-0.0f)))));
}

void lowp_cpu_expf_avx2(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) {
        const __m256i m = tail8(n - i);
        _mm256_maskstore_ps(x + i, m, _ZGVdN8v_expf(_mm256_maskload_ps(x + i, m)));
    }
}

void lowp_cpu_swiglu_fwd_avx2(const float *u1, const float *u3, float *s, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) {
        const __m256i m = tail8(n - i);
        const __m256 a = _mm256_maskload_ps(u1 + i, m), b = _mm256_maskload_ps(u3 + i, m);
        _mm256_maskstore_ps(s + i, m, _mm256_mul_ps(_mm256_mul_ps(a, sigmoid8(a)), b));
    }
}

void lowp_cpu_swiglu_bwd_avx2(const float *u1, const float *u3, const float *ds, float *du1,
                              float *du3, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 8) {
        const __m256i m = tail8(n - i);
        const __m256 a = _mm256_maskload_ps(u1 + i, m), b = _mm256_maskload_ps(u3 + i, m);
        const __m256 d = _mm256_maskload_ps(ds + i, m), sg = sigmoid8(a);
        const __m256 t = _mm256_add_ps(one, _mm256_mul_ps(a, _mm256_sub_ps(one, sg)));
        _mm256_maskstore_ps(du1 + i, m, _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(d, b), sg), t));
        _mm256_maskstore_ps(du3 + i, m, _mm256_mul_ps(_mm256_mul_ps(d, a), sg));
    }
}

void lowp_cpu_gelu_avx2(const float *u, float *g, float *gd, int64_t n) {
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    const __m256 r2 = _mm256_set1_ps(0.70710678118654752f);
    const __m256 ir2pi = _mm256_set1_ps(0.39894228040143268f), mhalf = _mm256_set1_ps(-0.5f);
    for (int64_t i = 0; i < n; i += 8) {
        const __m256i m = tail8(n - i);
        const __m256 x = _mm256_maskload_ps(u + i, m);
        /* cdf = 0.5 (1 + erf(x / sqrt 2)), the scalar code's operations in its order */
        const __m256 cdf =
            _mm256_mul_ps(half, _mm256_add_ps(one, _ZGVdN8v_erff(_mm256_mul_ps(x, r2))));
        _mm256_maskstore_ps(g + i, m, _mm256_mul_ps(x, cdf));
        if (gd) {
            const __m256 e = _ZGVdN8v_expf(_mm256_mul_ps(_mm256_mul_ps(mhalf, x), x));
            _mm256_maskstore_ps(gd + i, m,
                                _mm256_add_ps(cdf, _mm256_mul_ps(x, _mm256_mul_ps(ir2pi, e))));
        }
    }
}
#else
typedef int lowp_vmath_avx2_unused; /* ISO C: a translation unit is not empty */
#endif
