/*
 * reasoning.c - the reasoning splitter (contract in reasoning.h).
 *
 * Both syntaxes are small state machines over a hold buffer: each feed
 * appends its bytes to r->hold, then the machine releases from the front of
 * the hold what it can decide and keeps the rest. A decision never depends
 * on where the pieces were split, only on the bytes seen and on `final`,
 * which is what makes a stream and a whole answer agree.
 *
 * Think states:
 *   T_START        content unless the output opens with <think> (after blanks)
 *   T_START_OPEN   reasoning already open; a <think> written again is dropped
 *   T_REASON_LEAD  blanks after <think>: dropped
 *   T_REASON       reasoning; trailing blanks and a possible </think> held
 *   T_CONTENT_LEAD blanks after </think>: dropped
 *   T_CONTENT      everything is content
 *
 * Harmony states:
 *   H_HEADER       a message's header, held whole up to <|message|>
 *   H_BODY         the body, released up to a possible end marker
 *   H_PLAIN        no <|message|> in a header's first REASON_MAX_HEADER
 *                  bytes: the rest is content as it is
 */
#include "text/reasoning.h"

#include <string.h>

#include "base/util.h"
#include "text/chat.h"

enum { T_START, T_START_OPEN, T_REASON_LEAD, T_REASON, T_CONTENT_LEAD, T_CONTENT };
enum { H_HEADER, H_BODY, H_PLAIN };

static const char OPEN[] = "<think>", CLOSE[] = "</think>";
static const char *const H_ENDS[] = {"<|end|>", "<|return|>", "<|call|>", "<|start|>"};
#define N_H_ENDS (sizeof H_ENDS / sizeof *H_ENDS)

static bool blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

void reason_init(lm_reason *r, int syntax, bool open) {
    memset(r, 0, sizeof *r);
    r->syntax = syntax;
    if (syntax == REASON_HARMONY) r->state = H_HEADER;
    else r->state = open ? T_START_OPEN : T_START;
}

void reason_free(lm_reason *r) { strbuf_free(&r->hold); }

bool reason_ended(const lm_reason *r) { return r->ended; }

void reason_out_clear(lm_reason_out *o) {
    o->text.len = 0;
    if (o->text.p) o->text.p[0] = 0;
    o->n = 0;
}

void reason_out_free(lm_reason_out *o) {
    strbuf_free(&o->text);
    lm_free(o->seg);
    memset(o, 0, sizeof *o);
}

/* Release s[0..n) as kind (an empty RSEG_CALL still opens a call). */
static void emit(lm_reason_out *o, int kind, const char *s, size_t n) {
    if (!n && kind != RSEG_CALL) return;
    size_t off = o->text.len;
    strbuf_put(&o->text, s, n);
    if (o->text.failed) {
        o->failed = true;
        return;
    }
    if (o->n && kind != RSEG_CALL && o->seg[o->n - 1].kind == kind &&
        o->seg[o->n - 1].off + o->seg[o->n - 1].len == off) {
        o->seg[o->n - 1].len += n;
        return;
    }
    if (o->n == o->cap) {
        int cap = o->cap ? 2 * o->cap : 8;
        lm_reason_seg *p = lm_realloc(o->seg, (size_t)cap * sizeof *p);
        if (!p) {
            o->failed = true;
            return;
        }
        o->seg = p, o->cap = cap;
    }
    o->seg[o->n++] = (lm_reason_seg){kind, off, n};
}

/* Drop the first n held bytes. */
static void consume(lm_reason *r, size_t n) {
    memmove(r->hold.p, r->hold.p + n, r->hold.len - n);
    r->hold.len -= n;
    if (r->hold.p) r->hold.p[r->hold.len] = 0;
}

/* Whether s[0..n) is a proper prefix of marker m (n < strlen(m)). */
static bool part_of(const char *s, size_t n, const char *m) { return n < strlen(m) && memcmp(s, m, n) == 0; }

/* The longest suffix of s[0..n) that is a proper prefix of m. */
static size_t partial_tail(const char *s, size_t n, const char *m) {
    size_t k = strlen(m) - 1;
    if (k > n) k = n;
    for (; k > 0; k--)
        if (memcmp(s + n - k, m, k) == 0) return k;
    return 0;
}

static const char *find(const char *s, size_t n, const char *m) {
    size_t k = strlen(m);
    for (size_t i = 0; i + k <= n; i++)
        if (s[i] == m[0] && memcmp(s + i, m, k) == 0) return s + i;
    return NULL;
}

/* ---- think ----------------------------------------------------------- */

/* One step of the think machine; false when it must wait for more bytes. */
static bool think_step(lm_reason *r, bool final, lm_reason_out *o) {
    char *s = r->hold.p;
    size_t n = r->hold.len, w = 0;
    while (w < n && blank(s[w])) w++;
    switch (r->state) {
        case T_START:
        case T_START_OPEN: {
            bool open = r->state == T_START_OPEN;
            if (!n) return false;
            if (w == n && !final) return false; /* only blanks so far */
            if (n - w >= sizeof OPEN - 1 && memcmp(s + w, OPEN, sizeof OPEN - 1) == 0) {
                consume(r, w + sizeof OPEN - 1);
                r->state = T_REASON_LEAD;
                return true;
            }
            if (!final && part_of(s + w, n - w, OPEN)) return false;
            r->state = open ? T_REASON_LEAD : T_CONTENT;
            if (!open) r->ended = true;
            return true;
        }
        case T_REASON_LEAD:
            consume(r, w);
            if (!r->hold.len) return false;
            r->state = T_REASON;
            return true;
        case T_REASON: {
            const char *m = find(s, n, CLOSE);
            if (m) {
                size_t e = (size_t)(m - s), t = e;
                while (t > 0 && blank(s[t - 1])) t--;
                emit(o, RSEG_REASONING, s, t);
                consume(r, e + sizeof CLOSE - 1);
                r->state = T_CONTENT_LEAD;
                r->ended = true;
                return true;
            }
            size_t t = final ? n : n - partial_tail(s, n, CLOSE);
            while (t > 0 && blank(s[t - 1])) t--;
            emit(o, RSEG_REASONING, s, t);
            consume(r, final ? n : t);
            return false;
        }
        case T_CONTENT_LEAD:
            consume(r, w);
            if (!r->hold.len) return false;
            r->state = T_CONTENT;
            return true;
        default: /* T_CONTENT */
            emit(o, RSEG_CONTENT, s, n);
            consume(r, n);
            return false;
    }
}

/* ---- harmony --------------------------------------------------------- */

/* The word after `key` in the header h[0..n) (up to a blank or "<|"). */
static bool header_word(const char *h, size_t n, const char *key, const char **w, size_t *len) {
    const char *p = find(h, n, key);
    if (!p) return false;
    p += strlen(key);
    const char *e = h + n;
    const char *q = p;
    while (q < e && !blank(*q) && !(q + 1 < e && q[0] == '<' && q[1] == '|')) q++;
    *w = p, *len = (size_t)(q - p);
    return true;
}

/* A header h[0..n) read: the body's kind, and a call's name released. */
static void harmony_header(lm_reason *r, const char *h, size_t n, lm_reason_out *o) {
    const char *ch = NULL, *to = NULL;
    size_t ch_len = 0, to_len = 0;
    header_word(h, n, "<|channel|>", &ch, &ch_len);
    header_word(h, n, "to=", &to, &to_len);
    static const char FN[] = "functions.";
    if (ch && ch_len == 8 && memcmp(ch, "analysis", 8) == 0) {
        r->body = RSEG_REASONING;
    } else if (to && to_len > sizeof FN - 1 && memcmp(to, FN, sizeof FN - 1) == 0) {
        r->body = RSEG_ARGS;
        r->ended = true;
        emit(o, RSEG_CALL, to + sizeof FN - 1, to_len - (sizeof FN - 1));
    } else {
        r->body = RSEG_CONTENT;
        r->ended = true;
    }
}

static bool harmony_step(lm_reason *r, bool final, lm_reason_out *o) {
    char *s = r->hold.p;
    size_t n = r->hold.len;
    if (!n) return false;
    static const char MSG[] = "<|message|>";
    if (r->state == H_PLAIN) {
        emit(o, RSEG_CONTENT, s, n);
        consume(r, n);
        return false;
    }
    if (r->state == H_HEADER) {
        /* a header ends within its first REASON_MAX_HEADER bytes: the
         * decision depends on those bytes only, however they came */
        const char *m = find(s, n < REASON_MAX_HEADER ? n : REASON_MAX_HEADER, MSG);
        if (!m && n >= REASON_MAX_HEADER) { /* no header: plain text from here on */
            r->state = H_PLAIN;
            r->ended = true;
            return true;
        }
        if (!m && !final) return false;
        if (!m) {
            /* a header cut short at the end (max_tokens) is markup, dropped;
             * text that is no header is content */
            if (strncmp(s, "<|start|>", 9) && strncmp(s, "<|channel|>", 11)) {
                r->ended = true;
                emit(o, RSEG_CONTENT, s, n);
            }
            consume(r, n);
            return false;
        }
        harmony_header(r, s, (size_t)(m - s), o);
        consume(r, (size_t)(m - s) + sizeof MSG - 1);
        r->state = H_BODY;
        return true;
    }
    /* H_BODY: up to the first end marker */
    size_t end = n, mlen = 0, which = 0;
    for (size_t k = 0; k < N_H_ENDS; k++) {
        const char *m = find(s, n, H_ENDS[k]);
        if (m && (size_t)(m - s) < end) end = (size_t)(m - s), mlen = strlen(H_ENDS[k]), which = k;
    }
    if (mlen) {
        emit(o, r->body, s, end);
        /* <|start|> (the last marker) opens the next header: it stays */
        consume(r, which == N_H_ENDS - 1 ? end : end + mlen);
        r->state = H_HEADER;
        return true;
    }
    size_t t, hold = 0;
    if (!final)
        for (size_t k = 0; k < N_H_ENDS; k++) {
            size_t p = partial_tail(s, n, H_ENDS[k]);
            if (p > hold) hold = p;
        }
    t = n - hold;
    emit(o, r->body, s, t);
    consume(r, t);
    return false;
}

void reason_feed(lm_reason *r, const char *s, size_t n, bool final, lm_reason_out *o) {
    if (n) strbuf_put(&r->hold, s, n);
    if (r->hold.failed) {
        o->failed = true;
        return;
    }
    if (r->syntax == REASON_HARMONY)
        while (harmony_step(r, final, o)) {}
    else
        while (think_step(r, final, o)) {}
}

int reason_syntax(int family) {
    switch (family) {
        case CHAT_QWEN3:
        case CHAT_QWEN35:
        case CHAT_DEEPSEEK_R1: return REASON_THINK;
        case CHAT_GPT_OSS: return REASON_HARMONY;
        default: return REASON_NONE;
    }
}

static bool ends_with(const char *s, size_t n, const char *m) {
    size_t k = strlen(m);
    while (n > 0 && blank(s[n - 1])) n--;
    return n >= k && memcmp(s + n - k, m, k) == 0;
}

bool reason_prompt_open(const char *prompt, size_t n) { return ends_with(prompt, n, OPEN); }
bool reason_prompt_closed(const char *prompt, size_t n) { return ends_with(prompt, n, CLOSE); }
