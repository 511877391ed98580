/*
 * route_queue.c - the router's shared state changes, under rt->mu: the
 * global queue (push, remove), a request's references and its end (FINAL:
 * counted, traced, its client woken), the concurrency trace's samples, and
 * the routing policies (rt_pick: round robin, least outstanding, prefix
 * affinity with bounded loads; a request never goes to a replica it is
 * barred from; route.h). Both sides call it: route.c (the client side) and
 * route_up.c (the replica side); it calls neither, and touches no socket
 * and no transfer.
 */
#include <math.h>
#include <stdio.h>

#include "base/util.h"
#include "route/route_int.h"

/* ------------------------------------------------------------- the queue */

void rt_queue_push(lm_router *r, rt_req *q, bool front) {
    q->state = RQ_QUEUED;
    q->t_queued = lm_now();
    q->prev = q->next = NULL;
    if (front) {
        q->next = r->q_head;
        if (r->q_head) r->q_head->prev = q;
        else r->q_tail = q;
        r->q_head = q;
    } else {
        q->prev = r->q_tail;
        if (r->q_tail) r->q_tail->next = q;
        else r->q_head = q;
        r->q_tail = q;
    }
    r->q_len++;
}

void rt_queue_remove(lm_router *r, rt_req *q) {
    if (q->prev) q->prev->next = q->next;
    else r->q_head = q->next;
    if (q->next) q->next->prev = q->prev;
    else r->q_tail = q->prev;
    q->prev = q->next = NULL;
    r->q_len--;
}

void rt_req_unref(lm_router *r, rt_req *q) {
    if (--q->refs > 0) return;
    lm_free(q->body);
    strbuf_free(&q->buf);
    pthread_cond_destroy(&q->cv);
    lm_free(q);
}

static void trace_req(lm_router *r, rt_req *q) {
    double t0 = r->t0;
#define REL(t) ((t) > 0 ? (t)-t0 : -1.0)
    /* admitted by the replica's engine: the send plus the queue time the
     * replica reported (its header, or its stream's closing comment) */
    double up = q->up_queue >= 0 ? q->up_queue : q->sse.queue_time;
    char eng[32] = "null";
    if (up >= 0 && q->t_send > 0) snprintf(eng, sizeof eng, "%.6f", q->t_send + up - t0);
    fprintf(r->trace,
            "{\"kind\":\"req\",\"id\":%llu,\"replica\":%d,\"attempts\":%d,\"stream\":%s,\"status\":%ld,"
            "\"error\":%d,\"arrive\":%.6f,\"admit\":%.6f,\"send\":%.6f,\"engine_admit\":%s,\"first\":%.6f,"
            "\"done\":%.6f}\n",
            (unsigned long long)q->id, q->replica, q->attempts, q->stream ? "true" : "false", q->status,
            q->error_status, REL(q->t_arrive), REL(q->t_admit), REL(q->t_send), eng, REL(q->t_first), REL(q->t_done));
#undef REL
}

void rt_finish(lm_router *r, rt_req *q) {
    q->state = RQ_FINAL;
    q->t_done = lm_now();
    if (q->error_status == 499) r->cancelled++;
    else if (q->error_status) r->failed++;
    else r->completed++;
    if (q->t_admit > 0) {
        double w = q->t_admit - q->t_arrive;
        int b = 0;
        while (b < RT_NHIST && w > r->qhist_bounds[b]) b++;
        r->qhist[b]++;
        r->qhist_sum += w;
        r->qhist_count++;
    }
    if (r->trace) trace_req(r, q);
    pthread_cond_broadcast(&q->cv);
}

void rt_trace_sample(lm_router *r) {
    if (!r->trace) return;
    fprintf(r->trace, "{\"kind\":\"sample\",\"t\":%.6f,\"queue\":%d,\"replicas\":[", lm_now() - r->t0, r->q_len);
    for (int i = 0; i < r->n_rep; i++) {
        const rt_replica *p = &r->rep[i];
        fprintf(r->trace,
                "%s{\"healthy\":%s,\"inflight\":%d,\"limit\":%d,\"running\":%g,\"waiting\":%g,"
                "\"batch\":%.4g}",
                i ? "," : "", p->healthy ? "true" : "false", p->in_flight, p->limit, p->st.running, p->st.waiting,
                p->batch_mean);
    }
    fputs("]}\n", r->trace);
    fflush(r->trace);
}

/* ------------------------------------------------------------- policies */

/* Leading keys of q the replica is believed to hold. */
static int match_len(const rt_replica *p, const rt_req *q) {
    int k = 0;
    while (k < q->n_keys && p->slots[q->keys[k] & (RT_SLOTS - 1)] == q->keys[k]) k++;
    return k;
}

int rt_pick(lm_router *r, rt_req *q) {
    bool cand[RT_MAX_REPLICAS];
    int n_cand = 0, n_healthy = 0, untried = 0, total = 0;
    for (int i = 0; i < r->n_rep; i++) {
        const rt_replica *p = &r->rep[i];
        cand[i] = p->healthy && p->in_flight < p->limit && !q->barred[i];
        n_healthy += p->healthy;
        total += p->in_flight;
        if (p->healthy && !q->tried[i]) untried++;
    }
    /* a retry goes to a healthy replica it has not tried, waiting for one to have room, and
     * back to one it tried only when there is no other, never to one it is barred from */
    for (int i = 0; i < r->n_rep; i++) {
        if (cand[i] && untried && q->tried[i]) cand[i] = false;
        n_cand += cand[i];
    }
    if (!n_cand) return -1;
    int pick = -1;
    if (r->cfg.policy == RT_POLICY_RR) {
        for (int k = 0; k < r->n_rep && pick < 0; k++) {
            int i = (r->rr_next + k) % r->n_rep;
            if (cand[i]) pick = i;
        }
        r->rr_next = (pick + 1) % r->n_rep;
        r->decisions[1]++;
        return pick;
    }
    int best_match = 0;
    if (r->cfg.policy == RT_POLICY_PREFIX && q->n_keys > 0) {
        /* bounded loads: no replica past ceil(1.25 x mean) + 1 in flight */
        int bound = (int)ceil(1.25 * (total + 1) / (n_healthy ? n_healthy : 1)) + 1;
        for (int i = 0; i < r->n_rep; i++) {
            if (!cand[i] || r->rep[i].in_flight >= bound) continue;
            int m = match_len(&r->rep[i], q);
            if (m > best_match || (m == best_match && m > 0 && r->rep[i].in_flight < r->rep[pick].in_flight))
                best_match = m, pick = i;
        }
        r->routed_with_keys++;
    }
    if (best_match > 0) {
        r->affinity_hits++;
        r->decisions[0]++;
        return pick;
    }
    /* least outstanding; ties rotate so equal replicas share the work */
    pick = -1;
    for (int k = 0; k < r->n_rep; k++) {
        int i = (r->rr_next + k) % r->n_rep;
        if (cand[i] && (pick < 0 || r->rep[i].in_flight < r->rep[pick].in_flight)) pick = i;
    }
    r->rr_next = (pick + 1) % r->n_rep;
    r->decisions[2]++;
    return pick;
}
