/*
 * ep.h - expert parallelism: the routed experts of each MoE layer placed
 * whole on the ranks of a stage's group, the tokens' rows sent to them.
 *
 * Placement (model_ep, model.h's lm_ep): contiguous, rank r holds experts
 * [r * n_expert / size, (r + 1) * n_expert / size) of every MoE layer; only
 * those are loaded and packed. Router, shared expert, attention and dense
 * layers are whole on every rank, so every rank holds every token's row
 * after attention (the residual stream is replicated).
 *
 * The exchange (ep_moe_ffn), per MoE layer over the n rows of a pass:
 *   1. every rank routes every row (the same bits everywhere);
 *   2. row t's home is rank t * size / n (contiguous slices); each home
 *      sends each of its rows once to every rank holding one of its chosen
 *      experts, with those expert ids (ascending; -1 padded to
 *      n_expert_used): an all-to-all of the counts, then of the ids and the
 *      rows (dist_alltoallv through the span's hook);
 *   3. each rank runs each of its experts (moe_expert_run) on the rows that
 *      chose it, in the order received, with weight 1: one result row per
 *      (row, expert), sent back by a third all-to-all;
 *   4. the home adds a row's results in ascending expert order, each times
 *      its routing weight (which never leaves the home), then the shared
 *      expert over its rows, and every home's rows are gathered on every
 *      rank in row order (the column gather hook).
 * Step 4 is moe_ffn's arithmetic in moe_ffn's order, and an expert's row does
 * not depend on the other rows, so the layer's output equals one process's
 * bit for bit.
 *
 * Bytes leaving one rank per layer: for each of its home rows and each
 * other rank holding at least one of its experts, the row (n_embd floats)
 * and n_expert_used ids out, and one result row back per (row, expert) on
 * that rank; at most min(k, size - 1) rows out and k rows back per token,
 * against an all-reduce of the row under --tp (ep_stats counts them).
 *
 * Scratch grows to the largest pass and is kept (one allocation per size,
 * none per token once warm). One pass at a time per process.
 */
#ifndef LAMINA_EP_H
#define LAMINA_EP_H

#include <stddef.h>
#include <stdint.h>

#include "model/forward.h"
#include "model/moe.h"

/* Layer li's MoE FFN under expert parallelism (m->ep.size > 1): xb (n,
 * n_embd), the FFN-normed rows, the same on every rank, replaced by the
 * layer's output on every rank. Needs the hooks' alltoallv and gather_cols;
 * fails when one fails or scratch cannot grow. */
int ep_moe_ffn(moe_ws *w, lm_pool *pool, const lm_model *m, const lm_layer *l, int li, float *xb, int n, void *act,
               const fwd_hooks *hk, char *err, size_t errlen);

/* What this rank's passes under expert parallelism did since the last
 * reset. rows[li * n_expert + e]: rows expert e of layer li ran on here
 * (zero for other ranks' experts). */
typedef struct {
    uint64_t *rows; /* (n_layer, n_expert), NULL before the first pass */
    int n_layer, n_expert;
    uint64_t layers;  /* MoE layers run */
    uint64_t bytes;   /* bytes this rank sent to other ranks (all-to-alls and the gather) */
    double a2a_s;     /* seconds in the exchanges and the gather */
    double compute_s; /* seconds in routing, experts, shared expert and combining */
} ep_stats;
/* A view of the counters (rows stays owned by ep.c). */
void ep_stats_get(ep_stats *s);
void ep_stats_reset(void);

#endif
