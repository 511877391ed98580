/*
 * test_grammar.c - the GBNF compiler and the byte-level matcher
 * (decode/grammar.h): every construct on strings it must and must not
 * accept, error messages with their line and column, and exact masks.
 *
 * Exactness: random grammars are generated here as syntax trees, rendered
 * to GBNF, and checked against an independent reference written in this
 * file: a memoized backtracking recognizer over the tree that says whether
 * bytes are a prefix of (or a whole) string of the language. For random
 * prefixes of random strings of each grammar, every token's mask bit must
 * equal the reference's answer for prefix + token bytes, over a vocabulary
 * of random byte tokens (partial UTF-8 characters included) and over a real
 * one (tests/data/vocab/ggml-vocab-llama-spm.gguf).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "decode/grammar.h"
#include "format/gguf.h"
#include "test.h"
#include "text/tokenizer.h"

/* ---- a byte vocabulary: token b is byte b, token 256 is EOG ------------- */

static lm_gvocab *byte_vocab(void) {
    static char bytes[256];
    const char *ptrs[257];
    int lens[257];
    bool eog[257] = {0};
    for (int i = 0; i < 256; i++) bytes[i] = (char)i, ptrs[i] = &bytes[i], lens[i] = 1;
    ptrs[256] = NULL, lens[256] = 0, eog[256] = true;
    return grammar_vocab_from_bytes(257, ptrs, lens, eog, NULL, 0);
}

/* 1: s is a whole string of the grammar, 0: a proper prefix only, -1: neither,
 * -2: the grammar does not compile. */
static int judge(const lm_gvocab *v, const char *gbnf, const char *s) {
    char err[LM_ERRLEN];
    lm_grammar *g = grammar_parse(gbnf, strlen(gbnf), NULL, err, sizeof err);
    if (!g) {
        fprintf(stderr, "  grammar error: %s\n", err);
        return -2;
    }
    lm_gmatch *m = gmatch_new(g, v, err, sizeof err);
    int r = gmatch_accept_bytes(m, s, strlen(s)) < 0 ? -1 : gmatch_can_end(m) ? 1 : 0;
    gmatch_free(m);
    grammar_free(g);
    return r;
}

#define J(gbnf, s, want)                                                                                               \
    CHECKF(judge(v, gbnf, s) == (want), "%s on \"%s\": %d, want %d", gbnf, s, judge(v, gbnf, s), want)

static void test_constructs(void) {
    lm_gvocab *v = byte_vocab();
    CHECK(v);
    J("root ::= \"ab\"", "ab", 1);
    J("root ::= \"ab\"", "a", 0);
    J("root ::= \"ab\"", "abc", -1);
    J("root ::= \"a\" | \"b\"", "b", 1);
    J("root ::= (\"a\" | \"b\") \"c\"", "bc", 1);
    J("root ::= (\"a\" | \"b\") \"c\"", "cc", -1);
    J("root ::= \"a\"*", "", 1);
    J("root ::= \"a\"*", "aaaa", 1);
    J("root ::= \"ab\"+", "abab", 1);
    J("root ::= \"ab\"+", "aba", 0);
    J("root ::= \"ab\"+", "", 0);
    J("root ::= \"a\"? \"b\"", "b", 1);
    J("root ::= \"a\"? \"b\"", "ab", 1);
    J("root ::= \"a\"? \"b\"", "aab", -1);
    J("root ::= \"a\"{3}", "aaa", 1);
    J("root ::= \"a\"{3}", "aaaa", -1);
    J("root ::= \"a\"{2,}", "a", 0);
    J("root ::= \"a\"{2,}", "aaaaaa", 1);
    J("root ::= \"a\"{1,3}", "aaa", 1);
    J("root ::= \"a\"{1,3}", "aaaa", -1);
    J("root ::= \"a\"{0,2} \"b\"", "b", 1);
    J("root ::= [a-c]+", "abcba", 1);
    J("root ::= [a-c]+", "abd", -1);
    J("root ::= [^a-c\"]+", "xyz", 1);
    J("root ::= [^a-c\"]+", "x\"", -1);
    J("root ::= [^a]", "\xc3\xa9", 1);      /* é: a negated class holds multi-byte characters */
    J("root ::= [^a]", "\xc3", 0);          /* half of it is a prefix */
    J("root ::= [^a]", "\xed\xa0\x80", -1); /* a surrogate is not UTF-8 */
    J("root ::= [a\\-z]", "-", 1);
    J("root ::= [a\\-z]", "b", -1);
    J("root ::= [\\]\\\\]", "]", 1);
    J("root ::= .", "\xf0\x9f\x98\x80", 1);
    J("root ::= [^]", "x", 1); /* a negated empty class: any character */
    J("root ::= . .", "\xf0\x9f", 0);
    J("root ::= \"\\n\\t\\r\\\\\\\"\"", "\n\t\r\\\"", 1);
    J("root ::= \"\\x41\\u00e9\\U0001F600\"", "A\xc3\xa9\xf0\x9f\x98\x80", 1);
    J("root ::= \"caf\xc3\xa9\"", "caf\xc3\xa9", 1);
    J("root ::= \"caf\xc3\xa9\"", "caf\xc3", 0);
    J("root ::= [\xc3\xa0-\xc3\xbf]", "\xc3\xa9", 1);
    J("root ::= [\xc3\xa0-\xc3\xbf]", "\xc3\x80", -1);
    J("# a comment\nroot ::= x # another\nx ::= \"x\"\n", "x", 1);
    J("root ::= a\na ::= \"(\" a \")\" | \"\"", "((()))", 1);
    J("root ::= a\na ::= \"(\" a \")\" | \"\"", "(()", 0);
    J("root ::= \"a\"\n     | \"b\"\n", "b", 1);
    J("root ::= (\n  \"a\"\n  | \"b\"\n)", "a", 1);
    J("root ::= \"\"", "", 1);
    J("root ::= x-y_1\nx-y_1 ::= \"q\"", "q", 1);
    /* a custom root name */
    char err[LM_ERRLEN];
    lm_grammar *g = grammar_parse("start ::= \"s\"", 13, "start", err, sizeof err);
    CHECK(g);
    lm_gmatch *m = gmatch_new(g, v, err, sizeof err);
    CHECK(gmatch_accept_bytes(m, "s", 1) == 0 && gmatch_must_end(m));
    CHECK(gmatch_allows(m, 256) && !gmatch_allows(m, 's'));
    gmatch_free(m);
    grammar_free(g);
    grammar_vocab_free(v);
}

/* The error message contains want. */
static int err_has(const char *gbnf, const char *want) {
    char err[LM_ERRLEN] = "";
    lm_grammar *g = grammar_parse(gbnf, strlen(gbnf), NULL, err, sizeof err);
    if (g) {
        grammar_free(g);
        fprintf(stderr, "  accepted: %s\n", gbnf);
        return 0;
    }
    if (!strstr(err, want)) {
        fprintf(stderr, "  %s -> \"%s\", want \"%s\"\n", gbnf, err, want);
        return 0;
    }
    return 1;
}

static void test_errors(void) {
    CHECK(err_has("root ::= foo", "line 1, column 10: undefined rule 'foo'"));
    CHECK(err_has("root ::= \"a\"\n\nx ::= x \"b\"", "line 3, column 1: rule 'x' is left-recursive"));
    CHECK(err_has("root ::= a\na ::= b? a \"x\" | \"y\"\nb ::= \"b\"", "rule 'a' is left-recursive"));
    CHECK(err_has("root ::= \"abc", "line 1, column 10: unterminated string literal"));
    CHECK(err_has("root ::= \"a\\q\"", "line 1, column 12: unknown escape \\q"));
    CHECK(err_has("root ::= \"\\x4\"", "line 1, column 11: escape \\x needs hexadecimal digits"));
    CHECK(err_has("root ::= \"\\uD800\"", "line 1, column 11: escape is not a Unicode scalar value"));
    CHECK(err_has("root ::= []", "line 1, column 10: empty character class"));
    CHECK(err_has("root ::= [z-a]", "line 1, column 13: range end below its start"));
    CHECK(err_has("root ::= [^\\x00-\\U0010FFFF]", "line 1, column 10: the character class matches nothing"));
    CHECK(err_has("root ::= [abc", "line 1, column 10: unterminated character class"));
    CHECK(err_has("root \"a\"", "line 1, column 6: expected '::='"));
    CHECK(err_has("root ::= (\"a\"", "line 1, column 10: unclosed '('"));
    CHECK(err_has("root ::= \"a\")", "line 1, column 13: unmatched ')'"));
    CHECK(err_has("root ::= *", "line 1, column 10: '*' follows nothing it could repeat"));
    CHECK(err_has("root ::= \"\"+", "line 1, column 12: '+' repeats the empty string"));
    CHECK(err_has("root ::= (\"a\"?)*", "line 1, column 16: repetition of something that can match the empty string"));
    CHECK(err_has("root ::= \"a\"{3,1}", "line 1, column 13: repetition {m,n} with n below m"));
    CHECK(err_has("root ::= \"a\"{2000}", "repetition count above 1000"));
    CHECK(err_has("root ::= x\nx ::= \"a\" x", "line 2, column 1: rule 'x' can never finish"));
    CHECK(err_has("root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is defined twice"));
    CHECK(err_has("root ::= \"\xc3\"", "line 1, column 11: invalid UTF-8"));
    CHECK(err_has("root ::= \"a\" @", "line 1, column 14: unexpected character '@'"));
    CHECK(err_has("\n\n  root ::= \"a\"\n  x ::= [a-", "line 4, column 9: unterminated character class"));
    CHECK(err_has("root ::= \"a\" (\n", "line 1, column 14: unclosed '('"));
    CHECK(err_has("root ::= (\n  \"a\"\n  | [b\n", "line 3, column 7: unexpected end of line"));
    CHECK(err_has("x ::= \"a\"", "no rule named 'root'"));
    CHECK(err_has("", "no rule named 'root'"));
}

/* ---- random grammars and the reference recognizer ----------------------- */

enum { N_LIT, N_CLASS, N_ANY, N_SEQ, N_ALT, N_REP, N_REF };

typedef struct node {
    int kind;
    uint32_t cps[4]; /* N_LIT: the characters; N_CLASS: ranges as pairs */
    int n;           /* N_LIT: characters; N_CLASS: ranges; N_SEQ/N_ALT: children */
    bool neg;
    int min, max; /* N_REP (max -1: unbounded) */
    int ref;      /* N_REF */
    struct node *kid[4];
} node;

static const uint32_t ALPHA[] = {'a', 'b', 'c', 'd', ' ', '"', '{', '}', '\n', 0xE9, 0x4E2D, 0x1F600, 0x3B1};
#define N_ALPHA (int)(sizeof ALPHA / sizeof *ALPHA)

static lm_rng rng;
static int rnd(int n) { return (int)(lm_rng_u64(&rng) % (uint64_t)n); }

static node *mk(int kind) {
    node *x = calloc(1, sizeof *x);
    x->kind = kind;
    return x;
}

static void node_free(node *x) {
    if (!x) return;
    for (int i = 0; i < 4; i++) node_free(x->kid[i]);
    free(x);
}

/* A node that cannot match the empty string (a literal or class). */
static node *gen_atom(void) {
    if (rnd(2)) {
        node *x = mk(N_LIT);
        x->n = 1 + rnd(3);
        for (int i = 0; i < x->n; i++) x->cps[i] = ALPHA[rnd(N_ALPHA)];
        return x;
    }
    if (rnd(8) == 0) return mk(N_ANY);
    node *x = mk(N_CLASS);
    x->n = 1 + rnd(2);
    x->neg = rnd(4) == 0;
    for (int i = 0; i < x->n; i++) {
        uint32_t a = ALPHA[rnd(N_ALPHA)], b = rnd(2) ? a : ALPHA[rnd(N_ALPHA)];
        x->cps[2 * i] = a < b ? a : b;
        x->cps[2 * i + 1] = a < b ? b : a;
    }
    return x;
}

/* rule: the rule being generated; recursion (a reference to a rule <= rule)
 * only after a non-empty atom, so nothing is left-recursive. */
static node *gen_alt(int rule, int n_rules, int depth, bool allow_back);

static node *gen_seq(int rule, int n_rules, int depth, bool allow_back) {
    node *s = mk(N_SEQ);
    s->n = 1 + rnd(4);
    for (int i = 0; i < s->n; i++) {
        int k = rnd(10);
        if (i == 0 && allow_back) s->kid[i] = gen_atom(); /* guards the back references below */
        else if (k < 4) s->kid[i] = gen_atom();
        else if (k < 6 && depth < 3) {
            node *r = mk(N_REP);
            if (rnd(3) == 0 && depth < 2) { /* a group of atoms-first sequences */
                node *a = mk(N_ALT);
                a->n = 1 + rnd(2);
                for (int j = 0; j < a->n; j++) {
                    node *q = mk(N_SEQ);
                    q->n = 2;
                    q->kid[0] = gen_atom();
                    q->kid[1] = gen_atom();
                    a->kid[j] = q;
                }
                r->kid[0] = a;
            } else r->kid[0] = gen_atom();
            int form = rnd(6);
            r->min = form == 0 ? 0 : form == 1 ? 1 : form == 2 ? 0 : rnd(3);
            r->max = form == 0 || form == 1 ? -1 : form == 2 ? 1 : r->min + rnd(3) - (form == 5 ? 0 : 0);
            if (form == 5) r->max = -1;
            s->kid[i] = r;
        } else if (k < 8 && depth < 3) s->kid[i] = gen_alt(rule, n_rules, depth + 1, allow_back && i > 0);
        else {
            int lo = (allow_back && i > 0) ? 0 : rule + 1;
            if (lo >= n_rules) {
                s->kid[i] = gen_atom();
                continue;
            }
            node *r = mk(N_REF);
            r->ref = lo + rnd(n_rules - lo);
            s->kid[i] = r;
        }
    }
    return s;
}

static node *gen_alt(int rule, int n_rules, int depth, bool allow_back) {
    node *a = mk(N_ALT);
    a->n = 1 + rnd(3);
    for (int i = 0; i < a->n; i++) a->kid[i] = gen_seq(rule, n_rules, depth + 1, allow_back && i > 0);
    return a;
}

typedef struct {
    node *rule[4];
    int n;
} tgrammar;

static void tgrammar_gen(tgrammar *t) {
    t->n = 1 + rnd(4);
    for (int r = 0; r < t->n; r++) {
        /* alternative 0 refers only to later rules, so every rule can finish */
        t->rule[r] = gen_alt(r, t->n, 0, true);
    }
}

static void put_cp(char **o, uint32_t c, bool in_class) {
    if (c == '"' && !in_class) *o += sprintf(*o, "\\\"");
    else if (c == '\n') *o += sprintf(*o, "\\n");
    else if (c == ']' || c == '\\' || c == '-' || c == '^') *o += sprintf(*o, "\\x%02X", c);
    else if (c >= 0x80 && rnd(2)) *o += sprintf(*o, c > 0xFFFF ? "\\U%08X" : "\\u%04X", c);
    else if (c < 0x80) *(*o)++ = (char)c;
    else {
        unsigned char b[4];
        int n = c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
        uint32_t x = c;
        for (int i = n - 1; i > 0; i--) b[i] = (unsigned char)(0x80 | (x & 0x3F)), x >>= 6;
        b[0] = (unsigned char)((n == 2 ? 0xC0 : n == 3 ? 0xE0 : 0xF0) | x);
        memcpy(*o, b, (size_t)n);
        *o += n;
    }
}

static void render(const node *x, char **o) {
    switch (x->kind) {
        case N_LIT:
            *(*o)++ = '"';
            for (int i = 0; i < x->n; i++) put_cp(o, x->cps[i], false);
            *(*o)++ = '"';
            break;
        case N_ANY: *(*o)++ = '.'; break;
        case N_CLASS:
            *(*o)++ = '[';
            if (x->neg) *(*o)++ = '^';
            for (int i = 0; i < x->n; i++) {
                put_cp(o, x->cps[2 * i], true);
                if (x->cps[2 * i + 1] != x->cps[2 * i]) {
                    *(*o)++ = '-';
                    put_cp(o, x->cps[2 * i + 1], true);
                }
            }
            *(*o)++ = ']';
            break;
        case N_SEQ:
            for (int i = 0; i < x->n; i++) {
                if (i) *(*o)++ = ' ';
                render(x->kid[i], o);
            }
            break;
        case N_ALT:
            *(*o)++ = '(';
            for (int i = 0; i < x->n; i++) {
                if (i) *o += sprintf(*o, rnd(3) ? " | " : "\n   | ");
                render(x->kid[i], o);
            }
            *(*o)++ = ')';
            break;
        case N_REP:
            render(x->kid[0], o);
            if (x->min == 0 && x->max == -1) *(*o)++ = '*';
            else if (x->min == 1 && x->max == -1) *(*o)++ = '+';
            else if (x->min == 0 && x->max == 1) *(*o)++ = '?';
            else if (x->max == -1) *o += sprintf(*o, "{%d,}", x->min);
            else if (x->max == x->min) *o += sprintf(*o, "{%d}", x->min);
            else *o += sprintf(*o, "{%d,%d}", x->min, x->max);
            break;
        case N_REF: *o += sprintf(*o, "r%d", x->ref); break;
    }
}

static char *tgrammar_text(const tgrammar *t) {
    char *buf = malloc(1 << 16), *o = buf;
    o += sprintf(o, "# generated\n");
    for (int r = t->n - 1; r >= 0; r--) {
        o += sprintf(o, "r%d ::= ", r);
        render(t->rule[r], &o);
        o += sprintf(o, "  # rule %d\n", r);
    }
    *o = 0;
    return buf;
}

/* The reference: input code points plus an optional trailing partial
 * character (its bytes). ends(x, i) is the set of positions after matching
 * x from i, as bits 0..n, and bit n + 1 "the input ran out inside x". */
typedef struct {
    const tgrammar *t;
    uint32_t cps[512];
    int n;
    unsigned char tail[4];
    int n_tail;
} ref;

enum { W = 9 }; /* 576 bits */
typedef struct {
    uint64_t b[W];
} bits;

/* Per rule and position: the ends of the rule there, valid when its stamp
 * is this call's. */
static bits ref_memo[4][512];
static uint32_t ref_stamp[4][512], ref_call;

static void bset(bits *s, int i) { s->b[i >> 6] |= 1ull << (i & 63); }
static bool bget(const bits *s, int i) { return (s->b[i >> 6] >> (i & 63)) & 1; }

static int enc(uint32_t c, unsigned char *b) {
    if (c < 0x80) return b[0] = (unsigned char)c, 1;
    int n = c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
    for (int i = n - 1; i > 0; i--) b[i] = (unsigned char)(0x80 | (c & 0x3F)), c >>= 6;
    b[0] = (unsigned char)((n == 2 ? 0xC0 : n == 3 ? 0xE0 : 0xF0) | c);
    return n;
}

static bool ref_in_class(const node *x, uint32_t c) {
    if (x->kind == N_ANY) return true;
    if (x->kind == N_LIT) return c == x->cps[0];
    bool in = false;
    for (int i = 0; i < x->n; i++) in |= c >= x->cps[2 * i] && c <= x->cps[2 * i + 1];
    return in != x->neg;
}

/* Memo of ref_tail_fits, cleared for each grammar (nodes are reallocated). */
static const node *tf_x[4096];
static uint64_t tf_key[4096];
static bool tf_v[4096];

/* Some character of the class (or the literal's character) encodes with
 * the tail bytes as its prefix: by enumeration of every scalar value. */
static bool ref_tail_fits(const ref *R, const node *x) {
    unsigned char b[4];
    if (x->kind == N_LIT) return enc(x->cps[0], b) > R->n_tail && memcmp(b, R->tail, (size_t)R->n_tail) == 0;
    uint64_t key = 1;
    for (int i = 0; i < R->n_tail; i++) key = key << 8 | R->tail[i];
    int h = (int)((((uintptr_t)x >> 4) * 0x9E3779B1u ^ key * 0x85EBCA77u) % 4096);
    if (tf_x[h] == x && tf_key[h] == key) return tf_v[h];
    bool ok = false;
    if (x->kind == N_CLASS && !x->neg) { /* the class's own characters */
        for (int r = 0; r < x->n && !ok; r++)
            for (uint32_t c = x->cps[2 * r]; c <= x->cps[2 * r + 1] && !ok; c++) {
                if (c >= 0xD800 && c <= 0xDFFF) continue;
                int n = enc(c, b);
                ok = n > R->n_tail && memcmp(b, R->tail, (size_t)R->n_tail) == 0;
            }
    } else
        for (uint32_t c = 0x80; c <= 0x10FFFF && !ok; c++) {
            if (c >= 0xD800 && c <= 0xDFFF) continue;
            int n = enc(c, b);
            if (n <= R->n_tail || memcmp(b, R->tail, (size_t)R->n_tail)) continue;
            ok = ref_in_class(x, c);
        }
    tf_x[h] = x, tf_key[h] = key, tf_v[h] = ok;
    return ok;
}

/* Some scalar value's UTF-8 starts with the n (1..3) bytes at b, by
 * enumeration (memoized: the answer depends on the bytes alone). */
static bool ref_tail_valid(const unsigned char *b, int n) {
    static uint32_t key_of[4096];
    static int8_t val[4096];
    uint32_t key = 1;
    for (int i = 0; i < n; i++) key = key << 8 | b[i];
    uint32_t h = (key * 2654435761u) >> 20;
    if (key_of[h] == key) return val[h];
    bool some = false;
    for (uint32_t cp = 0x80; cp <= 0x10FFFF && !some; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        unsigned char e[4];
        int k = enc(cp, e);
        some = k > n && memcmp(e, b, (size_t)n) == 0;
    }
    key_of[h] = key, val[h] = some;
    return some;
}

static bits ref_ends(ref *R, const node *x, int i);

/* One character element (class, any, or one character of a literal). */
static bits ref_char(ref *R, const node *x, int i) {
    bits s = {{0}};
    if (i < R->n) {
        if (ref_in_class(x, R->cps[i])) bset(&s, i + 1);
    } else if (!R->n_tail || ref_tail_fits(R, x)) bset(&s, R->n + 1);
    return s;
}

static bits ref_seq_from(ref *R, const bits *from, const node *x) {
    bits out = {{0}};
    if (bget(from, R->n + 1)) bset(&out, R->n + 1);
    for (int j = 0; j <= R->n; j++) {
        if (!bget(from, j)) continue;
        bits e = ref_ends(R, x, j);
        for (int w = 0; w < W; w++) out.b[w] |= e.b[w];
    }
    return out;
}

static bits ref_ends(ref *R, const node *x, int i) {
    bits s = {{0}};
    switch (x->kind) {
        case N_CLASS:
        case N_ANY: return ref_char(R, x, i);
        case N_LIT: {
            bset(&s, i);
            for (int k = 0; k < x->n; k++) {
                node one = {.kind = N_LIT, .n = 1, .cps = {x->cps[k]}};
                bits t = {{0}};
                if (bget(&s, R->n + 1)) bset(&t, R->n + 1);
                for (int j = 0; j <= R->n; j++)
                    if (bget(&s, j)) {
                        bits e = ref_char(R, &one, j);
                        for (int w = 0; w < W; w++) t.b[w] |= e.b[w];
                    }
                s = t;
            }
            return s;
        }
        case N_SEQ:
            bset(&s, i);
            for (int k = 0; k < x->n; k++) s = ref_seq_from(R, &s, x->kid[k]);
            return s;
        case N_ALT:
            for (int k = 0; k < x->n; k++) {
                bits e = ref_ends(R, x->kid[k], i);
                for (int w = 0; w < W; w++) s.b[w] |= e.b[w];
            }
            return s;
        case N_REP: {
            bits cur = {{0}};
            bset(&cur, i);
            if (x->min == 0) s = cur;
            for (int k = 1; x->max < 0 || k <= x->max; k++) {
                cur = ref_seq_from(R, &cur, x->kid[0]);
                bool any = false;
                for (int w = 0; w < W; w++) any |= cur.b[w] != 0;
                if (!any) break;
                if (k >= x->min)
                    for (int w = 0; w < W; w++) s.b[w] |= cur.b[w];
                if (k > R->n + 2 && k >= x->min) break; /* every atom consumes: nothing new past n + 1 rounds */
            }
            return s;
        }
        case N_REF: {
            if (ref_stamp[x->ref][i] == ref_call) return ref_memo[x->ref][i];
            bits e = ref_ends(R, R->t->rule[x->ref], i);
            ref_memo[x->ref][i] = e;
            ref_stamp[x->ref][i] = ref_call;
            return e;
        }
    }
    return s;
}

/* 1: whole string, 0: proper prefix, -1: neither (bytes of any kind). */
static int ref_judge(const tgrammar *t, const unsigned char *b, int len) {
    static ref R;
    memset(&R, 0, sizeof R);
    R.t = t;
    int i = 0;
    while (i < len) {
        unsigned char c = b[i];
        int n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!n) return -1;
        if (i + n > len) { /* a trailing partial character: validated by enumeration */
            R.n_tail = len - i;
            memcpy(R.tail, b + i, (size_t)R.n_tail);
            if (!ref_tail_valid(R.tail, R.n_tail)) return -1;
            break;
        }
        uint32_t cp = n == 1 ? c : (uint32_t)(c & (0xFF >> (n + 1)));
        for (int k = 1; k < n; k++) {
            if ((b[i + k] & 0xC0) != 0x80) return -1;
            cp = cp << 6 | (b[i + k] & 0x3F);
        }
        unsigned char e[4];
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || enc(cp, e) != n) return -1; /* overlong etc. */
        if (R.n >= 500) return -1;
        R.cps[R.n++] = cp;
        i += n;
    }
    ref_call++;
    bits e = ref_ends(&R, t->rule[0], 0);
    if (!R.n_tail && bget(&e, R.n)) return 1;
    return bget(&e, R.n + 1) || (!R.n_tail && bget(&e, R.n)) ? 0 : -1;
}

/* A random string of the language (bounded: past a depth, choose the first
 * alternative and the fewest repetitions). */
static void gen_string(const tgrammar *t, const node *x, unsigned char *o, int *n, int depth) {
    if (*n > 200) depth = 100;
    switch (x->kind) {
        case N_LIT:
            for (int i = 0; i < x->n; i++) *n += enc(x->cps[i], o + *n);
            break;
        case N_ANY: *n += enc(ALPHA[rnd(N_ALPHA)], o + *n); break;
        case N_CLASS:
            for (;;) {
                uint32_t c = rnd(4) ? ALPHA[rnd(N_ALPHA)] : (uint32_t)(0x20 + rnd(0x3000));
                if (c >= 0xD800 && c <= 0xDFFF) continue;
                if (ref_in_class(x, c)) {
                    *n += enc(c, o + *n);
                    return;
                }
            }
        case N_SEQ:
            for (int i = 0; i < x->n; i++) gen_string(t, x->kid[i], o, n, depth + 1);
            break;
        case N_ALT: gen_string(t, x->kid[depth > 8 ? 0 : rnd(x->n)], o, n, depth + 1); break;
        case N_REP: {
            int k = x->min + (depth > 8 ? 0 : rnd(3));
            if (x->max >= 0 && k > x->max) k = x->max;
            for (int i = 0; i < k; i++) gen_string(t, x->kid[0], o, n, depth + 1);
            break;
        }
        case N_REF: gen_string(t, t->rule[x->ref], o, n, depth + 1); break;
    }
}

/* ---- exact masks --------------------------------------------------------- */

typedef struct {
    lm_gvocab *v;
    int n;
    unsigned char **bytes;
    int *lens;
    bool *eog;
} tvocab;

static void tvocab_free(tvocab *tv) {
    for (int i = 0; i < tv->n; i++) free(tv->bytes[i]);
    free(tv->bytes);
    free(tv->lens);
    free(tv->eog);
    grammar_vocab_free(tv->v);
}

/* Random tokens: pieces of the alphabet's UTF-8 (cut anywhere) and random
 * bytes; a few empty ones, and two EOG tokens. */
static int tvocab_random(tvocab *tv, int n) {
    tv->n = n;
    tv->bytes = calloc((size_t)n, sizeof *tv->bytes);
    tv->lens = calloc((size_t)n, sizeof *tv->lens);
    tv->eog = calloc((size_t)n, sizeof *tv->eog);
    for (int t = 0; t < n; t++) {
        unsigned char buf[64];
        int len = 0;
        if (t == 7 || t == 1000) tv->eog[t] = true;
        else if (t % 97 == 5) len = 0; /* a control token */
        else {
            int k = 1 + rnd(4);
            for (int i = 0; i < k; i++) {
                if (rnd(10) == 0) buf[len++] = (unsigned char)rnd(256);
                else len += enc(ALPHA[rnd(N_ALPHA)], buf + len);
            }
            if (rnd(3) == 0) len -= rnd(len); /* cut: may end inside a character */
            if (rnd(4) == 0 && len > 1) {     /* or start inside one */
                int cut = rnd(len);
                memmove(buf, buf + cut, (size_t)(len - cut));
                len -= cut;
            }
        }
        tv->bytes[t] = malloc((size_t)(len ? len : 1));
        memcpy(tv->bytes[t], buf, (size_t)len);
        tv->lens[t] = len;
    }
    tv->v = grammar_vocab_from_bytes(n, (const char *const *)tv->bytes, tv->lens, tv->eog, NULL, 0);
    return tv->v ? 0 : -1;
}

static int tvocab_real(tvocab *tv, const char *path) {
    char err[LM_ERRLEN];
    gguf_ctx *g = gguf_open(path, err, sizeof err);
    lm_tokenizer *tok = g ? tok_load(g, err, sizeof err) : NULL;
    if (!tok) {
        fprintf(stderr, "  %s: %s\n", path, err);
        if (g) gguf_close(g);
        return -1;
    }
    tv->n = tok_n_vocab(tok);
    tv->bytes = calloc((size_t)tv->n, sizeof *tv->bytes);
    tv->lens = calloc((size_t)tv->n, sizeof *tv->lens);
    tv->eog = calloc((size_t)tv->n, sizeof *tv->eog);
    for (int t = 0; t < tv->n; t++) {
        char buf[256];
        int w = tok_token_bytes(tok, t, false, buf, sizeof buf);
        tv->bytes[t] = malloc((size_t)(w > 0 ? w : 1));
        memcpy(tv->bytes[t], buf, (size_t)(w > 0 ? w : 0));
        tv->lens[t] = w > 0 ? w : 0;
        tv->eog[t] = tok_is_eog(tok, t);
    }
    tv->v = grammar_vocab_new(tok, err, sizeof err);
    tok_free(tok);
    gguf_close(g);
    return tv->v ? 0 : -1;
}

/* The mask at the state after prefix equals the reference for every token;
 * gmatch_allows agrees. Returns the number of mismatches. */
static int check_mask(const tgrammar *t, lm_gmatch *m, const tvocab *tv, const unsigned char *prefix, int plen,
                      int stride) {
    int n = grammar_vocab_size(tv->v);
    uint32_t *allow = calloc((size_t)(n + 31) / 32, 4);
    int32_t count = gmatch_mask(m, allow), seen = 0, bad = 0;
    unsigned char buf[1024];
    memcpy(buf, prefix, (size_t)plen);
    int whole = ref_judge(t, prefix, plen);
    for (int tok = 0; tok < n; tok++) {
        bool got = (allow[tok >> 5] >> (tok & 31)) & 1;
        seen += got;
        if (tok % stride && !got) continue; /* the allowed ones always, a sample of the rest */
        bool want;
        if (tv->eog[tok]) want = whole == 1;
        else if (!tv->lens[tok]) want = false;
        else {
            memcpy(buf + plen, tv->bytes[tok], (size_t)tv->lens[tok]);
            want = ref_judge(t, buf, plen + tv->lens[tok]) >= 0;
        }
        if (got != want || gmatch_allows(m, tok) != got) {
            if (bad++ < 3)
                fprintf(stderr, "  token %d (%d bytes): mask %d, reference %d, allows %d, prefix %d bytes\n", tok,
                        tv->lens[tok], got, want, gmatch_allows(m, tok), plen);
        }
    }
    if (seen != count) bad++;
    free(allow);
    return bad;
}

static int run_random(tvocab *tv, int n_grammars, int n_prefixes, int stride, uint64_t seed) {
    lm_rng_seed(&rng, seed);
    int bad = 0;
    for (int gi = 0; gi < n_grammars && !bad; gi++) {
        tgrammar t;
        tgrammar_gen(&t);
        memset(tf_x, 0, sizeof tf_x);
        char *text = tgrammar_text(&t);
        char err[LM_ERRLEN];
        lm_grammar *g = grammar_parse(text, strlen(text), "r0", err, sizeof err);
        if (!g) {
            fprintf(stderr, "  grammar %d refused: %s\n%s", gi, err, text);
            bad++;
        }
        lm_gmatch *m = g ? gmatch_new(g, tv->v, err, sizeof err) : NULL;
        for (int pi = 0; m && pi < n_prefixes && !bad; pi++) {
            unsigned char s[1024];
            int n = 0;
            gen_string(&t, t.rule[0], s, &n, 0);
            if (n > 400) n = 400;
            int plen = pi == 0 ? 0 : pi == 1 ? n : rnd(n + 1);
            gmatch_reset(m);
            if (ref_judge(&t, s, plen) < 0 || gmatch_accept_bytes(m, (const char *)s, (size_t)plen) < 0) {
                fprintf(stderr, "  grammar %d: a prefix of its own string refused\n", gi);
                bad++;
                break;
            }
            if (plen == n && !gmatch_can_end(m) && ref_judge(&t, s, plen) == 1) bad++;
            bad += check_mask(&t, m, tv, s, plen, stride);
            /* then a few tokens chosen among the allowed ones, checked again */
            for (int k = 0; k < 3 && !bad; k++) {
                int nv = grammar_vocab_size(tv->v);
                int start = rnd(nv), tok = -1;
                for (int j = 0; j < nv; j++) {
                    int c = (start + j) % nv;
                    if (!tv->eog[c] && gmatch_allows(m, c)) {
                        tok = c;
                        break;
                    }
                }
                if (tok < 0 || plen + tv->lens[tok] > 1000) break;
                if (gmatch_accept(m, tok) != 0) bad++;
                memcpy(s + plen, tv->bytes[tok], (size_t)tv->lens[tok]);
                plen += tv->lens[tok];
                bad += check_mask(&t, m, tv, s, plen, stride);
            }
            if (bad) fprintf(stderr, "  grammar %d:\n%s", gi, text);
        }
        gmatch_free(m);
        grammar_free(g);
        free(text);
        for (int r = 0; r < t.n; r++) node_free(t.rule[r]);
    }
    return bad;
}

static void test_mask_random_vocab(void) {
    tvocab tv = {0};
    lm_rng_seed(&rng, 99);
    CHECK(tvocab_random(&tv, 3000) == 0);
    int bad = run_random(&tv, 30, 3, 3, 1234);
    tvocab_free(&tv);
    CHECK(bad == 0);
}

static void test_mask_real_vocab(void) {
    tvocab tv = {0};
    CHECK(tvocab_real(&tv, "tests/data/vocab/ggml-vocab-llama-spm.gguf") == 0);
    int bad = run_random(&tv, 6, 2, 16, 777);
    tvocab_free(&tv);
    CHECK(bad == 0);
}

/* Copies are independent; reset returns to the start; a rejected token or
 * byte leaves the state as it was; masks from the cache equal fresh ones. */
static void test_copy_reset(void) {
    lm_gvocab *v = byte_vocab();
    char err[LM_ERRLEN];
    const char *gb = "root ::= \"{\" [a-z]* \"}\"";
    lm_grammar *g = grammar_parse(gb, strlen(gb), NULL, err, sizeof err);
    CHECK(v && g);
    lm_gmatch *m = gmatch_new(g, v, err, sizeof err);
    CHECK(m && !gmatch_can_end(m));
    CHECK(gmatch_accept(m, '{') == 0);
    lm_gmatch *k = gmatch_copy(m);
    CHECK(k);
    CHECK(gmatch_accept(k, 'a') == 0 && gmatch_accept(k, '}') == 0 && gmatch_must_end(k));
    CHECK(!gmatch_can_end(m) && gmatch_allows(m, 'q'));
    CHECK(gmatch_accept(m, '{') == -1 && gmatch_accept_bytes(m, "ab{", 3) == -1);
    CHECK(gmatch_accept_bytes(m, "ab", 2) == 0);
    uint32_t a1[9], a2[9];
    int32_t n1 = gmatch_mask(m, a1), n2 = gmatch_mask(m, a2);
    CHECK(n1 == 27 && n2 == 27 && memcmp(a1, a2, sizeof a1) == 0); /* a-z and } */
    CHECK(gmatch_accept(m, 256) == -1);                            /* EOG not yet */
    gmatch_reset(m);
    CHECK(gmatch_mask(m, a1) == 1 && a1['{' >> 5] == 1u << ('{' & 31));
    CHECK(gmatch_accept(k, 256) == 0);
    gmatch_free(m);
    grammar_free(g); /* the copy still works with its grammar alive: freed after */
    gmatch_free(k);
    grammar_vocab_free(v);
}

/* A JSON grammar as llama.cpp's users write it: compiles, accepts a
 * document, refuses a broken one. */
static const char *JSON_GBNF =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::=\n"
    "  \"{\" ws (\n"
    "            string \":\" ws value\n"
    "    (\",\" ws string \":\" ws value)*\n"
    "  )? \"}\" ws\n"
    "array  ::=\n"
    "  \"[\" ws (\n"
    "            value\n"
    "    (\",\" ws value)*\n"
    "  )? \"]\" ws\n"
    "string ::=\n"
    "  \"\\\"\" (\n"
    "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
    "    \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
    "  )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static void test_json(void) {
    lm_gvocab *v = byte_vocab();
    CHECK(v);
    J(JSON_GBNF, "{\"a\": [1, 2.5, \"x\\u00e9\", {\"b\": null}], \"c\": true}", 1);
    J(JSON_GBNF, "{\"a\": [1, 2.5", 0);
    J(JSON_GBNF, "{\"a\": [1,, 2]}", -1);
    J(JSON_GBNF, "{\"caf\xc3\xa9\": \"\xe4\xb8\xad\"}", 1);
    grammar_vocab_free(v);
}

/* ---- bounds on the matcher's work ------------------------------------------ */

/* Grammars whose stacks double with every "x": each x may open a nested r
 * whose return point differs by alternative, so after n bytes there are
 * 2^n distinct stacks. */
static const char *ADVERSARIAL[] = {
    "root ::= r\nr ::= \"x\" r \"a\"? | \"x\" r \"b\"? | \"x\"",
    "root ::= r*\nr ::= \"x\" r* \"a\"? | \"x\" r* \"b\"? | \"x\"",
    "root ::= (t \",\")*\nt ::= \"x\" t \"a\"? \"c\"? | \"x\" t \"b\"? | \"x\" t \"d\"? | \"x\"",
};

/* A long literal first: the probe explores 96 states, so it does not reach
 * the doubling part, which only generation finds. */
#define HIDDEN_PREFIX                                                                                                  \
    "The following text is long enough that a probe of the first states stops before it ends, and then:"

static lm_grammar *compile(const char *gb) {
    char err[LM_ERRLEN];
    lm_grammar *g = grammar_parse(gb, strlen(gb), NULL, err, sizeof err);
    if (!g) fprintf(stderr, "  %s\n", err);
    return g;
}

/* An ambiguous grammar is found by gmatch_probe before use, and, fed
 * bytes or masked, fails within a few bytes with a clear reason that every
 * copy then sees; what took seconds (the stacks grew unbounded) takes a
 * fraction of a second, and ordinary grammars pass the probe. */
static void test_bounds(void) {
    lm_gvocab *v = byte_vocab();
    char err[LM_ERRLEN];
    for (size_t i = 0; i < sizeof ADVERSARIAL / sizeof *ADVERSARIAL; i++) {
        lm_grammar *g = compile(ADVERSARIAL[i]);
        CHECK(g);
        lm_gmatch *m = gmatch_new(g, v, err, sizeof err), *k = m ? gmatch_copy(m) : NULL;
        CHECK(m && k);
        double t0 = lm_now();
        CHECKF(gmatch_probe(m, err, sizeof err) == -1, "grammar %zu passed the probe", i);
        double t_probe = lm_now() - t0;
        CHECKF(strstr(err, "too ambiguous") != NULL, "%s", err);
        CHECK(gmatch_spoiled(m) && gmatch_spoiled(k) && strstr(gmatch_spoiled(k), "too ambiguous"));
        /* fed byte by byte (a fresh cache): refused within 20 bytes */
        gmatch_free(k);
        k = gmatch_new(g, v, err, sizeof err);
        CHECK(k && !gmatch_spoiled(k) && !gmatch_error(k));
        t0 = lm_now();
        int n = 0;
        while (n < 1000 && gmatch_accept_bytes(k, "x", 1) == 0) n++;
        double t_feed = lm_now() - t0;
        CHECKF(n >= 8 && n <= 20, "grammar %zu: %d bytes before the bound", i, n);
        CHECKF(gmatch_error(k) && strstr(gmatch_error(k), "too ambiguous"), "%s", gmatch_error(k));
        uint32_t mask[9];
        CHECK(gmatch_mask(k, mask) < 0 && strstr(gmatch_error(k), "too ambiguous")); /* its mask needs that byte */
        CHECK(gmatch_spoiled(k) != NULL);
        printf("  grammar %zu: probe %.3f s, refused after %d bytes in %.3f s\n", i, t_probe, n, t_feed);
        gmatch_free(m);
        gmatch_free(k);
        grammar_free(g);
    }
    /* ordinary grammars pass the probe and are not spoiled */
    const char *fine[] = {JSON_GBNF, "root ::= [a-z]+ (\" \" [a-z]+)*", "root ::= (\"ab\" | \"a\" \"b\")*"};
    for (size_t i = 0; i < 3; i++) {
        lm_grammar *g = compile(fine[i]);
        lm_gmatch *m = g ? gmatch_new(g, v, err, sizeof err) : NULL;
        CHECK(m);
        CHECKF(gmatch_probe(m, err, sizeof err) == 0, "%s", err);
        CHECK(!gmatch_spoiled(m) && !gmatch_error(m));
        gmatch_free(m);
        grammar_free(g);
    }
    grammar_vocab_free(v);

    /* past the probe: masks over a real vocabulary (32,000 tokens) */
    tvocab tv = {0};
    CHECK(tvocab_real(&tv, "tests/data/vocab/ggml-vocab-llama-spm.gguf") == 0);
    char gb[512];
    snprintf(gb, sizeof gb, "root ::= \"%s\" r\nr ::= \"x\" r \"a\"? | \"x\" r \"b\"? | \"x\"", HIDDEN_PREFIX);
    lm_grammar *g = compile(gb);
    lm_gmatch *m = g ? gmatch_new(g, tv.v, err, sizeof err) : NULL;
    CHECK(m);
    CHECKF(gmatch_probe(m, err, sizeof err) == 0, "the probe found %s", err);
    CHECK(gmatch_accept_bytes(m, HIDDEN_PREFIX, strlen(HIDDEN_PREFIX)) == 0);
    uint32_t *mask = malloc(((size_t)tv.n + 31) / 32 * sizeof *mask);
    int steps = 0;
    int32_t n = 0;
    double t0 = lm_now();
    for (; steps < 100; steps++) {
        if ((n = gmatch_mask(m, mask)) < 0) break;
        int32_t x = -1; /* the token "x" alone */
        for (int32_t t = 0; t < tv.n && x < 0; t++)
            if (tv.lens[t] == 1 && tv.bytes[t][0] == 'x' && ((mask[t >> 5] >> (t & 31)) & 1)) x = t;
        CHECK(x >= 0);
        if (gmatch_accept(m, x) != 0) break;
    }
    double t_mask = lm_now() - t0;
    CHECKF(steps <= 20 && (n < 0 || gmatch_error(m)), "%d steps, mask %d", steps, n);
    CHECKF(gmatch_error(m) && strstr(gmatch_error(m), "too ambiguous"), "%s", gmatch_error(m));
    printf("  hidden: refused at step %d in %.3f s over %d tokens\n", steps, t_mask, tv.n);
    free(mask);
    gmatch_free(m);
    grammar_free(g);
    tvocab_free(&tv);
}

int main(void) {
    TEST_RUN(test_constructs);
    TEST_RUN(test_errors);
    TEST_RUN(test_copy_reset);
    TEST_RUN(test_json);
    TEST_RUN(test_mask_random_vocab);
    TEST_RUN(test_mask_real_vocab);
    TEST_RUN(test_bounds);
    return TEST_DONE();
}
