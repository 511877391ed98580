/*
 * server_parse_test.h - what the request-parser tests share (test_server.c,
 * test_server_split.c, test_server_reasoning.c): the bundled model's
 * tokenizer and a parser context over it (server_test_setup, with the chat
 * family and context the file starts from), parse() of one body, the
 * bodies' common pieces (CHAT_A, TOOLS), and grammar_takes over a byte
 * vocabulary. The tokenizer's ids only need to tell prompts apart.
 * Included by one test program each: its statics are that program's.
 */
#ifndef LAMINA_TESTS_SERVER_PARSE_TEST_H
#define LAMINA_TESTS_SERVER_PARSE_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/server.h"
#include "decode/grammar.h"
#include "format/gguf.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "base/util.h"

#define CHAT_A "\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]"
#define TOOL_W                                                                                                         \
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"d\", "                      \
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}"
#define TOOL_T "{\"type\": \"function\", \"function\": {\"name\": \"get_time\"}}"
#define TOOLS "\"tools\": [" TOOL_W ", " TOOL_T "]"

static lm_tokenizer *tok;
static lm_server_parse_ctx ctx;

/* The bundled model's tokenizer (exits on failure) and ctx over it. */
static inline void server_test_setup(int chat_family, int n_ctx) {
    char err[LM_ERRLEN];
    gguf_ctx *g = gguf_open(TEST_MODEL, err, sizeof err);
    if (!g) {
        fprintf(stderr, "cannot open %s: %s\n", TEST_MODEL, err);
        exit(1);
    }
    tok = tok_load(g, err, sizeof err);
    gguf_close(g);
    if (!tok) {
        fprintf(stderr, "no tokenizer: %s\n", err);
        exit(1);
    }
    ctx = (lm_server_parse_ctx){
        .tok = tok, .n_ctx = n_ctx, .model_name = "m", .chat_family = chat_family, .max_n = 4, .max_tokens_cap = 100};
}

static inline int parse(bool chat, const char *body, lm_server_request *r, lm_server_error *e) {
    return server_parse_request(&ctx, chat, body, strlen(body), r, e);
}

/* Whether lamina's matcher takes text, whole, as a string of grammar g (a
 * vocabulary of the 256 bytes and an end token). */
static inline bool grammar_takes(const char *g, const char *text) {
    static char bytes[256];
    static const char *bp[257];
    static int lens[257];
    static bool eog[257];
    for (int b = 0; b < 256; b++) bytes[b] = (char)b, bp[b] = &bytes[b], lens[b] = 1;
    bp[256] = "", lens[256] = 0, eog[256] = true;
    char err[LM_ERRLEN];
    lm_grammar *gr = grammar_parse(g, strlen(g), NULL, err, sizeof err);
    lm_gvocab *v = grammar_vocab_from_bytes(257, bp, lens, eog, err, sizeof err);
    lm_gmatch *m = gr && v ? gmatch_new(gr, v, err, sizeof err) : NULL;
    bool ok = m != NULL;
    for (const char *c = text; ok && *c; c++) ok = gmatch_accept(m, (unsigned char)*c) == 0;
    ok = ok && gmatch_allows(m, 256);
    gmatch_free(m);
    grammar_vocab_free(v);
    grammar_free(gr);
    return ok;
}

#endif
