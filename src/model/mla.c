/*
 * mla.c - multi-head latent attention of deepseek2 layers (mla.h for the
 * equations): the low-rank query and latent products, the latent cache
 * rows, the absorbed queries, attention in the latent space and the values'
 * up-projection.
 *
 * Invariants: every buffer is sized for n_batch tokens (and one set of
 * per-head buffers per pool thread) at mla_ws_new and never grows; a row's
 * arithmetic is the same whatever else is in the batch and whichever thread
 * runs it.
 */
#include "model/mla.h"

#include <stdatomic.h>
#include <string.h>

#include "model/ops.h"
#include "kv/attn.h"
#include "base/util.h"

/* Per-thread buffers of the per-head products. */
typedef struct {
    float *in;  /* (n_batch, max(qk_nope, R)) one head's gathered input rows */
    float *out; /* (n_batch, max(R, v_head_dim)) its product */
    void *act;  /* ops_matmul activation scratch for those products */
} head_buf;

struct mla_ws {
    int n_batch, n_thr;
    float *q;     /* (n_batch, n_head * qk) the queries before absorption */
    float *qa;    /* (n_batch, q_lora_rank) the query bottleneck, or NULL */
    float *ol;    /* (n_batch, n_head * R) attention output in the latent space */
    head_buf *hb; /* (n_thr) */
};

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

size_t mla_act_bytes(const lm_model *m, int n_batch) {
    size_t a = 0;
    for (int i = 0; m->mla && i < m->hp.n_layer; i++) {
        const lm_mla *l = &m->mla[i];
        if (l->q_a.rows) a = max_sz(a, ops_matmul_scratch(l->q_a.type, l->q_a.cols, n_batch));
        a = max_sz(a, ops_matmul_scratch(l->q_b.type, l->q_b.cols, n_batch));
        a = max_sz(a, ops_matmul_scratch(l->kv_a.type, l->kv_a.cols, n_batch));
    }
    return a;
}

/* Scratch of the per-head products (k_b, v_b of every layer and head). */
static size_t head_act_bytes(const lm_model *m, int n_batch) {
    size_t a = 0;
    for (int i = 0; i < m->hp.n_layer; i++)
        for (int h = 0; h < m->hp.n_head; h++) {
            const lm_weight *kb = &m->mla[i].k_b[h], *vb = &m->mla[i].v_b[h];
            a = max_sz(a, ops_matmul_scratch(kb->type, kb->cols, n_batch));
            a = max_sz(a, ops_matmul_scratch(vb->type, vb->cols, n_batch));
        }
    return a;
}

mla_ws *mla_ws_new(const lm_model *m, int n_batch, int n_threads, char *err, size_t errlen) {
    const lm_hparams *hp = &m->hp;
    mla_ws *w = lm_calloc(1, sizeof *w);
    if (!w) {
        lm_err(err, errlen, "out of memory");
        return NULL;
    }
    size_t B = (size_t)n_batch, H = (size_t)hp->n_head, R = (size_t)hp->kv_lora_rank;
    size_t qk = (size_t)(hp->qk_nope + hp->n_rot);
    w->n_batch = n_batch;
    w->n_thr = n_threads < 1 ? 1 : n_threads;
    w->q = lm_malloc(B * H * qk * sizeof(float));
    w->qa = hp->q_lora_rank ? lm_malloc(B * (size_t)hp->q_lora_rank * sizeof(float)) : NULL;
    w->ol = lm_malloc(B * H * R * sizeof(float));
    w->hb = lm_calloc((size_t)w->n_thr, sizeof *w->hb);
    bool ok = w->q && (w->qa || !hp->q_lora_rank) && w->ol && w->hb;
    size_t act = head_act_bytes(m, n_batch);
    for (int i = 0; ok && i < w->n_thr; i++) {
        head_buf *b = &w->hb[i];
        b->in = lm_malloc(B * max_sz((size_t)hp->qk_nope, R) * sizeof(float));
        b->out = lm_malloc(B * max_sz(R, (size_t)hp->v_head_dim) * sizeof(float));
        b->act = act ? lm_malloc(act) : NULL;
        ok = b->in && b->out && (b->act || !act);
    }
    if (!ok) {
        mla_ws_free(w);
        lm_err(err, errlen, "out of memory allocating the latent attention workspace for batches of %d tokens",
               n_batch);
        return NULL;
    }
    return w;
}

size_t mla_ws_bytes(const lm_model *m, int n_batch, int n_threads) {
    if (!m->mla) return 0;
    const lm_hparams *hp = &m->hp;
    size_t B = (size_t)n_batch, H = (size_t)hp->n_head, R = (size_t)hp->kv_lora_rank;
    size_t qk = (size_t)(hp->qk_nope + hp->n_rot), nt = n_threads < 1 ? 1 : (size_t)n_threads;
    size_t b = (B * H * qk + B * (size_t)hp->q_lora_rank + B * H * R) * sizeof(float);
    size_t per = (B * max_sz((size_t)hp->qk_nope, R) + B * max_sz(R, (size_t)hp->v_head_dim)) * sizeof(float);
    return b + nt * (per + head_act_bytes(m, n_batch));
}

void mla_ws_free(mla_ws *w) {
    if (!w) return;
    for (int i = 0; w->hb && i < w->n_thr; i++) {
        lm_free(w->hb[i].in);
        lm_free(w->hb[i].out);
        lm_free(w->hb[i].act);
    }
    lm_free(w->hb);
    lm_free(w->q);
    lm_free(w->qa);
    lm_free(w->ol);
    lm_free(w);
}

/* One product per head h: rows t of src (stride src_stride, head h's cols
 * at h * src_w) times ws[h]ᵀ into dst (stride dst_stride, at h * dst_w). */
typedef struct {
    mla_ws *w;
    const lm_weight *ws; /* (n_head) */
    const float *src;
    size_t src_stride, src_w;
    float *dst;
    size_t dst_stride, dst_w;
    int n, n_head;
    atomic_int next;
} heads_job;

static void heads_worker(void *arg, int ith, int nth) {
    heads_job *j = arg;
    head_buf *b = &j->w->hb[ith];
    for (;;) {
        int h = atomic_fetch_add(&j->next, 1);
        if (h >= j->n_head) break;
        const lm_weight *wt = &j->ws[h];
        size_t cols = (size_t)wt->cols, rows = (size_t)wt->rows;
        for (int t = 0; t < j->n; t++)
            memcpy(b->in + (size_t)t * cols, j->src + (size_t)t * j->src_stride + (size_t)h * j->src_w,
                   cols * sizeof(float));
        ops_matmul(NULL, b->out, wt, b->in, j->n, b->act);
        for (int t = 0; t < j->n; t++)
            memcpy(j->dst + (size_t)t * j->dst_stride + (size_t)h * j->dst_w, b->out + (size_t)t * rows,
                   rows * sizeof(float));
    }
}

static void run_heads(lm_fwd *f, const lm_weight *ws, const float *src, size_t src_stride, size_t src_w, float *dst,
                      size_t dst_stride, size_t dst_w, int n) {
    heads_job j = {.w = f->mla,
                   .ws = ws,
                   .src = src,
                   .src_stride = src_stride,
                   .src_w = src_w,
                   .dst = dst,
                   .dst_stride = dst_stride,
                   .dst_w = dst_w,
                   .n = n,
                   .n_head = f->m->hp.n_head};
    atomic_init(&j.next, 0);
    pool_run(f->mla->n_thr > 1 ? f->pool : NULL, heads_worker, &j);
}

/* Attention work items: (segment, query tile), one KV head. */
typedef struct {
    lm_fwd *f;
    const lm_seg *segs;
    int layer, n_seg;
    atomic_int next;
} attn_job;

static void attn_worker(void *arg, int ith, int nth) {
    attn_job *j = arg;
    lm_fwd *f = j->f;
    const lm_hparams *hp = &f->m->hp;
    size_t qd = (size_t)hp->n_head * hp->head_dim, od = (size_t)hp->n_head * hp->kv_lora_rank;
    const int *first = f->seg_item0;
    int total = first[j->n_seg], sg = 0;
    for (;;) {
        int item = atomic_fetch_add(&j->next, 1);
        if (item >= total) break;
        while (first[sg + 1] <= item) sg++;
        const lm_seg *g = &j->segs[sg];
        int i0 = (item - first[sg]) * ATTN_TILE_Q, nq = g->n - i0 < ATTN_TILE_Q ? g->n - i0 : ATTN_TILE_Q;
        size_t row = (size_t)f->seg_row0[sg] + (size_t)i0;
        attn_tile(f->kv, g->seq, j->layer, 0, f->q + row * qd, qd, nq, g->pos0 + i0, hp->attn_scale, 0,
                  f->mla->ol + row * od, od, f->scr[ith]);
    }
}

void mla_attn(lm_fwd *f, const lm_layer *l, int li, const lm_seg *segs, int n_seg, int n, mla_phase phase) {
    const lm_model *m = f->m;
    const lm_hparams *hp = &m->hp;
    const lm_mla *a = l->mla;
    mla_ws *w = f->mla;
    const int H = hp->n_head, R = hp->kv_lora_rank, r = hp->n_rot, nope = hp->qk_nope, qk = nope + r;
    const size_t kd = (size_t)R + (size_t)r, qd = (size_t)H * kd; /* a cache row; an absorbed query row */
    if (phase == MLA_PROJ) {
        /* q (or its bottleneck) and the latent with the RoPE key, from the same input */
        float *const y[2] = {a->q_a.rows ? w->qa : w->q, f->k};
        const lm_weight *const wt[2] = {a->q_a.rows ? &a->q_a : &a->q_b, &a->kv_a};
        ops_matmul_multi(f->pool, 2, y, wt, f->xb, n, f->act);
        if (a->q_a.rows) {
            for (int t = 0; t < n; t++) {
                float *qa = w->qa + (size_t)t * hp->q_lora_rank;
                ops_rmsnorm(qa, qa, a->q_a_norm, hp->q_lora_rank, hp->norm_eps);
            }
            ops_matmul(f->pool, w->q, &a->q_b, w->qa, n, f->act);
        }
        /* absorbed queries: q̃_h[0..R) = W_UK_hᵀ q_nope_h (the RoPE part follows in MLA_ROPE) */
        run_heads(f, a->k_b, w->q, (size_t)H * qk, (size_t)qk, f->q, qd, kd, n);
    } else if (phase == MLA_ROPE) {
        for (int t = 0; t < n; t++) {
            float *kv = f->k + (size_t)t * kd, *q = w->q + (size_t)t * H * qk, *qt = f->q + (size_t)t * qd;
            const float *cs = f->cs + (size_t)t * r;
            ops_rmsnorm(kv, kv, a->kv_a_norm, R, hp->norm_eps);
            ops_rope_apply(kv + R, 1, r, r, cs, hp->rope_style);
            ops_rope_apply(q + nope, H, qk, r, cs, hp->rope_style);
            for (int h = 0; h < H; h++)
                memcpy(qt + (size_t)h * kd + R, q + (size_t)h * qk + nope, (size_t)r * sizeof(float));
        }
        for (int g = 0; g < n_seg; g++)
            kv_store_rows(f->kv, segs[g].seq, li, segs[g].pos0, segs[g].n, f->k + (size_t)f->seg_row0[g] * kd, kd, NULL,
                          0);
    } else if (phase == MLA_SCORES) {
        attn_job aj = {.f = f, .segs = segs, .layer = li, .n_seg = n_seg};
        atomic_init(&aj.next, 0);
        pool_run(f->pool, attn_worker, &aj);
    } else {
        /* values: out_h = W_UV_h o_h, into xb as attn_output's input rows */
        run_heads(f, a->v_b, w->ol, (size_t)H * R, (size_t)R, f->xb, (size_t)H * hp->v_head_dim, (size_t)hp->v_head_dim,
                  n);
    }
}
