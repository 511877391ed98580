/*
 * test_kernels_pair.c - the AVX-512 variants' 512-bit decode tiles
 * (kernels/x86_pair.h: two interleaved groups of Q4_0, Q5_0, Q4_1, Q5_1,
 * Q8_0 or Q4_K rows against 1..4 tokens).
 *
 * For avx512, avx512vnni and avx512bf16 (which takes avx512vnni's tiles),
 * where this CPU runs them (otherwise printed
 * as "NOT RUN <variant>", never counted as passed):
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
 * Without AVX2 the program prints a SKIP line and counts nothing.
 */
#include "kernels/kernels.h"
#include "kernels/x86.h"
#include "kernels/x86_pair.h"

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
    lm_packed_gemm_fn (*pair)(uint32_t);
} variants[] = {{LM_ISA_AVX512, "avx512", avx512_kernels, avx512_pair_kernel},
                {LM_ISA_AVX512VNNI, "avx512vnni", avx512vnni_kernels, avx512vnni_pair_kernel},
                {LM_ISA_AVX512BF16, "avx512bf16", avx512bf16_kernels, avx512vnni_pair_kernel}};
#define N_VARIANTS (sizeof variants / sizeof variants[0])

static const uint32_t pair_types[] = {LM_TYPE_Q4_0, LM_TYPE_Q5_0, LM_TYPE_Q4_1, LM_TYPE_Q5_1, LM_TYPE_Q8_0, LM_TYPE_Q4_K};
#define N_PAIR_TYPES (sizeof pair_types / sizeof pair_types[0])
/* ops_matmul's types: the pair tiles', and row-major Q6_K (no pair tile:
 * its products are untouched by them) */
static const uint32_t mm_types[] = {LM_TYPE_Q4_0, LM_TYPE_Q5_0, LM_TYPE_Q4_1, LM_TYPE_Q5_1,
                                    LM_TYPE_Q8_0, LM_TYPE_Q4_K, LM_TYPE_Q6_K};

static lm_rng rng;
static size_t cur;

static void fill_normal(float *x, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(lm_rng_normal(&rng) * scale);
}

/* A weight row: reference-quantized Gaussian floats, or random quant bytes
 * (Q4_0, Q5_0, Q8_0: all but the f16 scale; Q4_1, Q5_1: all but d and m;
 * Q4_K: all but d and dmin, so the
 * 6-bit scales and mins are random too). */
static void make_weight(uint32_t type, int64_t n, bool random_bytes, uint8_t *dst) {
    float *f = lm_malloc((size_t)n * sizeof(float));
    fill_normal(f, n, 0.5);
    quant_from_float_ref(type, f, dst, n);
    if (random_bytes) {
        size_t bs = quant_traits(type)->type_size, nb = (size_t)(n / quant_traits(type)->blck);
        size_t lo = type == LM_TYPE_Q4_K || type == LM_TYPE_Q4_1 || type == LM_TYPE_Q5_1 ? 4 : 2;
        for (size_t b = 0; b < nb; b++)
            for (size_t i = lo; i < bs; i++) dst[b * bs + i] = (uint8_t)lm_rng_u64(&rng);
    }
    lm_free(f);
}

static bool same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof *a) == 0; }

/* float64 dot of a weight row and an activation row (its vec_dot_type
 * bytes), both dequantized by the reference; *abs_sum gets sum |w x|. */
static double ref_dot(uint32_t wt, int64_t n, const uint8_t *w, const uint8_t *xq, double *abs_sum) {
    uint32_t at = quant_traits(wt)->vec_dot_type;
    float *wf = lm_malloc((size_t)n * sizeof(float)), *xf = lm_malloc((size_t)n * sizeof(float));
    quant_to_float_ref(wt, w, wf, n);
    quant_to_float_ref(at, xq, xf, n);
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

/* The table: pair tiles for those types in the AVX-512 variants only,
 * none with LAMINA_NO_REPACK (the environment is restored after). */
static void test_table(void) {
    const char *old = getenv("LAMINA_NO_REPACK");
    char saved[64] = "", msg[120] = "";
    if (old) snprintf(saved, sizeof saved, "%s", old);
    unsetenv("LAMINA_NO_REPACK");
    if (kernels_use(variants[cur].isa) != 0) snprintf(msg, sizeof msg, "cannot switch to the variant");
    for (uint32_t t = 0; t < LM_TYPE_COUNT && !msg[0]; t++) {
        const lm_type_kernels *k = kernels_type(t);
        if (!k) continue;
        bool want = false;
        for (size_t i = 0; i < N_PAIR_TYPES; i++) want = want || t == pair_types[i];
        if (!!k->packed_pair != want || k->pair_tile != (want ? LM_PAIR_TILE : 0) ||
            (want && (k->packed_pair != variants[cur].pair(t) || !k->packed_gemm)))
            snprintf(msg, sizeof msg, "%s: pair entry", quant_type_name(t));
    }
    if (!msg[0] && kernels_use(LM_ISA_AVX2) != 0) snprintf(msg, sizeof msg, "cannot switch to avx2");
    for (uint32_t t = 0; t < LM_TYPE_COUNT && !msg[0]; t++)
        if (kernels_type(t) && kernels_type(t)->packed_pair) snprintf(msg, sizeof msg, "avx2 has a pair tile");
    setenv("LAMINA_NO_REPACK", "1", 1);
    if (!msg[0] && kernels_use(variants[cur].isa) != 0) snprintf(msg, sizeof msg, "cannot switch to the variant");
    for (size_t i = 0; i < N_PAIR_TYPES && !msg[0]; i++)
        if (kernels_type(pair_types[i])->packed_pair) snprintf(msg, sizeof msg, "a pair tile with LAMINA_NO_REPACK");
    if (old) setenv("LAMINA_NO_REPACK", saved, 1);
    else unsetenv("LAMINA_NO_REPACK");
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
            for (int r = 0; r < rows; r++) make_weight(wt, n, r % 3 == 1, w + (size_t)r * rb);
            quant_pack(wt, w, rb, rows, n, wp);
            float *xf = lm_malloc((size_t)LM_PAIR_TILE * (size_t)n * sizeof(float));
            fill_normal(xf, (int64_t)LM_PAIR_TILE * n, 1.0);
            uint8_t *x = lm_malloc(xs * LM_PAIR_TILE), *xq = lm_malloc(xq_s * LM_PAIR_TILE);
            for (int c = 0; c < LM_PAIR_TILE; c++) {
                if (kq) quant_from_float_ref(LM_TYPE_Q8_K, xf + (size_t)c * (size_t)n, x + (size_t)c * xs, n);
                else quant_packed_act_ref(xf + (size_t)c * (size_t)n, x + (size_t)c * xs, n);
                quant_act_from_float(wt, xf + (size_t)c * (size_t)n, xq + (size_t)c * xq_s, n);
            }
            char msg[200] = "";
            float y[LM_PAIR_TILE * 16], y0[LM_PAIR_TILE * 16], y1[LM_PAIR_TILE * 16];
            for (int nr = 9; nr <= 16 && !msg[0]; nr++)
                for (int nc = 1; nc <= LM_PAIR_TILE && !msg[0]; nc++) {
                    for (int i = 0; i < LM_PAIR_TILE * 16; i++) y[i] = y0[i] = y1[i] = -1.0f;
                    pair(n, wp, nr, x, xs, nc, y, 16);
                    v->packed_gemm(n, wp, 8, x, xs, nc, y0, 16);
                    v->packed_gemm(n, wp + gb, nr - 8, x, xs, nc, y0 + 8, 16);
                    a->packed_gemm(n, wp, 8, x, xs, nc, y1, 16);
                    a->packed_gemm(n, wp + gb, nr - 8, x, xs, nc, y1 + 8, 16);
                    if (!same_bits(y, y0, LM_PAIR_TILE * 16))
                        snprintf(msg, sizeof msg, "%d rows x %d tokens differ from the variant's packed_gemm", nr, nc);
                    else if (!same_bits(y, y1, LM_PAIR_TILE * 16))
                        snprintf(msg, sizeof msg, "%d rows x %d tokens differ from avx2's packed_gemm", nr, nc);
                    for (int c = 0; c < nc && !msg[0]; c++)
                        for (int r = 0; r < nr && !msg[0]; r++) {
                            double as, ref = ref_dot(wt, n, w + (size_t)r * rb, xq + (size_t)c * xq_s, &as);
                            if (!(fabs((double)y[c * 16 + r] - ref) <= TOL * as + 1e-30))
                                snprintf(msg, sizeof msg, "row %d token %d: %.9g, reference %.9g", r, c,
                                         y[c * 16 + r], ref);
                        }
                    for (int c = nc; c < LM_PAIR_TILE && !msg[0]; c++) /* nothing past nc, nr written */
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
                make_weight(wt, n, false, w + (size_t)r * rb);
                for (size_t b = 0; b < nb; b++) /* every byte past the f16 scale (Q5_0: qh too) */
                    for (size_t i = 2; i < bs; i++) w[(size_t)r * rb + b * bs + i] = (uint8_t)(pat[pi] ^ (r == 5 ? 0x11 : 0));
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
                if (!same_bits(y, y1, LM_PAIR_TILE * 16))
                    snprintf(msg, sizeof msg, "%s pattern 0x%02x, %d tokens: differs from avx2's packed_gemm",
                             quant_type_name(wt), pat[pi], nc);
                for (int c = 0; c < nc && !msg[0]; c++)
                    for (int r = 0; r < 16 && !msg[0]; r++) {
                        double as, ref = ref_dot(wt, n, w + (size_t)r * rb, xq + (size_t)c * xq_s, &as);
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

/* ops_matmul through the table: pairs, lone groups and partial groups. */
static void test_matmul(void) {
    static const int64_t rows_list[] = {8, 13, 16, 24, 37, 40};
    enum { MAX_TOK = 12 };
    lm_pool *pool = pool_new(2);
    CHECK(pool);
    char msg[220] = "";
    for (size_t ti = 0; ti < sizeof mm_types / sizeof mm_types[0] && !msg[0]; ti++)
        for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0] && !msg[0]; ri++) {
            const uint32_t wt = mm_types[ti];
            const bool kq = wt == LM_TYPE_Q4_K || wt == LM_TYPE_Q6_K, q6 = wt == LM_TYPE_Q6_K;
            const int64_t rows = rows_list[ri], n = kq ? 512 : 320;
            size_t rb = quant_row_size(wt, n), xq_s = quant_row_size(quant_traits(wt)->vec_dot_type, n);
            uint8_t *w = lm_malloc(rb * (size_t)rows), *wp = q6 ? NULL : lm_malloc(quant_pack_size(wt, rows, n));
            for (int64_t r = 0; r < rows; r++) make_weight(wt, n, !q6 && r % 2 == 1, w + (size_t)r * rb);
            if (wp) quant_pack(wt, w, rb, rows, n, wp);
            float *x = lm_malloc((size_t)MAX_TOK * (size_t)n * sizeof(float));
            fill_normal(x, (int64_t)MAX_TOK * n, 1.0);
            uint8_t *xq = lm_malloc(xq_s);
            size_t ny = (size_t)MAX_TOK * (size_t)rows;
            float *y = lm_malloc(ny * sizeof(float)), *y2 = lm_malloc(ny * sizeof(float));
            float *alone = lm_malloc(ny * sizeof(float));
            void *scratch = lm_malloc(ops_matmul_scratch(wt, n, MAX_TOK));
            lm_weight lw = {.data = w, .type = wt, .rows = rows, .cols = n, .row_bytes = rb, .packed = wp};
            CHECK(kernels_use(variants[cur].isa) == 0 && !kernels_type(wt)->packed_pair == q6);
            for (int t = 0; t < MAX_TOK; t++)
                ops_matmul(pool, alone + (size_t)t * (size_t)rows, &lw, x + (size_t)t * (size_t)n, 1, scratch);
            for (int t = 0; t < MAX_TOK && !msg[0]; t++) { /* each token alone against the reference */
                quant_act_from_float(wt, x + (size_t)t * (size_t)n, xq, n);
                for (int64_t r = 0; r < rows && !msg[0]; r++) {
                    double as, ref = ref_dot(wt, n, w + (size_t)r * rb, xq, &as);
                    float got = alone[(size_t)t * (size_t)rows + (size_t)r];
                    if (!(fabs((double)got - ref) <= TOL * as + 1e-30))
                        snprintf(msg, sizeof msg, "%s rows %lld: token %d row %lld: %.9g, reference %.9g",
                                 quant_type_name(wt), (long long)rows, t, (long long)r, got, ref);
                }
            }
            for (int n_tok = 1; n_tok <= MAX_TOK && !msg[0]; n_tok++) {
                size_t m = (size_t)n_tok * (size_t)rows;
                CHECK(kernels_use(variants[cur].isa) == 0);
                ops_matmul(pool, y, &lw, x, n_tok, scratch);
                CHECK(kernels_use(LM_ISA_AVX2) == 0);
                ops_matmul(pool, y2, &lw, x, n_tok, scratch);
                if (!same_bits(y, alone, m))
                    snprintf(msg, sizeof msg, "%s rows %lld batch %d: differs from its tokens alone",
                             quant_type_name(wt), (long long)rows, n_tok);
                else if (!same_bits(y, y2, m))
                    snprintf(msg, sizeof msg, "%s rows %lld batch %d: differs from the avx2 table's",
                             quant_type_name(wt), (long long)rows, n_tok);
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
    CHECKF(!msg[0], "%s", msg);
}

int main(void) {
    if (!cpu_has_avx2()) {
        printf("SKIP test_kernels_pair: this CPU (or OS) lacks AVX2/FMA/F16C\n");
        return TEST_DONE();
    }
    lm_rng_seed(&rng, 20261202);
    unsetenv("LAMINA_NO_REPACK"); /* the pair tiles run on the interleaved copies */
    for (cur = 0; cur < N_VARIANTS; cur++) {
        if (!kernels_cpu_has(variants[cur].isa) || !variants[cur].pair(LM_TYPE_Q4_0)) {
            printf("NOT RUN %s: this CPU (or OS, or build) does not run it\n", variants[cur].name);
            continue;
        }
        printf("variant %s\n", variants[cur].name);
        TEST_RUN(test_table);
        TEST_RUN(test_tiles);
        TEST_RUN(test_extremes);
        TEST_RUN(test_matmul);
    }
    return TEST_DONE();
}
