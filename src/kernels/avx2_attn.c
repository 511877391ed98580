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
 * Fused scores against F16 rows and P·V against F16 / Q8_0 rows (the end
 * of the file): the key or value vector converted in registers (vcvtph2ps; d * q through
 * vpmovsxbd, vcvtdq2ps and a multiply, exact as to_float's) and fed to the
 * same chains as above, so they give the float loops' bits on the
 * converted rows; scores in 4-row x 2-key tiles (4 rows share each
 * conversion), P·V in the 6-row x 16-column tiles. The prefetch requests
 * (x86_shadow.h) sit outside the inner steps: the scores ask at the top
 * of every 32 elements, P·V runs its keys with a request and those
 * without in two loops, and each query vector is loaded once per step.
 * Against the loop that tested for a request at every step, one Gemma
 * layer (4 rows, head dim 256, 16k keys) took 0.83-0.84x the time from L3
 * on the AMD host (bench/results/attention.md).
 * Q8_0 scores against quantized queries (scores_q8_0_q8): the 256-bit
 * integer kernel of kernels/x86_attn_q8.h with the sign trick (vpsignb,
 * vpmaddubsw, vpmaddwd), the reference's bits.
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
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "format/quant.h"
#include "kernels/x86_hsum.h"
#include "kernels/x86_shadow.h"

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

#define INLINE static inline __attribute__((always_inline))

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

/* ---- the fused entries: F16 and Q8_0 rows read in registers ------------------ */

enum { KV_F16, KV_Q8, KV_F32 };

/* The Q8_0 block scale of element d of a row, broadcast (F16, F32: unused). */
INLINE __m256 kv_scale(const void *row, int d, int T) {
    if (T != KV_Q8) return _mm256_setzero_ps();
    return _mm256_cvtph_ps(_mm_set1_epi16((short)((const block_q8_0 *)row)[d / QK8_0].d));
}

/* Elements d .. d+7 of a row as floats (F32: as they are), the bits of the type's to_float:
 * F16C's conversion is exact, and so is d * q (an 11-bit by 8-bit
 * product) for Q8_0. */
INLINE __m256 kv_load(const void *row, int d, __m256 sc, int T) {
    if (T == KV_F32) return _mm256_loadu_ps((const float *)row + d);
    if (T == KV_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + d)));
    const int8_t *q = ((const block_q8_0 *)row)[d / QK8_0].qs + d % QK8_0;
    return _mm256_mul_ps(sc, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q))));
}

/* Elements d .. d+7 of rows [0, C) against F16 keys k0, k1: one step of
 * each of the tile's chains. Each query vector is loaded once into a
 * register (the asm keeps the compiler from folding the load into both
 * FMAs, which asks the load ports for two loads per vector). */
INLINE void scores_kv_step(const float *Q, int hd, const void *k0, const void *k1, int d, int C, __m256 acc[4][2]) {
    const __m256 none = _mm256_setzero_ps(); /* F16 has no scale */
    __m256 y0 = kv_load(k0, d, none, KV_F16), y1 = kv_load(k1, d, none, KV_F16);
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        __m256 x = _mm256_loadu_ps(Q + (size_t)c * hd + d);
        __asm__("" : "+x"(x));
        acc[c][0] = _mm256_fmadd_ps(x, y0, acc[c][0]);
        acc[c][1] = _mm256_fmadd_ps(x, y1, acc[c][1]);
    }
}

/* Rows [0, C) of Q (hd apart) against F16 keys k0, k1: s[c][0..1]. Each
 * score is one 8-lane FMA chain over d in order, reduced by hsum4, exactly
 * as dot_2x4 / dot_3x4 / dot1 do it on the converted rows (a lane of hsum4
 * depends only on its own accumulator). C = 4 rows x 2 keys: 8
 * accumulators, two key vectors, one query vector. */
INLINE void scores_kv_tile(const float *Q, int hd, const void *k0, const void *k1, int C, float s[4][2], const void *p0,
                           const void *p1, int sh) {
    const void *const pp[2] = {p0, p1};
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) acc[c][0] = acc[c][1] = _mm256_setzero_ps();
    int d = 0;
    if (sh >= 0) /* address-order requests, two per 32 elements: asked at the top of each 32 */
        for (; d + 32 <= hd; d += 32) {
            shadow_seq(pp, (size_t)(d / 32 * 2), sh), shadow_seq(pp, (size_t)(d / 32 * 2 + 1), sh);
#pragma GCC unroll 4
            for (int e = d; e < d + 32; e += 8) scores_kv_step(Q, hd, k0, k1, e, C, acc);
        }
    for (; d < hd; d += 8) {
        if (sh >= 0) {
            if (d % 32 == 0) shadow_seq(pp, (size_t)(d / 32 * 2), sh), shadow_seq(pp, (size_t)(d / 32 * 2 + 1), sh);
        } else if (p0) shadow_f16(p0, d, hd), shadow_f16(p1, d, hd);
        scores_kv_step(Q, hd, k0, k1, d, C, acc);
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        float t[4];
        _mm_storeu_ps(t, hsum4(acc[c][0], acc[c][1], acc[c][0], acc[c][1]));
        s[c][0] = t[0], s[c][1] = t[1];
    }
}

/* Rows [0, C) against every key, two at a time (an odd last key is paired
 * with itself and its second score dropped), prefetching pf's rows t <
 * npf (pf: NULL or kernels.h's). */
INLINE void scores_kv_rows(const float *Q, int hd, const void *const *krow, int nk, float *S, int s_stride, int C,
                           const void *const *pf, int npf) {
    const int sh = pf ? shadow_seq_shift(pf, npf, hd) : -1; /* once for the call's rows */
    for (int t = 0; t < nk; t += 2) {
        float s[4][2];
        bool two = t + 1 < nk;
        if (pf && t < npf)
            scores_kv_tile(Q, hd, krow[t], krow[two ? t + 1 : t], C, s, pf[t], pf[t + 1 < npf ? t + 1 : t], sh);
        else scores_kv_tile(Q, hd, krow[t], krow[two ? t + 1 : t], C, s, NULL, NULL, -1);
        for (int c = 0; c < C; c++) {
            S[(size_t)c * s_stride + t] = s[c][0];
            if (two) S[(size_t)c * s_stride + t + 1] = s[c][1];
        }
    }
}

void attn_scores_f16_avx2(const float *Q, int R, int hd, const void *const *krow, int nk, float *S, int s_stride,
                          const void *const *pf, int npf) {
    for (int r = 0; r < R; r += 4, pf = NULL) { /* the first rows prefetch pf */
        const float *q = Q + (size_t)r * hd;
        float *s = S + (size_t)r * s_stride;
        switch (R - r < 4 ? R - r : 4) {
            case 1: scores_kv_rows(q, hd, krow, nk, s, s_stride, 1, pf, npf); break;
            case 2: scores_kv_rows(q, hd, krow, nk, s, s_stride, 2, pf, npf); break;
            case 3: scores_kv_rows(q, hd, krow, nk, s, s_stride, 3, pf, npf); break;
            default: scores_kv_rows(q, hd, krow, nk, s, s_stride, 4, pf, npf); break;
        }
    }
}

/* Value row t of vrows: an array of const float * (F32) or of const void *
 * (F16, Q8_0), each read as its own type. */
INLINE const void *vrow_at(const void *vrows, int t, int T) {
    if (T == KV_F32) return ((const float *const *)vrows)[t];
    return ((const void *const *)vrows)[t];
}

/* Key t's step of the tile below: its value columns [d0, d0 + 8 W) into
 * the C x W accumulators. */
INLINE void pv_kv_step(__m256 acc[6][2], const float *P, int p_stride, const void *vrows, int t, int d0, int C, int W,
                       int T) {
    const void *row = vrow_at(vrows, t, T);
    __m256 sc = kv_scale(row, d0, T);
    __m256 v0 = kv_load(row, d0, sc, T), v1 = W > 1 ? kv_load(row, d0 + 8, sc, T) : v0;
#pragma GCC unroll 6
    for (int c = 0; c < C; c++) {
        __m256 x = _mm256_broadcast_ss(P + (size_t)c * p_stride + t);
        acc[c][0] = _mm256_fmadd_ps(x, v0, acc[c][0]);
        if (W > 1) acc[c][1] = _mm256_fmadd_ps(x, v1, acc[c][1]);
    }
}

/* O rows [0, C) (hd apart) x columns [d0, d0 + 8 W), W = 1 or 2, against
 * keys [0, nk): per key one value load per 8 columns (F16 and Q8_0 rows
 * converted in registers, kv_load) feeds C FMAs, each row's probability
 * broadcast once; with C = 6, W = 2 the 12 accumulators, two value vectors
 * and one broadcast fill 15 registers. Every output element is its own
 * chain o = fma(p_t, v_t, o) over t in order, so the bits do not depend on
 * the tiling of rows or columns, and a fused type's are those of its rows
 * converted first. The 16 columns of a W = 2 tile lie in one Q8_0 block (d0
 * is a multiple of 16), under one scale. */
INLINE void pv_kv_tile(float *O, int hd, const float *P, int p_stride, const void *vrows, int nk, int d0, int C, int W,
                       int T, const void *const *pf, int npf, int sh, shadow_run *run) {
    __m256 acc[6][2];
#pragma GCC unroll 6
    for (int c = 0; c < C; c++)
#pragma GCC unroll 2
        for (int w = 0; w < W; w++) acc[c][w] = _mm256_loadu_ps(O + (size_t)c * hd + d0 + 8 * w);
    int t = 0, n_pf = pf ? (npf < nk ? npf : nk) : 0; /* keys [0, n_pf) carry a request */
    if (T == KV_F16 && sh >= 0) { /* address order: the tiles at multiples of 32 ask, one line per key */
        if (d0 % 32 == 0)
            for (const size_t base = (size_t)(d0 / 32) * npf; t < n_pf; t++) {
                shadow_seq(pf, base + t, sh);
                pv_kv_step(acc, P, p_stride, vrows, t, d0, C, W, T);
            }
    } else
        for (; t < n_pf; t++) {
            if (T == KV_F16) shadow_f16(pf[t], d0, hd);
            else if (d0 % QK8_0 == 0) shadow_run_next(run);
            pv_kv_step(acc, P, p_stride, vrows, t, d0, C, W, T);
        }
    for (; t < nk; t++) pv_kv_step(acc, P, p_stride, vrows, t, d0, C, W, T);
#pragma GCC unroll 6
    for (int c = 0; c < C; c++)
#pragma GCC unroll 2
        for (int w = 0; w < W; w++) _mm256_storeu_ps(O + (size_t)c * hd + d0 + 8 * w, acc[c][w]);
}

INLINE void pv_kv_rows(float *O, int hd, const float *P, int p_stride, const void *vrow, int nk, int C, int T,
                       const void *const *pf, int npf) {
    int d0 = 0, sh = pf && T == KV_F16 ? shadow_seq_shift(pf, npf, hd) : -1;
    shadow_run run = shadow_run_of(pf, npf, (size_t)hd / QK8_0 * sizeof(block_q8_0)); /* Q8_0 */
    for (; d0 + 16 <= hd; d0 += 16) pv_kv_tile(O, hd, P, p_stride, vrow, nk, d0, C, 2, T, pf, npf, sh, &run);
    if (d0 < hd) pv_kv_tile(O, hd, P, p_stride, vrow, nk, d0, C, 1, T, pf, npf, sh, &run);
}

/* pf (F16, Q8_0; NULL or kernels.h's): prefetched by the first rows. */
INLINE void pv_kv(float *O, int R, int hd, const float *P, int p_stride, const void *vrow, int nk, int T,
                  const void *const *pf, int npf) {
    for (int r = 0; r < R; r += 6, pf = NULL) {
        float *o = O + (size_t)r * hd;
        const float *p = P + (size_t)r * p_stride;
        switch (R - r < 6 ? R - r : 6) {
            case 1: pv_kv_rows(o, hd, p, p_stride, vrow, nk, 1, T, pf, npf); break;
            case 2: pv_kv_rows(o, hd, p, p_stride, vrow, nk, 2, T, pf, npf); break;
            case 3: pv_kv_rows(o, hd, p, p_stride, vrow, nk, 3, T, pf, npf); break;
            case 4: pv_kv_rows(o, hd, p, p_stride, vrow, nk, 4, T, pf, npf); break;
            case 5: pv_kv_rows(o, hd, p, p_stride, vrow, nk, 5, T, pf, npf); break;
            default: pv_kv_rows(o, hd, p, p_stride, vrow, nk, 6, T, pf, npf); break;
        }
    }
}

void attn_pv_avx2(float *O, int R, int hd, const float *P, int p_stride, const float *const *vrow, int nk) {
    pv_kv(O, R, hd, P, p_stride, vrow, nk, KV_F32, NULL, 0);
}

void attn_pv_f16_avx2(float *O, int R, int hd, const float *P, int p_stride, const void *const *vrow, int nk,
                      const void *const *pf, int npf) {
    pv_kv(O, R, hd, P, p_stride, vrow, nk, KV_F16, pf, npf);
}

void attn_pv_q8_0_avx2(float *O, int R, int hd, const float *P, int p_stride, const void *const *vrow, int nk,
                       const void *const *pf, int npf) {
    pv_kv(O, R, hd, P, p_stride, vrow, nk, KV_Q8, pf, npf);
}

/* ---- Q8_0 scores by integer dot products (kernels/x86_attn_q8.h) ------------- */

/* No VNNI: |k| times q with k's sign, in pairs, then in fours. */
#define Q8Q_PREP(k) _mm256_sign_epi8(k, k)
#define Q8Q_QPREP(q) _mm256_setzero_si256()
#define Q8Q_IDOT(b, kp, k, q)                                                                                          \
    ((void)(b), _mm256_madd_epi16(_mm256_maddubs_epi16(kp, _mm256_sign_epi8(q, k)), _mm256_set1_epi16(1)))
#define Q8Q_FN attn_scores_q8_0_q8_avx2
#include "kernels/x86_attn_q8.h"

#else
typedef int avx2_attn_unused; /* not an x86 target: nothing to compile */
#endif
