/*
 * test_mem.c - the memory budget (lm_engine_config.mem, engine_mem_plan):
 *   - the workspace computed before any pool (fwd_workspace_bytes) is what
 *     fwd_new allocates (its ws_bytes), for several batches and thread
 *     counts, on stories260K and on a sliding-window model;
 *   - a budget's parts add up: weights + packed + workspace + KV <= budget,
 *     and what is left is less than one block of each class; the pool's
 *     blocks are counted from the engine (kv_blocks_total) and equal
 *     floor(rest / block bytes) on a one-class model;
 *   - the workspace engine_new measures equals the plan's;
 *   - a budget one byte short of one full-context sequence is refused
 *     (LM_ERR_INVALID, a message naming the parts); exactly enough runs with
 *     one sequence and serves a request;
 *   - mem_cap bounds the default pool without growing it; kv_mem without
 *     mem keeps its old meaning;
 *   - a draft model (LM_SPEC_DRAFT) is counted: its weights, workspace and
 *     KV pool are in the plan and in the engine's statistics (measured =
 *     planned), every part adds up within the budget (less than a block of
 *     each class of each pool left), the two pools share the rest so that
 *     they hold about the same positions, a budget one byte short of one
 *     sequence in each pool is refused naming the draft's parts, exactly
 *     enough serves a request with the draft proposing; without a budget
 *     the draft's pool is its default (max_seqs sequences, at most 2 GiB);
 *   - the plan alone, with no engine and no thread (engine_mem_plan on its
 *     own): each part equals what it is made of (the weights, the forward
 *     pass's workspace and the engine's buffers, the embeddings' rows of a
 *     pass among them, the KV pool's plan), they
 *     add up within the budget, a budget one byte short of one sequence is
 *     an error naming the weights, the workspace, the KV cache and what
 *     one sequence needs (the draft's parts with a draft model), exactly
 *     enough plans one sequence, and the same plan comes back every call.
 */
#include <string.h>

#include "sched/draft.h"
#include "sched/engine.h"
#include "model/forward.h"
#include "model/model.h"
#include "kv/kv.h"
#include "base/pool.h"
#include "swa_model.h"
#include "test.h"
#include "base/util.h"

#define MODEL_PATH "models/stories260K.gguf"

static lm_model *model, *swa;

static void test_workspace_measured(void) {
    const lm_model *ms[2] = {model, swa};
    int batches[3] = {1, 16, 128}, threads[2] = {1, 3};
    char err[LM_ERRLEN];
    for (int mi = 0; mi < 2; mi++)
        for (int bi = 0; bi < 3; bi++)
            for (int ti = 0; ti < 2; ti++) {
                const lm_model *m = ms[mi];
                lm_pool *pool = pool_new(threads[ti]);
                fwd_dims d = fwd_dims_make(m, 128, batches[bi]);
                kv_config kc;
                fwd_kv_config(m, &d, &kc);
                kc.n_ctx = d.n_ctx;
                kc.n_seqs = 1;
                kv_pool *kv = kv_pool_new(&kc, err, sizeof err);
                CHECKF(kv, "%s", err);
                lm_fwd *f = fwd_new(m, pool, kv, &d, err, sizeof err);
                CHECKF(f, "%s", err);
                size_t want = fwd_workspace_bytes(m, &d, threads[ti]);
                CHECKF(f->ws_bytes == want, "model %d batch %d threads %d: allocated %zu, computed %zu", mi,
                       batches[bi], threads[ti], f->ws_bytes, want);
                CHECK(want > (size_t)d.n_batch * (size_t)m->hp.n_embd * sizeof(float));
                fwd_free(f);
                kv_pool_free(kv);
                pool_free(pool);
            }
}

static void base_config(lm_engine_config *c) {
    engine_config_default(c);
    c->n_threads = 2;
    c->max_seqs = 4;
    c->n_ctx = 128;
}

/* the split of a budget, checked against the plan and the running engine */
static void check_split(const lm_model *m, uint64_t budget) {
    lm_engine_config c;
    base_config(&c);
    c.mem = budget;
    engine_mem sp;
    char err[LM_ERRLEN];
    CHECKF(engine_mem_plan(m, &c, &sp, err, sizeof err) == 0, "%s", err);
    CHECK(sp.budget == budget && sp.weights == m->weight_bytes && sp.packed == m->packed_bytes);
    uint64_t used = sp.weights + sp.packed + sp.workspace + sp.kv;
    uint64_t slack = sp.plan.cls[KV_GLOBAL].block_bytes + sp.plan.cls[KV_LOCAL].block_bytes;
    CHECKF(used <= budget && budget - used < slack, "budget %llu used %llu slack %llu", (unsigned long long)budget,
           (unsigned long long)used, (unsigned long long)slack);
    lm_engine *e = engine_new(m, NULL, &c, err, sizeof err);
    CHECKF(e, "%s", err);
    lm_engine_stats st;
    engine_stats(e, &st);
    CHECK(st.mem_budget == budget && st.mem_weights == sp.weights && st.mem_packed == sp.packed);
    CHECKF(st.mem_workspace == sp.workspace, "measured %llu, planned %llu", (unsigned long long)st.mem_workspace,
           (unsigned long long)sp.workspace);
    CHECK(st.mem_kv == sp.kv && st.kv_max_tokens == sp.kv_tokens && st.kv_max_seqs == sp.kv_seqs);
    /* the pool really is that size: its blocks, counted by the engine */
    CHECK(st.kv_blocks_total == sp.plan.cls[KV_GLOBAL].n_blocks);
    CHECK(st.kv_local_blocks_total == sp.plan.cls[KV_LOCAL].n_blocks);
    if (!sp.plan.window) {
        uint64_t rest = budget - sp.weights - sp.packed - sp.workspace;
        CHECK(st.kv_blocks_total == (int64_t)(rest / sp.plan.block_bytes));
        CHECK(st.kv_max_seqs == st.kv_blocks_total / (128 / 16));
    }
    engine_free(e);
}

static void test_split_adds_up(void) {
    check_split(model, 8u << 20);
    check_split(model, 3u << 20);
    check_split(swa, 12u << 20);
}

static void on_event(void *user, const lm_event *ev) { (void)user, (void)ev; }

/* the smallest budget: weights + workspace + one sequence; one byte less is refused */
static void test_too_small(void) {
    lm_engine_config c;
    base_config(&c);
    c.mem = 1ull << 40;
    engine_mem sp;
    char err[LM_ERRLEN];
    CHECK(engine_mem_plan(model, &c, &sp, err, sizeof err) == 0);
    kv_config one = sp.kc;
    one.mem_bytes = 0;
    one.n_seqs = 1;
    kv_plan p1;
    CHECK(kv_plan_make(&one, &p1, err, sizeof err) == KV_OK);
    uint64_t least = sp.weights + sp.packed + sp.workspace + p1.data_bytes;
    c.mem = least - 1;
    lm_status status;
    lm_engine *e = engine_new_status(model, NULL, &c, &status, err, sizeof err);
    CHECK(!e && status == LM_ERR_INVALID);
    CHECKF(strstr(err, "too small") && strstr(err, "weights") && strstr(err, "workspace") &&
               strstr(err, "one sequence of 128 positions"),
           "%s", err);
    c.mem = 1000; /* below the weights alone */
    CHECK(!engine_new_status(model, NULL, &c, &status, err, sizeof err) && status == LM_ERR_INVALID);
    c.mem = least;
    e = engine_new_status(model, NULL, &c, &status, err, sizeof err);
    CHECKF(e && status == LM_OK, "%s", err);
    lm_engine_stats st;
    engine_stats(e, &st);
    CHECK(st.kv_max_seqs == 1 && st.kv_max_tokens == 128);
    /* and it serves a request of the whole context */
    lm_request_params rp;
    engine_request_params_default(&rp);
    int32_t prompt[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    rp.prompt = prompt;
    rp.n_prompt = 8;
    rp.max_tokens = 120;
    rp.ignore_eos = true;
    rp.on_event = on_event;
    CHECKF(engine_submit(e, &rp, NULL, err, sizeof err) == LM_OK, "%s", err);
    engine_wait_idle(e);
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    engine_stats(e, &st);
    CHECK(st.generation_tokens_total == 120);
    engine_free(e);
}

/* mem_cap: a large budget gives the pool kv_mem 0 gives; a small one shrinks it */
static void test_cap_and_old_rule(void) {
    lm_engine_config c;
    base_config(&c);
    engine_mem plain, capped, kvmem;
    char err[LM_ERRLEN];
    CHECK(engine_mem_plan(model, &c, &plain, err, sizeof err) == 0);
    CHECK(plain.budget == 0 && plain.kv_seqs == 4);
    c.mem = 1ull << 34;
    c.mem_cap = true;
    CHECK(engine_mem_plan(model, &c, &capped, err, sizeof err) == 0);
    CHECK(capped.kv == plain.kv && capped.plan.n_blocks == plain.plan.n_blocks);
    c.mem = capped.weights + capped.packed + capped.workspace + 2 * plain.kv / 4; /* two of the four sequences */
    CHECK(engine_mem_plan(model, &c, &capped, err, sizeof err) == 0);
    CHECK(capped.kv_seqs == 2);
    c.mem = 0;
    c.kv_mem = 1u << 20;
    CHECK(engine_mem_plan(model, &c, &kvmem, err, sizeof err) == 0);
    CHECK(kvmem.kv <= (1u << 20) && (1u << 20) - kvmem.kv < kvmem.plan.block_bytes);
    lm_engine *e = engine_new(model, NULL, &c, err, sizeof err);
    CHECKF(e, "%s", err);
    lm_engine_stats st;
    engine_stats(e, &st);
    CHECK(st.mem_budget == 0 && st.kv_blocks_total == kvmem.plan.n_blocks && st.mem_kv == kvmem.kv);
    engine_free(e);
}

/* the draft's parts of a budget; dm: the draft (the model itself: the same vocabulary) */
static void check_draft_split(const lm_model *m, uint64_t budget) {
    lm_engine_config c;
    base_config(&c);
    c.mem = budget;
    lm_spec_config sc;
    lm_spec_config_default(&sc);
    sc.proposer = LM_SPEC_DRAFT;
    sc.draft_model = m;
    c.spec = &sc;
    engine_mem sp, alone;
    char err[LM_ERRLEN];
    CHECKF(engine_mem_plan(m, &c, &sp, err, sizeof err) == 0, "%s", err);
    CHECK(sp.draft_weights == m->weight_bytes + m->packed_bytes && sp.draft_workspace > 0 && sp.draft_kv > 0);
    uint64_t used = sp.weights + sp.packed + sp.workspace + sp.kv + sp.draft_weights + sp.draft_workspace + sp.draft_kv;
    kv_plan dp;
    CHECK(kv_plan_make(&sp.dkc, &dp, err, sizeof err) == KV_OK);
    uint64_t slack = sp.plan.cls[KV_GLOBAL].block_bytes + sp.plan.cls[KV_LOCAL].block_bytes +
        dp.cls[KV_GLOBAL].block_bytes + dp.cls[KV_LOCAL].block_bytes;
    CHECKF(used <= budget && budget - used < slack, "budget %llu used %llu slack %llu", (unsigned long long)budget,
           (unsigned long long)used, (unsigned long long)slack);
    /* the same model as its own draft, both pools F16: the rest is halved,
     * the draft's half at most its full pool (max_seqs sequences) */
    int64_t full = (int64_t)c.max_seqs * 128;
    if (!sp.plan.window)
        CHECKF(sp.draft_kv_tokens <= full && sp.draft_kv_tokens <= sp.kv_tokens &&
                   sp.draft_kv_tokens >= (sp.kv_tokens - 16 < full ? sp.kv_tokens - 16 : full),
               "draft %lld tokens, model %lld", (long long)sp.draft_kv_tokens, (long long)sp.kv_tokens);
    /* without the draft the model's pool would have had it all */
    c.spec = NULL;
    CHECK(engine_mem_plan(m, &c, &alone, err, sizeof err) == 0);
    CHECK(alone.draft_weights == 0 && alone.draft_kv == 0 && alone.kv > sp.kv);
    c.spec = &sc;
    lm_engine *e = engine_new(m, NULL, &c, err, sizeof err);
    CHECKF(e, "%s", err);
    lm_engine_stats st;
    engine_stats(e, &st);
    CHECK(st.mem_draft_weights == sp.draft_weights && st.mem_draft_kv == sp.draft_kv);
    CHECKF(st.mem_draft_workspace == sp.draft_workspace, "measured %llu, planned %llu",
           (unsigned long long)st.mem_draft_workspace, (unsigned long long)sp.draft_workspace);
    CHECK(st.mem_kv == sp.kv && st.mem_workspace == sp.workspace);
    engine_free(e);
}

static void on_token(void *user, const lm_event *ev) {
    if (ev->done) *(lm_request_stats *)user = *ev->stats;
}

static void test_draft_counted(void) {
    check_draft_split(model, 8u << 20);
    check_draft_split(model, 5u << 20);
    check_draft_split(swa, 16u << 20);
    /* the least budget: both models' weights and workspaces, one sequence in each pool */
    lm_engine_config c;
    base_config(&c);
    c.mem = 1ull << 40;
    lm_spec_config sc;
    lm_spec_config_default(&sc);
    sc.proposer = LM_SPEC_DRAFT;
    sc.draft_model = model;
    sc.cost = -1; /* the model as its own draft proposes only without the cost model */
    c.spec = &sc;
    engine_mem sp;
    char err[LM_ERRLEN];
    CHECK(engine_mem_plan(model, &c, &sp, err, sizeof err) == 0);
    kv_config one = sp.kc, done = sp.dkc;
    one.mem_bytes = done.mem_bytes = 0;
    one.n_seqs = done.n_seqs = 1;
    kv_plan p1, d1;
    CHECK(kv_plan_make(&one, &p1, err, sizeof err) == KV_OK && kv_plan_make(&done, &d1, err, sizeof err) == KV_OK);
    uint64_t least =
        sp.weights + sp.packed + sp.workspace + sp.draft_weights + sp.draft_workspace + p1.data_bytes + d1.data_bytes;
    check_draft_split(model, least + 4 * p1.data_bytes); /* three sequences in each pool */
    c.mem = least + 4 * p1.data_bytes;
    CHECK(engine_mem_plan(model, &c, &sp, err, sizeof err) == 0 && sp.kv_seqs == 3 && sp.draft_kv_tokens == 3 * 128);
    c.mem = least - 1;
    lm_status status;
    CHECK(!engine_new_status(model, NULL, &c, &status, err, sizeof err) && status == LM_ERR_INVALID);
    CHECKF(strstr(err, "too small") && strstr(err, "draft model's weights") && strstr(err, "in the draft's"), "%s",
           err);
    fprintf(stderr, "  refused: %s\n", err);
    c.mem = least;
    lm_engine *e = engine_new_status(model, NULL, &c, &status, err, sizeof err);
    CHECKF(e && status == LM_OK, "%s", err);
    lm_engine_stats st;
    engine_stats(e, &st);
    CHECK(st.kv_max_seqs == 1 && st.mem_draft_kv == d1.data_bytes);
    lm_request_params rp;
    engine_request_params_default(&rp);
    int32_t prompt[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    lm_request_stats rs = {0};
    rp.prompt = prompt;
    rp.n_prompt = 8;
    rp.max_tokens = 100;
    rp.ignore_eos = true;
    rp.sp.temp = 0;
    rp.on_event = on_token;
    rp.user = &rs;
    CHECKF(engine_submit(e, &rp, NULL, err, sizeof err) == LM_OK, "%s", err);
    engine_wait_idle(e);
    CHECKF(engine_check(e, err, sizeof err) == 0, "%s", err);
    CHECKF(rs.spec_accepted > 10, "%d accepted", rs.spec_accepted);
    engine_free(e);
    /* no budget: the draft's default pool, all its sequences */
    c.mem = 0;
    CHECK(engine_mem_plan(model, &c, &sp, err, sizeof err) == 0);
    CHECK(sp.budget == 0 && sp.draft_kv == (uint64_t)c.max_seqs * d1.data_bytes);
}

/* the plan on its own: no engine is made, so no thread starts */
static void test_plan_alone(void) {
    lm_engine_config c;
    base_config(&c);
    c.mem = 8u << 20;
    engine_mem sp, again;
    char err[LM_ERRLEN];
    CHECKF(engine_mem_plan(model, &c, &sp, err, sizeof err) == 0, "%s", err);
    /* each part from what it is made of */
    fwd_dims d = fwd_dims_make(model, c.n_ctx, c.batch_tokens);
    uint64_t V = (uint64_t)model->hp.n_vocab;
    uint64_t buffers = ((uint64_t)c.max_seqs + 2 + 1) * V * sizeof(float) + (uint64_t)d.n_batch * sizeof(int32_t);
    buffers += (uint64_t)d.n_batch * (uint64_t)model->hp.n_embd * sizeof(float); /* embeddings' rows */
    uint64_t ws = fwd_workspace_bytes(model, &d, c.n_threads) + buffers;
    CHECK(sp.budget == c.mem && sp.n_ctx == 128 && d.n_ctx == 128);
    CHECK(sp.weights == model->weight_bytes && sp.packed == model->packed_bytes);
    CHECKF(sp.workspace == ws, "planned %llu, made of %llu", (unsigned long long)sp.workspace, (unsigned long long)ws);
    kv_plan kp;
    CHECK(kv_plan_make(&sp.kc, &kp, err, sizeof err) == KV_OK);
    CHECK(sp.kv == kp.data_bytes && sp.kv == sp.plan.data_bytes && sp.kv_tokens == kp.n_tokens);
    CHECK(sp.draft_weights == 0 && sp.draft_workspace == 0 && sp.draft_kv == 0 && sp.draft_kv_tokens == 0);
    /* they add up: the pool takes every whole block of the rest */
    uint64_t rest = c.mem - sp.weights - sp.packed - sp.workspace;
    CHECK(!sp.plan.window && sp.kv <= rest && rest - sp.kv < sp.plan.block_bytes);
    CHECK(sp.plan.n_blocks == (int64_t)(rest / sp.plan.block_bytes) && sp.kv_tokens == sp.plan.n_blocks * 16);
    CHECK(sp.kv_seqs == sp.plan.n_blocks / (128 / 16) && sp.kv_seqs > c.max_seqs);
    /* a pure function: the same plan again */
    CHECK(engine_mem_plan(model, &c, &again, err, sizeof err) == 0);
    CHECK(again.workspace == sp.workspace && again.kv == sp.kv && again.kv_seqs == sp.kv_seqs &&
          again.plan.n_blocks == sp.plan.n_blocks);

    /* one byte short of one sequence: an error naming every part */
    kv_config one = sp.kc;
    one.mem_bytes = 0;
    one.n_seqs = 1;
    kv_plan p1;
    CHECK(kv_plan_make(&one, &p1, err, sizeof err) == KV_OK && p1.data_bytes == 128 / 16 * sp.plan.block_bytes);
    uint64_t least = sp.weights + sp.packed + sp.workspace + p1.data_bytes;
    c.mem = least - 1;
    err[0] = 0;
    CHECK(engine_mem_plan(model, &c, &sp, err, sizeof err) == -1);
    CHECKF(strstr(err, "too small") && strstr(err, "weights") && strstr(err, "workspace") &&
               strstr(err, "for the KV cache") && strstr(err, "one sequence of 128 positions needs 80.0 KiB"),
           "%s", err);
    c.mem = least;
    CHECKF(engine_mem_plan(model, &c, &sp, err, sizeof err) == 0, "%s", err);
    CHECK(sp.kv_seqs == 1 && sp.kv_tokens == 128 && sp.kv == p1.data_bytes);
    c.mem = 1000; /* below the weights alone */
    CHECK(engine_mem_plan(model, &c, &sp, err, sizeof err) == -1 && strstr(err, "too small"));

    /* with a draft model (the model itself): its parts too */
    c.mem = 8u << 20;
    lm_spec_config sc;
    lm_spec_config_default(&sc);
    sc.proposer = LM_SPEC_DRAFT;
    sc.draft_model = model;
    c.spec = &sc;
    CHECKF(engine_mem_plan(model, &c, &sp, err, sizeof err) == 0, "%s", err);
    CHECK(sp.draft_weights == model->weight_bytes + model->packed_bytes && sp.draft_workspace > 0);
    kv_plan dp;
    CHECK(kv_plan_make(&sp.dkc, &dp, err, sizeof err) == KV_OK && sp.draft_kv == dp.data_bytes);
    uint64_t used = sp.weights + sp.packed + sp.workspace + sp.kv + sp.draft_weights + sp.draft_workspace + sp.draft_kv;
    CHECK(used <= c.mem && c.mem - used < sp.plan.block_bytes + dp.block_bytes);
    kv_config done = sp.dkc;
    done.mem_bytes = 0;
    done.n_seqs = 1;
    kv_plan d1;
    CHECK(kv_plan_make(&done, &d1, err, sizeof err) == KV_OK);
    least =
        sp.weights + sp.packed + sp.workspace + sp.draft_weights + sp.draft_workspace + p1.data_bytes + d1.data_bytes;
    c.mem = least - 1;
    CHECK(engine_mem_plan(model, &c, &sp, err, sizeof err) == -1);
    CHECKF(strstr(err, "too small") && strstr(err, "the draft model's weights") && strstr(err, "in the model's") &&
               strstr(err, "in the draft's"),
           "%s", err);
    c.mem = least;
    CHECKF(engine_mem_plan(model, &c, &sp, err, sizeof err) == 0, "%s", err);
    CHECK(sp.kv_seqs == 1 && sp.draft_kv == d1.data_bytes);
}

int main(void) {
    char err[LM_ERRLEN];
    model = model_load(MODEL_PATH, err, sizeof err);
    swa = model ? swa_model_load(MODEL_PATH, 8, 3, 256, err, sizeof err) : NULL;
    if (!model || !swa) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    TEST_RUN(test_workspace_measured);
    TEST_RUN(test_split_adds_up);
    TEST_RUN(test_too_small);
    TEST_RUN(test_cap_and_old_rule);
    TEST_RUN(test_draft_counted);
    TEST_RUN(test_plan_alone);
    model_free(swa);
    model_free(model);
    return TEST_DONE();
}
