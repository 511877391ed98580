/*
 * draft.h - speculative decoding's draft-model proposer: a smaller model
 * with the target's vocabulary guesses the next tokens of many sequences at
 * once, each in its own paged KV sequence of the draft's own pool.
 *
 * A choice's draft state (draft_seq) mirrors a window of its tokens: the
 * draft's KV holds tokens[off .. off + n) at positions 0 .. n - 1 (off is 0
 * unless the draft fell far behind, see below). draft_propose feeds each
 * job the tokens the draft has not seen yet (its prompt on the first call, a
 * few tokens after that) and then its own guesses, one pass per guessed
 * token, every job of the call in the same pass; afterwards the caller
 * tells it how many of the tokens it fed still agree with the sequence
 * (draft_keep) and the rest leave its KV, so the draft stays in step with
 * the target's accepted tokens.
 *
 * Proposals. Row by row the draft's logits go through a sampler with the
 * choice's parameters, bias and penalty history (plus the guesses before
 * it), the same transforms the target's row gets. Greedy: the argmax is the
 * guess. Sampling: the guess is drawn from that distribution q with the
 * draft's own RNG and q is handed back (dense, n_vocab floats) for the
 * rejection scheme; so any q is exact, and a q like the target's is
 * accepted often. A guess whose distribution's largest probability is
 * below p_min ends the proposal (decided before the draw, so q stays the
 * distribution the guess was drawn from); fewer than min guesses propose
 * nothing.
 *
 * Falling behind. A draft more than DRAFT_GAP_MAX tokens behind (the
 * sequence decoded plainly while its acceptance was low) is not caught up:
 * it restarts on the last DRAFT_RESTART_CTX tokens only (off moves), so a
 * rare probe costs a short prefill, not the whole context; its proposals
 * are then from a shorter context, still exact. A sequence's first proposal
 * feeds the whole sequence when it fits, so the window keeps the BOS some
 * models (Gemma 3) need to guess well.
 *
 * Grammars. A job whose choice has a grammar in force (gm) guesses under
 * the same mask the target's row gets: the draft's row is masked before its
 * sampler runs, a copy of the parse state advances along the guesses (an
 * end-of-generation token leaves it, as it does the target's), and the
 * proposal ends where the grammar can only end. So every guess is
 * grammar-valid, and q (the masked distribution the guess was drawn from)
 * keeps the rejection scheme exact.
 *
 * The vocabulary subset. A draft with a large vocabulary spends most of its
 * pass on the LM head (Gemma 3 270M: 262,144 rows of 640, 168M of its 270M
 * parameters). With a subset of n tokens (draft_vocab_size) the draft's LM
 * head computes only the rows of: the end-of-generation tokens and the n
 * best ranked by the tokenizer's scores (a packed copy made at start,
 * model/forward.h's head_sub; SentencePiece scores rank frequency; without
 * scores, the id order), united with the tokens of the job's own sequence
 * (prompt and output so far; the latest DRAFT_EXTRA_MAX distinct ones
 * outside the subset across the call's jobs, gathered per call: copied
 * text is what a draft guesses best). Every other token's logit is -inf
 * before the draft's sampler, so q is zero outside the job's subset and the
 * rejection scheme stays exact; greedy output stays the target's. A job's
 * row keeps its own sequence's tokens only, so its guesses do not depend
 * on the batch.
 *
 * Resources. Its pool holds max_seqs sequences of the target's context (or
 * the draft's, if shorter: the window then restarts), or what a memory
 * budget gave it (engine_mem_plan; draft_plan says what it needs). When the
 * pool is full or a truncation is refused (sliding-window layers), the
 * sequence's draft state is dropped and the job proposes nothing this
 * time; nothing fails.
 */
#ifndef LAMINA_DRAFT_H
#define LAMINA_DRAFT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/pool.h"
#include "base/util.h"
#include "decode/grammar.h"
#include "decode/sample.h"
#include "kv/kv.h"
#include "model/model.h"

#define DRAFT_GAP_MAX 64             /* tokens behind past which the draft restarts on a short window */
#define DRAFT_RESTART_CTX 32         /* tokens it restarts on */
#define DRAFT_VOCAB_AUTO 32768       /* the subset's size by default ... */
#define DRAFT_VOCAB_AUTO_ABOVE 65536 /* ... for vocabularies larger than this */
#define DRAFT_EXTRA_MAX 4096         /* a call's context tokens outside the subset, at most */

typedef struct draft_runner draft_runner;

typedef struct {
    kv_seq *kv;      /* NULL until the first proposal (and after a drop) */
    int off, n;      /* the KV holds tokens[off .. off + n) */
    bool started;    /* proposed before (a dropped KV restarts on a short window) */
    lm_sampler *smp; /* the choice's parameters; history synced each proposal */
    lm_rng rng;      /* draws the guesses */
} draft_seq;

typedef struct {
    draft_seq *ds;
    const int32_t *toks; /* (n_toks) the sequence so far */
    int n_toks;
    const lm_sampler *hist; /* the choice's sampler (its penalty history) */
    lm_gmatch *gm;          /* the choice's parse state when a grammar is in force, else NULL (not
                               owned: a copy advances along the guesses) */
    uint32_t *mask;         /* ((n_mask + 31) / 32) scratch for gm's masks (not owned) */
    int32_t n_mask;         /* tokens the grammar's vocabulary tables cover */
    int k;                  /* guesses wanted */
    int32_t *out;           /* (k) guesses */
    float *q;               /* (k, n_vocab) the guesses' distributions, or NULL (greedy) */
    int n_out;              /* result: guesses made (0 .. k) */
} draft_job;

/* Whether the draft's tokenizer agrees with the target's: vocabulary size,
 * every token's text and kind, BOS/EOS/EOT and add-BOS. 0, or -1 with the
 * first difference in err. */
int draft_check_vocab(const lm_model *target, const lm_model *draft, char *err, size_t errlen);

/* What draft_new allocates for max_seqs sequences of n_ctx positions,
 * passes of n_batch tokens and n_threads threads, computed without
 * allocating: *workspace, the forward pass's workspace and the runner's
 * large buffers (batch tokens, logits rows, a sampler's id and probability
 * rows; the vocabulary subset's rows and scratch for vocab as in
 * draft_vocab_size), in bytes; *kc, its pool's configuration for max_seqs sequences of
 * its context (F16, mem_bytes 0: the caller sets the budget). 0, or -1
 * with a message. */
int draft_plan(const lm_model *dm, int n_ctx, int n_batch, int max_seqs, int n_threads, int vocab, kv_config *kc,
               uint64_t *workspace, char *err, size_t errlen);
/* The subset's size for a request of vocab tokens (lm_engine_config's
 * draft_vocab): < 0 the default (DRAFT_VOCAB_AUTO above
 * DRAFT_VOCAB_AUTO_ABOVE tokens, else the whole vocabulary); 0, or n_vocab
 * or more, the whole vocabulary (returns 0); else vocab, at least the
 * number of end-of-generation tokens. */
int draft_vocab_size(const lm_model *dm, int vocab);
/* The full pool's bytes for kc as draft_plan gives it, at most 2 GiB: what
 * the pool gets without a budget. 0, or -1 with a message. */
int draft_pool_default(const kv_config *kc, uint64_t *bytes, char *err, size_t errlen);

/* A runner for up to max_seqs sequences of n_ctx positions, passes of at
 * most n_batch tokens, the LM head over a subset for vocab
 * (draft_vocab_size), on the given thread pool (shared with the target:
 * the engine thread runs one after the other), its KV pool made from kc
 * (draft_plan's, with mem_bytes set; NULL: the default pool). NULL with a
 * message. */
draft_runner *draft_new(const lm_model *dm, lm_pool *pool, const kv_config *kc, int n_ctx, int n_batch, int max_seqs,
                        int vocab, char *err, size_t errlen);
/* The subset's fixed tokens (0: the whole vocabulary), their ids
 * ascending in *ids when ids is not NULL. */
int draft_vocab_n(const draft_runner *d, const int32_t **ids);
/* What it allocated: the workspace (as draft_plan's) and the pool's K/V bytes. */
uint64_t draft_workspace_bytes(const draft_runner *d);
uint64_t draft_kv_bytes(const draft_runner *d);
/* Its pool's positions (global class). */
int64_t draft_kv_tokens(const draft_runner *d);
/* Seconds of one draft pass over one token (position 0 of a scratch
 * sequence, freed after); -1 when the pool or the pass fails. */
double draft_time_pass(draft_runner *d, int32_t tok);
/* Seconds of one draft pass over n rows (1 .. max_seqs; n one-token
 * sequences, each with its logits row, as a step's guesses are made);
 * -1 when the pool or the pass fails. */
double draft_time_rows(draft_runner *d, int32_t tok, int n);
/* Tests: guess without the grammar's mask (acceptance drops; output stays exact). */
void draft_set_masking(draft_runner *d, bool on);
void draft_free(draft_runner *d);

/* A choice's draft state with its sampling parameters (seeded from sp's
 * seed) and bias. 0, or -1 when out of memory. */
int draft_seq_init(draft_runner *d, draft_seq *ds, const lm_sample_params *sp);
void draft_seq_set_bias(draft_seq *ds, int32_t tok, float bias);
/* Drop the KV (preemption, the end of the choice); the sampler stays. */
void draft_seq_release(draft_runner *d, draft_seq *ds);
void draft_seq_free(draft_runner *d, draft_seq *ds);

/* Run the jobs (at most max_seqs; each k >= 1); fills out / q / n_out. Never fails: a job the
 * pool cannot hold proposes nothing. min, p_min: see above. */
void draft_propose(draft_runner *d, draft_job *jobs, int n_jobs, int min, float p_min);
/* Of the tokens the draft was fed, the first `agree` of the sequence are
 * still its tokens (the rest were rejected): truncate to them. */
void draft_keep(draft_runner *d, draft_seq *ds, int agree);

/* Sequences holding KV in the draft's pool (tests: 0 when idle). */
int64_t draft_live(const draft_runner *d);
/* The draft pool's invariants: 0, or -1 with a message. */
int draft_check(draft_runner *d, char *err, size_t errlen);

#endif
