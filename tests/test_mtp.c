/*
 * test_mtp.c - the next-token-prediction head (model/mtp.h) against a
 * float64 reference, and the loading of qwen35 files that carry one.
 *
 * The files are `lamina mkmodel --preset qwen35-small --mtp 1` (and
 * qwen35moe-small) with fewer layers and a small vocabulary, F32 weights,
 * written by the binary in LAMINA_BIN (default build/lamina). The reference
 * below is written from llama.cpp's qwen35 MTP graph (concatenation
 * [enorm(embedding) ; hnorm(h)], eh_proj, a gated full-attention layer at
 * the token's position with RoPE on qwen35's sections, the FFN or experts,
 * head norm, LM head) in double over the dequantized weights. Bounds: the
 * logits' relative L2 error 1e-5 (F32 weights: only float rounding), and
 * the greedy draft equal to the reference's argmax wherever the
 * reference's top-2 margin exceeds 1e-3.
 *
 * llama.cpp's own MTP drafts on an F16 file are recorded in
 * tests/data/qwen35/mtp_drafts.txt (test_llama_drafts states its bounds).
 *
 * Covered: a catch-up run of rows with given hidden states, then a chain
 * of drafts each fed the head's own h' and argmax (as the proposer runs
 * it); rewriting positions after a rejected draft gives a fresh head's
 * bits; the trunk of a file with the layer equals the file without it (bit
 * for bit, n_layer excludes the MTP block); refusals: a file without the
 * layer, positions past the cache, tokens out of range; the engine's
 * configuration with LM_SPEC_MTP (refused without the layer).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/forward.h"
#include "model/model.h"
#include "model/mtp.h"
#include "model/ops.h"
#include "sched/engine.h"
#include "sched/engine_int.h"
#include "sched/proposer.h"
#include "base/pool.h"
#include "base/util.h"
#include "test.h"

#define VOCAB 1000
#define NROW 12 /* positions run: NCATCH catch-up rows, then drafts */
#define NCATCH 7

static char path_dense[128], path_moe[128], path_plain[128];

static int mkmodel(const char *preset, int mtp, const char *out) {
    const char *bin = getenv("LAMINA_BIN") ? getenv("LAMINA_BIN") : "build/lamina";
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "%s mkmodel --preset %s --layers 4 --vocab %d --type F32 --seed 5 --mtp %d -t 2 -o %s 2>/dev/null", bin,
             preset, VOCAB, mtp, out);
    return system(cmd);
}

/* ---- the float64 reference ---------------------------------------------- */

static double *mat(const lm_weight *w) {
    double *d = malloc((size_t)w->rows * (size_t)w->cols * sizeof *d);
    float *row = malloc((size_t)w->cols * sizeof *row);
    for (int64_t r = 0; r < w->rows; r++) {
        ops_get_row(w, r, row);
        for (int64_t c = 0; c < w->cols; c++) d[r * w->cols + c] = row[c];
    }
    free(row);
    return d;
}

static void mv(double *y, const double *w, const double *x, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++) s += w[(size_t)r * cols + c] * x[c];
        y[r] = s;
    }
}

static void rms(double *y, const double *x, const float *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * s * w[i];
}

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }
static double silu(double x) { return x * sigm(x); }

/* NEOX RoPE on the first n_rot dims, pairs (i, i + n_rot/2); pairs outside
 * qwen35's text sections keep angle 0. */
static void rope(double *x, const lm_hparams *hp, int pos) {
    const int half = hp->n_rot / 2, *sec = hp->rope_sections;
    int n_sect = sec[0] + sec[1] + sec[2] + sec[3];
    for (int i = 0; i < half; i++) {
        int s = i % n_sect;
        bool text = (s % 3 == 0 && s < 3 * sec[0]) || (s % 3 == 1 && s < 3 * sec[1]) || (s % 3 == 2 && s < 3 * sec[2]);
        double a = text ? pos * hp->rope_scale * pow(hp->rope_base, -2.0 * i / hp->n_rot) : 0.0;
        double x0 = x[i], x1 = x[i + half];
        x[i] = x0 * cos(a) - x1 * sin(a);
        x[i + half] = x0 * sin(a) + x1 * cos(a);
    }
}

typedef struct {
    const lm_model *m;
    double *eh, *wq, *wk, *wv, *wo, *wg, *wu, *wd, *head, *emb;
    double *router, *eg, *eu, *ed; /* experts: (X, FE, E) x2, (X, E, FE) */
    double *kc, *vc;               /* (NROW, kv_dim) */
} ref;

static void ref_init(ref *R, const lm_model *m) {
    memset(R, 0, sizeof *R);
    R->m = m;
    const lm_mtp *t = m->mtp;
    const lm_layer *l = &t->layer;
    R->eh = mat(&t->eh_proj), R->wq = mat(&l->wq), R->wk = mat(&l->wk), R->wv = mat(&l->wv), R->wo = mat(&l->wo);
    R->head = mat(t->head), R->emb = mat(t->embed);
    if (l->w_gate.rows) R->wg = mat(&l->w_gate), R->wu = mat(&l->w_up), R->wd = mat(&l->w_down);
    if (l->moe) {
        const lm_hparams *hp = &m->hp;
        int X = hp->n_expert;
        size_t ge = (size_t)hp->n_ff_exp * hp->n_embd;
        R->router = mat(&l->moe->gate_inp);
        R->eg = malloc(X * ge * sizeof(double)), R->eu = malloc(X * ge * sizeof(double));
        R->ed = malloc(X * ge * sizeof(double));
        for (int e = 0; e < X; e++) {
            double *g = mat(&l->moe->gate[e]), *u = mat(&l->moe->up[e]), *d = mat(&l->moe->down[e]);
            memcpy(R->eg + e * ge, g, ge * sizeof(double));
            memcpy(R->eu + e * ge, u, ge * sizeof(double));
            memcpy(R->ed + e * ge, d, ge * sizeof(double));
            free(g), free(u), free(d);
        }
    }
    size_t kvd = (size_t)m->hp.n_head_kv * m->hp.head_dim;
    R->kc = calloc(NROW * kvd, sizeof(double));
    R->vc = calloc(NROW * kvd, sizeof(double));
}

static void ref_free(ref *R) {
    double *p[] = {R->eh,   R->wq,  R->wk,     R->wv, R->wo, R->wg, R->wu, R->wd,
                   R->head, R->emb, R->router, R->eg, R->eu, R->ed, R->kc, R->vc};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
}

/* A SwiGLU FFN of width F on xn, added into out. */
static void ffn(const double *wg, const double *wu, const double *wd, int F, int E, const double *xn, double scale,
                double *out) {
    double *g = malloc(F * sizeof *g), *u = malloc(F * sizeof *u), *y = malloc(E * sizeof *y);
    mv(g, wg, xn, F, E);
    mv(u, wu, xn, F, E);
    for (int i = 0; i < F; i++) g[i] = silu(g[i]) * u[i];
    mv(y, wd, g, E, F);
    for (int i = 0; i < E; i++) out[i] += scale * y[i];
    free(g), free(u), free(y);
}

/* One row of the head: logits (n_vocab) and h' (n_embd). */
static void ref_row(ref *R, const float *h, int tok, int pos, double *logits, double *hout) {
    const lm_model *m = R->m;
    const lm_hparams *hp = &m->hp;
    const lm_mtp *t = m->mtp;
    const lm_layer *l = &t->layer;
    const int E = hp->n_embd, hd = hp->head_dim, H = hp->n_head, Hkv = hp->n_head_kv;
    const int qd = H * hd, kvd = Hkv * hd;
    double *cat = calloc(2 * E, sizeof *cat), *tmp = calloc(2 * E, sizeof *tmp), *x = calloc(E, sizeof *x);
    double *xn = calloc(E, sizeof *xn), *qg = calloc(2 * qd, sizeof *qg), *att = calloc(qd, sizeof *att);
    double *y = calloc(E, sizeof *y), *sc = calloc(pos + 1, sizeof *sc);
    for (int i = 0; i < E; i++) tmp[i] = R->emb[(size_t)tok * E + i], tmp[E + i] = h[i];
    rms(cat, tmp, t->enorm, E, hp->norm_eps);
    rms(cat + E, tmp + E, t->hnorm, E, hp->norm_eps);
    mv(x, R->eh, cat, E, 2 * E);
    rms(xn, x, l->attn_norm, E, hp->norm_eps);
    mv(qg, R->wq, xn, 2 * qd, E);
    double *k = R->kc + (size_t)pos * kvd, *v = R->vc + (size_t)pos * kvd;
    mv(k, R->wk, xn, kvd, E);
    mv(v, R->wv, xn, kvd, E);
    for (int g = 0; g < Hkv; g++) {
        rms(k + g * hd, k + g * hd, l->k_norm, hd, hp->norm_eps);
        rope(k + g * hd, hp, pos);
    }
    for (int hh = 0; hh < H; hh++) {
        double q[512];
        rms(q, qg + (size_t)hh * 2 * hd, l->q_norm, hd, hp->norm_eps);
        rope(q, hp, pos);
        int g = hh / (H / Hkv);
        double mx = -1e300, sum = 0;
        for (int j = 0; j <= pos; j++) {
            double s = 0;
            for (int d = 0; d < hd; d++) s += q[d] * R->kc[(size_t)j * kvd + g * hd + d];
            sc[j] = s / sqrt((double)hd);
            if (sc[j] > mx) mx = sc[j];
        }
        for (int j = 0; j <= pos; j++) sum += sc[j] = exp(sc[j] - mx);
        for (int d = 0; d < hd; d++) {
            double o = 0;
            for (int j = 0; j <= pos; j++) o += sc[j] / sum * R->vc[(size_t)j * kvd + g * hd + d];
            att[hh * hd + d] = o * sigm(qg[(size_t)hh * 2 * hd + hd + d]);
        }
    }
    mv(y, R->wo, att, E, qd);
    for (int i = 0; i < E; i++) x[i] += y[i];
    rms(xn, x, l->ffn_norm, E, hp->norm_eps);
    if (l->moe) { /* softmax router, top-k renormalised, the shared expert behind its sigmoid gate */
        int X = hp->n_expert, K = hp->n_expert_used, FE = hp->n_ff_exp;
        double p[64], mx = -1e300, sum = 0, wsum = 0;
        bool used[64] = {0};
        mv(p, R->router, xn, X, E);
        for (int e = 0; e < X; e++) mx = p[e] > mx ? p[e] : mx;
        for (int e = 0; e < X; e++) sum += p[e] = exp(p[e] - mx);
        for (int e = 0; e < X; e++) p[e] /= sum;
        int pick[64];
        for (int k2 = 0; k2 < K; k2++) {
            int b = -1;
            for (int e = 0; e < X; e++)
                if (!used[e] && (b < 0 || p[e] > p[b])) b = e;
            used[b] = true, pick[k2] = b, wsum += p[b];
        }
        for (int e = 0; e < X; e++) /* ascending expert order */
            for (int k2 = 0; k2 < K; k2++)
                if (pick[k2] == e) {
                    size_t ge = (size_t)FE * E;
                    ffn(R->eg + e * ge, R->eu + e * ge, R->ed + e * ge, FE, E, xn, hp->moe_norm_w ? p[e] / wsum : p[e],
                        x);
                }
        if (hp->n_ff_shexp) {
            double gs = 0;
            for (int i = 0; i < E; i++) gs += l->moe->shexp_gate[i] * xn[i];
            ffn(R->wg, R->wu, R->wd, hp->n_ff_shexp, E, xn, sigm(gs), x);
        }
    } else {
        ffn(R->wg, R->wu, R->wd, hp->n_ff, E, xn, 1.0, x);
    }
    rms(hout, x, t->head_norm, E, hp->norm_eps);
    mv(logits, R->head, hout, hp->n_vocab, E);
    free(cat), free(tmp), free(x), free(xn), free(qg), free(att), free(y), free(sc);
}

static int ref_argmax(const double *l, int n, double *margin) {
    int b = 0, s = -1;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    for (int i = 0; i < n; i++)
        if (i != b && (s < 0 || l[i] > l[s])) s = i;
    *margin = l[b] - l[s];
    return b;
}

/* ---- the cases ------------------------------------------------------------ */

static float gauss(lm_rng *r) { return lm_rng_normal(r); }

/* Catch-up rows with random hidden states, then a chain of drafts: each row
 * fed the head's own h' and argmax. Logits and drafts against the reference. */
static void check_head(const char *path) {
    char err[LM_ERRLEN];
    lm_model *m = model_load(path, err, sizeof err);
    CHECKF(m, "%s", err);
    CHECK(m->hp.n_layer == 4 && m->hp.n_layer_mtp == 1 && m->mtp);
    lm_pool *pool = pool_new(2);
    lm_status st;
    mtp_head *c = mtp_new(m, pool, NROW, &st, err, sizeof err);
    CHECKF(c && st == LM_OK, "%s", err);
    ref R;
    ref_init(&R, m);
    const int E = m->hp.n_embd, V = m->hp.n_vocab;
    float *h = malloc((size_t)E * sizeof *h), *hout = malloc((size_t)E * sizeof *hout);
    float *lg = malloc((size_t)V * sizeof *lg);
    double *rl = malloc((size_t)V * sizeof *rl), *rh = malloc((size_t)E * sizeof *rh);
    lm_rng rng;
    lm_rng_seed(&rng, 11);
    int tok = 17, decided = 0;
    double worst = 0;
    bool ok = true;
    for (int pos = 0; pos < NROW && ok; pos++) {
        if (pos < NCATCH) { /* catch-up: a given state and token */
            for (int i = 0; i < E; i++) h[i] = gauss(&rng);
            tok = (int)(lm_rng_u64(&rng) % VOCAB);
        } /* else: the previous row's h' and draft (set below) */
        ok = mtp_run(c, h, (int32_t[]){tok}, 1, pos, lg, hout, err, sizeof err) == 0;
        ref_row(&R, h, tok, pos, rl, rh);
        double e = test_rel_l2(lg, rl, (size_t)V), eh = test_rel_l2(hout, rh, (size_t)E), margin;
        worst = fmax(worst, fmax(e, eh));
        int want = ref_argmax(rl, V, &margin), got = mtp_argmax(lg, V);
        if (margin > 1e-3) {
            decided++;
            if (got != want) {
                fprintf(stderr, "  pos %d: draft %d, reference %d (margin %g)\n", pos, got, want, margin);
                ok = false;
            }
        }
        memcpy(h, hout, (size_t)E * sizeof *h);
        tok = got;
    }
    fprintf(stderr, "  %s: worst rel L2 %.2e, %d of %d drafts decided by margin > 1e-3\n", path, worst, decided, NROW);
    CHECKF(ok, "%s", err);
    CHECK(worst < 1e-5);
    CHECK(decided >= NROW / 2);
    ref_free(&R);
    free(h), free(hout), free(lg), free(rl), free(rh);
    mtp_free(c);
    pool_free(pool);
    model_free(m);
}

static void test_head_dense(void) { check_head(path_dense); }
static void test_head_moe(void) { check_head(path_moe); }

/* A rejected draft's positions written again give a fresh head's bits; a
 * multi-row run equals the same rows one by one. */
static void test_rewrite(void) {
    char err[LM_ERRLEN];
    lm_model *m = model_load(path_dense, err, sizeof err);
    CHECKF(m, "%s", err);
    lm_pool *pool = pool_new(2);
    mtp_head *a = mtp_new(m, pool, 16, NULL, err, sizeof err), *b = mtp_new(m, pool, 16, NULL, err, sizeof err);
    CHECK(a && b);
    const int E = m->hp.n_embd, V = m->hp.n_vocab, n = 6;
    float *h = malloc((size_t)n * E * sizeof *h), *la = malloc((size_t)V * sizeof *la);
    float *lb = malloc((size_t)V * sizeof *lb);
    lm_rng rng;
    lm_rng_seed(&rng, 3);
    for (int i = 0; i < n * E; i++) h[i] = gauss(&rng);
    int32_t toks[6] = {5, 99, 3, 700, 42, 8}, wrong[3] = {1, 2, 3};
    CHECK(!mtp_run(a, h, toks, 3, 0, NULL, NULL, err, sizeof err));
    CHECK(!mtp_run(a, h, wrong, 3, 3, la, NULL, err, sizeof err)); /* a rejected chain at 3..5 */
    CHECK(!mtp_run(a, h + 3 * E, toks + 3, 3, 3, la, NULL, err, sizeof err));
    for (int r = 0; r < n; r++) CHECK(!mtp_run(b, h + (size_t)r * E, toks + r, 1, r, lb, NULL, err, sizeof err));
    CHECK(memcmp(la, lb, (size_t)V * sizeof *la) == 0);
    /* refusals */
    CHECK(mtp_run(a, h, toks, 2, 15, la, NULL, err, sizeof err) == -1 && strstr(err, "passes its cache"));
    int32_t bad = VOCAB;
    CHECK(mtp_run(a, h, &bad, 1, 0, la, NULL, err, sizeof err) == -1 && strstr(err, "out of range"));
    free(h), free(la), free(lb);
    mtp_free(a), mtp_free(b);
    pool_free(pool);
    model_free(m);
}

/* The trunk ignores the MTP block: same n_layer and the same logits as the
 * file written without it; that file refuses a head by name. */
static void test_trunk_and_refusal(void) {
    char err[LM_ERRLEN];
    lm_model *a = model_load(path_dense, err, sizeof err), *b = model_load(path_plain, err, sizeof err);
    CHECKF(a && b, "%s", err);
    CHECK(b->hp.n_layer_mtp == 0 && !b->mtp && a->hp.n_layer == b->hp.n_layer);
    lm_pool *pool = pool_new(2);
    lm_status st;
    mtp_head *c = mtp_new(b, pool, 8, &st, err, sizeof err);
    CHECK(!c && st == LM_ERR_UNSUPPORTED && strstr(err, "nextn_predict_layers"));
    lm_seqrun *ra = seqrun_new(a, pool, 64, 0, LM_KV_F32, err, sizeof err),
              *rb = seqrun_new(b, pool, 64, 0, LM_KV_F32, err, sizeof err);
    CHECKF(ra && rb, "%s", err);
    const int V = a->hp.n_vocab;
    float *la = malloc((size_t)V * sizeof *la), *lb = malloc((size_t)V * sizeof *lb);
    int32_t toks[5] = {1, 2, 3, 4, 5};
    CHECK(!seqrun_forward(ra, toks, 5, la, false, err, sizeof err));
    CHECK(!seqrun_forward(rb, toks, 5, lb, false, err, sizeof err));
    CHECK(memcmp(la, lb, (size_t)V * sizeof *la) == 0);
    free(la), free(lb);
    seqrun_free(ra), seqrun_free(rb);
    pool_free(pool);
    model_free(a), model_free(b);
}

/* llama.cpp's MTP drafts on the same file (tests/data/qwen35/mtp_drafts.txt):
 * the trunk over the recorded tokens gives every position's state, then for
 * each L the head catches up and chains 3 drafts. A draft must be
 * llama.cpp's where llama.cpp's top-2 margin exceeds 0.02 (below, F16
 * rounding may pick the other token, and the rest of that chain is not
 * compared), and its logit within 0.02 of llama.cpp's. */
/* llama.cpp's recorded drafts: tokens (n_tok), and per L from L0 (nL of
 * them) 3 drafts with logits and margins. 0, or -1. */
typedef struct {
    int32_t toks[128];
    int n_tok, L0, nL, dt[64][3];
    float dl[64][3], dm[64][3];
} drafts_facts;

static int read_facts(drafts_facts *F) {
    char line[4096];
    FILE *f = fopen("tests/data/qwen35/mtp_drafts.txt", "r");
    if (!f) return -1;
    F->n_tok = 0, F->L0 = -1, F->nL = 0;
    while (fgets(line, sizeof line, f)) {
        char *p;
        if (!strncmp(line, "tokens:", 7))
            for (p = line + 7; F->n_tok < 128;) {
                char *end;
                long v = strtol(p, &end, 10);
                if (end == p) break;
                F->toks[F->n_tok++] = (int32_t)v, p = end;
            }
        int L, off;
        if (sscanf(line, "L %d drafts:%n", &L, &off) == 1 && F->nL < 64) {
            if (F->L0 < 0) F->L0 = L;
            if (L != F->L0 + F->nL) break;
            p = line + off;
            for (int j = 0; j < 3; j++) {
                int used;
                if (sscanf(p, " %d(%f,m%f)%n", &F->dt[F->nL][j], &F->dl[F->nL][j], &F->dm[F->nL][j], &used) != 3) {
                    fclose(f);
                    return -1;
                }
                p += used;
            }
            F->nL++;
        }
    }
    fclose(f);
    return F->n_tok > F->L0 + F->nL && F->L0 > 0 && F->nL >= 16 ? 0 : -1;
}

static int mk_f16(char *path, size_t n) {
    const char *bin = getenv("LAMINA_BIN") ? getenv("LAMINA_BIN") : "build/lamina";
    char cmd[512];
    snprintf(path, n, "/tmp/lamina_test_mtp_f_%d.gguf", (int)getpid());
    snprintf(cmd, sizeof cmd,
             "%s mkmodel --preset qwen35-small --type F16 --mtp 1 --vocab-from "
             "tests/data/vocab/ggml-vocab-gpt-2.gguf -t 2 -o %s 2>/dev/null",
             bin, path);
    return system(cmd);
}

/* The proposer (sched/proposer.h, LM_SPEC_MTP) run as the engine runs it:
 * the model's states handed over segment by segment (the prompt, then one
 * or two tokens at a time), a wish of 3 at each position it has caught up
 * to; its guesses are llama.cpp's drafts under test_llama_drafts's rule. A
 * segment that skips positions leaves it behind: it proposes nothing. */
static void test_proposer_drafts(void) {
    char path[128], err[LM_ERRLEN];
    static drafts_facts F;
    CHECK(read_facts(&F) == 0);
    CHECK(mk_f16(path, sizeof path) == 0);
    lm_model *m = model_load(path, err, sizeof err);
    unlink(path);
    CHECKF(m, "%s", err);
    lm_pool *pool = pool_new(2);
    spec_proposer *p = spec_prop_mtp(m, pool, 128, 128, 2, err, sizeof err);
    lm_seqrun *r = seqrun_new(m, pool, 128, 128, LM_KV_F16, err, sizeof err);
    CHECKF(p && r && spec_prop_hid(p), "%s", err);
    r->fwd->hid = spec_prop_hid(p);
    spec_pseq s;
    CHECK(spec_pseq_init(p, &s, 3, NULL, NULL, NULL, 0) == 0);
    float *lg = malloc((size_t)m->hp.n_vocab * sizeof *lg);
    CHECK(!seqrun_forward(r, F.toks, F.L0, lg, false, err, sizeof err));
    spec_prop_hidden(p, &s, F.toks, 0, spec_prop_hid(p), F.L0);
    int compared = 0, proposals = 0;
    for (int L = F.L0; L < F.L0 + F.nL;) {
        spec_job j = {.s = &s, .toks = F.toks, .n_toks = L + 1, .k = 3};
        spec_prop_propose(p, &j, 1);
        CHECK(j.n_out == 3);
        proposals++;
        const int i = L - F.L0;
        for (int d = 0; d < 3; d++) {
            if (s.guess[d] != F.dt[i][d]) {
                CHECKF(F.dm[i][d] <= 0.02f, "L %d draft %d: %d, llama.cpp %d", L, d, s.guess[d], F.dt[i][d]);
                break;
            }
            compared++;
        }
        int step = (L % 3 == 2 && L + 2 <= F.L0 + F.nL) ? 2 : 1; /* a verified pending token and one guess */
        CHECK(!seqrun_forward(r, F.toks + L, step, lg, false, err, sizeof err));
        spec_prop_hidden(p, &s, F.toks, L, spec_prop_hid(p), step);
        L += step;
    }
    fprintf(stderr, "  proposer: %d proposals, %d drafts equal llama.cpp's\n", proposals, compared);
    CHECK(compared >= proposals * 3 * 9 / 10);
    /* a segment that skips positions: nothing proposed until position 0 comes again */
    spec_prop_hidden(p, &s, F.toks, F.L0 + F.nL + 1, spec_prop_hid(p), 1);
    spec_job j = {.s = &s, .toks = F.toks, .n_toks = F.L0 + F.nL + 3, .k = 3};
    spec_prop_propose(p, &j, 1);
    CHECK(j.n_out == 0);
    spec_prop_release(p, &s);
    spec_pseq_free(&s);
    free(lg);
    seqrun_free(r);
    spec_prop_free(p);
    pool_free(pool);
    model_free(m);
}

static void test_llama_drafts(void) {
    const char *bin = getenv("LAMINA_BIN") ? getenv("LAMINA_BIN") : "build/lamina";
    char cmd[512], path[128], err[LM_ERRLEN], line[4096];
    snprintf(path, sizeof path, "/tmp/lamina_test_mtp_f_%d.gguf", (int)getpid());
    snprintf(cmd, sizeof cmd,
             "%s mkmodel --preset qwen35-small --type F16 --mtp 1 --vocab-from "
             "tests/data/vocab/ggml-vocab-gpt-2.gguf -t 2 -o %s 2>/dev/null",
             bin, path);
    CHECK(system(cmd) == 0);
    FILE *f = fopen("tests/data/qwen35/mtp_drafts.txt", "r");
    CHECK(f);
    int32_t toks[128];
    int n_tok = 0, L0 = -1, nL = 0, dt[64][3];
    float dl[64][3], dm[64][3];
    while (fgets(line, sizeof line, f)) {
        char *p;
        if (!strncmp(line, "tokens:", 7))
            for (p = line + 7; n_tok < 128;) {
                char *end;
                long v = strtol(p, &end, 10);
                if (end == p) break;
                toks[n_tok++] = (int32_t)v, p = end;
            }
        int L, off;
        if (sscanf(line, "L %d drafts:%n", &L, &off) == 1 && nL < 64) {
            if (L0 < 0) L0 = L;
            CHECK(L == L0 + nL);
            p = line + off;
            for (int j = 0; j < 3; j++) {
                int used;
                CHECK(sscanf(p, " %d(%f,m%f)%n", &dt[nL][j], &dl[nL][j], &dm[nL][j], &used) == 3);
                p += used;
            }
            nL++;
        }
    }
    fclose(f);
    CHECK(n_tok > L0 + nL && L0 > 0 && nL >= 16);
    lm_model *m = model_load(path, err, sizeof err);
    unlink(path);
    CHECKF(m, "%s", err);
    lm_pool *pool = pool_new(2);
    const int E = m->hp.n_embd, V = m->hp.n_vocab;
    lm_seqrun *r = seqrun_new(m, pool, 128, 128, LM_KV_F16, err, sizeof err);
    mtp_head *c = mtp_new(m, pool, 128, NULL, err, sizeof err);
    CHECKF(r && c, "%s", err);
    float *H = malloc((size_t)128 * E * sizeof *H), *lg = malloc((size_t)V * sizeof *lg);
    float *h1 = malloc((size_t)E * sizeof *h1), *zero = calloc((size_t)E, sizeof *zero);
    r->fwd->hid = H;
    CHECK(!seqrun_forward(r, toks, n_tok - 1, NULL, false, err, sizeof err));
    int compared = 0, filled = 0;
    double worst = 0;
    for (int i = 0; i < nL; i++) {
        int L = L0 + i;
        for (; filled < L; filled++)
            CHECK(!mtp_run(c, filled ? H + (size_t)(filled - 1) * E : zero, toks + filled, 1, filled, NULL, NULL, err,
                           sizeof err));
        const float *h = H + (size_t)(L - 1) * E;
        int32_t t = toks[L];
        for (int j = 0; j < 3; j++) {
            CHECK(!mtp_run(c, h, &t, 1, L + j, lg, h1, err, sizeof err));
            t = mtp_argmax(lg, V);
            if (t != dt[i][j]) {
                CHECKF(dm[i][j] <= 0.02f, "L %d draft %d: %d, llama.cpp %d (margin %g)", L, j, t, dt[i][j], dm[i][j]);
                break;
            }
            worst = fmax(worst, fabs(lg[t] - dl[i][j]));
            compared++;
            h = h1;
        }
        filled = L + 1;
    }
    fprintf(stderr, "  %d of %d drafts equal llama.cpp's, worst logit difference %.4f\n", compared, 3 * nL, worst);
    CHECK(worst < 0.02);
    CHECK(compared >= 3 * nL * 9 / 10);
    free(H), free(lg), free(h1), free(zero);
    mtp_free(c);
    seqrun_free(r);
    pool_free(pool);
    model_free(m);
}

/* The engine's configuration: --spec mtp on a file without the layer is
 * refused by name; with it, taken. */
static void test_engine_refusals(void) {
    char err[LM_ERRLEN];
    lm_model *a = model_load(path_dense, err, sizeof err), *b = model_load(path_plain, err, sizeof err);
    CHECKF(a && b, "%s", err);
    lm_engine_config c;
    lm_spec_config sc;
    engine_config_default(&c);
    engine_spec_default(&sc);
    sc.proposer = LM_SPEC_MTP;
    c.spec = &sc;
    c.n_ctx = 256;
    c.n_threads = 1;
    lm_spec_config out;
    fwd_dims d;
    lm_engine_config c2 = c;
    CHECK(engine_resolve_config(b, &c2, &out, &d, err, sizeof err) == -1);
    CHECKF(strstr(err, "needs a model with an MTP layer") && strstr(err, "qwen35 model has none"), "%s", err);
    c2 = c;
    CHECKF(engine_resolve_config(a, &c2, &out, &d, err, sizeof err) == 0 && c2.spec && c2.spec->proposer == LM_SPEC_MTP,
           "%s", err);
    c2 = c, sc.proposer = LM_SPEC_NGRAM; /* prompt lookup on the same file: accepted (off on a hybrid) */
    CHECKF(engine_resolve_config(a, &c2, &out, &d, err, sizeof err) == 0, "%s", err);
    model_free(a), model_free(b);
}

int main(void) {
    snprintf(path_dense, sizeof path_dense, "/tmp/lamina_test_mtp_d_%d.gguf", (int)getpid());
    snprintf(path_moe, sizeof path_moe, "/tmp/lamina_test_mtp_m_%d.gguf", (int)getpid());
    snprintf(path_plain, sizeof path_plain, "/tmp/lamina_test_mtp_p_%d.gguf", (int)getpid());
    if (mkmodel("qwen35-small", 1, path_dense) || mkmodel("qwen35moe-small", 1, path_moe) ||
        mkmodel("qwen35-small", 0, path_plain)) {
        fprintf(stderr, "lamina mkmodel failed (LAMINA_BIN, default build/lamina)\n");
        return 1;
    }
    TEST_RUN(test_head_dense);
    TEST_RUN(test_head_moe);
    TEST_RUN(test_rewrite);
    TEST_RUN(test_trunk_and_refusal);
    TEST_RUN(test_engine_refusals);
    TEST_RUN(test_llama_drafts);
    TEST_RUN(test_proposer_drafts);
    unlink(path_dense), unlink(path_moe), unlink(path_plain);
    return TEST_DONE();
}
