/*
 * engine.h - the continuous-batching engine: many requests, one model.
 *
 * One engine thread owns the model's activations and the paged KV pool. Any
 * thread submits requests (engine_submit) and may cancel them; the engine
 * runs iterations (ORCA-style): at each, finished sequences leave, waiting
 * ones are admitted, and one flat batch runs through the model:
 *
 *   - one decode token for every running sequence that has finished its
 *     prompt, then
 *   - prefill chunks of admitted sequences, in priority order, until the
 *     token budget (batch_tokens) is spent (chunked prefill: a long prompt
 *     never holds the running decodes back for more than one chunk), and
 *     beside decodes no further than the latency bound allows
 *     (lm_engine_config.itl_factor: the pass predicted within that many
 *     decode-only passes' time, itl.h; none for models with recurrent
 *     layers, whose chunks end on the delta rule's pieces).
 *
 * Every linear layer runs once over the whole batch; attention runs per
 * sequence over its own KV blocks; only rows that need logits go through the
 * LM head. A sequence's output does not depend on what else is in the batch
 * (the kernels' summation order is fixed per row).
 *
 * Which sequences wait, run or are preempted, and what each batch holds, is
 * the scheduler's decision (sched.h: admission by free KV blocks above a
 * watermark and max_seqs, priority order - lower value first, as vLLM's -
 * then arrival, preemption of the worst running sequence when the pool runs
 * out, the chunk budget); the engine acts on it. A preempted sequence's
 * blocks are freed and it is requeued with the tokens it has generated, to
 * be recomputed later with the same output. A request that the whole pool
 * or the context could never hold is rejected at submission.
 *
 * A request may carry a GBNF grammar (lm_request_params.grammar, compiled
 * at submission; decode/grammar.h): each choice keeps its own parse state,
 * the tokens the grammar refuses are set to -INFINITY before its sampler
 * runs, and a grammar that can only end finishes the choice with "stop".
 * With trigger strings the grammar is lazy: free until the output contains
 * a trigger, then in force from the trigger's first byte. The parse state
 * depends only on the tokens chosen, so forks start from the same state,
 * preemption keeps it, and the output is the same alone or in a batch. The
 * per-vocabulary tables are built by the first request with a grammar; up
 * to 8 compiled grammars are kept, so requests sending the same text share
 * one mask cache.
 *
 * Speculative decoding (lm_engine_config.spec, an lm_spec_config: prompt lookup, decode/spec.h,
 * or a draft model, sched/draft.h). A decoding choice proposes a few tokens;
 * the scheduler lets the proposals join the choice's decode in the same
 * flat batch with whatever budget and blocks the decodes and prefill chunks
 * leave (so under load speculation shrinks, then stops), the pass returns a
 * logits row per position, and each row's token is taken as a plain decode
 * would take it (sampler, grammar mask and state, stop strings, events),
 * the proposal verified against it: greedy keeps a proposal while it equals
 * the argmax, sampling uses the rejection scheme (sampler_sample_spec) over
 * the distribution q the guess was drawn from (a draft's q: after the
 * choice's sampler transforms and under its grammar's mask, draft.h). The
 * first disagreement gives the target's own token; the KV positions of
 * rejected proposals are truncated (they lie in blocks the append took or
 * copied, never in shared ones). So greedy output is token for token the
 * same, and sampled output has the same distribution; a seed reproduces it
 * when the load (and so each proposal's size) is the same. On a hybrid
 * model the recurrent state a verification pass rewrote goes back to the
 * last accepted token by checkpoints (engine_state.c), and proposals stay
 * within the free checkpoints. A request may
 * turn it off or lower K (spec_k). A draft's proposals are sized by spec.h's
 * cost model (lm_spec_config.cost), and the draft runs only while
 * nothing waits and the batch budget holds every running choice's pending
 * tokens and full proposals. Whatever the cost model predicts, a measured
 * guard (spec_guard, decode/spec.h) stops speculation at a width of the
 * batch where it has been slower than plain steps, and tries it again after
 * an interval.
 *
 * Results reach the submitter through its callback, called on the engine
 * thread once per generated token (with the newly released text) and once
 * more at the end (done set). Callbacks must return quickly: a slow
 * consumer buffers or cancels, never blocks the engine. Every accepted
 * request gets exactly one final event, whatever happens (stop, length,
 * cancel, error, engine shutdown).
 */
#ifndef LAMINA_ENGINE_H
#define LAMINA_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lamina.h"
#include "kv/kv.h"
#include "kv/rstate.h"
#include "model/model.h"
#include "model/forward.h"
#include "decode/sample.h"
#include "text/tokenizer.h"

typedef struct lm_engine lm_engine;
typedef struct lm_request lm_request;

/* lm_engine_config, lm_finish, lm_request_stats, lm_event, lm_request_params,
 * lm_hist and lm_engine_stats are in lamina.h. */

void engine_config_default(lm_engine_config *c);
/* lm_spec_config's defaults (its size sizeof *s). */
void engine_spec_default(lm_spec_config *s);

const char *engine_finish_name(lm_finish f); /* "stop", "length", "cancelled", "error" */

void engine_request_params_default(lm_request_params *p);

/* Load-time failures (bad config, no memory) return NULL with a message.
 * The model and tokenizer must outlive the engine. Starts the engine thread. */
lm_engine *engine_new(const lm_model *m, const lm_tokenizer *tok, const lm_engine_config *c, char *err, size_t errlen);
/* The same with the kind of a failure in *status: LM_ERR_INVALID for a
 * configuration the KV pool cannot be planned for (e.g. a kv_mem too small
 * for one block of every layer), LM_ERR_NOMEM when memory or threads run
 * out; LM_OK on success. */
lm_engine *engine_new_status(const lm_model *m, const lm_tokenizer *tok, const lm_engine_config *c, lm_status *status,
                             char *err, size_t errlen);
/* Knobs outside the public ABI (the command line, benches and tests set
 * them): speculation's measured prices, the grammar cache's size. */
typedef struct {
    const char *spec_widths;    /* the model pass's time by its rows, "W:T,W:T,..." (T relative to W = 1's;
                                must include 1), which sizes the batch's proposals (guesses widen the
                                shared pass); NULL: timed once when the engine starts, unless the
                                spec's cost is set (> 0: priced flat, as for one sequence; < 0: no
                                cost model at all). A curve that does not parse is LM_ERR_INVALID. */
    size_t grammar_cache_bytes; /* the compiled grammars kept for reuse, in bytes at most (0: 64 MiB) */
} engine_tuning;
/* engine_new_status with tuning t (NULL: none). */
lm_engine *engine_new_tuned(const lm_model *m, const lm_tokenizer *tok, const lm_engine_config *c,
                            const engine_tuning *t, lm_status *status, char *err, size_t errlen);
/* The memory split an engine of configuration c would have, computed
 * without allocating (engine_new uses the same plan): the budget
 * (c->mem, 0 without one), the weights (mapped tensors, packed copies),
 * the workspace (fwd_workspace_bytes for c's threads and batch, and the
 * engine's logits rows), and the KV pool's configuration and plan, with the
 * positions it holds and the sequences of n_ctx positions that fit at once.
 * With a draft model (LM_SPEC_DRAFT) its parts too: its weights (mapped and
 * packed), its workspace (draft_plan's, and the guesses' distributions the
 * engine keeps, spec_cap rows of n_vocab floats) and its own KV pool.
 * With a budget, the KV pools get budget - every weight and workspace: the
 * target's pool all of it without a draft; with one, the two pools share it
 * in proportion to their bytes for max_seqs full sequences, so both hold
 * about the same positions (the draft's at most its default pool, 2 GiB;
 * the target's at most its default with mem_cap). A rest below one sequence
 * of n_ctx positions in each pool is an error naming every part. A hybrid
 * model (recurrent layers) adds its recurrent state store (rstate.h): one
 * live slot per running sequence (max_seqs), with the prefix cache the
 * snapshot slots of c->state_snapshots (engine_mem.c: the default's
 * bound), and with speculation the checkpoints that roll a rejected
 * proposal back (engine_ckpt_slots); its bytes (state) come out of the
 * budget before the KV pool. 0, or -1 with a message. */
typedef struct {
    uint64_t budget, weights, packed, workspace, kv;
    uint64_t state;      /* the recurrent state store's slots (0 without recurrent layers) */
    uint64_t state_snap; /*   of them the snapshots' (rcfg.n_snap slots) */
    rstate_config rcfg;  /*   its configuration (n_layer 0 without recurrent layers) */
    int64_t kv_tokens, kv_seqs;
    int n_ctx;
    kv_config kc; /* the pool's configuration (layer_local borrowed from the model) */
    kv_plan plan;
    /* the draft model's parts (0 without one) */
    uint64_t draft_weights; /* mapped and packed */
    uint64_t draft_workspace, draft_kv;
    int64_t draft_kv_tokens;
    kv_config dkc; /* its pool's configuration */
} engine_mem;
int engine_mem_plan(const lm_model *m, const lm_engine_config *c, engine_mem *out, char *err, size_t errlen);

/* Cancels everything still queued or running (each gets its final event),
 * stops the thread, frees the engine. */
void engine_free(lm_engine *e);

/*
 * Queue a request. On success returns LM_OK and, when out is not NULL, a
 * handle for engine_cancel that stays valid until engine_request_release.
 * (With out NULL nothing needs releasing.) On failure no event is ever
 * called and err says why: LM_ERR_INVALID for a bad field (token out of
 * range, max_tokens 0, n above max_seqs, ...), LM_ERR_TOO_LONG when the
 * request breaks the context rule (engine_fit_context with n_ctx + 1) or
 * could never fit the KV pool, LM_ERR_BUSY when max_waiting requests already wait or the
 * engine is stopping, LM_ERR_NOMEM.
 */
lm_status engine_submit(lm_engine *e, const lm_request_params *p, lm_request **out, char *err, size_t errlen);
/*
 * The context rule, the one every layer applies: a request may hold at most
 * n_max tokens in all, prompt and generated. The prompt must leave room for
 * one generated token; max_tokens > 0 must fit beside it (n_prompt +
 * max_tokens <= n_max), never clamped; max_tokens < 0 asks for the rest
 * (n_max - n_prompt). LM_OK with *max_out (may be NULL) the tokens the
 * request may generate, or LM_ERR_TOO_LONG. The engine's n_max is n_ctx + 1
 * (every position holds a token and one more is sampled from the last); the
 * server's is n_ctx, as OpenAI counts a context (prompt and completion within
 * max_model_len). (max_tokens 0 is the caller's to refuse: engine_submit
 * says LM_ERR_INVALID.)
 */
lm_status engine_fit_context(int n_max, int n_prompt, int max_tokens, int *max_out);
/* Ask for the request to end (its final event says LM_FINISH_CANCELLED
 * unless it finished first); its blocks return to the pool at the next
 * iteration boundary. Any thread; safe after the request finished. */
void engine_cancel(lm_engine *e, lm_request *r);
void engine_request_release(lm_engine *e, lm_request *r);

void engine_stats(lm_engine *e, lm_engine_stats *st);
/* Block until nothing is queued or running (tests, benchmarks). */
void engine_wait_idle(lm_engine *e);

/* Where the engine thread's iterations spend their time (seconds, summed
 * while profiling is on): the forward pass (ops: per op, as lm_prof_names),
 * sampling (on the pool, and the draws made one at a time), and emitting
 * (detokenization, stop strings, events to the callbacks); steps and the
 * sequences they ran; the draft model's share and the steps the guard
 * (decode/spec.h, spec_guard) kept plain. Read it while the engine is idle. */
typedef struct {
    double forward, sample, emit;
    double ops[LM_PROF_COUNT];
    uint64_t steps, seqs;
    double draft;         /* the draft model's passes and guesses (draft_propose) */
    uint64_t draft_steps; /* iterations that ran them */
    uint64_t guard_off;   /* iterations the measured guard kept from speculating */
} engine_profile_t;
void engine_set_profile(lm_engine *e, bool on);
/* Draw every row's token one after another on the engine thread instead of
 * on the pool (the same tokens; for measuring what the pool saves). Set it
 * before submitting. */
void engine_set_serial_sampling(lm_engine *e, bool on);
/* Tests: the draft model guesses without the grammar's mask (the same
 * output; acceptance drops). Set it before submitting. */
void engine_set_draft_masking(lm_engine *e, bool on);
void engine_profile(const lm_engine *e, engine_profile_t *p);
/* Check the KV pool's invariants, that no block is held by a finished
 * request, and that every KV append a scheduler plan allowed succeeded (the
 * plans' block accounting is exact): 0, or -1 with a message (tests; call
 * when idle). */
int engine_check(lm_engine *e, char *err, size_t errlen);

/* Speculation's prices, fixed at start (measurement; not in the public
 * ABI): a draft pass's as a share of the model's (0: no cost model or no
 * draft), and the widest pass the width curve knows with its time as a
 * share of a one-row pass (0: no curve, rows priced flat). */
typedef struct {
    float draft_cost;
    int32_t width_rows;
    float width_cost;
} engine_spec_prices_t;
void engine_spec_prices(const lm_engine *e, engine_spec_prices_t *p);

/* The model and tokenizer the engine serves. */
const lm_model *engine_model(const lm_engine *e);
const lm_tokenizer *engine_tokenizer(const lm_engine *e);
int engine_n_ctx(const lm_engine *e);
/* The most sequences it runs at once (a request's n may not exceed it). */
int engine_max_seqs(const lm_engine *e);

#endif
