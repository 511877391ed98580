/*
 * encoder.c - an encoder's local pass (encoder.h): bert's and nomic-bert's
 * post-norm blocks with LayerNorms, over the batch's segments.
 *
 * The products run on the thread pool (ops_matmul, ops_matmul_multi) and
 * attention as (segment, query tile, KV head) items as forward.c splits
 * them; bert's GELU on the kernel table over the pool (ops_gelu), the
 * residual adds with their LayerNorms split over the pool by rows; the
 * biases, the embedding sums and nomic-bert's SwiGLU and RoPE are loops
 * on the calling thread. LayerNorm in float with a float64 mean and
 * variance per row, the same bits on any number of threads.
 */
#include "model/encoder.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "model/ops.h"
#include "kv/attn.h"
#include "base/util.h"

/* y = (x - mean) / sqrt(var + eps) * w + b over n values (in place allowed). */
static void layernorm(float *y, const float *x, const float *w, const float *b, int n, float eps) {
    double mean = 0, var = 0;
    for (int i = 0; i < n; i++) mean += x[i];
    mean /= n;
    for (int i = 0; i < n; i++) var += ((double)x[i] - mean) * ((double)x[i] - mean);
    float inv = (float)(1.0 / sqrt(var / n + (double)eps)), mu = (float)mean;
    for (int i = 0; i < n; i++) y[i] = (x[i] - mu) * inv * w[i] + (b ? b[i] : 0.0f);
}

/* Rows of x = LayerNorm(x + o) (o NULL: LayerNorm(x)), split over the pool
 * by rows: each row's bits are the same on any number of threads. */
typedef struct {
    float *x;
    const float *o, *w, *b;
    int n, dim;
    float eps;
} ln_job;

static void ln_worker(void *arg, int ith, int nth) {
    const ln_job *j = arg;
    int t0 = (int)((long long)j->n * ith / nth), t1 = (int)((long long)j->n * (ith + 1) / nth);
    for (int t = t0; t < t1; t++) {
        float *x = j->x + (size_t)t * j->dim;
        if (j->o) {
            const float *o = j->o + (size_t)t * j->dim;
            for (int i = 0; i < j->dim; i++) x[i] += o[i];
        }
        layernorm(x, x, j->w, j->b, j->dim, j->eps);
    }
}

static void add_layernorm(lm_pool *pool, float *x, const float *o, const float *w, const float *b, int n, int dim,
                          float eps) {
    ln_job j = {.x = x, .o = o, .w = w, .b = b, .n = n, .dim = dim, .eps = eps};
    pool_run(pool, ln_worker, &j);
}

static void add_bias(float *y, const float *b, int n_tok, size_t dim) {
    if (!b) return;
    for (int t = 0; t < n_tok; t++)
        for (size_t i = 0; i < dim; i++) y[(size_t)t * dim + i] += b[i];
}

/* Attention work items: (segment, query tile, KV head), forward.c's split. */
typedef struct {
    lm_fwd *f;
    const lm_seg *segs;
    int layer, n_seg;
    atomic_int next;
} enc_attn_job;

static void attn_worker(void *arg, int ith, int nth) {
    (void)nth;
    enc_attn_job *j = arg;
    lm_fwd *f = j->f;
    const lm_hparams *hp = &f->m->hp;
    size_t qd = (size_t)hp->n_head * hp->head_dim;
    const int *first = f->seg_item0;
    int total = first[j->n_seg], sg = 0;
    for (;;) {
        int item = atomic_fetch_add(&j->next, 1);
        if (item >= total) break;
        while (first[sg + 1] <= item) sg++;
        const lm_seg *g = &j->segs[sg];
        int local = item - first[sg];
        int i0 = local / hp->n_head_kv * ATTN_TILE_Q, kh = local % hp->n_head_kv;
        int nq = g->n - i0 < ATTN_TILE_Q ? g->n - i0 : ATTN_TILE_Q;
        size_t row = (size_t)f->seg_row0[sg] + (size_t)i0;
        if (hp->causal)
            attn_tile(f->kv, g->seq, j->layer, kh, f->q + row * qd, qd, nq, g->pos0 + i0, hp->attn_scale, 0,
                      f->xb + row * qd, qd, f->scr[ith]);
        else
            attn_tile_full(f->kv, g->seq, j->layer, kh, f->q + row * qd, qd, nq, g->pos0 + i0, g->pos0 + g->n,
                           hp->attn_scale, 0, NULL, f->xb + row * qd, qd, f->scr[ith]);
    }
}

/* Token + type 0 + position rows, then the embedding LayerNorm, into f->x. */
static void embed(lm_fwd *f, const int32_t *tokens, int n) {
    const lm_model *m = f->m;
    const int E = m->hp.n_embd;
    float *tmp = f->hb; /* (n_embd) scratch */
    for (int t = 0; t < n; t++) {
        float *x = f->x + (size_t)t * E;
        ops_get_row(&m->tok_embd, tokens[t], x);
        if (m->type_embd)
            for (int i = 0; i < E; i++) x[i] += m->type_embd[i];
        if (m->pos_embd.rows > 0) {
            ops_get_row(&m->pos_embd, f->pos[t], tmp);
            for (int i = 0; i < E; i++) x[i] += tmp[i];
        }
    }
    add_layernorm(f->pool, f->x, NULL, m->embd_norm, m->embd_norm_b, n, E, m->hp.norm_eps);
}

/* x = LayerNorm(x + attention(x)·Woᵀ + bo) of layer l. */
static void attn_block(lm_fwd *f, const lm_layer *l, int li, const lm_seg *segs, int n_seg, int n) {
    const lm_hparams *hp = &f->m->hp;
    const int E = hp->n_embd;
    const size_t qd = (size_t)hp->n_head * hp->head_dim, kvd = (size_t)hp->n_head_kv * hp->head_dim;
    float *const y[3] = {f->q, f->k, f->v};
    const lm_weight *const w[3] = {&l->wq, &l->wk, &l->wv};
    ops_matmul_multi(f->pool, 3, y, w, f->x, n, f->act);
    add_bias(f->q, l->bq, n, qd);
    add_bias(f->k, l->bk, n, kvd);
    add_bias(f->v, l->bv, n, kvd);
    if (hp->n_rot > 0) /* nomic-bert: RoPE at each row's position */
        for (int t = 0; t < n; t++) {
            float *cs = f->cs + (size_t)t * hp->n_rot;
            ops_rope_angles(cs, hp->n_rot, f->pos[t], l->rope_base, l->rope_scale);
            ops_rope_apply(f->q + (size_t)t * qd, hp->n_head, hp->head_dim, hp->n_rot, cs, hp->rope_style);
            ops_rope_apply(f->k + (size_t)t * kvd, hp->n_head_kv, hp->head_dim, hp->n_rot, cs, hp->rope_style);
        }
    for (int g = 0; g < n_seg; g++) {
        size_t r0 = (size_t)f->seg_row0[g];
        kv_store_rows(f->kv, segs[g].seq, l->kv_layer, segs[g].pos0, segs[g].n, f->k + r0 * kvd, kvd, f->v + r0 * kvd,
                      kvd);
    }
    enc_attn_job j = {.f = f, .segs = segs, .layer = l->kv_layer, .n_seg = n_seg};
    atomic_init(&j.next, 0);
    pool_run(f->pool, attn_worker, &j);
    ops_matmul(f->pool, f->hb, &l->wo, f->xb, n, f->act); /* hb: (n, n_embd) */
    add_bias(f->hb, l->bo, n, (size_t)E);
    add_layernorm(f->pool, f->x, f->hb, l->attn_norm, l->attn_norm_b, n, E, hp->norm_eps);
    (void)li;
}

/* x = LayerNorm(x + ffn(x)) of layer l: GELU (bert) or SwiGLU (nomic-bert). */
static void ffn_block(lm_fwd *f, const lm_layer *l, int n) {
    const lm_hparams *hp = &f->m->hp;
    const int E = hp->n_embd;
    const size_t F = (size_t)hp->n_ff;
    if (l->w_gate.rows > 0) {
        float *const y[2] = {f->hb, f->hb2};
        const lm_weight *const w[2] = {&l->w_gate, &l->w_up};
        ops_matmul_multi(f->pool, 2, y, w, f->x, n, f->act);
        add_bias(f->hb2, l->b_up, n, F);
        for (int t = 0; t < n; t++) ops_swiglu(f->hb + (size_t)t * F, f->hb2 + (size_t)t * F, (int)F);
    } else {
        ops_matmul(f->pool, f->hb, &l->w_up, f->x, n, f->act);
        add_bias(f->hb, l->b_up, n, F);
        ops_gelu(f->pool, f->hb, (size_t)n * F); /* tanh form, as ggml's gelu */
    }
    ops_matmul(f->pool, f->xb, &l->w_down, f->hb, n, f->act);
    add_bias(f->xb, l->b_down, n, (size_t)E);
    add_layernorm(f->pool, f->x, f->xb, l->ffn_norm, l->ffn_norm_b, n, E, hp->norm_eps);
}

int enc_check(const lm_fwd *f, const lm_seg *segs, int n_seg, char *err, size_t errlen) {
    const lm_model *m = f->m;
    const lm_hparams *hp = &m->hp;
    for (int g = 0; g < n_seg; g++) {
        const lm_seg *sg = &segs[g];
        if ((hp->encoder || m->output.rows == 0) && sg->n_logits > 0) /* also gemma-embedding's: no head */
            return lm_err(err, errlen, "segment %d asks for logits of a model with no LM head (%s)", g,
                          model_arch_name(hp->arch));
        if (!hp->causal && sg->pos0 != 0)
            return lm_err(err, errlen,
                          "segment %d starts at position %d: a non-causal model runs each sequence in one pass "
                          "(of at most %d tokens)",
                          g, sg->pos0, f->dims.n_batch);
        if (m->pos_embd.rows > 0 && sg->pos0 + sg->n > m->pos_embd.rows)
            return lm_err(err, errlen, "segment %d passes the %lld positions the model embeds", g,
                          (long long)m->pos_embd.rows);
    }
    return 0;
}

int enc_pass(lm_fwd *f, const int32_t *tokens, int n, const lm_seg *segs, int n_seg, char *err, size_t errlen) {
    const lm_model *m = f->m;
    const lm_hparams *hp = &m->hp;
    if (enc_check(f, segs, n_seg, err, errlen)) return -1; /* also when a caller skipped fwd_check */
    f->seg_row0[0] = 0;
    f->seg_item0[0] = 0;
    for (int g = 0; g < n_seg; g++) {
        for (int i = 0; i < segs[g].n; i++) f->pos[f->seg_row0[g] + i] = segs[g].pos0 + i;
        f->seg_row0[g + 1] = f->seg_row0[g] + segs[g].n;
        f->seg_item0[g + 1] = f->seg_item0[g] + (segs[g].n + ATTN_TILE_Q - 1) / ATTN_TILE_Q * hp->n_head_kv;
    }
    embed(f, tokens, n);
    for (int li = 0; li < hp->n_layer; li++) {
        attn_block(f, &m->layers[li], li, segs, n_seg, n);
        ffn_block(f, &m->layers[li], n);
    }
    if (f->hid) memcpy(f->hid, f->x, (size_t)n * hp->n_embd * sizeof(float));
    return 0;
}
