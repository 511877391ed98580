/*
 * avx512_attn.c - the fused attention entries (kernels.h: scores_f16,
 * pv_f16, pv_q8_0) in AVX-512 F/BW/VL, which the avx512 variants lay over
 * AVX2's (kernels/avx2_attn.c): decode reads F16 keys and F16 and Q8_0
 * values in place, converting in registers (Q8_0 keys take the integer
 * scores of kernels/avx512vnni_attn.c and kernels/x86_attn_q8.h).
 *
 * Same bits as AVX2. Within a variant the fused entries must give the bits
 * of to_float followed by the float entries (attention picks between them
 * by the sub-tile's row count; kernels.h), and the avx512 variants' float
 * entries are AVX2's 8-lane ones. So:
 *   - scores keep AVX2's 8-lane chains: a zmm holds two keys, key a's 8
 *     lanes in the low half and key b's in the high half, against the
 *     query's 8 floats broadcast to both halves; each lane is the chain
 *     acc = fma(q[d..d+8), k[d..d+8), acc) over d in order that
 *     attn_scores_avx2 runs, and the halves are reduced in hsum4's order
 *     (hsum_tile, kernels/x86_hsum.h: four registers, eight keys at once).
 *     A tile is 4 rows x 4 pairs (8 keys), or 8 rows x 2 pairs (4 keys)
 *     while 8 rows remain (TinyLlama's group: each key converted once for
 *     all 8): 16 accumulators, the key vectors and one query vector of
 *     the 32 registers.
 *   - P·V: an output element is its own chain o = fma(p_t, v_t, o) over the
 *     keys in order whatever the lane width, so 16 lanes give attn_pv_avx2's
 *     bits; a tile is 4 rows x 64 columns or 8 rows x 32 columns (16
 *     accumulators), the last 8 columns of a head dim that is 8 mod 16
 *     through a mask. At head dim 64, 8 rows (TinyLlama), the 8-row tiles
 *     took the fused decode from slower than converting first (Q8_0, 4-row
 *     tiles) to 1.25x faster (bench_attn -H 32 -K 4 -D 64, one thread).
 * Conversions: F16 by vcvtph2ps (exact); Q8_0 as d * q in float (exact:
 * an 11-bit by 8-bit product), vpmovsxbd then vcvtdq2ps then a multiply by
 * the block's scale, the bits of the type's to_float; the scale widened
 * once a block and key (vpbroadcastw, vcvtph2ps), where widening it for
 * each 16 columns took a quarter of Q8_0's P·V (Gemma 3 270M's shape on
 * the Xeon, 64 keys in L2, one thread: 19.2 ns a key against 26.5).
 *
 * Compiled with the avx512 flags (Makefile: avx512_*.c); the sanitizer
 * builds (LAMINA_X86_BASE_ONLY) and other architectures hold only a fill
 * that returns false.
 */
#include "kernels/avx2_attn.h"

#include "kernels/x86.h"

#if (defined(__x86_64__) || defined(__i386__)) && X86_VARIANTS

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__F16C__)
#error "avx512_attn.c must be compiled with the avx512 flags (-mavx512f -mavx512bw -mavx512vl -mf16c)"
#endif

#include <immintrin.h>
#include <stdint.h>

#include "format/quant.h"
#include "kernels/avx2_math.h"  /* exp16 */
#include "kernels/x86_hsum.h"   /* attn_scores_avx2's reductions, operation for operation */
#include "kernels/x86_shadow.h" /* the pf rows */

#define INLINE static inline __attribute__((always_inline))

enum { KV_F16, KV_Q8 };

/* ---- scores (F16 keys) ----------------------------------------------------------- */

/* Elements d .. d+7 of F16 rows a (low half) and b (high half). */
INLINE __m512 kv_pair(const void *a, const void *b, int d) {
    __m128i ha = _mm_loadu_si128((const __m128i *)((const uint16_t *)a + d));
    __m128i hb = _mm_loadu_si128((const __m128i *)((const uint16_t *)b + d));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(ha), hb, 1));
}

/* Rows [0, C) of Q (hd apart) against the 2 NP keys k[0 .. 2 NP):
 * s[c][0 .. 2 NP); C x NP <= 16 accumulators. pf: NULL, or the 2 NP rows
 * to prefetch beside them. */
INLINE void scores_tile(const float *Q, int hd, const void *const *k, int C, int NP, float s[8][8],
                        const void *const *pf, int sh) {
    __m512 acc[8][4];
#pragma GCC unroll 8
    for (int c = 0; c < C; c++)
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) acc[c][p] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d += 8) {
        __m512 y[4];
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) y[p] = kv_pair(k[2 * p], k[2 * p + 1], d);
        if (pf && sh >= 0) {
            if (d % 32 == 0)
#pragma GCC unroll 8
                for (int j = 0; j < 2 * NP; j++) shadow_seq(pf, (size_t)(d / 32 * 2 * NP + j), sh);
        } else if (pf)
#pragma GCC unroll 8
            for (int j = 0; j < 2 * NP; j++) shadow_f16(pf[j], d, hd);
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            __m512 x =
                _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(Q + (size_t)c * hd + d))));
#pragma GCC unroll 4
            for (int p = 0; p < NP; p++) acc[c][p] = _mm512_fmadd_ps(x, y[p], acc[c][p]);
        }
    }
    hsum_tile(acc, C, NP, s);
}

/* Rows [0, C) against every key, 2 NP at a time (the last group padded
 * with its last key, whose extra scores are dropped), prefetching pf's
 * rows t < npf (pf: NULL or kernels.h's). */
INLINE void scores_rows(const float *Q, int hd, const void *const *krow, int nk, float *S, int s_stride, int C, int NP,
                        const void *const *pf, int npf) {
    const int sh = pf ? shadow_seq_shift(pf, npf, hd) : -1; /* once for the call's rows */
    for (int t = 0; t < nk; t += 2 * NP) {
        int n = nk - t < 2 * NP ? nk - t : 2 * NP;
        const void *k[8], *p[8];
        for (int j = 0; j < 2 * NP; j++) k[j] = krow[t + (j < n ? j : n - 1)];
        float s[8][8];
        if (pf && t < npf) {
            for (int j = 0; j < 2 * NP; j++) p[j] = pf[t + j < npf ? t + j : npf - 1];
            scores_tile(Q, hd, k, C, NP, s, p, sh);
        } else scores_tile(Q, hd, k, C, NP, s, NULL, -1);
        for (int c = 0; c < C; c++)
            for (int j = 0; j < n; j++) S[(size_t)c * s_stride + t + j] = s[c][j];
    }
}

/* Rows 8 at a time (8 x 2 pairs: each key converted once for 8 rows),
 * the rest up to 4 at a time (x 4 pairs); the first group of rows
 * prefetches pf. */
static void scores_f16(const float *Q, int R, int hd, const void *const *krow, int nk, float *S, int s_stride,
                       const void *const *pf, int npf) {
    int r = 0;
    for (; r + 8 <= R; r += 8, pf = NULL)
        scores_rows(Q + (size_t)r * hd, hd, krow, nk, S + (size_t)r * s_stride, s_stride, 8, 2, pf, npf);
    for (; r < R; r += 4, pf = NULL) {
        const float *q = Q + (size_t)r * hd;
        float *s = S + (size_t)r * s_stride;
        switch (R - r < 4 ? R - r : 4) {
            case 1: scores_rows(q, hd, krow, nk, s, s_stride, 1, 4, pf, npf); break;
            case 2: scores_rows(q, hd, krow, nk, s, s_stride, 2, 4, pf, npf); break;
            case 3: scores_rows(q, hd, krow, nk, s, s_stride, 3, 4, pf, npf); break;
            default: scores_rows(q, hd, krow, nk, s, s_stride, 4, 4, pf, npf); break;
        }
    }
}

/* ---- P·V ------------------------------------------------------------------------ */

/* Elements d .. d+15 of an F16 value row (lanes outside m zero: the last
 * 8 columns only). */
INLINE __m512 f16_load16(const void *row, int d, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + d));
}

/* Elements d .. d+15 of a Q8_0 value row (whole blocks), sc its block's
 * scale in every lane. */
INLINE __m512 q8_load16(const void *row, int d, __m512 sc) {
    const block_q8_0 *b = (const block_q8_0 *)row + d / QK8_0;
    return _mm512_mul_ps(
        sc, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + d % QK8_0)))));
}

/* A Q8_0 row's block scale at element d, in every lane. */
INLINE __m512 q8_scale(const void *row, int d) {
    return _mm512_cvtph_ps(_mm256_set1_epi16((short)((const block_q8_0 *)row)[d / QK8_0].d));
}

/* O rows [0, C) x columns d0 .. d0 + 16 W (the last vector masked by
 * mlast) against keys [0, nk), prefetching the same columns of pf's rows
 * t < npf (pf: NULL or kernels.h's). */
INLINE void pv_tile(float *O, int hd, const float *P, int p_stride, const void *const *vrow, int nk, int d0, int C,
                    int W, __mmask16 mlast, int T, const void *const *pf, int npf, int sh, shadow_run *run) {
    __m512 acc[8][4];
#pragma GCC unroll 8
    for (int c = 0; c < C; c++)
#pragma GCC unroll 4
        for (int w = 0; w < W; w++)
            acc[c][w] = _mm512_maskz_loadu_ps(w == W - 1 ? mlast : 0xffff, O + (size_t)c * hd + d0 + 16 * w);
    for (int t = 0; t < nk; t++) {
        __m512 v[4];
        __m512 sc = _mm512_setzero_ps(); /* Q8_0: the scale of the block at d0 + 16 w, widened once a block */
#pragma GCC unroll 4
        for (int w = 0; w < W; w++) {
            int d = d0 + 16 * w;
            if (T == KV_F16) v[w] = f16_load16(vrow[t], d, w == W - 1 ? mlast : 0xffff);
            else {
                if (w == 0 || d % QK8_0 == 0) sc = q8_scale(vrow[t], d);
                v[w] = q8_load16(vrow[t], d, sc);
            }
        }
        if (pf && t < npf)
#pragma GCC unroll 4
            for (int w = 0; w < W; w++) {
                if (T == KV_F16 && sh >= 0) {
                    if ((d0 + 16 * w) % 32 == 0) shadow_seq(pf, (size_t)((d0 + 16 * w) / 32 * npf + t), sh);
                } else if (T == KV_F16) shadow_f16(pf[t], d0 + 16 * w, hd);
                else if ((d0 + 16 * w) % QK8_0 == 0) shadow_run_next(run);
            }
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            __m512 x = _mm512_set1_ps(P[(size_t)c * p_stride + t]);
#pragma GCC unroll 4
            for (int w = 0; w < W; w++) acc[c][w] = _mm512_fmadd_ps(x, v[w], acc[c][w]);
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; c++)
#pragma GCC unroll 4
        for (int w = 0; w < W; w++)
            _mm512_mask_storeu_ps(O + (size_t)c * hd + d0 + 16 * w, w == W - 1 ? mlast : 0xffff, acc[c][w]);
}

/* Rows [0, C) of O, every column: 16 WM at a time (WM = 4, or 2 with 8
 * rows), then the rest in vectors of 16 and a masked 8. */
INLINE void pv_rows(float *O, int hd, const float *P, int p_stride, const void *const *vrow, int nk, int C, int WM,
                    int T, const void *const *pf, int npf) {
    int d0 = 0, sh = pf && T == KV_F16 ? shadow_seq_shift(pf, npf, hd) : -1;
    shadow_run run = shadow_run_of(pf, npf, (size_t)hd / QK8_0 * sizeof(block_q8_0)); /* Q8_0 */
    for (; d0 + 16 * WM <= hd; d0 += 16 * WM)
        if (pf) pv_tile(O, hd, P, p_stride, vrow, nk, d0, C, WM, 0xffff, T, pf, npf, sh, &run);
        else pv_tile(O, hd, P, p_stride, vrow, nk, d0, C, WM, 0xffff, T, NULL, 0, -1, &run);
    for (; d0 < hd; d0 += 16) /* a multiple of 8 remains */
        pv_tile(O, hd, P, p_stride, vrow, nk, d0, C, 1, hd - d0 < 16 ? 0x00ff : 0xffff, T, pf, npf, sh, &run);
}

/* Rows 8 at a time (8 rows x 32 columns: each value vector converted once
 * for 8 rows), the rest up to 4 at a time (x 64 columns); the first group
 * of rows prefetches pf. */
INLINE void pv_kv(float *O, int R, int hd, const float *P, int p_stride, const void *const *vrow, int nk, int T,
                  const void *const *pf, int npf) {
    int r = 0;
    for (; r + 8 <= R; r += 8, pf = NULL)
        pv_rows(O + (size_t)r * hd, hd, P + (size_t)r * p_stride, p_stride, vrow, nk, 8, 2, T, pf, npf);
    for (; r < R; r += 4, pf = NULL) {
        float *o = O + (size_t)r * hd;
        const float *p = P + (size_t)r * p_stride;
        switch (R - r < 4 ? R - r : 4) {
            case 1: pv_rows(o, hd, p, p_stride, vrow, nk, 1, 4, T, pf, npf); break;
            case 2: pv_rows(o, hd, p, p_stride, vrow, nk, 2, 4, T, pf, npf); break;
            case 3: pv_rows(o, hd, p, p_stride, vrow, nk, 3, 4, T, pf, npf); break;
            default: pv_rows(o, hd, p, p_stride, vrow, nk, 4, 4, T, pf, npf); break;
        }
    }
}

static void pv_f16(float *O, int R, int hd, const float *P, int p_stride, const void *const *vrow, int nk,
                   const void *const *pf, int npf) {
    pv_kv(O, R, hd, P, p_stride, vrow, nk, KV_F16, pf, npf);
}

static void pv_q8_0(float *O, int R, int hd, const float *P, int p_stride, const void *const *vrow, int nk,
                    const void *const *pf, int npf) {
    pv_kv(O, R, hd, P, p_stride, vrow, nk, KV_Q8, pf, npf);
}

/* ---- the softmax's row loops ---------------------------------------------------- */

/* attn_exp_sum_avx2's bits: exp16 is exp8 lane for lane, and the sum keeps
 * its one 8-lane chain (each 16 elements' low half added before their high
 * half), then hsum1, then a tail of fewer than 8 one element at a time. */
static float exp_sum(float *x, int n, float m) {
    const __m512 vm = _mm512_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    int t = 0;
    for (; t + 16 <= n; t += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + t), vm));
        _mm512_storeu_ps(x + t, e);
        acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
        acc = _mm256_add_ps(acc, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
    }
    int r = n - t; /* < 16 left: the next 8 (if whole) join the chain, the rest are the tail */
    float s;
    if (r > 0) {
        __mmask16 mr = (__mmask16)((1u << r) - 1);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mr, x + t), vm));
        _mm512_mask_storeu_ps(x + t, mr, e);
        if (r >= 8) acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
        s = hsum1(acc);
        float buf[16];
        _mm512_storeu_ps(buf, e);
        for (int i = r >= 8 ? 8 : 0; i < r; i++) s += buf[i];
    } else {
        s = hsum1(acc);
    }
    return s;
}

bool avx512_attn_fill(lm_attn_kernels *k) {
    k->exp_sum = exp_sum;
    k->scores_f16 = scores_f16;
    k->pv_f16 = pv_f16;
    k->pv_q8_0 = pv_q8_0;
    return true;
}

#else

bool avx512_attn_fill(lm_attn_kernels *k) { return false; }

#endif
