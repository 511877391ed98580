/*
 * swa_model.h - a tiny sliding-window model for the KV tests.
 *
 * swa_model_load rewrites a llama GGUF (the bundled stories260K: 5 layers,
 * n_embd 64, 8 query / 4 KV heads of dim 8, a 512-token SentencePiece
 * vocabulary) as a gemma3 file with a window of `window` tokens on every
 * layer but each `pattern`-th (counting from 1, as model.c does), and loads
 * it. Same weights and tokenizer, plus what gemma3 needs: per-head Q/K norms
 * and post-attention / post-FFN norms, fixed values near 1. Its text is
 * meaningless, but it is deterministic and exercises the real gemma3 path
 * (window masks, per-layer RoPE, the pool's local class) with windows of a
 * few tokens. Returns NULL with a message on failure.
 */
#ifndef LAMINA_TEST_SWA_MODEL_H
#define LAMINA_TEST_SWA_MODEL_H

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf.h"
#include "model/model.h"
#include "format/quant.h"
#include "base/util.h"

static lm_model *swa_model_load(const char *src, int window, int pattern, int n_ctx, char *err, size_t errlen) {
    static int serial;
    gguf_ctx *g = gguf_open(src, err, errlen);
    if (!g) return NULL;
    int64_t n_layer = 0, n_embd = 0, n_head = 0;
    if (!gguf_get_int(g, "llama.block_count", &n_layer) || !gguf_get_int(g, "llama.embedding_length", &n_embd) ||
        !gguf_get_int(g, "llama.attention.head_count", &n_head) || n_head < 1 || n_embd % n_head) {
        gguf_close(g);
        lm_err(err, errlen, "%s is not a llama model", src);
        return NULL;
    }
    int64_t hd = n_embd / n_head;
    gguf_writer *w = gguf_writer_new();
    /* metadata: llama.* becomes gemma3.*, the rest (tokenizer) is copied */
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        gguf_str k = gguf_kv_key(g, i);
        if (k.len > 6 && !memcmp(k.ptr, "llama.", 6)) {
            char key[160];
            snprintf(key, sizeof key, "gemma3.%.*s", (int)(k.len - 6), k.ptr + 6);
            int64_t v;
            double f;
            if (gguf_kv_type(g, i) == GGUF_FLOAT32 || gguf_kv_type(g, i) == GGUF_FLOAT64) {
                gguf_kv_float(g, i, &f);
                gguf_w_set_f32(w, key, (float)f);
            } else if (gguf_kv_int(g, i, &v)) {
                gguf_w_set_u32(w, key, (uint32_t)v);
            }
        } else {
            gguf_w_copy_kv(w, g, i);
        }
    }
    gguf_w_set_str(w, "general.architecture", "gemma3");
    gguf_w_set_u32(w, "gemma3.context_length", (uint32_t)n_ctx);
    gguf_w_set_u32(w, "gemma3.attention.sliding_window", (uint32_t)window);
    gguf_w_set_u32(w, "gemma3.attention.sliding_window_pattern", (uint32_t)pattern);
    gguf_w_set_f32(w, "gemma3.rope.freq_base_swa", 10000.0f);
    gguf_w_set_f32(w, "gemma3.rope.freq_base", 100000.0f);
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        gguf_w_add_tensor(w, t->name, t->n_dims, t->ne, t->type, t->data, t->nbytes);
    }
    /* per layer: q and k norms (hd), post-attention and post-FFN norms (n_embd) */
    size_t per_layer = (size_t)(2 * hd + 2 * n_embd);
    float *norms = lm_malloc((size_t)n_layer * per_layer * sizeof(float));
    if (!norms) {
        gguf_writer_free(w);
        gguf_close(g);
        lm_err(err, errlen, "out of memory");
        return NULL;
    }
    for (int64_t li = 0; li < n_layer; li++) {
        static const char *names[4] = {"attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"};
        float *v = norms + (size_t)li * per_layer;
        for (int j = 0; j < 4; j++) {
            int64_t n = j < 2 ? hd : n_embd;
            for (int64_t e = 0; e < n; e++) v[e] = 1.0f + 0.1f * sinf((float)(7 * li + 3 * j + e));
            char name[96];
            snprintf(name, sizeof name, "blk.%d.%s.weight", (int)li, names[j]);
            uint64_t ne[1] = {(uint64_t)n};
            gguf_w_add_tensor(w, name, 1, ne, LM_TYPE_F32, v, (uint64_t)n * sizeof(float));
            v += n;
        }
    }
    char path[128];
    snprintf(path, sizeof path, "/tmp/lamina-test-swa-%d-%d.gguf", (int)getpid(), serial++);
    int rc = gguf_writer_write(w, path, err, errlen);
    gguf_writer_free(w);
    lm_free(norms);
    gguf_close(g);
    if (rc) return NULL;
    lm_model *m = model_load(path, err, errlen);
    unlink(path); /* the mapping stays valid */
    return m;
}

#endif
