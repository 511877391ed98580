/*
 * avx2_panel.c - AVX2 + FMA + F16C matrix tiles for F16 weights in the
 * panel layout of quant.h (groups of 16 rows, stored column by column: the
 * 16 rows' element k side by side in 32 bytes), against F32 activations.
 * Compiled with -mavx2 -mfma -mf16c; nothing here runs unless
 * cpu_has_avx2() said yes.
 *
 * An outer product per element: for each k, the group's 16 weights are
 * loaded and widened once (two 8-lane vectors, lane r = row r) and each
 * token's x[k] is broadcast from memory into all lanes, then one FMA per
 * (half-group, token). With 6 tokens that is 12 FMAs for 2 conversions
 * and 6 broadcasts (load ports only), against 12 FMAs for 7 conversions in
 * the row-major dot-product tile: the FMA units, not the F16 conversions,
 * set the pace. The 12 accumulators, the two weight vectors and one
 * broadcast fill the 16 registers; no horizontal sums. The loop over k is
 * unrolled twice and each token's row has its own base register indexed by
 * k (otherwise the compiler rebuilds token addresses from one pointer with
 * LEAs every step): 44 instructions per 24 FMAs instead of 54, which counts
 * when another tenant shares the core and instructions, not FMAs, are the
 * limit.
 *
 * Each (row, token) has its own accumulator lanes: the row splits into four
 * segments (quant.h), each an fmaf chain acc = fma(w[k], x[k], acc) from
 * zero in order, summed as (s0 + s1) + (s2 + s3): exactly
 * quant_panel_dot_ref, whatever the tile width, the token's place in it or
 * the number of rows, so every product of a panel matrix gives the same
 * bits for a (row, token) and the results do not depend on the batch. One
 * token runs the segments side by side (eight chains hide the FMA
 * latency), several tokens one segment after another (twelve chains
 * already do).
 */
#include "kernels/variant.h" /* first: the variant's names (built once per variant, Makefile) */

#include "kernels/avx2.h"

#if LM_VARIANT_ON

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "avx2_panel.c must be compiled with -mavx2 -mfma -mf16c"
#endif

#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

/* Rows [0, nr) of one panel tile from the 16 lanes of lo (rows 0-7) and
 * hi (rows 8-15). */
INLINE void store_rows(float *y, int nr, __m256 lo, __m256 hi) {
    if (nr == 16) {
        _mm256_storeu_ps(y, lo);
        _mm256_storeu_ps(y + 8, hi);
        return;
    }
    _Alignas(32) float t[16];
    _mm256_store_ps(t, lo);
    _mm256_store_ps(t + 8, hi);
    memcpy(y, t, (size_t)nr * sizeof(float));
}

/* Elements [k0, k1) of the group at p against C tokens (rows of x xs bytes
 * apart), each (row, token) lane its own fmaf chain from zero; C a
 * constant after inlining. */
INLINE void panel_seg(int64_t k0, int64_t k1, const uint16_t *p, const uint8_t *x, size_t xs, int C, __m256 acc[6][2]) {
#pragma GCC unroll 6
    for (int c = 0; c < 6; c++) acc[c][0] = acc[c][1] = _mm256_setzero_ps();
    const float *xr[6];
#pragma GCC unroll 6
    for (int c = 0; c < 6; c++) {
        xr[c] = (const float *)(const void *)(x + (size_t)(c < C ? c : 0) * xs);
        __asm__("" : "+r"(xr[c])); /* opaque: one base register per token, indexed by k */
    }
#pragma GCC unroll 2
    for (int64_t k = k0; k < k1; k++) {
        const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 16 * k)));
        const __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 16 * k + 8)));
#pragma GCC unroll 6
        for (int c = 0; c < C; c++) {
            const __m256 b = _mm256_broadcast_ss(xr[c] + k);
            acc[c][0] = _mm256_fmadd_ps(w0, b, acc[c][0]);
            acc[c][1] = _mm256_fmadd_ps(w1, b, acc[c][1]);
        }
    }
}

/* Several tokens: the four segments one after another, each with the 12
 * accumulators; s0 + s1 and s2 + s3 wait on the stack. */
INLINE void panel_tile(int64_t n, const uint16_t *p, int nr, const uint8_t *x, size_t xs, int C, float *y, size_t ys) {
    const int64_t q = n / LM_PANEL_SEGS;
    _Alignas(32) float part[2][6][16]; /* s0 + s1, s2 + s3 */
    __m256 acc[6][2];
    for (int j = 0; j < LM_PANEL_SEGS; j++) {
        panel_seg(j * q, j == LM_PANEL_SEGS - 1 ? n : (j + 1) * q, p, x, xs, C, acc);
        float(*pt)[16] = part[j / 2];
#pragma GCC unroll 6
        for (int c = 0; c < C; c++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256 v = j % 2 ? _mm256_add_ps(_mm256_load_ps(pt[c] + 8 * h), acc[c][h]) : acc[c][h];
                _mm256_store_ps(pt[c] + 8 * h, v);
            }
    }
#pragma GCC unroll 6
    for (int c = 0; c < C; c++)
        store_rows(y + (size_t)c * ys, nr, _mm256_add_ps(_mm256_load_ps(part[0][c]), _mm256_load_ps(part[1][c])),
                   _mm256_add_ps(_mm256_load_ps(part[0][c] + 8), _mm256_load_ps(part[1][c] + 8)));
}

/* One token (decode): the four segments side by side, eight independent
 * chains to cover the FMA latency, four streams through the group. */
INLINE void panel_one(int64_t n, const uint16_t *p, int nr, const float *x, float *y) {
    const int64_t q = n / LM_PANEL_SEGS;
    __m256 a[LM_PANEL_SEGS][2];
#pragma GCC unroll 4
    for (int j = 0; j < LM_PANEL_SEGS; j++) a[j][0] = a[j][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < q; k++) {
#pragma GCC unroll 4
        for (int j = 0; j < LM_PANEL_SEGS; j++) {
            const int64_t kk = j * q + k;
            const __m256 b = _mm256_broadcast_ss(x + kk);
            a[j][0] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 16 * kk))), b,
                                      a[j][0]);
            a[j][1] = _mm256_fmadd_ps(
                _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 16 * kk + 8))), b, a[j][1]);
        }
    }
    for (int64_t kk = LM_PANEL_SEGS * q; kk < n; kk++) { /* the last segment's extra elements */
        const __m256 b = _mm256_broadcast_ss(x + kk);
        a[3][0] =
            _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 16 * kk))), b, a[3][0]);
        a[3][1] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 16 * kk + 8))), b,
                                  a[3][1]);
    }
    store_rows(y, nr, _mm256_add_ps(_mm256_add_ps(a[0][0], a[1][0]), _mm256_add_ps(a[2][0], a[3][0])),
               _mm256_add_ps(_mm256_add_ps(a[0][1], a[1][1]), _mm256_add_ps(a[2][1], a[3][1])));
}

void avx2_packed_gemm_f16(int64_t n, const void *wp, int nr, const void *x, size_t xs, int nc, float *y, size_t ys) {
    const uint16_t *p = wp;
    const uint8_t *xb = x;
    switch (nc) {
        case 1: panel_one(n, p, nr, x, y); break;
        case 2: panel_tile(n, p, nr, xb, xs, 2, y, ys); break;
        case 3: panel_tile(n, p, nr, xb, xs, 3, y, ys); break;
        case 4: panel_tile(n, p, nr, xb, xs, 4, y, ys); break;
        case 5: panel_tile(n, p, nr, xb, xs, 5, y, ys); break;
        case 6: panel_tile(n, p, nr, xb, xs, 6, y, ys); break;
        default: break;
    }
}

#endif
