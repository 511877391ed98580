/*
 * test_kernels_avx512.c - the 512-bit prefill tiles of the avx512 variants
 * (kernels/avx512_gemm.h).
 *
 * For each of avx512 and avx512vnni that this CPU runs (the others are
 * printed by name as "NOT RUN", never counted as passed):
 *  - the table filled for the variant (kernels_use) holds the 512-bit F16
 *    panel tile, 12 tokens wide; the avx2 table does not;
 *  - the F16 panel tile itself, for rows 1, 5, 16, 17, 40 (partial groups),
 *    lengths 0 to 2816 (every remainder mod 4, so the last segment's tail),
 *    29 tokens in tiles of every width 1..12, with and without a first tile
 *    of one token: every output bit for bit quant_panel_dot_ref's and the
 *    AVX2 panel tile's (one token at a time), within n * 2^-24 * sum |w_i x_i| of the float64
 *    dot, nothing written past the last row;
 *  - through ops_matmul on two threads with the packed copy a model holds,
 *    for every batch of 1 to 64 tokens and odd shapes: each output within
 *    the same float64 bound, each token's outputs bit-identical to the
 *    token computed alone (batch invariance, and decode equals prefill),
 *    and bit-identical to the avx2 table's (batches 1..9, 17, 33, 64).
 *
 * Without AVX2 the program prints a SKIP line and counts nothing.
 */
#include "kernels/avx512_gemm.h"
#include "kernels/kernels.h"
#include "kernels/x86.h"

#include <math.h>
#include <stdlib.h>
#include <stdint.h>

#include "base/pool.h"
#include "base/util.h"
#include "format/quant.h"
#include "model/model.h"
#include "model/ops.h"
#include "test.h"

static const struct {
    lm_isa isa;
    const char *name;
} variants[] = {{LM_ISA_AVX512, "avx512"}, {LM_ISA_AVX512VNNI, "avx512vnni"}};
#define N_VARIANTS (sizeof variants / sizeof variants[0])

static lm_rng rng;
static size_t cur; /* the variant under test */

static void fill_normal(float *x, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(lm_rng_normal(&rng) * scale);
}

/* F16 rows: Gaussian floats rounded to F16 by the reference. */
static void make_f16_rows(uint8_t *w, int64_t rows, int64_t n) {
    float *f = lm_malloc((size_t)n * sizeof(float) + 4);
    size_t rb = quant_row_size(LM_TYPE_F16, n);
    for (int64_t r = 0; r < rows; r++) {
        fill_normal(f, n, 0.5);
        quant_from_float_ref(LM_TYPE_F16, f, w + (size_t)r * rb, n);
    }
    lm_free(f);
}

/* The float64 dot of an F16 row with floats, and the bound for a
 * sequential float sum of its terms. */
static double dot64(const uint8_t *wrow, const float *x, int64_t n, double *tol) {
    float *wf = lm_malloc((size_t)n * sizeof(float) + 4);
    quant_to_float_ref(LM_TYPE_F16, wrow, wf, n);
    double exact = 0, abs_sum = 0;
    for (int64_t i = 0; i < n; i++) {
        exact += (double)wf[i] * x[i];
        abs_sum += fabs((double)wf[i] * x[i]);
    }
    lm_free(wf);
    *tol = (double)n * ldexp(1.0, -24) * abs_sum + 1e-30;
    return exact;
}

/* The 512-bit F16 panel tile (through the lookup: the symbol exists only
 * in x86 builds that keep the variants). */
static lm_packed_gemm_fn zmm_f16(void) {
    return avx512_gemm_kernels(LM_TYPE_F16, variants[cur].isa == LM_ISA_AVX512VNNI)->packed_gemm;
}

static bool same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof *a) == 0; }

/* The variant's table holds the 512-bit tile; avx2's does not. */
static void test_table(void) {
    CHECK(kernels_use(variants[cur].isa) == 0);
    const lm_type_kernels *k = kernels_type(LM_TYPE_F16);
    CHECK(k->packed_gemm == zmm_f16() && !k->packed_act && k->pack_tile == 12);
    CHECK(k->panel_widen && k->panel2);
    CHECK(!kernels_type(LM_TYPE_Q8_0)->panel2 && !kernels_type(LM_TYPE_F32)->panel2);
    CHECK(kernels_use(LM_ISA_AVX2) == 0);
    CHECK(kernels_type(LM_TYPE_F16)->packed_gemm != zmm_f16());
    CHECK(!kernels_type(LM_TYPE_F16)->panel_widen && !kernels_type(LM_TYPE_F16)->panel2);
    CHECK(kernels_use(-1) == 0);
}

/* One (rows, n) case of test_panel_f16; "" or what went wrong in msg. */
static void check_panel(int64_t rows, int64_t n, double xscale, char *msg, size_t ml) {
    const lm_avx2_kernels *a = avx2_kernels(LM_TYPE_F16);
    const int n_tok = 29;
    size_t rb = quant_row_size(LM_TYPE_F16, n), groups = (size_t)(rows + 15) / 16;
    size_t gb = quant_pack_size(LM_TYPE_F16, 16, n);
    uint8_t *w = lm_malloc(rb * (size_t)rows + 2), *wp = lm_malloc(quant_pack_size(LM_TYPE_F16, rows, n) + 2);
    float *x = lm_malloc((size_t)n_tok * (size_t)n * sizeof(float) + 4);
    make_f16_rows(w, rows, n);
    fill_normal(x, (int64_t)n_tok * n, xscale);
    quant_pack(LM_TYPE_F16, w, rb, rows, n, wp);
    const size_t ys = (size_t)rows + 3;
    float *y = lm_malloc(ys * n_tok * sizeof(float)), *y2 = lm_malloc(ys * n_tok * sizeof(float));
    for (int width = 1; width <= 12 && !msg[0]; width++) {
        for (int first = 0; first < 2 && !msg[0]; first++) {
            for (size_t i = 0; i < ys * n_tok; i++) y[i] = y2[i] = -1234.5f;
            for (size_t g = 0; g < groups; g++) {
                int nr = rows - 16 * (int64_t)g < 16 ? (int)(rows - 16 * (int64_t)g) : 16;
                for (int c = 0; c < n_tok;) {
                    int nc = c == 0 && first ? 1 : (n_tok - c < width ? n_tok - c : width);
                    const float *xc = x + (size_t)c * (size_t)n;
                    zmm_f16()(n, wp + g * gb, nr, xc, (size_t)n * sizeof(float), nc, y + (size_t)c * ys + 16 * g, ys);
                    for (int t = c; t < c + nc; t++) /* AVX2, one token at a time */
                        a->packed_gemm(n, wp + g * gb, nr, x + (size_t)t * (size_t)n, (size_t)n * sizeof(float), 1,
                                       y2 + (size_t)t * ys + 16 * g, ys);
                    c += nc;
                }
            }
            if (!same_bits(y, y2, ys * n_tok))
                snprintf(msg, ml, "tile %d (first %d): differs from the AVX2 panel tile", width, first);
            for (int c = 0; c < n_tok && !msg[0]; c++)
                for (size_t r = 0; r < ys && !msg[0]; r++) {
                    float got = y[(size_t)c * ys + r];
                    if (r >= (size_t)rows) {
                        if (got != -1234.5f) snprintf(msg, ml, "wrote past the last row (token %d, %zu)", c, r);
                        continue;
                    }
                    const float *xc = x + (size_t)c * (size_t)n;
                    float ref = quant_panel_dot_ref(n, wp + (r / 16) * gb, (int)(r % 16), xc);
                    double tol, exact = dot64(w + r * rb, xc, n, &tol);
                    if (!same_bits(&got, &ref, 1) || !(fabs((double)got - exact) <= tol))
                        snprintf(msg, ml, "tile %d: row %zu token %d: %.9g fmaf chain %.9g float64 %.9g (tol %.3g)",
                                 width, r, c, got, ref, exact, tol);
                }
        }
    }
    lm_free(w);
    lm_free(wp);
    lm_free(x);
    lm_free(y);
    lm_free(y2);
}

static void test_panel_f16(void) {
    static const int64_t row_counts[] = {1, 5, 16, 17, 40};
    static const int64_t col_counts[] = {0, 1, 2, 3, 4, 5, 7, 8, 15, 33, 100, 1000, 2816};
    for (size_t ri = 0; ri < sizeof row_counts / sizeof row_counts[0]; ri++)
        for (size_t ci = 0; ci < sizeof col_counts / sizeof col_counts[0]; ci++) {
            char msg[200] = "";
            check_panel(row_counts[ri], col_counts[ci], ri & 1 ? 1e-3 : 1.0, msg, sizeof msg);
            CHECKF(!msg[0], "F16 rows=%lld n=%lld: %s", (long long)row_counts[ri], (long long)col_counts[ci], msg);
        }
}

/* The k-blocked pair tile (panel_widen + panel2) for one (rows, n): two
 * groups at a time, columns cut in blocks of kb, 1..12 tokens; every output
 * bit for bit quant_panel_dot_ref's, nothing written past the last row. */
static void check_panel2(int64_t rows, int64_t n, int64_t kb, char *msg, size_t ml) {
    lm_panel_widen_fn widen;
    lm_panel2_fn tile;
    avx512_gemm_panel2_lookup(LM_TYPE_F16, &widen, &tile);
    const int n_tok = 12;
    size_t rb = quant_row_size(LM_TYPE_F16, n), groups = (size_t)(rows + 15) / 16;
    size_t gb = quant_pack_size(LM_TYPE_F16, 16, n);
    uint8_t *w = lm_malloc(rb * (size_t)rows + 2), *wp = lm_malloc(quant_pack_size(LM_TYPE_F16, rows, n) + 2);
    float *x = lm_malloc((size_t)n_tok * (size_t)n * sizeof(float) + 4);
    float *wf = lm_malloc((size_t)(2 * 16 * kb) * sizeof(float)), *st = lm_malloc((size_t)n_tok * 96 * sizeof(float));
    make_f16_rows(w, rows, n);
    fill_normal(x, (int64_t)n_tok * n, 1.0);
    quant_pack(LM_TYPE_F16, w, rb, rows, n, wp);
    const size_t ys = (size_t)rows + 3;
    float *y = lm_malloc(ys * n_tok * sizeof(float));
    for (int nc = 1; nc <= n_tok && !msg[0]; nc++) {
        for (size_t i = 0; i < ys * n_tok; i++) y[i] = -1234.5f;
        for (size_t g = 0; g < groups; g += 2) {
            int64_t left = rows - 16 * (int64_t)g;
            int nr0 = left < 16 ? (int)left : 16, nr1 = left <= 16 ? 0 : left - 16 < 16 ? (int)(left - 16) : 16;
            for (int64_t k0 = 0; k0 < n; k0 += kb) {
                int64_t k1 = n - k0 < kb ? n : k0 + kb;
                widen(wp + g * gb, k0, k1, wf);
                if (nr1) widen(wp + (g + 1) * gb, k0, k1, wf + 16 * (k1 - k0));
                tile(n, k0, k1, wf, nr0, nr1, x, (size_t)n * sizeof(float), nc, st, y + 16 * g, ys);
            }
        }
        for (int c = 0; c < n_tok && !msg[0]; c++)
            for (size_t r = 0; r < ys && !msg[0]; r++) {
                float got = y[(size_t)c * ys + r];
                if (r >= (size_t)rows || c >= nc) {
                    if (got != -1234.5f)
                        snprintf(msg, ml, "%d tokens: wrote past the end (token %d, row %zu)", nc, c, r);
                    continue;
                }
                float ref = quant_panel_dot_ref(n, wp + (r / 16) * gb, (int)(r % 16), x + (size_t)c * (size_t)n);
                if (!same_bits(&got, &ref, 1))
                    snprintf(msg, ml, "%d tokens: row %zu token %d: %.9g, fmaf chain %.9g", nc, r, c, got, ref);
            }
    }
    lm_free(w);
    lm_free(wp);
    lm_free(x);
    lm_free(wf);
    lm_free(st);
    lm_free(y);
}

static void test_panel2_f16(void) {
    static const int64_t row_counts[] = {1, 16, 17, 40, 64};
    static const int64_t col_counts[] = {4, 5, 7, 64, 100, 577, 2816};
    static const int64_t blocks[] = {1, 3, 128, 4096};
    for (size_t ri = 0; ri < sizeof row_counts / sizeof row_counts[0]; ri++)
        for (size_t ci = 0; ci < sizeof col_counts / sizeof col_counts[0]; ci++)
            for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
                if (blocks[bi] < 8 && col_counts[ci] > 600) continue; /* tiny blocks: small rows only */
                char msg[200] = "";
                check_panel2(row_counts[ri], col_counts[ci], blocks[bi], msg, sizeof msg);
                CHECKF(!msg[0], "F16 rows=%lld n=%lld kb=%lld: %s", (long long)row_counts[ri],
                       (long long)col_counts[ci], (long long)blocks[bi], msg);
            }
}

/* ops_matmul with F16 panels under the variant's table, 1..64 tokens. */
static void check_matmul(int64_t rows, int64_t n, lm_pool *pool, char *msg, size_t ml) {
    enum { MAX_TOK = 64 };
    size_t rb = quant_row_size(LM_TYPE_F16, n);
    uint8_t *w = lm_malloc(rb * (size_t)rows + 2), *wp = lm_malloc(quant_pack_size(LM_TYPE_F16, rows, n) + 2);
    make_f16_rows(w, rows, n);
    quant_pack(LM_TYPE_F16, w, rb, rows, n, wp);
    float *x = lm_malloc((size_t)MAX_TOK * (size_t)n * sizeof(float) + 4);
    fill_normal(x, (int64_t)MAX_TOK * n, 1.0);
    size_t ny = (size_t)MAX_TOK * (size_t)rows;
    double *ref = lm_malloc(ny * sizeof(double)), *tol = lm_malloc(ny * sizeof(double));
    for (int t = 0; t < MAX_TOK; t++)
        for (int64_t r = 0; r < rows; r++) {
            size_t i = (size_t)t * (size_t)rows + (size_t)r;
            ref[i] = dot64(w + (size_t)r * rb, x + (size_t)t * (size_t)n, n, &tol[i]);
        }
    void *scratch = lm_malloc(ops_matmul_scratch(LM_TYPE_F16, n, MAX_TOK) + 16);
    float *y = lm_malloc(ny * sizeof(float)), *alone = lm_malloc(ny * sizeof(float));
    float *y2 = lm_malloc(ny * sizeof(float));
    lm_weight lw = {.data = w, .type = LM_TYPE_F16, .rows = rows, .cols = n, .row_bytes = rb, .packed = wp};
    if (kernels_use(variants[cur].isa) != 0) snprintf(msg, ml, "cannot use the variant");
    for (int t = 0; t < MAX_TOK && !msg[0]; t++)
        ops_matmul(pool, alone + (size_t)t * (size_t)rows, &lw, x + (size_t)t * (size_t)n, 1, scratch);
    for (int n_tok = 1; n_tok <= MAX_TOK && !msg[0]; n_tok++) {
        const bool vs_avx2 = n_tok <= 9 || n_tok == 17 || n_tok == 33 || n_tok == 64;
        ops_matmul(pool, y, &lw, x, n_tok, scratch);
        if (vs_avx2) {
            kernels_use(LM_ISA_AVX2);
            ops_matmul(pool, y2, &lw, x, n_tok, scratch);
            kernels_use(variants[cur].isa);
        }
        size_t m = (size_t)n_tok * (size_t)rows;
        for (size_t i = 0; i < m && !msg[0]; i++)
            if (!(fabs((double)y[i] - ref[i]) <= tol[i]))
                snprintf(msg, ml, "batch %d: token %zu row %zu: %.9g vs float64 %.9g", n_tok, i / (size_t)rows,
                         i % (size_t)rows, y[i], ref[i]);
        if (!msg[0] && !same_bits(y, alone, m)) snprintf(msg, ml, "batch %d: differs from its tokens alone", n_tok);
        if (!msg[0] && vs_avx2 && !same_bits(y, y2, m))
            snprintf(msg, ml, "batch %d: differs from the avx2 table's", n_tok);
    }
    kernels_use(-1);
    lm_free(w);
    lm_free(wp);
    lm_free(x);
    lm_free(ref);
    lm_free(tol);
    lm_free(scratch);
    lm_free(y);
    lm_free(y2);
    lm_free(alone);
}

static void test_matmul_tokens(void) {
    static const int64_t shapes[][2] = {{37, 576}, {13, 96}, {3, 33}, {16, 7}, {9, 1536}, {70, 258}, {113, 1031}};
    lm_pool *pool = pool_new(2);
    CHECK(pool);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        char msg[200] = "";
        check_matmul(shapes[si][0], shapes[si][1], pool, msg, sizeof msg);
        if (msg[0]) pool_free(pool);
        CHECKF(!msg[0], "F16 rows=%lld n=%lld: %s", (long long)shapes[si][0], (long long)shapes[si][1], msg);
    }
    pool_free(pool);
    CHECK(kernels_use(-1) == 0);
}

int main(void) {
    if (!cpu_has_avx2()) {
        printf("SKIP test_kernels_avx512: this CPU (or OS) lacks AVX2/FMA/F16C\n");
        return TEST_DONE();
    }
    lm_rng_seed(&rng, 20261202);
    for (cur = 0; cur < N_VARIANTS; cur++) {
        if (!kernels_cpu_has(variants[cur].isa) || !avx512_gemm_kernels(LM_TYPE_F16, false)) {
            printf("NOT RUN %s: this CPU (or OS, or this build) does not run it\n", variants[cur].name);
            continue;
        }
        printf("variant %s\n", variants[cur].name);
        TEST_RUN(test_table);
        TEST_RUN(test_panel_f16);
        TEST_RUN(test_panel2_f16);
        TEST_RUN(test_matmul_tokens);
    }
    return TEST_DONE();
}
