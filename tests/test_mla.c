/*
 * test_mla.c - deepseek2's multi-head latent attention against a naive
 * float64 reference, and the latent KV layout.
 *
 * Small random deepseek2 models (a leading dense layer, then expert layers
 * with a shared expert) are written to GGUF with the project's writer as
 * llama.cpp's converter lays them out (attn_kv_a_mqa, attn_k_b holding each
 * head's W_UKᵀ, attn_v_b each head's W_UV), loaded through the normal path,
 * and their logits compared with a reference written here in double that
 * decompresses the latent into ordinary multi-head attention (k_nope =
 * W_UK c, v = W_UV c per head; lamina attends in the latent space with
 * absorbed queries instead). Relative L2 bounds over a logits row as in
 * test_model.c: F32 weights 1e-5, Q8_0 weights 6e-2 (three layers of 8-bit
 * activations through experts weighted by 2.5 measure 4e-2). Covered: with and
 * without the query bottleneck; softmax routing, and DeepSeek-V3's sigmoid
 * routing with a selection bias, renormalisation and a weight scale; whole
 * prompt, token by token and uneven splits, on 1 and 2 threads. Then: the
 * latent KV bytes per token equal n_layer x (kv_lora_rank + n_rot) x bytes
 * per element (F32, F16, Q8_0), against the equivalent multi-head cache;
 * a Q8_0 latent cache close to the F32 one; batch invariance (a sequence's
 * logits bit-identical alone and batched with another); a fork sharing the
 * latent blocks with copy-on-write, and a prefix-cache hit, giving the
 * logits of a fresh run; refusals of files lamina cannot run.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/forward.h"
#include "format/gguf.h"
#include "model/model.h"
#include "base/pool.h"
#include "format/quant.h"
#include "test.h"
#include "base/util.h"

typedef struct {
    int n_layer, n_dense, E, H, q_lora, R, rope, nope, vd, n_ff, X, K, FE, shared, V;
    bool sigmoid, norm;
    float scale;
    uint32_t wtype;
} shape;

typedef struct {
    double *attn_norm, *ffn_norm, *qa, *qan, *qb, *kva, *kvn, *kb, *vb, *wo;
    double *wg, *wu, *wd;               /* dense FFN, or the shared expert */
    double *router, *bias, *eg, *eu, *ed; /* experts */
} ref_layer;

typedef struct {
    shape sh;
    double *emb, *out_norm, *out;
    ref_layer *L;
    void **blobs;
    int n_blobs;
} ref_model;

static lm_rng rng;

static void *keep(ref_model *r, void *p) {
    r->blobs = realloc(r->blobs, (size_t)(r->n_blobs + 1) * sizeof(void *));
    r->blobs[r->n_blobs++] = p;
    return p;
}

/* n_mat random (rows, cols) matrices of `type` as one tensor (2-D when
 * n_mat is 0), their dequantized values in double. */
static double *add_w(ref_model *r, gguf_writer *w, const char *name, int n_mat, int rows, int cols, uint32_t type,
                     float scale) {
    int nm = n_mat ? n_mat : 1;
    size_t n = (size_t)nm * rows * cols, rb = quant_row_size(type, cols);
    float *f = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) f[i] = lm_rng_normal(&rng) * scale;
    void *q = keep(r, malloc(rb * (size_t)rows * nm));
    double *d = malloc(n * sizeof(double));
    for (int i = 0; i < nm * rows; i++) {
        quant_from_float_ref(type, f + (size_t)i * cols, (char *)q + rb * i, cols);
        quant_to_float_ref(type, (char *)q + rb * i, f + (size_t)i * cols, cols);
    }
    for (size_t i = 0; i < n; i++) d[i] = f[i];
    free(f);
    uint64_t ne[3] = {(uint64_t)cols, (uint64_t)rows, (uint64_t)nm};
    gguf_w_add_tensor(w, name, n_mat ? 3 : rows > 1 ? 2 : 1, ne, type, q, rb * (size_t)rows * nm);
    return d;
}

static double *add_vec(ref_model *r, gguf_writer *w, const char *name, int n, float mean, float scale) {
    float *f = keep(r, malloc((size_t)n * sizeof(float)));
    double *d = malloc((size_t)n * sizeof(double));
    for (int i = 0; i < n; i++) d[i] = f[i] = mean + lm_rng_normal(&rng) * scale;
    uint64_t ne[1] = {(uint64_t)n};
    gguf_w_add_tensor(w, name, 1, ne, LM_TYPE_F32, f, (uint64_t)n * 4);
    return d;
}

/* Which metadata or tensor write_model leaves out or changes (refusal tests). */
enum { FAULT_NONE, FAULT_NO_MLA_KEYS, FAULT_KV_B, FAULT_GROUPS, FAULT_YARN, FAULT_BAD_KEYLEN };

static int write_model(ref_model *r, const shape *sh, const char *path, int fault) {
    memset(r, 0, sizeof *r);
    r->sh = *sh;
    gguf_writer *w = gguf_writer_new();
    int E = sh->E, H = sh->H, QK = sh->nope + sh->rope, R = sh->R, t = (int)sh->wtype;
#define K(s) "deepseek2." s
    gguf_w_set_str(w, "general.architecture", "deepseek2");
    gguf_w_set_u32(w, K("block_count"), (uint32_t)sh->n_layer);
    gguf_w_set_u32(w, K("context_length"), 64);
    gguf_w_set_u32(w, K("embedding_length"), (uint32_t)E);
    gguf_w_set_u32(w, K("feed_forward_length"), (uint32_t)sh->n_ff);
    gguf_w_set_u32(w, K("attention.head_count"), (uint32_t)H);
    gguf_w_set_u32(w, K("attention.head_count_kv"), 1);
    gguf_w_set_u32(w, K("attention.q_lora_rank"), (uint32_t)sh->q_lora);
    gguf_w_set_u32(w, K("attention.kv_lora_rank"), (uint32_t)R);
    gguf_w_set_u32(w, K("attention.key_length"), (uint32_t)(R + sh->rope + (fault == FAULT_BAD_KEYLEN)));
    gguf_w_set_u32(w, K("attention.value_length"), (uint32_t)R);
    if (fault != FAULT_NO_MLA_KEYS) {
        gguf_w_set_u32(w, K("attention.key_length_mla"), (uint32_t)QK);
        gguf_w_set_u32(w, K("attention.value_length_mla"), (uint32_t)sh->vd);
    }
    gguf_w_set_u32(w, K("rope.dimension_count"), (uint32_t)sh->rope);
    gguf_w_set_f32(w, K("rope.freq_base"), 10000.0f);
    gguf_w_set_f32(w, K("attention.layer_norm_rms_epsilon"), 1e-6f);
    gguf_w_set_u32(w, K("leading_dense_block_count"), (uint32_t)sh->n_dense);
    gguf_w_set_u32(w, K("expert_count"), (uint32_t)sh->X);
    gguf_w_set_u32(w, K("expert_used_count"), (uint32_t)sh->K);
    gguf_w_set_u32(w, K("expert_feed_forward_length"), (uint32_t)sh->FE);
    gguf_w_set_u32(w, K("expert_shared_count"), (uint32_t)sh->shared);
    gguf_w_set_f32(w, K("expert_weights_scale"), sh->scale);
    gguf_w_set_bool(w, K("expert_weights_norm"), sh->norm);
    gguf_w_set_u32(w, K("expert_gating_func"), sh->sigmoid ? 2 : 1);
    if (fault == FAULT_GROUPS) gguf_w_set_u32(w, K("expert_group_count"), 2);
    if (fault == FAULT_YARN) gguf_w_set_str(w, K("rope.scaling.type"), "yarn");
#undef K
    float ws = 1.0f / sqrtf((float)E), wr = 1.0f / sqrtf((float)R);
    r->emb = add_w(r, w, "token_embd.weight", 0, sh->V, E, (uint32_t)t, 1.0f);
    r->out_norm = add_vec(r, w, "output_norm.weight", E, 1.0f, 0.2f);
    r->out = add_w(r, w, "output.weight", 0, sh->V, E, (uint32_t)t, 3 * ws);
    r->L = calloc((size_t)sh->n_layer, sizeof(ref_layer));
    char n[96];
#define N(s) (snprintf(n, sizeof n, "blk.%d." s, i), n)
    for (int i = 0; i < sh->n_layer; i++) {
        ref_layer *l = &r->L[i];
        l->attn_norm = add_vec(r, w, N("attn_norm.weight"), E, 1.0f, 0.2f);
        if (sh->q_lora) {
            l->qa = add_w(r, w, N("attn_q_a.weight"), 0, sh->q_lora, E, (uint32_t)t, ws);
            l->qan = add_vec(r, w, N("attn_q_a_norm.weight"), sh->q_lora, 1.0f, 0.2f);
            l->qb = add_w(r, w, N("attn_q_b.weight"), 0, H * QK, sh->q_lora, (uint32_t)t, 1.0f / sqrtf((float)sh->q_lora));
        } else {
            l->qb = add_w(r, w, N("attn_q.weight"), 0, H * QK, E, (uint32_t)t, ws);
        }
        l->kva = add_w(r, w, N("attn_kv_a_mqa.weight"), 0, R + sh->rope, E, (uint32_t)t, ws);
        l->kvn = add_vec(r, w, N("attn_kv_a_norm.weight"), R, 1.0f, 0.2f);
        if (fault == FAULT_KV_B)
            free(add_w(r, w, N("attn_kv_b.weight"), 0, H * (sh->nope + sh->vd), R, (uint32_t)t, wr));
        else {
            l->kb = add_w(r, w, N("attn_k_b.weight"), H, R, sh->nope, (uint32_t)t, wr * 2);
            l->vb = add_w(r, w, N("attn_v_b.weight"), H, sh->vd, R, (uint32_t)t, wr);
        }
        l->wo = add_w(r, w, N("attn_output.weight"), 0, E, H * sh->vd, (uint32_t)t, 1.0f / sqrtf((float)(H * sh->vd)));
        l->ffn_norm = add_vec(r, w, N("ffn_norm.weight"), E, 1.0f, 0.2f);
        if (i < sh->n_dense) {
            l->wg = add_w(r, w, N("ffn_gate.weight"), 0, sh->n_ff, E, (uint32_t)t, ws);
            l->wu = add_w(r, w, N("ffn_up.weight"), 0, sh->n_ff, E, (uint32_t)t, ws);
            l->wd = add_w(r, w, N("ffn_down.weight"), 0, E, sh->n_ff, (uint32_t)t, 1.0f / sqrtf((float)sh->n_ff));
            continue;
        }
        l->router = add_w(r, w, N("ffn_gate_inp.weight"), 0, sh->X, E, LM_TYPE_F32, 4 * ws);
        if (sh->sigmoid) l->bias = add_vec(r, w, N("exp_probs_b.bias"), sh->X, 0.0f, 0.1f);
        l->eg = add_w(r, w, N("ffn_gate_exps.weight"), sh->X, sh->FE, E, (uint32_t)t, ws);
        l->eu = add_w(r, w, N("ffn_up_exps.weight"), sh->X, sh->FE, E, (uint32_t)t, ws);
        l->ed = add_w(r, w, N("ffn_down_exps.weight"), sh->X, E, sh->FE, (uint32_t)t, 1.0f / sqrtf((float)sh->FE));
        int S = sh->shared * sh->FE;
        if (S) {
            l->wg = add_w(r, w, N("ffn_gate_shexp.weight"), 0, S, E, (uint32_t)t, ws);
            l->wu = add_w(r, w, N("ffn_up_shexp.weight"), 0, S, E, (uint32_t)t, ws);
            l->wd = add_w(r, w, N("ffn_down_shexp.weight"), 0, E, S, (uint32_t)t, 1.0f / sqrtf((float)S));
        }
    }
#undef N
    char err[LM_ERRLEN];
    int rc = gguf_writer_write(w, path, err, sizeof err);
    if (rc) fprintf(stderr, "write: %s\n", err);
    gguf_writer_free(w);
    for (int i = 0; i < r->n_blobs; i++) free(r->blobs[i]);
    free(r->blobs);
    return rc;
}

static void free_ref(ref_model *r) {
    for (int i = 0; r->L && i < r->sh.n_layer; i++) {
        ref_layer *l = &r->L[i];
        double *all[] = {l->attn_norm, l->ffn_norm, l->qa, l->qan, l->qb, l->kva, l->kvn, l->kb, l->vb, l->wo,
                         l->wg, l->wu, l->wd, l->router, l->bias, l->eg, l->eu, l->ed};
        for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) free(all[k]);
    }
    free(r->L);
    free(r->emb);
    free(r->out_norm);
    free(r->out);
}

/* ---- the reference ----------------------------------------------------- */

static void mv(double *y, const double *W, const double *x, int rows, int cols) {
    for (int i = 0; i < rows; i++) {
        double s = 0;
        for (int j = 0; j < cols; j++) s += W[(size_t)i * cols + j] * x[j];
        y[i] = s;
    }
}

static void rms(double *y, const double *x, const double *w, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i] * x[i];
    double k = 1.0 / sqrt(s / n + 1e-6);
    for (int i = 0; i < n; i++) y[i] = x[i] * k * w[i];
}

/* RoPE on adjacent pairs of n values at pos (base 10000). */
static void rope(double *v, int n, int pos) {
    for (int i = 0; i < n / 2; i++) {
        double th = pos * pow(10000.0, -2.0 * i / n), c = cos(th), s = sin(th);
        double a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * c - b * s;
        v[2 * i + 1] = a * s + b * c;
    }
}

static void swiglu(double *y, const double *wg, const double *wu, const double *wd, const double *x, int E, int F) {
    double *g = malloc((size_t)F * sizeof(double)), *u = malloc((size_t)F * sizeof(double));
    mv(g, wg, x, F, E);
    mv(u, wu, x, F, E);
    for (int i = 0; i < F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
    mv(y, wd, g, E, F);
    free(g);
    free(u);
}

static void moe(const shape *sh, const ref_layer *l, const double *x, double *y) {
    int E = sh->E, X = sh->X;
    double p[64], sel[64];
    int chosen[64];
    mv(p, l->router, x, X, E);
    if (sh->sigmoid) {
        for (int e = 0; e < X; e++) p[e] = 1 / (1 + exp(-p[e]));
    } else {
        double mx = p[0], s = 0;
        for (int e = 1; e < X; e++) mx = fmax(mx, p[e]);
        for (int e = 0; e < X; e++) s += (p[e] = exp(p[e] - mx));
        for (int e = 0; e < X; e++) p[e] /= s;
    }
    for (int e = 0; e < X; e++) sel[e] = p[e] + (l->bias ? l->bias[e] : 0);
    double wsum = 0;
    for (int j = 0; j < sh->K; j++) {
        int b = -1;
        for (int e = 0; e < X; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= chosen[i] == e;
            if (!taken && (b < 0 || sel[e] > sel[b])) b = e;
        }
        chosen[j] = b;
        wsum += p[b];
    }
    double *ye = malloc((size_t)E * sizeof(double));
    memset(y, 0, (size_t)E * sizeof(double));
    size_t gs = (size_t)sh->FE * E;
    for (int j = 0; j < sh->K; j++) {
        int e = chosen[j];
        double wt = p[e] / (sh->norm ? wsum : 1.0) * sh->scale;
        swiglu(ye, l->eg + e * gs, l->eu + e * gs, l->ed + e * gs, x, E, sh->FE);
        for (int i = 0; i < E; i++) y[i] += wt * ye[i];
    }
    if (sh->shared) {
        swiglu(ye, l->wg, l->wu, l->wd, x, E, sh->shared * sh->FE);
        for (int i = 0; i < E; i++) y[i] += ye[i];
    }
    free(ye);
}

/* Logits (T, V) of tokens at positions 0 .. T-1, with decompressed
 * multi-head attention. */
static double *ref_forward(const ref_model *r, const int32_t *tok, int T) {
    const shape *sh = &r->sh;
    int E = sh->E, H = sh->H, R = sh->R, rp = sh->rope, np = sh->nope, QK = np + rp, vd = sh->vd;
    double *x = malloc((size_t)T * E * sizeof(double)), *lg = malloc((size_t)T * sh->V * sizeof(double));
    double *xb = malloc((size_t)E * sizeof(double)), *y = malloc((size_t)E * sizeof(double));
    double *c = malloc((size_t)T * R * sizeof(double)), *kpe = malloc((size_t)T * rp * sizeof(double));
    double *q = malloc((size_t)T * H * QK * sizeof(double)), *qa = malloc((size_t)(sh->q_lora + R + rp) * sizeof(double));
    double *att = malloc((size_t)H * vd * sizeof(double)), *s = malloc((size_t)T * sizeof(double));
    double *kn = malloc((size_t)np * sizeof(double)), *v = malloc((size_t)vd * sizeof(double));
    for (int t = 0; t < T; t++) memcpy(x + (size_t)t * E, r->emb + (size_t)tok[t] * E, (size_t)E * sizeof(double));
    for (int li = 0; li < sh->n_layer; li++) {
        const ref_layer *l = &r->L[li];
        for (int t = 0; t < T; t++) { /* queries, latents, RoPE keys of every position */
            rms(xb, x + (size_t)t * E, l->attn_norm, E);
            double *qt = q + (size_t)t * H * QK;
            if (sh->q_lora) {
                mv(qa, l->qa, xb, sh->q_lora, E);
                rms(qa, qa, l->qan, sh->q_lora);
                mv(qt, l->qb, qa, H * QK, sh->q_lora);
            } else {
                mv(qt, l->qb, xb, H * QK, E);
            }
            for (int h = 0; h < H; h++) rope(qt + h * QK + np, rp, t);
            mv(qa, l->kva, xb, R + rp, E);
            rms(c + (size_t)t * R, qa, l->kvn, R);
            memcpy(kpe + (size_t)t * rp, qa + R, (size_t)rp * sizeof(double));
            rope(kpe + (size_t)t * rp, rp, t);
        }
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < H; h++) {
                const double *qh = q + (size_t)t * H * QK + h * QK;
                const double *kb = l->kb + (size_t)h * R * np, *vb = l->vb + (size_t)h * vd * R;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    for (int i = 0; i < np; i++) { /* k_nope = W_UK c, W_UK = kbᵀ */
                        double a = 0;
                        for (int k = 0; k < R; k++) a += kb[(size_t)k * np + i] * c[(size_t)j * R + k];
                        kn[i] = a;
                    }
                    double d = 0;
                    for (int i = 0; i < np; i++) d += qh[i] * kn[i];
                    for (int i = 0; i < rp; i++) d += qh[np + i] * kpe[(size_t)j * rp + i];
                    s[j] = d / sqrt((double)QK);
                    mx = fmax(mx, s[j]);
                }
                for (int j = 0; j <= t; j++) sum += (s[j] = exp(s[j] - mx));
                double *o = att + h * vd;
                memset(o, 0, (size_t)vd * sizeof(double));
                for (int j = 0; j <= t; j++) {
                    mv(v, vb, c + (size_t)j * R, vd, R);
                    for (int i = 0; i < vd; i++) o[i] += s[j] / sum * v[i];
                }
            }
            mv(y, l->wo, att, E, H * vd);
            for (int i = 0; i < E; i++) x[(size_t)t * E + i] += y[i];
        }
        for (int t = 0; t < T; t++) {
            rms(xb, x + (size_t)t * E, l->ffn_norm, E);
            if (li < sh->n_dense) swiglu(y, l->wg, l->wu, l->wd, xb, E, sh->n_ff);
            else moe(sh, l, xb, y);
            for (int i = 0; i < E; i++) x[(size_t)t * E + i] += y[i];
        }
    }
    for (int t = 0; t < T; t++) {
        rms(xb, x + (size_t)t * E, r->out_norm, E);
        mv(lg + (size_t)t * sh->V, r->out, xb, sh->V, E);
    }
    free(x), free(xb), free(y), free(c), free(kpe), free(q), free(qa), free(att), free(s), free(kn), free(v);
    return lg;
}

/* ---- the tests ---------------------------------------------------------- */

static char tmp_path[256];

static lm_model *make(const shape *sh, ref_model *r, int fault, lm_status *st, char *err, size_t errlen) {
    snprintf(tmp_path, sizeof tmp_path, "/tmp/lamina_test_mla_%d.gguf", (int)getpid());
    ref_model scratch;
    if (!r) r = &scratch;
    if (write_model(r, sh, tmp_path, fault)) return NULL;
    if (r == &scratch) free_ref(r);
    lm_model *m = model_load_params(tmp_path, NULL, st, err, errlen);
    unlink(tmp_path);
    return m;
}

/*                          layers dense E  H  qlora R  rope nope vd  ff  X  K  FE shared V  sigmoid norm scale type */
static const shape V3_F32 = {3, 1, 64, 4, 32, 48, 16, 16, 24, 96, 4, 2, 32, 1, 83, true, true, 2.5f, LM_TYPE_F32};
static const shape V2_F32 = {2, 1, 64, 4, 0, 48, 16, 16, 24, 96, 4, 2, 32, 2, 83, false, false, 1.0f, LM_TYPE_F32};
static const shape V3_Q8 = {3, 1, 64, 4, 32, 64, 32, 32, 32, 96, 4, 2, 32, 1, 83, true, true, 2.5f, LM_TYPE_Q8_0};

/* Whole prompt, token by token and an uneven split against the reference. */
static void check_reference(const shape *sh, int threads) {
    ref_model r;
    char err[LM_ERRLEN];
    lm_status st;
    lm_model *m = make(sh, &r, FAULT_NONE, &st, err, sizeof err);
    CHECKF(m != NULL, "%s", err);
    if (!m) return;
    CHECK(m->hp.kv_lora_rank == sh->R && m->hp.n_head_kv == 1 && m->hp.head_dim == sh->R + sh->rope);
    enum { T = 11 };
    int32_t toks[T];
    for (int i = 0; i < T; i++) toks[i] = (int32_t)(lm_rng_u64(&rng) % (uint64_t)sh->V);
    double *ref = ref_forward(&r, toks, T);
    int V = sh->V;
    float *lg = malloc((size_t)T * V * sizeof(float));
    lm_pool *pool = pool_new(threads);
    lm_seqrun *s = seqrun_new(m, pool, 32, 4, LM_TYPE_F32, err, sizeof err);
    CHECKF(s != NULL, "%s", err);
    double bound = sh->wtype == LM_TYPE_Q8_0 ? 6e-2 : 1e-5, worst = 0;
    CHECK(seqrun_forward(s, toks, T, lg, true, err, sizeof err) == 0);
    for (int t = 0; t < T; t++) {
        double e = test_rel_l2(lg + (size_t)t * V, ref + (size_t)t * V, (size_t)V);
        worst = e > worst ? e : worst;
        CHECKF(e < bound, "%s q_lora %d: prompt row %d rel err %.3g >= %.3g", quant_type_name(sh->wtype), sh->q_lora,
               t, e, bound);
    }
    seqrun_reset(s);
    for (int t = 0; t < T; t++) {
        CHECK(seqrun_forward(s, toks + t, 1, lg, false, err, sizeof err) == 0);
        double e = test_rel_l2(lg, ref + (size_t)t * V, (size_t)V);
        worst = e > worst ? e : worst;
        CHECKF(e < bound, "decode position %d rel err %.3g", t, e);
    }
    seqrun_reset(s);
    int splits[3] = {3, 1, 7}, pos = 0;
    for (int i = 0; i < 3; i++) {
        CHECK(seqrun_forward(s, toks + pos, splits[i], lg, false, err, sizeof err) == 0);
        pos += splits[i];
        double e = test_rel_l2(lg, ref + (size_t)(pos - 1) * V, (size_t)V);
        CHECKF(e < bound, "split ending at %d rel err %.3g", pos, e);
    }
    printf("NOTE deepseek2 %-5s q_lora %2d %s routing, threads %d: worst rel L2 %.2e (bound %.0e)\n",
           quant_type_name(sh->wtype), sh->q_lora, sh->sigmoid ? "sigmoid+bias" : "softmax", threads, worst, bound);
    seqrun_free(s);
    pool_free(pool);
    model_free(m);
    free(lg);
    free(ref);
    free_ref(&r);
}

static void test_v3_f32(void) {
    check_reference(&V3_F32, 1);
    check_reference(&V3_F32, 2);
}
static void test_v2_f32(void) { check_reference(&V2_F32, 2); }
static void test_v3_q8_0(void) { check_reference(&V3_Q8, 2); }

/* The latent cache: n_layer x (kv_lora_rank + n_rot) elements per token,
 * one row; the plan allocates exactly that, and the Q8_0 cache's logits
 * stay close to the F32 one's. */
static void test_latent_kv_bytes(void) {
    char err[LM_ERRLEN];
    lm_status st;
    lm_model *m = make(&V3_F32, NULL, FAULT_NONE, &st, err, sizeof err);
    CHECKF(m != NULL, "%s", err);
    if (!m) return;
    const shape *sh = &V3_F32;
    uint64_t row = (uint64_t)sh->R + (uint64_t)sh->rope;
    uint32_t types[3] = {LM_TYPE_F32, LM_TYPE_F16, LM_TYPE_Q8_0};
    double elem[3] = {4, 2, 34.0 / 32};
    for (int i = 0; i < 3; i++) {
        fwd_dims d = fwd_dims_make(m, 64, 16);
        kv_config kc;
        fwd_kv_config(m, &d, &kc);
        kc.type = types[i];
        kc.n_seqs = 2;
        kv_plan pl;
        CHECKF(kv_plan_make(&kc, &pl, err, sizeof err) == KV_OK, "%s", err);
        uint64_t want = (uint64_t)((double)sh->n_layer * (double)row * elem[i]);
        CHECKF(pl.bytes_per_token == want, "%s: %llu bytes per token, want %llu", quant_type_name(types[i]),
               (unsigned long long)pl.bytes_per_token, (unsigned long long)want);
        CHECK(pl.data_bytes == (uint64_t)pl.n_tokens * want);
        /* the equivalent multi-head cache: K (nope + rope) and V per head */
        uint64_t mha = (uint64_t)((double)sh->n_layer * sh->H * (sh->nope + sh->rope + sh->vd) * elem[i]);
        CHECK(want < mha);
        if (i < 2) CHECK(model_kv_bytes_per_token(m, (size_t)elem[i]) == want);
    }
    /* Q8_0 latent cache against F32 */
    lm_pool *pool = pool_new(2);
    int32_t toks[9] = {5, 17, 3, 40, 2, 77, 1, 9, 12};
    float *a = malloc(9 * 83 * sizeof(float)), *b = malloc(9 * 83 * sizeof(float));
    lm_seqrun *s1 = seqrun_new(m, pool, 32, 16, LM_TYPE_F32, err, sizeof err);
    lm_seqrun *s2 = seqrun_new(m, pool, 32, 16, LM_TYPE_Q8_0, err, sizeof err);
    CHECKF(s1 && s2, "%s", err);
    CHECK(seqrun_forward(s1, toks, 9, a, true, err, sizeof err) == 0);
    CHECK(seqrun_forward(s2, toks, 9, b, true, err, sizeof err) == 0);
    double *ad = malloc(9 * 83 * sizeof(double));
    for (int i = 0; i < 9 * 83; i++) ad[i] = a[i];
    double e = test_rel_l2(b, ad, 9 * 83);
    free(ad);
    printf("NOTE latent cache Q8_0 vs F32: rel L2 %.2e\n", e);
    CHECKF(e < 2e-2, "Q8_0 cache rel err %.3g", e);
    seqrun_free(s1);
    seqrun_free(s2);
    pool_free(pool);
    free(a);
    free(b);
    model_free(m);
}

/* A sequence's logits bit-identical alone and batched with another; a fork
 * and a prefix-cache hit reproduce a fresh run's logits exactly. */
static void test_batch_fork_prefix(void) {
    char err[LM_ERRLEN];
    lm_status st;
    lm_model *m = make(&V3_Q8, NULL, FAULT_NONE, &st, err, sizeof err);
    CHECKF(m != NULL, "%s", err);
    if (!m) return;
    const int V = V3_Q8.V;
    lm_pool *pool = pool_new(2);
    fwd_dims d = fwd_dims_make(m, 64, 32);
    kv_config kc;
    fwd_kv_config(m, &d, &kc);
    kc.type = LM_TYPE_F16;
    kc.block_size = 4;
    kc.n_seqs = 6;
    kv_pool *kv = kv_pool_new(&kc, err, sizeof err);
    CHECKF(kv != NULL, "%s", err);
    int32_t pa[10] = {3, 14, 15, 9, 26, 5, 35, 8, 9, 7}, pb[7] = {2, 71, 82, 8, 18, 28, 45};
    float *alone = malloc((size_t)V * sizeof(float)), *both = malloc(2 * (size_t)V * sizeof(float));
    /* alone */
    lm_seqrun *ra = seqrun_new_shared(m, pool, kv, 64, 32, err, sizeof err);
    CHECKF(ra != NULL, "%s", err);
    CHECK(seqrun_forward(ra, pa, 10, alone, false, err, sizeof err) == 0);
    /* batched with another sequence in one pass */
    lm_fwd *f = fwd_new(m, pool, kv, &d, err, sizeof err);
    kv_seq *sa = kv_seq_new(kv, err, sizeof err), *sb = kv_seq_new(kv, err, sizeof err);
    CHECK(f && sa && sb);
    CHECK(kv_append(kv, sa, 10, err, sizeof err) == KV_OK && kv_append(kv, sb, 7, err, sizeof err) == KV_OK);
    int32_t flat[17];
    memcpy(flat, pa, sizeof pa);
    memcpy(flat + 10, pb, sizeof pb);
    lm_seg segs[2] = {{.seq = sa, .pos0 = 0, .n = 10, .n_logits = 1}, {.seq = sb, .pos0 = 0, .n = 7, .n_logits = 1}};
    CHECK(fwd_run(f, flat, segs, 2, both, err, sizeof err) == 0);
    CHECK(memcmp(alone, both, (size_t)V * sizeof(float)) == 0);
    /* a decode step of each, batched, against ra's step alone */
    int32_t next[2] = {11, 12};
    CHECK(kv_append(kv, sa, 1, err, sizeof err) == KV_OK && kv_append(kv, sb, 1, err, sizeof err) == KV_OK);
    lm_seg step[2] = {{.seq = sa, .pos0 = 10, .n = 1, .n_logits = 1}, {.seq = sb, .pos0 = 7, .n = 1, .n_logits = 1}};
    CHECK(fwd_run(f, next, step, 2, both, err, sizeof err) == 0);
    lm_seqrun *fork = seqrun_fork(ra, err, sizeof err); /* shares ra's blocks, the last one partial */
    CHECKF(fork != NULL, "%s", err);
    CHECK(seqrun_forward(ra, &next[0], 1, alone, false, err, sizeof err) == 0);
    CHECK(memcmp(alone, both, (size_t)V * sizeof(float)) == 0);
    /* the fork writes its own copy of the shared partial block */
    float *fk = malloc((size_t)V * sizeof(float)), *fresh = malloc((size_t)V * sizeof(float));
    int32_t other = 40;
    CHECK(seqrun_forward(fork, &other, 1, fk, false, err, sizeof err) == 0);
    lm_seqrun *rf = seqrun_new_shared(m, pool, kv, 64, 32, err, sizeof err);
    int32_t pf[11];
    memcpy(pf, pa, sizeof pa);
    pf[10] = other;
    CHECK(rf && seqrun_forward(rf, pf, 11, fresh, false, err, sizeof err) == 0);
    CHECK(memcmp(fk, fresh, (size_t)V * sizeof(float)) == 0);
    kv_stats ks;
    kv_stats_get(kv, &ks);
    CHECK(ks.n_cow >= 1);
    /* prefix cache: ra's full blocks registered, a new sequence takes them */
    seqrun_prefix_commit(rf, pf, 0);
    lm_seqrun *rp = seqrun_new_shared(m, pool, kv, 64, 32, err, sizeof err);
    CHECK(rp != NULL);
    int hit = seqrun_prefix_match(rp, pf, 11, 0);
    CHECKF(hit == 8, "prefix hit %d positions, want 8", hit);
    CHECK(seqrun_forward(rp, pf + hit, 11 - hit, fk, false, err, sizeof err) == 0);
    CHECK(memcmp(fk, fresh, (size_t)V * sizeof(float)) == 0);
    CHECKF(kv_pool_check(kv, err, sizeof err) == KV_OK, "%s", err);
    seqrun_free(rp);
    seqrun_free(rf);
    seqrun_free(fork);
    kv_seq_free(kv, sa);
    kv_seq_free(kv, sb);
    fwd_free(f);
    seqrun_free(ra);
    kv_pool_free(kv);
    pool_free(pool);
    free(alone), free(both), free(fk), free(fresh);
    model_free(m);
}

static void test_refusals(void) {
    struct {
        int fault;
        lm_status want;
        const char *says;
    } cases[] = {
        {FAULT_NO_MLA_KEYS, LM_ERR_UNSUPPORTED, "key_length_mla"},
        {FAULT_KV_B, LM_ERR_UNSUPPORTED, "attn_kv_b"},
        {FAULT_GROUPS, LM_ERR_UNSUPPORTED, "group"},
        {FAULT_YARN, LM_ERR_UNSUPPORTED, "yarn"},
        {FAULT_BAD_KEYLEN, LM_ERR_FORMAT, "kv_lora_rank"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[LM_ERRLEN] = "";
        lm_status st = LM_OK;
        lm_model *m = make(&V2_F32, NULL, cases[i].fault, &st, err, sizeof err);
        CHECKF(m == NULL && st == cases[i].want && strstr(err, cases[i].says), "case %zu: status %d, '%s'", i, (int)st,
               err);
        model_free(m);
    }
    /* no tensor-parallel split */
    snprintf(tmp_path, sizeof tmp_path, "/tmp/lamina_test_mla_%d.gguf", (int)getpid());
    ref_model r;
    CHECK(write_model(&r, &V2_F32, tmp_path, FAULT_NONE) == 0);
    free_ref(&r);
    char err[LM_ERRLEN] = "";
    lm_status st;
    lm_model *m = model_load_tp(tmp_path, NULL, 0, 2, &st, err, sizeof err);
    unlink(tmp_path);
    CHECKF(m == NULL && st == LM_ERR_UNSUPPORTED && strstr(err, "no --tp or --pp split"), "%s", err);
    model_free(m);
}

int main(void) {
    lm_rng_seed(&rng, 21);
    TEST_RUN(test_v3_f32);
    TEST_RUN(test_v2_f32);
    TEST_RUN(test_v3_q8_0);
    TEST_RUN(test_latent_kv_bytes);
    TEST_RUN(test_batch_fork_prefix);
    TEST_RUN(test_refusals);
    return TEST_DONE();
}
