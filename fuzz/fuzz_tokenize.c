/*
 * fuzz_tokenize.c - libFuzzer target for the tokenizers: arbitrary bytes
 * (any UTF-8 or not) are encoded with every option combination and streamed
 * back through the detokenizer. Vocabularies: the bundled SentencePiece model,
 * GPT-2's byte-level BPE and the WordPiece test vocabulary (tests/data/vocab);
 * run from the repository root.
 *
 * The first input byte picks the tokenizer and flags; the rest is the text.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "text/tokenizer.h"

static lm_tokenizer *toks[3];
static int n_toks;

static void load(const char *path) {
    char err[256];
    gguf_ctx *g = gguf_open(path, err, sizeof err);
    if (!g) return;
    lm_tokenizer *t = tok_load(g, err, sizeof err);
    gguf_close(g);
    if (t) toks[n_toks++] = t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!n_toks) {
        load("models/stories260K.gguf");
        load("tests/data/vocab/ggml-vocab-gpt-2.gguf");
        load("tests/data/vocab/ggml-vocab-wpm.gguf");
        if (n_toks != 3) abort();
    }
    if (size < 1) return 0;
    uint8_t opt = data[0];
    const lm_tokenizer *t = toks[opt % n_toks];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int32_t ids[4096];
    int n = tok_encode(t, text, len, opt & 2, opt & 4, ids, 4096);
    if (n > 4096) n = 4096;
    if (n < 0) return 0;
    lm_detok d;
    detok_init(&d, t, opt & 8, opt & 16);
    char out[4096];
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tok_n_vocab(t)) abort();
        if (detok_push(&d, ids[i], out, sizeof out) < 0) abort();
    }
    detok_flush(&d, out, sizeof out);
    return 0;
}
