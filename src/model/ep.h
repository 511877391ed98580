/*
 * ep.h - expert parallelism: the routed experts of each MoE layer placed
 * whole on the ranks of a stage's group, the tokens' rows sent to them.
 *
 * Placement (model_ep, model.h's lm_ep): contiguous, rank r holds experts
 * [r * n_expert / size, (r + 1) * n_expert / size) of every MoE layer; or
 * balanced, from a routing count (lm_ep_counts: rows per expert per layer,
 * which `lamina bench --ep` measures): in each layer the experts, heaviest
 * first, go one by one to the least-loaded rank that holds fewer than
 * ceil(n_expert / size) of them (ep_place_balanced), so every rank holds as
 * many experts as under the contiguous placement and the busiest rank's
 * rows fall towards the mean. Only a rank's own experts are loaded and
 * packed. The combination below is by expert id, never by rank, so the
 * placement does not change a bit of the output. Router, shared expert, attention and dense
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
 * With --tp M too (a stage of N x M ranks, world rank (stage * N + ep rank)
 * * M + tp rank): attention, the dense layers and the shared expert are
 * split by --tp inside each tensor group (one ep rank's M ranks), and every
 * rank holds its tensor slice (shard.c: rows of gate/up, columns of down)
 * of its ep rank's experts. The exchange above runs inside the expert group
 * of one tp rank (its N ranks), on that rank's slices, so each home's sums
 * are the tp rank's partial sums in moe_ffn's order; the tensor group's
 * all-reduce after the layer (forward.c) adds them in rank order, as under
 * --tp M alone: the output equals --tp M's bit for bit.
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

/* The rank holding expert e of layer li (m->ep's placement). */
int ep_owner(const lm_model *m, int li, int e);
/* One layer's balanced placement: rows (X) the layer's rows per expert,
 * owner (X) receives each expert's rank of N; heaviest first (ties: the
 * lower id) to the least-loaded rank (ties: the lower rank) holding fewer
 * than ceil(X / N). Fails (-1) when N is not 1 .. min(X, LM_TP_MAX) or
 * memory runs out. */
int ep_place_balanced(const uint64_t *rows, int X, int N, int16_t *owner);
/* The busiest rank's rows over the mean under a placement of one layer
 * (owner (X), or NULL: contiguous); 1 is even, 0 when no rows. */
double ep_imbalance(const uint64_t *rows, int X, int N, const int16_t *owner);

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
