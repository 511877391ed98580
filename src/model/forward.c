/*
 * forward.c - the decoder forward pass over a flat batch of tokens from one
 * or many sequences (segments) on this process, and the workspace it runs
 * in (forward.h).
 *
 * For each layer, with x the residual stream (n, n_embd):
 *   xb = rmsnorm(x) * attn_norm
 *   q, k, v = xb·Wqᵀ (+bq), xb·Wkᵀ (+bk), xb·Wvᵀ (+bv); RoPE on q and k
 *   k, v appended to the cache at their positions
 *   per head h (kv head h / (n_head / n_head_kv)):
 *       out_h = softmax(q_h·Kᵀ / √head_dim, causal) · V
 *   x += out·Woᵀ
 *   xb = rmsnorm(x) * ffn_norm
 *   x += (silu(xb·Wgateᵀ) ⊙ xb·Wupᵀ)·Wdownᵀ
 * gemma3 adds: x scaled by sqrt(n_embd) after the embedding; per-head
 * RMSNorm of q and k before RoPE; RMSNorm of the attention and FFN outputs
 * before each residual add; GELU(tanh) instead of SiLU; local layers attend
 * to the last `window` positions only, with their own RoPE base.
 * gemma-embedding is gemma3 with hp.causal false: every row of a segment
 * (one whole sequence: fwd_check) sees every position of it, a local
 * layer's those within window / 2 on either side (attn_tile_sym).
 * qwen3 has gemma3's Q/K norms and nothing else of it. gemma2 has gemma3's
 * scaled embeddings, post norms and GELU, no Q/K norms, and soft-caps the
 * attention scores and the logits (cap·tanh(s/cap)). phi3's Q, K, V and
 * gate/up are row slices of fused matrices (model.c), and its RoPE angles
 * may be divided by per-frequency factors, cos and sin scaled. A file with
 * YaRN scaling (llama, qwen2/3 and their MoE, deepseek2) takes its angles
 * from ops_rope_angles_yarn, the cos and sin scaled by its magnitude factor.
 * A layer with experts replaces the FFN by moe_ffn (moe.h) between the same
 * norm and residual add. gpt-oss adds a bias to the output product too (after
 * the tensor-parallel sum), a sink logit per query head to each softmax's
 * denominator (attn_tile_sinks), alternates windowed and whole-context layers
 * and runs YaRN RoPE on one base.
 * A layer with latent attention (deepseek2) replaces the Q/K/V products,
 * RoPE, the cache write and attention by mla_attn (mla.h), whose heads'
 * outputs go through Wo as above; its cache rows are the pool's latent
 * layout (fwd_kv_config sets kv_config.latent_v).
 * then logits = rmsnorm(x) * out_norm · Woutᵀ for the rows asked for.
 * Each row's arithmetic is the same whatever else is in the batch and
 * whichever thread runs it (attention's key splits, spread over threads
 * when the items are few, are merged in one order: attn_plan), so a
 * sequence's logits do not depend on how its tokens were batched, nor on
 * the thread count.
 * This file is the local pass (fwd_pass): one process's layers [layer0,
 * layer1) over one batch, each layer an attention block (multi-head or
 * latent) and an FFN block (dense or experts). It knows nothing of other
 * ranks. Tensor parallel (m->tp.size > 1, shard.c): hp holds this rank's
 * heads and FFN rows, so the loops above run on the shard as they are; the
 * o and down products are partial sums, added across ranks by the span's
 * reduce hook (in rank order, the same on every rank) before the residual
 * add, and the LM head's vocabulary slices are gathered into whole logits
 * rows on every rank by its gather hook. Expert parallel (m->ep.size > 1,
 * ep.h): a MoE layer runs ep_moe_ffn, whose rows go to the ranks holding
 * their experts through the span's all-to-all hook (with --tp too, its
 * output is a partial sum, reduced as the dense FFN's). Pipeline parallel (m->pp.size >
 * 1): the span holds this stage's layers; stage 0 embeds, later stages
 * find x received, and only the last stage runs the LM head. The runner
 * above (run.c: fwd_run, the single-sequence helper; pp.c: micro-batches,
 * stages and the hooks over dist.h; tp_plan.c: a serving leader's plan)
 * calls the pass; the pass calls none of them. An encoder's pass (bert,
 * nomic-bert: post-norm LayerNorm blocks, no LM head) is encoder.c's.
 */
#include "model/forward.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "model/encoder.h"
#include "model/ep.h"
#include "model/gdn.h"
#include "model/mla.h"
#include "model/moe.h"
#include "model/ops.h"
#include "format/quant.h"
#include "base/util.h"

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

const char *const lm_prof_names[LM_PROF_COUNT] = {
    "embedding",        "norms",         "q/k/v matmul",       "rope",           "attention",
    "linear attention", "output matmul", "ffn gate+up matmul", "ffn activation", "ffn down matmul",
    "lm head",
};

/* The time now; charges the pool's dispatch time since the last call to
 * *gap, and the runs that met a worker asleep to *sleeps (NULL: only note
 * them). */
static double prof_clock(lm_fwd *f, double *gap, double *sleeps) {
    pool_timing t;
    pool_timing_get(f->pool, &t);
    if (gap) *gap += t.wait_s - f->prof_gap_mark;
    if (sleeps) *sleeps += (double)(t.sleeps - f->prof_sleep_mark);
    f->prof_gap_mark = t.wait_s;
    f->prof_sleep_mark = t.sleeps;
    return lm_now();
}

/* ---- the batch budget ---------------------------------------------------- */

fwd_dims fwd_dims_make(const lm_model *m, int n_ctx, int n_batch) {
    fwd_dims d;
    d.n_ctx = n_ctx > 0 ? n_ctx : m->hp.n_ctx_train;
    d.n_batch = n_batch > 0 ? n_batch : FWD_BATCH_DEFAULT;
    if (d.n_batch > d.n_ctx) d.n_batch = d.n_ctx;
    return d;
}

void fwd_kv_config(const lm_model *m, const fwd_dims *d, kv_config *c) {
    const lm_hparams *hp = &m->hp;
    kv_config_init(c, m->hp.n_layer - m->hp.n_rlayer, hp->n_head_kv, hp->head_dim); /* recurrent layers keep no KV */
    if (hp->swa_window > 0 && hp->causal) { /* non-causal (gemma-embedding): no local blocks */
        c->window = hp->swa_window;
        c->layer_local = m->layer_local;
    }
    c->latent_v = hp->kv_lora_rank; /* latent attention: the key row holds the value (kv.h) */
    c->n_ctx = d->n_ctx;
    c->chunk = d->n_batch;
    if (m->pp.size > 1) { /* a pipeline stage stores its own layers' K/V (as KV pool layers: lm_pp.kv0) */
        c->layer0 = m->pp.kv0;
        c->layer1 = m->pp.kv1;
    }
}

/* ---- the workspace ------------------------------------------------------- */

static void *ws_alloc(size_t *ws, size_t n) {
    *ws += n;
    return lm_malloc(n);
}

/* the activation scratch: the largest input row of any matmul, in any type used */
static size_t act_scratch_bytes(const lm_model *m, int n_batch) {
    const lm_hparams *hp = &m->hp;
    size_t a = 0;
    for (int li = 0; li < hp->n_layer; li++) {
        const lm_weight *lw[MODEL_LAYER_MATRICES];
        model_layer_matrices(&m->layers[li], lw);
        for (int i = 0; i < MODEL_LAYER_MATRICES; i++)
            a = max_sz(a, ops_matmul_scratch(lw[i]->type, lw[i]->cols, n_batch));
    }
    a = max_sz(a, ops_matmul_scratch(m->output.type, m->output.cols, n_batch));
    a = max_sz(a, mla_act_bytes(m, n_batch));
    a = max_sz(a, gdn_act_bytes(m, n_batch));
    return max_sz(a, moe_act_bytes(m, n_batch));
}

/* One pool thread's run of attention units [lo, hi), packed lo | hi << 32
 * in one word so that the owner taking from the front and a thief cutting
 * off the back agree by one compare-and-swap; padded to a cache line's
 * size, so threads' runs seldom share one. */
struct fwd_run {
    _Atomic uint64_t lohi;
    char pad[56];
};

/* Floats of split-K partials: a one-row item's every split at the whole
 * context, 2 n_threads - 1 times over: attn_plan cuts every item of a
 * decode step whose items are at one depth and fewer than twice the
 * threads (4 KV heads on 3 threads), and each of those must fit (an item
 * that does not runs whole in one thread, which gives the same bits but
 * leaves the threads uneven). None with one thread. */
static size_t part_cap(const lm_model *m, const fwd_dims *d, int n_threads) {
    const lm_hparams *hp = &m->hp;
    if (n_threads < 2 || m->mla) return 0;
    size_t splits = (size_t)d->n_ctx / ATTN_SPLIT + 1, group = (size_t)(hp->n_head / hp->n_head_kv);
    return (size_t)(2 * n_threads - 1) * splits * group * ((size_t)hp->head_dim + 2);
}

size_t fwd_workspace_bytes(const lm_model *m, const fwd_dims *d, int n_threads) {
    const lm_hparams *hp = &m->hp;
    size_t kvd = (size_t)hp->n_head_kv * hp->head_dim, qd = (size_t)hp->n_head * hp->head_dim;
    size_t B = (size_t)d->n_batch, E = (size_t)hp->n_embd, F = (size_t)hp->n_ff;
    size_t fl = B * E + B * max_sz(E, qd) + B * qd + 2 * B * kvd + B * max_sz(F, E) + B * F + B * (size_t)hp->n_rot;
    size_t ws = fl * sizeof(float) + B * sizeof(int) + 3 * (B + 1) * sizeof(int) + B * sizeof(int) + B * sizeof(size_t);
    ws += part_cap(m, d, n_threads) * sizeof(float) + (size_t)n_threads * sizeof(struct fwd_run);
    ws += (size_t)n_threads * attn_scratch_size(hp->n_head, hp->n_head_kv, hp->head_dim);
    ws += act_scratch_bytes(m, d->n_batch);
    if (m->moe) ws += moe_ws_bytes(m, d->n_batch);
    ws += mla_ws_bytes(m, d->n_batch, n_threads);
    ws += gdn_ws_bytes(m, d->n_batch, n_threads);
    if (hp->attn_gate) ws += 3 * B * qd * sizeof(float);
    return ws;
}

/* Split-K's minimum (forward.h: FWD_ATTN_SPLIT_MIN, LAMINA_ATTN_SPLIT):
 * 0 off, else at least 2; -1 when the variable is not a count. */
static int attn_split_env(void) {
    const char *v = getenv("LAMINA_ATTN_SPLIT");
    if (!v || !*v) return FWD_ATTN_SPLIT_MIN;
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n < 0 || n > 1 << 20) return -1;
    return n == 0 ? 0 : n < 2 ? 2 : (int)n;
}

lm_fwd *fwd_new(const lm_model *m, lm_pool *pool, kv_pool *kv, const fwd_dims *d, char *err, size_t errlen) {
    const lm_hparams *hp = &m->hp;
    const kv_plan *plan = kv_pool_plan(kv);
    int split_min = attn_split_env();
    if (split_min < 0) {
        lm_err(err, errlen,
               "LAMINA_ATTN_SPLIT=%s: expected 0 (split-K off) or the fewest key splits a decode attention item "
               "is cut from",
               getenv("LAMINA_ATTN_SPLIT"));
        return NULL;
    }
    if (d->n_batch < 1 || d->n_batch > d->n_ctx) {
        lm_err(err, errlen, "a batch of %d tokens for a context of %d (fwd_dims_make gives valid sizes)", d->n_batch,
               d->n_ctx);
        return NULL;
    }
    if (plan->local_blocks_per_seq && d->n_batch > plan->chunk) {
        lm_err(err, errlen,
               "passes of %d tokens over a KV pool whose sliding-window blocks are planned for appends "
               "of at most %d",
               d->n_batch, plan->chunk);
        return NULL;
    }
    lm_fwd *f = lm_calloc(1, sizeof *f);
    if (!f) {
        lm_err(err, errlen, "out of memory");
        return NULL;
    }
    f->m = m;
    f->pool = pool;
    f->kv = kv;
    f->dims = *d;
    f->attn_split_min = split_min;
    size_t kvd = (size_t)hp->n_head_kv * hp->head_dim, qd = (size_t)hp->n_head * hp->head_dim;
    size_t B = (size_t)d->n_batch, E = (size_t)hp->n_embd;
    /* every byte allocated below is counted in ws (the memory budget's
     * workspace; fwd_workspace_bytes computes the same sum beforehand) */
    size_t ws = 0;
    f->n_scr = pool_size(pool);
    f->scr = lm_calloc((size_t)f->n_scr, sizeof *f->scr);
    for (int i = 0; f->scr && i < f->n_scr; i++) {
        if (!(f->scr[i] = attn_scratch_new(kv, hp->n_head, err, errlen))) {
            fwd_free(f);
            return NULL;
        }
        ws += attn_scratch_bytes(f->scr[i]);
    }
    f->x = ws_alloc(&ws, B * E * sizeof(float));
    f->xb = ws_alloc(&ws, B * max_sz(E, qd) * sizeof(float));
    f->q = ws_alloc(&ws, B * qd * sizeof(float));
    f->k = ws_alloc(&ws, B * kvd * sizeof(float));
    f->v = ws_alloc(&ws, B * kvd * sizeof(float));
    /* hb also holds the attention output projection, n_embd per token: with
     * experts, feed_forward_length may be narrower than the embedding */
    f->hb = ws_alloc(&ws, B * max_sz((size_t)hp->n_ff, E) * sizeof(float));
    f->hb2 = ws_alloc(&ws, B * (size_t)hp->n_ff * sizeof(float));
    f->cs = ws_alloc(&ws, B * (size_t)hp->n_rot * sizeof(float));
    f->pos = ws_alloc(&ws, B * sizeof(int));
    f->seg_row0 = ws_alloc(&ws, (B + 1) * sizeof(int));
    f->seg_item0 = ws_alloc(&ws, (B + 1) * sizeof(int));
    f->seg_unit0 = ws_alloc(&ws, (B + 1) * sizeof(int));
    f->seg_units = ws_alloc(&ws, B * sizeof(int));
    f->seg_part0 = ws_alloc(&ws, B * sizeof(size_t));
    f->part_cap = part_cap(m, d, f->n_scr);
    f->part = f->part_cap ? ws_alloc(&ws, f->part_cap * sizeof(float)) : NULL;
    f->run = ws_alloc(&ws, (size_t)f->n_scr * sizeof *f->run);
    size_t a = act_scratch_bytes(m, d->n_batch);
    if (m->mla && !(f->mla = mla_ws_new(m, d->n_batch, f->n_scr, err, errlen))) {
        fwd_free(f);
        return NULL;
    }
    ws += mla_ws_bytes(m, d->n_batch, f->n_scr);
    if (hp->n_rlayer && !(f->gdn = gdn_ws_new(m, d->n_batch, f->n_scr, err, errlen))) {
        fwd_free(f);
        return NULL;
    }
    ws += gdn_ws_bytes(m, d->n_batch, f->n_scr);
    if (hp->attn_gate) {
        f->qg = ws_alloc(&ws, 2 * B * qd * sizeof(float));
        f->gate = ws_alloc(&ws, B * qd * sizeof(float));
    }
    if (m->moe && !(f->moe = moe_ws_new(m, d->n_batch, err, errlen))) {
        fwd_free(f);
        return NULL;
    }
    f->act_bytes = a;
    f->act = a ? ws_alloc(&ws, a) : NULL;
    if (m->moe) ws += moe_ws_bytes(m, d->n_batch);
    f->ws_bytes = ws;
    if (!f->scr || !f->x || !f->xb || !f->q || !f->k || !f->v || !f->hb || !f->hb2 || !f->cs || !f->pos ||
        !f->seg_row0 || !f->seg_item0 || !f->seg_unit0 || !f->seg_units || !f->seg_part0 || (f->part_cap && !f->part) ||
        !f->run || (a && !f->act) || (hp->attn_gate && (!f->qg || !f->gate))) {
        lm_err(err, errlen, "out of memory allocating the workspace for batches of %d tokens", d->n_batch);
        fwd_free(f);
        return NULL;
    }
    return f;
}

void fwd_free(lm_fwd *f) {
    if (!f) return;
    for (int i = 0; f->scr && i < f->n_scr; i++) attn_scratch_free(f->scr[i]);
    lm_free(f->scr);
    lm_free(f->x);
    lm_free(f->xb);
    lm_free(f->q);
    lm_free(f->k);
    lm_free(f->v);
    lm_free(f->hb);
    lm_free(f->hb2);
    lm_free(f->cs);
    lm_free(f->pos);
    lm_free(f->seg_row0);
    lm_free(f->seg_item0);
    lm_free(f->seg_unit0);
    lm_free(f->seg_units);
    lm_free(f->seg_part0);
    lm_free(f->part);
    lm_free(f->run);
    lm_free(f->act);
    moe_ws_free(f->moe);
    mla_ws_free(f->mla);
    gdn_ws_free(f->gdn);
    lm_free(f->qg);
    lm_free(f->gate);
    lm_free(f);
}

/* Attention for one layer over a batch of segments; work items are
 * (segment, query tile, kv head) triples, each computing every query head of
 * that KV head's group for up to ATTN_TILE_Q rows of one sequence. When the
 * items are fewer than the pool's threads (decode of one or a few
 * sequences, few KV heads), or one is long beside the batch's others
 * (attn_plan), a one-tile segment's items are each cut into seg_units[g]
 * units, unit u running a contiguous share of the item's key splits (one
 * split: attn_tile_part) into part; attn_merge then merges each item's
 * splits in order (attn_tile_merge). attn.h's splits are on a fixed grid and
 * merged in one order either way, so the bits are those of the item run
 * whole: independent of the thread count and of the rest of the batch. */
typedef struct {
    lm_fwd *f;
    const lm_seg *segs;
    int layer, n_seg;
    int window;         /* 0: whole context */
    const float *sinks; /* (n_head) this layer's sink logits (gpt-oss), or NULL */
} attn_job;

/* Runs of units: thread t of nth starts with units [t total / nth, (t+1)
 * total / nth) and takes them in increasing order, so a thread's
 * consecutive units are consecutive key splits of one item, and the chunk
 * each unit prefetches past its end (attn.h) is the one the same thread
 * reads next. A thread whose run is empty cuts the back half off the
 * longest other run and carries on there, so no thread idles while
 * another has two units left. Which thread runs a unit never changes its
 * bits (the partials are merged in split order). */
static void runs_init(lm_fwd *f, int total, int nth) {
    for (int t = 0; t < nth; t++) {
        uint64_t lo = (uint64_t)((long)total * t / nth), hi = (uint64_t)((long)total * (t + 1) / nth);
        atomic_store_explicit(&f->run[t].lohi, lo | hi << 32, memory_order_relaxed);
    }
}

/* The next unit for thread ith, or -1 when every run is empty. */
static int runs_take(lm_fwd *f, int ith, int nth) {
    struct fwd_run *r = f->run;
    for (;;) {
        uint64_t v = atomic_load(&r[ith].lohi);
        uint32_t lo = (uint32_t)v, hi = (uint32_t)(v >> 32);
        if (lo < hi) {
            if (atomic_compare_exchange_weak(&r[ith].lohi, &v, (uint64_t)(lo + 1) | (uint64_t)hi << 32)) return (int)lo;
            continue;
        }
        int victim = -1;
        uint32_t most = 0;
        for (int t = 0; t < nth; t++) {
            uint64_t w = atomic_load(&r[t].lohi);
            uint32_t left = (uint32_t)(w >> 32) > (uint32_t)w ? (uint32_t)(w >> 32) - (uint32_t)w : 0;
            if (t != ith && left > most) most = left, victim = t;
        }
        if (victim < 0) return -1;
        uint64_t w = atomic_load(&r[victim].lohi);
        uint32_t vlo = (uint32_t)w, vhi = (uint32_t)(w >> 32);
        if (vlo >= vhi) continue;
        uint32_t mid = vlo + (vhi - vlo) / 2; /* the victim keeps [vlo, mid), at least its next unit */
        if (mid == vlo) mid = vlo + 1;
        if (mid >= vhi) { /* one unit left: take it outright */
            if (atomic_compare_exchange_weak(&r[victim].lohi, &w, (uint64_t)vhi | (uint64_t)vhi << 32)) return (int)vlo;
            continue;
        }
        if (!atomic_compare_exchange_weak(&r[victim].lohi, &w, (uint64_t)vlo | (uint64_t)mid << 32)) continue;
        /* [mid, vhi) is now ours alone: its first unit now, the rest as our run */
        atomic_store(&r[ith].lohi, (uint64_t)(mid + 1) | (uint64_t)vhi << 32);
        return (int)mid;
    }
}

static void attn_worker(void *arg, int ith, int nth) {
    attn_job *j = arg;
    lm_fwd *f = j->f;
    const lm_hparams *hp = &f->m->hp;
    size_t qd = (size_t)hp->n_head * hp->head_dim;
    float scale = hp->attn_scale;
    const int *first = f->seg_unit0; /* (n_seg + 1) first unit of each segment */
    int sg = 0;
    long ran = 0;
    for (;;) {
        int unit = runs_take(f, ith, nth);
        if (unit < 0) break;
        ran++;
        if (unit < first[sg]) sg = 0; /* a run taken over from a thread behind */
        while (first[sg + 1] <= unit) sg++;
        const lm_seg *g = &j->segs[sg];
        int U = f->seg_units[sg], local = (unit - first[sg]) / U, u = (unit - first[sg]) % U;
        int i0 = local / hp->n_head_kv * ATTN_TILE_Q, kh = local % hp->n_head_kv;
        int nq = g->n - i0 < ATTN_TILE_Q ? g->n - i0 : ATTN_TILE_Q;
        size_t row = (size_t)f->seg_row0[sg] + (size_t)i0;
        if (U == 1 && !hp->causal) { /* gemma-embedding: the whole sequence, or a symmetric window of it */
            attn_tile_sym(f->kv, g->seq, j->layer, kh, f->q + row * qd, qd, nq, g->pos0 + i0, g->pos0 + g->n, scale,
                          hp->attn_softcap, j->window / 2, j->sinks, f->xb + row * qd, qd, f->scr[ith]);
            continue;
        }
        if (U == 1) {
            attn_tile_sinks(f->kv, g->seq, j->layer, kh, f->q + row * qd, qd, nq, g->pos0 + i0, scale, hp->attn_softcap,
                            j->window, j->sinks, f->xb + row * qd, qd, f->scr[ith]);
            continue;
        }
        /* unit u of U: splits s0 .. s1-1 of the item's n_split (the one tile: i0 = 0) */
        int first_split, n_split = attn_split_range(nq, g->pos0, j->window, &first_split);
        int s0 = n_split * u / U, s1 = n_split * (u + 1) / U;
        size_t pf = attn_part_floats(f->kv, j->layer, nq, f->scr[ith]);
        float *part = f->part + f->seg_part0[sg] + ((size_t)local * (size_t)n_split + (size_t)s0) * pf;
        attn_tile_part(f->kv, g->seq, j->layer, kh, f->q + row * qd, qd, nq, g->pos0, scale, hp->attn_softcap,
                       j->window, first_split + s0, s1 - s0, part, f->scr[ith]);
    }
    atomic_fetch_add_explicit(&f->attn_units_run, ran, memory_order_relaxed);
}

/* The attention plan of one layer: seg_units and seg_unit0, seg_part0 for
 * split segments. nth: the threads that will run it. A one-tile causal
 * item at least f->attn_split_min splits long (FWD_ATTN_SPLIT_MIN; 0:
 * never) is cut into one unit per split while the items are fewer than
 * the threads, and, in a batch of one-tile segments (decode), when it holds
 * more than half a thread's share of the batch's splits (one sequence far
 * deeper than the others, or 3 items on 2 threads); only where the
 * partials fit in part. Units are taken from one counter in order. Units
 * of one split (ATTN_SPLIT keys) keep the threads' last units short, so
 * that neither waits long at the barrier, and a worker that wakes late
 * finds less left to do. Cutting the short items too (a 512-key sliding
 * window is 2-3 splits) keeps both threads busy through every layer's
 * attention: run whole by one thread, its hundred-odd microseconds can
 * outlast the other's spin (pool.c; about 60 us on the Xeon), which then
 * sleeps and makes the output product pay a futex wake-up. Returns the layer's units. */
static int attn_plan(lm_fwd *f, const lm_seg *segs, int n_seg, int layer, int window, int nth) {
    int items = f->seg_item0[n_seg], first;
    bool on = f->attn_split_min > 0 && f->part && items > 0 && nth > 1 && f->m->hp.causal; /* split-K is causal */
    long total = 0; /* the batch's key splits over its items, when every segment is one tile */
    for (int g = 0; on && items >= nth && g < n_seg; g++) {
        if (segs[g].n > ATTN_TILE_Q) on = false; /* a prompt's tiles: items enough */
        else
            total += (long)(f->seg_item0[g + 1] - f->seg_item0[g]) *
                attn_split_range(segs[g].n, segs[g].pos0, window, &first);
    }
    size_t used = 0;
    f->seg_unit0[0] = 0;
    for (int g = 0; g < n_seg; g++) {
        int U = 1, n_items = f->seg_item0[g + 1] - f->seg_item0[g];
        if (on && segs[g].n <= ATTN_TILE_Q) {
            int n_split = attn_split_range(segs[g].n, segs[g].pos0, window, &first);
            size_t need = (size_t)n_items * (size_t)n_split * attn_part_floats(f->kv, layer, segs[g].n, f->scr[0]);
            if (n_split >= f->attn_split_min && (items < nth || (long)n_split * 2 * nth > total) &&
                used + need <= f->part_cap) {
                U = n_split;
                f->seg_part0[g] = used;
                used += need;
                f->attn_split_items += n_items;
            }
        }
        f->seg_units[g] = U;
        f->seg_unit0[g + 1] = f->seg_unit0[g] + n_items * U;
    }
    return f->seg_unit0[n_seg];
}

/* Each split item's output from its splits' partials, in split order. */
static void attn_merge(lm_fwd *f, const attn_job *j) {
    const lm_hparams *hp = &f->m->hp;
    size_t qd = (size_t)hp->n_head * hp->head_dim;
    for (int sg = 0; sg < j->n_seg; sg++) {
        if (f->seg_units[sg] == 1) continue;
        const lm_seg *g = &j->segs[sg];
        int first, n_split = attn_split_range(g->n, g->pos0, j->window, &first);
        size_t pf = attn_part_floats(f->kv, j->layer, g->n, f->scr[0]), row = (size_t)f->seg_row0[sg];
        for (int kh = 0; kh < hp->n_head_kv; kh++)
            attn_tile_merge(f->kv, j->layer, kh, g->n, f->part + f->seg_part0[sg] + (size_t)kh * n_split * pf, n_split,
                            j->sinks, f->xb + row * qd, qd, f->scr[0]);
    }
}

static void add_bias(float *y, const float *b, int n_tok, int dim) {
    if (!b) return;
    for (int t = 0; t < n_tok; t++)
        for (int i = 0; i < dim; i++) y[(size_t)t * dim + i] += b[i];
}

/* Per-token work between the matrix products (norms, Q/K norms and RoPE,
 * residual adds, the MLP activation), one stage at a time, split across
 * the pool in blocks of ROWS_BLOCK tokens when the batch is large. A
 * token's arithmetic is the same whichever thread runs it. */
enum { ROWS_ATTN_IN, ROWS_QK, ROWS_GATE, ROWS_ATTN_OUT, ROWS_FFN_IN, ROWS_ACT, ROWS_FFN_OUT };
#define ROWS_BLOCK 8

typedef struct {
    lm_fwd *f;
    const lm_layer *l;
    int stage, n;
    atomic_int next;
} rows_job;

static void rows_range(lm_fwd *f, const lm_layer *l, int stage, int t0, int t1) {
    const lm_hparams *hp = &f->m->hp;
    const int E = hp->n_embd, hd = hp->head_dim;
    const size_t qd = (size_t)hp->n_head * hd, kvd = (size_t)hp->n_head_kv * hd, ff = (size_t)hp->n_ff;
    for (int t = t0; t < t1; t++) {
        float *x = f->x + (size_t)t * E, *xb = f->xb + (size_t)t * E, *hb = f->hb + (size_t)t * E;
        switch (stage) {
            case ROWS_ATTN_IN: ops_rmsnorm(xb, x, l->attn_norm, E, hp->norm_eps); break;
            case ROWS_QK: {
                float *q = f->q + (size_t)t * qd, *k = f->k + (size_t)t * kvd;
                if (hp->attn_gate) /* per head [query | gate] from the doubled product */
                    for (int h = 0; h < hp->n_head; h++) {
                        const float *src = f->qg + (size_t)t * 2 * qd + (size_t)h * 2 * hd;
                        memcpy(q + (size_t)h * hd, src, (size_t)hd * sizeof *q);
                        memcpy(f->gate + (size_t)t * qd + (size_t)h * hd, src + hd, (size_t)hd * sizeof *q);
                    }
                if (l->q_norm)
                    for (int h = 0; h < hp->n_head; h++)
                        ops_rmsnorm(q + h * hd, q + h * hd, l->q_norm, hd, hp->norm_eps);
                if (l->k_norm)
                    for (int h = 0; h < hp->n_head_kv; h++)
                        ops_rmsnorm(k + h * hd, k + h * hd, l->k_norm, hd, hp->norm_eps);
                const float *cs = f->cs + (size_t)t * hp->n_rot;
                ops_rope_apply(q, hp->n_head, hd, hp->n_rot, cs, hp->rope_style);
                ops_rope_apply(k, hp->n_head_kv, hd, hp->n_rot, cs, hp->rope_style);
                break;
            }
            case ROWS_GATE: { /* xb holds the heads' output */
                float *o = f->xb + (size_t)t * qd;
                const float *gt = f->gate + (size_t)t * qd;
                for (size_t i = 0; i < qd; i++) o[i] *= 1.0f / (1.0f + expf(-gt[i]));
                break;
            }
            case ROWS_ATTN_OUT: /* hb holds attn · Woᵀ */
                if (l->post_attn_norm) ops_rmsnorm(hb, hb, l->post_attn_norm, E, hp->norm_eps);
                for (int i = 0; i < E; i++) x[i] += hb[i];
                break;
            case ROWS_FFN_IN: ops_rmsnorm(xb, x, l->ffn_norm, E, hp->norm_eps); break;
            case ROWS_ACT: {
                float *g = f->hb + (size_t)t * ff, *u = f->hb2 + (size_t)t * ff;
                if (hp->gelu) ops_geglu(g, u, (int)ff);
                else ops_swiglu(g, u, (int)ff);
                break;
            }
            case ROWS_FFN_OUT: /* xb holds the down projection */
                if (l->post_ffn_norm) ops_rmsnorm(xb, xb, l->post_ffn_norm, E, hp->norm_eps);
                for (int i = 0; i < E; i++) x[i] += xb[i];
                break;
            default: break;
        }
    }
}

static void rows_worker(void *arg, int ith, int nth) {
    rows_job *j = arg;
    for (;;) {
        int t0 = atomic_fetch_add(&j->next, ROWS_BLOCK);
        if (t0 >= j->n) break;
        rows_range(j->f, j->l, j->stage, t0, t0 + ROWS_BLOCK < j->n ? t0 + ROWS_BLOCK : j->n);
    }
}

static void run_rows(lm_fwd *f, const lm_layer *l, int stage, int n) {
    if (n < 4 * ROWS_BLOCK) { /* not worth a wake-up */
        rows_range(f, l, stage, 0, n);
        return;
    }
    rows_job j = {.f = f, .l = l, .stage = stage, .n = n};
    atomic_init(&j.next, 0);
    pool_run(f->pool, rows_worker, &j);
}

/* ---- the local pass ------------------------------------------------------ */

/* One pass in progress: its batch, its span and the last profile mark. */
typedef struct {
    lm_fwd *f;
    const fwd_span *span;
    const lm_seg *segs;
    int n_seg, n;
    double attn_work; /* the batch's attention products, to decide whether a pool wake-up pays */
    double prof_t;    /* the time of the last profile mark */
} pass;

/* Closes the interval started at the previous mark and charges it to slot,
 * and the pool's dispatch time in it (pool_timing: publishing runs and
 * waiting at their barriers) to prof_gap[slot], part of prof[slot]. */
static void prof(pass *p, int slot) {
    lm_fwd *f = p->f;
    if (!f->profile) return;
    double now = prof_clock(f, &f->prof_gap[slot], &f->prof_sleeps[slot]);
    f->prof[slot] += now - p->prof_t;
    p->prof_t = now;
}

/* Tensor parallel: y (n, n_embd) := the sum over ranks of each rank's partial
 * product (the span's reduce hook). Nothing when the model is whole. */
static int reduce(pass *p, float *y, char *err, size_t errlen) {
    if (p->f->m->tp.size <= 1) return 0;
    return p->span->hooks->reduce(y, (size_t)p->n * (size_t)p->f->m->hp.n_embd, err, errlen);
}

/* Row -> position, segment -> first row and first attention work item. */
static void batch_layout(pass *p) {
    lm_fwd *f = p->f;
    const lm_hparams *hp = &f->m->hp;
    f->seg_row0[0] = 0;
    f->seg_item0[0] = 0;
    p->attn_work = 0;
    for (int g = 0; g < p->n_seg; g++) {
        const lm_seg *sg = &p->segs[g];
        for (int i = 0; i < sg->n; i++) f->pos[f->seg_row0[g] + i] = sg->pos0 + i;
        f->seg_row0[g + 1] = f->seg_row0[g] + sg->n;
        f->seg_item0[g + 1] = f->seg_item0[g] + (sg->n + ATTN_TILE_Q - 1) / ATTN_TILE_Q * hp->n_head_kv;
        p->attn_work += (double)sg->n * hp->n_head * (sg->pos0 + sg->n) * hp->head_dim;
    }
}

static void embed(lm_fwd *f, const int32_t *tokens, int n) {
    const lm_hparams *hp = &f->m->hp;
    int E = hp->n_embd;
    for (int t = 0; t < n; t++) {
        float *x = f->x + (size_t)t * E;
        ops_get_row(&f->m->tok_embd, tokens[t], x);
        if (hp->emb_scale != 1.0f)
            for (int i = 0; i < E; i++) x[i] *= hp->emb_scale;
    }
}

/* The RoPE angles of every row for layer l's base and scale into f->cs. */
static void rope_angles(lm_fwd *f, const lm_layer *l, int n) {
    const lm_hparams *hp = &f->m->hp;
    /* phi3 long-rope: the long factors when the context in use passes the original one */
    const float *rope_ff = f->dims.n_ctx > hp->n_ctx_orig ? hp->rope_factors_long : hp->rope_factors_short;
    bool rope_ext = rope_ff || (hp->rope_attn_factor != 1.0f && hp->rope_attn_factor != 0.0f);
    for (int t = 0; t < n; t++)
        if (hp->rope_yarn)
            ops_rope_angles_yarn(f->cs + (size_t)t * hp->n_rot, hp->n_rot, f->pos[t], l->rope_base, hp->yarn_factor,
                                 hp->yarn_low, hp->yarn_high, hp->rope_attn_factor);
        else if (rope_ext)
            ops_rope_angles_ext(f->cs + (size_t)t * hp->n_rot, hp->n_rot, f->pos[t], l->rope_base, l->rope_scale,
                                rope_ff, hp->rope_attn_factor);
        else ops_rope_angles(f->cs + (size_t)t * hp->n_rot, hp->n_rot, f->pos[t], l->rope_base, l->rope_scale);
    const int *sec = hp->rope_sections;
    if (sec[0] + sec[1] + sec[2] + sec[3] == 0) return;
    /* qwen35's interleaved sections: pair i turns with the first three axes' position
     * (a text token's), the rest with the fourth's, 0 */
    int n_sect = sec[0] + sec[1] + sec[2] + sec[3];
    for (int i = 0; i < hp->n_rot / 2; i++) {
        int s = i % n_sect;
        bool text = (s % 3 == 0 && s < 3 * sec[0]) || (s % 3 == 1 && s < 3 * sec[1]) || (s % 3 == 2 && s < 3 * sec[2]);
        if (text) continue;
        for (int t = 0; t < n; t++)
            f->cs[(size_t)t * hp->n_rot + 2 * i] = 1, f->cs[(size_t)t * hp->n_rot + 2 * i + 1] = 0;
    }
}

/* Multi-head attention of layer li: xb (normed) in; Q/K/V, their RoPE, the
 * cache rows, attention per segment; the heads' outputs in xb. */
static void attn_mha(pass *p, const lm_layer *l, int li) {
    lm_fwd *f = p->f;
    const lm_hparams *hp = &f->m->hp;
    const int n = p->n;
    const size_t kvd = (size_t)hp->n_head_kv * hp->head_dim, qd = (size_t)hp->n_head * hp->head_dim;
    float *const qkv_y[3] = {hp->attn_gate ? f->qg : f->q, f->k, f->v};
    const lm_weight *const qkv_w[3] = {&l->wq, &l->wk, &l->wv};
    ops_matmul_multi(f->pool, 3, qkv_y, qkv_w, f->xb, n, f->act);
    add_bias(f->q, l->bq, n, (int)qd);
    add_bias(f->k, l->bk, n, (int)kvd);
    add_bias(f->v, l->bv, n, (int)kvd);
    prof(p, LM_PROF_QKV);
    run_rows(f, l, ROWS_QK, n);
    for (int g = 0; g < p->n_seg; g++) {
        const lm_seg *sg = &p->segs[g];
        size_t r0 = (size_t)f->seg_row0[g];
        kv_store_rows(f->kv, sg->seq, l->kv_layer, sg->pos0, sg->n, f->k + r0 * kvd, kvd, f->v + r0 * kvd, kvd);
    }
    prof(p, LM_PROF_ROPE);
    attn_job aj = {
        .f = f, .segs = p->segs, .layer = l->kv_layer, .n_seg = p->n_seg, .window = l->window, .sinks = l->sinks};
    /* tiny attention (short contexts, small heads) is not worth a wake-up,
     * nor is one unit, which the caller runs while a woken worker idles */
    lm_pool *pool = p->attn_work < 64.0 * 1024 ? NULL : f->pool;
    if (attn_plan(f, p->segs, p->n_seg, l->kv_layer, l->window, pool ? pool_size(pool) : 1) < 2) pool = NULL;
    runs_init(f, f->seg_unit0[p->n_seg], pool ? pool_size(pool) : 1);
    f->attn_units_planned += f->seg_unit0[p->n_seg];
    pool_run(pool, attn_worker, &aj);
    attn_merge(f, &aj);
    if (hp->attn_gate) run_rows(f, l, ROWS_GATE, n);
    prof(p, LM_PROF_ATTN);
}

/* Latent attention of layer li (mla.h): xb in, the heads' outputs in xb. */
static void attn_mla(pass *p, const lm_layer *l, int li) {
    mla_attn(p->f, l, li, p->segs, p->n_seg, p->n, MLA_PROJ);
    prof(p, LM_PROF_QKV);
    mla_attn(p->f, l, li, p->segs, p->n_seg, p->n, MLA_ROPE);
    prof(p, LM_PROF_ROPE);
    mla_attn(p->f, l, li, p->segs, p->n_seg, p->n, MLA_SCORES);
    prof(p, LM_PROF_ATTN);
    mla_attn(p->f, l, li, p->segs, p->n_seg, p->n, MLA_VALUES); /* charged to the output slot with wo */
}

/* x += attention(norm(x)) · Woᵀ, multi-head or latent; or, in a recurrent
 * layer, x += the gated DeltaNet's output (gdn.h). */
static int attn_block(pass *p, const lm_layer *l, int li, char *err, size_t errlen) {
    lm_fwd *f = p->f;
    run_rows(f, l, ROWS_ATTN_IN, p->n);
    prof(p, LM_PROF_NORM);
    if (l->gdn) { /* its own slot, its output product charged to the output's */
        gdn_layer(f, l, p->segs, p->n_seg, p->n);
        prof(p, LM_PROF_RECUR);
        if (reduce(p, f->hb, err, errlen)) return -1;
        run_rows(f, l, ROWS_ATTN_OUT, p->n);
        prof(p, LM_PROF_WO);
        return 0;
    }
    if (l->mla) attn_mla(p, l, li);
    else attn_mha(p, l, li);
    /* hb as a temporary of n_embd per token */
    ops_matmul(f->pool, f->hb, &l->wo, f->xb, p->n, f->act);
    if (reduce(p, f->hb, err, errlen)) return -1;
    add_bias(f->hb, l->bo, p->n, f->m->hp.n_embd); /* gpt-oss: once, on the whole sum */
    run_rows(f, l, ROWS_ATTN_OUT, p->n);
    prof(p, LM_PROF_WO);
    return 0;
}

/* The dense FFN: xb (normed) in, the down projection in xb. */
static int ffn_dense(pass *p, const lm_layer *l, char *err, size_t errlen) {
    lm_fwd *f = p->f;
    float *const gu_y[2] = {f->hb, f->hb2};
    const lm_weight *const gu_w[2] = {&l->w_gate, &l->w_up};
    ops_matmul_multi(f->pool, 2, gu_y, gu_w, f->xb, p->n, f->act);
    prof(p, LM_PROF_FFN_UP);
    run_rows(f, l, ROWS_ACT, p->n);
    prof(p, LM_PROF_FFN_ACT);
    ops_matmul(f->pool, f->xb, &l->w_down, f->hb, p->n, f->act);
    return reduce(p, f->xb, err, errlen);
}

/* The experts (moe.h): xb in, xb out; every expert split by rows: partial
 * sums. Charged to the FFN's first slot, the residual add to the last. */
static int ffn_moe(pass *p, const lm_layer *l, char *err, size_t errlen) {
    lm_fwd *f = p->f;
    if (f->m->ep.size > 1) { /* experts placed on ranks: ep.h's exchange */
        if (ep_moe_ffn(f->moe, f->pool, f->m, l, (int)(l - f->m->layers), f->xb, p->n, f->act, p->span->hooks, err,
                       errlen) ||
            reduce(p, f->xb, err, errlen)) /* with --tp, each tensor rank's rows are partial sums */
            return -1;
        prof(p, LM_PROF_FFN_UP);
        return 0;
    }
    moe_ffn(f->moe, f->pool, f->m, l, f->xb, p->n, f->act, NULL);
    if (reduce(p, f->xb, err, errlen)) return -1;
    prof(p, LM_PROF_FFN_UP);
    return 0;
}

/* x += ffn(norm(x)), dense or experts. */
static int ffn_block(pass *p, const lm_layer *l, char *err, size_t errlen) {
    lm_fwd *f = p->f;
    run_rows(f, l, ROWS_FFN_IN, p->n);
    prof(p, LM_PROF_NORM);
    if (l->moe ? ffn_moe(p, l, err, errlen) : ffn_dense(p, l, err, errlen)) return -1;
    run_rows(f, l, ROWS_FFN_OUT, p->n);
    prof(p, LM_PROF_FFN_DOWN);
    return 0;
}

/* The LM head over rows normed inputs in f->xb: logits (rows, n_vocab). Split
 * by vocabulary, each rank's slice (rows, tp.n_vocab) is computed into the
 * front of a chunk of logits and the slices gathered over it (the span's
 * gather hook), a few rows at a time (the gather scratch holds TP_HEAD_ROWS
 * whole rows). */
#define TP_HEAD_ROWS 16
static int lm_head(pass *p, float *logits, int rows, char *err, size_t errlen) {
    lm_fwd *f = p->f;
    const lm_model *m = f->m;
    if (m->tp.size <= 1) {
        ops_matmul(f->pool, logits, &m->output, f->xb, rows, f->act);
        return 0;
    }
    size_t E = (size_t)m->hp.n_embd, V = (size_t)m->hp.n_vocab;
    for (int r0 = 0; r0 < rows; r0 += TP_HEAD_ROWS) {
        int nr = rows - r0 < TP_HEAD_ROWS ? rows - r0 : TP_HEAD_ROWS;
        float *out = logits + (size_t)r0 * V; /* (nr, V); first (nr, tp.n_vocab) the local slice */
        ops_matmul(f->pool, out, &m->output, f->xb + (size_t)r0 * E, nr, f->act);
        if (p->span->hooks->gather_cols(out, nr, m->tp.vocab_split, out, err, errlen)) return -1;
    }
    return 0;
}

/* The final norm of the rows that want logits, then the LM head: the whole
 * (or this rank's slice, gathered) with gemma2's final soft-cap, or a
 * draft's vocabulary subset (head_sub.c, softcap included). */
static int head_block(pass *p, float *logits, char *err, size_t errlen) {
    lm_fwd *f = p->f;
    const lm_hparams *hp = &f->m->hp;
    const int E = hp->n_embd;
    int rows = 0;
    for (int t = 0; f->hid && t < p->n; t++) /* every row's normed state, for the MTP head */
        ops_rmsnorm(f->hid + (size_t)t * E, f->x + (size_t)t * E, f->m->out_norm, E, hp->norm_eps);
    for (int g = 0; g < p->n_seg; g++)
        for (int i = p->segs[g].n - p->segs[g].n_logits; i < p->segs[g].n; i++, rows++) {
            int t = f->seg_row0[g] + i;
            ops_rmsnorm(f->xb + (size_t)rows * E, f->x + (size_t)t * E, f->m->out_norm, E, hp->norm_eps);
        }
    prof(p, LM_PROF_NORM);
    if (f->head) {
        if (rows) head_sub_logits(f, logits, rows);
    } else {
        if (rows && lm_head(p, logits, rows, err, errlen)) return -1;
        if (hp->final_softcap > 0) { /* gemma2 */
            float cap = hp->final_softcap;
            for (size_t i = 0; i < (size_t)rows * hp->n_vocab; i++) logits[i] = cap * tanhf(logits[i] / cap);
        }
    }
    prof(p, LM_PROF_LM_HEAD);
    return 0;
}

fwd_span fwd_span_stage(const lm_model *m, const fwd_hooks *hooks) {
    return (fwd_span){.layer0 = m->pp.layer0,
                      .layer1 = m->pp.layer1,
                      .embed = m->pp.stage == 0,
                      .head = m->pp.stage >= m->pp.size - 1,
                      .hooks = hooks};
}

int fwd_check(const lm_fwd *f, const int32_t *tokens, const lm_seg *segs, int n_seg, int *n_out, char *err,
              size_t errlen) {
    const lm_hparams *hp = &f->m->hp;
    int n = 0;
    if (n_seg <= 0) return lm_err(err, errlen, "no tokens to process");
    for (int g = 0; g < n_seg; g++) {
        const lm_seg *sg = &segs[g];
        if (sg->n <= 0 || sg->n_logits < 0 || sg->n_logits > sg->n || sg->pos0 < 0 || !sg->seq)
            return lm_err(err, errlen, "segment %d is malformed", g);
        if (sg->pos0 + sg->n > f->dims.n_ctx)
            return lm_err(err, errlen, "segment %d passes the context (%d positions)", g, f->dims.n_ctx);
        if (f->m->pp.rec1 > f->m->pp.rec0 && (!sg->rconv || !sg->rmat))
            return lm_err(err, errlen, "segment %d has no recurrent state for the model's linear-attention layers", g);
        if (sg->ck &&
            (!hp->n_rlayer || !rstate_ckpt_reserved(sg->ck, sg->ck_slot, sg->pos0 + 1) ||
             !rstate_ckpt_reserved(sg->ck, sg->ck_slot, sg->pos0 + sg->n)))
            return lm_err(err, errlen, "segment %d: no recurrent state checkpoints reserved for positions %d .. %d", g,
                          sg->pos0 + 1, sg->pos0 + sg->n);
        if (kv_seq_len(sg->seq) < sg->pos0 + sg->n)
            return lm_err(err, errlen, "segment %d: its sequence holds %d positions, %d needed", g, kv_seq_len(sg->seq),
                          sg->pos0 + sg->n);
        n += sg->n;
        if (n > f->dims.n_batch) return lm_err(err, errlen, "batch of more than %d tokens", f->dims.n_batch);
    }
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
            return lm_err(err, errlen, "token id %d is out of range [0, %d)", tokens[i], hp->n_vocab);
    if (enc_check(f, segs, n_seg, err, errlen)) return -1; /* non-causal and encoder rules (encoder.h) */
    *n_out = n;
    return 0;
}

int fwd_pass(lm_fwd *f, const fwd_span *span, const int32_t *tokens, int n, const lm_seg *segs, int n_seg,
             float *logits, char *err, size_t errlen) {
    const lm_model *m = f->m;
    if (span->layer0 < m->pp.layer0 || span->layer1 > m->pp.layer1 || span->layer0 > span->layer1)
        return lm_err(err, errlen, "layers %d..%d of a model holding %d..%d", span->layer0, span->layer1, m->pp.layer0,
                      m->pp.layer1);
    if (m->tp.size > 1 && (!span->hooks || !span->hooks->reduce || !span->hooks->gather_cols))
        return lm_err(err, errlen, "a tensor-parallel shard's pass without its reduce and gather hooks");
    if (m->ep.size > 1 && (!span->hooks || !span->hooks->alltoallv || !span->hooks->gather_ep))
        return lm_err(err, errlen, "an expert-parallel pass without its all-to-all and gather hooks");
    if (m->hp.encoder) return enc_pass(f, tokens, n, segs, n_seg, err, errlen); /* encoder.h */
    if (!m->hp.causal && enc_check(f, segs, n_seg, err, errlen)) return -1;     /* gemma-embedding: as an encoder's */
    pass p = {.f = f, .span = span, .segs = segs, .n_seg = n_seg, .n = n};
    if (f->profile) p.prof_t = prof_clock(f, NULL, NULL);
    batch_layout(&p);
    if (span->embed) embed(f, tokens, n);
    prof(&p, LM_PROF_EMBED);
    float cs_base = -1, cs_scale = -1; /* the RoPE the angles in f->cs are for */
    for (int li = span->layer0; li < span->layer1; li++) {
        const lm_layer *l = &m->layers[li];
        if (l->rope_base != cs_base || l->rope_scale != cs_scale) {
            rope_angles(f, l, n);
            cs_base = l->rope_base;
            cs_scale = l->rope_scale;
        }
        if (attn_block(&p, l, li, err, errlen) || ffn_block(&p, l, err, errlen)) return -1;
    }
    /* a pipeline stage before the last: x goes on (pp.c); no logits and no states wanted: done */
    if (!span->head || (!logits && !f->hid)) return 0;
    return head_block(&p, logits, err, errlen);
}
