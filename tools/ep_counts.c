/*
 * ep_counts.c - the routing-count file of expert parallelism's balanced
 * placement (--ep-place balanced --ep-counts FILE; `lamina bench --ep
 * --ep-counts-out FILE` writes one).
 *
 * The file is text:
 *     lamina-ep-counts 1 N_LAYER N_EXPERT
 *     LAYER ROWS_0 ROWS_1 ... ROWS_{N_EXPERT-1}     (one line per layer, in order)
 * rows: the token rows routed to each expert of the layer over some text
 * (a dense layer's are 0). Lines starting with '#' are comments. Bounds:
 * 1 .. 65536 layers, 1 .. 4096 experts (model.c's limit), 2^24 counts in all,
 * each below 2^63.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/safefile.h"
#include "cli.h"

static int next_word(FILE *f, char *w, size_t cap) {
    int c;
    for (;;) {
        while ((c = fgetc(f)) == ' ' || c == '\t' || c == '\n' || c == '\r') {}
        if (c != '#') break;
        while ((c = fgetc(f)) != EOF && c != '\n') {}
    }
    if (c == EOF) return -1;
    size_t n = 0;
    while (c != EOF && c != ' ' && c != '\t' && c != '\n' && c != '\r') {
        if (n + 1 >= cap) return -1;
        w[n++] = (char)c;
        c = fgetc(f);
    }
    w[n] = 0;
    return 0;
}

static int next_u64(FILE *f, uint64_t lo, uint64_t hi, uint64_t *v) {
    char w[32], *end = NULL;
    if (next_word(f, w, sizeof w) || w[0] == '-') return -1;
    errno = 0;
    unsigned long long x = strtoull(w, &end, 10);
    if (errno || !end || *end || end == w || x < lo || x > hi) return -1;
    *v = x;
    return 0;
}

lm_ep_counts *ep_counts_read(const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    lm_ep_counts *c = calloc(1, sizeof *c);
    uint64_t *rows = NULL;
    char w[32];
    uint64_t ver, L, X;
    if (!c || next_word(f, w, sizeof w) || strcmp(w, "lamina-ep-counts") || next_u64(f, 1, 1, &ver) ||
        next_u64(f, 1, 65536, &L) || next_u64(f, 1, 4096, &X) || L * X > (1u << 24)) {
        snprintf(err, errlen, "%s: not a routing-count file (its first line: lamina-ep-counts 1 LAYERS EXPERTS)", path);
        goto fail;
    }
    rows = calloc((size_t)(L * X), sizeof *rows);
    if (!rows) {
        snprintf(err, errlen, "%s: out of memory", path);
        goto fail;
    }
    for (uint64_t li = 0; li < L; li++) {
        uint64_t at;
        if (next_u64(f, 0, L - 1, &at) || at != li) {
            snprintf(err, errlen, "%s: layer %" PRIu64 "'s line missing or out of order", path, li);
            goto fail;
        }
        for (uint64_t e = 0; e < X; e++)
            if (next_u64(f, 0, INT64_MAX, &rows[li * X + e])) {
                snprintf(err, errlen, "%s: layer %" PRIu64 ": count %" PRIu64 " of %" PRIu64 " missing or not a number",
                         path, li, e, X);
                goto fail;
            }
    }
    if (next_word(f, w, sizeof w) == 0) {
        snprintf(err, errlen, "%s: more than %" PRIu64 " layers' counts", path, L);
        goto fail;
    }
    fclose(f);
    c->n_layer = (int)L;
    c->n_expert = (int)X;
    c->rows = rows;
    return c;
fail:
    fclose(f);
    free(rows);
    free(c);
    return NULL;
}

void ep_counts_free(lm_ep_counts *c) {
    if (!c) return;
    free((void *)c->rows);
    free(c);
}

int ep_counts_write(const char *path, const uint64_t *rows, int L, int X, char *err, size_t errlen) {
    safefile *sf = safefile_create(path, err, errlen); /* a temporary file renamed over path when whole */
    if (!sf) return -1;
    FILE *f = safefile_stream(sf);
    fprintf(f, "lamina-ep-counts 1 %d %d\n", L, X);
    for (int li = 0; li < L; li++) {
        fprintf(f, "%d", li);
        for (int e = 0; e < X; e++) fprintf(f, " %" PRIu64, rows[(size_t)li * X + e]);
        fputc('\n', f);
    }
    return safefile_commit(sf, err, errlen);
}
