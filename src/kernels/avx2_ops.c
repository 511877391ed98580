/*
 * avx2_ops.c - AVX2/FMA element-wise operations (contracts in avx2_ops.h).
 *
 * SiLU and GELU use exp8 (avx2_math.h, ~1 ulp). GELU's tanh form is
 * rewritten 0.5 x (1 + tanh(y)) = x / (1 + e^(-2y)), which has no
 * cancellation for negative x (1 - 2 / (1 + e^(2y)) loses the small
 * outputs there, enough to show in a model's perplexity).
 */
#if defined(__x86_64__) || defined(__i386__)

#include "kernels/avx2_ops.h"

#include <math.h>
#include <string.h>

#include "kernels/avx2_math.h"

void avx2_rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
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
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    __m256 vs = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs), _mm256_loadu_ps(w + i)));
    for (; i < n; i++) y[i] = x[i] * scale * w[i];
}

static inline __m256 silu_mul(__m256 g, __m256 u) {
    __m256 one = _mm256_set1_ps(1.0f);
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
}

static inline __m256 gelu_mul(__m256 g, __m256 u) {
    /* 0.5 g (1 + tanh(y)) = g / (1 + e^(-2y)): no cancellation where tanh
     * nears -1, so small negative outputs keep their precision */
    const __m256 c2 = _mm256_set1_ps(-2.0f * 0.7978845608028654f), k = _mm256_set1_ps(0.044715f);
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 y2 = _mm256_mul_ps(c2, _mm256_fmadd_ps(_mm256_mul_ps(k, g), _mm256_mul_ps(g, g), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, exp8(y2))), u);
}

/* The loop both activations share; the tail goes through a padded vector. */
#define GATED(NAME, FN)                                                                                                \
    void NAME(float *g, const float *u, int n) {                                                                       \
        int i = 0;                                                                                                     \
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(g + i, FN(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));        \
        if (i < n) {                                                                                                   \
            float bg[8] = {0}, bu[8] = {0};                                                                            \
            memcpy(bg, g + i, (size_t)(n - i) * sizeof(float));                                                        \
            memcpy(bu, u + i, (size_t)(n - i) * sizeof(float));                                                        \
            _mm256_storeu_ps(bg, FN(_mm256_loadu_ps(bg), _mm256_loadu_ps(bu)));                                        \
            memcpy(g + i, bg, (size_t)(n - i) * sizeof(float));                                                        \
        }                                                                                                              \
    }

GATED(avx2_swiglu, silu_mul)
GATED(avx2_geglu, gelu_mul)

/* gelu alone: gelu_mul's activation without the product */
void avx2_gelu(float *x, int n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, gelu_mul(_mm256_loadu_ps(x + i), one));
    if (i < n) {
        float b[8] = {0};
        memcpy(b, x + i, (size_t)(n - i) * sizeof(float));
        _mm256_storeu_ps(b, gelu_mul(_mm256_loadu_ps(b), one));
        memcpy(x + i, b, (size_t)(n - i) * sizeof(float));
    }
}

/* Adjacent pairs (x[2i], x[2i+1]) by (c_i, s_i): with C and S the cosines
 * and sines duplicated into both lanes of their pair and X' the pair-swapped
 * x, y = X C -+ X' S in one fmaddsub (minus on even lanes, plus on odd). */
static void rope_adjacent(float *v, int n_rot, const float *cs) {
    int i = 0;
    for (; i + 8 <= n_rot; i += 8) {
        __m256 x = _mm256_loadu_ps(v + i), a = _mm256_loadu_ps(cs + i);
        __m256 c = _mm256_moveldup_ps(a), s = _mm256_movehdup_ps(a);
        __m256 xs = _mm256_permute_ps(x, 0xB1);
        _mm256_storeu_ps(v + i, _mm256_fmaddsub_ps(x, c, _mm256_mul_ps(xs, s)));
    }
    for (; i < n_rot; i += 2) {
        float c = cs[i], s = cs[i + 1], x0 = v[i], x1 = v[i + 1];
        v[i] = x0 * c - x1 * s;
        v[i + 1] = x0 * s + x1 * c;
    }
}

/* Halves (x[i], x[i + half]) by (c_i, s_i): the interleaved angle pairs are
 * split into a cosine and a sine vector first. */
static void rope_neox(float *v, int n_rot, const float *cs) {
    int half = n_rot / 2, i = 0;
    for (; i + 8 <= half; i += 8) {
        __m256 a = _mm256_loadu_ps(cs + 2 * i), b = _mm256_loadu_ps(cs + 2 * i + 8);
        __m256 c = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
        __m256 s = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
        __m256 x0 = _mm256_loadu_ps(v + i), x1 = _mm256_loadu_ps(v + i + half);
        _mm256_storeu_ps(v + i, _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s)));
        _mm256_storeu_ps(v + i + half, _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c)));
    }
    for (; i < half; i++) {
        float c = cs[2 * i], s = cs[2 * i + 1], x0 = v[i], x1 = v[i + half];
        v[i] = x0 * c - x1 * s;
        v[i + half] = x0 * s + x1 * c;
    }
}

void avx2_rope_apply(float *x, int n_heads, int head_dim, int n_rot, const float *cs, int neox) {
    for (int h = 0; h < n_heads; h++) {
        if (neox) rope_neox(x + (size_t)h * head_dim, n_rot, cs);
        else rope_adjacent(x + (size_t)h * head_dim, n_rot, cs);
    }
}

#endif
