/*
 * avx2_attn.h - the attention kernel's inner loops in AVX2 + FMA + F16C
 * (avx2_attn.c, compiled with -mavx2 -mfma -mf16c). The kernel table
 * (kernels/dispatch.c) hands them to attention only on a CPU with all three
 * and only for a head_dim that is a multiple of 8; kernels/scalar.c holds
 * the scalar versions with the same contracts.
 */
#ifndef LAMINA_AVX2_ATTN_H
#define LAMINA_AVX2_ATTN_H

#include <stdbool.h>

#include "kernels/kernels.h"

/* S[r*s_stride + t] = Q[r*hd .. r*hd+hd) · krow[t][0 .. hd), r < R, t < nk. */
void attn_scores_avx2(const float *Q, int R, int hd, const float *const *krow, int nk, float *S, int s_stride);
/* O[r*hd + d] += Σ_{t < nk} P[r*p_stride + t] * vrow[t][d], r < R, d < hd. */
void attn_pv_avx2(float *O, int R, int hd, const float *P, int p_stride, const float *const *vrow, int nk);
/* The same two against F16 rows, and P·V against Q8_0 rows, converted in
 * registers: the bits of the type's to_float followed by attn_scores_avx2 /
 * attn_pv_avx2. Q8_0 needs hd a multiple of 32 (its keys take the integer
 * scores below). */
void attn_scores_f16_avx2(const float *Q, int R, int hd, const void *const *krow, int nk, float *S, int s_stride,
                          const void *const *pf, int npf);
void attn_pv_f16_avx2(float *O, int R, int hd, const float *P, int p_stride, const void *const *vrow, int nk,
                      const void *const *pf, int npf);
void attn_pv_q8_0_avx2(float *O, int R, int hd, const float *P, int p_stride, const void *const *vrow, int nk,
                       const void *const *pf, int npf);
/* Q8_0 scores against Q8_0 query rows by integer dot products
 * (kernels.h's lm_attn_scores_q8q_fn, the scalar reference's bits), by the
 * sign trick (vpsignb, vpmaddubsw, vpmaddwd). */
void attn_scores_q8_0_q8_avx2(const void *Qq, int R, int hd, const void *const *krow, int nk, float *S, int s_stride,
                              const void *const *pf, int npf);
/* max of x[0 .. n), n >= 1 (no NaNs). */
float attn_max_avx2(const float *x, int n);
/* dst[i] = src[i] * c, i < n (n a multiple of 8; dst may be src). */
void attn_scale_avx2(float *dst, const float *src, int n, float c);
/* x[t] = exp(x[t] - m) for t < n (every x[t] <= m); returns Σ x[t]. */
float attn_exp_sum_avx2(float *x, int n, float m);

/* The avx512 variants' fused entries (avx512_attn.c, compiled with the
 * avx512 flags): the same contracts and the same bits as the three above,
 * 16 lanes wide. Lays them over k's; false (k unchanged) in a build
 * without the x86 variants. */
bool avx512_attn_fill(lm_attn_kernels *k);
/* The VNNI variants' integer Q8_0 scores (scores_q8_0_q8 by vpdpbusd,
 * the same bits): avxvnni's on 256-bit vectors (avxvnni_attn.c, compiled
 * with -mavxvnni), avx512vnni's on 512-bit ones, two keys a vector
 * (avx512vnni_attn.c). Each lays its entry over k's; false (k unchanged) in
 * a build without the x86 variants. */
bool avxvnni_attn_fill(lm_attn_kernels *k);
bool avx512vnni_attn_fill(lm_attn_kernels *k);

#endif
