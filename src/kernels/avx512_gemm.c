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
 * prefetchers follow: the loops prefetch both.
 *
 * Results: lane r of chain (j, c) is segment j of row r for token c, an
 * fmaf chain from zero over the segment's elements in order; the output is
 * (s0 + s1) + (s2 + s3). That is quant_panel_dot_ref step for step,
 * whatever nc, the token's place in the tile or nr, so the outputs equal
 * the reference's and the AVX2 panel tile's bit for bit (tests compare
 * them with memcmp): results do not depend on the batch, and decode and
 * prefill agree.
 *
 * Many tokens (kernels/matmul.c, the panel path): the conversion (two uops on the
 * FMA ports per column, one per C FMAs) and the single group per
 * broadcast bound the tile above. avx512_panel_widen_block widens a block
 * of columns of a group once into floats that stay in L1, and
 * avx512_gemm_panel2_f32 runs two groups by up to 12 tokens over them:
 * per column two loads and 12 broadcasts feed 24 FMAs (24 chains), and no
 * conversion. The chains are carried between column blocks in a small
 * state (per token and group: the open segment's chain, s0 + s1, s2), each
 * segment's chain starts from zero and is folded exactly as panel_wide
 * folds it, so the outputs are the same bits (tests compare them with
 * quant_panel_dot_ref's). Throughput figures: bench/README.md (Kernels);
 * the dated runs are in bench/results/kernels.md.
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
            for (int c = 0; c < C; c++) acc[j][c] = _mm512_fmadd_ps(w[j], _mm512_set1_ps(xb[c][j * q + k]), acc[j][c]);
    }
    if (j0 + S == LM_PANEL_SEGS)
        for (int64_t k = LM_PANEL_SEGS * q; k < n; k++) { /* the last segment's extra elements */
            const __m512 w = ld16(p + 16 * k);
#pragma GCC unroll 7
            for (int c = 0; c < C; c++) acc[S - 1][c] = _mm512_fmadd_ps(w, _mm512_set1_ps(xr[c][k]), acc[S - 1][c]);
        }
}

/* One group by C tokens (rows of x xs bytes apart). */
INLINE void panel_tile(int64_t n, const uint16_t *p, int nr, const uint8_t *x, size_t xs, int C, float *y, size_t ys) {
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
 * floats), continuing one chain per token: acc[c]. */
INLINE void chain(int64_t k0, int64_t k1, const uint16_t *p, const float *const *xr, int C, __m512 acc[TILE]) {
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

/* The same from zero. */
INLINE void seg1(int64_t k0, int64_t k1, const uint16_t *p, const float *const *xr, int C, __m512 acc[TILE]) {
#pragma GCC unroll 12
    for (int c = 0; c < C; c++) acc[c] = _mm512_setzero_ps();
    chain(k0, k1, p, xr, C, acc);
}

/* One group by C = 8..TILE tokens: one segment at a time with C chains
 * (one conversion per C FMAs), s0 + s1 and s2 waiting on the stack. */
INLINE void panel_wide(int64_t n, const uint16_t *p, int nr, const uint8_t *x, size_t xs, int C, float *y, size_t ys) {
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

void avx512_gemm_panel_f16(int64_t n, const void *wp, int nr, const void *x, size_t xs, int nc, float *y, size_t ys) {
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
#define WIDE(C)                                                                                                        \
    case C: panel_wide(n, p, nr, xb, xs, C, y, ys); break;
            /* clang-format off */
        WIDE(8) WIDE(9) WIDE(10) WIDE(11) WIDE(12)
#undef WIDE
        default: break;
            /* clang-format on */
    }
}

/* Elements [a, b) of two groups' widened columns (w0, w1: element a of
 * each, 16 floats per element) for C tokens (xr[c]: token c's floats):
 * each broadcast x[k] feeds both groups' chains, acc0[c] and acc1[c]. */
INLINE void chain2(int64_t a, int64_t b, const float *w0, const float *w1, const float *const *xr, int C,
                   __m512 acc0[TILE], __m512 acc1[TILE]) {
    const float *xa[TILE];
#pragma GCC unroll 12
    for (int c = 0; c < C; c++) {
        xa[c] = xr[c] + a;
        __asm__("" : "+r"(xa[c]));
    }
    for (int64_t i = 0; i < b - a; i++) {
        if ((i & 15) == 0)
#pragma GCC unroll 12
            for (int c = 0; c < C; c++) _mm_prefetch((const char *)(xa[c] + i + X_AHEAD), _MM_HINT_T0);
        const __m512 v0 = _mm512_loadu_ps(w0 + 16 * i), v1 = _mm512_loadu_ps(w1 + 16 * i);
#pragma GCC unroll 12
        for (int c = 0; c < C; c++) {
            const __m512 xv = _mm512_set1_ps(xa[c][i]);
            acc0[c] = _mm512_fmadd_ps(v0, xv, acc0[c]);
            acc1[c] = _mm512_fmadd_ps(v1, xv, acc1[c]);
        }
    }
}

/* Fold a finished segment j's chains (acc) into the state t (16 floats
 * each: open chain, s0 + s1, s2) as panel_wide folds them; the last
 * segment stores rows [0, nr) of the output at y. */
INLINE void fold(int j, float *t, __m512 acc, float *y, int nr) {
    if (j == 0) _mm512_storeu_ps(t + 16, acc);
    else if (j == 1) _mm512_storeu_ps(t + 16, _mm512_add_ps(_mm512_loadu_ps(t + 16), acc));
    else if (j == 2) _mm512_storeu_ps(t + 32, acc);
    else if (nr > 0)
        store16(y, nr, _mm512_add_ps(_mm512_loadu_ps(t + 16), _mm512_add_ps(_mm512_loadu_ps(t + 32), acc)));
}

/* Two groups (rows [0, nr0) and [16, 16 + nr1) of y; nr1 = 0: one) by C
 * tokens over elements [k0, k1) of widened columns wf (group g's element
 * k at wf + 16 (g (k1 - k0) + k - k0)), chains carried in st (per token
 * and group 48 floats, at st + 96 c + 48 g). */
INLINE void part2_tile(int64_t n, int64_t k0, int64_t k1, const float *wf, int nr0, int nr1, const uint8_t *x,
                       size_t xs, int C, float *st, float *y, size_t ys) {
    const int64_t q = n / LM_PANEL_SEGS, kn = k1 - k0;
    const float *xr[TILE];
#pragma GCC unroll 12
    for (int c = 0; c < TILE; c++) xr[c] = (const float *)(const void *)(x + (size_t)(c < C ? c : 0) * xs);
    const float *w1b = nr1 > 0 ? wf + 16 * kn : wf;
    __m512 acc0[TILE], acc1[TILE];
    for (int j = 0; j < LM_PANEL_SEGS; j++) {
        const int64_t s0 = j * q, s1 = j == LM_PANEL_SEGS - 1 ? n : (j + 1) * q;
        const int64_t a = k0 > s0 ? k0 : s0, b = k1 < s1 ? k1 : s1;
        if (a >= b) continue;
#pragma GCC unroll 12
        for (int c = 0; c < C; c++) {
            acc0[c] = a == s0 ? _mm512_setzero_ps() : _mm512_loadu_ps(st + 96 * c);
            acc1[c] = a == s0 ? _mm512_setzero_ps() : _mm512_loadu_ps(st + 96 * c + 48);
        }
        chain2(a, b, wf + 16 * (a - k0), w1b + 16 * (a - k0), xr, C, acc0, acc1);
        if (b < s1) {
#pragma GCC unroll 12
            for (int c = 0; c < C; c++) {
                _mm512_storeu_ps(st + 96 * c, acc0[c]);
                _mm512_storeu_ps(st + 96 * c + 48, acc1[c]);
            }
            continue;
        }
#pragma GCC unroll 12
        for (int c = 0; c < C; c++) {
            fold(j, st + 96 * c, acc0[c], y + (size_t)c * ys, nr0);
            fold(j, st + 96 * c + 48, acc1[c], y + (size_t)c * ys + 16, nr1);
        }
    }
}

void avx512_gemm_panel2_f32(int64_t n, int64_t k0, int64_t k1, const float *wf, int nr0, int nr1, const void *x,
                            size_t xs, int nc, float *st, float *y, size_t ys) {
    const uint8_t *xb = x;
    switch (nc) {
#define PART(C)                                                                                                        \
    case C: part2_tile(n, k0, k1, wf, nr0, nr1, xb, xs, C, st, y, ys); break;
        /* clang-format off */
        PART(1) PART(2) PART(3) PART(4) PART(5) PART(6) PART(7) PART(8) PART(9) PART(10) PART(11) PART(12)
#undef PART
        default: break;
        /* clang-format on */
    }
}

void avx512_panel_widen_block(const void *wp, int64_t k0, int64_t k1, float *wf) {
    const uint16_t *p = (const uint16_t *)wp + 16 * k0;
    for (int64_t i = 0; i < k1 - k0; i++) _mm512_storeu_ps(wf + 16 * i, ld16(p + 16 * i));
}

/* The entries laid over both avx512 variants' (the F16 tile width stays
 * the AVX2 tile's: 6 tokens). */
static const lm_avx2_kernels f16_entries = {.packed_gemm = avx512_gemm_panel_f16, .pack_tile = TILE};

const lm_avx2_kernels *avx512_gemm_kernels(uint32_t type, bool vnni) {
    (void)vnni;
    return type == LM_TYPE_F16 ? &f16_entries : NULL;
}

void avx512_gemm_panel2_lookup(uint32_t type, lm_panel_widen_fn *widen, lm_panel2_fn *tile) {
    *widen = type == LM_TYPE_F16 ? avx512_panel_widen_block : NULL;
    *tile = type == LM_TYPE_F16 ? avx512_gemm_panel2_f32 : NULL;
}

#else /* not x86, or the variants left out */

void avx512_gemm_panel2_lookup(uint32_t type, lm_panel_widen_fn *widen, lm_panel2_fn *tile) {
    (void)type;
    *widen = NULL;
    *tile = NULL;
}

const lm_avx2_kernels *avx512_gemm_kernels(uint32_t type, bool vnni) {
    (void)type;
    (void)vnni;
    return NULL;
}

#endif
