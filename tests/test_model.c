/*
 * test_model.c - the forward pass against a naive float64 reference.
 *
 * Random small models are written to GGUF with the project's writer, loaded
 * through the normal path, and their logits compared with a reference
 * forward pass written here in double precision from the dequantized
 * weights (so the bound measures the engine's arithmetic, not the format's
 * rounding). Bounds, relative L2 over a logits row:
 *   F32, BF16 weights (F32 activations):             < 1e-5
 *   BF16 weights on avx512bf16 (BF16 activations):   < 1e-2 (measures 4.8e-3)
 *   F16 weights in panels (AVX2; F32 activations):    < 1e-5
 *   F16 weights row-major (F16 activations, 2^-11):   < 2e-3
 *   Q8_0, Q4_0, MXFP4 weights (Q8_0 activations):    < 5e-2
 * (8-bit activations carry about 0.5% relative error into every product;
 * through two layers of these random models the logits' error measures
 * 1.4e-2 to 2.2e-2.)
 * Covered shapes: MHA, GQA, MQA; tied and untied output; qwen2 (QKV biases,
 * NeoX RoPE); gemma3 (scaled embeddings, Q/K norms, post norms, GELU,
 * a 4-token sliding window on alternate layers with their own RoPE base);
 * several positions; cache decode vs whole-prefix recompute; odd batch
 * splits; gemma3 over a KV pool that releases the local layers' blocks out
 * of the window; qwen3 (Q/K norms, a head width other than n_embd / n_head);
 * gemma2 (soft-capped scores and logits, with caps small enough to bite,
 * alternate windows); phi3 (fused QKV and gate/up, long-rope factors and
 * attention factor, a window on every layer); Mixture-of-Experts: qwen3moe
 * (4 experts, top 2, renormalised), qwen2moe (top 2 of 4 as softmax
 * probabilities, a shared expert behind a sigmoid gate, QKV biases; and
 * with every matrix, experts included, in MXFP4) and
 * Mixtral-style llama, every batch split against the reference, and a
 * sequence's logits bit-identical alone and batched with another; YaRN
 * RoPE scaling on llama and qwen2 (the reference's angles from YaRN's
 * definition, as per-frequency divisors with its magnitude factor).
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
#include "kernels/kernels.h"
#include "test.h"
#include "base/util.h"

typedef struct {
    const char *arch;
    int n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab;
    uint32_t wtype;
    bool tied;
    float yarn; /* YaRN factor from 32 original positions (0: none) */
} shape;

/* Reference weights in double, (rows, cols). */
typedef struct {
    double *attn_norm, *ffn_norm, *wq, *wk, *wv, *wo, *bq, *bk, *bv, *wg, *wu, *wd;
    double *qn, *kn, *pan, *pfn;   /* gemma3: per-head q/k norms, post-attention/FFN norms */
    double *router, *eg, *eu, *ed; /* experts: (X, E); X x (FE, E), (FE, E), (E, FE) */
    double *shg;                   /* qwen2moe: the shared expert's gate (E); wg/wu/wd are the shared expert */
} ref_layer;

typedef struct {
    shape sh;
    int hd;
    double *emb, *out_norm, *out;
    ref_layer *L;
    double rope_base, eps;
    bool gemma; /* gemma3 or gemma2: scaled embeddings, GELU, sliding windows */
    bool qwen3, gemma2, phi3;
    double attn_cap, final_cap;       /* gemma2 soft-caps */
    double *factors, mscale;          /* phi3: per-frequency RoPE divisors (hd / 2), cos/sin scale */
    int window, pattern;              /* sliding window and global-layer period (pattern 0: every layer local) */
    int n_exp, n_used, ff_exp, ff_sh; /* experts (0: dense), chosen per token, widths */
    bool norm_w;                      /* chosen probabilities renormalised */
    double rope_base_swa;
    /* buffers handed to the writer; freed after writing */
    void **blobs;
    int n_blobs;
} ref_model;

static lm_rng rng;

static void *keep(ref_model *r, void *p) {
    r->blobs = realloc(r->blobs, (size_t)(r->n_blobs + 1) * sizeof(void *));
    r->blobs[r->n_blobs++] = p;
    return p;
}

/* Make a random (rows, cols) weight of `type`, add it to the writer, and
 * return its dequantized values in double. */
static double *add_weight(ref_model *r, gguf_writer *w, const char *name, int rows, int cols, uint32_t type,
                          float scale) {
    size_t n = (size_t)rows * cols;
    float *f = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) f[i] = lm_rng_normal(&rng) * scale;
    size_t bytes = quant_row_size(type, cols) * (size_t)rows;
    void *q = keep(r, malloc(bytes));
    for (int i = 0; i < rows; i++)
        quant_from_float_ref(type, f + (size_t)i * cols, (char *)q + quant_row_size(type, cols) * i, cols);
    for (int i = 0; i < rows; i++)
        quant_to_float_ref(type, (char *)q + quant_row_size(type, cols) * i, f + (size_t)i * cols, cols);
    double *d = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) d[i] = f[i];
    free(f);
    uint64_t ne[2] = {(uint64_t)cols, (uint64_t)rows};
    gguf_w_add_tensor(w, name, rows > 1 ? 2 : 1, ne, type, q, bytes);
    return d;
}

static double *add_vec(ref_model *r, gguf_writer *w, const char *name, int n, float mean, float scale) {
    float *f = keep(r, malloc((size_t)n * sizeof(float)));
    double *d = malloc((size_t)n * sizeof(double));
    for (int i = 0; i < n; i++) {
        f[i] = mean + lm_rng_normal(&rng) * scale;
        d[i] = f[i];
    }
    uint64_t ne[1] = {(uint64_t)n};
    gguf_w_add_tensor(w, name, 1, ne, LM_TYPE_F32, f, (uint64_t)n * 4);
    return d;
}

/* n_mat (rows, cols) matrices as one 3-D tensor; their values in double,
 * matrix after matrix. */
static double *add_weight3(ref_model *r, gguf_writer *w, const char *name, int n_mat, int rows, int cols, uint32_t type,
                           float scale) {
    char tmp[80];
    snprintf(tmp, sizeof tmp, "%s.2d", name);
    gguf_writer *scratch = gguf_writer_new(); /* add_weight's tensor goes here and is dropped */
    double *d = add_weight(r, scratch, tmp, n_mat * rows, cols, type, scale);
    gguf_writer_free(scratch);
    /* the bytes add_weight quantized are its last kept blob */
    uint64_t ne[3] = {(uint64_t)cols, (uint64_t)rows, (uint64_t)n_mat};
    gguf_w_add_tensor(w, name, 3, ne, type, r->blobs[r->n_blobs - 1],
                      quant_row_size(type, cols) * (uint64_t)rows * (uint64_t)n_mat);
    return d;
}

/* A copy of rows r0 .. r0+n-1 of a (rows, cols) matrix. */
static double *split_rows(const double *m, int r0, int n, int cols) {
    double *d = malloc((size_t)n * cols * sizeof(double));
    memcpy(d, m + (size_t)r0 * cols, (size_t)n * cols * sizeof(double));
    return d;
}

static int write_model(ref_model *r, const shape *sh, const char *path) {
    memset(r, 0, sizeof *r);
    r->sh = *sh;
    r->hd = sh->n_embd / sh->n_head;
    r->rope_base = 10000.0;
    r->eps = 1e-5;
    r->qwen3 = strcmp(sh->arch, "qwen3") == 0;
    r->gemma2 = strcmp(sh->arch, "gemma2") == 0;
    r->phi3 = strcmp(sh->arch, "phi3") == 0;
    r->mscale = 1.0;
    if (r->qwen3) r->hd = 2 * sh->n_embd / sh->n_head; /* Q wider than the residual, as Qwen3's */
    r->gemma = strcmp(sh->arch, "gemma3") == 0 || r->gemma2;
    bool q3moe = strcmp(sh->arch, "qwen3moe") == 0, q2moe = strcmp(sh->arch, "qwen2moe") == 0;
    bool mixtral = strcmp(sh->arch, "mixtral") == 0;
    if (q3moe || q2moe || mixtral) {
        r->n_exp = 4;
        r->n_used = 2;
        r->ff_exp = mixtral ? sh->n_ff : 32;
        r->ff_sh = q2moe ? 64 : 0;
        r->norm_w = !q2moe;
        r->qwen3 = q3moe;
    }
    const char *farch = mixtral ? "llama" : sh->arch; /* the file's architecture */
    if (r->gemma2) {
        r->rope_base = r->rope_base_swa = 10000.0;
        r->window = 4;
        r->pattern = 2;
        r->attn_cap = 1.5;
        r->final_cap = 3.0;
    } else if (r->phi3) {
        r->window = 6;
        r->pattern = 0;
        r->mscale = 1.19;
    } else if (r->gemma) { /* a window shorter than the test sequence, so it matters */
        r->rope_base = 1e6;
        r->rope_base_swa = 10000.0;
        r->window = 4;
        r->pattern = 2;
    }
    gguf_writer *w = gguf_writer_new();
    char key[128];
#define K(s) (snprintf(key, sizeof key, "%s." s, farch), key)
    gguf_w_set_str(w, "general.architecture", farch);
    gguf_w_set_str(w, "general.name", "test-model");
    gguf_w_set_u32(w, K("block_count"), (uint32_t)sh->n_layer);
    gguf_w_set_u32(w, K("embedding_length"), (uint32_t)sh->n_embd);
    gguf_w_set_u32(w, K("feed_forward_length"), (uint32_t)sh->n_ff);
    gguf_w_set_u32(w, K("attention.head_count"), (uint32_t)sh->n_head);
    gguf_w_set_u32(w, K("attention.head_count_kv"), (uint32_t)sh->n_head_kv);
    gguf_w_set_u32(w, K("context_length"), 64);
    gguf_w_set_f32(w, K("rope.freq_base"), (float)r->rope_base);
    gguf_w_set_f32(w, K("attention.layer_norm_rms_epsilon"), (float)r->eps);
    if (r->gemma && !r->gemma2) {
        gguf_w_set_u32(w, K("attention.sliding_window"), (uint32_t)r->window);
        gguf_w_set_u32(w, K("attention.sliding_window_pattern"), (uint32_t)r->pattern);
        gguf_w_set_f32(w, K("rope.freq_base_swa"), (float)r->rope_base_swa);
    }
    if (r->gemma2) { /* the pattern is gemma2's default, 2 */
        gguf_w_set_u32(w, K("attention.sliding_window"), (uint32_t)r->window);
        gguf_w_set_f32(w, K("attn_logit_softcapping"), (float)r->attn_cap);
        gguf_w_set_f32(w, K("final_logit_softcapping"), (float)r->final_cap);
    }
    if (r->n_exp) {
        gguf_w_set_u32(w, K("expert_count"), (uint32_t)r->n_exp);
        gguf_w_set_u32(w, K("expert_used_count"), (uint32_t)r->n_used);
        if (!mixtral) gguf_w_set_u32(w, K("expert_feed_forward_length"), (uint32_t)r->ff_exp);
        if (r->ff_sh) gguf_w_set_u32(w, K("expert_shared_feed_forward_length"), (uint32_t)r->ff_sh);
    }
    if (r->qwen3) {
        gguf_w_set_u32(w, K("attention.key_length"), (uint32_t)r->hd);
        gguf_w_set_u32(w, K("attention.value_length"), (uint32_t)r->hd);
    }
    if (sh->yarn > 0) { /* YaRN from 32 positions: the reference's divisors and magnitude follow */
        gguf_w_set_str(w, K("rope.scaling.type"), "yarn");
        gguf_w_set_f32(w, K("rope.scaling.factor"), sh->yarn);
        gguf_w_set_u32(w, K("rope.scaling.original_context_length"), 32);
    }
    if (r->phi3) { /* original context 16: the tests' 32-token plans use the long factors */
        gguf_w_set_u32(w, K("attention.sliding_window"), (uint32_t)r->window);
        gguf_w_set_u32(w, K("rope.scaling.original_context_length"), 16);
        gguf_w_set_f32(w, K("rope.scaling.attn_factor"), (float)r->mscale);
    }
#undef K
    int E = sh->n_embd, Q = sh->n_head * r->hd, KV = sh->n_head_kv * r->hd;
    float ws = 1.0f / sqrtf((float)E);
    r->emb = add_weight(r, w, "token_embd.weight", sh->n_vocab, E, sh->wtype, 1.0f);
    r->out_norm = add_vec(r, w, "output_norm.weight", E, 1.0f, 0.1f);
    r->out = sh->tied ? r->emb : add_weight(r, w, "output.weight", sh->n_vocab, E, sh->wtype, ws);
    if (r->phi3) { /* short factors near 1 (unused by 32-token plans), long ones 1 .. 4 */
        double *sf = add_vec(r, w, "rope_factors_short.weight", r->hd / 2, 1.0f, 0.05f);
        free(sf);
        r->factors = malloc((size_t)(r->hd / 2) * sizeof(double));
        float *lf = keep(r, malloc((size_t)(r->hd / 2) * sizeof(float)));
        for (int i = 0; i < r->hd / 2; i++) lf[i] = (float)(r->factors[i] = 1.0 + 3.0 * i / (r->hd / 2));
        uint64_t ne[1] = {(uint64_t)(r->hd / 2)};
        gguf_w_add_tensor(w, "rope_factors_long.weight", 1, ne, LM_TYPE_F32, lf, (uint64_t)(r->hd / 2) * 4);
    }
    if (sh->yarn > 0) { /* YaRN from its definition: pair i's angle is the trained one for i <= low,
                          * divided by the factor for i >= high, linear between; low / high the pairs whose
                          * wavelength fits 32 / 1 times in the original 32 positions; cos, sin x 1 + 0.1 ln F */
        int n = r->hd;
        double lo = fmax(0, floor(n * log(32 / (32 * 2 * M_PI)) / (2 * log(r->rope_base))));
        double hi = fmin(n - 1, ceil(n * log(32 / (2 * M_PI)) / (2 * log(r->rope_base))));
        r->factors = malloc((size_t)(n / 2) * sizeof(double));
        for (int i = 0; i < n / 2; i++) {
            double t = (i - lo) / fmax(hi - lo, 0.001), ramp = 1 - fmin(1, fmax(0, t));
            r->factors[i] = 1.0 / ((1 - ramp) / sh->yarn + ramp);
        }
        r->mscale = 1 + 0.1 * log(sh->yarn);
    }
    r->L = calloc((size_t)sh->n_layer, sizeof(ref_layer));
    bool bias = strcmp(sh->arch, "qwen2") == 0 || q2moe;
    char name[64];
#define N(s) (snprintf(name, sizeof name, "blk.%d." s, i), name)
    for (int i = 0; i < sh->n_layer; i++) {
        ref_layer *l = &r->L[i];
        l->attn_norm = add_vec(r, w, N("attn_norm.weight"), E, 1.0f, 0.1f);
        if (r->phi3) { /* one fused matrix: Q rows, K rows, V rows */
            double *qkv = add_weight(r, w, N("attn_qkv.weight"), Q + 2 * KV, E, sh->wtype, ws);
            l->wq = split_rows(qkv, 0, Q, E);
            l->wk = split_rows(qkv, Q, KV, E);
            l->wv = split_rows(qkv, Q + KV, KV, E);
            free(qkv);
        } else {
            l->wq = add_weight(r, w, N("attn_q.weight"), Q, E, sh->wtype, ws);
            l->wk = add_weight(r, w, N("attn_k.weight"), KV, E, sh->wtype, ws);
            l->wv = add_weight(r, w, N("attn_v.weight"), KV, E, sh->wtype, ws);
        }
        l->wo = add_weight(r, w, N("attn_output.weight"), E, Q, sh->wtype, 1.0f / sqrtf((float)Q));
        if (bias) {
            l->bq = add_vec(r, w, N("attn_q.bias"), Q, 0.0f, 0.1f);
            l->bk = add_vec(r, w, N("attn_k.bias"), KV, 0.0f, 0.1f);
            l->bv = add_vec(r, w, N("attn_v.bias"), KV, 0.0f, 0.1f);
        }
        l->ffn_norm = add_vec(r, w, N("ffn_norm.weight"), E, 1.0f, 0.1f);
        if (r->n_exp) {
            int X = r->n_exp, FE = r->ff_exp;
            l->router = add_weight(r, w, N("ffn_gate_inp.weight"), X, E, LM_TYPE_F32,
                                   6.0f * ws); /* decisive: quantized activations must not flip a near-tie */
            l->eg = add_weight3(r, w, N("ffn_gate_exps.weight"), X, FE, E, sh->wtype, ws);
            l->eu = add_weight3(r, w, N("ffn_up_exps.weight"), X, FE, E, sh->wtype, ws);
            l->ed = add_weight3(r, w, N("ffn_down_exps.weight"), X, E, FE, sh->wtype, 1.0f / sqrtf((float)FE));
            if (r->ff_sh) {
                l->shg = add_vec(r, w, N("ffn_gate_inp_shexp.weight"), E, 0.0f, ws);
                l->wg = add_weight(r, w, N("ffn_gate_shexp.weight"), r->ff_sh, E, sh->wtype, ws);
                l->wu = add_weight(r, w, N("ffn_up_shexp.weight"), r->ff_sh, E, sh->wtype, ws);
                l->wd =
                    add_weight(r, w, N("ffn_down_shexp.weight"), E, r->ff_sh, sh->wtype, 1.0f / sqrtf((float)r->ff_sh));
            }
        } else if (r->phi3) { /* gate rows then up rows */
            double *gu = add_weight(r, w, N("ffn_up.weight"), 2 * sh->n_ff, E, sh->wtype, ws);
            l->wg = split_rows(gu, 0, sh->n_ff, E);
            l->wu = split_rows(gu, sh->n_ff, sh->n_ff, E);
            free(gu);
        } else {
            l->wg = add_weight(r, w, N("ffn_gate.weight"), sh->n_ff, E, sh->wtype, ws);
            l->wu = add_weight(r, w, N("ffn_up.weight"), sh->n_ff, E, sh->wtype, ws);
        }
        if (!r->n_exp)
            l->wd = add_weight(r, w, N("ffn_down.weight"), E, sh->n_ff, sh->wtype, 1.0f / sqrtf((float)sh->n_ff));
        if ((r->gemma && !r->gemma2) || r->qwen3) {
            l->qn = add_vec(r, w, N("attn_q_norm.weight"), r->hd, 1.0f, 0.2f);
            l->kn = add_vec(r, w, N("attn_k_norm.weight"), r->hd, 1.0f, 0.2f);
        }
        if (r->gemma) {
            l->pan = add_vec(r, w, N("post_attention_norm.weight"), E, 1.0f, 0.2f);
            l->pfn = add_vec(r, w, N("post_ffw_norm.weight"), E, 1.0f, 0.2f);
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
    free(r->emb);
    free(r->out_norm);
    free(r->factors);
    if (!r->sh.tied) free(r->out);
    for (int i = 0; i < r->sh.n_layer; i++) {
        ref_layer *l = &r->L[i];
        double *p[] = {l->attn_norm, l->ffn_norm, l->wq, l->wk,  l->wv,  l->wo,     l->bq, l->bk, l->bv, l->wg, l->wu,
                       l->wd,        l->qn,       l->kn, l->pan, l->pfn, l->router, l->eg, l->eu, l->ed, l->shg};
        for (size_t j = 0; j < sizeof p / sizeof p[0]; j++) free(p[j]);
    }
    free(r->L);
}

/* y (rows) = W (rows, cols) x (cols) + b */
static void ref_mv(double *y, const double *W, const double *x, const double *b, int rows, int cols) {
    for (int i = 0; i < rows; i++) {
        double s = b ? b[i] : 0;
        for (int j = 0; j < cols; j++) s += W[(size_t)i * cols + j] * x[j];
        y[i] = s;
    }
}

static void ref_rms(double *y, const double *x, const double *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double sc = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * sc * w[i];
}

static void ref_rope(double *v, int n_heads, int hd, int pos, double base, bool neox, const double *factors,
                     double ms) {
    for (int h = 0; h < n_heads; h++) {
        double *x = v + (size_t)h * hd;
        for (int i = 0; i < hd / 2; i++) {
            double th = pos * pow(base, -2.0 * i / hd) / (factors ? factors[i] : 1.0);
            int a = neox ? i : 2 * i, b = neox ? i + hd / 2 : 2 * i + 1;
            double x0 = x[a], x1 = x[b];
            x[a] = (x0 * cos(th) - x1 * sin(th)) * ms;
            x[b] = (x0 * sin(th) + x1 * cos(th)) * ms;
        }
    }
}

/* y (E) = the Mixture-of-Experts FFN of xb (E). */
static void ref_swiglu_ffn(double *y, const double *wg, const double *wu, const double *wd, const double *xb, int E,
                           int F) {
    double *g = malloc((size_t)F * sizeof(double)), *u = malloc((size_t)F * sizeof(double));
    ref_mv(g, wg, xb, NULL, F, E);
    ref_mv(u, wu, xb, NULL, F, E);
    for (int i = 0; i < F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
    ref_mv(y, wd, g, NULL, E, F);
    free(g), free(u);
}

static void ref_moe(const ref_model *r, const ref_layer *l, const double *xb, double *y) {
    int E = r->sh.n_embd, X = r->n_exp, FE = r->ff_exp;
    double p[16], mx = -INFINITY, sum = 0, *ye = malloc((size_t)E * sizeof(double));
    ref_mv(p, l->router, xb, NULL, X, E);
    for (int e = 0; e < X; e++) mx = p[e] > mx ? p[e] : mx;
    for (int e = 0; e < X; e++) sum += (p[e] = exp(p[e] - mx));
    for (int e = 0; e < X; e++) p[e] /= sum;
    int sel[16];
    double wsum = 0;
    for (int j = 0; j < r->n_used; j++) {
        int best = -1;
        for (int e = 0; e < X; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= sel[i] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        sel[j] = best;
        wsum += p[best];
    }
    for (int i = 0; i < E; i++) y[i] = 0;
    for (int j = 0; j < r->n_used; j++) {
        int e = sel[j];
        ref_swiglu_ffn(ye, l->eg + (size_t)e * FE * E, l->eu + (size_t)e * FE * E, l->ed + (size_t)e * E * FE, xb, E,
                       FE);
        double wt = r->norm_w ? p[e] / wsum : p[e];
        for (int i = 0; i < E; i++) y[i] += wt * ye[i];
    }
    if (l->shg) {
        double d = 0;
        for (int i = 0; i < E; i++) d += l->shg[i] * xb[i];
        ref_swiglu_ffn(ye, l->wg, l->wu, l->wd, xb, E, r->ff_sh);
        for (int i = 0; i < E; i++) y[i] += ye[i] / (1 + exp(-d));
    }
    free(ye);
}

/* Reference logits for every position of tokens[0..T), (T, n_vocab). */
static double *ref_forward(const ref_model *r, const int32_t *tokens, int T) {
    const shape *sh = &r->sh;
    int E = sh->n_embd, hd = r->hd, Q = sh->n_head * hd, KV = sh->n_head_kv * hd, F = sh->n_ff;
    bool neox = strcmp(sh->arch, "qwen2") == 0 || strcmp(sh->arch, "qwen2moe") == 0 || r->gemma || r->qwen3 || r->phi3;
    double *x = calloc((size_t)T * E, sizeof(double)), *xb = malloc((size_t)E * sizeof(double));
    double *q = malloc((size_t)T * Q * sizeof(double)), *k = malloc((size_t)T * KV * sizeof(double));
    double *v = malloc((size_t)T * KV * sizeof(double)), *att = malloc((size_t)Q * sizeof(double));
    double *tmp = malloc((size_t)(E > F ? E : F) * sizeof(double)), *g = malloc((size_t)F * sizeof(double));
    double *u = malloc((size_t)F * sizeof(double)), *sc = malloc((size_t)T * sizeof(double));
    double *logits = malloc((size_t)T * sh->n_vocab * sizeof(double));
    for (int t = 0; t < T; t++)
        for (int i = 0; i < E; i++)
            x[(size_t)t * E + i] = r->emb[(size_t)tokens[t] * E + i] * (r->gemma ? sqrt((double)E) : 1.0);
    for (int li = 0; li < sh->n_layer; li++) {
        const ref_layer *l = &r->L[li];
        bool local = r->window > 0 && (r->pattern == 0 || (li + 1) % r->pattern != 0);
        double base = local && !r->phi3 ? r->rope_base_swa : r->rope_base;
        for (int t = 0; t < T; t++) {
            ref_rms(xb, x + (size_t)t * E, l->attn_norm, E, r->eps);
            ref_mv(q + (size_t)t * Q, l->wq, xb, l->bq, Q, E);
            ref_mv(k + (size_t)t * KV, l->wk, xb, l->bk, KV, E);
            ref_mv(v + (size_t)t * KV, l->wv, xb, l->bv, KV, E);
            if (l->qn)
                for (int h = 0; h < sh->n_head; h++)
                    ref_rms(q + (size_t)t * Q + h * hd, q + (size_t)t * Q + h * hd, l->qn, hd, r->eps);
            if (l->kn)
                for (int h = 0; h < sh->n_head_kv; h++)
                    ref_rms(k + (size_t)t * KV + h * hd, k + (size_t)t * KV + h * hd, l->kn, hd, r->eps);
            ref_rope(q + (size_t)t * Q, sh->n_head, hd, t, base, neox, r->factors, r->mscale);
            ref_rope(k + (size_t)t * KV, sh->n_head_kv, hd, t, base, neox, r->factors, r->mscale);
        }
        double *xn = malloc((size_t)T * E * sizeof(double));
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < sh->n_head; h++) {
                int kh = h / (sh->n_head / sh->n_head_kv);
                double mx = -INFINITY, sum = 0;
                int p0 = local && t + 1 > r->window ? t + 1 - r->window : 0;
                for (int p = 0; p < p0; p++) sc[p] = 0; /* outside the window: weight 0 */
                for (int p = p0; p <= t; p++) {
                    double d = 0;
                    for (int i = 0; i < hd; i++) d += q[(size_t)t * Q + h * hd + i] * k[(size_t)p * KV + kh * hd + i];
                    sc[p] = d / sqrt((double)hd);
                    if (r->attn_cap > 0) sc[p] = r->attn_cap * tanh(sc[p] / r->attn_cap);
                    if (sc[p] > mx) mx = sc[p];
                }
                for (int p = p0; p <= t; p++) sum += (sc[p] = exp(sc[p] - mx));
                for (int i = 0; i < hd; i++) {
                    double o = 0;
                    for (int p = 0; p <= t; p++) o += sc[p] / sum * v[(size_t)p * KV + kh * hd + i];
                    att[h * hd + i] = o;
                }
            }
            ref_mv(tmp, l->wo, att, NULL, E, Q);
            if (l->pan) ref_rms(tmp, tmp, l->pan, E, r->eps);
            for (int i = 0; i < E; i++) xn[(size_t)t * E + i] = x[(size_t)t * E + i] + tmp[i];
            ref_rms(xb, xn + (size_t)t * E, l->ffn_norm, E, r->eps);
            if (r->n_exp) {
                ref_moe(r, l, xb, tmp);
                for (int i = 0; i < E; i++) xn[(size_t)t * E + i] += tmp[i];
                continue;
            }
            ref_mv(g, l->wg, xb, NULL, F, E);
            ref_mv(u, l->wu, xb, NULL, F, E);
            for (int i = 0; i < F; i++) {
                double a = g[i];
                g[i] = r->gemma ? 0.5 * a * (1 + tanh(sqrt(2 / M_PI) * (a + 0.044715 * a * a * a))) * u[i]
                                : a / (1 + exp(-a)) * u[i];
            }
            ref_mv(tmp, l->wd, g, NULL, E, F);
            if (l->pfn) ref_rms(tmp, tmp, l->pfn, E, r->eps);
            for (int i = 0; i < E; i++) xn[(size_t)t * E + i] += tmp[i];
        }
        memcpy(x, xn, (size_t)T * E * sizeof(double));
        free(xn);
    }
    for (int t = 0; t < T; t++) {
        ref_rms(xb, x + (size_t)t * E, r->out_norm, E, r->eps);
        ref_mv(logits + (size_t)t * sh->n_vocab, r->out, xb, NULL, sh->n_vocab, E);
        if (r->final_cap > 0)
            for (int i = 0; i < sh->n_vocab; i++)
                logits[(size_t)t * sh->n_vocab + i] =
                    r->final_cap * tanh(logits[(size_t)t * sh->n_vocab + i] / r->final_cap);
    }
    free(x), free(xb), free(q), free(k), free(v), free(att), free(tmp), free(g), free(u), free(sc);
    return logits;
}

static double bound_for(uint32_t type) {
    if (type == LM_TYPE_F16) return kernels_type(type)->packed_gemm ? 1e-5 : 2e-3;
    if (type == LM_TYPE_BF16 && kernels()->isa == LM_ISA_AVX512BF16) return 1e-2; /* activations in BF16 */
    return type == LM_TYPE_Q8_0 || type == LM_TYPE_Q4_0 || type == LM_TYPE_MXFP4 ? 5e-2 : 1e-5;
}

static char tmp_path[256];

/* Full check of one shape: batch prefill with all logits, token-by-token
 * decode, and an uneven split, each against the reference. */
static void check_shape(const shape *sh, int threads) {
    ref_model r;
    snprintf(tmp_path, sizeof tmp_path, "/tmp/lamina_test_model_%d.gguf", (int)getpid());
    CHECK(write_model(&r, sh, tmp_path) == 0);
    char err[LM_ERRLEN];
    lm_model *m = model_load(tmp_path, err, sizeof err);
    unlink(tmp_path);
    CHECKF(m != NULL, "%s", err);
    CHECK(m->hp.tied_output == sh->tied);
    enum { T = 11 };
    int32_t toks[T];
    for (int i = 0; i < T; i++) toks[i] = (int32_t)(lm_rng_u64(&rng) % (uint64_t)sh->n_vocab);
    double *ref = ref_forward(&r, toks, T);
    int V = sh->n_vocab;
    float *lg = malloc((size_t)T * V * sizeof(float));
    lm_pool *pool = pool_new(threads);
    lm_seqrun *st = seqrun_new(m, pool, 32, 4, LM_TYPE_F32, err, sizeof err); /* passes of 4 tokens */
    CHECKF(st != NULL, "%s", err);
    double bound = bound_for(sh->wtype), worst = 0;

    /* 1. whole prompt at once, every row */
    CHECK(seqrun_forward(st, toks, T, lg, true, err, sizeof err) == 0);
    for (int t = 0; t < T; t++) {
        double e = test_rel_l2(lg + (size_t)t * V, ref + (size_t)t * V, (size_t)V);
        if (e > worst) worst = e;
        CHECKF(e < bound, "%s %s L%d H%d/%d %s: batch row %d rel err %.3g >= %.3g", sh->arch,
               quant_type_name(sh->wtype), sh->n_layer, sh->n_head, sh->n_head_kv, sh->tied ? "tied" : "untied", t, e,
               bound);
    }
    /* 2. one token at a time through the cache */
    seqrun_reset(st);
    for (int t = 0; t < T; t++) {
        CHECK(seqrun_forward(st, toks + t, 1, lg, false, err, sizeof err) == 0);
        double e = test_rel_l2(lg, ref + (size_t)t * V, (size_t)V);
        CHECKF(e < bound, "decode position %d rel err %.3g", t, e);
    }
    /* 3. uneven split 3 + 1 + 7: last-row logits of each call */
    seqrun_reset(st);
    int splits[3] = {3, 1, 7}, pos = 0;
    for (int i = 0; i < 3; i++) {
        CHECK(seqrun_forward(st, toks + pos, splits[i], lg, false, err, sizeof err) == 0);
        pos += splits[i];
        double e = test_rel_l2(lg, ref + (size_t)(pos - 1) * V, (size_t)V);
        CHECKF(e < bound, "split ending at %d rel err %.3g", pos, e);
    }
    /* running past the context is an error that leaves the sequence usable */
    CHECK(seqrun_forward(st, toks, 32, lg, false, err, sizeof err) != 0);
    CHECK(strstr(err, "context") != NULL);
    CHECK(st->n_past == T);
    int32_t bad = (int32_t)V;
    CHECK(seqrun_forward(st, &bad, 1, lg, false, err, sizeof err) != 0);
    printf("NOTE %s %-5s L%d H%d/%d %-6s threads %d: worst rel L2 %.2e (bound %.0e)\n", sh->arch,
           quant_type_name(sh->wtype), sh->n_layer, sh->n_head, sh->n_head_kv, sh->tied ? "tied" : "untied", threads,
           worst, bound);
    seqrun_free(st);
    pool_free(pool);
    model_free(m);
    free(lg);
    free(ref);
    free_ref(&r);
}

#define SHAPE_TEST(fn, ...)                                                                                            \
    static void fn(void) {                                                                                             \
        shape sh = {__VA_ARGS__, 0.0f};                                                                                \
        check_shape(&sh, 1);                                                                                           \
        if (!test_cur_failed_) check_shape(&sh, 2);                                                                    \
    }

/* arch, layers, embd, heads, kv heads, ff, vocab, type, tied */
SHAPE_TEST(test_llama_mha_f32, "llama", 2, 64, 4, 4, 96, 83, LM_TYPE_F32, false)
SHAPE_TEST(test_llama_gqa_f32_tied, "llama", 2, 64, 8, 2, 96, 83, LM_TYPE_F32, true)
SHAPE_TEST(test_llama_mqa_f32, "llama", 2, 64, 4, 1, 96, 83, LM_TYPE_F32, false)
SHAPE_TEST(test_qwen2_gqa_f32, "qwen2", 2, 64, 4, 2, 96, 83, LM_TYPE_F32, false)
SHAPE_TEST(test_qwen2_mqa_f32_tied, "qwen2", 2, 64, 4, 1, 96, 83, LM_TYPE_F32, true)
SHAPE_TEST(test_llama_gqa_f16, "llama", 2, 64, 4, 2, 96, 83, LM_TYPE_F16, false)
SHAPE_TEST(test_llama_gqa_bf16, "llama", 2, 64, 4, 2, 96, 83, LM_TYPE_BF16, true)
SHAPE_TEST(test_llama_gqa_q8_0, "llama", 2, 64, 4, 2, 96, 83, LM_TYPE_Q8_0, false)
SHAPE_TEST(test_llama_mha_q4_0, "llama", 2, 64, 4, 4, 96, 83, LM_TYPE_Q4_0, true)
SHAPE_TEST(test_qwen2_gqa_q4_0, "qwen2", 2, 64, 4, 2, 96, 83, LM_TYPE_Q4_0, false)
SHAPE_TEST(test_gemma3_mqa_f32, "gemma3", 4, 64, 4, 1, 96, 83, LM_TYPE_F32, true)
SHAPE_TEST(test_gemma3_gqa_q8_0, "gemma3", 4, 64, 4, 2, 96, 83, LM_TYPE_Q8_0, true)
SHAPE_TEST(test_qwen3_gqa_f32, "qwen3", 2, 64, 4, 2, 96, 83, LM_TYPE_F32, true)
SHAPE_TEST(test_qwen3_gqa_q8_0, "qwen3", 2, 64, 4, 2, 96, 83, LM_TYPE_Q8_0, false)
SHAPE_TEST(test_gemma2_gqa_f32, "gemma2", 4, 64, 4, 2, 96, 83, LM_TYPE_F32, true)
SHAPE_TEST(test_gemma2_gqa_q8_0, "gemma2", 4, 64, 4, 2, 96, 83, LM_TYPE_Q8_0, true)
SHAPE_TEST(test_phi3_mha_f32, "phi3", 2, 64, 4, 4, 96, 83, LM_TYPE_F32, false)
SHAPE_TEST(test_phi3_gqa_q8_0, "phi3", 2, 64, 4, 2, 96, 83, LM_TYPE_Q8_0, false)
SHAPE_TEST(test_qwen3moe_f32, "qwen3moe", 2, 64, 4, 2, 96, 83, LM_TYPE_F32, false)
SHAPE_TEST(test_qwen3moe_q8_0, "qwen3moe", 2, 64, 4, 2, 96, 83, LM_TYPE_Q8_0, true)
SHAPE_TEST(test_qwen2moe_f32, "qwen2moe", 2, 64, 4, 2, 96, 83, LM_TYPE_F32, false)
SHAPE_TEST(test_qwen2moe_q4_0, "qwen2moe", 2, 64, 4, 2, 96, 83, LM_TYPE_Q4_0, false)
SHAPE_TEST(test_qwen3moe_mxfp4, "qwen3moe", 2, 64, 4, 2, 96, 83, LM_TYPE_MXFP4, false)
SHAPE_TEST(test_mixtral_f16, "mixtral", 2, 64, 4, 2, 96, 83, LM_TYPE_F16, false)
/* YaRN x4 on llama (adjacent pairs) and qwen2 (halves): 16 rotated dims, pair 0 as trained, pair 1 half way */
static void check_yarn(shape sh) {
    sh.yarn = 4.0f;
    check_shape(&sh, 1);
    if (!test_cur_failed_) check_shape(&sh, 2);
}
static void test_llama_yarn_f32(void) { check_yarn((shape){"llama", 2, 64, 4, 2, 96, 83, LM_TYPE_F32, false, 0}); }
static void test_qwen2_yarn_q8_0(void) { check_yarn((shape){"qwen2", 2, 64, 4, 2, 96, 83, LM_TYPE_Q8_0, false, 0}); }
/* feed_forward_length narrower than the embedding (it only sizes a dense
 * FFN, which an MoE model has not): the workspace must still hold n_embd */
SHAPE_TEST(test_qwen3moe_narrow_ff, "qwen3moe", 2, 64, 4, 2, 32, 83, LM_TYPE_F32, false)

/* MoE batch invariance: a sequence's logits are bit-identical whether its
 * tokens run alone or in one pass with another sequence's (whose tokens
 * choose other experts too), for a prompt and for a decode step. */
static void test_moe_batch_invariance(void) {
    shape sh = {"qwen2moe", 2, 64, 4, 2, 96, 83, LM_TYPE_Q8_0, false, 0};
    ref_model r;
    snprintf(tmp_path, sizeof tmp_path, "/tmp/lamina_test_model_%d.gguf", (int)getpid());
    CHECK(write_model(&r, &sh, tmp_path) == 0);
    free_ref(&r);
    char err[LM_ERRLEN];
    lm_model *m = model_load(tmp_path, err, sizeof err);
    unlink(tmp_path);
    CHECKF(m != NULL, "%s", err);
    lm_pool *pool = pool_new(2);
    fwd_dims d = fwd_dims_make(m, 32, 16);
    kv_config kc;
    fwd_kv_config(m, &d, &kc);
    kc.type = LM_TYPE_F32;
    kc.n_seqs = 3;
    kv_pool *kv = kv_pool_new(&kc, err, sizeof err);
    CHECKF(kv != NULL, "%s", err);
    lm_fwd *f = fwd_new(m, pool, kv, &d, err, sizeof err);
    CHECKF(f != NULL, "%s", err);
    int V = m->hp.n_vocab;
    int32_t toks[12];
    for (int i = 0; i < 12; i++) toks[i] = (int32_t)(lm_rng_u64(&rng) % (uint64_t)V);
    float *alone = malloc((size_t)12 * V * 4), *both = malloc((size_t)12 * V * 4);
    /* a: 7 tokens alone */
    kv_seq *a = kv_seq_new(kv, err, sizeof err);
    CHECK(a && kv_append(kv, a, 7, err, sizeof err) == KV_OK);
    lm_seg s1 = {.seq = a, .pos0 = 0, .n = 7, .n_logits = 7};
    CHECKF(fwd_run(f, toks, &s1, 1, alone, err, sizeof err) == 0, "%s", err);
    int32_t next = toks[11];
    CHECK(kv_append(kv, a, 1, err, sizeof err) == KV_OK);
    lm_seg s1d = {.seq = a, .pos0 = 7, .n = 1, .n_logits = 1};
    CHECKF(fwd_run(f, &next, &s1d, 1, alone + (size_t)7 * V, err, sizeof err) == 0, "%s", err);
    /* a again, after b's 5 tokens in the same pass, then both decode together */
    kv_seq *a2 = kv_seq_new(kv, err, sizeof err), *b = kv_seq_new(kv, err, sizeof err);
    CHECK(a2 && b && kv_append(kv, b, 5, err, sizeof err) == KV_OK && kv_append(kv, a2, 7, err, sizeof err) == KV_OK);
    int32_t flat[12];
    memcpy(flat, toks + 7, 5 * sizeof(int32_t));
    memcpy(flat + 5, toks, 7 * sizeof(int32_t));
    lm_seg s2[2] = {{.seq = b, .pos0 = 0, .n = 5, .n_logits = 5}, {.seq = a2, .pos0 = 0, .n = 7, .n_logits = 7}};
    CHECKF(fwd_run(f, flat, s2, 2, both, err, sizeof err) == 0, "%s", err);
    CHECK(memcmp(alone, both + (size_t)5 * V, (size_t)7 * V * 4) == 0);
    CHECK(kv_append(kv, b, 1, err, sizeof err) == KV_OK && kv_append(kv, a2, 1, err, sizeof err) == KV_OK);
    int32_t dec[2] = {toks[3], next};
    lm_seg s2d[2] = {{.seq = b, .pos0 = 5, .n = 1, .n_logits = 1}, {.seq = a2, .pos0 = 7, .n = 1, .n_logits = 1}};
    CHECKF(fwd_run(f, dec, s2d, 2, both, err, sizeof err) == 0, "%s", err);
    CHECK(memcmp(alone + (size_t)7 * V, both + V, (size_t)V * 4) == 0);
    kv_seq_free(kv, a);
    kv_seq_free(kv, a2);
    kv_seq_free(kv, b);
    fwd_free(f);
    kv_pool_free(kv);
    pool_free(pool);
    model_free(m);
    free(alone);
    free(both);
}

/* gemma3 over a pool that releases local blocks out of the window (block 3
 * positions, window 4, appends of at most 4): 40 positions, ten windows,
 * prefilled in batches of 4 and decoded token by token, against the float64
 * reference at every position. */
static void test_gemma3_window_blocks(void) {
    shape sh = {"gemma3", 4, 64, 4, 2, 96, 83, LM_TYPE_F32, true, 0};
    ref_model r;
    snprintf(tmp_path, sizeof tmp_path, "/tmp/lamina_test_model_%d.gguf", (int)getpid());
    CHECK(write_model(&r, &sh, tmp_path) == 0);
    char err[LM_ERRLEN];
    lm_model *m = model_load(tmp_path, err, sizeof err);
    unlink(tmp_path);
    CHECKF(m != NULL, "%s", err);
    enum { T = 40 };
    int32_t toks[T];
    for (int i = 0; i < T; i++) toks[i] = (int32_t)(lm_rng_u64(&rng) % (uint64_t)sh.n_vocab);
    double *ref = ref_forward(&r, toks, T);
    int V = sh.n_vocab;
    float *lg = malloc((size_t)T * V * sizeof(float));
    lm_pool *pool = pool_new(2);
    kv_config kc;
    fwd_dims d = fwd_dims_make(m, 64, 4);
    fwd_kv_config(m, &d, &kc);
    kc.type = LM_TYPE_F32;
    kc.block_size = 3;
    kv_pool *kv = kv_pool_new(&kc, err, sizeof err);
    CHECKF(kv && kv_pool_window(kv) == 4, "%s", err);
    lm_seqrun *st = seqrun_new_shared(m, pool, kv, 64, 4, err, sizeof err);
    CHECKF(st != NULL, "%s", err);
    double worst = 0;
    CHECK(seqrun_forward(st, toks, T, lg, true, err, sizeof err) == 0);
    for (int t = 0; t < T; t++) {
        double e = test_rel_l2(lg + (size_t)t * V, ref + (size_t)t * V, (size_t)V);
        worst = e > worst ? e : worst;
        CHECKF(e < 1e-5, "batch row %d rel err %.3g", t, e);
    }
    seqrun_reset(st);
    for (int t = 0; t < T; t++) {
        CHECK(seqrun_forward(st, toks + t, 1, lg, false, err, sizeof err) == 0);
        double e = test_rel_l2(lg, ref + (size_t)t * V, (size_t)V);
        worst = e > worst ? e : worst;
        CHECKF(e < 1e-5, "decode position %d rel err %.3g", t, e);
    }
    int held = kv_seq_held(st->seq, KV_LOCAL), nb = kv_seq_held(st->seq, KV_GLOBAL);
    CHECKF(held <= 3 && nb == (T + 2) / 3, "%d local, %d global blocks", held, nb);
    printf("NOTE gemma3 window 4, block 3: %d positions in %d global and %d local blocks, worst rel L2 %.2e\n", T, nb,
           held, worst);
    seqrun_free(st);
    kv_pool_free(kv);
    pool_free(pool);
    model_free(m);
    free(lg);
    free(ref);
    free_ref(&r);
}

/* Loading refuses what it cannot run, by name. */
static void test_refuses_unknown_arch(void) {
    gguf_writer *w = gguf_writer_new();
    gguf_w_set_str(w, "general.architecture", "mamba");
    float z[32] = {0};
    uint64_t ne[2] = {32, 1};
    gguf_w_add_tensor(w, "token_embd.weight", 2, ne, LM_TYPE_F32, z, sizeof z);
    snprintf(tmp_path, sizeof tmp_path, "/tmp/lamina_test_arch_%d.gguf", (int)getpid());
    char err[LM_ERRLEN];
    CHECK(gguf_writer_write(w, tmp_path, err, sizeof err) == 0);
    gguf_writer_free(w);
    lm_model *m = model_load(tmp_path, err, sizeof err);
    unlink(tmp_path);
    CHECK(m == NULL);
    CHECKF(strstr(err, "mamba") != NULL, "%s", err);
}

/* Write a model of shape sh, then a copy without tensor `drop` (NULL: none),
 * and load the copy: the model, or NULL with err. */
static lm_model *load_without(const shape *sh, const char *drop, char *err, size_t errlen) {
    ref_model r;
    snprintf(tmp_path, sizeof tmp_path, "/tmp/lamina_test_ok_%d.gguf", (int)getpid());
    if (write_model(&r, sh, tmp_path) != 0) return lm_err(err, errlen, "cannot write the model"), NULL;
    free_ref(&r);
    gguf_ctx *g = gguf_open(tmp_path, err, errlen);
    if (!g) return NULL;
    gguf_writer *w = gguf_writer_new();
    for (int64_t i = 0; i < gguf_n_kv(g); i++) gguf_w_copy_kv(w, g, i);
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        if (drop && strcmp(t->name, drop) == 0) continue;
        gguf_w_add_tensor(w, t->name, t->n_dims, t->ne, t->type, t->data, t->nbytes);
    }
    char path2[300];
    snprintf(path2, sizeof path2, "%s.2", tmp_path);
    int rc = gguf_writer_write(w, path2, err, errlen);
    gguf_writer_free(w);
    gguf_close(g);
    unlink(tmp_path);
    lm_model *m = rc == 0 ? model_load(path2, err, errlen) : NULL;
    unlink(path2);
    return m;
}

static void test_refuses_missing_tensor(void) {
    shape sh = {"llama", 1, 32, 2, 2, 32, 40, LM_TYPE_F32, true, 0};
    char err[LM_ERRLEN];
    lm_model *m = load_without(&sh, "blk.0.ffn_up.weight", err, sizeof err);
    CHECK(m == NULL);
    CHECKF(strstr(err, "blk.0.ffn_up.weight") != NULL, "%s", err);
}

/* The one table of a layer's tensors: model_layer_matrices gives wq, wk, wv,
 * wo, w_gate, w_up, w_down in that order; every tensor of a layer that the
 * architecture requires (all of them for qwen2 and gemma3) is refused by
 * name when missing, and llama's absent biases are optional. */
static void test_layer_tensor_table(void) {
    static const char *const names[] = {
        "attn_norm.weight",     "attn_q.weight",      "attn_k.weight",
        "attn_v.weight",        "attn_output.weight", "attn_q.bias",
        "attn_k.bias",          "attn_v.bias",        "ffn_norm.weight",
        "ffn_gate.weight",      "ffn_up.weight",      "ffn_down.weight",
        "attn_q_norm.weight",   "attn_k_norm.weight", "post_attention_norm.weight",
        "post_ffw_norm.weight",
    };
    shape shapes[2] = {{"qwen2", 2, 32, 2, 2, 32, 40, LM_TYPE_F32, false, 0},
                       {"gemma3", 2, 32, 2, 1, 32, 40, LM_TYPE_F32, true, 0}};
    char err[LM_ERRLEN], name[64];
    for (int si = 0; si < 2; si++) {
        lm_model *m = load_without(&shapes[si], NULL, err, sizeof err);
        CHECKF(m != NULL, "%s", err);
        if (!m) continue;
        for (int li = 0; li < m->hp.n_layer; li++) {
            const lm_layer *l = &m->layers[li];
            const lm_weight *ws[MODEL_LAYER_MATRICES];
            model_layer_matrices(l, ws);
            const lm_weight *want[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up, &l->w_down};
            CHECK(MODEL_LAYER_MATRICES == sizeof want / sizeof want[0]);
            for (int k = 0; k < MODEL_LAYER_MATRICES; k++) CHECKF(ws[k] == want[k], "layer %d matrix %d", li, k);
        }
        model_free(m);
        bool gemma = si == 1;
        for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
            bool bias = strstr(names[k], ".bias") != NULL;
            bool gemma_only = k >= 12;
            if ((gemma && bias) || (!gemma && gemma_only)) continue; /* not in this file */
            snprintf(name, sizeof name, "blk.1.%s", names[k]);
            m = load_without(&shapes[si], name, err, sizeof err);
            CHECKF(m == NULL && strstr(err, name), "%s without %s: %s", shapes[si].arch, name, m ? "loaded" : err);
            model_free(m);
        }
    }
    /* llama: biases optional (none written), every other tensor required */
    shape ll = {"llama", 1, 32, 2, 2, 32, 40, LM_TYPE_F32, true, 0};
    lm_model *m = load_without(&ll, NULL, err, sizeof err);
    CHECKF(m != NULL && !m->layers[0].bq && !m->layers[0].q_norm, "%s", err);
    model_free(m);
}

int main(void) {
    kernels_init();
    lm_rng_seed(&rng, 1234);
    TEST_RUN(test_llama_mha_f32);
    TEST_RUN(test_llama_gqa_f32_tied);
    TEST_RUN(test_llama_mqa_f32);
    TEST_RUN(test_qwen2_gqa_f32);
    TEST_RUN(test_qwen2_mqa_f32_tied);
    TEST_RUN(test_llama_gqa_f16);
    TEST_RUN(test_llama_gqa_bf16);
    TEST_RUN(test_llama_gqa_q8_0);
    TEST_RUN(test_llama_mha_q4_0);
    TEST_RUN(test_qwen2_gqa_q4_0);
    TEST_RUN(test_gemma3_mqa_f32);
    TEST_RUN(test_gemma3_gqa_q8_0);
    TEST_RUN(test_gemma3_window_blocks);
    TEST_RUN(test_refuses_unknown_arch);
    TEST_RUN(test_refuses_missing_tensor);
    TEST_RUN(test_layer_tensor_table);
    TEST_RUN(test_qwen3_gqa_f32);
    TEST_RUN(test_qwen3_gqa_q8_0);
    TEST_RUN(test_gemma2_gqa_f32);
    TEST_RUN(test_gemma2_gqa_q8_0);
    TEST_RUN(test_phi3_mha_f32);
    TEST_RUN(test_phi3_gqa_q8_0);
    TEST_RUN(test_llama_yarn_f32);
    TEST_RUN(test_qwen2_yarn_q8_0);
    TEST_RUN(test_qwen3moe_f32);
    TEST_RUN(test_qwen3moe_q8_0);
    TEST_RUN(test_qwen2moe_f32);
    TEST_RUN(test_qwen2moe_q4_0);
    TEST_RUN(test_qwen3moe_mxfp4);
    TEST_RUN(test_mixtral_f16);
    TEST_RUN(test_qwen3moe_narrow_ff);
    TEST_RUN(test_moe_batch_invariance);
    return TEST_DONE();
}
