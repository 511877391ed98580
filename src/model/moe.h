/*
 * moe.h - the Mixture-of-Experts FFN of one layer over a flat batch.
 *
 * For each token t of the batch (xb row t, the FFN-normed residual):
 *   p = softmax(router · xb_t) over n_expert experts (sigmoid per expert
 *       when hp.moe_sigmoid, DeepSeek-V3)
 *   chosen = the n_expert_used largest p (+ the layer's probs_bias where it
 *       has one; ties: the lower expert id),
 *   w_e = p_e, divided by their sum when hp.moe_norm_w, times hp.moe_scale
 *       when that is neither 0 nor 1
 *   (gpt-oss, hp.moe_topk_softmax: the scores plus the router's bias, the top
 *       n_expert_used of them chosen, w_e a softmax over the chosen scores)
 *   out_t = Σ_{e in chosen, ascending e} w_e · down_e(silu(gate_e·xb_t) ⊙ up_e·xb_t)
 *           (gpt-oss: a bias after each of the three products, and the
 *            clamped SwiGLU ops_swiglu_oai in place of silu(g) ⊙ u)
 *           (+ sigmoid(shexp_gate·xb_t) · shared(xb_t) when the layer has a shared expert;
 *            deepseek2's shared experts have no gate: + shared(xb_t))
 *
 * Execution groups the batch's tokens by expert: every expert that any token
 * chose runs once, on the rows of all the tokens that chose it (gathered into
 * one contiguous block), so its weights are read once per pass however many
 * tokens chose it. One expert's work is moe_expert_run, which reads only
 * that expert's weights, the gathered rows and their routing weights, and
 * adds into the output rows of its tokens: the unit expert parallelism
 * places on ranks (ep.h: each rank runs its experts on the rows sent to it,
 * the outputs go back to be summed where the token lives, in this order). A token's sum is taken in
 * ascending expert order whatever else is in the batch, and each product's
 * row does not depend on the other rows (ops_matmul), so a token's result
 * is the same alone or batched.
 */
#ifndef LAMINA_MOE_H
#define LAMINA_MOE_H

#include <stddef.h>

#include "model/model.h"
#include "base/pool.h"

typedef struct moe_ws moe_ws;

/* Workspace for passes of up to n_batch tokens; NULL with a message when
 * out of memory. Call only for a model with experts (m->moe). */
moe_ws *moe_ws_new(const lm_model *m, int n_batch, char *err, size_t errlen);
/* The bytes moe_ws_new allocates (the struct and its buffers). */
size_t moe_ws_bytes(const lm_model *m, int n_batch);
void moe_ws_free(moe_ws *w);

/* Bytes of ops_matmul activation scratch the MoE products need. */
size_t moe_act_bytes(const lm_model *m, int n_batch);

/* xb (n, n_embd) in, replaced by layer l's MoE FFN output (n, n_embd).
 * act: moe_act_bytes() of scratch. Counts the experts run in *n_run when
 * not NULL. */
void moe_ffn(moe_ws *w, lm_pool *pool, const lm_model *m, const lm_layer *l, float *xb, int n, void *act, int *n_run);

/* Layer moe's router over xb (n, n_embd): *sel and *selw point at the
 * workspace's (n, n_expert_used) chosen experts and their weights, each
 * token's in the order chosen (valid until the next call). */
void moe_route(moe_ws *w, lm_pool *pool, const lm_model *m, const lm_moe *moe, const float *xb, int n, void *act,
               const int **sel, const float **selw);

/* Layer l's shared expert over xb (n, n_embd) (gated per token for qwen2moe,
 * not for deepseek2), added into out (n, n_embd). Only for a layer with one
 * (l->w_gate.rows > 0). Uses the workspace's product buffers. */
void moe_shared_run(moe_ws *w, lm_pool *pool, const lm_layer *l, const float *xb, int n, float *out, void *act);

/* One expert e of layer l on c gathered rows: xe (c, n_embd) in; for row j,
 * weight[j] · expert(xe_j) added into out row rows[j] (out: (*, n_embd)). */
void moe_expert_run(moe_ws *w, lm_pool *pool, const lm_model *m, const lm_moe *moe, int e, const float *xe,
                    const int *rows, const float *weight, int c, float *out, void *act);

#endif
