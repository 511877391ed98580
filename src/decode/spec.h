/*
 * spec.h - speculative decoding's proposer and the rules that size
 * proposals and decide when speculation is worth it.
 *
 * Speculation: a cheap proposer guesses the next few tokens of a sequence,
 * the target model scores all of them in one pass (one logits row per
 * position), and verification keeps the longest prefix the target agrees
 * with, plus one token of the target's own from the first row it disagreed
 * on (or from the row after the last proposal). Verification lives with the
 * sampler (sampler_sample_spec, sample.h) and the engine (sched/); this
 * module only proposes and sizes.
 *
 * Prompt lookup (n-gram) proposer. The sequence's last g tokens (g from
 * SPEC_NGRAM_MAX down to SPEC_NGRAM_MIN) are searched for, most recent
 * occurrence first, among the earlier tokens (prompt and output); the
 * tokens that followed the match are the proposal (continued periodically
 * past the end of the sequence), so text that copies its sources is
 * proposed by what it copies. Cost: O(n x g) comparisons per call, no
 * memory. The proposal depends only on the tokens, so it is the same alone
 * or in a batch, and after a preemption.
 *
 * Sizing (spec_ctl). The controller keeps a running estimate a of the
 * chance that a proposed token is accepted given the ones before it were
 * (an exponential average of per-position outcomes) and proposes the
 * k <= k_max tokens whose chance of being reached, a^i, is at least
 * SPEC_MIN_REACH. When even the first is below it, the sequence decodes
 * plainly and proposes one token every SPEC_PROBE_EVERY steps to refresh
 * the estimate, so speculation that does not pay costs at most one row in
 * SPEC_PROBE_EVERY steps. A proposer whose probe costs more sets every_max
 * above that: each rejected probe doubles the interval up to every_max, an
 * accepted one resets it.
 *
 * Cost model (a draft model: cost > 0, the share of the model's pass one
 * draft pass costs, measured by the engine at start). A step of k guesses
 * at acceptance a yields 1 + a + ... + a^k tokens for 1 + k x (cost +
 * SPEC_ROW_COST) passes' time (a verified row adds SPEC_ROW_COST of a
 * pass); the controller proposes the k <= k_max with the best ratio, and
 * nothing unless it beats a plain step by SPEC_MIN_GAIN. While it says no
 * it probes as above, and not at all when even a = 1 could not pay (a draft
 * as slow as the model): then the draft never runs. A probe costs a draft
 * restart on a short window, so every probe after which the estimate still
 * says no doubles the interval (accepted or not), from every_min (a draft
 * starts at SPEC_PROBE_FIRST_DRAFT, with its estimate at
 * SPEC_ACC_START_DRAFT). So a draft that is rarely right stops after a few
 * steps, and one that costs too much is never consulted.
 *
 * The batch's width (spec_size_batch). In a batch every sequence's guesses
 * widen the same pass, and a pass wide enough to be bound by arithmetic
 * rather than by reading the weights pays nearly a pass's worth per row.
 * So each step the engine asks spec_size_batch, with the model pass's time
 * as a function of its rows (spec_curve: timed at start, or set), for the
 * proposal sizes that give the most tokens per unit of time across the
 * batch: the step already carries `rows` rows that yield n_dec tokens;
 * guess j of a sequence adds one row and acc^j expected tokens; a draft's
 * guesses add its passes, all sequences in the same pass (pass p as wide as
 * the sequences guessing at least p tokens, the first as wide as the rows
 * they feed to catch up: the tokens taken since the draft's last pass, up
 * to k + 1; priced by the draft's own curve times its one-row price).
 * Guesses are added most likely first and the best prefix of that order is
 * kept, or none when it does not beat the plain step by SPEC_MIN_GAIN. At
 * batch 1 on a pass bound by the weights this keeps what each controller
 * wants; on a wide compute-bound pass it shrinks the proposals, then stops
 * them. Probes are kept as they are (rare by construction). With a set
 * curve the decision is deterministic; verification is exact either way.
 *
 * The measured guard (spec_guard). The engine times every decode-only step
 * (from proposing to the last token emitted, the draft's passes included;
 * not a step that starts a draft or catches one up after a gap) and keeps,
 * per width of the batch (decoding sequences, power-of-two buckets), an
 * exponential average of the seconds per emitted token of speculating and
 * of plain steps. Speculation at a width starts only once SPEC_GUARD_MIN
 * plain steps were timed there, and every SPEC_GUARD_REFRESH speculating
 * steps one plain step refreshes the baseline. Once SPEC_GUARD_MIN
 * speculating steps were timed and their average is slower than the plain
 * one, speculation at that width stops for an interval of steps (from
 * SPEC_GUARD_OFF_MIN, doubling while it keeps losing, up to
 * SPEC_GUARD_OFF_MAX; a win resets it), then is tried again with a fresh
 * average. The guard is a pure function of the timings it is given.
 */
#ifndef LAMINA_SPEC_H
#define LAMINA_SPEC_H

#include <stdbool.h>
#include <stddef.h>
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
    float acc; /* estimated chance a proposed token is accepted once the ones before it were */
    int idle;  /* steps since the last proposal while the estimate is too low */
    int every; /* steps between probes (every_min, doubling up to every_max while probes fail) */
    int every_min, every_max;
    float cost;  /* a guess's cost as a share of the model's pass; 0: free (prompt lookup, no cost model) */
    int probing; /* the last spec_ctl_want was a probe (the estimate said no) */
} spec_ctl;

#define SPEC_CURVE_MAX 16
#define SPEC_CALIB_ROWS 64    /* the widest pass the engine times at start */
#define SPEC_CALIB_MIN_S 1e-3 /* a one-row pass shorter than this is priced flat, not timed */

/* A pass's time as a function of its rows, as a share of a one-row pass:
 * points (w[i], t[i]), widths increasing from w[0] = 1 (t[0] = 1), times
 * never decreasing. Between points it is linear, past the last it goes on
 * with the last segment's slope. n = 0: the flat one-sequence price,
 * 1 + (rows - 1) x SPEC_ROW_COST. */
typedef struct {
    int n;
    int w[SPEC_CURVE_MAX];
    float t[SPEC_CURVE_MAX];
} spec_curve;

/* One sequence's say in spec_size_batch. */
typedef struct {
    float acc;  /* its controller's estimate */
    int k_max;  /* what its controller wants this step (the most it may propose) */
    bool probe; /* that is a probe: kept as it is */
    int feed;   /* a draft's first pass: the rows it feeds for this sequence (the tokens taken
                   since its last guesses, up to k + 1; < 1 counts as 1) */
    int k;      /* result: what it proposes */
} spec_want;

/* The curve's time at `rows` rows (rows < 1 count as 1). */
float spec_curve_at(const spec_curve *c, int rows);
/* Make the points a curve: sorted by width, merged, times from w = 1's
 * (which it must have), never decreasing. 0, or -1 with a message. */
int spec_curve_fix(spec_curve *c, char *err, size_t errlen);
/* Parse "W:T,W:T,..." (widths >= 1 with W = 1 among them, times > 0, at
 * most SPEC_CURVE_MAX points) into a curve (spec_curve_fix'd: times are
 * taken relative to W = 1's). 0, or -1 with a message. */
int spec_curve_parse(const char *s, spec_curve *c, char *err, size_t errlen);
/* Size the proposals of n sequences sharing one pass (see above): fills
 * each w[i].k (0 .. k_max) and returns their sum. rows: what the step
 * carries without proposals; n_dec: tokens those rows yield; model: the
 * model pass's curve; draft_cost: a draft pass over one row as a share of
 * the model's (0: the guesses are free to make, prompt lookup); draft: the
 * draft pass's curve (NULL: flat, every pass draft_cost). */
int spec_size_batch(spec_want *w, int n, int rows, int n_dec, const spec_curve *model, float draft_cost,
                    const spec_curve *draft);

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

#define SPEC_GUARD_BUCKETS 8    /* widths 1, 2, 3-4, 5-8, ..., 65 and more */
#define SPEC_GUARD_EMA 0.25f    /* weight of one step's time in an average */
#define SPEC_GUARD_MIN 3        /* steps of a kind timed before a decision rests on them */
#define SPEC_GUARD_REFRESH 32   /* a plain step after this many speculating ones at a width */
#define SPEC_GUARD_OFF_MIN 8    /* steps without speculation after it first lost */
#define SPEC_GUARD_OFF_MAX 1024 /* the longest such interval */

typedef struct {
    double t_spec, t_plain; /* averages: seconds per emitted token */
    int n_spec, n_plain;    /* steps in each average */
    int since_plain;        /* speculating steps since the last plain one */
    uint64_t off_until;     /* no speculation before this step */
    int off;                /* the next interval without speculation */
} spec_guard_width;

typedef struct {
    uint64_t step; /* spec_guard_allow calls */
    spec_guard_width b[SPEC_GUARD_BUCKETS];
} spec_guard;

/* Nothing timed, no interval. */
void spec_guard_init(spec_guard *g);
/* The bucket of a width (decoding sequences; < 1 counts as 1). */
int spec_guard_bucket(int width);
/* At the start of a step of `width` decoding sequences: whether it may
 * speculate. Counts the step. */
bool spec_guard_allow(spec_guard *g, int width);
/* A decode-only step of `width` sequences took `seconds` and emitted
 * `tokens` tokens; spec: it speculated (proposals verified or the draft's
 * passes run). Steps that emitted nothing are ignored. */
void spec_guard_record(spec_guard *g, int width, bool spec, double seconds, int tokens);

#endif
