/*
 * test_sample.c - the sampler against a float64 reference.
 *
 * The reference (ref_dist) applies the documented pipeline in double with a
 * full sort: bias -> penalties -> top-k -> top-p -> min-p -> temperature ->
 * softmax, ties to the lower id. Two kinds of checks:
 *   - exact: sampler_dist's probabilities equal the reference within 2e-6
 *     absolute (float weights vs double), on small and 262,144-token rows;
 *   - empirical: 200,000 draws with a fixed seed; Pearson chi-square against
 *     the reference must stay below df + 6 sqrt(2 df) + 10 (a correct sampler
 *     exceeds that with probability far below 1e-6), no draw may fall outside
 *     the surviving set, and the same counts against a deliberately wrong
 *     distribution (e.g. temperature before top-p) must exceed the bound, so
 *     each case can tell a wrong sampler from a right one.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode/sample.h"
#include "test.h"

#define NDRAW 200000

/* ---- reference ------------------------------------------------------------ */

static const double *sort_key;
static int cmp_desc(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (sort_key[i] > sort_key[j]) return -1;
    if (sort_key[i] < sort_key[j]) return 1;
    return i < j ? -1 : (i > j);
}

typedef struct {
    const float *bias;   /* NULL or (V) */
    const int32_t *hist; /* tokens in the penalty window */
    int n_hist;
} ref_extra;

/* probs (V): the distribution the documented pipeline defines, in double.
 * temp_first: the wrong order (temperature before truncation), for the
 * negative controls. */
static void ref_dist(const float *logits, int32_t V, const lm_sample_params *p, const ref_extra *x, bool temp_first,
                     double *probs) {
    double *l = malloc(sizeof(double) * (size_t)V);
    int32_t *ord = malloc(sizeof(int32_t) * (size_t)V);
    for (int32_t i = 0; i < V; i++) {
        l[i] = logits[i];
        if (x && x->bias) l[i] += x->bias[i];
    }
    if (x && x->n_hist) {
        int *cnt = calloc((size_t)V, sizeof(int));
        for (int i = 0; i < x->n_hist; i++) cnt[x->hist[i]]++;
        for (int32_t i = 0; i < V; i++) {
            if (!cnt[i]) continue;
            l[i] = l[i] <= 0 ? l[i] * p->repeat_penalty : l[i] / p->repeat_penalty;
            l[i] -= cnt[i] * (double)p->freq_penalty + p->presence_penalty;
        }
        free(cnt);
    }
    int32_t nf = 0;
    for (int32_t i = 0; i < V; i++) {
        if (isnan(l[i])) l[i] = -INFINITY;
        if (l[i] > -INFINITY) nf++;
        ord[i] = i;
        probs[i] = 0;
    }
    sort_key = l;
    qsort(ord, (size_t)V, sizeof *ord, cmp_desc);
    double m = l[ord[0]];
    if (p->temp <= 0) {
        probs[ord[0]] = 1;
        goto out;
    }
    double t = temp_first ? p->temp : 1.0; /* scale used by top-p */
    int32_t keep = nf;
    if (p->top_k > 0 && p->top_k < keep) keep = p->top_k;
    if (p->top_p < 1) {
        double z = 0, cum = 0;
        for (int32_t i = 0; i < keep; i++) z += exp((l[ord[i]] - m) / t);
        int32_t j = 0;
        while (j < keep) {
            cum += exp((l[ord[j]] - m) / t) / z;
            j++;
            if (cum >= p->top_p) break;
        }
        keep = j;
    }
    if (p->min_p > 0) {
        int32_t j = 0;
        while (j < keep && (l[ord[j]] - m) / t >= log(p->min_p)) j++;
        keep = j;
    }
    double z = 0;
    for (int32_t i = 0; i < keep; i++) z += exp((l[ord[i]] - m) / p->temp);
    for (int32_t i = 0; i < keep; i++) probs[ord[i]] = exp((l[ord[i]] - m) / p->temp) / z;
out:
    free(l);
    free(ord);
}

static void params_off(lm_sample_params *p, float temp) {
    sample_params_default(p);
    p->temp = temp;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->seed = 1234;
}

/* Pearson chi-square of counts against probs over tokens with p > 0; *outside
 * gets the number of draws of tokens with p == 0. */
static double chi2(const long *cnt, const double *probs, int32_t V, long n, int *df, long *outside) {
    double s = 0;
    int k = 0;
    *outside = 0;
    for (int32_t i = 0; i < V; i++) {
        if (probs[i] <= 0) {
            *outside += cnt[i];
            continue;
        }
        double e = probs[i] * (double)n;
        s += (cnt[i] - e) * (cnt[i] - e) / e;
        k++;
    }
    *df = k > 1 ? k - 1 : 1;
    return s;
}

static double chi2_bound(int df) { return df + 6.0 * sqrt(2.0 * df) + 10.0; }

/* Small row with ids out of logit order, and a few near-equal values. */
#define SV 12
static const float small_logits[SV] = {0.3f, 2.0f, -1.0f, 1.2f, 0.0f, 1.5f, -3.0f, 0.7f, -0.4f, 1.0f, -2.0f, 0.5f};

/* Wrong samplers a case must be able to tell from the right one. */
enum control {
    CTRL_TEMP_FIRST, /* temperature applied before top-p / min-p */
    CTRL_TEMP_ONE,   /* temperature ignored */
    CTRL_NO_EXTRA,   /* bias and penalties ignored */
    CTRL_NONE        /* the case cannot discriminate (e.g. top-1) */
};

/* Draw NDRAW tokens with p (+ optional bias / history) and compare the
 * counts to the reference, and to a wrong reference as a control. Returns
 * 1 on success, 0 when the sampler is off, -1 when the control failed to
 * tell the wrong distribution apart. */
static int run_empirical(const lm_sample_params *p, const ref_extra *x, enum control ctrl, const char *what) {
    lm_sampler *s = sampler_new(p, SV);
    if (!s) return 0;
    if (x && x->bias)
        for (int32_t i = 0; i < SV; i++) sampler_set_bias(s, i, x->bias[i]);
    if (x)
        for (int i = 0; i < x->n_hist; i++) sampler_accept(s, x->hist[i]);
    long cnt[SV] = {0};
    float row[SV];
    int ok = 1;
    for (long d = 0; d < NDRAW; d++) {
        memcpy(row, small_logits, sizeof row);
        int32_t t = sampler_sample(s, row);
        if (t < 0 || t >= SV) {
            ok = 0;
            break;
        }
        cnt[t]++;
    }
    sampler_free(s);
    double ref[SV], wrong[SV];
    ref_dist(small_logits, SV, p, x, false, ref);
    lm_sample_params q = *p;
    q.temp = 1.0f;
    switch (ctrl) {
        case CTRL_TEMP_FIRST: ref_dist(small_logits, SV, p, x, true, wrong); break;
        case CTRL_TEMP_ONE: ref_dist(small_logits, SV, &q, x, false, wrong); break;
        case CTRL_NO_EXTRA: ref_dist(small_logits, SV, p, NULL, false, wrong); break;
        case CTRL_NONE: memcpy(wrong, ref, sizeof ref); break;
    }
    int df, dfw;
    long outside, outw;
    double c = chi2(cnt, ref, SV, NDRAW, &df, &outside);
    double cw = chi2(cnt, wrong, SV, NDRAW, &dfw, &outw);
    double maxdev = 0;
    for (int i = 0; i < SV; i++) maxdev = fmax(maxdev, fabs((double)cnt[i] / NDRAW - ref[i]));
    printf("NOTE %-28s chi2 %7.2f (df %d, bound %.1f), max |freq-p| %.4f; control: chi2 %.3g, %ld outside\n", what, c,
           df, chi2_bound(df), maxdev, cw, outw);
    if (!ok || outside != 0 || c > chi2_bound(df)) return 0;
    /* the control: a sampler with the wrong order must be caught */
    if (ctrl != CTRL_NONE && !(cw > chi2_bound(dfw) || outw > 0)) return -1;
    return 1;
}

/* ---- tests ---------------------------------------------------------------- */

static void test_greedy_argmax(void) {
    const int32_t V = 50000;
    float *x = malloc(sizeof(float) * V), *row = malloc(sizeof(float) * V);
    lm_rng r;
    lm_rng_seed(&r, 7);
    for (int32_t i = 0; i < V; i++) x[i] = lm_rng_normal(&r) * 3.0f;
    int32_t best = 0;
    for (int32_t i = 1; i < V; i++)
        if (x[i] > x[best]) best = i;
    lm_sample_params p;
    params_off(&p, 0.0f);
    p.top_k = 5; /* ignored by greedy */
    lm_sampler *s = sampler_new(&p, V);
    CHECK(s);
    memcpy(row, x, sizeof(float) * V);
    CHECK(sampler_sample(s, row) == best);
    CHECK(sample_argmax(x, V) == best);
    /* banning the argmax gives the runner-up */
    int32_t second = best == 0 ? 1 : 0;
    for (int32_t i = 0; i < V; i++)
        if (i != best && x[i] > x[second]) second = i;
    sampler_set_bias(s, best, -INFINITY);
    memcpy(row, x, sizeof(float) * V);
    CHECK(sampler_sample(s, row) == second);
    sampler_free(s);
    /* first index on ties, NaN skipped */
    float t[5] = {1.0f, NAN, 3.0f, 3.0f, 2.0f};
    CHECK(sample_argmax(t, 5) == 2);
    float n2[2] = {NAN, NAN};
    CHECK(sample_argmax(n2, 2) == -1);
    CHECK(sample_argmax(t, 0) == -1);
    free(x);
    free(row);
}

static void draw_seq(uint64_t seed, int32_t V, int n, int32_t *out) {
    lm_sample_params p;
    params_off(&p, 1.0f);
    p.seed = seed;
    lm_sampler *s = sampler_new(&p, V);
    float *row = malloc(sizeof(float) * (size_t)V);
    for (int i = 0; i < n; i++) {
        for (int32_t j = 0; j < V; j++) row[j] = 0.0f; /* flat */
        out[i] = s ? sampler_sample(s, row) : -2;
    }
    free(row);
    sampler_free(s);
}

static void test_determinism(void) {
    enum { N = 1000, V = 1000 };
    static int32_t a[N], b[N], c[N];
    draw_seq(42, V, N, a);
    draw_seq(42, V, N, b);
    draw_seq(43, V, N, c);
    int diff = 0, distinct = 0;
    static char seen[V];
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < N; i++) {
        CHECK(a[i] >= 0 && a[i] < V);
        CHECKF(a[i] == b[i], "draw %d: %d vs %d with the same seed", i, a[i], b[i]);
        diff += a[i] != c[i];
        if (!seen[a[i]]) distinct++;
        seen[a[i]] = 1;
    }
    /* two independent uniform streams over 1000 tokens agree ~1 time in 1000 */
    CHECKF(diff > 950, "seeds 42 and 43 differ at only %d of %d draws", diff, N);
    CHECKF(distinct > 500, "only %d distinct tokens in %d flat draws", distinct, N);

    /* sampler_reset reseeds: the same stream again */
    lm_sample_params p;
    params_off(&p, 1.0f);
    p.seed = 42;
    lm_sampler *s = sampler_new(&p, V);
    CHECK(s);
    float row[V];
    for (int i = 0; i < 10; i++) {
        for (int j = 0; j < V; j++) row[j] = 0.0f;
        sampler_sample(s, row);
    }
    sampler_reset(s);
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < V; j++) row[j] = 0.0f;
        int32_t t = sampler_sample(s, row);
        if (t != a[i]) {
            sampler_free(s);
            CHECKF(0, "after reset, draw %d: %d vs %d", i, t, a[i]);
        }
    }
    sampler_free(s);
}

static void test_empirical_temp(void) {
    lm_sample_params p;
    params_off(&p, 0.7f);
    int r = run_empirical(&p, NULL, CTRL_TEMP_ONE, "temp 0.7");
    CHECKF(r == 1, "result %d", r);
    params_off(&p, 1.8f);
    r = run_empirical(&p, NULL, CTRL_TEMP_ONE, "temp 1.8");
    CHECKF(r == 1, "result %d", r);
}

static void test_empirical_top_k(void) {
    lm_sample_params p;
    params_off(&p, 1.3f);
    p.top_k = 5;
    int r = run_empirical(&p, NULL, CTRL_TEMP_ONE, "top_k 5, temp 1.3");
    CHECKF(r == 1, "result %d", r);
    p.top_k = 1; /* top-1 is greedy */
    r = run_empirical(&p, NULL, CTRL_NONE, "top_k 1");
    CHECKF(r == 1, "result %d", r);
}

static void test_empirical_top_p(void) {
    lm_sample_params p;
    params_off(&p, 0.6f);
    p.top_p = 0.8f;
    int r = run_empirical(&p, NULL, CTRL_TEMP_FIRST, "top_p 0.8, temp 0.6");
    CHECKF(r == 1, "result %d", r);
    params_off(&p, 1.6f);
    p.top_p = 0.5f;
    r = run_empirical(&p, NULL, CTRL_TEMP_FIRST, "top_p 0.5, temp 1.6");
    CHECKF(r == 1, "result %d", r);
}

static void test_empirical_min_p(void) {
    lm_sample_params p;
    params_off(&p, 1.5f);
    p.min_p = 0.2f;
    int r = run_empirical(&p, NULL, CTRL_TEMP_FIRST, "min_p 0.2, temp 1.5");
    CHECKF(r == 1, "result %d", r);
    params_off(&p, 0.5f);
    p.min_p = 0.1f;
    r = run_empirical(&p, NULL, CTRL_TEMP_FIRST, "min_p 0.1, temp 0.5");
    CHECKF(r == 1, "result %d", r);
}

static void test_empirical_combined(void) {
    lm_sample_params p;
    params_off(&p, 0.5f);
    p.top_k = 8;
    p.top_p = 0.9f;
    p.min_p = 0.1f;
    int r = run_empirical(&p, NULL, CTRL_TEMP_FIRST, "k 8, p 0.9, min 0.1, t 0.5");
    CHECKF(r == 1, "result %d", r);
    sample_params_default(&p);
    r = run_empirical(&p, NULL, CTRL_TEMP_ONE, "defaults");
    CHECKF(r == 1, "result %d", r);
    /* bias and penalties feed the truncation */
    params_off(&p, 1.2f);
    p.top_k = 7;
    p.top_p = 0.92f;
    p.repeat_penalty = 1.3f;
    p.freq_penalty = 0.2f;
    p.presence_penalty = 0.3f;
    p.repeat_last_n = 64;
    float bias[SV] = {0};
    bias[2] = 2.5f;
    bias[5] = -0.8f;
    int32_t hist[] = {1, 1, 3, 8, 1, 2};
    ref_extra x = {bias, hist, 6};
    r = run_empirical(&p, &x, CTRL_NO_EXTRA, "bias+penalties, k 7, p 0.92");
    CHECKF(r == 1, "result %d", r);
}

/* dist with temp 1 and no truncation: log p_i - log p_ref = penalized logit
 * difference, compared with values worked out by hand. */
static int penalized_logits(const lm_sample_params *p, const float *in, int V, const int32_t *hist, int nh, int ref_tok,
                            double *out) {
    lm_sampler *s = sampler_new(p, V);
    if (!s) return 0;
    for (int i = 0; i < nh; i++) sampler_accept(s, hist[i]);
    float row[8], probs[8];
    int32_t ids[8];
    memcpy(row, in, sizeof(float) * (size_t)V);
    int32_t n = sampler_dist(s, row, ids, probs);
    sampler_free(s);
    if (n != V) return 0;
    double lp[8], lr = 0;
    for (int i = 0; i < n; i++) lp[ids[i]] = log((double)probs[i]);
    lr = lp[ref_tok];
    for (int i = 0; i < V; i++) out[i] = lp[i] - lr;
    return 1;
}

static void test_penalties_exact(void) {
    const float l[5] = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f};
    const int32_t hist[5] = {0, 0, 0, 1, 3};
    lm_sample_params p;
    params_off(&p, 1.0f);
    p.repeat_penalty = 2.0f;
    p.freq_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    double got[5];

    /* window 64 holds all: counts 3, 1, 0, 1, 0 */
    p.repeat_last_n = 64;
    CHECK(penalized_logits(&p, l, 5, hist, 5, 4, got));
    const double want_all[5] = {2.0 / 2 - 1.5 - 0.25, -1.0 * 2 - 0.5 - 0.25, 0.5, 3.0 / 2 - 0.5 - 0.25, 0.0};
    for (int i = 0; i < 5; i++) CHECKF(fabs(got[i] - want_all[i]) < 1e-5, "tok %d: %g vs %g", i, got[i], want_all[i]);

    /* whole history: same counts */
    p.repeat_last_n = -1;
    CHECK(penalized_logits(&p, l, 5, hist, 5, 4, got));
    for (int i = 0; i < 5; i++) CHECKF(fabs(got[i] - want_all[i]) < 1e-5, "tok %d: %g vs %g", i, got[i], want_all[i]);

    /* window 3 holds {0, 1, 3}: one each */
    p.repeat_last_n = 3;
    CHECK(penalized_logits(&p, l, 5, hist, 5, 4, got));
    const double want_w3[5] = {1.0 - 0.5 - 0.25, -2.0 - 0.5 - 0.25, 0.5, 1.5 - 0.5 - 0.25, 0.0};
    for (int i = 0; i < 5; i++) CHECKF(fabs(got[i] - want_w3[i]) < 1e-5, "tok %d: %g vs %g", i, got[i], want_w3[i]);

    /* repeat penalty alone; window 0 switches everything off */
    p.freq_penalty = p.presence_penalty = 0.0f;
    p.repeat_penalty = 1.25f;
    p.repeat_last_n = 64;
    CHECK(penalized_logits(&p, l, 5, hist, 5, 4, got));
    const double want_rp[5] = {2.0 / 1.25, -1.0 * 1.25, 0.5, 3.0 / 1.25, 0.0};
    for (int i = 0; i < 5; i++) CHECKF(fabs(got[i] - want_rp[i]) < 1e-5, "tok %d: %g vs %g", i, got[i], want_rp[i]);
    p.repeat_last_n = 0;
    CHECK(penalized_logits(&p, l, 5, hist, 5, 4, got));
    for (int i = 0; i < 5; i++) CHECKF(fabs(got[i] - l[i]) < 1e-5, "tok %d: %g vs %g", i, got[i], (double)l[i]);

    /* a window longer than the ring wraps many times */
    p.repeat_last_n = 2;
    p.repeat_penalty = 1.0f;
    p.freq_penalty = 1.0f;
    int32_t h2[7] = {2, 2, 2, 0, 1, 0, 0}; /* last two: 0, 0 */
    CHECK(penalized_logits(&p, l, 5, h2, 7, 4, got));
    const double want_h2[5] = {2.0 - 2.0, -1.0, 0.5, 3.0, 0.0};
    for (int i = 0; i < 5; i++) CHECKF(fabs(got[i] - want_h2[i]) < 1e-5, "tok %d: %g vs %g", i, got[i], want_h2[i]);

    /* bias adds before penalties: (2 + 1) / 2 for token 0 seen once */
    params_off(&p, 1.0f);
    p.repeat_penalty = 2.0f;
    lm_sampler *s = sampler_new(&p, 5);
    CHECK(s);
    sampler_set_bias(s, 0, 1.0f);
    sampler_set_bias(s, 2, -0.5f);
    sampler_accept(s, 0);
    float row[5], probs[5];
    int32_t ids[5];
    memcpy(row, l, sizeof row);
    int32_t n = sampler_dist(s, row, ids, probs);
    sampler_free(s);
    CHECK(n == 5);
    double lp[5];
    for (int i = 0; i < 5; i++) lp[ids[i]] = log((double)probs[i]);
    CHECKF(fabs(lp[0] - lp[4] - 1.5) < 1e-5, "%g", lp[0] - lp[4]);
    CHECKF(fabs(lp[2] - lp[4] - 0.0) < 1e-5, "%g", lp[2] - lp[4]);
}

static void test_banned(void) {
    lm_sample_params p;
    params_off(&p, 2.0f); /* hot: the banned ones would be drawn often */
    lm_sampler *s = sampler_new(&p, SV);
    CHECK(s);
    sampler_set_bias(s, 1, -INFINITY); /* the three largest logits */
    sampler_set_bias(s, 5, -INFINITY);
    sampler_set_bias(s, 3, -INFINITY);
    float row[SV];
    long hits = 0;
    for (int d = 0; d < 100000; d++) {
        memcpy(row, small_logits, sizeof row);
        int32_t t = sampler_sample(s, row);
        hits += (t == 1 || t == 5 || t == 3 || t < 0);
    }
    sampler_free(s);
    CHECKF(hits == 0, "%ld banned draws", hits);

    /* every token banned: -1, and an empty distribution */
    p.top_k = 3;
    s = sampler_new(&p, SV);
    CHECK(s);
    for (int i = 0; i < SV; i++) sampler_set_bias(s, i, -INFINITY);
    memcpy(row, small_logits, sizeof row);
    CHECK(sampler_sample(s, row) == -1);
    int32_t ids[SV];
    float probs[SV];
    memcpy(row, small_logits, sizeof row);
    CHECK(sampler_dist(s, row, ids, probs) == 0);
    sampler_free(s);
    params_off(&p, 0.0f);
    s = sampler_new(&p, SV);
    CHECK(s);
    for (int i = 0; i < SV; i++) sampler_set_bias(s, i, -INFINITY);
    memcpy(row, small_logits, sizeof row);
    CHECK(sampler_sample(s, row) == -1);
    /* bias 0 lifts the ban again */
    sampler_set_bias(s, 7, 0.0f);
    memcpy(row, small_logits, sizeof row);
    CHECK(sampler_sample(s, row) == 7);
    sampler_free(s);
}

/* Two configurations must give identical distributions. */
static int same_dist(const lm_sample_params *a, const lm_sample_params *b, const float *x, int32_t V) {
    float *ra = malloc(sizeof(float) * (size_t)V), *rb = malloc(sizeof(float) * (size_t)V);
    float *pa = malloc(sizeof(float) * (size_t)V), *pb = malloc(sizeof(float) * (size_t)V);
    int32_t *ia = malloc(sizeof(int32_t) * (size_t)V), *ib = malloc(sizeof(int32_t) * (size_t)V);
    float *da = calloc((size_t)V, sizeof(float)), *db = calloc((size_t)V, sizeof(float));
    lm_sampler *sa = sampler_new(a, V), *sb = sampler_new(b, V);
    int ok = sa && sb;
    if (ok) {
        memcpy(ra, x, sizeof(float) * (size_t)V);
        memcpy(rb, x, sizeof(float) * (size_t)V);
        int32_t na = sampler_dist(sa, ra, ia, pa), nb = sampler_dist(sb, rb, ib, pb);
        for (int32_t i = 0; i < na; i++) da[ia[i]] = pa[i];
        for (int32_t i = 0; i < nb; i++) db[ib[i]] = pb[i];
        ok = na == nb && na > 0;
        for (int32_t i = 0; ok && i < V; i++) ok = fabsf(da[i] - db[i]) <= 1e-7f;
    }
    sampler_free(sa);
    sampler_free(sb);
    free(ra);
    free(rb);
    free(pa);
    free(pb);
    free(ia);
    free(ib);
    free(da);
    free(db);
    return ok;
}

static void test_noops(void) {
    lm_sample_params off, p;
    params_off(&off, 0.9f);
    p = off;
    p.top_k = 1000; /* larger than the vocabulary */
    CHECK(same_dist(&off, &p, small_logits, SV));
    p.top_k = SV;
    CHECK(same_dist(&off, &p, small_logits, SV));
    p = off;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    CHECK(same_dist(&off, &p, small_logits, SV));
    p.top_p = 1.5f;
    p.min_p = -1.0f;
    CHECK(same_dist(&off, &p, small_logits, SV));
    /* and a truncating setting really differs (the check can fail) */
    p = off;
    p.top_k = 4;
    CHECK(!same_dist(&off, &p, small_logits, SV));
    /* top_k > vocab drawing: every token reachable */
    p = off;
    p.top_k = 1 << 20;
    p.temp = 5.0f;
    lm_sampler *s = sampler_new(&p, SV);
    CHECK(s);
    int seen[SV] = {0};
    float row[SV];
    for (int d = 0; d < 20000; d++) {
        memcpy(row, small_logits, sizeof row);
        int32_t t = sampler_sample(s, row);
        if (t >= 0 && t < SV) seen[t] = 1;
    }
    sampler_free(s);
    for (int i = 0; i < SV; i++) CHECKF(seen[i], "token %d never drawn", i);
}

/* NaN counts as -inf (never drawn); +inf takes all the mass. */
static void test_nonfinite(void) {
    lm_sample_params p;
    params_off(&p, 1.0f);
    lm_sampler *s = sampler_new(&p, 4);
    CHECK(s);
    long cnt[4] = {0};
    for (int d = 0; d < 50000; d++) {
        float row[4] = {NAN, 0.0f, 0.5f, NAN};
        int32_t t = sampler_sample(s, row);
        CHECK(t >= 0 && t < 4);
        cnt[t]++;
    }
    CHECKF(cnt[0] == 0 && cnt[3] == 0, "NaN tokens drawn %ld, %ld times", cnt[0], cnt[3]);
    double p2 = 1.0 / (1.0 + exp(-0.5)); /* P(token 2) */
    CHECKF(fabs((double)cnt[2] / 50000 - p2) < 0.01, "%g vs %g", (double)cnt[2] / 50000, p2);
    for (int d = 0; d < 1000; d++) {
        float row[4] = {1.0f, INFINITY, 3.0f, NAN};
        CHECK(sampler_sample(s, row) == 1);
    }
    float row[4] = {NAN, NAN, NAN, NAN};
    CHECK(sampler_sample(s, row) == -1);
    sampler_free(s);
    /* greedy skips NaN too */
    params_off(&p, 0.0f);
    s = sampler_new(&p, 4);
    CHECK(s);
    float g[4] = {1.0f, NAN, 0.5f, 0.9f};
    CHECK(sampler_sample(s, g) == 0);
    sampler_free(s);
}

/* Big rows: sampler_dist equals the reference set and probabilities. */
static int big_case(const float *x, int32_t V, const lm_sample_params *p, const char *what) {
    float *row = malloc(sizeof(float) * (size_t)V), *probs = malloc(sizeof(float) * (size_t)V);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)V);
    double *ref = malloc(sizeof(double) * (size_t)V);
    float *got = calloc((size_t)V, sizeof(float));
    lm_sampler *s = sampler_new(p, V);
    int ok = s != NULL;
    int32_t n = 0, nref = 0;
    double maxerr = 0;
    if (ok) {
        memcpy(row, x, sizeof(float) * (size_t)V);
        double t0 = lm_now();
        n = sampler_dist(s, row, ids, probs);
        double dt = lm_now() - t0;
        ref_dist(x, V, p, NULL, false, ref);
        for (int32_t i = 0; i < n; i++) got[ids[i]] = probs[i];
        for (int32_t i = 0; i < V; i++) {
            nref += ref[i] > 0;
            if ((ref[i] > 0) != (got[i] > 0)) ok = 0;
            maxerr = fmax(maxerr, fabs(got[i] - ref[i]));
        }
        ok = ok && n == nref && maxerr < 2e-6;
        printf("NOTE V=%d %-22s kept %d (ref %d), max |p-ref| %.2g, %.2f ms\n", V, what, n, nref, maxerr, dt * 1e3);
    }
    sampler_free(s);
    free(row);
    free(probs);
    free(ids);
    free(ref);
    free(got);
    return ok;
}

static void test_big_vocab(void) {
    const int32_t V = 262144;
    float *x = malloc(sizeof(float) * V);
    lm_rng r;
    lm_rng_seed(&r, 99);
    for (int32_t i = 0; i < V; i++) x[i] = lm_rng_normal(&r) * 2.5f;
    x[77] = x[78] = x[1000] = 9.0f; /* ties at the top */
    lm_sample_params p;
    params_off(&p, 0.8f);
    p.top_k = 40;
    CHECK(big_case(x, V, &p, "top_k 40"));
    params_off(&p, 0.8f);
    p.top_p = 0.9f;
    CHECK(big_case(x, V, &p, "top_p 0.9"));
    p.top_p = 0.3f;
    CHECK(big_case(x, V, &p, "top_p 0.3"));
    params_off(&p, 1.1f);
    p.min_p = 0.01f;
    CHECK(big_case(x, V, &p, "min_p 0.01"));
    sample_params_default(&p);
    CHECK(big_case(x, V, &p, "defaults"));
    params_off(&p, 1.0f);
    CHECK(big_case(x, V, &p, "no truncation"));
    params_off(&p, 0.7f); /* min-p after top-k, with many tokens near the cut */
    p.top_k = 2000;
    p.min_p = 0.05f;
    CHECK(big_case(x, V, &p, "top_k 2000, min_p 0.05"));
    /* many exact ties across the top-k and top-p cuts: lower ids win */
    for (int32_t i = 0; i < V; i++) x[i] = (float)((i * 7919) % 13) * 0.25f;
    params_off(&p, 1.0f);
    p.top_k = 50;
    CHECK(big_case(x, V, &p, "top_k 50, ties"));
    params_off(&p, 1.0f);
    p.top_p = 0.2f;
    CHECK(big_case(x, V, &p, "top_p 0.2, ties"));
    /* a flat tail that holds most of the mass: the top-p cut lands deep in it */
    for (int32_t i = 0; i < V; i++) x[i] = (float)(i % 997) * 1e-3f;
    for (int i = 0; i < 50; i++) x[(i * 5227) % V] = 8.0f + 0.01f * (float)i;
    params_off(&p, 1.0f);
    p.top_p = 0.7f;
    CHECK(big_case(x, V, &p, "top_p 0.7, flat tail"));
    p.top_p = 0.0f; /* keeps exactly the maximum */
    CHECK(big_case(x, V, &p, "top_p 0"));
    p.top_p = -3.0f; /* the same */
    CHECK(big_case(x, V, &p, "top_p -3"));
    free(x);
}

/* Drawing many times at V = 262144 stays inside the reference set. */
static void test_big_draws(void) {
    const int32_t V = 262144;
    float *x = malloc(sizeof(float) * V), *row = malloc(sizeof(float) * V);
    double *ref = malloc(sizeof(double) * V);
    lm_rng r;
    lm_rng_seed(&r, 5);
    for (int32_t i = 0; i < V; i++) x[i] = lm_rng_normal(&r) * 3.0f;
    lm_sample_params p;
    sample_params_default(&p);
    p.top_k = 0;
    p.min_p = 0.0f;
    p.top_p = 0.8f;
    ref_dist(x, V, &p, NULL, false, ref);
    lm_sampler *s = sampler_new(&p, V);
    CHECK(s);
    int bad = 0;
    double t0 = lm_now();
    for (int d = 0; d < 200; d++) {
        memcpy(row, x, sizeof(float) * V);
        int32_t t = sampler_sample(s, row);
        bad += t < 0 || ref[t] <= 0;
    }
    double dt = (lm_now() - t0) / 200;
    printf("NOTE V=%d top_p 0.8 only: %.2f ms per draw (with the row copy)\n", V, dt * 1e3);
    sampler_free(s);
    free(x);
    free(row);
    free(ref);
    CHECKF(bad == 0, "%d draws outside the top-p set", bad);
}

/* The plain walk the all-mode sampler must reproduce exactly: the same
 * float weights summed in double in token order, one uniform draw from an
 * RNG seeded as the sampler's, the first token whose running sum passes it
 * (the last positive weight if rounding leaves the draw past the sum). */
static int32_t plain_walk(const float *x, int32_t V, float temp, lm_rng *r) {
    float m = -INFINITY;
    int32_t best = -1;
    for (int32_t i = 0; i < V; i++)
        if (x[i] > m) m = x[i], best = i;
    float *w = malloc(sizeof(float) * (size_t)V);
    double sum = 0;
    for (int32_t i = 0; i < V; i++) {
        w[i] = x[i] == -INFINITY ? 0.0f : expf((x[i] - m) / temp);
        sum += (double)w[i];
    }
    double u = lm_rng_uniform(r) * sum, cum = 0;
    int32_t last = best;
    for (int32_t i = 0; i < V; i++) {
        if (w[i] <= 0.0f) continue;
        cum += (double)w[i];
        last = i;
        if (u < cum) break;
    }
    free(w);
    return last;
}

/* All mode (no truncation) draws by blocks of recorded running sums: the
 * same token as the plain walk, draw for draw, over vocabulary sizes around
 * the block size, rows whose mass sits in one late block, rows with whole
 * blocks banned, and 262,144 tokens. */
static void test_block_walk(void) {
    const int32_t Vs[] = {1, 7, 2047, 2048, 2049, 6144, 10001, 262144};
    int mismatch = 0, cases = 0;
    for (size_t vi = 0; vi < sizeof Vs / sizeof *Vs; vi++) {
        int32_t V = Vs[vi];
        float *x = malloc(sizeof(float) * (size_t)V), *row = malloc(sizeof(float) * (size_t)V);
        for (int shape = 0; shape < 3; shape++) {
            lm_rng g;
            lm_rng_seed(&g, 77 + (uint64_t)shape);
            for (int32_t i = 0; i < V; i++) {
                x[i] = lm_rng_normal(&g) * 2.0f;
                if (shape == 1 && i == V - 1) x[i] = 30.0f;              /* the mass in the last block */
                if (shape == 2 && (i / 2048) % 2 == 1) x[i] = -INFINITY; /* every other block banned */
            }
            for (int ti = 0; ti < 2; ti++) {
                lm_sample_params p;
                params_off(&p, ti ? 0.8f : 1.7f);
                p.seed = 900 + (uint64_t)vi;
                lm_sampler *s = sampler_new(&p, V);
                lm_rng ref;
                lm_rng_seed(&ref, p.seed);
                int n_draw = V > 100000 ? 40 : 300;
                for (int d = 0; d < n_draw; d++) {
                    memcpy(row, x, sizeof(float) * (size_t)V);
                    int32_t t = sampler_sample(s, row);
                    int32_t want = plain_walk(x, V, p.temp, &ref);
                    mismatch += t != want;
                    cases++;
                }
                sampler_free(s);
            }
        }
        free(x);
        free(row);
    }
    CHECKF(mismatch == 0, "%d of %d draws differ from the plain walk", mismatch, cases);
}

/* sampler_sample allocates nothing; sampler_new fails cleanly. */
static void test_no_alloc(void) {
    lm_sample_params p;
    sample_params_default(&p);
    p.repeat_penalty = 1.1f;
    for (long k = 0; k < 6; k++) {
        lm_alloc_fail_after(k);
        lm_sampler *s = sampler_new(&p, 1000);
        lm_alloc_fail_after(-1);
        sampler_free(s); /* NULL or complete */
    }
    lm_sampler *s = sampler_new(&p, 1000);
    CHECK(s);
    float row[1000];
    lm_alloc_fail_after(0); /* any allocation from now on fails */
    int32_t t = 0;
    for (int d = 0; d < 100 && t >= 0; d++) {
        for (int i = 0; i < 1000; i++) row[i] = (float)((i * 37) % 101) * 0.05f;
        t = sampler_sample(s, row);
        sampler_accept(s, t);
    }
    lm_alloc_fail_after(-1);
    sampler_free(s);
    CHECK(t >= 0);
    CHECK(sampler_new(&p, 0) == NULL);
}

static void test_log_softmax(void) {
    enum { N = 9 };
    float x[N] = {1000.0f, 999.0f, -INFINITY, 0.0f, NAN, 998.5f, -1000.0f, 1000.0f, 990.0f};
    float out[N];
    sample_log_softmax(x, N, out);
    double m = 1000.0, z = 0;
    for (int i = 0; i < N; i++)
        if (!isnan(x[i])) z += exp((double)x[i] - m);
    for (int i = 0; i < N; i++) {
        double want = isnan(x[i]) ? -INFINITY : (double)x[i] - m - log(z);
        if (isinf(want)) CHECKF(out[i] == -INFINITY, "%d: %g", i, out[i]);
        else CHECKF(fabs(out[i] - want) <= 1e-6 * fmax(1.0, fabs(want)), "%d: %g vs %g", i, out[i], want);
    }
    /* probabilities sum to 1 */
    double s = 0;
    for (int i = 0; i < N; i++) s += exp((double)out[i]);
    CHECKF(fabs(s - 1.0) < 1e-6, "sum %g", s);
    /* in place, tiny magnitudes */
    float y[3] = {1e-30f, -1e-30f, 0.0f};
    sample_log_softmax(y, 3, y);
    for (int i = 0; i < 3; i++) CHECKF(fabs(y[i] + log(3.0)) < 1e-6, "%g", y[i]);
    float nothing[2] = {-INFINITY, NAN};
    sample_log_softmax(nothing, 2, out);
    CHECK(out[0] == -INFINITY && out[1] == -INFINITY);
}

static void test_top_n(void) {
    const int32_t V = 5000;
    float *x = malloc(sizeof(float) * V);
    lm_rng r;
    lm_rng_seed(&r, 3);
    for (int32_t i = 0; i < V; i++) x[i] = (float)(lm_rng_u64(&r) % 300) * -0.1f; /* many ties */
    x[4000] = NAN;
    double *key = malloc(sizeof(double) * V);
    int32_t *ord = malloc(sizeof(int32_t) * V);
    for (int32_t i = 0; i < V; i++) {
        key[i] = isnan(x[i]) ? -INFINITY : x[i];
        ord[i] = i;
    }
    sort_key = key;
    qsort(ord, V, sizeof *ord, cmp_desc);
    int32_t ids[64];
    float vals[64];
    int k = sample_top_n(x, V, 20, ids, vals);
    CHECK(k == 20);
    for (int i = 0; i < k; i++)
        CHECKF(ids[i] == ord[i] && vals[i] == x[ord[i]], "rank %d: %d vs %d", i, ids[i], ord[i]);
    /* n larger than the vocabulary: everything, sorted; NaN last as -inf */
    float y[5] = {-2.0f, NAN, -0.5f, -0.5f, -9.0f};
    k = sample_top_n(y, 5, 64, ids, vals);
    CHECK(k == 5);
    const int32_t want[5] = {2, 3, 0, 4, 1};
    for (int i = 0; i < 5; i++) CHECKF(ids[i] == want[i], "rank %d: %d", i, ids[i]);
    CHECK(vals[4] == -INFINITY);
    CHECK(sample_top_n(y, 5, 0, ids, vals) == 0);
    free(x);
    free(key);
    free(ord);
}

/* ---- the sparse path ------------------------------------------------------ */

/* sampler_sample_sparse over a mask's allowed ids gives the token that
 * sampler_sample gives on the row with every other token at -INFINITY, for
 * every sampling configuration, seed, mask density and run of draws (the
 * RNG and the penalty history stay in step: 12 consecutive draws, each
 * token accepted into both samplers' histories). Rows have ties, NaN and
 * +INFINITY entries; biases include bans of allowed tokens and +INFINITY. */
static void test_sparse_matches_dense(void) {
    static const int32_t Vs[] = {7, 600, 5000};
    static const double dens[] = {0.004, 0.05, 0.5, 0.97, 1.0};
    lm_rng rng;
    lm_rng_seed(&rng, 2024);
    long compared = 0, mismatches = 0;
    for (int vi = 0; vi < 3; vi++) {
        int32_t V = Vs[vi];
        float *row = malloc((size_t)V * sizeof *row), *dense = malloc((size_t)V * sizeof *row);
        float *scratch = malloc((size_t)V * sizeof *row);
        int32_t *ids = malloc((size_t)V * sizeof *ids);
        for (int cfg = 0; cfg < 24; cfg++) {
            lm_sample_params p;
            params_off(&p, (cfg % 6 == 0) ? 0.0f : 0.3f + 0.25f * (float)(cfg % 5));
            if (cfg & 1) p.top_k = 1 + (int32_t)(lm_rng_u64(&rng) % 60);
            if (cfg & 2) p.top_p = 0.5f + 0.45f * (float)lm_rng_uniform(&rng);
            if (cfg & 4) p.min_p = 0.02f + 0.2f * (float)lm_rng_uniform(&rng);
            if (cfg & 8) {
                p.repeat_penalty = 1.3f;
                p.freq_penalty = 0.4f;
                p.presence_penalty = 0.2f;
                p.repeat_last_n = (cfg & 16) ? -1 : 5;
            }
            for (int di = 0; di < 5; di++) {
                for (uint64_t seed = 1; seed <= 4; seed++) {
                    p.seed = seed * 7919 + (uint64_t)cfg;
                    lm_sampler *a = sampler_new(&p, V), *b = sampler_new(&p, V);
                    CHECK(a && b);
                    if (cfg % 3 == 1) /* biases: some bans, some boosts, one +inf */
                        for (int k = 0; k < 6; k++) {
                            int32_t t = (int32_t)(lm_rng_u64(&rng) % (uint64_t)V);
                            float bias = k == 0 ? -INFINITY : k == 1 ? INFINITY : (float)lm_rng_normal(&rng);
                            if (k == 1 && seed != 2) continue;
                            sampler_set_bias(a, t, bias);
                            sampler_set_bias(b, t, bias);
                        }
                    for (int h = 0; h < 3; h++) { /* a prompt history */
                        int32_t t = (int32_t)(lm_rng_u64(&rng) % (uint64_t)V);
                        sampler_accept(a, t);
                        sampler_accept(b, t);
                    }
                    for (int draw = 0; draw < 12; draw++) {
                        for (int32_t i = 0; i < V; i++) { /* coarse values: many ties */
                            row[i] = (float)(int)(4.0 * lm_rng_normal(&rng)) * 0.5f;
                            uint64_t r = lm_rng_u64(&rng) % 1000;
                            if (r == 0) row[i] = NAN;
                            else if (r == 1 && draw % 4 == 3) row[i] = INFINITY;
                        }
                        int32_t n = 0;
                        for (int32_t i = 0; i < V; i++)
                            if (lm_rng_uniform(&rng) < dens[di]) ids[n++] = i;
                        memcpy(dense, row, (size_t)V * sizeof *row);
                        for (int32_t i = 0, j = 0; i < V; i++) {
                            if (j < n && ids[j] == i) j++;
                            else dense[i] = -INFINITY;
                        }
                        int32_t td = sampler_sample(a, dense);
                        int32_t ts = sampler_sample_sparse(b, row, ids, n, scratch);
                        compared++;
                        if (td != ts) {
                            if (mismatches++ < 5)
                                CHECKF(0, "V %d cfg %d density %g seed %llu draw %d: dense %d, sparse %d", V, cfg,
                                       dens[di], (unsigned long long)seed, draw, td, ts);
                            break;
                        }
                        if (td < 0) continue;
                        sampler_accept(a, td);
                        sampler_accept(b, ts);
                    }
                    sampler_free(a);
                    sampler_free(b);
                }
            }
        }
        free(row);
        free(dense);
        free(scratch);
        free(ids);
    }
    CHECKF(mismatches == 0, "%ld of %ld draws differ", mismatches, compared);
    /* sparse rows the sampler reads and never writes; nothing listed: -1 */
    lm_sample_params p;
    params_off(&p, 1.0f);
    lm_sampler *s = sampler_new(&p, 4);
    float row[4] = {1.0f, 2.0f, 3.0f, 4.0f}, scratch[4];
    const int32_t two[2] = {0, 2};
    int32_t t = sampler_sample_sparse(s, row, two, 2, scratch);
    CHECK(t == 0 || t == 2);
    CHECK(row[0] == 1.0f && row[2] == 3.0f);
    CHECK(sampler_sample_sparse(s, row, two, 0, scratch) == -1);
    sampler_set_bias(s, 0, -INFINITY);
    sampler_set_bias(s, 2, -INFINITY);
    CHECK(sampler_sample_sparse(s, row, two, 2, scratch) == -1);
    sampler_free(s);
}

int main(void) {
    TEST_RUN(test_greedy_argmax);
    TEST_RUN(test_determinism);
    TEST_RUN(test_block_walk);
    TEST_RUN(test_empirical_temp);
    TEST_RUN(test_empirical_top_k);
    TEST_RUN(test_empirical_top_p);
    TEST_RUN(test_empirical_min_p);
    TEST_RUN(test_empirical_combined);
    TEST_RUN(test_penalties_exact);
    TEST_RUN(test_banned);
    TEST_RUN(test_noops);
    TEST_RUN(test_nonfinite);
    TEST_RUN(test_big_vocab);
    TEST_RUN(test_big_draws);
    TEST_RUN(test_no_alloc);
    TEST_RUN(test_log_softmax);
    TEST_RUN(test_top_n);
    TEST_RUN(test_sparse_matches_dense);
    return TEST_DONE();
}
