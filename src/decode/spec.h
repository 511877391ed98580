/*
 * spec.h - speculative decoding's proposer and the rule that sizes a
 * proposal.
 *
 * Speculation: a cheap proposer guesses the next few tokens of a sequence,
 * the target model scores all of them in one pass (one logits row per
 * position), and verification keeps the longest prefix the target agrees
 * with, plus one token of the target's own from the first row it disagreed
 * on (or from the row after the last proposal). Verification lives with the
 * sampler (sampler_sample_spec, sample.h) and the engine (engine.c); this
 * module only proposes.
 *
 * Prompt lookup (n-gram) proposer. The sequence's last g tokens (g from
 * SPEC_NGRAM_MAX down to SPEC_NGRAM_MIN) are searched for, most recent
 * occurrence first, among the earlier tokens (prompt and output); the
 * tokens that followed the match are the proposal (continued periodically
 * past the end of the sequence). So text that copies its
 * sources (code edits, summaries, answers quoting a document) is proposed
 * by what it copies. Cost: O(n x g) comparisons per call, no memory. The
 * proposal depends only on the tokens, so it is the same alone or in a
 * batch, and after a preemption.
 *
 * Sizing (spec_ctl). Proposing k tokens costs k more rows in the pass; the
 * i-th proposed token pays off only when all before it were accepted. The
 * controller keeps a running estimate a of the chance that a proposed token
 * is accepted given the ones before it were (an exponential average of
 * per-position outcomes), and proposes the k <= k_max tokens whose chance of
 * being reached, a^i, is at least SPEC_MIN_REACH. When even the first is
 * below it, the sequence decodes plainly and proposes one token every
 * SPEC_PROBE_EVERY steps to refresh the estimate, so speculation that does
 * not pay costs at most one row in SPEC_PROBE_EVERY steps. A proposer whose
 * probe costs more (a draft model's passes) sets every_max above that: each
 * probe rejected doubles the interval up to every_max, one accepted resets
 * it.
 *
 * Cost model (a draft model: cost > 0, each guess costs one draft pass, a
 * share `cost` of the model's pass, which the engine measures at start). A step of k guesses at acceptance a
 * yields 1 + a + ... + a^k tokens for 1 + k x (cost + SPEC_ROW_COST)
 * passes' time (a verified row adds SPEC_ROW_COST of a pass); the
 * controller proposes the k <= k_max with the best ratio, and nothing
 * unless that ratio beats a plain step by SPEC_MIN_GAIN. Probes as above
 * while it says no, and none at all when even a = 1 could not pay (a draft
 * as slow as the model): then the draft never runs. A probe costs a draft
 * restart on a short window, so with the cost model every probe after
 * which the estimate still says no doubles the interval (accepted or not),
 * from every_min (the engine starts a draft's at SPEC_PROBE_FIRST_DRAFT and
 * its estimate at SPEC_ACC_START_DRAFT: a draft was chosen to be right).
 * So a draft that is rarely right stops after a few steps, and one that
 * costs too much is never consulted.
 */
#ifndef LAMINA_SPEC_H
#define LAMINA_SPEC_H

#include <stdint.h>

#define SPEC_NGRAM_MAX 4
#define SPEC_NGRAM_MIN 1
#define SPEC_MIN_REACH 0.25f
#define SPEC_PROBE_EVERY 16
#define SPEC_PROBE_MAX_DRAFT 256  /* a draft model's probes back off to one in this many steps */
#define SPEC_EMA 0.15f            /* weight of one new outcome in the estimate */
#define SPEC_ACC_START 0.6f       /* the estimate before any outcome */
#define SPEC_ROW_COST 0.03f       /* cost model: one more verified row, as a share of a pass */
#define SPEC_ACC_START_DRAFT 0.8f /* cost model: a draft's estimate before any outcome */
#define SPEC_PROBE_FIRST_DRAFT 64 /* cost model: a draft's first probe interval */
#define SPEC_MIN_GAIN 0.03f       /* cost model: the speed-up a proposal must promise over a plain step */

/* The k tokens that followed the most recent earlier occurrence of the
 * longest suffix (SPEC_NGRAM_MAX .. SPEC_NGRAM_MIN tokens) of toks[0..n),
 * written to out (k entries); past toks[n-1] the copy continues from out
 * itself. Returns k, or 0 (no match, k <= 0 or n < 2). */
int spec_ngram_propose(const int32_t *toks, int n, int k, int32_t *out);

typedef struct {
    float acc;  /* estimated chance a proposed token is accepted once the ones before it were */
    int idle;   /* steps since the last proposal while the estimate is too low */
    int every;  /* steps between probes (every_min, doubling up to every_max while probes fail) */
    int every_min, every_max;
    float cost; /* a guess's cost as a share of the model's pass; 0: free (prompt lookup, no cost model) */
} spec_ctl;

/* every = every_min = every_max = SPEC_PROBE_EVERY (no back-off), cost 0. */
void spec_ctl_init(spec_ctl *c);
/* The expected speed-up of proposing k tokens at acceptance a with a
 * guess's cost `cost` (the cost model above): tokens per pass's time. */
float spec_gain(float a, int k, float cost);
/* How many tokens to propose this step, 0 .. k_max (counts a skipped step). */
int spec_ctl_want(spec_ctl *c, int k_max);
/* The outcome of a step that proposed `proposed` tokens and accepted the
 * first `accepted` of them. */
void spec_ctl_update(spec_ctl *c, int proposed, int accepted);

#endif
