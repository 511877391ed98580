/*
 * test_attn_fused.c - the fused attention kernels, which read F16 and Q8_0
 * KV rows in their stored type (kernels.h: scores_f16, pv_f16, pv_q8_0),
 * and the integer Q8_0 scores (scores_q8_0_q8), in every variant this CPU
 * runs.
 *
 * Claims checked:
 *   1. kernel level, bit for bit: a fused entry gives the bits of the
 *      type's to_float followed by the same variant's float entry (scores,
 *      pv; Q8_0 has P·V only), for head dims 64, 80 (F16 only: Q8_0 needs a multiple of 32),
 *      128, 256 and a scalar-only 12 (F16), 1 .. 17 rows, 1 .. 67 keys (not
 *      multiples of any unroll), zero probabilities among the P·V weights;
 *      and the same bits again with pf rows to prefetch (kernels.h: a
 *      hint), other rows than the ones read, as many or fewer;
 *   2. kernel level, against float64 on the stored values: each score
 *      within 1e-5 x Σ_d |q_d k_d| (+1e-30), each output element of P·V
 *      within 1e-5 x (|o| + Σ_t |p_t v_t|);
 *   3. through kv/attn.c (where sub-tiles of up to 8 rows take the fused
 *      kernels and larger ones convert first): a prefill call of 32 queries
 *      (32 x group rows, converted) and the same queries one at a time
 *      (group rows, fused) give the same bits, with a sliding window,
 *      softcap and sinks, and the split-K partials merged give them too;
 *      every output within 1e-5 (relative L2) of a float64 attention on
 *      the stored values. A Q8_0 cache in a variant with integer scores
 *      (scores_q8_0_q8) takes them in every sub-tile: the same bit
 *      equalities; within 1e-5 of float64 attention whose query is the
 *      scaled query quantized to Q8_0 and back (so a sub-tile that took the
 *      float scores would fail), and within 2e-2 of it on the query itself;
 *   4. the integer Q8_0 scores (kernels.h: scores_q8_0_q8), kernel level:
 *      every variant has them and gives the scalar reference's bits, for head dims 32,
 *      64, 128, 256 (and 2080, past what an entry stages), 1 .. 17 rows, 1 .. 67 keys, extreme blocks (all
 *      ±127, zero scales); each score within 1e-5 x Σ|q̂_d k_d| of the
 *      float64 dot of the dequantized query q̂ and key, and within
 *      Σ_b (amax_b / 200) Σ_{d in b} |k_d| + 1e-5 x Σ|q_d k_d| of the
 *      float64 dot of the unquantized query q (amax_b: block b's largest
 *      |q_d|; Q8_0 rounds each q_d to within amax_b / 254, and its F16
 *      scale adds at most amax_b x 2^-11); the same bits with pf rows;
 *   5. the x86 entries ask for every line of their pf rows once, in
 *      address order (test_shadow_order).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "format/quant.h"
#include "kernels/kernels.h"
#include "kernels/scalar.h"
#if defined(__x86_64__) || defined(__i386__)
#include "kernels/avx2_attn.h"
#include "kernels/x86_shadow.h"
#endif
#include "kv/attn.h"
#include "kv/kv.h"
#include "test.h"

/* The ISAs this CPU runs, the scalar reference first. */
static int cpu_isas(int *isas) {
    int n = 0;
    for (int isa = 0; isa < LM_ISA_COUNT; isa++)
        if (isa == LM_ISA_SCALAR || kernels_cpu_has((lm_isa)isa)) isas[n++] = isa;
    return n;
}

/* ---- 1, 2: the kernels ------------------------------------------------------------ */

#define NKMAX 67
#define RMAXT 17

/* nk rows of hd values in type, each its own allocation (row pointers, as
 * the pages give them), and their stored values as floats. line: every row
 * on a 64-byte boundary (as a pool's F16 rows of whole lines lie, which
 * the x86 entries prefetch in address order: x86_shadow.h), else malloc's. */
typedef struct {
    void *raw[NKMAX];
    float *f[NKMAX]; /* (hd) to_float of raw */
} rows;

static void rows_make(rows *r, uint32_t type, int hd, int nk, bool line, lm_rng *g) {
    const lm_type_traits *tt = quant_traits(type);
    float *x = malloc((size_t)hd * sizeof(float));
    for (int t = 0; t < nk; t++) {
        for (int d = 0; d < hd; d++) x[d] = lm_rng_normal(g) * (1.0f + (float)(d % 5) * 0.5f);
        size_t rb = quant_row_size(type, hd);
        r->raw[t] = line ? aligned_alloc(64, (rb + 63) / 64 * 64) : malloc(rb);
        r->f[t] = malloc((size_t)hd * sizeof(float));
        tt->from_float(x, r->raw[t], hd);
        tt->to_float(r->raw[t], r->f[t], hd);
    }
    free(x);
}

static void rows_free(rows *r, int nk) {
    for (int t = 0; t < nk; t++) free(r->raw[t]), free(r->f[t]);
}

/* One (type, hd, R, nk) case on the table now: returns 0 when every claim
 * holds; *worst collects the largest error / bound ratio. */
static int check_kernels(uint32_t type, int hd, int R, int nk, uint64_t seed, double *worst) {
    lm_rng g;
    lm_rng_seed(&g, seed);
    const lm_attn_kernels *a = kernels_attn(hd);
    lm_attn_scores_kv_fn sk = type == LM_TYPE_F16 ? a->scores_f16 : NULL; /* Q8_0 keys: integer scores (4) */
    lm_attn_pv_kv_fn pk = type == LM_TYPE_F16 ? a->pv_f16 : a->pv_q8_0;
    if (!pk) return 0; /* a variant without fused entries: attention converts */
    rows K, V;
    rows_make(&K, type, hd, nk, seed % 4 < 2, &g);
    rows_make(&V, type, hd, nk, seed % 4 < 2, &g);
    float *Q = malloc((size_t)R * hd * sizeof(float)), *P = malloc((size_t)R * NKMAX * sizeof(float));
    float *S1 = malloc((size_t)R * NKMAX * sizeof(float)), *S2 = malloc((size_t)R * NKMAX * sizeof(float));
    float *O0 = malloc((size_t)R * hd * sizeof(float)), *O1 = malloc((size_t)R * hd * sizeof(float));
    float *O2 = malloc((size_t)R * hd * sizeof(float)), *O3 = malloc((size_t)R * hd * sizeof(float));
    float *S3 = malloc((size_t)R * NKMAX * sizeof(float));
    int npf = (int)(seed % 2) ? nk : (nk + 1) / 2; /* rows to prefetch: as many, or fewer */
    for (int i = 0; i < R * hd; i++) Q[i] = lm_rng_normal(&g) * 0.2f, O0[i] = lm_rng_normal(&g);
    for (int i = 0; i < R * NKMAX; i++) P[i] = i % 5 == 3 ? 0.0f : (float)lm_rng_uniform(&g);
    memset(S1, 0, (size_t)R * NKMAX * sizeof(float));
    memset(S2, 0, (size_t)R * NKMAX * sizeof(float));
    memset(S3, 0, (size_t)R * NKMAX * sizeof(float));
    int rc = 0;
    if (sk) {
        sk(Q, R, hd, (const void *const *)K.raw, nk, S1, NKMAX, NULL, 0);
        a->scores(Q, R, hd, (const float *const *)K.f, nk, S2, NKMAX);
        sk(Q, R, hd, (const void *const *)K.raw, nk, S3, NKMAX, (const void *const *)V.raw, npf);
    }
    if (memcmp(S1, S2, (size_t)R * NKMAX * sizeof(float))) {
        fprintf(stderr, "  %s %s hd %d R %d nk %d: fused scores differ from to_float + scores\n", kernels_isa_name(),
                quant_type_name(type), hd, R, nk);
        rc = -1;
    }
    if (memcmp(S1, S3, (size_t)R * NKMAX * sizeof(float))) {
        fprintf(stderr, "  %s %s hd %d R %d nk %d: fused scores change with rows to prefetch\n", kernels_isa_name(),
                quant_type_name(type), hd, R, nk);
        rc = -1;
    }
    for (int r = 0; r < R && sk; r++)
        for (int t = 0; t < nk; t++) {
            double ref = 0, mag = 1e-30;
            for (int d = 0; d < hd; d++) {
                double p = (double)Q[(size_t)r * hd + d] * K.f[t][d];
                ref += p, mag += fabs(p);
            }
            double e = fabs(S1[(size_t)r * NKMAX + t] - ref) / mag;
            *worst = e > *worst ? e : *worst;
            if (!(e < 1e-5) && !rc) {
                fprintf(stderr, "  %s %s hd %d R %d nk %d: score (%d, %d) off by %.3g of its magnitude\n",
                        kernels_isa_name(), quant_type_name(type), hd, R, nk, r, t, e);
                rc = -1;
            }
        }
    memcpy(O1, O0, (size_t)R * hd * sizeof(float));
    memcpy(O2, O0, (size_t)R * hd * sizeof(float));
    memcpy(O3, O0, (size_t)R * hd * sizeof(float));
    pk(O1, R, hd, P, NKMAX, (const void *const *)V.raw, nk, NULL, 0);
    a->pv(O2, R, hd, P, NKMAX, (const float *const *)V.f, nk);
    pk(O3, R, hd, P, NKMAX, (const void *const *)V.raw, nk, (const void *const *)K.raw, npf);
    if (memcmp(O1, O2, (size_t)R * hd * sizeof(float))) {
        fprintf(stderr, "  %s %s hd %d R %d nk %d: fused P·V differs from to_float + pv\n", kernels_isa_name(),
                quant_type_name(type), hd, R, nk);
        rc = -1;
    }
    if (memcmp(O1, O3, (size_t)R * hd * sizeof(float))) {
        fprintf(stderr, "  %s %s hd %d R %d nk %d: fused P·V changes with rows to prefetch\n", kernels_isa_name(),
                quant_type_name(type), hd, R, nk);
        rc = -1;
    }
    for (int r = 0; r < R; r++)
        for (int d = 0; d < hd; d++) {
            double ref = O0[(size_t)r * hd + d], mag = fabs(ref) + 1e-30;
            for (int t = 0; t < nk; t++) {
                double p = (double)P[(size_t)r * NKMAX + t] * V.f[t][d];
                ref += p, mag += fabs(p);
            }
            double e = fabs(O1[(size_t)r * hd + d] - ref) / mag;
            *worst = e > *worst ? e : *worst;
            if (!(e < 1e-5) && !rc) {
                fprintf(stderr, "  %s %s hd %d R %d nk %d: P·V (%d, %d) off by %.3g of its magnitude\n",
                        kernels_isa_name(), quant_type_name(type), hd, R, nk, r, d, e);
                rc = -1;
            }
        }
    rows_free(&K, nk), rows_free(&V, nk);
    free(Q), free(P), free(S1), free(S2), free(S3), free(O0), free(O1), free(O2), free(O3);
    return rc;
}

static void test_kernels_every_variant(void) {
    static const int hds[] = {64, 80, 128, 256, 12};
    static const int Rs[] = {1, 2, 3, 4, 5, 8, 17};
    static const int nks[] = {1, 2, 5, 64, 67};
    int isas[LM_ISA_COUNT], n_isa = cpu_isas(isas), n = 0;
    double worst = 0;
    for (int i = 0; i < n_isa; i++) {
        CHECK(kernels_use(isas[i]) == 0);
        for (int ty = 0; ty < 2; ty++) {
            uint32_t type = ty ? LM_TYPE_Q8_0 : LM_TYPE_F16;
            for (size_t h = 0; h < sizeof hds / sizeof hds[0]; h++) {
                if (type == LM_TYPE_Q8_0 && hds[h] % QK8_0) continue;
                for (size_t r = 0; r < sizeof Rs / sizeof Rs[0]; r++)
                    for (size_t k = 0; k < sizeof nks / sizeof nks[0]; k++) {
                        uint64_t seed = (uint64_t)(hds[h] * 1000 + Rs[r] * 100 + nks[k] + ty * 7);
                        CHECK(!check_kernels(type, hds[h], Rs[r], nks[k], seed, &worst));
                        n++;
                    }
            }
        }
    }
    kernels_use(-1);
    printf("  %d kernel cases over %d variants: worst error %.3g of the magnitude\n", n, n_isa, worst);
}

/* ---- 4: the integer Q8_0 scores ------------------------------------------------ */

/* One (hd, R, nk) case of scores_q8_0_q8 on the table now against the scalar
 * reference and float64; returns 0 when every claim holds. extreme: rows of
 * ±127 codes under the largest scales, and a zero block in each. */
static int check_int_scores(int hd, int R, int nk, bool extreme, uint64_t seed, double *worst) {
    const lm_attn_kernels *a = kernels_attn(hd);
    if (!a->scores_q8_0_q8) return 0; /* a variant without them: attention keeps the float scores */
    lm_rng g;
    lm_rng_seed(&g, seed);
    const lm_type_traits *tt = quant_traits(LM_TYPE_Q8_0);
    int nb = hd / QK8_0;
    rows K;
    rows_make(&K, LM_TYPE_Q8_0, hd, nk, seed % 4 < 2, &g);
    float *Q = malloc((size_t)R * hd * sizeof(float)), *Qd = malloc((size_t)R * hd * sizeof(float));
    block_q8_0 *Qq = malloc((size_t)R * nb * sizeof(block_q8_0));
    float *S1 = malloc((size_t)R * NKMAX * sizeof(float)), *S2 = malloc((size_t)R * NKMAX * sizeof(float));
    for (int i = 0; i < R * hd; i++) Q[i] = lm_rng_normal(&g) * (i % 3 ? 0.3f : 2.0f);
    if (extreme) {
        for (int i = 0; i < R * hd; i++) Q[i] = (i / 7) % 2 ? 60000.0f : -60000.0f;
        for (int t = 0; t < nk; t++) {
            block_q8_0 *b = K.raw[t];
            for (int j = 0; j < nb; j++) {
                b[j].d = lm_f32_to_f16(j == 1 ? 0.0f : 65504.0f / 127);
                for (int e = 0; e < QK8_0; e++) b[j].qs[e] = (int8_t)((e + t) % 3 ? 127 : -127);
            }
            tt->to_float(K.raw[t], K.f[t], hd);
        }
        for (int i = 0; i < hd; i++) Q[i] = 0.0f; /* a zero query row: zero scales */
    }
    for (int r = 0; r < R; r++) {
        tt->from_float(Q + (size_t)r * hd, Qq + (size_t)r * nb, hd);
        tt->to_float(Qq + (size_t)r * nb, Qd + (size_t)r * hd, hd);
    }
    memset(S1, 0, (size_t)R * NKMAX * sizeof(float));
    memset(S2, 0, (size_t)R * NKMAX * sizeof(float));
    a->scores_q8_0_q8(Qq, R, hd, (const void *const *)K.raw, nk, S1, NKMAX, NULL, 0);
    scalar_attn_scores_q8_0_q8(Qq, R, hd, (const void *const *)K.raw, nk, S2, NKMAX, NULL, 0);
    int rc = 0;
    if (memcmp(S1, S2, (size_t)R * NKMAX * sizeof(float))) {
        fprintf(stderr, "  %s hd %d R %d nk %d%s: integer scores differ from the scalar reference\n",
                kernels_isa_name(), hd, R, nk, extreme ? " (extreme)" : "");
        rc = -1;
    }
    /* rows to prefetch (the keys in reverse, as many or fewer) change nothing */
    const void *pf[NKMAX];
    for (int t = 0; t < nk; t++) pf[t] = K.raw[nk - 1 - t];
    memset(S2, 0, (size_t)R * NKMAX * sizeof(float));
    a->scores_q8_0_q8(Qq, R, hd, (const void *const *)K.raw, nk, S2, NKMAX, pf, (int)(seed % 2) ? nk : (nk + 1) / 2);
    if (memcmp(S1, S2, (size_t)R * NKMAX * sizeof(float))) {
        fprintf(stderr, "  %s hd %d R %d nk %d%s: integer scores change with rows to prefetch\n", kernels_isa_name(),
                hd, R, nk, extreme ? " (extreme)" : "");
        rc = -1;
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < nk; t++) {
            const float *q = Q + (size_t)r * hd, *qd = Qd + (size_t)r * hd;
            double ref_d = 0, mag_d = 1e-30, ref = 0, mag = 1e-30, quant = 0;
            for (int d = 0; d < hd; d++) {
                double pd = (double)qd[d] * K.f[t][d], p = (double)q[d] * K.f[t][d];
                ref_d += pd, mag_d += fabs(pd), ref += p, mag += fabs(p);
            }
            for (int b = 0; b < nb; b++) {
                double amax = 0, ksum = 0;
                for (int e = b * QK8_0; e < (b + 1) * QK8_0; e++) {
                    amax = fabs(q[e]) > amax ? fabs(q[e]) : amax;
                    ksum += fabs(K.f[t][e]);
                }
                quant += amax / 200 * ksum;
            }
            double s = S1[(size_t)r * NKMAX + t], e1 = fabs(s - ref_d) / mag_d,
                   e2 = fabs(s - ref) / (quant + 1e-5 * mag);
            *worst = e1 > *worst ? e1 : *worst;
            if ((!(e1 < 1e-5) || !(e2 <= 1)) && !rc) {
                fprintf(stderr,
                        "  %s hd %d R %d nk %d: score (%d, %d) = %g, %g with the dequantized query (%.3g of "
                        "its magnitude), %g with the query (%.3g of the bound)\n",
                        kernels_isa_name(), hd, R, nk, r, t, s, ref_d, e1, ref, e2);
                rc = -1;
            }
        }
    rows_free(&K, nk);
    free(Q), free(Qd), free(Qq), free(S1), free(S2);
    return rc;
}

static void test_int_scores_every_variant(void) {
    static const int hds[] = {32, 64, 128, 256};
    static const int Rs[] = {1, 2, 3, 4, 5, 8, 9, 17};
    static const int nks[] = {1, 2, 5, 8, 64, 67};
    int isas[LM_ISA_COUNT], n_isa = cpu_isas(isas), n = 0, n_int = 0;
    double worst = 0;
    for (int i = 0; i < n_isa; i++) {
        CHECK(kernels_use(isas[i]) == 0);
        n_int += kernels_attn(64)->scores_q8_0_q8 != NULL;
        for (size_t h = 0; h < sizeof hds / sizeof hds[0]; h++)
            for (size_t r = 0; r < sizeof Rs / sizeof Rs[0]; r++)
                for (size_t k = 0; k < sizeof nks / sizeof nks[0]; k++) {
                    uint64_t seed = (uint64_t)(hds[h] * 1000 + Rs[r] * 100 + nks[k]);
                    CHECK(!check_int_scores(hds[h], Rs[r], nks[k], false, seed, &worst));
                    CHECK(!check_int_scores(hds[h], Rs[r], nks[k], true, seed, &worst));
                    n += 2;
                }
        /* head dim 2080: past the query blocks the x86 entries stage (the scalar reference then) */
        for (int R = 1; R <= 9; R += 4) {
            CHECK(!check_int_scores(2080, R, 67, false, (uint64_t)R, &worst));
            n++;
        }
    }
    kernels_use(-1);
    CHECK(n_int == n_isa); /* the reference and every variant, x86 and NEON, have them */
    printf("  %d integer-score cases over %d variants (%d with the entry): worst error %.3g of the magnitude\n", n,
           n_isa, n_int, worst);
}

/* ---- 3: through kv/attn.c ------------------------------------------------------- */

typedef struct {
    int n_head, n_head_kv, hd, T;
    uint32_t type;
    int window;
    float cap;
    bool sinks;
} attn_cfg;

/* float64 attention of query i (position pos) of q against the stored
 * k, v rows (T, n_head_kv * hd): window, softcap and sinks as attn.h;
 * scores q·k times qscale. */
static void ref_row(const attn_cfg *c, const float *q, double qscale, const float *ks, const float *vs, int pos,
                    const float *sinks, double *out) {
    int G = c->n_head / c->n_head_kv, hd = c->hd, lo = c->window > 0 ? pos + 1 - c->window : 0;
    double *s = malloc((size_t)(pos + 1) * sizeof(double));
    lo = lo < 0 ? 0 : lo;
    for (int h = 0; h < c->n_head; h++) {
        int kh = h / G;
        double m = c->sinks ? sinks[h] : -INFINITY;
        for (int j = lo; j <= pos; j++) {
            double d = 0;
            for (int e = 0; e < hd; e++)
                d += (double)q[(size_t)h * hd + e] * ks[((size_t)j * c->n_head_kv + kh) * hd + e];
            d *= qscale;
            if (c->cap > 0) d = c->cap * tanh(d / c->cap);
            s[j] = d, m = d > m ? d : m;
        }
        double l = c->sinks ? exp(sinks[h] - m) : 0;
        for (int e = 0; e < hd; e++) out[(size_t)h * hd + e] = 0;
        for (int j = lo; j <= pos; j++) {
            double p = exp(s[j] - m);
            l += p;
            for (int e = 0; e < hd; e++) out[(size_t)h * hd + e] += p * vs[((size_t)j * c->n_head_kv + kh) * hd + e];
        }
        for (int e = 0; e < hd; e++) out[(size_t)h * hd + e] /= l;
    }
    free(s);
}

static int check_attn(const attn_cfg *c, const int *isas, int n_isa, double *worst, double *worst_q8, int *n_q8) {
    int T = c->T, hd = c->hd, nq = 32, pos0 = T - nq, G = c->n_head / c->n_head_kv;
    size_t kvd = (size_t)c->n_head_kv * hd, qd = (size_t)c->n_head * hd;
    lm_rng g;
    lm_rng_seed(&g, (uint64_t)(T * 31 + hd + c->window));
    float *k = malloc((size_t)T * kvd * sizeof(float)), *v = malloc((size_t)T * kvd * sizeof(float));
    float *ks = malloc((size_t)T * kvd * sizeof(float)), *vs = malloc((size_t)T * kvd * sizeof(float));
    float *q = malloc((size_t)nq * qd * sizeof(float)), *sinks = malloc((size_t)c->n_head * sizeof(float));
    float *pre = malloc((size_t)nq * qd * sizeof(float)), *one = malloc((size_t)nq * qd * sizeof(float));
    float *part = malloc((size_t)(T / ATTN_SPLIT + 2) * G * (hd + 2) * sizeof(float));
    double *ref = malloc((size_t)nq * qd * sizeof(double)), *refq = malloc((size_t)nq * qd * sizeof(double));
    float *qq = malloc((size_t)nq * qd * sizeof(float)); /* the scaled query through Q8_0 and back */
    for (size_t i = 0; i < (size_t)T * kvd; i++) k[i] = lm_rng_normal(&g) * (1.0f + (float)(i % 7) * 0.3f);
    for (size_t i = 0; i < (size_t)T * kvd; i++) v[i] = lm_rng_normal(&g);
    for (size_t i = 0; i < (size_t)nq * qd; i++) q[i] = lm_rng_normal(&g) * 1.5f;
    for (int h = 0; h < c->n_head; h++) sinks[h] = -1.0f + 0.7f * (float)h;
    const lm_type_traits *tt = quant_traits(c->type);
    void *tmp = malloc((size_t)hd * 4);
    for (size_t i = 0; i < (size_t)T * kvd; i += (size_t)hd) {
        tt->from_float(k + i, tmp, hd), tt->to_float(tmp, ks + i, hd);
        tt->from_float(v + i, tmp, hd), tt->to_float(tmp, vs + i, hd);
    }
    float scale = 1.0f / sqrtf((float)hd);
    for (size_t i = 0; i < (size_t)nq * qd; i++) qq[i] = q[i] * scale;
    for (size_t i = 0; c->type == LM_TYPE_Q8_0 && i < (size_t)nq * qd; i += (size_t)hd)
        tt->from_float(qq + i, tmp, hd), tt->to_float(tmp, qq + i, hd);
    free(tmp);
    for (int i = 0; i < nq; i++) {
        ref_row(c, q + (size_t)i * qd, 1 / sqrt((double)hd), ks, vs, pos0 + i, sinks, ref + (size_t)i * qd);
        ref_row(c, qq + (size_t)i * qd, 1, ks, vs, pos0 + i, sinks, refq + (size_t)i * qd);
    }

    kv_config kc;
    kv_config_init(&kc, 1, c->n_head_kv, hd);
    kc.type = c->type;
    kc.block_size = 16;
    kc.n_ctx = T;
    kc.n_seqs = 1;
    char err[LM_ERRLEN];
    kv_pool *p = kv_pool_new(&kc, err, sizeof err);
    kv_seq *s = p ? kv_seq_new(p, err, sizeof err) : NULL;
    attn_scratch *scr = p ? attn_scratch_new(p, c->n_head, err, sizeof err) : NULL;
    int rc = s && scr && kv_append(p, s, T, err, sizeof err) == KV_OK ? 0 : -1;
    if (rc) fprintf(stderr, "  setup: %s\n", err);
    else kv_store_rows(p, s, 0, 0, T, k, kvd, v, kvd);
    const float *sk = c->sinks ? sinks : NULL;
    for (int i = 0; i < n_isa && !rc; i++) {
        if (kernels_use(isas[i])) continue;
        const char *isa = kernels_isa_name();
        memset(one, 0xff, (size_t)nq * qd * sizeof(float));
        for (int kh = 0; kh < c->n_head_kv; kh++) {
            /* the prefill call: 32 x G rows, sub-tiles of attn_tile_rows */
            attn_tile_sinks(p, s, 0, kh, q, qd, nq, pos0, scale, c->cap, c->window, sk, pre, qd, scr);
            /* decode calls: one query (G rows) each */
            for (int j = 0; j < nq; j++)
                attn_tile_sinks(p, s, 0, kh, q + (size_t)j * qd, qd, 1, pos0 + j, scale, c->cap, c->window, sk,
                                one + (size_t)j * qd, qd, scr);
        }
        if (memcmp(pre, one, (size_t)nq * qd * sizeof(float))) {
            fprintf(stderr, "  %s %s hd %d G %d window %d: decode rows differ from the prefill call's\n", isa,
                    quant_type_name(c->type), hd, G, c->window);
            rc = -1;
        }
        /* integer Q8_0 scores: exact against the quantized query, within
         * Q8_0's rounding of it against the query itself */
        bool q8q = c->type == LM_TYPE_Q8_0 && kernels_attn(hd)->scores_q8_0_q8;
        double e = test_rel_l2(one, q8q ? refq : ref, (size_t)nq * qd),
               eq = q8q ? test_rel_l2(one, ref, (size_t)nq * qd) : 0;
        *worst = e > *worst ? e : *worst;
        if (!(e < 1e-5) || !(eq < 2e-2)) {
            fprintf(stderr, "  %s %s hd %d G %d window %d: error %.3g vs float64%s\n", isa, quant_type_name(c->type),
                    hd, G, c->window, e, q8q ? " with the quantized query" : "");
            if (q8q) fprintf(stderr, "    %.3g vs float64 with the query itself (bound 2e-2)\n", eq);
            rc = -1;
        }
        if (q8q) {
            *worst_q8 = eq > *worst_q8 ? eq : *worst_q8;
            n_q8[0]++;
        }
        /* the last query's splits, each its own part, merged */
        int first, n_split = attn_split_range(1, T - 1, c->window, &first);
        size_t pf = attn_part_floats(p, 0, 1, scr);
        memset(pre, 0xff, qd * sizeof(float));
        for (int kh = 0; kh < c->n_head_kv; kh++) {
            for (int j = 0; j < n_split; j++)
                attn_tile_part(p, s, 0, kh, q + (size_t)(nq - 1) * qd, qd, 1, T - 1, scale, c->cap, c->window,
                               first + j, 1, part + (size_t)j * pf, scr);
            attn_tile_merge(p, 0, kh, 1, part, n_split, sk, pre, qd, scr);
        }
        if (memcmp(pre, one + (size_t)(nq - 1) * qd, qd * sizeof(float))) {
            fprintf(stderr, "  %s %s hd %d: %d merged splits differ from the whole call\n", isa,
                    quant_type_name(c->type), hd, n_split);
            rc = -1;
        }
    }
    kernels_use(-1);
    attn_scratch_free(scr);
    if (s) kv_seq_free(p, s);
    kv_pool_free(p);
    free(k), free(v), free(ks), free(vs), free(q), free(sinks), free(pre), free(one), free(part), free(ref);
    free(refq), free(qq);
    return rc;
}

/* ---- 5: the softmax's exp sums ------------------------------------------------- */

/* Every x86 variant's exp_sum gives attn_exp_sum_avx2's bits (the avx512
 * variants' 16-lane one keeps its 8-lane sum), elements and total, for
 * every length 1 .. 67 (whole 16s, a whole 8 left, a tail). */
static void test_exp_sum_bits(void) {
#if defined(__x86_64__) || defined(__i386__)
    int isas[LM_ISA_COUNT], n_isa = cpu_isas(isas), n = 0;
    float x[NKMAX], y0[NKMAX], y1[NKMAX];
    lm_rng g;
    lm_rng_seed(&g, 77);
    for (int i = 0; i < n_isa; i++) {
        if (isas[i] == LM_ISA_SCALAR) continue;
        CHECK(kernels_use(isas[i]) == 0);
        const lm_attn_kernels *a = kernels_attn(64);
        for (int len = 1; len <= NKMAX; len++) {
            for (int t = 0; t < len; t++) x[t] = (float)lm_rng_normal(&g) * 6.0f - 3.0f;
            float m = scalar_attn_max(x, len);
            memcpy(y0, x, sizeof x), memcpy(y1, x, sizeof x);
            float s0 = attn_exp_sum_avx2(y0, len, m), s1 = a->exp_sum(y1, len, m);
            CHECKF(!memcmp(&s0, &s1, sizeof s0) && !memcmp(y0, y1, (size_t)len * sizeof(float)),
                   "%s exp_sum n %d: %.9g against %.9g", kernels_isa_name(), len, (double)s1, (double)s0);
            n++;
        }
    }
    kernels_use(-1);
    printf("  %d exp sums over %d x86 variants: attn_exp_sum_avx2's bits\n", n, n_isa - 1);
#else
    printf("  skipped: no x86 variants on this architecture\n");
#endif
}

/* 5. The x86 entries' prefetch order (x86_shadow.h). shadow_seq: for F16
 * rows of hd in 32 .. 256 halves, line-aligned, slots 0 .. L n - 1 give
 * every line of every row once, in address order; rows that are not
 * whole lines, not a power of two of them, or not aligned give -1.
 * shadow_run: Q8_0 rows (272 bytes at head dim 256, 68 at 64) in blocks
 * of 16 laid end to end, two blocks apart: every line the rows touch
 * once, ascending within a block, then NULL. A hint never shows in a
 * result, so this is where a lost line would show. */
static void test_shadow_order(void) {
#if defined(__x86_64__) || defined(__i386__)
    static const int hds[] = {32, 64, 128, 256};
    static const int ns[] = {1, 4, 8, 64};
    char *buf = aligned_alloc(64, 64 * 512 * 2 + 4096);
    for (size_t h = 0; h < sizeof hds / sizeof hds[0]; h++)
        for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++) {
            int hd = hds[h], n = ns[in], L = hd / 32;
            const void *pf[64];
            for (int t = 0; t < n; t++) pf[t] = buf + (size_t)(n - 1 - t) * 2 * hd * 2; /* rows apart, any order */
            int sh = shadow_seq_shift(pf, n, hd);
            CHECK(sh >= 0 && 1 << sh == L);
            if (sh < 0) continue;
            int seen[64 * 8] = {0}, ok = 1;
            const char *last = NULL;
            for (size_t k = 0; k < (size_t)L * n; k++) {
                const char *p = shadow_seq_at(pf, k, sh);
                int t = (int)(k / L), line = (int)((p - (const char *)pf[t]) / 64);
                if (p < (const char *)pf[t] || line >= L || (p - (const char *)pf[t]) % 64) ok = 0;
                else seen[t * L + line]++;
                if (k % L && p != last + 64) ok = 0; /* within a row: the next line */
                last = p;
            }
            for (int i = 0; i < L * n; i++) ok &= seen[i] == 1;
            CHECK(ok);
        }
    const void *odd[2] = {buf, buf + 64};
    CHECK(shadow_seq_shift(odd, 2, 80) == -1); /* 160-byte rows */
    CHECK(shadow_seq_shift(odd, 2, 96) == -1); /* 3 lines */
    odd[1] = buf + 16;
    CHECK(shadow_seq_shift(odd, 2, 256) == -1); /* a row off a line boundary */
    for (int hd = 64; hd <= 256; hd *= 4) {
        size_t rb = (size_t)hd / QK8_0 * sizeof(block_q8_0), blk = 16 * rb;
        const void *q8rows[32];
        for (int t = 0; t < 32; t++) q8rows[t] = buf + (t < 16 ? 0 : blk + 1024) + (size_t)(t % 16) * rb;
        shadow_run r = shadow_run_of(q8rows, 32, rb);
        int lines = (int)(2 * ((blk + 63) / 64)), got = 0, ok = 1;
        static int hit[2 * 8192 / 64];
        memset(hit, 0, sizeof hit);
        const char *p, *prev = NULL;
        while ((p = shadow_run_at(&r)) && got <= 2 * lines) {
            size_t at = (size_t)(p - buf);
            int b = at >= blk + 1024, i = (int)((at - (b ? blk + 1024 : 0)) / 64);
            if (i < 0 || (size_t)i * 64 >= blk) ok = 0;
            else hit[b * 128 + i]++;
            if (prev && p <= prev && !(b && prev < buf + blk)) ok = 0; /* ascending, but for the jump to block 2 */
            prev = p, got++;
        }
        CHECK(got == lines);
        for (int b = 0; b < 2; b++)
            for (int i = 0; i < (int)((blk + 63) / 64); i++) ok &= hit[b * 128 + i] == 1;
        CHECK(ok);
        CHECK(shadow_run_at(&r) == NULL);
    }
    free(buf);
#endif
}

static void test_attn_fused_equals_converted(void) {
    static const attn_cfg cfgs[] = {
        {4, 1, 256, 600, LM_TYPE_F16, 0, 0, false},    /* Gemma 3 270M, a global layer: 3 splits */
        {4, 1, 256, 600, LM_TYPE_Q8_0, 200, 0, false}, /* its local layers, a window */
        {32, 4, 64, 300, LM_TYPE_Q8_0, 0, 0, false},   /* TinyLlama: 8 rows per query */
        {8, 2, 80, 300, LM_TYPE_F16, 0, 30.0f, true},  /* softcap and sinks, hd 80 */
        {8, 2, 128, 300, LM_TYPE_Q8_0, 100, 0, true},  /* sinks and a window */
        {8, 1, 80, 100, LM_TYPE_F16, 0, 0, false},     /* 8 rows per query: the fused bound */
    };
    int isas[LM_ISA_COUNT], n_isa = cpu_isas(isas);
    double worst = 0, worst_q8 = 0;
    int n_q8 = 0;
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++)
        CHECKF(!check_attn(&cfgs[i], isas, n_isa, &worst, &worst_q8, &n_q8), "cfg %zu", i);
    printf("  attention: worst relative L2 error %.3g over %d variants; %d Q8_0 runs by integer scores, %.3g from "
           "float64 on the unquantized query\n",
           worst, n_isa, n_q8, worst_q8);
}

int main(void) {
    kernels_init();
    TEST_RUN(test_kernels_every_variant);
    TEST_RUN(test_int_scores_every_variant);
    TEST_RUN(test_attn_fused_equals_converted);
    TEST_RUN(test_exp_sum_bits);
    TEST_RUN(test_shadow_order);
    return TEST_DONE();
}
