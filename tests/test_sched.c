/*
 * test_sched.c - the scheduling policy (sched.h) alone: no model, no KV
 * pool. A fake pool stands in for the engine: a sequence of len positions
 * holds ceil(len / B) global blocks (and, with a window, at most L local
 * ones), nothing is shared and nothing cached, so what a preemption frees is
 * what the sequence holds and an admission takes the blocks of its whole
 * prompt plus one position. Each test states its plan's expected contents:
 *   - priorities: admission order is priority (lower first), then arrival;
 *   - the watermark: kept free when admitting beside running sequences, not
 *     when nothing runs; a head no empty pool can hold is rejected;
 *   - preemption order: the worst priority, latest arrival among equals,
 *     never a sequence already in the batch, and the asker itself when it
 *     is the worst;
 *   - forks sharing a partial last block: only the appends while others
 *     still hold it take a copy;
 *   - the chunk budget: decodes first, then prefill chunks, then
 *     admissions, until batch_tokens is spent;
 *   - starvation: a long prompt never keeps running decodes out of a batch,
 *     and a waiting head is admitted once blocks free up, before later
 *     arrivals;
 *   - static batching: a batch forms only when nothing runs, none joins it;
 *   - the sliding-window local class: admission needs local blocks too,
 *     without a watermark;
 *   - the question protocol: a plan stops to ask and goes on once answered;
 *   - inputs that must run whole (sched_seq.whole): admitted with all of
 *     their prompt or not at all, and one reached without room is admitted
 *     in the next plan amid a stream of better-priority ones;
 *   - the latency bound (sched_view.cap): a chunk's cost against a sum in
 *     double over its tokens' positions, the fit against a search of every
 *     length; beside decodes a prefill chunk and an admission's first chunk
 *     are cut to the tokens the budget buys (never below the floor), without
 *     decodes a prompt takes the whole batch_tokens, and a long prompt
 *     still finishes;
 *   - the pass-time predictor (itl.h): its running means and the bound it
 *     gives, against the same arithmetic written out in double.
 */
#include <math.h>
#include <string.h>

#include "sched/itl.h"
#include "sched/sched.h"
#include "test.h"
#include "base/util.h"

enum { B = 4, MAXS = 64 };

typedef struct {
    sched_seq sq; /* first: a sched_seq * is the fake sequence */
    int id;
    int n_tokens;   /* prompt + generated */
    int n_computed; /* positions in the fake KV */
    int n_gen, max_gen;
    bool done;
    int admitted_at; /* iteration of its first admission, -1 before */
} fseq;

typedef struct {
    sched *s;
    int n_class;
    int local_cap; /* L: most local blocks one sequence holds */
    int64_t total[KV_N_CLASS];
    int64_t used[KV_N_CLASS];
    int iter;
    int n_asks;
    sched_cap cap; /* the plans' latency bound (off: zeroed) */
} fake;

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int64_t held(const fake *f, const fseq *q, int k) {
    int64_t g = cdiv(q->n_computed, B);
    return k == KV_GLOBAL ? g : (g < f->local_cap ? g : f->local_cap);
}

static bool fake_init(fake *f, int batch_tokens, int max_seqs, int64_t blocks, int64_t wm, bool stat, int64_t local,
                      int local_cap) {
    memset(f, 0, sizeof *f);
    f->n_class = local ? 2 : 1;
    f->local_cap = local_cap;
    f->total[KV_GLOBAL] = blocks;
    f->total[KV_LOCAL] = local;
    sched_config c = {.batch_tokens = batch_tokens,
                      .max_seqs = max_seqs,
                      .block_size = B,
                      .n_class = f->n_class,
                      .wm_blocks = wm,
                      .static_batching = stat};
    f->s = sched_new(&c);
    return f->s != NULL;
}

static void seq_init(fseq *q, int id, int priority, uint64_t arrival, int prompt, int max_gen) {
    memset(q, 0, sizeof *q);
    q->id = id;
    q->sq.priority = priority;
    q->sq.arrival = arrival;
    q->n_tokens = prompt;
    q->max_gen = max_gen;
    q->admitted_at = -1;
}

static int enqueue(fake *f, fseq *q) {
    q->sq.n_pending = q->n_tokens - q->n_computed;
    return sched_enqueue(f->s, &q->sq);
}

/* Report, plan (answering questions from the fake pool), commit. */
static const sched_plan *plan(fake *f) {
    for (int i = 0; i < sched_n_running(f->s); i++) {
        fseq *q = (fseq *)sched_running_at(f->s, i);
        q->sq.n_pending = q->n_tokens - q->n_computed;
        q->sq.len = q->n_computed;
        for (int k = 0; k < KV_N_CLASS; k++) q->sq.extra[k] = 0, q->sq.shared[k] = -1;
        if (f->n_class > 1 && held(f, q, KV_GLOBAL) >= f->local_cap)
            q->sq.extra[KV_LOCAL] = -1; /* at the cap: a new block releases an old one */
    }
    sched_view v = {.avail = {0}};
    for (int k = 0; k < f->n_class; k++) v.avail[k] = f->total[k] - f->used[k];
    v.cap = f->cap;
    sched_begin(f->s);
    const sched_plan *p;
    while ((p = sched_decide(f->s, &v))->ask) {
        fseq *q = (fseq *)p->ask;
        f->n_asks++;
        if (q->sq.where == SCHED_RUNNING) {
            int64_t fr[KV_N_CLASS] = {held(f, q, 0), f->n_class > 1 ? held(f, q, 1) : 0};
            sched_answer_frees(f->s, &q->sq, fr);
        } else {
            int64_t take[KV_N_CLASS] = {0}, need[KV_N_CLASS] = {cdiv(q->n_tokens + 1, B), 0};
            if (f->n_class > 1) need[1] = need[0] < f->local_cap ? need[0] : f->local_cap;
            sched_answer_admit(f->s, &q->sq, 0, take, need);
        }
    }
    sched_commit(f->s, p);
    return p;
}

static void release(fake *f, fseq *q) {
    for (int k = 0; k < f->n_class; k++) f->used[k] -= held(f, q, k);
    q->n_computed = 0;
}

/* Feed n tokens of q; when its prompt is done it "samples" a token, and
 * finishes at max_gen. */
static void feed(fake *f, fseq *q, int n) {
    for (int k = 0; k < f->n_class; k++) f->used[k] -= held(f, q, k);
    q->n_computed += n;
    for (int k = 0; k < f->n_class; k++) f->used[k] += held(f, q, k);
    if (q->n_computed < q->n_tokens) return;
    q->n_tokens++;
    if (++q->n_gen >= q->max_gen) {
        release(f, q);
        q->done = true;
        sched_remove(f->s, &q->sq);
    }
}

/* Carry out a plan as the engine would. */
static void carry(fake *f, const sched_plan *p) {
    for (int i = 0; i < p->n_preempt; i++) release(f, (fseq *)p->preempt[i]);
    for (int i = 0; i < p->n_reject; i++) {
        ((fseq *)p->reject[i])->done = true;
        sched_remove(f->s, p->reject[i]);
    }
    for (int i = 0; i < p->n_run; i++) feed(f, (fseq *)p->run[i].seq, p->run[i].n);
    for (int i = 0; i < p->n_admit; i++) {
        fseq *q = (fseq *)p->admit[i].seq;
        if (q->admitted_at < 0) q->admitted_at = f->iter;
        feed(f, q, p->admit[i].n);
    }
    for (int k = 0; k < f->n_class; k++) {
        if (f->used[k] > f->total[k])
            fprintf(stderr, "  class %d over-committed: %lld > %lld\n", k, (long long)f->used[k],
                    (long long)f->total[k]);
    }
    f->iter++;
}

/* Plan and carry out one iteration. */
static const sched_plan *iterate(fake *f) {
    const sched_plan *p = plan(f);
    carry(f, p);
    return p;
}

static bool pool_ok(const fake *f) {
    for (int k = 0; k < f->n_class; k++)
        if (f->used[k] < 0 || f->used[k] > f->total[k]) return false;
    return true;
}

/* Lower priority first, then arrival. */
static void test_priorities(void) {
    fake f;
    CHECK(fake_init(&f, 64, 1, 1000, 0, false, 0, 0));
    static const int prio[5] = {3, 1, 1, 2, -2};
    fseq q[5];
    for (int i = 0; i < 5; i++) {
        seq_init(&q[i], i, prio[i], (uint64_t)i, 3, 2);
        CHECK(enqueue(&f, &q[i]) == 0);
    }
    CHECK(sched_n_waiting(f.s) == 5);
    static const int want[5] = {4, 1, 2, 3, 0};
    for (int i = 0; i < 5; i++) CHECK(((fseq *)sched_waiting_at(f.s, i))->id == want[i]);
    for (int it = 0; it < 40 && sched_n_waiting(f.s) + sched_n_running(f.s); it++) {
        iterate(&f);
        CHECK(pool_ok(&f) && sched_n_running(f.s) <= 1);
    }
    for (int i = 0; i < 5; i++) CHECK(q[i].done);
    for (int k = 1; k < 5; k++)
        CHECKF(q[want[k - 1]].admitted_at < q[want[k]].admitted_at, "%d admitted at %d, %d at %d", want[k - 1],
               q[want[k - 1]].admitted_at, want[k], q[want[k]].admitted_at);
    CHECK(f.used[0] == 0);
    sched_free(f.s);
}

/* The watermark holds wm blocks back beside running sequences only. */
static void test_watermark(void) {
    fake f;
    CHECK(fake_init(&f, 64, 8, 12, 3, false, 0, 0));
    fseq a, b, c;
    seq_init(&a, 0, 0, 0, 3, 100); /* 1 block, running */
    CHECK(enqueue(&f, &a) == 0);
    const sched_plan *p = iterate(&f);
    CHECK(p->n_admit == 1 && f.used[0] == 1);
    /* b needs ceil(33/4) = 9 blocks: 1 (a) + 9 + 3 > 12 */
    seq_init(&b, 1, 0, 1, 32, 1);
    CHECK(enqueue(&f, &b) == 0);
    p = iterate(&f);
    CHECKF(p->n_admit == 0 && p->n_run == 1, "admitted %d beside a with the watermark", p->n_admit);
    /* c needs ceil(25/4) = 7: 1 + 7 + 3 <= 12, but it arrived after b and may not overtake it */
    seq_init(&c, 2, 0, 2, 24, 1);
    CHECK(enqueue(&f, &c) == 0);
    p = iterate(&f);
    CHECK(p->n_admit == 0);
    /* b is the head; without the watermark it would fit: once a finishes,
     * b runs alone (no watermark) */
    a.max_gen = a.n_gen + 1;
    p = iterate(&f);
    CHECK(a.done);
    p = iterate(&f);
    CHECKF(p->n_admit >= 1 && p->admit[0].seq == &b.sq, "b not admitted into the empty pool");
    CHECK(pool_ok(&f));
    sched_free(f.s);
    /* a head no empty pool can hold is rejected, and the next one goes on */
    CHECK(fake_init(&f, 64, 8, 4, 1, false, 0, 0));
    seq_init(&a, 0, 0, 0, 40, 1);
    seq_init(&b, 1, 0, 1, 3, 1);
    CHECK(enqueue(&f, &a) == 0 && enqueue(&f, &b) == 0);
    p = iterate(&f);
    CHECK(p->n_reject == 1 && p->reject[0] == &a.sq && a.done);
    CHECK(p->n_admit == 1 && p->admit[0].seq == &b.sq);
    sched_free(f.s);
}

/* Preemption: worst priority, latest arrival among equals; never one in the
 * batch; the asker itself when it is the worst. */
static void test_preemption_order(void) {
    fake f;
    CHECK(fake_init(&f, 64, 8, 3, 0, false, 0, 0));
    fseq q[3];
    for (int i = 0; i < 3; i++) {
        seq_init(&q[i], i, 0, (uint64_t)i, 3, 100); /* one block each, full after one decode */
        CHECK(enqueue(&f, &q[i]) == 0);
    }
    const sched_plan *p = iterate(&f);
    CHECK(p->n_admit == 3 && f.used[0] == 3);
    p = iterate(&f);
    CHECK(p->n_run == 3 && p->n_preempt == 0 && f.used[0] == 3);
    /* every decode now needs a new block and none is free: 0 takes 2's,
     * then 1 is the worst left and preempts itself */
    p = iterate(&f);
    CHECKF(p->n_preempt == 2 && p->preempt[0] == &q[2].sq && p->preempt[1] == &q[1].sq, "preempted %d", p->n_preempt);
    CHECK(p->n_run == 1 && p->run[0].seq == &q[0].sq);
    CHECK(sched_n_waiting(f.s) == 2 && sched_waiting_at(f.s, 0) == &q[1].sq);
    CHECK(pool_ok(&f));
    sched_free(f.s);
    /* priority beats arrival: the earliest arrival with the worst priority goes */
    CHECK(fake_init(&f, 64, 8, 3, 0, false, 0, 0));
    static const int prio[3] = {5, 0, 0};
    for (int i = 0; i < 3; i++) {
        seq_init(&q[i], i, prio[i], (uint64_t)i, 3, 100);
        CHECK(enqueue(&f, &q[i]) == 0);
    }
    iterate(&f);
    iterate(&f);
    p = iterate(&f);
    CHECKF(p->n_preempt >= 1 && p->preempt[0] == &q[0].sq, "the worst priority was not preempted first");
    CHECK(p->n_run >= 1 && p->run[0].seq == &q[1].sq);
    sched_free(f.s);
}

/* Forks sharing a partial last block: each append but the last among the
 * sharers copies it, so two siblings need one block between them, not two;
 * with a sibling preempted, the other needs no copy at all. */
static void test_shared_last_block(void) {
    fake f;
    CHECK(fake_init(&f, 64, 8, 100, 0, false, 0, 0));
    fseq a, b, c;
    seq_init(&a, 0, 0, 0, 6, 100);
    seq_init(&b, 1, 0, 0, 6, 100);
    b.sq.index = 1;
    seq_init(&c, 2, 0, 1, 6, 100);
    sched_seq *all[3] = {&a.sq, &b.sq, &c.sq};
    for (int i = 0; i < 3; i++) CHECK(sched_start(f.s, all[i]));
    /* len 6, block 4: the second block is partial; a and b share theirs */
    for (int i = 0; i < 3; i++) {
        *all[i] = (sched_seq){.priority = all[i]->priority,
                              .arrival = all[i]->arrival,
                              .index = all[i]->index,
                              .n_pending = 1,
                              .len = 6,
                              .shared = {-1, -1},
                              .where = SCHED_RUNNING};
    }
    a.sq.shared[0] = b.sq.shared[0] = 7;
    a.sq.shared_refs[0] = b.sq.shared_refs[0] = 2;
    sched_begin(f.s);
    sched_view v = {.avail = {1, 0}}; /* one free block: the copy of block 7 */
    const sched_plan *p = sched_decide(f.s, &v);
    CHECKF(!p->ask && p->n_run == 3 && p->n_preempt == 0, "ask %p run %d preempt %d", (void *)p->ask, p->n_run,
           p->n_preempt);
    v.avail[0] = 0; /* none: one of the three must go, and then no copy is needed */
    sched_begin(f.s);
    p = sched_decide(f.s, &v);
    CHECK(p->ask == &c.sq); /* the worst is c (latest arrival): what does it free? */
    int64_t fr[KV_N_CLASS] = {0, 0};
    sched_answer_frees(f.s, &c.sq, fr);
    p = sched_decide(f.s, &v);
    CHECK(p->ask == &b.sq); /* c freed nothing; next b, a's sibling */
    sched_answer_frees(f.s, &b.sq, fr);
    p = sched_decide(f.s, &v);
    CHECKF(!p->ask && p->n_preempt == 2 && p->n_run == 1 && p->run[0].seq == &a.sq,
           "a alone needs no copy once b is gone: run %d preempt %d", p->n_run, p->n_preempt);
    sched_free(f.s);
}

/* Decodes first, then prefill chunks, then admissions, within batch_tokens. */
static void test_chunk_budget(void) {
    fake f;
    CHECK(fake_init(&f, 10, 8, 1000, 0, false, 0, 0));
    fseq d[3], pf, w;
    for (int i = 0; i < 3; i++) {
        seq_init(&d[i], i, 0, (uint64_t)i, 2, 100);
        CHECK(enqueue(&f, &d[i]) == 0);
    }
    const sched_plan *p = iterate(&f); /* three prompts of 2: 6 tokens */
    CHECK(p->n_admit == 3 && p->n_tokens == 6);
    seq_init(&pf, 3, 0, 3, 30, 5);
    CHECK(enqueue(&f, &pf) == 0);
    p = iterate(&f); /* 3 decodes + the first 7 of pf's prompt */
    CHECK(p->n_run == 3 && p->n_admit == 1 && p->admit[0].n == 7 && p->n_tokens == 10);
    seq_init(&w, 4, -9, 4, 2, 5); /* a better priority, but the budget is spent */
    CHECK(enqueue(&f, &w) == 0);
    p = iterate(&f);
    CHECK(p->n_run == 4 && p->n_tokens == 10);
    for (int i = 0; i < 3; i++) CHECK(p->run[i].n == 1);
    CHECK(p->run[3].seq == &pf.sq && p->run[3].n == 7);
    CHECK(p->n_admit == 0);
    sched_free(f.s);
}

/* A long prompt never holds decodes back; a waiting head gets in once the
 * running sequences release blocks, before later arrivals. */
static void test_starvation(void) {
    fake f;
    CHECK(fake_init(&f, 16, 8, 40, 2, false, 0, 0));
    fseq a, b, lp;
    seq_init(&a, 0, 0, 0, 3, 60);
    seq_init(&b, 1, 0, 1, 3, 60);
    CHECK(enqueue(&f, &a) == 0 && enqueue(&f, &b) == 0);
    iterate(&f);
    seq_init(&lp, 2, -1, 2, 100, 3); /* better priority, 100-token prompt */
    CHECK(enqueue(&f, &lp) == 0);
    int chunks = 0;
    while (lp.n_gen == 0) {
        const sched_plan *p = iterate(&f);
        int dec = 0;
        for (int i = 0; i < p->n_run; i++) dec += p->run[i].n == 1;
        for (int i = 0; i < p->n_admit; i++) dec += p->admit[i].seq != &lp.sq && p->admit[i].n == 1;
        CHECKF(dec == 2, "iteration %d: %d decodes ran beside the long prompt", f.iter - 1, dec);
        CHECK(p->n_tokens <= 16);
        chunks++;
        CHECK(chunks < 20);
    }
    CHECKF(chunks == 8, "100 tokens in chunks of 14 took %d iterations", chunks); /* ceil(100 / 14) */
    sched_free(f.s);

    /* a full pool: the head waits, later (smaller) arrivals do not pass it,
     * and it is admitted as soon as the running ones have finished */
    CHECK(fake_init(&f, 64, 8, 20, 1, false, 0, 0));
    fseq r[4], head, late[3];
    for (int i = 0; i < 4; i++) {
        seq_init(&r[i], i, 0, (uint64_t)i, 10, 5 + 3 * i);
        CHECK(enqueue(&f, &r[i]) == 0);
    }
    iterate(&f);
    seq_init(&head, 10, 0, 10, 40, 2); /* 11 blocks: fits only when the others are gone */
    CHECK(enqueue(&f, &head) == 0);
    for (int i = 0; i < 3; i++) {
        seq_init(&late[i], 11 + i, 0, 11 + (uint64_t)i, 2, 2);
        CHECK(enqueue(&f, &late[i]) == 0);
    }
    for (int it = 0; it < 100 && !head.done; it++) {
        iterate(&f);
        CHECK(pool_ok(&f));
    }
    CHECK(head.done && head.admitted_at >= 0);
    for (int i = 0; i < 3; i++)
        CHECKF(late[i].admitted_at < 0 || late[i].admitted_at >= head.admitted_at,
               "a later arrival was admitted at %d, before the head (%d)", late[i].admitted_at, head.admitted_at);
    for (int it = 0; it < 100 && sched_n_running(f.s) + sched_n_waiting(f.s); it++) iterate(&f);
    for (int i = 0; i < 3; i++) CHECK(late[i].done);
    CHECK(f.used[0] == 0);
    sched_free(f.s);
}

/* Inputs that must run whole (a non-causal model's): never admitted with
 * part of their prompt; one reached without room is held and admitted in
 * the next plan, though better-priority whole inputs keep arriving (each
 * iteration three of 5 tokens, which alone would fill every pass). */
static void test_whole(void) {
    fake f;
    CHECK(fake_init(&f, 16, 64, 10000, 0, false, 0, 0));
    enum { N = 3 * 40 + 3 };
    static fseq sh[N];
    fseq lq;
    int n_sh = 0;
    for (; n_sh < 3; n_sh++) { /* 15 tokens ahead of it: 1 left when it is reached */
        seq_init(&sh[n_sh], n_sh, 0, (uint64_t)n_sh, 5, 1);
        sh[n_sh].sq.whole = true;
        CHECK(enqueue(&f, &sh[n_sh]) == 0);
    }
    seq_init(&lq, 1000, 0, 3, 14, 1);
    lq.sq.whole = true;
    CHECK(enqueue(&f, &lq) == 0);
    for (int it = 0; it < 40; it++) {
        const sched_plan *p = iterate(&f);
        for (int i = 0; i < p->n_admit; i++) {
            fseq *q = (fseq *)p->admit[i].seq;
            CHECKF(p->admit[i].n == q->sq.n_pending, "iteration %d: input %d admitted with %d of its %d tokens", it,
                   q->id, p->admit[i].n, q->sq.n_pending);
        }
        CHECK(p->n_tokens <= 16 && pool_ok(&f));
        for (int k = 0; k < 3; k++, n_sh++) { /* better priority, later arrivals */
            seq_init(&sh[n_sh], n_sh, -1, 10 + (uint64_t)n_sh, 5, 1);
            sh[n_sh].sq.whole = true;
            CHECK(enqueue(&f, &sh[n_sh]) == 0);
        }
    }
    CHECKF(lq.done && lq.admitted_at == 1,
           "the long input admitted at iteration %d (want 1, the plan after it was reached)", lq.admitted_at);
    for (int it = 0; it < 200 && sched_n_running(f.s) + sched_n_waiting(f.s); it++) iterate(&f);
    for (int i = 0; i < n_sh; i++) CHECK(sh[i].done);
    sched_free(f.s);
}

/* Static batching: admit only into an empty engine; nobody joins after. */
static void test_static(void) {
    fake f;
    CHECK(fake_init(&f, 64, 2, 1000, 0, true, 0, 0));
    fseq q[5];
    for (int i = 0; i < 4; i++) {
        seq_init(&q[i], i, 0, (uint64_t)i, 3, i == 0 ? 2 : 6);
        CHECK(enqueue(&f, &q[i]) == 0);
    }
    const sched_plan *p = iterate(&f);
    CHECK(p->n_admit == 2 && p->admit[0].seq == &q[0].sq && p->admit[1].seq == &q[1].sq);
    while (!q[1].done) {
        p = iterate(&f);
        CHECKF(p->n_admit == 0, "someone joined a running static batch at iteration %d", f.iter - 1);
    }
    CHECK(q[0].done);
    p = iterate(&f);
    CHECK(p->n_admit == 2 && p->admit[0].seq == &q[2].sq);
    /* a late arrival waits for the whole batch, although a slot is free */
    seq_init(&q[4], 4, 0, 4, 3, 1);
    CHECK(enqueue(&f, &q[4]) == 0);
    while (!q[2].done || !q[3].done) {
        p = iterate(&f);
        CHECK(p->n_admit == 0);
    }
    p = iterate(&f);
    CHECK(p->n_admit == 1 && p->admit[0].seq == &q[4].sq);
    sched_free(f.s);
}

/* Sliding-window layers: admission needs the local blocks too (no
 * watermark for them), capped at what one sequence ever holds. */
static void test_local_class(void) {
    fake f;
    /* plenty of global blocks, 6 local ones, at most 4 per sequence */
    CHECK(fake_init(&f, 64, 8, 1000, 5, false, 6, 4));
    fseq a, b, c;
    seq_init(&a, 0, 0, 0, 30, 100); /* needs 8 global, 4 local (capped) */
    CHECK(enqueue(&f, &a) == 0);
    const sched_plan *p = iterate(&f);
    CHECK(p->n_admit == 1 && f.used[KV_GLOBAL] == 8 && f.used[KV_LOCAL] == 4);
    seq_init(&b, 1, 0, 1, 20, 100); /* 6 global, 4 local: 2 local left */
    CHECK(enqueue(&f, &b) == 0);
    p = iterate(&f);
    CHECKF(p->n_admit == 0, "admitted without its local blocks");
    seq_init(&c, 2, -1, 2, 6, 2); /* 2 global, 2 local: exactly what is left, no watermark */
    CHECK(enqueue(&f, &c) == 0);
    p = iterate(&f);
    CHECKF(p->n_admit == 1 && p->admit[0].seq == &c.sq, "the local class kept a watermark");
    CHECK(pool_ok(&f) && f.used[KV_LOCAL] == 6);
    /* decoding at the cap releases a local block for each it takes */
    for (int it = 0; it < 20; it++) {
        p = iterate(&f);
        CHECK(pool_ok(&f) && p->n_preempt == 0);
    }
    sched_free(f.s);
}

/* Plans ask only what they need, and each question once per iteration. */
static void test_questions(void) {
    fake f;
    CHECK(fake_init(&f, 64, 8, 100, 0, false, 0, 0));
    fseq q[3];
    for (int i = 0; i < 3; i++) {
        seq_init(&q[i], i, 0, (uint64_t)i, 5, 10);
        CHECK(enqueue(&f, &q[i]) == 0);
    }
    iterate(&f);
    CHECK(f.n_asks == 3); /* one admission question each, no frees asked */
    f.n_asks = 0;
    iterate(&f);
    CHECK(f.n_asks == 0); /* decodes with room: nothing to ask */
    /* an unanswered plan names what it needs and moves nothing */
    fseq w;
    seq_init(&w, 9, 0, 9, 5, 1);
    CHECK(enqueue(&f, &w) == 0);
    sched_begin(f.s);
    sched_view v = {.avail = {100 - f.used[0], 0}};
    const sched_plan *p = sched_decide(f.s, &v);
    CHECK(p->ask == &w.sq); /* running ones report through fields; w is asked */
    CHECK(sched_n_waiting(f.s) == 1);
    sched_free(f.s);
}

/* A chunk's cost is the sum over its tokens of tok plus pos per position
 * attended; the fit is the longest chunk within the budget. */
static void test_chunk_cost_fit(void) {
    static const double toks[] = {0, 1e-3, 0.7, 2};
    static const double poss[] = {0, 1e-6, 3e-3, 0.5};
    static const int depths[] = {0, 1, 37, 4000};
    static const double budgets[] = {-1, 0, 0.5, 3, 41.25, 1e4};
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++)
            for (int d = 0; d < 4; d++) {
                sched_cap c = {.on = true, .tok = toks[a], .pos = poss[b]};
                for (int n = 0; n <= 70; n += 7) { /* the reference: token by token */
                    double want = 0;
                    for (int i = 0; i < n; i++) want += c.tok + c.pos * (double)(depths[d] + i + 1);
                    double got = sched_chunk_cost(&c, n, depths[d]);
                    CHECKF(fabs(got - want) <= 1e-12 * (1 + want), "cost(%d, %d) %.17g, want %.17g", n, depths[d], got,
                           want);
                }
                for (int e = 0; e < 6; e++) {
                    int want = 0; /* the longest n <= 300 within the budget */
                    for (int n = 1; n <= 300; n++)
                        if (sched_chunk_cost(&c, n, depths[d]) <= budgets[e]) want = n;
                    int got = sched_chunk_fit(&c, budgets[e], depths[d], 300);
                    CHECKF(got == want, "fit(tok %g, pos %g, depth %d, budget %g) = %d, want %d", c.tok, c.pos,
                           depths[d], budgets[e], got, want);
                }
            }
    sched_cap c = {.on = true, .tok = 1, .pos = 0};
    CHECK(sched_chunk_fit(&c, NAN, 0, 50) == 0);
    CHECK(sched_chunk_fit(&c, INFINITY, 0, 50) == 50);
    CHECK(sched_chunk_fit(&c, 10, 0, 0) == 0);
}

/* Beside decodes, prompt chunks cost at most the budget, the floor aside;
 * without decodes a prompt takes the whole batch_tokens. */
static void test_latency_bound(void) {
    fake f;
    CHECK(fake_init(&f, 64, 8, 1000, 0, false, 0, 0));
    /* tok 1 and pos 0.01: 10 tokens at depth 0 cost 10.55, 11 cost 11.66 */
    f.cap = (sched_cap){.on = true, .budget = 11, .tok = 1, .pos = 0.01, .floor = 4};
    fseq lone;
    seq_init(&lone, 0, 0, 0, 200, 3);
    CHECK(enqueue(&f, &lone) == 0);
    const sched_plan *p = iterate(&f); /* nothing decodes: the whole budget */
    CHECK(p->n_admit == 1 && p->admit[0].n == 64);
    p = iterate(&f);
    CHECK(p->n_run == 1 && p->run[0].n == 64);
    while (!lone.done) iterate(&f);
    fseq d[3], pf, w;
    for (int i = 0; i < 3; i++) {
        seq_init(&d[i], 1 + i, 0, (uint64_t)(1 + i), 2, 1000);
        CHECK(enqueue(&f, &d[i]) == 0);
    }
    iterate(&f); /* three prompts of 2 */
    seq_init(&pf, 4, 0, 4, 300, 2);
    CHECK(enqueue(&f, &pf) == 0);
    p = iterate(&f); /* 3 decodes and an admission's first chunk, cut */
    CHECK(p->n_run == 3 && p->n_admit == 1);
    CHECKF(p->admit[0].n == 10, "first chunk %d", p->admit[0].n);
    p = iterate(&f); /* at depth 10: the fit of an 11 budget */
    int want = sched_chunk_fit(&f.cap, 11, 10, 300);
    CHECK(want >= 4 && want < 10);
    CHECK(p->n_run == 4 && p->run[3].seq == &pf.sq && p->run[3].n == want);
    /* a second prompt gets what the first leaves of the budget: at depth
     * 19 the first takes 8 (9.88), the second 1 (1.01) */
    seq_init(&w, 5, 0, 5, 20, 2);
    CHECK(enqueue(&f, &w) == 0);
    p = iterate(&f);
    CHECK(p->run[3].seq == &pf.sq && p->run[3].n == 8);
    CHECK(p->n_admit == 1 && p->admit[0].n == 1);
    /* until both finish, every plan's prompt chunks cost at most the budget
     * or hold the floor's tokens at most, and hold one at least */
    for (int plans = 0; !(pf.done && w.done) && plans < 400; plans++) {
        bool pending = (!pf.done && pf.n_gen == 0) || (!w.done && w.n_gen == 0);
        p = plan(&f);
        int prompt = 0;
        double cost = 0;
        for (int i = 0; i < p->n_run + p->n_admit; i++) {
            const sched_item *it = i < p->n_run ? &p->run[i] : &p->admit[i - p->n_run];
            if (it->seq->n_pending == 1) continue;
            prompt += it->n;
            cost += sched_chunk_cost(&f.cap, it->n, ((fseq *)it->seq)->n_computed);
        }
        CHECKF((prompt >= 1 || !pending) && (cost <= 11 || prompt <= 4), "plan %d: %d prompt tokens, cost %g", plans,
               prompt, cost);
        carry(&f, p);
    }
    CHECK(pf.done && w.done);
    /* a budget of 0: the floor alone */
    f.cap.budget = 0;
    fseq z;
    seq_init(&z, 6, 0, 6, 50, 2);
    CHECK(enqueue(&f, &z) == 0);
    while (z.admitted_at < 0) p = iterate(&f);
    CHECK(p->n_admit == 1 && p->admit[0].n == 4);
    p = iterate(&f);
    CHECK(p->run[p->n_run - 1].seq == &z.sq && p->run[p->n_run - 1].n == 4);
    /* the bound off: today's plan */
    f.cap.on = false;
    p = iterate(&f);
    CHECK(p->run[p->n_run - 1].seq == &z.sq && p->run[p->n_run - 1].n == 50 - 8);
    sched_free(f.s);
}

/* The budget weighs the prompts against the decodes (sched.h: budget x
 * max(1, W / D)): cost 1 per token, budget 11. Beside 2 decodes one
 * prompt gets 11 tokens; six prompts arriving at once get 33 between
 * them (their first chunks: 11 x 6 / 2), while max_seqs lets them all in. */
static void test_bound_weighs_prompts(void) {
    fake f;
    CHECK(fake_init(&f, 256, 16, 4000, 0, false, 0, 0));
    f.cap = (sched_cap){.on = true, .budget = 11, .tok = 1, .pos = 0, .floor = 1};
    fseq d[2], one, burst[6];
    for (int i = 0; i < 2; i++) {
        seq_init(&d[i], 1 + i, 0, (uint64_t)(1 + i), 2, 1000);
        CHECK(enqueue(&f, &d[i]) == 0);
    }
    iterate(&f); /* the two prompts of 2, whole: nothing decodes yet */
    seq_init(&one, 3, 0, 3, 300, 2);
    CHECK(enqueue(&f, &one) == 0);
    const sched_plan *p = iterate(&f);
    CHECKF(p->n_run == 2 && p->n_admit == 1 && p->admit[0].n == 11, "one prompt beside 2 decodes: %d tokens",
           p->n_admit ? p->admit[0].n : -1);
    for (int i = 0; i < 6; i++) {
        seq_init(&burst[i], 4 + i, 0, (uint64_t)(4 + i), 300, 2);
        CHECK(enqueue(&f, &burst[i]) == 0);
    }
    p = iterate(&f); /* 2 decodes; W = 1 running prompt + 6 waiting = 7: 11 x 7 / 2 */
    int prompt = 0;
    for (int i = 0; i < p->n_run + p->n_admit; i++) {
        const sched_item *it = i < p->n_run ? &p->run[i] : &p->admit[i - p->n_run];
        if (it->seq->n_pending > 1) prompt += it->n;
    }
    CHECKF(prompt == (int)(11.0 * 7 / 2), "a burst of 6 beside 2 decodes: %d prompt tokens, %d expected", prompt,
           (int)(11.0 * 7 / 2));
    sched_free(f.s);
}

static bool near(double a, double b) { return fabs(a - b) <= 1e-12 * (fabs(a) + fabs(b)); }

/* The predictor's means and the bound it gives the scheduler. */
static void test_itl_predictor(void) {
    itl_pred p;
    const double T = 2e8, P = 3e4; /* FLOPs per token, per attended position */
    itl_init(&p, 2.0, 32, T, P);
    double f = 0;
    for (int i = 0; i < 100; i++) f += T + P * (500 + i + 1);
    CHECK(near(itl_flops(&p, 100, 500), f));
    CHECK(!itl_cap(&p).on);          /* nothing timed */
    itl_observe(&p, 0.5, true, 1e9); /* beside decodes, no t_dec yet: no sample */
    CHECK(p.s_flop == 0 && !itl_cap(&p).on);
    itl_observe(&p, 0.040, true, 0); /* a decode-only pass */
    sched_cap c = itl_cap(&p);
    CHECK(c.on && c.floor == 32 && sched_chunk_fit(&c, c.budget, 0, 500) == 0); /* no s: the floor alone */
    itl_observe(&p, 0.080, true, 0);
    CHECK(near(p.t_dec, 0.040 + ITL_ALPHA * 0.040));
    double t_dec = p.t_dec, s1 = (0.150 - t_dec) / f;
    itl_observe(&p, 0.150, true, f); /* a mixed pass: its time less t_dec over its FLOPs */
    CHECK(near(p.s_flop, s1));
    itl_observe(&p, 0.090, false, f / 2); /* prompt alone: all of its time */
    double s2 = s1 + ITL_ALPHA * (0.090 / (f / 2) - s1);
    CHECK(near(p.s_flop, s2));
    itl_observe(&p, 0.010, true, f); /* faster than the decodes alone: no sample */
    itl_observe(&p, NAN, true, f);
    itl_observe(&p, -1, true, 0);
    CHECK(near(p.s_flop, s2) && near(p.t_dec, t_dec));
    c = itl_cap(&p);
    CHECK(c.on && near(c.budget, (2.0 - 1) * t_dec) && near(c.tok, s2 * T) && near(c.pos, s2 * P));
    /* the chunk it allows at depth 1000 keeps the predicted pass within 2 x t_dec */
    int n = sched_chunk_fit(&c, c.budget, 1000, 4096);
    CHECK(n > 0 && n < 4096);
    CHECK(t_dec + s2 * itl_flops(&p, n, 1000) <= 2 * t_dec * (1 + 1e-12));
    CHECK(t_dec + s2 * itl_flops(&p, n + 1, 1000) > 2 * t_dec);
    /* off, and a shape that is no shape */
    itl_init(&p, 0, 32, T, P);
    itl_observe(&p, 0.040, true, 0);
    CHECK(!itl_cap(&p).on);
    itl_init(&p, 3.0, 16, NAN, -1);
    CHECK(p.tok_flops == 1 && p.pos_flops == 0 && near(itl_flops(&p, 7, 99), 7));
}

int main(void) {
    TEST_RUN(test_priorities);
    TEST_RUN(test_watermark);
    TEST_RUN(test_preemption_order);
    TEST_RUN(test_shared_last_block);
    TEST_RUN(test_chunk_budget);
    TEST_RUN(test_starvation);
    TEST_RUN(test_whole);
    TEST_RUN(test_static);
    TEST_RUN(test_local_class);
    TEST_RUN(test_questions);
    TEST_RUN(test_chunk_cost_fit);
    TEST_RUN(test_latency_bound);
    TEST_RUN(test_bound_weighs_prompts);
    TEST_RUN(test_itl_predictor);
    return TEST_DONE();
}
