// vocab_facts.cpp - what llama.cpp makes of a vocabulary-only GGUF file, for
// lamina's tokenizer tests (tests/test_tokenizer.c). Built against a llama.cpp
// build (libllama and include/llama.h); not part of lamina's build:
//   c++ -std=c++17 tests/data/vocab/vocab_facts.cpp -I LLAMA/include -I LLAMA/ggml/include \
//       -L LLAMA/build/bin -lllama -Wl,-rpath,LLAMA/build/bin -o /tmp/vocab_facts
//   /tmp/vocab_facts VOCAB.gguf vectors < VOCAB.gguf.inp > VOCAB.gguf.out
//   /tmp/vocab_facts VOCAB.gguf facts PROMPT_FILE > VOCAB.gguf.facts
// "vectors": one line of ids per case of the .inp file (cases end with
// "\n__ggml_vocab_test__\n"), no BOS added, special tokens not parsed, as the
// other .out files. "facts": the special ids, the end-of-generation tokens,
// the user-defined tokens above the first control one, and the prompt's ids
// with special tokens parsed and not, and its detokenized text (special
// tokens not rendered).
#include "llama.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

static std::vector<llama_token> tokenize(const llama_vocab *v, const std::string &s, bool parse_special) {
    std::vector<llama_token> t(s.size() + 16);
    int k = llama_tokenize(v, s.c_str(), (int32_t)s.size(), t.data(), (int32_t)t.size(), false, parse_special);
    t.resize(k < 0 ? 0 : k);
    return t;
}

static void print_ids(const char *head, const std::vector<llama_token> &t) {
    printf("%s %zu", head, t.size());
    for (llama_token id : t) printf(" %d", id);
    printf("\n");
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: vocab_facts VOCAB.gguf vectors < INP | facts PROMPT_FILE\n");
        return 2;
    }
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) return 1;
    const llama_vocab *v = llama_model_get_vocab(m);
    if (!strcmp(argv[2], "vectors")) {
        std::string inp((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
        const std::string sep = "\n__ggml_vocab_test__\n";
        for (size_t p = 0, q; (q = inp.find(sep, p)) != std::string::npos; p = q + sep.size()) {
            for (llama_token id : tokenize(v, inp.substr(p, q - p), false)) printf(" %d", id);
            printf("\n");
        }
        return 0;
    }
    std::ifstream f(argv[3], std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string prompt = ss.str();
    int n = llama_vocab_n_tokens(v);
    printf("n_vocab %d\nbos %d\neos %d\neot %d\neog", n, llama_vocab_bos(v), llama_vocab_eos(v), llama_vocab_eot(v));
    int first_control = -1;
    for (int i = 0; i < n; i++) {
        if (llama_vocab_is_eog(v, i)) printf(" %d", i);
        if (first_control < 0 && llama_vocab_is_control(v, i)) first_control = i;
    }
    printf("\nuser");
    for (int i = first_control < 0 ? n : first_control; i < n; i++)
        if (llama_vocab_get_attr(v, i) & LLAMA_TOKEN_ATTR_USER_DEFINED) printf(" %d", i);
    printf("\n");
    std::vector<llama_token> ids = tokenize(v, prompt, true);
    print_ids("ids", ids);
    print_ids("ids_noparse", tokenize(v, prompt, false));
    std::vector<char> buf(prompt.size() * 2 + 64);
    int len = llama_detokenize(v, ids.data(), (int32_t)ids.size(), buf.data(), (int32_t)buf.size(), false, false);
    printf("detok %d\n%.*s\n", len, len > 0 ? len : 0, buf.data());
    llama_model_free(m);
    return 0;
}
