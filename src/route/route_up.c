/*
 * route_up.c - the router's replica side. One upstream thread runs every
 * transfer to the replicas with libcurl's multi interface: it admits queued
 * requests (route_queue.c's rt_pick picks the replica), adds their
 * transfers, and on each transfer's end decides between done, retry
 * elsewhere (nothing reached the client yet) and failure. One poller
 * thread asks each replica's /health and /metrics every poll_interval:
 * ejection and re-admission, the learnt in-flight limit (route.h), and
 * stalls: a replica that answers /health but whose engine makes no
 * iteration for stall_timeout while requests are in flight there is
 * ejected, the transfers sent to it before are aborted (and retried
 * elsewhere when nothing reached their client yet), and it is kept out for
 * a quarantine (stall_timeout, doubling with each stall in a row, at most
 * 10 minutes) before /health may re-admit it, with a limit of 1.
 *
 * First-byte deadline. The first byte is the first byte of the response
 * body as curl hands it to the write callback (a status line and headers
 * alone do not count): for a stream it is what lets the router commit the
 * client to this replica, and `lamina serve` sends it within seconds of
 * taking the request (a chat stream's opening chunk, else the first token
 * or a keep-alive comment), so silence past first_byte_timeout means the
 * replica is not serving it. A whole answer's first byte comes with its
 * end, so only streamed requests have the deadline. The progress callback
 * checks it (at least about once a second, so it fires within about a
 * second after the deadline). The aborted attempt counts as the replica's
 * failure (failures, first_byte_timeouts, a failed answer in a row),
 * halves its learnt limit once per burst (the timeout of an attempt sent
 * before the last halving does not halve it again), bars the replica for
 * that request, and the request is retried on a healthy replica it has not
 * tried yet; with none, or no attempt left, it fails with 504 naming the
 * replica.
 *
 * Callbacks run on the upstream thread inside curl_multi_perform and take
 * rt->mu; the loop itself never holds rt->mu while curl runs. A client that
 * goes away is noticed by the transfer's write or progress callback (the
 * latter runs at least about once a second), which aborts the transfer:
 * curl closes that connection, and the replica cancels the request.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "base/util.h"
#include "route/route_int.h"

#define LIMIT_START 4
#define LIMIT_MAX 4096

static void logf_(lm_router *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(lm_router *r, const char *fmt, ...) {
    if (!r->cfg.log) return;
    char line[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    r->cfg.log(r->cfg.log_user, line);
}

/* Keep replica i out for a quarantine (under mu): stall_timeout (30 s when
 * that is 0), doubled with each quarantine in a row, at most 10 minutes. */
static void quarantine(lm_router *r, int i) {
    rt_replica *p = &r->rep[i];
    double base = r->cfg.stall_timeout > 0 ? r->cfg.stall_timeout : 30;
    double q = base * (double)(1 << (p->stalls < 6 ? p->stalls : 6));
    p->quarantine_until = lm_now() + (q < 600 ? q : 600);
    p->stalls++;
}

/* Eject a replica (under mu): nothing new goes there until /health is 200. */
static void eject(lm_router *r, int i, const char *why) {
    rt_replica *p = &r->rep[i];
    if (!p->healthy) return;
    p->healthy = false;
    p->ejections++;
    logf_(r, "replica %s ejected: %s", p->url, why);
}

/* ------------------------------------------------------------ transfers */

static size_t on_write(char *data, size_t size, size_t nmemb, void *ud) {
    rt_req *q = ud;
    lm_router *r = q->rt;
    size_t n = size * nmemb;
    pthread_mutex_lock(&r->mu);
    if (q->client_gone || atomic_load(&r->stopping)) {
        pthread_mutex_unlock(&r->mu);
        return 0; /* abort: curl closes the connection, the replica cancels */
    }
    if (!q->status) {
        curl_easy_getinfo((CURL *)q->easy, CURLINFO_RESPONSE_CODE, &q->status);
        q->t_first = lm_now();
    }
    if (q->buf.len + n > RT_STREAM_LIMIT) {
        if (q->stream) q->overflow = true; /* the client does not read */
        else q->too_big = true;            /* the replica's answer is too large to hold */
        pthread_mutex_unlock(&r->mu);
        return 0;
    }
    strbuf_put(&q->buf, data, n);
    if (q->status == 200) route_sse_feed(&q->sse, data, n);
    if (q->stream) pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* Response headers: the replica engine's queue time of a whole answer. */
static size_t on_header(char *data, size_t size, size_t nmemb, void *ud) {
    rt_req *q = ud;
    size_t n = size * nmemb;
    double v = route_parse_queue_header(data, n);
    if (v >= 0) {
        pthread_mutex_lock(&q->rt->mu);
        q->up_queue = v;
        pthread_mutex_unlock(&q->rt->mu);
    }
    return n;
}

static int on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
    rt_req *q = ud;
    lm_router *r = q->rt;
    pthread_mutex_lock(&r->mu);
    bool stop = q->client_gone || atomic_load(&r->stopping);
    if (!stop && q->replica >= 0 && r->rep[q->replica].stall_epoch != q->stall_epoch) stop = q->stalled = true;
    double fb = r->cfg.first_byte_timeout;
    if (!stop && fb > 0 && q->stream && !q->status && lm_now() - q->t_send > fb) stop = q->late = true;
    pthread_mutex_unlock(&r->mu);
    return stop ? 1 : 0;
}

/* Start q's transfer to replica i (under mu). Returns 0, or -1. */
static int start(lm_router *r, rt_req *q, int i) {
    rt_replica *p = &r->rep[i];
    CURL *h = curl_easy_init();
    if (!h) return -1;
    char url[1024];
    snprintf(url, sizeof url, "%s%s", p->url,
             q->chat        ? "/v1/chat/completions"
                 : q->embed ? "/v1/embeddings"
                            : "/v1/completions");
    struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
    hd = hd ? curl_slist_append(hd, "Expect:") : NULL;
    if (hd && r->auth_header) hd = curl_slist_append(hd, r->auth_header);
    if (!hd) {
        curl_easy_cleanup(h);
        return -1;
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, q->body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->body_len);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, q);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, q);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, q);
    curl_easy_setopt(h, CURLOPT_PRIVATE, q);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    if (r->cfg.timeout > 0) curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(r->cfg.timeout * 1000));
    q->easy = h;
    q->hdrs = hd;
    q->state = RQ_SENT;
    q->replica = i;
    q->stall_epoch = p->stall_epoch;
    q->stalled = false;
    q->late = false;
    q->attempts++;
    q->tried[i] = true;
    q->status = 0;
    strbuf_free(&q->buf);
    route_sse_init(&q->sse);
    q->up_queue = -1;
    q->t_send = lm_now();
    if (!q->t_admit) q->t_admit = q->t_send;
    p->in_flight++;
    p->sent++;
    for (int k = 0; k < q->n_keys; k++) p->slots[q->keys[k] & (RT_SLOTS - 1)] = q->keys[k];
    q->refs++; /* the transfer's reference */
    if (curl_multi_add_handle((CURLM *)r->multi, h) != CURLM_OK) {
        q->refs--;
        p->in_flight--;
        curl_easy_cleanup(h);
        curl_slist_free_all(hd);
        q->easy = q->hdrs = NULL;
        return -1;
    }
    return 0;
}

static void fail_req(lm_router *r, rt_req *q, int status, const char *fmt, const char *what) {
    q->error_status = status;
    snprintf(q->error, sizeof q->error, fmt, what);
    rt_finish(r, q);
}

/* Admit what the queue holds while replicas have room (under mu); fail what
 * has waited past the queue timeout (no replica could take it). */
static void dispatch(lm_router *r) {
    double now = lm_now();
    double qt = r->cfg.timeout > 0 ? r->cfg.timeout : 600;
    for (rt_req *q = r->q_head, *nx; q; q = nx) {
        nx = q->next;
        if (q->client_gone || now - q->t_queued > qt) {
            rt_queue_remove(r, q);
            if (q->client_gone) {
                q->error_status = 499;
                snprintf(q->error, sizeof q->error, "the client went away");
                rt_finish(r, q);
            } else fail_req(r, q, 503, "%s", "no replica could take the request in time");
            rt_req_unref(r, q);
        }
    }
    while (r->q_head) {
        rt_req *q = r->q_head;
        int i = rt_pick(r, q);
        if (i < 0) break;
        rt_queue_remove(r, q);
        if (start(r, q, i)) {
            fail_req(r, q, 500, "%s", "out of memory starting the upstream transfer");
            rt_req_unref(r, q);
        } else rt_req_unref(r, q); /* the queue's reference; the transfer holds its own */
    }
}

/* Whether another attempt may go to some replica not barred for q: a
 * healthy one, or one that may come back; with untried, only a healthy one
 * that q has not tried. */
static bool can_retry(lm_router *r, rt_req *q, bool untried) {
    if (q->streaming || q->client_gone || q->overflow || q->attempts >= r->cfg.max_attempts) return false;
    bool left = false;
    for (int i = 0; i < r->n_rep; i++) {
        if (q->barred[i] || (untried && q->tried[i])) continue;
        if (r->rep[i].healthy) return true;
        left = true;
    }
    return left && !untried; /* one may come back */
}

/* Put q back at the head of the queue for another attempt (under mu); the
 * transfer's reference becomes the queue's. */
static void retry(lm_router *r, rt_req *q) {
    r->retried++;
    strbuf_free(&q->buf);
    q->status = 0;
    q->too_big = false;
    rt_queue_push(r, q, true);
}

/* One more failed answer in a row from replica i (under mu): RT_BAD_IN_ROW
 * of them eject it for a quarantine. */
static void bad_answer(lm_router *r, int i) {
    rt_replica *p = &r->rep[i];
    if (++p->bad_in_row < RT_BAD_IN_ROW || !p->healthy) return;
    char why[96];
    snprintf(why, sizeof why, "%d failed answers in a row", p->bad_in_row);
    quarantine(r, i);
    eject(r, i, why);
    p->bad_in_row = 0;
}

/* q's attempt got no first byte in time (under mu): count it, halve the
 * replica's learnt limit unless it was halved after q was sent, bar the
 * replica for q, and retry q on a healthy replica it has not tried, else
 * fail it with 504. */
static void first_byte_late(lm_router *r, rt_req *q) {
    int i = q->replica;
    rt_replica *p = &r->rep[i];
    p->failures++;
    p->first_byte_timeouts++;
    if (r->cfg.max_inflight <= 0 && q->t_send >= p->t_shrunk) {
        p->limit = p->limit > 1 ? p->limit / 2 : 1;
        p->t_shrunk = lm_now();
    }
    bad_answer(r, i);
    q->barred[i] = true;
    if (atomic_load(&r->stopping)) {
        fail_req(r, q, 503, "%s", "the router is shutting down");
        return;
    }
    if (can_retry(r, q, true)) {
        retry(r, q);
        return;
    }
    q->error_status = 504;
    snprintf(q->error, sizeof q->error, "the replica %.120s sent no first byte within %g s", p->url,
             r->cfg.first_byte_timeout);
    rt_finish(r, q);
}

/* A transfer ended (under mu). */
static void transfer_done(lm_router *r, rt_req *q, CURLcode rc) {
    rt_replica *p = &r->rep[q->replica];
    p->in_flight--;
    long code = 0;
    curl_easy_getinfo((CURL *)q->easy, CURLINFO_RESPONSE_CODE, &code);
    if (!q->status) q->status = code;
    q->easy = NULL;
    curl_slist_free_all(q->hdrs);
    q->hdrs = NULL;
    if (q->client_gone) {
        q->error_status = 499;
        snprintf(q->error, sizeof q->error, "the client went away");
        rt_finish(r, q);
        return;
    }
    if (q->overflow) {
        fail_req(r, q, 500, "%s", "the client did not read the stream fast enough; request cancelled");
        return;
    }
    if (q->late) {
        first_byte_late(r, q);
        return;
    }
    bool conn_failed = rc != CURLE_OK && !q->too_big;
    /* a whole 200 answer must be a JSON object: anything else is the replica's fault */
    bool garbage = false;
    if (!conn_failed && !q->too_big && !q->stream && code == 200) {
        cJSON *o = cJSON_ParseWithLength(q->buf.p ? q->buf.p : "", q->buf.len);
        garbage = !cJSON_IsObject(o);
        cJSON_Delete(o);
    }
    bool bad = conn_failed || q->too_big || garbage || q->stalled || code >= 500;
    if (!bad && code == 200) p->bad_in_row = 0, p->stalls = 0;
    else if (bad) bad_answer(r, q->replica);
    if (q->stalled) { /* aborted by the stall detector (the replica is ejected already) */
        p->failures++;
    } else if (conn_failed) {
        p->failures++;
        if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_OPERATION_TIMEDOUT || rc == CURLE_RECV_ERROR ||
            rc == CURLE_SEND_ERROR || rc == CURLE_GOT_NOTHING || rc == CURLE_PARTIAL_FILE)
            eject(r, q->replica, curl_easy_strerror(rc));
    } else if (code == 429 && r->cfg.max_inflight <= 0 && p->limit > 1) {
        p->limit = p->in_flight > 1 ? p->in_flight : 1; /* the replica's queue is full: ask less */
    }
    bool retryable = conn_failed || q->too_big || garbage || code == 429 || code >= 500;
    if (retryable && !atomic_load(&r->stopping) && can_retry(r, q, false)) {
        retry(r, q);
        return;
    }
    if (atomic_load(&r->stopping)) {
        fail_req(r, q, 503, "%s", "the router is shutting down");
        return;
    }
    if (q->stalled) {
        fail_req(r, q, 502, "%s", "the replica stalled (no engine progress) after the answer began");
        return;
    }
    if (q->too_big) {
        fail_req(r, q, 502, "%s", "the replica's answer is larger than the router's 4 MiB buffer");
        return;
    }
    if (garbage) {
        fail_req(r, q, 502, "%s", "the replica's answer is not a JSON object");
        return;
    }
    if (conn_failed) {
        fail_req(r, q, 502, "the replica failed: %s", curl_easy_strerror(rc));
        return;
    }
    if (q->stream && code == 200 && !q->sse.done && !q->sse.error) {
        fail_req(r, q, 502, "%s", "the replica's stream ended before [DONE]");
        return;
    }
    q->error_status = 0;
    rt_finish(r, q);
}

static void read_done(lm_router *r) {
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read((CURLM *)r->multi, &left))) {
        if (msg->msg != CURLMSG_DONE) continue;
        CURL *h = msg->easy_handle;
        CURLcode rc = msg->data.result;
        rt_req *q = NULL;
        curl_easy_getinfo(h, CURLINFO_PRIVATE, (char **)&q);
        curl_multi_remove_handle((CURLM *)r->multi, h);
        pthread_mutex_lock(&r->mu);
        transfer_done(r, q, rc);
        bool drop = q->state == RQ_FINAL;
        if (drop) rt_req_unref(r, q); /* the transfer's reference */
        pthread_mutex_unlock(&r->mu);
        curl_easy_cleanup(h);
    }
}

/* Fail what is queued (under mu): the router is stopping. */
static void fail_queued(lm_router *r) {
    while (r->q_head) {
        rt_req *q = r->q_head;
        rt_queue_remove(r, q);
        fail_req(r, q, 503, "%s", "the router is shutting down");
        rt_req_unref(r, q);
    }
}

static void *up_main(void *arg) {
    lm_router *r = arg;
    CURLM *m = r->multi;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        bool stop = atomic_load(&r->stopping);
        if (stop) fail_queued(r);
        else dispatch(r);
        pthread_mutex_unlock(&r->mu);
        int running = 0;
        curl_multi_perform(m, &running);
        read_done(r);
        if (stop && running == 0) break;
        curl_multi_poll(m, NULL, 0, 50, NULL);
    }
    pthread_mutex_lock(&r->mu);
    fail_queued(r); /* nothing is retried once stopping, but be sure nothing waits */
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

void rt_up_wake(lm_router *r) {
    if (r->multi) curl_multi_wakeup((CURLM *)r->multi);
}

/* ------------------------------------------------------------- the poller */

static size_t sink(char *data, size_t size, size_t nmemb, void *ud) {
    strbuf *b = ud;
    if (b) strbuf_put(b, data, size * nmemb);
    return size * nmemb;
}

static long get_with(CURL *h, lm_router *r, const char *base, const char *path, strbuf *out, double timeout) {
    char url[1024];
    snprintf(url, sizeof url, "%s%s", base, path);
    struct curl_slist *hd = r->auth_header ? curl_slist_append(NULL, r->auth_header) : NULL;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(timeout * 1000));
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)(timeout * 1000));
    CURLcode rc = curl_easy_perform(h);
    long code = -1;
    if (rc == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
    curl_slist_free_all(hd);
    return code;
}

long rt_get(lm_router *r, const char *base, const char *path, strbuf *out, double timeout) {
    CURL *h = curl_easy_init();
    if (!h) return -1;
    long code = get_with(h, r, base, path, out, timeout);
    curl_easy_cleanup(h);
    return code;
}

/* The learnt limit (under mu): room while the replica's own queue is short
 * and the router holds work; what it runs plus a short queue once its
 * queue grows and what it runs does not. */
static void learn(lm_router *r, rt_replica *p) {
    if (r->cfg.max_inflight > 0) {
        p->limit = r->cfg.max_inflight;
        return;
    }
    if (p->st.running < 0 || p->st.waiting < 0) return;
    bool kv_room = p->st.kv_total <= 0 || p->st.kv_free > 0.05 * p->st.kv_total;
    /* a long queue at the replica means it is full only when it stopped taking more: on a slow
     * engine new requests wait a whole iteration before it admits them */
    if (p->st.waiting > 2 * RT_TARGET_WAIT && p->st.running <= p->prev_running) {
        int want = (int)p->st.running + RT_TARGET_WAIT;
        p->limit = want > 1 ? want : 1;
    } else if (p->st.waiting <= RT_TARGET_WAIT && r->q_len > 0 && p->in_flight >= p->limit && kv_room)
        p->limit = p->limit * 2 < LIMIT_MAX ? p->limit * 2 : LIMIT_MAX;
}

static void poll_one(lm_router *r, int i, CURL *h) {
    const char *url = r->rep[i].url;
    long hc = get_with(h, r, url, "/health", NULL, 2.0);
    strbuf m = {0};
    long mc = hc == 200 ? get_with(h, r, url, "/metrics", &m, 2.0) : -1;
    rt_upstats st;
    int found = mc == 200 && m.p ? route_parse_metrics(m.p, m.len, &st) : 0;
    strbuf_free(&m);
    pthread_mutex_lock(&r->mu);
    rt_replica *p = &r->rep[i];
    double now = lm_now();
    /* stalls: progress is an iteration since the last poll, or nothing in flight */
    double iter = found ? st.iterations : -1;
    if (p->in_flight == 0 || (iter >= 0 && iter != p->seen_iter)) {
        p->t_progress = now;
        if (p->in_flight > 0) p->stalls = 0;
    }
    p->seen_iter = iter;
    if (r->cfg.stall_timeout > 0 && p->in_flight > 0 && now - p->t_progress > r->cfg.stall_timeout) {
        quarantine(r, i);
        p->stall_epoch++;
        p->t_progress = now;
        char why[96];
        snprintf(why, sizeof why, "no engine iteration for %.0f s with %d requests in flight", r->cfg.stall_timeout,
                 p->in_flight);
        eject(r, i, why);
        rt_up_wake(r); /* its transfers are aborted at their next progress call */
    }
    if (hc == 200 && !p->healthy && now >= p->quarantine_until) {
        p->healthy = true;
        p->limit = r->cfg.max_inflight > 0 ? r->cfg.max_inflight : p->stalls ? 1 : LIMIT_START;
        p->last_iter = -1;
        logf_(r, "replica %s admitted", p->url);
    } else if (hc != 200 && p->healthy) eject(r, i, hc < 0 ? "no answer to /health" : "/health is not 200");
    if (found) {
        if (p->last_iter >= 0 && st.iterations > p->last_iter && st.batch_count > p->last_bcount)
            p->batch_mean = (st.batch_sum - p->last_bsum) / (st.batch_count - p->last_bcount);
        else if (p->last_iter >= 0 && st.iterations == p->last_iter) p->batch_mean = 0;
        p->last_iter = st.iterations;
        p->last_bsum = st.batch_sum;
        p->last_bcount = st.batch_count;
        p->prev_running = p->st.running;
        p->st = st;
        learn(r, p);
    }
    pthread_mutex_unlock(&r->mu);
}

static void *poll_main(void *arg) {
    lm_router *r = arg;
    CURL *h[RT_MAX_REPLICAS] = {0};
    for (int i = 0; i < r->n_rep; i++) h[i] = curl_easy_init();
    while (!atomic_load(&r->stopping)) {
        for (int i = 0; i < r->n_rep && !atomic_load(&r->stopping); i++)
            if (h[i]) poll_one(r, i, h[i]);
        rt_up_wake(r);
        pthread_mutex_lock(&r->mu);
        rt_trace_sample(r);
        if (!atomic_load(&r->stopping)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            double t = ts.tv_sec + ts.tv_nsec * 1e-9 + r->cfg.poll_interval;
            ts.tv_sec = (time_t)t;
            ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
            pthread_cond_timedwait(&r->poll_cv, &r->mu, &ts);
        }
        pthread_mutex_unlock(&r->mu);
    }
    for (int i = 0; i < r->n_rep; i++)
        if (h[i]) curl_easy_cleanup(h[i]);
    return NULL;
}

/* --------------------------------------------------------------- set-up */

static void global_init(void) { curl_global_init(CURL_GLOBAL_ALL); }

int rt_up_start(lm_router *r, char *err, size_t errlen) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, global_init);
    r->multi = curl_multi_init();
    if (!r->multi) return lm_err(err, errlen, "cannot start libcurl");
    for (int i = 0; i < r->n_rep; i++) {
        r->rep[i].limit = r->cfg.max_inflight > 0 ? r->cfg.max_inflight : LIMIT_START;
        r->rep[i].last_iter = -1;
        r->rep[i].seen_iter = -1;
        r->rep[i].t_progress = lm_now();
        r->rep[i].batch_mean = -1;
        r->rep[i].st = (rt_upstats){-1, -1, -1, -1, -1, -1, -1};
    }
    if (pthread_create(&r->up_thread, NULL, up_main, r)) return lm_err(err, errlen, "cannot start a thread");
    r->up_started = true;
    if (pthread_create(&r->poll_thread, NULL, poll_main, r)) return lm_err(err, errlen, "cannot start a thread");
    r->poll_started = true;
    return 0;
}

void rt_up_stop(lm_router *r) {
    atomic_store(&r->stopping, true);
    pthread_mutex_lock(&r->mu);
    pthread_cond_broadcast(&r->poll_cv);
    pthread_mutex_unlock(&r->mu);
    rt_up_wake(r);
    if (r->poll_started) pthread_join(r->poll_thread, NULL);
    if (r->up_started) pthread_join(r->up_thread, NULL);
    r->poll_started = r->up_started = false;
    if (r->multi) curl_multi_cleanup((CURLM *)r->multi);
    r->multi = NULL;
}
