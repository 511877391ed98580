/*
 * chat_harmony.c - gpt-oss's chat format (OpenAI's "harmony"), rendered as
 * its template does (llama.cpp's models/templates/openai-gpt-oss-120b.jinja,
 * the chat_template of openai/gpt-oss-20b and -120b), byte for byte as
 * jinja2 renders it with transformers' settings (tests/test_chat.c against
 * tests/data/chat/golden/gpt-oss-120b.txt and tools_golden_gpt-oss-120b.txt).
 *
 * What the template writes, in order:
 *   1. its own system message: <|start|>system<|message|> the model
 *      identity (the caller's, or the template's), "Knowledge cutoff: 2024-06", "Current date: YYYY-MM-DD"
 *      (strftime_now: the caller's date, or today's in local time),
 *      "Reasoning: EFFORT" (default medium), the valid channels, and with
 *      tools the line that sends calls to the commentary channel; <|end|>;
 *   2. a developer message when the conversation opens with a system
 *      message or has tools: "# Instructions\n\n" TEXT "\n\n", then
 *      "# Tools\n\n## functions\n\nnamespace functions {" with one
 *      "// DESCRIPTION\ntype NAME = (_: {...}) => any;" per tool, each
 *      parameter's JSON Schema written as a TypeScript-like type
 *      (render_typescript_type: string, number, boolean, string enums as
 *      "a" | "b", arrays as T[], objects as {k?: T}, type lists and oneOf
 *      joined by |, nullable as | null, anything else any), with the
 *      parameter's description and default in // comments;
 *   3. per message: a user turn; an assistant answer in the final channel,
 *      its reasoning dropped; an assistant message with tool calls as its
 *      first call only, <|start|>assistant to=functions.NAME<|channel|>
 *      commentary json<|message|>ARGS<|call|>, after an analysis turn
 *      holding its content or reasoning unless a later assistant message
 *      answers without calls; a tool result as <|start|>functions.NAME
 *      to=assistant<|channel|>commentary<|message|>"RESULT"<|end|>, the
 *      result as a JSON string and NAME the last call's; a later system
 *      message is dropped, as the template drops it;
 *   4. the generation prompt <|start|>assistant.
 * The last assistant message of a render without the generation prompt
 * ends with <|return|> (the training form) and keeps its reasoning in an
 * analysis turn before it.
 *
 * The template raises, and so does this renderer, on an assistant message
 * whose content or reasoning holds channel tags, on tool calls with both
 * content and reasoning, and on a tool result with no call before it (or
 * after an answer). One difference: a tool without a description, on which
 * jinja2 raises ("// " + undefined), is written with an empty one, "// \n",
 * as llama.cpp's template engine writes it.
 *
 * Bounds: schemas nested deeper than SCHEMA_MAX_DEPTH render as any; tools
 * are parsed with cJSON, whose numbers are doubles (a default of 1.0 is
 * written 1, where Python writes 1.0).
 */
#include "text/chat.h"
#include "text/chat_int.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/util.h"

#define SCHEMA_MAX_DEPTH 32 /* nested schemas deeper than this render as "any" */

static const char IDENTITY[] = "You are ChatGPT, a large language model trained by OpenAI.";
static const char CHANNEL_MARKERS_ERR[] =
    "chat (gpt-oss): message %d passes <|channel|> tags in its %s; pass the analysis text as the reasoning and the "
    "final text as the content";

/* ------------------------------------------------- Jinja values of JSON */

/* x[key] of a JSON object, NULL when x is no object or has no such member
 * (Jinja's undefined). */
static const cJSON *get(const cJSON *x, const char *key) {
    return cJSON_IsObject(x) ? cJSON_GetObjectItemCaseSensitive(x, key) : NULL;
}

/* Python's truth of a JSON value: false for undefined, null, false, 0, "",
 * [] and {}. */
static bool truthy(const cJSON *x) {
    if (!x || cJSON_IsNull(x) || cJSON_IsFalse(x)) return false;
    if (cJSON_IsNumber(x)) return x->valuedouble != 0;
    if (cJSON_IsString(x)) return x->valuestring[0] != '\0';
    if (cJSON_IsArray(x) || cJSON_IsObject(x)) return x->child != NULL;
    return true;
}

static bool is_str(const cJSON *x, const char *s) { return cJSON_IsString(x) && !strcmp(x->valuestring, s); }

/* Python's str() of a JSON scalar: strings as they are, True/False/None,
 * numbers as integers where they are whole (below 2^53), else %.17g. */
static void put_pyval(strbuf *b, const cJSON *x) {
    char num[40];
    if (cJSON_IsString(x)) strbuf_puts(b, x->valuestring);
    else if (cJSON_IsTrue(x)) strbuf_puts(b, "True");
    else if (cJSON_IsFalse(x)) strbuf_puts(b, "False");
    else if (!x || cJSON_IsNull(x)) strbuf_puts(b, "None");
    else if (cJSON_IsNumber(x)) {
        double v = x->valuedouble;
        if (v == floor(v) && fabs(v) < 9007199254740992.0) snprintf(num, sizeof num, "%.0f", v);
        else snprintf(num, sizeof num, "%.17g", v);
        strbuf_puts(b, num);
    } else {
        char *j = cJSON_PrintUnformatted(x);
        if (j) chat_json_dump(j, strlen(j), -1, b);
        else b->failed = true;
        cJSON_free(j);
    }
}

/* x|tojson: json.dumps(x, ensure_ascii=False). */
static void put_tojson(strbuf *b, const cJSON *x) {
    char *j = cJSON_PrintUnformatted(x);
    if (!j) {
        b->failed = true;
        return;
    }
    size_t mark = b->len;
    if (chat_json_dump(j, strlen(j), -1, b) && !b->failed) {
        b->len = mark;
        strbuf_puts(b, j);
    }
    cJSON_free(j);
}

/* name in (list or []) */
static bool in_list(const cJSON *list, const char *name) {
    const cJSON *e;
    if (!cJSON_IsArray(list)) return false;
    cJSON_ArrayForEach(e, list) if (is_str(e, name)) return true;
    return false;
}

/* ------------------------------------------- render_typescript_type */

static void ts_type(strbuf *b, const cJSON *spec, int depth);

/* The array branch: T[] for items of a simple type, the inner type + []
 * unless it is "object | object" or longer than 50 bytes (then any[]). */
static void ts_array(strbuf *b, const cJSON *spec, int depth) {
    const cJSON *items = get(spec, "items");
    if (!truthy(items)) {
        strbuf_puts(b, "any[]");
    } else {
        const cJSON *it = get(items, "type");
        if (is_str(it, "string")) strbuf_puts(b, "string[]");
        else if (is_str(it, "number") || is_str(it, "integer")) strbuf_puts(b, "number[]");
        else if (is_str(it, "boolean")) strbuf_puts(b, "boolean[]");
        else {
            strbuf inner = {0};
            ts_type(&inner, items, depth + 1);
            const char *t = inner.p ? inner.p : "";
            if (inner.failed) b->failed = true;
            else if (!strcmp(t, "object | object") || inner.len > 50) strbuf_puts(b, "any[]");
            else {
                strbuf_put(b, t, inner.len);
                strbuf_puts(b, "[]");
            }
            strbuf_free(&inner);
        }
    }
    if (truthy(get(spec, "nullable"))) strbuf_puts(b, " | null");
}

/* The oneOf branch. The template's check for object variants sets a
 * variable inside its loop, which Jinja scopes to the loop: every variant
 * is written, with the template's whitespace between them. */
static void ts_one_of(strbuf *b, const cJSON *one_of, int depth) {
    const cJSON *v;
    cJSON_ArrayForEach(v, one_of) {
        ts_type(b, v, depth + 1);
        const cJSON *desc = get(v, "description");
        if (truthy(desc)) {
            strbuf_puts(b, "// ");
            put_pyval(b, desc);
        }
        const cJSON *def = get(v, "default");
        if (def) {
            strbuf_puts(b, "                    // default: ");
            put_tojson(b, def);
        }
        if (v->next) strbuf_puts(b, " | \n");
    }
}

/* {name?: \n                TYPE, ...} of an object's properties. */
static void ts_object(strbuf *b, const cJSON *spec, int depth) {
    const cJSON *props = get(spec, "properties"), *req = get(spec, "required"), *p;
    if (!truthy(props) || !cJSON_IsObject(props)) {
        strbuf_puts(b, "object");
        return;
    }
    strbuf_puts(b, "{\n");
    cJSON_ArrayForEach(p, props) {
        strbuf_puts(b, p->string);
        if (!in_list(req, p->string)) strbuf_puts(b, "?");
        strbuf_puts(b, ": \n                ");
        ts_type(b, p, depth + 1);
        if (p->next) strbuf_puts(b, ", ");
    }
    strbuf_puts(b, "}");
}

/* render_typescript_type(spec): the TypeScript-like type of a JSON Schema. */
static void ts_type(strbuf *b, const cJSON *spec, int depth) {
    const cJSON *type = get(spec, "type"), *one_of = get(spec, "oneOf");
    if (depth > SCHEMA_MAX_DEPTH) {
        strbuf_puts(b, "any");
    } else if (is_str(type, "array")) {
        ts_array(b, spec, depth);
    } else if (cJSON_IsArray(type) && type->child) { /* ["string", "null"]: joined */
        for (const cJSON *t = type->child; t; t = t->next) {
            put_pyval(b, t);
            if (t->next) strbuf_puts(b, " | ");
        }
    } else if (truthy(one_of)) {
        ts_one_of(b, one_of, depth);
    } else if (is_str(type, "string")) {
        const cJSON *en = get(spec, "enum");
        if (truthy(en)) {
            strbuf_puts(b, "\"");
            for (const cJSON *e = cJSON_IsArray(en) || cJSON_IsObject(en) ? en->child : NULL; e; e = e->next) {
                put_pyval(b, cJSON_IsObject(en) ? NULL : e);
                if (e->next) strbuf_puts(b, "\" | \"");
            }
            strbuf_puts(b, "\"");
        } else {
            strbuf_puts(b, "string");
            if (truthy(get(spec, "nullable"))) strbuf_puts(b, " | null");
        }
    } else if (is_str(type, "number") || is_str(type, "integer")) {
        strbuf_puts(b, "number");
    } else if (is_str(type, "boolean")) {
        strbuf_puts(b, "boolean");
    } else if (is_str(type, "object")) {
        ts_object(b, spec, depth);
    } else {
        strbuf_puts(b, "any");
    }
}

/* ------------------------------------------------ render_tool_namespace */

/* One tool: // DESCRIPTION, then type NAME = (_: { params }) => any; */
static void put_tool(strbuf *b, const cJSON *tool) {
    const cJSON *fn = get(tool, "function");
    const cJSON *params = get(fn, "parameters"), *props = get(params, "properties"), *req = get(params, "required");
    strbuf_puts(b, "// ");
    if (get(fn, "description")) put_pyval(b, get(fn, "description"));
    strbuf_puts(b, "\ntype ");
    put_pyval(b, get(fn, "name"));
    strbuf_puts(b, " = ");
    if (!truthy(params) || !truthy(props) || !cJSON_IsObject(props)) {
        strbuf_puts(b, "() => any;\n\n");
        return;
    }
    strbuf_puts(b, "(_: {\n");
    const cJSON *p;
    cJSON_ArrayForEach(p, props) {
        const cJSON *desc = get(p, "description"), *def = get(p, "default");
        if (truthy(desc)) {
            strbuf_puts(b, "// ");
            put_pyval(b, desc);
            strbuf_puts(b, "\n");
        }
        strbuf_puts(b, p->string);
        if (!in_list(req, p->string)) strbuf_puts(b, "?");
        strbuf_puts(b, ": ");
        ts_type(b, p, 0);
        if (def) {
            if (truthy(get(p, "enum"))) {
                strbuf_puts(b, ", // default: ");
                put_pyval(b, def);
            } else if (truthy(get(p, "oneOf"))) {
                strbuf_puts(b, "// default: ");
                put_pyval(b, def);
            } else {
                strbuf_puts(b, ", // default: ");
                put_tojson(b, def);
            }
        }
        strbuf_puts(b, ",\n");
    }
    strbuf_puts(b, "}) => any;\n\n");
}

/* "# Tools\n\n## functions\n\nnamespace functions {\n\n" ... "} // namespace
 * functions". Tools are the request's JSON texts; -1 when one is not a
 * JSON object naming a function. */
static int put_tools(strbuf *b, const char *const *tools, int n_tools, char *err, size_t errlen) {
    strbuf_puts(b, "# Tools\n\n## functions\n\nnamespace functions {\n\n");
    for (int i = 0; i < n_tools; i++) {
        cJSON *t = cJSON_Parse(tools[i]);
        const cJSON *name = get(get(t, "function"), "name");
        if (!cJSON_IsString(name)) {
            cJSON_Delete(t);
            return lm_err(err, errlen, "chat (gpt-oss): tool %d is not a function with a name", i);
        }
        put_tool(b, t);
        cJSON_Delete(t);
    }
    strbuf_puts(b, "} // namespace functions");
    return 0;
}

bool chat_effort_valid(const char *e) { return e && (!strcmp(e, "low") || !strcmp(e, "medium") || !strcmp(e, "high")); }

/* ------------------------------------------------------------ messages */

/* "<|channel|>analysis<|message|>" in s or "<|channel|>final<|message|>" in s */
static bool has_channel_tags(const char *s) {
    return s && (strstr(s, "<|channel|>analysis<|message|>") || strstr(s, "<|channel|>final<|message|>"));
}

/* strftime_now("%Y-%m-%d"): today in local time, as Python's datetime.now(). */
static void today(char buf[16]) {
    time_t now = time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm) || !strftime(buf, 16, "%Y-%m-%d", &tm)) strcpy(buf, "1970-01-01");
}

/* build_system_message() inside <|start|>system<|message|> ... <|end|>. */
static void put_system(strbuf *b, const lm_chat_conv *o, bool tools) {
    char day[16];
    const char *date = o ? o->date : NULL, *effort = o ? o->reasoning_effort : NULL;
    if (!date) {
        today(day);
        date = day;
    }
    strbuf_puts(b, "<|start|>system<|message|>");
    strbuf_puts(b, o && o->model_identity ? o->model_identity : IDENTITY);
    strbuf_puts(b, "\nKnowledge cutoff: 2024-06\nCurrent date: ");
    strbuf_puts(b, date);
    strbuf_puts(b, "\n\nReasoning: ");
    strbuf_puts(b, effort ? effort : "medium");
    strbuf_puts(b, "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.");
    if (tools) strbuf_puts(b, "\nCalls to these tools must go to the commentary channel: 'functions'.");
    strbuf_puts(b, "<|end|>");
}

static void put_turn(strbuf *b, const char *head, const char *text, const char *end) {
    strbuf_puts(b, head);
    strbuf_puts(b, text);
    strbuf_puts(b, end);
}

static bool is_role(const lm_chat_xmsg *m, const char *r) { return !strcmp(m->role, r); }

/* An assistant message with tool calls: its analysis text (the content or
 * the reasoning, not both) unless a later assistant message answers, then
 * the first call. */
static int put_call_turn(const lm_chat_xmsg *m, int i, int n, strbuf *b, char *err, size_t errlen) {
    bool later_final = false; /* future_final_message */
    for (int k = i + 1; k < n; k++) later_final |= is_role(&m[k], "assistant") && m[k].n_calls == 0;
    const char *content = m[i].content, *thinking = m[i].reasoning;
    if (content[0] && thinking && thinking[0])
        return lm_err(err, errlen,
                      "chat (gpt-oss): message %d has tool calls with both content and reasoning; the template takes "
                      "one or the other",
                      i);
    const char *analysis = content[0] ? content : thinking && thinking[0] ? thinking : NULL;
    if (analysis && !later_final) put_turn(b, "<|start|>assistant<|channel|>analysis<|message|>", analysis, "<|end|>");
    strbuf_puts(b, "<|start|>assistant to=functions.");
    strbuf_puts(b, m[i].calls[0].name);
    strbuf_puts(b, "<|channel|>commentary json<|message|>");
    chat_put_args(b, m[i].calls[0].arguments);
    strbuf_puts(b, "<|call|>");
    return 0;
}

int chat_render_harmony(const lm_chat_xmsg *m, int n, const char *const *tools, int n_tools, const lm_chat_conv *opts,
                        bool gen, strbuf *b, char *err, size_t errlen) {
    /* the template checks each assistant message as its turn comes; no
     * output is kept on an error, so checking first is the same */
    for (int i = 0; i < n; i++)
        if (is_role(&m[i], "assistant")) {
            if (has_channel_tags(m[i].content)) return lm_err(err, errlen, CHANNEL_MARKERS_ERR, i, "content");
            if (has_channel_tags(m[i].reasoning)) return lm_err(err, errlen, CHANNEL_MARKERS_ERR, i, "reasoning");
        }
    put_system(b, opts, n_tools > 0);
    /* developer_message = messages[0].content when it is a system message */
    int first = is_role(&m[0], "system");
    const char *dev = first ? m[0].content : "";
    if (dev[0] || n_tools > 0) {
        strbuf_puts(b, "<|start|>developer<|message|>");
        if (dev[0]) put_turn(b, "# Instructions\n\n", dev, "\n\n");
        if (n_tools > 0 && put_tools(b, tools, n_tools, err, errlen)) return -1;
        strbuf_puts(b, "<|end|>");
    }
    const char *last_call = NULL; /* last_tool_call.name */
    for (int i = first; i < n; i++) {
        if (is_role(&m[i], "user")) {
            put_turn(b, "<|start|>user<|message|>", m[i].content, "<|end|>");
        } else if (is_role(&m[i], "assistant") && m[i].n_calls > 0) {
            if (put_call_turn(m, i, n, b, err, errlen)) return -1;
            last_call = m[i].calls[0].name;
        } else if (is_role(&m[i], "assistant") && i == n - 1 && !gen) {
            /* the training form: the reasoning kept, <|return|> at the end */
            if (m[i].reasoning)
                put_turn(b, "<|start|>assistant<|channel|>analysis<|message|>", m[i].reasoning, "<|end|>");
            put_turn(b, "<|start|>assistant<|channel|>final<|message|>", m[i].content, "<|return|>");
        } else if (is_role(&m[i], "assistant")) {
            put_turn(b, "<|start|>assistant<|channel|>final<|message|>", m[i].content, "<|end|>");
            last_call = NULL;
        } else if (is_role(&m[i], "tool")) {
            if (!last_call)
                return lm_err(err, errlen,
                              "chat (gpt-oss): message %d has the tool role, but no earlier assistant message made a "
                              "tool call",
                              i);
            put_turn(b, "<|start|>functions.", last_call, " to=assistant<|channel|>commentary<|message|>");
            chat_put_pystr(b, m[i].content);
            strbuf_puts(b, "<|end|>");
        }
        /* a system message after the first: dropped, as the template drops it */
    }
    if (gen) strbuf_puts(b, "<|start|>assistant");
    return 0;
}
