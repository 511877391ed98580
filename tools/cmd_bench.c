/*
 * cmd_bench.c - `lamina bench`: prompt processing (ppN) and generation (tgN)
 * throughput the way llama-bench reports them (tokens/s, mean ± std over
 * repetitions after a warm-up; tokenization and sampling excluded), plus the
 * machine's memory bandwidth (STREAM-like copy and triad, and a read-only
 * sum, on all threads) and, for tg, the bandwidth floor: weight bytes read
 * per token ÷ the read bandwidth (decode only reads its weights; copy and
 * triad count bytes written, and the lines read for ownership before a
 * write are not counted at all, so they understate what reading alone
 * reaches). The floor counts the KV cache too: the bytes the tg test's
 * steps read and write in it at their depths (model/cost.h), beside the
 * weights. -d takes a list of depths (a sweep): each runs the tests, and
 * the sweep reports per depth the KV bytes a decode step reads, counted by
 * the cost model and by the formula 2 x layers x tokens x kv_heads x
 * head_dim x bytes (per layer class with sliding windows), and the depth
 * where KV reads overtake the weights. --roofline runs
 * cmd_bench_roofline.c's per-op report instead of the pp/tg tests.
 */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "bench_roofline.h"
#include "kernels/kernels.h"
#include "cli.h"
#include "sched/engine.h"
#include "dist/dist.h"
#include "model/cost.h"
#include "model/ep.h"
#include "model/forward.h"
#include "model/pp.h"
#include "base/pool.h"
#include "format/quant.h"
#include "base/util.h"

static void usage_bench(FILE *f) {
    fprintf(
        f,
        "usage: lamina bench -m MODEL.gguf [-p 512] [-n 128] [-d DEPTH[,DEPTH...]] [-t THREADS] [-r REPS]\n"
        "                    [-o md|json] [--roofline [-b BATCH] [--svg DIR]]\n"
        "       lamina bench serve -m MODEL.gguf ...   (a serving workload; see lamina bench serve --help)\n"
        "       lamina bench spec -m MODEL.gguf -f PROMPT ...   (speculative decoding off and on;\n"
        "                  see lamina bench spec --help)\n"
        "Measure prompt processing (pp) and generation (tg) speed in tokens/s.\n\n"
        "  -p N       prompt tokens for the pp test (0 skips it; default 512)\n"
        "  -n N       generated tokens for the tg test (0 skips it; default 128)\n"
        "  -d N       tokens already in the cache before each test (default 0); a list (0,1024,4096)\n"
        "             runs the tests at each depth and reports where KV reads overtake the weights\n"
        "             (the defaults of -p and -n shrink to fit the model's trained context\n"
        "             after -d; -d plus -p or -n past it is refused without --ctx-extend)\n"
        "  --ctx-extend  allow tests past the model's trained context (with a warning)\n"
        "  -t N       threads (default: physical cores)\n"
        "  -r N       repetitions (default 5)\n"
        "  -o FMT     md (default) or json\n"
        "  --kv-type T  KV cache element type: F16 (default), F32, Q8_0\n"
        "  --mem BYTES  memory budget (e.g. 2G): weights, workspace and the test's KV must fit,\n"
        "               or it is an error; the split goes to stderr\n"
        "  --ep-counts-out FILE  under --ep N: the prompt test's rows per expert per layer, for\n"
        "             --ep-place balanced --ep-counts FILE (docs/parallel.md)\n"
        "  --attn-split N  decode attention's split-K: 0 off (whole items), N cuts an item of at\n"
        "             least N key splits over the threads (default 2; sets LAMINA_ATTN_SPLIT)\n"
        "  --no-bw    skip the memory-bandwidth measurement\n"
        "  --profile  print where the time of each test goes, per operation\n"
        "  --roofline per op: time, bytes, FLOPs, achieved GB/s and GFLOP/s against the read\n"
        "             bandwidth and FMA rate measured in the run, the bound and the share of it\n"
        "             reached, dispatch gaps apart; for decode at depth 0 and each -d depth (-n\n"
        "             passes, default 32) and prefill of -p tokens (default 512)\n"
        "  -b N       --roofline: decode sequences per pass (default 1)\n"
        "  --svg DIR  --roofline: write roofline-*.svg per scenario and decode-time.svg (and PNGs\n"
        "             when rsvg-convert or ImageMagick is installed) into DIR\n"
        "JSON of --roofline: model, threads, isa, kv_type, read_bw_gbs, peak_gflops,\n"
        "ridge_flop_per_byte, scenarios[]: name, kind (decode|prefill), depth, batch, passes,\n"
        "tokens, step_s, ops_s, other_s, gap_s, pool_runs, wake_s (per pass), per_token\n"
        "{weight_bytes, kv_read_bytes, kv_write_bytes, kv_read_global_bytes, kv_read_local_bytes,\n"
        "act_bytes, state_bytes (recurrent layers' state, of act_bytes), flops}, ops[]: op, time_s, kernel_s, gap_s, weight_bytes, kv_read_bytes,\n"
        "kv_write_bytes, act_bytes, bytes, flops (per pass), intensity, gbs, gflops, bound\n"
        "(memory|compute), roof_gflops, pct_of_roof, plotted.\n"
        "JSON of the tests: a tg test adds depth and kv_bytes_per_token (read and written, the\n"
        "floor's KV part) and, unless --no-bw, read_gbs (the mean of the read probes right before\n"
        "and after it), floor_tokens_per_s and fraction_of_floor; a -d list adds kv_sweep {kv_type, weight_bytes_per_token,\n"
        "kv_crossover_depth (null: none below 4194304), depths[]: depth,\n"
        "kv_read_bytes (counted), formula_bytes}.\n");
}

/* ---- memory bandwidth -------------------------------------------------- */

typedef struct {
    float *a, *b, *c;
    size_t n;
    int op;                    /* 0 copy a=b, 1 triad a=b+s*c, 2 read: sum of b */
    atomic_uint_fast64_t sink; /* the read test's sums, so they are not optimized away */
} stream_job;

static void stream_worker(void *arg, int ith, int nth) {
    stream_job *j = arg;
    size_t lo = j->n * (size_t)ith / (size_t)nth, hi = j->n * (size_t)(ith + 1) / (size_t)nth;
    if (j->op == 0) {
        memcpy(j->a + lo, j->b + lo, (hi - lo) * sizeof(float));
    } else if (j->op == 2) {
        /* eight independent integer sums (never compute-bound) over eight
         * streams through the thread's part: one stream leaves the
         * prefetchers short of misses in flight, as one row at a time would */
        const uint64_t *p = (const uint64_t *)(const void *)(j->b + lo);
        size_t len = (hi - lo) / 2 / 64 * 8; /* uint64s per stream, whole groups of 8 */
        uint64_t acc[8] = {0};
        for (size_t i = 0; i < len; i += 8)
            for (int s = 0; s < 8; s++)
                for (int k = 0; k < 8; k++) acc[k] += p[(size_t)s * len + i + (size_t)k];
        uint64_t t = 0;
        for (int k = 0; k < 8; k++) t += acc[k];
        atomic_fetch_add(&j->sink, t);
    } else {
        for (size_t i = lo; i < hi; i++) j->a[i] = j->b[i] + 3.0f * j->c[i];
    }
}

static void init_worker(void *arg, int ith, int nth) {
    stream_job *j = arg;
    size_t lo = j->n * (size_t)ith / (size_t)nth, hi = j->n * (size_t)(ith + 1) / (size_t)nth;
    for (size_t i = lo; i < hi; i++) j->a[i] = 0, j->b[i] = 1, j->c[i] = 2;
}

/* Best-of-N GB/s for copy, triad and read over 3 x 256 MiB arrays; with
 * read_only, the read alone (copy and triad left 0): the probe taken beside
 * each tg test, about a second. */
static void measure_bandwidth(lm_pool *pool, bool read_only, double *copy_gbs, double *triad_gbs, double *read_gbs) {
    stream_job j = {.n = (size_t)64 << 20};
    atomic_init(&j.sink, 0);
    j.a = malloc(j.n * sizeof(float));
    j.b = malloc(j.n * sizeof(float));
    j.c = malloc(j.n * sizeof(float));
    *copy_gbs = *triad_gbs = *read_gbs = 0;
    if (!j.a || !j.b || !j.c) goto out;
    progress_line prog;
    progress_begin(&prog, "bench", "memory bandwidth", "passes");
    pool_run(pool, init_worker, &j);
    for (int op = read_only ? 2 : 0; op < 3; op++) {
        double best = 0;
        for (int rep = 0; rep < 5; rep++) {
            progress_update(&prog, op * 5 + rep, 15);
            j.op = op;
            double t0 = lm_now();
            pool_run(pool, stream_worker, &j);
            double dt = lm_now() - t0;
            double bytes = op == 2 ? (double)(j.n / 2 / 64 * 64) * 8 /* what the streams cover */
                                   : (double)j.n * sizeof(float) * (op == 0 ? 2 : 3);
            if (bytes / dt > best) best = bytes / dt;
        }
        *(op == 0 ? copy_gbs : op == 1 ? triad_gbs : read_gbs) = best / 1e9;
    }
    progress_end(&prog);
out:
    free(j.a);
    free(j.b);
    free(j.c);
}

/* ---- pp / tg ----------------------------------------------------------- */

static void stats(const double *v, int n, double *mean, double *sd) {
    double s = 0, s2 = 0;
    for (int i = 0; i < n; i++) s += v[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) s2 += (v[i] - *mean) * (v[i] - *mean);
    *sd = n > 1 ? sqrt(s2 / (n - 1)) : 0;
}

/* Bytes of weights one decode step reads: every matrix but the embedding
 * table (only one row of it is read), plus the LM head; with experts, only
 * the n_expert_used experts a token runs (*total: as if it ran all). */
static uint64_t weight_bytes_per_token(const lm_model *m, uint64_t *total) {
    uint64_t head = m->output.row_bytes * (uint64_t)m->output.rows;
    uint64_t active = model_layer_bytes_per_token(m, total) + head;
    *total += head;
    return active;
}

/* An empty cache, then depth tokens in it, in passes of the batch size (the
 * passes seqrun_forward would make), with progress on a terminal. */
static int fill_depth(lm_seqrun *sr, int depth, int32_t *toks, char *err, size_t errlen) {
    seqrun_reset(sr);
    progress_line prog;
    progress_begin(&prog, "bench", "filling the cache to depth", "tokens");
    for (int off = 0; off < depth; off += FWD_BATCH_DEFAULT) {
        progress_update(&prog, off, depth);
        int k = depth - off < FWD_BATCH_DEFAULT ? depth - off : FWD_BATCH_DEFAULT;
        if (seqrun_forward(sr, toks + off, k, NULL, false, err, errlen)) return -1;
    }
    progress_end(&prog);
    return 0;
}

/* Tensor parallel: this rank's time in collectives against the rest, per
 * token, and the bytes it put into them, next to the model of them: two
 * all-reduces of n_embd floats per layer per token, and the LM head's
 * vocabulary slice of each row that wants logits (one row per pass). One
 * line per rank on stderr (only rank 0 writes to stdout). */
static void tp_report(const lm_model *m, const char *name, double tokens, double total) {
    dist_stats ds;
    dist_stats_get(&ds);
    double comm = ds.comm_s / tokens, all = total / tokens;
    double model_bytes = 2.0 * m->hp.n_layer * m->hp.n_embd * sizeof(float);
    fprintf(stderr,
            "bench: rank %d/%d %s: %.3f ms/token, communication %.3f ms (%.1f%%), compute %.3f ms; "
            "%.0f bytes/token into %.1f collectives/token (model: 2 x %d layers x %d floats = %.0f bytes + LM head "
            "%d floats per logits row)\n",
            cli_tp_rank, cli_tp_size, name, 1e3 * all, 1e3 * comm, 100 * comm / all, 1e3 * (all - comm),
            (double)ds.bytes / tokens, (double)ds.calls / tokens, m->hp.n_layer, m->hp.n_embd, model_bytes,
            m->tp.n_vocab);
}

/* Expert parallel (model/ep.h): this rank's time per token in the
 * exchanges (all-to-alls and the gather of the homes' rows) against the MoE
 * layers' compute and the rest, the bytes it sent, against what --tp moves
 * for the same layers (one all-reduce of n_embd floats per MoE layer per
 * token); then per MoE layer the rows each of its experts ran on. After
 * that, rank 0 prints per layer every rank's rows and the imbalance (the
 * busiest rank's rows over the mean; 1: even) under this job's placement,
 * beside what the balanced placement from these counts would give, and
 * their means over the layers; with counts_out it writes the counts there
 * (ep_counts.c: --ep-place balanced --ep-counts reads them). Every rank
 * calls it (a collective sums the ranks' rows). */
static void ep_report(const lm_model *m, const char *name, double tokens, double total, const char *counts_out) {
    ep_stats es;
    ep_stats_get(&es);
    const int N = m->ep.size, L = m->hp.n_layer, X = m->hp.n_expert;
    int n_moe = 0;
    for (int li = m->pp.layer0; li < m->pp.layer1; li++) n_moe += m->layers[li].moe != NULL;
    double a2a = es.a2a_s / tokens, comp = es.compute_s / tokens, all = total / tokens;
    char tprank[32] = ""; /* with --tp, each tensor rank's expert group runs the same rows */
    if (m->tp.size > 1) snprintf(tprank, sizeof tprank, " (tp rank %d)", m->tp.rank);
    fprintf(stderr,
            "bench: rank %d/%d%s %s: %.3f ms/token, expert all-to-all %.3f ms (%.1f%%), experts' compute %.3f ms, "
            "the rest %.3f ms; %.0f bytes/token sent (--tp would all-reduce %d MoE layers x %d floats = %.0f "
            "bytes/token)\n",
            m->ep.rank, N, tprank, name, 1e3 * all, 1e3 * a2a, 100 * a2a / all, 1e3 * comp, 1e3 * (all - a2a - comp),
            (double)es.bytes / tokens, n_moe, m->hp.n_embd, (double)n_moe * m->hp.n_embd * sizeof(float));
    float *cnt = calloc((size_t)L * (size_t)X, sizeof *cnt); /* (L, X) rows each expert ran (exact below 2^24) */
    uint64_t *rows = calloc((size_t)L * (size_t)X, sizeof *rows);
    int16_t *bal = calloc((size_t)X, sizeof *bal);
    if (!cnt || !rows || !bal) fail("bench", "out of memory");
    for (int li = 0; es.rows && li < L; li++) {
        if (!m->layers[li].moe) continue;
        char line[1024];
        int o = 0;
        for (int e = 0; e < X; e++) {
            if (ep_owner(m, li, e) != m->ep.rank) continue;
            uint64_t r = es.rows[(size_t)li * X + e];
            cnt[(size_t)li * X + e] = (float)r;
            if (o < (int)sizeof line - 32)
                o += snprintf(line + o, sizeof line - (size_t)o, " e%d:%llu", e, (unsigned long long)r);
        }
        if (m->tp.rank == 0)
            fprintf(stderr, "bench: rank %d layer %d rows per expert:%s\n", m->ep.rank, li, o ? line : " -");
    }
    char err[LM_ERRLEN];
    if (dist_ep_allreduce_sum(cnt, (size_t)L * (size_t)X, err, sizeof err)) fail("bench", err);
    if (m->ep.rank == 0 && m->tp.rank == 0) {
        double now_sum = 0, bal_sum = 0;
        int layers = 0;
        for (size_t i = 0; i < (size_t)L * (size_t)X; i++) rows[i] = (uint64_t)cnt[i];
        for (int li = m->pp.layer0; li < m->pp.layer1; li++) {
            if (!m->layers[li].moe) continue;
            const uint64_t *lr = rows + (size_t)li * X;
            uint64_t per[LM_TP_MAX] = {0};
            for (int e = 0; e < X; e++) per[ep_owner(m, li, e)] += lr[e];
            char line[1024];
            int o = 0;
            for (int r = 0; r < N; r++)
                if (o < (int)sizeof line - 32)
                    o += snprintf(line + o, sizeof line - (size_t)o, " %llu", (unsigned long long)per[r]);
            int16_t *own = m->ep.owner ? m->ep.owner + (size_t)li * X : NULL;
            double now = ep_imbalance(lr, X, N, own), then = 0;
            if (ep_place_balanced(lr, X, N, bal) == 0) then = ep_imbalance(lr, X, N, bal);
            fprintf(stderr,
                    "bench: ep layer %d rows per rank:%s, imbalance %.3f (busiest over mean; %s placement), "
                    "balanced from these counts %.3f\n",
                    li, line, now, own ? "balanced" : "contiguous", then);
            now_sum += now;
            bal_sum += then;
            layers++;
        }
        if (layers)
            fprintf(stderr,
                    "bench: ep imbalance over %d MoE layers: %.3f (%s placement), balanced from these counts "
                    "%.3f\n",
                    layers, now_sum / layers, m->ep.owner ? "balanced" : "contiguous", bal_sum / layers);
        if (counts_out) {
            if (ep_counts_write(counts_out, rows, L, X, err, sizeof err)) fail("bench", err);
            fprintf(stderr, "bench: routing counts of %s in %s (--ep-place balanced --ep-counts %s)\n", name,
                    counts_out, counts_out);
        }
    }
    free(cnt);
    free(rows);
    free(bal);
}

/* Pipeline parallel: this rank's stage, its time per token in its layers
 * (compute, with --tp its all-reduces included) against sending and receiving activations (a receive's wait
 * for the previous stage included: the bubble shows there), the bytes it
 * sent, the wait for the last stage's logits (broadcast to every rank),
 * the micro-batches per pass and the schedule's bubble, next to the model:
 * n_embd floats per row per stage boundary. One line per rank. */
static void pp_report(const lm_model *m, const char *name, double tokens, double total) {
    dist_stats ds;
    pp_stats ps;
    dist_stats_get(&ds);
    pp_stats_get(&ps);
    const lm_pp *pp = &m->pp;
    fprintf(
        stderr,
        "bench: rank %d stage %d/%d (layers %d-%d, %.2f MiB) %s: %.3f ms/token, compute %.3f ms (%.1f%%), "
        "send/receive %.3f ms (%.1f%%), logits broadcast %.3f ms, other %.3f ms; %.0f bytes/token sent (model: %d floats = %zu bytes per "
        "row per stage boundary); %.2f micro-batches/pass, bubble %.1f%% ((S-1)/(m+S-1))\n",
        cli_rank, pp->stage, pp->size, pp->layer0, pp->layer1 - 1, pp->bytes[pp->stage] / 1048576.0, name,
        1e3 * total / tokens, 1e3 * ps.compute_s / tokens, 100 * ps.compute_s / total, 1e3 * ds.p2p_s / tokens,
        100 * ds.p2p_s / total, 1e3 * ps.bcast_s / tokens,
        1e3 * (total - ps.compute_s - ds.p2p_s - ps.bcast_s) / tokens, (double)ds.p2p_bytes / tokens, m->hp.n_embd,
        (size_t)m->hp.n_embd * sizeof(float), ps.passes ? (double)ps.micro / (double)ps.passes : 0, 100 * ps.bubble);
}

/* Tensor parallel: the all-reduce alone, ranks in step (a barrier, then 200
 * back to back), per call for one token's n_embd floats and for a 64-token
 * batch: the transfer cost without the wait for a slower rank that the
 * per-test communication time includes. */
static void tp_allreduce_cost(const lm_model *m) {
    size_t E = (size_t)m->hp.n_embd;
    float *buf = calloc(64 * E, sizeof(float));
    char err[LM_ERRLEN];
    if (!buf) fail("bench", "out of memory");
    for (int rows = 1; rows <= 64; rows *= 64) {
        if (dist_barrier(err, sizeof err)) fail("bench", err);
        double t0 = lm_now();
        for (int i = 0; i < 200; i++)
            if (dist_allreduce_sum(buf, (size_t)rows * E, err, sizeof err)) fail("bench", err);
        double us = 1e6 * (lm_now() - t0) / 200;
        fprintf(stderr,
                "bench: rank %d/%d all-reduce of %d x %zu floats (%zu bytes), ranks in step: %.1f us per call; "
                "model per token: 2 x %d layers x that = %.3f ms\n",
                cli_tp_rank, cli_tp_size, rows, E, (size_t)rows * E * sizeof(float), us, m->hp.n_layer,
                2e-3 * m->hp.n_layer * us / rows);
    }
    free(buf);
}

/* -d's value: one depth or a comma-separated list of up to 16; *max gets
 * the largest. Returns how many. */
static int need_depths(args *a, int *depths, long long *max) {
    const char *flag = a->argv[a->i], *v = need_val(a), *p = v;
    int n = 0;
    *max = 0;
    for (;;) {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (errno || end == p || x < 0 || x > (1 << 22) || n == 16 || (*end && *end != ',')) {
            char msg[200];
            snprintf(msg, sizeof msg, "%s wants up to 16 depths in [0, 4194304], comma-separated, got '%s'", flag, v);
            die_usage(a, "%s", msg);
        }
        depths[n++] = (int)x;
        if (x > *max) *max = x;
        if (!*end) return n;
        p = end + 1;
    }
}

/* KV bytes one decode step at depth d reads, by the cost model, and by the
 * formula 2 x layers x tokens x kv_heads x head_dim x bytes per layer class
 * (tokens: d + 1, or the window on a sliding-window layer); with latent
 * attention (deepseek2) one row of head_dim = kv_lora_rank + n_rot per token
 * and layer, keys and values alike: layers x tokens x head_dim x bytes. */
static void kv_step_bytes(const lm_model *m, uint32_t kv_type, int d, double *counted, double *formula) {
    cost_pass c;
    char err[LM_ERRLEN];
    if (cost_forward(m, kv_type, 1, 1, d, &c, err, sizeof err)) fail("bench", err);
    *counted = cost_total(&c).kv_read_bytes;
    double bytes = (double)c.kv_row_bytes / m->hp.head_dim, f = 0;
    double rows = m->hp.kv_lora_rank > 0 ? 1.0 : 2.0 * m->hp.n_head_kv; /* rows per token and layer */
    for (int i = 0; i < m->hp.n_layer; i++) {
        if (m->layers[i].gdn) continue; /* a recurrent layer keeps no KV */
        int w = m->layers[i].window;
        double tokens = w > 0 && d + 1 > w ? w : d + 1;
        f += rows * tokens * m->hp.head_dim * bytes;
    }
    *formula = f;
}

/* The KV bytes per token of the tg test's n steps from depth d: read and written. */
static double kv_bytes_per_token(const lm_model *m, uint32_t kv_type, int d, int n) {
    double t = 0;
    for (int i = 0; i < n; i++) {
        cost_pass c;
        char err[LM_ERRLEN];
        if (cost_forward(m, kv_type, 1, 1, d + i, &c, err, sizeof err)) fail("bench", err);
        cost_op o = cost_total(&c);
        t += o.kv_read_bytes + o.kv_write_bytes;
    }
    return n ? t / n : 0;
}

/* The first depth whose decode step reads more KV bytes than weight bytes,
 * up to limit (-1: none; KV reads grow with depth, so a bisection). */
static int kv_crossover(const lm_model *m, uint32_t kv_type, double wbytes, int limit) {
    double c, f;
    kv_step_bytes(m, kv_type, limit, &c, &f);
    if (c < wbytes) return -1;
    int lo = 0, hi = limit; /* reads(hi) >= wbytes */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        kv_step_bytes(m, kv_type, mid, &c, &f);
        if (c >= wbytes) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* The sweep's report: per depth, KV read per decode step counted and by the
 * formula, against the weights; the crossover depth. */
static void kv_sweep_report(const lm_model *m, uint32_t kv_type, const int *depths, int n_depth, double wbytes,
                            bool json) {
    int limit = 1 << 22, train = m->hp.n_ctx_train; /* the crossover may lie past the trained context */
    int cross = kv_crossover(m, kv_type, wbytes, limit);
    int n_local = 0;
    for (int i = 0; i < m->hp.n_layer; i++) n_local += m->layers[i].window > 0;
    double eb = 0, cc, ff;
    kv_step_bytes(m, kv_type, 0, &cc, &ff);
    bool latent = m->hp.kv_lora_rank > 0;
    const int n_kv = m->hp.n_layer - m->hp.n_rlayer; /* layers with a KV cache */
    eb = cc / ((latent ? 1.0 : 2.0 * m->hp.n_head_kv) * n_kv * m->hp.head_dim);
    double state = 0; /* recurrent layers: their state read and written per decode step, whatever the depth */
    if (m->hp.n_rlayer) {
        cost_pass c;
        char err[LM_ERRLEN];
        if (cost_forward(m, kv_type, 1, 1, 0, &c, err, sizeof err)) fail("bench", err);
        state = c.state_bytes;
    }
    if (json) {
        printf(", \"kv_sweep\": {\"kv_type\": \"%s\", \"weight_bytes_per_token\": %.0f, \"kv_crossover_depth\": ",
               quant_type_name(kv_type), wbytes);
        if (cross >= 0) printf("%d", cross);
        else printf("null");
        printf(", \"depths\": [");
        for (int i = 0; i < n_depth; i++) {
            kv_step_bytes(m, kv_type, depths[i], &cc, &ff);
            printf("%s{\"depth\": %d, \"kv_read_bytes\": %.0f, \"formula_bytes\": %.0f}", i ? ", " : "", depths[i], cc,
                   ff);
        }
        printf("], \"state_bytes_per_step\": %.0f}", state);
        return;
    }
    if (latent)
        printf("\nKV reads per decode step (%s cache, latent attention): formula %d layers x tokens x (%d kv_lora_rank "
               "+ %d n_rot) x %.4g bytes; weights %.2f MiB\n",
               quant_type_name(kv_type), n_kv, m->hp.kv_lora_rank, m->hp.n_rot, eb, wbytes / 1048576);
    else
        printf("\nKV reads per decode step (%s cache): formula 2 x %d layers x tokens x %d kv_heads x %d head_dim x "
               "%.4g bytes%s; weights %.2f MiB\n",
               quant_type_name(kv_type), n_kv, m->hp.n_head_kv, m->hp.head_dim, eb,
               n_local ? " (tokens capped at the window on the sliding-window layers)" : "", wbytes / 1048576);
    if (state > 0)
        printf("recurrent state of its %d linear-attention layers, read and written per decode step at any depth: "
               "%.3f MiB\n",
               m->hp.n_rlayer, state / 1048576);
    printf("| depth | KV read MiB (counted) | formula MiB | KV / weights |\n| ---: | ---: | ---: | ---: |\n");
    for (int i = 0; i < n_depth; i++) {
        kv_step_bytes(m, kv_type, depths[i], &cc, &ff);
        printf("| %d | %.3f | %.3f%s | %.2f |\n", depths[i], cc / 1048576, ff / 1048576,
               fabs(cc - ff) > 0.5 ? " (differs)" : "", cc / wbytes);
    }
    if (cross >= 0)
        printf("KV reads overtake the weights at depth %d%s\n", cross,
               train > 0 && cross > train ? " (past the trained context)" : "");
    else printf("KV reads stay below the weights up to depth %d (sliding windows cap them)\n", limit);
}

int cmd_bench(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "serve")) return cmd_bench_serve(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "spec")) return cmd_bench_spec(argc - 1, argv + 1);
    args a = {argc, argv, 0, "bench", usage_bench};
    const char *model = NULL, *fmt = "md";
    long long np = -1, ng = -1, depth = 0, threads = pool_default_threads(), reps = 5;
    bool bw = true, profile = false, ctx_extend = false, roofline = false;
    const char *svg_dir = NULL, *ep_counts_out = NULL;
    long long batch = 1;
    int depths[16] = {0}, n_depth = 1;
    uint32_t kv_type = LM_TYPE_F16;
    unsigned long long mem = 0;
    for (a.i = 1; a.i < argc; a.i++) {
        if (is_help(&a)) continue;
        if (is_flag(&a, "-m", "--model")) model = need_val(&a);
        else if (is_flag(&a, "-p", "--n-prompt")) np = need_int(&a, 0, 1 << 20);
        else if (is_flag(&a, "-n", "--n-gen")) ng = need_int(&a, 0, 1 << 20);
        else if (is_flag(&a, "-d", "--depth")) n_depth = need_depths(&a, depths, &depth);
        else if (is_flag(&a, "-t", "--threads")) threads = need_int(&a, 1, 1024);
        else if (is_flag(&a, "-r", "--repetitions")) reps = need_int(&a, 1, 1000);
        else if (is_flag(&a, "-o", "--output")) fmt = need_val(&a);
        else if (is_flag(&a, "--no-bw", NULL)) bw = false;
        else if (is_flag(&a, "--profile", NULL)) profile = true;
        else if (is_flag(&a, "--roofline", NULL)) roofline = true;
        else if (is_flag(&a, "--svg", NULL)) svg_dir = need_val(&a);
        else if (is_flag(&a, "-b", "--batch")) batch = need_int(&a, 1, 256);
        else if (is_flag(&a, "--ctx-extend", NULL)) ctx_extend = true;
        else if (is_flag(&a, "--kv-type", NULL)) kv_type = need_kv_type(&a);
        else if (is_flag(&a, "--mem", NULL)) mem = need_bytes(&a);
        else if (is_flag(&a, "--ep-counts-out", NULL)) ep_counts_out = need_val(&a);
        else if (is_flag(&a, "--attn-split", NULL)) { /* read by every forward workspace (forward.h) */ char v[16];
            snprintf(v, sizeof v, "%lld", need_int(&a, 0, 1 << 20));
            setenv("LAMINA_ATTN_SPLIT", v, 1);
        } else die_usage(&a, "unknown argument '%s'", argv[a.i]);
    }
    if (strcmp(fmt, "md") && strcmp(fmt, "json")) die_usage(&a, "output format '%s' is not md or json", fmt);
    if ((svg_dir || batch > 1) && !roofline) die_usage(&a, "%s needs --roofline", svg_dir ? "--svg" : "-b");
    if (roofline && ng < 0) ng = 32;
    if (ep_counts_out && cli_ep_size < 2) die_usage(&a, "%s", "--ep-counts-out counts the experts' rows under --ep N");
    if (ep_counts_out && np == 0) die_usage(&a, "%s", "--ep-counts-out counts the prompt test's rows (-p above 0)");
    if (roofline && cli_tp_size * cli_pp_size * cli_ep_size > 1)
        die_usage(&a, "%s", "--roofline runs on one process (no --tp, --pp or --ep)");
    lm_model *m = load_or_die("bench", model);
    /* defaults 512 and 128, shrunk to the trained context left after -d */
    long long room = m->hp.n_ctx_train > 0 ? m->hp.n_ctx_train - depth : 1LL << 40;
    if (np < 0) np = room >= 1 && room < 512 ? room : 512;
    if (ng < 0) ng = room >= 1 && room < 128 ? room : 128;
    char what[96];
    if (depth) snprintf(what, sizeof what, "-d %lld + %s %lld =", depth, np >= ng ? "-p" : "-n", np >= ng ? np : ng);
    else snprintf(what, sizeof what, "%s", np >= ng ? "-p" : "-n");
    ctx_check("bench", what, depth + (np > ng ? np : ng), m->hp.n_ctx_train, ctx_extend);
    lm_pool *pool = pool_new((int)threads);
    if (!pool) fail("bench", "cannot start threads");
    int ctx = (int)(depth + (np > ng ? np : ng) + 1);
    char err[LM_ERRLEN];
    if (mem) { /* the one sequence's engine plan inside the budget (cli.h) */
        lm_engine_config ec;
        engine_config_default(&ec);
        ec.n_threads = (int)threads, ec.max_seqs = 1, ec.n_ctx = ctx, ec.kv_type = kv_type;
        ec.mem = mem, ec.mem_cap = true;
        engine_mem sp;
        if (engine_mem_plan(m, &ec, &sp, err, sizeof err)) fail("bench", err);
        lm_engine_stats st = {.mem_budget = mem,
                              .mem_weights = sp.weights,
                              .mem_packed = sp.packed,
                              .mem_workspace = sp.workspace,
                              .mem_kv = sp.kv,
                              .mem_state = sp.state,
                              .kv_max_tokens = sp.kv_tokens,
                              .kv_max_seqs = sp.kv_seqs};
        mem_print(stderr, "bench", &st, kv_type, ctx);
    }
    lm_seqrun *sr = seqrun_new(m, pool, ctx, FWD_BATCH_DEFAULT, kv_type, err, sizeof err);
    if (!sr) fail("bench", err);
    lm_fwd *fwd = sr->fwd; /* its profile counters */
    int32_t *toks = malloc((size_t)ctx * sizeof(int32_t));
    float *logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
    double *v = malloc((size_t)reps * sizeof(double));
    if (!toks || !logits || !v) fail("bench", "out of memory");
    lm_rng rng;
    lm_rng_seed(&rng, 42);
    for (int i = 0; i < ctx; i++) toks[i] = (int32_t)(lm_rng_u64(&rng) % (uint64_t)m->hp.n_vocab);

    double copy_gbs = 0, triad_gbs = 0, read_gbs = 0;
    if (bw || roofline) measure_bandwidth(pool, false, &copy_gbs, &triad_gbs, &read_gbs);
    if (roofline) {
        seqrun_free(sr);
        roofline_opts ro = {.m = m,
                            .pool = pool,
                            .kv_type = kv_type,
                            .depths = depths,
                            .n_depth = n_depth,
                            .batch = (int)batch,
                            .n_gen = (int)ng,
                            .n_prompt = (int)np,
                            .read_bw = read_gbs * 1e9,
                            .peak_flops = bench_fma_peak(pool),
                            .json = !strcmp(fmt, "json"),
                            .svg_dir = svg_dir};
        if (ro.read_bw <= 0) fail("bench", "could not measure the read bandwidth (out of memory)");
        bench_roofline(&ro);
        free(toks);
        free(logits);
        free(v);
        pool_free(pool);
        model_free(m);
        return 0;
    }
    uint64_t wtotal = 0, wbytes = weight_bytes_per_token(m, &wtotal); /* the floor uses the active bytes */
    bool json = !strcmp(fmt, "json");
    const lm_layer *l0 = &m->layers[0];
    /* deepseek2 has no wq, a recurrent layer (qwen35) none of the attention matrices */
    const char *wtype = quant_type_name(l0->wq.rows ? l0->wq.type : l0->gdn ? l0->gdn->qkv.type : l0->wo.type);
    if (json) {
        printf("{\"model\": \"%s\", \"type\": \"%s\", \"size_bytes\": %llu, \"params\": %llu, \"threads\": %d,"
               " \"bandwidth_copy_gbs\": %.2f, \"bandwidth_triad_gbs\": %.2f, \"bandwidth_read_gbs\": %.2f,"
               " \"weight_bytes_per_token\": %llu, \"kernels\": \"%s\",",
               m->name, wtype, (unsigned long long)m->weight_bytes, (unsigned long long)m->n_params, pool_size(pool),
               copy_gbs, triad_gbs, read_gbs, (unsigned long long)wbytes, kernels_isa_name());
        if (m->hp.n_expert > 0)
            printf(" \"experts\": %d, \"experts_used\": %d, \"active_weight_bytes_per_token\": %llu,"
                   " \"total_weight_bytes_per_token\": %llu,",
                   m->hp.n_expert, m->hp.n_expert_used, (unsigned long long)wbytes, (unsigned long long)wtotal);
        printf(" \"tests\": [");
    } else {
        if (m->hp.n_expert > 0)
            printf("weights per token: %.2f MiB active (%d of %d experts) of %.2f MiB total; the tg floor uses "
                   "the active bytes\n",
                   wbytes / 1048576.0, m->hp.n_expert_used, m->hp.n_expert, wtotal / 1048576.0);
        if (bw)
            printf("memory bandwidth: copy %.1f GB/s, triad %.1f GB/s, read %.1f GB/s (%d threads); "
                   "the tg floor: weights and the KV bytes at the test's depth, at the read bandwidth\n"
                   "measured right before and after that test (their mean, the read GB/s column)\n",
                   copy_gbs, triad_gbs, read_gbs, pool_size(pool));
        printf("kernels: %s%s%s%s\n", kernels_isa_name(), *kernels_cap_note() ? " (" : "", kernels_cap_note(),
               *kernels_cap_note() ? ")" : "");
        printf("\n| model | type | size | params | threads | test | t/s | read GB/s | floor t/s | of floor |\n");
        printf("| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |\n");
    }
    int n_tests = 0;
    for (int di = 0; di < n_depth; di++)
        for (int test = 0; test < 2; test++) {
            depth = depths[di];
            int n = (int)(test == 0 ? np : ng);
            if (n == 0) continue;
            /* the read bandwidth right before and after a tg test: the floor
             * compares the test with the memory of its own minutes (a shared
             * machine's bandwidth moves by a third from one to the next) */
            double read_before = 0, read_after = 0, unused_copy, unused_triad;
            if (bw && test == 1) measure_bandwidth(pool, true, &unused_copy, &unused_triad, &read_before);
            /* warm-up: a short run of the same kind */
            if (fill_depth(sr, (int)depth, toks, err, sizeof err)) fail("bench", err);
            if (test == 0) {
                if (seqrun_forward(sr, toks, n < 32 ? n : 32, logits, false, err, sizeof err)) fail("bench", err);
            } else {
                for (int i = 0; i < 4 && i < n; i++)
                    if (seqrun_forward(sr, toks + i, 1, logits, false, err, sizeof err)) fail("bench", err);
            }
            memset(fwd->prof, 0, sizeof fwd->prof);
            memset(fwd->prof_gap, 0, sizeof fwd->prof_gap);
            memset(fwd->prof_sleeps, 0, sizeof fwd->prof_sleeps);
            fwd->prof_gap_mark = 0;
            fwd->prof_sleep_mark = 0;
            pool_timing_reset(pool);
            dist_stats_reset();
            pp_stats_reset();
            ep_stats_reset();
            double total = 0;
            /* progress on a terminal: per repetition for pp, per token for tg;
         * the time taken to draw it is outside the timed span */
            char phase[64];
            snprintf(phase, sizeof phase, "%s%d", test == 0 ? "pp" : "tg", n);
            progress_line prog = {0};
            for (int r = 0; r < reps; r++) {
                if (fill_depth(sr, (int)depth, toks, err, sizeof err)) fail("bench", err);
                if (r == 0) progress_begin(&prog, "bench", phase, test == 0 ? "repetitions" : "tokens");
                progress_update(&prog, test == 0 ? r : (long long)r * n, test == 0 ? reps : reps * n);
                fwd->profile = profile;
                if (profile) pool_timing_enable(pool, 1); /* the dispatch gaps per op */
                double t0 = lm_now();
                double t_prog = 0; /* time spent drawing progress inside the span */
                if (test == 0) {
                    if (seqrun_forward(sr, toks + depth, n, logits, false, err, sizeof err)) fail("bench", err);
                } else {
                    for (int i = 0; i < n; i++) {
                        if (seqrun_forward(sr, toks + depth + i, 1, logits, false, err, sizeof err)) fail("bench", err);
                        if (prog.on) {
                            double tp = lm_now();
                            progress_update(&prog, (long long)r * n + i + 1, reps * n);
                            t_prog += lm_now() - tp;
                        }
                    }
                }
                double dt = lm_now() - t0 - t_prog;
                fwd->profile = false;
                pool_timing_enable(pool, 0);
                total += dt;
                v[r] = n / dt;
            }
            progress_end(&prog);
            if (bw && test == 1) measure_bandwidth(pool, true, &unused_copy, &unused_triad, &read_after);
            double read_test = read_before > 0 && read_after > 0 ? (read_before + read_after) / 2 : 0;
            double mean, sd;
            stats(v, (int)reps, &mean, &sd);
            char name[64];
            if (depth) snprintf(name, sizeof name, "%s%d @ d%lld", test == 0 ? "pp" : "tg", n, depth);
            else snprintf(name, sizeof name, "%s%d", test == 0 ? "pp" : "tg", n);
            /* the floor: weights and the KV bytes of these steps, at the read bandwidth */
            double kvb = test == 1 ? kv_bytes_per_token(m, kv_type, (int)depth, n) : 0;
            double floor_ts = read_test > 0 ? read_test * 1e9 / ((double)wbytes + kvb) : 0;
            if (json) {
                printf("%s{\"test\": \"%s\", \"tokens_per_s\": %.3f, \"std\": %.3f", n_tests ? ", " : "", name, mean,
                       sd);
                if (test == 1) printf(", \"depth\": %lld, \"kv_bytes_per_token\": %.0f", depth, kvb);
                if (floor_ts > 0)
                    printf(", \"read_gbs\": %.2f, \"floor_tokens_per_s\": %.3f, \"fraction_of_floor\": %.3f", read_test,
                           floor_ts, mean / floor_ts);
                printf("}");
            } else {
                printf("| %s | %s | %.2f MiB | %.2f M | %d | %s | %.2f ± %.2f |", m->name, wtype,
                       m->weight_bytes / 1048576.0, m->n_params / 1e6, pool_size(pool), name, mean, sd);
                if (floor_ts > 0) printf(" %.1f | %.2f | %.0f%% |\n", read_test, floor_ts, 100 * mean / floor_ts);
                else printf(" | | |\n");
            }
            if (cli_tp_size > 1) tp_report(m, name, (double)n * reps, total);
            if (cli_pp_size > 1) pp_report(m, name, (double)n * reps, total);
            if (cli_ep_size > 1) ep_report(m, name, (double)n * reps, total, test == 0 ? ep_counts_out : NULL);
            if (profile && !json) {
                /* per op: its share of the time, per token, and the part of it
             * that was dispatch (publishing pool runs, waiting at their
             * barriers: other threads' wake-up and imbalance) */
                double acc = 0, gaps = 0, per = 1e3 / ((double)n * reps);
                pool_timing pt;
                pool_timing_get(pool, &pt);
                printf("\n  profile of %s (%% of %.3f s over %lld reps; gap: dispatch time inside the op):\n", name,
                       total, reps);
                for (int k = 0; k < LM_PROF_COUNT; k++) {
                    acc += fwd->prof[k];
                    gaps += fwd->prof_gap[k];
                    printf("    %-20s %6.1f%%  %8.3f ms/token  gap %7.3f ms\n", lm_prof_names[k],
                           100 * fwd->prof[k] / total, per * fwd->prof[k], per * fwd->prof_gap[k]);
                }
                printf("    %-20s %6.1f%%\n", "(other)", 100 * (total - acc) / total);
                printf("    dispatch gaps %.1f%% of the time (%.3f ms/token), %.1f pool runs/token, workers' wake-up "
                       "%.1f us/run\n\n",
                       100 * gaps / total, per * gaps, (double)pt.runs / ((double)n * reps),
                       pt.runs ? 1e6 * pt.wake_s / (double)pt.runs / (pool_size(pool) > 1 ? pool_size(pool) - 1 : 1)
                               : 0);
            }
            fflush(stdout);
            n_tests++;
        }
    if (json) printf("]");
    if (ng > 0 && (n_depth > 1 || depths[0] > 0)) kv_sweep_report(m, kv_type, depths, n_depth, (double)wbytes, json);
    if (json) printf("}\n");
    if (cli_tp_size > 1) tp_allreduce_cost(m);
    free(toks);
    free(logits);
    free(v);
    seqrun_free(sr);
    pool_free(pool);
    model_free(m);
    return 0;
}
