/*
 * test_draft_vocab.c - the draft model's LM head over a vocabulary subset
 * (model/forward.h's head_sub, sched/draft.h, lm_spec_config.draft_vocab):
 *   - the subset's logits equal the whole LM head's on those rows (the
 *     bundled F32 model and its Q4_0 requantization, whose head is packed
 *     where the kernels have a packed form): |a - b| <= 1e-6 (1 + |b|) for
 *     the fixed rows (the same kernel on the same rows) and 1e-4 (1 + |b|)
 *     for the gathered extras (the row-major kernel), every other token
 *     -inf, and the whole head's pass unchanged bit for bit afterwards;
 *   - draft_vocab_size's rule (default: 32768 above 65536 tokens, else the
 *     whole; 0 or n_vocab and more: the whole) and the subset's make-up
 *     (the end-of-generation tokens and the best by score, ascending ids);
 *   - the runner's guesses and q: two jobs in one call, each guess is in
 *     the subset or its own sequence's tokens, q is zero outside that set
 *     (not the other job's tokens either) and sums to 1;
 *   - greedy identity: with the Q4_0 draft over 32 of the 512 tokens,
 *     every request's tokens equal the plain engine's (12 prompts, alone
 *     and together), and guesses are proposed and accepted;
 *   - the memory plan: the subset's rows and scratch are in the draft's
 *     workspace, planned (engine_mem_plan) as allocated;
 *   - the sampled output's distribution: with the Q4_0 draft over 24
 *     tokens (a subset that, with the prompt's tokens, leaves out at least
 *     20% of the target's probability of the tested position), the second
 *     token of many 3-token requests follows the target's exact conditional
 *     distribution (chi-square at significance 1e-6); both branches occur.
 * Under AddressSanitizer the sample count is a third, under emulation an
 * eighth.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/pool.h"
#include "base/util.h"
#include "decode/sample.h"
#include "format/quant.h"
#include "format/quantize.h"
#include "kernels/kernels.h"
#include "model/forward.h"
#include "model/model.h"
#include "sched/draft.h"
#include "sched/engine.h"
#include "text/tokenizer.h"
#include "chi2.h"
#include "test.h"

static lm_model *model, *draft_q4;
static lm_pool *ref_pool;
static long scale = 1;

/* ---- the subset's logits ---------------------------------------------------- */

static void logits_case(const lm_model *m, const char *what) {
    int V = m->hp.n_vocab;
    char err[LM_ERRLEN];
    int32_t prompt[12] = {1, 403, 407, 261, 300, 17, 77, 301, 288, 5, 499, 260};
    enum { NSUB = 40, NX = 7 };
    int32_t sub_ids[NSUB], extra[NX];
    for (int i = 0; i < NSUB; i++) sub_ids[i] = (int32_t)((i * 97 + 11) % V); /* distinct: 97 is prime to 512 */
    int nx = 0;
    for (int32_t t = 0; t < V && nx < NX; t += 13) {
        bool in = false;
        for (int i = 0; i < NSUB; i++) in = in || sub_ids[i] == t;
        if (!in) extra[nx++] = t;
    }
    lm_head_sub *h = head_sub_new(m, sub_ids, NSUB, err, sizeof err);
    CHECKF(h, "%s", err);
    if (!h) return;
    CHECK(h->n == NSUB && h->bytes == head_sub_bytes(m, NSUB));
    for (int i = 1; i < NSUB; i++) CHECK(h->ids[i] > h->ids[i - 1]);
    CHECK((h->w.packed != NULL) == (m->output.packed != NULL));
    float *full = lm_malloc(3 * (size_t)V * sizeof *full), *part = lm_malloc(3 * (size_t)V * sizeof *part);
    float *again = lm_malloc(3 * (size_t)V * sizeof *again);
    fwd_head_sel sel = {.sub = h,
                        .extra = extra,
                        .n_extra = nx,
                        .gather = lm_malloc((size_t)NX * m->output.row_bytes),
                        .out = lm_malloc(3 * (size_t)(NSUB + NX) * sizeof(float))};
    head_sub_gather(m, &sel);
    lm_seqrun *s = seqrun_new(m, ref_pool, 64, 64, LM_TYPE_F32, err, sizeof err);
    CHECKF(s, "%s", err);
    /* the last 3 rows of each: all_logits over the prompt's last 3 tokens */
    CHECK(seqrun_forward(s, prompt, 9, NULL, false, err, sizeof err) == 0);
    CHECK(seqrun_forward(s, prompt + 9, 3, full, true, err, sizeof err) == 0);
    seqrun_reset(s);
    s->fwd->head = &sel;
    CHECK(seqrun_forward(s, prompt, 9, NULL, false, err, sizeof err) == 0);
    CHECK(seqrun_forward(s, prompt + 9, 3, part, true, err, sizeof err) == 0);
    s->fwd->head = NULL;
    seqrun_reset(s);
    CHECK(seqrun_forward(s, prompt, 9, NULL, false, err, sizeof err) == 0);
    CHECK(seqrun_forward(s, prompt + 9, 3, again, true, err, sizeof err) == 0);
    CHECK(!memcmp(full, again, 3 * (size_t)V * sizeof *full));
    seqrun_free(s);
    double worst_sub = 0, worst_x = 0;
    int n_inf = 0, bad = 0;
    for (int r = 0; r < 3; r++)
        for (int t = 0; t < V; t++) {
            float a = part[(size_t)r * V + t], b = full[(size_t)r * V + t];
            int kind = 0; /* 0 other, 1 subset, 2 extra */
            for (int i = 0; i < NSUB; i++) kind = sub_ids[i] == t ? 1 : kind;
            for (int i = 0; i < nx; i++) kind = extra[i] == t ? 2 : kind;
            if (kind == 0) {
                n_inf += a == -INFINITY;
                continue;
            }
            double d = fabs((double)a - b) / (1 + fabs((double)b));
            if (kind == 1 && d > worst_sub) worst_sub = d;
            if (kind == 2 && d > worst_x) worst_x = d;
            bad += !isfinite(a);
        }
    fprintf(stderr, "  %s: subset rows within %.2e, extras within %.2e (relative to 1 + |logit|)\n", what, worst_sub,
            worst_x);
    CHECK(bad == 0);
    CHECK(n_inf == 3 * (V - NSUB - nx));
    CHECK(worst_sub <= 1e-6);
    CHECK(worst_x <= 1e-4);
    head_sub_free(h);
    lm_free(full), lm_free(part), lm_free(again), lm_free(sel.gather), lm_free(sel.out);
}

static void test_subset_logits(void) {
    logits_case(model, "F32 model");
    logits_case(draft_q4, "Q4_0 model");
    char err[LM_ERRLEN];
    int32_t dup[3] = {5, 9, 5}, out[2] = {3, 512};
    CHECK(head_sub_new(model, dup, 3, err, sizeof err) == NULL && strstr(err, "distinct"));
    CHECK(head_sub_new(model, out, 2, err, sizeof err) == NULL);
    CHECK(head_sub_new(model, out, 0, err, sizeof err) == NULL);
}

/* ---- the size rule and the subset's make-up --------------------------------- */

static void test_size_rule(void) {
    int V = model->hp.n_vocab;
    CHECK(V == 512);
    CHECK(draft_vocab_size(model, -1) == 0); /* small vocabularies: the whole by default */
    CHECK(draft_vocab_size(model, 0) == 0);
    CHECK(draft_vocab_size(model, V) == 0 && draft_vocab_size(model, V + 5) == 0);
    CHECK(draft_vocab_size(model, 100) == 100);
    lm_model big = *model;
    big.hp.n_vocab = 262144;
    CHECK(draft_vocab_size(&big, -1) == DRAFT_VOCAB_AUTO);
    CHECK(draft_vocab_size(&big, 0) == 0 && draft_vocab_size(&big, 1000) == 1000);
    big.hp.n_vocab = DRAFT_VOCAB_AUTO_ABOVE;
    CHECK(draft_vocab_size(&big, -1) == 0);

    char err[LM_ERRLEN];
    draft_runner *d = draft_new(draft_q4, ref_pool, NULL, 128, 64, 2, 32, err, sizeof err);
    CHECKF(d, "%s", err);
    if (!d) return;
    const int32_t *ids;
    int n = draft_vocab_n(d, &ids);
    CHECK(n >= 32);
    /* the end-of-generation tokens, then the best by score (ties by id) */
    const float *sc = tok_scores(draft_q4->tok);
    CHECK(sc != NULL);
    int n_eog = 0;
    bool all_eog = true;
    for (int32_t t = 0; t < V; t++)
        if (tok_is_eog(draft_q4->tok, t)) {
            n_eog++;
            bool in = false;
            for (int i = 0; i < n; i++) in = in || ids[i] == t;
            all_eog = all_eog && in;
        }
    CHECK(all_eog && n == (n_eog > 32 ? n_eog : 32));
    float worst_in = INFINITY, best_out = -INFINITY;
    for (int32_t t = 0; t < V; t++) {
        if (tok_is_eog(draft_q4->tok, t)) continue;
        bool in = false;
        for (int i = 0; i < n; i++) in = in || ids[i] == t;
        if (in && sc[t] < worst_in) worst_in = sc[t];
        if (!in && sc[t] > best_out) best_out = sc[t];
    }
    CHECKF(worst_in >= best_out, "worst score in %g, best out %g", worst_in, best_out);
    for (int i = 1; i < n; i++) CHECK(ids[i] > ids[i - 1]);
    draft_free(d);
}

/* ---- the runner's guesses and q -------------------------------------------- */

static void test_runner_q(void) {
    int V = model->hp.n_vocab;
    char err[LM_ERRLEN];
    draft_runner *d = draft_new(draft_q4, ref_pool, NULL, 128, 64, 2, 32, err, sizeof err);
    CHECKF(d, "%s", err);
    if (!d) return;
    const int32_t *ids;
    int n = draft_vocab_n(d, &ids);
    bool *in_sub = lm_calloc((size_t)V, sizeof *in_sub);
    for (int i = 0; i < n; i++) in_sub[ids[i]] = true;
    /* two sequences whose tokens lie mostly outside the subset, and differ */
    int32_t toks[2][26];
    for (int j = 0; j < 2; j++) {
        toks[j][0] = 1;
        for (int t = 1; t < 26; t++) toks[j][t] = (int32_t)(300 + j * 100 + (t * 7) % 60);
    }
    lm_sample_params sp;
    sample_params_default(&sp);
    sp.temp = 1, sp.top_k = 0, sp.top_p = 1, sp.min_p = 0;
    draft_seq ds[2];
    draft_job jobs[2];
    int32_t out[2][4];
    float *q = lm_malloc(2 * 4 * (size_t)V * sizeof *q);
    lm_sampler *hist[2];
    for (int j = 0; j < 2; j++) {
        sp.seed = 7 + (uint64_t)j;
        CHECK(draft_seq_init(d, &ds[j], &sp) == 0);
        hist[j] = sampler_new(&sp, V);
        jobs[j] = (draft_job){.ds = &ds[j],
                              .toks = toks[j],
                              .n_toks = 20,
                              .hist = hist[j],
                              .k = 4,
                              .out = out[j],
                              .q = q + (size_t)j * 4 * V};
    }
    int outside_guesses = 0;
    for (int round = 0; round < 6; round++) {
        /* each call sees one more token of the sequence (the target's), as in the engine */
        for (int j = 0; j < 2; j++) jobs[j].n_toks = 20 + round;
        draft_propose(d, jobs, 2, 0, 0);
        for (int j = 0; j < 2; j++) {
            CHECKF(jobs[j].n_out == 4, "round %d job %d: %d guesses", round, j, jobs[j].n_out);
            for (int g = 0; g < jobs[j].n_out; g++) {
                const float *qr = jobs[j].q + (size_t)g * V;
                double sum = 0, leak = 0;
                for (int32_t t = 0; t < V; t++) {
                    bool own = in_sub[t];
                    for (int i = 0; i < jobs[j].n_toks; i++) own = own || toks[j][i] == t;
                    sum += qr[t];
                    if (!own) leak += qr[t];
                }
                CHECKF(fabs(sum - 1) < 1e-4 && leak == 0, "job %d guess %d: q sums to %g, %g outside", j, g, sum, leak);
                CHECK(qr[jobs[j].out[g]] > 0);
                outside_guesses += !in_sub[jobs[j].out[g]];
            }
            draft_keep(d, &ds[j], jobs[j].n_toks); /* every guess rejected */
        }
    }
    fprintf(stderr, "  %d of 48 guesses were context tokens outside the subset\n", outside_guesses);
    CHECK(outside_guesses > 0); /* the context's rows were computed and sampled */
    for (int j = 0; j < 2; j++) {
        draft_seq_free(d, &ds[j]);
        sampler_free(hist[j]);
    }
    CHECK(draft_live(d) == 0 && draft_check(d, err, sizeof err) == 0);
    draft_free(d);
    lm_free(q), lm_free(in_sub);
}

/* ---- the engine ------------------------------------------------------------- */

#define MAX_OUT 64
typedef struct {
    int32_t tokens[MAX_OUT];
    int n;
    bool done;
    lm_request_stats stats;
} collect;

static void on_event(void *user, const lm_event *ev) {
    collect *c = user;
    if (ev->token >= 0 && c->n < MAX_OUT) c->tokens[c->n++] = ev->token;
    if (ev->done) {
        c->done = true;
        c->stats = *ev->stats;
    }
}

static lm_engine *new_engine(int spec, int vocab, int max_seqs) {
    lm_engine_config ec;
    engine_config_default(&ec);
    ec.n_threads = 2;
    ec.batch_tokens = 256;
    ec.max_seqs = max_seqs;
    ec.kv_type = LM_TYPE_F32;
    ec.block_size = 4;
    lm_spec_config sc;
    lm_spec_config_default(&sc);
    sc.proposer = spec;
    sc.max = 4;
    sc.draft_model = draft_q4;
    sc.cost = -1; /* proposals sized by acceptance alone */
    sc.draft_vocab = vocab;
    ec.spec = spec == LM_SPEC_NONE ? NULL : &sc;
    char err[LM_ERRLEN];
    lm_engine *e = engine_new(model, model->tok, &ec, err, sizeof err);
    if (!e) fprintf(stderr, "engine_new: %s\n", err);
    return e;
}

enum { N_PROMPTS = 12 };

static void run_prompts(lm_engine *e, int32_t (*prompts)[24], const int *np, collect *out, bool together) {
    char err[LM_ERRLEN];
    for (int i = 0; i < N_PROMPTS; i++) {
        memset(&out[i], 0, sizeof out[i]);
        lm_request_params p;
        engine_request_params_default(&p);
        p.prompt = prompts[i], p.n_prompt = np[i], p.max_tokens = 40, p.sp.temp = 0;
        p.on_event = on_event, p.user = &out[i];
        CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
        if (!together) engine_wait_idle(e);
    }
    engine_wait_idle(e);
}

static void test_greedy_identity(void) {
    static int32_t prompts[N_PROMPTS][24];
    int np[N_PROMPTS];
    lm_rng r;
    lm_rng_seed(&r, 42);
    for (int i = 0; i < N_PROMPTS; i++) {
        np[i] = 6 + i;
        prompts[i][0] = 1;
        for (int t = 1; t < np[i]; t++) /* half copy-heavy (a repeated phrase), half random */
            prompts[i][t] = i % 2 ? (int32_t)(3 + lm_rng_u64(&r) % 509) : (int32_t)(260 + (t % 4) * 31 + i);
    }
    static collect plain[N_PROMPTS], got[N_PROMPTS];
    lm_engine *e = new_engine(LM_SPEC_NONE, -1, 8);
    CHECK(e);
    run_prompts(e, prompts, np, plain, false);
    engine_free(e);
    const int vocabs[2] = {32, 0};
    for (int v = 0; v < 2; v++)
        for (int together = 0; together < 2; together++) {
            e = new_engine(LM_SPEC_DRAFT, vocabs[v], 8);
            CHECK(e);
            run_prompts(e, prompts, np, got, together);
            long proposed = 0, accepted = 0;
            for (int i = 0; i < N_PROMPTS; i++) {
                CHECKF(got[i].n == plain[i].n && !memcmp(got[i].tokens, plain[i].tokens, (size_t)got[i].n * 4),
                       "vocab %d, prompt %d differs", vocabs[v], i);
                proposed += got[i].stats.spec_proposed;
                accepted += got[i].stats.spec_accepted;
            }
            fprintf(stderr, "  draft vocab %d%s: %ld proposed, %ld accepted\n", vocabs[v], together ? ", together" : "",
                    proposed, accepted);
            CHECK(proposed > 0 && accepted > 0);
            char err[LM_ERRLEN];
            CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
            engine_free(e);
        }
}

/* The subset's rows and scratch are in the draft's workspace, planned as
 * allocated. */
static void test_mem_counted(void) {
    lm_engine_config c;
    engine_config_default(&c);
    c.n_threads = 2, c.max_seqs = 4, c.n_ctx = 128, c.batch_tokens = 64, c.kv_type = LM_TYPE_F32;
    lm_spec_config sc;
    lm_spec_config_default(&sc);
    sc.proposer = LM_SPEC_DRAFT, sc.draft_model = draft_q4, sc.cost = -1;
    c.spec = &sc;
    engine_mem whole, part;
    char err[LM_ERRLEN];
    sc.draft_vocab = 0;
    CHECKF(engine_mem_plan(model, &c, &whole, err, sizeof err) == 0, "%s", err);
    sc.draft_vocab = 32;
    CHECKF(engine_mem_plan(model, &c, &part, err, sizeof err) == 0, "%s", err);
    CHECK(part.draft_workspace >= whole.draft_workspace + head_sub_bytes(draft_q4, 32));
    lm_engine *e = engine_new(model, model->tok, &c, err, sizeof err);
    CHECKF(e, "%s", err);
    if (!e) return;
    lm_engine_stats st;
    engine_stats(e, &st);
    CHECKF(st.mem_draft_workspace == part.draft_workspace, "measured %llu, planned %llu",
           (unsigned long long)st.mem_draft_workspace, (unsigned long long)part.draft_workspace);
    engine_free(e);
}

/* The second token's distribution with a small subset (as test_spec_draft's
 * dist_case, the draft's q restricted). */
static void test_distribution(void) {
    int V = model->hp.n_vocab;
    enum { NSUB = 24 };
    static int32_t prompt[24];
    int n = 0;
    prompt[n++] = 1;
    for (int t = 0; t < 15; t++) prompt[n++] = 3 + (t * 37) % 509;
    lm_sample_params sp;
    sample_params_default(&sp);
    sp.top_k = 0, sp.top_p = 1, sp.min_p = 0, sp.temp = 1;
    lm_engine *e = new_engine(LM_SPEC_DRAFT, NSUB, 16);
    CHECK(e);
    char err[LM_ERRLEN];
    enum { N_MAX = 6000, BATCH = 16 };
    const int N = (int)(N_MAX / scale / BATCH * BATCH);
    static collect cs[BATCH];
    static int32_t first[N_MAX], second[N_MAX];
    long proposed = 0, accepted = 0;
    for (int b = 0; b < N; b += BATCH) {
        for (int k = 0; k < BATCH; k++) {
            memset(&cs[k], 0, sizeof cs[k]);
            lm_request_params p;
            engine_request_params_default(&p);
            p.prompt = prompt, p.n_prompt = n, p.max_tokens = 3, p.sp = sp, p.sp.seed = 191 + (uint64_t)(b + k);
            p.ignore_eos = true;
            p.on_event = on_event, p.user = &cs[k];
            CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
        }
        engine_wait_idle(e);
        for (int k = 0; k < BATCH; k++) {
            CHECK(cs[k].n >= 2);
            first[b + k] = cs[k].tokens[0];
            second[b + k] = cs[k].tokens[1];
            proposed += cs[k].stats.spec_proposed;
            accepted += cs[k].stats.spec_accepted;
        }
    }
    CHECK(engine_check(e, err, sizeof err) == 0);
    engine_free(e);
    fprintf(stderr, "  %ld guesses, %ld accepted\n", proposed, accepted);
    /* both branches, and a share of the second tokens verified against a
     * guess (the draft stands aside in an iteration where requests wait, so
     * how many guess moves with the batch's arrival: 42-99% in runs seen) */
    CHECK(proposed > N / 8 && accepted > 0 && accepted < proposed);
    long *cnt = lm_calloc((size_t)V, sizeof *cnt);
    for (int i = 0; i < N; i++) cnt[first[i]]++;
    int32_t t1 = 0;
    for (int t = 0; t < V; t++) t1 = cnt[t] > cnt[t1] ? t : t1;
    memset(cnt, 0, (size_t)V * sizeof *cnt);
    long m = 0;
    for (int i = 0; i < N; i++)
        if (first[i] == t1) cnt[second[i]]++, m++;
    CHECKF(m >= 400 / scale, "the most frequent first token came %ld times", m);
    /* the target's exact distribution after t1 */
    float *row = lm_malloc((size_t)V * sizeof *row), *probs = lm_malloc((size_t)V * sizeof *probs);
    int32_t *ids = lm_malloc((size_t)V * sizeof *ids);
    double *p = lm_calloc((size_t)V, sizeof *p);
    lm_seqrun *s = seqrun_new(model, ref_pool, 0, 64, LM_TYPE_F32, err, sizeof err);
    CHECK(s);
    prompt[n] = t1;
    CHECK(seqrun_forward(s, prompt, n + 1, row, false, err, sizeof err) == 0);
    seqrun_free(s);
    lm_sampler *ref = sampler_new(&sp, V);
    sampler_accept(ref, t1);
    int32_t k = sampler_dist(ref, row, ids, probs);
    for (int i = 0; i < k; i++) p[ids[i]] = probs[i];
    sampler_free(ref);
    /* how much of p the draft cannot guess: outside the subset and the sequence */
    draft_runner *d = draft_new(draft_q4, ref_pool, NULL, 128, 64, 1, NSUB, err, sizeof err);
    CHECK(d);
    const int32_t *sub;
    int ns = draft_vocab_n(d, &sub);
    double out_mass = 0;
    for (int32_t t = 0; t < V; t++) {
        bool in = false;
        for (int i = 0; i < ns; i++) in = in || sub[i] == t;
        for (int i = 0; i <= n; i++) in = in || prompt[i] == t;
        if (!in) out_mass += p[t];
    }
    draft_free(d);
    fprintf(stderr, "  the target's probability outside the draft's subset and the sequence: %.3f\n", out_mass);
    CHECK(out_mass >= 0.2);
    int df;
    double x2 = chi_square(cnt, p, V, m, &df);
    fprintf(stderr, "  second token after %d (%ld draws): chi-square %.1f, %d df, critical %.1f\n", t1, m, x2, df,
            chi_crit(df));
    CHECK(x2 < chi_crit(df));
    lm_free(cnt), lm_free(row), lm_free(probs), lm_free(ids), lm_free(p);
}

int main(void) {
    kernels_init();
    if (getenv("LAMINA_ASAN")) scale = 3;
    if (getenv("LAMINA_EMULATED")) scale = 8; /* qemu: the sampling is the same C as natively */
    char err[LM_ERRLEN];
    if (!(model = model_load(TEST_MODEL, err, sizeof err))) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    ref_pool = pool_new(2);
    char tmpdir[64], q4[128];
    snprintf(tmpdir, sizeof tmpdir, "/tmp/lamina_draft_vocab_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    snprintf(q4, sizeof q4, "%s/draft_q4_0.gguf", tmpdir);
    if (quantize_file(TEST_MODEL, q4, "Q4_0", ref_pool, NULL, NULL, err, sizeof err) != 0 ||
        !(draft_q4 = model_load(q4, err, sizeof err))) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    TEST_RUN(test_subset_logits);
    TEST_RUN(test_size_rule);
    TEST_RUN(test_runner_q);
    TEST_RUN(test_greedy_identity);
    TEST_RUN(test_mem_counted);
    TEST_RUN(test_distribution);
    model_free(draft_q4);
    unlink(q4);
    rmdir(tmpdir);
    model_free(model);
    pool_free(ref_pool);
    return TEST_DONE();
}
