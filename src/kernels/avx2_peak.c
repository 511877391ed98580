/*
 * avx2_peak.c - the FMA-rate probe (avx2_peak.h): twelve independent
 * accumulators of 8 floats, each updated by one fused multiply-add per
 * round, so two FMA ports with a latency of four or five cycles stay busy
 * and nothing is read from memory. 12 x 8 x 2 = 192 flops per round.
 */
#include "kernels/avx2_peak.h"

#if defined(__x86_64__) || defined(__i386__) /* elsewhere the file is empty (the table keeps the scalar probe) */

#include <immintrin.h>

float avx2_fma_probe(long rounds) {
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    __m256 c0 = _mm256_set1_ps(0.0f), c1 = _mm256_set1_ps(0.1f), c2 = _mm256_set1_ps(0.2f), c3 = _mm256_set1_ps(0.3f),
           c4 = _mm256_set1_ps(0.4f), c5 = _mm256_set1_ps(0.5f), c6 = _mm256_set1_ps(0.6f), c7 = _mm256_set1_ps(0.7f),
           c8 = _mm256_set1_ps(0.8f), c9 = _mm256_set1_ps(0.9f), c10 = _mm256_set1_ps(1.0f), c11 = _mm256_set1_ps(1.1f);
    /* named accumulators, so they stay in registers */
    for (long r = 0; r < rounds; r++) {
        c0 = _mm256_fmadd_ps(c0, a, b);
        c1 = _mm256_fmadd_ps(c1, a, b);
        c2 = _mm256_fmadd_ps(c2, a, b);
        c3 = _mm256_fmadd_ps(c3, a, b);
        c4 = _mm256_fmadd_ps(c4, a, b);
        c5 = _mm256_fmadd_ps(c5, a, b);
        c6 = _mm256_fmadd_ps(c6, a, b);
        c7 = _mm256_fmadd_ps(c7, a, b);
        c8 = _mm256_fmadd_ps(c8, a, b);
        c9 = _mm256_fmadd_ps(c9, a, b);
        c10 = _mm256_fmadd_ps(c10, a, b);
        c11 = _mm256_fmadd_ps(c11, a, b);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                             _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11)));
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[7];
}

#endif
