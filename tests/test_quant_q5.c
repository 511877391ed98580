/*
 * test_quant_q5.c - the Q5_0 format (used by downloaded K-quant mixes for
 * rows that are not a multiple of 256): bit-exact against golden blocks from
 * the gguf Python package, quantize/dequantize error, and the dot product
 * against float64.
 */
#include <math.h>
#include <string.h>

#include "format/quant.h"
#include "kernels/kernels.h"
#include "test.h"
#include "base/util.h"
#include "data/q5_0_golden.h"

static void test_golden_dequant(void) {
    float out[96];
    quant_to_float_ref(LM_TYPE_Q5_0, q5_0_golden_q, out, 96);
    for (int i = 0; i < 96; i++) {
        unsigned int bits;
        memcpy(&bits, &out[i], 4);
        CHECKF(bits == q5_0_golden_dq_bits[i], "element %d: %08x vs %08x", i, bits, q5_0_golden_dq_bits[i]);
    }
}

static void test_golden_quant(void) {
    unsigned char q[sizeof q5_0_golden_q];
    quant_from_float_ref(LM_TYPE_Q5_0, q5_0_golden_x, q, 96);
    CHECK(memcmp(q, q5_0_golden_q, sizeof q) == 0);
    CHECK(quant_row_size(LM_TYPE_Q5_0, 96) == sizeof q);
}

/* Relative RMS error on Gaussian data: 4.3% measured, bound 5%. */
static void test_roundtrip_error(void) {
    lm_rng r;
    lm_rng_seed(&r, 3);
    enum { N = 4096 };
    static float x[N], y[N];
    static unsigned char q[N / 32 * 22];
    for (int i = 0; i < N; i++) x[i] = lm_rng_normal(&r);
    quant_from_float_ref(LM_TYPE_Q5_0, x, q, N);
    quant_to_float_ref(LM_TYPE_Q5_0, q, y, N);
    double num = 0, den = 0;
    for (int i = 0; i < N; i++) num += (double)(x[i] - y[i]) * (x[i] - y[i]), den += (double)x[i] * x[i];
    double e = sqrt(num / den);
    printf("NOTE Q5_0 Gaussian rel RMS error %.4f%%\n", 100 * e);
    CHECK(e < 0.05);
}

/* vec_dot against the float64 dot of the dequantized rows (1e-5 of sum|wx|). */
static void test_vec_dot(void) {
    lm_rng r;
    lm_rng_seed(&r, 5);
    int lens[] = {32, 96, 224, 1056};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        int n = lens[li];
        float w[1056], x[1056], wd[1056], xd[1056];
        unsigned char wq[1056 / 32 * 22], xq[1056 / 32 * 34];
        for (int i = 0; i < n; i++) w[i] = lm_rng_normal(&r), x[i] = lm_rng_normal(&r);
        quant_from_float_ref(LM_TYPE_Q5_0, w, wq, n);
        quant_act_from_float(LM_TYPE_Q5_0, x, xq, n);
        quant_to_float_ref(LM_TYPE_Q5_0, wq, wd, n);
        quant_to_float_ref(LM_TYPE_Q8_0, xq, xd, n);
        double ref = 0, mag = 0;
        for (int i = 0; i < n; i++) ref += (double)wd[i] * xd[i], mag += fabs((double)wd[i] * xd[i]);
        float got = kernels_type(LM_TYPE_Q5_0)->vec_dot(n, wq, xq);
        CHECKF(fabs(got - ref) <= 1e-5 * mag, "n %d: %g vs %g", n, got, ref);
    }
    CHECK(quant_supported(LM_TYPE_Q5_0));
}

int main(void) {
    kernels_init();
    TEST_RUN(test_golden_dequant);
    TEST_RUN(test_golden_quant);
    TEST_RUN(test_roundtrip_error);
    TEST_RUN(test_vec_dot);
    return TEST_DONE();
}
