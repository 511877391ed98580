/*
 * neon_ops.h - the element-wise ops of the forward pass and the attention
 * inner loops in AArch64 NEON (neon_ops.c, plain Armv8-A: both NEON
 * variants use them). The kernel table (kernels/dispatch.c) hands them out
 * on AArch64 only; the attention loops for a head_dim that is a multiple of
 * 4. Contracts: those of the scalar versions (kernels/scalar.h,
 * kernels/kernels.h) and of kernels/avx2_attn.h:
 *
 *  - rmsnorm sums squares in double and scales like the reference; RoPE
 *    gives the reference's bits (same products and differences, no fma);
 *    SiLU and GELU use a 4-lane exp (~1 ulp), so they agree with the
 *    reference to a few ulps. Every element goes through the same vector
 *    code whatever n is (a tail in a padded vector), so a token's result
 *    does not depend on how many share the call.
 *  - attention: P·V is one fma chain per output element over the keys in
 *    order (bit for bit the fmaf chains); row max and scaling are exact;
 *    scores are dot products in eight fma lanes (a few ulps from the
 *    reference's eight partial sums); exp_sum uses the same 4-lane exp.
 */
#ifndef LAMINA_NEON_OPS_H
#define LAMINA_NEON_OPS_H

#if defined(__aarch64__)
void neon_rmsnorm(float *y, const float *x, const float *w, int n, float eps);
void neon_swiglu(float *g, const float *u, int n);
void neon_geglu(float *g, const float *u, int n);
/* x = gelu_tanh(x) in place, geglu's activation (the product by u = 1 left out). */
void neon_gelu(float *x, int n);
void neon_rope(float *x, int n_heads, int head_dim, int n_rot, const float *cs, int neox);

void neon_attn_scores(const float *Q, int R, int hd, const float *const *krow, int nk, float *S, int s_stride);
void neon_attn_pv(float *O, int R, int hd, const float *P, int p_stride, const float *const *vrow, int nk);
float neon_attn_max(const float *x, int n);
void neon_attn_scale(float *dst, const float *src, int n, float c);
float neon_attn_exp_sum(float *x, int n, float m);
#endif

#endif
