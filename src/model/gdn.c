/*
 * gdn.c - the gated-DeltaNet layer of the hybrid models (contract in
 * gdn.h): the products, the gates, the conv over each sequence's window,
 * the delta rule per (sequence, value head) across the pool, the gated
 * norm and the output product.
 *
 * Bounds: the workspace holds n_batch rows of every intermediate (the
 * products' outputs, the conv output, the gates, the heads' outputs) and
 * one chunk scratch (dn_chunk_work) per pool thread, and a verification
 * segment's checkpoint pointer per row.
 */
#include "model/gdn.h"

#include <assert.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "base/util.h"
#include "kernels/deltanet.h"
#include "kernels/kernels.h"
#include "kv/rstate.h"
#include "model/ops.h"

_Static_assert(GDN_CHUNK == LM_DN_CHUNK, "the pieces are the chunk form's chunks");

struct gdn_ws {
    float *qkv;      /* (n_batch, conv) the products' q, k, v channels */
    float *c;        /* (n_batch, conv) after the conv and SiLU; q and k heads L2-normed in place */
    float *z;        /* (n_batch, hv dv) the output norm's gate */
    float *a, *b;    /* (n_batch, hv) the decay and write-strength products */
    float *ba;       /* (n_batch, 2 hv) a fused ssm_ba's product (qwen3next) before the split into a, b */
    float *in;       /* (n_batch, conv + hv dv) an ssm_in's product before the split into qkv, z (older
                            qwen3next files), or NULL when no layer has one */
    float *g, *beta; /* (n_batch, hv) the gates */
    float *o;        /* (n_batch, hv dv) the heads' outputs, then the gated norm's */
    float **work;    /* (n_threads) each (dn_chunk_work) the chunk form's scratch */
    float **ck_mat;  /* (n_batch) a verification segment's row t: the matrices of the checkpoint its
                        token's state goes to (this layer's); other rows unused */
    int n_threads;
};

static size_t conv_ch(const lm_hparams *hp) {
    return 2 * (size_t)hp->ssm_hk * (size_t)hp->ssm_dk + (size_t)hp->ssm_hv * (size_t)hp->ssm_dv;
}

size_t gdn_conv_floats(const lm_hparams *hp) { return (size_t)(hp->ssm_conv - 1) * conv_ch(hp); }
size_t gdn_mat_floats(const lm_hparams *hp) { return (size_t)hp->ssm_hv * (size_t)hp->ssm_dk * (size_t)hp->ssm_dv; }

/* The floats of every buffer but the per-thread scratch. */
static size_t row_floats(const lm_hparams *hp) {
    size_t V = (size_t)hp->ssm_hv * (size_t)hp->ssm_dv;
    return 2 * conv_ch(hp) + 2 * V + 6 * (size_t)hp->ssm_hv;
}

/* The floats of a row of an ssm_in's product when a layer has one (its z then has no rows), else 0. */
static size_t in_floats(const lm_model *m) {
    for (int i = 0; m->gdn && i < m->hp.n_layer; i++)
        if (m->layers[i].gdn && !m->layers[i].gdn->z.rows)
            return conv_ch(&m->hp) + (size_t)m->hp.ssm_hv * (size_t)m->hp.ssm_dv;
    return 0;
}

size_t gdn_ws_bytes(const lm_model *m, int n_batch, int n_threads) {
    const lm_hparams *hp = &m->hp;
    if (!hp->n_rlayer) return 0;
    return sizeof(gdn_ws) + (size_t)n_threads * sizeof(float *) + (size_t)n_batch * sizeof(float *) +
        (size_t)n_batch * (row_floats(hp) + in_floats(m)) * sizeof(float) +
        (size_t)n_threads * dn_chunk_work(hp->ssm_dk, hp->ssm_dv) * sizeof(float);
}

size_t gdn_act_bytes(const lm_model *m, int n_batch) {
    size_t a = 0;
    for (int i = 0; m->gdn && i < m->hp.n_layer; i++) {
        const lm_gdn *g = m->layers[i].gdn;
        if (!g) continue;
        const lm_weight *w[5] = {&g->qkv, &g->z, &g->beta, &g->alpha, &g->out};
        for (int k = 0; k < 5; k++) {
            size_t s = ops_matmul_scratch(w[k]->type, w[k]->cols, n_batch);
            if (s > a) a = s;
        }
    }
    return a;
}

gdn_ws *gdn_ws_new(const lm_model *m, int n_batch, int n_threads, char *err, size_t errlen) {
    const lm_hparams *hp = &m->hp;
    gdn_ws *w = lm_calloc(1, sizeof *w);
    if (!w) goto nomem;
    size_t B = (size_t)n_batch, C = conv_ch(hp), V = (size_t)hp->ssm_hv * hp->ssm_dv, H = (size_t)hp->ssm_hv;
    w->n_threads = n_threads;
    w->qkv = lm_malloc(B * C * sizeof(float));
    w->c = lm_malloc(B * C * sizeof(float));
    w->z = lm_malloc(B * V * sizeof(float));
    w->o = lm_malloc(B * V * sizeof(float));
    w->a = lm_malloc(B * H * sizeof(float));
    w->b = lm_malloc(B * H * sizeof(float));
    w->ba = lm_malloc(2 * B * H * sizeof(float));
    if (in_floats(m) && !(w->in = lm_malloc(B * in_floats(m) * sizeof(float)))) goto nomem;
    w->g = lm_malloc(B * H * sizeof(float));
    w->beta = lm_malloc(B * H * sizeof(float));
    w->work = lm_calloc((size_t)n_threads, sizeof *w->work);
    w->ck_mat = lm_calloc(B, sizeof *w->ck_mat);
    if (!w->qkv || !w->c || !w->z || !w->o || !w->a || !w->b || !w->ba || !w->g || !w->beta || !w->work || !w->ck_mat)
        goto nomem;
    for (int i = 0; i < n_threads; i++)
        if (!(w->work[i] = lm_malloc(dn_chunk_work(hp->ssm_dk, hp->ssm_dv) * sizeof(float)))) goto nomem;
    return w;
nomem:
    gdn_ws_free(w);
    lm_err(err, errlen, "out of memory for the linear-attention workspace");
    return NULL;
}

void gdn_ws_free(gdn_ws *w) {
    if (!w) return;
    for (int i = 0; w->work && i < w->n_threads; i++) lm_free(w->work[i]);
    lm_free(w->work);
    lm_free(w->ck_mat);
    lm_free(w->qkv);
    lm_free(w->c);
    lm_free(w->z);
    lm_free(w->o);
    lm_free(w->a);
    lm_free(w->b);
    lm_free(w->ba);
    lm_free(w->in);
    lm_free(w->g);
    lm_free(w->beta);
    lm_free(w);
}

/* The delta rule, one (segment, value head) per work item. */
typedef struct {
    lm_fwd *f;
    const lm_layer *l;
    const lm_seg *segs;
    int n_seg;
    atomic_int next;
} rule_job;

static void rule_worker(void *arg, int ith, int nth) {
    (void)nth;
    rule_job *j = arg;
    lm_fwd *f = j->f;
    const lm_hparams *hp = &f->m->hp;
    gdn_ws *w = f->gdn;
    const lm_dn_kernels *dn = &kernels()->dn;
    const int hv = hp->ssm_hv, hk = hp->ssm_hk, dk = hp->ssm_dk, dv = hp->ssm_dv;
    const size_t C = conv_ch(hp), V = (size_t)hv * dv;
    for (;;) {
        int item = atomic_fetch_add(&j->next, 1);
        if (item >= j->n_seg * hv) break;
        int sg = item / hv, h = item % hv, kh = hp->ssm_grouped ? h / (hv / hk) : h % hk;
        const lm_seg *g = &j->segs[sg];
        size_t r0 = (size_t)f->seg_row0[sg];
        const float *row = w->c + r0 * C;
        lm_dn_seq s = {.q = row + (size_t)kh * dk,
                       .k = row + (size_t)(hk + kh) * dk,
                       .v = row + 2 * (size_t)hk * dk + (size_t)h * dv,
                       .g = w->g + r0 * hv + h,
                       .beta = w->beta + r0 * hv + h,
                       .o = w->o + r0 * V + (size_t)h * dv,
                       .qk_stride = C,
                       .v_stride = C,
                       .gb_stride = (size_t)hv,
                       .o_stride = V,
                       .n_tok = g->n,
                       .dk = dk,
                       .dv = dv,
                       .scale = 1.0f / sqrtf((float)dk)};
        float *S = g->rmat[j->l->rec] + (size_t)h * dk * dv;
        if (g->ck) { /* a verification segment: token by token, each state into its checkpoint */
            for (int t = 0; t < g->n; t++) {
                lm_dn_seq p = s;
                p.q += (size_t)t * s.qk_stride, p.k += (size_t)t * s.qk_stride, p.v += (size_t)t * s.v_stride;
                p.g += (size_t)t * s.gb_stride, p.beta += (size_t)t * s.gb_stride, p.o += (size_t)t * s.o_stride;
                p.n_tok = 1;
                dn->recur(S, &p);
                memcpy(w->ck_mat[r0 + (size_t)t] + (size_t)h * dk * dv, S, (size_t)dk * dv * sizeof *S);
            }
            continue;
        }
        /* pieces ending on multiples of GDN_CHUNK positions (gdn.h) */
        for (int t0 = 0; t0 < g->n;) {
            int len = GDN_CHUNK - (g->pos0 + t0) % GDN_CHUNK;
            if (len > g->n - t0) len = g->n - t0;
            lm_dn_seq p = s;
            p.q += (size_t)t0 * s.qk_stride, p.k += (size_t)t0 * s.qk_stride, p.v += (size_t)t0 * s.v_stride;
            p.g += (size_t)t0 * s.gb_stride, p.beta += (size_t)t0 * s.gb_stride, p.o += (size_t)t0 * s.o_stride;
            p.n_tok = len;
            if (len > 1) dn->chunk(S, &p, w->work[ith]);
            else dn->recur(S, &p);
            t0 += len;
        }
    }
}

void gdn_layer(lm_fwd *f, const lm_layer *l, const lm_seg *segs, int n_seg, int n) {
    const lm_hparams *hp = &f->m->hp;
    const lm_gdn *gd = l->gdn;
    gdn_ws *w = f->gdn;
    const lm_dn_kernels *dn = &kernels()->dn;
    const int hv = hp->ssm_hv, hk = hp->ssm_hk, dk = hp->ssm_dk, dv = hp->ssm_dv, K = hp->ssm_conv;
    const size_t C = conv_ch(hp), V = (size_t)hv * dv;
    const int r = hv / hk; /* value heads per key head */
    if (gd->alpha.rows) {  /* separate ssm_alpha and ssm_beta */
        float *const y3[3] = {w->qkv, w->z, w->a};
        const lm_weight *const w3[3] = {&gd->qkv, &gd->z, &gd->alpha};
        ops_matmul_multi(f->pool, 3, y3, w3, f->xb, n, f->act);
        ops_matmul(f->pool, w->b, &gd->beta, f->xb, n, f->act);
    } else { /* a fused ssm_ba: per key head its r betas, then its r alphas */
        /* with an ssm_in (z no rows) its product goes to w->in, split below, and z's is empty */
        float *const y3[3] = {gd->z.rows ? w->qkv : w->in, w->ba, w->z};
        const lm_weight *const w3[3] = {&gd->qkv, &gd->beta, &gd->z};
        ops_matmul_multi(f->pool, gd->z.rows ? 3 : 2, y3, w3, f->xb, n, f->act);
        for (int t = 0; t < n; t++)
            for (int h = 0; h < hv; h++) {
                const float *src = w->ba + (size_t)t * 2 * hv + (size_t)(h / r) * 2 * r + h % r;
                w->b[(size_t)t * hv + h] = src[0], w->a[(size_t)t * hv + h] = src[r];
            }
    }
    if (!gd->z.rows) /* an ssm_in: per key head [q (dk) | k (dk) | v (r dv) | z (r dv)] into qkv and z */
        for (int t = 0; t < n; t++)
            for (int kh = 0; kh < hk; kh++) {
                const size_t G = 2 * (size_t)dk + 2 * (size_t)r * dv, rv = (size_t)r * dv;
                const float *src = w->in + (size_t)t * (C + V) + (size_t)kh * G;
                float *row = w->qkv + (size_t)t * C;
                memcpy(row + (size_t)kh * dk, src, (size_t)dk * sizeof(float));
                memcpy(row + (size_t)(hk + kh) * dk, src + dk, (size_t)dk * sizeof(float));
                memcpy(row + 2 * (size_t)hk * dk + kh * rv, src + 2 * (size_t)dk, rv * sizeof(float));
                memcpy(w->z + (size_t)t * V + kh * rv, src + 2 * (size_t)dk + rv, rv * sizeof(float));
            }
    for (int t = 0; t < n; t++)
        dn->gates(w->g + (size_t)t * hv, w->beta + (size_t)t * hv, w->a + (size_t)t * hv, w->b + (size_t)t * hv, gd->a,
                  gd->dt_bias, hv);
    for (int sg = 0; sg < n_seg; sg++) {
        const lm_seg *g = &segs[sg];
        size_t r0 = (size_t)f->seg_row0[sg];
        if (!g->ck) {
            dn->conv(w->c + r0 * C, w->qkv + r0 * C, g->rconv[l->rec], gd->conv_w, g->n, (int)C, K, C, true);
            continue;
        }
        /* a verification segment: the window after each token into its
         * checkpoint (conv over n tokens is n one-token calls, bit for bit),
         * the checkpoint's matrices kept for the delta rule's workers */
        for (int t = 0; t < g->n; t++) {
            float *ck_conv;
            /* the store's layers are this pipeline stage's own (lm_pp.rec0 ..) */
            int rc = rstate_ckpt_layer(g->ck, g->ck_slot, l->rec - f->m->pp.rec0, g->pos0 + t + 1, &ck_conv,
                                       &w->ck_mat[r0 + t]);
            assert(rc == RSTATE_OK); /* fwd_check: the reservation covers the segment */
            (void)rc;
            dn->conv(w->c + (r0 + t) * C, w->qkv + (r0 + t) * C, g->rconv[l->rec], gd->conv_w, 1, (int)C, K, C, true);
            memcpy(ck_conv, g->rconv[l->rec], gdn_conv_floats(hp) * sizeof *ck_conv);
        }
    }
    for (int t = 0; t < n; t++) {
        float *row = w->c + (size_t)t * C;
        for (int h = 0; h < 2 * hk; h++) dn->l2norm(row + (size_t)h * dk, row + (size_t)h * dk, dk, hp->norm_eps);
    }
    rule_job j = {.f = f, .l = l, .segs = segs, .n_seg = n_seg};
    atomic_init(&j.next, 0);
    pool_run(f->pool, rule_worker, &j);
    for (int t = 0; t < n; t++)
        for (int h = 0; h < hv; h++) {
            float *o = w->o + (size_t)t * V + (size_t)h * dv;
            dn->norm_gated(o, o, gd->norm, w->z + (size_t)t * V + (size_t)h * dv, dv, hp->norm_eps);
        }
    ops_matmul(f->pool, f->hb, &gd->out, w->o, n, f->act);
}
