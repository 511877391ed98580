/*
 * gdn.h - a gated-DeltaNet linear-attention layer (the recurrent layers of
 * Qwen3.5 and Qwen3-Next, GGUF archs qwen35* and qwen3next) over the
 * forward pass's flat batch, each segment's sequence carrying its own
 * state instead of KV rows.
 *
 * Per token t of a segment, with xb_t the attention-normed residual and the
 * layer's lm_gdn (model.h; kernels/deltanet.h gives the math):
 *   qkv_t = W_qkv xb_t, z_t = W_z xb_t, a_t = W_alpha xb_t, b_t = W_beta xb_t
 *     (qwen3next: one product with the fused ssm_ba, whose rows hold per
 *     key head its hv/hk betas then its hv/hk alphas, split into a_t, b_t;
 *     in older files qkv_t and z_t too come from one product, ssm_in's,
 *     per key head [q | k | its values | their z], split the same way)
 *   g_t, beta_t = gates(a_t, b_t)               (per value head)
 *   c_t = silu(conv(qkv)) over [the sequence's conv window; its rows]
 *   q, k: c_t's first two parts, each head L2-normed; v: the rest
 *   per value head h (key head h % hk; h / (hv/hk) with hp.ssm_grouped,
 *   qwen3next): the delta rule on the sequence's state S_h,
 *   o_h = S_h^T q / sqrt(dk)
 *   y_t = per head rmsnorm(o_h) * norm * silu(z_h);  out_t = W_out y_t
 * leaving out_t in f->hb (n, n_embd) for the residual add. The delta rule
 * runs a segment in pieces that end on multiples of GDN_CHUNK positions
 * (its first piece from pos0 to the next multiple, then whole chunks, then
 * the rest): a piece of more than one token in the chunkwise form, a piece
 * of one token in the recurrence. So a sequence's results depend only on
 * where its segments begin, not on how the rest of a run is grouped: fed
 * in segments that split at multiples of GDN_CHUNK (or at positions where
 * every feed splits, as a prompt's end), it gets the same bits. The state
 * is left at the segment's last token.
 *
 * A verification segment (lm_seg.ck: speculative decoding) runs the conv
 * and the recurrence one token at a time instead, as decoding runs them
 * (the same bits as feeding its tokens one per pass), and after token i
 * writes the layer's window and matrices into the checkpoint of position
 * pos0 + i + 1 (rstate_ckpt_layer: the store's layer l.rec - pp.rec0, a
 * pipeline stage's store holding its own layers), so the engine can roll
 * the state back to any verified position.
 *
 * The state of segment g (lm_seg.rconv, .rmat, indexed by the layer's
 * lm_layer.rec): conv window (K - 1, conv) oldest row first, and per value
 * head the (dk, dv) matrix, contiguous by head. Both are updated in place.
 *
 * Threads: the products over the pool; the conv per segment over channel
 * ranges; the delta rule one (segment, value head) per work item. A token's
 * result does not depend on the rest of the batch or the thread count.
 */
#ifndef LAMINA_GDN_H
#define LAMINA_GDN_H

#include <stddef.h>

#include "model/forward.h"
#include "model/model.h"

#define GDN_CHUNK 64 /* positions the delta rule's pieces end on: kernels/deltanet.h's LM_DN_CHUNK */

typedef struct gdn_ws gdn_ws;

/* Workspace for passes of up to n_batch tokens on n_threads threads; NULL
 * with a message when out of memory. Only for a model with recurrent layers. */
gdn_ws *gdn_ws_new(const lm_model *m, int n_batch, int n_threads, char *err, size_t errlen);
void gdn_ws_free(gdn_ws *w);
/* The bytes gdn_ws_new allocates (0 without recurrent layers). */
size_t gdn_ws_bytes(const lm_model *m, int n_batch, int n_threads);
/* Bytes of ops_matmul activation scratch the layer's products need. */
size_t gdn_act_bytes(const lm_model *m, int n_batch);

/* A sequence's state, in floats: the conv window and the matrices of one
 * recurrent layer. */
size_t gdn_conv_floats(const lm_hparams *hp);
size_t gdn_mat_floats(const lm_hparams *hp);

/* Layer l (recurrent) of f's model for the pass's n tokens in segments
 * segs: xb (n, n_embd) normed in, the layer's output (n, n_embd) in f->hb. */
void gdn_layer(lm_fwd *f, const lm_layer *l, const lm_seg *segs, int n_seg, int n);

#endif
