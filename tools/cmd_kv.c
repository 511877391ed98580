/*
 * cmd_kv.c - `lamina kv`: KV-cache memory for a model and a workload.
 *
 * Prints the KV bytes per token from the formula
 *     2 x layers x KV heads x head dim x bytes per element
 * (F32 4, F16 2, Q8_0 34/32: an f16 scale per 32 int8 values), the pool's
 * block size in bytes, and how many tokens and sequences of the context
 * length fit, for a byte budget (--kv-mem) or for --seqs sequences of -c
 * tokens. For a model with sliding-window layers (gemma3) the formula is
 * given per block class: global layers keep every position, local layers
 * only their window plus one append (--chunk) per sequence (kv.h); the
 * report then sets the pool against the one-class layout that keeps every
 * layer's positions: its bytes for the same sequences, or its context from
 * the same budget. The figures come from kv_plan_make, which sizes the pool
 * exactly as kv_pool_new allocates it; the formula is evaluated here
 * independently and the two must agree. --alloc builds the pool and checks
 * its allocation too. With --tp N the model is rank 0's shard of N, and
 * every figure is one rank's (its KV heads; replicated ones said so).
 * With --pp M the figures above are the whole model's (all stages), and a
 * table follows with each stage's layers, weight bytes and its share of
 * the pool: the same blocks, holding only the stage's layers (kv.h).
 *
 * --mem BYTES is the whole memory budget of an engine serving --seqs
 * sequences of -c tokens with -t threads (engine_mem_plan, the plan
 * engine_new follows): the split into weights (mapped, packed copies),
 * workspace (forward pass for batches of --chunk, attention scratch per
 * thread, logits rows) and the KV pool, which gets the rest and is then
 * reported as for --kv-mem. A budget too small for one sequence of -c
 * tokens is an error (exit 1) naming every part. --draft-model FILE (with
 * --mem) counts a speculative-decoding draft in it: its weights, workspace
 * and its own KV pool, which shares the rest with the model's.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "base/pool.h"
#include "model/ep.h"
#include "model/forward.h"
#include "sched/engine.h"
#include "kv/kv.h"
#include "kv/rstate.h"
#include "format/quant.h"
#include "base/util.h"

static void usage_kv(FILE *f) {
    fprintf(f,
            "usage: lamina kv [-m] MODEL.gguf [--kv-type T] [--mem BYTES | --kv-mem BYTES] [-c CTX] [--seqs N]\n"
            "                 [--block-size B] [--chunk N] [-t THREADS] [--alloc]\n"
            "KV-cache memory: bytes per token, and how many tokens and sequences fit.\n\n"
            "  --kv-type T      element type: F32, F16 (default) or Q8_0 (head dim a multiple of 32)\n"
            "  --mem BYTES      the whole memory budget (e.g. 8G) of an engine of --seqs sequences and -t\n"
            "                   threads: prints weights + workspace + KV, the pool getting the rest\n"
            "  --kv-mem BYTES   size the pool from a budget (e.g. 512M, 8G); reports sequences of CTX that fit\n"
            "  --draft-model F  with --mem: count a speculative-decoding draft model (weights, workspace and\n"
            "                   its own KV pool, sharing the rest with the model's; --draft-max 3)\n"
            "  --state-snapshots N  with --mem, hybrid models: the prefix cache's state snapshot slots\n"
            "                   (default: --seqs, at most a quarter of the budget's rest; 0: none)\n"
            "  -t N             threads, for --mem's workspace (default: physical cores)\n"
            "  -c CTX           tokens per sequence (default: the model's training context)\n"
            "  --ctx-extend     allow -c above the model's trained context (with a warning)\n"
            "  --seqs N         sequences (default 1): without --kv-mem the pool holds N sequences of CTX\n"
            "                   tokens; with it, sliding-window layers get blocks for N sequences at once\n"
            "  --block-size B   tokens per block (default %d)\n"
            "  --chunk N        most tokens a sequence appends at once, i.e. the prefill chunk (default %d,\n"
            "                   as run, perplexity and serve use); sizes the sliding-window layers' blocks\n"
            "  --alloc          also allocate the pool and check its size against the estimate\n",
            KV_DEFAULT_BLOCK, FWD_BATCH_DEFAULT);
}

static void print_bytes(const char *label, uint64_t b) {
    printf("%-16s %llu bytes (%.2f MiB)\n", label, (unsigned long long)b, (double)b / 1048576.0);
}

static double mib(uint64_t b) { return (double)b / 1048576.0; }

/* --pp: each stage's layers, weight bytes and KV pool, from the same plan
 * restricted to its layers; 1 when the stages' pools do not add up to the
 * whole pool. */
static int pp_table(const lm_model *m, const kv_config *whole, const kv_plan *wpl) {
    const lm_pp *pp = &m->pp;
    printf("pipeline:        %d stages of contiguous layers, balanced by weight bytes (embedding on stage 0, "
           "LM head on stage %d); every stage's pool has the same %lld blocks%s\n",
           pp->size, pp->size - 1, (long long)(wpl->cls[KV_GLOBAL].n_blocks + wpl->cls[KV_LOCAL].n_blocks),
           m->tp.size > 1 ? "; figures per tensor rank" : "");
    printf("  stage  layers      weights (MiB)  KV/token (bytes)  KV pool (MiB)\n");
    uint64_t sum = 0;
    int rc = 0;
    for (int s = 0; s < pp->size; s++) {
        kv_config c = *whole;
        c.layer0 = c.layer1 = 0; /* the stage's layers as KV pool layers: a hybrid's recurrent ones keep no KV */
        for (int li = 0; li < pp->first[s + 1]; li++)
            if (m->layers[li].rec < 0) c.layer0 += li < pp->first[s], c.layer1++;
        kv_plan pl;
        char err[LM_ERRLEN];
        if (kv_plan_make(&c, &pl, err, sizeof err)) {
            fprintf(stderr, "lamina kv: stage %d: %s\n", s, err);
            return 1;
        }
        if (pl.n_blocks != wpl->n_blocks || pl.cls[KV_LOCAL].n_blocks != wpl->cls[KV_LOCAL].n_blocks) rc = 1;
        sum += pl.data_bytes;
        int l0 = pp->first[s], l1 = pp->first[s + 1];
        printf("  %5d  %3d-%-3d (%2d)  %13.2f  %16llu  %13.2f\n", s, l0, l1 - 1, l1 - l0, mib(pp->bytes[s]),
               (unsigned long long)pl.bytes_per_token, mib(pl.data_bytes));
    }
    if (sum != wpl->data_bytes) rc = 1;
    printf("  (stages' pools: %llu bytes in all, the whole pool %llu: %s)\n", (unsigned long long)sum,
           (unsigned long long)wpl->data_bytes, rc ? "DISAGREE" : "agree");
    return rc;
}

/* --ep: each rank's experts and weight bytes (the rest replicated) and its
 * KV pool, the whole pool on every rank (attention is whole on each). */
static void ep_table(const lm_model *m, const kv_plan *pl) {
    const lm_ep *ep = &m->ep;
    uint64_t all = 0, mine = 0, own[LM_TP_MAX] = {0};
    for (int li = m->pp.layer0; li < m->pp.layer1; li++) {
        all += model_layer_bytes(m, li);
        if (!m->layers[li].moe) continue;
        const lm_moe *moe = &m->moe[li];
        for (int e = 0; e < m->hp.n_expert; e++) { /* rows as loaded, whatever this rank keeps */
            int r = ep_owner(m, li, e);
            uint64_t b = (uint64_t)m->hp.n_ff_exp * (moe->gate[e].row_bytes + moe->up[e].row_bytes) +
                (uint64_t)m->hp.n_embd * quant_row_size(moe->down[e].type, m->hp.n_ff_exp); /* --tp: its columns */
            own[r] += b;
            if (r == ep->rank) mine += b;
        }
    }
    const bool staged = m->pp.size > 1, head = m->pp.stage == m->pp.size - 1;
    const uint64_t rest = all - mine + (uint64_t)m->tok_embd.rows * m->tok_embd.row_bytes +
        (head && m->output.data != m->tok_embd.data ? (uint64_t)m->output.rows * m->output.row_bytes : 0);
    char how[64];
    if (ep->owner) snprintf(how, sizeof how, "balanced by routing counts");
    else snprintf(how, sizeof how, "contiguous: rank r holds experts r*%d/%d ..", m->hp.n_expert, ep->size);
    printf("expert parallel: %d ranks, each holding whole routed experts (%s); the router, %sattention and the "
           "dense layers %s%s\n",
           ep->size, how, m->hp.n_ff_shexp ? "the shared expert, " : "",
           m->tp.size > 1 ? "split by --tp inside each expert rank's tensor group (figures for tensor rank 0)"
                          : "on every rank",
           staged ? " (figures for stage 0: its layers and the embedding; each stage's KV pool above)" : "");
    printf("  rank  experts   expert weights (MiB)  replicated (MiB)  total (MiB)%s\n",
           staged ? "" : "  KV pool (MiB)");
    for (int r = 0; r < ep->size; r++) {
        char held[16];
        if (ep->owner) { /* how many in the stage's first MoE layer (balanced: up to ceil(X / N) in each) */
            int c = 0, li = m->pp.layer0;
            while (li < m->pp.layer1 && !m->layers[li].moe) li++;
            for (int e = 0; li < m->pp.layer1 && e < m->hp.n_expert; e++) c += ep_owner(m, li, e) == r;
            snprintf(held, sizeof held, "%d", c);
        } else snprintf(held, sizeof held, "%d-%d", ep->first[r], ep->first[r + 1] - 1);
        printf("  %4d  %-7s  %20.2f  %16.2f  %11.2f", r, held, mib(own[r]), mib(rest), mib(own[r] + rest));
        if (staged) printf("\n");
        else printf("  %13.2f\n", mib(pl->data_bytes));
    }
}

/* The split of a whole budget as engine_new makes it; the KV pool's bytes
 * (exit 1 when the budget cannot hold one sequence of ctx tokens). */
static uint64_t budget_split(const lm_model *m, const lm_model *dm, uint64_t budget, uint32_t type, int ctx, int seqs,
                             int block, int chunk, int threads, int snaps) {
    lm_engine_config ec;
    engine_config_default(&ec);
    lm_spec_config sc;
    lm_spec_config_default(&sc);
    if (dm) {
        sc.proposer = LM_SPEC_DRAFT;
        sc.draft_model = dm;
        sc.max = 3;
        ec.spec = &sc;
    }
    ec.mem = budget;
    ec.kv_type = type;
    ec.n_ctx = ctx;
    ec.max_seqs = seqs;
    ec.block_size = block;
    ec.batch_tokens = chunk;
    ec.n_threads = threads;
    ec.state_snapshots = snaps;
    engine_mem sp;
    char err[LM_ERRLEN];
    if (engine_mem_plan(m, &ec, &sp, err, sizeof err)) fail("kv", err);
    uint64_t draft = sp.draft_weights + sp.draft_workspace + sp.draft_kv;
    uint64_t used = sp.weights + sp.packed + sp.workspace + sp.state + sp.kv + draft;
    printf("memory budget:   %llu bytes (%.2f MiB)\n", (unsigned long long)budget, mib(budget));
    printf("  weights:       %llu bytes (%.2f MiB): %llu mapped + %llu packed copies\n",
           (unsigned long long)(sp.weights + sp.packed), mib(sp.weights + sp.packed), (unsigned long long)sp.weights,
           (unsigned long long)sp.packed);
    printf("  workspace:     %llu bytes (%.2f MiB): batches of %d tokens, %d threads, logits of %d sequences\n",
           (unsigned long long)sp.workspace, mib(sp.workspace), chunk < ctx ? chunk : ctx, threads, seqs);
    if (sp.state)
        printf("  state:         %llu bytes (%.2f MiB): the recurrent layers' state (F32), %d sequence%s %llu + "
               "%d prefix-cache snapshot%s %llu\n",
               (unsigned long long)sp.state, mib(sp.state), seqs, seqs == 1 ? "" : "s",
               (unsigned long long)(sp.state - sp.state_snap), sp.rcfg.n_snap, sp.rcfg.n_snap == 1 ? "" : "s",
               (unsigned long long)sp.state_snap);
    printf("  KV pool:       %llu bytes (%.2f MiB): the rest, %lld tokens, %lld sequence%s of %d at once\n",
           (unsigned long long)sp.kv, mib(sp.kv), (long long)sp.kv_tokens, (long long)sp.kv_seqs,
           sp.kv_seqs == 1 ? "" : "s", ctx);
    if (dm)
        printf(
            "  draft model:   %llu bytes (%.2f MiB): weights %llu + workspace %llu + KV pool %llu (%lld tokens, F16)\n",
            (unsigned long long)draft, mib(draft), (unsigned long long)sp.draft_weights,
            (unsigned long long)sp.draft_workspace, (unsigned long long)sp.draft_kv, (long long)sp.draft_kv_tokens);
    printf("  unused:        %llu bytes (what whole blocks leave)\n", (unsigned long long)(budget - used));
    return sp.kc.mem_bytes;
}

/* Multi-head latent attention: the latent row per token and layer, and the
 * caches the same attention would need without it: multi-head (every head's
 * key of qk and value of v_head_dim) and grouped-query with a KV head per 4
 * query heads (keys and values of qk). */
static void print_mla(const lm_hparams *hp, const char *elem, uint64_t num, uint64_t den, uint64_t per_tok) {
    int qk = hp->qk_nope + hp->n_rot, kvh = hp->n_head >= 4 ? hp->n_head / 4 : 1;
    uint64_t mha = (uint64_t)hp->n_layer * (uint64_t)hp->n_head * (uint64_t)(qk + hp->v_head_dim) * num / den;
    uint64_t gqa = 2ull * (uint64_t)hp->n_layer * (uint64_t)kvh * (uint64_t)qk * num / den;
    printf("KV per token:    %d layers x (%d latent + %d RoPE key) x %s = %llu bytes (latent attention)\n", hp->n_layer,
           hp->kv_lora_rank, hp->n_rot, elem, (unsigned long long)per_tok);
    printf("instead of:      MHA %d layers x %d heads x (%d key + %d value) x %s = %llu bytes (%.1fx)\n", hp->n_layer,
           hp->n_head, qk, hp->v_head_dim, elem, (unsigned long long)mha, (double)mha / (double)per_tok);
    printf("                 GQA 2 x %d layers x %d KV heads x %d head dim x %s = %llu bytes (%.1fx)\n", hp->n_layer,
           kvh, qk, elem, (unsigned long long)gqa, (double)gqa / (double)per_tok);
}

int cmd_kv(int argc, char **argv) {
    args a = {argc, argv, 0, "kv", usage_kv};
    const char *model = NULL, *draft_path = NULL;
    uint32_t type = LM_TYPE_F16;
    unsigned long long mem = 0, budget = 0;
    long long threads = pool_default_threads();
    long long ctx = 0, seqs = 1, block = KV_DEFAULT_BLOCK, chunk = FWD_BATCH_DEFAULT;
    int snaps = 0; /* --state-snapshots: the default */
    bool alloc = false, ctx_extend = false;
    for (a.i = 1; a.i < argc; a.i++) {
        if (is_help(&a)) continue;
        if (is_flag(&a, "-m", "--model")) model = need_val(&a);
        else if (is_flag(&a, "--kv-type", NULL)) type = need_kv_type(&a);
        else if (is_flag(&a, "--kv-mem", NULL)) mem = need_bytes(&a);
        else if (is_flag(&a, "--mem", NULL)) budget = need_bytes(&a);
        else if (is_flag(&a, "-t", "--threads")) threads = need_int(&a, 1, 1024);
        else if (is_flag(&a, "-c", "--ctx")) ctx = need_int(&a, 1, 1 << 30);
        else if (is_flag(&a, "--ctx-extend", NULL)) ctx_extend = true;
        else if (is_flag(&a, "--seqs", NULL)) seqs = need_int(&a, 1, 1 << 24);
        else if (is_flag(&a, "--block-size", NULL)) block = need_int(&a, 1, 1 << 20);
        else if (is_flag(&a, "--chunk", NULL)) chunk = need_int(&a, 1, 1 << 24);
        else if (is_flag(&a, "--alloc", NULL)) alloc = true;
        else if (is_flag(&a, "--draft-model", NULL)) draft_path = need_val(&a);
        else if (is_flag(&a, "--state-snapshots", NULL)) snaps = snapshots_flag(&a);
        else die_usage(&a, "unknown argument '%s'", argv[a.i]);
    }
    lm_model *m = load_or_die("kv", model);
    const lm_hparams *hp = &m->hp;
    if (ctx == 0) ctx = hp->n_ctx_train > 0 ? hp->n_ctx_train : 2048;
    ctx_check("kv", "-c", ctx, hp->n_ctx_train, ctx_extend);
    if (budget && mem)
        die_usage(&a, "%s", "--mem is the whole budget (the KV pool gets the rest): give --mem or --kv-mem, not both");
    if (draft_path && !budget) die_usage(&a, "%s", "--draft-model counts a draft model in the budget: give --mem");
    lm_model *dm = draft_path ? load_or_die("kv", draft_path) : NULL;
    if (budget)
        mem = budget_split(m, dm, budget, type, (int)ctx, (int)seqs, (int)block, (int)chunk, (int)threads, snaps);
    model_free(dm);

    /* the pool a forward pass of chunk-token batches would use (a chunk
     * above the context counts as the context: it sizes the same blocks) */
    fwd_dims dims = fwd_dims_make(m, (int)ctx, (int)chunk);
    kv_config c;
    fwd_kv_config(m, &dims, &c);
    c.layer0 = c.layer1 = 0; /* every layer; the stages' shares follow (pp_table) */
    c.type = type;
    c.block_size = (int)block;
    c.mem_bytes = mem;
    c.n_seqs = (int)seqs;
    kv_plan pl;
    char err[LM_ERRLEN];
    if (kv_plan_make(&c, &pl, err, sizeof err)) {
        model_free(m);
        fail("kv", err);
    }

    /* the formula, on its own: bytes per element as num/den, layers per
     * class from the model (every layer local means one class, kv.h) */
    uint64_t num = type == LM_TYPE_F32 ? 4 : type == LM_TYPE_F16 ? 2 : sizeof(block_q8_0);
    uint64_t den = type == LM_TYPE_Q8_0 ? QK8_0 : 1;
    const char *elem = type == LM_TYPE_Q8_0 ? "34/32" : type == LM_TYPE_F16 ? "2" : "4";
    int n_local = 0;
    for (int i = 0; i < hp->n_layer; i++) n_local += hp->swa_window > 0 && m->layer_local[i];
    if (n_local == hp->n_layer) n_local = 0;
    int n_kv = hp->n_layer - hp->n_rlayer; /* recurrent layers (qwen35) keep state, not KV */
    int n_layers[KV_N_CLASS] = {n_kv - n_local, n_local};
    uint64_t slabs = hp->kv_lora_rank ? 1 : 2; /* latent attention: one row, the value inside the key (kv.h) */
    uint64_t unit = slabs * (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim * num / den; /* one layer */
    uint64_t per_tok = unit * (uint64_t)n_kv,
             cls_tok[KV_N_CLASS] = {unit * (uint64_t)n_layers[0], unit * (uint64_t)n_layers[1]};
    int64_t blocks_per_seq = (ctx + block - 1) / block;
    bool swa = n_local > 0;

    printf("model:           %s (%d layers, %d query / %d KV heads, head dim %d, trained context %d)\n", m->name,
           hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ctx_train);
    if (m->tp.size > 1) {
        const lm_tp *tp = &m->tp;
        if (tp->kv_copies > 1)
            printf("tensor parallel: %d ranks; the model has %d KV heads, fewer than the ranks, so each KV head is "
                   "replicated on %d ranks (every rank holds 1; the figures below are per rank)\n",
                   tp->size, tp->n_head_kv, tp->kv_copies);
        else
            printf("tensor parallel: %d ranks, each holding %d of the %d KV heads (%d query heads); the figures below "
                   "are per rank\n",
                   tp->size, hp->n_head_kv, tp->n_head_kv, hp->n_head);
    }
    printf("KV type:         %s (%s bytes per element)\n", quant_type_name((uint32_t)type), elem);
    int64_t fit;
    if (!swa) {
        if (hp->kv_lora_rank) print_mla(hp, elem, num, den, per_tok);
        else
            printf("KV per token:    2 x %d layers x %d KV heads x %d head dim x %s = %llu bytes%s\n", n_kv,
                   hp->n_head_kv, hp->head_dim, elem, (unsigned long long)per_tok,
                   hp->n_rlayer ? " (the recurrent layers keep a fixed state per sequence instead)" : "");
        printf("block:           %d tokens = %llu bytes\n", c.block_size, (unsigned long long)pl.block_bytes);
        printf("sequence:        %lld tokens = %lld blocks = %llu bytes\n", ctx, (long long)blocks_per_seq,
               (unsigned long long)((uint64_t)blocks_per_seq * pl.block_bytes));
        if (mem) print_bytes("budget:", mem);
        printf("pool:            %lld blocks = %lld tokens = %llu bytes (%.2f MiB)\n", (long long)pl.n_blocks,
               (long long)pl.n_tokens, (unsigned long long)pl.data_bytes, mib(pl.data_bytes));
        fit = pl.n_blocks / blocks_per_seq;
        printf("fits:            %lld sequence%s of %lld tokens (%lld tokens in all)\n", (long long)fit,
               fit == 1 ? "" : "s", ctx, (long long)pl.n_tokens);
    } else {
        const kv_class_plan *g = &pl.cls[KV_GLOBAL], *l = &pl.cls[KV_LOCAL];
        int64_t lps = pl.local_blocks_per_seq;
        printf("sliding window:  %d tokens on %d local layers; %d global layer%s keep%s every position\n", pl.window,
               n_local, n_layers[0], n_layers[0] == 1 ? "" : "s", n_layers[0] == 1 ? "s" : "");
        printf("KV per token:    global 2 x %d layers x %d KV heads x %d head dim x %s = %llu bytes\n", n_layers[0],
               hp->n_head_kv, hp->head_dim, elem, (unsigned long long)cls_tok[KV_GLOBAL]);
        printf("                 local  2 x %d layers x %d KV heads x %d head dim x %s = %llu bytes, for the "
               "window only\n",
               n_local, hp->n_head_kv, hp->head_dim, elem, (unsigned long long)cls_tok[KV_LOCAL]);
        printf("                 (every layer, every position kept: %llu bytes)\n", (unsigned long long)per_tok);
        printf("block:           %d tokens = %llu bytes global, %llu bytes local\n", c.block_size,
               (unsigned long long)g->block_bytes, (unsigned long long)l->block_bytes);
        printf("local blocks:    at most %lld per sequence (window %d + chunk %lld positions)\n", (long long)lps,
               pl.window, chunk);
        uint64_t seq_bytes = (uint64_t)blocks_per_seq * g->block_bytes + (uint64_t)lps * l->block_bytes;
        uint64_t seq_plain = (uint64_t)blocks_per_seq * pl.block_bytes;
        printf("sequence:        %lld tokens = %lld global + %lld local blocks = %llu bytes (%.2f MiB)\n", ctx,
               (long long)blocks_per_seq, (long long)lps, (unsigned long long)seq_bytes, mib(seq_bytes));
        printf("                 (every layer kept: %lld blocks = %llu bytes, %.2f MiB)\n", (long long)blocks_per_seq,
               (unsigned long long)seq_plain, mib(seq_plain));
        if (mem) print_bytes("budget:", mem);
        printf("pool:            %lld global blocks = %lld tokens, + %lld local blocks (%lld sequence%s at once)\n",
               (long long)g->n_blocks, (long long)pl.n_tokens, (long long)l->n_blocks, (long long)(l->n_blocks / lps),
               l->n_blocks / lps == 1 ? "" : "s");
        printf("                 = %llu bytes (%.2f MiB)\n", (unsigned long long)pl.data_bytes, mib(pl.data_bytes));
        fit = g->n_blocks / blocks_per_seq;
        if (l->n_blocks / lps < fit) fit = l->n_blocks / lps;
        printf("fits:            %lld sequence%s of %lld tokens (%lld tokens of context in all)\n", (long long)fit,
               fit == 1 ? "" : "s", ctx, (long long)pl.n_tokens);
        if (mem) {
            /* the same budget in the one-class layout */
            int64_t plain_blocks = (int64_t)(mem / pl.block_bytes);
            printf("saving:          %lld tokens of context instead of %lld with every layer kept (%.2fx);\n"
                   "                 %lld sequence%s of %lld instead of %lld\n",
                   (long long)pl.n_tokens, (long long)(plain_blocks * block),
                   (double)pl.n_tokens / (double)(plain_blocks * block), (long long)fit, fit == 1 ? "" : "s", ctx,
                   (long long)(plain_blocks / blocks_per_seq));
        } else {
            /* the same sequences in the one-class layout */
            uint64_t plain = (uint64_t)pl.n_blocks * pl.block_bytes;
            printf("saving:          %llu bytes (%.2f MiB) instead of %llu (%.2f MiB) with every layer kept\n"
                   "                 (%.2fx less)\n",
                   (unsigned long long)pl.data_bytes, mib(pl.data_bytes), (unsigned long long)plain, mib(plain),
                   (double)plain / (double)pl.data_bytes);
        }
    }

    if (hp->n_rlayer) { /* the engine's state store beside the pool: one slot per sequence (rstate.h) */
        rstate_config rc0;
        rstate_config_init(&rc0, hp->n_rlayer, hp->ssm_conv, 2 * hp->ssm_hk * hp->ssm_dk + hp->ssm_hv * hp->ssm_dv,
                           hp->ssm_hv, hp->ssm_dk, hp->ssm_dv);
        rc0.n_seqs = (int)seqs;
        rstate_plan rp;
        if (rstate_plan_make(&rc0, &rp, err, sizeof err) != RSTATE_OK) {
            model_free(m);
            fail("kv", err);
        }
        printf("state:           %d recurrent layers x %llu bytes (conv window %d x %d, matrices %d x %d x %d, F32) = "
               "%llu bytes per sequence (and per prefix-cache snapshot); %llu bytes (%.2f MiB) for %lld, beside "
               "the pool\n",
               hp->n_rlayer, (unsigned long long)rp.layer_bytes, hp->ssm_conv - 1, rc0.conv_channels, hp->ssm_hv,
               hp->ssm_dk, hp->ssm_dv, (unsigned long long)rp.slot_bytes, (unsigned long long)rp.live_bytes,
               mib(rp.live_bytes), seqs);
    }

    int rc = 0;
    uint64_t want = 0;
    for (int k = 0; k < KV_N_CLASS; k++) {
        want += (uint64_t)pl.cls[k].n_blocks * (uint64_t)block * cls_tok[k];
        if (cls_tok[k] != pl.cls[k].bytes_per_token || n_layers[k] != pl.cls[k].n_layer) rc = 1;
    }
    if (per_tok != pl.bytes_per_token || pl.data_bytes != want) rc = 1;
    if (rc)
        fprintf(stderr,
                "lamina kv: pool plan (%llu + %llu bytes per token, %llu bytes) disagrees with the formula "
                "(%llu + %llu, %llu)\n",
                (unsigned long long)pl.cls[KV_GLOBAL].bytes_per_token,
                (unsigned long long)pl.cls[KV_LOCAL].bytes_per_token, (unsigned long long)pl.data_bytes,
                (unsigned long long)cls_tok[KV_GLOBAL], (unsigned long long)cls_tok[KV_LOCAL],
                (unsigned long long)want);
    if (m->pp.size > 1 && pp_table(m, &c, &pl)) rc = 1;
    if (m->ep.size > 1) ep_table(m, &pl);
    if (alloc && !rc) {
        kv_pool *p = kv_pool_new(&c, err, sizeof err);
        if (!p) {
            model_free(m);
            fail("kv", err);
        }
        kv_stats st;
        kv_stats_get(p, &st);
        bool ok = st.bytes_total == want && st.cls[KV_GLOBAL].n_blocks == pl.cls[KV_GLOBAL].n_blocks &&
            st.cls[KV_LOCAL].n_blocks == pl.cls[KV_LOCAL].n_blocks;
        if (swa)
            printf("allocated:       %lld global + %lld local blocks, %llu bytes of K/V: %s\n",
                   (long long)st.cls[KV_GLOBAL].n_blocks, (long long)st.cls[KV_LOCAL].n_blocks,
                   (unsigned long long)st.bytes_total, ok ? "agrees with the formula" : "DISAGREES with the formula");
        else
            printf("allocated:       %lld blocks, %llu bytes of K/V: %s\n", (long long)st.n_blocks,
                   (unsigned long long)st.bytes_total, ok ? "agrees with the formula" : "DISAGREES with the formula");
        if (!ok) rc = 1;
        kv_pool_free(p);
    }
    model_free(m);
    return rc;
}
