/*
 * model_hparams.c - a model's hyperparameters from its GGUF metadata
 * (model_int.h): the architecture from general.architecture, then every
 * `<arch>.*` key the architecture needs, each checked against its range
 * (a missing required key or an out-of-range value is a format error, an
 * architecture or option lamina cannot run is LM_ERR_UNSUPPORTED); the
 * families' own keys (experts, deepseek2's latent attention, the hybrids'
 * linear attention and layer pattern, gemma2/phi3 options); RoPE scaling
 * (none, linear, YaRN: read_rope_scaling); the vocabulary size from
 * token_embd.weight's rows. Reads metadata only; allocates nothing.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "model/model_int.h"
#include "model/ops.h"
#include "base/util.h"

/* Read an integer hyperparameter `<arch>.<suffix>`; def < 0 means required. */
static int get_hp_int(loader *L, const char *arch, const char *suffix, int64_t def, int64_t lo, int64_t hi, int *out) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v;
    if (!gguf_get_int(L->m->gguf, key, &v)) {
        if (gguf_find_key(L->m->gguf, key) >= 0)
            return lm_err(L->err, L->errlen, "metadata '%s' is not an integer", key);
        if (def < 0) return lm_err(L->err, L->errlen, "missing metadata '%s'", key);
        v = def;
    }
    if (v < lo || v > hi)
        return lm_err(L->err, L->errlen, "metadata '%s' = %lld is out of range [%lld, %lld]", key, (long long)v,
                      (long long)lo, (long long)hi);
    *out = (int)v;
    return 0;
}

static int get_hp_float(loader *L, const char *arch, const char *suffix, double def, float *out) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    double v;
    if (!gguf_get_float(L->m->gguf, key, &v)) {
        if (gguf_find_key(L->m->gguf, key) >= 0) return lm_err(L->err, L->errlen, "metadata '%s' is not a number", key);
        v = def;
    }
    if (!(v == v) || v < 0 || v > 1e30) return lm_err(L->err, L->errlen, "metadata '%s' = %g is out of range", key, v);
    *out = (float)v;
    return 0;
}
/* Experts: llama files may have them (Mixtral: experts as wide as
 * feed_forward_length), qwen2moe and qwen3moe must. */
static int read_moe_hparams(loader *L, const char *arch) {
    lm_hparams *hp = &L->m->hp;
    bool qmoe = hp->arch == LM_ARCH_QWEN2MOE || hp->arch == LM_ARCH_QWEN3MOE || hp->arch == LM_ARCH_QWEN35MOE ||
        hp->arch == LM_ARCH_QWEN3NEXT || hp->arch == LM_ARCH_GPT_OSS;
    bool shexp = hp->arch == LM_ARCH_QWEN2MOE || hp->arch == LM_ARCH_QWEN35MOE || hp->arch == LM_ARCH_QWEN3NEXT;
    if (get_hp_int(L, arch, "expert_count", 0, 0, 4096, &hp->n_expert)) return -1;
    if (hp->n_expert == 0) {
        if (qmoe) return lm_err(L->err, L->errlen, "%s needs metadata '%s.expert_count'", arch, arch);
        return 0;
    }
    if (hp->arch != LM_ARCH_LLAMA && !qmoe)
        return unsupported(L), lm_err(L->err, L->errlen, "experts in a %s model are not supported", arch);
    if (get_hp_int(L, arch, "expert_used_count", -1, 1, hp->n_expert, &hp->n_expert_used) ||
        get_hp_int(L, arch, "expert_feed_forward_length", qmoe ? hp->n_ff / hp->n_expert_used : hp->n_ff, 1, 1 << 23,
                   &hp->n_ff_exp))
        return -1;
    if (shexp && get_hp_int(L, arch, "expert_shared_feed_forward_length", hp->n_ff, 1, 1 << 23, &hp->n_ff_shexp))
        return -1;
    float scale;
    if (get_hp_float(L, arch, "expert_weights_scale", 0.0, &scale)) return -1;
    if (scale != 0.0f && scale != 1.0f)
        return unsupported(L), lm_err(L->err, L->errlen, "expert weights scale %g is not supported", scale);
    hp->moe_norm_w = hp->arch != LM_ARCH_QWEN2MOE; /* qwen2moe keeps the softmax probabilities as they are */
    if (hp->arch == LM_ARCH_GPT_OSS) {             /* softmax over the chosen (sum 1 already), the clamped SwiGLU */
        hp->moe_norm_w = false;
        hp->moe_topk_softmax = true;
        hp->swiglu_oai = true;
    }
    return 0;
}

/* gemma2's and phi3's options (read_hparams has set the common ones). */
static int read_family_hparams(loader *L, const char *arch) {
    lm_hparams *hp = &L->m->hp;
    hp->rope_attn_factor = 1.0f;
    hp->n_ctx_orig = hp->n_ctx_train;
    if (hp->arch == LM_ARCH_GEMMA2) {
        hp->emb_scale = sqrtf((float)hp->n_embd);
        hp->gelu = true;
        /* the 27B model (46 layers) scales queries by n_embd / n_head, not the head width */
        if (hp->n_layer == 46) hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
        if (get_hp_int(L, arch, "attention.sliding_window", 4096, 0, 1 << 30, &hp->swa_window) ||
            get_hp_int(L, arch, "attention.sliding_window_pattern", 2, 1, 4096, &hp->swa_pattern) ||
            get_hp_float(L, arch, "rope.freq_base_swa", hp->rope_base, &hp->rope_base_swa) ||
            get_hp_float(L, arch, "attn_logit_softcapping", 50.0, &hp->attn_softcap) ||
            get_hp_float(L, arch, "final_logit_softcapping", 30.0, &hp->final_softcap))
            return -1;
    } else if (hp->arch == LM_ARCH_PHI3) {
        /* one window on every layer, where the file sets one */
        if (get_hp_int(L, arch, "attention.sliding_window", 0, 0, 1 << 30, &hp->swa_window) ||
            get_hp_int(L, arch, "rope.scaling.original_context_length", hp->n_ctx_train, 1, 1 << 30, &hp->n_ctx_orig) ||
            get_hp_float(L, arch, "rope.scaling.attn_factor", 1.0, &hp->rope_attn_factor))
            return -1;
        hp->swa_pattern = 0;
    }
    return read_moe_hparams(L, arch);
}

static int read_vocab(loader *L);

/* YaRN's magnitude factor for a context stretched by s: 1 + 0.1 m ln s (1 when s <= 1). */
static float yarn_mscale(float s, float m) { return s <= 1.0f ? 1.0f : 0.1f * m * logf(s) + 1.0f; }

/* `<arch>.rope.scaling.*`: none, linear (rope_scale = 1/factor; not for
 * deepseek2) or, where the family allows it (yarn_ok), YaRN over rope.scaling.original_context_length
 * (default the training context) with the ramp between yarn_beta_fast and
 * yarn_beta_slow (32 and 1 unless the file says), as llama.cpp reads these
 * files. With factor F:
 *   cos and sin are multiplied by A * attn_factor, where A = 1 + 0.1 ln F;
 *   deepseek2 files carry yarn_log_multiplier = 0.1 * M (M is the model's
 *   mscale_all_dim); with M set, A = 1 (the rotary mscale and mscale_all_dim
 *   cancel, as DeepSeek's configs give both equal); and deepseek2's
 *   attention scale is multiplied by (A * attn_factor * (1 + 0.1 M ln F))^2,
 *   returned in *kq (1 for the other families).
 * Sets rope_scale, rope_yarn, yarn_low/high and rope_attn_factor. */
static int read_rope_scaling(loader *L, const char *arch, bool yarn_ok, float *kq) {
    lm_hparams *hp = &L->m->hp;
    char key[160];
    gguf_str s;
    float f = 1.0f;
    *kq = 1.0f;
    hp->rope_scale = 1.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (!gguf_get_str(L->m->gguf, key, &s) || gguf_str_eq(s, "none")) return 0;
    bool yarn = gguf_str_eq(s, "yarn");
    /* deepseek2 folds the scaling into its attention scale, as DeepSeek's files use it: yarn only */
    bool linear_ok = hp->arch != LM_ARCH_DEEPSEEK2;
    if (!(gguf_str_eq(s, "linear") && linear_ok) && !(yarn && yarn_ok))
        return unsupported(L),
               lm_err(L->err, L->errlen, "rope scaling '%.*s' is not supported for %s (%s)",
                      (int)(s.len > 32 ? 32 : s.len), s.ptr, arch,
                      !linear_ok    ? "only yarn is"
                          : yarn_ok ? "linear and yarn are"
                                    : "only linear is");
    if (get_hp_float(L, arch, "rope.scaling.factor", 1.0, &f)) return -1;
    if (f > 0) hp->rope_scale = 1.0f / f;
    if (!yarn) return 0;
    if (!(f > 0)) return lm_err(L->err, L->errlen, "yarn rope scaling needs a positive '%s.rope.scaling.factor'", arch);
    float log_mul = 0, beta_fast, beta_slow, attn;
    if (get_hp_int(L, arch, "rope.scaling.original_context_length", hp->n_ctx_train, 1, 1 << 30, &hp->n_ctx_orig) ||
        get_hp_float(L, arch, "rope.scaling.yarn_beta_fast", 32.0, &beta_fast) ||
        get_hp_float(L, arch, "rope.scaling.yarn_beta_slow", 1.0, &beta_slow) ||
        get_hp_float(L, arch, "rope.scaling.attn_factor", 1.0, &attn) ||
        (hp->arch == LM_ARCH_DEEPSEEK2 && get_hp_float(L, arch, "rope.scaling.yarn_log_multiplier", 0.0, &log_mul)))
        return -1;
    if (!(beta_fast > 0) || !(beta_slow > 0) || attn == 0.0f)
        return lm_err(L->err, L->errlen,
                      "yarn rope scaling of %s: beta_fast %g, beta_slow %g and attn_factor %g must "
                      "be positive",
                      arch, beta_fast, beta_slow, attn);
    float m_all = log_mul / 0.1f; /* the converter wrote 0.1 * mscale_all_dim */
    float a = m_all != 0.0f ? 1.0f : yarn_mscale(f, 1.0f);
    hp->rope_yarn = true;
    hp->yarn_factor = f;
    hp->rope_attn_factor = a * attn;
    ops_rope_yarn_dims(hp->n_rot, hp->n_ctx_orig, hp->rope_base, beta_fast, beta_slow, &hp->yarn_low, &hp->yarn_high);
    if (hp->arch == LM_ARCH_DEEPSEEK2) {
        float ms = a * attn * (1.0f + 0.1f * m_all * logf(f));
        *kq = ms * ms;
    }
    return 0;
}

/* deepseek2 (read_hparams has read the counts common to every family). The
 * file's attention.key_length / value_length are the latent cache row and
 * the latent (kv_lora_rank + n_rot, kv_lora_rank), key_length_mla and
 * value_length_mla a head's query/key and value widths. Files without the
 * _mla keys were written before attn_k_b / attn_v_b were split out of
 * attn_kv_b: their key_length / value_length are a head's widths, and the
 * loader splits attn_kv_b itself (load_kv_b). */
static int read_mla_hparams(loader *L, const char *arch) {
    lm_hparams *hp = &L->m->hp;
    int kl_mla, vl_mla, kl, vl;
    if (get_hp_int(L, arch, "attention.key_length_mla", 0, 0, 4096, &kl_mla) ||
        get_hp_int(L, arch, "attention.value_length_mla", 0, 0, 4096, &vl_mla))
        return -1;
    if (!kl_mla != !vl_mla)
        return lm_err(L->err, L->errlen, "'%s.attention.key_length_mla' and value_length_mla come together", arch);
    L->kv_b_whole = !kl_mla;
    if (get_hp_int(L, arch, "attention.kv_lora_rank", -1, 1, 1 << 16, &hp->kv_lora_rank) ||
        get_hp_int(L, arch, "attention.q_lora_rank", 0, 0, 1 << 16, &hp->q_lora_rank) ||
        get_hp_int(L, arch, "rope.dimension_count", -1, 2, 4096, &hp->n_rot) ||
        get_hp_int(L, arch, "attention.key_length", L->kv_b_whole ? -1 : hp->kv_lora_rank + hp->n_rot, 1, 1 << 17,
                   &kl) ||
        get_hp_int(L, arch, "attention.value_length", L->kv_b_whole ? -1 : hp->kv_lora_rank, 1, 1 << 17, &vl) ||
        get_hp_float(L, arch, "rope.freq_base", 10000.0, &hp->rope_base) ||
        get_hp_float(L, arch, "attention.layer_norm_rms_epsilon", 1e-6, &hp->norm_eps) ||
        get_hp_int(L, arch, "leading_dense_block_count", 0, 0, hp->n_layer, &hp->n_layer_dense))
        return -1;
    if (L->kv_b_whole) { /* the head's widths; the cache row is still the latent and the RoPE key */
        if (kl > 4096 || vl > 4096)
            return lm_err(L->err, L->errlen, "key/value length %d/%d of a head are out of range", kl, vl);
        kl_mla = kl;
        vl_mla = vl;
        kl = hp->kv_lora_rank + hp->n_rot;
        vl = hp->kv_lora_rank;
    }
    if (hp->n_rot % 2) return lm_err(L->err, L->errlen, "rope dimension count %d is odd", hp->n_rot);
    if (kl_mla <= hp->n_rot)
        return lm_err(L->err, L->errlen, "key_length_mla %d leaves no dimension beside the %d rotated ones", kl_mla,
                      hp->n_rot);
    if (kl != hp->kv_lora_rank + hp->n_rot || vl != hp->kv_lora_rank)
        return lm_err(L->err, L->errlen, "key/value length %d/%d do not match kv_lora_rank %d and %d rotated dims", kl,
                      vl, hp->kv_lora_rank, hp->n_rot);
    hp->qk_nope = kl_mla - hp->n_rot;
    hp->v_head_dim = vl_mla;
    hp->head_dim = hp->kv_lora_rank + hp->n_rot; /* the cache row: one KV head */
    hp->n_head_kv = 1;
    hp->emb_scale = 1.0f;
    hp->rope_base_swa = hp->rope_base;
    hp->rope_attn_factor = 1.0f;
    hp->n_ctx_orig = hp->n_ctx_train;
    float kq;
    if (read_rope_scaling(L, arch, true, &kq)) return -1;
    hp->attn_scale = kq / sqrtf((float)kl_mla);
    char key[160];
    /* experts: on every layer after the leading dense ones */
    int shared, gating, groups;
    if (get_hp_int(L, arch, "expert_count", 0, 0, 4096, &hp->n_expert)) return -1;
    if (hp->n_layer_dense < hp->n_layer && hp->n_expert == 0)
        return lm_err(L->err, L->errlen, "%s has expert layers but no '%s.expert_count'", arch, arch);
    if (hp->n_expert == 0) return 0;
    if (get_hp_int(L, arch, "expert_used_count", -1, 1, hp->n_expert, &hp->n_expert_used) ||
        get_hp_int(L, arch, "expert_feed_forward_length", -1, 1, 1 << 23, &hp->n_ff_exp) ||
        get_hp_int(L, arch, "expert_shared_count", 0, 0, 256, &shared) ||
        get_hp_int(L, arch, "expert_gating_func", 1, 0, 16, &gating) ||
        get_hp_int(L, arch, "expert_group_count", 0, 0, 4096, &groups) ||
        get_hp_float(L, arch, "expert_weights_scale", 1.0, &hp->moe_scale))
        return -1;
    if (hp->moe_scale == 0.0f) hp->moe_scale = 1.0f;
    hp->n_ff_shexp = shared * hp->n_ff_exp;
    if (gating != 0 && gating != 1 && gating != 2)
        return unsupported(L),
               lm_err(L->err, L->errlen,
                      "expert gating function %d is not supported (1 softmax, "
                      "2 sigmoid)",
                      gating);
    hp->moe_sigmoid = gating == 2;
    if (groups > 1)
        return unsupported(L),
               lm_err(L->err, L->errlen, "group-limited expert routing (%d groups) is not supported", groups);
    snprintf(key, sizeof key, "%s.expert_weights_norm", arch);
    bool norm = false;
    if (gguf_find_key(L->m->gguf, key) >= 0 && !gguf_get_bool(L->m->gguf, key, &norm))
        return lm_err(L->err, L->errlen, "metadata '%s' is not a boolean", key);
    hp->moe_norm_w = norm;
    return 0;
}

/* qwen35's linear-attention shape and layer pattern, its gated attention
 * and its multi-axis RoPE sections (read_hparams has read the rest); for
 * qwen3next the same without sections, its value heads grouped by key head. */
static int read_hybrid_hparams(loader *L, const char *arch) {
    lm_hparams *hp = &L->m->hp;
    int inner;
    char key[160];
    if (get_hp_int(L, arch, "ssm.conv_kernel", -1, 1, 8, &hp->ssm_conv) ||
        get_hp_int(L, arch, "ssm.inner_size", -1, 1, 1 << 20, &inner) ||
        get_hp_int(L, arch, "ssm.state_size", -1, 1, 256, &hp->ssm_dk) ||
        get_hp_int(L, arch, "ssm.time_step_rank", -1, 1, 4096, &hp->ssm_hv) ||
        get_hp_int(L, arch, "ssm.group_count", -1, 1, 4096, &hp->ssm_hk) ||
        get_hp_int(L, arch, "full_attention_interval", 4, 1, 4096, &hp->full_attn_interval))
        return -1;
    if (inner % hp->ssm_hv || hp->ssm_hv % hp->ssm_hk)
        return lm_err(L->err, L->errlen, "ssm.inner_size %d and %d value heads, %d key heads do not divide", inner,
                      hp->ssm_hv, hp->ssm_hk);
    hp->ssm_dv = inner / hp->ssm_hv;
    if (hp->ssm_dv > 256)
        return unsupported(L),
               lm_err(L->err, L->errlen, "value heads of %d (more than 256) are not supported", hp->ssm_dv);
    /* converters write the pattern out when the checkpoint lists its layer types: read, it must be
     * the interval's (the only one lamina lays out) over the trunk's layers; the array's last
     * nextn_predict_layers entries are the next-token-prediction blocks (not recurrent) */
    snprintf(key, sizeof key, "%s.attention.recurrent_layers", arch);
    if (gguf_find_key(L->m->gguf, key) >= 0) {
        gguf_arr rl;
        const int nb = hp->n_layer + hp->n_layer_mtp; /* block_count: the trunk's and the MTP blocks */
        if (!gguf_get_arr(L->m->gguf, key, &rl) || rl.n != (uint64_t)nb)
            return lm_err(L->err, L->errlen, "metadata '%s' is not an array of %d booleans", key, nb);
        for (int i = 0; i < hp->n_layer; i++) {
            int64_t v;
            if (!gguf_arr_int(&rl, (uint64_t)i, &v) || v < 0 || v > 1)
                return lm_err(L->err, L->errlen, "metadata '%s' is not an array of %d booleans", key, nb);
            if ((v != 0) != ((i + 1) % hp->full_attn_interval != 0))
                return unsupported(L),
                       lm_err(L->err, L->errlen,
                              "'%s' makes layer %d %s, not every full_attention_interval-th (%d) layer full "
                              "attention: a layer pattern of its own is not supported",
                              key, i, v ? "recurrent" : "full attention", hp->full_attn_interval);
        }
    }
    hp->n_rlayer = 0;
    for (int i = 0; i < hp->n_layer; i++) hp->n_rlayer += (i + 1) % hp->full_attn_interval != 0;
    hp->attn_gate = true;
    if (hp->arch == LM_ARCH_QWEN3NEXT) { /* plain NeoX RoPE on n_rot dims; heads grouped (model.h) */
        hp->ssm_grouped = true;
        return 0;
    }
    /* text positions on every axis but the fourth (0): the pairs the first three sections interleave turn */
    snprintf(key, sizeof key, "%s.rope.dimension_sections", arch);
    int64_t sec[4] = {0};
    gguf_arr arr;
    bool ok = gguf_get_arr(L->m->gguf, key, &arr) && arr.n == 4;
    for (uint64_t i = 0; ok && i < 4; i++) ok = gguf_arr_int(&arr, i, &sec[i]) && sec[i] >= 0 && sec[i] <= 4096;
    if (!ok) return lm_err(L->err, L->errlen, "missing or malformed metadata '%s' (4 integers)", key);
    for (int i = 0; i < 4; i++) hp->rope_sections[i] = (int)sec[i];
    int64_t sum = sec[0] + sec[1] + sec[2] + sec[3];
    if (sum == 0 || sum * 2 > hp->n_rot)
        return lm_err(L->err, L->errlen, "rope sections sum to %lld pairs for %d rotated dims", (long long)sum,
                      hp->n_rot);
    return 0;
}

int model_read_hparams(loader *L) {
    lm_model *m = L->m;
    lm_hparams *hp = &m->hp;
    gguf_str s;
    if (!gguf_get_str(m->gguf, "general.architecture", &s))
        return lm_err(L->err, L->errlen, "missing metadata 'general.architecture'");
    char arch[64];
    snprintf(arch, sizeof arch, "%.*s", (int)(s.len < 63 ? s.len : 63), s.ptr);
    if (strcmp(arch, "llama") == 0) {
        hp->arch = LM_ARCH_LLAMA;
        hp->rope_style = LM_ROPE_ADJACENT;
    } else if (strcmp(arch, "qwen2") == 0) {
        hp->arch = LM_ARCH_QWEN2;
        hp->rope_style = LM_ROPE_NEOX;
    } else if (strcmp(arch, "gemma3") == 0) {
        hp->arch = LM_ARCH_GEMMA3;
        hp->rope_style = LM_ROPE_NEOX;
    } else if (strcmp(arch, "gemma-embedding") == 0) {
        hp->arch = LM_ARCH_GEMMA_EMBED;
        hp->rope_style = LM_ROPE_NEOX;
    } else if (strcmp(arch, "qwen3") == 0) {
        hp->arch = LM_ARCH_QWEN3;
        hp->rope_style = LM_ROPE_NEOX;
    } else if (strcmp(arch, "gemma2") == 0) {
        hp->arch = LM_ARCH_GEMMA2;
        hp->rope_style = LM_ROPE_NEOX;
    } else if (strcmp(arch, "phi3") == 0) {
        hp->arch = LM_ARCH_PHI3;
        hp->rope_style = LM_ROPE_NEOX;
    } else if (strcmp(arch, "qwen2moe") == 0) {
        hp->arch = LM_ARCH_QWEN2MOE;
        hp->rope_style = LM_ROPE_NEOX;
    } else if (strcmp(arch, "qwen3moe") == 0) {
        hp->arch = LM_ARCH_QWEN3MOE;
        hp->rope_style = LM_ROPE_NEOX;
    } else if (strcmp(arch, "deepseek2") == 0) {
        hp->arch = LM_ARCH_DEEPSEEK2;
        hp->rope_style = LM_ROPE_ADJACENT;
    } else if (strcmp(arch, "qwen35") == 0) {
        hp->arch = LM_ARCH_QWEN35;
        hp->rope_style = LM_ROPE_NEOX;
    } else if (strcmp(arch, "qwen35moe") == 0) {
        hp->arch = LM_ARCH_QWEN35MOE;
        hp->rope_style = LM_ROPE_NEOX;
    } else if (strcmp(arch, "qwen3next") == 0) {
        hp->arch = LM_ARCH_QWEN3NEXT;
        hp->rope_style = LM_ROPE_NEOX;
    } else if (strcmp(arch, "gpt-oss") == 0) {
        hp->arch = LM_ARCH_GPT_OSS;
        hp->rope_style = LM_ROPE_NEOX;
    } else if (strcmp(arch, "bert") == 0 || strcmp(arch, "nomic-bert") == 0) {
        hp->arch = arch[0] == 'b' ? LM_ARCH_BERT : LM_ARCH_NOMIC_BERT;
        hp->rope_style = LM_ROPE_NEOX;
        hp->encoder = true;
    } else {
        return unsupported(L),
               lm_err(L->err, L->errlen,
                      "unsupported architecture '%s' (lamina runs llama, qwen2, "
                      "qwen3, qwen35, qwen2moe, qwen3moe, qwen35moe, qwen3next, gemma2, gemma3, gemma-embedding, phi3, "
                      "deepseek2, gpt-oss, bert and nomic-bert)",
                      arch);
    }
    const int64_t big = 1 << 20;
    if (get_hp_int(L, arch, "block_count", -1, 1, 4096, &hp->n_layer) ||
        get_hp_int(L, arch, "embedding_length", -1, 1, big, &hp->n_embd) ||
        get_hp_int(L, arch, "attention.head_count", -1, 1, 4096, &hp->n_head) ||
        get_hp_int(L, arch, "attention.head_count_kv", hp->n_head, 1, 4096, &hp->n_head_kv) ||
        get_hp_int(L, arch, "feed_forward_length", -1, 1, 8 * big, &hp->n_ff) ||
        get_hp_int(L, arch, "context_length", 2048, 1, 64 * big, &hp->n_ctx_train))
        return -1;
    /* the hybrids' next-token-prediction layers follow the trunk's in block_count (qwen3next's
     * are left unread: only the trunk runs) */
    if ((hp->arch == LM_ARCH_QWEN35 || hp->arch == LM_ARCH_QWEN35MOE || hp->arch == LM_ARCH_QWEN3NEXT) &&
        get_hp_int(L, arch, "nextn_predict_layers", 0, 0, hp->n_layer - 1, &hp->n_layer_mtp))
        return -1;
    hp->n_layer -= hp->n_layer_mtp;
    /* an embedding model's pooling (llama.cpp's numbering; 4, rank, is a reranker's head) */
    if (get_hp_int(L, arch, "pooling_type", LM_POOL_NONE, LM_POOL_NONE, 4, &hp->pooling)) return -1;
    if (hp->pooling > LM_POOL_LAST)
        return unsupported(L), lm_err(L->err, L->errlen, "pooling type %d (rank) is not supported", hp->pooling);
    if (hp->n_head % hp->n_head_kv)
        return lm_err(L->err, L->errlen, "head count %d is not a multiple of the KV head count %d", hp->n_head,
                      hp->n_head_kv);
    /* attention.causal: absent means causal, but for the encoders, whose files say false */
    hp->causal = !hp->encoder && hp->arch != LM_ARCH_GEMMA_EMBED;
    char key[96];
    snprintf(key, sizeof key, "%s.attention.causal", arch);
    if (gguf_find_key(m->gguf, key) >= 0 && !gguf_get_bool(m->gguf, key, &hp->causal))
        return lm_err(L->err, L->errlen, "metadata '%s' is not a boolean", key);
    if (!hp->causal && !hp->encoder && hp->arch != LM_ARCH_GEMMA_EMBED) /* the decoders' pass masks causally */
        return unsupported(L),
               lm_err(L->err, L->errlen,
                      "%s is false: lamina runs non-causal attention in the "
                      "encoders (bert, nomic-bert) and gemma-embedding only",
                      key);
    if (hp->arch == LM_ARCH_DEEPSEEK2) return read_mla_hparams(L, arch) || read_vocab(L);
    int def_hd = hp->n_embd % hp->n_head ? -1 : hp->n_embd / hp->n_head;
    if (get_hp_int(L, arch, "attention.key_length", def_hd, 1, 4096, &hp->head_dim)) return -1;
    int vlen;
    if (get_hp_int(L, arch, "attention.value_length", hp->head_dim, 1, 4096, &vlen)) return -1;
    if (vlen != hp->head_dim)
        return unsupported(L),
               lm_err(L->err, L->errlen, "key length %d differs from value length %d: not supported", hp->head_dim,
                      vlen);
    if (get_hp_int(L, arch, "rope.dimension_count", hp->head_dim, 2, hp->head_dim, &hp->n_rot)) return -1;
    if (hp->n_rot % 2) return lm_err(L->err, L->errlen, "rope dimension count %d is odd", hp->n_rot);
    if (get_hp_float(L, arch, "rope.freq_base", 10000.0, &hp->rope_base) ||
        get_hp_float(L, arch, "attention.layer_norm_rms_epsilon", 1e-5, &hp->norm_eps))
        return -1;
    hp->emb_scale = 1.0f;
    hp->rope_base_swa = hp->rope_base;
    if (GEMMA3_ARCHS & ARCH(hp->arch)) {
        hp->emb_scale = sqrtf((float)hp->n_embd);
        hp->gelu = true;
        if (get_hp_int(L, arch, "attention.sliding_window", 0, 0, 1 << 30, &hp->swa_window) ||
            get_hp_int(L, arch, "attention.sliding_window_pattern", 6, 1, 4096, &hp->swa_pattern) ||
            get_hp_float(L, arch, "rope.freq_base_swa", 10000.0, &hp->rope_base_swa))
            return -1;
        if (!hp->causal && hp->swa_window == 1) return lm_err(L->err, L->errlen, "a symmetric window of 1 token");
    }
    /* gpt-oss: a window on every layer but each pattern-th (2: alternate, layer 0 local), as llama.cpp
     * lays it out; both kinds on one RoPE unless the file gives the local layers their own base */
    if (hp->arch == LM_ARCH_GPT_OSS &&
        (get_hp_int(L, arch, "attention.sliding_window", -1, 1, 1 << 30, &hp->swa_window) ||
         get_hp_int(L, arch, "attention.sliding_window_pattern", 2, 1, 4096, &hp->swa_pattern) ||
         get_hp_float(L, arch, "rope.freq_base_swa", hp->rope_base, &hp->rope_base_swa)))
        return -1;
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    if (hp->encoder) { /* LayerNorms; bert's positions are embedded, not rotated */
        if (get_hp_float(L, arch, "attention.layer_norm_epsilon", 1e-12, &hp->norm_eps)) return -1;
        if (hp->arch == LM_ARCH_BERT) hp->n_rot = 0;
        hp->rope_scale = 1.0f;
        hp->rope_attn_factor = 1.0f;
        hp->n_ctx_orig = hp->n_ctx_train;
        hp->gelu = hp->arch == LM_ARCH_BERT;
        return read_vocab(L);
    }
    bool hybrid = hp->arch == LM_ARCH_QWEN35 || hp->arch == LM_ARCH_QWEN35MOE || hp->arch == LM_ARCH_QWEN3NEXT;
    if (hybrid && read_hybrid_hparams(L, arch)) return -1;
    if (read_family_hparams(L, arch)) return -1;
    /* YaRN where the attention is plain RoPE on one base (not gemma's local
     * layers, not phi3's long-rope); linear for every family */
    bool yarn_ok = hp->arch != LM_ARCH_GEMMA2 && !(GEMMA3_ARCHS & ARCH(hp->arch)) && hp->arch != LM_ARCH_PHI3;
    float kq;
    if (read_rope_scaling(L, arch, yarn_ok, &kq)) return -1;
    return read_vocab(L);
}

/* The vocabulary size, from the embedding's rows. */
static int read_vocab(loader *L) {
    const int64_t big = 1 << 20;
    lm_model *m = L->m;
    const gguf_tensor *emb = gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!emb) return lm_err(L->err, L->errlen, "missing tensor 'token_embd.weight'");
    if (emb->ne[1] < 1 || emb->ne[1] > (uint64_t)(64 * big))
        return lm_err(L->err, L->errlen, "tensor 'token_embd.weight' has a bad vocabulary dimension");
    m->hp.n_vocab = (int)emb->ne[1];
    return 0;
}
