/*
 * cmd_logits.c - `lamina logits`: the largest logits after a prompt, for
 * comparing a model's numbers with another implementation's (the
 * architecture tests compare them with llama.cpp's, tests/data/<arch>/).
 * The prompt is tokenized as `lamina run` does (BOS when the model asks for
 * it, special tokens not parsed) and run as one sequence; the last
 * position's logits are sorted, largest first (ties: lower id first).
 * With --hidden it prints every token's hidden state instead (after the
 * final norm; an encoder's, which has no LM head, after its last layer),
 * the prompt then run in one pass.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "format/quant.h"
#include "model/forward.h"
#include "base/pool.h"
#include "base/util.h"

static void usage_logits(FILE *f) {
    fprintf(f,
            "usage: lamina logits [-m] MODEL.gguf -p PROMPT [--top K | --hidden] [-c N] [--kv-type T] [-t N]\n"
            "Print the prompt's token ids and the K largest logits after it (id:logit).\n\n"
            "  --top K        how many (default 5)\n"
            "  --hidden       instead, each token's hidden state after the final norm (an encoder's\n"
            "                 after its last layer), one line per token; the prompt runs in one pass\n"
            "  -c, --ctx-size context the sequence is planned for (default 512)\n"
            "  --kv-type T    KV cache element type (default F16)\n");
}

/* --hidden: the prompt in one pass, every row's state printed; frees all. */
static int print_hidden(lm_model *m, lm_seqrun *st, lm_pool *pool, const int32_t *toks, int n) {
    char err[LM_ERRLEN];
    int E = m->hp.n_embd;
    /* a causal model's rows of a longer prompt would be those of its last pass only; a
     * non-causal one refuses a second pass itself (fwd_check) */
    if (m->hp.causal && n > st->fwd->dims.n_batch) fail("logits", "--hidden runs the prompt in one pass: too long");
    float *hid = malloc((size_t)n * (size_t)E * sizeof(float));
    if (!hid) fail("logits", "out of memory");
    st->fwd->hid = hid;
    if (seqrun_forward(st, toks, n, NULL, false, err, sizeof err)) fail("logits", err);
    printf("prompt ids:");
    for (int i = 0; i < n; i++) printf(" %d", toks[i]);
    printf("\n");
    for (int i = 0; i < n; i++) {
        printf("hidden %d:", i);
        for (int j = 0; j < E; j++) printf(" %.6g", hid[(size_t)i * E + j]);
        printf("\n");
    }
    free(hid);
    free((void *)toks);
    seqrun_free(st);
    pool_free(pool);
    model_free(m);
    return 0;
}

int cmd_logits(int argc, char **argv) {
    args a = {argc, argv, 0, "logits", usage_logits};
    const char *model = NULL, *prompt = NULL;
    long long top = 5, n_ctx = 512, threads = pool_default_threads();
    uint32_t kv_type = LM_TYPE_F16;
    bool hidden = false;
    for (a.i = 1; a.i < argc; a.i++) {
        if (is_help(&a)) continue;
        if (is_flag(&a, "-m", "--model")) model = need_val(&a);
        else if (is_flag(&a, "-p", "--prompt")) prompt = need_val(&a);
        else if (is_flag(&a, "--top", NULL)) top = need_int(&a, 1, 1 << 20);
        else if (is_flag(&a, "--hidden", NULL)) hidden = true;
        else if (is_flag(&a, "-c", "--ctx-size")) n_ctx = need_int(&a, 8, 1 << 24);
        else if (is_flag(&a, "--kv-type", NULL)) kv_type = need_kv_type(&a);
        else if (is_flag(&a, "-t", "--threads")) threads = need_int(&a, 1, 1024);
        else die_usage(&a, "unknown argument '%s'", argv[a.i]);
    }
    if (!prompt) die_usage(&a, "%s", "no prompt (-p PROMPT)");
    lm_model *m = load_or_die("logits", model);
    if (!m->tok) fail("logits", "the model file has no tokenizer");
    int32_t *toks = NULL;
    int n = encode_all(m->tok, prompt, strlen(prompt), tok_add_bos(m->tok), false, &toks);
    if (n <= 0) fail("logits", "the prompt has no tokens");
    if (n > n_ctx) fail("logits", "the prompt is longer than the context");
    lm_pool *pool = pool_new((int)threads);
    char err[LM_ERRLEN];
    lm_seqrun *st = pool ? seqrun_new(m, pool, (int)n_ctx, 0, kv_type, err, sizeof err) : NULL;
    if (!st) fail("logits", pool ? err : "cannot start threads");
    if (hidden) return print_hidden(m, st, pool, toks, n);
    if (m->hp.encoder || !m->output.rows) /* an encoder, gemma-embedding */
        fail("logits", "the model has no LM head: --hidden prints its tokens' hidden states");
    int V = m->hp.n_vocab;
    float *logits = malloc((size_t)V * sizeof(float));
    int *order = malloc((size_t)V * sizeof(int));
    if (!logits || !order) fail("logits", "out of memory");
    if (seqrun_forward(st, toks, n, logits, false, err, sizeof err)) fail("logits", err);
    printf("prompt ids:");
    for (int i = 0; i < n; i++) printf(" %d", toks[i]);
    printf("\ntop:");
    if (top > V) top = V;
    /* partial selection: top is small */
    for (int k = 0; k < top; k++) {
        int best = -1;
        for (int v = 0; v < V; v++) {
            bool taken = false;
            for (int j = 0; j < k && !taken; j++) taken = order[j] == v;
            if (!taken && (best < 0 || logits[v] > logits[best])) best = v;
        }
        order[k] = best;
        printf(" %d:%.4f", best, logits[best]);
    }
    printf("\n");
    free(logits);
    free(order);
    free(toks);
    seqrun_free(st);
    pool_free(pool);
    model_free(m);
    return 0;
}
