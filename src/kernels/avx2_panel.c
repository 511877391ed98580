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
 *
 * Many tokens (model/ops.c, panel_chunk): avx2_panel_widen_cols widens a
 * block of a group's columns to floats once (they stay in L1) and
 * avx2_gemm_panel_kblock runs up to 6 tokens of a block of tokens over
 * them, one group after the other (the 512-bit tile of
 * kernels/avx512_gemm.c takes two groups per broadcast): per column two
 * loads and six broadcasts feed 12 FMAs, and the conversions are done once
 * per block of 48 tokens instead of once per 6. The chains are carried
 * between column blocks in the caller's state (per token and group: the
 * open segment's chain, s0 + s1, s2), each segment's chain starts from zero
 * and is folded exactly as panel_tile folds it, so the outputs are the same
 * bits (tests/test_kernels_kblock.c compares them with
 * quant_panel_dot_ref's). The kernel table takes these only when
 * LAMINA_AVX2_KBLOCK is set (kernels/dispatch.c); bench/README.md ("The
 * AVX2 path") has the figures behind that default, and
 * bench/results/speed.md the dated runs.
 */
#include "kernels/avx2.h"

#if defined(__x86_64__) || defined(__i386__)

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

/* ---- k-blocks: widened columns, chains carried between blocks -------- */

/* Elements [a, b) of one group's widened columns (w: element a, 16 floats
 * per element) for C tokens (xr[c]: token c's floats), continuing the
 * chains acc[c][0] (rows 0-7) and acc[c][1] (rows 8-15). Per column two
 * loads from L1 and C broadcasts feed 2 C FMAs, and nothing is converted:
 * the conversions of panel_seg (two per column, on the FMA ports) are done
 * once per block by avx2_panel_widen_cols, not once per token tile. */
INLINE void chain_f32(int64_t a, int64_t b, const float *w, const float *const *xr, int C, __m256 acc[6][2]) {
    const float *xa[6];
#pragma GCC unroll 6
    for (int c = 0; c < 6; c++) {
        xa[c] = xr[c < C ? c : 0] + a;
        __asm__("" : "+r"(xa[c])); /* opaque: one base register per token, indexed by i */
    }
#pragma GCC unroll 2
    for (int64_t i = 0; i < b - a; i++) {
        if ((i & 15) == 0)
#pragma GCC unroll 6
            for (int c = 0; c < C; c++) _mm_prefetch((const char *)(xa[c] + i + 64), _MM_HINT_T0);
        const __m256 w0 = _mm256_loadu_ps(w + 16 * i), w1 = _mm256_loadu_ps(w + 16 * i + 8);
#pragma GCC unroll 6
        for (int c = 0; c < C; c++) {
            const __m256 v = _mm256_broadcast_ss(xa[c] + i);
            acc[c][0] = _mm256_fmadd_ps(w0, v, acc[c][0]);
            acc[c][1] = _mm256_fmadd_ps(w1, v, acc[c][1]);
        }
    }
}

/* Fold a finished segment j's chain (lo, hi) into the state t (16 floats
 * each: open chain, s0 + s1, s2) as panel_tile folds it: s0, then
 * s0 + s1, then s2, and the last segment stores rows [0, nr) of
 * (s0 + s1) + (s2 + s3) at y. */
INLINE void fold8(int j, float *t, __m256 lo, __m256 hi, float *y, int nr) {
    if (j == 0) {
        _mm256_storeu_ps(t + 16, lo);
        _mm256_storeu_ps(t + 24, hi);
    } else if (j == 1) {
        _mm256_storeu_ps(t + 16, _mm256_add_ps(_mm256_loadu_ps(t + 16), lo));
        _mm256_storeu_ps(t + 24, _mm256_add_ps(_mm256_loadu_ps(t + 24), hi));
    } else if (j == 2) {
        _mm256_storeu_ps(t + 32, lo);
        _mm256_storeu_ps(t + 40, hi);
    } else {
        store_rows(y, nr, _mm256_add_ps(_mm256_loadu_ps(t + 16), _mm256_add_ps(_mm256_loadu_ps(t + 32), lo)),
                   _mm256_add_ps(_mm256_loadu_ps(t + 24), _mm256_add_ps(_mm256_loadu_ps(t + 40), hi)));
    }
}

/* One group (rows [0, nr) of y) by C tokens over elements [k0, k1) of its
 * widened columns wf (element k at wf + 16 (k - k0)), chains carried in st
 * (48 floats per token, 96 apart). */
INLINE void part_tile(int64_t n, int64_t k0, int64_t k1, const float *wf, int nr, const uint8_t *x, size_t xs, int C,
                      float *st, float *y, size_t ys) {
    const int64_t q = n / LM_PANEL_SEGS;
    const float *xr[6];
#pragma GCC unroll 6
    for (int c = 0; c < 6; c++) xr[c] = (const float *)(const void *)(x + (size_t)(c < C ? c : 0) * xs);
    __m256 acc[6][2];
    for (int j = 0; j < LM_PANEL_SEGS; j++) {
        const int64_t s0 = j * q, s1 = j == LM_PANEL_SEGS - 1 ? n : (j + 1) * q;
        const int64_t a = k0 > s0 ? k0 : s0, b = k1 < s1 ? k1 : s1;
        if (a >= b) continue;
#pragma GCC unroll 6
        for (int c = 0; c < C; c++) {
            acc[c][0] = a == s0 ? _mm256_setzero_ps() : _mm256_loadu_ps(st + 96 * c);
            acc[c][1] = a == s0 ? _mm256_setzero_ps() : _mm256_loadu_ps(st + 96 * c + 8);
        }
        chain_f32(a, b, wf + 16 * (a - k0), xr, C, acc);
        if (b < s1) {
#pragma GCC unroll 6
            for (int c = 0; c < C; c++) {
                _mm256_storeu_ps(st + 96 * c, acc[c][0]);
                _mm256_storeu_ps(st + 96 * c + 8, acc[c][1]);
            }
            continue;
        }
#pragma GCC unroll 6
        for (int c = 0; c < C; c++) fold8(j, st + 96 * c, acc[c][0], acc[c][1], y + (size_t)c * ys, nr);
    }
}

void avx2_gemm_panel_kblock(int64_t n, int64_t k0, int64_t k1, const float *wf, int nr0, int nr1, const void *x,
                            size_t xs, int nc, float *st, float *y, size_t ys) {
    const uint8_t *xb = x;
    const int64_t kn = k1 - k0;
    /* the two groups one after another (16 registers hold one group's 12
     * chains); the block's activations are in L1 for the second */
    for (int g = 0; g < (nr1 > 0 ? 2 : 1); g++) {
        const float *w = wf + 16 * kn * g;
        float *sg = st + 48 * g, *yg = y + 16 * g;
        const int nr = g ? nr1 : nr0;
        switch (nc) {
            case 1: part_tile(n, k0, k1, w, nr, xb, xs, 1, sg, yg, ys); break;
            case 2: part_tile(n, k0, k1, w, nr, xb, xs, 2, sg, yg, ys); break;
            case 3: part_tile(n, k0, k1, w, nr, xb, xs, 3, sg, yg, ys); break;
            case 4: part_tile(n, k0, k1, w, nr, xb, xs, 4, sg, yg, ys); break;
            case 5: part_tile(n, k0, k1, w, nr, xb, xs, 5, sg, yg, ys); break;
            case 6: part_tile(n, k0, k1, w, nr, xb, xs, 6, sg, yg, ys); break;
            default: break;
        }
    }
}

void avx2_panel_widen_cols(const void *wp, int64_t k0, int64_t k1, float *wf) {
    const uint16_t *p = (const uint16_t *)wp + 16 * k0;
    for (int64_t i = 0; i < k1 - k0; i++) {
        _mm256_storeu_ps(wf + 16 * i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i))));
        _mm256_storeu_ps(wf + 16 * i + 8,
                         _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i + 8))));
    }
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
