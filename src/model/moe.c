/*
 * moe.c - Mixture-of-Experts FFN (moe.h): routing, grouping a batch's
 * tokens by expert, one pass of each chosen expert over its rows, and the
 * qwen2moe shared expert.
 *
 * Invariants: every buffer is sized for n_batch tokens at moe_ws_new and
 * never grows; a token's output is summed in ascending expert order (then
 * the shared expert), so it does not depend on the batch.
 */
#include "model/moe.h"

#include <math.h>
#include <string.h>

#include "model/ops.h"
#include "base/util.h"

struct moe_ws {
    int n_batch, n_expert, k, E, F; /* F: max(n_ff_exp, n_ff_shexp) */
    float *logits;                  /* (n_batch, n_expert) router scores, then probabilities */
    int *sel;                       /* (n_batch, k) chosen experts of each token */
    float *selw;                    /* (n_batch, k) their weights */
    int *count;                     /* (n_expert + 1) tokens per expert, then each expert's first slot */
    int *rows;                      /* (n_batch * k) token rows grouped by expert */
    float *roww;                    /* (n_batch * k) the matching weights */
    float *xe;                      /* (n_batch, E) one expert's gathered input rows */
    float *h, *h2;                  /* (n_batch, F) gate and up outputs */
    float *ye;                      /* (n_batch, E) one expert's output rows */
    float *acc;                     /* (n_batch, E) the layer's output being summed */
};

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

size_t moe_ws_bytes(const lm_model *m, int n_batch) {
    const lm_hparams *hp = &m->hp;
    size_t B = (size_t)n_batch, X = (size_t)hp->n_expert, K = (size_t)hp->n_expert_used, E = (size_t)hp->n_embd;
    size_t F = (size_t)(hp->n_ff_exp > hp->n_ff_shexp ? hp->n_ff_exp : hp->n_ff_shexp);
    return sizeof(moe_ws) + B * X * sizeof(float) + 2 * B * K * sizeof(int) + 2 * B * K * sizeof(float) +
        (X + 1) * sizeof(int) + 3 * B * E * sizeof(float) + 2 * B * F * sizeof(float);
}

moe_ws *moe_ws_new(const lm_model *m, int n_batch, char *err, size_t errlen) {
    const lm_hparams *hp = &m->hp;
    moe_ws *w = lm_calloc(1, sizeof *w);
    if (!w) {
        lm_err(err, errlen, "out of memory");
        return NULL;
    }
    size_t B = (size_t)n_batch, X = (size_t)hp->n_expert, K = (size_t)hp->n_expert_used, E = (size_t)hp->n_embd;
    w->n_batch = n_batch;
    w->n_expert = hp->n_expert;
    w->k = hp->n_expert_used;
    w->E = hp->n_embd;
    w->F = hp->n_ff_exp > hp->n_ff_shexp ? hp->n_ff_exp : hp->n_ff_shexp;
    size_t F = (size_t)w->F;
    w->logits = lm_malloc(B * X * sizeof(float));
    w->sel = lm_malloc(B * K * sizeof(int));
    w->selw = lm_malloc(B * K * sizeof(float));
    w->count = lm_malloc((X + 1) * sizeof(int));
    w->rows = lm_malloc(B * K * sizeof(int));
    w->roww = lm_malloc(B * K * sizeof(float));
    w->xe = lm_malloc(B * E * sizeof(float));
    w->h = lm_malloc(B * F * sizeof(float));
    w->h2 = lm_malloc(B * F * sizeof(float));
    w->ye = lm_malloc(B * E * sizeof(float));
    w->acc = lm_malloc(B * E * sizeof(float));
    if (!w->logits || !w->sel || !w->selw || !w->count || !w->rows || !w->roww || !w->xe || !w->h || !w->h2 || !w->ye ||
        !w->acc) {
        moe_ws_free(w);
        lm_err(err, errlen, "out of memory allocating the expert workspace for batches of %d tokens", n_batch);
        return NULL;
    }
    return w;
}

void moe_ws_free(moe_ws *w) {
    if (!w) return;
    lm_free(w->logits);
    lm_free(w->sel);
    lm_free(w->selw);
    lm_free(w->count);
    lm_free(w->rows);
    lm_free(w->roww);
    lm_free(w->xe);
    lm_free(w->h);
    lm_free(w->h2);
    lm_free(w->ye);
    lm_free(w->acc);
    lm_free(w);
}

size_t moe_act_bytes(const lm_model *m, int n_batch) {
    size_t a = 0;
    for (int i = 0; m->moe && i < m->hp.n_layer; i++) {
        const lm_moe *moe = &m->moe[i];
        if (!moe->gate) continue; /* a dense layer (deepseek2's leading ones) */
        a = max_sz(a, ops_matmul_scratch(moe->gate_inp.type, moe->gate_inp.cols, n_batch));
        for (int e = 0; e < m->hp.n_expert; e++) {
            a = max_sz(a, ops_matmul_scratch(moe->gate[e].type, moe->gate[e].cols, n_batch));
            a = max_sz(a, ops_matmul_scratch(moe->up[e].type, moe->up[e].cols, n_batch));
            a = max_sz(a, ops_matmul_scratch(moe->down[e].type, moe->down[e].cols, n_batch));
        }
    }
    return a;
}

/* Softmax (or, hp.moe_sigmoid, sigmoid) of one token's router scores, in
 * place, and its top k, chosen by probability plus bias where the layer has
 * a selection bias, weighted by the probability alone. With
 * hp.moe_topk_softmax (gpt-oss) the top k of the raw scores are chosen and
 * weighted by a softmax over those k alone. */
static void route(float *p, int X, int k, const lm_hparams *hp, const float *bias, int *sel, float *selw) {
    if (hp->moe_topk_softmax) {
        /* the scores as they are: the selection below reads them, the softmax follows it */
    } else if (hp->moe_sigmoid) {
        for (int e = 0; e < X; e++) p[e] = 1.0f / (1.0f + expf(-p[e]));
    } else {
        float mx = p[0];
        for (int e = 1; e < X; e++) mx = p[e] > mx ? p[e] : mx;
        float sum = 0;
        for (int e = 0; e < X; e++) sum += (p[e] = expf(p[e] - mx));
        for (int e = 0; e < X; e++) p[e] /= sum;
    }
    for (int j = 0; j < k; j++) { /* k is small: selection by repeated scans */
        int best = -1;
        for (int e = 0; e < X; e++) {
            bool taken = false;
            for (int i = 0; i < j && !taken; i++) taken = sel[i] == e;
            if (!taken && (best < 0 || (bias ? p[e] + bias[e] > p[best] + bias[best] : p[e] > p[best]))) best = e;
        }
        sel[j] = best;
        selw[j] = p[best];
    }
    if (hp->moe_topk_softmax) {
        const float mx = selw[0]; /* the largest score */
        float sum = 0;
        for (int j = 0; j < k; j++) sum += (selw[j] = expf(selw[j] - mx));
        for (int j = 0; j < k; j++) selw[j] /= sum;
    }
    if (hp->moe_norm_w) {
        float s = 0;
        for (int j = 0; j < k; j++) s += selw[j];
        if (s < 6.103515625e-5f) s = 6.103515625e-5f; /* the smallest normal F16, as llama.cpp clamps */
        for (int j = 0; j < k; j++) selw[j] /= s;
    }
    if (hp->moe_scale != 0.0f && hp->moe_scale != 1.0f)
        for (int j = 0; j < k; j++) selw[j] *= hp->moe_scale;
}

void moe_expert_run(moe_ws *w, lm_pool *pool, const lm_model *m, const lm_moe *moe, int e, const float *xe,
                    const int *rows, const float *weight, int c, float *out, void *act) {
    const int E = w->E, F = m->hp.n_ff_exp;
    float *const gu_y[2] = {w->h, w->h2};
    const lm_weight *const gu_w[2] = {&moe->gate[e], &moe->up[e]};
    ops_matmul_multi(pool, 2, gu_y, gu_w, xe, c, act);
    /* gpt-oss's biases: gate and up on this rank's rows; down's once, on rank 0 (its product is a
     * partial sum over the ranks) */
    const float *gb = moe->gate_b ? moe->gate_b + (size_t)e * moe->b_stride : NULL;
    const float *ub = moe->up_b ? moe->up_b + (size_t)e * moe->b_stride : NULL;
    const float *db = moe->down_b && m->tp.rank == 0 ? moe->down_b + (size_t)e * E : NULL;
    for (int j = 0; j < c; j++) {
        float *g = w->h + (size_t)j * F, *u = w->h2 + (size_t)j * F;
        for (int i = 0; gb && i < F; i++) g[i] += gb[i];
        for (int i = 0; ub && i < F; i++) u[i] += ub[i];
        if (m->hp.swiglu_oai) ops_swiglu_oai(g, u, F);
        else ops_swiglu(g, u, F);
    }
    ops_matmul(pool, w->ye, &moe->down[e], w->h, c, act);
    for (int j = 0; j < c; j++) {
        float *o = out + (size_t)rows[j] * E;
        const float *y = w->ye + (size_t)j * E;
        if (db)
            for (int i = 0; i < E; i++) o[i] += weight[j] * (y[i] + db[i]);
        else
            for (int i = 0; i < E; i++) o[i] += weight[j] * y[i];
    }
}

void moe_shared_run(moe_ws *w, lm_pool *pool, const lm_layer *l, const float *xb, int n, float *out, void *act) {
    const int E = w->E, S = (int)l->w_gate.rows;
    float *const gu_y[2] = {w->h, w->h2};
    const lm_weight *const gu_w[2] = {&l->w_gate, &l->w_up};
    ops_matmul_multi(pool, 2, gu_y, gu_w, xb, n, act);
    for (int t = 0; t < n; t++) ops_swiglu(w->h + (size_t)t * S, w->h2 + (size_t)t * S, S);
    ops_matmul(pool, w->ye, &l->w_down, w->h, n, act);
    for (int t = 0; t < n; t++) {
        const float *x = xb + (size_t)t * E, *y = w->ye + (size_t)t * E;
        float d = 0, g = 1.0f; /* deepseek2's shared experts have no gate */
        for (int i = 0; l->moe->shexp_gate && i < E; i++) d += l->moe->shexp_gate[i] * x[i];
        if (l->moe->shexp_gate) g = 1.0f / (1.0f + expf(-d));
        float *o = out + (size_t)t * E;
        for (int i = 0; i < E; i++) o[i] += g * y[i];
    }
}

void moe_route(moe_ws *w, lm_pool *pool, const lm_model *m, const lm_moe *moe, const float *xb, int n, void *act,
               const int **sel, const float **selw) {
    const int X = w->n_expert, K = w->k;
    ops_matmul(pool, w->logits, &moe->gate_inp, xb, n, act);
    for (int t = 0; moe->gate_inp_b && t < n; t++) /* gpt-oss: the router's bias, before any choice */
        for (int e = 0; e < X; e++) w->logits[(size_t)t * X + e] += moe->gate_inp_b[e];
    for (int t = 0; t < n; t++)
        route(w->logits + (size_t)t * X, X, K, &m->hp, moe->probs_bias, w->sel + (size_t)t * K,
              w->selw + (size_t)t * K);
    *sel = w->sel;
    *selw = w->selw;
}

void moe_ffn(moe_ws *w, lm_pool *pool, const lm_model *m, const lm_layer *l, float *xb, int n, void *act, int *n_run) {
    const lm_moe *moe = l->moe;
    const int X = w->n_expert, K = w->k, E = w->E;
    const int *sel;
    const float *selw;
    moe_route(w, pool, m, moe, xb, n, act, &sel, &selw);
    memset(w->count, 0, (size_t)(X + 1) * sizeof(int));
    for (size_t i = 0; i < (size_t)n * (size_t)K; i++) w->count[sel[i] + 1]++;
    for (int e = 0; e < X; e++) w->count[e + 1] += w->count[e]; /* count[e]: expert e's first slot */
    /* rows grouped by expert, each group in token order (count[e] advances
     * while filling, then is restored) */
    for (int t = 0; t < n; t++)
        for (int j = 0; j < K; j++) {
            int e = w->sel[(size_t)t * K + j], slot = w->count[e]++;
            w->rows[slot] = t;
            w->roww[slot] = w->selw[(size_t)t * K + j];
        }
    for (int e = X; e > 0; e--) w->count[e] = w->count[e - 1];
    w->count[0] = 0;
    memset(w->acc, 0, (size_t)n * E * sizeof(float));
    int run = 0;
    for (int e = 0; e < X; e++) {
        int s0 = w->count[e], c = w->count[e + 1] - s0;
        if (c == 0) continue;
        for (int j = 0; j < c; j++)
            memcpy(w->xe + (size_t)j * E, xb + (size_t)w->rows[s0 + j] * E, (size_t)E * sizeof(float));
        moe_expert_run(w, pool, m, moe, e, w->xe, w->rows + s0, w->roww + s0, c, w->acc, act);
        run++;
    }
    if (l->w_gate.rows) moe_shared_run(w, pool, l, xb, n, w->acc, act);
    memcpy(xb, w->acc, (size_t)n * E * sizeof(float));
    if (n_run) *n_run = run;
}
