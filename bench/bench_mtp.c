/*
 * bench_mtp.c - how often the next-token-prediction head's greedy drafts
 * (model/mtp.h) would be accepted, against prompt lookup's, on one prompt.
 *
 * Build: `make bench` (build/bench_mtp).
 *
 * Run: build/bench_mtp -m MODEL.gguf [-f PROMPT.txt | -p TEXT] [-n 96] [-k 3] [-t 2]
 *
 * The model decodes greedily (lm_seqrun, one token a pass), keeping every
 * position's state after the final norm (lm_fwd.hid). Greedy speculation is
 * then replayed on that output, which it must reproduce: at each step with
 * tokens[0 .. L] known, a proposer guesses k tokens after tokens[L]; the
 * guesses equal to tokens[L+1 ..] up to the first miss are accepted, and
 * the step emits them and the verifying pass's own token (L advances by
 * accepted + 1). The MTP head first catches up on the positions it has not
 * seen (token p with the trunk's state at p - 1; zeros at 0), then chains k
 * drafts from its own h'. Prompt lookup is spec_ngram_propose over the same
 * tokens. Printed per proposer: steps, tokens proposed and accepted, the
 * acceptance rate, tokens per verifying pass; and the measured times of a
 * one-token pass, a (k+1)-token pass at the same depth and one MTP row, with
 * the decode speed they imply (tokens per step / (verify pass + its draft
 * rows)) beside the plain one-token speed. Times are medians.
 *
 * -D instead prints, for every L from the prompt's end, the chain of k
 * drafts the head makes after tokens[0 .. L] (each with its logit and top-2
 * margin), to compare with another engine's MTP drafts on the same file.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/pool.h"
#include "base/util.h"
#include "decode/spec.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/mtp.h"
#include "text/tokenizer.h"

static void die(const char *what) {
    fprintf(stderr, "bench_mtp: %s\n", what);
    exit(1);
}

static int32_t argmax(const float *l, int n) { return mtp_argmax(l, n); }

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}

typedef struct {
    int steps, spec_steps, proposed, accepted, emitted; /* spec_steps: steps that proposed at least one */
} tally;

static void report(const char *name, const tally *t, int k, double t_verify, double t_draft, double t_one) {
    double per = (double)t->emitted / t->steps;
    /* a step that proposed nothing is a plain one-token pass */
    double step_s = (t->spec_steps * t_verify + (t->steps - t->spec_steps) * t_one + t->proposed * t_draft) / t->steps;
    printf("%-6s k=%d  steps %4d  proposed %4d  accepted %4d  acceptance %5.1f%%  tokens/pass %.2f  "
           "est. %.1f tok/s (plain %.1f)\n",
           name, k, t->steps, t->proposed, t->accepted, t->proposed ? 100.0 * t->accepted / t->proposed : 0.0, per,
           per / step_s, 1.0 / t_one);
}

int main(int argc, char **argv) {
    const char *path = NULL, *prompt = "The quick brown fox jumps over the lazy dog. The quick brown fox";
    char *file_text = NULL;
    int n_gen = 96, k = 3, threads = 2;
    bool dump = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "-p") && i + 1 < argc) prompt = argv[++i];
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) n_gen = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-k") && i + 1 < argc) k = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-D")) dump = true;
        else if (!strcmp(argv[i], "-f") && i + 1 < argc) {
            FILE *f = fopen(argv[++i], "rb");
            if (!f) die("cannot open the prompt file");
            file_text = calloc(1 << 20, 1);
            if (!file_text || fread(file_text, 1, (1 << 20) - 1, f) == 0) die("cannot read the prompt file");
            fclose(f);
            prompt = file_text;
        } else {
            fprintf(stderr, "usage: bench_mtp -m MODEL.gguf [-f PROMPT.txt | -p TEXT] [-n 96] [-k 3] [-t 2]\n");
            return 2;
        }
    }
    if (!path || n_gen < 1 || k < 1 || k > 16 || threads < 1) die("need -m MODEL.gguf, -n >= 1, 1 <= k <= 16");
    char err[LM_ERRLEN];
    lm_model *m = model_load(path, err, sizeof err);
    if (!m) die(err);
    if (!m->tok) die("the model has no tokenizer");
    lm_pool *pool = pool_new(threads);
    const int E = m->hp.n_embd, V = m->hp.n_vocab, n_batch = 512;
    int np = tok_encode(m->tok, prompt, strlen(prompt), tok_add_bos(m->tok), false, NULL, 0);
    if (np < 2 || np > n_batch) die("the prompt must encode to 2 .. 512 tokens");
    const int n_ctx = np + n_gen + k + 2;
    int32_t *toks = malloc((size_t)n_ctx * sizeof *toks);
    float *H = calloc((size_t)n_ctx * E, sizeof *H), *hid = malloc((size_t)n_batch * E * sizeof *hid);
    float *lg = malloc((size_t)V * sizeof *lg), *h1 = malloc((size_t)E * sizeof *h1), *zero = calloc((size_t)E, 4);
    double *ts = malloc((size_t)(n_gen + 64) * sizeof *ts);
    tok_encode(m->tok, prompt, strlen(prompt), tok_add_bos(m->tok), false, toks, np);
    lm_seqrun *r = seqrun_new(m, pool, n_ctx, n_batch, LM_KV_F16, err, sizeof err);
    mtp_head *c = mtp_new(m, pool, n_ctx, NULL, err, sizeof err);
    if (!r || !c) die(err);
    r->fwd->hid = hid;
    /* the greedy output and every position's state */
    if (seqrun_forward(r, toks, np, lg, false, err, sizeof err)) die(err);
    memcpy(H, hid, (size_t)np * E * sizeof *H);
    int n = np;
    for (int i = 0; i < n_gen; i++) {
        toks[n] = argmax(lg, V);
        double t0 = lm_now();
        if (seqrun_forward(r, toks + n, 1, lg, false, err, sizeof err)) die(err);
        ts[i] = lm_now() - t0;
        memcpy(H + (size_t)n * E, hid, (size_t)E * sizeof *H);
        n++;
    }
    toks[n] = argmax(lg, V); /* tokens[0 .. n] known */
    double t_one = median(ts, n_gen);
    /* a verifying pass of k + 1 rows at the end of the prompt, on a second sequence */
    lm_seqrun *r2 = seqrun_new(m, pool, n_ctx, n_batch, LM_KV_F16, err, sizeof err);
    if (!r2) die(err);
    int reps = 7;
    for (int i = 0; i < reps; i++) {
        seqrun_reset(r2);
        if (seqrun_forward(r2, toks, np, NULL, false, err, sizeof err)) die(err);
        double t0 = lm_now();
        if (seqrun_forward(r2, toks + np, k + 1, NULL, false, err, sizeof err)) die(err);
        ts[i] = lm_now() - t0;
    }
    double t_verify = median(ts, reps);
    if (dump) { /* every L: catch up to L, then the chain */
        printf("tokens:");
        for (int i = 0; i <= n; i++) printf(" %d", toks[i]);
        printf("\n");
        for (int L = np, filled = 0; L < n; L++, filled = L) {
            for (; filled < L; filled++)
                if (mtp_run(c, filled ? H + (size_t)(filled - 1) * E : zero, toks + filled, 1, filled, NULL, NULL, err,
                            sizeof err))
                    die(err);
            const float *h = H + (size_t)(L - 1) * E;
            int32_t t = toks[L];
            printf("L %d drafts:", L);
            for (int j = 0; j < k; j++) {
                if (mtp_run(c, h, &t, 1, L + j, lg, h1, err, sizeof err)) die(err);
                t = argmax(lg, V);
                float second = -INFINITY;
                for (int i = 0; i < V; i++)
                    if (i != t && lg[i] > second) second = lg[i];
                printf(" %d(%.4f,m%.4f)", t, lg[t], lg[t] - second);
                h = h1;
            }
            printf("\n");
        }
        return 0;
    }
    /* replay: MTP */
    tally tm = {0}, tn = {0};
    int filled = 0, nd = 0;
    int32_t guess[16];
    for (int L = np; L < n;) {
        for (; filled < L; filled++) /* catch up: token p with the trunk's state at p - 1 */
            if (mtp_run(c, filled ? H + (size_t)(filled - 1) * E : zero, toks + filled, 1, filled, NULL, NULL, err,
                        sizeof err))
                die(err);
        const float *h = H + (size_t)(L - 1) * E;
        int32_t t = toks[L];
        for (int j = 0; j < k; j++) { /* the chain: row L + j, its own h' after the first */
            double t0 = lm_now();
            if (mtp_run(c, h, &t, 1, L + j, lg, h1, err, sizeof err)) die(err);
            if (nd < n_gen + 64) ts[nd++] = lm_now() - t0;
            guess[j] = t = argmax(lg, V);
            h = h1;
        }
        filled = L + 1; /* rows past L were drafts: written again by the catch-up */
        int a = 0;
        while (a < k && L + 1 + a <= n && guess[a] == toks[L + 1 + a]) a++;
        tm.steps++, tm.spec_steps++, tm.proposed += k, tm.accepted += a, tm.emitted += a + 1;
        L += a + 1;
    }
    double t_draft = median(ts, nd);
    /* replay: prompt lookup */
    for (int L = np; L < n;) {
        int got = spec_ngram_propose(toks, L + 1, k, guess), a = 0;
        while (a < got && L + 1 + a <= n && guess[a] == toks[L + 1 + a]) a++;
        tn.steps++, tn.spec_steps += got > 0, tn.proposed += got, tn.accepted += a, tn.emitted += a + 1;
        L += a + 1;
    }
    printf("%s: prompt %d tokens, %d generated, %d threads; one-token pass %.2f ms, %d-token pass %.2f ms, "
           "MTP row %.2f ms\n",
           m->name, np, n_gen, threads, t_one * 1e3, k + 1, t_verify * 1e3, t_draft * 1e3);
    report("mtp", &tm, k, t_verify, t_draft, t_one);
    report("ngram", &tn, k, t_verify, 0.0, t_one);
    mtp_free(c);
    seqrun_free(r), seqrun_free(r2);
    pool_free(pool);
    model_free(m);
    free(toks), free(H), free(hid), free(lg), free(h1), free(zero), free(ts), free(file_text);
    return 0;
}
