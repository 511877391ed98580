/*
 * x86_hsum.h - the horizontal sums that end the attention score tiles
 * (kernels/avx2_attn.c, avx512_attn.c, x86_attn_q8.h, avx512vnni_attn.c),
 * written once so every variant reduces its 8-lane chains in the same
 * order: a total is ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), and
 * a lane of the result depends on its own accumulator only; and hsum1, the
 * attention exp sums' total. Include it only from a file built with AVX2
 * (hsum1, hsum4) or AVX-512 F (hsum_pairs too).
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
/* NP (2 or 4) accumulators of two keys each (key 2p in the low half of
 * acc[p], key 2p + 1 in the high half) to the 2 NP totals s[0 .. 2 NP). */
HSUM_INLINE void hsum_pairs(const __m512 *acc, int NP, float *s) {
    __m256 h[8];
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++) {
        h[2 * p] = _mm512_castps512_ps256(acc[p]);
        h[2 * p + 1] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[p]), 1));
    }
    _mm_storeu_ps(s, hsum4(h[0], h[1], h[2], h[3]));
    if (NP > 2) _mm_storeu_ps(s + 4, hsum4(h[4], h[5], h[6], h[7]));
}
#endif

#endif
