/*
 * ops.h - the element-wise and matrix kernels of the forward pass.
 *
 * Shapes are given in comments as (rows, cols), row-major. Matrix products
 * take a weight in any supported type (quant.h) and float activations; the
 * activations are converted once per call to the weight type's vec_dot_type
 * (e.g. Q8_0 blocks) and every output element is one vec_dot, so a row's
 * result does not depend on how many other rows share the call. A weight
 * with an interleaved copy (lm_weight.packed: every type whose path list
 * reads one, kernels_matmul_packs) is always multiplied through that
 * copy's kernels instead, with the same guarantee (quant.h). Which kernels
 * run (pair, wide or panel tiles, packed, gemm, vec_dot) is the first path
 * of the type's list that takes the product (kernels_matmul_pick,
 * kernels/matmul.c, where the thresholds are); this file only converts the
 * activations and splits the rows over the pool.
 *
 * Every kernel comes from the kernel table (kernels/kernels.h), so
 * LAMINA_NO_SIMD=1 runs the scalar reference of each op.
 */
#ifndef LAMINA_OPS_H
#define LAMINA_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "base/pool.h"

/* y = x / rms(x) * w over n elements (y may alias x). */
void ops_rmsnorm(float *y, const float *x, const float *w, int n, float eps);

/* Precompute the rotation of one position: cs[2i] = cos, cs[2i+1] = sin of
 * pos * scale * base^(-2i/n_rot), i < n_rot/2, angles in double. */
void ops_rope_angles(float *cs, int n_rot, int pos, float base, float scale);
/* The same with each frequency's angle divided by factors[i] (n_rot / 2 of
 * them; NULL: none) and cos and sin multiplied by mscale (phi3 long-rope). */
void ops_rope_angles_ext(float *cs, int n_rot, int pos, float base, float scale, const float *factors, float mscale);
/* YaRN: angle i is pos * theta_i * ((1 - r_i) / factor + r_i), theta_i =
 * base^(-2i/n_rot), so it is the interpolated angle for r_i = 0 and the
 * trained one for r_i = 1, with the ramp r_i = 1 - clamp((i -
 * low) / max(high - low, 0.001), 0, 1): dimensions below low rotate as
 * trained, those past high are interpolated, linear between. cos and sin
 * are multiplied by mscale. Angles in double. */
void ops_rope_angles_yarn(float *cs, int n_rot, int pos, float base, float factor, float low, float high, float mscale);
/* The ramp's ends for n_rot rotated dims trained on n_ctx_orig positions:
 * low = max(0, floor(d(beta_fast))), high = min(n_rot - 1, ceil(d(beta_slow)))
 * with d(b) = n_rot * ln(n_ctx_orig / (2 pi b)) / (2 ln base), the pair index
 * whose wavelength fits b times in the original context. */
void ops_rope_yarn_dims(int n_rot, int n_ctx_orig, float base, float beta_fast, float beta_slow, float *low,
                        float *high);
/* Rotate n_heads heads of head_dim values in place with angles from above. */
void ops_rope_apply(float *x, int n_heads, int head_dim, int n_rot, const float *cs, lm_rope_style style);

/* g[i] = silu(g[i]) * u[i]. */
void ops_swiglu(float *g, const float *u, int n);
/* g[i] = gelu(g[i]) * u[i], GELU in its tanh form. */
void ops_geglu(float *g, const float *u, int n);
/* x[i] = gelu(x[i]) over n values, GELU in its tanh form (the encoders'
 * feed-forward), split over the pool in pieces of whole 8-float groups:
 * each value gets the same bits as ops_geglu's gelu(x) * 1. */
void ops_gelu(lm_pool *pool, float *x, size_t n);
/* gpt-oss's clamped SwiGLU (ggml's swiglu_oai, alpha 1.702, limit 7):
 * x = min(g[i], 7), y = clamp(u[i], -7, 7), g[i] = x·sigmoid(1.702 x)·(y + 1).
 * Scalar: it runs on the few experts' rows a token chose. */
#define OPS_SWIGLU_OAI_ALPHA 1.702f
#define OPS_SWIGLU_OAI_LIMIT 7.0f
void ops_swiglu_oai(float *g, const float *u, int n);

/* Bytes of activation scratch ops_matmul needs for n_tok rows of `cols`
 * inputs against weights of type `type`. */
size_t ops_matmul_scratch(uint32_t type, int64_t cols, int n_tok);

/* y (n_tok, w->rows) = x (n_tok, w->cols) · wᵀ, split over the pool's
 * threads by output rows. scratch: ops_matmul_scratch() bytes. */
void ops_matmul(lm_pool *pool, float *y, const lm_weight *w, const float *x, int n_tok, void *scratch);

/* Several products of the same input (e.g. Q, K and V; gate and up), up to
 * 3, in one pass over the pool with the input converted once; each y[k] is
 * bit-identical to ops_matmul(y[k], w[k]). */
void ops_matmul_multi(lm_pool *pool, int n, float *const *y, const lm_weight *const *w, const float *x, int n_tok,
                      void *scratch);

/* Dequantize row `row` of w into out (w->cols floats). */
void ops_get_row(const lm_weight *w, int64_t row, float *out);

#endif
