/*
 * bench_attn.c - the tiled paged attention kernel against plain loops.
 *
 * Build: `make bench` (build/bench_attn).
 *
 * Run: build/bench_attn [-H 32] [-K 8] [-D 128] [-c 1024,4096,8192] [-q 64] [-b 16] [--mem-ctx 4096] [--scalar]
 *                      [--no-plain] [--sinks S] [--kv F32,F16,Q8_0] [-t THREADS] [--layers L] [--cold MIB] [--shuffle]
 *                      [--entries]
 *                      (--mem-ctx 0 skips the memory part, -c 0 the speed part)
 *
 * One layer, one thread, block size 16 (-b). For each context length T and each
 * KV type (--kv, default F32,F16; the plain loop only for F32 and F16):
 *   decode   one query at position T-1, all heads: attn_tile per KV head
 *            against the plain loop of the contiguous cache (per head: scores,
 *            softmax, weighted sum, as forward.c does it; F16 read through a
 *            65536-entry table, the cheapest scalar conversion)
 *   prefill  the last q query tokens (a prefill chunk at depth T - q), all
 *            heads: attn_tile over ATTN_TILE_Q tiles against the same plain
 *            loop per (token, head)
 * --sinks S: every head gets an attention sink of logit S (attn_tile_sinks;
 * the plain loop adds e^(S - m) to its denominator); without it the tiled
 * path passes no sinks.
 * -t N (N > 1): the tiled decode and prefill run on a pool of N threads as
 * the forward pass runs them: (query tile, KV head) items, and when the
 * items are fewer than the threads each item's key splits cut into up to
 * N / items units (attn_tile_part, then attn_tile_merge); the plain loop
 * stays on one thread. "decode GB/s" is the KV bytes a decode step reads
 * (K and V of every position, in the cache's type) over its time.
 * --layers L: the pool holds L layers (each (layer, K|V, head) its own
 * region of the slab-major pool, kv/kv.h), layer 0 is read. --shuffle:
 * before the sequence takes its blocks, every block of the pool is taken by
 * a one-block sequence and given back in shuffled order, as a serving pool
 * is after requests finished in any order. --cold M: before each timed run, read M MiB of other memory, so
 * that the cache comes from memory (as in a model's step, between whose
 * layers the weights stream) rather than from the caches a repeated run
 * leaves it in; on a host whose last-level cache is shared with others,
 * take M well past its size and compare runs side by side.
 * --entries: then the table's inner loops alone, for each --kv type, on one
 * KV head's decode rows (H / K query rows, head dim D): the scores entry
 * (F32: scores; F16: scores_f16; Q8_0: scores_q8_0_q8 on the query in
 * Q8_0) and the P·V entry (pv, pv_f16, pv_q8_0), each called on 64-key
 * chunks cycling over 16 chunks of K and V rows (in L2 for Gemma's and
 * TinyLlama's shapes), one thread, no prefetch rows; ns per key, the best of
 * three runs of 0.2 s.
 * Both compute on the same K/V values; the largest relative difference of
 * their outputs is printed. Times are the best of repeated runs.
 * Memory: a full prefill of --mem-ctx tokens runs in three child processes
 * (data only; tiled kernel; a plain version that materializes each head's
 * T x T score matrix) and their peak RSS (ru_maxrss) is printed.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <stdatomic.h>

#include "base/pool.h"
#include "kv/attn.h"
#include "kv/kv.h"
#include "format/quant.h"
#include "kernels/kernels.h"
#include "base/util.h"

typedef struct {
    int nh, nkv, hd, T;
    float *k, *v; /* (T, nkv*hd) */
    uint16_t *k16, *v16;
    float *q; /* (T, nh*hd) */
    kv_pool *pool;
    kv_seq *seq;
} bench;

static float f16_table[65536];
static bool no_plain; /* --no-plain: time the tiled kernel only */
static int block_size = KV_DEFAULT_BLOCK;
static bool use_sinks; /* --sinks: every head's sink is sink_logit */
static float sink_logit, sinks[1024];
static lm_pool *tpool;      /* -t N > 1: the threads of the tiled runs */
static attn_scratch **tscr; /* (threads) one scratch each */
static float *tpart;        /* split-K partials */
static size_t tpart_cap;
static int n_layers = 1;  /* --layers: the pool's layers per block (layer 0 is read) */
static size_t cold_bytes; /* --cold MIB: read this much before each timed run */
static bool shuffled;     /* --shuffle: the pool's blocks given back in shuffled order first */
static volatile float cold_sink;

static void die(const char *msg) {
    fprintf(stderr, "bench_attn: %s\n", msg);
    exit(1);
}

static void bench_make(bench *b, int nh, int nkv, int hd, int T, uint32_t type) {
    b->nh = nh, b->nkv = nkv, b->hd = hd, b->T = T;
    size_t kvn = (size_t)T * nkv * hd, qn = (size_t)T * nh * hd;
    b->k = malloc(kvn * 4), b->v = malloc(kvn * 4), b->q = malloc(qn * 4);
    b->k16 = malloc(kvn * 2), b->v16 = malloc(kvn * 2);
    if (!b->k || !b->v || !b->q || !b->k16 || !b->v16) die("out of memory");
    lm_rng r;
    lm_rng_seed(&r, 1);
    for (size_t i = 0; i < kvn; i++) b->k[i] = lm_rng_normal(&r), b->v[i] = lm_rng_normal(&r);
    for (size_t i = 0; i < qn; i++) b->q[i] = lm_rng_normal(&r);
    /* both caches hold the same values: round to f16 once when the pool is F16 */
    for (size_t i = 0; i < kvn; i++) {
        b->k16[i] = lm_f32_to_f16(b->k[i]), b->v16[i] = lm_f32_to_f16(b->v[i]);
        if (type == LM_TYPE_F16) b->k[i] = lm_f16_to_f32(b->k16[i]), b->v[i] = lm_f16_to_f32(b->v16[i]);
    }
    if (type == LM_TYPE_Q8_0) { /* the values as stored, for the reference */
        const lm_type_traits *tt = quant_traits(type);
        void *tmp = malloc((size_t)hd * 4);
        for (size_t i = 0; i < kvn; i += (size_t)hd) {
            tt->from_float(b->k + i, tmp, hd), tt->to_float(tmp, b->k + i, hd);
            tt->from_float(b->v + i, tmp, hd), tt->to_float(tmp, b->v + i, hd);
        }
        free(tmp);
    }
    kv_config c;
    kv_config_init(&c, n_layers, nkv, hd);
    c.type = type;
    c.block_size = block_size;
    c.n_ctx = T;
    char err[LM_ERRLEN];
    b->pool = kv_pool_new(&c, err, sizeof err);
    if (!b->pool) die(err);
    if (shuffled) { /* every block taken by a sequence of its own, then given back in shuffled order */
        int64_t nb = kv_pool_plan(b->pool)->n_blocks;
        kv_seq **one = malloc((size_t)nb * sizeof *one);
        if (!one) die("out of memory");
        for (int64_t i = 0; i < nb; i++)
            if (!(one[i] = kv_seq_new(b->pool, err, sizeof err)) ||
                kv_append(b->pool, one[i], block_size, err, sizeof err))
                die(err);
        for (int64_t i = nb - 1; i > 0; i--) {
            int64_t j = (int64_t)(lm_rng_u64(&r) % (uint64_t)(i + 1));
            kv_seq *t = one[i];
            one[i] = one[j], one[j] = t;
        }
        for (int64_t i = 0; i < nb; i++) kv_seq_free(b->pool, one[i]);
        free(one);
    }
    b->seq = kv_seq_new(b->pool, err, sizeof err);
    if (!b->seq || kv_append(b->pool, b->seq, T, err, sizeof err)) die(err);
    kv_store_rows(b->pool, b->seq, 0, 0, T, b->k, (size_t)nkv * hd, b->v, (size_t)nkv * hd);
}

static void bench_free(bench *b) {
    kv_seq_free(b->pool, b->seq);
    kv_pool_free(b->pool);
    free(b->k), free(b->v), free(b->q), free(b->k16), free(b->v16);
}

/* ---- the plain versions ------------------------------------------------------- */

/* forward.c's loop for queries pos0 .. pos0+n-1 over a contiguous cache;
 * sc: pos0+n floats. */
static void plain_attn(const bench *b, bool f16, int pos0, int n, float *out, float *sc) {
    int hd = b->hd, G = b->nh / b->nkv;
    size_t kvd = (size_t)b->nkv * hd, qd = (size_t)b->nh * hd;
    float scale = 1.0f / sqrtf((float)hd);
    for (int t = 0; t < n; t++) {
        int len = pos0 + t + 1;
        for (int h = 0; h < b->nh; h++) {
            const float *q = b->q + (size_t)(pos0 + t) * qd + (size_t)h * hd;
            size_t off = (size_t)(h / G) * hd;
            for (int p = 0; p < len; p++) {
                float d = 0;
                if (f16) {
                    const uint16_t *k = b->k16 + (size_t)p * kvd + off;
                    for (int i = 0; i < hd; i++) d += q[i] * f16_table[k[i]];
                } else {
                    const float *k = b->k + (size_t)p * kvd + off;
                    for (int i = 0; i < hd; i++) d += q[i] * k[i];
                }
                sc[p] = d * scale;
            }
            float mx = use_sinks ? sink_logit : -INFINITY;
            for (int p = 0; p < len; p++) mx = sc[p] > mx ? sc[p] : mx;
            double sum = use_sinks ? expf(sink_logit - mx) : 0;
            for (int p = 0; p < len; p++) sum += sc[p] = expf(sc[p] - mx);
            float inv = (float)(1.0 / sum);
            float *o = out + (size_t)t * qd + (size_t)h * hd;
            memset(o, 0, (size_t)hd * sizeof(float));
            for (int p = 0; p < len; p++) {
                float w = sc[p] * inv;
                if (f16) {
                    const uint16_t *v = b->v16 + (size_t)p * kvd + off;
                    for (int i = 0; i < hd; i++) o[i] += w * f16_table[v[i]];
                } else {
                    const float *v = b->v + (size_t)p * kvd + off;
                    for (int i = 0; i < hd; i++) o[i] += w * v[i];
                }
            }
        }
    }
}

/* -t N: forward.c's plan. Items (query tile, KV head); with fewer items than
 * threads, a one-tile call's items each cut into units of consecutive key
 * splits, merged afterwards in split order. */
typedef struct {
    const bench *b;
    int pos0, n, n_items, units, first, n_split;
    size_t pf;
    float *out;
    atomic_int next;
} par_job;

static void par_worker(void *arg, int ith, int nth) {
    par_job *j = arg;
    const bench *b = j->b;
    size_t qd = (size_t)b->nh * b->hd;
    float scale = 1.0f / sqrtf((float)b->hd);
    const float *sk = use_sinks ? sinks : NULL;
    for (;;) {
        int unit = atomic_fetch_add(&j->next, 1);
        if (unit >= j->n_items * j->units) break;
        int item = unit / j->units, u = unit % j->units;
        int i0 = item / b->nkv * ATTN_TILE_Q, kh = item % b->nkv;
        int m = j->n - i0 < ATTN_TILE_Q ? j->n - i0 : ATTN_TILE_Q;
        const float *q = b->q + (size_t)(j->pos0 + i0) * qd;
        if (j->units == 1) {
            attn_tile_sinks(b->pool, b->seq, 0, kh, q, qd, m, j->pos0 + i0, scale, 0, 0, sk, j->out + (size_t)i0 * qd,
                            qd, tscr[ith]);
            continue;
        }
        int s0 = j->n_split * u / j->units, s1 = j->n_split * (u + 1) / j->units;
        attn_tile_part(b->pool, b->seq, 0, kh, q, qd, m, j->pos0, scale, 0, 0, j->first + s0, s1 - s0,
                       tpart + ((size_t)kh * j->n_split + (size_t)s0) * j->pf, tscr[ith]);
    }
}

static void par_attn(const bench *b, int pos0, int n, float *out) {
    int nth = pool_size(tpool), tiles = (n + ATTN_TILE_Q - 1) / ATTN_TILE_Q;
    par_job j = {.b = b, .pos0 = pos0, .n = n, .n_items = tiles * b->nkv, .units = 1, .out = out};
    atomic_init(&j.next, 0);
    if (tiles == 1 && j.n_items < nth) {
        j.n_split = attn_split_range(n, pos0, 0, &j.first);
        j.pf = attn_part_floats(b->pool, 0, n, tscr[0]);
        if (j.n_split > 1 && (size_t)b->nkv * (size_t)j.n_split * j.pf <= tpart_cap)
            j.units = j.n_split; /* forward.c's attn_plan: one unit per split */
    }
    pool_run(tpool, par_worker, &j);
    if (j.units == 1) return;
    size_t qd = (size_t)b->nh * b->hd;
    for (int kh = 0; kh < b->nkv; kh++)
        attn_tile_merge(b->pool, 0, kh, n, tpart + (size_t)kh * j.n_split * j.pf, j.n_split, use_sinks ? sinks : NULL,
                        out, qd, tscr[0]);
}

static void tiled_attn(const bench *b, int pos0, int n, float *out, attn_scratch *scr) {
    if (tpool) {
        par_attn(b, pos0, n, out);
        return;
    }
    size_t qd = (size_t)b->nh * b->hd;
    float scale = 1.0f / sqrtf((float)b->hd);
    for (int i0 = 0; i0 < n; i0 += ATTN_TILE_Q) {
        int m = n - i0 < ATTN_TILE_Q ? n - i0 : ATTN_TILE_Q;
        for (int kh = 0; kh < b->nkv; kh++)
            if (use_sinks)
                attn_tile_sinks(b->pool, b->seq, 0, kh, b->q + (size_t)(pos0 + i0) * qd, qd, m, pos0 + i0, scale, 0, 0,
                                sinks, out + (size_t)i0 * qd, qd, scr);
            else
                attn_tile(b->pool, b->seq, 0, kh, b->q + (size_t)(pos0 + i0) * qd, qd, m, pos0 + i0, scale, 0,
                          out + (size_t)i0 * qd, qd, scr);
    }
}

/* Full prefill materializing each head's (T, T) score matrix. */
static void plain_full_scores(const bench *b, float *out, float *S) {
    int T = b->T, hd = b->hd, G = b->nh / b->nkv;
    size_t kvd = (size_t)b->nkv * hd, qd = (size_t)b->nh * hd;
    float scale = 1.0f / sqrtf((float)hd);
    for (int h = 0; h < b->nh; h++) {
        size_t off = (size_t)(h / G) * hd;
        for (int i = 0; i < T; i++)
            for (int j = 0; j < T; j++) {
                float d = -INFINITY;
                if (j <= i) {
                    d = 0;
                    const float *q = b->q + (size_t)i * qd + (size_t)h * hd, *k = b->k + (size_t)j * kvd + off;
                    for (int e = 0; e < hd; e++) d += q[e] * k[e];
                    d *= scale;
                }
                S[(size_t)i * T + j] = d;
            }
        for (int i = 0; i < T; i++) {
            float *row = S + (size_t)i * T, mx = -INFINITY;
            for (int j = 0; j < T; j++) mx = row[j] > mx ? row[j] : mx;
            double sum = 0;
            for (int j = 0; j < T; j++) sum += row[j] = expf(row[j] - mx);
            float *o = out + (size_t)i * qd + (size_t)h * hd;
            memset(o, 0, (size_t)hd * sizeof(float));
            for (int j = 0; j < T; j++) {
                float w = (float)(row[j] / sum);
                const float *v = b->v + (size_t)j * kvd + off;
                for (int e = 0; e < hd; e++) o[e] += w * v[e];
            }
        }
    }
}

/* ---- timing ------------------------------------------------------------------- */

typedef struct {
    const bench *b;
    bool plain, f16;
    int pos0, n;
    float *out, *sc;
    attn_scratch *scr;
} job;

static void run_job(const job *j) {
    if (j->plain) plain_attn(j->b, j->f16, j->pos0, j->n, j->out, j->sc);
    else tiled_attn(j->b, j->pos0, j->n, j->out, j->scr);
}

/* Best time of at least 3 runs and at least min_s seconds in all. */
static double time_best(const job *j, double min_s) {
    double best = 1e30, t_all = lm_now();
    static float *cold;
    if (cold_bytes && !cold && !(cold = calloc(cold_bytes / sizeof *cold, sizeof *cold))) die("out of memory");
    for (int rep = 0; rep < 3 || lm_now() - t_all < min_s; rep++) {
        float acc = 0; /* push the KV cache out of the caches: the run reads it from memory */
        for (size_t i = 0; i < cold_bytes / sizeof *cold; i += 16) acc += cold[i];
        cold_sink = acc;
        double t0 = lm_now();
        run_job(j);
        double dt = lm_now() - t0;
        best = dt < best ? dt : best;
        if (rep > 1000) break;
    }
    return best;
}

static double max_rel_diff(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    return num / den;
}

static void speed(int nh, int nkv, int hd, int T, uint32_t type, int nq, bool scalar, int nth) {
    bench b;
    bench_make(&b, nh, nkv, hd, T, type);
    char err[LM_ERRLEN];
    attn_scratch *scr = attn_scratch_new(b.pool, nh, err, sizeof err);
    if (!scr) die(err);
    if (nth > 1) {
        tpool = pool_new(nth);
        tscr = calloc((size_t)nth, sizeof *tscr);
        /* every KV head's splits of a one-row call at this context */
        tpart_cap = (size_t)nkv * ((size_t)T / ATTN_SPLIT + 1) * attn_part_floats(b.pool, 0, ATTN_TILE_Q, scr);
        tpart = malloc(tpart_cap * sizeof(float));
        if (!tpool || !tscr || !tpart) die("out of memory");
        for (int i = 0; i < nth; i++)
            if (!(tscr[i] = attn_scratch_new(b.pool, nh, err, sizeof err))) die(err);
    }
    size_t qd = (size_t)nh * hd;
    float *o1 = malloc((size_t)nq * qd * 4), *o2 = malloc((size_t)nq * qd * 4), *sc = malloc((size_t)T * 4);
    bool f16 = type == LM_TYPE_F16, plain_ok = type != LM_TYPE_Q8_0 && !no_plain;
    job dt = {&b, false, f16, T - 1, 1, o1, sc, scr}, dp = {&b, true, f16, T - 1, 1, o2, sc, scr};
    double td = time_best(&dt, 0.3), tp = plain_ok ? time_best(&dp, 0.3) : 1;
    if (!plain_ok) plain_attn(&b, f16, T - 1, 1, o2, sc); /* the reference, untimed */
    double ed = max_rel_diff(o1, o2, qd);
    job pt = {&b, false, f16, T - nq, nq, o1, sc, scr}, pp = {&b, true, f16, T - nq, nq, o2, sc, scr};
    double tpt = time_best(&pt, 0.3), tpp = plain_ok ? time_best(&pp, 0.3) : 1;
    if (!plain_ok) plain_attn(&b, f16, T - nq, nq, o2, sc);
    double ep = max_rel_diff(o1, o2, (size_t)nq * qd);
    double kv_mb = (double)T * nkv * 2 * (double)quant_row_size(type, hd) / 1e6;
    if (plain_ok)
        printf("| %5d | %-4s | %9.1f | %9.1f | %5.2fx | %9.2f | %9.2f | %5.2fx | %7.1f | %.1e |\n", T,
               quant_type_name(type), td * 1e6, tp * 1e6, tp / td, tpt * 1e3, tpp * 1e3, tpp / tpt, kv_mb / 1e3 / td,
               fmax(ed, ep));
    else
        printf("| %5d | %-4s | %9.1f | - | - | %9.2f | - | - | %7.1f | %.1e |\n", T, quant_type_name(type), td * 1e6,
               tpt * 1e3, kv_mb / 1e3 / td, fmax(ed, ep));
    fflush(stdout);
    free(o1), free(o2), free(sc);
    attn_scratch_free(scr);
    if (tpool) {
        for (int i = 0; i < nth; i++) attn_scratch_free(tscr[i]);
        free(tscr), free(tpart);
        pool_free(tpool);
        tpool = NULL, tscr = NULL, tpart = NULL;
    }
    bench_free(&b);
}

/* ---- memory ----------------------------------------------------------------------- */

static long child_peak_kb(int mode, int nh, int nkv, int hd, int T, double *secs) {
    fflush(stdout); /* or the child prints the parent's buffer again */
    pid_t pid = fork();
    if (pid < 0) die("fork failed");
    if (pid == 0) {
        bench b;
        bench_make(&b, nh, nkv, hd, T, LM_TYPE_F32);
        size_t qd = (size_t)nh * hd;
        float *out = malloc((size_t)T * qd * 4);
        if (!out) die("out of memory");
        /* resident in every mode: a nonzero fill, since the compiler may turn
         * malloc + memset(0) into calloc, which leaves fresh pages untouched */
        for (size_t i = 0; i < (size_t)T * qd; i++) out[i] = 1.0f;
        double t0 = lm_now();
        if (mode == 1) {
            char err[LM_ERRLEN];
            attn_scratch *scr = attn_scratch_new(b.pool, nh, err, sizeof err);
            tiled_attn(&b, 0, T, out, scr);
            attn_scratch_free(scr);
        } else if (mode == 2) {
            float *S = malloc((size_t)T * T * 4);
            if (!S) die("out of memory for the score matrix");
            plain_full_scores(&b, out, S);
            free(S);
        }
        double sum = 0;
        for (size_t i = 0; mode && i < (size_t)T * qd; i++) sum += out[i];
        printf("  (mode %d: %.2f s, output sum %.6f)\n", mode, lm_now() - t0, sum);
        fflush(stdout);
        _exit(0);
    }
    int status;
    struct rusage ru;
    double t0 = lm_now();
    if (wait4(pid, &status, 0, &ru) < 0 || !WIFEXITED(status) || WEXITSTATUS(status)) die("child failed");
    *secs = lm_now() - t0;
    return ru.ru_maxrss;
}

static void memory(int nh, int nkv, int hd, int T) {
    printf("\nFull prefill of %d tokens, %d heads / %d KV heads, head dim %d, F32 KV, one thread: peak RSS\n", T, nh,
           nkv, hd);
    double s0, s1, s2;
    long base = child_peak_kb(0, nh, nkv, hd, T, &s0);
    long tiled = child_peak_kb(1, nh, nkv, hd, T, &s1);
    long plain = child_peak_kb(2, nh, nkv, hd, T, &s2);
    printf("| version | peak RSS | over data-only | wall |\n|---|---|---|---|\n");
    printf("| data only (K/V, queries, output) | %.1f MiB | - | %.2f s |\n", base / 1024.0, s0);
    printf("| tiled attn_tile | %.1f MiB | %+.1f MiB | %.2f s |\n", tiled / 1024.0, (tiled - base) / 1024.0, s1);
    printf("| plain, T x T scores | %.1f MiB | %+.1f MiB | %.2f s |\n", plain / 1024.0, (plain - base) / 1024.0, s2);
}

/* ---- --entries ------------------------------------------------------------------ */

enum { ENT_KEYS = 64, ENT_CHUNKS = 16 };

typedef struct {
    const lm_attn_kernels *k;
    uint32_t type;
    int R, hd;
    const void *qq;            /* the query rows as the scores entry takes them: floats, or Q8_0 */
    const void **krow, **vrow; /* (ENT_CHUNKS, ENT_KEYS) */
    float *S, *O;              /* (R, ENT_KEYS), (R, hd) */
} ent;

static void ent_scores(const ent *e, int c) {
    const void *const *kr = e->krow + (size_t)c * ENT_KEYS;
    if (e->type == LM_TYPE_Q8_0) e->k->scores_q8_0_q8(e->qq, e->R, e->hd, kr, ENT_KEYS, e->S, ENT_KEYS, NULL, 0);
    else if (e->type == LM_TYPE_F16) e->k->scores_f16(e->qq, e->R, e->hd, kr, ENT_KEYS, e->S, ENT_KEYS, NULL, 0);
    else e->k->scores(e->qq, e->R, e->hd, (const float *const *)kr, ENT_KEYS, e->S, ENT_KEYS);
}

static void ent_pv(const ent *e, int c) {
    const void *const *vr = e->vrow + (size_t)c * ENT_KEYS;
    if (e->type == LM_TYPE_Q8_0) e->k->pv_q8_0(e->O, e->R, e->hd, e->S, ENT_KEYS, vr, ENT_KEYS, NULL, 0);
    else if (e->type == LM_TYPE_F16) e->k->pv_f16(e->O, e->R, e->hd, e->S, ENT_KEYS, vr, ENT_KEYS, NULL, 0);
    else e->k->pv(e->O, e->R, e->hd, e->S, ENT_KEYS, (const float *const *)vr, ENT_KEYS);
}

/* ns per key of one entry: the best of three runs of at least 0.2 s. */
static double ent_time(const ent *e, bool pv) {
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        long n = 0;
        double t0 = lm_now(), dt;
        do {
            for (int c = 0; c < ENT_CHUNKS; c++) pv ? ent_pv(e, c) : ent_scores(e, c);
            n += ENT_CHUNKS;
        } while ((dt = lm_now() - t0) < 0.2);
        best = fmin(best, dt / ((double)n * ENT_KEYS) * 1e9);
    }
    return best;
}

static void entries(int nh, int nkv, int hd, uint32_t type) {
    const lm_attn_kernels *k = kernels_attn(hd);
    const lm_type_traits *tt = quant_traits(type);
    if ((type == LM_TYPE_F16 && (!k->scores_f16 || !k->pv_f16)) ||
        (type == LM_TYPE_Q8_0 && (!k->scores_q8_0_q8 || !k->pv_q8_0 || hd % QK8_0))) {
        printf("| %s | %d | - | - | (no fused entry in this table) |\n", tt->name, nh / nkv);
        return;
    }
    int R = nh / nkv, n = ENT_CHUNKS * ENT_KEYS;
    size_t rb = type == LM_TYPE_F32 ? (size_t)hd * 4 : type == LM_TYPE_F16 ? (size_t)hd * 2 : quant_row_size(type, hd);
    lm_rng g;
    lm_rng_seed(&g, 7);
    float *x = malloc((size_t)(R > 1 ? R : 1) * hd * sizeof(float));
    uint8_t *kv = malloc((size_t)2 * n * rb), *qq = malloc((size_t)R * (type == LM_TYPE_Q8_0 ? rb : (size_t)hd * 4));
    const void **krow = malloc((size_t)n * sizeof *krow), **vrow = malloc((size_t)n * sizeof *vrow);
    float *S = malloc((size_t)R * ENT_KEYS * sizeof(float)), *O = calloc((size_t)R * hd, sizeof(float));
    if (!x || !kv || !qq || !krow || !vrow || !S || !O) die("out of memory");
    for (int t = 0; t < 2 * n; t++) { /* K rows then V rows, the type's encoding of N(0, 1) */
        for (int d = 0; d < hd; d++) x[d] = lm_rng_normal(&g);
        uint8_t *row = kv + (size_t)t * rb;
        if (type == LM_TYPE_F32) memcpy(row, x, (size_t)hd * 4);
        else tt->from_float(x, row, hd);
        (t < n ? krow : vrow)[t % n] = row;
    }
    for (int i = 0; i < R * hd; i++) x[i] = lm_rng_normal(&g);
    if (type == LM_TYPE_Q8_0)
        for (int r = 0; r < R; r++) tt->from_float(x + (size_t)r * hd, qq + (size_t)r * rb, hd);
    else memcpy(qq, x, (size_t)R * hd * sizeof(float));
    for (int i = 0; i < R * ENT_KEYS; i++) S[i] = (float)lm_rng_uniform(&g) / ENT_KEYS;
    ent e = {k, type, R, hd, qq, krow, vrow, S, O};
    double ts = ent_time(&e, false), tp = ent_time(&e, true);
    printf("| %s | %d | %.1f | %.1f | %.1f |\n", tt->name, R, ts, tp, ts + tp);
    free(x), free(kv), free(qq), free(krow), free(vrow), free(S), free(O);
}

int main(int argc, char **argv) {
    int nh = 32, nkv = 8, hd = 128, nq = 64, mem_ctx = 4096, nth = 1;
    uint32_t types[4] = {LM_TYPE_F32, LM_TYPE_F16};
    int n_types = 2;
    int ctxs[16] = {1024, 4096, 8192}, n_ctx = 3;
    bool scalar = false, ents = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--scalar")) scalar = true;
        else if (!strcmp(a, "--entries")) ents = true;
        else if (!strcmp(a, "--no-plain")) no_plain = true;
        else if (!strcmp(a, "--shuffle")) shuffled = true;
        else if (!v) die("flag needs a value");
        else if (!strcmp(a, "-H")) nh = atoi(v), i++;
        else if (!strcmp(a, "-K")) nkv = atoi(v), i++;
        else if (!strcmp(a, "-D")) hd = atoi(v), i++;
        else if (!strcmp(a, "-q")) nq = atoi(v), i++;
        else if (!strcmp(a, "-t")) nth = atoi(v), i++;
        else if (!strcmp(a, "--kv")) {
            n_types = 0;
            for (char *s = argv[++i], *tok; (tok = strtok(s, ",")) && n_types < 4; s = NULL) {
                if (!strcmp(tok, "F32")) types[n_types++] = LM_TYPE_F32;
                else if (!strcmp(tok, "F16")) types[n_types++] = LM_TYPE_F16;
                else if (!strcmp(tok, "Q8_0")) types[n_types++] = LM_TYPE_Q8_0;
                else die("--kv takes F32, F16, Q8_0");
            }
        } else if (!strcmp(a, "-b")) block_size = atoi(v), i++;
        else if (!strcmp(a, "--layers")) n_layers = atoi(v), i++;
        else if (!strcmp(a, "--cold")) cold_bytes = (size_t)atol(v) << 20, i++;
        else if (!strcmp(a, "--mem-ctx")) mem_ctx = atoi(v), i++;
        else if (!strcmp(a, "--sinks")) use_sinks = true, sink_logit = strtof(v, NULL), i++;
        else if (!strcmp(a, "-c")) {
            n_ctx = 0;
            for (char *s = argv[++i]; *s && n_ctx < 16;) {
                ctxs[n_ctx++] = (int)strtol(s, &s, 10);
                if (*s == ',') s++;
            }
        } else die("unknown flag (see the comment at the top of bench/bench_attn.c)");
    }
    if (nh <= 0 || nkv <= 0 || nh % nkv || hd <= 0 || nq <= 0 || nh > 1024) die("bad shape");
    if (n_layers < 1 || n_layers > 256) die("--layers takes 1 to 256");
    if (nth < 1 || nth > 256) die("-t takes 1 to 256 threads");
    if (use_sinks && (isnan(sink_logit) || sink_logit == INFINITY)) die("--sinks needs a finite logit");
    for (int h = 0; h < nh; h++) sinks[h] = sink_logit;
    kernels_init();
    if (scalar) kernels_use(LM_ISA_SCALAR); /* the whole table: attention loops and KV conversion */
    for (int i = 0; i < 65536; i++) f16_table[i] = lm_f16_to_f32((uint16_t)i);

    /* memory first, while this process is still small (children inherit it) */
    if (mem_ctx > 0) memory(4, 1, 64, mem_ctx);

    printf("\n%d heads / %d KV heads, head dim %d, block %d, %d thread%s (plain: one), %s kernels; prefill = last %d "
           "queries",
           nh, nkv, hd, block_size, nth, nth > 1 ? "s" : "", kernels_isa_name(), nq);
    if (use_sinks) printf("; sinks %g", (double)sink_logit);
    if (n_layers > 1) printf("; %d layers per block", n_layers);
    if (cold_bytes) printf("; %zu MiB read before each run", cold_bytes >> 20);
    printf("\n");
    printf("| ctx | KV | decode tiled µs | decode plain µs | speedup | prefill tiled ms | prefill plain ms | speedup "
           "| decode GB/s | max rel diff |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (int c = 0; c < n_ctx; c++) {
        if (ctxs[c] == 0) continue; /* -c 0: memory part only */
        if (ctxs[c] < nq) die("context shorter than the prefill chunk");
        for (int ti = 0; ti < n_types; ti++) speed(nh, nkv, hd, ctxs[c], types[ti], nq, scalar, nth);
    }
    if (ents) {
        printf("\nthe %s entries alone, one KV head's decode rows, 64-key chunks in L2, one thread\n",
               kernels_isa_name());
        printf("| KV | rows | scores ns/key | P·V ns/key | both |\n|---|---|---|---|---|\n");
        for (int ti = 0; ti < n_types; ti++) entries(nh, nkv, hd, types[ti]);
    }
    return 0;
}
