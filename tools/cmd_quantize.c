/*
 * cmd_quantize.c - `lamina quantize IN.gguf OUT.gguf TYPE` (see quantize.h).
 */
#include <string.h>

#include "cli.h"
#include "base/pool.h"
#include "format/quant.h"
#include "format/quantize.h"
#include "base/util.h"

static void usage_quantize(FILE *f) {
    fprintf(f,
            "usage: lamina quantize IN.gguf OUT.gguf TYPE [-t THREADS]\n"
            "Convert a model's weight matrices to TYPE: F32 F16 BF16 Q8_0 Q4_0 Q4_K Q6_K Q4_K_M.\n"
            "Norms and biases stay in their type; metadata is copied.\n");
}

static void progress(void *user, int64_t i, int64_t n, const char *name, uint32_t from, uint32_t to, uint64_t in_b,
                     uint64_t out_b) {
    uint64_t *tot = user;
    tot[0] += in_b;
    tot[1] += out_b;
    fprintf(stderr, "[%4lld/%4lld] %-32s %-5s -> %-5s %9.2f MiB -> %8.2f MiB\n", (long long)i + 1, (long long)n, name,
            quant_type_name(from), quant_type_name(to), in_b / 1048576.0, out_b / 1048576.0);
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
        die_usage(&a, "cannot quantize to '%s' (F32 F16 BF16 Q8_0 Q4_0 Q4_K Q6_K Q4_K_M)", pos[2]);
    lm_pool *pool = pool_new((int)threads);
    if (!pool) fail("quantize", "cannot start threads");
    char err[LM_ERRLEN];
    uint64_t tot[2] = {0, 0};
    double t0 = lm_now();
    if (quantize_file(pos[0], pos[1], pos[2], pool, progress, tot, err, sizeof err)) fail("quantize", err);
    fprintf(stderr, "quantize: %s -> %s: %.2f MiB -> %.2f MiB in %.1f s\n", pos[0], pos[1], tot[0] / 1048576.0,
            tot[1] / 1048576.0, lm_now() - t0);
    pool_free(pool);
    return 0;
}
