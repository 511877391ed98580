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
 *   gelu     the encoders' GELU alone (ops_gelu, over the pool): geglu's
 *            bound with u = 1, and geglu's bits for any split
 *   swiglu_oai  gpt-oss's clamped SwiGLU (scalar, ops.c), as swiglu with
 *            the rounding of u + 1 allowed for
 *   rope     |y - ref| <= 1e-6 max|x| for both pair layouts, head_dim 8 to
 *            256, partial rotation (n_rot < head_dim) leaving the rest alone
 * and the batch property: an element's result is the same bits whether it
 * is processed alone, in a short tail, or inside a long array. Run for
 * every ISA the CPU has (the kernel table switched with kernels_use), the
 * scalar reference included.
 */
#include <math.h>
#include <string.h>

#include "model/model.h"
#include "model/ops.h"
#include "base/pool.h"
#include "format/quant.h"
#include "kernels/kernels.h"
#include "test.h"
#include "base/util.h"

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
        CHECKF(fabs(g[i] - want) <= tol, "%s(%g) * %g = %.9g, want %.9g", name, in_g[i], in_u[i], g[i], want);
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

/* gpt-oss's clamped SwiGLU (scalar only): g clamped above at 7, u to [-7, 7],
 * inputs past both limits (u of standard deviation 10); the tolerance as
 * above, plus the rounding of u + 1 (2^-24 (|u| + 1) times the gate's part). */
static void test_swiglu_oai(void) {
    static float g[N], u[N];
    memcpy(g, in_g, sizeof g);
    int clamped_g = 0, clamped_u = 0;
    for (int i = 0; i < N; i++) {
        u[i] = 10 * in_u[i];
        clamped_g += g[i] > 7;
        clamped_u += fabsf(u[i]) > 7;
    }
    CHECK(clamped_g > 50 && clamped_u > 50);
    float u_in[N];
    memcpy(u_in, u, sizeof u);
    ops_swiglu_oai(g, u, N);
    CHECK(!memcmp(u, u_in, sizeof u)); /* u is read, not written */
    for (int i = 0; i < N; i++) {
        double x = fmin(in_g[i], 7.0), y = fmax(-7.0, fmin(u_in[i], 7.0));
        double gate = x / (1.0 + exp(-1.702 * x)), want = gate * (y + 1.0);
        double tol = (4e-6 + 2.4e-7 * fabs(1.702 * x)) * fabs(want) + 6e-8 * fabs(gate) * (fabs(y) + 1) + 1e-30;
        CHECKF(fabs(g[i] - want) <= tol, "swiglu_oai(%g, %g) = %.9g, want %.9g", in_g[i], u_in[i], g[i], want);
    }
}
static void test_geglu(void) { check_gated(ops_geglu, gelu_ref, gelu_arg, "gelu"); }

/* The encoders' GELU alone (ops_gelu over a pool of 1 to 3 threads and none):
 * the float64 formula within geglu's bound for u = 1, and the same bits as
 * ops_geglu(x, 1) whatever the split and the length (tails included). */
static void test_gelu(void) {
    static float ones[N], want_bits[N], x[N];
    for (int i = 0; i < N; i++) ones[i] = 1.0f;
    memcpy(want_bits, in_g, sizeof want_bits);
    ops_geglu(want_bits, ones, N);
    for (int nt = 0; nt <= 3; nt++) {
        lm_pool *pool = nt ? pool_new(nt) : NULL;
        CHECK(nt == 0 || pool);
        static const size_t lens[] = {1, 7, 8, 9, 63, 1003};
        for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
            size_t n = lens[k];
            memcpy(x, in_g, sizeof x);
            ops_gelu(pool, x, n);
            for (size_t i = 0; i < n; i++) {
                double want = gelu_ref(in_g[i]), tol = (4e-6 + 2.4e-7 * fabs(gelu_arg(in_g[i]))) * fabs(want) + 1e-30;
                CHECKF(fabs(x[i] - want) <= tol, "threads %d n %zu: gelu(%g) = %.9g, want %.9g", nt, n, in_g[i], x[i],
                       want);
            }
            CHECKF(!memcmp(x, want_bits, n * sizeof *x), "threads %d n %zu: not geglu's bits", nt, n);
            CHECKF(!memcmp(x + n, in_g + n, (N - n) * sizeof *x), "threads %d n %zu: wrote past n", nt, n);
        }
        pool_free(pool);
    }
}

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

static void test_rope(void) {
    static const int dims[][2] = {{8, 8}, {64, 64}, {128, 64}, {256, 256}, {80, 40}, {12, 12}};
    for (int style = 0; style < 2; style++)
        for (size_t k = 0; k < sizeof dims / sizeof dims[0]; k++) {
            int hd = dims[k][0], nr = dims[k][1], nh = 3, pos = 1234 + (int)k;
            static float x[3 * 256], cs[256];
            ops_rope_angles(cs, nr, pos, 10000.0f, 1.0f);
            for (int i = 0; i < nh * hd; i++) x[i] = in_g[i % N] / 6;
            ops_rope_apply(x, nh, hd, nr, cs, style ? LM_ROPE_NEOX : LM_ROPE_ADJACENT);
            for (int h = 0; h < nh; h++)
                for (int i = 0; i < nr / 2; i++) {
                    int a = style ? i : 2 * i, b = style ? i + nr / 2 : 2 * i + 1;
                    double th = pos * pow(10000.0, -2.0 * i / nr);
                    double x0 = in_g[(h * hd + a) % N] / 6, x1 = in_g[(h * hd + b) % N] / 6;
                    double y0 = x0 * cos(th) - x1 * sin(th), y1 = x0 * sin(th) + x1 * cos(th);
                    /* cos/sin are rounded to float before use: about 1e-7 of |x| each */
                    CHECKF(fabs(x[h * hd + a] - y0) <= 1e-6 && fabs(x[h * hd + b] - y1) <= 1e-6,
                           "style %d hd %d n_rot %d head %d pair %d: %g %g vs %g %g", style, hd, nr, h, i,
                           x[h * hd + a], x[h * hd + b], y0, y1);
                }
            for (int h = 0; h < nh; h++)
                for (int i = nr; i < hd; i++) CHECK(x[h * hd + i] == in_g[(h * hd + i) % N] / 6);
        }
}

/* Every ISA this CPU runs, the scalar reference first, each held to the
 * same bounds; then the table as start-up fills it. */
int main(void) {
    kernels_init();
    fill();
    for (int isa = 0; isa < LM_ISA_COUNT; isa++) {
        if (!kernels_cpu_has((lm_isa)isa)) continue;
        if (kernels_use(isa)) return 1;
        printf("NOTE element-wise kernels: %s\n", kernels_isa_name());
        TEST_RUN(test_rmsnorm);
        TEST_RUN(test_swiglu);
        TEST_RUN(test_geglu);
        TEST_RUN(test_gelu);
        TEST_RUN(test_rope);
    }
    kernels_use(-1);
    TEST_RUN(test_swiglu_oai);
    return TEST_DONE();
}
