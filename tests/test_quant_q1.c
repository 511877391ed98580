/*
 * test_quant_q1.c - the Q4_1 and Q5_1 formats (x = d * q + m; SmolLM2's
 * weights are Q4_1): bit-exact against golden blocks from the gguf Python
 * package (tests/data/gen_quant_q1_golden.py), round-trip error on Gaussian
 * data, the reference dot product with Q8_0 activations against float64,
 * and the interleaved layout byte for byte.
 */
#include <math.h>
#include <string.h>

#include "format/quant.h"
#include "kernels/kernels.h"
#include "test.h"
#include "base/util.h"
#include "data/q4_1_q5_1_golden.h"

typedef struct {
    uint32_t type;
    const uint32_t *input;  /* 7 blocks of floats */
    const uint8_t *quant;   /* what gguf.quants.quantize gives for them */
    const uint8_t *blocks;  /* those 7 blocks and 3 random ones */
    const uint32_t *floats; /* gguf.quants.dequantize of the 10 */
} golden;

static const golden goldens[] = {
    {LM_TYPE_Q4_1, golden_q4_1_input, golden_q4_1_quant, golden_q4_1_blocks, golden_q4_1_floats},
    {LM_TYPE_Q5_1, golden_q5_1_input, golden_q5_1_quant, golden_q5_1_blocks, golden_q5_1_floats},
};

static void test_table(void) {
    CHECK(sizeof(block_q4_1) == 20 && sizeof(block_q5_1) == 24);
    CHECK(quant_supported(LM_TYPE_Q4_1) && quant_supported(LM_TYPE_Q5_1));
    CHECK(quant_traits(LM_TYPE_Q4_1)->vec_dot_type == LM_TYPE_Q8_0);
    CHECK(quant_traits(LM_TYPE_Q5_1)->vec_dot_type == LM_TYPE_Q8_0);
    CHECK(quant_row_size(LM_TYPE_Q4_1, 576) == 18 * 20 && quant_row_size(LM_TYPE_Q5_1, 64) == 48);
    CHECK(quant_row_size(LM_TYPE_Q4_1, 48) == 0);
    CHECK(quant_type_from_name("q4_1") == LM_TYPE_Q4_1 && quant_type_from_name("Q5_1") == LM_TYPE_Q5_1);
    CHECK(quant_pack_rows(LM_TYPE_Q4_1) == LM_PACK_ROWS && quant_pack_rows(LM_TYPE_Q5_1) == LM_PACK_ROWS);
    CHECK(quant_pack_size(LM_TYPE_Q4_1, 9, 64) == 2 * 2 * 160 && quant_pack_size(LM_TYPE_Q5_1, 8, 32) == 192);
    CHECK(quant_packed_x_row_size(LM_TYPE_Q4_1, 64) == quant_packed_act_row_size(64));
}

/* Dequantization, reference and dispatched, bit for bit. */
static void test_golden_dequant(void) {
    for (size_t g = 0; g < sizeof goldens / sizeof goldens[0]; g++) {
        float out[320];
        for (int pass = 0; pass < 2; pass++) {
            memset(out, 0, sizeof out);
            if (pass == 0) quant_to_float_ref(goldens[g].type, goldens[g].blocks, out, 320);
            else kernels_type(goldens[g].type)->to_float(goldens[g].blocks, out, 320);
            int bad = -1;
            uint32_t bits = 0;
            for (int i = 0; i < 320 && bad < 0; i++) {
                memcpy(&bits, &out[i], 4);
                if (bits != goldens[g].floats[i]) bad = i;
            }
            CHECKF(bad < 0, "%s pass %d element %d: %08x vs %08x", quant_type_name(goldens[g].type), pass, bad,
                   (unsigned)bits, bad < 0 ? 0u : (unsigned)goldens[g].floats[bad]);
        }
    }
}

/* Quantization, reference and dispatched, byte for byte. */
static void test_golden_quant(void) {
    for (size_t g = 0; g < sizeof goldens / sizeof goldens[0]; g++) {
        float x[224];
        memcpy(x, goldens[g].input, sizeof x);
        size_t bytes = quant_row_size(goldens[g].type, 224);
        uint8_t q[7 * 24];
        for (int pass = 0; pass < 2; pass++) {
            memset(q, 0xAA, sizeof q);
            if (pass == 0) quant_from_float_ref(goldens[g].type, x, q, 224);
            else kernels_type(goldens[g].type)->from_float(x, q, 224);
            int bad = -1;
            for (size_t i = 0; i < bytes && bad < 0; i++)
                if (q[i] != goldens[g].quant[i]) bad = (int)i;
            CHECKF(bad < 0, "%s pass %d: byte %d (block %d) is 0x%02x, gguf 0x%02x", quant_type_name(goldens[g].type),
                   pass, bad, bad / (int)(bytes / 7), bad < 0 ? 0 : q[bad], bad < 0 ? 0 : goldens[g].quant[bad]);
        }
    }
}

/* Relative RMS error on Gaussian data, a third of the blocks shifted by +4
 * (measured: Q4_1 3.07%, Q5_1 1.47%; bounds 3.5% and 1.7%), and every
 * element within d/2 of its block (plus the f16 rounding of m and d). */
static void test_roundtrip_error(void) {
    lm_rng r;
    lm_rng_seed(&r, 3);
    enum { N = 4096 };
    static float x[N], y[N];
    static uint8_t q[N / 32 * 24];
    const uint32_t types[] = {LM_TYPE_Q4_1, LM_TYPE_Q5_1};
    const double bound[] = {0.035, 0.017};
    for (int t = 0; t < 2; t++) {
        for (int i = 0; i < N; i++) x[i] = (float)lm_rng_normal(&r) + (i / 32 % 3 == 0 ? 4.0f : 0.0f);
        quant_from_float_ref(types[t], x, q, N);
        quant_to_float_ref(types[t], q, y, N);
        double num = 0, den = 0;
        int far = 0;
        for (int b = 0; b < N / 32; b++) {
            float lo = x[32 * b], hi = x[32 * b];
            for (int j = 0; j < 32; j++) lo = fminf(lo, x[32 * b + j]), hi = fmaxf(hi, x[32 * b + j]);
            double d = (hi - lo) / (t ? 31.0 : 15.0);
            for (int j = 0; j < 32; j++) {
                double e = (double)x[32 * b + j] - y[32 * b + j];
                num += e * e;
                far += fabs(e) > 0.5 * d * (1 + 0x1p-9) + fabs(lo) * 0x1p-11 + 32 * d * 0x1p-11;
            }
        }
        for (int i = 0; i < N; i++) den += (double)x[i] * x[i];
        double e = sqrt(num / den);
        printf("NOTE %s Gaussian rel RMS error %.4f%%\n", quant_type_name(types[t]), 100 * e);
        CHECKF(e < bound[t], "%s: %.4f", quant_type_name(types[t]), e);
        CHECKF(far == 0, "%s: %d elements further than half a step", quant_type_name(types[t]), far);
    }
}

/* vec_dot (reference and dispatched) against the float64 dot of the
 * dequantized rows: 1e-5 of sum |w x|. */
static void test_vec_dot(void) {
    lm_rng r;
    lm_rng_seed(&r, 5);
    const int lens[] = {32, 96, 224, 576, 1056, 1536};
    const uint32_t types[] = {LM_TYPE_Q4_1, LM_TYPE_Q5_1};
    for (int t = 0; t < 2; t++) {
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int n = lens[li];
            static float w[1536], x[1536], wd[1536], xd[1536];
            static uint8_t wq[1536 / 32 * 24], xq[1536 / 32 * 34];
            for (int i = 0; i < n; i++) w[i] = (float)lm_rng_normal(&r) + 0.3f, x[i] = (float)lm_rng_normal(&r);
            quant_from_float_ref(types[t], w, wq, n);
            quant_act_from_float(types[t], x, xq, n);
            quant_to_float_ref(types[t], wq, wd, n);
            quant_to_float_ref(LM_TYPE_Q8_0, xq, xd, n);
            double ref = 0, mag = 0;
            for (int i = 0; i < n; i++) ref += (double)wd[i] * xd[i], mag += fabs((double)wd[i] * xd[i]);
            float got_ref = quant_vec_dot_ref(types[t], n, wq, xq);
            float got = kernels_type(types[t])->vec_dot(n, wq, xq);
            CHECKF(fabs(got_ref - ref) <= 1e-6 * mag, "%s n %d: ref %g vs %g", quant_type_name(types[t]), n, got_ref,
                   ref);
            CHECKF(fabs(got - ref) <= 1e-5 * mag, "%s n %d: %g vs %g", quant_type_name(types[t]), n, got, ref);
        }
    }
}

/* The interleaved layout: row r's d at 2r, m at 16 + 2r, then the 4-byte
 * chunks (Q5_1: qh first) at 32 + 32k + 4r; padding rows zero. */
static void test_pack_layout(void) {
    const uint32_t types[] = {LM_TYPE_Q4_1, LM_TYPE_Q5_1};
    for (int t = 0; t < 2; t++) {
        const int64_t rows = 11, cols = 64;
        const size_t bs = quant_traits(types[t])->type_size, rb = 2 * bs + 6; /* padded stride */
        uint8_t src[11 * (2 * 24 + 6)];
        for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)(i * 7 + 3);
        size_t size = quant_pack_size(types[t], rows, cols), bb = size / 4;
        uint8_t *p = lm_malloc(size);
        quant_pack(types[t], src, rb, rows, cols, p);
        int bad = 0;
        for (int g = 0; g < 2; g++)
            for (int b = 0; b < 2; b++) {
                const uint8_t *o = p + (size_t)(2 * g + b) * bb;
                for (int r = 0; r < 8; r++) {
                    int row = 8 * g + r;
                    uint8_t want[24] = {0};
                    if (row < rows) memcpy(want, src + (size_t)row * rb + (size_t)b * bs, bs);
                    bad |= memcmp(o + 2 * r, want, 2) != 0 || memcmp(o + 16 + 2 * r, want + 2, 2) != 0;
                    for (size_t k = 0; k < (bs - 4) / 4; k++)
                        bad |= memcmp(o + 32 + 32 * k + 4 * r, want + 4 + 4 * k, 4) != 0;
                }
            }
        lm_free(p);
        CHECKF(!bad, "%s", quant_type_name(types[t]));
    }
}

int main(void) {
    kernels_init();
    TEST_RUN(test_table);
    TEST_RUN(test_golden_dequant);
    TEST_RUN(test_golden_quant);
    TEST_RUN(test_roundtrip_error);
    TEST_RUN(test_vec_dot);
    TEST_RUN(test_pack_layout);
    return TEST_DONE();
}
