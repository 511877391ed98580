/*
 * avx512bf16_dot.c - the avx512bf16 variant: BF16 weights through
 * vdpbf16ps (AVX512_BF16), every other type as avx512vnni.
 *
 * The variant is avx512vnni plus AVX512_BF16 (cpu.c: CPUID leaf 7 subleaf
 * 1 EAX bit 5). Its lookup, avx512bf16_kernels(), returns avx512vnni's
 * kernels for every type but BF16, whose vec_dot and gemm are here:
 *
 *   - the F32 activations are rounded to BF16 (vcvtne2ps2bf16: round to
 *     nearest even, denormals to zero), 32 at a time;
 *   - each output has ONE 16-lane float accumulator; for the groups of 32
 *     elements of the row in order, from zero, acc = vdpbf16ps(acc, w, x):
 *     lane i adds the two products of elements 2i and 2i + 1 of the group
 *     (each product of two BF16 values is exact in float; the additions
 *     round to nearest, denormal results flushed to zero);
 *   - a last partial group is read with masked loads (zeros past the row);
 *   - the 16 lanes are summed in one fixed order (hsum16).
 * A tile runs its outputs together but each with that same sequence, so
 * gemm outputs equal vec_dot's bit for bit whatever nr and nc are, and a
 * token's outputs do not depend on the batch: the batch-invariance
 * guarantee holds within this variant.
 *
 * Not bit-identical to the F32-accumulate path of the other x86 variants
 * (those keep the activations in float). The bound, against the float64
 * dot of the BF16 weights and the F32 activations, is
 *     |y - sum w_i x_i| <= (2^-8 + (n / 16 + 8) * 2^-24) * sum |w_i x_i|
 * (2^-8: the activations' rounding to 8 significant bits; then one
 * rounding per addition: two per group per lane and four in the final sum),
 * plus what flushing denormals loses (below 2^-126 per product). Against
 * the float64 dot with the activations already rounded to BF16 only the
 * second term remains. tests/test_kernels_x86.c checks both.
 *
 * Compiled with the avx512vnni flags and -mavx512bf16 (Makefile); nothing
 * here runs unless dispatch.c found the variant on this CPU. Off x86, and
 * in the sanitizer builds (LAMINA_X86_BASE_ONLY), the lookup returns NULL.
 */
#include "kernels/x86.h"

#if (defined(__x86_64__) || defined(__i386__)) && X86_VARIANTS

#if !defined(__AVX512BF16__) || !defined(__AVX512BW__) || !defined(__AVX512VL__)
#error "avx512bf16_dot.c must be compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16"
#endif

#include <assert.h>
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

/* Weight bytes read this far ahead are prefetched (as the AVX2 kernels). */
#define PREFETCH_AHEAD 4096

/* Sum of the 16 lanes in one fixed order: halves, quarters, pairs, the two. */
INLINE float hsum16(__m512 v) {
    __m256 h =
        _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 BF16 weights (64 bytes), the first `left` of them when left < 32. */
INLINE __m512bh wload(const uint8_t *p, int left) {
    if (left >= 32) return (__m512bh)_mm512_loadu_si512((const void *)p);
    return (__m512bh)_mm512_maskz_loadu_epi16((__mmask32)((1u << left) - 1), (const void *)p);
}

/* 32 floats rounded to BF16 pairs, the first `left` of them when left < 32. */
INLINE __m512bh xload(const float *x, int left) {
    if (left >= 32) return _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
    const __mmask16 lo = (__mmask16)(left >= 16 ? 0xFFFFu : (1u << left) - 1);
    const __mmask16 hi = (__mmask16)(left > 16 ? (1u << (left - 16)) - 1 : 0);
    return _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + 16), _mm512_maskz_loadu_ps(lo, x));
}

/* One group of 32 elements (the first `left` of them) of R weight rows
 * (ws bytes apart) against C activation rows (xs bytes apart): each
 * activation group is rounded once, each weight group loaded once. */
INLINE void bf16_step(const uint8_t *w, size_t ws, int R, const float *x, size_t xs, int C, int left,
                      __m512 acc[4][4]) {
    __m512bh xv[4];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) xv[c] = xload((const float *)(const void *)((const uint8_t *)x + (size_t)c * xs), left);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const uint8_t *wr = w + (size_t)r * ws;
        _mm_prefetch((const char *)((uintptr_t)wr + PREFETCH_AHEAD), _MM_HINT_T0);
        _mm_prefetch((const char *)((uintptr_t)wr + PREFETCH_AHEAD + 63), _MM_HINT_T0);
        const __m512bh wv = wload(wr, left);
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], wv, xv[c]);
    }
}

/* R <= 4 weight rows by C <= 4 activation rows over the whole row:
 * y[c * ys + r] = row r . token c. Constants after inlining. */
INLINE void bf16_tile(int64_t n, const uint8_t *w, size_t ws, int R, const uint8_t *x, size_t xs, int C, float *y,
                      size_t ys) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
    const float *xf = (const float *)(const void *)x;
    const int64_t nf = n / 32 * 32;
    for (int64_t i = 0; i < nf; i += 32) bf16_step(w + (size_t)i * 2, ws, R, xf + i, xs, C, 32, acc);
    if (nf < n) bf16_step(w + (size_t)nf * 2, ws, R, xf + nf, xs, C, (int)(n - nf), acc);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) y[(size_t)c * ys + (size_t)r] = hsum16(acc[r][c]);
}

static float avx512bf16_vec_dot_bf16(int64_t n, const void *w, const void *x) {
    float y;
    bf16_tile(n, w, 0, 1, x, 0, 1, &y, 1);
    return y;
}

static void avx512bf16_gemm_bf16(int64_t n, const void *w, size_t ws, int nr, const void *x, size_t xs, int nc,
                                 float *y, size_t ys) {
    assert(nr >= 0 && nr <= LM_GEMM_TILE && nc >= 0 && nc <= LM_GEMM_TILE && n >= 0);
    _Static_assert(LM_GEMM_TILE == 4, "the cases below assume 4");
#define BT(R, C)                                                                                                       \
    case R * 8 + C:                                                                                                    \
        bf16_tile(n, w, ws, R, x, xs, C, y, ys);                                                                       \
        break;
#define BROW(R) BT(R, 1) BT(R, 2) BT(R, 3) BT(R, 4)
    switch (nr * 8 + nc) { BROW(1) BROW(2) BROW(3) BROW(4) default : break; }
#undef BROW
#undef BT
}

static const lm_avx2_kernels bf16_entry = {
    .vec_dot = avx512bf16_vec_dot_bf16, .gemm = avx512bf16_gemm_bf16, .gemm_cols = 4};

const lm_avx2_kernels *avx512bf16_kernels(uint32_t type) {
    return type == LM_TYPE_BF16 ? &bf16_entry : avx512vnni_kernels(type);
}

#else /* not x86, or the sanitizer builds (kernels/x86.h): no kernels */

const lm_avx2_kernels *avx512bf16_kernels(uint32_t type) {
    (void)type;
    return NULL;
}

#endif
