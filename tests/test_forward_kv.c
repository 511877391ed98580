/*
 * test_forward_kv.c - the forward pass over the paged KV cache, at the level
 * of logits, on the bundled model:
 *   - a prompt whose leading blocks come from the prefix cache gives the
 *     same logits as a cold prefill of the whole prompt;
 *   - fork + copy-on-write: two branches continuing one prefix with
 *     different tokens each give the logits of their own cold run;
 *   - when every state is gone, every block is back in the pool
 *     (free or cached), and a pool too small gives an error, not a crash.
 * F32 KV, so equal reduction orders give equal bits; the bound used is
 * 1e-6 relative L2 (it measures 0 here).
 */
#include <string.h>

#include "forward.h"
#include "kv.h"
#include "model.h"
#include "quant.h"
#include "test.h"
#include "util.h"

static lm_model *model;
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
    lm_state *s = state_new_kv(model, tpool, 128, 64, LM_TYPE_F32, err, sizeof err);
    state_forward(s, toks, n, out, false, err, sizeof err);
    state_free(s);
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
        lm_state *a = state_new_shared(model, tpool, kv, 128, 64, err, sizeof err);
        CHECKF(a != NULL, "%s", err);
        CHECK(state_forward(a, toks, 40, warm, false, err, sizeof err) == 0);
        state_prefix_commit(a, toks, 7);
        lm_state *b = state_new_shared(model, tpool, kv, 128, 64, err, sizeof err);
        int got = state_prefix_match(b, toks, 45, 7);
        int want = 40 / blocks[bi] * blocks[bi];
        CHECKF(got == want, "block %d: matched %d, want %d", blocks[bi], got, want);
        CHECK(state_forward(b, toks + got, 45 - got, warm, false, err, sizeof err) == 0);
        double e = rel_diff(warm, cold, V);
        printf("NOTE prefix reuse, block %2d: %d of 45 positions from the cache, rel diff %.2e\n", blocks[bi], got, e);
        CHECK(e < 1e-6);
        /* another tenant's salt gets nothing */
        lm_state *c = state_new_shared(model, tpool, kv, 128, 64, err, sizeof err);
        CHECK(state_prefix_match(c, toks, 45, 8) == 0);
        state_free(c);
        state_free(b);
        state_free(a);
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
    lm_state *a = state_new_shared(model, tpool, kv, 64, 64, err, sizeof err);
    CHECK(state_forward(a, base, 20, la, false, err, sizeof err) == 0); /* 20 = one full block + 4 */
    lm_state *b = state_fork(a, err, sizeof err);
    CHECKF(b != NULL, "%s", err);
    CHECK(b->n_past == 20);
    /* both branches write into the shared partial block: copy-on-write */
    CHECK(state_forward(a, xa + 20, 6, la, false, err, sizeof err) == 0);
    CHECK(state_forward(b, xb + 20, 6, lb, false, err, sizeof err) == 0);
    double ea = rel_diff(la, ca, V), eb = rel_diff(lb, cb, V);
    printf("NOTE fork + copy-on-write: branch a rel diff %.2e, branch b %.2e\n", ea, eb);
    CHECK(ea < 1e-6 && eb < 1e-6);
    kv_stats st;
    kv_stats_get(kv, &st);
    CHECK(st.n_cow >= 1);
    state_free(b);
    state_free(a);
    kv_stats_get(kv, &st);
    CHECK(st.n_used == 0 && st.n_seqs == 0);
    kv_pool_free(kv);
    free(ca), free(cb), free(la), free(lb);
}

static void test_pool_exhaustion(void) {
    kv_pool *kv = new_pool(32, 1, 16); /* 2 blocks */
    char err[LM_ERRLEN];
    lm_state *a = state_new_shared(model, tpool, kv, 128, 64, err, sizeof err);
    int32_t toks[40];
    prompt(toks, 40, 5);
    float *lg = malloc((size_t)model->hp.n_vocab * 4);
    CHECK(state_forward(a, toks, 30, lg, false, err, sizeof err) == 0);
    CHECK(state_forward(a, toks + 30, 10, lg, false, err, sizeof err) != 0);
    CHECKF(strstr(err, "block") != NULL || strstr(err, "full") != NULL, "%s", err);
    CHECK(a->n_past == 30);
    /* the state is still usable within what the pool holds */
    CHECK(state_forward(a, toks + 30, 2, lg, false, err, sizeof err) == 0);
    state_free(a);
    kv_pool_free(kv);
    free(lg);
}

int main(void) {
    quant_init();
    char err[LM_ERRLEN];
    model = model_load(TEST_MODEL, err, sizeof err);
    if (!model) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    tpool = pool_new(2);
    TEST_RUN(test_prefix_reuse);
    TEST_RUN(test_fork_cow);
    TEST_RUN(test_pool_exhaustion);
    pool_free(tpool);
    model_free(model);
    return TEST_DONE();
}
