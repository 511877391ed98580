/*
 * test_matmul_pick.c - the matrix-product path lists (kernels.h:
 * kernels_matmul_pick, kernels_matmul_plan, kernels_matmul_rows) in every
 * variant this CPU runs, scalar included.
 *
 *  - The pick against the rule ops_matmul followed before the lists
 *    existed, written out here from the table's own entries: on the
 *    interleaved copy (packed_gemm), F16 panels in k-blocks (panel2) from
 *    24 tokens and 64 columns, else tiles of pack_tile tokens, each on the
 *    pair tile up to pair_tile tokens, else the wide tile, else
 *    packed_gemm; row-major, gemm where the type has it, else vec_dot; 64
 *    rows per chunk from four packed tiles of tokens. A grid of types,
 *    token counts (1 to 300), columns and copy / no copy; and, spelled
 *    out, what this CPU's variants run for a few (Q4_K decode on the pair
 *    tile, F16 prefill on panels, MXFP4 on NEON's tiles of 4, ...), and which
 *    types get a copy.
 *  - Every entry of every list run by itself over a 40-row matrix (the
 *    last group partial or alone): within TOL of the scalar reference
 *    where its activations are the reference's (row-major), and bit for
 *    bit equal to its layout's plain entry (pair, wide and panel to
 *    packed, gemm to dot) for the tokens it takes; every entry of one
 *    layout reads the same activation format. test_kernels_isa holds the
 *    plain entries to the reference.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_check.h"

static const uint32_t weight_types[] = {LM_TYPE_F32,  LM_TYPE_F16,  LM_TYPE_BF16, LM_TYPE_Q8_0,
                                        LM_TYPE_Q4_0, LM_TYPE_Q5_0, LM_TYPE_Q4_1, LM_TYPE_Q5_1,
                                        LM_TYPE_Q4_K, LM_TYPE_Q5_K, LM_TYPE_Q6_K, LM_TYPE_MXFP4};
#define N_WEIGHT_TYPES (sizeof weight_types / sizeof weight_types[0])

/* ---- the rule as ops_matmul had it --------------------------------------------- */

/* The entry a tile of nc tokens ran on the interleaved copy. */
static const char *old_tile(const lm_type_kernels *k, int nc) {
    if (k->packed_pair && nc <= k->pair_tile) return "pair";
    if (k->packed_wide) return "wide";
    return "packed";
}

/* The path of a product; for the tiled ones "tiled". */
static const char *old_call(const lm_type_kernels *k, int n_tok, int64_t cols, bool has_copy) {
    if (has_copy && k->packed_gemm) {
        if (k->panel2 && n_tok >= 24 && cols >= 64 && k->pack_tile <= 48) return "panel";
        return "tiled";
    }
    return k->gemm ? "gemm" : "dot";
}

static const char *name_or(const lm_mm_path *p) { return p ? p->name : "(none)"; }

static void check_grid_type(uint32_t t) {
    static const int toks[] = {1, 2, 3, 4, 5, 7, 8, 9, 11, 12, 13, 16, 23, 24, 25, 31, 32, 33, 48, 64, 100, 300};
    static const int64_t colss[] = {32, 63, 64, 576, 2048};
    const lm_type_kernels *k = kernels_type(t);
    for (size_t ci = 0; ci < sizeof colss / sizeof colss[0]; ci++)
        for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++)
            for (int copy = 0; copy < 2; copy++) {
                const int n = toks[ti];
                const int64_t cols = colss[ci];
                const char *want = old_call(k, n, cols, copy);
                const lm_mm_path *p = kernels_matmul_pick(t, n, cols, copy);
                CHECKF(p != NULL, "%s %s: no path", kernels_isa_name(), quant_type_name(t));
                if (!p) return;
                lm_mm_plan pl;
                kernels_matmul_plan(&pl, t, p, n, 0);
                if (strcmp(want, "tiled")) {
                    CHECKF(!strcmp(p->name, want), "%s %s %d tokens, %lld cols, copy %d: %s, was %s",
                           kernels_isa_name(), quant_type_name(t), n, (long long)cols, copy, p->name, want);
                } else {
                    const int tile = k->pack_tile;
                    CHECKF(p->tiled && pl.tile == tile, "%s %s %d tokens: %s (tile %d), was tiles of %d",
                           kernels_isa_name(), quant_type_name(t), n, p->name, pl.tile, tile);
                    const char *wf = n >= tile ? old_tile(k, tile) : "(none)";
                    const char *wl = n % tile ? old_tile(k, n % tile) : "(none)";
                    CHECKF(!strcmp(name_or(pl.full), wf) && !strcmp(name_or(pl.last), wl),
                           "%s %s %d tokens: tiles %s / %s, were %s / %s", kernels_isa_name(), quant_type_name(t), n,
                           name_or(pl.full), name_or(pl.last), wf, wl);
                }
                const long want_rows = copy && k->packed_gemm && n >= 4 * k->pack_tile ? 64 : 16;
                CHECKF(kernels_matmul_chunk_rows(&pl) == want_rows, "%s %s %d tokens: chunks of %ld rows, were %ld",
                       kernels_isa_name(), quant_type_name(t), n, kernels_matmul_chunk_rows(&pl), want_rows);
                if (test_cur_failed_) return;
            }
    CHECKF(kernels_matmul_packs(t) == (k->packed_gemm != NULL), "%s %s: packs %d", kernels_isa_name(),
           quant_type_name(t), kernels_matmul_packs(t));
}

static void test_pick_grid(void) {
    for (size_t i = 0; i < N_WEIGHT_TYPES && !test_cur_failed_; i++) check_grid_type(weight_types[i]);
}

/* The names of the entries for a product of n tokens: the path's, then the full and last tiles'. */
static void pick_names(uint32_t t, int n, int64_t cols, char *out, size_t len) {
    const lm_mm_path *p = kernels_matmul_pick(t, n, cols, true);
    lm_mm_plan pl;
    kernels_matmul_plan(&pl, t, p, n, 0);
    snprintf(out, len, "%s %s %s", p->name, name_or(pl.full), name_or(pl.last));
}

#define WANT(t, n, cols, want)                                                                                         \
    do {                                                                                                               \
        char got_[64];                                                                                                 \
        pick_names(t, n, cols, got_, sizeof got_);                                                                     \
        CHECKF(!strcmp(got_, want), "%s %s %d tokens: %s, want %s", kernels_isa_name(), quant_type_name(t), n, got_,   \
               want);                                                                                                  \
    } while (0)

/* What each variant runs, spelled out. */
static void test_pick_spelled(void) {
    kernels_use(LM_ISA_SCALAR);
    WANT(LM_TYPE_Q4_0, 1, 576, "dot (none) (none)");
    WANT(LM_TYPE_F16, 300, 576, "dot (none) (none)");
    WANT(LM_TYPE_MXFP4, 5, 2880, "dot (none) (none)");
    CHECK(!kernels_matmul_packs(LM_TYPE_Q4_0) && !kernels_matmul_packs(LM_TYPE_MXFP4));
    if (kernels_use(LM_ISA_AVX2) == 0) {
        WANT(LM_TYPE_Q4_0, 1, 576, "packed (none) packed");
        WANT(LM_TYPE_Q4_K, 10, 2048, "packed packed packed");
        WANT(LM_TYPE_F16, 301, 576, "packed packed packed"); /* tiles of 6 */
        WANT(LM_TYPE_Q6_K, 8, 2048, "gemm (none) (none)");
        WANT(LM_TYPE_MXFP4, 1, 2880, "packed (none) packed");
        CHECK(kernels_matmul_packs(LM_TYPE_Q4_K) && kernels_matmul_packs(LM_TYPE_F16));
        CHECK(kernels_matmul_packs(LM_TYPE_MXFP4));
        CHECK(!kernels_matmul_packs(LM_TYPE_Q6_K) && !kernels_matmul_packs(LM_TYPE_F32));
    }
    if (kernels_use(LM_ISA_AVX512) == 0) {
        WANT(LM_TYPE_Q4_0, 1, 576, "pair (none) pair");
        WANT(LM_TYPE_Q4_0, 8, 576, "packed packed (none)");
        WANT(LM_TYPE_Q4_0, 10, 576, "packed packed pair");
        WANT(LM_TYPE_MXFP4, 10, 2880, "packed packed packed"); /* no pair tile */
        WANT(LM_TYPE_Q4_K, 6, 2048, "packed (none) packed");
        WANT(LM_TYPE_F16, 23, 576, "packed packed packed"); /* tiles of 12 */
        WANT(LM_TYPE_F16, 24, 576, "panel (none) (none)");
        WANT(LM_TYPE_F16, 301, 63, "packed packed packed"); /* too few columns */
    }
    if (kernels_use(LM_ISA_AVX512VNNI) == 0) {
        WANT(LM_TYPE_Q4_K, 1, 2048, "pair (none) pair");
        WANT(LM_TYPE_Q4_K, 4, 2048, "pair (none) pair");
        WANT(LM_TYPE_Q4_K, 5, 2048, "wide (none) wide");
        WANT(LM_TYPE_Q4_K, 8, 2048, "wide wide (none)");
        WANT(LM_TYPE_Q4_K, 300, 2048, "packed wide pair"); /* 37 tiles of 8, then 4 */
        WANT(LM_TYPE_Q4_K, 301, 2048, "packed wide wide");
        WANT(LM_TYPE_Q8_0, 6, 576, "packed (none) packed");
    }
    for (int isa = LM_ISA_NEON; isa <= LM_ISA_NEONDOT; isa++) {
        if (kernels_use(isa) != 0) continue;
        WANT(LM_TYPE_Q4_0, 1, 576, "packed (none) packed"); /* tiles of 4 */
        WANT(LM_TYPE_MXFP4, 1, 2880, "packed (none) packed");
        WANT(LM_TYPE_MXFP4, 4, 2880, "packed packed (none)");
        WANT(LM_TYPE_MXFP4, 10, 2880, "packed packed packed");
        CHECK(kernels_matmul_packs(LM_TYPE_Q8_0) && kernels_matmul_packs(LM_TYPE_MXFP4));
        CHECK(!kernels_matmul_packs(LM_TYPE_Q5_0) && !kernels_matmul_packs(LM_TYPE_Q4_K));
    }
    kernels_use(-1);
}

/* ---- every entry against its layout's plain one ------------------------------- */

/* y (n_tok, rows) by entry p alone over tiles of `tile` tokens. */
static void run_entry(const lm_mm_path *p, int tile, uint32_t t, const lm_mm_weight *w, const float *x, int n_tok,
                      float *y) {
    const size_t xr = kernels_matmul_act_row(t, p, w->cols);
    void *xa = (void *)x;
    if (p->act != LM_MM_ACT_F32) {
        xa = lm_malloc(xr * (size_t)n_tok);
        for (int c = 0; c < n_tok; c++) p->conv(x + (size_t)c * (size_t)w->cols, (char *)xa + (size_t)c * xr, w->cols);
    }
    lm_mm_plan pl = {.path = p, .full = p, .last = p, .tile = tile, .n_tok = n_tok};
    const long cr = kernels_matmul_chunk_rows(&pl);
    for (long r0 = 0; r0 < w->rows; r0 += cr)
        kernels_matmul_rows(&pl, w, r0, r0 + cr < w->rows ? r0 + cr : w->rows, xa, xr, y);
    if (xa != x) lm_free(xa);
}

static void check_entries_type(uint32_t t) {
    const lm_type_kernels *k = kernels_type(t);
    const int64_t blck = quant_traits(t)->blck, rows = 40;
    const int64_t n = blck == 1 ? 160 : blck == 32 ? 128 : 512;
    const size_t rb = quant_row_size(t, n);
    uint8_t *wr = lm_malloc(rb * (size_t)rows);
    for (int64_t r = 0; r < rows; r++) make_weight(t, n, r & 1, wr + (size_t)r * rb);
    uint8_t *wp = NULL;
    if (kernels_matmul_packs(t)) {
        wp = lm_malloc(quant_pack_size(t, rows, n));
        quant_pack(t, wr, rb, rows, n, wp);
    }
    lm_mm_weight w = {.data = wr, .packed = wp, .row_bytes = rb, .rows = rows, .cols = n, .type = t};
    enum { MAX_TOK = 40 };
    float *x = lm_malloc((size_t)MAX_TOK * (size_t)n * sizeof(float));
    fill_normal(x, MAX_TOK * n, 1.0);
    float *y = lm_malloc((size_t)MAX_TOK * (size_t)rows * sizeof(float));
    float *yb = lm_malloc((size_t)MAX_TOK * (size_t)rows * sizeof(float));
    double *ref = lm_malloc((size_t)MAX_TOK * (size_t)rows * sizeof(double));
    double *tol = lm_malloc((size_t)MAX_TOK * (size_t)rows * sizeof(double));
    matmul_reference(t, n, rows, wr, x, MAX_TOK, TOL, ref, tol);
    /* the plain entries: packed, dot */
    const lm_mm_path *plain[2] = {NULL, NULL};
    for (int i = 0; i < k->n_mm; i++)
        if (k->mm[i].kind == LM_MM_PACKED) plain[1] = &k->mm[i];
        else if (k->mm[i].kind == LM_MM_DOT) plain[0] = &k->mm[i];
    CHECKF(plain[0] != NULL, "%s %s: no dot entry", kernels_isa_name(), quant_type_name(t));
    for (int i = 0; i < k->n_mm && !test_cur_failed_; i++) {
        const lm_mm_path *p = &k->mm[i], *b = plain[p->packed];
        CHECKF(b && p->act == b->act && p->conv == b->conv, "%s %s %s: no plain entry or another activation format",
               kernels_isa_name(), quant_type_name(t), p->name);
        if (test_cur_failed_) break;
        /* the tokens it takes: its fewest and its most (a tile's worth, or 37 where unbounded) */
        int ns[2] = {p->min_tok, p->max_tok < MAX_TOK ? p->max_tok : MAX_TOK - 3};
        if (p->kind == LM_MM_PANEL && ns[0] < 30) ns[0] = 30;
        for (int j = 0; j < 2 && !test_cur_failed_; j++) {
            const int nt = ns[j];
            const int tile = p->tiled && p->max_tok < p->tile ? p->max_tok : p->tile;
            memset(y, 0xff, (size_t)MAX_TOK * (size_t)rows * sizeof(float));
            memset(yb, 0, (size_t)MAX_TOK * (size_t)rows * sizeof(float));
            run_entry(p, tile, t, &w, x, nt, y);
            run_entry(b, b->tile, t, &w, x, nt, yb);
            CHECKF(bits_equal(y, yb, (size_t)nt * (size_t)rows), "%s %s %s, %d tokens: not %s's bits",
                   kernels_isa_name(), quant_type_name(t), p->name, nt, b->name);
            /* (avx512bf16's BF16 dot rounds the activations: its bound is test_kernels_isa's) */
            if (!p->packed && !(t == LM_TYPE_BF16 && kernels()->isa == LM_ISA_AVX512BF16)) {
                int64_t bad = -1;
                for (int64_t e = 0; e < (int64_t)nt * rows && bad < 0; e++)
                    if (!(fabs((double)y[e] - ref[e]) <= tol[e])) bad = e;
                CHECKF(bad < 0, "%s %s %s, %d tokens: output %lld %.9g, reference %.9g", kernels_isa_name(),
                       quant_type_name(t), p->name, nt, (long long)bad, bad < 0 ? 0.0 : y[bad],
                       bad < 0 ? 0.0 : ref[bad]);
            }
        }
    }
    lm_free(wr);
    lm_free(wp);
    lm_free(x);
    lm_free(y);
    lm_free(yb);
    lm_free(ref);
    lm_free(tol);
}

static void test_entries(void) {
    for (size_t i = 0; i < N_WEIGHT_TYPES && !test_cur_failed_; i++) check_entries_type(weight_types[i]);
}

int main(void) {
    lm_rng_seed(&rng, 20261206);
    kernels_init();
    for (int isa = 0; isa < LM_ISA_COUNT; isa++) {
        kc_variant(kernels_isa_str((lm_isa)isa), kernels_cpu_has((lm_isa)isa) ? NULL : "this CPU lacks it");
        if (!kc_variant_why_ && kernels_use(isa)) return 1;
        KC_CHECK(test_pick_grid);
        KC_CHECK(test_entries);
    }
    TEST_RUN(test_pick_spelled);
    kernels_use(-1);
    return kc_done();
}
