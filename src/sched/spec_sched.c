/*
 * spec_sched.c - speculative decoding's part of the engine (engine.h tells
 * the contract; engine_int.h shares the engine's objects): each
 * iteration's proposals, their sizes at the batch's width, the draft
 * model's passes, the verification of the proposed rows, and the cost
 * model's calibration at start.
 *
 * An iteration. report_running (engine.c) asks spec_sched_busy whether the
 * draft stands aside (work waits, or the budget cannot hold every running
 * choice's pending tokens and full proposals), then each running choice's
 * wish (spec_sched_wish: its controller's size, bounded by what it may
 * still generate and by the context; prompt lookup's proposal is made
 * there, a draft's KV is cut back to the tokens that still agree), then
 * spec_sched_propose sizes the wishes together against the width curves
 * (spec_size_batch) and makes the proposals: prompt lookup keeps a prefix,
 * the draft model guesses for every job in the same passes
 * (draft_propose). The scheduler sees each size as sq.n_spec. After the
 * pass, spec_sched_verify takes the proposal's rows in order through
 * engine_take_token and truncates the KV to the verified positions.
 *
 * The draft's passes are priced at the rows they feed: a sequence's
 * catch-up (spec_want.feed, up to wish + 1 rows while the draft keeps in
 * step) and its start (the whole sequence, spread over the steps it may
 * still take). The measured guard (spec_guard, decode/spec.h), on when
 * the curves were timed, gets every decode-only iteration's time and
 * tokens (spec_sched_record) but those that started a draft or caught
 * one up after a gap, and may keep an iteration plain (spec_off).
 *
 * Calibration (engine_new, spec_sched_setup). The width curves time the
 * model's (and the draft's) passes at 1, 2, 4, ... rows; a draft's flat
 * price is its one-row pass over the model's. Each time is the least of
 * interleaved rounds, so a pass the load slowed counts little; with timed
 * curves the draft's flat price comes from their one-row rounds.
 */
#include "sched/engine_int.h"

#include <string.h>

#include "base/util.h"
#include "decode/spec.h"
#include "kv/kv.h"
#include "model/forward.h"
#include "sched/draft.h"
#include "sched/sched.h"

/* The draft model's KV keeps only what still agrees with c's tokens: its
 * guesses after tokens[0 .. d_base) as far as they were taken. */
static void draft_resync(lm_engine *e, eseq *c) {
    draft_seq *ds = &c->ds;
    if (!ds->kv) return;
    int fed = ds->off + ds->n, agree = fed < c->d_base ? fed : c->d_base;
    while (agree < fed && agree < c->n_tokens && c->tokens[agree] == c->draft[agree - c->d_base]) agree++;
    draft_keep(e->dr, ds, agree);
}

/* Speculation: how many tokens running choice c would propose with its
 * next decode (its controller's wish; prompt lookup's proposal is already in
 * c->draft), 0 when it does not speculate this step. Only a decode proposes
 * (its prompt done, one token pending), and never past what it may still
 * generate (the last row's own token is always taken) or past the context. */
static int spec_wish(lm_engine *e, eseq *c, bool busy) {
    c->n_draft = 0;
    c->n_prop = 0;
    c->q = NULL;
    if (c->spec_k <= 0 || c->n_gen == 0 || c->n_tokens - c->n_computed != 1) return 0;
    int k = c->spec_k;
    if (k > c->req->p.max_tokens - c->n_gen - 1) k = c->req->p.max_tokens - c->n_gen - 1;
    if (k > e->n_ctx - c->n_tokens) k = e->n_ctx - c->n_tokens;
    if (k <= 0) return 0;
    if (e->spec_off) { /* the guard measured speculation losing at this width */
        if (e->dr) draft_resync(e, c);
        return 0;
    }
    if (!e->dr) {
        /* the controller counts every step it is asked, proposal or not */
        k = spec_ctl_want(&c->ctl, k);
        return c->n_prop = spec_ngram_propose(c->tokens, c->n_tokens, k, c->draft);
    }
    draft_resync(e, c);
    if (busy) return 0; /* the draft's passes would delay waiting work */
    return spec_ctl_want(&c->ctl, k);
}

/* Choice c proposes k tokens (k <= its wish): prompt lookup keeps the
 * first k of its proposal; a draft model's guesses become a job for this
 * iteration's draft passes. The count the scheduler sees (sq.n_spec), or 0
 * for a job (report_running fills it in once the draft ran). */
static int propose(lm_engine *e, eseq *c, int k, int *n_jobs, int *q_used) {
    if (!e->dr) return c->n_prop = k;
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
    c->d_base = c->n_tokens;
    e->jobs[*n_jobs] = (draft_job){
        .ds = &c->ds, .toks = c->tokens, .n_toks = c->n_tokens, .hist = c->smp, .k = k, .out = c->draft, .q = q};
    if (c->gm_on) { /* the guesses under the mask the target's rows get (the engine's mask buffer is free now) */
        e->jobs[*n_jobs].gm = c->gm;
        e->jobs[*n_jobs].mask = e->gmask;
        e->jobs[*n_jobs].n_mask = grammar_vocab_size(e->gvocab);
    }
    e->job_ch[(*n_jobs)++] = c;
    return 0;
}

/* Size the wishes of this iteration's n speculating choices at the
 * batch's width (spec.h): rows, the tokens the running choices carry
 * without proposals (at most the budget), n_dec of them decodes. */
static void size_wishes(lm_engine *e, int n, int64_t rows, int n_dec) {
    if (!e->sizing || n == 0) {
        for (int i = 0; i < n; i++) e->wants[i].k = e->wants[i].k_max;
        return;
    }
    if (rows > e->cfg.batch_tokens) rows = e->cfg.batch_tokens;
    spec_size_batch(e->wants, n, (int)rows, n_dec, &e->curve, e->dr ? e->draft_cost : 0,
                    e->dcurve.n ? &e->dcurve : NULL);
}

/* Verify the proposal of speculating choice c, whose pass ran its pending
 * token and c->n_draft proposed ones (rows: n_draft + 1 logits rows). Row i
 * predicts the token after proposal i - 1: each row's token is taken as a
 * plain decode would take it (sampler, grammar, stop strings, events), the
 * proposal at that row verified against it; the first disagreement, or the
 * row after the last proposal, gives the target's own token and ends the
 * step. Positions of rejected proposals leave the KV (kv_truncate: they lie
 * in blocks this append took or copied, never in shared ones). A choice that
 * ends on the way has its KV released with only verified positions counted
 * (finish commits n_computed of them to the prefix cache); the request is
 * held meanwhile, so its choices outlive their last final event. */
void spec_sched_verify(lm_engine *e, eseq *c, float *rows) {
    const int32_t V = e->m->hp.n_vocab;
    lm_request *r = c->req;
    int nd = c->n_draft, acc = 0;
    c->n_draft = 0;
    c->n_computed++; /* the pending token */
    c->stats.spec_proposed += nd;
    c->stats.spec_steps++;
    atomic_fetch_add(&r->refs, 1);
    for (int i = 0; i <= nd; i++) {
        int32_t d = i < nd ? c->draft[i] : -1;
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
        spec_ctl_update(&c->ctl, nd, acc);
        char err[LM_ERRLEN];
        if (kv_truncate(e->kv, c->kv, c->n_computed, err, sizeof err) != KV_OK)
            engine_finish_choice(e, c, LM_FINISH_ERROR, LM_ERR_INTERNAL, err);
    }
    engine_request_unref(r);
}

/* Seconds of one pass of the model over n rows (a scratch sequence of n
 * tokens, each with its logits row; n <= the budget and the logits rows);
 * -1 when it fails. */
static double time_rows(lm_engine *e, int32_t tok, int n) {
    char err[LM_ERRLEN];
    kv_seq *s = kv_seq_new(e->kv, err, sizeof err);
    if (!s) return -1;
    double t = -1;
    for (int i = 0; i < n; i++) e->btok[i] = tok;
    if (kv_append(e->kv, s, n, err, sizeof err) == KV_OK) {
        lm_seg seg = {.seq = s, .pos0 = 0, .n = n, .n_logits = n};
        double t0 = lm_now();
        if (fwd_run(e->fwd, e->btok, &seg, 1, e->logits, err, sizeof err) == 0) t = lm_now() - t0;
    }
    kv_seq_free(e->kv, s);
    return t;
}

static double time_pass(lm_engine *e, int32_t tok) { return time_rows(e, tok, 1); }

/* A measured curve's times held under the bound a pass obeys: the weights
 * read once (the one-row time) plus arithmetic in proportion to the rows
 * (the widest point's time, per row): t(w) <= 1 + t(W) x w / W. A sample
 * the load inflated at a narrow width (where a tiny model's pass is a
 * matter of microseconds) so does not stop speculation at batch 1. */
static void curve_bound(spec_curve *c) {
    if (c->n < 2) return;
    float per_row = c->t[c->n - 1] / (float)c->w[c->n - 1];
    for (int i = 1; i < c->n - 1; i++)
        if (c->t[i] > 1.0f + per_row * (float)c->w[i]) c->t[i] = 1.0f + per_row * (float)c->w[i];
    for (int i = 1; i < c->n; i++)
        if (c->t[i] < c->t[i - 1]) c->t[i] = c->t[i - 1];
}

/* The width curves (spec.h, spec_size_batch): the model's pass at 1, 2, 4,
 * ... rows up to what one iteration verifies (at most SPEC_CALIB_ROWS; the
 * curve goes on linearly past it) and, with a draft model priced at start,
 * the draft's pass at 1 .. max_seqs rows. Each is the least of rounds of
 * interleaved passes after a first round that pages the weights in: at
 * least four, more while they took under a tenth of a second (a small
 * model's passes, which the load disturbs most), at most 100; so a pass the
 * load slowed counts little. Then curve_bound. A curve that cannot be
 * timed stays flat (n = 0), and so do both when the model's one-row pass
 * takes under SPEC_CALIB_MIN_S: a small model's passes are microseconds,
 * which the load and the threads' hand-offs time more than the rows do.
 * Returns the draft's one-row pass over the model's, the draft's flat
 * price (as draft_calibrate measures it, from the same rounds), or -1
 * when either was not timed. */
static float curve_calibrate(lm_engine *e) {
    int32_t tok = tok_bos(e->tok) >= 0 ? tok_bos(e->tok) : 0;
    int wmax = e->cfg.max_seqs + e->spec_cap, dmax = e->dr ? e->cfg.max_seqs : 0;
    if (wmax > e->cfg.batch_tokens) wmax = e->cfg.batch_tokens;
    if (wmax > SPEC_CALIB_ROWS) wmax = SPEC_CALIB_ROWS;
    if (dmax > SPEC_CALIB_ROWS) dmax = SPEC_CALIB_ROWS;
    int w[SPEC_CURVE_MAX], n = 0;
    for (int x = 1; n < SPEC_CURVE_MAX - 1 && x < (wmax > dmax ? wmax : dmax); x *= 2) w[n++] = x;
    w[n++] = wmax > dmax ? wmax : dmax;
    double tm[SPEC_CURVE_MAX], td[SPEC_CURVE_MAX];
    for (int i = 0; i < n; i++) tm[i] = td[i] = 1e30;
    bool mok = true, dok = dmax > 0;
    double t0 = lm_now();
    for (int r = 0; r < 100 && (mok || dok) && (r < 5 || lm_now() - t0 < 0.1); r++)
        for (int i = 0; i < n; i++) {
            double a = mok && w[i] <= wmax ? time_rows(e, tok, w[i]) : 0;
            double b = dok && w[i] <= dmax ? draft_time_rows(e->dr, tok, w[i]) : 0;
            if (a < 0) mok = false;
            if (b < 0) dok = false;
            if (r > 0 && w[i] <= wmax && a < tm[i]) tm[i] = a;
            if (r > 0 && w[i] <= dmax && b < td[i]) td[i] = b;
        }
    e->curve.n = e->dcurve.n = 0;
    for (int i = 0; i < n; i++) {
        if (mok && w[i] <= wmax && tm[i] > 0) e->curve.w[e->curve.n] = w[i], e->curve.t[e->curve.n++] = (float)tm[i];
        if (dok && w[i] <= dmax && td[i] > 0)
            e->dcurve.w[e->dcurve.n] = w[i], e->dcurve.t[e->dcurve.n++] = (float)td[i];
    }
    if (e->curve.n && spec_curve_fix(&e->curve, NULL, 0) != 0) e->curve.n = 0;
    if (e->dcurve.n && spec_curve_fix(&e->dcurve, NULL, 0) != 0) e->dcurve.n = 0;
    if (mok && tm[0] < SPEC_CALIB_MIN_S) e->curve.n = e->dcurve.n = 0; /* too short to time under load */
    curve_bound(&e->curve);
    curve_bound(&e->dcurve);
    return mok && dok && tm[0] > 0 && tm[0] < 1e30 && td[0] < 1e30 ? (float)(td[0] / tm[0]) : -1.0f;
}

/* The cost model's price of a draft pass (spec.h): its time over the
 * model's, one token each, the least of five interleaved after a pass of
 * each that pages the weights in (so a pass the load slowed counts
 * little). Without a measurement, the ratio of the weights' bytes, which
 * a batch-1 pass reads once. At least 0.001. */
static float draft_calibrate(lm_engine *e) {
    const lm_model *dm = e->cfg.draft_model;
    double bytes = (double)(dm->weight_bytes + dm->packed_bytes) /
        (double)(e->m->weight_bytes + e->m->packed_bytes ? e->m->weight_bytes + e->m->packed_bytes : 1);
    int32_t tok = tok_bos(e->tok) >= 0 ? tok_bos(e->tok) : 0;
    double tm = 1e30, td = 1e30;
    for (int i = 0; i < 6; i++) {
        double a = time_pass(e, tok), b = draft_time_pass(e->dr, tok);
        if (a < 0 || b < 0) {
            tm = -1;
            break;
        }
        if (i > 0 && a < tm) tm = a;
        if (i > 0 && b < td) td = b;
    }
    double cost = tm > 0 && td < 1e30 ? td / tm : bytes;
    return cost < 1e-3 ? 1e-3f : (float)cost;
}

/* proposals are verified in what the budget leaves, their rows bounded so
 * the logits buffer stays small next to the pool */
int spec_sched_cap(const lm_engine_config *c) {
    if (c->spec == LM_SPEC_NONE) return 0;
    int64_t cap = (int64_t)c->spec_max * c->max_seqs;
    if (cap > c->batch_tokens - 1) cap = c->batch_tokens - 1;
    if (cap > 64) cap = 64;
    return (int)cap;
}

bool spec_sched_busy(lm_engine *e) {
    /* the draft model speculates only while nothing waits and the budget
     * holds every running choice's pending tokens and full proposals */
    bool busy = sched_n_waiting(e->sc) > 0;
    int64_t want = 0;
    e->step_spec = false;
    e->step_once = false;
    e->spec_off = false;
    if (e->guard_on) {
        int width = 0;
        for (int i = 0; i < sched_n_running(e->sc); i++) {
            const eseq *c = CHOICE(sched_running_at(e->sc, i));
            width += c->n_tokens - c->n_computed == 1;
        }
        e->spec_off = !spec_guard_allow(&e->guard, width);
        if (e->prof_on) e->prof.guard_off += e->spec_off;
    }
    for (int i = 0; e->dr && !busy && i < sched_n_running(e->sc); i++) {
        const eseq *c = CHOICE(sched_running_at(e->sc, i));
        int left = c->req->p.max_tokens - c->n_gen - 1;
        want += c->n_tokens - c->n_computed + (c->spec_k < left ? c->spec_k : left);
        busy = want > e->cfg.batch_tokens;
    }
    return busy;
}

void spec_sched_wish(lm_engine *e, eseq *c, bool busy, int *n_want) {
    int wish = spec_wish(e, c, busy);
    if (wish > 0 && *n_want < e->cfg.max_seqs) {
        /* the draft's catch-up as a step pays it while the draft keeps in
         * step: the tokens since its KV ends, at most wish + 1 (the
         * accepted guesses and the target's own token); a longer gap (after
         * plain steps) is paid once. A start (no KV: the whole sequence the
         * first time, else a short window) is paid once too, so it is
         * spread over the steps the choice may still take: under load, with
         * many sequences starting at once, the start is priced as it runs */
        int feed = 1;
        if (e->dr && c->ds.kv) {
            feed = c->n_tokens - (c->ds.off + c->ds.n);
            if (feed > wish + 1) feed = wish + 1;
        } else if (e->dr) {
            int start = c->ds.started ? DRAFT_RESTART_CTX : c->n_tokens;
            float per_step = 1.0f + c->ctl.acc * (float)wish; /* tokens a step yields, about */
            int steps = (int)((float)(c->req->p.max_tokens - c->n_gen) / per_step) + 1;
            feed = 1 + (start + steps - 1) / steps;
        }
        e->wants[*n_want] = (spec_want){.acc = c->ctl.acc, .k_max = wish, .probe = c->ctl.probing != 0, .feed = feed};
        e->want_ch[(*n_want)++] = c;
    } else {
        c->n_prop = 0;
    }
}

void spec_sched_propose(lm_engine *e, int n_want, int64_t rows, int n_dec) {
    int n_jobs = 0, q_used = 0;
    size_wishes(e, n_want, rows, n_dec);
    for (int i = 0; i < n_want; i++)
        e->want_ch[i]->sq.n_spec = propose(e, e->want_ch[i], e->wants[i].k, &n_jobs, &q_used);
    for (int i = 0; i < n_want; i++) e->step_spec |= e->want_ch[i]->sq.n_spec > 0;
    e->step_once = false;
    for (int i = 0; i < n_jobs; i++) { /* a start or a long catch-up: paid once, not the steady price */
        const draft_seq *ds = e->jobs[i].ds;
        e->step_once |= !ds->kv || e->jobs[i].n_toks - (ds->off + ds->n) > e->jobs[i].k + 1;
    }
    if (n_jobs) {
        e->step_spec = true;
        double t0 = e->prof_on ? lm_now() : 0;
        draft_propose(e->dr, e->jobs, n_jobs, e->cfg.spec_min, e->cfg.spec_p_min);
        if (e->prof_on) e->prof.draft += lm_now() - t0, e->prof.draft_steps++;
        for (int i = 0; i < n_jobs; i++) e->job_ch[i]->sq.n_spec = e->job_ch[i]->n_prop = e->jobs[i].n_out;
    }
}

int spec_sched_setup(lm_engine *e, const kv_config *dkc, char *err, size_t errlen) {
    const lm_engine_config *c = &e->cfg;
    if (c->spec == LM_SPEC_DRAFT) {
        e->jobs = lm_calloc((size_t)c->max_seqs, sizeof *e->jobs);
        e->job_ch = lm_calloc((size_t)c->max_seqs, sizeof *e->job_ch);
        if (!e->jobs || !e->job_ch) return lm_err(err, errlen, "out of memory");
        if (!(e->dr = draft_new(c->draft_model, e->pool, dkc, e->n_ctx, c->batch_tokens, c->max_seqs, c->draft_vocab,
                                err, errlen)))
            return -1;
    }
    if (e->spec_cap > 0) {
        e->wants = lm_calloc((size_t)c->max_seqs, sizeof *e->wants);
        e->want_ch = lm_calloc((size_t)c->max_seqs, sizeof *e->want_ch);
        if (!e->wants || !e->want_ch) return lm_err(err, errlen, "out of memory");
    }
    float ratio = -1;
    if (e->spec_cap > 0 && c->spec_cost >= 0) { /* the batch's width prices proposals */
        if (c->spec_widths) spec_curve_parse(c->spec_widths, &e->curve, NULL, 0); /* resolve_config checked it */
        else if (c->spec_cost == 0) ratio = curve_calibrate(e);
        e->sizing = true;
        /* measured prices: the measured guard decides too (a set curve or a
         * flat price stays deterministic) */
        e->guard_on = !c->spec_widths && c->spec_cost == 0 && e->curve.n > 0;
        spec_guard_init(&e->guard);
    }
    /* a draft's flat price: set, none, from the width curves' rounds, or timed */
    if (e->dr)
        e->draft_cost = c->spec_cost > 0 ? c->spec_cost
            : c->spec_cost < 0           ? 0
            : ratio > 0                  ? (ratio < 1e-3f ? 1e-3f : ratio)
                                         : draft_calibrate(e);
    return 0;
}

void spec_sched_record(lm_engine *e, int width, double seconds, int tokens) {
    /* a step that started a draft or caught it up after a gap pays a
     * one-off cost the sizing spreads: it says nothing of speculation's
     * steady price */
    if (e->guard_on && !e->step_once) spec_guard_record(&e->guard, width, e->step_spec, seconds, tokens);
}
