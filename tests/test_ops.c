/*
 * test_ops.c - the element-wise operations of the forward pass (RMSNorm,
 * SiLU- and GELU-gated products) through the kernels lamina picks at
 * start-up, against float64 formulas:
 *   rmsnorm  relative error <= 1e-6 per element
 *   swiglu, geglu  |y - ref| <= (4e-6 + 2.4e-7 |a|) |ref| + 1e-30, a the
 *            argument of their exp (-x, or -2 sqrt(2/pi)(x + 0.044715 x^3)):
 *            a float argument is only known to 2^-24 |a|, which e^a turns
 *            into that much relative error; this holds deep in the negative
 *            tail too, where a tanh written 1 - 2/(1+e^2y) loses everything
 * and the batch property: an element's result is the same bits whether it
 * is processed alone, in a short tail, or inside a long array.
 */
#include <math.h>
#include <string.h>

#include "ops.h"
#include "quant.h"
#include "test.h"
#include "util.h"

enum { N = 1003 };
static float in_g[N], in_u[N];

static double silu_ref(double g) { return g / (1.0 + exp(-g)); }
/* 0.5 g (1 + tanh(y)) written g / (1 + e^(-2y)): the same function without
 * the cancellation that would cost even double its precision for g << 0 */
static double gelu_ref(double g) { return g / (1.0 + exp(-2.0 * 0.7978845608028654 * (g + 0.044715 * g * g * g))); }

static void fill(void) {
    lm_rng r;
    lm_rng_seed(&r, 42);
    for (int i = 0; i < N; i++) {
        in_g[i] = (float)((lm_rng_uniform(&r) * 2 - 1) * (i % 7 == 0 ? 30 : 6));
        in_u[i] = lm_rng_normal(&r);
    }
}

static double silu_arg(double g) { return -g; }
static double gelu_arg(double g) { return -2.0 * 0.7978845608028654 * (g + 0.044715 * g * g * g); }

static void check_gated(void (*op)(float *, const float *, int), double (*ref)(double), double (*arg)(double),
                        const char *name) {
    static float g[N];
    memcpy(g, in_g, sizeof g);
    op(g, in_u, N);
    for (int i = 0; i < N; i++) {
        double want = ref(in_g[i]) * in_u[i];
        double tol = (4e-6 + 2.4e-7 * fabs(arg(in_g[i]))) * fabs(want) + 1e-30;
        CHECKF(fabs(g[i] - want) <= tol, "%s(%g) * %g = %.9g, want %.9g", name, in_g[i],
               in_u[i], g[i], want);
    }
    /* the same elements alone and in tails of every length: same bits */
    for (int len = 1; len <= 17; len++)
        for (int at = 0; at + len <= N; at += 97) {
            float part[17];
            memcpy(part, in_g + at, (size_t)len * sizeof *part);
            op(part, in_u + at, len);
            CHECKF(!memcmp(part, g + at, (size_t)len * sizeof *part), "%s: %d elements at %d differ", name, len, at);
        }
}

static void test_swiglu(void) { check_gated(ops_swiglu, silu_ref, silu_arg, "silu"); }
static void test_geglu(void) { check_gated(ops_geglu, gelu_ref, gelu_arg, "gelu"); }

static void test_rmsnorm(void) {
    static const int sizes[] = {1, 7, 8, 64, 256, 1003};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int n = sizes[k];
        static float y[N], w[N];
        for (int i = 0; i < n; i++) w[i] = 0.5f + (float)i / n;
        ops_rmsnorm(y, in_g, w, n, 1e-6f);
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)in_g[i] * in_g[i];
        double sc = 1.0 / sqrt(ss / n + 1e-6);
        for (int i = 0; i < n; i++) {
            double want = in_g[i] * sc * w[i];
            CHECKF(fabs(y[i] - want) <= 1e-6 * fabs(want) + 1e-30, "n %d, element %d: %.9g vs %.9g", n, i, y[i], want);
        }
        /* in place gives the same */
        static float x2[N];
        memcpy(x2, in_g, (size_t)n * sizeof *x2);
        ops_rmsnorm(x2, x2, w, n, 1e-6f);
        CHECK(!memcmp(x2, y, (size_t)n * sizeof *y));
    }
}

int main(void) {
    quant_init();
    fill();
    TEST_RUN(test_rmsnorm);
    TEST_RUN(test_swiglu);
    TEST_RUN(test_geglu);
    return TEST_DONE();
}
