/*
 * fuzz_json_schema.c - libFuzzer target for the JSON Schema compiler
 * (json_schema_to_gbnf): arbitrary bytes as a schema, which reaches it from
 * a request's response_format. Every input must give either GBNF text that
 * the grammar engine compiles (grammar_parse) or an error message, never a
 * crash, a hang or a leak (ASan checks).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "decode/grammar.h"
#include "decode/json_schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[LM_ERRLEN];
    err[0] = 0;
    char *g = json_schema_to_gbnf((const char *)data, size, err, sizeof err);
    if (g) {
        lm_grammar *gr = grammar_parse(g, strlen(g), NULL, err, sizeof err);
        if (!gr) abort(); /* the compiler wrote a grammar the engine refuses */
        grammar_free(gr);
        lm_free(g);
    } else if (!err[0]) {
        abort(); /* a refusal always says why */
    }
    return 0;
}
