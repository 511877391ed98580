/*
 * avx512vnni_wide.c - the 512-bit prefill tile of kernels/x86_wide.h for
 * Q4_K: two interleaved groups (16 weight rows) by up to 8 tokens, with
 * vpdpbusd over 64-byte vectors.
 *
 * Compiled with the avx512vnni variant's flags (Makefile); nothing here
 * runs unless dispatch.c found the variant on this CPU.
 *
 * Layout and bounds are kernels/avx2_packed.c's (quant.h describes the
 * groups): a 512-bit vector holds the first group's 32 bytes of a
 * super-block column in its low half and the second group's same 32 bytes
 * in its high half, so lane r and lane 8 + r are the two groups' row r.
 * Per super-block column:
 *  - the 16 rows' 6-bit scales and mins are unpacked once and serve every
 *    token of the tile;
 *  - per sub-block j, its 8 unpacked weight vectors (the low or high
 *    nibbles, 4 quants of each row per 32-bit lane) are formed once and
 *    meet each token's quants: two vpdpbusd chains of four (16 products
 *    per lane each, at most 16 * 15 * 128 = 30720, an int16), each times
 *    the scale through vpdpwssd against the scale in the lane's low int16
 *    (kernels/variant.h): the exact integer sum scale_j * dot_j added
 *    into one int32 per (row, token), as every other Q4_K path forms it;
 *  - the min term from the token's per-sub-block sums (Q8_K bsums), not
 *    per element: sum_j min_j * bsum_j, exact in int32;
 *  - then acc = fma(isum, d * dx, acc) and acc = fnmadd(msum, dmin * dx,
 *    acc), avx2_packed.c's float steps in its order.
 * Each (row, token) lane starts from zero and takes the super-blocks in
 * order, so the result equals packed_gemm's bit for bit.
 *
 * Against the 256-bit packed tile, each instruction covers 16 rows instead
 * of 8, and the unpacked weights are reused by all 8 tokens of the tile
 * instead of 4; the activations' 4-byte groups are broadcast from memory.
 *
 * Q6_K (which Q4_K_M files use for output.weight and some attention V and
 * FFN down matrices) has no interleaved layout: its row-major gemm tile
 * gets a 512-bit form here, two rows per vector (notes at q6k2_block).
 */
#include "kernels/x86_wide.h"

#include "kernels/x86.h"

#if (defined(__x86_64__) || defined(__i386__)) && X86_VARIANTS

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__AVX512VNNI__) ||           \
    !defined(__FMA__) || !defined(__F16C__)
#error "avx512vnni_wide.c must be compiled with the avx512vnni variant's flags"
#endif

#include <assert.h>
#include <immintrin.h>
#include <string.h>

#include "kernels/x86_zmm.h"

#define INLINE static inline __attribute__((always_inline))

_Static_assert(LM_WIDE_TILE == 8, "the unroll pragmas assume 8");

/* Prefetch distance of each of the two weight streams (bytes ahead). */
#ifndef WIDE_AHEAD
#define WIDE_AHEAD 2048
#endif

/* Prefetch [p, p + bytes) + WIDE_AHEAD of both streams (the addresses
 * formed as integers: they may lie past any object; prefetches never fault). */
INLINE void prefetch2(const uint8_t *a, const uint8_t *b, size_t bytes) {
    const uintptr_t pa = (uintptr_t)a + WIDE_AHEAD, pb = (uintptr_t)b + WIDE_AHEAD;
    for (size_t o = 0; o < bytes; o += 64) {
        _mm_prefetch((const char *)(pa + o), _MM_HINT_T0);
        _mm_prefetch((const char *)(pb + o), _MM_HINT_T0);
    }
}

/* Two groups (w, w + gb) by C tokens; C a constant after inlining. */
INLINE void wk4_tile(int64_t nb, const uint8_t *w, size_t gb, int nr, const uint8_t *x, size_t xs, int C, float *y,
                     size_t ys) {
    const uint8_t *w2 = w + gb;
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512 acc[LM_WIDE_TILE];
#pragma GCC unroll 8
    for (int c = 0; c < C; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += PK_BYTES, w2 += PK_BYTES) {
        prefetch2(w, w2, PK_BYTES);
        __m512i scv[8], mv[4];
        k4x16_scales(w, w2, 1, scv, mv); /* the scale in the low int16 (vpdpwssd) */
        const uint8_t *xq = x + (size_t)b * X8K_BYTES + X8K_QS;
        __m512i isum[LM_WIDE_TILE];
#pragma GCC unroll 8
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
            const __m512i sc = scv[j], z = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) {
                const uint8_t *xc = xq + (size_t)c * xs + 32 * j;
                __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, u[0], bc4(xc)), u[1], bc4(xc + 4));
                __m512i t = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, u[4], bc4(xc + 16)), u[5], bc4(xc + 20));
                s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(s, u[2], bc4(xc + 8)), u[3], bc4(xc + 12));
                t = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(t, u[6], bc4(xc + 24)), u[7], bc4(xc + 28));
                isum[c] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(isum[c], s, sc), t, sc);
            }
        }
        const __m512 d = scales16(w, w2), dmin = scales16(w + PK_DMIN, w2 + PK_DMIN);
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            const uint8_t *xb = x + (size_t)c * xs + (size_t)b * X8K_BYTES;
            const __m512 dx = bcf(xb);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(d, dx), acc[c]);
            acc[c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(k4x16_minsum(mv, xb)), _mm512_mul_ps(dmin, dx), acc[c]);
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; c++) store16(y + (size_t)c * ys, nr, acc[c]);
}

static void wide_q4_K(int64_t n, const void *wp, int nr, const void *x, size_t xs, int nc, float *y, size_t ys) {
    assert(n % QK_K == 0 && nr > LM_PACK_ROWS && nr <= 2 * LM_PACK_ROWS && nc >= 1 && nc <= LM_WIDE_TILE);
    const int64_t nb = n / QK_K;
    const size_t gb = (size_t)nb * PK_BYTES;
    switch (nc) {
        case 1: wk4_tile(nb, wp, gb, nr, x, xs, 1, y, ys); break;
        case 2: wk4_tile(nb, wp, gb, nr, x, xs, 2, y, ys); break;
        case 3: wk4_tile(nb, wp, gb, nr, x, xs, 3, y, ys); break;
        case 4: wk4_tile(nb, wp, gb, nr, x, xs, 4, y, ys); break;
        case 5: wk4_tile(nb, wp, gb, nr, x, xs, 5, y, ys); break;
        case 6: wk4_tile(nb, wp, gb, nr, x, xs, 6, y, ys); break;
        case 7: wk4_tile(nb, wp, gb, nr, x, xs, 7, y, ys); break;
        default: wk4_tile(nb, wp, gb, nr, x, xs, 8, y, ys); break;
    }
}

lm_packed_gemm_fn avx512vnni_wide_kernel(uint32_t type) { return type == LM_TYPE_Q4_K ? wide_q4_K : NULL; }

/* ---- Q6_K, row-major ----------------------------------------------------- */

/* The row-major Q6_K gemm tile (kernels/avx2_quant.c's q6k_tile, the
 * avx512vnni variant) with two weight rows per 512-bit vector: row r's 8
 * lanes in the low half, row r + 1's in the high half, each half computing
 * exactly what the 256-bit tile computes for its row (the same chunk
 * order, the same exact int32 lane sums through vpdpbusd and vpdpwssd, the
 * same -32 correction from the bsums, the same fma per super-block, the
 * same final sum of the 8 lanes), so the outputs equal the variant's
 * vec_dot bit for bit. The unpacking of the 6-bit quants and the scales
 * is done once for two rows; each token's 32-byte chunk is broadcast to
 * both halves. A lone last row takes the low half (the high half repeats
 * it and is dropped). */

#define Q6_QL 0
#define Q6_QH 128
#define Q6_SC 192
#define Q6_D 208
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K layout");

/* The 32 bytes at p in both halves. */
INLINE __m512i bc32(const uint8_t *p) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)p));
}

/* Sum of the 8 lanes in avx2_quant.c's hsum8 order. */
INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE float ldf(const uint8_t *p) {
    float v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* One super-block of the rows at a (low half) and b (high half) against
 * C <= 4 tokens' Q8_K blocks (xs bytes apart). */
INLINE void q6k2_block(const uint8_t *a, const uint8_t *b, const uint8_t *xb, size_t xs, int C, __m512 acc[4]) {
    const __m512i low4 = _mm512_set1_epi8(0x0F), top2 = _mm512_set1_epi8(0x30);
    const __m512i s16 = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(a + Q6_SC)))),
        _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(b + Q6_SC))), 1);
    const __m512i lo = _mm512_permutex_epi64(s16, 0x44), hi = _mm512_permutex_epi64(s16, 0xEE);
    __m512i si[4];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) si[c] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i l0 = ld2(a + Q6_QL + 64 * h, b + Q6_QL + 64 * h);
        const __m512i l1 = ld2(a + Q6_QL + 64 * h + 32, b + Q6_QL + 64 * h + 32);
        const __m512i hv = ld2(a + Q6_QH + 32 * h, b + Q6_QH + 32 * h);
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) {
            const __m512i lq = t & 1 ? l1 : l0;
            const __m512i lown = t < 2 ? lq : _mm512_srli_epi16(lq, 4);
            const __m512i top = t == 0 ? _mm512_slli_epi16(hv, 4)
                : t == 1               ? _mm512_slli_epi16(hv, 2)
                : t == 2               ? hv
                                       : _mm512_srli_epi16(hv, 2);
            const __m512i u = _mm512_or_si512(_mm512_and_si512(lown, low4), _mm512_and_si512(top, top2));
            /* the scale in each lane's low int16, zero in the high one:
             * scales[2j] for the first 16 elements of a row, scales[2j + 1]
             * for the rest (one per 128-bit quarter) */
            const __m256i idx =
                _mm256_set_m128i(_mm_set1_epi32((int)(0x80800000u | ((4u * t + 3) << 8) | (4u * t + 2))),
                                 _mm_set1_epi32((int)(0x80800000u | ((4u * t + 1) << 8) | (4u * t))));
            const __m512i sc = _mm512_shuffle_epi8(h ? hi : lo, _mm512_broadcast_i64x4(idx));
            const int j = 4 * h + t;
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const uint8_t *xq = xb + (size_t)c * xs + X8K_QS;
                /* four products u * x per lane, |.| <= 4 * 63 * 128 = 32256, times the scale */
                si[c] =
                    _mm512_dpwssd_epi32(si[c], _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, bc32(xq + 32 * j)), sc);
            }
        }
    }
    const float da = _cvtsh_ss(*(const uint16_t *)(const void *)(a + Q6_D));
    const float db = _cvtsh_ss(*(const uint16_t *)(const void *)(b + Q6_D));
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) { /* q - 32: subtract 32 * sum_j scale_j * bsum_j */
        const uint8_t *xc = xb + (size_t)c * xs;
        const __m512i corr = _mm512_madd_epi16(bc32(xc + X8K_BSUMS), s16);
        const __m512i v = _mm512_sub_epi32(si[c], _mm512_slli_epi32(corr, 5));
        const float dx = ldf(xc);
        const __m512 ds = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(dx * da)),
                                                              _mm256_castps_pd(_mm256_set1_ps(dx * db)), 1));
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), ds, acc[c]);
    }
}

/* R <= 4 rows (pairs, a lone last row in a pair with itself) by C <= 4 tokens. */
INLINE void q6k2_tile(int64_t n, const uint8_t *w, size_t ws, int R, const uint8_t *x, size_t xs, int C, float *y,
                      size_t ys) {
    const int P = (R + 1) / 2;
    __m512 acc[2][4];
    for (int p = 0; p < P; p++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) acc[p][c] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++)
        for (int p = 0; p < P; p++) {
            const uint8_t *wa = w + (size_t)(2 * p) * ws + (size_t)i * sizeof(block_q6_K);
            const uint8_t *wb = 2 * p + 1 < R ? wa + ws : wa;
            prefetch2(wa, wb, sizeof(block_q6_K));
            q6k2_block(wa, wb, x + (size_t)i * sizeof(block_q8_K), xs, C, acc[p]);
        }
    for (int p = 0; p < P; p++)
        for (int c = 0; c < C; c++) {
            y[(size_t)c * ys + (size_t)(2 * p)] = hsum8(_mm512_castps512_ps256(acc[p][c]));
            if (2 * p + 1 < R)
                y[(size_t)c * ys + (size_t)(2 * p + 1)] =
                    hsum8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[p][c]), 1)));
        }
}

/* The gemm entry: one token (or one row) goes to the variant's 256-bit
 * tile, which runs rows one after another (decode). */
void avx512vnni_wide_gemm_q6_K(int64_t n, const void *w, size_t ws, int nr, const void *x, size_t xs, int nc, float *y,
                               size_t ys) {
    assert(nr >= 0 && nr <= LM_GEMM_TILE && nc >= 0 && nc <= LM_GEMM_TILE && n % QK_K == 0);
    if (nr < 2 || nc < 2) {
        avx512vnni_gemm_q6_K(n, w, ws, nr, x, xs, nc, y, ys);
        return;
    }
#define Q6T(R, C)                                                                                                      \
    case R * 8 + C: q6k2_tile(n, w, ws, R, x, xs, C, y, ys); break;
    switch (nr * 8 + nc) {
        Q6T(2, 2) Q6T(2, 3) Q6T(2, 4) Q6T(3, 2) Q6T(3, 3) Q6T(3, 4) Q6T(4, 2) Q6T(4, 3) Q6T(4, 4) default : break;
    }
#undef Q6T
}

#else /* another architecture, or the sanitizer builds (kernels/x86.h) */

lm_packed_gemm_fn avx512vnni_wide_kernel(uint32_t type) {
    (void)type;
    return NULL;
}

/* Never reached: without the variant nothing holds it (kept so that code
 * naming it links). */
void avx512vnni_wide_gemm_q6_K(int64_t n, const void *w, size_t ws, int nr, const void *x, size_t xs, int nc, float *y,
                               size_t ys) {
    (void)n, (void)w, (void)ws, (void)nr, (void)x, (void)xs, (void)nc, (void)y, (void)ys;
}

#endif
