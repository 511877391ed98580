/*
 * fuzz_request.c - libFuzzer target for the HTTP server's request parser
 * (server_parse_request): arbitrary bytes as the body of a completions or a
 * chat request, with the bundled model's tokenizer. The parser must answer
 * every input with either parameters the engine accepts or a 4xx/5xx error
 * naming the problem, and free everything either way (ASan checks leaks).
 *
 * The first input byte picks the route (bit 0: chat) and the chat template
 * (bit 1: a family by name, else a template text through chat_detect; with
 * bit 1, bit 7 picks gpt-oss, bit 3 llama3, bit 4 mistral-v3, bit 5 qwen3
 * and bit 6 qwen3.5 instead of chatml, so that every tool-call syntax, the
 * thinking switch and the reasoning effort are reached); the rest is the
 * body. On the completions route (bit 0 clear), where the template does not
 * matter, bit 7 picks the embeddings route instead (server_parse_embed,
 * with an embedding width of 8; bit 3: a server that refuses embeddings);
 * its inputs must be non-empty and within the
 * context, the vocabulary and the bounds, and the answer over zero vectors
 * must be written. Structured
 * outputs and tools: a grammar the parser accepts must compile, a trigger
 * comes only with a grammar and on the chat route (tool calls, or a
 * thinking family's answer grammar), and tool calls only with a grammar.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat.h"
#include "decode/grammar.h"
#include "format/gguf.h"
#include "serve/server.h"
#include "text/tokenizer.h"
#include "base/util.h"

static lm_tokenizer *tok;

static const char *ZEPHYR_TEMPLATE =
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + "
    "eos_token }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}";

/* The embeddings route (see above). */
static int fuzz_embed(uint8_t opt, const uint8_t *body, size_t len) {
    lm_server_parse_ctx c = {.tok = tok, .n_ctx = 128, .model_name = "stories260K.gguf", .n_embd = 8};
    if (opt & 8) c.embed_error = "no pooling";
    lm_server_embed_request r;
    lm_server_error e;
    int rc = server_parse_embed(&c, (const char *)body, len, &r, &e);
    if (rc == 0) {
        if (c.embed_error || r.n_inputs < 1 || r.n_inputs > SERVER_MAX_EMBED_INPUTS) abort();
        if (r.dimensions < 1 || r.dimensions > c.n_embd || r.n_tokens > SERVER_MAX_EMBED_TOKENS) abort();
        long long total = 0;
        for (int i = 0; i < r.n_inputs; i++) {
            if (r.n_input[i] < 1 || r.n_input[i] > c.n_ctx) abort();
            for (int k = 0; k < r.n_input[i]; k++)
                if (r.inputs[i][k] < 0 || r.inputs[i][k] >= tok_n_vocab(tok)) abort();
            total += r.n_input[i];
        }
        if (total != r.n_tokens) abort();
        float *vecs = calloc((size_t)r.n_inputs * (size_t)r.dimensions, sizeof(float));
        char *a = vecs ? server_embed_answer(&r, c.model_name, vecs) : NULL;
        if (!a) abort();
        lm_free(a);
        free(vecs);
        server_embed_request_free(&r);
    } else {
        if (e.status < 400 || e.status > 599 || !e.message[0] || r.inputs || r.n_inputs) abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tok) {
        char err[256];
        gguf_ctx *g = gguf_open("models/stories260K.gguf", err, sizeof err);
        if (!g) abort();
        tok = tok_load(g, err, sizeof err);
        gguf_close(g);
        if (!tok) abort();
    }
    if (size < 1) return 0;
    uint8_t opt = data[0];
    if (!(opt & 1) && (opt & 128)) return fuzz_embed(opt, data + 1, size - 1);
    lm_server_parse_ctx c = {
        .tok = tok, .n_ctx = 128, .model_name = "stories260K.gguf", .max_n = 8, .max_tokens_cap = (opt & 4) ? 64 : 0};
    if (opt & 2)
        c.chat_family = (opt & 128) ? CHAT_GPT_OSS
            : (opt & 8)             ? CHAT_LLAMA3
            : (opt & 16)            ? CHAT_MISTRAL_V3
            : (opt & 32)            ? CHAT_QWEN3
            : (opt & 64)            ? CHAT_QWEN35
                                    : CHAT_CHATML;
    else c.chat_family = -1, c.chat_template = ZEPHYR_TEMPLATE;
    lm_server_request r;
    lm_server_error e;
    int rc = server_parse_request(&c, opt & 1, (const char *)data + 1, size - 1, &r, &e);
    if (rc == 0) {
        /* what the engine will be given must be within its bounds */
        if (r.n_prompts < 1 || r.p.n < 1 || r.p.n > 8 || r.p.max_tokens < 1) abort();
        for (int i = 0; i < r.n_prompts; i++) {
            if (r.n_prompt[i] < 1 || r.n_prompt[i] + r.p.max_tokens > c.n_ctx) abort();
            for (int k = 0; k < r.n_prompt[i]; k++)
                if (r.prompts[i][k] < 0 || r.prompts[i][k] >= tok_n_vocab(tok)) abort();
        }
        for (int i = 0; i < r.p.n_bias; i++)
            if (r.p.bias_ids[i] < 0 || r.p.bias_ids[i] >= tok_n_vocab(tok)) abort();
        for (int i = 0; i < r.p.n_stop; i++)
            if (!r.stops[i][0] || strlen(r.stops[i]) > 1024) abort();
        if (r.p.top_logprobs < 0 || r.p.top_logprobs > 20) abort();
        if ((r.n_grammar_triggers && !r.grammar) || (r.n_grammar_triggers && !r.tool_calls && !r.chat) ||
            (r.tool_calls && !r.grammar) || (r.tool_calls && !r.chat))
            abort();
        if (r.tool_calls && (r.tool_syntax == CHAT_TOOLS_XML) != (r.tool_strings != NULL)) abort();
        if (r.grammar) {
            lm_grammar *g = grammar_parse(r.grammar, strlen(r.grammar), NULL, NULL, 0);
            if (!g) abort();
            grammar_free(g);
        }
        server_request_free(&r);
    } else {
        if (e.status < 400 || e.status > 599 || !e.message[0]) abort();
        if (r.prompts || r.p.n_stop || r.p.bias_ids || r.grammar || r.n_grammar_triggers || r.tool_strings) abort();
    }
    return 0;
}
