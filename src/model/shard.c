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
 * gpt-oss: the attention sinks of this rank's query heads, each expert's gate
 * and up biases of its rows (lm_moe.b_stride stays the whole width); the
 * router's bias, the output bias (added after the sum, forward.c) and the
 * experts' down biases (added on rank 0 only, moe.c) are replicated.
 * A hybrid model (qwen35): its gated full-attention layers split as above,
 * attn_q's rows taken per head as [query | gate] pairs; each gated-DeltaNet
 * layer splits by key heads (shard_recurrent): the rank's key heads
 * [ssm_k0, ssm_k0 + ssm_hk/N) and the value heads reading them (head h
 * reads key head h % ssm_hk, so hv/hk runs of them), i.e. the q, k and v
 * rows of attn_qkv and the conv taps of those channels, the rows of the z
 * gate, ssm_beta and ssm_alpha, dt bias and ssm_a of those heads, ssm_out's
 * columns of their values (a partial sum again); the per-head norm weight
 * is shared. These rows are not one range, so they are gathered into
 * m->shard_mem (under pipeline parallelism too, the stage's layers only:
 * shard_trim); afterwards hp.ssm_hk and hp.ssm_hv are this rank's and
 * every sequence's state (conv window and matrices, rstate.h) holds this
 * rank's heads only. Refused: key heads that do not divide by N, and qwen3next (value
 * heads grouped by key head, a fused ssm_ba) altogether: it runs under --pp.
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
    if (l->moe->gate_b) { /* gpt-oss: each expert's gate and up bias rows of this rank's rows */
        l->moe->gate_b += f0;
        l->moe->up_b += f0;
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

/* ---- the recurrent layers ------------------------------------------------- */

/* A gated-DeltaNet layer (qwen35) splits by key heads: rank r takes key
 * heads [k0, k0 + nk), nk = hk/N, and the value heads that read them. Value
 * head h reads key head h % hk (model.h), so those are h = j hk + k0 + i for
 * j < hv/hk, i < nk: hv/hk runs of nk heads, not one range. Their rows and
 * columns are gathered into shard_mem in the order j-major, i-minor: local
 * value head j nk + i then reads local key head (j nk + i) % nk = i, the
 * same rule over the rank's counts, so gdn.c runs the shard unchanged with
 * hp.ssm_hk = nk and hp.ssm_hv = hv/N. A range list names what to gather:
 * (first, count) pairs in units of what each part counts (heads, channels). */
typedef struct {
    int64_t hk, hv, dk, dv, k0, nk; /* whole counts; this rank's key heads */
} gsplit;

/* The conv channels (and qkv rows) of the rank's heads: q, k, then each run
 * of value heads. out holds 2 + hv/hk pairs; returns their number. */
static int ranges_qkv(const gsplit *s, int64_t (*out)[2]) {
    int n = 0;
    out[n][0] = s->k0 * s->dk, out[n++][1] = s->nk * s->dk;
    out[n][0] = (s->hk + s->k0) * s->dk, out[n++][1] = s->nk * s->dk;
    for (int64_t j = 0; j < s->hv / s->hk; j++)
        out[n][0] = 2 * s->hk * s->dk + (j * s->hk + s->k0) * s->dv, out[n++][1] = s->nk * s->dv;
    return n;
}

/* The rank's value heads, times width (1: the heads; dv: their channels). */
static int ranges_v(const gsplit *s, int64_t width, int64_t (*out)[2]) {
    int n = 0;
    for (int64_t j = 0; j < s->hv / s->hk; j++) out[n][0] = (j * s->hk + s->k0) * width, out[n++][1] = s->nk * width;
    return n;
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Gather w's rows of the ranges into *dst (advanced; NULL: only counted in
 * *bytes) and point w there. */
static void gather_rows(lm_weight *w, const int64_t (*rg)[2], int n_rg, char **dst, size_t *bytes) {
    int64_t rows = 0;
    for (int i = 0; i < n_rg; i++) rows += rg[i][1];
    size_t len = (size_t)rows * w->row_bytes;
    *bytes += align64(len);
    if (!*dst) return;
    char *p = *dst;
    for (int i = 0; i < n_rg; i++) {
        memcpy(p, (const char *)w->data + (size_t)rg[i][0] * w->row_bytes, (size_t)rg[i][1] * w->row_bytes);
        p += (size_t)rg[i][1] * w->row_bytes;
    }
    w->data = *dst;
    w->rows = rows;
    *dst += align64(len);
}

/* Gather w's columns of the ranges, each on whole quantization blocks. */
static int gather_cols(lm_weight *w, const int64_t (*rg)[2], int n_rg, char **dst, size_t *bytes, char *err,
                       size_t errlen) {
    int64_t cols = 0;
    for (int i = 0; i < n_rg; i++) {
        int64_t c0 = rg[i][0], n = rg[i][1];
        if ((c0 && !quant_row_size(w->type, c0)) || !quant_row_size(w->type, n))
            return lm_err(err, errlen,
                          "the linear attention's output of type %s cannot be split at column %lld (%lld columns "
                          "per run of heads are not whole blocks of %lld)",
                          quant_type_name(w->type), (long long)c0, (long long)n,
                          (long long)quant_traits(w->type)->blck);
        cols += n;
    }
    size_t rb = quant_row_size(w->type, cols), len = (size_t)w->rows * rb;
    *bytes += align64(len);
    if (!*dst) return 0;
    for (int64_t r = 0; r < w->rows; r++) {
        char *p = *dst + (size_t)r * rb;
        const char *src = (const char *)w->data + (size_t)r * w->row_bytes;
        for (int i = 0; i < n_rg; i++) {
            size_t n = quant_row_size(w->type, rg[i][1]);
            memcpy(p, src + quant_row_size(w->type, rg[i][0]), n);
            p += n;
        }
    }
    w->data = *dst;
    w->cols = cols;
    w->row_bytes = rb;
    *dst += align64(len);
    return 0;
}

/* Gather the ranges of `per` floats from each of taps rows of x (stride
 * `stride` floats) into *dst; the gathered copy, or NULL when counting. */
static const float *gather_floats(const float *x, int64_t taps, int64_t stride, const int64_t (*rg)[2], int n_rg,
                                  char **dst, size_t *bytes) {
    int64_t per = 0;
    for (int i = 0; i < n_rg; i++) per += rg[i][1];
    size_t len = (size_t)(taps * per) * sizeof(float);
    *bytes += align64(len);
    if (!*dst) return NULL;
    float *out = (float *)*dst, *p = out;
    for (int64_t t = 0; t < taps; t++)
        for (int i = 0; i < n_rg; i++) {
            memcpy(p, x + t * stride + rg[i][0], (size_t)rg[i][1] * sizeof(float));
            p += rg[i][1];
        }
    *dst += align64(len);
    return out;
}

/* Layer g's slices for split s: counted into *bytes when *dst is NULL,
 * else gathered there (and g pointed at them). */
static int shard_gdn(lm_gdn *g, const gsplit *s, int64_t K, int64_t (*rg)[2], char **dst, size_t *bytes, char *err,
                     size_t errlen) {
    int64_t C = 2 * s->hk * s->dk + s->hv * s->dv;
    int n = ranges_qkv(s, rg);
    gather_rows(&g->qkv, rg, n, dst, bytes);
    const float *conv = gather_floats(g->conv_w, K, C, rg, n, dst, bytes);
    n = ranges_v(s, s->dv, rg);
    gather_rows(&g->z, rg, n, dst, bytes);
    if (gather_cols(&g->out, rg, n, dst, bytes, err, errlen)) return -1;
    n = ranges_v(s, 1, rg);
    gather_rows(&g->beta, rg, n, dst, bytes);
    gather_rows(&g->alpha, rg, n, dst, bytes);
    const float *dt = gather_floats(g->dt_bias, 1, 0, rg, n, dst, bytes);
    const float *a = gather_floats(g->a, 1, 0, rg, n, dst, bytes);
    if (*dst) g->conv_w = conv, g->dt_bias = dt, g->a = a;
    return 0;
}

/* Every recurrent layer's slices gathered into m->shard_mem (one
 * allocation: sized by a counting pass, then filled). */
static int shard_recurrent(lm_model *m, int rank, int size, char *err, size_t errlen) {
    lm_hparams *hp = &m->hp;
    if (hp->ssm_hk % size)
        return lm_err(err, errlen,
                      "%d key heads of the linear-attention layers do not split over %d ranks (each rank takes "
                      "whole key heads and the value heads that read them)",
                      hp->ssm_hk, size);
    if (hp->ssm_hv % hp->ssm_hk)
        return lm_err(err, errlen, "%d value heads are not a multiple of %d key heads", hp->ssm_hv, hp->ssm_hk);
    gsplit s = {hp->ssm_hk, hp->ssm_hv, hp->ssm_dk, hp->ssm_dv, 0, hp->ssm_hk / size};
    s.k0 = (int64_t)rank * s.nk;
    int64_t(*rg)[2] = lm_malloc((size_t)(2 + s.hv / s.hk) * sizeof *rg);
    if (!rg) return lm_err(err, errlen, "out of memory");
    size_t bytes = 0;
    char *none = NULL, *dst;
    int rc = 0;
    /* counting: the layers' shapes are alike; the output's block check runs here */
    for (int li = 0; li < hp->n_layer && !rc; li++)
        if (m->layers[li].gdn) {
            lm_gdn g = *m->layers[li].gdn;
            rc = shard_gdn(&g, &s, hp->ssm_conv, rg, &none, &bytes, err, errlen);
        }
    if (!rc && !(m->shard_mem = dst = lm_malloc(bytes)))
        rc = lm_err(err, errlen, "out of memory for the linear-attention slices (%zu bytes)", bytes);
    for (int li = 0; li < hp->n_layer && !rc; li++)
        if (m->layers[li].gdn) {
            size_t b = 0;
            rc = shard_gdn(m->layers[li].gdn, &s, hp->ssm_conv, rg, &dst, &b, err, errlen);
        }
    lm_free(rg);
    if (rc) return -1;
    m->shard_bytes = bytes;
    m->tp.ssm_k0 = (int)s.k0;
    hp->ssm_hk = (int)s.nk;
    hp->ssm_hv = (int)(s.hv / size);
    return 0;
}

int model_shard(lm_model *m, int rank, int size, char *err, size_t errlen) {
    lm_hparams *hp = &m->hp;
    lm_tp *tp = &m->tp;
    memset(tp, 0, sizeof *tp);
    tp->rank = rank;
    tp->size = size;
    tp->n_head = hp->n_head;
    tp->n_head_kv = hp->n_head_kv;
    tp->n_ff = hp->n_ff;
    tp->kv_copies = 1;
    tp->ssm_hk = hp->ssm_hk;
    tp->ssm_hv = hp->ssm_hv;
    tp->n_vocab = hp->n_vocab;
    tp->vocab_split[0] = hp->n_vocab;
    if (size == 1) return 0;
    if (size < 1 || size > LM_TP_MAX || rank < 0 || rank >= size)
        return lm_err(err, errlen, "tensor parallel rank %d of %d (at most %d ranks)", rank, size, LM_TP_MAX);
    if (hp->ssm_grouped) /* its value heads grouped by key head and its fused ssm_ba: not sliced here */
        return lm_err(err, errlen,
                      "tensor parallelism of qwen3next's linear-attention layers is not supported "
                      "(pipeline parallelism is)");
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
    if (hp->n_rlayer && shard_recurrent(m, rank, size, err, errlen)) return -1;
    int nff = hp->n_ff / size, hd = hp->head_dim, qw = hp->attn_gate ? 2 : 1; /* gated: [query | gate] per head */
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
        if (l->gdn) goto ffn; /* shard_recurrent */
        rows_slice(&l->wq, qw * q0, (int64_t)qw * nh * hd);
        rows_slice(&l->wk, k0, (int64_t)nkv * hd);
        rows_slice(&l->wv, k0, (int64_t)nkv * hd);
        if (l->bq) l->bq += q0;
        if (l->bk) l->bk += k0;
        if (l->bv) l->bv += k0;
        if (l->sinks) l->sinks += tp->head0;
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

/* ---- pipeline stages ------------------------------------------------------
 *
 * A stage holds layers [layer0, layer1): their weights, the KV of its
 * full-attention layers and, on a hybrid model, the recurrent state of its
 * linear-attention layers only (lm_pp.kv0 .. kv1 and rec0 .. rec1, the
 * same layers counted as the KV pool and the state store count them).
 * Every stage of a hybrid model holds a full-attention layer (its KV
 * pool must store some layer): the split balances bytes under that rule,
 * and more stages than the model has full-attention layers are refused. */

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
 * in size stages. Every stage must hold a layer whose anchor[] is set
 * (every layer; a hybrid model's full-attention layers), so a stage ends
 * only once it holds one, and must end while the layers left still hold
 * one for each stage after it; left[i] counts the anchors in [i, n).
 * Without the rule (every layer an anchor) cutting as late as the cap
 * allows is optimal and fits is monotone in cap; with it the binary search
 * below still ends on a cap that fits (the whole model's bytes fit whenever
 * there are anchors enough), balanced if perhaps not optimally. */
static bool fits(const uint64_t *lb, const bool *anchor, const int *left, int n, uint64_t head, uint64_t tail, int size,
                 uint64_t cap, int *first) {
    int s = 0;
    bool held = false; /* stage s holds an anchor */
    uint64_t cur = head;
    first[0] = 0;
    for (int i = 0; i < n; i++) {
        uint64_t add = lb[i] + (i == n - 1 ? tail : 0);
        bool must_cut = held && left[i + 1] < size - 1 - s;
        if (held && (must_cut || cur + add > cap) && left[i] >= size - 1 - s) {
            if (++s >= size) return false;
            first[s] = i;
            cur = 0;
            held = false;
        }
        cur += add;
        held = held || anchor[i];
        if (cur > cap) return false;
    }
    if (s != size - 1 || !held) return false;
    first[size] = n;
    return true;
}

int model_pp_split(const lm_model *m, int size, int *first, uint64_t *bytes, char *err, size_t errlen) {
    int n = m->hp.n_layer, n_anchor = 0;
    if (size < 1 || size > n || size > LM_TP_MAX)
        return lm_err(err, errlen, "%d pipeline stages for %d layers (at most one stage per layer, %d stages)", size, n,
                      n < LM_TP_MAX ? n : LM_TP_MAX);
    uint64_t *lb = lm_malloc((size_t)n * sizeof *lb), lo = 0, hi = 0;
    bool *anchor = lm_malloc((size_t)n * sizeof *anchor);
    int *left = lm_malloc((size_t)(n + 1) * sizeof *left);
    if (!lb || !anchor || !left) {
        lm_free(lb), lm_free(anchor), lm_free(left);
        return lm_err(err, errlen, "out of memory");
    }
    /* a hybrid's stage needs a full-attention layer: its KV pool stores some layer (kv.h) */
    left[n] = 0;
    for (int i = n - 1; i >= 0; i--) {
        anchor[i] = !m->hp.n_rlayer || m->layers[i].rec < 0;
        left[i] = left[i + 1] + anchor[i];
    }
    n_anchor = left[0];
    uint64_t head = wbytes(&m->tok_embd), tail = wbytes(&m->output) + (uint64_t)m->hp.n_embd * sizeof(float);
    hi = head + tail;
    for (int i = 0; i < n; i++) hi += lb[i] = model_layer_bytes(m, i);
    /* the smallest cap that fits: binary search (see fits) */
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (fits(lb, anchor, left, n, head, tail, size, mid, first)) hi = mid;
        else lo = mid + 1;
    }
    bool ok = fits(lb, anchor, left, n, head, tail, size, lo, first);
    for (int s = 0; ok && s < size; s++) {
        bytes[s] = (s == 0 ? head : 0) + (s == size - 1 ? tail : 0);
        for (int i = first[s]; i < first[s + 1]; i++) bytes[s] += lb[i];
    }
    lm_free(lb);
    lm_free(anchor);
    lm_free(left);
    if (ok) return 0;
    if (n_anchor < size)
        return lm_err(err, errlen,
                      "cannot split %d layers into %d stages each holding a full-attention layer (a hybrid model's "
                      "stage needs one; this model has %d)",
                      n, size, n_anchor);
    return lm_err(err, errlen, "cannot split %d layers into %d stages", n, size);
}

/* The stage's KV pool layers and state layers (lm_pp.kv0 .. rec1). */
static void stage_classes(lm_model *m) {
    lm_pp *pp = &m->pp;
    pp->kv0 = pp->rec0 = 0;
    pp->kv1 = pp->rec1 = 0;
    for (int li = 0; li < pp->layer1; li++) {
        const lm_layer *l = &m->layers[li];
        bool rec = l->rec >= 0;
        if (li < pp->layer0) *(rec ? &pp->rec0 : &pp->kv0) += 1;
        *(rec ? &pp->rec1 : &pp->kv1) += 1;
    }
}

/* Under tensor and pipeline parallelism at once: keep in shard_mem the
 * gathered slices of this stage's recurrent layers only (model_shard,
 * knowing no stage, gathered every layer's). Each layer's slices are one
 * run of the slab, in layer order from its qkv (shard_recurrent), so they
 * move as a whole; the other stages' layers are left without data (NULL;
 * their shapes stay, for the byte counts). */
static int shard_trim(lm_model *m, char *err, size_t errlen) {
    if (!m->shard_mem || m->pp.size == 1) return 0;
    const int n = m->hp.n_layer;
    const char *old = m->shard_mem;
    size_t *at = lm_malloc((size_t)(n + 1) * sizeof *at), keep = 0; /* (n + 1) each run's start, then its end */
    if (!at) return lm_err(err, errlen, "out of memory");
    size_t end = m->shard_bytes;
    for (int li = n - 1; li >= 0; li--) { /* at[li]: layer li's run, ending where the next one starts */
        at[li + 1] = end;
        if (m->layers[li].gdn) end = (size_t)((const char *)m->layers[li].gdn->qkv.data - old);
        at[li] = end;
    }
    for (int li = m->pp.layer0; li < m->pp.layer1; li++)
        if (m->layers[li].gdn) keep += at[li + 1] - at[li];
    char *mem = lm_malloc(keep ? keep : 1);
    if (!mem) {
        lm_free(at);
        return lm_err(err, errlen, "out of memory for the linear-attention slices (%zu bytes)", keep);
    }
    size_t off = 0;
    for (int li = 0; li < n; li++) {
        lm_gdn *g = m->layers[li].gdn;
        if (!g) continue;
        bool here = li >= m->pp.layer0 && li < m->pp.layer1;
        const char *from = old + at[li];
        char *to = mem + off;
        if (here) memcpy(to, from, at[li + 1] - at[li]), off += at[li + 1] - at[li];
#define MOVE(p, T) ((p) = here ? (T)(to + ((const char *)(p)-from)) : NULL)
        MOVE(g->qkv.data, const void *);
        MOVE(g->z.data, const void *);
        MOVE(g->beta.data, const void *);
        MOVE(g->alpha.data, const void *);
        MOVE(g->out.data, const void *);
        MOVE(g->conv_w, const float *);
        MOVE(g->dt_bias, const float *);
        MOVE(g->a, const float *);
#undef MOVE
    }
    lm_free(at);
    lm_free(m->shard_mem);
    m->shard_mem = mem;
    m->shard_bytes = keep;
    return 0;
}

int model_stage(lm_model *m, int stage, int size, char *err, size_t errlen) {
    lm_pp *pp = &m->pp;
    int tp = m->tp.size;
    memset(pp, 0, sizeof *pp);
    pp->size = 1;
    pp->tp = tp;
    pp->layer1 = m->hp.n_layer;
    pp->first[1] = m->hp.n_layer;
    stage_classes(m);
    if (size == 1) return 0;
    if (stage < 0 || stage >= size) return lm_err(err, errlen, "pipeline stage %d of %d", stage, size);
    if (model_pp_split(m, size, pp->first, pp->bytes, err, errlen)) return -1;
    pp->stage = stage;
    pp->size = size;
    pp->layer0 = pp->first[stage];
    pp->layer1 = pp->first[stage + 1];
    stage_classes(m);
    return shard_trim(m, err, errlen);
}
