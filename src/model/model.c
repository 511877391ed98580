/*
 * model.c - read a decoder-only Transformer from GGUF: hyperparameters from
 * `<arch>.*` keys (model_hparams.c, through model_int.h), weights by their
 * GGUF tensor names, every shape checked against the hyperparameters before
 * anything runs.
 *
 * Tensor names: token_embd.weight, output_norm.weight, output.weight
 * (absent when tied), and per layer N blk.N.<name> for every entry of
 * layer_tensors below: attn_norm, attn_{q,k,v,output} weights,
 * attn_{q,k,v}.bias (qwen2), ffn_norm, ffn_{gate,up,down}, and gemma3's
 * attn_{q,k}_norm, post_attention_norm, post_ffw_norm. That table is the
 * one list of a layer's tensors: the loader, the packer and
 * model_layer_matrices all read it. phi3 files store Q, K, V as one
 * blk.N.attn_qkv matrix and gate and up as one blk.N.ffn_up of 2·n_ff rows;
 * the table's entries marked fused for phi3 are then row slices of those
 * (load_fused), so every later reader still sees seven matrices. Layers of
 * their own shape are read by their own functions into the same fields:
 * deepseek2's (load_mla_layer), the hybrids' (load_hybrid_layer) and
 * gpt-oss's (load_gptoss_layer: biases, sinks, post_attention_norm as the
 * FFN's norm, the router's and experts' biases).
 */
#include "model/model.h"
#include "model/model_int.h"

#include <assert.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels/deltanet.h"
#include "kernels/kernels.h"
#include "kv/attn.h"
#include "model/ops.h"
#include "format/quant.h"
#include "base/util.h"

const char *model_arch_name(lm_arch a) {
    switch (a) {
        case LM_ARCH_LLAMA: return "llama";
        case LM_ARCH_QWEN2: return "qwen2";
        case LM_ARCH_GEMMA3: return "gemma3";
        case LM_ARCH_GEMMA_EMBED: return "gemma-embedding";
        case LM_ARCH_QWEN3: return "qwen3";
        case LM_ARCH_QWEN35: return "qwen35";
        case LM_ARCH_QWEN35MOE: return "qwen35moe";
        case LM_ARCH_QWEN3NEXT: return "qwen3next";
        case LM_ARCH_GEMMA2: return "gemma2";
        case LM_ARCH_PHI3: return "phi3";
        case LM_ARCH_QWEN2MOE: return "qwen2moe";
        case LM_ARCH_QWEN3MOE: return "qwen3moe";
        case LM_ARCH_DEEPSEEK2: return "deepseek2";
        case LM_ARCH_GPT_OSS: return "gpt-oss";
        case LM_ARCH_BERT: return "bert";
        case LM_ARCH_NOMIC_BERT: return "nomic-bert";
    }
    return "unknown";
}

uint64_t model_kv_bytes_per_token(const lm_model *m, size_t elem_bytes) {
    const lm_hparams *hp = &m->hp;
    uint64_t slabs = hp->kv_lora_rank ? 1 : 2; /* latent attention: the key row holds the value (kv.h) */
    return slabs * (uint64_t)(m->hp.n_layer - m->hp.n_rlayer) * (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim *
        elem_bytes;
}

uint64_t model_layer_bytes_per_token(const lm_model *m, uint64_t *total) {
    uint64_t active = 0, all = 0;
    for (int i = 0; i < m->hp.n_layer; i++) {
        const lm_layer *l = &m->layers[i];
        const lm_weight *ws[MODEL_LAYER_MATRICES];
        model_layer_matrices(l, ws);
        uint64_t dense = 0;
        for (int k = 0; k < MODEL_LAYER_MATRICES; k++) dense += (uint64_t)ws[k]->rows * ws[k]->row_bytes;
        if (l->mla) {
            const lm_mla *a = l->mla;
            dense += (uint64_t)a->q_a.rows * a->q_a.row_bytes + (uint64_t)a->q_b.rows * a->q_b.row_bytes +
                (uint64_t)a->kv_a.rows * a->kv_a.row_bytes;
            for (int h = 0; h < m->hp.n_head; h++)
                dense +=
                    (uint64_t)a->k_b[h].rows * a->k_b[h].row_bytes + (uint64_t)a->v_b[h].rows * a->v_b[h].row_bytes;
        }
        if (l->gdn) {
            const lm_weight *g[5] = {&l->gdn->qkv, &l->gdn->z, &l->gdn->beta, &l->gdn->alpha, &l->gdn->out};
            for (int k = 0; k < 5; k++) dense += (uint64_t)g[k]->rows * g[k]->row_bytes;
        }
        active += dense;
        all += dense;
        if (!l->moe) continue;
        const lm_moe *moe = l->moe;
        uint64_t router = (uint64_t)moe->gate_inp.rows * moe->gate_inp.row_bytes, one = 0;
        one += (uint64_t)moe->gate[0].rows * moe->gate[0].row_bytes;
        one += (uint64_t)moe->up[0].rows * moe->up[0].row_bytes;
        one += (uint64_t)moe->down[0].rows * moe->down[0].row_bytes;
        active += router + one * (uint64_t)m->hp.n_expert_used;
        all += router + one * (uint64_t)m->hp.n_expert;
    }
    if (total) *total = all;
    return active;
}

/* ---- the per-layer tensors ---------------------------------------------- */

/* A tensor's length along one axis, in hyperparameters. */
typedef enum { DIM_EMBD, DIM_Q, DIM_KV, DIM_FF, DIM_HEAD } hp_dim;

#define ALL_ARCHS                                                                                                      \
    (ARCH(LM_ARCH_LLAMA) | ARCH(LM_ARCH_QWEN2) | GEMMA3_ARCHS | ARCH(LM_ARCH_QWEN3) | ARCH(LM_ARCH_GEMMA2) |           \
     ARCH(LM_ARCH_PHI3) | ARCH(LM_ARCH_QWEN2MOE) | ARCH(LM_ARCH_QWEN3MOE))
#define QK_NORM_ARCHS (GEMMA3_ARCHS | ARCH(LM_ARCH_QWEN3) | ARCH(LM_ARCH_QWEN3MOE))
#define POST_NORM_ARCHS (GEMMA3_ARCHS | ARCH(LM_ARCH_GEMMA2))
#define FUSED_ARCHS ARCH(LM_ARCH_PHI3)

typedef struct {
    const char *name; /* GGUF name after "blk.N." */
    size_t offset;    /* its field in lm_layer: an lm_weight (matrix) or a const float * (vector) */
    bool matrix;
    hp_dim cols, rows; /* a matrix's input and output features; a vector has cols elements */
    unsigned required; /* ARCH() bits of the architectures that must have it; optional for the others */
    unsigned fused;    /* ARCH() bits of the architectures that store it inside a fused matrix */
    bool ffn;          /* a dense FFN matrix: loaded by load_moe instead when the model has experts */
} layer_tensor;

#define MAT(n, field, c, r, fu)                                                                                        \
    { n, offsetof(lm_layer, field), true, c, r, ALL_ARCHS, fu, false }
#define FFN(n, field, c, r, fu)                                                                                        \
    { n, offsetof(lm_layer, field), true, c, r, ALL_ARCHS, fu, true }
#define VEC(n, field, c, req)                                                                                          \
    { n, offsetof(lm_layer, field), false, c, 0, req, 0, false }

/* In load order (the first problem found is the one reported). */
static const layer_tensor layer_tensors[] = {
    VEC("attn_norm.weight", attn_norm, DIM_EMBD, ALL_ARCHS),
    MAT("attn_q.weight", wq, DIM_EMBD, DIM_Q, FUSED_ARCHS),
    MAT("attn_k.weight", wk, DIM_EMBD, DIM_KV, FUSED_ARCHS),
    MAT("attn_v.weight", wv, DIM_EMBD, DIM_KV, FUSED_ARCHS),
    MAT("attn_output.weight", wo, DIM_Q, DIM_EMBD, 0),
    VEC("attn_q.bias", bq, DIM_Q, ARCH(LM_ARCH_QWEN2)),
    VEC("attn_k.bias", bk, DIM_KV, ARCH(LM_ARCH_QWEN2)),
    VEC("attn_v.bias", bv, DIM_KV, ARCH(LM_ARCH_QWEN2)),
    VEC("ffn_norm.weight", ffn_norm, DIM_EMBD, ALL_ARCHS),
    FFN("ffn_gate.weight", w_gate, DIM_EMBD, DIM_FF, FUSED_ARCHS),
    FFN("ffn_up.weight", w_up, DIM_EMBD, DIM_FF, FUSED_ARCHS),
    FFN("ffn_down.weight", w_down, DIM_FF, DIM_EMBD, 0),
    VEC("attn_q_norm.weight", q_norm, DIM_HEAD, QK_NORM_ARCHS),
    VEC("attn_k_norm.weight", k_norm, DIM_HEAD, QK_NORM_ARCHS),
    VEC("post_attention_norm.weight", post_attn_norm, DIM_EMBD, POST_NORM_ARCHS),
    VEC("post_ffw_norm.weight", post_ffn_norm, DIM_EMBD, POST_NORM_ARCHS),
};
#define N_LAYER_TENSORS (sizeof layer_tensors / sizeof layer_tensors[0])

static int64_t dim_len(const lm_hparams *hp, hp_dim d) {
    switch (d) {
        case DIM_EMBD: return hp->n_embd;
        case DIM_Q: return (int64_t)hp->n_head * hp->head_dim;
        case DIM_KV: return (int64_t)hp->n_head_kv * hp->head_dim;
        case DIM_FF: return hp->n_ff;
        case DIM_HEAD: return hp->head_dim;
    }
    return 0;
}

static lm_weight *layer_weight(lm_layer *l, const layer_tensor *t) { return (lm_weight *)((char *)l + t->offset); }
static const float **layer_vec(lm_layer *l, const layer_tensor *t) { return (const float **)((char *)l + t->offset); }

void model_layer_matrices(const lm_layer *l, const lm_weight *out[MODEL_LAYER_MATRICES]) {
    int k = 0;
    for (size_t i = 0; i < N_LAYER_TENSORS; i++)
        if (layer_tensors[i].matrix) {
            assert(k < MODEL_LAYER_MATRICES);
            out[k++] = (const lm_weight *)((const char *)l + layer_tensors[i].offset);
        }
    assert(k == MODEL_LAYER_MATRICES);
}

/* Tell the caller's progress callback how far loading is (0 .. 1); -1 when
 * it answers stop. Loading shares: 0.05 the header, up to 0.2 reading the
 * layers' tensors, up to 0.95 making the packed copies, 1 the tokenizer. */
static int report(loader *L, double done) {
    if (!L->progress || L->progress(L->progress_user, (float)done)) return 0;
    L->status = LM_ERR_CANCELLED;
    return lm_err(L->err, L->errlen, "loading cancelled by the progress callback");
}

/* Find a tensor, check it is 2-D (or 1-D when cols_only) with the given
 * shape. Returns NULL (with a message) when missing and required. */
static const gguf_tensor *find_shaped(loader *L, const char *name, int64_t ne0, int64_t ne1, bool required) {
    const gguf_tensor *t = gguf_find_tensor(L->m->gguf, name);
    if (!t) {
        if (required) lm_err(L->err, L->errlen, "missing tensor '%s'", name);
        return NULL;
    }
    uint64_t want1 = ne1 > 0 ? (uint64_t)ne1 : 1;
    bool ok = t->ne[0] == (uint64_t)ne0 && t->ne[1] == want1 && t->ne[2] == 1 && t->ne[3] == 1;
    if (!ok) {
        lm_err(L->err, L->errlen, "tensor '%s' has shape [%llu, %llu, %llu, %llu], expected [%lld, %lld]", name,
               (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
               (unsigned long long)t->ne[3], (long long)ne0, (long long)want1);
        return NULL;
    }
    return t;
}

static int load_weight(loader *L, const char *name, int64_t cols, int64_t rows, lm_weight *w) {
    const gguf_tensor *t = find_shaped(L, name, cols, rows, true);
    if (!t) return -1;
    if (!quant_supported(t->type))
        return unsupported(L),
               lm_err(L->err, L->errlen, "tensor '%s' has type %s, which lamina cannot compute with", name,
                      quant_type_name(t->type));
    w->data = t->data;
    w->type = t->type;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = quant_row_size(t->type, cols);
    return 0;
}

/* A float tensor of ne0 x max(ne1, 1) elements (a norm weight or bias; ne1
 * 0: 1-D), converted to F32 into the model's slab, row after row. *out
 * stays NULL when optional and absent. */
static int load_floats(loader *L, const char *name, int64_t ne0, int64_t ne1, bool required, const float **out) {
    *out = NULL;
    const int64_t n = ne0 * (ne1 > 0 ? ne1 : 1);
    const gguf_tensor *t = find_shaped(L, name, ne0, ne1, required);
    if (!t) {
        if (!required && !gguf_find_tensor(L->m->gguf, name)) return 0;
        return -1;
    }
    const lm_type_kernels *tk = kernels_type(t->type);
    if (!tk || !tk->to_float)
        return unsupported(L),
               lm_err(L->err, L->errlen, "tensor '%s' has type %s, which lamina cannot read", name,
                      quant_type_name(t->type));
    if (L->f32_used + (size_t)n > L->f32_cap) return lm_err(L->err, L->errlen, "internal: vector slab too small");
    float *dst = L->m->f32 + L->f32_used;
    tk->to_float(t->data, dst, n);
    L->f32_used += (size_t)n;
    *out = dst;
    return 0;
}

/* A 1-D float vector (norm weight or bias) of n elements (load_floats). */
static int load_vec(loader *L, const char *name, int64_t n, bool required, const float **out) {
    return load_floats(L, name, n, 0, required, out);
}

static int load_dense(loader *L) { /* gemma-embedding's optional dense_2, dense_3 (model.h), as shaped */
    lm_model *m = L->m;
    int64_t in = m->hp.n_embd;
    const char *names[2] = {"dense_2.weight", "dense_3.weight"};
    lm_weight *w[2] = {&m->dense2, &m->dense3};
    for (int i = 0; i < 2; i++) {
        const gguf_tensor *t = gguf_find_tensor(m->gguf, names[i]);
        if (!t) continue;
        if (t->ne[1] < 1 || t->ne[1] > (1u << 20))
            return lm_err(L->err, L->errlen, "tensor '%s' has %llu rows", names[i], (unsigned long long)t->ne[1]);
        if (load_weight(L, names[i], in, (int64_t)t->ne[1], w[i])) return -1;
        in = w[i]->rows;
    }
    return 0;
}

/* A row slice of a loaded matrix: rows r0 .. r0+rows-1 as a matrix of its own. */
static lm_weight weight_rows(const lm_weight *w, int64_t r0, int64_t rows) {
    lm_weight s = *w;
    s.data = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    s.rows = rows;
    return s;
}

/* phi3: Q, K, V from blk.N.attn_qkv (Q rows, then K, then V) when the file
 * has it, else from the separate tensors; gate and up from blk.N.ffn_up of
 * 2·n_ff rows (the gate's rows first, as SwiGLU reads them). */
static int load_fused(loader *L, int i, lm_layer *l) {
    const lm_hparams *hp = &L->m->hp;
    int64_t E = hp->n_embd, Q = dim_len(hp, DIM_Q), KV = dim_len(hp, DIM_KV), F = hp->n_ff;
    char name[96];
    lm_weight w;
    snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", i);
    if (gguf_find_tensor(L->m->gguf, name)) {
        if (load_weight(L, name, E, Q + 2 * KV, &w)) return -1;
        l->wq = weight_rows(&w, 0, Q);
        l->wk = weight_rows(&w, Q, KV);
        l->wv = weight_rows(&w, Q + KV, KV);
    } else {
        snprintf(name, sizeof name, "blk.%d.attn_q.weight", i);
        if (load_weight(L, name, E, Q, &l->wq)) return -1;
        snprintf(name, sizeof name, "blk.%d.attn_k.weight", i);
        if (load_weight(L, name, E, KV, &l->wk)) return -1;
        snprintf(name, sizeof name, "blk.%d.attn_v.weight", i);
        if (load_weight(L, name, E, KV, &l->wv)) return -1;
    }
    snprintf(name, sizeof name, "blk.%d.ffn_up.weight", i);
    if (load_weight(L, name, E, 2 * F, &w)) return -1;
    l->w_gate = weight_rows(&w, 0, F);
    l->w_up = weight_rows(&w, F, F);
    return 0;
}

/* A 3-D tensor of n_expert (rows, cols) matrices, as one lm_weight per
 * expert (slice e at data + e * rows * row_bytes). */
static int load_slices(loader *L, const char *name, int64_t cols, int64_t rows, int n, lm_weight *out) {
    const gguf_tensor *t = gguf_find_tensor(L->m->gguf, name);
    if (!t) return lm_err(L->err, L->errlen, "missing tensor '%s'", name);
    if (t->ne[0] != (uint64_t)cols || t->ne[1] != (uint64_t)rows || t->ne[2] != (uint64_t)n || t->ne[3] != 1)
        return lm_err(L->err, L->errlen, "tensor '%s' has shape [%llu, %llu, %llu, %llu], expected [%lld, %lld, %d]",
                      name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                      (unsigned long long)t->ne[3], (long long)cols, (long long)rows, n);
    if (!quant_supported(t->type))
        return unsupported(L),
               lm_err(L->err, L->errlen, "tensor '%s' has type %s, which lamina cannot compute with", name,
                      quant_type_name(t->type));
    size_t rb = quant_row_size(t->type, cols);
    for (int e = 0; e < n; e++)
        out[e] = (lm_weight){.data = (const uint8_t *)t->data + (size_t)e * (size_t)rows * rb,
                             .type = t->type,
                             .rows = rows,
                             .cols = cols,
                             .row_bytes = rb};
    return 0;
}

static int load_experts(loader *L, const char *name, int64_t cols, int64_t rows, lm_weight *out) {
    return load_slices(L, name, cols, rows, L->m->hp.n_expert, out);
}

/* A layer's experts, router and (qwen2moe, deepseek2) shared expert. */
static int load_moe(loader *L, int i, lm_layer *l) {
    lm_model *m = L->m;
    const lm_hparams *hp = &m->hp;
    int64_t E = hp->n_embd, F = hp->n_ff_exp, X = hp->n_expert;
    lm_moe *moe = &m->moe[i];
    l->moe = moe;
    moe->gate = m->experts + (size_t)i * 3 * (size_t)X;
    moe->up = moe->gate + X;
    moe->down = moe->up + X;
    char name[96];
    snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", i);
    if (load_weight(L, name, E, X, &moe->gate_inp)) return -1;
    snprintf(name, sizeof name, "blk.%d.ffn_gate_exps.weight", i);
    if (load_experts(L, name, E, F, moe->gate)) return -1;
    snprintf(name, sizeof name, "blk.%d.ffn_up_exps.weight", i);
    if (load_experts(L, name, E, F, moe->up)) return -1;
    snprintf(name, sizeof name, "blk.%d.ffn_down_exps.weight", i);
    if (load_experts(L, name, F, E, moe->down)) return -1;
    if (hp->n_ff_shexp > 0) {
        int64_t S = hp->n_ff_shexp;
        snprintf(name, sizeof name, "blk.%d.ffn_gate_inp_shexp.weight", i);
        bool gated = hp->arch == LM_ARCH_QWEN2MOE || hp->arch == LM_ARCH_QWEN35MOE || hp->arch == LM_ARCH_QWEN3NEXT;
        if (gated && load_vec(L, name, E, true, &moe->shexp_gate)) return -1;
        snprintf(name, sizeof name, "blk.%d.ffn_gate_shexp.weight", i);
        if (load_weight(L, name, E, S, &l->w_gate)) return -1;
        snprintf(name, sizeof name, "blk.%d.ffn_up_shexp.weight", i);
        if (load_weight(L, name, E, S, &l->w_up)) return -1;
        snprintf(name, sizeof name, "blk.%d.ffn_down_shexp.weight", i);
        if (load_weight(L, name, S, E, &l->w_down)) return -1;
    }
    return 0;
}

/* deepseek2's layer: latent attention, then a dense FFN (the leading
 * layers) or experts with shared ones and an optional selection bias. */
/* attn_kv_b whole (older files): (n_head * (qk_nope + v_head_dim), kv_lora_rank),
 * per head h the rows of W_UK_h (qk_nope) then of W_UV_h (v_head_dim). v_b[h]
 * is W_UV_h, a row slice; k_b[h] must be W_UK_hᵀ (kv_lora_rank, qk_nope),
 * so W_UK_h is dequantized and transposed once into m->kb_mem, F16 for an
 * F16 file and F32 otherwise: the exact values, so the products are those
 * of a file that stores attn_k_b. */
static int load_kv_b(loader *L, int li, const char *name, lm_mla *a) {
    lm_model *m = L->m;
    const lm_hparams *hp = &m->hp;
    const int64_t H = hp->n_head, R = hp->kv_lora_rank, nope = hp->qk_nope, vd = hp->v_head_dim;
    lm_weight kv;
    if (load_weight(L, name, R, H * (nope + vd), &kv)) return -1;
    const uint32_t kt = kv.type == LM_TYPE_F16 ? LM_TYPE_F16 : LM_TYPE_F32;
    const size_t rb = quant_row_size(kt, nope), per_layer = (size_t)(H * R) * rb;
    if (!m->kb_mem) {
        m->kb_bytes = per_layer * (size_t)hp->n_layer;
        m->kb_mem = lm_malloc(m->kb_bytes);
        if (!m->kb_mem)
            return nomem(L), lm_err(L->err, L->errlen, "out of memory splitting attn_kv_b (%zu bytes)", m->kb_bytes);
    }
    float *src = lm_malloc((size_t)(nope * R) * sizeof(float)), *col = lm_malloc((size_t)nope * sizeof(float));
    if (!src || !col) {
        lm_free(src);
        lm_free(col);
        return nomem(L), lm_err(L->err, L->errlen, "out of memory");
    }
    for (int64_t h = 0; h < H; h++) {
        uint8_t *dst = (uint8_t *)m->kb_mem + (size_t)li * per_layer + (size_t)(h * R) * rb;
        for (int64_t j = 0; j < nope; j++) ops_get_row(&kv, h * (nope + vd) + j, src + j * R); /* W_UK_h (nope, R) */
        for (int64_t r = 0; r < R; r++) {
            for (int64_t j = 0; j < nope; j++) col[j] = src[j * R + r];
            quant_from_float_ref(kt, col, dst + (size_t)r * rb, nope);
        }
        a->k_b[h] = (lm_weight){.data = dst, .type = kt, .rows = R, .cols = nope, .row_bytes = rb};
        a->v_b[h] = weight_rows(&kv, h * (nope + vd) + nope, vd);
    }
    lm_free(src);
    lm_free(col);
    return 0;
}

static int load_mla_layer(loader *L, int i, lm_layer *l) {
    lm_model *m = L->m;
    const lm_hparams *hp = &m->hp;
    int64_t E = hp->n_embd, H = hp->n_head, R = hp->kv_lora_rank, QK = hp->qk_nope + hp->n_rot;
    lm_mla *a = &m->mla[i];
    l->mla = a;
    a->k_b = m->mla_heads + (size_t)i * 2 * (size_t)H;
    a->v_b = a->k_b + H;
    char name[96];
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, i), name)
    if (load_vec(L, NAME("attn_norm.weight"), E, true, &l->attn_norm)) return -1;
    if (hp->q_lora_rank > 0) {
        if (load_weight(L, NAME("attn_q_a.weight"), E, hp->q_lora_rank, &a->q_a) ||
            load_vec(L, NAME("attn_q_a_norm.weight"), hp->q_lora_rank, true, &a->q_a_norm) ||
            load_weight(L, NAME("attn_q_b.weight"), hp->q_lora_rank, H * QK, &a->q_b))
            return -1;
    } else if (load_weight(L, NAME("attn_q.weight"), E, H * QK, &a->q_b)) {
        return -1;
    }
    if (load_weight(L, NAME("attn_kv_a_mqa.weight"), E, R + hp->n_rot, &a->kv_a) ||
        load_vec(L, NAME("attn_kv_a_norm.weight"), R, true, &a->kv_a_norm))
        return -1;
    if (L->kv_b_whole ? load_kv_b(L, i, NAME("attn_kv_b.weight"), a)
                      : load_slices(L, NAME("attn_k_b.weight"), hp->qk_nope, R, (int)H, a->k_b) ||
                load_slices(L, NAME("attn_v_b.weight"), R, hp->v_head_dim, (int)H, a->v_b))
        return -1;
    if (load_weight(L, NAME("attn_output.weight"), H * hp->v_head_dim, E, &l->wo) ||
        load_vec(L, NAME("ffn_norm.weight"), E, true, &l->ffn_norm))
        return -1;
    if (i < hp->n_layer_dense)
        return load_weight(L, NAME("ffn_gate.weight"), E, hp->n_ff, &l->w_gate) ||
                load_weight(L, NAME("ffn_up.weight"), E, hp->n_ff, &l->w_up) ||
                load_weight(L, NAME("ffn_down.weight"), hp->n_ff, E, &l->w_down)
            ? -1
            : 0;
    if (load_moe(L, i, l) || load_vec(L, NAME("exp_probs_b.bias"), hp->n_expert, false, &m->moe[i].probs_bias))
        return -1;
#undef NAME
    return 0;
}

/* A gpt-oss layer (model.h): attention with biases on Q, K, V and the
 * output and a sink per query head, post_attention_norm before the experts,
 * whose router and three products carry biases (the experts' as 2-D
 * tensors, a row per expert). */
static int load_gptoss_layer(loader *L, int i, lm_layer *l) {
    lm_model *m = L->m;
    const lm_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, Q = dim_len(hp, DIM_Q), KV = dim_len(hp, DIM_KV);
    const int64_t X = hp->n_expert, F = hp->n_ff_exp;
    char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, i), name)
    if (load_vec(L, NAME("attn_norm.weight"), E, true, &l->attn_norm) ||
        load_weight(L, NAME("attn_q.weight"), E, Q, &l->wq) || load_vec(L, NAME("attn_q.bias"), Q, true, &l->bq) ||
        load_weight(L, NAME("attn_k.weight"), E, KV, &l->wk) || load_vec(L, NAME("attn_k.bias"), KV, true, &l->bk) ||
        load_weight(L, NAME("attn_v.weight"), E, KV, &l->wv) || load_vec(L, NAME("attn_v.bias"), KV, true, &l->bv) ||
        load_weight(L, NAME("attn_output.weight"), Q, E, &l->wo) ||
        load_vec(L, NAME("attn_output.bias"), E, true, &l->bo) ||
        load_vec(L, NAME("attn_sinks.weight"), hp->n_head, true, &l->sinks) ||
        load_vec(L, NAME("post_attention_norm.weight"), E, true, &l->ffn_norm) || load_moe(L, i, l))
        return -1;
    lm_moe *moe = l->moe;
    if (load_vec(L, NAME("ffn_gate_inp.bias"), X, true, &moe->gate_inp_b) ||
        load_floats(L, NAME("ffn_gate_exps.bias"), F, X, true, &moe->gate_b) ||
        load_floats(L, NAME("ffn_up_exps.bias"), F, X, true, &moe->up_b) ||
        load_floats(L, NAME("ffn_down_exps.bias"), E, X, true, &moe->down_b))
        return -1;
    moe->b_stride = (int)F;
    char why[LM_ERRLEN];
    if (attn_sinks_check(l->sinks, hp->n_head, why, sizeof why)) /* NaN or +inf: no softmax */
        return lm_err(L->err, L->errlen, "tensor '%s': %s", NAME("attn_sinks.weight"), why);
#undef NAME
    return 0;
}

/* The conv taps of a recurrent layer: the file's ssm_conv1d (conv rows of
 * K taps) as floats, transposed to (K, conv) into the vector slab. */
static int load_conv(loader *L, const char *name, int64_t K, int64_t conv, const float **out) {
    const gguf_tensor *t = find_shaped(L, name, K, conv, true);
    if (!t) return -1;
    const lm_type_kernels *tk = kernels_type(t->type);
    if (!tk || !tk->to_float)
        return unsupported(L),
               lm_err(L->err, L->errlen, "tensor '%s' has type %s, which lamina cannot read", name,
                      quant_type_name(t->type));
    if (L->f32_used + (size_t)(K * conv) > L->f32_cap)
        return lm_err(L->err, L->errlen, "internal: vector slab too small");
    float *dst = L->m->f32 + L->f32_used, row[LM_DN_CONV_MAX];
    size_t rb = quant_row_size(t->type, K);
    for (int64_t c = 0; c < conv; c++) {
        tk->to_float((const uint8_t *)t->data + (size_t)c * rb, row, K);
        for (int64_t i = 0; i < K; i++) dst[i * conv + c] = row[i];
    }
    L->f32_used += (size_t)(K * conv);
    *out = dst;
    return 0;
}

/* A qwen35 or qwen3next layer: its norms and dense FFN or experts, then
 * gated full attention (every full_attn_interval-th, or every layer when
 * attn: an MTP layer) or a gated DeltaNet. *rec and *kvl count the recurrent
 * and the attention layers so far. */
static int load_hybrid_layer(loader *L, int i, lm_layer *l, bool attn, int *rec, int *kvl) {
    lm_model *m = L->m;
    const lm_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, F = hp->n_ff;
    char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, i), name)
    if (load_vec(L, NAME("attn_norm.weight"), E, true, &l->attn_norm) ||
        load_vec(L, NAME("post_attention_norm.weight"), E, true, &l->ffn_norm))
        return -1;
    if (hp->n_expert > 0 ? load_moe(L, i, l)
                         : load_weight(L, NAME("ffn_gate.weight"), E, F, &l->w_gate) ||
                load_weight(L, NAME("ffn_up.weight"), E, F, &l->w_up) ||
                load_weight(L, NAME("ffn_down.weight"), F, E, &l->w_down))
        return -1;
    if (attn || (i + 1) % hp->full_attn_interval == 0) {
        const int64_t Q = dim_len(hp, DIM_Q), KV = dim_len(hp, DIM_KV), hd = hp->head_dim;
        if (load_weight(L, NAME("attn_q.weight"), E, 2 * Q, &l->wq) ||
            load_weight(L, NAME("attn_k.weight"), E, KV, &l->wk) ||
            load_weight(L, NAME("attn_v.weight"), E, KV, &l->wv) ||
            load_weight(L, NAME("attn_output.weight"), Q, E, &l->wo) ||
            load_vec(L, NAME("attn_q_norm.weight"), hd, true, &l->q_norm) ||
            load_vec(L, NAME("attn_k_norm.weight"), hd, true, &l->k_norm))
            return -1;
        l->rec = -1;
        l->kv_layer = (*kvl)++;
        return 0;
    }
    lm_gdn *g = &m->gdn[i];
    const int64_t K = hp->ssm_conv, hv = hp->ssm_hv, dv = hp->ssm_dv, V = hv * dv;
    const int64_t conv = 2 * (int64_t)hp->ssm_hk * hp->ssm_dk + V;
    /* qwen3next: beta and alpha in one fused ssm_ba (lm_gdn.beta), and in older files q, k, v and z
     * in one ssm_in (lm_gdn.qkv); both split after the product in gdn.c */
    bool fused_ba = hp->arch == LM_ARCH_QWEN3NEXT;
    bool fused_in = fused_ba && gguf_find_tensor(m->gguf, NAME("ssm_in.weight")) != NULL;
    if ((fused_in ? load_weight(L, NAME("ssm_in.weight"), E, conv + V, &g->qkv)
                  : load_weight(L, NAME("attn_qkv.weight"), E, conv, &g->qkv) ||
                 load_weight(L, NAME("attn_gate.weight"), E, V, &g->z)) ||
        (fused_ba ? load_weight(L, NAME("ssm_ba.weight"), E, 2 * hv, &g->beta)
                  : load_weight(L, NAME("ssm_beta.weight"), E, hv, &g->beta) ||
                 load_weight(L, NAME("ssm_alpha.weight"), E, hv, &g->alpha)) ||
        load_weight(L, NAME("ssm_out.weight"), V, E, &g->out) ||
        load_conv(L, NAME("ssm_conv1d.weight"), K, conv, &g->conv_w) ||
        load_vec(L, NAME("ssm_dt.bias"), hv, true, &g->dt_bias) || load_vec(L, NAME("ssm_a"), hv, true, &g->a) ||
        load_vec(L, NAME("ssm_norm.weight"), dv, true, &g->norm))
        return -1;
#undef NAME
    l->gdn = g;
    l->rec = (*rec)++;
    l->kv_layer = -1;
    return 0;
}

/* The first next-token-prediction layer, block n_layer (model.h, lm_mtp):
 * a full-attention qwen35 layer and the nextn tensors. Further MTP layers
 * (n_layer_mtp > 1) are left unread. */
static int load_mtp(loader *L) {
    lm_model *m = L->m;
    const lm_hparams *hp = &m->hp;
    const int i = hp->n_layer;
    const int64_t E = hp->n_embd;
    lm_mtp *t = m->mtp = lm_calloc(1, sizeof *m->mtp);
    if (!t) return nomem(L), lm_err(L->err, L->errlen, "out of memory");
    int rec = 0, kvl = 0;
    if (load_hybrid_layer(L, i, &t->layer, true, &rec, &kvl)) return -1;
    t->layer.rope_base = hp->rope_base;
    t->layer.rope_scale = hp->rope_scale;
    char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%d.nextn." s, i), name)
    if (load_weight(L, NAME("eh_proj.weight"), 2 * E, E, &t->eh_proj) ||
        load_vec(L, NAME("enorm.weight"), E, true, &t->enorm) ||
        load_vec(L, NAME("hnorm.weight"), E, true, &t->hnorm) ||
        load_vec(L, NAME("shared_head_norm.weight"), E, false, &t->head_norm))
        return -1;
    if (!t->head_norm) t->head_norm = m->out_norm;
    t->embed = &m->tok_embd;
    t->head = &m->output;
    if (gguf_find_tensor(m->gguf, NAME("embed_tokens.weight"))) {
        if (load_weight(L, name, E, hp->n_vocab, &t->embed_own)) return -1;
        t->embed = &t->embed_own;
    }
    if (gguf_find_tensor(m->gguf, NAME("shared_head_head.weight"))) {
        if (load_weight(L, name, E, hp->n_vocab, &t->head_own)) return -1;
        t->head = &t->head_own;
    }
#undef NAME
    return 0;
}

/* The model's tensor bytes and parameters. */
static int count_params(lm_model *m) {
    for (int64_t i = 0; i < gguf_n_tensors(m->gguf); i++) {
        const gguf_tensor *t = gguf_tensor_at(m->gguf, i);
        m->weight_bytes += t->nbytes;
        m->n_params += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    }
    return 0;
}

/* blk.i.<what> into *out as a vector of n floats. */
static int layer_vec_opt(loader *L, int i, const char *what, int64_t n, bool required, const float **out) {
    char name[160];
    snprintf(name, sizeof name, "blk.%d.%s", i, what);
    return load_vec(L, name, n, required, out);
}

/* An encoder's tensors (model.h: bert, nomic-bert), as llama.cpp names them.
 * The LM head is absent: output stays rows 0. */
static int load_encoder(loader *L) {
    lm_model *m = L->m;
    const lm_hparams *hp = &m->hp;
    int64_t E = hp->n_embd, Q = dim_len(hp, DIM_Q), KV = dim_len(hp, DIM_KV), F = hp->n_ff;
    bool nomic = hp->arch == LM_ARCH_NOMIC_BERT;
    const gguf_tensor *types = gguf_find_tensor(m->gguf, "token_types.weight");
    const float *type_rows = NULL;
    if (types && (types->ne[1] < 1 || types->ne[1] > 16))
        return lm_err(L->err, L->errlen, "tensor 'token_types.weight' holds %llu token types (1 .. 16 expected)",
                      (unsigned long long)types->ne[1]);
    if (load_weight(L, "token_embd.weight", E, hp->n_vocab, &m->tok_embd) ||
        (types && load_floats(L, "token_types.weight", E, (int64_t)types->ne[1], true, &type_rows)) ||
        (!nomic && load_weight(L, "position_embd.weight", E, hp->n_ctx_train, &m->pos_embd)) ||
        load_vec(L, "token_embd_norm.weight", E, true, &m->embd_norm) ||
        load_vec(L, "token_embd_norm.bias", E, true, &m->embd_norm_b))
        return -1;
    m->type_embd = type_rows; /* row 0: every token is of type 0 ("sentence A") */
    char name[96];
    for (int i = 0; i < hp->n_layer; i++) {
        lm_layer *l = &m->layers[i];
        l->rec = -1;
        l->kv_layer = i;
        l->rope_base = hp->rope_base;
        l->rope_scale = 1.0f;
        const float *qkv_b = NULL;
        if (nomic) { /* fused Q, K, V: row slices, as phi3's */
            lm_weight w;
            snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", i);
            if (load_weight(L, name, E, Q + 2 * KV, &w) ||
                layer_vec_opt(L, i, "attn_qkv.bias", Q + 2 * KV, false, &qkv_b))
                return -1;
            l->wq = weight_rows(&w, 0, Q);
            l->wk = weight_rows(&w, Q, KV);
            l->wv = weight_rows(&w, Q + KV, KV);
            if (qkv_b) l->bq = qkv_b, l->bk = qkv_b + Q, l->bv = qkv_b + Q + KV;
        } else {
            static const char *const qkv[3] = {"attn_q", "attn_k", "attn_v"};
            lm_weight *w[3] = {&l->wq, &l->wk, &l->wv};
            const float **b[3] = {&l->bq, &l->bk, &l->bv};
            for (int k = 0; k < 3; k++) {
                snprintf(name, sizeof name, "blk.%d.%s.weight", i, qkv[k]);
                if (load_weight(L, name, E, k ? KV : Q, w[k])) return -1;
                char bias[32];
                snprintf(bias, sizeof bias, "%s.bias", qkv[k]);
                if (layer_vec_opt(L, i, bias, k ? KV : Q, false, b[k])) return -1;
            }
        }
        snprintf(name, sizeof name, "blk.%d.attn_output.weight", i);
        if (load_weight(L, name, Q, E, &l->wo)) return -1;
        snprintf(name, sizeof name, "blk.%d.ffn_up.weight", i);
        if (load_weight(L, name, E, F, &l->w_up)) return -1;
        snprintf(name, sizeof name, "blk.%d.ffn_down.weight", i);
        if (load_weight(L, name, F, E, &l->w_down)) return -1;
        snprintf(name, sizeof name, "blk.%d.ffn_gate.weight", i);
        if (nomic && load_weight(L, name, E, F, &l->w_gate)) return -1;
        if (layer_vec_opt(L, i, "attn_output.bias", E, false, &l->bo) ||
            layer_vec_opt(L, i, "attn_output_norm.weight", E, true, &l->attn_norm) ||
            layer_vec_opt(L, i, "attn_output_norm.bias", E, true, &l->attn_norm_b) ||
            layer_vec_opt(L, i, "ffn_up.bias", F, false, &l->b_up) ||
            layer_vec_opt(L, i, "ffn_down.bias", E, false, &l->b_down) ||
            layer_vec_opt(L, i, "layer_output_norm.weight", E, true, &l->ffn_norm) ||
            layer_vec_opt(L, i, "layer_output_norm.bias", E, true, &l->ffn_norm_b) ||
            report(L, 0.05 + 0.15 * (i + 1) / hp->n_layer))
            return -1;
    }
    return count_params(m);
}

static int load_tensors(loader *L) {
    lm_model *m = L->m;
    const lm_hparams *hp = &m->hp;
    int64_t E = hp->n_embd;
    /* vectors: every vector of the table per layer, then the final norm */
    size_t per_layer = 0;
    for (size_t k = 0; k < N_LAYER_TENSORS; k++)
        if (!layer_tensors[k].matrix) per_layer += (size_t)dim_len(hp, layer_tensors[k].cols);
    L->f32_cap = (size_t)hp->n_layer * (per_layer + (size_t)E) + (size_t)E + (size_t)hp->n_rot;
    if (hp->kv_lora_rank) /* deepseek2's own vectors (the table's Q/K/V widths cover the rest) */
        L->f32_cap += (size_t)hp->n_layer * ((size_t)hp->q_lora_rank + (size_t)hp->kv_lora_rank + (size_t)hp->n_expert);
    if (hp->n_rlayer) /* the recurrent layers' conv taps, dt biases, decays and norms */
        L->f32_cap += (size_t)hp->n_rlayer *
            ((size_t)hp->ssm_conv * (2 * (size_t)hp->ssm_hk * hp->ssm_dk + (size_t)hp->ssm_hv * hp->ssm_dv) +
             2 * (size_t)hp->ssm_hv + (size_t)hp->ssm_dv);
    /* the first MTP layer's norms (attention, FFN, shared-expert gate, enorm, hnorm, head_norm) */
    if (hp->n_layer_mtp) L->f32_cap += 2 * (size_t)hp->head_dim + 6 * (size_t)E;
    /* gpt-oss: the output bias, the sinks, the router's and the experts' biases */
    if (hp->encoder) { /* the LayerNorms' and FFN's biases, the output bias, the token types' rows */
        const gguf_tensor *types = gguf_find_tensor(m->gguf, "token_types.weight");
        L->f32_cap += (size_t)hp->n_layer * (5 * (size_t)E + (size_t)hp->n_ff) + 2 * (size_t)E;
        if (types) L->f32_cap += (size_t)E * (size_t)(types->ne[1] < 16 ? types->ne[1] : 16);
    }
    if (hp->arch == LM_ARCH_GPT_OSS)
        L->f32_cap += (size_t)hp->n_layer *
            ((size_t)E + (size_t)hp->n_head + (size_t)hp->n_expert * (1 + 2 * (size_t)hp->n_ff_exp + (size_t)E));
    m->f32 = lm_malloc(L->f32_cap * sizeof(float));
    m->layers = lm_calloc((size_t)hp->n_layer, sizeof(lm_layer));
    m->layer_local = lm_calloc((size_t)hp->n_layer, 1);
    if (!m->f32 || !m->layers || !m->layer_local) return nomem(L), lm_err(L->err, L->errlen, "out of memory");
    if (hp->n_expert > 0) {
        /* the MTP layer's experts follow the trunk's (layer n_layer) */
        const size_t nl = (size_t)hp->n_layer + (hp->n_layer_mtp ? 1 : 0);
        m->moe = lm_calloc(nl, sizeof(lm_moe));
        m->experts = lm_calloc(nl * 3 * (size_t)hp->n_expert, sizeof(lm_weight));
        if (!m->moe || !m->experts) return nomem(L), lm_err(L->err, L->errlen, "out of memory");
    }
    if (hp->n_rlayer && !(m->gdn = lm_calloc((size_t)hp->n_layer, sizeof(lm_gdn))))
        return nomem(L), lm_err(L->err, L->errlen, "out of memory");
    if (hp->kv_lora_rank) {
        m->mla = lm_calloc((size_t)hp->n_layer, sizeof(lm_mla));
        m->mla_heads = lm_calloc((size_t)hp->n_layer * 2 * (size_t)hp->n_head, sizeof(lm_weight));
        if (!m->mla || !m->mla_heads) return nomem(L), lm_err(L->err, L->errlen, "out of memory");
    }

    if (hp->encoder) return load_encoder(L);
    if (load_weight(L, "token_embd.weight", E, hp->n_vocab, &m->tok_embd)) return -1;
    if (load_vec(L, "output_norm.weight", E, true, &m->out_norm)) return -1;
    if (gguf_find_tensor(m->gguf, "output.weight")) {
        if (load_weight(L, "output.weight", E, hp->n_vocab, &m->output)) return -1;
        m->hp.tied_output = false;
    } else {
        m->output = hp->arch == LM_ARCH_GEMMA_EMBED ? (lm_weight){0} : m->tok_embd; /* its head: none, rows 0 */
        m->hp.tied_output = true;
    }
    if (hp->arch == LM_ARCH_GEMMA_EMBED && load_dense(L)) return -1;
    if (hp->arch == LM_ARCH_GEMMA2) { /* gemma2's head is the embedding, whatever else the file holds */
        m->output = m->tok_embd;
        m->hp.tied_output = true;
    }
    if (hp->arch == LM_ARCH_PHI3 &&
        (load_vec(L, "rope_factors_short.weight", hp->n_rot / 2, false, &m->hp.rope_factors_short) ||
         load_vec(L, "rope_factors_long.weight", hp->n_rot / 2, false, &m->hp.rope_factors_long)))
        return -1;
    char name[96];
    int n_rec = 0, n_kvl = 0;
    for (int i = 0; i < hp->n_layer; i++) {
        lm_layer *l = &m->layers[i];
        l->rec = -1;
        l->kv_layer = i;
        if (hp->n_rlayer) {
            if (load_hybrid_layer(L, i, l, false, &n_rec, &n_kvl)) return -1;
            l->rope_base = hp->rope_base;
            l->rope_scale = hp->rope_scale;
            if (report(L, 0.05 + 0.15 * (i + 1) / hp->n_layer)) return -1;
            continue;
        }
        if (hp->arch == LM_ARCH_GPT_OSS && load_gptoss_layer(L, i, l)) return -1;
        for (size_t k = 0; k < N_LAYER_TENSORS && !m->mla && hp->arch != LM_ARCH_GPT_OSS; k++) {
            /* deepseek2: load_mla_layer; gpt-oss: load_gptoss_layer */
            const layer_tensor *t = &layer_tensors[k];
            if (t->fused & ARCH(hp->arch)) continue;  /* load_fused below */
            if (t->ffn && hp->n_expert > 0) continue; /* load_moe below */
            snprintf(name, sizeof name, "blk.%d.%s", i, t->name);
            int rc = t->matrix
                ? load_weight(L, name, dim_len(hp, t->cols), dim_len(hp, t->rows), layer_weight(l, t))
                : load_vec(L, name, dim_len(hp, t->cols), (t->required & ARCH(hp->arch)) != 0, layer_vec(l, t));
            if (rc) return -1;
        }
        if ((FUSED_ARCHS & ARCH(hp->arch)) && load_fused(L, i, l)) return -1;
        if (m->mla) {
            if (load_mla_layer(L, i, l)) return -1;
        } else if (hp->n_expert > 0 && hp->arch != LM_ARCH_GPT_OSS && load_moe(L, i, l)) {
            return -1;
        }
        /* gemma, gpt-oss: every swa_pattern-th layer (counting from 1) is global; pattern 0: none is */
        bool local = hp->swa_window > 0 && (hp->swa_pattern == 0 || (i + 1) % hp->swa_pattern != 0);
        l->window = local ? hp->swa_window : 0;
        m->layer_local[i] = local && hp->causal; /* non-causal: one pass, every key kept (attn_tile_sym) */
        l->rope_base = local ? hp->rope_base_swa : hp->rope_base;
        l->rope_scale = local && (GEMMA3_ARCHS & ARCH(hp->arch)) ? 1.0f : hp->rope_scale;
        if (report(L, 0.05 + 0.15 * (i + 1) / hp->n_layer)) return -1;
    }
    (void)n_kvl; /* the layers with KV: n_layer - n_rlayer */
    if (hp->n_layer_mtp && hp->arch != LM_ARCH_QWEN3NEXT && load_mtp(L)) return -1;
    return count_params(m);
}

/* Interleaved copies (quant.h) of every matrix used in products whose type
 * has a packed kernel, in one allocation (2 MiB aligned and offered to
 * transparent huge pages: decode streams it once per token). Costs about
 * the bytes of those matrices again, e.g. 0.6 GiB for a 1.1B-parameter
 * Q4_0 model, 2 GiB for the same in F16 (the file's pages are then read
 * only for embedding rows, and the kernel may drop them); the embedding
 * table is not copied (only its rows are read), except as the LM head
 * when tied. */
#define PACK_ALIGN (2u << 20)

/* MemAvailable of /proc/meminfo in bytes (memory the kernel can hand out
 * without swapping, page cache included); 0 when unknown. */
static uint64_t meminfo_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[128];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

static int pack_weights(loader *L) {
    lm_model *m = L->m;
    m->packed_bytes = m->kb_bytes + m->shard_bytes;
    const int H = m->hp.n_head;
    const int n_max = MODEL_LAYER_MATRICES * m->hp.n_layer + 1 + 5 * m->hp.n_rlayer +
        (m->moe ? m->hp.n_layer * (1 + 3 * m->hp.n_expert) : 0) + (m->mla ? m->hp.n_layer * (3 + 2 * H) : 0);
    lm_weight **ws = lm_malloc((size_t)n_max * sizeof *ws);
    if (!ws) return nomem(L), lm_err(L->err, L->errlen, "out of memory");
    int k = 0;
    /* a pipeline stage packs its own layers, and the LM head on the last */
    const int l0 = m->pp.layer0, l1 = m->pp.layer1;
    for (int i = l0; i < l1; i++)
        for (size_t j = 0; j < N_LAYER_TENSORS; j++)
            if (layer_tensors[j].matrix) ws[k++] = layer_weight(&m->layers[i], &layer_tensors[j]);
    if (m->pp.stage == m->pp.size - 1) ws[k++] = &m->output;
    for (int i = l0; m->gdn && i < l1; i++) {
        lm_gdn *g = m->layers[i].gdn;
        if (!g) continue;
        ws[k++] = &g->qkv, ws[k++] = &g->z, ws[k++] = &g->beta, ws[k++] = &g->alpha, ws[k++] = &g->out;
    }
    for (int i = l0; m->moe && i < l1; i++) {
        if (!m->layers[i].moe) continue; /* deepseek2's leading dense layers */
        ws[k++] = &m->moe[i].gate_inp;
        for (int e = 0; e < 3 * m->hp.n_expert; e++) ws[k++] = &m->moe[i].gate[e]; /* gate, up, down follow */
    }
    for (int i = l0; m->mla && i < l1; i++) {
        ws[k++] = &m->mla[i].q_a;
        ws[k++] = &m->mla[i].q_b;
        ws[k++] = &m->mla[i].kv_a;
        for (int h = 0; h < H; h++) ws[k++] = &m->mla[i].k_b[h];
        for (int h = 0; h < H; h++) ws[k++] = &m->mla[i].v_b[h];
    }
    assert(k <= n_max);
    const int n_w = k;
    size_t total = 0;
    for (int i = 0; i < n_w; i++) {
        if (ws[i]->rows && kernels_matmul_packs(ws[i]->type))
            total += quant_pack_size(ws[i]->type, ws[i]->rows, ws[i]->cols);
    }
    /* Copies that would take most of the free memory are not made: the
     * row-major kernels compute the same products from the mapping, where
     * the kernel can page weights in and out. */
    uint64_t avail = meminfo_available();
    if (total == 0 || (avail && total > avail / 4 * 3)) {
        lm_free(ws);
        return 0;
    }
    m->packed_mem = lm_malloc(total + PACK_ALIGN);
    if (!m->packed_mem) {
        lm_free(ws);
        return nomem(L), lm_err(L->err, L->errlen, "out of memory for the packed weights (%zu bytes)", total);
    }
    uint8_t *p = (uint8_t *)(((uintptr_t)m->packed_mem + PACK_ALIGN - 1) & ~(uintptr_t)(PACK_ALIGN - 1));
    madvise(p, total / PACK_ALIGN * PACK_ALIGN, MADV_HUGEPAGE);
    size_t done = 0;
    for (int i = 0; i < n_w; i++) {
        lm_weight *w = ws[i];
        size_t sz = quant_pack_size(w->type, w->rows, w->cols);
        if (!w->rows || !kernels_matmul_packs(w->type) || !sz) continue;
        quant_pack(w->type, w->data, w->row_bytes, w->rows, w->cols, p);
        w->packed = p;
        p += sz;
        done += sz;
        if (report(L, 0.2 + 0.75 * (double)done / (double)total)) {
            lm_free(ws);
            return -1;
        }
    }
    m->packed_bytes += total;
    lm_free(ws);
    return 0;
}

static int shard(loader *L, int rank, int size, int stage, int n_stages, int ep_rank, int ep_size,
                 const lm_ep_counts *counts) {
    if ((L->m->hp.encoder || !L->m->hp.causal) && (size > 1 || n_stages > 1 || ep_size > 1))
        return unsupported(L),
               lm_err(L->err, L->errlen,
                      "a non-causal model (%s) runs in one process: no tensor, pipeline "
                      "or expert split",
                      model_arch_name(L->m->hp.arch));
    if (!model_shard(L->m, rank, size, L->err, L->errlen) && !model_stage(L->m, stage, n_stages, L->err, L->errlen) &&
        !model_ep(L->m, ep_rank, ep_size, counts, L->err, L->errlen))
        return 0;
    L->status = LM_ERR_UNSUPPORTED;
    return -1;
}

static lm_model *from_gguf(gguf_ctx *g, const lm_load_params *p, int rank, int size, int stage, int n_stages,
                           int ep_rank, int ep_size, const lm_ep_counts *counts, lm_status *status, char *err,
                           size_t errlen) {
    kernels_init();
    *status = LM_ERR_NOMEM;
    lm_model *m = lm_calloc(1, sizeof *m);
    if (!m) {
        lm_err(err, errlen, "out of memory");
        return NULL;
    }
    m->gguf = g;
    loader L = {.m = m,
                .err = err,
                .errlen = errlen,
                .status = LM_ERR_FORMAT,
                .progress = p ? p->progress : NULL,
                .progress_user = p ? p->progress_user : NULL};
    if (report(&L, 0) || model_read_hparams(&L) || report(&L, 0.05) || load_tensors(&L) ||
        shard(&L, rank, size, stage, n_stages, ep_rank, ep_size, counts) || pack_weights(&L) || report(&L, 0.95))
        goto failed;
    gguf_str s;
    if (gguf_get_str(g, "general.name", &s))
        snprintf(m->name, sizeof m->name, "%.*s", (int)(s.len < 127 ? s.len : 127), s.ptr);
    if (gguf_find_key(g, "tokenizer.ggml.model") >= 0) {
        char terr[LM_ERRLEN];
        m->tok = tok_load_status(g, &L.status, terr, sizeof terr);
        if (!m->tok) {
            lm_err(err, errlen, "tokenizer: %s", terr);
            goto failed;
        }
        if (tok_n_vocab(m->tok) > m->hp.n_vocab) {
            L.status = LM_ERR_FORMAT;
            lm_err(err, errlen, "tokenizer has %d tokens but the embedding only %d rows", tok_n_vocab(m->tok),
                   m->hp.n_vocab);
            goto failed;
        }
    }
    if (report(&L, 1)) goto failed;
    *status = LM_OK;
    return m;
failed:
    *status = L.status;
    m->gguf = NULL; /* the caller keeps g on failure */
    model_free(m);
    return NULL;
}

lm_model *model_load_gguf(gguf_ctx *g, char *err, size_t errlen) {
    lm_status st;
    lm_model *m = from_gguf(g, NULL, 0, 1, 0, 1, 0, 1, NULL, &st, err, errlen);
    if (m && !m->name[0]) snprintf(m->name, sizeof m->name, "model");
    return m;
}

lm_model *model_load(const char *path, char *err, size_t errlen) {
    lm_status st;
    return model_load_params(path, NULL, &st, err, errlen);
}

lm_model *model_load_params(const char *path, const lm_load_params *p, lm_status *status, char *err, size_t errlen) {
    return model_load_tp(path, p, 0, 1, status, err, errlen);
}

lm_model *model_load_tp(const char *path, const lm_load_params *p, int rank, int size, lm_status *status, char *err,
                        size_t errlen) {
    return model_load_grid(path, p, rank, size, 0, 1, status, err, errlen);
}

lm_model *model_load_grid(const char *path, const lm_load_params *p, int tp_rank, int tp_size, int pp_stage,
                          int pp_size, lm_status *status, char *err, size_t errlen) {
    return model_load_ep(path, p, tp_rank, tp_size, pp_stage, pp_size, 0, 1, NULL, status, err, errlen);
}

lm_model *model_load_ep(const char *path, const lm_load_params *p, int tp_rank, int tp_size, int pp_stage, int pp_size,
                        int ep_rank, int ep_size, const lm_ep_counts *counts, lm_status *status, char *err,
                        size_t errlen) {
    gguf_ctx *g = gguf_open_status(path, status, err, errlen);
    if (!g) return NULL;
    lm_model *m = from_gguf(g, p, tp_rank, tp_size, pp_stage, pp_size, ep_rank, ep_size, counts, status, err, errlen);
    if (!m) {
        gguf_close(g);
        return NULL;
    }
    if (!m->name[0]) {
        const char *base = strrchr(path, '/');
        snprintf(m->name, sizeof m->name, "%s", base ? base + 1 : path);
    }
    return m;
}

void model_free(lm_model *m) {
    if (!m) return;
    if (m->tok) tok_free(m->tok);
    lm_free(m->layers);
    lm_free(m->layer_local);
    lm_free(m->gdn);
    lm_free(m->mtp);
    lm_free(m->moe);
    lm_free(m->experts);
    lm_free(m->mla);
    lm_free(m->mla_heads);
    lm_free(m->kb_mem);
    lm_free(m->shard_mem);
    lm_free(m->ep.owner);
    lm_free(m->f32);
    lm_free(m->packed_mem);
    if (m->gguf) gguf_close(m->gguf);
    lm_free(m);
}
