/*
 * avx512vnni_attn.c - the VNNI variants' (avx512vnni, avx512bf16) Q8_0
 * scores by integer dot products (kernels.h: scores_q8_0_q8) on 512-bit
 * vectors, which kernels/dispatch.c lays over the avx512 entries.
 *
 * A zmm holds one block of two keys, key a's 32 bytes in the low half and
 * key b's in the high half, against the query's block broadcast to both
 * halves. vpdpbusd multiplies unsigned by signed bytes, so the keys go in
 * offset by 128 (k ^ 0x80 read as unsigned) and each lane starts from -128
 * times the sum of its four query bytes, which cancels the offset exactly:
 * lane j of each half is the block's exact integer sum over elements
 * 4j .. 4j+3. The float part is the reference's (kernels.h): one
 * accumulator per (row, key pair), each lane gaining fma(dq * dk, (float)i,
 * .) block after block with the half's own key scale, the halves then
 * reduced by kernels/x86_hsum.h (the reference's pairwise order), so
 * every score has the scalar reference's bits. A tile is 4 rows x 4 pairs
 * (8 keys), or 8 rows x 2 pairs while 8 rows remain (TinyLlama's group):
 * 16 accumulators; the last keys are padded with the last one and the
 * extra scores dropped.
 *
 * Bound by arithmetic (a block of a key pair costs four vector operations
 * per row: vpdpbusd, vcvtdq2ps, the scale product, the fma), so the rest
 * is kept off the inner loop: each group of rows stages its query blocks'
 * biases and float scales once (stage) for all its tiles to load, and a
 * pair's two key scales widen in one vcvtph2ps of two broadcast halves.
 * On the Xeon, Gemma 3 270M's shape (4 rows, head dim 256, 64 keys in
 * L2, one thread) took 15.4 ns a key against 20.6 with both done per tile.
 *
 * Compiled with the avx512 flags and -mavx512vnni (Makefile:
 * avx512vnni_*.c); the sanitizer builds (LAMINA_X86_BASE_ONLY) and other
 * architectures hold only a fill that returns false.
 */
#include "kernels/avx2_attn.h"

#include "kernels/x86.h"

#if (defined(__x86_64__) || defined(__i386__)) && X86_VARIANTS

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__AVX512VNNI__) ||           \
    !defined(__F16C__)
#error "avx512vnni_attn.c must be compiled with the avx512 flags and -mavx512vnni"
#endif

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "format/quant.h"
#include "kernels/scalar.h" /* past QNB_MAX blocks */
#include "kernels/x86_hsum.h"
#include "kernels/x86_shadow.h"

#define INLINE static inline __attribute__((always_inline))

/* What a tile needs of the query rows, staged once per group of rows:
 * each block's bias (the int32 lanes vpdpbusd starts from, -128 times the
 * sum of the lane's four query bytes) and its scale in float. */
#define QNB_MAX 64 /* blocks per row staged (head dim 2048); past it, the scalar reference */
typedef struct {
    int32_t bias[8][QNB_MAX][8]; /* (rows, blocks, lanes) */
    float d[8][QNB_MAX];         /* (rows, blocks) */
} qstage;

static void stage(const block_q8_0 *Qq, int C, int nb, qstage *qs) {
    const __m256i off = _mm256_set1_epi8((char)0x80);
    for (int c = 0; c < C; c++)
        for (int b = 0; b < nb; b++) {
            const block_q8_0 *qb = Qq + (size_t)c * nb + b;
            __m256i q = _mm256_loadu_si256((const __m256i *)qb->qs);
            __m256i bias =
                _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), off, q));
            _mm256_storeu_si256((__m256i *)qs->bias[c][b], bias);
            qs->d[c][b] = _cvtsh_ss(qb->d);
        }
}

/* Rows [0, C) of Qq (nb blocks apart, staged in qs) against the 2 NP keys
 * k[0 .. 2 NP): s[c][0 .. 2 NP); C x NP <= 16 accumulators. pf: NULL, or
 * the 2 NP rows to prefetch beside them. */
INLINE void tile(const block_q8_0 *Qq, const qstage *qs, int nb, const void *const *k, int C, int NP, float s[8][8],
                 const void *const *pf) {
    __m512 acc[8][4];
#pragma GCC unroll 8
    for (int c = 0; c < C; c++)
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) acc[c][p] = _mm512_setzero_ps();
    const __m512i off = _mm512_set1_epi8((char)0x80);
    shadow_run run = shadow_run_of(pf, 2 * NP, (size_t)nb * sizeof(block_q8_0));
    for (int b = 0; b < nb; b++) {
        if (pf)
#pragma GCC unroll 8
            for (int j = 0; j < 2 * NP; j++) shadow_run_next(&run);
        __m512i kp[4];
        __m512 dk[4]; /* the pair's key scales, each in its half */
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            const block_q8_0 *ka = (const block_q8_0 *)k[2 * p] + b, *kb = (const block_q8_0 *)k[2 * p + 1] + b;
            __m256i lo = _mm256_loadu_si256((const __m256i *)ka->qs), hi = _mm256_loadu_si256((const __m256i *)kb->qs);
            kp[p] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), off);
            dk[p] = _mm512_cvtph_ps(_mm256_mask_set1_epi16(_mm256_set1_epi16((short)ka->d), 0xff00, (short)kb->d));
        }
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)Qq[(size_t)c * nb + b].qs));
            __m512i bias = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qs->bias[c][b]));
            __m512 dq = _mm512_set1_ps(qs->d[c][b]);
#pragma GCC unroll 4
            for (int p = 0; p < NP; p++) {
                __m512 d = _mm512_mul_ps(dq, dk[p]); /* exact: two F16 scales */
                __m512 f = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(bias, kp[p], q));
                acc[c][p] = _mm512_fmadd_ps(d, f, acc[c][p]);
            }
        }
    }
    hsum_tile(acc, C, NP, s);
}

/* Rows [0, C) against every key, 2 NP at a time, prefetching pf's rows
 * t < npf (pf: NULL or kernels.h's). */
INLINE void rows(const block_q8_0 *Qq, int nb, const void *const *krow, int nk, float *S, int s_stride, int C, int NP,
                 const void *const *pf, int npf) {
    qstage qs;
    stage(Qq, C, nb, &qs);
    for (int t = 0; t < nk; t += 2 * NP) {
        int n = nk - t < 2 * NP ? nk - t : 2 * NP;
        const void *k[8], *p[8];
        for (int j = 0; j < 2 * NP; j++) k[j] = krow[t + (j < n ? j : n - 1)];
        float s[8][8];
        if (pf && t < npf) {
            for (int j = 0; j < 2 * NP; j++) p[j] = pf[t + j < npf ? t + j : npf - 1];
            tile(Qq, &qs, nb, k, C, NP, s, p);
        } else tile(Qq, &qs, nb, k, C, NP, s, NULL);
        for (int c = 0; c < C; c++)
            for (int j = 0; j < n; j++) S[(size_t)c * s_stride + t + j] = s[c][j];
    }
}

static void scores_q8_0_q8(const void *Qq, int R, int hd, const void *const *krow, int nk, float *S, int s_stride,
                           const void *const *pf, int npf) {
    const block_q8_0 *Q = Qq;
    int nb = hd / QK8_0, r = 0;
    if (nb > QNB_MAX) {
        scalar_attn_scores_q8_0_q8(Qq, R, hd, krow, nk, S, s_stride, pf, npf);
        return;
    }
    for (; r + 8 <= R; r += 8, pf = NULL)
        rows(Q + (size_t)r * nb, nb, krow, nk, S + (size_t)r * s_stride, s_stride, 8, 2, pf, npf);
    for (; r < R; r += 4, pf = NULL) {
        const block_q8_0 *q = Q + (size_t)r * nb;
        float *s = S + (size_t)r * s_stride;
        switch (R - r < 4 ? R - r : 4) {
            case 1: rows(q, nb, krow, nk, s, s_stride, 1, 4, pf, npf); break;
            case 2: rows(q, nb, krow, nk, s, s_stride, 2, 4, pf, npf); break;
            case 3: rows(q, nb, krow, nk, s, s_stride, 3, 4, pf, npf); break;
            default: rows(q, nb, krow, nk, s, s_stride, 4, 4, pf, npf); break;
        }
    }
}

bool avx512vnni_attn_fill(lm_attn_kernels *k) {
    k->scores_q8_0_q8 = scores_q8_0_q8;
    return true;
}

#else

bool avx512vnni_attn_fill(lm_attn_kernels *k) { return false; }

#endif
