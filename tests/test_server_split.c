/*
 * test_server_split.c - a thinking model's reasoning in the server's request
 * parser (server_parse_request), without sockets: which templates split
 * the reasoning apart (reasoning_format, the server's reasoning_inline),
 * where the prompt leaves it (open or closed), the answer's grammar made
 * lazy on the reasoning's end (</think>, gpt-oss's final channel header;
 * not the raw grammar, not with thinking off, tools' own trigger with
 * tool_choice auto), and reasoning_content given back in history rendered
 * as Qwen3's template writes it. Each grammar is checked on texts it must
 * take and must refuse.
 *
 * The tokenizer is the bundled model's; its ids only need to tell prompts
 * apart.
 */
#include "serve/server.h"
#include "decode/grammar.h"

#include <stdint.h>

#include "text/chat.h"
#include "text/reasoning.h"
#include "format/gguf.h"
#include "test.h"
#include "server_parse_test.h"
#include "text/tokenizer.h"
#include "base/util.h"

/* The prompt the parser made equals chat_apply_tools' for these messages. */
static bool same_prompt(const lm_server_request *r, int family, const lm_chat_xmsg *m, int n, const char *const *tools,
                        int n_tools) {
    char *text = NULL, err[LM_ERRLEN];
    bool add_bos;
    if (chat_apply_tools(family, NULL, tok, m, n, tools, n_tools, &text, &add_bos, err, sizeof err)) return false;
    int32_t ids[4096];
    int k = tok_encode(tok, text, strlen(text), add_bos, true, ids, 4096);
    lm_free(text);
    return r->n_prompts == 1 && k == r->n_prompt[0] && !memcmp(ids, r->prompts[0], (size_t)k * sizeof(int32_t));
}

/* Reasoning (text/reasoning.h): the thinking families split by default,
 * reasoning_format and the server's default, where the prompt leaves the
 * reasoning, the answer's grammar made lazy on </think> (not the raw
 * grammar, not with thinking off), and reasoning_content given back in
 * history rendered as the template writes it. */
static void test_reasoning_split(void) {
    lm_server_request r;
    lm_server_error e;
    ctx.n_ctx = 4096;
    ctx.chat_family = CHAT_QWEN35;
    CHECK(parse(true, "{" CHAT_A "}", &r, &e) == 0);
    CHECK(r.reason_syntax == REASON_THINK && r.reason_open && r.reason_split && !r.grammar);
    server_request_free(&r);
    CHECK(parse(true, "{" CHAT_A ", \"reasoning_format\": \"inline\"}", &r, &e) == 0);
    CHECK(r.reason_syntax == REASON_THINK && !r.reason_split);
    server_request_free(&r);
    CHECK(parse(true, "{" CHAT_A ", \"reasoning_format\": \"none\"}", &r, &e) == 0 && !r.reason_split);
    server_request_free(&r);
    ctx.reasoning_inline = true;
    CHECK(parse(true, "{" CHAT_A "}", &r, &e) == 0 && !r.reason_split);
    server_request_free(&r);
    CHECK(parse(true, "{" CHAT_A ", \"reasoning_format\": \"separate\"}", &r, &e) == 0 && r.reason_split);
    server_request_free(&r);
    ctx.reasoning_inline = false;
    CHECK(parse(true, "{" CHAT_A ", \"reasoning_format\": \"folded\"}", &r, &e) == -1);
    CHECK(e.status == 400 && !strcmp(e.param, "reasoning_format"));
    CHECK(parse(true, "{" CHAT_A ", \"reasoning_format\": 1}", &r, &e) == -1 && e.status == 400);
    /* the answer's grammar waits for </think> */
    CHECK(parse(true, "{" CHAT_A ", \"response_format\": {\"type\": \"json_object\"}}", &r, &e) == 0);
    CHECK(r.grammar && r.n_grammar_triggers == 1 && !strcmp(r.grammar_triggers[0], "</think>"));
    CHECK(grammar_takes(r.grammar, "</think>\n\n{\"a\": 1}"));
    CHECK(!grammar_takes(r.grammar, "{\"a\": 1}"));
    server_request_free(&r);
    /* tools with tool_choice required: their grammar, after </think>, compiles */
    CHECK(parse(true, "{" CHAT_A ", " TOOLS ", \"tool_choice\": \"required\"}", &r, &e) == 0);
    CHECK(r.tool_calls && r.n_grammar_triggers == 1 && !strcmp(r.grammar_triggers[0], "</think>"));
    char gerr[LM_ERRLEN];
    lm_grammar *tg = grammar_parse(r.grammar, strlen(r.grammar), NULL, gerr, sizeof gerr);
    CHECKF(tg != NULL, "%s", gerr);
    grammar_free(tg);
    CHECK(!grammar_takes(r.grammar, "<tool_call>"));
    server_request_free(&r);
    /* tool_choice auto keeps its own trigger, the call's opener */
    CHECK(parse(true, "{" CHAT_A ", " TOOLS "}", &r, &e) == 0);
    CHECK(r.n_grammar_triggers == 1 && !strcmp(r.grammar_triggers[0], "<tool_call>"));
    server_request_free(&r);
    /* thinking off: the prompt closed it, the grammar holds from the start */
    CHECK(parse(true,
                "{" CHAT_A ", \"response_format\": {\"type\": \"json_object\"}, \"chat_template_kwargs\": "
                "{\"enable_thinking\": false}}",
                &r, &e) == 0);
    CHECK(r.grammar && r.n_grammar_triggers == 0 && !r.reason_open && grammar_takes(r.grammar, "{\"a\": 1}"));
    server_request_free(&r);
    /* the raw grammar covers the whole output */
    CHECK(parse(true, "{" CHAT_A ", \"grammar\": \"root ::= \\\"x</think>y\\\"\"}", &r, &e) == 0);
    CHECK(r.grammar_raw && r.n_grammar_triggers == 0);
    server_request_free(&r);
    /* qwen3: the model opens the block itself */
    ctx.chat_family = CHAT_QWEN3;
    CHECK(parse(true, "{" CHAT_A "}", &r, &e) == 0 && r.reason_syntax == REASON_THINK && !r.reason_open);
    server_request_free(&r);
    /* families without reasoning, and completions */
    ctx.chat_family = CHAT_CHATML;
    CHECK(parse(true, "{" CHAT_A ", \"response_format\": {\"type\": \"json_object\"}}", &r, &e) == 0);
    CHECK(r.reason_syntax == REASON_NONE && !r.reason_split && r.n_grammar_triggers == 0);
    server_request_free(&r);
    CHECK(parse(false, "{\"prompt\": \"a\"}", &r, &e) == 0 && r.reason_syntax == REASON_NONE && !r.reason_split);
    server_request_free(&r);
    /* history: reasoning_content rendered as the template writes it */
    ctx.chat_family = CHAT_QWEN3;
    const char *hist = "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
                       "\"content\": \"B\", \"reasoning_content\": \"\\nR\\n\"}, {\"role\": \"user\", \"content\": "
                       "\"c\"}, {\"role\": \"assistant\", \"content\": \"D\", \"reasoning_content\": \"S\"}]}";
    CHECKF(parse(true, hist, &r, &e) == 0, "%s", e.message);
    lm_chat_xmsg want[] = {{"user", "a", NULL, 0, NULL, NULL},
                           {"assistant", "B", NULL, 0, NULL, NULL},
                           {"user", "c", NULL, 0, NULL, NULL},
                           {"assistant", "<think>\nS\n</think>\n\nD", NULL, 0, NULL, NULL}};
    CHECK(same_prompt(&r, CHAT_QWEN3, want, 4, NULL, 0));
    server_request_free(&r);
    CHECK(parse(true,
                "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": "
                "\"B\", \"reasoning_content\": 5}]}",
                &r, &e) == -1 &&
          e.status == 400);
    /* gpt-oss: harmony channels; the answer's grammar waits for the final
     * channel's header */
    ctx.chat_family = CHAT_GPT_OSS;
    CHECK(parse(true, "{" CHAT_A ", \"response_format\": {\"type\": \"json_object\"}}", &r, &e) == 0);
    CHECK(r.reason_syntax == REASON_HARMONY && r.reason_split && r.n_grammar_triggers == 1);
    CHECK(!strcmp(r.grammar_triggers[0], "<|channel|>final<|message|>"));
    CHECK(grammar_takes(r.grammar, "<|channel|>final<|message|>{\"a\": 1}") && !grammar_takes(r.grammar, "{\"a\": 1}"));
    server_request_free(&r);
    /* gpt-oss's tool call: tool_choice required, one call in the commentary
     * channel after the analysis, each tool's name with its own schema */
    ctx.n_ctx = 1024; /* the tools in the developer message */
#define HCALL "<|channel|>commentary to=functions."
#define HHDR " <|constrain|>json<|message|>"
    CHECK(parse(true, "{" CHAT_A ", " TOOLS ", \"tool_choice\": \"required\"}", &r, &e) == 0);
    CHECK(r.grammar && r.n_grammar_triggers == 2 && !strcmp(r.grammar_triggers[0], "<|end|>") &&
          !strcmp(r.grammar_triggers[1], "<|channel|>commentary"));
    lm_grammar *hg = r.grammar ? grammar_parse(r.grammar, strlen(r.grammar), NULL, gerr, sizeof gerr) : NULL;
    CHECKF(hg != NULL, "%s", gerr);
    grammar_free(hg);
    CHECK(grammar_takes(r.grammar, "<|end|><|start|>assistant" HCALL "get_weather" HHDR "{\"city\": \"Oslo\"}"));
    CHECK(grammar_takes(r.grammar, HCALL "get_weather" HHDR "{}"));
    CHECK(grammar_takes(r.grammar, "<|end|><|start|>assistant" HCALL "get_time" HHDR "{\"any\": [1, 2]}"));
    CHECK(!grammar_takes(r.grammar, HCALL "get_weather" HHDR "{\"city\": 5}"));                 /* not its schema */
    CHECK(!grammar_takes(r.grammar, HCALL "get_date" HHDR "{}"));                               /* no such tool */
    CHECK(!grammar_takes(r.grammar, HCALL "get_weather" HHDR "[1]"));                           /* not an object */
    CHECK(!grammar_takes(r.grammar, "<|end|><|start|>assistant<|channel|>final<|message|>{}")); /* no answer */
    CHECK(!grammar_takes(r.grammar, HCALL "get_time" HHDR "{} " HCALL "get_time" HHDR "{}"));   /* one call */
    server_request_free(&r);
    /* a named function: that one only */
    CHECK(parse(true,
                "{" CHAT_A ", " TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
                "\"get_weather\"}}}",
                &r, &e) == 0);
    CHECK(r.n_grammar_triggers == 2 && grammar_takes(r.grammar, HCALL "get_weather" HHDR "{\"city\": \"Rome\"}"));
    CHECK(!grammar_takes(r.grammar, HCALL "get_time" HHDR "{}"));
    server_request_free(&r);
    /* tool_choice auto: free, the calls read from the commentary channel */
    CHECK(parse(true, "{" CHAT_A ", " TOOLS "}", &r, &e) == 0);
    CHECK(!r.grammar && r.n_grammar_triggers == 0);
    server_request_free(&r);
    /* a tool whose schema lamina cannot follow: 400 naming it */
    CHECK(parse(true,
                "{" CHAT_A ", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", "
                "\"parameters\": {\"type\": \"object\", \"properties\": {\"x\": {\"$ref\": \"#/nowhere\"}}}}}], "
                "\"tool_choice\": \"required\"}",
                &r, &e) == -1 &&
          e.status == 400 && strstr(e.message, "tools[0]"));
    server_request_free(&r);
#undef HCALL
#undef HHDR
    ctx.chat_family = CHAT_CHATML;
    ctx.n_ctx = 128;
}

int main(void) {
    server_test_setup(CHAT_CHATML, 128);
    TEST_RUN(test_reasoning_split);
    tok_free(tok);
    return TEST_DONE();
}
