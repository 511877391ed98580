/*
 * test_spec_draft.c - speculative decoding by a draft model (sched/draft.h,
 * the engine's LM_SPEC_DRAFT), and what both proposers must do at the edges:
 *   - the tokenizer check: the same file agrees; a copy of the bundled model
 *     with one token's text changed is refused by engine_new with an error
 *     naming that token;
 *   - greedy identity: with a draft (the bundled model itself, so nearly
 *     every guess is accepted, and its Q4_0 requantization, whose guesses
 *     differ) every request's tokens, text and finish reason equal the plain
 *     engine's: 24 prompts (copy-heavy and random) alone, together, under a
 *     budget of 8 tokens per iteration (the draft stands aside while
 *     prefills run), in a pool small enough to preempt and recompute, with
 *     stop strings, max_tokens from 1 to 60, n = 3 forks, end-of-text made
 *     likely, and grammars, and again from the prefix cache; the same runs
 *     with prompt lookup. Each run must
 *     show an end-of-text token that was an accepted proposal, and (with the
 *     near-certain draft) a stop string ending on an accepted proposal;
 *     engine_check (both pools' invariants, no block or draft sequence left
 *     when idle, exact plan accounting) passes after each run;
 *   - the sampled output's distribution: with the Q4_0 draft (its q differs
 *     from the target's p), the second token of many 3-token requests,
 *     verified against the draft's guess, follows the target's exact
 *     conditional distribution (chi-square at significance 1e-6), under
 *     plain sampling and under bias + penalties + top-k + top-p; both the
 *     accept and the reject branch must occur; a seed reproduces a run;
 *   - the controller's back-off: a probe rejected doubles the interval;
 *   - grammars: the draft guesses under the grammar's mask (a copy of the
 *     parse state follows its guesses): with three grammars (letters, a
 *     list of numbers, a fixed sentence shape) outputs equal the plain
 *     engine's with the mask and without it (engine_set_draft_masking),
 *     for both drafts; acceptance with the mask is at least that without,
 *     the draft that is the model accepts 90% or more, and on the numbers
 *     grammar (which the unconstrained draft never guesses) it rises by
 *     more than half; the chi-square test again with a grammar (the
 *     target's exact distribution is then the masked one);
 *   - the cost model (spec.h): spec_gain's arithmetic against a float64
 *     evaluation, the k it picks is the best one, a draft as costly as the
 *     model is never consulted (no probes either), a cheap one always
 *     rejected spends under 5% of 128 steps' passes and under 1% of 2,000,
 *     one always accepted proposes k_max; in the engine, a draft priced as
 *     a whole pass proposes nothing and the Q4_0 draft priced at a tenth
 *     proposes and is accepted, and with the price measured at start it is
 *     reported; outputs equal to the plain ones in each.
 * The engines of the other cases run without the cost model (spec_cost
 * -1), so their proposals depend on acceptance alone (the model as its own
 * draft, which the cost model would never consult, gives near-certain
 * guesses there).
 * Under AddressSanitizer (LAMINA_ASAN) and under instruction-set emulation
 * (LAMINA_EMULATED, `make test-arm`) the sample counts are a third.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/pool.h"
#include "base/safefile.h"
#include "base/util.h"
#include "decode/grammar.h"
#include "decode/sample.h"
#include "decode/spec.h"
#include "format/quant.h"
#include "format/quantize.h"
#include "kernels/kernels.h"
#include "model/forward.h"
#include "model/model.h"
#include "sched/draft.h"
#include "sched/engine.h"
#include "text/tokenizer.h"
#include "chi2.h"
#include "spec_collect.h"
#include "engine_test.h"
#include "test.h"

static lm_model *model, *draft_q4;
static lm_pool *ref_pool;
static long scale = 1;
static char tmpdir[64];

/* ---- the tokenizer check ---------------------------------------------------- */

static void test_vocab_check(void) {
    char err[LM_ERRLEN];
    CHECKF(draft_check_vocab(model, model, err, sizeof err) == 0, "%s", err);
    CHECKF(draft_check_vocab(model, draft_q4, err, sizeof err) == 0, "%s", err);
    /* a copy with token 300's text changed in place (same length) */
    size_t n;
    char *buf = safefile_read(TEST_MODEL, &n, err, sizeof err);
    CHECKF(buf, "%s", err);
    size_t plen;
    const char *piece = tok_piece(model->tok, 300, &plen);
    CHECK(plen >= 2);
    /* GGUF strings: a u64 length, then the bytes */
    char pat[64];
    uint64_t l64 = plen;
    memcpy(pat, &l64, 8);
    memcpy(pat + 8, piece, plen);
    char *hit = memmem(buf, n, pat, 8 + plen);
    CHECK(hit != NULL);
    hit[8] = hit[8] == 'Q' ? 'Z' : 'Q';
    char path[128];
    snprintf(path, sizeof path, "%s/bad_vocab.gguf", tmpdir);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(buf, 1, n, f) == n);
    fclose(f);
    lm_free(buf);
    lm_model *bad = model_load(path, err, sizeof err);
    CHECKF(bad, "%s", err);
    CHECK(draft_check_vocab(model, bad, err, sizeof err) != 0);
    CHECKF(strstr(err, "token 300") != NULL, "%s", err);
    lm_engine_config ec;
    engine_config_default(&ec);
    ec.n_threads = 1;
    lm_spec_config sc;
    lm_spec_config_default(&sc);
    sc.proposer = LM_SPEC_DRAFT;
    sc.draft_model = bad;
    ec.spec = &sc;
    CHECK(engine_new(model, model->tok, &ec, err, sizeof err) == NULL);
    CHECKF(strstr(err, "tokenizer") && strstr(err, "token 300"), "%s", err);
    fprintf(stderr, "  refused: %s\n", err);
    sc.draft_model = NULL;
    CHECK(engine_new(model, model->tok, &ec, err, sizeof err) == NULL);
    model_free(bad);
    unlink(path);
}

/* ---- the controller's back-off ----------------------------------------------- */

static void test_backoff(void) {
    spec_ctl c;
    spec_ctl_init(&c);
    c.every_max = SPEC_PROBE_MAX_DRAFT;
    while (c.acc >= SPEC_MIN_REACH) spec_ctl_update(&c, 1, 0);
    int gaps[6] = {0}, steps = 0, g = 0;
    for (int i = 0; i < 2000 && g < 6; i++) {
        steps++;
        if (spec_ctl_want(&c, 4)) {
            gaps[g++] = steps;
            steps = 0;
            spec_ctl_update(&c, 1, 0);
        }
    }
    CHECK(gaps[0] == SPEC_PROBE_EVERY && gaps[1] == 2 * SPEC_PROBE_EVERY && gaps[2] == 4 * SPEC_PROBE_EVERY);
    CHECK(gaps[5] == SPEC_PROBE_MAX_DRAFT);
    spec_ctl_update(&c, 1, 1); /* accepted: back to the first interval */
    CHECK(c.every == SPEC_PROBE_EVERY);
    /* prompt lookup's controller keeps its interval */
    spec_ctl_init(&c);
    while (c.acc >= SPEC_MIN_REACH) spec_ctl_update(&c, 1, 0);
    for (int i = 0; i < 100; i++)
        if (spec_ctl_want(&c, 4)) spec_ctl_update(&c, 1, 0);
    CHECK(c.every == SPEC_PROBE_EVERY);
}

/* ---- the engine -------------------------------------------------------------- */

#define N_JOBS 24

static lm_engine *new_engine_cost(int spec, const lm_model *dm, int batch_tokens, int max_seqs, uint64_t kv_mem,
                                  float cost) {
    lm_engine_config ec;
    test_engine_config(&ec, batch_tokens, max_seqs, kv_mem);
    ec.block_size = 4;
    lm_spec_config sc;
    lm_spec_config_default(&sc);
    sc.proposer = spec;
    sc.max = 6;
    sc.draft_model = dm;
    sc.cost = cost;
    ec.spec = spec == LM_SPEC_NONE ? NULL : &sc;
    char err[LM_ERRLEN];
    lm_engine *e = engine_new(model, model->tok, &ec, err, sizeof err);
    if (!e) fprintf(stderr, "engine_new: %s\n", err);
    return e;
}

/* without the cost model: proposals sized by acceptance alone */
static lm_engine *new_engine(int spec, const lm_model *dm, int batch_tokens, int max_seqs, uint64_t kv_mem) {
    return new_engine_cost(spec, dm, batch_tokens, max_seqs, kv_mem, -1);
}

typedef struct {
    int32_t prompt[96];
    int n_prompt, max_tokens, n;
    char stop[16];
    const char *grammar;
    bool eos_bias;
    float eos_val; /* the bias when not 0 (else 22) */
} job;

static void make_jobs(job *jobs) {
    lm_rng r;
    lm_rng_seed(&r, 777);
    for (int j = 0; j < N_JOBS; j++) {
        job *b = &jobs[j];
        memset(b, 0, sizeof *b);
        b->prompt[0] = 1;
        int n = 8 + (int)(lm_rng_u64(&r) % 24);
        for (int i = 1; i < n; i++) b->prompt[i] = 3 + (int32_t)(lm_rng_u64(&r) % 509);
        if (j % 3 != 2) { /* copy-heavy */
            int from = 1 + (int)(lm_rng_u64(&r) % (unsigned)(n / 2)), len = n - from;
            if (len > 60 - n) len = 60 - n;
            memcpy(b->prompt + n, b->prompt + from, (size_t)len * sizeof *b->prompt);
            n += len;
        }
        if (j % 4 == 1 || j % 7 == 5) { /* end-of-text inside the prompt, and likelier */
            b->prompt[n / 2] = 2;
            b->eos_bias = true;
        }
        b->n_prompt = n;
        b->max_tokens = 1 + (j * 13) % 60;
        if (j % 5 == 4 || b->eos_bias) b->max_tokens = 60;
        b->n = j % 6 == 5 ? 3 : 1;
        if (j % 8 == 6) b->grammar = "root ::= [a-z] [a-z ,.]*\n";
    }
}

static const float eos_default = 22.0f;

static lm_request_params job_params(const job *b, collect *c, const char **stops) {
    lm_request_params p;
    engine_request_params_default(&p);
    p.prompt = b->prompt;
    p.n_prompt = b->n_prompt;
    p.max_tokens = b->max_tokens;
    p.n = b->n;
    p.sp.temp = 0;
    p.grammar = b->grammar;
    p.on_event = on_event;
    p.user = c;
    static const int32_t eos_id[1] = {2};
    if (b->eos_bias) p.bias_ids = eos_id, p.bias_vals = b->eos_val ? &b->eos_val : &eos_default, p.n_bias = 1;
    if (b->stop[0]) {
        stops[0] = b->stop;
        p.stop = stops;
        p.n_stop = 1;
    }
    return p;
}

static int run_jobs(lm_engine *e, const job *jobs, collect *out, bool together) {
    char err[LM_ERRLEN];
    static const char *stops[N_JOBS][1];
    for (int j = 0; j < N_JOBS; j++) {
        memset(&out[j], 0, sizeof out[j]);
        lm_request_params p = job_params(&jobs[j], &out[j], stops[j]);
        if (engine_submit(e, &p, NULL, err, sizeof err) != LM_OK) {
            fprintf(stderr, "  submit %d: %s\n", j, err);
            return -1;
        }
        if (!together) engine_wait_idle(e);
    }
    engine_wait_idle(e);
    if (engine_check(e, err, sizeof err) != 0) {
        fprintf(stderr, "  engine_check: %s\n", err);
        return -1;
    }
    return 0;
}

/* Whether got equals want, request by request, choice by choice. */
static bool same(const job *jobs, const collect *want, const collect *got, const char *what) {
    for (int j = 0; j < N_JOBS; j++)
        if (!collect_same(want, got, j, jobs[j].n, what)) return false;
    return true;
}

/* Ends of the outputs on an accepted proposal: by end-of-text, by a stop
 * string. */
static void accepted_ends(const job *jobs, const collect *got, int *eos, int *stop) {
    *eos = *stop = 0;
    for (int j = 0; j < N_JOBS; j++)
        for (int i = 0; i < jobs[j].n; i++) {
            const collect *c = &got[j];
            if (c->finish[i] != LM_FINISH_STOP || c->n[i] == 0 || !c->acc[i][c->n[i] - 1]) continue;
            if (c->tokens[i][c->n[i] - 1] == 2) (*eos)++;
            else if (jobs[j].stop[0]) (*stop)++;
        }
}

static void test_greedy_identity(void) {
    static job jobs[N_JOBS];
    static collect plain[N_JOBS], got[N_JOBS];
    make_jobs(jobs);
    lm_engine *ref = new_engine(LM_SPEC_NONE, NULL, 64, 8, 0);
    CHECK(ref);
    CHECK(run_jobs(ref, jobs, plain, false) == 0);
    for (int j = 0; j < N_JOBS; j += 3) /* stop strings from the middle of the plain text */
        if (!jobs[j].eos_bias && plain[j].text_len[0] > 12) {
            memcpy(jobs[j].stop, plain[j].text[0] + plain[j].text_len[0] * 2 / 3, 3);
            jobs[j].stop[3] = 0;
        }
    CHECK(run_jobs(ref, jobs, plain, false) == 0);
    engine_free(ref);
    int n_eos = 0, n_stop = 0;
    for (int j = 0; j < N_JOBS; j++) {
        n_eos += plain[j].finish[0] == LM_FINISH_STOP && plain[j].n[0] && plain[j].tokens[0][plain[j].n[0] - 1] == 2;
        n_stop += jobs[j].stop[0] && plain[j].finish[0] == LM_FINISH_STOP;
    }
    fprintf(stderr, "  plain: %d end by end-of-text, %d by a stop string\n", n_eos, n_stop);
    CHECK(n_eos >= 3 && n_stop >= 2);
    uint64_t bpt = 2ull * (uint64_t)model->hp.n_layer * (uint64_t)model->hp.n_head_kv * (uint64_t)model->hp.head_dim *
        sizeof(float);
    struct {
        const char *what;
        int batch;
        uint64_t kv_mem;
        bool together;
    } runs[] = {
        {"alone", 64, 0, false},
        {"together", 64, 0, true},
        {"budget 8", 8, 0, true},
        {"small pool", 64, 90 * 4 * bpt, true},
    };
    struct {
        const char *what;
        int spec;
        const lm_model *dm;
    } props[] = {{"draft = target", LM_SPEC_DRAFT, model},
                 {"draft Q4_0", LM_SPEC_DRAFT, draft_q4},
                 {"prompt lookup", LM_SPEC_NGRAM, NULL}};
    for (size_t q = 0; q < sizeof props / sizeof props[0]; q++) {
        int eos_acc = 0, stop_acc = 0;
        uint64_t rejected = 0;
        for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
            lm_engine *e = new_engine(props[q].spec, props[q].dm, runs[r].batch, 8, runs[r].kv_mem);
            CHECK(e);
            char what[96];
            snprintf(what, sizeof what, "%s, %s", props[q].what, runs[r].what);
            CHECK(run_jobs(e, jobs, got, runs[r].together) == 0);
            CHECK(same(jobs, plain, got, what));
            if (r == 1) { /* again: prompts and outputs now come from the prefix cache */
                CHECK(run_jobs(e, jobs, got, true) == 0);
                CHECK(same(jobs, plain, got, what));
            }
            int ea, sa;
            accepted_ends(jobs, got, &ea, &sa);
            eos_acc += ea, stop_acc += sa;
            lm_engine_stats st;
            engine_stats(e, &st);
            fprintf(stderr,
                    "  %s: %llu proposed, %llu accepted, %llu passes, %llu preemptions; %d end-of-text and %d "
                    "stop strings on accepted proposals\n",
                    what, (unsigned long long)st.spec_proposed_total, (unsigned long long)st.spec_accepted_total,
                    (unsigned long long)st.spec_steps_total, (unsigned long long)st.preemptions_total, ea, sa);
            CHECK(st.spec_accepted_total <= st.spec_proposed_total);
            /* a draft stands aside while the budget cannot hold its proposals (budget 8) */
            if (runs[r].batch >= 64 || props[q].spec == LM_SPEC_NGRAM) CHECK(st.spec_accepted_total >= 10);
            else CHECK(st.spec_proposed_total < 60);
            rejected += st.spec_proposed_total - st.spec_accepted_total;
            if (runs[r].kv_mem) CHECK(st.preemptions_total > 0);
            engine_free(e);
        }
        if (props[q].spec == LM_SPEC_DRAFT) /* prompt lookup: test_ngram_eos */
            CHECKF(eos_acc > 0, "%s: no end-of-text was an accepted proposal", props[q].what);
        if (props[q].dm == model)
            CHECKF(stop_acc > 0, "%s: no stop string ended on an accepted proposal", props[q].what);
        if (props[q].dm != model) CHECK(rejected > 0);
    }
}

/* End-of-text inside an accepted run of prompt lookup: prompts holding
 * "t 2" (2 is end-of-text) where t is their own first generated token, so
 * that after t the proposer offers end-of-text; with end-of-text made likely
 * the target takes it. Some must end on the accepted proposal; every
 * output must equal the plain one. */
static void test_ngram_eos(void) {
    static job jobs[N_JOBS];
    static collect plain[N_JOBS], got[N_JOBS];
    lm_engine *ref = new_engine(LM_SPEC_NONE, NULL, 64, 8, 0);
    lm_engine *e = new_engine(LM_SPEC_NGRAM, NULL, 64, 8, 0);
    CHECK(ref && e);
    lm_rng r;
    lm_rng_seed(&r, 31337);
    for (int j = 0; j < N_JOBS; j++) {
        job *b = &jobs[j];
        memset(b, 0, sizeof *b);
        b->prompt[0] = 1;
        b->n_prompt = 12 + (int)(lm_rng_u64(&r) % 12);
        for (int i = 1; i < b->n_prompt; i++) b->prompt[i] = 3 + (int32_t)(lm_rng_u64(&r) % 509);
        b->max_tokens = 40;
        b->n = 1;
        b->eos_bias = true;
        b->eos_val = 20.0f + (float)(j % 8);
    }
    /* the first token of each, then "t 2" inserted early: twice, so the
     * first token settles where it can */
    for (int round = 0; round < 3; round++) {
        CHECK(run_jobs(ref, jobs, plain, true) == 0);
        if (round == 2) break;
        for (int j = 0; j < N_JOBS; j++) {
            job *b = &jobs[j];
            b->prompt[3] = plain[j].tokens[0][0];
            b->prompt[4] = 2;
        }
    }
    CHECK(run_jobs(e, jobs, got, true) == 0);
    CHECK(same(jobs, plain, got, "prompt lookup, end-of-text"));
    int ea, sa;
    accepted_ends(jobs, got, &ea, &sa);
    fprintf(stderr, "  prompt lookup: %d of %d outputs end on an accepted end-of-text\n", ea, N_JOBS);
    CHECK(ea > 0);
    engine_free(ref);
    engine_free(e);
}

/* The second token of many 3-token sampled requests (the first sampled
 * plainly, the second verified against the Q4_0 draft's guess) against
 * the target's exact conditional distribution. */
static void dist_case(const lm_sample_params *sp, const char *grammar, const char *what) {
    int V = model->hp.n_vocab;
    static int32_t prompt[24];
    int n = 0;
    prompt[n++] = 1;
    for (int t = 0; t < 15; t++) prompt[n++] = 3 + (t * 37) % 509;
    /* a budget that admits a whole batch's prompts and decodes at once: the
     * draft stands aside while requests wait (engine.h), so with 256 it
     * guessed for as few as 42% of the requests when the batch arrived over
     * two iterations */
    lm_engine *e = new_engine(LM_SPEC_DRAFT, draft_q4, 1024, 16, 0);
    CHECK(e);
    static const int32_t bias_id[1] = {300};
    static const float bias_val[1] = {2.0f};
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
            p.prompt = prompt, p.n_prompt = n, p.max_tokens = 3, p.sp = *sp, p.sp.seed = 91 + (uint64_t)(b + k);
            p.bias_ids = bias_id, p.bias_vals = bias_val, p.n_bias = 1;
            p.grammar = grammar;
            p.ignore_eos = grammar != NULL; /* every request has its second token */
            p.on_event = on_event, p.user = &cs[k];
            CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
        }
        engine_wait_idle(e);
        for (int k = 0; k < BATCH; k++) {
            CHECK(cs[k].n[0] >= 2);
            first[b + k] = cs[k].tokens[0][0];
            second[b + k] = cs[k].tokens[0][1];
            proposed += cs[k].stats[0].spec_proposed;
            accepted += cs[k].stats[0].spec_accepted;
        }
    }
    CHECK(engine_check(e, err, sizeof err) == 0);
    engine_free(e);
    fprintf(stderr, "  %s: %ld guesses, %ld accepted\n", what, proposed, accepted);
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
    float *row = lm_malloc((size_t)V * sizeof *row), *probs = lm_malloc((size_t)V * sizeof *probs);
    int32_t *ids = lm_malloc((size_t)V * sizeof *ids);
    double *p = lm_calloc((size_t)V, sizeof *p);
    lm_seqrun *s = seqrun_new(model, ref_pool, 0, 64, LM_TYPE_F32, err, sizeof err);
    CHECK(s);
    prompt[n] = t1;
    CHECK(seqrun_forward(s, prompt, n + 1, row, false, err, sizeof err) == 0);
    seqrun_free(s);
    if (grammar) { /* the target's row after t1 under the grammar's mask */
        lm_grammar *g = grammar_parse(grammar, strlen(grammar), NULL, err, sizeof err);
        lm_gvocab *gv = grammar_vocab_new(model->tok, err, sizeof err);
        lm_gmatch *gm = g && gv ? gmatch_new(g, gv, err, sizeof err) : NULL;
        CHECKF(gm, "%s", err);
        uint32_t *mask = lm_malloc((size_t)(grammar_vocab_size(gv) + 31) / 32 * sizeof *mask);
        CHECK(mask && (tok_is_eog(model->tok, t1) || gmatch_accept(gm, t1) == 0) && gmatch_mask(gm, mask) > 0);
        grammar_mask_apply(mask, grammar_vocab_size(gv), row, V);
        lm_free(mask);
        gmatch_free(gm);
        grammar_vocab_free(gv);
        grammar_free(g);
    }
    lm_sampler *ref = sampler_new(sp, V);
    sampler_set_bias(ref, bias_id[0], bias_val[0]);
    sampler_accept(ref, t1);
    int32_t k = sampler_dist(ref, row, ids, probs);
    for (int i = 0; i < k; i++) p[ids[i]] = probs[i];
    sampler_free(ref);
    int df;
    double x2 = chi_square(cnt, p, V, m, &df);
    fprintf(stderr, "  %s: second token after %d (%ld draws): chi-square %.1f, %d df, critical %.1f\n", what, t1, m, x2,
            df, chi_crit(df));
    CHECK(x2 < chi_crit(df));
    lm_free(cnt), lm_free(row), lm_free(probs), lm_free(ids), lm_free(p);
}

static void test_distribution(void) {
    lm_sample_params sp;
    sample_params_default(&sp);
    sp.top_k = 0, sp.top_p = 1, sp.min_p = 0, sp.temp = 1;
    dist_case(&sp, NULL, "plain sampling");
    /* the draft's q is then the masked distribution, as the target's p */
    dist_case(&sp, "root ::= [a-m .]+\n", "a grammar");
    sp.top_k = 30, sp.top_p = 0.9f, sp.temp = 0.8f, sp.repeat_penalty = 1.3f, sp.presence_penalty = 0.5f;
    dist_case(&sp, NULL, "penalties, top-k, top-p");
}

/* A seed reproduces a sampled run with the draft. */
static void test_seed(void) {
    lm_engine *e = new_engine(LM_SPEC_DRAFT, draft_q4, 64, 4, 0);
    CHECK(e);
    static collect r[2];
    int32_t prompt[4] = {1, 403, 407, 261};
    char err[LM_ERRLEN];
    for (int k = 0; k < 2; k++) {
        memset(&r[k], 0, sizeof r[k]);
        lm_request_params p;
        engine_request_params_default(&p);
        p.prompt = prompt, p.n_prompt = 4, p.max_tokens = 60, p.sp.seed = 5, p.n = 2;
        p.on_event = on_event, p.user = &r[k];
        CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
        engine_wait_idle(e);
    }
    for (int i = 0; i < 2; i++)
        CHECK(r[0].n[i] == r[1].n[i] && !memcmp(r[0].tokens[i], r[1].tokens[i], (size_t)r[0].n[i] * sizeof(int32_t)));
    CHECK(r[0].stats[0].spec_steps > 0);
    CHECK(engine_check(e, err, sizeof err) == 0);
    engine_free(e);
}

/* ---- grammars --------------------------------------------------------------- */

static const char *const grammars[3] = {"root ::= [a-z] [a-z ,.]*\n", "root ::= [0-9]+ (\",\" [0-9]+)*\n",
                                        "root ::= \"Once\" (\" \" [a-z]+){2,6} \".\"\n"};

static void test_grammar_draft(void) {
    static job jobs[N_JOBS];
    static collect plain[N_JOBS], got[N_JOBS];
    make_jobs(jobs);
    for (int j = 0; j < N_JOBS; j++) {
        jobs[j].grammar = grammars[j % 3];
        if (jobs[j].max_tokens < 12) jobs[j].max_tokens = 12 + j;
    }
    lm_engine *ref = new_engine(LM_SPEC_NONE, NULL, 64, 8, 0);
    CHECK(ref);
    CHECK(run_jobs(ref, jobs, plain, false) == 0);
    engine_free(ref);
    const lm_model *dms[2] = {model, draft_q4};
    const char *names[2] = {"draft = target", "draft Q4_0"};
    double rate[2][2][3]; /* [draft][mask][grammar] */
    for (int d = 0; d < 2; d++)
        for (int mask = 0; mask < 2; mask++) {
            lm_engine *e = new_engine(LM_SPEC_DRAFT, dms[d], 64, 8, 0);
            CHECK(e);
            engine_set_draft_masking(e, mask);
            char what[96];
            snprintf(what, sizeof what, "%s, grammars, mask %s", names[d], mask ? "on" : "off");
            CHECK(run_jobs(e, jobs, got, true) == 0);
            CHECK(same(jobs, plain, got, what));
            long prop[3] = {0}, acc[3] = {0};
            for (int j = 0; j < N_JOBS; j++)
                for (int i = 0; i < jobs[j].n; i++) {
                    prop[j % 3] += got[j].stats[i].spec_proposed;
                    acc[j % 3] += got[j].stats[i].spec_accepted;
                }
            for (int g = 0; g < 3; g++) {
                rate[d][mask][g] = prop[g] ? (double)acc[g] / (double)prop[g] : 0;
                fprintf(stderr, "  %s, grammar %d: %ld proposed, %ld accepted (%.1f%%)\n", what, g, prop[g], acc[g],
                        100 * rate[d][mask][g]);
            }
            CHECK(prop[0] + prop[1] + prop[2] > 0);
            engine_free(e);
        }
    for (int d = 0; d < 2; d++)
        for (int g = 0; g < 3; g++)
            CHECKF(rate[d][1][g] >= rate[d][0][g] - 0.02, "%s, grammar %d: %.3f with the mask, %.3f without", names[d],
                   g, rate[d][1][g], rate[d][0][g]);
    for (int g = 0; g < 3; g++) CHECKF(rate[0][1][g] >= 0.9, "grammar %d: %.3f", g, rate[0][1][g]);
    CHECKF(rate[0][1][1] > rate[0][0][1] + 0.5, "numbers: %.3f with the mask, %.3f without", rate[0][1][1],
           rate[0][0][1]);
}

/* ---- the cost model ------------------------------------------------------------ */

static double gain64(double a, int k, double cost) {
    double t = 1, r = 1;
    for (int i = 0; i < k; i++) t += r *= a;
    return t / (1 + k * (cost + (double)SPEC_ROW_COST));
}

/* Passes' worth spent on guesses over `steps` steps of a draft of the
 * given cost whose guesses are all rejected (or all accepted). */
static double spent(float cost, int steps, bool accept, int *last_k) {
    spec_ctl c;
    spec_ctl_init(&c);
    c.every_max = SPEC_PROBE_MAX_DRAFT;
    c.cost = cost;
    double s = 0;
    for (int i = 0; i < steps; i++) {
        int k = spec_ctl_want(&c, 4);
        *last_k = k;
        if (!k) continue;
        s += k * (cost + SPEC_ROW_COST);
        spec_ctl_update(&c, k, accept ? k : 0);
    }
    return s;
}

static void test_cost_model(void) {
    CHECK(fabs(spec_gain(0.96f, 3, 0.54f) - gain64(0.96, 3, 0.54)) < 1e-5);
    CHECK(fabs(spec_gain(0.3f, 1, 0.1f) - gain64(0.3, 1, 0.1)) < 1e-5);
    CHECK(spec_gain(0.5f, 0, 0.3f) == 1.0f);
    /* the k picked is the best (above a plain step by SPEC_MIN_GAIN), or 0 */
    const float as[6] = {0.05f, 0.3f, 0.6f, 0.8f, 0.96f, 1.0f}, costs[4] = {0.02f, 0.1f, 0.54f, 0.9f};
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 4; j++) {
            spec_ctl c;
            spec_ctl_init(&c);
            c.cost = costs[j];
            c.acc = as[i];
            int best = 0;
            double bg = 1 + (double)SPEC_MIN_GAIN;
            for (int k = 1; k <= 6; k++)
                if (gain64(as[i], k, costs[j]) > bg) bg = gain64(as[i], k, costs[j]), best = k;
            int k = spec_ctl_want(&c, 6);
            CHECKF(k == best || (best == 0 && k <= 1), "a %.2f cost %.2f: k %d, best %d", as[i], costs[j], k, best);
        }
    /* as slow as the model: never consulted, not even by a probe */
    int k;
    CHECK(spent(1.0f, 2000, false, &k) == 0);
    spec_ctl c;
    spec_ctl_init(&c);
    c.cost = 1.0f;
    c.acc = 1.0f;
    CHECK(spec_ctl_want(&c, 4) == 0);
    /* cheap and always wrong: a few steps, then rare probes */
    double s128 = spent(0.06f, 128, false, &k), s2000 = spent(0.06f, 2000, false, &k);
    fprintf(stderr, "  a draft at 0.06 of a pass, every guess rejected: %.2f passes spent in 128 steps, %.2f in 2000\n",
            s128, s2000);
    CHECK(s128 > 0 && s128 < 0.05 * 128 && s2000 < 0.01 * 2000);
    /* cheap and always right: k_max */
    spent(0.06f, 64, true, &k);
    CHECK(k == 4);
    /* the engine, at set prices (the measured one moves with the machine's
     * load, and under the sanitizers every pass costs about the same): a
     * draft priced as a whole pass is never consulted, one priced at a
     * tenth proposes and is accepted; with the price measured at start
     * (spec_cost 0) the price is reported and the output is still exact */
    static job jobs[N_JOBS];
    static collect plain[N_JOBS], got[N_JOBS];
    make_jobs(jobs);
    lm_engine *ref = new_engine(LM_SPEC_NONE, NULL, 64, 8, 0);
    CHECK(ref && run_jobs(ref, jobs, plain, true) == 0);
    engine_free(ref);
    const struct {
        const lm_model *dm;
        float cost;
        const char *name;
    } runs[3] = {{model, 1.0f, "draft = target, priced 1"},
                 {draft_q4, 0.1f, "draft Q4_0, priced 0.1"},
                 {draft_q4, 0.0f, "draft Q4_0, price measured"}};
    for (int d = 0; d < 3; d++) {
        lm_engine *e = new_engine_cost(LM_SPEC_DRAFT, runs[d].dm, 64, 8, 0, runs[d].cost);
        CHECK(e);
        CHECK(run_jobs(e, jobs, got, true) == 0);
        CHECK(same(jobs, plain, got, runs[d].name));
        lm_engine_stats st;
        engine_stats(e, &st);
        engine_spec_prices_t pr;
        engine_spec_prices(e, &pr);
        fprintf(stderr, "  cost model, %s: price %.3f, %llu proposed, %llu accepted\n", runs[d].name,
                (double)pr.draft_cost, (unsigned long long)st.spec_proposed_total,
                (unsigned long long)st.spec_accepted_total);
        if (d == 0) CHECK(st.spec_proposed_total == 0);
        else if (d == 1) CHECK(st.spec_proposed_total > 0 && st.spec_accepted_total > 0);
        else CHECK(pr.draft_cost > 0 && pr.draft_cost < 100);
        if (d < 2) CHECK(pr.draft_cost == runs[d].cost);
        engine_free(e);
    }
}

int main(void) {
    kernels_init();
    if (getenv("LAMINA_ASAN") || getenv("LAMINA_EMULATED")) scale = 3;
    char err[LM_ERRLEN];
    if (!(model = test_model_load())) return 1;
    ref_pool = pool_new(2);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/lamina_spec_draft_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    char q4[128];
    snprintf(q4, sizeof q4, "%s/draft_q4_0.gguf", tmpdir);
    if (quantize_file(TEST_MODEL, q4, "Q4_0", ref_pool, NULL, NULL, err, sizeof err) != 0 ||
        !(draft_q4 = model_load(q4, err, sizeof err))) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    TEST_RUN(test_vocab_check);
    TEST_RUN(test_backoff);
    TEST_RUN(test_greedy_identity);
    TEST_RUN(test_ngram_eos);
    TEST_RUN(test_distribution);
    TEST_RUN(test_seed);
    TEST_RUN(test_grammar_draft);
    TEST_RUN(test_cost_model);
    model_free(draft_q4);
    unlink(q4);
    rmdir(tmpdir);
    model_free(model);
    pool_free(ref_pool);
    return TEST_DONE();
}
