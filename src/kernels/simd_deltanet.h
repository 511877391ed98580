/*
 * simd_deltanet.h - the body of the SIMD linear-attention kernels
 * (contracts in kernels/deltanet.h), written once over a vector of DN_VL
 * floats. kernels/avx2_deltanet.c (8 lanes, AVX2 + FMA),
 * kernels/avx512_deltanet.c (16 lanes, AVX-512 F) and
 * kernels/neon_deltanet.c (4 lanes, AArch64 NEON) include it after
 * defining:
 *
 *   vf, DN_VL            the vector type and its lanes
 *   v_zero, v_set1, v_load, v_store, v_add, v_sub, v_mul, v_div
 *   v_loadn, v_storen    the first n < DN_VL lanes (the others read as 0,
 *                        left unwritten; nothing past them is touched)
 *   v_fmadd(a, b, c)     a b + c, one rounding; v_fnmadd: c - a b
 *   v_hsum               the sum of the lanes
 *   v_exp                e^x, ~1 ulp, inputs clamped to [-87.3, 88.3]
 *   dsumsq(x, n)         sum of x[i]^2 in double
 *
 * Everything here is static: the including file exports only its fill
 * function. Results against the scalar reference (kernels/deltanet.c): the
 * same terms summed in the same order, except the dot products over a head
 * (q.k, k.k: DN_VL lanes, then across) and the norms' sums of squares,
 * with fused multiply-adds and v_exp for expf, so they agree to a few ulps
 * per operation (tests/test_deltanet.c states the bounds). Each element's
 * arithmetic is the same whatever the call's size, so the contract's
 * equalities (conv over n tokens and n calls of one, a recurrence over n
 * tokens and n calls of one) hold bit for bit.
 *
 * How the kernels run:
 *   conv     per token, channel vectors: the k taps as one fma chain
 *            (oldest first), SiLU through v_exp; channels in tiles of
 *            DN_CONV_TILE so a tile's rows stay in L1 across the tokens
 *            and its state is rolled while they are there.
 *   recur    per token and column block of 4 vectors (delta and o of a
 *            column need only that column of S) two sweeps: the first
 *            forms k^T S and q^T S (8 accumulators, one load of each state
 *            vector), the second, with the block still in L1, writes
 *            e S + k delta^T (the block's delta held in registers).
 *   chunk    the products of the chunk form as register tiles of 4 rows
 *            by 2 vectors (8 accumulators, 2 loads and 4 broadcasts from
 *            memory per 8 fmas; a lone row by 4 vectors), or, where the
 *            including file defines DN_TILE4X4 (32 registers: avx512), 4
 *            rows by 4 vectors first (16 accumulators, 4 loads and 4
 *            broadcasts per 16 fmas; each element summed term for term as
 *            in the 4x2 tile, so the bits do not change): k^T S0 and
 *            q^T S0, the intra-chunk outputs, the state update; the
 *            (C, C) dot products 4 keys at a time; the forward
 *            substitution in column blocks of 4 vectors; the decays
 *            exp(G_t - G_s) by v_exp a vector at a time.
 */
#ifndef LAMINA_SIMD_DELTANET_H
#define LAMINA_SIMD_DELTANET_H

#include <math.h>
#include <stddef.h>

#include "kernels/deltanet.h"

#define DN_CONV_TILE 256 /* channels per pass over the tokens */

/* The first n lanes, whole vectors through plain loads and stores. */
static inline vf dn_ld(const float *p, int n) { return n >= DN_VL ? v_load(p) : v_loadn(p, n); }
static inline void dn_st(float *p, vf x, int n) {
    if (n >= DN_VL) v_store(p, x);
    else v_storen(p, x, n);
}

/* e^x, 0 below LM_DN_DECAY_MIN (deltanet.h). */
static inline float dn_decay(double x) { return x < LM_DN_DECAY_MIN ? 0.0f : expf((float)x); }

static inline vf dn_silu(vf x) { return v_div(x, v_add(v_set1(1.0f), v_exp(v_sub(v_zero(), x)))); }

/* ---- conv, norms ----------------------------------------------------------------- */

static void dn_conv(float *y, const float *x, float *state, const float *w, int n_tok, int n_ch, int k, size_t ld,
                    bool silu) {
    const int km = k - 1;
    for (int c0 = 0; c0 < n_ch; c0 += DN_CONV_TILE) {
        const int c1 = n_ch - c0 < DN_CONV_TILE ? n_ch : c0 + DN_CONV_TILE;
        for (int t = 0; t < n_tok; t++) {
            const float *src[LM_DN_CONV_MAX]; /* tap i's row of [state; x] */
            for (int i = 0; i < k; i++)
                src[i] = t + i < km ? state + (size_t)(t + i) * ld : x + (size_t)(t + i - km) * ld;
            float *yt = y + (size_t)t * ld;
            for (int c = c0; c < c1; c += DN_VL) {
                const int nc = c1 - c;
                vf acc = v_zero();
                for (int i = 0; i < k; i++)
                    acc = v_fmadd(dn_ld(w + (size_t)i * ld + c, nc), dn_ld(src[i] + c, nc), acc);
                dn_st(yt + c, silu ? dn_silu(acc) : acc, nc);
            }
        }
        /* the tile's state, while its rows are in L1 */
        dn_conv_roll(state + c0, x + c0, n_tok, c1 - c0, k, ld);
    }
}

static void dn_l2norm(float *y, const float *x, int n, float eps) {
    const vf sc = v_set1(1.0f / fmaxf(sqrtf((float)dsumsq(x, n)), eps));
    for (int i = 0; i < n; i += DN_VL) dn_st(y + i, v_mul(dn_ld(x + i, n - i), sc), n - i);
}

static void dn_norm_gated(float *y, const float *x, const float *w, const float *z, int n, float eps) {
    const vf sc = v_set1((float)(1.0 / sqrt(dsumsq(x, n) / n + eps)));
    for (int i = 0; i < n; i += DN_VL) {
        const int m = n - i;
        vf g = dn_silu(dn_ld(z + i, m));
        dn_st(y + i, v_mul(v_mul(v_mul(dn_ld(x + i, m), sc), dn_ld(w + i, m)), g), m);
    }
}

/* ---- the recurrence -------------------------------------------------------------- */

static float dn_dot(const float *a, const float *b, int n) {
    vf acc = v_zero();
    for (int i = 0; i < n; i += DN_VL) acc = v_fmadd(dn_ld(a + i, n - i), dn_ld(b + i, n - i), acc);
    return v_hsum(acc);
}

/* kS[j] = sum_i k[i] S[i][j], qS[j] = sum_i q[i] S[i][j] for the 4 vectors of
 * columns at S (rows dv apart). */
static void dn_sweep4(const float *S, int dv, int dk, const float *k, const float *q, float *kS, float *qS) {
    vf a0 = v_zero(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int i = 0; i < dk; i++) {
        const float *r = S + (size_t)i * dv;
        const vf kb = v_set1(k[i]), qb = v_set1(q[i]);
        const vf s0 = v_load(r), s1 = v_load(r + DN_VL), s2 = v_load(r + 2 * DN_VL), s3 = v_load(r + 3 * DN_VL);
        a0 = v_fmadd(kb, s0, a0), a1 = v_fmadd(kb, s1, a1), a2 = v_fmadd(kb, s2, a2), a3 = v_fmadd(kb, s3, a3);
        b0 = v_fmadd(qb, s0, b0), b1 = v_fmadd(qb, s1, b1), b2 = v_fmadd(qb, s2, b2), b3 = v_fmadd(qb, s3, b3);
    }
    v_store(kS, a0), v_store(kS + DN_VL, a1), v_store(kS + 2 * DN_VL, a2), v_store(kS + 3 * DN_VL, a3);
    v_store(qS, b0), v_store(qS + DN_VL, b1), v_store(qS + 2 * DN_VL, b2), v_store(qS + 3 * DN_VL, b3);
}

/* The same for one vector of n <= DN_VL columns. */
static void dn_sweep1(const float *S, int dv, int dk, const float *k, const float *q, float *kS, float *qS, int n) {
    vf a = v_zero(), b = a;
    for (int i = 0; i < dk; i++) {
        const vf s = dn_ld(S + (size_t)i * dv, n);
        a = v_fmadd(v_set1(k[i]), s, a);
        b = v_fmadd(v_set1(q[i]), s, b);
    }
    dn_st(kS, a, n);
    dn_st(qS, b, n);
}

/* S[i][j] = e S[i][j] + k[i] d[j] for the 4 vectors of columns at S and d. */
static void dn_update4(float *S, int dv, int dk, const float *k, const float *d, float e) {
    const vf ve = v_set1(e), d0 = v_load(d), d1 = v_load(d + DN_VL), d2 = v_load(d + 2 * DN_VL),
             d3 = v_load(d + 3 * DN_VL);
    for (int i = 0; i < dk; i++) {
        float *r = S + (size_t)i * dv;
        const vf kb = v_set1(k[i]);
        v_store(r, v_fmadd(kb, d0, v_mul(ve, v_load(r))));
        v_store(r + DN_VL, v_fmadd(kb, d1, v_mul(ve, v_load(r + DN_VL))));
        v_store(r + 2 * DN_VL, v_fmadd(kb, d2, v_mul(ve, v_load(r + 2 * DN_VL))));
        v_store(r + 3 * DN_VL, v_fmadd(kb, d3, v_mul(ve, v_load(r + 3 * DN_VL))));
    }
}

static void dn_update1(float *S, int dv, int dk, const float *k, const float *d, float e, int n) {
    const vf ve = v_set1(e), d0 = dn_ld(d, n);
    for (int i = 0; i < dk; i++) {
        float *r = S + (size_t)i * dv;
        dn_st(r, v_fmadd(v_set1(k[i]), d0, v_mul(ve, dn_ld(r, n))), n);
    }
}

static void dn_recur(float *S, const lm_dn_seq *s) {
    const int dk = s->dk, dv = s->dv, B = 4 * DN_VL;
    float kS[4 * DN_VL], qS[4 * DN_VL], d[4 * DN_VL]; /* a column block's */
    for (int t = 0; t < s->n_tok; t++) {
        const float *q = s->q + (size_t)t * s->qk_stride, *k = s->k + (size_t)t * s->qk_stride;
        const float *v = s->v + (size_t)t * s->v_stride;
        float *o = s->o + (size_t)t * s->o_stride;
        const float e = dn_decay(s->g[(size_t)t * s->gb_stride]), beta = s->beta[(size_t)t * s->gb_stride];
        const vf vb = v_set1(beta), ve = v_set1(e), vkq = v_set1(dn_dot(k, q, dk)), vsc = v_set1(s->scale);
        /* delta and o of a column depend on that column of S alone: each block
         * is swept, then updated while it is in L1 */
        for (int j = 0; j < dv; j += B) {
            const int nb = dv - j < B ? dv - j : B;
            if (nb == B) dn_sweep4(S + j, dv, dk, k, q, kS, qS);
            else
                for (int jj = 0; jj < nb; jj += DN_VL) dn_sweep1(S + j + jj, dv, dk, k, q, kS + jj, qS + jj, nb - jj);
            for (int jj = 0; jj < nb; jj += DN_VL) {
                const int m = nb - jj;
                const vf dj = v_mul(vb, v_fnmadd(ve, dn_ld(kS + jj, m), dn_ld(v + j + jj, m)));
                dn_st(d + jj, dj, m);
                dn_st(o + j + jj, v_mul(vsc, v_fmadd(vkq, dj, v_mul(ve, dn_ld(qS + jj, m)))), m);
            }
            if (nb == B) dn_update4(S + j, dv, dk, k, d, e);
            else
                for (int jj = 0; jj < nb; jj += DN_VL) dn_update1(S + j + jj, dv, dk, k, d + jj, e, nb - jj);
        }
    }
}

/* ---- the chunk form -------------------------------------------------------------- */

/* ok[m] = a . b_m and oq[m] = c . b_m for m < 4, b_m at b + min(m, nb - 1) * bs
 * (only the first nb count). */
static void dn_dots2x4(const float *a, const float *c, const float *b, size_t bs, int nb, int n, float *ok, float *oq) {
    const float *b0 = b, *b1 = b + (nb > 1 ? bs : 0), *b2 = b + (size_t)(nb > 2 ? 2 : nb - 1) * bs,
                *b3 = b + (size_t)(nb > 3 ? 3 : nb - 1) * bs;
    vf k0 = v_zero(), k1 = k0, k2 = k0, k3 = k0, q0 = k0, q1 = k0, q2 = k0, q3 = k0;
    for (int i = 0; i < n; i += DN_VL) {
        const int m = n - i;
        const vf va = dn_ld(a + i, m), vc = dn_ld(c + i, m);
        const vf x0 = dn_ld(b0 + i, m), x1 = dn_ld(b1 + i, m), x2 = dn_ld(b2 + i, m), x3 = dn_ld(b3 + i, m);
        k0 = v_fmadd(va, x0, k0), k1 = v_fmadd(va, x1, k1), k2 = v_fmadd(va, x2, k2), k3 = v_fmadd(va, x3, k3);
        q0 = v_fmadd(vc, x0, q0), q1 = v_fmadd(vc, x1, q1), q2 = v_fmadd(vc, x2, q2), q3 = v_fmadd(vc, x3, q3);
    }
    ok[0] = v_hsum(k0), ok[1] = v_hsum(k1), ok[2] = v_hsum(k2), ok[3] = v_hsum(k3);
    oq[0] = v_hsum(q0), oq[1] = v_hsum(q1), oq[2] = v_hsum(q2), oq[3] = v_hsum(q3);
}

/* y[j] -= sum_{u<m} a[u] R[u][j] for j < n, u in order (R rows rs apart):
 * one row of the forward substitution. */
static void dn_subst(float *y, const float *a, const float *R, size_t rs, int m, int n) {
    int j = 0;
    for (; j + 4 * DN_VL <= n; j += 4 * DN_VL) {
        vf y0 = v_load(y + j), y1 = v_load(y + j + DN_VL), y2 = v_load(y + j + 2 * DN_VL),
           y3 = v_load(y + j + 3 * DN_VL);
        for (int u = 0; u < m; u++) {
            const float *r = R + (size_t)u * rs + j;
            const vf va = v_set1(a[u]);
            y0 = v_fnmadd(va, v_load(r), y0), y1 = v_fnmadd(va, v_load(r + DN_VL), y1);
            y2 = v_fnmadd(va, v_load(r + 2 * DN_VL), y2), y3 = v_fnmadd(va, v_load(r + 3 * DN_VL), y3);
        }
        v_store(y + j, y0), v_store(y + j + DN_VL, y1), v_store(y + j + 2 * DN_VL, y2);
        v_store(y + j + 3 * DN_VL, y3);
    }
    for (; j < n; j += DN_VL) {
        const int nn = n - j;
        vf y0 = dn_ld(y + j, nn);
        for (int u = 0; u < m; u++) y0 = v_fnmadd(v_set1(a[u]), dn_ld(R + (size_t)u * rs + j, nn), y0);
        dn_st(y + j, y0, nn);
    }
}

/* A product of the chunk form: Y[r][j] = f_r Y[r][j] + sum_c X(r, c)
 * B[c][j] for r < m, j < n, c < kk, with X(r, c) at X[r * xr + c * xc], B
 * row c at B + c * bs, Y row r at Y + r * ys, f_r = f[r * fs], or with f
 * NULL Y only written (the sum alone). tri: X(r, c) is 0 for c > r, and a
 * block of rows r0.. sums only c < r0 + 4. */
typedef struct {
    float *Y;
    const float *X, *B, *f;
    size_t ys, xr, xc, bs, fs;
    int m, n, kk;
    bool tri;
} dn_prod;

/* Rows r0 .. r0 + 3, the 2 vectors of columns at j. */
static void dn_tile4x2(const dn_prod *p, int r0, int j, int kk) {
    float *y0 = p->Y + (size_t)r0 * p->ys + j, *y1 = y0 + p->ys, *y2 = y1 + p->ys, *y3 = y2 + p->ys;
    vf a00 = v_zero(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
    if (p->f) {
        const float *f = p->f + (size_t)r0 * p->fs;
        const vf f0 = v_set1(f[0]), f1 = v_set1(f[p->fs]), f2 = v_set1(f[2 * p->fs]), f3 = v_set1(f[3 * p->fs]);
        a00 = v_mul(f0, v_load(y0)), a01 = v_mul(f0, v_load(y0 + DN_VL));
        a10 = v_mul(f1, v_load(y1)), a11 = v_mul(f1, v_load(y1 + DN_VL));
        a20 = v_mul(f2, v_load(y2)), a21 = v_mul(f2, v_load(y2 + DN_VL));
        a30 = v_mul(f3, v_load(y3)), a31 = v_mul(f3, v_load(y3 + DN_VL));
    }
    const float *x = p->X + (size_t)r0 * p->xr;
    const size_t xr = p->xr;
    for (int c = 0; c < kk; c++, x += p->xc) {
        const float *b = p->B + (size_t)c * p->bs + j;
        const vf b0 = v_load(b), b1 = v_load(b + DN_VL);
        vf xv = v_set1(x[0]);
        a00 = v_fmadd(xv, b0, a00), a01 = v_fmadd(xv, b1, a01);
        xv = v_set1(x[xr]);
        a10 = v_fmadd(xv, b0, a10), a11 = v_fmadd(xv, b1, a11);
        xv = v_set1(x[2 * xr]);
        a20 = v_fmadd(xv, b0, a20), a21 = v_fmadd(xv, b1, a21);
        xv = v_set1(x[3 * xr]);
        a30 = v_fmadd(xv, b0, a30), a31 = v_fmadd(xv, b1, a31);
    }
    v_store(y0, a00), v_store(y0 + DN_VL, a01), v_store(y1, a10), v_store(y1 + DN_VL, a11);
    v_store(y2, a20), v_store(y2 + DN_VL, a21), v_store(y3, a30), v_store(y3 + DN_VL, a31);
}

#ifdef DN_TILE4X4
/* Rows r0 .. r0 + 3, the 4 vectors of columns at j: 16 accumulators, for
 * 32 registers. Each element's sum is the 4x2 tile's, term for term. */
static void dn_tile4x4(const dn_prod *p, int r0, int j, int kk) {
    float *y0 = p->Y + (size_t)r0 * p->ys + j, *y1 = y0 + p->ys, *y2 = y1 + p->ys, *y3 = y2 + p->ys;
    vf a00 = v_zero(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    vf a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
    if (p->f) {
        const float *f = p->f + (size_t)r0 * p->fs;
        vf fv = v_set1(f[0]);
        a00 = v_mul(fv, v_load(y0)), a01 = v_mul(fv, v_load(y0 + DN_VL));
        a02 = v_mul(fv, v_load(y0 + 2 * DN_VL)), a03 = v_mul(fv, v_load(y0 + 3 * DN_VL));
        fv = v_set1(f[p->fs]);
        a10 = v_mul(fv, v_load(y1)), a11 = v_mul(fv, v_load(y1 + DN_VL));
        a12 = v_mul(fv, v_load(y1 + 2 * DN_VL)), a13 = v_mul(fv, v_load(y1 + 3 * DN_VL));
        fv = v_set1(f[2 * p->fs]);
        a20 = v_mul(fv, v_load(y2)), a21 = v_mul(fv, v_load(y2 + DN_VL));
        a22 = v_mul(fv, v_load(y2 + 2 * DN_VL)), a23 = v_mul(fv, v_load(y2 + 3 * DN_VL));
        fv = v_set1(f[3 * p->fs]);
        a30 = v_mul(fv, v_load(y3)), a31 = v_mul(fv, v_load(y3 + DN_VL));
        a32 = v_mul(fv, v_load(y3 + 2 * DN_VL)), a33 = v_mul(fv, v_load(y3 + 3 * DN_VL));
    }
    const float *x = p->X + (size_t)r0 * p->xr;
    const size_t xr = p->xr;
    for (int c = 0; c < kk; c++, x += p->xc) {
        const float *b = p->B + (size_t)c * p->bs + j;
        const vf b0 = v_load(b), b1 = v_load(b + DN_VL), b2 = v_load(b + 2 * DN_VL), b3 = v_load(b + 3 * DN_VL);
        vf xv = v_set1(x[0]);
        a00 = v_fmadd(xv, b0, a00), a01 = v_fmadd(xv, b1, a01), a02 = v_fmadd(xv, b2, a02), a03 = v_fmadd(xv, b3, a03);
        xv = v_set1(x[xr]);
        a10 = v_fmadd(xv, b0, a10), a11 = v_fmadd(xv, b1, a11), a12 = v_fmadd(xv, b2, a12), a13 = v_fmadd(xv, b3, a13);
        xv = v_set1(x[2 * xr]);
        a20 = v_fmadd(xv, b0, a20), a21 = v_fmadd(xv, b1, a21), a22 = v_fmadd(xv, b2, a22), a23 = v_fmadd(xv, b3, a23);
        xv = v_set1(x[3 * xr]);
        a30 = v_fmadd(xv, b0, a30), a31 = v_fmadd(xv, b1, a31), a32 = v_fmadd(xv, b2, a32), a33 = v_fmadd(xv, b3, a33);
    }
    v_store(y0, a00), v_store(y0 + DN_VL, a01), v_store(y0 + 2 * DN_VL, a02), v_store(y0 + 3 * DN_VL, a03);
    v_store(y1, a10), v_store(y1 + DN_VL, a11), v_store(y1 + 2 * DN_VL, a12), v_store(y1 + 3 * DN_VL, a13);
    v_store(y2, a20), v_store(y2 + DN_VL, a21), v_store(y2 + 2 * DN_VL, a22), v_store(y2 + 3 * DN_VL, a23);
    v_store(y3, a30), v_store(y3 + DN_VL, a31), v_store(y3 + 2 * DN_VL, a32), v_store(y3 + 3 * DN_VL, a33);
}
#endif

/* Row r, the 4 vectors of columns at j (4 chains: a lone row's rate). */
static void dn_tile1x4(const dn_prod *p, int r, int j, int kk) {
    float *y = p->Y + (size_t)r * p->ys + j;
    vf a0 = v_zero(), a1 = a0, a2 = a0, a3 = a0;
    if (p->f) {
        const vf f = v_set1(p->f[(size_t)r * p->fs]);
        a0 = v_mul(f, v_load(y)), a1 = v_mul(f, v_load(y + DN_VL));
        a2 = v_mul(f, v_load(y + 2 * DN_VL)), a3 = v_mul(f, v_load(y + 3 * DN_VL));
    }
    const float *x = p->X + (size_t)r * p->xr;
    for (int c = 0; c < kk; c++, x += p->xc) {
        const float *b = p->B + (size_t)c * p->bs + j;
        const vf xv = v_set1(x[0]);
        a0 = v_fmadd(xv, v_load(b), a0), a1 = v_fmadd(xv, v_load(b + DN_VL), a1);
        a2 = v_fmadd(xv, v_load(b + 2 * DN_VL), a2), a3 = v_fmadd(xv, v_load(b + 3 * DN_VL), a3);
    }
    v_store(y, a0), v_store(y + DN_VL, a1), v_store(y + 2 * DN_VL, a2), v_store(y + 3 * DN_VL, a3);
}

/* Row r, the nc <= DN_VL columns at j. */
static void dn_tile1(const dn_prod *p, int r, int j, int nc, int kk) {
    float *y = p->Y + (size_t)r * p->ys + j;
    vf a = p->f ? v_mul(v_set1(p->f[(size_t)r * p->fs]), dn_ld(y, nc)) : v_zero();
    const float *x = p->X + (size_t)r * p->xr;
    for (int c = 0; c < kk; c++) a = v_fmadd(v_set1(x[(size_t)c * p->xc]), dn_ld(p->B + (size_t)c * p->bs + j, nc), a);
    dn_st(y, a, nc);
}

static void dn_product(const dn_prod *p) {
    int r = 0;
    for (; r + 4 <= p->m; r += 4) {
        const int kk = p->tri && r + 4 < p->kk ? r + 4 : p->kk;
        int j = 0;
#ifdef DN_TILE4X4
        for (; j + 4 * DN_VL <= p->n; j += 4 * DN_VL) dn_tile4x4(p, r, j, kk);
#endif
        for (; j + 2 * DN_VL <= p->n; j += 2 * DN_VL) dn_tile4x2(p, r, j, kk);
        for (; j < p->n; j += DN_VL)
            for (int i = 0; i < 4; i++) dn_tile1(p, r + i, j, p->n - j, kk);
    }
    for (; r < p->m; r++) {
        const int kk = p->tri && r + 1 < p->kk ? r + 1 : p->kk;
        int j = 0;
        for (; j + 4 * DN_VL <= p->n; j += 4 * DN_VL) dn_tile1x4(p, r, j, kk);
        for (; j < p->n; j += DN_VL) dn_tile1(p, r, j, p->n - j, kk);
    }
}

static void dn_chunk(float *S, const lm_dn_seq *s, float *work) {
    enum { C = LM_DN_CHUNK };
    const int dk = s->dk, dv = s->dv;
    double G[C]; /* cumulative log decays, in double as the reference sums them */
    float *F = work, *A = F + C, *M = A + C * C, *U = M + C * C, *W = U + (size_t)C * dv;
    const size_t qs = s->qk_stride, vs = s->v_stride, gs = s->gb_stride, os = s->o_stride;
    for (int c0 = 0; c0 < s->n_tok; c0 += C) {
        const int n = s->n_tok - c0 < C ? s->n_tok - c0 : C;
        const float *q = s->q + (size_t)c0 * qs, *k = s->k + (size_t)c0 * qs, *v = s->v + (size_t)c0 * vs;
        const float *g = s->g + (size_t)c0 * gs, *beta = s->beta + (size_t)c0 * gs;
        float *o = s->o + (size_t)c0 * os;

        double acc = 0;
        for (int t = 0; t < n; t++) G[t] = acc += g[t * gs];
        /* A and M, a row at a time: the decays by vector, the dots 4 keys at a time */
        for (int t = 0; t < n; t++) {
            float ex[C], kk[4], qk[4];
            for (int u = 0; u <= t; u++) ex[u] = (float)(G[t] - G[u]);
            for (int u = 0; u <= t; u += DN_VL) dn_st(ex + u, v_exp(dn_ld(ex + u, t + 1 - u)), t + 1 - u);
            for (int u = 0; u <= t; u++)
                if (G[t] - G[u] < LM_DN_DECAY_MIN) ex[u] = 0;
            float *At = A + t * C, *Mt = M + t * C;
            const float bt = beta[t * gs], sc = s->scale;
            for (int u = 0; u <= t; u += 4) {
                const int nb = t + 1 - u < 4 ? t + 1 - u : 4;
                dn_dots2x4(k + t * qs, q + t * qs, k + u * qs, qs, nb, dk, kk, qk);
                for (int i = 0; i < nb; i++) {
                    if (u + i < t) At[u + i] = bt * ex[u + i] * kk[i];
                    Mt[u + i] = sc * ex[u + i] * qk[i];
                }
            }
            for (int u = t + 1; u < C; u++) Mt[u] = 0;
        }
        /* R_t = beta_t (v_t - exp(G_t) S0^T k_t), then D = (I + A)^-1 R by
         * forward substitution, in U */
        dn_product(
            &(dn_prod){.Y = U, .ys = dv, .X = k, .xr = qs, .xc = 1, .B = S, .bs = dv, .m = n, .n = dv, .kk = dk});
        for (int t = 0; t < n; t++) {
            const vf vb = v_set1(beta[t * gs]), ve = v_set1(dn_decay(G[t]));
            float *Ut = U + (size_t)t * dv;
            for (int j = 0; j < dv; j += DN_VL)
                dn_st(Ut + j, v_mul(vb, v_fnmadd(ve, dn_ld(Ut + j, dv - j), dn_ld(v + t * vs + j, dv - j))), dv - j);
            dn_subst(Ut, A + t * C, U, dv, t, dv);
        }
        /* o = q S0, then o_t = scale exp(G_t) o_t + sum_{u<=t} M[t][u] D_u */
        dn_product(
            &(dn_prod){.Y = o, .ys = os, .X = q, .xr = qs, .xc = 1, .B = S, .bs = dv, .m = n, .n = dv, .kk = dk});
        for (int t = 0; t < n; t++) F[t] = s->scale * dn_decay(G[t]);
        dn_product(&(dn_prod){.Y = o,
                              .ys = os,
                              .X = M,
                              .xr = C,
                              .xc = 1,
                              .B = U,
                              .bs = dv,
                              .f = F,
                              .fs = 1,
                              .m = n,
                              .n = dv,
                              .kk = n,
                              .tri = true});
        /* S = exp(G_{n-1}) S0 + sum_u exp(G_{n-1} - G_u) k_u D_u^T */
        for (int u = 0; u < n; u++) {
            const vf f = v_set1(dn_decay(G[n - 1] - G[u]));
            for (int i = 0; i < dk; i += DN_VL)
                dn_st(W + (size_t)u * dk + i, v_mul(f, dn_ld(k + u * qs + i, dk - i)), dk - i);
        }
        const float eg = dn_decay(G[n - 1]);
        dn_product(&(dn_prod){.Y = S,
                              .ys = dv,
                              .X = W,
                              .xr = 1,
                              .xc = dk,
                              .B = U,
                              .bs = dv,
                              .f = &eg,
                              .fs = 0,
                              .m = dk,
                              .n = dv,
                              .kk = n});
    }
}

#endif
