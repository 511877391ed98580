/*
 * model.h - model architecture: hyperparameters and weights of a decoder-only
 * Transformer (or of an encoder: bert, nomic-bert), read from GGUF metadata
 * and tensors.
 *
 * Supported architectures (general.architecture):
 *   llama  Llama 2/3, Mistral, TinyLlama, SmolLM: RMSNorm, RoPE on adjacent
 *          pairs (GGUF's llama layout), MHA/MQA/GQA, SwiGLU MLP.
 *   qwen2  as llama with biases on Q, K and V and RoPE on halves (NeoX).
 *   gemma3 embeddings scaled by sqrt(n_embd); per-head RMSNorm of Q and K;
 *          RMSNorm after attention and after the FFN too; GELU(tanh)-gated
 *          FFN; sliding-window attention on local layers (all but every
 *          sliding_window_pattern-th) with their own RoPE base; tied output.
 *   qwen3  as qwen2 without the biases, with gemma3's per-head RMSNorm of Q
 *          and K; the head width may differ from n_embd / n_head.
 *   gemma2 gemma3 without the Q/K norms, with soft-capping of the attention
 *          scores (cap·tanh(s/cap)) and of the final logits; sliding window
 *          on alternate layers (every second is global), the LM head is
 *          always the embedding.
 *   phi3   fused attn_qkv and ffn_up (gate rows then up rows) tensors, read
 *          as row slices of the one matrix; RoPE on halves with optional
 *          per-frequency factors (rope_factors_short/long: the long ones when
 *          the context in use exceeds rope.scaling.original_context_length)
 *          and the file's rope.scaling.attn_factor on cos and sin; a sliding
 *          window on every layer where the file sets one.
 *   qwen2moe, qwen3moe, and llama files with expert tensors (Mixtral):
 *          the FFN is a Mixture-of-Experts. A router (ffn_gate_inp) scores
 *          n_expert experts per token, softmax, the top n_expert_used are
 *          run (SwiGLU experts, ffn_{gate,up,down}_exps as 3-D tensors, one
 *          2-D slice per expert) and summed with their probabilities,
 *          renormalised to sum 1 for qwen3moe and Mixtral, as they are for
 *          qwen2moe; qwen2moe adds a shared expert (ffn_*_shexp) scaled by
 *          sigmoid(ffn_gate_inp_shexp · x). qwen2moe/qwen3moe as qwen2/qwen3
 *          otherwise (qwen2moe keeps the QKV biases).
 *   deepseek2 DeepSeek-V2/V3: multi-head latent attention (mla.h): queries
 *          through an optional low-rank bottleneck (attn_q_a, its RMSNorm,
 *          attn_q_b; or attn_q), keys and values through a shared latent
 *          (attn_kv_a_mqa: c_kv and one RoPE key, c_kv RMSNormed), the
 *          per-head up-projections attn_k_b / attn_v_b; RoPE on adjacent
 *          pairs of the last n_rot dims of each query head and the shared
 *          key. The first leading_dense_block_count layers have a dense FFN,
 *          the rest experts (softmax or sigmoid router, an optional selection
 *          bias exp_probs_b, optional renormalisation, expert_weights_scale)
 *          plus ungated shared experts (ffn_*_shexp). Older files that
 *          store attn_kv_b whole (no key_length_mla) are split at load: W_UV
 *          as row slices, W_UKᵀ transposed into an owned copy (kb_mem).
 *   qwen35 Qwen3.5 (dense): hybrid. Every full_attention_interval-th layer
 *          is qwen3's attention with its output gated (attn_q holds per
 *          head the query and a gate; sigmoid(gate) multiplies the heads'
 *          output) and RoPE on the first rope.dimension_count dims of a
 *          head; the others are gated-DeltaNet linear attention (gdn.h)
 *          with a recurrent state per sequence instead of a KV cache. The
 *          FFN's norm is post_attention_norm. qwen35moe: the same with
 *          qwen2moe's experts (softmax router, top-k renormalised, a
 *          shared expert behind a sigmoid gate) in every layer. A file's
 *          attention.recurrent_layers must give that same pattern.
 *   qwen3next Qwen3-Next: qwen35moe's layers with three differences. RoPE
 *          is plain NeoX on the first rope.dimension_count dims (no
 *          sections); value head h of a gated DeltaNet reads key head
 *          h / (hv / hk) (the heads grouped by key head, not tiled); and
 *          beta and alpha come from one fused ssm_ba (per key head its
 *          hv / hk beta rows, then as many alpha rows), split after the
 *          product (gdn.c). Files of the older layout, one blk.N.ssm_in
 *          with q, k, v and z interleaved per key head, are read too: its
 *          product is split the same way.
 *   gpt-oss OpenAI's gpt-oss (llama.cpp's openai-moe): NeoX RoPE over heads
 *          of attention.key_length (64; Q wider than n_embd), biases on Q, K,
 *          V and the output, a learnt sink logit per query head in each
 *          softmax's denominator (blk.N.attn_sinks), a sliding window on
 *          every layer but each sliding_window_pattern-th (2: alternate,
 *          layer 0 local), post_attention_norm as the FFN's norm, and
 *          experts in every layer: the router with a bias picks the top
 *          n_expert_used raw scores and weights them by a softmax over the
 *          chosen only; every expert product has a bias; the activation is
 *          the clamped SwiGLU min(g, 7)·sigmoid(1.702·min(g, 7))·(clamp(u,
 *          ±7) + 1) (ops_swiglu_oai). Separate LM head.
 *   bert   an encoder (no LM head; its output is each token's hidden state,
 *          pooled by the caller): the embedding is the token's row plus
 *          token type 0's row (token_types) plus the absolute position's
 *          row (position_embd), through a LayerNorm (token_embd_norm);
 *          then post-norm blocks: x = LN(x + attn(x)) (attn_output_norm),
 *          x = LN(x + ffn(x)) (layer_output_norm), LayerNorms with biases,
 *          Q, K, V and the output with biases, the FFN GELU(tanh) of
 *          ffn_up (+bias) then ffn_down (+bias); attention non-causal
 *          (attention.causal false), no RoPE, no final norm.
 *   gemma-embedding  gemma3's blocks with non-causal attention
 *          (attention.causal absent: false); its local layers see the keys
 *          within sliding_window / 2 positions on either side (attn_tile_sym;
 *          the KV pool keeps them all: no local class); the pooled vector
 *          goes through the optional dense_2.weight and dense_3.weight
 *          (embed.h). No LM head is read.
 *   nomic-bert  bert's blocks with NeoX RoPE instead of the position
 *          embedding, Q, K and V fused in attn_qkv (optional bias), and a
 *          SwiGLU FFN (ffn_gate, ffn_up, ffn_down; optional biases).
 *          An encoder's sequence runs in one pass (encoder.h).
 * RoPE scaling (rope.scaling.type): linear for every family but deepseek2;
 * YaRN for llama, qwen2, qwen3, their MoE variants, gpt-oss and deepseek2 (the
 * released DeepSeek files): the factor stretches the low frequencies, the
 * high ones rotate as trained, a ramp between (ops.h), cos and sin scaled by
 * the magnitude factor, and deepseek2's attention scale by mscale²
 * (model_hparams.c). Anything else is refused by name, and so is a weight of a type
 * lamina cannot compute with.
 *
 * Weights stay in the file mapping; only the small norm vectors and biases
 * are converted to float at load, and the matrices used in products whose
 * type the kernel table has packed kernels for are copied once into the
 * interleaved layout of quant.h (about as many bytes again as those
 * matrices; the mapped originals are then only read for embedding rows;
 * copies that would take most of the free memory are not made). A weight
 * matrix is stored row-major with `rows` output rows of `cols` inputs (GGUF
 * ne[1] x ne[0]).
 */
#ifndef LAMINA_MODEL_H
#define LAMINA_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lamina.h" /* lm_status, lm_load_params */
#include "format/gguf.h"
#include "text/tokenizer.h"

typedef enum {
    LM_ARCH_LLAMA,
    LM_ARCH_QWEN2,
    LM_ARCH_GEMMA3,
    LM_ARCH_QWEN3,
    LM_ARCH_GEMMA2,
    LM_ARCH_PHI3,
    LM_ARCH_QWEN2MOE,
    LM_ARCH_QWEN3MOE,
    LM_ARCH_DEEPSEEK2,
    LM_ARCH_QWEN35,
    LM_ARCH_QWEN35MOE,
    LM_ARCH_QWEN3NEXT,
    LM_ARCH_GPT_OSS,
    LM_ARCH_BERT,
    LM_ARCH_NOMIC_BERT,
    LM_ARCH_GEMMA_EMBED,
} lm_arch;

typedef enum { LM_ROPE_ADJACENT, LM_ROPE_NEOX } lm_rope_style;

typedef struct {
    lm_arch arch;
    int n_layer;
    int n_embd;
    int n_head;
    int n_head_kv;
    int head_dim; /* n_embd / n_head unless the file says otherwise */
    int n_ff;
    int n_vocab;
    int n_ctx_train; /* context length the model was trained for */
    int n_rot;       /* dimensions of each head that RoPE rotates */
    float rope_base;
    float rope_scale; /* linear position scaling (1 = none) */
    lm_rope_style rope_style;
    float norm_eps;
    bool tied_output; /* no output.weight: the embedding is the LM head */
    /* gemma-style options (off for llama/qwen2) */
    float emb_scale;     /* embeddings multiplied by this (1 = none) */
    bool gelu;           /* FFN activation GELU(tanh) instead of SiLU */
    int swa_window;      /* sliding window in tokens on local layers (0 = none) */
    int swa_pattern;     /* every swa_pattern-th layer is global */
    float rope_base_swa; /* RoPE base of local layers */
    float attn_scale;    /* the query scale before q·k (1/sqrt(head_dim) unless the family says otherwise) */
    float attn_softcap;  /* > 0: scores become attn_softcap·tanh(s / attn_softcap) (gemma2) */
    float final_softcap; /* > 0: the same on the logits */
    /* phi3 long-rope: per-frequency divisors (n_rot / 2 each, NULL = none),
     * the long set used when the context in use exceeds n_ctx_orig */
    const float *rope_factors_short, *rope_factors_long;
    int n_ctx_orig;
    float rope_attn_factor; /* cos and sin multiplied by this (1 = none) */
    /* YaRN (rope.scaling.type yarn): yarn_factor the factor (rope_scale is 1/factor), and pair i's
     * angle blends the interpolated and the trained one along the ramp from
     * yarn_low to yarn_high (ops_rope_angles_yarn); cos and sin are then
     * multiplied by rope_attn_factor, and deepseek2's attn_scale carries the
     * square of its attention-magnitude factor (model_hparams.c, read_rope_scaling) */
    bool rope_yarn;
    float yarn_factor, yarn_low, yarn_high;
    /* Mixture-of-Experts (n_expert 0: a dense FFN) */
    int n_expert, n_expert_used;
    int n_ff_exp;          /* an expert's hidden width */
    int n_ff_shexp;        /* the shared expert's hidden width (0: none) */
    bool moe_norm_w;       /* the chosen experts' probabilities renormalised to sum 1 */
    float moe_scale;       /* the chosen experts' weights then multiplied by this (1: none; deepseek2) */
    bool moe_sigmoid;      /* router scores through a sigmoid instead of a softmax (DeepSeek-V3) */
    int n_layer_dense;     /* leading layers with a dense FFN before the expert layers (deepseek2) */
    bool moe_topk_softmax; /* gpt-oss: the top n_expert_used raw router scores chosen, their weights a
                              softmax over the chosen only (llama.cpp's SOFTMAX_WEIGHT gating) */
    bool swiglu_oai;       /* gpt-oss: the experts' activation is the clamped SwiGLU (ops_swiglu_oai) */
    /* Multi-head latent attention (deepseek2; kv_lora_rank 0: none). The cache
     * then holds one KV head of head_dim = kv_lora_rank + n_rot per token and
     * layer (n_head_kv is 1): the latent c_kv and the shared RoPE key (mla.h). */
    int q_lora_rank;  /* queries through a rank-q_lora_rank bottleneck; 0: straight from attn_q */
    int kv_lora_rank; /* the latent's width */
    int qk_nope;      /* a head's query/key width without RoPE (the RoPE part is n_rot wide) */
    int v_head_dim;   /* a head's value width */
    /* Hybrid models (qwen35*, qwen3next): gated-DeltaNet linear-attention layers (gdn.h)
     * beside full attention (n_rlayer 0: none). Every full_attn_interval-th
     * layer (counting from 1) is full attention, the rest recurrent. */
    int n_rlayer; /* recurrent layers */
    int full_attn_interval;
    int ssm_conv;         /* the causal conv's taps (K) */
    int ssm_hk, ssm_hv;   /* key heads (ssm.group_count) and value heads (ssm.time_step_rank) */
    int ssm_dk, ssm_dv;   /* their widths (ssm.state_size; ssm.inner_size / ssm_hv) */
    int rope_sections[4]; /* qwen35's multi-axis RoPE: text positions turn the pairs the first three
                                  sections interleave, the rest (the fourth axis, position 0) not;
                                  all 0 (qwen3next): plain RoPE */
    bool ssm_grouped;     /* value head h reads key head h / (hv / hk) (qwen3next), not h % hk (qwen35) */
    bool attn_gate;       /* full attention's output gated: attn_q holds per head [query | gate], the
                                  heads' output multiplied by sigmoid(gate) before attn_output */
    int n_layer_mtp;      /* next-token-prediction layers after the trunk (<arch>.nextn_predict_layers;
                                  block_count counts them, n_layer does not): lm_model.mtp */
    bool causal;          /* <arch>.attention.causal (default true); false: every row of a segment attends
                                  to every position of its sequence (attn_tile_full), which must then
                                  run in one pass (encoders: bert, nomic-bert) */
    bool encoder;         /* bert, nomic-bert: post-norm LayerNorm blocks, no LM head (encoder.h) */
    int pooling;          /* lm_pooling from <arch>.pooling_type: how an embedding pools the rows
                                  (LM_POOL_NONE, absent: a generative model; embed.h) */
} lm_hparams;

typedef struct {
    const void *data; /* (rows, cols) in `type`, row r at data + r * row_bytes */
    uint32_t type;
    int64_t rows; /* output features (GGUF ne[1]) */
    int64_t cols; /* input features  (GGUF ne[0]) */
    size_t row_bytes;
    /* The same matrix interleaved for the packed kernels (layout in quant.h),
     * in the model's packed slab; NULL when the type or CPU has no packed
     * kernel. Every product with this weight then uses it, whatever the
     * number of tokens, so its results do not depend on the batch. */
    const void *packed;
} lm_weight;

/* One layer's Mixture-of-Experts FFN. Expert e's matrices are the e-th
 * slices of the file's 3-D tensors, each an lm_weight of its own, so an
 * expert can be computed (or, later, placed) independently of the others. */
typedef struct {
    lm_weight gate_inp;          /* router (n_expert, n_embd) */
    lm_weight *gate, *up, *down; /* (n_expert) each: (n_ff_exp, n_embd) x2, (n_embd, n_ff_exp) */
    const float *probs_bias;     /* (n_expert) added to the router's probabilities to choose the experts
                                        (not to weight them; DeepSeek-V3's exp_probs_b), or NULL */
    const float *shexp_gate;     /* (n_embd) the shared expert's gate, or NULL; the shared expert
                                        itself is the layer's w_gate, w_up, w_down (n_ff_shexp) */
    /* gpt-oss's biases, or NULL: the router's, added to its scores before the choice; and per
     * expert e the rows gate_b + e * b_stride, up_b + e * b_stride (gate[e].rows each, this rank's
     * slice under tensor parallelism) and down_b + e * n_embd, added to its products */
    const float *gate_inp_b;    /* (n_expert) */
    const float *gate_b, *up_b; /* (n_expert, b_stride): b_stride is the whole model's n_ff_exp */
    const float *down_b;        /* (n_expert, n_embd) */
    int b_stride;
} lm_moe;

/* One recurrent layer's gated DeltaNet (qwen35, qwen3next; gdn.h). conv =
 * 2 hk dk + hv dv channels: q (hk dk), k (hk dk), v (hv dv); value head h
 * reads key head h % hk, or h / (hv / hk) with hp.ssm_grouped. */
typedef struct {
    lm_weight qkv;        /* (conv, n_embd) attn_qkv; or an older qwen3next file's (conv + hv dv, n_embd)
                                  ssm_in: per key head [q (dk) | k (dk) | its r = hv / hk value heads
                                  (r dv) | their z (r dv)] (z then rows 0) */
    lm_weight z;          /* (hv dv, n_embd) attn_gate: the output norm's gate; rows 0 with ssm_in */
    lm_weight beta;       /* (hv, n_embd) ssm_beta; or qwen3next's fused (2 hv, n_embd) ssm_ba: per key
                                  head its hv / hk beta rows, then as many alpha rows (alpha then rows 0) */
    lm_weight alpha;      /* (hv, n_embd) ssm_alpha; rows 0 with a fused ssm_ba */
    lm_weight out;        /* (n_embd, hv dv) ssm_out */
    const float *conv_w;  /* (K, conv) the conv's taps, tap-major (the file's ssm_conv1d transposed) */
    const float *dt_bias; /* (hv) ssm_dt.bias */
    const float *a;       /* (hv) ssm_a = -exp(A_log) */
    const float *norm;    /* (dv) ssm_norm, shared by the heads */
} lm_gdn;

/* One layer's latent attention (deepseek2, mla.h). qk = qk_nope + n_rot. */
typedef struct {
    lm_weight q_a;          /* (q_lora_rank, n_embd); rows 0 without the q bottleneck */
    const float *q_a_norm;  /* (q_lora_rank) or NULL */
    lm_weight q_b;          /* (n_head*qk, q_lora_rank), or attn_q (n_head*qk, n_embd) */
    lm_weight kv_a;         /* (kv_lora_rank + n_rot, n_embd): the latent, then the RoPE key */
    const float *kv_a_norm; /* (kv_lora_rank) */
    lm_weight *k_b, *v_b;   /* (n_head) each: W_UKᵀ (kv_lora_rank, qk_nope), W_UV (v_head_dim,
                                        kv_lora_rank), slices of the file's 3-D attn_k_b / attn_v_b */
} lm_mla;

typedef struct {
    const float *attn_norm;         /* (n_embd) */
    lm_weight wq, wk, wv, wo;       /* (n_head*hd, n_embd), (n_kv*hd, n_embd) x2, (n_embd, n_head*hd) */
    const float *bq, *bk, *bv;      /* (n_head*hd), (n_kv*hd), (n_kv*hd) or NULL */
    const float *bo;                /* (n_embd) attn_output.bias (gpt-oss), or NULL */
    const float *sinks;             /* (n_head) attn_sinks: a sink logit per query head (gpt-oss), or NULL */
    const float *ffn_norm;          /* (n_embd) */
    lm_weight w_gate, w_up, w_down; /* (n_ff, n_embd) x2, (n_embd, n_ff) */
    const float *q_norm, *k_norm;   /* (head_dim) per-head RMSNorm weights, or NULL */
    const float *post_attn_norm;    /* (n_embd) or NULL */
    const float *post_ffn_norm;     /* (n_embd) or NULL */
    lm_mla *mla;                    /* latent attention (deepseek2): replaces wq, wk, wv (rows 0);
                                        wo is then (n_embd, n_head*v_head_dim) */
    lm_moe *moe;                    /* NULL for a dense FFN; then w_gate/w_up/w_down are the FFN, else
                                        the shared expert (rows 0 when there is none) */
    lm_gdn *gdn;                    /* a recurrent layer's gated DeltaNet (qwen35*, qwen3next), else NULL; the attention
                                        matrices are then rows 0 */
    int rec;                        /* the recurrent layer's index among them (state slots), else -1 */
    int kv_layer;                   /* the full-attention layer's index in the KV pool, else -1 */
    int window;                     /* attention window in tokens, 0 = whole context */
    /* an encoder's (bert, nomic-bert): attn_norm is then the LayerNorm after the attention's residual
     * add (attn_output_norm) and ffn_norm the one after the FFN's (layer_output_norm); their biases,
     * and the FFN's (NULL: none) */
    const float *attn_norm_b, *ffn_norm_b; /* (n_embd) */
    const float *b_up, *b_down;            /* (n_ff), (n_embd) */
    float rope_base, rope_scale;           /* this layer's RoPE */
} lm_layer;

/* A next-token-prediction (MTP) layer, stored as block n_layer (qwen35,
 * qwen35moe; llama.cpp's nextn tensors). From the trunk's hidden state h_t
 * after the final norm and token t+1's embedding e it predicts token t+2:
 *   x = eh_proj · [enorm(e) ; hnorm(h_t)]            (concatenation, 2 n_embd)
 *   x = x + attn(attn_norm(x))  (a full-attention qwen35 layer, its own KV,
 *       the position that of token t+1)
 *   x = x + ffn(post_attention_norm(x))                (dense or experts)
 *   h' = head_norm(x), logits = head · h'
 * h' stands in for the trunk's hidden state when the head is run again on
 * its own draft (a chain of drafts). The layer's attention and FFN weights
 * are an lm_layer like the trunk's; embed, head and head_norm fall back to
 * the model's token_embd, output and output_norm when the file has no
 * nextn.embed_tokens, nextn.shared_head_head, nextn.shared_head_norm. */
typedef struct lm_mtp {
    lm_layer layer;                /* rec -1, kv_layer 0 (of the MTP's own cache) */
    lm_weight eh_proj;             /* (n_embd, 2 n_embd) */
    const float *enorm, *hnorm;    /* (n_embd) each */
    const float *head_norm;        /* (n_embd) */
    const lm_weight *embed, *head; /* (n_vocab, n_embd): borrowed from the model or embed_own/head_own */
    lm_weight embed_own, head_own; /* the file's own, when it has them */
} lm_mtp;

/* Tensor parallelism (shard.c): which part of the model this process holds.
 * A sharded model's hp counts (n_head, n_head_kv, n_ff) are this rank's;
 * the whole model's are kept here. Q/K/V and gate/up keep whole rows of
 * their stored matrices (heads, FFN rows), o and down a block-aligned range
 * of columns (their products are partial sums, added across ranks after
 * each), the LM head a range of vocabulary rows (gathered). size 1: the
 * whole model, every field below describing it. */
typedef struct {
    int rank, size;
    int n_head, n_head_kv, n_ff; /* the whole model's */
    int head0, kv_head0, ff0;    /* this rank's first query head, KV head, FFN row */
    int kv_copies;               /* ranks holding each KV head (size / n_head_kv when size > n_head_kv) */
    int ssm_hk, ssm_hv;          /* the whole model's key and value heads of its recurrent layers */
    int ssm_k0;                  /* this rank's first key head there (its value heads: shard.c) */
    int vocab0, n_vocab;         /* this rank's LM head rows [vocab0, vocab0 + n_vocab) */
    int vocab_split[64];         /* (size) LM head rows of each rank */
    bool lead;                   /* rank 0 serving: fwd_run broadcasts each plan first (tp_plan.h) */
} lm_tp;
#define LM_TP_MAX 64

/* Pipeline parallelism (model_stage, shard.c): the contiguous layers this
 * process runs. Stage 0 also embeds the tokens, the last stage runs the
 * final norm and the LM head; the ranges balance the weight bytes each
 * stage reads, those two counted where they live (model_pp_split). Only
 * this stage's matrices are packed (touched); the others stay unread in
 * the mapping. size 1: every layer. */
typedef struct {
    int stage, size;           /* this stage of size */
    int layer0, layer1;        /* layers [layer0, layer1) */
    int first[LM_TP_MAX + 1];  /* (size + 1) every stage's first layer; first[size] = n_layer */
    uint64_t bytes[LM_TP_MAX]; /* (size) weight bytes of every stage (this rank's TP shard) */
    int tp;                    /* ranks per stage: the world rank of (stage s, tensor rank t) is s * tp + t */
    int kv0, kv1;              /* hybrid models: this stage's full-attention layers as KV pool layers
                                      (lm_layer.kv_layer) [kv0, kv1), and its recurrent layers as state
                                      layers (lm_layer.rec) [rec0, rec1); otherwise kv = layer range */
    int rec0, rec1;
} lm_pp;

/* Expert parallelism (ep.c): the routed experts this process holds whole.
 * Placement is contiguous (rank r of size holds experts [first[r],
 * first[r + 1]) with first[r] = r * n_expert / size, in every MoE layer of
 * the trunk) or balanced per layer by routing counts (owner; ep.h); the
 * others' matrices are rows 0 here (never packed nor read).
 * The router, the shared expert, attention and the dense layers are whole on
 * every rank, or with tp.size > 1 split as lm_tp says (the kept experts
 * too: this rank's tensor slice of each, ep.h). size 1: every expert. */
typedef struct {
    int rank, size;
    int e0, e1;               /* contiguous: this rank's experts [e0, e1) */
    int first[LM_TP_MAX + 1]; /* (size + 1) contiguous: every rank's first expert; first[size] = n_expert */
    int16_t *owner;           /* (n_layer, n_expert) balanced: each layer's experts' ranks (ep_owner), owned;
                                 NULL: contiguous (first) */
} lm_ep;

/* A routing count (what `lamina bench --ep --ep-counts-out` writes): the
 * rows routed to each expert of each layer over some text, the input of a
 * balanced placement (model_ep). Borrowed by the loader. */
typedef struct {
    int n_layer, n_expert;
    const uint64_t *rows; /* (n_layer, n_expert) */
} lm_ep_counts;

typedef struct lm_model {
    gguf_ctx *gguf; /* owns the mapping every weight points into */
    lm_hparams hp;  /* this rank's counts when tp.size > 1 */
    lm_tp tp;
    lm_pp pp;
    lm_ep ep;
    lm_tokenizer *tok;      /* NULL when the file carries no tokenizer */
    lm_weight tok_embd;     /* (n_vocab, n_embd) */
    const float *out_norm;  /* (n_embd) */
    lm_weight output;       /* (n_vocab, n_embd); the embedding when tied (an encoder: rows 0, never read) */
    const float *type_embd; /* (n_embd) an encoder's token type 0 row (token_types), or NULL */
    lm_weight pos_embd;     /* (n_ctx_train, n_embd) bert's absolute positions; rows 0 otherwise */
    const float *embd_norm, *embd_norm_b; /* (n_embd) an encoder's embedding LayerNorm */
    /* gemma-embedding's projections of the pooled vector (dense_2 then dense_3; rows 0: absent):
     * dense_2 (d2, n_embd), dense_3 (n_embd, d2) or, alone, (d3, n_embd); lm_model_embd_dim */
    lm_weight dense2, dense3;
    lm_layer *layers;     /* (n_layer) */
    uint8_t *layer_local; /* (n_layer) 1 for a sliding-window (window > 0) layer: the KV
                                pool's local class (kv_config.layer_local) */
    float *f32;           /* slab owning every converted norm/bias vector */
    void *packed_mem;     /* allocation owning every weight's packed copy, or NULL
                                (also when the copies would not fit in memory) */
    size_t packed_bytes;  /* bytes of packed copies, of kb_mem and shard_mem (memory beyond the mapping) */
    lm_moe *moe;          /* (n_layer) when n_expert > 0, else NULL */
    lm_weight *experts;   /* (n_layer, 3, n_expert) the slices lm_moe points into */
    lm_mla *mla;          /* (n_layer) with latent attention, else NULL */
    lm_weight *mla_heads; /* (n_layer, 2, n_head) the k_b and v_b slices lm_mla points into */
    void *kb_mem;         /* (n_layer, n_head, kv_lora_rank, qk_nope) F16 or F32: W_UKᵀ split out of
                                a whole attn_kv_b (older deepseek2 files), or NULL */
    size_t kb_bytes;      /* its bytes (counted in packed_bytes) */
    lm_gdn *gdn;          /* (n_layer) with recurrent layers (their gdn points here), else NULL */
    struct lm_mtp *mtp;   /* the first next-token-prediction layer (hp.n_layer_mtp > 0), else NULL */
    void *shard_mem;      /* a tensor-parallel rank's gathered slices of the recurrent layers (their
                                heads are not one contiguous range: shard.c), of its pipeline
                                stage's layers only, or NULL */
    size_t shard_bytes;   /* its bytes (counted in packed_bytes) */
    char name[128];       /* general.name, or the file's base name */
    uint64_t n_params;
    uint64_t weight_bytes; /* bytes of all tensors */
} lm_model;

/* A layer's weight matrices (lm_weight fields of lm_layer), in the order of
 * model.c's one table of per-layer tensors: wq, wk, wv, wo, w_gate, w_up,
 * w_down. Loading, weight packing, the forward pass's activation scratch and
 * bench's bytes-per-token figure all walk this list. */
#define MODEL_LAYER_MATRICES 7
void model_layer_matrices(const lm_layer *l, const lm_weight *out[MODEL_LAYER_MATRICES]);

/* Open and validate a GGUF model; NULL and a message naming the problem on
 * failure (unknown architecture, missing or misshapen tensor, unsupported
 * tensor type, bad hyperparameters). */
lm_model *model_load(const char *path, char *err, size_t errlen);
/* The same with a progress callback (p may be NULL; a false answer stops
 * the load, everything freed, with LM_ERR_CANCELLED) and the kind of a
 * failure in *status: LM_ERR_IO, LM_ERR_FORMAT, LM_ERR_UNSUPPORTED (an
 * architecture, tensor type, tokenizer or option lamina does not run),
 * LM_ERR_NOMEM, LM_ERR_CANCELLED; LM_OK on success. */
lm_model *model_load_params(const char *path, const lm_load_params *p, lm_status *status, char *err, size_t errlen);
/* The same over a GGUF already open (for the fuzz target: gguf_open_mem);
 * the model takes g over on success, the caller keeps it on failure. */
lm_model *model_load_gguf(gguf_ctx *g, char *err, size_t errlen);
void model_free(lm_model *m);

/* model_load_params for rank `rank` of a tensor-parallel group of `size`
 * (1: the whole model): only this rank's slices of the sharded matrices are
 * packed or read. Fails (LM_ERR_UNSUPPORTED) when the model does not split
 * that way: heads, KV heads and FFN rows must divide evenly (KV heads may
 * instead be replicated, size a multiple of them), and the o and down
 * column ranges must fall on whole quantization blocks. */
lm_model *model_load_tp(const char *path, const lm_load_params *p, int rank, int size, lm_status *status, char *err,
                        size_t errlen);
/* Slice a loaded model's weights for rank of size (shard.c; before packing). */
int model_shard(lm_model *m, int rank, int size, char *err, size_t errlen);
/* model_load_tp for tensor rank tp_rank of tp_size in pipeline stage
 * pp_stage of pp_size: the stage's layers only are packed (m->pp). Fails
 * (LM_ERR_UNSUPPORTED) with more stages than layers. */
lm_model *model_load_grid(const char *path, const lm_load_params *p, int tp_rank, int tp_size, int pp_stage,
                          int pp_size, lm_status *status, char *err, size_t errlen);
/* model_load_grid with each stage's ranks as ep_size expert ranks of
 * tp_size tensor ranks: this process holds ep_rank's experts only
 * (model_ep), each as tensor slice tp_rank. Fails (LM_ERR_UNSUPPORTED) on a
 * model without experts, more expert ranks than experts, or counts that are
 * not the model's shape. counts NULL: the contiguous placement; else the
 * balanced one from these counts (model_ep). */
lm_model *model_load_ep(const char *path, const lm_load_params *p, int tp_rank, int tp_size, int pp_stage, int pp_size,
                        int ep_rank, int ep_size, const lm_ep_counts *counts, lm_status *status, char *err,
                        size_t errlen);
/* Keep rank's experts of size (ep.c; after model_stage, before packing): the
 * others' matrices become rows 0, m->ep is set, and a stage holds size x
 * tp.size ranks (m->pp.tp). counts NULL: contiguous; else each MoE layer's
 * experts placed by ep_place_balanced over its counts. */
int model_ep(lm_model *m, int rank, int size, const lm_ep_counts *counts, char *err, size_t errlen);
/* Split the layers into size contiguous stages balancing weight bytes:
 * first (size + 1) receives each stage's first layer, bytes (size) its
 * bytes (stage 0 counts the embedding table, the last the output norm and
 * LM head). Minimises the largest stage; every stage gets a layer, and on
 * a hybrid model a full-attention layer. Fails when size is not 1 ..
 * min(n_layer, LM_TP_MAX), or past the hybrid's full-attention layers. */
int model_pp_split(const lm_model *m, int size, int *first, uint64_t *bytes, char *err, size_t errlen);
/* Set m->pp for stage of size (after model_shard, before packing). */
int model_stage(lm_model *m, int stage, int size, char *err, size_t errlen);
/* Weight bytes of layer li (its matrices, experts and norms). */
uint64_t model_layer_bytes(const lm_model *m, int li);

const char *model_arch_name(lm_arch a);
/* KV-cache bytes per token of context for the given element size. */
uint64_t model_kv_bytes_per_token(const lm_model *m, size_t elem_bytes);
/* Weight bytes one token reads through the layers: every matrix of a dense
 * model; with experts, the router, the shared expert and n_expert_used of
 * the n_expert experts (*total: all experts). Embedding rows and the LM
 * head are not included (the caller adds the head). */
uint64_t model_layer_bytes_per_token(const lm_model *m, uint64_t *total);

#endif
