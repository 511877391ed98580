/*
 * json_gbnf.c - GBNF text for pieces of JSON, for json_schema.c: literals
 * and class characters in GBNF's escapes, characters as JSON strings spell
 * them, exact integer ranges as digit rules, a regular-expression subset
 * (JSON Schema's "pattern") as rules over JSON string contents, and the
 * fixed rules of the supported formats.
 *
 * Integer ranges: [lo, hi] splits into negative and non-negative parts and
 * each into runs of the same digit count; a same-length range [a, b] is
 * a's first digit followed by a's tail up to 9s, the whole first digits
 * between, and b's first digit followed by 0s up to b's tail. No leading
 * zeros, no "-0"; an unbounded side stops at 16 digits, as the integer rule.
 *
 * Patterns: literals, classes [..] [^..] with ranges, escapes (\d \w \s
 * \D \W \S, \n \t \r \f \v, \xHH, \uHHHH, escaped punctuation), ".",
 * groups ( ) and (?: ), alternation, quantifiers * + ? {m} {m,} {m,n} (lazy
 * ones match the same strings), anchors ^ and $ at the ends of top-level
 * alternatives. Everything else (lookaround, backreferences, \b, named
 * groups, possessive quantifiers, POSIX classes) is refused, named. A
 * matched character is written as JSON writes it: quote, backslash and
 * control characters as escapes. Negated classes and "." produce no
 * control characters; \d \w \s are ASCII, and \D \W \S (or a negated
 * class holding \d \w \s) printable ASCII only: Python's re takes the
 * shorthands Unicode-wide, ECMA-262 ASCII-only, and the strings produced
 * match the pattern under both.
 */
#include "decode/json_gbnf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

/* Bytes as a GBNF literal "..." (quote, backslash and control bytes escaped). */
void jgbnf_lit(strbuf *b, const char *s, size_t n) {
    strbuf_puts(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') {
            char e[2] = {'\\', (char)ch};
            strbuf_put(b, e, 2);
        } else if (ch < 0x20 || ch == 0x7f) {
            strbuf_printf(b, "\\x%02X", ch);
        } else {
            strbuf_put(b, &s[i], 1);
        }
    }
    strbuf_puts(b, "\"");
}

/* A code point inside a GBNF class [...]: alphanumerics and non-ASCII as
 * UTF-8, the rest as \xHH. */
void jgbnf_class_cp(strbuf *b, uint32_t cp) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9')) {
        char ch = (char)cp;
        strbuf_put(b, &ch, 1);
    } else if (cp < 0x80) {
        strbuf_printf(b, "\\x%02X", (unsigned)cp);
    } else {
        char u[4];
        int n;
        if (cp < 0x800) {
            u[0] = (char)(0xC0 | (cp >> 6));
            u[1] = (char)(0x80 | (cp & 0x3F));
            n = 2;
        } else if (cp < 0x10000) {
            u[0] = (char)(0xE0 | (cp >> 12));
            u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
            u[2] = (char)(0x80 | (cp & 0x3F));
            n = 3;
        } else {
            u[0] = (char)(0xF0 | (cp >> 18));
            u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
            u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
            u[3] = (char)(0x80 | (cp & 0x3F));
            n = 4;
        }
        strbuf_put(b, u, (size_t)n);
    }
}

/* The JSON string-content spelling of one code point, as a GBNF literal:
 * quote, backslash and control characters escaped the JSON way. */
void jgbnf_json_cp(strbuf *b, uint32_t cp) {
    char u[8];
    size_t n = 0;
    if (cp == '"' || cp == '\\') {
        u[0] = '\\';
        u[1] = (char)cp;
        n = 2;
    } else if (cp < 0x20) {
        const char *e = cp == '\n' ? "\\n"
            : cp == '\t'           ? "\\t"
            : cp == '\r'           ? "\\r"
            : cp == '\b'           ? "\\b"
            : cp == '\f'           ? "\\f"
                                   : NULL;
        if (e) {
            memcpy(u, e, 2);
            n = 2;
        } else {
            n = (size_t)snprintf(u, sizeof u, "\\u%04x", (unsigned)cp);
        }
    } else {
        strbuf tmp = {0};
        jgbnf_class_cp(&tmp, cp); /* UTF-8 for non-ASCII, raw or \xHH for ASCII */
        if (cp < 0x80 || tmp.failed) {
            u[0] = cp < 0x80 ? (char)cp : '?'; /* '?' only when out of memory: caught later */
            n = 1;
            b->failed |= tmp.failed;
        } else {
            memcpy(u, tmp.p, tmp.len);
            n = tmp.len;
        }
        strbuf_free(&tmp);
    }
    jgbnf_lit(b, u, n);
}

/* Decode one UTF-8 code point at s (n bytes left); returns its length, 0 on
 * malformed input. */
int jgbnf_utf8(const char *s, size_t n, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    if (n == 0) return 0;
    if (u[0] < 0x80) {
        *cp = u[0];
        return 1;
    }
    int len = (u[0] & 0xE0) == 0xC0 ? 2 : (u[0] & 0xF0) == 0xE0 ? 3 : (u[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || (size_t)len > n) return 0;
    uint32_t v = u[0] & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (u[i] & 0x3F);
    }
    *cp = v;
    return len;
}

/* "{m,n}" ("{m,}" when n < 0), with the shorter forms for 0/1 bounds. */
void jgbnf_repeat(strbuf *b, long m, long n) {
    if (m == 0 && n < 0) strbuf_puts(b, "*");
    else if (m == 1 && n < 0) strbuf_puts(b, "+");
    else if (m == 0 && n == 1) strbuf_puts(b, "?");
    else if (m == 1 && n == 1) return;
    else if (n < 0) strbuf_printf(b, "{%ld,}", m);
    else if (m == n) strbuf_printf(b, "{%ld}", m);
    else strbuf_printf(b, "{%ld,%ld}", m, n);
}

/* ---- integer ranges: exact digit rules ---- */

/* Same-length decimal strings lo <= hi (n digits): the digit strings
 * between them, as a GBNF expression. */
static void digits_range(strbuf *e, const char *lo, const char *hi, int n) {
    static const char zeros[] = "00000000000000000000", nines[] = "99999999999999999999";
    bool lz = true, h9 = true;
    for (int i = 1; i < n; i++) {
        lz &= lo[i] == '0';
        h9 &= hi[i] == '9';
    }
    if (lo[0] == hi[0]) {
        strbuf_printf(e, "\"%c\"", lo[0]);
        if (n > 1) {
            strbuf_puts(e, " ");
            digits_range(e, lo + 1, hi + 1, n - 1);
        }
        return;
    }
    char a = lz ? lo[0] : (char)(lo[0] + 1), z = h9 ? hi[0] : (char)(hi[0] - 1);
    int alts = 0;
    strbuf_puts(e, "(");
    if (!lz) { /* lo's first digit, then lo's tail up to all nines */
        strbuf_printf(e, " \"%c\" ", lo[0]);
        digits_range(e, lo + 1, nines, n - 1);
        alts++;
    }
    if (a <= z) { /* whole decades in between */
        strbuf_printf(e, "%s [%c-%c]", alts++ ? " |" : "", a, z);
        if (n > 2) strbuf_printf(e, " [0-9]{%d}", n - 1);
        else if (n == 2) strbuf_puts(e, " [0-9]");
    }
    if (!h9) { /* hi's first digit, then all zeros up to hi's tail */
        strbuf_printf(e, "%s \"%c\" ", alts ? " |" : "", hi[0]);
        digits_range(e, zeros, hi + 1, n - 1);
    }
    strbuf_puts(e, " )");
}

static int ndigits(uint64_t v) {
    int n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

/* Non-negative integers in [a, b] (no upper bound without has_b: then up
 * to 16 digits, as the integer rule), without leading zeros. */
static void uint_range(strbuf *e, uint64_t a, bool has_b, uint64_t b) {
    int la = ndigits(a), lb = has_b ? ndigits(b) : la;
    strbuf_puts(e, "(");
    for (int L = la; L <= lb; L++) {
        uint64_t p = 1;
        for (int i = 1; i < L; i++) p *= 10;
        uint64_t lo = L == la ? a : p, hi = (has_b && L == lb) ? b : p * 10 - 1;
        char ls[24], hs[24];
        snprintf(ls, sizeof ls, "%llu", (unsigned long long)lo);
        snprintf(hs, sizeof hs, "%llu", (unsigned long long)hi);
        strbuf_puts(e, L > la ? " | " : " ");
        digits_range(e, ls, hs, L);
    }
    if (!has_b && la < 16) strbuf_printf(e, " | [1-9] [0-9]{%d,15}", la);
    strbuf_puts(e, " )");
}

/* Integers in [lo, hi] (a missing bound: unbounded, up to 16 digits). */
void jgbnf_int_range(strbuf *e, bool hl, int64_t lo, bool hh, int64_t hi) {
    bool neg = !hl || lo < 0, pos = !hh || hi >= 0;
    strbuf_puts(e, "(");
    if (neg) { /* magnitudes [-min(hi, -1), -lo] */
        int64_t top = hh && hi < -1 ? hi : -1;
        strbuf_puts(e, " \"-\" ");
        uint_range(e, (uint64_t)(-top), hl, hl ? (uint64_t)(-lo) : 0);
    }
    if (pos) {
        strbuf_puts(e, neg ? " | " : " ");
        uint_range(e, hl && lo > 0 ? (uint64_t)lo : 0, hh, hh ? (uint64_t)hi : 0);
    }
    strbuf_puts(e, " )");
}

/* Numbers in [lo, hi] (integer bounds, as for jgbnf_int_range): the
 * integers, and decimals i.f whose whole interval [i, i + 1) (or, negative,
 * (-(i + 1), -i]) lies within the bounds. */
void jgbnf_num_range(strbuf *e, bool hl, int64_t lo, bool hh, int64_t hi) {
    strbuf_puts(e, "( ");
    jgbnf_int_range(e, hl, lo, hh, hi);
    /* non-negative whole parts i in [max(0, lo), hi - 1] */
    int64_t a = hl && lo > 0 ? lo : 0;
    if (!hh || hi - 1 >= a) {
        strbuf_puts(e, " | ");
        uint_range(e, (uint64_t)a, hh, hh ? (uint64_t)(hi - 1) : 0);
        strbuf_puts(e, " \".\" [0-9]{1,16}");
    }
    /* negative ones: -(i.f) for i in [max(0, -hi), -lo - 1] */
    int64_t b = hh && hi < 0 ? -hi : 0;
    if (!hl || -lo - 1 >= b) {
        strbuf_puts(e, " | \"-\" ");
        uint_range(e, (uint64_t)b, hl, hl ? (uint64_t)(-lo - 1) : 0);
        strbuf_puts(e, " \".\" [0-9]{1,16}");
    }
    strbuf_puts(e, " )");
}

/* ---- pattern: a regular-expression subset ---- */

/* Compiled to the JSON spellings of the strings it matches: literal
 * characters as JSON writes them (quote, backslash and control characters
 * escaped), classes as GBNF classes plus escaped alternatives. Search
 * semantics: without ^ / $ any characters may come before / after. */

typedef struct {
    char *err; /* the caller's message buffer (errlen bytes) */
    size_t errlen;
    bool *any_char;      /* set when the char rule is used */
    const char *start;   /* the pattern */
    const char *p, *end; /* the part left to read */
    int depth;           /* group nesting */
} rx;

typedef struct {
    uint32_t lo, hi;
} cprange;

#define RX_MAX_RANGES 256

static int rx_fail(rx *r, const char *what) {
    return lm_err(r->err, r->errlen, "pattern: %s (at offset %d)", what, (int)(r->p - r->start));
}

/* A class's GBNF form: the characters JSON writes raw in one [...], the
 * rest as escaped literals. Negated: every character but those, except
 * control characters (not produced). */
/* A negated class holding a shorthand (\D \W \S, [^\d...]): the printable
 * ASCII characters outside it. Python's \d \w \s are Unicode-wide and
 * ECMA-262's ASCII, so only ASCII is outside both. */
static int class_expr(rx *r, const cprange *rg, int n, bool neg, strbuf *e);

static int ascii_complement(rx *r, const cprange *rg, int n, strbuf *e) {
    cprange out[64];
    int k = 0;
    for (uint32_t c = 0x20; c <= 0x7E; c++) {
        bool in = false;
        for (int i = 0; i < n; i++) in |= rg[i].lo <= c && c <= rg[i].hi;
        if (in) continue;
        if (k && out[k - 1].hi == c - 1) out[k - 1].hi = c;
        else if (k < 64) out[k++] = (cprange){c, c};
    }
    return class_expr(r, out, k, false, e);
}

static int class_expr(rx *r, const cprange *rg, int n, bool neg, strbuf *e) {
    int alts = 0;
    strbuf_puts(e, "(");
    if (neg) {
        bool q = false, bs = false;
        strbuf_puts(e, " [^");
        for (int i = 0; i < n; i++) {
            q |= rg[i].lo <= '"' && '"' <= rg[i].hi;
            bs |= rg[i].lo <= '\\' && '\\' <= rg[i].hi;
            jgbnf_class_cp(e, rg[i].lo);
            if (rg[i].hi > rg[i].lo) {
                strbuf_puts(e, "-");
                jgbnf_class_cp(e, rg[i].hi);
            }
        }
        strbuf_puts(e, "\\x22\\x5C\\x00-\\x1F]");
        if (!q) strbuf_puts(e, " | \"\\\\\\\"\"");
        if (!bs) strbuf_puts(e, " | \"\\\\\\\\\"");
        strbuf_puts(e, " )");
        return 0;
    }
    /* Raw characters: each range cut around controls, quote, backslash and
     * the surrogates. */
    static const cprange raw[] = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0xD7FF}, {0xE000, 0x10FFFF}};
    strbuf cls = {0};
    for (int i = 0; i < n; i++) {
        for (size_t k = 0; k < sizeof raw / sizeof raw[0]; k++) {
            uint32_t a = rg[i].lo > raw[k].lo ? rg[i].lo : raw[k].lo;
            uint32_t b = rg[i].hi < raw[k].hi ? rg[i].hi : raw[k].hi;
            if (a > b) continue;
            jgbnf_class_cp(&cls, a);
            if (b > a) {
                strbuf_puts(&cls, "-");
                jgbnf_class_cp(&cls, b);
            }
        }
    }
    if (cls.failed) return lm_err(r->err, r->errlen, "out of memory");
    if (cls.len) {
        strbuf_printf(e, " [%s]", cls.p);
        alts++;
    }
    strbuf_free(&cls);
    for (uint32_t cp = 0; cp < 0x20 || cp == '"' || cp == '\\'; cp = cp + 1 == 0x20 ? '"' : cp == '"' ? '\\' : cp + 1) {
        bool in = false;
        for (int i = 0; i < n; i++) in |= rg[i].lo <= cp && cp <= rg[i].hi;
        if (!in) continue;
        strbuf_puts(e, alts++ ? " | " : " ");
        jgbnf_json_cp(e, cp);
    }
    if (!alts) return rx_fail(r, "a class that matches no character JSON can write");
    strbuf_puts(e, " )");
    return 0;
}

/* Parse \xHH / \uHHHH after the letter; 0 on malformed. */
static int rx_hex(rx *r, int ndig, uint32_t *cp) {
    uint32_t v = 0;
    for (int i = 0; i < ndig; i++) {
        if (r->p >= r->end) return 0;
        char ch = *r->p++;
        int d = ch >= '0' && ch <= '9' ? ch - '0'
            : ch >= 'a' && ch <= 'f'   ? ch - 'a' + 10
            : ch >= 'A' && ch <= 'F'   ? ch - 'A' + 10
                                       : -1;
        if (d < 0) return 0;
        v = v * 16 + (uint32_t)d;
    }
    *cp = v;
    return 1;
}

/* One escape after '\': either a shorthand class (ranges into rg, *nr,
 * *neg) or a single code point (*cp, return 1). Returns 2 for a class, -1
 * on error. */
static int rx_escape(rx *r, uint32_t *cp, cprange *rg, int *nr, bool *neg) {
    if (r->p >= r->end) return rx_fail(r, "a trailing backslash");
    char ch = *r->p++;
    *neg = false;
    switch (ch) {
        case 'd':
        case 'D':
            rg[0] = (cprange){'0', '9'};
            *nr = 1;
            *neg = ch == 'D';
            return 2;
        case 'w':
        case 'W':
            rg[0] = (cprange){'0', '9'};
            rg[1] = (cprange){'A', 'Z'};
            rg[2] = (cprange){'_', '_'};
            rg[3] = (cprange){'a', 'z'};
            *nr = 4;
            *neg = ch == 'W';
            return 2;
        case 's':
        case 'S':
            rg[0] = (cprange){' ', ' '};
            rg[1] = (cprange){'\t', '\n'};
            rg[2] = (cprange){'\r', '\r'};
            *nr = 3;
            *neg = ch == 'S';
            return 2;
        case 'n': *cp = '\n'; return 1;
        case 't': *cp = '\t'; return 1;
        case 'r': *cp = '\r'; return 1;
        case 'f': *cp = '\f'; return 1;
        case 'v': *cp = '\v'; return 1;
        case 'x':
            if (!rx_hex(r, 2, cp)) return rx_fail(r, "\\x needs two hex digits");
            return 1;
        case 'u':
            if (!rx_hex(r, 4, cp) || (*cp >= 0xD800 && *cp <= 0xDFFF))
                return rx_fail(r, "\\u needs four hex digits of a non-surrogate");
            return 1;
        default: break;
    }
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')) {
        char what[64];
        snprintf(what, sizeof what, "the escape \\%c is not supported", ch);
        return rx_fail(r, what);
    }
    r->p--;
    int l = jgbnf_utf8(r->p, (size_t)(r->end - r->p), cp);
    if (!l) return rx_fail(r, "malformed UTF-8");
    r->p += l;
    return 1;
}

static int rx_class(rx *r, strbuf *e) {
    cprange rg[RX_MAX_RANGES];
    int n = 0;
    bool neg = false, shorthand = false;
    if (r->p < r->end && *r->p == '^') {
        neg = true;
        r->p++;
    }
    bool first = true;
    while (r->p < r->end && (*r->p != ']' || first)) {
        first = false;
        uint32_t a;
        if (*r->p == '[' && r->p + 1 < r->end && r->p[1] == ':')
            return rx_fail(r, "POSIX classes [:...:] are not supported");
        if (*r->p == '\\') {
            r->p++;
            cprange sh[4];
            int ns = 0;
            bool sneg;
            int k = rx_escape(r, &a, sh, &ns, &sneg);
            if (k < 0) return -1;
            if (k == 2) {
                if (sneg) return rx_fail(r, "\\D, \\W or \\S inside a class is not supported");
                shorthand = true;
                for (int i = 0; i < ns && n < RX_MAX_RANGES; i++) rg[n++] = sh[i];
                continue;
            }
        } else {
            int l = jgbnf_utf8(r->p, (size_t)(r->end - r->p), &a);
            if (!l) return rx_fail(r, "malformed UTF-8");
            r->p += l;
        }
        uint32_t b = a;
        if (r->p + 1 < r->end && *r->p == '-' && r->p[1] != ']') {
            r->p++;
            if (*r->p == '\\') {
                r->p++;
                cprange sh[4];
                int ns = 0;
                bool sneg;
                int k = rx_escape(r, &b, sh, &ns, &sneg);
                if (k < 0) return -1;
                if (k == 2) return rx_fail(r, "a class shorthand as a range's end");
            } else {
                int l = jgbnf_utf8(r->p, (size_t)(r->end - r->p), &b);
                if (!l) return rx_fail(r, "malformed UTF-8");
                r->p += l;
            }
            if (b < a) return rx_fail(r, "a range out of order in a class");
        }
        if (n == RX_MAX_RANGES) return rx_fail(r, "too many ranges in a class");
        rg[n++] = (cprange){a, b};
    }
    if (r->p >= r->end) return rx_fail(r, "an unterminated class");
    r->p++; /* ] */
    return neg && shorthand ? ascii_complement(r, rg, n, e) : class_expr(r, rg, n, neg, e);
}

/* A {m}, {m,} or {m,n} quantifier at r->p: 1 with *m, *n (-1: none), 0 when
 * the brace is not one (then it is a literal, as in Python). */
static int rx_braces(rx *r, long *m, long *n) {
    const char *q = r->p + 1;
    char *endp;
    if (q >= r->end || *q < '0' || *q > '9') return 0;
    *m = strtol(q, &endp, 10);
    q = endp;
    *n = *m;
    if (q < r->end && *q == ',') {
        q++;
        *n = -1;
        if (q < r->end && *q >= '0' && *q <= '9') {
            *n = strtol(q, &endp, 10);
            q = endp;
        }
    }
    if (q >= r->end || *q != '}') return 0;
    r->p = q + 1;
    return 1;
}

static int rx_alt(rx *r, strbuf *e, bool top, bool *dollar);

/* One atom with its quantifier, appended to e. */
static int rx_atom(rx *r, strbuf *e) {
    strbuf a = {0};
    char ch = *r->p;
    int rc = 0;
    if (ch == '(') {
        r->p++;
        if (r->p < r->end && *r->p == '?') {
            if (r->p + 1 < r->end && r->p[1] == ':') {
                r->p += 2;
            } else {
                char what[64];
                snprintf(what, sizeof what, "the group (?%c...) is not supported", r->p + 1 < r->end ? r->p[1] : ' ');
                return rx_fail(r, what);
            }
        }
        if (++r->depth > JGBNF_MAX_DEPTH) return rx_fail(r, "groups nest too deep");
        strbuf in = {0};
        rc = rx_alt(r, &in, false, NULL);
        r->depth--;
        if (rc == 0 && in.failed) rc = lm_err(r->err, r->errlen, "out of memory");
        if (rc == 0 && (r->p >= r->end || *r->p != ')')) rc = rx_fail(r, "an unclosed group");
        if (rc == 0) {
            r->p++;
            strbuf_printf(&a, "( %s )", in.len ? in.p : "\"\"");
        }
        strbuf_free(&in);
    } else if (ch == '[') {
        r->p++;
        rc = rx_class(r, &a);
    } else if (ch == '.') {
        r->p++;
        cprange nl = {'\n', '\n'};
        rc = class_expr(r, &nl, 1, true, &a);
    } else if (ch == '*' || ch == '+' || ch == '?') {
        rc = rx_fail(r, "a quantifier with nothing to repeat");
    } else if (ch == '\\') {
        r->p++;
        uint32_t cp;
        cprange rg[4];
        int nr = 0;
        bool neg;
        int k = rx_escape(r, &cp, rg, &nr, &neg);
        if (k < 0) rc = -1;
        else if (k == 2) rc = neg ? ascii_complement(r, rg, nr, &a) : class_expr(r, rg, nr, false, &a);
        else jgbnf_json_cp(&a, cp);
    } else {
        uint32_t cp;
        int l = jgbnf_utf8(r->p, (size_t)(r->end - r->p), &cp);
        if (!l) rc = rx_fail(r, "malformed UTF-8");
        else {
            r->p += l;
            jgbnf_json_cp(&a, cp);
        }
    }
    if (rc == 0 && a.failed) rc = lm_err(r->err, r->errlen, "out of memory");
    if (rc) {
        strbuf_free(&a);
        return -1;
    }
    long m = 1, n = 1;
    bool q = true;
    if (r->p < r->end && *r->p == '*') m = 0, n = -1, r->p++;
    else if (r->p < r->end && *r->p == '+') m = 1, n = -1, r->p++;
    else if (r->p < r->end && *r->p == '?') m = 0, n = 1, r->p++;
    else if (r->p < r->end && *r->p == '{' && rx_braces(r, &m, &n)) {
        if (m > JGBNF_MAX_COUNT || n > JGBNF_MAX_COUNT) rc = rx_fail(r, "a repetition count above 10000");
        else if (n >= 0 && n < m) rc = rx_fail(r, "a repetition {m,n} with n < m");
    } else q = false;
    if (q && r->p < r->end && *r->p == '?') r->p++; /* lazy: the same strings */
    else if (q && r->p < r->end && *r->p == '+') rc = rx_fail(r, "possessive quantifiers are not supported");
    if (rc == 0) {
        if (e->len) strbuf_puts(e, " ");
        if (q && !(m == 1 && n == 1)) {
            strbuf_printf(e, "( %s )", a.p);
            jgbnf_repeat(e, m, n);
        } else {
            strbuf_puts(e, a.p);
        }
    }
    strbuf_free(&a);
    return rc;
}

/* A sequence of atoms up to '|', ')' or the end. At the top level a final
 * '$' anchors it (*dollar). */
static int rx_concat(rx *r, strbuf *e, bool top, bool *dollar) {
    while (r->p < r->end && *r->p != '|' && *r->p != ')') {
        if (*r->p == '$') {
            if (top && (r->p + 1 == r->end || r->p[1] == '|')) {
                *dollar = true;
                r->p++;
                break;
            }
            return rx_fail(r, "the anchor $ is supported only at the end");
        }
        if (*r->p == '^') return rx_fail(r, "the anchor ^ is supported only at the start");
        if (rx_atom(r, e)) return -1;
    }
    return 0;
}

static int rx_alt(rx *r, strbuf *e, bool top, bool *dollar) {
    int n = 0;
    for (;;) {
        strbuf s = {0};
        if (rx_concat(r, &s, top, dollar)) {
            strbuf_free(&s);
            return -1;
        }
        if (s.failed) {
            strbuf_free(&s);
            return lm_err(r->err, r->errlen, "out of memory");
        }
        strbuf_printf(e, "%s%s", n++ ? " | " : "", s.len ? s.p : "\"\"");
        strbuf_free(&s);
        if (r->p < r->end && *r->p == '|') {
            r->p++;
            continue;
        }
        return 0;
    }
}

int jgbnf_regex(strbuf *e, const char *pat, bool *any_char, char *err, size_t errlen) {
    rx r = {err, errlen, any_char, pat, pat, pat + strlen(pat), 0};
    strbuf_puts(e, "\"\\\"\" (");
    int n = 0;
    for (;;) {
        bool caret = false, dollar = false;
        if (r.p < r.end && *r.p == '^') {
            caret = true;
            r.p++;
        }
        strbuf s = {0};
        if (rx_concat(&r, &s, true, &dollar)) {
            strbuf_free(&s);
            return -1;
        }
        if (s.failed) {
            strbuf_free(&s);
            return lm_err(err, errlen, "out of memory");
        }
        if (!caret || !dollar) *any_char = true;
        strbuf_printf(e, "%s%s %s%s", n++ ? " |" : "", caret ? "" : " char*", s.len ? s.p : "\"\"",
                      dollar ? "" : " char*");
        strbuf_free(&s);
        if (r.p < r.end && *r.p == '|') {
            r.p++;
            continue;
        }
        if (r.p < r.end) return rx_fail(&r, "an unmatched )");
        break;
    }
    strbuf_puts(e, " ) \"\\\"\"");
    return 0;
}

/* ---- formats ---- */

void jgbnf_format_rules(strbuf *o, unsigned p) {
    if (p & JGBNF_DATE) {
        /* Years 1000-2999; days exact per month, 29 February in leap years. */
        strbuf_puts(
            o,
            "date ::= year \"-\" ( mon31 \"-\" day31 | mon30 \"-\" day30 | \"02-\" day28 ) | leap \"-02-29\"\n"
            "year ::= [12] [0-9]{3}\n"
            "mon31 ::= \"0\" [13578] | \"1\" [02]\n"
            "mon30 ::= \"0\" [469] | \"11\"\n"
            "day31 ::= \"0\" [1-9] | [12] [0-9] | \"3\" [01]\n"
            "day30 ::= \"0\" [1-9] | [12] [0-9] | \"30\"\n"
            "day28 ::= \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]\n"
            "leap ::= [12] [0-9] ( \"0\" [48] | [2468] [048] | [13579] [26] ) | ( \"12\" | \"16\" | \"20\" | \"24\" | \"28\" ) \"00\"\n");
    }
    if (p & JGBNF_TIME) {
        strbuf_puts(
            o,
            "time ::= hour \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,6} )? ( \"Z\" | [+-] hour \":\" [0-5] [0-9] )\n"
            "hour ::= [01] [0-9] | \"2\" [0-3]\n");
    }
    if (p & JGBNF_DATE_TIME) strbuf_puts(o, "date-time ::= date \"T\" time\n");
    if (p & JGBNF_UUID) strbuf_puts(o, "uuid ::= hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12}\n");
    if (p & JGBNF_EMAIL) {
        strbuf_puts(o,
                    "email ::= eword ( \".\" eword )* \"@\" dlabel ( \".\" dlabel )+\n"
                    "eword ::= [a-zA-Z0-9_+-]+\n"
                    "dlabel ::= [a-zA-Z0-9] [a-zA-Z0-9-]{0,62}\n");
    }
}
