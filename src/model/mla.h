/*
 * mla.h - multi-head latent attention (DeepSeek-V2/V3, GGUF arch deepseek2)
 * over the paged KV cache's latent layout (kv.h), one layer at a time, over
 * the forward pass's flat batch.
 *
 * Per token t, with xb_t the attention-normed residual (qk = qk_nope + r,
 * r = n_rot, R = kv_lora_rank, per head h):
 *   q_t      = q_b · rmsnorm(q_a · xb_t) * q_a_norm     (or attn_q · xb_t)
 *              head h: [q_nope_h (qk_nope), q_pe_h (r)]
 *   [c, k_pe] = kv_a · xb_t;  c_t = rmsnorm(c) * kv_a_norm   (R, then r)
 *   RoPE (adjacent pairs, the layer's angles) on every q_pe_h and on k_pe
 *   the cache row of (layer, t): [c_t, k_pe_t], R + r elements, once for
 *   all heads (kv latent layout: the value is c_t, the row's first R)
 *   absorbed query: q̃_h = [W_UK_hᵀ q_nope_h (R), q_pe_h (r)]
 *   o_h = softmax_j(scale · q̃_h · [c_j, k_pe_j]) · c_j          (R)
 *   out_h = W_UV_h · o_h                                         (v_head_dim)
 * and the caller multiplies [out_0 .. out_{H-1}] by attn_output. Since
 * q̃_h · [c_j, k_pe_j] = q_nope_h · (W_UK_h c_j) + q_pe_h · k_pe_j, this is
 * the decompressed multi-head attention (k_nope = W_UK c, v = W_UV c)
 * exactly, while the cache holds R + r values per token and layer instead
 * of n_head x (qk + v_head_dim), and decode reads only those. The scores
 * are kv/attn.h's attention with one KV head of width R + r (every head a
 * row of its group), scale = 1/sqrt(qk).
 *
 * The per-head products with W_UKᵀ (attn_k_b slices) and W_UV (attn_v_b)
 * run one head per work item across the pool, each on its own thread's
 * gathered rows (ops_matmul on one thread), so a token's result does not
 * depend on the rest of the batch or on the thread count.
 */
#ifndef LAMINA_MLA_H
#define LAMINA_MLA_H

#include <stddef.h>

#include "model/forward.h"
#include "model/model.h"

typedef struct mla_ws mla_ws;

/* Workspace for passes of up to n_batch tokens on n_threads threads (the
 * pool's); NULL with a message when out of memory. Only for a model with
 * latent attention (m->mla). */
mla_ws *mla_ws_new(const lm_model *m, int n_batch, int n_threads, char *err, size_t errlen);
void mla_ws_free(mla_ws *w);
/* The bytes mla_ws_new allocates for these sizes (0 without latent layers). */
size_t mla_ws_bytes(const lm_model *m, int n_batch, int n_threads);

/* Bytes of ops_matmul activation scratch the shared (pool-wide) products
 * need: q_a, q_b, kv_a. */
size_t mla_act_bytes(const lm_model *m, int n_batch);

/* The four phases of a layer's latent attention, run in this order; the
 * forward pass times each as the profile slot (and cost.h op) in brackets:
 *   MLA_PROJ    q (through its bottleneck), [c, k_pe], absorbed q̃ (q/k/v)
 *   MLA_ROPE    c's RMSNorm, RoPE on q_pe and k_pe, cache rows     (rope)
 *   MLA_SCORES  attention in the latent space                      (attention)
 *   MLA_VALUES  out_h = W_UV_h o_h                                 (output) */
typedef enum { MLA_PROJ, MLA_ROPE, MLA_SCORES, MLA_VALUES } mla_phase;

/* One phase of layer li of f's model for the pass's n tokens in segments
 * segs: f->xb (n, n_embd) holds the normed input and f->cs (n, n_rot) this
 * layer's RoPE angles; the phases write each segment's cache rows at its
 * positions and leave the heads' outputs in f->xb (n, n_head * v_head_dim),
 * the input of l->wo. Uses f->q and f->k as scratch between phases. */
void mla_attn(lm_fwd *f, const lm_layer *l, int li, const lm_seg *segs, int n_seg, int n, mla_phase phase);

#endif
