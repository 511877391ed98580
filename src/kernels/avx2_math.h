/*
 * avx2_math.h - vector math shared by the AVX2 kernel files (included only
 * by files compiled with -mavx2 -mfma).
 *
 * exp8: e^x in eight lanes. Cody-Waite range reduction x = n ln2 + r,
 * |r| <= ln2/2, a degree-7 polynomial for e^r (the classic Cephes
 * single-precision coefficients, ~1 ulp), and 2^n built in the exponent
 * field; inputs are clamped to [-87.3, 88.3], so the result is never a
 * subnormal or infinity. exp16 (files built with AVX-512 F): the same in
 * 16 lanes, lane for lane exp8's bits.
 */
#ifndef LAMINA_AVX2_MATH_H
#define LAMINA_AVX2_MATH_H

#include <immintrin.h>

/* One definition for both widths, so exp16 is exp8 operation for
 * operation: P the intrinsics' prefix, BITS the width, V / VI the float
 * and integer vector types, ROUND the round-to-nearest instruction. */
#define LM_DEFINE_EXP(name, P, BITS, V, VI, ROUND)                                                                     \
    static inline V name(V x) {                                                                                        \
        const V log2e = P##_set1_ps(1.44269504088896341f);                                                             \
        const V c1 = P##_set1_ps(0.693359375f), c2 = P##_set1_ps(-2.12194440e-4f);                                     \
        x = P##_min_ps(P##_max_ps(x, P##_set1_ps(-87.3f)), P##_set1_ps(88.3f));                                        \
        V n = ROUND(P##_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);                              \
        x = P##_fnmadd_ps(n, c1, x);                                                                                   \
        x = P##_fnmadd_ps(n, c2, x);                                                                                   \
        V y = P##_set1_ps(1.9875691500e-4f);                                                                           \
        y = P##_fmadd_ps(y, x, P##_set1_ps(1.3981999507e-3f));                                                         \
        y = P##_fmadd_ps(y, x, P##_set1_ps(8.3334519073e-3f));                                                         \
        y = P##_fmadd_ps(y, x, P##_set1_ps(4.1665795894e-2f));                                                         \
        y = P##_fmadd_ps(y, x, P##_set1_ps(1.6666665459e-1f));                                                         \
        y = P##_fmadd_ps(y, x, P##_set1_ps(5.0000001201e-1f));                                                         \
        y = P##_fmadd_ps(y, P##_mul_ps(x, x), P##_add_ps(x, P##_set1_ps(1.0f)));                                       \
        VI e = P##_slli_epi32(P##_add_epi32(P##_cvtps_epi32(n), P##_set1_epi32(127)), 23);                             \
        return P##_mul_ps(y, P##_castsi##BITS##_ps(e));                                                                \
    }

LM_DEFINE_EXP(exp8, _mm256, 256, __m256, __m256i, _mm256_round_ps)
#if defined(__AVX512F__)
LM_DEFINE_EXP(exp16, _mm512, 512, __m512, __m512i, _mm512_roundscale_ps)
#endif

#endif
