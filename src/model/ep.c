/*
 * ep.c - expert parallelism (ep.h): each rank's experts kept at load
 * (model_ep), and the MoE layer's exchange of rows and results between the
 * ranks of a stage's expert group (ep_moe_ffn). Knows no rank but through
 * the span's hooks (dist.h's all-to-all and gather, set by pp.c).
 */
#include "model/ep.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"

int ep_owner(const lm_model *m, int li, int e) {
    const lm_ep *ep = &m->ep;
    if (ep->owner) return ep->owner[(size_t)li * (size_t)m->hp.n_expert + (size_t)e];
    int r = 0;
    while (e >= ep->first[r + 1]) r++;
    return r;
}

/* An expert's load, heaviest first; ties: the lower id. */
typedef struct {
    uint64_t load;
    int e;
} heavy;
static int by_load(const void *a, const void *b) {
    const heavy *x = a, *y = b;
    if (x->load != y->load) return x->load > y->load ? -1 : 1;
    return x->e - y->e;
}

int ep_place_balanced(const uint64_t *rows, int X, int N, int16_t *owner) {
    if (N < 1 || N > LM_TP_MAX || X < N) return -1;
    heavy *h = lm_malloc((size_t)X * sizeof *h);
    if (!h) return -1;
    for (int e = 0; e < X; e++) h[e] = (heavy){rows[e], e};
    qsort(h, (size_t)X, sizeof *h, by_load);
    uint64_t load[LM_TP_MAX] = {0};
    int held[LM_TP_MAX] = {0}, cap = (X + N - 1) / N; /* as many experts per rank as contiguous, at most */
    for (int i = 0; i < X; i++) {
        int best = -1;
        for (int r = 0; r < N; r++)
            if (held[r] < cap && (best < 0 || load[r] < load[best])) best = r;
        owner[h[i].e] = (int16_t)best;
        load[best] += h[i].load;
        held[best]++;
    }
    lm_free(h);
    return 0;
}

double ep_imbalance(const uint64_t *rows, int X, int N, const int16_t *owner) {
    uint64_t load[LM_TP_MAX] = {0}, sum = 0, mx = 0;
    for (int e = 0; e < X; e++) {
        int r = 0;
        if (owner) r = owner[e];
        else /* contiguous: the last rank whose first expert r * X / N is at most e */
            while ((int64_t)(r + 1) * X / N <= e) r++;
        load[r] += rows[e];
        sum += rows[e];
    }
    for (int r = 0; r < N; r++) mx = load[r] > mx ? load[r] : mx;
    return sum ? (double)mx * N / (double)sum : 0.0;
}

int model_ep(lm_model *m, int rank, int size, const lm_ep_counts *counts, char *err, size_t errlen) {
    lm_ep *ep = &m->ep;
    const int X = m->hp.n_expert, L = m->hp.n_layer;
    lm_free(ep->owner);
    memset(ep, 0, sizeof *ep);
    ep->size = 1;
    ep->e1 = X;
    ep->first[1] = X;
    if (size == 1) return 0;
    if (size < 1 || size > LM_TP_MAX || rank < 0 || rank >= size)
        return lm_err(err, errlen, "expert-parallel rank %d of %d", rank, size);
    if (!m->moe) {
        gguf_str nm = {0};
        bool named = m->gguf && gguf_get_str(m->gguf, "general.name", &nm) && nm.len;
        return lm_err(err, errlen, "--ep places experts on ranks, and %s%.*s%s (%s) is a dense model without experts",
                      named ? "'" : "", named ? (int)(nm.len < 100 ? nm.len : 100) : 5, named ? nm.ptr : "model",
                      named ? "'" : "", model_arch_name(m->hp.arch));
    }
    if (size > X)
        return lm_err(err, errlen, "%d experts do not place on %d ranks (at most one rank per expert)", X, size);
    if (counts && (counts->n_layer != L || counts->n_expert != X || !counts->rows))
        return lm_err(err, errlen, "routing counts of %d layers x %d experts for a model of %d x %d", counts->n_layer,
                      counts->n_expert, L, X);
    ep->rank = rank;
    ep->size = size;
    for (int r = 0; r <= size; r++) ep->first[r] = (int)((int64_t)r * X / size);
    ep->e0 = ep->first[rank];
    ep->e1 = ep->first[rank + 1];
    if (counts) {
        ep->owner = lm_malloc((size_t)L * (size_t)X * sizeof *ep->owner);
        if (!ep->owner) return lm_err(err, errlen, "out of memory for the expert placement");
        for (int li = 0; li < L; li++)
            if (ep_place_balanced(counts->rows + (size_t)li * X, X, size, ep->owner + (size_t)li * X))
                return lm_err(err, errlen, "out of memory placing the experts");
        ep->e0 = ep->e1 = 0; /* no contiguous range: ep_owner says */
    }
    /* the other ranks' experts: rows 0, never packed nor read */
    for (int li = 0; li < L; li++) {
        if (!m->layers[li].moe) continue;
        lm_moe *moe = &m->moe[li];
        for (int e = 0; e < X; e++) {
            if (ep_owner(m, li, e) == rank) continue;
            moe->gate[e].rows = moe->up[e].rows = moe->down[e].rows = 0;
        }
    }
    /* a stage's ranks: size expert ranks of tp.size tensor ranks, world rank =
     * (stage * size + ep rank) * tp.size + tp rank */
    m->pp.tp = size * m->tp.size;
    return 0;
}

/* ---- scratch (grows to the largest pass) ---------------------------------- */

static struct {
    float *sx;   /* (rows sent, E) rows out, destination after destination */
    int *sid;    /* (rows sent, K) their expert ids, ascending, -1 padded */
    float *rx;   /* (rows received, E) */
    int *rid;    /* (rows received, K) */
    int *roff;   /* (rows received + 1) a received row's first result slot */
    float *res;  /* (results, E) results, in received-row order, a row's in its ids' order */
    float *hres; /* (results back, E) this home's results, destination after destination */
    int *slot;   /* (n, K) per home row and chosen expert (ascending), its slot in hres */
    float *xe;   /* (n, E) one expert's gathered rows */
    int *idx;    /* (n) their result slots */
    float *ones; /* (n) 1.0f */
    float *acc;  /* (home rows, E) the home rows' output */
    size_t cap[12];
    uint64_t *rows; /* (n_layer, n_expert) stats */
    int n_layer, n_expert;
    uint64_t layers, bytes;
    double a2a_s, compute_s;
} S;

static int grow(void *pp, int which, size_t bytes, char *err, size_t errlen) {
    void **p = pp;
    if (bytes <= S.cap[which] && *p) return 0;
    void *q = lm_realloc(*p, bytes ? bytes : 1);
    if (!q) return lm_err(err, errlen, "out of memory for %zu bytes of expert-parallel scratch", bytes);
    *p = q;
    S.cap[which] = bytes;
    return 0;
}

void ep_stats_get(ep_stats *s) {
    *s = (ep_stats){.rows = S.rows,
                    .n_layer = S.n_layer,
                    .n_expert = S.n_expert,
                    .layers = S.layers,
                    .bytes = S.bytes,
                    .a2a_s = S.a2a_s,
                    .compute_s = S.compute_s};
}

void ep_stats_reset(void) {
    if (S.rows) memset(S.rows, 0, (size_t)S.n_layer * (size_t)S.n_expert * sizeof *S.rows);
    S.layers = S.bytes = 0;
    S.a2a_s = S.compute_s = 0;
}

/* The chosen experts of one token, ascending (k is small: insertion sort). */
static void sorted(const int *sel, const float *selw, int K, int *e, float *w) {
    for (int j = 0; j < K; j++) {
        int i = j;
        while (i > 0 && e[i - 1] > sel[j]) {
            e[i] = e[i - 1];
            w[i] = w[i - 1];
            i--;
        }
        e[i] = sel[j];
        w[i] = selw[j];
    }
}

int ep_moe_ffn(moe_ws *w, lm_pool *pool, const lm_model *m, const lm_layer *l, int li, float *xb, int n, void *act,
               const fwd_hooks *hk, char *err, size_t errlen) {
    const lm_ep *ep = &m->ep;
    const int N = ep->size, me = ep->rank, X = m->hp.n_expert, K = m->hp.n_expert_used, E = m->hp.n_embd;
    const size_t rowb = (size_t)E * sizeof(float);
    if (!hk || !hk->alltoallv || !hk->gather_ep)
        return lm_err(err, errlen, "an expert-parallel pass without its exchange hooks");
    if (K > 64) return lm_err(err, errlen, "%d experts per token: at most 64 under --ep", K);
    if (!S.rows || S.n_layer != m->hp.n_layer || S.n_expert != X) {
        lm_free(S.rows);
        S.rows = lm_calloc((size_t)m->hp.n_layer * (size_t)X, sizeof *S.rows);
        if (!S.rows) return lm_err(err, errlen, "out of memory for the expert counters");
        S.n_layer = m->hp.n_layer;
        S.n_expert = X;
    }
    double t0 = lm_now(), comm = 0;
    /* 1. every row routed, on every rank alike */
    const int *sel;
    const float *selw;
    moe_route(w, pool, m, l->moe, xb, n, act, &sel, &selw);
    const int h0 = (int)((int64_t)me * n / N), h1 = (int)((int64_t)(me + 1) * n / N), nh = h1 - h0;
    /* 2. what this home sends: per destination its rows, each once, with its ids there */
    int send_n[LM_TP_MAX], recv_n[LM_TP_MAX], back_n[LM_TP_MAX], want_n[LM_TP_MAX], ones_n[LM_TP_MAX];
    size_t max_out = (size_t)nh * (size_t)(K < N ? K : N);
    if (grow(&S.sx, 0, max_out * rowb, err, errlen) ||
        grow(&S.sid, 1, max_out * (size_t)K * sizeof(int), err, errlen) ||
        grow(&S.slot, 2, (size_t)n * (size_t)K * sizeof(int), err, errlen) ||
        grow(&S.acc, 3, (size_t)nh * rowb, err, errlen) || grow(&S.xe, 4, (size_t)n * rowb, err, errlen) ||
        grow(&S.idx, 5, (size_t)n * sizeof(int), err, errlen) ||
        grow(&S.ones, 6, (size_t)n * sizeof(float), err, errlen))
        return -1;
    for (int i = 0; i < n; i++) S.ones[i] = 1.0f;
    int se[64];
    float sw[64];
    size_t out = 0, res_out = 0;
    for (int d = 0; d < N; d++) {
        send_n[d] = want_n[d] = 0;
        ones_n[d] = 1;
        for (int t = h0; t < h1; t++) {
            sorted(sel + (size_t)t * K, selw + (size_t)t * K, K, se, sw);
            int c = 0, *ids = S.sid + out * (size_t)K;
            for (int j = 0; j < K; j++)
                if (ep_owner(m, li, se[j]) == d) {
                    S.slot[(size_t)t * K + j] = (int)res_out++; /* d returns results in this order */
                    ids[c++] = se[j];
                }
            if (!c) continue;
            for (int j = c; j < K; j++) ids[j] = -1;
            memcpy(S.sx + out * (size_t)E, xb + (size_t)t * E, rowb);
            out++;
            send_n[d]++;
            want_n[d] += c;
        }
    }
    /* the counts, then the ids and the rows */
    double tc = lm_now();
    if (hk->alltoallv(send_n, ones_n, recv_n, ones_n, sizeof(int), err, errlen)) return -1;
    size_t R = 0;
    for (int r = 0; r < N; r++) R += (size_t)recv_n[r];
    if (grow(&S.rx, 7, R * rowb, err, errlen) || grow(&S.rid, 8, R * (size_t)K * sizeof(int), err, errlen) ||
        grow(&S.roff, 9, (R + 1) * sizeof(int), err, errlen))
        return -1;
    if (hk->alltoallv(S.sid, send_n, S.rid, recv_n, (size_t)K * sizeof(int), err, errlen) ||
        hk->alltoallv(S.sx, send_n, S.rx, recv_n, rowb, err, errlen))
        return -1;
    comm += lm_now() - tc;
    /* 3. this rank's experts over the rows received, one result per (row, expert) */
    S.roff[0] = 0;
    for (size_t i = 0; i < R; i++) {
        int c = 0;
        for (int j = 0; j < K; j++) {
            int e = S.rid[i * (size_t)K + j];
            if (e < 0) break;
            if (e >= X || ep_owner(m, li, e) != me)
                return lm_err(err, errlen, "expert %d sent to rank %d, which does not hold it", e, me);
            c++;
        }
        S.roff[i + 1] = S.roff[i] + c;
    }
    const size_t nres = (size_t)S.roff[R];
    if (grow(&S.res, 10, nres * rowb, err, errlen)) return -1;
    memset(S.res, 0, nres * rowb);
    for (int e = 0; e < X; e++) {
        if (ep_owner(m, li, e) != me) continue;
        int c = 0;
        for (size_t i = 0; i < R; i++)
            for (int j = 0; j < K && S.rid[i * (size_t)K + j] >= 0; j++)
                if (S.rid[i * (size_t)K + j] == e) {
                    memcpy(S.xe + (size_t)c * E, S.rx + i * (size_t)E, rowb);
                    S.idx[c++] = S.roff[i] + j;
                }
        if (!c) continue;
        moe_expert_run(w, pool, m, l->moe, e, S.xe, S.idx, S.ones, c, S.res, act);
        S.rows[(size_t)li * X + e] += (uint64_t)c;
    }
    /* results back, to each row's home in the order it sent them */
    for (int r = 0, i = 0; r < N; r++) {
        back_n[r] = 0;
        for (int j = 0; j < recv_n[r]; j++, i++) back_n[r] += S.roff[i + 1] - S.roff[i];
    }
    if (grow(&S.hres, 11, res_out * rowb, err, errlen)) return -1;
    tc = lm_now();
    if (hk->alltoallv(S.res, back_n, S.hres, want_n, rowb, err, errlen)) return -1;
    comm += lm_now() - tc;
    /* 4. the home's sums in ascending expert order (moe_ffn's), then the shared expert */
    memset(S.acc, 0, (size_t)nh * rowb);
    for (int t = h0; t < h1; t++) {
        sorted(sel + (size_t)t * K, selw + (size_t)t * K, K, se, sw);
        float *o = S.acc + (size_t)(t - h0) * E;
        for (int j = 0; j < K; j++) {
            const float *y = S.hres + (size_t)S.slot[(size_t)t * K + j] * E;
            const float wt = sw[j];
            for (int i = 0; i < E; i++) o[i] += wt * y[i];
        }
    }
    if (l->w_gate.rows && nh) moe_shared_run(w, pool, l, xb + (size_t)h0 * E, nh, S.acc, act);
    /* every home's rows on every rank, in row order */
    int cols[LM_TP_MAX];
    for (int r = 0; r < N; r++) cols[r] = (int)(((int64_t)(r + 1) * n / N - (int64_t)r * n / N) * E);
    tc = lm_now();
    if (hk->gather_ep(S.acc, 1, cols, xb, err, errlen)) return -1;
    comm += lm_now() - tc;
    /* bytes that left this rank */
    for (int d = 0; d < N; d++) {
        if (d == me) continue;
        S.bytes += sizeof(int) + (size_t)send_n[d] * ((size_t)K * sizeof(int) + rowb) + (size_t)back_n[d] * rowb +
            (size_t)nh * rowb;
    }
    S.layers++;
    S.a2a_s += comm;
    S.compute_s += lm_now() - t0 - comm;
    return 0;
}
