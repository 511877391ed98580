/*
 * test_kernels_pair.c - the AVX-512 variants' 512-bit decode tiles
 * (kernels/x86_pair.h: two interleaved groups of Q4_0, Q5_0, Q4_1, Q5_1,
 * Q8_0 or Q4_K rows against 1..4 tokens).
 *
 * For avx512, avx512vnni and avx512bf16 (which takes avx512vnni's tiles),
 * where this CPU runs them (otherwise each check is printed as "NOT RUN
 * <check> on <variant>" with the reason and counted as skipped, never as
 * passed):
 *  - the kernel table holds the pair tile for those six types (and for
 *    nothing else), none with LAMINA_NO_REPACK, none in the avx2 table;
 *  - pair tiles on reference-quantized and random-byte weights (Q4_K: its
 *    scale bytes random too), lengths of 1, 3, 18 and 88 blocks (Q4_K: 1,
 *    3 and 11 super-blocks), every row count 9..16 and 1..4 tokens: each
 *    output bit-identical (memcmp) to the same variant's packed_gemm on
 *    each group and to avx2's, and within 1e-5 * sum |w x| of the float64
 *    dot of the dequantized weight and activation rows;
 *  - the integer sums at their bounds (Q4_0, Q5_0, Q8_0 quant bytes all at
 *    one extreme pattern, tokens whose quants are all +-127): bit-identical
 *    to avx2's packed_gemm and within the same bound of the reference;
 *  - ops_matmul on two threads with the table switched to the variant,
 *    shapes whose rows end in a pair, a lone group and a partial group
 *    (rows 8, 13, 16, 24, 37, 40; row-major Q6_K beside them), batches of
 *    1..12 tokens: each token's outputs bit-identical to that token alone
 *    (batch invariance within the variant) and to the avx2 table's, and
 *    within the same bound of the reference.
 * Without AVX2 (an Arm CPU, say) every check of every variant is NOT RUN.
 * The helpers are tests/kernel_check.h's.
 */
#include "kernels/kernels.h"
#include "kernels/x86.h"
#include "kernels/x86_pair.h"

#include "kernel_check.h"

static const struct {
    lm_isa isa;
    const char *name;
    const lm_avx2_kernels *(*lookup)(uint32_t);
    lm_packed_gemm_fn (*pair)(uint32_t);
} variants[] = {{LM_ISA_AVX512, "avx512", avx512_kernels, avx512_pair_kernel},
                {LM_ISA_AVX512VNNI, "avx512vnni", avx512vnni_kernels, avx512vnni_pair_kernel},
                {LM_ISA_AVX512BF16, "avx512bf16", avx512bf16_kernels, avx512vnni_pair_kernel}};
#define N_VARIANTS (sizeof variants / sizeof variants[0])

static const uint32_t pair_types[] = {LM_TYPE_Q4_0, LM_TYPE_Q5_0, LM_TYPE_Q4_1,
                                      LM_TYPE_Q5_1, LM_TYPE_Q8_0, LM_TYPE_Q4_K};
#define N_PAIR_TYPES (sizeof pair_types / sizeof pair_types[0])
/* ops_matmul's types: the pair tiles', and row-major Q6_K (no pair tile:
 * its products are untouched by them) */
static const uint32_t mm_types[] = {LM_TYPE_Q4_0, LM_TYPE_Q5_0, LM_TYPE_Q4_1, LM_TYPE_Q5_1,
                                    LM_TYPE_Q8_0, LM_TYPE_Q4_K, LM_TYPE_Q6_K};

static size_t cur;

/* A type's entry: the variant's pair tile for those types only. */
static bool pair_entry(const lm_type_kernels *k, uint32_t t) {
    bool want = false;
    for (size_t i = 0; i < N_PAIR_TYPES; i++) want = want || t == pair_types[i];
    return !!k->packed_pair == want && k->pair_tile == (want ? LM_PAIR_TILE : 0) &&
        (!want || (k->packed_pair == variants[cur].pair(t) && k->packed_gemm));
}

static bool has_pair(const lm_type_kernels *k, uint32_t t) { return k->packed_pair != NULL; }

/* The table: pair tiles for those types in the AVX-512 variants only (not
 * in the avx2 table), none with LAMINA_NO_REPACK (the environment is
 * restored after). */
static void test_table(void) {
    static const lm_isa others[] = {LM_ISA_AVX2};
    char msg[120] = "";
    check_tile_table(variants[cur].isa, "pair", pair_entry, has_pair, others, 1, msg, sizeof msg);
    CHECK(kernels_use(-1) == 0);
    CHECKF(!msg[0], "%s", msg);
}

/* Pair tiles against packed_gemm (this variant's and avx2's) and the reference. */
static void test_tiles(void) {
    static const int64_t ql[] = {32, 96, 576, 2816};
    static const int64_t kl[] = {256, 768, 2816};
    for (size_t ti = 0; ti < N_PAIR_TYPES; ti++) {
        const uint32_t wt = pair_types[ti];
        const bool kq = wt == LM_TYPE_Q4_K;
        const lm_avx2_kernels *a = avx2_kernels(wt), *v = variants[cur].lookup(wt);
        lm_packed_gemm_fn pair = variants[cur].pair(wt);
        CHECK(pair && a->packed_gemm && v->packed_gemm);
        const int64_t *lens = kq ? kl : ql;
        for (size_t li = 0; li < (kq ? 3u : 4u); li++) {
            const int64_t n = lens[li];
            const int rows = 16;
            size_t rb = quant_row_size(wt, n), gb = quant_pack_size(wt, 8, n);
            size_t xs = kq ? quant_row_size(LM_TYPE_Q8_K, n) : quant_packed_act_row_size(n);
            size_t xq_s = quant_row_size(quant_traits(wt)->vec_dot_type, n);
            uint8_t *w = lm_malloc(rb * rows), *wp = lm_malloc(quant_pack_size(wt, rows, n));
            for (int r = 0; r < rows; r++) make_weight_keep_scales(wt, n, r % 3 == 1, w + (size_t)r * rb);
            quant_pack(wt, w, rb, rows, n, wp);
            float *xf = lm_malloc((size_t)LM_PAIR_TILE * (size_t)n * sizeof(float));
            fill_normal(xf, (int64_t)LM_PAIR_TILE * n, 1.0);
            uint8_t *x = lm_malloc(xs * LM_PAIR_TILE), *xq = lm_malloc(xq_s * LM_PAIR_TILE);
            for (int c = 0; c < LM_PAIR_TILE; c++) {
                if (kq) quant_from_float_ref(LM_TYPE_Q8_K, xf + (size_t)c * (size_t)n, x + (size_t)c * xs, n);
                else quant_packed_act_ref(xf + (size_t)c * (size_t)n, x + (size_t)c * xs, n);
                quant_act_from_float(wt, xf + (size_t)c * (size_t)n, xq + (size_t)c * xq_s, n);
            }
            double ref[LM_PAIR_TILE * 16], as[LM_PAIR_TILE * 16];
            for (int c = 0; c < LM_PAIR_TILE; c++)
                for (int r = 0; r < rows; r++)
                    ref[c * 16 + r] = deq_dot(wt, n, w + (size_t)r * rb, xq + (size_t)c * xq_s, &as[c * 16 + r]);
            char msg[200] = "";
            check_two_group_tile(pair, v->packed_gemm, a->packed_gemm, n, wp, gb, x, xs, LM_PAIR_TILE, ref, as, msg,
                                 sizeof msg);
            lm_free(w);
            lm_free(wp);
            lm_free(xf);
            lm_free(x);
            lm_free(xq);
            CHECKF(!msg[0], "%s n=%lld: %s", quant_type_name(wt), (long long)n, msg);
        }
    }
}

/* The integer sums at their bounds: Q4_0, Q5_0 and Q8_0 rows whose quant
 * bytes all take one extreme pattern (Q4_0: nibbles 15 everywhere, where
 * the VNNI tile sums the high nibbles in place as 16 q up to 240; 0;
 * 15 in the low nibbles only; in the high only; Q8_0: 127, -128, the sign
 * alternating), against tokens whose every quant is +127 or -127 (or
 * alternating): each output bit-identical to avx2's packed_gemm and
 * within the bound of the reference, for 1..4 tokens and 88 blocks. */
static void test_extremes(void) {
    static const uint32_t types[] = {LM_TYPE_Q4_0, LM_TYPE_Q5_0, LM_TYPE_Q8_0};
    static const uint8_t pat[] = {0xFF, 0x00, 0x0F, 0xF0, 0x7F, 0x80, 0x81};
    const int64_t n = 2816;
    char msg[200] = "";
    for (size_t ti = 0; ti < sizeof types / sizeof types[0] && !msg[0]; ti++) {
        const uint32_t wt = types[ti];
        const lm_avx2_kernels *a = avx2_kernels(wt);
        lm_packed_gemm_fn pair = variants[cur].pair(wt);
        CHECK(pair && a->packed_gemm);
        const size_t bs = quant_traits(wt)->type_size, nb = (size_t)(n / 32);
        const size_t rb = quant_row_size(wt, n), gb = quant_pack_size(wt, 8, n);
        const size_t xs = quant_packed_act_row_size(n), xq_s = quant_row_size(quant_traits(wt)->vec_dot_type, n);
        uint8_t *w = lm_malloc(rb * 16), *wp = lm_malloc(quant_pack_size(wt, 16, n));
        uint8_t *x = lm_malloc(xs * LM_PAIR_TILE), *xq = lm_malloc(xq_s * LM_PAIR_TILE);
        float *xf = lm_malloc((size_t)n * sizeof(float));
        for (size_t pi = 0; pi < sizeof pat && !msg[0]; pi++) {
            for (int r = 0; r < 16; r++) {
                make_weight_keep_scales(wt, n, false, w + (size_t)r * rb);
                for (size_t b = 0; b < nb; b++) /* every byte past the f16 scale (Q5_0: qh too) */
                    for (size_t i = 2; i < bs; i++)
                        w[(size_t)r * rb + b * bs + i] = (uint8_t)(pat[pi] ^ (r == 5 ? 0x11 : 0));
            }
            quant_pack(wt, w, rb, 16, n, wp);
            for (int c = 0; c < LM_PAIR_TILE; c++) { /* +127, -127, alternating, +127 with one -127 per block */
                for (int64_t i = 0; i < n; i++)
                    xf[i] = c == 1 ? -1.0f : c == 2 ? (i & 1 ? -1.0f : 1.0f) : c == 3 && i % 32 == 7 ? -1.0f : 1.0f;
                quant_packed_act_ref(xf, x + (size_t)c * xs, n);
                quant_act_from_float(wt, xf, xq + (size_t)c * xq_s, n);
            }
            float y[LM_PAIR_TILE * 16], y1[LM_PAIR_TILE * 16];
            for (int nc = 1; nc <= LM_PAIR_TILE && !msg[0]; nc++) {
                for (int i = 0; i < LM_PAIR_TILE * 16; i++) y[i] = y1[i] = -1.0f;
                pair(n, wp, 16, x, xs, nc, y, 16);
                a->packed_gemm(n, wp, 8, x, xs, nc, y1, 16);
                a->packed_gemm(n, wp + gb, 8, x, xs, nc, y1 + 8, 16);
                if (!bits_equal(y, y1, LM_PAIR_TILE * 16))
                    snprintf(msg, sizeof msg, "%s pattern 0x%02x, %d tokens: differs from avx2's packed_gemm",
                             quant_type_name(wt), pat[pi], nc);
                for (int c = 0; c < nc && !msg[0]; c++)
                    for (int r = 0; r < 16 && !msg[0]; r++) {
                        double as, ref = deq_dot(wt, n, w + (size_t)r * rb, xq + (size_t)c * xq_s, &as);
                        if (!(fabs((double)y[c * 16 + r] - ref) <= TOL * as + 1e-30))
                            snprintf(msg, sizeof msg, "%s pattern 0x%02x row %d token %d: %.9g, reference %.9g",
                                     quant_type_name(wt), pat[pi], r, c, y[c * 16 + r], ref);
                    }
            }
        }
        lm_free(w);
        lm_free(wp);
        lm_free(x);
        lm_free(xq);
        lm_free(xf);
    }
    CHECKF(!msg[0], "%s", msg);
}

/* The variant's table holds a pair tile for t exactly when it is not Q6_K. */
static bool mm_entry(const lm_type_kernels *k, uint32_t t) { return !k->packed_pair == (t == LM_TYPE_Q6_K); }

/* ops_matmul through the table: pairs, lone groups and partial groups. */
static void test_matmul(void) {
    static const int64_t rows_list[] = {8, 13, 16, 24, 37, 40};
    lm_pool *pool = pool_new(2);
    CHECK(pool);
    char msg[220] = "";
    for (size_t ti = 0; ti < sizeof mm_types / sizeof mm_types[0] && !msg[0]; ti++)
        for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0] && !msg[0]; ri++) {
            const uint32_t wt = mm_types[ti];
            const bool kq = wt == LM_TYPE_Q4_K || wt == LM_TYPE_Q6_K;
            check_matmul_vs_avx2(pool, variants[cur].isa, wt, rows_list[ri], kq ? 512 : 320, 12, wt != LM_TYPE_Q6_K,
                                 mm_entry, msg, sizeof msg);
        }
    pool_free(pool);
    CHECK(kernels_use(-1) == 0);
    CHECKF(!msg[0], "%s", msg);
}

int main(void) {
    lm_rng_seed(&rng, 20261202);
    unsetenv("LAMINA_NO_REPACK"); /* the pair tiles run on the interleaved copies */
    for (cur = 0; cur < N_VARIANTS; cur++) {
        kc_variant(variants[cur].name,
                   !cpu_has_avx2() ? "this CPU (or OS) lacks AVX2/FMA/F16C"
                       : !kernels_cpu_has(variants[cur].isa) || !variants[cur].pair(LM_TYPE_Q4_0)
                       ? "this CPU (or OS, or build) does not run it"
                       : NULL);
        KC_CHECK(test_table);
        KC_CHECK(test_tiles);
        KC_CHECK(test_extremes);
        KC_CHECK(test_matmul);
    }
    return kc_done();
}
