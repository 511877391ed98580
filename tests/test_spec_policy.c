/*
 * test_spec_policy.c - the speculation policy (sched/spec_sched.h) alone:
 * no model, no engine. Its prices come from made-up timers (a model pass
 * that reads its weights up to 8 rows, then pays 0.12 of a pass per row; a
 * draft pass a tenth of a one-row model pass per row), its sequences are
 * spec_views with controllers fed synthetic verdicts, and the decisions it
 * returns are checked:
 *   - the calibration: the curves it times from the timers (their shape,
 *     the draft's price about 0.1), the guard on for measured prices, and
 *     a set width curve taken as it is (no timing, no guard);
 *   - high acceptance and cheap guesses at batch 1: the full K;
 *   - shrinking under load: the same sequences proposing together get
 *     fewer guesses each as the batch widens, none at 16 on the
 *     compute-bound pass, and a draft stands aside while work waits or the
 *     budget cannot hold every sequence's proposals;
 *   - a guess that cannot pay for itself: a draft as costly as the model,
 *     or acceptance that fell to nothing, proposes nothing (but for the
 *     controller's rare probes, counted);
 *   - the bounds: nothing past max_tokens or the context, nothing for a
 *     prefill, and prompt lookup (free guesses) sized by the set curve;
 *   - the measured guard: speculating steps slower than plain ones turn
 *     speculation off at that width (spec_off).
 */
#include <math.h>
#include <string.h>

#include "decode/spec.h"
#include "sched/spec_sched.h"
#include "test.h"

#define PASS_S 0.010 /* the fake model's one-row pass */

static double model_rows(void *ctx, int n) {
    (void)ctx;
    double t = n <= 8 ? 1.0 + 0.01 * n : 1.08 + 0.12 * (n - 8);
    return PASS_S * t;
}
static double model_pass(void *ctx) { return model_rows(ctx, 1); }
static double draft_rows(void *ctx, int n) { return *(double *)ctx * n; }
static double draft_pass(void *ctx) { return *(double *)ctx; }

static spec_policy_config base_cfg(bool draft) {
    return (spec_policy_config){.max_seqs = 16,
                                .batch_tokens = 256,
                                .n_ctx = 1024,
                                .spec_cap = 64,
                                .draft = draft,
                                .spec_cost = 0,
                                .widths = NULL,
                                .draft_bytes = 0.1};
}

/* A policy over the fake timers; dpass: the draft's one-row seconds. */
static void policy_new(spec_policy *p, spec_policy_config c, double *dpass) {
    CHECK(spec_policy_init(p, &c) == 0);
    spec_timer m = {model_rows, model_pass, NULL};
    spec_timer d = {draft_rows, draft_pass, dpass};
    spec_policy_setup(p, m, c.draft ? d : (spec_timer){0});
}

/* The measured guard lets a width speculate once it timed plain steps
 * there: SPEC_GUARD_MIN of them at every width the tests use. */
static void warm_guard(spec_policy *p) {
    for (int w = 1; w <= 16; w++)
        for (int i = 0; i < SPEC_GUARD_MIN; i++) spec_policy_record(p, w, PASS_S, w);
}

/* A decoding sequence: 100 tokens, one pending, its draft in step. */
static spec_view seq_view(const spec_ctl *ctl, int spec_k) {
    return (spec_view){.n_tokens = 100,
                       .n_computed = 99,
                       .n_gen = 20,
                       .max_tokens = 200,
                       .spec_k = spec_k,
                       .ctl = ctl,
                       .d_kv = true,
                       .d_started = true,
                       .d_fed = 99};
}

/* Teach a controller `steps` verdicts of k proposed, `acc` accepted. */
static void teach(spec_policy *p, spec_ctl *ctl, int steps, int k, int acc) {
    for (int i = 0; i < steps; i++) spec_policy_observe(p, ctl, k, acc);
}

/* One iteration of n identical sequences: begin, wish, want, size. Returns
 * the guesses of sequence 0, *total their sum (-1000 when a wish did not
 * ask a draft to be brought in step first). */
static int iterate(spec_policy *p, spec_ctl *ctl, int n, int n_waiting, int *total) {
    spec_view v[16];
    *total = 0;
    for (int i = 0; i < n; i++) v[i] = seq_view(&ctl[i], 4);
    bool busy = spec_policy_begin(p, v, n, n_waiting);
    for (int i = 0; i < n; i++) {
        bool sync;
        int wish = spec_policy_wish(p, &v[i], &ctl[i], busy, &sync);
        if (sync != p->cfg.draft) *total = -1000; /* a draft is brought in step before any wish */
        spec_policy_want(p, &v[i], wish);
    }
    spec_policy_size(p, n, n);
    int bad = *total == -1000;
    *total = bad ? -1000 : 0;
    for (int i = 0; i < p->n_want && !bad; i++) *total += p->wants[i].k;
    return p->n_want ? p->wants[0].k : 0;
}

static void test_calibration(void) {
    double dpass = PASS_S * 0.1;
    spec_policy p;
    policy_new(&p, base_cfg(true), &dpass);
    CHECK(p.sizing && p.guard_on);
    CHECKF(fabsf(p.draft_cost - 0.1f / 1.01f) < 0.005f, "draft price %.4f", (double)p.draft_cost);
    /* the model's curve: 1, 2, 4, ... 64 rows, flat to 8, then 0.12 a row */
    CHECK(p.curve.n == 7 && p.curve.w[0] == 1 && p.curve.w[p.curve.n - 1] == 64);
    CHECKF(fabsf(spec_curve_at(&p.curve, 8) - 1.08f / 1.01f) < 0.01f, "t(8) %.3f", (double)spec_curve_at(&p.curve, 8));
    CHECKF(spec_curve_at(&p.curve, 64) > 7.0f, "t(64) %.3f", (double)spec_curve_at(&p.curve, 64));
    /* the draft's: linear in its rows, up to max_seqs */
    CHECK(p.dcurve.n > 0 && p.dcurve.w[p.dcurve.n - 1] == 16);
    CHECKF(fabsf(spec_curve_at(&p.dcurve, 16) - 16.0f) < 0.01f, "draft t(16) %.3f",
           (double)spec_curve_at(&p.dcurve, 16));
    spec_policy_free(&p);

    /* a set curve: taken as it is, deterministic (no guard) */
    spec_policy_config c = base_cfg(false);
    c.widths = "1:1,2:1.9,8:7.5";
    policy_new(&p, c, NULL);
    CHECK(p.sizing && !p.guard_on && p.curve.n == 3 && p.draft_cost == 0);
    spec_policy_free(&p);
    /* no sizing (spec_cost < 0): no curve, no price */
    c = base_cfg(true);
    c.spec_cost = -1;
    policy_new(&p, c, &dpass);
    CHECK(!p.sizing && !p.guard_on && p.draft_cost == 0);
    spec_policy_free(&p);
}

static void test_load(void) {
    double dpass = PASS_S * 0.1;
    spec_policy p;
    policy_new(&p, base_cfg(true), &dpass);
    warm_guard(&p);
    spec_ctl ctl[16];
    for (int i = 0; i < 16; i++) {
        spec_policy_ctl_init(&p, &ctl[i]);
        CHECK(ctl[i].cost == p.draft_cost && ctl[i].acc == SPEC_ACC_START_DRAFT);
        teach(&p, &ctl[i], 30, 4, 4); /* every guess accepted */
        CHECKF(ctl[i].acc > 0.95f, "acc %.3f", (double)ctl[i].acc);
    }
    int t1, t4, t8, t16;
    int k1 = iterate(&p, ctl, 1, 0, &t1);
    int k4 = iterate(&p, ctl, 4, 0, &t4);
    int k8 = iterate(&p, ctl, 8, 0, &t8);
    int k16 = iterate(&p, ctl, 16, 0, &t16);
    fprintf(stderr, "  guesses per sequence: 1 -> %d, 4 -> %d (%d), 8 -> %d (%d), 16 -> %d (%d)\n", k1, k4, t4, k8, t8,
            k16, t16);
    CHECK(k1 == 4 && t1 == 4);         /* cheap, always right, alone: all K */
    CHECK(t4 < 4 * 4 && t4 > 0);       /* the pass nears its knee: fewer each */
    CHECK(t8 * 4 < t4 * 8 || t8 == 0); /* fewer per sequence again */
    CHECK(t16 == 0 && k16 == 0);       /* compute-bound at 16: none pays */
    CHECK(p.n_want == 16);             /* they all wished: the sizing said no */
    /* work waiting: the draft stands aside (its passes would delay it) */
    CHECK(iterate(&p, ctl, 1, 1, &t1) == 0 && t1 == 0 && p.n_want == 0);
    /* the budget cannot hold every sequence's pending token and proposal */
    p.cfg.batch_tokens = 40;
    CHECK(iterate(&p, ctl, 16, 0, &t16) == 0 && p.n_want == 0);
    spec_policy_free(&p);
}

/* Proposals over `steps` iterations of one sequence. */
static int proposals(spec_policy *p, spec_ctl *ctl, int steps, bool verdict_none) {
    int sum = 0, t;
    for (int s = 0; s < steps; s++) {
        int k = iterate(p, ctl, 1, 0, &t);
        sum += t;
        if (k && verdict_none) spec_policy_observe(p, ctl, k, 0);
    }
    return sum;
}

static void test_no_pay(void) {
    /* a draft as slow as the model: a guess cannot pay for itself */
    double dpass = PASS_S * 1.0;
    spec_policy p;
    spec_ctl ctl;
    policy_new(&p, base_cfg(true), &dpass);
    warm_guard(&p);
    CHECKF(p.draft_cost > 0.9f, "draft price %.3f", (double)p.draft_cost);
    spec_policy_ctl_init(&p, &ctl);
    teach(&p, &ctl, 30, 4, 4);
    int n = proposals(&p, &ctl, 50, false);
    CHECKF(n == 0, "%d guesses from a draft that costs a pass", n);
    spec_policy_free(&p);

    /* a cheap draft that is never right: after its estimate falls, only
     * probes (one guess, rarer and rarer) */
    dpass = PASS_S * 0.1;
    policy_new(&p, base_cfg(true), &dpass);
    warm_guard(&p);
    spec_policy_ctl_init(&p, &ctl);
    int early = proposals(&p, &ctl, 20, true);
    CHECK(early > 0); /* it tried while its estimate was high */
    n = proposals(&p, &ctl, 400, true);
    CHECKF(n <= 400 / SPEC_PROBE_FIRST_DRAFT + 1, "%d guesses in 400 steps at acceptance 0", n);
    CHECKF(ctl.acc < 0.2f, "acc %.3f", (double)ctl.acc);
    spec_policy_free(&p);
}

static void test_bounds(void) {
    spec_policy p;
    spec_ctl ctl;
    spec_policy_config c = base_cfg(false);
    c.spec_cost = -1; /* no sizing: the wish is the decision */
    policy_new(&p, c, NULL);
    spec_policy_ctl_init(&p, &ctl);
    CHECK(ctl.cost == 0 && ctl.every == SPEC_PROBE_EVERY);
    teach(&p, &ctl, 30, 4, 4);
    spec_view v = seq_view(&ctl, 4);
    bool sync, busy = spec_policy_begin(&p, &v, 1, 3);
    CHECK(busy); /* work waits, but prompt lookup's guesses are free: they go on */
    CHECK(spec_policy_wish(&p, &v, &ctl, busy, &sync) == 4 && !sync);
    v.max_tokens = v.n_gen + 3; /* two tokens left to propose past the pending one's */
    CHECK(spec_policy_wish(&p, &v, &ctl, busy, &sync) == 2);
    v = seq_view(&ctl, 4);
    v.n_tokens = c.n_ctx - 1; /* the context holds one more */
    v.n_computed = v.n_tokens - 1;
    CHECK(spec_policy_wish(&p, &v, &ctl, busy, &sync) == 1);
    v = seq_view(&ctl, 4);
    v.n_computed = 50; /* a prefill chunk: no proposal */
    CHECK(spec_policy_wish(&p, &v, &ctl, busy, &sync) == 0);
    v = seq_view(&ctl, 0); /* the request turned it off */
    CHECK(spec_policy_wish(&p, &v, &ctl, busy, &sync) == 0);
    /* a wish of 0 is not queued */
    CHECK(spec_policy_want(&p, &v, 0) == -1 && p.n_want == 0);
    spec_policy_free(&p);

    /* prompt lookup on a steep set curve: even one sequence stops; on a
     * flat one it keeps what it found */
    c = base_cfg(false);
    c.widths = "1:1,2:1.9,8:7.5";
    policy_new(&p, c, NULL);
    spec_policy_ctl_init(&p, &ctl);
    v = seq_view(&ctl, 4);
    spec_policy_begin(&p, &v, 1, 0);
    CHECK(spec_policy_want(&p, &v, 3) == 0);
    spec_policy_size(&p, 1, 1);
    CHECK(p.wants[0].k == 0);
    spec_policy_free(&p);
    c.widths = "1:1,64:1.01";
    policy_new(&p, c, NULL);
    spec_policy_begin(&p, &v, 1, 0);
    CHECK(spec_policy_want(&p, &v, 3) == 0);
    spec_policy_size(&p, 1, 1);
    CHECK(p.wants[0].k == 3);
    spec_policy_free(&p);
}

static void test_guard(void) {
    double dpass = PASS_S * 0.1;
    spec_policy p;
    spec_ctl ctl;
    policy_new(&p, base_cfg(true), &dpass);
    CHECK(p.guard_on);
    spec_policy_ctl_init(&p, &ctl);
    /* at width 1: plain steps at 10 ms a token, speculating ones at 20 */
    bool off = false, spoke = false;
    int plain = 0;
    for (int s = 0; s < 40 && !off; s++) {
        spec_view v = seq_view(&ctl, 4);
        spec_policy_begin(&p, &v, 1, 0);
        off = spoke && p.spec_off; /* it speculated, then stopped */
        bool sync;
        int k = spec_policy_wish(&p, &v, &ctl, false, &sync);
        if (!spoke) plain += k == 0;
        spoke |= k > 0;
        spec_policy_made(&p, k > 0, false);
        spec_policy_record(&p, 1, k > 0 ? 0.040 : 0.010, k > 0 ? 2 : 1);
    }
    CHECKF(plain >= SPEC_GUARD_MIN, "%d plain steps first", plain); /* no speculation before plain timings */
    CHECK(off); /* the guard measured speculation losing: the policy keeps the step plain */
    spec_view v = seq_view(&ctl, 4);
    bool sync;
    CHECK(spec_policy_wish(&p, &v, &ctl, false, &sync) == 0 && sync); /* still brought in step */
    spec_policy_free(&p);
}

int main(void) {
    TEST_RUN(test_calibration);
    TEST_RUN(test_load);
    TEST_RUN(test_no_pay);
    TEST_RUN(test_bounds);
    TEST_RUN(test_guard);
    return TEST_DONE();
}
