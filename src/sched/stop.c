/*
 * stop.c - stop strings and held text (see stop.h).
 *
 * stop_scan is a plain search: after each piece every stop string is looked
 * for in the whole held text (at most the longest stop string plus one
 * piece), then the tail that is a proper prefix of some stop string is kept.
 * Requests carry at most a handful of short stop strings, so this is cheap
 * next to sampling one token.
 */
#include "sched/stop.h"

#include <string.h>

#include "base/util.h"

int stop_set_init(stop_set *ss, const char *const *strs, int n) {
    memset(ss, 0, sizeof *ss);
    if (n <= 0) return 0;
    if (!(ss->s = lm_calloc((size_t)n, sizeof *ss->s))) return -1;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(strs[i]);
        if (!(ss->s[i] = lm_malloc(l + 1))) {
            stop_set_free(ss);
            return -1;
        }
        memcpy(ss->s[i], strs[i], l + 1);
        ss->n++;
        if ((int)l > ss->max_len) ss->max_len = (int)l;
    }
    return 0;
}

void stop_set_free(stop_set *ss) {
    for (int i = 0; i < ss->n; i++) lm_free(ss->s[i]);
    lm_free(ss->s);
    memset(ss, 0, sizeof *ss);
}

int stop_text_init(stop_text *t, const stop_set *ss, int piece_max) {
    t->n = 0;
    t->cap = ss->max_len + piece_max;
    t->held = lm_malloc((size_t)(t->cap > 0 ? t->cap : 1));
    return t->held ? 0 : -1;
}

void stop_text_free(stop_text *t) {
    lm_free(t->held);
    memset(t, 0, sizeof *t);
}

bool stop_scan(const stop_set *ss, stop_text *t, const char *add, int n_add, char *out, size_t *len) {
    memcpy(t->held + t->n, add, (size_t)n_add);
    t->n += n_add;
    int cut = -1;
    for (int s = 0; s < ss->n; s++) {
        const char *hit = memmem(t->held, (size_t)t->n, ss->s[s], strlen(ss->s[s]));
        if (hit && (cut < 0 || hit - t->held < cut)) cut = (int)(hit - t->held);
    }
    if (cut >= 0) {
        memcpy(out, t->held, (size_t)cut);
        *len = (size_t)cut;
        t->n = 0;
        return true;
    }
    int keep = 0;
    for (int s = 0; s < ss->n; s++) {
        int sl = (int)strlen(ss->s[s]);
        for (int k = sl - 1 > t->n ? t->n : sl - 1; k > keep; k--)
            if (!memcmp(t->held + t->n - k, ss->s[s], (size_t)k)) {
                keep = k;
                break;
            }
    }
    *len = (size_t)(t->n - keep);
    memcpy(out, t->held, *len);
    memmove(t->held, t->held + *len, (size_t)keep);
    t->n = keep;
    return false;
}
