/*
 * route.c - the client side of `lamina route`: listening (libmicrohttpd,
 * one thread per connection, as `lamina serve`), authentication, the global
 * queue and its bound, the routing policies, the wait for an answer and
 * its pass-through (a whole body, or a stream chunk by chunk), /health,
 * /metrics and the concurrency trace. The global queue, the routing
 * policies and a request's end are route_queue.c's; the transfers run on
 * the upstream thread (route_up.c). Calls go one way: this file calls both,
 * route_up.c calls route_queue.c, and route_queue.c calls neither.
 *
 * Life of a generation request: the body is read (up to max_body), peeked
 * for "stream" and the prompt, reduced to block keys, and queued (or
 * answered 429 when the queue is full). The connection's thread then waits
 * on the request's condition until either the answer is final (answered
 * whole: the replica's status and body, or the router's error) or, for a
 * stream, the replica's first bytes with status 200 arrive: from then on
 * the content reader hands over bytes as the upstream thread appends them,
 * and a failure ends the stream with an error event. While it waits, a
 * client that closes its side is noticed (poll every 100 ms) and the
 * request cancelled.
 */
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "base/util.h"
#include "route/route_int.h"

/* One client connection's generation request, owned by its thread. */
typedef struct {
    lm_router *rt;
    struct MHD_Connection *conn;
    bool chat, embed; /* the route: chat, embeddings, else completions */
    strbuf body;
    bool too_big;
    rt_req *q;      /* once queued (one reference) */
    size_t out_pos; /* streaming: bytes of q->buf handed over */
    strbuf tail;    /* streaming: the router's own closing bytes (an error event) */
    size_t tail_pos;
    bool tail_made;
} rt_call;

/* ------------------------------------------------------------- answers */

static int respond(lm_router *r, struct MHD_Connection *conn, int status, const char *ctype, const char *body,
                   size_t len, const char *hdr, const char *val) {
    struct MHD_Response *m = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!m) return MHD_NO;
    MHD_add_response_header(m, "Content-Type", ctype);
    if (hdr) MHD_add_response_header(m, hdr, val);
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, m);
    MHD_destroy_response(m);
    if (ret == MHD_YES && status > 0 && status < 600) {
        pthread_mutex_lock(&r->mu);
        r->http_status[status]++;
        pthread_mutex_unlock(&r->mu);
    }
    return ret;
}

/* OpenAI's error object as a string (cJSON's allocation). */
static char *error_json(const char *type, const char *code, const char *msg) {
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", type);
    cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNullToObject(e, "code");
    char *j = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return j;
}

static int respond_err(lm_router *r, struct MHD_Connection *conn, int status, const char *type, const char *code,
                       const char *hdr, const char *val, const char *msg) {
    char *j = error_json(type, code, msg);
    int ret = respond(r, conn, status, "application/json", j ? j : "{}", j ? strlen(j) : 2, hdr, val);
    cJSON_free(j);
    return ret;
}

static bool peer_gone(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

/* -------------------------------------------------------------- /metrics */

static void metric(strbuf *b, const char *name, const char *type, const char *help, double v) {
    strbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

/* One gauge or counter with a value per replica. */
static void per_replica(strbuf *b, lm_router *r, const char *name, const char *type, const char *help, int what) {
    strbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    for (int i = 0; i < r->n_rep; i++) {
        const rt_replica *p = &r->rep[i];
        double v = what == 0 ? p->healthy
            : what == 1      ? p->in_flight
            : what == 2      ? p->limit
            : what == 3      ? (double)p->sent
            : what == 4      ? (double)p->failures
            : what == 5      ? (double)p->ejections
            : what == 6      ? p->st.running
            : what == 7      ? p->st.waiting
                             : (double)p->first_byte_timeouts;
        strbuf_printf(b, "%s{replica=\"%s\"} %.17g\n", name, p->url, v);
    }
}

static int route_metrics(lm_router *r, struct MHD_Connection *conn) {
    strbuf b = {0};
    pthread_mutex_lock(&r->mu);
    metric(&b, "lamina_router_queue_depth", "gauge", "Requests held in the router's queue.", r->q_len);
    metric(&b, "lamina_router_http_connections", "gauge", "Client connections open.",
           (double)atomic_load(&r->conns.open));
    metric(&b, "lamina_router_http_evictions_total", "counter",
           "Client connections without a whole request closed to make room for a new one.",
           (double)atomic_load(&r->conns.evictions));
    metric(&b, "lamina_router_http_read_timeouts_total", "counter",
           "Client connections closed for not sending a whole request within --read-timeout.",
           (double)atomic_load(&r->conns.read_timeouts));
    metric(&b, "lamina_router_requests_admitted_total", "counter", "Requests taken into the queue.",
           (double)r->admitted);
    metric(&b, "lamina_router_requests_rejected_total", "counter", "Requests refused (queue full: 429).",
           (double)r->rejected);
    metric(&b, "lamina_router_requests_retried_total", "counter", "Attempts retried on another replica.",
           (double)r->retried);
    metric(&b, "lamina_router_requests_completed_total", "counter", "Requests answered by a replica.",
           (double)r->completed);
    metric(&b, "lamina_router_requests_failed_total", "counter", "Requests ended with the router's error.",
           (double)r->failed);
    metric(&b, "lamina_router_requests_cancelled_total", "counter", "Requests whose client went away.",
           (double)r->cancelled);
    per_replica(&b, r, "lamina_router_replica_healthy", "gauge", "1 while the replica is admitted.", 0);
    per_replica(&b, r, "lamina_router_replica_in_flight", "gauge", "Requests sent to the replica, not final.", 1);
    per_replica(&b, r, "lamina_router_replica_limit", "gauge", "The replica's in-flight limit.", 2);
    per_replica(&b, r, "lamina_router_replica_sent_total", "counter", "Attempts sent to the replica.", 3);
    per_replica(&b, r, "lamina_router_replica_failures_total", "counter", "Transfers that failed.", 4);
    per_replica(&b, r, "lamina_router_replica_ejections_total", "counter", "Times the replica was ejected.", 5);
    per_replica(&b, r, "lamina_router_replica_running", "gauge", "The replica's running requests (last poll).", 6);
    per_replica(&b, r, "lamina_router_replica_waiting", "gauge", "The replica's waiting requests (last poll).", 7);
    per_replica(&b, r, "lamina_router_replica_first_byte_timeouts_total", "counter",
                "Streamed attempts abandoned for no first byte within the first-byte timeout.", 8);
    strbuf_puts(&b,
                "# HELP lamina_router_decisions_total Routing decisions by reason.\n"
                "# TYPE lamina_router_decisions_total counter\n");
    static const char *why[3] = {"prefix_affinity", "round_robin", "least_outstanding"};
    for (int i = 0; i < 3; i++)
        strbuf_printf(&b, "lamina_router_decisions_total{reason=\"%s\"} %llu\n", why[i],
                      (unsigned long long)r->decisions[i]);
    metric(&b, "lamina_router_prefix_routed_total", "counter", "Requests with at least one full block routed.",
           (double)r->routed_with_keys);
    metric(&b, "lamina_router_prefix_hits_total", "counter",
           "Of those, sent where some of their leading blocks had gone before.", (double)r->affinity_hits);
    metric(&b, "lamina_router_prefix_hit_rate", "gauge", "prefix_hits_total / prefix_routed_total.",
           r->routed_with_keys ? (double)r->affinity_hits / (double)r->routed_with_keys : 0);
    strbuf_puts(&b,
                "# HELP lamina_router_queue_seconds Time from arrival to the first send.\n"
                "# TYPE lamina_router_queue_seconds histogram\n");
    uint64_t cum = 0;
    for (int i = 0; i < RT_NHIST; i++) {
        cum += r->qhist[i];
        strbuf_printf(&b, "lamina_router_queue_seconds_bucket{le=\"%g\"} %llu\n", r->qhist_bounds[i],
                      (unsigned long long)cum);
    }
    cum += r->qhist[RT_NHIST];
    strbuf_printf(&b,
                  "lamina_router_queue_seconds_bucket{le=\"+Inf\"} %llu\nlamina_router_queue_seconds_sum %.17g\n"
                  "lamina_router_queue_seconds_count %llu\n",
                  (unsigned long long)cum, r->qhist_sum, (unsigned long long)r->qhist_count);
    strbuf_puts(&b,
                "# HELP lamina_router_http_requests_total HTTP responses by status code.\n"
                "# TYPE lamina_router_http_requests_total counter\n");
    for (int code = 100; code < 600; code++)
        if (r->http_status[code])
            strbuf_printf(&b, "lamina_router_http_requests_total{code=\"%d\"} %llu\n", code,
                          (unsigned long long)r->http_status[code]);
    pthread_mutex_unlock(&r->mu);
    int ret = b.failed
        ? MHD_NO
        : respond(r, conn, 200, "text/plain; version=0.0.4; charset=utf-8", b.p ? b.p : "", b.len, NULL, NULL);
    strbuf_free(&b);
    return ret;
}

static int route_health(lm_router *r, struct MHD_Connection *conn) {
    pthread_mutex_lock(&r->mu);
    int n = 0;
    for (int i = 0; i < r->n_rep; i++) n += r->rep[i].healthy;
    pthread_mutex_unlock(&r->mu);
    char body[96];
    snprintf(body, sizeof body, "{\"status\":\"%s\",\"replicas_healthy\":%d}", n ? "ok" : "unavailable", n);
    return respond(r, conn, n ? 200 : 503, "application/json", body, strlen(body), NULL, NULL);
}

/* GET /v1/models...: forwarded to the first healthy replica. */
/* Whether a model id taken from the path can go to a replica as it is: no
 * segment of its own (a '/' or a dot segment would reach the replica's
 * other routes with the upstream key), nothing the URL would read as
 * syntax, no byte below 0x21. */
static bool plain_model_id(const char *id) {
    if (!*id || !strcmp(id, ".") || !strcmp(id, "..")) return false;
    for (const unsigned char *p = (const unsigned char *)id; *p; p++)
        if (*p <= 0x20 || *p == 0x7f || strchr("/\\?#%", *p)) return false;
    return true;
}

static int route_models(lm_router *r, struct MHD_Connection *conn, const char *url) {
    if (url[10] == '/' && !plain_model_id(url + 11)) {
        char msg[300];
        snprintf(msg, sizeof msg, "The model '%.200s' does not exist", url + 11);
        return respond_err(r, conn, 404, "invalid_request_error", "model_not_found", NULL, NULL, msg);
    }
    char base[1024] = "";
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n_rep && !base[0]; i++)
        if (r->rep[i].healthy) snprintf(base, sizeof base, "%s", r->rep[i].url);
    pthread_mutex_unlock(&r->mu);
    if (!base[0]) return respond_err(r, conn, 503, "server_error", NULL, "Retry-After", "1", "no replica is healthy");
    strbuf b = {0};
    long code = rt_get(r, base, url, &b, 10);
    int ret = code < 0 || b.failed
        ? respond_err(r, conn, 502, "server_error", NULL, NULL, NULL, "the replica did not answer")
        : respond(r, conn, (int)code, "application/json", b.p ? b.p : "", b.len, NULL, NULL);
    strbuf_free(&b);
    return ret;
}

/* ------------------------------------------------------------ generation */

/* The block keys of a request: the model's tokens when the router has the
 * tokenizer and the request parses, else the prompt's text. */
static void request_keys(lm_router *r, rt_req *q, const char *text) {
    const lm_server_parse_ctx *pc = r->cfg.pctx;
    if (q->embed) return; /* embeddings bypass the replicas' prefix caches: no affinity */
    if (pc) {
        lm_server_request pr;
        lm_server_error e;
        if (server_parse_request(pc, q->chat, q->body, q->body_len, &pr, &e) == 0) {
            q->n_keys = route_keys_tokens(pr.prompts[0], pr.n_prompt[0], r->cfg.block_size, q->keys, RT_MAX_KEYS);
            server_request_free(&pr);
            return;
        }
    }
    if (text) q->n_keys = route_keys_text(text, strlen(text), q->keys, RT_MAX_KEYS);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    rt_call *c = cls;
    rt_req *q = c->q;
    lm_router *r = c->rt;
    ssize_t ret;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (c->out_pos < q->buf.len) {
            size_t n = q->buf.len - c->out_pos < max ? q->buf.len - c->out_pos : max;
            memcpy(buf, q->buf.p + c->out_pos, n);
            c->out_pos += n;
            if (c->out_pos == q->buf.len) c->out_pos = q->buf.len = 0;
            ret = (ssize_t)n;
            break;
        }
        if (q->state == RQ_FINAL) {
            if (!c->tail_made) {
                c->tail_made = true;
                if (q->error_status && !q->sse.done) {
                    char *j = error_json("server_error", NULL, q->error);
                    strbuf_printf(&c->tail, "data: %s\n\ndata: [DONE]\n\n", j ? j : "{}");
                    cJSON_free(j);
                }
            }
            if (c->tail_pos < c->tail.len) {
                size_t n = c->tail.len - c->tail_pos < max ? c->tail.len - c->tail_pos : max;
                memcpy(buf, c->tail.p + c->tail_pos, n);
                c->tail_pos += n;
                ret = (ssize_t)n;
            } else ret = MHD_CONTENT_READER_END_OF_STREAM;
            break;
        }
        if (q->client_gone || peer_gone(c->conn)) {
            q->client_gone = true;
            ret = MHD_CONTENT_READER_END_WITH_ERROR;
            break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100000000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&q->cv, &r->mu, &ts);
    }
    pthread_mutex_unlock(&r->mu);
    return ret;
}

static int start_stream(rt_call *c) {
    struct MHD_Response *m = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, c, NULL);
    if (!m) return MHD_NO;
    MHD_add_response_header(m, "Content-Type", "text/event-stream");
    MHD_add_response_header(m, "Cache-Control", "no-cache");
    MHD_add_response_header(m, "X-Accel-Buffering", "no");
    int ret = MHD_queue_response(c->conn, 200, m);
    MHD_destroy_response(m);
    if (ret == MHD_YES) {
        pthread_mutex_lock(&c->rt->mu);
        c->rt->http_status[200]++;
        pthread_mutex_unlock(&c->rt->mu);
    }
    return ret;
}

/* The final answer of a request that did not stream. */
static int answer_final(rt_call *c) {
    lm_router *r = c->rt;
    rt_req *q = c->q;
    if (q->error_status == 499) return MHD_NO;
    if (q->error_status)
        return respond_err(r, c->conn, q->error_status, "server_error", NULL,
                           q->error_status == 503 ? "Retry-After" : NULL, "1", q->error);
    const char *ctype = q->stream && q->status == 200 ? "text/event-stream" : "application/json";
    return respond(r, c->conn, (int)q->status, ctype, q->buf.p ? q->buf.p : "", q->buf.len, NULL, NULL);
}

/* Queue the request and wait for its answer (or a stream's start). */
static int run_call(rt_call *c) {
    lm_router *r = c->rt;
    rt_peek pk;
    /* an embeddings body is never streamed and has no prompt to keep near its cache */
    if (c->embed || route_peek(c->chat, c->body.p ? c->body.p : "", c->body.len, &pk))
        pk.stream = false, pk.text = NULL;
    rt_req *q = lm_calloc(1, sizeof *q);
    if (!q) {
        rt_peek_free(&pk);
        return respond_err(r, c->conn, 500, "server_error", NULL, NULL, NULL, "out of memory");
    }
    q->rt = r;
    q->chat = c->chat;
    q->embed = c->embed;
    q->stream = pk.stream;
    q->body = c->body.p;
    q->body_len = c->body.len;
    memset(&c->body, 0, sizeof c->body);
    q->replica = -1;
    q->up_queue = -1;
    route_sse_init(&q->sse);
    pthread_cond_init(&q->cv, NULL);
    q->t_arrive = lm_now();
    request_keys(r, q, pk.text);
    rt_peek_free(&pk);
    q->refs = 1;
    c->q = q;
    pthread_mutex_lock(&r->mu);
    if (r->q_len >= r->cfg.max_queue) {
        r->rejected++;
        pthread_mutex_unlock(&r->mu);
        return respond_err(r, c->conn, 429, "server_error", "queue_full", "Retry-After", "1",
                           "The router's queue is full; retry later.");
    }
    q->id = ++r->next_id;
    r->admitted++;
    q->refs++; /* the queue's */
    rt_queue_push(r, q, false);
    pthread_mutex_unlock(&r->mu);
    rt_up_wake(r);
    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (q->state == RQ_FINAL) break;
        if (q->stream && q->status == 200 && q->buf.len > 0) {
            q->streaming = true; /* from here on no retry: bytes reach the client */
            break;
        }
        if (peer_gone(c->conn)) {
            q->client_gone = true;
            pthread_mutex_unlock(&r->mu);
            rt_up_wake(r);
            return MHD_NO;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100000000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&q->cv, &r->mu, &ts);
    }
    bool streaming = q->streaming;
    pthread_mutex_unlock(&r->mu);
    return streaming ? start_stream(c) : answer_final(c);
}

/* ------------------------------------------------------------------ access */

static bool same_secret(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned char diff = la != lb;
    for (size_t i = 0; i < la; i++) diff |= (unsigned char)a[i] ^ (unsigned char)b[lb ? i % lb : 0];
    return diff == 0;
}

static bool authorized(lm_router *r, struct MHD_Connection *conn) {
    if (!r->api_key || !r->api_key[0]) return true;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    h += 7;
    while (*h == ' ') h++;
    return same_secret(h, r->api_key);
}

static enum MHD_Result first_call(lm_router *r, struct MHD_Connection *conn, const char *url, const char *method,
                                  void **req_cls) {
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (atomic_load(&r->quiesced))
        return respond_err(r, conn, 503, "server_error", "shutting_down", "Connection", "close",
                           "The router is shutting down.");
    bool models = !strcmp(url, "/v1/models") || (!strncmp(url, "/v1/models/", 11) && url[11]);
    bool comp = !strcmp(url, "/v1/completions"), chat = !strcmp(url, "/v1/chat/completions");
    bool embed = !strcmp(url, "/v1/embeddings");
    bool known = models || comp || chat || embed || !strcmp(url, "/health") || !strcmp(url, "/metrics");
    if (!strncmp(url, "/v1/", 4) && !authorized(r, conn))
        return respond_err(r, conn, 401, "invalid_request_error", "invalid_api_key", "WWW-Authenticate", "Bearer",
                           "Incorrect or missing API key: send 'Authorization: Bearer KEY'.");
    if (!known) {
        char msg[300];
        snprintf(msg, sizeof msg, "Unknown route %.8s %.200s", method, url);
        return respond_err(r, conn, 404, "invalid_request_error", "not_found", NULL, NULL, msg);
    }
    bool gen = comp || chat || embed;
    if (gen ? !post : !get)
        return respond_err(r, conn, 405, "invalid_request_error", "method_not_allowed", "Allow",
                           gen ? "POST" : "GET, HEAD", "Method not allowed on this route");
    if (!strcmp(url, "/health")) return route_health(r, conn);
    if (!strcmp(url, "/metrics")) return route_metrics(r, conn);
    if (models) return route_models(r, conn, url);
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > r->cfg.max_body)
        return respond_err(r, conn, 413, "invalid_request_error", "request_too_large", "Connection", "close",
                           "The request body is larger than the router's limit.");
    rt_call *c = lm_calloc(1, sizeof *c);
    if (!c) return MHD_NO;
    c->rt = r;
    c->conn = conn;
    c->chat = chat;
    c->embed = embed;
    *req_cls = c;
    pthread_mutex_lock(&r->mu);
    r->n_calls++;
    pthread_mutex_unlock(&r->mu);
    return MHD_YES;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                 const char *version, const char *upload_data, size_t *upload_data_size,
                                 void **req_cls) {
    lm_router *r = cls;
    rt_call *c = *req_cls;
    if (!c) {
        enum MHD_Result ret = first_call(r, conn, url, method, req_cls);
        if (!*req_cls) conn_guard_received(&r->conns, conn); /* answered from its headers */
        return ret;
    }
    if (c->q) return MHD_YES; /* answered already */
    if (*upload_data_size) {
        if (!c->too_big && c->body.len + *upload_data_size > r->cfg.max_body) {
            c->too_big = true;
            strbuf_free(&c->body);
        }
        if (!c->too_big) strbuf_put(&c->body, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    conn_guard_received(&r->conns, conn); /* the whole request is in */
    if (c->too_big)
        return respond_err(r, conn, 413, "invalid_request_error", "request_too_large", "Connection", "close",
                           "The request body is larger than the router's limit.");
    if (c->body.failed) return respond_err(r, conn, 500, "server_error", NULL, NULL, NULL, "out of memory");
    return run_call(c);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls, enum MHD_RequestTerminationCode toe) {
    lm_router *r = cls;
    conn_guard_done(&r->conns, conn);
    rt_call *c = *req_cls;
    if (!c) return;
    pthread_mutex_lock(&r->mu);
    if (c->q) {
        if (c->q->state != RQ_FINAL) c->q->client_gone = true;
        rt_req_unref(r, c->q);
    }
    r->n_calls--;
    pthread_mutex_unlock(&r->mu);
    if (c->q) rt_up_wake(r);
    strbuf_free(&c->body);
    strbuf_free(&c->tail);
    lm_free(c);
    *req_cls = NULL;
}

/* ------------------------------------------------------------------ set-up */

void route_config_default(rt_config *c) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8080;
    c->policy = RT_POLICY_PREFIX;
    c->max_queue = 1024;
    c->max_attempts = 3;
    c->poll_interval = 0.2;
    c->timeout = 600;
    c->stall_timeout = 30;
    c->first_byte_timeout = 30;
    c->max_body = 1 << 20;
    c->max_connections = 512;
    c->max_connections_per_ip = 256;
    c->idle_timeout = 60;
    c->read_timeout = 30;
    c->block_size = 16;
}

static int start_daemon(lm_router *r, char *err, size_t errlen) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", r->cfg.port);
    int gai = getaddrinfo(r->host, port, &hints, &ai);
    if (gai || !ai) return lm_err(err, errlen, "cannot resolve '%s': %s", r->host, gai_strerror(gai));
    unsigned flags = MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    r->daemon =
        MHD_start_daemon(flags, (uint16_t)r->cfg.port, NULL, NULL, on_access, r, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, r, MHD_OPTION_NOTIFY_CONNECTION, conn_guard_notify,
                         &r->conns, MHD_OPTION_CONNECTION_LIMIT, CONN_GUARD_DAEMON_LIMIT(r->cfg.max_connections),
                         MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)r->cfg.max_connections_per_ip,
                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)r->cfg.idle_timeout, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!r->daemon) return lm_err(err, errlen, "cannot listen on %s:%d", r->host, r->cfg.port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(r->daemon, MHD_DAEMON_INFO_BIND_PORT);
    r->port = di ? di->port : r->cfg.port;
    return 0;
}

static char *dup_s(const char *s) { return s ? lm_strndup(s, strlen(s)) : NULL; }

lm_router *route_new(const rt_config *c, char *err, size_t errlen) {
    if (c->n_replicas < 1 || c->n_replicas > RT_MAX_REPLICAS)
        return lm_err(err, errlen, "between 1 and %d replicas, not %d", RT_MAX_REPLICAS, c->n_replicas), NULL;
    lm_router *r = lm_calloc(1, sizeof *r);
    if (!r) return lm_err(err, errlen, "out of memory"), NULL;
    r->cfg = *c;
    if (r->cfg.max_queue < 1) r->cfg.max_queue = 1;
    if (r->cfg.max_attempts < 1) r->cfg.max_attempts = 1;
    if (!(r->cfg.poll_interval > 0)) r->cfg.poll_interval = 0.2;
    if (!r->cfg.max_body) r->cfg.max_body = 1 << 20;
    if (r->cfg.max_connections < 1) r->cfg.max_connections = 512;
    if (r->cfg.block_size < 1) r->cfg.block_size = 16;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->poll_cv, NULL);
    r->t0 = lm_now();
    static const double qb[RT_NHIST] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
    memcpy(r->qhist_bounds, qb, sizeof qb);
    r->host = dup_s(c->host ? c->host : "127.0.0.1");
    r->api_key = dup_s(c->api_key);
    if (c->upstream_key && c->upstream_key[0]) {
        size_t n = strlen(c->upstream_key) + 32;
        r->auth_header = lm_malloc(n);
        if (r->auth_header) snprintf(r->auth_header, n, "Authorization: Bearer %s", c->upstream_key);
    }
    r->n_rep = c->n_replicas;
    bool oom = !r->host || (c->api_key && !r->api_key) || (c->upstream_key && c->upstream_key[0] && !r->auth_header);
    for (int i = 0; i < r->n_rep && !oom; i++) {
        rt_replica *p = &r->rep[i];
        p->url = dup_s(c->replicas[i]);
        p->slots = lm_calloc(RT_SLOTS, sizeof *p->slots);
        oom = !p->url || !p->slots;
        if (!oom) {
            size_t n = strlen(p->url);
            while (n && p->url[n - 1] == '/') p->url[--n] = 0;
        }
    }
    if (oom) {
        route_free(r, NULL, 0);
        return lm_err(err, errlen, "out of memory"), NULL;
    }
    if (c->trace_path) {
        char why[LM_ERRLEN];
        if (!(r->trace_file = safefile_create(c->trace_path, why, sizeof why))) {
            lm_err(err, errlen, "cannot write the trace: %s", why);
            route_free(r, NULL, 0);
            return NULL;
        }
        r->trace = safefile_stream(r->trace_file);
    }
    if (r->trace) {
        fprintf(r->trace, "{\"kind\":\"start\",\"policy\":%d,\"max_inflight\":%d,\"max_queue\":%d,\"replicas\":[",
                r->cfg.policy, r->cfg.max_inflight, r->cfg.max_queue);
        for (int i = 0; i < r->n_rep; i++) fprintf(r->trace, "%s\"%s\"", i ? "," : "", r->rep[i].url);
        fputs("]}\n", r->trace);
    }
    if (conn_guard_start(&r->conns, r->cfg.read_timeout, r->cfg.max_connections, err, errlen) ||
        start_daemon(r, err, errlen) || rt_up_start(r, err, errlen)) {
        if (r->trace_file) { /* no trace of a router that never ran */
            safefile_abort(r->trace_file);
            r->trace_file = NULL;
            r->trace = NULL;
        }
        route_free(r, NULL, 0);
        return NULL;
    }
    return r;
}

int route_port(const lm_router *r) { return r->port; }

void route_quiesce(lm_router *r) {
    if (atomic_exchange(&r->quiesced, true) || !r->daemon) return;
    MHD_socket ls = MHD_quiesce_daemon(r->daemon); /* the listening socket is ours to close */
    if (ls != MHD_INVALID_SOCKET) close(ls);
}

int route_active_calls(lm_router *r) {
    pthread_mutex_lock(&r->mu);
    int n = r->n_calls;
    pthread_mutex_unlock(&r->mu);
    return n;
}

int route_free(lm_router *r, char *err, size_t errlen) {
    if (!r) return 0;
    atomic_store(&r->stopping, true);
    route_quiesce(r); /* no new connections */
    rt_up_stop(r);    /* fails what is queued, aborts what is in flight */
    /* let the clients' threads send those answers (at most 5 s) before closing their connections */
    for (int i = 0; i < 500; i++) {
        pthread_mutex_lock(&r->mu);
        int n = r->n_calls;
        pthread_mutex_unlock(&r->mu);
        if (!n) break;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    if (r->daemon) MHD_stop_daemon(r->daemon);
    conn_guard_stop(&r->conns); /* after the library: its closed notices take the guard's mutex */
    for (int i = 0; i < r->n_rep; i++) {
        lm_free(r->rep[i].url);
        lm_free(r->rep[i].slots);
    }
    int rc = r->trace_file ? safefile_commit(r->trace_file, err, errlen) : 0;
    lm_free(r->host);
    lm_free(r->api_key);
    lm_free(r->auth_header);
    pthread_cond_destroy(&r->poll_cv);
    pthread_mutex_destroy(&r->mu);
    lm_free(r);
    return rc;
}
