/*
 * server_tools_xml.c - tool calls in the XML syntax of Qwen3.5's template
 * (CHAT_TOOLS_XML):
 *
 *   <tool_call>
 *   <function=NAME>
 *   <parameter=KEY>
 *   VALUE
 *   </parameter>
 *   ...
 *   </function>
 *   </tool_call>
 *
 * Both ways: the grammar that holds a model's calls to the request's tools
 * (srv_xml_rules, part of server_tools.c's tool grammar), and the reading of
 * one call back into its name and the JSON text of its arguments
 * (srv_xml_scan, for server_tools.c's reader).
 *
 * Parameters. A tool's parameters are the properties of its parameters
 * schema, in the schema's order, the required ones present, the others
 * optional, no others; a tool whose schema has no properties takes any
 * names, their values free text. A value is one of:
 *   text    a string property (type "string"): its characters as they are,
 *           any text without "\n</parameter>" (newlines allowed), or, with
 *           minLength/maxLength, that many characters on one line;
 *   choice  an enum (or const) of strings: one of them as it is;
 *   JSON    anything else (numbers, booleans, objects, arrays, strings with
 *           a pattern or a format, unions): the JSON of its schema.
 * The first two are what the template writes for string values (no quotes);
 * read back, they become JSON strings. A JSON value is the text the model
 * wrote. A value of an untyped parameter (a tool without properties) is
 * JSON when it parses as JSON; True, False and None are true, false and
 * null (what the template writes for them); anything else is a string.
 *
 * The arguments' JSON text is {"K": V, "K2": V2} (json.dumps' separators):
 * each parameter is added once its </parameter> is read, the closing brace
 * once </function> is, so a streamed call's arguments grow by whole
 * parameters and always start the final text.
 *
 * Bounds: the grammar is as large as the schemas' (each JSON-valued
 * property's schema is compiled alone, with the parameters' $defs and
 * definitions beside it); a scan reads one call, in time linear in its
 * length.
 */
#include <string.h>

#include <cjson/cJSON.h>

#include "serve/server_int.h"
#include "decode/json_gbnf.h"
#include "base/util.h"

#define INVALID "invalid_request_error"

/* "</parameter>", the text that ends a value after its newline. */
static const char CLOSE_PARAM[] = "</parameter>";

/* ---------------------------------------------------------------- grammar */

/*
 * xs-text: any text without "\n</parameter>". A line after a newline may
 * start with any proper prefix of "</parameter>" and must then leave it:
 * xs-rK has matched its first K characters.
 */
static void text_rules(strbuf *g) {
    strbuf_puts(g, "xs-text ::= [^\\n]* xs-line*\nxs-line ::= \"\\n\" xs-r0\n");
    int k_last = (int)sizeof CLOSE_PARAM - 2;
    for (int k = 0; k <= k_last; k++) {
        char c = CLOSE_PARAM[k];
        strbuf_printf(g, "xs-r%d ::= ([^%c\\n] [^\\n]*", k, c);
        if (k < k_last) strbuf_printf(g, " | \"%c\" xs-r%d", c, k + 1);
        strbuf_puts(g, ")?\n");
    }
    /* a parameter of a tool without properties: any name, free text */
    strbuf_puts(g, "xs-any ::= \"<parameter=\" [^>\\n]+ \">\\n\" xs-text \"\\n</parameter>\" tc-ws\n");
}

enum { V_TEXT, V_LINE, V_CHOICE, V_JSON };

/* How a property's value is written (see the header); *mn, *mx: V_LINE's
 * bounds (mx < 0: none). */
static int value_kind(const cJSON *ps, long *mn, long *mx) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(ps, "type");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(ps, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(ps, "const");
    bool str_type = cJSON_IsString(type) && !strcmp(type->valuestring, "string");
    if (!cJSON_IsObject(ps) || (type && !str_type)) return V_JSON;
    if (cJSON_IsString(cn)) return V_CHOICE;
    if (cJSON_IsArray(en) && en->child) {
        for (const cJSON *v = en->child; v; v = v->next)
            if (!cJSON_IsString(v)) return V_JSON;
        return V_CHOICE;
    }
    if (!str_type || en || cn || cJSON_GetObjectItemCaseSensitive(ps, "pattern") ||
        cJSON_GetObjectItemCaseSensitive(ps, "format"))
        return V_JSON;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(ps, "minLength");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(ps, "maxLength");
    if (!a && !b) return V_TEXT;
    /* the whole schema compiled first: the counts are integers in bounds */
    *mn = cJSON_IsNumber(a) ? (long)a->valuedouble : 0;
    *mx = cJSON_IsNumber(b) ? (long)b->valuedouble : -1;
    return V_LINE;
}

static bool required(const cJSON *params, const char *key) {
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(params, "required");
    for (const cJSON *v = cJSON_IsArray(req) ? req->child : NULL; v; v = v->next)
        if (cJSON_IsString(v) && !strcmp(v->valuestring, key)) return true;
    return false;
}

/* A JSON-valued property's rules, prefixed "tI-J-"; its schema compiled
 * with the parameters' $defs and definitions beside it. */
static int json_value_rules(const cJSON *params, const cJSON *ps, int i, int j, strbuf *g, lm_server_error *e) {
    cJSON *w = cJSON_Duplicate(ps, true);
    if (!w) return server_error(e, 500, "server_error", NULL, NULL, "out of memory while parsing the request");
    static const char *const defs[] = {"$defs", "definitions"};
    for (int k = 0; k < 2 && cJSON_IsObject(w); k++) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(params, defs[k]);
        if (d && !cJSON_GetObjectItemCaseSensitive(w, defs[k]))
            cJSON_AddItemToObject(w, defs[k], cJSON_Duplicate(d, true));
    }
    char param[64], prefix[32];
    snprintf(param, sizeof param, "'tools[%d].function.parameters'", i);
    snprintf(prefix, sizeof prefix, "t%d-%d-", i, j);
    char *sg = srv_schema_gbnf(w, "tools", param, e);
    cJSON_Delete(w);
    if (!sg) return -1;
    char *pg = srv_prefix_rules(sg, prefix);
    lm_free(sg);
    if (!pg) return server_error(e, 500, "server_error", NULL, NULL, "out of memory while parsing the request");
    strbuf_puts(g, pg);
    strbuf_puts(g, "\n");
    lm_free(pg);
    return 0;
}

/* Tool i's parameters rule (t<i>-args), or none when it takes none
 * (*has_args false); its text parameters appended to raw. */
static int tool_rules(const srv_tool_ref *t, int i, strbuf *g, strbuf *raw, bool *has_args, bool *free_text,
                      lm_server_error *e) {
    const cJSON *props = t->params ? cJSON_GetObjectItemCaseSensitive(t->params, "properties") : NULL;
    *has_args = true;
    if (!cJSON_IsObject(props)) {
        strbuf_printf(g, "t%d-args ::= xs-any*\n", i);
        *free_text = true;
        return 0;
    }
    if (!props->child) {
        *has_args = false;
        return 0;
    }
    strbuf body = {0}, sub = {0}; /* the parameters' rules; the JSON values' rules */
    strbuf_printf(g, "t%d-args ::=", i);
    int j = 0;
    for (const cJSON *ps = props->child; ps; ps = ps->next, j++) {
        const char *key = ps->string;
        if (strpbrk(key, ">\n")) {
            strbuf_free(&body);
            strbuf_free(&sub);
            return server_error(e, 400, INVALID, "tools", NULL,
                                "'tools[%d].function.parameters': the property name '%.64s' cannot be written in "
                                "this template's tool calls (it holds '>' or a newline)",
                                i, key);
        }
        strbuf_printf(g, " t%d-p%d%s", i, j, required(t->params, key) ? "" : "?");
        strbuf_printf(&body, "t%d-p%d ::= ", i, j);
        strbuf open = {0};
        strbuf_printf(&open, "<parameter=%s>\n", key);
        jgbnf_lit(&body, open.p ? open.p : "", open.len);
        body.failed |= open.failed;
        strbuf_free(&open);
        long mn = 0, mx = -1;
        int kind = value_kind(ps, &mn, &mx);
        if (kind == V_TEXT) {
            strbuf_puts(&body, " xs-text");
            *free_text = true;
        } else if (kind == V_LINE) {
            strbuf_puts(&body, " [^\\n]");
            jgbnf_repeat(&body, mn, mx);
        } else if (kind == V_CHOICE) {
            const cJSON *cn = cJSON_GetObjectItemCaseSensitive(ps, "const");
            strbuf_puts(&body, " (");
            if (cJSON_IsString(cn)) {
                jgbnf_lit(&body, cn->valuestring, strlen(cn->valuestring));
            } else {
                for (const cJSON *v = cJSON_GetObjectItemCaseSensitive(ps, "enum")->child; v; v = v->next) {
                    jgbnf_lit(&body, v->valuestring, strlen(v->valuestring));
                    if (v->next) strbuf_puts(&body, " | ");
                }
            }
            strbuf_puts(&body, ")");
        } else {
            strbuf_printf(&body, " t%d-%d-root", i, j);
            if (json_value_rules(t->params, ps, i, j, &sub, e)) {
                strbuf_free(&body);
                strbuf_free(&sub);
                return -1;
            }
        }
        strbuf_puts(&body, " \"\\n</parameter>\" tc-ws\n");
        if (kind == V_TEXT || kind == V_LINE || kind == V_CHOICE) strbuf_put(raw, key, strlen(key) + 1);
    }
    strbuf_puts(g, "\n");
    strbuf_put(g, body.p ? body.p : "", body.len);
    strbuf_put(g, sub.p ? sub.p : "", sub.len);
    g->failed |= body.failed || sub.failed;
    strbuf_free(&body);
    strbuf_free(&sub);
    return 0;
}

int srv_xml_rules(const srv_tool_ref *tools, int n, strbuf *g, strbuf *raw, lm_server_error *e) {
    strbuf_puts(g, "tc-call ::= \"<tool_call>\" tc-ws \"<function=\" tc-fn \"</function>\" tc-ws \"</tool_call>\"\n");
    strbuf fn = {0}, rules = {0};
    bool free_text = false;
    strbuf_puts(&fn, "tc-fn ::= ");
    for (int i = 0; i < n; i++) {
        char param[48];
        snprintf(param, sizeof param, "'tools[%d].function.parameters'", i);
        if (tools[i].params) { /* the whole schema first: what it holds is checked as the other syntaxes check it */
            char *whole = srv_schema_gbnf(tools[i].params, "tools", param, e);
            if (!whole) goto fail;
            lm_free(whole);
        }
        strbuf_put(raw, tools[i].name, strlen(tools[i].name) + 1);
        bool has_args;
        if (tool_rules(&tools[i], i, &rules, raw, &has_args, &free_text, e)) goto fail;
        strbuf_put(raw, "", 1);
        strbuf lit = {0};
        strbuf_printf(&lit, "%s>", tools[i].name);
        if (i) strbuf_puts(&fn, "  | ");
        jgbnf_lit(&fn, lit.p ? lit.p : "", lit.len);
        fn.failed |= lit.failed;
        strbuf_free(&lit);
        strbuf_puts(&fn, " tc-ws");
        if (has_args) strbuf_printf(&fn, " t%d-args", i);
        strbuf_puts(&fn, "\n");
    }
    strbuf_put(raw, "", 1);
    strbuf_put(g, fn.p ? fn.p : "", fn.len);
    strbuf_put(g, rules.p ? rules.p : "", rules.len);
    if (free_text) text_rules(g);
    g->failed |= fn.failed || rules.failed;
    strbuf_free(&fn);
    strbuf_free(&rules);
    return 0;
fail:
    strbuf_free(&fn);
    strbuf_free(&rules);
    return -1;
}

/* ------------------------------------------------------------------ reading */

static bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static size_t blanks(const char *s, size_t n, size_t p) {
    while (p < n && is_blank(s[p])) p++;
    return p;
}

/* A fixed text at s[*p]: J_DONE (*p past it), J_MORE (the text ends inside
 * it), J_BAD. */
static int lit(const char *s, size_t n, size_t *p, const char *l) {
    size_t m = strlen(l), have = n - *p < m ? n - *p : m;
    if (memcmp(s + *p, l, have) != 0) return J_BAD;
    if (have < m) return J_MORE;
    *p += m;
    return J_DONE;
}

/* The text parameters raw lists for the tool name[0..nl), or NULL. */
static const char *tool_texts(const char *raw, const char *name, size_t nl) {
    for (const char *t = raw; t && *t;) {
        size_t tl = strlen(t);
        const char *q = t + tl + 1;
        if (tl == nl && !memcmp(t, name, nl)) return q;
        while (*q) q += strlen(q) + 1;
        t = q + 1;
    }
    return NULL;
}

static bool is_text(const char *texts, const char *key, size_t kl) {
    for (const char *q = texts; q && *q; q += strlen(q) + 1)
        if (strlen(q) == kl && !memcmp(q, key, kl)) return true;
    return false;
}

/* s[0..n) as a JSON string, the way json.dumps writes it (ensure_ascii off). */
static void json_string(strbuf *b, const char *s, size_t n) {
    strbuf_puts(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
            case '"': strbuf_puts(b, "\\\""); break;
            case '\\': strbuf_puts(b, "\\\\"); break;
            case '\n': strbuf_puts(b, "\\n"); break;
            case '\r': strbuf_puts(b, "\\r"); break;
            case '\t': strbuf_puts(b, "\\t"); break;
            case '\b': strbuf_puts(b, "\\b"); break;
            case '\f': strbuf_puts(b, "\\f"); break;
            default:
                if (c < 0x20) strbuf_printf(b, "\\u%04x", c);
                else strbuf_put(b, s + i, 1);
        }
    }
    strbuf_puts(b, "\"");
}

/* One value as JSON (see the header). */
static void put_value(strbuf *b, const char *v, size_t n, bool text) {
    if (text) {
        json_string(b, v, n);
        return;
    }
    size_t a = 0, z = n;
    while (a < z && is_blank(v[a])) a++;
    while (z > a && is_blank(v[z - 1])) z--;
    if (z > a) {
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(v + a, z - a, &end, false);
        bool whole = j && end == v + z;
        cJSON_Delete(j);
        if (whole) {
            strbuf_put(b, v + a, z - a);
            return;
        }
    }
    static const char *const py[][2] = {{"True", "true"}, {"False", "false"}, {"None", "null"}};
    for (int k = 0; k < 3; k++)
        if (z - a == strlen(py[k][0]) && !memcmp(v + a, py[k][0], z - a)) {
            strbuf_puts(b, py[k][1]);
            return;
        }
    json_string(b, v, n);
}

void srv_xml_scan_free(srv_xml_call *r) { strbuf_free(&r->args); }

void srv_xml_scan(const char *s, size_t n, size_t p, const char *raw, srv_xml_call *r) {
    strbuf_free(&r->args);
    memset(r, 0, sizeof *r);
    r->status = J_MORE;
    p = blanks(s, n, p);
    int st = lit(s, n, &p, "<function=");
    if (st != J_DONE) {
        r->status = st;
        return;
    }
    size_t q = p;
    while (q < n && s[q] != '>' && s[q] != '\n' && s[q] != '<') q++;
    if (q >= n) return;
    if (s[q] != '>' || q == p) {
        r->status = J_BAD;
        return;
    }
    r->has_name = true, r->name_s = p, r->name_e = q;
    const char *texts = tool_texts(raw, s + p, q - p);
    for (p = q + 1;;) {
        p = blanks(s, n, p);
        if (p >= n) return;
        if (n - p >= 2 && s[p] == '<' && s[p + 1] == '/') {
            st = lit(s, n, &p, "</function>");
            if (st != J_DONE) {
                r->status = st;
                return;
            }
            strbuf_puts(&r->args, r->has_args ? "}" : "{}");
            r->has_args = true;
            p = blanks(s, n, p);
            if (p >= n) return;
            st = lit(s, n, &p, "</tool_call>");
            r->status = st;
            r->end = p;
            return;
        }
        st = lit(s, n, &p, "<parameter=");
        if (st != J_DONE) {
            r->status = st;
            return;
        }
        size_t ks = p;
        while (p < n && s[p] != '>' && s[p] != '\n') p++;
        if (p >= n) return;
        if (s[p] != '>' || p == ks) {
            r->status = J_BAD;
            return;
        }
        size_t ke = p++;
        if (p >= n) return;
        if (s[p] == '\n') p++; /* the value's own line */
        /* the value ends at "\n</parameter>" (or at once at "</parameter>": an empty one) */
        size_t ve = 0, after = 0;
        if (n - p >= sizeof CLOSE_PARAM - 1 && !memcmp(s + p, CLOSE_PARAM, sizeof CLOSE_PARAM - 1)) {
            ve = p, after = p + sizeof CLOSE_PARAM - 1;
        } else {
            const char *e = memmem(s + p, n - p, "\n</parameter>", sizeof CLOSE_PARAM);
            if (!e) return;
            ve = (size_t)(e - s), after = ve + sizeof CLOSE_PARAM;
        }
        strbuf_puts(&r->args, r->has_args ? ", " : "{");
        json_string(&r->args, s + ks, ke - ks);
        strbuf_puts(&r->args, ": ");
        put_value(&r->args, s + p, ve - p, is_text(texts, s + ks, ke - ks));
        r->has_args = true;
        p = after;
    }
}
