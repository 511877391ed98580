/*
 * server_tools.c - structured outputs and tool calls, both ways.
 *
 * Requests (called by server_parse.c, pure like it): response_format
 * ({"type": "text" | "json_object" | "json_schema"}), the extension fields
 * grammar (GBNF text) and json_schema (a schema object), and tools /
 * tool_choice / parallel_tool_calls, turned into one GBNF text on the
 * request (lm_server_request.grammar) that decoding must follow, checked by
 * compiling it so that a bad grammar or schema is a 400 naming the problem.
 *
 * The tool-call grammar. Each tool's parameters schema is compiled to GBNF
 * (json_schema_to_gbnf) and its rules renamed with a prefix of the tool's
 * index ("t3-"); the calls around them are the family's syntax
 * (chat_tool_syntax):
 *   hermes   <tool_call> {"name": "N", "arguments": ARGS} </tool_call>
 *   llama3   {"name": "N", "parameters": ARGS}
 *   mistral  [TOOL_CALLS] [{"name": "N", "arguments": ARGS}, ...]  ([TOOL_CALLS]
 *            may be left out: a control token of Mistral's vocabulary, it
 *            leaves no text, and the array then opens the calls)
 *   xml      <tool_call> <function=N> <parameter=K>\nV\n</parameter> ...
 *            </function> </tool_call>, a parameter per property of the
 *            tool's schema (server_tools_xml.c, which also reads such a
 *            call back into JSON arguments)
 *   harmony  (gpt-oss) <|channel|>commentary to=functions.N
 *            <|constrain|>json<|message|>ARGS, one call, lazy after the
 *            analysis (harmony_grammar); the calls are read back by the
 *            channel reader (text/reasoning.h), not here, and "auto" leaves
 *            them free
 * with at most four blanks between tokens (none inside the opening {"name",
 * which the reader and the llama3 trigger look for), the name one of the tools (or the
 * one tool_choice names) and ARGS that tool's schema; several calls when
 * parallel_tool_calls (the default), except with a named function, which
 * is called once (what naming it asks for; a small model otherwise tends to
 * repeat the call). tool_choice "required" or a named function constrains
 * the answer from its first token; "auto" makes the
 * grammar lazy, starting at the syntax's opener ("<tool_call>" for hermes
 * and xml, {"name",
 * "[TOOL_CALLS]" or [{"name"), so free text stays free; "none" leaves the tools in the
 * prompt and out of the constraint.
 *
 * Answers (called by server_gen.c): srv_tc reads a choice's text as it comes
 * and splits it into content (the text before the first opener, trailing
 * blanks dropped) and calls: for each call its name once complete, then its
 * arguments (the exact JSON text the model wrote; in the xml syntax the JSON
 * its parameters make, a parameter at a time) in pieces. The text around
 * the calls is held back only while it could still be the start of an
 * opener, so streaming and whole answers give the same bytes. It parses
 * incrementally by re-reading the current call from its start on every feed
 * (calls are short); the grammar makes well-formed calls certain, and text
 * that is not one ends the reading without an error.
 *
 * Repeats. The grammar cannot forbid a call the answer already made (no
 * context-free grammar compares a call with an earlier one), and a small
 * model, free to go on after a call, tends to write it again. A call with
 * the same name and the same arguments as one kept before it in the answer
 * (compared with the blanks between JSON tokens left out) is that
 * repetition, never a second intended call, and is dropped: a call whose
 * name a kept call has is held back, nothing of it out, while its arguments
 * so far could still be that call's; it goes out (name, then its arguments
 * so far) once they differ, and is dropped when it ends equal or the text
 * ends while it could still be the repeat. The calls kept have consecutive
 * indices, whole or streamed. Only blanks are normalized, so calls that
 * differ in anything else (even key order, which the schema's grammar
 * fixes) are all kept. Memory: the kept calls' names and arguments, the
 * size of the answer's calls.
 */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "serve/server_int.h"
#include "decode/grammar.h"
#include "decode/json_schema.h"
#include "base/util.h"

#define INVALID "invalid_request_error"
#define BAD(param, ...) server_error(e, 400, INVALID, (param), NULL, __VA_ARGS__)

/* ------------------------------------------------------------- grammars */

/* The grammar compiles; else a 400 about param with the compiler's message. */
static int check_grammar(const char *text, const char *param, const char *what, lm_server_error *e) {
    char err[LM_ERRLEN] = "";
    lm_grammar *g = grammar_parse(text, strlen(text), NULL, err, sizeof err);
    if (!g) return BAD(param, "%s is not a valid grammar: %.240s", what, err);
    grammar_free(g);
    return 0;
}

/* A schema (JSON text) to GBNF; NULL with a 400 about param. */
static char *schema_gbnf(const char *json, const char *param, const char *what, lm_server_error *e) {
    char err[LM_ERRLEN] = "";
    char *g = json_schema_to_gbnf(json, strlen(json), err, sizeof err);
    if (!g) BAD(param, "%s is not a JSON Schema lamina can follow: %.240s", what, err);
    return g;
}

char *srv_schema_gbnf(const cJSON *schema, const char *param, const char *what, lm_server_error *e) {
    char *json = cJSON_PrintUnformatted(schema);
    if (!json) {
        srv_oom(e);
        return NULL;
    }
    char *g = schema_gbnf(json, param, what, e);
    cJSON_free(json);
    return g;
}

static void take(lm_server_request *r, char *gbnf) {
    lm_free(r->grammar);
    r->grammar = gbnf;
}

int srv_parse_format(const cJSON *root, lm_server_request *r, lm_server_error *e) {
    const cJSON *rf = srv_field(root, "response_format"), *gr = srv_field(root, "grammar"),
                *js = srv_field(root, "json_schema");
    int given = 0;
    if (rf) {
        const cJSON *t = cJSON_IsObject(rf) ? srv_field(rf, "type") : NULL;
        if (!cJSON_IsString(t))
            return BAD("response_format", "'response_format' must be an object with a string 'type'");
        const char *ty = t->valuestring;
        if (!strcmp(ty, "json_object")) {
            char *g = json_schema_any_object_gbnf();
            if (!g) return srv_oom(e);
            take(r, g);
            given++;
        } else if (!strcmp(ty, "json_schema")) {
            const cJSON *o = srv_field(rf, "json_schema");
            if (!cJSON_IsObject(o))
                return BAD("response_format",
                           "'response_format.json_schema' must be an object {\"name\", "
                           "\"schema\", \"strict\"}");
            const cJSON *name = srv_field(o, "name"), *schema = srv_field(o, "schema"),
                        *strict = srv_field(o, "strict");
            if (name && !cJSON_IsString(name))
                return BAD("response_format", "'response_format.json_schema.name' must be a string");
            if (strict && !cJSON_IsBool(strict))
                return BAD("response_format", "'response_format.json_schema.strict' must be a boolean");
            if (schema && !cJSON_IsObject(schema) && !cJSON_IsBool(schema))
                return BAD("response_format", "'response_format.json_schema.schema' must be an object");
            char *g = schema ? srv_schema_gbnf(schema, "response_format", "'response_format.json_schema.schema'", e)
                             : json_schema_any_object_gbnf();
            if (!g) return schema ? -1 : srv_oom(e);
            take(r, g);
            given++;
        } else if (strcmp(ty, "text") != 0) {
            return BAD("response_format",
                       "'response_format.type' must be 'text', 'json_object' or 'json_schema' "
                       "(got '%.40s')",
                       ty);
        }
    }
    if (gr) {
        if (!cJSON_IsString(gr) || !gr->valuestring[0])
            return BAD("grammar", "'grammar' must be a non-empty string of GBNF");
        if (given++) return BAD("grammar", "give only one of 'response_format' (JSON), 'grammar' and 'json_schema'");
        char *g = lm_strndup(gr->valuestring, strlen(gr->valuestring));
        if (!g) return srv_oom(e);
        take(r, g);
        r->grammar_raw = true;
    }
    if (js) {
        if (!cJSON_IsObject(js) && !cJSON_IsBool(js)) return BAD("json_schema", "'json_schema' must be an object");
        if (given++)
            return BAD("json_schema", "give only one of 'response_format' (JSON), 'grammar' and 'json_schema'");
        char *g = srv_schema_gbnf(js, "json_schema", "'json_schema'", e);
        if (!g) return -1;
        take(r, g);
    }
    if (r->grammar &&
        check_grammar(r->grammar,
                      gr       ? "grammar"
                          : js ? "json_schema"
                               : "response_format",
                      gr ? "'grammar'" : "the schema's grammar", e))
        return -1;
    return 0;
}

/* A thinking family's answer grammar: the output is free until the
 * reasoning ends (the lazy trigger </think>, or harmony's final channel
 * header <|channel|>final<|message|>), then the grammar holds from it:
 * root ::= "</think>" blanks ans-root (harmony: the header, then ans-root),
 * the request's rules prefixed "ans-". Left as it is when the prompt closed
 * the reasoning (thinking off: the answer starts at once), when the grammar
 * is already lazy (tools with tool_choice auto: their opener is the
 * trigger), and for harmony's tool calls (lazy already: harmony_grammar).
 * 0, or -1 with *e. */
int srv_reason_grammar(lm_server_request *r, bool closed, lm_server_error *e) {
    if (!r->grammar || closed || r->n_grammar_triggers || r->reason_syntax == REASON_NONE) return 0;
    static const char FINAL[] = "<|channel|>final<|message|>";
    bool think = r->reason_syntax == REASON_THINK;
    char *pre = srv_prefix_rules(r->grammar, "ans-");
    if (!pre) return srv_oom(e);
    strbuf b = {0};
    strbuf_puts(&b,
                think ? "root ::= \"</think>\" [ \\t\\r\\n]* ans-root\n"
                      : "root ::= \"<|channel|>final<|message|>\" ans-root\n");
    strbuf_puts(&b, pre);
    lm_free(pre);
    char *t = think ? lm_strndup("</think>", 8) : lm_strndup(FINAL, sizeof FINAL - 1);
    if (b.failed || !b.p || !t) {
        strbuf_free(&b);
        lm_free(t);
        return srv_oom(e);
    }
    lm_free(r->grammar);
    r->grammar = b.p;
    r->grammar_triggers[0] = t;
    r->n_grammar_triggers = 1;
    return 0;
}

/* GBNF text with every rule name prefixed (literals, classes, repetition
 * counts and comments untouched); NULL when out of memory. */
char *srv_prefix_rules(const char *g, const char *prefix) {
    strbuf b = {0};
    for (const char *s = g; *s;) {
        char c = *s;
        const char *p = s;
        if (c == '#') {
            while (*s && *s != '\n') s++;
        } else if (c == '"' || c == '[') {
            char end = c == '"' ? '"' : ']';
            s++;
            while (*s && *s != end) s += s[0] == '\\' && s[1] ? 2 : 1;
            if (*s) s++;
        } else if (c == '{') {
            while (*s && *s != '}') s++;
            if (*s) s++;
        } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-') {
            while ((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
                   *s == '-')
                s++;
            strbuf_puts(&b, prefix);
        } else {
            s++;
        }
        strbuf_put(&b, p, (size_t)(s - p));
    }
    if (b.failed || !b.p) {
        strbuf_free(&b);
        return NULL;
    }
    return b.p;
}

/* What opens calls in free text (the lazy grammar's triggers; NULL-ended).
 * Mistral's [TOOL_CALLS] is a control token in its own vocabulary, and
 * control tokens leave no text: its call array, [{"name", opens them too. */
static const char *const *openers(int syntax) {
    static const char *const hermes[] = {"<tool_call>", NULL}, *const llama3[] = {"{\"name\"", NULL},
                             *const mistral[] = {"[TOOL_CALLS]", "[{\"name\"", NULL};
    return syntax == CHAT_TOOLS_LLAMA3 ? llama3 : syntax == CHAT_TOOLS_MISTRAL ? mistral : hermes;
}

static int args_rules(const srv_tool_ref *tools, int n, strbuf *b, lm_server_error *e);

/* The GBNF of calls to the given tools in a syntax; the xml syntax's text
 * parameters into *raw. */
static char *tool_grammar(const srv_tool_ref *tools, int n, int syntax, bool parallel, strbuf *raw,
                          lm_server_error *e) {
    strbuf b = {0};
    if (syntax == CHAT_TOOLS_XML) {
        strbuf_printf(&b, "root ::= tc-call %s\n", parallel ? "(tc-ws tc-call)*" : "");
        strbuf_puts(&b, "tc-ws ::= [ \\t\\n]{0,4}\n");
        if (srv_xml_rules(tools, n, &b, raw, e)) {
            strbuf_free(&b);
            return NULL;
        }
        if (b.failed || raw->failed) {
            strbuf_free(&b);
            srv_oom(e);
            return NULL;
        }
        return b.p;
    }
    const char *args_key = syntax == CHAT_TOOLS_LLAMA3 ? "parameters" : "arguments";
    if (syntax == CHAT_TOOLS_MISTRAL)
        strbuf_printf(&b, "root ::= (\"[TOOL_CALLS]\" tc-ws)? \"[\" tc-obj %s tc-ws \"]\"\n",
                      parallel ? "(tc-ws \",\" tc-ws tc-obj)*" : "");
    else strbuf_printf(&b, "root ::= tc-call %s\n", parallel ? "(tc-ws tc-call)*" : "");
    if (syntax == CHAT_TOOLS_HERMES)
        strbuf_puts(&b, "tc-call ::= \"<tool_call>\" tc-ws tc-obj tc-ws \"</tool_call>\"\n");
    else if (syntax == CHAT_TOOLS_LLAMA3) strbuf_puts(&b, "tc-call ::= tc-obj\n");
    /* {"name" as one piece: the opener the reader (and the llama3 trigger) looks for */
    strbuf_puts(&b, "tc-obj ::= \"{\\\"name\\\"\" tc-ws \":\" tc-ws tc-fn tc-ws \"}\"\n");
    strbuf_puts(&b, "tc-ws ::= [ \\t\\n]{0,4}\n");
    strbuf_puts(&b, "tc-fn ::= ");
    for (int i = 0; i < n; i++)
        strbuf_printf(&b, "%s\"\\\"%s\\\"\" tc-ws \",\" tc-ws \"\\\"%s\\\"\" tc-ws \":\" tc-ws t%d-root\n",
                      i ? "  | " : "", tools[i].name, args_key, i);
    if (args_rules(tools, n, &b, e)) {
        strbuf_free(&b);
        return NULL;
    }
    if (b.failed) {
        strbuf_free(&b);
        srv_oom(e);
        return NULL;
    }
    return b.p;
}

/* The tools' arguments: each tool's schema as rules prefixed t<i>- (its
 * root t<i>-root) appended to b. 0, or -1 with *e. */
static int args_rules(const srv_tool_ref *tools, int n, strbuf *b, lm_server_error *e) {
    for (int i = 0; i < n; i++) {
        char param[48], prefix[16];
        snprintf(param, sizeof param, "'tools[%d].function.parameters'", i);
        snprintf(prefix, sizeof prefix, "t%d-", i);
        char *g = tools[i].params ? srv_schema_gbnf(tools[i].params, "tools", param, e) : json_schema_any_object_gbnf();
        if (!g) return tools[i].params ? -1 : srv_oom(e);
        char *pg = srv_prefix_rules(g, prefix);
        lm_free(g);
        if (!pg) return srv_oom(e);
        strbuf_puts(b, pg);
        strbuf_puts(b, "\n");
        lm_free(pg);
    }
    return 0;
}

/* gpt-oss's call (harmony), lazy: free until the analysis message ends
 * (<|end|>, then the next message's <|start|>assistant) or a commentary
 * header begins (<|channel|>commentary, when the model writes no
 * analysis), then one message
 *   <|channel|>commentary to=functions.N <|constrain|>json<|message|>ARGS
 * whose end, <|call|>, ends the generation (a control token that leaves no
 * text: the grammar ends with ARGS). One call, as harmony makes one a
 * message. 0, or -1 with *e. */
static int harmony_grammar(const srv_tool_ref *tools, int n, lm_server_request *r, lm_server_error *e) {
    static const char *const trig[2] = {"<|end|>", "<|channel|>commentary"};
    strbuf b = {0};
    strbuf_puts(&b, "root ::= \"<|end|><|start|>assistant\" tc-call | tc-call\n");
    strbuf_puts(&b, "tc-call ::= \"<|channel|>commentary to=functions.\" tc-fn\n");
    strbuf_puts(&b, "tc-hdr ::= \" <|constrain|>json<|message|>\"\n");
    strbuf_puts(&b, "tc-fn ::= ");
    for (int i = 0; i < n; i++) strbuf_printf(&b, "%s\"%s\" tc-hdr t%d-root\n", i ? "  | " : "", tools[i].name, i);
    if (args_rules(tools, n, &b, e)) {
        strbuf_free(&b);
        return -1;
    }
    if (b.failed) {
        strbuf_free(&b);
        return srv_oom(e);
    }
    r->grammar = b.p;
    if (check_grammar(b.p, "tools", "the tools' grammar", e)) return -1;
    for (int k = 0; k < 2; k++) {
        if (!(r->grammar_triggers[k] = lm_strndup(trig[k], strlen(trig[k])))) return srv_oom(e);
        r->n_grammar_triggers = k + 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- tools */

/* OpenAI's function names: 1 to 64 of a-z A-Z 0-9 _ -. */
static bool valid_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 64) return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
              *s == '-'))
            return false;
    return true;
}

void srv_tools_free(srv_tools *t) {
    for (int i = 0; i < t->n; i++) cJSON_free(t->json[i]);
    memset(t, 0, sizeof *t);
}

int srv_parse_tools(const cJSON *root, int family, lm_server_request *r, srv_tools *t, lm_server_error *e) {
    memset(t, 0, sizeof *t);
    const cJSON *tools = srv_field(root, "tools"), *choice = srv_field(root, "tool_choice");
    const cJSON *par = srv_field(root, "parallel_tool_calls");
    if (srv_field(root, "functions") || srv_field(root, "function_call"))
        return BAD(srv_field(root, "functions") ? "functions" : "function_call",
                   "'functions' and 'function_call' are deprecated and not supported; use 'tools' and 'tool_choice'");
    if (par && !cJSON_IsBool(par)) return BAD("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    bool parallel = !par || cJSON_IsTrue(par);
    if (tools && !cJSON_IsArray(tools)) return BAD("tools", "'tools' must be an array of tools");
    int n = tools ? cJSON_GetArraySize(tools) : 0;
    if (n > SERVER_MAX_TOOLS) return BAD("tools", "'tools' may hold at most %d tools", SERVER_MAX_TOOLS);
    srv_tool_ref refs[SERVER_MAX_TOOLS];
    int i = 0;
    for (const cJSON *tl = tools ? tools->child : NULL; tl; tl = tl->next, i++) {
        const cJSON *type = cJSON_IsObject(tl) ? srv_field(tl, "type") : NULL;
        const cJSON *fn = cJSON_IsObject(tl) ? srv_field(tl, "function") : NULL;
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0 || !cJSON_IsObject(fn))
            return BAD("tools", "'tools[%d]' must be {\"type\": \"function\", \"function\": {...}}", i);
        const cJSON *name = srv_field(fn, "name"), *desc = srv_field(fn, "description"),
                    *params = srv_field(fn, "parameters");
        if (!cJSON_IsString(name) || !valid_name(name->valuestring))
            return BAD("tools", "'tools[%d].function.name' must be 1 to 64 characters of a-z, A-Z, 0-9, _ and -", i);
        if (desc && !cJSON_IsString(desc)) return BAD("tools", "'tools[%d].function.description' must be a string", i);
        if (params && !cJSON_IsObject(params))
            return BAD("tools", "'tools[%d].function.parameters' must be a JSON Schema object", i);
        for (int k = 0; k < i; k++)
            if (!strcmp(refs[k].name, name->valuestring))
                return BAD("tools", "'tools' names the function '%s' twice", name->valuestring);
        refs[i] = (srv_tool_ref){name->valuestring, params};
        if (!(t->json[i] = cJSON_PrintUnformatted(tl))) return srv_oom(e);
        t->n = i + 1;
    }
    /* tool_choice: none, auto, required, or {"type": "function", "function": {"name"}} */
    enum { NONE, AUTO, REQUIRED } mode = n ? AUTO : NONE;
    int named = -1;
    if (choice) {
        if (cJSON_IsString(choice)) {
            const char *s = choice->valuestring;
            mode = !strcmp(s, "none") ? NONE : !strcmp(s, "auto") ? AUTO : !strcmp(s, "required") ? REQUIRED : 3;
            if ((int)mode == 3)
                return BAD("tool_choice",
                           "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": "
                           "\"function\", \"function\": {\"name\": ...}} (got '%.40s')",
                           s);
        } else {
            const cJSON *type = cJSON_IsObject(choice) ? srv_field(choice, "type") : NULL;
            const cJSON *fn = cJSON_IsObject(choice) ? srv_field(choice, "function") : NULL;
            const cJSON *name = cJSON_IsObject(fn) ? srv_field(fn, "name") : NULL;
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0 || !cJSON_IsString(name))
                return BAD("tool_choice",
                           "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": "
                           "\"function\", \"function\": {\"name\": ...}}");
            for (int k = 0; k < n; k++)
                if (!strcmp(refs[k].name, name->valuestring)) named = k;
            if (named < 0 && n)
                return BAD("tool_choice", "'tool_choice' names the function '%.64s', which is not in 'tools'",
                           name->valuestring);
            mode = REQUIRED;
        }
        if (mode != NONE && n == 0) return BAD("tool_choice", "'tool_choice' is only allowed when 'tools' are given");
    }
    if (mode == NONE) return 0;
    /* a raw "grammar" with tool_choice auto holds the whole output (what a
     * client forces, reasoning included), and calls are read from it */
    bool raw_auto = r->grammar_raw && mode == AUTO;
    if (r->grammar && !raw_auto)
        return BAD("tools",
                   "tool calls cannot be combined with 'response_format' (JSON), 'grammar' or "
                   "'json_schema'; set 'tool_choice' to 'none' to use those");
    int syntax = chat_tool_syntax(family);
    /* gpt-oss's calls come in its commentary channel, which the harmony
     * reader splits from the answer: "auto" leaves them free, "required"
     * or a named function constrains the one call after the analysis */
    if (syntax == CHAT_TOOLS_HARMONY)
        return mode == AUTO || raw_auto ? 0
                                        : harmony_grammar(named >= 0 ? &refs[named] : refs, named >= 0 ? 1 : n, r, e);
    strbuf raw = {0};
    char *g = named >= 0 ? tool_grammar(&refs[named], 1, syntax, false, &raw, e)
                         : tool_grammar(refs, n, syntax, parallel, &raw, e);
    if (!g) {
        strbuf_free(&raw);
        return -1;
    }
    r->tool_strings = raw.p; /* the xml syntax's; NULL for the others */
    r->tool_calls = true;
    r->tool_syntax = syntax;
    if (raw_auto) {
        lm_free(g);
        return 0;
    }
    r->grammar = g;
    if (check_grammar(g, "tools", "the tools' grammar", e)) return -1;
    for (int k = 0; mode == AUTO && k < 2 && openers(syntax)[k]; k++) {
        const char *op = openers(syntax)[k];
        if (!(r->grammar_triggers[k] = lm_strndup(op, strlen(op)))) return srv_oom(e);
        r->n_grammar_triggers = k + 1;
    }
    r->tool_calls = true;
    r->tool_syntax = syntax;
    return 0;
}

/* -------------------------------------------------------------- answers */

enum { TC_TEXT, TC_CALLS, TC_END };

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static size_t skip_ws(const char *s, size_t n, size_t p) {
    while (p < n && is_ws(s[p])) p++;
    return p;
}

/* A string starting at s[*p] == '"'. */
static int skip_string(const char *s, size_t n, size_t *p) {
    for (size_t i = *p + 1; i < n; i++) {
        if (s[i] == '\\') {
            i++;
            continue;
        }
        if (s[i] == '"') {
            *p = i + 1;
            return J_DONE;
        }
    }
    return J_MORE;
}

/* Any JSON value at s[*p]: J_DONE with *p past it, J_MORE when the text ends
 * inside it, J_BAD when nothing there can start a value. */
static int skip_value(const char *s, size_t n, size_t *p, bool final) {
    size_t i = *p;
    if (i >= n) return J_MORE;
    char c = s[i];
    if (c == '"') return skip_string(s, n, p);
    if (c == '{' || c == '[') {
        int depth = 0;
        while (i < n) {
            char d = s[i];
            if (d == '"') {
                if (skip_string(s, n, &i) == J_MORE) return J_MORE;
                continue;
            }
            if (d == '{' || d == '[') depth++;
            if ((d == '}' || d == ']') && --depth == 0) {
                *p = i + 1;
                return J_DONE;
            }
            i++;
        }
        return J_MORE;
    }
    if (c == ',' || c == '}' || c == ']' || c == ':' || is_ws(c)) return J_BAD;
    while (i < n && s[i] != ',' && s[i] != '}' && s[i] != ']' && !is_ws(s[i])) i++;
    if (i == n && !final) return J_MORE;
    *p = i;
    return J_DONE;
}

typedef struct {
    int status;
    size_t end; /* with J_DONE: past the object */
    bool has_name, has_args;
    size_t name_s, name_e; /* the name's string, quotes included */
    size_t args_s, args_e; /* the arguments' text so far */
} call_scan;

/* One call object {"name": ..., "arguments": ...} from s[p], as far as it goes. */
static void scan_call(const char *s, size_t n, size_t p, const char *args_key, bool final, call_scan *r) {
    memset(r, 0, sizeof *r);
    r->status = J_MORE;
    p = skip_ws(s, n, p);
    if (p >= n) return;
    if (s[p] != '{') {
        r->status = J_BAD;
        return;
    }
    for (p++;;) {
        p = skip_ws(s, n, p);
        if (p >= n) return;
        if (s[p] == '}') break;
        if (s[p] != '"') {
            r->status = J_BAD;
            return;
        }
        size_t ks = p;
        if (skip_string(s, n, &p) == J_MORE) return;
        size_t klen = p - ks - 2;
        bool is_name = klen == 4 && !memcmp(s + ks + 1, "name", 4);
        bool is_args = klen == strlen(args_key) && !memcmp(s + ks + 1, args_key, klen);
        p = skip_ws(s, n, p);
        if (p >= n) return;
        if (s[p] != ':') {
            r->status = J_BAD;
            return;
        }
        p = skip_ws(s, n, p + 1);
        size_t vs = p;
        if (is_args) r->has_args = true, r->args_s = r->args_e = vs < n ? vs : n;
        int st = skip_value(s, n, &p, final);
        if (st == J_BAD || (is_name && st == J_DONE && s[vs] != '"')) {
            r->status = J_BAD;
            return;
        }
        if (st == J_MORE) {
            if (is_args) r->args_e = n;
            return;
        }
        if (is_name) r->has_name = true, r->name_s = vs, r->name_e = p;
        if (is_args) r->args_e = p;
        p = skip_ws(s, n, p);
        if (p >= n) return;
        if (s[p] == ',') {
            p++;
            continue;
        }
        if (s[p] != '}') {
            r->status = J_BAD;
            return;
        }
        break;
    }
    r->status = J_DONE;
    r->end = p + 1;
}

static void out_event(srv_tc_out *o, int index, const char *name, size_t name_len, const char *args, size_t args_len) {
    if (o->n == o->cap) {
        int cap = o->cap ? o->cap * 2 : 8;
        srv_tc_ev *ev = lm_realloc(o->ev, (size_t)cap * sizeof *ev);
        if (!ev) {
            o->failed = true;
            return;
        }
        o->ev = ev, o->cap = cap;
    }
    srv_tc_ev *v = &o->ev[o->n];
    *v = (srv_tc_ev){index, NULL, NULL, args_len};
    if (name && !(v->name = lm_strndup(name, name_len))) o->failed = true;
    if (!(v->args = lm_strndup(args ? args : "", args ? args_len : 0))) o->failed = true;
    if (o->failed) {
        lm_free(v->name);
        lm_free(v->args);
        return;
    }
    o->n++;
}

void srv_tc_out_free(srv_tc_out *o) {
    for (int i = 0; i < o->n; i++) {
        lm_free(o->ev[i].name);
        lm_free(o->ev[i].args);
    }
    lm_free(o->ev);
    strbuf_free(&o->content);
    memset(o, 0, sizeof *o);
}

/* Whether c, next in a JSON text, is a blank between tokens; *str and *esc
 * follow strings (inside one; after its backslash). */
static bool json_blank(char c, bool *str, bool *esc) {
    if (*str) {
        if (*esc) *esc = false;
        else if (c == '\\') *esc = true;
        else if (c == '"') *str = false;
        return false;
    }
    if (c == '"') *str = true;
    return is_ws(c);
}

/* Whether JSON text a[0..an), its blanks between tokens left out, is m[0..mn)
 * (whole) or a start of it (else). */
static bool same_json(const char *a, size_t an, const char *m, size_t mn, bool whole) {
    bool str = false, esc = false;
    size_t j = 0;
    for (size_t i = 0; i < an; i++) {
        if (json_blank(a[i], &str, &esc)) continue;
        if (j == mn || m[j] != a[i]) return false;
        j++;
    }
    return !whole || j == mn;
}

/* Whether a kept call has the name name[0..nl) and, unless args is NULL,
 * arguments that same_json finds args[0..an) to be (whole) or start with. */
static bool kept_match(const srv_tc *t, const char *name, size_t nl, const char *args, size_t an, bool whole) {
    for (int k = 0; k < t->n_kept; k++) {
        const srv_tc_kept *c = &t->kept_at[k];
        const char *p = t->kept.p ? t->kept.p + c->at : ""; /* NULL while all kept were empty */
        if (c->name_len == nl && !memcmp(p, name, nl) && (!args || same_json(args, an, p + nl, c->args_len, whole)))
            return true;
    }
    return false;
}

/* What a scan found of the current call, whatever its syntax: its name and
 * its arguments' text so far (pointers valid until the next feed). */
typedef struct {
    int status;
    bool has_name, has_args;
    const char *name, *args;
    size_t name_len, args_len;
} call_view;

static call_view view_json(const char *s, const call_scan *r) {
    call_view v = {r->status, r->has_name, r->has_args, NULL, NULL, 0, 0};
    if (r->has_name) v.name = s + r->name_s + 1, v.name_len = r->name_e - r->name_s - 2;
    if (r->has_args) v.args = s + r->args_s, v.args_len = r->args_e - r->args_s;
    return v;
}

static call_view view_xml(const char *s, const srv_xml_call *r) {
    call_view v = {r->status, r->has_name, r->has_args, NULL, NULL, 0, 0};
    if (r->has_name) v.name = s + r->name_s, v.name_len = r->name_e - r->name_s;
    if (r->has_args) v.args = r->args.p ? r->args.p : "", v.args_len = r->args.len;
    return v;
}

/* The current call's name and arguments (blanks left out) among the kept. */
static void keep_call(srv_tc *t, const call_view *r, srv_tc_out *o) {
    if (t->n_kept == t->kept_cap) {
        int cap = t->kept_cap ? t->kept_cap * 2 : 8;
        srv_tc_kept *k = lm_realloc(t->kept_at, (size_t)cap * sizeof *k);
        if (!k) {
            o->failed = true;
            return;
        }
        t->kept_at = k, t->kept_cap = cap;
    }
    const char *a = r->has_args ? r->args : "{}";
    size_t at = t->kept.len, nl = r->name_len, an = r->has_args ? r->args_len : 2;
    strbuf_put(&t->kept, r->name, nl);
    bool str = false, esc = false;
    size_t from = 0;
    for (size_t i = 0; i <= an; i++) /* the runs between blanks */
        if (i == an || json_blank(a[i], &str, &esc)) {
            strbuf_put(&t->kept, a + from, i - from);
            from = i + 1;
        }
    if (t->kept.failed) {
        o->failed = true;
        return;
    }
    t->kept_at[t->n_kept++] = (srv_tc_kept){at, nl, t->kept.len - at - nl};
}

/* What the current call's scan lets out: its name once, then new argument
 * bytes; nothing while the call may still repeat a kept one (the same name,
 * and arguments the kept one's, or their start, while the call is open). */
static void emit_scan(srv_tc *t, const call_view *r, srv_tc_out *o) {
    if (!t->cur_named && r->has_name) {
        if (!t->cur_held) t->cur_held = kept_match(t, r->name, r->name_len, NULL, 0, false);
        bool whole = r->status == J_DONE;
        if (t->cur_held && r->has_args) t->cur_held = kept_match(t, r->name, r->name_len, r->args, r->args_len, whole);
        else if (t->cur_held && whole) t->cur_held = kept_match(t, r->name, r->name_len, "{}", 2, true);
        if (t->cur_held) return;
        out_event(o, t->n_calls, r->name, r->name_len, NULL, 0);
        t->cur_named = true;
    }
    if (t->cur_named && r->has_args && r->args_len > t->args_sent) {
        out_event(o, t->n_calls, NULL, 0, r->args + t->args_sent, r->args_len - t->args_sent);
        t->args_sent = r->args_len;
    }
}

/* The current call ends: kept when out; a held one is a repeat (or, cut
 * short, the start of one) and is dropped. */
static void end_call(srv_tc *t, const call_view *r, srv_tc_out *o) {
    if (t->cur_named) {
        if (!r->has_args) out_event(o, t->n_calls, NULL, 0, "{}", 2);
        keep_call(t, r, o);
        t->n_calls++;
    }
    t->cur_named = t->cur_held = false;
    t->args_sent = 0;
    t->in_call = false;
}

/* A fixed text at s[p]: J_DONE (*p moves past it), J_MORE (a prefix of it
 * ends the text), J_BAD. */
static int expect(const char *s, size_t n, size_t *p, const char *lit) {
    size_t m = strlen(lit), have = n - *p < m ? n - *p : m;
    if (memcmp(s + *p, lit, have) != 0) return J_BAD;
    if (have < m) return J_MORE;
    *p += m;
    return J_DONE;
}

/* The calls' part of the text, as far as it goes; phase TC_END when it is over. */
static void calls_step(srv_tc *t, bool final, srv_tc_out *o) {
    const char *args_key = t->syntax == CHAT_TOOLS_LLAMA3 ? "parameters" : "arguments";
    for (;;) {
        const char *s = t->buf.p;
        size_t n = t->buf.len, p = skip_ws(s, n, t->pos);
        if (!t->in_call) {
            if (p >= n) return;
            int st = J_DONE;
            if (t->syntax == CHAT_TOOLS_HERMES || t->syntax == CHAT_TOOLS_XML) {
                st = expect(s, n, &p, "<tool_call>");
            } else if (t->syntax == CHAT_TOOLS_MISTRAL) {
                if (!t->in_array) {
                    /* [TOOL_CALLS] (absent when it was a control token), then the array */
                    st = s[p] == '[' && (n - p < 2 || s[p + 1] != 'T') ? J_DONE : expect(s, n, &p, "[TOOL_CALLS]");
                    if (st == J_DONE) {
                        p = skip_ws(s, n, p);
                        st = p >= n ? J_MORE : s[p] == '[' ? (p++, J_DONE) : J_BAD;
                        if (st == J_DONE) t->in_array = true;
                    }
                } else if (s[p] == ',' && t->n_calls > 0) {
                    p = skip_ws(s, n, p + 1);
                    st = p >= n ? J_MORE : J_DONE;
                } else if (s[p] == ']') {
                    st = J_BAD;
                }
            }
            if (st == J_MORE && !final) return;
            if (st != J_DONE) {
                t->phase = TC_END;
                return;
            }
            t->pos = p;
            t->in_call = true;
        }
        call_scan r;
        srv_xml_call x = {0};
        call_view v;
        if (t->syntax == CHAT_TOOLS_XML) { /* the call's close is part of its scan */
            srv_xml_scan(s, n, t->pos, t->raw, &x);
            v = view_xml(s, &x);
            p = x.end;
        } else {
            scan_call(s, n, t->pos, args_key, final, &r);
            v = view_json(s, &r);
            p = r.end;
        }
        emit_scan(t, &v, o);
        int st = v.status;
        if (st == J_DONE && t->syntax == CHAT_TOOLS_HERMES) {
            p = skip_ws(s, n, p);
            st = expect(s, n, &p, "</tool_call>");
            if (st == J_BAD) st = -1; /* the call is whole, what follows is not its close */
        }
        if (st == J_MORE && !final) {
            srv_xml_scan_free(&x);
            return;
        }
        if (st != J_DONE) {
            if (st != J_MORE || v.status == J_DONE) end_call(t, &v, o);
            srv_xml_scan_free(&x);
            t->phase = TC_END;
            return;
        }
        end_call(t, &v, o);
        srv_xml_scan_free(&x);
        t->pos = p;
    }
}

/* The longest suffix of s[0..n) that is a proper prefix of op. */
static size_t partial_opener(const char *s, size_t n, const char *op) {
    size_t m = strlen(op);
    for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, op, k)) return k;
    return 0;
}

void srv_tc_init(srv_tc *t, int syntax, const char *raw) {
    memset(t, 0, sizeof *t);
    t->syntax = syntax;
    t->raw = raw;
}

void srv_tc_free(srv_tc *t) {
    strbuf_free(&t->buf);
    strbuf_free(&t->kept);
    lm_free(t->kept_at);
}

void srv_tc_feed(srv_tc *t, const char *s, size_t n, bool final, srv_tc_out *o) {
    if (t->phase == TC_END) return;
    strbuf_put(&t->buf, s, n);
    if (t->buf.failed) {
        o->failed = true;
        return;
    }
    if (t->phase == TC_TEXT) {
        const char *const *ops = openers(t->syntax);
        const char *b = t->buf.p ? t->buf.p : "";
        size_t len = t->buf.len, hold = 0;
        const char *hit = NULL;
        for (int k = 0; ops[k]; k++) {
            const char *h = len ? memmem(b, len, ops[k], strlen(ops[k])) : NULL;
            if (h && (!hit || h < hit)) hit = h;
            size_t part = partial_opener(b, len, ops[k]);
            if (part > hold) hold = part;
        }
        size_t rel;
        if (hit) {
            rel = (size_t)(hit - b);
            size_t keep = rel;
            while (keep > 0 && is_ws(b[keep - 1])) keep--; /* blanks before a call are not content */
            strbuf_put(&o->content, b, keep);
        } else {
            rel = len - hold;
            while (rel > 0 && is_ws(b[rel - 1])) rel--;
            if (final) rel = len;
            strbuf_put(&o->content, b, rel);
        }
        if (len > rel) memmove(t->buf.p, t->buf.p + rel, len - rel); /* buf.p is NULL while nothing came */
        t->buf.len = len - rel;
        if (t->buf.p) t->buf.p[t->buf.len] = '\0';
        if (!hit) return;
        t->phase = TC_CALLS;
        t->pos = 0;
    }
    calls_step(t, final, o);
    if (t->phase == TC_END) t->buf.len = 0;
}

void srv_tc_call_id(const char *seed, int choice, int index, int syntax, char *out, size_t cap) {
    static const char ALNUM[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    uint64_t h = 1469598103934665603ull;
    for (const char *p = seed; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h ^= (uint64_t)choice * 0x9e3779b97f4a7c15ull + (uint64_t)index * 0xbf58476d1ce4e5b9ull;
    size_t len = syntax == CHAT_TOOLS_MISTRAL ? 9 : 24, w = 0;
    if (syntax != CHAT_TOOLS_MISTRAL) w = (size_t)snprintf(out, cap, "call_");
    for (size_t i = 0; i < len && w + 1 < cap; i++) {
        h += 0x9e3779b97f4a7c15ull;
        uint64_t z = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        out[w++] = ALNUM[z % (sizeof ALNUM - 1)];
    }
    out[w < cap ? w : cap - 1] = '\0';
}
