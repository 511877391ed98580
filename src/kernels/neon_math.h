/*
 * neon_math.h - vector math shared by the AArch64 NEON kernel files
 * (included only inside their __aarch64__ sections; plain Armv8-A, no
 * flags).
 *
 * exp4: e^x in four lanes, the method of the AVX2 files' exp8
 * (kernels/avx2_math.h): Cody-Waite range reduction x = n ln2 + r,
 * |r| <= ln2/2, a degree-7 polynomial for e^r (the classic Cephes
 * single-precision coefficients, ~1 ulp), 2^n built in the exponent field;
 * inputs clamped to [-87.3, 88.3], so the result is never subnormal or
 * infinite.
 *
 * sumsq_f64: a sum of squares in float64 lanes (the norms' denominators).
 */
#ifndef LAMINA_NEON_MATH_H
#define LAMINA_NEON_MATH_H

#include <arm_neon.h>

static inline float32x4_t exp4(float32x4_t x) {
    const float32x4_t c1 = vdupq_n_f32(0.693359375f), c2 = vdupq_n_f32(-2.12194440e-4f);
    x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.3f)), vdupq_n_f32(88.3f));
    float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
    x = vfmsq_f32(x, n, c1);
    x = vfmsq_f32(x, n, c2);
    float32x4_t y = vdupq_n_f32(1.9875691500e-4f);
    y = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), y, x);
    y = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), y, x);
    y = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), y, x);
    y = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), y, x);
    y = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), y, x);
    y = vfmaq_f32(vaddq_f32(x, vdupq_n_f32(1.0f)), y, vmulq_f32(x, x));
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(y, vreinterpretq_f32_s32(e));
}

/* The sum of x's squares over n floats, accumulated in float64 lanes (the
 * norms' denominator, as the scalar reference sums it). */
static inline double sumsq_f64(const float *x, int n) {
    float64x2_t a0 = vdupq_n_f64(0.0), a1 = a0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t v = vld1q_f32(x + i);
        float64x2_t lo = vcvt_f64_f32(vget_low_f32(v)), hi = vcvt_high_f64_f32(v);
        a0 = vfmaq_f64(a0, lo, lo);
        a1 = vfmaq_f64(a1, hi, hi);
    }
    double ss = vaddvq_f64(vaddq_f64(a0, a1));
    for (; i < n; i++) ss += (double)x[i] * x[i];
    return ss;
}

#endif
