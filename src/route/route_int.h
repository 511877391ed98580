/*
 * route_int.h - what route.c (the client side: HTTP, metrics, the wait
 * for an answer), route_queue.c (the global queue, policies, a request's
 * end, trace samples) and route_up.c (the replica side: the libcurl multi
 * loop, health and metrics polls) share. Calls go one way: route.c calls
 * route_queue.c and route_up.c, route_up.c calls route_queue.c, and
 * route_queue.c calls neither. Not a public header: the contract is
 * route.h.
 *
 * Ownership. An rt_req is one generation request. The connection's thread
 * makes it and holds one reference; the upstream thread holds a second
 * while the request is queued or in flight (refs under rt->mu); whoever
 * drops the last frees it. States go QUEUED -> SENT -> (QUEUED again on a
 * retry) -> FINAL; only FINAL is read by the connection's thread as the
 * end, and nothing changes a FINAL request but the client's reading of buf.
 */
#ifndef LAMINA_ROUTE_INT_H
#define LAMINA_ROUTE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/safefile.h"
#include "serve/conn_guard.h"
#include "base/strbuf.h"
#include "route/route.h"

#define RT_MAX_KEYS 256     /* block keys a request is routed by */
#define RT_SLOTS (1u << 16) /* per-replica direct-mapped table of keys sent there */
#define RT_STREAM_LIMIT                                                                                                \
    (4u << 20)          /* bytes a stream may hold unread before it is cancelled, and of
                                      a whole answer */
#define RT_BAD_IN_ROW 3 /* failed answers in a row that eject a replica for a quarantine */
#define RT_NHIST 12

enum { RQ_NEW, RQ_QUEUED, RQ_SENT, RQ_FINAL };

typedef struct rt_req rt_req;

typedef struct {
    char *url;           /* base URL, no trailing slash */
    bool healthy;        /* admitted: new requests may go here */
    int in_flight;       /* sent and not final */
    int limit;           /* in-flight limit (learnt or fixed) */
    rt_upstats st;       /* the last /metrics */
    double prev_running; /* running at the poll before */
    double batch_mean;   /* engine's mean batch over the last poll interval, or -1 */
    double last_iter, last_bsum, last_bcount;
    /* stalls: requests in flight and the engine's iterations not moving */
    double seen_iter;        /* iterations at the last poll (-1: none read) */
    double t_progress;       /* when it last moved, or had nothing in flight */
    int stall_epoch;         /* bumped at each stall: transfers sent before are aborted */
    int stalls;              /* stalls in a row (the quarantine doubles with each) */
    double quarantine_until; /* a stalled or failing replica is not re-admitted before this */
    int bad_in_row;          /* answers in a row that failed (errors, 5xx, not JSON, too large) */
    double t_shrunk;         /* when a first-byte timeout last halved the limit */
    uint64_t sent, failures, ejections, first_byte_timeouts;
    uint64_t *slots; /* (RT_SLOTS) block keys sent here, 0 for empty */
} rt_replica;

struct rt_req {
    lm_router *rt; /* not owned */
    int refs;
    int state;
    uint64_t id;
    bool chat, embed, stream; /* the route (chat, embeddings, else completions); a streamed answer */
    char *body;               /* (body_len) the client's body, forwarded as is */
    size_t body_len;
    uint64_t keys[RT_MAX_KEYS];
    int n_keys;
    rt_req *next, *prev; /* in the router's queue */
    int replica;         /* the replica of the current or last attempt, -1 none */
    int stall_epoch;     /* the replica's stall_epoch when this attempt was sent */
    bool stalled;        /* this attempt was aborted: the replica stalled */
    bool late;           /* this attempt was aborted: no first byte within first_byte_timeout */
    int attempts;
    bool tried[RT_MAX_REPLICAS];
    bool barred[RT_MAX_REPLICAS]; /* replicas it is never sent to again (their first byte was late) */
    void *easy;                   /* the CURL handle while SENT */
    void *hdrs;                   /* its curl_slist */
    /* what the replica answered (this attempt) */
    long status;      /* 0 until the headers are in */
    strbuf buf;       /* body bytes not yet handed to the client */
    bool streaming;   /* the client has been given status 200 and the stream began */
    bool client_gone; /* the client left: cancel, then drop */
    bool overflow;    /* the client did not read: cancelled */
    bool too_big;     /* a whole answer larger than RT_STREAM_LIMIT: cut */
    char error[200];  /* a final failure, for the client */
    int error_status;
    rt_sse sse;
    double up_queue; /* X-Lamina-Queue-Time of the answer (the replica engine's queue), -1 none */
    /* trace timestamps (lm_now), 0 when not reached */
    double t_arrive, t_admit, t_send, t_first, t_done;
    double t_queued; /* the last time it entered the queue (the queue timeout counts from here) */
    pthread_cond_t cv;
};

struct lm_router {
    rt_config cfg; /* strings point into the owned copies below */
    char *host, *api_key, *auth_header;
    char **urls; /* (n_replicas) */
    struct MHD_Daemon *daemon;
    int port;
    conn_guard conns; /* client connections and the read deadline */

    pthread_mutex_t mu;
    pthread_cond_t poll_cv;
    atomic_bool stopping;
    rt_replica rep[RT_MAX_REPLICAS];
    int n_rep;
    rt_req *q_head, *q_tail; /* the global queue */
    int q_len;
    int rr_next;
    uint64_t next_id;

    /* counters under mu */
    uint64_t admitted, rejected, retried, completed, failed, cancelled;
    uint64_t routed_with_keys, affinity_hits, decisions[3];
    uint64_t http_status[600];
    int n_calls;          /* generation requests whose connection has not completed */
    atomic_bool quiesced; /* route_quiesce: new requests get 503 */
    double qhist_bounds[RT_NHIST];
    uint64_t qhist[RT_NHIST + 1];
    double qhist_sum;
    uint64_t qhist_count;

    safefile *trace_file; /* the trace's temporary file, NULL without --trace */
    FILE *trace;          /* its stream, under mu */
    double t0;

    void *multi; /* CURLM, owned by the upstream thread */
    pthread_t up_thread, poll_thread;
    bool up_started, poll_started;
};

/* route_queue.c */
/* Drop one reference (under mu); the last frees. */
void rt_req_unref(lm_router *r, rt_req *q);
/* Remove q from the queue (under mu). */
void rt_queue_remove(lm_router *r, rt_req *q);
/* Put q back at the head (retry) or tail (under mu). */
void rt_queue_push(lm_router *r, rt_req *q, bool front);
/* Pick a replica for q (under mu), or -1 when none may take it now. */
int rt_pick(lm_router *r, rt_req *q);
/* q reached FINAL (under mu): wake its client, count, trace. */
void rt_finish(lm_router *r, rt_req *q);
/* Trace a sample of every hop's queue (under mu). */
void rt_trace_sample(lm_router *r);

/* route_up.c */
int rt_up_start(lm_router *r, char *err, size_t errlen);
void rt_up_wake(lm_router *r);
void rt_up_stop(lm_router *r);
/* A blocking GET of base+path (for /v1/models); status or -1. */
long rt_get(lm_router *r, const char *base, const char *path, strbuf *out, double timeout);

#endif
