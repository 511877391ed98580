/*
 * sched.h - the scheduling policy of the continuous-batching engine: which
 * sequences wait, which run, which are preempted, and what one iteration's
 * batch holds.
 *
 * The scheduler decides; the engine (engine.h) acts. The scheduler owns two
 * queues of sched_seq handles (the engine embeds one in each of its
 * sequences) and, once per iteration, turns numbers the engine reports into
 * a plan. It never touches the KV pool, the model or a request and calls
 * nothing back: the engine allocates and frees KV blocks, runs the batch and
 * finishes requests, then tells the scheduler what moved.
 *
 * Order. Both queues are ordered by priority (lower value first, as vLLM's),
 * then arrival, then the choice's index.
 *
 * A plan (sched_decide), in the order the engine's batch will hold it:
 *   1. running sequences, best first: first every decode (one pending
 *      token), then prefill chunks, each as many tokens as are pending and
 *      the budget (batch_tokens) still allows. A sequence whose growth does
 *      not fit the free blocks preempts the worst running sequence not yet
 *      in the batch (worst priority, latest arrival among equals), or is
 *      itself preempted when it is the worst;
 *   2. admissions from the head of the waiting queue while the budget,
 *      max_seqs and the free blocks allow: a waiting sequence is admitted
 *      when its whole remaining prompt (plus one position) fits above a
 *      watermark of free global blocks, and its local blocks fit (no
 *      watermark for those: a decode releases about one for each it takes).
 *      Beside no running sequence the watermark does not apply, and a head
 *      that does not fit even then is rejected (it would wait forever).
 *      Sequences preempted by this plan take their place in that queue:
 *      admission stops at one of them and leaves it to the next plan. A
 *      sequence that must run whole (sched_seq.whole), reached by admission
 *      when what is left of the budget cannot hold its remaining prompt,
 *      stops admission too and is held: the following plans consider it
 *      first, before the queue's order (so sequences that would sort before
 *      it, a better priority or a client-less request, do not take its room
 *      again and again) and admit nothing until it fits; a plan whose
 *      running chunks leave room for all of it admits it (a pass without
 *      running prefill leaves the whole budget, and its prompt is at most
 *      batch_tokens: the engine's submission rule), so a stream of short
 *      inputs never starves it. One is held at a time.
 *   3. speculation: decodes with proposed tokens (n_spec) take them into
 *      their item (n = 1 + proposed), best first, while the budget, spec_cap
 *      and the free blocks left after steps 1 and 2 allow, shrinking the
 *      last one to what is left; never preempting or holding back an
 *      admission for it. So under load speculation shrinks, then stops.
 *   The latency bound (sched_view.cap, when on): in a plan that holds a
 *   decode, prompt tokens (prefill chunks of step 1, admissions' first
 *   chunks of step 2) are cut so that their predicted cost, chunk by chunk
 *   (sched_chunk_cost: per token, and per position each token attends, so a
 *   deep chunk costs more), stays within cap.budget; but the plan takes at
 *   least cap.floor prompt tokens (what is pending allows), so a prompt
 *   always progresses. A sequence that must run whole is never cut. A plan
 *   without decodes, or with the bound off, spends batch_tokens as above.
 *   The budget weighs the decodes' wait against the prompts': with D
 *   decodes in the plan and W prompts in prefill or waiting, it is
 *   cap.budget x max(1, W / D). One long prompt beside many decodes gets
 *   cap.budget (their inter-token latency held); a burst of prompts beside a
 *   few decodes gets more, so a handful of streams cannot slow the prefill
 *   of many arrivals to the floor (a pass delays D streams, and advances W).
 *   Static batching (a baseline for benchmarks): admission opens only when
 *   nothing runs and closes when it first fails or max_seqs were admitted;
 *   no one joins until the batch has finished.
 *
 * So a long prompt never holds the running decodes back for more than one
 * chunk (decodes come first, a prompt takes what is left of the budget, and
 * with the latency bound only what keeps the pass within its time),
 * and the head of the waiting queue is admitted as soon as the blocks that
 * running sequences release let it (no later arrival overtakes it).
 *
 * Block accounting, per class (KV_GLOBAL, and KV_LOCAL for sliding-window
 * layers, kv.h): the plan starts from the blocks the pool can hand out
 * (sched_view.avail) and subtracts what each growth and admission takes and
 * adds what each preemption gives back. What a running sequence's growth by
 * n takes is computed from its length (new blocks), a copy of its partial
 * last block while others still share it (forks: each append but the last
 * among the sharers copies), and what the engine reports as extra (for the
 * local class, less the blocks leaving its window). What a preemption gives back
 * and what an admission takes (prefix-cache hits included) the scheduler
 * cannot know: the plan stops and asks (sched_plan.ask); the engine measures
 * it (sched_answer_*) and asks for the plan again. The answers count the
 * blocks the plan's earlier victims let go, so the accounting is exact: an
 * append the plan allows succeeds (the engine counts any that does not, and
 * engine_check reports it).
 *
 * Threads: one (the engine's). Memory: queues and plan arrays are allocated
 * in sched_new and by sched_enqueue/sched_start, which keep room to requeue
 * every running sequence, so sched_commit and sched_requeue never allocate.
 */
#ifndef LAMINA_SCHED_H
#define LAMINA_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "kv/kv.h"

typedef struct sched sched;

enum { SCHED_NONE = 0, SCHED_WAITING, SCHED_RUNNING };

/* A sequence as the scheduler sees it; embedded in the engine's sequence. */
typedef struct sched_seq {
    /* the order key: set before the first sched_enqueue, changed after only by sched_retag */
    int priority;     /* lower runs first */
    int64_t fair;     /* then: its fair-queuing tag (engine.c: each client's tags count up from
                         the tag last admitted, so clients take turns) */
    uint64_t arrival; /* then: submission order */
    int index;        /* the choice within its request */
    bool whole;       /* its prompt runs in one pass (a non-causal model's input): admitted only
                         with room for all of it, and admissions behind it wait (set once) */
    /* reported by the engine before each plan */
    int n_pending;               /* tokens not yet in its KV (1: a decode; waiting: the whole sequence) */
    int len;                     /* running: KV positions held */
    int extra[KV_N_CLASS];       /* running: blocks an append takes beyond its new ones and a copy of a
                                   shared last block (may be negative: local blocks leaving the window) */
    int32_t shared[KV_N_CLASS];  /* running: its partial last block when others hold it too, else -1 */
    int shared_refs[KV_N_CLASS]; /*   and how many hold it: the first appends among them copy it */
    int n_spec;                  /* running, decoding: proposed tokens it would verify with its decode */
    /* answers (sched_answer_*), valid in the iteration they were given */
    uint64_t epoch;
    int64_t frees[KV_N_CLASS]; /* running: blocks its preemption gives back */
    int cached;                /* waiting: leading positions the prefix cache fills */
    int64_t take[KV_N_CLASS];  /* waiting: cached blocks its admission takes from the available ones */
    int64_t need[KV_N_CLASS];  /* waiting: new blocks for the rest of its prompt and one position more */
    /* the scheduler's own */
    int where; /* SCHED_NONE, SCHED_WAITING or SCHED_RUNNING */
    int mark;  /* scratch of one plan */
} sched_seq;

typedef struct {
    int batch_tokens;  /* tokens per iteration, >= 1 */
    int max_seqs;      /* running sequences at most, >= 1 */
    int block_size;    /* positions per KV block, >= 1 */
    int n_class;       /* KV block classes in the pool: 1, or 2 with sliding-window layers */
    int64_t wm_blocks; /* global blocks kept free when admitting beside running sequences */
    bool static_batching;
    int spec_cap; /* proposed tokens one plan verifies at most (0: no speculation) */
} sched_config;

/* The latency bound on prompt chunks beside decodes (sched.h's top). A
 * chunk of n tokens at positions depth .. depth + n - 1 costs
 *   n x tok + pos x (n x depth + n (n + 1) / 2)
 * (each token attends its own position and those before it), in the units
 * of budget (the engine's: seconds, itl.h). */
typedef struct {
    bool on;       /* false: no bound (the zeroed view) */
    double budget; /* what a plan's prompt chunks may cost together when it holds a decode */
    double tok;    /* a prompt token's cost, >= 0 */
    double pos;    /* the cost of each position a prompt token attends, >= 0 */
    int floor;     /* prompt tokens such a plan takes at least, >= 0 */
} sched_cap;

/* The pool as the plan starts from it, and the latency bound. */
typedef struct {
    int64_t avail[KV_N_CLASS]; /* blocks that can be handed out now (free + cached), per class */
    sched_cap cap;
} sched_view;

/* The cost of a chunk of n tokens at depth (the formula above). */
double sched_chunk_cost(const sched_cap *c, int n, int depth);
/* The most tokens, at most max, that a chunk at depth may hold for a cost
 * within budget (0 when not one fits; max when the costs are 0). */
int sched_chunk_fit(const sched_cap *c, double budget, int depth, int max);

typedef struct {
    sched_seq *seq;
    int n; /* tokens to feed this iteration, >= 1 */
} sched_item;

typedef struct {
    /* Not NULL: the plan is incomplete. Answer for this sequence
     * (sched_answer_frees when it runs, sched_answer_admit when it waits)
     * and call sched_decide again; the rest is unset. */
    sched_seq *ask;
    sched_item *run; /* (max_seqs) running sequences' tokens: decodes, then prefill chunks */
    int n_run;
    sched_item *admit;   /* (max_seqs) waiting sequences to start, with their first chunk */
    int n_admit;         /*   (n counts from the prefix cache's end: n_pending - cached at most) */
    sched_seq **preempt; /* (max_seqs) running sequences to stop: free their KV, they wait again */
    int n_preempt;
    sched_seq **reject; /* (max_seqs) waiting sequences the empty pool cannot hold: finish them */
    int n_reject;
    int n_tokens;     /* tokens in run and admit together, <= batch_tokens */
    sched_seq *hold;  /* a waiting sequence that must run whole and is held (admitted first, nothing
                         before it) after this plan; NULL: none */
    bool static_open; /* static batching: admission still open after this plan */
    int static_count;
} sched_plan;

/* NULL when out of memory or the configuration is invalid. */
sched *sched_new(const sched_config *c);
void sched_free(sched *s);

/* A sequence into the waiting queue (its n_pending set). -1 when out of memory. */
int sched_enqueue(sched *s, sched_seq *q);
/* A new sequence straight into the running set (a fork that shares its
 * parent's KV): false when max_seqs already run or out of memory. */
bool sched_start(sched *s, sched_seq *q);
/* A finished sequence out of whichever queue holds it (none: no-op). */
void sched_remove(sched *s, sched_seq *q);
/* A running sequence back into the waiting queue (the engine freed its KV). */
void sched_requeue(sched *s, sched_seq *q);
/* A new fair-queuing tag for q, moving it to its place in the waiting
 * queue when it waits (never allocates). */
void sched_retag(sched *s, sched_seq *q, int64_t fair);

int sched_n_running(const sched *s);
int sched_n_waiting(const sched *s);
/* The i-th running sequence (no order) and the i-th waiting one (in order). */
sched_seq *sched_running_at(const sched *s, int i);
sched_seq *sched_waiting_at(const sched *s, int i);

/* Start an iteration: answers given before it are stale. */
void sched_begin(sched *s);
/* Plan the iteration (see the top of this file). The plan belongs to the
 * scheduler and is valid until the next call; nothing moves until
 * sched_commit. */
const sched_plan *sched_decide(sched *s, const sched_view *v);
void sched_answer_frees(sched *s, sched_seq *q, const int64_t frees[KV_N_CLASS]);
void sched_answer_admit(sched *s, sched_seq *q, int cached, const int64_t take[KV_N_CLASS],
                        const int64_t need[KV_N_CLASS]);
/* Apply a complete plan to the queues: preempted sequences wait again (in
 * order), admitted ones run; the static-batching state moves on. Rejected
 * sequences stay where they are until sched_remove. */
void sched_commit(sched *s, const sched_plan *p);

/* Whether a comes before b in the queues' order. */
bool sched_before(const sched_seq *a, const sched_seq *b);

#endif
