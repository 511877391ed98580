/*
 * ops.c - see ops.h. Every kernel comes from the kernel table
 * (kernels/kernels.h): the element-wise ops are one table call per row, the
 * matrix products fetch their type's entries once per call and split the
 * rows over the pool.
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
    const lm_type_traits *t = quant_traits(type);
    if (!t || t->vec_dot_type == LM_TYPE_F32) return 0;
    size_t row = quant_row_size(t->vec_dot_type, cols);
    /* weights with a packed copy take the packed kernel's rows instead */
    const lm_type_kernels *k = kernels_type(type);
    if (k->packed_gemm && k->packed_act && quant_packed_x_row_size(type, cols) > row)
        row = quant_packed_x_row_size(type, cols);
    return row * (size_t)n_tok;
}

/* Rows are handed out in chunks through atomic counters so a thread that
 * finishes early takes more (the two cores here are sometimes shared). The
 * chunks are split into one contiguous range per thread, each with its own
 * counter: a thread takes its own range's chunks in order, then helps with
 * the others'. So in decode each thread streams one run of consecutive
 * weight bytes, which the prefetchers follow (chunks dealt out in turn
 * measured 10% slower for Q4_0 decode), and nobody waits for a slow core. */
#define MATMUL_CHUNK 16
#define MATMUL_RANGES 16
#define MATMUL_MAX_PARTS 3
/* activation bytes per block of tokens in the gemm loop (matmul_chunk):
 * about half the L2 */
#define GEMM_BLOCK_BYTES (256 * 1024)

/* One or more products sharing the input x: part k computes
 * y_k = x · w_kᵀ. Chunks of MATMUL_CHUNK rows are numbered across the parts
 * (part k's chunks after part k-1's) so one pool run covers them all. */
typedef struct {
    int n_parts;
    float *y[MATMUL_MAX_PARTS];
    const lm_weight *w[MATMUL_MAX_PARTS];
    int pack_tile; /* tokens per packed call (the parts share it) */
    lm_vec_dot_fn dot[MATMUL_MAX_PARTS];
    lm_gemm_fn gemm[MATMUL_MAX_PARTS];          /* tile kernel, or NULL */
    int gemm_cols[MATMUL_MAX_PARTS];            /* its activation rows per call */
    lm_packed_gemm_fn packed[MATMUL_MAX_PARTS]; /* with w->packed: every part has one, or none */
    lm_packed_gemm_fn pair[MATMUL_MAX_PARTS];   /* two groups at once for few tokens, or NULL */
    int pair_tile[MATMUL_MAX_PARTS];            /* most tokens per pair call */
    lm_panel_widen_fn widen[MATMUL_MAX_PARTS];  /* F16 panels in k-blocks (panel_chunk), or NULL */
    lm_panel2_fn panel2[MATMUL_MAX_PARTS];
    lm_packed_gemm_fn wide[MATMUL_MAX_PARTS]; /* two groups at once for more tokens, or NULL */
    long chunk_rows;                          /* rows per chunk: a multiple of every quant_pack_rows */
    long chunk0[MATMUL_MAX_PARTS + 1];        /* first global chunk of each part */
    const void *x;                            /* activations in the shared vec_dot_type, n_tok rows */
    size_t x_row_bytes;
    int n_tok;
    int n_ranges;
    struct {
        _Alignas(64) atomic_long next; /* next chunk of the range */
        long end;
    } range[MATMUL_RANGES];
} matmul_job;

/* F16 panels by many tokens in k-blocks: tokens in blocks of PANEL_TOK,
 * within a block two groups at a time, and for each block of PANEL_K
 * columns of those two groups the columns are widened to floats once
 * (2 x 16 x PANEL_K floats, 16 KiB: they stay in L1) and every token tile
 * of the block runs over them, its chains carried in st between column
 * blocks. The block's activations (PANEL_TOK rows) stay in L2 across the
 * chunk's groups. Each (row, token) is the same fmaf chains in the same
 * order as packed_gemm's, so the bits do not depend on the blocking. */
#define PANEL_K 128
#define PANEL_TOK 48
#define PANEL_MIN_TOK 24 /* fewer tokens: the widening does not pay */
#define PANEL_MIN_COLS 64

static void panel_chunk(const matmul_job *j, int k, long r0, long r1) {
    const lm_weight *w = j->w[k];
    float *y = j->y[k];
    const int tile = j->pack_tile;
    const int64_t n = w->cols;
    const size_t gb = quant_pack_size(w->type, LM_PANEL_ROWS, n);
    _Alignas(64) float wf[2 * LM_PANEL_ROWS * PANEL_K]; /* (2, PANEL_K, 16): the two groups' widened columns */
    _Alignas(64) float st[PANEL_TOK * 2 * 48];          /* (PANEL_TOK, 2, 48): open chain, s0 + s1, s2 */
    for (int c0 = 0; c0 < j->n_tok; c0 += PANEL_TOK) {
        const int c1 = j->n_tok - c0 < PANEL_TOK ? j->n_tok : c0 + PANEL_TOK;
        for (long r = r0; r < r1; r += 2 * LM_PANEL_ROWS) {
            const int nr0 = r1 - r < LM_PANEL_ROWS ? (int)(r1 - r) : LM_PANEL_ROWS;
            const long rest = r1 - r - LM_PANEL_ROWS;
            const int nr1 = rest <= 0 ? 0 : rest < LM_PANEL_ROWS ? (int)rest : LM_PANEL_ROWS;
            const char *g0 = (const char *)w->packed + (size_t)(r / LM_PANEL_ROWS) * gb;
            for (int64_t k0 = 0; k0 < n; k0 += PANEL_K) {
                const int64_t k1 = n - k0 < PANEL_K ? n : k0 + PANEL_K;
                j->widen[k](g0, k0, k1, wf);
                if (nr1) j->widen[k](g0 + gb, k0, k1, wf + LM_PANEL_ROWS * (k1 - k0));
                for (int c = c0; c < c1; c += tile) {
                    const int nc = c1 - c < tile ? c1 - c : tile;
                    j->panel2[k](n, k0, k1, wf, nr0, nr1, (const char *)j->x + (size_t)c * j->x_row_bytes,
                                 j->x_row_bytes, nc, st + (size_t)(c - c0) * 96, y + (size_t)c * (size_t)w->rows + r,
                                 (size_t)w->rows);
                }
            }
        }
    }
}

static void matmul_chunk(const matmul_job *j, int k, long r0) {
    const lm_weight *w = j->w[k];
    float *y = j->y[k];
    long r1 = r0 + j->chunk_rows < w->rows ? r0 + j->chunk_rows : w->rows;
    if (j->panel2[k] && j->n_tok >= PANEL_MIN_TOK && w->cols >= PANEL_MIN_COLS && j->pack_tile <= PANEL_TOK) {
        panel_chunk(j, k, r0, r1);
        return;
    }
    if (j->packed[k]) {
        /* groups of interleaved rows x tiles of tokens, tokens in the outer
         * loop: the chunk's groups stay in cache across all tokens, each
         * token tile's activations across the groups */
        const int gr = quant_pack_rows(w->type), tile = j->pack_tile;
        const size_t gb = quant_pack_size(w->type, gr, w->cols);
        for (int c = 0; c < j->n_tok; c += tile) {
            int nc = j->n_tok - c < tile ? j->n_tok - c : tile;
            /* two groups per call where the kernel table has the tile:
             * the pair tile for few tokens (decode), the wide tile for
             * more (prefill); the same bits as one group at a time */
            lm_packed_gemm_fn pair = nc <= j->pair_tile[k] ? j->pair[k] : j->wide[k];
            for (long r = r0; r < r1;) {
                const bool two = pair && r1 - r > gr;
                const int span = two ? 2 * gr : gr;
                int nr = r1 - r < span ? (int)(r1 - r) : span;
                (two ? pair : j->packed[k])(w->cols, (const char *)w->packed + (size_t)(r / gr) * gb, nr,
                                            (const char *)j->x + (size_t)c * j->x_row_bytes, j->x_row_bytes, nc,
                                            y + (size_t)c * (size_t)w->rows + r, (size_t)w->rows);
                r += span;
            }
        }
        return;
    }
    if (j->gemm[k]) {
        /* tiles of up to 4 weight rows x gemm_cols tokens: each weight
         * block is decoded once per tile of tokens, each activation block
         * loaded once per row tile. Float weights: the tokens go in blocks
         * of GEMM_BLOCK_BYTES of activations, and within a block each row
         * tile meets every token tile in turn, so its weights stay in L1
         * while the block's activations stream from L2. Quantized weights
         * (small rows, small 8-bit activations): each token tile meets
         * the chunk's row tiles in turn, the chunk's rows staying in L2. */
        const int tc = j->gemm_cols[k];
        int bt = tc;
        if (!quant_traits(w->type)->is_quantized) {
            bt = (int)(GEMM_BLOCK_BYTES / j->x_row_bytes) / tc * tc;
            if (bt < tc) bt = tc;
        }
        for (int c0 = 0; c0 < j->n_tok; c0 += bt) {
            int c1 = j->n_tok - c0 < bt ? j->n_tok : c0 + bt;
            for (long r = r0; r < r1; r += LM_GEMM_TILE) {
                int nr = r1 - r < LM_GEMM_TILE ? (int)(r1 - r) : LM_GEMM_TILE;
                for (int c = c0; c < c1; c += tc) {
                    int nc = c1 - c < tc ? c1 - c : tc;
                    j->gemm[k](w->cols, (const char *)w->data + (size_t)r * w->row_bytes, w->row_bytes, nr,
                               (const char *)j->x + (size_t)c * j->x_row_bytes, j->x_row_bytes, nc,
                               y + (size_t)c * (size_t)w->rows + r, (size_t)w->rows);
                }
            }
        }
        return;
    }
    for (int t = 0; t < j->n_tok; t++) {
        const char *xt = (const char *)j->x + (size_t)t * j->x_row_bytes;
        float *yt = y + (size_t)t * (size_t)w->rows;
        for (long r = r0; r < r1; r++) yt[r] = j->dot[k](w->cols, (const char *)w->data + (size_t)r * w->row_bytes, xt);
    }
}

static void matmul_worker(void *arg, int ith, int nth) {
    matmul_job *j = arg;
    for (int i = 0; i < j->n_ranges; i++) {
        int r = (ith + i) % j->n_ranges;
        for (;;) {
            long c = atomic_fetch_add(&j->range[r].next, 1);
            if (c >= j->range[r].end) break;
            int k = 0;
            while (c >= j->chunk0[k + 1]) k++;
            matmul_chunk(j, k, (c - j->chunk0[k]) * j->chunk_rows);
        }
    }
}

/* Whether products with w run on its interleaved copy (quant.h). */
static bool use_packed(const lm_weight *w) { return w->packed && kernels_type(w->type)->packed_gemm; }

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

/* Convert x once to the activation type all parts share. */
static void matmul_run(lm_pool *pool, matmul_job *j, const float *x, int64_t cols, void *scratch) {
    const lm_kernels *kt = kernels();
    const lm_type_traits *t = quant_traits(j->w[0]->type);
    const lm_type_kernels *k0 = &kt->type[j->w[0]->type];
    j->chunk_rows = MATMUL_CHUNK;
    if (use_packed(j->w[0])) {
        j->pack_tile = k0->pack_tile;
        if (k0->packed_act) {
            j->x_row_bytes = quant_packed_x_row_size(j->w[0]->type, cols);
            quantize_rows(pool, k0->packed_act, x, cols, j->n_tok, scratch, j->x_row_bytes);
            j->x = scratch;
        } else { /* F16 panels take the floats */
            j->x = x;
            j->x_row_bytes = (size_t)cols * sizeof(float);
        }
        /* many tokens: larger chunks, so each token tile's activations are
         * read once per 64 rows rather than per 16 */
        if (j->n_tok >= 4 * j->pack_tile) j->chunk_rows = 4 * MATMUL_CHUNK;
    } else if (t->vec_dot_type == LM_TYPE_F32) {
        j->x = x;
        j->x_row_bytes = (size_t)cols * sizeof(float);
    } else {
        j->x_row_bytes = quant_row_size(t->vec_dot_type, cols);
        quantize_rows(pool, kt->type[t->vec_dot_type].from_float, x, cols, j->n_tok, scratch, j->x_row_bytes);
        j->x = scratch;
    }
    double work = 0;
    j->chunk0[0] = 0;
    for (int k = 0; k < j->n_parts; k++) {
        const lm_type_kernels *tk = &kt->type[j->w[k]->type];
        j->dot[k] = tk->vec_dot;
        j->gemm[k] = tk->gemm;
        j->gemm_cols[k] = tk->gemm_cols;
        j->packed[k] = use_packed(j->w[k]) ? tk->packed_gemm : NULL;
        j->pair[k] = j->packed[k] ? tk->packed_pair : NULL;
        j->pair_tile[k] = tk->pair_tile;
        j->widen[k] = j->packed[k] ? tk->panel_widen : NULL;
        j->panel2[k] = j->widen[k] ? tk->panel2 : NULL;
        j->wide[k] = j->packed[k] ? tk->packed_wide : NULL;
        j->chunk0[k + 1] = j->chunk0[k] + (j->w[k]->rows + j->chunk_rows - 1) / j->chunk_rows;
        work += (double)j->w[k]->rows * (double)cols * j->n_tok;
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
    j.w[0] = w;
    matmul_run(pool, &j, x, w->cols, scratch);
}

void ops_matmul_multi(lm_pool *pool, int n, float *const *y, const lm_weight *const *w, const float *x, int n_tok,
                      void *scratch) {
    /* one pass when the parts read the same activation format, else one each */
    bool same = n <= MATMUL_MAX_PARTS;
    for (int k = 1; k < n && same; k++)
        same = w[k]->cols == w[0]->cols &&
            quant_traits(w[k]->type)->vec_dot_type == quant_traits(w[0]->type)->vec_dot_type &&
            use_packed(w[k]) == use_packed(w[0]);
    if (!same) {
        for (int k = 0; k < n; k++) ops_matmul(pool, y[k], w[k], x, n_tok, scratch);
        return;
    }
    matmul_job j = {.n_parts = n, .n_tok = n_tok};
    for (int k = 0; k < n; k++) {
        j.y[k] = y[k];
        j.w[k] = w[k];
    }
    matmul_run(pool, &j, x, w[0]->cols, scratch);
}

void ops_get_row(const lm_weight *w, int64_t row, float *out) {
    kernels_type(w->type)->to_float((const char *)w->data + (size_t)row * w->row_bytes, out, w->cols);
}
