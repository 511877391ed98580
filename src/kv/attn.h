/*
 * attn.h - exact causal (and an encoder's non-causal) attention over the
 * paged KV cache, tiled with an online softmax (the FlashAttention recurrence), never materializing the
 * T x T score matrix.
 *
 * One call, attn_tile, computes for query tokens i < n_q at positions
 * pos0 + i, and for every query head h of one KV head's group
 * (h = kv_head * group + g, group = n_head / n_head_kv):
 *
 *   out[i, h] = softmax_j( scale * q[i, h] · K[j, kv_head] ) · V[j, kv_head],
 *               j = 0 .. pos0 + i    (window > 0: j = pos0+i-window+1 .. pos0+i)
 *
 * Non-causal attention (attn_tile_full; bert, nomic-bert): every query of
 * the call sees every key of its sequence's positions [0, kv_end), later
 * ones included, whatever its own position:
 *
 *   out[i, h] = softmax_j( scale * q[i, h] · K[j, kv_head] ) · V[j, kv_head],
 *               j = 0 .. kv_end - 1
 *
 * with no window; the same recurrence, chunks and kernels, only the mask
 * differs, so the scalar and SIMD paths are both the one above.
 *
 * reading K and V straight from the sequence's blocks in the pool's type
 * (F32, F16, Q8_0). Queries are processed in sub-tiles of up to
 * attn_tile_rows() (query, head) rows; for each sub-tile the kernel walks the
 * visible keys in chunks of ATTN_KV_CHUNK positions (crossing block
 * boundaries freely, so tiny blocks cost nothing extra), reading each
 * chunk of K and V once for all rows of the sub-tile (all the group's heads:
 * GQA/MQA read every block once per group; converted once into floats for a
 * prefill-sized sub-tile, in registers for a decode one), and keeps per row a running
 * max m, running sum l and unnormalized output O:
 *
 *   s_j = scale q·k_j;  m' = max(m, max_j s_j);  p_j = exp(s_j - m')
 *   l' = l e^(m-m') + Σ p_j;   O' = O e^(m-m') + Σ p_j v_j;   out = O / l
 *
 * Splits (split-K, "flash-decoding"): the keys are cut on a fixed grid of
 * ATTN_SPLIT positions (split n holds positions n*ATTN_SPLIT ..
 * (n+1)*ATTN_SPLIT-1, whatever the call). Each split runs the recurrence
 * above from m = -inf, l = 0, O = 0 on its own, giving a partial
 * (m_n, l_n, O_n) per row, and a row's partials are merged exactly in
 * ascending split order:
 *
 *   M = max(m_acc, m_n);  l_acc = l_acc e^(m_acc-M) + l_n e^(m_n-M);
 *   O_acc = O_acc e^(m_acc-M) + O_n e^(m_n-M);   out = O_acc / l_acc
 *
 * (a split with no visible key, l_n = 0, is skipped). attn_tile does the
 * splits one after the other in one thread; attn_tile_part computes chosen
 * splits' partials into a caller's buffer, so different threads may run
 * different splits of one (query tile, KV head) item, and attn_tile_merge
 * merges them in the same order with the same arithmetic: both give the
 * same bits, so how a caller spreads the splits over threads never changes
 * a result, and a row's bits depend only on its own keys and query. With
 * one split (contexts up to ATTN_SPLIT) and no sinks the result is the
 * plain recurrence's bit for bit.
 *
 * Attention sinks (gpt-oss): with a sink logit σ_h per query head, the
 * softmax's denominator gets one more term, e^σ_h, that has no value vector:
 *
 *   out[i, h] = Σ_j e^(s_j - m) v_j / (e^(σ_h - m) + Σ_j e^(s_j - m)),
 *               m = max(σ_h, max_j s_j),
 *
 * s_j being the scores after scale and softcap (σ_h is neither scaled nor
 * capped). The merge of the splits takes the sink as its starting state,
 * m = σ_h, l = 1, O = 0, and rescales it like any other term: no pass runs
 * after the loop, and a sink of -inf (or one far below every score) gives
 * the bits of no sink (NULL). A very large σ_h drives the output towards 0.
 *
 * Chunks past the last row's position (or wholly before the first row's
 * window) are never read; inside a chunk, keys outside a row's range are
 * masked. A layer's K/V come from its block class (kv_layer_class); a
 * sliding-window layer's blocks below every row's window may have been
 * released (kv.h), and zeros stand in for the masked keys of the one chunk
 * that straddles the window's start, so a released block is never read
 * (asserted). Scratch is
 * O(tile x (head_dim + chunk)), independent of the context length.
 *
 * Threads: attn_tile reads the pool and writes only out and scr, so callers
 * split work over (sequence, query tile, kv head) items, one scratch per
 * thread, and an item's splits over threads with attn_tile_part (which
 * writes only its part rows and scr) and attn_tile_merge. The K/V of every position < pos0 + n_q must be written (kv_store)
 * before the call.
 *
 * Numerics: float32 accumulation; the inner loops and the KV conversion are
 * the kernel table's (kernels/kernels.h): on x86-64 with AVX2+FMA+F16C and a
 * head_dim that is a multiple of 8, 8-wide kernels (same math, different
 * summation order than the scalar path); with LAMINA_NO_SIMD=1, or
 * kernels_use(LM_ISA_SCALAR), the scalar reference. Decode-shaped
 * sub-tiles read F16 / Q8_0 rows in place through fused kernels, larger ones
 * convert each chunk first; both give the same bits (attn.c). For a given path the
 * result depends only on the logical data, not on which physical blocks hold
 * it, nor on how its splits were spread over threads, nor on the tiling. Against a float64
 * reference on the stored values the relative error is ~1e-6 (tests bound
 * it by 1e-5).
 */
#ifndef LAMINA_ATTN_H
#define LAMINA_ATTN_H

#include <stdbool.h>
#include <stddef.h>

#include "kv/kv.h"

/* Key/value positions converted and scored together. */
#define ATTN_KV_CHUNK 64
/* Suggested query tokens per work item for prefill. */
#define ATTN_TILE_Q 32
/* Key positions per split (a multiple of ATTN_KV_CHUNK): the grid whose
 * partial softmax states are merged, and the unit split-K spreads. */
#define ATTN_SPLIT 256

typedef struct attn_scratch attn_scratch;

/* Per-thread scratch for a pool and a model with n_head query heads
 * (a multiple of the pool's n_head_kv). NULL with a message on bad shapes or
 * out of memory. */
attn_scratch *attn_scratch_new(const kv_pool *p, int n_head, char *err, size_t errlen);
/* attn_scratch_bytes of a scratch attn_scratch_new would make (n_head a
 * multiple of n_head_kv), known before any pool exists: the memory budget
 * counts it once per thread. */
size_t attn_scratch_size(int n_head, int n_head_kv, int head_dim);
void attn_scratch_free(attn_scratch *scr);
/* Bytes one scratch holds (for memory reports). */
size_t attn_scratch_bytes(const attn_scratch *scr);
/* (query, head) rows per internal sub-tile. */
int attn_tile_rows(const attn_scratch *scr);

/*
 * q:      row i at q + i*q_stride floats holds all n_head query heads (head
 *         h at offset h*head_dim), RoPE applied;
 * scale:  usually 1/sqrt(head_dim);
 * window: 0 for full causal attention, > 0 for a sliding window of that many
 *         positions (the query's own included); a layer of the pool's local
 *         class needs 0 < window <= kv_pool_window(p);
 * out:    same layout as q (out_stride); only the group's heads are written.
 *         In the pool's latent layout (kv.h) the values are the first v_dim
 *         elements of the key rows and out's head h is at offset h*v_dim
 *         (multi-head latent attention with absorbed queries: one KV head,
 *         q rows of n_head x head_dim, out rows of n_head x v_dim).
 * Requires pos0 >= 0 and pos0 + n_q <= kv_seq_len(s).
 */
void attn_tile(const kv_pool *p, const kv_seq *s, int layer, int kv_head, const float *q, size_t q_stride, int n_q,
               int pos0, float scale, int window, float *out, size_t out_stride, attn_scratch *scr);
/* The same with Gemma 2's soft-capping: each score s = scale·q·k becomes
 * softcap·tanh(s / softcap) before the softmax (softcap <= 0: none, as
 * attn_tile). */
void attn_tile_softcap(const kv_pool *p, const kv_seq *s, int layer, int kv_head, const float *q, size_t q_stride,
                       int n_q, int pos0, float scale, float softcap, int window, float *out, size_t out_stride,
                       attn_scratch *scr);
/* The same with attention sinks (gpt-oss), the most general call:
 * sinks:  NULL for none (attn_tile_softcap's bits exactly), or one logit
 *         per query head, indexed like q's heads (sinks[h] for the head at
 *         offset h*head_dim of a q row; a caller holding a slice of the heads
 *         passes the slice's sinks): each finite or -inf (attn_sinks_check);
 *         read-only, shared by every thread.
 * The other arguments are attn_tile_softcap's. */
void attn_tile_sinks(const kv_pool *p, const kv_seq *s, int layer, int kv_head, const float *q, size_t q_stride,
                     int n_q, int pos0, float scale, float softcap, int window, const float *sinks, float *out,
                     size_t out_stride, attn_scratch *scr);
/* Non-causal: queries pos0 .. pos0+n_q-1 (rows of q as above) each see keys
 * [0, kv_end) (an encoder's segment: kv_end = the segment's pos0 + n, so
 * every query tile of it sees the whole sequence). softcap and sinks as
 * attn_tile_sinks; the layer must be of the global class (no window).
 * Requires pos0 + n_q <= kv_end <= kv_seq_len(s); the K/V of every position
 * < kv_end must be written before the call. */
void attn_tile_full(const kv_pool *p, const kv_seq *s, int layer, int kv_head, const float *q, size_t q_stride, int n_q,
                    int pos0, int kv_end, float scale, float softcap, const float *sinks, float *out, size_t out_stride,
                    attn_scratch *scr);
/* attn_tile_full under a symmetric window (gemma-embedding's local layers):
 * with half > 0 the query at position pos sees the keys j of [0, kv_end)
 * with |j - pos| <= half; half 0 is attn_tile_full. The layer is still of
 * the global class (a non-causal model's pool has no local blocks). */
void attn_tile_sym(const kv_pool *p, const kv_seq *s, int layer, int kv_head, const float *q, size_t q_stride, int n_q,
                   int pos0, int kv_end, float scale, float softcap, int half, const float *sinks, float *out,
                   size_t out_stride, attn_scratch *scr);
/* Split-K (causal calls). The splits holding keys of a call of n_q queries at pos0 (window
 * as attn_tile's) are first .. first+count-1 of the grid; returns count
 * (>= 1 for n_q >= 1) and sets *first. */
int attn_split_range(int n_q, int pos0, int window, int *first);
/* Floats of one split's partials for n_q queries of one KV head's group on
 * `layer`: n_q x group rows of (m, l, O[v_dim]). */
size_t attn_part_floats(const kv_pool *p, int layer, int n_q, const attn_scratch *scr);
/* attn_tile_sinks's work for splits split0 .. split0+n_split-1 (a sub-range
 * of attn_split_range's) without the merge: split split0+j's partials at
 * part + j*attn_part_floats(...), row i*group+g (query i, the group's head g)
 * at (i*group+g)*(v_dim+2) as m, l, O[v_dim] (l = 0: the row sees no key of
 * that split). No sinks here: they enter in attn_tile_merge. */
void attn_tile_part(const kv_pool *p, const kv_seq *s, int layer, int kv_head, const float *q, size_t q_stride, int n_q,
                    int pos0, float scale, float softcap, int window, int split0, int n_split, float *part,
                    attn_scratch *scr);
/* out of the call whose n_split splits' partials (all of attn_split_range's,
 * in order) fill part: attn_tile_sinks's bits exactly (sinks and out as
 * there; scr only for its shape and an accumulator row). */
void attn_tile_merge(const kv_pool *p, int layer, int kv_head, int n_q, const float *part, int n_split,
                     const float *sinks, float *out, size_t out_stride, attn_scratch *scr);
/* 0 when each of sinks[0 .. n_head) is finite or -inf (what attn_tile_sinks
 * takes); else -1 with a message naming the head (a model loader's check:
 * a NaN sink would make its heads' outputs NaN, +inf has no meaning). */
int attn_sinks_check(const float *sinks, int n_head, char *err, size_t errlen);

#endif
