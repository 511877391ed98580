/*
 * avx2_packed.c - AVX2 + FMA + F16C matrix tiles for Q8_0 and Q4_0 weights
 * in the interleaved layout of quant.h (groups of 8 rows, 4-byte chunks of
 * the 8 rows side by side), against block_q8_0s activations. Compiled with
 * -mavx2 -mfma -mf16c; nothing here runs unless cpu_has_avx2() said yes.
 *
 * Lane r of every vector belongs to weight row r of the group. For one block
 * column and one token:
 *  - the integer dot of each row's 32 quants with the token's 32 quants is
 *    formed exactly: eight 32-byte weight vectors (four quants of each row
 *    per vector) against the token's matching 4 quants broadcast to every
 *    lane, pmaddubsw (unsigned weight side x signed activation), then summed
 *    into one int32 per lane;
 *  - then acc = fma(float(isum), dw * dx, acc), where dw holds the 8 rows'
 *    scales and dx is the token's scale: one rounding for the scale
 *    product, one for the fused multiply-add.
 * Each (row, token) has its own accumulator lane, starts from zero and takes
 * the blocks in order 0, 1, 2, ...; the result is the lane itself. Tiles of
 * 1..8 tokens and any row count therefore give the same bits for a given
 * (row, token), which is what makes outputs independent of the batch.
 *
 * Integer bounds: Q4_0 keeps q in 0..15 (unsigned) and subtracts 8 * sum(x)
 * (block_q8_0s.s8) at the end: a pmaddubsw pair is at most 2*15*127 = 3810,
 * so the eight vectors' pairs add in int16 (<= 30480) before one pmaddwd.
 * Q8_0 uses |w| as the unsigned operand and moves w's sign onto x (x must
 * lie in [-127, 127], as Q8_0 quantizers give): pairs <= 2*128*127 = 32512,
 * which leaves no room to add two in int16, so each vector is widened with
 * pmaddwd first. A block's sum is below 2^20: exact in float.
 *
 * Tile width: 8 tokens (LM_PACK_TILE). The unpacked weights of a block
 * column are reused across the tile; with 8 accumulators some of them live
 * in memory between blocks, which still measured about 10% faster on
 * Zen 3 than 4 tokens with everything in registers. One token (decode) is
 * the same code with C = 1, streaming the group's bytes with prefetches.
 */
#include "kernels/kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "avx2_packed.c must be compiled with -mavx2 -mfma -mf16c"
#endif

#include <assert.h>
#include <immintrin.h>
#include <string.h>

#include "util.h"

#define INLINE static inline __attribute__((always_inline))
#define REP8(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)
/* one specialisation per tile width 1..LM_PACK_TILE */
#define TILES(T) T(1) T(2) T(3) T(4) T(5) T(6) T(7) T(8)
_Static_assert(LM_PACK_TILE == 8, "TILES and the unroll pragmas assume 8");

/* Bytes of one block column of a group, and where its quants start. */
#define P4_BYTES 144
#define P8_BYTES 272
#define P_QS 16
#define XBS ((size_t)sizeof(block_q8_0s))
#define X_D 0
#define X_S8 4
#define X_QS 8

INLINE __m256i ld256(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)(const void *)p); }

/* Four activation bytes at p in every 32-bit lane. */
INLINE __m256i bcast4(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}

INLINE __m256 bcastf(const uint8_t *p) {
    float v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_ps(v);
}

/* The 8 rows' scales of one block column. */
INLINE __m256 scales8(const uint8_t *blk) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)blk));
}

/* Weight bytes are streamed from memory once per token in decode, and once
 * per tile of tokens the first time through in prompt processing; prefetch
 * the bytes PREFETCH_AHEAD further on (past the group is fine: prefetches
 * never fault, and the next group is usually read next). */
#define PREFETCH_AHEAD 2048

INLINE void prefetch_ahead(const uint8_t *p, size_t bytes) {
    uintptr_t a = (uintptr_t)p + PREFETCH_AHEAD;
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)(a + o), _MM_HINT_T0);
}

/* Store lanes [0, nr) of v at y. */
INLINE void store_rows(float *y, int nr, __m256 v) {
    if (nr == LM_PACK_ROWS) {
        _mm256_storeu_ps(y, v);
        return;
    }
    _Alignas(32) float t[8];
    _mm256_store_ps(t, v);
    for (int r = 0; r < nr; r++) y[r] = t[r];
}

/* ---- Q4_0 ------------------------------------------------------------------ */

/* One group (8 rows) by C tokens. Vector k < 4 of a block column holds
 * bytes 4k..4k+3 of each row: their low nibbles are elements 4k..4k+3,
 * their high nibbles elements 16+4k..16+4k+3, so unpacked vector j pairs
 * with activation quants 4j..4j+3 for every j < 8. */
INLINE void p4_tile(int64_t nb, const uint8_t *w, int nr, const uint8_t *x, size_t xs, int C, float *y,
                    size_t ys) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[LM_PACK_TILE];
    for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += P4_BYTES) {
        prefetch_ahead(w, P4_BYTES);
        const __m256 dw = scales8(w);
        const __m256i v0 = ld256(w + P_QS), v1 = ld256(w + P_QS + 32);
        const __m256i v2 = ld256(w + P_QS + 64), v3 = ld256(w + P_QS + 96);
        const __m256i u0 = _mm256_and_si256(v0, low4), u4 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), low4);
        const __m256i u1 = _mm256_and_si256(v1, low4), u5 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), low4);
        const __m256i u2 = _mm256_and_si256(v2, low4), u6 = _mm256_and_si256(_mm256_srli_epi16(v2, 4), low4);
        const __m256i u3 = _mm256_and_si256(v3, low4), u7 = _mm256_and_si256(_mm256_srli_epi16(v3, 4), low4);
#pragma GCC unroll 8 /* = LM_PACK_TILE */
        for (int c = 0; c < C; c++) {
            const uint8_t *xb = x + (size_t)c * xs + (size_t)b * XBS;
            const uint8_t *q = xb + X_QS;
            __m256i s01 = _mm256_add_epi16(_mm256_maddubs_epi16(u0, bcast4(q)), _mm256_maddubs_epi16(u1, bcast4(q + 4)));
            __m256i s23 = _mm256_add_epi16(_mm256_maddubs_epi16(u2, bcast4(q + 8)), _mm256_maddubs_epi16(u3, bcast4(q + 12)));
            __m256i s45 = _mm256_add_epi16(_mm256_maddubs_epi16(u4, bcast4(q + 16)), _mm256_maddubs_epi16(u5, bcast4(q + 20)));
            __m256i s67 = _mm256_add_epi16(_mm256_maddubs_epi16(u6, bcast4(q + 24)), _mm256_maddubs_epi16(u7, bcast4(q + 28)));
            __m256i s = _mm256_add_epi16(_mm256_add_epi16(s01, s23), _mm256_add_epi16(s45, s67));
            __m256i isum = _mm256_sub_epi32(_mm256_madd_epi16(s, ones), bcast4(xb + X_S8));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, bcastf(xb + X_D)), acc[c]);
        }
    }
    for (int c = 0; c < C; c++) store_rows(y + (size_t)c * ys, nr, acc[c]);
}

void avx2_packed_gemm_q4_0(int64_t n, const void *wp, int nr, const void *x, size_t xs, int nc, float *y,
                           size_t ys) {
    assert(n % 32 == 0 && nr >= 0 && nr <= LM_PACK_ROWS && nc >= 0 && nc <= LM_PACK_TILE);
#define T(C) \
    case C: p4_tile(n / 32, wp, nr, x, xs, C, y, ys); break;
    switch (nc) { TILES(T) default: break; }
#undef T
}

/* ---- Q8_0 ------------------------------------------------------------------ */

/* One group by C tokens; vector k < 8 of a block column holds quants
 * 4k..4k+3 of each row. */
INLINE void p8_tile(int64_t nb, const uint8_t *w, int nr, const uint8_t *x, size_t xs, int C, float *y,
                    size_t ys) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[LM_PACK_TILE];
    for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += P8_BYTES) {
        prefetch_ahead(w, P8_BYTES);
        const __m256 dw = scales8(w);
        const uint8_t *wq = w + P_QS;
#define U(k) const __m256i u##k = _mm256_abs_epi8(ld256(wq + 32 * k));
        REP8(U)
#undef U
#pragma GCC unroll 8 /* = LM_PACK_TILE */
        for (int c = 0; c < C; c++) {
            const uint8_t *xb = x + (size_t)c * xs + (size_t)b * XBS;
            const uint8_t *q = xb + X_QS;
#define P(k)                                                                                          \
    const __m256i p##k = _mm256_madd_epi16(                                                           \
        _mm256_maddubs_epi16(u##k, _mm256_sign_epi8(bcast4(q + 4 * k), ld256(wq + 32 * k))), ones);
            REP8(P)
#undef P
            __m256i isum = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3)),
                                            _mm256_add_epi32(_mm256_add_epi32(p4, p5), _mm256_add_epi32(p6, p7)));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, bcastf(xb + X_D)), acc[c]);
        }
    }
    for (int c = 0; c < C; c++) store_rows(y + (size_t)c * ys, nr, acc[c]);
}

void avx2_packed_gemm_q8_0(int64_t n, const void *wp, int nr, const void *x, size_t xs, int nc, float *y,
                           size_t ys) {
    assert(n % 32 == 0 && nr >= 0 && nr <= LM_PACK_ROWS && nc >= 0 && nc <= LM_PACK_TILE);
#define T(C) \
    case C: p8_tile(n / 32, wp, nr, x, xs, C, y, ys); break;
    switch (nc) { TILES(T) default: break; }
#undef T
}

/* ---- activations ----------------------------------------------------------- */

/* block_q8_0s rows: the quants and scale from the Q8_0 quantizer (bit for
 * bit the reference's), the scale widened to f32 and 8 * the quant sum. */
void avx2_packed_act(const float *src, void *dst, int64_t n) {
    block_q8_0s *o = dst;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        block_q8_0 b;
        avx2_from_float_q8_0(src + i * QK8_0, &b, QK8_0);
        __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)b.qs);
        /* sum of the 32 int8: pmaddubsw with ones (|q| <= 127, no saturation) */
        __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q);
        __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
        o[i].d = lm_f16_to_f32(b.d);
        o[i].s8 = 8 * _mm_cvtsi128_si32(h);
        memcpy(o[i].qs, b.qs, QK8_0);
    }
}

#endif
