/*
 * avxvnni_attn.c - the avxvnni variant's Q8_0 scores by integer dot
 * products (kernels.h: scores_q8_0_q8): kernels/x86_attn_q8.h's 256-bit
 * kernel with VEX vpdpbusd. vpdpbusd multiplies unsigned by signed bytes,
 * so the key's bytes go in offset by 128 (k ^ 0x80 read as unsigned) and
 * each lane starts from -128 times the sum of its four query bytes, which
 * cancels the offset exactly: the integer sums, and hence every score,
 * are the scalar reference's bits.
 *
 * Compiled with the AVX2 flags and -mavxvnni (Makefile: avxvnni_*.c); the
 * sanitizer builds (LAMINA_X86_BASE_ONLY) and other architectures hold only
 * a fill that returns false.
 */
#include "kernels/avx2_attn.h"

#include "kernels/x86.h"

#if (defined(__x86_64__) || defined(__i386__)) && X86_VARIANTS

#if !defined(__AVXVNNI__) || !defined(__AVX2__) || !defined(__F16C__) || !defined(__FMA__)
#error "avxvnni_attn.c must be compiled with the AVX2 flags and -mavxvnni"
#endif

#include <immintrin.h>

#define Q8Q_PREP(k) _mm256_xor_si256(k, _mm256_set1_epi8((char)0x80))
#define Q8Q_QPREP(q)                                                                                                   \
    _mm256_sub_epi32(_mm256_setzero_si256(),                                                                           \
                     _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), q))
#define Q8Q_IDOT(b, kp, k, q) _mm256_dpbusd_avx_epi32(b, kp, q)
#define Q8Q_FN avxvnni_scores_q8_0_q8
static void Q8Q_FN(const void *Qq, int R, int hd, const void *const *krow, int nk, float *S, int s_stride,
                   const void *const *pf, int npf);
#include "kernels/x86_attn_q8.h"

bool avxvnni_attn_fill(lm_attn_kernels *k) {
    k->scores_q8_0_q8 = avxvnni_scores_q8_0_q8;
    return true;
}

#else

bool avxvnni_attn_fill(lm_attn_kernels *k) { return false; }

#endif
