/*
 * spec.c - the prompt-lookup proposer and the proposal-size controller of
 * speculative decoding (see spec.h for what each does and why).
 *
 * The search walks candidate start positions from the most recent backwards
 * and stops at the first full match of the suffix, so a sequence that
 * repeats itself proposes its latest repetition. A match must leave at least
 * one token after it, and may overlap the suffix itself. The proposal copies
 * the tokens that followed the match and, where those run out at the end of
 * the sequence, goes on copying its own output: text repeating with a period
 * p (matched p tokens back) is proposed k tokens ahead, "a a a a" as "a a a".
 */
#include "decode/spec.h"

#include <stdbool.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

int spec_ngram_propose(const int32_t *toks, int n, int k, int32_t *out) {
    if (k <= 0 || n < 2) return 0;
    for (int g = SPEC_NGRAM_MAX; g >= SPEC_NGRAM_MIN; g--) {
        if (g >= n) continue;
        const int32_t *suf = toks + n - g;
        /* the match toks[i .. i+g) ends before the suffix's last token, so
         * at least toks[i+g] follows it */
        for (int i = n - g - 1; i >= 0; i--) {
            if (toks[i + g - 1] != suf[g - 1] || memcmp(toks + i, suf, (size_t)g * sizeof *toks) != 0) continue;
            /* copy what followed; past the end, the copy goes on from its
             * own output (a period shorter than k repeats) */
            for (int j = 0; j < k; j++) {
                int src = i + g + j;
                out[j] = src < n ? toks[src] : out[src - n];
            }
            return k;
        }
    }
    return 0;
}

void spec_ctl_init(spec_ctl *c) {
    c->acc = SPEC_ACC_START;
    c->idle = 0;
    c->every = c->every_min = c->every_max = SPEC_PROBE_EVERY;
    c->cost = 0;
    c->probing = 0;
}

float spec_gain(float a, int k, float cost) {
    float tokens = 1, reach = 1;
    for (int i = 0; i < k; i++) tokens += reach *= a;
    return tokens / (1.0f + (float)k * (cost + SPEC_ROW_COST));
}

/* The cost model's k (0: a plain step pays best) at acceptance a. */
static int best_k(float a, int k_max, float cost) {
    int k = 0;
    float best = 1.0f + SPEC_MIN_GAIN;
    for (int i = 1; i <= k_max; i++) {
        float g = spec_gain(a, i, cost);
        if (g > best) best = g, k = i;
    }
    return k;
}

int spec_ctl_want(spec_ctl *c, int k_max) {
    int k = 0;
    if (c->cost > 0) {
        k = best_k(c->acc, k_max, c->cost);
        if (k == 0 && k_max > 0 && best_k(1.0f, k_max, c->cost) == 0) return 0; /* it could never pay */
    } else {
        for (float reach = c->acc; k < k_max && reach >= SPEC_MIN_REACH; reach *= c->acc) k++;
    }
    c->probing = 0;
    if (k > 0 || k_max <= 0) {
        c->idle = 0;
        return k;
    }
    /* the estimate says no: probe now and then, or it could never recover */
    if (++c->idle >= c->every) {
        c->idle = 0;
        c->probing = 1;
        return 1;
    }
    return 0;
}

void spec_ctl_update(spec_ctl *c, int proposed, int accepted) {
    /* one outcome per position reached: accepted ones, then the rejection */
    bool probe = c->cost > 0 ? best_k(c->acc, proposed > 1 ? proposed : 1, c->cost) == 0 : c->acc < SPEC_MIN_REACH;
    for (int i = 0; i < accepted; i++) c->acc += SPEC_EMA * (1.0f - c->acc);
    if (accepted < proposed) c->acc -= SPEC_EMA * c->acc;
    /* the cost model: a probe after which the estimate still says no
     * backs off, accepted or not (its restart is the expensive part) */
    bool failed = c->cost > 0 ? probe && best_k(c->acc, proposed > 1 ? proposed : 1, c->cost) == 0 : accepted == 0;
    if (!failed && accepted > 0) c->every = c->every_min;
    else if (failed && probe && proposed > 0 && c->every < c->every_max)
        c->every = 2 * c->every < c->every_max ? 2 * c->every : c->every_max;
}

/* ---- the batch's width ---------------------------------------------------- */

float spec_curve_at(const spec_curve *c, int rows) {
    if (rows < 1) rows = 1;
    if (!c || c->n <= 0) return 1.0f + (float)(rows - 1) * SPEC_ROW_COST;
    if (c->n == 1) return c->t[0];
    int i = 1;
    while (i < c->n - 1 && c->w[i] < rows) i++;
    /* the segment (i - 1, i): rows inside it, or past the last point */
    float x0 = (float)c->w[i - 1], x1 = (float)c->w[i], y0 = c->t[i - 1], y1 = c->t[i];
    if (rows <= c->w[i - 1]) return y0;
    return y0 + (y1 - y0) * ((float)rows - x0) / (x1 - x0);
}

int spec_curve_fix(spec_curve *c, char *err, size_t errlen) {
    if (c->n <= 0 || c->n > SPEC_CURVE_MAX)
        return lm_err(err, errlen, "a width curve has 1 to %d points", SPEC_CURVE_MAX);
    for (int i = 1; i < c->n; i++) /* insertion sort by width */
        for (int j = i; j > 0 && c->w[j] < c->w[j - 1]; j--) {
            int w = c->w[j];
            float t = c->t[j];
            c->w[j] = c->w[j - 1], c->t[j] = c->t[j - 1];
            c->w[j - 1] = w, c->t[j - 1] = t;
        }
    int m = 0;
    for (int i = 0; i < c->n; i++) {
        if (c->w[i] < 1 || !(c->t[i] > 0) || !isfinite(c->t[i]))
            return lm_err(err, errlen, "a width curve's point %d:%g is not a width >= 1 and a time > 0", c->w[i],
                          (double)c->t[i]);
        if (m > 0 && c->w[m - 1] == c->w[i]) {
            if (c->t[i] < c->t[m - 1]) c->t[m - 1] = c->t[i]; /* the least of repeated widths */
            continue;
        }
        c->w[m] = c->w[i], c->t[m++] = c->t[i];
    }
    c->n = m;
    if (c->w[0] != 1) return lm_err(err, errlen, "a width curve needs the time of one row (width 1)");
    float t1 = c->t[0];
    for (int i = 0; i < c->n; i++) {
        c->t[i] /= t1;
        if (i > 0 && c->t[i] < c->t[i - 1]) c->t[i] = c->t[i - 1];
    }
    return 0;
}

int spec_curve_parse(const char *s, spec_curve *c, char *err, size_t errlen) {
    c->n = 0;
    const char *p = s ? s : "";
    while (*p) {
        if (c->n == SPEC_CURVE_MAX) return lm_err(err, errlen, "a width curve has at most %d points", SPEC_CURVE_MAX);
        char *end;
        long w = strtol(p, &end, 10);
        if (end == p || *end != ':' || w < 1 || w > 1000000)
            return lm_err(err, errlen, "a width curve is W:T,W:T,... (at '%.20s')", p);
        p = end + 1;
        float t = strtof(p, &end);
        if (end == p || (*end && *end != ','))
            return lm_err(err, errlen, "a width curve is W:T,W:T,... (at '%.20s')", p);
        if (*end == ',' && !end[1]) return lm_err(err, errlen, "a width curve ends with a point, not a comma");
        c->w[c->n] = (int)w;
        c->t[c->n++] = t;
        p = *end ? end + 1 : end;
    }
    return spec_curve_fix(c, err, errlen);
}

/* Expected tokens over time of the sizes in w[] (see spec.h). */
static double batch_rate(const spec_want *w, int n, int rows, int n_dec, const spec_curve *model, float draft_cost,
                         const spec_curve *draft) {
    double tokens = n_dec, time;
    int K = 0, kmax = 0;
    for (int i = 0; i < n; i++) {
        float reach = 1;
        for (int j = 0; j < w[i].k; j++) tokens += reach *= w[i].acc;
        K += w[i].k;
        if (w[i].k > kmax) kmax = w[i].k;
    }
    time = spec_curve_at(model, rows + K);
    for (int p = 1; draft_cost > 0 && p <= kmax; p++) { /* draft pass p: the sequences guessing at least p */
        int width = 0;
        for (int i = 0; i < n; i++) width += w[i].k < p ? 0 : p == 1 && w[i].feed > 1 ? w[i].feed : 1;
        time += (double)draft_cost * (draft ? spec_curve_at(draft, width) : 1.0f);
    }
    return tokens / time;
}

/* The sequence whose next guess is the likeliest to be reached (reach
 * acc^(k + 1); ties to the first), or -1 when none may add one. */
static int next_pick(const spec_want *w, int n) {
    int pick = -1;
    float reach = -1;
    for (int i = 0; i < n; i++) {
        if (w[i].probe || w[i].k >= w[i].k_max) continue;
        float r = powf(w[i].acc, (float)(w[i].k + 1));
        if (r > reach) reach = r, pick = i;
    }
    return pick;
}

int spec_size_batch(spec_want *w, int n, int rows, int n_dec, const spec_curve *model, float draft_cost,
                    const spec_curve *draft) {
    if (rows < 1) rows = 1;
    int sum = 0;
    for (int i = 0; i < n; i++) sum += w[i].k = w[i].probe ? w[i].k_max : 0;
    double best = batch_rate(w, n, rows, n_dec, model, draft_cost, draft) * (1.0 + SPEC_MIN_GAIN);
    /* add guesses most likely first and keep the best prefix of that order */
    int added = 0, best_added = 0;
    for (int pick; (pick = next_pick(w, n)) >= 0;) {
        w[pick].k++;
        added++;
        double rate = batch_rate(w, n, rows, n_dec, model, draft_cost, draft);
        if (rate > best) best = rate, best_added = added;
    }
    for (int i = 0; i < n; i++) w[i].k = w[i].probe ? w[i].k_max : 0;
    for (int i = 0; i < best_added; i++) w[next_pick(w, n)].k++;
    return sum + best_added;
}

/* ---- the measured guard -------------------------------------------------- */

void spec_guard_init(spec_guard *g) {
    memset(g, 0, sizeof *g);
    for (int i = 0; i < SPEC_GUARD_BUCKETS; i++) g->b[i].off = SPEC_GUARD_OFF_MIN;
}

int spec_guard_bucket(int width) {
    int b = 0;
    for (int w = 1; w < width && b < SPEC_GUARD_BUCKETS - 1; w *= 2) b++;
    return b;
}

bool spec_guard_allow(spec_guard *g, int width) {
    spec_guard_width *b = &g->b[spec_guard_bucket(width)];
    g->step++;
    if (g->step < b->off_until) return false;      /* it lost: an interval without */
    if (b->n_plain < SPEC_GUARD_MIN) return false; /* the baseline first */
    return b->since_plain < SPEC_GUARD_REFRESH;    /* else one plain step refreshes it */
}

static void ema(double *avg, int *n, double x) {
    *avg = *n == 0 ? x : *avg + SPEC_GUARD_EMA * (x - *avg);
    (*n)++;
}

void spec_guard_record(spec_guard *g, int width, bool spec, double seconds, int tokens) {
    if (tokens <= 0 || !(seconds >= 0)) return;
    spec_guard_width *b = &g->b[spec_guard_bucket(width)];
    double per = seconds / tokens;
    if (!spec) {
        ema(&b->t_plain, &b->n_plain, per);
        b->since_plain = 0;
        return;
    }
    ema(&b->t_spec, &b->n_spec, per);
    b->since_plain++;
    if (b->n_spec < SPEC_GUARD_MIN || b->n_plain < SPEC_GUARD_MIN) return;
    if (b->t_spec > b->t_plain) { /* losing: stop for an interval, then measure afresh */
        b->off_until = g->step + (uint64_t)b->off;
        b->off = b->off * 2 > SPEC_GUARD_OFF_MAX ? SPEC_GUARD_OFF_MAX : b->off * 2;
        b->n_spec = 0;
        b->t_spec = 0;
    } else {
        b->off = SPEC_GUARD_OFF_MIN;
    }
}
