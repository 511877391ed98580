/*
 * engine_embed.c - embedding requests (lm_request_params.embed).
 *
 * An embedding request is a choice like any other up to its last prompt
 * token: the scheduler admits it, its prompt is prefilled in chunks batched
 * with the other choices' tokens, and preemption recomputes it from
 * position 0. What differs: its segments want no logits (no LM head rows);
 * the pass writes every row's state after the final norm into lm_fwd.hid
 * (the MTP proposer's buffer when it has one, else emb_hid, set only for
 * passes that hold an embedding's rows), and after the pass its rows are
 * pooled on the engine thread (embed.h: the mean accumulates across
 * chunks; a chunk at position 0 starts over). Once its whole prompt is in,
 * engine.c finishes it (LM_FINISH_STOP) with the pooled vector in the done
 * event; its KV is freed then, never committed to the prefix cache, and its
 * admission never probes the cache (a cached prefix would skip the rows
 * the pooling needs).
 *
 * Nothing is sampled: submission turns the request into one that wants a
 * single token and carries no sampling extras (engine_embed_params), so
 * the context and pool checks of ordinary requests apply (a prompt of at
 * most n_ctx tokens) and no stop strings, grammar or speculation state is
 * made. Under pipeline parallelism the states live on the last stage, not
 * here: refused.
 *
 * Encoders (bert, nomic-bert: hp.encoder, no LM head) and the other
 * non-causal models (gemma-embedding) take embedding requests only. A model whose attention is not causal (hp.causal false)
 * runs each input in one pass (encoder.h): an input longer than the batch
 * is refused at submission; its choice's sched_seq.whole makes the
 * scheduler admit it only with room for all of it, holding admissions back
 * once its turn has come (sched.h), and engine_state_trim holds back a
 * running prompt that a plan cut short.
 */
#include "sched/engine_int.h"

#include <string.h>

#include "base/util.h"
#include "model/embed.h"

lm_status engine_embed_params(const lm_engine *e, const lm_request_params *p, lm_request_params *q, char *err,
                              size_t errlen) {
    if (!p->embed && (e->m->hp.encoder || !e->m->hp.causal)) /* bert, nomic-bert: no LM head; nor generating */
        return lm_err(err, errlen, "the model %s: it only embeds (an embedding request)",
                      e->m->hp.encoder ? "is an encoder" : "has non-causal attention"),
               LM_ERR_INVALID;
    if (!p->embed) return LM_OK; /* a generation request: the caller's checks */
    if (p->n != 1) return lm_err(err, errlen, "an embedding request has n = 1 (got %d)", p->n), LM_ERR_INVALID;
    if (!e->m->hp.causal && p->n_prompt > e->cfg.batch_tokens) /* it must run in one pass (encoder.h) */
        return lm_err(err, errlen,
                      "the model's attention is not causal: an input runs in one pass, at most %d tokens "
                      "(the batch), not %d",
                      e->cfg.batch_tokens, p->n_prompt),
               LM_ERR_TOO_LONG;
    if (e->m->pp.size > 1)
        return lm_err(err, errlen, "embeddings are not supported under pipeline parallelism"), LM_ERR_UNSUPPORTED;
    int pooling = embed_pooling_resolve(p->pooling, e->m->hp.pooling, err, errlen);
    if (pooling < 0) return LM_ERR_INVALID;
    *q = *p;
    q->pooling = pooling;
    q->max_tokens = 1; /* the checks of a request that wants one token: the prompt fits n_ctx */
    q->n_stop = 0, q->stop = NULL;
    q->n_bias = 0, q->bias_ids = NULL, q->bias_vals = NULL;
    q->grammar = NULL, q->grammar_len = 0, q->grammar_root = NULL;
    q->grammar_triggers = NULL, q->n_grammar_triggers = 0;
    q->logprobs = false, q->top_logprobs = 0;
    q->penalize_prompt = false;
    q->spec_k = -1;
    return LM_OK;
}

embed_pool *engine_embed_pool(lm_engine *e, int pooling) {
    embed_pool *p = embed_pool_new(pooling, e->m->hp.n_embd);       /* emb_hid was made at engine_new */
    if (p && embed_pool_project(p, &e->m->dense2, &e->m->dense3)) { /* gemma-embedding's dense_2, dense_3 */
        embed_pool_free(p);
        p = NULL;
    }
    return p;
}

void engine_embed_begin(lm_engine *e, int n_seg) {
    if (e->fwd->hid && e->fwd->hid != e->emb_hid) return; /* the MTP proposer's: every pass writes it */
    bool any = false;
    for (int g = 0; g < n_seg && !any; g++) any = e->seg_ch[g]->emb != NULL;
    e->fwd->hid = any ? e->emb_hid : NULL;
}

bool engine_embed_feed(lm_engine *e, int g) {
    const size_t E = (size_t)e->m->hp.n_embd;
    eseq *c = e->seg_ch[g];
    size_t row0 = 0;
    for (int i = 0; i < g; i++) row0 += (size_t)e->segs[i].n;
    embed_pool_add(c->emb, e->fwd->hid + row0 * E, E, e->segs[g].n, e->segs[g].pos0);
    return c->n_computed == c->n_tokens;
}
