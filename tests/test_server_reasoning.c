/*
 * test_server_reasoning.c - the request fields of gpt-oss's chat format in
 * the server's request parser (server_parse_request), without sockets:
 * reasoning_effort (top level and chat_template_kwargs, which wins; low,
 * medium or high, else a 400 naming the field; ignored by families without
 * it), chat_template_kwargs.model_identity, and an assistant message's
 * reasoning (reasoning_content, reasoning or thinking; with tool calls its
 * content is left out). Each parsed prompt is compared with chat_prompt's
 * for the conversation it should be, and with another's it should not be.
 *
 * The tokenizer is the bundled model's; its ids only need to tell prompts
 * apart (tests/test_tokenizer.c checks gpt-oss's own vocabulary).
 */
#include "serve/server.h"

#include <stdint.h>

#include "text/chat.h"
#include "format/gguf.h"
#include "test.h"
#include "server_parse_test.h"
#include "text/tokenizer.h"
#include "base/util.h"

/* The prompt the parser made equals chat_prompt's for conv (gpt-oss: its
 * date is today's on both sides). */
static bool same_conv(const lm_server_request *r, int family, const lm_chat_conv *conv) {
    char *text = NULL, err[LM_ERRLEN];
    bool add_bos;
    if (chat_prompt(family, NULL, tok, conv, &text, &add_bos, err, sizeof err)) return false;
    int32_t ids[4096];
    int k = tok_encode(tok, text, strlen(text), add_bos, true, ids, 4096);
    lm_free(text);
    return r->n_prompts == 1 && k == r->n_prompt[0] && !memcmp(ids, r->prompts[0], (size_t)k * sizeof(int32_t));
}

/* reasoning_effort (top level and chat_template_kwargs) and an assistant
 * message's reasoning, as gpt-oss's template takes them. */
static void test_reasoning_fields(void) {
    lm_server_request r;
    lm_server_error e;
    ctx.n_ctx = 4096;
    ctx.chat_family = CHAT_GPT_OSS;
    lm_chat_xmsg user_a[] = {{.role = "user", .content = "a"}};
    static const struct {
        const char *body, *effort;
    } cases[] = {
        {"{" CHAT_A "}", NULL},
        {"{" CHAT_A ", \"reasoning_effort\": null}", NULL},
        {"{" CHAT_A ", \"reasoning_effort\": \"high\"}", "high"},
        {"{" CHAT_A ", \"chat_template_kwargs\": {\"reasoning_effort\": \"low\"}}", "low"},
        /* the template variable wins over the top-level field */
        {"{" CHAT_A ", \"reasoning_effort\": \"high\", \"chat_template_kwargs\": {\"reasoning_effort\": "
         "\"medium\"}}",
         "medium"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        CHECKF(parse(true, cases[i].body, &r, &e) == 0, "%s", e.message);
        lm_chat_conv cv = {.msgs = user_a, .n = 1, .reasoning_effort = cases[i].effort};
        CHECKF(same_conv(&r, CHAT_GPT_OSS, &cv), "case %zu", i);
        /* and not the prompt of another effort */
        cv.reasoning_effort = cases[i].effort && !strcmp(cases[i].effort, "low") ? "high" : "low";
        CHECKF(!same_conv(&r, CHAT_GPT_OSS, &cv), "case %zu", i);
        server_request_free(&r);
    }
    /* bad values: a 400 naming the field */
    static const struct {
        const char *body, *param;
    } bad[] = {
        {"{" CHAT_A ", \"reasoning_effort\": \"extreme\"}", "reasoning_effort"},
        {"{" CHAT_A ", \"reasoning_effort\": \"High\"}", "reasoning_effort"},
        {"{" CHAT_A ", \"reasoning_effort\": 2}", "reasoning_effort"},
        {"{" CHAT_A ", \"chat_template_kwargs\": {\"reasoning_effort\": true}}", "chat_template_kwargs"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": "
         "\"b\", \"reasoning_content\": 1}]}",
         "messages[1].reasoning_content"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = parse(true, bad[i].body, &r, &e);
        CHECKF(rc == -1 && e.status == 400 && !strcmp(e.param, bad[i].param), "bad %zu: %s", i, e.param);
    }
    /* chat_template_kwargs.model_identity: gpt-oss's first system line */
    CHECK(parse(true, "{" CHAT_A ", \"chat_template_kwargs\": {\"model_identity\": \"You are X.\"}}", &r, &e) == 0);
    lm_chat_conv idc = {.msgs = user_a, .n = 1, .model_identity = "You are X."};
    CHECK(same_conv(&r, CHAT_GPT_OSS, &idc));
    idc.model_identity = NULL;
    CHECK(!same_conv(&r, CHAT_GPT_OSS, &idc));
    server_request_free(&r);
    CHECK(parse(true, "{" CHAT_A ", \"chat_template_kwargs\": {\"model_identity\": 1}}", &r, &e) == -1 &&
          e.status == 400 && !strcmp(e.param, "chat_template_kwargs"));
    /* families without the input accept and ignore it */
    ctx.chat_family = CHAT_CHATML;
    CHECK(parse(true, "{" CHAT_A ", \"reasoning_effort\": \"low\"}", &r, &e) == 0);
    lm_chat_conv plain = {.msgs = user_a, .n = 1};
    CHECK(same_conv(&r, CHAT_CHATML, &plain));
    server_request_free(&r);
    /* an answer's reasoning: reasoning_content, reasoning or thinking, the
     * first string; with tool calls the content is left out (llama.cpp) */
    ctx.chat_family = CHAT_GPT_OSS;
    const char *tool_json[2] = {TOOL_W, TOOL_T};
    lm_chat_call call = {"c1", "get_time", "{}"};
    lm_chat_xmsg conv[] = {{.role = "user", .content = "a"},
                           {.role = "assistant", .content = "", .calls = &call, .n_calls = 1, .reasoning = "Call it."},
                           {.role = "tool", .content = "12:00", .call_id = "c1"}};
    lm_chat_conv cv = {.msgs = conv, .n = 3, .tools = tool_json, .n_tools = 2, .reasoning_effort = "low"};
    static const char *keys[] = {"\"reasoning_content\": \"Call it.\"",
                                 "\"reasoning\": \"Call it.\", \"thinking\": \"not this\"",
                                 "\"reasoning_content\": null, \"thinking\": \"Call it.\""};
    for (int k = 0; k < 3; k++) {
        char body[1024];
        snprintf(body, sizeof body,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
                 "\"content\": \"Let me look.\", %s, \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", "
                 "\"function\": {\"name\": \"get_time\", \"arguments\": \"{}\"}}]}, {\"role\": \"tool\", "
                 "\"tool_call_id\": \"c1\", \"content\": \"12:00\"}], \"reasoning_effort\": \"low\", " TOOLS "}",
                 keys[k]);
        CHECKF(parse(true, body, &r, &e) == 0, "%s", e.message);
        CHECKF(same_conv(&r, CHAT_GPT_OSS, &cv), "keys %d", k);
        conv[1].reasoning = NULL; /* the reasoning is in the prompt, as the analysis */
        CHECK(!same_conv(&r, CHAT_GPT_OSS, &cv));
        conv[1].reasoning = "Call it.";
        server_request_free(&r);
    }
    ctx.chat_family = CHAT_CHATML;
    ctx.n_ctx = 128;
}

int main(void) {
    server_test_setup(CHAT_GPT_OSS, 4096);
    TEST_RUN(test_reasoning_fields);
    tok_free(tok);
    return TEST_DONE();
}
