/*
 * cost.h - the cost model of one forward pass: the bytes it reads and writes
 * and the floating-point operations it does, per op, counted from the
 * model's shapes and tensor types (nothing is run).
 *
 * The ops are forward.h's profile slots (LM_PROF_*), with the same
 * boundaries the pass's timers use, so a slot's measured time and its
 * counted bytes and FLOPs describe the same work:
 *   embedding  the rows of the token embedding
 *   norms      the attention and FFN input RMSNorms, and the final norm
 *   q/k/v      the Q, K and V products (and their biases)
 *   rope       Q/K norms, RoPE, and the K and V rows written to the cache
 *   attention  softmax(q·Kᵀ)·V over the cache
 *   output     the o product (and its bias, gpt-oss), the post-attention norm
 *              and the residual add
 *   gate+up    the gate and up products; with experts, the whole
 *              Mixture-of-Experts FFN (router, shared expert, experts; gpt-oss's
 *              router and expert biases and its SwiGLU's clamps)
 *   activation SiLU/GELU(tanh) times up
 *   down       the down product, the post-FFN norm and the residual add
 *   lm head    the LM head over the rows that want logits (and gemma2's cap)
 *
 * Conventions (each a statement about what is counted, not an estimate of
 * caching): a weight matrix is read once per pass, whatever the number of
 * tokens (the pass runs all its tokens through each matrix together), at
 * its stored bytes (rows x row_bytes); an embedding row once per token. With
 * experts, a token runs n_expert_used of n_expert experts; a pass of n
 * tokens reads the experts some token chose, counted as their expected
 * number under uniform routing, n_expert x (1 - (1 - used/n_expert)^n)
 * (exactly used for one token). KV bytes are K and V rows of head_dim
 * elements of the cache's type (quant_row_size: 4, 2 or 34/32 bytes per
 * element for F32, F16, Q8_0): attention reads, per layer and KV head, the
 * positions its query tile covers (forward.c runs ATTN_TILE_Q rows at a
 * time; one decode token at depth d reads d + 1 positions, a sliding-window
 * layer at most its window), and writes one K and one V row per token per
 * layer and KV head; so at depth d a decode step reads
 * 2 x layers x (d + 1) x kv_heads x head_dim x bytes without a window.
 * Activations are float rows, 4 bytes per element read or written, and the
 * norms' small weight vectors are counted with them. FLOPs: 2 per
 * multiply-add of every product (attention: q·k and p·v over the positions
 * each row attends), and per element 1 for adds and scales, 3 for an
 * RMSNorm, 3 for RoPE, 4 for the gated activation.
 * Latent attention (deepseek2, mla.h) is counted by its phases' slots: the
 * query, latent and absorbing products (W_UK_hᵀ per head) under q/k/v, the
 * values' products (W_UV_h) under output; its cache holds one row of
 * kv_lora_rank + n_rot elements per token and layer, keys and values alike,
 * so a decode step at depth d reads layers x (d + 1) x (kv_lora_rank +
 * n_rot) x bytes and writes layers x (kv_lora_rank + n_rot) x bytes, and
 * attention does 2 (kv_lora_rank + n_rot) + 2 kv_lora_rank FLOPs per head
 * and position.
 */
#ifndef LAMINA_COST_H
#define LAMINA_COST_H

#include <stddef.h>
#include <stdint.h>

#include "model/forward.h"
#include "model/model.h"

typedef struct {
    double weight_bytes;   /* weight matrices and embedding rows read */
    double kv_read_bytes;  /* cache bytes attention reads */
    double kv_write_bytes; /* cache bytes the pass writes */
    double act_bytes;      /* activation floats read and written, norm vectors */
    double flops;
} cost_op;

typedef struct {
    cost_op op[LM_PROF_COUNT]; /* by profile slot (forward.h) */
    /* KV traffic by layer class: [0] global (whole-context) layers, [1]
     * sliding-window layers */
    double kv_read_class[2], kv_write_class[2];
    int n_layer_class[2];
    double expert_bytes_all; /* with experts: every expert's matrices (0 without) */
    double state_bytes;      /* with recurrent layers (qwen35): the sequences' state read and written,
                                    counted in the linear-attention slot's act_bytes too (0 without) */
    size_t kv_row_bytes;     /* one head's K (or V) of one token */
    int n_tokens;            /* n_seq x n_tok */
    int n_logits;            /* rows through the LM head */
} cost_pass;

/* The costs of one pass of n_seq sequences, each running n_tok tokens at
 * positions depth .. depth + n_tok - 1 (decode: n_tok 1, batch n_seq;
 * prefill: n_seq 1), each wanting logits for its last token, with KV
 * elements of kv_type. -1 with a message for a KV type lamina's cache does
 * not store or non-positive sizes. */
int cost_forward(const lm_model *m, uint32_t kv_type, int n_seq, int n_tok, int depth, cost_pass *out, char *err,
                 size_t errlen);

/* Totals over every op. */
cost_op cost_total(const cost_pass *c);

#endif
