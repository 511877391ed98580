/*
 * test_kv.c - the paged KV pool's bookkeeping: sizing against the KV-bytes
 * formula, block tables, refcounts, copy-on-write, prefix cache (matching,
 * salts, full-key comparison under bucket collisions, LRU eviction,
 * deduplication), exhaustion as a status, waste accounting, stored values,
 * allocation failures, and a random workload checked against the pool's own
 * invariant checker after every operation. (Attention numerics over the pool
 * are in test_attn.c.)
 */
#include <assert.h>
#include <stdint.h>

#include "kv/kv.h"
#include "format/quant.h"
#include "kernels/kernels.h"
#include "test.h"
#include "base/util.h"

static kv_pool *mk_pool(uint32_t type, int n_layer, int n_kv, int hd, int B, int n_blocks) {
    kv_config c;
    kv_config_init(&c, n_layer, n_kv, hd);
    c.type = type;
    c.block_size = B;
    c.n_ctx = n_blocks * B;
    c.n_seqs = 1;
    char err[LM_ERRLEN];
    kv_pool *p = kv_pool_new(&c, err, sizeof err);
    if (!p) fprintf(stderr, "  kv_pool_new: %s\n", err);
    return p;
}

static int pool_ok(const kv_pool *p) {
    char err[LM_ERRLEN];
    if (kv_pool_check(p, err, sizeof err)) {
        fprintf(stderr, "  pool check: %s\n", err);
        return 0;
    }
    return 1;
}

static void test_plan_matches_formula(void) {
    static const uint32_t types[] = {LM_TYPE_F32, LM_TYPE_F16, LM_TYPE_Q8_0};
    static const double elem[] = {4, 2, 34.0 / 32};
    char err[LM_ERRLEN];
    for (int ti = 0; ti < 3; ti++) {
        for (int B = 1; B <= 48; B += 47) {
            kv_config c;
            kv_config_init(&c, 22, 4, 64);
            c.type = types[ti];
            c.block_size = B;
            c.mem_bytes = 100u << 20;
            kv_plan pl;
            CHECK(kv_plan_make(&c, &pl, err, sizeof err) == KV_OK);
            double per_tok = 2.0 * 22 * 4 * 64 * elem[ti];
            CHECKF((double)pl.bytes_per_token == per_tok, "%s: %llu vs %.1f", quant_type_name(types[ti]),
                   (unsigned long long)pl.bytes_per_token, per_tok);
            CHECK(pl.block_bytes == pl.bytes_per_token * (uint64_t)B);
            CHECK(pl.n_blocks == (int64_t)((100u << 20) / pl.block_bytes));
            CHECK(pl.n_tokens == pl.n_blocks * B);
            CHECK(pl.data_bytes == (uint64_t)pl.n_tokens * pl.bytes_per_token);
            /* the pool allocates exactly the plan */
            kv_pool *p = kv_pool_new(&c, err, sizeof err);
            CHECK(p);
            kv_stats st;
            kv_stats_get(p, &st);
            CHECK(st.bytes_total == pl.data_bytes && st.n_blocks == pl.n_blocks && st.n_free == pl.n_blocks);
            CHECK(st.bytes_total <= c.mem_bytes && c.mem_bytes - st.bytes_total < pl.block_bytes);
            kv_pool_free(p);
        }
    }
    /* context x sequences */
    kv_config c;
    kv_config_init(&c, 2, 2, 32);
    c.n_ctx = 100;
    c.n_seqs = 3;
    kv_plan pl;
    CHECK(kv_plan_make(&c, &pl, err, sizeof err) == KV_OK);
    CHECK(pl.n_blocks == 3 * 7 && pl.bytes_per_token == 2 * 2 * 2 * 32 * 2);
}

static void test_plan_errors(void) {
    char err[LM_ERRLEN];
    kv_config c;
    kv_plan pl;
    kv_config_init(&c, 5, 4, 8); /* stories260K-like head dim */
    c.type = LM_TYPE_Q8_0;
    c.n_ctx = 64;
    CHECK(kv_plan_make(&c, &pl, err, sizeof err) == KV_ERR);
    CHECKF(strstr(err, "Q8_0") && strstr(err, "multiple of 32") && strstr(err, "is 8"), "%s", err);
    CHECK(!kv_pool_new(&c, err, sizeof err));
    c.type = LM_TYPE_Q4_0;
    CHECK(kv_plan_make(&c, &pl, err, sizeof err) == KV_ERR && strstr(err, "Q4_0"));
    c.type = LM_TYPE_F16;
    c.mem_bytes = 100; /* below one block */
    CHECK(kv_plan_make(&c, &pl, err, sizeof err) == KV_ERR && strstr(err, "smaller than one block"));
    c.mem_bytes = 0;
    c.block_size = 0;
    CHECK(kv_plan_make(&c, &pl, err, sizeof err) == KV_ERR);
    c.block_size = 16;
    c.n_ctx = 0;
    CHECK(kv_plan_make(&c, &pl, err, sizeof err) == KV_ERR);
    c.n_ctx = 1 << 30;
    c.n_seqs = 1 << 30;
    CHECK(kv_plan_make(&c, &pl, err, sizeof err) == KV_ERR && strstr(err, "too"));
}

static void test_grow_and_release(void) {
    kv_pool *p = mk_pool(LM_TYPE_F16, 2, 2, 16, 16, 10);
    char err[LM_ERRLEN];
    kv_seq *s = kv_seq_new(p, err, sizeof err);
    CHECK(kv_blocks_needed(p, s, 33, KV_GLOBAL) == 3);
    CHECK(kv_append(p, s, 33, err, sizeof err) == KV_OK);
    kv_stats st;
    kv_stats_get(p, &st);
    CHECK(kv_seq_len(s) == 33 && st.n_used == 3 && st.n_free == 7);
    CHECK(st.slots_filled == 33 && st.slots_wasted == 15);
    CHECK(kv_append(p, s, 15, err, sizeof err) == KV_OK); /* fills block 2 exactly */
    kv_stats_get(p, &st);
    CHECK(st.n_used == 3 && st.slots_wasted == 0);
    CHECK(kv_append(p, s, 1, err, sizeof err) == KV_OK);
    kv_stats_get(p, &st);
    CHECK(st.n_used == 4 && st.slots_wasted == 15);
    CHECK(pool_ok(p));
    /* blocks come from the free list in order; table maps positions */
    const int32_t *t = kv_seq_blocks(s);
    CHECK(t[0] == 0 && t[1] == 1 && t[2] == 2 && t[3] == 3);
    CHECK(kv_truncate(p, s, 20, err, sizeof err) == KV_OK);
    kv_stats_get(p, &st);
    CHECK(kv_seq_len(s) == 20 && st.n_used == 2 && st.slots_filled == 20);
    CHECK(kv_truncate(p, s, 21, err, sizeof err) == KV_ERR);
    CHECK(kv_append(p, s, -1, err, sizeof err) == KV_ERR);
    CHECK(pool_ok(p));
    kv_seq_free(p, s);
    kv_stats_get(p, &st);
    CHECK(st.n_used == 0 && st.n_free == 10 && st.n_seqs == 0 && st.slots_filled == 0);
    CHECK(pool_ok(p));
    kv_pool_free(p);
}

static void test_exhaustion_is_a_status(void) {
    kv_pool *p = mk_pool(LM_TYPE_F32, 1, 1, 8, 4, 5);
    char err[LM_ERRLEN] = "";
    kv_seq *a = kv_seq_new(p, err, sizeof err), *b = kv_seq_new(p, err, sizeof err);
    CHECK(kv_append(p, a, 14, err, sizeof err) == KV_OK); /* 4 blocks */
    CHECK(kv_append(p, b, 5, err, sizeof err) == KV_FULL);
    CHECKF(strstr(err, "KV cache full") && strstr(err, "2 more blocks"), "%s", err);
    CHECK(kv_seq_len(b) == 0);
    CHECK(kv_append(p, b, 4, err, sizeof err) == KV_OK);
    CHECK(kv_append(p, a, 3, err, sizeof err) == KV_FULL); /* would need block 5 */
    CHECK(kv_seq_len(a) == 14);
    CHECK(kv_append(p, a, 2, err, sizeof err) == KV_OK); /* fits the partial block */
    /* a fork needs no block; its first write into the shared partial block does */
    kv_seq_free(p, b);
    kv_seq *c = kv_fork(p, a, err, sizeof err);
    CHECK(c && kv_available(p, KV_GLOBAL) == 1);
    CHECK(kv_blocks_needed(p, c, 1, KV_GLOBAL) == 1); /* len 16: block boundary, no copy */
    CHECK(kv_truncate(p, c, 15, err, sizeof err) == KV_OK);
    CHECK(kv_blocks_needed(p, c, 1, KV_GLOBAL) == 1); /* copy of the shared partial block */
    CHECK(kv_append(p, c, 1, err, sizeof err) == KV_OK);
    CHECK(kv_append(p, c, 1, err, sizeof err) == KV_FULL);
    CHECK(pool_ok(p));
    kv_seq_free(p, a);
    kv_seq_free(p, c);
    CHECK(kv_available(p, KV_GLOBAL) == 5);
    kv_pool_free(p);
}

static void test_fork_refcounts_and_cow(void) {
    kv_pool *p = mk_pool(LM_TYPE_F32, 1, 1, 4, 8, 16);
    char err[LM_ERRLEN];
    kv_seq *a = kv_seq_new(p, err, sizeof err);
    CHECK(kv_append(p, a, 20, err, sizeof err) == KV_OK); /* blocks 0, 1 full; 2 partial (4 of 8) */
    float k[4] = {1, 2, 3, 4}, v[4] = {5, 6, 7, 8};
    for (int pos = 0; pos < 20; pos++) kv_store(p, a, 0, pos, k, v);
    kv_seq *b = kv_fork(p, a, err, sizeof err), *c = kv_fork(p, b, err, sizeof err);
    const int32_t *ta = kv_seq_blocks(a);
    for (int i = 0; i < 3; i++) CHECK(kv_block_refcount(p, ta[i]) == 3);
    kv_stats st;
    kv_stats_get(p, &st);
    CHECK(st.n_used == 3 && st.slots_wasted == 4);
    CHECK(kv_append(p, b, 1, err, sizeof err) == KV_OK);
    const int32_t *tb = kv_seq_blocks(b);
    CHECK(tb[0] == ta[0] && tb[1] == ta[1] && tb[2] != ta[2]);
    CHECK(kv_block_refcount(p, ta[2]) == 2 && kv_block_refcount(p, tb[2]) == 1);
    /* the copy carries the shared positions' data */
    const kv_layout *l = kv_pool_layout(p);
    const float *row = (const float *)(const void *)kv_row(l, tb[2], kv_slab_offset(l, 0, 1, 0), 3);
    CHECK(row[0] == 5 && row[3] == 8);
    kv_seq_free(p, a);
    CHECK(kv_append(p, c, 1, err, sizeof err) == KV_OK); /* a let go: c owns the original alone, no copy */
    const int32_t *tc = kv_seq_blocks(c);
    CHECK(kv_block_refcount(p, tc[2]) == 1);
    kv_stats_get(p, &st);
    CHECK(st.n_cow == 1); /* c wrote into the original after a and b let go */
    CHECK(pool_ok(p));
    kv_seq_free(p, b);
    kv_seq_free(p, c);
    kv_stats_get(p, &st);
    CHECK(st.n_used == 0 && st.n_free == 16);
    kv_pool_free(p);
}

/* The slab-major layout (kv.h): every (block, slab, row) has its own bytes,
 * together exactly the pool's, and one slab of consecutive blocks is one
 * run of memory. A copy-on-write copies every slab of the block: each
 * layer's keys and values of each head. */
static void test_slab_major_layout(void) {
    enum { L = 3, H = 2, HD = 32, B = 4, NB = 6 };
    kv_pool *p = mk_pool(LM_TYPE_F16, L, H, HD, B, NB);
    const kv_layout *l = kv_pool_layout(p);
    CHECK(l->block_stride == (uint64_t)B * l->row_bytes && l->slab_stride == (uint64_t)NB * l->block_stride);
    CHECK(l->block_bytes == (uint64_t)L * 2 * H * l->block_stride);
    static unsigned char seen[L * 2 * H * NB * B]; /* one per row */
    memset(seen, 0, sizeof seen);
    size_t rows = 0;
    for (int layer = 0; layer < L; layer++)
        for (int which = 0; which < 2; which++)
            for (int h = 0; h < H; h++) {
                size_t slab = kv_slab_offset(l, layer, which, h);
                for (int b = 0; b < NB; b++)
                    for (int r = 0; r < B; r++) {
                        size_t off = (size_t)(kv_row(l, b, slab, r) - l->data);
                        CHECK(off % l->row_bytes == 0 && off / l->row_bytes < sizeof seen);
                        if (off / l->row_bytes < sizeof seen) seen[off / l->row_bytes]++, rows++;
                        if (b + 1 < NB && r == B - 1) /* the next block's slab follows on */
                            CHECK(kv_row(l, b + 1, slab, 0) == kv_row(l, b, slab, r) + l->row_bytes);
                    }
            }
    CHECK(rows == sizeof seen);
    for (size_t i = 0; i < sizeof seen; i++) CHECKF(seen[i] == 1, "row %zu", i);

    char err[LM_ERRLEN];
    kv_seq *a = kv_seq_new(p, err, sizeof err);
    CHECK(kv_append(p, a, 6, err, sizeof err) == KV_OK); /* block 1 partial: 2 of 4 */
    float k[H * HD], v[H * HD];
    for (int layer = 0; layer < L; layer++)
        for (int pos = 0; pos < 6; pos++) {
            for (int i = 0; i < H * HD; i++) k[i] = (float)(layer * 100 + pos * 10 + i % 8), v[i] = -k[i] - 0.5f;
            kv_store(p, a, layer, pos, k, v);
        }
    kv_seq *b = kv_fork(p, a, err, sizeof err);
    CHECK(b && kv_append(p, b, 1, err, sizeof err) == KV_OK);
    int32_t old = kv_seq_blocks(a)[1], cpy = kv_seq_blocks(b)[1];
    CHECK(old != cpy);
    for (int layer = 0; layer < L; layer++)
        for (int which = 0; which < 2; which++)
            for (int h = 0; h < H; h++)
                for (int r = 0; r < 2; r++) { /* positions 4 and 5 */
                    size_t slab = kv_slab_offset(l, layer, which, h);
                    float want = (float)(layer * 100 + (4 + r) * 10);
                    if (which) want = -want - 0.5f;
                    uint16_t first;
                    memcpy(&first, kv_row(l, cpy, slab, r), sizeof first);
                    CHECKF(!memcmp(kv_row(l, old, slab, r), kv_row(l, cpy, slab, r), l->row_bytes) &&
                               lm_f16_to_f32(first) == want,
                           "layer %d which %d head %d row %d", layer, which, h, r);
                }
    CHECK(pool_ok(p));
    kv_seq_free(p, a);
    kv_seq_free(p, b);
    kv_pool_free(p);
}

static void test_store_roundtrip(void) {
    static const uint32_t types[] = {LM_TYPE_F32, LM_TYPE_F16, LM_TYPE_Q8_0};
    static const double tol[] = {0, 1e-3, 1e-2};
    for (int ti = 0; ti < 3; ti++) {
        kv_pool *p = mk_pool(types[ti], 3, 2, 32, 5, 6);
        char err[LM_ERRLEN];
        kv_seq *s = kv_seq_new(p, err, sizeof err);
        CHECK(kv_append(p, s, 23, err, sizeof err) == KV_OK);
        float k[23][64], v[23][64];
        lm_rng r;
        lm_rng_seed(&r, 3);
        const kv_layout *l = kv_pool_layout(p);
        const lm_type_traits *tt = quant_traits(types[ti]);
        for (int layer = 0; layer < 3; layer++) {
            for (int t = 0; t < 23; t++)
                for (int i = 0; i < 64; i++) k[t][i] = lm_rng_normal(&r), v[t][i] = lm_rng_normal(&r);
            kv_store_rows(p, s, layer, 0, 23, k[0], 64, v[0], 64);
            for (int t = 0; t < 23; t++)
                for (int h = 0; h < 2; h++)
                    for (int which = 0; which < 2; which++) {
                        const uint8_t *src =
                            kv_row(l, kv_seq_blocks(s)[t / 5], kv_slab_offset(l, layer, which, h), t % 5);
                        float got[32];
                        tt->to_float(src, got, 32);
                        const float *want = (which ? v[t] : k[t]) + h * 32;
                        double e2 = 0, n2 = 0;
                        for (int i = 0; i < 32; i++)
                            e2 += (got[i] - want[i]) * (got[i] - want[i]), n2 += want[i] * want[i];
                        CHECKF(sqrt(e2 / n2) <= tol[ti], "%s layer %d t %d", quant_type_name(types[ti]), layer, t);
                    }
        }
        kv_seq_free(p, s);
        kv_pool_free(p);
    }
}

static void toks(int32_t *t, int n, int seed) {
    for (int i = 0; i < n; i++) t[i] = seed * 1000 + i;
}

static void test_prefix_match_and_salt(void) {
    kv_pool *p = mk_pool(LM_TYPE_F16, 1, 1, 8, 4, 32);
    char err[LM_ERRLEN];
    int32_t t[40];
    toks(t, 40, 1);
    kv_seq *a = kv_seq_new(p, err, sizeof err);
    CHECK(kv_prefix_match(p, a, t, 18, 11) == 0);
    CHECK(kv_append(p, a, 18, err, sizeof err) == KV_OK);
    kv_prefix_commit(p, a, t, 10, 11); /* only 2 full blocks written so far */
    kv_prefix_commit(p, a, t, 18, 11); /* then the 4th full block */
    kv_seq_free(p, a);
    kv_stats st;
    kv_stats_get(p, &st);
    CHECK(st.n_cached == 4 && st.n_used == 0 && st.n_free == 28);
    /* same prompt, same salt: 4 blocks, but never the whole prompt */
    kv_seq *b = kv_seq_new(p, err, sizeof err);
    CHECK(kv_prefix_match(p, b, t, 18, 11) == 16);
    kv_seq_free(p, b);
    b = kv_seq_new(p, err, sizeof err);
    CHECK(kv_prefix_match(p, b, t, 16, 11) == 12); /* 16 tokens: the 4th block is left to compute */
    CHECK(kv_seq_len(b) == 12);
    CHECK(kv_prefix_match(p, b, t, 16, 11) == 0); /* b is not empty */
    kv_seq_free(p, b);
    /* another tenant's salt sees nothing */
    b = kv_seq_new(p, err, sizeof err);
    CHECK(kv_prefix_match(p, b, t, 18, 12) == 0);
    kv_seq_free(p, b);
    /* a prompt differing in block 2 shares blocks 0 and 1 only */
    int32_t u[18];
    memcpy(u, t, sizeof u);
    u[9] = -5;
    b = kv_seq_new(p, err, sizeof err);
    CHECK(kv_prefix_match(p, b, u, 18, 11) == 8);
    kv_seq_free(p, b);
    b = kv_seq_new(p, err, sizeof err);
    CHECK(kv_prefix_match(p, b, t, 1, 11) == 0 && kv_prefix_match(p, b, t, 0, 11) == 0);
    kv_seq_free(p, b);
    CHECK(pool_ok(p));
    kv_stats_get(p, &st);
    CHECK(st.prefix_hit_blocks == 4 + 3 + 2);
    kv_pool_free(p);
}

/* Hash chain: the bucket index comes from the key, yet two keys sharing a
 * bucket (here: sharing their first two bytes, found by search) must never be
 * confused, since lookups compare all 32 bytes. */
static void test_bucket_collision_is_not_a_hit(void) {
    kv_pool *p = mk_pool(LM_TYPE_F32, 1, 1, 4, 2, 4); /* 4 blocks: 4 buckets */
    char err[LM_ERRLEN];
    int32_t a[3] = {7, 8, 9}, b[3] = {0, 0, 9};
    uint8_t ka[KV_KEY_LEN], kb[KV_KEY_LEN];
    kv_prefix_key(NULL, 0, a, 2, ka);
    int found = 0;
    for (int32_t x = 0; x < 4000000 && !found; x++) {
        b[0] = x;
        b[1] = x * 7 + 1;
        kv_prefix_key(NULL, 0, b, 2, kb);
        found = ka[0] == kb[0] && ka[1] == kb[1] && memcmp(ka, kb, KV_KEY_LEN);
    }
    CHECK(found);
    kv_seq *s = kv_seq_new(p, err, sizeof err);
    CHECK(kv_append(p, s, 3, err, sizeof err) == KV_OK);
    kv_prefix_commit(p, s, a, 3, 0);
    kv_seq_free(p, s);
    s = kv_seq_new(p, err, sizeof err);
    CHECK(kv_prefix_match(p, s, b, 3, 0) == 0);
    kv_seq_free(p, s);
    s = kv_seq_new(p, err, sizeof err);
    CHECK(kv_prefix_match(p, s, a, 3, 0) == 2);
    kv_seq_free(p, s);
    CHECK(pool_ok(p));
    kv_pool_free(p);
}

static void test_lru_eviction(void) {
    kv_pool *p = mk_pool(LM_TYPE_F32, 1, 1, 4, 4, 8);
    char err[LM_ERRLEN];
    int32_t t[4][9];
    /* four prompts of 2 full blocks each, released in order 0, 1, 2, 3 */
    for (int i = 0; i < 4; i++) {
        toks(t[i], 9, i + 1);
        kv_seq *s = kv_seq_new(p, err, sizeof err);
        CHECK(kv_append(p, s, 8, err, sizeof err) == KV_OK);
        kv_prefix_commit(p, s, t[i], 8, 0);
        kv_seq_free(p, s);
    }
    kv_stats st;
    kv_stats_get(p, &st);
    CHECK(st.n_cached == 8 && st.n_free == 0);
    /* touch prompt 0 again: now prompt 1 is the least recently used */
    kv_seq *s = kv_seq_new(p, err, sizeof err);
    CHECK(kv_prefix_match(p, s, t[0], 9, 0) == 8);
    kv_seq_free(p, s);
    /* a holder of prompt 2's blocks keeps them from eviction */
    kv_seq *hold = kv_seq_new(p, err, sizeof err);
    CHECK(kv_prefix_match(p, hold, t[2], 9, 0) == 8);
    /* need 3 blocks: evicts prompt 1's two blocks, then prompt 3's tail (released before its head) */
    kv_seq *n = kv_seq_new(p, err, sizeof err);
    CHECK(kv_append(p, n, 12, err, sizeof err) == KV_OK);
    kv_stats_get(p, &st);
    CHECK(st.n_evicted == 3);
    /* cached now: prompt 3's head and prompt 0; prompt 2 is held */
    CHECK(kv_available(p, KV_GLOBAL) == 3);
    kv_seq *q = kv_seq_new(p, err, sizeof err);
    CHECK(kv_prefix_match(p, q, t[1], 9, 0) == 0);
    CHECK(kv_prefix_match(p, q, t[3], 9, 0) == 4); /* its first block survived */
    kv_seq_free(p, q);
    q = kv_seq_new(p, err, sizeof err);
    CHECK(kv_prefix_match(p, q, t[0], 9, 0) == 8);
    kv_seq_free(p, q);
    q = kv_seq_new(p, err, sizeof err);
    CHECK(kv_prefix_match(p, q, t[2], 9, 0) == 8);
    kv_seq_free(p, q);
    CHECK(pool_ok(p));
    /* the held blocks are never evicted: the pool fills up and says so */
    CHECK(kv_append(p, n, 12, err, sizeof err) == KV_OK);
    kv_stats_get(p, &st);
    CHECK(st.n_evicted == 6 && st.n_cached == 0);
    CHECK(kv_append(p, n, 4, err, sizeof err) == KV_FULL);
    CHECK(kv_block_refcount(p, kv_seq_blocks(hold)[0]) == 1);
    kv_seq_free(p, n);
    kv_seq_free(p, hold);
    CHECK(pool_ok(p));
    kv_pool_free(p);
}

static void test_commit_dedups(void) {
    kv_pool *p = mk_pool(LM_TYPE_F32, 1, 1, 4, 4, 16);
    char err[LM_ERRLEN];
    int32_t t[12];
    toks(t, 12, 3);
    kv_seq *a = kv_seq_new(p, err, sizeof err), *b = kv_seq_new(p, err, sizeof err);
    CHECK(kv_append(p, a, 10, err, sizeof err) == KV_OK);
    CHECK(kv_append(p, b, 10, err, sizeof err) == KV_OK);
    kv_stats st;
    kv_stats_get(p, &st);
    CHECK(st.n_used == 6);
    kv_prefix_commit(p, a, t, 10, 0);
    kv_prefix_commit(p, b, t, 10, 0);
    kv_stats_get(p, &st);
    CHECK(st.n_used == 4 && st.n_dedup == 2);
    CHECK(kv_seq_blocks(a)[0] == kv_seq_blocks(b)[0] && kv_seq_blocks(a)[2] != kv_seq_blocks(b)[2]);
    CHECK(pool_ok(p));
    /* committing again is a no-op; after a truncate the key chain is recomputed */
    kv_prefix_commit(p, b, t, 10, 0);
    CHECK(kv_truncate(p, b, 3, err, sizeof err) == KV_OK);
    CHECK(kv_append(p, b, 7, err, sizeof err) == KV_OK); /* copies the shared block 0 */
    kv_prefix_commit(p, b, t, 10, 0);
    kv_stats_get(p, &st);
    CHECK(st.n_cow == 1 && st.n_dedup == 4);
    CHECK(pool_ok(p));
    kv_seq_free(p, a);
    kv_seq_free(p, b);
    kv_stats_get(p, &st);
    CHECK(st.n_used == 0 && st.n_cached == 2 && st.n_free == 14);
    kv_pool_free(p);
}

/* 64 sequences, lengths 100..2000, block 16: the unfilled tails are the only
 * waste; the figure is exact and below 4% of the KV memory in use. */
static void test_waste_mixed_workload(void) {
    kv_pool *p = mk_pool(LM_TYPE_F16, 1, 1, 32, 16, 64 * 125);
    char err[LM_ERRLEN];
    kv_seq *s[64];
    lm_rng r;
    lm_rng_seed(&r, 2024);
    int64_t tokens = 0, expect_waste = 0;
    for (int i = 0; i < 64; i++) {
        int len = 100 + (int)(lm_rng_u64(&r) % 1901);
        s[i] = kv_seq_new(p, err, sizeof err);
        /* grown like a server does: prompt, then decode steps */
        CHECK(kv_append(p, s[i], len - len / 4, err, sizeof err) == KV_OK);
        for (int j = len - len / 4; j < len; j++) CHECK(kv_append(p, s[i], 1, err, sizeof err) == KV_OK);
        tokens += len;
        expect_waste += (len + 15) / 16 * 16 - len;
    }
    kv_stats st;
    kv_stats_get(p, &st);
    CHECK(st.slots_filled == tokens && st.slots_wasted == expect_waste);
    double frac = (double)st.bytes_wasted / (double)st.bytes_used;
    printf("NOTE waste: %lld tokens in %lld blocks, %lld slots unfilled = %.3f%% of %.1f MiB in use\n",
           (long long)tokens, (long long)st.n_used, (long long)st.slots_wasted, 100 * frac,
           (double)st.bytes_used / 1048576);
    CHECK(frac < 0.04);
    CHECK(pool_ok(p));
    for (int i = 0; i < 64; i++) kv_seq_free(p, s[i]);
    kv_stats_get(p, &st);
    CHECK(st.n_used == 0 && st.n_free == st.n_blocks && st.slots_wasted == 0);
    kv_pool_free(p);
}

static void test_alloc_failures(void) {
    char err[LM_ERRLEN];
    kv_config c;
    kv_config_init(&c, 1, 1, 8);
    c.block_size = 1;
    c.n_ctx = 64;
    for (long k = 0; k < 4; k++) {
        lm_alloc_fail_after(k);
        kv_pool *p = kv_pool_new(&c, err, sizeof err);
        lm_alloc_fail_after(-1);
        if (!p) CHECK(strstr(err, "out of memory"));
        kv_pool_free(p);
    }
    kv_pool *p = kv_pool_new(&c, err, sizeof err);
    kv_seq *a = kv_seq_new(p, err, sizeof err);
    CHECK(kv_append(p, a, 5, err, sizeof err) == KV_OK);
    lm_alloc_fail_after(0);
    CHECK(kv_seq_new(p, err, sizeof err) == NULL);
    lm_alloc_fail_after(1); /* the fork's table */
    CHECK(kv_fork(p, a, err, sizeof err) == NULL);
    lm_alloc_fail_after(0); /* table growth past 16 blocks */
    CHECK(kv_append(p, a, 40, err, sizeof err) == KV_ERR);
    lm_alloc_fail_after(-1);
    CHECK(kv_seq_len(a) == 5 && pool_ok(p));
    kv_seq *b = kv_seq_new(p, err, sizeof err);
    int32_t t[64];
    toks(t, 64, 1);
    lm_alloc_fail_after(0);
    CHECK(kv_prefix_match(p, b, t, 64, 0) == 0); /* no table: no reuse, no crash */
    lm_alloc_fail_after(-1);
    CHECK(pool_ok(p));
    kv_pool_free(p); /* frees the live sequences too */
}

/* Random operations on up to 12 sequences of p (appends, prefix commits,
 * truncations, forks, frees; prompts from a few families so prefixes
 * repeat), the pool checked after each. draft_truncate: truncations go back
 * by up to 3 positions (a rejected draft) or all the way, and a truncation
 * refused for reaching below the window is expected; otherwise they go to a
 * random length. Counts refused appends into *n_full and frees every
 * sequence at the end; 0 when a check failed. */
static int random_ops(kv_pool *p, uint64_t seed, int n_seqs, int steps, bool draft_truncate, int *n_full) {
    char err[LM_ERRLEN];
    kv_seq *s[12] = {0};
    int32_t prompt[12][128];
    assert(n_seqs <= 12);
    lm_rng r;
    lm_rng_seed(&r, seed);
    int ok = 1;
    for (int step = 0; step < steps && ok; step++) {
        int i = (int)(lm_rng_u64(&r) % (uint64_t)n_seqs), op = (int)(lm_rng_u64(&r) % 8);
        if (!s[i]) {
            s[i] = kv_seq_new(p, err, sizeof err);
            int fam = (int)(lm_rng_u64(&r) % 3);
            for (int t = 0; t < 128; t++) prompt[i][t] = fam * 100 + t % 50 + (t > 60 ? i : 0);
            kv_prefix_match(p, s[i], prompt[i], 1 + (int)(lm_rng_u64(&r) % 60), 1);
            continue;
        }
        int len = kv_seq_len(s[i]);
        int rc = KV_OK;
        switch (op) {
            case 0:
            case 1:
            case 2:
                if (len < 120) {
                    int most = 120 - len < 9 ? 120 - len : 9;
                    rc = kv_append(p, s[i], 1 + (int)(lm_rng_u64(&r) % (uint64_t)most), err, sizeof err);
                    *n_full += rc == KV_FULL;
                }
                break;
            case 3: kv_prefix_commit(p, s[i], prompt[i], kv_seq_len(s[i]), 1); break;
            case 4: {
                int to;
                if (draft_truncate)
                    to = lm_rng_u64(&r) % 4 == 0 ? 0 : len - (int)(lm_rng_u64(&r) % (len < 3 ? len + 1 : 4));
                else to = len ? (int)(lm_rng_u64(&r) % (uint64_t)len) : 0;
                rc = kv_truncate(p, s[i], to, err, sizeof err);
                break;
            }
            case 5: {
                int j = (int)(lm_rng_u64(&r) % (uint64_t)n_seqs);
                if (!s[j]) {
                    s[j] = kv_fork(p, s[i], err, sizeof err);
                    memcpy(prompt[j], prompt[i], sizeof prompt[i]);
                }
                break;
            }
            default:
                kv_seq_free(p, s[i]);
                s[i] = NULL;
                break;
        }
        if (rc != KV_OK && rc != KV_FULL && !(draft_truncate && op == 4 && strstr(err, "window"))) ok = 0;
        if (!pool_ok(p)) {
            fprintf(stderr, "  after step %d op %d\n", step, op);
            ok = 0;
        }
    }
    for (int i = 0; i < n_seqs; i++) kv_seq_free(p, s[i]);
    return ok;
}

/* Random operations on many sequences; at the end every block is back and
 * every refcount is zero. */
static void test_random_workload(void) {
    kv_pool *p = mk_pool(LM_TYPE_F16, 1, 1, 8, 4, 40);
    kv_stats st;
    int n_full = 0;
    CHECK(random_ops(p, 77, 12, 4000, false, &n_full));
    kv_stats_get(p, &st);
    printf("NOTE random workload: %llu copies, %llu evictions, %llu dedups, %llu prefix blocks reused\n",
           (unsigned long long)st.n_cow, (unsigned long long)st.n_evicted, (unsigned long long)st.n_dedup,
           (unsigned long long)st.prefix_hit_blocks);
    CHECK(st.n_cow > 0 && st.n_evicted > 0 && st.prefix_hit_blocks > 0);
    CHECK(st.n_used == 0 && st.n_free + st.n_cached == st.n_blocks && st.n_seqs == 0);
    for (int b = 0; b < 40; b++) CHECK(kv_block_refcount(p, b) == 0);
    CHECK(pool_ok(p));
    kv_pool_free(p);
}

/* ---- sliding-window layers: two block classes ---------------------------- */

/* A pool of n_layer layers where local[i] marks the sliding-window layers. */
static kv_pool *mk_swa_pool(uint32_t type, int n_layer, const uint8_t *local, int window, int hd, int B, int chunk,
                            int n_ctx, int n_seqs) {
    kv_config c;
    kv_config_init(&c, n_layer, 1, hd);
    c.type = type;
    c.block_size = B;
    c.window = window;
    c.layer_local = local;
    c.chunk = chunk;
    c.n_ctx = n_ctx;
    c.n_seqs = n_seqs;
    char err[LM_ERRLEN];
    kv_pool *p = kv_pool_new(&c, err, sizeof err);
    if (!p) fprintf(stderr, "  kv_pool_new: %s\n", err);
    return p;
}

/* Leading local blocks a sequence of length len no longer needs. */
static int swa_drop(int len, int window, int B) { return len - window + 1 > 0 ? (len - window + 1) / B : 0; }

/* Sizing with a window, both ways, against the formulas of kv.h; without a
 * usable window the plan is the one-class plan, bit for bit. */
static void test_swa_plan(void) {
    static const uint8_t local[6] = {1, 1, 0, 1, 1, 0}, none[6] = {0}, all[6] = {1, 1, 1, 1, 1, 1};
    char err[LM_ERRLEN];
    kv_config c;
    kv_config_init(&c, 6, 2, 32);
    c.block_size = 4;
    c.n_ctx = 100;
    c.n_seqs = 3;
    kv_plan plain, pl;
    CHECK(kv_plan_make(&c, &plain, err, sizeof err) == KV_OK);
    CHECK(plain.window == 0 && plain.local_blocks_per_seq == 0 && plain.cls[KV_LOCAL].n_blocks == 0);
    CHECK(plain.cls[KV_GLOBAL].n_layer == 6 && plain.cls[KV_GLOBAL].n_blocks == plain.n_blocks &&
          plain.cls[KV_GLOBAL].data_bytes == plain.data_bytes);
    /* no layer flagged, every layer flagged, or no window: one class */
    const uint8_t *one[3] = {none, all, local};
    for (int i = 0; i < 3; i++) {
        c.window = i < 2 ? 10 : 0;
        c.layer_local = one[i];
        CHECK(kv_plan_make(&c, &pl, err, sizeof err) == KV_OK);
        CHECKF(!memcmp(&pl, &plain, sizeof pl), "case %d differs from the one-class plan", i);
    }
    /* context x sequences: window 10, chunk 6, block 4 -> ceil((10+6+4-2)/4) = 5 local blocks a sequence */
    c.window = 10;
    c.layer_local = local;
    c.chunk = 6;
    CHECK(kv_plan_make(&c, &pl, err, sizeof err) == KV_OK);
    uint64_t row = 2 * 32, per_layer = 2 * 2 * row; /* F16, 2 KV heads */
    CHECK(pl.window == 10 && pl.local_blocks_per_seq == 5);
    CHECK(pl.cls[KV_GLOBAL].n_layer == 2 && pl.cls[KV_LOCAL].n_layer == 4);
    CHECK(pl.cls[KV_GLOBAL].bytes_per_token == 2 * per_layer && pl.cls[KV_LOCAL].bytes_per_token == 4 * per_layer);
    CHECK(pl.bytes_per_token == 6 * per_layer && pl.block_bytes == 4 * 6 * per_layer);
    CHECK(pl.cls[KV_GLOBAL].n_blocks == 3 * 25 && pl.cls[KV_LOCAL].n_blocks == 3 * 5);
    CHECK(pl.n_blocks == 75 && pl.n_tokens == 300);
    CHECK(pl.data_bytes == 75 * 4 * 2 * per_layer + 15 * 4 * 4 * per_layer);
    /* a context shorter than the window + chunk caps the local blocks */
    c.n_ctx = 9;
    CHECK(kv_plan_make(&c, &pl, err, sizeof err) == KV_OK && pl.local_blocks_per_seq == 3);
    /* a budget: N blocks of every layer; local min(N, seqs x 5); the rest global */
    c.n_ctx = 100;
    uint64_t all_block = 4 * 6 * per_layer, gblock = 4 * 2 * per_layer, lblock = 4 * 4 * per_layer;
    for (int64_t n_plain = 1; n_plain <= 40; n_plain += 13)
        for (int seqs = 1; seqs <= 4; seqs++) {
            c.mem_bytes = (uint64_t)n_plain * all_block + 17;
            c.n_seqs = seqs;
            CHECK(kv_plan_make(&c, &pl, err, sizeof err) == KV_OK);
            int64_t nl = seqs * 5 < n_plain ? seqs * 5 : n_plain;
            CHECKF(pl.cls[KV_LOCAL].n_blocks == nl, "N %lld seqs %d: %lld local", (long long)n_plain, seqs,
                   (long long)pl.cls[KV_LOCAL].n_blocks);
            CHECK(pl.cls[KV_GLOBAL].n_blocks == (int64_t)((c.mem_bytes - (uint64_t)nl * lblock) / gblock));
            CHECK(pl.cls[KV_GLOBAL].n_blocks >= n_plain); /* never less context than one class */
            CHECK(pl.data_bytes <= c.mem_bytes && c.mem_bytes - pl.data_bytes < gblock);
            kv_pool *p = kv_pool_new(&c, err, sizeof err);
            CHECK(p);
            kv_stats st;
            kv_stats_get(p, &st);
            CHECK(st.bytes_total == pl.data_bytes && st.cls[KV_LOCAL].n_blocks == nl &&
                  st.cls[KV_GLOBAL].n_blocks == pl.n_blocks && st.n_blocks == pl.n_blocks);
            CHECK(kv_pool_window(p) == 10 && kv_available(p, KV_LOCAL) == nl);
            int slot;
            CHECK(kv_layer_class(p, 2, &slot) == KV_GLOBAL && slot == 0);
            CHECK(kv_layer_class(p, 4, &slot) == KV_LOCAL && slot == 3);
            CHECK(kv_layer_class(p, 5, &slot) == KV_GLOBAL && slot == 1);
            CHECK(kv_class_layout(p, KV_LOCAL)->n_layer == 4 && kv_pool_layout(p)->n_layer == 2);
            kv_pool_free(p);
        }
    c.window = -1;
    CHECK(kv_plan_make(&c, &pl, err, sizeof err) == KV_ERR && strstr(err, "window"));
}

/* A sequence grown in appends of 1..7 (the chunk) keeps ceil(len/B) global
 * blocks and only the local blocks a query at its length can see, at most
 * ceil((window + chunk + B - 2) / B); the K/V of those positions are intact
 * in both classes; truncation keeps the window; everything comes back. */
static void test_swa_window_release(void) {
    static const uint8_t local[3] = {1, 0, 1};
    const int W = 6, chunk = 7;
    for (int B = 1; B <= 9; B += 4) {
        kv_pool *p = mk_swa_pool(LM_TYPE_F32, 3, local, W, 4, B, chunk, 200, 1);
        CHECK(p);
        const int bound = (W + chunk + 2 * B - 3) / B;
        CHECK(kv_pool_plan(p)->local_blocks_per_seq == bound);
        char err[LM_ERRLEN];
        kv_seq *s = kv_seq_new(p, err, sizeof err);
        lm_rng r;
        lm_rng_seed(&r, (uint64_t)B);
        int max_local = 0;
        while (kv_seq_len(s) < 180) {
            int old = kv_seq_len(s), n = 1 + (int)(lm_rng_u64(&r) % chunk);
            int64_t need[2] = {kv_blocks_needed(p, s, n, KV_GLOBAL), kv_blocks_needed(p, s, n, KV_LOCAL)};
            int64_t avail[2] = {kv_available(p, KV_GLOBAL), kv_available(p, KV_LOCAL)};
            CHECK(kv_append(p, s, n, err, sizeof err) == KV_OK);
            int len = old + n, nb = (len + B - 1) / B, d = swa_drop(old, W, B);
            /* every block taken was counted; the local need is net of releases */
            CHECK(avail[0] - kv_available(p, KV_GLOBAL) == need[0]);
            CHECKF(avail[1] - kv_available(p, KV_LOCAL) <= need[1], "B %d len %d", B, len);
            CHECK(kv_seq_held(s, KV_GLOBAL) == nb && kv_seq_held(s, KV_LOCAL) == nb - d);
            CHECKF(kv_seq_held(s, KV_LOCAL) <= bound, "B %d len %d: %d local blocks > %d", B, len,
                   kv_seq_held(s, KV_LOCAL), bound);
            if (kv_seq_held(s, KV_LOCAL) > max_local) max_local = kv_seq_held(s, KV_LOCAL);
            const int32_t *lt = kv_seq_table(s, KV_LOCAL);
            for (int i = 0; i < nb; i++) CHECK((lt[i] < 0) == (i < d));
            /* K/V of every layer: value = layer * 1000 + position */
            for (int layer = 0; layer < 3; layer++)
                for (int pos = old; pos < len; pos++) {
                    float k[4], v[4];
                    for (int i = 0; i < 4; i++) k[i] = (float)(layer * 1000 + pos), v[i] = -k[i];
                    kv_store(p, s, layer, pos, k, v);
                }
            /* what a query at len can see is there, in its class */
            for (int layer = 0; layer < 3; layer++) {
                int slot, cls = kv_layer_class(p, layer, &slot);
                const kv_layout *l = kv_class_layout(p, cls);
                int lo = cls == KV_LOCAL && len - W + 1 > 0 ? len - W + 1 : 0;
                for (int pos = lo; pos < len; pos++) {
                    int32_t b = kv_seq_table(s, cls)[pos / B];
                    CHECK(b >= 0);
                    const float *kr = (const float *)(const void *)kv_row(l, b, kv_slab_offset(l, slot, 0, 0), pos % B);
                    const float *vr = (const float *)(const void *)kv_row(l, b, kv_slab_offset(l, slot, 1, 0), pos % B);
                    CHECKF(kr[3] == (float)(layer * 1000 + pos) && vr[0] == -kr[3], "B %d layer %d pos %d", B, layer,
                           pos);
                }
            }
            CHECK(pool_ok(p));
        }
        kv_stats st;
        kv_stats_get(p, &st);
        printf("NOTE window %d, block %d, appends of 1..%d: %d positions in %lld global blocks, at most %d local "
               "blocks (bound %d)\n",
               W, B, chunk, kv_seq_len(s), (long long)st.cls[KV_GLOBAL].n_used, max_local, bound);
        CHECK(st.cls[KV_LOCAL].n_used == kv_seq_held(s, KV_LOCAL) && st.cls[KV_LOCAL].n_used < st.n_used);
        /* truncation: back to the start of the last append is fine; past
         * what the window still holds is refused and changes nothing */
        int len = kv_seq_len(s);
        CHECK(kv_append(p, s, 3, err, sizeof err) == KV_OK);
        CHECK(kv_truncate(p, s, len, err, sizeof err) == KV_OK);
        int held = kv_seq_held(s, KV_LOCAL);
        CHECK(kv_truncate(p, s, len - 2 * W - B, err, sizeof err) == KV_ERR);
        CHECKF(strstr(err, "window"), "%s", err);
        CHECK(kv_seq_len(s) == len && kv_seq_held(s, KV_LOCAL) == held && pool_ok(p));
        CHECK(kv_truncate(p, s, 0, err, sizeof err) == KV_OK);
        CHECK(kv_seq_held(s, KV_LOCAL) == 0 && kv_seq_held(s, KV_GLOBAL) == 0 && pool_ok(p));
        CHECK(kv_append(p, s, 5, err, sizeof err) == KV_OK && kv_seq_held(s, KV_LOCAL) == (5 + B - 1) / B);
        kv_seq_free(p, s);
        kv_stats_get(p, &st);
        for (int c = 0; c < KV_N_CLASS; c++)
            CHECK(st.cls[c].n_used == 0 && st.cls[c].n_free == st.cls[c].n_blocks && st.cls[c].slots_filled == 0);
        CHECK(pool_ok(p));
        kv_pool_free(p);
    }
}

/* Either class running out is KV_FULL, named, with nothing changed; the
 * local need is net of the blocks an append releases. */
static void test_swa_exhaustion(void) {
    static const uint8_t local[2] = {1, 0};
    /* window 4, block 2, chunk 2: 3 local blocks a sequence; two sequences */
    kv_pool *p = mk_swa_pool(LM_TYPE_F32, 2, local, 4, 4, 2, 2, 40, 2);
    CHECK(p && kv_pool_plan(p)->local_blocks_per_seq == 3);
    CHECK(kv_available(p, KV_LOCAL) == 6 && kv_available(p, KV_GLOBAL) == 40);
    char err[LM_ERRLEN];
    kv_seq *a = kv_seq_new(p, err, sizeof err), *b = kv_seq_new(p, err, sizeof err);
    /* a prefill wider than the chunk holds every local block it spans */
    CHECK(kv_append(p, a, 10, err, sizeof err) == KV_OK);
    CHECK(kv_seq_held(a, KV_LOCAL) == 5 && kv_available(p, KV_LOCAL) == 1);
    CHECK(kv_append(p, b, 4, err, sizeof err) == KV_FULL);
    CHECKF(strstr(err, "2 more local blocks") && strstr(err, "1 available"), "%s", err);
    CHECK(kv_seq_len(b) == 0 && kv_available(p, KV_LOCAL) == 1 && pool_ok(p));
    /* a's next append releases its blocks below 10 - 4 + 1 = 7 first (0..2) */
    CHECK(kv_blocks_needed(p, a, 2, KV_LOCAL) == 0 && kv_blocks_needed(p, a, 2, KV_GLOBAL) == 1);
    CHECK(kv_append(p, a, 2, err, sizeof err) == KV_OK);
    CHECK(kv_seq_held(a, KV_LOCAL) == 3 && kv_available(p, KV_LOCAL) == 3);
    CHECK(kv_append(p, b, 4, err, sizeof err) == KV_OK);
    CHECK(pool_ok(p));
    kv_seq_free(p, a);
    kv_seq_free(p, b);
    for (int c = 0; c < KV_N_CLASS; c++) CHECK(kv_available(p, c) == (c ? 6 : 40));
    kv_pool_free(p);
}

/* Forks share both tables, released entries included; the first write into
 * a shared partial block copies it in each class; prefix matches need the
 * local blocks a query at the match point sees, and shorten until they are
 * cached. */
static void test_swa_fork_and_prefix(void) {
    static const uint8_t local[3] = {1, 0, 1};
    const int W = 6, B = 4;
    kv_pool *p = mk_swa_pool(LM_TYPE_F32, 3, local, W, 4, B, 4, 64, 8); /* 24 local blocks: no eviction */
    CHECK(p);
    char err[LM_ERRLEN];
    int32_t t[64];
    toks(t, 64, 5);
    kv_seq *a = kv_seq_new(p, err, sizeof err);
    /* grown in chunks of 4, committed after each as the engine does, so each
     * local block is keyed before it leaves the window */
    for (int i = 0; i < 8; i++) {
        CHECK(kv_append(p, a, 4, err, sizeof err) == KV_OK);
        kv_prefix_commit(p, a, t, kv_seq_len(a), 0);
    }
    CHECK(kv_append(p, a, 2, err, sizeof err) == KV_OK); /* 34: block 8 partial */
    int d = swa_drop(32, W, B);
    CHECK(kv_seq_held(a, KV_LOCAL) == 9 - d);
    kv_seq *f = kv_fork(p, a, err, sizeof err);
    CHECK(f && kv_seq_held(f, KV_LOCAL) == 9 - d && kv_seq_held(f, KV_GLOBAL) == 9);
    for (int c = 0; c < KV_N_CLASS; c++)
        for (int i = 0; i < 9; i++) {
            int32_t x = kv_seq_table(a, c)[i];
            CHECK(kv_seq_table(f, c)[i] == x && (x < 0 || kv_class_refcount(p, c, x) == 2));
        }
    CHECK(kv_append(p, f, 1, err, sizeof err) == KV_OK);
    kv_stats st;
    kv_stats_get(p, &st);
    CHECK(st.n_cow == 2); /* the partial block, once per class */
    for (int c = 0; c < KV_N_CLASS; c++) CHECK(kv_seq_table(f, c)[8] != kv_seq_table(a, c)[8]);
    CHECK(kv_append(p, a, 1, err, sizeof err) == KV_OK);
    kv_stats_get(p, &st);
    CHECK(st.n_cow == 2 && pool_ok(p)); /* a owns the original alone now */
    kv_seq_free(p, f);
    kv_seq_free(p, a);
    kv_stats_get(p, &st);
    CHECK(st.cls[KV_LOCAL].n_cached == 8 && st.cls[KV_GLOBAL].n_cached == 8);
    /* the whole prefix matches: 8 blocks, local ones from the drop point of 32 */
    kv_seq *m = kv_seq_new(p, err, sizeof err);
    CHECK(kv_prefix_match(p, m, t, 40, 0) == 32);
    CHECK(kv_seq_held(m, KV_GLOBAL) == 8 && kv_seq_held(m, KV_LOCAL) == 8 - d && pool_ok(p));
    CHECK(kv_append(p, m, 4, err, sizeof err) == KV_OK && pool_ok(p));
    kv_seq_free(p, m);
    /* a sequence that only ever committed at its end kept no local block out
     * of its window: a prompt sharing only its first 20 tokens finds no
     * usable local block there, and the match shortens to nothing */
    int32_t u[64];
    toks(u, 64, 6);
    kv_seq *b = kv_seq_new(p, err, sizeof err);
    for (int i = 0; i < 8; i++) CHECK(kv_append(p, b, 4, err, sizeof err) == KV_OK);
    kv_prefix_commit(p, b, u, 32, 0);
    kv_seq_free(p, b);
    int32_t v[30];
    memcpy(v, u, 20 * sizeof *v);
    for (int i = 20; i < 30; i++) v[i] = -1 - i;
    m = kv_seq_new(p, err, sizeof err);
    CHECK(kv_prefix_match(p, m, v, 30, 0) == 0);
    kv_seq_free(p, m);
    /* while the full prompt still matches where its window's blocks are cached */
    m = kv_seq_new(p, err, sizeof err);
    CHECK(kv_prefix_match(p, m, u, 33, 0) == 32);
    kv_seq_free(p, m);
    /* keys for the local blocks of the first 8 positions only, then the
     * rest committed at 32: a prompt sharing 16 tokens matches 8, where its
     * window's local blocks are cached (one class would give 16) */
    int32_t w[64];
    toks(w, 64, 7);
    b = kv_seq_new(p, err, sizeof err);
    CHECK(kv_append(p, b, 8, err, sizeof err) == KV_OK);
    kv_prefix_commit(p, b, w, 8, 0);
    for (int i = 0; i < 6; i++) CHECK(kv_append(p, b, 4, err, sizeof err) == KV_OK);
    kv_prefix_commit(p, b, w, 32, 0);
    kv_seq_free(p, b);
    memcpy(v, w, 16 * sizeof *v);
    m = kv_seq_new(p, err, sizeof err);
    CHECK(kv_prefix_match(p, m, v, 30, 0) == 8);
    CHECK(kv_seq_held(m, KV_LOCAL) == 2 && kv_seq_held(m, KV_GLOBAL) == 2);
    CHECK(kv_append(p, m, 9, err, sizeof err) == KV_OK && pool_ok(p));
    kv_seq_free(p, m);
    m = kv_seq_new(p, err, sizeof err);
    CHECK(kv_prefix_match(p, m, w, 33, 0) == 32);
    kv_seq_free(p, m);
    CHECK(pool_ok(p));
    kv_pool_free(p);
}

/* Random operations on many sequences of a two-class pool; at the end every
 * block of both classes is back. */
static void test_swa_random_workload(void) {
    static const uint8_t local[4] = {1, 1, 0, 1};
    kv_pool *p = mk_swa_pool(LM_TYPE_F16, 4, local, 7, 8, 3, 9, 60, 3); /* 60 global, 18 local blocks */
    CHECK(p);
    int n_full = 0;
    CHECK(random_ops(p, 78, 10, 6000, true, &n_full));
    kv_stats st;
    kv_stats_get(p, &st);
    printf("NOTE random workload, two classes: %llu copies, %llu evictions, %llu dedups, %llu prefix blocks "
           "reused, %d appends refused\n",
           (unsigned long long)st.n_cow, (unsigned long long)st.n_evicted, (unsigned long long)st.n_dedup,
           (unsigned long long)st.prefix_hit_blocks, n_full);
    CHECK(st.n_cow > 0 && st.n_evicted > 0 && st.prefix_hit_blocks > 0 && n_full > 0);
    for (int c = 0; c < KV_N_CLASS; c++) {
        CHECK(st.cls[c].n_used == 0 && st.cls[c].n_free + st.cls[c].n_cached == st.cls[c].n_blocks);
        for (int b = 0; b < st.cls[c].n_blocks; b++) CHECK(kv_class_refcount(p, c, b) == 0);
    }
    CHECK(pool_ok(p));
    kv_pool_free(p);
}

/* The one parser of KV type names (every --kv-type flag uses it). */
static void test_type_from_name(void) {
    char err[LM_ERRLEN];
    uint32_t t = 99;
    CHECK(kv_type_from_name("F32", &t, err, sizeof err) == 0 && t == LM_TYPE_F32);
    CHECK(kv_type_from_name("f16", &t, err, sizeof err) == 0 && t == LM_TYPE_F16);
    CHECK(kv_type_from_name("Q8_0", &t, err, sizeof err) == 0 && t == LM_TYPE_Q8_0);
    const char *bad[] = {"Q4_0", "BF16", "", "F16 ", "q8"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        t = 99;
        err[0] = 0;
        CHECKF(kv_type_from_name(bad[i], &t, err, sizeof err) == -1 && t == 99, "'%s'", bad[i]);
        CHECKF(strstr(err, "F32, F16, Q8_0") && strstr(err, bad[i]), "%s", err);
    }
    CHECK(kv_type_from_name(NULL, &t, err, sizeof err) == -1);
}

int main(void) {
    kernels_init();
    TEST_RUN(test_type_from_name);
    TEST_RUN(test_plan_matches_formula);
    TEST_RUN(test_plan_errors);
    TEST_RUN(test_grow_and_release);
    TEST_RUN(test_exhaustion_is_a_status);
    TEST_RUN(test_fork_refcounts_and_cow);
    TEST_RUN(test_slab_major_layout);
    TEST_RUN(test_store_roundtrip);
    TEST_RUN(test_prefix_match_and_salt);
    TEST_RUN(test_bucket_collision_is_not_a_hit);
    TEST_RUN(test_lru_eviction);
    TEST_RUN(test_commit_dedups);
    TEST_RUN(test_waste_mixed_workload);
    TEST_RUN(test_alloc_failures);
    TEST_RUN(test_random_workload);
    TEST_RUN(test_swa_plan);
    TEST_RUN(test_swa_window_release);
    TEST_RUN(test_swa_exhaustion);
    TEST_RUN(test_swa_fork_and_prefix);
    TEST_RUN(test_swa_random_workload);
    return TEST_DONE();
}
