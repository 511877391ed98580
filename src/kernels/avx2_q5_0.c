/*
 * avx2_q5_0.c - Q5_0 · Q8_0 with AVX2.
 *
 * Per block of 32: the 16 bytes of nibbles become 32 bytes 0..15 (low
 * nibbles then high nibbles, which is element order), bit j of qh is spread
 * to byte j and supplies bit 4, 16 is subtracted to give int8 in [-16, 15],
 * and the integer dot with the activations is formed with the usual sign
 * trick (|w| as unsigned times sign-adjusted x, pairwise sums). The block's
 * integer sum is scaled by d_w * d_x and accumulated with FMA.
 */
#if defined(__x86_64__) || defined(__i386__)
#include "kernels/avx2_q5_0.h"

#include <immintrin.h>
#include <string.h>

#include "quant.h"
#include "util.h"

/* Byte j of the result is 0xFF when bit j of bits is set. */
static inline __m256i spread_bits(uint32_t bits) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0);
    const __m256i mask = _mm256_set1_epi64x((long long)0x7fbfdfeff7fbfdfeULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    v = _mm256_or_si256(v, mask);
    return _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
}

float avx2_vec_dot_q5_0(int64_t n, const void *w, const void *x) {
    const block_q5_0 *a = w;
    const block_q8_0 *b = x;
    __m256 acc = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i ones16 = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < n / QK5_0; i++) {
        __m128i raw = _mm_loadu_si128((const __m128i *)a[i].qs);
        __m256i q = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
        q = _mm256_and_si256(q, low4);
        uint32_t qh;
        memcpy(&qh, a[i].qh, 4);
        __m256i hi = _mm256_and_si256(spread_bits(qh), _mm256_set1_epi8(0x10));
        q = _mm256_sub_epi8(_mm256_or_si256(q, hi), _mm256_set1_epi8(16));
        __m256i y = _mm256_loadu_si256((const __m256i *)b[i].qs);
        __m256i ax = _mm256_sign_epi8(q, q);
        __m256i sy = _mm256_sign_epi8(y, q);
        __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), ones16);
        float d = lm_f16_to_f32(a[i].d) * lm_f16_to_f32(b[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(dot), acc);
    }
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

void avx2_gemm_q5_0(int64_t n, const void *w, size_t w_stride, int nr, const void *x, size_t x_stride, int nc,
                    float *y, size_t y_stride) {
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < nr; r++)
            y[(size_t)c * y_stride + r] =
                avx2_vec_dot_q5_0(n, (const char *)w + (size_t)r * w_stride, (const char *)x + (size_t)c * x_stride);
}
#endif
