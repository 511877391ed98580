/*
 * shard.c - tensor-parallel slices of a loaded model (model.h, lm_tp).
 *
 * Rank r of N keeps, per layer (Megatron's split):
 *   wq, bq        rows of query heads [head0, head0 + n_head/N)
 *   wk, wv, bk/bv rows of KV heads [kv_head0, kv_head0 + n_kv) where n_kv is
 *                 n_head_kv/N, or 1 when N > n_head_kv (each KV head is then
 *                 held by N/n_head_kv ranks, the ones whose query heads use it)
 *   wo            columns of the same query heads: its product is a partial
 *                 sum of the attention output, added across ranks
 *   w_gate, w_up  FFN rows [ff0, ff0 + n_ff/N)
 *   w_down        the same columns: a partial sum again
 *   output        LM head rows [vocab0, vocab0 + n_vocab), vocabulary split as
 *                 evenly as whole rows allow; the embedding table, norms and
 *                 RoPE are replicated.
 * deepseek2's latent attention splits by query heads too (shard_mla): q_b
 * rows, the per-head W_UKᵀ / W_UV, wo columns; the latent is replicated.
 * Every dense architecture splits this way: per-head Q/K norms (qwen3,
 * gemma3) act on whole heads, post norms and soft-caps (gemma2) on the
 * replicated stream or the gathered logits, and phi3's fused QKV and
 * gate/up matrices are already row slices of one tensor (model.c), sliced
 * again here. A Mixture-of-Experts layer splits each expert (and the
 * shared expert) by its rows the same way, the router replicated
 * (shard_moe); afterwards hp.n_ff_exp and hp.n_ff_shexp are this rank's.
 * Row slices are whole stored rows (a pointer into the mapping); column
 * slices keep the stored row stride and start on a whole quantization block,
 * so any type splits as long as the column range is a multiple of its block
 * (32 for Q4_0/Q8_0, 256 for the K-quants). Afterwards hp.n_head,
 * hp.n_head_kv and hp.n_ff are this rank's counts, so the forward pass, the
 * workspace and the KV pool (KV heads of this rank only) size themselves for
 * the shard unchanged; lm_tp keeps the whole model's. Packing (model.c) runs
 * after slicing, so only this rank's slices are copied.
 */
#include "model/model.h"

#include <string.h>

#include "format/quant.h"
#include "base/util.h"

static void rows_slice(lm_weight *w, int64_t r0, int64_t n) {
    w->data = (const char *)w->data + (size_t)r0 * w->row_bytes;
    w->rows = n;
}

static int cols_slice(lm_weight *w, int64_t c0, int64_t n, const char *what, char *err, size_t errlen) {
    size_t off = quant_row_size(w->type, c0), len = quant_row_size(w->type, n);
    if ((c0 && !off) || !len)
        return lm_err(err, errlen,
                      "%s of type %s cannot be split at column %lld (%lld columns per rank are not whole "
                      "blocks of %lld)",
                      what, quant_type_name(w->type), (long long)c0, (long long)n,
                      (long long)quant_traits(w->type)->blck);
    w->data = (const char *)w->data + off;
    w->cols = n;
    return 0;
}

/* A layer's experts: each expert's gate/up rows and down columns split as a
 * dense FFN's, and so is the shared expert (qwen2moe); the router and the
 * shared expert's gate vector are replicated, so every rank routes every
 * token alike and the layer's output is a partial sum like down's. */
static int shard_moe(const lm_model *m, lm_layer *l, int rank, int size, char *err, size_t errlen) {
    const lm_hparams *hp = &m->hp;
    int64_t f = hp->n_ff_exp / size, f0 = (int64_t)rank * f;
    for (int e = 0; e < hp->n_expert; e++) {
        rows_slice(&l->moe->gate[e], f0, f);
        rows_slice(&l->moe->up[e], f0, f);
        if (cols_slice(&l->moe->down[e], f0, f, "an expert's down projection", err, errlen)) return -1;
    }
    if (hp->n_ff_shexp > 0) {
        int64_t s = hp->n_ff_shexp / size, s0 = (int64_t)rank * s;
        rows_slice(&l->w_gate, s0, s);
        rows_slice(&l->w_up, s0, s);
        if (cols_slice(&l->w_down, s0, s, "the shared expert's down projection", err, errlen)) return -1;
    }
    return 0;
}

/* A latent attention layer (deepseek2): this rank's query heads are rows of
 * q_b (attn_q_b or attn_q), their W_UKᵀ / W_UV slices, and wo's columns of
 * their values; q_a, kv_a and their norms are replicated, so every rank
 * computes the whole latent and keeps the whole latent cache (one KV head,
 * replicated as any single KV head is). */
static int shard_mla(const lm_model *m, lm_layer *l, int head0, int nh, char *err, size_t errlen) {
    const lm_hparams *hp = &m->hp;
    lm_mla *a = l->mla;
    int64_t qk = (int64_t)hp->qk_nope + hp->n_rot, vd = hp->v_head_dim;
    rows_slice(&a->q_b, (int64_t)head0 * qk, (int64_t)nh * qk);
    a->k_b += head0;
    a->v_b += head0;
    return cols_slice(&l->wo, (int64_t)head0 * vd, (int64_t)nh * vd, "the attention output", err, errlen);
}

int model_shard(lm_model *m, int rank, int size, char *err, size_t errlen) {
    lm_hparams *hp = &m->hp;
    lm_tp *tp = &m->tp;
    memset(tp, 0, sizeof *tp);
    tp->rank = rank;
    tp->size = size;
    if (size > 1 && hp->n_rlayer)
        return lm_err(err, errlen, "tensor parallelism of a hybrid model's linear-attention layers is not supported");
    tp->n_head = hp->n_head;
    tp->n_head_kv = hp->n_head_kv;
    tp->n_ff = hp->n_ff;
    tp->kv_copies = 1;
    tp->n_vocab = hp->n_vocab;
    tp->vocab_split[0] = hp->n_vocab;
    if (size == 1) return 0;
    if (size < 1 || size > LM_TP_MAX || rank < 0 || rank >= size)
        return lm_err(err, errlen, "tensor parallel rank %d of %d (at most %d ranks)", rank, size, LM_TP_MAX);
    if (hp->n_head % size)
        return lm_err(err, errlen, "%d attention heads do not split over %d ranks", hp->n_head, size);
    int nh = hp->n_head / size, nkv;
    if (hp->n_head_kv >= size) {
        if (hp->n_head_kv % size)
            return lm_err(err, errlen, "%d KV heads do not split over %d ranks", hp->n_head_kv, size);
        nkv = hp->n_head_kv / size;
        tp->kv_head0 = rank * nkv;
    } else {
        if (size % hp->n_head_kv)
            return lm_err(err, errlen, "%d KV heads cannot be replicated evenly over %d ranks", hp->n_head_kv, size);
        nkv = 1;
        tp->kv_copies = size / hp->n_head_kv;
        tp->kv_head0 = rank / tp->kv_copies;
    }
    if ((!m->moe || hp->n_layer_dense) && hp->n_ff % size) /* deepseek2's leading dense layers too */
        return lm_err(err, errlen, "%d FFN rows do not split over %d ranks", hp->n_ff, size);
    if (m->moe && (hp->n_ff_exp % size || hp->n_ff_shexp % size))
        return lm_err(err, errlen, "experts of %d rows (shared expert %d) do not split over %d ranks", hp->n_ff_exp,
                      hp->n_ff_shexp, size);
    int nff = hp->n_ff / size, hd = hp->head_dim;
    tp->head0 = rank * nh;
    tp->ff0 = rank * nff;
    for (int r = 0; r < size; r++) {
        int64_t a = (int64_t)hp->n_vocab * r / size, b = (int64_t)hp->n_vocab * (r + 1) / size;
        tp->vocab_split[r] = (int)(b - a);
        if (r == rank) tp->vocab0 = (int)a;
    }
    tp->n_vocab = tp->vocab_split[rank];
    for (int li = 0; li < hp->n_layer; li++) {
        lm_layer *l = &m->layers[li];
        int64_t q0 = (int64_t)tp->head0 * hd, k0 = (int64_t)tp->kv_head0 * hd;
        if (l->mla) {
            if (shard_mla(m, l, tp->head0, nh, err, errlen)) return -1;
            goto ffn;
        }
        rows_slice(&l->wq, q0, (int64_t)nh * hd);
        rows_slice(&l->wk, k0, (int64_t)nkv * hd);
        rows_slice(&l->wv, k0, (int64_t)nkv * hd);
        if (l->bq) l->bq += q0;
        if (l->bk) l->bk += k0;
        if (l->bv) l->bv += k0;
        if (cols_slice(&l->wo, q0, (int64_t)nh * hd, "the attention output", err, errlen)) return -1;
    ffn:
        if (l->moe) {
            if (shard_moe(m, l, rank, size, err, errlen)) return -1;
            continue;
        }
        rows_slice(&l->w_gate, tp->ff0, nff);
        rows_slice(&l->w_up, tp->ff0, nff);
        if (cols_slice(&l->w_down, tp->ff0, nff, "the down projection", err, errlen)) return -1;
    }
    if (m->moe) {
        hp->n_ff_exp /= size;
        hp->n_ff_shexp /= size;
    }
    rows_slice(&m->output, tp->vocab0, tp->n_vocab);
    hp->n_head = nh;
    hp->n_head_kv = nkv;
    hp->n_ff = nff;
    return 0;
}

/* ---- pipeline stages ------------------------------------------------------ */

static uint64_t wbytes(const lm_weight *w) { return (uint64_t)w->rows * w->row_bytes; }

uint64_t model_layer_bytes(const lm_model *m, int li) {
    const lm_layer *l = &m->layers[li];
    const lm_weight *ws[MODEL_LAYER_MATRICES];
    model_layer_matrices(l, ws);
    uint64_t b = 0;
    for (int k = 0; k < MODEL_LAYER_MATRICES; k++) b += wbytes(ws[k]);
    if (l->mla) { /* the latent attention's matrices (wq, wk, wv have no rows) and its two norms */
        const lm_mla *a = l->mla;
        b += wbytes(&a->q_a) + wbytes(&a->q_b) + wbytes(&a->kv_a);
        for (int h = 0; h < m->hp.n_head; h++) b += wbytes(&a->k_b[h]) + wbytes(&a->v_b[h]);
        b += (uint64_t)(m->hp.q_lora_rank + m->hp.kv_lora_rank) * sizeof(float);
    }
    if (l->gdn) /* the linear attention's matrices (wq .. wo have no rows); its vectors are small */
        b += wbytes(&l->gdn->qkv) + wbytes(&l->gdn->z) + wbytes(&l->gdn->beta) + wbytes(&l->gdn->alpha) +
            wbytes(&l->gdn->out);
    if (l->moe) {
        b += wbytes(&l->moe->gate_inp);
        for (int e = 0; e < m->hp.n_expert; e++)
            b += wbytes(&l->moe->gate[e]) + wbytes(&l->moe->up[e]) + wbytes(&l->moe->down[e]);
    }
    return b + 2 * (uint64_t)m->hp.n_embd * sizeof(float); /* the two norms */
}

/* Greedy fill under cap: the stages that layers 0.. need when no stage may
 * pass cap (the ends weigh head and tail more); first[] filled when it fits
 * in size stages with a layer each. */
static bool fits(const uint64_t *lb, int n, uint64_t head, uint64_t tail, int size, uint64_t cap, int *first) {
    int s = 0;
    uint64_t cur = head;
    first[0] = 0;
    for (int i = 0; i < n; i++) {
        /* layers left must leave one per stage after this one */
        uint64_t add = lb[i] + (i == n - 1 ? tail : 0);
        bool must_cut = n - i <= size - 1 - s && i > first[s];
        if (must_cut || (cur + add > cap && i > first[s])) {
            if (++s >= size) return false;
            first[s] = i;
            cur = 0;
        }
        cur += add;
        if (cur > cap) return false;
    }
    if (s != size - 1) return false;
    first[size] = n;
    return true;
}

int model_pp_split(const lm_model *m, int size, int *first, uint64_t *bytes, char *err, size_t errlen) {
    int n = m->hp.n_layer;
    if (size < 1 || size > n || size > LM_TP_MAX)
        return lm_err(err, errlen, "%d pipeline stages for %d layers (at most one stage per layer, %d stages)", size, n,
                      n < LM_TP_MAX ? n : LM_TP_MAX);
    uint64_t *lb = lm_malloc((size_t)n * sizeof *lb), lo = 0, hi = 0;
    if (!lb) return lm_err(err, errlen, "out of memory");
    uint64_t head = wbytes(&m->tok_embd), tail = wbytes(&m->output) + (uint64_t)m->hp.n_embd * sizeof(float);
    hi = head + tail;
    for (int i = 0; i < n; i++) hi += lb[i] = model_layer_bytes(m, i);
    /* the smallest cap that fits: binary search (fits is monotone in cap) */
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (fits(lb, n, head, tail, size, mid, first)) hi = mid;
        else lo = mid + 1;
    }
    bool ok = fits(lb, n, head, tail, size, lo, first);
    for (int s = 0; ok && s < size; s++) {
        bytes[s] = (s == 0 ? head : 0) + (s == size - 1 ? tail : 0);
        for (int i = first[s]; i < first[s + 1]; i++) bytes[s] += lb[i];
    }
    lm_free(lb);
    return ok ? 0 : lm_err(err, errlen, "cannot split %d layers into %d stages", n, size);
}

int model_stage(lm_model *m, int stage, int size, char *err, size_t errlen) {
    lm_pp *pp = &m->pp;
    int tp = m->tp.size;
    memset(pp, 0, sizeof *pp);
    pp->size = 1;
    pp->tp = tp;
    pp->layer1 = m->hp.n_layer;
    pp->first[1] = m->hp.n_layer;
    if (size == 1) return 0;
    if (m->hp.n_rlayer)
        return lm_err(err, errlen, "pipeline parallelism of a hybrid model's linear-attention layers is not supported");
    if (stage < 0 || stage >= size) return lm_err(err, errlen, "pipeline stage %d of %d", stage, size);
    if (model_pp_split(m, size, pp->first, pp->bytes, err, errlen)) return -1;
    pp->stage = stage;
    pp->size = size;
    pp->layer0 = pp->first[stage];
    pp->layer1 = pp->first[stage + 1];
    return 0;
}
