/*
 * test_pressure.c - the engine under memory pressure: a KV pool of a few
 * blocks (10 blocks of 16 positions, where one request may take up to 8)
 * and 64 threads submitting at once, with mixed requests:
 *   - short (1..8 tokens) and long (40..110) prompts, short (1..8) and long
 *     (up to the rest of the 128-token context) max_tokens, ignore_eos or
 *     not, stop strings for some;
 *   - n = 1, and n = 2 or 3 for some (forked choices);
 *   - greedy, or sampled with a seed;
 *   - "streaming" consumers that take each token event as it comes, and
 *     "whole" ones that wait for the final events only;
 *   - some cancelled mid-way: after k tokens (a streaming consumer), or
 *     after a short random delay (often still waiting for blocks).
 * The same requests ran first in a roomy engine (no preemption, no cancel);
 * every outcome is counted and checked:
 *   - every accepted choice gets exactly one final event before a deadline
 *     (a request that never ends is a hang, and fails the test);
 *   - a request refused at submission is exactly one that the whole pool
 *     could never hold (the engine's rule: its prompt once, each choice's
 *     generated tokens and a copied partial block), with LM_ERR_TOO_LONG
 *     and a message; no accepted request ends in an error;
 *   - an uncancelled choice's tokens equal the roomy run's bit for bit
 *     (preemption recomputes the same output); a cancelled one's are a
 *     prefix of them;
 *   - preemptions happened; after the load engine_check passes (the pool's
 *     invariants, no block held by a finished request, the plans' block
 *     accounting exact) and no block leaks: free blocks == total, nothing
 *     running or waiting, every accepted request finished.
 * Three times: the bundled model (F32 weights, F16 KV) with the prefix cache
 * (finished prompts stay cached, counted free) and without it (every block
 * back on the free list), and its sliding-window variant (swa_model.h),
 * whose pool has a class of local blocks beside the global ones.
 * 64 threads x 8 requests each (x 3 under AddressSanitizer, LAMINA_ASAN,
 * and under instruction-set emulation, LAMINA_EMULATED: `make test-arm`
 * runs this under qemu-user, 20-50 times slower than the host, where the
 * hang deadline is also ten times longer: a request that has not ended
 * after 20 minutes is still a hang, one that takes two is not).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/util.h"
#include "model/model.h"
#include "sched/engine.h"
#include "swa_model.h"
#include "test.h"

enum {
    N_THREADS = 64,     /* submitting threads */
    MAX_PER_THREAD = 8, /* requests each, one after another */
    N_REQ = N_THREADS * MAX_PER_THREAD,
    MAX_N = 3,     /* choices per request at most */
    MAX_TOK = 130, /* tokens one choice can generate (the context is 128) */
    POOL_BLOCKS = 10,
    BLOCK = 16,
};
#define HANG_SECONDS 120.0 /* a request not finished by then is a hang (x 10 emulated) */

static lm_model *model; /* the bundled model (F32 weights) */
static lm_model *swa;   /* its sliding-window variant (swa_model.h: window 8 on 4 of 5 layers) */
static int per_thread = MAX_PER_THREAD;
static double hang_seconds = HANG_SECONDS;

/* One request: its parameters (fixed before either run) and what its events
 * delivered. */
typedef struct {
    int32_t prompt[112];
    int n_prompt, max_tokens, n;
    float temp;
    uint64_t seed;
    bool ignore_eos;
    int n_stop;       /* stop strings: the first n_stop of `stops` */
    bool streaming;   /* the consumer takes each token event as it comes */
    int cancel_after; /* -1: never; else after this many tokens (streaming) or microseconds / 100 (whole) */
    /* filled by the events */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t tokens[MAX_N][MAX_TOK];
    int n_tok[MAX_N];
    int done[MAX_N];
    int n_done;
    lm_finish finish[MAX_N];
    lm_status status[MAX_N];
    bool has_error[MAX_N];
    /* outcome */
    lm_status submit_rc;
    char submit_err[LM_ERRLEN];
    bool cancelled; /* engine_cancel was called */
    bool hung;
} req;

static req reqs[N_REQ];
static int32_t ref_tokens[N_REQ][MAX_N][MAX_TOK];
static int ref_n[N_REQ][MAX_N];

static void on_event(void *user, const lm_event *ev) {
    req *r = user;
    pthread_mutex_lock(&r->mu);
    int i = ev->index;
    if (i >= 0 && i < MAX_N) {
        if (ev->token >= 0 && r->n_tok[i] < MAX_TOK) r->tokens[i][r->n_tok[i]++] = ev->token;
        if (ev->done) {
            r->done[i]++;
            r->n_done++;
            r->finish[i] = ev->finish;
            r->status[i] = ev->status;
            r->has_error[i] = ev->error && ev->error[0];
        }
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void reset_events(req *r) {
    memset(r->tokens, 0, sizeof r->tokens);
    memset(r->n_tok, 0, sizeof r->n_tok);
    memset(r->done, 0, sizeof r->done);
    r->n_done = 0;
    r->cancelled = r->hung = false;
    r->submit_rc = LM_OK;
    r->submit_err[0] = 0;
}

/* The mixed request set, the same for both runs. */
static void make_requests(void) {
    lm_rng g;
    lm_rng_seed(&g, 1515);
    for (int i = 0; i < N_REQ; i++) {
        req *r = &reqs[i];
        bool long_prompt = lm_rng_u64(&g) % 2, long_gen = lm_rng_u64(&g) % 2;
        r->n_prompt = long_prompt ? 40 + (int)(lm_rng_u64(&g) % 71) : 1 + (int)(lm_rng_u64(&g) % 8);
        r->prompt[0] = 1; /* BOS */
        for (int k = 1; k < r->n_prompt; k++) r->prompt[k] = 3 + (int32_t)(lm_rng_u64(&g) % 509);
        int rest = 128 + 1 - r->n_prompt; /* the engine's context rule: n_ctx + 1 tokens in all */
        if (!long_gen) r->max_tokens = 1 + (int)(lm_rng_u64(&g) % 8);
        else if (lm_rng_u64(&g) % 4 == 0) r->max_tokens = -1; /* the rest of the context */
        else r->max_tokens = 1 + (int)(lm_rng_u64(&g) % (uint64_t)rest);
        if (r->max_tokens > rest) r->max_tokens = rest;
        r->n = lm_rng_u64(&g) % 4 == 0 ? 2 + (int)(lm_rng_u64(&g) % 2) : 1;
        r->temp = lm_rng_u64(&g) % 2 ? 0.0f : 0.9f;
        r->seed = lm_rng_u64(&g);
        r->ignore_eos = lm_rng_u64(&g) % 2;
        r->n_stop = lm_rng_u64(&g) % 4 == 0 ? 1 + (int)(lm_rng_u64(&g) % 3) : 0;
        r->streaming = lm_rng_u64(&g) % 2;
        r->cancel_after = lm_rng_u64(&g) % 5 == 0 ? (int)(lm_rng_u64(&g) % 12) : -1;
        pthread_mutex_init(&r->mu, NULL);
        pthread_cond_init(&r->cv, NULL);
    }
}

static const char *stops[3] = {"the", "\n", "e"};

static lm_request_params params_of(req *r) {
    lm_request_params p;
    engine_request_params_default(&p);
    p.prompt = r->prompt;
    p.n_prompt = r->n_prompt;
    p.max_tokens = r->max_tokens;
    p.n = r->n;
    p.sp.temp = r->temp;
    p.sp.seed = r->seed;
    p.ignore_eos = r->ignore_eos;
    p.stop = stops;
    p.n_stop = r->n_stop;
    p.on_event = on_event;
    p.user = r;
    return p;
}

/* Whether the pool of `blocks` blocks could never hold r alone (the
 * engine's submission rule, engine.c check_pool). */
static bool never_fits(const req *r, int64_t blocks) {
    int gen = r->max_tokens < 0 ? 128 + 1 - r->n_prompt : r->max_tokens;
    int64_t positions = r->n_prompt + gen < 128 ? r->n_prompt + gen : 128;
    int64_t gen_blocks = (positions - r->n_prompt + BLOCK - 1) / BLOCK;
    int64_t need = (positions + BLOCK - 1) / BLOCK + (int64_t)(r->n - 1) * (gen_blocks + 1);
    return need > blocks;
}

static double deadline_of(double t) { return lm_now() + t; }

/* Wait on r->cv until `ready` or the deadline; false on the deadline. */
static bool wait_until(req *r, double deadline) {
    double left = deadline - lm_now();
    if (left <= 0) return false;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = (double)ts.tv_nsec * 1e-9 + (left < 0.05 ? left : 0.05);
    ts.tv_sec += (time_t)t;
    ts.tv_nsec = (long)((t - (double)(time_t)t) * 1e9);
    int rc = pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    return rc == 0 || rc == ETIMEDOUT;
}

typedef struct {
    lm_engine *e;
    int id;
    double deadline;
} thread_arg;

/* One submitter: its requests one after another, each consumed as the
 * request says (streaming or whole), cancelled where it says. */
static void *submitter(void *arg) {
    thread_arg *a = arg;
    lm_rng g;
    lm_rng_seed(&g, 900 + (uint64_t)a->id);
    for (int k = 0; k < per_thread; k++) {
        req *r = &reqs[a->id * MAX_PER_THREAD + k];
        lm_request_params p = params_of(r);
        lm_request *h = NULL;
        r->submit_rc = engine_submit(a->e, &p, &h, r->submit_err, sizeof r->submit_err);
        if (r->submit_rc != LM_OK) continue;
        if (!r->streaming && r->cancel_after >= 0) {
            usleep((useconds_t)(r->cancel_after * 100 + (int)(lm_rng_u64(&g) % 200)));
            engine_cancel(a->e, h);
            r->cancelled = true;
        }
        pthread_mutex_lock(&r->mu);
        int seen = 0;
        while (r->n_done < r->n) {
            if (r->streaming) {
                /* take the token events that came; a slow reader now and then */
                int got = 0;
                for (int i = 0; i < r->n; i++) got += r->n_tok[i];
                if (got > seen) {
                    seen = got;
                    if (r->cancel_after >= 0 && !r->cancelled && seen >= r->cancel_after) {
                        pthread_mutex_unlock(&r->mu);
                        engine_cancel(a->e, h);
                        pthread_mutex_lock(&r->mu);
                        r->cancelled = true;
                        continue;
                    }
                    if (lm_rng_u64(&g) % 16 == 0) {
                        pthread_mutex_unlock(&r->mu);
                        usleep(500);
                        pthread_mutex_lock(&r->mu);
                    }
                    continue;
                }
            }
            if (!wait_until(r, a->deadline)) {
                r->hung = true;
                break;
            }
        }
        pthread_mutex_unlock(&r->mu);
        if (r->hung) engine_cancel(a->e, h); /* engine_free would end it anyway */
        engine_request_release(a->e, h);
    }
    return NULL;
}

/* Whether request i is part of this run (per_thread of each thread's
 * MAX_PER_THREAD). */
static bool used(int i) { return i % MAX_PER_THREAD < per_thread; }

static lm_engine *new_engine(lm_model *m, int max_seqs, uint64_t kv_mem, bool prefix_cache) {
    lm_engine_config ec;
    engine_config_default(&ec);
    ec.n_threads = 2;
    ec.batch_tokens = 64;
    ec.max_seqs = max_seqs;
    ec.kv_mem = kv_mem;
    ec.block_size = BLOCK;
    ec.prefix_cache = prefix_cache;
    char err[LM_ERRLEN];
    lm_engine *e = engine_new(m, m->tok, &ec, err, sizeof err);
    if (!e) fprintf(stderr, "engine_new: %s\n", err);
    return e;
}

/* The reference: every request in a roomy engine, none cancelled. */
static void reference(lm_model *m) {
    lm_engine *e = new_engine(m, 64, 0, true);
    CHECK(e);
    char err[LM_ERRLEN];
    for (int i = 0; i < N_REQ; i++) {
        reset_events(&reqs[i]);
        if (!used(i)) continue;
        lm_request_params p = params_of(&reqs[i]);
        CHECKF(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK, "request %d: %s", i, err);
    }
    engine_wait_idle(e);
    lm_engine_stats st;
    engine_stats(e, &st);
    CHECKF(st.preemptions_total == 0, "%llu preemptions in the roomy pool", (unsigned long long)st.preemptions_total);
    for (int i = 0; i < N_REQ; i++) {
        req *r = &reqs[i];
        for (int c = 0; c < r->n && used(i); c++) {
            CHECKF(r->done[c] == 1 && (r->finish[c] == LM_FINISH_STOP || r->finish[c] == LM_FINISH_LENGTH),
                   "reference request %d choice %d: %d final events, finish %d", i, c, r->done[c], r->finish[c]);
            memcpy(ref_tokens[i][c], r->tokens[c], sizeof ref_tokens[i][c]);
            ref_n[i][c] = r->n_tok[c];
        }
    }
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    engine_free(e);
}

/* The load on model m in a pool of kv_blocks blocks of every layer's
 * positions (F16); the sliding-window model's pool splits that budget into
 * its global and local classes. */
static void pressure(lm_model *m, const char *name, int64_t kv_blocks, bool prefix_cache) {
    reference(m);
    if (test_cur_failed_) return;
    uint64_t block_bytes = (uint64_t)BLOCK * 2 * m->hp.n_layer * m->hp.n_head_kv * m->hp.head_dim * 2;
    lm_engine *e = new_engine(m, 64, (uint64_t)kv_blocks * block_bytes, prefix_cache);
    CHECK(e);
    lm_engine_stats st;
    engine_stats(e, &st);
    bool windowed = st.kv_local_blocks_total > 0;
    int64_t pool_blocks = st.kv_blocks_total;
    CHECKF(windowed ? pool_blocks < 3 * kv_blocks : pool_blocks == kv_blocks, "the pool has %lld blocks",
           (long long)pool_blocks);
    for (int i = 0; i < N_REQ; i++) reset_events(&reqs[i]);
    pthread_t th[N_THREADS];
    thread_arg args[N_THREADS];
    double t0 = lm_now(), deadline = deadline_of(hang_seconds);
    for (int t = 0; t < N_THREADS; t++) {
        args[t] = (thread_arg){.e = e, .id = t, .deadline = deadline};
        CHECK(pthread_create(&th[t], NULL, submitter, &args[t]) == 0);
    }
    for (int t = 0; t < N_THREADS; t++) pthread_join(th[t], NULL);
    double secs = lm_now() - t0;

    int n_refused = 0, n_hung = 0, n_stop = 0, n_length = 0, n_cancel = 0, n_error = 0, n_accepted = 0;
    int n_cancel_asked = 0, n_stream = 0, n_multi = 0, n_used = 0;
    for (int i = 0; i < N_REQ; i++) {
        req *r = &reqs[i];
        if (!used(i)) continue;
        n_used++;
        n_hung += r->hung;
        CHECKF(!r->hung, "request %d never finished (%d of %d choices ended)", i, r->n_done, r->n);
        if (r->submit_rc != LM_OK) {
            /* (the local class's rule adds refusals with a window) */
            CHECKF(r->submit_rc == LM_ERR_TOO_LONG && (windowed || never_fits(r, pool_blocks)) &&
                       strstr(r->submit_err, "KV blocks"),
                   "request %d (prompt %d, max_tokens %d, n %d) refused: %d %s", i, r->n_prompt, r->max_tokens, r->n,
                   r->submit_rc, r->submit_err);
            n_refused++;
            continue;
        }
        CHECKF(!never_fits(r, pool_blocks), "request %d cannot fit but was accepted", i);
        n_accepted++;
        n_cancel_asked += r->cancelled;
        n_stream += r->streaming;
        n_multi += r->n > 1;
        for (int c = 0; c < r->n; c++) {
            CHECKF(r->done[c] == 1, "request %d choice %d: %d final events", i, c, r->done[c]);
            switch (r->finish[c]) {
                case LM_FINISH_STOP: n_stop++; break;
                case LM_FINISH_LENGTH: n_length++; break;
                case LM_FINISH_CANCELLED: n_cancel++; break;
                default: n_error++; break;
            }
            CHECKF(r->finish[c] != LM_FINISH_ERROR, "request %d choice %d ended in error %d", i, c, r->status[c]);
            if (r->finish[c] == LM_FINISH_CANCELLED) {
                CHECKF(r->cancelled, "request %d choice %d cancelled without a cancel", i, c);
                CHECKF(r->n_tok[c] <= ref_n[i][c] && !memcmp(r->tokens[c], ref_tokens[i][c], (size_t)r->n_tok[c] * 4),
                       "request %d choice %d: a cancelled output is no prefix of its reference", i, c);
            } else {
                CHECKF(r->n_tok[c] == ref_n[i][c] && !memcmp(r->tokens[c], ref_tokens[i][c], (size_t)ref_n[i][c] * 4),
                       "request %d choice %d (prompt %d, n %d): %d tokens, reference %d, or they differ", i, c,
                       r->n_prompt, r->n, r->n_tok[c], ref_n[i][c]);
            }
        }
    }
    CHECK(n_hung == 0);
    CHECKF(n_refused > 0 && n_accepted > n_used / 2, "%d refused, %d accepted", n_refused, n_accepted);
    CHECKF(n_cancel > 0 && n_stream > 0 && n_multi > 0, "%d cancelled, %d streaming, %d with n > 1", n_cancel, n_stream,
           n_multi);

    engine_wait_idle(e);
    char err[LM_ERRLEN];
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    engine_stats(e, &st);
    CHECKF(st.preemptions_total > 0, "no preemption under %d threads in a %lld-block pool", N_THREADS,
           (long long)pool_blocks);
    CHECKF(st.running == 0 && st.waiting == 0, "%d running, %d waiting", st.running, st.waiting);
    CHECKF(st.kv_blocks_used == 0 && st.kv_blocks_free == st.kv_blocks_total, "%lld of %lld blocks used, %lld free",
           (long long)st.kv_blocks_used, (long long)st.kv_blocks_total, (long long)st.kv_blocks_free);
    CHECKF(st.kv_local_blocks_used == 0 && st.kv_local_blocks_free == st.kv_local_blocks_total,
           "%lld of %lld local blocks used, %lld free", (long long)st.kv_local_blocks_used,
           (long long)st.kv_local_blocks_total, (long long)st.kv_local_blocks_free);
    if (!prefix_cache)
        CHECKF(st.kv_blocks_cached == 0 && st.kv_local_blocks_cached == 0, "%lld cached blocks",
               (long long)(st.kv_blocks_cached + st.kv_local_blocks_cached));
    CHECKF(st.requests_total == (uint64_t)n_accepted && st.requests_finished == (uint64_t)n_accepted,
           "%llu accepted, %llu finished, %d expected", (unsigned long long)st.requests_total,
           (unsigned long long)st.requests_finished, n_accepted);
    char pool[64];
    if (windowed)
        snprintf(pool, sizeof pool, "%lld global + %lld local", (long long)pool_blocks,
                 (long long)st.kv_local_blocks_total);
    else snprintf(pool, sizeof pool, "%lld", (long long)pool_blocks);
    printf("NOTE %s, a pool of %s blocks, prefix cache %s: %d requests in %.1f s: %d refused (too long), %d accepted "
           "(%d streaming, %d with n > 1, %d cancels asked); choices: %d stop, %d length, %d cancelled, %d error, "
           "0 hung; %llu preemptions, %lld blocks cached\n",
           name, pool, prefix_cache ? "on" : "off", n_used, secs, n_refused, n_accepted, n_stream, n_multi,
           n_cancel_asked, n_stop, n_length, n_cancel, n_error, (unsigned long long)st.preemptions_total,
           (long long)st.kv_blocks_cached);
    engine_free(e);
}

static void test_pressure_prefix_cache(void) { pressure(model, "stories260K", POOL_BLOCKS, true); }
static void test_pressure_no_prefix_cache(void) { pressure(model, "stories260K", POOL_BLOCKS, false); }
static void test_pressure_sliding_window(void) {
    CHECK(swa);
    pressure(swa, "sliding-window variant", POOL_BLOCKS, true);
}

int main(void) {
    char err[LM_ERRLEN];
    model = model_load(TEST_MODEL, err, sizeof err);
    if (!model) {
        fprintf(stderr, "cannot load %s: %s\n", TEST_MODEL, err);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    if (getenv("LAMINA_ASAN") || getenv("LAMINA_EMULATED")) per_thread = 3;
    if (getenv("LAMINA_EMULATED")) hang_seconds = 10 * HANG_SECONDS;
    make_requests();
    TEST_RUN(test_pressure_prefix_cache);
    TEST_RUN(test_pressure_no_prefix_cache);
    swa = swa_model_load(TEST_MODEL, 8, 3, 128, err, sizeof err);
    if (!swa) fprintf(stderr, "the sliding-window model: %s\n", err);
    TEST_RUN(test_pressure_sliding_window);
    model_free(swa);
    model_free(model);
    return TEST_DONE();
}
