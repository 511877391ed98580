/*
 * sample.c - the sampler: logits row -> next token (see sample.h for the
 * order of operations and the treatment of non-finite values).
 *
 * Pipeline of one call, V = n_vocab:
 *   1. bias (dense add, only when some bias is set), penalties over the
 *      distinct tokens of the history, then one pass that sanitizes
 *      (NaN -> -inf, +inf -> FLT_MAX) and finds the first maximum m and the
 *      number of finite tokens. Greedy stops here.
 *   2. Truncation. The survivors live either implicitly in the logits row
 *      ("all" mode: every finite token) or explicitly in the candidate array
 *      `cand` (id, logit). Every stage keeps the maximum, so m stays the
 *      maximum of the survivors throughout:
 *        top-k  bounded min-heap over the row, ties to the lower id;
 *        top-p  the smallest prefix (in the order below) whose softmax mass
 *               reaches top_p. In all mode only tokens with
 *               p >= (1 - top_p) / V are gathered: the rest together hold
 *               less than 1 - top_p, so the cut falls among the gathered
 *               ones. Large sets are bucketed by logit into bins; bins
 *               wholly above the crossing bin are kept unsorted and only
 *               the crossing bin goes through a max-heap, popped until the
 *               mass is reached. (Every shortcut is verified; if rounding
 *               defeats one, every finite token is heaped and popped.)
 *        min-p  keep logit - m >= log(min_p) (the ratio p / p_max >= min_p).
 *   3. Temperature and softmax: weights w = exp((l - m) / T) written over the
 *      survivors' logits, summed in double; a uniform draw in [0, sum) walks
 *      the cumulative weights in the survivors' (deterministic) order. In all
 *      mode the running sum is recorded at the end of every CK_BLOCK tokens
 *      (ck[]), and the walk starts at the block where it crosses the draw:
 *      the same double additions in the same order, so the same token as a
 *      walk from the start, after ~CK_BLOCK steps instead of ~V / 2.
 *
 * Total order used for every tie: larger logit first, then lower id. So the
 * top-k and top-p sets are uniquely defined and independent of heap order.
 *
 * History for penalties: `counts[tok]` holds occurrences in the window. With
 * a finite window the last `repeat_last_n` tokens sit in a ring; with the
 * whole history (-1) the distinct tokens are listed in order of first use.
 * Either way penalties touch O(window) entries, not O(V).
 *
 * Memory, allocated once in sampler_new: cand (8 B x V), bias (4 B x V),
 * ck (8 B x V / CK_BLOCK),
 * counts (4 B x V) and the history (4 B x window, or x V for the whole
 * history) when penalties are on.
 */
#include "decode/sample.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* Tokens per recorded running sum of the all-mode weights. */
#define CK_BLOCK 2048

typedef struct {
    float l; /* logit, later the unnormalized weight */
    int32_t id;
} cand_t;

struct lm_sampler {
    lm_sample_params p; /* sanitized copy */
    int32_t n_vocab;
    lm_rng rng;
    bool greedy;
    bool penalize;    /* some penalty active and a non-empty window */
    int32_t n_biased; /* tokens whose bias is non-zero */
    float *bias;      /* (n_vocab) additive bias */
    uint32_t *counts; /* (n_vocab) occurrences in the window; NULL if !penalize */
    int32_t *hist;    /* window > 0: ring (window); window < 0: distinct tokens (n_vocab) */
    int32_t hist_cap;
    int32_t hist_len;
    int32_t hist_head; /* ring: index of the oldest entry once full */
    cand_t *cand;      /* (n_vocab) scratch candidates */
    double *ck;        /* (n_vocab / CK_BLOCK + 1) all mode: running weight sum at each block's end */
};

/* Result of truncation + temperature: weights either in the logits row
 * (all mode, zero for non-survivors) or in cand[0..n). */
typedef struct {
    bool all;
    int32_t n;
    double sum;
    int32_t last; /* all mode: the last token with a positive weight, or -1 */
} dist_t;

void sample_params_default(lm_sample_params *p) {
    p->temp = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->freq_penalty = 0.0f;
    p->presence_penalty = 0.0f;
    p->seed = 0;
}

lm_sampler *sampler_new(const lm_sample_params *p, int32_t n_vocab) {
    if (!p || n_vocab <= 0) return NULL;
    lm_sampler *s = lm_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->p = *p;
    s->n_vocab = n_vocab;
    if (!(s->p.repeat_penalty > 0.0f) || !isfinite(s->p.repeat_penalty)) s->p.repeat_penalty = 1.0f;
    if (!isfinite(s->p.freq_penalty)) s->p.freq_penalty = 0.0f;
    if (!isfinite(s->p.presence_penalty)) s->p.presence_penalty = 0.0f;
    if (s->p.repeat_last_n < -1) s->p.repeat_last_n = -1;
    if (s->p.top_p < 0.0f) s->p.top_p = 0.0f; /* keeps the maximum alone, as 0 does */
    s->greedy = !(s->p.temp > 0.0f);          /* NaN too */
    s->penalize = s->p.repeat_last_n != 0 &&
        (s->p.repeat_penalty != 1.0f || s->p.freq_penalty != 0.0f || s->p.presence_penalty != 0.0f);

    s->bias = lm_calloc((size_t)n_vocab, sizeof *s->bias);
    s->cand = lm_malloc((size_t)n_vocab * sizeof *s->cand);
    s->ck = lm_malloc(((size_t)n_vocab / CK_BLOCK + 1) * sizeof *s->ck);
    if (!s->bias || !s->cand || !s->ck) goto err;
    if (s->penalize) {
        s->hist_cap = s->p.repeat_last_n > 0 ? s->p.repeat_last_n : n_vocab;
        s->counts = lm_calloc((size_t)n_vocab, sizeof *s->counts);
        s->hist = lm_malloc((size_t)s->hist_cap * sizeof *s->hist);
        if (!s->counts || !s->hist) goto err;
    }
    lm_rng_seed(&s->rng, s->p.seed);
    return s;
err:
    sampler_free(s);
    return NULL;
}

void sampler_free(lm_sampler *s) {
    if (!s) return;
    lm_free(s->bias);
    lm_free(s->cand);
    lm_free(s->ck);
    lm_free(s->counts);
    lm_free(s->hist);
    lm_free(s);
}

void sampler_reset(lm_sampler *s) {
    if (s->counts) memset(s->counts, 0, (size_t)s->n_vocab * sizeof *s->counts);
    s->hist_len = 0;
    s->hist_head = 0;
    lm_rng_seed(&s->rng, s->p.seed);
}

void sampler_accept(lm_sampler *s, int32_t tok) {
    if (!s->penalize || tok < 0 || tok >= s->n_vocab) return;
    if (s->p.repeat_last_n < 0) {
        /* whole history: list each token once, at its first use */
        if (s->counts[tok] == 0) s->hist[s->hist_len++] = tok; /* <= n_vocab distinct */
        if (s->counts[tok] < UINT32_MAX) s->counts[tok]++;
        return;
    }
    if (s->hist_len < s->hist_cap) {
        s->hist[s->hist_len++] = tok;
    } else { /* full ring: the oldest token leaves the window */
        s->counts[s->hist[s->hist_head]]--;
        s->hist[s->hist_head] = tok;
        s->hist_head = (s->hist_head + 1) % s->hist_cap;
    }
    s->counts[tok]++;
}

void sampler_copy_history(lm_sampler *dst, const lm_sampler *src) {
    if (!dst->penalize || !src->penalize || dst->n_vocab != src->n_vocab || dst->hist_cap != src->hist_cap ||
        dst->p.repeat_last_n != src->p.repeat_last_n)
        return;
    /* O(window): clear dst's counted tokens, then take src's */
    for (int32_t i = 0; i < dst->hist_len; i++) dst->counts[dst->hist[i]] = 0;
    memcpy(dst->hist, src->hist, (size_t)src->hist_len * sizeof *dst->hist);
    dst->hist_len = src->hist_len;
    dst->hist_head = src->hist_head;
    for (int32_t i = 0; i < src->hist_len; i++) dst->counts[src->hist[i]] = src->counts[src->hist[i]];
}

void sampler_set_bias(lm_sampler *s, int32_t tok, float bias) {
    if (tok < 0 || tok >= s->n_vocab) return;
    if (isnan(bias)) bias = 0.0f;
    bool was = s->bias[tok] != 0.0f, now = bias != 0.0f;
    s->n_biased += (int32_t)now - (int32_t)was;
    s->bias[tok] = bias;
}

int32_t sample_argmax(const float *x, int32_t n) {
    int32_t best = -1;
    for (int32_t i = 0; i < n; i++) {
        if (isnan(x[i])) continue;
        if (best < 0 || x[i] > x[best]) best = i;
    }
    return best;
}

/* ---- step 1: bias, penalties, sanitizing ---------------------------------- */

/* llama.cpp repetition penalty, then OpenAI frequency / presence penalty. */
static float penalize(const lm_sample_params *p, float l, uint32_t count) {
    if (l <= 0.0f) l *= p->repeat_penalty;
    else l /= p->repeat_penalty;
    return l - (float)count * p->freq_penalty - p->presence_penalty;
}

static void apply_penalties(lm_sampler *s, float *logits) {
    if (s->p.repeat_last_n < 0) {
        for (int32_t i = 0; i < s->hist_len; i++) {
            int32_t t = s->hist[i];
            logits[t] = penalize(&s->p, logits[t], s->counts[t]);
        }
        return;
    }
    /* A ring may hold a token several times: penalize it once, marking it
     * done by setting the top bit of its count, then clear the marks. */
    const uint32_t mark = 0x80000000u;
    for (int32_t i = 0; i < s->hist_len; i++) {
        int32_t t = s->hist[i];
        if (s->counts[t] & mark) continue;
        logits[t] = penalize(&s->p, logits[t], s->counts[t]);
        s->counts[t] |= mark;
    }
    for (int32_t i = 0; i < s->hist_len; i++) s->counts[s->hist[i]] &= ~mark;
}

/* The index of token t in the ascending ids[0..n), -1 when absent. */
static int32_t find_id(const int32_t *ids, int32_t n, int32_t t) {
    int32_t lo = 0, hi = n - 1;
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (ids[mid] < t) lo = mid + 1;
        else if (ids[mid] > t) hi = mid - 1;
        else return mid;
    }
    return -1;
}

/* Penalties on a sparse row: entry j is token ids[j]; tokens of the
 * history that are not in ids are skipped (on a dense row they are
 * -INFINITY, which a penalty leaves as it is). */
static void apply_penalties_sparse(lm_sampler *s, float *x, const int32_t *ids, int32_t n) {
    const uint32_t mark = 0x80000000u;
    bool ring = s->p.repeat_last_n >= 0;
    for (int32_t i = 0; i < s->hist_len; i++) {
        int32_t t = s->hist[i];
        if (ring && (s->counts[t] & mark)) continue;
        int32_t j = find_id(ids, n, t);
        if (j >= 0) x[j] = penalize(&s->p, x[j], s->counts[t] & ~mark);
        if (ring) s->counts[t] |= mark;
    }
    if (ring)
        for (int32_t i = 0; i < s->hist_len; i++) s->counts[s->hist[i]] &= ~mark;
}

/* Bias, penalties and the sanitizing pass over a row of n entries, entry j
 * being token ids[j] (ids NULL: token j, n = n_vocab). Returns the first
 * index of the maximum (-1 if no token is finite) and the number of finite
 * tokens. */
static int32_t preprocess(lm_sampler *s, float *logits, int32_t n, const int32_t *ids, int32_t *n_finite) {
    if (s->n_biased > 0) {
        if (ids)
            for (int32_t j = 0; j < n; j++) logits[j] += s->bias[ids[j]];
        else
            for (int32_t i = 0; i < n; i++) logits[i] += s->bias[i];
    }
    if (s->penalize) {
        if (ids) apply_penalties_sparse(s, logits, ids, n);
        else apply_penalties(s, logits);
    }
    int32_t best = -1, nf = 0;
    float m = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        float l = logits[i];
        if (isnan(l)) l = logits[i] = -INFINITY;
        else if (l == INFINITY) l = logits[i] = FLT_MAX;
        if (l == -INFINITY) continue;
        nf++;
        if (l > m) {
            m = l;
            best = i;
        }
    }
    *n_finite = nf;
    return best;
}

/* ---- heaps over candidates ------------------------------------------------ */

/* The total order of the sampler: larger logit first, then lower id. */
static inline bool better(cand_t a, cand_t b) { return a.l > b.l || (a.l == b.l && a.id < b.id); }

/* Restore the heap property below i. max_heap: the root is the best
 * candidate; otherwise the root is the worst. */
static void sift_down(cand_t *h, int32_t n, int32_t i, bool max_heap) {
    cand_t x = h[i];
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && (max_heap ? better(h[c + 1], h[c]) : better(h[c], h[c + 1]))) c++;
        if (!(max_heap ? better(h[c], x) : better(x, h[c]))) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
}

static void heapify(cand_t *h, int32_t n, bool max_heap) {
    for (int32_t i = n / 2 - 1; i >= 0; i--) sift_down(h, n, i, max_heap);
}

/* ---- step 2: truncation --------------------------------------------------- */

/* The k best finite tokens of the row into c (heap order); returns their
 * number (fewer than k when fewer are finite). Ids are visited in ascending
 * order, so a later token with an equal logit is worse and never enters. */
static int32_t top_k_select(const float *logits, int32_t V, int32_t k, cand_t *c) {
    int32_t n = 0, i = 0;
    for (; i < V && n < k; i++)
        if (logits[i] != -INFINITY) c[n++] = (cand_t){logits[i], i};
    if (n < k) return n;
    heapify(c, n, false);
    /* Tight loop: most tokens lose to the current k-th best at once. The
     * root is finite, so -INFINITY never enters. */
    float worst = c[0].l;
    for (; i < V; i++) {
        if (!(logits[i] > worst)) continue;
        c[0] = (cand_t){logits[i], i};
        sift_down(c, n, 0, false);
        worst = c[0].l;
    }
    return n;
}

/* Pop a max-heap of n candidates until the popped softmax mass (temperature
 * 1, maximum m) reaches target; move the popped ones to the front. Returns
 * their number, or -1 when the heap ran dry first. */
static int32_t top_p_pop(cand_t *c, int32_t n, float m, double target) {
    heapify(c, n, true);
    double cum = 0.0;
    int32_t left = n;
    while (left > 0) {
        cand_t top = c[0];
        c[0] = c[left - 1];
        c[left - 1] = top;
        left--;
        sift_down(c, left, 0, true);
        cum += (double)expf(top.l - m);
        if (cum >= target) break;
    }
    if (cum < target) return -1;
    int32_t kept = n - left;
    memmove(c, c + left, (size_t)kept * sizeof *c);
    return kept;
}

/* Top-p cut of c[0..n) without ordering all of it: bucket the candidates
 * by logit into TOP_P_BINS equal-width bins (bin 0 holds the largest logits;
 * the bin index is monotone in the logit, so every token of a lower bin is
 * strictly better than every token of a higher one), find the bin where the
 * cumulative mass crosses target, keep the bins before it whole and pop only
 * that bin's tokens from a heap. Expected O(n + b log b), b the crossing
 * bin's size. Same contract as top_p_pop. */
#define TOP_P_BINS 1024
#define TOP_P_DIRECT 2048 /* below this many candidates a heap alone is as fast */

static int32_t top_p_cut(cand_t *c, int32_t n, float m, double target) {
    float lo = m;
    for (int32_t i = 0; i < n; i++) lo = fminf(lo, c[i].l);
    double range = (double)m - (double)lo;
    if (n <= TOP_P_DIRECT || !(range > 0.0) || !isfinite(range)) return top_p_pop(c, n, m, target);
    const double scale = (double)TOP_P_BINS / range;
    double mass[TOP_P_BINS] = {0};
    for (int32_t i = 0; i < n; i++) {
        int b = (int)fmin(((double)m - (double)c[i].l) * scale, TOP_P_BINS - 1);
        mass[b] += (double)expf(c[i].l - m);
    }
    double cum = 0.0;
    int cross = -1;
    for (int b = 0; b < TOP_P_BINS; b++) {
        if (cum + mass[b] >= target) {
            cross = b;
            break;
        }
        cum += mass[b];
    }
    if (cross < 0) return -1;
    /* three-way partition: [bins < cross | bin == cross | the rest] */
    int32_t above = 0, at;
    for (int32_t i = 0; i < n; i++) {
        int b = (int)fmin(((double)m - (double)c[i].l) * scale, TOP_P_BINS - 1);
        if (b < cross) {
            cand_t t = c[above];
            c[above++] = c[i];
            c[i] = t;
        }
    }
    at = above;
    for (int32_t i = above; i < n; i++) {
        int b = (int)fmin(((double)m - (double)c[i].l) * scale, TOP_P_BINS - 1);
        if (b == cross) {
            cand_t t = c[at];
            c[at++] = c[i];
            c[i] = t;
        }
    }
    int32_t popped = top_p_pop(c + above, at - above, m, target - cum);
    return popped < 0 ? -1 : above + popped;
}

/* Top-p over the explicit candidates c[0..n). */
static int32_t top_p_cand(cand_t *c, int32_t n, float m, float top_p) {
    double z = 0.0;
    for (int32_t i = 0; i < n; i++) z += (double)expf(c[i].l - m);
    int32_t kept = top_p_cut(c, n, m, (double)top_p * z);
    if (kept < 0) kept = top_p_pop(c, n, m, (double)top_p * z);
    return kept < 0 ? n : kept; /* ran dry only through rounding: keep all */
}

/* Candidates of the row with logit >= thr (finite ones only) into c. */
static int32_t collect(const float *logits, int32_t V, double thr, cand_t *c) {
    int32_t n = 0;
    for (int32_t i = 0; i < V; i++) {
        float l = logits[i];
        if (l != -INFINITY && (double)l >= thr) c[n++] = (cand_t){l, i};
    }
    return n;
}

/* Top-p over every finite token of the row, heaping only those above a
 * threshold that holds more than the top-p mass (see the file comment). */
static int32_t top_p_all(const float *logits, int32_t V, int32_t n_vocab, int32_t n_finite, float m, float top_p,
                         cand_t *c) {
    double z = 0.0;
    for (int32_t i = 0; i < V; i++) z += (double)expf(logits[i] - m);
    double target = (double)top_p * z;
    /* n_vocab, not V: a sparse row gathers what the dense row would */
    double thr = fmin((double)m + log(z) + log((1.0 - (double)top_p) / (double)n_vocab), (double)m);
    int32_t n = collect(logits, V, thr, c);
    int32_t kept = top_p_cut(c, n, m, target);
    if (kept >= 0) return kept;
    /* Rounding defeated the bound or the bins: heap every finite token. */
    if (n < n_finite) n = collect(logits, V, -INFINITY, c);
    kept = top_p_pop(c, n, m, target);
    return kept < 0 ? n : kept;
}

/* Min-p: keep l - m >= log(min_p); the maximum always stays. */
static int32_t min_p_cand(cand_t *c, int32_t n, float m, float min_p) {
    double lmin = fmin(log((double)min_p), 0.0);
    int32_t kept = 0;
    for (int32_t i = 0; i < n; i++)
        if ((double)c[i].l - (double)m >= lmin) c[kept++] = c[i];
    return kept;
}

static int32_t min_p_all(const float *logits, int32_t V, float m, float min_p, cand_t *c) {
    double lmin = fmin(log((double)min_p), 0.0);
    int32_t n = 0;
    for (int32_t i = 0; i < V; i++) {
        float l = logits[i];
        if (l != -INFINITY && (double)l - (double)m >= lmin) c[n++] = (cand_t){l, i};
    }
    return n;
}

/* Steps 2 and 3: truncate, then turn the survivors' logits into tempered
 * softmax weights (maximum weight 1). m is the row maximum (finite). The
 * row has V entries (a sparse row fewer than n_vocab); candidates' ids are
 * indices into it. */
static dist_t truncate_and_weigh(lm_sampler *s, float *logits, int32_t V, int32_t n_finite, float m) {
    const lm_sample_params *p = &s->p;
    dist_t d = {true, V, 0.0, -1};
    cand_t *c = s->cand;
    if (p->top_k > 0 && p->top_k < n_finite) {
        d.all = false;
        d.n = top_k_select(logits, V, p->top_k, c);
    }
    if (p->top_p < 1.0f) { /* NaN top_p compares false: off */
        if (d.all) d.n = top_p_all(logits, V, s->n_vocab, n_finite, m, p->top_p, c);
        else d.n = top_p_cand(c, d.n, m, p->top_p);
        d.all = false;
    }
    if (p->min_p > 0.0f) {
        if (d.all) d.n = min_p_all(logits, V, m, p->min_p, c);
        else d.n = min_p_cand(c, d.n, m, p->min_p);
        d.all = false;
    }
    const float t = p->temp;
    if (d.all) {
        for (int32_t b = 0; b * CK_BLOCK < V; b++) {
            int32_t end = V - b * CK_BLOCK > CK_BLOCK ? (b + 1) * CK_BLOCK : V;
            for (int32_t i = b * CK_BLOCK; i < end; i++) {
                float w = logits[i] == -INFINITY ? 0.0f : expf((logits[i] - m) / t);
                logits[i] = w;
                d.sum += (double)w;
                if (w > 0.0f) d.last = i;
            }
            s->ck[b] = d.sum;
        }
    } else {
        for (int32_t i = 0; i < d.n; i++) {
            float w = expf((c[i].l - m) / t);
            c[i].l = w;
            d.sum += (double)w;
        }
    }
    return d;
}

/* ---- public entry points -------------------------------------------------- */

bool sampler_greedy(const lm_sampler *s) { return s->greedy; }

/* One draw from a row of n entries (see preprocess); the index into it. */
static int32_t sample_row(lm_sampler *s, float *logits, int32_t n, const int32_t *ids) {
    int32_t n_finite;
    int32_t best = preprocess(s, logits, n, ids, &n_finite);
    if (best < 0 || s->greedy) return best;
    dist_t d = truncate_and_weigh(s, logits, n, n_finite, logits[best]);
    /* Walk the cumulative weights to the first that exceeds u; rounding can
     * leave u >= the final sum, then the last positive weight is taken. */
    double u = lm_rng_uniform(&s->rng) * d.sum, cum = 0.0;
    int32_t last = best;
    if (d.all) {
        /* the first block whose running sum passes u holds the token: start
         * there with the sum before it (adding a zero weight changes no sum) */
        int32_t b = 0, n_blk = (n + CK_BLOCK - 1) / CK_BLOCK;
        while (b < n_blk && !(u < s->ck[b])) b++;
        if (b == n_blk) return d.last >= 0 ? d.last : best;
        cum = b > 0 ? s->ck[b - 1] : 0.0;
        int32_t end = n - b * CK_BLOCK > CK_BLOCK ? (b + 1) * CK_BLOCK : n;
        for (int32_t i = b * CK_BLOCK; i < end; i++) {
            if (logits[i] <= 0.0f) continue;
            cum += (double)logits[i];
            last = i;
            if (u < cum) return i;
        }
        return last; /* not reached: the block's running sum passes u */
    } else {
        for (int32_t i = 0; i < d.n; i++) {
            if (s->cand[i].l <= 0.0f) continue;
            cum += (double)s->cand[i].l;
            last = s->cand[i].id;
            if (u < cum) return last;
        }
    }
    return last;
}

int32_t sampler_sample(lm_sampler *s, float *logits) { return sample_row(s, logits, s->n_vocab, NULL); }

int32_t sampler_sample_sparse(lm_sampler *s, const float *logits, const int32_t *ids, int32_t n, float *scratch) {
    for (int32_t j = 0; j < n; j++) scratch[j] = logits[ids[j]];
    int32_t j = n > 0 ? sample_row(s, scratch, n, ids) : -1;
    return j < 0 ? -1 : ids[j];
}

int32_t sampler_dist(lm_sampler *s, float *logits, int32_t *ids, float *probs) {
    int32_t n_finite;
    int32_t best = preprocess(s, logits, s->n_vocab, NULL, &n_finite);
    if (best < 0) return 0;
    if (s->greedy) {
        ids[0] = best;
        probs[0] = 1.0f;
        return 1;
    }
    dist_t d = truncate_and_weigh(s, logits, s->n_vocab, n_finite, logits[best]);
    int32_t n = 0;
    if (d.all) {
        for (int32_t i = 0; i < s->n_vocab; i++) {
            if (logits[i] <= 0.0f) continue;
            ids[n] = i;
            probs[n++] = (float)((double)logits[i] / d.sum);
        }
    } else {
        for (int32_t i = 0; i < d.n; i++) {
            if (s->cand[i].l <= 0.0f) continue;
            ids[n] = s->cand[i].id;
            probs[n++] = (float)((double)s->cand[i].l / d.sum);
        }
    }
    return n;
}

/* ---- log-probabilities ---------------------------------------------------- */

static inline double clean(float x) {
    if (isnan(x)) return -INFINITY;
    if (x == INFINITY) return FLT_MAX;
    return x;
}

void sample_log_softmax(const float *logits, int32_t n, float *out) {
    double m = -INFINITY;
    for (int32_t i = 0; i < n; i++) m = fmax(m, clean(logits[i]));
    if (m == -INFINITY) {
        for (int32_t i = 0; i < n; i++) out[i] = -INFINITY;
        return;
    }
    double z = 0.0;
    for (int32_t i = 0; i < n; i++) z += exp(clean(logits[i]) - m);
    double lz = m + log(z); /* z >= 1: the maximum contributes exp(0) */
    for (int32_t i = 0; i < n; i++) out[i] = (float)(clean(logits[i]) - lz);
}

/* Min-heap on (vals, ids) under the sampler's total order: the root is the
 * worst of the kept entries. */
static inline bool better_iv(float va, int32_t ia, float vb, int32_t ib) { return va > vb || (va == vb && ia < ib); }

static void sift_down_iv(int32_t *ids, float *vals, int n, int i) {
    int32_t xi = ids[i];
    float xv = vals[i];
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && better_iv(vals[c], ids[c], vals[c + 1], ids[c + 1])) c++;
        if (!better_iv(xv, xi, vals[c], ids[c])) break;
        ids[i] = ids[c];
        vals[i] = vals[c];
        i = c;
    }
    ids[i] = xi;
    vals[i] = xv;
}

int sample_top_n(const float *logprobs, int32_t n_vocab, int n, int32_t *ids, float *vals) {
    if (n <= 0 || n_vocab <= 0) return 0;
    int k = n < n_vocab ? n : (int)n_vocab;
    for (int i = 0; i < k; i++) {
        ids[i] = i;
        vals[i] = isnan(logprobs[i]) ? -INFINITY : logprobs[i];
    }
    for (int i = k / 2 - 1; i >= 0; i--) sift_down_iv(ids, vals, k, i);
    for (int32_t i = k; i < n_vocab; i++) {
        float v = logprobs[i];
        if (!(v > vals[0])) continue; /* equal: the later id is worse; NaN never enters */
        ids[0] = i;
        vals[0] = v;
        sift_down_iv(ids, vals, k, 0);
    }
    /* Heap sort: moving the worst to the back leaves the best first. */
    for (int end = k - 1; end > 0; end--) {
        int32_t ti = ids[0];
        float tv = vals[0];
        ids[0] = ids[end];
        vals[0] = vals[end];
        ids[end] = ti;
        vals[end] = tv;
        sift_down_iv(ids, vals, end, 0);
    }
    return k;
}

/* ---- speculative verification --------------------------------------------- */

/* The survivors' weights (d over logits or cand) for one token: 0 when it
 * did not survive. */
static double weight_of(const lm_sampler *s, const float *logits, dist_t d, int32_t tok) {
    if (tok < 0 || tok >= s->n_vocab) return 0.0;
    if (d.all) return logits[tok] > 0.0f ? (double)logits[tok] : 0.0;
    for (int32_t i = 0; i < d.n; i++)
        if (s->cand[i].id == tok) return s->cand[i].l > 0.0f ? (double)s->cand[i].l : 0.0;
    return 0.0;
}

/* The residual weight max(0, p(tok) - q(tok)) of a survivor of weight w
 * (p = w / sum); q NULL is a point mass at draft. */
static inline double residual(double w, double sum, const float *q, int32_t draft, int32_t tok) {
    double qt = q ? (double)q[tok] : (tok == draft ? 1.0 : 0.0);
    double r = w / sum - qt;
    return r > 0.0 ? r : 0.0;
}

int32_t sampler_sample_spec(lm_sampler *s, float *logits, int32_t draft, const float *q, bool *accepted) {
    *accepted = false;
    int32_t n_finite;
    int32_t best = preprocess(s, logits, s->n_vocab, NULL, &n_finite);
    if (best < 0) return -1;
    if (s->greedy) {
        *accepted = best == draft;
        return best;
    }
    dist_t d = truncate_and_weigh(s, logits, s->n_vocab, n_finite, logits[best]);
    /* accept with probability min(1, p(draft) / q(draft)) */
    double pd = weight_of(s, logits, d, draft) / d.sum;
    double qd = q ? (draft >= 0 && draft < s->n_vocab ? (double)q[draft] : 0.0) : 1.0;
    double u = lm_rng_uniform(&s->rng);
    if (qd > 0.0 && u * qd < pd) {
        *accepted = true;
        return draft;
    }
    /* rejected: draw from max(0, p - q), normalised; only survivors of p
     * have p > 0, so only they can carry residual mass */
    double total = 0.0;
    if (d.all) {
        for (int32_t i = 0; i < s->n_vocab; i++)
            if (logits[i] > 0.0f) total += residual(logits[i], d.sum, q, draft, i);
    } else {
        for (int32_t i = 0; i < d.n; i++)
            if (s->cand[i].l > 0.0f) total += residual(s->cand[i].l, d.sum, q, draft, s->cand[i].id);
    }
    double v = lm_rng_uniform(&s->rng) * total, cum = 0.0;
    int32_t last = -1;
    if (d.all) {
        for (int32_t i = 0; i < s->n_vocab; i++) {
            if (logits[i] <= 0.0f) continue;
            double r = residual(logits[i], d.sum, q, draft, i);
            if (r <= 0.0) continue;
            cum += r;
            last = i;
            if (v < cum) return i;
        }
    } else {
        for (int32_t i = 0; i < d.n; i++) {
            if (s->cand[i].l <= 0.0f) continue;
            double r = residual(s->cand[i].l, d.sum, q, draft, s->cand[i].id);
            if (r <= 0.0) continue;
            cum += r;
            last = s->cand[i].id;
            if (v < cum) return last;
        }
    }
    /* no residual mass (p == q up to rounding, where acceptance is certain
     * but for rounding): the draft stands */
    if (last < 0) {
        *accepted = pd > 0.0;
        return pd > 0.0 ? draft : best;
    }
    return last;
}
