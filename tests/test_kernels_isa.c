/*
 * test_kernels_isa.c - every kernel variant of the table (kernels.h) that
 * this CPU runs, through the table itself, against the scalar references.
 * Architecture-neutral: on x86-64 it covers avx2, on AArch64 neon and
 * neondot (under `make test-arm`, qemu-user's CPU). Variants the CPU cannot
 * run are reported by name on a NOTE line and counted as skipped, never as
 * passed.
 *
 * Per variant (kernels_use), for F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_1,
 * Q5_1, Q4_K, Q5_K, Q6_K and MXFP4 weights:
 *  - vec_dot against quant_vec_dot_ref and the float64 dot of the
 *    dequantized rows: |err| <= 1e-5 * sum |w_i x_i| (BF16 weights on
 *    avx512bf16, which rounds the activations to BF16: that variant's
 *    bound, tol_of), on rows from the
 *    reference quantizer and from random block bytes (every nibble, high
 *    bit, scale code; Q8_0's -128), lengths of 1 to 40 blocks (float types:
 *    also tails 1, 3, 17, 33, 100), and rows at the integer extremes;
 *  - gemm: every nr, nc in 1..4 with padded strides, each output
 *    bit-identical (memcmp) to the variant's vec_dot, nothing outside the
 *    tile written;
 *  - packed (interleaved) tiles of the variant, for the 32-element types
 *    that have them (block_q8_0s activations: neon and neondot Q8_0,
 *    Q4_0 and MXFP4; x86 Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, MXFP4): packed_act's bytes equal
 *    quant_packed_act_ref's; every output of 1, 5, 8, 13 and 21 rows (the
 *    last group partial) by 9 tokens within TOL of quant_vec_dot_ref and
 *    the float64 dot, bit-identical for every tile width up to pack_tile
 *    and position of a token in its tile, nothing past the last row
 *    written;
 *  - ops_matmul on a pool of two threads for every batch of 1 to 64 tokens
 *    and odd shapes (13 rows; 3 blocks of 32, one K super-block, 37 float
 *    columns), and 37 x 576 / 768 for 1, 7 and 64 tokens: each output
 *    within the same bound of the scalar reference for that token's
 *    activation row; where the variant has packed tiles for a quantized
 *    type, the same again on the weights' interleaved copy (quant_pack);
 *  - the table's from_float for Q8_0, Q8_K and F16: bytes identical to the
 *    reference quantizer (Gaussian rows of many scales, ties, zeros,
 *    subnormals, huge values, F16 also NaNs and infinities); to_float of
 *    F16 (all 65,536 halves; a NaN stays a NaN, its payload aside: AVX2's
 *    conversion quietens signalling NaNs) and Q8_0: the reference's bits;
 *  - element-wise ops (RMSNorm, SwiGLU, GeGLU, RoPE) against scalar.c:
 *    RMSNorm and RoPE within 2 ulps-ish (2e-6 relative), SiLU/GELU within
 *    1e-5 relative plus 1e-30; attention loops within 1e-5 of sum |q k|
 *    (scores), P·V within 1e-5 relative, max and scale exact, exp_sum
 *    within 1e-5 relative.
 * And LAMINA_CPU: each name gives that variant when the CPU runs it, the
 * next one down its line when not (neondot -> neon -> scalar, avx2 ->
 * scalar), an unknown name the best variant, LAMINA_NO_SIMD=1 scalar.
 */
#include "kernels/kernels.h"
#include "kernels/scalar.h"

#include <stdlib.h>

#include "kernel_check.h"

static const uint32_t weight_types[] = {LM_TYPE_F32,  LM_TYPE_F16,  LM_TYPE_BF16, LM_TYPE_Q8_0,
                                        LM_TYPE_Q4_0, LM_TYPE_Q5_0, LM_TYPE_Q4_1, LM_TYPE_Q5_1,
                                        LM_TYPE_Q4_K, LM_TYPE_Q5_K, LM_TYPE_Q6_K, LM_TYPE_MXFP4};
#define N_WEIGHT_TYPES (sizeof weight_types / sizeof weight_types[0])

/* The bound relative to sum |w x| for a type on the table now: TOL, except
 * BF16 weights on avx512bf16, whose vdpbf16ps rounds the activations to
 * BF16 (kernels/avx512bf16_dot.c: 2^-8 + (n / 16 + 8) * 2^-24, plus TOL
 * for the reference's own rounding). */
static double tol_of(uint32_t wt, int64_t n) {
    if (wt == LM_TYPE_BF16 && kernels()->isa == LM_ISA_AVX512BF16)
        return ldexp(1.0, -8) + (double)(n / 16 + 8) * ldexp(1.0, -24) + TOL;
    return TOL;
}

/* ---- matrix kernels ---------------------------------------------------------- */

static void check_vec_dot(uint32_t wt) {
    const lm_type_kernels *k = kernels_type(wt);
    int64_t blck = quant_traits(wt)->blck, ns[64];
    int nn = 0;
    if (blck == 1) {
        static const int64_t odd[] = {1, 3, 16, 17, 33, 100, 256, 1000, 2048};
        for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) ns[nn++] = odd[i];
    } else {
        int64_t top = blck == 32 ? 40 : 6;
        for (int64_t b = 1; b <= top; b += blck == 32 ? 3 : 1) ns[nn++] = b * blck;
    }
    for (int li = 0; li < nn; li++)
        for (int rep = 0; rep < 4; rep++) {
            int64_t n = ns[li];
            void *w = lm_malloc(quant_row_size(wt, n)), *x = lm_malloc(quant_row_size(act_type(wt), n));
            make_weight(wt, n, rep & 1, w);
            float *f = lm_malloc((size_t)n * sizeof(float));
            fill_normal(f, n, rep == 2 ? 1e-3 : 1.0);
            quant_from_float_ref(act_type(wt), f, x, n);
            double abs_sum, exact = deq_dot(wt, n, w, x, &abs_sum);
            float ref = quant_vec_dot_ref(wt, n, w, x), got = k->vec_dot(n, w, x);
            lm_free(w);
            lm_free(x);
            lm_free(f);
            double tol = tol_of(wt, n) * abs_sum + 1e-30;
            CHECKF(fabs((double)got - ref) <= tol && fabs((double)got - exact) <= tol,
                   "%s %s n=%lld: %.9g, reference %.9g, float64 %.9g", kernels_isa_name(), quant_type_name(wt),
                   (long long)n, got, ref, exact);
        }
    /* integer extremes: quant bytes all ones / all zeros against activations at their largest */
    if (blck > 1) {
        char msg[160] = "";
        check_extremes(wt, 8 * 256, k->vec_dot, false, msg, sizeof msg);
        CHECKF(!msg[0], "%s %s", kernels_isa_name(), msg);
    }
}

static void test_vec_dot(void) {
    for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        check_vec_dot(weight_types[ti]);
        if (test_cur_failed_) return;
    }
}

/* gemm tiles bit for bit vec_dot, for every nr, nc, with padded strides. */
static void test_gemm(void) {
    for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        uint32_t wt = weight_types[ti];
        const lm_type_kernels *k = kernels_type(wt);
        if (!k->gemm) continue; /* the scalar table has none */
        int64_t blck = quant_traits(wt)->blck;
        int64_t n = blck == 1 ? 77 : blck == 32 ? 32 * 9 : 512;
        size_t wrow = quant_row_size(wt, n), xrow = quant_row_size(act_type(wt), n);
        size_t ws = wrow + 16, xs = xrow + 4 * sizeof(uint32_t); /* padded, still aligned */
        uint8_t *w = lm_malloc(ws * LM_GEMM_TILE), *x = lm_malloc(xs * LM_GEMM_TILE);
        float *f = lm_malloc((size_t)n * sizeof(float));
        for (int r = 0; r < LM_GEMM_TILE; r++) make_weight(wt, n, r & 1, w + (size_t)r * ws);
        for (int c = 0; c < LM_GEMM_TILE; c++) {
            fill_normal(f, n, 1.0);
            quant_from_float_ref(act_type(wt), f, x + (size_t)c * xs, n);
        }
        const size_t ys = 7;
        float y[7 * LM_GEMM_TILE + 7];
        int bad = 0;
        for (int nr = 1; nr <= LM_GEMM_TILE && !bad; nr++)
            for (int nc = 1; nc <= LM_GEMM_TILE && !bad; nc++) {
                for (size_t i = 0; i < sizeof y / sizeof y[0]; i++) y[i] = -7.0f;
                k->gemm(n, w, ws, nr, x, xs, nc, y, ys);
                for (int c = 0; c < LM_GEMM_TILE; c++)
                    for (size_t r = 0; r < ys; r++) {
                        float want = (c < nc && (int)r < nr) ? k->vec_dot(n, w + r * ws, x + (size_t)c * xs) : -7.0f;
                        if (memcmp(&y[(size_t)c * ys + r], &want, sizeof want)) bad = nr * 10 + nc;
                    }
            }
        lm_free(w);
        lm_free(x);
        lm_free(f);
        CHECKF(!bad, "%s %s: gemm %dx%d differs from vec_dot (or wrote outside its tile)", kernels_isa_name(),
               quant_type_name(wt), bad / 10, bad % 10);
    }
}

/* ops_matmul for n_tok tokens of x against w, each output within TOL of
 * sum |w x| of the reference dot for that token's activation row. */
static void check_matmul(lm_pool *pool, uint32_t wt, int64_t rows, int64_t n, const int *toks, int ntoks) {
    size_t rb = quant_row_size(wt, n);
    int max_tok = 0;
    for (int i = 0; i < ntoks; i++) max_tok = toks[i] > max_tok ? toks[i] : max_tok;
    uint8_t *w = lm_malloc(rb * (size_t)rows);
    for (int64_t r = 0; r < rows; r++) make_weight(wt, n, r & 1, w + (size_t)r * rb);
    float *x = lm_malloc((size_t)max_tok * (size_t)n * sizeof(float));
    fill_normal(x, (int64_t)max_tok * n, 1.0);
    double *ref = lm_malloc((size_t)max_tok * (size_t)rows * sizeof(double));
    double *tol = lm_malloc((size_t)max_tok * (size_t)rows * sizeof(double));
    matmul_reference(wt, n, rows, w, x, max_tok, tol_of(wt, n), ref, tol);
    lm_weight lw = {.data = w, .type = wt, .rows = rows, .cols = n, .row_bytes = rb};
    void *scratch = lm_malloc(ops_matmul_scratch(wt, n, max_tok));
    float *y = lm_malloc((size_t)max_tok * (size_t)rows * sizeof(float));
    /* row-major, then on the interleaved copy where the variant has tiles
     * that take the reference's activation rows (the quantized types; F16
     * panels multiply the floats themselves) */
    void *wp = NULL;
    if (kernels_type(wt)->packed_gemm && quant_traits(wt)->is_quantized && quant_pack_size(wt, rows, n)) {
        wp = lm_malloc(quant_pack_size(wt, rows, n));
        quant_pack(wt, w, rb, rows, n, wp);
    }
    for (int packed = 0; packed < 1 + (wp != NULL) && !test_cur_failed_; packed++) {
        lw.packed = packed ? wp : NULL;
        int bad_tok = 0;
        int64_t bad_i = -1;
        for (int i = 0; i < ntoks && bad_i < 0; i++) {
            ops_matmul(pool, y, &lw, x, toks[i], scratch);
            for (int64_t j = 0; j < (int64_t)toks[i] * rows && bad_i < 0; j++)
                if (!(fabs((double)y[j] - ref[j]) <= tol[j])) bad_tok = toks[i], bad_i = j;
        }
        CHECKF(bad_i < 0, "%s %s %s %lldx%lld, %d tokens: token %lld row %lld: %.9g, reference %.9g",
               kernels_isa_name(), quant_type_name(wt), packed ? "packed" : "row-major", (long long)rows, (long long)n,
               bad_tok, (long long)(bad_i / rows), (long long)(bad_i % rows), bad_i < 0 ? 0.0 : y[bad_i],
               bad_i < 0 ? 0.0 : ref[bad_i]);
    }
    lm_free(wp);
    lm_free(w);
    lm_free(x);
    lm_free(ref);
    lm_free(tol);
    lm_free(scratch);
    lm_free(y);
}

static void test_matmul_tokens(void) {
    lm_pool *pool = pool_new(2);
    CHECK(pool);
    int every[64], few[] = {1, 7, 64};
    for (int i = 0; i < 64; i++) every[i] = i + 1;
    for (size_t ti = 0; ti < N_WEIGHT_TYPES && !test_cur_failed_; ti++) {
        uint32_t wt = weight_types[ti];
        int64_t blck = quant_traits(wt)->blck;
        check_matmul(pool, wt, 13, blck == 1 ? 37 : blck == 32 ? 96 : 256, every, 64);
        if (!test_cur_failed_) check_matmul(pool, wt, 37, blck == 256 ? 768 : 576, few, 3);
    }
    pool_free(pool);
}

/* ---- packed (interleaved) tiles ------------------------------------------------ */

/* The variant's packed tiles of one 32-element type against the reference,
 * and against themselves for every tile width and first tile. */
static void check_packed(uint32_t wt) {
    const lm_type_kernels *k = kernels_type(wt);
    const int tile = k->pack_tile, n_tok = 9;
    CHECK(tile >= 1 && tile <= LM_PACK_TILE && k->packed_act);
    if (test_cur_failed_) return;
    static const int64_t row_counts[] = {1, 5, 8, 13, 21};
    static const int64_t col_counts[] = {32, 96, 320, 1024};
    for (size_t ri = 0; ri < sizeof row_counts / sizeof row_counts[0]; ri++)
        for (size_t ci = 0; ci < sizeof col_counts / sizeof col_counts[0]; ci++) {
            int64_t rows = row_counts[ri], n = col_counts[ci];
            size_t rb = quant_row_size(wt, n), xs = quant_packed_act_row_size(n), qs = quant_row_size(act_type(wt), n);
            uint8_t *w = lm_malloc(rb * (size_t)rows), *wp = lm_malloc(quant_pack_size(wt, rows, n));
            uint8_t *x = lm_malloc(xs * (size_t)n_tok), *xr = lm_malloc(xs), *xq = lm_malloc(qs * (size_t)n_tok);
            float *f = lm_malloc((size_t)n * sizeof(float));
            for (int64_t r = 0; r < rows; r++) make_weight(wt, n, (ri + ci + (size_t)r) & 1, w + (size_t)r * rb);
            bool act_same = true;
            for (int c = 0; c < n_tok; c++) {
                fill_normal(f, n, c == 3 ? 1e-3 : 1.0);
                k->packed_act(f, x + (size_t)c * xs, n);
                quant_packed_act_ref(f, xr, n);
                act_same = act_same && !memcmp(xr, x + (size_t)c * xs, xs);
                quant_from_float_ref(act_type(wt), f, xq + (size_t)c * qs, n);
            }
            quant_pack(wt, w, rb, rows, n, wp);
            char msg[200] = "";
            check_packed_tiles(k->packed_gemm, wt, n, rows, w, wp, x, xs, xq, n_tok, tile, true, msg, sizeof msg);
            lm_free(w), lm_free(wp), lm_free(x), lm_free(xr), lm_free(xq), lm_free(f);
            CHECKF(act_same, "%s %s n=%lld: packed_act differs from quant_packed_act_ref", kernels_isa_name(),
                   quant_type_name(wt), (long long)n);
            CHECKF(!msg[0], "%s %s rows=%lld n=%lld: %s", kernels_isa_name(), quant_type_name(wt), (long long)rows,
                   (long long)n, msg);
            if (test_cur_failed_) return;
        }
}

static void test_packed(void) {
    static const uint32_t types[] = {LM_TYPE_Q8_0, LM_TYPE_Q4_0, LM_TYPE_Q5_0,
                                     LM_TYPE_Q4_1, LM_TYPE_Q5_1, LM_TYPE_MXFP4};
    int tested = 0;
    for (size_t i = 0; i < sizeof types / sizeof types[0] && !test_cur_failed_; i++)
        if (kernels_type(types[i])->packed_gemm) {
            check_packed(types[i]);
            tested++;
        }
    printf("NOTE variant %s: packed tiles of %d of the 32-element types\n", kernels_isa_name(), tested);
    if (getenv("LAMINA_NO_REPACK")) return; /* the table holds none then */
#if defined(__aarch64__)
    CHECK(tested == 3 && kernels_type(LM_TYPE_Q8_0)->packed_gemm && kernels_type(LM_TYPE_Q4_0)->packed_gemm &&
          kernels_type(LM_TYPE_MXFP4)->packed_gemm);
#else
    CHECK(tested > 0);
#endif
}

/* ---- conversions ---------------------------------------------------------------- */

static void stress_row(int kind, uint32_t type, float *x, int64_t n) {
    switch (kind) {
        case 0: fill_normal(x, n, pow(10.0, -6.0 + 10.0 * lm_rng_uniform(&rng))); break;
        case 1:
            for (int64_t i = 0; i < n; i++) x[i] = (float)((int)(lm_rng_u64(&rng) % 254) - 127) + 0.5f;
            for (int64_t i = 0; i < n; i += 32) x[i] = type == LM_TYPE_Q8_K ? -128.0f : 127.0f;
            break;
        case 2: memset(x, 0, (size_t)n * sizeof(float)); break;
        case 3:
            for (int64_t i = 0; i < n; i++) x[i] = 0.37f;
            break;
        case 4: fill_normal(x, n, 1e-6); break;
        case 5: fill_normal(x, n, 1e-39); break;
        case 6:
            fill_normal(x, n, 1.0);
            for (int64_t i = 0; i + 5 < n; i += 32) x[i + 1] = 7.0f, x[i + 5] = -7.0f;
            break;
        default: fill_normal(x, n, 1e30); break;
    }
}

static void test_from_float(void) {
    static const uint32_t types[] = {LM_TYPE_Q8_0, LM_TYPE_Q8_K};
    for (size_t ti = 0; ti < 2; ti++) {
        uint32_t t = types[ti];
        for (int rep = 0; rep < 80; rep++) {
            int64_t n = quant_traits(t)->blck * (1 + rep % 5);
            float *x = lm_malloc((size_t)n * sizeof(float));
            size_t bytes = quant_row_size(t, n);
            uint8_t *a = lm_malloc(bytes), *b = lm_malloc(bytes);
            memset(a, 0xAA, bytes);
            memset(b, 0x55, bytes);
            stress_row(rep % 8, t, x, n);
            quant_from_float_ref(t, x, a, n);
            kernels_type(t)->from_float(x, b, n);
            int same = !memcmp(a, b, bytes);
            lm_free(x);
            lm_free(a);
            lm_free(b);
            CHECKF(same, "%s %s kind %d n=%lld: blocks differ from the reference", kernels_isa_name(),
                   quant_type_name(t), rep % 8, (long long)n);
        }
    }
    static const float special[] = {
        0.0f,          -0.0f,         INFINITY,       -INFINITY,          NAN,
        65504.0f,      65520.0f,      -65520.0f,      1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048,
        5.9604645e-8f, 2.9802322e-8f, 2.98023259e-8f, 6.1035156e-5f,      6.1e-5f,
        -1e-9f};
    for (int64_t n = 0; n <= 70; n++) {
        float x[70];
        uint16_t a[70], b[70];
        double scale = pow(10.0, (double)(n % 16) - 9.0);
        for (int64_t i = 0; i < n; i++)
            x[i] = lm_rng_u64(&rng) % 4 == 0 ? special[lm_rng_u64(&rng) % 16] : (float)(lm_rng_normal(&rng) * scale);
        quant_from_float_ref(LM_TYPE_F16, x, a, n);
        kernels_type(LM_TYPE_F16)->from_float(x, b, n);
        CHECKF(!memcmp(a, b, (size_t)n * 2), "%s F16 from_float n=%lld differs", kernels_isa_name(), (long long)n);
    }
}

static void test_to_float(void) {
    uint16_t *h = lm_malloc(65536 * sizeof(uint16_t));
    float *want = lm_malloc(65536 * sizeof(float)), *got = lm_malloc(65536 * sizeof(float));
    for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    quant_to_float_ref(LM_TYPE_F16, h, want, 65536);
    static const int64_t lens[] = {65536, 65535, 65529, 7, 1, 0};
    int64_t bad = -1;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0] && bad < 0; li++) {
        int64_t n = lens[li], off = 65536 - n;
        kernels_type(LM_TYPE_F16)->to_float(h + off, got, n);
        if (memcmp(got, want + off, (size_t)n * sizeof(float)))
            for (int64_t i = 0; i < n && bad < 0; i++)
                if (memcmp(&got[i], &want[off + i], sizeof(float)) && !(isnan(got[i]) && isnan(want[off + i])))
                    bad = off + i;
    }
    int64_t nq = 32 * 64;
    uint8_t *q = lm_malloc(quant_row_size(LM_TYPE_Q8_0, nq));
    fill_random_blocks(LM_TYPE_Q8_0, q, nq);
    quant_to_float_ref(LM_TYPE_Q8_0, q, want, nq);
    kernels_type(LM_TYPE_Q8_0)->to_float(q, got, nq);
    int q8_same = !memcmp(got, want, (size_t)nq * sizeof(float));
    lm_free(q);
    lm_free(h);
    lm_free(want);
    lm_free(got);
    CHECKF(bad < 0, "%s F16 to_float: half 0x%04llx", kernels_isa_name(), (long long)bad);
    CHECKF(q8_same, "%s Q8_0 to_float differs", kernels_isa_name());
}

/* ---- element-wise and attention ---------------------------------------------------- */

static bool close_rel(float got, float want, double rel, double abs_tol) {
    return fabs((double)got - want) <= rel * fabs((double)want) + abs_tol;
}

static void test_ew(void) {
    const lm_ew_kernels *ew = &kernels()->ew;
    enum { N = 203 };
    float g[N], u[N], a[N], b[N], w[N];
    for (int n = 1; n <= N; n += 17) {
        fill_normal(g, n, 3.0);
        fill_normal(u, n, 1.0);
        fill_normal(w, n, 1.0);
        scalar_rmsnorm(a, g, w, n, 1e-6f);
        ew->rmsnorm(b, g, w, n, 1e-6f);
        for (int i = 0; i < n; i++)
            CHECKF(close_rel(b[i], a[i], 2e-6, 1e-30), "%s rmsnorm n=%d [%d]", kernels_isa_name(), n, i);
        memcpy(a, g, sizeof(float) * (size_t)n);
        memcpy(b, g, sizeof(float) * (size_t)n);
        scalar_swiglu(a, u, n);
        ew->swiglu(b, u, n);
        for (int i = 0; i < n; i++)
            CHECKF(close_rel(b[i], a[i], 1e-5, 1e-30), "%s swiglu n=%d [%d]: %.9g vs %.9g", kernels_isa_name(), n, i,
                   b[i], a[i]);
        memcpy(a, g, sizeof(float) * (size_t)n);
        memcpy(b, g, sizeof(float) * (size_t)n);
        scalar_geglu(a, u, n);
        ew->geglu(b, u, n);
        for (int i = 0; i < n; i++)
            CHECKF(close_rel(b[i], a[i], 1e-5, 1e-30), "%s geglu n=%d [%d]: %.9g vs %.9g", kernels_isa_name(), n, i,
                   b[i], a[i]);
        memcpy(a, g, sizeof(float) * (size_t)n);
        memcpy(b, g, sizeof(float) * (size_t)n);
        scalar_gelu(a, n);
        ew->gelu(b, n);
        for (int i = 0; i < n; i++)
            CHECKF(close_rel(b[i], a[i], 1e-5, 1e-30), "%s gelu n=%d [%d]: %.9g vs %.9g", kernels_isa_name(), n, i,
                   b[i], a[i]);
    }
    static const int shapes[][3] = {{3, 64, 64}, {2, 128, 32}, {5, 72, 72}, {1, 80, 40}, {4, 16, 6}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int neox = 0; neox < 2; neox++) {
            int nh = shapes[s][0], hd = shapes[s][1], nr = shapes[s][2];
            float x[5 * 128], y[5 * 128], cs[128];
            fill_normal(x, nh * hd, 1.0);
            memcpy(y, x, sizeof(float) * (size_t)(nh * hd));
            for (int i = 0; i < nr / 2; i++) {
                double th = 7.0 * pow(10000.0, -2.0 * i / nr);
                cs[2 * i] = (float)cos(th), cs[2 * i + 1] = (float)sin(th);
            }
            scalar_rope(x, nh, hd, nr, cs, neox);
            ew->rope(y, nh, hd, nr, cs, neox);
            for (int i = 0; i < nh * hd; i++)
                CHECKF(close_rel(y[i], x[i], 2e-6, 1e-6), "%s rope nh %d hd %d n_rot %d neox %d [%d]",
                       kernels_isa_name(), nh, hd, nr, neox, i);
        }
}

static void test_attn(void) {
    static const int hds[] = {4, 8, 12, 64, 72, 80, 128, 256};
    enum { R = 7, NK = 37, HM = 256 };
    float *Q = lm_malloc(sizeof(float) * R * HM), *K = lm_malloc(sizeof(float) * NK * HM);
    float *P = lm_malloc(sizeof(float) * R * NK), *S0 = lm_malloc(sizeof(float) * R * NK),
          *S1 = lm_malloc(sizeof(float) * R * NK);
    float *O0 = lm_malloc(sizeof(float) * R * HM), *O1 = lm_malloc(sizeof(float) * R * HM);
    const float *kr[NK];
    fill_normal(Q, R * HM, 1.0);
    fill_normal(K, NK * HM, 1.0);
    for (int i = 0; i < R * NK; i++) P[i] = i % 5 == 0 ? 0.0f : (float)lm_rng_uniform(&rng);
    for (int t = 0; t < NK; t++) kr[t] = K + (size_t)(NK - 1 - t) * HM;
    int bad = 0;
    for (size_t hi = 0; hi < sizeof hds / sizeof hds[0] && !bad; hi++) {
        int hd = hds[hi];
        const lm_attn_kernels *a = kernels_attn(hd);
        a->scores(Q, R, hd, kr, NK, S1, NK);
        scalar_attn_scores(Q, R, hd, kr, NK, S0, NK);
        for (int r = 0; r < R; r++)
            for (int t = 0; t < NK; t++) {
                double as = 0;
                for (int d = 0; d < hd; d++) as += fabs((double)Q[r * hd + d] * kr[t][d]);
                if (fabs((double)S1[r * NK + t] - S0[r * NK + t]) > 1e-5 * as) bad = 1;
            }
        for (int i = 0; i < R * hd; i++) O0[i] = O1[i] = (float)(i % 3) - 1.0f;
        a->pv(O1, R, hd, P, NK, kr, NK);
        scalar_attn_pv(O0, R, hd, P, NK, kr, NK);
        for (int i = 0; i < R * hd; i++)
            if (!close_rel(O1[i], O0[i], 1e-5, 1e-5)) bad = 2;
        for (int n = 1; n <= NK; n++)
            if (a->max(P, n) != scalar_attn_max(P, n)) bad = 3;
        a->scale(O1, Q, hd, 0.37f);
        scalar_attn_scale(O0, Q, hd, 0.37f);
        if (memcmp(O0, O1, sizeof(float) * (size_t)hd)) bad = 4;
        for (int n = 1; n <= NK; n += 3) {
            memcpy(S0, S1, sizeof(float) * NK);
            float m = scalar_attn_max(S1, n);
            float s0 = scalar_attn_exp_sum(S0, n, m), s1 = a->exp_sum(S1, n, m);
            if (!close_rel(s1, s0, 1e-5, 0)) bad = 5;
            for (int i = 0; i < n; i++)
                if (!close_rel(S1[i], S0[i], 1e-5, 1e-30)) bad = 6;
            memcpy(S1, S0, sizeof(float) * NK);
        }
        if (bad) bad = bad * 1000 + hd;
    }
    lm_free(Q);
    lm_free(K);
    lm_free(P);
    lm_free(S0);
    lm_free(S1);
    lm_free(O0);
    lm_free(O1);
    CHECKF(!bad, "%s attention check %d (1 scores, 2 P·V, 3 max, 4 scale, 5-6 exp_sum) at head_dim %d",
           kernels_isa_name(), bad / 1000, bad % 1000);
}

/* ---- LAMINA_CPU ------------------------------------------------------------------- */

static lm_isa capped(lm_isa isa) {
    while (!kernels_cpu_has(isa))
        isa = isa == LM_ISA_NEONDOT ? LM_ISA_NEON
            : isa == LM_ISA_AVXVNNI || isa == LM_ISA_AVX512 || isa == LM_ISA_AVX512VNNI || isa == LM_ISA_AVX512BF16
            ? (lm_isa)(isa - 1)
            : LM_ISA_SCALAR;
    return isa;
}

static void test_lamina_cpu(void) {
    const char *old = getenv("LAMINA_CPU");
    char *saved = old ? strdup(old) : NULL;
    for (int i = 0; i < LM_ISA_COUNT; i++) {
        setenv("LAMINA_CPU", kernels_isa_str((lm_isa)i), 1);
        CHECK(kernels_use(-1) == 0);
        CHECKF(kernels()->isa == capped((lm_isa)i), "LAMINA_CPU=%s gave %s", kernels_isa_str((lm_isa)i),
               kernels_isa_name());
    }
    /* the lines, spelled out */
    setenv("LAMINA_CPU", "neondot", 1);
    kernels_use(-1);
    CHECK(kernels()->isa ==
          (kernels_cpu_has(LM_ISA_NEONDOT)    ? LM_ISA_NEONDOT
               : kernels_cpu_has(LM_ISA_NEON) ? LM_ISA_NEON
                                              : LM_ISA_SCALAR));
    setenv("LAMINA_CPU", "avx2", 1);
    kernels_use(-1);
    CHECK(kernels()->isa == (kernels_cpu_has(LM_ISA_AVX2) ? LM_ISA_AVX2 : LM_ISA_SCALAR));
    setenv("LAMINA_CPU", "no-such-cpu", 1);
    kernels_use(-1);
    CHECK(kernels()->isa == kernels_cpu_isa());
    setenv("LAMINA_CPU", kernels_isa_str(kernels_cpu_isa()), 1);
    setenv("LAMINA_NO_SIMD", "1", 1);
    kernels_use(-1);
    CHECK(kernels()->isa == LM_ISA_SCALAR);
    unsetenv("LAMINA_NO_SIMD");
    if (saved) setenv("LAMINA_CPU", saved, 1);
    else unsetenv("LAMINA_CPU");
    free(saved);
    kernels_use(-1);
}

int main(void) {
    lm_rng_seed(&rng, 20261201);
    kernels_init();
    const lm_isa start = kernels()->isa;
    printf("NOTE kernel table at start: %s (best this CPU runs: %s)\n", kernels_isa_name(),
           kernels_isa_str(kernels_cpu_isa()));
    int skipped = 0;
    for (int isa = 1; isa < LM_ISA_COUNT; isa++) {
        if (!kernels_cpu_has((lm_isa)isa)) {
            printf("NOTE variant %s not run: this CPU lacks it\n", kernels_isa_str((lm_isa)isa));
            skipped++;
            continue;
        }
        if (kernels_use(isa)) return 1;
        printf("NOTE variant %s: tested against the scalar reference\n", kernels_isa_name());
        TEST_RUN(test_vec_dot);
        TEST_RUN(test_gemm);
        TEST_RUN(test_packed);
        TEST_RUN(test_matmul_tokens);
        TEST_RUN(test_from_float);
        TEST_RUN(test_to_float);
        TEST_RUN(test_ew);
        TEST_RUN(test_attn);
    }
    /* the scalar table through the same matmul path (its gemm is NULL) */
    kernels_use(LM_ISA_SCALAR);
    TEST_RUN(test_matmul_tokens);
    TEST_RUN(test_lamina_cpu);
    kernels_use(start);
    if (skipped) {
        printf("%d passed, %d failed, %d skipped\n", test_passed_, test_failed_, skipped);
        return test_failed_ ? 1 : 0;
    }
    return TEST_DONE();
}
