/*
 * avx2_deltanet.c - the linear-attention kernels (kernels/deltanet.h) in
 * AVX2 + FMA: the body of kernels/simd_deltanet.h over 8-lane vectors,
 * exp8 (kernels/avx2_math.h) for the exponentials, maskload/maskstore for
 * the last partial vector of a row. Compiled with -mavx2 -mfma -mf16c
 * (Makefile: avx2_*.c); dispatch.c lays avx2_dn_fill's entries into the
 * table of every x86 variant (the avx512 ones then put their 512-bit
 * entries over them). `gates` keeps the scalar reference (a few values per
 * token). Off x86 the file holds only a fill that returns false.
 */
#include "kernels/deltanet.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include "kernels/avx2_math.h"

typedef __m256 vf;
#define DN_VL 8

static inline vf v_zero(void) { return _mm256_setzero_ps(); }
static inline vf v_set1(float a) { return _mm256_set1_ps(a); }
static inline vf v_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void v_store(float *p, vf x) { _mm256_storeu_ps(p, x); }
static inline __m256i lanes(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vf v_loadn(const float *p, int n) { return _mm256_maskload_ps(p, lanes(n)); }
static inline void v_storen(float *p, vf x, int n) { _mm256_maskstore_ps(p, lanes(n), x); }
static inline vf v_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf v_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf v_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf v_div(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf v_fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf v_fnmadd(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
static inline vf v_exp(vf x) { return exp8(x); }
static inline float v_hsum(vf x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline double dsumsq(const float *x, int n) {
    __m256d a0 = _mm256_setzero_pd(), a1 = a0;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        a0 = _mm256_fmadd_pd(lo, lo, a0);
        a1 = _mm256_fmadd_pd(hi, hi, a1);
    }
    double t[4];
    _mm256_storeu_pd(t, _mm256_add_pd(a0, a1));
    double ss = (t[0] + t[1]) + (t[2] + t[3]);
    for (; i < n; i++) ss += (double)x[i] * x[i];
    return ss;
}

#include "kernels/simd_deltanet.h"

bool avx2_dn_fill(lm_dn_kernels *k) {
    k->conv = dn_conv;
    k->l2norm = dn_l2norm;
    k->norm_gated = dn_norm_gated;
    k->recur = dn_recur;
    k->chunk = dn_chunk;
    return true;
}

#else

bool avx2_dn_fill(lm_dn_kernels *k) { return false; }

#endif
