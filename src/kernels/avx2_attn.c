/*
 * avx2_attn.c - AVX2/FMA/F16C inner loops of the tiled attention kernel
 * (contracts in avx2_attn.h; attn.c has the scalar reference of each).
 *
 * Scores: 3-row (and 2-row) x 4-key register blocks (12 or 8 accumulators
 * of 8 lanes, so both FMA pipes stay busy across their latency), reduced
 * with three horizontal adds into 4 sums per row. P·V: 6-row x 16-column
 * tiles of accumulators that live in registers across the whole key loop,
 * each value vector loaded once for the 6 rows (a 3-row x 32-column block
 * would need 12 accumulators plus 4 value vectors, more than the 16
 * registers, and spill to the stack at every key).
 * Row max and row scaling for the online softmax, 8 lanes at a time.
 * exp: Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, a degree-7
 * polynomial for e^r (the classic Cephes single-precision coefficients,
 * ~1 ulp), and 2^n built in the exponent field; inputs are clamped to
 * [-87.3, 88.3], so e^x never becomes a subnormal or infinity (the kernel
 * only feeds x <= 0).
 */
#if defined(__x86_64__) || defined(__i386__)

#include "kernels/avx2_attn.h"
#include "kernels/avx2_math.h"

#include <immintrin.h>
#include <string.h>

/* Four 8-lane accumulators to their four totals. */
static inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 ab = _mm256_hadd_ps(a, b); /* a01 a23 b01 b23 | a45 a67 b45 b67 */
    __m256 cd = _mm256_hadd_ps(c, d);
    __m256 abcd = _mm256_hadd_ps(ab, cd); /* a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7 */
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

static inline float hsum1(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Rows q0 (and q1 unless NULL) against keys t0..t0+3. */
static void dot_2x4(const float *q0, const float *q1, int hd, const float *const *k, float *s0, float *s1) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    const float *k0 = k[0], *k1 = k[1], *k2 = k[2], *k3 = k[3];
    if (q1) {
        for (int d = 0; d < hd; d += 8) {
            __m256 x0 = _mm256_loadu_ps(q0 + d), x1 = _mm256_loadu_ps(q1 + d);
            __m256 y0 = _mm256_loadu_ps(k0 + d), y1 = _mm256_loadu_ps(k1 + d);
            __m256 y2 = _mm256_loadu_ps(k2 + d), y3 = _mm256_loadu_ps(k3 + d);
            a0 = _mm256_fmadd_ps(x0, y0, a0), a1 = _mm256_fmadd_ps(x0, y1, a1);
            a2 = _mm256_fmadd_ps(x0, y2, a2), a3 = _mm256_fmadd_ps(x0, y3, a3);
            b0 = _mm256_fmadd_ps(x1, y0, b0), b1 = _mm256_fmadd_ps(x1, y1, b1);
            b2 = _mm256_fmadd_ps(x1, y2, b2), b3 = _mm256_fmadd_ps(x1, y3, b3);
        }
        _mm_storeu_ps(s1, hsum4(b0, b1, b2, b3));
    } else {
        for (int d = 0; d < hd; d += 8) {
            __m256 x0 = _mm256_loadu_ps(q0 + d);
            a0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(k0 + d), a0);
            a1 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(k1 + d), a1);
            a2 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(k2 + d), a2);
            a3 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(k3 + d), a3);
        }
    }
    _mm_storeu_ps(s0, hsum4(a0, a1, a2, a3));
}

/* One row against one key in exactly dot_2x4's order (one accumulator,
 * the same horizontal reduction), so a score never depends on whether its
 * key fell in a group of four: a query's result is then the same whatever
 * else shares its tile (batch invariance). */
static float dot1(const float *a, const float *b, int hd) {
    __m256 s = _mm256_setzero_ps();
    for (int d = 0; d < hd; d += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), s);
    return _mm_cvtss_f32(hsum4(s, s, s, s));
}

/* Rows q0, q1, q2 against keys t0..t0+3: each score is accumulated and
 * reduced exactly as in dot_2x4 (a third row only shares the key loads). */
static void dot_3x4(const float *q0, const float *q1, const float *q2, int hd, const float *const *k, float *s0,
                    float *s1, float *s2) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    __m256 c0 = a0, c1 = a0, c2 = a0, c3 = a0;
    const float *k0 = k[0], *k1 = k[1], *k2 = k[2], *k3 = k[3];
    for (int d = 0; d < hd; d += 8) {
        __m256 y0 = _mm256_loadu_ps(k0 + d), y1 = _mm256_loadu_ps(k1 + d);
        __m256 y2 = _mm256_loadu_ps(k2 + d), y3 = _mm256_loadu_ps(k3 + d);
        __m256 x = _mm256_loadu_ps(q0 + d);
        a0 = _mm256_fmadd_ps(x, y0, a0), a1 = _mm256_fmadd_ps(x, y1, a1);
        a2 = _mm256_fmadd_ps(x, y2, a2), a3 = _mm256_fmadd_ps(x, y3, a3);
        x = _mm256_loadu_ps(q1 + d);
        b0 = _mm256_fmadd_ps(x, y0, b0), b1 = _mm256_fmadd_ps(x, y1, b1);
        b2 = _mm256_fmadd_ps(x, y2, b2), b3 = _mm256_fmadd_ps(x, y3, b3);
        x = _mm256_loadu_ps(q2 + d);
        c0 = _mm256_fmadd_ps(x, y0, c0), c1 = _mm256_fmadd_ps(x, y1, c1);
        c2 = _mm256_fmadd_ps(x, y2, c2), c3 = _mm256_fmadd_ps(x, y3, c3);
    }
    _mm_storeu_ps(s0, hsum4(a0, a1, a2, a3));
    _mm_storeu_ps(s1, hsum4(b0, b1, b2, b3));
    _mm_storeu_ps(s2, hsum4(c0, c1, c2, c3));
}

void attn_scores_avx2(const float *Q, int R, int hd, const float *const *krow, int nk, float *S, int s_stride) {
    int r = 0;
    for (; r + 3 <= R; r += 3) { /* three rows share each key load */
        const float *q0 = Q + (size_t)r * hd;
        float *s0 = S + (size_t)r * s_stride;
        int t = 0;
        for (; t + 4 <= nk; t += 4)
            dot_3x4(q0, q0 + hd, q0 + 2 * hd, hd, krow + t, s0 + t, s0 + s_stride + t, s0 + 2 * s_stride + t);
        for (; t < nk; t++)
            for (int i = 0; i < 3; i++) s0[(size_t)i * s_stride + t] = dot1(q0 + (size_t)i * hd, krow[t], hd);
    }
    for (; r < R; r += 2) {
        const float *q0 = Q + (size_t)r * hd, *q1 = r + 1 < R ? q0 + hd : NULL;
        float *s0 = S + (size_t)r * s_stride, *s1 = s0 + s_stride;
        int t = 0;
        for (; t + 4 <= nk; t += 4) dot_2x4(q0, q1, hd, krow + t, s0 + t, q1 ? s1 + t : NULL);
        for (; t < nk; t++) {
            s0[t] = dot1(q0, krow[t], hd);
            if (q1) s1[t] = dot1(q1, krow[t], hd);
        }
    }
}

/* O rows [0, C) (hd apart) x columns [d0, d0 + 8 W), W = 1 or 2, against
 * keys [0, nk): per key one value load per 8 columns feeds C FMAs, each
 * row's probability broadcast once; with C = 6, W = 2 the 12 accumulators,
 * two value vectors and one broadcast fill 15 registers. Every output
 * element is its own chain o = fma(p_t, v_t, o) over t in order, so the
 * bits do not depend on the tiling of rows or columns. */
#define INLINE static inline __attribute__((always_inline))
INLINE void pv_tile(float *O, int hd, const float *P, int p_stride, const float *const *vrow, int nk, int d0, int C,
                    int W) {
    __m256 acc[6][2];
#pragma GCC unroll 6
    for (int c = 0; c < C; c++)
#pragma GCC unroll 2
        for (int w = 0; w < W; w++) acc[c][w] = _mm256_loadu_ps(O + (size_t)c * hd + d0 + 8 * w);
    for (int t = 0; t < nk; t++) {
        const float *v = vrow[t] + d0;
        __m256 v0 = _mm256_loadu_ps(v), v1 = W > 1 ? _mm256_loadu_ps(v + 8) : v0;
#pragma GCC unroll 6
        for (int c = 0; c < C; c++) {
            __m256 x = _mm256_broadcast_ss(P + (size_t)c * p_stride + t);
            acc[c][0] = _mm256_fmadd_ps(x, v0, acc[c][0]);
            if (W > 1) acc[c][1] = _mm256_fmadd_ps(x, v1, acc[c][1]);
        }
    }
#pragma GCC unroll 6
    for (int c = 0; c < C; c++)
#pragma GCC unroll 2
        for (int w = 0; w < W; w++) _mm256_storeu_ps(O + (size_t)c * hd + d0 + 8 * w, acc[c][w]);
}

/* Rows [0, C) of O, every column: 16 at a time, then 8. */
INLINE void pv_rows(float *O, int hd, const float *P, int p_stride, const float *const *vrow, int nk, int C) {
    int d0 = 0;
    for (; d0 + 16 <= hd; d0 += 16) pv_tile(O, hd, P, p_stride, vrow, nk, d0, C, 2);
    if (d0 < hd) pv_tile(O, hd, P, p_stride, vrow, nk, d0, C, 1);
}

void attn_pv_avx2(float *O, int R, int hd, const float *P, int p_stride, const float *const *vrow, int nk) {
    for (int r = 0; r < R; r += 6) {
        float *o = O + (size_t)r * hd;
        const float *p = P + (size_t)r * p_stride;
        switch (R - r < 6 ? R - r : 6) {
            case 1: pv_rows(o, hd, p, p_stride, vrow, nk, 1); break;
            case 2: pv_rows(o, hd, p, p_stride, vrow, nk, 2); break;
            case 3: pv_rows(o, hd, p, p_stride, vrow, nk, 3); break;
            case 4: pv_rows(o, hd, p, p_stride, vrow, nk, 4); break;
            case 5: pv_rows(o, hd, p, p_stride, vrow, nk, 5); break;
            default: pv_rows(o, hd, p, p_stride, vrow, nk, 6); break;
        }
    }
}

float attn_max_avx2(const float *x, int n) {
    __m256 m = _mm256_set1_ps(x[0]);
    int t = 0;
    for (; t + 8 <= n; t += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + t));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    for (; t < n; t++) r = x[t] > r ? x[t] : r;
    return r;
}

void attn_scale_avx2(float *dst, const float *src, int n, float c) {
    const __m256 vc = _mm256_set1_ps(c);
    for (int i = 0; i < n; i += 8) _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_loadu_ps(src + i), vc));
}

float attn_exp_sum_avx2(float *x, int n, float m) {
    __m256 vm = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
    int t = 0;
    for (; t + 8 <= n; t += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + t), vm));
        _mm256_storeu_ps(x + t, e);
        acc = _mm256_add_ps(acc, e);
    }
    float s = hsum1(acc);
    if (t < n) {
        /* the tail through a padded vector, so every element uses the same exp */
        float buf[8] = {0};
        memcpy(buf, x + t, (size_t)(n - t) * sizeof(float));
        _mm256_storeu_ps(buf, exp8(_mm256_sub_ps(_mm256_loadu_ps(buf), vm)));
        for (int i = 0; i < n - t; i++) x[t + i] = buf[i], s += buf[i];
    }
    return s;
}

#else
typedef int avx2_attn_unused; /* not an x86 target: nothing to compile */
#endif
