/*
 * engine.c - the continuous-batching engine (see engine.h for the contract).
 *
 * Objects. A request (lm_request) is what a submitter holds; it owns n
 * choices (eseq), each one sequence of tokens with its own KV sequence,
 * sampler, detokenizer and stop-string state. Choice 0 prefills the prompt;
 * when its prompt is done, choices 1..n-1 fork its KV blocks (kv_fork: the
 * prompt's blocks are shared, the partial last block is copied on the first
 * write) and sample from the same logits row.
 *
 * A choice's tokens[0..n_tokens) are its prompt and what it generated so far;
 * positions [0, n_computed) of its KV are written. Every pass feeds
 * tokens[n_computed ..] (one token in decode, a chunk in prefill) and wants
 * logits only when the chunk reaches n_tokens. Preemption frees the KV and
 * sets n_computed back to 0: recomputation is then just a longer prefill,
 * and the sampler's RNG and history carry on, so the output is the same.
 *
 * Threads. Submitters only touch the inbox (under mu) and a request's cancel
 * flag (atomic). Everything else - queues, KV bookkeeping, samplers - belongs
 * to the engine thread, which takes mu only to move the inbox, publish
 * statistics and sleep. Callbacks run on the engine thread without mu held,
 * so a callback may call engine_cancel or engine_submit.
 *
 * Scheduling, per iteration (engine.h): cancellations; decode tokens of
 * running choices, best priority first, preempting the worst running choice
 * when a block is missing; prefill chunks of running choices; admission from
 * the waiting queue (priority, then arrival) while the token budget, max_seqs
 * and free blocks above the watermark allow.
 */
#include "sched/engine.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "model/forward.h"
#include "kv/kv.h"
#include "base/pool.h"
#include "format/quant.h"
#include "base/util.h"

typedef enum { CH_PENDING_FORK, CH_WAITING, CH_RUNNING, CH_DONE } ch_state;

enum { STOP_MAX = 1024 }; /* longest stop string, bytes */

typedef struct eseq {
    struct lm_request *req;
    int index;
    ch_state state;
    int32_t *tokens;          /* (cap) prompt then generated */
    int n_tokens, cap, n_prompt;
    int n_computed;           /* KV positions written */
    int n_gen;
    kv_seq *kv;               /* NULL unless running */
    lm_sampler *smp;
    lm_detok dt;
    char *held;               /* (held_cap) released text not yet emitted (stop-string look-behind) */
    int n_held, held_cap;
    bool scheduled;           /* in this iteration's batch */
    bool stop_hit;            /* a stop string ended the text */
    lm_request_stats stats;
} eseq;

struct lm_request {
    atomic_int refs;          /* engine + submitter (when it asked for a handle) */
    atomic_bool cancel;
    uint64_t arrival;         /* submission order */
    int priority;
    int max_tokens;
    bool ignore_eos, logprobs;
    int top_logprobs;
    uint64_t salt;
    char **stop;              /* (n_stop) */
    int n_stop, max_stop_len;
    lm_event_fn on_event;
    void *user;
    int n;                    /* choices */
    int n_live;               /* choices not yet done */
    eseq *ch;                 /* (n) */
    struct lm_request *next;  /* inbox link */
};

struct lm_engine {
    const lm_model *m;
    const lm_tokenizer *tok;
    lm_engine_config cfg;
    int n_ctx;
    lm_pool *pool;
    kv_pool *kv;
    lm_fwd *fwd;              /* the forward pass's workspace: batch_tokens rows */
    int64_t wm_blocks;        /* watermark (global class) */
    int64_t total_blocks[KV_N_CLASS];
    int64_t local_per_seq;    /* most local blocks one sequence holds (0: no window) */

    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t wake;      /* engine thread: work arrived */
    pthread_cond_t idle_cv;   /* waiters of engine_wait_idle / engine_check */
    bool stop;
    lm_request *inbox, *inbox_tail;
    int n_inbox;
    uint64_t next_arrival;
    bool check_req, check_done;
    int check_rc;
    char check_msg[LM_ERRLEN];

    /* engine-thread state */
    eseq **running;           /* (max_seqs) */
    eseq **order;             /* (max_seqs) running, sorted, per iteration */
    int n_running;
    eseq **waiting;           /* (wait_cap) sorted by priority, then arrival */
    bool static_open;         /* static batching: the current batch still admits */
    int static_count;         /* sequences admitted into it */
    int n_waiting, wait_cap;

    /* per-iteration buffers */
    int32_t *btok;            /* (batch_tokens) */
    lm_seg *segs;             /* (max_seqs) */
    eseq **seg_ch;            /* (max_seqs) */
    float *logits;            /* (max_seqs + 2, n_vocab): batch rows, a fork's source and work rows */
    float *lp;                /* (n_vocab) log-probabilities / sampling scratch */
    char *emit;               /* (emit_cap) text of one event: a choice's held text and a flush */
    int emit_cap;
    char *piece;              /* (piece_cap) one token's text, piece_cap = detok_max_out(tok) */
    int piece_cap;

    lm_engine_stats stats;    /* published under mu */
};

/* ---- small helpers ----------------------------------------------------- */

const char *engine_finish_name(lm_finish f) {
    switch (f) {
    case LM_FINISH_STOP: return "stop";
    case LM_FINISH_LENGTH: return "length";
    case LM_FINISH_CANCELLED: return "cancelled";
    case LM_FINISH_ERROR: return "error";
    default: return "none";
    }
}

void engine_config_default(lm_engine_config *c) {
    *c = (lm_engine_config){.n_threads = 0, .batch_tokens = FWD_BATCH_DEFAULT, .max_seqs = 64, .n_ctx = 0,
                            .kv_mem = 0, .kv_type = LM_TYPE_F16, .block_size = KV_DEFAULT_BLOCK, .watermark = 0.01,
                            .max_waiting = 0, .prefix_cache = true, .static_batching = false};
}

void engine_request_params_default(lm_request_params *p) {
    memset(p, 0, sizeof *p);
    sample_params_default(&p->sp);
    p->max_tokens = 16;
    p->n = 1;
}

static void hist_init(lm_hist *h, const double *bounds, int n) {
    memset(h, 0, sizeof *h);
    h->n_bounds = n;
    memcpy(h->bounds, bounds, (size_t)n * sizeof *bounds);
}

static void hist_add(lm_hist *h, double v) {
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

static void request_unref(lm_request *r) {
    if (atomic_fetch_sub(&r->refs, 1) != 1) return;
    for (int i = 0; i < r->n; i++) {
        lm_free(r->ch[i].tokens);
        lm_free(r->ch[i].held);
        sampler_free(r->ch[i].smp);
    }
    for (int i = 0; i < r->n_stop; i++) lm_free(r->stop[i]);
    lm_free(r->stop);
    lm_free(r->ch);
    lm_free(r);
}

/* ---- waiting queue ----------------------------------------------------- */

static bool before(const eseq *a, const eseq *b) {
    if (a->req->priority != b->req->priority) return a->req->priority < b->req->priority;
    if (a->req->arrival != b->req->arrival) return a->req->arrival < b->req->arrival;
    return a->index < b->index;
}

static int wait_push(lm_engine *e, eseq *c) {
    if (e->n_waiting == e->wait_cap) {
        int cap = e->wait_cap ? e->wait_cap * 2 : 64;
        eseq **w = lm_realloc(e->waiting, (size_t)cap * sizeof *w);
        if (!w) return -1;
        e->waiting = w;
        e->wait_cap = cap;
    }
    int i = e->n_waiting++;
    while (i > 0 && before(c, e->waiting[i - 1])) {
        e->waiting[i] = e->waiting[i - 1];
        i--;
    }
    e->waiting[i] = c;
    c->state = CH_WAITING;
    return 0;
}

static void wait_remove(lm_engine *e, int i) {
    memmove(e->waiting + i, e->waiting + i + 1, (size_t)(e->n_waiting - i - 1) * sizeof *e->waiting);
    e->n_waiting--;
}

static void running_remove(lm_engine *e, eseq *c) {
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i] == c) {
            memmove(e->running + i, e->running + i + 1, (size_t)(e->n_running - i - 1) * sizeof *e->running);
            e->n_running--;
            return;
        }
}

/* ---- events ------------------------------------------------------------ */

static void emit_event(lm_engine *e, eseq *c, int32_t tok, const char *text, size_t len, float lp, int n_top,
                       const int32_t *top_ids, const float *top_lp) {
    lm_event ev = {.index = c->index, .token = tok, .text = text, .text_len = len, .logprob = lp, .n_top = n_top,
                   .top_ids = top_ids, .top_logprobs = top_lp, .stats = &c->stats};
    c->req->on_event(c->req->user, &ev);
}

/* End a choice: release its KV (registering its blocks for prefix reuse when
 * it completed normally), flush its text, send the final event; the request
 * loses the engine's reference when its last choice ends. */
static void finish(lm_engine *e, eseq *c, lm_finish why, const char *error) {
    lm_request *r = c->req;
    if (c->state == CH_RUNNING) running_remove(e, c);
    else if (c->state == CH_WAITING)
        for (int i = 0; i < e->n_waiting; i++)
            if (e->waiting[i] == c) {
                wait_remove(e, i);
                break;
            }
    if (c->kv) {
        if (e->cfg.prefix_cache && (why == LM_FINISH_STOP || why == LM_FINISH_LENGTH))
            kv_prefix_commit(e->kv, c->kv, c->tokens, c->n_computed, r->salt);
        kv_seq_free(e->kv, c->kv);
        c->kv = NULL;
    }
    c->state = CH_DONE;
    double now = lm_now();
    c->stats.completion_tokens = c->n_gen;
    c->stats.e2e = now - c->stats.t_submit;
    if (c->n_gen > 1) c->stats.tpot = (c->stats.e2e - c->stats.ttft) / (c->n_gen - 1);
    /* what is still held back is output unless a stop string ended the text */
    size_t len = 0;
    if (!c->stop_hit) {
        memcpy(e->emit, c->held, (size_t)c->n_held);
        len = (size_t)c->n_held;
        if (why == LM_FINISH_STOP || why == LM_FINISH_LENGTH) {
            /* an incomplete UTF-8 tail ends as U+FFFD rather than vanishing */
            int w = detok_flush(&c->dt, e->emit + len, e->emit_cap - (int)len);
            if (w > 0) len += (size_t)w;
        }
    }
    c->n_held = 0;
    lm_event ev = {.index = c->index, .token = -1, .text = e->emit, .text_len = len, .done = true, .finish = why,
                   .error = error, .stats = &c->stats};
    pthread_mutex_lock(&e->mu);
    e->stats.requests_finished += c->index == 0;
    if (why == LM_FINISH_STOP || why == LM_FINISH_LENGTH) {
        if (c->n_gen > 0) hist_add(&e->stats.ttft, c->stats.ttft);
        if (c->n_gen > 1) hist_add(&e->stats.tpot, c->stats.tpot);
        hist_add(&e->stats.e2e, c->stats.e2e);
    }
    pthread_mutex_unlock(&e->mu);
    r->on_event(r->user, &ev);
    /* choices still waiting for a fork from choice 0 cannot get one now */
    if (c->index == 0 && c->n_gen == 0)
        for (int i = 1; i < r->n; i++)
            if (r->ch[i].state == CH_PENDING_FORK) finish(e, &r->ch[i], why, error);
    if (--r->n_live == 0) request_unref(r);
}

/* Text released by the detokenizer: append to the held text, cut at the
 * first stop string, and release all but the longest tail that could still
 * begin one. Returns true when a stop string matched; len: the bytes to emit
 * now from e->emit. */
static bool stop_scan(lm_engine *e, eseq *c, const char *add, int n_add, size_t *len) {
    lm_request *r = c->req;
    memcpy(c->held + c->n_held, add, (size_t)n_add);
    c->n_held += n_add;
    int cut = -1;
    for (int s = 0; s < r->n_stop; s++) {
        const char *hit = memmem(c->held, (size_t)c->n_held, r->stop[s], strlen(r->stop[s]));
        if (hit && (cut < 0 || hit - c->held < cut)) cut = (int)(hit - c->held);
    }
    if (cut >= 0) {
        memcpy(e->emit, c->held, (size_t)cut);
        *len = (size_t)cut;
        c->n_held = 0;
        return true;
    }
    int keep = 0;
    for (int s = 0; s < r->n_stop; s++) {
        int sl = (int)strlen(r->stop[s]);
        for (int k = sl - 1 > c->n_held ? c->n_held : sl - 1; k > keep; k--)
            if (!memcmp(c->held + c->n_held - k, r->stop[s], (size_t)k)) {
                keep = k;
                break;
            }
    }
    *len = (size_t)(c->n_held - keep);
    memcpy(e->emit, c->held, *len);
    memmove(c->held, c->held + *len, (size_t)keep);
    c->n_held = keep;
    return false;
}

/* Sample choice c's next token from its logits row (modified), emit it, and
 * finish the choice if it ended. */
static void take_token(lm_engine *e, eseq *c, float *row) {
    lm_request *r = c->req;
    int32_t V = e->m->hp.n_vocab;
    int n_top = 0;
    int32_t top_ids[LM_MAX_TOP_LOGPROBS];
    float top_lp[LM_MAX_TOP_LOGPROBS];
    if (r->logprobs || r->top_logprobs > 0) {
        sample_log_softmax(row, V, e->lp);
        n_top = sample_top_n(e->lp, V, r->top_logprobs, top_ids, top_lp);
    }
    int32_t t = sampler_sample(c->smp, row);
    if (t < 0) {
        finish(e, c, LM_FINISH_ERROR, "every token is banned (logit_bias)");
        return;
    }
    sampler_accept(c->smp, t);
    double now = lm_now();
    if (c->n_gen == 0) c->stats.ttft = now - c->stats.t_submit;
    c->tokens[c->n_tokens++] = t;
    c->n_gen++;
    pthread_mutex_lock(&e->mu);
    e->stats.generation_tokens_total++;
    pthread_mutex_unlock(&e->mu);
    float lp = (r->logprobs || r->top_logprobs > 0) ? e->lp[t] : 0;

    bool eog = !r->ignore_eos && tok_is_eog(e->tok, t);
    size_t len = 0;
    bool stopped = false;
    if (!eog) {
        int w = detok_push(&c->dt, t, e->piece, e->piece_cap);
        if (w < 0) { /* cannot happen: piece_cap is the detokenizer's maximum */
            finish(e, c, LM_FINISH_ERROR, "internal: a token's text does not fit the detokenizer's maximum");
            return;
        }
        if (r->n_stop) stopped = c->stop_hit = stop_scan(e, c, e->piece, w, &len);
        else {
            memcpy(e->emit, e->piece, (size_t)w);
            len = (size_t)w;
        }
    }
    emit_event(e, c, t, e->emit, len, lp, n_top, top_ids, top_lp);
    if (eog || stopped) finish(e, c, LM_FINISH_STOP, NULL);
    /* the context is full once every position holds a token: the token
     * sampled from the last position's logits ends the text without one */
    else if (c->n_gen >= r->max_tokens || c->n_tokens > e->n_ctx) finish(e, c, LM_FINISH_LENGTH, NULL);
}

/* ---- submission -------------------------------------------------------- */

static int64_t blocks_for(const lm_engine *e, int64_t tokens) {
    return (tokens + e->cfg.block_size - 1) / e->cfg.block_size;
}

static int submit_tokens(lm_engine *e, const lm_request_params *p, lm_request **out, char *err, size_t errlen);

int engine_submit(lm_engine *e, const lm_request_params *p, lm_request **out, char *err, size_t errlen) {
    if (out) *out = NULL;
    if (p->prompt || !p->text) return submit_tokens(e, p, out, err, errlen);
    /* a text prompt: tokenize it here (the context bounds its useful length) */
    if (p->text_len > (size_t)16 * (size_t)e->n_ctx + 4096)
        return lm_err(err, errlen, "the prompt text (%zu bytes) cannot fit the context of %d tokens", p->text_len,
                      e->n_ctx), ENGINE_ETOOBIG;
    int n = tok_encode(e->tok, p->text, p->text_len, tok_add_bos(e->tok), true, NULL, 0);
    if (n < 0) return lm_err(err, errlen, "the prompt text cannot be tokenized"), ENGINE_EINVAL;
    int32_t *ids = lm_malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
    if (!ids) return lm_err(err, errlen, "out of memory"), ENGINE_ENOMEM;
    tok_encode(e->tok, p->text, p->text_len, tok_add_bos(e->tok), true, ids, n);
    lm_request_params q = *p;
    q.prompt = ids;
    q.n_prompt = n;
    int rc = submit_tokens(e, &q, out, err, errlen);
    lm_free(ids);
    return rc;
}

static int submit_tokens(lm_engine *e, const lm_request_params *p, lm_request **out, char *err, size_t errlen) {
    const lm_hparams *hp = &e->m->hp;
    if (!p->on_event) return lm_err(err, errlen, "no event callback"), ENGINE_EINVAL;
    if (!p->prompt || p->n_prompt < 1) return lm_err(err, errlen, "the prompt is empty"), ENGINE_EINVAL;
    if (p->max_tokens < 1) return lm_err(err, errlen, "max_tokens must be at least 1"), ENGINE_EINVAL;
    if (p->n < 1) return lm_err(err, errlen, "n must be at least 1"), ENGINE_EINVAL;
    if (p->n > e->cfg.max_seqs)
        return lm_err(err, errlen, "n = %d is more than the %d sequences the engine runs at once", p->n,
                      e->cfg.max_seqs), ENGINE_ETOOBIG;
    if (p->top_logprobs < 0 || p->top_logprobs > LM_MAX_TOP_LOGPROBS)
        return lm_err(err, errlen, "top_logprobs must be in [0, %d]", LM_MAX_TOP_LOGPROBS), ENGINE_EINVAL;
    if (p->n_stop < 0 || (p->n_stop && !p->stop) || p->n_bias < 0 || (p->n_bias && (!p->bias_ids || !p->bias_vals)))
        return lm_err(err, errlen, "malformed stop or bias list"), ENGINE_EINVAL;
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= hp->n_vocab)
            return lm_err(err, errlen, "prompt token %d (id %d) is out of range [0, %d)", i, p->prompt[i],
                          hp->n_vocab), ENGINE_EINVAL;
    for (int i = 0; i < p->n_bias; i++)
        if (p->bias_ids[i] < 0 || p->bias_ids[i] >= hp->n_vocab)
            return lm_err(err, errlen, "logit_bias token id %d is out of range [0, %d)", p->bias_ids[i],
                          hp->n_vocab), ENGINE_EINVAL;
    for (int i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0] || strlen(p->stop[i]) > STOP_MAX)
            return lm_err(err, errlen, "stop string %d is empty or longer than %d bytes", i, STOP_MAX), ENGINE_EINVAL;
    if (p->n_prompt >= e->n_ctx)
        return lm_err(err, errlen, "the prompt has %d tokens; the context holds %d (room for at least one more is "
                      "needed)", p->n_prompt, e->n_ctx), ENGINE_ETOOBIG;
    /* worst case the request must fit the pool alone: its prompt once, each
     * choice's generated tokens plus a copied partial block */
    int64_t total = (int64_t)p->n_prompt + p->max_tokens;
    if (total > e->n_ctx) total = e->n_ctx;
    int64_t gen = total - p->n_prompt;
    int64_t need = blocks_for(e, total) + (int64_t)(p->n - 1) * (blocks_for(e, gen) + 1);
    if (need > e->total_blocks[KV_GLOBAL])
        return lm_err(err, errlen, "the request needs up to %lld KV blocks; the pool has %lld", (long long)need,
                      (long long)e->total_blocks[KV_GLOBAL]), ENGINE_ETOOBIG;
    /* sliding-window layers: each choice holds at most local_per_seq blocks */
    if (e->local_per_seq) {
        int64_t per = blocks_for(e, total) < e->local_per_seq ? blocks_for(e, total) : e->local_per_seq;
        if (per * p->n > e->total_blocks[KV_LOCAL])
            return lm_err(err, errlen, "the request needs up to %lld local KV blocks; the pool has %lld",
                          (long long)(per * p->n), (long long)e->total_blocks[KV_LOCAL]), ENGINE_ETOOBIG;
    }

    lm_request *r = lm_calloc(1, sizeof *r);
    if (!r) return lm_err(err, errlen, "out of memory"), ENGINE_ENOMEM;
    atomic_init(&r->refs, out ? 2 : 1);
    atomic_init(&r->cancel, false);
    r->priority = p->priority;
    r->max_tokens = p->max_tokens;
    r->ignore_eos = p->ignore_eos;
    r->logprobs = p->logprobs;
    r->top_logprobs = p->top_logprobs;
    r->salt = p->cache_salt;
    r->on_event = p->on_event;
    r->user = p->user;
    r->n = r->n_live = p->n;
    r->ch = lm_calloc((size_t)p->n, sizeof *r->ch);
    r->stop = p->n_stop ? lm_calloc((size_t)p->n_stop, sizeof *r->stop) : NULL;
    bool ok = r->ch && (!p->n_stop || r->stop);
    for (int i = 0; ok && i < p->n_stop; i++) {
        size_t l = strlen(p->stop[i]);
        if (!(r->stop[i] = lm_malloc(l + 1))) ok = false;
        else {
            memcpy(r->stop[i], p->stop[i], l + 1);
            r->n_stop++;
            if ((int)l > r->max_stop_len) r->max_stop_len = (int)l;
        }
    }
    double now = lm_now();
    int cap = (int)total + 1;
    for (int i = 0; ok && i < p->n; i++) {
        eseq *c = &r->ch[i];
        c->req = r;
        c->index = i;
        c->state = i == 0 ? CH_WAITING : CH_PENDING_FORK;
        c->cap = cap;
        c->n_prompt = c->n_tokens = p->n_prompt;
        c->held_cap = r->max_stop_len + e->piece_cap; /* a stop string's prefix kept + one token */
        c->tokens = lm_malloc((size_t)cap * sizeof *c->tokens);
        c->held = lm_malloc((size_t)c->held_cap);
        lm_sample_params sp = p->sp;
        sp.seed += (uint64_t)i;
        c->smp = sampler_new(&sp, hp->n_vocab);
        if (!c->tokens || !c->held || !c->smp) {
            ok = false;
            break;
        }
        memcpy(c->tokens, p->prompt, (size_t)p->n_prompt * sizeof *c->tokens);
        for (int b = 0; b < p->n_bias; b++) sampler_set_bias(c->smp, p->bias_ids[b], p->bias_vals[b]);
        if (p->penalize_prompt)
            for (int k = 0; k < p->n_prompt; k++) sampler_accept(c->smp, p->prompt[k]);
        detok_init(&c->dt, e->tok, false, false);
        c->stats.prompt_tokens = p->n_prompt;
        c->stats.t_submit = now;
    }
    if (!ok) {
        atomic_store(&r->refs, 1);
        request_unref(r);
        return lm_err(err, errlen, "out of memory"), ENGINE_ENOMEM;
    }
    pthread_mutex_lock(&e->mu);
    if (e->stop || (e->cfg.max_waiting > 0 && e->n_inbox + e->stats.waiting >= e->cfg.max_waiting)) {
        bool stopping = e->stop;
        e->stats.requests_rejected++;
        pthread_mutex_unlock(&e->mu);
        atomic_store(&r->refs, 1);
        request_unref(r);
        if (stopping) return lm_err(err, errlen, "the engine is shutting down"), ENGINE_EBUSY;
        return lm_err(err, errlen, "%d requests are already waiting", e->cfg.max_waiting), ENGINE_EBUSY;
    }
    r->arrival = e->next_arrival++;
    if (e->inbox_tail) e->inbox_tail->next = r;
    else e->inbox = r;
    e->inbox_tail = r;
    e->n_inbox++;
    e->stats.requests_total++;
    e->stats.prompt_tokens_total += (uint64_t)p->n_prompt;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
    if (out) *out = r;
    return ENGINE_OK;
}

void engine_cancel(lm_engine *e, lm_request *r) {
    if (!r) return;
    atomic_store(&r->cancel, true);
    pthread_mutex_lock(&e->mu);
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
}

void engine_request_release(lm_engine *e, lm_request *r) {
    if (r) request_unref(r);
}

/* ---- scheduling -------------------------------------------------------- */

/* Free c's KV and requeue it for recomputation. */
static void preempt(lm_engine *e, eseq *c) {
    running_remove(e, c);
    kv_seq_free(e->kv, c->kv);
    c->kv = NULL;
    c->n_computed = 0;
    c->stats.preemptions++;
    pthread_mutex_lock(&e->mu);
    e->stats.preemptions_total++;
    pthread_mutex_unlock(&e->mu);
    if (wait_push(e, c) != 0) finish(e, c, LM_FINISH_ERROR, "out of memory requeueing a preempted request");
}

/* The running choice to preempt: worst priority, latest arrival, not in this
 * iteration's batch; NULL when there is none. */
static eseq *pick_victim(lm_engine *e, const eseq *except) {
    eseq *v = NULL;
    for (int i = 0; i < e->n_running; i++) {
        eseq *c = e->running[i];
        if (c->scheduled || c == except) continue;
        if (!v || before(v, c)) v = c;
    }
    return v;
}

/* Grow running choice c's KV by n positions, preempting the worst other
 * running choice while the pool is full (or c itself when it is the worst).
 * Returns 1 when grown, 0 when c was preempted, -1 on error (c finished). */
static int reserve(lm_engine *e, eseq *c, int n) {
    char err[LM_ERRLEN];
    for (;;) {
        int rc = kv_append(e->kv, c->kv, n, err, sizeof err);
        if (rc == KV_OK) return 1;
        if (rc != KV_FULL) {
            finish(e, c, LM_FINISH_ERROR, err);
            return -1;
        }
        eseq *v = pick_victim(e, c);
        if (!v || before(v, c)) {
            preempt(e, c);
            return 0;
        }
        preempt(e, v);
    }
}

/* Admit the head of the waiting queue when the pool can take its whole
 * remaining prompt above the watermark: global blocks for every position,
 * and (with sliding-window layers) the local blocks of its remaining prompt
 * up to what one sequence ever holds, as it gives its own blocks back once
 * they leave the window. No watermark applies to local blocks: a decode
 * releases about one for each it takes. Returns the admitted choice or NULL. */
static eseq *admit(lm_engine *e) {
    if (!e->n_waiting || e->n_running >= e->cfg.max_seqs) return NULL;
    eseq *c = e->waiting[0];
    char err[LM_ERRLEN];
    kv_seq *kv = kv_seq_new(e->kv, err, sizeof err);
    if (!kv) return NULL;
    int cached = 0;
    if (e->cfg.prefix_cache) cached = kv_prefix_match(e->kv, kv, c->tokens, c->n_tokens, c->req->salt);
    int n = (c->n_tokens < e->n_ctx ? c->n_tokens + 1 : e->n_ctx) - cached; /* never past the context */
    int64_t need = kv_blocks_needed(e->kv, kv, n, KV_GLOBAL);
    int64_t need_local = kv_blocks_needed(e->kv, kv, n, KV_LOCAL);
    if (need_local > e->local_per_seq) need_local = e->local_per_seq;
    bool alone = e->n_running == 0;
    if (need + (alone ? 0 : e->wm_blocks) > kv_available(e->kv, KV_GLOBAL) ||
        need_local > kv_available(e->kv, KV_LOCAL)) {
        kv_seq_free(e->kv, kv);
        return NULL;
    }
    wait_remove(e, 0);
    c->kv = kv;
    c->n_computed = cached;
    if (c->stats.preemptions == 0) c->stats.cached_tokens = cached;
    c->state = CH_RUNNING;
    e->running[e->n_running++] = c;
    return c;
}

/* Fork choice 0's prompt into the request's other choices, each sampling
 * from its own copy of choice 0's first logits row (src). */
static void fork_choices(lm_engine *e, eseq *c0, const float *src) {
    lm_request *r = c0->req;
    int32_t V = e->m->hp.n_vocab;
    float *work = e->logits + (size_t)(e->cfg.max_seqs + 1) * V;
    for (int i = 1; i < r->n; i++) {
        eseq *c = &r->ch[i];
        if (c->state != CH_PENDING_FORK) continue;
        char err[LM_ERRLEN];
        if (e->n_running >= e->cfg.max_seqs) {
            /* no room to run beside it now: it prefills later on its own
             * (the prefix cache makes that cheap) */
            if (wait_push(e, c) != 0) finish(e, c, LM_FINISH_ERROR, "out of memory");
            continue;
        }
        c->kv = kv_fork(e->kv, c0->kv, err, sizeof err);
        if (!c->kv) {
            finish(e, c, LM_FINISH_ERROR, err);
            continue;
        }
        c->n_computed = c0->n_computed;
        c->stats.cached_tokens = c0->stats.cached_tokens;
        c->state = CH_RUNNING;
        e->running[e->n_running++] = c;
        memcpy(work, src, (size_t)V * sizeof *work);
        take_token(e, c, work);
    }
}

/* Put n of c's pending tokens into the batch. */
static void batch_add(lm_engine *e, eseq *c, int n, int *n_tok, int *n_seg) {
    c->scheduled = true;
    memcpy(e->btok + *n_tok, c->tokens + c->n_computed, (size_t)n * sizeof *e->btok);
    e->segs[*n_seg] = (lm_seg){.seq = c->kv, .pos0 = c->n_computed, .n = n,
                               .n_logits = c->n_computed + n == c->n_tokens};
    e->seg_ch[(*n_seg)++] = c;
    *n_tok += n;
}

static void publish(lm_engine *e) {
    kv_stats ks;
    kv_stats_get(e->kv, &ks);
    pthread_mutex_lock(&e->mu);
    e->stats.running = e->n_running;
    e->stats.waiting = e->n_waiting;
    e->stats.kv_blocks_total = ks.n_blocks;
    e->stats.kv_blocks_used = ks.n_used;
    e->stats.kv_blocks_free = ks.n_free + ks.n_cached;
    e->stats.kv_blocks_cached = ks.n_cached;
    e->stats.kv_local_blocks_total = ks.cls[KV_LOCAL].n_blocks;
    e->stats.kv_local_blocks_used = ks.cls[KV_LOCAL].n_used;
    e->stats.kv_local_blocks_free = ks.cls[KV_LOCAL].n_free + ks.cls[KV_LOCAL].n_cached;
    e->stats.kv_local_blocks_cached = ks.cls[KV_LOCAL].n_cached;
    e->stats.prefix_queries_total = ks.prefix_queries;
    e->stats.prefix_hits_total = ks.prefix_hit_blocks;
    pthread_mutex_unlock(&e->mu);
}

/* One iteration. Returns false when there was nothing to run. */
static bool step(lm_engine *e) {
    const int32_t V = e->m->hp.n_vocab;
    /* cancellations */
    for (int i = e->n_running - 1; i >= 0; i--)
        if (i < e->n_running && atomic_load(&e->running[i]->req->cancel))
            finish(e, e->running[i], LM_FINISH_CANCELLED, NULL);
    for (int i = e->n_waiting - 1; i >= 0; i--)
        if (i < e->n_waiting && atomic_load(&e->waiting[i]->req->cancel))
            finish(e, e->waiting[i], LM_FINISH_CANCELLED, NULL);
    if (!e->n_running && !e->n_waiting) {
        publish(e);
        return false;
    }

    int budget = e->cfg.batch_tokens, n_tok = 0, n_seg = 0;
    /* running choices, best first; decodes (one token) before prefill chunks */
    int n_order = e->n_running;
    eseq **order = e->order;
    memcpy(order, e->running, (size_t)n_order * sizeof *order);
    for (int i = 1; i < n_order; i++)
        for (int j = i; j > 0 && before(order[j], order[j - 1]); j--) {
            eseq *t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    for (int i = 0; i < n_order; i++) order[i]->scheduled = false;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n_order && n_tok < budget; i++) {
            eseq *c = order[i];
            if (c->state != CH_RUNNING || c->scheduled) continue;
            int want = c->n_tokens - c->n_computed;
            if ((pass == 0) != (want == 1)) continue;
            int n = want < budget - n_tok ? want : budget - n_tok;
            if (reserve(e, c, n) == 1) batch_add(e, c, n, &n_tok, &n_seg);
        }
    /* admission (static batching: only into an empty engine, then no one
     * joins until the whole batch has finished) */
    if (e->cfg.static_batching && e->n_running == 0) {
        e->static_open = true; /* a new batch forms, over as many iterations as its prompts need */
        e->static_count = 0;
    }
    bool may_admit = !e->cfg.static_batching || e->static_open;
    while (may_admit && n_tok < budget) {
        bool alone = e->n_running == 0;
        eseq *c = admit(e);
        if (!c) {
            e->static_open = false;
            if (alone && e->n_waiting) {
                /* the pool cannot take it even empty: it would wait forever */
                finish(e, e->waiting[0], LM_FINISH_ERROR, "the request does not fit the KV pool");
                continue;
            }
            break;
        }
        int want = c->n_tokens - c->n_computed;
        int n = want < budget - n_tok ? want : budget - n_tok;
        char err[LM_ERRLEN];
        if (kv_append(e->kv, c->kv, n, err, sizeof err) != KV_OK) {
            /* cannot happen after admit's check; requeue it to be safe */
            running_remove(e, c);
            kv_seq_free(e->kv, c->kv);
            c->kv = NULL;
            c->n_computed = 0;
            if (wait_push(e, c) != 0) finish(e, c, LM_FINISH_ERROR, "out of memory");
            break;
        }
        batch_add(e, c, n, &n_tok, &n_seg);
        if (e->cfg.static_batching && ++e->static_count >= e->cfg.max_seqs) {
            e->static_open = false;
            break;
        }
    }
    if (n_seg == 0) {
        publish(e);
        return false;
    }

    /* one pass over the whole batch; logits rows in segment order */
    char err[LM_ERRLEN];
    int rc = fwd_run(e->fwd, e->btok, e->segs, n_seg, e->logits, err, sizeof err);
    int row = 0;
    for (int g = 0; g < n_seg; g++) {
        eseq *c = e->seg_ch[g];
        c->scheduled = false;
        if (c->state != CH_RUNNING) continue;
        if (rc != 0) {
            finish(e, c, LM_FINISH_ERROR, err);
            continue;
        }
        c->n_computed += e->segs[g].n;
        if (e->cfg.prefix_cache && c->n_gen == 0)
            kv_prefix_commit(e->kv, c->kv, c->tokens, c->n_computed, c->req->salt);
        if (!e->segs[g].n_logits) continue;
        float *lrow = e->logits + (size_t)row++ * V;
        if (c->n_gen == 0 && c->index == 0 && c->req->n > 1) {
            /* the forks sample from copies of this row before choice 0 (which
             * may finish at once and free its blocks) takes its token */
            float *src = e->logits + (size_t)e->cfg.max_seqs * V;
            memcpy(src, lrow, (size_t)V * sizeof *src);
            fork_choices(e, c, src);
        }
        take_token(e, c, lrow);
    }
    pthread_mutex_lock(&e->mu);
    e->stats.iterations++;
    e->stats.batch_seqs_total += (uint64_t)n_seg;
    e->stats.batch_tokens_total += (uint64_t)n_tok;
    hist_add(&e->stats.batch_size, n_seg);
    pthread_mutex_unlock(&e->mu);
    publish(e);
    return true;
}

/* ---- the engine thread and lifetime ------------------------------------ */

/* Move submitted requests into the waiting queue (mu held). */
static void drain_inbox(lm_engine *e) {
    while (e->inbox) {
        lm_request *r = e->inbox;
        e->inbox = r->next;
        if (!e->inbox) e->inbox_tail = NULL;
        e->n_inbox--;
        if (wait_push(e, &r->ch[0]) != 0) {
            pthread_mutex_unlock(&e->mu);
            finish(e, &r->ch[0], LM_FINISH_ERROR, "out of memory queueing the request");
            pthread_mutex_lock(&e->mu);
        }
    }
    e->stats.waiting = e->n_waiting;
}

static int check_now(lm_engine *e, char *err, size_t errlen) {
    if (kv_pool_check(e->kv, err, errlen) != KV_OK) return -1;
    kv_stats ks;
    kv_stats_get(e->kv, &ks);
    int64_t live = 0;
    for (int i = 0; i < e->n_running; i++) live += e->running[i]->kv != NULL;
    if (ks.n_seqs != live)
        return lm_err(err, errlen, "%lld KV sequences exist, %lld are live", (long long)ks.n_seqs, (long long)live);
    for (int k = 0; k < KV_N_CLASS; k++)
        if (!e->n_running && ks.cls[k].n_used != 0)
            return lm_err(err, errlen, "%lld %sKV blocks are held with nothing running", (long long)ks.cls[k].n_used,
                          k == KV_LOCAL ? "local " : "");
    return 0;
}

static void *engine_main(void *arg) {
    lm_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        drain_inbox(e);
        if (e->check_req) {
            e->check_rc = check_now(e, e->check_msg, sizeof e->check_msg);
            e->check_req = false;
            e->check_done = true;
            pthread_cond_broadcast(&e->idle_cv);
        }
        if (e->stop) break;
        pthread_mutex_unlock(&e->mu);
        bool busy = step(e);
        pthread_mutex_lock(&e->mu);
        if (!busy && !e->inbox && !e->stop && !e->check_req) {
            if (!e->n_running && !e->n_waiting) pthread_cond_broadcast(&e->idle_cv);
            /* nothing runnable: sleep until a submission or cancellation */
            pthread_cond_wait(&e->wake, &e->mu);
        }
    }
    pthread_mutex_unlock(&e->mu);
    /* shutdown: every request still here gets its final event */
    while (e->n_running) finish(e, e->running[e->n_running - 1], LM_FINISH_CANCELLED, "the engine shut down");
    while (e->n_waiting) finish(e, e->waiting[e->n_waiting - 1], LM_FINISH_CANCELLED, "the engine shut down");
    pthread_mutex_lock(&e->mu);
    drain_inbox(e);
    pthread_mutex_unlock(&e->mu);
    while (e->n_waiting) finish(e, e->waiting[e->n_waiting - 1], LM_FINISH_CANCELLED, "the engine shut down");
    publish(e);
    pthread_mutex_lock(&e->mu);
    pthread_cond_broadcast(&e->idle_cv);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* Free everything an engine owns (its thread already stopped or never
 * started); used by a failed engine_new and by engine_free. */
static void destroy(lm_engine *e) {
    fwd_free(e->fwd);
    pool_free(e->pool);
    kv_pool_free(e->kv);
    lm_free(e->running);
    lm_free(e->order);
    lm_free(e->waiting);
    lm_free(e->segs);
    lm_free(e->seg_ch);
    lm_free(e->btok);
    lm_free(e->logits);
    lm_free(e->lp);
    lm_free(e->emit);
    lm_free(e->piece);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->wake);
    pthread_cond_destroy(&e->idle_cv);
    lm_free(e);
}

lm_engine *engine_new(const lm_model *m, const lm_tokenizer *tok, const lm_engine_config *cin, char *err,
                      size_t errlen) {
    lm_engine_config c;
    if (cin) c = *cin;
    else engine_config_default(&c);
    if (!tok) tok = m->tok;
    if (!tok) return lm_err(err, errlen, "the model has no tokenizer"), NULL;
    /* the context and the batch budget: the workspace's rows and the KV
     * chunk come from the same dims */
    fwd_dims dims = fwd_dims_make(m, c.n_ctx, c.batch_tokens);
    c.batch_tokens = dims.n_batch;
    if (c.max_seqs < 1) c.max_seqs = 64;
    if (c.max_seqs > c.batch_tokens) c.max_seqs = c.batch_tokens;
    if (c.block_size < 1) c.block_size = KV_DEFAULT_BLOCK;
    if (!(c.watermark >= 0 && c.watermark < 1)) return lm_err(err, errlen, "watermark must be in [0, 1)"), NULL;
    if (c.n_threads <= 0) c.n_threads = pool_default_threads();
    lm_engine *e = lm_calloc(1, sizeof *e);
    if (!e) return lm_err(err, errlen, "out of memory"), NULL;
    e->m = m;
    e->tok = tok;
    e->n_ctx = dims.n_ctx;
    e->cfg = c;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->wake, NULL);
    pthread_cond_init(&e->idle_cv, NULL);

    /* the pool: n_ctx x max_seqs positions unless a budget is given; with
     * sliding-window layers max_seqs windows of local blocks (a budget's
     * rest buying global context, kv.h), each sequence growing by at most
     * batch_tokens per iteration */
    kv_config kc;
    fwd_kv_config(m, &dims, &kc);
    kc.type = c.kv_type;
    kc.block_size = c.block_size;
    kc.n_seqs = c.max_seqs;
    if (c.kv_mem) kc.mem_bytes = c.kv_mem;
    else {
        kv_plan pl;
        if (kv_plan_make(&kc, &pl, err, errlen) != KV_OK) goto fail;
        if (pl.data_bytes > (4ull << 30)) kc.mem_bytes = 4ull << 30;
    }
    if (!(e->kv = kv_pool_new(&kc, err, errlen))) goto fail;
    const kv_plan *plan = kv_pool_plan(e->kv);
    for (int k = 0; k < KV_N_CLASS; k++) e->total_blocks[k] = plan->cls[k].n_blocks;
    e->local_per_seq = plan->local_blocks_per_seq;
    e->wm_blocks = (int64_t)ceil(c.watermark * (double)e->total_blocks[KV_GLOBAL]);
    if (!(e->pool = pool_new(c.n_threads))) {
        lm_err(err, errlen, "cannot start %d threads", c.n_threads);
        goto fail;
    }
    if (!(e->fwd = fwd_new(m, e->pool, e->kv, &dims, err, errlen))) goto fail;
    size_t V = (size_t)m->hp.n_vocab, S = (size_t)c.max_seqs;
    e->running = lm_calloc(S, sizeof *e->running);
    e->order = lm_calloc(S, sizeof *e->order);
    e->segs = lm_calloc(S, sizeof *e->segs);
    e->seg_ch = lm_calloc(S, sizeof *e->seg_ch);
    e->btok = lm_malloc((size_t)c.batch_tokens * sizeof *e->btok);
    e->logits = lm_malloc((S + 2) * V * sizeof *e->logits); /* batch rows, fork source, fork work */
    e->lp = lm_malloc(V * sizeof *e->lp);
    /* a token's text: the detokenizer's maximum for this vocabulary; an
     * event's: all a choice may hold back (held_cap) plus a flush's U+FFFD */
    e->piece_cap = detok_max_out(tok);
    e->piece = lm_malloc((size_t)e->piece_cap);
    e->emit_cap = STOP_MAX + e->piece_cap + 4;
    e->emit = lm_malloc((size_t)e->emit_cap);
    if (!e->running || !e->order || !e->segs || !e->seg_ch || !e->btok || !e->logits || !e->lp || !e->emit ||
        !e->piece) {
        lm_err(err, errlen, "out of memory allocating the engine's buffers");
        goto fail;
    }
    static const double b_batch[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
    static const double b_ttft[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
    static const double b_tpot[] = {0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5};
    static const double b_e2e[] = {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
    hist_init(&e->stats.batch_size, b_batch, 10);
    hist_init(&e->stats.ttft, b_ttft, 12);
    hist_init(&e->stats.tpot, b_tpot, 10);
    hist_init(&e->stats.e2e, b_e2e, 12);
    publish(e);
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        lm_err(err, errlen, "cannot start the engine thread");
        goto fail;
    }
    return e;
fail:
    destroy(e);
    return NULL;
}

void engine_free(lm_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    destroy(e);
}

void engine_stats(lm_engine *e, lm_engine_stats *st) {
    pthread_mutex_lock(&e->mu);
    *st = e->stats;
    st->waiting += e->n_inbox;
    pthread_mutex_unlock(&e->mu);
}

void engine_wait_idle(lm_engine *e) {
    pthread_mutex_lock(&e->mu);
    while (!e->stop && (e->inbox || e->stats.running || e->stats.waiting)) pthread_cond_wait(&e->idle_cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
}

int engine_check(lm_engine *e, char *err, size_t errlen) {
    pthread_mutex_lock(&e->mu);
    e->check_req = true;
    e->check_done = false;
    pthread_cond_signal(&e->wake);
    while (!e->check_done) pthread_cond_wait(&e->idle_cv, &e->mu);
    int rc = e->check_rc;
    if (rc) lm_err(err, errlen, "%s", e->check_msg);
    pthread_mutex_unlock(&e->mu);
    return rc;
}

const lm_model *engine_model(const lm_engine *e) { return e->m; }
const lm_tokenizer *engine_tokenizer(const lm_engine *e) { return e->tok; }
int engine_n_ctx(const lm_engine *e) { return e->n_ctx; }
