/*
 * bench_roofline.h - `lamina bench --roofline` (cmd_bench_roofline.c),
 * started by cmd_bench with the model, the threads and the roofs it
 * measured.
 */
#ifndef LAMINA_BENCH_ROOFLINE_H
#define LAMINA_BENCH_ROOFLINE_H

#include <stdbool.h>
#include <stdint.h>

#include "cli.h"
#include "model/forward.h"
#include "base/pool.h"

typedef struct {
    const lm_model *m;
    lm_pool *pool;
    uint32_t kv_type;
    const int *depths; /* (n_depth) decode depths; 0 is always run */
    int n_depth;
    int batch;         /* decode sequences per pass */
    int n_gen;         /* timed decode passes (0: no decode) */
    int n_prompt;      /* prefill tokens (0: no prefill) */
    double read_bw;    /* bytes/s */
    double peak_flops; /* FLOP/s */
    bool json;
    const char *svg_dir; /* NULL: no pictures */
} roofline_opts;

/* The FMA rate of every thread of pool together, FLOP/s (best of 5). */
double bench_fma_peak(lm_pool *pool);
int bench_roofline(const roofline_opts *o);

#endif
