/*
 * ops.c - see ops.h. Every kernel comes from the kernel table
 * (kernels/kernels.h), but for gpt-oss's clamped SwiGLU, scalar here (it
 * runs on the chosen experts' rows only): the element-wise ops are one table call per row, the
 * matrix products ask kernels/ once per call which path runs
 * (kernels_matmul_pick, kernels_matmul_plan) and split its rows over the
 * pool (kernels_matmul_rows).
 */
#include "model/ops.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "kernels/kernels.h"
#include "format/quant.h"

void ops_rmsnorm(float *y, const float *x, const float *w, int n, float eps) { kernels()->ew.rmsnorm(y, x, w, n, eps); }

void ops_swiglu(float *g, const float *u, int n) { kernels()->ew.swiglu(g, u, n); }

void ops_geglu(float *g, const float *u, int n) { kernels()->ew.geglu(g, u, n); }

typedef struct {
    float *x;
    size_t n;
} gelu_job;

static void gelu_worker(void *arg, int ith, int nth) {
    const gelu_job *j = arg;
    size_t groups = (j->n + 7) / 8, g0 = groups * (size_t)ith / (size_t)nth,
           g1 = groups * (size_t)(ith + 1) / (size_t)nth;
    size_t i0 = g0 * 8, i1 = g1 * 8 < j->n ? g1 * 8 : j->n;
    for (size_t i = i0; i < i1;) { /* the kernel takes an int count */
        size_t len = i1 - i < ((size_t)1 << 30) ? i1 - i : (size_t)1 << 30;
        kernels()->ew.gelu(j->x + i, (int)len);
        i += len;
    }
}

void ops_gelu(lm_pool *pool, float *x, size_t n) {
    gelu_job j = {x, n};
    pool_run(pool, gelu_worker, &j);
}

void ops_swiglu_oai(float *g, const float *u, int n) {
    const float a = OPS_SWIGLU_OAI_ALPHA, lim = OPS_SWIGLU_OAI_LIMIT;
    for (int i = 0; i < n; i++) {
        float x = g[i] < lim ? g[i] : lim;
        float y = u[i] < -lim ? -lim : u[i] > lim ? lim : u[i];
        g[i] = x / (1.0f + expf(-a * x)) * (y + 1.0f);
    }
}

void ops_rope_angles(float *cs, int n_rot, int pos, float base, float scale) {
    for (int i = 0; i < n_rot / 2; i++) {
        double theta = (double)pos * scale * pow((double)base, -2.0 * i / n_rot);
        cs[2 * i] = (float)cos(theta);
        cs[2 * i + 1] = (float)sin(theta);
    }
}

void ops_rope_angles_ext(float *cs, int n_rot, int pos, float base, float scale, const float *factors, float mscale) {
    for (int i = 0; i < n_rot / 2; i++) {
        double theta = (double)pos * scale * pow((double)base, -2.0 * i / n_rot);
        if (factors) theta /= factors[i];
        cs[2 * i] = (float)(cos(theta) * mscale);
        cs[2 * i + 1] = (float)(sin(theta) * mscale);
    }
}

void ops_rope_angles_yarn(float *cs, int n_rot, int pos, float base, float factor, float low, float high,
                          float mscale) {
    double span = high - low > 0.001f ? (double)high - (double)low : 0.001;
    for (int i = 0; i < n_rot / 2; i++) {
        double y = ((double)i - low) / span;
        double r = 1.0 - (y < 0 ? 0 : y > 1 ? 1 : y);
        double theta = (double)pos * pow((double)base, -2.0 * i / n_rot) * ((1.0 - r) / factor + r);
        cs[2 * i] = (float)(cos(theta) * mscale);
        cs[2 * i + 1] = (float)(sin(theta) * mscale);
    }
}

/* the pair index whose wavelength fits b times in n_ctx_orig, in float as the file's converters assume */
static float yarn_dim(int n_rot, int n_ctx_orig, float b, float base) {
    return (float)n_rot * logf((float)n_ctx_orig / (b * 2.0f * (float)M_PI)) / (2.0f * logf(base));
}

void ops_rope_yarn_dims(int n_rot, int n_ctx_orig, float base, float beta_fast, float beta_slow, float *low,
                        float *high) {
    float lo = floorf(yarn_dim(n_rot, n_ctx_orig, beta_fast, base));
    float hi = ceilf(yarn_dim(n_rot, n_ctx_orig, beta_slow, base));
    *low = lo > 0 ? lo : 0;
    *high = hi < (float)(n_rot - 1) ? hi : (float)(n_rot - 1);
}

void ops_rope_apply(float *x, int n_heads, int head_dim, int n_rot, const float *cs, lm_rope_style style) {
    kernels()->ew.rope(x, n_heads, head_dim, n_rot, cs, style == LM_ROPE_NEOX);
}

size_t ops_matmul_scratch(uint32_t type, int64_t cols, int n_tok) {
    return kernels_matmul_scratch_row(type, cols) * (size_t)n_tok;
}

/* Rows are handed out in chunks (kernels_matmul_chunk_rows) through atomic
 * counters so a thread that finishes early takes more (the two cores here
 * are sometimes shared). The chunks are split into one contiguous range
 * per thread, each with its own counter: a thread takes its own range's
 * chunks in order, then helps with the others'. So in decode each thread
 * streams one run of consecutive weight bytes, which the prefetchers
 * follow (chunks dealt out in turn measured 10% slower for Q4_0 decode),
 * and nobody waits for a slow core. */
#define MATMUL_RANGES 16
#define MATMUL_MAX_PARTS 3

/* One or more products sharing the input x: part k computes
 * y_k = x · w_kᵀ by plan[k] (kernels/kernels.h), the kernels chosen once
 * per call. Chunks are numbered across the parts (part k's after part
 * k-1's) so one pool run covers them all. */
typedef struct {
    int n_parts;
    float *y[MATMUL_MAX_PARTS];
    lm_mm_weight w[MATMUL_MAX_PARTS];
    lm_mm_plan plan[MATMUL_MAX_PARTS];
    long chunk_rows;                   /* rows per chunk, the same for every part */
    long chunk0[MATMUL_MAX_PARTS + 1]; /* first global chunk of each part */
    const void *x;                     /* activations in the shared format, n_tok rows */
    size_t x_row_bytes;
    int n_tok;
    int n_ranges;
    struct {
        _Alignas(64) atomic_long next; /* next chunk of the range */
        long end;
    } range[MATMUL_RANGES];
} matmul_job;

static void matmul_worker(void *arg, int ith, int nth) {
    matmul_job *j = arg;
    for (int i = 0; i < j->n_ranges; i++) {
        int r = (ith + i) % j->n_ranges;
        for (;;) {
            long c = atomic_fetch_add(&j->range[r].next, 1);
            if (c >= j->range[r].end) break;
            int k = 0;
            while (c >= j->chunk0[k + 1]) k++;
            const long r0 = (c - j->chunk0[k]) * j->chunk_rows;
            const long r1 = r0 + j->chunk_rows < j->w[k].rows ? r0 + j->chunk_rows : j->w[k].rows;
            kernels_matmul_rows(&j->plan[k], &j->w[k], r0, r1, j->x, j->x_row_bytes, j->y[k]);
        }
    }
}

/* The path of a product with w over n_tok tokens. */
static const lm_mm_path *matmul_pick(const lm_weight *w, int n_tok) {
    return kernels_matmul_pick(w->type, n_tok, w->cols, w->packed != NULL);
}

/* Activation rows converted in parallel, QUANT_CHUNK rows at a time. Each
 * row is converted by the same function whichever thread takes it, so the
 * bytes do not depend on the split. */
#define QUANT_CHUNK 4

typedef struct {
    lm_from_float_fn fn;
    const float *x; /* (n_tok, cols) */
    char *dst;      /* (n_tok, row_bytes) */
    int64_t cols;
    size_t row_bytes;
    int n_tok;
    atomic_int next;
} quant_job;

static void quant_worker(void *arg, int ith, int nth) {
    quant_job *q = arg;
    for (;;) {
        int t0 = atomic_fetch_add(&q->next, QUANT_CHUNK);
        if (t0 >= q->n_tok) break;
        int t1 = t0 + QUANT_CHUNK < q->n_tok ? t0 + QUANT_CHUNK : q->n_tok;
        for (int t = t0; t < t1; t++)
            q->fn(q->x + (size_t)t * (size_t)q->cols, q->dst + (size_t)t * q->row_bytes, q->cols);
    }
}

static void quantize_rows(lm_pool *pool, lm_from_float_fn fn, const float *x, int64_t cols, int n_tok, void *dst,
                          size_t row_bytes) {
    quant_job q = {.fn = fn, .x = x, .dst = dst, .cols = cols, .row_bytes = row_bytes, .n_tok = n_tok};
    atomic_init(&q.next, 0);
    /* a pool run costs a wake-up: only worth it for many rows */
    pool_run((double)n_tok * (double)cols < 64.0 * 1024 ? NULL : pool, quant_worker, &q);
}

/* Convert x once to the activation format all parts share (the first
 * part's path's). */
static void matmul_run(lm_pool *pool, matmul_job *j, const lm_weight *const *w, const float *x, int64_t cols,
                       void *scratch) {
    const lm_mm_path *p0 = matmul_pick(w[0], j->n_tok);
    j->x_row_bytes = kernels_matmul_act_row(w[0]->type, p0, cols);
    if (p0->act == LM_MM_ACT_F32) {
        j->x = x;
    } else {
        quantize_rows(pool, p0->conv, x, cols, j->n_tok, scratch, j->x_row_bytes);
        j->x = scratch;
    }
    double work = 0;
    j->chunk0[0] = 0;
    for (int k = 0; k < j->n_parts; k++) {
        j->w[k] = (lm_mm_weight){.data = w[k]->data,
                                 .packed = w[k]->packed,
                                 .row_bytes = w[k]->row_bytes,
                                 .rows = w[k]->rows,
                                 .cols = w[k]->cols,
                                 .type = w[k]->type};
        kernels_matmul_plan(&j->plan[k], w[k]->type, k ? matmul_pick(w[k], j->n_tok) : p0, j->n_tok,
                            k ? j->plan[0].tile : 0);
        if (!k) j->chunk_rows = kernels_matmul_chunk_rows(&j->plan[0]);
        j->chunk0[k + 1] = j->chunk0[k] + (w[k]->rows + j->chunk_rows - 1) / j->chunk_rows;
        work += (double)w[k]->rows * (double)cols * j->n_tok;
    }
    /* Waking the workers costs a few microseconds: small products run on
     * the caller alone. */
    lm_pool *run = work < 256.0 * 1024 ? NULL : pool;
    const long n_chunks = j->chunk0[j->n_parts];
    int nr = run ? pool_size(run) : 1;
    if (nr > MATMUL_RANGES) nr = MATMUL_RANGES;
    j->n_ranges = nr;
    for (int r = 0; r < nr; r++) {
        atomic_init(&j->range[r].next, n_chunks * r / nr);
        j->range[r].end = n_chunks * (r + 1) / nr;
    }
    pool_run(run, matmul_worker, j);
}

void ops_matmul(lm_pool *pool, float *y, const lm_weight *w, const float *x, int n_tok, void *scratch) {
    matmul_job j = {.n_parts = 1, .n_tok = n_tok};
    j.y[0] = y;
    matmul_run(pool, &j, &w, x, w->cols, scratch);
}

void ops_matmul_multi(lm_pool *pool, int n, float *const *y, const lm_weight *const *w, const float *x, int n_tok,
                      void *scratch) {
    /* one pass when the parts read the same activation format, else one each */
    bool same = n <= MATMUL_MAX_PARTS;
    for (int k = 1; k < n && same; k++)
        same = w[k]->cols == w[0]->cols &&
            quant_traits(w[k]->type)->vec_dot_type == quant_traits(w[0]->type)->vec_dot_type &&
            matmul_pick(w[k], n_tok)->packed == matmul_pick(w[0], n_tok)->packed;
    if (!same) {
        for (int k = 0; k < n; k++) ops_matmul(pool, y[k], w[k], x, n_tok, scratch);
        return;
    }
    matmul_job j = {.n_parts = n, .n_tok = n_tok};
    for (int k = 0; k < n; k++) j.y[k] = y[k];
    matmul_run(pool, &j, w, x, w[0]->cols, scratch);
}

void ops_get_row(const lm_weight *w, int64_t row, float *out) {
    kernels_type(w->type)->to_float((const char *)w->data + (size_t)row * w->row_bytes, out, w->cols);
}
