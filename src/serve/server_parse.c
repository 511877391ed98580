/*
 * server_parse.c - request bodies of the OpenAI routes to engine parameters.
 *
 * A pure function of its inputs (body bytes, tokenizer, limits): it touches
 * no socket and no engine, so tests and the fuzzer call it directly. The
 * order of checks is fixed so that every body maps to exactly one answer:
 * bytes (UTF-8, raw control characters) -> JSON syntax -> top-level object
 * -> model -> each parameter's type and range -> response_format, grammar,
 * json_schema -> tools and tool_choice (chat) -> prompt or messages ->
 * tokenization -> the context and max_tokens limits.
 *
 * Conventions, as OpenAI's API: a JSON null counts as an absent field;
 * unknown fields are ignored; integers may be written as integral floats
 * (2.0); an error names the parameter it is about. Defaults follow OpenAI
 * (n 1, no penalties), except sampling and max_tokens, which take the
 * server's defaults (lm_server_parse_ctx.sampling: temperature 0.8, top_k 40,
 * top_p 0.95, min_p 0.05 unless the server is started with others, as
 * `lamina run` samples; max_tokens_default: 1024 for chat, 16 for
 * completions; chat's within the rest of the context), with lamina's other
 * extensions off unless given (repetition_penalty, priority, ignore_eos; speculative and
 * draft_max: speculative decoding on a server started with a proposer is on
 * unless "speculative": false or "draft_max": 0, and draft_max N caps the
 * tokens proposed per step).
 *
 * Memory: cJSON allocates through lm_malloc/lm_free (hooks installed once);
 * everything in lm_server_request is lm_malloc'ed and freed by
 * server_request_free, which also accepts a partly filled request, so every
 * failure path is `goto fail`.
 */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sched/engine.h"
#include "text/chat.h"
#include "text/reasoning.h"
#include "serve/server.h"
#include "serve/server_int.h"
#include "base/sha256.h"
#include "base/utf8.h"
#include "base/util.h"

static const char *INVALID = "invalid_request_error";

/* A 400 invalid_request_error about one parameter. */
#define BAD(param, ...) server_error(e, 400, INVALID, (param), NULL, __VA_ARGS__)

/* ------------------------------------------------------------ JSON memory */

static void *hook_malloc(size_t n) { return lm_malloc(n); }
static void hook_free(void *p) { lm_free(p); }
static pthread_once_t hooks_once = PTHREAD_ONCE_INIT;
static void install_hooks(void) {
    cJSON_Hooks h = {hook_malloc, hook_free};
    cJSON_InitHooks(&h);
}

/* cJSON's allocator is process-wide: set it once, before any JSON is made
 * (server_new calls this too, so answers built before the first parse use
 * the same allocator as everything else). */
void srv_json_init(void) { pthread_once(&hooks_once, install_hooks); }

/* ------------------------------------------------------ typed field access */

/* A number in [lo, hi] when present; 1 if set, 0 if absent, -1 on error. */
static int get_num(const cJSON *obj, const char *name, double lo, double hi, double *out, lm_server_error *e) {
    const cJSON *v = srv_field(obj, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v)) return BAD(name, "'%s' must be a number", name);
    double x = v->valuedouble;
    if (!(x >= lo && x <= hi)) return BAD(name, "'%s' must be between %g and %g, got %g", name, lo, hi, x);
    *out = x;
    return 1;
}

/* An integer (an integral number) in [lo, hi]; returns as get_num. */
static int get_int(const cJSON *obj, const char *name, long long lo, long long hi, long long *out, lm_server_error *e) {
    const cJSON *v = srv_field(obj, name);
    if (!v) return 0;
    double x = v->valuedouble;
    if (!cJSON_IsNumber(v) || !isfinite(x) || floor(x) != x) return BAD(name, "'%s' must be an integer", name);
    if (x < (double)lo || x > (double)hi)
        return BAD(name, "'%s' must be between %lld and %lld, got %.17g", name, lo, hi, x);
    *out = (long long)x;
    return 1;
}

static int get_bool(const cJSON *obj, const char *name, bool *out, lm_server_error *e) {
    const cJSON *v = srv_field(obj, name);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return BAD(name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 1;
}

/* -------------------------------------------------------------- sampling */

/* Sampling and output options common to both routes. */
static int parse_sampling(const lm_server_parse_ctx *c, const cJSON *root, bool chat, lm_server_request *r,
                          lm_server_error *e) {
    lm_sample_params *sp = &r->p.sp;
    sample_params_default(sp);
    if (c->sampling) {
        sp->temp = c->sampling->temp, sp->top_p = c->sampling->top_p;
        sp->top_k = c->sampling->top_k, sp->min_p = c->sampling->min_p;
    }
    sp->repeat_penalty = 1, sp->repeat_last_n = 64, sp->freq_penalty = 0, sp->presence_penalty = 0;
    double x;
    long long k;
    int rc;
    if ((rc = get_num(root, "temperature", 0, 2, &x, e)) < 0) return -1;
    if (rc) sp->temp = (float)x;
    if ((rc = get_num(root, "top_p", 0, 1, &x, e)) < 0) return -1;
    if (rc) sp->top_p = (float)x;
    if ((rc = get_num(root, "presence_penalty", -2, 2, &x, e)) < 0) return -1;
    if (rc) sp->presence_penalty = (float)x;
    if ((rc = get_num(root, "frequency_penalty", -2, 2, &x, e)) < 0) return -1;
    if (rc) sp->freq_penalty = (float)x;
    if ((rc = get_num(root, "repetition_penalty", 0, 10, &x, e)) < 0) return -1;
    if (rc && x <= 0) return BAD("repetition_penalty", "'repetition_penalty' must be greater than 0");
    if (rc) sp->repeat_penalty = (float)x;
    /* OpenAI's penalties count every generated token, not a window */
    if (sp->presence_penalty != 0 || sp->freq_penalty != 0 || sp->repeat_penalty != 1) sp->repeat_last_n = -1;
    if ((rc = get_int(root, "top_k", -1, INT_MAX, &k, e)) < 0) return -1;
    if (rc) sp->top_k = k < 0 ? 0 : (int)k;
    if ((rc = get_num(root, "min_p", 0, 1, &x, e)) < 0) return -1;
    if (rc) sp->min_p = (float)x;
    /* seeds are int64 in OpenAI's API; 2^63 itself does not fit */
    if ((rc = get_int(root, "seed", -9223372036854775807LL, 9223372036854774784LL, &k, e)) < 0) return -1;
    if (rc) sp->seed = (uint64_t)k, r->seed_given = true;
    if ((rc = get_int(root, "priority", INT_MIN, INT_MAX, &k, e)) < 0) return -1;
    if (rc) r->p.priority = (int)k;
    if (get_bool(root, "ignore_eos", &r->p.ignore_eos, e) < 0) return -1;
    bool spec = true;
    if (get_bool(root, "speculative", &spec, e) < 0) return -1;
    if ((rc = get_int(root, "draft_max", 0, 64, &k, e)) < 0) return -1;
    r->p.spec_k = !spec || (rc && k == 0) ? -1 : rc ? (int)k : 0;

    /* logprobs: an integer 0..5 for completions, a boolean + top_logprobs for chat */
    if (!chat) {
        if ((rc = get_int(root, "logprobs", 0, 5, &k, e)) < 0) return -1;
        if (rc) r->p.logprobs = true, r->p.top_logprobs = (int)k;
    } else {
        if (get_bool(root, "logprobs", &r->p.logprobs, e) < 0) return -1;
        if ((rc = get_int(root, "top_logprobs", 0, LM_MAX_TOP_LOGPROBS, &k, e)) < 0) return -1;
        if (rc && !r->p.logprobs) return BAD("top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
        if (rc) r->p.top_logprobs = (int)k;
    }
    return 0;
}

/* stop: a string or an array of strings; empty strings are dropped. */
static int parse_stop(const cJSON *root, lm_server_request *r, lm_server_error *e) {
    const cJSON *v = srv_field(root, "stop");
    if (!v) return 0;
    const cJSON *one = v;
    int count = 1;
    if (cJSON_IsArray(v)) {
        count = cJSON_GetArraySize(v);
        if (count > SERVER_MAX_STOP) return BAD("stop", "'stop' may hold at most %d strings", SERVER_MAX_STOP);
        one = v->child;
    } else if (!cJSON_IsString(v)) {
        return BAD("stop", "'stop' must be a string or an array of strings");
    }
    for (int i = 0; i < count; i++, one = one->next) {
        if (!cJSON_IsString(one)) return BAD("stop", "'stop' must be a string or an array of strings");
        size_t n = strlen(one->valuestring);
        if (n > SERVER_MAX_STOP_LEN) return BAD("stop", "a stop string may be at most %d bytes", SERVER_MAX_STOP_LEN);
        if (n == 0) continue;
        if (!(r->stops[r->p.n_stop] = lm_strndup(one->valuestring, n))) return srv_oom(e);
        r->p.n_stop++;
    }
    return 0;
}

/* logit_bias: {"token id": bias in [-100, 100]}; -100 bans the token. */
static int parse_bias(const cJSON *root, int32_t n_vocab, lm_server_request *r, lm_server_error *e) {
    const cJSON *v = srv_field(root, "logit_bias");
    if (!v) return 0;
    if (!cJSON_IsObject(v)) return BAD("logit_bias", "'logit_bias' must be an object of token ids to numbers");
    int count = cJSON_GetArraySize(v);
    if (count > SERVER_MAX_BIAS) return BAD("logit_bias", "'logit_bias' may hold at most %d entries", SERVER_MAX_BIAS);
    if (count == 0) return 0;
    int32_t *ids = lm_malloc((size_t)count * sizeof(int32_t));
    float *vals = lm_malloc((size_t)count * sizeof(float));
    r->p.bias_ids = ids, r->p.bias_vals = vals; /* owned: server_request_free */
    if (!ids || !vals) return srv_oom(e);
    for (const cJSON *b = v->child; b; b = b->next) {
        const char *key = b->string ? b->string : "";
        char *end;
        long id = strtol(key, &end, 10);
        bool digits = key[0] >= '0' && key[0] <= '9';
        if (!digits || *end || strlen(key) > 9 || id < 0 || id >= n_vocab)
            return BAD("logit_bias", "'logit_bias' key '%.40s' is not a token id in [0, %d)", key, (int)n_vocab);
        if (!cJSON_IsNumber(b) || !(b->valuedouble >= -100 && b->valuedouble <= 100))
            return BAD("logit_bias", "'logit_bias' values must be numbers between -100 and 100");
        ids[r->p.n_bias] = (int32_t)id;
        vals[r->p.n_bias] = b->valuedouble <= -100 ? -INFINITY : (float)b->valuedouble;
        r->p.n_bias++;
    }
    return 0;
}

/* ---------------------------------------------------------------- prompts */

/* Append a prompt (token array, ownership taken) to the request. */
static int add_prompt(lm_server_request *r, int32_t *ids, int n, char *echo, lm_server_error *e) {
    int i = r->n_prompts;
    r->prompts[i] = ids;
    r->n_prompt[i] = n;
    r->echo_text[i] = echo;
    r->n_prompts++;
    return 0;
}

/* Tokenize text (len bytes) into a fresh array; returns the count or -1. */
static int encode(const lm_tokenizer *tok, const char *text, size_t len, bool add_bos, int32_t **out,
                  lm_server_error *e) {
    int32_t small[256];
    int n = tok_encode(tok, text, len, add_bos, true, small, 256);
    if (n < 0) return server_error(e, 400, INVALID, NULL, NULL, "the text could not be tokenized");
    *out = lm_malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    if (!*out) return srv_oom(e);
    if (n <= 256) memcpy(*out, small, (size_t)n * sizeof(int32_t));
    else if (tok_encode(tok, text, len, add_bos, true, *out, n) != n)
        return server_error(e, 500, "server_error", NULL, NULL, "tokenization is not deterministic");
    return n;
}

/* The text a token prompt stands for (echo). */
static char *detokenize(const lm_tokenizer *tok, const int32_t *ids, int n) {
    int cap = detok_max_out(tok);
    size_t size = (size_t)n * (size_t)cap + 8, len = 0;
    char *s = lm_malloc(size);
    if (!s) return NULL;
    lm_detok d;
    detok_init(&d, tok, true, false);
    for (int i = 0; i < n; i++) {
        int w = detok_push(&d, ids[i], s + len, cap);
        if (w > 0) len += (size_t)w;
    }
    int w = detok_flush(&d, s + len, 8);
    if (w > 0) len += (size_t)w;
    s[len] = 0;
    return s;
}

/* One array of token ids (param names the field for messages). */
static int token_array(const cJSON *a, int32_t n_vocab, const char *param, int32_t **out, lm_server_error *e) {
    int n = cJSON_GetArraySize(a);
    if (n == 0) return BAD(param, "'%s' is empty", param);
    *out = lm_malloc((size_t)n * sizeof(int32_t));
    if (!*out) return srv_oom(e);
    int i = 0;
    for (const cJSON *t = a->child; t; t = t->next, i++) {
        double x = t->valuedouble;
        if (!cJSON_IsNumber(t) || floor(x) != x || !(x >= 0 && x < n_vocab))
            return BAD(param, "'%s' token ids must be integers in [0, %d)", param, (int)n_vocab);
        (*out)[i] = (int32_t)x;
    }
    return n;
}

static bool all_of(const cJSON *a, int type) {
    for (const cJSON *t = a->child; t; t = t->next)
        if ((t->type & 0xff) != type) return false;
    return true;
}

/* prompt: a string, an array of strings, an array of ids, an array of arrays of ids. */
static int parse_prompt(const lm_server_parse_ctx *c, const cJSON *root, lm_server_request *r, lm_server_error *e) {
    const cJSON *p = srv_field(root, "prompt");
    if (!p) return BAD("prompt", "'prompt' is required");
    int32_t n_vocab = tok_n_vocab(c->tok);
    bool bos = tok_add_bos(c->tok);
    int count = 1;
    if (cJSON_IsArray(p)) {
        count = cJSON_GetArraySize(p);
        if (count == 0) return BAD("prompt", "'prompt' is empty");
        if (all_of(p, cJSON_Number)) count = 1;
        else if (!all_of(p, cJSON_String) && !all_of(p, cJSON_Array))
            return BAD("prompt",
                       "'prompt' must be a string, an array of strings, an array of token ids or an "
                       "array of arrays of token ids");
    } else if (!cJSON_IsString(p)) {
        return BAD("prompt",
                   "'prompt' must be a string, an array of strings, an array of token ids or an array "
                   "of arrays of token ids");
    }
    if (count > SERVER_MAX_PROMPTS) return BAD("prompt", "at most %d prompts per request", SERVER_MAX_PROMPTS);
    r->prompts = lm_calloc((size_t)count, sizeof(int32_t *));
    r->n_prompt = lm_calloc((size_t)count, sizeof(int));
    r->echo_text = lm_calloc((size_t)count, sizeof(char *));
    if (!r->prompts || !r->n_prompt || !r->echo_text) return srv_oom(e);
    /* one prompt (a string or one id array) or one per element */
    bool several = cJSON_IsArray(p) && !all_of(p, cJSON_Number);
    const cJSON *one = several ? p->child : p;
    for (int i = 0; i < count; i++, one = one->next) {
        int32_t *ids = NULL;
        int n;
        char *echo = NULL;
        if (cJSON_IsString(one)) {
            size_t len = strlen(one->valuestring);
            n = encode(c->tok, one->valuestring, len, bos, &ids, e);
            if (n >= 0 && r->echo && !(echo = lm_strndup(one->valuestring, len))) n = srv_oom(e);
        } else if (cJSON_IsArray(one) && (one == p || all_of(one, cJSON_Number))) {
            n = token_array(one, n_vocab, "prompt", &ids, e);
            if (n >= 0 && r->echo && !(echo = detokenize(c->tok, ids, n))) n = srv_oom(e);
        } else {
            n = BAD("prompt", "'prompt' arrays of arrays must hold token ids only");
        }
        if (n == 0) n = BAD("prompt", "'prompt' encodes to no tokens");
        if (n < 0) {
            lm_free(ids);
            lm_free(echo);
            return -1;
        }
        add_prompt(r, ids, n, echo, e);
    }
    return 0;
}

/* A message's content: a string, or an array of {"type": "text", "text"} parts
 * (joined with newlines). Returns an lm_malloc'ed string or NULL with *e set. */
static char *message_content(const cJSON *m, int i, lm_server_error *e) {
    char param[48];
    snprintf(param, sizeof param, "messages[%d].content", i);
    const cJSON *c = srv_field(m, "content");
    if (!c || cJSON_IsString(c)) {
        const char *t = c ? c->valuestring : "";
        char *s = lm_strndup(t, strlen(t));
        if (!s) srv_oom(e);
        return s;
    }
    if (!cJSON_IsArray(c)) {
        BAD(param, "'%s' must be a string or an array of text parts", param);
        return NULL;
    }
    size_t total = 1;
    for (const cJSON *p = c->child; p; p = p->next) {
        const cJSON *type = srv_field(p, "type"), *text = srv_field(p, "text");
        if (!cJSON_IsObject(p) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 ||
            !cJSON_IsString(text)) {
            BAD(param,
                "'%s' parts must be {\"type\": \"text\", \"text\": string} (other part types are not "
                "supported)",
                param);
            return NULL;
        }
        total += strlen(text->valuestring) + 1;
    }
    char *s = lm_malloc(total), *w = s;
    if (!s) {
        srv_oom(e);
        return NULL;
    }
    for (const cJSON *p = c->child; p; p = p->next) {
        const char *t = srv_field(p, "text")->valuestring;
        size_t n = strlen(t);
        if (w != s) *w++ = '\n';
        memcpy(w, t, n);
        w += n;
    }
    *w = 0;
    return s;
}

/* The family the chat stop marker comes from, or -1. */
static int chat_family_of(const lm_server_parse_ctx *c) {
    if (c->chat_family >= 0) return c->chat_family;
    return c->chat_template ? chat_detect(c->chat_template) : -1;
}

/* Render the conversation and tokenize it (chat.h's BOS rule). */
static int render_messages(const lm_server_parse_ctx *c, const lm_chat_xmsg *msgs, int n, const srv_tools *tools,
                           bool thinking_off, const char *effort, const char *identity, lm_server_request *r,
                           lm_server_error *e) {
    const lm_tokenizer *tok = c->tok;
    char *text = NULL, err[LM_ERRLEN];
    bool add_bos;
    lm_chat_conv conv = {.msgs = msgs,
                         .n = n,
                         .tools = (const char *const *)tools->json,
                         .n_tools = tools->n,
                         .thinking_off = thinking_off,
                         .reasoning_effort = effort,
                         .model_identity = identity};
    if (chat_prompt(c->chat_family, c->chat_template, tok, &conv, &text, &add_bos, err, sizeof err))
        return BAD("messages", "%s", err);
    /* a thinking family: where the prompt leaves the reasoning, and the
     * answer's grammar moved past it */
    r->reason_syntax = reason_syntax(chat_family_of(c));
    if (r->reason_syntax != REASON_NONE) {
        size_t len = strlen(text);
        r->reason_open = reason_prompt_open(text, len);
        if (!r->grammar_raw && srv_reason_grammar(r, reason_prompt_closed(text, len), e)) {
            lm_free(text);
            return -1;
        }
    }
    int32_t *ids = NULL;
    int nt = encode(tok, text, strlen(text), add_bos, &ids, e);
    lm_free(text);
    if (nt == 0) nt = BAD("messages", "the conversation encodes to no tokens");
    if (nt < 0) {
        lm_free(ids);
        return -1;
    }
    return add_prompt(r, ids, nt, NULL, e);
}

/* An assistant message's reasoning_content (or "reasoning", vLLM's newer
 * name), given back by a client, for a think family: written into the
 * content as <think>\nR\n</think>\n\nC, which the family's renderer splits
 * again as the template reads reasoning_content (kept after the last user
 * message, dropped before it; deepseek-r1 drops it always). A content that
 * already holds </think> is left as it is; other families ignore it here
 * (gpt-oss's template takes it as the message's "thinking", which
 * message_reasoning passes on). 0, or -1 with *e. */
static int with_reasoning(const lm_server_parse_ctx *c, const cJSON *m, char **content, lm_server_error *e) {
    const cJSON *rc = srv_field(m, "reasoning_content");
    if (!rc || cJSON_IsNull(rc)) rc = srv_field(m, "reasoning");
    if (!cJSON_IsString(rc)) return 0; /* none; a wrong type is message_reasoning's 400 */
    if (reason_syntax(chat_family_of(c)) != REASON_THINK || strstr(*content, "</think>")) return 0;
    const char *rs = rc->valuestring;
    size_t a = 0, b = strlen(rs), cl = 0;
    while (a < b && rs[a] == '\n') a++;
    while (b > a && rs[b - 1] == '\n') b--;
    while ((*content)[cl] == '\n') cl++;
    strbuf t = {0};
    strbuf_puts(&t, "<think>\n");
    strbuf_put(&t, rs + a, b - a);
    strbuf_puts(&t, "\n</think>\n\n");
    strbuf_puts(&t, *content + cl);
    if (t.failed || !t.p) {
        strbuf_free(&t);
        return srv_oom(e);
    }
    lm_free(*content);
    *content = t.p;
    return 0;
}

/* An assistant message's tool_calls: [{"id", "type": "function", "function":
 * {"name", "arguments": a JSON string}}, ...]; the strings point into m. */
static int message_calls(const cJSON *m, int i, lm_chat_xmsg *x, lm_server_error *e) {
    const cJSON *tc = srv_field(m, "tool_calls");
    char param[48];
    snprintf(param, sizeof param, "messages[%d].tool_calls", i);
    if (!tc) return 0;
    if (!cJSON_IsArray(tc)) return BAD(param, "'%s' must be an array", param);
    int k = cJSON_GetArraySize(tc);
    if (k == 0) return 0;
    if (k > SERVER_MAX_TOOLS) return BAD(param, "'%s' may hold at most %d calls", param, SERVER_MAX_TOOLS);
    lm_chat_call *calls = lm_calloc((size_t)k, sizeof *calls);
    if (!calls) return srv_oom(e);
    x->calls = calls;
    int j = 0;
    for (const cJSON *c = tc->child; c; c = c->next, j++) {
        const cJSON *id = srv_field(c, "id"), *type = srv_field(c, "type"), *fn = srv_field(c, "function");
        const cJSON *name = cJSON_IsObject(fn) ? srv_field(fn, "name") : NULL;
        const cJSON *args = cJSON_IsObject(fn) ? srv_field(fn, "arguments") : NULL;
        if (!cJSON_IsObject(c) || (id && !cJSON_IsString(id)) ||
            (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0)) || !cJSON_IsString(name) ||
            (args && !cJSON_IsString(args)))
            return BAD(param,
                       "'%s[%d]' must be {\"id\": string, \"type\": \"function\", \"function\": {\"name\": "
                       "string, \"arguments\": string}}",
                       param, j);
        calls[j] = (lm_chat_call){id ? id->valuestring : NULL, name->valuestring, args ? args->valuestring : "{}"};
    }
    x->n_calls = k;
    return 0;
}

/* An assistant message's reasoning, apart from its content: the first of
 * "reasoning_content" (what lamina and llama.cpp's server answer with),
 * "reasoning" and "thinking" (the gpt-oss template's own key) that is a
 * string; a JSON null is no reasoning. Points into m. Only templates with a
 * place for it (gpt-oss) write it. As llama.cpp's server does, the content
 * of a message with both reasoning and tool calls is left out: the
 * template takes one or the other, and the reasoning is the analysis. */
static int message_reasoning(const cJSON *m, int i, lm_chat_xmsg *x, lm_server_error *e) {
    static const char *const keys[] = {"reasoning_content", "reasoning", "thinking"};
    for (int k = 0; k < 3; k++) {
        const cJSON *v = srv_field(m, keys[k]);
        if (!v || cJSON_IsNull(v)) continue;
        if (!cJSON_IsString(v)) {
            char param[48];
            snprintf(param, sizeof param, "messages[%d].%s", i, keys[k]);
            return BAD(param, "'%s' must be a string", param);
        }
        x->reasoning = v->valuestring;
        if (x->n_calls > 0) x->content = "";
        return 0;
    }
    return 0;
}

/* reasoning_effort: OpenAI's top-level field, or chat_template_kwargs'
 * (which wins when both are given, as template variables are the
 * template's own); "low", "medium" or "high", null for the template's
 * default. Families without the input ignore it, as vLLM's and llama.cpp's
 * templates ignore variables they never read. */
static int parse_effort(const cJSON *root, const cJSON *kw, const char **effort, lm_server_error *e) {
    const cJSON *v[2] = {srv_field(root, "reasoning_effort"), kw ? srv_field(kw, "reasoning_effort") : NULL};
    const char *param[2] = {"reasoning_effort", "chat_template_kwargs"};
    *effort = NULL;
    for (int k = 0; k < 2; k++) {
        if (!v[k] || cJSON_IsNull(v[k])) continue;
        const char *s = cJSON_IsString(v[k]) ? v[k]->valuestring : NULL;
        if (!chat_effort_valid(s))
            return BAD(param[k], "'%s' must be \"low\", \"medium\" or \"high\"",
                       k ? "chat_template_kwargs.reasoning_effort" : "reasoning_effort");
        *effort = s; /* points into root, which outlives the render */
    }
    return 0;
}

/* messages: [{"role", "content"}, ...] -> one rendered, tokenized prompt;
 * tool results and the assistant's calls as the template writes them. */
static int parse_messages(const lm_server_parse_ctx *c, const cJSON *root, const srv_tools *tools, lm_server_request *r,
                          lm_server_error *e) {
    const cJSON *ms = srv_field(root, "messages");
    if (!ms) return BAD("messages", "'messages' is required");
    if (!cJSON_IsArray(ms)) return BAD("messages", "'messages' must be an array");
    int n = cJSON_GetArraySize(ms);
    if (n == 0) return BAD("messages", "'messages' must hold at least one message");
    if (c->chat_family < 0 && !c->chat_template)
        return server_error(e, 400, INVALID, "messages", "chat_template_unavailable", "%s",
                            c->chat_error ? c->chat_error : "this model has no usable chat template");
    /* chat_template_kwargs: {"enable_thinking": false} turns reasoning off
     * where the template has that switch (chat_thinking_off); reasoning_effort
     * (parse_effort) and model_identity (gpt-oss); other keys and other
     * families: ignored, as templates ignore variables they never read */
    const cJSON *kw = srv_field(root, "chat_template_kwargs"), *think = kw ? srv_field(kw, "enable_thinking") : NULL;
    if (kw && !cJSON_IsNull(kw) && !cJSON_IsObject(kw))
        return BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    if (think && !cJSON_IsBool(think) && !cJSON_IsNull(think))
        return BAD("chat_template_kwargs", "'chat_template_kwargs.enable_thinking' must be a boolean");
    bool thinking_off = think && cJSON_IsFalse(think);
    const char *effort;
    if (parse_effort(root, kw, &effort, e)) return -1;
    const cJSON *ident = kw ? srv_field(kw, "model_identity") : NULL; /* gpt-oss's first system line */
    if (ident && !cJSON_IsString(ident))
        return BAD("chat_template_kwargs", "'chat_template_kwargs.model_identity' must be a string");
    /* reasoning_format: separate (reasoning_content) or inline, and
     * llama-server's names for them (auto, deepseek; none) */
    const cJSON *rf = srv_field(root, "reasoning_format");
    bool inline_ = c->reasoning_inline;
    if (rf) {
        const char *v = cJSON_IsString(rf) ? rf->valuestring : "";
        if (!strcmp(v, "separate") || !strcmp(v, "auto") || !strcmp(v, "deepseek")) inline_ = false;
        else if (!strcmp(v, "inline") || !strcmp(v, "none")) inline_ = true;
        else return BAD("reasoning_format", "'reasoning_format' must be 'separate' or 'inline'");
    }
    r->prompts = lm_calloc(1, sizeof(int32_t *));
    r->n_prompt = lm_calloc(1, sizeof(int));
    r->echo_text = lm_calloc(1, sizeof(char *));
    lm_chat_xmsg *msgs = lm_calloc((size_t)n, sizeof *msgs);
    char **contents = lm_calloc((size_t)n, sizeof(char *));
    int rc = -1, i = 0;
    bool calls_seen = false;
    if (!r->prompts || !r->n_prompt || !r->echo_text || !msgs || !contents) {
        srv_oom(e);
        goto done;
    }
    for (const cJSON *m = ms->child; m; m = m->next, i++) {
        char param[40];
        snprintf(param, sizeof param, "messages[%d].role", i);
        const cJSON *role = srv_field(m, "role");
        if (!cJSON_IsObject(m)) {
            BAD("messages", "'messages[%d]' must be an object", i);
            goto done;
        }
        if (!cJSON_IsString(role)) {
            BAD(param, "'%s' must be a string", param);
            goto done;
        }
        const char *rs = role->valuestring;
        if (!strcmp(rs, "developer")) rs = "system";
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "tool")) {
            BAD(param, "'%s' must be 'system', 'developer', 'user', 'assistant' or 'tool' (got '%.40s')", param, rs);
            goto done;
        }
        if (!(contents[i] = message_content(m, i, e))) goto done;
        if (!strcmp(rs, "assistant") && with_reasoning(c, m, &contents[i], e)) goto done;
        msgs[i] = (lm_chat_xmsg){rs, contents[i], NULL, 0, NULL, NULL};
        if (!strcmp(rs, "assistant") && (message_calls(m, i, &msgs[i], e) || message_reasoning(m, i, &msgs[i], e)))
            goto done;
        calls_seen |= msgs[i].n_calls > 0;
        if (!strcmp(rs, "tool")) {
            const cJSON *id = srv_field(m, "tool_call_id");
            if (!calls_seen) {
                BAD(param, "'messages[%d]' with role 'tool' must answer a preceding message with 'tool_calls'", i);
                goto done;
            }
            if (id && !cJSON_IsString(id)) {
                BAD("messages", "'messages[%d].tool_call_id' must be a string", i);
                goto done;
            }
            msgs[i].call_id = id ? id->valuestring : NULL;
        }
    }
    rc = render_messages(c, msgs, n, tools, thinking_off, effort, ident ? ident->valuestring : NULL, r, e);
    r->reason_split = rc == 0 && r->reason_syntax != REASON_NONE && !inline_;
done:
    for (int k = 0; k < n && contents; k++) lm_free(contents[k]);
    for (int k = 0; k < n && msgs; k++) lm_free((void *)msgs[k].calls);
    lm_free(contents);
    lm_free(msgs);
    return rc;
}

/* The chat family's end-of-turn text as a stop string, unless it is an
 * end-of-generation token the engine stops on by itself. */
static int add_chat_stop(const lm_server_parse_ctx *c, lm_server_request *r, lm_server_error *e) {
    const char *marker = chat_stop_marker(chat_family_of(c));
    if (!marker) return 0;
    int32_t id = tok_find(c->tok, marker, strlen(marker));
    if (id >= 0 && tok_is_eog(c->tok, id)) return 0;
    for (int i = 0; i < r->p.n_stop; i++)
        if (!strcmp(r->stops[i], marker)) return 0;
    if (!(r->stops[r->p.n_stop] = lm_strndup(marker, strlen(marker)))) return srv_oom(e);
    r->p.n_stop++;
    return 0;
}

/* --------------------------------------------------------------- the rest */

/* Features of OpenAI's API that lamina does not implement: a 400 naming them. */
static int check_unsupported(const cJSON *root, bool chat, lm_server_request *r, lm_server_error *e) {
    const cJSON *v;
    if (!chat) {
        if (get_bool(root, "echo", &r->echo, e) < 0) return -1;
        if (r->echo && r->p.logprobs) return BAD("echo", "'echo' together with 'logprobs' is not supported");
        if ((v = srv_field(root, "suffix")) && !(cJSON_IsString(v) && !v->valuestring[0]))
            return BAD("suffix", "'suffix' is not supported");
        long long best_of = 1;
        if (get_int(root, "best_of", 1, 1 << 20, &best_of, e) < 0) return -1;
        if (best_of != 1 && best_of != r->p.n) return BAD("best_of", "'best_of' other than n is not supported");
    }
    if ((v = srv_field(root, "user")) && !cJSON_IsString(v)) return BAD("user", "'user' must be a string");
    return 0;
}

static uint64_t first8(const uint8_t h[SHA256_LEN]) {
    uint64_t x = 0;
    for (int i = 0; i < 8; i++) x |= (uint64_t)h[i] << (8 * i);
    return x;
}

/* cache_salt: absent or null, or a string of 1..SERVER_MAX_CACHE_SALT bytes. */
static int parse_cache_salt(const cJSON *root, lm_server_request *r, lm_server_error *e) {
    const cJSON *v = srv_field(root, "cache_salt");
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v)) return BAD("cache_salt", "'cache_salt' must be a string");
    size_t n = strlen(v->valuestring);
    if (n == 0) return BAD("cache_salt", "'cache_salt' must not be empty (leave it out for the key's own cache)");
    if (n > SERVER_MAX_CACHE_SALT)
        return BAD("cache_salt", "'cache_salt' is %zu bytes long; at most %d are allowed", n, SERVER_MAX_CACHE_SALT);
    uint8_t h[SHA256_LEN];
    sha256(v->valuestring, n, h);
    r->cache_salt_given = true;
    r->cache_salt_hash = first8(h);
    return 0;
}

uint64_t server_tenant_salt(const char *api_key) {
    if (!api_key || !api_key[0]) return 0;
    sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, "lamina tenant", 14); /* the tag and its NUL */
    sha256_update(&c, api_key, strlen(api_key));
    uint8_t h[SHA256_LEN];
    sha256_final(&c, h);
    return first8(h);
}

uint64_t server_request_salt(uint64_t tenant, const lm_server_request *r) {
    if (!r || !r->cache_salt_given) return tenant;
    uint8_t m[14 + 16], h[SHA256_LEN];
    memcpy(m, "lamina salted", 14);
    for (int i = 0; i < 8; i++) m[14 + i] = (uint8_t)(tenant >> (8 * i));
    for (int i = 0; i < 8; i++) m[22 + i] = (uint8_t)(r->cache_salt_hash >> (8 * i));
    sha256(m, sizeof m, h);
    return first8(h);
}

/* stream, stream_options, n, max_tokens (range only; the context check comes later). */
static int parse_shape(const lm_server_parse_ctx *c, const cJSON *root, bool chat, lm_server_request *r,
                       long long *max_tokens, const char **mt_name, lm_server_error *e) {
    if (get_bool(root, "stream", &r->stream, e) < 0) return -1;
    const cJSON *so = srv_field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) return BAD("stream_options", "'stream_options' must be an object");
        if (!r->stream) return BAD("stream_options", "'stream_options' is only allowed when 'stream' is true");
        if (get_bool(so, "include_usage", &r->include_usage, e) < 0) return -1;
    }
    long long n = 1;
    if (get_int(root, "n", 1, c->max_n > 0 ? c->max_n : 1, &n, e) < 0) return -1;
    r->p.n = (int)n;
    long long cap = c->max_tokens_cap > 0 ? c->max_tokens_cap : INT_MAX;
    *max_tokens = 0;
    *mt_name = "max_tokens";
    int rc = 0;
    if (chat && srv_field(root, "max_completion_tokens")) {
        *mt_name = "max_completion_tokens";
        rc = get_int(root, "max_completion_tokens", 1, cap, max_tokens, e);
    } else {
        rc = get_int(root, "max_tokens", 1, cap, max_tokens, e);
    }
    if (rc == 0) *mt_name = NULL; /* the default: a context overflow is the prompt's */
    return rc < 0 ? -1 : 0;
}

/* Every prompt plus max_tokens within the context, by the engine's rule
 * (engine_fit_context, with OpenAI's count: n_ctx tokens in all); without
 * max_tokens: max_tokens_default (1024 for chat, 16 for completions when 0),
 * bounded by max_tokens_cap and by the rest of the context. Last, n within the
 * sequences the engine runs at once. */
static int check_context(const lm_server_parse_ctx *c, bool chat, long long max_tokens, const char *mt_name,
                         lm_server_request *r, lm_server_error *e) {
    const char *what = chat ? "messages" : "prompt";
    int longest = 0;
    for (int i = 0; i < r->n_prompts; i++)
        if (r->n_prompt[i] > longest) longest = r->n_prompt[i];
    int want = (int)max_tokens; /* at most max_tokens_cap, itself at most INT_MAX */
    if (max_tokens == 0) {
        want = c->max_tokens_default > 0 ? c->max_tokens_default : chat ? SERVER_MAX_TOKENS_CHAT : 16;
        if (c->max_tokens_cap > 0 && want > c->max_tokens_cap) want = c->max_tokens_cap;
        /* chat: at most the rest of the context; completions keep the error */
        if (chat && want > c->n_ctx - longest && longest < c->n_ctx) want = -1;
    }
    int fit;
    if (engine_fit_context(c->n_ctx, longest, want, &fit) != LM_OK) {
        if (longest >= c->n_ctx)
            return server_error(e, 400, INVALID, what, "context_length_exceeded",
                                "This model's maximum context length is %d tokens, but the %s has %d tokens "
                                "(leaving no room to generate).",
                                c->n_ctx, what, longest);
        return server_error(e, 400, INVALID, mt_name ? mt_name : what, "context_length_exceeded",
                            "This model's maximum context length is %d tokens. However, you requested %lld "
                            "tokens (%d in the %s, %d in the completion).",
                            c->n_ctx, (long long)longest + want, longest, what, want);
    }
    /* every choice of every prompt is a sequence: one request never asks for
     * more than the engine runs at once */
    if (c->max_seqs > 0 && (long long)r->p.n * r->n_prompts > c->max_seqs) {
        if (r->n_prompts == 1)
            return BAD("n", "n = %d is more than the %d sequences the engine runs at once", r->p.n, c->max_seqs);
        return BAD(r->p.n > 1 ? "n" : "prompt",
                   "%d prompts x n = %d asks for %lld sequences, more than the %d the engine runs at once",
                   r->n_prompts, r->p.n, (long long)r->p.n * r->n_prompts, c->max_seqs);
    }
    r->p.max_tokens = fit;
    r->p.stop = (const char *const *)r->stops;
    return 0;
}

/* The first string of `root` holding U+10FFFF, as a path ("messages[0].content"),
 * into path (cap bytes; "" when none). */
static bool find_mark(const cJSON *v, char *path, size_t cap, size_t at) {
    if (cJSON_IsString(v) && v->valuestring && strstr(v->valuestring, "\xf4\x8f\xbf\xbf")) return true;
    int i = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, v) {
        size_t n = at;
        if (cJSON_IsObject(v) && c->string)
            n += (size_t)snprintf(path + at, at < cap ? cap - at : 0, "%s%s", at ? "." : "", c->string);
        else n += (size_t)snprintf(path + at, at < cap ? cap - at : 0, "[%d]", i);
        if (n >= cap) n = cap - 1;
        if (find_mark(c, path, cap, n)) return true;
        path[at] = 0;
        i++;
    }
    return false;
}

/* Which field of the body holds a \u0000 escape: the body again with every
 * such escape made U+10FFFF (a noncharacter no text carries), parsed, and
 * the first string holding it named into path ("" when it cannot say). */
static void nul_field(const char *body, size_t len, char *path, size_t cap) {
    path[0] = 0;
    strbuf b = {0};
    for (size_t i = 0; i < len; i++) {
        if (body[i] == '\\' && i + 1 < len) {
            if (i + 5 < len && body[i + 1] == 'u' && !memcmp(body + i + 2, "0000", 4)) {
                strbuf_puts(&b, "\\udbff\\udfff");
                i += 5;
            } else {
                strbuf_put(&b, body + i, 2);
                i++;
            }
        } else strbuf_put(&b, body + i, 1);
    }
    cJSON *root = b.failed ? NULL : cJSON_ParseWithLength(b.p, b.len);
    if (root && !find_mark(root, path, cap, 0)) path[0] = 0;
    cJSON_Delete(root);
    strbuf_free(&b);
}

/* The top level: JSON object -> parameters, in the order the file comment gives. */
static int parse_root(const lm_server_parse_ctx *c, bool chat, const cJSON *root, lm_server_request *r,
                      lm_server_error *e) {
    if (!cJSON_IsObject(root)) return BAD(NULL, "the request body must be a JSON object");
    const cJSON *model = srv_field(root, "model");
    if (model && !cJSON_IsString(model)) return BAD("model", "'model' must be a string");
    if (model && c->model_name && strcmp(model->valuestring, c->model_name) != 0)
        return server_error(e, 404, INVALID, "model", "model_not_found",
                            "The model '%.100s' does not exist (this server serves '%.100s').", model->valuestring,
                            c->model_name);
    long long max_tokens = 0;
    const char *mt_name = "max_tokens";
    if (parse_shape(c, root, chat, r, &max_tokens, &mt_name, e)) return -1;
    if (parse_sampling(c, root, chat, r, e) || parse_stop(root, r, e)) return -1;
    if (parse_bias(root, tok_n_vocab(c->tok), r, e) || check_unsupported(root, chat, r, e)) return -1;
    if (parse_cache_salt(root, r, e)) return -1;
    if (srv_parse_format(root, r, e)) return -1;
    if (!chat) return parse_prompt(c, root, r, e) || check_context(c, chat, max_tokens, mt_name, r, e) ? -1 : 0;
    srv_tools tools;
    int rc = srv_parse_tools(root, chat_family_of(c), r, &tools, e);
    if (rc == 0) rc = parse_messages(c, root, &tools, r, e) || add_chat_stop(c, r, e) ? -1 : 0;
    srv_tools_free(&tools);
    return rc ? -1 : check_context(c, chat, max_tokens, mt_name, r, e);
}

int srv_parse_json(const char *body, size_t len, cJSON **root_out, lm_server_error *e) {
    srv_json_init();
    *root_out = NULL;
    if (len == 0 || !body) return BAD(NULL, "the request body is empty (a JSON object is expected)");
    if (!utf8_valid(body, len)) return BAD(NULL, "the request body is not valid UTF-8");
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)body[i];
        if (ch < 0x20 && ch != '\t' && ch != '\n' && ch != '\r')
            return BAD(NULL,
                       "the request body holds a raw control character (byte 0x%02x at offset %zu): not "
                       "valid JSON",
                       ch, i);
        /* \u0000 would end the C string that carries it and cut the text
         * short without a word: refused (an escaped backslash is skipped) */
        if (ch == '\\' && i + 1 < len) {
            if (i + 5 < len && body[i + 1] == 'u' && !memcmp(body + i + 2, "0000", 4)) {
                char path[48];
                nul_field(body, len, path, sizeof path);
                return BAD(path[0] ? path : NULL,
                           "'%s' holds the escape \\u0000 (a NUL character, at byte %zu of the body): strings "
                           "with a NUL character are not accepted",
                           path[0] ? path : "the request body", i);
            }
            i++;
        }
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!root) {
        size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        return BAD(NULL, "We could not parse the JSON body of your request (error near byte %zu).", at);
    }
    while (end && end < body + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
    if (end && end < body + len) {
        cJSON_Delete(root);
        return BAD(NULL,
                   "We could not parse the JSON body of your request (data after "
                   "the JSON value at byte %zu).",
                   (size_t)(end - body));
    }
    *root_out = root;
    return 0;
}

int server_parse_request(const lm_server_parse_ctx *c, bool chat, const char *body, size_t len, lm_server_request *out,
                         lm_server_error *e) {
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    e->status = 200;
    out->chat = chat;
    cJSON *root;
    if (srv_parse_json(body, len, &root, e)) return -1;
    int rc = parse_root(c, chat, root, out, e);
    cJSON_Delete(root);
    if (rc) {
        server_request_free(out);
        out->chat = chat;
    }
    return rc;
}

void server_request_free(lm_server_request *r) {
    if (!r) return;
    for (int i = 0; i < r->n_prompts; i++) {
        lm_free(r->prompts[i]);
        if (r->echo_text) lm_free(r->echo_text[i]);
    }
    lm_free(r->prompts);
    lm_free(r->n_prompt);
    lm_free(r->echo_text);
    lm_free((void *)r->p.bias_ids);
    lm_free((void *)r->p.bias_vals);
    for (int i = 0; i < r->p.n_stop; i++) lm_free(r->stops[i]);
    lm_free(r->grammar);
    for (int i = 0; i < r->n_grammar_triggers; i++) lm_free(r->grammar_triggers[i]);
    lm_free(r->tool_strings);
    memset(r, 0, sizeof *r);
}
