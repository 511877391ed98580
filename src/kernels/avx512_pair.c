/*
 * avx512_pair.c - the 512-bit decode tiles of kernels/x86_pair.h for Q4_0,
 * Q5_0, Q4_1, Q5_1, Q8_0 and Q4_K: two interleaved groups (16 weight rows)
 * by 1..4 tokens.
 *
 * Built once per variant (Makefile, kernels/variant.h): avx512, with
 * -mavx512f -mavx512bw -mavx512vl, as avx512_pair_kernel; avx512vnni, the
 * same plus -mavx512vnni, as avx512vnni_pair_kernel, which forms the exact
 * integer sums with vpdpbusd / vpdpwssd instead of pmaddubsw / pmaddwd
 * (PAIR_VNNI). Nothing here runs unless dispatch.c found the variant on
 * this CPU.
 *
 * Layouts and bounds are kernels/avx2_packed.c's (quant.h describes the
 * interleaved groups): a 512-bit vector holds the first group's 32 bytes of
 * a block column in its low half and the second group's same 32 bytes in
 * its high half, so lane r and lane 8 + r are the two groups' row r. Per
 * lane the integer sum of a block is exact and the float steps are
 * avx2_packed.c's, in its order; hence the bit-identical results.
 *  - Q4_0: the unsigned nibbles' products with the token's quants summed
 *    in int16 (at most 8 * 2 * 15 * 127 = 30480) then pmaddwd, or with
 *    vpdpbusd; minus 8 * sum(x) (block_q8_0s.s8). With vpdpbusd the high
 *    nibbles stay in place (and-not: 16 q, at most 16 * 240 * 127 =
 *    487680 per lane and block) and their sum is shifted down by 4 once per
 *    token, exactly: the same integer sum for fewer instructions per byte.
 *  - Q5_0, Q4_1, Q5_1: as Q4_0 with the fifth bit or-ed in (Q5_*: int16
 *    halves of four products, at most 4 * 2 * 31 * 127 = 31496) and Q4_1 /
 *    Q5_1's m term as a second fused step, as avx2_packed.c.
 *  - Q8_0: pmaddubsw of |w| with x carrying w's sign (the mask form of
 *    psignb: AVX-512 has no 512-bit psignb), widened by pmaddwd per vector;
 *    with VNNI, vpdpbusd of w + 128 (w xor 0x80) with x, minus 128 * sum(x)
 *    = 16 * s8: exact, as each product fits and vpdpbusd does not saturate.
 *  - Q4_K: per sub-block the int16 sum of eight pmaddubsw (at most 30720),
 *    times the 6-bit scale through pmaddwd (or vpdpwssd); the mins against
 *    the token's bsums as in avx2_packed.c.
 */
#include "kernels/variant.h" /* first: the variant's names */

#include "kernels/x86_pair.h"

#include "kernels/x86.h"

#if !defined(LM_VARIANT)
#error "avx512_pair.c is built per variant: -DLM_VARIANT=avx512 or avx512vnni (Makefile)"
#endif

#if LM_VARIANT_ON && X86_VARIANTS

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__FMA__) || !defined(__F16C__)
#error "avx512_pair.c must be compiled with the avx512 variant's flags"
#endif
#if defined(__AVX512VNNI__)
#define PAIR_VNNI 1
#endif

#include <assert.h>
#include <immintrin.h>
#include <string.h>

#include "kernels/x86_zmm.h"

#define INLINE static inline __attribute__((always_inline))

#define P4_BYTES 144
#define P8_BYTES 272
#define P_QS 16
#define XBS ((size_t)sizeof(block_q8_0s))
#define X_D 0
#define X_S8 4
#define X_QS 8

/* Prefetch distance of each of the two weight streams (bytes ahead), and
 * the hint (kept overridable for measuring). */
#ifndef PAIR_AHEAD
#define PAIR_AHEAD 2048
#endif
#ifndef PAIR_HINT
#define PAIR_HINT _MM_HINT_T0
#endif

/* Prefetch [p, p + bytes) + PAIR_AHEAD of both streams (the addresses
 * formed as integers: they may lie past any object; prefetches never fault). */
INLINE void prefetch2(const uint8_t *a, const uint8_t *b, size_t bytes) {
#ifdef PAIR_NO_PREFETCH
    (void)a, (void)b, (void)bytes;
    return;
#endif
    const uintptr_t pa = (uintptr_t)a + PAIR_AHEAD, pb = (uintptr_t)b + PAIR_AHEAD;
    for (size_t o = 0; o < bytes; o += 64) {
        _mm_prefetch((const char *)(pa + o), PAIR_HINT);
        _mm_prefetch((const char *)(pb + o), PAIR_HINT);
    }
}

/* A pair kernel's entry (lm_packed_gemm_fn) for blocks of blk values and
 * bytes bytes per group: the checks, then TILE(LEAD nb, wp, gb, ..., C, y,
 * ys) with the token count C a constant, so each width gets its own
 * unrolled copy of the tile. The variadic part is the tile's leading
 * arguments with a trailing comma ("Z_Q5_0,"), or empty. */
#define PAIR_ENTRY(name, blk, bytes, TILE, ...)                                                                        \
    static void name(int64_t n, const void *wp, int nr, const void *x, size_t xs, int nc, float *y, size_t ys) {       \
        assert(n % (blk) == 0 && nr > LM_PACK_ROWS && nr <= 2 * LM_PACK_ROWS && nc >= 1 && nc <= LM_PAIR_TILE);        \
        const int64_t nb = n / (blk);                                                                                  \
        const size_t gb = (size_t)nb * (bytes);                                                                        \
        switch (nc) {                                                                                                  \
            case 1: TILE(__VA_ARGS__ nb, wp, gb, nr, x, xs, 1, y, ys); break;                                          \
            case 2: TILE(__VA_ARGS__ nb, wp, gb, nr, x, xs, 2, y, ys); break;                                          \
            case 3: TILE(__VA_ARGS__ nb, wp, gb, nr, x, xs, 3, y, ys); break;                                          \
            default: TILE(__VA_ARGS__ nb, wp, gb, nr, x, xs, 4, y, ys); break;                                         \
        }                                                                                                              \
    }

/* ---- Q4_0 ------------------------------------------------------------------ */

/* Block b of the pair (its bytes at w and w2) against the C tokens, added
 * to acc[0..C). */
INLINE void z4_block(const uint8_t *w, const uint8_t *w2, int64_t b, const uint8_t *x, size_t xs, int C,
                     __m512 acc[LM_PAIR_TILE]) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const __m512 dw = scales16(w, w2);
    const __m512i v0 = ld2(w + P_QS, w2 + P_QS), v1 = ld2(w + P_QS + 32, w2 + P_QS + 32);
    const __m512i v2 = ld2(w + P_QS + 64, w2 + P_QS + 64), v3 = ld2(w + P_QS + 96, w2 + P_QS + 96);
    const __m512i u0 = _mm512_and_si512(v0, low4), u1 = _mm512_and_si512(v1, low4);
    const __m512i u2 = _mm512_and_si512(v2, low4), u3 = _mm512_and_si512(v3, low4);
#ifdef PAIR_VNNI
    /* the high nibbles left in place (16 q, up to 240): one and-not
     * each, and their sum shifted down once per token below */
    const __m512i u4 = _mm512_andnot_si512(low4, v0), u5 = _mm512_andnot_si512(low4, v1);
    const __m512i u6 = _mm512_andnot_si512(low4, v2), u7 = _mm512_andnot_si512(low4, v3);
#else
    const __m512i u4 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), low4);
    const __m512i u5 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), low4);
    const __m512i u6 = _mm512_and_si512(_mm512_srli_epi16(v2, 4), low4);
    const __m512i u7 = _mm512_and_si512(_mm512_srli_epi16(v3, 4), low4);
#endif
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        const uint8_t *xb = x + (size_t)c * xs + (size_t)b * XBS;
        const uint8_t *q = xb + X_QS;
#ifdef PAIR_VNNI
        const __m512i z = _mm512_setzero_si512();
        __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, u0, bc4(q)), u1, bc4(q + 4));
        __m512i t = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, u4, bc4(q + 16)), u5, bc4(q + 20));
        s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(s, u2, bc4(q + 8)), u3, bc4(q + 12));
        t = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(t, u6, bc4(q + 24)), u7, bc4(q + 28));
        __m512i isum = _mm512_sub_epi32(_mm512_add_epi32(s, _mm512_srai_epi32(t, 4)), bc4(xb + X_S8));
#else
        __m512i s01 = _mm512_add_epi16(_mm512_maddubs_epi16(u0, bc4(q)), _mm512_maddubs_epi16(u1, bc4(q + 4)));
        __m512i s23 = _mm512_add_epi16(_mm512_maddubs_epi16(u2, bc4(q + 8)), _mm512_maddubs_epi16(u3, bc4(q + 12)));
        __m512i s45 = _mm512_add_epi16(_mm512_maddubs_epi16(u4, bc4(q + 16)), _mm512_maddubs_epi16(u5, bc4(q + 20)));
        __m512i s67 = _mm512_add_epi16(_mm512_maddubs_epi16(u6, bc4(q + 24)), _mm512_maddubs_epi16(u7, bc4(q + 28)));
        __m512i s16 = _mm512_add_epi16(_mm512_add_epi16(s01, s23), _mm512_add_epi16(s45, s67));
        __m512i isum = _mm512_sub_epi32(_mm512_madd_epi16(s16, _mm512_set1_epi16(1)), bc4(xb + X_S8));
#endif
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, bcf(xb + X_D)), acc[c]);
    }
}

INLINE void z4_tile(int64_t nb, const uint8_t *w, size_t gb, int nr, const uint8_t *x, size_t xs, int C, float *y,
                    size_t ys) {
    const uint8_t *w2 = w + gb;
    __m512 acc[LM_PAIR_TILE];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += P4_BYTES, w2 += P4_BYTES) {
        prefetch2(w, w2, P4_BYTES);
        z4_block(w, w2, b, x, xs, C, acc);
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) store16(y + (size_t)c * ys, nr, acc[c]);
}

PAIR_ENTRY(pair_q4_0, 32, P4_BYTES, z4_tile, )

/* ---- Q5_0, Q4_1, Q5_1 ----------------------------------------------------------- */

enum { Z_Q5_0, Z_Q4_1, Z_Q5_1 };
#define P5_BYTES 176  /* Q5_0: d[8], qh[32], qs[128] */
#define P41_BYTES 160 /* Q4_1: d[8], m[8], qs[128] */
#define P51_BYTES 192 /* Q5_1: d[8], m[8], qh[32], qs[128] */

/* avx2_packed.c's p5_bit4 on both groups: bit 4 of the quants in vector
 * k's low (hi = 0) or high (hi = 1) nibbles, as 0x10 where set. Row r's
 * four qh bytes sit in lane r (of its group's half), so the byte pattern
 * is the same in every 128-bit lane. */
INLINE __m512i z5_bit4(__m512i qh, int k, int hi) {
    const int byte = k / 2 + 2 * hi, sh = 4 * (k & 1);
    const __m512i idx = _mm512_broadcast_i32x4(
        _mm_setr_epi32(0x01010101 * byte, 0x01010101 * (4 + byte), 0x01010101 * (8 + byte), 0x01010101 * (12 + byte)));
    const __m512i bit = _mm512_set1_epi32((int)(0x08040201u << sh));
    return _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, idx), bit), _mm512_set1_epi8(0x10));
}

/* Q5_0 (q in 0..31, value q - 16: the offset comes off as 16 sum(x) =
 * 2 s8), Q4_1 and Q5_1 (no offset; then acc = fma(m, sum(x) dx, acc) with
 * sum(x) = s8 / 8), as avx2_packed.c's p5_tile and p1_tile. Without VNNI
 * the eight products sum in two int16 halves of four (Q5_*: pairs up to
 * 2 * 31 * 127 = 7874), or all eight (Q4_1: <= 30480), then pmaddwd. */
INLINE void z5_tile(int kind, int64_t nb, const uint8_t *w, size_t gb, int nr, const uint8_t *x, size_t xs, int C,
                    float *y, size_t ys) {
    const uint8_t *w2 = w + gb;
    const size_t bytes = kind == Z_Q5_0 ? P5_BYTES : kind == Z_Q4_1 ? P41_BYTES : P51_BYTES;
    const size_t qh_at = kind == Z_Q5_0 ? 16 : 32, qs_at = kind == Z_Q5_0 ? 48 : kind == Z_Q4_1 ? 32 : 64;
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512 acc[LM_PAIR_TILE];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += bytes, w2 += bytes) {
        prefetch2(w, w2, bytes);
        const __m512 dw = scales16(w, w2);
        __m512i u[8];
        if (kind == Z_Q4_1) {
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m512i v = ld2(w + qs_at + 32 * k, w2 + qs_at + 32 * k);
                u[k] = _mm512_and_si512(v, low4);
                u[k + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
            }
        } else {
            const __m512i qh = ld2(w + qh_at, w2 + qh_at);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m512i v = ld2(w + qs_at + 32 * k, w2 + qs_at + 32 * k);
                u[k] = _mm512_or_si512(_mm512_and_si512(v, low4), z5_bit4(qh, k, 0));
                u[k + 4] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), low4), z5_bit4(qh, k, 1));
            }
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const uint8_t *xb = x + (size_t)c * xs + (size_t)b * XBS;
            const uint8_t *q = xb + X_QS;
#ifdef PAIR_VNNI
            const __m512i z = _mm512_setzero_si512();
            __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, u[0], bc4(q)), u[1], bc4(q + 4));
            __m512i t = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, u[4], bc4(q + 16)), u[5], bc4(q + 20));
            s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(s, u[2], bc4(q + 8)), u[3], bc4(q + 12));
            t = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(t, u[6], bc4(q + 24)), u[7], bc4(q + 28));
            __m512i isum = _mm512_add_epi32(s, t);
#else
            const __m512i ones = _mm512_set1_epi16(1);
            __m512i s0 = _mm512_add_epi16(
                _mm512_add_epi16(_mm512_maddubs_epi16(u[0], bc4(q)), _mm512_maddubs_epi16(u[1], bc4(q + 4))),
                _mm512_add_epi16(_mm512_maddubs_epi16(u[2], bc4(q + 8)), _mm512_maddubs_epi16(u[3], bc4(q + 12))));
            __m512i s1 = _mm512_add_epi16(
                _mm512_add_epi16(_mm512_maddubs_epi16(u[4], bc4(q + 16)), _mm512_maddubs_epi16(u[5], bc4(q + 20))),
                _mm512_add_epi16(_mm512_maddubs_epi16(u[6], bc4(q + 24)), _mm512_maddubs_epi16(u[7], bc4(q + 28))));
            __m512i isum = kind == Z_Q4_1 ? _mm512_madd_epi16(_mm512_add_epi16(s0, s1), ones)
                                          : _mm512_add_epi32(_mm512_madd_epi16(s0, ones), _mm512_madd_epi16(s1, ones));
#endif
            const __m512 dx = bcf(xb + X_D);
            if (kind == Z_Q5_0) {
                isum = _mm512_sub_epi32(isum, _mm512_slli_epi32(bc4(xb + X_S8), 1));
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dx), acc[c]);
            } else {
                const __m512 mw = scales16(w + 16, w2 + 16);
                const __m512 sx = _mm512_cvtepi32_ps(_mm512_srai_epi32(bc4(xb + X_S8), 3));
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dx), acc[c]);
                acc[c] = _mm512_fmadd_ps(mw, _mm512_mul_ps(sx, dx), acc[c]);
            }
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) store16(y + (size_t)c * ys, nr, acc[c]);
}

PAIR_ENTRY(pair_q5_0, 32, P5_BYTES, z5_tile, Z_Q5_0, )
PAIR_ENTRY(pair_q4_1, 32, P41_BYTES, z5_tile, Z_Q4_1, )
PAIR_ENTRY(pair_q5_1, 32, P51_BYTES, z5_tile, Z_Q5_1, )

/* ---- Q8_0 ------------------------------------------------------------------ */

INLINE void z8_tile(int64_t nb, const uint8_t *w, size_t gb, int nr, const uint8_t *x, size_t xs, int C, float *y,
                    size_t ys) {
    const uint8_t *w2 = w + gb;
    __m512 acc[LM_PAIR_TILE];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += P8_BYTES, w2 += P8_BYTES) {
        prefetch2(w, w2, P8_BYTES);
        const __m512 dw = scales16(w, w2);
        __m512i v[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) v[k] = ld2(w + P_QS + 32 * k, w2 + P_QS + 32 * k);
#ifdef PAIR_VNNI
            /* w + 128 as unsigned bytes */
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) v[k] = _mm512_xor_si512(v[k], _mm512_set1_epi8((char)0x80));
#else
        __m512i u[8];
        __mmask64 neg[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            u[k] = _mm512_abs_epi8(v[k]);
            neg[k] = _mm512_movepi8_mask(v[k]);
        }
#endif
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const uint8_t *xb = x + (size_t)c * xs + (size_t)b * XBS;
            const uint8_t *q = xb + X_QS;
#ifdef PAIR_VNNI
            const __m512i z = _mm512_setzero_si512();
            __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, v[0], bc4(q)), v[1], bc4(q + 4));
            __m512i t = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, v[4], bc4(q + 16)), v[5], bc4(q + 20));
            s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(s, v[2], bc4(q + 8)), v[3], bc4(q + 12));
            t = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(t, v[6], bc4(q + 24)), v[7], bc4(q + 28));
            __m512i isum = _mm512_sub_epi32(_mm512_add_epi32(s, t), _mm512_slli_epi32(bc4(xb + X_S8), 4));
#else
            const __m512i ones = _mm512_set1_epi16(1), z = _mm512_setzero_si512();
            __m512i p[8];
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                const __m512i xk = bc4(q + 4 * k);
                p[k] = _mm512_madd_epi16(_mm512_maddubs_epi16(u[k], _mm512_mask_sub_epi8(xk, neg[k], z, xk)), ones);
            }
            __m512i isum =
                _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(p[0], p[1]), _mm512_add_epi32(p[2], p[3])),
                                 _mm512_add_epi32(_mm512_add_epi32(p[4], p[5]), _mm512_add_epi32(p[6], p[7])));
#endif
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, bcf(xb + X_D)), acc[c]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) store16(y + (size_t)c * ys, nr, acc[c]);
}

PAIR_ENTRY(pair_q8_0, 32, P8_BYTES, z8_tile, )

/* ---- Q4_K ------------------------------------------------------------------ */

INLINE void zk4_tile(int64_t nb, const uint8_t *w, size_t gb, int nr, const uint8_t *x, size_t xs, int C, float *y,
                     size_t ys) {
    const uint8_t *w2 = w + gb;
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512 acc[LM_PAIR_TILE];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += PK_BYTES, w2 += PK_BYTES) {
        prefetch2(w, w2, PK_BYTES);
        __m512i scv[8], mv[4];
        k4x16_scales(w, w2, 0, scv, mv); /* the scale in both int16 halves */
        __m512i isum[LM_PAIR_TILE];
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) isum[c] = _mm512_setzero_si512();
#pragma GCC unroll 2
        for (int j = 0; j < 8; j++) { /* sub-block j: the low (j even) or high nibbles of pair j / 2 */
            const size_t qo = PK_QS + 256 * (size_t)(j / 2);
            __m512i u[8];
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                const __m512i v = ld2(w + qo + 32 * k, w2 + qo + 32 * k);
                u[k] = _mm512_and_si512(j & 1 ? _mm512_srli_epi16(v, 4) : v, low4);
            }
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const uint8_t *xc = x + (size_t)c * xs + (size_t)b * X8K_BYTES + X8K_QS + 32 * j;
                __m512i s16 = _mm512_maddubs_epi16(u[0], bc4(xc));
#pragma GCC unroll 8
                for (int k = 1; k < 8; k++) s16 = _mm512_add_epi16(s16, _mm512_maddubs_epi16(u[k], bc4(xc + 4 * k)));
#ifdef PAIR_VNNI
                isum[c] = _mm512_dpwssd_epi32(isum[c], s16, scv[j]);
#else
                isum[c] = _mm512_add_epi32(isum[c], _mm512_madd_epi16(s16, scv[j]));
#endif
            }
        }
        const __m512 d = scales16(w, w2), dmin = scales16(w + PK_DMIN, w2 + PK_DMIN);
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const uint8_t *xb = x + (size_t)c * xs + (size_t)b * X8K_BYTES;
            const __m512 dx = bcf(xb);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(d, dx), acc[c]);
            acc[c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(k4x16_minsum(mv, xb)), _mm512_mul_ps(dmin, dx), acc[c]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) store16(y + (size_t)c * ys, nr, acc[c]);
}

PAIR_ENTRY(pair_q4_K, QK_K, PK_BYTES, zk4_tile, )

lm_packed_gemm_fn LM_VFN(pair_kernel)(uint32_t type) {
    switch (type) {
        case LM_TYPE_Q4_0: return pair_q4_0;
        case LM_TYPE_Q8_0: return pair_q8_0;
        case LM_TYPE_Q5_0: return pair_q5_0;
        case LM_TYPE_Q4_1: return pair_q4_1;
        case LM_TYPE_Q5_1: return pair_q5_1;
        case LM_TYPE_Q4_K: return pair_q4_K;
        default: return NULL;
    }
}

#else /* another architecture, or the sanitizer builds (kernels/x86.h) */

lm_packed_gemm_fn LM_VFN(pair_kernel)(uint32_t type) {
    (void)type;
    return NULL;
}

#endif
