/*
 * cmd_mkmodel.c - `lamina mkmodel`: write a random-weight GGUF of a real
 * shape, for benchmarks and tests. Deterministic from --seed whatever the
 * thread count: every row draws from its own generator seeded by
 * (seed, tensor index, row). The output is created (as a temporary file,
 * base/safefile.h) before the weights are generated, so a path that cannot
 * be written is refused at once, and renamed into place only when complete.
 *
 * Architectures: llama by default; the qwen3, gemma2 and phi3 presets write
 * their family's keys and tensors (qwen3's per-head Q/K norms and separate
 * head width, gemma2's post norms, soft-capping keys and alternate sliding
 * windows, phi3's fused attn_qkv and gate/up, long-rope factors and window),
 * real shapes scaled down. Their norm weights are 1 plus noise, so a reader
 * that skipped one would show. qwen3-embedding-small is qwen3-small as an
 * embedding model (Qwen3-Embedding's keys: qwen3.pooling_type last, and
 * tokenizer.ggml.add_eos_token over the --vocab-from vocabulary).
 * gemma-embedding-small is EmbeddingGemma's structure (gemma3's blocks, Q/K
 * and post norms, a window on 5 layers of 6, mean pooling, no LM head, the
 * dense_2 / dense_3 projections with their dense_*_feat_* keys) over a
 * SentencePiece vocabulary. The qwen35 presets (Qwen3.5, dense and
 * Mixture-of-Experts) are hybrids: of every gd_shape.interval layers the last
 * is full attention (a gated query, partial interleaved multi-section RoPE)
 * and the others gated-DeltaNet linear attention (gdn_layer), with the keys
 * and tensors llama.cpp's qwen35 and qwen35moe loaders read; qwen3next-small
 * is Qwen3-Next's variant of the MoE one (plain RoPE, a fused ssm_ba). With
 * --mtp 1 the qwen35 presets also write a next-token-prediction layer after
 * the trunk (block n_layer, counted in block_count,
 * <arch>.nextn_predict_layers 1): a full-attention layer with its FFN and the
 * nextn eh_proj, enorm, hnorm and shared_head_norm tensors, sharing the
 * embedding and the LM head. Every tensor draws from its own index, so the
 * trunk's weights are the same bytes with or without it. gpt-oss-small is
 * gpt-oss-20b scaled down, with the tensors llama.cpp's openai-moe loader
 * reads: biases on Q, K, V, the output, the router and each expert product,
 * a sink logit per query head (drawn N(0, 1); -inf with --no-sinks, which
 * leaves each softmax as it would be without them), post_attention_norm as
 * the FFN's norm, YaRN x32 from 4096 positions, a window of 128 on
 * alternate layers, its experts in MXFP4 (as the released files; --type
 * sets the other matrices, --expert-type the experts).
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "format/gguf.h"
#include "base/pool.h"
#include "base/safefile.h"
#include "format/quant.h"
#include "format/quantize.h"
#include "base/util.h"

static void usage_mkmodel(FILE *f) {
    fprintf(f,
            "usage: lamina mkmodel -o OUT.gguf [--preset NAME | shape flags] [--type T] [--seed S]\n"
            "Write a GGUF with random weights of a real shape (llama unless the preset says\n"
            "another architecture).\n\n"
            "  --preset NAME      tinyllama-1.1b (22 layers, n_embd 2048, 32 heads, 4 KV heads,\n"
            "                     n_ff 5632, vocab 32000, context 2048) or small (8 layers, n_embd 512,\n"
            "                     8 heads, 4 KV heads, n_ff 1408, vocab 32000, context 2048);\n"
            "                     other architectures, real shapes scaled down to 4 layers, n_embd 256:\n"
            "                     qwen3-small (Qwen3-0.6B: 4 heads of 128, 2 KV heads, n_ff 768, tied),\n"
            "                     qwen3-embedding-small (Qwen3-Embedding-0.6B: qwen3-small with pooling_type\n"
            "                     last and tokenizer.ggml.add_eos_token; needs --vocab-from with an EOS),\n"
            "                     gemma-embedding-small (EmbeddingGemma: 6 gemma3 layers of n_embd 128,\n"
            "                     window 16 on 5 of 6, mean pooling, dense 128 -> 512 -> 128),\n"
            "                     gemma2-small (Gemma 2 2B: 4 heads of 128, 2 KV heads, n_ff 1024,\n"
            "                     window 128 on alternate layers, soft-caps 50 and 30),\n"
            "                     phi3-small (Phi-3-mini-128k: 4 heads of 64, n_ff 640, fused QKV and\n"
            "                     gate/up, long-rope factors from 4096 to 131072, window 2047),\n"
            "                     qwen3moe-small (Qwen3-30B-A3B: 8 experts of 256, top 2, 4 heads of 128),\n"
            "                     qwen2moe-small (Qwen1.5-MoE-A2.7B: 8 experts of 128, top 4, shared\n"
            "                     expert of 512, QKV biases), mixtral-small (llama with 8 experts of 512,\n"
            "                     top 2), deepseek2-small (DeepSeek-V3's latent attention and routing:\n"
            "                     4 heads, q rank 96, latent 128 + RoPE key 32, 8 experts of 128, top 2,\n"
            "                     2 shared, 1 dense layer, YaRN x16 from 256 positions), deepseek2-lite\n"
            "                     (DeepSeek-V2-Lite: 27 layers, n_embd 2048, 16 heads, latent 512 + 64,\n"
            "                     64 experts of 1408, top 6, 2 shared, YaRN x40 from 4096 positions;\n"
            "                     --layers N for fewer), qwen35-small (Qwen3.5-9B, 8 layers: 3 gated-\n"
            "                     DeltaNet (2 key heads, 4 value heads of 64, conv 4) then 1 attention\n"
            "                     (4 gated heads of 128, 2 KV heads, RoPE on 32 dims), twice; n_ff 768),\n"
            "                     qwen35moe-small (Qwen3.5-35B-A3B: that pattern with value heads of 128,\n"
            "                     8 experts of 128, top 2, a shared expert of 128), qwen3next-small\n"
            "                     (Qwen3-Next-80B-A3B: qwen35moe-small's shape with plain NeoX RoPE on\n"
            "                     32 dims, value heads grouped by key head and a fused ssm_ba), gpt-oss-small\n"
            "                     (gpt-oss-20b: 8 heads of 64, 2 KV heads, window 128 on alternate layers,\n"
            "                     attention sinks, 32 experts of 256, top 4, biases everywhere, YaRN x32\n"
            "                     from 4096 positions)\n"
            "  --no-sinks         gpt-oss: write every attention sink as -inf (no term in the softmax)\n"
            "  --expert-type T    the experts' weight type (default: MXFP4 for gpt-oss, as its released\n"
            "                     files, --type for the others)\n"
            "  --mtp N            qwen35 presets: N (0 or 1) next-token-prediction layers after the\n"
            "                     trunk, for --spec mtp (default 0)\n"
            "  --kv-b-whole       deepseek2: store each layer's attn_kv_b whole, without the\n"
            "                     *_length_mla keys, as older conversions did (the same weights as\n"
            "                     the attn_k_b / attn_v_b of the default layout)\n"
            "  --recurrent-layers qwen35, qwen3next: also write attention.recurrent_layers (the\n"
            "                     layer pattern as booleans, as converters do when the checkpoint\n"
            "                     lists its layer types)\n"
            "  --ssm-in           qwen3next: store each recurrent layer's q, k, v and z projections\n"
            "                     in one ssm_in, interleaved per key head, as older conversions did\n"
            "                     (the same weights as the attn_qkv / attn_gate of the default layout)\n"
            "  --experts N --experts-used N --ff-exp N --ff-shexp N   Mixture-of-Experts shape\n"
            "                     (--ff-shexp: the shared expert's width, qwen2moe and qwen35moe)\n"
            "  --layers N --embd N --heads N --kv-heads N --ff N --vocab N --ctx N   custom shape\n"
            "  --type T           weight type: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_1 Q4_K Q6_K MXFP4 (default F16);\n"
            "                     norms, routers, conv kernels and per-head vectors stay F32\n"
            "  --vocab-from FILE  copy the tokenizer metadata of another GGUF (the vocabulary size\n"
            "                     then follows that file)\n"
            "  --seed S           default 1\n"
            "  -t, --threads N    threads for generating and quantizing\n");
}

typedef struct {
    const char *name;
    int layers, embd, heads, kv_heads, ff, vocab, ctx;
    const char *arch;                    /* general.architecture; NULL: llama */
    int head_dim;                        /* 0: embd / heads */
    int window;                          /* sliding window (gemma2, phi3), 0: none */
    int experts, used, ff_exp, ff_shexp; /* Mixture-of-Experts (experts 0: dense) */
} preset;

static const preset presets[] = {
    {"tinyllama-1.1b", 22, 2048, 32, 4, 5632, 32000, 2048, NULL, 0, 0, 0, 0, 0, 0},
    {"small", 8, 512, 8, 4, 1408, 32000, 2048, NULL, 0, 0, 0, 0, 0, 0},
    {"qwen3-small", 4, 256, 4, 2, 768, 32000, 40960, "qwen3", 128, 0, 0, 0, 0, 0},
    /* Qwen3-Embedding: qwen3-small's shape, pooling_type last, EOS appended to each input */
    {"qwen3-embedding-small", 4, 256, 4, 2, 768, 32000, 40960, "qwen3", 128, 0, 0, 0, 0, 0},
    {"gemma2-small", 4, 256, 4, 2, 1024, 32000, 8192, "gemma2", 128, 128, 0, 0, 0, 0},
    {"phi3-small", 4, 256, 4, 4, 640, 32064, 131072, "phi3", 0, 2047, 0, 0, 0, 0},
    {"qwen3moe-small", 4, 256, 4, 2, 768, 32000, 40960, "qwen3moe", 128, 0, 8, 2, 256, 0},
    {"qwen2moe-small", 4, 256, 4, 4, 512, 32000, 8192, "qwen2moe", 0, 0, 8, 4, 128, 512},
    {"mixtral-small", 4, 256, 8, 2, 512, 32000, 32768, "llama", 0, 0, 8, 2, 512, 0},
    /* deepseek2: n_ff is the leading dense layers' width, the shape of the attention in mla_shapes */
    {"deepseek2-small", 4, 256, 4, 1, 512, 32000, 4096, "deepseek2", 0, 0, 8, 2, 128, 0},
    {"deepseek2-lite", 27, 2048, 16, 1, 10944, 102400, 163840, "deepseek2", 0, 0, 64, 6, 1408, 0},
    /* the linear-attention layers' shape in gd_shapes */
    {"qwen35-small", 8, 256, 4, 2, 768, 32000, 4096, "qwen35", 128, 0, 0, 0, 0, 0},
    {"qwen35moe-small", 8, 256, 4, 2, 128, 32000, 4096, "qwen35moe", 128, 0, 8, 2, 128, 128},
    {"qwen3next-small", 8, 256, 4, 2, 128, 32000, 4096, "qwen3next", 128, 0, 8, 2, 128, 128},
    /* gpt-oss-20b (24 layers, n_embd 2880, 64 heads of 64, 8 KV heads, 32 experts of 2880, top 4) */
    {"gpt-oss-small", 4, 256, 8, 2, 256, 32000, 131072, "gpt-oss", 64, 128, 32, 4, 256, 0},
    /* encoders (enc_tensors), the vocabulary a WordPiece one (--vocab-from, default ENC_VOCAB):
     * bge-small-en-v1.5 (12 layers, n_embd 384, 12 heads, n_ff 1536, CLS pooling) and
     * nomic-embed-text-v1.5 (12 layers, n_embd 768, 12 heads, n_ff 3072, mean pooling) scaled down */
    {"bert-small", 2, 128, 4, -1, 512, 0, 512, "bert", 0, 0, 0, 0, 0, 0},
    /* EmbeddingGemma-300m (24 layers, n_embd 768, 3 heads of 256, 1 KV head, n_ff 1152, window 512,
     * dense 768 -> 3072 -> 768, mean pooling) scaled down: 6 layers (the 6th global), window 16,
     * dense 128 -> GEMB_DENSE -> 128; a SentencePiece vocabulary (--vocab-from, default GEMB_VOCAB) */
    {"gemma-embedding-small", 6, 128, 4, 2, 512, 0, 2048, "gemma-embedding", 32, 16, 0, 0, 0, 0},
    {"nomic-bert-small", 2, 128, 4, -1, 512, 0, 2048, "nomic-bert", 0, 0, 0, 0, 0, 0},
};

/* Multi-head latent attention and DeepSeek's expert routing, per deepseek2 preset. */
typedef struct {
    const char *name;
    int q_lora, kv_lora, nope, rope, v_dim; /* ranks, a head's widths */
    int dense, shared;                      /* leading dense layers, shared experts */
    bool sigmoid, norm;                     /* router: sigmoid with a selection bias (V3), renormalised */
    float scale;                            /* expert_weights_scale */
    float yarn, log_mul;                    /* YaRN factor (0: none), yarn_log_multiplier (0.1 x mscale_all_dim) */
    int yarn_ctx;                           /* the original context length it stretches */
    bool betas;                             /* write yarn_beta_fast/slow (32, 1) as current converters do */
} mla_shape;

static const mla_shape mla_shapes[] = {
    /* DeepSeek-V3 scaled down: q bottleneck, sigmoid router with bias, renormalised, scale 2.5 */
    /* and its YaRN (factor 40 from 4096, mscale_all_dim 1) as a factor of 16 from 256 positions, so
     * that a 512-position test runs past the original context */
    {"deepseek2-small", 96, 128, 64, 32, 64, 1, 2, true, true, 2.5f, 16.0f, 0.1f, 256, false},
    /* DeepSeek-V2-Lite: attn_q, a latent of 512, softmax router, 2 shared experts; YaRN 40 from 4096
     * with mscale_all_dim 0.707 */
    {"deepseek2-lite", 0, 512, 128, 64, 128, 1, 2, false, false, 1.0f, 40.0f, 0.0707f, 4096, true},
};

/* Qwen3.5's hybrid layout, per qwen35 preset: gated-DeltaNet layers with H_k
 * key heads and H_v value heads (a multiple of H_k) of one width (dk = dv,
 * as llama.cpp requires), and every interval-th layer full attention. */
typedef struct {
    const char *name;
    int k_heads, v_heads, head_dim; /* H_k, H_v, dk = dv */
    int conv;                       /* causal conv taps (ssm.conv_kernel) */
    int interval;                   /* layer i is full attention iff (i + 1) % interval == 0 */
    int rope;                       /* rotated dims of an attention head (partial RoPE) */
    int32_t sections[4];            /* rope.dimension_sections: rotated pairs per section, sum rope / 2;
                                       all 0: none written (qwen3next's plain RoPE) */
    bool fused_ba;                  /* qwen3next: beta and alpha in one ssm_ba, per key head [betas | alphas] */
} gd_shape;

static const gd_shape gd_shapes[] = {
    /* Qwen3.5-9B: 16 key and 32 value heads of 128 (inner size = n_embd), attention heads of 256
     * rotating a quarter of their dims in sections [11, 11, 10] */
    {"qwen35-small", 2, 4, 64, 4, 4, 32, {6, 5, 5, 0}, false},
    /* Qwen3.5-35B-A3B: the same heads, an inner size of twice n_embd */
    {"qwen35moe-small", 2, 4, 128, 4, 4, 32, {6, 5, 5, 0}, false},
    /* Qwen3-Next-80B-A3B: 16 key and 32 value heads of 128 (inner size twice n_embd), attention
     * heads of 256 rotating a quarter of their dims, plain NeoX RoPE; 512 experts of 512, top 10,
     * a shared expert of 512 */
    {"qwen3next-small", 2, 4, 128, 4, 4, 32, {0, 0, 0, 0}, true},
};

typedef struct {
    void *dst;
    int64_t rows, cols;
    uint32_t type;
    float scale;
    uint64_t seed;
    atomic_long next;
} fill_job;

/* Cheap approximately normal values (sum of four uniforms, unit variance). */
static float approx_normal(lm_rng *r) {
    uint64_t u = lm_rng_u64(r);
    float s = 0;
    for (int i = 0; i < 4; i++) s += (float)((u >> (16 * i)) & 0xffff) * (1.0f / 65536.0f);
    return (s - 2.0f) * 1.7320508f;
}

static void fill_worker(void *arg, int ith, int nth) {
    fill_job *j = arg;
    size_t rb = quant_row_size(j->type, j->cols);
    float *row = malloc((size_t)j->cols * sizeof(float));
    if (!row) return;
    for (;;) {
        long r = atomic_fetch_add(&j->next, 1);
        if (r >= j->rows) break;
        lm_rng rng;
        lm_rng_seed(&rng, j->seed * 0x9e3779b97f4a7c15ull + (uint64_t)r);
        for (int64_t c = 0; c < j->cols; c++) row[c] = approx_normal(&rng) * j->scale;
        quant_from_float_ref(j->type, row, (char *)j->dst + (size_t)r * rb, j->cols);
    }
    free(row);
}

typedef struct {
    gguf_writer *w;
    lm_pool *pool;
    uint64_t seed;
    int n_tensors; /* tensors drawn so far: tensor k's rows draw from seed + k * 7919 */
    void **bufs;   /* (n_bufs) owned until the file is written */
    int n_bufs;
    uint64_t bytes;
} maker;

static int add(maker *mk, const char *name, int64_t cols, int64_t rows, uint32_t type, float scale, bool ones) {
    if (quant_row_size(type, cols) == 0) type = cols % 32 == 0 ? LM_TYPE_Q8_0 : LM_TYPE_F16;
    size_t bytes = quant_row_size(type, cols) * (size_t)rows;
    void *buf = malloc(bytes);
    if (!buf) return -1;
    mk->bufs[mk->n_bufs++] = buf;
    mk->n_tensors++;
    if (ones) { /* a norm vector: 1, plus noise of that scale when scale > 0 */
        lm_rng rng;
        lm_rng_seed(&rng, mk->seed * 0x9e3779b97f4a7c15ull + (uint64_t)mk->n_tensors * 7919u);
        for (int64_t i = 0; i < cols; i++) ((float *)buf)[i] = 1.0f + (scale > 0 ? scale * approx_normal(&rng) : 0);
    } else {
        fill_job j = {.dst = buf,
                      .rows = rows,
                      .cols = cols,
                      .type = type,
                      .scale = scale,
                      .seed = mk->seed + (uint64_t)mk->n_tensors * 7919u};
        atomic_init(&j.next, 0);
        pool_run(mk->pool, fill_worker, &j);
    }
    uint64_t ne[2] = {(uint64_t)cols, (uint64_t)rows};
    mk->bytes += bytes;
    return gguf_w_add_tensor(mk->w, name, rows > 1 ? 2 : 1, ne, type, buf, bytes);
}

/* A 3-D tensor of n_mat (rows, cols) matrices (the experts), each row
 * drawn as add() draws them. */
static int add3(maker *mk, const char *name, int64_t cols, int64_t rows, int64_t n_mat, uint32_t type, float scale) {
    if (quant_row_size(type, cols) == 0) type = cols % 32 == 0 ? LM_TYPE_Q8_0 : LM_TYPE_F16;
    size_t bytes = quant_row_size(type, cols) * (size_t)(rows * n_mat);
    void *buf = malloc(bytes);
    if (!buf) return -1;
    mk->bufs[mk->n_bufs++] = buf;
    mk->n_tensors++;
    fill_job j = {.dst = buf,
                  .rows = rows * n_mat,
                  .cols = cols,
                  .type = type,
                  .scale = scale,
                  .seed = mk->seed + (uint64_t)mk->n_tensors * 7919u};
    atomic_init(&j.next, 0);
    pool_run(mk->pool, fill_worker, &j);
    uint64_t ne[3] = {(uint64_t)cols, (uint64_t)rows, (uint64_t)n_mat};
    mk->bytes += bytes;
    return gguf_w_add_tensor(mk->w, name, 3, ne, type, buf, bytes);
}

/* The float values add3 would draw for its next tensor, as a tensor of the
 * seed sequence that is not written (kept in bufs). */
static float *draw_f32(maker *mk, int64_t rows, int64_t cols, float scale) {
    float *buf = malloc((size_t)(rows * cols) * sizeof(float));
    if (!buf) return NULL;
    mk->bufs[mk->n_bufs++] = buf;
    mk->n_tensors++;
    fill_job j = {.dst = buf,
                  .rows = rows,
                  .cols = cols,
                  .type = LM_TYPE_F32,
                  .scale = scale,
                  .seed = mk->seed + (uint64_t)mk->n_tensors * 7919u};
    atomic_init(&j.next, 0);
    pool_run(mk->pool, fill_worker, &j);
    return buf;
}

/* attn_kv_b as older conversions stored it, (H * (nope + v_dim), kv_lora):
 * per head the rows of W_UK (the transpose of that head's attn_k_b block)
 * then of W_UV (its attn_v_b block), from the values attn_k_b and attn_v_b
 * get in the split layout (the same seeds). */
static int add_kv_b(maker *mk, const char *name, int64_t H, int64_t R, int64_t nope, int64_t vd, uint32_t t, float wr) {
    float *kb = draw_f32(mk, H * R, nope, wr), *vb = draw_f32(mk, H * vd, R, wr);
    int64_t rows = H * (nope + vd);
    float *kv = malloc((size_t)(rows * R) * sizeof(float));
    if (!kb || !vb || !kv) {
        free(kv);
        return -1;
    }
    for (int64_t h = 0; h < H; h++) {
        float *w = kv + (size_t)(h * (nope + vd) * R);
        for (int64_t j = 0; j < nope; j++)
            for (int64_t r = 0; r < R; r++) w[j * R + r] = kb[(size_t)((h * R + r) * nope + j)];
        memcpy(w + nope * R, vb + (size_t)(h * vd * R), (size_t)(vd * R) * sizeof(float));
    }
    if (quant_row_size(t, R) == 0) t = R % 32 == 0 ? LM_TYPE_Q8_0 : LM_TYPE_F16;
    size_t rb = quant_row_size(t, R);
    void *buf = malloc(rb * (size_t)rows);
    if (!buf) {
        free(kv);
        return -1;
    }
    mk->bufs[mk->n_bufs++] = buf;
    for (int64_t r = 0; r < rows; r++) quant_from_float_ref(t, kv + (size_t)(r * R), (char *)buf + (size_t)r * rb, R);
    free(kv);
    uint64_t ne[2] = {(uint64_t)R, (uint64_t)rows};
    mk->bytes += rb * (size_t)rows;
    return gguf_w_add_tensor(mk->w, name, 2, ne, t, buf, rb * (size_t)rows);
}

/* Layer i's latent attention after its attn_norm (deepseek2), as llama.cpp's
 * converter writes it: attn_k_b holds each head's W_UKᵀ (kv_lora rows of
 * nope), attn_v_b each head's W_UV (v_dim rows of kv_lora); or, kv_b_whole,
 * both in one attn_kv_b as older conversions stored them. */
static int mla_layer(maker *mk, int i, const mla_shape *ml, const preset *p, uint32_t t, float nn, bool kv_b_whole) {
    int64_t E = p->embd, H = p->heads, QK = (int64_t)ml->nope + ml->rope, R = ml->kv_lora;
    float ws = 1.0f / sqrtf((float)E), wr = 1.0f / sqrtf((float)R);
    char n[96];
    int rc = 0;
#define N(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, i), n)
    if (ml->q_lora) {
        rc |= add(mk, N("attn_q_a.weight"), E, ml->q_lora, t, ws, false);
        rc |= add(mk, N("attn_q_a_norm.weight"), ml->q_lora, 1, LM_TYPE_F32, nn, true);
        rc |= add(mk, N("attn_q_b.weight"), ml->q_lora, H * QK, t, 1.0f / sqrtf((float)ml->q_lora), false);
    } else {
        rc |= add(mk, N("attn_q.weight"), E, H * QK, t, ws, false);
    }
    rc |= add(mk, N("attn_kv_a_mqa.weight"), E, R + ml->rope, t, ws, false);
    rc |= add(mk, N("attn_kv_a_norm.weight"), R, 1, LM_TYPE_F32, nn, true);
    if (kv_b_whole) {
        rc |= add_kv_b(mk, N("attn_kv_b.weight"), H, R, ml->nope, ml->v_dim, t, wr);
    } else {
        rc |= add3(mk, N("attn_k_b.weight"), ml->nope, R, H, t, wr);
        rc |= add3(mk, N("attn_v_b.weight"), R, ml->v_dim, H, t, wr);
    }
    rc |= add(mk, N("attn_output.weight"), H * ml->v_dim, E, t, 1.0f / sqrtf((float)(H * ml->v_dim)), false);
#undef N
    return rc;
}

/* A recurrent layer's per-head F32 vector, n values from the tensor's own
 * generator (seeded as the norms are): decay, ssm_a = -A with A uniform in
 * [1, 16] (the -exp(A_log) converters store, A_log = log A as the model's
 * initialisation draws it); otherwise ssm_dt.bias, the inverse softplus
 * dt + log(-expm1(-dt)) of a step dt log-uniform in [0.001, 0.1], so that
 * softplus(alpha + dt_bias) starts from that range. */
static int add_gd_vec(maker *mk, const char *name, int64_t n, bool decay) {
    float *buf = malloc((size_t)n * sizeof(float));
    if (!buf) return -1;
    mk->bufs[mk->n_bufs++] = buf;
    mk->n_tensors++;
    lm_rng rng;
    lm_rng_seed(&rng, mk->seed * 0x9e3779b97f4a7c15ull + (uint64_t)mk->n_tensors * 7919u);
    for (int64_t i = 0; i < n; i++) {
        double u = lm_rng_uniform(&rng);
        if (decay) {
            buf[i] = (float)-(1.0 + 15.0 * u);
        } else {
            double dt = exp(log(0.001) + u * (log(0.1) - log(0.001)));
            buf[i] = (float)(dt + log(-expm1(-dt)));
        }
    }
    uint64_t ne[1] = {(uint64_t)n};
    mk->bytes += (uint64_t)n * sizeof(float);
    return gguf_w_add_tensor(mk->w, name, 1, ne, LM_TYPE_F32, buf, (size_t)n * sizeof(float));
}

/* Layer i's gated-DeltaNet block after its attn_norm, as llama.cpp's qwen35
 * loader reads it: attn_qkv projects to the conv channels (H_k * dk queries,
 * as many keys, then H_v * dv values), attn_gate to the output gate z,
 * ssm_conv1d holds conv taps per channel (F32, as llama.cpp's quantizer
 * keeps it), ssm_alpha and ssm_beta give each value head's decay step and
 * write strength, ssm_norm the gated RMSNorm of a value head, ssm_out the
 * projection back. qwen3next (fused_ba) has one ssm_ba of 2 H_v rows instead
 * of ssm_beta and ssm_alpha: per key head its H_v / H_k beta rows, then as
 * many alpha rows (the layout of llama.cpp's converter, which keeps the
 * checkpoint's in_proj_ba as it is). */
/* An older qwen3next conversion's ssm_in, (C + VD rows, E): per key head its
 * q rows (dk), k rows (dk), its value heads' rows (r dv) and their z rows
 * (r dv), r = H_v / H_k, from the values attn_qkv and attn_gate get in the
 * split layout (the same seeds; rows quantized one by one, so the same
 * bytes per row). */
static int add_ssm_in(maker *mk, const char *name, const gd_shape *gd, int64_t E, uint32_t t, float ws) {
    const int64_t dk = gd->head_dim, hk = gd->k_heads, r = gd->v_heads / gd->k_heads, rv = r * dk;
    const int64_t KD = hk * dk, VD = (int64_t)gd->v_heads * dk, C = 2 * KD + VD, G = 2 * dk + 2 * rv;
    float *qkv = draw_f32(mk, C, E, ws), *z = draw_f32(mk, VD, E, ws);
    if (!qkv || !z) return -1;
    if (quant_row_size(t, E) == 0) t = E % 32 == 0 ? LM_TYPE_Q8_0 : LM_TYPE_F16;
    size_t rb = quant_row_size(t, E), rows = (size_t)(C + VD);
    char *buf = malloc(rb * rows);
    if (!buf) return -1;
    mk->bufs[mk->n_bufs++] = buf;
    for (int64_t k = 0; k < hk; k++) {
        const float *src[4] = {qkv + k * dk * E, qkv + (KD + k * dk) * E, qkv + (2 * KD + k * rv) * E, z + k * rv * E};
        const int64_t len[4] = {dk, dk, rv, rv};
        for (int part = 0, row = (int)(k * G); part < 4; part++)
            for (int64_t j = 0; j < len[part]; j++, row++)
                quant_from_float_ref(t, src[part] + j * E, buf + (size_t)row * rb, E);
    }
    uint64_t ne[2] = {(uint64_t)E, (uint64_t)rows};
    mk->bytes += rb * rows;
    return gguf_w_add_tensor(mk->w, name, 2, ne, t, buf, rb * rows);
}

static int gdn_layer(maker *mk, int i, const gd_shape *gd, int64_t E, uint32_t t, float nn, bool ssm_in) {
    int64_t KD = (int64_t)gd->k_heads * gd->head_dim, VD = (int64_t)gd->v_heads * gd->head_dim;
    int64_t C = 2 * KD + VD, H = gd->v_heads;
    float ws = 1.0f / sqrtf((float)E);
    char n[96];
    int rc = 0;
#define N(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, i), n)
    if (ssm_in) {
        rc |= add_ssm_in(mk, N("ssm_in.weight"), gd, E, t, ws);
    } else {
        rc |= add(mk, N("attn_qkv.weight"), E, C, t, ws, false);
        rc |= add(mk, N("attn_gate.weight"), E, VD, t, ws, false);
    }
    rc |= add(mk, N("ssm_conv1d.weight"), gd->conv, C, LM_TYPE_F32, 1.0f / sqrtf((float)gd->conv), false);
    rc |= add_gd_vec(mk, N("ssm_dt.bias"), H, false);
    rc |= add_gd_vec(mk, N("ssm_a"), H, true);
    if (gd->fused_ba) {
        rc |= add(mk, N("ssm_ba.weight"), E, 2 * H, t, ws, false);
    } else {
        rc |= add(mk, N("ssm_beta.weight"), E, H, t, ws, false);
        rc |= add(mk, N("ssm_alpha.weight"), E, H, t, ws, false);
    }
    rc |= add(mk, N("ssm_norm.weight"), gd->head_dim, 1, LM_TYPE_F32, nn, true);
    rc |= add(mk, N("ssm_out.weight"), VD, E, t, 1.0f / sqrtf((float)VD), false);
#undef N
    return rc;
}

/* The vocabulary the encoder presets take when --vocab-from does not say. */
#define ENC_VOCAB "tests/data/vocab/ggml-vocab-wpm.gguf"
#define GEMB_VOCAB "tests/data/vocab/ggml-vocab-llama-spm.gguf"
#define GEMB_DENSE 512 /* gemma-embedding-small's dense_2 rows (dense_3's cols) */

/* An encoder's tensors (bert, nomic-bert), as llama.cpp's converter names
 * them: the embeddings and their LayerNorm, then per layer the attention
 * (bert: Q, K, V with biases; nomic-bert: one attn_qkv, no biases), the
 * output (bert: with a bias), its LayerNorm, the FFN (bert: up and down with
 * biases; nomic-bert: gate, up, down) and the layer's output LayerNorm.
 * LayerNorm weights are 1 plus noise, their biases small draws. */
static int enc_tensors(maker *mk, const preset *p, uint32_t t, bool nomic) {
    int64_t E = p->embd, F = p->ff, KV = (int64_t)p->kv_heads * (p->embd / p->heads);
    float ws = 1.0f / sqrtf((float)E), wf = 1.0f / sqrtf((float)F), nn = 0.1f;
    int rc = add(mk, "token_embd.weight", E, p->vocab, t, 1.0f, false);
    rc |= add(mk, "token_types.weight", E, 2, LM_TYPE_F32, 0.5f, false);
    if (!nomic) rc |= add(mk, "position_embd.weight", E, p->ctx, t, 0.5f, false);
    rc |= add(mk, "token_embd_norm.weight", E, 1, LM_TYPE_F32, nn, true);
    rc |= add(mk, "token_embd_norm.bias", E, 1, LM_TYPE_F32, 0.1f, false);
    for (int i = 0; i < p->layers && !rc; i++) {
        char n[96];
#define A(suffix, cols, rows, ty, sc, ones)                                                                            \
    (snprintf(n, sizeof n, "blk.%d." suffix, i), add(mk, n, cols, rows, ty, sc, ones))
        if (nomic) {
            rc |= A("attn_qkv.weight", E, E + 2 * KV, t, ws, false);
        } else {
            rc |= A("attn_q.weight", E, E, t, ws, false);
            rc |= A("attn_q.bias", E, 1, LM_TYPE_F32, 0.1f, false);
            rc |= A("attn_k.weight", E, KV, t, ws, false);
            rc |= A("attn_k.bias", KV, 1, LM_TYPE_F32, 0.1f, false);
            rc |= A("attn_v.weight", E, KV, t, ws, false);
            rc |= A("attn_v.bias", KV, 1, LM_TYPE_F32, 0.1f, false);
        }
        rc |= A("attn_output.weight", E, E, t, ws, false);
        if (!nomic) rc |= A("attn_output.bias", E, 1, LM_TYPE_F32, 0.1f, false);
        rc |= A("attn_output_norm.weight", E, 1, LM_TYPE_F32, nn, true);
        rc |= A("attn_output_norm.bias", E, 1, LM_TYPE_F32, 0.1f, false);
        if (nomic) rc |= A("ffn_gate.weight", E, F, t, ws, false);
        rc |= A("ffn_up.weight", E, F, t, ws, false);
        if (!nomic) rc |= A("ffn_up.bias", F, 1, LM_TYPE_F32, 0.1f, false);
        rc |= A("ffn_down.weight", F, E, t, wf, false);
        if (!nomic) rc |= A("ffn_down.bias", E, 1, LM_TYPE_F32, 0.1f, false);
        rc |= A("layer_output_norm.weight", E, 1, LM_TYPE_F32, nn, true);
        rc |= A("layer_output_norm.bias", E, 1, LM_TYPE_F32, 0.1f, false);
#undef A
    }
    return rc;
}

int cmd_mkmodel(int argc, char **argv) {
    args a = {argc, argv, 0, "mkmodel", usage_mkmodel};
    const char *out = NULL, *vocab_from = NULL, *type_name = "F16", *xtype_name = NULL;
    preset p = {"custom", 2, 256, 4, -1, 512, 512, 512, NULL, 0, 0, 0, 0, 0, 0}; /* kv heads -1: as many as heads */
    long long seed = 1, threads = pool_default_threads();
    bool kv_b_whole = false, ssm_in = false, rec_layers = false, no_sinks = false;
    int mtp = 0;
    for (a.i = 1; a.i < argc; a.i++) {
        if (is_help(&a)) continue;
        if (is_flag(&a, "-o", "--output")) out = need_val(&a);
        else if (is_flag(&a, "--preset", NULL)) {
            const char *n = need_val(&a);
            bool found = false;
            for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
                if (!strcmp(presets[i].name, n)) p = presets[i], found = true;
            if (!found) die_usage(&a, "unknown preset '%s'", n);
        } else if (is_flag(&a, "--layers", NULL)) p.layers = (int)need_int(&a, 1, 1024);
        else if (is_flag(&a, "--embd", NULL)) p.embd = (int)need_int(&a, 32, 65536);
        else if (is_flag(&a, "--heads", NULL)) p.heads = (int)need_int(&a, 1, 1024);
        else if (is_flag(&a, "--kv-heads", NULL)) p.kv_heads = (int)need_int(&a, 1, 1024);
        else if (is_flag(&a, "--ff", NULL)) p.ff = (int)need_int(&a, 32, 1 << 20);
        else if (is_flag(&a, "--vocab", NULL)) p.vocab = (int)need_int(&a, 2, 1 << 22);
        else if (is_flag(&a, "--ctx", NULL)) p.ctx = (int)need_int(&a, 1, 1 << 24);
        else if (is_flag(&a, "--experts", NULL)) p.experts = (int)need_int(&a, 0, 1024);
        else if (is_flag(&a, "--experts-used", NULL)) p.used = (int)need_int(&a, 1, 1024);
        else if (is_flag(&a, "--ff-exp", NULL)) p.ff_exp = (int)need_int(&a, 32, 1 << 20);
        else if (is_flag(&a, "--ff-shexp", NULL)) p.ff_shexp = (int)need_int(&a, 0, 1 << 20);
        else if (is_flag(&a, "--type", NULL)) type_name = need_val(&a);
        else if (is_flag(&a, "--expert-type", NULL)) xtype_name = need_val(&a);
        else if (is_flag(&a, "--vocab-from", NULL)) vocab_from = need_val(&a);
        else if (is_flag(&a, "--kv-b-whole", NULL)) kv_b_whole = true;
        else if (is_flag(&a, "--mtp", NULL)) mtp = (int)need_int(&a, 0, 1);
        else if (is_flag(&a, "--ssm-in", NULL)) ssm_in = true;
        else if (is_flag(&a, "--no-sinks", NULL)) no_sinks = true;
        else if (is_flag(&a, "--recurrent-layers", NULL)) rec_layers = true;
        else if (is_flag(&a, "--seed", NULL)) seed = need_int(&a, 0, 0x7fffffffffffffffLL);
        else if (is_flag(&a, "-t", "--threads")) threads = need_int(&a, 1, 1024);
        else die_usage(&a, "unknown argument '%s'", argv[a.i]);
    }
    if (!out) die_usage(&a, "%s", "no output file (-o OUT.gguf)");
    int type = quant_type_from_name(type_name);
    if (type < 0 || !quant_traits((uint32_t)type)->from_float)
        die_usage(&a, "weight type '%s' cannot be written (F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_1 Q4_K Q6_K MXFP4)",
                  type_name);
    /* the experts' type: --expert-type, else gpt-oss's MXFP4 (as its released files), else --type */
    if (!xtype_name) xtype_name = p.arch && !strcmp(p.arch, "gpt-oss") ? "MXFP4" : type_name;
    int xtype = quant_type_from_name(xtype_name);
    if (xtype < 0 || !quant_traits((uint32_t)xtype)->from_float)
        die_usage(&a, "expert type '%s' cannot be written (F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_1 Q4_K Q6_K MXFP4)",
                  xtype_name);
    if (p.kv_heads < 0) p.kv_heads = p.heads;
    if (p.experts && (p.used < 1 || p.used > p.experts || p.ff_exp < 32))
        die_usage(&a, "%s", "experts need --experts-used between 1 and --experts, and --ff-exp");
    if ((!p.head_dim && p.embd % p.heads) || p.heads % p.kv_heads)
        die_usage(&a, "%s", "embd must be a multiple of heads, and heads a multiple of kv-heads");
    char err[LM_ERRLEN];
    gguf_ctx *vsrc = NULL;
    bool bert = p.arch && !strcmp(p.arch, "bert"), nomic = p.arch && !strcmp(p.arch, "nomic-bert");
    if ((bert || nomic) && !vocab_from) vocab_from = ENC_VOCAB;
    bool gemb = p.arch && !strcmp(p.arch, "gemma-embedding");
    if (gemb && !vocab_from) vocab_from = GEMB_VOCAB;
    if (vocab_from) {
        vsrc = gguf_open(vocab_from, err, sizeof err);
        if (!vsrc) {
            fprintf(stderr, "lamina mkmodel: %s: %s\n", vocab_from, err);
            return 1;
        }
        gguf_arr toks;
        if (!gguf_get_arr(vsrc, "tokenizer.ggml.tokens", &toks))
            fail("mkmodel", "--vocab-from file has no tokenizer.ggml.tokens");
        p.vocab = (int)toks.n;
        gguf_str tm;
        if ((bert || nomic) && !(gguf_get_str(vsrc, "tokenizer.ggml.model", &tm) && gguf_str_eq(tm, "bert")))
            fail("mkmodel", "an encoder preset needs a WordPiece vocabulary (tokenizer.ggml.model \"bert\")");
    }
    if (p.vocab < 2) die_usage(&a, "%s", "the encoder presets need --vocab-from (a WordPiece vocabulary)");
    maker mk = {.w = gguf_writer_new(), .pool = pool_new((int)threads), .seed = (uint64_t)seed};
    mk.bufs = calloc((size_t)(6 + 24 * (p.layers + 1)), sizeof(void *));
    if (!mk.w || !mk.pool || !mk.bufs) fail("mkmodel", "out of memory");
    /* the output is checked, and its temporary file created, before the work;
     * from here every failure removes that temporary file and nothing else */
    if (vocab_from && safefile_check_distinct(vocab_from, out, err, sizeof err)) fail("mkmodel", err);
    safefile *sf = safefile_create(out, err, sizeof err);
    if (!sf) fail("mkmodel", err);
    gguf_writer *w = mk.w;
    int hd = p.head_dim ? p.head_dim : p.embd / p.heads;
    const char *arch = p.arch ? p.arch : "llama";
    bool qwen3 = !strcmp(arch, "qwen3") || !strcmp(arch, "qwen3moe"), gemma2 = !strcmp(arch, "gemma2");
    bool embedder = !strcmp(p.name, "qwen3-embedding-small");
    if (embedder && !vsrc)
        die_usage(&a, "%s", "the qwen3-embedding-small preset needs --vocab-from (a vocabulary with EOS)");
    bool phi3 = !strcmp(arch, "phi3"), qwen2moe = !strcmp(arch, "qwen2moe"), gptoss = !strcmp(arch, "gpt-oss");
    if (no_sinks && !gptoss) {
        safefile_abort(sf);
        die_usage(&a, "%s", "--no-sinks needs the gpt-oss preset");
    }
    const mla_shape *ml = NULL;
    for (size_t i = 0; i < sizeof mla_shapes / sizeof mla_shapes[0]; i++)
        if (!strcmp(mla_shapes[i].name, p.name)) ml = &mla_shapes[i];
    if (kv_b_whole && !ml) die_usage(&a, "%s", "--kv-b-whole needs a deepseek2 preset");
    const gd_shape *gd = NULL;
    for (size_t i = 0; i < sizeof gd_shapes / sizeof gd_shapes[0]; i++)
        if (!strcmp(gd_shapes[i].name, p.name)) gd = &gd_shapes[i];
    if (mtp && !(gd && !gd->fused_ba)) {
        safefile_abort(sf);
        die_usage(&a, "%s", "--mtp needs a qwen35 preset");
    }
    if (ssm_in && !(gd && gd->fused_ba)) {
        safefile_abort(sf);
        die_usage(&a, "%s", "--ssm-in needs the qwen3next preset");
    }
    if (rec_layers && !gd) {
        safefile_abort(sf);
        die_usage(&a, "%s", "--recurrent-layers needs a qwen35 or qwen3next preset");
    }
    gguf_w_set_str(w, "general.architecture", arch);
    char name[160], key[160];
    snprintf(name, sizeof name, "lamina-random-%s-%s", p.name, quant_type_name((uint32_t)type));
    gguf_w_set_str(w, "general.name", name);
    gguf_w_set_u32(w, "general.file_type", quantize_file_type(quant_type_name((uint32_t)type)));
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    gguf_w_set_u32(w, KEY("block_count"), (uint32_t)(p.layers + mtp));
    if (mtp) gguf_w_set_u32(w, KEY("nextn_predict_layers"), (uint32_t)mtp);
    gguf_w_set_u32(w, KEY("context_length"), (uint32_t)p.ctx);
    gguf_w_set_u32(w, KEY("embedding_length"), (uint32_t)p.embd);
    gguf_w_set_u32(w, KEY("feed_forward_length"), (uint32_t)p.ff);
    gguf_w_set_u32(w, KEY("attention.head_count"), (uint32_t)p.heads);
    /* older deepseek2 conversions count every head as a KV head (their multi-head cache) */
    gguf_w_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)(kv_b_whole ? p.heads : p.kv_heads));
    if (p.head_dim) {
        gguf_w_set_u32(w, KEY("attention.key_length"), (uint32_t)hd);
        gguf_w_set_u32(w, KEY("attention.value_length"), (uint32_t)hd);
    }
    gguf_w_set_u32(w, KEY("rope.dimension_count"), (uint32_t)(ml ? ml->rope : gd ? gd->rope : hd));
    gguf_w_set_f32(w, KEY("rope.freq_base"),
                   qwen3        ? 1000000.0f
                       : gd     ? 10000000.0f
                       : gptoss ? 150000.0f
                       : nomic  ? 1000.0f
                                : 10000.0f);
    gguf_w_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), qwen3 || gemma2 || gemb || ml || gd ? 1e-6f : 1e-5f);
    if (gd) { /* the keys llama.cpp's converter writes for Qwen3.5 and Qwen3-Next */
        if (gd->sections[0] + gd->sections[1] + gd->sections[2] + gd->sections[3])
            gguf_w_set_arr(w, KEY("rope.dimension_sections"), GGUF_INT32, gd->sections, 4);
        gguf_w_set_u32(w, KEY("ssm.conv_kernel"), (uint32_t)gd->conv);
        gguf_w_set_u32(w, KEY("ssm.inner_size"), (uint32_t)(gd->v_heads * gd->head_dim));
        gguf_w_set_u32(w, KEY("ssm.state_size"), (uint32_t)gd->head_dim);
        gguf_w_set_u32(w, KEY("ssm.time_step_rank"), (uint32_t)gd->v_heads);
        gguf_w_set_u32(w, KEY("ssm.group_count"), (uint32_t)gd->k_heads);
        gguf_w_set_u32(w, KEY("full_attention_interval"), (uint32_t)gd->interval);
        if (rec_layers) { /* the pattern spelled out, as converters do from a config's layer_types */
            uint8_t *rl = malloc((size_t)p.layers);
            if (!rl) fail("mkmodel", "out of memory");
            for (int i = 0; i < p.layers; i++) rl[i] = (i + 1) % gd->interval != 0;
            gguf_w_set_arr(w, KEY("attention.recurrent_layers"), GGUF_BOOL, rl, (uint64_t)p.layers);
            free(rl);
        }
    }
    if (ml) { /* the keys llama.cpp's converter writes for DeepSeek-V2/V3 */
        gguf_w_set_u32(w, KEY("attention.q_lora_rank"), (uint32_t)ml->q_lora);
        gguf_w_set_u32(w, KEY("attention.kv_lora_rank"), (uint32_t)ml->kv_lora);
        if (kv_b_whole) { /* older conversions: a head's widths, no _mla keys */
            gguf_w_set_u32(w, KEY("attention.key_length"), (uint32_t)(ml->nope + ml->rope));
            gguf_w_set_u32(w, KEY("attention.value_length"), (uint32_t)ml->v_dim);
        } else {
            gguf_w_set_u32(w, KEY("attention.key_length"), (uint32_t)(ml->kv_lora + ml->rope));
            gguf_w_set_u32(w, KEY("attention.value_length"), (uint32_t)ml->kv_lora);
            gguf_w_set_u32(w, KEY("attention.key_length_mla"), (uint32_t)(ml->nope + ml->rope));
            gguf_w_set_u32(w, KEY("attention.value_length_mla"), (uint32_t)ml->v_dim);
        }
        gguf_w_set_u32(w, KEY("leading_dense_block_count"), (uint32_t)(ml->dense < p.layers ? ml->dense : p.layers));
        gguf_w_set_u32(w, KEY("expert_shared_count"), (uint32_t)ml->shared);
        gguf_w_set_f32(w, KEY("expert_weights_scale"), ml->scale);
        if (ml->norm) gguf_w_set_bool(w, KEY("expert_weights_norm"), true);
        gguf_w_set_u32(w, KEY("expert_gating_func"), ml->sigmoid ? 2 : 1);
        if (ml->yarn > 0) { /* the rope.scaling keys of DeepSeek's conversions */
            gguf_w_set_str(w, KEY("rope.scaling.type"), "yarn");
            gguf_w_set_f32(w, KEY("rope.scaling.factor"), ml->yarn);
            gguf_w_set_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)ml->yarn_ctx);
            gguf_w_set_f32(w, KEY("rope.scaling.yarn_log_multiplier"), ml->log_mul);
            if (ml->betas) {
                gguf_w_set_f32(w, KEY("rope.scaling.yarn_beta_fast"), 32.0f);
                gguf_w_set_f32(w, KEY("rope.scaling.yarn_beta_slow"), 1.0f);
            }
        }
    }
    gguf_w_set_u32(w, KEY("vocab_size"), (uint32_t)p.vocab);
    if (bert || nomic) { /* llama.cpp's keys for them: LayerNorms, not causal, the family's pooling */
        gguf_w_set_f32(w, KEY("attention.layer_norm_epsilon"), 1e-12f);
        gguf_w_set_bool(w, KEY("attention.causal"), false);
        gguf_w_set_u32(w, KEY("pooling_type"), bert ? 2 : 1); /* CLS (as bge) / mean (as nomic-embed) */
    }
    if (p.window) gguf_w_set_u32(w, KEY("attention.sliding_window"), (uint32_t)p.window);
    if (gemb) { /* EmbeddingGemma's converted keys: mean pooling, the Dense modules' widths */
        gguf_w_set_u32(w, KEY("pooling_type"), LM_POOL_MEAN);
        gguf_w_set_u32(w, KEY("dense_2_feat_in"), (uint32_t)p.embd);
        gguf_w_set_u32(w, KEY("dense_2_feat_out"), GEMB_DENSE);
        gguf_w_set_u32(w, KEY("dense_3_feat_in"), GEMB_DENSE);
        gguf_w_set_u32(w, KEY("dense_3_feat_out"), (uint32_t)p.embd);
    }
    if (p.experts) {
        gguf_w_set_u32(w, KEY("expert_count"), (uint32_t)p.experts);
        gguf_w_set_u32(w, KEY("expert_used_count"), (uint32_t)p.used);
        if (strcmp(arch, "llama")) gguf_w_set_u32(w, KEY("expert_feed_forward_length"), (uint32_t)p.ff_exp);
        if (p.ff_shexp) gguf_w_set_u32(w, KEY("expert_shared_feed_forward_length"), (uint32_t)p.ff_shexp);
    }
    if (gemma2) {
        gguf_w_set_f32(w, KEY("attn_logit_softcapping"), 50.0f);
        gguf_w_set_f32(w, KEY("final_logit_softcapping"), 30.0f);
    }
    if (gptoss) { /* the keys llama.cpp's converter writes from gpt-oss's config: YaRN, factor 32 */
        gguf_w_set_str(w, KEY("rope.scaling.type"), "yarn");
        gguf_w_set_f32(w, KEY("rope.scaling.factor"), 32.0f);
        gguf_w_set_u32(w, KEY("rope.scaling.original_context_length"), 4096);
        gguf_w_set_f32(w, KEY("rope.scaling.yarn_beta_fast"), 32.0f);
        gguf_w_set_f32(w, KEY("rope.scaling.yarn_beta_slow"), 1.0f);
    }
    if (embedder) gguf_w_set_u32(w, KEY("pooling_type"), LM_POOL_LAST); /* as Qwen3-Embedding's converted files */
    if (phi3) {
        gguf_w_set_u32(w, KEY("rope.scaling.original_context_length"), 4096);
        /* sqrt(1 + ln(32) / ln(4096)), as Phi-3's long-rope models carry */
        gguf_w_set_f32(w, KEY("rope.scaling.attn_factor"), sqrtf(1.0f + logf(32.0f) / logf(4096.0f)));
    }
#undef KEY
    if (vsrc) {
        for (int64_t i = 0; i < gguf_n_kv(vsrc); i++) {
            gguf_str k = gguf_kv_key(vsrc, i);
            if (k.len > 10 && !memcmp(k.ptr, "tokenizer.", 10)) gguf_w_copy_kv(w, vsrc, i);
        }
        /* its tokenizer.json's post-processor appends <|endoftext|>, which the converter reads as this */
        if (embedder) gguf_w_set_bool(w, "tokenizer.ggml.add_eos_token", true);
    }
    int64_t E = p.embd, Q = (int64_t)p.heads * hd, KV = (int64_t)p.kv_heads * hd;
    float ws = 1.0f / sqrtf((float)E), wf = 1.0f / sqrtf((float)p.ff), wq = 1.0f / sqrtf((float)Q);
    float nn = p.arch ? 0.1f : 0.0f; /* noise on the norm weights of the other architectures */
    uint32_t t = (uint32_t)type;
    double t0 = lm_now();
    progress_line prog; /* layers generated, the bytes so far: on a terminal or with --progress */
    progress_begin(&prog, "mkmodel", "generating", "layers");
    /* tied heads: a smaller embedding, so the layers' sum and not the input
     * token's own row decides the next token (gemma2 scales it by sqrt(E)) */
    float es = qwen3 ? 0.3f : gemma2 ? 0.05f : 1.0f;
    if (bert || nomic) {
        int rc = enc_tensors(&mk, &p, t, nomic);
        progress_end(&prog);
        if (rc) {
            safefile_abort(sf);
            fail("mkmodel", "out of memory generating weights");
        }
        goto write;
    }
    int rc = add(&mk, "token_embd.weight", E, p.vocab, t, es, false);
    rc |= add(&mk, "output_norm.weight", E, 1, LM_TYPE_F32, nn, true);
    /* deepseek2: a head 4 times larger, so that greedy steps are decided by margins well above the
     * arithmetic's differences (random layers otherwise leave near-ties between the top logits) */
    if (gemb) { /* no LM head; the pooled vector's projections */
        rc |= add(&mk, "dense_2.weight", E, GEMB_DENSE, t, ws, false);
        rc |= add(&mk, "dense_3.weight", GEMB_DENSE, E, t, 1.0f / sqrtf((float)GEMB_DENSE), false);
    }
    if (!qwen3 && !gemma2 && !gemb)
        rc |= add(&mk, "output.weight", E, p.vocab, t, ml ? 4 * ws : ws, false); /* those two tie */
    if (phi3 && !rc) { /* long-rope divisors per frequency: short near 1, long growing to 32 */
        int nf = hd / 2;
        float *sf_ = malloc((size_t)nf * sizeof(float)), *lf = malloc((size_t)nf * sizeof(float));
        if (!sf_ || !lf) rc = -1;
        for (int i = 0; !rc && i < nf; i++) {
            sf_[i] = 1.0f + 0.1f * (float)i / (float)nf;
            lf[i] = 1.0f + 31.0f * (float)i * (float)i / ((float)nf * (float)nf);
        }
        uint64_t ne[1] = {(uint64_t)nf};
        if (!rc) {
            mk.bufs[mk.n_bufs++] = sf_;
            mk.bufs[mk.n_bufs++] = lf;
            mk.n_tensors += 2;
            rc |= gguf_w_add_tensor(w, "rope_factors_short.weight", 1, ne, LM_TYPE_F32, sf_, (size_t)nf * 4);
            rc |= gguf_w_add_tensor(w, "rope_factors_long.weight", 1, ne, LM_TYPE_F32, lf, (size_t)nf * 4);
        }
    }
    for (int i = 0; i < p.layers + mtp && !rc; i++) {
        char n[96];
        bool recur = gd && i < p.layers && (i + 1) % gd->interval != 0; /* a gated-DeltaNet layer */
#define A(suffix, cols, rows, ty, sc, ones)                                                                            \
    (snprintf(n, sizeof n, "blk.%d." suffix, i), add(&mk, n, cols, rows, ty, sc, ones))
        rc |= A("attn_norm.weight", E, 1, LM_TYPE_F32, nn, true);
        if (recur) {
            rc |= gdn_layer(&mk, i, gd, E, t, nn, ssm_in);
        } else if (gd) { /* per head the query's hd rows, then its output gate's */
            rc |= A("attn_q.weight", E, 2 * Q, t, ws, false);
            rc |= A("attn_k.weight", E, KV, t, ws, false);
            rc |= A("attn_v.weight", E, KV, t, ws, false);
        } else if (ml) {
            rc |= mla_layer(&mk, i, ml, &p, t, nn, kv_b_whole);
        } else if (phi3) {
            rc |= A("attn_qkv.weight", E, Q + 2 * KV, t, ws, false);
        } else {
            rc |= A("attn_q.weight", E, Q, t, ws, false);
            rc |= A("attn_k.weight", E, KV, t, ws, false);
            rc |= A("attn_v.weight", E, KV, t, ws, false);
        }
        if (qwen2moe || gptoss) {
            rc |= A("attn_q.bias", Q, 1, LM_TYPE_F32, 0.1f, false);
            rc |= A("attn_k.bias", KV, 1, LM_TYPE_F32, 0.1f, false);
            rc |= A("attn_v.bias", KV, 1, LM_TYPE_F32, 0.1f, false);
        }
        if (qwen3 || gemb || (gd && !recur)) {
            rc |= A("attn_q_norm.weight", hd, 1, LM_TYPE_F32, nn, true);
            rc |= A("attn_k_norm.weight", hd, 1, LM_TYPE_F32, nn, true);
        }
        if (!ml && !recur) rc |= A("attn_output.weight", Q, E, t, p.arch ? wq : ws, false);
        if (gptoss) {
            rc |= A("attn_output.bias", E, 1, LM_TYPE_F32, 0.1f, false);
            if (no_sinks) { /* -inf: exp(-inf) adds nothing to a softmax's denominator */
                float *sk = malloc((size_t)p.heads * sizeof(float));
                if (!sk) fail("mkmodel", "out of memory");
                for (int h = 0; h < p.heads; h++) sk[h] = -INFINITY;
                mk.bufs[mk.n_bufs++] = sk;
                mk.n_tensors++;
                uint64_t ne[1] = {(uint64_t)p.heads};
                snprintf(n, sizeof n, "blk.%d.attn_sinks.weight", i);
                rc |= gguf_w_add_tensor(w, n, 1, ne, LM_TYPE_F32, sk, (size_t)p.heads * sizeof(float));
            } else {
                rc |= A("attn_sinks.weight", p.heads, 1, LM_TYPE_F32, 1.0f, false);
            }
        }
        /* qwen35, gpt-oss: post_attention_norm is the FFN's input norm, there is no ffn_norm */
        if (gemma2 || gemb || gd || gptoss) rc |= A("post_attention_norm.weight", E, 1, LM_TYPE_F32, nn, true);
        if (!gd && !gptoss) rc |= A("ffn_norm.weight", E, 1, LM_TYPE_F32, nn, true);
        if (p.experts && !(ml && i < ml->dense)) {
            int64_t X = p.experts, FE = p.ff_exp;
            /* a decisive router (scores of a few units): a near-tie between experts would let
             * 8-bit activations flip a choice, in lamina or in llama.cpp */
            rc |= A("ffn_gate_inp.weight", E, X, LM_TYPE_F32, 6.0f * ws, false);
#define A3(suffix, cols, rows, sc)                                                                                     \
    (snprintf(n, sizeof n, "blk.%d." suffix, i), add3(&mk, n, cols, rows, X, (uint32_t)xtype, sc))
            rc |= A3("ffn_gate_exps.weight", E, FE, ws);
            rc |= A3("ffn_up_exps.weight", E, FE, ws);
            rc |= A3("ffn_down_exps.weight", FE, E, 1.0f / sqrtf((float)FE));
#undef A3
            if (gptoss) { /* the router's bias, then a bias row per expert for each product */
                rc |= A("ffn_gate_inp.bias", X, 1, LM_TYPE_F32, 0.5f, false);
                rc |= A("ffn_gate_exps.bias", FE, X, LM_TYPE_F32, 0.1f, false);
                rc |= A("ffn_up_exps.bias", FE, X, LM_TYPE_F32, 0.1f, false);
                rc |= A("ffn_down_exps.bias", E, X, LM_TYPE_F32, 0.1f, false);
            }
            if (ml && ml->sigmoid) /* DeepSeek-V3's selection bias, of the size of the probabilities' spread */
                rc |= A("exp_probs_b.bias", X, 1, LM_TYPE_F32, 0.05f, false);
            if (ml && ml->shared) {
                int64_t S = (int64_t)ml->shared * FE;
                rc |= A("ffn_gate_shexp.weight", E, S, t, ws, false);
                rc |= A("ffn_up_shexp.weight", E, S, t, ws, false);
                rc |= A("ffn_down_shexp.weight", S, E, t, 1.0f / sqrtf((float)S), false);
            }
            if (p.ff_shexp) {
                rc |= A("ffn_gate_inp_shexp.weight", E, 1, LM_TYPE_F32, ws, false);
                rc |= A("ffn_gate_shexp.weight", E, p.ff_shexp, t, ws, false);
                rc |= A("ffn_up_shexp.weight", E, p.ff_shexp, t, ws, false);
                rc |= A("ffn_down_shexp.weight", p.ff_shexp, E, t, 1.0f / sqrtf((float)p.ff_shexp), false);
            }
        } else if (phi3) {
            rc |= A("ffn_up.weight", E, 2 * (int64_t)p.ff, t, ws, false);
        } else {
            rc |= A("ffn_gate.weight", E, p.ff, t, ws, false);
            rc |= A("ffn_up.weight", E, p.ff, t, ws, false);
        }
        if (!p.experts || (ml && i < ml->dense)) rc |= A("ffn_down.weight", p.ff, E, t, wf, false);
        if (gemma2 || gemb) rc |= A("post_ffw_norm.weight", E, 1, LM_TYPE_F32, nn, true);
        if (i >= p.layers) { /* the MTP layer's own: [enorm(embedding) ; hnorm(h)] -> n_embd */
            rc |= A("nextn.eh_proj.weight", 2 * E, E, t, 1.0f / sqrtf((float)(2 * E)), false);
            rc |= A("nextn.enorm.weight", E, 1, LM_TYPE_F32, nn, true);
            rc |= A("nextn.hnorm.weight", E, 1, LM_TYPE_F32, nn, true);
            rc |= A("nextn.shared_head_norm.weight", E, 1, LM_TYPE_F32, nn, true);
        }
#undef A
        progress_note(&prog, "%.1f MiB", mk.bytes / 1048576.0);
        progress_update(&prog, i + 1, p.layers + mtp);
    }
    progress_end(&prog);
    if (rc) {
        safefile_abort(sf);
        fail("mkmodel", "out of memory generating weights");
    }
write:
    if (gguf_writer_write_file(w, sf, err, sizeof err)) {
        safefile_abort(sf);
        fail("mkmodel", err);
    }
    if (safefile_commit(sf, err, sizeof err)) fail("mkmodel", err);
    fprintf(stderr, "mkmodel: wrote %s (%.1f MiB of tensors, %s, %.1f s)\n", out, mk.bytes / 1048576.0,
            quant_type_name(t), lm_now() - t0);
    for (int i = 0; i < mk.n_bufs; i++) free(mk.bufs[i]);
    free(mk.bufs);
    gguf_writer_free(w);
    pool_free(mk.pool);
    if (vsrc) gguf_close(vsrc);
    return 0;
}
