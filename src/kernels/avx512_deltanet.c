/*
 * avx512_deltanet.c - the linear-attention kernels (kernels/deltanet.h) in
 * AVX-512 F: the body of kernels/simd_deltanet.h over 16-lane vectors, the
 * last partial vector of a row through mask registers, exp16 (exp8's
 * reduction and polynomial, kernels/avx2_math.h, in 16 lanes), and the
 * chunk form's products in 4 x 4-vector register tiles (DN_TILE4X4: 16 of
 * the 32 registers accumulate; measured 7% less time than the 4 x 2 tiles
 * at dk = dv = 128, the same bits). Compiled
 * with the avx512 flags (Makefile: avx512_*.c); dispatch.c lays these
 * entries over AVX2's in the avx512 variants' tables. The sanitizer builds
 * (LAMINA_X86_BASE_ONLY) and other architectures hold only a fill that
 * returns false.
 */
#include "kernels/deltanet.h"

#include "kernels/x86.h"

#if (defined(__x86_64__) || defined(__i386__)) && X86_VARIANTS

#if !defined(__AVX512F__) || !defined(__FMA__)
#error "avx512_deltanet.c must be compiled with the avx512 flags (-mavx512f -mfma)"
#endif

#include <immintrin.h>

#include "kernels/avx2_math.h"

typedef __m512 vf;
#define DN_VL 16
#define DN_TILE4X4 /* 32 registers */

static inline vf v_zero(void) { return _mm512_setzero_ps(); }
static inline vf v_set1(float a) { return _mm512_set1_ps(a); }
static inline vf v_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void v_store(float *p, vf x) { _mm512_storeu_ps(p, x); }
static inline vf v_loadn(const float *p, int n) { return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p); }
static inline void v_storen(float *p, vf x, int n) { _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), x); }
static inline vf v_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf v_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf v_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf v_div(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf v_fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf v_fnmadd(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
static inline float v_hsum(vf x) { return _mm512_reduce_add_ps(x); }

static inline vf v_exp(vf x) { return exp16(x); } /* kernels/avx2_math.h */

static inline double dsumsq(const float *x, int n) {
    __m512d a0 = _mm512_setzero_pd(), a1 = a0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        a0 = _mm512_fmadd_pd(lo, lo, a0);
        a1 = _mm512_fmadd_pd(hi, hi, a1);
    }
    double ss = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
    for (; i < n; i++) ss += (double)x[i] * x[i];
    return ss;
}

#include "kernels/simd_deltanet.h"

bool avx512_dn_fill(lm_dn_kernels *k) {
    k->conv = dn_conv;
    k->l2norm = dn_l2norm;
    k->norm_gated = dn_norm_gated;
    k->recur = dn_recur;
    k->chunk = dn_chunk;
    return true;
}

#else

bool avx512_dn_fill(lm_dn_kernels *k) { return false; }

#endif
