/*
 * bench_grammar.c - what constrained decoding costs: time per output token
 * through the engine with a JSON grammar against the same requests free,
 * and the mask's own time per token.
 *
 *   build/bench_grammar -m MODEL.gguf [-b BATCH] [-n TOKENS] [-t THREADS] [-g FILE.gbnf] [--temp T] [-r ROUNDS]
 *
 * Per batch size: B free requests (max_tokens n, ignore_eos), then B
 * constrained ones (the grammar below, or -g), same prompt and seeds; the
 * engine runs each set alone and the time per output token is wall time
 * over tokens generated. A constrained warm-up request first builds the
 * per-vocabulary tables (reported separately: once per engine). ROUNDS
 * (default 3) interleaved rounds, free then constrained: the best of each,
 * and the median and range of the per-round ratios, in wall time and in CPU
 * time of all threads (the steadier figure on a shared machine). Then the
 * mask alone: one constrained output replayed with a fresh matcher (every
 * state new: cold) and again after a reset (states cached: warm), timing
 * gmatch_mask at every token, and one sampling step as the engine takes it
 * (over the allowed ids when the mask keeps them, else over the masked
 * row), with the share of steps that took the list.
 *
 * The default grammar is what a JSON schema with a string, an integer, an
 * enum, a boolean and an array of strings compiles to, with bounded
 * whitespace, one object per line, repeated so that a request does not end
 * before its n tokens (free and constrained requests generate as many).
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/safefile.h"
#include "base/util.h"
#include "decode/grammar.h"
#include "decode/sample.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "sched/engine.h"
#include "text/tokenizer.h"

static const char *SCHEMA_GBNF =
    "root ::= object (\"\\n\" object)*\n"
    "object ::= \"{\" ws \"\\\"name\\\"\" ws \":\" ws string \",\" ws \"\\\"age\\\"\" ws \":\" ws integer \",\" ws "
    "\"\\\"role\\\"\" ws \":\" ws role \",\" ws \"\\\"active\\\"\" ws \":\" ws boolean \",\" ws "
    "\"\\\"tags\\\"\" ws \":\" ws tags ws \"}\"\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char ::= [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "integer ::= \"-\"? ([0-9] | [1-9] [0-9]{0,15})\n"
    "role ::= \"\\\"admin\\\"\" | \"\\\"user\\\"\" | \"\\\"guest\\\"\"\n"
    "boolean ::= \"true\" | \"false\"\n"
    "tags ::= \"[\" ws (string (\",\" ws string)*)? ws \"]\"\n"
    "ws ::= [ \\t\\n]{0,4}\n";

typedef struct {
    atomic_int done;
    atomic_long tokens;
    int32_t out[4096];
    int n_out;
} counter;

static void on_event(void *user, const lm_event *ev) {
    counter *c = user;
    if (ev->token >= 0) {
        atomic_fetch_add(&c->tokens, 1);
        if (ev->index == 0 && c->n_out < 4096) c->out[c->n_out++] = ev->token;
    }
    if (ev->done) atomic_fetch_add(&c->done, 1);
}

/* CPU seconds of the process (every thread) or of the calling thread. */
static double cpu_now(clockid_t which) {
    struct timespec ts;
    clock_gettime(which, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *x, int n) { return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]); }

/* Run b requests at once; wall seconds per generated token, and CPU
 * seconds (all threads) per generated token in *cpu. */
static double run_set(lm_engine *e, const int32_t *prompt, int n_prompt, int b, int n, float temp, const char *g,
                      counter *cs, long *n_tokens, double *cpu) {
    char err[LM_ERRLEN];
    double t0 = lm_now(), c0 = cpu_now(CLOCK_PROCESS_CPUTIME_ID);
    for (int i = 0; i < b; i++) {
        memset(&cs[i], 0, sizeof cs[i]);
        lm_request_params p;
        engine_request_params_default(&p);
        p.prompt = prompt;
        p.n_prompt = n_prompt;
        p.max_tokens = n;
        p.sp.temp = temp;
        p.sp.seed = 1 + (uint64_t)i;
        p.ignore_eos = true;
        p.grammar = g;
        p.on_event = on_event;
        p.user = &cs[i];
        if (engine_submit(e, &p, NULL, err, sizeof err) != LM_OK) {
            fprintf(stderr, "submit: %s\n", err);
            exit(1);
        }
    }
    engine_wait_idle(e);
    double dt = lm_now() - t0, dc = cpu_now(CLOCK_PROCESS_CPUTIME_ID) - c0;
    long tok = 0;
    for (int i = 0; i < b; i++) tok += atomic_load(&cs[i].tokens);
    *n_tokens = tok;
    if (cpu) *cpu = dc / (double)(tok ? tok : 1);
    return dt / (double)(tok ? tok : 1);
}

int main(int argc, char **argv) {
    const char *path = NULL, *gfile = NULL;
    int batch = 1, n = 64, threads = 2, rounds = 3;
    float temp = 0.8f;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "-b") && i + 1 < argc) batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-g") && i + 1 < argc) gfile = argv[++i];
        else if (!strcmp(argv[i], "--temp") && i + 1 < argc) temp = (float)atof(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) rounds = atoi(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: bench_grammar -m MODEL.gguf [-b BATCH] [-n TOKENS] [-t THREADS] [-g FILE.gbnf] "
                    "[--temp T] [-r ROUNDS]\n");
            return 2;
        }
    }
    if (!path || batch < 1 || batch > 64 || n < 1 || rounds < 1 || rounds > 64) return 2;
    char err[LM_ERRLEN];
    const char *gbnf = SCHEMA_GBNF;
    char *gbuf = NULL;
    if (gfile) {
        size_t len;
        if (!(gbuf = safefile_read(gfile, &len, err, sizeof err))) return fprintf(stderr, "%s\n", err), 1;
        gbnf = gbuf;
    }
    kernels_init();
    lm_model *m = model_load(path, err, sizeof err);
    if (!m || !m->tok) return fprintf(stderr, "%s\n", m ? "no tokenizer" : err), 1;
    lm_engine_config ec;
    engine_config_default(&ec);
    ec.n_threads = threads;
    ec.max_seqs = batch;
    ec.n_ctx = 512;
    lm_engine *e = engine_new(m, m->tok, &ec, err, sizeof err);
    if (!e) return fprintf(stderr, "%s\n", err), 1;
    int32_t prompt[64];
    const char *text = "Describe one user as JSON:";
    int n_prompt = tok_encode(m->tok, text, strlen(text), tok_add_bos(m->tok), false, prompt, 64);
    counter *cs = calloc((size_t)batch, sizeof *cs);
    long tok_free, tok_g;

    /* the engine's per-vocabulary tables: built by the first constrained request */
    run_set(e, prompt, n_prompt, 1, 1, temp, gbnf, cs, &tok_g, NULL);
    /* warm the model's pages, then free and constrained, twice, best of each */
    run_set(e, prompt, n_prompt, batch, 8, temp, NULL, cs, &tok_free, NULL);
    double best_free = 1e9, best_g = 1e9, cpu_free = 1e9, cpu_g = 1e9;
    double wr[64], cr[64];
    for (int rep = 0; rep < rounds; rep++) { /* interleaved: the machine may be shared */
        double cf, cg;
        double f = run_set(e, prompt, n_prompt, batch, n, temp, NULL, cs, &tok_free, &cf);
        double g = run_set(e, prompt, n_prompt, batch, n, temp, gbnf, cs, &tok_g, &cg);
        wr[rep] = g / f;
        cr[rep] = cg / cf;
        if (f < best_free) best_free = f;
        if (g < best_g) best_g = g;
        if (cf < cpu_free) cpu_free = cf;
        if (cg < cpu_g) cpu_g = cg;
    }
    /* the mask alone, replaying request 0's constrained output */
    double t0 = cpu_now(CLOCK_THREAD_CPUTIME_ID);
    lm_gvocab *gv = grammar_vocab_new(m->tok, err, sizeof err);
    double t_tables = cpu_now(CLOCK_THREAD_CPUTIME_ID) - t0;
    lm_grammar *gr = grammar_parse(gbnf, strlen(gbnf), NULL, err, sizeof err);
    lm_gmatch *gm = gv && gr ? gmatch_new(gr, gv, err, sizeof err) : NULL;
    if (!gm) return fprintf(stderr, "%s\n", err), 1;
    uint32_t *mask = malloc(((size_t)grammar_vocab_size(gv) + 31) / 32 * 4);
    double cold = 0, warm = 0, cold_max = 0, t_free = 0, t_con = 0;
    int steps = 0, n_sparse = 0;
    /* a sampling step alone and with the mask applied (cached masks), on
     * random logits: the per-token cost the grammar adds to sampling */
    int32_t V = m->hp.n_vocab;
    float *row = malloc((size_t)V * sizeof *row), *work = malloc((size_t)V * sizeof *row);
    lm_rng rng;
    lm_rng_seed(&rng, 7);
    for (int32_t i = 0; i < V; i++) row[i] = 3.0f * lm_rng_normal(&rng);
    lm_sample_params sp;
    sample_params_default(&sp);
    sp.temp = temp;
    lm_sampler *smp = sampler_new(&sp, V);
    for (int pass = 0; pass < 2; pass++) {
        gmatch_reset(gm);
        for (int i = 0; i < cs[0].n_out; i++) {
            double s = cpu_now(CLOCK_THREAD_CPUTIME_ID);
            gmatch_mask(gm, mask);
            double d = cpu_now(CLOCK_THREAD_CPUTIME_ID) - s;
            if (pass == 0) {
                cold += d;
                if (d > cold_max) cold_max = d;
                steps++;
            } else {
                warm += d;
                memcpy(work, row, (size_t)V * sizeof *row);
                double s1 = cpu_now(CLOCK_THREAD_CPUTIME_ID);
                sampler_sample(smp, work);
                double s2 = cpu_now(CLOCK_THREAD_CPUTIME_ID);
                memcpy(work, row, (size_t)V * sizeof *row);
                double s3 = cpu_now(CLOCK_THREAD_CPUTIME_ID);
                gmatch_mask(gm, mask);
                int32_t n_ids;
                const int32_t *ids = gmatch_mask_ids(gm, &n_ids);
                if (ids) { /* as the engine samples */
                    sampler_sample_sparse(smp, row, ids, n_ids, work);
                    n_sparse++;
                } else {
                    grammar_mask_apply(mask, grammar_vocab_size(gv), work, V);
                    sampler_sample(smp, work);
                }
                double s4 = cpu_now(CLOCK_THREAD_CPUTIME_ID);
                t_free += s2 - s1;
                t_con += s4 - s3;
            }
            if (gmatch_accept(gm, cs[0].out[i]) != 0) break;
        }
    }
    printf("model %s, vocabulary %d tokens, batch %d, %d tokens per request, temp %.2f, %d threads\n", path,
           m->hp.n_vocab, batch, n, temp, threads);
    printf("per-vocabulary tables, once per engine (thread CPU time): %.1f ms\n", t_tables * 1e3);
    printf("time per output token (wall): free %.2f ms, JSON grammar %.2f ms, ratio %.3f\n", best_free * 1e3,
           best_g * 1e3, best_g / best_free);
    printf("CPU time per output token (all threads): free %.2f ms, JSON grammar %.2f ms, ratio %.3f\n", cpu_free * 1e3,
           cpu_g * 1e3, cpu_g / cpu_free);
    qsort(wr, (size_t)rounds, sizeof *wr, cmp_double);
    qsort(cr, (size_t)rounds, sizeof *cr, cmp_double);
    printf("per-round ratios over %d rounds: wall median %.3f (%.3f to %.3f), CPU median %.3f (%.3f to %.3f)\n", rounds,
           median(wr, rounds), wr[0], wr[rounds - 1], median(cr, rounds), cr[0], cr[rounds - 1]);
    printf("mask per token (thread CPU time) over %d tokens: cold %.3f ms (max %.2f ms), cached %.4f ms\n", steps,
           steps ? cold / steps * 1e3 : 0, cold_max * 1e3, steps ? warm / steps * 1e3 : 0);
    printf("sampling step (thread CPU time, cached masks): free %.3f ms, masked %.3f ms (%d of %d steps over the "
           "allowed ids)\n",
           t_free / steps * 1e3, t_con / steps * 1e3, n_sparse, steps);
    free(mask);
    free(row);
    free(work);
    sampler_free(smp);
    gmatch_free(gm);
    grammar_free(gr);
    grammar_vocab_free(gv);
    free(cs);
    free(gbuf);
    engine_free(e);
    model_free(m);
    return 0;
}
