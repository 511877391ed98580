/*
 * test_quant.c - the numerical formats of quant.c against independent
 * references.
 *
 *  - f16/bf16: every one of the 65,536 half values round-trips exactly (NaN
 *    stays NaN) and decodes to the value its bits define (computed with
 *    ldexp in double); float -> half rounding is checked on hand-picked ties,
 *    subnormals and overflows, against numpy's conversion (golden), and on
 *    ~1M float bit patterns against a round-half-even reference in double.
 *  - golden vectors (tests/data/quant_golden.h, produced by the `gguf`
 *    Python package's reference quantizers): dequantization of every type
 *    bit for bit (reference and dispatched kernels), and Q8_0/Q4_0
 *    quantization byte for byte.
 *  - quantize -> dequantize error: relative RMS error on Gaussian rows under
 *    a stated bound per type (measured values in the comment of
 *    rt_bounds), per-element bounds where the format gives one, and zero,
 *    constant, large, small, tiny and mixed-magnitude rows.
 *  - vec_dot of every weight type: against the float64 dot of the
 *    dequantized weight and dequantized activation rows (|err| <= 1e-5 *
 *    sum|w*x|), and against the float64 dot with the original activations
 *    (|err| <= sum_i |w_i| * step_i + 1e-5 * sum|w*x|, step_i being the
 *    largest activation quantization error of element i's block), for rows
 *    of 1, 3, 7 and 33 blocks; the dispatched table entries are held to the
 *    same bounds (BF16 on avx512bf16, which rounds the activations to BF16,
 *    to that kernel's stated bound on top).
 *  - the type table: sizes (against the gguf package's list), names,
 *    supported set, vec_dot types, activation row sizes.
 *  - the interleaved layout of Q4_0/Q8_0 (quant_pack) byte for byte against
 *    quant.h's description, padding rows zero; block_q8_0s activations
 *    against the Q8_0 reference quantizer.
 */
#include "format/quant.h"
#include "kernels/kernels.h"

#include <ctype.h>
#include <stdint.h>

#include "test.h"
#include "base/util.h"
#include "data/quant_golden.h"

static const uint32_t weight_types[] = {LM_TYPE_F32,  LM_TYPE_F16,  LM_TYPE_BF16, LM_TYPE_Q8_0,
                                        LM_TYPE_Q4_0, LM_TYPE_Q4_K, LM_TYPE_Q5_K, LM_TYPE_Q6_K};
#define N_WEIGHT_TYPES (sizeof weight_types / sizeof weight_types[0])

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* The value an IEEE half encodes, from its fields, in double. */
static double ref_f16_value(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
    double v;
    if (exp == 0) v = ldexp(man, -24);
    else if (exp == 31) v = man ? NAN : INFINITY;
    else v = ldexp(1024 + man, exp - 25);
    return sign ? -v : v;
}

/* The value a bfloat16 encodes (the top half of a float), in double. */
static double ref_bf16_value(uint16_t h) {
    int sign = h >> 15, exp = (h >> 7) & 255, man = h & 127;
    double v;
    if (exp == 0) v = ldexp(man, -133);
    else if (exp == 255) v = man ? NAN : INFINITY;
    else v = ldexp(128 + man, exp - 134);
    return sign ? -v : v;
}

/* Round a finite float to a format with `mant` stored mantissa bits, minimum
 * normal exponent emin and largest finite value fmax, to nearest with ties
 * to even, in double (exact: the quotient by the quantum is an integer or a
 * half-integer that fits in 53 bits). Returns the rounded value (+-inf on
 * overflow). */
static double ref_round(double x, int mant, int emin, double fmax) {
    double a = fabs(x);
    int e;
    frexp(a, &e); /* a = f * 2^e, f in [0.5, 1) */
    e -= 1;       /* a in [2^e, 2^(e+1)) */
    if (a == 0 || e < emin) e = emin;
    double quantum = ldexp(1.0, e - mant);
    double r = nearbyint(a / quantum) * quantum; /* default mode: ties to even */
    if (r > fmax) r = INFINITY;
    return x < 0 ? -r : r;
}

/* ---- f16 / bf16 --------------------------------------------------------- */

static void test_f16_exhaustive(void) {
    uint16_t *h = malloc(65536 * 2), *back = malloc(65536 * 2);
    float *f = malloc(65536 * 4);
    CHECK(h && back && f);
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    quant_to_float_ref(LM_TYPE_F16, h, f, 65536);
    quant_from_float_ref(LM_TYPE_F16, f, back, 65536);
    int bad = -1;
    for (uint32_t i = 0; i < 65536 && bad < 0; i++) {
        double want = ref_f16_value(h[i]);
        if (f32_bits(f[i]) != f32_bits(lm_f16_to_f32(h[i]))) bad = (int)i;
        if (isnan(want)) {
            /* NaN stays NaN with its sign; the payload is not promised */
            if (!isnan(f[i]) || (back[i] & 0x7c00) != 0x7c00 || !(back[i] & 0x3ff) ||
                (back[i] & 0x8000) != (h[i] & 0x8000))
                bad = (int)i;
        } else if ((double)f[i] != want || back[i] != h[i] || !signbit(f[i]) != !(h[i] >> 15)) {
            bad = (int)i;
        }
    }
    CHECKF(bad < 0, "half 0x%04x -> %g -> 0x%04x (want %g)", bad, bad < 0 ? 0.0 : (double)f[bad],
           bad < 0 ? 0 : back[bad], bad < 0 ? 0.0 : ref_f16_value((uint16_t)bad));
    free(h), free(back), free(f);
}

static void test_bf16_exhaustive(void) {
    uint16_t *h = malloc(65536 * 2), *back = malloc(65536 * 2);
    float *f = malloc(65536 * 4);
    CHECK(h && back && f);
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    quant_to_float_ref(LM_TYPE_BF16, h, f, 65536);
    quant_from_float_ref(LM_TYPE_BF16, f, back, 65536);
    int bad = -1;
    for (uint32_t i = 0; i < 65536 && bad < 0; i++) {
        double want = ref_bf16_value(h[i]);
        if (isnan(want)) {
            if (!isnan(f[i]) || (back[i] & 0x7f80) != 0x7f80 || !(back[i] & 0x7f) ||
                (back[i] & 0x8000) != (h[i] & 0x8000))
                bad = (int)i;
        } else if ((double)f[i] != want || back[i] != h[i]) {
            bad = (int)i;
        }
    }
    CHECKF(bad < 0, "bf16 0x%04x round trip", bad);
    free(h), free(back), free(f);
}

/* Hand-picked float -> half cases: the expected bits follow from the
 * definition of round-half-even (comments give the reasoning). */
static void test_half_rounding_hand_picked(void) {
    static const struct {
        float x;
        uint16_t f16, bf16;
    } cases[] = {
        {1.0f, 0x3c00, 0x3f80},
        {-0.0f, 0x8000, 0x8000},
        {1.0f + 0x1p-11f, 0x3c00, 0x3f80},            /* f16 tie 1 | 1+2^-10: even is 1 */
        {1.0f + 3 * 0x1p-11f, 0x3c02, 0x3f80},        /* f16 tie 0x3c01 | 0x3c02: even */
        {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01, 0x3f80}, /* just above the tie */
        {1.0f + 0x1p-8f, 0x3c04, 0x3f80},             /* bf16 tie 0x3f80 | 0x3f81: even */
        {1.0f + 3 * 0x1p-8f, 0x3c0c, 0x3f82},         /* bf16 tie 0x3f81 | 0x3f82: even */
        {65504.0f, 0x7bff, 0x4780},                   /* largest half */
        {65519.0f, 0x7bff, 0x4780},                   /* below the overflow midpoint */
        {65520.0f, 0x7c00, 0x4780},                   /* tie 65504 (odd) | 65536: inf */
        {-1e10f, 0xfc00, 0xd015},                     /* overflow keeps the sign */
        {0x1p-24f, 0x0001, 0x3380},                   /* smallest subnormal half */
        {0x1p-25f, 0x0000, 0x3300},                   /* tie 0 | 2^-24: even is 0 */
        {0x1p-25f + 0x1p-40f, 0x0001, 0x3300},        /* above the tie */
        {3 * 0x1p-25f, 0x0002, 0x33c0},               /* tie 1 | 2: even is 2 */
        {-0x1p-26f, 0x8000, 0xb280},                  /* underflow keeps the sign */
        {0x1p-14f - 0x1p-25f, 0x0400, 0x3880},        /* tie 0x3ff | 0x400 (normal) */
        {INFINITY, 0x7c00, 0x7f80},
        {-INFINITY, 0xfc00, 0xff80},
        {0x1.fffffep127f, 0x7c00, 0x7f80}, /* FLT_MAX: bf16 rounds to inf */
        {0x1p-133f, 0x0000, 0x0001},       /* smallest bf16 subnormal */
        {0x1p-134f, 0x0000, 0x0000},       /* bf16 tie 0 | 2^-133: even */
        {0x1.8p-133f, 0x0000, 0x0002},     /* bf16 tie 1 | 2: even */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t h = lm_f32_to_f16(cases[i].x), b = lm_f32_to_bf16(cases[i].x);
        CHECKF(h == cases[i].f16, "case %zu: f16(%a) = 0x%04x, want 0x%04x", i, (double)cases[i].x, h, cases[i].f16);
        CHECKF(b == cases[i].bf16, "case %zu: bf16(%a) = 0x%04x, want 0x%04x", i, (double)cases[i].x, b, cases[i].bf16);
    }
    CHECK(isnan(lm_f16_to_f32(lm_f32_to_f16(NAN))));
    CHECK(isnan(lm_bf16_to_f32(lm_f32_to_bf16(-NAN))));
}

/* ~1M float bit patterns spread over the whole range (odd stride, so every
 * exponent and many mantissas are visited) against ref_round. */
static void test_half_rounding_sweep(void) {
    uint32_t u = 0;
    for (long k = 0; k < (1L << 20); k++, u += 4099u) {
        float x = bits_f32(u);
        if (isnan(x)) continue;
        double want16 = ref_round(x, 10, -14, 65504.0);
        double want_b = ref_round(x, 7, -126, 0x1.fep127);
        double got16 = ref_f16_value(lm_f32_to_f16(x)), got_b = ref_bf16_value(lm_f32_to_bf16(x));
        CHECKF(got16 == want16 && !signbit(got16) == !signbit(x), "f16(%a) = %a, want %a", (double)x, got16, want16);
        CHECKF(got_b == want_b && !signbit(got_b) == !signbit(x), "bf16(%a) = %a, want %a", (double)x, got_b, want_b);
    }
}

/* numpy's float16 conversion and gguf's bf16 conversion of awkward floats. */
static void test_half_golden(void) {
    size_t n = sizeof golden_half_input / sizeof golden_half_input[0];
    for (size_t i = 0; i < n; i++) {
        float x = bits_f32(golden_half_input[i]);
        uint16_t h = lm_f32_to_f16(x), b = lm_f32_to_bf16(x);
        if (isnan(x)) {
            CHECK(isnan(lm_f16_to_f32(h)) && isnan(lm_bf16_to_f32(b)));
            continue;
        }
        CHECKF(h == golden_f16_bits[i], "f16(%a) = 0x%04x, numpy 0x%04x", (double)x, h, golden_f16_bits[i]);
        CHECKF(b == golden_bf16_bits[i], "bf16(%a) = 0x%04x, gguf 0x%04x", (double)x, b, golden_bf16_bits[i]);
    }
}

/* ---- golden vectors ------------------------------------------------------- */

static void test_golden_dequant(void) {
    for (size_t c = 0; c < sizeof golden_dequant_cases / sizeof golden_dequant_cases[0]; c++) {
        const golden_dequant *g = &golden_dequant_cases[c];
        float *y = malloc((size_t)g->n * sizeof(float));
        CHECK(y);
        quant_to_float_ref(g->type, g->blocks, y, g->n);
        for (int64_t i = 0; i < g->n; i++)
            CHECKF(f32_bits(y[i]) == g->floats[i], "%s element %lld: %a, gguf %a", quant_type_name(g->type),
                   (long long)i, (double)y[i], (double)bits_f32(g->floats[i]));
        /* The dispatched variant must give the same bits too: the products
         * in dequantization are exact, so only the final subtraction rounds,
         * whatever the instruction sequence (see quant.c). */
        const lm_type_kernels *t = kernels_type(g->type);
        CHECK(t && t->to_float);
        memset(y, 0, (size_t)g->n * sizeof(float));
        t->to_float(g->blocks, y, g->n);
        for (int64_t i = 0; i < g->n; i++)
            CHECKF(f32_bits(y[i]) == g->floats[i], "dispatched %s element %lld", quant_type_name(g->type),
                   (long long)i);
        free(y);
    }
}

static void test_golden_quant(void) {
    for (size_t c = 0; c < sizeof golden_quant_cases / sizeof golden_quant_cases[0]; c++) {
        const golden_quant *g = &golden_quant_cases[c];
        size_t bytes = quant_row_size(g->type, g->n);
        float *x = malloc((size_t)g->n * sizeof(float));
        uint8_t *q = malloc(bytes);
        CHECK(x && q && bytes > 0);
        for (int64_t i = 0; i < g->n; i++) x[i] = bits_f32(g->input[i]);
        quant_from_float_ref(g->type, x, q, g->n);
        for (size_t i = 0; i < bytes; i++)
            CHECKF(q[i] == g->blocks[i], "%s byte %zu: 0x%02x, gguf 0x%02x", quant_type_name(g->type), i, q[i],
                   g->blocks[i]);
        free(x), free(q);
    }
}

/* ---- quantize -> dequantize ----------------------------------------------- */

/* Relative RMS error bounds on N(0, s^2) data, for rows of 16 super-blocks
 * (4096 values) and for single 256-value blocks. Measured over 1000 seeds
 * at s = 1 (row: mean / max; block: max):
 *   F16   0.021% / 0.022%  block 0.025%     Q4_0  8.57% / 9.11%  block 10.7%
 *   BF16  0.166% / 0.175%  block 0.202%     Q4_K  7.01% / 7.33%  block 8.38%
 *   Q8_0  0.534% / 0.557%  block 0.716%     Q5_K  3.46% / 3.62%  block 4.08%
 *   Q8_K  0.686% / 0.764%  block 1.18%      Q6_K  1.72% / 1.80%  block 2.08%
 * and the same for s from 1e-2 to 1e4. The bounds sit ~5-15% above those
 * maxima. (Q8_K's block error follows its single largest value, hence the
 * spread.) */
static const struct {
    uint32_t type;
    double row, block;
} rt_bounds[] = {
    {LM_TYPE_F16, 0.00025, 0.0003}, {LM_TYPE_BF16, 0.0019, 0.0023}, {LM_TYPE_Q8_0, 0.006, 0.0082},
    {LM_TYPE_Q4_0, 0.097, 0.122},   {LM_TYPE_Q4_K, 0.078, 0.095},   {LM_TYPE_Q5_K, 0.039, 0.046},
    {LM_TYPE_Q6_K, 0.0195, 0.024},  {LM_TYPE_Q8_K, 0.0085, 0.0135},
};
#define N_RT (sizeof rt_bounds / sizeof rt_bounds[0])
#define RT_N (16 * QK_K)

/* x -> type -> float into y; returns the relative RMS error. */
static double roundtrip(uint32_t type, const float *x, float *y, int64_t n) {
    size_t bytes = quant_row_size(type, n);
    void *q = malloc(bytes);
    if (!q) return INFINITY;
    quant_from_float_ref(type, x, q, n);
    quant_to_float_ref(type, q, y, n);
    free(q);
    double *ref = malloc((size_t)n * sizeof(double));
    if (!ref) return INFINITY;
    for (int64_t i = 0; i < n; i++) ref[i] = x[i];
    double e = test_rel_l2(y, ref, (size_t)n);
    free(ref);
    return e;
}

static void fill_normal(float *x, int64_t n, double scale, uint64_t seed) {
    lm_rng r;
    lm_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(lm_rng_normal(&r) * scale);
}

static void test_roundtrip_gaussian(void) {
    float *x = malloc(RT_N * sizeof(float)), *y = malloc(RT_N * sizeof(float));
    CHECK(x && y);
    static const double scales[] = {1.0, 1e-2, 1e2, 1e4};
    for (size_t t = 0; t < N_RT; t++) {
        for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
            for (uint64_t seed = 1; seed <= 3; seed++) {
                fill_normal(x, RT_N, scales[s], seed * 1000 + t);
                double e = roundtrip(rt_bounds[t].type, x, y, RT_N);
                CHECKF(e < rt_bounds[t].row, "%s scale %g seed %llu: rel RMS %.5f >= %.5f",
                       quant_type_name(rt_bounds[t].type), scales[s], (unsigned long long)seed, e, rt_bounds[t].row);
                if (s == 0 && seed == 1)
                    printf("NOTE %-4s Gaussian rel RMS error %.4f%% (bound %.4f%%)\n",
                           quant_type_name(rt_bounds[t].type), 100 * e, 100 * rt_bounds[t].row);
            }
        }
    }
    free(x), free(y);
}

/* Where the format gives a per-element bound, check it on every element:
 * F16 |e| <= 2^-11 |x| and BF16 2^-8 |x| (normal range); Q8_0 rounds to
 * d = max|x|/127 and stores d in f16, so |e| <= d/2 + 127 d 2^-11 < 0.57 d;
 * Q4_0 with |d| = max|x|/8 is off by at most |d| (the element opposite the
 * maximum clamps from 16 to 15) plus 8 |d| 2^-11; Q8_K |e| <= |d|. */
static void test_roundtrip_elementwise(void) {
    float *x = malloc(RT_N * sizeof(float)), *y = malloc(RT_N * sizeof(float));
    CHECK(x && y);
    fill_normal(x, RT_N, 3.0, 77);
    roundtrip(LM_TYPE_F16, x, y, RT_N);
    for (int i = 0; i < RT_N; i++) CHECK(fabs((double)y[i] - x[i]) <= 0x1p-11 * fabs(x[i]));
    roundtrip(LM_TYPE_BF16, x, y, RT_N);
    for (int i = 0; i < RT_N; i++) CHECK(fabs((double)y[i] - x[i]) <= 0x1p-8 * fabs(x[i]));
    static const struct {
        uint32_t type;
        int blck;
        double per_amax;
    } blk[] = {
        {LM_TYPE_Q8_0, 32, 0.57 / 127},
        {LM_TYPE_Q4_0, 32, (1 + 8 * 0x1p-11) / 8},
        {LM_TYPE_Q8_K, 256, 1.0 / 128},
    };
    for (size_t t = 0; t < sizeof blk / sizeof blk[0]; t++) {
        roundtrip(blk[t].type, x, y, RT_N);
        for (int b = 0; b < RT_N; b += blk[t].blck) {
            double amax = 0;
            for (int i = b; i < b + blk[t].blck; i++) amax = fmax(amax, fabs(x[i]));
            for (int i = b; i < b + blk[t].blck; i++)
                CHECKF(fabs((double)y[i] - x[i]) <= blk[t].per_amax * amax * (1 + 1e-6),
                       "%s element %d: %g -> %g (block max %g)", quant_type_name(blk[t].type), i, (double)x[i],
                       (double)y[i], amax);
        }
    }
    free(x), free(y);
}

/* Zero rows decode to exact zeros; constant rows (any sign) to the constant
 * within the f16 rounding of the scale: 2^-10 relative (2^-8 for BF16).
 * Below |c| = 0.25 Q6_K's super-scale d = |c| / (32 * 127) is an f16
 * subnormal with fewer significant bits, and the products d * sc it can
 * form land up to ~0.15% away (measured 0.13% at |c| = 0.01): 2e-3 there. */
static void test_roundtrip_special_rows(void) {
    float *x = malloc(RT_N * sizeof(float)), *y = malloc(RT_N * sizeof(float));
    CHECK(x && y);
    for (size_t t = 0; t < N_RT; t++) {
        uint32_t type = rt_bounds[t].type;
        memset(x, 0, RT_N * sizeof(float));
        roundtrip(type, x, y, RT_N);
        for (int i = 0; i < RT_N; i++) CHECKF(y[i] == 0.0f, "%s zero row", quant_type_name(type));
        static const float consts[] = {0.37f, -2.5f, 1000.0f, -0.01f, 1.0f};
        for (size_t c = 0; c < sizeof consts / sizeof consts[0]; c++) {
            for (int i = 0; i < RT_N; i++) x[i] = consts[c];
            roundtrip(type, x, y, RT_N);
            double rel = type == LM_TYPE_BF16                     ? 0x1p-8
                : type == LM_TYPE_Q6_K && fabs(consts[c]) < 0.25f ? 2e-3
                                                                  : 0x1p-10;
            double tol = rel * fabs(consts[c]);
            for (int i = 0; i < RT_N; i++)
                CHECKF(fabs((double)y[i] - consts[c]) <= tol, "%s constant %g -> %g", quant_type_name(type),
                       (double)consts[c], (double)y[i]);
        }
    }
    free(x), free(y);
}

/* Rows whose blocks differ in magnitude by up to 1e4 (each 256-block scaled
 * by 10^(b mod 5 - 2)): each block is coded on its own scale, so every
 * block meets the single-block Gaussian bound. Tiny inputs
 * (s = 1e-6) fall below the f16 scales of the quantized types: they must
 * still decode to finite values no farther off than zero would be. */
static void test_roundtrip_magnitudes(void) {
    float *x = malloc(RT_N * sizeof(float)), *y = malloc(RT_N * sizeof(float));
    double *ref = malloc(RT_N * sizeof(double));
    CHECK(x && y && ref);
    for (size_t t = 0; t < N_RT; t++) {
        uint32_t type = rt_bounds[t].type;
        fill_normal(x, RT_N, 1.0, 99 + t);
        for (int i = 0; i < RT_N; i++) x[i] *= (float)pow(10.0, (i / QK_K) % 5 - 2);
        roundtrip(type, x, y, RT_N);
        for (int b = 0; b < RT_N; b += QK_K) {
            for (int i = 0; i < QK_K; i++) ref[i] = x[b + i];
            double e = test_rel_l2(y + b, ref, QK_K);
            CHECKF(e < rt_bounds[t].block, "%s block %d (scale %g): rel RMS %.5f", quant_type_name(type), b / QK_K,
                   pow(10.0, (b / QK_K) % 5 - 2), e);
        }
        fill_normal(x, RT_N, 1e-6, 5 + t);
        double e = roundtrip(type, x, y, RT_N);
        for (int i = 0; i < RT_N; i++) CHECK(isfinite(y[i]));
        CHECKF(e <= 1.0 + 1e-6, "%s tiny row: rel RMS %.4f", quant_type_name(type), e);
    }
    free(x), free(y), free(ref);
}

/* Q8_K: bsums are the sums of each 16 q, and the element of largest
 * magnitude lands on -128 exactly. */
static void test_q8_K_layout(void) {
    float x[2 * QK_K];
    block_q8_K b[2];
    fill_normal(x, 2 * QK_K, 2.0, 123);
    x[17] = 9.0f;          /* block 0 maximum, positive */
    x[QK_K + 200] = -9.5f; /* block 1 maximum, negative */
    quant_from_float_ref(LM_TYPE_Q8_K, x, b, 2 * QK_K);
    for (int k = 0; k < 2; k++)
        for (int g = 0; g < QK_K / 16; g++) {
            int s = 0;
            for (int e = 16 * g; e < 16 * g + 16; e++) s += b[k].qs[e];
            CHECK(b[k].bsums[g] == s);
        }
    CHECK(b[0].qs[17] == -128 && b[1].qs[200] == -128);
    CHECK(fabs(b[0].d * -128.0 - 9.0) <= 1e-6 && fabs(b[1].d * -128.0 + 9.5) <= 1e-6);
}

/* ---- dot products ------------------------------------------------------------- */

/* Largest error activation quantization can make on an element, as a
 * multiple of its block's max|x|: Q8_0 0.57/127 (see
 * test_roundtrip_elementwise), Q8_K 1/128 (the clamped element), F32 0. */
static double act_step(uint32_t act_type) {
    /* F16: round-to-nearest of a normal value, relative error <= 2^-11 */
    return act_type == LM_TYPE_Q8_0 ? 0.57 / 127
        : act_type == LM_TYPE_Q8_K  ? 1.0 / 128
        : act_type == LM_TYPE_F16   ? 1.0 / 2048
                                    : 0.0;
}

/* One weight type, one row length: checks both bounds described at the top
 * for the reference kernel and the dispatched one. */
static void check_vec_dot(uint32_t type, int64_t n, uint64_t seed, double w_scale) {
    const lm_type_traits *t = quant_traits(type), *at = quant_traits(t->vec_dot_type);
    size_t wbytes = quant_row_size(type, n), xbytes = quant_act_row_size(type, n);
    float *w = malloc((size_t)n * 4), *x = malloc((size_t)n * 4);
    float *wd = malloc((size_t)n * 4), *xd = malloc((size_t)n * 4);
    void *wq = malloc(wbytes), *xq = malloc(xbytes);
    CHECK(w && x && wd && xd && wq && xq && wbytes && xbytes);
    fill_normal(w, n, w_scale, seed);
    fill_normal(x, n, 1.0, seed + 1);
    quant_from_float_ref(type, w, wq, n);
    quant_act_from_float(type, x, xq, n);
    quant_to_float_ref(type, wq, wd, n);
    quant_to_float_ref(t->vec_dot_type, xq, xd, n);

    double exact = 0, mag = 0, orig = 0, act_err = 0;
    for (int64_t i = 0; i < n; i++) {
        exact += (double)wd[i] * xd[i];
        mag += fabs((double)wd[i] * xd[i]);
        orig += (double)wd[i] * x[i];
    }
    double step = act_step(t->vec_dot_type);
    for (int64_t b = 0; b < n; b += at->blck) {
        double amax = 0, wsum = 0;
        for (int64_t i = b; i < b + at->blck; i++) {
            amax = fmax(amax, fabs(x[i]));
            wsum += fabs(wd[i]);
        }
        act_err += wsum * step * amax;
    }
    float got[2] = {quant_vec_dot_ref(type, n, wq, xq), kernels_type(type)->vec_dot(n, wq, xq)};
    /* BF16 weights on avx512bf16: vdpbf16ps rounds the activations to BF16,
     * within the bound kernels/avx512bf16_dot.c states */
    double bf16_tol = type == LM_TYPE_BF16 && kernels()->isa == LM_ISA_AVX512BF16
        ? ldexp(1.0, -8) + (double)(n / 16 + 8) * ldexp(1.0, -24)
        : 0;
    for (int k = 0; k < 2; k++) {
        double tol = 1e-5 + (k ? bf16_tol : 0);
        CHECKF(fabs(got[k] - exact) <= tol * mag, "%s%s n=%lld: %.9g vs dequantized %.9g (sum|wx| %g)",
               k ? "dispatched " : "", quant_type_name(type), (long long)n, (double)got[k], exact, mag);
        CHECKF(fabs(got[k] - orig) <= act_err + tol * mag, "%s%s n=%lld: %.9g vs float activations %.9g, bound %g",
               k ? "dispatched " : "", quant_type_name(type), (long long)n, (double)got[k], orig, act_err + tol * mag);
    }
    free(w), free(x), free(wd), free(xd), free(wq), free(xq);
}

static void test_vec_dot(void) {
    static const int nblocks[] = {1, 3, 7, 33};
    for (size_t t = 0; t < N_WEIGHT_TYPES; t++) {
        int64_t blk = quant_traits(weight_types[t])->blck;
        if (blk == 1) blk = 32; /* float types: use the smallest block length */
        for (size_t k = 0; k < sizeof nblocks / sizeof nblocks[0]; k++) {
            check_vec_dot(weight_types[t], nblocks[k] * blk, 10 * t + k, 0.05);
            if (test_cur_failed_) return;
        }
        check_vec_dot(weight_types[t], 7 * blk, 500 + t, 300.0); /* large weights */
        if (test_cur_failed_) return;
    }
}

/* A zero weight row or a zero activation row gives exactly 0. */
static void test_vec_dot_zero(void) {
    enum { N = 2 * QK_K };
    float ones[N], zeros[N];
    for (int i = 0; i < N; i++) ones[i] = 1.0f + (float)(i % 7), zeros[i] = 0.0f;
    for (size_t t = 0; t < N_WEIGHT_TYPES; t++) {
        uint32_t type = weight_types[t];
        uint8_t wq[N * 4], xq[N * 4];
        CHECK(quant_row_size(type, N) <= sizeof wq && quant_act_row_size(type, N) <= sizeof xq);
        quant_from_float_ref(type, zeros, wq, N);
        quant_act_from_float(type, ones, xq, N);
        CHECKF(quant_vec_dot_ref(type, N, wq, xq) == 0.0f, "%s zero weights", quant_type_name(type));
        quant_from_float_ref(type, ones, wq, N);
        quant_act_from_float(type, zeros, xq, N);
        CHECKF(quant_vec_dot_ref(type, N, wq, xq) == 0.0f, "%s zero activations", quant_type_name(type));
    }
}

/* ---- the table ------------------------------------------------------------------ */

static void test_table_sizes(void) {
    /* every (id, name, block, bytes) the gguf package lists below
     * LM_TYPE_COUNT must be in the table, and nothing else */
    int listed = 0;
    for (size_t i = 0; i < sizeof golden_types / sizeof golden_types[0]; i++) {
        const golden_type *g = &golden_types[i];
        if (g->id >= LM_TYPE_COUNT) continue;
        listed++;
        /* The gguf package still lists Q8_1's old layout (f32 d and s, 40
         * bytes); GGUF engines use two f16 (36 bytes). Q8_1 is an activation
         * format that files never carry. */
        if (g->id == LM_TYPE_Q8_1) {
            CHECK(quant_traits(g->id) && quant_traits(g->id)->type_size == 36);
            continue;
        }
        const lm_type_traits *t = quant_traits(g->id);
        CHECKF(t, "type %u (%s) missing", g->id, g->name);
        CHECKF(strcmp(t->name, g->name) == 0, "type %u: %s vs %s", g->id, t->name, g->name);
        CHECKF(t->blck == g->blck && t->type_size == g->type_size, "%s: %lld/%zu vs %lld/%zu", g->name,
               (long long)t->blck, t->type_size, (long long)g->blck, g->type_size);
        CHECK(t->is_quantized == (g->blck > 1));
    }
    int present = 0;
    for (uint32_t id = 0; id < LM_TYPE_COUNT + 8; id++) present += quant_traits(id) != NULL;
    CHECKF(present == listed, "table has %d types, gguf lists %d", present, listed);

    CHECK(sizeof(block_q8_0) == quant_traits(LM_TYPE_Q8_0)->type_size);
    CHECK(sizeof(block_q4_0) == quant_traits(LM_TYPE_Q4_0)->type_size);
    CHECK(sizeof(block_q4_K) == quant_traits(LM_TYPE_Q4_K)->type_size);
    CHECK(sizeof(block_q5_K) == quant_traits(LM_TYPE_Q5_K)->type_size);
    CHECK(sizeof(block_q6_K) == quant_traits(LM_TYPE_Q6_K)->type_size);
    CHECK(sizeof(block_q8_K) == quant_traits(LM_TYPE_Q8_K)->type_size);

    CHECK(quant_row_size(LM_TYPE_Q4_K, 4096) == 16 * 144);
    CHECK(quant_row_size(LM_TYPE_Q6_K, 512) == 2 * 210);
    CHECK(quant_row_size(LM_TYPE_Q4_0, 64) == 36);
    CHECK(quant_row_size(LM_TYPE_F32, 7) == 28);
    CHECK(quant_row_size(LM_TYPE_BF16, 3) == 6);
    CHECK(quant_row_size(LM_TYPE_Q4_K, 100) == 0);
    CHECK(quant_row_size(LM_TYPE_Q8_0, -32) == 0);
    CHECK(quant_row_size(4, 32) == 0 && quant_row_size(LM_TYPE_COUNT, 32) == 0);
}

static void test_table_names(void) {
    for (uint32_t id = 0; id < LM_TYPE_COUNT; id++) {
        const lm_type_traits *t = quant_traits(id);
        if (!t) {
            CHECK(strcmp(quant_type_name(id), "unknown") == 0);
            continue;
        }
        CHECK(strcmp(quant_type_name(id), t->name) == 0);
        CHECK(quant_type_from_name(t->name) == (int)id);
        char lower[16];
        size_t k = 0;
        for (; t->name[k] && k < sizeof lower - 1; k++) lower[k] = (char)tolower((unsigned char)t->name[k]);
        lower[k] = 0;
        CHECK(quant_type_from_name(lower) == (int)id);
    }
    CHECK(quant_type_from_name("Q4_K ") == -1);
    CHECK(quant_type_from_name("") == -1);
    CHECK(quant_type_from_name("Q4") == -1);
    CHECK(strcmp(quant_type_name(999), "unknown") == 0);
    CHECK(quant_traits(999) == NULL);
}

static void test_table_kernels(void) {
    kernels_init();
    kernels_init(); /* idempotent */
    for (uint32_t id = 0; id < LM_TYPE_COUNT; id++) {
        bool want = false;
        for (size_t t = 0; t < N_WEIGHT_TYPES; t++) want |= weight_types[t] == id;
        want |= id == LM_TYPE_Q5_0;                       /* checked in test_quant_q5.c */
        want |= id == LM_TYPE_Q4_1 || id == LM_TYPE_Q5_1; /* checked in test_quant_q1.c */
        want |= id == LM_TYPE_MXFP4;                      /* checked in test_quant_mxfp4.c */
        CHECKF(quant_supported(id) == want, "quant_supported(%s)", quant_type_name(id));
    }
    CHECK(!quant_supported(LM_TYPE_Q8_K) && !quant_supported(999));
    const lm_type_traits *q8k = quant_traits(LM_TYPE_Q8_K);
    CHECK(q8k->from_float && q8k->to_float && !q8k->vec_dot);
    for (size_t t = 0; t < N_WEIGHT_TYPES; t++) {
        uint32_t id = weight_types[t];
        const lm_type_traits *tr = quant_traits(id);
        uint32_t want = id == LM_TYPE_F16 ? LM_TYPE_F16
            : tr->blck == 1               ? LM_TYPE_F32
            : tr->blck == 32              ? LM_TYPE_Q8_0
                                          : LM_TYPE_Q8_K;
        CHECKF(tr->vec_dot_type == want, "%s vec_dot_type %u", tr->name, tr->vec_dot_type);
        CHECK(tr->to_float && tr->from_float && tr->vec_dot);
    }
    CHECK(quant_act_row_size(LM_TYPE_Q4_K, 512) == 2 * 292);
    CHECK(quant_act_row_size(LM_TYPE_Q6_K, 256) == 292);
    CHECK(quant_act_row_size(LM_TYPE_Q4_0, 64) == 68);
    CHECK(quant_act_row_size(LM_TYPE_Q8_0, 32) == 34);
    CHECK(quant_act_row_size(LM_TYPE_F16, 10) == 20); /* F16 activations */
    CHECK(quant_act_row_size(LM_TYPE_BF16, 32) == 128);
    CHECK(quant_act_row_size(LM_TYPE_Q4_0, 48) == 0); /* not a whole block */
    CHECK(quant_act_row_size(LM_TYPE_Q4_K, 288) == 0);
    CHECK(quant_act_row_size(LM_TYPE_Q8_K, 256) == 0); /* activation-only type */
    CHECK(quant_act_row_size(LM_TYPE_Q8_1, 32) == 0);  /* not computed */
}

/* ---- interleaved layout ---------------------------------------------------- */

/* quant_pack against the layout quant.h states, written out independently
 * (an element's position computed from its row, block and index), for
 * row counts that do and do not fill the last group of 8; padding rows
 * are zero. */
static void check_pack_layout(uint32_t type) {
    const int64_t cols = 96, nb = cols / 32;
    /* bytes after the scale per row block (Q5_0: qh, then qs) */
    const size_t qb = type == LM_TYPE_Q4_0 ? 16 : type == LM_TYPE_Q5_0 ? 20 : 32;
    const size_t bs = 16 + 8 * qb; /* bytes per block column */
    const size_t sb = quant_row_size(type, 32);
    for (int64_t rows = 1; rows <= 19; rows += 6) {
        size_t rb = quant_row_size(type, cols);
        uint8_t *src = malloc(rb * (size_t)rows);
        for (size_t i = 0; i < rb * (size_t)rows; i++) src[i] = (uint8_t)(i * 131 + 7);
        int64_t groups = (rows + 7) / 8;
        size_t sz = quant_pack_size(type, rows, cols);
        CHECK(sz == (size_t)groups * (size_t)nb * bs);
        uint8_t *dst = malloc(sz);
        memset(dst, 0xAA, sz);
        quant_pack(type, src, rb, rows, cols, dst);
        for (int64_t g = 0; g < groups; g++)
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *col = dst + ((size_t)g * (size_t)nb + (size_t)b) * bs;
                for (int r = 0; r < 8; r++) {
                    int64_t row = 8 * g + r;
                    const uint8_t *blk = row < rows ? src + (size_t)row * rb + (size_t)b * sb : NULL;
                    CHECKF(memcmp(col + 2 * r, blk ? blk : (const uint8_t *)"\0\0", 2) == 0,
                           "%s rows %lld: scale of row %lld block %lld", quant_type_name(type), (long long)rows,
                           (long long)row, (long long)b);
                    for (size_t j = 0; j < qb; j++) {
                        uint8_t want = blk ? blk[2 + j] : 0;
                        uint8_t got = col[16 + 32 * (j / 4) + 4 * (size_t)r + j % 4];
                        CHECKF(got == want, "%s rows %lld: quant byte %zu of row %lld block %lld",
                               quant_type_name(type), (long long)rows, j, (long long)row, (long long)b);
                    }
                }
            }
        free(src);
        free(dst);
    }
}

/* Q4_K: per super-block column d[8], dmin[8], the scale words (word w of
 * row r at 32 + 32w + 4r), then qs byte j of row r at 128 + 32(j/4) + 4r +
 * j%4; padding rows zero. */
static void check_pack_layout_q4_K(void) {
    const int64_t cols = 512, nb = cols / 256;
    const size_t rb = quant_row_size(LM_TYPE_Q4_K, cols), bs = 8 * sizeof(block_q4_K);
    for (int64_t rows = 3; rows <= 17; rows += 7) {
        uint8_t *src = malloc(rb * (size_t)rows);
        for (size_t i = 0; i < rb * (size_t)rows; i++) src[i] = (uint8_t)(i * 131 + 7);
        int64_t groups = (rows + 7) / 8;
        size_t sz = quant_pack_size(LM_TYPE_Q4_K, rows, cols);
        CHECK(sz == (size_t)groups * (size_t)nb * bs && bs == 1152);
        uint8_t *dst = malloc(sz);
        memset(dst, 0xAA, sz);
        quant_pack(LM_TYPE_Q4_K, src, rb, rows, cols, dst);
        int bad = 0;
        for (int64_t g = 0; g < groups; g++)
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *col = dst + ((size_t)g * (size_t)nb + (size_t)b) * bs;
                for (int r = 0; r < 8; r++) {
                    int64_t row = 8 * g + r;
                    block_q4_K zero = {0}, blk = zero;
                    if (row < rows) memcpy(&blk, src + (size_t)row * rb + (size_t)b * sizeof blk, sizeof blk);
                    bad |= memcmp(col + 2 * r, &blk.d, 2) != 0 || memcmp(col + 16 + 2 * r, &blk.dmin, 2) != 0;
                    for (int j = 0; j < 12; j++) bad |= col[32 + 32 * (j / 4) + 4 * r + j % 4] != blk.scales[j];
                    for (int j = 0; j < 128; j++) bad |= col[128 + 32 * (j / 4) + 4 * r + j % 4] != blk.qs[j];
                }
            }
        CHECKF(!bad, "Q4_K interleaved layout wrong for rows %lld", (long long)rows);
        free(src);
        free(dst);
    }
}

static void test_pack_layout(void) {
    check_pack_layout(LM_TYPE_Q4_0);
    check_pack_layout(LM_TYPE_Q8_0);
    check_pack_layout(LM_TYPE_Q5_0);
    check_pack_layout_q4_K();
    /* other types have no interleaved layout; cols must be whole blocks
     * (F16 panels: groups of 16 rows, any cols; layout in test_kernels) */
    CHECK(quant_pack_size(LM_TYPE_Q4_K, 8, 128) == 0);
    CHECK(quant_pack_size(LM_TYPE_Q6_K, 8, 256) == 0);
    CHECK(quant_pack_size(LM_TYPE_BF16, 8, 64) == 0);
    CHECK(quant_pack_size(LM_TYPE_F16, 8, 63) == 16 * 63 * 2);
    CHECK(quant_pack_rows(LM_TYPE_F16) == 16 && quant_pack_rows(LM_TYPE_Q4_0) == 8 &&
          quant_pack_rows(LM_TYPE_Q6_K) == 0);
    CHECK(quant_pack_size(LM_TYPE_Q8_0, 8, 48) == 0);
    CHECK(quant_pack_size(LM_TYPE_Q8_0, 0, 64) == 0);
    CHECK(quant_packed_act_row_size(64) == 2 * sizeof(block_q8_0s));
    CHECK(sizeof(block_q8_0s) == 40);
}

/* block_q8_0s rows carry Q8_0's quants and scale bit for bit, the scale
 * widened, and 8 * the quant sum. */
static void test_packed_act_ref(void) {
    const int64_t n = 256;
    float x[256];
    for (int rep = 0; rep < 20; rep++) {
        for (int64_t i = 0; i < n; i++) x[i] = (float)(sin((double)(i * 7 + rep * 13)) * pow(10.0, rep % 7 - 3));
        if (rep == 5) memset(x, 0, sizeof x);
        block_q8_0 q[8];
        block_q8_0s p[8];
        quant_from_float_ref(LM_TYPE_Q8_0, x, q, n);
        quant_packed_act_ref(x, p, n);
        for (int b = 0; b < 8; b++) {
            int sum = 0;
            for (int j = 0; j < 32; j++) sum += q[b].qs[j];
            CHECK(memcmp(p[b].qs, q[b].qs, 32) == 0);
            CHECK(f32_bits(p[b].d) == f32_bits(lm_f16_to_f32(q[b].d)));
            CHECK(p[b].s8 == 8 * sum);
        }
    }
}

int main(void) {
    TEST_RUN(test_f16_exhaustive);
    TEST_RUN(test_bf16_exhaustive);
    TEST_RUN(test_half_rounding_hand_picked);
    TEST_RUN(test_half_rounding_sweep);
    TEST_RUN(test_half_golden);
    TEST_RUN(test_golden_dequant);
    TEST_RUN(test_golden_quant);
    TEST_RUN(test_roundtrip_gaussian);
    TEST_RUN(test_roundtrip_elementwise);
    TEST_RUN(test_roundtrip_special_rows);
    TEST_RUN(test_roundtrip_magnitudes);
    TEST_RUN(test_q8_K_layout);
    TEST_RUN(test_vec_dot);
    TEST_RUN(test_vec_dot_zero);
    TEST_RUN(test_table_sizes);
    TEST_RUN(test_table_names);
    TEST_RUN(test_table_kernels);
    TEST_RUN(test_pack_layout);
    TEST_RUN(test_packed_act_ref);
    return TEST_DONE();
}
