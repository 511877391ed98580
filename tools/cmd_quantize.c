/*
 * cmd_quantize.c - `lamina quantize IN.gguf OUT.gguf TYPE`: convert the
 * weight matrices of a GGUF model to another type. Metadata is copied (with
 * general.file_type updated); 1-D tensors (norms, biases) stay as they are.
 *
 * Q4_K_M is the usual mix: Q6_K for output.weight and for the attention V
 * and FFN down matrices of the layers that matter most (the first and last
 * eighth of the stack and every third layer between), Q4_K elsewhere.
 * A matrix whose rows do not divide into the type's blocks falls back to
 * Q8_0 (rows a multiple of 32) or F16.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"
#include "gguf.h"
#include "pool.h"
#include "quant.h"
#include "util.h"

static void usage_quantize(FILE *f) {
    fprintf(f,
            "usage: lamina quantize IN.gguf OUT.gguf TYPE [-t THREADS]\n"
            "Convert a model's weight matrices to TYPE: F32 F16 BF16 Q8_0 Q4_0 Q4_K Q6_K Q4_K_M.\n"
            "Norms and biases stay in their type; metadata is copied.\n");
}

/* general.file_type values as GGUF tools write them. */
static uint32_t file_type_of(const char *name) {
    static const struct { const char *n; uint32_t v; } ft[] = {
        {"F32", 0}, {"F16", 1}, {"Q4_0", 2}, {"Q8_0", 7}, {"Q4_K", 15}, {"Q4_K_M", 15}, {"Q6_K", 18}, {"BF16", 32},
    };
    for (size_t i = 0; i < sizeof ft / sizeof ft[0]; i++)
        if (!strcasecmp(ft[i].n, name)) return ft[i].v;
    return 0;
}

static bool more_bits(int layer, int n_layer) {
    return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

/* Target type of one tensor under the requested scheme. */
static uint32_t target_type(const gguf_tensor *t, uint32_t base, bool k_m, int n_layer) {
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

int cmd_quantize(int argc, char **argv) {
    args a = {argc, argv, 0, "quantize", usage_quantize};
    const char *pos[3] = {NULL, NULL, NULL};
    int npos = 0;
    long long threads = pool_default_threads();
    for (a.i = 1; a.i < argc; a.i++) {
        if (is_help(&a)) continue;
        if (is_flag(&a, "-t", "--threads")) threads = need_int(&a, 1, 1024);
        else if (argv[a.i][0] == '-' && argv[a.i][1]) die_usage(&a, "unknown argument '%s'", argv[a.i]);
        else if (npos < 3) pos[npos++] = argv[a.i];
        else die_usage(&a, "unexpected argument '%s'", argv[a.i]);
    }
    if (npos != 3) die_usage(&a, "%s", "needs IN.gguf OUT.gguf TYPE");
    bool k_m = !strcasecmp(pos[2], "Q4_K_M");
    int base = k_m ? LM_TYPE_Q4_K : quant_type_from_name(pos[2]);
    if (base < 0 || !quant_traits((uint32_t)base)->from_float ||
        (base != LM_TYPE_F32 && base != LM_TYPE_F16 && base != LM_TYPE_BF16 && base != LM_TYPE_Q8_0 &&
         base != LM_TYPE_Q4_0 && base != LM_TYPE_Q4_K && base != LM_TYPE_Q6_K))
        die_usage(&a, "cannot quantize to '%s' (F32 F16 BF16 Q8_0 Q4_0 Q4_K Q6_K Q4_K_M)", pos[2]);
    char err[LM_ERRLEN];
    gguf_ctx *g = gguf_open(pos[0], err, sizeof err);
    if (!g) {
        fprintf(stderr, "lamina quantize: %s: %s\n", pos[0], err);
        return 1;
    }
    gguf_str arch;
    int64_t n_layer = 0;
    if (gguf_get_str(g, "general.architecture", &arch)) {
        char key[96];
        snprintf(key, sizeof key, "%.*s.block_count", (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
        gguf_get_int(g, key, &n_layer);
    }
    lm_pool *pool = pool_new((int)threads);
    gguf_writer *w = gguf_writer_new();
    int64_t nt = gguf_n_tensors(g);
    void **bufs = calloc((size_t)nt + 1, sizeof(void *));
    if (!pool || !w || !bufs) fail("quantize", "out of memory");
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        gguf_str k = gguf_kv_key(g, i);
        if (gguf_str_eq(k, "general.file_type") || gguf_str_eq(k, "general.quantization_version")) continue;
        if (gguf_w_copy_kv(w, g, i)) fail("quantize", "out of memory copying metadata");
    }
    gguf_w_set_u32(w, "general.file_type", file_type_of(pos[2]));
    gguf_w_set_u32(w, "general.quantization_version", 2);
    uint64_t in_bytes = 0, out_bytes = 0;
    double t0 = lm_now();
    for (int64_t i = 0; i < nt; i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        uint32_t to = target_type(t, (uint32_t)base, k_m, (int)n_layer);
        const void *data = t->data;
        uint64_t nbytes = t->nbytes;
        if (to != t->type) {
            if (!quant_traits(t->type) || !quant_traits(t->type)->to_float) {
                snprintf(err, sizeof err, "tensor '%s' has type %s, which lamina cannot read", t->name,
                         quant_type_name(t->type));
                fail("quantize", err);
            }
            int64_t rows = (int64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
            nbytes = quant_row_size(to, (int64_t)t->ne[0]) * (uint64_t)rows;
            bufs[i] = malloc(nbytes);
            if (!bufs[i]) fail("quantize", "out of memory");
            q_job j = {.src = t, .dst = bufs[i], .type = to, .rows = rows, .cols = (int64_t)t->ne[0]};
            atomic_init(&j.next, 0);
            pool_run(pool, q_worker, &j);
            data = bufs[i];
        }
        if (gguf_w_add_tensor(w, t->name, t->n_dims, t->ne, to, data, nbytes)) fail("quantize", "out of memory");
        in_bytes += t->nbytes;
        out_bytes += nbytes;
        fprintf(stderr, "[%4lld/%4lld] %-32s %-5s -> %-5s %9.2f MiB -> %8.2f MiB\n", (long long)i + 1, (long long)nt,
                t->name, quant_type_name(t->type), quant_type_name(to), t->nbytes / 1048576.0, nbytes / 1048576.0);
    }
    if (gguf_writer_write(w, pos[1], err, sizeof err)) fail("quantize", err);
    fprintf(stderr, "quantize: %s -> %s: %.2f MiB -> %.2f MiB in %.1f s\n", pos[0], pos[1], in_bytes / 1048576.0,
            out_bytes / 1048576.0, lm_now() - t0);
    for (int64_t i = 0; i < nt; i++) free(bufs[i]);
    free(bufs);
    gguf_writer_free(w);
    pool_free(pool);
    gguf_close(g);
    return 0;
}
