/*
 * proposer.h - the proposer seam of speculative decoding: whatever guesses
 * a sequence's next tokens for the model to verify. Two implement it:
 * prompt lookup (decode/spec.h, spec_ngram_propose: free, stateless) and a
 * draft model (draft.h: its own KV pool and passes, kept in step with the
 * accepted tokens). The policy (spec_sched.h) decides how many guesses each
 * sequence gets; the engine makes them here, verifies them and reports the
 * verdict back (observe).
 *
 * Per sequence the proposer keeps a spec_pseq in the engine's choice: the
 * last guesses (guess, after tokens[0 .. base)) and a draft's state. A
 * free proposer (ops.early) proposes as soon as the policy gives a wish,
 * so that what it found bounds the sizing; a paying one (a draft) proposes
 * for all sequences together after the sizing, in the same passes.
 *
 * Lifecycle. spec_pseq_init when a choice is made (its sampling parameters
 * and logit biases seed a draft's own sampler), spec_prop_release when it
 * leaves the running set (preemption, its end: a draft's KV goes back),
 * spec_pseq_free with the choice. sync before a wish and observe after a
 * verified step keep the draft's KV to the tokens that still agree with its
 * guesses (idempotent: a second call with the same tokens does nothing).
 *
 * Hybrid targets (recurrent layers). Rolling the target's recurrent state
 * back after a rejected guess is the engine's (engine_state.c: checkpoints
 * per verified position, the wishes bounded by the free ones), the same for
 * every proposer: a new one needs nothing of its own for it. A proposer that
 * runs a model with recurrent layers of its own (a hybrid draft) would have
 * to roll that state back itself; the draft model refuses one.
 *
 * The next-token-prediction head (proposer_mtp.c, LM_SPEC_MTP) guesses from
 * the target's own states: the engine hands every segment's rows of states
 * after the final norm (lm_fwd.hid, which spec_prop_hid gives it) to
 * spec_prop_hidden once the segment's positions are settled (after a
 * verification, only the verified ones). The head catches up on them at
 * once, so at a wish it chains its drafts from the last state. A free
 * proposer (early): its rows are not priced by the policy.
 *
 * Bounds. A job's k is at most the sequence's guess capacity (its spec_k);
 * at most max_seqs jobs a call.
 */
#ifndef LAMINA_PROPOSER_H
#define LAMINA_PROPOSER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "decode/grammar.h"
#include "decode/sample.h"
#include "sched/draft.h"

typedef struct spec_proposer spec_proposer;

/* A sequence's proposer state. */
typedef struct {
    int32_t *guess; /* (cap) the last proposal */
    int cap;
    int base;             /* the guesses follow tokens[0 .. base) */
    draft_seq ds;         /* a draft model's state */
    struct mtp_slot *mtp; /* the MTP head's state while running (proposer_mtp.c), else NULL */
} spec_pseq;

/* One sequence's proposal this step. */
typedef struct {
    spec_pseq *s;
    const int32_t *toks; /* (n_toks) the sequence so far */
    int n_toks;
    const lm_sampler *hist; /* its sampler (penalty history) */
    lm_gmatch *gm;          /* its parse state when a grammar is in force, else NULL */
    uint32_t *mask;         /* scratch for gm's masks (not owned) */
    int32_t n_mask;
    int k;     /* guesses wanted (>= 1) */
    float *q;  /* (k, n_vocab) the guesses' distributions, or NULL (greedy) */
    int n_out; /* result: guesses made (0 .. k), in s->guess */
} spec_job;

typedef struct {
    const char *name;
    bool early; /* free guesses: proposed at the wish, before the sizing */
    int (*seq_init)(spec_proposer *p, spec_pseq *s, const lm_sample_params *sp, const int32_t *bias_ids,
                    const float *bias_vals, int n_bias);
    void (*seq_release)(spec_proposer *p, spec_pseq *s);
    void (*sync)(spec_proposer *p, spec_pseq *s, const int32_t *toks, int n_toks);
    void (*propose)(spec_proposer *p, spec_job *jobs, int n_jobs);
    void (*observe)(spec_proposer *p, spec_pseq *s, const int32_t *toks, int n_toks, int proposed, int accepted);
    void (*free)(spec_proposer *p);
    /* the target's states for positions pos0 .. pos0 + n - 1 of toks (NULL: not wanted) */
    void (*hidden)(spec_proposer *p, spec_pseq *s, const int32_t *toks, int pos0, const float *h, int n);
} spec_proposer_ops;

struct spec_proposer {
    const spec_proposer_ops *ops;
    draft_runner *dr; /* the draft model's runner (NULL: prompt lookup) */
    int min;          /* draft_propose's min and p_min */
    float p_min;
    draft_job *jobs; /* (max_seqs) */
    int max_seqs;
    struct mtp_prop *mtp; /* the MTP head's slots (NULL: another proposer) */
};

/* Prompt lookup. NULL when out of memory. */
spec_proposer *spec_prop_ngram(void);
/* A draft model (draft_new's arguments; min / p_min as draft_propose's).
 * NULL with a message. */
spec_proposer *spec_prop_draft(const lm_model *dm, lm_pool *pool, const kv_config *kc, int n_ctx, int n_batch,
                               int max_seqs, int vocab, int min, float p_min, char *err, size_t errlen);

/* The MTP head (m->mtp): max_seqs slots of n_ctx positions, products over
 * pool; rows of n_batch states for lm_fwd.hid. NULL with a message. */
spec_proposer *spec_prop_mtp(const lm_model *m, lm_pool *pool, int n_ctx, int n_batch, int max_seqs, char *err,
                             size_t errlen);
/* The buffer the target's pass writes its states into (lm_fwd.hid), or NULL
 * when the proposer wants none. */
float *spec_prop_hid(const spec_proposer *p);
/* States of s's positions pos0 .. pos0 + n - 1 (h: (n, n_embd)), toks the
 * sequence's tokens; no-op for proposers that want none. */
void spec_prop_hidden(spec_proposer *p, spec_pseq *s, const int32_t *toks, int pos0, const float *h, int n);

bool spec_prop_early(const spec_proposer *p);
/* The draft model's runner (its pool's checks and sizes), or NULL. */
draft_runner *spec_prop_runner(const spec_proposer *p);

/* s's state with room for cap guesses (sp, the biases: a draft's own
 * sampler). 0, or -1 when out of memory (spec_pseq_free frees the rest). */
int spec_pseq_init(spec_proposer *p, spec_pseq *s, int cap, const lm_sample_params *sp, const int32_t *bias_ids,
                   const float *bias_vals, int n_bias);
/* Free s (its KV must have been released). */
void spec_pseq_free(spec_pseq *s);
/* The sequence leaves the running set: a draft's KV goes back. */
void spec_prop_release(spec_proposer *p, spec_pseq *s);
/* Before a wish: keep only the state that agrees with toks[0 .. n_toks). */
void spec_prop_sync(spec_proposer *p, spec_pseq *s, const int32_t *toks, int n_toks);
/* Make the jobs' guesses (each k >= 1): fills s->guess, q and n_out, sets
 * s->base to n_toks. Never fails: a job it cannot run gets n_out 0. */
void spec_prop_propose(spec_proposer *p, spec_job *jobs, int n_jobs);
/* A verified step: `proposed` guesses, the first `accepted` taken, the
 * sequence now toks[0 .. n_toks). */
void spec_prop_observe(spec_proposer *p, spec_pseq *s, const int32_t *toks, int n_toks, int proposed, int accepted);
void spec_prop_free(spec_proposer *p);

#endif
