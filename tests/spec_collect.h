/*
 * spec_collect.h - what the speculation tests (test_spec, test_spec_draft)
 * collect from a request's events, and the comparison of two runs: every
 * choice's tokens, text and finish reason, which tokens were accepted
 * proposals, its final statistics.
 */
#ifndef LAMINA_TEST_SPEC_COLLECT_H
#define LAMINA_TEST_SPEC_COLLECT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "sched/engine.h"

#define MAX_OUT 80

typedef struct {
    int32_t tokens[3][MAX_OUT];
    bool acc[3][MAX_OUT]; /* the token was an accepted proposal */
    int last_acc[3];
    int n[3];
    char text[3][1024];
    size_t text_len[3];
    lm_finish finish[3];
    int done[3];
    lm_request_stats stats[3];
    atomic_int n_done;
} collect;

/* The engine's callback: user is the request's collect. */
static void on_event(void *user, const lm_event *ev) {
    collect *c = user;
    int i = ev->index;
    if (ev->token >= 0 && c->n[i] < MAX_OUT) {
        c->acc[i][c->n[i]] = ev->stats->spec_accepted > c->last_acc[i];
        c->tokens[i][c->n[i]++] = ev->token;
    }
    c->last_acc[i] = ev->stats->spec_accepted;
    if (ev->text_len && c->text_len[i] + ev->text_len < sizeof c->text[i]) {
        memcpy(c->text[i] + c->text_len[i], ev->text, ev->text_len);
        c->text_len[i] += ev->text_len;
    }
    if (ev->done) {
        c->done[i]++;
        c->finish[i] = ev->finish;
        c->stats[i] = *ev->stats;
        atomic_fetch_add(&c->n_done, 1);
    }
}

/* Whether request j's n choices in got equal want's (got's each ended
 * once); says which differs on stderr. */
static inline bool collect_same(const collect *want, const collect *got, int j, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        const collect *a = &want[j], *b = &got[j];
        if (b->done[i] != 1 || a->n[i] != b->n[i] || a->finish[i] != b->finish[i] ||
            memcmp(a->tokens[i], b->tokens[i], (size_t)a->n[i] * sizeof(int32_t)) != 0 ||
            a->text_len[i] != b->text_len[i] || memcmp(a->text[i], b->text[i], a->text_len[i]) != 0) {
            fprintf(stderr, "  %s: request %d choice %d differs (%d vs %d tokens, finish %d vs %d)\n", what, j, i,
                    a->n[i], b->n[i], a->finish[i], b->finish[i]);
            return false;
        }
    }
    return true;
}

#endif
