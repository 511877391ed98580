/*
 * x86_hsum.h - the horizontal sums that end the attention score tiles
 * (kernels/avx2_attn.c, avx512_attn.c, x86_attn_q8.h, avx512vnni_attn.c),
 * written once so every variant reduces its 8-lane chains in the same
 * order: a total is ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), and
 * a lane of the result depends on its own accumulator only; and hsum1, the
 * attention exp sums' total. Include it only from a file built with AVX2
 * (hsum1, hsum4) or AVX-512 F (hsum_quad, hsum_tile too).
 */
#ifndef LAMINA_X86_HSUM_H
#define LAMINA_X86_HSUM_H

#include <immintrin.h>

#define HSUM_INLINE static inline __attribute__((always_inline))

/* The total of one 8-lane accumulator: lanes j and j + 4 first, then
 * pairs of those, then the last two (the exp sums' order). */
HSUM_INLINE float hsum1(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Four 8-lane accumulators to their four totals. */
HSUM_INLINE __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 ab = _mm256_hadd_ps(a, b); /* a01 a23 b01 b23 | a45 a67 b45 b67 */
    __m256 cd = _mm256_hadd_ps(c, d);
    __m256 abcd = _mm256_hadd_ps(ab, cd); /* a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7 */
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

#if defined(__AVX512F__)
/* Four accumulators of two keys each (key 2p in the low half of acc p, key
 * 2p + 1 in the high half) to their eight totals in key order, each in
 * hsum4's order by a transposing tree: within every 128-bit lane, pairs
 * l0 + l1, l2 + l3 (across two registers at once), then their sum, then
 * the two lanes of one key's 8 added. 13 operations for 8 totals, where
 * two hsum4 calls take about twice as many. */
HSUM_INLINE void hsum_quad(__m512 a, __m512 b, __m512 c, __m512 d, float *s) {
    __m512 ab = _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xdd)); /* a01 a23 b01 b23 */
    __m512 cd = _mm512_add_ps(_mm512_shuffle_ps(c, d, 0x88), _mm512_shuffle_ps(c, d, 0xdd));
    __m512 q =
        _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x88), _mm512_shuffle_ps(ab, cd, 0xdd)); /* a0-3 b0-3 c0-3 d0-3 */
    /* 128-bit lanes of q: elements 0-3 of keys 0 2 4 6, their 4-7, then the same of keys 1 3 5 7 */
    __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(q, q, 0x88), _mm512_shuffle_f32x4(q, q, 0xdd));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_ps(s, _mm256_permutevar8x32_ps(_mm512_castps512_ps256(t), order));
}

/* The score tiles' C rows x NP (2 or 4) accumulators of two keys each
 * (kernels/avx512_attn.c, avx512vnni_attn.c) to s[c][0 .. 2 NP): four
 * accumulators per hsum_quad, two rows at a time when NP = 2 (a last odd
 * row paired with itself). */
HSUM_INLINE void hsum_tile(__m512 acc[8][4], int C, int NP, float s[8][8]) {
    if (NP == 4) {
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) hsum_quad(acc[c][0], acc[c][1], acc[c][2], acc[c][3], s[c]);
        return;
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c += 2) {
        float t[8];
        int c1 = c + 1 < C ? c + 1 : c;
        hsum_quad(acc[c][0], acc[c][1], acc[c1][0], acc[c1][1], t);
        for (int j = 0; j < 4; j++) s[c][j] = t[j], s[c1][j] = t[4 + j];
    }
}
#endif

#endif
