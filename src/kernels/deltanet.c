/*
 * deltanet.c - the scalar reference of the linear-attention kernels
 * (contracts and shapes in kernels/deltanet.h).
 *
 * Plain loops in float, in a fixed order the compiler may vectorize
 * without reordering a sum (no -ffast-math): the conv sums its taps
 * oldest first; the norms sum squares in double; the recurrence forms,
 * per token, k^T S and q^T S in one sweep over the state (sums over the
 * key dimension in order) and then the update S = e S + k delta^T, with the
 * output o = scale (e q^T S + (k.q) delta), which is scale S'^T q of the
 * updated state S' written out. The chunk form follows the formulas of
 * deltanet.h term by term, exponentials of differences of cumulative log
 * decays with expf (decay(): 0 under LM_DN_DECAY_MIN). The cumulative
 * decays G are summed in double: a difference G_t - G_s of float sums
 * near -100 would carry an error of ulp(100), 8e-6, into exp(G_t - G_s)
 * (the recurrence multiplies decays token by token and has no such loss;
 * tests/test_deltanet.c has a case that fails with float sums).
 *
 * Scratch of `chunk` (dn_chunk_work floats), C = LM_DN_CHUNK:
 *   F (C)        per-row factors (the SIMD variants' output scales)
 *   A (C, C)     beta_t exp(G_t - G_s) k_t.k_s, s < t
 *   M (C, C)     scale exp(G_t - G_s) q_t.k_s, s <= t, 0 above
 *   U (C, dv)    R, then the deltas D
 *   W (C, dk)    exp(G_{n-1} - G_s) k_s
 */
#include "kernels/deltanet.h"

#include <math.h>
#include <string.h>

size_t dn_chunk_work(int dk, int dv) { return (size_t)LM_DN_CHUNK * (1 + 2 * LM_DN_CHUNK + (size_t)dk + (size_t)dv); }

void dn_conv_roll(float *state, const float *x, int n_tok, int n_ch, int k, size_t ld) {
    int km = k - 1;
    /* row r takes row r + n_tok of [state; x]: a later row, not yet overwritten */
    for (int r = 0; r < km && n_tok > 0; r++) {
        int src = r + n_tok;
        const float *p = src < km ? state + (size_t)src * ld : x + (size_t)(src - km) * ld;
        memcpy(state + (size_t)r * ld, p, (size_t)n_ch * sizeof(float));
    }
}

void scalar_dn_conv(float *y, const float *x, float *state, const float *w, int n_tok, int n_ch, int k, size_t ld,
                    bool silu) {
    int km = k - 1;
    for (int t = 0; t < n_tok; t++) {
        float *yt = y + (size_t)t * ld; /* (n_ch) */
        for (int c = 0; c < n_ch; c++) yt[c] = 0;
        for (int i = 0; i < k; i++) {
            int r = t + i; /* row of [state; x] */
            const float *src = r < km ? state + (size_t)r * ld : x + (size_t)(r - km) * ld;
            const float *wi = w + (size_t)i * ld;
            for (int c = 0; c < n_ch; c++) yt[c] += wi[c] * src[c];
        }
        if (silu)
            for (int c = 0; c < n_ch; c++) yt[c] = yt[c] / (1.0f + expf(-yt[c]));
    }
    dn_conv_roll(state, x, n_tok, n_ch, k, ld);
}

void scalar_dn_l2norm(float *y, const float *x, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = 1.0f / fmaxf(sqrtf((float)ss), eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * scale;
}

void scalar_dn_norm_gated(float *y, const float *x, const float *w, const float *z, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) {
        float zi = z[i];
        y[i] = x[i] * scale * w[i] * (zi / (1.0f + expf(-zi)));
    }
}

void scalar_dn_gates(float *g, float *beta, const float *a, const float *b, const float *A, const float *dt_bias,
                     int n) {
    for (int h = 0; h < n; h++) {
        float u = a[h] + dt_bias[h];
        float sp = u > 20.0f ? u : log1pf(expf(u));
        g[h] = A[h] * sp;
        beta[h] = 1.0f / (1.0f + expf(-b[h]));
    }
}

/* e^x, 0 below LM_DN_DECAY_MIN (deltanet.h). */
static float decay(double x) { return x < LM_DN_DECAY_MIN ? 0.0f : expf((float)x); }

void scalar_dn_recur(float *S, const lm_dn_seq *s) {
    const int dk = s->dk, dv = s->dv;
    float kS[LM_DN_MAX_DIM], qS[LM_DN_MAX_DIM], d[LM_DN_MAX_DIM]; /* (dv) each */
    for (int t = 0; t < s->n_tok; t++) {
        const float *q = s->q + (size_t)t * s->qk_stride, *k = s->k + (size_t)t * s->qk_stride;
        const float *v = s->v + (size_t)t * s->v_stride;
        float *o = s->o + (size_t)t * s->o_stride;
        const float e = decay(s->g[(size_t)t * s->gb_stride]), beta = s->beta[(size_t)t * s->gb_stride];
        for (int j = 0; j < dv; j++) kS[j] = qS[j] = 0;
        float kq = 0;
        for (int i = 0; i < dk; i++) {
            const float *Si = S + (size_t)i * dv;
            for (int j = 0; j < dv; j++) {
                kS[j] += k[i] * Si[j];
                qS[j] += q[i] * Si[j];
            }
            kq += k[i] * q[i];
        }
        for (int j = 0; j < dv; j++) {
            d[j] = beta * (v[j] - e * kS[j]);
            o[j] = s->scale * (e * qS[j] + kq * d[j]);
        }
        for (int i = 0; i < dk; i++) {
            float *Si = S + (size_t)i * dv;
            for (int j = 0; j < dv; j++) Si[j] = e * Si[j] + k[i] * d[j];
        }
    }
}

static float dot(const float *a, const float *b, int n) {
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void scalar_dn_chunk(float *S, const lm_dn_seq *s, float *work) {
    enum { C = LM_DN_CHUNK };
    const int dk = s->dk, dv = s->dv;
    double G[C]; /* cumulative log decays of the chunk */
    float *A = work + C, *M = A + C * C, *U = M + C * C, *W = U + (size_t)C * dv;
    for (int c0 = 0; c0 < s->n_tok; c0 += C) {
        const int n = s->n_tok - c0 < C ? s->n_tok - c0 : C;
        const float *q = s->q + (size_t)c0 * s->qk_stride, *k = s->k + (size_t)c0 * s->qk_stride;
        const float *v = s->v + (size_t)c0 * s->v_stride;
        const float *g = s->g + (size_t)c0 * s->gb_stride, *beta = s->beta + (size_t)c0 * s->gb_stride;
        float *o = s->o + (size_t)c0 * s->o_stride;
        const size_t qs = s->qk_stride, vs = s->v_stride, gs = s->gb_stride, os = s->o_stride;

        double acc = 0;
        for (int t = 0; t < n; t++) G[t] = acc += g[t * gs];
        for (int t = 0; t < n; t++) {
            for (int u = 0; u < t; u++)
                A[t * C + u] = beta[t * gs] * decay(G[t] - G[u]) * dot(k + t * qs, k + u * qs, dk);
            for (int u = 0; u < C; u++)
                M[t * C + u] = u <= t ? s->scale * decay(G[t] - G[u]) * dot(q + t * qs, k + u * qs, dk) : 0;
        }
        /* R_t = beta_t (v_t - exp(G_t) S0^T k_t), then D = (I + A)^-1 R by
         * forward substitution, in U */
        for (int t = 0; t < n; t++) {
            float *Ut = U + (size_t)t * dv;
            const float *kt = k + t * qs;
            for (int j = 0; j < dv; j++) Ut[j] = 0;
            for (int i = 0; i < dk; i++)
                for (int j = 0; j < dv; j++) Ut[j] += kt[i] * S[(size_t)i * dv + j];
            const float bt = beta[t * gs], et = decay(G[t]);
            for (int j = 0; j < dv; j++) Ut[j] = bt * (v[t * vs + j] - et * Ut[j]);
            for (int u = 0; u < t; u++) {
                const float a = A[t * C + u];
                for (int j = 0; j < dv; j++) Ut[j] -= a * U[(size_t)u * dv + j];
            }
        }
        /* o_t = scale exp(G_t) q_t^T S0 + sum_{u<=t} M[t][u] D_u */
        for (int t = 0; t < n; t++) {
            float *ot = o + t * os;
            const float *qt = q + t * qs;
            for (int j = 0; j < dv; j++) ot[j] = 0;
            for (int i = 0; i < dk; i++)
                for (int j = 0; j < dv; j++) ot[j] += qt[i] * S[(size_t)i * dv + j];
            const float f = s->scale * decay(G[t]);
            for (int j = 0; j < dv; j++) ot[j] *= f;
            for (int u = 0; u <= t; u++)
                for (int j = 0; j < dv; j++) ot[j] += M[t * C + u] * U[(size_t)u * dv + j];
        }
        /* S = exp(G_{n-1}) S0 + sum_u exp(G_{n-1} - G_u) k_u D_u^T */
        for (int u = 0; u < n; u++) {
            const float f = decay(G[n - 1] - G[u]);
            for (int i = 0; i < dk; i++) W[(size_t)u * dk + i] = f * k[u * qs + i];
        }
        const float eg = decay(G[n - 1]);
        for (int i = 0; i < dk; i++) {
            float *Si = S + (size_t)i * dv;
            for (int j = 0; j < dv; j++) Si[j] *= eg;
            for (int u = 0; u < n; u++) {
                const float kd = W[(size_t)u * dk + i];
                for (int j = 0; j < dv; j++) Si[j] += kd * U[(size_t)u * dv + j];
            }
        }
    }
}
