/*
 * avx512_gemm.c - 512-bit (zmm) F16 panel tiles for the avx512 and
 * avx512vnni variants (kernels/avx512_gemm.h). Compiled with the avx512
 * flags (Makefile: avx512_*.c); nothing here runs unless dispatch.c found
 * AVX-512 F/BW/VL on this CPU. The sanitizer builds (LAMINA_X86_BASE_ONLY)
 * and other architectures compile only the empty lookup.
 *
 * F16 panels (quant.h): a group's 16 rows of element k are 32 contiguous
 * bytes, so one vcvtph2ps widens them into one zmm, lane r = row r. For
 * each k the tile broadcasts each token's x[k] (an embedded {1to16}
 * memory operand of the FMA) and does one FMA per token: one conversion
 * per C FMAs, where the 256-bit tile needs two conversions and two FMAs
 * per token for the same 16 rows. The 32 vector registers let the tile
 * take up to 12 tokens (pack_tile 12, the AVX2 tile 6): with 1 to 3
 * tokens the four segments of the row run side by side (4 C chains), with
 * 4 to 7 two at a time (segments 0 and 1, then 2 and 3, s0 + s1 kept in
 * registers), with 8 to 12 one at a time (s0 + s1 and s2 on the stack);
 * 8 or more chains cover the FMA latency. A tile's weights and
 * activations come from L2 in up to 14 streams, more than the L1
 * prefetchers follow: the loops prefetch both. Measured on the Xeon
 * (2048 x 256 F16 panels x 512 tokens, one thread, best of 10 on a loaded
 * machine): about 1.5x the AVX2 tile's GFLOP/s.
 *
 * Results: lane r of chain (j, c) is segment j of row r for token c, an
 * fmaf chain from zero over the segment's elements in order; the output is
 * (s0 + s1) + (s2 + s3). That is quant_panel_dot_ref step for step,
 * whatever nc, the token's place in the tile or nr, so the outputs equal
 * the reference's and the AVX2 panel tile's bit for bit (tests compare
 * them with memcmp): results do not depend on the batch, and decode and
 * prefill agree.
 */
#include "kernels/avx512_gemm.h"

#include "kernels/x86.h"

#if (defined(__x86_64__) || defined(__i386__)) && X86_VARIANTS

#if !defined(__AVX512F__) || !defined(__F16C__) || !defined(__FMA__)
#error "avx512_gemm.c must be compiled with the avx512 flags (-mavx512f -mf16c -mfma)"
#endif

#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

/* The 16 rows of element k of the group at p, widened. */
INLINE __m512 ld16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p)); }

/* Rows [0, nr) of v at y. */
INLINE void store16(float *y, int nr, __m512 v) {
    if (nr == 16) _mm512_storeu_ps(y, v);
    else _mm512_mask_storeu_ps(y, (__mmask16)((1u << nr) - 1), v);
}

/* Prefetch distances, in elements of the weight and activation streams:
 * a tile's weights (32 bytes per element) and activations (4 bytes per
 * element and token) come from L2, in up to sixteen streams at once, more
 * than the L1 prefetchers follow. */
#define TILE 12 /* most tokens per call (pack_tile) */
#define W_AHEAD (16 * 32)
#define X_AHEAD 64

/* Segments j0 .. j0 + S - 1 of the group at p (each q elements; segment 3
 * also the tail [4q, n)) for C tokens (xr[c]: token c's floats), side by
 * side: acc[j][c] = segment j0 + j of token c. S and C are constants after
 * inlining. */
INLINE void segs(int S, int j0, int64_t q, int64_t n, const uint16_t *p, const float *const *xr, int C,
                 __m512 acc[4][7]) {
#pragma GCC unroll 4
    for (int j = 0; j < S; j++)
#pragma GCC unroll 7
        for (int c = 0; c < C; c++) acc[j][c] = _mm512_setzero_ps();
    const float *xb[7];
#pragma GCC unroll 7
    for (int c = 0; c < 7; c++) {
        xb[c] = xr[c < C ? c : 0] + j0 * q;
        __asm__("" : "+r"(xb[c])); /* opaque: one base register per token, indexed by k */
    }
    const uint16_t *pw = p + 16 * j0 * q;
    for (int64_t k = 0; k < q; k++) {
#pragma GCC unroll 4
        for (int j = 0; j < S; j++) _mm_prefetch((const char *)(pw + 16 * (j * q + k) + W_AHEAD), _MM_HINT_T0);
        if ((k & 15) == 0)
#pragma GCC unroll 4
            for (int j = 0; j < S; j++)
#pragma GCC unroll 7
                for (int c = 0; c < C; c++) _mm_prefetch((const char *)(xb[c] + j * q + k + X_AHEAD), _MM_HINT_T0);
        __m512 w[4];
#pragma GCC unroll 4
        for (int j = 0; j < S; j++) w[j] = ld16(pw + 16 * (j * q + k));
#pragma GCC unroll 4
        for (int j = 0; j < S; j++)
#pragma GCC unroll 7
            for (int c = 0; c < C; c++)
                acc[j][c] = _mm512_fmadd_ps(w[j], _mm512_set1_ps(xb[c][j * q + k]), acc[j][c]);
    }
    if (j0 + S == LM_PANEL_SEGS)
        for (int64_t k = LM_PANEL_SEGS * q; k < n; k++) { /* the last segment's extra elements */
            const __m512 w = ld16(p + 16 * k);
#pragma GCC unroll 7
            for (int c = 0; c < C; c++) acc[S - 1][c] = _mm512_fmadd_ps(w, _mm512_set1_ps(xr[c][k]), acc[S - 1][c]);
        }
}

/* One group by C tokens (rows of x xs bytes apart). */
INLINE void panel_tile(int64_t n, const uint16_t *p, int nr, const uint8_t *x, size_t xs, int C, float *y,
                       size_t ys) {
    const int64_t q = n / LM_PANEL_SEGS;
    const float *xr[7];
#pragma GCC unroll 7
    for (int c = 0; c < 7; c++) xr[c] = (const float *)(const void *)(x + (size_t)(c < C ? c : 0) * xs);
    __m512 acc[4][7];
    if (C <= 3) {
        segs(4, 0, q, n, p, xr, C, acc);
#pragma GCC unroll 7
        for (int c = 0; c < C; c++)
            store16(y + (size_t)c * ys, nr,
                    _mm512_add_ps(_mm512_add_ps(acc[0][c], acc[1][c]), _mm512_add_ps(acc[2][c], acc[3][c])));
        return;
    }
    __m512 s01[7];
    segs(2, 0, q, n, p, xr, C, acc);
#pragma GCC unroll 7
    for (int c = 0; c < C; c++) s01[c] = _mm512_add_ps(acc[0][c], acc[1][c]);
    segs(2, 2, q, n, p, xr, C, acc);
#pragma GCC unroll 7
    for (int c = 0; c < C; c++)
        store16(y + (size_t)c * ys, nr, _mm512_add_ps(s01[c], _mm512_add_ps(acc[0][c], acc[1][c])));
}

/* Elements [k0, k1) of the group at p for C tokens (xr[c]: token c's
 * floats), one chain per token from zero: acc[c]. */
INLINE void seg1(int64_t k0, int64_t k1, const uint16_t *p, const float *const *xr, int C, __m512 acc[TILE]) {
#pragma GCC unroll 12
    for (int c = 0; c < C; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t k = k0; k < k1; k++) {
        _mm_prefetch((const char *)(p + 16 * k + W_AHEAD), _MM_HINT_T0);
        if (((k - k0) & 15) == 0)
#pragma GCC unroll 12
            for (int c = 0; c < C; c++) _mm_prefetch((const char *)(xr[c] + k + X_AHEAD), _MM_HINT_T0);
        const __m512 w = ld16(p + 16 * k);
#pragma GCC unroll 12
        for (int c = 0; c < C; c++) acc[c] = _mm512_fmadd_ps(w, _mm512_set1_ps(xr[c][k]), acc[c]);
    }
}

/* One group by C = 8..TILE tokens: one segment at a time with C chains
 * (one conversion per C FMAs), s0 + s1 and s2 waiting on the stack. */
INLINE void panel_wide(int64_t n, const uint16_t *p, int nr, const uint8_t *x, size_t xs, int C, float *y,
                       size_t ys) {
    const int64_t q = n / LM_PANEL_SEGS;
    const float *xr[TILE];
#pragma GCC unroll 12
    for (int c = 0; c < TILE; c++) xr[c] = (const float *)(const void *)(x + (size_t)(c < C ? c : 0) * xs);
    _Alignas(64) float s01[TILE][16], s2[TILE][16];
    __m512 acc[TILE];
    seg1(0, q, p, xr, C, acc);
#pragma GCC unroll 12
    for (int c = 0; c < C; c++) _mm512_store_ps(s01[c], acc[c]);
    seg1(q, 2 * q, p, xr, C, acc);
#pragma GCC unroll 12
    for (int c = 0; c < C; c++) _mm512_store_ps(s01[c], _mm512_add_ps(_mm512_load_ps(s01[c]), acc[c]));
    seg1(2 * q, 3 * q, p, xr, C, acc);
#pragma GCC unroll 12
    for (int c = 0; c < C; c++) _mm512_store_ps(s2[c], acc[c]);
    seg1(3 * q, n, p, xr, C, acc);
#pragma GCC unroll 12
    for (int c = 0; c < C; c++)
        store16(y + (size_t)c * ys, nr,
                _mm512_add_ps(_mm512_load_ps(s01[c]), _mm512_add_ps(_mm512_load_ps(s2[c]), acc[c])));
}

void avx512_gemm_panel_f16(int64_t n, const void *wp, int nr, const void *x, size_t xs, int nc, float *y,
                           size_t ys) {
    const uint16_t *p = wp;
    const uint8_t *xb = x;
    switch (nc) {
    case 1: panel_tile(n, p, nr, xb, xs, 1, y, ys); break;
    case 2: panel_tile(n, p, nr, xb, xs, 2, y, ys); break;
    case 3: panel_tile(n, p, nr, xb, xs, 3, y, ys); break;
    case 4: panel_tile(n, p, nr, xb, xs, 4, y, ys); break;
    case 5: panel_tile(n, p, nr, xb, xs, 5, y, ys); break;
    case 6: panel_tile(n, p, nr, xb, xs, 6, y, ys); break;
    case 7: panel_tile(n, p, nr, xb, xs, 7, y, ys); break;
#define WIDE(C) \
    case C: panel_wide(n, p, nr, xb, xs, C, y, ys); break;
    WIDE(8) WIDE(9) WIDE(10) WIDE(11) WIDE(12)
#undef WIDE
    default: break;
    }
}

/* The entries laid over both avx512 variants' (the F16 tile width stays
 * the AVX2 tile's: 6 tokens). */
static const lm_avx2_kernels f16_entries = {.packed_gemm = avx512_gemm_panel_f16, .pack_tile = TILE};

const lm_avx2_kernels *avx512_gemm_kernels(uint32_t type, bool vnni) {
    (void)vnni;
    return type == LM_TYPE_F16 ? &f16_entries : NULL;
}

#else /* not x86, or the variants left out */

const lm_avx2_kernels *avx512_gemm_kernels(uint32_t type, bool vnni) {
    (void)type;
    (void)vnni;
    return NULL;
}

#endif
