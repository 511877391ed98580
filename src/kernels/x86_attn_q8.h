/*
 * x86_attn_q8.h - Q8_0 scores by integer dot products on 256-bit vectors
 * (kernels.h: scores_q8_0_q8), for the sources that include it: avx2_attn.c
 * (no VNNI) and avxvnni_attn.c (AVX-VNNI). Static inline code; the includer
 * defines, before including it,
 *
 *   Q8Q_PREP(k)          a key block's 32 bytes as the integer dot takes them
 *   Q8Q_QPREP(q)         a query block's bias: the int32 lanes the dot starts from
 *   Q8Q_IDOT(b, kp, k, q)  the 8 int32 lanes i_j = Σ q_e k_e over elements
 *                        4j .. 4j+3 of the block, exactly, from b = Q8Q_QPREP(q),
 *                        kp = Q8Q_PREP(k)
 *
 * and Q8Q_FN, the name of the entry to define. Without VNNI: kp = |k|,
 * the products by vpsignb (q takes k's sign), vpmaddubsw (|k| x ±q in pairs,
 * at most 2 x 127 x 127: no saturation) and vpmaddwd by ones; b is zero.
 * With VNNI: kp = k + 128 as unsigned bytes (an xor), vpdpbusd gives
 * Σ (k + 128) q, and b = -128 Σ q per lane, computed once per query block
 * and tile, cancels the offset exactly.
 *
 * The float part is the reference's (kernels.h): a tile of C rows x 4 keys
 * holds one 8-lane float accumulator per (row, key), lane j gaining
 * fma(dq * dk, (float)i_j, .) block after block, and kernels/x86_hsum.h's
 * hsum4 reduces four of them in the reference's pairwise order. A lane of
 * hsum4 depends on its own accumulator only, so the last group of keys is
 * padded with its last key and the extra scores dropped.
 *
 * What does not change from tile to tile stays off the inner loop: each
 * pair of rows stages its query blocks' biases and float scales once
 * (q8q_stage) for every tile to load, and a key's scale widens by
 * vpbroadcastw and vcvtph2ps. Staging holds Q8Q_NB_MAX blocks a row (head
 * dim 2048); past that the entry hands the call to the scalar reference.
 */
#ifndef LAMINA_X86_ATTN_Q8_H
#define LAMINA_X86_ATTN_Q8_H

#include <immintrin.h>
#include <stddef.h>

#include "format/quant.h"
#include "kernels/x86_hsum.h"
#include "kernels/x86_shadow.h"

#define Q8Q_INLINE static inline __attribute__((always_inline))

#include "kernels/scalar.h" /* past Q8Q_NB_MAX blocks */

#define Q8Q_NB_MAX 64
typedef struct {
    __m256i bias[2][Q8Q_NB_MAX]; /* (rows, blocks) Q8Q_QPREP of each query block */
    float d[2][Q8Q_NB_MAX];      /* (rows, blocks) its scale */
} q8q_staged;

Q8Q_INLINE void q8q_stage(const block_q8_0 *Qq, int C, int nb, q8q_staged *qs) {
    for (int c = 0; c < C; c++)
        for (int b = 0; b < nb; b++) {
            const block_q8_0 *qb = Qq + (size_t)c * nb + b;
            qs->bias[c][b] = Q8Q_QPREP(_mm256_loadu_si256((const __m256i *)qb->qs));
            qs->d[c][b] = _cvtsh_ss(qb->d);
        }
}

/* Rows [0, C) of Qq (nb blocks apart, staged in qs) against keys
 * k[0 .. 4): s[c][0 .. 4); pf: NULL, or the 4 rows to prefetch beside
 * them. */
Q8Q_INLINE void q8q_tile(const block_q8_0 *Qq, const q8q_staged *qs, int nb, const void *const *k, int C, float s[4][4],
                         const void *const *pf) {
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++)
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) acc[c][t] = _mm256_setzero_ps();
    shadow_run run = shadow_run_of(pf, 4, (size_t)nb * sizeof(block_q8_0));
    for (int b = 0; b < nb; b++) {
        if (pf)
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++) shadow_run_next(&run);
        __m256i kv[4], kp[4];
        __m256 dk[4];
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) {
            const block_q8_0 *kb = (const block_q8_0 *)k[t] + b;
            kv[t] = _mm256_loadu_si256((const __m256i *)kb->qs);
            kp[t] = Q8Q_PREP(kv[t]);
            dk[t] = _mm256_cvtph_ps(_mm_set1_epi16((short)kb->d));
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)Qq[(size_t)c * nb + b].qs), bias = qs->bias[c][b];
            __m256 dq = _mm256_broadcast_ss(&qs->d[c][b]);
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++) {
                __m256 f = _mm256_cvtepi32_ps(Q8Q_IDOT(bias, kp[t], kv[t], q));
                acc[c][t] = _mm256_fmadd_ps(_mm256_mul_ps(dq, dk[t]), f, acc[c][t]); /* dq dk exact */
            }
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) _mm_storeu_ps(s[c], hsum4(acc[c][0], acc[c][1], acc[c][2], acc[c][3]));
}

/* Rows [0, C) against every key, four at a time, prefetching pf's rows
 * t < npf (pf: NULL or kernels.h's). */
Q8Q_INLINE void q8q_rows(const block_q8_0 *Qq, int nb, const void *const *krow, int nk, float *S, int s_stride, int C,
                         const void *const *pf, int npf) {
    q8q_staged qs;
    q8q_stage(Qq, C, nb, &qs);
    for (int t = 0; t < nk; t += 4) {
        int n = nk - t < 4 ? nk - t : 4;
        const void *k[4], *p[4];
        for (int j = 0; j < 4; j++) k[j] = krow[t + (j < n ? j : n - 1)];
        float s[4][4];
        if (pf && t < npf) {
            for (int j = 0; j < 4; j++) p[j] = pf[t + j < npf ? t + j : npf - 1];
            q8q_tile(Qq, &qs, nb, k, C, s, p);
        } else q8q_tile(Qq, &qs, nb, k, C, s, NULL);
        for (int c = 0; c < C; c++)
            for (int j = 0; j < n; j++) S[(size_t)c * s_stride + t + j] = s[c][j];
    }
}

void Q8Q_FN(const void *Qq, int R, int hd, const void *const *krow, int nk, float *S, int s_stride,
            const void *const *pf, int npf) {
    const block_q8_0 *q = Qq;
    int nb = hd / QK8_0, r = 0;
    if (nb > Q8Q_NB_MAX) {
        scalar_attn_scores_q8_0_q8(Qq, R, hd, krow, nk, S, s_stride, pf, npf);
        return;
    }
    for (; r + 2 <= R; r += 2, pf = NULL)
        q8q_rows(q + (size_t)r * nb, nb, krow, nk, S + (size_t)r * s_stride, s_stride, 2, pf, npf);
    if (r < R) q8q_rows(q + (size_t)r * nb, nb, krow, nk, S + (size_t)r * s_stride, s_stride, 1, pf, npf);
}

#endif
