/*
 * server.c - the HTTP side of `lamina serve`: listening, routing,
 * authentication, body limits, /health, /v1/models and /metrics.
 * Authentication: any of the configured keys (api_key and api_keys) is
 * accepted; the key a request came with names its tenant, whose salt
 * (server_tenant_salt) puts its prefix-cache blocks in a namespace of their
 * own, so one key's cached prompts never answer another's.
 * Generation requests are handed to server_gen.c (call_run); the chat page
 * (/, /webui.js, /webui.css; open like /health, its API calls carry the key)
 * to webui.c.
 *
 * The HTTP library (libmicrohttpd) runs an internal polling thread and one
 * thread per connection, so the handler of a request may block: a
 * non-streaming answer waits in the access handler, a streaming one in the
 * content reader. Neither blocks the engine, which only ever appends to a
 * call's queue.
 *
 * Life of a request: the access handler's first call sees the headers only.
 * A request without a body is answered at the library's second call (see
 * on_access for why). One with a body that the headers already refuse is
 * answered at once (more header lines than --max-headers, a bad key, an
 * unknown route, a wrong method, a declared Content-Length over the limit).
 * For the generation routes it makes a srv_call; the body arrives in pieces
 * (kept up to max_body bytes; the rest is read and dropped and answered
 * 413); the last call runs the request. The completed callback frees the
 * call, whatever the way the request ended (answered, client gone,
 * shutdown).
 *
 * Limits on connections (server.h): the library enforces the global and
 * per-address connection counts, the per-connection memory (a request line
 * or headers past it: 414 or 431, and the connection closes) and the idle
 * timeout; conn_guard.c adds the deadline for receiving a whole request.
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

#include "text/chat.h"
#include "model/model.h"
#include "serve/http.h"
#include "serve/server_int.h"
#include "serve/webui.h"
#include "base/util.h"

/* ------------------------------------------------------------- small routes */

static int route_health(lm_server *s, struct MHD_Connection *conn) {
    if (atomic_load(&s->quiesced)) {
        const char *body = "{\"status\":\"stopping\"}";
        return srv_respond(s, conn, 503, "application/json", body, strlen(body), "Connection", "close");
    }
    bool ready = atomic_load(&s->engine) != NULL;
    const char *body = ready ? "{\"status\":\"ok\"}" : "{\"status\":\"loading\"}";
    return srv_respond(s, conn, ready ? 200 : 503, "application/json", body, strlen(body), NULL, NULL);
}

static const char *pooling_name(int p) {
    return p == LM_POOL_MEAN ? "mean" : p == LM_POOL_CLS ? "cls" : p == LM_POOL_LAST ? "last" : "none";
}

static cJSON *model_object(lm_server *s) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->started);
    cJSON_AddStringToObject(m, "owned_by", "lamina");
    lm_engine *e = atomic_load(&s->engine);
    if (e) cJSON_AddNumberToObject(m, "max_model_len", engine_n_ctx(e));
    if (e) { /* what the model can be asked for here */
        cJSON *caps = cJSON_AddArrayToObject(m, "capabilities");
        cJSON_AddItemToArray(caps, cJSON_CreateString("completions"));
        if (!s->pctx.chat_error) cJSON_AddItemToArray(caps, cJSON_CreateString("chat"));
        if (!s->pctx.embed_error) {
            cJSON_AddItemToArray(caps, cJSON_CreateString("embeddings"));
            cJSON_AddNumberToObject(m, "embedding_dim", s->pctx.n_embd);
            cJSON_AddStringToObject(m, "pooling", pooling_name(s->embed_pooling));
        }
    }
    return m;
}

/* GET /v1/models and /v1/models/NAME. */
static int route_models(lm_server *s, struct MHD_Connection *conn, const char *name) {
    cJSON *o;
    if (name) {
        if (strcmp(name, s->model_name) != 0)
            return srv_respond_errf(s, conn, 404, "invalid_request_error", "model_not_found", NULL, NULL,
                                    "The model '%.100s' does not exist.", name);
        o = model_object(s);
    } else {
        o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", "list");
        cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), model_object(s));
    }
    char *j = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!j) return MHD_NO;
    int ret = srv_respond(s, conn, 200, "application/json", j, strlen(j), NULL, NULL);
    cJSON_free(j);
    return ret;
}

static void metric(strbuf *b, const char *name, const char *type, const char *help, double v) {
    strbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

/* A histogram in Prometheus' form: cumulative buckets, +Inf, sum, count. */
static void histogram(strbuf *b, const char *name, const char *help, const lm_hist *h) {
    strbuf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    int nb = h->n_bounds < LM_HIST_MAX ? h->n_bounds : LM_HIST_MAX;
    for (int i = 0; i < nb; i++) {
        cum += h->counts[i];
        strbuf_printf(b, "%s_bucket{le=\"%.10g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[nb];
    strbuf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.17g\n%s_count %llu\n", name, (unsigned long long)cum, name,
                  h->sum, name, (unsigned long long)h->count);
}

static int route_metrics(lm_server *s, struct MHD_Connection *conn) {
    lm_engine_stats st;
    memset(&st, 0, sizeof st);
    lm_engine *e = atomic_load(&s->engine);
    if (e) engine_stats(e, &st);
    strbuf b = {0};
    metric(&b, "lamina_model_loaded", "gauge", "1 once the model is loaded.", e ? 1 : 0);
    metric(&b, "lamina_requests_running", "gauge", "Requests generating now.", st.running);
    metric(&b, "lamina_requests_waiting", "gauge", "Requests queued for admission.", st.waiting);
    metric(&b, "lamina_requests_total", "counter", "Requests accepted by the engine.", (double)st.requests_total);
    metric(&b, "lamina_requests_finished_total", "counter", "Requests finished.", (double)st.requests_finished);
    metric(&b, "lamina_requests_rejected_total", "counter", "Requests refused as busy.", (double)st.requests_rejected);
    metric(&b, "lamina_prompt_tokens_total", "counter", "Prompt tokens submitted.", (double)st.prompt_tokens_total);
    metric(&b, "lamina_generation_tokens_total", "counter", "Tokens generated.", (double)st.generation_tokens_total);
    metric(&b, "lamina_iterations_total", "counter", "Engine iterations.", (double)st.iterations);
    metric(&b, "lamina_kv_blocks_total", "gauge", "KV cache blocks in the pool.", (double)st.kv_blocks_total);
    metric(&b, "lamina_kv_blocks_used", "gauge", "KV cache blocks held by sequences.", (double)st.kv_blocks_used);
    metric(&b, "lamina_kv_blocks_free", "gauge", "KV cache blocks free.", (double)st.kv_blocks_free);
    metric(&b, "lamina_kv_blocks_cached", "gauge", "Free KV blocks kept for prefix reuse.",
           (double)st.kv_blocks_cached);
    /* the memory split, fixed at start (lm_engine_config.mem) */
    metric(&b, "lamina_memory_budget_bytes", "gauge", "The memory budget (--mem); 0: none.", (double)st.mem_budget);
    metric(&b, "lamina_memory_weights_bytes", "gauge", "Weights: tensors mapped from the file and packed copies.",
           (double)(st.mem_weights + st.mem_packed));
    metric(&b, "lamina_memory_workspace_bytes", "gauge", "Activation workspace, attention scratch and logits rows.",
           (double)st.mem_workspace);
    metric(&b, "lamina_memory_kv_bytes", "gauge", "The KV cache pool's K/V data.", (double)st.mem_kv);
    metric(&b, "lamina_memory_state_bytes", "gauge",
           "Hybrid models: the recurrent layers' state, a slot per running sequence, the prefix cache's "
           "snapshots and speculation's checkpoints; 0: none.",
           (double)st.mem_state);
    if (st.mem_state) { /* hybrid models: the prefix cache's state snapshots */
        metric(&b, "lamina_memory_state_snapshot_bytes", "gauge", "Of the state, the snapshot slots.",
               (double)st.mem_state_snap);
        metric(&b, "lamina_state_snapshots", "gauge", "State snapshot slots holding one.", (double)st.state_snap_used);
        metric(&b, "lamina_state_snapshots_saved_total", "counter", "State snapshots saved at prompts' block ends.",
               (double)st.state_snap_saved_total);
        metric(&b, "lamina_state_snapshots_restored_total", "counter",
               "Prefix-cache hits that restored a state snapshot.", (double)st.state_snap_restored_total);
        metric(&b, "lamina_state_snapshots_evicted_total", "counter", "State snapshots evicted for room.",
               (double)st.state_snap_evicted_total);
        metric(&b, "lamina_state_snapshots_dropped_total", "counter", "State snapshots dropped with their KV block.",
               (double)st.state_snap_dropped_total);
    }
    metric(&b, "lamina_memory_draft_weights_bytes", "gauge", "The draft model's weights (--draft-model); 0: none.",
           (double)st.mem_draft_weights);
    metric(&b, "lamina_memory_draft_workspace_bytes", "gauge",
           "The draft model's workspace, buffers and guess distributions.", (double)st.mem_draft_workspace);
    metric(&b, "lamina_memory_draft_kv_bytes", "gauge", "The draft model's own KV pool.", (double)st.mem_draft_kv);
    metric(&b, "lamina_kv_max_tokens", "gauge", "Positions of context the KV pool holds.", (double)st.kv_max_tokens);
    metric(&b, "lamina_kv_max_seqs", "gauge", "Sequences of the full context the KV pool holds at once.",
           (double)st.kv_max_seqs);
    if (st.kv_local_blocks_total) { /* sliding-window layers: their own blocks */
        metric(&b, "lamina_kv_local_blocks_total", "gauge", "KV blocks of sliding-window layers in the pool.",
               (double)st.kv_local_blocks_total);
        metric(&b, "lamina_kv_local_blocks_used", "gauge", "KV blocks of sliding-window layers held by sequences.",
               (double)st.kv_local_blocks_used);
        metric(&b, "lamina_kv_local_blocks_free", "gauge", "KV blocks of sliding-window layers free.",
               (double)st.kv_local_blocks_free);
        metric(&b, "lamina_kv_local_blocks_cached", "gauge",
               "Free KV blocks of sliding-window layers kept for prefix reuse.", (double)st.kv_local_blocks_cached);
    }
    metric(&b, "lamina_prefix_cache_queries_total", "counter", "Prefix cache lookups.",
           (double)st.prefix_queries_total);
    metric(&b, "lamina_prefix_cache_hits_total", "counter", "Prefix cache hits.", (double)st.prefix_hits_total);
    metric(&b, "lamina_preemptions_total", "counter", "Sequences preempted for KV space.",
           (double)st.preemptions_total);
    metric(&b, "lamina_spec_proposed_tokens_total", "counter", "Speculative decoding: tokens proposed.",
           (double)st.spec_proposed_total);
    metric(&b, "lamina_spec_accepted_tokens_total", "counter", "Speculative decoding: proposed tokens accepted.",
           (double)st.spec_accepted_total);
    metric(&b, "lamina_spec_verify_steps_total", "counter", "Speculative decoding: passes that verified a proposal.",
           (double)st.spec_steps_total);
    metric(&b, "lamina_spec_state_rollbacks_total", "counter",
           "Speculative decoding on hybrid models: verifications that rolled the recurrent state back.",
           (double)st.spec_rollbacks_total);
    metric(&b, "lamina_spec_ckpt_short_total", "counter",
           "Speculative decoding on hybrid models: proposals cut short for want of free state checkpoints.",
           (double)st.spec_ckpt_short_total);
    metric(&b, "lamina_grammar_cache_bytes", "gauge", "Compiled grammars kept for reuse, with their matchers' caches.",
           (double)st.grammar_cache_bytes);
    metric(&b, "lamina_grammar_cache_entries", "gauge", "Compiled grammars kept for reuse.",
           (double)st.grammar_cache_entries);
    metric(&b, "lamina_grammar_compiles_total", "counter", "Grammars compiled (none kept for the same text).",
           (double)st.grammar_compiles_total);
    metric(&b, "lamina_grammar_cache_evictions_total", "counter", "Kept grammars dropped for room.",
           (double)st.grammar_evictions_total);
    histogram(&b, "lamina_batch_size", "Sequences per engine iteration.", &st.batch_size);
    histogram(&b, "lamina_time_to_first_token_seconds", "Submission to first token.", &st.ttft);
    histogram(&b, "lamina_time_per_output_token_seconds", "Time per output token after the first.", &st.tpot);
    histogram(&b, "lamina_request_duration_seconds", "Submission to finish.", &st.e2e);
    metric(&b, "lamina_http_connections", "gauge", "HTTP connections open.", (double)atomic_load(&s->conns.open));
    metric(&b, "lamina_http_connections_total", "counter", "HTTP connections accepted.",
           (double)atomic_load(&s->conns.total));
    metric(&b, "lamina_http_evictions_total", "counter",
           "Connections without a whole request closed to make room for a new one (--max-connections).",
           (double)atomic_load(&s->conns.evictions));
    metric(&b, "lamina_http_refused_total", "counter",
           "New connections closed at --max-connections when every other one had a request in progress.",
           (double)atomic_load(&s->conns.refused));
    metric(&b, "lamina_http_read_timeouts_total", "counter",
           "Connections closed for not sending a whole request within --read-timeout.",
           (double)atomic_load(&s->conns.read_timeouts));
    strbuf_puts(&b,
                "# HELP lamina_http_requests_total HTTP responses by status code.\n"
                "# TYPE lamina_http_requests_total counter\n");
    for (int code = 100; code < SRV_STATUS_MAX; code++) {
        uint64_t n = atomic_load(&s->http_status[code]);
        if (n) strbuf_printf(&b, "lamina_http_requests_total{code=\"%d\"} %llu\n", code, (unsigned long long)n);
    }
    int ret = b.failed
        ? MHD_NO
        : srv_respond(s, conn, 200, "text/plain; version=0.0.4; charset=utf-8", b.p ? b.p : "", b.len, NULL, NULL);
    strbuf_free(&b);
    return ret;
}

/* ----------------------------------------------------------------- routing */

/* Equal strings, in time that depends on their lengths only. */
static bool same_secret(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned char diff = la != lb;
    for (size_t i = 0; i < la; i++) diff |= (unsigned char)a[i] ^ (unsigned char)b[lb ? i % lb : 0];
    return diff == 0;
}

/* Whether the request carries an accepted key (or none is needed); *salt:
 * that key's prefix-cache salt. Every key is compared, so the time does not
 * tell which one matched. */
static bool authorized(lm_server *s, struct MHD_Connection *conn, uint64_t *salt) {
    *salt = 0;
    if (s->n_keys == 0) return true;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    h += 7;
    while (*h == ' ') h++;
    bool ok = false;
    for (int i = 0; i < s->n_keys; i++)
        if (same_secret(h, s->keys[i]) && !ok) {
            ok = true;
            *salt = s->key_salt[i];
        }
    return ok;
}

enum { R_NONE, R_HEALTH, R_METRICS, R_MODELS, R_MODEL, R_COMPLETIONS, R_CHAT, R_EMBED, R_PAGE };

static int route_of(const char *url) {
    if (!strcmp(url, "/health")) return R_HEALTH;
    if (!strcmp(url, "/metrics")) return R_METRICS;
    if (!strcmp(url, "/v1/models")) return R_MODELS;
    if (!strncmp(url, "/v1/models/", 11) && url[11]) return R_MODEL;
    if (!strcmp(url, "/v1/completions")) return R_COMPLETIONS;
    if (!strcmp(url, "/v1/chat/completions")) return R_CHAT;
    if (!strcmp(url, "/v1/embeddings")) return R_EMBED;
    if (webui_find(url)) return R_PAGE;
    return R_NONE;
}

/* Whether a request says it has a body (a Content-Length other than 0, or a
 * Transfer-Encoding). */
static bool has_body(struct MHD_Connection *conn) {
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
    if (cl && strspn(cl, "0 \t") != strlen(cl)) return true;
    return MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Transfer-Encoding") != NULL;
}

/* Answer a request from its headers, or set up a call for a generation
 * route (*req_cls) and wait for the body. */
static enum MHD_Result first_call(lm_server *s, struct MHD_Connection *conn, const char *url, const char *method,
                                  void **req_cls) {
    int n_headers = MHD_get_connection_values(conn, MHD_HEADER_KIND, NULL, NULL);
    if (n_headers > s->cfg.max_headers)
        return srv_respond_errf(s, conn, 431, "invalid_request_error", "too_many_headers", "Connection", "close",
                                "The request has %d header lines; the server takes at most %d.", n_headers,
                                s->cfg.max_headers);
    int route = route_of(url);
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (atomic_load(&s->quiesced) && route != R_HEALTH)
        return srv_respond_errf(s, conn, 503, "server_error", "shutting_down", "Connection", "close",
                                "The server is shutting down.");
    uint64_t salt = 0;
    if (!strncmp(url, "/v1/", 4) && !authorized(s, conn, &salt))
        return srv_respond_errf(s, conn, 401, "invalid_request_error", "invalid_api_key", "WWW-Authenticate", "Bearer",
                                "Incorrect or missing API key: send 'Authorization: Bearer KEY'.");
    if (route == R_NONE)
        return srv_respond_errf(s, conn, 404, "invalid_request_error", "not_found", NULL, NULL,
                                "Unknown route %.8s %.200s", method, url);
    bool gen = route == R_COMPLETIONS || route == R_CHAT || route == R_EMBED;
    if (gen ? !post : !get)
        return srv_respond_errf(s, conn, 405, "invalid_request_error", "method_not_allowed", "Allow",
                                gen ? "POST" : "GET, HEAD", "Method %.8s is not allowed on %.200s (use %s)", method,
                                url, gen ? "POST" : "GET");
    if (route == R_HEALTH) return route_health(s, conn);
    if (route == R_METRICS) return route_metrics(s, conn);
    if (route == R_MODELS) return route_models(s, conn, NULL);
    if (route == R_MODEL) return route_models(s, conn, url + 11);
    if (route == R_PAGE) return webui_respond(s, conn, webui_find(url));
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
    if (cl) {
        char *end;
        unsigned long long n = strtoull(cl, &end, 10);
        if (n > s->cfg.max_body)
            return srv_respond_errf(s, conn, 413, "invalid_request_error", "request_too_large", "Connection", "close",
                                    "The request body is larger than the server's limit of %zu bytes.",
                                    s->cfg.max_body);
    }
    srv_call *c = call_new(s, conn, route == R_CHAT);
    if (!c) return MHD_NO;
    c->tenant_salt = salt;
    c->embed = route == R_EMBED;
    *req_cls = c;
    return MHD_YES;
}

/* *req_cls of a request without a body between the library's first call
 * (headers) and its second (the request complete). */
static char deferred;

/*
 * The library calls this once with the headers, then with each piece of the
 * body, then once more with none. A request without a body is answered at
 * that last call: an answer queued at the first call makes the library
 * close the connection after it (libmicrohttpd 0.9.75 then discards what
 * follows), which would drop pipelined requests and kept-alive GETs. A
 * request with a body that is refused from its headers alone (401, 404,
 * 405, 413, 431) is answered at once, and the connection closes without
 * reading the body.
 */
static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                 const char *version, const char *upload_data, size_t *upload_data_size,
                                 void **req_cls) {
    lm_server *s = cls;
    (void)version;
    if (!*req_cls && !has_body(conn)) {
        *req_cls = &deferred;
        return MHD_YES;
    }
    if (*req_cls == &deferred) {
        *req_cls = NULL;
        conn_guard_received(&s->conns, conn);
        enum MHD_Result ret = first_call(s, conn, url, method, req_cls);
        if (!*req_cls) return ret;
        /* a generation route without a body: run it (the parser answers 400) */
    } else if (!*req_cls) {
        enum MHD_Result ret = first_call(s, conn, url, method, req_cls);
        if (!*req_cls) conn_guard_received(&s->conns, conn);
        return ret;
    }
    srv_call *c = *req_cls;
    if (*upload_data_size) {
        if (!c->too_big && c->body.len + *upload_data_size > s->cfg.max_body) {
            c->too_big = true;
            strbuf_free(&c->body);
        }
        if (!c->too_big) strbuf_put(&c->body, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    conn_guard_received(&s->conns, conn);
    if (c->too_big)
        return srv_respond_errf(s, conn, 413, "invalid_request_error", "request_too_large", "Connection", "close",
                                "The request body is larger than the server's limit of %zu bytes.", s->cfg.max_body);
    if (c->body.failed)
        return srv_respond_errf(s, conn, 500, "server_error", NULL, NULL, NULL, "out of memory reading the request");
    return call_run(c);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls, enum MHD_RequestTerminationCode toe) {
    lm_server *s = cls;
    conn_guard_done(&s->conns, conn);
    srv_call *c = *req_cls;
    if (*req_cls == &deferred) *req_cls = NULL, c = NULL;
    if (!c) return;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) c->disconnected = true;
    call_free(c); /* cancels what still generates and waits for its final events */
    *req_cls = NULL;
}

static void on_log(void *cls, const char *fmt, va_list ap) {
    lm_server *s = cls;
    if (!s->starting) return;
    vsnprintf(s->start_error, sizeof s->start_error, fmt, ap);
    size_t n = strlen(s->start_error);
    while (n && (s->start_error[n - 1] == '\n' || s->start_error[n - 1] == '\r')) s->start_error[--n] = 0;
}

/* ------------------------------------------------------------------ set-up */

void server_config_default(lm_server_config *c) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8080;
    c->max_body = 1 << 20;
    c->max_n = 16;
    c->timeout = 600;
    c->keepalive = 3;
    c->idle_timeout = 60;
    c->stream_buffer = 4 << 20;
    c->max_connections = 512;
    c->max_conn_per_ip = 256;
    c->conn_memory = 32 << 10;
    c->read_timeout = 30;
    c->max_headers = 100;
    c->pooling = LM_POOL_DEFAULT;
    sample_params_default(&c->sampling);
}

static char *dup_or_null(const char *s) { return s ? lm_strndup(s, strlen(s)) : NULL; }

static void free_strings(lm_server *s) {
    lm_free(s->host);
    for (int i = 0; i < s->n_keys; i++) lm_free(s->keys[i]);
    lm_free(s->keys);
    lm_free(s->key_salt);
    lm_free(s->model_name);
    lm_free(s->tmpl_name);
    lm_free(s->tmpl_text);
    chat_template_free(&s->chat);
}

/* The accepted keys (api_key, then api_keys; empty ones skipped) and their
 * salts; false when out of memory. */
static bool set_keys(lm_server *s, const lm_server_config *c) {
    int n = 1 + (c->api_keys && c->n_api_keys > 0 ? c->n_api_keys : 0);
    s->keys = lm_calloc((size_t)n, sizeof *s->keys);
    s->key_salt = lm_calloc((size_t)n, sizeof *s->key_salt);
    if (!s->keys || !s->key_salt) return false;
    for (int i = 0; i < n; i++) {
        const char *k = i == 0 ? c->api_key : c->api_keys[i - 1];
        if (!k || !k[0]) continue;
        if (!(s->keys[s->n_keys] = dup_or_null(k))) return false;
        s->key_salt[s->n_keys++] = server_tenant_salt(k);
    }
    return true;
}

/* Bind address: the first that getaddrinfo gives for the host. */
static int start_daemon(lm_server *s, char *err, size_t errlen) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", s->cfg.port);
    int gai = getaddrinfo(s->host, port, &hints, &ai);
    if (gai || !ai) return lm_err(err, errlen, "cannot resolve '%s': %s", s->host, gai_strerror(gai));
    unsigned flags = MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->starting = true;
    s->daemon =
        MHD_start_daemon(flags, (uint16_t)s->cfg.port, NULL, NULL, on_access, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, conn_guard_notify,
                         &s->conns, MHD_OPTION_CONNECTION_LIMIT, CONN_GUARD_DAEMON_LIMIT(s->cfg.max_connections),
                         MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->cfg.max_conn_per_ip,
                         MHD_OPTION_CONNECTION_MEMORY_LIMIT, s->cfg.conn_memory, MHD_OPTION_CONNECTION_TIMEOUT,
                         (unsigned)s->cfg.idle_timeout, MHD_OPTION_EXTERNAL_LOGGER, on_log, s, MHD_OPTION_END);
    freeaddrinfo(ai);
    s->starting = false;
    if (!s->daemon)
        return lm_err(err, errlen, "cannot listen on %s:%d%s%s", s->host, s->cfg.port, s->start_error[0] ? ": " : "",
                      s->start_error);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->cfg.port;
    return 0;
}

lm_server *server_new(lm_engine *e, const lm_server_config *c, char *err, size_t errlen) {
    srv_json_init();
    lm_server *s = lm_calloc(1, sizeof *s);
    if (!s) return lm_err(err, errlen, "out of memory"), NULL;
    s->cfg = *c;
    s->cfg.api_key = NULL, s->cfg.api_keys = NULL, s->cfg.n_api_keys = 0; /* copied into keys */
    if (!s->cfg.host) s->cfg.host = "127.0.0.1";
    if (!s->cfg.max_body) s->cfg.max_body = 1 << 20;
    if (s->cfg.max_n < 1) s->cfg.max_n = 16;
    if (!(s->cfg.keepalive > 0)) s->cfg.keepalive = 3;
    if (s->cfg.idle_timeout < 1) s->cfg.idle_timeout = 60;
    if (!s->cfg.stream_buffer) s->cfg.stream_buffer = 4 << 20;
    if (s->cfg.max_connections < 1) s->cfg.max_connections = 512;
    if (s->cfg.max_conn_per_ip < 0) s->cfg.max_conn_per_ip = 0;
    if (!s->cfg.conn_memory) s->cfg.conn_memory = 32 << 10;
    if (s->cfg.conn_memory < 8 << 10) s->cfg.conn_memory = 8 << 10;
    if (!(s->cfg.read_timeout > 0)) s->cfg.read_timeout = 0;
    if (s->cfg.max_headers < 1) s->cfg.max_headers = 100;
    s->host = dup_or_null(s->cfg.host);
    bool keys_ok = set_keys(s, c);
    s->model_name = dup_or_null(c->model_name ? c->model_name : "lamina");
    s->tmpl_name = dup_or_null(c->chat_template);
    s->tmpl_text = dup_or_null(c->chat_template_text);
    if (!s->host || !s->model_name || !keys_ok || (c->chat_template && !s->tmpl_name) ||
        (c->chat_template_text && !s->tmpl_text)) {
        free_strings(s);
        lm_free(s);
        return lm_err(err, errlen, "out of memory"), NULL;
    }
    s->started = (long long)time(NULL);
    s->id_salt = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid() << 32 ^ (uint64_t)(lm_now() * 1e9);
    if (conn_guard_start(&s->conns, s->cfg.read_timeout, s->cfg.max_connections, err, errlen) ||
        start_daemon(s, err, errlen)) {
        conn_guard_stop(&s->conns);
        free_strings(s);
        lm_free(s);
        return NULL;
    }
    if (e && server_set_engine(s, e, err, errlen)) {
        server_free(s);
        return NULL;
    }
    return s;
}

/* Chat template: the named family, a template file's text, or the model's
 * own (chat_template_resolve). */
static void resolve_chat(lm_server *s, const lm_model *m) {
    lm_server_parse_ctx *p = &s->pctx;
    char err[200];
    chat_template_free(&s->chat);
    int rc = chat_template_resolve(&s->chat, m->gguf, s->tmpl_name, s->tmpl_text, err, sizeof err);
    p->chat_family = s->chat.family;
    p->chat_template = s->chat.text;
    if (rc == CHAT_NONE)
        snprintf(s->chat_error, sizeof s->chat_error,
                 "%.180s; start the server with --chat-template NAME|FILE to "
                 "enable chat",
                 err);
    else if (rc) snprintf(s->chat_error, sizeof s->chat_error, "%.180s", err);
}

/* Embeddings: the pooling requests ask for (the server's --pooling, else
 * the model's) and, when there is none, why embeddings requests fail. */
static void resolve_embed(lm_server *s, const lm_model *m) {
    lm_server_parse_ctx *p = &s->pctx;
    p->n_embd = lm_model_embd_dim(m);
    bool forced = s->cfg.pooling == LM_POOL_MEAN || s->cfg.pooling == LM_POOL_CLS || s->cfg.pooling == LM_POOL_LAST;
    s->embed_pooling = forced ? s->cfg.pooling : m->hp.pooling;
    s->embed_error[0] = 0;
    if (s->embed_pooling == LM_POOL_NONE)
        snprintf(s->embed_error, sizeof s->embed_error,
                 "The model '%.100s' is a generative model: its file names no pooling (pooling_type), so it "
                 "has no embeddings of its own. Start the server with --pooling mean|cls|last to embed with "
                 "its pooled hidden states.",
                 s->model_name);
    p->embed_error = s->embed_error[0] ? s->embed_error : NULL;
}

int server_set_engine(lm_server *s, lm_engine *e, char *err, size_t errlen) {
    if (!e) return lm_err(err, errlen, "no engine");
    if (atomic_load(&s->engine)) return lm_err(err, errlen, "the server already has an engine");
    lm_server_parse_ctx *p = &s->pctx;
    p->tok = engine_tokenizer(e);
    p->n_ctx = engine_n_ctx(e);
    p->model_name = s->model_name;
    p->max_n = s->cfg.max_n;
    p->max_tokens_cap = s->cfg.max_tokens_cap;
    p->max_tokens_default = s->cfg.max_tokens_default;
    p->sampling = &s->cfg.sampling;
    p->max_seqs = engine_max_seqs(e);
    p->reasoning_inline = s->cfg.reasoning_inline;
    s->chat_error[0] = 0;
    resolve_chat(s, engine_model(e));
    p->chat_error = s->chat_error[0] ? s->chat_error : NULL;
    resolve_embed(s, engine_model(e));
    if (p->chat_error && s->cfg.log) {
        char line[400];
        snprintf(line, sizeof line, "chat requests will fail: %s", s->chat_error);
        s->cfg.log(s->cfg.log_user, line);
    }
    atomic_store(&s->engine, e);
    return 0;
}

int server_port(const lm_server *s) { return s->port; }

void server_quiesce(lm_server *s) {
    if (atomic_exchange(&s->quiesced, true) || !s->daemon) return;
    MHD_socket ls = MHD_quiesce_daemon(s->daemon); /* the listening socket is ours to close */
    if (ls != MHD_INVALID_SOCKET) close(ls);
}

int server_active_calls(lm_server *s) { return atomic_load(&s->calls); }

void server_free(lm_server *s) {
    if (!s) return;
    server_quiesce(s);
    atomic_store(&s->stopping, true); /* the calls left are cancelled and answered */
    for (int i = 0; i < 500 && atomic_load(&s->calls) > 0; i++) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    if (s->daemon) MHD_stop_daemon(s->daemon);
    conn_guard_stop(&s->conns); /* after the library: its closed notices take the guard's mutex */
    free_strings(s);
    lm_free(s);
}
