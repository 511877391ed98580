/*
 * cmd_mkmodel.c - `lamina mkmodel`: write a random-weight GGUF of a real
 * shape, for benchmarks and tests. Deterministic from --seed whatever the
 * thread count: every row draws from its own generator seeded by
 * (seed, tensor index, row). The output is created (as a temporary file,
 * base/safefile.h) before the weights are generated, so a path that cannot
 * be written is refused at once, and renamed into place only when complete.
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
            "Write a llama-architecture GGUF with random weights of a real shape.\n\n"
            "  --preset NAME      tinyllama-1.1b (22 layers, n_embd 2048, 32 heads, 4 KV heads,\n"
            "                     n_ff 5632, vocab 32000, context 2048) or small (8 layers, n_embd 512,\n"
            "                     8 heads, 4 KV heads, n_ff 1408, vocab 32000, context 2048)\n"
            "  --layers N --embd N --heads N --kv-heads N --ff N --vocab N --ctx N   custom shape\n"
            "  --type T           weight type: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_1 Q4_K Q6_K (default F16);\n"
            "                     norms stay F32\n"
            "  --vocab-from FILE  copy the tokenizer metadata of another GGUF (the vocabulary size\n"
            "                     then follows that file)\n"
            "  --seed S           default 1\n"
            "  -t, --threads N    threads for generating and quantizing\n");
}

typedef struct {
    const char *name;
    int layers, embd, heads, kv_heads, ff, vocab, ctx;
} preset;

static const preset presets[] = {
    {"tinyllama-1.1b", 22, 2048, 32, 4, 5632, 32000, 2048},
    {"small", 8, 512, 8, 4, 1408, 32000, 2048},
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
    int n_tensors;
    void **bufs;
    uint64_t bytes;
} maker;

static int add(maker *mk, const char *name, int64_t cols, int64_t rows, uint32_t type, float scale, bool ones) {
    if (quant_row_size(type, cols) == 0) type = cols % 32 == 0 ? LM_TYPE_Q8_0 : LM_TYPE_F16;
    size_t bytes = quant_row_size(type, cols) * (size_t)rows;
    void *buf = malloc(bytes);
    if (!buf) return -1;
    mk->bufs[mk->n_tensors++] = buf;
    if (ones) {
        for (int64_t i = 0; i < cols; i++) ((float *)buf)[i] = 1.0f;
    } else {
        fill_job j = {.dst = buf, .rows = rows, .cols = cols, .type = type, .scale = scale,
                      .seed = mk->seed + (uint64_t)mk->n_tensors * 7919u};
        atomic_init(&j.next, 0);
        pool_run(mk->pool, fill_worker, &j);
    }
    uint64_t ne[2] = {(uint64_t)cols, (uint64_t)rows};
    mk->bytes += bytes;
    return gguf_w_add_tensor(mk->w, name, rows > 1 ? 2 : 1, ne, type, buf, bytes);
}

int cmd_mkmodel(int argc, char **argv) {
    args a = {argc, argv, 0, "mkmodel", usage_mkmodel};
    const char *out = NULL, *vocab_from = NULL, *type_name = "F16";
    preset p = {"custom", 2, 256, 4, -1, 512, 512, 512}; /* kv heads -1: as many as heads */
    long long seed = 1, threads = pool_default_threads();
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
        else if (is_flag(&a, "--type", NULL)) type_name = need_val(&a);
        else if (is_flag(&a, "--vocab-from", NULL)) vocab_from = need_val(&a);
        else if (is_flag(&a, "--seed", NULL)) seed = need_int(&a, 0, 0x7fffffffffffffffLL);
        else if (is_flag(&a, "-t", "--threads")) threads = need_int(&a, 1, 1024);
        else die_usage(&a, "unknown argument '%s'", argv[a.i]);
    }
    if (!out) die_usage(&a, "%s", "no output file (-o OUT.gguf)");
    int type = quant_type_from_name(type_name);
    if (type < 0 || !quant_traits((uint32_t)type)->from_float)
        die_usage(&a, "weight type '%s' cannot be written (F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_1 Q4_K Q6_K)", type_name);
    if (p.kv_heads < 0) p.kv_heads = p.heads;
    if (p.embd % p.heads || p.heads % p.kv_heads)
        die_usage(&a, "%s", "embd must be a multiple of heads, and heads a multiple of kv-heads");
    char err[LM_ERRLEN];
    gguf_ctx *vsrc = NULL;
    if (vocab_from) {
        vsrc = gguf_open(vocab_from, err, sizeof err);
        if (!vsrc) {
            fprintf(stderr, "lamina mkmodel: %s: %s\n", vocab_from, err);
            return 1;
        }
        gguf_arr toks;
        if (!gguf_get_arr(vsrc, "tokenizer.ggml.tokens", &toks)) fail("mkmodel", "--vocab-from file has no tokenizer.ggml.tokens");
        p.vocab = (int)toks.n;
    }
    maker mk = {.w = gguf_writer_new(), .pool = pool_new((int)threads), .seed = (uint64_t)seed};
    mk.bufs = calloc((size_t)(4 + 9 * p.layers), sizeof(void *));
    if (!mk.w || !mk.pool || !mk.bufs) fail("mkmodel", "out of memory");
    /* the output is checked, and its temporary file created, before the work;
     * from here every failure removes that temporary file and nothing else */
    if (vocab_from && safefile_check_distinct(vocab_from, out, err, sizeof err)) fail("mkmodel", err);
    safefile *sf = safefile_create(out, err, sizeof err);
    if (!sf) fail("mkmodel", err);
    gguf_writer *w = mk.w;
    int hd = p.embd / p.heads;
    gguf_w_set_str(w, "general.architecture", "llama");
    char name[160];
    snprintf(name, sizeof name, "lamina-random-%s-%s", p.name, quant_type_name((uint32_t)type));
    gguf_w_set_str(w, "general.name", name);
    gguf_w_set_u32(w, "general.file_type", quantize_file_type(quant_type_name((uint32_t)type)));
    gguf_w_set_u32(w, "llama.block_count", (uint32_t)p.layers);
    gguf_w_set_u32(w, "llama.context_length", (uint32_t)p.ctx);
    gguf_w_set_u32(w, "llama.embedding_length", (uint32_t)p.embd);
    gguf_w_set_u32(w, "llama.feed_forward_length", (uint32_t)p.ff);
    gguf_w_set_u32(w, "llama.attention.head_count", (uint32_t)p.heads);
    gguf_w_set_u32(w, "llama.attention.head_count_kv", (uint32_t)p.kv_heads);
    gguf_w_set_u32(w, "llama.rope.dimension_count", (uint32_t)hd);
    gguf_w_set_f32(w, "llama.rope.freq_base", 10000.0f);
    gguf_w_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_w_set_u32(w, "llama.vocab_size", (uint32_t)p.vocab);
    if (vsrc) {
        for (int64_t i = 0; i < gguf_n_kv(vsrc); i++) {
            gguf_str k = gguf_kv_key(vsrc, i);
            if (k.len > 10 && !memcmp(k.ptr, "tokenizer.", 10)) gguf_w_copy_kv(w, vsrc, i);
        }
    }
    int64_t E = p.embd, Q = (int64_t)p.heads * hd, KV = (int64_t)p.kv_heads * hd;
    float ws = 1.0f / sqrtf((float)E), wf = 1.0f / sqrtf((float)p.ff);
    uint32_t t = (uint32_t)type;
    double t0 = lm_now();
    int rc = add(&mk, "token_embd.weight", E, p.vocab, t, 1.0f, false);
    rc |= add(&mk, "output_norm.weight", E, 1, LM_TYPE_F32, 0, true);
    rc |= add(&mk, "output.weight", E, p.vocab, t, ws, false);
    for (int i = 0; i < p.layers && !rc; i++) {
        char n[96];
#define A(suffix, cols, rows, ty, sc, ones) (snprintf(n, sizeof n, "blk.%d." suffix, i), add(&mk, n, cols, rows, ty, sc, ones))
        rc |= A("attn_norm.weight", E, 1, LM_TYPE_F32, 0, true);
        rc |= A("attn_q.weight", E, Q, t, ws, false);
        rc |= A("attn_k.weight", E, KV, t, ws, false);
        rc |= A("attn_v.weight", E, KV, t, ws, false);
        rc |= A("attn_output.weight", Q, E, t, ws, false);
        rc |= A("ffn_norm.weight", E, 1, LM_TYPE_F32, 0, true);
        rc |= A("ffn_gate.weight", E, p.ff, t, ws, false);
        rc |= A("ffn_up.weight", E, p.ff, t, ws, false);
        rc |= A("ffn_down.weight", p.ff, E, t, wf, false);
#undef A
        fprintf(stderr, "\rmkmodel: layer %d/%d", i + 1, p.layers);
    }
    fprintf(stderr, "\n");
    if (rc) {
        safefile_abort(sf);
        fail("mkmodel", "out of memory generating weights");
    }
    if (gguf_writer_write_file(w, sf, err, sizeof err)) {
        safefile_abort(sf);
        fail("mkmodel", err);
    }
    if (safefile_commit(sf, err, sizeof err)) fail("mkmodel", err);
    fprintf(stderr, "mkmodel: wrote %s (%.1f MiB of tensors, %s, %.1f s)\n", out, mk.bytes / 1048576.0,
            quant_type_name(t), lm_now() - t0);
    for (int i = 0; i < mk.n_tensors; i++) free(mk.bufs[i]);
    free(mk.bufs);
    gguf_writer_free(w);
    pool_free(mk.pool);
    if (vsrc) gguf_close(vsrc);
    return 0;
}
