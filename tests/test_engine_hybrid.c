/*
 * test_engine_hybrid.c - the prefix cache on a hybrid model (recurrent
 * gated-DeltaNet layers beside full attention): `lamina mkmodel --preset
 * qwen35-small` (random weights of Qwen3.5's layout, the GPT-2 vocabulary)
 * through the engine, with token prompts that share a system prompt.
 *
 * The reference is the same engine with the prefix cache off (every prompt
 * prefilled from position 0). With it on, every request must give the same
 * tokens and log-probabilities to the bit, greedy and sampled with a seed:
 * a restored snapshot holds the state the prefill computed, and prompts
 * split only on the 64-position grid (engine_state.c). Beside that:
 *   - what the cache fills (lm_request_stats.cached_tokens) is the longest
 *     prefix with a snapshot, computed here from the rule: snapshot points
 *     are multiples of lcm(block, 64) up to the prompt, saved at chunk
 *     ends, at the last point a match of the same prompt reaches, and at
 *     the last one below the prompt's KV match; the prefix-hit counter
 *     counts only those blocks;
 *   - the snapshot counters move: saved, restored, evicted (one slot: a
 *     second prompt's snapshot evicts the first's, whose KV blocks stay
 *     cached, so the next hit has no snapshot and prefills from 0), and
 *     dropped (a small KV pool: another prompt evicts the first's blocks);
 *   - forks (n = 2), preemption in a small pool, a cancelled request and
 *     tenants (cache_salt) give the reference's tokens, and engine_check
 *     (KV and state store invariants, slots held only by running choices)
 *     holds after each;
 *   - the memory plan counts the snapshot slots (mem_state, mem_state_snap)
 *     and state_snapshots chooses them;
 *   - speculation (prompt lookup) beside the prefix cache gives the tokens
 *     of the same engine without it, its state rolled back by checkpoints
 *     (test_speculation);
 *   - a prompt that the batch's budget leaves one token, beside a decode
 *     and a whole prompt, waits for a chunk on the grid rather than run
 *     that token alone, and gives the reference's tokens (test_last_token;
 *     engine_state_trim's rules, test_trim).
 * Needs build/lamina (LAMINA_BIN) for mkmodel.
 */
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "sched/engine.h"
#include "sched/engine_int.h"
#include "test.h"

static lm_model *model;
static char path[64] = "/tmp/lamina_test_hybrid_XXXXXX";

#define MAX_OUT 48
#define N_GEN 40 /* a request grows by 3 blocks after its admission (test_pressure) */
#define SYS 300  /* the shared system prompt's tokens */
#define USER 50  /* each user part's */
#define BLOCK 16 /* the engine's KV block */
#define GRID 64  /* snapshot points: lcm(BLOCK, 64) */

typedef struct {
    int32_t tokens[2][MAX_OUT];
    float logprobs[2][MAX_OUT];
    int n[2];
    lm_finish finish[2];
    lm_request_stats stats[2];
    atomic_int n_done;
} collect;

static void on_event(void *user, const lm_event *ev) {
    collect *c = user;
    int i = ev->index;
    if (ev->token >= 0 && c->n[i] < MAX_OUT) {
        c->logprobs[i][c->n[i]] = ev->logprob;
        c->tokens[i][c->n[i]++] = ev->token;
    }
    if (ev->done) {
        c->finish[i] = ev->finish;
        c->stats[i] = *ev->stats;
        atomic_fetch_add(&c->n_done, 1);
    }
}

/* A request of prompt p: greedy (temp 0), or sampled with seed. */
static lm_request_params params(const int32_t *p, int n, bool sampled, int n_choices, uint64_t salt, collect *c) {
    lm_request_params q;
    engine_request_params_default(&q);
    q.prompt = p;
    q.n_prompt = n;
    q.max_tokens = N_GEN;
    q.n = n_choices;
    q.ignore_eos = true;
    q.logprobs = true;
    q.cache_salt = salt;
    if (sampled) q.sp.temp = 0.9f, q.sp.top_k = 0, q.sp.top_p = 1, q.sp.seed = 1234;
    else q.sp.temp = 0;
    q.on_event = on_event;
    q.user = c;
    return q;
}

static lm_engine *new_engine(bool cache, int batch, int max_seqs, uint64_t kv_mem, int snaps) {
    lm_engine_config ec;
    engine_config_default(&ec);
    ec.n_threads = 2;
    ec.n_ctx = 1024;
    ec.batch_tokens = batch;
    ec.max_seqs = max_seqs;
    ec.kv_mem = kv_mem;
    ec.kv_type = LM_TYPE_F32;
    ec.block_size = BLOCK;
    ec.prefix_cache = cache;
    ec.state_snapshots = snaps;
    char err[LM_ERRLEN];
    lm_engine *e = engine_new(model, model->tok, &ec, err, sizeof err);
    if (!e) fprintf(stderr, "engine_new: %s\n", err);
    return e;
}

/* One request alone, to the end: 0, or -1 when it did not finish normally. */
static int run1(lm_engine *e, const int32_t *p, int n, bool sampled, int n_choices, uint64_t salt, collect *c) {
    memset(c, 0, sizeof *c);
    lm_request_params q = params(p, n, sampled, n_choices, salt, c);
    char err[LM_ERRLEN];
    if (engine_submit(e, &q, NULL, err, sizeof err) != LM_OK) {
        fprintf(stderr, "submit: %s\n", err);
        return -1;
    }
    engine_wait_idle(e);
    for (int i = 0; i < n_choices; i++)
        if (c->finish[i] != LM_FINISH_LENGTH || c->n[i] != N_GEN) return -1;
    return 0;
}

static bool same(const collect *a, const collect *b, int n_choices) {
    for (int i = 0; i < n_choices; i++)
        if (a->n[i] != b->n[i] || memcmp(a->tokens[i], b->tokens[i], sizeof a->tokens[i]) ||
            memcmp(a->logprobs[i], b->logprobs[i], sizeof a->logprobs[i]))
            return false;
    return true;
}

/* The prompts: SYS shared tokens, then USER tokens of their own. */
static int32_t prompts[4][SYS + USER];
#define NP (SYS + USER)

static void make_prompts(void) {
    lm_rng r;
    lm_rng_seed(&r, 7);
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < NP; i++) {
            int32_t t = 100 + (int32_t)(lm_rng_u64(&r) % 20000);
            prompts[k][i] = i < SYS ? (k ? prompts[0][i] : t) : t;
        }
}

/* The references: each prompt with the prefix cache off, greedy and
 * sampled, one choice and two. */
static collect ref[4][2], ref2[2];

static void test_references(void) {
    lm_engine *e = new_engine(false, 512, 4, 0, 0);
    CHECK(e);
    for (int k = 0; k < 4; k++)
        for (int s = 0; s < 2; s++) CHECKF(run1(e, prompts[k], NP, s, 1, 0, &ref[k][s]) == 0, "prompt %d", k);
    for (int s = 0; s < 2; s++) CHECK(run1(e, prompts[0], NP, s, 2, 0, &ref2[s]) == 0);
    lm_engine_stats st;
    engine_stats(e, &st);
    CHECKF(st.state_snap_slots == 0 && st.mem_state_snap == 0, "cache off: %lld snapshot slots",
           (long long)st.state_snap_slots);
    /* the sampled text differs from the greedy one (so the sampled checks below test something) */
    CHECK(memcmp(ref[0][0].tokens[0], ref[0][1].tokens[0], sizeof ref[0][0].tokens[0]) != 0);
    engine_free(e);
}

static int grid_floor(int p) { return p / GRID * GRID; }
/* the last snapshot point a KV match of a prompt of n tokens reaches */
static int last_point(int n) { return grid_floor((n - 1) / BLOCK * BLOCK); }

/* Shared system prompt, greedy and sampled, batch 512 (each prompt one
 * chunk but for the cuts at its snapshot points). */
static void test_shared_prompt(void) {
    for (int s = 0; s < 2; s++) {
        lm_engine *e = new_engine(true, 512, 4, 0, 8); /* room for every snapshot the prompts save */
        CHECK(e);
        collect c;
        lm_engine_stats st0, st;
        /* cached[k]: what request k's prefix hit restores */
        int match = SYS / BLOCK * BLOCK; /* the KV match of a prompt sharing the system prompt */
        int cached[4] = {0, 0, grid_floor(match), grid_floor(match)};
        /* request 0 saves at its last point (beyond the system prompt: no use to the others); request 1
         * has a KV match but no snapshot in it: a full prefill, which saves at the match's grid point */
        CHECK(last_point(NP) > match && grid_floor(match) > 0);
        for (int k = 0; k < 4; k++) {
            engine_stats(e, &st0);
            CHECKF(run1(e, prompts[k], NP, s, 1, 0, &c) == 0, "prompt %d", k);
            engine_stats(e, &st);
            CHECKF(same(&c, &ref[k][s], 1), "%s prompt %d: tokens or logprobs differ from the cache-off run",
                   s ? "sampled" : "greedy", k);
            CHECKF(c.stats[0].cached_tokens == cached[k], "prompt %d: %d cached, expected %d", k,
                   c.stats[0].cached_tokens, cached[k]);
            CHECKF(st.prefix_hits_total - st0.prefix_hits_total == (uint64_t)(cached[k] / BLOCK),
                   "prompt %d: %llu prefix-hit blocks counted, %d cached", k,
                   (unsigned long long)(st.prefix_hits_total - st0.prefix_hits_total), cached[k]);
            CHECKF(st.state_snap_restored_total - st0.state_snap_restored_total == (cached[k] > 0),
                   "prompt %d: %llu restored", k,
                   (unsigned long long)(st.state_snap_restored_total - st0.state_snap_restored_total));
            CHECKF(st.state_snap_saved_total > st0.state_snap_saved_total, "prompt %d saved no snapshot", k);
        }
        /* the same prompt again: all but the positions after its last point come from the cache */
        engine_stats(e, &st0);
        CHECK(run1(e, prompts[0], NP, s, 1, 0, &c) == 0);
        engine_stats(e, &st);
        CHECKF(same(&c, &ref[0][s], 1), "prompt 0 again: differs");
        CHECKF(c.stats[0].cached_tokens == last_point(NP), "prompt 0 again: %d cached, expected %d",
               c.stats[0].cached_tokens, last_point(NP));
        CHECK(st.state_snap_saved_total == st0.state_snap_saved_total); /* nothing new */
        /* held: the system prompt's (256) and each prompt's last point */
        CHECKF(st.state_snap_used == 5 && st.state_snap_evicted_total == 0 && st.state_snap_slots == 8, "%lld held",
               (long long)st.state_snap_used);
        char err[LM_ERRLEN];
        CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
        engine_free(e);
    }
}

/* Chunks of 128: every chunk end on the grid is saved as it comes, so the
 * second prompt restores the last chunk end inside the system prompt. */
static void test_chunk_ends(void) {
    lm_engine *e = new_engine(true, 128, 4, 0, 16);
    CHECK(e);
    collect c;
    CHECK(run1(e, prompts[0], NP, false, 1, 0, &c) == 0 && same(&c, &ref[0][0], 1));
    lm_engine_stats st;
    engine_stats(e, &st);
    /* saved: 128, 256 (chunk ends) and the last point 320 */
    CHECKF(st.state_snap_saved_total == 3, "%llu saved", (unsigned long long)st.state_snap_saved_total);
    CHECK(run1(e, prompts[1], NP, false, 1, 0, &c) == 0);
    CHECKF(same(&c, &ref[1][0], 1), "prompt 1 after chunked prompt 0: differs");
    CHECKF(c.stats[0].cached_tokens == 256, "%d cached", c.stats[0].cached_tokens);
    engine_free(e);
}

/* One snapshot slot: the second prompt's snapshot evicts the first's while
 * the first's KV blocks stay cached; the first prompt again then has a KV
 * hit and no snapshot: a full prefill, the same tokens. */
static void test_hit_without_snapshot(void) {
    lm_engine *e = new_engine(true, 512, 4, 0, 1);
    CHECK(e);
    collect c;
    lm_engine_stats st0, st;
    CHECK(run1(e, prompts[0], NP, false, 1, 0, &c) == 0);
    CHECK(run1(e, prompts[2], NP, false, 1, 0, &c) == 0); /* KV hit in the system prompt, no snapshot */
    engine_stats(e, &st0);
    CHECKF(st0.state_snap_evicted_total >= 1 && st0.state_snap_used == 1, "%llu evicted, %lld held",
           (unsigned long long)st0.state_snap_evicted_total, (long long)st0.state_snap_used);
    CHECKF(st0.kv_blocks_cached > (int64_t)(NP / BLOCK), "%lld blocks cached", (long long)st0.kv_blocks_cached);
    CHECK(run1(e, prompts[3], NP, false, 1, 0, &c) == 0); /* evicts prompt 2's snapshot in turn */
    engine_stats(e, &st0);
    CHECK(run1(e, prompts[0], NP, false, 1, 0, &c) == 0);
    engine_stats(e, &st);
    CHECKF(same(&c, &ref[0][0], 1), "prompt 0 without its snapshot: differs");
    CHECKF(c.stats[0].cached_tokens == 0, "%d cached", c.stats[0].cached_tokens);
    CHECK(st.state_snap_restored_total == st0.state_snap_restored_total);
    CHECK(st.prefix_hits_total == st0.prefix_hits_total); /* the KV match was cut to nothing */
    CHECK(st.prefix_queries_total > st0.prefix_queries_total);
    char err[LM_ERRLEN];
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    engine_free(e);
}

/* A KV pool of 28 blocks (a request needs 25 by its end):
 * the second prompt (no shared prefix) evicts the first's cached blocks and
 * their snapshots go with them; the first again prefills from 0. */
static void test_eviction_drops(void) {
    lm_engine *e = new_engine(true, 512, 1, 0, 0);
    CHECK(e);
    lm_engine_stats st;
    engine_stats(e, &st);
    uint64_t per_block = st.mem_kv / (uint64_t)st.kv_blocks_total;
    engine_free(e);
    CHECK((e = new_engine(true, 512, 1, 28 * per_block, 0)));
    engine_stats(e, &st);
    CHECKF(st.kv_blocks_total == 28, "%lld blocks", (long long)st.kv_blocks_total);
    int32_t other[NP];
    for (int i = 0; i < NP; i++) other[i] = prompts[0][NP - 1 - i] + 1;
    collect c;
    CHECK(run1(e, prompts[0], NP, false, 1, 0, &c) == 0);
    CHECK(run1(e, other, NP, false, 1, 0, &c) == 0);
    engine_stats(e, &st);
    CHECKF(st.state_snap_dropped_total >= 1, "%llu dropped", (unsigned long long)st.state_snap_dropped_total);
    CHECK(run1(e, prompts[0], NP, false, 1, 0, &c) == 0);
    CHECKF(same(&c, &ref[0][0], 1), "prompt 0 after its blocks left: differs");
    CHECKF(c.stats[0].cached_tokens == 0, "%d cached", c.stats[0].cached_tokens);
    char err[LM_ERRLEN];
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    engine_free(e);
}

/* n = 2 from a restored snapshot (the fork copies the restored state after
 * the prompt), greedy and sampled. */
static void test_forks(void) {
    lm_engine *e = new_engine(true, 512, 4, 0, 0);
    CHECK(e);
    collect c;
    CHECK(run1(e, prompts[0], NP, false, 1, 0, &c) == 0);
    for (int s = 0; s < 2; s++) {
        CHECK(run1(e, prompts[0], NP, s, 2, 0, &c) == 0);
        CHECKF(same(&c, &ref2[s], 2), "%s, n = 2: differs", s ? "sampled" : "greedy");
        CHECK(c.stats[0].cached_tokens == last_point(NP) && c.stats[1].cached_tokens == last_point(NP));
    }
    char err[LM_ERRLEN];
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    engine_free(e);
}

/* Tenants: a salt of its own finds nothing of salt 0's, then its own. */
static void test_salts(void) {
    lm_engine *e = new_engine(true, 512, 4, 0, 0);
    CHECK(e);
    collect c;
    CHECK(run1(e, prompts[0], NP, false, 1, 0, &c) == 0);
    CHECK(run1(e, prompts[0], NP, false, 1, 99, &c) == 0);
    CHECKF(same(&c, &ref[0][0], 1) && c.stats[0].cached_tokens == 0, "salt 99 first: %d cached",
           c.stats[0].cached_tokens);
    CHECK(run1(e, prompts[0], NP, false, 1, 99, &c) == 0);
    CHECKF(same(&c, &ref[0][0], 1) && c.stats[0].cached_tokens == last_point(NP), "salt 99 again: %d cached",
           c.stats[0].cached_tokens);
    engine_free(e);
}

/* Every prompt at once in a pool of 45 blocks (a request needs 22 to be
 * admitted and 25 by its end: two at once outgrow it), greedy and one
 * sampled, twice: the first time prefilled (and preempted, restoring its
 * own snapshot when readmitted), the second time from the snapshots. */
static void test_pressure(void) {
    lm_engine *e = new_engine(true, 512, 4, 0, 0);
    CHECK(e);
    lm_engine_stats st;
    engine_stats(e, &st);
    uint64_t per_block = st.mem_kv / (uint64_t)st.kv_blocks_total;
    engine_free(e);
    CHECK((e = new_engine(true, 96, 4, 45 * per_block, 0)));
    char err[LM_ERRLEN];
    for (int round = 0; round < 2; round++) {
        static collect cs[4];
        for (int k = 0; k < 4; k++) {
            memset(&cs[k], 0, sizeof cs[k]);
            lm_request_params q = params(prompts[k], NP, k == 2, 1, 0, &cs[k]);
            CHECK(engine_submit(e, &q, NULL, err, sizeof err) == LM_OK);
        }
        engine_wait_idle(e);
        for (int k = 0; k < 4; k++)
            CHECKF(same(&cs[k], &ref[k][k == 2], 1), "round %d, prompt %d: differs from the cache-off run", round, k);
        CHECKF(engine_check(e, err, sizeof err) == 0, "round %d: %s", round, err);
    }
    engine_stats(e, &st);
    CHECKF(st.preemptions_total > 0, "no preemption");
    CHECKF(st.state_snap_restored_total > 0, "no snapshot restored");
    engine_free(e);
}

/* A request cancelled after its first tokens (its slot back, its prompt's
 * snapshots kept), beside one that shares its system prompt; then both
 * prompts again from the cache. */
static void test_cancel(void) {
    lm_engine *e = new_engine(true, 128, 4, 0, 0);
    CHECK(e);
    char err[LM_ERRLEN];
    collect long_c, c;
    memset(&long_c, 0, sizeof long_c);
    memset(&c, 0, sizeof c);
    lm_request_params q = params(prompts[1], NP, false, 1, 0, &long_c);
    q.max_tokens = 400;
    lm_request *r = NULL;
    CHECK(engine_submit(e, &q, &r, err, sizeof err) == LM_OK);
    lm_request_params q2 = params(prompts[0], NP, false, 1, 0, &c);
    CHECK(engine_submit(e, &q2, NULL, err, sizeof err) == LM_OK);
    while (long_c.n[0] < 2) usleep(1000);
    engine_cancel(e, r);
    engine_wait_idle(e);
    engine_request_release(e, r);
    CHECK(long_c.finish[0] == LM_FINISH_CANCELLED);
    CHECKF(same(&c, &ref[0][0], 1), "beside the cancelled request: differs");
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    for (int k = 0; k < 2; k++) {
        CHECK(run1(e, prompts[k], NP, false, 1, 0, &c) == 0);
        CHECKF(same(&c, &ref[k][0], 1) && c.stats[0].cached_tokens == last_point(NP), "prompt %d: %d cached", k,
               c.stats[0].cached_tokens);
    }
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    engine_free(e);
}

/* The memory plan: the snapshot slots are in mem_state, by default one per
 * max_seqs, none without the prefix cache or with state_snapshots < 0, a
 * quarter of a budget's rest at most. */
static void test_mem_plan(void) {
    lm_engine_config ec;
    engine_config_default(&ec);
    ec.n_threads = 2;
    ec.n_ctx = 1024;
    ec.max_seqs = 4;
    engine_mem m0, m1, m2, m3;
    char err[LM_ERRLEN];
    CHECKF(engine_mem_plan(model, &ec, &m0, err, sizeof err) == 0, "%s", err);
    uint64_t slot = m0.state / 8;
    CHECK(m0.rcfg.n_seqs == 4 && m0.rcfg.n_snap == 4 && m0.state_snap == 4 * slot && m0.state == 8 * slot);
    ec.state_snapshots = -1;
    CHECK(engine_mem_plan(model, &ec, &m1, err, sizeof err) == 0);
    CHECK(m1.rcfg.n_snap == 0 && m1.state == 4 * slot && m1.state_snap == 0);
    ec.state_snapshots = 0;
    ec.prefix_cache = false;
    CHECK(engine_mem_plan(model, &ec, &m1, err, sizeof err) == 0 && m1.rcfg.n_snap == 0);
    ec.prefix_cache = true;
    ec.state_snapshots = 10;
    CHECK(engine_mem_plan(model, &ec, &m2, err, sizeof err) == 0 && m2.rcfg.n_snap == 10 && m2.state == 14 * slot);
    /* a budget that leaves 8 slots' bytes beyond one sequence's KV: two snapshots (a quarter) */
    ec.state_snapshots = 0;
    uint64_t fixed = m1.weights + m1.packed + m1.workspace + m1.state;
    uint64_t one = (uint64_t)(1024 / BLOCK) * (m1.plan.block_bytes);
    ec.mem = fixed + one + 7 * slot;
    CHECKF(engine_mem_plan(model, &ec, &m3, err, sizeof err) == 0, "%s", err);
    uint64_t rest = ec.mem - fixed;
    CHECKF((uint64_t)m3.rcfg.n_snap == rest / 4 / slot && m3.rcfg.n_snap < 4, "%d snapshots", m3.rcfg.n_snap);
    CHECK(m3.state == (uint64_t)(4 + m3.rcfg.n_snap) * slot);
    CHECK(m3.weights + m3.packed + m3.workspace + m3.state + m3.kv <= ec.mem);
    /* an engine reports the same */
    lm_engine *e = new_engine(true, 512, 4, 0, 0);
    CHECK(e);
    lm_engine_stats st;
    engine_stats(e, &st);
    CHECKF(st.mem_state == m0.state && st.mem_state_snap == m0.state_snap && st.state_snap_slots == 4,
           "engine: state %llu, snapshots %llu", (unsigned long long)st.mem_state,
           (unsigned long long)st.mem_state_snap);
    engine_free(e);
}

/* Speculation (prompt lookup) beside the prefix cache: the state a
 * verification pass rewrote goes back to the last accepted token by
 * checkpoints (engine_state.c). Greedy requests under a grammar that allows
 * only a repeating text (so the random model's output repeats and prompt
 * lookup's guesses are accepted, and rejected where it picks other tokens
 * that spell it) give the tokens and log-probabilities of the same engine
 * without speculation, alone and four at once (4 x 5 checkpoints wanted,
 * 10 held: wishes are cut); tokens were accepted, states rolled back, and
 * engine_check (no checkpoint held between iterations) holds. */
static void test_speculation(void) {
    static collect plain[4], spec[4];
    lm_spec_config sc;
    engine_spec_default(&sc);
    sc.max = 4;
    lm_engine *e0 = new_engine(true, 512, 4, 0, 0), *e1 = NULL;
    lm_engine_config ec;
    engine_config_default(&ec);
    ec.n_threads = 2, ec.n_ctx = 1024, ec.batch_tokens = 512, ec.max_seqs = 4, ec.kv_type = LM_TYPE_F32;
    ec.block_size = BLOCK, ec.spec = &sc;
    lm_status st;
    char err[LM_ERRLEN];
    e1 = engine_new_tuned(model, model->tok, &ec, &(engine_tuning){.spec_widths = "1:1,64:1"}, &st, err, sizeof err);
    CHECKF(e0 && e1, "engine_new: %s", err);
    if (!e0 || !e1) goto out;
    lm_engine_stats s1;
    engine_stats(e1, &s1);
    lm_engine_stats s0;
    engine_stats(e0, &s0);
    CHECKF(s1.mem_state - s1.mem_state_snap == (s0.mem_state - s0.mem_state_snap) * 14 / 4,
           "state %llu, %llu without speculation: 4 live slots and 10 checkpoints",
           (unsigned long long)(s1.mem_state - s1.mem_state_snap),
           (unsigned long long)(s0.mem_state - s0.mem_state_snap));
    for (int round = 0; round < 2; round++) { /* alone, then four at once */
        for (int pass = 0; pass < 2; pass++) {
            lm_engine *e = pass ? e1 : e0;
            collect *out = pass ? spec : plain;
            for (int k = 0; k < 4; k++) {
                memset(&out[k], 0, sizeof out[k]);
                lm_request_params q = params(prompts[k], NP, false, 1, 0, &out[k]);
                q.grammar = "root ::= (\"ab\")+";
                CHECK(engine_submit(e, &q, NULL, err, sizeof err) == LM_OK);
                if (round == 0) engine_wait_idle(e);
            }
            engine_wait_idle(e);
        }
        for (int k = 0; k < 4; k++)
            CHECKF(same(&plain[k], &spec[k], 1) && spec[k].n[0] == N_GEN, "round %d, prompt %d", round, k);
    }
    engine_stats(e1, &s1);
    CHECKF(s1.spec_accepted_total > 0 && s1.spec_rollbacks_total > 0 && s1.spec_ckpt_short_total > 0,
           "accepted %llu, rollbacks %llu, cut %llu", (unsigned long long)s1.spec_accepted_total,
           (unsigned long long)s1.spec_rollbacks_total, (unsigned long long)s1.spec_ckpt_short_total);
    CHECKF(engine_check(e1, err, sizeof err) == 0, "%s", err);
out:
    engine_free(e0);
    engine_free(e1);
}

static int make_model(void) {
    const char *bin = getenv("LAMINA_BIN") ? getenv("LAMINA_BIN") : "build/lamina";
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    close(fd);
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "%s mkmodel --preset qwen35-small --type F32 --vocab-from tests/data/vocab/ggml-vocab-gpt-2.gguf "
             "-o %s >/dev/null 2>&1",
             bin, path);
    if (system(cmd) != 0) return -1;
    char err[LM_ERRLEN];
    model = model_load(path, err, sizeof err);
    if (!model) fprintf(stderr, "model_load: %s\n", err);
    return model ? 0 : -1;
}

/* engine_state_trim's rules on a choice of its own (cache off: no snapshot
 * points), the engine's state store behind it. */
static void test_trim(void) {
    lm_engine *e = new_engine(false, 512, 4, 0, 0);
    CHECK(e);
    eseq c;
    memset(&c, 0, sizeof c);
    c.n_prompt = c.n_tokens = 200;
    /* a batch's last token, or any chunk short of the grid, waits beside other segments */
    CHECK(engine_state_trim(e, &c, 1, true) == 0);
    CHECK(engine_state_trim(e, &c, 63, true) == 0);
    /* cut back to the grid; the prompt's end */
    CHECK(engine_state_trim(e, &c, 100, true) == 64);
    CHECK(engine_state_trim(e, &c, 200, true) == 200);
    c.n_computed = 64;
    CHECK(engine_state_trim(e, &c, 1, true) == 0);
    CHECK(engine_state_trim(e, &c, 136, true) == 136);
    /* alone in the batch it runs as planned (progress), and after STATE_MAX_DEFER waits in a row */
    CHECK(engine_state_trim(e, &c, 1, false) == 1);
    for (int i = 0; i < STATE_MAX_DEFER; i++) CHECKF(engine_state_trim(e, &c, 1, true) == 0, "wait %d", i);
    CHECK(engine_state_trim(e, &c, 1, true) == 1);
    /* the prompt's last token; positions past the prompt one at a time */
    c.n_computed = 199;
    CHECK(engine_state_trim(e, &c, 1, true) == 1);
    c.n_computed = 200, c.n_tokens = 210;
    CHECK(engine_state_trim(e, &c, 5, true) == 1);
    engine_free(e);
}

/* A batch under GDN_CHUNK tokens is raised to it (engine_resolve_config):
 * with 16 a prompt alone would run in 16-token pieces off the delta rule's
 * grid and give other bits. Greedy and sampled, the reference's bits. */
static void test_small_batch(void) {
    lm_engine *e = new_engine(false, 16, 4, 0, 0);
    CHECK(e);
    for (int s = 0; s < 2; s++) {
        collect c;
        CHECK(run1(e, prompts[0], NP, s, 1, 0, &c) == 0);
        CHECKF(same(&c, &ref[0][s], 1), "batch 16, %s: differs from batch 512", s ? "sampled" : "greedy");
    }
    engine_free(e);
}

/* The engine thread held in a request's first token while two prompts are
 * submitted, so that one plan sees them both. */
static atomic_int held, release;

static void on_event_hold(void *user, const lm_event *ev) {
    collect *c = user;
    if (ev->token >= 0 && c->n[0] == 0) {
        atomic_store(&held, 1);
        while (!atomic_load(&release)) usleep(1000);
    }
    on_event(user, ev);
}

/* Batch of 2 + NP tokens: a running decode (1), prompt 0 whole (NP) and
 * prompt 1 planned one token. That token run alone would split prompt 1 off
 * the grid; it waits, and both prompts give the reference's bits. */
static void test_last_token(void) {
    lm_engine *e = new_engine(false, 2 + NP, 4, 0, 0);
    CHECK(e);
    static collect x, a, b;
    memset(&x, 0, sizeof x), memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
    atomic_store(&held, 0), atomic_store(&release, 0);
    char err[LM_ERRLEN];
    lm_request_params q = params(prompts[2] + SYS, 10, false, 1, 0, &x);
    q.on_event = on_event_hold;
    CHECK(engine_submit(e, &q, NULL, err, sizeof err) == LM_OK);
    for (int ms = 0; ms < 120000 && !atomic_load(&held) && !atomic_load(&x.n_done); ms++) usleep(1000);
    bool was_held = atomic_load(&held);
    q = params(prompts[0], NP, false, 1, 0, &a);
    lm_status sa = engine_submit(e, &q, NULL, err, sizeof err);
    q = params(prompts[1], NP, false, 1, 0, &b);
    lm_status sb = engine_submit(e, &q, NULL, err, sizeof err);
    atomic_store(&release, 1); /* whatever happened: the engine thread goes on */
    engine_wait_idle(e);
    CHECKF(was_held && sa == LM_OK && sb == LM_OK, "held %d, submitted %d %d", was_held, sa, sb);
    CHECKF(same(&a, &ref[0][0], 1), "prompt 0 beside a decode: differs from alone");
    CHECKF(same(&b, &ref[1][0], 1), "prompt 1, left one token of the batch: differs from alone");
    CHECK(x.n[0] == N_GEN && x.finish[0] == LM_FINISH_LENGTH);
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    engine_free(e);
}

int main(void) {
    kernels_init();
    if (make_model() != 0) {
        fprintf(stderr, "cannot make the qwen35-small model (build/lamina mkmodel)\n");
        unlink(path);
        return 1;
    }
    make_prompts();
    TEST_RUN(test_references);
    TEST_RUN(test_shared_prompt);
    TEST_RUN(test_chunk_ends);
    TEST_RUN(test_hit_without_snapshot);
    TEST_RUN(test_eviction_drops);
    TEST_RUN(test_forks);
    TEST_RUN(test_salts);
    TEST_RUN(test_pressure);
    TEST_RUN(test_cancel);
    TEST_RUN(test_mem_plan);
    TEST_RUN(test_speculation);
    TEST_RUN(test_trim);
    TEST_RUN(test_last_token);
    TEST_RUN(test_small_batch);
    model_free(model);
    unlink(path);
    return TEST_DONE();
}
