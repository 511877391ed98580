/*
 * quantize.c - convert the weight matrices of a GGUF model to another type
 * (the engine behind `lamina quantize`). Metadata is copied with
 * general.file_type updated; 1-D tensors (norms, biases) keep their type.
 * A split input (gguf.h) is read whole and written as one file, without
 * its split.* keys.
 *
 * Q4_K_M is the usual mix: Q6_K for output.weight and for the attention V
 * and FFN down matrices of the layers that matter most (the first and last
 * eighth of the stack and every third layer between), Q4_K elsewhere.
 * Every other scheme, MXFP4 included, writes every matrix (the embeddings
 * and output too) in its one type.
 * A matrix whose rows do not divide into the type's blocks falls back to
 * Q8_0 (rows a multiple of 32) or F16; the progress callback is told both
 * the type asked and the type written, so the caller can say so.
 *
 * The output is checked before any work (not the input, a writable folder,
 * not a directory or device) and written through base/safefile, so a
 * failure at any point leaves an existing output file as it was.
 */
#include "format/quantize.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "format/gguf.h"
#include "format/quant.h"
#include "base/safefile.h"
#include "base/util.h"

/* general.file_type values as GGUF tools write them. */
static uint32_t file_type_of(const char *name) {
    static const struct {
        const char *n;
        uint32_t v;
    } ft[] = {
        {"F32", 0},  {"F16", 1},   {"Q4_0", 2},    {"Q4_1", 3},  {"Q8_0", 7},  {"Q5_0", 8},
        {"Q5_1", 9}, {"Q4_K", 15}, {"Q4_K_M", 15}, {"Q6_K", 18}, {"BF16", 32}, {"MXFP4", 38},
    };
    for (size_t i = 0; i < sizeof ft / sizeof ft[0]; i++)
        if (!strcasecmp(ft[i].n, name)) return ft[i].v;
    return 0;
}

static bool more_bits(int layer, int n_layer) {
    return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

/* Target type of one tensor under the requested scheme; *want is the
 * scheme's choice before the fallback for rows that do not fit its blocks. */
static uint32_t target_type(const gguf_tensor *t, uint32_t base, bool k_m, int n_layer, uint32_t *want_out) {
    *want_out = t->type;
    if (t->n_dims < 2) return t->type;
    uint32_t want = base;
    if (k_m) {
        int layer = -1;
        sscanf(t->name, "blk.%d.", &layer);
        if (!strcmp(t->name, "output.weight")) want = LM_TYPE_Q6_K;
        else if ((strstr(t->name, "attn_v.weight") || strstr(t->name, "ffn_down.weight")) && layer >= 0 &&
                 more_bits(layer, n_layer))
            want = LM_TYPE_Q6_K;
    }
    *want_out = want;
    if (quant_row_size(want, (int64_t)t->ne[0]) == 0) want = t->ne[0] % 32 == 0 ? LM_TYPE_Q8_0 : LM_TYPE_F16;
    return want;
}

typedef struct {
    const gguf_tensor *src;
    void *dst;
    uint32_t type;
    int64_t rows, cols;
    atomic_long next;
} q_job;

static void q_worker(void *arg, int ith, int nth) {
    q_job *j = arg;
    const lm_type_traits *st = quant_traits(j->src->type);
    size_t sb = quant_row_size(j->src->type, j->cols), db = quant_row_size(j->type, j->cols);
    float *row = malloc((size_t)j->cols * sizeof(float));
    if (!row) return;
    for (;;) {
        long r = atomic_fetch_add(&j->next, 1);
        if (r >= j->rows) break;
        st->to_float((const char *)j->src->data + (size_t)r * sb, row, j->cols);
        quant_from_float_ref(j->type, row, (char *)j->dst + (size_t)r * db, j->cols);
    }
    free(row);
}

uint32_t quantize_file_type(const char *scheme) { return file_type_of(scheme); }

int quantize_scheme(const char *name, uint32_t *base, bool *k_m) {
    *k_m = !strcasecmp(name, "Q4_K_M");
    int t = *k_m ? LM_TYPE_Q4_K : quant_type_from_name(name);
    if (t != LM_TYPE_F32 && t != LM_TYPE_F16 && t != LM_TYPE_BF16 && t != LM_TYPE_Q8_0 && t != LM_TYPE_Q4_0 &&
        t != LM_TYPE_Q5_0 && t != LM_TYPE_Q4_1 && t != LM_TYPE_Q5_1 && t != LM_TYPE_Q4_K && t != LM_TYPE_Q6_K &&
        t != LM_TYPE_MXFP4)
        return -1;
    *base = (uint32_t)t;
    return 0;
}

int quantize_file(const char *in, const char *out, const char *scheme, lm_pool *pool, quantize_progress_fn progress,
                  void *user, char *err, size_t errlen) {
    uint32_t base;
    bool k_m;
    if (quantize_scheme(scheme, &base, &k_m))
        return lm_err(err, errlen,
                      "cannot quantize to '%s' (F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q6_K Q4_K_M MXFP4)", scheme);
    /* every check on the output comes before the work: the input is mapped
     * while the output is written, so they must be different files */
    if (safefile_check_distinct(in, out, err, errlen)) return -1;
    gguf_ctx *g = gguf_open(in, err, errlen);
    if (!g) return -1;
    safefile *f = safefile_create(out, err, errlen);
    if (!f) {
        gguf_close(g);
        return -1;
    }
    int rc = -1;
    gguf_str arch;
    int64_t n_layer = 0;
    if (gguf_get_str(g, "general.architecture", &arch)) {
        char key[96];
        snprintf(key, sizeof key, "%.*s.block_count", (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
        gguf_get_int(g, key, &n_layer);
    }
    gguf_writer *w = gguf_writer_new();
    int64_t nt = gguf_n_tensors(g);
    void **bufs = lm_calloc((size_t)nt + 1, sizeof(void *));
    if (!w || !bufs) {
        lm_err(err, errlen, "out of memory");
        goto out;
    }
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        gguf_str k = gguf_kv_key(g, i);
        if (gguf_str_eq(k, "general.file_type") || gguf_str_eq(k, "general.quantization_version")) continue;
        if (k.len > 6 && !memcmp(k.ptr, "split.", 6)) continue; /* a split input becomes one file */
        gguf_w_copy_kv(w, g, i);
    }
    gguf_w_set_u32(w, "general.file_type", file_type_of(scheme));
    gguf_w_set_u32(w, "general.quantization_version", 2);
    uint64_t in_total = 0, in_done = 0;
    for (int64_t i = 0; i < nt; i++) in_total += gguf_tensor_at(g, i)->nbytes;
    for (int64_t i = 0; i < nt; i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        uint32_t want;
        uint32_t to = target_type(t, base, k_m, (int)n_layer, &want);
        const void *data = t->data;
        uint64_t nbytes = t->nbytes;
        if (to != t->type) {
            if (!quant_traits(t->type) || !quant_traits(t->type)->to_float) {
                lm_err(err, errlen, "tensor '%s' has type %s, which lamina cannot read", t->name,
                       quant_type_name(t->type));
                goto out;
            }
            int64_t rows = (int64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
            nbytes = quant_row_size(to, (int64_t)t->ne[0]) * (uint64_t)rows;
            bufs[i] = lm_malloc(nbytes);
            if (!bufs[i]) {
                lm_err(err, errlen, "out of memory converting '%s'", t->name);
                goto out;
            }
            q_job j = {.src = t, .dst = bufs[i], .type = to, .rows = rows, .cols = (int64_t)t->ne[0]};
            atomic_init(&j.next, 0);
            pool_run(pool, q_worker, &j);
            data = bufs[i];
        }
        gguf_w_add_tensor(w, t->name, t->n_dims, t->ne, to, data, nbytes);
        in_done += t->nbytes;
        if (progress) {
            quantize_tensor_info info = {.i = i,
                                         .n = nt,
                                         .name = t->name,
                                         .from = t->type,
                                         .want = want,
                                         .to = to,
                                         .row_len = (int64_t)t->ne[0],
                                         .n_elements = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3],
                                         .in_bytes = t->nbytes,
                                         .out_bytes = nbytes,
                                         .in_done = in_done,
                                         .in_total = in_total};
            progress(user, &info);
        }
    }
    if (gguf_writer_write_file(w, f, err, errlen) == 0) {
        rc = safefile_commit(f, err, errlen);
        f = NULL; /* commit frees it, success or not */
    }
out:
    safefile_abort(f);
    for (int64_t i = 0; bufs && i < nt; i++) lm_free(bufs[i]);
    lm_free(bufs);
    gguf_writer_free(w);
    gguf_close(g);
    return rc;
}
