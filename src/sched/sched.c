/*
 * sched.c - the scheduling policy (see sched.h for the contract).
 *
 * Data. `running` is an unordered set of at most max_seqs handles; `waiting`
 * is an array kept sorted (insertion: queues are short next to a forward
 * pass). Its capacity never drops below n_waiting + n_running, so a
 * preempted sequence always has a slot to go back to without allocating.
 *
 * A plan is a pure function of the queues, the view and the answers given
 * in this iteration: sched_decide recomputes it from scratch each time, so
 * after an answer the same steps lead to the same point and go on past it.
 * Marks on running sequences (in the batch, preempted) are the plan's
 * scratch and mean nothing outside it, as is the latency bound's state
 * (`bound`, `left`, `floor_left`: set once the plan's decodes are in).
 */
#include "sched/sched.h"

#include <math.h>
#include <string.h>

#include "base/util.h"

enum { MARK_NONE = 0, MARK_BATCH, MARK_PREEMPT };

struct sched {
    sched_config cfg;
    sched_seq **running; /* (max_seqs) */
    int n_running;
    sched_seq **waiting; /* (wait_cap) sorted by sched_before */
    int n_waiting, wait_cap;
    sched_seq **order; /* (max_seqs) running, sorted, per plan */
    uint64_t epoch;
    bool static_open; /* static batching: the current batch still admits */
    int static_count; /* sequences admitted into it */
    sched_seq *held;  /* a waiting sequence that must run whole, reached by admission without room
                         for it: admitted first, nothing before it (NULL: none) */
    sched_plan plan;
    /* the latency bound of the plan being made (sched_view.cap) */
    sched_cap cap;
    bool bound;     /* on, and the plan holds a decode: prompt chunks are cut */
    double left;    /*   what prompt chunks may still cost */
    int floor_left; /*   prompt tokens the floor still grants */
};

bool sched_before(const sched_seq *a, const sched_seq *b) {
    if (a->priority != b->priority) return a->priority < b->priority;
    if (a->fair != b->fair) return a->fair < b->fair;
    if (a->arrival != b->arrival) return a->arrival < b->arrival;
    return a->index < b->index;
}

sched *sched_new(const sched_config *c) {
    if (c->batch_tokens < 1 || c->max_seqs < 1 || c->block_size < 1 || c->n_class < 1 || c->n_class > KV_N_CLASS)
        return NULL;
    sched *s = lm_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->cfg = *c;
    size_t S = (size_t)c->max_seqs;
    s->running = lm_calloc(S, sizeof *s->running);
    s->order = lm_calloc(S, sizeof *s->order);
    s->plan.run = lm_calloc(S, sizeof *s->plan.run);
    s->plan.admit = lm_calloc(S, sizeof *s->plan.admit);
    s->plan.preempt = lm_calloc(S, sizeof *s->plan.preempt);
    s->plan.reject = lm_calloc(S, sizeof *s->plan.reject);
    if (!s->running || !s->order || !s->plan.run || !s->plan.admit || !s->plan.preempt || !s->plan.reject) {
        sched_free(s);
        return NULL;
    }
    return s;
}

void sched_free(sched *s) {
    if (!s) return;
    lm_free(s->running);
    lm_free(s->waiting);
    lm_free(s->order);
    lm_free(s->plan.run);
    lm_free(s->plan.admit);
    lm_free(s->plan.preempt);
    lm_free(s->plan.reject);
    lm_free(s);
}

/* ---- queues ------------------------------------------------------------ */

/* Room for every queued sequence plus `more` in the waiting array. */
static int wait_room(sched *s, int more) {
    int want = s->n_waiting + s->n_running + more;
    if (want <= s->wait_cap) return 0;
    int cap = s->wait_cap ? s->wait_cap : 64;
    while (cap < want) cap *= 2;
    sched_seq **w = lm_realloc(s->waiting, (size_t)cap * sizeof *w);
    if (!w) return -1;
    s->waiting = w;
    s->wait_cap = cap;
    return 0;
}

/* Sorted insert; the room is there (wait_room). */
static void wait_insert(sched *s, sched_seq *q) {
    int i = s->n_waiting++;
    while (i > 0 && sched_before(q, s->waiting[i - 1])) {
        s->waiting[i] = s->waiting[i - 1];
        i--;
    }
    s->waiting[i] = q;
    q->where = SCHED_WAITING;
}

static void wait_remove(sched *s, sched_seq *q) {
    if (s->held == q) s->held = NULL; /* admitted, finished or cancelled */
    for (int i = 0; i < s->n_waiting; i++)
        if (s->waiting[i] == q) {
            memmove(s->waiting + i, s->waiting + i + 1, (size_t)(s->n_waiting - i - 1) * sizeof *s->waiting);
            s->n_waiting--;
            break;
        }
    q->where = SCHED_NONE;
}

static void running_remove(sched *s, sched_seq *q) {
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i] == q) {
            memmove(s->running + i, s->running + i + 1, (size_t)(s->n_running - i - 1) * sizeof *s->running);
            s->n_running--;
            break;
        }
    q->where = SCHED_NONE;
}

int sched_enqueue(sched *s, sched_seq *q) {
    if (wait_room(s, 1) != 0) return -1;
    wait_insert(s, q);
    return 0;
}

bool sched_start(sched *s, sched_seq *q) {
    if (s->n_running >= s->cfg.max_seqs || wait_room(s, 1) != 0) return false;
    s->running[s->n_running++] = q;
    q->where = SCHED_RUNNING;
    return true;
}

void sched_remove(sched *s, sched_seq *q) {
    if (q->where == SCHED_RUNNING) running_remove(s, q);
    else if (q->where == SCHED_WAITING) wait_remove(s, q);
}

void sched_requeue(sched *s, sched_seq *q) {
    if (q->where != SCHED_RUNNING) return;
    running_remove(s, q);
    wait_insert(s, q); /* wait_room kept a slot for every running sequence */
}

void sched_retag(sched *s, sched_seq *q, int64_t fair) {
    if (q->where != SCHED_WAITING) {
        q->fair = fair;
        return;
    }
    wait_remove(s, q);
    q->fair = fair;
    wait_insert(s, q); /* into the slot it left */
}

int sched_n_running(const sched *s) { return s->n_running; }
int sched_n_waiting(const sched *s) { return s->n_waiting; }
sched_seq *sched_running_at(const sched *s, int i) { return s->running[i]; }
sched_seq *sched_waiting_at(const sched *s, int i) { return s->waiting[i]; }

/* ---- planning ---------------------------------------------------------- */

void sched_begin(sched *s) { s->epoch++; }

static bool answered(const sched *s, const sched_seq *q) { return q->epoch == s->epoch; }

void sched_answer_frees(sched *s, sched_seq *q, const int64_t frees[KV_N_CLASS]) {
    memcpy(q->frees, frees, sizeof q->frees);
    q->epoch = s->epoch;
}

void sched_answer_admit(sched *s, sched_seq *q, int cached, const int64_t take[KV_N_CLASS],
                        const int64_t need[KV_N_CLASS]) {
    q->cached = cached;
    memcpy(q->take, take, sizeof q->take);
    memcpy(q->need, need, sizeof q->need);
    q->epoch = s->epoch;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Whether q's append must copy its partial last block of class k: others
 * still hold it once the sharers this plan grew (each took a copy) or
 * preempted have let go. */
static bool must_copy(const sched *s, const sched_seq *q, int k, int n_order) {
    if (q->shared[k] < 0) return false;
    int refs = q->shared_refs[k];
    for (int i = 0; i < n_order && refs > 1; i++) {
        const sched_seq *o = s->order[i];
        if (o != q && o->mark != MARK_NONE && o->shared[k] == q->shared[k]) refs--;
    }
    return refs > 1;
}

/* Blocks of each class a running sequence's growth by n takes. */
static void grow_need(const sched *s, const sched_seq *q, int n, int n_order, int64_t need[KV_N_CLASS]) {
    int64_t B = s->cfg.block_size, fresh = ceil_div((int64_t)q->len + n, B) - ceil_div(q->len, B);
    for (int k = 0; k < KV_N_CLASS; k++) {
        need[k] = k < s->cfg.n_class ? fresh + q->extra[k] + must_copy(s, q, k, n_order) : 0;
        if (need[k] < 0) need[k] = 0;
    }
}

static bool fits(const int64_t need[KV_N_CLASS], const int64_t avail[KV_N_CLASS]) {
    for (int k = 0; k < KV_N_CLASS; k++)
        if (need[k] > avail[k]) return false;
    return true;
}

/* The running sequence to preempt for q: the worst one neither in the batch
 * nor already preempted, or q itself when it is the worst. */
static sched_seq *victim_for(const sched *s, sched_seq *q, int n_order) {
    sched_seq *v = NULL;
    for (int i = 0; i < n_order; i++) {
        sched_seq *c = s->order[i];
        if (c->mark != MARK_NONE || c == q) continue;
        if (!v || sched_before(v, c)) v = c;
    }
    return !v || sched_before(v, q) ? q : v;
}

double sched_chunk_cost(const sched_cap *c, int n, int depth) {
    double N = n, d = depth;
    return N * c->tok + c->pos * (N * d + N * (N + 1) / 2);
}

int sched_chunk_fit(const sched_cap *c, double budget, int depth, int max) {
    if (max <= 0 || !(budget >= 0)) return 0;
    if (sched_chunk_cost(c, max, depth) <= budget) return max;
    /* cost(n) = a n^2 + b n, increasing: the root of a n^2 + b n = budget,
     * then a step either way for rounding */
    double a = c->pos / 2, b = c->tok + c->pos * (depth + 0.5), x;
    if (a > 0) x = (-b + sqrt(b * b + 4 * a * budget)) / (2 * a);
    else x = b > 0 ? budget / b : max;
    int n = !(x >= 0) ? 0 : x >= max ? max : (int)x;
    while (n < max && sched_chunk_cost(c, n + 1, depth) <= budget) n++;
    while (n > 0 && sched_chunk_cost(c, n, depth) > budget) n--;
    return n;
}

/* The latency bound applies to the plan's prompt tokens once its decodes
 * are in: when it is on and one of them is. Its budget grows with the
 * prompts in prefill or waiting per decode (sched.h: max(1, W / D)). */
static void bound_begin(sched *s, const sched_plan *p) {
    int decodes = 0, prompts = s->n_waiting;
    for (int i = 0; i < p->n_run && s->cap.on; i++) decodes += p->run[i].seq->n_pending == 1;
    for (int i = 0; i < s->n_running && s->cap.on; i++) prompts += s->running[i]->n_pending > 1;
    s->bound = decodes > 0;
    s->left = s->cap.budget * (prompts > decodes ? (double)prompts / decodes : 1.0);
    s->floor_left = s->cap.floor > 0 ? s->cap.floor : 0;
}

/* A prompt chunk of n tokens at depth, cut to the latency bound when it is
 * on (the floor first, then what the budget leaves); 0: none this plan. */
static int bound_cut(sched *s, int n, int depth) {
    if (!s->bound) return n;
    int fit = sched_chunk_fit(&s->cap, s->left, depth, n);
    if (fit < s->floor_left) fit = s->floor_left < n ? s->floor_left : n;
    s->left -= sched_chunk_cost(&s->cap, fit, depth);
    s->floor_left = fit < s->floor_left ? s->floor_left - fit : 0;
    return fit;
}

/* Step 1: the running sequences' tokens, preempting where blocks run out.
 * Returns false when it stopped to ask. */
static bool plan_running(sched *s, sched_plan *p, int64_t avail[KV_N_CLASS], int *n_live) {
    int n_order = s->n_running, budget = s->cfg.batch_tokens;
    memcpy(s->order, s->running, (size_t)n_order * sizeof *s->order);
    for (int i = 1; i < n_order; i++)
        for (int j = i; j > 0 && sched_before(s->order[j], s->order[j - 1]); j--) {
            sched_seq *t = s->order[j];
            s->order[j] = s->order[j - 1];
            s->order[j - 1] = t;
        }
    for (int i = 0; i < n_order; i++) s->order[i]->mark = MARK_NONE;
    for (int pass = 0; pass < 2; pass++) { /* decodes, then prefill chunks */
        if (pass == 1) bound_begin(s, p);
        for (int i = 0; i < n_order && p->n_tokens < budget; i++) {
            sched_seq *q = s->order[i];
            if (q->mark != MARK_NONE || (pass == 0) != (q->n_pending == 1)) continue;
            int n = q->n_pending < budget - p->n_tokens ? q->n_pending : budget - p->n_tokens;
            if (pass == 1 && !(n = bound_cut(s, n, q->len))) break;
            for (;;) {
                int64_t need[KV_N_CLASS]; /* again after each preemption: a sibling's may spare a copy */
                grow_need(s, q, n, n_order, need);
                if (fits(need, avail)) {
                    for (int k = 0; k < KV_N_CLASS; k++) avail[k] -= need[k];
                    p->run[p->n_run++] = (sched_item){q, n};
                    p->n_tokens += n;
                    q->mark = MARK_BATCH;
                    break;
                }
                sched_seq *v = victim_for(s, q, n_order);
                if (!answered(s, v)) {
                    p->ask = v;
                    return false;
                }
                for (int k = 0; k < KV_N_CLASS; k++) avail[k] += v->frees[k];
                v->mark = MARK_PREEMPT;
                p->preempt[p->n_preempt++] = v;
                (*n_live)--;
                if (v == q) break;
            }
        }
    }
    return true;
}

/* Whether a sequence this plan preempted would queue before q: it heads
 * the queue (the pool was short a moment ago), so admission stops there and
 * it is considered again by the next plan. */
static bool preempted_before(const sched_plan *p, const sched_seq *q) {
    for (int i = 0; i < p->n_preempt; i++)
        if (sched_before(p->preempt[i], q)) return true;
    return false;
}

/* The w-th waiting sequence in the order admission considers them: the
 * held one first (sched.h: a sequence that must run whole keeps its turn),
 * then the queue's order without it. */
static sched_seq *candidate(const sched *s, int w) {
    const sched_seq *h = s->held;
    if (!h) return s->waiting[w];
    if (w == 0) return s->held;
    int at = 0;
    while (s->waiting[at] != h) at++;
    return s->waiting[w - 1 < at ? w - 1 : w];
}

/* Step 2: admissions from the head of the waiting queue. Returns false when
 * it stopped to ask. */
static bool plan_admit(sched *s, sched_plan *p, int64_t avail[KV_N_CLASS], int n_live) {
    const sched_config *c = &s->cfg;
    if (c->static_batching && n_live == 0) {
        p->static_open = true; /* a new batch forms, over as many iterations as its prompts need */
        p->static_count = 0;
    }
    if (c->static_batching && !p->static_open) return true;
    p->hold = s->held;
    for (int w = 0; p->n_tokens < c->batch_tokens;) {
        if (w >= s->n_waiting || n_live >= c->max_seqs || preempted_before(p, candidate(s, w))) {
            p->static_open = false;
            break;
        }
        sched_seq *q = candidate(s, w);
        if (!answered(s, q)) {
            p->ask = q;
            return false;
        }
        bool alone = n_live == 0;
        int64_t wm = alone ? 0 : c->wm_blocks;
        bool ok = q->take[KV_GLOBAL] + q->need[KV_GLOBAL] + wm <= avail[KV_GLOBAL];
        for (int k = 1; k < c->n_class; k++) ok = ok && q->take[k] + q->need[k] <= avail[k];
        if (!ok) {
            p->static_open = false;
            if (!alone) break;
            p->reject[p->n_reject++] = q; /* the pool cannot take it even empty */
            w++;
            if (p->n_reject == c->max_seqs) break;
            continue;
        }
        int rest = q->n_pending - q->cached;
        if (q->whole && rest > c->batch_tokens - p->n_tokens) { /* one pass or none: it goes first next */
            p->hold = q;
            p->static_open = false;
            break;
        }
        int n = rest < c->batch_tokens - p->n_tokens ? rest : c->batch_tokens - p->n_tokens;
        if (!q->whole && !(n = bound_cut(s, n, q->cached))) break; /* the bound is spent: the next plan */
        /* this iteration's chunk takes its cached blocks and its own new ones */
        int64_t chunk = ceil_div(n, c->block_size);
        for (int k = 0; k < c->n_class; k++) avail[k] -= q->take[k] + (chunk < q->need[k] ? chunk : q->need[k]);
        p->admit[p->n_admit++] = (sched_item){q, n};
        p->n_tokens += n;
        n_live++;
        w++;
        if (c->static_batching && ++p->static_count >= c->max_seqs) {
            p->static_open = false;
            break;
        }
    }
    return true;
}

/* Step 3: proposed tokens join their decodes with what the budget, the cap
 * and the blocks leave. */
static void plan_spec(sched *s, sched_plan *p, int64_t avail[KV_N_CLASS]) {
    int left = s->cfg.spec_cap, n_order = s->n_running;
    for (int i = 0; i < p->n_run && left > 0 && p->n_tokens < s->cfg.batch_tokens; i++) {
        sched_item *it = &p->run[i];
        sched_seq *q = it->seq;
        if (q->n_pending != 1 || q->n_spec <= 0 || it->n != 1) continue;
        int k = q->n_spec;
        if (k > left) k = left;
        if (k > s->cfg.batch_tokens - p->n_tokens) k = s->cfg.batch_tokens - p->n_tokens;
        for (; k > 0; k--) {
            /* only the new blocks differ from what its decode already took */
            int64_t base[KV_N_CLASS], more[KV_N_CLASS], diff[KV_N_CLASS];
            grow_need(s, q, 1, n_order, base);
            grow_need(s, q, 1 + k, n_order, more);
            for (int c = 0; c < KV_N_CLASS; c++) diff[c] = more[c] - base[c];
            if (!fits(diff, avail)) continue;
            for (int c = 0; c < KV_N_CLASS; c++) avail[c] -= diff[c];
            it->n += k;
            p->n_tokens += k;
            left -= k;
            break;
        }
    }
}

const sched_plan *sched_decide(sched *s, const sched_view *v) {
    sched_plan *p = &s->plan;
    p->ask = NULL;
    p->n_run = p->n_admit = p->n_preempt = p->n_reject = p->n_tokens = 0;
    p->hold = NULL;
    p->static_open = s->static_open;
    p->static_count = s->static_count;
    int64_t avail[KV_N_CLASS];
    for (int k = 0; k < KV_N_CLASS; k++) avail[k] = k < s->cfg.n_class ? v->avail[k] : 0;
    int n_live = s->n_running;
    s->cap = v->cap;
    s->bound = false;
    if (plan_running(s, p, avail, &n_live) && plan_admit(s, p, avail, n_live) && s->cfg.spec_cap > 0)
        plan_spec(s, p, avail);
    return p;
}

void sched_commit(sched *s, const sched_plan *p) {
    for (int i = 0; i < p->n_preempt; i++) sched_requeue(s, p->preempt[i]);
    for (int i = 0; i < p->n_admit; i++) {
        sched_seq *q = p->admit[i].seq;
        wait_remove(s, q);
        s->running[s->n_running++] = q;
        q->where = SCHED_RUNNING;
    }
    s->static_open = p->static_open;
    s->static_count = p->static_count;
    if (p->hold && p->hold->where == SCHED_WAITING) s->held = p->hold;
}
