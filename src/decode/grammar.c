/*
 * grammar.c - GBNF grammars compiled to flat rules, and a byte-level
 * pushdown matcher over them with a lazily built automaton of parse states.
 *
 * Compiled form (as llama.cpp lowers GBNF): every rule is a list of
 * alternatives, each a sequence of elements, each element either a character
 * class (sorted disjoint code-point ranges; a literal is one single-character
 * class per character) or a reference to a rule. Groups become helper rules;
 * repetitions become helper rules too: x* is R ::= x R | "", x{m,n} is m
 * copies of x then a chain of n - m optional copies. Rule ends are tail
 * calls, so a repetition does not grow the stack.
 *
 * Checks at compile time (so the matcher never loops or dead-ends): every
 * referenced rule is defined, no rule is left-recursive (also through
 * rules that can match the empty string, which catches a repetition of
 * something that can be empty), every rule reachable from the root can
 * finish, no character class is empty. With every rule productive, any
 * stack the matcher holds can be completed to a string of the language, so
 * "some stack survives" is exactly "the bytes so far are a valid prefix".
 *
 * Matcher: the set-of-stacks pushdown recognizer (as llama.cpp's grammar).
 * A stack is a list of positions (a position is an element index: the
 * top one is the class to match next, the ones below are where to continue
 * when a rule ends); stacks are hash-consed as (position, parent) frames,
 * so a stack is one int (frame 0 is the empty stack: the grammar may end
 * here). A parse state is a set of stacks plus a pending partial UTF-8
 * character (the code points it can still become form one range, because
 * UTF-8 preserves order); states are interned too, and transitions on a
 * byte are cached per state in a 256-entry row: after the first visit a
 * state's byte step is one array read, so the matcher is a lazily built
 * DFA over the parse states it meets. Masks are cached per state.
 *
 * The per-vocabulary table is a byte trie of all tokens laid out in
 * preorder (node i's subtree is [i, end[i])), so a mask is one pass over
 * the node array: a node whose byte leads nowhere skips its whole subtree,
 * and shared prefixes are stepped once. EOG tokens are not in the trie;
 * they are allowed iff the state may end. Tokens with no bytes (control
 * tokens) are never allowed.
 *
 * The cache (frames, states, transitions, masks) belongs to the matchers
 * of one grammar and vocabulary: gmatch_copy shares it (reference
 * counted, atomically: copies may be made and freed on any thread). It
 * only grows, and ids never change, so copies stay independent; stepping
 * and masking are not thread-safe (one engine thread does them).
 * Masks are dropped when they exceed a memory bound (GM_MASK_BYTES).
 */
#include "decode/grammar.h"
#include "decode/grammar_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

/* ---- parser -------------------------------------------------------------- */

typedef struct {
    gelem *el;
    int32_t n, cap;
    char *name; /* NULL: a helper rule */
    bool defined;
    int line, col; /* where it is defined, first used, or (helpers) what it comes from */
    bool repeat;   /* a repetition's helper rule */
} prule;

typedef struct {
    const char *start, *s, *end, *line_start;
    int line;
    prule *rules;
    int32_t n_rules, cap_rules;
    grange *ranges;
    int32_t n_ranges, cap_ranges;
    gclass *cls;
    int32_t n_cls, cap_cls;
    int64_t total; /* elements emitted, bounded */
    char *err;
    size_t errlen;
    bool failed;
    int depth;
} parser;

enum { MAX_ELEMS = 1 << 20, MAX_REPEAT = 1000, MAX_DEPTH = 200 };

static int col_of(const parser *p, const char *at) { return (int)(at - p->line_start) + 1; }

static int perr(parser *p, const char *at, const char *fmt, const char *arg) {
    if (p->failed) return -1;
    p->failed = true;
    char what[200];
    snprintf(what, sizeof what, fmt, arg ? arg : "");
    /* the line and column of at, counted from the text's start */
    int line = 1;
    const char *ls = p->start;
    for (const char *q = p->start; q < at; q++)
        if (*q == '\n') line++, ls = q + 1;
    lm_err(p->err, p->errlen, "line %d, column %d: %s", line, (int)(at - ls) + 1, what);
    return -1;
}

static void *grow(void *a, int32_t *cap, int32_t need, size_t elsize) {
    if (need <= *cap) return a;
    int32_t nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    void *b = lm_realloc(a, (size_t)nc * elsize);
    if (b) *cap = nc;
    return b;
}

#define GROW(p, arr, n, cap, need)                                                                                     \
    ({                                                                                                                 \
        void *g_ = grow((arr), &(cap), (need), sizeof *(arr));                                                         \
        if (g_) (arr) = g_;                                                                                            \
        g_ != NULL;                                                                                                    \
    })

/* Skip blanks and comments; newlines only when nl (inside groups, after
 * `::=` and `|`). A newline at top level followed by `|` continues the rule. */
static void skip_space(parser *p, bool nl) {
    for (;;) {
        const char *s = p->s;
        while (s < p->end && (*s == ' ' || *s == '\t' || *s == '\r')) s++;
        if (s < p->end && *s == '#') {
            while (s < p->end && *s != '\n') s++;
        }
        p->s = s;
        if (s < p->end && *s == '\n') {
            if (!nl) {
                /* peek: a continuation line that starts with '|' */
                const char *t = s;
                int extra = 0;
                const char *ls = NULL;
                while (t < p->end && (*t == ' ' || *t == '\t' || *t == '\r' || *t == '\n' || *t == '#')) {
                    if (*t == '#')
                        while (t < p->end && *t != '\n') t++;
                    else {
                        if (*t == '\n') extra++, ls = t + 1;
                        t++;
                    }
                }
                if (t < p->end && *t == '|') {
                    p->line += extra;
                    p->line_start = ls;
                    p->s = t;
                }
                return;
            }
            p->line++;
            p->s = s + 1;
            p->line_start = p->s;
            continue;
        }
        return;
    }
}

static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static int32_t rule_find(parser *p, const char *name, size_t n) {
    for (int32_t i = 0; i < p->n_rules; i++)
        if (p->rules[i].name && strlen(p->rules[i].name) == n && memcmp(p->rules[i].name, name, n) == 0) return i;
    return -1;
}

static int32_t rule_add(parser *p, const char *name, size_t n, int line, int col) {
    if (!GROW(p, p->rules, p->n_rules, p->cap_rules, p->n_rules + 1)) return -1;
    prule *r = &p->rules[p->n_rules];
    memset(r, 0, sizeof *r);
    if (name && !(r->name = lm_strndup(name, n))) return -1;
    r->line = line;
    r->col = col;
    return p->n_rules++;
}

static int rule_emit(parser *p, int32_t rule, uint8_t type, int32_t val) {
    if (++p->total > MAX_ELEMS) return perr(p, p->s, "the grammar is too large%s", NULL);
    prule *r = &p->rules[rule];
    if (!GROW(p, r->el, r->n, r->cap, r->n + 1)) return perr(p, p->s, "out of memory%s", NULL);
    r->el[r->n++] = (gelem){type, val};
    return 0;
}

/* Normalize ranges (sort, merge), negate if asked, and store as a class. */
static int cmp_range(const void *a, const void *b) {
    const grange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static int32_t class_add(parser *p, grange *r, int32_t n, bool neg, const char *at) {
    if (n > 1) qsort(r, (size_t)n, sizeof *r, cmp_range);
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        if (m && r[i].lo <= r[m - 1].hi + 1) {
            if (r[i].hi > r[m - 1].hi) r[m - 1].hi = r[i].hi;
        } else r[m++] = r[i];
    }
    int32_t need = neg ? m + 2 : m;
    if (!GROW(p, p->ranges, p->n_ranges, p->cap_ranges, p->n_ranges + need + 1))
        return perr(p, at, "out of memory%s", NULL);
    int32_t off = p->n_ranges;
    if (neg) {
        uint32_t next = 0;
        for (int32_t i = 0; i < m; i++) {
            if (r[i].lo > next) p->ranges[p->n_ranges++] = (grange){next, r[i].lo - 1};
            next = r[i].hi + 1;
        }
        if (next <= CP_MAX) p->ranges[p->n_ranges++] = (grange){next, CP_MAX};
    } else {
        memcpy(p->ranges + off, r, (size_t)m * sizeof *r);
        p->n_ranges += m;
    }
    /* surrogates are not characters: cut them out (may split a range) */
    for (int32_t i = off; i < p->n_ranges; i++) {
        grange *x = &p->ranges[i];
        if (x->hi < 0xD800 || x->lo > 0xDFFF) continue;
        if (x->lo >= 0xD800 && x->hi <= 0xDFFF) {
            memmove(x, x + 1, (size_t)(p->n_ranges - i - 1) * sizeof *x);
            p->n_ranges--, i--;
        } else if (x->lo < 0xD800 && x->hi > 0xDFFF) {
            memmove(x + 2, x + 1, (size_t)(p->n_ranges - i - 1) * sizeof *x);
            p->n_ranges++;
            x[1] = (grange){0xE000, x->hi};
            x->hi = 0xD7FF;
        } else if (x->lo < 0xD800) x->hi = 0xD7FF;
        else x->lo = 0xE000;
    }
    if (p->n_ranges == off) return perr(p, at, "the character class matches nothing%s", NULL);
    if (!GROW(p, p->cls, p->n_cls, p->cap_cls, p->n_cls + 1)) return perr(p, at, "out of memory%s", NULL);
    gclass *c = &p->cls[p->n_cls];
    c->off = off;
    c->n = p->n_ranges - off;
    c->ascii[0] = c->ascii[1] = 0;
    for (int32_t i = off; i < p->n_ranges; i++)
        for (uint32_t cp = p->ranges[i].lo; cp <= p->ranges[i].hi && cp < 128; cp++)
            c->ascii[cp >> 6] |= 1ull << (cp & 63);
    return p->n_cls++;
}

/* One UTF-8 character of the source text (strict). */
static int read_utf8(parser *p, uint32_t *cp) {
    const unsigned char *s = (const unsigned char *)p->s;
    size_t avail = (size_t)(p->end - p->s);
    unsigned char b = s[0];
    int n;
    uint32_t c, min;
    if (b < 0x80) n = 1, c = b, min = 0;
    else if (b >= 0xC2 && b <= 0xDF) n = 2, c = b & 0x1F, min = 0x80;
    else if (b >= 0xE0 && b <= 0xEF) n = 3, c = b & 0x0F, min = 0x800;
    else if (b >= 0xF0 && b <= 0xF4) n = 4, c = b & 0x07, min = 0x10000;
    else return perr(p, p->s, "invalid UTF-8%s", NULL);
    if ((size_t)n > avail) return perr(p, p->s, "invalid UTF-8%s", NULL);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return perr(p, p->s, "invalid UTF-8%s", NULL);
        c = c << 6 | (s[i] & 0x3F);
    }
    if (c < min || c > CP_MAX || (c >= 0xD800 && c <= 0xDFFF)) return perr(p, p->s, "invalid UTF-8%s", NULL);
    p->s += n;
    *cp = c;
    return 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class, escapes decoded. */
static int read_char(parser *p, uint32_t *cp, bool in_class) {
    if (p->s >= p->end) return perr(p, p->s, "unexpected end of the grammar%s", NULL);
    if (*p->s == '\n') return perr(p, p->s, "unexpected end of line%s", NULL);
    if (*p->s != '\\') return read_utf8(p, cp);
    const char *at = p->s;
    if (p->s + 1 >= p->end) return perr(p, at, "unexpected end of the grammar in an escape%s", NULL);
    char e = p->s[1];
    p->s += 2;
    int digits = 0;
    switch (e) {
        case 'n': *cp = '\n'; return 0;
        case 't': *cp = '\t'; return 0;
        case 'r': *cp = '\r'; return 0;
        case '\\':
        case '"':
        case '[':
        case ']':
        case '/':
        case '\'': *cp = (uint8_t)e; return 0;
        case '-':
        case '^':
            if (!in_class) break;
            *cp = (uint8_t)e;
            return 0;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default: break;
    }
    if (!digits) {
        char s[2] = {e, 0};
        return perr(p, at, "unknown escape \\%s", s);
    }
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        int h = p->s < p->end ? hexval(*p->s) : -1;
        if (h < 0) return perr(p, at, "escape \\%s needs hexadecimal digits", e == 'x' ? "x" : e == 'u' ? "u" : "U");
        v = v << 4 | (uint32_t)h;
        p->s++;
    }
    if (v > CP_MAX || (v >= 0xD800 && v <= 0xDFFF)) return perr(p, at, "escape is not a Unicode scalar value%s", NULL);
    *cp = v;
    return 0;
}

static int parse_alternates(parser *p, int32_t rule);

/* The last element of seq as an item to repeat: a single element. */
static int emit_repeat(parser *p, int32_t rule, gelem item, int min, int max, const char *at) {
    for (int i = 0; i < min; i++)
        if (rule_emit(p, rule, item.type, item.val) < 0) return -1;
    if (max == min) return 0;
    int line = p->line, col = col_of(p, at);
    if (max < 0) { /* R ::= x R | "" */
        int32_t h = rule_add(p, NULL, 0, line, col);
        if (h < 0) return perr(p, at, "out of memory%s", NULL);
        p->rules[h].repeat = true;
        p->rules[h].defined = true;
        if (rule_emit(p, h, item.type, item.val) < 0 || rule_emit(p, h, E_REF, h) < 0 ||
            rule_emit(p, h, E_ALT, 0) < 0 || rule_emit(p, h, E_END, 0) < 0)
            return -1;
        return rule_emit(p, rule, E_REF, h);
    }
    /* R1 ::= x R2 | "" ... Rk ::= x | "" */
    int32_t first = -1, prev = -1;
    for (int i = min; i < max; i++) {
        int32_t h = rule_add(p, NULL, 0, line, col);
        if (h < 0) return perr(p, at, "out of memory%s", NULL);
        p->rules[h].repeat = true;
        p->rules[h].defined = true;
        if (rule_emit(p, h, item.type, item.val) < 0) return -1;
        if (prev >= 0) {
            /* finish prev: x h | "" */
            if (rule_emit(p, prev, E_REF, h) < 0 || rule_emit(p, prev, E_ALT, 0) < 0 ||
                rule_emit(p, prev, E_END, 0) < 0)
                return -1;
        } else first = h;
        prev = h;
    }
    if (rule_emit(p, prev, E_ALT, 0) < 0 || rule_emit(p, prev, E_END, 0) < 0) return -1;
    return rule_emit(p, rule, E_REF, first);
}

static int parse_int(parser *p, int *out) {
    if (p->s >= p->end || *p->s < '0' || *p->s > '9') return perr(p, p->s, "expected a number%s", NULL);
    long v = 0;
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
        v = v * 10 + (*p->s - '0');
        if (v > MAX_REPEAT) return perr(p, p->s, "repetition count above 1000%s", NULL);
        p->s++;
    }
    *out = (int)v;
    return 0;
}

/* A sequence of items up to '|', ')' or the end of the rule. */
static int parse_sequence(parser *p, int32_t rule, bool nested) {
    int32_t last_start = -1; /* element index of the last item, -1: none, -2: an empty literal */
    int32_t last_n = 1;      /* its element count (a literal's characters) */
    for (;;) {
        skip_space(p, nested);
        if (p->s >= p->end) return 0;
        char c = *p->s;
        const char *at = p->s;
        if (c == '"') {
            p->s++;
            last_start = p->rules[rule].n;
            last_n = 0;
            while (p->s < p->end && *p->s != '"') {
                uint32_t cp;
                if (read_char(p, &cp, false) < 0) return -1;
                grange r = {cp, cp};
                int32_t ci = class_add(p, &r, 1, false, at);
                if (ci < 0) return -1;
                if (rule_emit(p, rule, E_CLASS, ci) < 0) return -1;
                last_n++;
            }
            if (p->s >= p->end) return perr(p, at, "unterminated string literal%s", NULL);
            p->s++;
            if (last_n == 0) last_start = -2; /* "" matches the empty string */
        } else if (c == '[') {
            p->s++;
            bool neg = p->s < p->end && *p->s == '^';
            if (neg) p->s++;
            grange *rs = NULL;
            int32_t n = 0, cap = 0;
            while (p->s < p->end && *p->s != ']') {
                uint32_t lo, hi;
                if (read_char(p, &lo, true) < 0) goto class_fail;
                hi = lo;
                if (p->s + 1 < p->end && *p->s == '-' && p->s[1] != ']') {
                    p->s++;
                    const char *rat = p->s;
                    if (read_char(p, &hi, true) < 0) goto class_fail;
                    if (hi < lo) {
                        perr(p, rat, "range end below its start%s", NULL);
                        goto class_fail;
                    }
                }
                if (!GROW(p, rs, n, cap, n + 1)) {
                    perr(p, at, "out of memory%s", NULL);
                    goto class_fail;
                }
                rs[n++] = (grange){lo, hi};
            }
            if (p->s >= p->end) {
                perr(p, at, "unterminated character class%s", NULL);
                goto class_fail;
            }
            p->s++;
            if (n == 0 && !neg) {
                perr(p, at, "empty character class%s", NULL);
                goto class_fail;
            }
            int32_t ci = class_add(p, rs, n, neg, at);
            lm_free(rs);
            if (ci < 0) return -1;
            last_start = p->rules[rule].n, last_n = 1;
            if (rule_emit(p, rule, E_CLASS, ci) < 0) return -1;
            continue;
        class_fail:
            lm_free(rs);
            return -1;
        } else if (c == '.') {
            p->s++;
            grange r = {0, CP_MAX};
            int32_t ci = class_add(p, &r, 1, false, at);
            if (ci < 0) return -1;
            last_start = p->rules[rule].n, last_n = 1;
            if (rule_emit(p, rule, E_CLASS, ci) < 0) return -1;
        } else if (c == '(') {
            p->s++;
            if (++p->depth > MAX_DEPTH) return perr(p, at, "groups nested too deeply%s", NULL);
            int32_t h = rule_add(p, NULL, 0, p->line, col_of(p, at));
            if (h < 0) return perr(p, at, "out of memory%s", NULL);
            p->rules[h].defined = true;
            if (parse_alternates(p, h) < 0) return -1;
            p->depth--;
            skip_space(p, true);
            if (p->s >= p->end || *p->s != ')') return perr(p, at, "unclosed '('%s", NULL);
            p->s++;
            last_start = p->rules[rule].n, last_n = 1;
            if (rule_emit(p, rule, E_REF, h) < 0) return -1;
        } else if (is_name_char(c)) {
            const char *ns = p->s;
            while (p->s < p->end && is_name_char(*p->s)) p->s++;
            size_t nl = (size_t)(p->s - ns);
            /* the next rule's definition starts here: end of this sequence */
            const char *t = p->s;
            while (t < p->end && (*t == ' ' || *t == '\t')) t++;
            if (t + 2 < p->end && t[0] == ':' && t[1] == ':' && t[2] == '=') {
                p->s = ns;
                return 0;
            }
            int32_t ri = rule_find(p, ns, nl);
            if (ri < 0 && (ri = rule_add(p, ns, nl, p->line, col_of(p, ns))) < 0)
                return perr(p, at, "out of memory%s", NULL);
            last_start = p->rules[rule].n, last_n = 1;
            if (rule_emit(p, rule, E_REF, ri) < 0) return -1;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            const char *op = c == '{' ? "{" : c == '*' ? "*" : c == '+' ? "+" : "?";
            if (last_start == -1) return perr(p, at, "'%s' follows nothing it could repeat", op);
            if (last_start == -2) return perr(p, at, "'%s' repeats the empty string", op);
            p->s++;
            int min = 0, max = -1;
            if (c == '+') min = 1;
            else if (c == '?') max = 1;
            else if (c == '{') {
                skip_space(p, false);
                if (parse_int(p, &min) < 0) return -1;
                skip_space(p, false);
                if (p->s < p->end && *p->s == '}') max = min;
                else if (p->s < p->end && *p->s == ',') {
                    p->s++;
                    skip_space(p, false);
                    if (p->s < p->end && *p->s != '}') {
                        if (parse_int(p, &max) < 0) return -1;
                        if (max < min) return perr(p, at, "repetition {m,n} with n below m%s", NULL);
                    }
                    skip_space(p, false);
                }
                if (p->s >= p->end || *p->s != '}') return perr(p, at, "expected '}'%s", NULL);
                p->s++;
            }
            gelem item = p->rules[rule].el[last_start];
            if (last_n > 1) { /* a literal of several characters: repeat it as a helper rule */
                int32_t h = rule_add(p, NULL, 0, p->line, col_of(p, at));
                if (h < 0) return perr(p, at, "out of memory%s", NULL);
                p->rules[h].defined = true;
                for (int32_t i = 0; i < last_n; i++)
                    if (rule_emit(p, h, E_CLASS, p->rules[rule].el[last_start + i].val) < 0) return -1;
                if (rule_emit(p, h, E_END, 0) < 0) return -1;
                item = (gelem){E_REF, h};
            }
            p->rules[rule].n = last_start;
            if (emit_repeat(p, rule, item, min, max, at) < 0) return -1;
            last_start = -1; /* a repetition is not repeated again */
        } else if (c == '|' || c == ')') {
            return 0;
        } else if (c == '\n') {
            return 0;
        } else {
            char s[2] = {c, 0};
            bool printable = (unsigned char)c >= 0x20 && (unsigned char)c < 0x7f;
            return perr(p, at, "unexpected character '%s'", printable ? s : "?");
        }
    }
}

static int parse_alternates(parser *p, int32_t rule) {
    for (;;) {
        if (parse_sequence(p, rule, p->depth > 0) < 0) return -1;
        if (p->s < p->end && *p->s == '|') {
            p->s++;
            if (rule_emit(p, rule, E_ALT, 0) < 0) return -1;
            skip_space(p, true);
            continue;
        }
        return rule_emit(p, rule, E_END, 0);
    }
}

static int parse_rules(parser *p) {
    for (;;) {
        skip_space(p, true);
        if (p->s >= p->end) return 0;
        const char *ns = p->s;
        while (p->s < p->end && is_name_char(*p->s)) p->s++;
        if (p->s == ns) return perr(p, ns, "expected a rule name%s", NULL);
        size_t nl = (size_t)(p->s - ns);
        skip_space(p, false);
        if (p->end - p->s < 3 || memcmp(p->s, "::=", 3) != 0) return perr(p, p->s, "expected '::='%s", NULL);
        p->s += 3;
        int32_t ri = rule_find(p, ns, nl);
        if (ri >= 0 && p->rules[ri].defined) {
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)(nl < 60 ? nl : 60), ns);
            return perr(p, ns, "rule '%s' is defined twice", name);
        }
        if (ri < 0 && (ri = rule_add(p, ns, nl, p->line, col_of(p, ns))) < 0)
            return perr(p, ns, "out of memory%s", NULL);
        p->rules[ri].defined = true;
        p->rules[ri].line = p->line;
        p->rules[ri].col = col_of(p, ns);
        skip_space(p, true);
        if (parse_alternates(p, ri) < 0) return -1;
        if (p->s < p->end && *p->s == ')') return perr(p, p->s, "unmatched ')'%s", NULL);
    }
}

/* ---- compile-time checks ------------------------------------------------- */

static const char *rule_label(const parser *p, int32_t r, char *buf, size_t n) {
    if (p->rules[r].name) snprintf(buf, n, "rule '%.60s'", p->rules[r].name);
    else
        snprintf(buf, n, "the %s at line %d, column %d", p->rules[r].repeat ? "repetition" : "group", p->rules[r].line,
                 p->rules[r].col);
    return buf;
}

/* Nullable and productive rules by fixpoint. */
static void fixpoint(const parser *p, bool *flag, bool productive) {
    bool changed = true;
    while (changed) {
        changed = false;
        for (int32_t r = 0; r < p->n_rules; r++) {
            if (flag[r]) continue;
            const prule *R = &p->rules[r];
            bool ok = true;
            for (int32_t i = 0; i < R->n; i++) {
                gelem e = R->el[i];
                if (e.type == E_END) break;
                if (e.type == E_ALT) {
                    if (ok) break;
                    ok = true;
                    continue;
                }
                if (!ok) continue;
                if (e.type == E_CLASS) ok = productive;
                else ok = flag[e.val];
            }
            if (ok) flag[r] = changed = true;
        }
    }
}

/* DFS over leftmost references for a cycle; color 0 new, 1 on path, 2 done.
 * The rule on a cycle, -1 for none, -2 when references nest deeper than
 * MAX_LEFT_DEPTH (refused rather than risking the C stack). */
enum { MAX_LEFT_DEPTH = 4000 };
static int32_t left_cycle(const parser *p, const bool *nullable, int32_t r, uint8_t *color, int depth) {
    if (depth > MAX_LEFT_DEPTH) return -2;
    color[r] = 1;
    const prule *R = &p->rules[r];
    bool blocked = false;
    for (int32_t i = 0; i < R->n; i++) {
        gelem e = R->el[i];
        if (e.type == E_ALT || e.type == E_END) {
            blocked = false;
            continue;
        }
        if (blocked) continue;
        if (e.type == E_CLASS) {
            blocked = true;
            continue;
        }
        if (color[e.val] == 1) return e.val;
        if (color[e.val] == 0) {
            int32_t c = left_cycle(p, nullable, e.val, color, depth + 1);
            if (c != -1) return c;
        }
        if (!nullable[e.val]) blocked = true;
    }
    color[r] = 2;
    return -1;
}

static int check_rules(parser *p, int32_t root) {
    char lab[160];
    for (int32_t r = 0; r < p->n_rules; r++)
        if (!p->rules[r].defined) {
            p->line = p->rules[r].line;
            lm_err(p->err, p->errlen, "line %d, column %d: undefined rule '%.60s'", p->rules[r].line, p->rules[r].col,
                   p->rules[r].name);
            return -1;
        }
    bool *nullable = lm_calloc((size_t)p->n_rules, 1), *prod = lm_calloc((size_t)p->n_rules, 1);
    uint8_t *color = lm_calloc((size_t)p->n_rules, 1);
    int rc = -1;
    if (!nullable || !prod || !color) {
        lm_err(p->err, p->errlen, "out of memory");
        goto done;
    }
    fixpoint(p, nullable, false);
    fixpoint(p, prod, true);
    for (int32_t r = 0; r < p->n_rules; r++) {
        if (color[r]) continue;
        int32_t c = left_cycle(p, nullable, r, color, 0);
        if (c == -2) {
            lm_err(p->err, p->errlen, "rules refer to each other more than %d deep at their start", MAX_LEFT_DEPTH);
            goto done;
        }
        if (c >= 0) {
            if (p->rules[c].repeat)
                lm_err(p->err, p->errlen, "line %d, column %d: repetition of something that can match the empty string",
                       p->rules[c].line, p->rules[c].col);
            else
                lm_err(p->err, p->errlen, "line %d, column %d: %s is left-recursive", p->rules[c].line, p->rules[c].col,
                       rule_label(p, c, lab, sizeof lab));
            goto done;
        }
    }
    /* reachable rules must be able to finish */
    memset(color, 0, (size_t)p->n_rules);
    int32_t *work = lm_malloc((size_t)p->n_rules * sizeof *work);
    if (!work) {
        lm_err(p->err, p->errlen, "out of memory");
        goto done;
    }
    int32_t nw = 0;
    work[nw++] = root;
    color[root] = 1;
    int32_t bad = -1; /* an unproductive rule, preferring one that refers to itself */
    while (nw) {
        int32_t r = work[--nw];
        if (!prod[r]) {
            bool self = false;
            for (int32_t i = 0; i < p->rules[r].n; i++)
                self |= p->rules[r].el[i].type == E_REF && p->rules[r].el[i].val == r;
            if (bad < 0 || self) bad = r;
        }
        for (int32_t i = 0; i < p->rules[r].n; i++) {
            gelem e = p->rules[r].el[i];
            if (e.type == E_REF && !color[e.val]) color[e.val] = 1, work[nw++] = e.val;
        }
    }
    if (bad >= 0) {
        lm_err(p->err, p->errlen, "line %d, column %d: %s can never finish (every alternative recurses)",
               p->rules[bad].line, p->rules[bad].col, rule_label(p, bad, lab, sizeof lab));
        lm_free(work);
        goto done;
    }
    lm_free(work);
    rc = 0;
done:
    lm_free(nullable);
    lm_free(prod);
    lm_free(color);
    return rc;
}

static void parser_free(parser *p) {
    for (int32_t i = 0; i < p->n_rules; i++) {
        lm_free(p->rules[i].el);
        lm_free(p->rules[i].name);
    }
    lm_free(p->rules);
    lm_free(p->ranges);
    lm_free(p->cls);
}

size_t grammar_bytes(const lm_grammar *g) {
    int32_t n_ranges = 0;
    for (int32_t i = 0; i < g->n_cls; i++)
        if (g->cls[i].off + g->cls[i].n > n_ranges) n_ranges = g->cls[i].off + g->cls[i].n;
    return sizeof *g + (size_t)g->n_el * sizeof *g->el + (size_t)n_ranges * sizeof *g->ranges +
        (size_t)g->n_cls * sizeof *g->cls + (size_t)(g->n_rules + 1) * sizeof *g->alt_off +
        (size_t)g->alt_off[g->n_rules] * sizeof *g->alt_pos;
}

void grammar_free(lm_grammar *g) {
    if (!g) return;
    lm_free(g->el);
    lm_free(g->ranges);
    lm_free(g->cls);
    lm_free(g->alt_off);
    lm_free(g->alt_pos);
    lm_free(g);
}

/* Flatten the parser's rules into one element array. */
static lm_grammar *flatten(parser *p, int32_t root) {
    lm_grammar *g = lm_calloc(1, sizeof *g);
    if (!g) return NULL;
    int32_t n_el = 0, n_alt = 0;
    for (int32_t r = 0; r < p->n_rules; r++) {
        n_el += p->rules[r].n;
        for (int32_t i = 0; i < p->rules[r].n; i++)
            if (p->rules[r].el[i].type == E_ALT || p->rules[r].el[i].type == E_END) n_alt++;
    }
    g->el = lm_malloc((size_t)n_el * sizeof *g->el);
    g->alt_off = lm_malloc((size_t)(p->n_rules + 1) * sizeof *g->alt_off);
    g->alt_pos = lm_malloc((size_t)n_alt * sizeof *g->alt_pos);
    g->ranges = lm_malloc((size_t)(p->n_ranges ? p->n_ranges : 1) * sizeof *g->ranges);
    g->cls = lm_malloc((size_t)(p->n_cls ? p->n_cls : 1) * sizeof *g->cls);
    if (!g->el || !g->alt_off || !g->alt_pos || !g->ranges || !g->cls) {
        grammar_free(g);
        return NULL;
    }
    if (p->n_ranges) memcpy(g->ranges, p->ranges, (size_t)p->n_ranges * sizeof *g->ranges);
    if (p->n_cls) memcpy(g->cls, p->cls, (size_t)p->n_cls * sizeof *g->cls);
    g->n_cls = p->n_cls;
    int32_t e = 0, a = 0;
    for (int32_t r = 0; r < p->n_rules; r++) {
        g->alt_off[r] = a;
        g->alt_pos[a++] = e;
        for (int32_t i = 0; i < p->rules[r].n; i++) {
            g->el[e++] = p->rules[r].el[i];
            if (p->rules[r].el[i].type == E_ALT) g->alt_pos[a++] = e;
        }
    }
    g->alt_off[p->n_rules] = a;
    g->n_el = n_el;
    g->n_rules = p->n_rules;
    g->root = root;
    return g;
}

lm_grammar *grammar_parse(const char *text, size_t len, const char *root, char *err, size_t errlen) {
    if (!text) text = "", len = 0;
    parser p = {
        .start = text, .s = text, .end = text + len, .line_start = text, .line = 1, .err = err, .errlen = errlen};
    if (!root) root = "root";
    lm_grammar *g = NULL;
    if (parse_rules(&p) < 0) goto done;
    int32_t ri = rule_find(&p, root, strlen(root));
    if (ri < 0 || !p.rules[ri].defined) {
        lm_err(err, errlen, "the grammar has no rule named '%.60s'", root);
        goto done;
    }
    if (check_rules(&p, ri) < 0) goto done;
    if (!(g = flatten(&p, ri))) lm_err(err, errlen, "out of memory compiling the grammar");
done:
    parser_free(&p);
    return g;
}

/* ---- vocabulary ---------------------------------------------------------- */

void grammar_vocab_free(lm_gvocab *v) {
    if (!v) return;
    lm_free(v->bytes);
    lm_free(v->off);
    lm_free(v->eog);
    lm_free(v->nb);
    lm_free(v->depth);
    lm_free(v->end);
    lm_free(v->tok_off);
    lm_free(v->toks);
    lm_free(v);
}

int32_t grammar_vocab_size(const lm_gvocab *v) { return v->n_vocab; }

static const lm_gvocab *sort_v;
static int cmp_tok(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    int64_t lx = sort_v->off[x + 1] - sort_v->off[x], ly = sort_v->off[y + 1] - sort_v->off[y];
    int c = memcmp(sort_v->bytes + sort_v->off[x], sort_v->bytes + sort_v->off[y], (size_t)(lx < ly ? lx : ly));
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* The trie in preorder from the tokens sorted by bytes. */
static int build_trie(lm_gvocab *v) {
    int32_t n = 0;
    for (int32_t t = 0; t < v->n_vocab; t++)
        if (!v->eog[t] && v->off[t + 1] > v->off[t]) n++;
    v->toks = lm_malloc((size_t)(n ? n : 1) * sizeof *v->toks);
    if (!v->toks) return -1;
    n = 0;
    for (int32_t t = 0; t < v->n_vocab; t++)
        if (!v->eog[t] && v->off[t + 1] > v->off[t]) v->toks[n++] = t;
    sort_v = v;
    qsort(v->toks, (size_t)n, sizeof *v->toks, cmp_tok);
    sort_v = NULL;
    /* nodes: at most total bytes + 1 */
    int64_t cap = 1;
    for (int32_t i = 0; i < n; i++) cap += v->off[v->toks[i] + 1] - v->off[v->toks[i]];
    if (cap > INT32_MAX / 2) return -1;
    v->nb = lm_malloc((size_t)cap);
    v->depth = lm_malloc((size_t)cap * sizeof *v->depth);
    v->end = lm_malloc((size_t)cap * sizeof *v->end);
    v->tok_off = lm_calloc((size_t)cap + 1, sizeof *v->tok_off);
    int32_t *path = lm_malloc((size_t)(1 << 16) * sizeof *path);
    if (!v->nb || !v->depth || !v->end || !v->tok_off || !path) {
        lm_free(path);
        return -1;
    }
    int32_t nn = 1, plen = 0; /* path[0..plen): nodes of the previous token's bytes (depth 1..plen) */
    v->nb[0] = 0;
    v->depth[0] = 0;
    int32_t *cnt = v->tok_off; /* count per node first, prefix-summed below */
    const unsigned char *prev = NULL;
    int64_t prev_len = 0;
    v->max_depth = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t t = v->toks[i];
        const unsigned char *b = (const unsigned char *)v->bytes + v->off[t];
        int64_t len = v->off[t + 1] - v->off[t];
        if (len > 65535) len = 65535; /* never happens for real vocabularies */
        int64_t l = 0;
        while (prev && l < len && l < prev_len && b[l] == prev[l]) l++;
        while (plen > l) v->end[path[--plen]] = nn;
        for (int64_t d = l; d < len; d++) {
            v->nb[nn] = b[d];
            v->depth[nn] = (uint16_t)(d + 1);
            path[plen++] = nn++;
        }
        if (len > v->max_depth) v->max_depth = (int)len;
        cnt[path[plen - 1] + 1]++;
        prev = b;
        prev_len = len;
    }
    while (plen > 0) v->end[path[--plen]] = nn;
    v->end[0] = nn;
    for (int32_t i = 0; i < nn; i++) cnt[i + 1] += cnt[i];
    v->n_nodes = nn;
    lm_free(path);
    return 0;
}

lm_gvocab *grammar_vocab_from_bytes(int32_t n, const char *const *bytes, const int *lens, const bool *eog, char *err,
                                    size_t errlen) {
    lm_gvocab *v = lm_calloc(1, sizeof *v);
    if (!v || n <= 0) goto fail;
    v->n_vocab = n;
    v->off = lm_malloc((size_t)(n + 1) * sizeof *v->off);
    v->eog = lm_calloc((size_t)n, 1);
    if (!v->off || !v->eog) goto fail;
    int64_t total = 0;
    for (int32_t t = 0; t < n; t++) total += lens[t] > 0 ? lens[t] : 0;
    if (!(v->bytes = lm_malloc((size_t)(total ? total : 1)))) goto fail;
    total = 0;
    for (int32_t t = 0; t < n; t++) {
        v->off[t] = total;
        if (lens[t] > 0) memcpy(v->bytes + total, bytes[t], (size_t)lens[t]), total += lens[t];
        v->eog[t] = eog && eog[t];
    }
    v->off[n] = total;
    if (build_trie(v) < 0) goto fail;
    return v;
fail:
    lm_err(err, errlen, n <= 0 ? "empty vocabulary" : "out of memory building the grammar's vocabulary tables");
    grammar_vocab_free(v);
    return NULL;
}

lm_gvocab *grammar_vocab_new(const lm_tokenizer *tok, char *err, size_t errlen) {
    int32_t n = tok_n_vocab(tok);
    char **bytes = lm_calloc((size_t)(n > 0 ? n : 1), sizeof *bytes);
    int *lens = lm_calloc((size_t)(n > 0 ? n : 1), sizeof *lens);
    bool *eog = lm_calloc((size_t)(n > 0 ? n : 1), sizeof *eog);
    lm_gvocab *v = NULL;
    char buf[512];
    if (!bytes || !lens || !eog) goto done;
    for (int32_t t = 0; t < n; t++) {
        eog[t] = tok_is_eog(tok, t);
        int w = tok_token_bytes(tok, t, false, buf, (int)sizeof buf);
        if (w < 0) w = 0;
        if (w > (int)sizeof buf) {
            char *big = lm_malloc((size_t)w);
            if (!big) goto done;
            tok_token_bytes(tok, t, false, big, w);
            bytes[t] = big;
        } else if (w > 0) {
            if (!(bytes[t] = lm_malloc((size_t)w))) goto done;
            memcpy(bytes[t], buf, (size_t)w);
        }
        lens[t] = w;
    }
    v = grammar_vocab_from_bytes(n, (const char *const *)bytes, lens, eog, err, errlen);
    goto out;
done:
    lm_err(err, errlen, "out of memory building the grammar's vocabulary tables");
out:
    if (bytes)
        for (int32_t t = 0; t < n; t++) lm_free(bytes[t]);
    lm_free(bytes);
    lm_free(lens);
    lm_free(eog);
    return v;
}
