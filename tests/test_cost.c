/*
 * test_cost.c - the cost model (model/cost.h) against the byte formulas,
 * for the shapes of every architecture lamina loads (mkmodel's presets,
 * Gemma 3 270M's sliding-window layout) and every KV type: KV read per
 * decode step = 2 x layers x tokens x kv_heads x head_dim x bytes (tokens =
 * depth + 1, a sliding-window layer's capped at its window), split by layer
 * class; KV written = the same for one token; weight bytes = the stored
 * matrices (routed experts: only the top-k of n), once per pass; FLOPs of
 * the products and of attention; the bundled model loaded from its file.
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
    int window, pattern;    /* local layers: all but every pattern-th (pattern 0: all) */
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
    for (int ti = 0; ti < 2; ti++) {
        uint32_t wt = ti ? LM_TYPE_Q4_0 : LM_TYPE_F16;
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
                CHECK(near(c.op[LM_PROF_QKV].flops, s->layers * 2.0 * E * (qd + 2 * kvh * hd) +
                                                        (s->bias ? s->layers * (qd + 2 * kvh * hd) : 0)));
                double att = 0;
                for (int i = 0; i < s->layers; i++) att += 4.0 * hd * s->heads * attends(s, i, d);
                CHECK(near(c.op[LM_PROF_ATTN].flops, att));
                CHECK(near(c.op[LM_PROF_LM_HEAD].flops, 2.0 * E * s->vocab + (m->hp.final_softcap > 0 ? 3.0 * s->vocab : 0)));

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

static int cur;
static void test_spec(void) { check_spec(&specs[cur]); }

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
    CHECK(t.runs == 0 && t.wait_s == 0);
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
    TEST_RUN(test_bad_args);
    TEST_RUN(test_loaded_model);
    TEST_RUN(test_pool_timing);
    TEST_RUN(test_fma_probe);
    return TEST_DONE();
}
