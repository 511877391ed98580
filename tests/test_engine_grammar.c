/*
 * test_engine_grammar.c - grammar-constrained requests in the engine, on the
 * bundled model (stories260K: a 512-token SentencePiece vocabulary with
 * byte tokens, so any text can be spelled):
 *   - a constrained request's tokens equal a reference generator written
 *     here (single-sequence forward, the mask applied by hand as -INFINITY
 *     logits, then the sampler), greedy and sampled with top-k, top-p,
 *     min-p and penalties: the mask composes with every sampling option;
 *   - its text is a string of the grammar (a prefix when cut by max_tokens),
 *     a grammar that can only end finishes the choice with "stop", and EOS
 *     (even favoured by a logit bias) comes only where the grammar can end;
 *   - the same output alone and among free requests, with n = 3 choices,
 *     and under preemption in a tiny KV pool;
 *   - a lazy grammar: output identical to the free one up to the trigger,
 *     constrained from the trigger's first byte on; a token that completes
 *     the trigger but continues with text the grammar refuses ends the
 *     choice with an error;
 *   - a bad grammar or bad triggers are refused at submission;
 *   - a highly ambiguous grammar is refused at submission, or ends its
 *     request with an error while generating and is refused from then on;
 *   - more distinct grammars than the engine keeps compiled;
 *   - the cache of compiled grammars stays within its bytes, drops the
 *     least recently used first, and a grammar dropped while its requests
 *     run (or never kept, being larger than the cache) still constrains
 *     them to the end.
 */
#include <stdatomic.h>
#include <string.h>

#include "base/pool.h"
#include "base/util.h"
#include "decode/grammar.h"
#include "decode/sample.h"
#include "kernels/kernels.h"
#include "model/forward.h"
#include "model/model.h"
#include "sched/engine.h"
#include "engine_test.h"
#include "test.h"
#include "text/tokenizer.h"

#define MAX_OUT 96

static lm_model *model;
static lm_pool *ref_pool;
static lm_gvocab *gvocab;

typedef struct {
    int32_t tokens[4][MAX_OUT];
    int n[4];
    int done[4];
    lm_finish finish[4];
    atomic_int n_done;
} collect;

static void on_event(void *user, const lm_event *ev) {
    collect *c = user;
    int i = ev->index;
    if (ev->token >= 0 && c->n[i] < MAX_OUT) c->tokens[i][c->n[i]++] = ev->token;
    if (ev->done) {
        c->done[i]++;
        c->finish[i] = ev->finish;
        atomic_fetch_add(&c->n_done, 1);
    }
}

/* A JSON-like record; the model has never seen one, so the mask decides. */
static const char *RECORD = "root ::= \"{\\\"name\\\": \\\"\" [a-z ]{1,12} \"\\\", \\\"age\\\": \" [1-9] [0-9]? "
                            "\", \\\"tags\\\": [\" tags? \"]}\"\n"
                            "tags ::= tag (\", \" tag){0,2}\n"
                            "tag ::= \"\\\"\" [a-z]+ \"\\\"\"\n";

/* Free text in words, ending at a period; "Once" first. */
static const char *WORDS = "root ::= \"Once\" (\" \" [a-z]+){2,6} \".\"\n";

/* Lower-case text that may end anywhere after its first character: the
 * end comes from an EOG token, allowed only there. */
static const char *LOWER = "root ::= [a-z] [a-z ,.]*\n";

static int32_t prompt[8];
static int n_prompt;

/* The reference: one sequence, mask by hand, then the sampler. */
static int reference(const char *gbnf, const lm_sample_params *sp, int max_tokens, int32_t *out, lm_finish *fin) {
    char err[LM_ERRLEN];
    int32_t V = model->hp.n_vocab;
    lm_grammar *g = grammar_parse(gbnf, strlen(gbnf), NULL, err, sizeof err);
    lm_gmatch *m = g ? gmatch_new(g, gvocab, err, sizeof err) : NULL;
    lm_seqrun *s = seqrun_new(model, ref_pool, 0, 64, LM_TYPE_F32, err, sizeof err);
    lm_sampler *smp = sampler_new(sp, V);
    float *logits = lm_malloc((size_t)V * sizeof *logits);
    uint32_t *allow = lm_malloc((size_t)(V + 31) / 32 * 4);
    int n = -1;
    if (!m || !s || !smp || !logits || !allow || seqrun_forward(s, prompt, n_prompt, logits, false, err, sizeof err))
        goto done;
    n = 0;
    *fin = LM_FINISH_LENGTH;
    while (n < max_tokens) {
        gmatch_mask(m, allow);
        for (int32_t t = 0; t < V; t++)
            if (!((allow[t >> 5] >> (t & 31)) & 1)) logits[t] = -INFINITY;
        int32_t t = sampler_sample(smp, logits);
        sampler_accept(smp, t);
        out[n++] = t;
        if (tok_is_eog(model->tok, t)) {
            *fin = LM_FINISH_STOP;
            break;
        }
        if (gmatch_accept(m, t) != 0) {
            n = -1;
            break;
        }
        if (gmatch_must_end(m)) {
            *fin = LM_FINISH_STOP;
            break;
        }
        if (n == max_tokens || seqrun_forward(s, &t, 1, logits, false, err, sizeof err)) break;
    }
done:
    lm_free(logits);
    lm_free(allow);
    sampler_free(smp);
    seqrun_free(s);
    gmatch_free(m);
    grammar_free(g);
    return n;
}

/* 1: the tokens' text is a whole string of the grammar, 0: a prefix, -1: neither. */
static int text_judge(const char *gbnf, const int32_t *toks, int n) {
    char err[LM_ERRLEN], buf[256];
    lm_grammar *g = grammar_parse(gbnf, strlen(gbnf), NULL, err, sizeof err);
    lm_gmatch *m = gmatch_new(g, gvocab, err, sizeof err);
    int r = 0;
    for (int i = 0; i < n && r == 0; i++) {
        if (tok_is_eog(model->tok, toks[i])) break;
        int w = tok_token_bytes(model->tok, toks[i], false, buf, sizeof buf);
        if (w <= 0 || gmatch_accept_bytes(m, buf, (size_t)w) < 0) r = -1;
    }
    if (r == 0 && gmatch_can_end(m)) r = 1;
    gmatch_free(m);
    grammar_free(g);
    return r;
}

static lm_engine *new_engine(int max_seqs, uint64_t kv_mem) { return test_engine_new(model, 64, max_seqs, kv_mem); }

static lm_request_params params(const char *gbnf, const lm_sample_params *sp, int max_tokens, collect *c) {
    lm_request_params p;
    engine_request_params_default(&p);
    p.prompt = prompt;
    p.n_prompt = n_prompt;
    p.max_tokens = max_tokens;
    p.sp = *sp;
    p.grammar = gbnf;
    p.on_event = on_event;
    p.user = c;
    return p;
}

static lm_sample_params sampling(int kind) {
    lm_sample_params sp;
    sample_params_default(&sp);
    sp.seed = 11 + (uint64_t)kind;
    if (kind == 0) sp.temp = 0;                                                   /* greedy */
    else if (kind == 1) sp.temp = 1.0f, sp.top_k = 0, sp.top_p = 1, sp.min_p = 0; /* plain sampling */
    else if (kind == 2)
        sp.temp = 0.9f, sp.top_k = 20, sp.top_p = 0.9f, sp.min_p = 0.02f, sp.repeat_penalty = 1.3f,
        sp.freq_penalty = 0.5f, sp.presence_penalty = 0.3f;            /* everything at once */
    else sp.temp = 0, sp.repeat_penalty = 1.5f, sp.repeat_last_n = -1; /* greedy with penalties */
    return sp;
}

/* Engine output == reference, the text follows the grammar, and the end is
 * "stop" exactly when the grammar ended. */
static void test_matches_reference(void) {
    lm_engine *e = new_engine(8, 0);
    CHECK(e);
    const char *grammars[3] = {RECORD, WORDS, LOWER};
    int eog_ends = 0; /* LOWER requests ended by an EOG token */
    for (int gi = 0; gi < 3; gi++)
        for (int kind = 0; kind < 4; kind++) {
            lm_sample_params sp = sampling(kind);
            int32_t ref[MAX_OUT];
            lm_finish ref_fin;
            int n_ref = reference(grammars[gi], &sp, 80, ref, &ref_fin);
            CHECK(n_ref > 0);
            static collect c;
            memset(&c, 0, sizeof c);
            lm_request_params p = params(grammars[gi], &sp, 80, &c);
            char err[LM_ERRLEN];
            CHECKF(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK, "%s", err);
            engine_wait_idle(e);
            CHECK(c.done[0] == 1);
            CHECKF(c.n[0] == n_ref && memcmp(c.tokens[0], ref, (size_t)n_ref * 4) == 0 && c.finish[0] == ref_fin,
                   "grammar %d sampling %d: %d tokens (finish %d), reference %d (finish %d)", gi, kind, c.n[0],
                   c.finish[0], n_ref, ref_fin);
            int j = text_judge(grammars[gi], c.tokens[0], c.n[0]);
            if (kind == 1) {
                char text[512];
                int len = 0;
                for (int k = 0; k < c.n[0] && len < 400; k++)
                    len += tok_token_bytes(model->tok, c.tokens[0][k], false, text + len, 100);
                printf("NOTE grammar %d, sampled: %.*s\n", gi, len, text);
            }
            CHECKF(c.finish[0] == LM_FINISH_STOP ? j == 1 : j >= 0, "grammar %d sampling %d: judge %d", gi, kind, j);
            if (gi == 2 && c.finish[0] == LM_FINISH_STOP) eog_ends++;
        }
    printf("NOTE %d of 4 requests under the lower-case grammar ended on an EOG token\n", eog_ends);
    /* EOS favoured by a large bias: refused until the grammar can end, taken then */
    static collect c;
    memset(&c, 0, sizeof c);
    lm_sample_params sp = sampling(0);
    lm_request_params p = params(LOWER, &sp, 20, &c);
    int32_t eos = tok_eos(model->tok);
    float big = 100.0f;
    p.bias_ids = &eos, p.bias_vals = &big, p.n_bias = 1;
    char err[LM_ERRLEN];
    CHECK(eos >= 0 && engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
    engine_wait_idle(e);
    CHECKF(c.n[0] == 2 && c.tokens[0][1] == eos && c.finish[0] == LM_FINISH_STOP &&
               text_judge(LOWER, c.tokens[0], 1) == 1,
           "%d tokens, finish %d", c.n[0], c.finish[0]);
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    engine_free(e);
}

/* A constrained request alone, then among free ones, then with n = 3 (the
 * same seeds): the same tokens every time; under preemption too. */
static void test_batch_fork_preemption(void) {
    enum { N_FREE = 7 };
    lm_sample_params sp = sampling(2);
    static collect alone, inbatch, forks, frees[N_FREE], pre[6];
    memset(&alone, 0, sizeof alone), memset(&inbatch, 0, sizeof inbatch), memset(&forks, 0, sizeof forks);
    memset(frees, 0, sizeof frees), memset(pre, 0, sizeof pre);
    char err[LM_ERRLEN];
    lm_engine *e = new_engine(12, 0);
    CHECK(e);
    lm_request_params p = params(RECORD, &sp, 80, &alone);
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
    engine_wait_idle(e);
    /* among free requests of other lengths, submitted first and after */
    for (int i = 0; i < N_FREE; i++) {
        lm_request_params f = params(NULL, &sp, 20 + 7 * i, &frees[i]);
        f.sp.seed = 100 + (uint64_t)i;
        CHECK(engine_submit(e, &f, NULL, err, sizeof err) == LM_OK);
        if (i == 3) {
            p.user = &inbatch;
            CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
        }
    }
    engine_wait_idle(e);
    CHECK(alone.n[0] > 0 && inbatch.n[0] == alone.n[0] &&
          memcmp(inbatch.tokens[0], alone.tokens[0], (size_t)alone.n[0] * 4) == 0);
    /* n = 3: choice 0 uses the seed, choice i seed + i; each follows the grammar */
    p.n = 3;
    p.user = &forks;
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
    engine_wait_idle(e);
    CHECK(forks.n[0] == alone.n[0] && memcmp(forks.tokens[0], alone.tokens[0], (size_t)alone.n[0] * 4) == 0);
    for (int i = 0; i < 3; i++) {
        CHECK(forks.done[i] == 1);
        CHECKF(text_judge(RECORD, forks.tokens[i], forks.n[i]) == (forks.finish[i] == LM_FINISH_STOP ? 1 : 0),
               "choice %d", i);
        lm_sample_params si = sp;
        si.seed += (uint64_t)i;
        int32_t ref[MAX_OUT];
        lm_finish fin;
        int n_ref = reference(RECORD, &si, 80, ref, &fin);
        CHECKF(forks.n[i] == n_ref && memcmp(forks.tokens[i], ref, (size_t)n_ref * 4) == 0, "choice %d", i);
    }
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    engine_free(e);

    /* a pool of 10 blocks of 16 positions for 6 requests of ~90: preemption */
    uint64_t block_bytes = 16ull * 2 * model->hp.n_layer * model->hp.n_head_kv * model->hp.head_dim * 4;
    e = new_engine(6, 10 * block_bytes);
    CHECK(e);
    for (int i = 0; i < 6; i++) {
        lm_request_params q = params(i % 2 ? NULL : RECORD, &sp, 80, &pre[i]);
        CHECK(engine_submit(e, &q, NULL, err, sizeof err) == LM_OK);
    }
    engine_wait_idle(e);
    lm_engine_stats st;
    engine_stats(e, &st);
    CHECKF(st.preemptions_total > 0, "no preemption happened");
    for (int i = 0; i < 6; i += 2)
        CHECKF(pre[i].n[0] == alone.n[0] && memcmp(pre[i].tokens[0], alone.tokens[0], (size_t)alone.n[0] * 4) == 0,
               "request %d after preemption", i);
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    printf("NOTE grammar preemption: %llu preemptions\n", (unsigned long long)st.preemptions_total);
    engine_free(e);
}

/* Lazy: the free output up to a trigger (a token of it), then the grammar. */
static void test_lazy(void) {
    lm_sample_params sp = sampling(0);
    static collect free_c, lazy_c;
    memset(&free_c, 0, sizeof free_c), memset(&lazy_c, 0, sizeof lazy_c);
    char err[LM_ERRLEN];
    lm_engine *e = new_engine(4, 0);
    CHECK(e);
    lm_request_params p = params(NULL, &sp, 40, &free_c);
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
    engine_wait_idle(e);
    CHECK(free_c.n[0] >= 10);
    /* the trigger: the text of free tokens 4..5 */
    char trig[64];
    int tl = 0;
    for (int k = 4; k <= 5; k++) tl += tok_token_bytes(model->tok, free_c.tokens[0][k], false, trig + tl, 32);
    trig[tl] = 0;
    CHECK(tl > 0);
    /* the grammar: the trigger, then digits */
    char gbnf[256], lit[160];
    int o = 0;
    for (int i = 0; i < tl; i++) o += snprintf(lit + o, sizeof lit - (size_t)o, "\\x%02X", (unsigned char)trig[i]);
    snprintf(gbnf, sizeof gbnf, "root ::= \"%s\" \" = \" [0-9]{3,5} \";\"\n", lit);
    const char *trigs[1] = {trig};
    p = params(gbnf, &sp, 40, &lazy_c);
    p.grammar_triggers = trigs;
    p.n_grammar_triggers = 1;
    CHECKF(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK, "%s", err);
    engine_wait_idle(e);
    CHECK(lazy_c.done[0] == 1 && lazy_c.finish[0] == LM_FINISH_STOP);
    CHECK(lazy_c.n[0] > 6 && memcmp(lazy_c.tokens[0], free_c.tokens[0], 6 * 4) == 0); /* free up to the trigger */
    /* from the trigger on, a whole string of the grammar */
    int r = text_judge(gbnf, lazy_c.tokens[0] + 4, lazy_c.n[0] - 4);
    CHECKF(r == 1, "judge %d", r);
    /* a trigger that ends inside a token whose rest the grammar refuses: an error */
    static collect bad_c;
    memset(&bad_c, 0, sizeof bad_c);
    char t1[2] = {trig[0], 0};
    snprintf(gbnf, sizeof gbnf, "root ::= \"\\x%02X\" \"\\x01\"\n", (unsigned char)trig[0]);
    const char *trigs1[1] = {t1};
    p = params(gbnf, &sp, 40, &bad_c);
    p.grammar_triggers = trigs1;
    p.n_grammar_triggers = 1;
    CHECKF(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK, "%s", err);
    engine_wait_idle(e);
    CHECKF(bad_c.done[0] == 1 && bad_c.finish[0] == LM_FINISH_ERROR && bad_c.n[0] >= 1, "finish %d after %d tokens",
           bad_c.finish[0], bad_c.n[0]);
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    engine_free(e);
}

static void test_refused(void) {
    lm_engine *e = new_engine(4, 0);
    CHECK(e);
    lm_sample_params sp = sampling(0);
    collect c;
    memset(&c, 0, sizeof c);
    char err[LM_ERRLEN];
    lm_request_params p = params("root ::= \"a\"\nbad ::= (\"x\"", &sp, 10, &c);
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_ERR_INVALID);
    CHECKF(strstr(err, "line 2, column 9: unclosed '('"), "%s", err);
    p.grammar = "start ::= \"a\"";
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_ERR_INVALID && strstr(err, "no rule named 'root'"));
    p.grammar_root = "start";
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
    const char *empty[1] = {""};
    p.grammar_triggers = empty;
    p.n_grammar_triggers = 1;
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_ERR_INVALID && strstr(err, "trigger 0 is empty"));
    p.grammar = NULL;
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_ERR_INVALID && strstr(err, "need a grammar"));
    engine_wait_idle(e);
    CHECK(c.done[0] == 1 && c.finish[0] == LM_FINISH_STOP && c.n[0] >= 1);
    /* the text's size bound: 256 KiB of grammar is taken, one byte more refused before compiling */
    size_t big = 256 << 10;
    char *text = malloc(big + 2);
    CHECK(text);
    memset(text, '\n', big + 1);
    memcpy(text, "root ::= \"a\"", 12);
    text[big + 1] = 0;
    lm_request_params q = params(text, &sp, 4, &c);
    q.grammar_len = big + 1;
    lm_status s_over = engine_submit(e, &q, NULL, err, sizeof err);
    bool named = strstr(err, "262144") != NULL;
    q.grammar_len = big;
    lm_status s_at = engine_submit(e, &q, NULL, err, sizeof err);
    engine_wait_idle(e);
    free(text);
    engine_free(e);
    CHECK(s_over == LM_ERR_INVALID && named);
    CHECKF(s_at == LM_OK, "%s", err);
}

/* More distinct grammars than the engine keeps: each request still gets
 * its own, and its output follows it. */
static void test_many_grammars(void) {
    lm_engine *e = new_engine(8, 0);
    CHECK(e);
    lm_sample_params sp = sampling(1);
    enum { K = 12 };
    static collect c[K];
    static char g[K][128];
    memset(c, 0, sizeof c);
    char err[LM_ERRLEN];
    for (int k = 0; k < K; k++) {
        snprintf(g[k], sizeof g[k], "root ::= \"Once\" (\" \" [a-z]+){%d,%d} \".\"\n", 1 + k % 3, 2 + k);
        lm_request_params p = params(g[k], &sp, 60, &c[k]);
        CHECKF(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK, "%s", err);
    }
    engine_wait_idle(e);
    for (int k = 0; k < K; k++) {
        CHECK(c[k].done[0] == 1);
        int j = text_judge(g[k], c[k].tokens[0], c[k].n[0]);
        CHECKF(c[k].finish[0] == LM_FINISH_STOP ? j == 1 : j == 0, "grammar %d: judge %d", k, j);
    }
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    engine_free(e);
}

static lm_engine *new_engine_cache(size_t cache_bytes) {
    lm_engine_config ec;
    engine_config_default(&ec);
    ec.n_threads = 2;
    ec.batch_tokens = 64;
    ec.max_seqs = 8;
    ec.kv_type = LM_TYPE_F32;
    engine_tuning t = {.grammar_cache_bytes = cache_bytes};
    char err[LM_ERRLEN];
    lm_status st;
    lm_engine *e = engine_new_tuned(model, model->tok, &ec, &t, &st, err, sizeof err);
    if (!e) fprintf(stderr, "engine_new_tuned: %s\n", err);
    return e;
}

/* One request with grammar gbnf, run to the end; its text must follow the
 * grammar. */
static void run_one(lm_engine *e, const char *gbnf, uint64_t seed) {
    lm_sample_params sp = sampling(1);
    sp.seed = seed;
    static collect c;
    memset(&c, 0, sizeof c);
    char err[LM_ERRLEN];
    lm_request_params p = params(gbnf, &sp, 40, &c);
    CHECKF(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK, "%s", err);
    engine_wait_idle(e);
    CHECK(c.done[0] == 1);
    int j = text_judge(gbnf, c.tokens[0], c.n[0]);
    CHECKF(c.finish[0] == LM_FINISH_STOP ? j == 1 : j == 0, "judge %d", j);
}

static lm_engine_stats stats_of(lm_engine *e) {
    lm_engine_stats st;
    engine_stats(e, &st);
    return st;
}

/* The grammar cache: bounded in bytes (matchers' caches included), least
 * recently used dropped first, hits compile nothing. */
static void test_cache_bounded(void) {
    static char g[8][128];
    for (int k = 0; k < 8; k++) snprintf(g[k], sizeof g[k], "root ::= \"Once\" (\" \" [a-z]+){1,%d} \".\"\n", 3 + k);

    /* one grammar's size after use, with the default budget */
    lm_engine *e = new_engine_cache(0);
    CHECK(e);
    size_t one = 0;
    for (int k = 0; k < 3; k++) {
        run_one(e, g[k], 5);
        lm_engine_stats st = stats_of(e);
        CHECKF(st.grammar_cache_entries == k + 1 && st.grammar_compiles_total == (uint64_t)k + 1,
               "entries %lld compiles %llu", (long long)st.grammar_cache_entries,
               (unsigned long long)st.grammar_compiles_total);
        CHECK(st.grammar_cache_bytes > one);
        one = st.grammar_cache_bytes / (size_t)(k + 1) > one ? st.grammar_cache_bytes / (size_t)(k + 1) : one;
    }
    run_one(e, g[1], 6); /* kept: no compilation */
    CHECK(stats_of(e).grammar_compiles_total == 3 && stats_of(e).grammar_evictions_total == 0);
    engine_free(e);

    /* room for two: A, B, A again, then C drops B (least recently used), not A */
    size_t cap = one * 5 / 2;
    CHECK((e = new_engine_cache(cap)));
    run_one(e, g[0], 7);
    run_one(e, g[1], 7);
    run_one(e, g[0], 8);
    CHECK(stats_of(e).grammar_compiles_total == 2);
    run_one(e, g[2], 7);
    lm_engine_stats st = stats_of(e);
    CHECKF(st.grammar_compiles_total == 3 && st.grammar_evictions_total == 1 && st.grammar_cache_entries == 2,
           "compiles %llu evictions %llu entries %lld", (unsigned long long)st.grammar_compiles_total,
           (unsigned long long)st.grammar_evictions_total, (long long)st.grammar_cache_entries);
    run_one(e, g[0], 9); /* still kept */
    CHECK(stats_of(e).grammar_compiles_total == 3);
    run_one(e, g[1], 9); /* dropped: compiled again */
    CHECK(stats_of(e).grammar_compiles_total == 4);
    for (int k = 3; k < 8; k++) {
        run_one(e, g[k], 10);
        st = stats_of(e);
        CHECKF(st.grammar_cache_bytes <= cap, "%llu bytes kept, budget %zu", (unsigned long long)st.grammar_cache_bytes,
               cap);
    }
    CHECK(st.grammar_evictions_total >= 6);
    engine_free(e);

    /* a budget that holds one: grammars dropped while their requests run,
     * and (a budget of 1 byte) grammars never kept, still constrain them */
    for (int pass = 0; pass < 2; pass++) {
        CHECK((e = new_engine_cache(pass == 0 ? one * 3 / 2 : 1)));
        enum { K = 6 };
        static collect c[K];
        memset(c, 0, sizeof c);
        char err[LM_ERRLEN];
        lm_sample_params sp = sampling(1);
        for (int k = 0; k < K; k++) {
            lm_request_params p = params(g[k % 4], &sp, 60, &c[k]);
            CHECKF(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK, "%s", err);
        }
        engine_wait_idle(e);
        for (int k = 0; k < K; k++) {
            CHECK(c[k].done[0] == 1);
            int j = text_judge(g[k % 4], c[k].tokens[0], c[k].n[0]);
            CHECKF(c[k].finish[0] == LM_FINISH_STOP ? j == 1 : j == 0, "pass %d request %d: judge %d", pass, k, j);
        }
        st = stats_of(e);
        CHECKF(pass == 0 ? st.grammar_cache_entries <= 1 : st.grammar_cache_entries == 0, "pass %d: %lld kept", pass,
               (long long)st.grammar_cache_entries);
        CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
        engine_free(e);
    }
}

/* A highly ambiguous grammar: refused at submission when the probe finds
 * it; else the request ends with an error finish (LM_ERR_INVALID, saying
 * "too ambiguous") once generation reaches the ambiguous part, and the same
 * grammar is refused at submission from then on. Another request running
 * at the same time is not disturbed. */
typedef struct {
    atomic_int done;
    lm_finish finish;
    lm_status status;
    char error[LM_ERRLEN];
    int n;
} outcome;

static void on_outcome(void *user, const lm_event *ev) {
    outcome *o = user;
    if (ev->token >= 0) o->n++;
    if (ev->done) {
        o->finish = ev->finish;
        o->status = ev->status;
        if (ev->error) snprintf(o->error, sizeof o->error, "%s", ev->error);
        atomic_store(&o->done, 1);
    }
}

static void test_ambiguous(void) {
    lm_engine *e = new_engine(4, 0);
    CHECK(e);
    lm_sample_params sp = sampling(0);
    char err[LM_ERRLEN];
    outcome o = {0}, free_o = {0};
    lm_request_params p = params("root ::= r\nr ::= \"x\" r \"x\"? | \"x\" r (\"x\" \"x\")? | \"x\"\n", &sp, -1, NULL);
    p.on_event = on_outcome;
    p.user = &o;
    p.ignore_eos = true;
    double t0 = lm_now();
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_ERR_INVALID);
    CHECKF(strstr(err, "grammar: ") && strstr(err, "too ambiguous"), "%s", err);
    printf("  refused at submission in %.3f s: %s\n", lm_now() - t0, err);
    /* hidden behind a literal longer than the probe explores */
    const char *hidden = "root ::= \"Once upon a time there was a grammar that hid its ambiguity behind a long "
                         "literal, far past the states explored at submission:\" r\n"
                         "r ::= \"x\" r \"x\"? | \"x\" r (\"x\" \"x\")? | \"x\"\n";
    p.grammar = hidden;
    lm_request_params pf = params(NULL, &sp, 40, NULL);
    pf.on_event = on_outcome;
    pf.user = &free_o;
    pf.ignore_eos = true;
    t0 = lm_now();
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
    CHECK(engine_submit(e, &pf, NULL, err, sizeof err) == LM_OK);
    engine_wait_idle(e);
    CHECKF(o.done && o.finish == LM_FINISH_ERROR && o.status == LM_ERR_INVALID && strstr(o.error, "too ambiguous"),
           "finish %d status %d: %s", o.finish, o.status, o.error);
    printf("  ended while generating after %d tokens in %.3f s: %s\n", o.n, lm_now() - t0, o.error);
    CHECK(free_o.done && free_o.finish == LM_FINISH_LENGTH && free_o.n == 40);
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_ERR_INVALID);
    CHECKF(strstr(err, "grammar: ") && strstr(err, "too ambiguous"), "%s", err);
    engine_free(e);
}

int main(void) {
    kernels_init();
    char err[LM_ERRLEN];
    if (!(model = test_model_load())) return 1;
    ref_pool = pool_new(2);
    gvocab = grammar_vocab_new(model->tok, err, sizeof err);
    n_prompt = tok_encode(model->tok, "Once upon a time", 16, true, false, prompt, 8);
    if (!gvocab || n_prompt < 2 || n_prompt > 8) return 1;
    TEST_RUN(test_matches_reference);
    TEST_RUN(test_batch_fork_preemption);
    TEST_RUN(test_lazy);
    TEST_RUN(test_refused);
    TEST_RUN(test_many_grammars);
    TEST_RUN(test_cache_bounded);
    TEST_RUN(test_ambiguous);
    grammar_vocab_free(gvocab);
    pool_free(ref_pool);
    model_free(model);
    return TEST_DONE();
}
