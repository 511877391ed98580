/*
 * route.h - `lamina route`: an OpenAI-compatible front end that spreads
 * requests over N replicas (`lamina serve` processes, here or elsewhere,
 * each just a base URL), with admission, routing policies, fault handling,
 * its own /metrics and a concurrency trace.
 *
 * Routes: the same as `lamina serve` (server.h). POST /v1/completions,
 * /v1/chat/completions and /v1/embeddings are queued, admitted and
 * forwarded; the answer comes back as the replica gave it (a stream chunk
 * by chunk, as it arrives). Embeddings are never streamed and go by load
 * alone (no prefix affinity: they bypass the replicas' prefix caches).
 * GET /v1/models is forwarded to a healthy replica. GET /health is 200 while
 * at least one replica is healthy, else 503. GET /metrics is the router's.
 *
 * Admission. One global FIFO queue, bounded by max_queue (past it: 429 with
 * Retry-After). A queued request goes to a replica only while that replica's
 * in-flight count is below its limit. The limit is max_inflight when that
 * is set; otherwise it is learnt from the replica's /metrics, polled every
 * poll_interval: while the router holds work, the limit binds and the
 * replica's own waiting queue holds at most RT_TARGET_WAIT (and KV blocks
 * are free), the limit doubles; when the replica's queue grows past
 * 2 x RT_TARGET_WAIT while what it runs does not grow, the limit drops to
 * what it runs plus RT_TARGET_WAIT. So the replica's queue is short but,
 * while the router has work, not empty.
 *
 * Policies: round-robin, least-outstanding (fewest in flight), and
 * prefix-affinity: each request is reduced to a chain of block keys (the
 * prompt's tokens in blocks of block_size, each key the SHA-256 chain the
 * replicas' prefix caches use, kv_prefix_key, cut to 64 bits; or, without a
 * tokenizer, an FNV-1a chain over 64-byte blocks of the prompt text). The
 * router remembers, per replica and approximately (a direct-mapped table),
 * the keys it sent there, and picks the replica holding the longest leading
 * run of the request's keys, among replicas whose in-flight count is within
 * a bound of the mean (ceil(1.25 x mean) + 1: consistent hashing with
 * bounded loads), ties and misses going to the least loaded.
 *
 * Faults. Every poll also asks /health; a replica that fails it, or whose
 * connection fails, is ejected (nothing new goes to it) until /health
 * answers 200 again. A request whose answer has not reached the client yet
 * (a connection failure, a 429 or 5xx from the replica) is put back at the
 * head of the queue and retried on another replica, up to max_attempts; a
 * stream that had begun ends with an error event and [DONE]. A streamed
 * request's attempt that has received no byte of the response body
 * first_byte_timeout after it was sent is abandoned: the replica's learnt
 * limit halves (once per burst of such timeouts), and the request goes to
 * a healthy replica it has not tried, never back to that one, or, when
 * there is none (or no attempt left), fails with 504 naming the
 * replica. A whole answer's first byte is its end (a replica
 * sends nothing before), so the deadline is for streams only; whole
 * answers are bounded by timeout and stall_timeout. A client that
 * goes away cancels its upstream transfer, which closes the connection to
 * the replica, which cancels the request there and frees its KV blocks.
 *
 * Threads: the HTTP library's threads (one per client connection) queue
 * requests and wait on them; one upstream thread runs every transfer to the
 * replicas with libcurl's multi interface; one poller thread checks health
 * and metrics (and writes the trace's samples). One mutex (rt->mu) guards
 * the queue, the replicas and every request's shared state.
 *
 * The parsing helpers at the end are pure functions (no sockets), fuzzed.
 * Library code: nothing here prints or exits; notices go to cfg.log.
 */
#ifndef LAMINA_ROUTE_H
#define LAMINA_ROUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "serve/server.h"

enum { RT_POLICY_PREFIX, RT_POLICY_RR, RT_POLICY_LEAST };

#define RT_MAX_REPLICAS 64
#define RT_TARGET_WAIT 2 /* requests a learnt limit lets wait in a replica's own queue */

typedef struct {
    const char *host;            /* address to bind (default 127.0.0.1) */
    int port;                    /* 0: any free port (route_port) */
    const char *api_key;         /* clients must send it; NULL or "": none */
    const char *upstream_key;    /* sent to the replicas; NULL: none */
    const char *const *replicas; /* (n_replicas) base URLs, "http://host:port" */
    int n_replicas;
    int policy;                      /* RT_POLICY_* (default prefix-affinity) */
    int max_queue;                   /* requests held at the router (default 1024) */
    int max_inflight;                /* per replica; 0: learnt from /metrics */
    int max_attempts;                /* replicas a request may try (default 3) */
    double poll_interval;            /* seconds between health/metrics polls (default 0.2) */
    double timeout;                  /* seconds per upstream transfer; 0: none */
    double stall_timeout;            /* a replica with requests in flight whose engine makes no
                                        iteration for this long is stalled: ejected, its requests
                                        that sent nothing to the client yet retried elsewhere
                                        (default 30; 0: never) */
    double first_byte_timeout;       /* a streamed request's attempt with no response body byte
                                        this long after its send is abandoned and retried on a
                                        replica not tried yet, else 504 (default 30; 0: never) */
    size_t max_body;                 /* request body bytes (default 1 MiB) */
    int max_connections;             /* default 512 */
    int max_connections_per_ip;      /* from one client address (default 256, as serve) */
    int idle_timeout;                /* seconds of silence before a connection closes (default 60) */
    double read_timeout;             /* seconds from a request's first byte to all of it (default 30,
                                        as serve; 0: none) */
    const lm_server_parse_ctx *pctx; /* the model's tokenizer and template, or NULL: text blocks */
    int block_size;                  /* tokens per KV block on the replicas (default 16) */
    const char *trace_path;          /* JSON lines of the concurrency trace, or NULL */
    lm_server_log_fn log;            /* notices (ejections, re-admissions); may be NULL */
    void *log_user;
} rt_config;

void route_config_default(rt_config *c);

typedef struct lm_router lm_router;

/* Start listening and the upstream and poller threads. The configuration's
 * strings are copied; pctx is borrowed and must outlive the router. */
lm_router *route_new(const rt_config *c, char *err, size_t errlen);
int route_port(const lm_router *r);
/* The first half of a graceful stop: close the listening socket and answer
 * every new request on an open connection with 503 "The router is shutting
 * down." (Connection: close); what is queued or in flight goes on. */
void route_quiesce(lm_router *r);
/* Generation requests whose client connection has not completed. */
int route_active_calls(lm_router *r);
/* Stop accepting, fail what is queued, cancel what is in flight, join the
 * threads, free. The trace, written to a temporary file beside trace_path
 * while the router runs (base/safefile.h: never onto an input, such as the
 * served model), is renamed into place here: 0, or -1 with a message when
 * it could not be saved (a write failed; trace_path is then untouched). */
int route_free(lm_router *r, char *err, size_t errlen);

/* ------------------------------------------------------ parsing (pure) */

/* What the router needs of a generation request's body. */
typedef struct {
    bool stream;
    char *text; /* the prompt as text for block hashing (lm_malloc'ed), or NULL */
} rt_peek;

/* Read "stream" and the prompt text (completions: the first prompt string;
 * chat: each message's role and content, in order) of a JSON body. Returns 0
 * (release with rt_peek_free), or -1 when the body is no JSON object: the
 * router then forwards it anyway and the replica answers the error. */
int route_peek(bool chat, const char *body, size_t len, rt_peek *out);
void rt_peek_free(rt_peek *p);

/* Block keys of a prompt: with tokens (kv_prefix_key chain, salt 0, one key
 * per full block of block_size tokens) or of text (FNV-1a chain over
 * RT_TEXT_BLOCK-byte blocks). Writes at most max keys; returns how many. */
#define RT_TEXT_BLOCK 64
int route_keys_tokens(const int32_t *tokens, int n, int block_size, uint64_t *keys, int max);
int route_keys_text(const char *text, size_t len, uint64_t *keys, int max);

/* Server-Sent Events as a replica sends them, fed in arbitrary pieces. */
typedef struct {
    char line[512];    /* the current line's first bytes */
    size_t line_len;   /* bytes of the current line so far (may exceed sizeof line) */
    int events;        /* complete "data:" events seen */
    bool done;         /* "data: [DONE]" seen */
    bool error;        /* an event whose data starts {"error" */
    double queue_time; /* ": lamina queue_time=SECONDS" (the replica's engine queue), -1 none */
} rt_sse;

/* Start a stream's state (everything 0, no queue time). */
void route_sse_init(rt_sse *s);

/* The replica engine's queue time of one response header line (as curl
 * hands it over, CRLF included) "X-Lamina-Queue-Time: SECONDS", the name
 * in any case: the seconds, or -1 when the line is another header or the
 * value is not a finite number in [0, 1e7). */
double route_parse_queue_header(const char *line, size_t n);

/* Feed n bytes; never fails. */
void route_sse_feed(rt_sse *s, const char *p, size_t n);

/* A replica's Prometheus text: the gauges admission learns from. Missing
 * values stay -1. Returns the number of values found. */
typedef struct {
    double running, waiting, kv_free, kv_total, iterations, batch_sum, batch_count;
} rt_upstats;
int route_parse_metrics(const char *text, size_t len, rt_upstats *out);

#endif
