/*
 * avx2_ops.h - element-wise operations of the forward pass in AVX2 + FMA
 * (avx2_ops.c). The kernel table (kernels/dispatch.c) hands them out only
 * after a CPUID check; kernels/scalar.c holds the scalar versions with the
 * same contracts.
 *
 * Every element goes through the same vector code whatever n is (a tail
 * shorter than 8 is processed in a padded vector), so an element's result
 * depends only on its inputs: a token's activations do not change with the
 * number of tokens processed together.
 */
#ifndef LAMINA_AVX2_OPS_H
#define LAMINA_AVX2_OPS_H

/* y = x / sqrt(mean(x^2) + eps) * w (sum of squares in double). */
void avx2_rmsnorm(float *y, const float *x, const float *w, int n, float eps);
/* g = silu(g) * u = g / (1 + e^-g) * u. */
void avx2_swiglu(float *g, const float *u, int n);
/* g = gelu_tanh(g) * u = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * u. */
void avx2_geglu(float *g, const float *u, int n);
/* x = gelu_tanh(x) in place, geglu's activation (the product by u = 1 left out). */
void avx2_gelu(float *x, int n);
/* RoPE on n_heads heads of head_dim floats at x: the first n_rot dims of
 * each head rotated by the angles cs = (cos, sin) pairs, as ops_rope_apply;
 * neox picks the halves layout (pairs i, i + n_rot/2), else adjacent pairs. */
void avx2_rope_apply(float *x, int n_heads, int head_dim, int n_rot, const float *cs, int neox);

#endif
