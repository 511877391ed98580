/*
 * avx2_packed.c - AVX2 + FMA + F16C matrix tiles for Q8_0, Q4_0, Q5_0, Q4_1,
 * Q5_1 and MXFP4 weights in the interleaved layout of quant.h (groups of 8 rows,
 * 4-byte chunks of the 8 rows side by side), against block_q8_0s
 * activations, and for Q4_K weights in the same manner against Q8_K
 * activations (its own notes below). Compiled with -mavx2 -mfma -mf16c;
 * nothing here runs unless cpu_has_avx2() said yes.
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
 *    product, one for the fused multiply-add (Q4_1 and Q5_1 then add their
 *    m term with one more: acc = fma(m, sum(x) * dx, acc)).
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
 * in memory between blocks, a trade that still beats 4 tokens with
 * everything in registers. One token (decode) is the same code with C = 1,
 * streaming the group's bytes with prefetches.
 */
#include "kernels/variant.h" /* first: the variant's names (built once per variant, Makefile) */

#include "kernels/avx2.h"

#if LM_VARIANT_ON

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "avx2_packed.c must be compiled with -mavx2 -mfma -mf16c"
#endif

#include <assert.h>
#include <immintrin.h>
#include <string.h>

#include "base/util.h"

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

#ifdef X86_DPBUSD
/* With VNNI (kernels/variant.h): the exact int32 dot, per lane, of the
 * eight unsigned weight vectors u[k] with the token's quants 4k..4k+3
 * broadcast (q: the token's 32 quants), in two chains of four vpdpbusd.
 * The same integers as the pmaddubsw/pmaddwd sums below (no step of either
 * saturates or overflows: the bounds above), so the same float results. */
INLINE __m256i dot8(const __m256i u[8], const uint8_t *q) {
    const __m256i z = _mm256_setzero_si256();
    __m256i a = X86_DPBUSD(X86_DPBUSD(z, u[0], bcast4(q)), u[1], bcast4(q + 4));
    __m256i b = X86_DPBUSD(X86_DPBUSD(z, u[4], bcast4(q + 16)), u[5], bcast4(q + 20));
    a = X86_DPBUSD(X86_DPBUSD(a, u[2], bcast4(q + 8)), u[3], bcast4(q + 12));
    b = X86_DPBUSD(X86_DPBUSD(b, u[6], bcast4(q + 24)), u[7], bcast4(q + 28));
    return _mm256_add_epi32(a, b);
}
#endif

/* ---- Q4_0 ------------------------------------------------------------------ */

/* One group (8 rows) by C tokens. Vector k < 4 of a block column holds
 * bytes 4k..4k+3 of each row: their low nibbles are elements 4k..4k+3,
 * their high nibbles elements 16+4k..16+4k+3, so unpacked vector j pairs
 * with activation quants 4j..4j+3 for every j < 8. */
INLINE void p4_tile(int64_t nb, const uint8_t *w, int nr, const uint8_t *x, size_t xs, int C, float *y, size_t ys) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[LM_PACK_TILE];
#pragma GCC unroll 8 /* vector stores, not a rep stos (slow to start) */
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
#ifdef X86_DPBUSD
            const __m256i u[8] = {u0, u1, u2, u3, u4, u5, u6, u7};
            (void)ones;
            __m256i isum = _mm256_sub_epi32(dot8(u, q), bcast4(xb + X_S8));
#else
            __m256i s01 =
                _mm256_add_epi16(_mm256_maddubs_epi16(u0, bcast4(q)), _mm256_maddubs_epi16(u1, bcast4(q + 4)));
            __m256i s23 =
                _mm256_add_epi16(_mm256_maddubs_epi16(u2, bcast4(q + 8)), _mm256_maddubs_epi16(u3, bcast4(q + 12)));
            __m256i s45 =
                _mm256_add_epi16(_mm256_maddubs_epi16(u4, bcast4(q + 16)), _mm256_maddubs_epi16(u5, bcast4(q + 20)));
            __m256i s67 =
                _mm256_add_epi16(_mm256_maddubs_epi16(u6, bcast4(q + 24)), _mm256_maddubs_epi16(u7, bcast4(q + 28)));
            __m256i s = _mm256_add_epi16(_mm256_add_epi16(s01, s23), _mm256_add_epi16(s45, s67));
            __m256i isum = _mm256_sub_epi32(_mm256_madd_epi16(s, ones), bcast4(xb + X_S8));
#endif
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, bcastf(xb + X_D)), acc[c]);
        }
    }
    for (int c = 0; c < C; c++) store_rows(y + (size_t)c * ys, nr, acc[c]);
}

void avx2_packed_gemm_q4_0(int64_t n, const void *wp, int nr, const void *x, size_t xs, int nc, float *y, size_t ys) {
    assert(n % 32 == 0 && nr >= 0 && nr <= LM_PACK_ROWS && nc >= 0 && nc <= LM_PACK_TILE);
#define T(C)                                                                                                           \
    case C: p4_tile(n / 32, wp, nr, x, xs, C, y, ys); break;
    switch (nc) { TILES(T) default : break; }
#undef T
}

/* ---- Q5_0 ------------------------------------------------------------------ */

#define P5_BYTES 176
#define P5_QH 16
#define P5_QS 48

/* Bit 4 of the quants in vector k's low (hi = 0) or high (hi = 1) nibbles:
 * elements 4k..4k+3 (+16 for the high ones) of each row take bits
 * e..e+3 of the row's qh word, i.e. bits 4(k & 1)..+3 of qh byte k/2
 * (+2). That byte is copied to the lane's four bytes, each byte tests its
 * own bit, and a set bit becomes 0x10. */
INLINE __m256i p5_bit4(__m256i qh, int k, int hi) {
    const int byte = k / 2 + 2 * hi, sh = 4 * (k & 1);
    const __m256i idx = _mm256_setr_epi32(0x01010101 * byte, 0x01010101 * (4 + byte), 0x01010101 * (8 + byte),
                                          0x01010101 * (12 + byte), 0x01010101 * byte, 0x01010101 * (4 + byte),
                                          0x01010101 * (8 + byte), 0x01010101 * (12 + byte));
    const __m256i bit = _mm256_set1_epi32((int)(0x08040201u << sh));
    __m256i t = _mm256_and_si256(_mm256_shuffle_epi8(qh, idx), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(t, bit), _mm256_set1_epi8(0x10));
}

/* One group (8 rows) by C tokens, as p4_tile with the fifth bit or-ed in
 * (q in 0..31, value q - 16). A pmaddubsw pair is now up to 2*31*127 =
 * 7874, so the eight products are summed in two int16 halves of four
 * before pmaddwd; the offset comes off as 16 * sum(x) = 2 * s8. */
INLINE void p5_tile(int64_t nb, const uint8_t *w, int nr, const uint8_t *x, size_t xs, int C, float *y, size_t ys) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[LM_PACK_TILE];
#pragma GCC unroll 8 /* vector stores, not a rep stos (slow to start) */
    for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += P5_BYTES) {
        prefetch_ahead(w, P5_BYTES);
        const __m256 dw = scales8(w);
        const __m256i qh = ld256(w + P5_QH);
        __m256i u[8];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m256i v = ld256(w + P5_QS + 32 * k);
            u[k] = _mm256_or_si256(_mm256_and_si256(v, low4), p5_bit4(qh, k, 0));
            u[k + 4] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), p5_bit4(qh, k, 1));
        }
#pragma GCC unroll 8 /* = LM_PACK_TILE */
        for (int c = 0; c < C; c++) {
            const uint8_t *xb = x + (size_t)c * xs + (size_t)b * XBS;
            const uint8_t *q = xb + X_QS;
#ifdef X86_DPBUSD
            (void)ones;
            __m256i isum = _mm256_sub_epi32(dot8(u, q), _mm256_slli_epi32(bcast4(xb + X_S8), 1));
#else
            __m256i s0 = _mm256_add_epi16(
                _mm256_add_epi16(_mm256_maddubs_epi16(u[0], bcast4(q)), _mm256_maddubs_epi16(u[1], bcast4(q + 4))),
                _mm256_add_epi16(_mm256_maddubs_epi16(u[2], bcast4(q + 8)),
                                 _mm256_maddubs_epi16(u[3], bcast4(q + 12))));
            __m256i s1 = _mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u[4], bcast4(q + 16)),
                                                           _mm256_maddubs_epi16(u[5], bcast4(q + 20))),
                                          _mm256_add_epi16(_mm256_maddubs_epi16(u[6], bcast4(q + 24)),
                                                           _mm256_maddubs_epi16(u[7], bcast4(q + 28))));
            __m256i s = _mm256_add_epi32(_mm256_madd_epi16(s0, ones), _mm256_madd_epi16(s1, ones));
            __m256i isum = _mm256_sub_epi32(s, _mm256_slli_epi32(bcast4(xb + X_S8), 1));
#endif
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, bcastf(xb + X_D)), acc[c]);
        }
    }
    for (int c = 0; c < C; c++) store_rows(y + (size_t)c * ys, nr, acc[c]);
}

void avx2_packed_gemm_q5_0(int64_t n, const void *wp, int nr, const void *x, size_t xs, int nc, float *y, size_t ys) {
    assert(n % 32 == 0 && nr >= 0 && nr <= LM_PACK_ROWS && nc >= 0 && nc <= LM_PACK_TILE);
#define T(C)                                                                                                           \
    case C: p5_tile(n / 32, wp, nr, x, xs, C, y, ys); break;
    switch (nc) { TILES(T) default : break; }
#undef T
}

/* ---- Q4_1 and Q5_1 ------------------------------------------------------------ */

#define P41_BYTES 160
#define P51_BYTES 192
#define P1_M 16  /* the 8 rows' f16 m */
#define P1_QS 32 /* Q4_1's nibbles; Q5_1: qh here, nibbles at 64 */

/* One group (8 rows) by C tokens of Q4_1 (five = 0) or Q5_1 (five = 1):
 * the unsigned quants unpacked as in p4_tile / p5_tile (no offset), their
 * exact integer dot (Q4_1 sums its eight products in int16 as Q4_0 does,
 * Q5_1 in two halves as Q5_0), then two fused steps per block:
 *   acc = fma(float(isum), dw * dx, acc)
 *   acc = fma(m, float(sum x) * dx, acc)
 * where sum x = s8 / 8 and its product with dx is exact (below 2^12 times
 * an f16 scale). */
INLINE void p1_tile(int five, int64_t nb, const uint8_t *w, int nr, const uint8_t *x, size_t xs, int C, float *y,
                    size_t ys) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const size_t bytes = five ? P51_BYTES : P41_BYTES, qs = five ? P1_QS + 32 : P1_QS;
    __m256 acc[LM_PACK_TILE];
#pragma GCC unroll 8 /* vector stores, not a rep stos (slow to start) */
    for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += bytes) {
        prefetch_ahead(w, bytes);
        const __m256 dw = scales8(w), mw = scales8(w + P1_M);
        __m256i u[8];
        if (five) {
            const __m256i qh = ld256(w + P1_QS);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m256i v = ld256(w + qs + 32 * k);
                u[k] = _mm256_or_si256(_mm256_and_si256(v, low4), p5_bit4(qh, k, 0));
                u[k + 4] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), p5_bit4(qh, k, 1));
            }
        } else {
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m256i v = ld256(w + qs + 32 * k);
                u[k] = _mm256_and_si256(v, low4);
                u[k + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
            }
        }
#pragma GCC unroll 8 /* = LM_PACK_TILE */
        for (int c = 0; c < C; c++) {
            const uint8_t *xb = x + (size_t)c * xs + (size_t)b * XBS;
            const uint8_t *q = xb + X_QS;
#ifdef X86_DPBUSD
            (void)ones;
            __m256i isum = dot8(u, q);
#else
            __m256i s0 = _mm256_add_epi16(
                _mm256_add_epi16(_mm256_maddubs_epi16(u[0], bcast4(q)), _mm256_maddubs_epi16(u[1], bcast4(q + 4))),
                _mm256_add_epi16(_mm256_maddubs_epi16(u[2], bcast4(q + 8)),
                                 _mm256_maddubs_epi16(u[3], bcast4(q + 12))));
            __m256i s1 = _mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u[4], bcast4(q + 16)),
                                                           _mm256_maddubs_epi16(u[5], bcast4(q + 20))),
                                          _mm256_add_epi16(_mm256_maddubs_epi16(u[6], bcast4(q + 24)),
                                                           _mm256_maddubs_epi16(u[7], bcast4(q + 28))));
            __m256i isum = five ? _mm256_add_epi32(_mm256_madd_epi16(s0, ones), _mm256_madd_epi16(s1, ones))
                                : _mm256_madd_epi16(_mm256_add_epi16(s0, s1), ones);
#endif
            const __m256 dx = bcastf(xb + X_D);
            const __m256 sx = _mm256_cvtepi32_ps(_mm256_srai_epi32(bcast4(xb + X_S8), 3));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, dx), acc[c]);
            acc[c] = _mm256_fmadd_ps(mw, _mm256_mul_ps(sx, dx), acc[c]);
        }
    }
    for (int c = 0; c < C; c++) store_rows(y + (size_t)c * ys, nr, acc[c]);
}

void avx2_packed_gemm_q4_1(int64_t n, const void *wp, int nr, const void *x, size_t xs, int nc, float *y, size_t ys) {
    assert(n % 32 == 0 && nr >= 0 && nr <= LM_PACK_ROWS && nc >= 0 && nc <= LM_PACK_TILE);
#define T(C)                                                                                                           \
    case C: p1_tile(0, n / 32, wp, nr, x, xs, C, y, ys); break;
    switch (nc) { TILES(T) default : break; }
#undef T
}

void avx2_packed_gemm_q5_1(int64_t n, const void *wp, int nr, const void *x, size_t xs, int nc, float *y, size_t ys) {
    assert(n % 32 == 0 && nr >= 0 && nr <= LM_PACK_ROWS && nc >= 0 && nc <= LM_PACK_TILE);
#define T(C)                                                                                                           \
    case C: p1_tile(1, n / 32, wp, nr, x, xs, C, y, ys); break;
    switch (nc) { TILES(T) default : break; }
#undef T
}

/* ---- Q8_0 ------------------------------------------------------------------ */

/* One group by C tokens; vector k < 8 of a block column holds quants
 * 4k..4k+3 of each row. */
INLINE void p8_tile(int64_t nb, const uint8_t *w, int nr, const uint8_t *x, size_t xs, int C, float *y, size_t ys) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[LM_PACK_TILE];
#pragma GCC unroll 8 /* vector stores, not a rep stos (slow to start) */
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
#ifdef X86_DPBUSD
#define P(k) const __m256i p##k = _mm256_sign_epi8(bcast4(q + 4 * k), ld256(wq + 32 * k));
            REP8(P)
#undef P
            const __m256i z = _mm256_setzero_si256();
            (void)ones;
            __m256i isum =
                _mm256_add_epi32(X86_DPBUSD(X86_DPBUSD(X86_DPBUSD(X86_DPBUSD(z, u0, p0), u1, p1), u2, p2), u3, p3),
                                 X86_DPBUSD(X86_DPBUSD(X86_DPBUSD(X86_DPBUSD(z, u4, p4), u5, p5), u6, p6), u7, p7));
#else
#define P(k)                                                                                                           \
    const __m256i p##k =                                                                                               \
        _mm256_madd_epi16(_mm256_maddubs_epi16(u##k, _mm256_sign_epi8(bcast4(q + 4 * k), ld256(wq + 32 * k))), ones);
            REP8(P)
#undef P
            __m256i isum = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3)),
                                            _mm256_add_epi32(_mm256_add_epi32(p4, p5), _mm256_add_epi32(p6, p7)));
#endif
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, bcastf(xb + X_D)), acc[c]);
        }
    }
    for (int c = 0; c < C; c++) store_rows(y + (size_t)c * ys, nr, acc[c]);
}

void avx2_packed_gemm_q8_0(int64_t n, const void *wp, int nr, const void *x, size_t xs, int nc, float *y, size_t ys) {
    assert(n % 32 == 0 && nr >= 0 && nr <= LM_PACK_ROWS && nc >= 0 && nc <= LM_PACK_TILE);
#define T(C)                                                                                                           \
    case C: p8_tile(n / 32, wp, nr, x, xs, C, y, ys); break;
    switch (nc) { TILES(T) default : break; }
#undef T
}

/* ---- MXFP4 ----------------------------------------------------------------- */

/* One block column: e[8] (row r's exponent byte at r), then qs[128] as
 * Q4_0x8. The nibbles go through pshufb into their doubled E2M1 values
 * plus 12 (0..24, unsigned: the pmaddubsw / vpdpbusd operand, as Q4_0's
 * nibbles), and 12 * sum(x) = s8 + s8 / 2 (block_q8_0s.s8 = 8 * sum(x),
 * so exact) is subtracted at the end, as Q4_0 subtracts s8. Pairs are at
 * most 2 * 24 * 127 = 6096, so four vectors' pairs add in int16 (<= 24384)
 * before each of two pmaddwd. The scale is 2^(e - 128) (quant_e8m0_half),
 * and dw * dx is exact but for underflow; padding rows have zero codes
 * (value 0) and zero exponents, so they add zeros. */
#define PM_BYTES 136
#define PM_QS 8

/* The 8 rows' scales of one block column: the exponent field e - 1, or for
 * e < 2 the subnormals 2^-128 and 2^-127. */
INLINE __m256 e8m0x8(const uint8_t *blk) {
    const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)blk));
    const __m256i norm = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(norm, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
}

INLINE void pm_tile(int64_t nb, const uint8_t *w, int nr, const uint8_t *x, size_t xs, int C, float *y, size_t ys) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    /* the doubled E2M1 values plus 12: 0..24, unsigned */
    const __m256i kv = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14, 15, 16,
                                        18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    __m256 acc[LM_PACK_TILE];
#pragma GCC unroll 8 /* vector stores, not a rep stos (slow to start) */
    for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += PM_BYTES) {
        prefetch_ahead(w, PM_BYTES);
        const __m256 dw = e8m0x8(w);
        __m256i u[8];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m256i v = ld256(w + PM_QS + 32 * k);
            u[k] = _mm256_shuffle_epi8(kv, _mm256_and_si256(v, low4));
            u[k + 4] = _mm256_shuffle_epi8(kv, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
        }
#pragma GCC unroll 8 /* = LM_PACK_TILE */
        for (int c = 0; c < C; c++) {
            const uint8_t *xb = x + (size_t)c * xs + (size_t)b * XBS;
            const uint8_t *q = xb + X_QS;
            const __m256i s8 = bcast4(xb + X_S8), off = _mm256_add_epi32(s8, _mm256_srai_epi32(s8, 1)); /* 12 sum */
#ifdef X86_DPBUSD
            (void)ones;
            __m256i isum = _mm256_sub_epi32(dot8(u, q), off);
#else
            __m256i lo = _mm256_add_epi16(
                _mm256_add_epi16(_mm256_maddubs_epi16(u[0], bcast4(q)), _mm256_maddubs_epi16(u[1], bcast4(q + 4))),
                _mm256_add_epi16(_mm256_maddubs_epi16(u[2], bcast4(q + 8)),
                                 _mm256_maddubs_epi16(u[3], bcast4(q + 12))));
            __m256i hi = _mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u[4], bcast4(q + 16)),
                                                           _mm256_maddubs_epi16(u[5], bcast4(q + 20))),
                                          _mm256_add_epi16(_mm256_maddubs_epi16(u[6], bcast4(q + 24)),
                                                           _mm256_maddubs_epi16(u[7], bcast4(q + 28))));
            __m256i isum =
                _mm256_sub_epi32(_mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones)), off);
#endif
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, bcastf(xb + X_D)), acc[c]);
        }
    }
    for (int c = 0; c < C; c++) store_rows(y + (size_t)c * ys, nr, acc[c]);
}

void avx2_packed_gemm_mxfp4(int64_t n, const void *wp, int nr, const void *x, size_t xs, int nc, float *y, size_t ys) {
    assert(n % 32 == 0 && nr >= 0 && nr <= LM_PACK_ROWS && nc >= 0 && nc <= LM_PACK_TILE);
#define T(C)                                                                                                           \
    case C: pm_tile(n / 32, wp, nr, x, xs, C, y, ys); break;
    switch (nc) { TILES(T) default : break; }
#undef T
}

/* ---- Q4_K ------------------------------------------------------------------ */

/* One group super-block column (quant.h): d[8], dmin[8], the three 4-byte
 * words of each row's 12 scale bytes as three vectors (row r in lane r),
 * then qs[1024] with bytes 4k..4k+3 of row r's 128 at 32k + 4r. */
#define PK_BYTES 1152
#define PK_DMIN 16
#define PK_SC 32
#define PK_QS 128
#define X8K_BYTES ((size_t)sizeof(block_q8_K))
#define X8K_QS 4
#define X8K_BSUMS (4 + QK_K)
_Static_assert(sizeof(block_q8_K) == 292, "block_q8_K layout");

/* pshufb index: in every 32-bit lane l of a 128-bit half, its byte t as an
 * int16 in both halves of the lane (scales), or bytes t and t + 1 as two
 * int16 (a pair of mins). */
#ifdef X86_DPBUSD /* VNNI: the scale in the lane's low int16 only (X86_DPWSSD, kernels/variant.h) */
#define SIDX(l, t) ((int)(0x80808000u | (4u * (l) + (t))))
#else
#define SIDX(l, t) ((int)(0x80008000u | ((4u * (l) + (t)) << 16) | (4u * (l) + (t))))
#endif
#define MIDX(l, t) ((int)(0x80008000u | ((4u * (l) + (t) + 1) << 16) | (4u * (l) + (t))))
#define IDX8(F, t) _mm256_setr_epi32(F(0, t), F(1, t), F(2, t), F(3, t), F(0, t), F(1, t), F(2, t), F(3, t))

/* The 8 rows' sub-block scales and mins, lane r = row r: scv[j], the
 * 6-bit scale of sub-block j in both int16 halves; mv[p], the mins of
 * sub-blocks 2p and 2p + 1 as two int16. Same bit operations as the
 * row-major kernel's k4_scales, on eight rows at once. */
INLINE void k4x8_scales(const uint8_t *blk, __m256i scv[8], __m256i mv[4]) {
    const __m256i s0 = ld256(blk + PK_SC), s1 = ld256(blk + PK_SC + 32), s2 = ld256(blk + PK_SC + 64);
    const __m256i m6 = _mm256_set1_epi8(0x3f), m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    const __m256i sc_lo = _mm256_and_si256(s0, m6), m_lo = _mm256_and_si256(s1, m6);
    const __m256i sc_hi = _mm256_or_si256(_mm256_and_si256(s2, m4), _mm256_and_si256(_mm256_srli_epi32(s0, 2), m30));
    const __m256i m_hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(s2, 4), m4),
                                         _mm256_and_si256(_mm256_srli_epi32(s1, 2), m30));
#define SC(t)                                                                                                          \
    scv[t] = _mm256_shuffle_epi8(sc_lo, IDX8(SIDX, t));                                                                \
    scv[t + 4] = _mm256_shuffle_epi8(sc_hi, IDX8(SIDX, t));
    /* clang-format off */
    SC(0)
    SC(1) SC(2) SC(3)
    /* clang-format on */
#undef SC
        mv[0] = _mm256_shuffle_epi8(m_lo, IDX8(MIDX, 0));
    mv[1] = _mm256_shuffle_epi8(m_lo, IDX8(MIDX, 2));
    mv[2] = _mm256_shuffle_epi8(m_hi, IDX8(MIDX, 0));
    mv[3] = _mm256_shuffle_epi8(m_hi, IDX8(MIDX, 2));
}

/* Sum over sub-blocks of min_j * (the token's 32-element sum j), per row:
 * the bsums in pairs, each pair of sums broadcast against mv[p]. */
INLINE __m256i k4x8_minsum(const __m256i mv[4], const uint8_t *xb) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i b32 = _mm256_madd_epi16(ld256(xb + X8K_BSUMS), ones); /* lane j: sum of sub-block j, |.| <= 4096 */
    __m256i b16 = _mm256_packs_epi32(b32, b32); /* 32-bit words 0, 1, 4, 5: sub-blocks (0,1) (2,3) (4,5) (6,7) */
    __m256i m = _mm256_madd_epi16(mv[0], _mm256_permutevar8x32_epi32(b16, _mm256_set1_epi32(0)));
    m = _mm256_add_epi32(m, _mm256_madd_epi16(mv[1], _mm256_permutevar8x32_epi32(b16, _mm256_set1_epi32(1))));
    m = _mm256_add_epi32(m, _mm256_madd_epi16(mv[2], _mm256_permutevar8x32_epi32(b16, _mm256_set1_epi32(4))));
    return _mm256_add_epi32(m, _mm256_madd_epi16(mv[3], _mm256_permutevar8x32_epi32(b16, _mm256_set1_epi32(5))));
}

/* acc += d * dx * isum - dmin * dx * msum, lane by lane. */
INLINE __m256 k4x8_acc(const uint8_t *blk, const uint8_t *xb, __m256i isum, __m256i msum, __m256 acc) {
    const __m256 dx = bcastf(xb);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(scales8(blk), dx), acc);
    return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(scales8(blk + PK_DMIN), dx), acc);
}

/* CT <= 4 tokens' integer sums for one super-block column (one token in
 * decode), sub-block by sub-block: sub-block j is the low (j even) or high
 * nibbles of vectors 8(j/2)..8(j/2)+7, whose bytes 4k..4k+3 of each row
 * hold elements 32j+4k..+3; its 8 unpacked vectors stay in registers for
 * all CT tokens. The 8 pmaddubsw results add in int16 (at most 8 * 2 * 15 *
 * 128 = 30720) before the scale's pmaddwd; the VNNI variants sum each half
 * of the 8 vectors with vpdpbusd (the same bound) and apply the scale with
 * vpdpwssd, the same integer sums. xq: the first token's quants
 * for this column; xs: the stride between tokens. */
INLINE void pk4_tokens(const uint8_t *qs, const __m256i scv[8], const uint8_t *xq, size_t xs, int CT, __m256i isum[4]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int c = 0; c < CT; c++) isum[c] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int j = 0; j < 8; j++) { /* sub-block j: the low (j even) or high nibbles of pair j / 2 */
        const uint8_t *q = qs + 256 * (j / 2);
        __m256i u[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m256i v = ld256(q + 32 * k);
            u[k] = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(v, 4) : v, low4);
        }
#pragma GCC unroll 4
        for (int c = 0; c < CT; c++) {
            const uint8_t *xc = xq + (size_t)c * xs + 32 * j;
#ifdef X86_DPBUSD
            /* VNNI: two halves of 16 products per lane (|.| <= 16 * 15 *
             * 128 = 30720, an int16), each times the scale */
            const __m256i z = _mm256_setzero_si256();
            __m256i a = X86_DPBUSD(X86_DPBUSD(z, u[0], bcast4(xc)), u[1], bcast4(xc + 4));
            __m256i b = X86_DPBUSD(X86_DPBUSD(z, u[4], bcast4(xc + 16)), u[5], bcast4(xc + 20));
            a = X86_DPBUSD(X86_DPBUSD(a, u[2], bcast4(xc + 8)), u[3], bcast4(xc + 12));
            b = X86_DPBUSD(X86_DPBUSD(b, u[6], bcast4(xc + 24)), u[7], bcast4(xc + 28));
            isum[c] = X86_DPWSSD(X86_DPWSSD(isum[c], a, scv[j]), b, scv[j]);
#else
            __m256i s16 = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(u[k], bcast4(xc + 4 * k)));
            isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(s16, scv[j]));
#endif
        }
    }
}

/* One group by C tokens, four at a time through pk4_tokens. */
INLINE void pk4_tile(int64_t nb, const uint8_t *w, int nr, const uint8_t *x, size_t xs, int C, float *y, size_t ys) {
    __m256 acc[LM_PACK_TILE];
#pragma GCC unroll 8 /* vector stores, not a rep stos (slow to start) */
    for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += PK_BYTES) {
        prefetch_ahead(w, PK_BYTES);
        __m256i scv[8], mv[4];
        k4x8_scales(w, scv, mv);
        const uint8_t *qs = w + PK_QS;
#pragma GCC unroll 2
        for (int c0 = 0; c0 < C; c0 += 4) {
            const int CT = C - c0 < 4 ? C - c0 : 4;
            __m256i isum[4];
            pk4_tokens(qs, scv, x + (size_t)c0 * xs + (size_t)b * X8K_BYTES + X8K_QS, xs, CT, isum);
#pragma GCC unroll 4
            for (int c = 0; c < CT; c++) {
                const uint8_t *xb = x + (size_t)(c0 + c) * xs + (size_t)b * X8K_BYTES;
                acc[c0 + c] = k4x8_acc(w, xb, isum[c], k4x8_minsum(mv, xb), acc[c0 + c]);
            }
        }
    }
    for (int c = 0; c < C; c++) store_rows(y + (size_t)c * ys, nr, acc[c]);
}

void avx2_packed_gemm_q4_K(int64_t n, const void *wp, int nr, const void *x, size_t xs, int nc, float *y, size_t ys) {
    assert(n % QK_K == 0 && nr >= 0 && nr <= LM_PACK_ROWS && nc >= 0 && nc <= LM_PACK_TILE);
#define T(C)                                                                                                           \
    case C: pk4_tile(n / QK_K, wp, nr, x, xs, C, y, ys); break;
    switch (nc) { TILES(T) default : break; }
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
