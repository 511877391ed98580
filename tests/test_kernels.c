/*
 * test_kernels.c - the AVX2 kernels (src/kernels/) against the scalar
 * references of quant.c and against each other.
 *
 *  - vec_dot of every weight type against quant_vec_dot_ref and against the
 *    float64 dot of the dequantized rows: |err| <= 1e-5 * sum_i |w_i x_i|
 *    for every type (the kernels accumulate in float; the measured error is
 *    around 1e-7 of that sum). Rows come from the reference quantizer and,
 *    for the quantized types, also from random block bytes (every nibble,
 *    sign bit, scale code and -128 weight occurs). Lengths: every multiple of
 *    32 up to 1280 plus 2048 and 2816 for Q8_0/Q4_0; 256, 512, 768, 1024,
 *    2048 and 2816 for the K-quants; for F32/F16/BF16 also lengths that end
 *    in a short tail (1, 7, 15, 17, 33, 100, ...).
 *  - activation quantizers Q8_0 and Q8_K: blocks byte-identical to
 *    quant_from_float_ref on Gaussian rows of many scales, exact rounding
 *    ties, zero, constant, tiny (f16-subnormal and float-subnormal) and huge
 *    rows, and ties for the largest magnitude with opposite signs.
 *  - gemm tiles: for every type, random lengths and padded strides, every
 *    nr, nc in 1..4: each output bit-identical (memcmp) to that type's
 *    AVX2 vec_dot, and nothing outside the tile written.
 *  - the lookup table: every weight type has vec_dot and gemm, Q8_0/Q8_K
 *    have from_float, other types get NULL.
 *
 * On a CPU without AVX2/FMA/F16C the program prints a SKIP line and counts
 * nothing.
 */
#include "kernels/kernels.h"

#include <stdint.h>

#include "quant.h"
#include "test.h"
#include "util.h"

static const uint32_t weight_types[] = {LM_TYPE_F32,  LM_TYPE_F16,  LM_TYPE_BF16, LM_TYPE_Q8_0,
                                        LM_TYPE_Q4_0, LM_TYPE_Q4_K, LM_TYPE_Q5_K, LM_TYPE_Q6_K};
#define N_WEIGHT_TYPES (sizeof weight_types / sizeof weight_types[0])

#define TOL 1e-5 /* relative to sum |w_i x_i|, every type */

static lm_rng rng;

static void fill_normal(float *x, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(lm_rng_normal(&rng) * scale);
}

static uint32_t act_type(uint32_t wt) { return quant_traits(wt)->vec_dot_type; }

/* Random bytes for n elements of a quantized type, with every f16 scale
 * set to a finite value of moderate size (random bits there could be
 * inf/NaN, which no quantizer writes). */
static void fill_random_blocks(uint32_t type, uint8_t *p, int64_t n) {
    size_t bytes = quant_row_size(type, n);
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)lm_rng_u64(&rng);
    const lm_type_traits *t = quant_traits(type);
    for (int64_t b = 0; b < n / t->blck; b++) {
        uint8_t *blk = p + (size_t)b * t->type_size;
        uint16_t d = lm_f32_to_f16((float)((lm_rng_uniform(&rng) * 0.1 + 1e-3) *
                                           (lm_rng_u64(&rng) & 1 ? 1 : -1)));
        uint16_t dmin = lm_f32_to_f16((float)(lm_rng_uniform(&rng) * 0.1));
        switch (type) {
        case LM_TYPE_Q8_0:
        case LM_TYPE_Q4_0: memcpy(blk, &d, 2); break;
        case LM_TYPE_Q4_K:
        case LM_TYPE_Q5_K:
            memcpy(blk, &d, 2);
            memcpy(blk + 2, &dmin, 2);
            break;
        case LM_TYPE_Q6_K: memcpy(blk + offsetof(block_q6_K, d), &d, 2); break;
        default: break;
        }
    }
}

/* A weight row of `type`: from Gaussian floats through the reference
 * quantizer (random_bytes false) or random blocks; float types always from
 * Gaussian floats. */
static void make_weight(uint32_t type, int64_t n, bool random_bytes, void *dst) {
    float *f = lm_malloc((size_t)n * sizeof(float));
    fill_normal(f, n, 0.5);
    if (quant_traits(type)->is_quantized && random_bytes) fill_random_blocks(type, dst, n);
    else quant_from_float_ref(type, f, dst, n);
    lm_free(f);
}

/* An activation row in the weight type's vec_dot_type. */
static void make_act(uint32_t wt, int64_t n, void *dst) {
    float *f = lm_malloc((size_t)n * sizeof(float));
    fill_normal(f, n, 1.0);
    quant_from_float_ref(act_type(wt), f, dst, n);
    lm_free(f);
}

/* float64 dot of the dequantized rows, and sum |w_i x_i|. */
static double deq_dot(uint32_t wt, int64_t n, const void *w, const void *x, double *abs_sum) {
    float *a = lm_malloc((size_t)n * sizeof(float)), *b = lm_malloc((size_t)n * sizeof(float));
    quant_to_float_ref(wt, w, a, n);
    quant_to_float_ref(act_type(wt), x, b, n);
    double s = 0, as = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)a[i] * b[i];
        as += fabs((double)a[i] * b[i]);
    }
    lm_free(a);
    lm_free(b);
    *abs_sum = as;
    return s;
}

/* The lengths tested for a type (0-terminated). */
static int lengths(uint32_t type, int64_t *out) {
    int k = 0;
    int64_t blck = quant_traits(type)->blck;
    if (blck == 1) {
        static const int64_t odd[] = {1, 2, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 255, 257, 1000};
        for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) out[k++] = odd[i];
        out[k++] = 2048;
        out[k++] = 2816;
    } else if (blck == 32) {
        for (int64_t n = 32; n <= 1280; n += 32) out[k++] = n;
        out[k++] = 2048;
        out[k++] = 2816;
    } else {
        static const int64_t kq[] = {256, 512, 768, 1024, 2048, 2816};
        for (size_t i = 0; i < sizeof kq / sizeof kq[0]; i++) out[k++] = kq[i];
    }
    return k;
}

static void check_vec_dot_type(uint32_t wt, bool random_bytes) {
    const lm_avx2_kernels *k = avx2_kernels(wt);
    CHECK(k && k->vec_dot);
    int64_t ns[64];
    int nn = lengths(wt, ns);
    for (int li = 0; li < nn; li++) {
        int64_t n = ns[li];
        for (int rep = 0; rep < 3; rep++) {
            void *w = lm_malloc(quant_row_size(wt, n)), *x = lm_malloc(quant_row_size(act_type(wt), n));
            make_weight(wt, n, random_bytes, w);
            make_act(wt, n, x);
            double abs_sum, exact = deq_dot(wt, n, w, x, &abs_sum);
            float ref = quant_vec_dot_ref(wt, n, w, x);
            float got = k->vec_dot(n, w, x);
            lm_free(w);
            lm_free(x);
            double tol = TOL * abs_sum + 1e-30;
            CHECKF(fabs((double)got - ref) <= tol, "%s n=%lld: avx2 %.9g ref %.9g (tol %.3g)",
                   quant_type_name(wt), (long long)n, got, ref, tol);
            CHECKF(fabs((double)got - exact) <= tol, "%s n=%lld: avx2 %.9g float64 %.9g (tol %.3g)",
                   quant_type_name(wt), (long long)n, got, exact, tol);
        }
    }
}

static void test_vec_dot_float(void) {
    check_vec_dot_type(LM_TYPE_F32, false);
    check_vec_dot_type(LM_TYPE_F16, false);
    check_vec_dot_type(LM_TYPE_BF16, false);
}

static void test_vec_dot_q8_0(void) {
    check_vec_dot_type(LM_TYPE_Q8_0, false);
    check_vec_dot_type(LM_TYPE_Q8_0, true);
}

static void test_vec_dot_q4_0(void) {
    check_vec_dot_type(LM_TYPE_Q4_0, false);
    check_vec_dot_type(LM_TYPE_Q4_0, true);
}

static void test_vec_dot_q4_K(void) {
    check_vec_dot_type(LM_TYPE_Q4_K, false);
    check_vec_dot_type(LM_TYPE_Q4_K, true);
}

static void test_vec_dot_q5_K(void) {
    check_vec_dot_type(LM_TYPE_Q5_K, false);
    check_vec_dot_type(LM_TYPE_Q5_K, true);
}

static void test_vec_dot_q6_K(void) {
    check_vec_dot_type(LM_TYPE_Q6_K, false);
    check_vec_dot_type(LM_TYPE_Q6_K, true);
}

/* Extreme blocks: every weight code at its largest magnitude against an
 * activation row at its largest, so the integer paths run at their bounds
 * (saturation or overflow would show as a large error). */
static void test_vec_dot_extremes(void) {
    const int64_t n = 2048;
    for (size_t ti = 3; ti < N_WEIGHT_TYPES; ti++) {
        uint32_t wt = weight_types[ti];
        size_t wb = quant_row_size(wt, n);
        uint8_t *w = lm_malloc(wb);
        void *x = lm_malloc(quant_row_size(act_type(wt), n));
        float *f = lm_malloc((size_t)n * sizeof(float));
        for (int pattern = 0; pattern < 4; pattern++) {
            /* activations all -max or alternating in sign */
            for (int64_t i = 0; i < n; i++) f[i] = pattern & 1 ? (i & 1 ? 3.0f : -3.0f) : -3.0f;
            quant_from_float_ref(act_type(wt), f, x, n);
            fill_random_blocks(wt, w, n);
            /* saturate the quant bytes (keep the scales): all ones or zeros */
            const lm_type_traits *t = quant_traits(wt);
            uint8_t fillb = pattern & 2 ? 0xFF : 0x00;
            for (int64_t b = 0; b < n / t->blck; b++) {
                uint8_t *blk = w + (size_t)b * t->type_size;
                switch (wt) {
                case LM_TYPE_Q8_0: memset(blk + 2, pattern & 2 ? 0x80 : 0x7F, 32); break;
                case LM_TYPE_Q4_0: memset(blk + 2, fillb, 16); break;
                case LM_TYPE_Q4_K:
                    memset(blk + 4, 0xFF, 12);
                    memset(blk + 16, fillb, 128);
                    break;
                case LM_TYPE_Q5_K:
                    memset(blk + 4, 0xFF, 12);
                    memset(blk + 16, fillb, 160);
                    break;
                case LM_TYPE_Q6_K:
                    memset(blk, fillb, 192);
                    memset(blk + 192, pattern & 2 ? 0x80 : 0x7F, 16);
                    break;
                default: break;
                }
            }
            double abs_sum, exact = deq_dot(wt, n, w, x, &abs_sum);
            float got = avx2_kernels(wt)->vec_dot(n, w, x);
            float ref = quant_vec_dot_ref(wt, n, w, x);
            CHECKF(fabs((double)got - exact) <= TOL * abs_sum + 1e-30,
                   "%s pattern %d: avx2 %.9g float64 %.9g", quant_type_name(wt), pattern, got, exact);
            CHECKF(fabs((double)got - ref) <= TOL * abs_sum + 1e-30,
                   "%s pattern %d: avx2 %.9g ref %.9g", quant_type_name(wt), pattern, got, ref);
        }
        lm_free(w);
        lm_free(x);
        lm_free(f);
    }
}

/* ---- quantizers ---------------------------------------------------------- */

/* Rows that stress the quantizer: kind 0 Gaussian at a random scale over
 * 1e-6..1e4, 1 exact rounding ties (x * (1/d) = k + 0.5 for Q8_0 with
 * max 127; Q8_K with max -128), 2 zeros, 3 constant, 4 tiny (f16-subnormal
 * scales), 5 float-subnormal values, 6 opposite-sign ties for the maximum,
 * 7 mixed magnitudes per block, 8 huge, 9 near-ties at a random scale
 * (x = (k + 0.5) * step, so x times the inverse scale lands within an ulp
 * of a half: any change in how the scale or its inverse is rounded shows). */
static void stress_row(int kind, uint32_t type, float *x, int64_t n) {
    int64_t blck = quant_traits(type)->blck;
    switch (kind) {
    case 0: fill_normal(x, n, pow(10.0, -6.0 + 10.0 * lm_rng_uniform(&rng))); break;
    case 1:
        for (int64_t i = 0; i < n; i++) {
            int k = (int)(lm_rng_u64(&rng) % 254) - 127; /* -127..126 */
            x[i] = (float)k + 0.5f;
            if (type == LM_TYPE_Q8_K && x[i] < -127.5f) x[i] = -127.5f;
        }
        for (int64_t b = 0; b < n / blck; b++) x[b * blck + (b % blck)] = type == LM_TYPE_Q8_0 ? 127.0f : -128.0f;
        break;
    case 2: memset(x, 0, (size_t)n * sizeof(float)); break;
    case 3:
        for (int64_t i = 0; i < n; i++) x[i] = 0.37f;
        break;
    case 4: fill_normal(x, n, 1e-6); break;
    case 5:
        for (int64_t i = 0; i < n; i++) x[i] = (float)(lm_rng_normal(&rng) * 1e-39);
        break;
    case 6:
        fill_normal(x, n, 1.0);
        for (int64_t b = 0; b < n / blck; b++) {
            int64_t i = b * blck + (int64_t)(lm_rng_u64(&rng) % (uint64_t)(blck / 2));
            int64_t j = i + 1 + (int64_t)(lm_rng_u64(&rng) % (uint64_t)(blck / 2 - 1));
            float m = b & 1 ? 7.0f : -7.0f;
            x[i] = m;
            x[j] = -m;
        }
        break;
    case 7:
        for (int64_t i = 0; i < n; i++) x[i] = (float)(lm_rng_normal(&rng) * pow(10.0, (double)(i % 9) - 4.0));
        break;
    case 8: fill_normal(x, n, 1e30); break;
    default: {
        float top = (float)pow(10.0, -3.0 + 6.0 * lm_rng_uniform(&rng));
        float step = type == LM_TYPE_Q8_0 ? top / 127.0f : top / 128.0f;
        for (int64_t i = 0; i < n; i++) {
            int k = (int)(lm_rng_u64(&rng) % 250) - 125;
            x[i] = ((float)k + 0.5f) * step;
        }
        for (int64_t b = 0; b < n / blck; b++) x[b * blck + (b % blck)] = type == LM_TYPE_Q8_0 ? top : -top;
        break;
    }
    }
}

static void check_quantizer(uint32_t type) {
    const lm_avx2_kernels *k = avx2_kernels(type);
    CHECK(k && k->from_float);
    for (int rep = 0; rep < 400; rep++) {
        int kind = rep % 10;
        int64_t n = quant_traits(type)->blck * (1 + (int64_t)(lm_rng_u64(&rng) % 12));
        float *x = lm_malloc((size_t)n * sizeof(float));
        size_t bytes = quant_row_size(type, n);
        uint8_t *a = lm_malloc(bytes), *b = lm_malloc(bytes);
        memset(a, 0xAA, bytes);
        memset(b, 0x55, bytes);
        stress_row(kind, type, x, n);
        quant_from_float_ref(type, x, a, n);
        k->from_float(x, b, n);
        int same = memcmp(a, b, bytes) == 0;
        size_t first = 0;
        while (same == 0 && first < bytes && a[first] == b[first]) first++;
        lm_free(x);
        lm_free(a);
        lm_free(b);
        CHECKF(same, "%s kind %d n=%lld: blocks differ from the reference at byte %zu",
               quant_type_name(type), kind, (long long)n, first);
    }
}

static void test_quantize_q8_0(void) { check_quantizer(LM_TYPE_Q8_0); }
static void test_quantize_q8_K(void) { check_quantizer(LM_TYPE_Q8_K); }

/* ---- gemm tiles ------------------------------------------------------------ */

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static void check_gemm_type(uint32_t wt) {
    const lm_avx2_kernels *k = avx2_kernels(wt);
    CHECK(k && k->gemm && k->vec_dot);
    int64_t ns[64];
    int nn = lengths(wt, ns);
    uint32_t at = act_type(wt);
    for (int trial = 0; trial < 12; trial++) {
        int64_t n = ns[lm_rng_u64(&rng) % (uint64_t)nn];
        /* strides padded by a few units of 4 bytes (keeps every row aligned) */
        size_t ws = quant_row_size(wt, n) + 4 * (size_t)(lm_rng_u64(&rng) % 4);
        size_t xs = quant_row_size(at, n) + 4 * (size_t)(lm_rng_u64(&rng) % 4);
        uint8_t *w = lm_malloc(4 * ws), *x = lm_malloc(4 * xs);
        for (int r = 0; r < 4; r++) make_weight(wt, n, trial & 1, w + (size_t)r * ws);
        for (int c = 0; c < 4; c++) make_act(wt, n, x + (size_t)c * xs);
        float want[4][4];
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < 4; c++) want[r][c] = k->vec_dot(n, w + (size_t)r * ws, x + (size_t)c * xs);
        int bad = 0;
        char msg[160] = "";
        for (int nr = 1; nr <= 4 && !bad; nr++) {
            for (int nc = 1; nc <= 4 && !bad; nc++) {
                size_t ys = (size_t)nr + (size_t)(lm_rng_u64(&rng) % 3);
                float y[4 * 8];
                for (size_t i = 0; i < sizeof y / sizeof y[0]; i++) y[i] = -1234.5f;
                k->gemm(n, w, ws, nr, x, xs, nc, y, ys);
                for (size_t i = 0; i < sizeof y / sizeof y[0] && !bad; i++) {
                    size_t c = i / ys, r = i % ys;
                    bool inside = c < (size_t)nc && r < (size_t)nr;
                    if (inside && !same_bits(y[i], want[r][c])) {
                        bad = 1;
                        snprintf(msg, sizeof msg, "n=%lld nr=%d nc=%d (r %zu, c %zu): gemm %.9g vec_dot %.9g",
                                 (long long)n, nr, nc, r, c, y[i], want[r][c]);
                    } else if (!inside && y[i] != -1234.5f) {
                        bad = 1;
                        snprintf(msg, sizeof msg, "n=%lld nr=%d nc=%d: wrote outside the tile at %zu",
                                 (long long)n, nr, nc, i);
                    }
                }
            }
        }
        lm_free(w);
        lm_free(x);
        CHECKF(!bad, "%s %s", quant_type_name(wt), msg);
    }
}

static void test_gemm_f32(void) { check_gemm_type(LM_TYPE_F32); }
static void test_gemm_f16(void) { check_gemm_type(LM_TYPE_F16); }
static void test_gemm_bf16(void) { check_gemm_type(LM_TYPE_BF16); }
static void test_gemm_q8_0(void) { check_gemm_type(LM_TYPE_Q8_0); }
static void test_gemm_q4_0(void) { check_gemm_type(LM_TYPE_Q4_0); }
static void test_gemm_q4_K(void) { check_gemm_type(LM_TYPE_Q4_K); }
static void test_gemm_q5_K(void) { check_gemm_type(LM_TYPE_Q5_K); }
static void test_gemm_q6_K(void) { check_gemm_type(LM_TYPE_Q6_K); }

/* nr or nc of 0 writes nothing. */
static void test_gemm_empty(void) {
    float w[32] = {0}, x[32] = {0}, y[4] = {7, 7, 7, 7};
    for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        const lm_avx2_kernels *k = avx2_kernels(weight_types[ti]);
        CHECK(k && k->gemm);
        k->gemm(0, w, 0, 0, x, 0, 3, y, 4);
        k->gemm(0, w, 0, 3, x, 0, 0, y, 4);
    }
    CHECK(y[0] == 7 && y[1] == 7 && y[2] == 7 && y[3] == 7);
}

/* ---- table ----------------------------------------------------------------- */

static void test_table(void) {
    for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        const lm_avx2_kernels *k = avx2_kernels(weight_types[ti]);
        CHECKF(k && k->vec_dot && k->gemm, "%s", quant_type_name(weight_types[ti]));
    }
    CHECK(avx2_kernels(LM_TYPE_Q8_0)->from_float == avx2_from_float_q8_0);
    CHECK(avx2_kernels(LM_TYPE_Q8_K)->from_float == avx2_from_float_q8_K);
    CHECK(avx2_kernels(LM_TYPE_Q8_K)->vec_dot == NULL);
    CHECK(avx2_kernels(LM_TYPE_Q4_0)->from_float == NULL);
    CHECK(avx2_kernels(LM_TYPE_Q4_1) == NULL);
    CHECK(avx2_kernels(LM_TYPE_I8) == NULL);
    CHECK(avx2_kernels(LM_TYPE_COUNT) == NULL);
    CHECK(avx2_kernels(UINT32_MAX) == NULL);
}

int main(void) {
    if (!cpu_has_avx2()) {
        printf("SKIP test_kernels: this CPU (or OS) lacks AVX2/FMA/F16C\n");
        return TEST_DONE();
    }
    lm_rng_seed(&rng, 20240611);
    TEST_RUN(test_table);
    TEST_RUN(test_vec_dot_float);
    TEST_RUN(test_vec_dot_q8_0);
    TEST_RUN(test_vec_dot_q4_0);
    TEST_RUN(test_vec_dot_q4_K);
    TEST_RUN(test_vec_dot_q5_K);
    TEST_RUN(test_vec_dot_q6_K);
    TEST_RUN(test_vec_dot_extremes);
    TEST_RUN(test_quantize_q8_0);
    TEST_RUN(test_quantize_q8_K);
    TEST_RUN(test_gemm_f32);
    TEST_RUN(test_gemm_f16);
    TEST_RUN(test_gemm_bf16);
    TEST_RUN(test_gemm_q8_0);
    TEST_RUN(test_gemm_q4_0);
    TEST_RUN(test_gemm_q4_K);
    TEST_RUN(test_gemm_q5_K);
    TEST_RUN(test_gemm_q6_K);
    TEST_RUN(test_gemm_empty);
    return TEST_DONE();
}
