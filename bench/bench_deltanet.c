/*
 * bench_deltanet.c - the linear-attention kernels (kernels/deltanet.h) of
 * each variant this CPU runs (scalar, avx2, avx512, neon), against the
 * scalar reference.
 *
 * Build: `make bench` (build/bench_deltanet).
 *
 * Run: build/bench_deltanet [-d 128] [-T 512] [-C 8192] [-r 7]
 *
 * One thread, one head of dk = dv = d (Qwen3.5's 128 by default), random
 * unit keys and queries, decays in [-3, 0]. Times are the best of r rounds
 * (each long enough to be timed), per token and head for the delta rule,
 * per token for the conv over C channels (Qwen3.5-9B's 2 * 16 * 128 + 32 *
 * 128 = 8192) with k = 4 taps and SiLU:
 *   recur 1      one decoded token (the state, 64 KiB at d = 128, stays in L2)
 *   recur T      a T-token prompt token by token
 *   chunk T      the same prompt chunkwise (LM_DN_CHUNK tokens at a time)
 *   conv 1, T    one token, a T-token prompt
 *   l2norm, norm_gated  one head's vector of d
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/util.h"
#include "kernels/deltanet.h"
#include "kernels/kernels.h"

static lm_rng rng;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void fill(float *x, size_t n, double sc) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(lm_rng_normal(&rng) * sc);
}

typedef struct {
    int d, T, C;
    float *q, *k, *v, *g, *beta, *o, *S, *S0, *work;
    float *x, *y, *w, *st;
    int what, n; /* the op and its tokens */
} bench;

enum { B_RECUR, B_CHUNK, B_CONV, B_L2, B_NORM };

static void run_once(const bench *b) {
    const lm_dn_kernels *dn = &kernels()->dn;
    lm_dn_seq s = {.q = b->q,
                   .k = b->k,
                   .v = b->v,
                   .g = b->g,
                   .beta = b->beta,
                   .o = b->o,
                   .qk_stride = b->d,
                   .v_stride = b->d,
                   .gb_stride = 1,
                   .o_stride = b->d,
                   .n_tok = b->n,
                   .dk = b->d,
                   .dv = b->d,
                   .scale = 1.0f / sqrtf((float)b->d)};
    switch (b->what) {
        case B_RECUR: dn->recur(b->S, &s); break;
        case B_CHUNK: dn->chunk(b->S, &s, b->work); break;
        case B_CONV: dn->conv(b->y, b->x, b->st, b->w, b->n, b->C, 4, (size_t)b->C, true); break;
        case B_L2: dn->l2norm(b->y, b->x, b->d, 1e-6f); break;
        case B_NORM: dn->norm_gated(b->y, b->x, b->w, b->q, b->d, 1e-6f); break;
    }
}

/* Seconds per call: the best of `rounds` rounds of enough calls to take ~20 ms. */
static double time_op(bench *b, int rounds) {
    int reps = 1;
    for (;;) {
        double t0 = now();
        for (int i = 0; i < reps; i++) run_once(b);
        if (now() - t0 > 0.02 || reps > (1 << 24)) break;
        reps *= 2;
    }
    double best = 1e30;
    for (int r = 0; r < rounds; r++) {
        memcpy(b->S, b->S0, sizeof(float) * b->d * b->d); /* decays keep the state bounded either way */
        double t0 = now();
        for (int i = 0; i < reps; i++) run_once(b);
        double t = (now() - t0) / reps;
        if (t < best) best = t;
    }
    return best;
}

int main(int argc, char **argv) {
    bench b = {.d = 128, .T = 512, .C = 8192};
    int rounds = 7;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-d")) b.d = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-T")) b.T = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-C")) b.C = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-r")) rounds = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_deltanet [-d 128] [-T 512] [-C 8192] [-r 7]\n");
            return 2;
        }
    }
    if (b.d < 1 || b.d > LM_DN_MAX_DIM || b.T < 1 || b.C < 1 || rounds < 1) {
        fprintf(stderr, "bench_deltanet: -d 1..%d, -T, -C and -r at least 1\n", LM_DN_MAX_DIM);
        return 2;
    }
    lm_rng_seed(&rng, 7);
    const size_t d = (size_t)b.d, T = (size_t)b.T, C = (size_t)b.C;
    b.q = lm_malloc(sizeof(float) * T * d), b.k = lm_malloc(sizeof(float) * T * d);
    b.v = lm_malloc(sizeof(float) * T * d), b.o = lm_malloc(sizeof(float) * T * d);
    b.g = lm_malloc(sizeof(float) * T), b.beta = lm_malloc(sizeof(float) * T);
    b.S = lm_malloc(sizeof(float) * d * d), b.S0 = lm_malloc(sizeof(float) * d * d);
    b.work = lm_malloc(sizeof(float) * dn_chunk_work(b.d, b.d));
    b.x = lm_malloc(sizeof(float) * T * C), b.y = lm_malloc(sizeof(float) * T * C);
    b.w = lm_malloc(sizeof(float) * 4 * C), b.st = lm_malloc(sizeof(float) * 3 * C);
    fill(b.q, T * d, 1), fill(b.k, T * d, 1), fill(b.v, T * d, 1), fill(b.S0, d * d, 0.5);
    for (size_t t = 0; t < T; t++) {
        kernels()->dn.l2norm(b.q + t * d, b.q + t * d, b.d, 1e-6f);
        kernels()->dn.l2norm(b.k + t * d, b.k + t * d, b.d, 1e-6f);
        b.g[t] = (float)(-3.0 * lm_rng_uniform(&rng)), b.beta[t] = (float)lm_rng_uniform(&rng);
    }
    fill(b.x, T * C, 1), fill(b.w, 4 * C, 0.5), fill(b.st, 3 * C, 1);

    static const struct {
        int what, prompt;
        const char *name, *unit;
    } ops[] = {{B_RECUR, 0, "recur 1", "us/token/head"}, {B_RECUR, 1, "recur T", "us/token/head"},
               {B_CHUNK, 1, "chunk T", "us/token/head"}, {B_CONV, 0, "conv 1", "us/token"},
               {B_CONV, 1, "conv T", "us/token"},        {B_L2, 0, "l2norm", "ns/head"},
               {B_NORM, 0, "norm_gated", "ns/head"}};
    static const lm_isa isas[] = {LM_ISA_SCALAR, LM_ISA_AVX2, LM_ISA_AVX512, LM_ISA_NEON};
    const size_t nv = sizeof isas / sizeof isas[0];
    const lm_isa start = kernels()->isa;
    printf("d %d, T %d, C %d, one thread, best of %d rounds\n", b.d, b.T, b.C, rounds);
    printf("%-11s %-14s", "op", "unit");
    for (size_t v = 0; v < nv; v++)
        if (kernels_cpu_has(isas[v])) printf(" %10s", kernels_isa_str(isas[v]));
    printf("   (x scalar)\n");
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        printf("%-11s %-14s", ops[i].name, ops[i].unit);
        double base = 0;
        char ratios[64] = "";
        for (size_t v = 0; v < nv; v++) {
            if (!kernels_cpu_has(isas[v])) continue;
            kernels_use(isas[v]);
            b.what = ops[i].what, b.n = ops[i].prompt ? b.T : 1;
            double t = time_op(&b, rounds);
            double per = ops[i].what >= B_L2 ? t * 1e9 : t * 1e6 / b.n;
            printf(" %10.3f", per);
            if (v == 0) base = per;
            else {
                size_t l = strlen(ratios);
                snprintf(ratios + l, sizeof ratios - l, " %.1f", base / per);
            }
        }
        printf("  %s\n", ratios);
    }
    kernels_use(start);
    return 0;
}
