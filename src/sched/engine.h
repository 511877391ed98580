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

#include "model/model.h"
#include "decode/sample.h"
#include "text/tokenizer.h"

typedef struct lm_engine lm_engine;
typedef struct lm_request lm_request;

typedef struct {
    int n_threads;        /* <= 0: pool_default_threads() */
    int batch_tokens;     /* tokens per iteration, >= 1 (default 512) */
    int max_seqs;         /* sequences running at once (default 64) */
    int n_ctx;            /* positions per sequence; <= 0: the model's */
    uint64_t kv_mem;      /* KV pool bytes; 0: n_ctx x max_seqs positions (capped at 4 GiB).
                             Sliding-window layers: local blocks for max_seqs windows,
                             the rest for global context (kv.h) */
    uint32_t kv_type;     /* LM_TYPE_F32, LM_TYPE_F16 (default) or LM_TYPE_Q8_0 */
    int block_size;       /* KV block tokens (default 16) */
    double watermark;     /* share of blocks kept free when admitting (default 0.01) */
    int max_waiting;      /* queued requests before submission fails busy; 0: unbounded */
    bool prefix_cache;    /* share cached prompt blocks between requests (default true) */
    bool static_batching; /* baseline for benchmarks: admit a batch only when nothing runs,
                             and none joins until all of it finished */
} lm_engine_config;

void engine_config_default(lm_engine_config *c);

typedef enum {
    LM_FINISH_NONE = 0,   /* not finished (a token event) */
    LM_FINISH_STOP,       /* end-of-generation token or a stop string */
    LM_FINISH_LENGTH,     /* max_tokens or the context reached */
    LM_FINISH_CANCELLED,  /* engine_cancel, or the engine shut down */
    LM_FINISH_ERROR,      /* see lm_event.error */
} lm_finish;

const char *engine_finish_name(lm_finish f); /* "stop", "length", "cancelled", "error" */

/* Per-choice statistics, final in the done event. Times in seconds. */
typedef struct {
    int prompt_tokens;        /* the prompt's length */
    int cached_tokens;        /* of which taken from the prefix cache */
    int completion_tokens;
    int preemptions;
    double t_submit;          /* lm_now() at submission */
    double ttft;              /* submission -> first token */
    double e2e;               /* submission -> finish */
    double tpot;              /* (e2e - ttft) / (completion_tokens - 1); 0 if fewer than 2 */
} lm_request_stats;

#define LM_MAX_TOP_LOGPROBS 20

typedef struct {
    int index;                /* the choice (0 .. n-1) */
    int32_t token;            /* the sampled token; -1 in a done event */
    const char *text;         /* text released by this event (UTF-8, may be empty; */
    size_t text_len;          /*   held back while it could begin a stop string) */
    float logprob;            /* log p(token) under the model's distribution, if logprobs */
    int n_top;                /* top_logprobs entries below */
    const int32_t *top_ids;
    const float *top_logprobs;
    bool done;                /* the choice's final event */
    lm_finish finish;
    const char *error;        /* with LM_FINISH_ERROR */
    const lm_request_stats *stats;
} lm_event;

typedef void (*lm_event_fn)(void *user, const lm_event *ev);

typedef struct {
    const int32_t *prompt;    /* token ids (copied at submission), at least one; or NULL and: */
    int n_prompt;
    const char *text;         /* the prompt as text, tokenized at submission (BOS as the model */
    size_t text_len;          /*   adds it, special tokens parsed) */
    int max_tokens;           /* > 0; generation also ends at the context */
    int n;                    /* choices sampled from one prompt (forked KV), >= 1 */
    lm_sample_params sp;      /* choice i uses seed sp.seed + i */
    const int32_t *bias_ids;  /* logit bias entries (copied) */
    const float *bias_vals;
    int n_bias;
    const char *const *stop;  /* stop strings (copied); not part of the output */
    int n_stop;
    bool ignore_eos;
    bool logprobs;            /* fill logprob in token events */
    int top_logprobs;         /* 0 .. LM_MAX_TOP_LOGPROBS */
    int priority;             /* lower runs first (default 0) */
    uint64_t cache_salt;      /* prefix-cache namespace */
    lm_event_fn on_event;     /* required */
    void *user;
} lm_request_params;

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

/* A histogram with fixed upper bounds (Prometheus style, cumulative on read). */
#define LM_HIST_MAX 16
typedef struct {
    int n_bounds;
    double bounds[LM_HIST_MAX];
    uint64_t counts[LM_HIST_MAX + 1]; /* per bucket, the last for > every bound (not cumulative) */
    double sum;
    uint64_t count;
} lm_hist;

typedef struct {
    int running, waiting;
    uint64_t requests_total, requests_finished, requests_rejected;
    uint64_t prompt_tokens_total, generation_tokens_total;
    uint64_t iterations, batch_seqs_total, batch_tokens_total;
    uint64_t preemptions_total;
    int64_t kv_blocks_total, kv_blocks_used, kv_blocks_free, kv_blocks_cached; /* global (all) blocks */
    /* blocks of sliding-window layers (kv.h), all 0 without them */
    int64_t kv_local_blocks_total, kv_local_blocks_used, kv_local_blocks_free, kv_local_blocks_cached;
    uint64_t prefix_queries_total, prefix_hits_total;
    lm_hist batch_size;       /* sequences per iteration */
    lm_hist ttft, tpot, e2e;  /* seconds */
} lm_engine_stats;

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
