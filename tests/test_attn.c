/*
 * test_attn.c - the tiled paged attention kernel against a float64
 * reference: softmax(q·kᵀ·scale, causal)·v computed directly in double.
 *
 * Bounds (relative L2 error over all outputs of a call):
 *   against the reference on the values as STORED (after F16/Q8_0 rounding):
 *     < 1e-5 for every type and path (a path that scores Q8_0 keys by
 *     integer dot products, kernels.h's scores_q8_0_q8, stores the query
 *     too: the reference then reads the scaled query through Q8_0 and back);
 *   against the reference on the original float values:
 *     F32 < 1e-5, F16 < 2e-3, Q8_0 < 2e-2 (with integer scores, the
 *     query's own Q8_0 rounding included)
 *   (F16 keeps 11 significant bits, |rel| <= 2^-11 per element; Q8_0 rounds
 *   each value to within amax/254 of its block of 32).
 * Shapes cover MHA, GQA and MQA, head dims that do and do not take the SIMD
 * path, block sizes 1, 7, 16, 32 and one larger than the context, prefill in
 * one call, chunked prefill, decode steps, sliding windows, prefix-cache
 * hits and forks with copy-on-write. Because the kernel chunks keys by
 * logical position, its float32 result for a path must not depend on the
 * block size or on which physical blocks hold the data: those comparisons
 * are bit for bit. The two paths are the kernel table as CPUID fills it and
 * the table switched to the scalar kernels (kernels_use); LAMINA_NO_SIMD=1
 * must give the scalar path's bits (test_no_simd_env). Split-K: a call's
 * key splits spread over 1..8 units and merged give the whole call's bits
 * (test_split_k).
 */
#include <pthread.h>
#include <stdint.h>

#include "kv/attn.h"
#include "kernels/avx2.h"
#include "kernels/avx2_attn.h"
#include "kernels/kernels.h"
#include "kernels/scalar.h"
#include "kv/kv.h"
#include "format/quant.h"
#include "test.h"
#include "base/util.h"

typedef struct {
    int n_layer, n_head, n_head_kv, hd, T;
    float *k, *v;   /* (n_layer, T, n_head_kv * hd) original values */
    float *ks, *vs; /* same, as stored in the pool's type (dequantized) */
    float *q;       /* (n_layer, T, n_head * hd) */
    float *qh;      /* Q8_0: q times the scale through Q8_0 and back, as integer scores read it; else NULL */
    uint32_t type;
    bool q8q; /* the references read qh (scale 1) instead of q: ref_mode */
} data;

static void data_make(data *d, int n_layer, int n_head, int n_head_kv, int hd, int T, uint32_t type, uint64_t seed) {
    d->n_layer = n_layer, d->n_head = n_head, d->n_head_kv = n_head_kv, d->hd = hd, d->T = T;
    d->type = type, d->q8q = false, d->qh = NULL;
    size_t nkv = (size_t)n_layer * T * n_head_kv * hd, nq = (size_t)n_layer * T * n_head * hd;
    d->k = malloc(nkv * sizeof(float));
    d->v = malloc(nkv * sizeof(float));
    d->ks = malloc(nkv * sizeof(float));
    d->vs = malloc(nkv * sizeof(float));
    d->q = malloc(nq * sizeof(float));
    lm_rng r;
    lm_rng_seed(&r, seed);
    /* keys with a per-position offset make the softmax peaked and varied */
    for (size_t i = 0; i < nkv; i++) d->k[i] = lm_rng_normal(&r) * (1.0f + (float)(i % 7) * 0.3f);
    for (size_t i = 0; i < nkv; i++) d->v[i] = lm_rng_normal(&r);
    for (size_t i = 0; i < nq; i++) d->q[i] = lm_rng_normal(&r) * 1.5f;
    const lm_type_traits *tt = quant_traits(type);
    if (type == LM_TYPE_F32) {
        memcpy(d->ks, d->k, nkv * sizeof(float));
        memcpy(d->vs, d->v, nkv * sizeof(float));
    } else {
        /* round trip each head row through the type, as kv_store does */
        void *tmp = malloc((size_t)hd * 4);
        for (size_t i = 0; i < nkv; i += (size_t)hd) {
            tt->from_float(d->k + i, tmp, hd);
            tt->to_float(tmp, d->ks + i, hd);
            tt->from_float(d->v + i, tmp, hd);
            tt->to_float(tmp, d->vs + i, hd);
        }
        if (type == LM_TYPE_Q8_0) {
            float scale = 1.0f / sqrtf((float)hd); /* the callers' scale, applied as kv/attn.c does */
            d->qh = malloc(nq * sizeof(float));
            for (size_t i = 0; i < nq; i++) d->qh[i] = d->q[i] * scale;
            for (size_t i = 0; i < nq; i += (size_t)hd)
                tt->from_float(d->qh + i, tmp, hd), tt->to_float(tmp, d->qh + i, hd);
        }
        free(tmp);
    }
}

static void data_free(data *d) { free(d->k), free(d->v), free(d->ks), free(d->vs), free(d->q), free(d->qh); }

/* Point d's references at the query the table now scores with: qh where it
 * scores a Q8_0 cache by integer dot products, else q. Returns whether that
 * changed (the caller's reference must then be computed again). */
static bool ref_mode(data *d) {
    bool q8q = d->qh && kernels_attn(d->hd)->scores_q8_0_q8;
    bool changed = q8q != d->q8q;
    d->q8q = q8q;
    return changed;
}

/* Head h's query row at position t of layer as the references read it, and
 * the scale of its scores. */
static const float *qref(const data *d, int layer, int t, int h, double *scale) {
    *scale = d->q8q ? 1.0 : 1.0 / sqrt((double)d->hd);
    return (d->q8q ? d->qh : d->q) + ((size_t)layer * d->T + t) * d->n_head * d->hd + (size_t)h * d->hd;
}

static const float *qrow(const data *d, int layer, int t) {
    return d->q + ((size_t)layer * d->T + t) * d->n_head * d->hd;
}

/* out (n_q, n_head*hd) in double for queries pos0.. of `layer`, keys/values
 * from kk/vv (stored or original); window > 0 limits each query to its last
 * `window` positions; cap > 0 soft-caps each score (cap tanh(s / cap));
 * sinks, unless NULL, add e^sinks[h] to head h's softmax denominator. */
static void ref_attn_full(const data *d, const float *kk, const float *vv, int layer, int pos0, int n_q, int window,
                          double cap, const float *sinks, double *out) {
    int hd = d->hd, G = d->n_head / d->n_head_kv;
    size_t kvd = (size_t)d->n_head_kv * hd;
    double *w = malloc((size_t)(pos0 + n_q) * sizeof(double));
    for (int i = 0; i < n_q; i++) {
        int pos = pos0 + i, j0 = window > 0 && pos + 1 > window ? pos + 1 - window : 0;
        for (int h = 0; h < d->n_head; h++) {
            double scale;
            const float *q = qref(d, layer, pos, h, &scale);
            int kh = h / G;
            double mx = sinks ? (double)sinks[h] : -INFINITY, sum = 0;
            for (int j = j0; j <= pos; j++) {
                const float *k = kk + ((size_t)layer * d->T + j) * kvd + (size_t)kh * hd;
                double s = 0;
                for (int e = 0; e < hd; e++) s += (double)q[e] * k[e];
                w[j] = s * scale;
                if (cap > 0) w[j] = cap * tanh(w[j] / cap);
                if (w[j] > mx) mx = w[j];
            }
            for (int j = j0; j <= pos; j++) sum += w[j] = exp(w[j] - mx);
            if (sinks) sum += exp((double)sinks[h] - mx); /* the sink: a term with no value */
            double *o = out + (size_t)i * d->n_head * hd + (size_t)h * hd;
            for (int e = 0; e < hd; e++) o[e] = 0;
            for (int j = j0; j <= pos; j++) {
                const float *v = vv + ((size_t)layer * d->T + j) * kvd + (size_t)kh * hd;
                for (int e = 0; e < hd; e++) o[e] += w[j] / sum * v[e];
            }
        }
    }
    free(w);
}

static void ref_attn_w(const data *d, const float *kk, const float *vv, int layer, int pos0, int n_q, int window,
                       double *out) {
    ref_attn_full(d, kk, vv, layer, pos0, n_q, window, 0, NULL, out);
}

static void ref_attn(const data *d, const float *kk, const float *vv, int layer, int pos0, int n_q, double *out) {
    ref_attn_w(d, kk, vv, layer, pos0, n_q, 0, out);
}

static kv_pool *pool_for(const data *d, uint32_t type, int B, int64_t n_blocks) {
    kv_config c;
    kv_config_init(&c, d->n_layer, d->n_head_kv, d->hd);
    c.type = type;
    c.block_size = B;
    c.n_ctx = (int)(n_blocks * B);
    c.n_seqs = 1;
    char err[LM_ERRLEN];
    kv_pool *p = kv_pool_new(&c, err, sizeof err);
    if (!p) fprintf(stderr, "  kv_pool_new: %s\n", err);
    return p;
}

/* Append positions [from, to) to s and store their K/V in every layer. */
static int fill(kv_pool *p, kv_seq *s, const data *d, int from, int to) {
    char err[LM_ERRLEN];
    if (kv_append(p, s, to - from, err, sizeof err) != KV_OK) {
        fprintf(stderr, "  kv_append: %s\n", err);
        return -1;
    }
    size_t kvd = (size_t)d->n_head_kv * d->hd;
    for (int l = 0; l < d->n_layer; l++)
        kv_store_rows(p, s, l, from, to - from, d->k + ((size_t)l * d->T + from) * kvd, kvd,
                      d->v + ((size_t)l * d->T + from) * kvd, kvd);
    return 0;
}

/* Attention for queries pos0 .. pos0+n_q-1 of `layer`, every KV head, tiles of
 * ATTN_TILE_Q, as a caller would split it. out (n_q, n_head*hd). */
static void run_attn_w(const kv_pool *p, const kv_seq *s, const data *d, int layer, int pos0, int n_q, int window,
                       float *out, attn_scratch *scr) {
    size_t qd = (size_t)d->n_head * d->hd;
    float scale = 1.0f / sqrtf((float)d->hd);
    for (int i0 = 0; i0 < n_q; i0 += ATTN_TILE_Q) {
        int n = n_q - i0 < ATTN_TILE_Q ? n_q - i0 : ATTN_TILE_Q;
        for (int kh = 0; kh < d->n_head_kv; kh++)
            attn_tile(p, s, layer, kh, qrow(d, layer, pos0 + i0), qd, n, pos0 + i0, scale, window,
                      out + (size_t)i0 * qd, qd, scr);
    }
}

/* The same through attn_tile_sinks: softcap cap (0: none), sinks (NULL:
 * none); tile: query tokens per call. */
static void run_attn_sinks(const kv_pool *p, const kv_seq *s, const data *d, int layer, int pos0, int n_q, int window,
                           float cap, const float *sinks, int tile, float *out, attn_scratch *scr) {
    size_t qd = (size_t)d->n_head * d->hd;
    float scale = 1.0f / sqrtf((float)d->hd);
    for (int i0 = 0; i0 < n_q; i0 += tile) {
        int n = n_q - i0 < tile ? n_q - i0 : tile;
        for (int kh = 0; kh < d->n_head_kv; kh++)
            attn_tile_sinks(p, s, layer, kh, qrow(d, layer, pos0 + i0), qd, n, pos0 + i0, scale, cap, window, sinks,
                            out + (size_t)i0 * qd, qd, scr);
    }
}

static void run_attn(const kv_pool *p, const kv_seq *s, const data *d, int layer, int pos0, int n_q, float *out,
                     attn_scratch *scr) {
    run_attn_w(p, s, d, layer, pos0, n_q, 0, out, scr);
}

static double rel_err(const float *a, const double *ref, size_t n) { return test_rel_l2(a, ref, n); }

/* Path 0: the kernel table as CPUID and the environment fill it; path 1:
 * the scalar kernels. */
static void use_path(int path) { CHECK(kernels_use(path ? LM_ISA_SCALAR : -1) == 0); }

/* Checks one configuration end to end; returns 0 when every bound holds.
 * Runs prefill (whole), chunked prefill and decode on both kernel paths. */
static int check_config_w(int n_layer, int n_head, int n_head_kv, int hd, int T, uint32_t type, int B, int window,
                          double tol_orig, double *worst_stored, double *worst_orig) {
    data d;
    data_make(&d, n_layer, n_head, n_head_kv, hd, T, type, (uint64_t)(hd * 131 + B * 7 + (int)type));
    kv_pool *p = pool_for(&d, type, B, (T + B - 1) / B);
    if (!p) return -1;
    char err[LM_ERRLEN];
    kv_seq *s = kv_seq_new(p, err, sizeof err);
    int rc = 0;
    size_t qd = (size_t)n_head * hd;
    float *out = malloc((size_t)T * qd * sizeof(float));
    double *ref = malloc((size_t)T * qd * sizeof(double)), *ref_o = malloc((size_t)T * qd * sizeof(double));
    attn_scratch *scr = attn_scratch_new(p, n_head, err, sizeof err);
    /* positions in three appends (chunked prefill), checked after each */
    int cuts[4] = {0, T / 3, T - 5, T};
    for (int c = 0; c < 3 && !rc; c++) {
        if (fill(p, s, &d, cuts[c], cuts[c + 1])) {
            rc = -1;
            break;
        }
        int pos0 = c == 0 ? 0 : cuts[c], n_q = cuts[c + 1] - pos0;
        for (int layer = 0; layer < n_layer && !rc; layer++) {
            data d0 = d; /* the original values: the query itself */
            d0.q8q = false;
            ref_attn_w(&d0, d.k, d.v, layer, pos0, n_q, window, ref_o);
            for (int path = 0; path < 2; path++) {
                use_path(path);
                if (ref_mode(&d) || path == 0) ref_attn_w(&d, d.ks, d.vs, layer, pos0, n_q, window, ref);
                run_attn_w(p, s, &d, layer, pos0, n_q, window, out, scr);
                double e = rel_err(out, ref, (size_t)n_q * qd), eo = rel_err(out, ref_o, (size_t)n_q * qd);
                if (e > *worst_stored) *worst_stored = e;
                if (eo > *worst_orig) *worst_orig = eo;
                if (!(e < 1e-5) || !(eo < tol_orig)) {
                    fprintf(stderr,
                            "  %s B=%d hd=%d heads %d/%d window %d layer %d pos0 %d n_q %d %s: err %.3g (orig %.3g)\n",
                            quant_type_name(type), B, hd, n_head, n_head_kv, window, layer, pos0, n_q,
                            path ? "scalar" : "simd", e, eo);
                    rc = -1;
                }
            }
        }
    }
    /* decode: each of the last few positions alone */
    for (int pos = T - 4; pos < T && !rc; pos++) {
        for (int path = 0; path < 2; path++) {
            use_path(path);
            if (ref_mode(&d) || path == 0) ref_attn_w(&d, d.ks, d.vs, n_layer - 1, pos, 1, window, ref);
            run_attn_w(p, s, &d, n_layer - 1, pos, 1, window, out, scr);
            double e = rel_err(out, ref, qd);
            if (e > *worst_stored) *worst_stored = e;
            if (!(e < 1e-5)) {
                fprintf(stderr, "  decode %s B=%d window %d pos %d: err %.3g\n", quant_type_name(type), B, window, pos,
                        e);
                rc = -1;
            }
        }
    }
    use_path(0);
    attn_scratch_free(scr);
    kv_seq_free(p, s);
    kv_pool_free(p);
    free(out), free(ref), free(ref_o);
    data_free(&d);
    return rc;
}

static int check_config(int n_layer, int n_head, int n_head_kv, int hd, int T, uint32_t type, int B, double tol_orig,
                        double *worst_stored, double *worst_orig) {
    return check_config_w(n_layer, n_head, n_head_kv, hd, T, type, B, 0, tol_orig, worst_stored, worst_orig);
}

static void test_f32_every_block_size(void) {
    static const int bs[] = {1, 7, 16, 32, 256};
    double ws = 0, wo = 0;
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++) {
        CHECKF(!check_config(2, 8, 2, 64, 150, LM_TYPE_F32, bs[i], 1e-5, &ws, &wo), "block %d", bs[i]);
    }
    printf("NOTE F32 worst relative error %.2e\n", ws);
}

static void test_f16_and_q8_0(void) {
    static const int bs[] = {1, 7, 16, 32};
    double ws16 = 0, wo16 = 0, ws8 = 0, wo8 = 0;
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++) {
        CHECKF(!check_config(2, 8, 2, 64, 130, LM_TYPE_F16, bs[i], 2e-3, &ws16, &wo16), "F16 block %d", bs[i]);
        CHECKF(!check_config(2, 8, 2, 64, 130, LM_TYPE_Q8_0, bs[i], 2e-2, &ws8, &wo8), "Q8_0 block %d", bs[i]);
    }
    printf("NOTE F16 worst error %.2e vs stored, %.2e vs original; Q8_0 %.2e vs stored, %.2e vs original\n", ws16, wo16,
           ws8, wo8);
}

static void test_head_shapes(void) {
    double ws = 0, wo = 0;
    /* MHA, MQA, a head dim the SIMD path does not take (12), a large group */
    CHECK(!check_config(1, 4, 4, 32, 90, LM_TYPE_F32, 16, 1e-5, &ws, &wo));
    CHECK(!check_config(1, 6, 1, 64, 90, LM_TYPE_F16, 7, 2e-3, &ws, &wo));
    CHECK(!check_config(1, 4, 2, 12, 90, LM_TYPE_F32, 5, 1e-5, &ws, &wo));
    CHECK(!check_config(1, 3, 3, 8, 70, LM_TYPE_F16, 1, 2e-3, &ws, &wo));
    CHECK(!check_config(1, 128, 2, 32, 80, LM_TYPE_Q8_0, 16, 2e-2, &ws, &wo));
    CHECK(!check_config(1, 16, 2, 128, 100, LM_TYPE_F32, 32, 1e-5, &ws, &wo));
}

/* Sliding windows (gemma3 local layers): a query sees its last `window`
 * positions; windows shorter than a block, than a chunk, and longer. */
static void test_sliding_window(void) {
    static const int win[] = {1, 5, 40, 100, 1000};
    static const int bs[] = {1, 7, 16};
    double ws = 0, wo = 0;
    for (size_t wi = 0; wi < sizeof win / sizeof win[0]; wi++)
        for (size_t bi = 0; bi < sizeof bs / sizeof bs[0]; bi++) {
            CHECKF(!check_config_w(1, 8, 2, 64, 170, LM_TYPE_F32, bs[bi], win[wi], 1e-5, &ws, &wo), "window %d",
                   win[wi]);
            CHECKF(!check_config_w(1, 4, 1, 32, 150, LM_TYPE_Q8_0, bs[bi], win[wi], 2e-2, &ws, &wo), "window %d",
                   win[wi]);
        }
}

/* Same data, same kernel path: block size 1, 7, 16 and one block holding the
 * whole context (contiguous storage), and physical blocks scattered in the
 * pool, must give identical bits. */
static void test_paging_is_bit_exact(void) {
    data d;
    data_make(&d, 1, 8, 2, 64, 200, LM_TYPE_F32, 99);
    size_t qd = 8 * 64;
    float *want = malloc(200 * qd * sizeof(float)), *got = malloc(200 * qd * sizeof(float));
    static const int bs[] = {200, 1, 7, 16};
    char err[LM_ERRLEN];
    int ok = 1;
    for (int path = 0; path < 2 && ok; path++) {
        for (size_t i = 0; i < sizeof bs / sizeof bs[0] && ok; i++) {
            /* twice the blocks needed; a decoy sequence interleaves with ours */
            kv_pool *p = pool_for(&d, LM_TYPE_F32, bs[i], 2 * ((200 + bs[i] - 1) / bs[i]) + 2);
            kv_seq *decoy = kv_seq_new(p, err, sizeof err), *s = kv_seq_new(p, err, sizeof err);
            for (int t = 0; t < 200; t += bs[i]) {
                int n = 200 - t < bs[i] ? 200 - t : bs[i];
                kv_append(p, decoy, 1, err, sizeof err);
                if (fill(p, s, &d, t, t + n)) ok = 0;
            }
            kv_seq_free(p, decoy);
            attn_scratch *scr = attn_scratch_new(p, 8, err, sizeof err);
            use_path(path);
            run_attn(p, s, &d, 0, 0, 200, i == 0 ? want : got, scr);
            if (i > 0 && memcmp(want, got, 200 * qd * sizeof(float))) {
                fprintf(stderr, "  block %d (%s) differs from contiguous\n", bs[i], path ? "scalar" : "simd");
                ok = 0;
            }
            attn_scratch_free(scr);
            kv_seq_free(p, s);
            kv_pool_free(p);
        }
    }
    use_path(0);
    free(want), free(got);
    data_free(&d);
    CHECK(ok);
}

/* A sequence whose prompt starts with cached blocks computes only the rest,
 * and its attention equals a cold fill of the whole prompt, bit for bit. */
static void test_prefix_hit_equals_cold(void) {
    static const int bs[] = {1, 7, 16, 32};
    for (size_t bi = 0; bi < sizeof bs / sizeof bs[0]; bi++) {
        int B = bs[bi], T = 120;
        data d;
        data_make(&d, 2, 8, 2, 64, T, LM_TYPE_F16, 5 + bi);
        int32_t *tok = malloc((size_t)T * sizeof *tok);
        for (int i = 0; i < T; i++) tok[i] = 1000 + i * 3;
        kv_pool *p = pool_for(&d, LM_TYPE_F16, B, 3 * ((T + B - 1) / B));
        char err[LM_ERRLEN];
        size_t qd = 8 * 64;
        float *cold = malloc((size_t)T * qd * sizeof(float)), *warm = malloc((size_t)T * qd * sizeof(float));
        double *ref = malloc((size_t)T * qd * sizeof(double));
        attn_scratch *scr = attn_scratch_new(p, 8, err, sizeof err);
        /* cold: the first request computes everything and commits its blocks */
        kv_seq *a = kv_seq_new(p, err, sizeof err);
        CHECK(kv_prefix_match(p, a, tok, T, 7) == 0);
        CHECK(!fill(p, a, &d, 0, T));
        kv_prefix_commit(p, a, tok, T, 7);
        run_attn(p, a, &d, 1, 0, T, cold, scr);
        kv_seq_free(p, a); /* its blocks stay cached */
        /* warm: same prompt, the cache supplies all full blocks but the last token's */
        kv_seq *b = kv_seq_new(p, err, sizeof err);
        int hit = kv_prefix_match(p, b, tok, T, 7);
        CHECKF(hit == (T - 1) / B * B, "block %d: hit %d", B, hit);
        CHECK(kv_seq_len(b) == hit);
        CHECK(!fill(p, b, &d, hit, T));
        run_attn(p, b, &d, 1, 0, T, warm, scr);
        CHECKF(!memcmp(cold, warm, (size_t)T * qd * sizeof(float)), "block %d", B);
        /* the queries of the computed part alone (what the caller runs) */
        run_attn(p, b, &d, 1, hit, T - hit, warm, scr);
        ref_attn(&d, d.ks, d.vs, 1, hit, T - hit, ref);
        CHECK(rel_err(warm, ref, (size_t)(T - hit) * qd) < 1e-5);
        kv_seq_free(p, b);
        CHECK(!kv_pool_check(p, err, sizeof err));
        attn_scratch_free(scr);
        kv_pool_free(p);
        free(cold), free(warm), free(ref), free(tok);
        data_free(&d);
    }
}

/* Fork at a partial block, then write different tokens into each branch:
 * each branch's attention matches the reference on its own history. */
static void test_fork_cow_branches(void) {
    static const int bs[] = {1, 7, 16, 32};
    for (size_t bi = 0; bi < sizeof bs / sizeof bs[0]; bi++) {
        int B = bs[bi], T0 = 20, T1 = 60; /* shared 0..19, branches 20..59 */
        data base, x, y;
        data_make(&base, 1, 4, 2, 32, T1, LM_TYPE_F32, 1);
        data_make(&x, 1, 4, 2, 32, T1, LM_TYPE_F32, 2);
        data_make(&y, 1, 4, 2, 32, T1, LM_TYPE_F32, 3);
        /* branch histories: base's first T0 positions, then their own */
        size_t kvd = 2 * 32;
        memcpy(x.k, base.k, (size_t)T0 * kvd * sizeof(float));
        memcpy(x.v, base.v, (size_t)T0 * kvd * sizeof(float));
        memcpy(y.k, base.k, (size_t)T0 * kvd * sizeof(float));
        memcpy(y.v, base.v, (size_t)T0 * kvd * sizeof(float));
        memcpy(x.ks, x.k, (size_t)T1 * kvd * sizeof(float));
        memcpy(x.vs, x.v, (size_t)T1 * kvd * sizeof(float));
        memcpy(y.ks, y.k, (size_t)T1 * kvd * sizeof(float));
        memcpy(y.vs, y.v, (size_t)T1 * kvd * sizeof(float));
        kv_pool *p = pool_for(&base, LM_TYPE_F32, B, 2 * ((T1 + B - 1) / B) + 1);
        char err[LM_ERRLEN];
        kv_seq *a = kv_seq_new(p, err, sizeof err);
        CHECK(!fill(p, a, &base, 0, T0));
        kv_seq *b = kv_fork(p, a, err, sizeof err);
        CHECK(b && kv_seq_len(b) == T0);
        CHECK(kv_block_refcount(p, kv_seq_blocks(a)[0]) == 2);
        /* alternate single-token appends so both branches write right after the fork */
        for (int t = T0; t < T1; t++) {
            CHECK(!fill(p, a, &x, t, t + 1));
            CHECK(!fill(p, b, &y, t, t + 1));
        }
        kv_stats st;
        kv_stats_get(p, &st);
        CHECKF(st.n_cow == (T0 % B ? 1u : 0u), "block %d: %llu copies", B, (unsigned long long)st.n_cow);
        CHECK(kv_block_refcount(p, kv_seq_blocks(a)[0]) == (T0 >= B ? 2 : 1));
        attn_scratch *scr = attn_scratch_new(p, 4, err, sizeof err);
        size_t qd = 4 * 32;
        float *out = malloc((size_t)T1 * qd * sizeof(float));
        double *ref = malloc((size_t)T1 * qd * sizeof(double));
        /* the query vectors are the branch's own; keys and values its own history */
        run_attn(p, a, &x, 0, 0, T1, out, scr);
        ref_attn(&x, x.ks, x.vs, 0, 0, T1, ref);
        CHECKF(rel_err(out, ref, (size_t)T1 * qd) < 1e-5, "branch a, block %d", B);
        run_attn(p, b, &y, 0, 0, T1, out, scr);
        ref_attn(&y, y.ks, y.vs, 0, 0, T1, ref);
        CHECKF(rel_err(out, ref, (size_t)T1 * qd) < 1e-5, "branch b, block %d", B);
        kv_seq_free(p, a);
        kv_seq_free(p, b);
        kv_stats_get(p, &st);
        CHECK(st.n_used == 0 && st.n_free == st.n_blocks);
        CHECK(!kv_pool_check(p, err, sizeof err));
        attn_scratch_free(scr);
        kv_pool_free(p);
        free(out), free(ref);
        data_free(&base), data_free(&x), data_free(&y);
    }
}

/* Work items (query tile, kv head) on several threads, one scratch each,
 * give the same bits as one thread. */
typedef struct {
    const kv_pool *p;
    const kv_seq *s;
    const data *d;
    float *out;
    int n_items, n_tiles, nth, ith;
    attn_scratch *scr;
} thr_job;

static void *thr_main(void *arg) {
    thr_job *j = arg;
    size_t qd = (size_t)j->d->n_head * j->d->hd;
    for (int it = j->ith; it < j->n_items; it += j->nth) {
        int tile = it / j->d->n_head_kv, kh = it % j->d->n_head_kv;
        int i0 = tile * ATTN_TILE_Q, n = j->d->T - i0 < ATTN_TILE_Q ? j->d->T - i0 : ATTN_TILE_Q;
        attn_tile(j->p, j->s, 0, kh, qrow(j->d, 0, i0), qd, n, i0, 1.0f / sqrtf((float)j->d->hd), 0,
                  j->out + (size_t)i0 * qd, qd, j->scr);
    }
    return NULL;
}

static void test_threads_split_items(void) {
    data d;
    data_make(&d, 1, 8, 4, 64, 130, LM_TYPE_F16, 17);
    kv_pool *p = pool_for(&d, LM_TYPE_F16, 16, 9);
    char err[LM_ERRLEN];
    kv_seq *s = kv_seq_new(p, err, sizeof err);
    CHECK(!fill(p, s, &d, 0, 130));
    size_t qd = 8 * 64;
    float *one = malloc(130 * qd * sizeof(float)), *many = malloc(130 * qd * sizeof(float));
    attn_scratch *scr[3];
    for (int i = 0; i < 3; i++) scr[i] = attn_scratch_new(p, 8, err, sizeof err);
    run_attn(p, s, &d, 0, 0, 130, one, scr[0]);
    int n_tiles = (130 + ATTN_TILE_Q - 1) / ATTN_TILE_Q;
    thr_job jobs[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        jobs[i] = (thr_job){p, s, &d, many, n_tiles * 4, n_tiles, 3, i, scr[i]};
        pthread_create(&th[i], NULL, thr_main, &jobs[i]);
    }
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    CHECK(!memcmp(one, many, 130 * qd * sizeof(float)));
    for (int i = 0; i < 3; i++) attn_scratch_free(scr[i]);
    kv_seq_free(p, s);
    kv_pool_free(p);
    free(one), free(many);
    data_free(&d);
}

/* LAMINA_NO_SIMD=1 reaches attention: with the table filled under it, the
 * attention loops and the KV conversions are the scalar references, and
 * attention's output equals the scalar path's bit for bit; where the CPU
 * has a SIMD path its output differs from those bits (so the comparison can
 * tell the paths apart). F16 KV and head dim 64: the SIMD loops and the
 * SIMD conversion would both apply. */
static void test_no_simd_env(void) {
    data d;
    data_make(&d, 1, 8, 2, 64, 150, LM_TYPE_F16, 31);
    kv_pool *p = pool_for(&d, LM_TYPE_F16, 16, 10);
    char err[LM_ERRLEN];
    kv_seq *s = kv_seq_new(p, err, sizeof err);
    CHECK(!fill(p, s, &d, 0, 150));
    attn_scratch *scr = attn_scratch_new(p, 8, err, sizeof err);
    size_t n = 150 * (size_t)8 * 64;
    float *want = malloc(n * sizeof(float)), *best = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));

    CHECK(kernels_use(LM_ISA_SCALAR) == 0);
    run_attn(p, s, &d, 0, 0, 150, want, scr);
    CHECK(kernels_use(kernels_cpu_isa()) == 0);
    run_attn(p, s, &d, 0, 0, 150, best, scr);

    const char *old = getenv("LAMINA_NO_SIMD");
    char saved[64] = "";
    if (old) snprintf(saved, sizeof saved, "%s", old);
    setenv("LAMINA_NO_SIMD", "1", 1);
    CHECK(kernels_use(-1) == 0);
    CHECK(!strcmp(kernels_isa_name(), "scalar"));
    const lm_attn_kernels *a = kernels_attn(64);
    CHECK(a->scores == scalar_attn_scores && a->pv == scalar_attn_pv && a->max == scalar_attn_max &&
          a->scale == scalar_attn_scale && a->exp_sum == scalar_attn_exp_sum);
    for (uint32_t t = LM_TYPE_F32; t <= LM_TYPE_Q8_0; t++) {
        if (t != LM_TYPE_F32 && t != LM_TYPE_F16 && t != LM_TYPE_Q8_0) continue;
        CHECKF(kernels_type(t)->to_float == quant_traits(t)->to_float &&
                   kernels_type(t)->from_float == quant_traits(t)->from_float,
               "%s", quant_type_name(t));
    }
    run_attn(p, s, &d, 0, 0, 150, got, scr);
    CHECK(!memcmp(got, want, n * sizeof(float)));
    if (kernels_cpu_isa() != LM_ISA_SCALAR) CHECK(memcmp(best, want, n * sizeof(float)));

    if (old) setenv("LAMINA_NO_SIMD", saved, 1);
    else unsetenv("LAMINA_NO_SIMD");
    CHECK(kernels_use(-1) == 0);
    free(want), free(best), free(got);
    attn_scratch_free(scr);
    kv_seq_free(p, s);
    kv_pool_free(p);
    data_free(&d);
}

static void test_scratch_is_bounded(void) {
    data d;
    data_make(&d, 1, 32, 8, 128, 4, LM_TYPE_F16, 1);
    kv_pool *p = pool_for(&d, LM_TYPE_F16, 16, 1);
    char err[LM_ERRLEN];
    attn_scratch *scr = attn_scratch_new(p, 32, err, sizeof err);
    CHECK(scr);
    /* independent of context: rows x (2 hd + chunk) + 2 chunk x hd floats */
    size_t b = attn_scratch_bytes(scr);
    printf("NOTE scratch %zu bytes for 32 heads / 8 KV heads / head dim 128 (%d rows per sub-tile)\n", b,
           attn_tile_rows(scr));
    CHECK(b < 256 * 1024);
    CHECK(!attn_scratch_new(p, 30, err, sizeof err));
    CHECK(strstr(err, "multiple"));
    attn_scratch_free(scr);
    kv_pool_free(p);
    data_free(&d);
}

/* ---- attention sinks ------------------------------------------------------------ */

/* The ISAs this CPU runs, the scalar reference first: attention's sinks live
 * in kv/attn.c's recurrence, whose inner loops are each variant's. */
static int cpu_isas(int *isas) {
    int n = 0;
    for (int isa = 0; isa < LM_ISA_COUNT; isa++)
        if (isa == LM_ISA_SCALAR || kernels_cpu_has((lm_isa)isa)) isas[n++] = isa;
    return n;
}

/* A pool holding all T positions of d in every layer, with a sequence. */
typedef struct {
    kv_pool *p;
    kv_seq *s;
    attn_scratch *scr;
} filled;

static int filled_make(filled *f, const data *d, uint32_t type, int B) {
    char err[LM_ERRLEN];
    f->p = pool_for(d, type, B, (d->T + B - 1) / B);
    f->s = f->p ? kv_seq_new(f->p, err, sizeof err) : NULL;
    f->scr = f->p ? attn_scratch_new(f->p, d->n_head, err, sizeof err) : NULL;
    return f->s && f->scr && !fill(f->p, f->s, d, 0, d->T) ? 0 : -1;
}

static void filled_free(filled *f) {
    attn_scratch_free(f->scr);
    if (f->s) kv_seq_free(f->p, f->s);
    kv_pool_free(f->p);
}

/* ---- split-K ------------------------------------------------------------------- */

/* Split-K: the splits of a call spread over U = 1..8 units (unit j runs
 * splits n*j/U .. n*(j+1)/U-1 with attn_tile_part, alternating between two
 * scratches as threads would), then attn_tile_merge: the output must be
 * attn_tile_sinks's bits (memcmp) for every U, and within 1e-5 (relative
 * L2) of the float64 reference on the stored values. T = 2000 gives a decode row 8 splits of 256; runs:
 * the decode step on every variant, a 9-row verification pass (two
 * sub-tiles when the group is 8) on the fastest. Shapes: Gemma 3 270M's (4 heads, 1 KV
 * head, head dim 256) with an F16 cache and, windowed, Q8_0; TinyLlama's
 * (32/4, 64) on Q8_0; sinks with softcap; sinks with a window; a head dim
 * no SIMD loop takes. */
typedef struct {
    int n_head, n_head_kv, hd;
    uint32_t type;
    int B, window;
    float cap;
    bool sinks;
} split_cfg;

static int check_split(const split_cfg *c, int T, const int *isas, int n_isa, double *worst) {
    data d;
    data_make(&d, 1, c->n_head, c->n_head_kv, c->hd, T, c->type, (uint64_t)(T + c->hd * 7 + c->window));
    filled f;
    int rc = filled_make(&f, &d, c->type, c->B);
    char err[LM_ERRLEN];
    attn_scratch *scr2 = f.p ? attn_scratch_new(f.p, d.n_head, err, sizeof err) : NULL;
    if (!scr2) rc = -1;
    size_t qd = (size_t)c->n_head * c->hd;
    int G = c->n_head / c->n_head_kv;
    float *sinks = malloc((size_t)c->n_head * sizeof(float)), *want = malloc(20 * qd * sizeof(float));
    float *got = malloc(20 * qd * sizeof(float));
    float *part = malloc(8 * 20 * (size_t)G * (size_t)(c->hd + 2) * sizeof(float));
    double *ref = malloc(20 * qd * sizeof(double));
    for (int h = 0; h < c->n_head; h++) sinks[h] = h == 0 ? 6.0f : -1.0f + 0.5f * (float)h;
    const float *sk = c->sinks ? sinks : NULL;
    float scale = 1.0f / sqrtf((float)c->hd);
    static const int nqs[] = {1, 9};
    for (size_t k = 0; k < sizeof nqs / sizeof nqs[0] && !rc; k++) {
        int n_q = nqs[k], pos0 = T - n_q, first, n_split = attn_split_range(n_q, pos0, c->window, &first);
        ref_attn_full(&d, d.ks, d.vs, 0, pos0, n_q, c->window, c->cap, sk, ref);
        /* 9 rows on the fastest variant only (the test's time) */
        for (int i = n_q > 1 ? n_isa - 1 : 0; i < n_isa && !rc; i++) {
            if (kernels_use(isas[i])) {
                rc = -1;
                break;
            }
            if (ref_mode(&d)) ref_attn_full(&d, d.ks, d.vs, 0, pos0, n_q, c->window, c->cap, sk, ref);
            run_attn_sinks(f.p, f.s, &d, 0, pos0, n_q, c->window, c->cap, sk, n_q, want, f.scr);
            double e = rel_err(want, ref, (size_t)n_q * qd);
            *worst = e > *worst ? e : *worst;
            if (!(e < 1e-5)) {
                fprintf(stderr, "  split %s hd %d window %d n_q %d %s: err %.3g vs float64\n", quant_type_name(c->type),
                        c->hd, c->window, n_q, kernels_isa_str((lm_isa)isas[i]), e);
                rc = -1;
            }
            size_t pf = attn_part_floats(f.p, 0, n_q, f.scr);
            for (int U = 1; U <= 8 && U <= n_split && !rc; U++) {
                memset(got, 0xff, (size_t)n_q * qd * sizeof(float)); /* NaNs: every output must be written */
                for (int kh = 0; kh < c->n_head_kv; kh++) {
                    for (int j = 0; j < U; j++) {
                        int s0 = n_split * j / U, s1 = n_split * (j + 1) / U;
                        attn_tile_part(f.p, f.s, 0, kh, qrow(&d, 0, pos0), qd, n_q, pos0, scale, c->cap, c->window,
                                       first + s0, s1 - s0, part + (size_t)s0 * pf, j % 2 ? scr2 : f.scr);
                    }
                    attn_tile_merge(f.p, 0, kh, n_q, part, n_split, sk, got, qd, U % 2 ? scr2 : f.scr);
                }
                if (memcmp(want, got, (size_t)n_q * qd * sizeof(float))) {
                    fprintf(stderr, "  split %s hd %d window %d n_q %d %s: %d units of %d splits differ\n",
                            quant_type_name(c->type), c->hd, c->window, n_q, kernels_isa_str((lm_isa)isas[i]), U,
                            n_split);
                    rc = -1;
                }
            }
        }
    }
    kernels_use(-1);
    attn_scratch_free(scr2);
    filled_free(&f);
    free(sinks), free(want), free(got), free(part), free(ref);
    data_free(&d);
    return rc;
}

static void test_split_k(void) {
    static const split_cfg cfgs[] = {
        {4, 1, 256, LM_TYPE_F16, 16, 0, 0, false},    /* Gemma 3 270M, a global layer */
        {4, 1, 256, LM_TYPE_Q8_0, 16, 512, 0, false}, /* its local layers' window */
        {32, 4, 64, LM_TYPE_Q8_0, 16, 0, 0, false},   /* TinyLlama */
        {8, 2, 64, LM_TYPE_F32, 7, 0, 30.0f, true},   /* sinks and softcap */
        {8, 2, 64, LM_TYPE_F16, 16, 300, 0, true},    /* sinks and a window */
        {4, 2, 12, LM_TYPE_F32, 5, 0, 0, true},       /* a head dim no SIMD loop takes */
    };
    int isas[LM_ISA_COUNT], n_isa = cpu_isas(isas), first;
    /* the grid: a decode row at 2000 spans 8 splits, one inside the first split 1 */
    CHECK(attn_split_range(1, 1999, 0, &first) == 8 && first == 0);
    CHECK(attn_split_range(1, 100, 0, &first) == 1 && first == 0);
    CHECK(attn_split_range(1, 1999, 512, &first) == 3 && first == 5);
    double worst = 0;
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++)
        CHECKF(!check_split(&cfgs[ci], 2000, isas, n_isa, &worst), "config %zu", ci);
    printf("NOTE split-K: worst relative error %.2e against float64, every split count bit-identical\n", worst);
}

/* Sinks of every size against the float64 reference on the stored values
 * (bound 1e-5, as without sinks): MHA, GQA, MQA, a group of 64 (one query
 * per sub-tile), head dims that take the SIMD loops and one that does not,
 * windows, softcap, lengths on both sides of the 32-query tile and the
 * 64-key chunk; prefill in one call, a chunk at depth and the last decode
 * step, on every variant the CPU runs. Head h's sink: a normal draw times 3,
 * except head 0's at +12 (comparable to the largest scores) and head 1's at
 * -30 (all but absent). */
typedef struct {
    int n_head, n_head_kv, hd;
    uint32_t type;
    int B, window;
    float cap;
} sink_cfg;

static int check_sinks(const sink_cfg *c, int T, const int *isas, int n_isa, double *worst) {
    data d;
    data_make(&d, 1, c->n_head, c->n_head_kv, c->hd, T, c->type, (uint64_t)(T * 31 + c->hd + c->n_head));
    filled f;
    int rc = filled_make(&f, &d, c->type, c->B);
    size_t qd = (size_t)c->n_head * c->hd;
    float *sinks = malloc((size_t)c->n_head * sizeof(float)), *out = malloc((size_t)T * qd * sizeof(float));
    double *ref = malloc((size_t)T * qd * sizeof(double));
    lm_rng r;
    lm_rng_seed(&r, (uint64_t)T);
    for (int h = 0; h < c->n_head; h++) sinks[h] = h == 0 ? 12.0f : h == 1 ? -30.0f : 3.0f * lm_rng_normal(&r);
    /* (pos0, n_q): the whole prefill, a chunk at depth, the last decode step */
    int runs[3][2] = {{0, T}, {T / 2, T - T / 2}, {T - 1, 1}};
    for (int k = 0; k < 3 && !rc; k++) {
        int pos0 = runs[k][0], n_q = runs[k][1];
        if (n_q <= 0) continue;
        ref_attn_full(&d, d.ks, d.vs, 0, pos0, n_q, c->window, c->cap, sinks, ref);
        for (int i = 0; i < n_isa && !rc; i++) {
            if (kernels_use(isas[i])) {
                rc = -1;
                break;
            }
            if (ref_mode(&d)) ref_attn_full(&d, d.ks, d.vs, 0, pos0, n_q, c->window, c->cap, sinks, ref);
            run_attn_sinks(f.p, f.s, &d, 0, pos0, n_q, c->window, c->cap, sinks, ATTN_TILE_Q, out, f.scr);
            double e = rel_err(out, ref, (size_t)n_q * qd);
            if (e > *worst) *worst = e;
            if (!(e < 1e-5)) {
                fprintf(stderr, "  sinks %s heads %d/%d hd %d B %d window %d cap %g T %d pos0 %d n_q %d %s: err %.3g\n",
                        quant_type_name(c->type), c->n_head, c->n_head_kv, c->hd, c->B, c->window, (double)c->cap, T,
                        pos0, n_q, kernels_isa_str((lm_isa)isas[i]), e);
                rc = -1;
            }
        }
    }
    kernels_use(-1);
    filled_free(&f);
    free(sinks), free(out), free(ref);
    data_free(&d);
    return rc;
}

static void test_sinks_reference(void) {
    static const sink_cfg cfgs[] = {
        {4, 4, 32, LM_TYPE_F32, 16, 0, 0},    /* MHA */
        {8, 2, 64, LM_TYPE_F32, 7, 0, 0},     /* GQA */
        {6, 1, 64, LM_TYPE_F16, 16, 0, 0},    /* MQA */
        {4, 2, 12, LM_TYPE_F32, 5, 0, 0},     /* a head dim no SIMD loop takes */
        {64, 1, 32, LM_TYPE_Q8_0, 16, 0, 0},  /* a group of 64: one query per sub-tile */
        {16, 2, 128, LM_TYPE_F32, 32, 0, 0},  /* 8 queries per sub-tile, head dim 128 */
        {8, 2, 64, LM_TYPE_F32, 16, 40, 0},   /* a window shorter than a chunk */
        {8, 2, 64, LM_TYPE_Q8_0, 1, 5, 0},    /* a window shorter than a block of 7 */
        {8, 2, 64, LM_TYPE_F32, 16, 0, 4.0f}, /* softcap below the largest scores */
        {8, 4, 64, LM_TYPE_F16, 7, 70, 8.0f}, /* softcap and a window */
    };
    static const int Ts[] = {1, 2, 31, 33, 63, 64, 65, 129, 200};
    /* under emulation (LAMINA_EMULATED, `make test-arm`) without 200, more
     * than half the time: 129 is already past two chunks with a tail of 1 */
    size_t n_T = sizeof Ts / sizeof Ts[0] - (getenv("LAMINA_EMULATED") ? 1 : 0);
    int isas[LM_ISA_COUNT], n_isa = cpu_isas(isas);
    double worst = 0;
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++)
        for (size_t ti = 0; ti < n_T; ti++)
            CHECKF(!check_sinks(&cfgs[ci], Ts[ti], isas, n_isa, &worst), "config %zu, T %d", ci, Ts[ti]);
    printf("NOTE sinks: worst relative error %.2e over %d variants\n", worst, n_isa);
}

/* No sinks is today's computation bit for bit: attn_tile and
 * attn_tile_softcap (the entries that existed before sinks) equal
 * attn_tile_sinks with NULL, and so do sinks of -inf and of -1e4 on every
 * head (e^(sink - m) rounds to 0 at the first rescaling, which then clears
 * l = 1 as it clears l = 0 without a sink). Each variant, windows, softcap,
 * GQA; and the outputs with a real sink differ (the comparison can fail). */
static void test_sinks_none_is_identical(void) {
    static const sink_cfg cfgs[] = {
        {8, 2, 64, LM_TYPE_F32, 7, 0, 0},
        {8, 2, 64, LM_TYPE_F16, 16, 0, 30.0f},
        {4, 1, 32, LM_TYPE_Q8_0, 16, 40, 0},
        {4, 2, 12, LM_TYPE_F32, 5, 9, 5.0f},
    };
    int isas[LM_ISA_COUNT], n_isa = cpu_isas(isas), T = 150;
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
        const sink_cfg *c = &cfgs[ci];
        data d;
        data_make(&d, 1, c->n_head, c->n_head_kv, c->hd, T, c->type, 40 + ci);
        filled f;
        CHECK(!filled_make(&f, &d, c->type, c->B));
        size_t n = (size_t)T * c->n_head * c->hd, qd = (size_t)c->n_head * c->hd;
        float *old = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
        float *sinks = malloc((size_t)c->n_head * sizeof(float));
        float scale = 1.0f / sqrtf((float)c->hd);
        int bad = 0;
        for (int i = 0; i < n_isa && !bad; i++) {
            CHECK(!kernels_use(isas[i]));
            for (int i0 = 0; i0 < T; i0 += ATTN_TILE_Q) {
                int nq = T - i0 < ATTN_TILE_Q ? T - i0 : ATTN_TILE_Q;
                for (int kh = 0; kh < c->n_head_kv; kh++) {
                    if (c->cap > 0)
                        attn_tile_softcap(f.p, f.s, 0, kh, qrow(&d, 0, i0), qd, nq, i0, scale, c->cap, c->window,
                                          old + (size_t)i0 * qd, qd, f.scr);
                    else
                        attn_tile(f.p, f.s, 0, kh, qrow(&d, 0, i0), qd, nq, i0, scale, c->window, old + (size_t)i0 * qd,
                                  qd, f.scr);
                }
            }
            static const float fills[] = {-INFINITY, -1e4f};
            for (int k = -1; k < 2 && !bad; k++) { /* k = -1: NULL */
                for (int h = 0; h < c->n_head; h++) sinks[h] = k < 0 ? 0 : fills[k];
                run_attn_sinks(f.p, f.s, &d, 0, 0, T, c->window, c->cap, k < 0 ? NULL : sinks, ATTN_TILE_Q, got, f.scr);
                if (memcmp(old, got, n * sizeof(float))) bad = 1 + i * 4 + (k + 1);
            }
            for (int h = 0; h < c->n_head; h++) sinks[h] = 0.5f;
            run_attn_sinks(f.p, f.s, &d, 0, 0, T, c->window, c->cap, sinks, ATTN_TILE_Q, got, f.scr);
            if (!memcmp(old, got, n * sizeof(float))) bad = 100;
        }
        CHECK(!kernels_use(-1));
        CHECKF(!bad, "config %zu: %s", ci,
               bad == 100 ? "a sink of 0.5 changed nothing" : "no sink differs from the entries without sinks");
        filled_free(&f);
        free(old), free(got), free(sinks);
        data_free(&d);
    }
}

/* A sink far above every score takes all the weight: e^(s - sink) is below
 * float's range, the output is 0 within 1e-30 (the values are O(1)), and the
 * float64 reference says the same. A sink 45 above the largest scores
 * leaves e^-45-sized outputs that still match the reference's relative
 * bound. Every variant, prefill and decode, GQA and a window. */
static void test_sinks_dominate(void) {
    int isas[LM_ISA_COUNT], n_isa = cpu_isas(isas), T = 100;
    data d;
    data_make(&d, 1, 8, 2, 64, T, LM_TYPE_F16, 7);
    filled f;
    CHECK(!filled_make(&f, &d, LM_TYPE_F16, 16));
    size_t n = (size_t)T * 8 * 64;
    float *out = malloc(n * sizeof(float)), sinks[8];
    double *ref = malloc(n * sizeof(double));
    for (int i = 0; i < n_isa; i++) {
        CHECK(!kernels_use(isas[i]));
        for (int window = 0; window <= 20; window += 20) {
            for (int h = 0; h < 8; h++) sinks[h] = 1e4f;
            run_attn_sinks(f.p, f.s, &d, 0, 0, T, window, 0, sinks, ATTN_TILE_Q, out, f.scr);
            float amax = 0;
            for (size_t e = 0; e < n; e++) amax = fabsf(out[e]) <= amax ? amax : fabsf(out[e]); /* NaN sticks */
            CHECKF(amax < 1e-30f, "%s window %d: |out| up to %g", kernels_isa_str((lm_isa)isas[i]), window,
                   (double)amax);
            ref_attn_full(&d, d.ks, d.vs, 0, 0, T, window, 0, sinks, ref);
            double rmax = 0;
            for (size_t e = 0; e < n; e++) rmax = fabs(ref[e]) <= rmax ? rmax : fabs(ref[e]);
            CHECK(rmax < 1e-30);
            /* scores of this data lie within ±20: every e^(s - sink) stays a
             * normal float */
            for (int h = 0; h < 8; h++) sinks[h] = 65.0f;
            run_attn_sinks(f.p, f.s, &d, 0, 0, T, window, 0, sinks, ATTN_TILE_Q, out, f.scr);
            ref_attn_full(&d, d.ks, d.vs, 0, 0, T, window, 0, sinks, ref);
            double e = rel_err(out, ref, n);
            amax = 0;
            for (size_t k = 0; k < n; k++) amax = fabsf(out[k]) <= amax ? amax : fabsf(out[k]);
            CHECKF(e < 1e-5 && amax < 1e-20f && amax > 0, "%s window %d: err %.3g, |out| up to %g",
                   kernels_isa_str((lm_isa)isas[i]), window, e, (double)amax);
        }
    }
    CHECK(!kernels_use(-1));
    filled_free(&f);
    free(out), free(ref);
    data_free(&d);
}

/* With sinks a query's output is the same bits whatever shares its call:
 * the whole prefill in tiles of 32 queries, in tiles of 7, and one query
 * at a time (decode) agree exactly on each variant. */
static void test_sinks_batch_invariant(void) {
    int isas[LM_ISA_COUNT], n_isa = cpu_isas(isas), T = 140;
    data d;
    data_make(&d, 1, 8, 2, 64, T, LM_TYPE_F32, 8);
    filled f;
    CHECK(!filled_make(&f, &d, LM_TYPE_F32, 16));
    size_t n = (size_t)T * 8 * 64;
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float)), sinks[8];
    for (int h = 0; h < 8; h++) sinks[h] = (float)h - 3.0f;
    for (int i = 0; i < n_isa; i++) {
        CHECK(!kernels_use(isas[i]));
        run_attn_sinks(f.p, f.s, &d, 0, 0, T, 0, 0, sinks, ATTN_TILE_Q, a, f.scr);
        run_attn_sinks(f.p, f.s, &d, 0, 0, T, 0, 0, sinks, 7, b, f.scr);
        CHECKF(!memcmp(a, b, n * sizeof(float)), "%s: tiles of 7", kernels_isa_str((lm_isa)isas[i]));
        run_attn_sinks(f.p, f.s, &d, 0, 0, T, 0, 0, sinks, 1, b, f.scr);
        CHECKF(!memcmp(a, b, n * sizeof(float)), "%s: one query per call", kernels_isa_str((lm_isa)isas[i]));
    }
    CHECK(!kernels_use(-1));
    filled_free(&f);
    free(a), free(b);
    data_free(&d);
}

/* The loader's check: finite and -inf sinks pass, NaN and +inf do not, and
 * the message names the head. */
static void test_sinks_check(void) {
    char err[LM_ERRLEN] = "";
    float ok[4] = {0, -INFINITY, 1e30f, -5};
    CHECK(attn_sinks_check(ok, 4, err, sizeof err) == 0);
    float nan_[3] = {0, 1, NAN}, inf_[2] = {INFINITY, 0};
    CHECK(attn_sinks_check(nan_, 3, err, sizeof err) == -1);
    CHECKF(strstr(err, "head 2") && strstr(err, "NaN"), "%s", err);
    CHECK(attn_sinks_check(inf_, 2, err, sizeof err) == -1);
    CHECKF(strstr(err, "head 0") && strstr(err, "+inf"), "%s", err);
    CHECK(attn_sinks_check(inf_, 2, NULL, 0) == -1);
}

#if defined(__x86_64__) || defined(__i386__)
/* The SIMD inner loops against their contracts, bit for bit: P·V is one
 * fmaf chain per output element over the keys in order, whatever the row
 * count (tiles of 6 and every tail) or head dim (16 columns at a time and an
 * 8-column tail); the row max and the row scaling are exact. */
static void test_simd_kernels(void) {
    if (!cpu_has_avx2()) {
        printf("NOTE no AVX2: SIMD attention kernels not tested\n");
        return;
    }
    lm_rng r;
    lm_rng_seed(&r, 77);
    static const int hds[] = {8, 16, 24, 64, 72, 128};
    enum { RM = 13, NK = 67, HM = 128 };
    float *P = malloc(sizeof(float) * RM * NK), *V = malloc(sizeof(float) * NK * HM);
    float *O = malloc(sizeof(float) * RM * HM), *want = malloc(sizeof(float) * RM * HM);
    const float *vrow[NK];
    for (int i = 0; i < RM * NK; i++) P[i] = (float)lm_rng_uniform(&r) - 0.25f;
    for (int i = 0; i < NK * HM; i++) V[i] = lm_rng_normal(&r);
    int bad = 0;
    for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++) {
        int hd = hds[hi];
        for (int t = 0; t < NK; t++) vrow[t] = V + (size_t)(NK - 1 - t) * HM; /* rows anywhere */
        for (int R = 1; R <= RM; R++)
            for (int nk = 1; nk <= NK; nk += 11) {
                for (int i = 0; i < R * hd; i++) O[i] = want[i] = (float)(i % 5) - 2.0f;
                for (int rr = 0; rr < R; rr++)
                    for (int d = 0; d < hd; d++)
                        for (int t = 0; t < nk; t++)
                            want[rr * hd + d] = fmaf(P[rr * NK + t], vrow[t][d], want[rr * hd + d]);
                attn_pv_avx2(O, R, hd, P, NK, vrow, nk);
                if (memcmp(O, want, sizeof(float) * (size_t)(R * hd)) && !bad) bad = hd * 10000 + R * 100 + nk;
            }
    }
    CHECKF(!bad, "P·V differs from the fmaf chains at hd %d, %d rows, %d keys", bad / 10000, bad / 100 % 100,
           bad % 100);
    for (int off = 0; off < 3; off++)
        for (int n = 1; n <= 40; n++) {
            const float *x = P + off;
            float m = x[0];
            for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
            CHECKF(attn_max_avx2(x, n) == m, "max of %d from %d", n, off);
        }
    attn_scale_avx2(O, V, 72, 0.37f);
    for (int i = 0; i < 72; i++) CHECKF(O[i] == V[i] * 0.37f, "scale %d", i);
    free(P);
    free(V);
    free(O);
    free(want);
}
#endif

/* ---- non-causal attention ------------------------------------------------------ */

/* The float64 reference of attn_tile_full: queries pos0 .. pos0+n_q-1 each
 * see keys [0, kv_end); with half > 0 (attn_tile_sym) only those within
 * half positions of the query's. */
static void ref_attn_nc_sym(const data *d, const float *kk, const float *vv, int pos0, int n_q, int kv_end, int half,
                            double *out) {
    int hd = d->hd, G = d->n_head / d->n_head_kv;
    size_t kvd = (size_t)d->n_head_kv * hd;
    double scale, *w = malloc((size_t)kv_end * sizeof(double));
    for (int i = 0; i < n_q; i++)
        for (int h = 0; h < d->n_head; h++) {
            const float *q = qref(d, 0, pos0 + i, h, &scale);
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < kv_end; j++) {
                const float *k = kk + (size_t)j * kvd + (size_t)(h / G) * hd;
                double s = 0;
                for (int e = 0; e < hd; e++) s += (double)q[e] * k[e];
                w[j] = half > 0 && abs(j - (pos0 + i)) > half ? -INFINITY : s * scale;
                if (w[j] > mx) mx = w[j];
            }
            for (int j = 0; j < kv_end; j++) sum += w[j] = exp(w[j] - mx);
            double *o = out + (size_t)i * d->n_head * hd + (size_t)h * hd;
            for (int e = 0; e < hd; e++) o[e] = 0;
            for (int j = 0; j < kv_end; j++) {
                const float *v = vv + (size_t)j * kvd + (size_t)(h / G) * hd;
                for (int e = 0; e < hd; e++) o[e] += w[j] / sum * v[e];
            }
        }
    free(w);
}

static void ref_attn_nc(const data *d, const float *kk, const float *vv, int pos0, int n_q, int kv_end, double *out) {
    ref_attn_nc_sym(d, kk, vv, pos0, n_q, kv_end, 0, out);
}

/* Every query tile of a segment sees the whole sequence, later positions
 * included: against the float64 reference on the stored values (1e-5) on
 * every variant the CPU runs, for MHA, GQA and MQA, head dims on and off the
 * SIMD loops, lengths on both sides of the 32-query tile and the 64-key
 * chunk, block sizes 1, 16 and the whole context, F32/F16/Q8_0, and for a
 * segment after earlier positions (pos0 > 0, kv_end = T) as well as the
 * whole sequence. The result must differ from the causal one (the mask is
 * not the causal mask), and the tile size must not change a bit. */
static void test_noncausal(void) {
    static const struct {
        int n_head, n_head_kv, hd, T, B;
        uint32_t type;
    } cfgs[] = {
        {4, 4, 16, 7, 16, LM_TYPE_F32},   {4, 2, 32, 33, 1, LM_TYPE_F32},   {8, 1, 64, 100, 16, LM_TYPE_F16},
        {6, 3, 12, 70, 128, LM_TYPE_F32}, {2, 2, 64, 130, 7, LM_TYPE_Q8_0}, {12, 12, 32, 65, 32, LM_TYPE_F32},
    };
    int isas[LM_ISA_COUNT], n_isa = cpu_isas(isas);
    double worst = 0;
    for (size_t c = 0; c < sizeof cfgs / sizeof *cfgs; c++) {
        data d;
        int T = cfgs[c].T;
        data_make(&d, 1, cfgs[c].n_head, cfgs[c].n_head_kv, cfgs[c].hd, T, cfgs[c].type, (uint64_t)(c * 17 + 3));
        filled f;
        CHECK(filled_make(&f, &d, cfgs[c].type, cfgs[c].B) == 0);
        size_t qd = (size_t)d.n_head * d.hd;
        float *out = malloc((size_t)T * qd * sizeof(float)), *out1 = malloc((size_t)T * qd * sizeof(float));
        double *ref = malloc((size_t)T * qd * sizeof(double)), *causal = malloc((size_t)T * qd * sizeof(double));
        float scale = 1.0f / sqrtf((float)d.hd);
        int starts[2] = {0, T / 2};
        for (int k = 0; k < 2; k++) {
            int pos0 = starts[k], n_q = T - pos0;
            ref_attn_nc(&d, d.ks, d.vs, pos0, n_q, T, ref);
            ref_attn(&d, d.ks, d.vs, 0, pos0, n_q, causal);
            for (int i = 0; i < n_isa; i++) {
                CHECK(kernels_use(isas[i]) == 0);
                if (ref_mode(&d)) {
                    ref_attn_nc(&d, d.ks, d.vs, pos0, n_q, T, ref);
                    ref_attn(&d, d.ks, d.vs, 0, pos0, n_q, causal);
                }
                for (int tile = ATTN_TILE_Q, pass = 0; pass < 2; pass++, tile = 5) {
                    float *o = pass ? out1 : out;
                    for (int i0 = 0; i0 < n_q; i0 += tile) {
                        int n = n_q - i0 < tile ? n_q - i0 : tile;
                        for (int kh = 0; kh < d.n_head_kv; kh++)
                            attn_tile_full(f.p, f.s, 0, kh, qrow(&d, 0, pos0 + i0), qd, n, pos0 + i0, T, scale, 0, NULL,
                                           o + (size_t)i0 * qd, qd, f.scr);
                    }
                }
                CHECK(memcmp(out, out1, (size_t)n_q * qd * sizeof(float)) == 0);
                double e = rel_err(out, ref, (size_t)n_q * qd), ec = rel_err(out, causal, (size_t)n_q * qd);
                if (e > worst) worst = e;
                if (!(e < 1e-5) || !(ec > 1e-2))
                    fprintf(stderr, "  non-causal cfg %zu pos0 %d %s: err %.3g, vs causal %.3g\n", c, pos0,
                            kernels_isa_str((lm_isa)isas[i]), e, ec);
                CHECK(e < 1e-5);
                CHECK(ec > 1e-2);
            }
        }
        kernels_use(-1);
        filled_free(&f);
        free(out), free(out1), free(ref), free(causal);
        data_free(&d);
    }
    printf("  non-causal: worst relative error %.3g over %d variants\n", worst, n_isa);
}

/* attn_tile_sym (gemma-embedding's local layers): query at pos sees the keys
 * within half positions either side, later ones included, against the
 * float64 reference (1e-5) on every variant, for windows narrower than a
 * tile, than a chunk and wider than the sequence, queries cut into tiles
 * of 32 and of 5 (the same bits); a window narrower than the sequence must
 * differ from attn_tile_full's result. */
static void test_symmetric(void) {
    static const struct {
        int n_head, n_head_kv, hd, T, B, half;
        uint32_t type;
    } cfgs[] = {
        {4, 2, 32, 40, 16, 8, LM_TYPE_F32}, {4, 4, 16, 100, 1, 3, LM_TYPE_F16},  {8, 1, 64, 150, 16, 40, LM_TYPE_F32},
        {2, 2, 64, 70, 7, 1, LM_TYPE_Q8_0}, {4, 2, 32, 20, 16, 64, LM_TYPE_F32},
    };
    int isas[LM_ISA_COUNT], n_isa = cpu_isas(isas);
    double worst = 0;
    for (size_t c = 0; c < sizeof cfgs / sizeof *cfgs; c++) {
        data d;
        int T = cfgs[c].T, half = cfgs[c].half;
        data_make(&d, 1, cfgs[c].n_head, cfgs[c].n_head_kv, cfgs[c].hd, T, cfgs[c].type, (uint64_t)(c * 31 + 5));
        filled f;
        CHECK(filled_make(&f, &d, cfgs[c].type, cfgs[c].B) == 0);
        size_t qd = (size_t)d.n_head * d.hd;
        float *out = malloc((size_t)T * qd * sizeof(float)), *out1 = malloc((size_t)T * qd * sizeof(float));
        double *ref = malloc((size_t)T * qd * sizeof(double)), *full = malloc((size_t)T * qd * sizeof(double));
        float scale = 1.0f / sqrtf((float)d.hd);
        ref_attn_nc_sym(&d, d.ks, d.vs, 0, T, T, half, ref);
        ref_attn_nc_sym(&d, d.ks, d.vs, 0, T, T, 0, full);
        for (int i = 0; i < n_isa; i++) {
            CHECK(kernels_use(isas[i]) == 0);
            if (ref_mode(&d)) {
                ref_attn_nc_sym(&d, d.ks, d.vs, 0, T, T, half, ref);
                ref_attn_nc_sym(&d, d.ks, d.vs, 0, T, T, 0, full);
            }
            for (int tile = ATTN_TILE_Q, pass = 0; pass < 2; pass++, tile = 5) {
                float *o = pass ? out1 : out;
                for (int i0 = 0; i0 < T; i0 += tile) {
                    int n = T - i0 < tile ? T - i0 : tile;
                    for (int kh = 0; kh < d.n_head_kv; kh++)
                        attn_tile_sym(f.p, f.s, 0, kh, qrow(&d, 0, i0), qd, n, i0, T, scale, 0, half, NULL,
                                      o + (size_t)i0 * qd, qd, f.scr);
                }
            }
            CHECK(memcmp(out, out1, (size_t)T * qd * sizeof(float)) == 0);
            double e = rel_err(out, ref, (size_t)T * qd), ef = rel_err(out, full, (size_t)T * qd);
            if (e > worst) worst = e;
            if (!(e < 1e-5))
                fprintf(stderr, "  symmetric cfg %zu %s: err %.3g\n", c, kernels_isa_str((lm_isa)isas[i]), e);
            CHECK(e < 1e-5);
            if (half < T - 1) CHECK(ef > 1e-3);
        }
        kernels_use(-1);
        filled_free(&f);
        free(out), free(out1), free(ref), free(full);
        data_free(&d);
    }
    printf("  symmetric window: worst relative error %.3g over %d variants\n", worst, n_isa);
}

int main(void) {
    kernels_init();
#if defined(__x86_64__) || defined(__i386__)
    TEST_RUN(test_simd_kernels);
#endif
    TEST_RUN(test_f32_every_block_size);
    TEST_RUN(test_f16_and_q8_0);
    TEST_RUN(test_head_shapes);
    TEST_RUN(test_sliding_window);
    TEST_RUN(test_paging_is_bit_exact);
    TEST_RUN(test_prefix_hit_equals_cold);
    TEST_RUN(test_fork_cow_branches);
    TEST_RUN(test_threads_split_items);
    TEST_RUN(test_no_simd_env);
    TEST_RUN(test_scratch_is_bounded);
    TEST_RUN(test_sinks_check);
    TEST_RUN(test_sinks_none_is_identical);
    TEST_RUN(test_sinks_reference);
    TEST_RUN(test_sinks_dominate);
    TEST_RUN(test_sinks_batch_invariant);
    TEST_RUN(test_noncausal);
    TEST_RUN(test_split_k);
    TEST_RUN(test_symmetric);
    return TEST_DONE();
}
