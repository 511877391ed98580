/*
 * engine_fair.c - fairness between the engine's clients (contract in
 * engine_int.h): each choice's fair-queuing tag, the clients' counts, the
 * virtual time admissions move, and the fair share of the sequence slots
 * (engine_fair_preempt). engine.c calls these; they change the scheduler's
 * order only through sched_retag and sched_requeue and free a choice's KV
 * only through engine_preempt.
 *
 * Threads. The tags and the clients' table are under mu (submitters take
 * tags); engine_fair_preempt runs on the engine thread between iterations.
 * Bounds: at most ENGINE_MAX_CLIENTS clients are remembered at once.
 */
#include "sched/engine_int.h"

#include <pthread.h>

#include "base/util.h"
#include "sched/sched.h"

/* Fair queuing. Every choice gets a tag: the next after the larger of the
 * engine's virtual time (the largest tag admitted so far) and its client's
 * last tag. Among equal priorities the scheduler runs the smallest tag
 * first, so a client with many choices queued has tags far ahead of
 * vtime and a newcomer's first choice slots in right after what runs now,
 * while each client's own choices keep their arrival order. A request
 * without a client (0) stays outside the turns: its choices' tags are 0,
 * so such requests go by arrival alone (then choice index), as every
 * request did before clients, ahead of the clients' queued choices.
 * Returns the first of n
 * tags; *counted says whether the client is remembered (not when
 * ENGINE_MAX_CLIENTS others are: its tags then start from vtime). */
int64_t engine_client_take(lm_engine *e, uint64_t id, int n, bool *counted) {
    *counted = false;
    if (!id) return 0;
    int64_t base = e->vtime + 1;
    for (int i = 0; i < e->n_clients; i++)
        if (e->clients[i].id == id) {
            struct eclient *c = &e->clients[i];
            if (c->last + 1 > base) base = c->last + 1;
            c->n += n;
            c->last = base + n - 1;
            *counted = true;
            return base;
        }
    if (e->n_clients == e->clients_cap) {
        int cap = e->clients_cap ? e->clients_cap * 2 : 16;
        if (cap > ENGINE_MAX_CLIENTS) return base;
        struct eclient *nc = lm_realloc(e->clients, (size_t)cap * sizeof *nc);
        if (!nc) return base;
        e->clients = nc;
        e->clients_cap = cap;
    }
    e->clients[e->n_clients++] = (struct eclient){id, n, base + n - 1};
    *counted = true;
    return base;
}

/* One choice of client id finished. */
void engine_client_done(lm_engine *e, uint64_t id) {
    for (int i = 0; i < e->n_clients; i++)
        if (e->clients[i].id == id) {
            if (--e->clients[i].n <= 0) e->clients[i] = e->clients[--e->n_clients];
            return;
        }
}

/* Choice c was admitted: the virtual time reaches its tag, and its request
 * no longer counts as waiting. */
void engine_request_started(lm_engine *e, eseq *c) {
    pthread_mutex_lock(&e->mu);
    if (c->sq.fair > e->vtime) e->vtime = c->sq.fair;
    if (!c->req->started) {
        c->req->started = true;
        e->n_req_waiting--;
    }
    pthread_mutex_unlock(&e->mu);
}

/* Request r ended without a choice admitted: it no longer waits. */
void engine_request_ended_waiting(lm_engine *e, lm_request *r) {
    pthread_mutex_lock(&e->mu);
    r->started = true;
    e->n_req_waiting--;
    pthread_mutex_unlock(&e->mu);
}

/* Fair share of the sequence slots: when max_seqs run and a waiting
 * choice near the head belongs to a client with nothing running, the
 * latest admitted choice of the client holding the most slots (two at
 * least) is preempted and its tag moved behind that client's queued work,
 * and the newcomer moves to the head of the waiting queue, so it takes the
 * slot in this iteration's plan. Each client
 * that waits thus gets one sequence running within an iteration, however
 * many one other client holds; the rest of the slots go by the tags as
 * before. Never for choices without a client (0) or across priorities
 * (the newcomer's must be at least as good). At most one per iteration:
 * afterwards a slot is free until an admission fills it. The look costs
 * one pass over the waiting queue, each client checked against the
 * running set (max_seqs) once per run of its choices, only when every
 * slot is taken. */
void engine_fair_preempt(lm_engine *e) {
    int n_run = sched_n_running(e->sc), n_wait = sched_n_waiting(e->sc);
    if (n_run < e->cfg.max_seqs || n_wait == 0) return;
    eseq *newcomer = NULL;
    uint64_t seen = 0; /* the client last found running (the queue holds runs of one client's choices) */
    for (int w = 0; w < n_wait && !newcomer; w++) {
        eseq *q = CHOICE(sched_waiting_at(e->sc, w));
        uint64_t id = q->req->p.client;
        if (!id || id == seen) continue;
        bool runs = false;
        for (int i = 0; i < n_run && !runs; i++) runs = CHOICE(sched_running_at(e->sc, i))->req->p.client == id;
        if (runs) seen = id;
        else newcomer = q;
    }
    if (!newcomer) return;
    /* the client holding the most slots, and its latest admitted choice */
    uint64_t top = 0;
    int top_n = 0;
    for (int i = 0; i < n_run; i++) {
        uint64_t id = CHOICE(sched_running_at(e->sc, i))->req->p.client;
        if (!id || id == top) continue;
        int n = 0;
        for (int j = 0; j < n_run; j++) n += CHOICE(sched_running_at(e->sc, j))->req->p.client == id;
        if (n > top_n) top = id, top_n = n;
    }
    if (top_n < 2) return;
    eseq *victim = NULL;
    for (int i = 0; i < n_run; i++) {
        eseq *c = CHOICE(sched_running_at(e->sc, i));
        if (c->req->p.client != top || c->sq.priority < newcomer->sq.priority) continue;
        if (!victim || sched_before(&victim->sq, &c->sq)) victim = c;
    }
    if (!victim) return;
    pthread_mutex_lock(&e->mu);
    int64_t tag = e->vtime + 1;
    for (int i = 0; i < e->n_clients; i++)
        if (e->clients[i].id == top) {
            if (e->clients[i].last + 1 > tag) tag = e->clients[i].last + 1;
            e->clients[i].last = tag;
        }
    pthread_mutex_unlock(&e->mu);
    sched_retag(e->sc, &victim->sq, tag); /* (running: ordered from the requeue on) */
    sched_requeue(e->sc, &victim->sq);
    engine_preempt(e, victim);
    /* the newcomer to the head of its priority, ahead of the tags the
     * dominant client's choices hold (admission is not strictly in tag
     * order: forks start beside their parent) */
    sched_seq *head = sched_waiting_at(e->sc, 0);
    if (head != &newcomer->sq && head->priority == newcomer->sq.priority && head->fair <= newcomer->sq.fair)
        sched_retag(e->sc, &newcomer->sq, head->fair - 1);
}
