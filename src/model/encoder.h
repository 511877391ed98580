/*
 * encoder.h - the local pass of an encoder (bert, nomic-bert; model.h):
 * what fwd_pass runs for a model whose hp.encoder is set.
 *
 * Per segment the tokens are embedded (token row + token type 0's row +
 * bert's absolute position row, then the embedding LayerNorm), and every
 * layer is post-norm:
 *   q, k, v = x·Wqᵀ + bq, ...  (nomic-bert: NeoX RoPE on q and k)
 *   k, v stored in the KV pages at their positions
 *   a = attention (non-causal with hp.causal false: attn_tile_full, every
 *       row of a segment sees positions [0, pos0 + n) of its sequence)
 *   x = LayerNorm(x + a·Woᵀ + bo)                    (attn_output_norm)
 *   h = GELU(x·Wupᵀ + b_up)  |  silu(x·Wgateᵀ) ⊙ (x·Wupᵀ + b_up)  (nomic)
 *   x = LayerNorm(x + h·Wdownᵀ + b_down)             (layer_output_norm)
 * There is no final norm and no LM head: a pass writes each row's x after
 * the last layer into f->hid (when set), the rows' pooling being the
 * caller's. fwd_check refuses what an encoder cannot do: a segment that
 * wants logits, and with hp.causal false a segment not starting at
 * position 0 (a non-causal sequence runs in one pass: its earlier rows
 * would not have seen the later ones). One process only (no tensor or
 * pipeline split: the loaders refuse). A row's arithmetic does not depend
 * on the rest of the batch.
 */
#ifndef LAMINA_ENCODER_H
#define LAMINA_ENCODER_H

#include <stddef.h>
#include <stdint.h>

#include "model/forward.h"

/* The rules above, for any model (fwd_check calls it; so does enc_pass): a
 * segment of an encoder wanting logits, a non-causal model's segment not at
 * position 0, positions past bert's table. 0, or -1 with a message. */
int enc_check(const lm_fwd *f, const lm_seg *segs, int n_seg, char *err, size_t errlen);
/* The pass over a checked batch (fwd_check): 0, or -1 with a message. */
int enc_pass(lm_fwd *f, const int32_t *tokens, int n, const lm_seg *segs, int n_seg, char *err, size_t errlen);

#endif
