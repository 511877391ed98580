/*
 * json_schema.c - JSON Schema to GBNF (see json_schema.h for what is
 * supported).
 *
 * One pass over the schema (a cJSON tree) writes one GBNF rule per schema
 * node; a node's rule refers to its children's rules by name, so the text
 * grows linearly with the schema. $ref targets get their rule name before
 * they are compiled, which makes recursive schemas plain recursive rules
 * (never left-recursive: every recursion goes through "{" or "[").
 *
 * Exactness. Every string of the grammar is a JSON text that validates
 * against the schema: strings use only valid JSON escapes (\uXXXX surrogates
 * only as complete pairs), keys of additionalProperties can never spell a
 * declared property, oneOf is accepted only where its alternatives cannot
 * overlap. The grammar may be a subset of the valid texts, documented
 * where it is: properties come in the schema's order; absent
 * additionalProperties beside properties means no other keys; numbers have
 * at most 16 integer digits, 16 fraction digits and a 2-digit exponent;
 * bounded numbers are integers and decimals i.f with all of [i, i + 1) in
 * range, without exponents; date years are
 * 1000-2999; patterns produce ASCII for \d \w \s, printable ASCII for
 * \D \W \S, no control characters for "." and negated classes (json_gbnf.c).
 * Whitespace between tokens is at
 * most a space, or a newline and 20 blanks.
 *
 * Bounds: schemas nest at most MAX_DEPTH deep (untrusted input reaches this
 * from the server), counts (minItems, maxLength, {m,n}) at most MAX_COUNT.
 * Everything else is refused with an error naming the keyword and its
 * place as a JSON pointer ("#/properties/a").
 */
#include "decode/json_schema.h"
#include "decode/grammar.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"
#include "base/utf8.h"
#include "base/util.h"
#include "decode/json_gbnf.h"

#define MAX_DEPTH JGBNF_MAX_DEPTH
#define MAX_COUNT JGBNF_MAX_COUNT
#define NAME_LEN 48
#define MAX_WORK 200000 /* compiler steps (rules, merges, type checks) per schema */

/* JSON value kinds, as bits (integer and number share one: they overlap). */
enum { T_OBJ = 1, T_ARR = 2, T_STR = 4, T_NUM = 8, T_INT = 16, T_BOOL = 32, T_NULL = 64 };
#define T_ALL (T_OBJ | T_ARR | T_STR | T_NUM | T_BOOL | T_NULL)

/* The fixed rules, emitted once at the end when used. */
enum {
    P_WS = 1,
    P_CHAR = 2,
    P_STRING = 4,
    P_NUMBER = 8,
    P_INTEGER = 16,
    P_BOOLEAN = 32,
    P_NULL = 64,
    P_VALUE = 128,
    P_PCHAR = 256,
    P_DATE = 512,
    P_TIME = 1024,
    P_DATETIME = 2048,
    P_UUID = 4096,
    P_EMAIL = 8192
};

typedef struct {
    char *ref;           /* the $ref text, owned */
    char name[NAME_LEN]; /* its rule */
    int inside;          /* c->inside when its compilation began */
    bool done;           /* compiled */
} refname;

typedef struct {
    const cJSON *root; /* the whole document (refs resolve against it), not owned */
    strbuf out;        /* the rules written so far */
    char *err;
    size_t errlen;
    bool failed;
    int nrules;
    unsigned prims; /* P_* bits of the fixed rules used */
    refname *refs;  /* (nrefs) refs compiled or being compiled */
    int nrefs, caprefs;
    cJSON **owned; /* (nowned) schemas built by merging, freed at the end */
    int nowned, capowned;
    char path[1024]; /* JSON pointer of the node being compiled */
    size_t plen;
    int depth;
    int inside;      /* object values and array items entered (each reads "{" or "[" first) */
    long work;       /* steps so far, bounded by MAX_WORK */
    int merge_id;    /* allOf branches merged so far (ids) */
    int ap_branch;   /* the branch with additionalProperties in this merge (-1 none, -2 several) */
    int prop_branch; /* the branch with properties (same) */
} jsc;

static int schema_rule(jsc *c, const cJSON *s, const char *hint, char *name);

/* ---- errors and paths ---- */

static int fail(jsc *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(jsc *c, const char *fmt, ...) {
    if (c->failed) return -1;
    c->failed = true;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    lm_err(c->err, c->errlen, "json schema: %s at #%s", msg, c->path);
    return -1;
}

/* Append one pointer segment (escaped ~0 ~1); returns the old length for
 * path_pop. A path too long for the buffer is cut (only the message
 * suffers). */
static size_t path_push(jsc *c, const char *seg) {
    size_t old = c->plen;
    if (c->plen + 1 < sizeof c->path) c->path[c->plen++] = '/';
    for (const char *p = seg; *p && c->plen + 2 < sizeof c->path; p++) {
        if (*p == '~' || *p == '/') {
            c->path[c->plen++] = '~';
            c->path[c->plen++] = *p == '~' ? '0' : '1';
        } else {
            c->path[c->plen++] = *p;
        }
    }
    c->path[c->plen] = 0;
    return old;
}

static size_t path_push_idx(jsc *c, int i) {
    char b[16];
    snprintf(b, sizeof b, "%d", i);
    return path_push(c, b);
}

static void path_pop(jsc *c, size_t old) {
    c->plen = old;
    c->path[old] = 0;
}

/* ---- text helpers ---- */

/* A fresh rule name "rN-hint" (hint reduced to [a-zA-Z0-9], 16 chars). */
static void new_name(jsc *c, const char *hint, char *name) {
    int n = snprintf(name, NAME_LEN, "r%d", ++c->nrules);
    if (hint && *hint) {
        name[n++] = '-';
        for (int k = 0; hint[k] && k < 16; k++) {
            char ch = hint[k];
            bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
            name[n++] = ok ? ch : 'x';
        }
        name[n] = 0;
    }
}

static void emit_rule(jsc *c, const char *name, const strbuf *body) {
    if (body->failed) {
        fail(c, "out of memory");
        return;
    }
    strbuf_printf(&c->out, "%s ::= %s\n", name, body->p ? body->p : "\"\"");
}

/* The compact JSON text of a value (as cJSON prints it), as a GBNF literal. */
static int put_json_value_lit(jsc *c, strbuf *b, const cJSON *v) {
    char *t = cJSON_PrintUnformatted(v);
    if (!t) return fail(c, "out of memory");
    jgbnf_lit(b, t, strlen(t));
    cJSON_free(t);
    return 0;
}

/* ---- schema helpers ---- */

static bool is_annotation(const char *k) {
    static const char *const ann[] = {
        "$schema",         "$id",        "id",       "title",     "description", "examples",    "default",
        "$comment",        "deprecated", "readOnly", "writeOnly", "$defs",       "definitions", "contentMediaType",
        "contentEncoding", "$anchor",    NULL};
    for (int i = 0; ann[i]; i++)
        if (!strcmp(k, ann[i])) return true;
    return false;
}

static bool is_supported(const char *k) {
    static const char *const kw[] = {"type",
                                     "properties",
                                     "required",
                                     "additionalProperties",
                                     "items",
                                     "prefixItems",
                                     "minItems",
                                     "maxItems",
                                     "enum",
                                     "const",
                                     "anyOf",
                                     "oneOf",
                                     "allOf",
                                     "$ref",
                                     "minLength",
                                     "maxLength",
                                     "minimum",
                                     "maximum",
                                     "exclusiveMinimum",
                                     "exclusiveMaximum",
                                     "pattern",
                                     "format",
                                     "uniqueItems",
                                     NULL};
    for (int i = 0; kw[i]; i++)
        if (!strcmp(k, kw[i])) return true;
    return false;
}

static int own(jsc *c, cJSON *s) {
    if (c->nowned == c->capowned) {
        int cap = c->capowned ? 2 * c->capowned : 16;
        cJSON **p = lm_realloc(c->owned, (size_t)cap * sizeof *p);
        if (!p) {
            cJSON_Delete(s);
            return fail(c, "out of memory");
        }
        c->owned = p;
        c->capowned = cap;
    }
    c->owned[c->nowned++] = s;
    return 0;
}

/* The node a local $ref ("#", "#/a/b", ~0 ~1 and %xx-free) points at. */
static const cJSON *resolve_ref(jsc *c, const char *ref) {
    if (ref[0] != '#') {
        fail(c, "$ref \"%.200s\" is not local (only \"#...\" references are supported)", ref);
        return NULL;
    }
    const cJSON *n = c->root;
    const char *p = ref + 1;
    if (*p && *p != '/') {
        fail(c, "$ref \"%.200s\": anchors are not supported, use a JSON pointer", ref);
        return NULL;
    }
    char seg[256];
    while (*p == '/') {
        p++;
        size_t k = 0;
        while (*p && *p != '/' && k + 1 < sizeof seg) {
            if (*p == '~' && (p[1] == '0' || p[1] == '1')) {
                seg[k++] = p[1] == '0' ? '~' : '/';
                p += 2;
            } else {
                seg[k++] = *p++;
            }
        }
        seg[k] = 0;
        if (cJSON_IsArray(n)) {
            char *end;
            long i = strtol(seg, &end, 10);
            n = (*seg && !*end) ? cJSON_GetArrayItem(n, (int)i) : NULL;
        } else if (cJSON_IsObject(n)) {
            n = cJSON_GetObjectItemCaseSensitive(n, seg);
        } else {
            n = NULL;
        }
        if (!n) {
            fail(c, "$ref \"%.200s\" points at nothing", ref);
            return NULL;
        }
    }
    return n;
}

static unsigned type_bit(const char *t) {
    if (!strcmp(t, "object")) return T_OBJ;
    if (!strcmp(t, "array")) return T_ARR;
    if (!strcmp(t, "string")) return T_STR;
    if (!strcmp(t, "number")) return T_NUM;
    if (!strcmp(t, "integer")) return T_INT;
    if (!strcmp(t, "boolean")) return T_BOOL;
    if (!strcmp(t, "null")) return T_NULL;
    return 0;
}

/* The "type" keyword as bits (0 and an error on a bad one); T_ALL without it. */
static unsigned declared_types(jsc *c, const cJSON *s) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (!t) return T_ALL | T_INT;
    unsigned m = 0;
    if (cJSON_IsString(t)) {
        m = type_bit(t->valuestring);
        if (!m) fail(c, "unknown type \"%.100s\"", t->valuestring);
        return m;
    }
    if (!cJSON_IsArray(t) || cJSON_GetArraySize(t) == 0) {
        fail(c, "\"type\" must be a string or a non-empty array of strings");
        return 0;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, t) {
        unsigned b = cJSON_IsString(e) ? type_bit(e->valuestring) : 0;
        if (!b) {
            fail(c, "\"type\" holds an unknown type");
            return 0;
        }
        m |= b;
    }
    return m;
}

/* The JSON kind of a value (T_INT for integral numbers, with T_NUM). */
static unsigned value_types(const cJSON *v) {
    if (cJSON_IsObject(v)) return T_OBJ;
    if (cJSON_IsArray(v)) return T_ARR;
    if (cJSON_IsString(v)) return T_STR;
    if (cJSON_IsBool(v)) return T_BOOL;
    if (cJSON_IsNull(v)) return T_NULL;
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        return (isfinite(d) && d == floor(d)) ? (T_NUM | T_INT) : T_NUM;
    }
    return 0;
}

/* Kinds that the keywords present imply when "type" is absent. */
static unsigned implied_types(const cJSON *s) {
    static const struct {
        const char *k;
        unsigned t;
    } imp[] = {{"properties", T_OBJ}, {"required", T_OBJ},         {"additionalProperties", T_OBJ},
               {"items", T_ARR},      {"prefixItems", T_ARR},      {"minItems", T_ARR},
               {"maxItems", T_ARR},   {"minLength", T_STR},        {"maxLength", T_STR},
               {"pattern", T_STR},    {"format", T_STR},           {"minimum", T_INT},
               {"maximum", T_INT},    {"exclusiveMinimum", T_INT}, {"exclusiveMaximum", T_INT}};
    unsigned m = 0;
    for (size_t i = 0; i < sizeof imp / sizeof imp[0]; i++)
        if (cJSON_GetObjectItemCaseSensitive(s, imp[i].k)) m |= imp[i].t;
    return m;
}

static bool has_kw(const cJSON *s, const char *k) { return cJSON_GetObjectItemCaseSensitive(s, k) != NULL; }

static int get_count(jsc *c, const cJSON *s, const char *k, long def, long *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, k);
    *out = def;
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble))
        return fail(c, "\"%s\" must be a non-negative integer", k);
    if (v->valuedouble > MAX_COUNT) return fail(c, "\"%s\" above %d is not supported", k, MAX_COUNT);
    *out = (long)v->valuedouble;
    return 0;
}

/* ---- objects ---- */

/* Rule for a key that is not one of names[0..n) (all sharing their first
 * `off` bytes, already matched): plain characters only (no escapes, which
 * could spell a declared name), the complement of a trie of the names. */
static int key_complement(jsc *c, const char **names, int n, size_t off, char *name) {
    if (c->depth > MAX_DEPTH * 4) return fail(c, "property names too long to exclude");
    if (++c->work > MAX_WORK) return fail(c, "schema too complex");
    c->prims |= P_PCHAR;
    new_name(c, "key", name);
    uint32_t *kids = lm_malloc((size_t)n * sizeof *kids);  /* (nk) distinct next characters */
    const char **sub = lm_malloc((size_t)n * sizeof *sub); /* (ns) names going on with one */
    if (!kids || !sub) {
        lm_free(kids);
        lm_free(sub);
        return fail(c, "out of memory");
    }
    bool terminal = false;
    int nk = 0;
    for (int i = 0; i < n; i++) {
        uint32_t cp;
        size_t len = strlen(names[i]);
        if (len == off) {
            terminal = true;
            continue;
        }
        if (!jgbnf_utf8(names[i] + off, len - off, &cp)) continue; /* never a valid key */
        bool seen = false;
        for (int k = 0; k < nk; k++) seen |= kids[k] == cp;
        if (!seen) kids[nk++] = cp;
    }
    strbuf b = {0};
    strbuf_puts(&b, "( [^");
    for (int k = 0; k < nk; k++) jgbnf_class_cp(&b, kids[k]);
    strbuf_puts(&b, "\"\\\\\\x00-\\x1F] pchar*");
    for (int k = 0; k < nk && !c->failed; k++) {
        int ns = 0, clen = 0;
        for (int i = 0; i < n; i++) {
            uint32_t cp;
            size_t len = strlen(names[i]);
            int l = len > off ? jgbnf_utf8(names[i] + off, len - off, &cp) : 0;
            if (l && cp == kids[k]) {
                sub[ns++] = names[i];
                clen = l;
            }
        }
        char kid[NAME_LEN];
        const char *first = sub[0];
        c->depth++;
        key_complement(c, sub, ns, off + (size_t)clen, kid);
        c->depth--;
        strbuf_puts(&b, " | ");
        jgbnf_lit(&b, first + off, (size_t)clen);
        strbuf_printf(&b, " %s", kid);
    }
    strbuf_puts(&b, terminal ? " )" : " )?");
    if (!c->failed) emit_rule(c, name, &b);
    strbuf_free(&b);
    lm_free(kids);
    lm_free(sub);
    return c->failed ? -1 : 0;
}

/* The rule for one member beyond the declared names[0..n) (the
 * additionalProperties schema add, or any value when add is NULL) into
 * addkv: a key that cannot spell a declared name, then its value. */
static int additional_member(jsc *c, const cJSON *add, const char **names, int n, char *addkv) {
    char key[NAME_LEN], val[NAME_LEN];
    const char **plain = lm_calloc((size_t)n + 1, sizeof *plain);
    int nplain = 0;
    for (int i = 0; plain && i < n; i++) {
        bool ok = true;
        for (const unsigned char *q = (const unsigned char *)names[i]; *q; q++)
            ok &= *q >= 0x20 && *q != '"' && *q != '\\';
        if (ok) plain[nplain++] = names[i];
    }
    if (!plain) {
        fail(c, "out of memory");
    } else if (n == 0) {
        c->prims |= P_STRING;
        strcpy(key, "string");
    } else {
        char inner[NAME_LEN];
        key_complement(c, plain, nplain, 0, inner);
        new_name(c, "addkey", key);
        strbuf kb = {0};
        strbuf_printf(&kb, "\"\\\"\" %s \"\\\"\"", inner);
        emit_rule(c, key, &kb);
        strbuf_free(&kb);
    }
    lm_free(plain);
    if (!c->failed) {
        if (add) {
            size_t m0 = path_push(c, "additionalProperties");
            c->inside++;
            schema_rule(c, add, "add", val);
            c->inside--;
            path_pop(c, m0);
        } else {
            c->prims |= P_VALUE;
            strcpy(val, "value");
        }
    }
    if (!c->failed) {
        new_name(c, "addkv", addkv);
        strbuf ab = {0};
        strbuf_printf(&ab, "%s ws \":\" ws %s", key, val);
        emit_rule(c, addkv, &ab);
        strbuf_free(&ab);
    }
    return c->failed ? -1 : 0;
}

typedef struct {
    const char *key;     /* property name, not owned */
    const cJSON *schema; /* its schema, not owned */
    bool req;
} prop;

/* An object with properties p[0..n) in order (required ones mandatory) and,
 * when add_rule is set, other keys (not among p) with values of add_rule. */
static int object_expr(jsc *c, const cJSON *s, strbuf *e) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return fail(c, "\"properties\" must be an object");
    if (req && !cJSON_IsArray(req)) return fail(c, "\"required\" must be an array");
    int np = cJSON_GetArraySize(props), nr = cJSON_GetArraySize(req);
    prop *p = lm_calloc((size_t)(np + nr) + 1, sizeof *p);
    const char **names = lm_calloc((size_t)(np + nr) + 1, sizeof *names);
    if (!p || !names) {
        lm_free(p);
        lm_free(names);
        return fail(c, "out of memory");
    }
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, props) {
        p[n].key = it->string;
        p[n].schema = it;
        n++;
    }
    static const cJSON any_schema = {.type = cJSON_True};
    cJSON_ArrayForEach(it, req) {
        if (!cJSON_IsString(it)) {
            lm_free(p);
            lm_free(names);
            return fail(c, "\"required\" must hold strings");
        }
        int k = 0;
        while (k < n && strcmp(p[k].key, it->valuestring)) k++;
        if (k == n) { /* required but not described: any value */
            if (cJSON_IsFalse(add)) {
                lm_free(p);
                lm_free(names);
                return fail(c, "\"%.100s\" is required but additionalProperties is false", it->valuestring);
            }
            p[n].key = it->valuestring;
            p[n].schema = &any_schema;
            n++;
        }
        p[k].req = true;
    }
    /* Values first (their rules), then the member sequence. */
    char(*kv)[NAME_LEN] = lm_calloc((size_t)n + 1, sizeof *kv);
    char(*g)[NAME_LEN] = lm_calloc((size_t)n + 2, sizeof *g);
    char(*sfx)[NAME_LEN] = lm_calloc((size_t)n + 2, sizeof *sfx);
    if (!kv || !g || !sfx) {
        fail(c, "out of memory");
        goto done;
    }
    strbuf b = {0};
    for (int i = 0; i < n && !c->failed; i++) {
        char val[NAME_LEN];
        size_t m0 = path_push(c, p[i].schema == &any_schema ? "required" : "properties");
        size_t m1 = path_push(c, p[i].key);
        c->inside++;
        schema_rule(c, p[i].schema, p[i].key, val);
        c->inside--;
        path_pop(c, m1);
        path_pop(c, m0);
        if (c->failed) break;
        new_name(c, "kv", kv[i]);
        cJSON *ks = cJSON_CreateString(p[i].key);
        char *kt = ks ? cJSON_PrintUnformatted(ks) : NULL;
        cJSON_Delete(ks);
        if (!kt) {
            fail(c, "out of memory");
            break;
        }
        strbuf tb = {0};
        jgbnf_lit(&tb, kt, strlen(kt));
        cJSON_free(kt);
        strbuf_printf(&tb, " ws \":\" ws %s", val);
        emit_rule(c, kv[i], &tb);
        strbuf_free(&tb);
        names[i] = p[i].key;
    }
    c->prims |= P_WS;
    /* Additional members: a key rule and a value rule. */
    char addkv[NAME_LEN] = "";
    bool extra = add ? !cJSON_IsFalse(add) : n == 0;
    if (!c->failed && extra) {
        additional_member(c, add, names, n, addkv);
    }
    if (c->failed) {
        strbuf_free(&b);
        goto done;
    }
    /* sfx[i]: what may follow once something was written, from property i on
     * ("" when nothing); g[i]: a non-empty member list starting at or after
     * property i ("" when none can). */
    if (*addkv) {
        new_name(c, "more", sfx[n]);
        b.len = 0;
        strbuf_printf(&b, "( ws \",\" ws %s )*", addkv);
        emit_rule(c, sfx[n], &b);
        new_name(c, "first", g[n]);
        b.len = 0;
        strbuf_printf(&b, "%s %s", addkv, sfx[n]);
        emit_rule(c, g[n], &b);
    }
    for (int i = n - 1; i >= 0; i--) {
        if (i > 0) { /* nothing comes before the first: no rest rule */
            new_name(c, "rest", sfx[i]);
            b.len = 0;
            if (p[i].req) strbuf_printf(&b, "ws \",\" ws %s", kv[i]);
            else strbuf_printf(&b, "( ws \",\" ws %s )?", kv[i]);
            if (*sfx[i + 1]) strbuf_printf(&b, " %s", sfx[i + 1]);
            emit_rule(c, sfx[i], &b);
        }
        new_name(c, "first", g[i]);
        b.len = 0;
        strbuf_printf(&b, "%s", kv[i]);
        if (*sfx[i + 1]) strbuf_printf(&b, " %s", sfx[i + 1]);
        if (!p[i].req && *g[i + 1]) strbuf_printf(&b, " | %s", g[i + 1]);
        emit_rule(c, g[i], &b);
    }
    strbuf_free(&b);
    bool any_req = false;
    for (int i = 0; i < n; i++) any_req |= p[i].req;
    if (!*g[0]) strbuf_puts(e, "\"{\" ws \"}\"");
    else if (any_req) strbuf_printf(e, "\"{\" ws %s ws \"}\"", g[0]);
    else strbuf_printf(e, "\"{\" ws ( %s ws )? \"}\"", g[0]);
done:
    lm_free(p);
    lm_free(names);
    lm_free(kv);
    lm_free(g);
    lm_free(sfx);
    return c->failed ? -1 : 0;
}

/* ---- arrays ---- */

static int array_expr(jsc *c, const cJSON *s, strbuf *e) {
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    long mn, mx;
    if (get_count(c, s, "minItems", 0, &mn) || get_count(c, s, "maxItems", -1, &mx)) return -1;
    if (cJSON_IsArray(items)) { /* draft 4's tuple form */
        if (pre) return fail(c, "\"items\" as an array beside \"prefixItems\"");
        pre = items;
        items = NULL;
    }
    if (pre && !cJSON_IsArray(pre)) return fail(c, "\"prefixItems\" must be an array");
    int k = cJSON_GetArraySize(pre);
    if (k > MAX_COUNT) return fail(c, "more than %d prefixItems", MAX_COUNT);
    if (cJSON_IsFalse(items) && (mx < 0 || mx > k)) mx = k;
    if (mx >= 0 && mn > mx) return fail(c, "minItems above maxItems: no array fits");
    if (mx >= 0 && mx < k) k = (int)mx;
    c->prims |= P_WS;
    if (mx == 0) {
        strbuf_puts(e, "\"[\" ws \"]\"");
        return 0;
    }
    char(*pr)[NAME_LEN] = lm_calloc((size_t)k + 1, sizeof *pr);
    if (!pr) return fail(c, "out of memory");
    for (int i = 0; i < k && !c->failed; i++) {
        size_t m0 = path_push(c, pre == items ? "items" : "prefixItems");
        size_t m1 = path_push_idx(c, i);
        c->inside++;
        schema_rule(c, cJSON_GetArrayItem(pre, i), "item", pr[i]);
        c->inside--;
        path_pop(c, m1);
        path_pop(c, m0);
    }
    char it[NAME_LEN] = "";
    bool more = (mx < 0 || mx > k) && !cJSON_IsFalse(items);
    if (!c->failed && more) {
        if (items) {
            size_t m0 = path_push(c, "items");
            c->inside++;
            schema_rule(c, items, "item", it);
            c->inside--;
            path_pop(c, m0);
        } else {
            c->prims |= P_VALUE;
            strcpy(it, "value");
        }
    }
    if (!c->failed && mn > k && !more) fail(c, "minItems above the items allowed: no array fits");
    if (c->failed) {
        lm_free(pr);
        return -1;
    }
    /* The tail after position k: ("," it){a,b}. Then positions k-1 .. 1 nest
     * around it, each optional once minItems is reached. */
    strbuf t = {0};
    long a = mn > k ? mn - k : 0, bmax = mx < 0 ? -1 : mx - k;
    if (k == 0) { /* the first item has no comma */
        strbuf_printf(&t, "%s ( ws \",\" ws %s )", it, it);
        jgbnf_repeat(&t, a > 0 ? a - 1 : 0, bmax < 0 ? -1 : bmax - 1);
    } else {
        if (more) {
            strbuf_printf(&t, "( ws \",\" ws %s )", it);
            jgbnf_repeat(&t, a, bmax);
        }
        for (int i = k - 1; i >= 1; i--) {
            strbuf u = {0};
            strbuf_printf(&u, "( ws \",\" ws %s%s%s )%s", pr[i], t.len ? " " : "", t.p ? t.p : "", i >= mn ? "?" : "");
            u.failed |= t.failed;
            strbuf_free(&t);
            t = u;
        }
        strbuf u = {0};
        strbuf_printf(&u, "%s%s%s", pr[0], t.len ? " " : "", t.p ? t.p : "");
        u.failed |= t.failed;
        strbuf_free(&t);
        t = u;
    }
    if (t.failed || !t.p) {
        strbuf_free(&t);
        lm_free(pr);
        return fail(c, "out of memory");
    }
    if (mn == 0) strbuf_printf(e, "\"[\" ws ( %s ws )? \"]\"", t.p);
    else strbuf_printf(e, "\"[\" ws %s ws \"]\"", t.p);
    strbuf_free(&t);
    lm_free(pr);
    return 0;
}

/* ---- strings, numbers ---- */

static int string_expr(jsc *c, const cJSON *s, strbuf *e) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    bool len = has_kw(s, "minLength") || has_kw(s, "maxLength");
    if ((pat != NULL) + (fmt != NULL) + len > 1)
        return fail(c, "only one of pattern, format and minLength/maxLength per string is supported");
    if (pat) {
        if (!cJSON_IsString(pat)) return fail(c, "\"pattern\" must be a string");
        size_t m0 = path_push(c, "pattern");
        char msg[LM_ERRLEN];
        bool any_char = false;
        int r = jgbnf_regex(e, pat->valuestring, &any_char, msg, sizeof msg);
        if (any_char) c->prims |= P_CHAR;
        if (r) fail(c, "%s", msg);
        path_pop(c, m0);
        return r;
    }
    if (fmt) {
        if (!cJSON_IsString(fmt)) return fail(c, "\"format\" must be a string");
        static const struct {
            const char *f;
            unsigned p;
            const char *rule;
        } fm[] = {{"date", P_DATE, "date"},
                  {"time", P_TIME, "time"},
                  {"date-time", P_DATETIME, "date-time"},
                  {"uuid", P_UUID, "uuid"},
                  {"email", P_EMAIL, "email"}};
        for (size_t i = 0; i < sizeof fm / sizeof fm[0]; i++) {
            if (!strcmp(fmt->valuestring, fm[i].f)) {
                c->prims |= fm[i].p;
                strbuf_printf(e, "\"\\\"\" %s \"\\\"\"", fm[i].rule);
                return 0;
            }
        }
        size_t m0 = path_push(c, "format");
        fail(c, "format \"%.100s\" is not supported (date, time, date-time, uuid, email are)", fmt->valuestring);
        path_pop(c, m0);
        return -1;
    }
    if (len) {
        long mn, mx;
        if (get_count(c, s, "minLength", 0, &mn) || get_count(c, s, "maxLength", -1, &mx)) return -1;
        if (mx >= 0 && mn > mx) return fail(c, "minLength above maxLength: no string fits");
        c->prims |= P_CHAR;
        strbuf_puts(e, "\"\\\"\" char");
        jgbnf_repeat(e, mn, mx);
        strbuf_puts(e, " \"\\\"\"");
        return 0;
    }
    c->prims |= P_STRING;
    strbuf_puts(e, "string");
    return 0;
}

/* Integer bounds from minimum/maximum/exclusive*: lo/hi with has_lo/has_hi. */
static int int_bounds(jsc *c, const cJSON *s, bool *has_lo, int64_t *lo, bool *has_hi, int64_t *hi) {
    *has_lo = *has_hi = false;
    const char *kws[4] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    for (int i = 0; i < 4; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, kws[i]);
        if (!v) continue;
        if (cJSON_IsBool(v)) { /* draft 4: a flag on minimum/maximum */
            continue;
        }
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return fail(c, "\"%s\" must be a number", kws[i]);
        double d = v->valuedouble;
        bool excl = i == 1 || i == 3;
        if (!excl) {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(s, i == 0 ? "exclusiveMinimum" : "exclusiveMaximum");
            excl = cJSON_IsTrue(f);
        }
        if (i < 2) {
            if (d <= -1e16) continue; /* below every integer the grammar writes */
            if (d >= 1e16) return fail(c, "\"%s\" above 1e16 is not supported", kws[i]);
            int64_t b = (int64_t)ceil(d);
            if (excl && (double)b == d) b++;
            if (!*has_lo || b > *lo) *lo = b;
            *has_lo = true;
        } else {
            if (d >= 1e16) continue;
            if (d <= -1e16) return fail(c, "\"%s\" below -1e16 is not supported", kws[i]);
            int64_t b = (int64_t)floor(d);
            if (excl && (double)b == d) b--;
            if (!*has_hi || b < *hi) *hi = b;
            *has_hi = true;
        }
    }
    if (*has_lo && *has_hi && *lo > *hi) return fail(c, "minimum above maximum: no integer fits");
    return 0;
}

/* An integer, or with number a number, within the schema's bounds. */
static int integer_expr(jsc *c, const cJSON *s, bool number, strbuf *e) {
    bool hl, hh;
    int64_t lo = 0, hi = 0;
    if (int_bounds(c, s, &hl, &lo, &hh, &hi)) return -1;
    if (!hl && !hh) {
        c->prims |= number ? P_NUMBER : P_INTEGER;
        strbuf_puts(e, number ? "number" : "integer");
        return 0;
    }
    if (number) jgbnf_num_range(e, hl, lo, hh, hi);
    else jgbnf_int_range(e, hl, lo, hh, hi);
    return 0;
}

/* ---- enum, const ---- */

static int enum_expr(jsc *c, const cJSON *s, unsigned types, strbuf *e) {
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    const cJSON *it;
    cJSON_ArrayForEach(it, s) {
        const char *k = it->string;
        if (is_annotation(k) || !strcmp(k, "enum") || !strcmp(k, "const") || !strcmp(k, "type")) continue;
        return fail(c, "\"%s\" beside enum or const is not supported", k);
    }
    if (en && !cJSON_IsArray(en)) return fail(c, "\"enum\" must be an array");
    int n = 0;
    if (cn) {
        if (en) { /* both: the const, if the enum holds it */
            bool in = false;
            cJSON_ArrayForEach(it, en) in |= cJSON_Compare(it, cn, true);
            if (!in) return fail(c, "const is not among enum's values: nothing fits");
        }
        if (value_types(cn) & types) {
            if (put_json_value_lit(c, e, cn)) return -1;
            n++;
        }
    } else {
        cJSON_ArrayForEach(it, en) {
            if (!(value_types(it) & types)) continue;
            if (n++) strbuf_puts(e, " | ");
            if (put_json_value_lit(c, e, it)) return -1;
        }
    }
    if (n == 0) return fail(c, "no enum or const value has the schema's type: nothing fits");
    return 0;
}

/* ---- combinators ---- */

static cJSON *dup(jsc *c, const cJSON *s) {
    cJSON *d = cJSON_Duplicate(s, true);
    if (!d) fail(c, "out of memory");
    return d;
}

/* Merge the assertions of src into dst (allOf). Keywords both set are
 * combined where the result is exact (types intersect, properties merge
 * through allOf, required unite, bounds tighten); otherwise refused. */
static int merge_into(jsc *c, cJSON *dst, const cJSON *src) {
    if (c->depth > MAX_DEPTH) return fail(c, "allOf nests too deep");
    if (++c->work > MAX_WORK) return fail(c, "schema too complex");
    /* additionalProperties speaks of its own branch's properties only, so
     * merged with another branch's properties it would change meaning:
     * note which branches hold each (-2: several). */
    int id = ++c->merge_id;
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(src, "additionalProperties");
    if (ap && !cJSON_IsTrue(ap)) c->ap_branch = c->ap_branch == -1 ? id : -2;
    if (has_kw(src, "properties")) c->prop_branch = c->prop_branch == -1 ? id : -2;
    if (cJSON_IsTrue(src)) return 0;
    if (!cJSON_IsObject(src)) return fail(c, "allOf holds something that is not a usable schema");
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(src, "$ref");
    if (ref) {
        if (!cJSON_IsString(ref)) return fail(c, "\"$ref\" must be a string");
        const cJSON *t = resolve_ref(c, ref->valuestring);
        if (!t) return -1;
        c->depth++;
        int r = merge_into(c, dst, t);
        c->depth--;
        if (r) return -1;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, src) {
        const char *k = it->string;
        if (is_annotation(k) || !strcmp(k, "$ref")) continue;
        if (!is_supported(k)) return fail(c, "unsupported keyword \"%s\"", k);
        cJSON *cur = cJSON_GetObjectItemCaseSensitive(dst, k);
        if (!strcmp(k, "allOf")) {
            if (!cJSON_IsArray(it)) return fail(c, "\"allOf\" must be an array");
            const cJSON *b;
            c->depth++;
            cJSON_ArrayForEach(b, it) if (merge_into(c, dst, b)) break;
            c->depth--;
            if (c->failed) return -1;
            continue;
        }
        if (!cur) {
            cJSON *d = dup(c, it);
            if (!d) return -1;
            cJSON_AddItemToObject(dst, k, d);
            continue;
        }
        if (cJSON_Compare(cur, it, true)) continue;
        if (!strcmp(k, "type")) {
            unsigned a = declared_types(c, dst), b = declared_types(c, src);
            if (c->failed) return -1;
            if (a & T_NUM) a |= T_INT;
            if (b & T_NUM) b |= T_INT;
            unsigned m = a & b;
            if (!m) return fail(c, "allOf: the types do not intersect, nothing fits");
            cJSON *arr = cJSON_CreateArray();
            static const char *const tn[] = {"object", "array", "string", "number", "integer", "boolean", "null"};
            for (int i = 0; i < 7 && arr; i++) {
                unsigned bit = 1u << i;
                if ((m & bit) && !(bit == T_INT && (m & T_NUM))) cJSON_AddItemToArray(arr, cJSON_CreateString(tn[i]));
            }
            if (!arr) return fail(c, "out of memory");
            cJSON_ReplaceItemInObjectCaseSensitive(dst, k, arr);
        } else if (!strcmp(k, "properties") && cJSON_IsObject(it) && cJSON_IsObject(cur)) {
            const cJSON *pp;
            cJSON_ArrayForEach(pp, it) {
                cJSON *old = cJSON_GetObjectItemCaseSensitive(cur, pp->string);
                cJSON *d = dup(c, pp);
                if (!d) return -1;
                if (!old) {
                    cJSON_AddItemToObject(cur, pp->string, d);
                } else {
                    cJSON *both = cJSON_CreateObject();
                    cJSON *arr = cJSON_AddArrayToObject(both, "allOf");
                    cJSON *o = dup(c, old);
                    if (!both || !arr || !o) {
                        cJSON_Delete(both);
                        cJSON_Delete(d);
                        cJSON_Delete(o);
                        return fail(c, "out of memory");
                    }
                    cJSON_AddItemToArray(arr, o);
                    cJSON_AddItemToArray(arr, d);
                    cJSON_ReplaceItemInObjectCaseSensitive(cur, pp->string, both);
                }
            }
        } else if (!strcmp(k, "required") && cJSON_IsArray(it) && cJSON_IsArray(cur)) {
            const cJSON *r;
            cJSON_ArrayForEach(r, it) {
                bool in = false;
                const cJSON *q;
                cJSON_ArrayForEach(q, cur) in |= cJSON_Compare(q, r, true);
                if (!in) cJSON_AddItemToArray(cur, cJSON_Duplicate(r, true));
            }
        } else if (cJSON_IsNumber(it) && cJSON_IsNumber(cur) &&
                   (!strncmp(k, "min", 3) || !strncmp(k, "max", 3) || !strncmp(k, "exclusive", 9))) {
            bool lower = !strncmp(k, "min", 3) || !strcmp(k, "exclusiveMinimum");
            double v = lower ? fmax(cur->valuedouble, it->valuedouble) : fmin(cur->valuedouble, it->valuedouble);
            cJSON_SetNumberValue(cur, v);
        } else {
            return fail(c, "allOf: two branches set \"%s\" differently, which is not supported", k);
        }
    }
    return c->failed ? -1 : 0;
}

/* A schema node with the sibling keywords of its anyOf/oneOf, i.e. with
 * every keyword but the combinator, annotations and $defs. */
static cJSON *siblings_of(jsc *c, const cJSON *s, const char *skip) {
    cJSON *o = cJSON_CreateObject();
    if (!o) {
        fail(c, "out of memory");
        return NULL;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, s) {
        if (!strcmp(it->string, skip) || is_annotation(it->string)) continue;
        cJSON *d = cJSON_Duplicate(it, true);
        if (!d) {
            cJSON_Delete(o);
            fail(c, "out of memory");
            return NULL;
        }
        cJSON_AddItemToObject(o, it->string, d);
    }
    return o;
}

/* Kinds a schema's instances can have (for oneOf's disjointness check). */
static unsigned schema_types(jsc *c, const cJSON *s, int depth) {
    if (depth > MAX_DEPTH || ++c->work > MAX_WORK || cJSON_IsTrue(s)) return T_ALL; /* may overlap */
    if (!cJSON_IsObject(s)) return 0;
    unsigned m = declared_types(c, s);
    if (!has_kw(s, "type")) {
        unsigned imp = implied_types(s);
        if (imp) m = imp | (imp & T_INT ? T_NUM : 0);
    }
    if (m & T_INT) m |= T_NUM;
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (cJSON_IsString(ref)) {
        const cJSON *t = resolve_ref(c, ref->valuestring);
        if (t) m &= schema_types(c, t, depth + 1);
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum"), *it;
    if (cJSON_IsArray(en)) {
        unsigned v = 0;
        cJSON_ArrayForEach(it, en) v |= value_types(it);
        m &= v;
    }
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (cn) m &= value_types(cn) | T_NUM;
    const char *alts[2] = {"anyOf", "oneOf"};
    for (int a = 0; a < 2; a++) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(s, alts[a]);
        if (!cJSON_IsArray(arr)) continue;
        unsigned v = 0;
        cJSON_ArrayForEach(it, arr) v |= schema_types(c, it, depth + 1);
        m &= v;
    }
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    if (cJSON_IsArray(all)) cJSON_ArrayForEach(it, all) m &= schema_types(c, it, depth + 1);
    return m & ~(unsigned)T_INT;
}

/* The single value a schema pins (const, or a one-value enum), or NULL. */
static const cJSON *pinned(const cJSON *s) {
    if (!cJSON_IsObject(s)) return NULL;
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (cn) return cn;
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    return cJSON_GetArraySize(en) == 1 ? cJSON_GetArrayItem(en, 0) : NULL;
}

/* Two oneOf alternatives cannot both match an instance: their kinds are
 * disjoint, their enum/const values differ, or both are objects that
 * require a property pinned to different values (a discriminator). */
/* A schema that is only a $ref (and annotations), followed (a few hops). */
static const cJSON *deref(jsc *c, const cJSON *s) {
    for (int hop = 0; hop < 16 && cJSON_IsObject(s); hop++) {
        const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref"), *it;
        bool only = cJSON_IsString(ref);
        cJSON_ArrayForEach(it, s) only &= !strcmp(it->string, "$ref") || is_annotation(it->string);
        if (!only) break;
        const cJSON *t = resolve_ref(c, ref->valuestring);
        if (!t) break;
        s = t;
    }
    return s;
}

static bool disjoint(jsc *c, const cJSON *a, const cJSON *b) {
    a = deref(c, a);
    b = deref(c, b);
    if (!(schema_types(c, a, 0) & schema_types(c, b, 0))) return true;
    const cJSON *ea = cJSON_GetObjectItemCaseSensitive(a, "enum"), *eb = cJSON_GetObjectItemCaseSensitive(b, "enum");
    const cJSON *ca = pinned(a), *cb = pinned(b);
    if ((ca || cJSON_IsArray(ea)) && (cb || cJSON_IsArray(eb))) {
        const cJSON *x, *y;
        bool meet = false;
        if (ca && cb) meet = cJSON_Compare(ca, cb, true);
        else if (ca) cJSON_ArrayForEach(y, eb) meet |= cJSON_Compare(ca, y, true);
        else if (cb) cJSON_ArrayForEach(x, ea) meet |= cJSON_Compare(x, cb, true);
        else cJSON_ArrayForEach(x, ea) cJSON_ArrayForEach(y, eb) meet |= cJSON_Compare(x, y, true);
        if (!meet) return true;
    }
    const cJSON *pa = cJSON_GetObjectItemCaseSensitive(a, "properties");
    const cJSON *pb = cJSON_GetObjectItemCaseSensitive(b, "properties");
    const cJSON *ra = cJSON_GetObjectItemCaseSensitive(a, "required");
    const cJSON *rb = cJSON_GetObjectItemCaseSensitive(b, "required");
    const cJSON *p;
    cJSON_ArrayForEach(p, pa) {
        const cJSON *q = cJSON_GetObjectItemCaseSensitive(pb, p->string);
        const cJSON *va = pinned(p), *vb = pinned(q);
        if (!va || !vb || cJSON_Compare(va, vb, true)) continue;
        bool in_a = false, in_b = false;
        const cJSON *r;
        cJSON_ArrayForEach(r, ra) in_a |= cJSON_IsString(r) && !strcmp(r->valuestring, p->string);
        cJSON_ArrayForEach(r, rb) in_b |= cJSON_IsString(r) && !strcmp(r->valuestring, p->string);
        if (in_a && in_b) return true;
    }
    return false;
}

/* anyOf / oneOf: one alternative per branch, each merged with the
 * node's other keywords. */
static int alternatives_expr(jsc *c, const cJSON *s, const char *kw, strbuf *e) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(s, kw);
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) == 0) return fail(c, "\"%s\" must be a non-empty array", kw);
    cJSON *sib = siblings_of(c, s, kw);
    if (!sib || own(c, sib)) return -1;
    bool plain = cJSON_GetArraySize(sib) == 0;
    size_t m0 = path_push(c, kw);
    int n = 0, i = 0;
    const cJSON *b;
    cJSON_ArrayForEach(b, arr) {
        size_t m1 = path_push_idx(c, i++);
        if (!strcmp(kw, "oneOf")) {
            const cJSON *b2 = b->next;
            for (; b2 && !c->failed; b2 = b2->next)
                if (!disjoint(c, b, b2))
                    fail(c, "oneOf's alternatives may overlap (only disjoint ones can be expressed; anyOf can)");
        }
        if (cJSON_IsFalse(b)) {
            path_pop(c, m1);
            continue;
        }
        const cJSON *alt = b;
        if (!plain && !c->failed) {
            cJSON *all = cJSON_CreateObject();
            cJSON *list = all ? cJSON_AddArrayToObject(all, "allOf") : NULL;
            cJSON *d1 = cJSON_Duplicate(sib, true), *d2 = cJSON_Duplicate(b, true);
            if (!list || !d1 || !d2) {
                cJSON_Delete(all);
                cJSON_Delete(d1);
                cJSON_Delete(d2);
                fail(c, "out of memory");
            } else {
                cJSON_AddItemToArray(list, d1);
                cJSON_AddItemToArray(list, d2);
                if (own(c, all) == 0) alt = all;
            }
        }
        char r[NAME_LEN];
        if (!c->failed) schema_rule(c, alt, kw, r);
        path_pop(c, m1);
        if (c->failed) break;
        if (n++) strbuf_puts(e, " | ");
        strbuf_puts(e, r);
    }
    path_pop(c, m0);
    if (!c->failed && n == 0) fail(c, "every alternative of %s is false: nothing fits", kw);
    return c->failed ? -1 : 0;
}

/* ---- one schema node ---- */

static int node_body(jsc *c, const cJSON *s, strbuf *e) {
    const cJSON *it;
    cJSON_ArrayForEach(it, s) {
        if (is_annotation(it->string)) continue;
        if (!is_supported(it->string)) {
            size_t m0 = path_push(c, it->string);
            fail(c, "unsupported keyword \"%s\"", it->string);
            path_pop(c, m0);
            return -1;
        }
    }
    const cJSON *ui = cJSON_GetObjectItemCaseSensitive(s, "uniqueItems");
    if (ui && !cJSON_IsFalse(ui)) return fail(c, "unsupported keyword \"uniqueItems\" (only false)");
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    bool any = has_kw(s, "anyOf"), one = has_kw(s, "oneOf");
    if (has_kw(s, "allOf") || (ref && cJSON_GetArraySize(s) > 1 && !(any || one))) {
        /* allOf, or $ref with sibling assertions: one merged node. */
        bool other = false;
        cJSON_ArrayForEach(it, s) other |= !is_annotation(it->string) && strcmp(it->string, "$ref");
        if (ref && !other) goto plain_ref;
        cJSON *m = cJSON_CreateObject();
        if (!m || own(c, m)) return fail(c, "out of memory");
        cJSON *wrap = cJSON_CreateObject();
        cJSON *list = wrap ? cJSON_AddArrayToObject(wrap, "allOf") : NULL;
        cJSON *d = cJSON_Duplicate(s, true);
        if (!list || !d) {
            cJSON_Delete(wrap);
            cJSON_Delete(d);
            return fail(c, "out of memory");
        }
        cJSON_DeleteItemFromObjectCaseSensitive(d, "$defs");
        cJSON_DeleteItemFromObjectCaseSensitive(d, "definitions");
        cJSON_AddItemToArray(list, d);
        c->ap_branch = c->prop_branch = -1;
        if (own(c, wrap) || merge_into(c, m, wrap)) return -1;
        if (c->ap_branch != -1 && c->prop_branch != -1 && c->ap_branch != c->prop_branch)
            return fail(c, "allOf: additionalProperties beside properties of another branch is not supported");
        if (has_kw(m, "allOf") || has_kw(m, "$ref")) return fail(c, "allOf could not be flattened");
        char r[NAME_LEN];
        if (schema_rule(c, m, "all", r)) return -1;
        strbuf_puts(e, r);
        return 0;
    }
    if (any && one) return fail(c, "anyOf beside oneOf is not supported");
    if (any || one) return alternatives_expr(c, s, any ? "anyOf" : "oneOf", e);
plain_ref:
    if (ref) {
        if (!cJSON_IsString(ref)) return fail(c, "\"$ref\" must be a string");
        for (int i = 0; i < c->nrefs; i++) {
            if (!strcmp(c->refs[i].ref, ref->valuestring)) {
                if (!c->refs[i].done && c->refs[i].inside == c->inside)
                    return fail(c, "$ref \"%.200s\" reaches itself before any JSON is read (left recursion)",
                                ref->valuestring);
                strbuf_puts(e, c->refs[i].name);
                return 0;
            }
        }
        const cJSON *t = resolve_ref(c, ref->valuestring);
        if (!t) return -1;
        if (c->nrefs == c->caprefs) {
            int cap = c->caprefs ? 2 * c->caprefs : 8;
            refname *p = lm_realloc(c->refs, (size_t)cap * sizeof *p);
            if (!p) return fail(c, "out of memory");
            c->refs = p;
            c->caprefs = cap;
        }
        refname *r = &c->refs[c->nrefs];
        r->ref = lm_strndup(ref->valuestring, strlen(ref->valuestring));
        if (!r->ref) return fail(c, "out of memory");
        const char *tail = strrchr(ref->valuestring, '/');
        new_name(c, tail ? tail + 1 : "self", r->name);
        r->inside = c->inside;
        r->done = false;
        int ri = c->nrefs++;
        char name[NAME_LEN], target[NAME_LEN];
        strcpy(name, r->name); /* refs may move as it grows */
        /* The target's errors name its own place. */
        char saved[sizeof c->path];
        size_t slen = c->plen;
        memcpy(saved, c->path, sizeof saved);
        c->plen = (size_t)snprintf(c->path, sizeof c->path, "%s", ref->valuestring + 1);
        if (c->plen >= sizeof c->path) c->plen = sizeof c->path - 1;
        int rc = schema_rule(c, t, tail ? tail + 1 : "self", target);
        memcpy(c->path, saved, sizeof saved);
        c->plen = slen;
        if (rc) return -1;
        c->refs[ri].done = true;
        strbuf b = {0};
        strbuf_puts(&b, target);
        emit_rule(c, name, &b);
        strbuf_free(&b);
        strbuf_puts(e, name);
        return 0;
    }
    unsigned types = declared_types(c, s);
    if (c->failed) return -1;
    if (has_kw(s, "enum") || has_kw(s, "const")) return enum_expr(c, s, types, e);
    if (!has_kw(s, "type")) {
        unsigned imp = implied_types(s);
        if (imp) types = imp;
    }
    /* Each kind, with the keywords that constrain it. */
    int n = 0;
    if (types & T_OBJ) {
        if (n++) strbuf_puts(e, " | ");
        if (object_expr(c, s, e)) return -1;
    }
    if (types & T_ARR) {
        if (n++) strbuf_puts(e, " | ");
        if (array_expr(c, s, e)) return -1;
    }
    if (types & T_STR) {
        if (n++) strbuf_puts(e, " | ");
        if (string_expr(c, s, e)) return -1;
    }
    if (types & (T_NUM | T_INT)) {
        if (n++) strbuf_puts(e, " | ");
        if (integer_expr(c, s, (types & T_NUM) != 0, e)) return -1;
    }
    if (types & T_BOOL) {
        if (n++) strbuf_puts(e, " | ");
        c->prims |= P_BOOLEAN;
        strbuf_puts(e, "boolean");
    }
    if (types & T_NULL) {
        if (n++) strbuf_puts(e, " | ");
        c->prims |= P_NULL;
        strbuf_puts(e, "null");
    }
    return 0;
}

/* Compile schema s into a rule; its name goes to name. */
static int schema_rule(jsc *c, const cJSON *s, const char *hint, char *name) {
    if (c->failed) return -1;
    if (cJSON_IsTrue(s)) {
        c->prims |= P_VALUE;
        strcpy(name, "value");
        return 0;
    }
    if (cJSON_IsFalse(s)) return fail(c, "schema false accepts nothing");
    if (!cJSON_IsObject(s)) return fail(c, "a schema must be an object or a boolean");
    if (c->depth >= MAX_DEPTH) return fail(c, "schema nests deeper than %d", MAX_DEPTH);
    if (++c->work > MAX_WORK) return fail(c, "schema too complex");
    c->depth++;
    new_name(c, hint, name);
    char mine[NAME_LEN];
    strcpy(mine, name);
    strbuf e = {0};
    int rc = node_body(c, s, &e);
    if (rc == 0 && e.failed) rc = fail(c, "out of memory");
    if (rc == 0 && e.len == 0) rc = fail(c, "schema accepts nothing");
    if (rc == 0) emit_rule(c, mine, &e);
    strbuf_free(&e);
    c->depth--;
    return c->failed ? -1 : 0;
}

/* The fixed rules used (P_* bits; some pull in others). */
static void emit_prims(strbuf *o, unsigned p) {
    if (p & P_VALUE) p |= P_STRING | P_NUMBER | P_BOOLEAN | P_NULL | P_WS;
    if (p & (P_STRING | P_UUID)) p |= P_CHAR;
    if (p & P_DATETIME) p |= P_DATE | P_TIME;
    if (p & P_WS) strbuf_puts(o, "ws ::= ( \" \" | \"\\n\" [ \\t]{0,20} )?\n");
    if (p & P_VALUE) {
        strbuf_puts(
            o,
            "value ::= object | array | string | number | boolean | null\n"
            "object ::= \"{\" ws ( string ws \":\" ws value ( ws \",\" ws string ws \":\" ws value )* ws )? \"}\"\n"
            "array ::= \"[\" ws ( value ( ws \",\" ws value )* ws )? \"]\"\n");
    }
    if (p & P_STRING) strbuf_puts(o, "string ::= \"\\\"\" char* \"\\\"\"\n");
    if (p & P_CHAR) {
        /* Any JSON string character; \u escapes of surrogates only as a
         * high-low pair, so every string decodes to valid Unicode. */
        strbuf_puts(
            o,
            "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" uesc )\n"
            "uesc ::= [0-9a-cA-Ce-fE-F] hex{3} | [dD] [0-7] hex{2} | [dD] [89abAB] hex{2} \"\\\\u\" [dD] [c-fC-F] hex{2}\n"
            "hex ::= [0-9a-fA-F]\n");
    }
    if (p & P_PCHAR) strbuf_puts(o, "pchar ::= [^\"\\\\\\x00-\\x1F]\n");
    if (p & P_NUMBER)
        strbuf_puts(
            o, "number ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?\n");
    if (p & P_INTEGER) strbuf_puts(o, "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n");
    if (p & P_BOOLEAN) strbuf_puts(o, "boolean ::= \"true\" | \"false\"\n");
    if (p & P_NULL) strbuf_puts(o, "null ::= \"null\"\n");
    jgbnf_format_rules(o,
                       (p & P_DATE ? JGBNF_DATE : 0) | (p & P_TIME ? JGBNF_TIME : 0) |
                           (p & P_DATETIME ? JGBNF_DATE_TIME : 0) | (p & P_UUID ? JGBNF_UUID : 0) |
                           (p & P_EMAIL ? JGBNF_EMAIL : 0));
}

/* Every key and string of the document is valid UTF-8 (grammar literals
 * are matched as UTF-8; cJSON turns a lone \uD800 into invalid bytes). */
static bool strings_valid(const cJSON *n) {
    for (; n; n = n->next) {
        if (n->string && !utf8_valid(n->string, strlen(n->string))) return false;
        if (cJSON_IsString(n) && !utf8_valid(n->valuestring, strlen(n->valuestring))) return false;
        if (n->child && !strings_valid(n->child)) return false;
    }
    return true;
}

static void jsc_free(jsc *c) {
    for (int i = 0; i < c->nrefs; i++) lm_free(c->refs[i].ref);
    lm_free(c->refs);
    for (int i = 0; i < c->nowned; i++) cJSON_Delete(c->owned[i]);
    lm_free(c->owned);
}

char *json_schema_to_gbnf(const char *json, size_t len, char *err, size_t errlen) {
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(json, len, &end, false);
    if (!doc) {
        lm_err(err, errlen, "json schema: not valid JSON (at byte %zu)", end ? (size_t)(end - json) : (size_t)0);
        return NULL;
    }
    for (; end && end < json + len; end++) {
        if (*end != ' ' && *end != '\t' && *end != '\n' && *end != '\r') {
            cJSON_Delete(doc);
            lm_err(err, errlen, "json schema: text after the JSON value (at byte %zu)", (size_t)(end - json));
            return NULL;
        }
    }
    if (!strings_valid(doc) || memmem(json, len, "\\u0000", 6) || memchr(json, 0, len)) {
        cJSON_Delete(doc);
        lm_err(err, errlen, "json schema: a string that is not valid UTF-8 or holds \\u0000");
        return NULL;
    }
    jsc c = {.root = doc, .err = err, .errlen = errlen};
    char top[NAME_LEN];
    if (schema_rule(&c, doc, "", top) == 0) {
        strbuf_printf(&c.out, "root ::= %s\n", top);
        emit_prims(&c.out, c.prims);
        if (c.out.failed) fail(&c, "out of memory");
    }
    jsc_free(&c);
    cJSON_Delete(doc);
    if (c.failed) {
        strbuf_free(&c.out);
        return NULL;
    }
    /* A schema no finite text satisfies (a required property whose $ref
     * leads back to the object itself, ...) compiles to rules that can
     * never finish: the grammar engine's check says so. */
    char gerr[LM_ERRLEN] = "";
    lm_grammar *g = grammar_parse(c.out.p, c.out.len, NULL, gerr, sizeof gerr);
    if (!g) {
        lm_err(err, errlen, "json schema: no finite JSON text satisfies it (its grammar: %s)", gerr);
        strbuf_free(&c.out);
        return NULL;
    }
    grammar_free(g);
    return c.out.p;
}

char *json_schema_any_object_gbnf(void) {
    strbuf o = {0};
    strbuf_puts(&o, "root ::= object\n");
    emit_prims(&o, P_VALUE);
    if (o.failed) {
        strbuf_free(&o);
        return NULL;
    }
    return o.p;
}
