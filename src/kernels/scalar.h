/*
 * scalar.h - the portable scalar kernels of the element-wise ops and of
 * attention (scalar.c): the reference that defines what every ISA's variant
 * computes, and what the kernel table holds under LAMINA_NO_SIMD=1 or on a
 * CPU without a faster ISA. The tensor types' references (conversions and
 * dot products) are in format/quant.c.
 *
 * Contracts: lm_ew_kernels and lm_attn_kernels (kernels/kernels.h), and
 * kernels/avx2_attn.h for the attention loops. Plain C, no ISA flags; loops
 * written so compilers may vectorize them without changing their order of
 * float operations (no -ffast-math anywhere).
 */
#ifndef LAMINA_SCALAR_H
#define LAMINA_SCALAR_H

/* ---- element-wise ---- */
void scalar_rmsnorm(float *y, const float *x, const float *w, int n, float eps);
void scalar_swiglu(float *g, const float *u, int n);
void scalar_geglu(float *g, const float *u, int n);
void scalar_gelu(float *x, int n);
void scalar_rope(float *x, int n_heads, int head_dim, int n_rot, const float *cs, int neox);
/* The FMA-rate probe (kernels.h): rounds x SCALAR_PEAK_FLOPS flops of
 * independent multiply-adds in registers. */
#define SCALAR_PEAK_FLOPS 16
float scalar_fma_probe(long rounds);

/* ---- attention ---- */
void scalar_attn_scores(const float *Q, int R, int hd, const float *const *krow, int nk, float *S, int s_stride);
void scalar_attn_pv(float *O, int R, int hd, const float *P, int p_stride, const float *const *vrow, int nk);
/* The same against F16 / Q8_0 rows (kernels.h's fused entries). */
void scalar_attn_scores_f16(const float *Q, int R, int hd, const void *const *krow, int nk, float *S, int s_stride,
                            const void *const *pf, int npf);
void scalar_attn_pv_f16(float *O, int R, int hd, const float *P, int p_stride, const void *const *vrow, int nk,
                        const void *const *pf, int npf);
void scalar_attn_pv_q8_0(float *O, int R, int hd, const float *P, int p_stride, const void *const *vrow, int nk,
                         const void *const *pf, int npf);
/* Q8_0 scores against Q8_0 query rows by integer dot products (kernels.h's
 * lm_attn_scores_q8q_fn: this defines its bits). */
void scalar_attn_scores_q8_0_q8(const void *Qq, int R, int hd, const void *const *krow, int nk, float *S, int s_stride,
                                const void *const *pf, int npf);
float scalar_attn_max(const float *x, int n);
void scalar_attn_scale(float *dst, const float *src, int n, float c);
float scalar_attn_exp_sum(float *x, int n, float m);

#endif
