/*
 * server_gen.c - one generation request from submission to the last byte.
 *
 * Flow. call_run submits one engine request per prompt (n choices each,
 * choice index = prompt * n + the event's index), then either waits for
 * every final event and answers with one JSON object, or hands the HTTP
 * library a content reader that turns events into Server-Sent Events as they
 * come.
 *
 * The engine thread only runs on_event: it copies the event into the call's
 * queue under call->mu and signals. The queue is bounded (the
 * configuration's stream_buffer): past the bound, token events are dropped,
 * the call is marked overflowed and its engine requests are cancelled (the
 * engine allows engine_cancel from a callback). Final events are always
 * recorded, in srv_fin, so the count of final events is exact whatever the
 * memory does.
 *
 * What a stream whose client does not read holds, at most: the kernel's
 * socket buffer (net.ipv4.tcp_wmem, about 3-4 MiB on loopback), the HTTP
 * library's block (16 KiB), the formatted SSE of one take of the queue
 * (stream_read formats the whole queue, but only once the previous take is
 * all handed over: a few times stream_buffer at most, the JSON of a token
 * with logprobs being larger than its queued event), and the queue itself
 * up to stream_buffer, where the request is cancelled. The connection then
 * closes at the idle timeout (no byte sent for that long), or once the
 * client has read what is left.
 *
 * Reasoning. A chat request whose template reasons (req.reason_split)
 * runs each choice's text through a reasoning splitter (text/reasoning.h):
 * streamed, one splitter per choice (srv_choice.rs) turns its pieces into
 * reasoning_content deltas, content (read for calls with tools) and
 * harmony's call deltas, in order; whole, a fresh splitter reads the whole
 * text with the same rules, so both agree.
 *
 * Waiting (call_wait) happens on the connection's thread in slices of at
 * most 250 ms; between slices it checks for a server shutdown, the request
 * timeout and a peer that closed its socket, and cancels when one of them
 * happened. Cancelled requests still deliver their final events; call_free
 * waits for them before freeing anything the engine could touch.
 */
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "serve/http.h"
#include "serve/server_int.h"
#include "base/util.h"

#define WAIT_SLICE 0.25

/* ------------------------------------------------------------ the callback */

static size_t queue_bytes(const srv_queue *q) {
    return q->text.len + q->n_ev * sizeof(srv_ev) + q->n_top * (sizeof(int32_t) + sizeof(float));
}

/* Append one event; false when memory ran out. Under call->mu. */
static bool queue_push(srv_queue *q, int choice, const lm_event *ev) {
    if (q->n_ev == q->cap_ev) {
        size_t cap = q->cap_ev ? q->cap_ev * 2 : 64;
        srv_ev *p = lm_realloc(q->ev, cap * sizeof *p);
        if (!p) return false;
        q->ev = p, q->cap_ev = cap;
    }
    int n_top = ev->n_top > 0 && ev->top_ids && ev->top_logprobs ? ev->n_top : 0;
    if (n_top > LM_MAX_TOP_LOGPROBS) n_top = LM_MAX_TOP_LOGPROBS;
    if (q->n_top + (size_t)n_top > q->cap_top) {
        size_t cap = q->cap_top ? q->cap_top * 2 : 256;
        while (cap < q->n_top + (size_t)n_top) cap *= 2;
        int32_t *ids = lm_realloc(q->top_ids, cap * sizeof *ids);
        if (!ids) return false;
        q->top_ids = ids;
        float *lps = lm_realloc(q->top_lps, cap * sizeof *lps);
        if (!lps) return false;
        q->top_lps = lps, q->cap_top = cap;
    }
    size_t text_off = q->text.len;
    if (ev->text_len && ev->text) strbuf_put(&q->text, ev->text, ev->text_len);
    if (q->text.failed) return false;
    srv_ev *r = &q->ev[q->n_ev++];
    *r = (srv_ev){.choice = choice,
                  .token = ev->token,
                  .logprob = ev->logprob,
                  .n_top = n_top,
                  .top_off = q->n_top,
                  .text_off = text_off,
                  .text_len = q->text.len - text_off,
                  .done = ev->done,
                  .finish = ev->finish};
    if (ev->done && ev->stats) r->stats = *ev->stats;
    if (n_top) {
        memcpy(q->top_ids + q->n_top, ev->top_ids, (size_t)n_top * sizeof(int32_t));
        memcpy(q->top_lps + q->n_top, ev->top_logprobs, (size_t)n_top * sizeof(float));
        q->n_top += (size_t)n_top;
    }
    return true;
}

/* Engine thread: copy the event, signal, never block on the client. */
static void on_event(void *user, const lm_event *ev) {
    srv_sub *sb = user;
    srv_call *c = sb->call;
    lm_request *to_cancel[SERVER_MAX_PROMPTS];
    int n_cancel = 0;
    pthread_mutex_lock(&c->mu);
    int choice = sb->prompt * c->req.p.n + ev->index;
    bool valid = ev->index >= 0 && ev->index < c->req.p.n && choice < c->n_choices;
    if (valid && (ev->done || !c->overflow)) {
        bool ok = queue_push(&c->q, choice, ev);
        if (!ev->done && (!ok || queue_bytes(&c->q) > c->srv->cfg.stream_buffer) && !c->overflow) {
            c->overflow = true;
            for (int i = 0; i < c->n_subs; i++)
                if (c->subs[i].handle) to_cancel[n_cancel++] = c->subs[i].handle;
        }
    }
    if (valid && ev->done && !c->fin[choice].done) {
        c->fin[choice] = (srv_fin){.done = true, .finish = ev->finish};
        if (ev->stats) c->fin[choice].stats = *ev->stats;
        c->n_final++;
        if (ev->finish == LM_FINISH_ERROR && !c->error[0]) {
            snprintf(c->error, sizeof c->error, "%s", ev->error ? ev->error : "generation failed");
            c->error_status = ev->status;
        }
    }
    /* c may be freed once the lock is released after its last final event;
     * this event is not final when there is something to cancel, so the
     * handles stay valid, but nothing of c is read after the unlock */
    lm_engine *eng = c->engine;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < n_cancel; i++) engine_cancel(eng, to_cancel[i]);
}

/* ------------------------------------------------------------ fairness */

/* Who sent the call, for the engine's fairness between clients: its API key
 * (the key's salt) when the server has keys, else its address (not the
 * port: one client's connections are one client). Never 0. */
uint64_t srv_call_client(const srv_call *c) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a over what names the client */
    const unsigned char *b = NULL;
    size_t n = 0;
    if (c->tenant_salt) {
        b = (const unsigned char *)&c->tenant_salt, n = sizeof c->tenant_salt;
    } else {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        const struct sockaddr *sa = ci ? ci->client_addr : NULL;
        if (sa && sa->sa_family == AF_INET)
            b = (const unsigned char *)&((const struct sockaddr_in *)sa)->sin_addr, n = 4;
        else if (sa && sa->sa_family == AF_INET6)
            b = (const unsigned char *)&((const struct sockaddr_in6 *)sa)->sin6_addr, n = 16;
    }
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h ? h : 1;
}

/* ------------------------------------------------------------ call objects */

srv_call *call_new(lm_server *s, struct MHD_Connection *conn, bool chat) {
    srv_call *c = lm_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->srv = s;
    c->conn = conn;
    c->chat = chat;
    c->t_start = lm_now();
    if (pthread_mutex_init(&c->mu, NULL)) {
        lm_free(c);
        return NULL;
    }
    if (pthread_cond_init(&c->cv, NULL)) {
        pthread_mutex_destroy(&c->mu);
        lm_free(c);
        return NULL;
    }
    c->sync_init = true;
    atomic_fetch_add(&s->calls, 1);
    return c;
}

static void cancel_all(srv_call *c) {
    lm_request *h[SERVER_MAX_PROMPTS];
    int n = 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n_subs; i++)
        if (c->subs[i].handle) h[n++] = c->subs[i].handle;
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < n; i++) engine_cancel(c->engine, h[i]);
    c->cancelled = true;
}

static void queue_free(srv_queue *q) {
    lm_free(q->ev);
    strbuf_free(&q->text);
    lm_free(q->top_ids);
    lm_free(q->top_lps);
    memset(q, 0, sizeof *q);
}

void call_free(srv_call *c) {
    if (!c) return;
    if (c->emb) embed_call_free(c); /* its engine requests ended and released */
    if (c->n_subs) {
        int expected = c->n_subs * c->req.p.n;
        pthread_mutex_lock(&c->mu);
        bool all = c->n_final >= expected;
        pthread_mutex_unlock(&c->mu);
        if (!all) cancel_all(c);
        pthread_mutex_lock(&c->mu);
        while (c->n_final < expected) pthread_cond_wait(&c->cv, &c->mu);
        pthread_mutex_unlock(&c->mu);
        for (int i = 0; i < c->n_subs; i++) engine_request_release(c->engine, c->subs[i].handle);
    }
    for (int i = 0; i < c->n_choices && c->ch; i++) {
        strbuf_free(&c->ch[i].text);
        srv_tc_free(&c->ch[i].tc);
        reason_free(&c->ch[i].rs);
        cJSON_Delete(c->ch[i].lp);
    }
    lm_free(c->ch);
    lm_free(c->fin);
    lm_free(c->subs);
    queue_free(&c->q);
    strbuf_free(&c->out);
    strbuf_free(&c->body);
    server_request_free(&c->req);
    if (c->sync_init) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
    }
    lm_server *srv = c->srv;
    lm_free(c);
    atomic_fetch_sub(&srv->calls, 1);
}

/* ------------------------------------------------------------- submission */

/* An engine's refusal as an HTTP error, by its status alone: busy 429,
 * out of memory 503, too long 400 context_length_exceeded (about the prompt:
 * the parser already held max_tokens and n to the engine's limits), any
 * other field 400, anything else 500. */
int srv_status_error(lm_server_error *e, lm_status rc, const char *prompt_param, const char *err) {
    switch (rc) {
        case LM_ERR_BUSY:
            return server_error(e, 429, "rate_limit_error", NULL, "server_busy",
                                "The server is busy (%s); retry later.", err);
        case LM_ERR_TOO_LONG:
            return server_error(e, 400, "invalid_request_error", prompt_param, "context_length_exceeded", "%s", err);
        case LM_ERR_NOMEM: return server_error(e, 503, "server_error", NULL, NULL, "%s", err);
        case LM_ERR_INVALID: return server_error(e, 400, "invalid_request_error", NULL, NULL, "%s", err);
        default: return server_error(e, 500, "server_error", NULL, NULL, "%s", err);
    }
}

/* Submit every prompt; 0, or -1 with *e (429 busy, 400 too big or invalid). */
static int submit_all(srv_call *c, lm_server_error *e) {
    lm_server_request *r = &c->req;
    uint64_t seed = r->p.sp.seed;
    if (!r->seed_given) {
        /* a fresh seed per call: splitmix64 of a counter and the start time */
        uint64_t z = c->srv->id_salt + 0x9e3779b97f4a7c15ull * (atomic_fetch_add(&c->srv->next_id, 1) + 1);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        seed = z ^ (z >> 31);
    }
    for (int i = 0; i < r->n_prompts; i++) {
        lm_request_params p = r->p;
        p.prompt = r->prompts[i];
        p.n_prompt = r->n_prompt[i];
        p.cache_salt = server_request_salt(c->tenant_salt, r);
        p.client = srv_call_client(c);
        p.sp.seed = seed + (uint64_t)i * (uint64_t)r->p.n;
        p.stop = (const char *const *)r->stops;
        p.grammar = r->grammar;
        p.grammar_triggers = r->n_grammar_triggers ? (const char *const *)r->grammar_triggers : NULL;
        p.n_grammar_triggers = r->n_grammar_triggers;
        p.special_text = r->reason_syntax == REASON_HARMONY; /* its channels' markers */
        p.on_event = on_event;
        p.user = &c->subs[i];
        lm_request *h = NULL;
        char err[LM_ERRLEN];
        lm_status rc = engine_submit(c->engine, &p, &h, err, sizeof err);
        if (rc != LM_OK) return srv_status_error(e, rc, c->chat ? "messages" : "prompt", err);
        pthread_mutex_lock(&c->mu);
        c->subs[i].handle = h;
        c->n_subs = i + 1;
        bool overflow = c->overflow;
        pthread_mutex_unlock(&c->mu);
        if (overflow) engine_cancel(c->engine, h);
    }
    return 0;
}

/* --------------------------------------------------------------- waiting */

bool srv_call_ended(srv_call *c) {
    lm_server *s = c->srv;
    if (atomic_load(&s->stopping)) return true;
    if (s->cfg.timeout > 0 && lm_now() - c->t_start > s->cfg.timeout) return c->timed_out = true;
    if (srv_peer_gone(c->conn)) return c->disconnected = true;
    return false;
}

/* Between waits: shut down, timed out or abandoned calls are cancelled. */
static void check_abort(srv_call *c) {
    if (!c->cancelled && srv_call_ended(c)) cancel_all(c);
}

/* Wait up to `wait` seconds for events, then take the whole queue into
 * *mine (emptied first). Returns true when every final event is in (and so
 * in *mine or already taken). */
static bool call_wait(srv_call *c, srv_queue *mine, double wait, bool *overflow) {
    mine->n_ev = 0, mine->n_top = 0, mine->text.len = 0, mine->text.failed = false;
    check_abort(c); /* also when events keep coming and the loop below never sleeps */
    double until = lm_now() + wait;
    int expected = c->n_subs * c->req.p.n;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        if (c->q.n_ev > 0 || c->n_final >= expected) break;
        double now = lm_now();
        if (now >= until) break;
        double slice = until - now < WAIT_SLICE ? until - now : WAIT_SLICE;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double t = (double)ts.tv_nsec * 1e-9 + slice;
        ts.tv_sec += (time_t)t;
        ts.tv_nsec = (long)((t - floor(t)) * 1e9);
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        pthread_mutex_unlock(&c->mu);
        check_abort(c);
        pthread_mutex_lock(&c->mu);
    }
    srv_queue tmp = c->q;
    c->q = *mine;
    *mine = tmp;
    bool all = c->n_final >= expected;
    *overflow = c->overflow;
    pthread_mutex_unlock(&c->mu);
    return all;
}

/* Choices whose final event did not make it into the queue (no memory)
 * take their end from srv_fin. */
static void settle_finals(srv_call *c) {
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n_choices; i++)
        if (c->fin[i].done && !c->ch[i].done) {
            c->ch[i].done = true;
            c->ch[i].finish = c->fin[i].finish;
            c->ch[i].stats = c->fin[i].stats;
        }
    pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------ JSON pieces */

/*
 * The finish reason a client sees. OpenAI's values where they apply:
 * "stop" (an end-of-generation token or a stop string) and "length"
 * (max_tokens or the context reached). A choice the server cancelled when
 * the request ran past its timeout reports "abort", vLLM's value for an
 * aborted request, so a client can tell an answer cut short from one that
 * reached its length. Errors never get here: the answer is an error object
 * (engine_error), and other cancellations (shutdown, a stream the client
 * does not read, a client gone) end the same way or with no answer at all.
 */
static const char *finish_reason(lm_finish f) {
    switch (f) {
        case LM_FINISH_STOP: return "stop";
        case LM_FINISH_LENGTH: return "length";
        default: return "abort";
    }
}

/* An engine error (a choice's LM_FINISH_ERROR) as an HTTP error, by its
 * status: the request's own fault 400 (e.g. a logit_bias that bans every
 * token), out of memory 503, anything else 500. */
static void engine_error(const srv_call *c, lm_server_error *e) {
    switch (c->error_status) {
        case LM_ERR_INVALID: server_error(e, 400, "invalid_request_error", NULL, NULL, "%s", c->error); break;
        case LM_ERR_TOO_LONG:
            server_error(e, 400, "invalid_request_error", c->chat ? "messages" : "prompt", "context_length_exceeded",
                         "%s", c->error);
            break;
        case LM_ERR_NOMEM: server_error(e, 503, "server_error", NULL, NULL, "%s", c->error); break;
        default: server_error(e, 500, "server_error", NULL, NULL, "%s", c->error);
    }
}

/* A log-probability as JSON allows it (no infinities). */
static double json_lp(float lp) { return isfinite(lp) ? (double)lp : -9999.0; }

/* A token's text, made valid UTF-8, as a cJSON string; raw bytes in *raw. */
static cJSON *token_string(const lm_tokenizer *tok, int32_t id, char *raw, int *n_raw) {
    char buf[512];
    int n = tok_token_bytes(tok, id, true, buf, sizeof buf);
    if (n < 0) n = 0;
    if (n > (int)sizeof buf) n = (int)sizeof buf;
    memcpy(raw, buf, (size_t)n);
    *n_raw = n;
    strbuf s = {0};
    strbuf_put_utf8(&s, buf, (size_t)n, true);
    cJSON *j = cJSON_CreateString(s.p ? s.p : "");
    strbuf_free(&s);
    return j;
}

static cJSON *bytes_array(const char *raw, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)raw[i]));
    return a;
}

/* Chat logprobs entry: {"token", "logprob", "bytes", "top_logprobs": [...]}. */
static cJSON *chat_lp_entry(const lm_tokenizer *tok, const srv_ev *ev, const srv_queue *q) {
    char raw[512];
    int n_raw;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "token", token_string(tok, ev->token, raw, &n_raw));
    cJSON_AddNumberToObject(o, "logprob", json_lp(ev->logprob));
    cJSON_AddItemToObject(o, "bytes", bytes_array(raw, n_raw));
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
    for (int k = 0; k < ev->n_top; k++) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddItemToObject(t, "token", token_string(tok, q->top_ids[ev->top_off + (size_t)k], raw, &n_raw));
        cJSON_AddNumberToObject(t, "logprob", json_lp(q->top_lps[ev->top_off + (size_t)k]));
        cJSON_AddItemToObject(t, "bytes", bytes_array(raw, n_raw));
        cJSON_AddItemToArray(tops, t);
    }
    return o;
}

/* Completions logprobs: add one token to the four parallel arrays of lp. */
static void completion_lp_add(cJSON *lp, const lm_tokenizer *tok, const srv_ev *ev, const srv_queue *q, size_t offset) {
    char raw[512];
    int n_raw;
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "tokens"), token_string(tok, ev->token, raw, &n_raw));
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "token_logprobs"), cJSON_CreateNumber(json_lp(ev->logprob)));
    cJSON *top = cJSON_CreateObject();
    for (int k = 0; k < ev->n_top; k++) {
        cJSON *name = token_string(tok, q->top_ids[ev->top_off + (size_t)k], raw, &n_raw);
        const char *key = cJSON_GetStringValue(name);
        if (key && !cJSON_GetObjectItemCaseSensitive(top, key))
            cJSON_AddNumberToObject(top, key, json_lp(q->top_lps[ev->top_off + (size_t)k]));
        cJSON_Delete(name);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "top_logprobs"), top);
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "text_offset"), cJSON_CreateNumber((double)offset));
}

static cJSON *completion_lp_new(void) {
    cJSON *lp = cJSON_CreateObject();
    cJSON_AddArrayToObject(lp, "tokens");
    cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON_AddArrayToObject(lp, "top_logprobs");
    cJSON_AddArrayToObject(lp, "text_offset");
    return lp;
}

/* Logprobs of one token event in the route's shape (a fresh object). */
static cJSON *event_logprobs(srv_call *c, const srv_ev *ev, const srv_queue *q, size_t offset) {
    const lm_tokenizer *tok = engine_tokenizer(c->engine);
    if (c->chat) {
        cJSON *lp = cJSON_CreateObject();
        cJSON *content = cJSON_AddArrayToObject(lp, "content");
        cJSON_AddItemToArray(content, chat_lp_entry(tok, ev, q));
        return lp;
    }
    cJSON *lp = completion_lp_new();
    completion_lp_add(lp, tok, ev, q, offset);
    return lp;
}

static cJSON *usage_json(const srv_call *c) {
    long long prompt = 0, completion = 0, cached = 0;
    for (int i = 0; i < c->req.n_prompts; i++) prompt += c->req.n_prompt[i];
    for (int i = 0; i < c->n_choices; i++) {
        completion += c->ch[i].stats.completion_tokens;
        if (i % c->req.p.n == 0) cached += c->ch[i].stats.cached_tokens;
    }
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + completion));
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", (double)cached);
    return u;
}

/* {"id", "object", "created", "model"} of every answer and chunk. */
static cJSON *envelope(const srv_call *c, const char *object) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)c->created);
    cJSON_AddStringToObject(o, "model", c->srv->model_name);
    cJSON_AddNullToObject(o, "system_fingerprint");
    return o;
}

/* ------------------------------------------------------- whole answers */

/* Fold one event into its choice (non-streaming). */
static void absorb(srv_call *c, const srv_ev *ev, const srv_queue *q) {
    if (ev->choice < 0 || ev->choice >= c->n_choices) return;
    srv_choice *ch = &c->ch[ev->choice];
    size_t offset = ch->text.len;
    if (ev->text_len) strbuf_put(&ch->text, q->text.p + ev->text_off, ev->text_len);
    if (ev->done) {
        ch->done = true;
        ch->finish = ev->finish;
        ch->stats = ev->stats;
        return;
    }
    if (!c->req.p.logprobs || ev->token < 0) return;
    const lm_tokenizer *tok = engine_tokenizer(c->engine);
    if (c->chat) {
        if (!ch->lp) ch->lp = cJSON_CreateArray();
        cJSON_AddItemToArray(ch->lp, chat_lp_entry(tok, ev, q));
    } else {
        if (!ch->lp) ch->lp = completion_lp_new();
        size_t echo = c->req.echo_text && c->req.echo_text[ev->choice / c->req.p.n]
            ? strlen(c->req.echo_text[ev->choice / c->req.p.n])
            : 0;
        completion_lp_add(ch->lp, tok, ev, q, echo + offset);
    }
}

/* A tool call's JSON: {"id", "type": "function", "function": {"name", "arguments"}};
 * stream: the first delta, with "index" and empty arguments. */
static cJSON *call_json(const srv_call *c, int choice, int index, const char *name, const char *args, bool stream) {
    char id[40];
    srv_tc_call_id(c->id, choice, index, c->req.tool_syntax, id, sizeof id);
    cJSON *o = cJSON_CreateObject();
    if (stream) cJSON_AddNumberToObject(o, "index", index);
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "type", "function");
    cJSON *f = cJSON_AddObjectToObject(o, "function");
    cJSON_AddStringToObject(f, "name", name);
    cJSON_AddStringToObject(f, "arguments", args);
    return o;
}

/* A chat choice's message when tools may be called: the text read for calls
 * (content null when the calls are all there is). Returns whether any call
 * was made. */
static bool whole_tool_message(srv_call *c, int i, cJSON *j, const strbuf *text) {
    srv_tc tc;
    srv_tc_out o = {0};
    srv_tc_init(&tc, c->req.tool_syntax, c->req.tool_strings);
    srv_tc_feed(&tc, text->p ? text->p : "", text->len, true, &o);
    srv_tc_free(&tc);
    cJSON *m = cJSON_AddObjectToObject(j, "message");
    cJSON_AddStringToObject(m, "role", "assistant");
    /* the events in order: a name opens a call, pieces extend its arguments */
    int n_calls = 0;
    for (int k = 0; k < o.n; k++)
        if (o.ev[k].name) n_calls++;
    if (n_calls && !o.content.len) cJSON_AddNullToObject(m, "content");
    else cJSON_AddStringToObject(m, "content", o.content.p ? o.content.p : "");
    if (n_calls) {
        cJSON *arr = cJSON_AddArrayToObject(m, "tool_calls");
        for (int k = 0; k < o.n; k++) {
            if (!o.ev[k].name) continue;
            strbuf args = {0};
            for (int q = k + 1; q < o.n && !o.ev[q].name; q++) strbuf_put(&args, o.ev[q].args, o.ev[q].args_len);
            cJSON_AddItemToArray(arr, call_json(c, i, o.ev[k].index, o.ev[k].name, args.p ? args.p : "", false));
            strbuf_free(&args);
        }
    }
    srv_tc_out_free(&o);
    return n_calls > 0;
}

/* A chat choice's message with its reasoning apart (reasoning.h): the text
 * split, reasoning_content (null when there was none), the content read for
 * calls when tools may be called, and harmony's calls. Returns whether any
 * call was made. */
static bool whole_reasoning(srv_call *c, int i, cJSON *j, const strbuf *text) {
    lm_reason rs;
    lm_reason_out o = {0};
    reason_init(&rs, c->req.reason_syntax, c->req.reason_open);
    reason_feed(&rs, text->p ? text->p : "", text->len, true, &o);
    reason_free(&rs);
    strbuf reasoning = {0}, content = {0};
    cJSON *hcalls = cJSON_CreateArray();
    int n_h = 0;
    for (int k = 0; k < o.n; k++) {
        const lm_reason_seg *g = &o.seg[k];
        const char *p = o.text.p + g->off;
        if (g->kind == RSEG_REASONING) strbuf_put(&reasoning, p, g->len);
        else if (g->kind == RSEG_CONTENT) strbuf_put(&content, p, g->len);
        else if (g->kind == RSEG_CALL) {
            strbuf name = {0}, args = {0};
            strbuf_put(&name, p, g->len);
            for (; k + 1 < o.n && o.seg[k + 1].kind == RSEG_ARGS; k++)
                strbuf_put(&args, o.text.p + o.seg[k + 1].off, o.seg[k + 1].len);
            cJSON_AddItemToArray(hcalls, call_json(c, i, n_h++, name.p ? name.p : "", args.p ? args.p : "", false));
            strbuf_free(&name);
            strbuf_free(&args);
        }
    }
    reason_out_free(&o);
    bool called = false;
    cJSON *m;
    if (c->req.tool_calls && c->req.reason_syntax != REASON_HARMONY) {
        called = whole_tool_message(c, i, j, &content);
        m = cJSON_GetObjectItem(j, "message");
    } else {
        m = cJSON_AddObjectToObject(j, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        if (n_h && !content.len) cJSON_AddNullToObject(m, "content");
        else cJSON_AddStringToObject(m, "content", content.p ? content.p : "");
    }
    if (reasoning.len) cJSON_AddStringToObject(m, "reasoning_content", reasoning.p);
    else cJSON_AddNullToObject(m, "reasoning_content");
    if (n_h) {
        cJSON *arr = cJSON_GetObjectItem(m, "tool_calls");
        if (!arr) arr = cJSON_AddArrayToObject(m, "tool_calls");
        cJSON *t;
        while ((t = cJSON_DetachItemFromArray(hcalls, 0))) cJSON_AddItemToArray(arr, t);
        called = true;
    }
    cJSON_Delete(hcalls);
    strbuf_free(&reasoning);
    strbuf_free(&content);
    return called;
}

/* The longest time a choice waited in the engine's queue, from submission
 * to its first admission into a batch (lm_request_stats.queue): the
 * X-Lamina-Queue-Time header of an answer, the ": lamina queue_time="
 * comment before a stream's [DONE]; neither when no choice was admitted. */
static double queue_time(const srv_call *c) {
    double q = 0;
    for (int i = 0; i < c->n_choices; i++)
        if (c->ch[i].stats.queue > q) q = c->ch[i].stats.queue;
    return q;
}

/* The complete JSON answer once every choice is done (lm_malloc'ed). */
static char *whole_answer(srv_call *c) {
    cJSON *o = envelope(c, c->chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < c->n_choices; i++) {
        srv_choice *ch = &c->ch[i];
        strbuf text = {0};
        const char *echo = !c->chat && c->req.echo_text ? c->req.echo_text[i / c->req.p.n] : NULL;
        if (echo) strbuf_puts(&text, echo);
        strbuf_put_utf8(&text, ch->text.p ? ch->text.p : "", ch->text.len, true);
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "index", i);
        bool called = false;
        if (c->chat && c->req.reason_split) {
            called = whole_reasoning(c, i, j, &text);
        } else if (c->chat && c->req.tool_calls) {
            called = whole_tool_message(c, i, j, &text);
        } else if (c->chat) {
            cJSON *m = cJSON_AddObjectToObject(j, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddStringToObject(m, "content", text.p ? text.p : "");
        } else {
            cJSON_AddStringToObject(j, "text", text.p ? text.p : "");
        }
        strbuf_free(&text);
        if (c->req.p.logprobs) {
            cJSON *lp = ch->lp;
            if (c->chat) {
                lp = cJSON_CreateObject();
                cJSON_AddItemToObject(lp, "content", ch->lp ? ch->lp : cJSON_CreateArray());
            } else if (!lp) {
                lp = completion_lp_new();
            }
            ch->lp = NULL;
            cJSON_AddItemToObject(j, "logprobs", lp);
        } else {
            cJSON_AddNullToObject(j, "logprobs");
        }
        cJSON_AddStringToObject(j, "finish_reason",
                                called && ch->finish == LM_FINISH_STOP ? "tool_calls" : finish_reason(ch->finish));
        cJSON_AddItemToArray(choices, j);
    }
    cJSON_AddItemToObject(o, "usage", usage_json(c));
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* Wait for everything, then answer with one JSON object. */
static int run_whole(srv_call *c) {
    srv_queue mine = {0};
    bool overflow = false, all = false;
    while (!all) {
        all = call_wait(c, &mine, 3600, &overflow);
        for (size_t i = 0; i < mine.n_ev; i++) absorb(c, &mine.ev[i], &mine);
    }
    queue_free(&mine);
    settle_finals(c);
    lm_server *s = c->srv;
    if (c->disconnected) return MHD_NO;
    lm_server_error e = {0};
    if (c->error[0]) {
        engine_error(c, &e);
        return srv_respond_error(s, c->conn, &e);
    }
    if (c->cancelled && !c->timed_out) {
        server_error(&e, overflow ? 500 : 503, "server_error", NULL, NULL, "%s",
                     overflow ? "the answer outgrew the server's buffer" : "the server is shutting down");
        return srv_respond_error(s, c->conn, &e);
    }
    char *body = whole_answer(c);
    if (!body) {
        server_error(&e, 500, "server_error", NULL, NULL, "out of memory formatting the answer");
        return srv_respond_error(s, c->conn, &e);
    }
    char qt[32];
    snprintf(qt, sizeof qt, "%.6f", queue_time(c));
    int rc = srv_respond(s, c->conn, 200, "application/json", body, strlen(body),
                         queue_time(c) > 0 ? "X-Lamina-Queue-Time" : NULL, qt);
    cJSON_free(body);
    return rc;
}

/* --------------------------------------------------------------- streams */

/* "data: TEXT\n\n" into the call's output (a NULL text marks it failed). */
static void sse_text(srv_call *c, const char *s) {
    if (!s) {
        c->out.failed = true;
        return;
    }
    strbuf_puts(&c->out, "data: ");
    strbuf_puts(&c->out, s);
    strbuf_puts(&c->out, "\n\n");
}

/* One JSON event; frees o. */
static void sse(srv_call *c, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    sse_text(c, s);
    if (s) cJSON_free(s);
}

/* One chunk for choice i: text (or a chat delta), logprobs, finish reason. */
static void chunk(srv_call *c, int i, const char *text, bool role, cJSON *logprobs, const char *finish) {
    cJSON *o = envelope(c, c->chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "index", i);
    if (c->chat) {
        cJSON *d = cJSON_AddObjectToObject(j, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (text) cJSON_AddStringToObject(d, "content", text);
    } else {
        cJSON_AddStringToObject(j, "text", text ? text : "");
    }
    if (logprobs) cJSON_AddItemToObject(j, "logprobs", logprobs);
    else cJSON_AddNullToObject(j, "logprobs");
    if (finish) cJSON_AddStringToObject(j, "finish_reason", finish);
    else cJSON_AddNullToObject(j, "finish_reason");
    cJSON_AddItemToArray(choices, j);
    if (c->req.include_usage) cJSON_AddNullToObject(o, "usage");
    sse(c, o);
}

/* One reasoning delta for choice i: {"reasoning_content": text}. */
static void reason_chunk(srv_call *c, int i, const char *text, cJSON *logprobs) {
    cJSON *o = envelope(c, "chat.completion.chunk");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "index", i);
    cJSON *d = cJSON_AddObjectToObject(j, "delta");
    cJSON_AddStringToObject(d, "reasoning_content", text);
    if (logprobs) cJSON_AddItemToObject(j, "logprobs", logprobs);
    else cJSON_AddNullToObject(j, "logprobs");
    cJSON_AddNullToObject(j, "finish_reason");
    cJSON_AddItemToArray(choices, j);
    if (c->req.include_usage) cJSON_AddNullToObject(o, "usage");
    sse(c, o);
}

/* One tool-call delta for choice i: a call's first (id, type, name) or a
 * piece of its arguments. */
static void tool_chunk(srv_call *c, int i, const srv_tc_ev *ev) {
    cJSON *o = envelope(c, "chat.completion.chunk");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "index", i);
    cJSON *d = cJSON_AddObjectToObject(j, "delta");
    cJSON *calls = cJSON_AddArrayToObject(d, "tool_calls");
    if (ev->name) {
        cJSON_AddItemToArray(calls, call_json(c, i, ev->index, ev->name, "", true));
    } else {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "index", ev->index);
        cJSON *f = cJSON_AddObjectToObject(t, "function");
        cJSON_AddStringToObject(f, "arguments", ev->args);
        cJSON_AddItemToArray(calls, t);
    }
    cJSON_AddNullToObject(j, "logprobs");
    cJSON_AddNullToObject(j, "finish_reason");
    cJSON_AddItemToArray(choices, j);
    if (c->req.include_usage) cJSON_AddNullToObject(o, "usage");
    sse(c, o);
}

/* An error object as the stream's last event (before [DONE]). */
static void stream_error_obj(srv_call *c, const lm_server_error *e) {
    char *s = srv_error_json(e);
    sse_text(c, s);
    lm_free(s);
}

static void stream_error(srv_call *c, const char *msg) {
    lm_server_error e;
    server_error(&e, 500, "server_error", NULL, NULL, "%s", msg);
    stream_error_obj(c, &e);
}

/* The opening chunks: chat's role deltas, completions' echoed prompts. */
static void stream_open(srv_call *c) {
    for (int i = 0; i < c->n_choices; i++) {
        if (c->chat) {
            chunk(c, i, "", true, NULL, NULL);
        } else if (c->req.echo_text && c->req.echo_text[i / c->req.p.n]) {
            const char *echo = c->req.echo_text[i / c->req.p.n];
            chunk(c, i, echo, false, NULL, NULL);
            c->ch[i].text_total = strlen(echo);
        }
    }
    c->out_started = true;
}

/* Content text of choice i as chunks: read for calls when tools may be
 * called (final: the text is complete; not harmony, whose calls come from
 * the splitter), else one content delta; *lp goes with the first chunk. */
static void stream_content(srv_call *c, int i, const char *s, size_t n, bool final, cJSON **lp) {
    srv_choice *ch = &c->ch[i];
    if (!c->req.tool_calls || c->req.reason_syntax == REASON_HARMONY) { /* harmony's calls: not in content */
        if (!n) return;
        strbuf t = {0};
        strbuf_put(&t, s, n);
        chunk(c, i, t.p ? t.p : "", false, *lp, NULL);
        *lp = NULL;
        strbuf_free(&t);
        return;
    }
    srv_tc_out o = {0};
    srv_tc_feed(&ch->tc, s, n, final, &o);
    if (o.content.len) {
        chunk(c, i, o.content.p, false, *lp, NULL);
        *lp = NULL;
    }
    for (int k = 0; k < o.n; k++) tool_chunk(c, i, &o.ev[k]);
    if (o.failed) c->out.failed = true;
    srv_tc_out_free(&o);
}

/* One event's text with the reasoning apart: the splitter's pieces in
 * order as reasoning deltas, content (read for calls with tools) and
 * harmony's calls; the logprobs with the first chunk, or alone. */
static void stream_reasoning(srv_call *c, const srv_ev *ev, const strbuf *text, cJSON *lp) {
    int i = ev->choice;
    srv_choice *ch = &c->ch[i];
    lm_reason_out o = {0};
    reason_feed(&ch->rs, text->p ? text->p : "", text->len, ev->done, &o);
    if (o.failed) c->out.failed = true;
    for (int k = 0; k < o.n; k++) {
        const lm_reason_seg *g = &o.seg[k];
        const char *p = o.text.p + g->off;
        strbuf t = {0};
        strbuf_put(&t, p, g->len);
        const char *ts = t.p ? t.p : "";
        if (g->kind == RSEG_REASONING) {
            reason_chunk(c, i, ts, lp);
            lp = NULL;
        } else if (g->kind == RSEG_CONTENT) {
            stream_content(c, i, p, g->len, false, &lp);
        } else {
            srv_tc_ev te = {.index = g->kind == RSEG_CALL ? ch->n_hcalls++ : ch->n_hcalls - 1,
                            .name = g->kind == RSEG_CALL ? (char *)ts : NULL,
                            .args = (char *)ts,
                            .args_len = t.len};
            tool_chunk(c, i, &te);
        }
        strbuf_free(&t);
    }
    reason_out_free(&o);
    if (ev->done && c->req.tool_calls) stream_content(c, i, "", 0, true, &lp);
    if (lp) chunk(c, i, "", false, lp, NULL);
}

/* One event as chunks: its text (complete characters only), then the end. */
static void stream_event(srv_call *c, const srv_ev *ev, const srv_queue *q) {
    if (ev->choice < 0 || ev->choice >= c->n_choices) return;
    srv_choice *ch = &c->ch[ev->choice];
    if (ch->done) return;
    /* the engine's text is whole characters (its detokenizer holds a split
     * one back, and stop strings cut only at characters): nothing is kept
     * between events; NUL bytes, which a C string cannot carry, become
     * U+FFFD as in whole answers */
    strbuf text = {0};
    if (ev->text_len) strbuf_put_utf8(&text, q->text.p + ev->text_off, ev->text_len, true);
    cJSON *lp = c->req.p.logprobs && !ev->done && ev->token >= 0 ? event_logprobs(c, ev, q, ch->text_total) : NULL;
    ch->text_total += text.len;
    if (c->chat && c->req.reason_split) {
        stream_reasoning(c, ev, &text, lp);
    } else if (c->chat && c->req.tool_calls) {
        /* the text read for calls: content before them, then their deltas */
        srv_tc_out o = {0};
        srv_tc_feed(&ch->tc, text.p ? text.p : "", text.len, ev->done, &o);
        if (o.content.len || lp) chunk(c, ev->choice, o.content.p ? o.content.p : "", false, lp, NULL);
        for (int k = 0; k < o.n; k++) tool_chunk(c, ev->choice, &o.ev[k]);
        if (o.failed) c->out.failed = true;
        srv_tc_out_free(&o);
    } else if (text.len || lp) {
        chunk(c, ev->choice, text.p ? text.p : "", false, lp, NULL);
    }
    strbuf_free(&text);
    if (ev->done) {
        ch->done = true;
        ch->finish = ev->finish;
        ch->stats = ev->stats;
    }
}

/* Every choice ended: final chunks (or an error), usage, [DONE]. */
static void stream_close(srv_call *c, bool overflow) {
    settle_finals(c);
    if (c->error[0]) {
        lm_server_error e;
        engine_error(c, &e);
        stream_error_obj(c, &e);
    } else if (overflow) stream_error(c, "the client did not read the stream fast enough; generation cancelled");
    else if (c->cancelled && !c->timed_out) stream_error(c, "the request was cancelled (the server is shutting down)");
    else
        for (int i = 0; i < c->n_choices; i++) {
            const srv_choice *ch = &c->ch[i];
            bool called = (c->req.tool_calls && (ch->tc.n_calls > 0 || ch->tc.cur_named)) || ch->n_hcalls > 0;
            chunk(c, i, c->chat ? NULL : "", false, NULL,
                  called && ch->finish == LM_FINISH_STOP ? "tool_calls" : finish_reason(ch->finish));
        }
    if (c->req.include_usage && !c->error[0]) {
        cJSON *o = envelope(c, c->chat ? "chat.completion.chunk" : "text_completion");
        cJSON_AddArrayToObject(o, "choices");
        cJSON_AddItemToObject(o, "usage", usage_json(c));
        sse(c, o);
    }
    char qt[64];
    snprintf(qt, sizeof qt, ": lamina queue_time=%.6f\n\n", queue_time(c));
    if (queue_time(c) > 0) strbuf_puts(&c->out, qt);
    strbuf_puts(&c->out, "data: [DONE]\n\n");
    c->out_end = true;
}

/* The HTTP library's content reader: blocks (on this connection's own
 * thread) until there is something to send, at most until a keep-alive. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    srv_call *c = cls;
    srv_queue mine = {0};
    ssize_t ret = 0;
    for (;;) {
        if (c->out.failed) {
            ret = MHD_CONTENT_READER_END_WITH_ERROR;
            break;
        }
        if (c->out_pos < c->out.len) {
            size_t n = c->out.len - c->out_pos < max ? c->out.len - c->out_pos : max;
            memcpy(buf, c->out.p + c->out_pos, n);
            c->out_pos += n;
            if (c->out_pos == c->out.len) c->out_pos = c->out.len = 0;
            c->t_last_send = lm_now();
            ret = (ssize_t)n;
            break;
        }
        if (c->out_end) {
            ret = MHD_CONTENT_READER_END_OF_STREAM;
            break;
        }
        if (c->disconnected) {
            ret = MHD_CONTENT_READER_END_WITH_ERROR;
            break;
        }
        if (!c->out_started) {
            stream_open(c);
            continue;
        }
        double wait = c->srv->cfg.keepalive - (lm_now() - c->t_last_send);
        if (wait <= 0) {
            strbuf_puts(&c->out, ": keep-alive\n\n");
            continue;
        }
        bool overflow = false;
        bool all = call_wait(c, &mine, wait, &overflow);
        for (size_t i = 0; i < mine.n_ev; i++) stream_event(c, &mine.ev[i], &mine);
        if (all) stream_close(c, overflow);
    }
    queue_free(&mine);
    return ret;
}

/* ------------------------------------------------------------------ run */

static int start_stream(srv_call *c) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, c, NULL);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    c->t_last_send = lm_now();
    int ret = MHD_queue_response(c->conn, 200, r);
    MHD_destroy_response(r);
    if (ret == MHD_YES) atomic_fetch_add(&c->srv->http_status[200], 1);
    return ret;
}

int call_run(srv_call *c) {
    lm_server *s = c->srv;
    lm_server_error e;
    c->engine = atomic_load(&s->engine);
    if (!c->engine) {
        server_error(&e, 503, "server_error", NULL, "model_loading", "the model is still loading; retry shortly");
        return srv_respond_error(s, c->conn, &e);
    }
    if (c->embed) return embed_run(c);
    if (server_parse_request(&s->pctx, c->chat, c->body.p, c->body.len, &c->req, &e))
        return srv_respond_error(s, c->conn, &e);
    c->parsed = true;
    c->n_choices = c->req.n_prompts * c->req.p.n;
    c->ch = lm_calloc((size_t)c->n_choices, sizeof *c->ch);
    c->fin = lm_calloc((size_t)c->n_choices, sizeof *c->fin);
    c->subs = lm_calloc((size_t)c->req.n_prompts, sizeof *c->subs);
    if (!c->ch || !c->fin || !c->subs) {
        server_error(&e, 500, "server_error", NULL, NULL, "out of memory");
        return srv_respond_error(s, c->conn, &e);
    }
    for (int i = 0; i < c->req.n_prompts; i++) c->subs[i] = (srv_sub){c, i, NULL};
    for (int i = 0; i < c->n_choices; i++) {
        srv_tc_init(&c->ch[i].tc, c->req.tool_syntax, c->req.tool_strings);
        reason_init(&c->ch[i].rs, c->req.reason_syntax, c->req.reason_open);
    }
    snprintf(c->id, sizeof c->id, "%s-%016llx%08llx", c->chat ? "chatcmpl" : "cmpl",
             (unsigned long long)(s->id_salt ^ (uint64_t)(c->t_start * 1e9)),
             (unsigned long long)(atomic_fetch_add(&s->next_id, 1) & 0xffffffffu));
    c->created = (long long)time(NULL);
    if (submit_all(c, &e)) {
        if (e.status == 429) {
            char *j = srv_error_json(&e);
            int rc =
                srv_respond(s, c->conn, 429, "application/json", j ? j : "{}", j ? strlen(j) : 2, "Retry-After", "1");
            lm_free(j);
            return rc;
        }
        return srv_respond_error(s, c->conn, &e);
    }
    return c->req.stream ? start_stream(c) : run_whole(c);
}
