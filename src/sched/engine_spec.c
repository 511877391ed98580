/*
 * engine_spec.c - speculation's setup at engine_new (contract in
 * engine_int.h): the proposer (prompt lookup, a draft model's runner, a
 * Qwen3.5 file's MTP layer), the policy's buffers and configuration, and
 * its prices, calibrated by timing passes of the model (and of the draft)
 * over a scratch sequence before the engine thread starts; and those
 * prices as the engine reports them (engine_spec_prices). What each
 * iteration does with the policy's decisions stays in engine.c.
 *
 * Threads: engine_new's, before the engine thread exists. Memory: the
 * proposer and the policy's per-sequence arrays (max_seqs each), freed by
 * engine_free; the calibration's scratch sequence and state slot are
 * given back before it returns.
 */
#include "sched/engine.h"
#include "sched/engine_int.h"

#include "base/util.h"
#include "kv/kv.h"
#include "kv/rstate.h"
#include "model/forward.h"
#include "sched/draft.h"

/* Seconds of one pass of the model over n rows (a scratch sequence of n
 * tokens, each with its logits row; n <= the budget and the logits rows;
 * a hybrid model's in a scratch state slot, with checkpoints when they
 * fit); -1 when it fails. */
static double time_rows(lm_engine *e, int32_t tok, int n) {
    char err[LM_ERRLEN];
    kv_seq *s = kv_seq_new(e->kv, err, sizeof err);
    if (!s) return -1;
    double t = -1;
    eseq st = {.rslot = -1}; /* a hybrid model's scratch state (a live slot, all free at start) */
    if (e->rs &&
        (!(st.rptr = lm_calloc(2 * (size_t)e->m->hp.n_rlayer, sizeof *st.rptr)) ||
         engine_state_take(e, &st, NULL, err, sizeof err) != 0))
        n = 0;
    for (int i = 0; i < n; i++) e->btok[i] = tok;
    if (n > 0 && kv_append(e->kv, s, n, err, sizeof err) == KV_OK) {
        lm_seg seg = {.seq = s, .pos0 = 0, .n = n, .n_logits = n, .rconv = st.rptr, .ck_slot = st.rslot};
        if (e->rs) seg.rmat = st.rptr + e->m->hp.n_rlayer;
        if (e->rs && n > 1 && rstate_ckpt_reserve(e->rs, st.rslot, 0, n, NULL, 0) == RSTATE_OK)
            seg.ck = e->rs; /* rows priced as a verification segment runs them */
        double t0 = lm_now();
        if (fwd_run(e->fwd, e->btok, &seg, 1, e->logits, err, sizeof err) == 0) t = lm_now() - t0;
    }
    engine_state_drop(e, &st);
    lm_free(st.rptr);
    kv_seq_free(e->kv, s);
    return t;
}

/* The token the calibration's passes feed. */
static int32_t calib_tok(const lm_engine *e) { return tok_bos(e->tok) >= 0 ? tok_bos(e->tok) : 0; }
static double model_rows(void *ctx, int n) { return time_rows(ctx, calib_tok(ctx), n); }
static double model_pass(void *ctx) { return time_rows(ctx, calib_tok(ctx), 1); }
static double draft_rows(void *ctx, int n) { return draft_time_rows(((lm_engine *)ctx)->dr, calib_tok(ctx), n); }
static double draft_pass(void *ctx) { return draft_time_pass(((lm_engine *)ctx)->dr, calib_tok(ctx)); }

/* At engine_new, once the pool, workspace and buffers are made: the
 * proposer (a draft model's runner: dkc its pool's configuration), the
 * policy and its prices. 0, or -1 with a message. */
int engine_spec_setup(lm_engine *e, const kv_config *dkc, char *err, size_t errlen) {
    const lm_engine_config *c = &e->cfg;
    const lm_spec_config *sc = c->spec;
    if (!sc) return 0;
    size_t S = (size_t)c->max_seqs;
    if (sc->proposer == LM_SPEC_DRAFT) {
        e->prop = spec_prop_draft(sc->draft_model, e->pool, dkc, e->n_ctx, c->batch_tokens, c->max_seqs,
                                  sc->draft_vocab, sc->min, sc->p_min, err, errlen);
        if (!e->prop) return -1;
    } else if (sc->proposer == LM_SPEC_MTP) {
        if (!(e->prop = spec_prop_mtp(e->m, e->pool, e->n_ctx, c->batch_tokens, c->max_seqs, err, errlen))) return -1;
        e->fwd->hid = spec_prop_hid(e->prop);
    } else if (!(e->prop = spec_prop_ngram())) {
        return lm_err(err, errlen, "out of memory");
    }
    e->dr = spec_prop_runner(e->prop);
    e->views = lm_calloc(S, sizeof *e->views);
    e->want_ch = lm_calloc(S, sizeof *e->want_ch);
    e->jobs = lm_calloc(S, sizeof *e->jobs);
    e->job_ch = lm_calloc(S, sizeof *e->job_ch);
    if (!e->views || !e->want_ch || !e->jobs || !e->job_ch) return lm_err(err, errlen, "out of memory");
    const lm_model *dm = sc->draft_model;
    spec_policy_config pc = {
        .max_seqs = c->max_seqs,
        .batch_tokens = c->batch_tokens,
        .n_ctx = e->n_ctx,
        .spec_cap = e->spec_cap,
        .draft = e->dr != NULL,
        .spec_cost = sc->cost,
        .widths = e->spec_widths,
        .draft_bytes = !e->dr ? 0
                              : (double)(dm->weight_bytes + dm->packed_bytes) /
                (double)(e->m->weight_bytes + e->m->packed_bytes ? e->m->weight_bytes + e->m->packed_bytes : 1)};
    if (spec_policy_init(&e->pol, &pc) != 0) return lm_err(err, errlen, "out of memory");
    spec_policy_setup(&e->pol, (spec_timer){model_rows, model_pass, e},
                      e->dr ? (spec_timer){draft_rows, draft_pass, e} : (spec_timer){0});
    return 0;
}

void engine_spec_prices(const lm_engine *e, engine_spec_prices_t *p) {
    *p = (engine_spec_prices_t){.draft_cost = e->pol.draft_cost};
    if (e->pol.sizing && e->pol.curve.n > 0) {
        p->width_rows = e->pol.curve.w[e->pol.curve.n - 1];
        p->width_cost = e->pol.curve.t[e->pol.curve.n - 1];
    }
}
