/*
 * spec_sched.h - the speculation policy: how many tokens each decoding
 * sequence proposes this iteration, and what a verified step teaches it.
 * It decides and returns plain data; it never touches a request, the KV
 * pool or a proposer, and calls nothing back. The engine (engine.c) shows
 * it each running sequence (spec_view), makes the proposals it sized
 * (proposer.h), takes the verified tokens and reports what was accepted.
 *
 * An iteration. spec_policy_begin sees every running sequence and the
 * waiting queue: the measured guard may keep the iteration plain
 * (spec_off), and a proposer whose guesses cost passes (a draft model)
 * stands aside while work waits or the budget cannot hold every running
 * sequence's pending tokens and full proposals (the result, `busy`). Then
 * each sequence's wish (spec_policy_wish: its controller's size, bounded by
 * what it may still generate and by the context) and, once the engine has
 * its size (a free proposer - prompt lookup - proposes at once and its find
 * bounds the wish), spec_policy_want queues it with the rows a draft's
 * first pass feeds for it. spec_policy_size sizes the queued wishes together
 * at the batch's width (spec_size_batch, decode/spec.h): wants[i].k is the
 * decision. After the pass the engine verifies each proposal and reports
 * spec_policy_observe (proposed, accepted): the controller's estimate.
 *
 * Prices. The model's pass (curve) and the draft's (dcurve) as functions
 * of their rows: set (a "W:T,..." width curve), timed at start through
 * the timers the engine gives (spec_policy_setup: the least of interleaved
 * rounds, bounded by the weights-read-once line), or flat (n = 0). A
 * draft's flat price (draft_cost) is its one-row pass over the model's.
 * With timed curves the measured guard (spec_guard) decides too: it gets
 * every decode-only iteration's time (spec_policy_record) but those that
 * started a draft or caught one up after a gap (step_once).
 *
 * Bounds. At most max_seqs wishes an iteration; a wish is at most the
 * sequence's spec_k. Nothing is allocated after spec_policy_init.
 */
#ifndef LAMINA_SPEC_SCHED_H
#define LAMINA_SPEC_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lamina.h"
#include "decode/spec.h"

/* One running sequence as the policy sees it. */
typedef struct {
    int n_tokens, n_computed, n_gen; /* its tokens, the positions verified, those generated */
    int max_tokens;                  /* the most it may generate */
    int spec_k;                      /* the most it proposes per step (0: it does not speculate) */
    const spec_ctl *ctl;             /* its controller */
    bool d_kv;                       /* a draft's KV: present, */
    bool d_started;                  /*   started before (a dropped KV restarts on a short window), */
    int d_fed;                       /*   and the tokens it was fed end here (off + n) */
} spec_view;

/* A pass's seconds over `rows` one-token rows, and over one token as a
 * single pass (-1 when it fails). */
typedef struct {
    double (*rows)(void *ctx, int rows);
    double (*pass)(void *ctx);
    void *ctx;
} spec_timer;

typedef struct {
    int max_seqs, batch_tokens, n_ctx;
    int spec_cap;       /* proposed tokens one iteration verifies at most */
    bool draft;         /* the guesses cost passes (a draft model) */
    float spec_cost;    /* lm_spec_config.cost: < 0 no sizing, 0 measured, > 0 a draft's flat price */
    const char *widths; /* a set width curve "W:T,..." (checked), or NULL */
    double draft_bytes; /* the draft's weights over the model's (its price when it cannot be timed) */
} spec_policy_config;

typedef struct {
    spec_policy_config cfg;
    bool sizing;       /* proposals sized at the batch's width */
    spec_curve curve;  /*   the model pass's time by its rows (n = 0: the flat price) */
    spec_curve dcurve; /*   the draft pass's (n = 0: every draft pass costs draft_cost) */
    float draft_cost;  /* a draft pass as a share of the model's (0: no cost model, or no draft) */
    spec_guard guard;  /* measured time per token, speculating or not */
    bool guard_on;     /*   the guard decides (the curve was timed at start) */
    /* this iteration */
    bool spec_off;    /* the guard said no */
    bool step_spec;   /* it speculated (proposals or the draft's passes) */
    bool step_once;   /* its draft passes started a draft or caught one up after a gap */
    int n_want;       /* wishes queued */
    spec_want *wants; /* (max_seqs) */
} spec_policy;

/* Proposed tokens one iteration verifies at most under configuration c (0:
 * no proposer). */
int spec_sched_cap(const lm_engine_config *c);

/* A policy for configuration c (copied; widths must outlive it): 0, or -1
 * when out of memory. */
int spec_policy_init(spec_policy *p, const spec_policy_config *c);
void spec_policy_free(spec_policy *p);
/* Prices: a set curve, or timed through model / draft (draft.rows NULL
 * without a draft model), or flat; a draft's flat price; the guard. */
void spec_policy_setup(spec_policy *p, spec_timer model, spec_timer draft);

/* A new sequence's controller: prompt lookup's, or a draft's backing off
 * from a costly probe (and, with a price, starting from its own estimate). */
void spec_policy_ctl_init(const spec_policy *p, spec_ctl *ctl);

/* The iteration starts: the guard's say for its width (running sequences
 * with one pending token) and whether a paying proposer stands aside
 * (busy). */
bool spec_policy_begin(spec_policy *p, const spec_view *run, int n_run, int n_waiting);
/* Sequence v's wish this iteration: 0 (it does not speculate) or the most
 * it proposes (ctl counts the step). *sync: the proposer must first bring
 * the sequence's state back in step with its tokens (a draft's KV). */
int spec_policy_wish(spec_policy *p, const spec_view *v, spec_ctl *ctl, bool busy, bool *sync);
/* Queue v's wish (> 0; a free proposer's: what it found). Returns its
 * index in wants, or -1 when it is not queued (the sequence proposes
 * nothing). */
int spec_policy_want(spec_policy *p, const spec_view *v, int wish);
/* Size the queued wishes at the batch's width: rows the running sequences
 * carry without proposals, n_dec of them decodes. Fills wants[i].k. */
void spec_policy_size(spec_policy *p, int64_t rows, int n_dec);
/* What the proposals made: any speculation, and a draft's start or long
 * catch-up (paid once, not speculation's steady price). */
void spec_policy_made(spec_policy *p, bool spec, bool once);
/* A verified step of a sequence: `proposed` guesses, the first `accepted`
 * taken. */
void spec_policy_observe(spec_policy *p, spec_ctl *ctl, int proposed, int accepted);
/* A decode-only iteration of `width` sequences took `seconds` and emitted
 * `tokens`: the guard's measurement. */
void spec_policy_record(spec_policy *p, int width, double seconds, int tokens);

#endif
