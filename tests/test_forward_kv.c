/*
 * test_forward_kv.c - the forward pass over the paged KV cache, at the level
 * of logits, on the bundled model:
 *   - a prompt whose leading blocks come from the prefix cache gives the
 *     same logits as a cold prefill of the whole prompt;
 *   - fork + copy-on-write: two branches continuing one prefix with
 *     different tokens each give the logits of their own cold run;
 *   - when every sequence is gone, every block is back in the pool
 *     (free or cached), and a pool too small gives an error, not a crash.
 * F32 KV, so equal reduction orders give equal bits; the bound used is
 * 1e-6 relative L2 (it measures 0 here).
 * And on a gemma3 variant of it with sliding windows of a few tokens
 * (swa_model.h), whose pool keeps only the local blocks a window can still
 * see: a sequence many windows long, prefilled in chunks and decoded token
 * by token, gives logits bit-identical (memcmp) to a pool that keeps every
 * layer's positions, while holding at most the bound of kv.h of local
 * blocks; forks and prefix-cache hits are bit-identical to cold runs; every
 * block of both classes comes back.
 * The batch budget (forward.h): one number sizes the workspace, the KV
 * chunk and the engine's tokens per iteration. Recorded facts: the sizes
 * derived from it agree (defaults, clamping to the context), a windowed
 * pool planned for shorter appends and a batch past the workspace's rows
 * are refused with an error, and the engine runs exactly n_batch prompt
 * tokens per iteration with exactly the local blocks that chunk plans.
 * Every allocation of the single-sequence constructors and of a fork
 * failing in turn gives NULL and a message, and leaves the pool as it was.
 * Split-K decode attention (1, 3, 8 and 16 threads) gives every decode
 * step's logits bit for bit. Under emulation (LAMINA_EMULATED, `make
 * test-arm`) 1 and 3 threads only: the unsplit and the split kernels, whose
 * spread over more threads is the same C on every architecture (run here
 * natively).
 */
#include <string.h>

#include "model/forward.h"
#include "kv/kv.h"
#include "sched/engine.h"
#include "model/model.h"
#include "format/quant.h"
#include "kernels/kernels.h"
#include "swa_model.h"
#include "engine_test.h"
#include "test.h"
#include "base/util.h"

static lm_model *model;
static lm_model *swa; /* window 8 on layers 0, 1, 3, 4; layer 2 global */
enum { SWA_WINDOW = 8, SWA_CTX = 256 };
static lm_pool *tpool;

static double rel_diff(const float *a, const float *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num / den);
}

static kv_pool *new_pool(int n_ctx, int n_seqs, int block) {
    kv_config kc;
    kv_config_init(&kc, model->hp.n_layer, model->hp.n_head_kv, model->hp.head_dim);
    kc.type = LM_TYPE_F32;
    kc.n_ctx = n_ctx;
    kc.n_seqs = n_seqs;
    kc.block_size = block;
    char err[LM_ERRLEN];
    return kv_pool_new(&kc, err, sizeof err);
}

/* Logits of the last token after a cold prefill of toks[0..n). */
static void cold_logits(const int32_t *toks, int n, float *out) {
    char err[LM_ERRLEN];
    lm_seqrun *s = seqrun_new(model, tpool, 128, 64, LM_TYPE_F32, err, sizeof err);
    seqrun_forward(s, toks, n, out, false, err, sizeof err);
    seqrun_free(s);
}

static void prompt(int32_t *toks, int n, uint64_t seed) {
    lm_rng r;
    lm_rng_seed(&r, seed);
    toks[0] = 1;
    for (int i = 1; i < n; i++) toks[i] = 3 + (int32_t)(lm_rng_u64(&r) % 500);
}

static void test_prefix_reuse(void) {
    int V = model->hp.n_vocab;
    int32_t toks[45];
    prompt(toks, 45, 1);
    float *cold = malloc((size_t)V * 4), *warm = malloc((size_t)V * 4);
    cold_logits(toks, 45, cold);
    int blocks[] = {16, 7, 1};
    for (int bi = 0; bi < 3; bi++) {
        kv_pool *kv = new_pool(128, 4, blocks[bi]);
        CHECK(kv != NULL);
        char err[LM_ERRLEN];
        /* the first user's prompt shares its first 40 tokens with the second's */
        lm_seqrun *a = seqrun_new_shared(model, tpool, kv, 128, 64, err, sizeof err);
        CHECKF(a != NULL, "%s", err);
        CHECK(seqrun_forward(a, toks, 40, warm, false, err, sizeof err) == 0);
        seqrun_prefix_commit(a, toks, 7);
        lm_seqrun *b = seqrun_new_shared(model, tpool, kv, 128, 64, err, sizeof err);
        int got = seqrun_prefix_match(b, toks, 45, 7);
        int want = 40 / blocks[bi] * blocks[bi];
        CHECKF(got == want, "block %d: matched %d, want %d", blocks[bi], got, want);
        CHECK(seqrun_forward(b, toks + got, 45 - got, warm, false, err, sizeof err) == 0);
        double e = rel_diff(warm, cold, V);
        printf("NOTE prefix reuse, block %2d: %d of 45 positions from the cache, rel diff %.2e\n", blocks[bi], got, e);
        CHECK(e < 1e-6);
        /* another tenant's salt gets nothing */
        lm_seqrun *c = seqrun_new_shared(model, tpool, kv, 128, 64, err, sizeof err);
        CHECK(seqrun_prefix_match(c, toks, 45, 8) == 0);
        seqrun_free(c);
        seqrun_free(b);
        seqrun_free(a);
        kv_stats st;
        kv_stats_get(kv, &st);
        CHECKF(st.n_used == 0 && st.n_free + st.n_cached == st.n_blocks && st.n_seqs == 0,
               "used %lld free %lld cached %lld", (long long)st.n_used, (long long)st.n_free, (long long)st.n_cached);
        CHECK(kv_pool_check(kv, err, sizeof err) == 0);
        kv_pool_free(kv);
    }
    free(cold);
    free(warm);
}

static void test_fork_cow(void) {
    int V = model->hp.n_vocab;
    int32_t base[20], xa[26], xb[26];
    prompt(base, 20, 2);
    memcpy(xa, base, sizeof base);
    memcpy(xb, base, sizeof base);
    prompt(xa + 20 - 1, 7, 3); /* overwrite from 19: keep BOS logic simple */
    prompt(xb + 20 - 1, 7, 4);
    xa[19] = base[19];
    xb[19] = base[19];
    float *ca = malloc((size_t)V * 4), *cb = malloc((size_t)V * 4), *la = malloc((size_t)V * 4),
          *lb = malloc((size_t)V * 4);
    cold_logits(xa, 26, ca);
    cold_logits(xb, 26, cb);
    kv_pool *kv = new_pool(64, 4, 16);
    char err[LM_ERRLEN];
    lm_seqrun *a = seqrun_new_shared(model, tpool, kv, 64, 64, err, sizeof err);
    CHECK(seqrun_forward(a, base, 20, la, false, err, sizeof err) == 0); /* 20 = one full block + 4 */
    lm_seqrun *b = seqrun_fork(a, err, sizeof err);
    CHECKF(b != NULL, "%s", err);
    CHECK(b->n_past == 20);
    /* both branches write into the shared partial block: copy-on-write */
    CHECK(seqrun_forward(a, xa + 20, 6, la, false, err, sizeof err) == 0);
    CHECK(seqrun_forward(b, xb + 20, 6, lb, false, err, sizeof err) == 0);
    double ea = rel_diff(la, ca, V), eb = rel_diff(lb, cb, V);
    printf("NOTE fork + copy-on-write: branch a rel diff %.2e, branch b %.2e\n", ea, eb);
    CHECK(ea < 1e-6 && eb < 1e-6);
    kv_stats st;
    kv_stats_get(kv, &st);
    CHECK(st.n_cow >= 1);
    seqrun_free(b);
    seqrun_free(a);
    kv_stats_get(kv, &st);
    CHECK(st.n_used == 0 && st.n_seqs == 0);
    kv_pool_free(kv);
    free(ca), free(cb), free(la), free(lb);
}

static void test_pool_exhaustion(void) {
    kv_pool *kv = new_pool(32, 1, 16); /* 2 blocks */
    char err[LM_ERRLEN];
    lm_seqrun *a = seqrun_new_shared(model, tpool, kv, 128, 64, err, sizeof err);
    int32_t toks[40];
    prompt(toks, 40, 5);
    float *lg = malloc((size_t)model->hp.n_vocab * 4);
    CHECK(seqrun_forward(a, toks, 30, lg, false, err, sizeof err) == 0);
    CHECK(seqrun_forward(a, toks + 30, 10, lg, false, err, sizeof err) != 0);
    CHECKF(strstr(err, "block") != NULL || strstr(err, "full") != NULL, "%s", err);
    CHECK(a->n_past == 30);
    /* the sequence is still usable within what the pool holds */
    CHECK(seqrun_forward(a, toks + 30, 2, lg, false, err, sizeof err) == 0);
    seqrun_free(a);
    kv_pool_free(kv);
    free(lg);
}

/* ---- sliding-window layers ------------------------------------------------ */

/* A pool for the sliding-window model: with its local class (windowed), or
 * one class keeping every layer's positions (the reference layout). */
static kv_pool *swa_pool(bool windowed, uint32_t type, int block, int chunk, int n_seqs) {
    kv_config kc;
    fwd_dims d = fwd_dims_make(swa, SWA_CTX, chunk);
    fwd_kv_config(swa, &d, &kc);
    if (!windowed) kc.window = 0, kc.layer_local = NULL;
    kc.type = type;
    kc.block_size = block;
    kc.n_seqs = n_seqs;
    char err[LM_ERRLEN];
    kv_pool *p = kv_pool_new(&kc, err, sizeof err);
    if (!p) fprintf(stderr, "  kv_pool_new: %s\n", err);
    return p;
}

static int all_back(const kv_pool *kv) {
    kv_stats st;
    kv_stats_get(kv, &st);
    for (int c = 0; c < KV_N_CLASS; c++)
        if (st.cls[c].n_used || st.cls[c].n_free + st.cls[c].n_cached != st.cls[c].n_blocks) return 0;
    char err[LM_ERRLEN];
    return st.n_seqs == 0 && kv_pool_check(kv, err, sizeof err) == KV_OK;
}

/* Prefill `prefill` tokens in chunks of n_batch with every row's logits,
 * then decode the rest one by one; out gets n rows, *held (when not NULL)
 * the local blocks held at the end. After every decode step a windowed pool
 * must hold ceil(len/B) global blocks and no more local ones than kv.h's
 * bound for an append of one. 0, or -1 with a message. */
static int swa_run(kv_pool *kv, int n_batch, const int32_t *toks, int n, int prefill, float *out, int *held) {
    char err[LM_ERRLEN];
    int V = swa->hp.n_vocab, B = kv_pool_layout(kv)->block_size;
    lm_seqrun *s = seqrun_new_shared(swa, tpool, kv, SWA_CTX, n_batch, err, sizeof err);
    if (!s || seqrun_forward(s, toks, prefill, out, true, err, sizeof err)) {
        fprintf(stderr, "  %s\n", err);
        seqrun_free(s);
        return -1;
    }
    for (int i = prefill; i < n; i++) {
        if (seqrun_forward(s, toks + i, 1, out + (size_t)i * V, false, err, sizeof err)) {
            fprintf(stderr, "  %s\n", err);
            seqrun_free(s);
            return -1;
        }
        int len = i + 1, bound = (SWA_WINDOW + 1 + 2 * B - 3) / B;
        if (kv_pool_window(kv) &&
            (kv_seq_held(s->seq, KV_GLOBAL) != (len + B - 1) / B || kv_seq_held(s->seq, KV_LOCAL) > bound)) {
            fprintf(stderr, "  length %d: %d global, %d local blocks held (local bound %d)\n", len,
                    kv_seq_held(s->seq, KV_GLOBAL), kv_seq_held(s->seq, KV_LOCAL), bound);
            seqrun_free(s);
            return -1;
        }
    }
    if (held) *held = kv_seq_held(s->seq, KV_LOCAL);
    seqrun_free(s);
    return 0;
}

/* A sequence of 200 tokens (25 windows): prefill in chunks, then decode,
 * for several block sizes, chunk sizes and KV types: logits bit-identical to
 * the one-class pool, with few local blocks held. */
static void test_swa_matches_keep_all(void) {
    enum { N = 200, PREFILL = 90 };
    int V = swa->hp.n_vocab;
    int32_t toks[N];
    prompt(toks, N, 11);
    float *ref = malloc((size_t)N * V * 4), *got = malloc((size_t)N * V * 4);
    static const uint32_t types[2] = {LM_TYPE_F32, LM_TYPE_F16};
    static const int blocks[4] = {16, 5, 3, 1}, chunks[2] = {7, 24};
    for (int ti = 0; ti < 2; ti++)
        for (int ci = 0; ci < 2; ci++) {
            kv_pool *plain = swa_pool(false, types[ti], 16, chunks[ci], 1);
            CHECK(plain && swa_run(plain, chunks[ci], toks, N, PREFILL, ref, NULL) == 0);
            CHECK(all_back(plain));
            kv_pool_free(plain);
            for (int bi = 0; bi < 4; bi++) {
                kv_pool *kv = swa_pool(true, types[ti], blocks[bi], chunks[ci], 1);
                CHECK(kv && kv_pool_window(kv) == SWA_WINDOW);
                int held = 0;
                CHECKF(swa_run(kv, chunks[ci], toks, N, PREFILL, got, &held) == 0, "block %d chunk %d", blocks[bi],
                       chunks[ci]);
                for (int t = 0; t < N; t++)
                    CHECKF(!memcmp(got + (size_t)t * V, ref + (size_t)t * V, (size_t)V * 4),
                           "%s block %d chunk %d: logits of position %d differ from the one-class pool",
                           quant_type_name(types[ti]), blocks[bi], chunks[ci], t);
                int nb = (N + blocks[bi] - 1) / blocks[bi];
                CHECKF(held < nb, "%d local blocks of %d: nothing was released", held, nb);
                if (ti == 0 && ci == 0)
                    printf("NOTE sliding window %d, block %2d: %d positions in %d global and %d local blocks, logits "
                           "identical to keeping every layer\n",
                           SWA_WINDOW, blocks[bi], N, nb, held);
                CHECK(all_back(kv));
                kv_pool_free(kv);
            }
        }
    free(ref);
    free(got);
}

/* Fork a sequence 4 windows long in the middle of a block; each branch
 * writes into the shared partial block (a copy in each class) and decodes
 * 30 more tokens: every step bit-identical to a cold run of its own tokens. */
static void test_swa_fork(void) {
    enum { BASE = 35, MORE = 30, N = BASE + MORE };
    int V = swa->hp.n_vocab;
    int32_t xa[N], xb[N];
    prompt(xa, N, 21);
    memcpy(xb, xa, BASE * sizeof *xb);
    prompt(xb + BASE - 1, MORE + 1, 22);
    xb[BASE - 1] = xa[BASE - 1];
    float *ca = malloc((size_t)N * V * 4), *cb = malloc((size_t)N * V * 4), *lg = malloc((size_t)V * 4);
    kv_pool *kv = swa_pool(true, LM_TYPE_F32, 4, 16, 4);
    CHECK(kv);
    CHECK(swa_run(kv, 16, xa, N, BASE, ca, NULL) == 0 && swa_run(kv, 16, xb, N, BASE, cb, NULL) == 0);
    char err[LM_ERRLEN];
    lm_seqrun *a = seqrun_new_shared(swa, tpool, kv, SWA_CTX, 16, err, sizeof err);
    CHECK(seqrun_forward(a, xa, BASE, lg, false, err, sizeof err) == 0);
    CHECK(kv_seq_held(a->seq, KV_LOCAL) < kv_seq_held(a->seq, KV_GLOBAL));
    lm_seqrun *b = seqrun_fork(a, err, sizeof err);
    CHECKF(b != NULL, "%s", err);
    kv_stats st0, st;
    kv_stats_get(kv, &st0);
    for (int i = BASE; i < N; i++) {
        CHECK(seqrun_forward(a, xa + i, 1, lg, false, err, sizeof err) == 0);
        CHECKF(!memcmp(lg, ca + (size_t)i * V, (size_t)V * 4), "branch a, position %d", i);
        CHECK(seqrun_forward(b, xb + i, 1, lg, false, err, sizeof err) == 0);
        CHECKF(!memcmp(lg, cb + (size_t)i * V, (size_t)V * 4), "branch b, position %d", i);
    }
    kv_stats_get(kv, &st);
    CHECKF(st.n_cow - st0.n_cow == 2, "%llu copies", (unsigned long long)(st.n_cow - st0.n_cow));
    seqrun_free(b);
    seqrun_free(a);
    CHECK(all_back(kv));
    kv_pool_free(kv);
    free(ca), free(cb), free(lg);
}

/* Prefix cache: after a request computed 60 tokens, a prompt extending
 * them reuses all 60, and a prompt sharing only the first 40 reuses 40 when
 * the blocks were committed after every chunk (as the engine does), local
 * blocks of its window included; committed only at the end, the local
 * blocks below the last window were released unkeyed, so that match
 * shortens to nothing. Every case gives the logits of a cold prefill. */
static void test_swa_prefix_cache(void) {
    enum { N = 80, SHARED = 60, PART = 40 };
    int V = swa->hp.n_vocab;
    int32_t toks[2][N];
    prompt(toks[0], N, 31);
    memcpy(toks[1], toks[0], PART * sizeof(int32_t));
    prompt(toks[1] + PART - 1, N - PART + 1, 32);
    toks[1][PART - 1] = toks[0][PART - 1];
    float *cold[2] = {malloc((size_t)N * V * 4), malloc((size_t)N * V * 4)}, *lg = malloc((size_t)V * 4);
    kv_pool *kv = swa_pool(true, LM_TYPE_F32, 4, 8, 4);
    CHECK(kv && swa_run(kv, 8, toks[0], N, N, cold[0], NULL) == 0 && swa_run(kv, 8, toks[1], N, N, cold[1], NULL) == 0);
    char err[LM_ERRLEN];
    for (int per_chunk = 1; per_chunk >= 0; per_chunk--) {
        uint64_t salt = 40 + (uint64_t)per_chunk;
        lm_seqrun *a = seqrun_new_shared(swa, tpool, kv, SWA_CTX, 8, err, sizeof err);
        for (int i = 0; i < SHARED; i += 8) {
            int n = SHARED - i < 8 ? SHARED - i : 8;
            CHECK(seqrun_forward(a, toks[0] + i, n, lg, false, err, sizeof err) == 0);
            if (per_chunk) seqrun_prefix_commit(a, toks[0], salt);
        }
        seqrun_prefix_commit(a, toks[0], salt);
        seqrun_free(a);
        for (int pi = 0; pi < 2; pi++) {
            lm_seqrun *b = seqrun_new_shared(swa, tpool, kv, SWA_CTX, 8, err, sizeof err);
            int got = seqrun_prefix_match(b, toks[pi], N, salt);
            int want = pi == 0 ? SHARED : per_chunk ? PART : 0;
            CHECKF(got == want, "prompt %d, %s: matched %d, want %d", pi, per_chunk ? "per chunk" : "at the end", got,
                   want);
            if (got) CHECK(kv_seq_held(b->seq, KV_LOCAL) < kv_seq_held(b->seq, KV_GLOBAL));
            CHECK(seqrun_forward(b, toks[pi] + got, N - got, lg, false, err, sizeof err) == 0);
            CHECKF(!memcmp(lg, cold[pi] + (size_t)(N - 1) * V, (size_t)V * 4), "prefix hit of %d positions", got);
            printf("NOTE sliding-window prefix cache, committed %s: %d of the %d shared positions reused, logits "
                   "identical to a cold prefill\n",
                   per_chunk ? "per chunk " : "at the end", got, pi == 0 ? SHARED : PART);
            seqrun_free(b);
        }
        CHECK(all_back(kv));
    }
    kv_pool_free(kv);
    free(cold[0]), free(cold[1]), free(lg);
}

/* ---- the batch budget ---------------------------------------------------- */

/* Final events of a request: how many, and whether one was an error (as a
 * batch past the workspace's rows would be). */
typedef struct {
    int done, errors;
} finals;

static void on_event(void *user, const lm_event *ev) {
    finals *f = user;
    f->done += ev->done;
    f->errors += ev->done && ev->finish == LM_FINISH_ERROR;
}

/* Iterations the engine ran for one prompt of n tokens (one generated
 * token), or -1 when it did not end well; its stats in *st. */
static int engine_iterations(lm_engine *e, int n, lm_engine_stats *st) {
    int32_t toks[SWA_CTX];
    prompt(toks, n, 51);
    finals fin = {0, 0};
    lm_request_params p;
    engine_request_params_default(&p);
    p.prompt = toks;
    p.n_prompt = n;
    p.max_tokens = 1;
    p.sp.temp = 0;
    p.on_event = on_event;
    p.user = &fin;
    lm_engine_stats s0;
    engine_stats(e, &s0);
    char err[LM_ERRLEN];
    if (engine_submit(e, &p, NULL, err, sizeof err) != LM_OK) {
        fprintf(stderr, "  engine_submit: %s\n", err);
        return -1;
    }
    engine_wait_idle(e);
    engine_stats(e, st);
    return fin.done == 1 && !fin.errors ? (int)(st->iterations - s0.iterations) : -1;
}

static void test_batch_budget(void) {
    char err[LM_ERRLEN];
    /* derivation: defaults, and never more than the context */
    fwd_dims d = fwd_dims_make(swa, 0, 0);
    CHECK(d.n_ctx == SWA_CTX && d.n_batch == (FWD_BATCH_DEFAULT < SWA_CTX ? FWD_BATCH_DEFAULT : SWA_CTX));
    d = fwd_dims_make(swa, 100, 0);
    CHECK(d.n_ctx == 100 && d.n_batch == (FWD_BATCH_DEFAULT < 100 ? FWD_BATCH_DEFAULT : 100));
    d = fwd_dims_make(model, 4096, 0);
    CHECK(d.n_ctx == 4096 && d.n_batch == FWD_BATCH_DEFAULT);
    d = fwd_dims_make(swa, 100, 101);
    CHECK(d.n_batch == 100);
    d = fwd_dims_make(swa, 100, 12);
    CHECK(d.n_ctx == 100 && d.n_batch == 12);
    kv_config kc;
    fwd_kv_config(swa, &d, &kc);
    CHECK(kc.chunk == 12 && kc.n_ctx == 100 && kc.window == SWA_WINDOW && kc.layer_local == swa->layer_local);

    /* a single sequence: its workspace's rows are its own pool's chunk */
    lm_seqrun *r = seqrun_new(swa, tpool, 100, 12, LM_TYPE_F32, err, sizeof err);
    CHECKF(r != NULL, "%s", err);
    CHECK(r->n_ctx == 100 && r->fwd->dims.n_batch == 12 && kv_pool_plan(r->kv)->chunk == 12);
    seqrun_free(r);
    r = seqrun_new(swa, tpool, 0, 0, LM_TYPE_F32, err, sizeof err);
    CHECKF(r != NULL, "%s", err);
    CHECK(r->n_ctx == SWA_CTX && r->fwd->dims.n_batch == fwd_dims_make(swa, 0, 0).n_batch &&
          kv_pool_plan(r->kv)->chunk == r->fwd->dims.n_batch);
    seqrun_free(r);

    /* a windowed pool planned for appends of 8 takes workspaces of up to 8 */
    kv_pool *kv = swa_pool(true, LM_TYPE_F32, 4, 8, 2);
    CHECK(kv && kv_pool_plan(kv)->chunk == 8);
    fwd_dims d8 = fwd_dims_make(swa, SWA_CTX, 8), d9 = fwd_dims_make(swa, SWA_CTX, 9);
    lm_fwd *f = fwd_new(swa, tpool, kv, &d9, err, sizeof err);
    CHECKF(f == NULL && strstr(err, "9 tokens") && strstr(err, "at most 8"), "%s", err);
    CHECK(seqrun_new_shared(swa, tpool, kv, SWA_CTX, 9, err, sizeof err) == NULL);
    f = fwd_new(swa, tpool, kv, &d8, err, sizeof err);
    CHECKF(f != NULL, "%s", err);
    /* a batch of 9 rows (two segments) is refused before anything runs */
    int32_t toks[9];
    prompt(toks, 9, 52);
    kv_seq *a = kv_seq_new(kv, err, sizeof err), *b = kv_seq_new(kv, err, sizeof err);
    CHECK(a && b && kv_append(kv, a, 5, err, sizeof err) == KV_OK && kv_append(kv, b, 4, err, sizeof err) == KV_OK);
    float *lg = malloc((size_t)2 * swa->hp.n_vocab * 4);
    lm_seg segs[2] = {{.seq = a, .pos0 = 0, .n = 5, .n_logits = 1}, {.seq = b, .pos0 = 0, .n = 4, .n_logits = 1}};
    CHECKF(fwd_run(f, toks, segs, 2, lg, err, sizeof err) != 0 && strstr(err, "more than 8 tokens"), "%s", err);
    segs[1].n = 3; /* 8 rows: at capacity */
    CHECKF(fwd_run(f, toks, segs, 2, lg, err, sizeof err) == 0, "%s", err);
    kv_seq_free(kv, a);
    kv_seq_free(kv, b);
    fwd_free(f);
    CHECK(all_back(kv));
    kv_pool_free(kv);
    free(lg);
    /* the KV pool cannot be planned for sliding windows without a chunk */
    fwd_kv_config(swa, &d, &kc);
    kc.chunk = 0;
    kv_plan pl;
    CHECK(kv_plan_make(&kc, &pl, err, sizeof err) == KV_ERR && strstr(err, "chunk"));

    /* the engine: a budget of 16 runs a prompt of 16 in one iteration and
     * one of 17 in two, and its pool holds the local blocks of appends of 16
     * for each of its sequences */
    lm_engine_config ec;
    engine_config_default(&ec);
    ec.n_threads = 2;
    ec.batch_tokens = 16;
    ec.max_seqs = 3;
    ec.n_ctx = SWA_CTX;
    ec.kv_type = LM_TYPE_F32;
    ec.prefix_cache = false; /* every prompt computed in full */
    lm_engine *e = engine_new(swa, swa->tok, &ec, err, sizeof err);
    CHECKF(e != NULL, "%s", err);
    fwd_dims de = fwd_dims_make(swa, SWA_CTX, 16);
    fwd_kv_config(swa, &de, &kc);
    kc.type = ec.kv_type;
    kc.block_size = ec.block_size;
    kc.n_seqs = ec.max_seqs;
    CHECK(kv_plan_make(&kc, &pl, err, sizeof err) == KV_OK);
    /* window 8 + chunk 16 in blocks of 16: ceil((8 + 16 + 16 - 2) / 16) = 3 */
    CHECK(pl.local_blocks_per_seq == 3);
    lm_engine_stats st;
    CHECK(engine_iterations(e, 16, &st) == 1);
    CHECK(st.kv_local_blocks_total == 3 * pl.local_blocks_per_seq && st.kv_blocks_total == pl.cls[KV_GLOBAL].n_blocks);
    CHECK(engine_iterations(e, 17, &st) == 2);
    CHECK(engine_check(e, err, sizeof err) == 0);
    engine_free(e);
    /* the default budget, clamped to a context of 40: a prompt of 39 in one
     * iteration */
    ec.batch_tokens = 0;
    ec.n_ctx = 40;
    e = engine_new(swa, swa->tok, &ec, err, sizeof err);
    CHECKF(e != NULL, "%s", err);
    CHECK(engine_iterations(e, 39, &st) == 1);
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    engine_free(e);
}

/* Every allocation of seqrun_new, seqrun_new_shared and seqrun_fork
 * failing in turn: NULL with a message, nothing left held in a shared pool
 * (and nothing leaked, under ASan), and the pool still usable. */
static void test_alloc_failure(void) {
    char err[LM_ERRLEN];
    int n_fail = 0;
    for (long k = 0;; k++) {
        err[0] = 0;
        lm_alloc_fail_after(k);
        lm_seqrun *r = seqrun_new(swa, tpool, 64, 8, LM_TYPE_F16, err, sizeof err);
        lm_alloc_fail_after(-1);
        if (r) {
            seqrun_free(r);
            break;
        }
        n_fail++;
        CHECKF(err[0] != 0, "allocation %ld failed without a message", k);
    }
    kv_pool *kv = swa_pool(true, LM_TYPE_F32, 4, 8, 4);
    CHECK(kv);
    int32_t toks[20];
    prompt(toks, 20, 61);
    lm_seqrun *a = seqrun_new_shared(swa, tpool, kv, SWA_CTX, 8, err, sizeof err);
    CHECK(a && seqrun_forward(a, toks, 20, NULL, false, err, sizeof err) == 0);
    for (long k = 0;; k++) {
        err[0] = 0;
        lm_alloc_fail_after(k);
        lm_seqrun *b = seqrun_new_shared(swa, tpool, kv, SWA_CTX, 8, err, sizeof err);
        lm_seqrun *f = b ? seqrun_fork(a, err, sizeof err) : NULL;
        lm_alloc_fail_after(-1);
        CHECKF(f || err[0] != 0, "allocation %ld failed without a message", k);
        kv_stats st;
        kv_stats_get(kv, &st);
        CHECKF(st.n_seqs == 1 + (b != NULL) + (f != NULL), "allocation %ld: %lld sequences", k, (long long)st.n_seqs);
        seqrun_free(f);
        seqrun_free(b);
        n_fail += !f;
        if (f) break;
    }
    seqrun_free(a);
    CHECK(all_back(kv));
    kv_pool_free(kv);
    printf("NOTE allocation failure: %d injected failures, each an error with a message\n", n_fail);
}

/* Split-K in the pass: decode steps past 2048 positions on pools of 1, 3,
 * 8 and 16 threads. The model's 4 KV heads make 4 attention items per
 * decode step, so 3, 8 and 16 threads cut each item into one unit per key
 * split (forward.c's attn_plan: on 3, 4 items of 9 splits are each above
 * half a thread's share) while 1 thread runs the items whole:
 * every step's logits must be bit-identical (memcmp) across the four, in F32
 * and F16 caches (attn.h: the splits sit on a fixed grid and are merged in
 * one order however they are spread). A prompt of 2100 tokens in chunks of
 * 64, then 12 decode steps (9 splits: above FWD_ATTN_SPLIT_MIN). Under
 * LAMINA_EMULATED, 1 and 3 threads: whole items against split ones, after a
 * prompt of 1100 tokens (5 splits, each item still above half a thread's
 * share on 3), which is the prefill's time under qemu cut by about four. */
static void test_split_k_threads(void) {
    enum { PROMPT_MAX = 2100, STEPS = 12 };
    bool emulated = getenv("LAMINA_EMULATED") != NULL;
    const int PROMPT = emulated ? 1100 : PROMPT_MAX, CTX = PROMPT + 100;
    int V = model->hp.n_vocab;
    int32_t toks[PROMPT_MAX + STEPS];
    prompt(toks, PROMPT + STEPS, 23);
    static const int all_nths[] = {1, 3, 8, 16}, emulated_nths[] = {1, 3};
    const int *nths = emulated ? emulated_nths : all_nths;
    size_t n_nths = emulated ? 2 : 4;
    static const uint32_t types[] = {LM_TYPE_F32, LM_TYPE_F16};
    float *ref = malloc((size_t)STEPS * V * 4), *got = malloc((size_t)STEPS * V * 4);
    char err[LM_ERRLEN];
    for (size_t ti = 0; ti < 2; ti++)
        for (size_t ni = 0; ni < n_nths; ni++) {
            lm_pool *pool = pool_new(nths[ni]);
            lm_seqrun *s = seqrun_new(model, pool, CTX, 64, types[ti], err, sizeof err);
            CHECKF(s != NULL, "%s", err);
            int rc = s ? seqrun_forward(s, toks, PROMPT, got, false, err, sizeof err) : -1;
            for (int i = 0; i < STEPS && !rc; i++)
                rc = seqrun_forward(s, toks + PROMPT + i, 1, (ni ? got : ref) + (size_t)i * V, false, err, sizeof err);
            CHECKF(!rc, "%s", err);
            if (s) /* forward.c's runs: every planned unit run once, however threads took them over */
                CHECKF(s->fwd->attn_units_run == s->fwd->attn_units_planned && s->fwd->attn_units_planned > 0,
                       "%d threads: %ld attention units run, %ld planned", nths[ni], (long)s->fwd->attn_units_run,
                       s->fwd->attn_units_planned);
            if (s) /* one thread runs the items whole, more cut them */
                CHECKF(nths[ni] == 1 ? s->fwd->attn_split_items == 0 : s->fwd->attn_split_items > 0,
                       "%d threads: %ld items cut", nths[ni], (long)s->fwd->attn_split_items);
            seqrun_free(s);
            pool_free(pool);
            if (ni)
                for (int i = 0; i < STEPS; i++)
                    CHECKF(!memcmp(got + (size_t)i * V, ref + (size_t)i * V, (size_t)V * 4),
                           "%s, %d threads: the logits of decode step %d differ from one thread's",
                           quant_type_name(types[ti]), nths[ni], i);
        }
    free(ref), free(got);
}

/* The split-K switch (forward.h: LAMINA_ATTN_SPLIT, read by fwd_new): on
 * 8 threads the 4 items of a decode step at positions 1100.. (5 key splits)
 * are cut by default and by LAMINA_ATTN_SPLIT=2, run whole with =0 and
 * with =6 (more splits than they have); the count of cut items says which
 * path ran, and the logits of every step must be the same bits whichever
 * (the splits sit on a fixed grid, merged in one order). A value that is
 * not a count fails the workspace with a message naming the variable. */
static void test_split_k_switch(void) {
    enum { PROMPT = 1100, STEPS = 4, CTX = 1120 };
    int V = model->hp.n_vocab;
    int32_t toks[PROMPT + STEPS];
    prompt(toks, PROMPT + STEPS, 29);
    static const char *const vals[] = {NULL, "0", "2", "6"};
    static const bool cut[] = {true, false, true, false};
    float *ref = malloc((size_t)STEPS * V * 4), *got = malloc((size_t)STEPS * V * 4);
    char err[LM_ERRLEN];
    lm_pool *pool = pool_new(8);
    unsetenv("LAMINA_ATTN_SPLIT");
    lm_seqrun *src = seqrun_new(model, pool, CTX, 512, LM_TYPE_F16, err, sizeof err); /* prefilled once */
    CHECKF(src && seqrun_forward(src, toks, PROMPT, NULL, false, err, sizeof err) == 0, "%s", err);
    for (size_t vi = 0; src && vi < sizeof vals / sizeof vals[0]; vi++) {
        if (vals[vi]) setenv("LAMINA_ATTN_SPLIT", vals[vi], 1);
        else unsetenv("LAMINA_ATTN_SPLIT");
        lm_seqrun *s = seqrun_fork(src, err, sizeof err); /* a workspace of its own: fwd_new reads the switch */
        CHECKF(s != NULL, "%s", err);
        if (!s) continue;
        int rc = 0;
        for (int i = 0; i < STEPS && !rc; i++)
            rc = seqrun_forward(s, toks + PROMPT + i, 1, (vi ? got : ref) + (size_t)i * V, false, err, sizeof err);
        CHECKF(!rc, "%s", err);
        long n_cut = s->fwd->attn_split_items;
        CHECKF(cut[vi] ? n_cut == (long)STEPS * model->hp.n_layer * model->hp.n_head_kv : n_cut == 0,
               "LAMINA_ATTN_SPLIT=%s: %ld items cut in %d decode steps", vals[vi] ? vals[vi] : "(unset)", n_cut, STEPS);
        seqrun_free(s);
        for (int i = 0; vi && i < STEPS; i++)
            CHECKF(!memcmp(got + (size_t)i * V, ref + (size_t)i * V, (size_t)V * 4),
                   "LAMINA_ATTN_SPLIT=%s: the logits of decode step %d differ from the default's", vals[vi], i);
    }
    setenv("LAMINA_ATTN_SPLIT", "two", 1);
    err[0] = 0;
    lm_seqrun *bad = src ? seqrun_fork(src, err, sizeof err) : NULL;
    CHECKF(!bad && strstr(err, "LAMINA_ATTN_SPLIT=two"), "a malformed LAMINA_ATTN_SPLIT: %s", bad ? "accepted" : err);
    seqrun_free(bad);
    unsetenv("LAMINA_ATTN_SPLIT");
    seqrun_free(src);
    pool_free(pool);
    free(ref), free(got);
}

/* Split-K in a batch of decode steps at different depths (forward.c's
 * attn_plan): one sequence at position 1100 (5 key splits) beside two at
 * 10 (one split) on 8 threads make 12 items, the deep sequence's 4 each
 * above half a thread's share of the 28 splits: those are cut, the others
 * run whole. Each row's logits must be the bits of its sequence decoded
 * alone (a fork of it, in a pass of its own). */
static void test_split_k_batch(void) {
    enum { DEEP = 1100, SHALLOW = 10, CTX = 1120, NS = 3 };
    int V = model->hp.n_vocab;
    int32_t toks[DEEP + 1];
    prompt(toks, DEEP + 1, 31);
    float *ref = malloc((size_t)NS * V * 4), *got = malloc((size_t)NS * V * 4);
    char err[LM_ERRLEN];
    lm_pool *pool = pool_new(8);
    kv_pool *kv = new_pool(CTX, 2 * NS, 16);
    CHECK(kv != NULL);
    lm_seqrun *r[NS] = {0}, *fk[NS] = {0};
    lm_seg segs[NS];
    int32_t next[NS];
    for (int i = 0; kv && i < NS; i++) {
        int len = i == 0 ? DEEP : SHALLOW;
        r[i] = seqrun_new_shared(model, pool, kv, CTX, 512, err, sizeof err);
        CHECKF(r[i] && seqrun_forward(r[i], toks + i, len, NULL, false, err, sizeof err) == 0, "%s", err);
        next[i] = toks[i + len];
        fk[i] = r[i] ? seqrun_fork(r[i], err, sizeof err) : NULL; /* alone: the reference */
        CHECKF(fk[i] && seqrun_forward(fk[i], next + i, 1, ref + (size_t)i * V, false, err, sizeof err) == 0, "%s",
               err);
        CHECK(kv_append(kv, r[i]->seq, 1, err, sizeof err) == KV_OK);
        segs[i] = (lm_seg){.seq = r[i]->seq, .pos0 = len, .n = 1, .n_logits = 1};
    }
    if (r[0]) {
        long before = r[0]->fwd->attn_split_items;
        CHECKF(fwd_run(r[0]->fwd, next, segs, NS, got, err, sizeof err) == 0, "%s", err);
        long n_cut = r[0]->fwd->attn_split_items - before;
        CHECKF(n_cut == (long)model->hp.n_layer * model->hp.n_head_kv, "%ld items cut in one step, %d expected", n_cut,
               model->hp.n_layer * model->hp.n_head_kv);
        for (int i = 0; i < NS; i++)
            CHECKF(!memcmp(got + (size_t)i * V, ref + (size_t)i * V, (size_t)V * 4),
                   "row %d of the batch differs from its sequence decoded alone", i);
    }
    for (int i = 0; i < NS; i++) seqrun_free(fk[i]), seqrun_free(r[i]);
    CHECK(!kv || all_back(kv));
    kv_pool_free(kv);
    pool_free(pool);
    free(ref), free(got);
}

int main(void) {
    kernels_init();
    char err[LM_ERRLEN];
    if (!(model = test_model_load())) return 1;
    swa = swa_model_load(TEST_MODEL, SWA_WINDOW, 3, SWA_CTX, err, sizeof err);
    if (!swa) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    tpool = pool_new(2);
    TEST_RUN(test_prefix_reuse);
    TEST_RUN(test_fork_cow);
    TEST_RUN(test_pool_exhaustion);
    TEST_RUN(test_swa_matches_keep_all);
    TEST_RUN(test_swa_fork);
    TEST_RUN(test_swa_prefix_cache);
    TEST_RUN(test_batch_budget);
    TEST_RUN(test_alloc_failure);
    TEST_RUN(test_split_k_threads);
    TEST_RUN(test_split_k_switch);
    TEST_RUN(test_split_k_batch);
    pool_free(tpool);
    model_free(swa);
    model_free(model);
    return TEST_DONE();
}
