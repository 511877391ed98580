/*
 * avx2_math.h - vector math shared by the AVX2 kernel files (included only
 * by files compiled with -mavx2 -mfma).
 *
 * exp8: e^x in eight lanes. Cody-Waite range reduction x = n ln2 + r,
 * |r| <= ln2/2, a degree-7 polynomial for e^r (the classic Cephes
 * single-precision coefficients, ~1 ulp), and 2^n built in the exponent
 * field; inputs are clamped to [-87.3, 88.3], so the result is never a
 * subnormal or infinity.
 */
#ifndef LAMINA_AVX2_MATH_H
#define LAMINA_AVX2_MATH_H

#include <immintrin.h>

static inline __m256 exp8(__m256 x) {
    const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
    const __m256 c1 = _mm256_set1_ps(0.693359375f), c2 = _mm256_set1_ps(-2.12194440e-4f);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(n, c1, x);
    x = _mm256_fnmadd_ps(n, c2, x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

#endif
