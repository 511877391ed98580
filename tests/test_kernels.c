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
 *    32 up to 1280 plus 2048 and 2816 for Q8_0/Q4_0/Q5_0/Q4_1/Q5_1; 256, 512, 768, 1024,
 *    2048 and 2816 for the K-quants; for F32/F16/BF16 also lengths that end
 *    in a short tail (1, 7, 15, 17, 33, 100, ...).
 *  - activation quantizers Q8_0, Q8_K and F16: blocks byte-identical to
 *    quant_from_float_ref on Gaussian rows of many scales, exact rounding
 *    ties, zero, constant, tiny (f16-subnormal and float-subnormal) and huge
 *    rows, and ties for the largest magnitude with opposite signs.
 *  - gemm tiles: for every type, random lengths and padded strides, every
 *    nr, nc in 1..4 (a quarter of the trials on the longest rows): each
 *    output bit-identical (memcmp) to that type's AVX2 vec_dot, and nothing
 *    outside the tile written.
 *  - interleaved (packed) Q8_0/Q4_0/Q5_0/Q4_1/Q5_1/Q4_K tiles: against quant_vec_dot_ref on
 *    the original rows and the float64 dot (same tolerance) for 1..29 rows
 *    (partial last groups) and 32..2816 columns; bit-identical to
 *    themselves for every tile width 1..8 and token position; nothing
 *    written past the valid rows. block_q8_0s activations byte-identical to
 *    the reference. Through ops_matmul on two threads: each token's outputs
 *    bit-identical for batches of 1..9 at any position.
 *  - KV conversions to float (F16, Q8_0): bit for bit the reference's, for
 *    every one of the 65,536 halves (NaNs stay NaNs) at lengths with and
 *    without a tail, and for random Q8_0 blocks.
 *  - the AVX2 lookup table: every weight type has vec_dot and gemm, Q8_0/Q8_K
 *    and F16 have from_float, F16/Q8_0 to_float, other types get NULL; only
 *    Q8_0/Q4_0/Q5_0/Q4_1/Q5_1/Q4_K (and F16 panels) have packed kernels.
 *  - Q4_1 and Q5_1 through ops_matmul, packed and row-major, for every
 *    batch of 1 to 64 tokens and odd shapes, against the scalar reference.
 *  - the kernel table (kernels.h): filled with the AVX2 entries on this
 *    CPU; kernels_use(LM_ISA_SCALAR) and LAMINA_NO_SIMD=1 leave every entry
 *    the scalar reference (matrix, conversion, element-wise, attention);
 *    LAMINA_NO_REPACK=1 drops only the packed kernels.
 *
 * On a CPU without AVX2/FMA/F16C the program prints a SKIP line and counts
 * nothing.
 */
#include "kernels/avx2.h"
#include "kernels/avx2_attn.h"
#include "kernels/avx2_ops.h"
#include "kernels/kernels.h"
#include "kernels/scalar.h"

#include "kernel_check.h"

#if defined(__x86_64__) || defined(__i386__)

static const uint32_t weight_types[] = {LM_TYPE_F32,  LM_TYPE_F16,  LM_TYPE_BF16, LM_TYPE_Q8_0,
                                        LM_TYPE_Q4_0, LM_TYPE_Q5_0, LM_TYPE_Q4_1, LM_TYPE_Q5_1,
                                        LM_TYPE_Q4_K, LM_TYPE_Q5_K, LM_TYPE_Q6_K};
#define N_WEIGHT_TYPES (sizeof weight_types / sizeof weight_types[0])

/* An activation row in the weight type's vec_dot_type. */
static void make_act(uint32_t wt, int64_t n, void *dst) {
    float *f = lm_malloc((size_t)n * sizeof(float));
    fill_normal(f, n, 1.0);
    quant_from_float_ref(act_type(wt), f, dst, n);
    lm_free(f);
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
            CHECKF(fabs((double)got - ref) <= tol, "%s n=%lld: avx2 %.9g ref %.9g (tol %.3g)", quant_type_name(wt),
                   (long long)n, got, ref, tol);
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

static void test_vec_dot_q5_0(void) {
    check_vec_dot_type(LM_TYPE_Q5_0, false);
    check_vec_dot_type(LM_TYPE_Q5_0, true);
}

static void test_vec_dot_q4_1(void) {
    check_vec_dot_type(LM_TYPE_Q4_1, false);
    check_vec_dot_type(LM_TYPE_Q4_1, true);
}

static void test_vec_dot_q5_1(void) {
    check_vec_dot_type(LM_TYPE_Q5_1, false);
    check_vec_dot_type(LM_TYPE_Q5_1, true);
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
    for (size_t ti = 3; ti < N_WEIGHT_TYPES; ti++) {
        char msg[160] = "";
        check_extremes(weight_types[ti], 2048, avx2_kernels(weight_types[ti])->vec_dot, true, msg, sizeof msg);
        CHECKF(!msg[0], "avx2 %s", msg);
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
        CHECKF(same, "%s kind %d n=%lld: blocks differ from the reference at byte %zu", quant_type_name(type), kind,
               (long long)n, first);
    }
}

static void test_quantize_q8_0(void) { check_quantizer(LM_TYPE_Q8_0); }

/* F16 activations: every length 0..300 (tails shorter than a vector),
 * values from 1e-9 to 1e6 (subnormal and overflowing halves), zeros,
 * infinities and exact rounding ties: the same bits as lm_f32_to_f16. */
static void test_quantize_f16(void) {
    const lm_avx2_kernels *k = avx2_kernels(LM_TYPE_F16);
    CHECK(k && k->from_float);
    static const float special[] = {
        0.0f,          -0.0f,         INFINITY,       -INFINITY,          65504.0f,
        65519.99f,     65520.0f,      -65520.0f,      1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048,
        5.9604645e-8f, 2.9802322e-8f, 2.98023259e-8f, 6.1035156e-5f,      6.1e-5f,
        -1e-9f};
    const size_t ns = sizeof special / sizeof special[0];
    for (int64_t n = 0; n <= 300; n++) {
        float *x = lm_malloc((size_t)(n + 1) * sizeof(float));
        uint16_t *a = lm_malloc((size_t)(n + 1) * 2), *b = lm_malloc((size_t)(n + 1) * 2);
        double scale = pow(10.0, (double)(n % 16) - 9.0);
        for (int64_t i = 0; i < n; i++)
            x[i] = lm_rng_u64(&rng) % 5 == 0 ? special[lm_rng_u64(&rng) % ns] : (float)(lm_rng_normal(&rng) * scale);
        quant_from_float_ref(LM_TYPE_F16, x, a, n);
        k->from_float(x, b, n);
        int64_t bad = -1;
        for (int64_t i = 0; i < n && bad < 0; i++)
            if (a[i] != b[i]) bad = i;
        CHECKF(bad < 0, "n=%lld: element %lld (%.9g): %04x, reference %04x", (long long)n, (long long)bad,
               bad < 0 ? 0.0 : (double)x[bad], bad < 0 ? 0 : b[bad], bad < 0 ? 0 : a[bad]);
        lm_free(x);
        lm_free(a);
        lm_free(b);
    }
}
static void test_quantize_q8_K(void) { check_quantizer(LM_TYPE_Q8_K); }

/* ---- gemm tiles ------------------------------------------------------------ */

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static void check_gemm_type(uint32_t wt) {
    const lm_avx2_kernels *k = avx2_kernels(wt);
    CHECK(k && k->gemm && k->vec_dot);
    int64_t ns[64];
    int nn = lengths(wt, ns);
    uint32_t at = act_type(wt);
    const int maxr = LM_GEMM_TILE;
    for (int trial = 0; trial < 16; trial++) {
        /* every fourth trial the longest rows (blocked along their length) */
        int64_t n = trial % 4 == 3 ? ns[nn - 1 - trial / 4 % 2] : ns[lm_rng_u64(&rng) % (uint64_t)nn];
        /* strides padded by a few units of 4 bytes (keeps every row aligned) */
        size_t ws = quant_row_size(wt, n) + 4 * (size_t)(lm_rng_u64(&rng) % 4);
        size_t xs = quant_row_size(at, n) + 4 * (size_t)(lm_rng_u64(&rng) % 4);
        uint8_t *w = lm_malloc((size_t)maxr * ws), *x = lm_malloc(4 * xs);
        for (int r = 0; r < maxr; r++) make_weight(wt, n, trial & 1, w + (size_t)r * ws);
        for (int c = 0; c < 4; c++) make_act(wt, n, x + (size_t)c * xs);
        float *want = lm_malloc((size_t)maxr * 4 * sizeof(float));
        for (int r = 0; r < maxr; r++)
            for (int c = 0; c < 4; c++) want[r * 4 + c] = k->vec_dot(n, w + (size_t)r * ws, x + (size_t)c * xs);
        size_t ylen = 4 * ((size_t)maxr + 2);
        float *y = lm_malloc(ylen * sizeof(float));
        int bad = 0;
        char msg[160] = "";
        for (int nr = 1; nr <= maxr && !bad; nr++) {
            for (int nc = 1; nc <= 4 && !bad; nc++) {
                size_t ys = (size_t)nr + (size_t)(lm_rng_u64(&rng) % 3);
                for (size_t i = 0; i < ylen; i++) y[i] = -1234.5f;
                k->gemm(n, w, ws, nr, x, xs, nc, y, ys);
                for (size_t i = 0; i < ylen && !bad; i++) {
                    size_t c = i / ys, r = i % ys;
                    bool inside = c < (size_t)nc && r < (size_t)nr;
                    if (inside && !same_bits(y[i], want[r * 4 + c])) {
                        bad = 1;
                        snprintf(msg, sizeof msg, "n=%lld nr=%d nc=%d (r %zu, c %zu): gemm %.9g vec_dot %.9g",
                                 (long long)n, nr, nc, r, c, y[i], want[r * 4 + c]);
                    } else if (!inside && y[i] != -1234.5f) {
                        bad = 1;
                        snprintf(msg, sizeof msg, "n=%lld nr=%d nc=%d: wrote outside the tile at %zu", (long long)n, nr,
                                 nc, i);
                    }
                }
            }
        }
        lm_free(y);
        lm_free(want);
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
static void test_gemm_q5_0(void) { check_gemm_type(LM_TYPE_Q5_0); }
static void test_gemm_q4_1(void) { check_gemm_type(LM_TYPE_Q4_1); }
static void test_gemm_q5_1(void) { check_gemm_type(LM_TYPE_Q5_1); }
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

/* ---- interleaved (packed) tiles -------------------------------------------- */

/* block_q8_0s activations: AVX2 bit-identical to the reference. */
static void test_packed_act(void) {
    const lm_avx2_kernels *k = avx2_kernels(LM_TYPE_Q8_0);
    CHECK(k && k->packed_act);
    for (int rep = 0; rep < 40; rep++) {
        int64_t n = 32 * (int64_t)(1 + lm_rng_u64(&rng) % 90);
        float *f = lm_malloc((size_t)n * sizeof(float));
        fill_normal(f, n, pow(10.0, (double)(rep % 9) - 4));
        if (rep == 3) memset(f, 0, (size_t)n * sizeof(float));
        if (rep == 4)
            for (int64_t i = 0; i < n; i++) f[i] = (float)(i % 64) - 31.5f; /* rounding ties */
        size_t bytes = quant_packed_act_row_size(n);
        uint8_t *a = lm_malloc(bytes), *b = lm_malloc(bytes);
        quant_packed_act_ref(f, a, n);
        k->packed_act(f, b, n);
        int same = memcmp(a, b, bytes) == 0;
        lm_free(f);
        lm_free(a);
        lm_free(b);
        CHECKF(same, "n=%lld rep %d: avx2 block_q8_0s differs from the reference", (long long)n, rep);
    }
}

/* Packed tiles against the scalar reference (quant_vec_dot_ref on the
 * original rows, and the float64 dot; tolerance TOL), and bit-identical to
 * themselves for every tile width 1..8 and position of a token in its
 * tile; rows past a group's last valid row and padding in y untouched.
 * Row counts 1..8k+7, so the last group is partial in most cases. */
static void check_packed_type(uint32_t wt) {
    const lm_avx2_kernels *k = avx2_kernels(wt);
    CHECK(k && k->packed_gemm && k->packed_act);
    static const int64_t row_counts[] = {1, 3, 8, 13, 16, 29};
    static const int64_t col_counts[] = {32, 64, 96, 320, 1280, 2816};
    static const int64_t col_counts_k[] = {256, 512, 1280, 2816};
    const bool kq = wt == LM_TYPE_Q4_K; /* Q8_K activations, super-blocks of 256 */
    const size_t n_cols = kq ? 4 : 6;
    const int n_tok = 11;
    for (size_t ri = 0; ri < sizeof row_counts / sizeof row_counts[0]; ri++) {
        for (size_t ci = 0; ci < n_cols; ci++) {
            int64_t rows = row_counts[ri], n = kq ? col_counts_k[ci] : col_counts[ci];
            bool random_bytes = (ri + ci) & 1;
            size_t rb = quant_row_size(wt, n), xs = quant_packed_x_row_size(wt, n),
                   qs = quant_row_size(act_type(wt), n);
            uint8_t *w = lm_malloc(rb * (size_t)rows), *wp = lm_malloc(quant_pack_size(wt, rows, n));
            uint8_t *x = lm_malloc(xs * (size_t)n_tok), *xq = lm_malloc(qs * (size_t)n_tok);
            float *f = lm_malloc((size_t)n * sizeof(float));
            for (int64_t r = 0; r < rows; r++) make_weight(wt, n, random_bytes, w + (size_t)r * rb);
            for (int c = 0; c < n_tok; c++) {
                fill_normal(f, n, 1.0);
                if (kq) quant_from_float_ref(LM_TYPE_Q8_K, f, x + (size_t)c * xs, n);
                else quant_packed_act_ref(f, x + (size_t)c * xs, n);
                quant_from_float_ref(act_type(wt), f, xq + (size_t)c * qs, n);
            }
            quant_pack(wt, w, rb, rows, n, wp);
            char msg[200] = "";
            check_packed_tiles(k->packed_gemm, wt, n, rows, w, wp, x, xs, xq, n_tok, LM_PACK_TILE, false, msg,
                               sizeof msg);
            lm_free(w);
            lm_free(wp);
            lm_free(x);
            lm_free(xq);
            lm_free(f);
            CHECKF(!msg[0], "%s rows=%lld n=%lld: %s", quant_type_name(wt), (long long)rows, (long long)n, msg);
        }
    }
}

static void test_packed_q8_0(void) { check_packed_type(LM_TYPE_Q8_0); }
static void test_packed_q4_0(void) { check_packed_type(LM_TYPE_Q4_0); }
static void test_packed_q4_K(void) { check_packed_type(LM_TYPE_Q4_K); }
static void test_packed_q5_0(void) { check_packed_type(LM_TYPE_Q5_0); }
static void test_packed_q4_1(void) { check_packed_type(LM_TYPE_Q4_1); }
static void test_packed_q5_1(void) { check_packed_type(LM_TYPE_Q5_1); }

/* ---- F16 panels --------------------------------------------------------------- */

/* quant_pack for F16: row r's element k of group g at half 16k + r of the
 * group, padding rows zero, any number of columns. */
static void test_pack_f16_layout(void) {
    static const int64_t shapes[][2] = {{1, 1}, {16, 5}, {17, 33}, {40, 16}, {3, 0}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t rows = shapes[si][0], cols = shapes[si][1];
        size_t groups = (size_t)(rows + 15) / 16, bytes = quant_pack_size(LM_TYPE_F16, rows, cols);
        CHECK(bytes == groups * 16 * (size_t)cols * 2);
        size_t stride = (size_t)cols * 2 + 6; /* rows not packed together */
        uint16_t *w = lm_malloc(stride * (size_t)rows + 2), *p = lm_malloc(bytes + 2);
        for (size_t i = 0; i < (stride * (size_t)rows) / 2; i++) w[i] = (uint16_t)lm_rng_u64(&rng);
        memset(p, 0xAB, bytes + 2);
        quant_pack(LM_TYPE_F16, w, stride, rows, cols, p);
        int bad = 0;
        for (size_t g = 0; g < groups && !bad; g++)
            for (int64_t k = 0; k < cols && !bad; k++)
                for (int r = 0; r < 16 && !bad; r++) {
                    int64_t row = (int64_t)g * 16 + r;
                    uint16_t want = row < rows ? w[((size_t)row * stride) / 2 + (size_t)k] : 0;
                    if (p[g * 16 * (size_t)cols + (size_t)k * 16 + (size_t)r] != want) bad = 1;
                }
        CHECKF(!bad, "F16 panel layout wrong for rows=%lld cols=%lld", (long long)rows, (long long)cols);
        CHECK(((uint8_t *)p)[bytes] == 0xAB); /* nothing written past the copy */
        lm_free(w);
        lm_free(p);
    }
}

/* F16 panel tiles: every output bit for bit the fmaf chain of
 * quant_panel_dot_ref, for tile widths 1..6 and every position of a token
 * in its tile; within the float64 dot by the usual bound for a sequential
 * float sum, n * 2^-24 * sum |w_i x_i|; y untouched past the rows. */
static void test_packed_f16(void) {
    const lm_avx2_kernels *k = avx2_kernels(LM_TYPE_F16);
    CHECK(k && k->packed_gemm && !k->packed_act && k->pack_tile == 6);
    static const int64_t row_counts[] = {1, 5, 16, 17, 40};
    static const int64_t col_counts[] = {0, 1, 7, 8, 15, 33, 100, 1000, 2816};
    const int n_tok = 13, tile = k->pack_tile;
    for (size_t ri = 0; ri < sizeof row_counts / sizeof row_counts[0]; ri++) {
        for (size_t ci = 0; ci < sizeof col_counts / sizeof col_counts[0]; ci++) {
            int64_t rows = row_counts[ri], n = col_counts[ci];
            size_t rb = quant_row_size(LM_TYPE_F16, n), groups = (size_t)(rows + 15) / 16;
            size_t gb = quant_pack_size(LM_TYPE_F16, 16, n);
            uint8_t *w = lm_malloc(rb * (size_t)rows + 2), *wp = lm_malloc(quant_pack_size(LM_TYPE_F16, rows, n) + 2);
            float *x = lm_malloc((size_t)n_tok * (size_t)n * sizeof(float) + 4),
                  *wf = lm_malloc((size_t)n * sizeof(float) + 4);
            for (int64_t r = 0; r < rows; r++) make_weight(LM_TYPE_F16, n, false, w + (size_t)r * rb);
            fill_normal(x, (int64_t)n_tok * n, ri & 1 ? 1e-3 : 1.0);
            quant_pack(LM_TYPE_F16, w, rb, rows, n, wp);
            const size_t ys = (size_t)rows + 3;
            float *y0 = lm_malloc(ys * n_tok * sizeof(float)), *y1 = lm_malloc(ys * n_tok * sizeof(float));
            int bad = 0;
            char msg[200] = "";
            for (int width = 1; width <= tile && !bad; width++) {
                for (int first = 0; first < 2 && !bad; first++) {
                    for (size_t i = 0; i < ys * n_tok; i++) y1[i] = -1234.5f;
                    for (size_t g = 0; g < groups; g++) {
                        int nr = rows - 16 * (int64_t)g < 16 ? (int)(rows - 16 * (int64_t)g) : 16;
                        for (int c = 0; c < n_tok;) {
                            int nc = c == 0 && first ? 1 : (n_tok - c < width ? n_tok - c : width);
                            k->packed_gemm(n, wp + g * gb, nr, x + (size_t)c * (size_t)n, (size_t)n * sizeof(float), nc,
                                           y1 + (size_t)c * ys + 16 * g, ys);
                            c += nc;
                        }
                    }
                    if (width == 1 && !first) memcpy(y0, y1, ys * n_tok * sizeof(float));
                    for (int c = 0; c < n_tok && !bad; c++) {
                        for (size_t r = 0; r < ys && !bad; r++) {
                            float got = y1[(size_t)c * ys + r];
                            if (r >= (size_t)rows) {
                                if (got != -1234.5f) {
                                    bad = 1;
                                    snprintf(msg, sizeof msg, "wrote past the last row (token %d, %zu)", c, r);
                                }
                                continue;
                            }
                            const float *xc = x + (size_t)c * (size_t)n;
                            float ref = quant_panel_dot_ref(n, wp + (r / 16) * gb, (int)(r % 16), xc);
                            quant_to_float_ref(LM_TYPE_F16, w + r * rb, wf, n);
                            double exact = 0, abs_sum = 0;
                            for (int64_t i = 0; i < n; i++) {
                                exact += (double)wf[i] * xc[i];
                                abs_sum += fabs((double)wf[i] * xc[i]);
                            }
                            double tol = (double)n * ldexp(1.0, -24) * abs_sum;
                            if (memcmp(&got, &ref, sizeof got) != 0 || fabs((double)got - exact) > tol) {
                                bad = 1;
                                snprintf(
                                    msg, sizeof msg,
                                    "tile %d: row %zu token %d: panel %.9g fmaf chain %.9g float64 %.9g (tol %.3g)",
                                    width, r, c, got, ref, exact, tol);
                            }
                        }
                    }
                }
            }
            lm_free(w);
            lm_free(wp);
            lm_free(x);
            lm_free(wf);
            lm_free(y0);
            lm_free(y1);
            CHECKF(!bad, "F16 rows=%lld n=%lld: %s", (long long)rows, (long long)n, msg);
        }
    }
}

/* Through ops_matmul, with the packed copy a model would hold, on a pool of
 * two threads: every token's outputs bit-identical whatever the batch size
 * (1..9) and the token's position in the batch; rows 37 and 69 leave the
 * last group partial; cols 64 and 2816. */
static void check_matmul_batch_invariance(uint32_t wt) {
    if (!kernels_type(wt)->packed_gemm) return; /* LAMINA_NO_REPACK: nothing to test */
    lm_pool *pool = pool_new(2);
    CHECK(pool);
    static const int64_t shapes[][2] = {{37, 64}, {69, 2816}, {8, 32}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t rows = shapes[si][0], n = shapes[si][1];
        if (n % quant_traits(wt)->blck) n = quant_traits(wt)->blck * (si + 1); /* K-quants: 256, 768 */
        size_t rb = quant_row_size(wt, n);
        uint8_t *w = lm_malloc(rb * (size_t)rows), *wp = lm_malloc(quant_pack_size(wt, rows, n));
        for (int64_t r = 0; r < rows; r++) make_weight(wt, n, r & 1, w + (size_t)r * rb);
        quant_pack(wt, w, rb, rows, n, wp);
        lm_weight lw = {.data = w, .type = wt, .rows = rows, .cols = n, .row_bytes = rb, .packed = wp};
        const int max_tok = 9;
        float *x = lm_malloc((size_t)max_tok * (size_t)n * sizeof(float));
        fill_normal(x, (int64_t)max_tok * n, 1.0);
        void *scratch = lm_malloc(ops_matmul_scratch(wt, n, max_tok));
        float *alone = lm_malloc((size_t)max_tok * (size_t)rows * sizeof(float));
        float *y = lm_malloc((size_t)max_tok * (size_t)rows * sizeof(float));
        for (int t = 0; t < max_tok; t++)
            ops_matmul(pool, alone + (size_t)t * (size_t)rows, &lw, x + (size_t)t * (size_t)n, 1, scratch);
        int bad = 0;
        for (int n_tok = 1; n_tok <= max_tok && !bad; n_tok++) {
            for (int first = 0; first + n_tok <= max_tok && !bad; first += 2) {
                ops_matmul(pool, y, &lw, x + (size_t)first * (size_t)n, n_tok, scratch);
                if (memcmp(y, alone + (size_t)first * (size_t)rows, (size_t)n_tok * (size_t)rows * sizeof(float)))
                    bad = n_tok * 100 + first + 1;
            }
        }
        /* the row-major kernels of the same type agree within rounding
         * (F16: they take the activations rounded to F16, the panels the
         * floats), relative to the largest output */
        lm_weight plain = lw;
        plain.packed = NULL;
        ops_matmul(pool, y, &plain, x, 1, scratch);
        double worst = 0, scale = 1e-3;
        for (int64_t r = 0; r < rows; r++) scale = fmax(scale, fabs((double)alone[r]));
        for (int64_t r = 0; r < rows; r++) {
            double d = fabs((double)y[r] - alone[r]) / scale;
            if (d > worst) worst = d;
        }
        lm_free(w);
        lm_free(wp);
        lm_free(x);
        lm_free(scratch);
        lm_free(alone);
        lm_free(y);
        CHECKF(!bad, "%s rows=%lld n=%lld: batch of %d from token %d differs from tokens alone", quant_type_name(wt),
               (long long)rows, (long long)n, bad / 100, bad % 100 - 1);
        CHECKF(worst < 1e-3, "%s: packed and row-major products differ by %.3g (relative)", quant_type_name(wt), worst);
    }
    pool_free(pool);
}

static void test_matmul_batch_invariance(void) {
    check_matmul_batch_invariance(LM_TYPE_Q8_0);
    check_matmul_batch_invariance(LM_TYPE_Q4_0);
    check_matmul_batch_invariance(LM_TYPE_Q4_K);
    check_matmul_batch_invariance(LM_TYPE_Q5_0);
    check_matmul_batch_invariance(LM_TYPE_Q4_1);
    check_matmul_batch_invariance(LM_TYPE_Q5_1);
    check_matmul_batch_invariance(LM_TYPE_F16);
}

/* Q4_1 and Q5_1 through ops_matmul on two threads, packed and row-major,
 * for every batch of 1 to 64 tokens: each output against the scalar
 * reference (quant_vec_dot_ref with the token's Q8_0 row) and the float64
 * dot of the dequantized rows, within TOL of sum |w x|. Odd shapes: rows
 * that leave the last group of 8 partial, and row lengths of 1, 3, 18 and
 * 48 blocks (SmolLM2's 576 and 1536). */
static void check_matmul_tokens(uint32_t wt) {
    lm_pool *pool = pool_new(2);
    CHECK(pool);
    static const int64_t shapes[][2] = {{37, 576}, {13, 96}, {3, 32}, {9, 1536}};
    enum { MAX_TOK = 64 };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t rows = shapes[si][0], n = shapes[si][1];
        size_t rb = quant_row_size(wt, n);
        uint8_t *w = lm_malloc(rb * (size_t)rows), *wp = lm_malloc(quant_pack_size(wt, rows, n));
        for (int64_t r = 0; r < rows; r++) make_weight(wt, n, r % 3 == 1, w + (size_t)r * rb);
        quant_pack(wt, w, rb, rows, n, wp);
        float *x = lm_malloc((size_t)MAX_TOK * (size_t)n * sizeof(float));
        fill_normal(x, (int64_t)MAX_TOK * n, 1.0);
        double *ref = lm_malloc((size_t)MAX_TOK * (size_t)rows * sizeof(double));
        double *tol = lm_malloc((size_t)MAX_TOK * (size_t)rows * sizeof(double));
        /* quant_vec_dot_ref itself within TOL of the float64 dot */
        CHECK(matmul_reference(wt, n, rows, w, x, MAX_TOK, TOL, ref, tol));
        void *scratch = lm_malloc(ops_matmul_scratch(wt, n, MAX_TOK));
        float *y = lm_malloc((size_t)MAX_TOK * (size_t)rows * sizeof(float));
        char msg[200] = "";
        for (int packed = 0; packed < 2 && !msg[0]; packed++) {
            lm_weight lw = {
                .data = w, .type = wt, .rows = rows, .cols = n, .row_bytes = rb, .packed = packed ? wp : NULL};
            for (int n_tok = 1; n_tok <= MAX_TOK && !msg[0]; n_tok++) {
                ops_matmul(pool, y, &lw, x, n_tok, scratch);
                for (size_t i = 0; i < (size_t)n_tok * (size_t)rows && !msg[0]; i++)
                    if (!(fabs((double)y[i] - ref[i]) <= tol[i]))
                        snprintf(msg, sizeof msg, "%s batch %d: token %zu row %zu: %.9g vs reference %.9g",
                                 packed ? "packed" : "row-major", n_tok, i / (size_t)rows, i % (size_t)rows, y[i],
                                 ref[i]);
            }
        }
        lm_free(w);
        lm_free(wp);
        lm_free(x);
        lm_free(ref);
        lm_free(tol);
        lm_free(scratch);
        lm_free(y);
        CHECKF(!msg[0], "%s rows=%lld n=%lld: %s", quant_type_name(wt), (long long)rows, (long long)n, msg);
    }
    pool_free(pool);
}

static void test_matmul_tokens_q4_1(void) { check_matmul_tokens(LM_TYPE_Q4_1); }
static void test_matmul_tokens_q5_1(void) { check_matmul_tokens(LM_TYPE_Q5_1); }

/* ---- KV conversions -------------------------------------------------------- */

/* Same bits, or both NaN (F16C quietens a signalling NaN). */
static bool same_value_bits(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return same_bits(a, b);
}

static void test_to_float(void) {
    const lm_avx2_kernels *k16 = avx2_kernels(LM_TYPE_F16), *k8 = avx2_kernels(LM_TYPE_Q8_0);
    CHECK(k16 && k16->to_float == avx2_to_float_f16 && k8 && k8->to_float == avx2_to_float_q8_0);
    uint16_t *h = lm_malloc(65536 * sizeof(uint16_t));
    float *want = lm_malloc(65536 * sizeof(float)), *got = lm_malloc(65536 * sizeof(float));
    for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    quant_to_float_ref(LM_TYPE_F16, h, want, 65536);
    static const int64_t lens[] = {65536, 65535, 65529, 7, 1, 0};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        int64_t n = lens[li], off = 65536 - n; /* the tail covers the NaNs at the top */
        memset(got, 0, 65536 * sizeof(float));
        avx2_to_float_f16(h + off, got, n);
        int64_t bad = -1;
        for (int64_t i = 0; i < n && bad < 0; i++)
            if (!same_value_bits(got[i], want[off + i])) bad = off + i;
        CHECKF(bad < 0, "F16 n=%lld: half 0x%04llx", (long long)n, (long long)bad);
    }
    int64_t nq = 32 * 64;
    uint8_t *q = lm_malloc(quant_row_size(LM_TYPE_Q8_0, nq));
    fill_random_blocks(LM_TYPE_Q8_0, q, nq);
    quant_to_float_ref(LM_TYPE_Q8_0, q, want, nq);
    for (int64_t n = 32; n <= nq; n += 32 * 21) {
        avx2_to_float_q8_0(q, got, n);
        CHECKF(!memcmp(got, want, (size_t)n * sizeof(float)), "Q8_0 n=%lld", (long long)n);
    }
    lm_free(q);
    lm_free(h);
    lm_free(want);
    lm_free(got);
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
    CHECK(avx2_kernels(LM_TYPE_F16)->from_float == avx2_from_float_f16);
    CHECK(avx2_kernels(LM_TYPE_Q4_0)->from_float == NULL);
    CHECK(avx2_kernels(LM_TYPE_Q8_1) == NULL);
    CHECK(avx2_kernels(LM_TYPE_I8) == NULL);
    CHECK(avx2_kernels(LM_TYPE_COUNT) == NULL);
    CHECK(avx2_kernels(UINT32_MAX) == NULL);
    for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        const lm_avx2_kernels *k = avx2_kernels(weight_types[ti]);
        uint32_t wt = weight_types[ti];
        bool packed = wt == LM_TYPE_Q8_0 || wt == LM_TYPE_Q4_0 || wt == LM_TYPE_Q5_0 || wt == LM_TYPE_Q4_1 ||
            wt == LM_TYPE_Q5_1 || wt == LM_TYPE_Q4_K;
        CHECKF((k->packed_gemm != NULL) == (packed || wt == LM_TYPE_F16) && (k->packed_act != NULL) == packed &&
                   (k->pack_tile == LM_PACK_TILE) == packed,
               "%s", quant_type_name(wt));
    }
}

/* Every entry of the kernel table is its scalar reference. */
static bool table_is_scalar(void) {
    const lm_kernels *k = kernels();
    bool ok = k->isa == LM_ISA_SCALAR && !strcmp(kernels_isa_name(), "scalar");
    for (uint32_t t = 0; t < LM_TYPE_COUNT; t++) {
        const lm_type_traits *tr = quant_traits(t);
        const lm_type_kernels *e = &k->type[t];
        if (!tr) continue;
        ok &= e == kernels_type(t) && e->to_float == tr->to_float && e->from_float == tr->from_float &&
            e->vec_dot == tr->vec_dot && !e->gemm && !e->packed_gemm && !e->packed_act;
    }
    ok &= k->ew.rmsnorm == scalar_rmsnorm && k->ew.swiglu == scalar_swiglu && k->ew.geglu == scalar_geglu &&
        k->ew.gelu == scalar_gelu && k->ew.rope == scalar_rope;
    for (int hd = 8; hd <= 128; hd += 60) {
        const lm_attn_kernels *a = kernels_attn(hd);
        ok &= a->scores == scalar_attn_scores && a->pv == scalar_attn_pv && a->max == scalar_attn_max &&
            a->scale == scalar_attn_scale && a->exp_sum == scalar_attn_exp_sum;
    }
    return ok;
}

/* Sets (value) or clears (NULL) an environment variable. */
static void set_env(const char *name, const char *value) {
    if (value) setenv(name, value, 1);
    else unsetenv(name);
}

static void test_dispatch(void) {
    const char *ns = getenv("LAMINA_NO_SIMD"), *nr = getenv("LAMINA_NO_REPACK");
    char saved_ns[64] = "", saved_nr[64] = "";
    if (ns) snprintf(saved_ns, sizeof saved_ns, "%s", ns);
    if (nr) snprintf(saved_nr, sizeof saved_nr, "%s", nr);
    const char *cpu = getenv("LAMINA_CPU");
    char saved_cpu[64] = "";
    if (cpu) snprintf(saved_cpu, sizeof saved_cpu, "%s", cpu);
    set_env("LAMINA_NO_SIMD", NULL);
    set_env("LAMINA_NO_REPACK", NULL);
    /* the AVX2 table (a CPU with AVX-512 would choose a wider variant:
     * tests/test_kernels_x86.c tests those and LAMINA_CPU) */
    set_env("LAMINA_CPU", "avx2");

    /* this CPU has AVX2: every AVX2 entry is in the table */
    CHECK(kernels_cpu_isa() == LM_ISA_AVX2 && kernels_cpu_has(LM_ISA_AVX2));
    CHECK(kernels_use(-1) == 0);
    const lm_kernels *k = kernels();
    CHECK(k->isa == LM_ISA_AVX2 && !strcmp(kernels_isa_name(), "avx2"));
    for (uint32_t t = 0; t < LM_TYPE_COUNT; t++) {
        const lm_avx2_kernels *a = avx2_kernels(t);
        const lm_type_kernels *e = kernels_type(t);
        if (!quant_traits(t)) {
            CHECK(!e);
            continue;
        }
        const lm_type_traits *tr = quant_traits(t);
        CHECKF(e->to_float == (a && a->to_float ? a->to_float : tr->to_float) &&
                   e->from_float == (a && a->from_float ? a->from_float : tr->from_float) &&
                   e->vec_dot == (a && a->vec_dot ? a->vec_dot : tr->vec_dot) && e->gemm == (a ? a->gemm : NULL) &&
                   e->packed_gemm == (a ? a->packed_gemm : NULL) && e->packed_act == (a ? a->packed_act : NULL),
               "%s", quant_type_name(t));
    }
    CHECK(k->ew.rmsnorm == avx2_rmsnorm && k->ew.swiglu == avx2_swiglu && k->ew.geglu == avx2_geglu &&
          k->ew.gelu == avx2_gelu && k->ew.rope == avx2_rope_apply);
    CHECK(kernels_attn(64)->scores == attn_scores_avx2 && kernels_attn(64)->pv == attn_pv_avx2 &&
          kernels_attn(64)->exp_sum == attn_exp_sum_avx2);
    CHECK(kernels_attn(36)->scores == scalar_attn_scores); /* not a multiple of 8 */
    CHECK(kernels_type(LM_TYPE_COUNT) == NULL && kernels_type(UINT32_MAX) == NULL);

    /* in-process switch to the scalar reference, and back */
    CHECK(kernels_use(LM_ISA_SCALAR) == 0);
    CHECK(table_is_scalar());
    CHECK(kernels_use(LM_ISA_COUNT) == -1 && table_is_scalar()); /* no such ISA: unchanged */
    CHECK(kernels_use(LM_ISA_AVX2) == 0 && kernels()->isa == LM_ISA_AVX2);

    /* LAMINA_NO_SIMD=1: the scalar reference everywhere; "0" and "" do not count */
    set_env("LAMINA_NO_SIMD", "1");
    CHECK(kernels_use(-1) == 0 && table_is_scalar());
    set_env("LAMINA_NO_SIMD", "0");
    CHECK(kernels_use(-1) == 0 && kernels()->isa == LM_ISA_AVX2);
    set_env("LAMINA_NO_SIMD", "");
    CHECK(kernels_use(-1) == 0 && kernels()->isa == LM_ISA_AVX2);
    set_env("LAMINA_NO_SIMD", NULL);

    /* LAMINA_NO_REPACK=1: the row-major AVX2 kernels, no packed ones */
    set_env("LAMINA_NO_REPACK", "1");
    CHECK(kernels_use(-1) == 0 && kernels()->isa == LM_ISA_AVX2);
    for (uint32_t t = 0; t < LM_TYPE_COUNT; t++) {
        const lm_type_kernels *e = &kernels()->type[t];
        CHECK(!e->packed_gemm && !e->packed_act && !e->pack_tile);
    }
    CHECK(kernels_type(LM_TYPE_Q4_0)->gemm == avx2_gemm_q4_0);

    set_env("LAMINA_NO_SIMD", ns ? saved_ns : NULL);
    set_env("LAMINA_NO_REPACK", nr ? saved_nr : NULL);
    set_env("LAMINA_CPU", cpu ? saved_cpu : NULL);
    CHECK(kernels_use(-1) == 0);
}

int main(void) {
    if (!cpu_has_avx2()) {
        printf("SKIP test_kernels: this CPU (or OS) lacks AVX2/FMA/F16C\n");
        return TEST_DONE();
    }
    lm_rng_seed(&rng, 20240611);
    TEST_RUN(test_table);
    TEST_RUN(test_dispatch);
    TEST_RUN(test_to_float);
    TEST_RUN(test_vec_dot_float);
    TEST_RUN(test_vec_dot_q8_0);
    TEST_RUN(test_vec_dot_q4_0);
    TEST_RUN(test_vec_dot_q5_0);
    TEST_RUN(test_vec_dot_q4_1);
    TEST_RUN(test_vec_dot_q5_1);
    TEST_RUN(test_vec_dot_q4_K);
    TEST_RUN(test_vec_dot_q5_K);
    TEST_RUN(test_vec_dot_q6_K);
    TEST_RUN(test_vec_dot_extremes);
    TEST_RUN(test_quantize_q8_0);
    TEST_RUN(test_quantize_f16);
    TEST_RUN(test_quantize_q8_K);
    TEST_RUN(test_gemm_f32);
    TEST_RUN(test_gemm_f16);
    TEST_RUN(test_gemm_bf16);
    TEST_RUN(test_gemm_q8_0);
    TEST_RUN(test_gemm_q4_0);
    TEST_RUN(test_gemm_q5_0);
    TEST_RUN(test_gemm_q4_1);
    TEST_RUN(test_gemm_q5_1);
    TEST_RUN(test_gemm_q4_K);
    TEST_RUN(test_gemm_q5_K);
    TEST_RUN(test_gemm_q6_K);
    TEST_RUN(test_gemm_empty);
    TEST_RUN(test_packed_act);
    TEST_RUN(test_pack_f16_layout);
    TEST_RUN(test_packed_f16);
    TEST_RUN(test_packed_q8_0);
    TEST_RUN(test_packed_q4_0);
    TEST_RUN(test_packed_q4_K);
    TEST_RUN(test_packed_q5_0);
    TEST_RUN(test_packed_q4_1);
    TEST_RUN(test_packed_q5_1);
    TEST_RUN(test_matmul_batch_invariance);
    TEST_RUN(test_matmul_tokens_q4_1);
    TEST_RUN(test_matmul_tokens_q5_1);
    return TEST_DONE();
}

#else /* not x86: the AVX2 kernels do not exist here (test_kernels_isa covers this CPU's variants) */

int main(void) {
    printf("SKIP test_kernels: the AVX2 kernels are x86-64 only\n");
    (void)test_cur_failed_;
    return TEST_DONE();
}

#endif
