/*
 * cmd_embed.c - `lamina embed`: embeddings of texts, through the engine.
 *
 * Each input (-p TEXT, or -f FILE with one input per line, empty lines
 * skipped; -f - reads standard input) is tokenized as llama.cpp's
 * llama-embedding does: BOS when the model adds one, special tokens parsed,
 * and EOS appended when the tokenizer says so (tokenizer.ggml.add_eos_token,
 * Qwen3-Embedding's files). All inputs go to the engine at once (lm_embed:
 * short ones share a pass) and come back pooled (--pooling, default the
 * model's pooling_type; a generative model needs one named), L2-normalized
 * unless --no-normalize, cut to their first --dimensions.
 *
 * Output: JSON shaped like OpenAI's embeddings response (-o json, the
 * default) or one line of floats per input (-o text), to standard output
 * or, with --out FILE, into FILE through the output guard (base/safefile.h:
 * the file appears whole or not at all). Floats are printed with 9
 * significant digits, enough to give back the same float.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "base/pool.h"
#include "base/safefile.h"
#include "base/strbuf.h"
#include "base/util.h"
#include "format/quant.h"
#include "model/embed.h"
#include "sched/engine.h"

static void usage_embed(FILE *f) {
    fprintf(f,
            "usage: lamina embed -m MODEL.gguf (-p TEXT | -f FILE) [--pooling P] [--normalize | --no-normalize]\n"
            "                    [--dimensions N] [-o json|text] [--out FILE] [-c N] [-b N] [-t N] [--kv-type T]\n"
            "Print the embedding of each input: the hidden states of its tokens pooled into one vector.\n\n"
            "  -p, --prompt TEXT  one input\n"
            "  -f, --file FILE    one input per line (empty lines skipped; - for standard input)\n"
            "  --pooling P        mean, cls, last, or default: the model's pooling_type (a generative\n"
            "                     model has none and needs one named)\n"
            "  --normalize        L2-normalize each vector (the default); --no-normalize: as pooled\n"
            "  --dimensions N     keep the first N values of each vector (before normalizing)\n"
            "  -o json|text       OpenAI-style JSON (default), or one line of floats per input\n"
            "  --out FILE         write there instead of standard output\n"
            "  -c, --ctx-size N   positions per input at most (default: the longest input's, at least\n"
            "                     512 or the model's context when shorter)\n"
            "  -b, --batch N      tokens per forward pass (default 512)\n"
            "  --kv-type T        KV cache element type (default F16)\n");
}

/* The inputs: -p's text, or the non-empty lines of -f's. */
static int split_inputs(const char *prompt, char *text, char ***out) {
    int n = 0, cap = 16;
    char **v = malloc((size_t)cap * sizeof *v);
    if (!v) fail("embed", "out of memory");
    if (prompt) {
        v[n++] = (char *)prompt;
    } else {
        for (char *line = text; line;) {
            char *nl = strchr(line, '\n');
            if (nl) *nl = '\0';
            size_t len = strlen(line);
            if (len && line[len - 1] == '\r') line[--len] = '\0';
            if (len) {
                if (n == cap && !(v = realloc(v, (size_t)(cap *= 2) * sizeof *v))) fail("embed", "out of memory");
                v[n++] = line;
            }
            line = nl ? nl + 1 : NULL;
        }
    }
    *out = v;
    return n;
}

static void put_floats(strbuf *b, const float *v, int n, const char *sep) {
    for (int j = 0; j < n; j++) strbuf_printf(b, "%s%.9g", j ? sep : "", (double)v[j]);
}

static void put_json_str(strbuf *b, const char *s) {
    strbuf_puts(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') strbuf_printf(b, "\\%c", c);
        else if (c < 0x20) strbuf_printf(b, "\\u%04x", c);
        else strbuf_printf(b, "%c", c);
    }
    strbuf_puts(b, "\"");
}

int cmd_embed(int argc, char **argv) {
    args a = {argc, argv, 0, "embed", usage_embed};
    const char *model = NULL, *prompt = NULL, *file = NULL, *fmt = "json", *out_path = NULL;
    long long dims = 0, n_ctx = 0, batch = 0, threads = pool_default_threads();
    int pooling = LM_POOL_DEFAULT;
    bool normalize = true;
    uint32_t kv_type = LM_TYPE_F16;
    for (a.i = 1; a.i < argc; a.i++) {
        if (is_help(&a)) continue;
        if (is_flag(&a, "-m", "--model")) model = need_val(&a);
        else if (is_flag(&a, "-p", "--prompt")) prompt = need_val(&a);
        else if (is_flag(&a, "-f", "--file")) file = need_val(&a);
        else if (is_flag(&a, "--pooling", NULL)) {
            const char *v = need_val(&a);
            pooling = embed_pooling_parse(v);
            if (pooling < LM_POOL_DEFAULT || pooling == LM_POOL_NONE)
                die_usage(&a, "--pooling is mean, cls, last or default, not '%s'", v);
        } else if (is_flag(&a, "--normalize", NULL)) normalize = true;
        else if (is_flag(&a, "--no-normalize", NULL)) normalize = false;
        else if (is_flag(&a, "--dimensions", NULL)) dims = need_int(&a, 1, 1 << 20);
        else if (is_flag(&a, "-o", "--output-format")) {
            fmt = need_val(&a);
            if (strcmp(fmt, "json") && strcmp(fmt, "text")) die_usage(&a, "-o is json or text, not '%s'", fmt);
        } else if (is_flag(&a, "--out", NULL)) out_path = need_val(&a);
        else if (is_flag(&a, "-c", "--ctx-size")) n_ctx = need_int(&a, 8, 1 << 24);
        else if (is_flag(&a, "-b", "--batch")) batch = need_int(&a, 1, 1 << 20);
        else if (is_flag(&a, "--kv-type", NULL)) kv_type = need_kv_type(&a);
        else if (is_flag(&a, "-t", "--threads")) threads = need_int(&a, 1, 1024);
        else die_usage(&a, "unknown argument '%s'", argv[a.i]);
    }
    if (!prompt == !file) die_usage(&a, "%s", "give one of -p TEXT and -f FILE");
    char err[LM_ERRLEN];
    char *text = NULL;
    if (file) {
        size_t len;
        if (!(text = safefile_read(strcmp(file, "-") ? file : NULL, &len, err, sizeof err))) fail("embed", err);
    }
    char **inputs;
    int n = split_inputs(prompt, text, &inputs);
    if (n == 0) fail("embed", "no input (the file has no non-empty line)");
    safefile *sf = NULL; /* created before the work: a destination that cannot be written fails at once */
    if (out_path && !(sf = safefile_create(out_path, err, sizeof err))) fail("embed", err);
    lm_model *m = load_or_die("embed", model);
    if (!m->tok) fail("embed", "the model file has no tokenizer");
    if (dims > m->hp.n_embd) {
        snprintf(err, sizeof err, "--dimensions %lld is more than the model's %d", dims, m->hp.n_embd);
        fail("embed", err);
    }
    int32_t **toks = calloc((size_t)n, sizeof *toks);
    int *nt = calloc((size_t)n, sizeof *nt);
    if (!toks || !nt) fail("embed", "out of memory");
    long long total = 0, longest = 0;
    bool eos = tok_add_eos(m->tok);
    for (int i = 0; i < n; i++) {
        int k = encode_all(m->tok, inputs[i], strlen(inputs[i]), tok_add_bos(m->tok), true, &toks[i]);
        if (k < 0) fail("embed", "an input cannot be tokenized");
        if (eos) { /* encode_all's buffer has room past the tokens */
            int32_t *nb = realloc(toks[i], (size_t)(k + 1) * sizeof *nb);
            if (!nb) fail("embed", "out of memory");
            (toks[i] = nb)[k++] = tok_eos(m->tok);
        }
        if (k == 0) {
            snprintf(err, sizeof err, "input %d has no tokens", i);
            fail("embed", err);
        }
        nt[i] = k;
        total += k;
        if (k > longest) longest = k;
    }
    lm_engine_config ec;
    engine_config_default(&ec);
    ec.n_threads = (int)threads;
    /* the context the inputs need (at least a pass's 512 tokens, within the model's), and a pool
     * for that many positions per input at once, not the model's whole context */
    long long fit = m->hp.n_ctx_train < 512 ? m->hp.n_ctx_train : 512;
    ec.n_ctx = (int)(n_ctx ? n_ctx : longest > fit ? longest : fit);
    if (n < ec.max_seqs) ec.max_seqs = n;
    if (batch) ec.batch_tokens = (int)batch;
    ec.kv_type = kv_type;
    ec.prefix_cache = false;
    lm_engine *e = engine_new(m, m->tok, &ec, err, sizeof err);
    if (!e) fail("embed", err);
    int D = dims ? (int)dims : m->hp.n_embd;
    float *vec = malloc((size_t)n * (size_t)D * sizeof *vec);
    if (!vec) fail("embed", "out of memory");
    if (lm_embed(e, (const int32_t *const *)toks, nt, n, pooling, (int)dims, normalize, vec, err, sizeof err) != LM_OK)
        fail("embed", err);
    engine_free(e);
    strbuf b = {0};
    if (!strcmp(fmt, "text")) {
        for (int i = 0; i < n; i++) {
            put_floats(&b, vec + (size_t)i * D, D, " ");
            strbuf_puts(&b, "\n");
        }
    } else {
        strbuf_puts(&b, "{\"object\":\"list\",\"data\":[");
        for (int i = 0; i < n; i++) {
            strbuf_printf(&b, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":[", i ? "," : "", i);
            put_floats(&b, vec + (size_t)i * D, D, ",");
            strbuf_puts(&b, "]}");
        }
        strbuf_puts(&b, "],\"model\":");
        put_json_str(&b, m->name);
        strbuf_printf(&b, ",\"usage\":{\"prompt_tokens\":%lld,\"total_tokens\":%lld}}\n", total, total);
    }
    if (b.failed) fail("embed", "out of memory");
    if (sf) {
        if (safefile_write(sf, b.p, b.len) != 0 || safefile_commit(sf, err, sizeof err) != 0) fail("embed", err);
    } else if (fwrite(b.p, 1, b.len, stdout) != b.len || fflush(stdout) != 0) {
        fail("embed", "cannot write the output");
    }
    strbuf_free(&b);
    for (int i = 0; i < n; i++) free(toks[i]);
    free(toks);
    free(nt);
    free(vec);
    free(inputs);
    lm_free(text);
    model_free(m);
    return 0;
}
