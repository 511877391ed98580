/*
 * test_rstate.c - the recurrent state store: sizing against the formula and
 * against what is allocated, zeroed live slots, release and exhaustion as a
 * status, forks that copy, disjoint layers, checkpoints for speculative
 * rollback (save, restore, the shared bound, a checkpoint written in place
 * through rstate_ckpt_layer), prefix snapshots keyed by the
 * KV cache's block keys (a different prefix or salt never matches),
 * least-recently-used eviction, snapshots dropped with their KV blocks,
 * allocation failures, and a random workload checked against a model of
 * the store and the store's own invariant checker. The operation log: a
 * random workload on a leader's store, its log replayed pass by pass onto a
 * follower's store of other dimensions and the same slot counts, leaves
 * the same bookkeeping and the same states (by their patterns); failed
 * calls and no-ops log nothing; a replay handed another index fails.
 */
#include <stdint.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "kv/kv.h"
#include "kv/rstate.h"
#include "test.h"
#include "base/util.h"

/* Small dimensions whose window and matrix both need padding: window
 * 3 x 7 = 21 floats (32 padded), matrix 2 x 3 x 5 = 30 (32). */
static void small_config(rstate_config *c, int n_seqs, int n_ckpt, int n_snap) {
    rstate_config_init(c, 3, 4, 7, 2, 3, 5);
    c->n_seqs = n_seqs;
    c->n_ckpt = n_ckpt;
    c->n_snap = n_snap;
}

static rstate_pool *mk(int n_seqs, int n_ckpt, int n_snap) {
    rstate_config c;
    small_config(&c, n_seqs, n_ckpt, n_snap);
    char err[LM_ERRLEN];
    rstate_pool *p = rstate_pool_new(&c, err, sizeof err);
    if (!p) fprintf(stderr, "  rstate_pool_new: %s\n", err);
    return p;
}

static int pool_ok(const rstate_pool *p) {
    char err[LM_ERRLEN];
    if (rstate_pool_check(p, err, sizeof err)) {
        fprintf(stderr, "  pool check: %s\n", err);
        return 0;
    }
    return 1;
}

/* The value a state of the given seed holds at (layer, which, i). */
static float val(int seed, int layer, int which, int64_t i) {
    return (float)(seed * 100003 + layer * 1009 + which * 509 + i % 499 + 1);
}

/* Write seed's pattern into every layer of slot. */
static void fill(rstate_pool *p, int slot, int seed) {
    const rstate_plan *pl = rstate_pool_plan(p);
    for (int l = 0; l < rstate_pool_config(p)->n_layer; l++) {
        float *cv = rstate_conv(p, slot, l), *m = rstate_mat(p, slot, l);
        for (int64_t i = 0; i < pl->conv_floats; i++) cv[i] = val(seed, l, 0, i);
        for (int64_t i = 0; i < pl->mat_floats; i++) m[i] = val(seed, l, 1, i);
    }
}

/* Whether slot holds seed's pattern in every layer (seed 0: all zero). */
static int holds(rstate_pool *p, int slot, int seed) {
    const rstate_plan *pl = rstate_pool_plan(p);
    for (int l = 0; l < rstate_pool_config(p)->n_layer; l++) {
        const float *cv = rstate_conv(p, slot, l), *m = rstate_mat(p, slot, l);
        for (int64_t i = 0; i < pl->conv_floats; i++)
            if (cv[i] != (seed ? val(seed, l, 0, i) : 0.0f)) return 0;
        for (int64_t i = 0; i < pl->mat_floats; i++)
            if (m[i] != (seed ? val(seed, l, 1, i) : 0.0f)) return 0;
    }
    return 1;
}

/* A distinct prefix key per id. */
static void key_of(int id, uint8_t key[KV_KEY_LEN]) {
    int32_t t = id;
    kv_prefix_key(NULL, 0, &t, 1, key);
}

static void test_plan_formula(void) {
    char err[LM_ERRLEN];
    rstate_config c;
    small_config(&c, 4, 3, 2);
    rstate_plan pl;
    CHECK(rstate_plan_make(&c, &pl, err, sizeof err) == RSTATE_OK);
    CHECK(pl.conv_floats == 3 * 7 && pl.mat_floats == 2 * 3 * 5);
    CHECK(pl.layer_bytes == (32 + 32) * 4 && pl.slot_bytes == 3 * pl.layer_bytes);
    CHECK(pl.n_slots == 9 && pl.data_bytes == 9 * pl.slot_bytes);
    CHECK(pl.live_bytes == 4 * pl.slot_bytes && pl.ckpt_bytes == 3 * pl.slot_bytes &&
          pl.snap_bytes == 2 * pl.slot_bytes);
    CHECK(pl.live_bytes + pl.ckpt_bytes + pl.snap_bytes == pl.data_bytes);
    /* a gated-DeltaNet model's dimensions: 36 recurrent layers, kernel 4,
     * 8192 channels, 32 value heads of 128 x 128; nothing to pad */
    rstate_config q;
    rstate_config_init(&q, 36, 4, 8192, 32, 128, 128);
    q.n_seqs = 8;
    q.n_snap = 4;
    CHECK(rstate_plan_make(&q, &pl, err, sizeof err) == RSTATE_OK);
    uint64_t slot = 36ull * (3 * 8192 + 32 * 128 * 128) * 4;
    CHECKF(pl.slot_bytes == slot, "%llu vs %llu", (unsigned long long)pl.slot_bytes, (unsigned long long)slot);
    CHECK(pl.data_bytes == 12 * slot && pl.snap_bytes == 4 * slot);
    /* the pool's layout is the plan's: slot and layer strides, the matrix
     * after the padded window, every pointer 64-byte aligned */
    rstate_pool *p = rstate_pool_new(&c, err, sizeof err);
    CHECK(p);
    CHECK(rstate_plan_make(&c, &pl, err, sizeof err) == RSTATE_OK);
    CHECK(!memcmp(rstate_pool_plan(p), &pl, sizeof pl));
    int a = rstate_acquire(p, err, sizeof err), b = rstate_acquire(p, err, sizeof err);
    CHECK(a == 0 && b == 1);
    CHECK((uint8_t *)rstate_conv(p, b, 0) - (uint8_t *)rstate_conv(p, a, 0) == (ptrdiff_t)pl.slot_bytes);
    CHECK((uint8_t *)rstate_conv(p, a, 2) - (uint8_t *)rstate_conv(p, a, 1) == (ptrdiff_t)pl.layer_bytes);
    CHECK((uint8_t *)rstate_mat(p, a, 1) - (uint8_t *)rstate_conv(p, a, 1) == 32 * 4);
    for (int l = 0; l < 3; l++)
        CHECK((uintptr_t)rstate_conv(p, b, l) % 64 == 0 && (uintptr_t)rstate_mat(p, b, l) % 64 == 0);
    rstate_stats st;
    rstate_stats_get(p, &st);
    CHECK(st.bytes_total == pl.data_bytes && st.slot_bytes == pl.slot_bytes);
    CHECK(st.n_live == 4 && st.n_ckpt == 3 && st.n_snap == 2 && st.n_live_used == 2);
    CHECK(st.live_bytes_used == 2 * pl.slot_bytes && st.ckpt_bytes_used == 0 && st.snap_bytes_used == 0);
    rstate_pool_free(p);
}

/* What the allocator hands out for a pool: the plan's bytes, and no more than
 * the alignment's slack and the bookkeeping beside it. The large slab comes
 * from mmap, which glibc's mallinfo2 counts (hblkhd); under an allocator
 * that reports nothing (AddressSanitizer's) only the plan is checked. */
static void test_plan_is_allocated(void) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
    char err[LM_ERRLEN];
    rstate_config c;
    rstate_config_init(&c, 4, 4, 256, 4, 32, 32);
    c.n_seqs = 6;
    c.n_ckpt = 5;
    c.n_snap = 7;
    rstate_plan pl;
    CHECK(rstate_plan_make(&c, &pl, err, sizeof err) == RSTATE_OK);
    CHECK(pl.data_bytes == 18ull * 4 * (3 * 256 + 4 * 32 * 32) * 4);
    struct mallinfo2 m0 = mallinfo2();
    rstate_pool *p = rstate_pool_new(&c, err, sizeof err);
    struct mallinfo2 m1 = mallinfo2();
    CHECK(p);
    size_t got = (m1.hblkhd - m0.hblkhd) + (m1.uordblks - m0.uordblks);
    if (got == 0) {
        printf("NOTE the allocator reports no usage: only the plan was checked\n");
    } else {
        CHECKF(got >= pl.data_bytes && got < pl.data_bytes + 2 * 4096 + 4096, "allocated %zu bytes for a plan of %llu",
               got, (unsigned long long)pl.data_bytes);
    }
    /* every slot is writable end to end (AddressSanitizer checks the bounds) */
    int s = rstate_acquire(p, err, sizeof err);
    CHECK(s >= 0);
    for (int i = 0; i < 7; i++) {
        fill(p, s, i + 1);
        uint8_t key[KV_KEY_LEN];
        key_of(i, key);
        CHECK(rstate_snap_save(p, s, key, err, sizeof err) == RSTATE_OK);
    }
    CHECK(rstate_ckpt_reserve(p, s, 0, 5, err, sizeof err) == RSTATE_OK);
    for (int i = 1; i <= 5; i++) CHECK(rstate_ckpt_save(p, s, i) == RSTATE_OK);
    for (int i = 0; i < 7; i++) {
        uint8_t key[KV_KEY_LEN];
        key_of(i, key);
        CHECK(rstate_snap_restore(p, key, s, err, sizeof err) == RSTATE_OK && holds(p, s, i + 1));
    }
    rstate_pool_free(p);
#else
    printf("NOTE no mallinfo2: only the plan was checked\n");
#endif
}

static void test_plan_errors(void) {
    char err[LM_ERRLEN];
    rstate_config c;
    rstate_plan pl;
    small_config(&c, 1, 0, 0);
    c.n_layer = 0;
    CHECK(rstate_plan_make(&c, &pl, err, sizeof err) == RSTATE_ERR && strstr(err, "positive"));
    small_config(&c, 1, 0, 0);
    c.head_v_dim = -1;
    CHECK(rstate_plan_make(&c, &pl, err, sizeof err) == RSTATE_ERR);
    small_config(&c, 0, 0, 0);
    CHECK(rstate_plan_make(&c, &pl, err, sizeof err) == RSTATE_ERR && strstr(err, "live slot"));
    small_config(&c, 1, -1, 0);
    CHECK(rstate_plan_make(&c, &pl, err, sizeof err) == RSTATE_ERR);
    small_config(&c, 1, 0, -1);
    CHECK(rstate_plan_make(&c, &pl, err, sizeof err) == RSTATE_ERR);
    CHECK(rstate_pool_new(&c, err, sizeof err) == NULL);
    rstate_config_init(&c, 1 << 20, 4, 1 << 20, 1 << 10, 1 << 10, 1 << 10);
    CHECK(rstate_plan_make(&c, &pl, err, sizeof err) == RSTATE_ERR && strstr(err, "too large"));
    small_config(&c, INT32_MAX, 1, 1);
    CHECK(rstate_plan_make(&c, &pl, err, sizeof err) == RSTATE_ERR && strstr(err, "too many"));
    /* a kernel of width 1 has no window */
    rstate_config_init(&c, 2, 1, 16, 1, 4, 4);
    CHECK(rstate_plan_make(&c, &pl, err, sizeof err) == RSTATE_OK);
    CHECK(pl.conv_floats == 0 && pl.layer_bytes == 16 * 4);
}

static void test_acquire_release_bounds(void) {
    char err[LM_ERRLEN];
    rstate_pool *p = mk(3, 0, 0);
    CHECK(p);
    int s[3];
    for (int i = 0; i < 3; i++) {
        s[i] = rstate_acquire(p, err, sizeof err);
        CHECK(s[i] == i && rstate_acquired(p, i) && holds(p, i, 0));
        fill(p, i, 10 + i);
    }
    CHECK(rstate_available(p) == 0);
    err[0] = 0;
    CHECK(rstate_acquire(p, err, sizeof err) == RSTATE_FULL && strstr(err, "all 3 live slots"));
    CHECK(rstate_fork(p, s[0], err, sizeof err) == RSTATE_FULL);
    CHECK(holds(p, 0, 10) && holds(p, 1, 11) && holds(p, 2, 12) && pool_ok(p));
    /* a released slot comes back zeroed */
    CHECK(rstate_release(p, 1) == RSTATE_OK && rstate_available(p) == 1 && !rstate_acquired(p, 1));
    CHECK(rstate_release(p, 1) == RSTATE_ERR); /* a second release */
    CHECK(rstate_release(p, -1) == RSTATE_OK); /* no slot */
    CHECK(rstate_release(p, 3) == RSTATE_ERR && rstate_release(p, INT32_MAX) == RSTATE_ERR);
    CHECK(rstate_acquire(p, err, sizeof err) == 1 && holds(p, 1, 0));
    CHECK(holds(p, 0, 10) && holds(p, 2, 12));
    /* reset zeroes one slot only */
    CHECK(rstate_reset(p, 2) == RSTATE_OK && holds(p, 2, 0) && holds(p, 0, 10));
    CHECK(rstate_reset(p, 7) == RSTATE_ERR && rstate_reset(p, -1) == RSTATE_ERR);
    CHECK(rstate_release(p, 0) == RSTATE_OK);
    CHECK(rstate_fork(p, 0, err, sizeof err) == RSTATE_ERR && strstr(err, "not acquired"));
    CHECK(pool_ok(p));
    rstate_stats st;
    rstate_stats_get(p, &st);
    CHECK(st.n_live_used == 2 && st.live_bytes_used == 2 * st.slot_bytes);
    rstate_pool_free(p);
    rstate_pool_free(NULL);
}

static void test_fork_copies(void) {
    char err[LM_ERRLEN];
    rstate_pool *p = mk(3, 2, 0);
    CHECK(p);
    int a = rstate_acquire(p, err, sizeof err);
    fill(p, a, 5);
    CHECK(rstate_ckpt_reserve(p, a, 7, 2, err, sizeof err) == RSTATE_OK);
    CHECK(rstate_ckpt_save(p, a, 8) == RSTATE_OK);
    int b = rstate_fork(p, a, err, sizeof err);
    CHECK(b >= 0 && b != a && holds(p, b, 5));
    /* independent from now on, both ways */
    fill(p, a, 6);
    CHECK(holds(p, b, 5));
    rstate_mat(p, b, 2)[0] = -1;
    rstate_conv(p, b, 0)[0] = -2;
    CHECK(holds(p, a, 6));
    /* the fork has no checkpoints; the source keeps its own */
    CHECK(rstate_ckpt_restore(p, b, 8, err, sizeof err) == RSTATE_ERR);
    CHECK(rstate_ckpt_restore(p, a, 8, err, sizeof err) == RSTATE_OK && holds(p, a, 5));
    /* a fork of a fork */
    int c = rstate_fork(p, b, err, sizeof err);
    CHECK(c >= 0 && rstate_mat(p, c, 2)[0] == -1 && rstate_conv(p, c, 0)[0] == -2);
    CHECK(pool_ok(p));
    rstate_pool_free(p);
}

/* Every (slot, layer)'s window and matrix are their own memory. */
static void test_layers_disjoint(void) {
    char err[LM_ERRLEN];
    rstate_pool *p = mk(4, 0, 0);
    CHECK(p);
    const rstate_plan *pl = rstate_pool_plan(p);
    for (int s = 0; s < 4; s++) CHECK(rstate_acquire(p, err, sizeof err) == s);
    for (int s = 0; s < 4; s++)
        for (int l = 0; l < 3; l++) {
            float *cv = rstate_conv(p, s, l), *m = rstate_mat(p, s, l);
            for (int64_t i = 0; i < pl->conv_floats; i++) cv[i] = (float)(s * 10000 + l * 1000 + i);
            for (int64_t i = 0; i < pl->mat_floats; i++) m[i] = (float)(-(s * 10000 + l * 1000 + i) - 1);
        }
    for (int s = 0; s < 4; s++)
        for (int l = 0; l < 3; l++) {
            const float *cv = rstate_conv(p, s, l), *m = rstate_mat(p, s, l);
            for (int64_t i = 0; i < pl->conv_floats; i++) CHECK(cv[i] == (float)(s * 10000 + l * 1000 + i));
            for (int64_t i = 0; i < pl->mat_floats; i++) CHECK(m[i] == (float)(-(s * 10000 + l * 1000 + i) - 1));
        }
    rstate_pool_free(p);
}

/* A verification pass of 3 tokens from position 10: the forward pass
 * advances each layer token by token and saves it after each; the target
 * accepts some, and the state goes back to the last accepted position. */
/* rstate_ckpt_layer: the forward pass writes each token's state straight
 * into the checkpoints (the live layer never holds the whole state of an
 * earlier position); the pointers are the layer's window and matrix, a
 * restore copies what was written, and positions outside the reservation
 * or a layer out of range get none. */
static void test_ckpt_layer(void) {
    char err[LM_ERRLEN];
    rstate_pool *p = mk(2, 3, 0);
    CHECK(p);
    int a = rstate_acquire(p, err, sizeof err), b = rstate_acquire(p, err, sizeof err);
    fill(p, a, 1);
    fill(p, b, 9);
    CHECK(!rstate_ckpt_reserved(p, a, 21));
    CHECK(rstate_ckpt_reserve(p, a, 20, 3, err, sizeof err) == RSTATE_OK);
    CHECK(!rstate_ckpt_reserved(p, a, 20) && rstate_ckpt_reserved(p, a, 21) && rstate_ckpt_reserved(p, a, 23) &&
          !rstate_ckpt_reserved(p, a, 24) && !rstate_ckpt_reserved(p, b, 21));
    const rstate_plan *pl = rstate_pool_plan(p);
    float *cv, *m;
    for (int t = 0; t < 3; t++)
        for (int l = 0; l < 3; l++) {
            CHECK(rstate_ckpt_layer(p, a, l, 21 + t, &cv, &m) == RSTATE_OK);
            CHECK((uintptr_t)cv % 64 == 0 && (uintptr_t)m % 64 == 0 && m - cv >= pl->conv_floats);
            for (int64_t i = 0; i < pl->conv_floats; i++) cv[i] = val(2 + t, l, 0, i);
            for (int64_t i = 0; i < pl->mat_floats; i++) m[i] = val(2 + t, l, 1, i);
        }
    CHECK(rstate_ckpt_layer(p, a, 0, 20, &cv, &m) == RSTATE_ERR &&
          rstate_ckpt_layer(p, a, 0, 24, &cv, &m) == RSTATE_ERR);
    CHECK(rstate_ckpt_layer(p, a, 3, 21, &cv, &m) == RSTATE_ERR &&
          rstate_ckpt_layer(p, b, 0, 21, &cv, &m) == RSTATE_ERR);
    CHECK(holds(p, a, 1) && holds(p, b, 9)); /* the live states untouched */
    CHECK(rstate_ckpt_restore(p, a, 22, err, sizeof err) == RSTATE_OK && holds(p, a, 3));
    CHECK(rstate_ckpt_restore(p, a, 21, err, sizeof err) == RSTATE_OK && holds(p, a, 2));
    CHECK(rstate_ckpt_restore(p, a, 23, err, sizeof err) == RSTATE_OK && holds(p, a, 4) && holds(p, b, 9));
    rstate_ckpt_release(p, a);
    CHECK(!rstate_ckpt_reserved(p, a, 21) && rstate_ckpt_available(p) == 3 && pool_ok(p));
    rstate_pool_free(p);
}

static void test_checkpoints(void) {
    char err[LM_ERRLEN];
    rstate_pool *p = mk(3, 4, 0);
    CHECK(p);
    int a = rstate_acquire(p, err, sizeof err), b = rstate_acquire(p, err, sizeof err);
    fill(p, a, 1); /* the state of position 10 */
    CHECK(rstate_ckpt_available(p) == 4);
    CHECK(rstate_ckpt_reserve(p, a, 10, 3, err, sizeof err) == RSTATE_OK);
    CHECK(rstate_ckpt_available(p) == 1 && pool_ok(p));
    const rstate_plan *pl = rstate_pool_plan(p);
    for (int l = 0; l < 3; l++)
        for (int t = 0; t < 3; t++) { /* layer by layer, token by token, as the forward pass runs */
            float *cv = rstate_conv(p, a, l), *m = rstate_mat(p, a, l);
            for (int64_t i = 0; i < pl->conv_floats; i++) cv[i] = val(2 + t, l, 0, i);
            for (int64_t i = 0; i < pl->mat_floats; i++) m[i] = val(2 + t, l, 1, i);
            CHECK(rstate_ckpt_save_layer(p, a, l, 11 + t) == RSTATE_OK);
        }
    CHECK(holds(p, a, 4)); /* the state after all three */
    /* positions outside the reservation, and other slots, have none */
    CHECK(rstate_ckpt_save_layer(p, a, 0, 10) == RSTATE_ERR && rstate_ckpt_save_layer(p, a, 0, 14) == RSTATE_ERR);
    CHECK(rstate_ckpt_save_layer(p, a, 3, 11) == RSTATE_ERR && rstate_ckpt_save_layer(p, b, 0, 11) == RSTATE_ERR);
    CHECK(rstate_ckpt_restore(p, a, 14, err, sizeof err) == RSTATE_ERR && strstr(err, "no checkpoint"));
    CHECK(rstate_ckpt_restore(p, a, 10, err, sizeof err) == RSTATE_ERR && holds(p, a, 4));
    CHECK(rstate_ckpt_restore(p, b, 11, err, sizeof err) == RSTATE_ERR);
    /* one token accepted after the pending one: position 12 */
    CHECK(rstate_ckpt_restore(p, a, 12, err, sizeof err) == RSTATE_OK && holds(p, a, 3));
    CHECK(rstate_ckpt_restore(p, a, 11, err, sizeof err) == RSTATE_OK && holds(p, a, 2));
    CHECK(rstate_ckpt_restore(p, a, 13, err, sizeof err) == RSTATE_OK && holds(p, a, 4));
    /* the bound is shared: b cannot take 2 while a holds 3 of 4 ... */
    CHECK(rstate_ckpt_reserve(p, b, 0, 2, err, sizeof err) == RSTATE_FULL && strstr(err, "1 of 4 free"));
    CHECK(rstate_ckpt_reserve(p, b, 0, 1, err, sizeof err) == RSTATE_OK && rstate_ckpt_available(p) == 0);
    CHECK(rstate_ckpt_reserve(p, b, 0, 1, err, sizeof err) == RSTATE_OK); /* its own come back first */
    /* ... and a's new reservation may reuse its old ones, but not more */
    CHECK(rstate_ckpt_reserve(p, a, 13, 4, err, sizeof err) == RSTATE_FULL);
    CHECK(rstate_ckpt_restore(p, a, 12, err, sizeof err) == RSTATE_OK); /* a failed call changed nothing */
    CHECK(rstate_ckpt_reserve(p, a, 13, 3, err, sizeof err) == RSTATE_OK && pool_ok(p));
    CHECK(rstate_ckpt_restore(p, a, 12, err, sizeof err) == RSTATE_ERR); /* the old reservation is gone */
    /* a checkpoint with a layer left unsaved is refused, the state untouched */
    fill(p, a, 7);
    CHECK(rstate_ckpt_save_layer(p, a, 0, 14) == RSTATE_OK && rstate_ckpt_save_layer(p, a, 2, 14) == RSTATE_OK);
    fill(p, a, 8);
    CHECK(rstate_ckpt_restore(p, a, 14, err, sizeof err) == RSTATE_ERR && strstr(err, "layer 1"));
    CHECK(holds(p, a, 8));
    CHECK(rstate_ckpt_save(p, a, 15) == RSTATE_OK && rstate_ckpt_save(p, a, 17) == RSTATE_ERR);
    CHECK(rstate_ckpt_reserve(p, a, -1, 1, err, sizeof err) == RSTATE_ERR);
    CHECK(rstate_ckpt_reserve(p, a, 0, 0, err, sizeof err) == RSTATE_ERR);
    CHECK(rstate_ckpt_reserve(p, a, INT32_MAX, 1, err, sizeof err) == RSTATE_ERR);
    CHECK(rstate_ckpt_reserve(p, 2, 0, 1, err, sizeof err) == RSTATE_ERR); /* not acquired */
    /* release, reset and releasing the slot give them back */
    rstate_ckpt_release(p, a);
    CHECK(rstate_ckpt_available(p) == 3 && rstate_ckpt_restore(p, a, 15, err, sizeof err) == RSTATE_ERR);
    rstate_ckpt_release(p, a);
    CHECK(rstate_ckpt_reserve(p, a, 0, 3, err, sizeof err) == RSTATE_OK && rstate_reset(p, a) == RSTATE_OK);
    CHECK(rstate_ckpt_available(p) == 3);
    CHECK(rstate_release(p, b) == RSTATE_OK && rstate_ckpt_available(p) == 4 && pool_ok(p));
    rstate_stats st;
    rstate_stats_get(p, &st);
    CHECK(st.n_ckpt_used == 0 && st.ckpt_bytes_used == 0);
    rstate_pool_free(p);

    /* a store without checkpoint slots refuses any reservation */
    p = mk(1, 0, 0);
    a = rstate_acquire(p, err, sizeof err);
    CHECK(rstate_ckpt_reserve(p, a, 0, 1, err, sizeof err) == RSTATE_FULL);
    rstate_pool_free(p);
}

static kv_pool *mk_kv(int B, int n_blocks) {
    kv_config c;
    kv_config_init(&c, 1, 1, 8);
    c.block_size = B;
    c.n_ctx = n_blocks * B;
    char err[LM_ERRLEN];
    kv_pool *p = kv_pool_new(&c, err, sizeof err);
    if (!p) fprintf(stderr, "  kv_pool_new: %s\n", err);
    return p;
}

/* A KV sequence holding the n tokens t, registered in the prefix cache. */
static kv_seq *kv_prompt(kv_pool *kv, const int32_t *t, int n, uint64_t salt) {
    char err[LM_ERRLEN];
    kv_seq *s = kv_seq_new(kv, err, sizeof err);
    if (!s || kv_append(kv, s, n, err, sizeof err) != KV_OK) return NULL;
    kv_prefix_commit(kv, s, t, n, salt);
    return s;
}

/* Snapshots are keyed by the KV cache's block keys: a probe finds the
 * longest matched prefix with a snapshot, and only for exactly that prefix
 * and salt. */
static void test_snapshot_keyed(void) {
    char err[LM_ERRLEN];
    const int B = 4;
    kv_pool *kv = mk_kv(B, 32);
    rstate_pool *p = mk(2, 0, 4);
    CHECK(kv && p);
    int32_t t[20];
    for (int i = 0; i < 20; i++) t[i] = 100 + i;
    kv_seq *a = kv_prompt(kv, t, 16, 7);
    CHECK(a);
    /* kv_seq_key is the cache's chain of keys */
    uint8_t chain[4][KV_KEY_LEN];
    for (int i = 0; i < 4; i++) {
        kv_prefix_key(i ? chain[i - 1] : NULL, 7, t + i * B, B, chain[i]);
        CHECK(kv_seq_key(a, i) && !memcmp(kv_seq_key(a, i), chain[i], KV_KEY_LEN));
    }
    CHECK(kv_seq_key(a, 4) == NULL && kv_seq_key(a, -1) == NULL);
    int s = rstate_acquire(p, err, sizeof err), d = rstate_acquire(p, err, sizeof err);
    fill(p, s, 1); /* the state of position 8 */
    CHECK(rstate_snap_save(p, s, kv_seq_key(a, 1), err, sizeof err) == RSTATE_OK);
    fill(p, s, 2); /* ... of position 16 */
    CHECK(rstate_snap_save(p, s, kv_seq_key(a, 3), err, sizeof err) == RSTATE_OK);
    CHECK(rstate_snap_has(p, chain[1]) && rstate_snap_has(p, chain[3]) && !rstate_snap_has(p, chain[2]));

    /* the same prompt, longer: KV matches 4 blocks, the snapshot at 16 */
    uint8_t key[KV_KEY_LEN];
    kv_seq *q = kv_seq_new(kv, err, sizeof err);
    CHECK(kv_prefix_match(kv, q, t, 20, 7) == 16);
    CHECK(rstate_snap_match(p, q, key) == 4 && !memcmp(key, chain[3], KV_KEY_LEN));
    CHECK(rstate_snap_restore(p, key, d, err, sizeof err) == RSTATE_OK && holds(p, d, 2));
    kv_seq_free(kv, q);

    /* a prompt differing in block 2: KV matches 2 blocks, the snapshot at 8 */
    int32_t u[20];
    memcpy(u, t, sizeof u);
    u[9] = 1;
    q = kv_seq_new(kv, err, sizeof err);
    CHECK(kv_prefix_match(kv, q, u, 20, 7) == 8);
    CHECK(rstate_snap_match(p, q, key) == 2 && !memcmp(key, chain[1], KV_KEY_LEN));
    CHECK(rstate_snap_restore(p, key, d, err, sizeof err) == RSTATE_OK && holds(p, d, 1));
    kv_seq_free(kv, q);
    /* the KV match of 3 blocks (cut at 12 tokens + 1) has a snapshot at 2 */
    q = kv_seq_new(kv, err, sizeof err);
    CHECK(kv_prefix_match(kv, q, t, 13, 7) == 12 && rstate_snap_match(p, q, key) == 2);
    CHECK(kv_truncate(kv, q, 2 * B, err, sizeof err) == KV_OK && rstate_snap_match(p, q, key) == 2);
    kv_seq_free(kv, q);

    /* a different first token, or another salt: no snapshot, even though
     * the later tokens are the same */
    u[9] = t[9];
    u[0] = 1;
    q = kv_seq_new(kv, err, sizeof err);
    CHECK(kv_prefix_match(kv, q, u, 20, 7) == 0 && rstate_snap_match(p, q, key) == 0);
    kv_seq_free(kv, q);
    q = kv_seq_new(kv, err, sizeof err);
    CHECK(kv_prefix_match(kv, q, t, 20, 8) == 0 && rstate_snap_match(p, q, key) == 0);
    kv_seq_free(kv, q);
    /* even when the other prefix is in the KV cache too: its own keys */
    kv_seq *b = kv_prompt(kv, u, 16, 7);
    CHECK(b && rstate_snap_match(p, b, key) == 0);
    for (int i = 0; i < 4; i++) CHECK(!rstate_snap_has(p, kv_seq_key(b, i)));
    kv_seq *c = kv_prompt(kv, t, 16, 8);
    CHECK(c && rstate_snap_match(p, c, key) == 0);
    /* a snapshot under b's keys never answers a's */
    fill(p, s, 3);
    CHECK(rstate_snap_save(p, s, kv_seq_key(b, 2), err, sizeof err) == RSTATE_OK);
    CHECK(rstate_snap_match(p, b, key) == 3 && rstate_snap_match(p, a, key) == 4);
    CHECK(rstate_snap_match(p, c, key) == 0);
    /* a key without a snapshot restores nothing */
    fill(p, d, 9);
    CHECK(rstate_snap_restore(p, chain[0], d, err, sizeof err) == RSTATE_ERR && strstr(err, "no recurrent"));
    CHECK(holds(p, d, 9));
    CHECK(rstate_snap_restore(p, chain[1], 2, err, sizeof err) == RSTATE_ERR); /* no such slot */
    CHECK(rstate_snap_save(p, 5, chain[0], err, sizeof err) == RSTATE_ERR);
    CHECK(pool_ok(p));
    rstate_stats st;
    rstate_stats_get(p, &st);
    CHECK(st.n_snap_used == 3 && st.snap_saved == 3 && st.snap_restored == 2 && st.snap_evicted == 0);
    CHECK(st.snap_bytes_used == 3 * st.slot_bytes);
    kv_pool_free(kv);
    rstate_pool_free(p);
}

/* A snapshot's restore brings back what was saved, even after the live
 * state changed; a store without snapshot slots says so. */
static void test_snapshot_copy_and_none(void) {
    char err[LM_ERRLEN];
    rstate_pool *p = mk(2, 0, 2);
    CHECK(p);
    int s = rstate_acquire(p, err, sizeof err);
    uint8_t k0[KV_KEY_LEN];
    key_of(0, k0);
    fill(p, s, 4);
    CHECK(rstate_snap_save(p, s, k0, err, sizeof err) == RSTATE_OK);
    fill(p, s, 5);
    CHECK(rstate_snap_save(p, s, k0, err, sizeof err) == RSTATE_OK); /* stored already: kept as it was */
    CHECK(rstate_snap_restore(p, k0, s, err, sizeof err) == RSTATE_OK && holds(p, s, 4));
    rstate_stats st;
    rstate_stats_get(p, &st);
    CHECK(st.snap_saved == 1 && st.n_snap_used == 1);
    rstate_pool_free(p);
    p = mk(1, 0, 0);
    s = rstate_acquire(p, err, sizeof err);
    CHECK(rstate_snap_save(p, s, k0, err, sizeof err) == RSTATE_FULL && strstr(err, "no snapshot slots"));
    CHECK(!rstate_snap_has(p, k0));
    rstate_snap_evict(p, k0);
    CHECK(pool_ok(p));
    rstate_pool_free(p);
}

/* Two keys alike in the 8 bytes that pick the hash bucket are still two
 * keys: all 32 bytes are compared. */
static void test_snapshot_full_key(void) {
    char err[LM_ERRLEN];
    rstate_pool *p = mk(1, 0, 4);
    CHECK(p);
    int s = rstate_acquire(p, err, sizeof err);
    uint8_t ka[KV_KEY_LEN], kb[KV_KEY_LEN];
    key_of(1, ka);
    memcpy(kb, ka, KV_KEY_LEN);
    kb[KV_KEY_LEN - 1] ^= 1;
    fill(p, s, 1);
    CHECK(rstate_snap_save(p, s, ka, err, sizeof err) == RSTATE_OK);
    CHECK(rstate_snap_has(p, ka) && !rstate_snap_has(p, kb));
    fill(p, s, 2);
    CHECK(rstate_snap_restore(p, kb, s, err, sizeof err) == RSTATE_ERR && holds(p, s, 2));
    CHECK(rstate_snap_save(p, s, kb, err, sizeof err) == RSTATE_OK);
    CHECK(rstate_snap_restore(p, ka, s, err, sizeof err) == RSTATE_OK && holds(p, s, 1));
    CHECK(rstate_snap_restore(p, kb, s, err, sizeof err) == RSTATE_OK && holds(p, s, 2));
    rstate_snap_evict(p, kb);
    CHECK(rstate_snap_has(p, ka) && !rstate_snap_has(p, kb) && pool_ok(p));
    rstate_pool_free(p);
}

static void test_snapshot_lru(void) {
    char err[LM_ERRLEN];
    rstate_pool *p = mk(2, 0, 3);
    CHECK(p);
    int s = rstate_acquire(p, err, sizeof err), d = rstate_acquire(p, err, sizeof err);
    uint8_t k[6][KV_KEY_LEN];
    for (int i = 0; i < 6; i++) key_of(i, k[i]);
    for (int i = 0; i < 3; i++) {
        fill(p, s, 10 + i);
        CHECK(rstate_snap_save(p, s, k[i], err, sizeof err) == RSTATE_OK);
    }
    /* use order now 0, 1, 2; a restore of 0 and a repeated save of 1 make it 2, 0, 1 */
    CHECK(rstate_snap_restore(p, k[0], d, err, sizeof err) == RSTATE_OK && holds(p, d, 10));
    CHECK(rstate_snap_save(p, s, k[1], err, sizeof err) == RSTATE_OK);
    fill(p, s, 13);
    CHECK(rstate_snap_save(p, s, k[3], err, sizeof err) == RSTATE_OK);
    CHECK(!rstate_snap_has(p, k[2]) && rstate_snap_has(p, k[0]) && rstate_snap_has(p, k[1]));
    fill(p, s, 14);
    CHECK(rstate_snap_save(p, s, k[4], err, sizeof err) == RSTATE_OK);
    CHECK(!rstate_snap_has(p, k[0]) && rstate_snap_has(p, k[1]) && rstate_snap_has(p, k[3]));
    fill(p, s, 15);
    CHECK(rstate_snap_save(p, s, k[5], err, sizeof err) == RSTATE_OK);
    CHECK(!rstate_snap_has(p, k[1]) && rstate_snap_has(p, k[3]) && rstate_snap_has(p, k[4]));
    /* the survivors hold what was saved under their keys */
    CHECK(rstate_snap_restore(p, k[3], d, err, sizeof err) == RSTATE_OK && holds(p, d, 13));
    CHECK(rstate_snap_restore(p, k[5], d, err, sizeof err) == RSTATE_OK && holds(p, d, 15));
    CHECK(rstate_snap_restore(p, k[4], d, err, sizeof err) == RSTATE_OK && holds(p, d, 14));
    /* a dropped snapshot's slot is reused before any eviction */
    rstate_snap_evict(p, k[3]);
    rstate_snap_evict(p, k[3]); /* gone already: nothing */
    fill(p, s, 16);
    CHECK(rstate_snap_save(p, s, k[0], err, sizeof err) == RSTATE_OK);
    CHECK(rstate_snap_has(p, k[5]) && rstate_snap_has(p, k[4]) && rstate_snap_has(p, k[0]));
    rstate_stats st;
    rstate_stats_get(p, &st);
    CHECK(st.snap_evicted == 3 && st.snap_dropped == 1 && st.snap_saved == 7 && st.snap_restored == 4);
    CHECK(pool_ok(p));
    rstate_pool_free(p);
}

/* With the eviction hook, a snapshot leaves with its KV block: when the
 * block is evicted for reuse, and when a sequence truncated into it writes
 * it again. */
static void test_snapshot_follows_kv(void) {
    char err[LM_ERRLEN];
    const int B = 4;
    kv_pool *kv = mk_kv(B, 4);
    rstate_pool *p = mk(1, 0, 4);
    CHECK(kv && p);
    kv_set_evict_hook(kv, rstate_snap_evict, p);
    int s = rstate_acquire(p, err, sizeof err);
    int32_t t[16], u[16];
    for (int i = 0; i < 16; i++) t[i] = i, u[i] = 50 + i;
    kv_seq *a = kv_prompt(kv, t, 8, 0);
    CHECK(a);
    uint8_t k1[KV_KEY_LEN], k0[KV_KEY_LEN];
    memcpy(k0, kv_seq_key(a, 0), KV_KEY_LEN);
    memcpy(k1, kv_seq_key(a, 1), KV_KEY_LEN);
    fill(p, s, 1);
    CHECK(rstate_snap_save(p, s, k0, err, sizeof err) == RSTATE_OK);
    CHECK(rstate_snap_save(p, s, k1, err, sizeof err) == RSTATE_OK);
    /* a truncated into its block 1 and writing there: that block's key goes */
    CHECK(kv_truncate(kv, a, 6, err, sizeof err) == KV_OK && rstate_snap_has(p, k1));
    CHECK(kv_append(kv, a, 1, err, sizeof err) == KV_OK);
    CHECK(!rstate_snap_has(p, k1) && rstate_snap_has(p, k0));
    /* released, block 0 stays cached with its snapshot ... */
    kv_seq_free(kv, a);
    CHECK(rstate_snap_has(p, k0));
    /* ... until another sequence needs every block */
    kv_seq *b = kv_prompt(kv, u, 12, 0);
    CHECK(b && rstate_snap_has(p, k0));
    CHECK(kv_append(kv, b, 4, err, sizeof err) == KV_OK);
    CHECK(!rstate_snap_has(p, k0));
    rstate_stats st;
    rstate_stats_get(p, &st);
    CHECK(st.snap_dropped == 2 && st.n_snap_used == 0 && pool_ok(p));
    /* without the hook the pool tells no one */
    fill(p, s, 2);
    CHECK(rstate_snap_save(p, s, kv_seq_key(b, 0), err, sizeof err) == RSTATE_OK);
    kv_set_evict_hook(kv, NULL, NULL);
    memcpy(k0, kv_seq_key(b, 0), KV_KEY_LEN);
    kv_seq_free(kv, b);
    kv_seq *c = kv_prompt(kv, t, 16, 0);
    CHECK(c && rstate_snap_has(p, k0));
    kv_pool_free(kv);
    rstate_pool_free(p);
}

static void test_alloc_failures(void) {
    char err[LM_ERRLEN];
    rstate_config c;
    small_config(&c, 2, 2, 2);
    for (long k = 0; k < 3; k++) {
        lm_alloc_fail_after(k);
        rstate_pool *p = rstate_pool_new(&c, err, sizeof err);
        lm_alloc_fail_after(-1);
        CHECKF(!p && strstr(err, "out of memory"), "allocation %ld: %s", k, p ? "made" : err);
        rstate_pool_free(p);
    }
    lm_alloc_fail_after(3); /* the pool makes three allocations, no more */
    rstate_pool *p = rstate_pool_new(&c, err, sizeof err);
    lm_alloc_fail_after(-1);
    CHECK(p);
    /* and nothing after creation allocates */
    lm_alloc_fail_after(0);
    int s = rstate_acquire(p, err, sizeof err), f = rstate_fork(p, s, err, sizeof err);
    uint8_t k0[KV_KEY_LEN] = {1};
    int rc[4];
    rc[0] = rstate_snap_save(p, s, k0, err, sizeof err);
    rc[1] = rstate_ckpt_reserve(p, f, 0, 2, err, sizeof err);
    rc[2] = rstate_ckpt_save(p, f, 1);
    rc[3] = rstate_snap_restore(p, k0, f, err, sizeof err);
    lm_alloc_fail_after(-1);
    CHECK(s >= 0 && f >= 0 && pool_ok(p));
    for (int i = 0; i < 4; i++) CHECK(rc[i] == RSTATE_OK);
    rstate_pool_free(p);
}

/* Random operations against a model of the store: each live slot's seed,
 * each checkpoint position's seed, the snapshots' seeds in LRU order; every
 * restore must bring back the modelled seed, every refusal must be one the
 * model expects, and the invariant checker must pass after each step. */
static void test_random_workload(void) {
    enum { NS = 5, NC = 6, NN = 4, NK = 9, STEPS = 4000 };
    char err[LM_ERRLEN];
    rstate_pool *p = mk(NS, NC, NN);
    CHECK(p);
    lm_rng rng;
    lm_rng_seed(&rng, 12345);
    int live[NS]; /* seed held, -1: free */
    int ck_pos0[NS], ck_n[NS], ck_seed[NS][NC];
    int snap_seed[NK];      /* seed under key i, -1: none */
    int lru[NN], n_lru = 0; /* keys, least recently used first */
    uint8_t keys[NK][KV_KEY_LEN];
    for (int i = 0; i < NK; i++) key_of(i, keys[i]), snap_seed[i] = -1;
    for (int i = 0; i < NS; i++) live[i] = -1, ck_n[i] = 0;
    int next_seed = 1, n_ck_used = 0;
    for (int step = 0; step < STEPS; step++) {
        int op = (int)(lm_rng_u64(&rng) % 9), slot = (int)(lm_rng_u64(&rng) % NS);
        int ki = (int)(lm_rng_u64(&rng) % NK);
        switch (op) {
            case 0: { /* acquire */
                int n_free = 0;
                for (int i = 0; i < NS; i++) n_free += live[i] < 0;
                int s = rstate_acquire(p, err, sizeof err);
                if (!n_free) {
                    CHECK(s == RSTATE_FULL);
                    break;
                }
                CHECK(s >= 0 && s < NS && live[s] < 0 && holds(p, s, 0));
                live[s] = 0;
                fill(p, s, next_seed);
                live[s] = next_seed++;
                break;
            }
            case 1: /* release */
                CHECK(rstate_release(p, slot) == (live[slot] >= 0 ? RSTATE_OK : RSTATE_ERR));
                if (live[slot] >= 0) n_ck_used -= ck_n[slot], ck_n[slot] = 0;
                live[slot] = -1;
                break;
            case 2: { /* fork */
                int n_free = 0;
                for (int i = 0; i < NS; i++) n_free += live[i] < 0;
                int s = rstate_fork(p, slot, err, sizeof err);
                if (live[slot] < 0) CHECK(s == RSTATE_ERR);
                else if (!n_free) CHECK(s == RSTATE_FULL);
                else {
                    CHECK(s >= 0 && live[s] < 0 && holds(p, s, live[slot]));
                    live[s] = live[slot];
                }
                break;
            }
            case 3: /* reserve checkpoints and save some positions as a pass would */
                if (live[slot] >= 0) {
                    int n = 1 + (int)(lm_rng_u64(&rng) % 4), pos0 = (int)(lm_rng_u64(&rng) % 50);
                    int rc = rstate_ckpt_reserve(p, slot, pos0, n, err, sizeof err);
                    if (n > NC - n_ck_used + ck_n[slot]) {
                        CHECK(rc == RSTATE_FULL);
                        break;
                    }
                    CHECK(rc == RSTATE_OK);
                    n_ck_used += n - ck_n[slot];
                    ck_n[slot] = n;
                    ck_pos0[slot] = pos0;
                    for (int i = 0; i < n; i++) {
                        ck_seed[slot][i] = -1;
                        if (lm_rng_u64(&rng) % 4 == 0) continue; /* not saved */
                        fill(p, slot, next_seed);
                        live[slot] = next_seed++;
                        CHECK(rstate_ckpt_save(p, slot, pos0 + 1 + i) == RSTATE_OK);
                        ck_seed[slot][i] = live[slot];
                    }
                }
                break;
            case 4: /* roll back */
                if (live[slot] >= 0) {
                    int i = (int)(lm_rng_u64(&rng) % 6) - 1;
                    int pos = (ck_n[slot] ? ck_pos0[slot] : 0) + 1 + i;
                    int rc = rstate_ckpt_restore(p, slot, pos, err, sizeof err);
                    bool ok = ck_n[slot] && i >= 0 && i < ck_n[slot] && ck_seed[slot][i] >= 0;
                    CHECK(rc == (ok ? RSTATE_OK : RSTATE_ERR));
                    if (ok) live[slot] = ck_seed[slot][i];
                    CHECK(holds(p, slot, live[slot]));
                }
                break;
            case 5: { /* snapshot */
                int rc = rstate_snap_save(p, slot, keys[ki], err, sizeof err);
                if (live[slot] < 0) {
                    CHECK(rc == RSTATE_ERR);
                    break;
                }
                CHECK(rc == RSTATE_OK);
                int at = -1;
                for (int i = 0; i < n_lru; i++)
                    if (lru[i] == ki) at = i;
                if (at < 0) {
                    if (n_lru == NN) { /* the least recently used goes */
                        snap_seed[lru[0]] = -1;
                        memmove(lru, lru + 1, (size_t)--n_lru * sizeof *lru);
                    }
                    snap_seed[ki] = live[slot];
                } else {
                    memmove(lru + at, lru + at + 1, (size_t)(n_lru - at - 1) * sizeof *lru);
                    n_lru--;
                }
                lru[n_lru++] = ki;
                break;
            }
            case 6: { /* restore a snapshot */
                int rc = rstate_snap_restore(p, keys[ki], slot, err, sizeof err);
                if (live[slot] < 0 || snap_seed[ki] < 0) {
                    CHECK(rc == RSTATE_ERR);
                    break;
                }
                CHECK(rc == RSTATE_OK && holds(p, slot, snap_seed[ki]));
                live[slot] = snap_seed[ki];
                n_ck_used -= ck_n[slot];
                ck_n[slot] = 0;
                int at = 0;
                while (lru[at] != ki) at++;
                memmove(lru + at, lru + at + 1, (size_t)(n_lru - at - 1) * sizeof *lru);
                lru[n_lru - 1] = ki;
                break;
            }
            case 7: /* a KV block leaves the cache */
                rstate_snap_evict(p, keys[ki]);
                if (snap_seed[ki] >= 0) {
                    int at = 0;
                    while (lru[at] != ki) at++;
                    memmove(lru + at, lru + at + 1, (size_t)(n_lru - at - 1) * sizeof *lru);
                    n_lru--;
                    snap_seed[ki] = -1;
                }
                break;
            default: /* reset */
                CHECK(rstate_reset(p, slot) == (live[slot] >= 0 ? RSTATE_OK : RSTATE_ERR));
                if (live[slot] >= 0) live[slot] = 0, n_ck_used -= ck_n[slot], ck_n[slot] = 0;
                break;
        }
        CHECK(pool_ok(p));
        for (int i = 0; i < NK; i++) CHECK(rstate_snap_has(p, keys[i]) == (snap_seed[i] >= 0));
        for (int i = 0; i < NS; i++) CHECK(rstate_acquired(p, i) == (live[i] >= 0));
        CHECK(rstate_ckpt_available(p) == NC - n_ck_used);
    }
    for (int i = 0; i < NS; i++)
        if (live[i] >= 0) CHECK(holds(p, i, live[i]));
    rstate_stats st;
    rstate_stats_get(p, &st);
    CHECK(st.snap_evicted > 0 && st.snap_dropped > 0 && st.snap_restored > 0);
    rstate_pool_free(p);
}

/* Layer 0's and 1's first window and matrix floats of slot: which
 * pattern (fill's seed) it holds, whatever the store's dimensions. */
static int same_pattern(rstate_pool *a, rstate_pool *b, int slot) {
    for (int l = 0; l < 2; l++)
        if (rstate_conv(a, slot, l)[0] != rstate_conv(b, slot, l)[0] ||
            rstate_mat(a, slot, l)[0] != rstate_mat(b, slot, l)[0])
            return 0;
    return 1;
}

static void test_log_replay(void) {
    enum { NS = 5, NC = 6, NN = 3, NK = 6 };
    char err[LM_ERRLEN];
    rstate_pool *p = mk(NS, NC, NN); /* the leader's: 3 layers */
    rstate_config c;
    rstate_config_init(&c, 2, 3, 11, 3, 2, 4); /* a follower's part: other layers and heads */
    c.n_seqs = NS, c.n_ckpt = NC, c.n_snap = NN;
    rstate_pool *q = rstate_pool_new(&c, err, sizeof err);
    CHECK(p && q);
    if (!p || !q) return;
    const rstate_op *ops;
    rstate_log_start(p);
    CHECK(rstate_log_take(p, &ops) == 0);
    /* failed calls and no-ops log nothing */
    CHECK(rstate_release(p, 2) == RSTATE_ERR && rstate_fork(p, 1, NULL, 0) == RSTATE_ERR);
    rstate_ckpt_release(p, 0);
    CHECK(rstate_log_take(p, &ops) == 0);
    uint8_t keys[NK][KV_KEY_LEN];
    for (int i = 0; i < NK; i++) key_of(i, keys[i]);
    lm_rng rng;
    lm_rng_seed(&rng, 777);
    int seed = 1, n_ops = 0, kinds[RSTATE_OP_SNAP_EVICT + 1] = {0};
    for (int it = 0; it < 3000; it++) {
        int op = (int)(lm_rng_u64(&rng) % 11), slot = (int)(lm_rng_u64(&rng) % NS);
        int ki = (int)(lm_rng_u64(&rng) % NK), pos = (int)(lm_rng_u64(&rng) % 40);
        switch (op) {
            case 0:
            case 1: rstate_acquire(p, NULL, 0); break;
            case 2: rstate_fork(p, slot, NULL, 0); break;
            case 3: rstate_release(p, slot); break;
            case 4: rstate_reset(p, slot); break;
            case 5: rstate_ckpt_reserve(p, slot, pos, 1 + (int)(lm_rng_u64(&rng) % 3), NULL, 0); break;
            case 6: rstate_ckpt_restore(p, slot, pos, NULL, 0); break;
            case 7: rstate_ckpt_release(p, slot); break;
            case 8: rstate_snap_save(p, slot, keys[ki], NULL, 0); break;
            case 9: rstate_snap_restore(p, keys[ki], slot, NULL, 0); break;
            default: rstate_snap_evict(p, keys[ki]); break;
        }
        if (it % 7) continue;
        /* a pass: the follower replays the log, then both stores' passes
         * write the same patterns into every live slot and its checkpoints */
        int n = rstate_log_take(p, &ops);
        CHECK(n >= 0);
        for (int i = 0; i < n; i++) {
            CHECKF(rstate_replay(q, &ops[i], err, sizeof err) == RSTATE_OK, "op %d: %s", ops[i].op, err);
            if (ops[i].op >= 1 && ops[i].op <= RSTATE_OP_SNAP_EVICT) kinds[ops[i].op]++;
        }
        n_ops += n;
        for (int s2 = 0; s2 < NS; s2++) {
            CHECK(rstate_acquired(p, s2) == rstate_acquired(q, s2));
            if (!rstate_acquired(p, s2)) continue;
            CHECKF(same_pattern(p, q, s2), "slot %d after %d operations", s2, n_ops);
            for (int x = 0; x < 44; x++) CHECK(rstate_ckpt_reserved(p, s2, x) == rstate_ckpt_reserved(q, s2, x));
            for (int x = 0; x < 44; x++)
                if (rstate_ckpt_reserved(p, s2, x) && lm_rng_u64(&rng) % 3) {
                    fill(p, s2, seed), fill(q, s2, seed++);
                    CHECK(rstate_ckpt_save(p, s2, x) == RSTATE_OK && rstate_ckpt_save(q, s2, x) == RSTATE_OK);
                }
            if (lm_rng_u64(&rng) % 2) fill(p, s2, seed), fill(q, s2, seed++);
        }
        for (int i = 0; i < NK; i++) CHECK(rstate_snap_has(p, keys[i]) == rstate_snap_has(q, keys[i]));
        CHECK(rstate_ckpt_available(p) == rstate_ckpt_available(q) && rstate_available(p) == rstate_available(q));
        CHECK(pool_ok(p) && pool_ok(q));
    }
    int n = rstate_log_take(p, &ops); /* the operations after the last pass */
    for (int i = 0; i < n; i++) CHECK(rstate_replay(q, &ops[i], err, sizeof err) == RSTATE_OK);
    for (int k = RSTATE_OP_ACQUIRE; k <= RSTATE_OP_SNAP_EVICT; k++) CHECKF(kinds[k] > 0, "no operation %d logged", k);
    rstate_stats a, b;
    rstate_stats_get(p, &a);
    rstate_stats_get(q, &b);
    CHECKF(a.snap_saved == b.snap_saved && a.snap_restored == b.snap_restored && a.snap_evicted == b.snap_evicted &&
               a.snap_dropped == b.snap_dropped && a.snap_evicted > 0,
           "saved %llu %llu restored %llu %llu evicted %llu %llu dropped %llu %llu", (unsigned long long)a.snap_saved,
           (unsigned long long)b.snap_saved, (unsigned long long)a.snap_restored, (unsigned long long)b.snap_restored,
           (unsigned long long)a.snap_evicted, (unsigned long long)b.snap_evicted, (unsigned long long)a.snap_dropped,
           (unsigned long long)b.snap_dropped);
    /* a replay that would hand out another slot than the leader's (or none) */
    rstate_op bad = {.op = RSTATE_OP_ACQUIRE, .a = 99};
    CHECK(rstate_replay(q, &bad, err, sizeof err) == RSTATE_ERR);
    rstate_op unknown = {.op = 77};
    CHECK(rstate_replay(q, &unknown, err, sizeof err) == RSTATE_ERR && strstr(err, "unknown"));
    rstate_pool_free(p);
    rstate_pool_free(q);
}

int main(void) {
    TEST_RUN(test_plan_formula);
    TEST_RUN(test_plan_is_allocated);
    TEST_RUN(test_plan_errors);
    TEST_RUN(test_acquire_release_bounds);
    TEST_RUN(test_fork_copies);
    TEST_RUN(test_layers_disjoint);
    TEST_RUN(test_checkpoints);
    TEST_RUN(test_ckpt_layer);
    TEST_RUN(test_snapshot_keyed);
    TEST_RUN(test_snapshot_copy_and_none);
    TEST_RUN(test_snapshot_full_key);
    TEST_RUN(test_snapshot_lru);
    TEST_RUN(test_snapshot_follows_kv);
    TEST_RUN(test_alloc_failures);
    TEST_RUN(test_random_workload);
    TEST_RUN(test_log_replay);
    return TEST_DONE();
}
