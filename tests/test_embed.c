/*
 * test_embed.c - embeddings: pooling (model/embed.h) and embedding requests
 * in the engine (engine_embed.c), on the bundled model (F32 weights, F32 KV).
 *   - embed_pool against a float64 reference of the same rows: mean, CLS
 *     and last, whole and in pieces, started over at position 0; the
 *     pooling names and the resolution of a request's pooling;
 *   - an engine embedding equals the float64 pooling of the hidden states
 *     of one lone seqrun pass (rows after the final norm, lm_fwd.hid) within
 *     a relative L2 error of 1e-6 (the same rows; only the pooling's float
 *     rounding differs), for each pooling;
 *   - embeddings batched with generation requests and with each other are
 *     bit-identical to each alone (rows never interact; the mean sums the
 *     same rows in the same order), and the generations are unchanged;
 *   - 40 short inputs (80 tokens) submitted together run in one pass;
 *   - the mean over chunked prefill (a 7-token budget) equals one chunk's
 *     within 1e-6 relative L2; so does one preempted (by generations of
 *     a better priority growing in a tiny pool) and recomputed;
 *   - a long input of a non-causal model (one pass each) amid a stream of
 *     short ones that fills every pass ends before 150 more shorts are
 *     submitted (it ends after about 5-15; starved, it would wait for all
 *     600 of the stream);
 *   - no LM head rows, no prefix cache (nothing cached, no hit), no KV held
 *     afterwards (engine_check);
 *   - errors: a generative model with LM_POOL_DEFAULT, LM_POOL_NONE, an
 *     unknown pooling, n = 2, a prompt past the context;
 *   - post-pooling projections (gemma-embedding's dense_2, dense_3): the
 *     mean of random rows through an F32 (16 -> 40) then an F16 (40 -> 16)
 *     matrix, and through one alone (16 -> 24, the width embed_dim gives),
 *     against a float64 reference on the same (F16-rounded) weights within
 *     1e-6 relative L2; a chained matrix whose cols do not match is refused.
 */
#include <stdatomic.h>
#include <string.h>

#include "base/util.h"
#include "decode/sample.h"
#include "kernels/kernels.h"
#include "model/embed.h"
#include "model/forward.h"
#include "model/model.h"
#include "sched/engine.h"
#include "engine_test.h"
#include "test.h"

static lm_model *model;
static lm_pool *ref_pool;

#define MAX_E 1024

/* What one embedding request's events delivered. */
typedef struct {
    float v[MAX_E];
    int n_embedding;
    int n_tokens_events; /* token events (an embedding has none) */
    int done;
    lm_finish finish;
    lm_status status;
    lm_request_stats stats;
} ecollect;

static void on_embed(void *user, const lm_event *ev) {
    ecollect *c = user;
    if (!ev->done) {
        c->n_tokens_events++;
        return;
    }
    c->done++;
    c->finish = ev->finish;
    c->status = ev->status;
    c->stats = *ev->stats;
    c->n_embedding = ev->n_embedding;
    if (ev->embedding && ev->n_embedding <= MAX_E) memcpy(c->v, ev->embedding, (size_t)ev->n_embedding * sizeof *c->v);
}

/* Greedy generation's events. */
typedef struct {
    int32_t tokens[64];
    int n, done;
} gcollect;

static void on_gen(void *user, const lm_event *ev) {
    gcollect *c = user;
    if (ev->token >= 0 && c->n < 64) c->tokens[c->n++] = ev->token;
    if (ev->done) c->done++;
}

static void random_prompt(lm_rng *r, int32_t *p, int n) {
    p[0] = 1; /* BOS */
    for (int i = 1; i < n; i++) p[i] = 3 + (int32_t)(lm_rng_u64(r) % 509);
}

static lm_request_params embed_params(const int32_t *prompt, int n, int pooling, ecollect *c) {
    lm_request_params p;
    engine_request_params_default(&p);
    p.prompt = prompt;
    p.n_prompt = n;
    p.embed = true;
    p.pooling = pooling;
    p.on_event = on_embed;
    p.user = c;
    return p;
}

/* The float64 reference: the rows of one seqrun pass over the prompt
 * (after the final norm), pooled in double. 0, or -1. */
static int ref_embed(const int32_t *prompt, int n, int pooling, double *out) {
    char err[LM_ERRLEN];
    const int E = model->hp.n_embd;
    lm_seqrun *s = seqrun_new(model, ref_pool, 0, n, LM_TYPE_F32, err, sizeof err);
    float *hid = lm_malloc((size_t)n * (size_t)E * sizeof *hid);
    int rc = -1;
    if (s && hid) {
        s->fwd->hid = hid;
        rc = seqrun_forward(s, prompt, n, NULL, false, err, sizeof err);
        s->fwd->hid = NULL;
    }
    if (rc == 0) {
        int r0 = pooling == LM_POOL_LAST ? n - 1 : 0, r1 = pooling == LM_POOL_CLS ? 1 : pooling == LM_POOL_LAST ? n : n;
        for (int j = 0; j < E; j++) {
            double sum = 0;
            for (int i = r0; i < r1; i++) sum += hid[(size_t)i * E + j];
            out[j] = sum / (r1 - r0);
        }
    } else {
        fprintf(stderr, "reference: %s\n", err);
    }
    lm_free(hid);
    seqrun_free(s);
    return rc;
}

/* Submit one embedding and wait for it. */
static lm_status embed_one(lm_engine *e, const int32_t *prompt, int n, int pooling, ecollect *c) {
    memset(c, 0, sizeof *c);
    lm_request_params p = embed_params(prompt, n, pooling, c);
    char err[LM_ERRLEN];
    lm_status st = engine_submit(e, &p, NULL, err, sizeof err);
    if (st == LM_OK) engine_wait_idle(e);
    return st;
}

static void test_pool_reference(void) {
    enum { E = 13, N = 23 };
    float rows[N * E];
    lm_rng r;
    lm_rng_seed(&r, 7);
    for (int i = 0; i < N * E; i++) rows[i] = (float)((double)(lm_rng_u64(&r) % 20001) / 1000.0 - 10.0);
    const int pools[3] = {LM_POOL_MEAN, LM_POOL_CLS, LM_POOL_LAST};
    for (int k = 0; k < 3; k++) {
        double ref[E];
        for (int j = 0; j < E; j++) {
            double s = 0;
            if (pools[k] == LM_POOL_MEAN)
                for (int i = 0; i < N; i++) s += rows[i * E + j];
            ref[j] = pools[k] == LM_POOL_MEAN ? s / N : rows[(pools[k] == LM_POOL_CLS ? 0 : N - 1) * E + j];
        }
        embed_pool *p = embed_pool_new(pools[k], E);
        CHECK(p);
        CHECK(embed_pool_finish(p) == NULL); /* nothing pooled yet */
        /* garbage first, then a start over at position 0 in pieces of 1, 5 and the rest */
        embed_pool_add(p, rows + 3 * E, E, 4, 0);
        embed_pool_add(p, rows, E, 1, 0);
        embed_pool_add(p, rows + E, E, 5, 1);
        embed_pool_add(p, rows + 6 * E, E, N - 6, 6);
        const float *v = embed_pool_finish(p);
        CHECK(v);
        CHECKF(test_rel_l2(v, ref, E) < 1e-7, "pooling %s: rel L2 %g", embed_pooling_name(pools[k]),
               test_rel_l2(v, ref, E));
        /* whole, in one piece (with a stride wider than a row) */
        float wide[N * (E + 2)];
        for (int i = 0; i < N; i++) memcpy(wide + i * (E + 2), rows + i * E, E * sizeof *wide);
        embed_pool_add(p, wide, E + 2, N, 0);
        CHECK(test_rel_l2(embed_pool_finish(p), ref, E) < 1e-7);
        embed_pool_free(p);
    }
    CHECK(embed_pool_new(LM_POOL_NONE, E) == NULL);
    CHECK(embed_pool_new(LM_POOL_DEFAULT, E) == NULL);
    CHECK(embed_pool_new(LM_POOL_MEAN, 0) == NULL);
    for (int pl = LM_POOL_DEFAULT; pl <= LM_POOL_LAST; pl++) CHECK(embed_pooling_parse(embed_pooling_name(pl)) == pl);
    CHECK(embed_pooling_parse("max") == -2 && embed_pooling_name(9) == NULL);
    char err[LM_ERRLEN] = "";
    CHECK(embed_pooling_resolve(LM_POOL_DEFAULT, LM_POOL_NONE, err, sizeof err) < 0 && strstr(err, "generative"));
    CHECK(embed_pooling_resolve(LM_POOL_DEFAULT, LM_POOL_LAST, err, sizeof err) == LM_POOL_LAST);
    CHECK(embed_pooling_resolve(LM_POOL_CLS, LM_POOL_LAST, err, sizeof err) == LM_POOL_CLS);
    CHECK(embed_pooling_resolve(LM_POOL_NONE, LM_POOL_MEAN, err, sizeof err) < 0);
    CHECK(embed_pooling_resolve(4, LM_POOL_MEAN, err, sizeof err) < 0);
}

/* The engine's embedding of a prompt alone against the float64 reference. */
static void test_engine_vs_reference(void) {
    const int E = model->hp.n_embd;
    CHECK(E <= MAX_E);
    lm_engine *e = test_engine_new(model, 512, 8, 0);
    CHECK(e);
    int32_t prompt[37];
    lm_rng r;
    lm_rng_seed(&r, 11);
    random_prompt(&r, prompt, 37);
    const int pools[3] = {LM_POOL_MEAN, LM_POOL_CLS, LM_POOL_LAST};
    static ecollect c;
    double ref[MAX_E];
    for (int k = 0; k < 3; k++) {
        CHECK(ref_embed(prompt, 37, pools[k], ref) == 0);
        CHECK(embed_one(e, prompt, 37, pools[k], &c) == LM_OK);
        CHECK(c.done == 1 && c.finish == LM_FINISH_STOP && c.status == LM_OK && c.n_tokens_events == 0);
        CHECK(c.n_embedding == E);
        CHECK(c.stats.prompt_tokens == 37 && c.stats.completion_tokens == 0 && c.stats.cached_tokens == 0);
        double rel = test_rel_l2(c.v, ref, (size_t)E);
        CHECKF(rel < 1e-6, "pooling %s: rel L2 %g", embed_pooling_name(pools[k]), rel);
    }
    /* the same prompt again: no prefix cache hit, nothing was cached */
    CHECK(embed_one(e, prompt, 37, LM_POOL_MEAN, &c) == LM_OK && c.stats.cached_tokens == 0);
    lm_engine_stats st;
    engine_stats(e, &st);
    CHECKF(st.kv_blocks_cached == 0 && st.prefix_hits_total == 0, "cached %lld hits %llu",
           (long long)st.kv_blocks_cached, (unsigned long long)st.prefix_hits_total);
    CHECK(st.generation_tokens_total == 0);
    char err[LM_ERRLEN];
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    /* a model with a pooling of its own: LM_POOL_DEFAULT takes it */
    model->hp.pooling = LM_POOL_LAST;
    CHECK(ref_embed(prompt, 37, LM_POOL_LAST, ref) == 0);
    lm_status dst = embed_one(e, prompt, 37, LM_POOL_DEFAULT, &c);
    model->hp.pooling = LM_POOL_NONE;
    CHECK(dst == LM_OK && c.finish == LM_FINISH_STOP);
    CHECK(test_rel_l2(c.v, ref, (size_t)E) < 1e-6);
    engine_free(e);
}

/* Embeddings among generations and among each other: the same bits as alone. */
static void test_batched_equals_alone(void) {
    const int E = model->hp.n_embd;
    enum { NE = 6, NG = 3 };
    static int32_t prompts[NE][50], gprompts[NG][20];
    int lens[NE] = {50, 3, 17, 1, 33, 9};
    int pools[NE] = {LM_POOL_MEAN, LM_POOL_LAST, LM_POOL_CLS, LM_POOL_MEAN, LM_POOL_LAST, LM_POOL_MEAN};
    lm_rng r;
    lm_rng_seed(&r, 5);
    for (int i = 0; i < NE; i++) random_prompt(&r, prompts[i], lens[i]);
    for (int i = 0; i < NG; i++) random_prompt(&r, gprompts[i], 20);
    static ecollect alone[NE], batched[NE];
    static gcollect galone[NG], gbatched[NG];
    lm_engine *e = test_engine_new(model, 64, 16, 0);
    CHECK(e);
    char err[LM_ERRLEN];
    for (int i = 0; i < NE; i++) CHECK(embed_one(e, prompts[i], lens[i], pools[i], &alone[i]) == LM_OK);
    lm_request_params gp;
    engine_request_params_default(&gp);
    gp.sp.temp = 0;
    gp.max_tokens = 24;
    gp.on_event = on_gen;
    gp.n_prompt = 20;
    for (int i = 0; i < NG; i++) {
        gp.prompt = gprompts[i];
        gp.user = &galone[i];
        CHECK(engine_submit(e, &gp, NULL, err, sizeof err) == LM_OK);
        engine_wait_idle(e);
    }
    /* now all at once, generations first so the embeddings join running decodes */
    for (int i = 0; i < NG; i++) {
        gp.prompt = gprompts[i];
        gp.user = &gbatched[i];
        CHECK(engine_submit(e, &gp, NULL, err, sizeof err) == LM_OK);
    }
    for (int i = 0; i < NE; i++) {
        lm_request_params p = embed_params(prompts[i], lens[i], pools[i], &batched[i]);
        CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
    }
    engine_wait_idle(e);
    for (int i = 0; i < NE; i++) {
        CHECK(alone[i].done == 1 && batched[i].done == 1 && batched[i].finish == LM_FINISH_STOP);
        CHECK(batched[i].n_embedding == E);
        CHECKF(!memcmp(alone[i].v, batched[i].v, (size_t)E * sizeof(float)), "embedding %d differs batched", i);
    }
    for (int i = 0; i < NG; i++) {
        CHECK(galone[i].n > 0 && galone[i].n == gbatched[i].n);
        CHECKF(!memcmp(galone[i].tokens, gbatched[i].tokens, (size_t)galone[i].n * sizeof(int32_t)),
               "generation %d differs beside embeddings", i);
    }
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    engine_free(e);
}

/* 40 short inputs submitted together (from a callback on the engine
 * thread, so all are queued before the next iteration) run in one pass. */
enum { N_SHORT = 40 };
static int32_t short_prompts[N_SHORT][8];
static ecollect short_out[N_SHORT];
static lm_engine *short_engine;
static atomic_int short_submit_fail;

static void on_first(void *user, const lm_event *ev) {
    if (!ev->done) return;
    char err[LM_ERRLEN];
    for (int i = 0; i < N_SHORT; i++) {
        lm_request_params p = embed_params(short_prompts[i], 1 + i % 3, LM_POOL_MEAN, &short_out[i]);
        if (engine_submit(short_engine, &p, NULL, err, sizeof err) != LM_OK) atomic_fetch_add(&short_submit_fail, 1);
    }
}

static void test_many_short_one_pass(void) {
    const int E = model->hp.n_embd;
    lm_rng r;
    lm_rng_seed(&r, 9);
    for (int i = 0; i < N_SHORT; i++) random_prompt(&r, short_prompts[i], 8);
    lm_engine *e = short_engine = test_engine_new(model, 512, 64, 0);
    CHECK(e);
    static ecollect first;
    memset(&first, 0, sizeof first);
    memset(short_out, 0, sizeof short_out);
    lm_request_params p = embed_params(short_prompts[0], 4, LM_POOL_MEAN, &first);
    p.on_event = on_first;
    char err[LM_ERRLEN];
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
    engine_wait_idle(e);
    CHECK(atomic_load(&short_submit_fail) == 0);
    lm_engine_stats st;
    engine_stats(e, &st);
    CHECKF(st.iterations == 2, "%llu iterations, %llu seqs (want the first request's and one for all 40)",
           (unsigned long long)st.batch_seqs_total, (unsigned long long)st.iterations);
    double ref[MAX_E];
    for (int i = 0; i < N_SHORT; i++) {
        CHECK(short_out[i].done == 1 && short_out[i].finish == LM_FINISH_STOP);
        CHECK(ref_embed(short_prompts[i], 1 + i % 3, LM_POOL_MEAN, ref) == 0);
        CHECKF(test_rel_l2(short_out[i].v, ref, (size_t)E) < 1e-6, "input %d", i);
    }
    engine_free(e);
}

/* Mean pooling over 7-token chunks equals one chunk's, and preempted
 * embeddings in a tiny pool still give it. */
static void test_chunks_and_preemption(void) {
    const int E = model->hp.n_embd;
    int32_t prompt[90];
    lm_rng r;
    lm_rng_seed(&r, 13);
    random_prompt(&r, prompt, 90);
    static ecollect whole, chunked;
    lm_engine *e1 = test_engine_new(model, 512, 8, 0), *e7 = test_engine_new(model, 7, 4, 0);
    CHECK(e1 && e7);
    CHECK(embed_one(e1, prompt, 90, LM_POOL_MEAN, &whole) == LM_OK && whole.finish == LM_FINISH_STOP);
    CHECK(embed_one(e7, prompt, 90, LM_POOL_MEAN, &chunked) == LM_OK && chunked.finish == LM_FINISH_STOP);
    double ref[MAX_E];
    for (int j = 0; j < E; j++) ref[j] = whole.v[j];
    double rel = test_rel_l2(chunked.v, ref, (size_t)E);
    CHECKF(rel < 1e-6, "chunked mean rel L2 %g", rel);
    engine_free(e1);
    engine_free(e7);
    /* a pool of 13 blocks of 16 positions: two generations of 40 + 30 tokens
     * (priority 0) grow into the blocks of the embedding (priority 1), which
     * is preempted and recomputed from position 0 */
    lm_engine *e = test_engine_new(model, 8, 4,
                                   (uint64_t)13 * 16 * model->hp.n_layer * model->hp.n_head_kv * model->hp.head_dim *
                                       2 * sizeof(float));
    CHECK(e);
    lm_engine_stats st;
    engine_stats(e, &st);
    CHECKF(st.kv_blocks_total == 13, "%lld blocks", (long long)st.kv_blocks_total);
    static int32_t gprompt[2][40];
    static gcollect gen[2];
    static ecollect pre;
    memset(gen, 0, sizeof gen);
    memset(&pre, 0, sizeof pre);
    char err[LM_ERRLEN];
    for (int i = 0; i < 2; i++) {
        random_prompt(&r, gprompt[i], 40);
        lm_request_params gp;
        engine_request_params_default(&gp);
        gp.sp.temp = 0;
        gp.ignore_eos = true;
        gp.max_tokens = 30;
        gp.on_event = on_gen;
        gp.user = &gen[i];
        gp.prompt = gprompt[i];
        gp.n_prompt = 40;
        CHECK(engine_submit(e, &gp, NULL, err, sizeof err) == LM_OK);
    }
    lm_request_params p = embed_params(prompt, 90, LM_POOL_MEAN, &pre);
    p.priority = 1;
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
    engine_wait_idle(e);
    CHECK(gen[0].done == 1 && gen[1].done == 1 && gen[0].n == 30);
    CHECK(pre.done == 1 && pre.finish == LM_FINISH_STOP);
    CHECKF(pre.stats.preemptions >= 1, "the embedding was not preempted");
    rel = test_rel_l2(pre.v, ref, (size_t)E);
    CHECKF(rel < 1e-6, "preempted %d times: rel L2 %g", pre.stats.preemptions, rel);
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    engine_free(e);
}

/* Fairness of the one-pass rule: a long input of a non-causal model waits
 * for a pass with room for all of it, amid a stream of short inputs that
 * keeps every pass full (each short's end submits the next); it must still
 * end within a bounded number of passes (the scheduler holds it: sched.h).
 * The stream comes from five clients, the long input from a sixth. The
 * bundled model is run as a
 * non-causal one (hp.causal false: whole-sequence attention, each input in
 * one pass); only the scheduling is checked here. */
enum { FAIR_STREAM = 24, FAIR_CAP = 600, FAIR_LONG = 30 };
static int32_t fair_prompt[FAIR_LONG];
static ecollect fair_short[FAIR_CAP], fair_long;
static lm_engine *fair_engine;
static atomic_int fair_next, fair_fail, fair_long_done;
static atomic_ullong fair_passes;

static void fair_submit(void);

static void on_fair_short(void *user, const lm_event *ev) {
    on_embed(user, ev);
    if (ev->done && !atomic_load(&fair_long_done)) fair_submit();
}

static void on_fair_long(void *user, const lm_event *ev) {
    on_embed(user, ev);
    if (!ev->done) return;
    lm_engine_stats st;
    engine_stats(fair_engine, &st);
    atomic_store(&fair_passes, st.iterations);
    atomic_store(&fair_long_done, 1);
}

static void fair_submit(void) {
    int i = atomic_fetch_add(&fair_next, 1);
    if (i >= FAIR_CAP) return;
    lm_request_params p = embed_params(fair_prompt, 4 + i % 3, LM_POOL_MEAN, &fair_short[i]);
    p.on_event = on_fair_short;
    p.client = 1 + (uint64_t)(i % 5);
    char err[LM_ERRLEN];
    if (engine_submit(fair_engine, &p, NULL, err, sizeof err) != LM_OK) atomic_fetch_add(&fair_fail, 1);
}

static void test_long_not_starved(void) {
    lm_rng r;
    lm_rng_seed(&r, 21);
    random_prompt(&r, fair_prompt, FAIR_LONG);
    model->hp.causal = false;
    lm_engine *e = fair_engine = test_engine_new(model, 32, 16, 0);
    CHECK(e);
    memset(fair_short, 0, sizeof fair_short);
    memset(&fair_long, 0, sizeof fair_long);
    atomic_store(&fair_next, 0);
    atomic_store(&fair_long_done, 0);
    for (int i = 0; i < FAIR_STREAM; i++) fair_submit();
    lm_request_params p = embed_params(fair_prompt, FAIR_LONG, LM_POOL_MEAN, &fair_long);
    p.on_event = on_fair_long;
    p.client = 7;
    char err[LM_ERRLEN];
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
    int before = atomic_load(&fair_next);
    engine_wait_idle(e);
    model->hp.causal = true;
    CHECK(atomic_load(&fair_fail) == 0);
    CHECK(fair_long.done == 1 && fair_long.finish == LM_FINISH_STOP);
    int after = atomic_load(&fair_next) - before;
    CHECKF(after < FAIR_CAP / 4, "%d shorts submitted after the long input before it ended (%llu passes)", after,
           (unsigned long long)atomic_load(&fair_passes));
    int n_sent = atomic_load(&fair_next) < FAIR_CAP ? atomic_load(&fair_next) : FAIR_CAP;
    for (int i = 0; i < n_sent; i++) CHECKF(fair_short[i].done == 1, "short input %d did not end", i);
    lm_engine_stats st;
    engine_stats(e, &st);
    printf("long input: %d shorts after it, done at pass %llu of %llu\n", after,
           (unsigned long long)atomic_load(&fair_passes), (unsigned long long)st.iterations);
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    engine_free(e);
}

static void test_errors(void) {
    lm_engine *e = test_engine_new(model, 64, 4, 0);
    CHECK(e);
    int32_t prompt[4] = {1, 20, 30, 40};
    static ecollect c;
    char err[LM_ERRLEN] = "";
    lm_request_params p = embed_params(prompt, 4, LM_POOL_DEFAULT, &c);
    CHECK(model->hp.pooling == LM_POOL_NONE); /* the bundled model is a chat model */
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_ERR_INVALID && strstr(err, "generative"));
    p.pooling = LM_POOL_NONE;
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_ERR_INVALID);
    p.pooling = 17;
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_ERR_INVALID);
    p.pooling = LM_POOL_MEAN;
    p.n = 2;
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_ERR_INVALID);
    p.n = 1;
    p.n_prompt = 0;
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_ERR_INVALID);
    int n_ctx = engine_n_ctx(e);
    int32_t *big = lm_calloc((size_t)n_ctx + 1, sizeof *big);
    CHECK(big);
    big[0] = 1;
    p.prompt = big;
    p.n_prompt = n_ctx + 1;
    lm_status st = engine_submit(e, &p, NULL, err, sizeof err);
    /* a prompt of exactly n_ctx tokens fits (nothing is generated) */
    p.n_prompt = n_ctx;
    memset(&c, 0, sizeof c);
    lm_status st2 = engine_submit(e, &p, NULL, err, sizeof err);
    engine_wait_idle(e);
    lm_free(big);
    CHECK(st == LM_ERR_TOO_LONG);
    CHECKF(st2 == LM_OK && c.done == 1 && c.finish == LM_FINISH_STOP, "%s", err);
    /* sampling fields are ignored: max_tokens 0, a bad grammar, stop strings */
    const char *stop[1] = {""};
    p = embed_params(prompt, 4, LM_POOL_LAST, &c);
    p.max_tokens = 0;
    p.grammar = "root ::= (";
    p.stop = stop;
    p.n_stop = 1;
    memset(&c, 0, sizeof c);
    CHECKF(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK, "%s", err);
    engine_wait_idle(e);
    CHECK(c.done == 1 && c.finish == LM_FINISH_STOP && c.n_embedding == model->hp.n_embd);
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    engine_free(e);
}

/* y = W·x in double over the weights' stored values */
static void ref_project(const float *w, int rows, int cols, const double *x, double *y) {
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++) s += (double)w[(size_t)r * cols + c] * x[c];
        y[r] = s;
    }
}

static void test_projections(void) {
    enum { E = 16, D = 40, D1 = 24, N = 5 };
    lm_rng g;
    lm_rng_seed(&g, 7);
    float rows[N * E], w2[D * E], w3[E * D], w1[D1 * E];
    uint16_t w3h[E * D];
    for (int i = 0; i < N * E; i++) rows[i] = lm_rng_normal(&g);
    for (int i = 0; i < D * E; i++) w2[i] = lm_rng_normal(&g) * 0.25f;
    for (int i = 0; i < D1 * E; i++) w1[i] = lm_rng_normal(&g) * 0.25f;
    for (int i = 0; i < E * D; i++) {
        w3h[i] = lm_f32_to_f16(lm_rng_normal(&g) * 0.15f);
        w3[i] = lm_f16_to_f32(w3h[i]);
    }
    lm_weight d2 = {.data = w2, .type = LM_TYPE_F32, .rows = D, .cols = E, .row_bytes = E * sizeof(float)};
    lm_weight d3 = {.data = w3h, .type = LM_TYPE_F16, .rows = E, .cols = D, .row_bytes = D * sizeof(uint16_t)};
    lm_weight d1 = {.data = w1, .type = LM_TYPE_F32, .rows = D1, .cols = E, .row_bytes = E * sizeof(float)};
    double mean[E] = {0}, h[D], want[D1 > E ? D1 : E];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < E; j++) mean[j] += rows[i * E + j] / (double)N;
    for (int k = 0; k < 2; k++) {
        embed_pool *p = embed_pool_new(LM_POOL_MEAN, E);
        CHECK(p != NULL);
        CHECK(embed_pool_project(p, k ? &d1 : &d2, k ? NULL : &d3) == 0);
        CHECK(p->n_out == (k ? D1 : E));
        embed_pool_add(p, rows, E, 2, 0);
        embed_pool_add(p, rows + 2 * E, E, N - 2, 2);
        const float *v = embed_pool_finish(p);
        if (k) {
            ref_project(w1, D1, E, mean, want);
        } else {
            ref_project(w2, D, E, mean, h);
            ref_project(w3, E, D, h, want);
        }
        double num = 0, den = 0;
        for (int j = 0; j < p->n_out; j++) num += (v[j] - want[j]) * (v[j] - want[j]), den += want[j] * want[j];
        CHECK(sqrt(num / den) < 1e-6);
        embed_pool_free(p);
    }
    embed_pool *p = embed_pool_new(LM_POOL_MEAN, E);
    CHECK(embed_pool_project(p, &d1, &d3) == -1); /* dense_3's 40 cols after 24 rows */
    embed_pool_free(p);
}

int main(void) {
    kernels_init();
    if (!(model = test_model_load())) return 1;
    ref_pool = pool_new(2);
    TEST_RUN(test_pool_reference);
    TEST_RUN(test_engine_vs_reference);
    TEST_RUN(test_batched_equals_alone);
    TEST_RUN(test_many_short_one_pass);
    TEST_RUN(test_chunks_and_preemption);
    TEST_RUN(test_long_not_starved);
    TEST_RUN(test_errors);
    TEST_RUN(test_projections);
    model_free(model);
    pool_free(ref_pool);
    return TEST_DONE();
}
