/*
 * test_attn.c - the tiled paged attention kernel against a float64
 * reference: softmax(q·kᵀ·scale, causal)·v computed directly in double.
 *
 * Bounds (relative L2 error over all outputs of a call):
 *   against the reference on the values as STORED (after F16/Q8_0 rounding):
 *     < 1e-5 for every type and path;
 *   against the reference on the original float values:
 *     F32 < 1e-5, F16 < 2e-3, Q8_0 < 2e-2
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
 * must give the scalar path's bits (test_no_simd_env).
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
} data;

static void data_make(data *d, int n_layer, int n_head, int n_head_kv, int hd, int T, uint32_t type, uint64_t seed) {
    d->n_layer = n_layer, d->n_head = n_head, d->n_head_kv = n_head_kv, d->hd = hd, d->T = T;
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
        free(tmp);
    }
}

static void data_free(data *d) { free(d->k), free(d->v), free(d->ks), free(d->vs), free(d->q); }

static const float *qrow(const data *d, int layer, int t) {
    return d->q + ((size_t)layer * d->T + t) * d->n_head * d->hd;
}

/* out (n_q, n_head*hd) in double for queries pos0.. of `layer`, keys/values
 * from kk/vv (stored or original); window > 0 limits each query to its last
 * `window` positions. */
static void ref_attn_w(const data *d, const float *kk, const float *vv, int layer, int pos0, int n_q, int window,
                       double *out) {
    int hd = d->hd, G = d->n_head / d->n_head_kv;
    size_t kvd = (size_t)d->n_head_kv * hd;
    double scale = 1.0 / sqrt((double)hd);
    double *w = malloc((size_t)(pos0 + n_q) * sizeof(double));
    for (int i = 0; i < n_q; i++) {
        int pos = pos0 + i, j0 = window > 0 && pos + 1 > window ? pos + 1 - window : 0;
        for (int h = 0; h < d->n_head; h++) {
            const float *q = qrow(d, layer, pos) + (size_t)h * hd;
            int kh = h / G;
            double mx = -INFINITY, sum = 0;
            for (int j = j0; j <= pos; j++) {
                const float *k = kk + ((size_t)layer * d->T + j) * kvd + (size_t)kh * hd;
                double s = 0;
                for (int e = 0; e < hd; e++) s += (double)q[e] * k[e];
                w[j] = s * scale;
                if (w[j] > mx) mx = w[j];
            }
            for (int j = j0; j <= pos; j++) sum += w[j] = exp(w[j] - mx);
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
            ref_attn_w(&d, d.ks, d.vs, layer, pos0, n_q, window, ref);
            ref_attn_w(&d, d.k, d.v, layer, pos0, n_q, window, ref_o);
            for (int path = 0; path < 2; path++) {
                use_path(path);
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
        ref_attn_w(&d, d.ks, d.vs, n_layer - 1, pos, 1, window, ref);
        for (int path = 0; path < 2; path++) {
            use_path(path);
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
    return TEST_DONE();
}
