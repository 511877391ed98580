/*
 * deltanet.h - the kernels of a gated-DeltaNet linear-attention layer
 * (the recurrent layers of Qwen3-Next and Qwen3.5): their contracts, shapes
 * and bounds, the kernel-table entry that holds them (lm_dn_kernels,
 * kernels()->dn), and the scalar reference (kernels/deltanet.c) that
 * defines what every variant computes.
 *
 * The layer, per token x (after the layer's RMSNorm), with H_k key heads
 * of dk and H_v value heads of dv (H_v a multiple of H_k):
 *
 *   qkv = W_qkv x  (2 H_k dk + H_v dv)   z = W_gate x  (H_v dv)
 *   a = W_alpha x, b = W_beta x  (H_v each)              matrix products
 *   g, beta = gates(a, b)          g = A softplus(a + dt_bias) <= 0,
 *                                  beta = sigmoid(b), A = -exp(A_log)
 *   c = silu(conv(qkv))            causal depthwise conv over K taps
 *   q, k = l2norm of each head of c's first two parts; v = the rest
 *   per value head h, with the key head the model maps it to:
 *       S = exp(g) S;  delta = beta (v - S^T k);  S = S + k delta^T;
 *       o = scale S^T q                        (scale = 1 / sqrt(dk))
 *   y = norm_gated(o, z) per value head: rmsnorm(o) * w * silu(z)
 *   out = W_out y                                        matrix product
 *
 * The state S of a head is (dk, dv) row-major: S[i * dv + j], i a key
 * dimension, j a value dimension (llama.cpp keeps the transpose). `recur`
 * runs the recurrence token by token (decode); `chunk` computes the same
 * outputs and final state chunkwise, LM_DN_CHUNK tokens at a time (the
 * WY form of the delta rule, for prompts): within a chunk of n tokens
 * with cumulative log decays G_t = g_0 + ... + g_t and the state S0 it
 * starts from,
 *
 *   A[t][s] = beta_t exp(G_t - G_s) k_t.k_s  (s < t)
 *   R_t = beta_t (v_t - exp(G_t) S0^T k_t),  D = (I + A)^-1 R
 *   o_t = scale (exp(G_t) q_t^T S0 + sum_{s<=t} exp(G_t - G_s) (q_t.k_s) D_s)
 *   S = exp(G_{n-1}) S0 + sum_s exp(G_{n-1} - G_s) k_s D_s^T
 *
 * D_t is the delta of token t, found by forward substitution (the WY form
 * of the reference implementations writes D = U - W S0 with U = (I +
 * A)^-1 diag(beta) V and W = (I + A)^-1 diag(beta exp(G)) K: the same
 * matrix; solving for D at once leaves out W, whose rows shrink as
 * exp(G_t) and go subnormal within a chunk). Both forms are held to a
 * float64 recurrence within the tolerances the tests state
 * (tests/test_deltanet.c), and to each other.
 *
 * Bounds: 1 <= dk, dv <= LM_DN_MAX_DIM; 1 <= K <= LM_DN_CONV_MAX (a
 * state of K - 1 rows); every g <= 0 (a decay of at most 1: the chunk form
 * exponentiates differences G_t - G_s of a chunk, which then stay <= 0),
 * 0 <= beta <= 1, and q, k rows of norm 1 (or 0); the kernels do not
 * check these. Both forms take a decay factor e^x (e^g, exp(G_t - G_s),
 * e^G_t) with x < LM_DN_DECAY_MIN as 0: e^-40 = 4e-18, far under the float
 * resolution of the terms beside it, and the cut keeps subnormal floats
 * (each a microcode assist on x86: prompts took 20 times as long) out of
 * the products. Every variant's element results depend only on the element's
 * own inputs, never on how many tokens or channels share the call: `conv`
 * over n tokens equals n calls of one token bit for bit, and the recurrence
 * equals one call per token bit for bit.
 */
#ifndef LAMINA_DELTANET_H
#define LAMINA_DELTANET_H

#include <stdbool.h>
#include <stddef.h>

#define LM_DN_CHUNK 64          /* tokens per chunk of the chunkwise form */
#define LM_DN_DECAY_MIN (-40.0) /* decay factors e^x with x below count as 0 */
#define LM_DN_MAX_DIM 256       /* largest dk and dv */
#define LM_DN_CONV_MAX 8        /* most conv taps */

/* One head's run of tokens for the delta rule. Rows are read at strides
 * so a head can be taken in place from the layer's (tokens, heads * dim)
 * buffers. */
typedef struct {
    const float *q, *k;    /* token t's (dk) at q + t * qk_stride, k + t * qk_stride, L2-normed */
    const float *v;        /* token t's (dv) at v + t * v_stride */
    const float *g, *beta; /* token t's log decay and write strength at g[t * gb_stride], beta[t * gb_stride] */
    float *o;              /* token t's output (dv) at o + t * o_stride; overlaps no input */
    size_t qk_stride, v_stride, gb_stride, o_stride;
    int n_tok, dk, dv;
    float scale; /* o = scale S^T q; 1 / sqrt(dk) in Qwen3-Next and Qwen3.5 */
} lm_dn_seq;

/* The kernel-table entry (kernels()->dn). */
typedef struct {
    /* Causal depthwise conv with a rolling state, then SiLU when silu.
     * x, y: (n_tok, ld), channel c of token t at [t * ld + c], c < n_ch;
     * w: (k, ld), tap i of channel c at w[i * ld + c], tap k - 1 on the
     * current token (GGUF's ssm_conv1d is (channels, k), taps contiguous:
     * a loader transposes it); state: (k - 1, ld), the k - 1 inputs
     * before x, oldest first, replaced by the last k - 1 rows of
     * [state; x]. y[t][c] = act(sum_{i<k} w[i][c] in[t + i][c]) with in =
     * [state; x]. y overlaps neither x nor state. A channel range of a
     * wider buffer is its pointers offset by the first channel, same ld
     * (threads split channels that way). n_tok >= 0, n_ch >= 1. */
    void (*conv)(float *y, const float *x, float *state, const float *w, int n_tok, int n_ch, int k, size_t ld,
                 bool silu);
    /* y = x / max(sqrt(sum x^2), eps) over n (the sum in double, as
     * ggml_l2_norm); y may alias x. */
    void (*l2norm)(float *y, const float *x, int n, float eps);
    /* y = x / sqrt(mean(x^2) + eps) * w * silu(z) over n (the sum in
     * double); y may alias x or z. */
    void (*norm_gated)(float *y, const float *x, const float *w, const float *z, int n, float eps);
    /* For n heads: g = A * softplus(a + dt_bias), beta = sigmoid(b), with
     * softplus(u) = u above 20, else log(1 + e^u); A is GGUF's ssm_a
     * (-exp(A_log)), dt_bias its ssm_dt.bias. */
    void (*gates)(float *g, float *beta, const float *a, const float *b, const float *A, const float *dt_bias, int n);
    /* The recurrence over s->n_tok tokens, S (dk, dv) in place. */
    void (*recur)(float *S, const lm_dn_seq *s);
    /* The same outputs and final state, chunkwise; work: dn_chunk_work()
     * floats of scratch. */
    void (*chunk)(float *S, const lm_dn_seq *s, float *work);
} lm_dn_kernels;

/* Floats of scratch `chunk` needs for heads of dk and dv. */
size_t dn_chunk_work(int dk, int dv);

/* The last k - 1 rows of [state; x] into state (conv's contract): the
 * step every variant's conv ends with. */
void dn_conv_roll(float *state, const float *x, int n_tok, int n_ch, int k, size_t ld);

/* The scalar reference (kernels/deltanet.c), plain C with no ISA flags. */
void scalar_dn_conv(float *y, const float *x, float *state, const float *w, int n_tok, int n_ch, int k, size_t ld,
                    bool silu);
void scalar_dn_l2norm(float *y, const float *x, int n, float eps);
void scalar_dn_norm_gated(float *y, const float *x, const float *w, const float *z, int n, float eps);
void scalar_dn_gates(float *g, float *beta, const float *a, const float *b, const float *A, const float *dt_bias,
                     int n);
void scalar_dn_recur(float *S, const lm_dn_seq *s);
void scalar_dn_chunk(float *S, const lm_dn_seq *s, float *work);

/* The SIMD entries laid over k (kernels/avx2_deltanet.c, AVX2 + FMA;
 * kernels/avx512_deltanet.c, AVX-512 F; kernels/neon_deltanet.c, AArch64
 * NEON): true when the file holds them, false (k untouched) off its
 * architecture and, for AVX-512, in the sanitizer builds. Only after the
 * CPU check of that ISA (kernels/dispatch.c). */
bool avx2_dn_fill(lm_dn_kernels *k);
bool avx512_dn_fill(lm_dn_kernels *k);
bool neon_dn_fill(lm_dn_kernels *k);

#endif
