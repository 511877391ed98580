/*
 * engine_mem.c - the engine's configuration and memory plan (contract in
 * engine.h, engine_mem_plan; the pieces engine_new uses in engine_int.h):
 * defaults and bounds of a configuration, and the split of the memory
 * between the weights, the workspace, a draft model's parts and the KV
 * pools.
 *
 * Contract. Every function here is a pure function of the model and the
 * configuration: no engine, no thread, no allocation beyond the stack;
 * engine_new runs the same plan before it allocates anything, so the plan
 * engine_mem_plan reports is the engine's (its statistics then give the
 * workspace as measured, which test_mem checks equals the plan's).
 *
 * Invariants. With a budget (c->mem): weights + packed + workspace (and a
 * draft's weights, workspace and pool) + recurrent state + KV <= the budget, and what is left
 * is less than one block of each class of each pool; each pool holds at
 * least one sequence of n_ctx positions, or the plan is an error whose
 * message names every part and what one sequence needs. Without one, the
 * target's pool holds n_ctx x max_seqs positions (kv_mem: that many bytes),
 * at most 4 GiB, and a draft's its default (draft_pool_default, 2 GiB).
 *
 * Bounds. batch_tokens at least GDN_CHUNK (64) for a hybrid model (at most
 * n_ctx for any), max_seqs in [1, batch_tokens], spec->max in [1, 64] (defaults for
 * values out of range), watermark in [0, 1), itl_factor 0 or finite >= 1
 * (else an error).
 *
 * Hybrid models. The recurrent state store (rstate.h) has max_seqs live
 * slots and, with the prefix cache, snapshot slots (state_snapshots: by
 * default max_seqs, with a budget at most a quarter of what the weights,
 * the workspace and the live slots leave and never so many that the KV
 * pool loses its one sequence); all of it is `state`, the snapshots'
 * share also `state_snap`. With speculation, checkpoint slots too
 * (engine_ckpt_slots), counted in `state`.
 */
#include "sched/engine.h"
#include "sched/engine_int.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/pool.h"
#include "base/util.h"
#include "decode/spec.h"
#include "kv/kv.h"
#include "model/forward.h"
#include "model/gdn.h"
#include "sched/draft.h"

/* Defaults and bounds of a configuration, and the forward pass's dims: 0,
 * or -1 with a message (an invalid configuration). */
int engine_resolve_config(const lm_model *m, lm_engine_config *c, lm_spec_config *spec, fwd_dims *dims, char *err,
                          size_t errlen) {
    /* the context and the batch budget: the workspace's rows and the KV
     * chunk come from the same dims; a hybrid model's batch holds at least
     * GDN_CHUNK tokens, so that its prompt chunks can end on the delta
     * rule's grid (engine_state_trim) and the bits do not depend on the
     * batch */
    if (m->hp.n_rlayer > 0 && c->batch_tokens > 0 && c->batch_tokens < GDN_CHUNK) c->batch_tokens = GDN_CHUNK;
    *dims = fwd_dims_make(m, c->n_ctx, c->batch_tokens);
    c->batch_tokens = dims->n_batch;
    if (c->max_seqs < 1) c->max_seqs = 64;
    if (c->max_seqs > c->batch_tokens) c->max_seqs = c->batch_tokens;
    if (c->block_size < 1) c->block_size = KV_DEFAULT_BLOCK;
    if (!(c->watermark >= 0 && c->watermark < 1)) return lm_err(err, errlen, "watermark must be in [0, 1)");
    if (!(c->itl_factor == 0 || (c->itl_factor >= 1 && isfinite(c->itl_factor))))
        return lm_err(err, errlen, "itl_factor must be 0 (no latency bound) or a finite number >= 1");
    if (c->n_threads <= 0) c->n_threads = pool_default_threads();
    if (!c->spec) return 0;
    *spec = *c->spec; /* a whole struct (lm_engine_new widened a program's) */
    c->spec = spec;
    if (spec->proposer != LM_SPEC_NGRAM && spec->proposer != LM_SPEC_DRAFT && spec->proposer != LM_SPEC_MTP)
        return lm_err(err, errlen, "unknown speculative proposer %d", spec->proposer);
    if (spec->proposer == LM_SPEC_MTP && !m->mtp)
        return lm_err(err, errlen,
                      "speculation by next-token prediction needs a model with an MTP layer (qwen35 or qwen35moe "
                      "with nextn_predict_layers); this %s model has none",
                      model_arch_name(m->hp.arch));
    if (spec->proposer == LM_SPEC_MTP && (m->tp.size > 1 || m->pp.size > 1 || m->ep.size > 1))
        return lm_err(err, errlen,
                      "speculation by next-token prediction does not run under tensor, pipeline or expert "
                      "parallelism");
    if (spec->proposer == LM_SPEC_DRAFT) {
        if (!spec->draft_model) return lm_err(err, errlen, "speculation by a draft model needs the draft model");
        char verr[LM_ERRLEN];
        if (draft_check_vocab(m, spec->draft_model, verr, sizeof verr) != 0)
            return lm_err(err, errlen, "the draft model's tokenizer does not match the target's: %s", verr);
        if (!(spec->p_min >= 0 && spec->p_min <= 1)) return lm_err(err, errlen, "the draft's p_min must be in [0, 1]");
        if (!isfinite(spec->cost)) return lm_err(err, errlen, "the draft's cost must be a finite number");
    }
    if (spec->proposer == LM_SPEC_DRAFT && spec->draft_model->hp.n_rlayer)
        return lm_err(err, errlen, "a hybrid model (recurrent layers) cannot be a draft model");
    if (spec->max <= 0) spec->max = 4;
    if (spec->max > 64) spec->max = 64;
    return 0;
}

void engine_spec_default(lm_spec_config *s) {
    *s = (lm_spec_config){.size = sizeof *s, .proposer = LM_SPEC_NGRAM, .max = 4, .draft_vocab = -1};
}

/* The rows' states of a pass with embedding requests (engine_embed.c's
 * emb_hid): batch_tokens x n_embd floats, made with the other buffers;
 * none under the MTP proposer (its buffer holds them) or pipeline
 * parallelism (embeddings refused). */
uint64_t engine_embed_hid_bytes(const lm_model *m, const lm_engine_config *c) {
    if (engine_spec_kind(c) == LM_SPEC_MTP || m->pp.size > 1) return 0;
    return (uint64_t)c->batch_tokens * (uint64_t)m->hp.n_embd * sizeof(float);
}

/* The large buffers engine.c's alloc_buffers makes: the logits rows, one
 * log-prob row, the batch's tokens, the embeddings' rows */
uint64_t engine_buffer_bytes(const lm_model *m, const lm_engine_config *c) {
    uint64_t V = (uint64_t)m->hp.n_vocab, S = (uint64_t)c->max_seqs;
    return ((S + (uint64_t)spec_sched_cap(c) + 2) * V + V) * sizeof(float) +
        (uint64_t)c->batch_tokens * sizeof(int32_t) + engine_embed_hid_bytes(m, c);
}

static const char *human(uint64_t b, char *buf, size_t n) {
    if (b >= (1ull << 30)) snprintf(buf, n, "%.2f GiB", (double)b / (double)(1ull << 30));
    else if (b >= (1ull << 20)) snprintf(buf, n, "%.1f MiB", (double)b / (double)(1ull << 20));
    else snprintf(buf, n, "%.1f KiB", (double)b / 1024.0);
    return buf;
}

/* The draft model's parts (LM_SPEC_DRAFT): its weights, its workspace
 * with the guesses' distributions the engine keeps, its pool's
 * configuration at the default size (o->dkc); *full and *one its pool's
 * plans for max_seqs sequences and for one, *dflt the default's bytes. */
static int draft_parts(const lm_model *m, const lm_engine_config *c, const fwd_dims *dims, engine_mem *o, kv_plan *full,
                       kv_plan *one, uint64_t *dflt, char *err, size_t errlen) {
    const lm_model *dm = c->spec->draft_model;
    o->draft_weights = dm->weight_bytes + dm->packed_bytes;
    if (draft_plan(dm, dims->n_ctx, c->batch_tokens, c->max_seqs, c->n_threads, c->spec->draft_vocab, &o->dkc,
                   &o->draft_workspace, err, errlen) != 0 ||
        draft_pool_default(&o->dkc, dflt, err, errlen) != 0)
        return -1;
    o->draft_workspace += (uint64_t)spec_sched_cap(c) * (uint64_t)m->hp.n_vocab * sizeof(float);
    kv_config c1 = o->dkc;
    c1.n_seqs = 1;
    if (kv_plan_make(&o->dkc, full, err, errlen) != KV_OK || kv_plan_make(&c1, one, err, errlen) != KV_OK) return -1;
    o->dkc.mem_bytes = full->data_bytes > *dflt ? *dflt : 0; /* 0: the full pool */
    return 0;
}

/* Checkpoint slots of a hybrid model's state store under resolved c (0
 * without speculation): one per position of a verification segment (the
 * pending token and K proposals), for every running sequence at full K -
 * max_seqs x (K + 1) - but no more than the larger of two full segments
 * and one slot per running sequence (as many bytes as the live slots), so
 * that a wide max_seqs does not double the state's memory; the policy
 * proposes within what is free (engine_state.c). */
int engine_ckpt_slots(const lm_engine_config *c) {
    if (!c->spec) return 0;
    int64_t k1 = (int64_t)c->spec->max + 1, full = (int64_t)c->max_seqs * k1;
    int64_t cap = 2 * k1 > c->max_seqs ? 2 * k1 : c->max_seqs;
    return (int)(full < cap ? full : cap);
}

/* The recurrent state store of a hybrid model: a live slot for each of
 * max_seqs running sequences, with speculation its checkpoints
 * (engine_ckpt_slots), and (with the prefix cache) the snapshot
 * slots c->state_snapshots asks for, the default (0) taken as max_seqs
 * here (engine_mem_split bounds it by a budget). Its slots hold the
 * recurrent layers this pipeline stage runs (lm_pp.rec0 .. rec1: all of
 * them without a pipeline) and, under tensor parallelism, this rank's
 * heads (hp's counts are the shard's). 0 (rc->n_layer 0, *plan zeroed)
 * without recurrent layers here, or -1 with a message. */
static int rstate_part(const lm_model *m, const lm_engine_config *c, rstate_config *rc, rstate_plan *plan, char *err,
                       size_t errlen) {
    const lm_hparams *hp = &m->hp;
    memset(rc, 0, sizeof *rc);
    memset(plan, 0, sizeof *plan);
    if (m->pp.rec1 <= m->pp.rec0) return 0;
    rstate_config_init(rc, m->pp.rec1 - m->pp.rec0, hp->ssm_conv, 2 * hp->ssm_hk * hp->ssm_dk + hp->ssm_hv * hp->ssm_dv,
                       hp->ssm_hv, hp->ssm_dk, hp->ssm_dv);
    rc->n_seqs = c->max_seqs;
    rc->n_ckpt = engine_ckpt_slots(c);
    rc->n_snap = !c->prefix_cache || c->state_snapshots < 0 ? 0
        : c->state_snapshots > 0                            ? c->state_snapshots
                                                            : c->max_seqs;
    return rstate_plan_make(rc, plan, err, errlen) == RSTATE_OK ? 0 : -1;
}

/* The default snapshot count under a budget: at most a quarter of rest
 * (what the weights, the workspace and the live slots leave), and never so
 * many that the KV pool cannot hold one sequence (p1 bytes). Re-plans the
 * store. */
static int snap_fit(rstate_config *rc, rstate_plan *plan, uint64_t rest, uint64_t p1, char *err, size_t errlen) {
    uint64_t slot = plan->slot_bytes, n = rest / 4 / slot;
    if (rest < p1) n = 0;
    else if (n > (rest - p1) / slot) n = (rest - p1) / slot;
    if (n < (uint64_t)rc->n_snap) rc->n_snap = (int)n;
    return rstate_plan_make(rc, plan, err, errlen) == RSTATE_OK ? 0 : -1;
}

/* The pool's configuration and the split of the memory (resolved c). */
int engine_mem_split(const lm_model *m, const lm_engine_config *c, const fwd_dims *dims, engine_mem *o, char *err,
                     size_t errlen) {
    memset(o, 0, sizeof *o);
    kv_config *kc = &o->kc;
    fwd_kv_config(m, dims, kc);
    kc->type = c->kv_type;
    kc->block_size = c->block_size;
    kc->n_seqs = c->max_seqs;
    o->n_ctx = dims->n_ctx;
    o->weights = m->weight_bytes;
    o->packed = m->packed_bytes;
    o->workspace = fwd_workspace_bytes(m, dims, c->n_threads) + engine_buffer_bytes(m, c);
    rstate_plan rp;
    if (rstate_part(m, c, &o->rcfg, &rp, err, errlen) != 0) return -1;
    o->state = rp.data_bytes;
    o->state_snap = rp.snap_bytes;
    /* the pool without a budget: n_ctx x max_seqs positions (with
     * sliding-window layers max_seqs windows of local blocks), at most 4 GiB.
     * Byte sizes here are every layer's, as kv_plan_make reads mem_bytes:
     * a pipeline stage's pool holds the same blocks for its layers only */
    kv_config all = *kc;
    all.layer0 = all.layer1 = 0;
    kv_plan pl = {0};
    if ((!c->kv_mem || c->mem) && kv_plan_make(&all, &pl, err, errlen) != KV_OK) return -1;
    uint64_t dflt = pl.data_bytes > (4ull << 30) ? 4ull << 30 : pl.data_bytes;
    kv_plan dfull = {0}, d1 = {0};
    uint64_t ddflt = 0;
    if (engine_spec_kind(c) == LM_SPEC_DRAFT && draft_parts(m, c, dims, o, &dfull, &d1, &ddflt, err, errlen) != 0)
        return -1;
    if (c->mem) {
        char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], b7[32], b8[32];
        o->budget = c->mem;
        uint64_t fixed = o->weights + o->packed + o->workspace + o->state + o->draft_weights + o->draft_workspace;
        /* one sequence of the full context, with the local windows of max_seqs */
        kv_config one = all;
        one.n_seqs = 1;
        kv_plan p1;
        if (kv_plan_make(&one, &p1, err, errlen) != KV_OK) return -1;
        if (o->rcfg.n_snap && c->state_snapshots == 0) { /* the default count, within the budget */
            uint64_t f0 = fixed - o->state_snap;
            if (snap_fit(&o->rcfg, &rp, c->mem > f0 ? c->mem - f0 : 0, p1.data_bytes + d1.data_bytes, err, errlen))
                return -1;
            fixed = f0 + rp.snap_bytes;
            o->state = rp.data_bytes; /* live + snapshots */
            o->state_snap = rp.snap_bytes;
        }
        if ((c->mem < fixed || c->mem - fixed < p1.data_bytes + d1.data_bytes) && engine_spec_kind(c) == LM_SPEC_DRAFT)
            return lm_err(err, errlen,
                          "memory budget %s is too small: weights %s + workspace %s + the draft model's "
                          "weights %s and workspace %s leave %s for the KV caches, and one sequence of %d positions "
                          "needs %s in the model's and %s in the draft's (raise --mem, lower the context or pick a "
                          "smaller KV type)",
                          human(c->mem, b1, sizeof b1), human(o->weights + o->packed, b2, sizeof b2),
                          human(o->workspace, b3, sizeof b3), human(o->draft_weights, b6, sizeof b6),
                          human(o->draft_workspace, b7, sizeof b7),
                          human(c->mem > fixed ? c->mem - fixed : 0, b4, sizeof b4), dims->n_ctx,
                          human(p1.data_bytes, b5, sizeof b5), human(d1.data_bytes, b8, sizeof b8));
        if (c->mem < fixed || c->mem - fixed < p1.data_bytes)
            return lm_err(err, errlen,
                          "memory budget %s is too small: weights %s + workspace %s%s%s leave %s for the KV "
                          "cache, and one sequence of %d positions needs %s (raise --mem, lower the context or "
                          "pick a smaller KV type)",
                          human(c->mem, b1, sizeof b1), human(o->weights + o->packed, b2, sizeof b2),
                          human(o->workspace, b3, sizeof b3), o->state ? " + recurrent state " : "",
                          o->state ? human(o->state, b6, sizeof b6) : "",
                          human(c->mem > fixed ? c->mem - fixed : 0, b4, sizeof b4), dims->n_ctx,
                          human(p1.data_bytes, b5, sizeof b5));
        uint64_t rest = c->mem - fixed;
        if (engine_spec_kind(c) == LM_SPEC_DRAFT) {
            /* the pools share the rest in proportion to their full sizes,
             * each at least one sequence, the draft's at most its default */
            uint64_t dshare = (uint64_t)((double)rest * (double)dfull.data_bytes /
                                         ((double)dfull.data_bytes + (double)pl.data_bytes));
            if (dshare > ddflt) dshare = ddflt;
            if (dshare > rest - p1.data_bytes) dshare = rest - p1.data_bytes;
            if (dshare < d1.data_bytes) dshare = d1.data_bytes;
            o->dkc.mem_bytes = dshare >= dfull.data_bytes ? 0 : dshare;
            kv_plan dp;
            if (kv_plan_make(&o->dkc, &dp, err, errlen) != KV_OK) return -1;
            rest -= dp.data_bytes; /* what whole blocks leave goes to the model's pool */
        }
        uint64_t cap = dflt > p1.data_bytes ? dflt : p1.data_bytes; /* never below the one sequence */
        kc->mem_bytes = c->mem_cap && rest > cap ? cap : rest;
    } else if (c->kv_mem) kc->mem_bytes = c->kv_mem;
    else kc->mem_bytes = dflt < pl.data_bytes ? dflt : 0;
    if (kv_plan_make(kc, &o->plan, err, errlen) != KV_OK) return -1;
    o->kv = o->plan.data_bytes;
    o->kv_tokens = o->plan.n_tokens;
    int64_t per_seq = (dims->n_ctx + c->block_size - 1) / c->block_size;
    o->kv_seqs = o->plan.cls[KV_GLOBAL].n_blocks / per_seq;
    if (o->plan.local_blocks_per_seq > 0 && o->plan.cls[KV_LOCAL].n_blocks / o->plan.local_blocks_per_seq < o->kv_seqs)
        o->kv_seqs = o->plan.cls[KV_LOCAL].n_blocks / o->plan.local_blocks_per_seq;
    if (engine_spec_kind(c) == LM_SPEC_DRAFT) {
        kv_plan dp;
        if (kv_plan_make(&o->dkc, &dp, err, errlen) != KV_OK) return -1;
        o->draft_kv = dp.data_bytes;
        o->draft_kv_tokens = dp.n_tokens;
    }
    return 0;
}

int engine_mem_plan(const lm_model *m, const lm_engine_config *cin, engine_mem *out, char *err, size_t errlen) {
    lm_engine_config c = *cin;
    lm_spec_config spec;
    fwd_dims dims;
    if (engine_resolve_config(m, &c, &spec, &dims, err, errlen)) return -1;
    return engine_mem_split(m, &c, &dims, out, err, errlen);
}
