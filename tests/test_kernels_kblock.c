/*
 * test_kernels_kblock.c - the 256-bit k-blocked F16 panel tiles
 * (kernels/avx2.h: avx2_panel_widen_cols + avx2_gemm_panel_kblock, the
 * kernel table's panel_widen and panel2 on the avx2 and avxvnni variants)
 * against the scalar reference, and the table's choice of them.
 *
 * For avx2 and avxvnni where this CPU runs them (the others are printed by
 * name as "NOT RUN", never counted as passed):
 *  - the table filled for the variant (kernels_use) holds no k-blocked
 *    tiles unless LAMINA_AVX2_KBLOCK is set (kernels/dispatch.c), and with
 *    it its own 256-bit k-blocked pair for F16 with 6-token tiles, no
 *    other type having one (the rest of the program runs with it set);
 *    on the avx512 variants the table holds the 512-bit pair instead
 *    (kernels/avx512_gemm.h), so those keep their own faster path;
 *  - the tile itself, for rows 1, 5, 16, 17, 40, 64 (partial groups, one
 *    or two groups per call), lengths 4 to 2816 (every remainder mod 4, so
 *    the last segment's tail), columns cut in blocks of 1, 3, 128 and 4096
 *    elements (a block inside a segment, across segment ends, the whole
 *    row), 1 to 6 tokens: every output bit for bit quant_panel_dot_ref's
 *    (hence the panel tile's, avx2_packed_gemm_f16), nothing written past
 *    the last row or token;
 *  - through ops_matmul on two threads with a model's packed copy, every
 *    batch of 1 to 64 tokens (from 24 tokens on, model/ops.c takes the
 *    k-blocked path) and odd shapes: each output bit for bit
 *    quant_panel_dot_ref's, within n * 2^-24 * sum |w_i x_i| of the float64
 *    dot, and each token's outputs bit-identical to the token alone (batch
 *    invariance: decode equals prefill).
 *
 * Without AVX2 the program prints a SKIP line and counts nothing.
 */
#include "kernels/avx2.h"
#include "kernels/avx512_gemm.h"
#include "kernels/kernels.h"
#include "kernels/x86.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/pool.h"
#include "base/util.h"
#include "format/quant.h"
#include "model/model.h"
#include "model/ops.h"
#include "test.h"

static const struct {
    lm_isa isa;
    const char *name;
    const lm_avx2_kernels *(*lookup)(uint32_t);
} variants[] = {{LM_ISA_AVX2, "avx2", avx2_kernels}, {LM_ISA_AVXVNNI, "avxvnni", avxvnni_kernels}};
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

static bool same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof *a) == 0; }

static const lm_avx2_kernels *f16_entries(void) { return variants[cur].lookup(LM_TYPE_F16); }

/* The variant's table holds its 256-bit pair for F16 only; the avx512
 * variants' tables hold the 512-bit one. */
static void test_table(void) {
    /* without LAMINA_AVX2_KBLOCK the table holds the panel tile alone */
    unsetenv("LAMINA_AVX2_KBLOCK");
    CHECK(kernels_use(variants[cur].isa) == 0);
    CHECK(!kernels_type(LM_TYPE_F16)->panel2 && !kernels_type(LM_TYPE_F16)->panel_widen &&
          kernels_type(LM_TYPE_F16)->pack_tile == 6);
    setenv("LAMINA_AVX2_KBLOCK", "0", 1);
    CHECK(kernels_use(variants[cur].isa) == 0 && !kernels_type(LM_TYPE_F16)->panel2);
    setenv("LAMINA_AVX2_KBLOCK", "1", 1);
    CHECK(kernels_use(variants[cur].isa) == 0);
    const lm_avx2_kernels *a = f16_entries();
    const lm_type_kernels *k = kernels_type(LM_TYPE_F16);
    CHECK(a && a->panel_widen && a->panel2);
    CHECK(k->panel_widen == a->panel_widen && k->panel2 == a->panel2 && k->packed_gemm == a->packed_gemm &&
          k->pack_tile == 6);
    for (uint32_t t = 0; t < LM_TYPE_COUNT; t++)
        if (t != LM_TYPE_F16)
            CHECKF(!kernels()->type[t].panel2 && !kernels()->type[t].panel_widen, "type %u", (unsigned)t);
    static const lm_isa wide[] = {LM_ISA_AVX512, LM_ISA_AVX512VNNI, LM_ISA_AVX512BF16};
    for (size_t i = 0; i < sizeof wide / sizeof wide[0]; i++) {
        if (!kernels_cpu_has(wide[i]) || !avx512_gemm_kernels(LM_TYPE_F16, false)) continue;
        lm_panel_widen_fn zw;
        lm_panel2_fn zt;
        avx512_gemm_panel2_lookup(LM_TYPE_F16, &zw, &zt);
        CHECK(kernels_use(wide[i]) == 0);
        CHECKF(kernels_type(LM_TYPE_F16)->panel2 == zt && kernels_type(LM_TYPE_F16)->panel_widen == zw &&
                   kernels_type(LM_TYPE_F16)->pack_tile == 12,
               "%s keeps the 512-bit k-blocked tile", kernels_isa_name());
    }
    CHECK(kernels_use(-1) == 0);
}

/* One (rows, n, kb) case of test_tile; "" or what went wrong in msg. */
static void check_tile(int64_t rows, int64_t n, int64_t kb, char *msg, size_t ml) {
    const lm_avx2_kernels *a = f16_entries();
    const int n_tok = 6;
    size_t rb = quant_row_size(LM_TYPE_F16, n), groups = (size_t)(rows + 15) / 16;
    size_t gb = quant_pack_size(LM_TYPE_F16, 16, n);
    uint8_t *w = lm_malloc(rb * (size_t)rows + 2), *wp = lm_malloc(quant_pack_size(LM_TYPE_F16, rows, n) + 2);
    float *x = lm_malloc((size_t)n_tok * (size_t)n * sizeof(float) + 4);
    float *wf = lm_malloc((size_t)(2 * 16 * kb) * sizeof(float)), *st = lm_malloc((size_t)n_tok * 96 * sizeof(float));
    make_f16_rows(w, rows, n);
    fill_normal(x, (int64_t)n_tok * n, 1.0);
    quant_pack(LM_TYPE_F16, w, rb, rows, n, wp);
    const size_t ys = (size_t)rows + 3;
    float *y = lm_malloc(ys * (n_tok + 1) * sizeof(float));
    for (int nc = 1; nc <= n_tok && !msg[0]; nc++) {
        for (size_t i = 0; i < ys * (n_tok + 1); i++) y[i] = -1234.5f;
        for (size_t g = 0; g < groups; g += 2) {
            int64_t left = rows - 16 * (int64_t)g;
            int nr0 = left < 16 ? (int)left : 16, nr1 = left <= 16 ? 0 : left - 16 < 16 ? (int)(left - 16) : 16;
            for (int64_t k0 = 0; k0 < n; k0 += kb) {
                int64_t k1 = n - k0 < kb ? n : k0 + kb;
                a->panel_widen(wp + g * gb, k0, k1, wf);
                if (nr1) a->panel_widen(wp + (g + 1) * gb, k0, k1, wf + 16 * (k1 - k0));
                a->panel2(n, k0, k1, wf, nr0, nr1, x, (size_t)n * sizeof(float), nc, st, y + 16 * g, ys);
            }
        }
        for (int c = 0; c <= n_tok && !msg[0]; c++)
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

static void test_tile(void) {
    static const int64_t row_counts[] = {1, 5, 16, 17, 40, 64};
    static const int64_t col_counts[] = {4, 5, 7, 64, 100, 577, 2816};
    static const int64_t blocks[] = {1, 3, 128, 4096};
    for (size_t ri = 0; ri < sizeof row_counts / sizeof row_counts[0]; ri++)
        for (size_t ci = 0; ci < sizeof col_counts / sizeof col_counts[0]; ci++)
            for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
                if (blocks[bi] < 8 && col_counts[ci] > 600) continue; /* tiny blocks: short rows only */
                char msg[200] = "";
                check_tile(row_counts[ri], col_counts[ci], blocks[bi], msg, sizeof msg);
                CHECKF(!msg[0], "%s F16 rows=%lld n=%lld kb=%lld: %s", variants[cur].name, (long long)row_counts[ri],
                       (long long)col_counts[ci], (long long)blocks[bi], msg);
            }
}

/* ops_matmul with F16 panels under the variant's table, 1..64 tokens. */
static void check_matmul(int64_t rows, int64_t n, lm_pool *pool, char *msg, size_t ml) {
    enum { MAX_TOK = 64 };
    size_t rb = quant_row_size(LM_TYPE_F16, n), gb = quant_pack_size(LM_TYPE_F16, 16, n);
    uint8_t *w = lm_malloc(rb * (size_t)rows + 2), *wp = lm_malloc(quant_pack_size(LM_TYPE_F16, rows, n) + 2);
    make_f16_rows(w, rows, n);
    quant_pack(LM_TYPE_F16, w, rb, rows, n, wp);
    float *x = lm_malloc((size_t)MAX_TOK * (size_t)n * sizeof(float) + 4),
          *wf = lm_malloc((size_t)n * sizeof(float) + 4);
    fill_normal(x, (int64_t)MAX_TOK * n, 1.0);
    size_t ny = (size_t)MAX_TOK * (size_t)rows;
    float *ref = lm_malloc(ny * sizeof(float));
    double *ref64 = lm_malloc(ny * sizeof(double)), *tol = lm_malloc(ny * sizeof(double));
    for (int64_t r = 0; r < rows; r++) {
        quant_to_float_ref(LM_TYPE_F16, w + (size_t)r * rb, wf, n);
        for (int t = 0; t < MAX_TOK; t++) {
            const float *xt = x + (size_t)t * (size_t)n;
            size_t i = (size_t)t * (size_t)rows + (size_t)r;
            double e = 0, as = 0;
            for (int64_t k = 0; k < n; k++) {
                e += (double)wf[k] * xt[k];
                as += fabs((double)wf[k] * xt[k]);
            }
            ref64[i] = e;
            tol[i] = (double)n * ldexp(1.0, -24) * as + 1e-30;
            ref[i] = quant_panel_dot_ref(n, wp + (size_t)(r / 16) * gb, (int)(r % 16), xt);
        }
    }
    void *scratch = lm_malloc(ops_matmul_scratch(LM_TYPE_F16, n, MAX_TOK) + 16);
    float *y = lm_malloc(ny * sizeof(float)), *alone = lm_malloc(ny * sizeof(float));
    lm_weight lw = {.data = w, .type = LM_TYPE_F16, .rows = rows, .cols = n, .row_bytes = rb, .packed = wp};
    if (kernels_use(variants[cur].isa) != 0) snprintf(msg, ml, "cannot use the variant");
    for (int t = 0; t < MAX_TOK && !msg[0]; t++)
        ops_matmul(pool, alone + (size_t)t * (size_t)rows, &lw, x + (size_t)t * (size_t)n, 1, scratch);
    for (int n_tok = 1; n_tok <= MAX_TOK && !msg[0]; n_tok++) {
        ops_matmul(pool, y, &lw, x, n_tok, scratch);
        size_t m = (size_t)n_tok * (size_t)rows;
        for (size_t i = 0; i < m && !msg[0]; i++) {
            if (!(fabs((double)y[i] - ref64[i]) <= tol[i]))
                snprintf(msg, ml, "batch %d: token %zu row %zu: %.9g vs float64 %.9g", n_tok, i / (size_t)rows,
                         i % (size_t)rows, y[i], ref64[i]);
            else if (!same_bits(y + i, ref + i, 1))
                snprintf(msg, ml, "batch %d: token %zu row %zu: %.9g, fmaf chain %.9g", n_tok, i / (size_t)rows,
                         i % (size_t)rows, y[i], ref[i]);
        }
        if (!msg[0] && !same_bits(y, alone, m)) snprintf(msg, ml, "batch %d: differs from its tokens alone", n_tok);
    }
    kernels_use(-1);
    lm_free(w);
    lm_free(wp);
    lm_free(x);
    lm_free(wf);
    lm_free(ref);
    lm_free(ref64);
    lm_free(tol);
    lm_free(scratch);
    lm_free(y);
    lm_free(alone);
}

static void test_matmul_tokens(void) {
    static const int64_t shapes[][2] = {{37, 576}, {13, 96}, {16, 64}, {3, 63}, {9, 1536}, {70, 258}, {113, 1031}};
    lm_pool *pool = pool_new(2);
    CHECK(pool);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        char msg[200] = "";
        check_matmul(shapes[si][0], shapes[si][1], pool, msg, sizeof msg);
        CHECKF(!msg[0], "%s F16 rows=%lld n=%lld: %s", variants[cur].name, (long long)shapes[si][0],
               (long long)shapes[si][1], msg);
    }
    pool_free(pool);
    CHECK(kernels_use(-1) == 0);
}

int main(void) {
    if (!cpu_has_avx2()) {
        printf("SKIP test_kernels_kblock: this CPU (or OS) lacks AVX2/FMA/F16C\n");
        return TEST_DONE();
    }
    lm_rng_seed(&rng, 20261202);
    for (cur = 0; cur < N_VARIANTS; cur++) {
        if (!kernels_cpu_has(variants[cur].isa) || !f16_entries()) {
            printf("NOT RUN %s: this CPU (or OS, or this build) does not run it\n", variants[cur].name);
            continue;
        }
        printf("variant %s\n", variants[cur].name);
        TEST_RUN(test_table);
        TEST_RUN(test_tile);
        setenv("LAMINA_AVX2_KBLOCK", "1", 1);
        TEST_RUN(test_matmul_tokens);
    }
    return TEST_DONE();
}
