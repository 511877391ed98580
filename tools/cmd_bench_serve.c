/*
 * cmd_bench_serve.c - `lamina bench serve`: a serving workload replayed
 * against the engine three ways, with the metrics vLLM's serving benchmark
 * reports.
 *
 * Workload: N requests whose prompt and output lengths are drawn from a
 * seeded mixture (three in four short, one in four long), prompts of random
 * token ids after BOS, every request generating exactly its output length
 * (EOS ignored). Arrivals: all at once with a cap of C in flight (closed
 * loop: a finished request lets the next one in), or a Poisson process of
 * rate R requests/s.
 *
 * Modes, each on a fresh engine over the same model:
 *   one-at-a-time  one sequence runs; the rest queue
 *   static         a batch of B = min(C, max_seqs) is admitted together into
 *                  an empty engine and no one joins until all of it finished
 *   continuous     requests join and leave at every iteration
 * Reported per mode: request throughput, output and total token throughput,
 * TTFT, TPOT, ITL and end-to-end latency (mean, p50, p99), and the mean
 * number of sequences per iteration; with speculative decoding (--spec or
 * --draft-model), the tokens proposed and accepted, the mean tokens per
 * verifying pass, and the share of decode passes that verified a proposal
 * (under load the scheduler shrinks speculation and a draft stands aside,
 * so the share falls).
 * --prompt-file gives every request the same text prompt instead (a
 * copy-heavy workload for prompt lookup).
 *
 * --shared-prefix N: request i's prompt is BOS, then system prompt i mod N
 * (--prefix-len random tokens, the same for every request that shares it),
 * then its own drawn tokens. Each mode then runs twice, with the prefix
 * cache off and on (on an empty cache each time), and reports the hit rate:
 * prompt tokens taken from the cache over all prompt tokens, and the blocks
 * the engine's lookups found.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "kernels/kernels.h"
#include "model/forward.h"
#include "sched/engine.h"
#include "base/pool.h"
#include "base/safefile.h"
#include "format/quant.h"
#include "base/util.h"

static void usage_bench_serve(FILE *f) {
    fprintf(
        f,
        "usage: lamina bench serve -m MODEL.gguf [--requests N] [--concurrency C | --rate R] [--seed S]\n"
        "                          [-t THREADS] [options]\n"
        "Replay a serving workload one request at a time, with static batching and with\n"
        "continuous batching; print throughput and latency for each.\n\n"
        "  --requests N        requests in the workload (default 64)\n"
        "  --concurrency C     requests in flight at once, all arriving at the start (default N)\n"
        "  --rate R            Poisson arrivals at R requests/s instead (concurrency unbounded)\n"
        "  --seed S            workload seed (default 1)\n"
        "  --prompt-len A:B    short prompts' token range (default 16:96); long ones are 3x-6x B\n"
        "  --output-len A:B    short outputs' token range (default 16:64); long ones are 2x-4x B\n"
        "  --fixed P:G         every request has P prompt and G generated tokens instead\n"
        "  --modes LIST        comma-separated subset of one-at-a-time,static,continuous\n"
        "  -t N                threads (default: physical cores)\n"
        "  -c N                context per sequence (default: the model's)\n"
        "  --ctx-extend        allow -c above the model's trained context (with a warning)\n"
        "  --batch-tokens N    tokens per iteration (default %d; at least 64 for a hybrid model)\n"
        "  --itl-factor F      the latency bound on prompt chunks beside decodes (default 0: off;\n"
        "                      see lamina serve --help)\n"
        "  --max-seqs N        sequences per iteration (default 64)\n"
        "  --kv-mem BYTES      KV pool size (default: context x max-seqs, at most 4 GiB)\n"
        "  --kv-type T         F16 (default), F32, Q8_0\n"
        "  --state-snapshots N hybrid models: recurrent-state snapshot slots for the prefix cache\n"
        "                      (default: --max-seqs; 0: none)\n"
        "  --spec ngram        speculative decoding by prompt lookup\n"
        "  --draft-model FILE  speculative decoding by a draft model (same tokenizer)\n"
        "  --draft-max K       tokens proposed per step at most (default 4; 3 with --draft-model)\n"
        "  --draft-min N, --draft-p-min P, --draft-cost P, --draft-vocab N  with --draft-model: see lamina run --help\n"
        "  --spec-widths W:T,...  the model pass's time by its rows: see lamina run --help\n"
        "  --prompt-file FILE  every request's prompt is this text (outputs still drawn)\n"
        "  --shared-prefix N   prompts start with one of N shared system prompts; each mode runs\n"
        "                      with the prefix cache off and on\n"
        "  --prefix-len L      tokens per shared system prompt (default 256)\n"
        "  --temp T            sampling temperature (default 0: greedy)\n"
        "  --profile           print where the engine's iterations spend their time, per op\n"
        "  --serial-sampling   draw the tokens one after another on the engine thread\n",
        FWD_BATCH_DEFAULT);
}

typedef struct {
    int n_prompt, n_out;
    double t_arrive; /* offset from the start (Poisson) */
} work_item;

typedef struct bench_run bench_run;

typedef struct {
    bench_run *run;
    int id;
    double t_submit, t_first, t_last, t_done;
    int n_tok;
    int cached; /* prompt tokens the prefix cache gave */
    bool failed;
} req_rec;

struct bench_run {
    lm_engine *e;
    const work_item *w;
    int n;
    int32_t **prompts;
    req_rec *rec;
    double *itl; /* (sum of outputs) inter-token latencies */
    int n_itl, itl_cap;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int next, done, in_flight, concurrency;
    bool closed_loop;
};

static void submit_next_locked(bench_run *b);

/* --temp and --profile (set once before any run) */
static float bench_temp = 0;
static bool bench_profile = false, bench_serial = false;
static const char *bench_widths; /* --spec-widths */

static void on_event(void *user, const lm_event *ev) {
    req_rec *r = user;
    bench_run *b = r->run;
    double now = lm_now();
    pthread_mutex_lock(&b->mu);
    if (ev->token >= 0) {
        if (r->n_tok == 0) r->t_first = now;
        else if (b->n_itl < b->itl_cap) b->itl[b->n_itl++] = now - r->t_last;
        r->t_last = now;
        r->n_tok++;
    }
    if (ev->done) {
        r->t_done = now;
        r->failed = ev->finish == LM_FINISH_ERROR || ev->finish == LM_FINISH_CANCELLED;
        if (ev->stats) r->cached = ev->stats->cached_tokens;
        b->done++;
        b->in_flight--;
        if (b->closed_loop) submit_next_locked(b);
        pthread_cond_broadcast(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
}

static void submit_one_locked(bench_run *b, int i) {
    const work_item *w = &b->w[i];
    lm_request_params p;
    engine_request_params_default(&p);
    p.prompt = b->prompts[i];
    p.n_prompt = w->n_prompt;
    p.max_tokens = w->n_out;
    p.ignore_eos = true;
    p.sp.temp = bench_temp;
    p.on_event = on_event;
    p.user = &b->rec[i];
    b->rec[i] = (req_rec){.run = b, .id = i, .t_submit = lm_now()};
    b->in_flight++;
    char err[LM_ERRLEN];
    /* the engine never calls back before submit returns (it only queues) */
    if (engine_submit(b->e, &p, NULL, err, sizeof err) != LM_OK) {
        fprintf(stderr, "lamina bench serve: request %d: %s\n", i, err);
        b->rec[i].failed = true;
        b->done++;
        b->in_flight--;
    }
}

static void submit_next_locked(bench_run *b) {
    while (b->next < b->n && b->in_flight < b->concurrency) submit_one_locked(b, b->next++);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    double mean, p50, p99;
} dist;

static dist dist_of(double *v, int n) {
    dist d = {0, 0, 0};
    if (n <= 0) return d;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    for (int i = 0; i < n; i++) d.mean += v[i];
    d.mean /= n;
    d.p50 = v[(int)floor(0.50 * (n - 1) + 0.5)];
    d.p99 = v[(int)floor(0.99 * (n - 1) + 0.5)];
    return d;
}

typedef struct {
    const char *name;
    double wall, req_s, out_tok_s, total_tok_s, decode_tok_s, mean_batch;
    dist ttft, tpot, itl, e2e;
    int failed;
    double hit_rate; /* prompt tokens from the prefix cache / prompt tokens */
    uint64_t prefix_queries, prefix_hits;
    uint64_t preemptions;
    uint64_t spec_proposed, spec_accepted, spec_steps;
    uint64_t gen_tokens; /* tokens generated: with the accepted ones, the decode passes per sequence */
} mode_result;

/* The engine's iteration times: per op of the forward pass, sampling,
 * emitting, and what is left of the wall time (scheduling, waiting). */
static void print_profile(lm_engine *e, const char *name, double wall) {
    engine_profile_t p;
    engine_profile(e, &p);
    if (!p.steps) return;
    double ops = 0;
    for (int i = 0; i < LM_PROF_COUNT; i++) ops += p.ops[i];
    printf("profile (%s): %llu iterations, %.1f sequences each; ms per iteration and share of the wall time\n", name,
           (unsigned long long)p.steps, (double)p.seqs / (double)p.steps);
    double ms = 1e3 / (double)p.steps;
    for (int i = 0; i < LM_PROF_COUNT; i++)
        if (p.ops[i] > 0) printf("  %-22s %8.2f ms %5.1f%%\n", lm_prof_names[i], p.ops[i] * ms, 100 * p.ops[i] / wall);
    printf("  %-22s %8.2f ms %5.1f%%\n", "forward (other)", (p.forward - ops) * ms, 100 * (p.forward - ops) / wall);
    printf("  %-22s %8.2f ms %5.1f%%\n", "sampling", p.sample * ms, 100 * p.sample / wall);
    printf("  %-22s %8.2f ms %5.1f%%\n", "detokenize + events", p.emit * ms, 100 * p.emit / wall);
    if (p.draft_steps)
        printf("  %-22s %8.2f ms %5.1f%%   (%.2f ms in each of %llu iterations)\n", "draft model", p.draft * ms,
               100 * p.draft / wall, 1e3 * p.draft / (double)p.draft_steps, (unsigned long long)p.draft_steps);
    if (p.guard_off)
        printf("  speculation kept off by the measured guard in %llu iterations\n", (unsigned long long)p.guard_off);
    double rest = wall - p.forward - p.sample - p.emit - p.draft;
    printf("  %-22s %8.2f ms %5.1f%%\n", "scheduling + idle", rest * ms, 100 * rest / wall);
}

static int run_mode(const lm_model *m, const lm_engine_config *ec, const work_item *w, int n, int32_t **prompts,
                    int concurrency, bool poisson, const char *name, mode_result *res) {
    char err[LM_ERRLEN];
    lm_status status;
    lm_engine *e =
        engine_new_tuned(m, m->tok, ec, &(engine_tuning){.spec_widths = bench_widths}, &status, err, sizeof err);
    if (!e) {
        fprintf(stderr, "lamina bench serve: %s\n", err);
        return -1;
    }
    engine_set_profile(e, bench_profile);
    engine_set_serial_sampling(e, bench_serial);
    bench_run b = {.e = e, .w = w, .n = n, .prompts = prompts, .concurrency = concurrency, .closed_loop = !poisson};
    b.rec = calloc((size_t)n, sizeof *b.rec);
    b.itl_cap = 0;
    for (int i = 0; i < n; i++) b.itl_cap += w[i].n_out;
    b.itl = malloc((size_t)b.itl_cap * sizeof *b.itl);
    pthread_mutex_init(&b.mu, NULL);
    pthread_cond_init(&b.cv, NULL);
    /* requests done, on a terminal (drawn under b.mu, at most 4 times a second) */
    progress_line prog;
    progress_begin(&prog, "bench serve", name, "requests done");
    double t0 = lm_now();
    pthread_mutex_lock(&b.mu);
    if (!poisson) {
        submit_next_locked(&b);
    } else {
        b.concurrency = n;
        for (int i = 0; i < n; i++) {
            double due = t0 + w[i].t_arrive;
            while (lm_now() < due) {
                pthread_mutex_unlock(&b.mu);
                double dt = due - lm_now();
                if (dt > 0) {
                    struct timespec ts = {.tv_sec = (time_t)dt, .tv_nsec = (long)((dt - floor(dt)) * 1e9)};
                    nanosleep(&ts, NULL);
                }
                pthread_mutex_lock(&b.mu);
            }
            submit_one_locked(&b, i);
            b.next = i + 1;
            progress_update(&prog, b.done, n);
        }
    }
    while (b.done < n) {
        pthread_cond_wait(&b.cv, &b.mu);
        progress_update(&prog, b.done, n);
    }
    pthread_mutex_unlock(&b.mu);
    progress_end(&prog);
    double t_end = lm_now();
    lm_engine_stats st;
    engine_stats(e, &st);
    if (bench_profile) print_profile(e, name, t_end - t0);
    engine_free(e);

    *res = (mode_result){.name = name,
                         .wall = t_end - t0,
                         .preemptions = st.preemptions_total,
                         .spec_proposed = st.spec_proposed_total,
                         .spec_accepted = st.spec_accepted_total,
                         .spec_steps = st.spec_steps_total,
                         .gen_tokens = st.generation_tokens_total,
                         .prefix_queries = st.prefix_queries_total,
                         .prefix_hits = st.prefix_hits_total};
    double *ttft = malloc((size_t)n * sizeof *ttft), *tpot = malloc((size_t)n * sizeof *tpot),
           *e2e = malloc((size_t)n * sizeof *e2e);
    int n_ok = 0, n_tpot = 0;
    long out_tok = 0, in_tok = 0, cached_tok = 0;
    double last_first = t0;
    for (int i = 0; i < n; i++) {
        req_rec *r = &b.rec[i];
        if (r->failed) {
            res->failed++;
            continue;
        }
        ttft[n_ok] = r->t_first - r->t_submit;
        e2e[n_ok++] = r->t_done - r->t_submit;
        if (r->n_tok > 1) tpot[n_tpot++] = (r->t_last - r->t_first) / (r->n_tok - 1);
        out_tok += r->n_tok;
        in_tok += w[i].n_prompt;
        cached_tok += r->cached;
        if (r->t_first > last_first) last_first = r->t_first;
    }
    res->hit_rate = in_tok ? (double)cached_tok / (double)in_tok : 0;
    res->req_s = n_ok / res->wall;
    res->out_tok_s = (double)out_tok / res->wall;
    res->total_tok_s = (double)(out_tok + in_tok) / res->wall;
    /* decode rate once every request has its first token (as llama-batched-bench's S_TG) */
    res->decode_tok_s = t_end > last_first ? (double)(out_tok - n_ok) / (t_end - last_first) : 0;
    res->mean_batch = st.iterations ? (double)st.batch_seqs_total / (double)st.iterations : 0;
    res->ttft = dist_of(ttft, n_ok);
    res->tpot = dist_of(tpot, n_tpot);
    res->e2e = dist_of(e2e, n_ok);
    res->itl = dist_of(b.itl, b.n_itl);
    free(ttft);
    free(tpot);
    free(e2e);
    free(b.itl);
    free(b.rec);
    pthread_mutex_destroy(&b.mu);
    pthread_cond_destroy(&b.cv);
    return 0;
}

static void parse_range(args *a, int *lo, int *hi) {
    const char *v = need_val(a);
    char *end;
    long x = strtol(v, &end, 10), y = x;
    if (*end == ':') y = strtol(end + 1, &end, 10);
    if (*end || x < 1 || y < x || y > 1 << 20) die_usage(a, "'%s' is not a range A:B of positive integers", v);
    *lo = (int)x;
    *hi = (int)y;
}

/* One mode's result lines. */
static void print_mode(const mode_result *x, bool spec) {
    printf("%-14s %8.2f tok/s output   %8.2f tok/s total   %6.3f req/s   mean batch %5.2f seqs   "
           "%.1f s%s\n",
           x->name, x->out_tok_s, x->total_tok_s, x->req_s, x->mean_batch, x->wall,
           x->failed ? "   (FAILED REQUESTS)" : "");
    printf("  %-12s mean %8.1f  p50 %8.1f  p99 %8.1f ms\n", "TTFT", x->ttft.mean * 1e3, x->ttft.p50 * 1e3,
           x->ttft.p99 * 1e3);
    printf("  %-12s mean %8.1f  p50 %8.1f  p99 %8.1f ms\n", "TPOT", x->tpot.mean * 1e3, x->tpot.p50 * 1e3,
           x->tpot.p99 * 1e3);
    printf("  %-12s mean %8.1f  p50 %8.1f  p99 %8.1f ms\n", "ITL", x->itl.mean * 1e3, x->itl.p50 * 1e3,
           x->itl.p99 * 1e3);
    printf("  %-12s mean %8.1f  p50 %8.1f  p99 %8.1f ms\n", "E2E latency", x->e2e.mean * 1e3, x->e2e.p50 * 1e3,
           x->e2e.p99 * 1e3);
    printf("  decode after the last first token: %.2f tok/s; %d failed, %llu preemptions\n", x->decode_tok_s, x->failed,
           (unsigned long long)x->preemptions);
    if (spec) {
        /* a sequence's decode passes: its tokens less those accepted (a
         * verifying pass yields 1 + accepted) */
        uint64_t passes = x->gen_tokens > x->spec_accepted ? x->gen_tokens - x->spec_accepted : 0;
        printf("  speculation: %llu proposed, %llu accepted (%.1f%%), %.2f tokens per verifying pass; "
               "%llu of %llu decode passes verified a proposal (%.1f%%)\n",
               (unsigned long long)x->spec_proposed, (unsigned long long)x->spec_accepted,
               x->spec_proposed ? 100.0 * (double)x->spec_accepted / (double)x->spec_proposed : 0.0,
               x->spec_steps ? 1.0 + (double)x->spec_accepted / (double)x->spec_steps : 0.0,
               (unsigned long long)x->spec_steps, (unsigned long long)passes,
               passes ? 100.0 * (double)x->spec_steps / (double)passes : 0.0);
    }
    fflush(stdout);
}

/* --shared-prefix: mode k with the prefix cache off, then on; both printed
 * with the hit rate, then the ratios. */
static int run_shared(const lm_model *m, const lm_engine_config *ec, int k, const work_item *w, int n,
                      int32_t **prompts, int concurrency, bool poisson, const char *const names[2],
                      mode_result res[2]) {
    for (int on = 0; on < 2; on++) {
        lm_engine_config mc = *ec;
        mc.prefix_cache = on;
        if (k == 0) mc.max_seqs = 1;
        if (k == 1) {
            mc.static_batching = true;
            if (concurrency < mc.max_seqs) mc.max_seqs = concurrency;
        }
        if (run_mode(m, &mc, w, n, prompts, concurrency, poisson, names[on], &res[on]) != 0) return -1;
        print_mode(&res[on], ec->spec != NULL);
        printf("  prefix cache: hit rate %.1f%% (prompt tokens taken from the cache); %llu blocks found in %llu "
               "lookups\n",
               100.0 * res[on].hit_rate, (unsigned long long)res[on].prefix_hits,
               (unsigned long long)res[on].prefix_queries);
    }
    printf("cache on / off: %.2fx output throughput, %.2fx total throughput, mean TTFT %.2fx, p99 TTFT %.2fx\n",
           res[1].out_tok_s / res[0].out_tok_s, res[1].total_tok_s / res[0].total_tok_s,
           res[0].ttft.mean > 0 ? res[1].ttft.mean / res[0].ttft.mean : 0,
           res[0].ttft.p99 > 0 ? res[1].ttft.p99 / res[0].ttft.p99 : 0);
    fflush(stdout);
    return 0;
}

static int draw(lm_rng *r, int lo, int hi) { return lo + (int)(lm_rng_u64(r) % (uint64_t)(hi - lo + 1)); }

int cmd_bench_serve(int argc, char **argv) {
    args a = {argc, argv, 0, "bench serve", usage_bench_serve};
    const char *model = NULL, *modes = "one-at-a-time,static,continuous", *pfile = NULL;
    long long n_req = 64, conc = 0, seed = 1, threads = pool_default_threads(), ctx = 0;
    double rate = 0;
    bool ctx_extend = false;
    int p_lo = 16, p_hi = 96, o_lo = 16, o_hi = 64, fixed_p = 0, fixed_g = 0, n_shared = 0, prefix_len = 256;
    lm_engine_config ec;
    engine_config_default(&ec);
    spec_opts so;
    spec_opts_default(&so);
    for (a.i = 1; a.i < argc; a.i++) {
        if (is_help(&a)) continue;
        if (is_flag(&a, "-m", "--model")) model = need_val(&a);
        else if (is_flag(&a, "--requests", NULL)) n_req = need_int(&a, 1, 1 << 20);
        else if (is_flag(&a, "--concurrency", NULL)) conc = need_int(&a, 1, 1 << 20);
        else if (is_flag(&a, "--rate", NULL)) rate = need_float(&a, 1e-6, 1e6);
        else if (is_flag(&a, "--seed", NULL)) seed = need_int(&a, 0, INT64_MAX);
        else if (is_flag(&a, "--prompt-len", NULL)) parse_range(&a, &p_lo, &p_hi);
        else if (is_flag(&a, "--output-len", NULL)) parse_range(&a, &o_lo, &o_hi);
        else if (is_flag(&a, "--fixed", NULL)) {
            const char *v = need_val(&a);
            if (sscanf(v, "%d:%d", &fixed_p, &fixed_g) != 2 || fixed_p < 1 || fixed_g < 1)
                die_usage(&a, "'%s' is not P:G", v);
        } else if (is_flag(&a, "--modes", NULL)) modes = need_val(&a);
        else if (is_flag(&a, "-t", "--threads")) threads = need_int(&a, 1, 1024);
        else if (is_flag(&a, "-c", "--ctx")) ctx = need_int(&a, 1, 1 << 24);
        else if (is_flag(&a, "--ctx-extend", NULL)) ctx_extend = true;
        else if (is_flag(&a, "--batch-tokens", NULL)) ec.batch_tokens = (int)need_int(&a, 1, 1 << 20);
        else if (is_flag(&a, "--max-seqs", NULL)) ec.max_seqs = (int)need_int(&a, 1, 1 << 16);
        else if (is_flag(&a, "--kv-mem", NULL)) ec.kv_mem = need_bytes(&a);
        else if (is_flag(&a, "--kv-type", NULL)) ec.kv_type = need_kv_type(&a);
        else if (is_flag(&a, "--state-snapshots", NULL)) ec.state_snapshots = snapshots_flag(&a);
        else if (is_flag(&a, "--itl-factor", NULL)) ec.itl_factor = itl_factor_flag(&a);
        else if (spec_opts_flag(&a, &so)) continue;
        else if (is_flag(&a, "--prompt-file", NULL)) pfile = need_val(&a);
        else if (is_flag(&a, "--shared-prefix", NULL)) n_shared = (int)need_int(&a, 1, 1 << 16);
        else if (is_flag(&a, "--prefix-len", NULL)) prefix_len = (int)need_int(&a, 1, 1 << 20);
        else if (is_flag(&a, "--temp", NULL)) bench_temp = (float)need_float(&a, 0, 100);
        else if (is_flag(&a, "--profile", NULL)) bench_profile = true;
        else if (is_flag(&a, "--serial-sampling", NULL)) bench_serial = true;
        else die_usage(&a, "unknown option '%s'", argv[a.i]);
    }
    lm_model *m = load_or_die("bench serve", model);
    spec_opts_apply(&a, &so, &ec);
    bench_widths = so.widths;
    ctx_check("bench serve", "-c", ctx, m->hp.n_ctx_train, ctx_extend);
    ec.n_threads = (int)threads;
    ec.n_ctx = (int)ctx;
    ec.prefix_cache = false; /* random prompts share nothing; keep the modes comparable */
    int n_ctx = ctx > 0 ? (int)ctx : m->hp.n_ctx_train;
    int n = (int)n_req, c = conc > 0 ? (int)conc : n;
    if (n_shared && pfile) fail("bench serve", "--shared-prefix and --prompt-file do not go together");
    if (n_shared && 1 + prefix_len + 1 > n_ctx / 2) fail("bench serve", "--prefix-len does not fit the context");

    /* the workload */
    int32_t *ftoks = NULL;
    int n_ftoks = 0;
    if (pfile) {
        char rerr[LM_ERRLEN];
        size_t len;
        char *text = safefile_read(pfile, &len, rerr, sizeof rerr);
        if (!text) fail("bench serve", rerr);
        n_ftoks = encode_all(m->tok, text, len, tok_add_bos(m->tok), true, &ftoks);
        lm_free(text);
        if (n_ftoks < 1) fail("bench serve", "the prompt file encodes to no tokens");
        if (n_ftoks >= n_ctx) fail("bench serve", "the prompt file does not fit the context (use -c)");
    }
    lm_rng r;
    lm_rng_seed(&r, (uint64_t)seed);
    /* (n_shared x prefix_len) the shared system prompts */
    int32_t *sys = n_shared ? malloc((size_t)n_shared * (size_t)prefix_len * sizeof *sys) : NULL;
    for (size_t k = 0; sys && k < (size_t)n_shared * (size_t)prefix_len; k++)
        sys[k] = (int32_t)(lm_rng_u64(&r) % (uint64_t)m->hp.n_vocab);
    work_item *w = calloc((size_t)n, sizeof *w);
    int32_t **prompts = calloc((size_t)n, sizeof *prompts);
    double t = 0;
    long sum_p = 0, sum_o = 0;
    for (int i = 0; i < n; i++) {
        bool longp = lm_rng_u64(&r) % 4 == 0, longo = lm_rng_u64(&r) % 4 == 0;
        int np = fixed_p ? fixed_p : longp ? draw(&r, 3 * p_hi, 6 * p_hi) : draw(&r, p_lo, p_hi);
        int no = fixed_g ? fixed_g : longo ? draw(&r, 2 * o_hi, 4 * o_hi) : draw(&r, o_lo, o_hi);
        if (np > n_ctx / 2) np = n_ctx / 2;
        if (ftoks) np = n_ftoks;
        if (sys) np += 1 + prefix_len;
        if (np > n_ctx - 1) np = n_ctx - 1;
        if (np + no > n_ctx) no = n_ctx - np;
        w[i].n_prompt = np;
        w[i].n_out = no;
        if (rate > 0) {
            t += -log(1.0 - lm_rng_uniform(&r)) / rate;
            w[i].t_arrive = t;
        }
        prompts[i] = malloc((size_t)np * sizeof *prompts[i]);
        int32_t bos = tok_bos(m->tok);
        for (int k = 0; k < np; k++)
            prompts[i][k] = ftoks        ? ftoks[k]
                : k == 0 && bos >= 0     ? bos
                : sys && k <= prefix_len ? sys[(size_t)(i % n_shared) * (size_t)prefix_len + (size_t)k - 1]
                                         : (int32_t)(lm_rng_u64(&r) % (uint64_t)m->hp.n_vocab);
        sum_p += np;
        sum_o += no;
    }
    printf("workload: %d requests, prompts %.1f tokens and outputs %.1f tokens on average, %s; %lld threads, "
           "batch %d tokens, up to %d sequences\n",
           n, (double)sum_p / n, (double)sum_o / n, rate > 0 ? "Poisson arrivals" : "all arriving at once", threads,
           ec.batch_tokens, ec.max_seqs);
    if (n_shared)
        printf("shared prefixes: %d system prompts of %d tokens (request i uses i mod %d)\n", n_shared, prefix_len,
               n_shared);
    printf("kernels: %s\n", kernels_isa_name());
    if (rate > 0) printf("arrival rate: %.2f requests/s\n", rate);
    else printf("concurrency: %d\n", c);
    fflush(stdout);

    static const char *names[3] = {"one-at-a-time", "static", "continuous"};
    static const char *cnames[3][2] = {{"one-at-a-time, cache off", "one-at-a-time, cache on"},
                                       {"static, cache off", "static, cache on"},
                                       {"continuous, cache off", "continuous, cache on"}};
    mode_result res[3], cres[3][2];
    bool have[3] = {false, false, false};
    for (int k = 0; k < 3; k++) {
        if (!strstr(modes, names[k])) continue;
        if (n_shared) {
            if (run_shared(m, &ec, k, w, n, prompts, rate > 0 ? n : c, rate > 0, cnames[k], cres[k]) != 0) return 1;
            continue;
        }
        lm_engine_config mc = ec;
        if (k == 0) mc.max_seqs = 1;
        if (k == 1) {
            mc.static_batching = true;
            if (c < mc.max_seqs) mc.max_seqs = c;
        }
        if (run_mode(m, &mc, w, n, prompts, rate > 0 ? n : c, rate > 0, names[k], &res[k]) != 0) return 1;
        have[k] = true;
        print_mode(&res[k], ec.spec != NULL);
    }
    if (have[2] && have[1])
        printf("continuous / static: %.2fx output throughput, p99 TTFT %.2fx\n", res[2].out_tok_s / res[1].out_tok_s,
               res[1].ttft.p99 > 0 ? res[2].ttft.p99 / res[1].ttft.p99 : 0);
    if (have[2] && have[0])
        printf("continuous / one-at-a-time: %.2fx output throughput\n", res[2].out_tok_s / res[0].out_tok_s);
    int failed = 0;
    for (int k = 0; k < 3; k++) failed += have[k] ? res[k].failed : 0;
    for (int k = 0; n_shared && k < 3; k++)
        if (strstr(modes, names[k])) failed += cres[k][0].failed + cres[k][1].failed;
    free(sys);
    for (int i = 0; i < n; i++) free(prompts[i]);
    free(prompts);
    free(ftoks);
    free(w);
    spec_opts_free(&so);
    model_free(m);
    return failed ? 1 : 0;
}
