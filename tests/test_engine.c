/*
 * test_engine.c - the continuous-batching engine on the bundled model (F32
 * weights) and on Q8_0 / Q4_0 copies of it:
 *   - a greedy request gives the tokens of the single-sequence generator
 *     (seqrun_forward + argmax), alone and among 1, 7 or 31 others;
 *   - chunked prefill (a budget of 7 tokens per iteration) gives logits
 *     bit-identical to whole-prompt prefill, at the forward level and as the
 *     engine's reported logprobs;
 *   - concurrent submitters with random lengths and cancels: every request
 *     gets exactly one final event, uncancelled outputs equal their solo
 *     outputs, no KV block leaks;
 *   - preemption under a tiny pool completes every request with its solo
 *     output; priorities order admission; stop strings, n > 1 forks,
 *     rejections, and shutdown with requests in flight;
 *   - every finish reason with its status (an error carries LM_ERR_INVALID
 *     when a logit_bias bans every token) and the context rule;
 *   - a sliding-window model (swa_model.h: window 8), whose pool keeps only
 *     the local blocks a window can see: requests many windows long, alone,
 *     together, preempted in a small pool, forked (n = 2) and served from
 *     the prefix cache, give the tokens of the single-sequence generator
 *     over a pool that keeps every layer's positions; no block of either
 *     class leaks.
 * Outputs are compared exactly: the kernels' summation order is fixed per
 * row, so the batch a row shares a pass with cannot change its bits.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "sched/engine.h"
#include "model/forward.h"
#include "model/model.h"
#include "format/quant.h"
#include "kernels/kernels.h"
#include "format/quantize.h"
#include "decode/sample.h"
#include "swa_model.h"
#include "engine_test.h"
#include "test.h"
#include "base/util.h"

static lm_model *models[3]; /* F32, Q8_0, Q4_0 */
static lm_model *swa;       /* gemma3 variant of models[0], window 8 on 4 of 5 layers */
static const char *model_names[3] = {"F32", "Q8_0", "Q4_0"};
static lm_pool *ref_pool;

#define MAX_OUT 128

/* What one request's events delivered. */
typedef struct {
    int32_t tokens[4][MAX_OUT];
    float logprobs[4][MAX_OUT];
    int n[4];
    char text[4][2048];
    size_t text_len[4];
    int done[4];
    lm_finish finish[4];
    lm_status status[4];
    bool has_error[4];
    lm_request_stats stats[4];
    atomic_int n_done;
    int order; /* finish order (priority test) */
} collect;

static atomic_int finish_counter;

static void on_event(void *user, const lm_event *ev) {
    collect *c = user;
    int i = ev->index;
    if (ev->token >= 0 && c->n[i] < MAX_OUT) {
        c->logprobs[i][c->n[i]] = ev->logprob;
        c->tokens[i][c->n[i]++] = ev->token;
    }
    if (ev->text_len && c->text_len[i] + ev->text_len < sizeof c->text[i]) {
        memcpy(c->text[i] + c->text_len[i], ev->text, ev->text_len);
        c->text_len[i] += ev->text_len;
    }
    if (ev->done) {
        c->done[i]++;
        c->finish[i] = ev->finish;
        c->status[i] = ev->status;
        c->has_error[i] = ev->error != NULL;
        c->stats[i] = *ev->stats;
        c->order = atomic_fetch_add(&finish_counter, 1);
        atomic_fetch_add(&c->n_done, 1);
    }
}

/* Greedy decoding of s (empty) from prompt, up to max_tokens. */
static int greedy_on(lm_seqrun *s, const lm_model *m, const int32_t *prompt, int n_prompt, int max_tokens,
                     int32_t *out) {
    char err[LM_ERRLEN];
    float *logits = lm_malloc((size_t)m->hp.n_vocab * sizeof *logits);
    int n = 0;
    if (seqrun_forward(s, prompt, n_prompt, logits, false, err, sizeof err) != 0) n = -1;
    while (n >= 0 && n < max_tokens) {
        int32_t t = sample_argmax(logits, m->hp.n_vocab);
        out[n++] = t;
        if (tok_is_eog(m->tok, t) || n == max_tokens || s->n_past + 1 >= s->n_ctx) break;
        if (seqrun_forward(s, &t, 1, logits, false, err, sizeof err) != 0) n = -1;
    }
    lm_free(logits);
    return n;
}

/* Greedy reference through the single-sequence path. */
static int solo_greedy(const lm_model *m, const int32_t *prompt, int n_prompt, int max_tokens, int32_t *out) {
    char err[LM_ERRLEN];
    lm_seqrun *s = seqrun_new(m, ref_pool, 0, 64, LM_TYPE_F32, err, sizeof err);
    if (!s) return -1;
    int n = greedy_on(s, m, prompt, n_prompt, max_tokens, out);
    seqrun_free(s);
    return n;
}

/* The same over a pool keeping every layer's positions (no local class). */
static int solo_greedy_keep_all(const lm_model *m, const int32_t *prompt, int n_prompt, int max_tokens, int32_t *out) {
    char err[LM_ERRLEN];
    kv_config kc;
    kv_config_init(&kc, m->hp.n_layer, m->hp.n_head_kv, m->hp.head_dim);
    kc.type = LM_TYPE_F32;
    kc.n_ctx = m->hp.n_ctx_train;
    kv_pool *kv = kv_pool_new(&kc, err, sizeof err);
    lm_seqrun *s = kv ? seqrun_new_shared(m, ref_pool, kv, 0, 64, err, sizeof err) : NULL;
    int n = s ? greedy_on(s, m, prompt, n_prompt, max_tokens, out) : -1;
    seqrun_free(s);
    kv_pool_free(kv);
    return n;
}

static void random_prompt(lm_rng *r, int32_t *p, int n) {
    p[0] = 1; /* BOS */
    for (int i = 1; i < n; i++) p[i] = 3 + (int32_t)(lm_rng_u64(r) % 509);
}

static lm_request_params greedy_params(const int32_t *prompt, int n, int max_tokens, collect *c) {
    lm_request_params p;
    engine_request_params_default(&p);
    p.prompt = prompt;
    p.n_prompt = n;
    p.max_tokens = max_tokens;
    p.sp.temp = 0;
    p.ignore_eos = false;
    p.on_event = on_event;
    p.user = c;
    return p;
}

/* The same greedy requests alone and among 1, 7, 31 others, for each
 * weight type: token-identical to the single-sequence generator. */
static void test_batch_invariance(void) {
    enum { N = 32 };
    static int32_t prompts[N][40];
    static int lens[N], maxt[N];
    static int32_t ref[N][MAX_OUT];
    static int n_ref[N];
    lm_rng r;
    lm_rng_seed(&r, 7);
    for (int i = 0; i < N; i++) {
        lens[i] = 2 + (int)(lm_rng_u64(&r) % 38);
        maxt[i] = 4 + (int)(lm_rng_u64(&r) % 40);
        random_prompt(&r, prompts[i], lens[i]);
    }
    for (int mi = 0; mi < 3; mi++) {
        const lm_model *m = models[mi];
        for (int i = 0; i < N; i++) {
            n_ref[i] = solo_greedy(m, prompts[i], lens[i], maxt[i], ref[i]);
            CHECK(n_ref[i] > 0);
        }
        lm_engine *e = test_engine_new(m, 64, 32, 0);
        CHECK(e);
        static collect col[N], solo[N];
        static const int groups[] = {1, 2, 8, 32};
        char err0[LM_ERRLEN];
        for (int i = 0; i < N; i++) { /* each alone through the engine, for its logprobs */
            memset(&solo[i], 0, sizeof solo[i]);
            lm_request_params p = greedy_params(prompts[i], lens[i], maxt[i], &solo[i]);
            p.logprobs = true;
            CHECKF(engine_submit(e, &p, NULL, err0, sizeof err0) == LM_OK, "%s", err0);
            engine_wait_idle(e);
        }
        for (int gi = 0; gi < 4; gi++) {
            int g = groups[gi];
            memset(col, 0, sizeof col);
            char err[LM_ERRLEN];
            for (int i = 0; i < g; i++) {
                lm_request_params p = greedy_params(prompts[i], lens[i], maxt[i], &col[i]);
                p.logprobs = true;
                CHECKF(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK, "%s", err);
            }
            engine_wait_idle(e);
            for (int i = 0; i < g; i++) {
                CHECKF(col[i].done[0] == 1, "%s, group %d, request %d: %d final events", model_names[mi], g, i,
                       col[i].done[0]);
                CHECKF(col[i].n[0] == n_ref[i] && !memcmp(col[i].tokens[0], ref[i], (size_t)n_ref[i] * 4),
                       "%s, request %d among %d: %d tokens vs %d alone", model_names[mi], i, g, col[i].n[0], n_ref[i]);
                CHECK(col[i].stats[0].completion_tokens == n_ref[i]);
                /* the logits themselves, not just their argmax, are the same bits */
                CHECKF(!memcmp(col[i].logprobs[0], solo[i].logprobs[0], (size_t)n_ref[i] * sizeof(float)),
                       "%s, request %d among %d: logprobs differ from its solo run", model_names[mi], i, g);
                CHECK(col[i].stats[0].prompt_tokens == lens[i]);
            }
        }
        lm_engine_stats st;
        engine_stats(e, &st);
        CHECKF(st.batch_seqs_total > st.iterations, "mean batch %.2f", (double)st.batch_seqs_total / st.iterations);
        char err[LM_ERRLEN];
        CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
        engine_free(e);
    }
}

/* Sampled requests drawn on the thread pool (many plain rows per
 * iteration) take the same tokens as each run alone (one row: drawn
 * serially): seeded samplers with no truncation (every token weighed), the
 * defaults (top-k 40, top-p, min-p), penalties, and beside them rows that
 * stay serial (log-probabilities, greedy, n = 2 forks). */
static void test_pool_sampling(void) {
    enum { N = 24 };
    static int32_t prompts[N][24];
    static int lens[N];
    static collect alone[N], group[N];
    lm_rng r;
    lm_rng_seed(&r, 19);
    for (int i = 0; i < N; i++) {
        lens[i] = 2 + (int)(lm_rng_u64(&r) % 20);
        random_prompt(&r, prompts[i], lens[i]);
    }
    const lm_model *m = models[0];
    lm_engine *e = test_engine_new(m, 256, 32, 0);
    CHECK(e);
    for (int pass = 0; pass < 2; pass++) {
        collect *col = pass ? group : alone;
        memset(col, 0, sizeof(collect) * N);
        for (int i = 0; i < N; i++) {
            lm_request_params p = greedy_params(prompts[i], lens[i], 24, &col[i]);
            p.ignore_eos = true;
            sample_params_default(&p.sp);
            p.sp.seed = 1000 + (uint64_t)i;
            p.sp.temp = i % 6 == 5 ? 0.0f : 0.9f;
            if (i % 3 == 0) p.sp.top_k = 0, p.sp.top_p = 1.0f, p.sp.min_p = 0.0f;
            if (i % 4 == 1) p.sp.repeat_penalty = 1.3f, p.sp.presence_penalty = 0.5f;
            if (i % 7 == 2) p.logprobs = true;
            if (i % 8 == 3) p.n = 2;
            char err[LM_ERRLEN];
            CHECKF(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK, "%s", err);
            if (!pass) engine_wait_idle(e);
        }
        engine_wait_idle(e);
    }
    for (int i = 0; i < N; i++)
        for (int k = 0; k < (i % 8 == 3 ? 2 : 1); k++)
            CHECKF(alone[i].done[k] == 1 && group[i].done[k] == 1 && alone[i].n[k] == 24 && group[i].n[k] == 24 &&
                       !memcmp(alone[i].tokens[k], group[i].tokens[k], 24 * sizeof(int32_t)),
                   "request %d choice %d: %d tokens alone, %d in the group, or different ones", i, k, alone[i].n[k],
                   group[i].n[k]);
    lm_engine_stats st;
    engine_stats(e, &st);
    CHECKF(st.batch_seqs_total > 4 * st.iterations / 3, "mean batch %.2f",
           (double)st.batch_seqs_total / (double)st.iterations);
    engine_free(e);
}

/* Chunked prefill: one prompt run whole, and in chunks of 7 interleaved
 * with another sequence's decode, gives bit-identical logits. */
static void test_chunked_prefill_logits(void) {
    const lm_model *m = models[0];
    int V = m->hp.n_vocab, n = 45;
    int32_t prompt[45], other[3] = {1, 50, 60};
    lm_rng r;
    lm_rng_seed(&r, 3);
    random_prompt(&r, prompt, n);
    char err[LM_ERRLEN];
    kv_config kc;
    kv_config_init(&kc, m->hp.n_layer, m->hp.n_head_kv, m->hp.head_dim);
    kc.type = LM_TYPE_F32;
    kc.n_ctx = 128;
    kc.n_seqs = 4;
    kv_pool *kv = kv_pool_new(&kc, err, sizeof err);
    CHECK(kv);
    fwd_dims d = fwd_dims_make(m, 128, 64);
    lm_fwd *fwd = fwd_new(m, ref_pool, kv, &d, err, sizeof err);
    CHECK(fwd);
    kv_seq *a = kv_seq_new(kv, err, sizeof err), *b = kv_seq_new(kv, err, sizeof err),
           *o = kv_seq_new(kv, err, sizeof err);
    float *la = lm_malloc((size_t)V * n * sizeof *la), *lb = lm_malloc((size_t)V * 2 * sizeof *lb);
    /* whole prompt, every row's logits */
    CHECK(kv_append(kv, a, n, err, sizeof err) == KV_OK);
    lm_seg sa = {.seq = a, .pos0 = 0, .n = n, .n_logits = n};
    CHECKF(fwd_run(fwd, prompt, &sa, 1, la, err, sizeof err) == 0, "%s", err);
    /* chunks of 7, each beside one token of another sequence */
    CHECK(kv_append(kv, o, 3, err, sizeof err) == KV_OK);
    lm_seg so = {.seq = o, .pos0 = 0, .n = 3, .n_logits = 1};
    CHECK(fwd_run(fwd, other, &so, 1, lb, err, sizeof err) == 0);
    int opos = 3;
    for (int p0 = 0; p0 < n; p0 += 7) {
        int c = n - p0 < 7 ? n - p0 : 7;
        int32_t toks[8];
        toks[0] = 77;
        memcpy(toks + 1, prompt + p0, (size_t)c * sizeof *toks);
        CHECK(kv_append(kv, o, 1, err, sizeof err) == KV_OK);
        CHECK(kv_append(kv, b, c, err, sizeof err) == KV_OK);
        lm_seg segs[2] = {{.seq = o, .pos0 = opos++, .n = 1, .n_logits = 1},
                          {.seq = b, .pos0 = p0, .n = c, .n_logits = 1}};
        CHECKF(fwd_run(fwd, toks, segs, 2, lb, err, sizeof err) == 0, "%s", err);
        const float *want = la + (size_t)(p0 + c - 1) * V;
        CHECKF(!memcmp(lb + V, want, (size_t)V * sizeof *lb), "chunk at %d differs from whole prefill", p0);
    }
    lm_free(la);
    lm_free(lb);
    kv_seq_free(kv, a);
    kv_seq_free(kv, b);
    kv_seq_free(kv, o);
    fwd_free(fwd);
    kv_pool_free(kv);
}

/* The engine with a 7-token budget reports the same logprobs as with the default budget. */
static void test_chunked_prefill_engine(void) {
    const lm_model *m = models[1];
    int32_t prompt[60];
    lm_rng r;
    lm_rng_seed(&r, 11);
    random_prompt(&r, prompt, 60);
    static collect c1, c2;
    memset(&c1, 0, sizeof c1);
    memset(&c2, 0, sizeof c2);
    char err[LM_ERRLEN];
    for (int k = 0; k < 2; k++) {
        lm_engine *e = test_engine_new(m, k ? 7 : FWD_BATCH_DEFAULT, 4, 0);
        CHECK(e);
        lm_request_params p = greedy_params(prompt, 60, 20, k ? &c2 : &c1);
        p.logprobs = true;
        p.ignore_eos = true;
        CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
        engine_wait_idle(e);
        engine_free(e);
    }
    CHECK(c1.n[0] == 20 && c2.n[0] == 20);
    CHECK(!memcmp(c1.tokens[0], c2.tokens[0], sizeof c1.tokens[0]));
    for (int i = 0; i < 20; i++) CHECKF(c1.logprobs[0][i] == c2.logprobs[0][i], "token %d", i);
    CHECK(c1.logprobs[0][0] < 0);
}

/* ---- concurrent submitters ---- */

typedef struct {
    lm_engine *e;
    int id;
    collect *col; /* (per_thread) */
    int32_t (*prompts)[48];
    int *lens, *maxt;
    bool *cancelled;
} submitter;

enum { N_THREADS = 4, PER_THREAD = 12 };

static void *submit_thread(void *arg) {
    submitter *s = arg;
    lm_rng r;
    lm_rng_seed(&r, 100 + (uint64_t)s->id);
    for (int k = 0; k < PER_THREAD; k++) {
        int i = s->id * PER_THREAD + k;
        lm_request_params p = greedy_params(s->prompts[i], s->lens[i], s->maxt[i], &s->col[i]);
        lm_request *h = NULL;
        char err[LM_ERRLEN];
        if (engine_submit(s->e, &p, &h, err, sizeof err) != LM_OK) continue;
        if (lm_rng_u64(&r) % 4 == 0) {
            usleep((useconds_t)(lm_rng_u64(&r) % 3000));
            engine_cancel(s->e, h);
            s->cancelled[i] = true;
        }
        engine_request_release(s->e, h);
        usleep((useconds_t)(lm_rng_u64(&r) % 2000));
    }
    return NULL;
}

static void test_concurrent_submitters(void) {
    const lm_model *m = models[2];
    enum { N = N_THREADS * PER_THREAD };
    static int32_t prompts[N][48];
    static int lens[N], maxt[N];
    static bool cancelled[N];
    static collect col[N];
    static int32_t ref[N][MAX_OUT];
    static int n_ref[N];
    memset(col, 0, sizeof col);
    memset(cancelled, 0, sizeof cancelled);
    lm_rng r;
    lm_rng_seed(&r, 21);
    for (int i = 0; i < N; i++) {
        lens[i] = 1 + (int)(lm_rng_u64(&r) % 47);
        maxt[i] = 1 + (int)(lm_rng_u64(&r) % 60);
        random_prompt(&r, prompts[i], lens[i]);
        n_ref[i] = solo_greedy(m, prompts[i], lens[i], maxt[i], ref[i]);
        CHECK(n_ref[i] > 0);
    }
    lm_engine *e = test_engine_new(m, 32, 16, 0);
    CHECK(e);
    pthread_t th[N_THREADS];
    submitter sub[N_THREADS];
    for (int t = 0; t < N_THREADS; t++) {
        sub[t] = (submitter){
            .e = e, .id = t, .col = col, .prompts = prompts, .lens = lens, .maxt = maxt, .cancelled = cancelled};
        pthread_create(&th[t], NULL, submit_thread, &sub[t]);
    }
    for (int t = 0; t < N_THREADS; t++) pthread_join(th[t], NULL);
    engine_wait_idle(e);
    int n_cancel = 0;
    for (int i = 0; i < N; i++) {
        CHECKF(col[i].done[0] == 1, "request %d: %d final events", i, col[i].done[0]);
        if (col[i].finish[0] == LM_FINISH_CANCELLED) {
            CHECK(cancelled[i]);
            n_cancel++;
            /* what it produced before the cancel is a prefix of its output */
            CHECK(col[i].n[0] <= n_ref[i] && !memcmp(col[i].tokens[0], ref[i], (size_t)col[i].n[0] * 4));
            continue;
        }
        CHECKF(col[i].n[0] == n_ref[i] && !memcmp(col[i].tokens[0], ref[i], (size_t)n_ref[i] * 4),
               "request %d differs from its solo run", i);
    }
    char err[LM_ERRLEN];
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    lm_engine_stats st;
    engine_stats(e, &st);
    CHECK(st.kv_blocks_used == 0 && st.running == 0 && st.waiting == 0);
    printf("NOTE concurrent: %d requests, %d cancelled, mean batch %.2f sequences\n", N, n_cancel,
           (double)st.batch_seqs_total / (double)st.iterations);
    engine_free(e);
}

/* A pool of 14 blocks (224 positions) for 12 requests of up to 96
 * positions each: decodes run out of blocks and preempt. */
static void test_preemption(void) {
    const lm_model *m = models[0];
    enum { N = 12 };
    static int32_t prompts[N][40];
    static int32_t ref[N][MAX_OUT];
    static int n_ref[N];
    static collect col[N];
    memset(col, 0, sizeof col);
    lm_rng r;
    lm_rng_seed(&r, 5);
    for (int i = 0; i < N; i++) {
        random_prompt(&r, prompts[i], 20 + i);
        n_ref[i] = solo_greedy(m, prompts[i], 20 + i, 70, ref[i]);
    }
    uint64_t block_bytes = 16ull * 2 * m->hp.n_layer * m->hp.n_head_kv * m->hp.head_dim * 4;
    lm_engine *e = test_engine_new(m, 64, 12, 14 * block_bytes);
    CHECK(e);
    char err[LM_ERRLEN];
    for (int i = 0; i < N; i++) {
        lm_request_params p = greedy_params(prompts[i], 20 + i, 70, &col[i]);
        p.ignore_eos = false;
        CHECKF(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK, "%s", err);
    }
    engine_wait_idle(e);
    for (int i = 0; i < N; i++) {
        CHECK(col[i].done[0] == 1);
        CHECKF(col[i].n[0] == n_ref[i] && !memcmp(col[i].tokens[0], ref[i], (size_t)n_ref[i] * 4),
               "request %d after preemption", i);
    }
    lm_engine_stats st;
    engine_stats(e, &st);
    CHECKF(st.preemptions_total > 0, "no preemption happened");
    for (int i = 0; i < N; i++) /* a readmitted request keeps its first queue time */
        CHECKF(col[i].stats[0].queue > 0 && col[i].stats[0].queue <= col[i].stats[0].ttft,
               "request %d: queue %g ttft %g", i, col[i].stats[0].queue, col[i].stats[0].ttft);
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    printf("NOTE preemption: %llu preemptions for %d requests in a 14-block pool\n",
           (unsigned long long)st.preemptions_total, N);
    engine_free(e);
    /* a request the whole pool cannot hold is refused at once */
    e = test_engine_new(m, 64, 4, 4 * block_bytes);
    CHECK(e);
    int32_t big[50];
    random_prompt(&r, big, 50);
    lm_request_params p = greedy_params(big, 50, 60, &col[0]);
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_ERR_TOO_LONG);
    CHECKF(strstr(err, "KV blocks"), "%s", err);
    p.max_tokens = 10; /* 60 positions: 4 blocks */
    memset(&col[0], 0, sizeof col[0]);
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
    engine_wait_idle(e);
    CHECK(col[0].done[0] == 1 && col[0].finish[0] != LM_FINISH_ERROR);
    engine_free(e);
}

/* One running slot: queued requests start by priority (lower first), then
 * by arrival. */
static void test_priority(void) {
    const lm_model *m = models[0];
    lm_engine *e = test_engine_new(m, 64, 1, 0);
    CHECK(e);
    int32_t prompt[8] = {1, 40, 41, 42, 43, 44, 45, 46};
    static collect col[6];
    memset(col, 0, sizeof col);
    static const int prio[6] = {0, 5, 1, 3, 1, -2};
    char err[LM_ERRLEN];
    for (int i = 0; i < 6; i++) {
        lm_request_params p = greedy_params(prompt, 8, i == 0 ? 100 : 3, &col[i]);
        p.ignore_eos = true;
        p.priority = prio[i];
        CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
    }
    engine_wait_idle(e);
    /* request 0 may already run when the others arrive; the rest finish in
     * the order -2, 1 (first), 1 (second), 3, 5 */
    static const int want[5] = {5, 2, 4, 3, 1};
    for (int k = 1; k < 5; k++)
        CHECKF(col[want[k - 1]].order < col[want[k]].order, "request %d finished after %d", want[k - 1], want[k]);
    engine_free(e);
}

/* Fairness between clients: one client's queue does not hold back another
 * client's first request. One sequence runs at a time; client A submits
 * six requests, then client B one (and a request without a client). B's
 * tag is the one after what runs, as A's second is: B finishes second or
 * third; without clients it would finish after all of A's. Then the same
 * with no client anywhere: arrival order. */
static void test_fair_clients(void) {
    const lm_model *m = models[0];
    int32_t prompt[8] = {1, 40, 41, 42, 43, 44, 45, 46};
    char err[LM_ERRLEN];
    for (int pass = 0; pass < 2; pass++) {
        lm_engine *e = test_engine_new(m, 64, 1, 0);
        CHECK(e);
        static collect col[8];
        memset(col, 0, sizeof col);
        for (int i = 0; i < 8; i++) {
            lm_request_params p = greedy_params(prompt, 8, i == 0 ? 60 : 6, &col[i]);
            p.ignore_eos = true;
            p.client = pass == 0 ? (i < 6 ? 0xa : i == 6 ? 0xb : 0) : 0;
            CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
        }
        engine_wait_idle(e);
        engine_free(e);
        int before_b = 0; /* A's requests that finished before B's */
        for (int i = 1; i < 6; i++) before_b += col[i].order < col[6].order;
        if (pass == 0) CHECKF(before_b <= 1, "%d of A's later requests finished before B's", before_b);
        else CHECKF(before_b == 5, "without clients, %d of A's requests finished before the 7th", before_b);
        /* A's own requests keep their order */
        for (int i = 2; i < 6; i++) CHECK(col[i - 1].order < col[i].order);
    }
}

/* Fair share of the slots: client A's requests hold every slot
 * (max_seqs 3) and more of them wait; client B's short request then
 * preempts one of A's and finishes long before A's running ones, and A's
 * outputs are the same as alone (preemption recomputes). Without a client
 * of its own (B as A, or client 0) B waits for a slot. */
static void test_fair_share(void) {
    const lm_model *m = models[0];
    int32_t prompt[6] = {1, 50, 51, 52, 53, 54};
    char err[LM_ERRLEN];
    static collect solo;
    memset(&solo, 0, sizeof solo);
    lm_engine *e = test_engine_new(m, 64, 3, 0);
    CHECK(e);
    lm_request_params p = greedy_params(prompt, 6, 80, &solo);
    p.ignore_eos = true;
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
    engine_wait_idle(e);
    engine_free(e);
    for (int pass = 0; pass < 3; pass++) {
        CHECK((e = test_engine_new(m, 64, 3, 0)));
        enum { NA = 5 };
        static collect a[NA], b;
        memset(a, 0, sizeof a);
        memset(&b, 0, sizeof b);
        lm_engine_stats s0, s1;
        engine_stats(e, &s0);
        for (int i = 0; i < NA; i++) {
            p = greedy_params(prompt, 6, 80, &a[i]);
            p.ignore_eos = true;
            p.client = 0xa;
            CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
        }
        double t0 = lm_now(); /* until A's first three run */
        while ((a[0].n[0] < 2 || a[1].n[0] < 2 || a[2].n[0] < 2) && lm_now() - t0 < 30) usleep(1000);
        CHECK(a[2].n[0] >= 2 && a[2].n[0] < 80);
        p = greedy_params(prompt, 6, 4, &b);
        p.ignore_eos = true;
        p.client = pass == 0 ? 0xb : pass == 1 ? 0xa : 0;
        CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
        engine_wait_idle(e);
        engine_stats(e, &s1);
        int before_b = 0; /* A's requests that finished before B's */
        for (int i = 0; i < NA; i++) before_b += a[i].order < b.order;
        if (pass == 0)
            CHECKF(before_b == 0 && s1.preemptions_total - s0.preemptions_total == 1,
                   "another client: %d of A's requests finished before B's, %llu preemptions", before_b,
                   (unsigned long long)(s1.preemptions_total - s0.preemptions_total));
        else
            CHECKF(before_b >= 1 && s1.preemptions_total == s0.preemptions_total,
                   "%s: %d of A's finished before B's, %llu preemptions", pass == 1 ? "the same client" : "client 0",
                   before_b, (unsigned long long)(s1.preemptions_total - s0.preemptions_total));
        for (int i = 0; i < NA; i++)
            CHECKF(a[i].n[0] == 80 && !memcmp(a[i].tokens[0], solo.tokens[0], 80 * sizeof(int32_t)),
                   "pass %d: A's request %d differs from its run alone", pass, i);
        CHECK(b.done[0] == 1 && b.n[0] == 4);
        CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
        engine_free(e);
    }
}

/* Stop strings end the text before them; n = 2 forks the prompt; bad
 * requests are refused; shutdown ends requests in flight. */
static void test_stop_fork_reject(void) {
    const lm_model *m = models[0];
    lm_engine *e = test_engine_new(m, 64, 8, 0);
    CHECK(e);
    int32_t prompt[5] = {1, 403, 407, 261, 931 % 512};
    static collect a, b, c;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    memset(&c, 0, sizeof c);
    char err[LM_ERRLEN];
    lm_request_params p = greedy_params(prompt, 5, 60, &a);
    p.ignore_eos = true;
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
    engine_wait_idle(e);
    CHECK(a.text_len[0] > 20);
    /* a stop string from the middle of that text, spanning tokens */
    char stop[8];
    memcpy(stop, a.text[0] + a.text_len[0] / 2, 5);
    stop[5] = 0;
    const char *stops[2] = {"\x01never", stop};
    p.user = &b;
    p.stop = stops;
    p.n_stop = 2;
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
    engine_wait_idle(e);
    CHECK(b.finish[0] == LM_FINISH_STOP);
    const char *hit = memmem(a.text[0], a.text_len[0], stop, 5);
    CHECK(hit);
    CHECKF(b.text_len[0] == (size_t)(hit - a.text[0]) && !memcmp(b.text[0], a.text[0], b.text_len[0]),
           "stopped text has %zu bytes, expected %zu", b.text_len[0], (size_t)(hit - a.text[0]));
    /* n = 3 sampled choices from one prefill: distinct seeds, one prompt pass */
    lm_engine_stats s0, s1;
    engine_stats(e, &s0);
    lm_request_params q = greedy_params(prompt, 5, 30, &c);
    q.n = 3;
    q.sp.temp = 1.0f;
    q.sp.seed = 9;
    q.ignore_eos = true;
    CHECK(engine_submit(e, &q, NULL, err, sizeof err) == LM_OK);
    engine_wait_idle(e);
    engine_stats(e, &s1);
    for (int i = 0; i < 3; i++) CHECK(c.done[i] == 1 && c.n[i] == 30 && c.finish[i] == LM_FINISH_LENGTH);
    CHECK(memcmp(c.tokens[0], c.tokens[1], 30 * 4) || memcmp(c.tokens[1], c.tokens[2], 30 * 4));
    /* prompt tokens went through the model once: 5 + 3 x 29 decode tokens */
    CHECKF(s1.batch_tokens_total - s0.batch_tokens_total == 5 + 3 * 29, "%llu tokens ran",
           (unsigned long long)(s1.batch_tokens_total - s0.batch_tokens_total));
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    /* rejections */
    int32_t badtok[2] = {1, 100000};
    lm_request_params r = greedy_params(badtok, 2, 5, &a);
    CHECK(engine_submit(e, &r, NULL, err, sizeof err) == LM_ERR_INVALID);
    r = greedy_params(prompt, 5, 0, &a);
    CHECK(engine_submit(e, &r, NULL, err, sizeof err) == LM_ERR_INVALID);
    static int32_t longp[128];
    for (int i = 0; i < 128; i++) longp[i] = 5;
    r = greedy_params(longp, 128, 5, &a);
    CHECK(engine_submit(e, &r, NULL, err, sizeof err) == LM_ERR_TOO_LONG);
    CHECK(strstr(err, "context"));
    /* shutdown with work in flight: every request still gets its final event */
    static collect d[6];
    memset(d, 0, sizeof d);
    for (int i = 0; i < 6; i++) {
        r = greedy_params(prompt, 5, 120, &d[i]);
        r.ignore_eos = true;
        CHECK(engine_submit(e, &r, NULL, err, sizeof err) == LM_OK);
    }
    engine_free(e);
    for (int i = 0; i < 6; i++) CHECK(d[i].done[0] == 1);
}

/* The queue time: submission to first admission, after 0 and at most the
 * TTFT; with one running slot the second request's covers the first's run
 * (admitted no earlier than the first finished); forked choices get one
 * too. */
static void test_queue_time(void) {
    const lm_model *m = models[0];
    lm_engine *e = test_engine_new(m, 64, 1, 0);
    CHECK(e);
    int32_t prompt[6] = {1, 50, 51, 52, 53, 54};
    static collect col[2];
    memset(col, 0, sizeof col);
    char err[LM_ERRLEN];
    for (int i = 0; i < 2; i++) {
        lm_request_params p = greedy_params(prompt, 6, 30, &col[i]);
        p.ignore_eos = true;
        CHECKF(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK, "%s", err);
    }
    engine_wait_idle(e);
    const lm_request_stats *a = &col[0].stats[0], *b = &col[1].stats[0];
    CHECK(col[0].done[0] == 1 && col[1].done[0] == 1);
    CHECKF(a->queue > 0 && a->queue <= a->ttft, "first: queue %g ttft %g", a->queue, a->ttft);
    CHECKF(b->queue > 0 && b->queue <= b->ttft, "second: queue %g ttft %g", b->queue, b->ttft);
    CHECKF(b->t_submit + b->queue >= a->t_submit + a->e2e, "second admitted at %g, first done at %g",
           b->t_submit + b->queue, a->t_submit + a->e2e);
    CHECKF(b->queue > a->queue, "second queue %g first %g", b->queue, a->queue);
    printf("NOTE queue time: first %.4f s (ttft %.4f), second %.4f s (first's e2e %.4f)\n", a->queue, a->ttft, b->queue,
           a->e2e);
    engine_free(e);
    e = test_engine_new(m, 64, 4, 0);
    CHECK(e);
    memset(col, 0, sizeof col);
    lm_request_params p = greedy_params(prompt, 6, 5, &col[0]);
    p.n = 3;
    p.sp.temp = 1;
    CHECKF(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK, "%s", err);
    engine_wait_idle(e);
    for (int i = 0; i < 3; i++)
        CHECKF(col[0].done[i] == 1 && col[0].stats[i].queue > 0 && col[0].stats[i].queue <= col[0].stats[i].ttft,
               "choice %d: queue %g ttft %g", i, col[0].stats[i].queue, col[0].stats[i].ttft);
    engine_free(e);
}

/* A bounded queue refuses with EBUSY instead of growing. */
static void test_max_waiting(void) {
    const lm_model *m = models[0];
    lm_engine_config ec;
    engine_config_default(&ec);
    ec.n_threads = 1;
    ec.max_seqs = 1;
    ec.max_waiting = 2;
    char err[LM_ERRLEN];
    lm_engine *e = engine_new(m, m->tok, &ec, err, sizeof err);
    CHECK(e);
    int32_t prompt[3] = {1, 30, 31};
    static collect col[40];
    memset(col, 0, sizeof col);
    int busy = 0, ok = 0;
    for (int i = 0; i < 40; i++) {
        lm_request_params p = greedy_params(prompt, 3, 100, &col[i]);
        p.ignore_eos = true;
        int rc = engine_submit(e, &p, NULL, err, sizeof err);
        if (rc == LM_ERR_BUSY) busy++;
        else if (rc == LM_OK) ok++;
    }
    CHECK(busy > 0 && ok >= 2);
    engine_wait_idle(e);
    int done = 0;
    for (int i = 0; i < 40; i++) done += col[i].done[0];
    CHECK(done == ok);
    engine_free(e);
}

/* Cancelling the only request leaves the engine idle with every block
 * back; a text prompt is tokenized at submission. */
static void test_cancel_alone_and_text(void) {
    const lm_model *m = models[0];
    lm_engine *e = test_engine_new(m, 64, 4, 0);
    CHECK(e);
    static collect a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    int32_t prompt[4] = {1, 300, 301, 302};
    lm_request_params p = greedy_params(prompt, 4, 120, &a);
    p.ignore_eos = true;
    lm_request *h = NULL;
    char err[LM_ERRLEN];
    CHECK(engine_submit(e, &p, &h, err, sizeof err) == LM_OK && h);
    engine_cancel(e, h);
    engine_wait_idle(e); /* returns: nothing is left running */
    CHECK(a.done[0] == 1);
    CHECK(a.finish[0] == LM_FINISH_CANCELLED || a.n[0] == 120);
    engine_cancel(e, h); /* after the end: harmless */
    engine_request_release(e, h);
    lm_engine_stats st;
    engine_stats(e, &st);
    CHECK(st.running == 0 && st.waiting == 0 && st.kv_blocks_used == 0);
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    /* text prompt: the same tokens as tokenizing it ourselves */
    const char *text = "Once upon a time";
    int32_t ids[16];
    int n = tok_encode(m->tok, text, strlen(text), tok_add_bos(m->tok), true, ids, 16);
    CHECK(n > 1 && n <= 16);
    lm_request_params q = greedy_params(NULL, 0, 10, &b);
    q.text = text;
    q.text_len = strlen(text);
    CHECKF(engine_submit(e, &q, NULL, err, sizeof err) == LM_OK, "%s", err);
    engine_wait_idle(e);
    int32_t ref[16];
    int nr = solo_greedy(m, ids, n, 10, ref);
    CHECK(b.done[0] == 1 && b.stats[0].prompt_tokens == n);
    CHECK(b.n[0] == nr && !memcmp(b.tokens[0], ref, (size_t)nr * 4));
    engine_free(e);
}

/* Every finish reason, each with its status: stop (LM_OK), length
 * (max_tokens, or the context with max_tokens < 0), cancelled (LM_OK), and
 * error (a logit_bias that bans every token: LM_ERR_INVALID, with a
 * message). The context rule at submission: past the context is
 * LM_ERR_TOO_LONG, max_tokens 0 and n above max_seqs LM_ERR_INVALID. */
static void test_finish_reasons(void) {
    const lm_model *m = models[0];
    lm_engine *e = test_engine_new(m, 64, 4, 0);
    CHECK(e);
    int V = m->hp.n_vocab, n_ctx = engine_n_ctx(e);
    int32_t prompt[4] = {1, 300, 301, 302};
    static collect c[5];
    memset(c, 0, sizeof c);
    char err[LM_ERRLEN];
    /* stop: a stop string met at once */
    lm_request_params p = greedy_params(prompt, 4, 50, &c[0]);
    p.ignore_eos = true;
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
    engine_wait_idle(e);
    CHECK(c[0].done[0] == 1 && c[0].n[0] >= 1);
    const char *stop1[1] = {NULL};
    char first[8] = "";
    if (c[0].text_len[0] > 0) {
        first[0] = c[0].text[0][0];
        stop1[0] = first;
        memset(&c[0], 0, sizeof c[0]);
        p.stop = stop1;
        p.n_stop = 1;
        CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
        engine_wait_idle(e);
        CHECKF(c[0].finish[0] == LM_FINISH_STOP && c[0].status[0] == LM_OK && !c[0].has_error[0], "finish %d",
               c[0].finish[0]);
    }
    /* length: max_tokens, and the rest of the context */
    p = greedy_params(prompt, 4, 5, &c[1]);
    p.ignore_eos = true;
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
    p = greedy_params(prompt, 4, -1, &c[2]);
    p.ignore_eos = true;
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
    engine_wait_idle(e);
    CHECK(c[1].finish[0] == LM_FINISH_LENGTH && c[1].status[0] == LM_OK && c[1].n[0] == 5);
    /* every position holds a token, and one more is sampled from the last */
    CHECKF(c[2].finish[0] == LM_FINISH_LENGTH && c[2].stats[0].completion_tokens == n_ctx + 1 - 4, "%d of %d",
           c[2].stats[0].completion_tokens, n_ctx + 1 - 4);
    /* cancelled */
    p = greedy_params(prompt, 4, 100, &c[3]);
    p.ignore_eos = true;
    lm_request *h = NULL;
    CHECK(engine_submit(e, &p, &h, err, sizeof err) == LM_OK);
    engine_cancel(e, h);
    engine_wait_idle(e);
    engine_request_release(e, h);
    CHECK(c[3].done[0] == 1 && c[3].status[0] == LM_OK);
    CHECK(c[3].finish[0] == LM_FINISH_CANCELLED || c[3].n[0] == 100);
    /* error: every token banned */
    static int32_t ids[1024];
    static float vals[1024];
    for (int i = 0; i < V; i++) ids[i] = i, vals[i] = -INFINITY;
    p = greedy_params(prompt, 4, 5, &c[4]);
    p.bias_ids = ids;
    p.bias_vals = vals;
    p.n_bias = V;
    p.n = 2;
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
    engine_wait_idle(e);
    for (int i = 0; i < 2; i++)
        CHECKF(c[4].done[i] == 1 && c[4].finish[i] == LM_FINISH_ERROR && c[4].status[i] == LM_ERR_INVALID &&
                   c[4].has_error[i] && c[4].n[i] == 0,
               "choice %d: finish %d status %d", i, c[4].finish[i], c[4].status[i]);
    /* the context rule and the other refusals */
    p = greedy_params(prompt, 4, n_ctx + 1 - 4, &c[0]);
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
    engine_wait_idle(e);
    p = greedy_params(prompt, 4, n_ctx + 2 - 4, &c[0]);
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_ERR_TOO_LONG);
    p = greedy_params(prompt, 4, 0, &c[0]);
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_ERR_INVALID);
    p = greedy_params(prompt, 4, 5, &c[0]);
    p.n = 5;
    CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_ERR_INVALID);
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    engine_free(e);
}

/* Random requests (n up to 3, stop strings, logprobs, priorities, cancels)
 * from two threads into a 10-block pool with a 5-token budget: preemption,
 * forks and chunking all at once. Every choice gets exactly one final
 * event, and the pool's bookkeeping holds. */
typedef struct {
    lm_engine *e;
    int id;
    collect *col;
    int n_req;
} stress_arg;

static void *stress_thread(void *arg) {
    stress_arg *a = arg;
    lm_rng r;
    lm_rng_seed(&r, 77 + (uint64_t)a->id);
    static const char *stops[3] = {"e", "the", "\n"};
    for (int k = 0; k < a->n_req; k++) {
        int32_t prompt[40];
        int np = 1 + (int)(lm_rng_u64(&r) % 39);
        random_prompt(&r, prompt, np);
        collect *c = &a->col[k];
        lm_request_params p = greedy_params(prompt, np, 1 + (int)(lm_rng_u64(&r) % 50), c);
        p.n = 1 + (int)(lm_rng_u64(&r) % 3);
        p.sp.temp = lm_rng_u64(&r) % 2 ? 0.0f : 0.9f;
        p.sp.seed = lm_rng_u64(&r);
        p.priority = (int)(lm_rng_u64(&r) % 3);
        p.logprobs = lm_rng_u64(&r) % 2;
        p.top_logprobs = (int)(lm_rng_u64(&r) % 4);
        p.ignore_eos = lm_rng_u64(&r) % 2;
        p.n_stop = (int)(lm_rng_u64(&r) % 4);
        p.stop = stops;
        lm_request *h = NULL;
        char err[LM_ERRLEN];
        if (engine_submit(a->e, &p, &h, err, sizeof err) != LM_OK) {
            c->order = -1; /* refused: no events expected */
            continue;
        }
        c->n[3] = p.n; /* choices expected (slot 3 is unused by n <= 3) */
        if (lm_rng_u64(&r) % 5 == 0) {
            usleep((useconds_t)(lm_rng_u64(&r) % 2000));
            engine_cancel(a->e, h);
        }
        engine_request_release(a->e, h);
    }
    return NULL;
}

static void test_random_stress(void) {
    const lm_model *m = models[2];
    uint64_t block_bytes = 16ull * 2 * m->hp.n_layer * m->hp.n_head_kv * m->hp.head_dim * 4;
    lm_engine *e = test_engine_new(m, 5, 6, 10 * block_bytes);
    CHECK(e);
    enum { PER = 60 };
    static collect col[2][PER];
    memset(col, 0, sizeof col);
    pthread_t th[2];
    stress_arg args[2];
    for (int t = 0; t < 2; t++) {
        args[t] = (stress_arg){.e = e, .id = t, .col = col[t], .n_req = PER};
        pthread_create(&th[t], NULL, stress_thread, &args[t]);
    }
    for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
    engine_wait_idle(e);
    int refused = 0;
    for (int t = 0; t < 2; t++)
        for (int k = 0; k < PER; k++) {
            collect *c = &col[t][k];
            if (c->order == -1) {
                refused++;
                continue;
            }
            for (int i = 0; i < c->n[3]; i++)
                CHECKF(c->done[i] == 1, "thread %d request %d choice %d: %d final events", t, k, i, c->done[i]);
        }
    char err[LM_ERRLEN];
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    lm_engine_stats st;
    engine_stats(e, &st);
    CHECK(st.kv_blocks_used == 0 && st.running == 0 && st.waiting == 0);
    printf("NOTE stress: %d requests (%d refused), %llu preemptions, mean batch %.2f\n", 2 * PER, refused,
           (unsigned long long)st.preemptions_total, (double)st.batch_seqs_total / (double)st.iterations);
    engine_free(e);
}

/* The sliding-window model through the engine: 12 greedy requests with
 * prompts of 20..64 tokens and up to 90 generated (up to 19 windows), alone,
 * all together in a roomy pool, and in a pool of 20 blocks of each class
 * where decodes preempt; n = 2 choices fork the prompt's blocks; a prompt
 * repeated after its first run comes from the prefix cache. Every output
 * equals the single-sequence generator's over a pool keeping every layer. */
static void test_swa_engine(void) {
    enum { N = 12 };
    static int32_t prompts[N][64];
    static int lens[N], maxt[N];
    static int32_t ref[N][MAX_OUT];
    static int n_ref[N];
    static collect col[N];
    lm_rng r;
    lm_rng_seed(&r, 91);
    for (int i = 0; i < N; i++) {
        lens[i] = 20 + (int)(lm_rng_u64(&r) % 45);
        maxt[i] = 30 + (int)(lm_rng_u64(&r) % 61);
        random_prompt(&r, prompts[i], lens[i]);
        n_ref[i] = solo_greedy_keep_all(swa, prompts[i], lens[i], maxt[i], ref[i]);
        CHECK(n_ref[i] > 0);
        int32_t alt[MAX_OUT]; /* the state's own windowed pool agrees too */
        CHECK(solo_greedy(swa, prompts[i], lens[i], maxt[i], alt) == n_ref[i] &&
              !memcmp(alt, ref[i], (size_t)n_ref[i] * 4));
    }
    uint64_t all_block = 16ull * 2 * swa->hp.n_layer * swa->hp.n_head_kv * swa->hp.head_dim * 4;
    static const uint64_t mems[2] = {0, 20};
    for (int mi = 0; mi < 2; mi++) {
        lm_engine *e = test_engine_new(swa, 64, 8, mems[mi] * all_block);
        CHECK(e);
        lm_engine_stats st;
        engine_stats(e, &st);
        CHECK(st.kv_local_blocks_total > 0 && st.kv_local_blocks_total < st.kv_blocks_total + (mi ? 1 : 0));
        memset(col, 0, sizeof col);
        char err[LM_ERRLEN];
        for (int i = 0; i < N; i++) {
            lm_request_params p = greedy_params(prompts[i], lens[i], maxt[i], &col[i]);
            p.n = i % 4 == 3 ? 2 : 1;
            CHECKF(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK, "%s", err);
        }
        engine_wait_idle(e);
        for (int i = 0; i < N; i++)
            for (int c = 0; c < (i % 4 == 3 ? 2 : 1); c++) {
                CHECK(col[i].done[c] == 1);
                CHECKF(col[i].n[c] == n_ref[i] && !memcmp(col[i].tokens[c], ref[i], (size_t)n_ref[i] * 4),
                       "pool %d, request %d choice %d: %d tokens vs %d alone", mi, i, c, col[i].n[c], n_ref[i]);
            }
        /* the first prompts again, each twice in a row: the second run at
         * least is served from the prefix cache */
        int cached = 0;
        for (int k = 0; k < 6; k++) {
            int i = k / 2;
            memset(&col[i], 0, sizeof col[i]);
            lm_request_params p = greedy_params(prompts[i], lens[i], maxt[i], &col[i]);
            CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
            engine_wait_idle(e);
            CHECK(col[i].n[0] == n_ref[i] && !memcmp(col[i].tokens[0], ref[i], (size_t)n_ref[i] * 4));
            if (k % 2) CHECK(col[i].stats[0].cached_tokens > 0);
            cached += col[i].stats[0].cached_tokens;
        }
        engine_stats(e, &st);
        CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
        CHECK(st.kv_blocks_used == 0 && st.kv_local_blocks_used == 0);
        int longest = 0;
        for (int i = 0; i < N; i++) longest = lens[i] + n_ref[i] > longest ? lens[i] + n_ref[i] : longest;
        printf("NOTE sliding-window engine, %s pool (%lld global, %lld local blocks): sequences up to %d positions, "
               "%llu preemptions, %d prompt positions from the prefix cache\n",
               mi ? "small" : "roomy", (long long)st.kv_blocks_total, (long long)st.kv_local_blocks_total, longest,
               (unsigned long long)st.preemptions_total, cached);
        if (mi) CHECKF(st.preemptions_total > 0, "no preemption happened");
        engine_free(e);
    }
}

int main(void) {
    kernels_init();
    char err[LM_ERRLEN];
    models[0] = model_load(TEST_MODEL, err, sizeof err);
    if (!models[0]) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    const char *schemes[2] = {"Q8_0", "Q4_0"};
    ref_pool = pool_new(2);
    for (int i = 0; i < 2; i++) {
        char path[64];
        snprintf(path, sizeof path, "/tmp/lamina-test-engine-%d-%s.gguf", (int)getpid(), schemes[i]);
        if (quantize_file(TEST_MODEL, path, schemes[i], ref_pool, NULL, NULL, err, sizeof err) != 0 ||
            !(models[i + 1] = model_load(path, err, sizeof err))) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        unlink(path); /* the mapping stays valid */
    }
    TEST_RUN(test_batch_invariance);
    TEST_RUN(test_pool_sampling);
    TEST_RUN(test_chunked_prefill_logits);
    TEST_RUN(test_chunked_prefill_engine);
    TEST_RUN(test_concurrent_submitters);
    TEST_RUN(test_preemption);
    TEST_RUN(test_priority);
    TEST_RUN(test_fair_clients);
    TEST_RUN(test_fair_share);
    TEST_RUN(test_stop_fork_reject);
    TEST_RUN(test_queue_time);
    TEST_RUN(test_max_waiting);
    TEST_RUN(test_cancel_alone_and_text);
    TEST_RUN(test_finish_reasons);
    TEST_RUN(test_random_stress);
    if (!(swa = swa_model_load(TEST_MODEL, 8, 3, 256, err, sizeof err))) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    TEST_RUN(test_swa_engine);
    model_free(swa);
    for (int i = 0; i < 3; i++) model_free(models[i]);
    pool_free(ref_pool);
    return TEST_DONE();
}
