/*
 * fuzz_reasoning.c - libFuzzer target for the reasoning splitter
 * (text/reasoning.c): an output text, fed whole and then in pieces.
 *
 * Input layout: byte 0 is the options (bit 0: harmony, else think; bit 1:
 * the prompt opened the reasoning); bytes 1 and 2 are two cut points (each
 * taken modulo the text's length + 1); the rest is the text, arbitrary
 * bytes.
 *
 * Invariants checked (abort on violation): the pieces the three-piece feed
 * and a byte-by-byte feed release are, kind by kind and in order, the same
 * bytes as the whole text's (a stream and a whole answer agree); every
 * segment lies inside its feed's text; reason_ended is the same however the
 * text came; a feed never releases more bytes than it was given in all.
 * ASan/LSan catch crashes and leaks.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"
#include "text/reasoning.h"

typedef struct {
    strbuf side[4]; /* by RSEG_* kind; calls as name, then args */
    size_t total;
} sides;

static void add(sides *s, const lm_reason_out *o) {
    for (int i = 0; i < o->n; i++) {
        const lm_reason_seg *g = &o->seg[i];
        if (g->kind < 0 || g->kind > RSEG_ARGS || g->off + g->len > o->text.len) abort();
        if (g->kind == RSEG_CALL) strbuf_put(&s->side[RSEG_CALL], "\n", 1);
        strbuf_put(&s->side[g->kind], o->text.p + g->off, g->len);
        s->total += g->len;
    }
}

/* Feed text in pieces ending at cuts[0..n) (ascending), then the rest. */
static bool feed(int syntax, bool open, const uint8_t *t, size_t len, const size_t *cuts, size_t n, sides *s) {
    lm_reason r;
    lm_reason_out o = {0};
    reason_init(&r, syntax, open);
    size_t at = 0;
    for (size_t i = 0; i <= n; i++) {
        size_t to = i < n ? cuts[i] : len;
        reason_out_clear(&o);
        reason_feed(&r, (const char *)t + at, to - at, i == n, &o);
        if (o.failed) abort();
        add(s, &o);
        at = to;
    }
    bool ended = reason_ended(&r);
    reason_out_free(&o);
    reason_free(&r);
    if (s->total > len) abort();
    return ended;
}

static bool same(const sides *a, const sides *b) {
    for (int k = 0; k < 4; k++)
        if (a->side[k].len != b->side[k].len ||
            (a->side[k].len && memcmp(a->side[k].p, b->side[k].p, a->side[k].len) != 0))
            return false;
    return true;
}

static void sides_free(sides *s) {
    for (int k = 0; k < 4; k++) strbuf_free(&s->side[k]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    int syntax = data[0] & 1 ? REASON_HARMONY : REASON_THINK;
    bool open = data[0] & 2;
    const uint8_t *t = data + 3;
    size_t len = size - 3;
    size_t a = data[1] % (len + 1), b = data[2] % (len + 1);
    size_t cuts[2] = {a < b ? a : b, a < b ? b : a};
    sides whole = {0}, three = {0}, bytes = {0};
    bool e0 = feed(syntax, open, t, len, NULL, 0, &whole);
    bool e1 = feed(syntax, open, t, len, cuts, 2, &three);
    size_t *each = len ? malloc(len * sizeof *each) : NULL;
    for (size_t i = 0; i < len; i++) each[i] = i;
    bool e2 = feed(syntax, open, t, len, each, len, &bytes);
    free(each);
    if (e0 != e1 || e0 != e2 || !same(&whole, &three) || !same(&whole, &bytes)) abort();
    sides_free(&whole);
    sides_free(&three);
    sides_free(&bytes);
    return 0;
}
