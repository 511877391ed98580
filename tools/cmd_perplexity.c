/*
 * cmd_perplexity.c - `lamina perplexity`: perplexity over a text file the
 * way llama.cpp's llama-perplexity measures it (chunks of CTX tokens, each
 * starting with BOS, the second half of each scored), and the quality of a
 * number format against a reference run: --save-logits writes the logits
 * of every scored position (format/logits.h), --kl-divergence reads them
 * back while running another model file or KV type over the same tokens
 * and reports the KL divergence (mean with its standard error, median, 90%,
 * 99%, max), top-1 agreement and the change of perplexity.
 *
 * With --kl-divergence the chunk size and count default to the file's, and
 * the run is refused unless the vocabulary (hash and size), chunk size and
 * every token match.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "base/pool.h"
#include "base/safefile.h"
#include "base/util.h"
#include "format/logits.h"
#include "format/quant.h"
#include "model/forward.h"
#include "model/model.h"
#include "text/tokenizer.h"

static void usage_perplexity(FILE *f) {
    fprintf(f,
            "usage: lamina perplexity [-m] MODEL.gguf -f TEXT [-c CTX] [-t THREADS] [--chunks N] [--kv-type T]\n"
            "                         [--save-logits FILE] [--kl-divergence FILE]\n"
            "Perplexity the way llama.cpp's llama-perplexity measures it: the text is cut into\n"
            "chunks of CTX tokens, each starting with BOS, and only the second half of each chunk\n"
            "is scored. Prints the running estimate per chunk and the final PPL with its error.\n\n"
            "  -c, --ctx-size N   tokens per chunk (default 512, or the model's trained context\n"
            "                     when that is smaller; with --kl-divergence the file's)\n"
            "      --ctx-extend   allow -c above the model's trained context (with a warning)\n"
            "      --logits-out FILE  write the first chunk's logits there, raw float32 (CTX rows of\n"
            "                     n_vocab), to compare runs (e.g. single-process against --tp N)\n"
            "      --save-logits FILE  write the logits of every scored position (lamina's\n"
            "                     saved-logits format: a header with the vocabulary's hash, the\n"
            "                     tokens, then float32 rows; n_vocab x 4 bytes per scored token)\n"
            "      --kl-divergence FILE  compare with logits saved by --save-logits (a reference\n"
            "                     run: full-precision weights, F32 KV) over the same text: mean KL\n"
            "                     divergence +/- its standard error, its median, 90%%, 99%% and max\n"
            "                     per token, top-1 agreement and the change of perplexity. The\n"
            "                     vocabulary, chunk size and tokens must match the file's\n");
}

typedef struct {
    const char *model, *file, *logits_out, *save, *kl_base;
    long long n_ctx, threads, max_chunks;
    uint32_t kv_type;
    bool ctx_extend;
} ppl_opts;

static const char *piece_of(const void *tok, int32_t id, size_t *len) { return tok_piece(tok, id, len); }

/* The base file's facts against this run's: exit 1 naming the first mismatch. */
static void check_base(const logits_reader *r, const lm_model *m, const uint8_t sha[32], const int32_t *toks, int n,
                       int C, int n_chunk, bool add_bos) {
    char msg[LM_ERRLEN];
    if ((int)r->h.n_vocab != m->hp.n_vocab) {
        snprintf(msg, sizeof msg, "the saved logits are over a vocabulary of %u tokens, this model's has %d",
                 r->h.n_vocab, m->hp.n_vocab);
        fail("perplexity", msg);
    }
    if (memcmp(r->h.vocab_sha, sha, 32) != 0)
        fail("perplexity", "the saved logits come from a model with another vocabulary");
    if ((int)r->h.n_ctx != C) {
        snprintf(msg, sizeof msg,
                 "the saved logits have chunks of %u tokens, this run %d (leave -c out to use the file's)", r->h.n_ctx,
                 C);
        fail("perplexity", msg);
    }
    if ((int)r->h.n_chunk < n_chunk || n < n_chunk * C) {
        snprintf(msg, sizeof msg, "the saved logits hold %u chunks, this text has %d of %d tokens", r->h.n_chunk, n / C,
                 C);
        fail("perplexity", msg);
    }
    for (int c = 0; c < n_chunk; c++)
        for (int j = 0; j < C; j++) {
            int32_t t = toks[(size_t)c * C + j];
            if (j == 0 && add_bos && tok_bos(m->tok) >= 0) t = tok_bos(m->tok);
            if (t != r->tokens[(size_t)c * C + j]) {
                snprintf(msg, sizeof msg,
                         "token %d of chunk %d is %d here and %d in the saved logits (another "
                         "text or tokenizer)",
                         j, c + 1, t, r->tokens[(size_t)c * C + j]);
                fail("perplexity", msg);
            }
        }
}

static void print_kl(const logits_summary *s) {
    printf("\n====== Perplexity statistics ======\n");
    printf("Mean PPL(Q)                   : %10.6f\n", s->ppl_cur);
    printf("Mean PPL(base)                : %10.6f\n", s->ppl_base);
    printf("Mean ln(PPL(Q)/PPL(base))     : %10.6f +/- %.6f\n", s->ln_ratio, s->ln_ratio_err);
    printf("Mean PPL(Q)/PPL(base)         : %10.6f\n", exp(s->ln_ratio));
    printf("Mean PPL(Q)-PPL(base)         : %10.6f\n", s->dppl);
    printf("\n====== KL divergence statistics ======\n");
    printf("Mean    KLD: %12.6f +/- %.6f\n", s->kl_mean, s->kl_err);
    printf("Maximum KLD: %12.6f\n", s->kl_max);
    printf("99.0%%   KLD: %12.6f\n", s->kl_p99);
    printf("90.0%%   KLD: %12.6f\n", s->kl_p90);
    printf("Median  KLD: %12.6f\n", s->kl_median);
    printf("\n====== Token probability statistics ======\n");
    printf("Same top p: %7.3f +/- %.3f %% (%ld tokens)\n", 100 * s->top1, 100 * s->top1_err, s->n);
}

static void parse(int argc, char **argv, ppl_opts *o) {
    args a = {argc, argv, 0, "perplexity", usage_perplexity};
    memset(o, 0, sizeof *o);
    o->threads = pool_default_threads();
    o->max_chunks = -1;
    o->kv_type = LM_TYPE_F16;
    for (a.i = 1; a.i < argc; a.i++) {
        if (is_help(&a)) continue;
        if (is_flag(&a, "-m", "--model")) o->model = need_val(&a);
        else if (is_flag(&a, "-f", "--file")) o->file = need_val(&a);
        else if (is_flag(&a, "-c", "--ctx-size")) o->n_ctx = need_int(&a, 8, 1 << 24);
        else if (is_flag(&a, "--ctx-extend", NULL)) o->ctx_extend = true;
        else if (is_flag(&a, "-t", "--threads")) o->threads = need_int(&a, 1, 1024);
        else if (is_flag(&a, "--chunks", NULL)) o->max_chunks = need_int(&a, 1, 1 << 30);
        else if (is_flag(&a, "--kv-type", NULL)) o->kv_type = need_kv_type(&a);
        else if (is_flag(&a, "--logits-out", NULL)) o->logits_out = need_val(&a);
        else if (is_flag(&a, "--save-logits", NULL)) o->save = need_val(&a);
        else if (is_flag(&a, "--kl-divergence", NULL)) o->kl_base = need_val(&a);
        else die_usage(&a, "unknown argument '%s'", argv[a.i]);
    }
    if (!o->file) die_usage(&a, "%s", "no text file given (-f FILE)");
}

/* The saved-logits file's header and tokens (the rows follow per chunk). */
static safefile *save_begin(const char *path, const lm_model *m, const uint8_t sha[32], const int32_t *toks, int C,
                            int n_chunk, int first, bool add_bos) {
    char err[LM_ERRLEN];
    safefile *sf = safefile_create(path, err, sizeof err);
    if (!sf) fail("perplexity", err);
    logits_hdr h = {.n_vocab = (uint32_t)m->hp.n_vocab,
                    .n_ctx = (uint32_t)C,
                    .n_chunk = (uint32_t)n_chunk,
                    .first = (uint32_t)first};
    memcpy(h.vocab_sha, sha, 32);
    uint8_t hb[LOGITS_HDR_BYTES];
    logits_hdr_encode(&h, hb);
    safefile_write(sf, hb, sizeof hb);
    for (int c = 0; c < n_chunk; c++)
        for (int j = 0; j < C; j++) {
            int32_t t = toks[(size_t)c * C + j];
            if (j == 0 && add_bos && tok_bos(m->tok) >= 0) t = tok_bos(m->tok);
            uint8_t b[4] = {(uint8_t)t, (uint8_t)(t >> 8), (uint8_t)(t >> 16), (uint8_t)(t >> 24)};
            safefile_write(sf, b, 4);
        }
    return sf;
}

int cmd_perplexity(int argc, char **argv) {
    ppl_opts o;
    parse(argc, argv, &o);
    size_t len;
    char err[LM_ERRLEN];
    char *text = safefile_read(o.file, &len, err, sizeof err);
    if (!text) fail("perplexity", err);
    logits_reader base = {0};
    if (o.kl_base && logits_open(&base, o.kl_base, err, sizeof err)) fail("perplexity", err);
    lm_model *m = load_or_die("perplexity", o.model);
    if (!m->tok) fail("perplexity", "the model file has no tokenizer");
    /* default chunk: the base file's, else 512 tokens, never past the trained context */
    if (o.n_ctx == 0 && o.kl_base) o.n_ctx = base.h.n_ctx;
    if (o.n_ctx == 0) o.n_ctx = m->hp.n_ctx_train > 0 && m->hp.n_ctx_train < 512 ? m->hp.n_ctx_train : 512;
    ctx_check("perplexity", "-c", o.n_ctx, m->hp.n_ctx_train, o.ctx_extend);
    bool add_bos = tok_add_bos(m->tok);
    int32_t *toks = NULL;
    int n = encode_all(m->tok, text, len, add_bos, false, &toks);
    if (n < 0) fail("perplexity", "tokenization failed");
    int C = (int)o.n_ctx;
    if (n < 2 * C) {
        snprintf(err, sizeof err, "need at least %d tokens (2 x context) but the text has %d", 2 * C, n);
        fail("perplexity", err);
    }
    int n_chunk = n / C;
    if (o.kl_base && o.max_chunks < 0) o.max_chunks = base.h.n_chunk;
    if (o.max_chunks > 0 && o.max_chunks < n_chunk) n_chunk = (int)o.max_chunks;
    int V = m->hp.n_vocab, first = C / 2;
    uint8_t sha[32];
    logits_vocab_hash(piece_of, m->tok, V, sha);
    if (o.kl_base) {
        check_base(&base, m, sha, toks, n, C, n_chunk, add_bos);
        if ((int)base.h.first != first) fail("perplexity", "the saved logits score other positions of each chunk");
    }
    safefile *sf = o.save && cli_rank == 0 ? save_begin(o.save, m, sha, toks, C, n_chunk, first, add_bos) : NULL;
    lm_pool *pool = pool_new((int)o.threads);
    lm_seqrun *st = pool ? seqrun_new(m, pool, C, FWD_BATCH_DEFAULT, o.kv_type, err, sizeof err) : NULL;
    if (!st) fail("perplexity", pool ? err : "cannot start threads");
    float *logits = malloc((size_t)C * V * sizeof(float));
    float *brow = o.kl_base ? malloc((size_t)V * sizeof(float)) : NULL;
    size_t n_cmp_max = (size_t)n_chunk * (size_t)(C - 1 - first);
    logits_cmp *cmp = o.kl_base ? malloc(n_cmp_max * sizeof *cmp) : NULL;
    double *kls = o.kl_base ? malloc(n_cmp_max * sizeof *kls) : NULL;
    int32_t *chunk = malloc((size_t)C * sizeof(int32_t));
    if (!logits || !chunk || (o.kl_base && (!brow || !cmp || !kls))) fail("perplexity", "out of memory");
    double nll = 0, nll2 = 0;
    long count = 0;
    fprintf(stderr, "perplexity: %d tokens, %d chunks of %d, scoring the second half of each\n", n, n_chunk, C);
    double t0 = lm_now();
    /* chunk i of n with the running perplexity, on a terminal or with
     * --progress; when stdout is the terminal too (and no --progress), the
     * running estimates printed there are the progress */
    progress_line prog;
    progress_begin(&prog, "perplexity", "chunk", "chunks");
    prog.on = progress_force || (prog.on && !isatty(1));
    for (int c = 0; c < n_chunk; c++) {
        progress_update(&prog, c, n_chunk);
        memcpy(chunk, toks + (size_t)c * C, (size_t)C * sizeof(int32_t));
        if (add_bos && tok_bos(m->tok) >= 0) chunk[0] = tok_bos(m->tok);
        seqrun_reset(st);
        if (seqrun_forward(st, chunk, C, logits, true, err, sizeof err)) fail("perplexity", err);
        if (c == 0 && o.logits_out && cli_rank == 0) {
            safefile *lf = safefile_create(o.logits_out, err, sizeof err);
            if (!lf) fail("perplexity", err);
            safefile_write(lf, logits, (size_t)C * V * sizeof(float));
            if (safefile_commit(lf, err, sizeof err)) fail("perplexity", err);
        }
        for (int j = first; j < C - 1; j++) {
            const float *row = logits + (size_t)j * V;
            int32_t next = toks[(size_t)c * C + j + 1];
            if (sf) safefile_write(sf, row, (size_t)V * sizeof(float));
            if (o.kl_base) {
                if (logits_read_row(&base, brow, err, sizeof err)) fail("perplexity", err);
                logits_compare(brow, row, V, next, &cmp[count]);
            }
            double mx = -INFINITY, sum = 0;
            for (int v = 0; v < V; v++) mx = row[v] > mx ? row[v] : mx;
            for (int v = 0; v < V; v++) sum += exp(row[v] - mx);
            double lp = row[next] - mx - log(sum);
            nll -= lp;
            nll2 += lp * lp;
            count++;
        }
        printf("[%d]%.4f,", c + 1, exp(nll / count));
        fflush(stdout);
        progress_note(&prog, "ppl %.4f", exp(nll / count));
        progress_update(&prog, c + 1, n_chunk);
    }
    progress_end(&prog);
    printf("\n");
    double mean = nll / count, mean2 = nll2 / count;
    double ppl = exp(mean);
    double unc = count > 1 ? sqrt((mean2 - mean * mean) / (count - 1)) : 0;
    printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, ppl * unc);
    fprintf(stderr, "perplexity: %ld tokens scored in %.2f s\n", count, lm_now() - t0);
    if (sf && safefile_commit(sf, err, sizeof err)) fail("perplexity", err);
    if (o.kl_base) {
        logits_summary s;
        logits_summarize(cmp, kls, count, &s);
        print_kl(&s);
        logits_close(&base);
    }
    free(cmp);
    free(kls);
    free(brow);
    free(logits);
    free(chunk);
    free(toks);
    lm_free(text);
    seqrun_free(st);
    pool_free(pool);
    model_free(m);
    return 0;
}
