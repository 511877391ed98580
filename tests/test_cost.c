/*
 * test_cost.c - the cost model (model/cost.h) against the byte formulas,
 * for the shapes of every architecture lamina loads (mkmodel's presets,
 * Gemma 3 270M's sliding-window layout) and every KV type: KV read per
 * decode step = 2 x layers x tokens x kv_heads x head_dim x bytes (tokens =
 * depth + 1, a sliding-window layer's capped at its window), split by layer
 * class; KV written = the same for one token; weight bytes = the stored
 * matrices (routed experts: only the top-k of n; F16, Q4_0 and MXFP4
 * weights), once per pass; FLOPs of
 * the products and of attention; deepseek2's latent attention (check_mla:
 * one cache row of kv_lora_rank + n_rot per token and layer, the latent
 * matrices); the output and expert FLOPs (gpt-oss's biases and clamps
 * included); the bundled model loaded from its file.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <time.h>

#include "kernels/kernels.h"
#include "kernels/scalar.h"
#include "model/cost.h"
#include "format/quant.h"
#include "base/util.h"
#include "test.h"

typedef struct {
    const char *name;
    lm_arch arch;
    int layers, embd, heads, kv_heads, head_dim, ff, vocab;
    int window, pattern; /* local layers: all but every pattern-th (pattern 0: all) */
    int experts, used, ff_exp, ff_shexp;
    bool qk_norm, post_norm, bias, tied;
} spec;

/* mkmodel's presets (tools/cmd_mkmodel.c) and Gemma 3 270M */
static const spec specs[] = {
    {"tinyllama-1.1b", LM_ARCH_LLAMA, 22, 2048, 32, 4, 64, 5632, 32000, 0, 0, 0, 0, 0, 0, false, false, false, false},
    {"small", LM_ARCH_LLAMA, 8, 512, 8, 4, 64, 1408, 32000, 0, 0, 0, 0, 0, 0, false, false, false, false},
    {"qwen2-small", LM_ARCH_QWEN2, 4, 256, 4, 2, 64, 512, 32000, 0, 0, 0, 0, 0, 0, false, false, true, false},
    {"gemma3-270m", LM_ARCH_GEMMA3, 18, 640, 4, 1, 256, 2048, 262144, 512, 6, 0, 0, 0, 0, true, true, false, true},
    {"qwen3-small", LM_ARCH_QWEN3, 4, 256, 4, 2, 128, 768, 32000, 0, 0, 0, 0, 0, 0, true, false, false, true},
    {"gemma2-small", LM_ARCH_GEMMA2, 4, 256, 4, 2, 128, 1024, 32000, 128, 2, 0, 0, 0, 0, false, true, false, true},
    {"phi3-small", LM_ARCH_PHI3, 4, 256, 4, 4, 64, 640, 32064, 2047, 0, 0, 0, 0, 0, false, false, false, false},
    {"qwen3moe-small", LM_ARCH_QWEN3MOE, 4, 256, 4, 2, 128, 768, 32000, 0, 0, 8, 2, 256, 0, true, false, false, false},
    {"qwen2moe-small", LM_ARCH_QWEN2MOE, 4, 256, 4, 4, 64, 512, 32000, 0, 0, 8, 4, 128, 512, false, false, true, false},
    {"mixtral-small", LM_ARCH_LLAMA, 4, 256, 8, 2, 32, 512, 32000, 0, 0, 8, 2, 512, 0, false, false, false, false},
    {"gpt-oss-small", LM_ARCH_GPT_OSS, 4, 256, 8, 2, 64, 256, 32000, 128, 2, 32, 4, 256, 0, false, false, true, false},
};
#define N_SPECS (int)(sizeof specs / sizeof specs[0])

static const uint32_t kv_types[] = {LM_TYPE_F32, LM_TYPE_F16, LM_TYPE_Q8_0};
static const double kv_elem_bytes[] = {4.0, 2.0, 34.0 / 32.0};

static float ones[1 << 12];

static lm_weight mk_w(uint32_t type, int64_t rows, int64_t cols) {
    lm_weight w = {.type = type, .rows = rows, .cols = cols, .row_bytes = quant_row_size(type, cols)};
    return w;
}

/* An lm_model of spec s's shape (weights without data: the cost model reads
 * shapes only); free with free_fake. */
static lm_model *fake_model(const spec *s, uint32_t wt) {
    lm_model *m = calloc(1, sizeof *m);
    lm_hparams *hp = &m->hp;
    hp->arch = s->arch;
    hp->n_layer = s->layers;
    hp->n_embd = s->embd;
    hp->n_head = s->heads;
    hp->n_head_kv = s->kv_heads;
    hp->head_dim = s->head_dim;
    hp->n_rot = s->head_dim;
    hp->n_ff = s->experts ? (s->ff_shexp ? s->ff_shexp : s->ff_exp) : s->ff;
    hp->n_vocab = s->vocab;
    hp->emb_scale = 1.0f;
    hp->n_expert = s->experts;
    hp->n_expert_used = s->used;
    hp->n_ff_exp = s->ff_exp;
    hp->swa_window = s->window;
    int E = s->embd, qd = s->heads * s->head_dim, kvd = s->kv_heads * s->head_dim;
    m->tok_embd = mk_w(wt, s->vocab, E);
    m->output = m->tok_embd;
    m->layers = calloc((size_t)s->layers, sizeof *m->layers);
    if (s->experts) m->moe = calloc((size_t)s->layers, sizeof *m->moe);
    for (int i = 0; i < s->layers; i++) {
        lm_layer *l = &m->layers[i];
        l->wq = mk_w(wt, qd, E);
        l->wk = mk_w(wt, kvd, E);
        l->wv = mk_w(wt, kvd, E);
        l->wo = mk_w(wt, E, qd);
        int ff = s->experts ? s->ff_shexp : s->ff;
        l->w_gate = mk_w(wt, ff, E);
        l->w_up = mk_w(wt, ff, E);
        l->w_down = mk_w(wt, E, ff);
        if (s->bias) l->bq = l->bk = l->bv = ones;
        if (s->arch == LM_ARCH_GPT_OSS) l->bo = ones; /* and the experts' biases below */
        if (s->qk_norm) l->q_norm = l->k_norm = ones;
        if (s->post_norm) l->post_attn_norm = l->post_ffn_norm = ones;
        bool local = s->window > 0 && (s->pattern == 0 || (i + 1) % s->pattern != 0);
        l->window = local ? s->window : 0;
        if (s->experts) {
            lm_moe *moe = &m->moe[i];
            moe->gate_inp = mk_w(LM_TYPE_F32, s->experts, E);
            moe->gate = calloc((size_t)s->experts, sizeof(lm_weight));
            moe->up = calloc((size_t)s->experts, sizeof(lm_weight));
            moe->down = calloc((size_t)s->experts, sizeof(lm_weight));
            for (int e = 0; e < s->experts; e++) {
                moe->gate[e] = mk_w(wt, s->ff_exp, E);
                moe->up[e] = mk_w(wt, s->ff_exp, E);
                moe->down[e] = mk_w(wt, E, s->ff_exp);
            }
            l->moe = moe;
            if (s->arch == LM_ARCH_GPT_OSS) moe->gate_inp_b = moe->gate_b = moe->up_b = moe->down_b = ones;
        }
    }
    return m;
}

static void free_fake(lm_model *m) {
    for (int i = 0; m->moe && i < m->hp.n_layer; i++) {
        free(m->moe[i].gate);
        free(m->moe[i].up);
        free(m->moe[i].down);
    }
    free(m->moe);
    free(m->layers);
    free(m);
}

static bool near(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(1.0, fabs(b)); }

/* Weight bytes one token reads by the formula: every stored matrix, with
 * experts the router, the shared expert and `used` experts, plus the LM head
 * and one embedding row. */
static double weight_formula(const spec *s, uint32_t wt, double experts_read) {
    double E = s->embd, qd = (double)s->heads * s->head_dim, kvd = (double)s->kv_heads * s->head_dim;
    double rE = (double)quant_row_size(wt, s->embd), rQ = (double)quant_row_size(wt, (int64_t)qd);
    double per_layer = (qd + 2 * kvd) * rE + E * rQ;
    if (s->experts) {
        double rX = (double)quant_row_size(wt, s->ff_exp);
        per_layer += (double)s->experts * quant_row_size(LM_TYPE_F32, s->embd);
        per_layer += experts_read * (2.0 * s->ff_exp * rE + E * rX);
        if (s->ff_shexp) per_layer += 2.0 * s->ff_shexp * rE + E * (double)quant_row_size(wt, s->ff_shexp);
    } else {
        per_layer += 2.0 * s->ff * rE + E * (double)quant_row_size(wt, s->ff);
    }
    return s->layers * per_layer + (double)s->vocab * rE + rE;
}

/* Positions a token at depth d attends on a layer of spec s. */
static double attends(const spec *s, int layer, int d) {
    bool local = s->window > 0 && (s->pattern == 0 || (layer + 1) % s->pattern != 0);
    return local && d + 1 > s->window ? s->window : d + 1;
}

static void check_spec(const spec *s) {
    static const int depths[] = {0, 100, 4096};
    static const uint32_t wts[] = {LM_TYPE_F16, LM_TYPE_Q4_0, LM_TYPE_MXFP4}; /* 2, 18/32, 17/32 bytes a weight */
    for (int ti = 0; ti < 3; ti++) {
        uint32_t wt = wts[ti];
        lm_model *m = fake_model(s, wt);
        for (int k = 0; k < 3; k++)
            for (int di = 0; di < 3; di++) {
                int d = depths[di];
                cost_pass c;
                char err[LM_ERRLEN];
                int rc = cost_forward(m, kv_types[k], 1, 1, d, &c, err, sizeof err);
                CHECKF(rc == 0, "%s: %s", s->name, err);
                cost_op t = cost_total(&c);
                double b = kv_elem_bytes[k], kvh = s->kv_heads, hd = s->head_dim;
                /* no window: 2 x layers x tokens x kv_heads x head_dim x bytes */
                double g_read = 0, l_read = 0;
                int n_local = 0;
                for (int i = 0; i < s->layers; i++) {
                    double r = 2.0 * attends(s, i, d) * kvh * hd * b;
                    bool local = s->window > 0 && (s->pattern == 0 || (i + 1) % s->pattern != 0);
                    if (local) l_read += r, n_local++;
                    else g_read += r;
                }
                if (!s->window) CHECK(near(g_read, 2.0 * s->layers * (d + 1) * kvh * hd * b));
                CHECKF(near(c.kv_read_class[0], g_read) && near(c.kv_read_class[1], l_read),
                       "%s kv %d depth %d: read %.0f+%.0f, formula %.0f+%.0f", s->name, k, d, c.kv_read_class[0],
                       c.kv_read_class[1], g_read, l_read);
                CHECK(near(t.kv_read_bytes, g_read + l_read));
                CHECK(c.n_layer_class[1] == n_local && c.n_layer_class[0] == s->layers - n_local);
                CHECK(near(t.kv_write_bytes, 2.0 * s->layers * kvh * hd * b));
                CHECK(c.kv_row_bytes == quant_row_size(kv_types[k], s->head_dim));
                double wf = weight_formula(s, wt, s->used);
                CHECKF(near(t.weight_bytes, wf), "%s: weights %.0f, formula %.0f", s->name, t.weight_bytes, wf);
                if (s->experts) CHECK(c.expert_bytes_all > 0 && near(c.op[LM_PROF_FFN_DOWN].weight_bytes, 0));
                /* FLOPs: q/k/v products, and attention's 4 x head_dim per position per head */
                double E = s->embd, qd = (double)s->heads * hd;
                CHECK(
                    near(c.op[LM_PROF_QKV].flops,
                         s->layers * 2.0 * E * (qd + 2 * kvh * hd) + (s->bias ? s->layers * (qd + 2 * kvh * hd) : 0)));
                double att = 0;
                for (int i = 0; i < s->layers; i++) att += 4.0 * hd * s->heads * attends(s, i, d);
                CHECK(near(c.op[LM_PROF_ATTN].flops, att));
                /* the output product, its bias (gpt-oss), the post norm and the residual add */
                double wo = 2.0 * E * qd + (s->arch == LM_ARCH_GPT_OSS ? E : 0) + (s->post_norm ? 3.0 * E : 0) + E;
                CHECKF(near(c.op[LM_PROF_WO].flops, s->layers * wo), "%s: output flops %.0f, formula %.0f", s->name,
                       c.op[LM_PROF_WO].flops, s->layers * wo);
                if (s->experts) { /* one token through the router, its bias, k experts, their biases and clamps */
                    double X = s->experts, K = s->used, F = s->ff_exp, sh = s->ff_shexp;
                    double moe = 2.0 * E * X + 5.0 * X + 2.0 * K * 3.0 * E * F + 4.0 * K * F + 2.0 * K * E;
                    if (sh) moe += 2.0 * 3.0 * E * sh + 4.0 * sh;
                    if (s->arch == LM_ARCH_GPT_OSS) moe += X + K * (2 * F + E) + 2.0 * K * F;
                    CHECKF(near(c.op[LM_PROF_FFN_UP].flops, s->layers * moe), "%s: expert flops %.0f, formula %.0f",
                           s->name, c.op[LM_PROF_FFN_UP].flops, s->layers * moe);
                }
                CHECK(near(c.op[LM_PROF_LM_HEAD].flops,
                           2.0 * E * s->vocab + (m->hp.final_softcap > 0 ? 3.0 * s->vocab : 0)));

                /* a decode batch of 4 sequences: weights once per pass (with
                 * experts, the ones some token chose), KV per sequence */
                CHECK(cost_forward(m, kv_types[k], 4, 1, d, &c, err, sizeof err) == 0);
                cost_op t4 = cost_total(&c);
                CHECK(near(t4.kv_read_bytes, 4 * (g_read + l_read)));
                CHECK(near(t4.kv_write_bytes, 4 * t.kv_write_bytes));
                double ex = s->experts ? s->experts * (1 - pow(1 - (double)s->used / s->experts, 4)) : 0;
                double rE = (double)quant_row_size(wt, s->embd);
                CHECK(near(t4.weight_bytes, weight_formula(s, wt, ex) + 3 * rE));
            }
        /* prefill of 64 tokens at depth 0: tiles of ATTN_TILE_Q rows read
         * the positions up to their last row */
        cost_pass c;
        CHECK(cost_forward(m, LM_TYPE_F16, 1, 64, 0, &c, NULL, 0) == 0);
        double expect = 0, flops = 0;
        for (int i = 0; i < s->layers; i++) {
            bool local = s->window > 0 && (s->pattern == 0 || (i + 1) % s->pattern != 0);
            for (int i0 = 0; i0 < 64; i0 += ATTN_TILE_Q) {
                int p1 = i0 + ATTN_TILE_Q - 1, lo = local ? i0 - s->window + 1 : 0;
                if (lo < 0) lo = 0;
                expect += 2.0 * (p1 - lo + 1) * s->kv_heads * s->head_dim * 2.0;
            }
            for (int p = 0; p < 64; p++) flops += 4.0 * s->head_dim * s->heads * attends(s, i, p);
        }
        CHECKF(near(c.op[LM_PROF_ATTN].kv_read_bytes, expect), "%s prefill: %.0f vs %.0f", s->name,
               c.op[LM_PROF_ATTN].kv_read_bytes, expect);
        CHECK(near(c.op[LM_PROF_ATTN].flops, flops));
        CHECK(c.n_tokens == 64 && c.n_logits == 1);
        free_fake(m);
    }
}

/* deepseek2's latent attention (mkmodel's deepseek2-lite and -small
 * presets): the cache holds one row of kv_lora_rank + n_rot per token and
 * layer, so a decode step at depth d reads layers x (d + 1) x (R + r) x
 * bytes and writes layers x (R + r) x bytes; the weights are the latent
 * matrices (q_a, q_b or attn_q, kv_a, every head's W_UKᵀ and W_UV), wo,
 * the leading dense FFN and on the other layers the router, the shared
 * experts and the chosen experts, plus the LM head and one embedding row;
 * FLOPs: the q/k/v slot's products, attention's 2 (R + r) + 2 R per head
 * and position. */
typedef struct {
    const char *name;
    int layers, dense, embd, heads, q_lora, R, rope, nope, vd, ff, experts, used, ff_exp, shared, vocab;
} mla_spec;

static const mla_spec mla_specs[] = {
    {"deepseek2-lite", 27, 1, 2048, 16, 0, 512, 64, 128, 128, 10944, 64, 6, 1408, 2, 102400},
    {"deepseek2-small", 4, 1, 256, 4, 96, 128, 32, 64, 64, 512, 8, 2, 128, 2, 32000},
};

static void check_mla(const mla_spec *s) {
    for (int ti = 0; ti < 2; ti++) {
        uint32_t wt = ti ? LM_TYPE_Q4_0 : LM_TYPE_F16;
        int E = s->embd, H = s->heads, qk = s->nope + s->rope, S = s->shared * s->ff_exp;
        lm_model *m = calloc(1, sizeof *m);
        lm_hparams *hp = &m->hp;
        hp->arch = LM_ARCH_DEEPSEEK2;
        hp->n_layer = s->layers;
        hp->n_embd = E;
        hp->n_head = H;
        hp->n_head_kv = 1;
        hp->head_dim = s->R + s->rope;
        hp->n_rot = s->rope;
        hp->kv_lora_rank = s->R;
        hp->q_lora_rank = s->q_lora;
        hp->qk_nope = s->nope;
        hp->v_head_dim = s->vd;
        hp->n_ff = s->ff;
        hp->n_vocab = s->vocab;
        hp->emb_scale = 1.0f;
        hp->n_expert = s->experts;
        hp->n_expert_used = s->used;
        hp->n_ff_exp = s->ff_exp;
        hp->n_ff_shexp = S;
        hp->n_layer_dense = s->dense;
        m->tok_embd = mk_w(wt, s->vocab, E);
        m->output = mk_w(wt, s->vocab, E);
        m->layers = calloc((size_t)s->layers, sizeof *m->layers);
        m->mla = calloc((size_t)s->layers, sizeof *m->mla);
        m->moe = calloc((size_t)s->layers, sizeof *m->moe);
        lm_weight *heads = calloc((size_t)s->layers * 2 * H, sizeof(lm_weight));
        lm_weight *ex = calloc((size_t)s->layers * 3 * s->experts, sizeof(lm_weight));
        for (int i = 0; i < s->layers; i++) {
            lm_layer *l = &m->layers[i];
            lm_mla *a = &m->mla[i];
            l->mla = a;
            if (s->q_lora) {
                a->q_a = mk_w(wt, s->q_lora, E);
                a->q_b = mk_w(wt, (int64_t)H * qk, s->q_lora);
            } else {
                a->q_b = mk_w(wt, (int64_t)H * qk, E);
            }
            a->kv_a = mk_w(wt, s->R + s->rope, E);
            a->k_b = heads + (size_t)i * 2 * H;
            a->v_b = a->k_b + H;
            for (int h = 0; h < H; h++) {
                a->k_b[h] = mk_w(wt, s->R, s->nope);
                a->v_b[h] = mk_w(wt, s->vd, s->R);
            }
            l->wo = mk_w(wt, E, (int64_t)H * s->vd);
            if (i < s->dense) {
                l->w_gate = mk_w(wt, s->ff, E);
                l->w_up = mk_w(wt, s->ff, E);
                l->w_down = mk_w(wt, E, s->ff);
                continue;
            }
            l->w_gate = mk_w(wt, S, E);
            l->w_up = mk_w(wt, S, E);
            l->w_down = mk_w(wt, E, S);
            lm_moe *moe = &m->moe[i];
            moe->gate_inp = mk_w(LM_TYPE_F32, s->experts, E);
            moe->gate = ex + (size_t)i * 3 * s->experts;
            moe->up = moe->gate + s->experts;
            moe->down = moe->up + s->experts;
            for (int e = 0; e < s->experts; e++) {
                moe->gate[e] = mk_w(wt, s->ff_exp, E);
                moe->up[e] = mk_w(wt, s->ff_exp, E);
                moe->down[e] = mk_w(wt, E, s->ff_exp);
            }
            l->moe = moe;
        }
        /* the formula's weights per decode token */
        double rE = (double)quant_row_size(wt, E), attn = 0;
        attn += s->q_lora ? s->q_lora * rE + (double)H * qk * quant_row_size(wt, s->q_lora) : (double)H * qk * rE;
        attn += (s->R + s->rope) * rE;
        attn += H * ((double)s->R * quant_row_size(wt, s->nope) + (double)s->vd * quant_row_size(wt, s->R));
        attn += E * (double)quant_row_size(wt, (int64_t)H * s->vd);
        double dense = 2.0 * s->ff * rE + E * (double)quant_row_size(wt, s->ff);
        double expert = 2.0 * s->ff_exp * rE + E * (double)quant_row_size(wt, s->ff_exp);
        double moe = (double)s->experts * E * 4 + 2.0 * S * rE + E * (double)quant_row_size(wt, S);
        double wf = s->layers * attn + s->dense * dense + (s->layers - s->dense) * (moe + s->used * expert) +
            (double)s->vocab * rE + rE;
        for (int k = 0; k < 3; k++)
            for (int d = 0; d <= 4096; d += 2048) {
                cost_pass c;
                char err[LM_ERRLEN];
                CHECKF(cost_forward(m, kv_types[k], 1, 1, d, &c, err, sizeof err) == 0, "%s: %s", s->name, err);
                cost_op t = cost_total(&c);
                double b = kv_elem_bytes[k], row = s->R + s->rope;
                CHECKF(near(t.kv_read_bytes, s->layers * (d + 1.0) * row * b) &&
                           near(c.kv_read_class[0], t.kv_read_bytes) && c.kv_read_class[1] == 0,
                       "%s kv %d depth %d: read %.0f, formula %.0f", s->name, k, d, t.kv_read_bytes,
                       s->layers * (d + 1.0) * row * b);
                CHECK(near(t.kv_write_bytes, s->layers * row * b));
                CHECK(c.kv_row_bytes == quant_row_size(kv_types[k], s->R + s->rope));
                CHECKF(near(t.weight_bytes, wf), "%s: weights %.0f, formula %.0f", s->name, t.weight_bytes, wf);
                /* (the bottleneck's RMSNorm: 3 per element) */
                double qf =
                    s->q_lora ? 2.0 * E * s->q_lora + 3.0 * s->q_lora + 2.0 * s->q_lora * H * qk : 2.0 * E * H * qk;
                qf += 2.0 * E * row + 2.0 * H * s->R * s->nope;
                CHECK(near(c.op[LM_PROF_QKV].flops, s->layers * qf));
                CHECK(near(c.op[LM_PROF_ATTN].flops, s->layers * H * (d + 1.0) * (2.0 * row + 2.0 * s->R)));
                /* a batch of 4: KV per sequence, the latent matrices once */
                CHECK(cost_forward(m, kv_types[k], 4, 1, d, &c, err, sizeof err) == 0);
                CHECK(near(cost_total(&c).kv_read_bytes, 4 * t.kv_read_bytes));
            }
        free(heads);
        free(ex);
        free(m->mla);
        free(m->moe);
        free(m->layers);
        free(m);
    }
}

static int cur;
static void test_spec(void) { check_spec(&specs[cur]); }
static void test_mla(void) { check_mla(&mla_specs[cur]); }

static void test_bad_args(void) {
    lm_model *m = fake_model(&specs[1], LM_TYPE_F16);
    cost_pass c;
    char err[LM_ERRLEN] = "";
    CHECK(cost_forward(m, LM_TYPE_F16, 0, 1, 0, &c, err, sizeof err) == -1 && err[0]);
    CHECK(cost_forward(m, LM_TYPE_F16, 1, 1, -1, &c, err, sizeof err) == -1);
    err[0] = 0;
    CHECK(cost_forward(m, LM_TYPE_Q4_K, 1, 1, 0, &c, err, sizeof err) == -1 && err[0]);
    free_fake(m);
    /* Q8_0 KV needs head_dim a multiple of 32 */
    spec odd = specs[1];
    odd.head_dim = 48;
    m = fake_model(&odd, LM_TYPE_F16);
    CHECK(cost_forward(m, LM_TYPE_Q8_0, 1, 1, 0, &c, NULL, 0) == -1);
    free_fake(m);
}

/* The bundled model, loaded: the layers' weight bytes are model.c's own
 * figure (model_layer_bytes_per_token), plus the head and one embedding row. */
static void test_loaded_model(void) {
    char err[LM_ERRLEN];
    lm_model *m = model_load(TEST_MODEL, err, sizeof err);
    CHECKF(m, "%s", err);
    cost_pass c;
    CHECK(cost_forward(m, LM_TYPE_F32, 1, 1, 7, &c, err, sizeof err) == 0);
    cost_op t = cost_total(&c);
    double expect = (double)model_layer_bytes_per_token(m, NULL) + (double)m->output.rows * m->output.row_bytes +
        (double)m->tok_embd.row_bytes;
    CHECK(near(t.weight_bytes, expect));
    CHECK(near(t.kv_read_bytes, 2.0 * m->hp.n_layer * 8 * m->hp.n_head_kv * m->hp.head_dim * 4.0));
    CHECK(near(t.kv_read_bytes, 8.0 * (double)model_kv_bytes_per_token(m, 4)));
    model_free(m);
}

/* Dispatch timing: workers that sleep while the caller returns at once
 * leave the caller waiting at the barrier at least that long per run;
 * with timing off nothing is counted. */
static void sleepy(void *arg, int ith, int nth) {
    (void)arg;
    (void)nth;
    if (ith > 0) nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
}

static void test_pool_timing(void) {
    lm_pool *p = pool_new(2);
    CHECK(p);
    pool_timing t;
    pool_run(p, sleepy, NULL);
    pool_timing_get(p, &t);
    CHECK(t.runs == 0 && t.wait_s == 0 && t.wake_s == 0);
    pool_timing_enable(p, 1);
    for (int i = 0; i < 3; i++) pool_run(p, sleepy, NULL);
    pool_timing_enable(p, 0);
    pool_timing_get(p, &t);
    CHECKF(t.runs == 3 && t.wait_s >= 3 * 0.019 && t.wake_s >= 0, "runs %ld wait %.4f", t.runs, t.wait_s);
    pool_run(p, sleepy, NULL);
    pool_timing t2;
    pool_timing_get(p, &t2);
    CHECK(t2.runs == 3 && t2.wait_s == t.wait_s);
    pool_timing_reset(p);
    pool_timing_get(p, &t);
    CHECK(t.runs == 0 && t.wait_s == 0 && t.sleeps == 0);
    /* a worker idle for 300 ms has spun out (its 4096 rounds take well
     * under a millisecond on a free core; on a loaded one each 64th
     * round's yield may give a time slice away) and sleeps: a run after
     * such a pause meets it asleep */
    pool_timing_enable(p, 1);
    for (int i = 0; i < 2; i++) {
        nanosleep(&(struct timespec){0, 300 * 1000 * 1000}, NULL);
        pool_run(p, sleepy, NULL);
    }
    pool_timing_enable(p, 0);
    pool_timing_get(p, &t);
    CHECKF(t.runs == 2 && t.sleeps >= 1 && t.sleeps <= 2, "runs %ld, %ld met the worker asleep", t.runs, t.sleeps);
    pool_free(p);
    pool_timing_get(NULL, &t);
    CHECK(t.runs == 0);
}

/* The FMA probe of each ISA this CPU runs: flops per round, and the same
 * chains as a float64 reference (x = x * a + b, 8 or 12 of them, summed as
 * the probe returns them: lanes 0 and 7 of the vector sum) within float
 * rounding. */
static void test_fma_probe(void) {
    for (int isa = 0; isa < LM_ISA_COUNT; isa++) {
        if (kernels_use(isa)) continue;
        const lm_peak_kernel *pk = &kernels()->peak;
        CHECK(pk->run && pk->flops_per_round > 0);
        long rounds = 1000;
        float got = pk->run(rounds);
        /* the scalar probe (every table without one of its own: scalar,
         * the Arm variants) sums 8 chains; the AVX2 one lanes 0 and 7 of 12 */
        const bool scalar = pk->run == scalar_fma_probe;
        int chains = scalar ? 8 : 12;
        double ref = 0;
        for (int c = 0; c < chains; c++) {
            double x = 0.1 * c;
            for (long r = 0; r < rounds; r++) x = x * (double)0.999999f + (double)1e-7f;
            ref += x;
        }
        if (!scalar) ref *= 2; /* lanes 0 and 7 of the sum */
        CHECKF(fabs(got - ref) <= 1e-3 * fabs(ref), "isa %d: %g against %g", isa, got, ref);
    }
    kernels_use(-1);
}

int main(void) {
    for (cur = 0; cur < N_SPECS; cur++) {
        printf("%s\n", specs[cur].name);
        TEST_RUN(test_spec);
    }
    for (cur = 0; cur < (int)(sizeof mla_specs / sizeof mla_specs[0]); cur++) {
        printf("%s\n", mla_specs[cur].name);
        TEST_RUN(test_mla);
    }
    TEST_RUN(test_bad_args);
    TEST_RUN(test_loaded_model);
    TEST_RUN(test_pool_timing);
    TEST_RUN(test_fma_probe);
    return TEST_DONE();
}
