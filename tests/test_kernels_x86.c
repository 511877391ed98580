/*
 * test_kernels_x86.c - the x86 kernel variants (avxvnni, avx512, avx512vnni,
 * avx512bf16: kernels/x86.h) and LAMINA_CPU.
 *
 * For every variant this CPU runs (the others are printed by name as
 * "NOT RUN", never counted as passed):
 *  - its lookup has an entry wherever avx2's has one (same tile sizes);
 *  - vec_dot on random rows of every weight type (reference-quantized and
 *    random block bytes, lengths with tails and partial groups of 8 blocks)
 *    and gemm tiles of every nr, nc in 1..4: bit-identical (memcmp) to the
 *    AVX2 kernels', and within 1e-5 * sum |w x| of quant_vec_dot_ref;
 *  - packed tiles (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, MXFP4, Q4_K, F16 panels), every
 *    width 1..8 and every row count 1..8: bit-identical to AVX2's;
 *  - activation quantizers (Q8_0, Q8_K, F16, block_q8_0s) and KV
 *    conversions: byte-identical to AVX2's (which equal the reference's);
 *  - through ops_matmul with the table switched to the variant
 *    (kernels_use), on two threads, for every batch of 1 to 64 tokens and
 *    odd shapes (rows 37, 13, 3; lengths of 1, 3, 18 blocks and more),
 *    packed and row-major, every quantized type: each output within
 *    1e-5 * sum |w x| of the scalar reference (quant_vec_dot_ref on the
 *    token's activation row), each token's outputs bit-identical to the
 *    same token computed alone (batch invariance within the variant), and
 *    bit-identical to the avx2 table's outputs (batches 1..9, 17, 33, 64).
 * avx512bf16 is held to all of the above except for BF16 weights, whose
 * vdpbf16ps kernels (kernels/avx512bf16_dot.c) round the activations to
 * BF16; for them (test_bf16):
 *  - the table: BF16 has the variant's vec_dot and gemm, every other type
 *    avx512vnni's entries;
 *  - vec_dot at lengths 1 to 4096 (tails of every size class), activations
 *    of scales 1e-3 to 1e3: within (2^-8 + (n/16 + 8) 2^-24) sum |w x| of
 *    the float64 dot, and within (n/16 + 8) 2^-24 sum |w x'| of the
 *    float64 dot with the activations x' rounded to BF16 first (so the
 *    rounding is the activations' alone, the sums are float's);
 *  - gemm tiles of every nr, nc in 1..4: bit-identical to vec_dot, nothing
 *    outside the tile written;
 *  - ops_matmul on two threads, 1 to 64 tokens, odd shapes: every token's
 *    outputs bit-identical to the token alone (batch invariance within the
 *    variant) and within the first bound of the float64 dot.
 * LAMINA_CPU: every variant name is parsed; forcing each one gives that
 * variant where the CPU runs it and otherwise the best one below it with a
 * note; an unknown name keeps the best with a note; LAMINA_NO_SIMD wins.
 *
 * Without AVX2 the program prints a SKIP line and counts nothing.
 */
#include "kernels/kernels.h"
#include "kernels/x86.h"

#include <math.h>
#include <stdint.h>

#include "base/pool.h"
#include "base/util.h"
#include "format/quant.h"
#include "model/model.h"
#include "model/ops.h"
#include "test.h"

static const uint32_t weight_types[] = {LM_TYPE_F32,  LM_TYPE_F16,  LM_TYPE_BF16, LM_TYPE_Q8_0,
                                        LM_TYPE_Q4_0, LM_TYPE_Q5_0, LM_TYPE_Q4_1, LM_TYPE_Q5_1,
                                        LM_TYPE_Q4_K, LM_TYPE_Q5_K, LM_TYPE_Q6_K, LM_TYPE_MXFP4};
#define N_WEIGHT_TYPES (sizeof weight_types / sizeof weight_types[0])
#define TOL 1e-5 /* relative to sum |w_i x_i| */

static const struct {
    lm_isa isa;
    const char *name;
    const lm_avx2_kernels *(*lookup)(uint32_t);
    bool own_bf16; /* BF16 weights have their own kernels (test_bf16), not avx2's bits */
} variants[] = {{LM_ISA_AVXVNNI, "avxvnni", avxvnni_kernels, false},
                {LM_ISA_AVX512, "avx512", avx512_kernels, false},
                {LM_ISA_AVX512VNNI, "avx512vnni", avx512vnni_kernels, false},
                {LM_ISA_AVX512BF16, "avx512bf16", avx512bf16_kernels, true}};
#define N_VARIANTS (sizeof variants / sizeof variants[0])

static lm_rng rng;
static size_t cur; /* the variant under test */

static void fill_normal(float *x, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(lm_rng_normal(&rng) * scale);
}

static uint32_t act_type(uint32_t wt) { return quant_traits(wt)->vec_dot_type; }

/* A weight row: reference-quantized Gaussian floats, or (quantized types,
 * random_bytes) random bytes with every f16 scale (each block's first two
 * bytes, and Q4_1/Q5_1 m, K-quant d/dmin) replaced by a moderate one. */
static void make_weight(uint32_t type, int64_t n, bool random_bytes, uint8_t *dst) {
    float *f = lm_malloc((size_t)n * sizeof(float));
    fill_normal(f, n, 0.5);
    quant_from_float_ref(type, f, dst, n);
    if (random_bytes && quant_traits(type)->is_quantized) {
        /* flip random quant bits, keeping the scales the quantizer wrote:
         * the scales sit at fixed offsets, so perturb only bytes past the
         * first 4 of each block (K-quants: past the 4 bytes of d, dmin and
         * keeping Q6_K's trailing d) */
        size_t bs = quant_traits(type)->type_size, nb = (size_t)(n / quant_traits(type)->blck);
        for (size_t b = 0; b < nb; b++) {
            uint8_t *blk = dst + b * bs;
            size_t lo = type == LM_TYPE_Q6_K ? 0 : 4, hi = type == LM_TYPE_Q6_K ? bs - 2 : bs;
            if (type == LM_TYPE_Q4_K || type == LM_TYPE_Q5_K) lo = 16; /* d, dmin, 12 scale bytes */
            if (type == LM_TYPE_Q6_K) hi = bs - 2 - 16;                /* ql, qh; scales and d kept */
            for (size_t i = lo; i < hi; i++) blk[i] = (uint8_t)lm_rng_u64(&rng);
        }
    }
    lm_free(f);
}

static void make_act(uint32_t wt, int64_t n, uint8_t *dst) {
    float *f = lm_malloc((size_t)n * sizeof(float));
    fill_normal(f, n, 1.0);
    quant_from_float_ref(act_type(wt), f, dst, n);
    lm_free(f);
}

static bool same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof *a) == 0; }

/* The lookup of the variant under test has avx2's entries, same tiles. */
static void test_table(void) {
    for (uint32_t t = 0; t < LM_TYPE_COUNT; t++) {
        const lm_avx2_kernels *a = avx2_kernels(t), *v = variants[cur].lookup(t);
        CHECKF(!a == !v, "%s", quant_type_name(t));
        if (!a || (t == LM_TYPE_BF16 && variants[cur].own_bf16)) continue;
        CHECKF(!a->to_float == !v->to_float && !a->from_float == !v->from_float && !a->vec_dot == !v->vec_dot &&
                   !a->gemm == !v->gemm && !a->packed_gemm == !v->packed_gemm && !a->packed_act == !v->packed_act &&
                   a->gemm_cols == v->gemm_cols && a->pack_tile == v->pack_tile,
               "%s", quant_type_name(t));
        if (a->vec_dot) CHECKF(a->vec_dot != v->vec_dot, "%s: the variant's own kernel", quant_type_name(t));
    }
}

/* vec_dot and gemm tiles: bit-identical to AVX2, within TOL of the reference. */
static void test_vec_dot_gemm(void) {
    static const int64_t fl[] = {1, 7, 17, 33, 100, 257, 1000, 2816};
    static const int64_t ql[] = {32, 96, 224, 256, 288, 544, 1536, 2816};
    static const int64_t kl[] = {256, 512, 768, 2816};
    for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        uint32_t wt = weight_types[ti];
        if (wt == LM_TYPE_BF16 && variants[cur].own_bf16) continue; /* test_bf16 */
        const lm_avx2_kernels *a = avx2_kernels(wt), *v = variants[cur].lookup(wt);
        int64_t blck = quant_traits(wt)->blck;
        const int64_t *lens = blck == 1 ? fl : blck == 32 ? ql : kl;
        size_t nl = blck == 256 ? 4 : 8;
        for (size_t li = 0; li < nl; li++) {
            int64_t n = lens[li];
            size_t wb = quant_row_size(wt, n), xb = quant_row_size(act_type(wt), n);
            uint8_t *w = lm_malloc(4 * wb), *x = lm_malloc(4 * xb);
            for (int r = 0; r < 4; r++) make_weight(wt, n, r & 1, w + (size_t)r * wb);
            for (int c = 0; c < 4; c++) make_act(wt, n, x + (size_t)c * xb);
            char msg[160] = "";
            for (int r = 0; r < 4 && !msg[0]; r++) {
                const uint8_t *wr = w + (size_t)r * wb;
                float got = v->vec_dot(n, wr, x), want = a->vec_dot(n, wr, x);
                float ref = quant_vec_dot_ref(wt, n, wr, x);
                float *wf = lm_malloc((size_t)n * sizeof(float)), *xf = lm_malloc((size_t)n * sizeof(float));
                quant_to_float_ref(wt, wr, wf, n);
                quant_to_float_ref(act_type(wt), x, xf, n);
                double as = 0;
                for (int64_t i = 0; i < n; i++) as += fabs((double)wf[i] * xf[i]);
                lm_free(wf);
                lm_free(xf);
                if (!same_bits(&got, &want, 1) || !(fabs((double)got - ref) <= TOL * as + 1e-30))
                    snprintf(msg, sizeof msg, "vec_dot row %d: %.9g avx2 %.9g reference %.9g", r, got, want, ref);
            }
            for (int nr = 1; nr <= 4 && !msg[0]; nr++)
                for (int nc = 1; nc <= 4 && !msg[0]; nc++) {
                    float y0[16], y1[16];
                    memset(y0, 0, sizeof y0);
                    memset(y1, 0, sizeof y1);
                    a->gemm(n, w, wb, nr, x, xb, nc, y0, 4);
                    v->gemm(n, w, wb, nr, x, xb, nc, y1, 4);
                    if (!same_bits(y0, y1, 16)) snprintf(msg, sizeof msg, "gemm %dx%d differs from avx2", nr, nc);
                }
            lm_free(w);
            lm_free(x);
            CHECKF(!msg[0], "%s n=%lld: %s", quant_type_name(wt), (long long)n, msg);
        }
    }
}

/* Packed tiles: every width and row count, bit-identical to AVX2's. */
static void test_packed(void) {
    static const uint32_t types[] = {LM_TYPE_Q8_0, LM_TYPE_Q4_0,  LM_TYPE_Q5_0, LM_TYPE_Q4_1,
                                     LM_TYPE_Q5_1, LM_TYPE_MXFP4, LM_TYPE_Q4_K, LM_TYPE_F16};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t wt = types[ti];
        const lm_avx2_kernels *a = avx2_kernels(wt), *v = variants[cur].lookup(wt);
        CHECK(a->packed_gemm && v->packed_gemm);
        const int64_t n = wt == LM_TYPE_Q4_K ? 768 : 576;
        const int rows = wt == LM_TYPE_F16 ? 16 : 8, tile = a->pack_tile;
        size_t rb = quant_row_size(wt, n);
        uint8_t *w = lm_malloc(rb * (size_t)rows), *wp = lm_malloc(quant_pack_size(wt, rows, n));
        for (int r = 0; r < rows; r++) make_weight(wt, n, r & 1, w + (size_t)r * rb);
        quant_pack(wt, w, rb, rows, n, wp);
        /* the activation rows packed_gemm takes: packed_act's, or floats */
        float *xf = lm_malloc((size_t)tile * (size_t)n * sizeof(float));
        fill_normal(xf, (int64_t)tile * n, 1.0);
        size_t xs = a->packed_act ? quant_row_size(wt == LM_TYPE_Q4_K ? LM_TYPE_Q8_K : LM_TYPE_Q8_0, n) : 0;
        if (wt != LM_TYPE_Q4_K && a->packed_act) xs = (size_t)(n / 32) * sizeof(block_q8_0s);
        if (!a->packed_act) xs = (size_t)n * sizeof(float);
        uint8_t *x0 = lm_malloc(xs * (size_t)tile), *x1 = lm_malloc(xs * (size_t)tile);
        for (int c = 0; c < tile; c++) {
            if (a->packed_act) {
                a->packed_act(xf + (size_t)c * (size_t)n, x0 + (size_t)c * xs, n);
                v->packed_act(xf + (size_t)c * (size_t)n, x1 + (size_t)c * xs, n);
            } else {
                memcpy(x0 + (size_t)c * xs, xf + (size_t)c * (size_t)n, xs);
                memcpy(x1 + (size_t)c * xs, xf + (size_t)c * (size_t)n, xs);
            }
        }
        bool act_same = memcmp(x0, x1, xs * (size_t)tile) == 0;
        int bad = 0;
        float *y0 = lm_calloc((size_t)tile * (size_t)rows, sizeof(float));
        float *y1 = lm_calloc((size_t)tile * (size_t)rows, sizeof(float));
        for (int nr = 1; nr <= rows && !bad; nr++)
            for (int nc = 1; nc <= tile && !bad; nc++) {
                a->packed_gemm(n, wp, nr, x0, xs, nc, y0, (size_t)rows);
                v->packed_gemm(n, wp, nr, x0, xs, nc, y1, (size_t)rows);
                if (!same_bits(y0, y1, (size_t)tile * (size_t)rows)) bad = nr * 100 + nc;
            }
        lm_free(w);
        lm_free(wp);
        lm_free(xf);
        lm_free(x0);
        lm_free(x1);
        lm_free(y0);
        lm_free(y1);
        CHECKF(act_same, "%s: packed activations differ from avx2's", quant_type_name(wt));
        CHECKF(!bad, "%s: %d rows x %d tokens differ from avx2", quant_type_name(wt), bad / 100, bad % 100);
    }
}

/* Quantizers and conversions: the same bytes as AVX2's. */
static void test_conversions(void) {
    static const uint32_t types[] = {LM_TYPE_Q8_0, LM_TYPE_Q8_K, LM_TYPE_F16};
    const int64_t n = 2816;
    float *f = lm_malloc((size_t)n * sizeof(float)), *g0 = lm_malloc((size_t)n * sizeof(float)),
          *g1 = lm_malloc((size_t)n * sizeof(float));
    uint8_t *b0 = lm_malloc(quant_row_size(LM_TYPE_F32, n)), *b1 = lm_malloc(quant_row_size(LM_TYPE_F32, n));
    for (int trial = 0; trial < 20; trial++) {
        fill_normal(f, n, ldexp(1.0, trial - 10));
        if (trial == 3) f[5] = 0, f[6] = -f[7];
        for (size_t ti = 0; ti < 3; ti++) {
            uint32_t t = types[ti];
            const lm_avx2_kernels *a = avx2_kernels(t), *v = variants[cur].lookup(t);
            size_t bytes = quant_row_size(t, n);
            a->from_float(f, b0, n);
            v->from_float(f, b1, n);
            CHECKF(!memcmp(b0, b1, bytes), "%s from_float, trial %d", quant_type_name(t), trial);
            if (a->to_float) {
                a->to_float(b0, g0, n);
                v->to_float(b0, g1, n);
                CHECKF(same_bits(g0, g1, (size_t)n), "%s to_float, trial %d", quant_type_name(t), trial);
            }
        }
    }
    lm_free(f);
    lm_free(g0);
    lm_free(g1);
    lm_free(b0);
    lm_free(b1);
}

/* ops_matmul under the variant's table for 1..64 tokens and odd shapes. */
static void check_matmul_tokens(uint32_t wt, lm_pool *pool) {
    static const int64_t shapes[][2] = {{37, 576}, {13, 96}, {3, 32}, {9, 1536}};
    enum { MAX_TOK = 64 };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t rows = shapes[si][0], n = shapes[si][1];
        if (n % quant_traits(wt)->blck) n = 256 * (int64_t)(si + 1);
        uint32_t at = act_type(wt);
        size_t rb = quant_row_size(wt, n), qs = quant_row_size(at, n);
        bool can_pack = quant_pack_size(wt, rows, n) > 0;
        uint8_t *w = lm_malloc(rb * (size_t)rows), *wp = can_pack ? lm_malloc(quant_pack_size(wt, rows, n)) : NULL;
        for (int64_t r = 0; r < rows; r++) make_weight(wt, n, r % 3 == 1, w + (size_t)r * rb);
        if (wp) quant_pack(wt, w, rb, rows, n, wp);
        float *x = lm_malloc((size_t)MAX_TOK * (size_t)n * sizeof(float));
        fill_normal(x, (int64_t)MAX_TOK * n, 1.0);
        uint8_t *xq = lm_malloc(qs * MAX_TOK);
        double *ref = lm_malloc((size_t)MAX_TOK * (size_t)rows * sizeof(double));
        double *tol = lm_malloc((size_t)MAX_TOK * (size_t)rows * sizeof(double));
        float *wf = lm_malloc((size_t)n * sizeof(float)), *xf = lm_malloc((size_t)n * sizeof(float));
        for (int t = 0; t < MAX_TOK; t++) {
            quant_act_from_float(wt, x + (size_t)t * (size_t)n, xq + (size_t)t * qs, n);
            quant_to_float_ref(at, xq + (size_t)t * qs, xf, n);
            for (int64_t r = 0; r < rows; r++) {
                quant_to_float_ref(wt, w + (size_t)r * rb, wf, n);
                double as = 0;
                for (int64_t i = 0; i < n; i++) as += fabs((double)wf[i] * xf[i]);
                ref[(size_t)t * (size_t)rows + (size_t)r] =
                    quant_vec_dot_ref(wt, n, w + (size_t)r * rb, xq + (size_t)t * qs);
                tol[(size_t)t * (size_t)rows + (size_t)r] = TOL * as + 1e-30;
            }
        }
        void *scratch = lm_malloc(ops_matmul_scratch(wt, n, MAX_TOK));
        size_t ny = (size_t)MAX_TOK * (size_t)rows;
        float *y = lm_malloc(ny * sizeof(float)), *alone = lm_malloc(ny * sizeof(float)),
              *y2 = lm_malloc(ny * sizeof(float));
        char msg[200] = "";
        for (int packed = 0; packed < 1 + (wp != NULL) && !msg[0]; packed++) {
            lm_weight lw = {
                .data = w, .type = wt, .rows = rows, .cols = n, .row_bytes = rb, .packed = packed ? wp : NULL};
            CHECK(kernels_use(variants[cur].isa) == 0);
            for (int t = 0; t < MAX_TOK; t++)
                ops_matmul(pool, alone + (size_t)t * (size_t)rows, &lw, x + (size_t)t * (size_t)n, 1, scratch);
            for (int n_tok = 1; n_tok <= MAX_TOK && !msg[0]; n_tok++) {
                /* the avx2 table on a spread of batch sizes (each switch costs pool rounds) */
                const bool vs_avx2 = n_tok <= 9 || n_tok == 17 || n_tok == 33 || n_tok == 64;
                ops_matmul(pool, y, &lw, x, n_tok, scratch);
                if (vs_avx2) {
                    CHECK(kernels_use(LM_ISA_AVX2) == 0);
                    ops_matmul(pool, y2, &lw, x, n_tok, scratch);
                    CHECK(kernels_use(variants[cur].isa) == 0);
                }
                size_t m = (size_t)n_tok * (size_t)rows;
                for (size_t i = 0; i < m && !msg[0]; i++)
                    if (!(fabs((double)y[i] - ref[i]) <= tol[i]))
                        snprintf(msg, sizeof msg, "%s batch %d: token %zu row %zu: %.9g vs reference %.9g",
                                 packed ? "packed" : "row-major", n_tok, i / (size_t)rows, i % (size_t)rows, y[i],
                                 ref[i]);
                if (!msg[0] && !same_bits(y, alone, m))
                    snprintf(msg, sizeof msg, "%s batch %d: differs from its tokens alone",
                             packed ? "packed" : "row-major", n_tok);
                if (!msg[0] && vs_avx2 && !same_bits(y, y2, m))
                    snprintf(msg, sizeof msg, "%s batch %d: differs from the avx2 table's",
                             packed ? "packed" : "row-major", n_tok);
            }
        }
        lm_free(w);
        lm_free(wp);
        lm_free(x);
        lm_free(xq);
        lm_free(ref);
        lm_free(tol);
        lm_free(wf);
        lm_free(xf);
        lm_free(scratch);
        lm_free(y);
        lm_free(y2);
        lm_free(alone);
        CHECKF(!msg[0], "%s rows=%lld n=%lld: %s", quant_type_name(wt), (long long)rows, (long long)n, msg);
    }
}

static void test_matmul_tokens(void) {
    static const uint32_t types[] = {LM_TYPE_Q8_0, LM_TYPE_Q4_0, LM_TYPE_Q5_0, LM_TYPE_Q4_1, LM_TYPE_Q5_1,
                                     LM_TYPE_Q4_K, LM_TYPE_Q5_K, LM_TYPE_Q6_K, LM_TYPE_MXFP4};
    lm_pool *pool = pool_new(2);
    CHECK(pool);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        check_matmul_tokens(types[ti], pool);
        if (test_cur_failed_) break;
    }
    pool_free(pool);
    CHECK(kernels_use(-1) == 0);
}

/* ---- avx512bf16: BF16 weights through vdpbf16ps ------------------------------ */

/* The variant's bound relative to sum |w x| (kernels/avx512bf16_dot.c):
 * the activations' rounding to BF16 (2^-8) and the float sums. */
static double bf16_sum_bound(int64_t n) { return (double)(n / 16 + 8) * ldexp(1.0, -24); }
static double bf16_bound(int64_t n) { return ldexp(1.0, -8) + bf16_sum_bound(n); }

/* float64 dot of BF16 weights with x, or with x rounded to BF16 first;
 * *abs_sum gets sum |w x| of the same operands. */
static double bf16_exact(int64_t n, const uint16_t *w, const float *x, bool round_x, double *abs_sum) {
    double s = 0, as = 0;
    for (int64_t i = 0; i < n; i++) {
        double xi = round_x ? (double)lm_bf16_to_f32(lm_f32_to_bf16(x[i])) : (double)x[i];
        double p = (double)lm_bf16_to_f32(w[i]) * xi;
        s += p;
        as += fabs(p);
    }
    *abs_sum = as;
    return s;
}

/* The table on avx512bf16: its BF16 entries, avx512vnni's for the rest. */
static void bf16_table(void) {
    CHECK(kernels_use(LM_ISA_AVX512BF16) == 0 && kernels()->isa == LM_ISA_AVX512BF16 &&
          !strcmp(kernels_isa_name(), "avx512bf16"));
    const lm_avx2_kernels *b = avx512bf16_kernels(LM_TYPE_BF16);
    CHECK(b && kernels_type(LM_TYPE_BF16)->vec_dot == b->vec_dot && kernels_type(LM_TYPE_BF16)->gemm == b->gemm &&
          b->vec_dot != avx512vnni_kernels(LM_TYPE_BF16)->vec_dot);
    for (uint32_t t = 0; t < LM_TYPE_COUNT; t++) {
        if (t == LM_TYPE_BF16) continue;
        const lm_avx2_kernels *v = avx512vnni_kernels(t);
        CHECKF(avx512bf16_kernels(t) == v, "%s", quant_type_name(t));
        if (v && v->vec_dot)
            CHECKF(kernels_type(t)->vec_dot == v->vec_dot && kernels_type(t)->gemm == v->gemm, "%s",
                   quant_type_name(t));
    }
    CHECK(kernels_use(-1) == 0);
}

/* vec_dot against both float64 references; gemm tiles against vec_dot. */
static void bf16_dot_gemm(void) {
    static const int64_t lens[] = {1, 2, 15, 16, 17, 31, 32, 33, 63, 100, 257, 1000, 2816, 4096};
    const lm_avx2_kernels *k = avx512bf16_kernels(LM_TYPE_BF16);
    char msg[200] = "";
    double worst = 0; /* largest error seen, relative to the bound */
    for (size_t li = 0; li < sizeof lens / sizeof lens[0] && !msg[0]; li++) {
        const int64_t n = lens[li];
        uint16_t *w = lm_malloc(4 * (size_t)n * 2);
        float *x = lm_malloc(4 * (size_t)n * sizeof(float));
        for (int r = 0; r < 4; r++) make_weight(LM_TYPE_BF16, n, false, (uint8_t *)(w + (size_t)r * (size_t)n));
        for (int c = 0; c < 4; c++) fill_normal(x + (size_t)c * (size_t)n, n, c == 1 ? 1e-3 : c == 2 ? 1e3 : 1.0);
        for (int r = 0; r < 4 && !msg[0]; r++)
            for (int c = 0; c < 4 && !msg[0]; c++) {
                const uint16_t *wr = w + (size_t)r * (size_t)n;
                const float *xc = x + (size_t)c * (size_t)n;
                float got = k->vec_dot(n, wr, xc);
                double as, as_r, exact = bf16_exact(n, wr, xc, false, &as),
                                 exact_r = bf16_exact(n, wr, xc, true, &as_r);
                double e = fabs((double)got - exact), e_r = fabs((double)got - exact_r);
                if (as > 0 && e / (bf16_bound(n) * as) > worst) worst = e / (bf16_bound(n) * as);
                if (!(e <= bf16_bound(n) * as + 1e-30) || !(e_r <= bf16_sum_bound(n) * as_r + 1e-30))
                    snprintf(msg, sizeof msg, "vec_dot n=%lld row %d col %d: %.9g, float64 %.9g, with x in BF16 %.9g",
                             (long long)n, r, c, got, exact, exact_r);
            }
        const size_t ys = 7;
        for (int nr = 1; nr <= 4 && !msg[0]; nr++)
            for (int nc = 1; nc <= 4 && !msg[0]; nc++) {
                float y[7 * 4 + 7];
                for (size_t i = 0; i < sizeof y / sizeof y[0]; i++) y[i] = -7.0f;
                k->gemm(n, w, (size_t)n * 2, nr, x, (size_t)n * sizeof(float), nc, y, ys);
                for (int c = 0; c < 4; c++)
                    for (size_t r = 0; r < ys; r++) {
                        float want =
                            c < nc && (int)r < nr ? k->vec_dot(n, w + r * (size_t)n, x + (size_t)c * (size_t)n) : -7.0f;
                        if (memcmp(&y[(size_t)c * ys + r], &want, sizeof want) && !msg[0])
                            snprintf(msg, sizeof msg, "n=%lld gemm %dx%d differs from vec_dot at (%zu, %d)",
                                     (long long)n, nr, nc, r, c);
                    }
            }
        lm_free(w);
        lm_free(x);
    }
    CHECKF(!msg[0], "%s", msg);
    printf("  avx512bf16 BF16 vec_dot: largest error %.3f of the bound\n", worst);
}

/* ops_matmul with BF16 weights for 1..64 tokens: each token as alone, and
 * within the bound of the float64 dot. */
static void bf16_matmul(void) {
    static const int64_t shapes[][2] = {{37, 576}, {13, 33}, {3, 1000}, {9, 2048}};
    enum { MAX_TOK = 64 };
    lm_pool *pool = pool_new(2);
    CHECK(pool);
    CHECK(kernels_use(LM_ISA_AVX512BF16) == 0);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t rows = shapes[si][0], n = shapes[si][1];
        uint16_t *w = lm_malloc((size_t)rows * (size_t)n * 2);
        for (int64_t r = 0; r < rows; r++) make_weight(LM_TYPE_BF16, n, false, (uint8_t *)(w + (size_t)r * (size_t)n));
        float *x = lm_malloc((size_t)MAX_TOK * (size_t)n * sizeof(float));
        fill_normal(x, (int64_t)MAX_TOK * n, 1.0);
        const size_t ny = (size_t)MAX_TOK * (size_t)rows;
        double *ref = lm_malloc(ny * sizeof(double)), *tol = lm_malloc(ny * sizeof(double));
        for (int t = 0; t < MAX_TOK; t++)
            for (int64_t r = 0; r < rows; r++) {
                double as;
                ref[(size_t)t * (size_t)rows + (size_t)r] =
                    bf16_exact(n, w + (size_t)r * (size_t)n, x + (size_t)t * (size_t)n, false, &as);
                tol[(size_t)t * (size_t)rows + (size_t)r] = bf16_bound(n) * as + 1e-30;
            }
        lm_weight lw = {.data = w, .type = LM_TYPE_BF16, .rows = rows, .cols = n, .row_bytes = (size_t)n * 2};
        void *scratch = lm_malloc(ops_matmul_scratch(LM_TYPE_BF16, n, MAX_TOK));
        float *y = lm_malloc(ny * sizeof(float)), *alone = lm_malloc(ny * sizeof(float));
        for (int t = 0; t < MAX_TOK; t++)
            ops_matmul(pool, alone + (size_t)t * (size_t)rows, &lw, x + (size_t)t * (size_t)n, 1, scratch);
        char msg[200] = "";
        for (int n_tok = 1; n_tok <= MAX_TOK && !msg[0]; n_tok++) {
            ops_matmul(pool, y, &lw, x, n_tok, scratch);
            const size_t m = (size_t)n_tok * (size_t)rows;
            for (size_t i = 0; i < m && !msg[0]; i++)
                if (!(fabs((double)y[i] - ref[i]) <= tol[i]))
                    snprintf(msg, sizeof msg, "batch %d: token %zu row %zu: %.9g vs float64 %.9g", n_tok,
                             i / (size_t)rows, i % (size_t)rows, y[i], ref[i]);
            if (!msg[0] && !same_bits(y, alone, m))
                snprintf(msg, sizeof msg, "batch %d: differs from its tokens alone", n_tok);
        }
        lm_free(w);
        lm_free(x);
        lm_free(ref);
        lm_free(tol);
        lm_free(scratch);
        lm_free(y);
        lm_free(alone);
        CHECKF(!msg[0], "BF16 rows=%lld n=%lld: %s", (long long)rows, (long long)n, msg);
    }
    pool_free(pool);
    CHECK(kernels_use(-1) == 0);
}

static void test_bf16(void) {
    bf16_table();
    bf16_dot_gemm();
    bf16_matmul();
}

static void set_env(const char *name, const char *value) {
    if (value) setenv(name, value, 1);
    else unsetenv(name);
}

/* LAMINA_CPU: names, forcing, capping, unknown names; LAMINA_NO_SIMD wins. */
static void test_lamina_cpu(void) {
    const char *old = getenv("LAMINA_CPU"), *old_ns = getenv("LAMINA_NO_SIMD");
    char saved[64] = "", saved_ns[64] = "";
    if (old) snprintf(saved, sizeof saved, "%s", old);
    if (old_ns) snprintf(saved_ns, sizeof saved_ns, "%s", old_ns);
    set_env("LAMINA_NO_SIMD", NULL);
    for (int i = 0; i < LM_ISA_COUNT; i++) CHECK(kernels_isa_parse(kernels_isa_str((lm_isa)i)) == i);
    CHECK(kernels_isa_parse("avx-512") == -1 && kernels_isa_parse("") == -1 && kernels_isa_parse(NULL) == -1);

    set_env("LAMINA_CPU", NULL);
    CHECK(kernels_use(-1) == 0 && !kernels_cap_note()[0]);
    lm_isa best = kernels()->isa;
    for (int i = LM_ISA_AVX512BF16; i > (int)best; i--) CHECK(!kernels_cpu_has((lm_isa)i)); /* the best it has */
    CHECK(!kernels_cpu_has(LM_ISA_NEON) && !kernels_cpu_has(LM_ISA_NEONDOT));               /* an x86 CPU */
    for (int i = 0; i < LM_ISA_COUNT; i++) {
        set_env("LAMINA_CPU", kernels_isa_str((lm_isa)i));
        CHECK(kernels_use(-1) == 0);
        lm_isa got = kernels()->isa;
        if (kernels_cpu_has((lm_isa)i)) {
            CHECKF(got == (lm_isa)i && !kernels_cap_note()[0], "LAMINA_CPU=%s gave %s", kernels_isa_str((lm_isa)i),
                   kernels_isa_name());
        } else {
            CHECKF((int)got < i && kernels_cpu_has(got) && strstr(kernels_cap_note(), "does not run") &&
                       strstr(kernels_cap_note(), kernels_isa_name()),
                   "LAMINA_CPU=%s gave %s (%s)", kernels_isa_str((lm_isa)i), kernels_isa_name(), kernels_cap_note());
            /* down its line: past the x86 variants below it that the CPU
             * lacks; an Arm variant's line ends at scalar */
            if (i <= LM_ISA_AVX512BF16)
                for (int j = (int)got + 1; j < i; j++) CHECK(!kernels_cpu_has((lm_isa)j));
            else CHECK(got == LM_ISA_SCALAR);
        }
        CHECK(kernels_cpu_isa() == got);
    }
    set_env("LAMINA_CPU", "avx1024");
    CHECK(kernels_use(-1) == 0 && kernels()->isa == best && strstr(kernels_cap_note(), "no such variant"));
    set_env("LAMINA_CPU", "avx2");
    set_env("LAMINA_NO_SIMD", "1");
    CHECK(kernels_use(-1) == 0 && kernels()->isa == LM_ISA_SCALAR);
    set_env("LAMINA_NO_SIMD", old_ns ? saved_ns : NULL);
    set_env("LAMINA_CPU", old ? saved : NULL);
    CHECK(kernels_use(-1) == 0);
}

int main(void) {
    if (!cpu_has_avx2()) {
        printf("SKIP test_kernels_x86: this CPU (or OS) lacks AVX2/FMA/F16C\n");
        return TEST_DONE();
    }
    lm_rng_seed(&rng, 20261201);
    TEST_RUN(test_lamina_cpu);
    for (cur = 0; cur < N_VARIANTS; cur++) {
        if (!kernels_cpu_has(variants[cur].isa)) {
            printf("NOT RUN %s: this CPU (or OS) does not run it\n", variants[cur].name);
            continue;
        }
        printf("variant %s\n", variants[cur].name);
        TEST_RUN(test_table);
        TEST_RUN(test_vec_dot_gemm);
        TEST_RUN(test_packed);
        TEST_RUN(test_conversions);
        TEST_RUN(test_matmul_tokens);
        if (variants[cur].own_bf16) TEST_RUN(test_bf16);
    }
    return TEST_DONE();
}
