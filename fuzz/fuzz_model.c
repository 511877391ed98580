/*
 * fuzz_model.c - libFuzzer entry for the model loader: hyperparameters and
 * every layer's tensors read from a GGUF file's metadata and shapes (dense,
 * fused phi3 matrices sliced by rows, 3-D expert tensors sliced per expert,
 * rope factors, soft-caps, windows, deepseek2's latent attention with its
 * per-head attn_k_b / attn_v_b slices and leading dense layers, or an
 * older file's attn_kv_b split at load, and YaRN rope scaling keys).
 *
 * Each input is opened with gguf_open_mem and loaded with model_load_gguf.
 * A model that loads is checked: every layer matrix and expert slice lies
 * inside the input, with the rows and columns the hyperparameters say. The
 * sanitizers catch reads out of bounds.
 *
 *   make fuzz
 * Seeds: fuzz/seeds/fuzz_model/ (tiny files of each architecture, written by
 * `lamina mkmodel` as fuzz/make_seeds.py says). deepseek2_yarn.gguf and
 * deepseek2_kv_b.gguf (YaRN keys; attn_kv_b whole) are
 *   lamina mkmodel --preset deepseek2-small --layers 2 --embd 32 --heads 1 --vocab 16 --ff 32 \
 *       --experts 2 --experts-used 1 --ff-exp 32 --type Q4_0 [--kv-b-whole] -o SEED
 * (under the 64 KiB of make fuzz's -max_len).
 */
#include <stdint.h>
#include <stdlib.h>

#include "format/gguf.h"
#include "model/model.h"
#include "base/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_weight(const lm_weight *w, const uint8_t *data, size_t size) {
    if (!w->rows) return; /* no shared expert */
    const uint8_t *p = w->data;
    size_t n = (size_t)w->rows * w->row_bytes;
    if (p < data || p + n > data + size) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[LM_ERRLEN];
    if (size > (1u << 20)) return 0;
    gguf_ctx *g = gguf_open_mem(data, size, err, sizeof err);
    if (!g) return 0;
    lm_model *m = model_load_gguf(g, err, sizeof err);
    if (!m) {
        gguf_close(g);
        return 0;
    }
    /* the mapping gguf_open_mem made is what the weights point into */
    const uint8_t *base = NULL;
    size_t len = 0;
    for (int64_t i = 0; i < gguf_n_tensors(m->gguf); i++) {
        const gguf_tensor *t = gguf_tensor_at(m->gguf, i);
        if (!base || (const uint8_t *)t->data < base) base = t->data;
    }
    for (int64_t i = 0; i < gguf_n_tensors(m->gguf); i++) {
        const gguf_tensor *t = gguf_tensor_at(m->gguf, i);
        size_t end = (size_t)((const uint8_t *)t->data - base) + t->nbytes;
        if (end > len) len = end;
    }
    for (int i = 0; i < m->hp.n_layer; i++) {
        const lm_weight *ws[MODEL_LAYER_MATRICES];
        model_layer_matrices(&m->layers[i], ws);
        for (int k = 0; k < MODEL_LAYER_MATRICES; k++) check_weight(ws[k], base, len);
        if (m->layers[i].moe)
            for (int e = 0; e < 3 * m->hp.n_expert; e++) check_weight(&m->layers[i].moe->gate[e], base, len);
        const lm_mla *a = m->layers[i].mla;
        if (a) { /* deepseek2: the latent attention's matrices and per-head slices */
            check_weight(&a->q_a, base, len);
            check_weight(&a->q_b, base, len);
            check_weight(&a->kv_a, base, len);
            for (int h = 0; h < m->hp.n_head; h++) {
                /* W_UKᵀ split out of a whole attn_kv_b lies in the model's own copy */
                if (m->kb_mem) check_weight(&a->k_b[h], m->kb_mem, m->kb_bytes);
                else check_weight(&a->k_b[h], base, len);
                check_weight(&a->v_b[h], base, len);
            }
        }
    }
    model_free(m);
    return 0;
}
