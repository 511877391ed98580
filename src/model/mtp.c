/*
 * mtp.c - the next-token-prediction head (mtp.h): one qwen35 attention
 * layer with its own small float cache, between the nextn input projection
 * and the LM head.
 *
 * A run goes row by row: the products are one-row ops_matmul calls over the
 * pool (the head is one layer, so a draft step reads its weights once and
 * the LM head once), attention is a plain loop over the cache's positions.
 * The weights are read where the model keeps them (the mapping; the MTP
 * layer's matrices are not packed), so the products are the row-major
 * kernels' for the weight's type.
 */
#include "model/mtp.h"

#include <math.h>
#include <string.h>

#include "model/moe.h"
#include "model/ops.h"
#include "base/util.h"

struct mtp_head {
    const lm_model *m;
    const lm_mtp *t;
    lm_pool *pool; /* not owned */
    int n_ctx;
    float *kc, *vc;  /* (n_ctx, n_head_kv * head_dim) the cache's K and V rows */
    float *x;        /* (n_embd) residual */
    float *cat;      /* (2 n_embd) [enorm(e) ; hnorm(h)], then the normed residual */
    float *qg;       /* (2 q_dim) per head [query | gate] */
    float *q, *gate; /* (q_dim) each */
    float *k, *v;    /* (kv_dim) each */
    float *att;      /* (q_dim) the heads' output */
    float *hb, *hb2; /* (max(n_ff, n_ff_shexp, n_embd)) each: FFN rows, the output product */
    float *cs;       /* (n_rot) RoPE cos/sin */
    float *sc;       /* (n_ctx) one head's scores */
    void *act;       /* ops_matmul activation scratch */
    moe_ws *moe;     /* the experts' workspace for one row, NULL for a dense FFN */
    float *mem;      /* the one float allocation the buffers above point into */
};

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

mtp_head *mtp_new(const lm_model *m, lm_pool *pool, int n_ctx, lm_status *status, char *err, size_t errlen) {
    lm_status st_buf;
    if (!status) status = &st_buf;
    *status = LM_ERR_UNSUPPORTED;
    const lm_hparams *hp = &m->hp;
    if (!m->mtp) {
        lm_err(err, errlen, "the model has no next-token-prediction layer (%s.nextn_predict_layers)",
               model_arch_name(hp->arch));
        return NULL;
    }
    if (m->tp.size > 1 || m->pp.size > 1 || m->ep.size > 1) {
        lm_err(err, errlen, "the next-token-prediction head does not run on a sharded model");
        return NULL;
    }
    if (hp->rope_yarn || hp->rope_factors_short || hp->rope_factors_long ||
        (hp->rope_attn_factor != 0.0f && hp->rope_attn_factor != 1.0f)) {
        lm_err(err, errlen, "the next-token-prediction head supports linear RoPE scaling only");
        return NULL;
    }
    *status = LM_ERR_INVALID;
    if (n_ctx < 1 || !pool) {
        lm_err(err, errlen, "the next-token-prediction head needs a context of at least one position and a pool");
        return NULL;
    }
    *status = LM_ERR_NOMEM;
    mtp_head *c = lm_calloc(1, sizeof *c);
    if (!c) {
        lm_err(err, errlen, "out of memory");
        return NULL;
    }
    c->m = m;
    c->t = m->mtp;
    c->pool = pool;
    c->n_ctx = n_ctx;
    const size_t E = (size_t)hp->n_embd, qd = (size_t)hp->n_head * hp->head_dim;
    const size_t kvd = (size_t)hp->n_head_kv * hp->head_dim;
    const size_t ff = max_sz(max_sz((size_t)hp->n_ff, (size_t)hp->n_ff_shexp), E);
    const size_t n = 2 * (size_t)n_ctx * kvd + E + 2 * E + 2 * qd + 2 * qd + 2 * kvd + qd + 2 * ff + (size_t)hp->n_rot +
        (size_t)n_ctx;
    c->mem = lm_malloc(n * sizeof(float));
    /* activation scratch: the widest input any product here reads */
    const lm_layer *l = &c->t->layer;
    size_t act = ops_matmul_scratch(c->t->eh_proj.type, 2 * (int64_t)E, 1);
    const lm_weight *ws[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up, &l->w_down, c->t->head};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
        if (ws[i]->rows) act = max_sz(act, ops_matmul_scratch(ws[i]->type, ws[i]->cols, 1));
    if (l->moe) act = max_sz(act, moe_act_bytes(m, 1));
    c->act = lm_malloc(act);
    if (!c->mem || !c->act) {
        lm_err(err, errlen, "out of memory");
        mtp_free(c);
        return NULL;
    }
    if (l->moe && !(c->moe = moe_ws_new(m, 1, err, errlen))) {
        mtp_free(c);
        return NULL;
    }
    float *p = c->mem;
    c->kc = p, p += (size_t)n_ctx * kvd;
    c->vc = p, p += (size_t)n_ctx * kvd;
    c->x = p, p += E;
    c->cat = p, p += 2 * E;
    c->qg = p, p += 2 * qd;
    c->q = p, p += qd;
    c->gate = p, p += qd;
    c->k = p, p += kvd;
    c->v = p, p += kvd;
    c->att = p, p += qd;
    c->hb = p, p += ff;
    c->hb2 = p, p += ff;
    c->cs = p, p += hp->n_rot;
    c->sc = p, p += n_ctx;
    *status = LM_OK;
    return c;
}

void mtp_free(mtp_head *c) {
    if (!c) return;
    moe_ws_free(c->moe);
    lm_free(c->act);
    lm_free(c->mem);
    lm_free(c);
}

int mtp_n_ctx(const mtp_head *c) { return c->n_ctx; }

int32_t mtp_argmax(const float *logits, int n_vocab) {
    int32_t best = 0;
    for (int i = 1; i < n_vocab; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

/* RoPE angles at pos for the head's layer, qwen35's sections applied (the
 * pairs outside the text axes keep angle 0), as forward.c's rope_angles. */
static void rope_angles(mtp_head *c, int pos) {
    const lm_hparams *hp = &c->m->hp;
    ops_rope_angles(c->cs, hp->n_rot, pos, c->t->layer.rope_base, c->t->layer.rope_scale);
    const int *sec = hp->rope_sections;
    int n_sect = sec[0] + sec[1] + sec[2] + sec[3];
    if (n_sect == 0) return;
    for (int i = 0; i < hp->n_rot / 2; i++) {
        int s = i % n_sect;
        bool text = (s % 3 == 0 && s < 3 * sec[0]) || (s % 3 == 1 && s < 3 * sec[1]) || (s % 3 == 2 && s < 3 * sec[2]);
        if (!text) c->cs[2 * i] = 1, c->cs[2 * i + 1] = 0;
    }
}

/* Gated attention of the row at pos: x (normed in c->cat) -> c->att. */
static void attention(mtp_head *c, const float *xn, int pos) {
    const lm_hparams *hp = &c->m->hp;
    const lm_layer *l = &c->t->layer;
    const int hd = hp->head_dim, H = hp->n_head, Hkv = hp->n_head_kv;
    const size_t qd = (size_t)H * hd, kvd = (size_t)Hkv * hd;
    float *const y[3] = {c->qg, c->k, c->v};
    const lm_weight *const w[3] = {&l->wq, &l->wk, &l->wv};
    ops_matmul_multi(c->pool, 3, y, w, xn, 1, c->act);
    for (int h = 0; h < H; h++) { /* per head [query | gate] */
        memcpy(c->q + (size_t)h * hd, c->qg + (size_t)h * 2 * hd, (size_t)hd * sizeof(float));
        memcpy(c->gate + (size_t)h * hd, c->qg + (size_t)h * 2 * hd + hd, (size_t)hd * sizeof(float));
        ops_rmsnorm(c->q + (size_t)h * hd, c->q + (size_t)h * hd, l->q_norm, hd, hp->norm_eps);
    }
    for (int h = 0; h < Hkv; h++)
        ops_rmsnorm(c->k + (size_t)h * hd, c->k + (size_t)h * hd, l->k_norm, hd, hp->norm_eps);
    rope_angles(c, pos);
    ops_rope_apply(c->q, H, hd, hp->n_rot, c->cs, hp->rope_style);
    ops_rope_apply(c->k, Hkv, hd, hp->n_rot, c->cs, hp->rope_style);
    memcpy(c->kc + (size_t)pos * kvd, c->k, kvd * sizeof(float));
    memcpy(c->vc + (size_t)pos * kvd, c->v, kvd * sizeof(float));
    const int group = H / Hkv;
    for (int h = 0; h < H; h++) {
        const float *q = c->q + (size_t)h * hd;
        const size_t koff = (size_t)(h / group) * hd;
        float mx = -INFINITY;
        for (int j = 0; j <= pos; j++) { /* scores q·k_j · scale */
            const float *k = c->kc + (size_t)j * kvd + koff;
            float s = 0;
            for (int d = 0; d < hd; d++) s += q[d] * k[d];
            c->sc[j] = s * hp->attn_scale;
            if (c->sc[j] > mx) mx = c->sc[j];
        }
        float sum = 0;
        for (int j = 0; j <= pos; j++) sum += c->sc[j] = expf(c->sc[j] - mx);
        float *o = c->att + (size_t)h * hd;
        memset(o, 0, (size_t)hd * sizeof(float));
        for (int j = 0; j <= pos; j++) { /* softmax-weighted values */
            const float *v = c->vc + (size_t)j * kvd + koff, pj = c->sc[j] / sum;
            for (int d = 0; d < hd; d++) o[d] += pj * v[d];
        }
    }
    for (size_t i = 0; i < qd; i++) c->att[i] *= 1.0f / (1.0f + expf(-c->gate[i])); /* the output gate */
}

/* One row: token tok at pos with hidden state h; x left in c->x. */
static void row(mtp_head *c, const float *h, int32_t tok, int pos) {
    const lm_hparams *hp = &c->m->hp;
    const lm_mtp *t = c->t;
    const lm_layer *l = &t->layer;
    const int E = hp->n_embd;
    ops_get_row(t->embed, tok, c->hb); /* [enorm(e) ; hnorm(h)] -> eh_proj */
    ops_rmsnorm(c->cat, c->hb, t->enorm, E, hp->norm_eps);
    ops_rmsnorm(c->cat + E, h, t->hnorm, E, hp->norm_eps);
    ops_matmul(c->pool, c->x, &t->eh_proj, c->cat, 1, c->act);
    ops_rmsnorm(c->cat, c->x, l->attn_norm, E, hp->norm_eps); /* attention block */
    attention(c, c->cat, pos);
    ops_matmul(c->pool, c->hb, &l->wo, c->att, 1, c->act);
    for (int i = 0; i < E; i++) c->x[i] += c->hb[i];
    ops_rmsnorm(c->cat, c->x, l->ffn_norm, E, hp->norm_eps); /* FFN block (post_attention_norm) */
    if (l->moe) {
        moe_ffn(c->moe, c->pool, c->m, l, c->cat, 1, c->act, NULL);
        for (int i = 0; i < E; i++) c->x[i] += c->cat[i];
        return;
    }
    float *const y[2] = {c->hb, c->hb2};
    const lm_weight *const w[2] = {&l->w_gate, &l->w_up};
    ops_matmul_multi(c->pool, 2, y, w, c->cat, 1, c->act);
    ops_swiglu(c->hb, c->hb2, hp->n_ff);
    ops_matmul(c->pool, c->hb2, &l->w_down, c->hb, 1, c->act);
    for (int i = 0; i < E; i++) c->x[i] += c->hb2[i];
}

int mtp_run(mtp_head *c, const float *h, const int32_t *tok, int n, int pos0, float *logits, float *h_out, char *err,
            size_t errlen) {
    const lm_hparams *hp = &c->m->hp;
    const int E = hp->n_embd;
    if (n < 1 || pos0 < 0 || pos0 + n > c->n_ctx)
        return lm_err(err, errlen, "next-token prediction at positions %d..%d passes its cache of %d", pos0,
                      pos0 + n - 1, c->n_ctx);
    for (int r = 0; r < n; r++)
        if (tok[r] < 0 || tok[r] >= hp->n_vocab)
            return lm_err(err, errlen, "token id %d is out of range [0, %d)", tok[r], hp->n_vocab);
    for (int r = 0; r < n; r++) row(c, h + (size_t)r * E, tok[r], pos0 + r);
    if (!logits && !h_out) return 0;
    float *hn = h_out ? h_out : c->cat;
    ops_rmsnorm(hn, c->x, c->t->head_norm, E, hp->norm_eps);
    if (logits) ops_matmul(c->pool, logits, c->t->head, hn, 1, c->act);
    return 0;
}
