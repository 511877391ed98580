/*
 * cmd_quantize.c - `lamina quantize IN.gguf OUT.gguf TYPE` (see quantize.h):
 * a line per tensor, then a warning per group of tensors that fell back to
 * another type (with the reason), and a summary: tensors, bytes and bits per
 * weight per output type and in all.
 */
#include <string.h>

#include "cli.h"
#include "base/pool.h"
#include "format/quant.h"
#include "format/quantize.h"
#include "base/util.h"

static void usage_quantize(FILE *f) {
    fprintf(f,
            "usage: lamina quantize IN.gguf OUT.gguf TYPE [-t THREADS] [--progress]\n"
            "Convert a model's weight matrices to TYPE: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q6_K Q4_K_M\n"
            "MXFP4.\n"
            "Norms and biases stay in their type; metadata is copied.\n"
            "A progress line (tensor i of n, bytes, ETA) is drawn when stderr is a terminal, or with --progress.\n");
}

/* What was written, for the summary: tensors, bytes and elements per output
 * type, and the fallbacks grouped by (type asked, type written, row length). */
#define MAX_FALLBACK 16
typedef struct {
    uint32_t want, to;
    int64_t row_len;
    int count;
} q_fallback;

typedef struct {
    uint64_t in_bytes, out_bytes, elements;
    uint64_t count[LM_TYPE_COUNT], bytes[LM_TYPE_COUNT], elems[LM_TYPE_COUNT];
    q_fallback fb[MAX_FALLBACK];
    int n_fb, fb_other; /* groups; tensors in groups past MAX_FALLBACK */
    progress_line prog; /* tensor i of n, bytes, ETA, under the tensor lines */
} q_totals;

static void on_tensor(void *user, const quantize_tensor_info *t) {
    q_totals *q = user;
    q->in_bytes += t->in_bytes;
    q->out_bytes += t->out_bytes;
    q->elements += t->n_elements;
    if (t->to < LM_TYPE_COUNT) {
        q->count[t->to]++;
        q->bytes[t->to] += t->out_bytes;
        q->elems[t->to] += t->n_elements;
    }
    if (t->want != t->to) {
        int k = 0;
        while (k < q->n_fb && !(q->fb[k].want == t->want && q->fb[k].to == t->to && q->fb[k].row_len == t->row_len))
            k++;
        if (k == q->n_fb && q->n_fb < MAX_FALLBACK) q->fb[q->n_fb++] = (q_fallback){t->want, t->to, t->row_len, 0};
        if (k < q->n_fb) q->fb[k].count++;
        else q->fb_other++;
    }
    progress_hide(&q->prog);
    fprintf(stderr, "[%4lld/%4lld] %-32s %-5s -> %-5s %9.2f MiB -> %8.2f MiB\n", (long long)t->i + 1, (long long)t->n,
            t->name, quant_type_name(t->from), quant_type_name(t->to), t->in_bytes / 1048576.0,
            t->out_bytes / 1048576.0);
    progress_bytes(&q->prog, t->in_done, t->in_total);
    progress_update(&q->prog, (long long)t->i + 1, (long long)t->n);
}

/* The warning about fallbacks (one line per group) and the summary: per
 * output type its tensors, bytes and bits per weight, then the totals. */
static void print_summary(const q_totals *q, const char *scheme) {
    for (int k = 0; k < q->n_fb; k++) {
        const lm_type_traits *tr = quant_traits(q->fb[k].want);
        fprintf(stderr,
                "quantize: warning: %d tensor%s kept as %s instead of %s: row length %lld is not a multiple of "
                "%s's block of %lld\n",
                q->fb[k].count, q->fb[k].count == 1 ? "" : "s", quant_type_name(q->fb[k].to),
                quant_type_name(q->fb[k].want), (long long)q->fb[k].row_len, quant_type_name(q->fb[k].want),
                (long long)(tr ? tr->blck : 0));
    }
    if (q->fb_other) fprintf(stderr, "quantize: warning: %d more tensors kept in another type\n", q->fb_other);
    fprintf(stderr, "quantize: summary (%s):\n", scheme);
    for (uint32_t t = 0; t < LM_TYPE_COUNT; t++)
        if (q->count[t])
            fprintf(stderr, "  %-6s %5llu tensors %12llu bytes %10.2f MiB %6.2f bits/weight\n", quant_type_name(t),
                    (unsigned long long)q->count[t], (unsigned long long)q->bytes[t], q->bytes[t] / 1048576.0,
                    q->elems[t] ? 8.0 * (double)q->bytes[t] / (double)q->elems[t] : 0.0);
    uint64_t n = 0;
    for (uint32_t t = 0; t < LM_TYPE_COUNT; t++) n += q->count[t];
    fprintf(stderr, "  %-6s %5llu tensors %12llu bytes %10.2f MiB %6.2f bits/weight, %llu weights\n", "total",
            (unsigned long long)n, (unsigned long long)q->out_bytes, q->out_bytes / 1048576.0,
            q->elements ? 8.0 * (double)q->out_bytes / (double)q->elements : 0.0, (unsigned long long)q->elements);
}

int cmd_quantize(int argc, char **argv) {
    args a = {argc, argv, 0, "quantize", usage_quantize};
    const char *pos[3] = {NULL, NULL, NULL};
    int npos = 0;
    long long threads = pool_default_threads();
    for (a.i = 1; a.i < argc; a.i++) {
        if (is_help(&a)) continue;
        if (is_flag(&a, "-t", "--threads")) threads = need_int(&a, 1, 1024);
        else if (argv[a.i][0] == '-' && argv[a.i][1]) die_usage(&a, "unknown argument '%s'", argv[a.i]);
        else if (npos < 3) pos[npos++] = argv[a.i];
        else die_usage(&a, "unexpected argument '%s'", argv[a.i]);
    }
    if (npos != 3) die_usage(&a, "%s", "needs IN.gguf OUT.gguf TYPE");
    uint32_t base;
    bool k_m;
    if (quantize_scheme(pos[2], &base, &k_m))
        die_usage(&a, "cannot quantize to '%s' (F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q6_K Q4_K_M MXFP4)", pos[2]);
    lm_pool *pool = pool_new((int)threads);
    if (!pool) fail("quantize", "cannot start threads");
    char err[LM_ERRLEN];
    q_totals tot = {0};
    double t0 = lm_now();
    progress_begin(&tot.prog, "quantize", "converting", "tensors");
    int rc = quantize_file(pos[0], pos[1], pos[2], pool, on_tensor, &tot, err, sizeof err);
    progress_end(&tot.prog);
    if (rc) fail("quantize", err);
    print_summary(&tot, pos[2]);
    fprintf(stderr, "quantize: %s -> %s: %.2f MiB -> %.2f MiB in %.1f s\n", pos[0], pos[1], tot.in_bytes / 1048576.0,
            tot.out_bytes / 1048576.0, lm_now() - t0);
    pool_free(pool);
    return 0;
}
