/*
 * cmd_bench_spec.c - `lamina bench spec`: what speculative decoding (by
 * prompt lookup, or by a draft model with --draft-model) gains on one
 * prompt at batch 1.
 *
 * One engine with the proposer; each repetition runs the same greedy
 * request twice, speculation off (spec_k < 0) then on, so the two are
 * measured side by side under the same load. Reported: decode tokens/s of
 * each (the engine's own times: first token to the end), their medians and
 * ratio, the tokens proposed and accepted, the acceptance rate, the mean
 * tokens per verifying pass, and whether the two outputs are identical
 * token for token (they must be: greedy verification is lossless). With a
 * draft model, the price of a draft pass the engine measured at start (a
 * share of a model pass), which its cost model sizes proposals by.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/pool.h"
#include "base/safefile.h"
#include "base/util.h"
#include "cli.h"
#include "kernels/kernels.h"
#include "sched/draft.h"
#include "sched/engine.h"

static void usage_bench_spec(FILE *f) {
    fprintf(
        f,
        "usage: lamina bench spec -m MODEL.gguf -f PROMPT.txt [-n 128] [-r 3] [-t THREADS] [--draft-max K]\n"
        "                         [--draft-model DRAFT.gguf [--draft-min N] [--draft-p-min P] [--draft-cost P] [--draft-vocab N]]\n"
        "Generate greedily from the prompt with speculative decoding off and on, alternately,\n"
        "and print decode speed, acceptance and whether the outputs agree. The proposer is\n"
        "prompt lookup, --spec mtp (the model's next-token-prediction layer), or the draft\n"
        "model given.\n\n"
        "  -f FILE         the prompt (a copy-heavy one shows the gain)\n"
        "  -n N            tokens to generate (default 128)\n"
        "  -r N            repetitions of each (default 3)\n"
        "  -t N            threads (default: physical cores)\n"
        "  -c N            context (default: the model's, at most 4096)\n"
        "  --ctx-extend    allow -c above the model's trained context (with a warning)\n"
        "  --draft-max K   tokens proposed per step at most (default 4; 3 with --draft-model)\n"
        "  --draft-model FILE  a draft model with the same tokenizer proposes\n"
        "  --draft-min N, --draft-p-min P, --draft-cost P, --draft-vocab N  with --draft-model: see lamina run --help\n"
        "  --spec-widths W:T,...  the model pass's time by its rows: see lamina run --help\n");
}

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    lm_finish finish;
    lm_request_stats stats;
    int32_t *ids; /* (cap) generated tokens */
    int n, cap;
} spec_run;

static void on_event(void *user, const lm_event *ev) {
    spec_run *r = user;
    pthread_mutex_lock(&r->mu);
    if (!ev->done && r->n < r->cap) r->ids[r->n++] = ev->token;
    if (ev->done) {
        r->done = true;
        r->finish = ev->finish;
        r->stats = *ev->stats;
        pthread_cond_signal(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

/* One greedy request; its decode tokens/s, or -1 on failure. */
static double run_once(lm_engine *e, const int32_t *toks, int n_tok, int n_gen, int spec_k, spec_run *r) {
    r->done = false;
    r->n = 0;
    lm_request_params p;
    engine_request_params_default(&p);
    p.prompt = toks;
    p.n_prompt = n_tok;
    p.max_tokens = n_gen;
    p.sp.temp = 0;
    p.ignore_eos = true;
    p.spec_k = spec_k;
    p.on_event = on_event;
    p.user = r;
    char err[LM_ERRLEN];
    if (engine_submit(e, &p, NULL, err, sizeof err) != LM_OK) fail("bench spec", err);
    pthread_mutex_lock(&r->mu);
    while (!r->done) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    if (r->finish == LM_FINISH_ERROR || r->finish == LM_FINISH_CANCELLED || r->n < 2) return -1;
    double t = r->stats.e2e - r->stats.ttft;
    return t > 0 ? (r->n - 1) / t : -1;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int cmd_bench_spec(int argc, char **argv) {
    args a = {argc, argv, 0, "bench spec", usage_bench_spec};
    const char *model = NULL, *pfile = NULL;
    long long n_gen = 128, reps = 3, threads = pool_default_threads(), n_ctx = 0;
    bool ctx_extend = false;
    spec_opts so;
    spec_opts_default(&so);
    so.spec = LM_SPEC_NGRAM;
    for (a.i = 1; a.i < argc; a.i++) {
        if (is_help(&a)) continue;
        if (is_flag(&a, "-m", "--model")) model = need_val(&a);
        else if (is_flag(&a, "-f", "--file")) pfile = need_val(&a);
        else if (is_flag(&a, "-n", "--n-gen")) n_gen = need_int(&a, 2, 1 << 20);
        else if (is_flag(&a, "-r", "--repetitions")) reps = need_int(&a, 1, 100);
        else if (is_flag(&a, "-t", "--threads")) threads = need_int(&a, 1, 1024);
        else if (is_flag(&a, "-c", "--ctx-size")) n_ctx = need_int(&a, 1, 1 << 24);
        else if (is_flag(&a, "--spec", NULL)) {
            if ((so.spec = need_spec(&a)) == LM_SPEC_NONE)
                die_usage(&a, "%s", "the proposer is ngram (default), mtp, or --draft-model");
        } else if (spec_opts_flag(&a, &so)) continue;
        else if (is_flag(&a, "--ctx-extend", NULL)) ctx_extend = true;
        else die_usage(&a, "unknown argument '%s'", argv[a.i]);
    }
    if (!pfile) die_usage(&a, "%s", "no prompt file given (-f FILE)");
    char rerr[LM_ERRLEN];
    size_t len;
    char *text = safefile_read(pfile, &len, rerr, sizeof rerr);
    if (!text) fail("bench spec", rerr);
    lm_model *m = load_or_die("bench spec", model);
    if (!m->tok) fail("bench spec", "the model file has no tokenizer");
    if (n_ctx == 0) n_ctx = m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096;
    ctx_check("bench spec", "-c", n_ctx, m->hp.n_ctx_train, ctx_extend);
    int32_t *toks = NULL;
    int n_tok = encode_all(m->tok, text, len, tok_add_bos(m->tok), true, &toks);
    lm_free(text);
    if (n_tok < 1) fail("bench spec", "the prompt encodes to no tokens");
    if (n_tok + n_gen > n_ctx) fail("bench spec", "the prompt and -n do not fit the context (use -c)");
    lm_engine_config ec;
    engine_config_default(&ec);
    ec.n_threads = (int)threads;
    ec.max_seqs = 1;
    ec.n_ctx = (int)n_ctx;
    ec.prefix_cache = false; /* each run prefills the prompt itself */
    if (so.draft_path) so.spec = LM_SPEC_NONE;
    spec_opts_apply(&a, &so, &ec);
    char err[LM_ERRLEN];
    lm_status st;
    lm_engine *e = engine_new_tuned(m, m->tok, &ec, &(engine_tuning){.spec_widths = so.widths}, &st, err, sizeof err);
    if (!e) fail("bench spec", err);
    spec_run off = {.cap = (int)n_gen}, on = {.cap = (int)n_gen};
    off.ids = malloc((size_t)n_gen * sizeof *off.ids);
    on.ids = malloc((size_t)n_gen * sizeof *on.ids);
    double *t_off = malloc((size_t)reps * sizeof *t_off), *t_on = malloc((size_t)reps * sizeof *t_on);
    if (!off.ids || !on.ids || !t_off || !t_on) fail("bench spec", "out of memory");
    pthread_mutex_init(&off.mu, NULL), pthread_cond_init(&off.cv, NULL);
    pthread_mutex_init(&on.mu, NULL), pthread_cond_init(&on.cv, NULL);
    bool same = true;
    printf("prompt %d tokens, %lld generated, %lld threads, proposer %s, draft-max %d\n", n_tok, n_gen, threads,
           so.draft_path                ? so.draft_path
               : so.spec == LM_SPEC_MTP ? "mtp"
                                        : "ngram",
           so.max);
    printf("kernels: %s\n", kernels_isa_name());
    engine_spec_prices_t est;
    engine_spec_prices(e, &est);
    if (so.draft_path) {
        printf(
            "draft pass: %.3f of a model pass (the cost model's price of a guess: measured at start, or --draft-cost)\n",
            (double)est.draft_cost);
        int nv = draft_vocab_size(so.draft, so.vocab);
        if (nv > 0)
            printf("draft LM head: %d of %d tokens and the sequence's own (--draft-vocab)\n", nv, so.draft->hp.n_vocab);
        else printf("draft LM head: the whole vocabulary (%d tokens)\n", so.draft->hp.n_vocab);
    }
    if (est.width_rows > 0)
        printf("model pass over %d rows: %.2f of one row's (the width curve: timed at start, or --spec-widths)\n",
               (int)est.width_rows, (double)est.width_cost);
    printf("| rep | off tok/s | on tok/s | proposed | accepted | tokens per verifying pass |\n");
    printf("| ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (int i = 0; i < reps; i++) {
        t_off[i] = run_once(e, toks, n_tok, (int)n_gen, -1, &off);
        t_on[i] = run_once(e, toks, n_tok, (int)n_gen, 0, &on);
        if (t_off[i] < 0 || t_on[i] < 0) fail("bench spec", "a generation failed");
        same = same && off.n == on.n && !memcmp(off.ids, on.ids, (size_t)off.n * sizeof *off.ids);
        const lm_request_stats *s = &on.stats;
        printf("| %d | %.2f | %.2f | %d | %d | %.2f |\n", i + 1, t_off[i], t_on[i], s->spec_proposed, s->spec_accepted,
               s->spec_steps ? 1.0 + (double)s->spec_accepted / s->spec_steps : 0.0);
        fflush(stdout);
    }
    qsort(t_off, (size_t)reps, sizeof *t_off, cmp_double);
    qsort(t_on, (size_t)reps, sizeof *t_on, cmp_double);
    double mo = t_off[reps / 2], mn = t_on[reps / 2];
    const lm_request_stats *s = &on.stats;
    printf("median: off %.2f tok/s, on %.2f tok/s: %.2fx; acceptance %.1f%%; outputs %s\n", mo, mn, mn / mo,
           s->spec_proposed ? 100.0 * s->spec_accepted / s->spec_proposed : 0.0, same ? "identical" : "DIFFER");
    engine_free(e);
    free(off.ids), free(on.ids), free(t_off), free(t_on), free(toks);
    pthread_mutex_destroy(&off.mu), pthread_cond_destroy(&off.cv);
    pthread_mutex_destroy(&on.mu), pthread_cond_destroy(&on.cv);
    spec_opts_free(&so);
    model_free(m);
    return same ? 0 : 1;
}
