/*
 * test_kernels_wide.c - the avx512vnni variant's 512-bit prefill tile for
 * Q4_K (kernels/x86_wide.h: two interleaved groups, 16 rows, against up to
 * 8 tokens).
 *
 * For avx512vnni and avx512bf16 (which takes avx512vnni's tiles), where
 * this CPU runs them (otherwise printed as "NOT RUN <variant>", never
 * counted as passed):
 *  - the kernel table holds the wide tile for Q4_K and nothing else, none
 *    with LAMINA_NO_REPACK, none in the avx2 and avx512 tables;
 *  - the tile on reference-quantized and random-byte weights (the 6-bit
 *    scales and mins random too), lengths of 1, 3 and 11 super-blocks,
 *    every row count 9..16 and 1..8 tokens: each output bit-identical
 *    (memcmp) to the variant's packed_gemm on each group and to avx2's,
 *    within 1e-5 * sum |w x| of the float64 dot of the scalar reference's
 *    dequantized weight and activation rows, and nothing written past the
 *    tile's rows and tokens;
 *  - ops_matmul on two threads with the table switched to the variant,
 *    rows 8, 13, 16, 24, 37 and 40 (pairs, a lone group, partial groups),
 *    batches of 1..64 tokens (every tile width and remainder): each token's
 *    outputs bit-identical to that token alone (batch invariance within the
 *    variant) and to the avx2 table's, and within the same bound of the
 *    reference;
 *  - Q6_K's row-major gemm with two rows per 512-bit vector: in the table
 *    of both variants as the gemm, on reference-quantized and random-byte
 *    rows (random scales), lengths of 1, 3 and 11 super-blocks, every
 *    tile of 1..4 rows by 1..4 tokens: bit-identical to the variant's
 *    vec_dot and to avx2's, within the same bound of the reference; and
 *    ops_matmul as above (rows 1, 3, 13, 37, 1..64 tokens).
 * Without AVX2 the program prints a SKIP line and counts nothing.
 */
#include "kernels/kernels.h"
#include "kernels/x86.h"
#include "kernels/x86_wide.h"

#include <math.h>
#include <stdint.h>

#include "base/pool.h"
#include "base/util.h"
#include "format/quant.h"
#include "model/model.h"
#include "model/ops.h"
#include "test.h"

#define TOL 1e-5 /* relative to sum |w_i x_i| */

static const struct {
    lm_isa isa;
    const char *name;
    const lm_avx2_kernels *(*lookup)(uint32_t);
} variants[] = {{LM_ISA_AVX512VNNI, "avx512vnni", avx512vnni_kernels},
                {LM_ISA_AVX512BF16, "avx512bf16", avx512bf16_kernels}};
#define N_VARIANTS (sizeof variants / sizeof variants[0])

static lm_rng rng;
static size_t cur;

static void fill_normal(float *x, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(lm_rng_normal(&rng) * scale);
}

/* A Q4_K row: reference-quantized Gaussian floats, or with every byte but
 * d and dmin random (so the 6-bit scales and mins are random too). */
static void make_weight_t(uint32_t type, int64_t n, bool random_bytes, uint8_t *dst) {
    float *f = lm_malloc((size_t)n * sizeof(float));
    fill_normal(f, n, 0.5);
    quant_from_float_ref(type, f, dst, n);
    /* Q4_K: all but d and dmin; Q6_K: all but d (its last two bytes) */
    const size_t bs = quant_traits(type)->type_size, lo = type == LM_TYPE_Q4_K ? 4 : 0;
    const size_t hi = type == LM_TYPE_Q4_K ? bs : bs - 2;
    if (random_bytes)
        for (size_t b = 0; b < (size_t)(n / QK_K); b++)
            for (size_t i = lo; i < hi; i++) dst[b * bs + i] = (uint8_t)lm_rng_u64(&rng);
    lm_free(f);
}

static void make_weight(int64_t n, bool random_bytes, uint8_t *dst) { make_weight_t(LM_TYPE_Q4_K, n, random_bytes, dst); }

static bool same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof *a) == 0; }

/* float64 dot of a Q4_K row and a Q8_K row, both dequantized by the
 * reference; *abs_sum gets sum |w x|. */
static double ref_dot_t(uint32_t type, int64_t n, const uint8_t *w, const uint8_t *xq, double *abs_sum) {
    float *wf = lm_malloc((size_t)n * sizeof(float)), *xf = lm_malloc((size_t)n * sizeof(float));
    quant_to_float_ref(type, w, wf, n);
    quant_to_float_ref(LM_TYPE_Q8_K, xq, xf, n);
    double s = 0, a = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)wf[i] * xf[i];
        a += fabs((double)wf[i] * xf[i]);
    }
    lm_free(wf);
    lm_free(xf);
    *abs_sum = a;
    return s;
}

static double ref_dot(int64_t n, const uint8_t *w, const uint8_t *xq, double *abs_sum) {
    return ref_dot_t(LM_TYPE_Q4_K, n, w, xq, abs_sum);
}

/* The table: the wide tile for Q4_K in the VNNI variants only, none with
 * LAMINA_NO_REPACK (the environment is restored after). */
static void test_table(void) {
    const char *old = getenv("LAMINA_NO_REPACK");
    char saved[64] = "", msg[120] = "";
    if (old) snprintf(saved, sizeof saved, "%s", old);
    unsetenv("LAMINA_NO_REPACK");
    if (kernels_use(variants[cur].isa) != 0) snprintf(msg, sizeof msg, "cannot switch to the variant");
    for (uint32_t t = 0; t < LM_TYPE_COUNT && !msg[0]; t++) {
        const lm_type_kernels *k = kernels_type(t);
        if (!k) continue;
        const bool want = t == LM_TYPE_Q4_K;
        if (!!k->packed_wide != want || (want && (k->packed_wide != avx512vnni_wide_kernel(t) || !k->packed_gemm ||
                                                  k->pack_tile > LM_WIDE_TILE || k->pair_tile >= k->pack_tile)))
            snprintf(msg, sizeof msg, "%s: wide entry", quant_type_name(t));
    }
    static const lm_isa others[] = {LM_ISA_AVX2, LM_ISA_AVX512};
    for (size_t i = 0; i < 2 && !msg[0]; i++) {
        if (!kernels_cpu_has(others[i])) continue;
        if (kernels_use(others[i]) != 0) snprintf(msg, sizeof msg, "cannot switch to %s", kernels_isa_str(others[i]));
        for (uint32_t t = 0; t < LM_TYPE_COUNT && !msg[0]; t++)
            if (kernels_type(t) && kernels_type(t)->packed_wide)
                snprintf(msg, sizeof msg, "%s has a wide tile", kernels_isa_str(others[i]));
    }
    setenv("LAMINA_NO_REPACK", "1", 1);
    if (!msg[0] && kernels_use(variants[cur].isa) != 0) snprintf(msg, sizeof msg, "cannot switch to the variant");
    if (!msg[0] && kernels_type(LM_TYPE_Q4_K)->packed_wide) snprintf(msg, sizeof msg, "a wide tile with LAMINA_NO_REPACK");
    if (old) setenv("LAMINA_NO_REPACK", saved, 1);
    else unsetenv("LAMINA_NO_REPACK");
    CHECK(kernels_use(-1) == 0);
    CHECKF(!msg[0], "%s", msg);
}

/* The tile against packed_gemm (this variant's and avx2's) and the reference. */
static void test_tiles(void) {
    enum { T = LM_WIDE_TILE };
    static const int64_t lens[] = {256, 768, 2816};
    const lm_avx2_kernels *a = avx2_kernels(LM_TYPE_Q4_K), *v = variants[cur].lookup(LM_TYPE_Q4_K);
    lm_packed_gemm_fn wide = avx512vnni_wide_kernel(LM_TYPE_Q4_K);
    CHECK(wide && a->packed_gemm && v->packed_gemm);
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int64_t n = lens[li];
        const int rows = 16;
        size_t rb = quant_row_size(LM_TYPE_Q4_K, n), gb = quant_pack_size(LM_TYPE_Q4_K, 8, n);
        size_t xs = quant_row_size(LM_TYPE_Q8_K, n);
        uint8_t *w = lm_malloc(rb * rows), *wp = lm_malloc(quant_pack_size(LM_TYPE_Q4_K, rows, n));
        for (int r = 0; r < rows; r++) make_weight(n, r % 3 == 1, w + (size_t)r * rb);
        quant_pack(LM_TYPE_Q4_K, w, rb, rows, n, wp);
        float *xf = lm_malloc((size_t)T * (size_t)n * sizeof(float));
        fill_normal(xf, (int64_t)T * n, 1.0);
        uint8_t *x = lm_malloc(xs * T);
        for (int c = 0; c < T; c++) quant_from_float_ref(LM_TYPE_Q8_K, xf + (size_t)c * (size_t)n, x + (size_t)c * xs, n);
        double ref[T][16], as[T][16];
        for (int c = 0; c < T; c++)
            for (int r = 0; r < rows; r++) ref[c][r] = ref_dot(n, w + (size_t)r * rb, x + (size_t)c * xs, &as[c][r]);
        char msg[200] = "";
        float y[T * 16], y0[T * 16], y1[T * 16];
        for (int nr = 9; nr <= 16 && !msg[0]; nr++)
            for (int nc = 1; nc <= T && !msg[0]; nc++) {
                for (int i = 0; i < T * 16; i++) y[i] = y0[i] = y1[i] = -1.0f;
                wide(n, wp, nr, x, xs, nc, y, 16);
                v->packed_gemm(n, wp, 8, x, xs, nc, y0, 16);
                v->packed_gemm(n, wp + gb, nr - 8, x, xs, nc, y0 + 8, 16);
                a->packed_gemm(n, wp, 8, x, xs, nc, y1, 16);
                a->packed_gemm(n, wp + gb, nr - 8, x, xs, nc, y1 + 8, 16);
                if (!same_bits(y, y0, T * 16))
                    snprintf(msg, sizeof msg, "%d rows x %d tokens differ from the variant's packed_gemm", nr, nc);
                else if (!same_bits(y, y1, T * 16))
                    snprintf(msg, sizeof msg, "%d rows x %d tokens differ from avx2's packed_gemm", nr, nc);
                for (int c = 0; c < nc && !msg[0]; c++)
                    for (int r = 0; r < nr && !msg[0]; r++)
                        if (!(fabs((double)y[c * 16 + r] - ref[c][r]) <= TOL * as[c][r] + 1e-30))
                            snprintf(msg, sizeof msg, "row %d token %d: %.9g, reference %.9g", r, c, y[c * 16 + r],
                                     ref[c][r]);
                for (int c = nc; c < T && !msg[0]; c++) /* nothing past nc, nr written */
                    for (int r = 0; r < 16; r++)
                        if (y[c * 16 + r] != -1.0f) snprintf(msg, sizeof msg, "wrote token %d", c);
                for (int c = 0; c < nc && !msg[0]; c++)
                    for (int r = nr; r < 16; r++)
                        if (y[c * 16 + r] != -1.0f) snprintf(msg, sizeof msg, "wrote row %d with nr %d", r, nr);
            }
        lm_free(w);
        lm_free(wp);
        lm_free(xf);
        lm_free(x);
        CHECKF(!msg[0], "Q4_K n=%lld: %s", (long long)n, msg);
    }
}

/* ops_matmul through the table: pairs, lone groups and partial groups,
 * 1..64 tokens. */
static void test_matmul(void) {
    static const int64_t rows_list[] = {8, 13, 16, 24, 37, 40};
    enum { MAX_TOK = 64 };
    const int64_t n = 512;
    lm_pool *pool = pool_new(2);
    CHECK(pool);
    char msg[220] = "";
    for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0] && !msg[0]; ri++) {
        const int64_t rows = rows_list[ri];
        size_t rb = quant_row_size(LM_TYPE_Q4_K, n), xq_s = quant_row_size(LM_TYPE_Q8_K, n);
        uint8_t *w = lm_malloc(rb * (size_t)rows), *wp = lm_malloc(quant_pack_size(LM_TYPE_Q4_K, rows, n));
        for (int64_t r = 0; r < rows; r++) make_weight(n, r % 2 == 1, w + (size_t)r * rb);
        quant_pack(LM_TYPE_Q4_K, w, rb, rows, n, wp);
        float *x = lm_malloc((size_t)MAX_TOK * (size_t)n * sizeof(float));
        fill_normal(x, (int64_t)MAX_TOK * n, 1.0);
        uint8_t *xq = lm_malloc(xq_s);
        size_t ny = (size_t)MAX_TOK * (size_t)rows;
        float *y = lm_malloc(ny * sizeof(float)), *y2 = lm_malloc(ny * sizeof(float));
        float *alone = lm_malloc(ny * sizeof(float));
        void *scratch = lm_malloc(ops_matmul_scratch(LM_TYPE_Q4_K, n, MAX_TOK));
        lm_weight lw = {.data = w, .type = LM_TYPE_Q4_K, .rows = rows, .cols = n, .row_bytes = rb, .packed = wp};
        CHECK(kernels_use(variants[cur].isa) == 0 && kernels_type(LM_TYPE_Q4_K)->packed_wide);
        for (int t = 0; t < MAX_TOK; t++)
            ops_matmul(pool, alone + (size_t)t * (size_t)rows, &lw, x + (size_t)t * (size_t)n, 1, scratch);
        for (int t = 0; t < MAX_TOK && !msg[0]; t++) { /* each token alone against the reference */
            quant_act_from_float(LM_TYPE_Q4_K, x + (size_t)t * (size_t)n, xq, n);
            for (int64_t r = 0; r < rows && !msg[0]; r++) {
                double as, ref = ref_dot(n, w + (size_t)r * rb, xq, &as);
                float got = alone[(size_t)t * (size_t)rows + (size_t)r];
                if (!(fabs((double)got - ref) <= TOL * as + 1e-30))
                    snprintf(msg, sizeof msg, "rows %lld: token %d row %lld: %.9g, reference %.9g", (long long)rows, t,
                             (long long)r, got, ref);
            }
        }
        for (int n_tok = 1; n_tok <= MAX_TOK && !msg[0]; n_tok++) {
            size_t m = (size_t)n_tok * (size_t)rows;
            CHECK(kernels_use(variants[cur].isa) == 0);
            ops_matmul(pool, y, &lw, x, n_tok, scratch);
            CHECK(kernels_use(LM_ISA_AVX2) == 0);
            ops_matmul(pool, y2, &lw, x, n_tok, scratch);
            if (!same_bits(y, alone, m))
                snprintf(msg, sizeof msg, "rows %lld batch %d: differs from its tokens alone", (long long)rows, n_tok);
            else if (!same_bits(y, y2, m))
                snprintf(msg, sizeof msg, "rows %lld batch %d: differs from the avx2 table's", (long long)rows, n_tok);
        }
        lm_free(w);
        lm_free(wp);
        lm_free(x);
        lm_free(xq);
        lm_free(y);
        lm_free(y2);
        lm_free(alone);
        lm_free(scratch);
    }
    pool_free(pool);
    CHECK(kernels_use(-1) == 0);
    CHECKF(!msg[0], "Q4_K %s", msg);
}

/* Q6_K's gemm tile against the variant's vec_dot, avx2's, the reference. */
static void test_q6_tiles(void) {
    enum { T = LM_GEMM_TILE };
    static const int64_t lens[] = {256, 768, 2816};
    const lm_avx2_kernels *a = avx2_kernels(LM_TYPE_Q6_K), *v = variants[cur].lookup(LM_TYPE_Q6_K);
    lm_gemm_fn g = avx512vnni_wide_gemm_q6_K;
    CHECK(a->vec_dot && v->vec_dot && v->gemm == g);
    CHECK(kernels_use(variants[cur].isa) == 0 && kernels_type(LM_TYPE_Q6_K)->gemm == g);
    CHECK(kernels_use(-1) == 0);
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int64_t n = lens[li];
        size_t rb = quant_row_size(LM_TYPE_Q6_K, n), xs = quant_row_size(LM_TYPE_Q8_K, n);
        uint8_t *w = lm_malloc(rb * T), *x = lm_malloc(xs * T);
        for (int r = 0; r < T; r++) make_weight_t(LM_TYPE_Q6_K, n, r % 2 == 1, w + (size_t)r * rb);
        float *xf = lm_malloc((size_t)T * (size_t)n * sizeof(float));
        fill_normal(xf, (int64_t)T * n, 1.0);
        for (int c = 0; c < T; c++) quant_from_float_ref(LM_TYPE_Q8_K, xf + (size_t)c * (size_t)n, x + (size_t)c * xs, n);
        char msg[200] = "";
        float y[T * T];
        for (int nr = 1; nr <= T && !msg[0]; nr++)
            for (int nc = 1; nc <= T && !msg[0]; nc++) {
                for (int i = 0; i < T * T; i++) y[i] = -1.0f;
                g(n, w, rb, nr, x, xs, nc, y, T);
                for (int c = 0; c < T && !msg[0]; c++)
                    for (int r = 0; r < T && !msg[0]; r++) {
                        const float got = y[c * T + r];
                        if (c >= nc || r >= nr) {
                            if (got != -1.0f) snprintf(msg, sizeof msg, "%dx%d wrote row %d token %d", nr, nc, r, c);
                            continue;
                        }
                        const float dv = v->vec_dot(n, w + (size_t)r * rb, x + (size_t)c * xs);
                        const float da = a->vec_dot(n, w + (size_t)r * rb, x + (size_t)c * xs);
                        double as, ref = ref_dot_t(LM_TYPE_Q6_K, n, w + (size_t)r * rb, x + (size_t)c * xs, &as);
                        if (memcmp(&got, &dv, sizeof got))
                            snprintf(msg, sizeof msg, "%dx%d row %d token %d: %.9g, the variant's vec_dot %.9g", nr,
                                     nc, r, c, got, dv);
                        else if (memcmp(&got, &da, sizeof got))
                            snprintf(msg, sizeof msg, "%dx%d row %d token %d: %.9g, avx2's vec_dot %.9g", nr, nc, r,
                                     c, got, da);
                        else if (!(fabs((double)got - ref) <= TOL * as + 1e-30))
                            snprintf(msg, sizeof msg, "row %d token %d: %.9g, reference %.9g", r, c, got, ref);
                    }
            }
        lm_free(w);
        lm_free(x);
        lm_free(xf);
        CHECKF(!msg[0], "Q6_K n=%lld: %s", (long long)n, msg);
    }
}

/* ops_matmul with Q6_K rows (row-major) through the variant's table. */
static void test_q6_matmul(void) {
    static const int64_t rows_list[] = {1, 3, 13, 37};
    enum { MAX_TOK = 64 };
    const int64_t n = 512;
    lm_pool *pool = pool_new(2);
    CHECK(pool);
    char msg[220] = "";
    for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0] && !msg[0]; ri++) {
        const int64_t rows = rows_list[ri];
        size_t rb = quant_row_size(LM_TYPE_Q6_K, n), xq_s = quant_row_size(LM_TYPE_Q8_K, n);
        uint8_t *w = lm_malloc(rb * (size_t)rows);
        for (int64_t r = 0; r < rows; r++) make_weight_t(LM_TYPE_Q6_K, n, r % 2 == 1, w + (size_t)r * rb);
        float *x = lm_malloc((size_t)MAX_TOK * (size_t)n * sizeof(float));
        fill_normal(x, (int64_t)MAX_TOK * n, 1.0);
        uint8_t *xq = lm_malloc(xq_s);
        size_t ny = (size_t)MAX_TOK * (size_t)rows;
        float *y = lm_malloc(ny * sizeof(float)), *y2 = lm_malloc(ny * sizeof(float));
        float *alone = lm_malloc(ny * sizeof(float));
        void *scratch = lm_malloc(ops_matmul_scratch(LM_TYPE_Q6_K, n, MAX_TOK));
        lm_weight lw = {.data = w, .type = LM_TYPE_Q6_K, .rows = rows, .cols = n, .row_bytes = rb};
        CHECK(kernels_use(variants[cur].isa) == 0);
        for (int t = 0; t < MAX_TOK; t++)
            ops_matmul(pool, alone + (size_t)t * (size_t)rows, &lw, x + (size_t)t * (size_t)n, 1, scratch);
        for (int t = 0; t < MAX_TOK && !msg[0]; t++) {
            quant_act_from_float(LM_TYPE_Q6_K, x + (size_t)t * (size_t)n, xq, n);
            for (int64_t r = 0; r < rows && !msg[0]; r++) {
                double as, ref = ref_dot_t(LM_TYPE_Q6_K, n, w + (size_t)r * rb, xq, &as);
                float got = alone[(size_t)t * (size_t)rows + (size_t)r];
                if (!(fabs((double)got - ref) <= TOL * as + 1e-30))
                    snprintf(msg, sizeof msg, "rows %lld: token %d row %lld: %.9g, reference %.9g", (long long)rows, t,
                             (long long)r, got, ref);
            }
        }
        for (int n_tok = 1; n_tok <= MAX_TOK && !msg[0]; n_tok++) {
            size_t m = (size_t)n_tok * (size_t)rows;
            CHECK(kernels_use(variants[cur].isa) == 0);
            ops_matmul(pool, y, &lw, x, n_tok, scratch);
            CHECK(kernels_use(LM_ISA_AVX2) == 0);
            ops_matmul(pool, y2, &lw, x, n_tok, scratch);
            if (!same_bits(y, alone, m))
                snprintf(msg, sizeof msg, "rows %lld batch %d: differs from its tokens alone", (long long)rows, n_tok);
            else if (!same_bits(y, y2, m))
                snprintf(msg, sizeof msg, "rows %lld batch %d: differs from the avx2 table's", (long long)rows, n_tok);
        }
        lm_free(w);
        lm_free(x);
        lm_free(xq);
        lm_free(y);
        lm_free(y2);
        lm_free(alone);
        lm_free(scratch);
    }
    pool_free(pool);
    CHECK(kernels_use(-1) == 0);
    CHECKF(!msg[0], "Q6_K %s", msg);
}

int main(void) {
    if (!cpu_has_avx2()) {
        printf("SKIP test_kernels_wide: this CPU (or OS) lacks AVX2/FMA/F16C\n");
        return TEST_DONE();
    }
    lm_rng_seed(&rng, 20261203);
    unsetenv("LAMINA_NO_REPACK"); /* the wide tile runs on the interleaved copies */
    for (cur = 0; cur < N_VARIANTS; cur++) {
        if (!kernels_cpu_has(variants[cur].isa) || !avx512vnni_wide_kernel(LM_TYPE_Q4_K)) {
            printf("NOT RUN %s: this CPU (or OS, or build) does not run it\n", variants[cur].name);
            continue;
        }
        printf("variant %s\n", variants[cur].name);
        TEST_RUN(test_table);
        TEST_RUN(test_tiles);
        TEST_RUN(test_matmul);
        TEST_RUN(test_q6_tiles);
        TEST_RUN(test_q6_matmul);
    }
    return TEST_DONE();
}
