/*
 * forward.c - the decoder forward pass over a batch of one sequence's tokens.
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
 * then logits = rmsnorm(x) * out_norm · Woutᵀ for the rows asked for.
 */
#include "model/forward.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "model/ops.h"
#include "format/quant.h"
#include "base/util.h"

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

const char *const lm_prof_names[LM_PROF_COUNT] = {
    "embedding", "norms", "q/k/v matmul", "rope", "attention", "output matmul", "ffn gate+up matmul",
    "ffn activation", "ffn down matmul", "lm head",
};

/* Profiling: PROF(s, slot) closes the interval started at the previous
 * PROF call and charges it to slot. */
#define PROF_START(s) double prof_t_ = (s)->profile ? lm_now() : 0
#define PROF(s, slot)                          \
    do {                                       \
        if ((s)->profile) {                    \
            double now_ = lm_now();            \
            (s)->prof[slot] += now_ - prof_t_; \
            prof_t_ = now_;                    \
        }                                      \
    } while (0)

lm_state *state_new(const lm_model *m, lm_pool *pool, int n_ctx, int max_batch, char *err, size_t errlen) {
    return state_new_kv(m, pool, n_ctx, max_batch, LM_TYPE_F32, err, errlen);
}

/* The common part of every constructor: buffers for max_batch tokens, a
 * sequence in kv (taken over when owns_kv), attention scratch per thread. */
static lm_state *state_build(const lm_model *m, lm_pool *pool, kv_pool *kv, bool owns_kv, int n_ctx, int max_batch,
                             char *err, size_t errlen) {
    const lm_hparams *hp = &m->hp;
    if (max_batch <= 0) max_batch = 512;
    if (max_batch > n_ctx) max_batch = n_ctx;
    lm_state *s = lm_calloc(1, sizeof *s);
    if (!s) {
        if (owns_kv) kv_pool_free(kv);
        lm_err(err, errlen, "out of memory");
        return NULL;
    }
    s->m = m;
    s->pool = pool;
    s->n_ctx = n_ctx;
    s->max_batch = max_batch;
    s->kv = kv;
    s->owns_kv = owns_kv;
    size_t kvd = (size_t)hp->n_head_kv * hp->head_dim, qd = (size_t)hp->n_head * hp->head_dim;
    size_t B = (size_t)max_batch, E = (size_t)hp->n_embd;
    s->seq = kv_seq_new(s->kv, err, errlen);
    s->n_scr = pool_size(pool);
    s->scr = lm_calloc((size_t)s->n_scr, sizeof *s->scr);
    for (int i = 0; s->scr && i < s->n_scr; i++)
        if (!(s->scr[i] = attn_scratch_new(s->kv, hp->n_head, err, errlen))) {
            state_free(s);
            return NULL;
        }
    s->x = lm_malloc(B * E * sizeof(float));
    s->xb = lm_malloc(B * max_sz(E, qd) * sizeof(float));
    s->q = lm_malloc(B * qd * sizeof(float));
    s->k = lm_malloc(B * kvd * sizeof(float));
    s->v = lm_malloc(B * kvd * sizeof(float));
    s->hb = lm_malloc(B * (size_t)hp->n_ff * sizeof(float));
    s->hb2 = lm_malloc(B * (size_t)hp->n_ff * sizeof(float));
    s->cs = lm_malloc(B * (size_t)hp->n_rot * sizeof(float));
    s->pos = lm_malloc(B * sizeof(int));
    s->seg_row0 = lm_malloc((B + 1) * sizeof(int));
    s->seg_item0 = lm_malloc((B + 1) * sizeof(int));
    /* activation scratch: the largest input row of any matmul, in any type used */
    size_t a = 0;
    for (int li = 0; li < hp->n_layer; li++) {
        const lm_weight *lw[MODEL_LAYER_MATRICES];
        model_layer_matrices(&m->layers[li], lw);
        for (int i = 0; i < MODEL_LAYER_MATRICES; i++)
            a = max_sz(a, ops_matmul_scratch(lw[i]->type, lw[i]->cols, max_batch));
    }
    a = max_sz(a, ops_matmul_scratch(m->output.type, m->output.cols, max_batch));
    s->act_bytes = a;
    s->act = a ? lm_malloc(a) : NULL;
    if (!s->seq || !s->scr || !s->x || !s->xb || !s->q || !s->k || !s->v || !s->hb || !s->hb2 ||
        !s->cs || !s->pos || !s->seg_row0 || !s->seg_item0 || (a && !s->act)) {
        lm_err(err, errlen, "out of memory allocating the state for context %d", n_ctx);
        state_free(s);
        return NULL;
    }
    return s;
}

void state_kv_config(const lm_model *m, kv_config *c) {
    const lm_hparams *hp = &m->hp;
    kv_config_init(c, hp->n_layer, hp->n_head_kv, hp->head_dim);
    if (hp->swa_window > 0) {
        c->window = hp->swa_window;
        c->layer_local = m->layer_local;
    }
}

lm_state *state_new_kv(const lm_model *m, lm_pool *pool, int n_ctx, int max_batch, uint32_t kv_type, char *err,
                       size_t errlen) {
    const lm_hparams *hp = &m->hp;
    if (n_ctx <= 0) n_ctx = hp->n_ctx_train;
    kv_config kc;
    state_kv_config(m, &kc);
    kc.type = kv_type;
    kc.n_ctx = n_ctx;
    kc.n_seqs = 1;
    /* state_forward appends at most max_batch positions at a time (as
     * state_build clamps it) */
    kc.chunk = max_batch <= 0 ? 512 : max_batch > n_ctx ? n_ctx : max_batch;
    kv_pool *kv = kv_pool_new(&kc, err, errlen);
    if (!kv) return NULL;
    return state_build(m, pool, kv, true, n_ctx, max_batch, err, errlen);
}

lm_state *state_new_shared(const lm_model *m, lm_pool *pool, kv_pool *kv, int n_ctx, int max_batch, char *err,
                           size_t errlen) {
    if (n_ctx <= 0) n_ctx = m->hp.n_ctx_train;
    return state_build(m, pool, kv, false, n_ctx, max_batch, err, errlen);
}

lm_state *state_fork(const lm_state *src, char *err, size_t errlen) {
    lm_state *s = state_build(src->m, src->pool, src->kv, false, src->n_ctx, src->max_batch, err, errlen);
    if (!s) return NULL;
    kv_seq *f = kv_fork(s->kv, src->seq, err, errlen);
    if (!f) {
        state_free(s);
        return NULL;
    }
    kv_seq_free(s->kv, s->seq);
    s->seq = f;
    s->n_past = src->n_past;
    return s;
}

int state_prefix_match(lm_state *s, const int32_t *tokens, int n, uint64_t salt) {
    if (s->n_past != 0) return 0;
    if (n > s->n_ctx) n = s->n_ctx;
    s->n_past = kv_prefix_match(s->kv, s->seq, tokens, n, salt);
    return s->n_past;
}

void state_prefix_commit(lm_state *s, const int32_t *tokens, uint64_t salt) {
    kv_prefix_commit(s->kv, s->seq, tokens, s->n_past, salt);
}

void state_free(lm_state *s) {
    if (!s) return;
    for (int i = 0; s->scr && i < s->n_scr; i++) attn_scratch_free(s->scr[i]);
    lm_free(s->scr);
    if (s->owns_kv) kv_pool_free(s->kv); /* frees s->seq too */
    else if (s->kv) kv_seq_free(s->kv, s->seq);
    lm_free(s->x);
    lm_free(s->xb);
    lm_free(s->q);
    lm_free(s->k);
    lm_free(s->v);
    lm_free(s->hb);
    lm_free(s->hb2);
    lm_free(s->cs);
    lm_free(s->pos);
    lm_free(s->seg_row0);
    lm_free(s->seg_item0);
    lm_free(s->act);
    lm_free(s);
}

void state_reset(lm_state *s) {
    kv_truncate(s->kv, s->seq, 0, NULL, 0);
    s->n_past = 0;
}

/* Attention for one layer over a batch of segments; work items are
 * (segment, query tile, kv head) triples, each computing every query head of
 * that KV head's group for up to ATTN_TILE_Q rows of one sequence. */
typedef struct {
    lm_state *s;
    const lm_seg *segs;
    int layer, n_seg;
    int window;           /* 0: whole context */
    atomic_int next;
} attn_job;

static void attn_worker(void *arg, int ith, int nth) {
    attn_job *j = arg;
    lm_state *s = j->s;
    const lm_hparams *hp = &s->m->hp;
    size_t qd = (size_t)hp->n_head * hp->head_dim;
    float scale = 1.0f / sqrtf((float)hp->head_dim);
    const int *first = s->seg_item0; /* (n_seg + 1) first work item of each segment */
    int total = first[j->n_seg], sg = 0;
    for (;;) {
        int item = atomic_fetch_add(&j->next, 1);
        if (item >= total) break;
        while (first[sg + 1] <= item) sg++; /* items are taken in increasing order */
        const lm_seg *g = &j->segs[sg];
        int local = item - first[sg];
        int i0 = local / hp->n_head_kv * ATTN_TILE_Q, kh = local % hp->n_head_kv;
        int nq = g->n - i0 < ATTN_TILE_Q ? g->n - i0 : ATTN_TILE_Q;
        size_t row = (size_t)s->seg_row0[sg] + (size_t)i0;
        attn_tile(s->kv, g->seq, j->layer, kh, s->q + row * qd, qd, nq, g->pos0 + i0, scale, j->window,
                  s->xb + row * qd, qd, s->scr[ith]);
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
enum { ROWS_ATTN_IN, ROWS_QK, ROWS_ATTN_OUT, ROWS_FFN_IN, ROWS_ACT, ROWS_FFN_OUT };
#define ROWS_BLOCK 8

typedef struct {
    lm_state *s;
    const lm_layer *l;
    int stage, n;
    atomic_int next;
} rows_job;

static void rows_range(lm_state *s, const lm_layer *l, int stage, int t0, int t1) {
    const lm_hparams *hp = &s->m->hp;
    const int E = hp->n_embd, hd = hp->head_dim;
    const size_t qd = (size_t)hp->n_head * hd, kvd = (size_t)hp->n_head_kv * hd, ff = (size_t)hp->n_ff;
    for (int t = t0; t < t1; t++) {
        float *x = s->x + (size_t)t * E, *xb = s->xb + (size_t)t * E, *hb = s->hb + (size_t)t * E;
        switch (stage) {
        case ROWS_ATTN_IN: ops_rmsnorm(xb, x, l->attn_norm, E, hp->norm_eps); break;
        case ROWS_QK: {
            float *q = s->q + (size_t)t * qd, *k = s->k + (size_t)t * kvd;
            if (l->q_norm)
                for (int h = 0; h < hp->n_head; h++) ops_rmsnorm(q + h * hd, q + h * hd, l->q_norm, hd, hp->norm_eps);
            if (l->k_norm)
                for (int h = 0; h < hp->n_head_kv; h++)
                    ops_rmsnorm(k + h * hd, k + h * hd, l->k_norm, hd, hp->norm_eps);
            const float *cs = s->cs + (size_t)t * hp->n_rot;
            ops_rope_apply(q, hp->n_head, hd, hp->n_rot, cs, hp->rope_style);
            ops_rope_apply(k, hp->n_head_kv, hd, hp->n_rot, cs, hp->rope_style);
            break;
        }
        case ROWS_ATTN_OUT: /* hb holds attn · Woᵀ */
            if (l->post_attn_norm) ops_rmsnorm(hb, hb, l->post_attn_norm, E, hp->norm_eps);
            for (int i = 0; i < E; i++) x[i] += hb[i];
            break;
        case ROWS_FFN_IN: ops_rmsnorm(xb, x, l->ffn_norm, E, hp->norm_eps); break;
        case ROWS_ACT: {
            float *g = s->hb + (size_t)t * ff, *u = s->hb2 + (size_t)t * ff;
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
        rows_range(j->s, j->l, j->stage, t0, t0 + ROWS_BLOCK < j->n ? t0 + ROWS_BLOCK : j->n);
    }
}

static void run_rows(lm_state *s, const lm_layer *l, int stage, int n) {
    if (n < 4 * ROWS_BLOCK) { /* not worth a wake-up */
        rows_range(s, l, stage, 0, n);
        return;
    }
    rows_job j = {.s = s, .l = l, .stage = stage, .n = n};
    atomic_init(&j.next, 0);
    pool_run(s->pool, rows_worker, &j);
}

/* One pass over n <= max_batch tokens split into segments (one sequence
 * each, already grown to hold their positions). */
static void forward_batch(lm_state *s, const int32_t *tokens, int n, const lm_seg *segs, int n_seg, float *logits) {
    const lm_model *m = s->m;
    const lm_hparams *hp = &m->hp;
    int E = hp->n_embd, hd = hp->head_dim;
    size_t kvd = (size_t)hp->n_head_kv * hd, qd = (size_t)hp->n_head * hd;
    PROF_START(s);

    /* row -> position, segment -> first row and first attention work item */
    double attn_work = 0;
    s->seg_row0[0] = 0;
    s->seg_item0[0] = 0;
    for (int g = 0; g < n_seg; g++) {
        for (int i = 0; i < segs[g].n; i++) s->pos[s->seg_row0[g] + i] = segs[g].pos0 + i;
        s->seg_row0[g + 1] = s->seg_row0[g] + segs[g].n;
        s->seg_item0[g + 1] = s->seg_item0[g] + (segs[g].n + ATTN_TILE_Q - 1) / ATTN_TILE_Q * hp->n_head_kv;
        attn_work += (double)segs[g].n * hp->n_head * (segs[g].pos0 + segs[g].n) * hd;
    }
    for (int t = 0; t < n; t++) {
        float *x = s->x + (size_t)t * E;
        ops_get_row(&m->tok_embd, tokens[t], x);
        if (hp->emb_scale != 1.0f)
            for (int i = 0; i < E; i++) x[i] *= hp->emb_scale;
    }
    PROF(s, LM_PROF_EMBED);
    float cs_base = -1, cs_scale = -1; /* the RoPE the angles in s->cs are for */
    for (int li = 0; li < hp->n_layer; li++) {
        const lm_layer *l = &m->layers[li];
        if (l->rope_base != cs_base || l->rope_scale != cs_scale) {
            for (int t = 0; t < n; t++)
                ops_rope_angles(s->cs + (size_t)t * hp->n_rot, hp->n_rot, s->pos[t], l->rope_base, l->rope_scale);
            cs_base = l->rope_base;
            cs_scale = l->rope_scale;
        }
        run_rows(s, l, ROWS_ATTN_IN, n);
        PROF(s, LM_PROF_NORM);
        float *const qkv_y[3] = {s->q, s->k, s->v};
        const lm_weight *const qkv_w[3] = {&l->wq, &l->wk, &l->wv};
        ops_matmul_multi(s->pool, 3, qkv_y, qkv_w, s->xb, n, s->act);
        add_bias(s->q, l->bq, n, (int)qd);
        add_bias(s->k, l->bk, n, (int)kvd);
        add_bias(s->v, l->bv, n, (int)kvd);
        PROF(s, LM_PROF_QKV);
        run_rows(s, l, ROWS_QK, n);
        for (int g = 0; g < n_seg; g++) {
            size_t r0 = (size_t)s->seg_row0[g];
            kv_store_rows(s->kv, segs[g].seq, li, segs[g].pos0, segs[g].n, s->k + r0 * kvd, kvd, s->v + r0 * kvd, kvd);
        }
        PROF(s, LM_PROF_ROPE);

        attn_job aj = {.s = s, .segs = segs, .layer = li, .n_seg = n_seg, .window = l->window};
        atomic_init(&aj.next, 0);
        /* tiny attention (short contexts, small heads) is not worth a wake-up */
        pool_run(attn_work < 64.0 * 1024 ? NULL : s->pool, attn_worker, &aj);
        PROF(s, LM_PROF_ATTN);

        /* x += attn · Woᵀ (hb as a temporary of n_embd per token) */
        ops_matmul(s->pool, s->hb, &l->wo, s->xb, n, s->act);
        run_rows(s, l, ROWS_ATTN_OUT, n);
        PROF(s, LM_PROF_WO);

        run_rows(s, l, ROWS_FFN_IN, n);
        PROF(s, LM_PROF_NORM);
        float *const gu_y[2] = {s->hb, s->hb2};
        const lm_weight *const gu_w[2] = {&l->w_gate, &l->w_up};
        ops_matmul_multi(s->pool, 2, gu_y, gu_w, s->xb, n, s->act);
        PROF(s, LM_PROF_FFN_UP);
        run_rows(s, l, ROWS_ACT, n);
        PROF(s, LM_PROF_FFN_ACT);
        ops_matmul(s->pool, s->xb, &l->w_down, s->hb, n, s->act);
        run_rows(s, l, ROWS_FFN_OUT, n);
        PROF(s, LM_PROF_FFN_DOWN);
    }
    if (!logits) return;
    /* only the rows that need logits go through the final norm and LM head */
    int rows = 0;
    for (int g = 0; g < n_seg; g++)
        for (int i = segs[g].n - segs[g].n_logits; i < segs[g].n; i++, rows++) {
            int t = s->seg_row0[g] + i;
            ops_rmsnorm(s->xb + (size_t)rows * E, s->x + (size_t)t * E, m->out_norm, E, hp->norm_eps);
        }
    PROF(s, LM_PROF_NORM);
    if (rows) ops_matmul(s->pool, logits, &m->output, s->xb, rows, s->act);
    PROF(s, LM_PROF_LM_HEAD);
}

int state_forward_segs(lm_state *s, const int32_t *tokens, const lm_seg *segs, int n_seg, float *logits, char *err,
                       size_t errlen) {
    const lm_hparams *hp = &s->m->hp;
    int n = 0;
    if (n_seg <= 0) return lm_err(err, errlen, "no tokens to process");
    for (int g = 0; g < n_seg; g++) {
        const lm_seg *sg = &segs[g];
        if (sg->n <= 0 || sg->n_logits < 0 || sg->n_logits > sg->n || sg->pos0 < 0 || !sg->seq)
            return lm_err(err, errlen, "segment %d is malformed", g);
        if (sg->pos0 + sg->n > s->n_ctx)
            return lm_err(err, errlen, "segment %d passes the context (%d positions)", g, s->n_ctx);
        if (kv_seq_len(sg->seq) < sg->pos0 + sg->n)
            return lm_err(err, errlen, "segment %d: its sequence holds %d positions, %d needed", g,
                          kv_seq_len(sg->seq), sg->pos0 + sg->n);
        n += sg->n;
        if (n > s->max_batch) return lm_err(err, errlen, "batch of more than %d tokens", s->max_batch);
    }
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
            return lm_err(err, errlen, "token id %d is out of range [0, %d)", tokens[i], hp->n_vocab);
    forward_batch(s, tokens, n, segs, n_seg, logits);
    return 0;
}

int state_forward(lm_state *s, const int32_t *tokens, int n, float *logits, bool all_logits, char *err,
                  size_t errlen) {
    const lm_hparams *hp = &s->m->hp;
    if (n <= 0) return lm_err(err, errlen, "no tokens to process");
    if (n > s->n_ctx - s->n_past)
        return lm_err(err, errlen, "context is full: %d positions used of %d, %d more requested", s->n_past,
                      s->n_ctx, n);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
            return lm_err(err, errlen, "token id %d is out of range [0, %d)", tokens[i], hp->n_vocab);
    for (int done = 0; done < n;) {
        int b = n - done < s->max_batch ? n - done : s->max_batch;
        bool last = done + b == n;
        float *out = NULL;
        if (logits && all_logits) out = logits + (size_t)done * hp->n_vocab;
        else if (logits && last) out = logits;
        /* positions n_past .. n_past+b-1 get cache slots before the pass writes them */
        if (kv_append(s->kv, s->seq, b, err, errlen) != KV_OK) return -1;
        lm_seg seg = {.seq = s->seq, .pos0 = s->n_past, .n = b, .n_logits = !out ? 0 : all_logits ? b : 1};
        forward_batch(s, tokens + done, b, &seg, 1, out);
        s->n_past += b;
        done += b;
    }
    return 0;
}
