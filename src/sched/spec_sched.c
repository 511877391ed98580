/*
 * spec_sched.c - the speculation policy (contract in spec_sched.h): each
 * iteration's wishes, their sizes at the batch's width, the controllers'
 * outcomes, the measured guard, and the prices' calibration at start. It
 * sees sequences as spec_view and passes through spec_timer; it returns
 * decisions (wants[i].k, busy, spec_off) the engine acts on.
 *
 * The draft's passes are priced at the rows they feed: a sequence's
 * catch-up (spec_want.feed, up to wish + 1 rows while the draft keeps in
 * step) and its start (the whole sequence, spread over the steps it may
 * still take). The measured guard (spec_guard, decode/spec.h), on when
 * the curves were timed, gets every decode-only iteration's time and
 * tokens (spec_policy_record) but those that started a draft or caught
 * one up after a gap, and may keep an iteration plain (spec_off).
 *
 * Calibration (spec_policy_setup). The width curves time the model's (and
 * the draft's) passes at 1, 2, 4, ... rows; a draft's flat price is its
 * one-row pass over the model's. Each time is the least of interleaved
 * rounds, so a pass the load slowed counts little; with timed curves the
 * draft's flat price comes from their one-row rounds.
 */
#include "sched/spec_sched.h"

#include <string.h>

#include "base/util.h"
#include "decode/spec.h"
#include "sched/draft.h"

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
 * ... rows (model's timer) up to what one iteration verifies (at most SPEC_CALIB_ROWS; the
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
static float curve_calibrate(spec_policy *p, spec_timer model, spec_timer draft) {
    int wmax = p->cfg.max_seqs + p->cfg.spec_cap, dmax = draft.rows ? p->cfg.max_seqs : 0;
    if (wmax > p->cfg.batch_tokens) wmax = p->cfg.batch_tokens;
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
            double a = mok && w[i] <= wmax ? model.rows(model.ctx, w[i]) : 0;
            double b = dok && w[i] <= dmax ? draft.rows(draft.ctx, w[i]) : 0;
            if (a < 0) mok = false;
            if (b < 0) dok = false;
            if (r > 0 && w[i] <= wmax && a < tm[i]) tm[i] = a;
            if (r > 0 && w[i] <= dmax && b < td[i]) td[i] = b;
        }
    p->curve.n = p->dcurve.n = 0;
    for (int i = 0; i < n; i++) {
        if (mok && w[i] <= wmax && tm[i] > 0) p->curve.w[p->curve.n] = w[i], p->curve.t[p->curve.n++] = (float)tm[i];
        if (dok && w[i] <= dmax && td[i] > 0)
            p->dcurve.w[p->dcurve.n] = w[i], p->dcurve.t[p->dcurve.n++] = (float)td[i];
    }
    if (p->curve.n && spec_curve_fix(&p->curve, NULL, 0) != 0) p->curve.n = 0;
    if (p->dcurve.n && spec_curve_fix(&p->dcurve, NULL, 0) != 0) p->dcurve.n = 0;
    if (mok && tm[0] < SPEC_CALIB_MIN_S) p->curve.n = p->dcurve.n = 0; /* too short to time under load */
    curve_bound(&p->curve);
    curve_bound(&p->dcurve);
    return mok && dok && tm[0] > 0 && tm[0] < 1e30 && td[0] < 1e30 ? (float)(td[0] / tm[0]) : -1.0f;
}

/* The cost model's price of a draft pass (spec.h): its time over the
 * model's, one token each, the least of five interleaved after a pass of
 * each that pages the weights in (so a pass the load slowed counts
 * little). Without a measurement, the ratio of the weights' bytes, which
 * a batch-1 pass reads once. At least 0.001. */
static float draft_calibrate(const spec_policy *p, spec_timer model, spec_timer draft) {
    double bytes = p->cfg.draft_bytes;
    double tm = 1e30, td = 1e30;
    for (int i = 0; i < 6; i++) {
        double a = model.pass(model.ctx), b = draft.pass(draft.ctx);
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
    if (!c->spec) return 0;
    int64_t cap = (int64_t)c->spec->max * c->max_seqs;
    if (cap > c->batch_tokens - 1) cap = c->batch_tokens - 1;
    if (cap > 64) cap = 64;
    return (int)cap;
}

int spec_policy_init(spec_policy *p, const spec_policy_config *c) {
    memset(p, 0, sizeof *p);
    p->cfg = *c;
    spec_guard_init(&p->guard);
    if (c->spec_cap > 0 && !(p->wants = lm_calloc((size_t)c->max_seqs, sizeof *p->wants))) return -1;
    return 0;
}

void spec_policy_free(spec_policy *p) {
    lm_free(p->wants);
    p->wants = NULL;
}

void spec_policy_setup(spec_policy *p, spec_timer model, spec_timer draft) {
    const spec_policy_config *c = &p->cfg;
    float ratio = -1;
    if (c->spec_cap > 0 && c->spec_cost >= 0) {                         /* the batch's width prices proposals */
        if (c->widths) spec_curve_parse(c->widths, &p->curve, NULL, 0); /* resolve_config checked it */
        else if (c->spec_cost == 0) ratio = curve_calibrate(p, model, draft);
        p->sizing = true;
        /* measured prices: the measured guard decides too (a set curve or a
         * flat price stays deterministic) */
        p->guard_on = !c->widths && c->spec_cost == 0 && p->curve.n > 0;
        spec_guard_init(&p->guard);
    }
    /* a draft's flat price: set, none, from the width curves' rounds, or timed */
    if (c->draft)
        p->draft_cost = c->spec_cost > 0 ? c->spec_cost
            : c->spec_cost < 0           ? 0
            : ratio > 0                  ? (ratio < 1e-3f ? 1e-3f : ratio)
                                         : draft_calibrate(p, model, draft);
}

void spec_policy_ctl_init(const spec_policy *p, spec_ctl *ctl) {
    spec_ctl_init(ctl);
    if (!p->cfg.draft) return;
    ctl->every_max = SPEC_PROBE_MAX_DRAFT; /* a draft's probe costs passes: back off */
    ctl->cost = p->draft_cost;
    if (p->draft_cost > 0) {
        ctl->acc = SPEC_ACC_START_DRAFT;
        ctl->every = ctl->every_min = SPEC_PROBE_FIRST_DRAFT;
    }
}

bool spec_policy_begin(spec_policy *p, const spec_view *run, int n_run, int n_waiting) {
    /* a draft model speculates only while nothing waits and the budget
     * holds every running sequence's pending tokens and full proposals */
    bool busy = n_waiting > 0;
    int64_t want = 0;
    p->step_spec = false;
    p->step_once = false;
    p->spec_off = false;
    p->n_want = 0;
    if (p->guard_on) {
        int width = 0;
        for (int i = 0; i < n_run; i++) width += run[i].n_tokens - run[i].n_computed == 1;
        p->spec_off = !spec_guard_allow(&p->guard, width);
    }
    for (int i = 0; p->cfg.draft && !busy && i < n_run; i++) {
        const spec_view *v = &run[i];
        int left = v->max_tokens - v->n_gen - 1;
        want += v->n_tokens - v->n_computed + (v->spec_k < left ? v->spec_k : left);
        busy = want > p->cfg.batch_tokens;
    }
    return busy;
}

/* Only a decode proposes (its prompt done, one token pending), and never
 * past what it may still generate (the last row's own token is always
 * taken) or past the context. */
int spec_policy_wish(spec_policy *p, const spec_view *v, spec_ctl *ctl, bool busy, bool *sync) {
    *sync = false;
    if (v->spec_k <= 0 || v->n_gen == 0 || v->n_tokens - v->n_computed != 1) return 0;
    int k = v->spec_k;
    if (k > v->max_tokens - v->n_gen - 1) k = v->max_tokens - v->n_gen - 1;
    if (k > p->cfg.n_ctx - v->n_tokens) k = p->cfg.n_ctx - v->n_tokens;
    if (k <= 0) return 0;
    *sync = p->cfg.draft;
    if (p->spec_off) return 0; /* the guard measured speculation losing at this width */
    /* the controller counts every step it is asked, proposal or not */
    if (!p->cfg.draft) return spec_ctl_want(ctl, k);
    if (busy) return 0; /* the draft's passes would delay waiting work */
    return spec_ctl_want(ctl, k);
}

int spec_policy_want(spec_policy *p, const spec_view *v, int wish) {
    if (wish <= 0 || p->n_want >= p->cfg.max_seqs) return -1;
    /* the draft's catch-up as a step pays it while the draft keeps in
     * step: the tokens since its KV ends, at most wish + 1 (the accepted
     * guesses and the target's own token); a longer gap (after plain
     * steps) is paid once. A start (no KV: the whole sequence the first
     * time, else a short window) is paid once too, so it is spread over the
     * steps the sequence may still take: under load, with many sequences
     * starting at once, the start is priced as it runs */
    int feed = 1;
    if (p->cfg.draft && v->d_kv) {
        feed = v->n_tokens - v->d_fed;
        if (feed > wish + 1) feed = wish + 1;
    } else if (p->cfg.draft) {
        int start = v->d_started ? DRAFT_RESTART_CTX : v->n_tokens;
        float per_step = 1.0f + v->ctl->acc * (float)wish; /* tokens a step yields, about */
        int steps = (int)((float)(v->max_tokens - v->n_gen) / per_step) + 1;
        feed = 1 + (start + steps - 1) / steps;
    }
    p->wants[p->n_want] = (spec_want){.acc = v->ctl->acc, .k_max = wish, .probe = v->ctl->probing != 0, .feed = feed};
    return p->n_want++;
}

/* Size the wishes of this iteration's speculating sequences at the
 * batch's width (spec.h): rows, the tokens the running sequences carry
 * without proposals (at most the budget), n_dec of them decodes. */
void spec_policy_size(spec_policy *p, int64_t rows, int n_dec) {
    int n = p->n_want;
    if (!p->sizing || n == 0) {
        for (int i = 0; i < n; i++) p->wants[i].k = p->wants[i].k_max;
        return;
    }
    if (rows > p->cfg.batch_tokens) rows = p->cfg.batch_tokens;
    spec_size_batch(p->wants, n, (int)rows, n_dec, &p->curve, p->cfg.draft ? p->draft_cost : 0,
                    p->dcurve.n ? &p->dcurve : NULL);
}

void spec_policy_made(spec_policy *p, bool spec, bool once) {
    p->step_spec |= spec;
    p->step_once = once;
}

void spec_policy_observe(spec_policy *p, spec_ctl *ctl, int proposed, int accepted) {
    (void)p;
    spec_ctl_update(ctl, proposed, accepted);
}

void spec_policy_record(spec_policy *p, int width, double seconds, int tokens) {
    /* a step that started a draft or caught it up after a gap pays a
     * one-off cost the sizing spreads: it says nothing of speculation's
     * steady price */
    if (p->guard_on && !p->step_once) spec_guard_record(&p->guard, width, p->step_spec, seconds, tokens);
}
