/*
 * cmd_bench_roofline.c - `lamina bench --roofline`: where the bytes and the
 * time of a forward pass go, per op, against the machine's roofs.
 *
 * Scenarios: decode (one token per sequence per pass, batch B sequences) at
 * depth 0 and at each -d depth above 0, and prefill of -p tokens at depth
 * 0. Each runs its passes with the forward pass's per-op timers on
 * (lm_fwd.profile) and the pool's dispatch timing on (pool_timing), and
 * sets each op's measured time beside what the cost model (model/cost.h)
 * counts for the same passes: bytes of weights, KV read and written and
 * activations, and FLOPs. The roofs are measured in the same run: the read
 * bandwidth (bench's read-only sweep) and the FMA rate (the kernel table's
 * probe on every thread). An op's arithmetic intensity I = FLOPs / bytes;
 * the roof at I is min(peak FLOP/s, I x read bandwidth); the op is memory
 * bound when I x bandwidth is the smaller, and its percentage is achieved
 * FLOP/s over that roof (for a memory-bound op the same as achieved bytes/s
 * over the bandwidth). Dispatch gaps, the caller's time publishing pool
 * runs and waiting at their barriers, are reported apart from kernel time
 * (kernel = op time - gap), with the workers' wake-up delay beside them.
 * Decode batches of B > 1 are B sequences filled to the depth, each in its
 * own blocks (copies of the first one's K/V), so a pass reads B times one
 * sequence's KV bytes from memory, as B distinct requests would.
 *
 * Output: a markdown table per scenario, or JSON (fields in usage_roofline
 * below); with --svg DIR, roofline-<scenario>.svg per scenario (log-log
 * arithmetic intensity against achieved FLOP/s, one point per op that did
 * arithmetic, the two roofs) and decode-time.svg (a stacked bar per decode
 * scenario: time per token per op, dispatch gaps and the rest), and PNGs of
 * them when rsvg-convert or ImageMagick's convert is installed.
 */
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/safefile.h"
#include "bench_roofline.h"
#include "kernels/kernels.h"
#include "model/cost.h"
#include "model/gdn.h"
#include "base/util.h"

#define MAX_SCEN 8

typedef struct {
    char name[48], file[48];
    bool decode;
    int depth, batch, tokens, passes;
    double wall_s; /* the timed passes, end to end */
    double prof[LM_PROF_COUNT], gap[LM_PROF_COUNT], sleeps[LM_PROF_COUNT];
    pool_timing pt;
    cost_pass cost; /* summed over the timed passes */
} scenario;

/* ---- the compute roof ---------------------------------------------------- */

typedef struct {
    long rounds;
    float sink[1024];
} peak_job;

static void peak_worker(void *arg, int ith, int nth) {
    peak_job *j = arg;
    j->sink[ith % 1024] = kernels()->peak.run(j->rounds);
}

double bench_fma_peak(lm_pool *pool) {
    peak_job j = {.rounds = 1 << 20};
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = lm_now();
        pool_run(pool, peak_worker, &j);
        double dt = lm_now() - t0;
        double f = (double)pool_size(pool) * j.rounds * kernels()->peak.flops_per_round / dt;
        if (f > best) best = f;
        if (dt < 0.05) j.rounds *= 2, rep--; /* long enough to time */
    }
    return best;
}

/* ---- running the scenarios ----------------------------------------------- */

static void add_cost(cost_pass *acc, const cost_pass *c) {
    for (int k = 0; k < LM_PROF_COUNT; k++) {
        acc->op[k].weight_bytes += c->op[k].weight_bytes;
        acc->op[k].kv_read_bytes += c->op[k].kv_read_bytes;
        acc->op[k].kv_write_bytes += c->op[k].kv_write_bytes;
        acc->op[k].act_bytes += c->op[k].act_bytes;
        acc->op[k].flops += c->op[k].flops;
    }
    for (int i = 0; i < 2; i++) {
        acc->kv_read_class[i] += c->kv_read_class[i];
        acc->kv_write_class[i] += c->kv_write_class[i];
        acc->n_layer_class[i] = c->n_layer_class[i];
    }
    acc->kv_row_bytes = c->kv_row_bytes;
    acc->n_tokens += c->n_tokens;
    acc->state_bytes += c->state_bytes;
    acc->n_logits += c->n_logits;
}

static void prof_begin(lm_fwd *f, lm_pool *pool) {
    memset(f->prof, 0, sizeof f->prof);
    memset(f->prof_gap, 0, sizeof f->prof_gap);
    memset(f->prof_sleeps, 0, sizeof f->prof_sleeps);
    pool_timing_reset(pool);
    f->prof_gap_mark = 0;
    f->prof_sleep_mark = 0;
    pool_timing_enable(pool, 1);
    f->profile = true;
}

static void prof_end(lm_fwd *f, lm_pool *pool, scenario *s) {
    f->profile = false;
    pool_timing_enable(pool, 0);
    memcpy(s->prof, f->prof, sizeof s->prof);
    memcpy(s->gap, f->prof_gap, sizeof s->gap);
    memcpy(s->sleeps, f->prof_sleeps, sizeof s->sleeps);
    pool_timing_get(pool, &s->pt);
}

/* Decode: batch forks of one sequence filled to depth, then passes of one
 * token each (two untimed first). */
static void run_decode(const roofline_opts *o, scenario *s, const int32_t *toks) {
    const lm_model *m = o->m;
    char err[LM_ERRLEN];
    int warm = 2, n = o->n_gen, B = s->batch;
    /* a pass holds B tokens: the context is at least B, or a shallow batch's n_batch would be short */
    int n_ctx = s->depth + warm + n + 1;
    fwd_dims d = fwd_dims_make(m, n_ctx > B ? n_ctx : B, FWD_BATCH_DEFAULT);
    kv_config kc;
    fwd_kv_config(m, &d, &kc);
    kc.type = o->kv_type;
    kc.n_seqs = B;
    kv_pool *kv = kv_pool_new(&kc, err, sizeof err);
    if (!kv) fail("bench", err);
    lm_seqrun *sr = seqrun_new_shared(m, o->pool, kv, d.n_ctx, d.n_batch, err, sizeof err);
    if (!sr) fail("bench", err);
    for (int off = 0; off < s->depth; off += d.n_batch) {
        int k = s->depth - off < d.n_batch ? s->depth - off : d.n_batch;
        if (seqrun_forward(sr, toks + off, k, NULL, false, err, sizeof err)) fail("bench", err);
    }
    kv_seq **seqs = calloc((size_t)B, sizeof *seqs);
    lm_seg *segs = calloc((size_t)B, sizeof *segs);
    int32_t *tk = calloc((size_t)B, sizeof *tk);
    float *logits = malloc((size_t)B * m->hp.n_vocab * sizeof(float));
    if (!seqs || !segs || !tk || !logits) fail("bench", "out of memory");
    seqs[0] = sr->seq;
    for (int b = 1; b < B; b++) { /* its own blocks, holding a copy of the first sequence's K/V */
        if (!(seqs[b] = kv_seq_new(kv, err, sizeof err))) fail("bench", err);
        for (int off = 0; off < s->depth; off += d.n_batch) { /* in passes' steps, as a window's pool holds */
            int k = s->depth - off < d.n_batch ? s->depth - off : d.n_batch;
            if (kv_append(kv, seqs[b], k, err, sizeof err) != KV_OK) fail("bench", err);
        }
        for (int c = 0; c < KV_N_CLASS; c++) {
            const int32_t *src = kv_seq_table(sr->seq, c), *dst = kv_seq_table(seqs[b], c);
            for (int i = 0; src && dst && i < (s->depth + kc.block_size - 1) / kc.block_size; i++)
                if (src[i] >= 0 && dst[i] >= 0 && kv_block_copy(kv, &(kv_copy){c, src[i], dst[i]}))
                    fail("bench", "a KV block copy out of range");
        }
    }
    /* recurrent layers (qwen35): each fork a copy of the prefilled state, laid out as lm_seqrun's */
    const lm_hparams *hp = &m->hp;
    const size_t R = (size_t)hp->n_rlayer, cf = R ? gdn_conv_floats(hp) : 0, mf = R ? gdn_mat_floats(hp) : 0;
    float *state = R ? malloc((size_t)B * R * (cf + mf) * sizeof(float)) : NULL;
    float **sp = R ? malloc(2 * (size_t)B * R * sizeof *sp) : NULL;
    if (R && (!state || !sp)) fail("bench", "out of memory");
    for (int b = 0; R && b < B; b++) {
        float *st = state + (size_t)b * R * (cf + mf);
        memcpy(st, sr->rstate, R * (cf + mf) * sizeof(float));
        for (size_t r = 0; r < R; r++)
            sp[(2 * b) * R + r] = st + r * cf, sp[(2 * b + 1) * R + r] = st + R * cf + r * mf;
    }
    memset(&s->cost, 0, sizeof s->cost);
    lm_fwd *f = sr->fwd;
    for (int i = 0; i < warm + n; i++) {
        int pos = s->depth + i;
        for (int b = 0; b < B; b++) {
            if (kv_append(kv, seqs[b], 1, err, sizeof err) != KV_OK) fail("bench", err);
            segs[b] = (lm_seg){.seq = seqs[b],
                               .pos0 = pos,
                               .n = 1,
                               .n_logits = 1,
                               .rconv = R ? sp + (2 * b) * R : NULL,
                               .rmat = R ? sp + (2 * b + 1) * R : NULL};
            tk[b] = toks[(pos + b) % (s->depth + warm + n)];
        }
        if (i == warm) prof_begin(f, o->pool);
        double t0 = lm_now();
        if (fwd_run(f, tk, segs, B, logits, err, sizeof err)) fail("bench", err);
        if (i >= warm) {
            s->wall_s += lm_now() - t0;
            cost_pass c;
            if (cost_forward(m, o->kv_type, B, 1, pos, &c, err, sizeof err)) fail("bench", err);
            add_cost(&s->cost, &c);
        }
    }
    prof_end(f, o->pool, s);
    s->passes = n;
    s->tokens = n * B;
    for (int b = 1; b < B; b++) kv_seq_free(kv, seqs[b]);
    free(seqs);
    free(segs);
    free(tk);
    free(logits);
    free(state);
    free(sp);
    seqrun_free(sr);
    kv_pool_free(kv);
}

/* Prefill: -p tokens at depth 0, one pass per n_batch tokens; a warm-up
 * pass of the same size first. */
static void run_prefill(const roofline_opts *o, scenario *s, const int32_t *toks) {
    const lm_model *m = o->m;
    char err[LM_ERRLEN];
    int n = o->n_prompt;
    lm_seqrun *sr = seqrun_new(m, o->pool, n + 1, FWD_BATCH_DEFAULT, o->kv_type, err, sizeof err);
    if (!sr) fail("bench", err);
    float *logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
    if (!logits) fail("bench", "out of memory");
    if (seqrun_forward(sr, toks, n, logits, false, err, sizeof err)) fail("bench", err);
    seqrun_reset(sr);
    prof_begin(sr->fwd, o->pool);
    double t0 = lm_now();
    if (seqrun_forward(sr, toks, n, logits, false, err, sizeof err)) fail("bench", err);
    s->wall_s = lm_now() - t0;
    prof_end(sr->fwd, o->pool, s);
    memset(&s->cost, 0, sizeof s->cost);
    int nb = sr->fwd->dims.n_batch;
    s->passes = 0;
    for (int off = 0; off < n; off += nb, s->passes++) {
        cost_pass c;
        int k = n - off < nb ? n - off : nb;
        if (cost_forward(m, o->kv_type, 1, k, off, &c, err, sizeof err)) fail("bench", err);
        if (off + k < n) { /* only the last pass computes logits */
            memset(&c.op[LM_PROF_LM_HEAD], 0, sizeof c.op[LM_PROF_LM_HEAD]);
            c.n_logits = 0;
        }
        add_cost(&s->cost, &c);
    }
    s->tokens = n;
    free(logits);
    seqrun_free(sr);
}

/* ---- one op's figures ---------------------------------------------------- */

typedef struct {
    double time, gap, bytes, flops, intensity, gbs, gflops, roof, pct;
    bool memory_bound, plotted;
} op_fig;

static op_fig op_figures(const scenario *s, int k, double bw, double peak) {
    op_fig r = {0};
    const cost_op *c = &s->cost.op[k];
    r.time = s->prof[k];
    r.gap = s->gap[k];
    r.bytes = c->weight_bytes + c->kv_read_bytes + c->kv_write_bytes + c->act_bytes;
    r.flops = c->flops;
    r.intensity = r.bytes > 0 ? r.flops / r.bytes : 0;
    r.gbs = r.time > 0 ? r.bytes / r.time / 1e9 : 0;
    r.gflops = r.time > 0 ? r.flops / r.time / 1e9 : 0;
    r.memory_bound = r.intensity * bw < peak;
    r.roof = (r.memory_bound ? r.intensity * bw : peak) / 1e9;
    r.pct = r.roof > 0 ? 100 * r.gflops / r.roof : 0;
    r.plotted = r.time > 0 && r.flops > 0 && r.bytes > 0;
    return r;
}

/* ---- output --------------------------------------------------------------- */

static double sum_prof(const double *v) {
    double t = 0;
    for (int k = 0; k < LM_PROF_COUNT; k++) t += v[k];
    return t;
}

static void print_md(const roofline_opts *o, const scenario *sc, int n) {
    printf("roofs: read bandwidth %.1f GB/s, FMA rate %.1f GFLOP/s (%s, %d threads); ridge %.1f flop/byte\n",
           o->read_bw / 1e9, o->peak_flops / 1e9, kernels_isa_name(), pool_size(o->pool), o->peak_flops / o->read_bw);
    for (int i = 0; i < n; i++) {
        const scenario *s = &sc[i];
        double P = s->passes, T = s->tokens, ops = sum_prof(s->prof), gaps = sum_prof(s->gap);
        cost_op t = cost_total(&s->cost);
        printf("\n### %s: %.3f ms per pass (%d passes of %d tokens), ops %.3f ms, outside the ops %.3f ms\n", s->name,
               1e3 * s->wall_s / P, s->passes, s->tokens / s->passes, 1e3 * ops / P, 1e3 * (s->wall_s - ops) / P);
        printf("per token: weights %.2f MiB, KV read %.2f MiB (global layers %.2f, sliding-window %.2f), KV written "
               "%.1f KiB, activations %.2f MiB, %.3f GFLOP\n",
               t.weight_bytes / T / 1048576, t.kv_read_bytes / T / 1048576, s->cost.kv_read_class[0] / T / 1048576,
               s->cost.kv_read_class[1] / T / 1048576, t.kv_write_bytes / T / 1024, t.act_bytes / T / 1048576,
               t.flops / T / 1e9);
        if (s->cost.state_bytes > 0) /* of the activations: the linear-attention op's */
            printf("recurrent state: %.2f MiB read and written per token (of the activations), against %.2f MiB of KV "
                   "read\n",
                   s->cost.state_bytes / T / 1048576, t.kv_read_bytes / T / 1048576);
        printf("dispatch gaps: %.3f ms per pass (%.1f%% of the step) in %.1f pool runs; workers' wake-up %.1f us per "
               "run per worker\n",
               1e3 * gaps / P, 100 * gaps / s->wall_s, s->pt.runs / P,
               s->pt.runs && pool_size(o->pool) > 1 ? 1e6 * s->pt.wake_s / s->pt.runs / (pool_size(o->pool) - 1) : 0);
        /* where the workers' spin ran out: each such run pays a futex wake-up */
        printf("runs that met a worker asleep: %.1f per pass", s->pt.sleeps / P);
        for (int k = 0, sep = 0; k < LM_PROF_COUNT; k++)
            if (s->sleeps[k] > 0) printf("%s %s %.1f", sep++ ? "," : " (", lm_prof_names[k], s->sleeps[k] / P);
        printf("%s\n", s->pt.sleeps > 0 ? ")" : "");
        printf("\n| op | ms/pass | kernel ms | gap ms | MiB/pass | GFLOP/pass | flop/byte | GB/s | GFLOP/s | bound | "
               "of roof |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |\n");
        for (int k = 0; k < LM_PROF_COUNT; k++) {
            op_fig r = op_figures(s, k, o->read_bw, o->peak_flops);
            printf("| %s | %.3f | %.3f | %.3f | %.3f | %.4f | %.2f | %.1f | %.2f | %s | %.0f%% |\n", lm_prof_names[k],
                   1e3 * r.time / P, 1e3 * (r.time - r.gap) / P, 1e3 * r.gap / P, r.bytes / P / 1048576,
                   r.flops / P / 1e9, r.intensity, r.gbs, r.gflops, r.memory_bound ? "memory" : "compute", r.pct);
        }
    }
    printf("\n(the memory roof is the read bandwidth from memory: an op past 100%% of it read its bytes from the "
           "caches)\n");
}

static void print_json(const roofline_opts *o, const scenario *sc, int n) {
    printf("{\"model\": \"%s\", \"threads\": %d, \"isa\": \"%s\", \"kv_type\": \"%s\", \"read_bw_gbs\": %.3f,"
           " \"peak_gflops\": %.3f, \"ridge_flop_per_byte\": %.4f, \"scenarios\": [",
           o->m->name, pool_size(o->pool), kernels_isa_name(), quant_type_name(o->kv_type), o->read_bw / 1e9,
           o->peak_flops / 1e9, o->peak_flops / o->read_bw);
    for (int i = 0; i < n; i++) {
        const scenario *s = &sc[i];
        cost_op t = cost_total(&s->cost);
        double P = s->passes, ops = sum_prof(s->prof), gaps = sum_prof(s->gap);
        printf(
            "%s{\"name\": \"%s\", \"kind\": \"%s\", \"depth\": %d, \"batch\": %d, \"passes\": %d, \"tokens\": %d,"
            " \"step_s\": %.9f, \"ops_s\": %.9f, \"other_s\": %.9f, \"gap_s\": %.9f, \"pool_runs\": %.2f,"
            " \"wake_s\": %.9f,"
            " \"per_token\": {\"weight_bytes\": %.1f, \"kv_read_bytes\": %.1f, \"kv_write_bytes\": %.1f,"
            " \"kv_read_global_bytes\": %.1f, \"kv_read_local_bytes\": %.1f, \"act_bytes\": %.1f, \"state_bytes\": %.1f,"
            " \"flops\": %.1f},"
            " \"ops\": [",
            i ? ", " : "", s->name, s->decode ? "decode" : "prefill", s->depth, s->batch, s->passes, s->tokens,
            s->wall_s / P, ops / P, (s->wall_s - ops) / P, gaps / P, s->pt.runs / P, s->pt.wake_s / P,
            t.weight_bytes / s->tokens, t.kv_read_bytes / s->tokens, t.kv_write_bytes / s->tokens,
            s->cost.kv_read_class[0] / s->tokens, s->cost.kv_read_class[1] / s->tokens, t.act_bytes / s->tokens,
            s->cost.state_bytes / s->tokens, t.flops / s->tokens);
        for (int k = 0; k < LM_PROF_COUNT; k++) {
            op_fig r = op_figures(s, k, o->read_bw, o->peak_flops);
            const cost_op *c = &s->cost.op[k];
            printf("%s{\"op\": \"%s\", \"time_s\": %.9f, \"kernel_s\": %.9f, \"gap_s\": %.9f, \"weight_bytes\": %.1f,"
                   " \"kv_read_bytes\": %.1f, \"kv_write_bytes\": %.1f, \"act_bytes\": %.1f, \"bytes\": %.1f,"
                   " \"flops\": %.1f, \"intensity\": %.6g, \"gbs\": %.4f, \"gflops\": %.4f, \"bound\": \"%s\","
                   " \"roof_gflops\": %.4f, \"pct_of_roof\": %.2f, \"plotted\": %s}",
                   k ? ", " : "", lm_prof_names[k], r.time / P, (r.time - r.gap) / P, r.gap / P, c->weight_bytes / P,
                   c->kv_read_bytes / P, c->kv_write_bytes / P, c->act_bytes / P, r.bytes / P, r.flops / P, r.intensity,
                   r.gbs, r.gflops, r.memory_bound ? "memory" : "compute", r.roof, r.pct, r.plotted ? "true" : "false");
        }
        printf("]}");
    }
    printf("]}\n");
}

/* ---- pictures -------------------------------------------------------------- */

static const char *const op_colors[LM_PROF_COUNT] = {"#999999", "#b07aa1", "#4e79a7", "#9c755f", "#e15759", "#8cd17d",
                                                     "#76b7b2", "#59a14f", "#edc948", "#f28e2b", "#ff9da7"};

/* XML text: the names written here are lamina's own, but the model name is
 * the file's. */
static void xml_text(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else if ((unsigned char)*s >= 0x20 || *s == '\t') fputc(*s, f);
    }
}

#define SVG_W 800
#define SVG_H 480
#define PLOT_L 80
#define PLOT_R 560
#define PLOT_T 50
#define PLOT_B 420

static double lx(double v, double lo, double hi) {
    return PLOT_L + (log10(v) - log10(lo)) / (log10(hi) - log10(lo)) * (PLOT_R - PLOT_L);
}
static double ly(double v, double lo, double hi) {
    return PLOT_B - (log10(v) - log10(lo)) / (log10(hi) - log10(lo)) * (PLOT_B - PLOT_T);
}

/* An SVG is written through the output guard (base/safefile.h). */
static FILE *svg_open(const char *path, safefile **sf) {
    char err[LM_ERRLEN];
    if (!(*sf = safefile_create(path, err, sizeof err))) fail("bench", err);
    return safefile_stream(*sf);
}

static void svg_close(safefile *sf) {
    char err[LM_ERRLEN];
    if (safefile_commit(sf, err, sizeof err)) fail("bench", err);
}

static void write_roofline_svg(const char *path, const roofline_opts *o, const scenario *s) {
    safefile *sf;
    FILE *f = svg_open(path, &sf);
    double bw = o->read_bw, peak = o->peak_flops / 1e9;
    double xlo = 0.01, xhi = 1000, yhi = pow(10, ceil(log10(peak * 2))), ylo = yhi / 1e6;
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
            "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\">\n",
            SVG_W, SVG_H, SVG_W, SVG_H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<text x=\"%d\" y=\"24\" font-size=\"14\">",
            PLOT_L);
    xml_text(f, o->m->name);
    fprintf(f, ": roofline, %s (%d threads, %s)</text>\n", s->name, pool_size(o->pool), kernels_isa_name());
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#444\"/>\n", PLOT_L, PLOT_T,
            PLOT_R - PLOT_L, PLOT_B - PLOT_T);
    for (double v = xlo; v <= xhi * 1.001; v *= 10)
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%d\" "
                "text-anchor=\"middle\">%g</text>\n",
                lx(v, xlo, xhi), PLOT_T, lx(v, xlo, xhi), PLOT_B, lx(v, xlo, xhi), PLOT_B + 16, v);
    for (double v = ylo; v <= yhi * 1.001; v *= 10)
        fprintf(f,
                "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%d\" y=\"%.1f\" "
                "text-anchor=\"end\">%g</text>\n",
                PLOT_L, ly(v, ylo, yhi), PLOT_R, ly(v, ylo, yhi), PLOT_L - 6, ly(v, ylo, yhi) + 4, v);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">arithmetic intensity (flop/byte)</text>\n",
            (PLOT_L + PLOT_R) / 2, PLOT_B + 36);
    fprintf(f, "<text transform=\"translate(20 %d) rotate(-90)\" text-anchor=\"middle\">achieved GFLOP/s</text>\n",
            (PLOT_T + PLOT_B) / 2);
    /* the roofs: bandwidth x I up to the ridge, then the FMA rate */
    double ridge = peak * 1e9 / bw, x0 = xlo;
    if (bw * x0 / 1e9 < ylo) x0 = ylo * 1e9 / bw;
    fprintf(f,
            "<polyline class=\"roof\" fill=\"none\" stroke=\"#222\" stroke-width=\"2\" points=\"%.1f,%.1f "
            "%.1f,%.1f %.1f,%.1f\"/>\n",
            lx(x0, xlo, xhi), ly(bw * x0 / 1e9, ylo, yhi), lx(ridge, xlo, xhi), ly(peak, ylo, yhi), lx(xhi, xlo, xhi),
            ly(peak, ylo, yhi));
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">read %.1f GB/s</text>\n", lx(x0, xlo, xhi) + 10,
            ly(bw * x0 / 1e9, ylo, yhi) - 8, bw / 1e9);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">FMA %.1f GFLOP/s</text>\n", lx(xhi, xlo, xhi) - 4,
            ly(peak, ylo, yhi) - 6, peak);
    int row = 0;
    for (int k = 0; k < LM_PROF_COUNT; k++) {
        op_fig r = op_figures(s, k, bw, o->peak_flops);
        if (!r.plotted) continue;
        double x = fmin(fmax(r.intensity, xlo), xhi), y = fmin(fmax(r.gflops, ylo), yhi);
        fprintf(f,
                "<circle class=\"op\" data-op=\"%s\" cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"%s\" stroke=\"#222\"/>\n",
                lm_prof_names[k], lx(x, xlo, xhi), ly(y, ylo, yhi), op_colors[k]);
        fprintf(f,
                "<circle cx=\"%d\" cy=\"%d\" r=\"5\" fill=\"%s\" stroke=\"#222\"/><text x=\"%d\" y=\"%d\">%s "
                "%.0f%% (%s)</text>\n",
                PLOT_R + 14, PLOT_T + 8 + 18 * row, op_colors[k], PLOT_R + 24, PLOT_T + 12 + 18 * row, lm_prof_names[k],
                r.pct, r.memory_bound ? "memory" : "compute");
        row++;
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"#555\">share of the roof that bounds the op</text>\n", PLOT_R + 14,
            PLOT_T + 12 + 18 * row + 6);
    fprintf(f, "</svg>\n");
    svg_close(sf);
}

static void write_bars_svg(const char *path, const roofline_opts *o, const scenario *sc, int n) {
    safefile *sf;
    FILE *f = svg_open(path, &sf);
    double top = 0;
    int nb = 0;
    for (int i = 0; i < n; i++)
        if (sc[i].decode) {
            double v = sc[i].wall_s / sc[i].tokens;
            if (v > top) top = v;
            nb++;
        }
    top *= 1.1;
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
            "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\">\n",
            SVG_W, SVG_H, SVG_W, SVG_H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<text x=\"%d\" y=\"24\" font-size=\"14\">",
            PLOT_L);
    xml_text(f, o->m->name);
    fprintf(f, ": where decode time goes (ms per token, %d threads)</text>\n", pool_size(o->pool));
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#444\"/>\n", PLOT_L, PLOT_B, PLOT_R, PLOT_B);
    for (int t = 0; t <= 4; t++) {
        double v = top * t / 4, y = PLOT_B - (PLOT_B - PLOT_T) * t / 4.0;
        fprintf(f,
                "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%d\" y=\"%.1f\" "
                "text-anchor=\"end\">%.3g</text>\n",
                PLOT_L, y, PLOT_R, y, PLOT_L - 6, y + 4, 1e3 * v);
    }
    double bw_w = nb ? (PLOT_R - PLOT_L) / (double)nb : 0;
    int bi = 0;
    for (int i = 0; i < n; i++) {
        const scenario *s = &sc[i];
        if (!s->decode) continue;
        double x = PLOT_L + bi * bw_w + bw_w * 0.2, w = bw_w * 0.6, y = PLOT_B, T = s->tokens;
        double parts[LM_PROF_COUNT + 2];
        for (int k = 0; k < LM_PROF_COUNT; k++) parts[k] = (s->prof[k] - s->gap[k]) / T;
        parts[LM_PROF_COUNT] = sum_prof(s->gap) / T;
        parts[LM_PROF_COUNT + 1] = fmax(0, s->wall_s - sum_prof(s->prof)) / T;
        for (int k = 0; k < LM_PROF_COUNT + 2; k++) {
            double h = parts[k] / top * (PLOT_B - PLOT_T);
            if (h <= 0) continue;
            const char *name = k < LM_PROF_COUNT ? lm_prof_names[k] : k == LM_PROF_COUNT ? "dispatch gaps" : "other";
            const char *col = k < LM_PROF_COUNT ? op_colors[k] : k == LM_PROF_COUNT ? "#333333" : "#dddddd";
            fprintf(f,
                    "<rect class=\"part\" data-part=\"%s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.2f\" "
                    "fill=\"%s\"><title>%s %.4f ms</title></rect>\n",
                    name, x, y - h, w, h, col, name, 1e3 * parts[k]);
            y -= h;
        }
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", x + w / 2, PLOT_B + 16, s->name);
        bi++;
    }
    for (int k = 0; k < LM_PROF_COUNT + 2; k++) {
        const char *name = k < LM_PROF_COUNT ? lm_prof_names[k] : k == LM_PROF_COUNT ? "dispatch gaps" : "other";
        const char *col = k < LM_PROF_COUNT ? op_colors[k] : k == LM_PROF_COUNT ? "#333333" : "#dddddd";
        fprintf(f,
                "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/><text x=\"%d\" y=\"%d\">%s</text>\n",
                PLOT_R + 20, PLOT_T + 18 * k, col, PLOT_R + 36, PLOT_T + 9 + 18 * k, name);
    }
    fprintf(f, "</svg>\n");
    svg_close(sf);
}

/* Run a converter without a shell (the paths are the user's); its exit
 * status, 127 when it is not installed. */
static int run_converter(const char *const *argv) {
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, 1), dup2(devnull, 2);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0) return 127;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 127;
}

/* A PNG beside the SVG when rsvg-convert or ImageMagick's convert is
 * installed; nothing otherwise. The converter writes the output guard's
 * temporary file, which replaces the PNG only when it succeeded. */
static void svg_to_png(const char *svg) {
    char png[4096], err[LM_ERRLEN];
    size_t len = strlen(svg);
    if (len < 4 || len + 1 > sizeof png) return;
    memcpy(png, svg, len - 4);
    memcpy(png + len - 4, ".png", 5);
    safefile *f = safefile_create(png, err, sizeof err);
    if (!f) {
        fprintf(stderr, "lamina bench: warning: no PNG: %s\n", err);
        return;
    }
    char magick_out[4200]; /* (the temporary's name has no .png to tell ImageMagick the format) */
    snprintf(magick_out, sizeof magick_out, "png:%s", safefile_temp(f));
    const char *rsvg[] = {"rsvg-convert", "-f", "png", "-o", safefile_temp(f), svg, NULL};
    const char *magick[] = {"convert", svg, magick_out, NULL};
    int rc = run_converter(rsvg);
    if (rc == 127) rc = run_converter(magick);
    struct stat st;
    if (rc != 0 || stat(safefile_temp(f), &st) != 0 || st.st_size == 0) {
        if (rc != 127) fprintf(stderr, "lamina bench: warning: %s: the converter failed; no PNG written\n", png);
        safefile_abort(f);
        return;
    }
    if (safefile_commit(f, err, sizeof err) != 0) fprintf(stderr, "lamina bench: warning: %s\n", err);
}

static void write_pictures(const roofline_opts *o, const scenario *sc, int n) {
    if (mkdir(o->svg_dir, 0755) != 0 && access(o->svg_dir, W_OK) != 0) fail("bench", "cannot write into --svg DIR");
    char path[4096];
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/roofline-%s.svg", o->svg_dir, sc[i].file);
        write_roofline_svg(path, o, &sc[i]);
        svg_to_png(path);
    }
    snprintf(path, sizeof path, "%s/decode-time.svg", o->svg_dir);
    write_bars_svg(path, o, sc, n);
    svg_to_png(path);
}

int bench_roofline(const roofline_opts *o) {
    scenario sc[MAX_SCEN];
    memset(sc, 0, sizeof sc);
    int n = 0, max_depth = 0;
    for (int i = 0; i < o->n_depth; i++) max_depth = o->depths[i] > max_depth ? o->depths[i] : max_depth;
    int ntok = max_depth + o->n_gen + 8 + o->n_prompt;
    int32_t *toks = malloc((size_t)ntok * sizeof *toks);
    if (!toks) fail("bench", "out of memory");
    lm_rng rng;
    lm_rng_seed(&rng, 42);
    for (int i = 0; i < ntok; i++) toks[i] = (int32_t)(lm_rng_u64(&rng) % (uint64_t)o->m->hp.n_vocab);
    bool did0 = false;
    for (int i = -1; i < o->n_depth && n < MAX_SCEN - 1 && o->n_gen > 0; i++) {
        int d = i < 0 ? 0 : o->depths[i];
        if (d == 0 && did0) continue;
        did0 = did0 || d == 0;
        scenario *s = &sc[n++];
        s->decode = true;
        s->depth = d;
        s->batch = o->batch;
        snprintf(s->name, sizeof s->name, "tg b%d @ d%d", o->batch, d);
        snprintf(s->file, sizeof s->file, "decode-b%d-d%d", o->batch, d);
        run_decode(o, s, toks);
    }
    if (o->n_prompt > 0) {
        scenario *s = &sc[n++];
        s->batch = 1;
        snprintf(s->name, sizeof s->name, "pp%d", o->n_prompt);
        snprintf(s->file, sizeof s->file, "prefill-%d", o->n_prompt);
        run_prefill(o, s, toks);
    }
    if (o->json) print_json(o, sc, n);
    else print_md(o, sc, n);
    if (o->svg_dir) write_pictures(o, sc, n);
    free(toks);
    return 0;
}
