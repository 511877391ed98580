/*
 * test_server.c - the request parser of the HTTP server (server_parse_request),
 * without sockets: valid bodies of both routes must map to the right engine
 * parameters (defaults included), and a table of bad bodies must each give
 * its HTTP status, the offending parameter and, where OpenAI has one, the
 * error code. Also: the UTF-8 check, allocation failure at every allocation
 * (the parser must fail cleanly, never crash or leak), and deep nesting.
 *
 * The tokenizer is the bundled model's (SentencePiece, 512 tokens, BOS 1,
 * EOS "</s>" = 2); the context is set to 128 and max_tokens capped at 100.
 */
#include "serve/server.h"
#include "serve/server_int.h"
#include "decode/grammar.h"
#include "sched/engine.h"

#include <math.h>
#include <stdint.h>

#include "text/chat.h"
#include "format/gguf.h"
#include "test.h"
#include "server_parse_test.h"
#include "text/tokenizer.h"
#include "base/utf8.h"
#include "base/util.h"

/* The ids tok_encode gives (with BOS, special tokens parsed). */
static int encode(const char *text, int32_t *ids, int cap) {
    return tok_encode(tok, text, strlen(text), tok_add_bos(tok), true, ids, cap);
}

/* \u0000 is refused (bad cases above); an escaped backslash before "u0000"
 * is the text \u0000 and is accepted, tokenized as that text. */
static void test_escaped_backslash_not_nul(void) {
    lm_server_request r;
    lm_server_error e;
    CHECKF(parse(false, "{\"prompt\": \"a\\\\u0000b\"}", &r, &e) == 0, "%s", e.message);
    int32_t ids[64];
    int n = encode("a\\u0000b", ids, 64);
    bool same = r.n_prompts == 1 && r.n_prompt[0] == n && !memcmp(r.prompts[0], ids, (size_t)n * sizeof(int32_t));
    server_request_free(&r);
    CHECK(same);
}

static void test_completion_defaults(void) {
    lm_server_request r;
    lm_server_error e;
    CHECKF(parse(false, "{\"prompt\": \"Once upon a time\"}", &r, &e) == 0, "%s", e.message);
    int32_t ids[64];
    int n = encode("Once upon a time", ids, 64);
    CHECK(r.n_prompts == 1 && r.n_prompt[0] == n);
    CHECK(memcmp(r.prompts[0], ids, (size_t)n * sizeof(int32_t)) == 0);
    CHECK(r.prompts[0][0] == tok_bos(tok));
    CHECK(r.p.max_tokens == 16 && r.p.n == 1 && !r.stream && !r.include_usage && !r.echo);
    /* no server defaults given: `lamina run`'s (sample_params_default) */
    lm_sample_params d;
    sample_params_default(&d);
    CHECK(d.temp == 0.8f && d.top_k == 40 && d.top_p == 0.95f && d.min_p == 0.05f);
    CHECK(r.p.sp.temp == d.temp && r.p.sp.top_p == d.top_p && r.p.sp.top_k == d.top_k && r.p.sp.min_p == d.min_p);
    CHECK(r.p.sp.repeat_penalty == 1 && r.p.sp.freq_penalty == 0 && r.p.sp.presence_penalty == 0);
    CHECK(!r.seed_given && r.p.n_bias == 0 && r.p.n_stop == 0 && !r.p.logprobs && r.p.top_logprobs == 0);
    CHECK(!r.p.ignore_eos && r.p.priority == 0 && !r.chat);
    server_request_free(&r);
}

/* The server's own defaults (serve --temp, --top-k, --top-p, --min-p,
 * --max-tokens) reach a request that leaves the fields out, and never one
 * that sets them; a chat request without max_tokens gets 1024, within the
 * context. */
static void test_server_defaults(void) {
    lm_server_request r;
    lm_server_error e;
    lm_sample_params sp;
    sample_params_default(&sp);
    sp.temp = 0.25f, sp.top_k = 7, sp.top_p = 0.5f, sp.min_p = 0.2f;
    lm_server_parse_ctx saved = ctx;
    ctx.sampling = &sp;
    ctx.max_tokens_default = 9;
    CHECKF(parse(false, "{\"prompt\": \"Once\"}", &r, &e) == 0, "%s", e.message);
    CHECK(r.p.sp.temp == 0.25f && r.p.sp.top_k == 7 && r.p.sp.top_p == 0.5f && r.p.sp.min_p == 0.2f);
    CHECK(r.p.max_tokens == 9);
    server_request_free(&r);
    CHECKF(parse(true,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"y\"}], \"temperature\": 0,"
                 " \"top_k\": 0, \"top_p\": 1, \"min_p\": 0, \"max_tokens\": 3}",
                 &r, &e) == 0,
           "%s", e.message);
    CHECK(r.p.sp.temp == 0 && r.p.sp.top_k == 0 && r.p.sp.top_p == 1 && r.p.sp.min_p == 0 && r.p.max_tokens == 3);
    server_request_free(&r);
    /* chat: the built-in 1024 on a large context, the rest of a small one */
    ctx.max_tokens_default = 0, ctx.max_tokens_cap = 0, ctx.n_ctx = 4096;
    CHECKF(parse(true, "{\"messages\": [{\"role\": \"user\", \"content\": \"y\"}]}", &r, &e) == 0, "%s", e.message);
    CHECK(r.p.max_tokens == SERVER_MAX_TOKENS_CHAT && SERVER_MAX_TOKENS_CHAT == 1024);
    server_request_free(&r);
    ctx.n_ctx = 1030;
    CHECKF(parse(true, "{\"messages\": [{\"role\": \"user\", \"content\": \"y\"}]}", &r, &e) == 0, "%s", e.message);
    CHECK(r.p.max_tokens == 1030 - r.n_prompt[0] && r.p.max_tokens < 1024);
    server_request_free(&r);
    /* completions: the default that does not fit is the prompt's error, as before */
    ctx.n_ctx = 128, ctx.max_tokens_default = 200;
    CHECK(parse(false, "{\"prompt\": \"Once\"}", &r, &e) != 0 && e.status == 400);
    server_request_free(&r);
    ctx = saved;
}

static void test_completion_all_fields(void) {
    const char *body =
        "{\"model\": \"m\", \"prompt\": \"Once\", \"max_tokens\": 10, \"temperature\": 0.5, \"top_p\": 0.9,"
        " \"n\": 2, \"stop\": [\"x\", \"\", \"yy\"], \"seed\": 42, \"presence_penalty\": 0.5,"
        " \"frequency_penalty\": -1.5, \"logit_bias\": {\"5\": -100, \"7\": 3.5}, \"logprobs\": 3,"
        " \"stream\": true, \"stream_options\": {\"include_usage\": true}, \"user\": \"u\", \"top_k\": 40,"
        " \"min_p\": 0.1, \"repetition_penalty\": 1.1, \"priority\": -3, \"ignore_eos\": true,"
        " \"unknown_field\": {\"x\": [1, 2]}, \"suffix\": null, \"best_of\": 2}";
    lm_server_request r;
    lm_server_error e;
    CHECKF(parse(false, body, &r, &e) == 0, "%s", e.message);
    CHECK(r.p.max_tokens == 10 && r.p.n == 2 && r.stream && r.include_usage);
    CHECK(fabsf(r.p.sp.temp - 0.5f) < 1e-6f && fabsf(r.p.sp.top_p - 0.9f) < 1e-6f);
    CHECK(r.seed_given && r.p.sp.seed == 42);
    CHECK(r.p.sp.presence_penalty == 0.5f && r.p.sp.freq_penalty == -1.5f && r.p.sp.repeat_last_n == -1);
    CHECK(r.p.sp.top_k == 40 && fabsf(r.p.sp.min_p - 0.1f) < 1e-6f && fabsf(r.p.sp.repeat_penalty - 1.1f) < 1e-6f);
    CHECK(r.p.priority == -3 && r.p.ignore_eos);
    CHECK(r.p.logprobs && r.p.top_logprobs == 3);
    CHECK(r.p.n_stop == 2 && !strcmp(r.stops[0], "x") && !strcmp(r.stops[1], "yy"));
    CHECK(r.p.n_bias == 2 && r.p.bias_ids[0] == 5 && isinf(r.p.bias_vals[0]) && r.p.bias_vals[0] < 0);
    CHECK(r.p.bias_ids[1] == 7 && r.p.bias_vals[1] == 3.5f);
    server_request_free(&r);
}

static void test_prompt_forms(void) {
    lm_server_request r;
    lm_server_error e;
    /* an array of strings: one prompt each */
    CHECKF(parse(false, "{\"prompt\": [\"Once\", \"upon a time\", \"x\"], \"n\": 2}", &r, &e) == 0, "%s", e.message);
    CHECK(r.n_prompts == 3 && r.p.n == 2);
    int32_t ids[64];
    int n = encode("upon a time", ids, 64);
    CHECK(r.n_prompt[1] == n && memcmp(r.prompts[1], ids, (size_t)n * sizeof(int32_t)) == 0);
    server_request_free(&r);
    /* token ids, taken as they are (no BOS added) */
    CHECKF(parse(false, "{\"prompt\": [403, 407, 261.0]}", &r, &e) == 0, "%s", e.message);
    CHECK(r.n_prompts == 1 && r.n_prompt[0] == 3 && r.prompts[0][0] == 403 && r.prompts[0][2] == 261);
    server_request_free(&r);
    /* arrays of token ids */
    CHECKF(parse(false, "{\"prompt\": [[1, 2], [7]]}", &r, &e) == 0, "%s", e.message);
    CHECK(r.n_prompts == 2 && r.n_prompt[0] == 2 && r.n_prompt[1] == 1 && r.prompts[1][0] == 7);
    server_request_free(&r);
    /* echo keeps the prompt text; for ids, their detokenized text */
    CHECKF(parse(false, "{\"prompt\": \"Once upon\", \"echo\": true}", &r, &e) == 0, "%s", e.message);
    CHECK(r.echo && r.echo_text && !strcmp(r.echo_text[0], "Once upon"));
    server_request_free(&r);
    n = encode("Once upon", ids, 64);
    char body[256];
    int w = snprintf(body, sizeof body, "{\"echo\": true, \"prompt\": [");
    for (int i = 0; i < n; i++) w += snprintf(body + w, sizeof body - (size_t)w, "%s%d", i ? "," : "", ids[i]);
    snprintf(body + w, sizeof body - (size_t)w, "]}");
    CHECKF(parse(false, body, &r, &e) == 0, "%s", e.message);
    CHECKF(!strcmp(r.echo_text[0], "Once upon"), "echo '%s'", r.echo_text[0]);
    server_request_free(&r);
}

static void test_chat(void) {
    lm_server_request r;
    lm_server_error e;
    ctx.max_tokens_cap = 0;
    const char *body = "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
                       " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hi\"},"
                       " {\"type\": \"text\", \"text\": \"there\"}]}], \"logprobs\": true, \"top_logprobs\": 5}";
    int rc = parse(true, body, &r, &e);
    ctx.max_tokens_cap = 100;
    CHECKF(rc == 0, "%s", e.message);
    /* the rendered conversation, tokenized the same way */
    lm_chat_msg msgs[2] = {{"system", "Be brief."}, {"user", "Hi\nthere"}};
    char *text = NULL, err[LM_ERRLEN];
    CHECK(chat_render(CHAT_CHATML, msgs, 2, true, "<s>", "</s>", &text, err, sizeof err) == 0);
    int32_t ids[256];
    int n = encode(text, ids, 256);
    lm_free(text);
    CHECK(r.chat && r.n_prompts == 1 && r.n_prompt[0] == n);
    CHECK(memcmp(r.prompts[0], ids, (size_t)n * sizeof(int32_t)) == 0);
    /* no max_tokens: the rest of the context */
    CHECK(r.p.max_tokens == 128 - n);
    CHECK(r.p.logprobs && r.p.top_logprobs == 5);
    /* ChatML's <|im_end|> is no token of this vocabulary: it becomes a stop string */
    CHECK(r.p.n_stop == 1 && !strcmp(r.stops[0], "<|im_end|>"));
    server_request_free(&r);

    /* max_completion_tokens, the default capped, developer role, null content */
    CHECKF(parse(true,
                 "{\"messages\": [{\"role\": \"developer\", \"content\": \"x\"}, {\"role\": \"user\","
                 " \"content\": \"y\"}, {\"role\": \"assistant\", \"content\": null}, {\"role\": \"user\","
                 " \"content\": \"z\"}], \"max_completion_tokens\": 7}",
                 &r, &e) == 0,
           "%s", e.message);
    CHECK(r.p.max_tokens == 7);
    server_request_free(&r);
    CHECKF(parse(true, "{\"messages\": [{\"role\": \"user\", \"content\": \"y\"}]}", &r, &e) == 0, "%s", e.message);
    CHECK(r.p.max_tokens == (128 - r.n_prompt[0] < 100 ? 128 - r.n_prompt[0] : 100));
    server_request_free(&r);
    ctx.n_ctx = 1000;
    rc = parse(true, "{\"messages\": [{\"role\": \"user\", \"content\": \"y\"}]}", &r, &e);
    ctx.n_ctx = 128;
    CHECKF(rc == 0, "%s", e.message);
    CHECK(r.p.max_tokens == 100);
    server_request_free(&r);

    /* zephyr ends turns with </s>, the EOS token: no stop string needed */
    ctx.chat_family = CHAT_ZEPHYR;
    rc = parse(true, "{\"messages\": [{\"role\": \"user\", \"content\": \"y\"}], \"stop\": \"a\"}", &r, &e);
    ctx.chat_family = CHAT_CHATML;
    CHECKF(rc == 0, "%s", e.message);
    CHECK(r.p.n_stop == 1 && !strcmp(r.stops[0], "a"));
    server_request_free(&r);

    /* no template at all: 400 naming why */
    ctx.chat_family = -1;
    ctx.chat_error = "no template here";
    rc = parse(true, "{\"messages\": [{\"role\": \"user\", \"content\": \"y\"}]}", &r, &e);
    ctx.chat_family = CHAT_CHATML;
    ctx.chat_error = NULL;
    CHECK(rc == -1 && e.status == 400 && !strcmp(e.param, "messages") && strstr(e.message, "no template here"));
    CHECK(!strcmp(e.code, "chat_template_unavailable"));
}

typedef struct {
    bool chat;
    const char *body;
    int status;
    const char *param; /* "" for none */
    const char *code;  /* NULL: not checked */
} bad_case;

static const bad_case BAD[] = {
    {false, "", 400, "", NULL},
    {false, "{", 400, "", NULL},
    {false, "[]", 400, "", NULL},
    {false, "\"prompt\"", 400, "", NULL},
    {false, "{\"prompt\": \"a\"} x", 400, "", NULL},
    {false, "{\"prompt\": \"a\xff\"}", 400, "", NULL},
    {false, "{\"prompt\": \"\xc0\xaf\"}", 400, "", NULL},
    {false, "{\"prompt\": \"\xed\xa0\x80\"}", 400, "", NULL},
    {false, "{\"prompt\": \"a\x01\"}", 400, "", NULL},
    {false, "{\"prompt\": \"\\ud800\"}", 400, "", NULL},
    {false, "{\"prompt\": \"a\\u0000b\"}", 400, "prompt", NULL},
    {false, "{\"prompt\": \"a\", \"stop\": [\"x\", \"\\u0000\"]}", 400, "stop[1]", NULL},
    {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\\u0000\"}]}", 400, "messages[0].content", NULL},
    {false, "{}", 400, "prompt", NULL},
    {false, "{\"prompt\": null}", 400, "prompt", NULL},
    {false, "{\"prompt\": 5}", 400, "prompt", NULL},
    {false, "{\"prompt\": {}}", 400, "prompt", NULL},
    {false, "{\"prompt\": []}", 400, "prompt", NULL},
    {false, "{\"prompt\": [[]]}", 400, "prompt", NULL},
    {false, "{\"prompt\": [1, \"a\"]}", 400, "prompt", NULL},
    {false, "{\"prompt\": [-1]}", 400, "prompt", NULL},
    {false, "{\"prompt\": [512]}", 400, "prompt", NULL},
    {false, "{\"prompt\": [1.5]}", 400, "prompt", NULL},
    {false, "{\"prompt\": [[1], \"a\"]}", 400, "prompt", NULL},
    {false, "{\"prompt\": [[1, \"a\"]]}", 400, "prompt", NULL},
    {false, "{\"prompt\": \"a\", \"max_tokens\": \"10\"}", 400, "max_tokens", NULL},
    {false, "{\"prompt\": \"a\", \"max_tokens\": 0}", 400, "max_tokens", NULL},
    {false, "{\"prompt\": \"a\", \"max_tokens\": -5}", 400, "max_tokens", NULL},
    {false, "{\"prompt\": \"a\", \"max_tokens\": 101}", 400, "max_tokens", NULL},
    {false, "{\"prompt\": \"a\", \"max_tokens\": 2.5}", 400, "max_tokens", NULL},
    {false, "{\"prompt\": \"a\", \"max_tokens\": 1e400}", 400, "max_tokens", NULL},
    {false, "{\"prompt\": \"a\", \"temperature\": 2.5}", 400, "temperature", NULL},
    {false, "{\"prompt\": \"a\", \"temperature\": -0.1}", 400, "temperature", NULL},
    {false, "{\"prompt\": \"a\", \"temperature\": \"hot\"}", 400, "temperature", NULL},
    {false, "{\"prompt\": \"a\", \"top_p\": 1.5}", 400, "top_p", NULL},
    {false, "{\"prompt\": \"a\", \"top_p\": true}", 400, "top_p", NULL},
    {false, "{\"prompt\": \"a\", \"n\": 0}", 400, "n", NULL},
    {false, "{\"prompt\": \"a\", \"n\": 5}", 400, "n", NULL},
    {false, "{\"prompt\": \"a\", \"n\": 1.5}", 400, "n", NULL},
    {false, "{\"prompt\": \"a\", \"presence_penalty\": 3}", 400, "presence_penalty", NULL},
    {false, "{\"prompt\": \"a\", \"frequency_penalty\": -2.01}", 400, "frequency_penalty", NULL},
    {false, "{\"prompt\": \"a\", \"repetition_penalty\": 0}", 400, "repetition_penalty", NULL},
    {false, "{\"prompt\": \"a\", \"top_k\": -2}", 400, "top_k", NULL},
    {false, "{\"prompt\": \"a\", \"min_p\": 2}", 400, "min_p", NULL},
    {false, "{\"prompt\": \"a\", \"seed\": 1e30}", 400, "seed", NULL},
    {false, "{\"prompt\": \"a\", \"seed\": \"1\"}", 400, "seed", NULL},
    {false, "{\"prompt\": \"a\", \"priority\": 1e12}", 400, "priority", NULL},
    {false, "{\"prompt\": \"a\", \"ignore_eos\": 1}", 400, "ignore_eos", NULL},
    {false, "{\"prompt\": \"a\", \"logit_bias\": {\"5\": 101}}", 400, "logit_bias", NULL},
    {false, "{\"prompt\": \"a\", \"logit_bias\": {\"5\": \"1\"}}", 400, "logit_bias", NULL},
    {false, "{\"prompt\": \"a\", \"logit_bias\": {\"abc\": 1}}", 400, "logit_bias", NULL},
    {false, "{\"prompt\": \"a\", \"logit_bias\": {\"512\": 1}}", 400, "logit_bias", NULL},
    {false, "{\"prompt\": \"a\", \"logit_bias\": {\"-1\": 1}}", 400, "logit_bias", NULL},
    {false, "{\"prompt\": \"a\", \"logit_bias\": {\"\": 1}}", 400, "logit_bias", NULL},
    {false, "{\"prompt\": \"a\", \"logit_bias\": [1]}", 400, "logit_bias", NULL},
    {false, "{\"prompt\": \"a\", \"stop\": 5}", 400, "stop", NULL},
    {false, "{\"prompt\": \"a\", \"stop\": [1]}", 400, "stop", NULL},
    {false,
     "{\"prompt\": \"a\", \"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\","
     "\"13\",\"14\",\"15\",\"16\",\"17\"]}",
     400, "stop", NULL},
    {false, "{\"prompt\": \"a\", \"model\": \"other\"}", 404, "model", "model_not_found"},
    {false, "{\"prompt\": \"a\", \"model\": 5}", 400, "model", NULL},
    {false, "{\"prompt\": \"a\", \"stream\": \"yes\"}", 400, "stream", NULL},
    {false, "{\"prompt\": \"a\", \"stream_options\": {\"include_usage\": true}}", 400, "stream_options", NULL},
    {false, "{\"prompt\": \"a\", \"stream\": true, \"stream_options\": 1}", 400, "stream_options", NULL},
    {false, "{\"prompt\": \"a\", \"stream\": true, \"stream_options\": {\"include_usage\": 1}}", 400, "include_usage",
     NULL},
    {false, "{\"prompt\": \"a\", \"logprobs\": 6}", 400, "logprobs", NULL},
    {false, "{\"prompt\": \"a\", \"logprobs\": true}", 400, "logprobs", NULL},
    {false, "{\"prompt\": \"a\", \"echo\": true, \"logprobs\": 1}", 400, "echo", NULL},
    {false, "{\"prompt\": \"a\", \"echo\": \"no\"}", 400, "echo", NULL},
    {false, "{\"prompt\": \"a\", \"suffix\": \"b\"}", 400, "suffix", NULL},
    {false, "{\"prompt\": \"a\", \"best_of\": 3}", 400, "best_of", NULL},
    {false, "{\"prompt\": \"a\", \"user\": 5}", 400, "user", NULL},
    {false, "{\"prompt\": \"a\", \"max_tokens\": 100}", 0, "max_tokens", NULL}, /* fits: 2 + 100 <= 128 */
    {true, "{}", 400, "messages", NULL},
    {true, "{\"prompt\": \"a\"}", 400, "messages", NULL},
    {true, "{\"messages\": \"hi\"}", 400, "messages", NULL},
    {true, "{\"messages\": []}", 400, "messages", NULL},
    {true, "{\"messages\": [5]}", 400, "messages", NULL},
    {true, "{\"messages\": [{\"content\": \"x\"}]}", 400, "messages[0].role", NULL},
    {true, "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}", 400, "messages[0].role", NULL},
    {true, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 400, "messages[0].content", NULL},
    {true,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": "
     "[{\"type\": \"image_url\", \"image_url\": {\"url\": \"x\"}}]}]}",
     400, "messages[1].content", NULL},
    {true, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]}", 400, "messages[0].content",
     NULL},
    {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"top_logprobs\": 3}", 400, "top_logprobs",
     NULL},
    {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"logprobs\": true, \"top_logprobs\": 21}", 400,
     "top_logprobs", NULL},
    {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"logprobs\": 2}", 400, "logprobs", NULL},
    {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": [{\"type\": \"function\"}]}", 400,
     "tools", NULL},
    {true,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"response_format\": {\"type\": "
     "\"xml\"}}",
     400, "response_format", NULL},
    {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"max_completion_tokens\": 0}", 400,
     "max_completion_tokens", NULL},
    {true, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"model\": \"x\"}", 404, "model",
     "model_not_found"},
};

static void test_bad_bodies(void) {
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        const bad_case *b = &BAD[i];
        lm_server_request r;
        lm_server_error e;
        int rc = parse(b->chat, b->body, &r, &e);
        if (b->status == 0) {
            CHECKF(rc == 0, "case %zu (%s): %s", i, b->body, e.message);
            server_request_free(&r);
            continue;
        }
        CHECKF(rc == -1, "case %zu (%s) was accepted", i, b->body);
        CHECKF(e.status == b->status, "case %zu (%s): status %d, want %d (%s)", i, b->body, e.status, b->status,
               e.message);
        CHECKF(!strcmp(e.param, b->param), "case %zu (%s): param '%s', want '%s' (%s)", i, b->body, e.param, b->param,
               e.message);
        CHECKF(!b->code || !strcmp(e.code, b->code), "case %zu: code '%s', want '%s'", i, e.code, b->code);
        CHECKF(e.message[0] && !strcmp(e.type, "invalid_request_error"), "case %zu: type '%s'", i, e.type);
        CHECK(r.n_prompts == 0 && r.prompts == NULL && r.p.n_stop == 0);
    }
}

/* Prompt past the context: 400 context_length_exceeded, on the right field. */
static void test_context_limits(void) {
    char body[4096];
    char prompt[2048] = "";
    for (int i = 0; i < 60; i++) strcat(prompt, "Once upon ");
    lm_server_request r;
    lm_server_error e;
    /* 122 tokens: with the default 16 the prompt is to blame */
    snprintf(body, sizeof body, "{\"prompt\": \"%s\"}", prompt);
    CHECK(parse(false, body, &r, &e) == -1);
    CHECKF(e.status == 400 && !strcmp(e.code, "context_length_exceeded") && !strcmp(e.param, "prompt"), "%d %s %s %s",
           e.status, e.code, e.param, e.message);
    /* 202 tokens: past the context on its own */
    for (int i = 0; i < 40; i++) strcat(prompt, "Once upon ");
    snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 1}", prompt);
    CHECK(parse(false, body, &r, &e) == -1);
    CHECKF(e.status == 400 && !strcmp(e.code, "context_length_exceeded") && !strcmp(e.param, "prompt"), "%d %s %s %s",
           e.status, e.code, e.param, e.message);
    /* 40 tokens: fits, but not with 100 more */
    prompt[0] = 0;
    for (int i = 0; i < 20; i++) strcat(prompt, "Once upon ");
    int32_t ids[256];
    int n = encode(prompt, ids, 256);
    CHECK(n > 28 && n < 100);
    snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": %d}", prompt, 128 - n);
    CHECKF(parse(false, body, &r, &e) == 0, "%s", e.message);
    CHECK(r.p.max_tokens == 128 - n);
    server_request_free(&r);
    snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": %d}", prompt, 129 - n);
    CHECK(parse(false, body, &r, &e) == -1);
    CHECK(e.status == 400 && !strcmp(e.code, "context_length_exceeded") && !strcmp(e.param, "max_tokens"));
    /* chat: the rest of the context, or 400 when nothing is left */
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"%s%s%s\"}]}", prompt, prompt,
             prompt);
    CHECK(parse(true, body, &r, &e) == -1);
    CHECK(e.status == 400 && !strcmp(e.param, "messages") && !strcmp(e.code, "context_length_exceeded"));
}

/* One context rule: for token prompts of every interesting length and
 * max_tokens given or not, the parser accepts exactly when the engine's
 * engine_fit_context does, with the same max_tokens; a cap bounds the
 * default without breaking the context; n above the engine's sequences is a
 * 400 about n. */
static void test_context_rule(void) {
    static const int lens[] = {1, 60, 100, 112, 113, 127, 128, 129};
    char body[2048];
    lm_server_request r;
    lm_server_error e;
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        int k = lens[li];
        int mts[] = {0, 1, 16, 127 - k, 128 - k, 129 - k};
        for (size_t mi = 0; mi < sizeof mts / sizeof *mts; mi++) {
            int mt = mts[mi];
            if (mt < 0 || mt > ctx.max_tokens_cap) continue;
            int w = snprintf(body, sizeof body, "{\"prompt\": [1");
            for (int i = 1; i < k; i++) w += snprintf(body + w, sizeof body - (size_t)w, ", 5");
            if (mt) snprintf(body + w, sizeof body - (size_t)w, "], \"max_tokens\": %d}", mt);
            else snprintf(body + w, sizeof body - (size_t)w, "]}");
            int fit = -1;
            lm_status want = engine_fit_context(ctx.n_ctx, k, mt ? mt : 16, &fit);
            int rc = parse(false, body, &r, &e);
            CHECKF((rc == 0) == (want == LM_OK), "prompt %d, max_tokens %d: parser %d, engine %d", k, mt, rc, want);
            if (rc == 0) CHECKF(r.p.max_tokens == fit, "prompt %d: %d vs %d", k, r.p.max_tokens, fit);
            else CHECK(e.status == 400 && !strcmp(e.code, "context_length_exceeded"));
            server_request_free(&r);
        }
    }
    CHECK(engine_fit_context(128, 100, -1, NULL) == LM_OK && engine_fit_context(128, 128, -1, NULL) == LM_ERR_TOO_LONG);
    int fit = 0;
    CHECK(engine_fit_context(128, 100, -1, &fit) == LM_OK && fit == 28);
    CHECK(engine_fit_context(128, 100, 29, &fit) == LM_ERR_TOO_LONG);
    /* the cap bounds the default (16 -> 8), so 120 + 8 still fits */
    ctx.max_tokens_cap = 8;
    int w = snprintf(body, sizeof body, "{\"prompt\": [1");
    for (int i = 1; i < 120; i++) w += snprintf(body + w, sizeof body - (size_t)w, ", 5");
    snprintf(body + w, sizeof body - (size_t)w, "]}");
    int rc = parse(false, body, &r, &e);
    ctx.max_tokens_cap = 100;
    CHECKF(rc == 0 && r.p.max_tokens == 8, "%s", e.message);
    server_request_free(&r);
    /* n within max_n but above the engine's sequences */
    ctx.max_seqs = 2;
    rc = parse(false, "{\"prompt\": \"a\", \"n\": 3}", &r, &e);
    int rc2 = parse(false, "{\"prompt\": \"a\", \"n\": 2}", &r, &e);
    ctx.max_seqs = 0;
    server_request_free(&r);
    CHECK(rc == -1 && rc2 == 0);
    rc = parse(false, "{\"prompt\": \"a\", \"n\": 3}", &r, &e);
    server_request_free(&r);
    CHECK(rc == 0);
    ctx.max_seqs = 2;
    parse(false, "{\"prompt\": \"a\", \"n\": 3}", &r, &e);
    ctx.max_seqs = 0;
    CHECK(e.status == 400 && !strcmp(e.param, "n"));
    /* prompts x n counts: 3 prompts of n 1 fill 3 sequences, 2 prompts of n 2 four */
    ctx.max_seqs = 3;
    int rc3 = parse(false, "{\"prompt\": [\"a\", \"b\", \"c\"]}", &r, &e);
    server_request_free(&r);
    int rc4 = parse(false, "{\"prompt\": [\"a\", \"b\"], \"n\": 2}", &r, &e);
    bool n_named = rc4 == -1 && e.status == 400 && !strcmp(e.param, "n") && strstr(e.message, "4 sequences");
    int rc5 = parse(false, "{\"prompt\": [\"a\", \"b\", \"c\", \"d\"]}", &r, &e);
    bool prompt_named = rc5 == -1 && !strcmp(e.param, "prompt");
    ctx.max_seqs = 0;
    CHECK(rc3 == 0 && n_named && prompt_named);
}

static void test_utf8(void) {
    CHECK(utf8_valid("", 0));
    CHECK(utf8_valid("abc \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 15));
    CHECK(!utf8_valid("\xc3", 1));             /* truncated */
    CHECK(!utf8_valid("\xc0\x80", 2));         /* overlong NUL */
    CHECK(!utf8_valid("\xe0\x80\xaf", 3));     /* overlong */
    CHECK(!utf8_valid("\xed\xbf\xbf", 3));     /* surrogate */
    CHECK(!utf8_valid("\xf4\x90\x80\x80", 4)); /* past U+10FFFF */
    CHECK(!utf8_valid("\x80", 1));
    CHECK(!utf8_valid("\xfe", 1));
    CHECK(utf8_valid("\xf4\x8f\xbf\xbf", 4));
}

/* Deeply nested JSON is refused (cJSON's depth limit), without a crash. */
static void test_nesting(void) {
    size_t depth = 5000;
    char *body = malloc(2 * depth + 32);
    CHECK(body);
    size_t w = (size_t)sprintf(body, "{\"prompt\": ");
    for (size_t i = 0; i < depth; i++) body[w++] = '[';
    for (size_t i = 0; i < depth; i++) body[w++] = ']';
    body[w++] = '}';
    body[w] = 0;
    lm_server_request r;
    lm_server_error e;
    int rc = parse(false, body, &r, &e);
    free(body);
    CHECK(rc == -1 && e.status == 400);
}

/* Every allocation made to fail in turn: a clean error each time, then success. */
static void test_alloc_failure(void) {
    const char *bodies[2] = {
        "{\"prompt\": [\"Once upon\", \"a time\"], \"stop\": [\"x\", \"y\"], \"logit_bias\": {\"3\": 1}, \"echo\": "
        "true}",
        "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": [{\"type\": "
        "\"text\", \"text\": \"hi\"}]}], \"stop\": \"q\"}"};
    for (int b = 0; b < 2; b++) {
        bool ok = false;
        for (long k = 0; k < 500 && !ok; k++) {
            lm_server_request r;
            lm_server_error e;
            lm_alloc_fail_after(k);
            int rc = parse(b == 1, bodies[b], &r, &e);
            lm_alloc_fail_after(-1);
            if (rc == 0) {
                ok = true;
                server_request_free(&r);
            } else {
                CHECKF(e.status == 500 || e.status == 400, "fail after %ld: status %d", k, e.status);
                CHECK(r.n_prompts == 0 && r.prompts == NULL);
            }
        }
        CHECK(ok);
    }
}

/* ------------------------------------------------- structured outputs */

/* response_format, grammar, json_schema on both routes: a grammar on the
 * request, checked; errors name the field. */
static void test_format_fields(void) {
    lm_server_request r;
    lm_server_error e;
    static const struct {
        bool chat;
        const char *body;
    } ok[] = {
        {false, "{\"prompt\": \"a\", \"response_format\": {\"type\": \"json_object\"}}"},
        {true, "{" CHAT_A ", \"response_format\": {\"type\": \"json_object\"}}"},
        {true,
         "{" CHAT_A ", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", "
         "\"schema\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}, \"strict\": true}}}"},
        {false,
         "{\"prompt\": \"a\", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", "
         "\"schema\": {\"type\": \"string\"}}}}"},
        {false, "{\"prompt\": \"a\", \"grammar\": \"root ::= \\\"yes\\\" | \\\"no\\\"\"}"},
        {true, "{" CHAT_A ", \"json_schema\": {\"type\": \"array\", \"items\": {\"type\": \"boolean\"}}}"},
        {true, "{" CHAT_A ", \"response_format\": {\"type\": \"text\"}, \"grammar\": \"root ::= [a-z]+\"}"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        CHECKF(parse(ok[i].chat, ok[i].body, &r, &e) == 0, "case %zu: %s", i, e.message);
        CHECKF(r.grammar && r.grammar[0] && !r.n_grammar_triggers && !r.tool_calls, "case %zu", i);
        server_request_free(&r);
    }
    CHECK(parse(false, "{\"prompt\": \"a\", \"grammar\": \"root ::= [a-z]+\"}", &r, &e) == 0);
    CHECK(!strcmp(r.grammar, "root ::= [a-z]+"));
    server_request_free(&r);
    /* no constraint: no grammar */
    CHECK(parse(true, "{" CHAT_A ", \"response_format\": {\"type\": \"text\"}}", &r, &e) == 0 && !r.grammar);
    server_request_free(&r);
    static const struct {
        bool chat;
        const char *body, *param, *needle;
    } bad[] = {
        {false, "{\"prompt\": \"a\", \"grammar\": \"root ::= \\\"x\"}", "grammar", "line"},
        {false, "{\"prompt\": \"a\", \"grammar\": \"\"}", "grammar", "grammar"},
        {false, "{\"prompt\": \"a\", \"grammar\": 5}", "grammar", "grammar"},
        {true, "{" CHAT_A ", \"grammar\": \"root ::= undefined-rule\"}", "grammar", "undefined-rule"},
        {true, "{" CHAT_A ", \"json_schema\": {\"type\": \"object\", \"notAKeyword\": 1}}", "json_schema",
         "notAKeyword"},
        {true, "{" CHAT_A ", \"json_schema\": 3}", "json_schema", "object"},
        {true,
         "{" CHAT_A ", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", "
         "\"schema\": {\"type\": \"object\", \"notAKeyword\": 1}}}}",
         "response_format", "notAKeyword"},
        {true, "{" CHAT_A ", \"response_format\": {\"type\": \"json_schema\"}}", "response_format", "json_schema"},
        {true, "{" CHAT_A ", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"strict\": 1}}}",
         "response_format", "strict"},
        {true, "{" CHAT_A ", \"response_format\": \"json\"}", "response_format", "type"},
        {true, "{" CHAT_A ", \"response_format\": {\"type\": \"json_object\"}, \"grammar\": \"root ::= \\\"a\\\"\"}",
         "grammar", "only one"},
        {true, "{" CHAT_A ", \"grammar\": \"root ::= \\\"a\\\"\", \"json_schema\": {}}", "json_schema", "only one"},
        {true, "{" CHAT_A ", " TOOLS ", \"response_format\": {\"type\": \"json_object\"}}", "tools", "tool_choice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = parse(bad[i].chat, bad[i].body, &r, &e);
        CHECKF(rc == -1 && e.status == 400 && !strcmp(e.param, bad[i].param),
               "case %zu: rc %d, status %d, param %s (%s)", i, rc, e.status, e.param, e.message);
        CHECKF(strstr(e.message, bad[i].needle), "case %zu: '%s' does not name '%s'", i, e.message, bad[i].needle);
        CHECK(!r.grammar && !r.prompts);
    }
    /* tool_choice none: the JSON format is allowed beside the tools */
    ctx.n_ctx = 4096;
    int rc = parse(true,
                   "{" CHAT_A ", " TOOLS ", \"tool_choice\": \"none\", \"response_format\": {\"type\": "
                   "\"json_object\"}}",
                   &r, &e);
    ctx.n_ctx = 128;
    CHECKF(rc == 0 && r.grammar && !r.tool_calls, "%s", e.message);
    server_request_free(&r);
}

/* The prompt the parser made equals chat_apply_tools' for the same
 * conversation and tools. */
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

static void test_tool_fields(void) {
    lm_server_request r;
    lm_server_error e;
    ctx.n_ctx = 4096;
    ctx.max_tokens_cap = 0;
    const char *tool_json[2] = {
        "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"d\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}",
        "{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}"};
    lm_chat_xmsg user_a[] = {{"user", "a", NULL, 0, NULL, NULL}};
    /* auto (the default): a lazy grammar from the opener on, the tools in the prompt */
    int rc = parse(true, "{" CHAT_A ", " TOOLS "}", &r, &e);
    CHECKF(rc == 0, "%s", e.message);
    CHECK(r.tool_calls && r.tool_syntax == CHAT_TOOLS_HERMES && r.grammar && r.n_grammar_triggers == 1 &&
          !strcmp(r.grammar_triggers[0], "<tool_call>"));
    CHECK(strstr(r.grammar, "\\\"get_weather\\\"") && strstr(r.grammar, "\\\"get_time\\\"") &&
          strstr(r.grammar, "t0-root"));
    CHECK(strstr(r.grammar, "(tc-ws tc-call)*")); /* parallel by default */
    CHECK(same_prompt(&r, CHAT_CHATML, user_a, 1, tool_json, 2));
    server_request_free(&r);
    /* required, without parallel calls: from the first token, one call */
    CHECK(parse(true, "{" CHAT_A ", " TOOLS ", \"tool_choice\": \"required\", \"parallel_tool_calls\": false}", &r,
                &e) == 0);
    CHECK(r.tool_calls && r.grammar && !r.n_grammar_triggers && !strstr(r.grammar, "(tc-ws tc-call)*"));
    server_request_free(&r);
    /* a named function: only that one */
    CHECK(parse(true,
                "{" CHAT_A ", " TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
                "\"get_time\"}}}",
                &r, &e) == 0);
    CHECK(r.tool_calls && !r.n_grammar_triggers && strstr(r.grammar, "\\\"get_time\\\"") &&
          !strstr(r.grammar, "get_weather"));
    server_request_free(&r);
    /* none: tools in the prompt, no grammar, no reading of calls */
    CHECK(parse(true, "{" CHAT_A ", " TOOLS ", \"tool_choice\": \"none\"}", &r, &e) == 0);
    CHECK(!r.tool_calls && !r.grammar && same_prompt(&r, CHAT_CHATML, user_a, 1, tool_json, 2));
    server_request_free(&r);
    /* empty tools: as none given */
    CHECK(parse(true, "{" CHAT_A ", \"tools\": []}", &r, &e) == 0 && !r.tool_calls && !r.grammar);
    server_request_free(&r);
    /* a round trip: the call and its result rendered by the template */
    const char *trip =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": "
        "null, \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": "
        "\"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"UTC\\\"}\"}}]}, {\"role\": \"tool\", "
        "\"tool_call_id\": \"call_1\", \"content\": \"12:00\"}], " TOOLS "}";
    CHECKF(parse(true, trip, &r, &e) == 0, "%s", e.message);
    lm_chat_call call = {"call_1", "get_time", "{\"tz\": \"UTC\"}"};
    lm_chat_xmsg conv[] = {{"user", "a", NULL, 0, NULL, NULL},
                           {"assistant", "", &call, 1, NULL, NULL},
                           {"tool", "12:00", NULL, 0, "call_1", NULL}};
    CHECK(same_prompt(&r, CHAT_CHATML, conv, 3, tool_json, 2));
    server_request_free(&r);
    /* the family picks the syntax and the trigger */
    static const struct {
        int family;
        const char *trigger;
        int syntax;
    } fams[] = {{CHAT_LLAMA3, "{\"name\"", CHAT_TOOLS_LLAMA3},
                {CHAT_MISTRAL_V3, "[TOOL_CALLS]", CHAT_TOOLS_MISTRAL},
                {CHAT_GEMMA, "<tool_call>", CHAT_TOOLS_HERMES}};
    for (size_t i = 0; i < sizeof fams / sizeof *fams; i++) {
        ctx.chat_family = fams[i].family;
        rc = parse(true, "{" CHAT_A ", " TOOLS "}", &r, &e);
        ctx.chat_family = CHAT_CHATML;
        CHECKF(rc == 0, "family %d: %s", fams[i].family, e.message);
        CHECK(r.tool_syntax == fams[i].syntax && !strcmp(r.grammar_triggers[0], fams[i].trigger));
        CHECK(r.n_grammar_triggers == (fams[i].syntax == CHAT_TOOLS_MISTRAL ? 2 : 1));
        CHECK(same_prompt(&r, fams[i].family, user_a, 1, tool_json, 2));
        server_request_free(&r);
    }
    ctx.n_ctx = 128;
    ctx.max_tokens_cap = 100;
    static const struct {
        const char *body, *param, *needle;
    } bad[] = {
        {"{" CHAT_A ", " TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"nope\"}}}",
         "tool_choice", "nope"},
        {"{" CHAT_A ", " TOOLS ", \"tool_choice\": \"sometimes\"}", "tool_choice", "sometimes"},
        {"{" CHAT_A ", " TOOLS ", \"tool_choice\": {\"type\": \"function\"}}", "tool_choice", "tool_choice"},
        {"{" CHAT_A ", \"tool_choice\": \"required\"}", "tool_choice", "tools"},
        {"{" CHAT_A ", " TOOLS ", \"parallel_tool_calls\": 1}", "parallel_tool_calls", "boolean"},
        {"{" CHAT_A ", \"tools\": {}}", "tools", "array"},
        {"{" CHAT_A ", \"tools\": [{\"type\": \"retrieval\"}]}", "tools", "function"},
        {"{" CHAT_A ", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]}", "tools", "name"},
        {"{" CHAT_A ", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": 1}}]}",
         "tools", "parameters"},
        {"{" CHAT_A ", \"tools\": [" TOOL_T ", " TOOL_T "]}", "tools", "twice"},
        {"{" CHAT_A ", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
         "{\"type\": \"object\", \"notAKeyword\": 1}}}]}",
         "tools", "notAKeyword"},
        {"{" CHAT_A ", \"functions\": [{\"name\": \"f\"}]}", "functions", "tools"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"tool\", \"content\": \"x\"}]}",
         "messages[1].role", "tool_calls"},
        {"{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": 5}]}", "messages[0].tool_calls", "array"},
        {"{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": 1}}]}]}",
         "messages[0].tool_calls", "name"},
        {"{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"x\", \"function\": {\"name\": \"f\", "
         "\"arguments\": {}}}]}]}",
         "messages[0].tool_calls", "arguments"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        rc = parse(true, bad[i].body, &r, &e);
        CHECKF(rc == -1 && e.status == 400 && !strcmp(e.param, bad[i].param),
               "case %zu: rc %d, status %d, param %s (%s)", i, rc, e.status, e.param, e.message);
        CHECKF(strstr(e.message, bad[i].needle), "case %zu: '%s' does not name '%s'", i, e.message, bad[i].needle);
        CHECK(!r.grammar && !r.prompts && !r.n_grammar_triggers);
    }
}

/* ------------------------------------------------------ reading calls */

typedef struct {
    strbuf content;
    int n_calls;
    char names[8][64];
    strbuf args[8];
    bool bad; /* events out of order */
} calls_read;

static void read_events(calls_read *cr, srv_tc_out *o) {
    strbuf_put(&cr->content, o->content.p ? o->content.p : "", o->content.len);
    for (int k = 0; k < o->n; k++) {
        srv_tc_ev *v = &o->ev[k];
        if (v->name) {
            if (v->index != cr->n_calls || cr->n_calls == 8) cr->bad = true;
            else snprintf(cr->names[cr->n_calls++], 64, "%s", v->name);
        } else if (v->index != cr->n_calls - 1) {
            cr->bad = true;
        } else {
            strbuf_put(&cr->args[v->index], v->args, v->args_len);
        }
    }
    srv_tc_out_free(o);
}

/* The text fed in pieces of `step` bytes (0: whole); raw: the xml syntax's
 * text parameters (lm_server_request.tool_strings) or NULL. */
static void read_calls_raw(int syntax, const char *raw, const char *text, size_t step, calls_read *cr) {
    memset(cr, 0, sizeof *cr);
    srv_tc t;
    srv_tc_init(&t, syntax, raw);
    size_t n = strlen(text);
    if (step == 0) step = n ? n : 1;
    for (size_t at = 0;; at += step) {
        size_t k = at < n ? (n - at < step ? n - at : step) : 0;
        srv_tc_out o = {0};
        srv_tc_feed(&t, text + at, k, at + k >= n, &o);
        read_events(cr, &o);
        if (at + k >= n) break;
    }
    srv_tc_free(&t);
}

static void read_calls(int syntax, const char *text, size_t step, calls_read *cr) {
    read_calls_raw(syntax, NULL, text, step, cr);
}

static void calls_read_free(calls_read *cr) {
    strbuf_free(&cr->content);
    for (int i = 0; i < 8; i++) strbuf_free(&cr->args[i]);
}

/* chat_template_kwargs.enable_thinking: false appends Qwen3's empty reasoning
 * block to the prompt; true, absent, other keys and other families change
 * nothing; a wrong type is a 400. */
static void test_thinking_switch(void) {
    lm_server_request r;
    lm_server_error e;
    ctx.n_ctx = 4096;
    lm_chat_xmsg user_a[] = {{"user", "a", NULL, 0, NULL, NULL}};
    static const char *same_bodies[] = {
        "{" CHAT_A "}",
        "{" CHAT_A ", \"chat_template_kwargs\": {\"enable_thinking\": true}}",
        "{" CHAT_A ", \"chat_template_kwargs\": {\"other\": 1}}",
        "{" CHAT_A ", \"chat_template_kwargs\": null}",
    };
    ctx.chat_family = CHAT_QWEN3;
    for (size_t i = 0; i < sizeof same_bodies / sizeof *same_bodies; i++) {
        int rc = parse(true, same_bodies[i], &r, &e);
        CHECKF(rc == 0, "%s", e.message);
        CHECKF(same_prompt(&r, CHAT_QWEN3, user_a, 1, NULL, 0), "body %zu", i);
        server_request_free(&r);
    }
    /* off: the prompt is the thinking-on one plus "<think>\n\n</think>\n\n" */
    int rc = parse(true, "{" CHAT_A ", \"chat_template_kwargs\": {\"enable_thinking\": false}}", &r, &e);
    CHECKF(rc == 0, "%s", e.message);
    char *text = NULL, err[LM_ERRLEN];
    bool add_bos;
    CHECK(chat_apply(CHAT_QWEN3, NULL, tok, (const lm_chat_msg[]){{"user", "a"}}, 1, &text, &add_bos, err,
                     sizeof err) == 0);
    char full[256];
    snprintf(full, sizeof full, "%s<think>\n\n</think>\n\n", text);
    lm_free(text);
    int32_t ids[512];
    int k = tok_encode(tok, full, strlen(full), add_bos, true, ids, 512);
    CHECK(k > 0 && r.n_prompts == 1 && r.n_prompt[0] == k && !memcmp(ids, r.prompts[0], (size_t)k * sizeof *ids));
    server_request_free(&r);
    /* the same template text read from a file (chat_detect) */
    ctx.chat_family = -1;
    ctx.chat_template = "{{ '<|im_start|>' + message.role }}{{ '</think>' }}";
    rc = parse(true, "{" CHAT_A ", \"chat_template_kwargs\": {\"enable_thinking\": false}}", &r, &e);
    CHECKF(rc == 0, "%s", e.message);
    CHECK(r.n_prompt[0] == k && !memcmp(ids, r.prompts[0], (size_t)k * sizeof *ids));
    server_request_free(&r);
    ctx.chat_template = NULL;
    /* families without the switch ignore it */
    ctx.chat_family = CHAT_CHATML;
    rc = parse(true, "{" CHAT_A ", \"chat_template_kwargs\": {\"enable_thinking\": false}}", &r, &e);
    CHECKF(rc == 0, "%s", e.message);
    CHECK(same_prompt(&r, CHAT_CHATML, user_a, 1, NULL, 0));
    server_request_free(&r);
    /* wrong types: 400 naming the field */
    static const char *bad[] = {
        "{" CHAT_A ", \"chat_template_kwargs\": {\"enable_thinking\": \"no\"}}",
        "{" CHAT_A ", \"chat_template_kwargs\": [false]}",
        "{" CHAT_A ", \"chat_template_kwargs\": \"enable_thinking=false\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        rc = parse(true, bad[i], &r, &e);
        CHECKF(rc == -1 && e.status == 400 && !strcmp(e.param, "chat_template_kwargs"), "bad %zu", i);
    }
    ctx.n_ctx = 128;
}

/* Answers read for calls: content before them, names, the arguments'
 * exact text; the same whatever pieces the text comes in. */
static void test_tool_call_reader(void) {
    static const struct {
        int syntax;
        const char *text, *content;
        int n;
        const char *name[2], *args[2];
    } cases[] = {
        {CHAT_TOOLS_HERMES,
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
         "",
         1,
         {"get_weather"},
         {"{\"city\": \"Paris\"}"}},
        {CHAT_TOOLS_HERMES,
         "Let me see.\n\n<tool_call>{\"name\":\"a\",\"arguments\":{\"x\":[1,{\"y\":\"}\\\"\"}]}}"
         "</tool_call>\n<tool_call> {\"arguments\": {}, \"name\": \"b\"} </tool_call>",
         "Let me see.",
         2,
         {"a", "b"},
         {"{\"x\":[1,{\"y\":\"}\\\"\"}]}", "{}"}},
        {CHAT_TOOLS_HERMES,
         "no call here, only <tool talk> and <tool_cal",
         "no call here, only <tool talk> and <tool_cal",
         0,
         {0},
         {0}},
        {CHAT_TOOLS_HERMES,
         "  spaces kept when no call follows  \n",
         "  spaces kept when no call follows  \n",
         0,
         {0},
         {0}},
        {CHAT_TOOLS_HERMES, "<tool_call>{\"name\": \"f\"}</tool_call>", "", 1, {"f"}, {"{}"}},
        {CHAT_TOOLS_HERMES,
         "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>trailing ignored",
         "",
         1,
         {"f"},
         {"{\"a\": 1}"}},
        {CHAT_TOOLS_HERMES, "<tool_call>not json</tool_call>", "", 0, {0}, {0}},
        {CHAT_TOOLS_HERMES,
         "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": [1, 2",
         "",
         1,
         {"f"},
         {"{\"a\": [1, 2"}},
        {CHAT_TOOLS_LLAMA3,
         "{\"name\": \"get_time\", \"parameters\": {\"tz\": \"UTC\"}}",
         "",
         1,
         {"get_time"},
         {"{\"tz\": \"UTC\"}"}},
        {CHAT_TOOLS_LLAMA3,
         "Sure.\n{\"name\": \"a\", \"parameters\": {}}\n{\"name\": \"b\", \"parameters\": {\"k\": 2.5e1}}",
         "Sure.",
         2,
         {"a", "b"},
         {"{}", "{\"k\": 2.5e1}"}},
        {CHAT_TOOLS_MISTRAL,
         "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"q\": \"x\"}}, {\"name\": \"b\", "
         "\"arguments\": {}}]",
         "",
         2,
         {"a", "b"},
         {"{\"q\": \"x\"}", "{}"}},
        {CHAT_TOOLS_MISTRAL, "[TOOL_CALL] [x]", "[TOOL_CALL] [x]", 0, {0}, {0}},
        /* [TOOL_CALLS] as a control token leaves no text: the array opens the calls */
        {CHAT_TOOLS_MISTRAL, "Sure. [{\"name\": \"a\", \"arguments\": {\"q\": 1}}]", "Sure.", 1, {"a"}, {"{\"q\": 1}"}},
        {CHAT_TOOLS_MISTRAL, "a [list] of [{things}]", "a [list] of [{things}]", 0, {0}, {0}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t n = strlen(cases[i].text);
        for (size_t step = 0; step <= n; step += step < 4 ? 1 : 7) {
            calls_read cr;
            read_calls(cases[i].syntax, cases[i].text, step, &cr);
            bool ok =
                !cr.bad && cr.n_calls == cases[i].n && !strcmp(cr.content.p ? cr.content.p : "", cases[i].content);
            for (int k = 0; ok && k < cr.n_calls; k++)
                ok = !strcmp(cr.names[k], cases[i].name[k]) &&
                    !strcmp(cr.args[k].p ? cr.args[k].p : "", cases[i].args[k]);
            if (!ok) {
                fprintf(stderr, "case %zu step %zu: content '%s', %d calls", i, step, cr.content.p ? cr.content.p : "",
                        cr.n_calls);
                for (int k = 0; k < cr.n_calls; k++) fprintf(stderr, " %s(%s)", cr.names[k], cr.args[k].p);
                fprintf(stderr, "\n");
            }
            calls_read_free(&cr);
            CHECK(ok);
        }
    }
    /* ids: OpenAI's shape, 9 characters for Mistral's template, different per call and choice */
    char a[40], b[40], c[40], d[40];
    srv_tc_call_id("chatcmpl-1", 0, 0, CHAT_TOOLS_HERMES, a, sizeof a);
    srv_tc_call_id("chatcmpl-1", 0, 1, CHAT_TOOLS_HERMES, b, sizeof b);
    srv_tc_call_id("chatcmpl-1", 1, 0, CHAT_TOOLS_HERMES, c, sizeof c);
    srv_tc_call_id("chatcmpl-1", 0, 0, CHAT_TOOLS_MISTRAL, d, sizeof d);
    CHECK(!strncmp(a, "call_", 5) && strlen(a) == 29 && strcmp(a, b) && strcmp(a, c) && strcmp(b, c));
    CHECK(strlen(d) == 9);
    for (const char *p = d; *p; p++)
        CHECK((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9'));
}

/* A call that repeats an earlier one of the same answer (its name, and its
 * arguments but for blanks between JSON tokens) is dropped, whole and
 * streamed in any pieces, before any of it is sent; the indices of the calls
 * kept stay consecutive. Calls that differ in their arguments, even only
 * inside a string, by a longer number or by the order of keys, all come out;
 * a repeat cut short by the end of the text is dropped too, a cut call that
 * already differs is not. */
static void test_tool_call_repeats(void) {
#define TC(n, a) "<tool_call>\n{\"name\": \"" n "\", \"arguments\": " a "}\n</tool_call>"
    static const struct {
        int syntax;
        const char *text;
        int n;
        const char *name[3], *args[3];
    } cases[] = {
        /* the same call twice, three times: once */
        {CHAT_TOOLS_HERMES, TC("f", "{\"a\": 1}") "\n" TC("f", "{\"a\": 1}"), 1, {"f"}, {"{\"a\": 1}"}},
        {CHAT_TOOLS_HERMES,
         TC("get_time", "{ \"tz\" : \"CET\" }") TC("get_time", "{ \"tz\" :\"CET\"\n     }")
             TC("get_time", "{\"tz\":\"CET\"}"),
         1,
         {"get_time"},
         {"{ \"tz\" : \"CET\" }"}},
        /* a repeat between two calls, or before a new one: the indices stay consecutive */
        {CHAT_TOOLS_HERMES,
         TC("f", "{\"a\": 1}") TC("g", "{\"a\": 1}") TC("f", "{\"a\": 1}"),
         2,
         {"f", "g"},
         {"{\"a\": 1}", "{\"a\": 1}"}},
        {CHAT_TOOLS_HERMES,
         TC("f", "{\"a\": 1}") TC("f", "{\"a\": 1}") TC("f", "{\"a\": 2}"),
         2,
         {"f", "f"},
         {"{\"a\": 1}", "{\"a\": 2}"}},
        /* different arguments: every call, whichever is the other's start */
        {CHAT_TOOLS_HERMES,
         TC("f", "{\"a\": 1}") TC("f", "{\"a\": 12}") TC("f", "{\"a\": 1, \"b\": 2}"),
         3,
         {"f", "f", "f"},
         {"{\"a\": 1}", "{\"a\": 12}", "{\"a\": 1, \"b\": 2}"}},
        {CHAT_TOOLS_HERMES, TC("f", "{\"a\": 12}") TC("f", "{\"a\": 1}"), 2, {"f", "f"}, {"{\"a\": 12}", "{\"a\": 1}"}},
        {CHAT_TOOLS_HERMES,
         TC("f", "{\"q\": \"a b\"}") TC("f", "{\"q\": \"ab\"}") TC("f", "{\"q\": \"a \\\" b\"}"),
         3,
         {"f", "f", "f"},
         {"{\"q\": \"a b\"}", "{\"q\": \"ab\"}", "{\"q\": \"a \\\" b\"}"}},
        {CHAT_TOOLS_HERMES,
         TC("f", "{\"a\": 1, \"b\": 2}") TC("f", "{\"b\": 2, \"a\": 1}"),
         2,
         {"f", "f"},
         {"{\"a\": 1, \"b\": 2}", "{\"b\": 2, \"a\": 1}"}},
        /* no arguments is {} */
        {CHAT_TOOLS_HERMES,
         "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{\"name\": \"f\", \"arguments\": { }}</tool_call>",
         1,
         {"f"},
         {"{}"}},
        /* cut short by the end of the text: dropped while it is a repeat's start, kept once it differs */
        {CHAT_TOOLS_HERMES,
         TC("f", "{\"a\": 1}") "\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\"",
         1,
         {"f"},
         {"{\"a\": 1}"}},
        {CHAT_TOOLS_HERMES, TC("f", "{\"a\": 1}") "\n<tool_call>\n{\"name\": \"f\"", 1, {"f"}, {"{\"a\": 1}"}},
        {CHAT_TOOLS_HERMES,
         TC("f", "{\"a\": 1}") "\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"b\"",
         2,
         {"f", "f"},
         {"{\"a\": 1}", "{\"b\""}},
        /* the other syntaxes */
        {CHAT_TOOLS_LLAMA3,
         "{\"name\": \"a\", \"parameters\": {\"k\": 1}}\n{\"name\": \"a\", \"parameters\": {\"k\":1}}\n"
         "{\"name\": \"b\", \"parameters\": {\"k\": 1}}",
         2,
         {"a", "b"},
         {"{\"k\": 1}", "{\"k\": 1}"}},
        {CHAT_TOOLS_MISTRAL,
         "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"a\", \"arguments\": {}}, {\"name\": "
         "\"a\", \"arguments\": {\"q\": 1}}]",
         2,
         {"a", "a"},
         {"{}", "{\"q\": 1}"}},
    };
#undef TC
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t n = strlen(cases[i].text);
        for (size_t step = 0; step <= n; step += step < 4 ? 1 : 5) {
            calls_read cr;
            read_calls(cases[i].syntax, cases[i].text, step, &cr);
            bool ok = !cr.bad && cr.n_calls == cases[i].n && !cr.content.len;
            for (int k = 0; ok && k < cr.n_calls; k++)
                ok = !strcmp(cr.names[k], cases[i].name[k]) &&
                    !strcmp(cr.args[k].p ? cr.args[k].p : "", cases[i].args[k]);
            if (!ok) {
                fprintf(stderr, "case %zu step %zu: %d calls%s", i, step, cr.n_calls, cr.bad ? " (out of order)" : "");
                for (int k = 0; k < cr.n_calls; k++) fprintf(stderr, " %s(%s)", cr.names[k], cr.args[k].p);
                fprintf(stderr, "\n");
            }
            calls_read_free(&cr);
            CHECK(ok);
        }
    }
    /* streamed: nothing of a repeat goes out while it may still be one; a
     * call that turns out different goes out whole (name, then arguments) */
    srv_tc t;
    srv_tc_out o = {0};
    srv_tc_init(&t, CHAT_TOOLS_HERMES, NULL);
    const char *first = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1";
    srv_tc_feed(&t, first, strlen(first), false, &o);
    CHECK(o.n == 2 && o.ev[0].name && !strcmp(o.ev[0].name, "f") && t.cur_named); /* a first call streams */
    srv_tc_out_free(&o);
    const char *more = "}}</tool_call><tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1";
    srv_tc_feed(&t, more, strlen(more), false, &o);
    CHECK(o.n == 1 && o.ev[0].index == 0 && !o.ev[0].name && t.n_calls == 1 && !t.cur_named);
    srv_tc_out_free(&o);
    const char *differs = "2";
    srv_tc_feed(&t, differs, 1, false, &o);
    CHECK(o.n == 2 && o.ev[0].index == 1 && o.ev[0].name && !strcmp(o.ev[1].args, "{\"a\": 12") && t.cur_named);
    srv_tc_out_free(&o);
    srv_tc_feed(&t, "}}</tool_call>", 14, true, &o);
    CHECK(o.n == 1 && o.ev[0].index == 1 && !strcmp(o.ev[0].args, "}") && t.n_calls == 2);
    srv_tc_out_free(&o);
    srv_tc_free(&t);
}

/* The xml syntax (qwen3.5): the grammar holds calls to the tools' typed
 * parameters in the schema's order (text, one-line text with bounds, a
 * choice of strings, JSON of the schema), the text parameters travel with
 * the request, and the reader turns the calls back into JSON arguments,
 * strings for text parameters, whatever pieces the answer comes in. */
static void test_tool_xml(void) {
    lm_server_request r;
    lm_server_error e;
    ctx.n_ctx = 4096;
    ctx.max_tokens_cap = 0;
    ctx.chat_family = CHAT_QWEN35;
    const char *tools =
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": "
        "\"object\", \"properties\": {\"s\": {\"type\": \"string\"}, \"n\": {\"type\": \"integer\"}, \"u\": "
        "{\"enum\": [\"celsius\", \"fahrenheit\"]}, \"b\": {\"type\": \"boolean\"}, \"o\": {\"$ref\": "
        "\"#/$defs/obj\"}, \"l\": {\"type\": \"string\", \"maxLength\": 3}, \"p\": {\"type\": \"string\", "
        "\"pattern\": \"^[a-z]+$\"}}, \"required\": [\"s\", \"n\"], \"$defs\": {\"obj\": {\"type\": "
        "\"object\", \"properties\": {\"k\": {\"type\": \"integer\"}}, \"required\": [\"k\"], "
        "\"additionalProperties\": false}}}}}, " TOOL_T "]";
    char body[2048];
    snprintf(body, sizeof body, "{" CHAT_A ", %s}", tools);
    int rc = parse(true, body, &r, &e);
    CHECKF(rc == 0, "%s", e.message);
    if (rc) return;
    CHECK(r.tool_calls && r.tool_syntax == CHAT_TOOLS_XML && r.n_grammar_triggers == 1 &&
          !strcmp(r.grammar_triggers[0], "<tool_call>"));
    /* f's text parameters s, u, l (p has a pattern: JSON), then get_time's none */
    static const char want_raw[] = "f\0s\0u\0l\0\0get_time\0\0";
    CHECK(r.tool_strings && !memcmp(r.tool_strings, want_raw, sizeof want_raw));
#define CALL(params) "<tool_call>\n<function=f>\n" params "</function>\n</tool_call>"
#define P(k, v) "<parameter=" k ">\n" v "\n</parameter>\n"
    static const struct {
        const char *text;
        bool ok;
    } g[] = {
        {CALL(P("s", "Paris") P("n", "3")), true},
        {CALL(P("s", "a\nb <x> </param\n</parameter") P("n", "-12") P("u", "celsius") P("b", "true")
                  P("o", "{\"k\": 1}") P("l", "abc") P("p", "\"xyz\"")),
         true},
        {CALL(P("s", "") P("n", "0")) "\n" CALL(P("s", "x") P("n", "1")), true},
        {"<tool_call>\n<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</function>\n</tool_call>", true},
        {"<tool_call><function=get_time></function></tool_call>", true},
        {CALL(P("s", "Paris")), false},                          /* n is required */
        {CALL(P("n", "3") P("s", "Paris")), false},              /* the schema's order */
        {CALL(P("s", "a") P("n", "3") P("x", "1")), false},      /* no such parameter */
        {CALL(P("s", "a\n</parameter>\nb") P("n", "3")), false}, /* text ends at its close */
        {CALL(P("s", "a") P("n", "three")), false},
        {CALL(P("s", "a") P("n", "3") P("u", "\"celsius\"")), false}, /* choices are written bare */
        {CALL(P("s", "a") P("n", "3") P("l", "abcd")), false},
        {CALL(P("s", "a") P("n", "3") P("l", "a\nb")), false},
        {CALL(P("s", "a") P("n", "3") P("o", "{}")), false},
        {CALL(P("s", "a") P("n", "3") P("p", "xyz")), false}, /* a pattern: a JSON string */
        {"<tool_call>\n<function=g>\n</function>\n</tool_call>", false},
    };
    for (size_t i = 0; i < sizeof g / sizeof *g; i++)
        CHECKF(grammar_takes(r.grammar, g[i].text) == g[i].ok, "grammar case %zu", i);
    /* read back, in pieces of every size */
    static const struct {
        const char *text, *content;
        int n;
        const char *name[2], *args[2];
    } rd[] = {
        {"Let me check.\n\n" CALL(P("s", "a \"q\"\n\tb\n") P("n", "3") P("u", "celsius") P("b", "true")
                                      P("o", "{\"k\": 1}") P("p", " \"xyz\" ")),
         "Let me check.",
         1,
         {"f"},
         {"{\"s\": \"a \\\"q\\\"\\n\\tb\\n\", \"n\": 3, \"u\": \"celsius\", \"b\": true, \"o\": {\"k\": 1}, \"p\": "
          "\"xyz\"}"}},
        /* untyped parameters: JSON when it parses, Python's True/False/None, else a string */
        {"<tool_call>\n<function=get_time>\n" P("a", "42") P("b", "True") P("c", "None") P("d", "[1, {\"x\": 2}]")
             P("e", "hello world") P("f", "") "</function>\n</tool_call>\n<tool_call>\n<function=f>\n" P("s", "1")
                 P("n", "2") "</function>\n</tool_call>",
         "",
         2,
         {"get_time", "f"},
         {"{\"a\": 42, \"b\": true, \"c\": null, \"d\": [1, {\"x\": 2}], \"e\": \"hello world\", \"f\": \"\"}",
          "{\"s\": \"1\", \"n\": 2}"}},
        /* a value with no line of its own is empty; no parameters: {} */
        {"<tool_call><function=f><parameter=s></parameter></function></tool_call><tool_call><function=get_time>"
         "</function></tool_call>",
         "",
         2,
         {"f", "get_time"},
         {"{\"s\": \"\"}", "{}"}},
        /* a repeat is dropped; a call cut short keeps its parameters so far */
        {CALL(P("s", "a") P("n", "1")) "\n" CALL(P("s", "a") P("n", "1")) "\n<tool_call>\n<function=f>\n" P(
             "s", "b") "<parameter=n>\n2",
         "",
         2,
         {"f", "f"},
         {"{\"s\": \"a\", \"n\": 1}", "{\"s\": \"b\""}},
        {"no call: <tool_call>\n<fun", "no call:", 0, {0}, {0}},
        {"<tool_call>\n<function=f\n>", "", 0, {0}, {0}},
    };
    for (size_t i = 0; i < sizeof rd / sizeof *rd; i++) {
        size_t n = strlen(rd[i].text);
        for (size_t step = 0; step <= n; step += step < 4 ? 1 : 7) {
            calls_read cr;
            read_calls_raw(CHAT_TOOLS_XML, r.tool_strings, rd[i].text, step, &cr);
            bool ok = !cr.bad && cr.n_calls == rd[i].n && !strcmp(cr.content.p ? cr.content.p : "", rd[i].content);
            for (int k = 0; ok && k < cr.n_calls; k++)
                ok = !strcmp(cr.names[k], rd[i].name[k]) && !strcmp(cr.args[k].p ? cr.args[k].p : "", rd[i].args[k]);
            if (!ok) {
                fprintf(stderr, "read case %zu step %zu: content '%s', %d calls", i, step,
                        cr.content.p ? cr.content.p : "", cr.n_calls);
                for (int k = 0; k < cr.n_calls; k++) fprintf(stderr, " %s(%s)", cr.names[k], cr.args[k].p);
                fprintf(stderr, "\n");
            }
            calls_read_free(&cr);
            CHECK(ok);
        }
    }
#undef CALL
#undef P
    /* streamed: the arguments grow by whole parameters */
    srv_tc t;
    srv_tc_out o = {0};
    srv_tc_init(&t, CHAT_TOOLS_XML, r.tool_strings);
    const char *a = "<tool_call>\n<function=f>\n<parameter=s>\nx\n</parameter>\n<parameter=n>\n4";
    srv_tc_feed(&t, a, strlen(a), false, &o);
    CHECK(o.n == 2 && o.ev[0].name && !strcmp(o.ev[0].name, "f") && !strcmp(o.ev[1].args, "{\"s\": \"x\""));
    srv_tc_out_free(&o);
    const char *b = "2\n</parameter>\n</func";
    srv_tc_feed(&t, b, strlen(b), false, &o);
    CHECK(o.n == 1 && !strcmp(o.ev[0].args, ", \"n\": 42"));
    srv_tc_out_free(&o);
    srv_tc_feed(&t, "tion>\n</tool_call>", 18, true, &o);
    CHECK(o.n == 1 && !strcmp(o.ev[0].args, "}") && t.n_calls == 1);
    srv_tc_out_free(&o);
    srv_tc_free(&t);
    server_request_free(&r);
    /* a round trip: the call and its result as Qwen3.5's template writes them */
    const char *trip =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": "
        "null, \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": "
        "\"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]}, {\"role\": \"tool\", "
        "\"tool_call_id\": \"call_1\", \"content\": \"sunny\"}], " TOOLS "}";
    CHECKF(parse(true, trip, &r, &e) == 0, "%s", e.message);
    const char *tool_json[2] = {
        "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"d\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}",
        "{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}"};
    lm_chat_call call = {"call_1", "get_weather", "{\"city\": \"Paris\"}"};
    lm_chat_xmsg conv[] = {{"user", "a", NULL, 0, NULL, NULL},
                           {"assistant", "", &call, 1, NULL, NULL},
                           {"tool", "sunny", NULL, 0, "call_1", NULL}};
    CHECK(same_prompt(&r, CHAT_QWEN35, conv, 3, tool_json, 2));
    server_request_free(&r);
    /* arguments that are not an object cannot be written: a 400 */
    const char *not_obj =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"tool_calls\": "
        "[{\"id\": \"c\", \"function\": {\"name\": \"get_time\", \"arguments\": \"[1]\"}}]}]}";
    CHECK(parse(true, not_obj, &r, &e) == -1 && e.status == 400 && strstr(e.message, "not a JSON object"));
    /* a property name the call syntax cannot hold: a 400 naming tools */
    snprintf(body, sizeof body,
             "{" CHAT_A ", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
             "{\"type\": \"object\", \"properties\": {\"a>b\": {\"type\": \"string\"}}}}}]}");
    CHECK(parse(true, body, &r, &e) == -1 && e.status == 400 && !strcmp(e.param, "tools") && strstr(e.message, "a>b"));
    ctx.chat_family = CHAT_CHATML;
    ctx.n_ctx = 128;
    ctx.max_tokens_cap = 100;
}

/* Tools, a round trip and the tool-call reader with every allocation made
 * to fail in turn: a clean error (or lost events, flagged) each time, then
 * success; ASan sees no leak. */
static void test_tool_alloc_failure(void) {
    const char *body =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": null, "
        "\"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"get_time\", "
        "\"arguments\": \"{}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"1\"}], " TOOLS
        ", \"tool_choice\": \"auto\"}";
    ctx.n_ctx = 4096;
    bool ok = false;
    char *raw = NULL; /* the xml syntax's text parameters, for the reader below */
    for (int fam = 0; fam < 2; fam++) {
        ctx.chat_family = fam ? CHAT_QWEN35 : CHAT_CHATML;
        lm_server_request ref;
        lm_server_error re;
        CHECK(parse(true, body, &ref, &re) == 0); /* what a success must give */
        ok = false;
        for (long k = 0; k < 3000 && !ok; k++) {
            lm_server_request r;
            lm_server_error e;
            lm_alloc_fail_after(k);
            int rc = parse(true, body, &r, &e);
            lm_alloc_fail_after(-1);
            if (rc == 0) {
                ok = true;
                CHECK(r.tool_calls && r.grammar && r.n_grammar_triggers == 1 && !r.tool_strings == !fam);
                CHECKF(!strcmp(r.grammar, ref.grammar), "fail after %ld: another grammar", k);
                CHECK(!fam || !memcmp(r.tool_strings, ref.tool_strings, 29));
                if (fam) raw = r.tool_strings, r.tool_strings = NULL;
                server_request_free(&r);
            } else {
                CHECKF(e.status == 500 || e.status == 400, "fail after %ld: status %d (%s)", k, e.status, e.message);
                CHECK(r.n_prompts == 0 && r.prompts == NULL && !r.grammar && !r.n_grammar_triggers && !r.tool_strings);
            }
        }
        server_request_free(&ref);
        CHECKF(ok, "family %d", ctx.chat_family);
    }
    ctx.chat_family = CHAT_CHATML;
    ctx.n_ctx = 128;
    static const struct {
        int syntax;
        const char *text;
    } texts[] = {
        {CHAT_TOOLS_HERMES, "Hi <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>"},
        {CHAT_TOOLS_XML,
         "Hi <tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"},
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        ok = false;
        for (long k = 0; k < 200 && !ok; k++) {
            srv_tc t;
            srv_tc_out o = {0};
            srv_tc_init(&t, texts[i].syntax, texts[i].syntax == CHAT_TOOLS_XML ? raw : NULL);
            lm_alloc_fail_after(k);
            srv_tc_feed(&t, texts[i].text, strlen(texts[i].text), true, &o);
            lm_alloc_fail_after(-1);
            ok = !o.failed && !o.content.failed && o.n == 2;
            srv_tc_out_free(&o);
            srv_tc_free(&t);
        }
        CHECKF(ok, "syntax %d", texts[i].syntax);
    }
    lm_free(raw);
}

/* cache_salt: parsed into a hash, refused when not a 1..256-byte string;
 * the salts a key and a cache_salt give are fixed functions, distinct
 * between keys, between cache_salts and between tenants with one cache_salt. */
static void test_cache_salt(void) {
    lm_server_request r, r2;
    lm_server_error e;
    CHECK(server_tenant_salt(NULL) == 0 && server_tenant_salt("") == 0);
    uint64_t a = server_tenant_salt("key-a"), b = server_tenant_salt("key-b");
    CHECK(a != 0 && b != 0 && a != b && a == server_tenant_salt("key-a"));
    CHECKF(parse(false, "{\"prompt\": \"a\"}", &r, &e) == 0, "%s", e.message);
    CHECK(!r.cache_salt_given && server_request_salt(a, &r) == a && server_request_salt(0, &r) == 0);
    server_request_free(&r);
    CHECKF(parse(false, "{\"prompt\": \"a\", \"cache_salt\": null}", &r, &e) == 0, "%s", e.message);
    CHECK(!r.cache_salt_given);
    server_request_free(&r);
    CHECKF(parse(false, "{\"prompt\": \"a\", \"cache_salt\": \"x\"}", &r, &e) == 0, "%s", e.message);
    CHECKF(parse(false, "{\"prompt\": \"a\", \"cache_salt\": \"y\"}", &r2, &e) == 0, "%s", e.message);
    CHECK(r.cache_salt_given && r2.cache_salt_given && r.cache_salt_hash != r2.cache_salt_hash);
    uint64_t ax = server_request_salt(a, &r), bx = server_request_salt(b, &r), ay = server_request_salt(a, &r2),
             ox = server_request_salt(0, &r);
    CHECK(ax != a && ax != bx && ax != ay && ox != 0 && ox != ax && ax == server_request_salt(a, &r));
    server_request_free(&r);
    server_request_free(&r2);
    static const char *bad[] = {"5", "\"\"", "[\"x\"]", "{}", "true"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"prompt\": \"a\", \"cache_salt\": %s}", bad[i]);
        CHECKF(parse(false, body, &r, &e) == -1 && e.status == 400 && !strcmp(e.param, "cache_salt"), "%s: status %d",
               bad[i], e.status);
    }
    char body[600];
    snprintf(body, sizeof body, "{\"prompt\": \"a\", \"cache_salt\": \"%0256d\"}", 0);
    CHECKF(parse(false, body, &r, &e) == 0, "256 bytes: %s", e.message);
    server_request_free(&r);
    snprintf(body, sizeof body, "{\"prompt\": \"a\", \"cache_salt\": \"%0257d\"}", 0);
    CHECK(parse(false, body, &r, &e) == -1 && !strcmp(e.param, "cache_salt") && strstr(e.message, "257"));
}

int main(void) {
    server_test_setup(CHAT_CHATML, 128);
    TEST_RUN(test_completion_defaults);
    TEST_RUN(test_escaped_backslash_not_nul);
    TEST_RUN(test_server_defaults);
    TEST_RUN(test_completion_all_fields);
    TEST_RUN(test_prompt_forms);
    TEST_RUN(test_chat);
    TEST_RUN(test_bad_bodies);
    TEST_RUN(test_context_limits);
    TEST_RUN(test_context_rule);
    TEST_RUN(test_utf8);
    TEST_RUN(test_nesting);
    TEST_RUN(test_alloc_failure);
    TEST_RUN(test_format_fields);
    TEST_RUN(test_tool_fields);
    TEST_RUN(test_thinking_switch);
    TEST_RUN(test_tool_call_reader);
    TEST_RUN(test_tool_call_repeats);
    TEST_RUN(test_tool_xml);
    TEST_RUN(test_tool_alloc_failure);
    TEST_RUN(test_cache_salt);
    tok_free(tok);
    return TEST_DONE();
}
