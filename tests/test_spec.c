/*
 * test_spec.c - speculative decoding (decode/spec.h, sampler_sample_spec,
 * the engine's verification):
 *   - the KV pattern of speculation (append a token and k proposals,
 *     truncate back to the accepted length) on sequences sharing prefix-cached
 *     blocks and a forked partial block: pool invariants after every step,
 *     every verified position holds its own sequence's data, the prefix
 *     cache still serves the prompt's data, no block leaks;
 *   - the prompt-lookup proposer on hand-made sequences, and the controller
 *     that sizes proposals (full K at high acceptance; at low acceptance one
 *     proposed token in SPEC_PROBE_EVERY steps at most);
 *   - the measured guard (spec_guard) at set timings: a losing proposer
 *     (even 2% slower) is switched off after SPEC_GUARD_MIN steps and its
 *     steps cost at most 5% over plain decoding, probing resumes after
 *     SPEC_GUARD_OFF_MIN steps; a winning one stays on (but for the plain
 *     refresh steps); one that starts winning is taken up again; widths are
 *     judged apart;
 *   - the width curve (parsing, bad curves refused, interpolation) and the
 *     batch's sizing at set prices (spec_size_batch): one sequence on a
 *     flat curve gets the one-sequence cost model's k; a cheap draft at
 *     batch 1 proposes K; a wide compute-bound pass shrinks the proposals
 *     to one each, or none; probes are kept; and in the engine, all
 *     requests together at a set steep curve propose under half of what a
 *     flat one does, with output identical to the plain engine's; a
 *     draft's catch-up rows widen its first pass's price;
 *   - the rejection scheme's output distribution equals the target's exact
 *     distribution (sampler_dist) by a chi-square test at significance 1e-6,
 *     for point-mass and spread drafts that differ from the target, under
 *     every transform (bias, penalties, top-k, top-p, min-p, temperature), on
 *     a small vocabulary and on a stories260K logits row (vocabulary 512);
 *   - greedy identity in the engine: with prompt lookup on, every request's
 *     tokens, text and finish reason equal the plain engine's, for many
 *     prompts (copy-heavy and random), alone, all together, under a budget
 *     of 8 tokens per iteration, in a pool small enough to preempt, with
 *     stop strings, max_tokens from 1 to 60, n = 3 forks, grammars, and again
 *     from the prefix cache; on the bundled model and on a sliding-window
 *     variant of it (swa_model.h), whose truncations must keep the window's
 *     blocks; speculation must actually have accepted tokens,
 *     and engine_check (pool invariants, no leaked block, exact plan
 *     accounting) passes after each run;
 *   - sampled requests: a seed reproduces the output, and the engine's
 *     second token (verified against a proposal) follows the target's exact
 *     conditional distribution (chi-square, significance 1e-6).
 * Under AddressSanitizer (LAMINA_ASAN) and under instruction-set emulation
 * (LAMINA_EMULATED, `make test-arm`) the sample counts are a third.
 */
#include <math.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "base/pool.h"
#include "base/util.h"
#include "decode/sample.h"
#include "decode/spec.h"
#include "format/quantize.h"
#include "kernels/kernels.h"
#include "model/forward.h"
#include "model/model.h"
#include "sched/engine.h"
#include "sched/sched.h"
#include "swa_model.h"
#include "chi2.h"
#include "spec_collect.h"
#include "engine_test.h"
#include "test.h"

static lm_model *model;
static lm_pool *ref_pool;
static long scale = 1; /* sample counts are divided by 3 under LAMINA_ASAN and LAMINA_EMULATED */

/* ---- proposer and controller ------------------------------------------------ */

static void test_ngram(void) {
    int32_t out[8];
    /* the suffix "1 2 3" occurred at 0: propose what followed */
    int32_t a[] = {1, 2, 3, 4, 5, 6, 9, 1, 2, 3};
    CHECK(spec_ngram_propose(a, 10, 4, out) == 4);
    CHECK(out[0] == 4 && out[1] == 5 && out[2] == 6 && out[3] == 9);
    /* k bounds it */
    CHECK(spec_ngram_propose(a, 10, 2, out) == 2 && out[1] == 5);
    /* past the end of the sequence the copy repeats with the match's period */
    CHECK(spec_ngram_propose(a, 10, 8, out) == 8);
    CHECK(out[3] == 9 && out[4] == 1 && out[5] == 2 && out[6] == 3 && out[7] == 4);
    /* the most recent occurrence wins */
    int32_t b[] = {7, 8, 1, 7, 8, 2, 7, 8};
    CHECK(spec_ngram_propose(b, 8, 3, out) == 3 && out[0] == 2 && out[1] == 7 && out[2] == 8);
    CHECK(spec_ngram_propose(b, 8, 5, out) == 5 && out[3] == 2 && out[4] == 7);
    /* the longest suffix wins over a more recent shorter one */
    int32_t c[] = {5, 6, 7, 40, 41, 9, 7, 50, 5, 6, 7};
    CHECK(spec_ngram_propose(c, 11, 2, out) == 2 && out[0] == 40 && out[1] == 41);
    /* overlap: a run proposes its continuation */
    int32_t d[] = {3, 3, 3, 3};
    CHECK(spec_ngram_propose(d, 4, 5, out) == 5 && out[0] == 3 && out[4] == 3);
    /* no match, too short, k 0 */
    int32_t e[] = {1, 2, 3, 4};
    CHECK(spec_ngram_propose(e, 4, 4, out) == 0);
    CHECK(spec_ngram_propose(e, 1, 4, out) == 0);
    CHECK(spec_ngram_propose(a, 10, 0, out) == 0);
    /* a match just before the suffix: period 2 */
    int32_t f[] = {9, 8, 9};
    CHECK(spec_ngram_propose(f, 3, 4, out) == 4 && out[0] == 8 && out[1] == 9 && out[2] == 8 && out[3] == 9);
    CHECK(spec_ngram_propose(f, 3, 1, out) == 1 && out[0] == 8);
}

static void test_controller(void) {
    spec_ctl c;
    spec_ctl_init(&c);
    CHECK(spec_ctl_want(&c, 8) > 0);
    for (int i = 0; i < 50; i++) spec_ctl_update(&c, 8, 8);
    CHECK(spec_ctl_want(&c, 8) == 8);
    CHECK(spec_ctl_want(&c, 3) == 3);
    /* nothing accepted: speculation fades to one token every SPEC_PROBE_EVERY steps */
    int proposed = 0, steps = 1000;
    for (int i = 0; i < 30; i++) spec_ctl_update(&c, 4, 0);
    for (int i = 0; i < steps; i++) {
        int k = spec_ctl_want(&c, 8);
        proposed += k;
        if (k) spec_ctl_update(&c, k, 0);
    }
    CHECKF(proposed <= steps / SPEC_PROBE_EVERY + 1, "%d tokens proposed in %d steps", proposed, steps);
    CHECK(proposed >= steps / SPEC_PROBE_EVERY - 1);
    /* and recovers when proposals start to be accepted */
    for (int i = 0; i < 200 && spec_ctl_want(&c, 8) < 4; i++) spec_ctl_update(&c, 1, 1);
    CHECK(spec_ctl_want(&c, 8) >= 4);
}

/* ---- the measured guard ----------------------------------------------------- */

/* Steps of `width` decodes each emitting one token (a speculating step
 * emits more per unit of time or less, per_spec against per_plain seconds
 * per token), the guard deciding each: how many speculated, and the time
 * spent. */
static int guard_run(spec_guard *g, int width, int steps, double per_plain, double per_spec, double *time) {
    int n_spec = 0;
    for (int i = 0; i < steps; i++) {
        bool on = spec_guard_allow(g, width);
        double t = (on ? per_spec : per_plain) * width;
        spec_guard_record(g, width, on, t, width);
        n_spec += on;
        if (time) *time += t;
    }
    return n_spec;
}

/* A losing proposer is switched off and kept within 5% of plain decoding;
 * it is tried again after SPEC_GUARD_OFF_MIN steps (probing resumes), the
 * interval doubling while it keeps losing; a winning one stays on but for
 * one plain step in SPEC_GUARD_REFRESH + 1; one that starts winning is
 * taken up again; widths are judged apart. */
static void test_guard(void) {
    CHECK(spec_guard_bucket(1) == 0 && spec_guard_bucket(2) == 1 && spec_guard_bucket(3) == 2);
    CHECK(spec_guard_bucket(8) == 3 && spec_guard_bucket(9) == 4 &&
          spec_guard_bucket(1 << 20) == SPEC_GUARD_BUCKETS - 1);
    spec_guard g;
    /* losing: 15 ms per token against 10 */
    spec_guard_init(&g);
    int first_on = -1, first_off = -1, back_on = -1;
    for (int i = 0; i < 200; i++) {
        bool on = spec_guard_allow(&g, 8);
        if (on && first_on < 0) first_on = i;
        if (!on && first_on >= 0 && first_off < 0) first_off = i;
        if (on && first_off >= 0 && back_on < 0) back_on = i;
        spec_guard_record(&g, 8, on, (on ? 0.015 : 0.010) * 8, 8);
    }
    CHECKF(first_on == SPEC_GUARD_MIN, "first speculating step %d", first_on);
    CHECKF(first_off == first_on + SPEC_GUARD_MIN, "switched off at step %d", first_off);
    CHECKF(back_on >= first_off + SPEC_GUARD_OFF_MIN - 1 && back_on <= first_off + SPEC_GUARD_OFF_MIN + 1,
           "probing resumed at step %d (off at %d)", back_on, first_off);
    double t_lose = 0;
    spec_guard_init(&g);
    int n = guard_run(&g, 8, 4000, 0.010, 0.015, &t_lose);
    double t_plain = 4000 * 8 * 0.010;
    CHECKF(t_lose <= 1.05 * t_plain, "losing proposer: %.2f s against %.2f s plain", t_lose, t_plain);
    CHECKF(n > 0 && n < 4000 / 50, "losing proposer: %d of 4000 steps speculated", n);
    /* slightly losing (2%) is switched off too */
    spec_guard_init(&g);
    n = guard_run(&g, 8, 2000, 0.010, 0.0102, NULL);
    CHECKF(n < 2000 / 20, "2%% slower: %d of 2000 steps speculated", n);
    /* winning: 6 ms per token */
    double t_win = 0;
    spec_guard_init(&g);
    n = guard_run(&g, 8, 4000, 0.010, 0.006, &t_win);
    CHECKF(n >= 4000 - 4000 / SPEC_GUARD_REFRESH - SPEC_GUARD_MIN - 2, "winning proposer: %d of 4000 steps", n);
    CHECKF(t_win < 0.65 * t_plain, "winning proposer: %.2f s against %.2f s plain", t_win, t_plain);
    /* losing for 100 steps, then winning: taken up again */
    spec_guard_init(&g);
    guard_run(&g, 8, 100, 0.010, 0.015, NULL);
    guard_run(&g, 8, 300, 0.010, 0.006, NULL);
    n = guard_run(&g, 8, 600, 0.010, 0.006, NULL);
    CHECKF(n >= 600 * 9 / 10, "after it started winning: %d of 600 steps", n);
    /* widths apart: losing at 8 sequences, winning alone */
    spec_guard_init(&g);
    int on1 = 0, on8 = 0;
    for (int i = 0; i < 1000; i++) {
        on8 += guard_run(&g, 8, 1, 0.010, 0.015, NULL);
        on1 += guard_run(&g, 1, 1, 0.020, 0.012, NULL);
    }
    CHECKF(on1 >= 1000 - 1000 / SPEC_GUARD_REFRESH - SPEC_GUARD_MIN - 2, "alone: %d of 1000", on1);
    CHECKF(on8 < 1000 / 20, "at 8: %d of 1000", on8);
    /* steps without tokens or with a bad time do not count */
    spec_guard_init(&g);
    spec_guard_record(&g, 8, false, 0.1, 0);
    spec_guard_record(&g, 8, false, NAN, 8);
    CHECK(g.b[3].n_plain == 0);
}

/* ---- the scheduler's share for proposals --------------------------------------- */

/* Proposals take what the budget, the cap and the blocks leave after the
 * decodes, best first, the last one shrunk; none preempts; a prefill chunk
 * keeps its share. */
/* The width curve: parsing, errors, interpolation and extrapolation. */
static void test_width_curve(void) {
    char err[LM_ERRLEN];
    spec_curve c;
    CHECKF(spec_curve_parse("8:2.4,1:2,32:9.2", &c, err, sizeof err) == 0, "%s", err);
    CHECK(c.n == 3 && c.w[0] == 1 && c.w[1] == 8 && c.w[2] == 32);
    CHECK(fabsf(spec_curve_at(&c, 1) - 1.0f) < 1e-6f); /* relative to the one-row time, 2 */
    CHECK(fabsf(spec_curve_at(&c, 0) - 1.0f) < 1e-6f);
    CHECK(fabsf(spec_curve_at(&c, 8) - 1.2f) < 1e-5f);
    CHECK(fabsf(spec_curve_at(&c, 20) - (1.2f + 3.4f * 12.0f / 24.0f)) < 1e-5f);
    CHECK(fabsf(spec_curve_at(&c, 64) - (4.6f + 3.4f * 32.0f / 24.0f)) < 1e-4f); /* past the last point */
    CHECK(fabsf(spec_curve_at(&c, 4) - (1.0f + 0.2f * 3.0f / 7.0f)) < 1e-5f);
    /* a time below a narrower one's is raised to it; repeated widths keep the least */
    CHECK(spec_curve_parse("1:1,4:0.5,8:3,8:2", &c, err, sizeof err) == 0);
    CHECK(c.n == 3 && c.t[1] == 1.0f && c.t[2] == 2.0f);
    /* no curve: the flat one-sequence price */
    spec_curve flat = {0};
    CHECK(fabsf(spec_curve_at(&flat, 5) - (1.0f + 4 * SPEC_ROW_COST)) < 1e-6f);
    const char *bad[] = {"", "2:1", "1:0", "1:-1", "1:x", "x", "1:1,", "1:1;2:2", "0:1", "1:1,4"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        CHECKF(spec_curve_parse(bad[i], &c, err, sizeof err) != 0 && err[0], "'%s' parsed", bad[i]);
    }
}

/* Sizing at set prices: one sequence on a flat curve proposes what the
 * one-sequence cost model says; a wide compute-bound pass shrinks, then
 * stops, the batch's proposals; probes are kept. */
static void test_width_sizing(void) {
    spec_curve flat = {0}, mild, wide, steep;
    CHECK(spec_curve_parse("1:1,4:1.1,8:1.2,16:3", &mild, NULL, 0) == 0);
    CHECK(spec_curve_parse("1:1,8:1.3,16:2.4,32:4.6", &wide, NULL, 0) == 0);
    CHECK(spec_curve_parse("1:1,2:1.9,8:7.5", &steep, NULL, 0) == 0);
    /* batch 1, a cheap draft, a pass bound by reading the weights: all K */
    spec_want w[8];
    w[0] = (spec_want){.acc = 0.9f, .k_max = 4};
    CHECK(spec_size_batch(w, 1, 1, 1, &mild, 0.1f, NULL) == 4 && w[0].k == 4);
    CHECK(spec_size_batch(w, 1, 1, 1, &flat, 0.1f, NULL) == 4);
    CHECK(spec_size_batch(w, 1, 1, 1, &mild, 0, NULL) == 4); /* prompt lookup */
    /* one sequence on the flat curve: the k of the one-sequence model (spec_gain) */
    const float accs[] = {0.2f, 0.4f, 0.55f, 0.7f, 0.85f, 0.95f}, costs[] = {0.05f, 0.2f, 0.35f, 0.6f};
    for (int a = 0; a < 6; a++)
        for (int c = 0; c < 4; c++) {
            int want = 0;
            float best = 1.0f + SPEC_MIN_GAIN;
            for (int k = 1; k <= 4; k++)
                if (spec_gain(accs[a], k, costs[c]) > best) best = spec_gain(accs[a], k, costs[c]), want = k;
            w[0] = (spec_want){.acc = accs[a], .k_max = 4};
            int got = spec_size_batch(w, 1, 1, 1, &flat, costs[c], NULL);
            CHECKF(got == want, "acc %.2f cost %.2f: %d, the one-sequence model %d", (double)accs[a], (double)costs[c],
                   got, want);
        }
    /* eight sequences at acceptance 0.9 on the wide curve: a draft's guesses
     * (its pass 0.3 of the model's) would cost more than they give: none */
    for (int i = 0; i < 8; i++) w[i] = (spec_want){.acc = 0.9f, .k_max = 3};
    CHECK(spec_size_batch(w, 8, 8, 8, &wide, 0.3f, NULL) == 0);
    for (int i = 0; i < 8; i++) CHECK(w[i].k == 0);
    /* the same alone: it guesses */
    CHECK(spec_size_batch(w, 1, 1, 1, &wide, 0.3f, NULL) > 0);
    /* four sequences on the mild curve (prompt lookup): the first guesses
     * fit under the knee at 8 rows, the rest not: one each */
    for (int i = 0; i < 4; i++) w[i] = (spec_want){.acc = 0.9f, .k_max = 4};
    CHECK(spec_size_batch(w, 4, 4, 4, &mild, 0, NULL) == 4);
    for (int i = 0; i < 4; i++) CHECK(w[i].k == 1);
    /* the likeliest guesses go first: at 0.95 and 0.5 the first gets more */
    w[0] = (spec_want){.acc = 0.95f, .k_max = 4};
    w[1] = (spec_want){.acc = 0.5f, .k_max = 4};
    spec_size_batch(w, 2, 2, 2, &mild, 0, NULL);
    CHECK(w[0].k >= w[1].k && w[0].k > 0);
    /* a steep curve: even one sequence stops; a probe is kept as it is */
    w[0] = (spec_want){.acc = 0.5f, .k_max = 4};
    CHECK(spec_size_batch(w, 1, 1, 1, &steep, 0, NULL) == 0);
    w[1] = (spec_want){.acc = 0.1f, .k_max = 1, .probe = true};
    CHECK(spec_size_batch(w, 2, 2, 2, &steep, 0, NULL) == 1 && w[0].k == 0 && w[1].k == 1);
    /* eight on the mild curve: past the knee even one guess each loses */
    for (int i = 0; i < 8; i++) w[i] = (spec_want){.acc = 0.9f, .k_max = 4};
    CHECK(spec_size_batch(w, 8, 8, 8, &mild, 0, NULL) == 0);
    /* on the wide curve's flat part one decode guesses fully, alone or
     * beside 3 prefill rows */
    w[0] = (spec_want){.acc = 0.9f, .k_max = 4};
    CHECK(spec_size_batch(w, 1, 1, 1, &wide, 0, NULL) == 4 && spec_size_batch(w, 1, 4, 1, &wide, 0, NULL) == 4);
    /* a draft's catch-up rows widen its first pass: four sequences that
     * feed one row each guess, the same feeding four rows each do not
     * (a draft pass linear in its rows, a tenth of the model's per row) */
    spec_curve knee, dlin;
    CHECK(spec_curve_parse("1:1,8:1.05,16:2", &knee, NULL, 0) == 0);
    CHECK(spec_curve_parse("1:1,16:16", &dlin, NULL, 0) == 0);
    for (int i = 0; i < 4; i++) w[i] = (spec_want){.acc = 0.9f, .k_max = 1, .feed = 1};
    CHECK(spec_size_batch(w, 4, 4, 4, &knee, 0.1f, &dlin) == 4);
    for (int i = 0; i < 4; i++) w[i] = (spec_want){.acc = 0.9f, .k_max = 1, .feed = 4};
    CHECK(spec_size_batch(w, 4, 4, 4, &knee, 0.1f, &dlin) == 0);
    for (int i = 0; i < 4; i++) w[i] = (spec_want){.acc = 0.9f, .k_max = 1, .feed = 0}; /* < 1 counts as 1 */
    CHECK(spec_size_batch(w, 4, 4, 4, &knee, 0.1f, &dlin) == 4);
    /* deterministic */
    for (int i = 0; i < 8; i++) w[i] = (spec_want){.acc = 0.5f + 0.05f * (float)i, .k_max = 4};
    spec_want v[8];
    memcpy(v, w, sizeof v);
    int t1 = spec_size_batch(w, 8, 8, 8, &mild, 0.05f, &mild), t2 = spec_size_batch(v, 8, 8, 8, &mild, 0.05f, &mild);
    CHECK(t1 == t2 && memcmp(w, v, sizeof v) == 0);
}

static void test_sched_spec(void) {
    sched_config sc = {.batch_tokens = 12, .max_seqs = 4, .block_size = 4, .n_class = 1, .spec_cap = 8};
    sched *s = sched_new(&sc);
    CHECK(s);
    sched_seq q[3];
    memset(q, 0, sizeof q);
    for (int i = 0; i < 3; i++) {
        q[i].priority = i;
        q[i].arrival = (uint64_t)i;
        q[i].shared[0] = q[i].shared[1] = -1;
        CHECK(sched_start(s, &q[i]));
    }
    /* two decodes at a block boundary proposing 6 each, one prefill of 2 */
    q[0].n_pending = 1, q[0].len = 4, q[0].n_spec = 6;
    q[1].n_pending = 1, q[1].len = 8, q[1].n_spec = 6;
    q[2].n_pending = 2, q[2].len = 4, q[2].n_spec = 0;
    sched_view v = {.avail = {4, 0}};
    sched_begin(s);
    const sched_plan *p = sched_decide(s, &v);
    CHECK(!p->ask && p->n_preempt == 0 && p->n_run == 3 && p->n_tokens == 12);
    /* decodes 1 + 1 and the prefill's 2 take 3 blocks; q0 gets 6 more tokens
     * (one more block), q1 the 2 the budget has left (none more) */
    int n[3] = {0, 0, 0};
    for (int i = 0; i < p->n_run; i++) n[p->run[i].seq - q] = p->run[i].n;
    CHECKF(n[0] == 7 && n[1] == 3 && n[2] == 2, "%d %d %d", n[0], n[1], n[2]);
    /* no block left after the decodes and the prefill: proposals shrink to
     * what the blocks the decodes took still hold (3 positions each) */
    v.avail[0] = 3;
    sched_begin(s);
    p = sched_decide(s, &v);
    for (int i = 0; i < p->n_run; i++) n[p->run[i].seq - q] = p->run[i].n;
    CHECKF(n[0] == 4 && n[1] == 4 && n[2] == 2 && p->n_preempt == 0, "%d %d %d", n[0], n[1], n[2]);
    /* fewer blocks than the decodes need: the worst is preempted for them, as
     * without speculation, and no proposal is what preempts */
    v.avail[0] = 2;
    sched_begin(s);
    while ((p = sched_decide(s, &v))->ask) {
        int64_t fr[KV_N_CLASS] = {1, 0};
        sched_answer_frees(s, p->ask, fr);
    }
    CHECK(p->n_preempt == 1 && p->preempt[0] == &q[2]);
    /* the cap bounds the total */
    v.avail[0] = 100;
    sc.batch_tokens = 64;
    sched_free(s);
    s = sched_new(&sc);
    for (int i = 0; i < 3; i++) CHECK(sched_start(s, &q[i]));
    sched_begin(s);
    p = sched_decide(s, &v);
    CHECK(p->n_tokens == 1 + 1 + 2 + 8);
    sched_free(s);
}

/* ---- KV truncation of rejected proposals --------------------------------------- */

/* The key row at position pos of s in layer 0, head 0 (F32 pool). */
static float kv_key_at(kv_pool *p, const kv_seq *s, int pos) {
    const kv_layout *l = kv_pool_layout(p);
    int32_t b = kv_seq_blocks(s)[pos / l->block_size];
    const float *row = (const float *)kv_row(l, b, kv_slab_offset(l, 0, 0, 0), pos % l->block_size);
    return row[0];
}

/* Write positions [from, to) of s with value(tag, pos) in every element. */
static void kv_fill(kv_pool *p, kv_seq *s, int from, int to, int tag) {
    float kv[8];
    for (int pos = from; pos < to; pos++) {
        for (int i = 0; i < 8; i++) kv[i] = (float)(tag * 1000 + pos);
        kv_store(p, s, 0, pos, kv, kv);
    }
}

/* Speculation's pattern on the pool: sequences (a prompt's prefix-cached
 * blocks, forks sharing a partial block) append a pending token and k
 * proposals, then truncate back to the accepted length, many times at
 * random. After every step the pool's invariants hold, every verified
 * position still holds what its own sequence wrote (never a sibling's or a
 * rejected proposal's), and the prefix cache still serves blocks with the
 * prompt's data; at the end no block is held. */
static void test_kv_truncate_pattern(void) {
    char err[LM_ERRLEN];
    kv_config c;
    kv_config_init(&c, 1, 1, 8);
    c.type = LM_TYPE_F32;
    c.block_size = 4;
    c.n_ctx = 256;
    c.n_seqs = 6;
    kv_pool *p = kv_pool_new(&c, err, sizeof err);
    CHECK(p);
    int32_t prompt[18];
    for (int i = 0; i < 18; i++) prompt[i] = 100 + i;
    /* the prompt, computed once and committed to the prefix cache */
    kv_seq *first = kv_seq_new(p, err, sizeof err);
    CHECK(kv_append(p, first, 18, err, sizeof err) == KV_OK);
    kv_fill(p, first, 0, 18, 0);
    kv_prefix_commit(p, first, prompt, 18, 0);
    kv_seq_free(p, first);
    /* three sequences from the cache, the third forked from the second */
    kv_seq *s[3];
    int len[3];
    for (int i = 0; i < 2; i++) {
        s[i] = kv_seq_new(p, err, sizeof err);
        int got = kv_prefix_match(p, s[i], prompt, 18, 0);
        CHECK(got == 16);
        CHECK(kv_append(p, s[i], 2, err, sizeof err) == KV_OK);
        kv_fill(p, s[i], 16, 18, 0);
        len[i] = 18;
    }
    CHECK((s[2] = kv_fork(p, s[1], err, sizeof err)));
    len[2] = 18;
    lm_rng r;
    lm_rng_seed(&r, 11);
    for (int step = 0; step < 400; step++) {
        int i = (int)(lm_rng_u64(&r) % 3);
        int k = (int)(lm_rng_u64(&r) % 7); /* proposals */
        int acc = (int)(lm_rng_u64(&r) % (unsigned)(k + 1));
        if (len[i] + 1 + k > 250) continue;
        CHECK(kv_append(p, s[i], 1 + k, err, sizeof err) == KV_OK);
        /* verified positions get this sequence's value, rejected ones garbage */
        kv_fill(p, s[i], len[i], len[i] + 1 + acc, 1 + i);
        kv_fill(p, s[i], len[i] + 1 + acc, len[i] + 1 + k, 99);
        CHECK(kv_truncate(p, s[i], len[i] + 1 + acc, err, sizeof err) == KV_OK);
        len[i] += 1 + acc;
        CHECKF(kv_pool_check(p, err, sizeof err) == KV_OK, "%s", err);
        for (int j = 0; j < 3; j++) {
            CHECK(kv_seq_len(s[j]) == len[j]);
            for (int pos = 0; pos < len[j]; pos++) {
                float want = pos < 18 ? (float)pos : (float)((1 + j) * 1000 + pos);
                CHECKF(kv_key_at(p, s[j], pos) == want, "sequence %d position %d holds %g, not %g", j, pos,
                       kv_key_at(p, s[j], pos), want);
            }
        }
    }
    /* the cache still serves the prompt's blocks with the prompt's data */
    kv_seq *late = kv_seq_new(p, err, sizeof err);
    CHECK(kv_prefix_match(p, late, prompt, 18, 0) == 16);
    for (int pos = 0; pos < 16; pos++) CHECK(kv_key_at(p, late, pos) == (float)pos);
    kv_seq_free(p, late);
    for (int j = 0; j < 3; j++) kv_seq_free(p, s[j]);
    kv_stats st;
    kv_stats_get(p, &st);
    CHECK(st.n_used == 0 && st.n_seqs == 0);
    CHECKF(kv_pool_check(p, err, sizeof err) == KV_OK, "%s", err);
    kv_pool_free(p);
}

/* ---- the rejection scheme's distribution ------------------------------------ */

/* Draw n tokens by sampler_sample_spec from logits with draft tokens drawn
 * from q (NULL: always `point`), and compare them with the exact p. */
static void spec_dist_case(const lm_sample_params *sp, const float *logits, int V, const float *q, int32_t point,
                           const int32_t *hist, int n_hist, long n, const char *what, int *fails) {
    lm_sampler *s = sampler_new(sp, V), *ref = sampler_new(sp, V);
    float *row = lm_malloc((size_t)V * sizeof *row);
    int32_t *ids = lm_malloc((size_t)V * sizeof *ids);
    float *probs = lm_malloc((size_t)V * sizeof *probs);
    double *p = lm_calloc((size_t)V, sizeof *p);
    long *counts = lm_calloc((size_t)V, sizeof *counts);
    for (int i = 0; i < n_hist; i++) sampler_accept(s, hist[i]), sampler_accept(ref, hist[i]);
    sampler_set_bias(s, 1, 1.5f), sampler_set_bias(ref, 1, 1.5f);
    memcpy(row, logits, (size_t)V * sizeof *row);
    int32_t m = sampler_dist(ref, row, ids, probs);
    for (int i = 0; i < m; i++) p[ids[i]] = probs[i];
    lm_rng r;
    lm_rng_seed(&r, 99);
    long accepted = 0;
    for (long k = 0; k < n; k++) {
        int32_t draft = point;
        if (q) { /* a draw from q */
            double u = lm_rng_uniform(&r), cum = 0;
            draft = V - 1;
            for (int i = 0; i < V; i++)
                if (u < (cum += q[i])) {
                    draft = i;
                    break;
                }
        }
        memcpy(row, logits, (size_t)V * sizeof *row);
        bool acc;
        int32_t t = sampler_sample_spec(s, row, draft, q, &acc);
        if (t < 0 || t >= V) {
            (*fails)++;
            break;
        }
        accepted += acc;
        counts[t]++;
    }
    int df;
    double x2 = chi_square(counts, p, V, n, &df);
    if (!(x2 < chi_crit(df))) {
        fprintf(stderr, "  %s: chi-square %.1f over %d degrees of freedom (critical %.1f)\n", what, x2, df,
                chi_crit(df));
        (*fails)++;
    }
    if (accepted == 0 || accepted == n) {
        fprintf(stderr, "  %s: %ld of %ld drafts accepted: the case does not exercise both branches\n", what, accepted,
                n);
        (*fails)++;
    }
    sampler_free(s);
    sampler_free(ref);
    lm_free(row), lm_free(ids), lm_free(probs), lm_free(p), lm_free(counts);
}

static void test_spec_distribution_small(void) {
    const int V = 8;
    float logits[8] = {1.0f, 0.2f, 2.0f, -1.0f, 0.5f, 1.7f, -3.0f, 0.0f};
    float q_spread[8] = {0.30f, 0.05f, 0.05f, 0.20f, 0.10f, 0.05f, 0.20f, 0.05f}; /* differs from p */
    int32_t hist[] = {2, 2, 5, 0};
    int fails = 0;
    lm_sample_params sp;
    for (int cfg = 0; cfg < 5; cfg++) {
        sample_params_default(&sp);
        sp.seed = 7 + (uint64_t)cfg;
        sp.top_k = 0, sp.top_p = 1, sp.min_p = 0, sp.temp = 1;
        if (cfg == 1) sp.temp = 0.6f, sp.top_k = 5;
        if (cfg == 2) sp.top_p = 0.8f, sp.temp = 1.3f;
        if (cfg == 3) sp.min_p = 0.1f, sp.repeat_penalty = 1.3f, sp.freq_penalty = 0.2f, sp.presence_penalty = 0.3f;
        if (cfg == 4) sp.top_k = 4, sp.top_p = 0.9f, sp.min_p = 0.05f, sp.temp = 0.8f, sp.repeat_penalty = 1.2f;
        char what[64];
        snprintf(what, sizeof what, "small vocabulary, transforms %d, spread draft", cfg);
        spec_dist_case(&sp, logits, V, q_spread, -1, hist, 4, 60000 / scale, what, &fails);
        snprintf(what, sizeof what, "small vocabulary, transforms %d, point draft", cfg);
        spec_dist_case(&sp, logits, V, NULL, 0, hist, 4, 60000 / scale, what, &fails);
    }
    CHECK(fails == 0);
}

/* A stories260K row (vocabulary 512) as the target and a row of another
 * context, at another temperature, as the draft. */
static void test_spec_distribution_model(void) {
    int V = model->hp.n_vocab;
    char err[LM_ERRLEN];
    float *tgt = lm_malloc((size_t)V * sizeof *tgt), *drow = lm_malloc((size_t)V * sizeof *drow);
    float *q = lm_malloc((size_t)V * sizeof *q);
    int32_t p1[] = {1, 403, 407, 261, 2217 % 512, 280}, p2[] = {1, 300, 301, 302};
    lm_seqrun *s = seqrun_new(model, ref_pool, 0, 64, LM_TYPE_F32, err, sizeof err);
    CHECK(s);
    CHECK(seqrun_forward(s, p1, 6, tgt, false, err, sizeof err) == 0);
    seqrun_reset(s);
    CHECK(seqrun_forward(s, p2, 4, drow, false, err, sizeof err) == 0);
    seqrun_free(s);
    /* the draft's distribution: softmax(row / 1.5) */
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++) mx = drow[i] > mx ? drow[i] : mx;
    for (int i = 0; i < V; i++) sum += (q[i] = (float)exp((drow[i] - mx) / 1.5));
    for (int i = 0; i < V; i++) q[i] = (float)(q[i] / sum);
    int32_t hist[] = {403, 407, 280, 280};
    int fails = 0;
    lm_sample_params sp;
    sample_params_default(&sp);
    sp.top_k = 0, sp.top_p = 0.95f, sp.min_p = 0.01f, sp.temp = 1.0f, sp.repeat_penalty = 1.1f, sp.seed = 3;
    spec_dist_case(&sp, tgt, V, q, -1, hist, 4, 200000 / scale, "stories260K row, spread draft", &fails);
    int32_t top = sample_argmax(tgt, V);
    spec_dist_case(&sp, tgt, V, NULL, top, hist, 4, 200000 / scale, "stories260K row, point draft at the argmax",
                   &fails);
    lm_free(tgt), lm_free(drow), lm_free(q);
    CHECK(fails == 0);
}

/* ---- the engine -------------------------------------------------------------- */

/* The width curve new engines get: flat (rows free, as prompt lookup was
 * priced before the curve), so what these tests check does not depend on
 * passes timed on a loaded machine. */
static const char *engine_widths = "1:1,64:1";

static lm_engine *new_engine(int spec, int batch_tokens, int max_seqs, uint64_t kv_mem) {
    lm_engine_config ec;
    test_engine_config(&ec, batch_tokens, max_seqs, kv_mem);
    ec.block_size = 4; /* many block boundaries inside proposals */
    lm_spec_config sc;
    lm_spec_config_default(&sc);
    sc.proposer = spec;
    sc.max = 6;
    ec.spec = spec == LM_SPEC_NONE ? NULL : &sc;
    char err[LM_ERRLEN];
    lm_status st;
    lm_engine *e =
        engine_new_tuned(model, model->tok, &ec, &(engine_tuning){.spec_widths = engine_widths}, &st, err, sizeof err);
    if (!e) fprintf(stderr, "engine_new: %s\n", err);
    return e;
}

/* One request's shape. */
typedef struct {
    int32_t prompt[96];
    int n_prompt, max_tokens, n;
    char stop[16];
    const char *grammar;
    bool eos_bias; /* end-of-text made likelier, so some outputs end by it */
} job;

#define N_JOBS 24

static void make_jobs(job *jobs) {
    lm_rng r;
    lm_rng_seed(&r, 4242);
    for (int j = 0; j < N_JOBS; j++) {
        job *b = &jobs[j];
        memset(b, 0, sizeof *b);
        b->prompt[0] = 1;
        int n = 8 + (int)(lm_rng_u64(&r) % 24); /* with what it repeats at most 60: the context is 128 */
        for (int i = 1; i < n; i++) b->prompt[i] = 3 + (int32_t)(lm_rng_u64(&r) % 509);
        if (j % 3 != 2) { /* copy-heavy: the prompt repeats its own middle */
            int from = 1 + (int)(lm_rng_u64(&r) % (unsigned)(n / 2)), len = n - from;
            if (len > 60 - n) len = 60 - n;
            memcpy(b->prompt + n, b->prompt + from, (size_t)len * sizeof *b->prompt);
            n += len;
        }
        if (j % 7 == 3 || j % 7 == 5) { /* an end-of-text token inside the prompt, and likelier */
            b->prompt[n / 2] = 2;
            b->eos_bias = true;
        }
        b->n_prompt = n;
        b->max_tokens = 1 + (j * 13) % 60;
        if (j % 5 == 4) b->max_tokens = 60;
        b->n = j % 6 == 5 ? 3 : 1;
        if (j % 8 == 6) b->grammar = "root ::= [a-z] [a-z ,.]*\n";
        if (j % 8 == 7) b->grammar = "root ::= \"Once\" (\" \" [a-z]+){2,6} \".\"\n";
    }
}

static lm_request_params job_params(const job *b, collect *c) {
    lm_request_params p;
    engine_request_params_default(&p);
    p.prompt = b->prompt;
    p.n_prompt = b->n_prompt;
    p.max_tokens = b->max_tokens;
    p.n = b->n;
    p.sp.temp = 0;
    p.grammar = b->grammar;
    p.on_event = on_event;
    p.user = c;
    static const int32_t eos_id[1] = {2};
    static const float eos_val[1] = {9.0f};
    if (b->eos_bias) p.bias_ids = eos_id, p.bias_vals = eos_val, p.n_bias = 1;
    static const char *stops[1];
    if (b->stop[0]) {
        stops[0] = b->stop;
        p.stop = stops;
        p.n_stop = 1;
    }
    return p;
}

/* Run the jobs (together when `together`, else one at a time) into out. */
static int run_jobs(lm_engine *e, const job *jobs, collect *out, bool together) {
    char err[LM_ERRLEN];
    for (int j = 0; j < N_JOBS; j++) {
        memset(&out[j], 0, sizeof out[j]);
        lm_request_params p = job_params(&jobs[j], &out[j]);
        if (engine_submit(e, &p, NULL, err, sizeof err) != LM_OK) {
            fprintf(stderr, "  submit %d: %s\n", j, err);
            return -1;
        }
        if (!together) engine_wait_idle(e);
    }
    engine_wait_idle(e);
    if (engine_check(e, err, sizeof err) != 0) {
        fprintf(stderr, "  engine_check: %s\n", err);
        return -1;
    }
    return 0;
}

/* Whether got equals want, request by request, choice by choice. */
static bool same(const job *jobs, const collect *want, const collect *got, const char *what) {
    for (int j = 0; j < N_JOBS; j++)
        if (!collect_same(want, got, j, jobs[j].n, what)) return false;
    return true;
}

static void greedy_identity(uint64_t pool_blocks) {
    static job jobs[N_JOBS];
    static collect plain[N_JOBS], got[N_JOBS];
    make_jobs(jobs);
    lm_engine *ref = new_engine(LM_SPEC_NONE, 64, 8, 0);
    CHECK(ref);
    /* stop strings: a piece from the middle of a first plain run's text */
    CHECK(run_jobs(ref, jobs, plain, false) == 0);
    for (int j = 0; j < N_JOBS; j += 4)
        if (plain[j].text_len[0] > 12) {
            memcpy(jobs[j].stop, plain[j].text[0] + plain[j].text_len[0] / 2, 3);
            jobs[j].stop[3] = 0;
        }
    CHECK(run_jobs(ref, jobs, plain, false) == 0);
    engine_free(ref);
    int n_stop = 0, n_eos = 0;
    for (int j = 0; j < N_JOBS; j++) {
        n_stop += jobs[j].stop[0] && plain[j].finish[0] == LM_FINISH_STOP;
        n_eos += !jobs[j].stop[0] && !jobs[j].grammar && plain[j].finish[0] == LM_FINISH_STOP;
    }
    CHECKF(n_stop >= 2, "only %d stop strings hit", n_stop);
    fprintf(stderr, "  plain: %d requests ended by a stop string, %d by an end-of-text token\n", n_stop, n_eos);
    /* a pool of pool_blocks blocks of 4 positions: one request fits, eight preempt */
    uint64_t bytes_per_token = 2ull * (uint64_t)model->hp.n_layer * (uint64_t)model->hp.n_head_kv *
        (uint64_t)model->hp.head_dim * sizeof(float);

    struct {
        const char *what;
        int batch, seqs;
        uint64_t kv_mem;
        bool together;
    } runs[] = {
        {"alone", 64, 8, 0, false},
        {"together", 64, 8, 0, true},
        {"budget 8", 8, 8, 0, true},
        {"small pool (preemption)", 64, 8, pool_blocks * 4 * bytes_per_token, true},
    };
    uint64_t rejected = 0;
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        lm_engine *e = new_engine(LM_SPEC_NGRAM, runs[r].batch, runs[r].seqs, runs[r].kv_mem);
        CHECK(e);
        CHECK(run_jobs(e, jobs, got, runs[r].together) == 0);
        CHECK(same(jobs, plain, got, runs[r].what));
        /* again: prompts and outputs now come from the prefix cache */
        CHECK(run_jobs(e, jobs, got, runs[r].together) == 0);
        CHECK(same(jobs, plain, got, runs[r].what));
        lm_engine_stats st;
        engine_stats(e, &st);
        fprintf(stderr, "  %s: %llu proposed, %llu accepted in %llu verifying passes, %llu preemptions\n", runs[r].what,
                (unsigned long long)st.spec_proposed_total, (unsigned long long)st.spec_accepted_total,
                (unsigned long long)st.spec_steps_total, (unsigned long long)st.preemptions_total);
        CHECK(st.spec_accepted_total >= 10 && st.spec_accepted_total <= st.spec_proposed_total);
        rejected += st.spec_proposed_total - st.spec_accepted_total;
        if (runs[r].kv_mem) CHECK(st.preemptions_total > 0);
        engine_free(e);
    }
    CHECK(rejected > 0); /* rejections, and so truncations, happened */
}

static void test_greedy_identity(void) { greedy_identity(90); }

/* The same on a sliding-window model (window 8 on two layers in three):
 * truncation keeps the blocks a window still sees. */
static void test_greedy_identity_swa(void) {
    char err[LM_ERRLEN];
    lm_model *keep = model;
    lm_model *swa = swa_model_load(TEST_MODEL, 8, 3, 128, err, sizeof err);
    CHECKF(swa, "%s", err);
    model = swa;
    greedy_identity(80);
    model = keep;
    model_free(swa);
}

/* Greedy identity at set width curves, all requests together: on a flat
 * curve prompt lookup proposes as before; on one where every row beyond a
 * few costs nearly a pass the batch's proposals shrink (fewer than half as
 * many), and the output is the plain engine's either way. */
static void test_width_identity(void) {
    static job jobs[N_JOBS];
    static collect plain[N_JOBS], got[N_JOBS];
    make_jobs(jobs);
    lm_engine *ref = new_engine(LM_SPEC_NONE, 64, 8, 0);
    CHECK(ref);
    CHECK(run_jobs(ref, jobs, plain, true) == 0);
    engine_free(ref);
    const char *curves[] = {"1:1,64:1", "1:1,2:1.02,8:3,64:30"};
    uint64_t proposed[2] = {0, 0};
    for (int r = 0; r < 2; r++) {
        const char *keep = engine_widths;
        engine_widths = curves[r];
        lm_engine *e = new_engine(LM_SPEC_NGRAM, 64, 8, 0);
        engine_widths = keep;
        CHECK(e);
        if (!e) continue;
        CHECK(run_jobs(e, jobs, got, true) == 0);
        CHECK(same(jobs, plain, got, curves[r]));
        lm_engine_stats st;
        engine_stats(e, &st);
        proposed[r] = st.spec_proposed_total;
        fprintf(stderr, "  curve %s: %llu proposed, %llu accepted in %llu verifying passes\n", curves[r],
                (unsigned long long)st.spec_proposed_total, (unsigned long long)st.spec_accepted_total,
                (unsigned long long)st.spec_steps_total);
        engine_free(e);
    }
    CHECKF(proposed[0] >= 20 && proposed[1] < proposed[0] / 2, "flat %llu, wide %llu", (unsigned long long)proposed[0],
           (unsigned long long)proposed[1]);
    /* a curve that does not parse is refused */
    char err[LM_ERRLEN];
    lm_engine_config ec;
    engine_config_default(&ec);
    lm_spec_config sc;
    lm_spec_config_default(&sc);
    ec.spec = &sc;
    lm_status st;
    lm_engine *bad =
        engine_new_tuned(model, model->tok, &ec, &(engine_tuning){.spec_widths = "2:1"}, &st, err, sizeof err);
    CHECKF(!bad && strstr(err, "width") && st == LM_ERR_INVALID, "%s", bad ? "accepted" : err);
    if (bad) engine_free(bad);
}

/* Per request: speculation off (spec_k < 0) gives no proposal; K = 1 at
 * most one per pass; the output is the same. */
static void test_request_k(void) {
    static job jobs[N_JOBS];
    static collect a[N_JOBS];
    make_jobs(jobs);
    lm_engine *e = new_engine(LM_SPEC_NGRAM, 64, 8, 0);
    CHECK(e);
    char err[LM_ERRLEN];
    for (int k = -1; k <= 1; k += 2) {
        collect c;
        memset(&c, 0, sizeof c);
        lm_request_params p = job_params(&jobs[0], &c);
        p.max_tokens = 60;
        p.spec_k = k;
        CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
        engine_wait_idle(e);
        if (k < 0) CHECK(c.stats[0].spec_proposed == 0 && c.stats[0].spec_steps == 0);
        else CHECK(c.stats[0].spec_proposed == c.stats[0].spec_steps && c.stats[0].spec_steps > 0);
        a[k > 0] = c;
    }
    CHECK(a[0].n[0] == a[1].n[0] && !memcmp(a[0].tokens[0], a[1].tokens[0], (size_t)a[0].n[0] * sizeof(int32_t)));
    engine_free(e);
}

/* Sampled requests: the same seed gives the same tokens; the second token
 * (verified against the proposal that follows the first) is distributed as
 * the target's exact conditional distribution. */
static void test_sampled(void) {
    int V = model->hp.n_vocab;
    char err0[LM_ERRLEN];
    /* a prompt of 100 distinct tokens, its greedy next token among them, so
     * that the likeliest first tokens have an earlier occurrence for prompt
     * lookup to propose from */
    static int32_t prompt[128];
    int n = 0;
    prompt[n++] = 1;
    for (int t = 0; t < 99; t++) prompt[n++] = 3 + (t * 37) % 509;
    {
        float *lr = lm_malloc((size_t)V * sizeof *lr);
        for (int it = 0; it < 4; it++) {
            lm_seqrun *s0 = seqrun_new(model, ref_pool, 0, 64, LM_TYPE_F32, err0, sizeof err0);
            CHECK(s0 && seqrun_forward(s0, prompt, n, lr, false, err0, sizeof err0) == 0);
            seqrun_free(s0);
            prompt[40 + it] = sample_argmax(lr, V);
        }
        lm_free(lr);
    }
    lm_engine *e = new_engine(LM_SPEC_NGRAM, 64, 16, 0);
    CHECK(e);
    lm_sample_params sp;
    sample_params_default(&sp);
    sp.top_k = 0, sp.top_p = 1, sp.min_p = 0, sp.temp = 1;
    char err[LM_ERRLEN];
    /* reproducible */
    static collect r1, r2;
    for (int k = 0; k < 2; k++) {
        collect *c = k ? &r2 : &r1;
        memset(c, 0, sizeof *c);
        lm_request_params p;
        engine_request_params_default(&p);
        p.prompt = prompt, p.n_prompt = n, p.max_tokens = 25, p.sp = sp, p.sp.seed = 1234;
        p.on_event = on_event, p.user = c;
        CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
        engine_wait_idle(e);
    }
    CHECK(r1.n[0] == r2.n[0] && !memcmp(r1.tokens[0], r2.tokens[0], (size_t)r1.n[0] * sizeof(int32_t)));
    CHECK(r1.stats[0].spec_steps > 0);

    /* the distribution: many 3-token requests (the second verified against a proposal); keep the second tokens of the
     * most frequent first token */
    enum { N_MAX = 12000, BATCH = 400 };
    const int N = (int)(N_MAX / scale / BATCH * BATCH);
    static collect cs[BATCH];
    static int32_t first[N_MAX], second[N_MAX];
    static bool was_verified[N_MAX];
    int verified = 0;
    for (int b = 0; b < N; b += BATCH) {
        for (int k = 0; k < BATCH; k++) {
            memset(&cs[k], 0, sizeof cs[k]);
            lm_request_params p;
            engine_request_params_default(&p);
            p.prompt = prompt, p.n_prompt = n, p.max_tokens = 3, p.sp = sp, p.sp.seed = 77 + (uint64_t)(b + k);
            p.on_event = on_event, p.user = &cs[k];
            CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
        }
        engine_wait_idle(e);
        for (int k = 0; k < BATCH; k++) {
            CHECK(cs[k].n[0] >= 2);
            first[b + k] = cs[k].tokens[0][0];
            second[b + k] = cs[k].tokens[0][1];
            verified += was_verified[b + k] = cs[k].stats[0].spec_steps > 0;
        }
    }
    CHECK(engine_check(e, err, sizeof err) == 0);
    engine_free(e);
    CHECKF(verified > N / 10, "only %d of %d second tokens were verified against a proposal", verified, N);
    /* whether a proposal is made depends only on the first token, so the
     * second tokens after one first token are all verified or none */
    long *cnt = lm_calloc((size_t)V, sizeof *cnt);
    for (int i = 0; i < N; i++) cnt[first[i]] += was_verified[i];
    int32_t t1 = 0;
    for (int t = 0; t < V; t++) t1 = cnt[t] > cnt[t1] ? t : t1;
    memset(cnt, 0, (size_t)V * sizeof *cnt);
    long m = 0;
    for (int i = 0; i < N; i++)
        if (first[i] == t1) cnt[second[i]]++, m++;
    fprintf(stderr, "  engine: first token %d drawn %ld times of %d\n", t1, m, N);
    CHECKF(m >= 1000 / scale, "the most frequent first token came %ld times", m);
    /* the exact conditional distribution after prompt + t1 */
    float *row = lm_malloc((size_t)V * sizeof *row);
    float *probs = lm_malloc((size_t)V * sizeof *probs);
    int32_t *ids = lm_malloc((size_t)V * sizeof *ids);
    double *p = lm_calloc((size_t)V, sizeof *p);
    lm_seqrun *s = seqrun_new(model, ref_pool, 0, 64, LM_TYPE_F32, err, sizeof err);
    CHECK(s);
    prompt[n] = t1;
    CHECK(seqrun_forward(s, prompt, n + 1, row, false, err, sizeof err) == 0);
    seqrun_free(s);
    lm_sampler *ref = sampler_new(&sp, V);
    int32_t k = sampler_dist(ref, row, ids, probs);
    for (int i = 0; i < k; i++) p[ids[i]] = probs[i];
    sampler_free(ref);
    int df;
    double x2 = chi_square(cnt, p, V, m, &df);
    fprintf(stderr, "  engine: second token after %d (%ld draws): chi-square %.1f, %d df, critical %.1f\n", t1, m, x2,
            df, chi_crit(df));
    CHECK(x2 < chi_crit(df));
    lm_free(cnt), lm_free(row), lm_free(probs), lm_free(ids), lm_free(p);
}

int main(void) {
    kernels_init();
    if (getenv("LAMINA_ASAN") || getenv("LAMINA_EMULATED")) scale = 3;
    if (!(model = test_model_load())) return 1;
    ref_pool = pool_new(2);
    TEST_RUN(test_ngram);
    TEST_RUN(test_controller);
    TEST_RUN(test_guard);
    TEST_RUN(test_width_curve);
    TEST_RUN(test_width_sizing);
    TEST_RUN(test_kv_truncate_pattern);
    TEST_RUN(test_sched_spec);
    TEST_RUN(test_spec_distribution_small);
    TEST_RUN(test_spec_distribution_model);
    TEST_RUN(test_greedy_identity);
    TEST_RUN(test_greedy_identity_swa);
    TEST_RUN(test_width_identity);
    TEST_RUN(test_request_k);
    TEST_RUN(test_sampled);
    model_free(model);
    pool_free(ref_pool);
    return TEST_DONE();
}
