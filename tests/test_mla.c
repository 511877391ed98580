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
 * YaRN (the released DeepSeek files' RoPE scaling): the reference rotates by
 * the YaRN angles and magnitude and scales the scores by deepseek2's
 * mscale², with and without the log multiplier (F32, 1e-5); the angles
 * alone against float64 far past the original context. Older files storing
 * attn_kv_b whole: against the reference, and bit for bit the split
 * layout's logits. The cost model's latent terms against model.c's byte
 * counts; tensor-parallel shards of the latent attention.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/cost.h"
#include "model/forward.h"
#include "model/ops.h"
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
    float yarn, log_mul; /* YaRN factor (0: none) and the file's yarn_log_multiplier (0: none) */
    int yarn_ctx;        /* its original context length */
} shape;

typedef struct {
    double *attn_norm, *ffn_norm, *qa, *qan, *qb, *kva, *kvn, *kb, *vb, *wo;
    double *wg, *wu, *wd;                 /* dense FFN, or the shared expert */
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

/* attn_kv_b of the older layout, (H * (nope + vd), R): per head W_UK_h (the
 * transpose of kb's block h, R rows of nope) then W_UV_h (vb's block h), in
 * `type` (the values kb and vb hold are that type's already, so F32 and F16
 * store them exactly). */
static void add_kv_b(ref_model *r, gguf_writer *w, const char *name, const double *kb, const double *vb,
                     const shape *sh, uint32_t type) {
    int H = sh->H, R = sh->R, np = sh->nope, vd = sh->vd, rows = H * (np + vd);
    size_t rb = quant_row_size(type, R);
    float *row = malloc((size_t)R * sizeof(float));
    char *q = keep(r, malloc(rb * (size_t)rows));
    for (int h = 0; h < H; h++)
        for (int j = 0; j < np + vd; j++) {
            for (int k = 0; k < R; k++)
                row[k] = (float)(j < np ? kb[((size_t)h * R + k) * np + j] : vb[((size_t)h * vd + j - np) * R + k]);
            quant_from_float_ref(type, row, q + rb * (size_t)(h * (np + vd) + j), R);
        }
    free(row);
    uint64_t ne[2] = {(uint64_t)R, (uint64_t)rows};
    gguf_w_add_tensor(w, name, 2, ne, type, q, rb * (size_t)rows);
}

static double *add_vec(ref_model *r, gguf_writer *w, const char *name, int n, float mean, float scale) {
    float *f = keep(r, malloc((size_t)n * sizeof(float)));
    double *d = malloc((size_t)n * sizeof(double));
    for (int i = 0; i < n; i++) d[i] = f[i] = mean + lm_rng_normal(&rng) * scale;
    uint64_t ne[1] = {(uint64_t)n};
    gguf_w_add_tensor(w, name, 1, ne, LM_TYPE_F32, f, (uint64_t)n * 4);
    return d;
}

/* Which metadata or tensor write_model leaves out or changes (refusal
 * tests), or LAYOUT_KV_B: the older layout, attn_kv_b whole (W_UK_h rows then
 * W_UV_h rows per head, the same values as the split tensors) and a head's
 * widths in key_length / value_length, no *_length_mla keys. */
enum { FAULT_NONE, FAULT_NO_MLA_KEYS, LAYOUT_KV_B, FAULT_GROUPS, FAULT_SCALING, FAULT_BAD_KEYLEN, FAULT_HALF_MLA };

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
    gguf_w_set_u32(w, K("attention.head_count_kv"), fault == LAYOUT_KV_B ? (uint32_t)H : 1); /* older files: n_head */
    gguf_w_set_u32(w, K("attention.q_lora_rank"), (uint32_t)sh->q_lora);
    gguf_w_set_u32(w, K("attention.kv_lora_rank"), (uint32_t)R);
    bool whole = fault == LAYOUT_KV_B;
    gguf_w_set_u32(w, K("attention.key_length"), (uint32_t)(whole ? QK : R + sh->rope + (fault == FAULT_BAD_KEYLEN)));
    gguf_w_set_u32(w, K("attention.value_length"), (uint32_t)(whole ? sh->vd : R));
    if (fault != FAULT_NO_MLA_KEYS && !whole) {
        gguf_w_set_u32(w, K("attention.key_length_mla"), (uint32_t)QK);
        if (fault != FAULT_HALF_MLA) gguf_w_set_u32(w, K("attention.value_length_mla"), (uint32_t)sh->vd);
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
    if (fault == FAULT_SCALING) gguf_w_set_str(w, K("rope.scaling.type"), "longrope");
    if (sh->yarn > 0) {
        gguf_w_set_str(w, K("rope.scaling.type"), "yarn");
        gguf_w_set_f32(w, K("rope.scaling.factor"), sh->yarn);
        gguf_w_set_u32(w, K("rope.scaling.original_context_length"), (uint32_t)sh->yarn_ctx);
        if (sh->log_mul > 0) gguf_w_set_f32(w, K("rope.scaling.yarn_log_multiplier"), sh->log_mul);
    }
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
            l->qb =
                add_w(r, w, N("attn_q_b.weight"), 0, H * QK, sh->q_lora, (uint32_t)t, 1.0f / sqrtf((float)sh->q_lora));
        } else {
            l->qb = add_w(r, w, N("attn_q.weight"), 0, H * QK, E, (uint32_t)t, ws);
        }
        l->kva = add_w(r, w, N("attn_kv_a_mqa.weight"), 0, R + sh->rope, E, (uint32_t)t, ws);
        l->kvn = add_vec(r, w, N("attn_kv_a_norm.weight"), R, 1.0f, 0.2f);
        /* the split tensors (drawn the same in both layouts; the older one writes them as attn_kv_b) */
        gguf_writer *kw = whole ? gguf_writer_new() : w;
        l->kb = add_w(r, kw, N("attn_k_b.weight"), H, R, sh->nope, (uint32_t)t, wr * 2);
        l->vb = add_w(r, kw, N("attn_v_b.weight"), H, sh->vd, R, (uint32_t)t, wr);
        if (whole) {
            gguf_writer_free(kw);
            add_kv_b(r, w, N("attn_kv_b.weight"), l->kb, l->vb, sh, (uint32_t)t);
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
        double *all[] = {l->attn_norm, l->ffn_norm, l->qa, l->qan, l->qb,     l->kva,  l->kvn, l->kb, l->vb,
                         l->wo,        l->wg,       l->wu, l->wd,  l->router, l->bias, l->eg,  l->eu, l->ed};
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

/* YaRN in float64 from its definition (the YaRN paper's ramp, as llama.cpp
 * and the released DeepSeek files use it): pair i's angle is the trained
 * one for i <= low, interpolated (divided by the factor) for i >= high,
 * linear between, with low / high the pair indices whose wavelength fits
 * 32 / 1 times in the original context; cos and sin times mag. */
typedef struct {
    double factor, low, high, mag; /* factor 0: no scaling */
} ref_yarn;

static ref_yarn yarn_of(const shape *sh) {
    ref_yarn y = {0, 0, 0, 1};
    if (sh->yarn <= 0) return y;
    double n = sh->rope, two_ln_base = 2 * log(10000.0);
    y.factor = sh->yarn;
    y.low = fmax(0, floor(n * log(sh->yarn_ctx / (32 * 2 * M_PI)) / two_ln_base));
    y.high = fmin(n - 1, ceil(n * log(sh->yarn_ctx / (1 * 2 * M_PI)) / two_ln_base));
    /* with a log multiplier (deepseek2's mscale_all_dim) the rotary magnitudes cancel; without, 1 + 0.1 ln F */
    y.mag = sh->log_mul > 0 ? 1.0 : 1.0 + 0.1 * log(y.factor);
    return y;
}

/* The attention scale: 1/sqrt(qk), times deepseek2's YaRN mscale², mscale =
 * mag * (1 + 0.1 M ln F) with M the file's log multiplier / 0.1 (so mag²
 * without a multiplier: the magnitude then counts on both q and k and in
 * the scale, as llama.cpp computes these files). */
static double ref_kq_scale(const shape *sh) {
    double s = 1.0 / sqrt((double)(sh->nope + sh->rope));
    if (sh->yarn > 0) {
        ref_yarn y = yarn_of(sh);
        double ms = y.mag * (1.0 + 0.1 * (sh->log_mul / 0.1) * log((double)sh->yarn));
        s *= ms * ms;
    }
    return s;
}

/* The angle of pair i of n at pos (base 10000), with y's scaling. */
static double ref_angle(const ref_yarn *y, int n, int i, int pos) {
    double th = pos * pow(10000.0, -2.0 * i / n);
    if (y->factor <= 0) return th;
    double t = (i - y->low) / fmax(y->high - y->low, 0.001), ramp = 1 - fmin(1, fmax(0, t));
    return th / y->factor * (1 - ramp) + th * ramp;
}

/* RoPE on adjacent pairs of n values at pos (base 10000), y's scaling. */
static void rope(double *v, int n, int pos, const ref_yarn *y) {
    for (int i = 0; i < n / 2; i++) {
        double th = ref_angle(y, n, i, pos), c = cos(th) * y->mag, s = sin(th) * y->mag;
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
    double *q = malloc((size_t)T * H * QK * sizeof(double)),
           *qa = malloc((size_t)(sh->q_lora + R + rp) * sizeof(double));
    double *att = malloc((size_t)H * vd * sizeof(double)), *s = malloc((size_t)T * sizeof(double));
    double *kn = malloc((size_t)np * sizeof(double)), *v = malloc((size_t)vd * sizeof(double));
    const ref_yarn yr = yarn_of(sh);
    const double kq = ref_kq_scale(sh);
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
            for (int h = 0; h < H; h++) rope(qt + h * QK + np, rp, t, &yr);
            mv(qa, l->kva, xb, R + rp, E);
            rms(c + (size_t)t * R, qa, l->kvn, R);
            memcpy(kpe + (size_t)t * rp, qa + R, (size_t)rp * sizeof(double));
            rope(kpe + (size_t)t * rp, rp, t, &yr);
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
                    s[j] = d * kq;
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
static const shape V3_F32 = {3, 1,  64, 4,  32,   48,   16,   16,          24, 96, 4,
                             2, 32, 1,  83, true, true, 2.5f, LM_TYPE_F32, 0,  0,  0};
static const shape V2_F32 = {2, 1,  64, 4,  0,     48,    16,   16,          24, 96, 4,
                             2, 32, 2,  83, false, false, 1.0f, LM_TYPE_F32, 0,  0,  0};
static const shape V3_Q8 = {3, 1,  64, 4,  32,   64,   32,   32,           32, 96, 4,
                            2, 32, 1,  83, true, true, 2.5f, LM_TYPE_Q8_0, 0,  0,  0};
static const shape V3_F16 = {3, 1,  64, 4,  32,   48,   16,   16,          24, 96, 4,
                             2, 32, 1,  83, true, true, 2.5f, LM_TYPE_F16, 0,  0,  0};
/* YaRN x4 from 32 positions on 16 rotated dims: pair 0 rotates as trained, pair 1 half way, the rest
 * interpolated; V3's with a log multiplier of 0.1 (mscale_all_dim 1: the attention scale times
 * (1 + 0.1 ln 4)^2), V2's without one (cos and sin times 1 + 0.1 ln 4, and the scale times its square) */
static const shape V3_YARN = {3, 1,  64, 4,  32,   48,   16,   16,          24,   96,   4,
                              2, 32, 1,  83, true, true, 2.5f, LM_TYPE_F32, 4.0f, 0.1f, 32};
static const shape V2_YARN = {2, 1,  64, 4,  0,     48,    16,   16,          24,   96,   4,
                              2, 32, 2,  83, false, false, 1.0f, LM_TYPE_F32, 4.0f, 0.0f, 32};

/* Whole prompt, token by token and an uneven split against the reference,
 * for a file of `layout` (FAULT_NONE or LAYOUT_KV_B). */
static void check_reference_layout(const shape *sh, int threads, int layout) {
    ref_model r;
    char err[LM_ERRLEN];
    lm_status st;
    lm_model *m = make(sh, &r, layout, &st, err, sizeof err);
    CHECKF(m != NULL, "%s", err);
    if (!m) return;
    CHECK(m->hp.kv_lora_rank == sh->R && m->hp.n_head_kv == 1 && m->hp.head_dim == sh->R + sh->rope);
    CHECK(m->hp.qk_nope == sh->nope && m->hp.v_head_dim == sh->vd && (layout == LAYOUT_KV_B) == (m->kb_mem != NULL));
    if (sh->yarn > 0) { /* the ramp's ends, the magnitude and the attention scale as the reference has them */
        ref_yarn y = yarn_of(sh);
        CHECKF(m->hp.rope_yarn && m->hp.yarn_low == (float)y.low && m->hp.yarn_high == (float)y.high &&
                   fabs(m->hp.rope_attn_factor - y.mag) < 1e-6 && fabs(m->hp.attn_scale / ref_kq_scale(sh) - 1) < 1e-6,
               "yarn: low %g high %g (%g %g), magnitude %g (%g), scale %g (%g)", m->hp.yarn_low, m->hp.yarn_high, y.low,
               y.high, m->hp.rope_attn_factor, y.mag, m->hp.attn_scale, ref_kq_scale(sh));
    }
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
        CHECKF(e < bound, "%s q_lora %d: prompt row %d rel err %.3g >= %.3g", quant_type_name(sh->wtype), sh->q_lora, t,
               e, bound);
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
    printf("NOTE deepseek2 %-5s q_lora %2d %s routing%s%s, threads %d: worst rel L2 %.2e (bound %.0e)\n",
           quant_type_name(sh->wtype), sh->q_lora, sh->sigmoid ? "sigmoid+bias" : "softmax",
           sh->yarn > 0 ? ", yarn" : "", layout == LAYOUT_KV_B ? ", attn_kv_b whole" : "", threads, worst, bound);
    seqrun_free(s);
    pool_free(pool);
    model_free(m);
    free(lg);
    free(ref);
    free_ref(&r);
}

static void check_reference(const shape *sh, int threads) { check_reference_layout(sh, threads, FAULT_NONE); }

static void test_v3_f32(void) {
    check_reference(&V3_F32, 1);
    check_reference(&V3_F32, 2);
}
static void test_v2_f32(void) { check_reference(&V2_F32, 2); }
static void test_v3_q8_0(void) { check_reference(&V3_Q8, 2); }
static void test_yarn(void) {
    check_reference(&V3_YARN, 2);
    check_reference(&V2_YARN, 1);
}

/* YaRN's angles (ops_rope_angles_yarn, ops_rope_yarn_dims) against float64
 * from the definition, at positions inside and far past the original
 * context: the ramp's ends are the pair indices whose wavelength fits 32 and
 * 1 times in it (floor, ceil), and every cos / sin within 2e-7 of the
 * magnitude (float rounding of the result; the angle is computed in double). */
static void test_yarn_angles(void) {
    static const struct {
        int n_rot, orig;
        float base, factor;
        double low, high;                             /* worked by hand from the definition */
    } cases[] = {{64, 4096, 10000.0f, 40.0f, 10, 23}, /* DeepSeek-V2/V3 */
                 {32, 256, 10000.0f, 16.0f, 0, 7},    /* mkmodel's deepseek2-small */
                 {128, 32768, 1e6f, 4.0f, 23, 40},    /* Qwen2.5's yarn */
                 {16, 32, 10000.0f, 4.0f, 0, 2}};
    static const int pos[] = {0, 1, 255, 4095, 4096, 40000, 163839};
    float cs[256];
    double worst = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int n = cases[c].n_rot;
        double tl = 2 * log((double)cases[c].base);
        double lo = fmax(0, floor(n * log(cases[c].orig / (32 * 2 * M_PI)) / tl));
        double hi = fmin(n - 1, ceil(n * log(cases[c].orig / (2 * M_PI)) / tl));
        CHECKF(lo == cases[c].low && hi == cases[c].high, "case %zu: the definition gives %g, %g", c, lo, hi);
        float low, high;
        ops_rope_yarn_dims(n, cases[c].orig, cases[c].base, 32.0f, 1.0f, &low, &high);
        CHECKF(low == lo && high == hi, "case %zu: low %g high %g, want %g %g", c, low, high, lo, hi);
        const float mag = 1.25f;
        for (size_t p = 0; p < sizeof pos / sizeof pos[0]; p++) {
            ops_rope_angles_yarn(cs, n, pos[p], cases[c].base, cases[c].factor, low, high, mag);
            for (int i = 0; i < n / 2; i++) {
                double th = pos[p] * pow((double)cases[c].base, -2.0 * i / n);
                double t = (i - lo) / fmax(hi - lo, 0.001), ramp = 1 - fmin(1, fmax(0, t));
                th = th / cases[c].factor * (1 - ramp) + th * ramp;
                double e = fmax(fabs(cs[2 * i] - cos(th) * mag), fabs(cs[2 * i + 1] - sin(th) * mag));
                worst = fmax(worst, e);
                CHECKF(e <= 2e-7 * mag, "case %zu pos %d pair %d: error %.3g", c, pos[p], i, e);
            }
        }
    }
    printf("NOTE yarn angles: worst |cos/sin - float64| %.2e\n", worst);
}

/* Older files with attn_kv_b whole: against the reference (F32), and the
 * same logits bit for bit as the split layout of the same weights (F32 and
 * F16: the transposed W_UKᵀ holds the same values as attn_k_b would). */
static void test_kv_b_whole(void) {
    check_reference_layout(&V2_F32, 2, LAYOUT_KV_B);
    check_reference_layout(&V3_YARN, 1, LAYOUT_KV_B);
    const shape *shapes[2] = {&V3_F32, &V3_F16};
    for (int k = 0; k < 2; k++) {
        const shape *sh = shapes[k];
        enum { T = 9 };
        int32_t toks[T] = {5, 17, 3, 40, 2, 77, 1, 9, 12};
        float *lg[2];
        for (int layout = 0; layout < 2; layout++) {
            char err[LM_ERRLEN];
            lm_status st;
            lm_rng_seed(&rng, 1234);
            lm_model *m = make(sh, NULL, layout ? LAYOUT_KV_B : FAULT_NONE, &st, err, sizeof err);
            CHECKF(m != NULL, "%s", err);
            lg[layout] = calloc((size_t)T * sh->V, sizeof(float));
            if (!m) continue;
            lm_pool *pool = pool_new(2);
            lm_seqrun *s = seqrun_new(m, pool, 32, 16, LM_TYPE_F32, err, sizeof err);
            CHECKF(s && seqrun_forward(s, toks, T, lg[layout], true, err, sizeof err) == 0, "%s", err);
            seqrun_free(s);
            pool_free(pool);
            model_free(m);
        }
        CHECKF(memcmp(lg[0], lg[1], (size_t)T * sh->V * sizeof(float)) == 0, "%s: the two layouts differ",
               quant_type_name(sh->wtype));
        free(lg[0]);
        free(lg[1]);
    }
}

/* The cost model (cost.h) on a loaded deepseek2 model: a decode step at
 * depth d reads (d + 1) x the latent bytes per token and writes one token's,
 * layers x (kv_lora_rank + n_rot) x bytes, and reads the weights model.c
 * counts per token (the latent matrices, the chosen experts) plus the LM
 * head and one embedding row; a prefill of n tokens writes n tokens' rows. */
static void test_cost_latent(void) {
    char err[LM_ERRLEN];
    lm_status st;
    const shape *sh = &V3_F32;
    lm_model *m = make(sh, NULL, FAULT_NONE, &st, err, sizeof err);
    CHECKF(m != NULL, "%s", err);
    if (!m) return;
    const uint32_t types[2] = {LM_TYPE_F32, LM_TYPE_F16};
    const int depths[3] = {0, 7, 1000};
    double wexp = (double)model_layer_bytes_per_token(m, NULL) + (double)m->output.rows * m->output.row_bytes +
        (double)m->tok_embd.row_bytes;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 3; i++) {
            cost_pass c;
            CHECKF(cost_forward(m, types[k], 1, 1, depths[i], &c, err, sizeof err) == 0, "%s", err);
            cost_op t = cost_total(&c);
            size_t eb = k ? 2 : 4;
            double per = (double)model_kv_bytes_per_token(m, eb);
            CHECK(per == (double)sh->n_layer * (sh->R + sh->rope) * eb);
            CHECKF(t.kv_read_bytes == (depths[i] + 1) * per && t.kv_write_bytes == per,
                   "depth %d: read %.0f write %.0f, want %.0f %.0f", depths[i], t.kv_read_bytes, t.kv_write_bytes,
                   (depths[i] + 1) * per, per);
            CHECK(c.kv_row_bytes == (size_t)(sh->R + sh->rope) * eb);
            CHECKF(fabs(t.weight_bytes - wexp) <= 1e-9 * wexp, "weights %.0f, want %.0f", t.weight_bytes, wexp);
            /* attention: 2 (R + r) + 2 R per head and position, per layer */
            double att = (double)sh->n_layer * sh->H * (depths[i] + 1) * (2.0 * (sh->R + sh->rope) + 2.0 * sh->R);
            CHECK(fabs(c.op[LM_PROF_ATTN].flops - att) <= 1e-9 * att);
            CHECK(c.op[LM_PROF_QKV].weight_bytes > 0 && c.op[LM_PROF_WO].weight_bytes > 0);
        }
    cost_pass c;
    CHECK(cost_forward(m, LM_TYPE_F16, 1, 40, 0, &c, err, sizeof err) == 0);
    CHECK(cost_total(&c).kv_write_bytes == 40.0 * (double)model_kv_bytes_per_token(m, 2));
    model_free(m);
}

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
        /* a pipeline stage's share (layer ranges 0-0 and 1-2): one latent row per layer it holds,
         * the stages' pools adding up to the whole pool */
        uint64_t sum = 0;
        for (int stage = 0; stage < 2; stage++) {
            kv_config sc = kc;
            sc.layer0 = stage ? 1 : 0;
            sc.layer1 = stage ? sh->n_layer : 1;
            kv_plan sp;
            CHECKF(kv_plan_make(&sc, &sp, err, sizeof err) == KV_OK, "%s", err);
            uint64_t w1 = (uint64_t)((double)(sc.layer1 - sc.layer0) * (double)row * elem[i]);
            CHECKF(sp.bytes_per_token == w1, "stage %d: %llu bytes per token, want %llu", stage,
                   (unsigned long long)sp.bytes_per_token, (unsigned long long)w1);
            sum += sp.data_bytes;
        }
        CHECK(sum == pl.data_bytes);
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
        /* no _mla keys, so the older layout's widths (a head's key = the latent row), which the split
         * tensors do not have: the first misshapen tensor is named */
        {FAULT_NO_MLA_KEYS, LM_ERR_FORMAT, "blk.0.attn_q.weight' has shape"},
        {FAULT_HALF_MLA, LM_ERR_FORMAT, "come together"},
        {FAULT_GROUPS, LM_ERR_UNSUPPORTED, "group"},
        {FAULT_SCALING, LM_ERR_UNSUPPORTED, "longrope"},
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
    /* tensor-parallel shards: rank 1 of 2 holds heads 2 and 3 (q_b rows, their W_UKᵀ / W_UV, wo's
     * columns of their values) and the whole latent; 3 ranks do not split 4 heads */
    snprintf(tmp_path, sizeof tmp_path, "/tmp/lamina_test_mla_%d.gguf", (int)getpid());
    ref_model r;
    CHECK(write_model(&r, &V2_F32, tmp_path, FAULT_NONE) == 0);
    free_ref(&r);
    char err[LM_ERRLEN] = "";
    lm_status st;
    lm_model *whole = model_load(tmp_path, err, sizeof err);
    lm_model *m = model_load_tp(tmp_path, NULL, 1, 2, &st, err, sizeof err);
    CHECKF(whole && m, "%s", err);
    if (whole && m) {
        const lm_hparams *hp = &m->hp;
        int qk = hp->qk_nope + hp->n_rot;
        const lm_mla *a = m->layers[0].mla, *b = whole->layers[0].mla;
        CHECK(hp->n_head == 2 && hp->n_head_kv == 1 && m->tp.kv_copies == 2 && m->tp.head0 == 2);
        const gguf_tensor *tq = gguf_find_tensor(m->gguf, "blk.0.attn_q.weight");
        CHECK(tq && a->q_b.rows == 2 * qk &&
              (const char *)a->q_b.data == (const char *)tq->data + (size_t)(2 * qk) * b->q_b.row_bytes);
        CHECK(a->kv_a.rows == b->kv_a.rows && a->k_b == m->mla_heads + 2 && a->v_b == m->mla_heads + 4 + 2);
        const gguf_tensor *to = gguf_find_tensor(m->gguf, "blk.0.attn_output.weight");
        CHECK(m->layers[0].wo.cols == 2 * hp->v_head_dim &&
              (const char *)m->layers[0].wo.data == (const char *)to->data + 2 * hp->v_head_dim * sizeof(float));
    }
    model_free(m);
    model_free(whole);
    m = model_load_tp(tmp_path, NULL, 0, 3, &st, err, sizeof err);
    unlink(tmp_path);
    CHECKF(m == NULL && st == LM_ERR_UNSUPPORTED && strstr(err, "heads do not split"), "%s", err);
    model_free(m);
}

int main(void) {
    lm_rng_seed(&rng, 21);
    TEST_RUN(test_v3_f32);
    TEST_RUN(test_v2_f32);
    TEST_RUN(test_v3_q8_0);
    TEST_RUN(test_yarn);
    TEST_RUN(test_yarn_angles);
    TEST_RUN(test_kv_b_whole);
    TEST_RUN(test_cost_latent);
    TEST_RUN(test_latent_kv_bytes);
    TEST_RUN(test_batch_fork_prefix);
    TEST_RUN(test_refusals);
    return TEST_DONE();
}
