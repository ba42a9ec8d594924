/* Element-wise transcendental kernels of the models on glibc's libmvec (its AVX-512 erff and
 * expf, 16 lanes a call), compiled with the AVX-512 flags and called only when the CPU has
 * AVX-512 (cpu.h) and the build found libmvec (LOWP_HAVE_LIBMVEC). Every element goes through
 * the same vector call, the last partial vector included (masked loads, zero lanes), so a
 * value never depends on its position, on the thread count or on n. libmvec's erff and expf
 * are within 4 ulp (glibc's manual); the scalar libm functions they replace within 1-2
 * (tests/test_dense.c bounds the GELU against binary64). */
#include "cpu.h"

#if LOWP_HAVE_LIBMVEC
#include <immintrin.h>

extern __m512 _ZGVeN16v_erff(__m512 x);
extern __m512 _ZGVeN16v_expf(__m512 x);

void lowp_cpu_gelu_avx512(const float *u, float *g, float *gd, int64_t n) {
    const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    const __m512 r2 = _mm512_set1_ps(0.70710678118654752f);
    const __m512 ir2pi = _mm512_set1_ps(0.39894228040143268f), mhalf = _mm512_set1_ps(-0.5f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16) 0xFFFF : (__mmask16) ((1u << (n - i)) - 1);
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
