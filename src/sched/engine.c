/*
 * engine.c - the continuous-batching engine (contract in engine.h): request
 * lifecycle, and acting on the scheduler's plans and on the speculation
 * policy's decisions (spec_sched.h; the proposals are made through the
 * proposer seam, proposer.h). Grammars are engine_grammar.c, the
 * configuration's defaults and the memory plan engine_mem.c, the clients'
 * tags and fair share of the slots engine_fair.c, hybrid models' recurrent
 * state engine_state.c, embeddings engine_embed.c; their shared objects are
 * in engine_int.h. None calls back into this file: only it takes tokens and finishes choices.
 *
 * Objects. A request (lm_request) keeps a copy of its parameters and owns n
 * choices (eseq), each one sequence of tokens with its own KV sequence,
 * sampler, detokenizer and held text (stop.h); a choice's scheduler handle
 * is its first member. Choice 0 prefills the prompt; then choices 1..n-1
 * fork its KV blocks (kv_fork: the prompt's blocks shared, the partial last
 * block copied on the first write) and sample from the same logits row.
 *
 * Positions. tokens[0..n_tokens) are the prompt and what was generated;
 * KV positions [0, n_computed) are written. A pass feeds tokens[n_computed..]
 * (one token in decode, a chunk in prefill) and wants logits only when the
 * chunk reaches n_tokens; a decode with a proposal feeds its pending token
 * and the first n - 1 proposed ones, each with a logits row (batch_add).
 * n_computed counts only verified positions at every moment, so a choice
 * that finishes mid-way commits only those to the prefix cache. Preemption
 * frees the KV and sets n_computed back to 0: recomputation is a longer
 * prefill, and the sampler's RNG and history and the grammar's parse state
 * carry on, so the output is the same. A preempted or finished choice also
 * drops its draft KV; a fork starts its own.
 *
 * Acting on a plan. The scheduler (sched.h) owns the waiting and running
 * queues, plans each iteration and never calls back. This file tells it
 * what it cannot see (each running choice's length, pending tokens and
 * proposal, the pool's free blocks) and answers its questions (what a
 * preemption frees, what an admission takes), then acts: frees the KV of
 * preempted choices, grows the others', admits, runs the batch, samples and
 * finishes choices. An admission is measured by a probe, a KV sequence that
 * takes the prompt's cached prefix (kv_prefix_match); a probe the plan
 * admits becomes the choice's KV and the others are freed before anything
 * else happens, so the pool the plan counted on is the pool acted on.
 *
 * Grammars. A choice's lm_gmatch advances with every token it takes and is
 * not tied to the KV; the grammar cache, the masking of a choice's logits
 * and the grammar's step are engine_grammar.c, which says why a grammar
 * cannot go on (egram_end) and leaves the finishing to take_token.
 *
 * Speculation. Each iteration the policy sees the running choices
 * (spec_begin: whether a draft stands aside), each choice's wish (prompt
 * lookup proposes there), sizes the wishes at the batch's width; the
 * proposals are made (spec_propose) and join the decodes in the batch;
 * spec_verify takes each proposed row's token through engine_take_token
 * and reports the verdict to the policy and the proposer.
 *
 * Threads. Submitters only touch the inbox (under mu) and a request's cancel
 * flag (atomic). Everything else - scheduler, KV bookkeeping, samplers -
 * belongs to the engine thread, which takes mu only to move the inbox,
 * publish statistics and sleep. Callbacks run on the engine thread without
 * mu held, so a callback may call engine_cancel or engine_submit.
 */
#include "sched/engine.h"
#include "sched/engine_int.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "base/pool.h"
#include "base/util.h"
#include "decode/grammar.h"
#include "decode/spec.h"
#include "format/quant.h"
#include "kv/kv.h"
#include "model/forward.h"
#include "model/embed.h"
#include "model/gdn.h"
#include "sched/draft.h"
#include "sched/metrics.h"
#include "sched/sched.h"
#include "sched/stop.h"

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
    *c = (lm_engine_config){.size = sizeof(lm_engine_config),
                            .n_threads = 0,
                            .batch_tokens = FWD_BATCH_DEFAULT,
                            .max_seqs = 64,
                            .n_ctx = 0,
                            .kv_mem = 0,
                            .kv_type = LM_TYPE_F16,
                            .block_size = KV_DEFAULT_BLOCK,
                            .watermark = 0.01,
                            .max_waiting = 0,
                            .prefix_cache = true,
                            .static_batching = false,
                            .spec = NULL,
                            .itl_factor = ITL_FACTOR_DEF};
}

void engine_request_params_default(lm_request_params *p) {
    memset(p, 0, sizeof *p);
    p->size = sizeof *p;
    sample_params_default(&p->sp);
    p->max_tokens = 16;
    p->n = 1;
    p->pooling = LM_POOL_DEFAULT;
}

lm_status engine_fit_context(int n_max, int n_prompt, int max_tokens, int *max_out) {
    if (n_prompt >= n_max) return LM_ERR_TOO_LONG; /* no room for one generated token */
    if (max_tokens < 0) max_tokens = n_max - n_prompt;
    else if (max_tokens > n_max - n_prompt) return LM_ERR_TOO_LONG;
    if (max_out) *max_out = max_tokens;
    return LM_OK;
}

static void engine_request_unref(lm_request *r) {
    if (atomic_fetch_sub(&r->refs, 1) != 1) return;
    for (int i = 0; i < r->p.n && r->ch; i++) {
        lm_free(r->ch[i].tokens);
        stop_text_free(&r->ch[i].held);
        sampler_free(r->ch[i].smp);
        gmatch_free(r->ch[i].gm);
        lm_free(r->ch[i].lz);
        spec_pseq_free(&r->ch[i].ps);
        lm_free(r->ch[i].rptr);
        embed_pool_free(r->ch[i].emb);
    }
    stop_set_free(&r->stop);
    stop_set_free(&r->triggers);
    gmatch_free(r->gproto);
    lm_free(r->ch);
    lm_free(r);
}

/* ---- events ------------------------------------------------------------ */

static void emit_event(lm_engine *e, eseq *c, int32_t tok, const char *text, size_t len, float lp, int n_top,
                       const int32_t *top_ids, const float *top_lp) {
    lm_event ev = {.index = c->index,
                   .token = tok,
                   .text = text,
                   .text_len = len,
                   .logprob = lp,
                   .n_top = n_top,
                   .top_ids = top_ids,
                   .top_logprobs = top_lp,
                   .stats = &c->stats};
    c->req->p.on_event(c->req->p.user, &ev);
}

/* End a choice: release its KV (registering its blocks for prefix reuse when
 * it completed normally), flush its text, send the final event; the request
 * loses the engine's reference when its last choice ends. status says what
 * kind of error with LM_FINISH_ERROR (LM_OK otherwise). */
static void engine_finish_choice(lm_engine *e, eseq *c, lm_finish why, lm_status status, const char *error) {
    lm_request *r = c->req;
    sched_remove(e->sc, &c->sq);
    engine_state_drop(e, c);
    if (c->probe) {
        kv_seq_free(e->kv, c->probe);
        c->probe = NULL;
    }
    if (c->kv) {
        if (e->cfg.prefix_cache && !c->emb && (why == LM_FINISH_STOP || why == LM_FINISH_LENGTH))
            kv_prefix_commit(e->kv, c->kv, c->tokens, c->n_computed, r->p.cache_salt);
        kv_seq_free(e->kv, c->kv);
        c->kv = NULL;
    }
    if (e->prop) spec_prop_release(e->prop, &c->ps);
    c->state = CH_DONE;
    double now = lm_now();
    c->stats.completion_tokens = c->n_gen;
    c->stats.e2e = now - c->stats.t_submit;
    if (c->n_gen > 1) c->stats.tpot = (c->stats.e2e - c->stats.ttft) / (c->n_gen - 1);
    /* what is still held back is output unless a stop string ended the text */
    size_t len = 0;
    if (!c->stop_hit) {
        memcpy(e->emit, c->held.held, (size_t)c->held.n);
        len = (size_t)c->held.n;
        if (why == LM_FINISH_STOP || why == LM_FINISH_LENGTH) {
            /* an incomplete UTF-8 tail ends as U+FFFD rather than vanishing */
            int w = detok_flush(&c->dt, e->emit + len, e->emit_cap - (int)len);
            if (w > 0) len += (size_t)w;
        }
    }
    c->held.n = 0;
    if (why != LM_FINISH_ERROR) status = LM_OK;
    else if (status == LM_OK) status = LM_ERR_INTERNAL;
    lm_event ev = {.index = c->index,
                   .token = -1,
                   .text = e->emit,
                   .text_len = len,
                   .done = true,
                   .finish = why,
                   .status = status,
                   .error = error,
                   .stats = &c->stats,
                   .embedding = c->emb && why == LM_FINISH_STOP ? embed_pool_finish(c->emb) : NULL};
    ev.n_embedding = ev.embedding ? embed_dim(e->m) : 0;
    pthread_mutex_lock(&e->mu);
    metrics_finished(&e->stats, &c->stats, c->index, why);
    if (r->counted) engine_client_done(e, r->p.client);
    pthread_mutex_unlock(&e->mu);
    r->p.on_event(r->p.user, &ev);
    /* choices still waiting for a fork from choice 0 cannot get one now */
    if (c->index == 0 && c->n_gen == 0)
        for (int i = 1; i < r->p.n; i++)
            if (r->ch[i].state == CH_PENDING_FORK) engine_finish_choice(e, &r->ch[i], why, status, error);
    if (--r->n_live == 0) {
        if (!r->started) engine_request_ended_waiting(e, r);
        engine_request_unref(r);
    }
}

/* Sample choice c's next token from its logits row (modified), emit it, and
 * finish the choice if it ended. draft >= 0: a proposed token this row
 * verifies (the token taken is then the draft when accepted, else the
 * target's own choice). Returns the token taken, or -1 when the choice
 * ended without one. */
static int32_t engine_take_token(lm_engine *e, eseq *c, float *row, int32_t draft, const float *q) {
    lm_request *r = c->req;
    int32_t V = e->m->hp.n_vocab;
    int n_top = 0;
    int32_t top_ids[LM_MAX_TOP_LOGPROBS];
    float top_lp[LM_MAX_TOP_LOGPROBS];
    bool want_lp = r->p.logprobs || r->p.top_logprobs > 0;
    if (want_lp) {
        sample_log_softmax(row, V, e->lp);
        n_top = sample_top_n(e->lp, V, r->p.top_logprobs, top_ids, top_lp);
    }
    bool acc;
    egram_end ge = {LM_OK, NULL};
    double t_s = e->prof_on ? lm_now() : 0;
    /* the token drawn ahead (this iteration's, or none) */
    int32_t pre = c->pre != PRE_NONE && c->pre_iter == e->iter ? c->pre : PRE_NONE;
    c->pre = PRE_NONE;
    int32_t t = pre != PRE_NONE ? pre
        : c->gm_on              ? engine_grammar_pick(&e->gr, c, row, draft, q, &ge)
        : draft >= 0            ? sampler_sample_spec(c->smp, row, draft, q, &acc)
                                : sampler_sample(c->smp, row);
    if (e->prof_on) e->prof.sample += lm_now() - t_s;
    if (t == -2) { /* the grammar cannot go on */
        engine_finish_choice(e, c, LM_FINISH_ERROR, ge.status, ge.error);
        return -1;
    }
    if (t < 0) {
        engine_finish_choice(e, c, LM_FINISH_ERROR, LM_ERR_INVALID, "every token is banned (logit_bias)");
        return -1;
    }
    if (draft >= 0) c->stats.spec_accepted += t == draft; /* before anything can end the choice */
    sampler_accept(c->smp, t);
    if (c->gm && engine_grammar_advance(&e->gr, c, &r->triggers, t, &ge) < 0) {
        engine_finish_choice(e, c, LM_FINISH_ERROR, ge.status, ge.error);
        return -1;
    }
    double now = lm_now();
    if (c->n_gen == 0) c->stats.ttft = now - c->stats.t_submit;
    c->tokens[c->n_tokens++] = t;
    c->n_gen++;
    pthread_mutex_lock(&e->mu);
    e->stats.generation_tokens_total++;
    pthread_mutex_unlock(&e->mu);
    float lp = want_lp ? e->lp[t] : 0;

    bool eog = !r->p.ignore_eos && tok_is_eog(e->tok, t);
    size_t len = 0;
    bool stopped = false;
    if (!eog) {
        int w = detok_push(&c->dt, t, e->piece, e->piece_cap);
        if (w < 0) { /* cannot happen: piece_cap is the detokenizer's maximum */
            engine_finish_choice(e, c, LM_FINISH_ERROR, LM_ERR_INTERNAL,
                                 "internal: a token's text does not fit the detokenizer's maximum");
            return -1;
        }
        if (r->stop.n) stopped = c->stop_hit = stop_scan(&r->stop, &c->held, e->piece, w, e->emit, &len);
        else {
            memcpy(e->emit, e->piece, (size_t)w);
            len = (size_t)w;
        }
    }
    emit_event(e, c, t, e->emit, len, lp, n_top, top_ids, top_lp);
    /* a grammar that can only end ends the text */
    if (eog || stopped || (c->gm_on && gmatch_must_end(c->gm))) engine_finish_choice(e, c, LM_FINISH_STOP, LM_OK, NULL);
    /* the context is full once every position holds a token: the token
     * sampled from the last position's logits ends the text without one */
    else if (c->n_gen >= r->p.max_tokens || c->n_tokens > e->n_ctx)
        engine_finish_choice(e, c, LM_FINISH_LENGTH, LM_OK, NULL);
    return t;
}

/* ---- submission -------------------------------------------------------- */

static int64_t blocks_for(const lm_engine *e, int64_t tokens) {
    return (tokens + e->cfg.block_size - 1) / e->cfg.block_size;
}

static lm_status submit_tokens(lm_engine *e, const lm_request_params *p, lm_request **out, char *err, size_t errlen);

lm_status engine_submit(lm_engine *e, const lm_request_params *p, lm_request **out, char *err, size_t errlen) {
    if (out) *out = NULL;
    if (!p) return lm_err(err, errlen, "no request parameters"), LM_ERR_INVALID;
    if (p->prompt || !p->text) return submit_tokens(e, p, out, err, errlen);
    /* a text prompt: tokenize it here (the context bounds its useful length) */
    if (p->text_len > (size_t)16 * (size_t)e->n_ctx + 4096)
        return lm_err(err, errlen, "the prompt text (%zu bytes) cannot fit the context of %d tokens", p->text_len,
                      e->n_ctx),
               LM_ERR_TOO_LONG;
    int n = tok_encode(e->tok, p->text, p->text_len, tok_add_bos(e->tok), true, NULL, 0);
    if (n < 0) return lm_err(err, errlen, "the prompt text cannot be tokenized"), LM_ERR_INVALID;
    int32_t *ids = lm_malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
    if (!ids) return lm_err(err, errlen, "out of memory"), LM_ERR_NOMEM;
    tok_encode(e->tok, p->text, p->text_len, tok_add_bos(e->tok), true, ids, n);
    lm_request_params q = *p;
    q.prompt = ids;
    q.n_prompt = n;
    lm_status rc = submit_tokens(e, &q, out, err, errlen);
    lm_free(ids);
    return rc;
}

/* The request's fields, each on its own: LM_OK or LM_ERR_INVALID. */
static lm_status check_fields(const lm_engine *e, const lm_request_params *p, char *err, size_t errlen) {
    int32_t V = e->m->hp.n_vocab;
    if (!p->on_event) return lm_err(err, errlen, "no event callback"), LM_ERR_INVALID;
    if (!p->prompt || p->n_prompt < 1) return lm_err(err, errlen, "the prompt is empty"), LM_ERR_INVALID;
    if (p->max_tokens == 0)
        return lm_err(err, errlen, "max_tokens must be at least 1 (or negative: the rest of the context)"),
               LM_ERR_INVALID;
    if (p->n < 1) return lm_err(err, errlen, "n must be at least 1"), LM_ERR_INVALID;
    if (p->n > e->cfg.max_seqs)
        return lm_err(err, errlen, "n = %d is more than the %d sequences the engine runs at once", p->n,
                      e->cfg.max_seqs),
               LM_ERR_INVALID;
    if (p->top_logprobs < 0 || p->top_logprobs > LM_MAX_TOP_LOGPROBS)
        return lm_err(err, errlen, "top_logprobs must be in [0, %d]", LM_MAX_TOP_LOGPROBS), LM_ERR_INVALID;
    if (p->n_stop < 0 || (p->n_stop && !p->stop) || p->n_bias < 0 || (p->n_bias && (!p->bias_ids || !p->bias_vals)))
        return lm_err(err, errlen, "malformed stop or bias list"), LM_ERR_INVALID;
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= V)
            return lm_err(err, errlen, "prompt token %d (id %d) is out of range [0, %d)", i, p->prompt[i], V),
                   LM_ERR_INVALID;
    for (int i = 0; i < p->n_bias; i++)
        if (p->bias_ids[i] < 0 || p->bias_ids[i] >= V)
            return lm_err(err, errlen, "logit_bias token id %d is out of range [0, %d)", p->bias_ids[i], V),
                   LM_ERR_INVALID;
    for (int i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0] || strlen(p->stop[i]) > MAX_STOP_LEN)
            return lm_err(err, errlen, "stop string %d is empty or longer than %d bytes", i, MAX_STOP_LEN),
                   LM_ERR_INVALID;
    if (p->n_grammar_triggers < 0 || p->n_grammar_triggers > MAX_TRIGGERS ||
        (p->n_grammar_triggers && (!p->grammar_triggers || !p->grammar)))
        return lm_err(err, errlen, "grammar triggers need a grammar and at most %d strings", MAX_TRIGGERS),
               LM_ERR_INVALID;
    for (int i = 0; i < p->n_grammar_triggers; i++)
        if (!p->grammar_triggers[i] || !p->grammar_triggers[i][0] || strlen(p->grammar_triggers[i]) > MAX_STOP_LEN)
            return lm_err(err, errlen, "grammar trigger %d is empty or longer than %d bytes", i, MAX_STOP_LEN),
                   LM_ERR_INVALID;
    return LM_OK;
}

/* Whether the request, alone in the empty pool, fits: its prompt once, each
 * choice's generated tokens plus a copied partial block. */
static lm_status check_pool(const lm_engine *e, const lm_request_params *p, int64_t total, char *err, size_t errlen) {
    int64_t gen = total - p->n_prompt;
    int64_t need = blocks_for(e, total) + (int64_t)(p->n - 1) * (blocks_for(e, gen) + 1);
    if (need > e->total_blocks[KV_GLOBAL])
        return lm_err(err, errlen, "the request needs up to %lld KV blocks; the pool has %lld", (long long)need,
                      (long long)e->total_blocks[KV_GLOBAL]),
               LM_ERR_TOO_LONG;
    /* sliding-window layers: each choice holds at most local_per_seq blocks */
    if (e->local_per_seq) {
        int64_t per = blocks_for(e, total) < e->local_per_seq ? blocks_for(e, total) : e->local_per_seq;
        if (per * p->n > e->total_blocks[KV_LOCAL])
            return lm_err(err, errlen, "the request needs up to %lld local KV blocks; the pool has %lld",
                          (long long)(per * p->n), (long long)e->total_blocks[KV_LOCAL]),
                   LM_ERR_TOO_LONG;
    }
    return LM_OK;
}

/* A new request with its choices, or NULL when out of memory. proto: its
 * grammar's start state or NULL; own: its grammar when not the engine's
 * (taken over with proto, even on failure). */
static lm_request *request_new(lm_engine *e, const lm_request_params *p, int max_tokens, bool handle,
                               lm_gmatch *proto) {
    lm_request *r = lm_calloc(1, sizeof *r);
    if (!r) {
        gmatch_free(proto);
        return NULL;
    }
    r->gproto = proto;
    const bool g = proto != NULL;
    atomic_init(&r->refs, 1);
    atomic_init(&r->cancel, false);
    r->p = *p;
    r->p.prompt = NULL, r->p.n_prompt = 0, r->p.text = NULL, r->p.text_len = 0;
    r->p.bias_ids = NULL, r->p.bias_vals = NULL, r->p.n_bias = 0;
    r->p.max_tokens = max_tokens;
    r->p.grammar = NULL, r->p.grammar_len = 0, r->p.grammar_root = NULL;
    r->p.grammar_triggers = NULL, r->p.n_grammar_triggers = 0;
    r->n_live = p->n;
    r->ch = lm_calloc((size_t)p->n, sizeof *r->ch);
    bool ok = r->ch && stop_set_init(&r->stop, p->stop, p->n_stop) == 0 &&
        (!g || stop_set_init(&r->triggers, p->grammar_triggers, p->n_grammar_triggers) == 0);
    r->p.stop = (const char *const *)r->stop.s;
    r->p.n_stop = r->stop.n;
    double now = lm_now();
    int cap = p->n_prompt + max_tokens + 1;
    for (int i = 0; ok && i < p->n; i++) {
        eseq *c = &r->ch[i];
        c->req = r;
        c->index = i;
        c->state = i == 0 ? CH_LIVE : CH_PENDING_FORK;
        c->sq = (sched_seq){.priority = p->priority, .index = i, .whole = !e->m->hp.causal};
        c->cap = cap;
        c->n_prompt = c->n_tokens = p->n_prompt;
        c->tokens = lm_malloc((size_t)cap * sizeof *c->tokens);
        lm_sample_params sp = p->sp;
        sp.seed += (uint64_t)i;
        c->smp = sampler_new(&sp, e->m->hp.n_vocab);
        c->pre = PRE_NONE;
        c->rslot = -1;
        if (e->rs && !(c->rptr = lm_calloc(2 * (size_t)e->m->hp.n_rlayer, sizeof *c->rptr))) {
            ok = false;
            break;
        }
        if (!c->tokens || !c->smp || stop_text_init(&c->held, &r->stop, e->piece_cap) != 0) {
            ok = false;
            break;
        }
        memcpy(c->tokens, p->prompt, (size_t)p->n_prompt * sizeof *c->tokens);
        for (int b = 0; b < p->n_bias; b++) sampler_set_bias(c->smp, p->bias_ids[b], p->bias_vals[b]);
        if (p->penalize_prompt)
            for (int k = 0; k < p->n_prompt; k++) sampler_accept(c->smp, p->prompt[k]);
        detok_init(&c->dt, e->tok, false, p->special_text);
        if (g && engine_grammar_choice(&e->gr, r->gproto, &r->triggers, c) != 0) {
            ok = false;
            break;
        }
        if (e->spec_cap > 0 && p->spec_k >= 0) {
            c->spec_k = p->spec_k == 0 || p->spec_k > e->cfg.spec->max ? e->cfg.spec->max : p->spec_k;
            spec_policy_ctl_init(&e->pol, &c->ctl);
            if (spec_pseq_init(e->prop, &c->ps, c->spec_k, &sp, p->bias_ids, p->bias_vals, p->n_bias) != 0) {
                ok = false;
                break;
            }
        }
        c->stats.prompt_tokens = p->n_prompt;
        c->stats.t_submit = now;
    }
    if (!ok) {
        engine_request_unref(r);
        return NULL;
    }
    if (handle) atomic_store(&r->refs, 2);
    return r;
}

static lm_status submit_tokens(lm_engine *e, const lm_request_params *p, lm_request **out, char *err, size_t errlen) {
    lm_request_params q; /* an embedding: one token wanted, nothing sampled (engine_embed.c) */
    lm_status rc = engine_embed_params(e, p, &q, err, errlen); /* LM_OK at once for a generation it allows */
    if (rc != LM_OK || (rc = check_fields(e, p = p->embed ? &q : p, err, errlen)) != LM_OK) return rc;
    int max_tokens;
    /* every position holds a token and one more is sampled from the last */
    if (engine_fit_context(e->n_ctx + 1, p->n_prompt, p->max_tokens, &max_tokens) != LM_OK) {
        if (p->n_prompt > e->n_ctx)
            return lm_err(err, errlen, "the prompt has %d tokens; the context holds %d", p->n_prompt, e->n_ctx),
                   LM_ERR_TOO_LONG;
        return lm_err(err, errlen,
                      "the prompt has %d tokens and max_tokens is %d; the context holds %d and one more "
                      "sampled from the last",
                      p->n_prompt, p->max_tokens, e->n_ctx),
               LM_ERR_TOO_LONG;
    }
    /* the KV holds every token but the last */
    int64_t positions = (int64_t)p->n_prompt + max_tokens < e->n_ctx ? (int64_t)p->n_prompt + max_tokens : e->n_ctx;
    if ((rc = check_pool(e, p, positions, err, errlen)) != LM_OK) return rc;
    lm_gmatch *proto = NULL;
    if (p->grammar && (rc = engine_grammar_get(&e->gr, p, &proto, err, errlen)) != LM_OK) return rc;
    lm_request *r = request_new(e, p, max_tokens, out != NULL, proto);
    if (r && p->embed && !(r->ch[0].emb = engine_embed_pool(e, p->pooling)))
        atomic_store(&r->refs, 1), engine_request_unref(r), r = NULL;
    if (!r) return lm_err(err, errlen, "out of memory"), LM_ERR_NOMEM;
    pthread_mutex_lock(&e->mu);
    if (e->stop || (e->cfg.max_waiting > 0 && e->n_req_waiting >= e->cfg.max_waiting)) {
        bool stopping = e->stop;
        e->stats.requests_rejected++;
        pthread_mutex_unlock(&e->mu);
        atomic_store(&r->refs, 1);
        engine_request_unref(r);
        if (stopping) return lm_err(err, errlen, "the engine is shutting down"), LM_ERR_BUSY;
        return lm_err(err, errlen, "%d requests are already waiting", e->cfg.max_waiting), LM_ERR_BUSY;
    }
    uint64_t arrival = e->next_arrival++;
    int64_t tag = engine_client_take(e, p->client, p->n, &r->counted);
    for (int i = 0; i < p->n; i++) r->ch[i].sq.arrival = arrival, r->ch[i].sq.fair = p->client ? tag + i : 0;
    if (e->inbox_tail) e->inbox_tail->next = r;
    else e->inbox = r;
    e->inbox_tail = r;
    e->n_inbox++;
    e->n_req_waiting++;
    e->stats.requests_total++;
    e->stats.prompt_tokens_total += (uint64_t)p->n_prompt;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
    if (out) *out = r;
    return LM_OK;
}

void engine_cancel(lm_engine *e, lm_request *r) {
    if (!r) return;
    atomic_store(&r->cancel, true);
    pthread_mutex_lock(&e->mu);
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
}

void engine_request_release(lm_engine *e, lm_request *r) {
    if (r) engine_request_unref(r);
}

/* ---- acting on the scheduler ------------------------------------------- */

/* Queue c to wait (again) from the start of its sequence. */
static void enqueue(lm_engine *e, eseq *c) {
    c->n_computed = 0;
    c->sq.n_pending = c->n_tokens;
    if (sched_enqueue(e->sc, &c->sq) != 0)
        engine_finish_choice(e, c, LM_FINISH_ERROR, LM_ERR_NOMEM, "out of memory queueing a request");
}

/* ---- speculation: acting on the policy's decisions --------------------- */

/* Choice c as the speculation policy sees it. */
static spec_view spec_view_of(const eseq *c) {
    return (spec_view){.n_tokens = c->n_tokens,
                       .n_computed = c->n_computed,
                       .n_gen = c->n_gen,
                       .max_tokens = c->req->p.max_tokens,
                       .spec_k = c->spec_k,
                       .ctl = &c->ctl,
                       .d_kv = c->ps.ds.kv != NULL,
                       .d_started = c->ps.ds.started,
                       .d_fed = c->ps.ds.off + c->ps.ds.n};
}

/* The iteration's start for the policy: whether a draft stands aside. */
static bool spec_begin(lm_engine *e) {
    if (!e->prop) return false;
    int n = sched_n_running(e->sc);
    for (int i = 0; i < n; i++) e->views[i] = spec_view_of(CHOICE(sched_running_at(e->sc, i)));
    bool busy = spec_policy_begin(&e->pol, e->views, n, sched_n_waiting(e->sc));
    if (e->prof_on) e->prof.guard_off += e->pol.spec_off;
    return busy;
}

/* Running choice c's wish, queued with the policy when it speculates; a
 * free proposer (prompt lookup) proposes now, and what it found is the
 * wish. */
static void spec_wish(lm_engine *e, eseq *c, bool busy) {
    c->n_draft = 0;
    c->n_prop = 0;
    c->q = NULL;
    if (!e->prop) return;
    bool sync;
    spec_view v = spec_view_of(c);
    int wish = spec_policy_wish(&e->pol, &v, &c->ctl, busy, &sync);
    if (sync) spec_prop_sync(e->prop, &c->ps, c->tokens, c->n_tokens);
    wish = engine_state_wish(e, wish); /* a hybrid model: within the free checkpoints */
    if (wish > 0 && spec_prop_early(e->prop)) {
        spec_job j = {.s = &c->ps, .toks = c->tokens, .n_toks = c->n_tokens, .hist = c->smp, .k = wish};
        spec_prop_propose(e->prop, &j, 1);
        wish = c->n_prop = j.n_out;
    }
    v = spec_view_of(c); /* the draft's state after the sync */
    int i = spec_policy_want(&e->pol, &v, wish);
    if (i >= 0) e->want_ch[i] = c, engine_state_promise(e, wish);
    else c->n_prop = 0;
}

/* Choice c proposes k tokens (k <= its wish): an early proposal keeps its
 * first k; otherwise a job for this iteration's proposer call, with the
 * guesses' distributions when c samples. The count the scheduler sees
 * (sq.n_spec), or 0 for a job (filled in once the proposer ran). */
static int spec_job_add(lm_engine *e, eseq *c, int k, int *n_jobs, int *q_used) {
    if (spec_prop_early(e->prop)) return c->n_prop = k;
    c->n_prop = 0;
    if (k <= 0) return 0;
    float *q = NULL;
    if (!sampler_greedy(c->smp)) { /* the guesses' distributions, for the rejection scheme */
        size_t V = (size_t)e->m->hp.n_vocab;
        if (k > e->spec_cap - *q_used) k = e->spec_cap - *q_used;
        if (k <= 0 || (!e->dq && !(e->dq = lm_malloc((size_t)e->spec_cap * V * sizeof *e->dq)))) return 0;
        q = e->dq + (size_t)*q_used * V;
        *q_used += k;
    }
    c->q = q;
    e->jobs[*n_jobs] =
        (spec_job){.s = &c->ps, .toks = c->tokens, .n_toks = c->n_tokens, .hist = c->smp, .k = k, .q = q};
    if (c->gm_on) { /* the guesses under the mask the target's rows get (the engine's mask buffer is free now) */
        e->jobs[*n_jobs].gm = c->gm;
        e->jobs[*n_jobs].mask = e->gr.gmask;
        e->jobs[*n_jobs].n_mask = grammar_vocab_size(e->gr.gvocab);
    }
    e->job_ch[(*n_jobs)++] = c;
    return 0;
}

/* The policy sizes the queued wishes at the batch's width (rows, n_dec of
 * them decodes); the proposals are made and the scheduler told their
 * sizes (sq.n_spec). */
static void spec_propose(lm_engine *e, int64_t rows, int n_dec) {
    if (!e->prop) return;
    spec_policy *p = &e->pol;
    int n_jobs = 0, q_used = 0;
    bool spec = false, once = false;
    spec_policy_size(p, rows, n_dec);
    for (int i = 0; i < p->n_want; i++) {
        eseq *c = e->want_ch[i];
        c->sq.n_spec = spec_job_add(e, c, p->wants[i].k, &n_jobs, &q_used);
        spec |= c->sq.n_spec > 0;
    }
    for (int i = 0; i < n_jobs; i++) { /* a start or a long catch-up: paid once, not the steady price */
        const draft_seq *ds = &e->jobs[i].s->ds;
        once |= !ds->kv || e->jobs[i].n_toks - (ds->off + ds->n) > e->jobs[i].k + 1;
    }
    spec_policy_made(p, spec || n_jobs > 0, once);
    if (!n_jobs) return;
    double t0 = e->prof_on ? lm_now() : 0;
    spec_prop_propose(e->prop, e->jobs, n_jobs);
    if (e->prof_on) e->prof.draft += lm_now() - t0, e->prof.draft_steps++;
    for (int i = 0; i < n_jobs; i++) e->job_ch[i]->sq.n_spec = e->job_ch[i]->n_prop = e->jobs[i].n_out;
}

/* Verify the proposal of speculating choice c, whose pass ran its pending
 * token and c->n_draft proposed ones (rows: n_draft + 1 logits rows). Row i
 * predicts the token after proposal i - 1: each row's token is taken as a
 * plain decode would take it (sampler, grammar, stop strings, events), the
 * proposal at that row verified against it; the first disagreement, or the
 * row after the last proposal, gives the target's own token and ends the
 * step. The verdict (proposed, accepted) goes to the policy and the
 * proposer. Positions of rejected proposals leave the KV (kv_truncate: they
 * lie in blocks this append took or copied, never in shared ones). A choice
 * that ends on the way has its KV released with only verified positions
 * counted (finish commits n_computed of them to the prefix cache); the
 * request is held meanwhile, so its choices outlive their last final
 * event. */
static void spec_verify(lm_engine *e, eseq *c, float *rows) {
    const int32_t V = e->m->hp.n_vocab;
    lm_request *r = c->req;
    int nd = c->n_draft, acc = 0;
    c->n_draft = 0;
    c->n_computed++; /* the pending token */
    c->stats.spec_proposed += nd;
    c->stats.spec_steps++;
    atomic_fetch_add(&r->refs, 1);
    for (int i = 0; i <= nd; i++) {
        int32_t d = i < nd ? c->ps.guess[i] : -1;
        int32_t t = engine_take_token(e, c, rows + (size_t)i * V, d, d >= 0 && c->q ? c->q + (size_t)i * V : NULL);
        if (t >= 0 && t == d) acc++;
        if (c->state == CH_DONE || t < 0 || t != d) break;
        c->n_computed++; /* position of proposal i holds the token taken */
    }
    pthread_mutex_lock(&e->mu);
    e->stats.spec_proposed_total += (uint64_t)nd;
    e->stats.spec_accepted_total += (uint64_t)acc;
    e->stats.spec_steps_total++;
    pthread_mutex_unlock(&e->mu);
    if (c->state != CH_DONE) {
        spec_policy_observe(&e->pol, &c->ctl, nd, acc);
        spec_prop_observe(e->prop, &c->ps, c->tokens, c->n_tokens, nd, acc);
        engine_mtp_feed(e, c);
        char err[LM_ERRLEN];
        if (kv_truncate(e->kv, c->kv, c->n_computed, err, sizeof err) != KV_OK ||
            engine_state_rollback(e, c, err, sizeof err) != 0)
            engine_finish_choice(e, c, LM_FINISH_ERROR, LM_ERR_INTERNAL, err);
    }
    engine_request_unref(r);
}

/* Free running choice c's KV; the scheduler already moved it to waiting. */
void engine_preempt(lm_engine *e, eseq *c) {
    if (e->prop) spec_prop_release(e->prop, &c->ps);
    kv_seq_free(e->kv, c->kv);
    c->kv = NULL;
    engine_state_drop(e, c);
    c->n_computed = 0;
    c->sq.n_pending = c->n_tokens;
    c->stats.preemptions++;
    pthread_mutex_lock(&e->mu);
    e->stats.preemptions_total++;
    pthread_mutex_unlock(&e->mu);
}

/* What the plan does not know about running choices: their lengths, a
 * partial last block they share (forks), and what an append takes beyond
 * its new blocks and that copy (less, for the local class, the blocks
 * leaving the window). kv_blocks_needed never goes below 0, so it is asked
 * for an append long enough to need more new blocks than the choice could
 * release: then the difference is exact. */
static void report_running(lm_engine *e) {
    int B = e->cfg.block_size;
    engine_state_iter(e);
    bool busy = spec_begin(e);
    int n_dec = 0;
    int64_t rows = 0;
    for (int i = 0; i < sched_n_running(e->sc); i++) {
        eseq *c = CHOICE(sched_running_at(e->sc, i));
        c->sq.n_pending = c->n_tokens - c->n_computed;
        c->sq.len = c->n_computed;
        c->sq.n_spec = 0;
        rows += c->sq.n_pending;
        n_dec += c->sq.n_pending == 1;
        spec_wish(e, c, busy);
        for (int k = 0; k < KV_N_CLASS; k++) c->sq.shared[k] = -1, c->sq.extra[k] = 0;
        for (int k = 0; k < e->n_class; k++) {
            int n = k == KV_GLOBAL ? 1 : (kv_seq_held(c->kv, k) + 2) * B;
            int fresh = (c->n_computed + n + B - 1) / B - (c->n_computed + B - 1) / B;
            c->sq.extra[k] = (int)kv_blocks_needed(e->kv, c->kv, n, k) - fresh;
            if (c->n_computed % B == 0) continue;
            int32_t last = kv_seq_table(c->kv, k)[c->n_computed / B];
            int refs = kv_class_refcount(e->kv, k, last);
            if (refs > 1) { /* the copy is the plan's to count */
                c->sq.shared[k] = last;
                c->sq.shared_refs[k] = refs;
                c->sq.extra[k]--;
            }
        }
    }
    spec_propose(e, rows, n_dec);
}

/* Whether seq s holds block b of class k. */
static bool holds(const lm_engine *e, const kv_seq *s, int k, int32_t b) {
    const int32_t *t = kv_seq_table(s, k);
    int nb = (kv_seq_len(s) + e->cfg.block_size - 1) / e->cfg.block_size;
    for (int i = 0; t && i < nb; i++)
        if (t[i] == b) return true;
    return false;
}

/* Blocks of class k in s's table (a released local entry is -1) that no
 * one but s holds once the victims p already chose are gone. */
static int64_t held_alone(const lm_engine *e, const kv_seq *s, int k, const eseq *self, const sched_plan *p) {
    int64_t n = 0;
    int nb = (kv_seq_len(s) + e->cfg.block_size - 1) / e->cfg.block_size;
    const int32_t *t = kv_seq_table(s, k);
    for (int i = 0; t && i < nb; i++) {
        if (t[i] < 0) continue;
        int refs = kv_class_refcount(e->kv, k, t[i]);
        for (int j = 0; j < p->n_preempt && refs > 1; j++) {
            const eseq *v = CHOICE(p->preempt[j]);
            if (v != self && v->kv && holds(e, v->kv, k, t[i])) refs--;
        }
        n += refs == 1;
    }
    return n;
}

/* Blocks of each class freeing c's KV would give back: those no one else
 * holds once the victims the plan already chose are gone too (forks of one
 * request share their prompt's blocks). */
static void answer_frees(lm_engine *e, eseq *c, const sched_plan *p) {
    int64_t frees[KV_N_CLASS] = {0};
    for (int k = 0; k < e->n_class; k++) frees[k] = held_alone(e, c->kv, k, c, p);
    sched_answer_frees(e->sc, &c->sq, frees);
}

/* Probe waiting choice c's admission: what the prefix cache fills (for a
 * hybrid model only as far as a state snapshot, engine_state_match), the
 * blocks that takes out of the available ones (cached blocks, and those
 * only the plan's victims hold, which the plan counted as given back), and
 * the new blocks the rest of its prompt (and one position) needs; local ones
 * at most what one sequence ever holds, as it gives its own back once they
 * leave the window. */
static void answer_admit(lm_engine *e, eseq *c, const sched_plan *p) {
    int64_t take[KV_N_CLASS] = {0}, need[KV_N_CLASS] = {0};
    int cached = 0;
    char err[LM_ERRLEN];
    if (!c->probe && (c->probe = kv_seq_new(e->kv, err, sizeof err))) {
        bool pc = e->cfg.prefix_cache && !c->emb; /* an embedding pools every row: no cached prefix */
        if (pc) kv_prefix_match(e->kv, c->probe, c->tokens, c->n_tokens, c->req->p.cache_salt);
        if (pc) engine_state_match(e, c); /* hybrids: only as far as a state snapshot */
        e->probes[e->n_probes++] = c;
    }
    if (c->probe) {
        cached = kv_seq_len(c->probe);
        int positions = c->n_tokens < e->n_ctx ? c->n_tokens + 1 : e->n_ctx; /* never past the context */
        for (int k = 0; k < e->n_class; k++) {
            take[k] = held_alone(e, c->probe, k, c, p);
            need[k] = kv_blocks_needed(e->kv, c->probe, positions - cached, k);
        }
        if (e->n_class > 1 && need[KV_LOCAL] > e->local_per_seq) need[KV_LOCAL] = e->local_per_seq;
    } else {
        for (int k = 0; k < e->n_class; k++) need[k] = INT64_MAX / 4; /* no memory: it cannot be admitted now */
    }
    sched_answer_admit(e->sc, &c->sq, cached, take, need);
}

/* Put n of c's pending tokens into the batch; a decode given more (the
 * plan took its proposal, or the first n - 1 tokens of it) adds the proposed
 * tokens after its pending one, each with its logits row. */
static void batch_add(lm_engine *e, eseq *c, int n, int *n_tok, int *n_seg) {
    c->n_draft = 0;
    if (n > 1 && c->n_tokens - c->n_computed == 1) {
        c->n_draft = n - 1;
        e->btok[*n_tok] = c->tokens[c->n_computed];
        memcpy(e->btok + *n_tok + 1, c->ps.guess, (size_t)(n - 1) * sizeof *e->btok);
    } else {
        memcpy(e->btok + *n_tok, c->tokens + c->n_computed, (size_t)n * sizeof *e->btok);
    }
    e->segs[*n_seg] = (lm_seg){.seq = c->kv,
                               .pos0 = c->n_computed,
                               .n = n,
                               .n_logits = c->n_draft ? n : !c->emb && c->n_computed + n == c->n_tokens,
                               .rconv = e->rs ? c->rptr : NULL,
                               .rmat = e->rs ? c->rptr + e->m->hp.n_rlayer : NULL,
                               .ck = e->rs && c->n_draft ? e->rs : NULL, /* checkpoints reserved in act */
                               .ck_slot = c->rslot};
    e->seg_ch[(*n_seg)++] = c;
    *n_tok += n;
}

/* Seconds from c's submission to now, its first admission: never 0, which
 * marks a choice not yet admitted. */
static double admit_time(const eseq *c) {
    double q = lm_now() - c->stats.t_submit;
    return q > 1e-9 ? q : 1e-9;
}

/* Act on a complete plan: free probes it does not admit, preempt, reject,
 * grow and admit. Fills the batch; returns its segment count. */
static int act(lm_engine *e, const sched_plan *p, int *n_tok) {
    int n_seg = 0;
    char err[LM_ERRLEN];
    for (int i = 0; i < e->n_probes; i++) {
        eseq *c = e->probes[i];
        bool admitted = false;
        for (int j = 0; j < p->n_admit && !admitted; j++) admitted = p->admit[j].seq == &c->sq;
        if (!admitted && c->probe) {
            kv_seq_free(e->kv, c->probe);
            c->probe = NULL;
        }
    }
    e->n_probes = 0;
    sched_commit(e->sc, p);
    for (int i = 0; i < p->n_preempt; i++) engine_preempt(e, CHOICE(p->preempt[i]));
    for (int i = 0; i < p->n_reject; i++)
        engine_finish_choice(e, CHOICE(p->reject[i]), LM_FINISH_ERROR, LM_ERR_TOO_LONG,
                             "the request does not fit the KV pool");
    for (int i = 0; i < p->n_run; i++) {
        eseq *c = CHOICE(p->run[i].seq);
        int n = c->n_tokens - c->n_computed == 1 ? engine_state_reserve(e, c, p->run[i].n)
                                                 : engine_state_trim(e, c, p->run[i].n, n_seg > 0);
        int rc = kv_append(e->kv, c->kv, n, err, sizeof err);
        if (rc == KV_OK) {
            if (n > 0) batch_add(e, c, n, n_tok, &n_seg);
        } else if (rc == KV_FULL) { /* the plan counted wrong: wait again rather than fail */
            e->plan_misses++;
            sched_requeue(e->sc, &c->sq);
            engine_preempt(e, c);
        } else {
            engine_finish_choice(e, c, LM_FINISH_ERROR, LM_ERR_NOMEM, err);
        }
    }
    for (int i = 0; i < p->n_admit; i++) {
        eseq *c = CHOICE(p->admit[i].seq);
        c->kv = c->probe;
        c->probe = NULL;
        c->n_computed = kv_seq_len(c->kv);
        if (c->stats.preemptions == 0) c->stats.cached_tokens = c->n_computed;
        int n = p->admit[i].n < c->n_tokens - c->n_computed ? p->admit[i].n : c->n_tokens - c->n_computed;
        n = engine_state_trim(e, c, n, n_seg > 0);
        if (kv_append(e->kv, c->kv, n, err, sizeof err) == KV_OK &&
            engine_state_take(e, c, NULL, err, sizeof err) == 0) {
            if (c->stats.queue == 0) c->stats.queue = admit_time(c);
            if (!c->req->started || c->sq.fair > e->vtime) engine_request_started(e, c);
            if (n > 0) batch_add(e, c, n, n_tok, &n_seg);
        } else { /* the plan counted wrong (or no memory): wait again rather than fail */
            e->plan_misses++;
            sched_requeue(e->sc, &c->sq);
            kv_seq_free(e->kv, c->kv);
            c->kv = NULL;
            c->n_computed = 0;
        }
    }
    return n_seg;
}

/* Fork choice 0's prompt into the request's other choices, each sampling
 * from its own copy of choice 0's first logits row (src). */
static void fork_choices(lm_engine *e, eseq *c0, const float *src) {
    lm_request *r = c0->req;
    int32_t V = e->m->hp.n_vocab;
    float *work = e->logits + (size_t)(e->cfg.max_seqs + e->spec_cap + 1) * V;
    for (int i = 1; i < r->p.n; i++) {
        eseq *c = &r->ch[i];
        if (c->state != CH_PENDING_FORK) continue;
        c->state = CH_LIVE;
        if (!sched_start(e->sc, &c->sq)) {
            /* no room to run beside it now: it prefills later on its own
             * (the prefix cache makes that cheap) */
            enqueue(e, c);
            continue;
        }
        char err[LM_ERRLEN];
        if (!(c->kv = kv_fork(e->kv, c0->kv, err, sizeof err)) || engine_state_take(e, c, c0, err, sizeof err) != 0) {
            engine_finish_choice(e, c, LM_FINISH_ERROR, LM_ERR_NOMEM, err);
            continue;
        }
        c->n_computed = c0->n_computed;
        c->stats.cached_tokens = c0->stats.cached_tokens;
        if (c->stats.queue == 0) c->stats.queue = admit_time(c);
        memcpy(work, src, (size_t)V * sizeof *work);
        engine_take_token(e, c, work, -1, NULL);
    }
}

static void publish(lm_engine *e) {
    kv_stats ks;
    kv_stats_get(e->kv, &ks);
    pthread_mutex_lock(&e->mu);
    metrics_queues(&e->stats, sched_n_running(e->sc), sched_n_waiting(e->sc), &ks);
    engine_state_stats(e, &e->stats);
    pthread_mutex_unlock(&e->mu);
}

/* Finish every cancelled choice, running or waiting. */
static void reap_cancelled(lm_engine *e) {
    for (int i = sched_n_running(e->sc) - 1; i >= 0; i--)
        if (i < sched_n_running(e->sc)) {
            eseq *c = CHOICE(sched_running_at(e->sc, i));
            if (atomic_load(&c->req->cancel)) engine_finish_choice(e, c, LM_FINISH_CANCELLED, LM_OK, NULL);
        }
    for (int i = sched_n_waiting(e->sc) - 1; i >= 0; i--)
        if (i < sched_n_waiting(e->sc)) {
            eseq *c = CHOICE(sched_waiting_at(e->sc, i));
            if (atomic_load(&c->req->cancel)) engine_finish_choice(e, c, LM_FINISH_CANCELLED, LM_OK, NULL);
        }
}

/* ---- sampling on the pool ---------------------------------------------- */

static void presample_fn(void *arg, int ith, int nth) {
    lm_engine *e = arg;
    for (int i = ith; i < e->n_pre; i += nth) e->pre_ch[i]->pre = sampler_sample(e->pre_ch[i]->smp, e->pre_row[i]);
}

/* Draw the next token of every plain decoding row of this iteration at once,
 * the rows spread over the pool's threads, before take_token emits them in
 * order. A choice's sampler and row are its own, so the draws are the ones
 * take_token would make one after another. Plain: a running choice with one
 * logits row, no grammar, no proposal to verify, no log-probabilities (they
 * read the row before the sampler writes over it) and not a first token
 * that forks (the forks copy the row first). */
static void presample(lm_engine *e, int n_seg) {
    const int32_t V = e->m->hp.n_vocab;
    e->n_pre = 0;
    if (pool_size(e->pool) < 2 || e->serial_sampling) return;
    int row = 0;
    for (int g = 0; g < n_seg; g++) {
        eseq *c = e->seg_ch[g];
        if (c->sq.where != SCHED_RUNNING) continue;
        if (c->n_draft) {
            row += e->segs[g].n_logits;
            continue;
        }
        if (!e->segs[g].n_logits) continue;
        float *lrow = e->logits + (size_t)row++ * V;
        const lm_request_params *p = &c->req->p;
        if (c->gm || p->logprobs || p->top_logprobs > 0 || (c->n_gen == 0 && c->index == 0 && p->n > 1)) continue;
        c->pre_iter = e->iter;
        e->pre_ch[e->n_pre] = c;
        e->pre_row[e->n_pre++] = lrow;
    }
    if (e->n_pre < 2) return;
    pool_run(e->pool, presample_fn, e);
}

void engine_set_serial_sampling(lm_engine *e, bool on) { e->serial_sampling = on; }

void engine_set_draft_masking(lm_engine *e, bool on) {
    if (e->dr) draft_set_masking(e->dr, on);
}

void engine_set_profile(lm_engine *e, bool on) {
    e->prof_on = on;
    e->fwd->profile = on;
}

void engine_profile(const lm_engine *e, engine_profile_t *p) {
    *p = e->prof;
    memcpy(p->ops, e->fwd->prof, sizeof p->ops);
}

/* One iteration. Returns false when there was nothing to run. */
static bool step(lm_engine *e) {
    const int32_t V = e->m->hp.n_vocab;
    reap_cancelled(e);
    if (!sched_n_running(e->sc) && !sched_n_waiting(e->sc)) {
        publish(e);
        return false;
    }
    /* plan, answering the scheduler's questions, then act */
    double t_step = e->pol.guard_on || e->itl.factor > 0 ? lm_now() : 0; /* the whole iteration, as clients see it */
    uint64_t gen0 = e->stats.generation_tokens_total;                    /* (the engine thread is its only writer) */
    engine_fair_preempt(e);
    report_running(e);
    sched_view view = {.avail = {0}};
    for (int k = 0; k < e->n_class; k++) view.avail[k] = kv_available(e->kv, k);
    view.cap = itl_cap(&e->itl);
    sched_begin(e->sc);
    const sched_plan *p;
    while ((p = sched_decide(e->sc, &view))->ask) {
        eseq *c = CHOICE(p->ask);
        if (c->sq.where == SCHED_RUNNING) answer_frees(e, c, p);
        else answer_admit(e, c, p);
    }
    int n_tok = 0, n_seg = act(e, p, &n_tok);
    if (n_seg == 0) {
        publish(e);
        return false;
    }
    bool decode_only = true, decodes = false; /* every segment / some segment one choice's decode */
    double prompt_flops = 0;                  /* the others' FLOPs for the latency bound (itl.h) */
    for (int g = 0; g < n_seg; g++) {
        bool dec = e->seg_ch[g]->n_gen > 0 && e->segs[g].n == 1 + e->seg_ch[g]->n_draft;
        decode_only = decode_only && dec;
        decodes = decodes || dec;
        if (!dec) prompt_flops += itl_flops(&e->itl, e->segs[g].n, e->segs[g].pos0);
    }

    /* one pass over the whole batch; logits rows in segment order */
    char err[LM_ERRLEN];
    double t0 = e->prof_on ? lm_now() : 0;
    e->iter++;
    engine_embed_begin(e, n_seg);
    int rc = fwd_run(e->fwd, e->btok, e->segs, n_seg, e->logits, err, sizeof err);
    double t1 = e->prof_on ? lm_now() : 0;
    if (rc == 0) presample(e, n_seg);
    double t2 = e->prof_on ? lm_now() : 0, serial0 = e->prof.sample;
    int row = 0;
    for (int g = 0; g < n_seg; g++) {
        eseq *c = e->seg_ch[g];
        if (c->sq.where != SCHED_RUNNING) continue;
        if (rc != 0) {
            engine_finish_choice(e, c, LM_FINISH_ERROR, LM_ERR_INTERNAL, err);
            continue;
        }
        if (c->n_draft) {
            spec_verify(e, c, e->logits + (size_t)row * V);
            row += e->segs[g].n_logits;
            continue;
        }
        c->n_computed += e->segs[g].n;
        if (c->emb) { /* an embedding: its rows pooled; it ends (and is freed) once its prompt is in */
            if (engine_embed_feed(e, g)) engine_finish_choice(e, c, LM_FINISH_STOP, LM_OK, NULL);
            continue;
        }
        engine_mtp_feed(e, c);
        if (e->cfg.prefix_cache && c->n_gen == 0) {
            kv_prefix_commit(e->kv, c->kv, c->tokens, c->n_computed, c->req->p.cache_salt);
            engine_state_save(e, c);
        }
        if (!e->segs[g].n_logits) continue;
        float *lrow = e->logits + (size_t)row++ * V;
        if (c->n_gen == 0 && c->index == 0 && c->req->p.n > 1) {
            /* the forks sample from copies of this row before choice 0 (which
             * may finish at once and free its blocks) takes its token */
            float *src = e->logits + (size_t)(e->cfg.max_seqs + e->spec_cap) * V;
            memcpy(src, lrow, (size_t)V * sizeof *src);
            fork_choices(e, c, src);
        }
        engine_take_token(e, c, lrow, -1, NULL);
    }
    if (e->itl.factor > 0 && rc == 0) itl_observe(&e->itl, lm_now() - t_step, decodes, prompt_flops);
    if (e->prof_on) {
        double t3 = lm_now();
        e->prof.forward += t1 - t0;
        e->prof.emit += (t3 - t2) - (e->prof.sample - serial0); /* less the serial samples in it */
        e->prof.sample += t2 - t1;
        e->prof.steps++;
        e->prof.seqs += (uint64_t)n_seg;
    }
    if (e->pol.guard_on && decode_only && rc == 0)
        spec_policy_record(&e->pol, n_seg, lm_now() - t_step, (int)(e->stats.generation_tokens_total - gen0));
    pthread_mutex_lock(&e->mu);
    metrics_iteration(&e->stats, n_seg, n_tok);
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
        eseq *c = &r->ch[0];
        c->sq.n_pending = c->n_tokens;
        if (sched_enqueue(e->sc, &c->sq) != 0) {
            pthread_mutex_unlock(&e->mu);
            engine_finish_choice(e, c, LM_FINISH_ERROR, LM_ERR_NOMEM, "out of memory queueing the request");
            pthread_mutex_lock(&e->mu);
        }
    }
    e->stats.waiting = sched_n_waiting(e->sc);
}

static int check_now(lm_engine *e, char *err, size_t errlen) {
    if (kv_pool_check(e->kv, err, errlen) != KV_OK) return -1;
    kv_stats ks;
    kv_stats_get(e->kv, &ks);
    int64_t live = 0;
    int n_running = sched_n_running(e->sc);
    for (int i = 0; i < n_running; i++) live += CHOICE(sched_running_at(e->sc, i))->kv != NULL;
    if (ks.n_seqs != live)
        return lm_err(err, errlen, "%lld KV sequences exist, %lld are live", (long long)ks.n_seqs, (long long)live);
    if (e->rs) {
        if (rstate_pool_check(e->rs, err, errlen) != RSTATE_OK) return -1;
        rstate_stats rst;
        rstate_stats_get(e->rs, &rst);
        int64_t held = 0;
        for (int i = 0; i < n_running; i++) {
            const eseq *c = CHOICE(sched_running_at(e->sc, i));
            if ((c->kv != NULL) != (c->rslot >= 0))
                return lm_err(err, errlen, "a running choice holds %s without %s", c->kv ? "KV" : "a state slot",
                              c->kv ? "a state slot" : "KV");
            held += c->rslot >= 0;
        }
        if (rst.n_live_used != held)
            return lm_err(err, errlen, "%lld recurrent state slots are in use, %lld running choices hold one",
                          (long long)rst.n_live_used, (long long)held);
        if (rst.n_ckpt_used) /* each verification releases its checkpoints */
            return lm_err(err, errlen, "%lld recurrent state checkpoints held between iterations",
                          (long long)rst.n_ckpt_used);
    }
    if (e->dr) {
        if (draft_check(e->dr, err, errlen) != 0) return -1;
        if (draft_live(e->dr) > live)
            return lm_err(err, errlen, "the draft model holds %lld KV sequences for %lld live ones",
                          (long long)draft_live(e->dr), (long long)live);
    }
    if (e->plan_misses)
        return lm_err(err, errlen, "%llu appends the scheduler's plans allowed failed",
                      (unsigned long long)e->plan_misses);
    for (int k = 0; k < KV_N_CLASS; k++)
        if (!n_running && ks.cls[k].n_used != 0)
            return lm_err(err, errlen, "%lld %sKV blocks are held with nothing running", (long long)ks.cls[k].n_used,
                          k == KV_LOCAL ? "local " : "");
    return 0;
}

/* Shutdown: every choice still queued gets its final event. */
static void cancel_all(lm_engine *e) {
    int n;
    while ((n = sched_n_running(e->sc)))
        engine_finish_choice(e, CHOICE(sched_running_at(e->sc, n - 1)), LM_FINISH_CANCELLED, LM_OK,
                             "the engine shut down");
    while ((n = sched_n_waiting(e->sc)))
        engine_finish_choice(e, CHOICE(sched_waiting_at(e->sc, n - 1)), LM_FINISH_CANCELLED, LM_OK,
                             "the engine shut down");
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
        engine_grammar_trim(&e->gr);
        pthread_mutex_lock(&e->mu);
        if (!busy && !e->inbox && !e->stop && !e->check_req) {
            if (!sched_n_running(e->sc) && !sched_n_waiting(e->sc)) pthread_cond_broadcast(&e->idle_cv);
            /* nothing runnable: sleep until a submission or cancellation */
            pthread_cond_wait(&e->wake, &e->mu);
        }
    }
    pthread_mutex_unlock(&e->mu);
    cancel_all(e);
    pthread_mutex_lock(&e->mu);
    drain_inbox(e);
    pthread_mutex_unlock(&e->mu);
    cancel_all(e);
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
    if (e->m->tp.lead && e->rs) tp_plan_state(NULL);
    rstate_pool_free(e->rs);
    sched_free(e->sc);
    lm_free(e->clients);
    lm_free(e->segs);
    lm_free(e->seg_ch);
    lm_free(e->pre_ch);
    lm_free(e->pre_row);
    lm_free(e->probes);
    spec_prop_free(e->prop);
    spec_policy_free(&e->pol);
    lm_free(e->views);
    lm_free(e->jobs);
    lm_free(e->job_ch);
    lm_free(e->want_ch);
    lm_free(e->dq);
    lm_free(e->btok);
    lm_free(e->emb_hid);
    lm_free(e->logits);
    lm_free(e->lp);
    lm_free(e->piece);
    lm_free(e->emit);
    engine_grammar_free(&e->gr);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->wake);
    pthread_cond_destroy(&e->idle_cv);
    lm_free(e);
}

/* The per-iteration buffers and the scheduler, once the pool is made. */
static int alloc_buffers(lm_engine *e, char *err, size_t errlen) {
    const lm_engine_config *c = &e->cfg;
    size_t V = (size_t)e->m->hp.n_vocab, S = (size_t)c->max_seqs;
    sched_config scfg = {.batch_tokens = c->batch_tokens,
                         .max_seqs = c->max_seqs,
                         .block_size = c->block_size,
                         .n_class = e->n_class,
                         .wm_blocks = (int64_t)ceil(c->watermark * (double)e->total_blocks[KV_GLOBAL]),
                         .static_batching = c->static_batching,
                         .spec_cap = e->spec_cap};
    e->sc = sched_new(&scfg);
    e->segs = lm_calloc(S, sizeof *e->segs);
    e->seg_ch = lm_calloc(S, sizeof *e->seg_ch);
    e->pre_ch = lm_calloc(S, sizeof *e->pre_ch);
    e->pre_row = lm_calloc(S, sizeof *e->pre_row);
    e->probes = lm_calloc(2 * S + 2, sizeof *e->probes);
    e->btok = lm_malloc((size_t)c->batch_tokens * sizeof *e->btok);
    /* batch rows (one per sequence, and one per proposed token), fork source, fork work */
    e->logits = lm_malloc((S + (size_t)e->spec_cap + 2) * V * sizeof *e->logits);
    e->lp = lm_malloc(V * sizeof *e->lp);
    e->piece_cap = detok_max_out(e->tok);
    e->gr.piece_cap = e->piece_cap;
    e->piece = lm_malloc((size_t)e->piece_cap);
    e->emit_cap = MAX_STOP_LEN + 2 * e->piece_cap + 64; /* held text + a piece, and a flush */
    e->emit = lm_malloc((size_t)e->emit_cap);
    uint64_t hid = engine_embed_hid_bytes(e->m, c); /* counted in the workspace: made now, not at first use */
    if (hid && !(e->emb_hid = lm_malloc((size_t)hid)))
        return lm_err(err, errlen, "out of memory allocating the engine's buffers");
    if (!e->sc || !e->segs || !e->seg_ch || !e->pre_ch || !e->pre_row || !e->probes || !e->btok || !e->logits ||
        !e->lp || !e->piece || !e->emit)
        return lm_err(err, errlen, "out of memory allocating the engine's buffers");
    return 0;
}

lm_engine *engine_new(const lm_model *m, const lm_tokenizer *tok, const lm_engine_config *cin, char *err,
                      size_t errlen) {
    lm_status st;
    return engine_new_status(m, tok, cin, &st, err, errlen);
}

lm_engine *engine_new_status(const lm_model *m, const lm_tokenizer *tok, const lm_engine_config *cin, lm_status *status,
                             char *err, size_t errlen) {
    return engine_new_tuned(m, tok, cin, NULL, status, err, errlen);
}

lm_engine *engine_new_tuned(const lm_model *m, const lm_tokenizer *tok, const lm_engine_config *cin,
                            const engine_tuning *tune, lm_status *status, char *err, size_t errlen) {
    /* a configuration the pool cannot be planned for is the caller's
     * (invalid); once it plans, what is left to fail is memory and threads */
    *status = LM_ERR_INVALID;
    lm_engine_config c;
    if (cin) c = *cin;
    else engine_config_default(&c);
    if (!tok) tok = m->tok;
    if (!tok) return lm_err(err, errlen, "the model has no tokenizer"), NULL;
    fwd_dims dims;
    lm_spec_config spec;
    if (engine_resolve_config(m, &c, &spec, &dims, err, errlen)) return NULL;
    const char *widths = c.spec && tune ? tune->spec_widths : NULL;
    if (widths) {
        spec_curve sc;
        char cerr[LM_ERRLEN];
        if (spec_curve_parse(widths, &sc, cerr, sizeof cerr) != 0)
            return lm_err(err, errlen, "the width curve '%.60s': %s", widths, cerr), NULL;
    }
    engine_mem mem;
    if (engine_mem_split(m, &c, &dims, &mem, err, errlen)) return NULL;
    *status = LM_ERR_NOMEM;
    lm_engine *e = lm_calloc(1, sizeof *e);
    if (!e) return lm_err(err, errlen, "out of memory"), NULL;
    e->m = m;
    e->tok = tok;
    e->n_ctx = dims.n_ctx;
    e->cfg = c;
    e->spec = spec;
    if (c.spec) e->cfg.spec = &e->spec;
    e->spec_widths = widths;
    /* proposals are verified in what the budget leaves, their rows bounded
     * so the logits buffer stays small next to the pool */
    e->spec_cap = spec_sched_cap(&c);
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->gr.mu, NULL);
    e->gr.tok = tok;
    e->gr.n_vocab = m->hp.n_vocab;
    e->gr.cap_bytes = tune && tune->grammar_cache_bytes ? tune->grammar_cache_bytes : ENGINE_GRAMMAR_CACHE_BYTES;
    pthread_cond_init(&e->wake, NULL);
    pthread_cond_init(&e->idle_cv, NULL);

    /* the pool engine_mem_split sized (the budget's rest, kv_mem, or n_ctx x
     * max_seqs positions capped at 4 GiB) */
    kv_config kc = mem.kc;
    if (!(e->kv = kv_pool_new(&kc, err, errlen))) goto fail;
    if (mem.rcfg.n_layer && !(e->rs = rstate_pool_new(&mem.rcfg, err, errlen))) goto fail;
    engine_state_init(e);
    const kv_plan *plan = kv_pool_plan(e->kv);
    for (int k = 0; k < KV_N_CLASS; k++) e->total_blocks[k] = plan->cls[k].n_blocks;
    e->n_class = kv_pool_window(e->kv) > 0 ? 2 : 1;
    e->local_per_seq = plan->local_blocks_per_seq;
    if (!(e->pool = pool_new(c.n_threads))) {
        lm_err(err, errlen, "cannot start %d threads", c.n_threads);
        goto fail;
    }
    if (!(e->fwd = fwd_new(m, e->pool, e->kv, &dims, err, errlen))) goto fail;
    /* no latency bound with recurrent layers: their prompt chunks end on the delta rule's pieces
     * (engine_state_trim), which a cut chunk would leave for other bits */
    itl_init_model(&e->itl, m->hp.n_rlayer > 0 ? 0 : c.itl_factor, ITL_FLOOR, m, c.kv_type, e->n_ctx);
    if (alloc_buffers(e, err, errlen) != 0) goto fail;
    if (engine_spec_setup(e, &mem.dkc, err, errlen) != 0) goto fail;
    metrics_init(&e->stats);
    e->stats.mem_budget = mem.budget;
    e->stats.mem_weights = mem.weights;
    e->stats.mem_packed = mem.packed;
    e->stats.mem_workspace = e->fwd->ws_bytes + engine_buffer_bytes(m, &c); /* measured: what fwd_new allocated */
    e->stats.mem_kv = plan->data_bytes;
    e->stats.mem_state = e->rs ? rstate_pool_plan(e->rs)->data_bytes : 0;
    e->stats.kv_max_tokens = plan->n_tokens;
    e->stats.kv_max_seqs = mem.kv_seqs;
    if (e->dr) { /* measured: what draft_new allocated, and the distributions' rows */
        e->stats.mem_draft_weights = mem.draft_weights;
        e->stats.mem_draft_workspace =
            draft_workspace_bytes(e->dr) + (uint64_t)e->spec_cap * (uint64_t)m->hp.n_vocab * sizeof(float);
        e->stats.mem_draft_kv = draft_kv_bytes(e->dr);
    }
    publish(e);
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        lm_err(err, errlen, "cannot start the engine thread");
        goto fail;
    }
    *status = LM_OK;
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
    engine_grammar_stats(&e->gr, st);
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
int engine_max_seqs(const lm_engine *e) { return e->cfg.max_seqs; }
