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
 *     never holds the running decodes back for more than one chunk).
 *
 * Every linear layer runs once over the whole batch; attention runs per
 * sequence over its own KV blocks; only rows that need logits go through the
 * LM head. A sequence's output does not depend on what else is in the batch
 * (the kernels' summation order is fixed per row).
 *
 * Admission: a waiting request is admitted when the pool can hold its whole
 * prompt (plus one block of room) above a watermark of free blocks and fewer
 * than max_seqs run (with sliding-window layers: global blocks for the whole
 * prompt, and the local blocks of as much of it as one sequence ever holds
 * at once; a request needs both classes); the queue is ordered by priority (lower value first, as
 * vLLM's), then by arrival. When the pool runs out during decode, the
 * running sequence with the worst priority (latest arrival among equals) is
 * preempted: its blocks are freed and it is requeued with the tokens it has
 * generated, to be recomputed later with the same output. A request that the
 * whole pool or the context could never hold is rejected at submission.
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
#include "model/model.h"
#include "decode/sample.h"
#include "text/tokenizer.h"

typedef struct lm_engine lm_engine;
typedef struct lm_request lm_request;

/* lm_engine_config, lm_finish, lm_request_stats, lm_event, lm_request_params,
 * lm_hist and lm_engine_stats are in lamina.h. */

void engine_config_default(lm_engine_config *c);

const char *engine_finish_name(lm_finish f); /* "stop", "length", "cancelled", "error" */

void engine_request_params_default(lm_request_params *p);

/* Load-time failures (bad config, no memory) return NULL with a message.
 * The model and tokenizer must outlive the engine. Starts the engine thread. */
lm_engine *engine_new(const lm_model *m, const lm_tokenizer *tok, const lm_engine_config *c, char *err,
                      size_t errlen);
/* Cancels everything still queued or running (each gets its final event),
 * stops the thread, frees the engine. */
void engine_free(lm_engine *e);

enum { ENGINE_OK = 0, ENGINE_EINVAL = -1, ENGINE_EBUSY = -2, ENGINE_ENOMEM = -3, ENGINE_ETOOBIG = -4 };

/*
 * Queue a request. On success returns ENGINE_OK and, when out is not NULL,
 * a handle for engine_cancel that stays valid until engine_request_release.
 * (With out NULL nothing needs releasing.) On failure no event is ever
 * called and err says why: EINVAL for bad parameters (token out of range,
 * max_tokens < 1, ...), ETOOBIG when the prompt plus max_tokens can never fit
 * the context or the KV pool, EBUSY when max_waiting requests already wait.
 */
int engine_submit(lm_engine *e, const lm_request_params *p, lm_request **out, char *err, size_t errlen);
/* Ask for the request to end (its final event says LM_FINISH_CANCELLED
 * unless it finished first); its blocks return to the pool at the next
 * iteration boundary. Any thread; safe after the request finished. */
void engine_cancel(lm_engine *e, lm_request *r);
void engine_request_release(lm_engine *e, lm_request *r);

void engine_stats(lm_engine *e, lm_engine_stats *st);
/* Block until nothing is queued or running (tests, benchmarks). */
void engine_wait_idle(lm_engine *e);
/* Check the KV pool's invariants and that no block is held by a finished
 * request: 0, or -1 with a message (tests; call when idle). */
int engine_check(lm_engine *e, char *err, size_t errlen);

/* The model and tokenizer the engine serves. */
const lm_model *engine_model(const lm_engine *e);
const lm_tokenizer *engine_tokenizer(const lm_engine *e);
int engine_n_ctx(const lm_engine *e);

#endif
