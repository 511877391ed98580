/*
 * x86_zmm.h - 512-bit helpers shared by the tiles over two interleaved
 * groups (kernels/avx512_pair.c, kernels/avx512vnni_wide.c): a 512-bit
 * vector holds the first group's 32 bytes of a block column in its low
 * half and the second group's same 32 bytes in its high half, so lane r
 * and lane 8 + r are the two groups' row r (quant.h describes the groups,
 * kernels/avx2_packed.c the layouts). Include it only from a file built
 * with AVX-512 F/BW/VL, inside its x86 part.
 *
 * Q4_K (a group's super-block column, PK_BYTES): d[8] f16, dmin[8] f16,
 * the 12 scale bytes of each row as three 32-byte vectors, then qs[1024]
 * with bytes 4k..4k+3 of row r's 128 at 32k + 4r; k4x16_scales unpacks
 * the 16 rows' 6-bit scales and mins, k4x16_minsum forms the min term
 * sum_j min_j * bsum_j of a token (exact in int32), as avx2_packed.c's
 * k4x8_scales and k4x8_minsum do for one group.
 */
#ifndef LAMINA_X86_ZMM_H
#define LAMINA_X86_ZMM_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "format/quant.h"

#define ZMM_INLINE static inline __attribute__((always_inline))

#define PK_BYTES 1152
#define PK_DMIN 16
#define PK_SC 32
#define PK_QS 128
#define X8K_BYTES ((size_t)sizeof(block_q8_K))
#define X8K_QS 4
#define X8K_BSUMS (4 + QK_K)
_Static_assert(sizeof(block_q8_K) == 292, "block_q8_K layout");

/* The first group's 32 bytes at a, the second's at b. */
ZMM_INLINE __m512i ld2(const uint8_t *a, const uint8_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)a)),
                              _mm256_loadu_si256((const __m256i *)(const void *)b), 1);
}

/* The 16 rows' f16 scales: 8 at a, 8 at b. */
ZMM_INLINE __m512 scales16(const uint8_t *a, const uint8_t *b) {
    __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)a)),
                                        _mm_loadu_si128((const __m128i *)(const void *)b), 1);
    return _mm512_cvtph_ps(h);
}

/* Four activation bytes at p in every 32-bit lane. */
ZMM_INLINE __m512i bc4(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_epi32(v);
}

/* The float at p in every lane. */
ZMM_INLINE __m512 bcf(const uint8_t *p) {
    float v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_ps(v);
}

/* Lanes [0, nr) of v at y (nr <= 16). */
ZMM_INLINE void store16(float *y, int nr, __m512 v) {
    if (nr >= 16) _mm512_storeu_ps(y, v);
    else _mm512_mask_storeu_ps(y, (__mmask16)((1u << nr) - 1), v);
}

/* pshufb indices (the same in every 128-bit lane): in each 32-bit lane l,
 * byte t of the lane as an int16 in both halves (ZMM_SIDX2: a scale for
 * pmaddwd against two int16 sums) or as the low int16 with a zero high
 * int16 (ZMM_SIDX1: a scale for vpdpwssd against one int32 sum), or bytes
 * t and t + 1 as two int16 (ZMM_MIDX: a pair of mins). As avx2_packed.c's
 * SIDX / MIDX. */
#define ZMM_SIDX2(l, t) ((int)(0x80008000u | ((4u * (l) + (t)) << 16) | (4u * (l) + (t))))
#define ZMM_SIDX1(l, t) ((int)(0x80808000u | (4u * (l) + (t))))
#define ZMM_MIDX(l, t) ((int)(0x80008000u | ((4u * (l) + (t) + 1) << 16) | (4u * (l) + (t))))
#define ZMM_IDX16(F, t) _mm512_broadcast_i32x4(_mm_setr_epi32(F(0, t), F(1, t), F(2, t), F(3, t)))

/* The 16 rows' sub-block scales and mins of the Q4_K super-block columns
 * at a and b (avx2_packed.c's k4x8_scales on both groups at once): scv[j]
 * the 6-bit scale of sub-block j, in both int16 halves of each lane or,
 * with low (a constant), in its low int16 only; mv[p] the mins of
 * sub-blocks 2p and 2p + 1. */
ZMM_INLINE void k4x16_scales(const uint8_t *a, const uint8_t *b, int low, __m512i scv[8], __m512i mv[4]) {
    const __m512i s0 = ld2(a + PK_SC, b + PK_SC), s1 = ld2(a + PK_SC + 32, b + PK_SC + 32);
    const __m512i s2 = ld2(a + PK_SC + 64, b + PK_SC + 64);
    const __m512i m6 = _mm512_set1_epi8(0x3f), m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m512i sc_lo = _mm512_and_si512(s0, m6), m_lo = _mm512_and_si512(s1, m6);
    const __m512i sc_hi = _mm512_or_si512(_mm512_and_si512(s2, m4), _mm512_and_si512(_mm512_srli_epi32(s0, 2), m30));
    const __m512i m_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(s2, 4), m4),
                                         _mm512_and_si512(_mm512_srli_epi32(s1, 2), m30));
#define ZMM_SIDX(l, t) (low ? ZMM_SIDX1(l, t) : ZMM_SIDX2(l, t))
#define SC(t)                                                                                                          \
    scv[t] = _mm512_shuffle_epi8(sc_lo, ZMM_IDX16(ZMM_SIDX, t));                                                       \
    scv[t + 4] = _mm512_shuffle_epi8(sc_hi, ZMM_IDX16(ZMM_SIDX, t));
    /* clang-format off */
    SC(0) SC(1) SC(2) SC(3)
    /* clang-format on */
#undef SC
#undef ZMM_SIDX
        mv[0] = _mm512_shuffle_epi8(m_lo, ZMM_IDX16(ZMM_MIDX, 0));
    mv[1] = _mm512_shuffle_epi8(m_lo, ZMM_IDX16(ZMM_MIDX, 2));
    mv[2] = _mm512_shuffle_epi8(m_hi, ZMM_IDX16(ZMM_MIDX, 0));
    mv[3] = _mm512_shuffle_epi8(m_hi, ZMM_IDX16(ZMM_MIDX, 2));
}

/* sum_j min_j * bsum_j per row: the token's sub-block sums (each the sum
 * of two bsums of its Q8_K block at xb, |.| <= 4096) in pairs, each pair
 * broadcast against mv[p] (avx2_packed.c's k4x8_minsum). */
ZMM_INLINE __m512i k4x16_minsum(const __m512i mv[4], const uint8_t *xb) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i b32 = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(xb + X8K_BSUMS)), ones);
    __m512i b16 = _mm512_castsi256_si512(_mm256_packs_epi32(b32, b32)); /* words 0, 1, 4, 5 used */
    __m512i m = _mm512_madd_epi16(mv[0], _mm512_permutexvar_epi32(_mm512_set1_epi32(0), b16));
    m = _mm512_add_epi32(m, _mm512_madd_epi16(mv[1], _mm512_permutexvar_epi32(_mm512_set1_epi32(1), b16)));
    m = _mm512_add_epi32(m, _mm512_madd_epi16(mv[2], _mm512_permutexvar_epi32(_mm512_set1_epi32(4), b16)));
    return _mm512_add_epi32(m, _mm512_madd_epi16(mv[3], _mm512_permutexvar_epi32(_mm512_set1_epi32(5), b16)));
}

#endif
