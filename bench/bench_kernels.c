/*
 * bench_kernels.c - the matrix-product kernels side by side: the scalar
 * reference (quant.c), the AVX2 vec_dot called per output, the AVX2 gemm
 * tiles, and for Q8_0/Q4_0/Q4_K the interleaved ("packed") tiles of groups
 * of 8 rows by up to 8 tokens (F16: panels of 16 rows by up to 6 tokens, F32
 * activations). Every variant is first checked (vec_dot and packed against
 * the reference within 1e-5 of sum |w_i x_i| on sampled rows, F16 panels
 * against the float64 dot with their float activations; gemm outputs
 * bit-identical to vec_dot), then timed.
 *
 * Shapes:
 *   decode   1 activation row against 2048x2048 and 5632x2048 weights. The
 *            weights are replicated until they fill 192 MiB and the copies
 *            are visited in turn, so each product streams its weights from
 *            DRAM as a real decode step does (the L3 would otherwise hold
 *            them). GB/s counts weight bytes.
 *   prefill  64 and 512 activation rows against 2048x2048 weights, in
 *            panels of 64 activation rows (which stay in L2) and tiles of
 *            4 weight rows x 4 activation rows. The reference runs only
 *            the 64-row case (it is slow).
 * GFLOP/s counts 2 * rows * cols * activation rows. Activation quantization
 * (from_float) is timed separately.
 *
 * With -v avx512 or avx512vnni the decode shapes also time the 512-bit pair
 * tiles (kernels/x86_pair.h: two groups of 8 rows per call), "pair". Each
 * decode shape ends with the memory roof of the same bytes: "read 1
 * stream" sums the weight rows as uint64 in order, "read 8 streams" in 8
 * parts read side by side (lamina bench's read probe), so a kernel's GB/s
 * can be set against what reading alone reaches in the same run.
 *
 * Threads split the weight rows (decode) or the row tiles (prefill); the
 * default is one thread and every type.
 *
 * Single-threaded times are on the thread's CPU clock, several threads on
 * the wall clock; each figure is the best of 8 rounds (the machine may be
 * shared). Usage: bench_kernels [-t THREADS] [-s SECONDS] [-v VARIANT] [TYPE...]
 * (-v: avx2, the default, or one of kernels/x86.h: avxvnni, avx512, avx512vnni,
 * avx512bf16; the last checks BF16 within its own bound, kernels/avx512bf16_dot.c).
 *
 * Build: `make bench` (build/bench_kernels).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/avx2.h"
#include "kernels/x86.h"
#include "kernels/x86_pair.h"
#include "format/quant.h"
#include "base/util.h"

#define COPY_BYTES (192u << 20)
#define PANEL 64

/* The kernels measured (-v). */
static const lm_avx2_kernels *(*lookup)(uint32_t) = avx2_kernels;
static lm_packed_gemm_fn (*pair_lookup)(uint32_t) = NULL; /* the 512-bit pair tiles (avx512, avx512vnni) */
static const char *kernels_label = "avx2";

static lm_rng rng;
static double min_seconds = 0.5;
static int n_threads = 1;

/* ---- data ------------------------------------------------------------------ */

/* Random weight bytes with finite, moderate f16 scales (timing does not
 * depend on the values; the check only needs them finite). */
static void fill_weights(uint32_t type, uint8_t *p, int64_t rows, int64_t cols) {
    const lm_type_traits *t = quant_traits(type);
    size_t row_bytes = quant_row_size(type, cols);
    if (!t->is_quantized) {
        float *f = lm_malloc((size_t)cols * sizeof(float));
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t i = 0; i < cols; i++) f[i] = lm_rng_normal(&rng) * 0.05f;
            quant_from_float_ref(type, f, p + (size_t)r * row_bytes, cols);
        }
        lm_free(f);
        return;
    }
    size_t bytes = row_bytes * (size_t)rows;
    for (size_t i = 0; i < bytes; i += 8) {
        uint64_t v = lm_rng_u64(&rng);
        memcpy(p + i, &v, bytes - i < 8 ? bytes - i : 8);
    }
    size_t nblk = bytes / t->type_size;
    size_t d_off = type == LM_TYPE_Q6_K ? offsetof(block_q6_K, d) : 0;
    for (size_t b = 0; b < nblk; b++) {
        uint8_t *blk = p + b * t->type_size;
        uint16_t d = lm_f32_to_f16((float)(lm_rng_uniform(&rng) * 0.01 + 1e-4));
        if (type == LM_TYPE_MXFP4) { /* an exponent byte, not an f16: scales 2^-8 .. 2^-1 */
            blk[0] = (uint8_t)(120 + lm_rng_u64(&rng) % 8);
            continue;
        }
        memcpy(blk + d_off, &d, 2);
        if (type == LM_TYPE_Q4_K || type == LM_TYPE_Q5_K) memcpy(blk + 2, &d, 2);
    }
}

typedef struct {
    uint32_t type, act;
    int64_t rows, cols;
    size_t row_bytes, act_bytes;
    int copies;
    uint8_t *w;  /* copies x rows x row_bytes */
    uint8_t *x;  /* n_act x act_bytes */
    uint8_t *wp; /* copies x interleaved copy (quant.h), or NULL */
    uint8_t *xp; /* n_act x packed_bytes (block_q8_0s rows; F16 panels: floats) */
    size_t pack_bytes, packed_bytes;
    int n_act;
    const lm_avx2_kernels *k;
} setup;

static void setup_make(setup *s, uint32_t type, int64_t rows, int64_t cols, int n_act, bool stream) {
    memset(s, 0, sizeof *s);
    s->type = type;
    s->act = quant_traits(type)->vec_dot_type;
    s->rows = rows;
    s->cols = cols;
    s->row_bytes = quant_row_size(type, cols);
    s->act_bytes = quant_row_size(s->act, cols);
    size_t mat = s->row_bytes * (size_t)rows;
    s->copies = stream ? (int)((COPY_BYTES + mat - 1) / mat) : 1;
    s->w = lm_malloc(mat * (size_t)s->copies);
    fill_weights(type, s->w, rows, cols);
    for (int c = 1; c < s->copies; c++) memcpy(s->w + mat * (size_t)c, s->w, mat);
    s->n_act = n_act;
    s->x = lm_malloc(s->act_bytes * (size_t)n_act);
    s->k = lookup(type);
    s->pack_bytes = quant_pack_size(type, rows, cols);
    bool float_act = s->k && s->k->packed_gemm && !s->k->packed_act;
    s->packed_bytes = quant_packed_x_row_size(type, cols);
    if (s->pack_bytes && s->k && s->k->packed_gemm) {
        s->wp = lm_malloc(s->pack_bytes * (size_t)s->copies);
        quant_pack(type, s->w, s->row_bytes, rows, cols, s->wp);
        for (int c = 1; c < s->copies; c++) memcpy(s->wp + s->pack_bytes * (size_t)c, s->wp, s->pack_bytes);
        s->xp = lm_malloc(s->packed_bytes * (size_t)n_act);
    }
    float *f = lm_malloc((size_t)cols * sizeof(float));
    for (int a = 0; a < n_act; a++) {
        for (int64_t i = 0; i < cols; i++) f[i] = lm_rng_normal(&rng);
        quant_from_float_ref(s->act, f, s->x + (size_t)a * s->act_bytes, cols);
        if (s->xp && float_act) memcpy(s->xp + (size_t)a * s->packed_bytes, f, (size_t)cols * sizeof(float));
        else if (s->xp && type == LM_TYPE_Q4_K)
            quant_from_float_ref(LM_TYPE_Q8_K, f, s->xp + (size_t)a * s->packed_bytes, cols);
        else if (s->xp) quant_packed_act_ref(f, s->xp + (size_t)a * s->packed_bytes, cols);
    }
    lm_free(f);
}

static void setup_free(setup *s) {
    lm_free(s->w);
    lm_free(s->x);
    lm_free(s->wp);
    lm_free(s->xp);
}

/* ---- the variants ------------------------------------------------------------ */

enum { V_REF, V_VEC_DOT, V_GEMM, V_PACKED, V_PAIR, V_READ1, V_READ8 };
static const char *variant_name[] = {"reference", "vec_dot",       "gemm",          "packed",
                                     "pair",      "read 1 stream", "read 8 streams"};

/* The memory roof of a thread's rows: their weight bytes summed as uint64
 * (no kernel work), in one sequential stream or split into 8 streams read
 * side by side (as `lamina bench`'s read probe does). */
static volatile uint64_t read_sink;
static void read_rows(const uint8_t *p, size_t bytes, int streams) {
    const uint64_t *q = (const uint64_t *)(const void *)p;
    size_t len = bytes / 8 / (size_t)streams / 8 * 8; /* uint64s per stream, whole groups of 8 */
    uint64_t acc[8] = {0};
    for (size_t i = 0; i < len; i += 8)
        for (int st = 0; st < streams; st++)
            for (int k = 0; k < 8; k++) acc[k] += q[(size_t)st * len + i + (size_t)k];
    read_sink += acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
}

/* y (n_act, rows) for weight copy `copy`, weight rows [r0, r1) (r0, r1
 * multiples of 4 except r1 = rows). Prefill walks panels of activation
 * rows so a panel stays in cache while the weight tiles pass over it. */
static void run_range(const setup *s, int variant, int copy, int64_t r0, int64_t r1, float *y) {
    const uint8_t *w = s->w + s->row_bytes * (size_t)s->rows * (size_t)copy;
    const int64_t n = s->cols;
    if (variant == V_READ1 || variant == V_READ8) {
        read_rows(w + (size_t)r0 * s->row_bytes, (size_t)(r1 - r0) * s->row_bytes, variant == V_READ1 ? 1 : 8);
        return;
    }
    if (variant == V_PACKED ||
        (variant == V_PAIR && s->wp)) { /* groups of 8 (F16: 16) rows x tiles of pack_tile tokens */
        const uint8_t *wp = s->wp + s->pack_bytes * (size_t)copy;
        const int gr = quant_pack_rows(s->type), tile = s->k->pack_tile;
        const size_t gb = quant_pack_size(s->type, gr, n);
        lm_packed_gemm_fn pair = variant == V_PAIR && s->n_act <= LM_PAIR_TILE ? pair_lookup(s->type) : NULL;
        for (int p0 = 0; p0 < s->n_act; p0 += PANEL) {
            int p1 = p0 + PANEL < s->n_act ? p0 + PANEL : s->n_act;
            for (int64_t r = r0; r < r1;) {
                const bool two = pair && r1 - r > gr; /* two groups per call (kernels/x86_pair.h) */
                const int span = two ? 2 * gr : gr;
                int nr = r1 - r < span ? (int)(r1 - r) : span;
                for (int c = p0; c < p1; c += tile) {
                    int nc = p1 - c < tile ? p1 - c : tile;
                    (two ? pair : s->k->packed_gemm)(n, wp + (size_t)(r / gr) * gb, nr,
                                                     s->xp + (size_t)c * s->packed_bytes, s->packed_bytes, nc,
                                                     y + (size_t)c * (size_t)s->rows + (size_t)r, (size_t)s->rows);
                }
                r += span;
            }
        }
        return;
    }
    /* activation rows per tile: what the gemm kernel is fastest with */
    const int tc = s->k && s->k->gemm_cols ? s->k->gemm_cols : LM_GEMM_TILE;
    for (int p0 = 0; p0 < s->n_act; p0 += PANEL) {
        int p1 = p0 + PANEL < s->n_act ? p0 + PANEL : s->n_act;
        for (int64_t r = r0; r < r1; r += 4) {
            int nr = r1 - r < 4 ? (int)(r1 - r) : 4;
            const uint8_t *wr = w + (size_t)r * s->row_bytes;
            for (int c = p0; c < p1; c += tc) {
                int nc = p1 - c < tc ? p1 - c : tc;
                const uint8_t *xc = s->x + (size_t)c * s->act_bytes;
                float *yt = y + (size_t)c * (size_t)s->rows + (size_t)r;
                if (variant == V_GEMM) {
                    s->k->gemm(n, wr, s->row_bytes, nr, xc, s->act_bytes, nc, yt, (size_t)s->rows);
                    continue;
                }
                for (int cc = 0; cc < nc; cc++)
                    for (int rr = 0; rr < nr; rr++) {
                        const uint8_t *wp = wr + (size_t)rr * s->row_bytes;
                        const uint8_t *xp = xc + (size_t)cc * s->act_bytes;
                        yt[(size_t)cc * (size_t)s->rows + (size_t)rr] =
                            variant == V_REF ? quant_vec_dot_ref(s->type, n, wp, xp) : s->k->vec_dot(n, wp, xp);
                    }
            }
        }
    }
}

typedef struct {
    const setup *s;
    int variant, iters, ith, nth;
    float *y;
} job;

static void *worker(void *arg) {
    job *j = arg;
    int64_t tiles = (j->s->rows + 15) / 16;
    int64_t t0 = tiles * j->ith / j->nth, t1 = tiles * (j->ith + 1) / j->nth;
    int64_t r0 = 16 * t0, r1 = 16 * t1 < j->s->rows ? 16 * t1 : j->s->rows;
    for (int it = 0; it < j->iters; it++) run_range(j->s, j->variant, it % j->s->copies, r0, r1, j->y);
    return NULL;
}

/* Seconds on this thread's CPU clock (single-threaded runs: time the
 * machine spends on other processes does not count) or on the wall clock
 * (several threads). */
static double clock_now(void) {
    if (n_threads > 1) return lm_now();
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Runs `iters` products over n_threads threads; returns the seconds. */
static double run_timed(const setup *s, int variant, int iters, float *y) {
    pthread_t th[16];
    job jobs[16];
    double t0 = clock_now();
    for (int i = 0; i < n_threads; i++) {
        jobs[i] = (job){s, variant, iters, i, n_threads, y};
        if (n_threads == 1) worker(&jobs[i]);
        else pthread_create(&th[i], NULL, worker, &jobs[i]);
    }
    if (n_threads > 1)
        for (int i = 0; i < n_threads; i++) pthread_join(th[i], NULL);
    return clock_now() - t0;
}

/* ---- checking ----------------------------------------------------------------- */

/* vec_dot against the reference on sampled outputs (tolerance 1e-5 of
 * sum |w x|), gemm against vec_dot on all outputs (bit-identical). */
static bool check(const setup *s) {
    size_t ny = (size_t)s->n_act * (size_t)s->rows;
    float *yv = lm_malloc(ny * sizeof(float)), *yg = lm_malloc(ny * sizeof(float));
    run_range(s, V_VEC_DOT, 0, 0, s->rows, yv);
    run_range(s, V_GEMM, 0, 0, s->rows, yg);
    bool ok = memcmp(yv, yg, ny * sizeof(float)) == 0;
    if (!ok) printf("  CHECK FAILED: gemm output differs from vec_dot\n");
    float *yp = s->wp ? lm_malloc(ny * sizeof(float)) : NULL;
    if (yp) run_range(s, V_PACKED, 0, 0, s->rows, yp);
    float *a = lm_malloc((size_t)s->cols * sizeof(float)), *b = lm_malloc((size_t)s->cols * sizeof(float));
    for (int64_t r = 0; r < s->rows && ok; r += 97) {
        int c = (int)(r % s->n_act);
        const uint8_t *wp = s->w + (size_t)r * s->row_bytes, *xp = s->x + (size_t)c * s->act_bytes;
        quant_to_float_ref(s->type, wp, a, s->cols);
        quant_to_float_ref(s->act, xp, b, s->cols);
        double abs_sum = 0;
        for (int64_t i = 0; i < s->cols; i++) abs_sum += fabs((double)a[i] * b[i]);
        float ref = quant_vec_dot_ref(s->type, s->cols, wp, xp);
        float got = yv[(size_t)c * (size_t)s->rows + (size_t)r];
        /* avx512bf16 rounds BF16 weights' activations to BF16: its bound */
        const double tol = s->type == LM_TYPE_BF16 && lookup == avx512bf16_kernels
            ? ldexp(1.0, -8) + (double)(s->cols / 16 + 8) * ldexp(1.0, -24) + 1e-5
            : 1e-5;
        if (fabs((double)got - ref) > tol * abs_sum + 1e-30) {
            printf("  CHECK FAILED: row %lld col %d: avx2 %.9g reference %.9g\n", (long long)r, c, got, ref);
            ok = false;
        }
        float gp = yp ? yp[(size_t)c * (size_t)s->rows + (size_t)r] : ref;
        if (yp && !s->k->packed_act) { /* F16 panels take the floats: their float64 dot */
            const float *xf = (const float *)(const void *)(s->xp + (size_t)c * s->packed_bytes);
            double d = 0;
            abs_sum = 0;
            for (int64_t i = 0; i < s->cols; i++) {
                d += (double)a[i] * xf[i];
                abs_sum += fabs((double)a[i] * xf[i]);
            }
            ref = (float)d;
        }
        if (fabs((double)gp - ref) > 1e-5 * abs_sum + 1e-30) {
            printf("  CHECK FAILED: row %lld col %d: packed %.9g reference %.9g\n", (long long)r, c, gp, ref);
            ok = false;
        }
    }
    lm_free(yp);
    lm_free(a);
    lm_free(b);
    lm_free(yv);
    lm_free(yg);
    return ok;
}

/* ---- reporting ------------------------------------------------------------------ */

/* Best of several rounds of about 1/8 of the time budget each: the
 * machine may be shared, and the fastest round is the one least disturbed. */
static void measure(const setup *s, int variant, const char *shape) {
    size_t ny = (size_t)s->n_act * (size_t)s->rows;
    float *y = lm_malloc(ny * sizeof(float));
    double t = run_timed(s, variant, 1, y); /* warm-up and calibration */
    int iters = (int)(min_seconds / 8 / (t > 1e-6 ? t : 1e-6)) + 1;
    if (iters > 100000) iters = 100000;
    double best = t;
    for (int round = 0; round < 8; round++) {
        double tr = run_timed(s, variant, iters, y) / iters;
        if (tr < best) best = tr;
    }
    t = best;
    double wbytes = (double)s->row_bytes * (double)s->rows;
    double flops = 2.0 * (double)s->rows * (double)s->cols * s->n_act;
    char label[40];
    snprintf(label, sizeof label, "%s%s%s", variant ? kernels_label : "", variant ? " " : "", variant_name[variant]);
    printf("%-5s %-22s %-18s %10.3f ms %8.2f GB/s %8.2f GFLOP/s\n", quant_type_name(s->type), shape, label, t * 1e3,
           wbytes / t / 1e9, flops / t / 1e9);
    fflush(stdout);
    lm_free(y);
}

static void bench_from_float(uint32_t act) {
    const lm_avx2_kernels *k = lookup(act);
    if (!k || !k->from_float) return;
    const int64_t n = 2048 * 64;
    float *x = lm_malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = lm_rng_normal(&rng);
    size_t bytes = quant_row_size(act, n);
    uint8_t *a = lm_malloc(bytes), *b = lm_malloc(bytes);
    quant_from_float_ref(act, x, a, n);
    k->from_float(x, b, n);
    printf("%-5s from_float %s\n", quant_type_name(act),
           memcmp(a, b, bytes) ? "CHECK FAILED: differs" : "bit-identical");
    for (int v = 0; v < 2; v++) {
        int iters = 0;
        double t0 = lm_now(), t;
        do {
            if (v == 0) quant_from_float_ref(act, x, a, n);
            else k->from_float(x, b, n);
            iters++;
        } while ((t = lm_now() - t0) < min_seconds / 2);
        printf("%-5s %-22s %-13s %10.3f ms %8.2f GB/s (floats in)\n", quant_type_name(act), "from_float 131072",
               v ? kernels_label : "reference", t / iters * 1e3, (double)n * 4 / (t / iters) / 1e9);
    }
    lm_free(x);
    lm_free(a);
    lm_free(b);
}

static void bench_type(uint32_t type) {
    static const struct { int64_t rows, cols; } dec[] = {{2048, 2048}, {5632, 2048}};
    char shape[64];
    for (size_t i = 0; i < sizeof dec / sizeof dec[0]; i++) {
        setup s;
        setup_make(&s, type, dec[i].rows, dec[i].cols, 1, true);
        snprintf(shape, sizeof shape, "decode %lldx%lld", (long long)s.rows, (long long)s.cols);
        if (check(&s))
            for (int v = V_REF; v <= V_READ8; v++)
                if ((v != V_PACKED || s.wp) && (v != V_PAIR || (s.wp && pair_lookup && pair_lookup(type))))
                    measure(&s, v, shape);
        setup_free(&s);
    }
    static const int pre[] = {64, 512};
    for (size_t i = 0; i < sizeof pre / sizeof pre[0]; i++) {
        setup s;
        setup_make(&s, type, 2048, 2048, pre[i], false);
        snprintf(shape, sizeof shape, "prefill %dx2048x2048", pre[i]);
        if (check(&s))
            for (int v = pre[i] <= 64 ? V_REF : V_VEC_DOT; v <= V_PACKED; v++)
                if (v != V_PACKED || s.wp) measure(&s, v, shape);
        setup_free(&s);
    }
}

int main(int argc, char **argv) {
    static const uint32_t all[] = {LM_TYPE_F32,  LM_TYPE_F16,  LM_TYPE_BF16, LM_TYPE_Q8_0, LM_TYPE_Q4_0,
                                   LM_TYPE_Q4_K, LM_TYPE_Q5_K, LM_TYPE_Q6_K, LM_TYPE_MXFP4};
    uint32_t types[16];
    int nt = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) {
            n_threads = atoi(argv[++i]);
            if (n_threads < 1 || n_threads > 16) n_threads = 1;
        } else if (!strcmp(argv[i], "-s") && i + 1 < argc) {
            min_seconds = atof(argv[++i]);
        } else if (!strcmp(argv[i], "-v") && i + 1 < argc) {
            const char *v = argv[++i];
            bool (*has)(void) = cpu_has_avx2;
            if (!strcmp(v, "avxvnni")) lookup = avxvnni_kernels, has = cpu_has_avxvnni;
            else if (!strcmp(v, "avx512"))
                lookup = avx512_kernels, has = cpu_has_avx512, pair_lookup = avx512_pair_kernel;
            else if (!strcmp(v, "avx512vnni"))
                lookup = avx512vnni_kernels, has = cpu_has_avx512vnni, pair_lookup = avx512vnni_pair_kernel;
            else if (!strcmp(v, "avx512bf16"))
                lookup = avx512bf16_kernels, has = cpu_has_avx512bf16, pair_lookup = avx512vnni_pair_kernel;
            else if (strcmp(v, "avx2")) {
                fprintf(stderr, "unknown variant %s\n", v);
                return 2;
            }
            if (!has()) {
                printf("SKIP: this CPU does not run %s\n", v);
                return 0;
            }
            kernels_label = v;
        } else {
            int t = quant_type_from_name(argv[i]);
            if (t < 0 || !avx2_kernels((uint32_t)t) || !avx2_kernels((uint32_t)t)->vec_dot || nt >= 16) {
                fprintf(stderr, "usage: %s [-t THREADS] [-s SECONDS] [TYPE...]\n", argv[0]);
                return 2;
            }
            types[nt++] = (uint32_t)t;
        }
    }
    if (!cpu_has_avx2()) {
        printf("SKIP: this CPU lacks AVX2/FMA/F16C\n");
        return 0;
    }
    if (nt == 0) {
        memcpy(types, all, sizeof all);
        nt = (int)(sizeof all / sizeof all[0]);
    }
    lm_rng_seed(&rng, 1);
    printf("threads %d, kernels %s\n", n_threads, kernels_label);
    bench_from_float(LM_TYPE_Q8_0);
    bench_from_float(LM_TYPE_Q8_K);
    for (int i = 0; i < nt; i++) bench_type(types[i]);
    return 0;
}
