/*
 * chat_tools.c - conversations with tools: OpenAI's function tools, the
 * assistant's tool calls and the tool results, as each chat family shows
 * them (chat.h names the four syntaxes and the templates they reproduce).
 *
 * Two ways to render. The hermes families are a rewrite of the messages into
 * plain system/user/assistant ones that chat_render (or chat_render_template)
 * then renders as usual: the tool list joins the system message, calls join
 * the assistant's content, results become a user turn. Qwen2.5's template
 * writes exactly that, so the rewrite reproduces it byte for byte. Llama 3
 * and Mistral v3 write roles and markers no plain message has ("ipython",
 * [TOOL_CALLS], [AVAILABLE_TOOLS]), so they have their own renderers here,
 * following their templates step by step. So has Qwen3.5 (its XML calls
 * take each argument apart), whose renderer chat.c also uses for
 * conversations without tools.
 *
 * JSON in prompts (tool definitions, call arguments) is re-printed the way
 * Python's json.dumps(ensure_ascii=False) prints it, transformers' tojson:
 * a small recursive printer over the JSON text (no tree is built), with a
 * depth limit. Strings are decoded and re-escaped, numbers copied as written.
 *
 * Invariants: every message is checked (role known, content not NULL, calls
 * only on assistant messages, each with a name) before anything is written;
 * the output buffer records an allocation failure instead of returning it,
 * and it is checked once at the end.
 */
#include "text/chat.h"
#include "text/chat_int.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "base/util.h"

#define JSON_MAX_DEPTH 128

/* ------------------------------------------------------------ JSON printer */

typedef struct {
    const char *s, *e; /* the text still to read */
    strbuf *out;       /* NULL: only validate and skip */
    int indent;        /* < 0: one line */
} jcur;

static void jput(jcur *j, const char *s, size_t n) {
    if (j->out) strbuf_put(j->out, s, n);
}

static void jputs(jcur *j, const char *s) { jput(j, s, strlen(s)); }

static void jskip_ws(jcur *j) {
    while (j->s < j->e && (*j->s == ' ' || *j->s == '\t' || *j->s == '\n' || *j->s == '\r')) j->s++;
}

static int hexv(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_hex4(jcur *j, uint32_t *cp) {
    if (j->e - j->s < 4) return -1;
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexv(j->s[k]);
        if (h < 0) return -1;
        v = v * 16 + (uint32_t)h;
    }
    j->s += 4;
    *cp = v;
    return 0;
}

/* One code point as Python writes it in a JSON string (ensure_ascii=False). */
static void put_escaped_cp(jcur *j, uint32_t cp) {
    char buf[8];
    switch (cp) {
        case '"': jputs(j, "\\\""); return;
        case '\\': jputs(j, "\\\\"); return;
        case '\n': jputs(j, "\\n"); return;
        case '\r': jputs(j, "\\r"); return;
        case '\t': jputs(j, "\\t"); return;
        case '\b': jputs(j, "\\b"); return;
        case '\f': jputs(j, "\\f"); return;
        default: break;
    }
    if (cp < 0x20 || (cp >= 0xd800 && cp <= 0xdfff)) {
        snprintf(buf, sizeof buf, "\\u%04x", (unsigned)cp);
        jputs(j, buf);
        return;
    }
    int n = utf8_encode(cp, buf);
    jput(j, buf, (size_t)n);
}

/* A JSON string at j->s: re-escaped with quotes (raw false) or decoded
 * (raw true: the string's characters as they are). */
static int jstring(jcur *j, bool raw) {
    if (j->s >= j->e || *j->s != '"') return -1;
    j->s++;
    if (!raw) jputs(j, "\"");
    while (j->s < j->e && *j->s != '"') {
        unsigned char c = (unsigned char)*j->s;
        if (c < 0x20) return -1;
        if (c != '\\') {
            const char *p = j->s;
            while (j->s < j->e && *j->s != '"' && *j->s != '\\' && (unsigned char)*j->s >= 0x20) j->s++;
            jput(j, p, (size_t)(j->s - p));
            continue;
        }
        if (j->e - j->s < 2) return -1;
        char x = j->s[1];
        j->s += 2;
        uint32_t cp;
        switch (x) {
            case '"': cp = '"'; break;
            case '\\': cp = '\\'; break;
            case '/': cp = '/'; break;
            case 'b': cp = '\b'; break;
            case 'f': cp = '\f'; break;
            case 'n': cp = '\n'; break;
            case 'r': cp = '\r'; break;
            case 't': cp = '\t'; break;
            case 'u':
                if (read_hex4(j, &cp)) return -1;
                if (cp >= 0xd800 && cp <= 0xdbff && j->e - j->s >= 6 && j->s[0] == '\\' && j->s[1] == 'u') {
                    jcur k = *j;
                    uint32_t lo;
                    k.s += 2;
                    if (!read_hex4(&k, &lo) && lo >= 0xdc00 && lo <= 0xdfff) {
                        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                        j->s = k.s;
                    }
                }
                break;
            default: return -1;
        }
        if (raw) {
            char buf[4];
            int n = cp >= 0xd800 && cp <= 0xdfff ? 0 : utf8_encode(cp, buf);
            jput(j, buf, (size_t)n);
        } else {
            put_escaped_cp(j, cp);
        }
    }
    if (j->s >= j->e) return -1;
    j->s++;
    if (!raw) jputs(j, "\"");
    return 0;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* A JSON number, checked against JSON's grammar and copied as written. */
static int jnumber(jcur *j) {
    const char *p = j->s;
    if (p < j->e && *p == '-') p++;
    if (p >= j->e || !is_digit(*p)) return -1;
    if (*p == '0') p++;
    else
        while (p < j->e && is_digit(*p)) p++;
    if (p < j->e && *p == '.') {
        p++;
        if (p >= j->e || !is_digit(*p)) return -1;
        while (p < j->e && is_digit(*p)) p++;
    }
    if (p < j->e && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < j->e && (*p == '+' || *p == '-')) p++;
        if (p >= j->e || !is_digit(*p)) return -1;
        while (p < j->e && is_digit(*p)) p++;
    }
    jput(j, j->s, (size_t)(p - j->s));
    j->s = p;
    return 0;
}

static void newline(jcur *j, int level) {
    if (j->indent < 0) return;
    jputs(j, "\n");
    for (int i = 0; i < level * j->indent; i++) jputs(j, " ");
}

static int jvalue(jcur *j, int level);

/* An object or an array (open is '{' or '['). */
static int jcontainer(jcur *j, int level, char open) {
    char close = open == '{' ? '}' : ']';
    if (level >= JSON_MAX_DEPTH) return -1;
    j->s++;
    jput(j, &open, 1);
    jskip_ws(j);
    if (j->s < j->e && *j->s == close) {
        j->s++;
        jput(j, &close, 1);
        return 0;
    }
    for (bool first = true;; first = false) {
        if (!first) jputs(j, j->indent < 0 ? ", " : ",");
        newline(j, level + 1);
        jskip_ws(j);
        if (open == '{') {
            if (jstring(j, false)) return -1;
            jskip_ws(j);
            if (j->s >= j->e || *j->s != ':') return -1;
            j->s++;
            jputs(j, ": ");
        }
        if (jvalue(j, level + 1)) return -1;
        jskip_ws(j);
        if (j->s < j->e && *j->s == ',') {
            j->s++;
            continue;
        }
        if (j->s < j->e && *j->s == close) {
            j->s++;
            newline(j, level);
            jput(j, &close, 1);
            return 0;
        }
        return -1;
    }
}

static int jvalue(jcur *j, int level) {
    jskip_ws(j);
    if (j->s >= j->e) return -1;
    char c = *j->s;
    if (c == '{' || c == '[') return jcontainer(j, level, c);
    if (c == '"') return jstring(j, false);
    static const char *const words[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t n = strlen(words[k]);
        if ((size_t)(j->e - j->s) >= n && !memcmp(j->s, words[k], n)) {
            jput(j, j->s, n);
            j->s += n;
            return 0;
        }
    }
    return jnumber(j);
}

int chat_json_dump(const char *json, size_t len, int indent, strbuf *out) {
    jcur j = {json, json + len, out, indent};
    if (!json || jvalue(&j, 0)) return -1;
    jskip_ws(&j);
    return j.s == j.e ? 0 : -1;
}

/* A Python str as json.dumps writes it. */
void chat_put_pystr(strbuf *b, const char *s) {
    jcur j = {NULL, NULL, b, -1};
    jputs(&j, "\"");
    while (*s) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c == '"' || c == '\\') {
            put_escaped_cp(&j, c);
            s++;
            continue;
        }
        const char *p = s;
        while (*s && (unsigned char)*s >= 0x20 && *s != '"' && *s != '\\') s++;
        strbuf_put(b, p, (size_t)(s - p));
    }
    jputs(&j, "\"");
}

/* Arguments as tojson writes them: the JSON re-printed, or, when they are
 * not valid JSON, the text as a JSON string (what a string argument gives). */
void chat_put_args(strbuf *b, const char *args) {
    size_t mark = b->len;
    if (chat_json_dump(args, strlen(args), -1, b) == 0) return;
    if (!b->failed) {
        b->len = mark;
        if (b->p) b->p[mark] = '\0';
    }
    chat_put_pystr(b, args);
}

/* The members of the object at j->s: calls fn on each (key decoded, value at
 * k->s); 0, or -1 when it is not an object. */
typedef void (*member_fn)(void *user, const char *key, jcur *value);

static int each_member(const char *json, size_t len, const char *path_key, member_fn fn, void *user) {
    jcur j = {json, json + len, NULL, -1};
    jskip_ws(&j);
    if (j.s >= j.e || *j.s != '{') return -1;
    j.s++;
    jskip_ws(&j);
    if (j.s < j.e && *j.s == '}') return 0;
    for (;;) {
        jskip_ws(&j);
        strbuf key = {0};
        jcur k = j;
        k.out = &key;
        if (jstring(&k, true)) {
            strbuf_free(&key);
            return -1;
        }
        j.s = k.s;
        jskip_ws(&j);
        if (j.s >= j.e || *j.s != ':') {
            strbuf_free(&key);
            return -1;
        }
        j.s++;
        jskip_ws(&j);
        jcur v = j;
        if (!path_key || !strcmp(key.p ? key.p : "", path_key)) fn(user, key.p ? key.p : "", &v);
        strbuf_free(&key);
        if (jvalue(&j, 1)) return -1;
        jskip_ws(&j);
        if (j.s < j.e && *j.s == ',') {
            j.s++;
            continue;
        }
        return j.s < j.e && *j.s == '}' ? 0 : -1;
    }
}

/* ------------------------------------------------------- message checks */

enum { XR_SYSTEM, XR_USER, XR_ASSISTANT, XR_TOOL };

static int xrole(const char *r) {
    static const char *const names[] = {"system", "user", "assistant", "tool"};
    for (int i = 0; i < 4; i++)
        if (r && !strcmp(r, names[i])) return i;
    return -1;
}

static int check_xmsgs(const lm_chat_xmsg *m, int n, const char *const *tools, int n_tools, char *err, size_t errlen) {
    if (!m || n <= 0) return lm_err(err, errlen, "chat: no messages to render");
    if (n_tools < 0 || (n_tools > 0 && !tools)) return lm_err(err, errlen, "chat: bad tool list");
    for (int i = 0; i < n_tools; i++)
        if (!tools[i]) return lm_err(err, errlen, "chat: tool %d is missing", i);
    for (int i = 0; i < n; i++) {
        int r = xrole(m[i].role);
        if (r < 0)
            return lm_err(err, errlen,
                          "chat: message %d has unknown role '%.40s' (expected system, user, assistant or tool)", i,
                          m[i].role ? m[i].role : "(none)");
        if (!m[i].content) return lm_err(err, errlen, "chat: message %d (%s) has no content", i, m[i].role);
        if (m[i].n_calls < 0 || (m[i].n_calls > 0 && (r != XR_ASSISTANT || !m[i].calls)))
            return lm_err(err, errlen, "chat: message %d (%s) cannot carry tool calls", i, m[i].role);
        for (int k = 0; k < m[i].n_calls; k++)
            if (!m[i].calls[k].name || !m[i].calls[k].arguments)
                return lm_err(err, errlen, "chat: tool call %d of message %d has no name or arguments", k, i);
    }
    return 0;
}

static bool needs_tools(const lm_chat_xmsg *m, int n, int n_tools) {
    if (n_tools > 0) return true;
    for (int i = 0; i < n; i++)
        if (xrole(m[i].role) == XR_TOOL || m[i].n_calls > 0) return true;
    return false;
}

/* ------------------------------------------------------ the hermes rewrite */

static const char HERMES_HEAD[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\n<tools>";
static const char HERMES_TAIL[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>";

static void put_tool_list_hermes(strbuf *b, const char *const *tools, int n_tools) {
    strbuf_puts(b, HERMES_HEAD);
    for (int i = 0; i < n_tools; i++) {
        strbuf_puts(b, "\n");
        size_t mark = b->len;
        if (chat_json_dump(tools[i], strlen(tools[i]), -1, b) && !b->failed) {
            b->len = mark; /* the serve layer gives valid JSON; anything else is written raw */
            strbuf_puts(b, tools[i]);
        }
    }
    strbuf_puts(b, HERMES_TAIL);
}

/* <tool_call>\n{"name": "N", "arguments": ARGS}\n</tool_call>, one per call, joined by newlines. */
static void put_calls_hermes(strbuf *b, const lm_chat_xmsg *m) {
    for (int k = 0; k < m->n_calls; k++) {
        if (k) strbuf_puts(b, "\n");
        strbuf_puts(b, "<tool_call>\n{\"name\": \"");
        strbuf_puts(b, m->calls[k].name);
        strbuf_puts(b, "\", \"arguments\": ");
        chat_put_args(b, m->calls[k].arguments);
        strbuf_puts(b, "}\n</tool_call>");
    }
}

/* Families whose templates refuse two user turns in a row. */
static bool alternates(int family) {
    return family == CHAT_LLAMA2 || family == CHAT_MISTRAL_LEGACY || family == CHAT_MISTRAL_V1 || family == CHAT_GEMMA;
}

/*
 * The plain messages (and their owned contents) that render as the hermes
 * syntax. *texts holds every string written here (freed by the caller).
 */
static int hermes_rewrite(int family, const char *template_text, const lm_chat_xmsg *m, int n, const char *const *tools,
                          int n_tools, lm_chat_msg **out, int *n_out, strbuf **texts, char *err, size_t errlen) {
    lm_chat_msg *pm = lm_calloc((size_t)n + 1, sizeof *pm);
    strbuf *tx = lm_calloc((size_t)n + 1, sizeof *tx);
    *out = pm, *texts = tx, *n_out = 0;
    if (!pm || !tx) return lm_err(err, errlen, "chat: out of memory");
    int w = 0, i = 0;
    bool merge = alternates(family);
    if (n_tools > 0) {
        strbuf *b = &tx[w];
        bool had_system = xrole(m[0].role) == XR_SYSTEM;
        if (family == CHAT_MISTRAL_LEGACY) {
            /* no system role: the list opens the first user turn (below) */
        } else {
            if (had_system) {
                strbuf_puts(b, m[0].content);
                strbuf_puts(b, "\n\n");
                i = 1;
            } else if (family == CHAT_CHATML && template_text) {
                strbuf def = {0};
                if (chat_default_system(template_text, &def) && def.p) {
                    strbuf_puts(b, def.p);
                    strbuf_puts(b, "\n\n");
                } else if (def.failed) {
                    b->failed = true;
                }
                strbuf_free(&def);
            }
            put_tool_list_hermes(b, tools, n_tools);
            pm[w] = (lm_chat_msg){"system", ""};
            w++;
        }
    }
    bool list_pending = n_tools > 0 && family == CHAT_MISTRAL_LEGACY;
    int last_kind = -1; /* XR_USER when the last written message is a user turn (tool results too) */
    for (; i < n; i++) {
        int r = xrole(m[i].role);
        strbuf *b = &tx[w];
        if (r == XR_TOOL || (r == XR_USER && merge && last_kind == XR_USER)) {
            bool join =
                last_kind == XR_USER && (r == XR_TOOL ? (i > 0 && xrole(m[i - 1].role) == XR_TOOL) || merge : true);
            if (join) {
                b = &tx[w - 1];
                strbuf_puts(b, "\n");
            }
            if (r == XR_TOOL) {
                strbuf_puts(b, "<tool_response>\n");
                strbuf_puts(b, m[i].content);
                strbuf_puts(b, "\n</tool_response>");
            } else {
                strbuf_puts(b, m[i].content);
            }
            if (!join) {
                pm[w] = (lm_chat_msg){"user", ""};
                w++;
            }
            last_kind = XR_USER;
            continue;
        }
        if (r == XR_USER && list_pending) {
            put_tool_list_hermes(b, tools, n_tools);
            strbuf_puts(b, "\n\n");
            list_pending = false;
        }
        strbuf_puts(b, m[i].content);
        if (r == XR_ASSISTANT && m[i].n_calls > 0) {
            if (m[i].content[0]) strbuf_puts(b, "\n");
            put_calls_hermes(b, &m[i]);
        }
        pm[w] = (lm_chat_msg){m[i].role, ""};
        w++;
        last_kind = r;
    }
    for (int k = 0; k < w; k++) {
        if (tx[k].failed) return lm_err(err, errlen, "chat: out of memory");
        pm[k].content = tx[k].p ? tx[k].p : "";
    }
    *n_out = w;
    return 0;
}

/* ----------------------------------------------------------- Llama 3(.1) */

static const char LLAMA3_TOOLS_INTRO[] =
    "Given the following functions, please respond with a JSON for a function call with its proper arguments "
    "that best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
    "dictionary of argument name and its value}.Do not use variables.\n\n";

static void put_stripped(strbuf *b, const char *s) {
    size_t a, len;
    chat_strip_span(s, strlen(s), &a, &len);
    strbuf_put(b, s + a, len);
}

static void llama3_header(strbuf *b, const char *role) {
    strbuf_puts(b, "<|start_header_id|>");
    strbuf_puts(b, role);
    strbuf_puts(b, "<|end_header_id|>\n\n");
}

static int render_llama3_tools(const lm_chat_xmsg *m, int n, const char *const *tools, int n_tools, bool gen,
                               const char *bos, strbuf *b) {
    strbuf_puts(b, bos);
    int i = 0;
    if (n_tools > 0) {
        llama3_header(b, "system");
        strbuf_puts(b, "Environment: ipython\n\n");
        if (xrole(m[0].role) == XR_SYSTEM) put_stripped(b, m[i++].content);
        strbuf_puts(b, "<|eot_id|>");
    }
    bool list_pending = n_tools > 0;
    for (; i < n; i++) {
        int r = xrole(m[i].role);
        if (r == XR_TOOL) {
            llama3_header(b, "ipython");
            strbuf_puts(b, m[i].content);
        } else if (r == XR_ASSISTANT && m[i].n_calls > 0) {
            llama3_header(b, "assistant");
            size_t a, len;
            chat_strip_span(m[i].content, strlen(m[i].content), &a, &len);
            if (len) {
                strbuf_put(b, m[i].content + a, len);
                strbuf_puts(b, "\n");
            }
            for (int k = 0; k < m[i].n_calls; k++) {
                if (k) strbuf_puts(b, "\n");
                strbuf_puts(b, "{\"name\": \"");
                strbuf_puts(b, m[i].calls[k].name);
                strbuf_puts(b, "\", \"parameters\": ");
                chat_put_args(b, m[i].calls[k].arguments);
                strbuf_puts(b, "}");
            }
        } else {
            llama3_header(b, m[i].role);
            if (r == XR_USER && list_pending) {
                strbuf_puts(b, LLAMA3_TOOLS_INTRO);
                for (int t = 0; t < n_tools; t++) {
                    size_t mark = b->len;
                    if (chat_json_dump(tools[t], strlen(tools[t]), 4, b) && !b->failed) {
                        b->len = mark;
                        strbuf_puts(b, tools[t]);
                    }
                    strbuf_puts(b, "\n\n");
                }
                list_pending = false;
            }
            put_stripped(b, m[i].content);
        }
        strbuf_puts(b, "<|eot_id|>");
    }
    if (gen) llama3_header(b, "assistant");
    return 0;
}

/* ------------------------------------------------------------ Mistral v3 */

/* One member of a tool's "function" inside [AVAILABLE_TOOLS]: strings raw,
 * everything else as tojson, "return" left out. */
typedef struct {
    strbuf *b;
    int count;
    int bad;
} fn_members;

static void put_fn_member(void *user, const char *key, jcur *v) {
    fn_members *f = user;
    if (!strcmp(key, "return")) return;
    if (f->count++) strbuf_puts(f->b, ", ");
    strbuf_puts(f->b, "\"");
    strbuf_puts(f->b, key);
    strbuf_puts(f->b, "\": ");
    jcur j = *v;
    j.out = f->b;
    if (j.s < j.e && *j.s == '"') {
        strbuf_puts(f->b, "\"");
        f->bad |= jstring(&j, true);
        strbuf_puts(f->b, "\"");
    } else {
        f->bad |= jvalue(&j, 0);
    }
}

typedef struct {
    strbuf *b;
    int bad;
    bool seen;
} fn_find;

static void find_function(void *user, const char *key, jcur *v) {
    fn_find *f = user;
    (void)key;
    fn_members fm = {f->b, 0, 0};
    f->seen = true;
    if (each_member(v->s, (size_t)(v->e - v->s), NULL, put_fn_member, &fm)) f->bad = 1;
    f->bad |= fm.bad;
}

static int put_tools_mistral(strbuf *b, const char *const *tools, int n_tools, bool tekken, char *err, size_t errlen) {
    strbuf_puts(b, tekken ? "[AVAILABLE_TOOLS][" : "[AVAILABLE_TOOLS] [");
    for (int t = 0; t < n_tools; t++) {
        strbuf_puts(b, "{\"type\": \"function\", \"function\": {");
        fn_find f = {b, 0, false};
        if (each_member(tools[t], strlen(tools[t]), "function", find_function, &f) || f.bad || !f.seen)
            return lm_err(err, errlen, "chat: tool %d is not an object with a \"function\" object", t);
        strbuf_puts(b, "}}");
        strbuf_puts(b, t + 1 < n_tools ? ", " : "]");
    }
    strbuf_puts(b, "[/AVAILABLE_TOOLS]");
    return 0;
}

static bool plain_turn(const lm_chat_xmsg *m) { return xrole(m->role) != XR_TOOL && m->n_calls == 0; }

static int render_mistral_tools(const lm_chat_xmsg *m, int n, const char *const *tools, int n_tools, bool tekken,
                                const char *bos, const char *eos, strbuf *b, char *err, size_t errlen) {
    const char *fam = tekken ? "mistral-v3-tekken" : "mistral-v3";
    int first = xrole(m[0].role) == XR_SYSTEM;
    int k = 0, last_user = -1;
    for (int i = first; i < n; i++) {
        if (xrole(m[i].role) == XR_USER) last_user = i;
        if (!plain_turn(&m[i])) continue;
        if ((xrole(m[i].role) == XR_USER) != (k % 2 == 0))
            return lm_err(err, errlen,
                          "chat (%s): after the optional system message, conversation roles must alternate "
                          "user/assistant/user/assistant/... (message %d is %s)",
                          fam, i, m[i].role);
        k++;
    }
    strbuf_puts(b, bos);
    for (int i = first; i < n; i++) {
        int r = xrole(m[i].role);
        if (r == XR_USER) {
            /* message == user_messages[-1]: equal as values, so an identical earlier turn matches too */
            if (n_tools > 0 && !strcmp(m[i].content, m[last_user].content) &&
                put_tools_mistral(b, tools, n_tools, tekken, err, errlen))
                return -1;
            strbuf_puts(b, tekken ? "[INST]" : "[INST] ");
            if (i == n - 1 && first) {
                strbuf_puts(b, m[0].content);
                strbuf_puts(b, "\n\n");
            }
            strbuf_puts(b, m[i].content);
            strbuf_puts(b, "[/INST]");
        } else if (m[i].n_calls > 0) {
            strbuf_puts(b, tekken ? "[TOOL_CALLS][" : "[TOOL_CALLS] [");
            for (int c = 0; c < m[i].n_calls; c++) {
                strbuf_puts(b, "{\"name\": ");
                chat_put_pystr(b, m[i].calls[c].name);
                strbuf_puts(b, ", \"arguments\": ");
                chat_put_args(b, m[i].calls[c].arguments);
                strbuf_puts(b, ", \"id\": \"");
                strbuf_puts(b, m[i].calls[c].id ? m[i].calls[c].id : "");
                strbuf_puts(b, "\"}");
                strbuf_puts(b, c + 1 < m[i].n_calls ? ", " : "]");
            }
            strbuf_puts(b, eos);
        } else if (r == XR_ASSISTANT) {
            if (!tekken) {
                strbuf_puts(b, " ");
                put_stripped(b, m[i].content);
            } else {
                strbuf_puts(b, m[i].content);
            }
            strbuf_puts(b, eos);
        } else if (r == XR_TOOL) {
            strbuf_puts(b, tekken ? "[TOOL_RESULTS]{\"content\": " : "[TOOL_RESULTS] {\"content\": ");
            strbuf_puts(b, m[i].content);
            strbuf_puts(b, ", \"call_id\": \"");
            strbuf_puts(b, m[i].call_id ? m[i].call_id : "");
            strbuf_puts(b, "\"}[/TOOL_RESULTS]");
        } else {
            return lm_err(err, errlen,
                          "chat (%s): only user and assistant roles are supported, with the exception of an "
                          "initial optional system message (message %d is system)",
                          fam, i);
        }
    }
    return 0;
}

/* --------------------------------------------------------------- Qwen3.5 */

static const char XML_HEAD[] = "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>";
static const char XML_TAIL[] =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple "
    "lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the "
    "specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> "
    "XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function "
    "call in natural language BEFORE the function call, but NOT after\n- If there is no function call "
    "available, answer the question like normal with your current knowledge and do not tell the user about "
    "function calls\n</IMPORTANT>";

/* Python's repr of the float nearest to the JSON number s[0..n): the
 * shortest digits that read back as the same double, written fixed when
 * the decimal point falls within -4 < point <= 16, else as d.ddde+XX. */
static void put_pyfloat(strbuf *b, const char *s, size_t n) {
    char e[40], digits[24];
    char *num = lm_strndup(s, n); /* strtod wants the number NUL-terminated */
    if (!num) {
        b->failed = true;
        return;
    }
    double v = strtod(num, NULL);
    lm_free(num);
    if (v != v || v - v != 0) { /* out of range: json.loads gives inf */
        strbuf_puts(b, v < 0 ? "-inf" : "inf");
        return;
    }
    if (v == 0) {
        strbuf_puts(b, signbit(v) ? "-0.0" : "0.0");
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, v);
        if (strtod(e, NULL) == v || prec == 17) break;
    }
    /* e: [-]D[.DDD]e[+-]XX */
    const char *q = e;
    if (*q == '-') strbuf_puts(b, "-"), q++;
    int nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int point = atoi(q + 1) + 1; /* digits[0..point) before the decimal point */
    if (point > -4 && point <= 16) {
        if (point <= 0) {
            strbuf_puts(b, "0.");
            for (int k = 0; k < -point; k++) strbuf_puts(b, "0");
            strbuf_put(b, digits, (size_t)nd);
        } else if (point >= nd) {
            strbuf_put(b, digits, (size_t)nd);
            for (int k = nd; k < point; k++) strbuf_puts(b, "0");
            strbuf_puts(b, ".0");
        } else {
            strbuf_put(b, digits, (size_t)point);
            strbuf_puts(b, ".");
            strbuf_put(b, digits + point, (size_t)(nd - point));
        }
        return;
    }
    strbuf_put(b, digits, 1);
    if (nd > 1) {
        strbuf_puts(b, ".");
        strbuf_put(b, digits + 1, (size_t)(nd - 1));
    }
    strbuf_printf(b, "e%c%02d", point - 1 < 0 ? '-' : '+', abs(point - 1));
}

/* A JSON value that is no string, object or array, as Python's str() of
 * what json.loads makes of it: True, False, None, an int as written ("-0"
 * is 0), a float as repr() writes it. */
static void put_pyscalar(strbuf *b, const char *s, size_t n) {
    if (n == 4 && !memcmp(s, "true", 4)) strbuf_puts(b, "True");
    else if (n == 5 && !memcmp(s, "false", 5)) strbuf_puts(b, "False");
    else if (n == 4 && !memcmp(s, "null", 4)) strbuf_puts(b, "None");
    else if (memchr(s, '.', n) || memchr(s, 'e', n) || memchr(s, 'E', n)) put_pyfloat(b, s, n);
    else if (n == 2 && !memcmp(s, "-0", 2)) strbuf_puts(b, "0");
    else strbuf_put(b, s, n);
}

/* One argument: <parameter=K>\nV\n</parameter>\n (see CHAT_TOOLS_XML). */
static void put_xml_param(void *user, const char *key, jcur *v) {
    fn_members *f = user;
    strbuf_puts(f->b, "<parameter=");
    strbuf_puts(f->b, key);
    strbuf_puts(f->b, ">\n");
    jcur j = *v;
    j.out = f->b;
    if (j.s < j.e && *j.s == '"') {
        f->bad |= jstring(&j, true);
    } else if (j.s < j.e && (*j.s == '{' || *j.s == '[')) {
        f->bad |= jvalue(&j, 0);
    } else {
        j.out = NULL;
        const char *p = j.s;
        f->bad |= jvalue(&j, 0);
        put_pyscalar(f->b, p, (size_t)(j.s - p));
    }
    strbuf_puts(f->b, "\n</parameter>\n");
    f->count++;
}

/* A content strip()ped, and the span of the text left after it: the
 * template's `content|trim`. */
static void strip_span(const char *s, size_t *a, size_t *b) {
    size_t len;
    chat_strip_span(s, strlen(s), a, &len);
    *b = *a + len;
}

/* The last occurrence of needle in s[a..b), or NULL. */
static const char *last_between(const char *s, size_t a, size_t b, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = b >= a + k ? b - k + 1 : a; i-- > a;)
        if (!memcmp(s + i, needle, k)) return s + i;
    return NULL;
}

static const char *first_between(const char *s, size_t a, size_t b, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = a; i + k <= b; i++)
        if (!memcmp(s + i, needle, k)) return s + i;
    return NULL;
}

/* content.startswith('<tool_response>') and content.endswith('</tool_response>') of s[a..b). */
static bool tool_response_block(const char *s, size_t a, size_t b) {
    static const char OPEN[] = "<tool_response>", CLOSE[] = "</tool_response>";
    size_t o = sizeof OPEN - 1, c = sizeof CLOSE - 1;
    return b - a >= o && !memcmp(s + a, OPEN, o) && b - a >= c && !memcmp(s + b - c, CLOSE, c);
}

static int qwen35_assistant(const lm_chat_xmsg *m, bool after_query, strbuf *b, char *err, size_t errlen) {
    const char *s = m->content;
    size_t c0, c1, r0 = 0, r1 = 0;
    strip_span(s, &c0, &c1);
    const char *close = first_between(s, c0, c1, "</think>");
    if (close) {
        /* reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
        r1 = (size_t)(close - s);
        while (r1 > c0 && s[r1 - 1] == '\n') r1--;
        const char *open = last_between(s, c0, r1, "<think>");
        r0 = open ? (size_t)(open - s) + 7 : c0;
        while (r0 < r1 && s[r0] == '\n') r0++;
        /* content = content.split('</think>')[-1].lstrip('\n') */
        c0 = (size_t)(last_between(s, c0, c1, "</think>") - s) + 8;
        while (c0 < c1 && s[c0] == '\n') c0++;
    }
    strbuf_puts(b, "<|im_start|>assistant\n");
    if (after_query) {
        size_t a, len; /* reasoning_content|trim */
        chat_strip_span(s + r0, r1 - r0, &a, &len);
        strbuf_puts(b, "<think>\n");
        strbuf_put(b, s + r0 + a, len);
        strbuf_puts(b, "\n</think>\n\n");
    }
    strbuf_put(b, s + c0, c1 - c0);
    size_t t0, tl; /* content|trim */
    chat_strip_span(s + c0, c1 - c0, &t0, &tl);
    for (int k = 0; k < m->n_calls; k++) {
        const lm_chat_call *call = &m->calls[k];
        strbuf_puts(b,
                    k        ? "\n<tool_call>\n<function="
                        : tl ? "\n\n<tool_call>\n<function="
                             : "<tool_call>\n<function=");
        strbuf_puts(b, call->name);
        strbuf_puts(b, ">\n");
        size_t an = strlen(call->arguments), at = 0;
        while (at < an &&
               (call->arguments[at] == ' ' || call->arguments[at] == '\t' || call->arguments[at] == '\n' ||
                call->arguments[at] == '\r'))
            at++;
        fn_members f = {b, 0, 0};
        if (at == an || call->arguments[at] != '{' || chat_json_dump(call->arguments, an, -1, NULL) ||
            each_member(call->arguments, an, NULL, put_xml_param, &f) || f.bad)
            return lm_err(err, errlen, "chat (qwen3.5): the arguments of tool call '%.64s' are not a JSON object",
                          call->name);
        strbuf_puts(b, "</function>\n</tool_call>");
    }
    strbuf_puts(b, "<|im_end|>\n");
    return 0;
}

int chat_render_qwen35(const lm_chat_xmsg *m, int n, const char *const *tools, int n_tools, bool gen, strbuf *b,
                       char *err, size_t errlen) {
    size_t a, e;
    if (n_tools > 0) {
        strbuf_puts(b, XML_HEAD);
        for (int i = 0; i < n_tools; i++) {
            strbuf_puts(b, "\n");
            size_t mark = b->len;
            if (chat_json_dump(tools[i], strlen(tools[i]), -1, b) && !b->failed) {
                b->len = mark; /* the serve layer gives valid JSON; anything else is written raw */
                strbuf_puts(b, tools[i]);
            }
        }
        strbuf_puts(b, XML_TAIL);
        if (xrole(m[0].role) == XR_SYSTEM) {
            strip_span(m[0].content, &a, &e);
            if (e > a) {
                strbuf_puts(b, "\n\n");
                strbuf_put(b, m[0].content + a, e - a);
            }
        }
        strbuf_puts(b, "<|im_end|>\n");
    } else if (xrole(m[0].role) == XR_SYSTEM) {
        strip_span(m[0].content, &a, &e);
        strbuf_puts(b, "<|im_start|>system\n");
        strbuf_put(b, m[0].content + a, e - a);
        strbuf_puts(b, "<|im_end|>\n");
    }
    /* ns.last_query_index: the last user message that is no <tool_response> block */
    int last_query = -1;
    for (int i = n - 1; i >= 0 && last_query < 0; i--) {
        strip_span(m[i].content, &a, &e);
        if (xrole(m[i].role) == XR_USER && !tool_response_block(m[i].content, a, e)) last_query = i;
    }
    if (last_query < 0) return lm_err(err, errlen, "chat (qwen3.5): no user query found in messages");
    for (int i = 0; i < n; i++) {
        int r = xrole(m[i].role);
        strip_span(m[i].content, &a, &e);
        if (r == XR_SYSTEM && i > 0)
            return lm_err(err, errlen,
                          "chat (qwen3.5): a system message must be at the beginning (message %d is system)", i);
        if (r == XR_USER) {
            strbuf_puts(b, "<|im_start|>user\n");
            strbuf_put(b, m[i].content + a, e - a);
            strbuf_puts(b, "<|im_end|>\n");
        } else if (r == XR_ASSISTANT) {
            if (qwen35_assistant(&m[i], i > last_query, b, err, errlen)) return -1;
        } else if (r == XR_TOOL) {
            /* loop.previtem is undefined for the first message: no header then */
            if (i > 0 && xrole(m[i - 1].role) != XR_TOOL) strbuf_puts(b, "<|im_start|>user");
            strbuf_puts(b, "\n<tool_response>\n");
            strbuf_put(b, m[i].content + a, e - a);
            strbuf_puts(b, "\n</tool_response>");
            if (i == n - 1 || xrole(m[i + 1].role) != XR_TOOL) strbuf_puts(b, "<|im_end|>\n");
        }
    }
    if (gen) strbuf_puts(b, "<|im_start|>assistant\n<think>\n");
    return 0;
}

/* ------------------------------------------------------------- rendering */

int chat_tool_syntax(int family) {
    switch (family) {
        case CHAT_LLAMA3: return CHAT_TOOLS_LLAMA3;
        case CHAT_MISTRAL_V3:
        case CHAT_MISTRAL_V3_TEKKEN: return CHAT_TOOLS_MISTRAL;
        case CHAT_QWEN35: return CHAT_TOOLS_XML;
        case CHAT_GPT_OSS: return CHAT_TOOLS_HARMONY;
        default: return CHAT_TOOLS_HERMES;
    }
}

/* Without tools: the plain renderer over the same messages. */
static int render_plain(int family, const char *template_text, const lm_chat_xmsg *m, int n, bool gen, const char *bos,
                        const char *eos, char **out, char *err, size_t errlen) {
    lm_chat_msg *pm = lm_calloc((size_t)n, sizeof *pm);
    if (!pm) return lm_err(err, errlen, "chat: out of memory");
    for (int i = 0; i < n; i++) pm[i] = (lm_chat_msg){m[i].role, m[i].content};
    int rc = family >= 0 ? chat_render(family, pm, n, gen, bos, eos, out, err, errlen)
                         : chat_render_template(template_text, pm, n, gen, bos, eos, out, err, errlen);
    lm_free(pm);
    return rc;
}

int chat_render_tools(int family, const char *template_text, const lm_chat_xmsg *msgs, int n, const char *const *tools,
                      int n_tools, bool add_generation_prompt, const char *bos_text, const char *eos_text, char **out,
                      char *err, size_t errlen) {
    lm_chat_conv conv = {.msgs = msgs, .n = n, .tools = tools, .n_tools = n_tools};
    return chat_render_conv(family, template_text, &conv, add_generation_prompt, bos_text, eos_text, out, err, errlen);
}

int chat_render_conv(int family, const char *template_text, const lm_chat_conv *conv, bool add_generation_prompt,
                     const char *bos_text, const char *eos_text, char **out, char *err, size_t errlen) {
    if (!out) return lm_err(err, errlen, "chat: no output pointer");
    if (!conv) return lm_err(err, errlen, "chat: no conversation");
    const lm_chat_xmsg *msgs = conv->msgs;
    const char *const *tools = conv->tools;
    int n = conv->n, n_tools = conv->n_tools;
    *out = NULL;
    int fam = family >= 0 ? family : chat_detect(template_text);
    if (family >= CHAT_N_FAMILIES || fam < 0) /* the plain renderers' messages for a bad family or text */
        return family >= 0 ? chat_render(family, NULL, 0, false, NULL, NULL, out, err, errlen)
                           : chat_render_template(template_text, NULL, 0, false, NULL, NULL, out, err, errlen);
    if (check_xmsgs(msgs, n, tools, n_tools, err, errlen)) return -1;
    const char *bos = bos_text ? bos_text : "", *eos = eos_text ? eos_text : "";
    if (!needs_tools(msgs, n, n_tools) && fam != CHAT_GPT_OSS)
        return render_plain(family, template_text, msgs, n, add_generation_prompt, bos, eos, out, err, errlen);
    int syntax = chat_tool_syntax(fam);
    if (syntax == CHAT_TOOLS_HERMES) {
        lm_chat_msg *pm = NULL;
        strbuf *tx = NULL;
        int np = 0;
        int rc = hermes_rewrite(fam, template_text, msgs, n, tools, n_tools, &pm, &np, &tx, err, errlen);
        if (rc == 0)
            rc = family >= 0
                ? chat_render(family, pm, np, add_generation_prompt, bos, eos, out, err, errlen)
                : chat_render_template(template_text, pm, np, add_generation_prompt, bos, eos, out, err, errlen);
        for (int k = 0; tx && k <= n; k++) strbuf_free(&tx[k]);
        lm_free(tx);
        lm_free(pm);
        return rc;
    }
    strbuf b = {0};
    int rc = syntax == CHAT_TOOLS_HARMONY
        ? chat_render_harmony(msgs, n, tools, n_tools, conv, add_generation_prompt, &b, err, errlen)
        : syntax == CHAT_TOOLS_LLAMA3 ? render_llama3_tools(msgs, n, tools, n_tools, add_generation_prompt, bos, &b)
        : syntax == CHAT_TOOLS_XML
        ? chat_render_qwen35(msgs, n, tools, n_tools, add_generation_prompt, &b, err, errlen)
        : render_mistral_tools(msgs, n, tools, n_tools, fam == CHAT_MISTRAL_V3_TEKKEN, bos, eos, &b, err, errlen);
    if (rc == 0 && !b.failed && !b.p) { /* nothing written */
        b.p = lm_calloc(1, 1);
        b.failed = !b.p;
    }
    if (rc == 0 && b.failed) rc = lm_err(err, errlen, "chat: out of memory rendering %d messages", n);
    if (rc) {
        strbuf_free(&b);
        return -1;
    }
    *out = b.p;
    return 0;
}
