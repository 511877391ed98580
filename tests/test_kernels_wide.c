/*
 * test_kernels_wide.c - the avx512vnni variant's 512-bit prefill tile for
 * Q4_K (kernels/x86_wide.h: two interleaved groups, 16 rows, against up to
 * 8 tokens).
 *
 * For avx512vnni and avx512bf16 (which takes avx512vnni's tiles), where
 * this CPU runs them (otherwise each check is printed as "NOT RUN <check>
 * on <variant>" with the reason and counted as skipped, never as passed):
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
 * Without AVX2 (an Arm CPU, say) every check of both variants is NOT RUN.
 * The helpers are tests/kernel_check.h's.
 */
#include "kernels/kernels.h"
#include "kernels/x86.h"
#include "kernels/x86_wide.h"

#include "kernel_check.h"

static const struct {
    lm_isa isa;
    const char *name;
    const lm_avx2_kernels *(*lookup)(uint32_t);
} variants[] = {{LM_ISA_AVX512VNNI, "avx512vnni", avx512vnni_kernels},
                {LM_ISA_AVX512BF16, "avx512bf16", avx512bf16_kernels}};
#define N_VARIANTS (sizeof variants / sizeof variants[0])

static size_t cur;

/* A type's entry: the wide tile for Q4_K only, with the group tile beside
 * it and the widths it covers. */
static bool wide_entry(const lm_type_kernels *k, uint32_t t) {
    const bool want = t == LM_TYPE_Q4_K;
    return !!k->packed_wide == want &&
        (!want ||
         (k->packed_wide == avx512vnni_wide_kernel(t) && k->packed_gemm && k->pack_tile <= LM_WIDE_TILE &&
          k->pair_tile < k->pack_tile));
}

static bool has_wide(const lm_type_kernels *k, uint32_t t) { return k->packed_wide != NULL; }

/* The table: the wide tile for Q4_K in the VNNI variants only (not in the
 * avx2 and avx512 tables), none with LAMINA_NO_REPACK (the environment is
 * restored after). */
static void test_table(void) {
    static const lm_isa others[] = {LM_ISA_AVX2, LM_ISA_AVX512};
    char msg[120] = "";
    check_tile_table(variants[cur].isa, "wide", wide_entry, has_wide, others, 2, msg, sizeof msg);
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
        for (int r = 0; r < rows; r++) make_weight_keep_scales(LM_TYPE_Q4_K, n, r % 3 == 1, w + (size_t)r * rb);
        quant_pack(LM_TYPE_Q4_K, w, rb, rows, n, wp);
        float *xf = lm_malloc((size_t)T * (size_t)n * sizeof(float));
        fill_normal(xf, (int64_t)T * n, 1.0);
        uint8_t *x = lm_malloc(xs * T);
        for (int c = 0; c < T; c++)
            quant_from_float_ref(LM_TYPE_Q8_K, xf + (size_t)c * (size_t)n, x + (size_t)c * xs, n);
        double ref[T * 16], as[T * 16];
        for (int c = 0; c < T; c++)
            for (int r = 0; r < rows; r++)
                ref[c * 16 + r] = deq_dot(LM_TYPE_Q4_K, n, w + (size_t)r * rb, x + (size_t)c * xs, &as[c * 16 + r]);
        char msg[200] = "";
        check_two_group_tile(wide, v->packed_gemm, a->packed_gemm, n, wp, gb, x, xs, T, ref, as, msg, sizeof msg);
        lm_free(w);
        lm_free(wp);
        lm_free(xf);
        lm_free(x);
        CHECKF(!msg[0], "Q4_K n=%lld: %s", (long long)n, msg);
    }
}

/* ops_matmul of wt through the variant's table, rows rows_list (n of
 * them) of 512 columns, 1..64 tokens, against the avx2 table's. */
static void check_matmul_rows(uint32_t wt, const int64_t *rows_list, size_t n, kc_entry_fn entry_ok) {
    lm_pool *pool = pool_new(2);
    CHECK(pool);
    char msg[220] = "";
    for (size_t ri = 0; ri < n && !msg[0]; ri++)
        check_matmul_vs_avx2(pool, variants[cur].isa, wt, rows_list[ri], 512, 64, true, entry_ok, msg, sizeof msg);
    pool_free(pool);
    CHECK(kernels_use(-1) == 0);
    CHECKF(!msg[0], "%s", msg);
}

/* ops_matmul through the table: pairs, lone groups and partial groups,
 * 1..64 tokens. */
static void test_matmul(void) {
    static const int64_t rows_list[] = {8, 13, 16, 24, 37, 40};
    check_matmul_rows(LM_TYPE_Q4_K, rows_list, sizeof rows_list / sizeof rows_list[0], has_wide);
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
        for (int r = 0; r < T; r++) make_weight_keep_scales(LM_TYPE_Q6_K, n, r % 2 == 1, w + (size_t)r * rb);
        float *xf = lm_malloc((size_t)T * (size_t)n * sizeof(float));
        fill_normal(xf, (int64_t)T * n, 1.0);
        for (int c = 0; c < T; c++)
            quant_from_float_ref(LM_TYPE_Q8_K, xf + (size_t)c * (size_t)n, x + (size_t)c * xs, n);
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
                        double as, ref = deq_dot(LM_TYPE_Q6_K, n, w + (size_t)r * rb, x + (size_t)c * xs, &as);
                        if (memcmp(&got, &dv, sizeof got))
                            snprintf(msg, sizeof msg, "%dx%d row %d token %d: %.9g, the variant's vec_dot %.9g", nr, nc,
                                     r, c, got, dv);
                        else if (memcmp(&got, &da, sizeof got))
                            snprintf(msg, sizeof msg, "%dx%d row %d token %d: %.9g, avx2's vec_dot %.9g", nr, nc, r, c,
                                     got, da);
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
    check_matmul_rows(LM_TYPE_Q6_K, rows_list, sizeof rows_list / sizeof rows_list[0], NULL);
}

int main(void) {
    lm_rng_seed(&rng, 20261203);
    unsetenv("LAMINA_NO_REPACK"); /* the wide tile runs on the interleaved copies */
    for (cur = 0; cur < N_VARIANTS; cur++) {
        kc_variant(variants[cur].name,
                   !cpu_has_avx2() ? "this CPU (or OS) lacks AVX2/FMA/F16C"
                       : !kernels_cpu_has(variants[cur].isa) || !avx512vnni_wide_kernel(LM_TYPE_Q4_K)
                       ? "this CPU (or OS, or build) does not run it"
                       : NULL);
        KC_CHECK(test_table);
        KC_CHECK(test_tiles);
        KC_CHECK(test_matmul);
        KC_CHECK(test_q6_tiles);
        KC_CHECK(test_q6_matmul);
    }
    return kc_done();
}
