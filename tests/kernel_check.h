/*
 * kernel_check.h - what the kernel test programs (test_kernels,
 * test_kernels_isa, test_kernels_pair, test_kernels_wide) share: the
 * random stream and its fills, weight rows (also at the integer
 * extremes), the float64 reference dot, the walk of packed tiles over a
 * matrix and the comparison loops run on their outputs, the check of a
 * variant's tile entries, the two-group 512-bit tiles and ops_matmul on a
 * variant against the avx2 table, and the loop over variants that names
 * each check a CPU cannot run (NOT RUN, counted as skipped, never as
 * passed).
 *
 * Invariants: every helper draws from `rng` in a fixed order (main seeds
 * it once; a program's data depend only on the seed and the order of its
 * checks); a comparison helper writes its first failure into msg (ml
 * bytes) and leaves msg untouched when everything holds; TOL is relative
 * to sum |w_i x_i| of the dequantized rows.
 */
#ifndef LAMINA_TEST_KERNEL_CHECK_H
#define LAMINA_TEST_KERNEL_CHECK_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/pool.h"
#include "base/util.h"
#include "format/quant.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "model/ops.h"
#include "test.h"

#define TOL 1e-5 /* relative to sum |w_i x_i| */

static lm_rng rng; /* the program's random stream; main seeds it */

static inline void fill_normal(float *x, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(lm_rng_normal(&rng) * scale);
}

static inline uint32_t act_type(uint32_t wt) { return quant_traits(wt)->vec_dot_type; }

/* Random bytes for n elements of a quantized type, every f16 scale set to
 * a finite value of moderate size, either sign (random bits there could
 * be inf/NaN, which no quantizer writes); the second f16 of Q4_1, Q5_1,
 * Q4_K and Q5_K (m, dmin) in [-0.1, 0.1); MXFP4's exponent byte in
 * 112..143 (scales 2^-16 to 2^15). */
static inline void fill_random_blocks(uint32_t type, uint8_t *p, int64_t n) {
    size_t bytes = quant_row_size(type, n);
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)lm_rng_u64(&rng);
    const lm_type_traits *t = quant_traits(type);
    for (int64_t b = 0; b < n / t->blck; b++) {
        uint8_t *blk = p + (size_t)b * t->type_size;
        uint16_t d = lm_f32_to_f16((float)((lm_rng_uniform(&rng) * 0.1 + 1e-3) * (lm_rng_u64(&rng) & 1 ? 1 : -1)));
        uint16_t d2 = lm_f32_to_f16((float)(lm_rng_uniform(&rng) * 0.2 - 0.1));
        switch (type) {
            case LM_TYPE_Q6_K: memcpy(blk + offsetof(block_q6_K, d), &d, 2); break;
            case LM_TYPE_MXFP4: blk[0] = (uint8_t)(112 + lm_rng_u64(&rng) % 32); break;
            case LM_TYPE_Q4_1:
            case LM_TYPE_Q5_1:
            case LM_TYPE_Q4_K:
            case LM_TYPE_Q5_K:
                memcpy(blk, &d, 2);
                memcpy(blk + 2, &d2, 2);
                break;
            default: memcpy(blk, &d, 2); break;
        }
    }
}

/* A weight row of `type`: Gaussian floats through the reference quantizer
 * (random_bytes false; float types always) or random blocks. */
static inline void make_weight(uint32_t type, int64_t n, bool random_bytes, void *dst) {
    float *f = lm_malloc((size_t)n * sizeof(float));
    fill_normal(f, n, 0.5);
    if (quant_traits(type)->is_quantized && random_bytes) fill_random_blocks(type, dst, n);
    else quant_from_float_ref(type, f, dst, n);
    lm_free(f);
}

/* A weight row from the reference quantizer, with random_bytes every
 * byte but the scales then random (Q4_0, Q5_0, Q8_0: all but the f16
 * scale; Q4_1, Q5_1: all but d and m; Q4_K: all but d and dmin, so the
 * 6-bit scales and mins are random too; Q6_K: all but d, its last two;
 * MXFP4: all but the exponent). */
static inline void make_weight_keep_scales(uint32_t type, int64_t n, bool random_bytes, uint8_t *dst) {
    float *f = lm_malloc((size_t)n * sizeof(float));
    fill_normal(f, n, 0.5);
    quant_from_float_ref(type, f, dst, n);
    if (random_bytes) {
        const size_t bs = quant_traits(type)->type_size, nb = (size_t)(n / quant_traits(type)->blck);
        const bool two = type == LM_TYPE_Q4_K || type == LM_TYPE_Q4_1 || type == LM_TYPE_Q5_1;
        const size_t lo = type == LM_TYPE_Q6_K ? 0 : two ? 4 : type == LM_TYPE_MXFP4 ? 1 : 2;
        const size_t hi = type == LM_TYPE_Q6_K ? bs - 2 : bs;
        for (size_t b = 0; b < nb; b++)
            for (size_t i = lo; i < hi; i++) dst[b * bs + i] = (uint8_t)lm_rng_u64(&rng);
    }
    lm_free(f);
}

/* float64 dot of a weight row and an activation row (its vec_dot_type
 * bytes), both dequantized by the reference; *abs_sum gets sum |w x|. */
static inline double deq_dot(uint32_t wt, int64_t n, const void *w, const void *x, double *abs_sum) {
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

/* n floats with the same bits */
static inline bool bits_equal(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof *a) == 0; }

/* Rows at the integer extremes (n elements): activations x (f the floats,
 * n of them) all -3 (odd patterns: alternating in sign), quantized to
 * the weight's vec_dot_type at their largest magnitude; weights w random
 * blocks (scales kept) with every quant byte saturated, all ones (pattern
 * & 2) or all zeros (Q8_0 and Q6_K's scales: -128 or 127; MXFP4: every
 * code -12 or +12). */
static inline void make_extremes(uint32_t wt, int64_t n, int pattern, float *f, void *x, uint8_t *w) {
    for (int64_t i = 0; i < n; i++) f[i] = pattern & 1 ? (i & 1 ? 3.0f : -3.0f) : -3.0f;
    quant_from_float_ref(act_type(wt), f, x, n);
    fill_random_blocks(wt, w, n);
    const lm_type_traits *t = quant_traits(wt);
    const uint8_t fb = pattern & 2 ? 0xFF : 0x00, sb = pattern & 2 ? 0x80 : 0x7F;
    for (int64_t b = 0; b < n / t->blck; b++) {
        uint8_t *blk = w + (size_t)b * t->type_size;
        switch (wt) {
            case LM_TYPE_Q8_0: memset(blk + 2, sb, 32); break;
            case LM_TYPE_Q4_0: memset(blk + 2, fb, 16); break;
            case LM_TYPE_Q5_0: memset(blk + 2, fb, 20); break;
            case LM_TYPE_Q4_1: memset(blk + 4, fb, 16); break;
            case LM_TYPE_Q5_1: memset(blk + 4, fb, 20); break;
            case LM_TYPE_MXFP4: memset(blk + 1, pattern & 2 ? 0xFF : 0x77, 16); break;
            case LM_TYPE_Q4_K: memset(blk + 4, 0xFF, 12), memset(blk + 16, fb, 128); break;
            case LM_TYPE_Q5_K: memset(blk + 4, 0xFF, 12), memset(blk + 16, fb, 160); break;
            case LM_TYPE_Q6_K: memset(blk, fb, 192), memset(blk + 192, sb, 16); break;
            default: break;
        }
    }
}

/* vec_dot on rows at the integer extremes (make_extremes, patterns 0..3,
 * n elements): within TOL of sum |w x| of the float64 dot, and with
 * check_ref of quant_vec_dot_ref too. */
static inline void check_extremes(uint32_t wt, int64_t n, lm_vec_dot_fn vec_dot, bool check_ref, char *msg, size_t ml) {
    uint8_t *w = lm_malloc(quant_row_size(wt, n));
    void *x = lm_malloc(quant_row_size(act_type(wt), n));
    float *f = lm_malloc((size_t)n * sizeof(float));
    for (int pattern = 0; pattern < 4 && !msg[0]; pattern++) {
        make_extremes(wt, n, pattern, f, x, w);
        double abs_sum, exact = deq_dot(wt, n, w, x, &abs_sum);
        float got = vec_dot(n, w, x), ref = quant_vec_dot_ref(wt, n, w, x);
        if (!(fabs((double)got - exact) <= TOL * abs_sum + 1e-30))
            snprintf(msg, ml, "%s extremes %d: %.9g, float64 %.9g", quant_type_name(wt), pattern, got, exact);
        else if (check_ref && !(fabs((double)got - ref) <= TOL * abs_sum + 1e-30))
            snprintf(msg, ml, "%s extremes %d: %.9g, reference %.9g", quant_type_name(wt), pattern, got, ref);
    }
    lm_free(w);
    lm_free(x);
    lm_free(f);
}

/* The references of rows x n weights w (row-major) for n_tok tokens of
 * floats x: ref[t * rows + r] = quant_vec_dot_ref with the token's
 * activation row (quant_act_from_float), tol[...] = rel * sum |w x| +
 * 1e-30. True when every quant_vec_dot_ref is within its tol of the
 * float64 dot. */
static inline bool matmul_reference(uint32_t wt, int64_t n, int64_t rows, const uint8_t *w, const float *x, int n_tok,
                                    double rel, double *ref, double *tol) {
    const size_t rb = quant_row_size(wt, n), qs = quant_row_size(act_type(wt), n);
    uint8_t *xq = lm_malloc(qs);
    bool ok = true;
    for (int t = 0; t < n_tok; t++) {
        quant_act_from_float(wt, x + (size_t)t * (size_t)n, xq, n);
        for (int64_t r = 0; r < rows; r++) {
            const size_t i = (size_t)t * (size_t)rows + (size_t)r;
            double abs_sum, exact = deq_dot(wt, n, w + (size_t)r * rb, xq, &abs_sum);
            ref[i] = quant_vec_dot_ref(wt, n, w + (size_t)r * rb, xq);
            tol[i] = rel * abs_sum + 1e-30;
            ok = ok && fabs(ref[i] - exact) <= tol[i];
        }
    }
    lm_free(xq);
    return ok;
}

/* y (n_tok tokens, ys apart) for every row of the interleaved matrix wp
 * (groups of LM_PACK_ROWS) through gemm, the tokens in tiles of `split`
 * (the last one shorter) after a first tile of `first` tokens (none when
 * 0). */
static inline void packed_all(lm_packed_gemm_fn gemm, uint32_t wt, int64_t n, int64_t rows, const uint8_t *wp,
                              const uint8_t *x, size_t xs, int n_tok, int split, int first, float *y, size_t ys) {
    const size_t gb = quant_pack_size(wt, LM_PACK_ROWS, n);
    for (int64_t g = 0; g * LM_PACK_ROWS < rows; g++) {
        int nr = rows - LM_PACK_ROWS * g < LM_PACK_ROWS ? (int)(rows - LM_PACK_ROWS * g) : LM_PACK_ROWS;
        int c = 0;
        if (first > 0) {
            gemm(n, wp + (size_t)g * gb, nr, x, xs, first, y + LM_PACK_ROWS * g, ys);
            c = first;
        }
        for (; c < n_tok; c += split) {
            int nc = n_tok - c < split ? n_tok - c : split;
            gemm(n, wp + (size_t)g * gb, nr, x + (size_t)c * xs, xs, nc, y + (size_t)c * ys + LM_PACK_ROWS * g, ys);
        }
    }
}

/* Outputs y (n_tok tokens, ys >= rows apart, padding set to -1234.5f) of
 * rows x n weights w against the tokens' activation rows xq (act_type,
 * one after the other): each within TOL of sum |w x| of both
 * quant_vec_dot_ref and the float64 dot, the padding untouched. */
static inline void check_packed_outputs(uint32_t wt, int64_t n, int64_t rows, const uint8_t *w, const uint8_t *xq,
                                        int n_tok, const float *y, size_t ys, char *msg, size_t ml) {
    const size_t rb = quant_row_size(wt, n), qs = quant_row_size(act_type(wt), n);
    for (int c = 0; c < n_tok && !msg[0]; c++)
        for (size_t r = 0; r < ys && !msg[0]; r++) {
            float got = y[(size_t)c * ys + r];
            if (r >= (size_t)rows) {
                if (got != -1234.5f) snprintf(msg, ml, "wrote past the last row (token %d, %zu)", c, r);
                continue;
            }
            const uint8_t *wr = w + r * rb, *xc = xq + (size_t)c * qs;
            double abs_sum, exact = deq_dot(wt, n, wr, xc, &abs_sum);
            float ref = quant_vec_dot_ref(wt, n, wr, xc);
            double tol = TOL * abs_sum + 1e-30;
            if (!(fabs((double)got - ref) <= tol) || !(fabs((double)got - exact) <= tol))
                snprintf(msg, ml, "row %zu token %d: packed %.9g reference %.9g float64 %.9g (tol %.3g)", r, c, got,
                         ref, exact, tol);
        }
}

/* The packed tiles of gemm on rows x n weights w (their interleaved copy
 * wp) against n_tok tokens x (xs apart; their act_type rows xq, one after
 * the other): single-token tiles as check_packed_outputs says, and every
 * tile width 2..max_split bit-identical to them, after a first tile of 1
 * to `split` tokens (all_firsts) or of 0, 1 and 2. */
static inline void check_packed_tiles(lm_packed_gemm_fn gemm, uint32_t wt, int64_t n, int64_t rows, const uint8_t *w,
                                      const uint8_t *wp, const uint8_t *x, size_t xs, const uint8_t *xq, int n_tok,
                                      int max_split, bool all_firsts, char *msg, size_t ml) {
    const size_t ys = (size_t)rows + 3; /* three padding floats per token */
    float *y0 = lm_malloc(ys * (size_t)n_tok * sizeof(float)), *y1 = lm_malloc(ys * (size_t)n_tok * sizeof(float));
    for (size_t i = 0; i < ys * (size_t)n_tok; i++) y0[i] = -1234.5f;
    packed_all(gemm, wt, n, rows, wp, x, xs, n_tok, 1, 0, y0, ys);
    check_packed_outputs(wt, n, rows, w, xq, n_tok, y0, ys, msg, ml);
    for (int split = 2; split <= max_split && !msg[0]; split++)
        for (int first = all_firsts ? 1 : 0; first <= (all_firsts ? split : 2) && !msg[0]; first++) {
            for (size_t i = 0; i < ys * (size_t)n_tok; i++) y1[i] = -1234.5f;
            packed_all(gemm, wt, n, rows, wp, x, xs, n_tok, split, first, y1, ys);
            if (memcmp(y0, y1, ys * (size_t)n_tok * sizeof(float)))
                snprintf(msg, ml, "tiles of %d tokens (a first tile of %d) differ from single tokens", split, first);
        }
    lm_free(y0);
    lm_free(y1);
}

/* What a test asks of one type's entry in a kernel table. */
typedef bool (*kc_entry_fn)(const lm_type_kernels *k, uint32_t type);

/* The table of isa with LAMINA_NO_REPACK unset: entry_ok for every type
 * it holds; the tables of others (n_others; those this CPU runs) and
 * isa's with LAMINA_NO_REPACK=1: has_tile for none (`what` names the tile
 * in msg). LAMINA_NO_REPACK is restored after. */
static inline void check_tile_table(lm_isa isa, const char *what, kc_entry_fn entry_ok, kc_entry_fn has_tile,
                                    const lm_isa *others, size_t n_others, char *msg, size_t ml) {
    const char *old = getenv("LAMINA_NO_REPACK");
    char saved[64] = "";
    if (old) snprintf(saved, sizeof saved, "%s", old);
    unsetenv("LAMINA_NO_REPACK");
    if (kernels_use(isa) != 0) snprintf(msg, ml, "cannot switch to the variant");
    for (uint32_t t = 0; t < LM_TYPE_COUNT && !msg[0]; t++)
        if (kernels_type(t) && !entry_ok(kernels_type(t), t))
            snprintf(msg, ml, "%s: %s entry", quant_type_name(t), what);
    for (size_t i = 0; i < n_others && !msg[0]; i++) {
        if (!kernels_cpu_has(others[i])) continue;
        if (kernels_use(others[i]) != 0) snprintf(msg, ml, "cannot switch to %s", kernels_isa_str(others[i]));
        for (uint32_t t = 0; t < LM_TYPE_COUNT && !msg[0]; t++)
            if (kernels_type(t) && has_tile(kernels_type(t), t))
                snprintf(msg, ml, "%s has a %s tile (%s)", kernels_isa_str(others[i]), what, quant_type_name(t));
    }
    setenv("LAMINA_NO_REPACK", "1", 1);
    if (!msg[0] && kernels_use(isa) != 0) snprintf(msg, ml, "cannot switch to the variant");
    for (uint32_t t = 0; t < LM_TYPE_COUNT && !msg[0]; t++)
        if (kernels_type(t) && has_tile(kernels_type(t), t))
            snprintf(msg, ml, "a %s tile with LAMINA_NO_REPACK (%s)", what, quant_type_name(t));
    if (old) setenv("LAMINA_NO_REPACK", saved, 1);
    else unsetenv("LAMINA_NO_REPACK");
}

/* A 512-bit tile over two interleaved groups of 8 rows (wp, the second
 * group gb bytes on) for every row count 9..16 and 1..max_tok tokens of
 * x (xs apart): each output bit-identical to packed_gemm on each group,
 * the variant's (vg) and avx2's (ag), within TOL of the float64 dot
 * (ref and abs_sum as, [token * 16 + row]), nothing written past nr, nc. */
static inline void check_two_group_tile(lm_packed_gemm_fn tile, lm_packed_gemm_fn vg, lm_packed_gemm_fn ag, int64_t n,
                                        const uint8_t *wp, size_t gb, const uint8_t *x, size_t xs, int max_tok,
                                        const double *ref, const double *as, char *msg, size_t ml) {
    const size_t m = (size_t)max_tok * 16;
    float *y = lm_malloc(m * sizeof(float)), *y0 = lm_malloc(m * sizeof(float)), *y1 = lm_malloc(m * sizeof(float));
    for (int nr = 9; nr <= 16 && !msg[0]; nr++)
        for (int nc = 1; nc <= max_tok && !msg[0]; nc++) {
            for (size_t i = 0; i < m; i++) y[i] = y0[i] = y1[i] = -1.0f;
            tile(n, wp, nr, x, xs, nc, y, 16);
            vg(n, wp, 8, x, xs, nc, y0, 16);
            vg(n, wp + gb, nr - 8, x, xs, nc, y0 + 8, 16);
            ag(n, wp, 8, x, xs, nc, y1, 16);
            ag(n, wp + gb, nr - 8, x, xs, nc, y1 + 8, 16);
            if (!bits_equal(y, y0, m))
                snprintf(msg, ml, "%d rows x %d tokens differ from the variant's packed_gemm", nr, nc);
            else if (!bits_equal(y, y1, m))
                snprintf(msg, ml, "%d rows x %d tokens differ from avx2's packed_gemm", nr, nc);
            for (int c = 0; c < nc && !msg[0]; c++)
                for (int r = 0; r < nr && !msg[0]; r++)
                    if (!(fabs((double)y[c * 16 + r] - ref[c * 16 + r]) <= TOL * as[c * 16 + r] + 1e-30))
                        snprintf(msg, ml, "row %d token %d: %.9g, reference %.9g", r, c, y[c * 16 + r],
                                 ref[c * 16 + r]);
            for (int c = nc; c < max_tok && !msg[0]; c++) /* nothing past nc, nr written */
                for (int r = 0; r < 16; r++)
                    if (y[c * 16 + r] != -1.0f) snprintf(msg, ml, "wrote token %d", c);
            for (int c = 0; c < nc && !msg[0]; c++)
                for (int r = nr; r < 16; r++)
                    if (y[c * 16 + r] != -1.0f) snprintf(msg, ml, "wrote row %d with nr %d", r, nr);
        }
    lm_free(y);
    lm_free(y0);
    lm_free(y1);
}

/* ops_matmul on pool with the table switched to isa, for rows x n weights
 * of type wt (random_odd: the odd rows with random quant bytes; with the
 * interleaved copy where the type has one) and 1..max_tok tokens: each
 * token alone within TOL of sum |w x| of the float64 dot, every batch
 * bit-identical to its tokens alone (batch invariance within the
 * variant) and to the avx2 table's, whatever table LAMINA_CPU chose at
 * the start. entry_ok (or NULL) says whether the variant's entry for wt
 * is what the test expects. Leaves the avx2 table in place. */
static inline void check_matmul_vs_avx2(lm_pool *pool, lm_isa isa, uint32_t wt, int64_t rows, int64_t n, int max_tok,
                                        bool random_odd, kc_entry_fn entry_ok, char *msg, size_t ml) {
    const char *name = quant_type_name(wt);
    size_t rb = quant_row_size(wt, n), xq_s = quant_row_size(act_type(wt), n);
    uint8_t *w = lm_malloc(rb * (size_t)rows);
    uint8_t *wp = quant_pack_rows(wt) ? lm_malloc(quant_pack_size(wt, rows, n)) : NULL;
    for (int64_t r = 0; r < rows; r++) make_weight_keep_scales(wt, n, random_odd && r % 2 == 1, w + (size_t)r * rb);
    if (wp) quant_pack(wt, w, rb, rows, n, wp);
    float *x = lm_malloc((size_t)max_tok * (size_t)n * sizeof(float));
    fill_normal(x, (int64_t)max_tok * n, 1.0);
    uint8_t *xq = lm_malloc(xq_s);
    size_t ny = (size_t)max_tok * (size_t)rows;
    float *y = lm_malloc(ny * sizeof(float)), *y2 = lm_malloc(ny * sizeof(float));
    float *alone = lm_malloc(ny * sizeof(float));
    /* scratch for both tables (its size follows the table: packed
     * activation rows are longer than Q8_0's) */
    size_t ss = 0;
    if (kernels_use(LM_ISA_AVX2) == 0) ss = ops_matmul_scratch(wt, n, max_tok);
    if (kernels_use(isa) == 0 && ops_matmul_scratch(wt, n, max_tok) > ss) ss = ops_matmul_scratch(wt, n, max_tok);
    void *scratch = lm_malloc(ss);
    lm_weight lw = {.data = w, .type = wt, .rows = rows, .cols = n, .row_bytes = rb, .packed = wp};
    if (kernels_use(isa) != 0 || (entry_ok && !entry_ok(kernels_type(wt), wt)))
        snprintf(msg, ml, "%s rows %lld: cannot switch to the variant, or its table lacks the entry", name,
                 (long long)rows);
    for (int t = 0; t < max_tok && !msg[0]; t++)
        ops_matmul(pool, alone + (size_t)t * (size_t)rows, &lw, x + (size_t)t * (size_t)n, 1, scratch);
    for (int t = 0; t < max_tok && !msg[0]; t++) { /* each token alone against the reference */
        quant_act_from_float(wt, x + (size_t)t * (size_t)n, xq, n);
        for (int64_t r = 0; r < rows && !msg[0]; r++) {
            double as, ref = deq_dot(wt, n, w + (size_t)r * rb, xq, &as);
            float got = alone[(size_t)t * (size_t)rows + (size_t)r];
            if (!(fabs((double)got - ref) <= TOL * as + 1e-30))
                snprintf(msg, ml, "%s rows %lld: token %d row %lld: %.9g, reference %.9g", name, (long long)rows, t,
                         (long long)r, got, ref);
        }
    }
    for (int n_tok = 1; n_tok <= max_tok && !msg[0]; n_tok++) {
        size_t m = (size_t)n_tok * (size_t)rows;
        if (kernels_use(isa) != 0) snprintf(msg, ml, "cannot switch to the variant");
        ops_matmul(pool, y, &lw, x, n_tok, scratch);
        if (kernels_use(LM_ISA_AVX2) != 0) snprintf(msg, ml, "cannot switch to avx2");
        ops_matmul(pool, y2, &lw, x, n_tok, scratch);
        if (msg[0]) break;
        if (!bits_equal(y, alone, m))
            snprintf(msg, ml, "%s rows %lld batch %d: differs from its tokens alone", name, (long long)rows, n_tok);
        else if (!bits_equal(y, y2, m))
            snprintf(msg, ml, "%s rows %lld batch %d: differs from the avx2 table's", name, (long long)rows, n_tok);
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

/* ---- the variant loop ------------------------------------------------------- */

/* The variant whose checks KC_CHECK runs now, and why it cannot run (NULL
 * when it can); the checks named NOT RUN so far. */
static const char *kc_variant_name_, *kc_variant_why_;
static int kc_not_run_;

/* Starts a variant: a "variant NAME" line when it runs (why NULL), else
 * each KC_CHECK of it prints "NOT RUN check on NAME: why" and counts as
 * skipped, never as passed. */
static inline void kc_variant(const char *name, const char *why) {
    kc_variant_name_ = name;
    kc_variant_why_ = why;
    if (!why) printf("variant %s\n", name);
}

static inline void kc_not_run(const char *check) {
    printf("NOT RUN %s on %s: %s\n", check, kc_variant_name_, kc_variant_why_);
    kc_not_run_++;
}

#define KC_CHECK(fn)                                                                                                   \
    do {                                                                                                               \
        if (kc_variant_why_) kc_not_run(#fn);                                                                          \
        else TEST_RUN(fn);                                                                                             \
    } while (0)

/* TEST_DONE with the skipped checks counted (tests/run.sh adds them up). */
static inline int kc_done(void) {
    if (!kc_not_run_) return TEST_DONE();
    printf("%d passed, %d failed, %d skipped\n", test_passed_, test_failed_, kc_not_run_);
    return test_failed_ ? 1 : 0;
}

#endif
