/*
 * scalar.c - the scalar reference of the element-wise ops and of the
 * attention inner loops (contracts in kernels/scalar.h and kernels.h).
 *
 * Element-wise: RMSNorm sums squares in double; SiLU and GELU use expf;
 * GELU's tanh form is written 0.5 x (1 + tanh(y)) = x / (1 + e^(-2y)), which
 * keeps small negative outputs exact. RoPE rotates each pair by its
 * precomputed (cos, sin).
 *
 * Attention: a dot product is eight partial sums in a fixed order, summed
 * pairwise; P·V is one multiply-add chain per output element over the keys
 * in order, skipping zero probabilities (masked keys). The F16 entries and
 * Q8_0's P·V read each key or value element through its exact conversion
 * (lm_f16_to_f32; d * q for Q8_0, as format/quant.c's to_float) into the
 * same sums in the same order: the bits of to_float then the float entry.
 * Q8_0 scores against a quantized query (scores_q8_0_q8) are kernels.h's
 * definition written out: integer sums of four products, fmaf chains.
 */
#include "kernels/scalar.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"
#include "format/quant.h"

/* ---- element-wise ----------------------------------------------------------- */

void scalar_rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) y[i] = x[i] * scale * w[i];
}

void scalar_swiglu(float *g, const float *u, int n) {
    for (int i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void scalar_geglu(float *g, const float *u, int n) {
    /* GELU(tanh): 0.5 x (1 + tanh(y)) = x / (1 + e^(-2y)), y = sqrt(2/pi)
     * (x + 0.044715 x^3); this form keeps small negative outputs exact */
    const float c2 = -2.0f * 0.7978845608028654f;
    for (int i = 0; i < n; i++) {
        float x = g[i];
        g[i] = x / (1.0f + expf(c2 * (x + 0.044715f * x * x * x))) * u[i];
    }
}

/* geglu's activation alone, the same expression: gelu(x) = scalar_geglu's
 * result for u = 1, to the bit */
void scalar_gelu(float *x, int n) {
    const float c2 = -2.0f * 0.7978845608028654f;
    for (int i = 0; i < n; i++) {
        float v = x[i];
        x[i] = v / (1.0f + expf(c2 * (v + 0.044715f * v * v * v)));
    }
}

void scalar_rope(float *x, int n_heads, int head_dim, int n_rot, const float *cs, int neox) {
    int half = n_rot / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            int a = neox ? i : 2 * i;
            int b = neox ? i + half : 2 * i + 1;
            float c = cs[2 * i], s = cs[2 * i + 1];
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}

/* ---- attention ---------------------------------------------------------------- */

static float dot8(const float *a, const float *b, int n) {
    /* eight partial sums: a fixed order the compiler can also vectorize */
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    for (; i < n; i++) acc[0] += a[i] * b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

void scalar_attn_scores(const float *Q, int R, int hd, const float *const *krow, int nk, float *S, int s_stride) {
    for (int r = 0; r < R; r++)
        for (int t = 0; t < nk; t++) S[(size_t)r * s_stride + t] = dot8(Q + (size_t)r * hd, krow[t], hd);
}

void scalar_attn_pv(float *O, int R, int hd, const float *P, int p_stride, const float *const *vrow, int nk) {
    for (int r = 0; r < R; r++) {
        float *o = O + (size_t)r * hd;
        const float *p = P + (size_t)r * p_stride;
        for (int t = 0; t < nk; t++) {
            float w = p[t];
            if (w == 0.0f) continue;
            const float *v = vrow[t];
            for (int d = 0; d < hd; d++) o[d] += w * v[d];
        }
    }
}

/* Element i of a KV row of F16 or Q8_0, exactly as the type's to_float
 * gives it (both conversions are exact in float). */
static inline float f16_elem(const void *row, int i) { return lm_f16_to_f32(((const uint16_t *)row)[i]); }
static inline float q8_0_elem(const void *row, int i) {
    const block_q8_0 *b = (const block_q8_0 *)row + i / QK8_0;
    return lm_f16_to_f32(b->d) * (float)b->qs[i % QK8_0];
}

/* dot8 with b's elements read through elem: the same sums in the same order. */
static float dot8_kv(const float *a, const void *b, int n, float (*elem)(const void *, int)) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * elem(b, i + j);
    for (; i < n; i++) acc[0] += a[i] * elem(b, i);
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static void pv_kv(float *O, int R, int hd, const float *P, int p_stride, const void *const *vrow, int nk,
                  float (*elem)(const void *, int)) {
    for (int r = 0; r < R; r++) {
        float *o = O + (size_t)r * hd;
        const float *p = P + (size_t)r * p_stride;
        for (int t = 0; t < nk; t++) {
            float w = p[t];
            if (w == 0.0f) continue;
            for (int d = 0; d < hd; d++) o[d] += w * elem(vrow[t], d);
        }
    }
}

void scalar_attn_scores_f16(const float *Q, int R, int hd, const void *const *krow, int nk, float *S, int s_stride,
                            const void *const *pf, int npf) {
    for (int r = 0; r < R; r++)
        for (int t = 0; t < nk; t++) S[(size_t)r * s_stride + t] = dot8_kv(Q + (size_t)r * hd, krow[t], hd, f16_elem);
}

/* One score of kernels.h's lm_attn_scores_q8q_fn: eight lanes of exact
 * integer sums per block, each lane's chain of fmaf over the blocks, then
 * the lanes summed pairwise. */
static float dot_q8q(const block_q8_0 *q, const block_q8_0 *k, int nb) {
    float l[8] = {0};
    for (int b = 0; b < nb; b++) {
        float d = lm_f16_to_f32(q[b].d) * lm_f16_to_f32(k[b].d); /* exact: 11 by 11 bits */
        for (int j = 0; j < 8; j++) {
            int32_t s = 0;
            for (int e = 4 * j; e < 4 * j + 4; e++) s += (int32_t)q[b].qs[e] * k[b].qs[e];
            l[j] = fmaf(d, (float)s, l[j]);
        }
    }
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

void scalar_attn_scores_q8_0_q8(const void *Qq, int R, int hd, const void *const *krow, int nk, float *S, int s_stride,
                                const void *const *pf, int npf) {
    int nb = hd / QK8_0;
    for (int r = 0; r < R; r++)
        for (int t = 0; t < nk; t++)
            S[(size_t)r * s_stride + t] = dot_q8q((const block_q8_0 *)Qq + (size_t)r * nb, krow[t], nb);
}

void scalar_attn_pv_f16(float *O, int R, int hd, const float *P, int p_stride, const void *const *vrow, int nk,
                        const void *const *pf, int npf) {
    pv_kv(O, R, hd, P, p_stride, vrow, nk, f16_elem);
}

void scalar_attn_pv_q8_0(float *O, int R, int hd, const float *P, int p_stride, const void *const *vrow, int nk,
                         const void *const *pf, int npf) {
    pv_kv(O, R, hd, P, p_stride, vrow, nk, q8_0_elem);
}

float scalar_attn_max(const float *x, int n) {
    float m = x[0];
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

void scalar_attn_scale(float *dst, const float *src, int n, float c) {
    for (int i = 0; i < n; i++) dst[i] = src[i] * c;
}

float scalar_attn_exp_sum(float *x, int n, float m) {
    float s = 0;
    for (int t = 0; t < n; t++) {
        x[t] = expf(x[t] - m);
        s += x[t];
    }
    return s;
}

/* Eight independent chains of a multiply and an add (16 flops a round). */
float scalar_fma_probe(long rounds) {
    const float a = 0.999999f, b = 1e-7f;
    float c0 = 0, c1 = 0.1f, c2 = 0.2f, c3 = 0.3f, c4 = 0.4f, c5 = 0.5f, c6 = 0.6f, c7 = 0.7f;
    for (long r = 0; r < rounds; r++) {
        c0 = c0 * a + b;
        c1 = c1 * a + b;
        c2 = c2 * a + b;
        c3 = c3 * a + b;
        c4 = c4 * a + b;
        c5 = c5 * a + b;
        c6 = c6 * a + b;
        c7 = c7 * a + b;
    }
    return c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7;
}
