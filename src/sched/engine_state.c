/*
 * engine_state.c - the recurrent state of a hybrid model's running choices
 * (contract in engine_int.h): one live slot of the engine's state store
 * (kv/rstate.h) per running choice, taken at admission (zeroed, restored
 * from a prefix-cache snapshot, or copied from choice 0 for a fork) and
 * given back when the choice finishes, is cancelled or is preempted; the
 * choice's per-layer pointers (rptr) point into it for the forward pass's
 * segments. Where a prompt's chunks end (engine_state_trim), and the snapshots
 * that let the prefix cache skip a hybrid prompt's prefill. No-ops without
 * recurrent layers. Engine thread only.
 *
 * Snapshots. A KV prefix hit skips the prefill of its positions, but a
 * recurrent layer's state at the hit's end is only had by computing every
 * position before it, so the hit counts only as far as a snapshot of the
 * state reaches (rstate_snap_match): the probe's KV match is cut back to
 * the longest of its prefixes with a snapshot (engine_state_match, before
 * the scheduler is told what the admission takes, so the plan counts the
 * cut match), and the snapshot is copied into the choice's live slot when
 * it is admitted. Snapshots are saved after a prefill pass of a choice that
 * has generated nothing yet, when its state has reached a snapshot point: a
 * position p with 0 < p <= the prompt's length on the grid, a multiple of
 * both the KV block size B (the prefix cache keys whole blocks: the key of
 * block p/B - 1, kv_seq_key, is the snapshot's) and GDN_CHUNK (64: the
 * delta rule's pieces end there, gdn.h, so a choice restored at p splits
 * its prompt where the same prompt prefilled from position 0 splits it,
 * and gets the same bits). Chunk ends on the grid are saved as they come;
 * engine_state_trim also ends a chunk at two grid points so they are saved:
 *   - the last one a KV match of the same prompt can reach (at most
 *     n_prompt - 1 positions, whole blocks): a second request of the same
 *     prompt skips all but its last positions;
 *   - the last one at or below the prompt's KV match at admission, before
 *     the cut (snap_at): where the cache says an earlier prompt's tokens
 *     stop being shared, as the end of a system prompt that requests share,
 *     so the requests after this one restore the state there.
 * Positions past the prompt (generated tokens, whose state decoding fed one
 * at a time and a prefill would compute in pieces: other bits) get no
 * snapshot; their KV blocks, committed at finish, are reachable only up to
 * the prompt's last snapshot. kv_set_evict_hook drops a snapshot with its
 * KV block (the KV match could never reach it again), and the store evicts
 * the least recently used snapshot when it needs a slot. Salts (tenants)
 * are part of the block keys, so of the snapshots' keys too. A prompt that
 * took a forced chunk off the grid (STATE_MAX_DEFER) still saves at grid
 * points: the same state up to rounding, as the rest of its output.
 *
 * Speculation. A verification segment (the pending token and K proposals
 * of any proposer) rewrites the state past tokens the target may reject,
 * so it runs with K + 1 checkpoints of the store reserved for its
 * positions (the forward pass writes the state after each token into
 * them, gdn.h); after verification the state of the position after the
 * last accepted token is copied back (nothing when all were accepted) and
 * the checkpoints released. The checkpoints are few (engine_ckpt_slots):
 * each iteration the wishes are bounded by what is free, in the order the
 * policy hears them, so a short store means fewer proposals, never a
 * failure; a reservation that still fails leaves a plain decode.
 *
 * Several ranks (serving under tensor or pipeline parallelism). Every
 * rank keeps its part of each slot in a store of its own; the leader's
 * store logs its operations (acquire, fork, release, checkpoints,
 * snapshots) and each batch plan carries them to the followers, which
 * replay them before the pass (tp_plan.c), so nothing here differs.
 */
#include "sched/engine_int.h"

#include "kv/rstate.h"
#include "model/gdn.h"

/* The grid of snapshot points: the least common multiple of the block size
 * and GDN_CHUNK. */
static int snap_grid(const lm_engine *e) {
    int a = e->cfg.block_size, b = GDN_CHUNK;
    while (b) {
        int t = a % b;
        a = b;
        b = t;
    }
    return e->cfg.block_size / a * GDN_CHUNK;
}

static bool snap_on(const lm_engine *e) {
    return e->rs && e->cfg.prefix_cache && rstate_pool_config(e->rs)->n_snap > 0;
}

void engine_state_init(lm_engine *e) {
    if (!e->rs) return;
    e->snap_grid = snap_grid(e);
    if (snap_on(e)) kv_set_evict_hook(e->kv, rstate_snap_evict, e->rs);
    if (e->m->tp.lead) tp_plan_state(e->rs); /* serving over ranks: the followers replay the store's operations */
}

/* Point c's per-layer arrays at its live slot. A pipeline stage's store
 * holds its own recurrent layers rec0 .. rec1 - 1 as its layers 0 ..; the
 * other stages' entries stay NULL (never read here). */
static void state_bind(lm_engine *e, eseq *c) {
    int R = e->m->hp.n_rlayer, r0 = e->m->pp.rec0;
    for (int r = r0; r < e->m->pp.rec1; r++) {
        c->rptr[r] = rstate_conv(e->rs, c->rslot, r - r0);
        c->rptr[R + r] = rstate_mat(e->rs, c->rslot, r - r0);
    }
}

/* A live slot for c: a copy of from's state (a fork), else the snapshot
 * its admission's probe matched (engine_state_match: c->snap_k blocks), else
 * zeroed (position 0). 0, or -1 with a message (no slot free: the plan
 * admitted past max_seqs; the snapshot gone: cannot happen between the
 * probe and the admission, as the probe holds the snapshot's KV block).
 * No-op without recurrent layers. */
int engine_state_take(lm_engine *e, eseq *c, const eseq *from, char *err, size_t errlen) {
    if (!e->rs) return 0;
    int s = from ? rstate_fork(e->rs, from->rslot, err, errlen) : rstate_acquire(e->rs, err, errlen);
    if (s < 0) return -1;
    if (!from && c->snap_k > 0 && rstate_snap_restore(e->rs, c->snap_key, s, err, errlen) != RSTATE_OK) {
        rstate_release(e->rs, s);
        return -1;
    }
    c->snap_k = 0;
    c->rslot = s;
    state_bind(e, c);
    return 0;
}

/* Give c's slot back (finished, cancelled or preempted: a preempted choice
 * starts again from its prefix-cache hit, a restored snapshot or position
 * 0, in a fresh slot). */
void engine_state_drop(lm_engine *e, eseq *c) {
    if (!e->rs || c->rslot < 0) return;
    rstate_release(e->rs, c->rslot);
    c->rslot = -1;
}

/* After kv_prefix_match filled c's probe: cut the match back to the longest
 * prefix with a snapshot (none: 0, a full prefill), remember the snapshot
 * for the admission, and the grid point below the uncut match (snap_at). */
void engine_state_match(lm_engine *e, eseq *c) {
    c->snap_k = 0;
    c->snap_at = 0;
    if (!e->rs) return;
    int B = e->cfg.block_size, len = kv_seq_len(c->probe);
    if (!len) return;
    c->snap_at = len / e->snap_grid * e->snap_grid;
    int k = snap_on(e) ? rstate_snap_match(e->rs, c->probe, c->snap_key) : 0;
    if (k * B >= len) {
        c->snap_k = k;
        return;
    }
    /* only the probe's own blocks past the snapshot go back (cached again) */
    if (kv_truncate(e->kv, c->probe, k * B, NULL, 0) != KV_OK) k = 0, kv_truncate(e->kv, c->probe, 0, NULL, 0);
    c->snap_k = k;
    e->snap_cut_blocks += (uint64_t)(len / B - kv_seq_len(c->probe) / B);
}

/* After a pass fed c's segment: save the state when it stands on a
 * snapshot point of the prompt and c has generated nothing (its blocks up
 * to there are keyed: kv_prefix_commit ran first). A full store evicts its
 * least recently used snapshot; a key already stored is only marked used. */
void engine_state_save(lm_engine *e, eseq *c) {
    int p = c->n_computed, B = e->cfg.block_size;
    if (!snap_on(e) || c->n_gen || c->rslot < 0 || p <= 0 || p > c->n_prompt || p % e->snap_grid) return;
    const uint8_t *key = kv_seq_key(c->kv, p / B - 1);
    if (key) rstate_snap_save(e->rs, c->rslot, key, NULL, 0);
}

/* The tokens of a planned n a hybrid model's choice c feeds now, so that
 * its segments split where the same choice run alone would split them
 * (gdn.h: the delta rule's pieces end on multiples of GDN_CHUNK positions,
 * and a lone token takes the recurrence): a prompt chunk ends at the
 * prompt's end or on a multiple of GDN_CHUNK, and a position past the
 * prompt (recomputing after a preemption) is fed one at a time, as decoding
 * fed it. A planned single prompt token (the last of a full batch's budget)
 * is a chunk like any other, not a lone token. With snapshots, a chunk also
 * ends at the prompt's two snapshot points (the file's comment), so the
 * state is saved there. When n does not reach the next multiple, c waits
 * (0) if the batch already holds a segment (busy: the engine does not go
 * idle) and it has not waited STATE_MAX_DEFER iterations in a row; else it
 * takes n as planned (progress before the last bits). Without recurrent
 * layers n. */
int engine_state_trim(const lm_engine *e, eseq *c, int n, bool busy) {
    /* a non-causal model's prompt runs in one pass (engine_embed.c): whole, or it waits */
    if (!e->m->hp.causal && c->n_computed + n < c->n_prompt) return 0;
    if (!e->rs || n <= 0) return n;
    int p0 = c->n_computed, end = p0 + n;
    if (p0 >= c->n_prompt) return 1;
    if (snap_on(e)) { /* the nearer snapshot point inside the chunk */
        int B = e->cfg.block_size, g = e->snap_grid;
        int last = (c->n_prompt - 1) / B * B / g * g; /* the last point a match of this prompt reaches */
        int at = c->snap_at > p0 && c->snap_at < last ? c->snap_at : last;
        if (at > p0 && at < end) return c->n_defer = 0, at - p0;
    }
    if (end >= c->n_prompt) return c->n_defer = 0, c->n_prompt - p0;
    int cut = end / GDN_CHUNK * GDN_CHUNK;
    if (cut > p0) return c->n_defer = 0, cut - p0;
    if (busy && c->n_defer < STATE_MAX_DEFER) return c->n_defer++, 0;
    c->n_defer = 0;
    return n;
}

/* The store's figures for the engine's stats, and the prefix hits less the
 * blocks the snapshot match cut (mu held). */
void engine_state_stats(const lm_engine *e, lm_engine_stats *st) {
    if (!e->rs) return;
    rstate_stats rs;
    rstate_stats_get(e->rs, &rs);
    st->mem_state_snap = rstate_pool_plan(e->rs)->snap_bytes;
    st->state_snap_slots = rs.n_snap;
    st->state_snap_used = rs.n_snap_used;
    st->state_snap_saved_total = rs.snap_saved;
    st->state_snap_restored_total = rs.snap_restored;
    st->state_snap_evicted_total = rs.snap_evicted;
    st->state_snap_dropped_total = rs.snap_dropped;
    st->prefix_hits_total -= e->snap_cut_blocks < st->prefix_hits_total ? e->snap_cut_blocks : st->prefix_hits_total;
}

/* ---- speculation: checkpoints to roll the state back ---------------------- */

void engine_state_iter(lm_engine *e) { e->ck_left = e->rs ? rstate_ckpt_available(e->rs) : 0; }

int engine_state_wish(lm_engine *e, int wish) {
    if (!e->rs || wish <= 0) return wish;
    int k = wish < e->ck_left - 1 ? wish : e->ck_left - 1;
    if (k < wish) {
        pthread_mutex_lock(&e->mu);
        e->stats.spec_ckpt_short_total++;
        pthread_mutex_unlock(&e->mu);
    }
    return k > 0 ? k : 0;
}

void engine_state_promise(lm_engine *e, int k) {
    if (e->rs && k > 0) e->ck_left -= k + 1;
}

int engine_state_reserve(lm_engine *e, eseq *c, int n) {
    if (!e->rs || n <= 1) return n;
    if (rstate_ckpt_reserve(e->rs, c->rslot, c->n_computed, n, NULL, 0) == RSTATE_OK) return n;
    pthread_mutex_lock(&e->mu);
    e->stats.spec_ckpt_short_total++;
    pthread_mutex_unlock(&e->mu);
    return 1;
}

int engine_state_rollback(lm_engine *e, eseq *c, char *err, size_t errlen) {
    if (!e->rs || c->rslot < 0) return 0;
    int rc = 0;
    if (rstate_ckpt_reserved(e->rs, c->rslot, c->n_computed + 1)) { /* a proposal was rejected */
        rc = rstate_ckpt_restore(e->rs, c->rslot, c->n_computed, err, errlen) == RSTATE_OK ? 0 : -1;
        pthread_mutex_lock(&e->mu);
        e->stats.spec_rollbacks_total++;
        pthread_mutex_unlock(&e->mu);
    }
    rstate_ckpt_release(e->rs, c->rslot);
    return rc;
}
