/*
 * neon_ops.c - AArch64 NEON element-wise ops and attention inner loops
 * (contracts in kernels/neon_ops.h). Plain Armv8-A Advanced SIMD, no extra
 * compiler flags.
 *
 * The exponentials go through exp4 (kernels/neon_math.h, ~1 ulp, the
 * method of the AVX2 files' exp8). GELU's tanh form is written
 * x / (1 + e^(-2y)) as in the reference (no cancellation for negative x).
 */
#include "kernels/neon_ops.h"

#if defined(__aarch64__)

#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "kernels/neon_math.h"

/* ---- element-wise ---------------------------------------------------------------- */

void neon_rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    double ss = sumsq_f64(x, n);
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    int i;
    for (i = 0; i + 4 <= n; i += 4) vst1q_f32(y + i, vmulq_f32(vmulq_n_f32(vld1q_f32(x + i), scale), vld1q_f32(w + i)));
    for (; i < n; i++) y[i] = x[i] * scale * w[i];
}

static inline float32x4_t silu_mul(float32x4_t g, float32x4_t u) {
    float32x4_t e = exp4(vnegq_f32(g));
    return vmulq_f32(vdivq_f32(g, vaddq_f32(vdupq_n_f32(1.0f), e)), u);
}

static inline float32x4_t gelu_mul(float32x4_t g, float32x4_t u) {
    const float c2 = -2.0f * 0.7978845608028654f;
    float32x4_t y2 = vmulq_n_f32(vfmaq_f32(g, vmulq_n_f32(g, 0.044715f), vmulq_f32(g, g)), c2);
    return vmulq_f32(vdivq_f32(g, vaddq_f32(vdupq_n_f32(1.0f), exp4(y2))), u);
}

/* The loop both activations share; the tail goes through a padded vector. */
#define GATED(NAME, FN)                                                                                                \
    void NAME(float *g, const float *u, int n) {                                                                       \
        int i = 0;                                                                                                     \
        for (; i + 4 <= n; i += 4) vst1q_f32(g + i, FN(vld1q_f32(g + i), vld1q_f32(u + i)));                           \
        if (i < n) {                                                                                                   \
            float bg[4] = {0}, bu[4] = {0};                                                                            \
            memcpy(bg, g + i, sizeof(float) * (size_t)(n - i));                                                        \
            memcpy(bu, u + i, sizeof(float) * (size_t)(n - i));                                                        \
            vst1q_f32(bg, FN(vld1q_f32(bg), vld1q_f32(bu)));                                                           \
            memcpy(g + i, bg, sizeof(float) * (size_t)(n - i));                                                        \
        }                                                                                                              \
    }
GATED(neon_swiglu, silu_mul)
GATED(neon_geglu, gelu_mul)

/* gelu alone: gelu_mul's activation without the product */
void neon_gelu(float *x, int n) {
    const float32x4_t one = vdupq_n_f32(1.0f);
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(x + i, gelu_mul(vld1q_f32(x + i), one));
    if (i < n) {
        float b[4] = {0};
        memcpy(b, x + i, sizeof(float) * (size_t)(n - i));
        vst1q_f32(b, gelu_mul(vld1q_f32(b), one));
        memcpy(x + i, b, sizeof(float) * (size_t)(n - i));
    }
}

/* One pair rotation as the reference writes it: two products, one
 * difference or sum each (no fma), so the bits are the reference's. */
static inline void rot4(float32x4_t x0, float32x4_t x1, float32x4_t c, float32x4_t s, float32x4_t *y0,
                        float32x4_t *y1) {
    *y0 = vsubq_f32(vmulq_f32(x0, c), vmulq_f32(x1, s));
    *y1 = vaddq_f32(vmulq_f32(x0, s), vmulq_f32(x1, c));
}

void neon_rope(float *x, int n_heads, int head_dim, int n_rot, const float *cs, int neox) {
    int half = n_rot / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        int i = 0;
        for (; i + 4 <= half; i += 4) {
            float32x4x2_t t = vld2q_f32(cs + 2 * i); /* val[0] cos, val[1] sin */
            float32x4_t y0, y1;
            if (neox) {
                rot4(vld1q_f32(v + i), vld1q_f32(v + i + half), t.val[0], t.val[1], &y0, &y1);
                vst1q_f32(v + i, y0);
                vst1q_f32(v + i + half, y1);
            } else {
                float32x4x2_t p = vld2q_f32(v + 2 * i);
                rot4(p.val[0], p.val[1], t.val[0], t.val[1], &y0, &y1);
                p.val[0] = y0;
                p.val[1] = y1;
                vst2q_f32(v + 2 * i, p);
            }
        }
        for (; i < half; i++) {
            int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            float c = cs[2 * i], s = cs[2 * i + 1];
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}

/* ---- attention -------------------------------------------------------------------- */

/* hd a multiple of 4: two 4-lane fma accumulators, summed at the end. */
static inline float dot_hd(const float *a, const float *b, int hd) {
    float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0;
    int d = 0;
    for (; d + 8 <= hd; d += 8) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + d), vld1q_f32(b + d));
        s1 = vfmaq_f32(s1, vld1q_f32(a + d + 4), vld1q_f32(b + d + 4));
    }
    if (d < hd) s0 = vfmaq_f32(s0, vld1q_f32(a + d), vld1q_f32(b + d));
    return vaddvq_f32(vaddq_f32(s0, s1));
}

void neon_attn_scores(const float *Q, int R, int hd, const float *const *krow, int nk, float *S, int s_stride) {
    for (int r = 0; r < R; r++)
        for (int t = 0; t < nk; t++) S[(size_t)r * s_stride + t] = dot_hd(Q + (size_t)r * hd, krow[t], hd);
}

/* Per row, 16 columns at a time in four accumulators that stay in
 * registers over all the keys (then 4 at a time). */
void neon_attn_pv(float *O, int R, int hd, const float *P, int p_stride, const float *const *vrow, int nk) {
    for (int r = 0; r < R; r++) {
        float *o = O + (size_t)r * hd;
        const float *p = P + (size_t)r * p_stride;
        int d = 0;
        for (; d + 16 <= hd; d += 16) {
            float32x4_t a0 = vld1q_f32(o + d), a1 = vld1q_f32(o + d + 4);
            float32x4_t a2 = vld1q_f32(o + d + 8), a3 = vld1q_f32(o + d + 12);
            for (int t = 0; t < nk; t++) {
                const float *v = vrow[t] + d;
                float32x4_t w = vdupq_n_f32(p[t]);
                a0 = vfmaq_f32(a0, w, vld1q_f32(v));
                a1 = vfmaq_f32(a1, w, vld1q_f32(v + 4));
                a2 = vfmaq_f32(a2, w, vld1q_f32(v + 8));
                a3 = vfmaq_f32(a3, w, vld1q_f32(v + 12));
            }
            vst1q_f32(o + d, a0);
            vst1q_f32(o + d + 4, a1);
            vst1q_f32(o + d + 8, a2);
            vst1q_f32(o + d + 12, a3);
        }
        for (; d < hd; d += 4) {
            float32x4_t a = vld1q_f32(o + d);
            for (int t = 0; t < nk; t++) a = vfmaq_f32(a, vdupq_n_f32(p[t]), vld1q_f32(vrow[t] + d));
            vst1q_f32(o + d, a);
        }
    }
}

float neon_attn_max(const float *x, int n) {
    float m = x[0];
    int i = 0;
    if (n >= 4) {
        float32x4_t v = vld1q_f32(x);
        for (i = 4; i + 4 <= n; i += 4) v = vmaxq_f32(v, vld1q_f32(x + i));
        m = vmaxvq_f32(v);
    }
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

void neon_attn_scale(float *dst, const float *src, int n, float c) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, vmulq_n_f32(vld1q_f32(src + i), c));
    for (; i < n; i++) dst[i] = src[i] * c;
}

float neon_attn_exp_sum(float *x, int n, float m) {
    float32x4_t s = vdupq_n_f32(0.0f), vm = vdupq_n_f32(m);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t e = exp4(vsubq_f32(vld1q_f32(x + i), vm));
        vst1q_f32(x + i, e);
        s = vaddq_f32(s, e);
    }
    float sum = vaddvq_f32(s);
    if (i < n) {
        float b[4] = {m, m, m, m};
        memcpy(b, x + i, sizeof(float) * (size_t)(n - i));
        vst1q_f32(b, exp4(vsubq_f32(vld1q_f32(b), vm)));
        for (int k = 0; k < n - i; k++) {
            x[i + k] = b[k];
            sum += b[k];
        }
    }
    return sum;
}

#endif
