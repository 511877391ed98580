/*
 * cost.c - the cost model of one forward pass, per op (cost.h says what is
 * counted and how). Pure arithmetic over the model's shapes: it reads the
 * hyperparameters and the weights' rows and row_bytes, never their data.
 * Invariant: the sum over ops is what one pass of fwd_pass (forward.c)
 * reads, writes and computes under cost.h's conventions; the KV figures
 * use the cache's own row size (kv_plan_make), so they follow every KV type
 * the cache stores.
 */
#include "model/cost.h"

#include <math.h>
#include <string.h>

#include "kv/attn.h"
#include "kv/kv.h"
#include "base/util.h"

static double mat_bytes(const lm_weight *w) { return (double)w->rows * (double)w->row_bytes; }

/* A product of n rows through w: weight read once, input and output rows. */
static void add_matmul(cost_op *o, const lm_weight *w, double n) {
    if (w->rows == 0) return;
    o->weight_bytes += mat_bytes(w);
    o->act_bytes += 4.0 * n * (double)(w->cols + w->rows);
    o->flops += 2.0 * n * (double)w->rows * (double)w->cols;
}

/* RMSNorm of n rows of dim floats: read, write, the weight vector. */
static void add_norm(cost_op *o, double n, double dim) {
    o->act_bytes += 4.0 * (2.0 * n * dim + dim);
    o->flops += 3.0 * n * dim;
}

/* Residual add of n rows of E floats: read both, write one. */
static void add_residual(cost_op *o, double n, double E) {
    o->act_bytes += 4.0 * 3.0 * n * E;
    o->flops += n * E;
}

/* Positions attended by rows p0..p1 of one sequence (tile union, and the
 * sum over rows for the FLOPs) on a layer with this window (0: none). */
static void attended(long p0, long p1, int window, double *tile_union, double *row_sum) {
    long lo = window > 0 ? p0 - window + 1 : 0;
    if (lo < 0) lo = 0;
    *tile_union = (double)(p1 - lo + 1);
    double s = 0;
    for (long p = p0; p <= p1; p++) s += window > 0 && p + 1 > window ? window : p + 1;
    *row_sum = s;
}

/* The experts a pass of n tokens reads, in expectation under uniform routing. */
static double experts_read(int n_expert, int used, double n) {
    if (n <= 1) return used;
    return n_expert * (1.0 - pow(1.0 - (double)used / n_expert, n));
}

static void add_moe(cost_op *o, const lm_model *m, const lm_layer *l, double n, double *all) {
    const lm_hparams *hp = &m->hp;
    const lm_moe *moe = l->moe;
    add_matmul(o, &moe->gate_inp, n);
    o->flops += 5.0 * n * hp->n_expert; /* softmax and top-k over the scores */
    /* shared expert (rows 0 without one) */
    add_matmul(o, &l->w_gate, n);
    add_matmul(o, &l->w_up, n);
    add_matmul(o, &l->w_down, n);
    if (l->w_gate.rows) o->flops += 4.0 * n * (double)l->w_gate.rows;
    double one = mat_bytes(&moe->gate[0]) + mat_bytes(&moe->up[0]) + mat_bytes(&moe->down[0]);
    *all += one * hp->n_expert;
    o->weight_bytes += one * experts_read(hp->n_expert, hp->n_expert_used, n);
    double k = hp->n_expert_used, E = hp->n_embd, F = (double)moe->gate[0].rows;
    o->act_bytes += 4.0 * n * k * (E + 2 * F) + 4.0 * n * k * (3 * F) + 4.0 * n * k * (F + E);
    o->flops += 2.0 * n * k * (3.0 * E * F) + 4.0 * n * k * F + 2.0 * n * k * E; /* products, activation, sum */
    if (moe->gate_inp_b) { /* gpt-oss: the router's bias, each product's bias, the clamps */
        double X = hp->n_expert;
        o->act_bytes += 4.0 * 2.0 * n * X + 4.0 * 2.0 * n * k * (2 * F + E);
        o->flops += n * X + n * k * (2 * F + E) + 2.0 * n * k * F;
    }
}

/* A latent attention layer (deepseek2, mla.h) up to wo's input, by the
 * phases' slots: q/k/v the query products (through the bottleneck and its
 * norm), the latent product and the absorbed queries (W_UK_hᵀ per head);
 * rope c's norm, RoPE on every q_pe and on k_pe, q_pe copied into the
 * absorbed query, one cache row of R + n_rot per token; attention one row
 * per position attended (the value is the row's latent), q̃·row over R +
 * n_rot and p·c over R per head; output the values' products W_UV_h. */
static void add_mla(cost_op *o, cost_pass *out, const lm_model *m, const lm_layer *l, int n_seq, int n_tok, int depth,
                    double rb) {
    const lm_hparams *hp = &m->hp;
    const lm_mla *a = l->mla;
    const double n = (double)n_seq * n_tok, S = n_seq, H = hp->n_head, R = hp->kv_lora_rank, r = hp->n_rot;
    cost_op *q = &o[LM_PROF_QKV];
    if (a->q_a.rows) {
        add_matmul(q, &a->q_a, n);
        add_norm(q, n, hp->q_lora_rank);
    }
    add_matmul(q, &a->q_b, n);
    add_matmul(q, &a->kv_a, n);
    for (int h = 0; h < hp->n_head; h++) add_matmul(q, &a->k_b[h], n);
    cost_op *ro = &o[LM_PROF_ROPE];
    add_norm(ro, n, R);
    ro->act_bytes += 4.0 * 2.0 * n * (H + 1) * r + 4.0 * 2.0 * n * H * r; /* rope read+write; q_pe copied */
    ro->flops += 3.0 * n * (H + 1) * r;
    double kv_w = n * rb;
    ro->kv_write_bytes += kv_w;
    out->kv_write_class[0] += kv_w;
    cost_op *at = &o[LM_PROF_ATTN];
    for (int i0 = 0; i0 < n_tok; i0 += ATTN_TILE_Q) {
        int i1 = i0 + ATTN_TILE_Q < n_tok ? i0 + ATTN_TILE_Q : n_tok;
        double tile, rows;
        attended(depth + i0, depth + i1 - 1, 0, &tile, &rows);
        double kv_r = S * tile * rb;
        at->kv_read_bytes += kv_r;
        out->kv_read_class[0] += kv_r;
        at->flops += S * rows * H * (2.0 * (R + r) + 2.0 * R);
    }
    at->act_bytes += 4.0 * n * H * (R + r) + 4.0 * n * H * R; /* absorbed queries in, latent outputs out */
    for (int h = 0; h < hp->n_head; h++) add_matmul(&o[LM_PROF_WO], &a->v_b[h], n);
}

/* A recurrent (gated DeltaNet) layer, gdn.h: its four input products, the
 * conv, gates, norms and delta rule, and each sequence's state read once
 * and written once per pass. */
static void add_gdn(cost_op *o, cost_pass *out, const lm_hparams *hp, const lm_gdn *g, double S, double n) {
    cost_op *a = &o[LM_PROF_RECUR];
    add_matmul(a, &g->qkv, n);
    add_matmul(a, &g->z, n);
    add_matmul(a, &g->beta, n);
    add_matmul(a, &g->alpha, n);
    double C = 2.0 * hp->ssm_hk * hp->ssm_dk + (double)hp->ssm_hv * hp->ssm_dv, V = (double)hp->ssm_hv * hp->ssm_dv;
    double state = S * 4.0 * ((hp->ssm_conv - 1) * C + V * hp->ssm_dk); /* conv window + (hv, dk, dv) matrices */
    a->act_bytes += 2.0 * state + 4.0 * n * (3.0 * C + 3.0 * V);
    out->state_bytes += 2.0 * state;
    /* conv taps; per value head the decay, S^T k, the delta, the rank-1 write and S^T q */
    a->flops += n * (2.0 * hp->ssm_conv * C + 8.0 * V * hp->ssm_dk);
}

int cost_forward(const lm_model *m, uint32_t kv_type, int n_seq, int n_tok, int depth, cost_pass *out, char *err,
                 size_t errlen) {
    const lm_hparams *hp = &m->hp;
    memset(out, 0, sizeof *out);
    if (n_seq < 1 || n_tok < 1 || depth < 0)
        return lm_err(err, errlen, "a pass of %d sequences of %d tokens at depth %d", n_seq, n_tok, depth);
    kv_config kc;
    kv_config_init(&kc, m->hp.n_layer - m->hp.n_rlayer, hp->n_head_kv, hp->head_dim);
    kc.type = kv_type;
    kc.latent_v = hp->kv_lora_rank;
    kc.n_ctx = depth + n_tok;
    kv_plan plan;
    if (kv_plan_make(&kc, &plan, err, errlen)) return -1;
    const double rb = (double)plan.row_bytes, n = (double)n_seq * n_tok, S = n_seq;
    const double E = hp->n_embd, hd = hp->head_dim, qd = (double)hp->n_head * hd, kvd = (double)hp->n_head_kv * hd;
    out->kv_row_bytes = plan.row_bytes;
    out->n_tokens = n_seq * n_tok;
    out->n_logits = n_seq;
    cost_op *o = out->op;

    o[LM_PROF_EMBED].weight_bytes = n * (double)m->tok_embd.row_bytes;
    o[LM_PROF_EMBED].act_bytes = 4.0 * n * E;
    if (hp->emb_scale != 1.0f) o[LM_PROF_EMBED].flops = n * E;

    for (int li = 0; li < hp->n_layer; li++) {
        const lm_layer *l = &m->layers[li];
        int cls = l->window > 0;
        add_norm(&o[LM_PROF_NORM], n, E);
        if (l->gdn) { /* no KV: the state, whatever the depth (its output product in the wo slot) */
            add_gdn(o, out, hp, l->gdn, S, n);
            goto attn_out;
        }
        out->n_layer_class[cls]++;
        if (l->mla) {
            add_mla(o, out, m, l, n_seq, n_tok, depth, rb);
            goto attn_out;
        }
        add_matmul(&o[LM_PROF_QKV], &l->wq, n);
        add_matmul(&o[LM_PROF_QKV], &l->wk, n);
        add_matmul(&o[LM_PROF_QKV], &l->wv, n);
        if (l->bq) o[LM_PROF_QKV].flops += n * (qd + 2 * kvd), o[LM_PROF_QKV].act_bytes += 4.0 * n * (qd + 2 * kvd);

        /* Q/K norms, RoPE on q and k in place, K and V rows into the cache */
        cost_op *r = &o[LM_PROF_ROPE];
        if (l->q_norm) add_norm(r, n * hp->n_head, hd);
        if (l->k_norm) add_norm(r, n * hp->n_head_kv, hd);
        r->act_bytes += 4.0 * 2.0 * n * (qd + kvd) + 4.0 * n * kvd; /* rope read+write; v read */
        r->flops += 3.0 * n * (double)(hp->n_head + hp->n_head_kv) * hp->n_rot;
        double kv_w = n * 2.0 * hp->n_head_kv * rb;
        r->kv_write_bytes += kv_w;
        out->kv_write_class[cls] += kv_w;

        /* attention: per sequence, per tile of ATTN_TILE_Q query rows */
        cost_op *a = &o[LM_PROF_ATTN];
        for (int i0 = 0; i0 < n_tok; i0 += ATTN_TILE_Q) {
            int i1 = i0 + ATTN_TILE_Q < n_tok ? i0 + ATTN_TILE_Q : n_tok;
            double tile, rows;
            attended(depth + i0, depth + i1 - 1, l->window, &tile, &rows);
            double kv_r = S * tile * 2.0 * hp->n_head_kv * rb;
            a->kv_read_bytes += kv_r;
            out->kv_read_class[cls] += kv_r;
            a->flops += S * rows * hp->n_head * 4.0 * hd;
        }
        a->act_bytes += 4.0 * 2.0 * n * qd;

    attn_out:;
        cost_op *wo = &o[LM_PROF_WO];
        add_matmul(wo, l->gdn ? &l->gdn->out : &l->wo, n);
        if (l->bo) wo->flops += n * E, wo->act_bytes += 4.0 * 2.0 * n * E; /* gpt-oss's output bias */
        if (l->post_attn_norm) add_norm(wo, n, E);
        add_residual(wo, n, E);

        add_norm(&o[LM_PROF_NORM], n, E);
        if (l->moe) {
            add_moe(&o[LM_PROF_FFN_UP], m, l, n, &out->expert_bytes_all);
        } else {
            add_matmul(&o[LM_PROF_FFN_UP], &l->w_gate, n);
            add_matmul(&o[LM_PROF_FFN_UP], &l->w_up, n);
            double F = (double)l->w_gate.rows;
            o[LM_PROF_FFN_ACT].act_bytes += 4.0 * 3.0 * n * F;
            o[LM_PROF_FFN_ACT].flops += 4.0 * n * F;
            add_matmul(&o[LM_PROF_FFN_DOWN], &l->w_down, n);
        }
        if (l->post_ffn_norm) add_norm(&o[LM_PROF_FFN_DOWN], n, E);
        add_residual(&o[LM_PROF_FFN_DOWN], n, E);
    }
    add_norm(&o[LM_PROF_NORM], S, E); /* the final norm, rows with logits only */
    add_matmul(&o[LM_PROF_LM_HEAD], &m->output, S);
    if (hp->final_softcap > 0) o[LM_PROF_LM_HEAD].flops += 3.0 * S * (double)m->output.rows;
    return 0;
}

cost_op cost_total(const cost_pass *c) {
    cost_op t = {0};
    for (int k = 0; k < LM_PROF_COUNT; k++) {
        t.weight_bytes += c->op[k].weight_bytes;
        t.kv_read_bytes += c->op[k].kv_read_bytes;
        t.kv_write_bytes += c->op[k].kv_write_bytes;
        t.act_bytes += c->op[k].act_bytes;
        t.flops += c->op[k].flops;
    }
    return t;
}
