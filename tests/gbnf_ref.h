/*
 * gbnf_ref.h - a small, slow reference for GBNF grammars in tests: a parser
 * for the one-rule-per-line GBNF that json_schema.c writes, a random walk
 * that draws strings of the grammar's language, and a matcher that says
 * whether a string belongs to it. Independent of src/decode/grammar.c, so
 * the two check each other.
 *
 * Grammar: `name ::= expr` per line, `|`, `( )`, literals "..." and classes
 * [...] / [^...] with escapes (\" \\ \n \t \r \xHH \uHHHH), `*` `+` `?`
 * `{m}` `{m,}` `{m,n}`, rule names. Matching is over code points.
 *
 * Random walk: alternatives and repetition counts are drawn at random up to
 * a depth; deeper, each choice takes the way that ends soonest (the least
 * rule depth needed to finish, computed once per grammar).
 *
 * Matcher: sets of end positions (bitsets over the input's code points),
 * memoised per (rule, start position); no left recursion (json_schema.c
 * writes none), so a rule re-entered at the same position matches nothing.
 * In prefix mode one more position, n + 1, stands for "the input ran out
 * inside this node, which some continuation completes": a literal the
 * input's tail begins, a class or literal wanted at the end. It passes
 * through every later node, so the input is a viable prefix iff n or n + 1
 * is reached (every rule can finish: gref_parse checks).
 */
#ifndef LAMINA_GBNF_REF_H
#define LAMINA_GBNF_REF_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { GN_LIT, GN_CLASS, GN_REF, GN_SEQ, GN_ALT, GN_REP };

typedef struct gnode {
    int kind;
    uint32_t *cps; /* (n) LIT: code points; CLASS: lo,hi pairs (2n) */
    int n;
    bool neg;            /* CLASS: negated */
    int ref;             /* REF: rule index */
    struct gnode **kids; /* (nk) SEQ, ALT: children; REP: one */
    int nk;
    long min, max; /* REP: max < 0 unbounded */
} gnode;

typedef struct {
    char name[64];
    gnode *body;
    int cost; /* least depth to finish (random walk) */
} grule;

typedef struct {
    grule *r; /* (nr) */
    int nr, cap;
    int root;
    char err[256];
    uint64_t rng;
} gref;

/* ---- parsing ---- */

static gnode *gn_new(int kind) {
    gnode *n = calloc(1, sizeof *n);
    n->kind = kind;
    return n;
}

static void gn_add(gnode *p, gnode *k) {
    p->kids = realloc(p->kids, (size_t)(p->nk + 1) * sizeof *p->kids);
    p->kids[p->nk++] = k;
}

static void gn_free(gnode *n) {
    if (!n) return;
    for (int i = 0; i < n->nk; i++) gn_free(n->kids[i]);
    free(n->kids);
    free(n->cps);
    free(n);
}

static int gref_rule(gref *g, const char *name, size_t len) {
    for (int i = 0; i < g->nr; i++)
        if (strlen(g->r[i].name) == len && !memcmp(g->r[i].name, name, len)) return i;
    if (g->nr == g->cap) {
        g->cap = g->cap ? 2 * g->cap : 64;
        g->r = realloc(g->r, (size_t)g->cap * sizeof *g->r);
    }
    memset(&g->r[g->nr], 0, sizeof g->r[0]);
    snprintf(g->r[g->nr].name, sizeof g->r[0].name, "%.*s", (int)len, name);
    return g->nr++;
}

static uint32_t gp_utf8(const char **p) {
    const unsigned char *u = (const unsigned char *)*p;
    uint32_t c = u[0];
    int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
    if (len > 1) c &= 0x3Fu >> (len - 1);
    for (int i = 1; i < len; i++) c = (c << 6) | (u[i] & 0x3F);
    *p += len;
    return c;
}

static uint32_t gp_char(const char **p) {
    if (**p != '\\') return gp_utf8(p);
    (*p)++;
    char e = *(*p)++;
    int nd = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (nd) {
        uint32_t v = 0;
        for (int i = 0; i < nd; i++) {
            char h = *(*p)++;
            v = v * 16 + (uint32_t)(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        return v;
    }
    return e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : (uint32_t)(unsigned char)e;
}

static void gp_ws(const char **p) {
    while (**p == ' ' || **p == '\t') (*p)++;
}

static gnode *gp_alt(gref *g, const char **p);

static gnode *gp_atom(gref *g, const char **p) {
    gnode *n = NULL;
    char ch = **p;
    if (ch == '"') {
        n = gn_new(GN_LIT);
        (*p)++;
        while (**p && **p != '"') {
            n->cps = realloc(n->cps, (size_t)(n->n + 1) * sizeof *n->cps);
            n->cps[n->n++] = gp_char(p);
        }
        if (**p) (*p)++;
    } else if (ch == '[') {
        n = gn_new(GN_CLASS);
        (*p)++;
        if (**p == '^') {
            n->neg = true;
            (*p)++;
        }
        while (**p && **p != ']') {
            uint32_t a = gp_char(p), b = a;
            if (**p == '-' && (*p)[1] != ']') {
                (*p)++;
                b = gp_char(p);
            }
            n->cps = realloc(n->cps, (size_t)(2 * n->n + 2) * sizeof *n->cps);
            n->cps[2 * n->n] = a;
            n->cps[2 * n->n + 1] = b;
            n->n++;
        }
        if (**p) (*p)++;
    } else if (ch == '(') {
        (*p)++;
        n = gp_alt(g, p);
        gp_ws(p);
        if (**p != ')') {
            snprintf(g->err, sizeof g->err, "expected ) at \"%.20s\"", *p);
            gn_free(n);
            return NULL;
        }
        (*p)++;
    } else if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')) {
        const char *s = *p;
        while ((**p >= 'a' && **p <= 'z') || (**p >= 'A' && **p <= 'Z') || (**p >= '0' && **p <= '9') || **p == '-')
            (*p)++;
        n = gn_new(GN_REF);
        n->ref = gref_rule(g, s, (size_t)(*p - s));
    } else {
        snprintf(g->err, sizeof g->err, "unexpected \"%.20s\"", *p);
        return NULL;
    }
    for (;;) { /* quantifiers */
        long mn, mx;
        if (**p == '*') mn = 0, mx = -1, (*p)++;
        else if (**p == '+') mn = 1, mx = -1, (*p)++;
        else if (**p == '?') mn = 0, mx = 1, (*p)++;
        else if (**p == '{') {
            char *e;
            mn = strtol(*p + 1, &e, 10);
            mx = mn;
            if (*e == ',') {
                e++;
                mx = (*e == '}') ? -1 : strtol(e, &e, 10);
            }
            *p = e + 1;
        } else break;
        gnode *r = gn_new(GN_REP);
        r->min = mn;
        r->max = mx;
        gn_add(r, n);
        n = r;
    }
    return n;
}

static gnode *gp_seq(gref *g, const char **p) {
    gnode *s = gn_new(GN_SEQ);
    for (;;) {
        gp_ws(p);
        if (!**p || **p == '\n' || **p == '|' || **p == ')') break;
        gnode *a = gp_atom(g, p);
        if (!a) {
            gn_free(s);
            return NULL;
        }
        gn_add(s, a);
    }
    return s;
}

static gnode *gp_alt(gref *g, const char **p) {
    gnode *a = gn_new(GN_ALT);
    for (;;) {
        gnode *s = gp_seq(g, p);
        if (!s) {
            gn_free(a);
            return NULL;
        }
        gn_add(a, s);
        gp_ws(p);
        if (**p != '|') break;
        (*p)++;
    }
    return a;
}

static void gref_free(gref *g) {
    for (int i = 0; i < g->nr; i++) gn_free(g->r[i].body);
    free(g->r);
    memset(g, 0, sizeof *g);
}

static int gn_cost(gref *g, const gnode *n) {
    int c = 0, best = 1 << 20;
    switch (n->kind) {
        case GN_REF: return g->r[n->ref].cost >= (1 << 20) ? 1 << 20 : g->r[n->ref].cost + 1;
        case GN_SEQ:
            for (int i = 0; i < n->nk; i++) {
                int k = gn_cost(g, n->kids[i]);
                c = k > c ? k : c;
            }
            return c;
        case GN_ALT:
            for (int i = 0; i < n->nk; i++) {
                int k = gn_cost(g, n->kids[i]);
                best = k < best ? k : best;
            }
            return best;
        case GN_REP: return n->min == 0 ? 0 : gn_cost(g, n->kids[0]);
        default: return 0;
    }
}

/* Parse text; 0, or -1 with g->err. */
static int gref_parse(gref *g, const char *text) {
    memset(g, 0, sizeof *g);
    g->rng = 0x9E3779B97F4A7C15ull;
    const char *p = text;
    while (*p) {
        while (*p == '\n' || *p == ' ') p++;
        if (!*p) break;
        const char *s = p;
        while (*p && *p != ' ') p++;
        int r = gref_rule(g, s, (size_t)(p - s));
        gp_ws(&p);
        if (strncmp(p, "::=", 3)) {
            snprintf(g->err, sizeof g->err, "expected ::= after %s", g->r[r].name);
            return -1;
        }
        p += 3;
        if (g->r[r].body) {
            snprintf(g->err, sizeof g->err, "rule %s defined twice", g->r[r].name);
            return -1;
        }
        gnode *body = gp_alt(g, &p); /* may grow g->r: assign after */
        if (!body) return -1;
        g->r[r].body = body;
        gp_ws(&p);
        if (*p && *p != '\n') {
            snprintf(g->err, sizeof g->err, "trailing \"%.20s\" in %s", p, g->r[r].name);
            return -1;
        }
    }
    g->root = -1;
    for (int i = 0; i < g->nr; i++) {
        if (!g->r[i].body) {
            snprintf(g->err, sizeof g->err, "rule %s is not defined", g->r[i].name);
            return -1;
        }
        if (!strcmp(g->r[i].name, "root")) g->root = i;
        g->r[i].cost = 1 << 20;
    }
    if (g->root < 0) {
        snprintf(g->err, sizeof g->err, "no root rule");
        return -1;
    }
    for (bool ch = true; ch;) { /* fixpoint of the least finishing depth */
        ch = false;
        for (int i = 0; i < g->nr; i++) {
            int c = gn_cost(g, g->r[i].body);
            if (c < g->r[i].cost) {
                g->r[i].cost = c;
                ch = true;
            }
        }
    }
    for (int i = 0; i < g->nr; i++) {
        if (g->r[i].cost >= (1 << 20)) {
            snprintf(g->err, sizeof g->err, "rule %s never finishes", g->r[i].name);
            return -1;
        }
    }
    return 0;
}

/* ---- random walk ---- */

static uint32_t gref_rand(gref *g) {
    g->rng ^= g->rng << 13;
    g->rng ^= g->rng >> 7;
    g->rng ^= g->rng << 17;
    return (uint32_t)(g->rng >> 11);
}

static void gw_put(char **o, size_t *len, size_t *cap, uint32_t c) {
    if (*len + 5 > *cap) {
        *cap = *cap ? 2 * *cap : 256;
        *o = realloc(*o, *cap);
    }
    char *d = *o + *len;
    if (c < 0x80) d[0] = (char)c, *len += 1;
    else if (c < 0x800) d[0] = (char)(0xC0 | (c >> 6)), d[1] = (char)(0x80 | (c & 0x3F)), *len += 2;
    else if (c < 0x10000)
        d[0] = (char)(0xE0 | (c >> 12)), d[1] = (char)(0x80 | ((c >> 6) & 0x3F)), d[2] = (char)(0x80 | (c & 0x3F)),
        *len += 3;
    else
        d[0] = (char)(0xF0 | (c >> 18)), d[1] = (char)(0x80 | ((c >> 12) & 0x3F)),
        d[2] = (char)(0x80 | ((c >> 6) & 0x3F)), d[3] = (char)(0x80 | (c & 0x3F)), *len += 4;
    (*o)[*len] = 0;
}

static bool gn_in_class(const gnode *n, uint32_t c) {
    bool in = false;
    for (int i = 0; i < n->n; i++) in |= n->cps[2 * i] <= c && c <= n->cps[2 * i + 1];
    return in != n->neg;
}

static void gn_walk(gref *g, const gnode *n, int depth, int limit, char **o, size_t *len, size_t *cap) {
    static const uint32_t pool[] = {'a', 'Z',  '7',    ' ',     '_', '-', '.', ',', ':', '!', '@', '/',
                                    '{', 0xE9, 0x4E2D, 0x1F600, 'q', 'x', '0', '9', 'e', 'E', '+'};
    switch (n->kind) {
        case GN_LIT:
            for (int i = 0; i < n->n; i++) gw_put(o, len, cap, n->cps[i]);
            break;
        case GN_CLASS: {
            uint32_t c = 0;
            if (!n->neg) {
                int k = (int)(gref_rand(g) % (uint32_t)n->n);
                uint32_t a = n->cps[2 * k], b = n->cps[2 * k + 1];
                uint32_t span = b - a + 1;
                c = a + gref_rand(g) % (span > 0x100 ? 0x100 : span);
                if (c >= 0xD800 && c <= 0xDFFF) c = a;
            } else {
                do c = pool[gref_rand(g) % (sizeof pool / sizeof pool[0])];
                while (!gn_in_class(n, c));
            }
            gw_put(o, len, cap, c);
            break;
        }
        case GN_REF: gn_walk(g, g->r[n->ref].body, depth + 1, limit, o, len, cap); break;
        case GN_SEQ:
            for (int i = 0; i < n->nk; i++) gn_walk(g, n->kids[i], depth, limit, o, len, cap);
            break;
        case GN_ALT: {
            int k = (int)(gref_rand(g) % (uint32_t)n->nk);
            if (depth >= limit) { /* the way that finishes soonest */
                int best = 1 << 30;
                for (int i = 0; i < n->nk; i++) {
                    int c = gn_cost(g, n->kids[i]);
                    if (c < best) best = c, k = i;
                }
            }
            gn_walk(g, n->kids[k], depth, limit, o, len, cap);
            break;
        }
        case GN_REP: {
            long extra = n->max < 0 ? 3 : n->max - n->min;
            if (extra > 3) extra = 3;
            long cnt = n->min + (depth >= limit ? 0 : (long)(gref_rand(g) % (uint32_t)(extra + 1)));
            for (long i = 0; i < cnt; i++) gn_walk(g, n->kids[0], depth, limit, o, len, cap);
            break;
        }
    }
}

/* A random string of the language (malloc'd, NUL-terminated). */
static char *gref_sample(gref *g, int limit) {
    char *o = NULL;
    size_t len = 0, cap = 0;
    gw_put(&o, &len, &cap, 0);
    len = 0;
    o[0] = 0;
    gn_walk(g, g->r[g->root].body, 0, limit, &o, &len, &cap);
    return o;
}

/* ---- matching ---- */

typedef struct {
    gref *g;
    const uint32_t *s; /* (n) input code points */
    int n;
    bool prefix;     /* position n + 1: ran out inside a node */
    int words;       /* bitset words per position set: (n + 2 + 63) / 64 */
    uint64_t **memo; /* (nr * (n + 1)) end sets per (rule, start), NULL: not yet */
    char *busy;      /* (nr * (n + 1)) being computed */
} gmatchref;

static uint64_t *gm_set(const gmatchref *m) { return calloc((size_t)m->words, 8); }

static uint64_t *gm_match(gmatchref *m, const gnode *nd, const uint64_t *in);

#define GM_HAS(set, p) (((set)[(p) / 64] >> ((p) % 64)) & 1)
#define GM_ADD(set, p) ((set)[(p) / 64] |= 1ull << ((p) % 64))

static uint64_t *gm_ref(gmatchref *m, int rule, const uint64_t *in) {
    uint64_t *out = gm_set(m);
    if (m->prefix && GM_HAS(in, m->n + 1)) GM_ADD(out, m->n + 1);
    for (int p = 0; p <= m->n; p++) {
        if (!(in[p / 64] >> (p % 64) & 1)) continue;
        size_t k = (size_t)rule * (size_t)(m->n + 2) + (size_t)p;
        if (!m->memo[k]) {
            if (m->busy[k]) continue; /* re-entered at the same place */
            m->busy[k] = 1;
            uint64_t *one = gm_set(m);
            one[p / 64] |= 1ull << (p % 64);
            m->memo[k] = gm_match(m, m->g->r[rule].body, one);
            free(one);
            m->busy[k] = 0;
        }
        for (int w = 0; w < m->words; w++) out[w] |= m->memo[k][w];
    }
    return out;
}

static uint64_t *gm_match(gmatchref *m, const gnode *nd, const uint64_t *in) {
    uint64_t *out = gm_set(m);
    bool pre = m->prefix;
    if (pre && GM_HAS(in, m->n + 1) && nd->kind != GN_REF) GM_ADD(out, m->n + 1);
    switch (nd->kind) {
        case GN_LIT:
            for (int p = 0; p <= m->n; p++) {
                if (!(in[p / 64] >> (p % 64) & 1)) continue;
                if (p + nd->n > m->n) { /* the input's tail may begin the literal */
                    if (pre && !memcmp(m->s + p, nd->cps, (size_t)(m->n - p) * sizeof *nd->cps)) GM_ADD(out, m->n + 1);
                    continue;
                }
                if (!memcmp(m->s + p, nd->cps, (size_t)nd->n * sizeof *nd->cps)) {
                    int e = p + nd->n;
                    out[e / 64] |= 1ull << (e % 64);
                }
            }
            break;
        case GN_CLASS:
            if (pre && GM_HAS(in, m->n)) GM_ADD(out, m->n + 1);
            for (int p = 0; p < m->n; p++)
                if ((in[p / 64] >> (p % 64) & 1) && gn_in_class(nd, m->s[p]))
                    out[(p + 1) / 64] |= 1ull << ((p + 1) % 64);
            break;
        case GN_REF: free(out); return gm_ref(m, nd->ref, in);
        case GN_SEQ: {
            memcpy(out, in, (size_t)m->words * 8);
            for (int i = 0; i < nd->nk; i++) {
                uint64_t *nx = gm_match(m, nd->kids[i], out);
                free(out);
                out = nx;
            }
            break;
        }
        case GN_ALT:
            for (int i = 0; i < nd->nk; i++) {
                uint64_t *r = gm_match(m, nd->kids[i], in);
                for (int w = 0; w < m->words; w++) out[w] |= r[w];
                free(r);
            }
            break;
        case GN_REP: {
            uint64_t *cur = gm_set(m);
            memcpy(cur, in, (size_t)m->words * 8);
            if (nd->min == 0) memcpy(out, in, (size_t)m->words * 8);
            for (long k = 1; nd->max < 0 || k <= nd->max; k++) {
                uint64_t *nx = gm_match(m, nd->kids[0], cur);
                free(cur);
                cur = nx;
                bool any = false, grew = false;
                for (int w = 0; w < m->words; w++) {
                    any |= cur[w] != 0;
                    if (k >= nd->min) {
                        grew |= (cur[w] & ~out[w]) != 0;
                        out[w] |= cur[w];
                    }
                }
                if (!any || (nd->max < 0 && k >= nd->min && !grew)) break;
            }
            free(cur);
            break;
        }
    }
    return out;
}

/* Whether the UTF-8 text (len bytes) is a string of the language or, with
 * prefix, the beginning of one. */
static bool gref_match_text(gref *g, const char *text, size_t len, bool prefix) {
    uint32_t *s = malloc((len + 1) * sizeof *s);
    int n = 0;
    const char *p = text;
    while (p < text + len) { /* strict UTF-8: anything malformed matches nothing */
        unsigned char c0 = (unsigned char)*p;
        size_t need = c0 < 0x80        ? 1
            : c0 >= 0xC2 && c0 <= 0xDF ? 2
            : c0 >= 0xE0 && c0 <= 0xEF ? 3
            : c0 >= 0xF0 && c0 <= 0xF4 ? 4
                                       : 0;
        size_t have = (size_t)(text + len - p), k = 1;
        while (k < need && k < have && ((unsigned char)p[k] & 0xC0) == 0x80) k++;
        if (need == 0 || (k < need && k < have)) {
            free(s);
            return false;
        }
        if (k < need) { /* a character cut short at the end: only a prefix can hold it */
            if (!prefix) {
                free(s);
                return false;
            }
            break;
        }
        s[n++] = gp_utf8(&p);
    }
    gmatchref m = {g, s, n, prefix, (n + 2 + 63) / 64, NULL, NULL};
    size_t cells = (size_t)g->nr * (size_t)(n + 2);
    m.memo = calloc(cells, sizeof *m.memo);
    m.busy = calloc(cells, 1);
    uint64_t *start = gm_set(&m);
    start[0] = 1;
    uint64_t *end = gm_ref(&m, g->root, start);
    bool ok = GM_HAS(end, n) || (prefix && GM_HAS(end, n + 1));
    free(start);
    free(end);
    for (size_t i = 0; i < cells; i++) free(m.memo[i]);
    free(m.memo);
    free(m.busy);
    free(s);
    return ok;
}

static bool gref_accepts(gref *g, const char *text, size_t len) { return gref_match_text(g, text, len, false); }
static bool gref_accepts_prefix(gref *g, const char *text, size_t len) { return gref_match_text(g, text, len, true); }

#endif
