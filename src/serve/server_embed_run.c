/*
 * server_embed_run.c - one POST /v1/embeddings call from its parsed body to
 * its answer: every input an engine embedding request
 * (lm_request_params.embed), all submitted before any is collected so the
 * engine batches them (many short inputs in one pass), then one JSON
 * answer (server_embed.c writes it).
 *
 * Submission. Each input is submitted with the server's pooling
 * (lm_server.embed_pooling). The engine bounds how many requests may wait
 * (max_waiting): an input it refuses as busy while some of this call's are
 * still running waits for one of them to end and is submitted again, so a
 * request of SERVER_MAX_EMBED_INPUTS inputs goes through a server that lets
 * fewer wait; busy with none of the call's running is a 429 (Retry-After).
 * Any other refusal cancels what was submitted and answers the engine's
 * status as the generation routes do (srv_status_error: the input's
 * context_length_exceeded 400, 503 out of memory, ...).
 *
 * Events. The engine thread runs on_event only: an embedding request has no
 * token events, and its final event carries the pooled vector, which is
 * copied into the call's (n_inputs, width) buffer under call->mu. The first
 * error is kept (its status and input). Every accepted request's final event
 * is counted, whatever it says; embed_call_free waits for all of them, so
 * the engine never holds a pointer into a freed call.
 *
 * Waiting happens on the connection's thread, in slices of at most 250 ms:
 * between them a shutdown, the request timeout and a client that went away
 * cancel everything still running (a client gone gets no answer; a timeout
 * 503, a shutdown 503). The answer is written only once every input has its
 * vector: truncated to dimensions and normalized (server_embed_vector).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <microhttpd.h>

#include "serve/http.h"
#include "serve/server_int.h"
#include "base/util.h"

#define WAIT_SLICE 0.25

/* One input's engine request. */
typedef struct {
    srv_call *call;
    int index;          /* the input */
    lm_request *handle; /* set under call->mu after engine_submit */
} srv_esub;

struct srv_embed {
    lm_server_embed_request req;
    int width;      /* the engine's vector width (lm_model_embd_dim) */
    srv_esub *subs; /* (req.n_inputs) */
    int n_subs;     /* submitted: subs[0 .. n_subs) */
    /* under call->mu (written by the engine thread) */
    float *pooled;      /* (req.n_inputs, width) each input's pooled vector as the engine gave it */
    int n_final;        /* final events received */
    int n_ok;           /* of them with a vector */
    char error[256];    /* the first failure */
    lm_status error_st; /* its kind */
    int error_input;    /* its input */
};

/* ------------------------------------------------------------ the callback */

/* Engine thread: copy the vector (or the error), count, signal. */
static void on_event(void *user, const lm_event *ev) {
    srv_esub *sb = user;
    srv_call *c = sb->call;
    if (!ev->done) return; /* an embedding has no token events */
    pthread_mutex_lock(&c->mu);
    struct srv_embed *m = c->emb;
    if (ev->finish == LM_FINISH_STOP && ev->embedding && ev->n_embedding == m->width) {
        memcpy(m->pooled + (size_t)sb->index * (size_t)m->width, ev->embedding, (size_t)m->width * sizeof(float));
        m->n_ok++;
    } else if (ev->finish != LM_FINISH_CANCELLED && !m->error[0]) {
        if (ev->finish == LM_FINISH_ERROR) {
            snprintf(m->error, sizeof m->error, "%s", ev->error ? ev->error : "embedding failed");
            m->error_st = ev->status;
        } else {
            snprintf(m->error, sizeof m->error, "the engine gave input %d no embedding of %d floats (got %d)",
                     sb->index, m->width, ev->n_embedding);
            m->error_st = LM_ERR_INTERNAL;
        }
        m->error_input = sb->index;
    }
    m->n_final++;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu); /* nothing of c is read after this: it may be freed */
}

/* --------------------------------------------------------------- helpers */

static void cancel_all(srv_call *c) {
    struct srv_embed *m = c->emb;
    pthread_mutex_lock(&c->mu);
    int n = m->n_subs;
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < n; i++)
        if (m->subs[i].handle) engine_cancel(c->engine, m->subs[i].handle);
    c->cancelled = true;
}

/* Between waits: a shutdown, the timeout or a client gone cancels all. */
static void check_abort(srv_call *c) {
    if (!c->cancelled && srv_call_ended(c)) cancel_all(c);
}

/* Wait until more than `seen` final events are in (or a slice passes);
 * returns the count. */
static int wait_finals(srv_call *c, int seen) {
    struct srv_embed *m = c->emb;
    check_abort(c);
    pthread_mutex_lock(&c->mu);
    if (m->n_final <= seen) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double t = (double)ts.tv_nsec * 1e-9 + WAIT_SLICE;
        ts.tv_sec += (time_t)t;
        ts.tv_nsec = (long)((t - floor(t)) * 1e9);
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
    int n = m->n_final;
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* Submit every input; 0, or -1 with *e (what was submitted still runs:
 * the caller cancels it). */
static int submit_all(srv_call *c, lm_server_error *e) {
    struct srv_embed *m = c->emb;
    lm_server *s = c->srv;
    uint64_t client = srv_call_client(c);
    for (int i = 0; i < m->req.n_inputs; i++) {
        lm_request_params p;
        engine_request_params_default(&p);
        p.prompt = m->req.inputs[i];
        p.n_prompt = m->req.n_input[i];
        p.max_tokens = 1;
        p.embed = true;
        p.pooling = s->embed_pooling;
        p.client = client;
        p.on_event = on_event;
        p.user = &m->subs[i];
        m->subs[i] = (srv_esub){c, i, NULL};
        char param[24];
        snprintf(param, sizeof param, m->req.n_inputs > 1 ? "input[%d]" : "input", i);
        for (;;) {
            lm_request *h = NULL;
            char err[LM_ERRLEN];
            lm_status rc = engine_submit(c->engine, &p, &h, err, sizeof err);
            if (rc == LM_OK) {
                pthread_mutex_lock(&c->mu);
                m->subs[i].handle = h;
                m->n_subs = i + 1;
                pthread_mutex_unlock(&c->mu);
                break;
            }
            /* busy while some of ours run: wait for one of them to end */
            pthread_mutex_lock(&c->mu);
            int seen = m->n_final;
            pthread_mutex_unlock(&c->mu);
            if (rc != LM_ERR_BUSY || seen == i) return srv_status_error(e, rc, param, err);
            while (!c->cancelled && wait_finals(c, seen) == seen) {}
            if (c->cancelled) return server_error(e, 503, "server_error", NULL, NULL, "the request was cancelled");
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ run */

static int respond_429(srv_call *c, const lm_server_error *e) {
    char *j = srv_error_json(e);
    int rc = srv_respond(c->srv, c->conn, 429, "application/json", j ? j : "{}", j ? strlen(j) : 2, "Retry-After", "1");
    lm_free(j);
    return rc;
}

int embed_run(srv_call *c) {
    lm_server *s = c->srv;
    lm_server_error e;
    struct srv_embed *m = lm_calloc(1, sizeof *m);
    if (!m) {
        server_error(&e, 500, "server_error", NULL, NULL, "out of memory");
        return srv_respond_error(s, c->conn, &e);
    }
    if (server_parse_embed(&s->pctx, c->body.p, c->body.len, &m->req, &e)) {
        lm_free(m);
        return srv_respond_error(s, c->conn, &e);
    }
    c->emb = m;
    m->width = s->pctx.n_embd;
    int n = m->req.n_inputs;
    m->subs = lm_calloc((size_t)n, sizeof *m->subs);
    m->pooled = lm_malloc((size_t)n * (size_t)m->width * sizeof(float));
    if (!m->subs || !m->pooled) {
        server_error(&e, 500, "server_error", NULL, NULL, "out of memory");
        return srv_respond_error(s, c->conn, &e);
    }
    if (submit_all(c, &e)) {
        cancel_all(c); /* embed_call_free waits for their final events */
        return e.status == 429 ? respond_429(c, &e) : srv_respond_error(s, c->conn, &e);
    }
    int seen = 0;
    while (seen < n) {
        seen = wait_finals(c, seen);
        pthread_mutex_lock(&c->mu);
        bool failed = m->error[0] != 0;
        pthread_mutex_unlock(&c->mu);
        if (failed && !c->cancelled) cancel_all(c); /* the answer is that error: the rest need not run */
    }
    if (c->disconnected) return MHD_NO;
    if (m->error[0]) {
        char param[24];
        snprintf(param, sizeof param, n > 1 ? "input[%d]" : "input", m->error_input);
        srv_status_error(&e, m->error_st, param, m->error);
        return srv_respond_error(s, c->conn, &e);
    }
    if (c->timed_out || c->cancelled || m->n_ok < n) {
        server_error(&e, 503, "server_error", NULL, NULL, "%s",
                     c->timed_out ? "the request ran past the server's timeout" : "the server is shutting down");
        return srv_respond_error(s, c->conn, &e);
    }
    /* each vector truncated and normalized in place: row i moves to its
     * place in (n, dimensions), at or before where it is read */
    int d = m->req.dimensions;
    for (int i = 0; i < n; i++) {
        const float *src = m->pooled + (size_t)i * (size_t)m->width;
        if (server_embed_vector(&m->req, src, m->width, m->pooled + (size_t)i * (size_t)d)) {
            server_error(&e, 500, "server_error", NULL, NULL, "input %d's embedding holds a value that is not finite",
                         i);
            return srv_respond_error(s, c->conn, &e);
        }
    }
    char *body = server_embed_answer(&m->req, s->model_name, m->pooled);
    if (!body) {
        server_error(&e, 500, "server_error", NULL, NULL, "out of memory formatting the answer");
        return srv_respond_error(s, c->conn, &e);
    }
    int rc = srv_respond(s, c->conn, 200, "application/json", body, strlen(body), NULL, NULL);
    lm_free(body);
    return rc;
}

void embed_call_free(srv_call *c) {
    struct srv_embed *m = c->emb;
    if (!m) return;
    pthread_mutex_lock(&c->mu);
    bool all = m->n_final >= m->n_subs;
    pthread_mutex_unlock(&c->mu);
    if (!all) cancel_all(c);
    pthread_mutex_lock(&c->mu);
    while (m->n_final < m->n_subs) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < m->n_subs; i++) engine_request_release(c->engine, m->subs[i].handle);
    server_embed_request_free(&m->req);
    lm_free(m->subs);
    lm_free(m->pooled);
    lm_free(m);
    c->emb = NULL;
}
