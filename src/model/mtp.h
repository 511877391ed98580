/*
 * mtp.h - the next-token-prediction (MTP) head of a qwen35 / qwen35moe file
 * (lm_model.mtp, model.h), run as a speculative proposer.
 *
 * Row r of a run pairs token x at position p with a hidden state h: the
 * trunk's state after the final norm at position p - 1 (the one that
 * predicted x), or, in a chain of drafts, the head's own h' from the row
 * before. The row computes (model.h, lm_mtp):
 *   x = eh_proj · [enorm(embed[x]) ; hnorm(h)]
 *   x = x + Wo · (attn(q, K[0..p], V[0..p]) ⊙ sigmoid(gate))
 *       q, gate per head from attn_q; q, k per-head RMSNormed, RoPE at p
 *       (qwen35's sections), the head's own cache rows K, V written at p
 *   x = x + ffn(post_attention_norm(x))   (SwiGLU, or the layer's experts)
 *   h' = head_norm(x);  logits = head · h'  (the guess for position p + 1)
 * as llama.cpp's qwen35 MTP graph does.
 *
 * The cache: one sequence, n_ctx positions of the one attention layer,
 * float rows (n_ctx, n_head_kv * head_dim) for K and V. A row at p writes
 * position p and reads positions 0 .. p, so positions must be written in
 * order (a catch-up run over the trunk's tokens fills them); a later row at
 * an earlier position overwrites it (a rejected draft's rows are simply
 * written again), nothing else is kept. Everything is allocated in
 * mtp_new; a run allocates nothing.
 *
 * Bounds: RoPE scaling other than linear (YaRN, per-frequency factors) is
 * refused by mtp_new, as are models without an MTP layer and tensor-,
 * pipeline- or expert-parallel shards (the head runs whole, on one process).
 */
#ifndef LAMINA_MTP_H
#define LAMINA_MTP_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "base/pool.h"

typedef struct mtp_head mtp_head;

/* A head over m's MTP layer with a cache of n_ctx positions, products over
 * pool (not owned, required). NULL with a message when m has no MTP layer
 * (LM_ERR_UNSUPPORTED in *status when not NULL), the model is sharded or
 * its RoPE scaling is not linear (also LM_ERR_UNSUPPORTED), n_ctx < 1 or no
 * pool (LM_ERR_INVALID), or memory runs out (LM_ERR_NOMEM). */
mtp_head *mtp_new(const lm_model *m, lm_pool *pool, int n_ctx, lm_status *status, char *err, size_t errlen);
void mtp_free(mtp_head *c);
/* Positions the cache holds. */
int mtp_n_ctx(const mtp_head *c);

/* n rows at positions pos0 .. pos0 + n - 1: tokens tok (n) with hidden
 * states h (n, n_embd). logits (n_vocab) receives the last row's logits and
 * h_out (n_embd) its h' (either may be NULL). Fails without running when
 * a position passes n_ctx or a token is out of range. */
int mtp_run(mtp_head *c, const float *h, const int32_t *tok, int n, int pos0, float *logits, float *h_out, char *err,
            size_t errlen);

/* The greedy draft: the first index of the largest logit. */
int32_t mtp_argmax(const float *logits, int n_vocab);

#endif
