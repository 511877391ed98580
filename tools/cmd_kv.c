/*
 * cmd_kv.c - `lamina kv`: KV-cache memory for a model and a workload.
 *
 * Prints the KV bytes per token from the formula
 *     2 x layers x KV heads x head dim x bytes per element
 * (F32 4, F16 2, Q8_0 34/32: an f16 scale per 32 int8 values), the pool's
 * block size in bytes, and how many tokens and sequences of the context
 * length fit, for a byte budget (--kv-mem) or for --seqs sequences of -c
 * tokens. The figures come from kv_plan_make, which sizes the pool exactly as
 * kv_pool_new allocates it; the formula is evaluated here independently and
 * the two must agree. --alloc builds the pool and checks its allocation too.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kv.h"
#include "quant.h"
#include "util.h"

/* Declared in cli.h with the other subcommands; repeated here so this file
 * also compiles on its own against an older cli.h. */

static void usage_kv(FILE *f) {
    fprintf(f,
            "usage: lamina kv -m MODEL.gguf [--kv-type T] [--kv-mem BYTES | -c CTX] [--seqs N] [--block-size B]\n"
            "                 [--alloc]\n"
            "KV-cache memory: bytes per token, and how many tokens and sequences fit.\n\n"
            "  --kv-type T      element type: F32, F16 (default) or Q8_0 (head dim a multiple of 32)\n"
            "  --kv-mem BYTES   size the pool from a budget (e.g. 512M, 8G); reports sequences of CTX that fit\n"
            "  -c CTX           tokens per sequence (default: the model's training context)\n"
            "  --seqs N         without --kv-mem: size the pool for N sequences of CTX tokens (default 1)\n"
            "  --block-size B   tokens per block (default %d)\n"
            "  --alloc          also allocate the pool and check its size against the estimate\n",
            KV_DEFAULT_BLOCK);
}

static void print_bytes(const char *label, uint64_t b) {
    printf("%-16s %llu bytes (%.2f MiB)\n", label, (unsigned long long)b, (double)b / 1048576.0);
}

int cmd_kv(int argc, char **argv) {
    args a = {argc, argv, 0, "kv", usage_kv};
    const char *model = NULL, *type_name = "F16";
    unsigned long long mem = 0;
    long long ctx = 0, seqs = 1, block = KV_DEFAULT_BLOCK;
    bool alloc = false, have_seqs = false;
    for (a.i = 1; a.i < argc; a.i++) {
        if (is_help(&a)) continue;
        if (is_flag(&a, "-m", "--model")) model = need_val(&a);
        else if (is_flag(&a, "--kv-type", NULL)) type_name = need_val(&a);
        else if (is_flag(&a, "--kv-mem", NULL)) mem = need_bytes(&a);
        else if (is_flag(&a, "-c", "--ctx")) ctx = need_int(&a, 1, 1 << 30);
        else if (is_flag(&a, "--seqs", NULL)) seqs = need_int(&a, 1, 1 << 24), have_seqs = true;
        else if (is_flag(&a, "--block-size", NULL)) block = need_int(&a, 1, 1 << 20);
        else if (is_flag(&a, "--alloc", NULL)) alloc = true;
        else die_usage(&a, "unknown argument '%s'", argv[a.i]);
    }
    if (mem && have_seqs) die_usage(&a, "%s", "--seqs sizes the pool; with --kv-mem the budget does (give one)");
    int type = quant_type_from_name(type_name);
    if (type != LM_TYPE_F32 && type != LM_TYPE_F16 && type != LM_TYPE_Q8_0)
        die_usage(&a, "--kv-type wants F32, F16 or Q8_0, got '%s'", type_name);
    lm_model *m = load_or_die("kv", model);
    const lm_hparams *hp = &m->hp;
    if (ctx == 0) ctx = hp->n_ctx_train > 0 ? hp->n_ctx_train : 2048;

    kv_config c;
    kv_config_init(&c, hp->n_layer, hp->n_head_kv, hp->head_dim);
    c.type = (uint32_t)type;
    c.block_size = (int)block;
    c.mem_bytes = mem;
    c.n_ctx = (int)ctx;
    c.n_seqs = (int)seqs;
    kv_plan pl;
    char err[LM_ERRLEN];
    if (kv_plan_make(&c, &pl, err, sizeof err)) {
        model_free(m);
        fail("kv", err);
    }

    /* the formula, on its own: bytes per element as num/den */
    uint64_t num = type == LM_TYPE_F32 ? 4 : type == LM_TYPE_F16 ? 2 : sizeof(block_q8_0);
    uint64_t den = type == LM_TYPE_Q8_0 ? QK8_0 : 1;
    uint64_t per_tok = 2ull * (uint64_t)hp->n_layer * (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim * num / den;
    int64_t blocks_per_seq = (ctx + block - 1) / block;

    printf("model:           %s (%d layers, %d query / %d KV heads, head dim %d, trained context %d)\n", m->name,
           hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ctx_train);
    printf("KV type:         %s (%s bytes per element)\n", quant_type_name((uint32_t)type),
           type == LM_TYPE_Q8_0 ? "34/32" : type == LM_TYPE_F16 ? "2" : "4");
    printf("KV per token:    2 x %d layers x %d KV heads x %d head dim x %s = %llu bytes\n", hp->n_layer,
           hp->n_head_kv, hp->head_dim, type == LM_TYPE_Q8_0 ? "34/32" : type == LM_TYPE_F16 ? "2" : "4",
           (unsigned long long)per_tok);
    printf("block:           %d tokens = %llu bytes\n", c.block_size, (unsigned long long)pl.block_bytes);
    printf("sequence:        %lld tokens = %lld blocks = %llu bytes\n", ctx, (long long)blocks_per_seq,
           (unsigned long long)((uint64_t)blocks_per_seq * pl.block_bytes));
    if (mem) print_bytes("budget:", mem);
    printf("pool:            %lld blocks = %lld tokens = %llu bytes (%.2f MiB)\n", (long long)pl.n_blocks,
           (long long)pl.n_tokens, (unsigned long long)pl.data_bytes, (double)pl.data_bytes / 1048576.0);
    long long fit = (long long)(pl.n_blocks / blocks_per_seq);
    printf("fits:            %lld sequence%s of %lld tokens (%lld tokens in all)\n", fit, fit == 1 ? "" : "s", ctx,
           (long long)pl.n_tokens);

    int rc = 0;
    if (per_tok != pl.bytes_per_token || pl.data_bytes != (uint64_t)pl.n_tokens * per_tok) {
        fprintf(stderr, "lamina kv: pool plan (%llu bytes per token) disagrees with the formula (%llu)\n",
                (unsigned long long)pl.bytes_per_token, (unsigned long long)per_tok);
        rc = 1;
    }
    if (alloc && !rc) {
        kv_pool *p = kv_pool_new(&c, err, sizeof err);
        if (!p) {
            model_free(m);
            fail("kv", err);
        }
        kv_stats st;
        kv_stats_get(p, &st);
        bool ok = st.bytes_total == (uint64_t)pl.n_tokens * per_tok && st.n_blocks == pl.n_blocks;
        printf("allocated:       %lld blocks, %llu bytes of K/V: %s\n", (long long)st.n_blocks,
               (unsigned long long)st.bytes_total, ok ? "agrees with the formula" : "DISAGREES with the formula");
        if (!ok) rc = 1;
        kv_pool_free(p);
    }
    model_free(m);
    return rc;
}
