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
#include <string.h>

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
    if (k > 0 || k_max <= 0) {
        c->idle = 0;
        return k;
    }
    /* the estimate says no: probe now and then, or it could never recover */
    if (++c->idle >= c->every) {
        c->idle = 0;
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
