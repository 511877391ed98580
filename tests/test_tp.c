/*
 * test_tp.c - tensor-parallel shards (model/shard.c) and the one-rank
 * collectives (dist/dist.c), in one process without MPI.
 *
 * The bundled model is loaded whole and as each rank's shard of 2 and of 4
 * (KV-head replication is checked on Gemma 3 in e2e_mpi.sh): the shard's counts and
 * slices are checked against the whole model's, and the Megatron split is
 * checked numerically: for every layer, the row-split products (q, k, v,
 * gate, up, LM head) of the shards, put side by side, equal the whole
 * products; the column-split ones (o, down), summed over ranks in rank
 * order, equal the whole product within 1e-5 relative L2 (float sums split
 * differently). Refusals name what does not split.
 *
 * Pipeline stages (shard.c, kv.c, forward.c): the byte-balanced split
 * against every split found by brute force; a KV pool of a layer range has
 * the whole pool's blocks and the range's bytes; and a pipelined prompt run
 * in one process, stage models side by side (stage 0's residual stream
 * copied into stage 1's, as pp.c sends it), cut into micro-batches, gives
 * the whole model's logits bit for bit.
 *
 * Expert parallelism (model/ep.c): --ep on the dense bundled model is
 * refused by name; the one-rank all-to-all is a copy; the balanced
 * placement worked by hand and its bounds on random loads. (Its passes over
 * ranks are checked under mpirun: e2e_mpi_ep.sh.)
 */
#include <math.h>
#include <stdlib.h>

#include "test.h"
#include "dist/dist.h"
#include "model/ep.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/ops.h"
#include "model/pp.h"
#include "kernels/kernels.h"
#include "base/util.h"

#define MODEL "models/stories260K.gguf"

static lm_model *load(int rank, int size) {
    char err[LM_ERRLEN];
    lm_status st;
    lm_model *m = model_load_tp(MODEL, NULL, rank, size, &st, err, sizeof err);
    if (!m) fprintf(stderr, "  load %d/%d: %s\n", rank, size, err);
    return m;
}

static void rand_fill(float *x, size_t n, unsigned seed) {
    lm_rng r;
    lm_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = (float)((double)(lm_rng_u64(&r) >> 11) / 9007199254740992.0 * 2 - 1);
}

static double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void test_shard_counts(void) {
    lm_model *w = load(0, 1), *s = load(1, 2);
    CHECK(w && s);
    CHECK(w->tp.size == 1 && w->tp.n_vocab == w->hp.n_vocab);
    CHECK(s->tp.size == 2 && s->tp.rank == 1);
    CHECK(s->hp.n_head * 2 == w->hp.n_head && s->hp.n_head_kv * 2 == w->hp.n_head_kv && s->hp.n_ff * 2 == w->hp.n_ff);
    CHECK(s->tp.n_head == w->hp.n_head && s->tp.kv_copies == 1 && s->tp.head0 == s->hp.n_head);
    CHECK(s->tp.vocab_split[0] + s->tp.vocab_split[1] == w->hp.n_vocab && s->tp.vocab0 == s->tp.vocab_split[0]);
    const lm_layer *lw = &w->layers[0], *ls = &s->layers[0];
    int hd = w->hp.head_dim;
    CHECK(ls->wq.rows == (int64_t)s->hp.n_head * hd && ls->wq.cols == w->hp.n_embd);
    /* (two loads, two mappings: compare the bytes) */
    CHECK(!memcmp(ls->wq.data, (const char *)lw->wq.data + (size_t)s->tp.head0 * hd * lw->wq.row_bytes,
                  (size_t)ls->wq.rows * ls->wq.row_bytes));
    CHECK(ls->wo.rows == w->hp.n_embd && ls->wo.cols == (int64_t)s->hp.n_head * hd &&
          ls->wo.row_bytes == lw->wo.row_bytes);
    CHECK(ls->w_down.cols == s->hp.n_ff && ls->w_gate.rows == s->hp.n_ff);
    CHECK(s->output.rows == s->tp.n_vocab);
    CHECK(s->tok_embd.rows == w->hp.n_vocab); /* the embedding is replicated */
    CHECK(model_kv_bytes_per_token(s, 2) * 2 == model_kv_bytes_per_token(w, 2));
    model_free(w);
    model_free(s);
}

static void test_shard_refusals(void) {
    char err[LM_ERRLEN];
    lm_status st;
    lm_model *m = model_load_tp(MODEL, NULL, 0, 3, &st, err, sizeof err);
    CHECK(!m && st == LM_ERR_UNSUPPORTED && strstr(err, "8 attention heads do not split over 3 ranks"));
    m = model_load_tp(MODEL, NULL, 0, 16, &st, err, sizeof err);
    CHECK(!m && st == LM_ERR_UNSUPPORTED && strstr(err, "do not split over 16"));
    /* 8 ranks would replicate its 4 KV heads (Gemma 3 in e2e_mpi.sh), but its 172 FFN rows do not split */
    m = model_load_tp(MODEL, NULL, 0, 8, &st, err, sizeof err);
    CHECK(!m && strstr(err, "172 FFN rows do not split over 8 ranks"));
    m = model_load_tp(MODEL, NULL, 2, 2, &st, err, sizeof err);
    CHECK(!m && strstr(err, "rank 2 of 2"));
}

/* The Megatron split, numerically, for every layer and N = 2 and 4. */
static void check_split(int N) {
    lm_model *w = load(0, 1), *s[8] = {0};
    CHECK(w);
    for (int r = 0; r < N; r++) CHECK((s[r] = load(r, N)));
    const lm_hparams *hp = &w->hp;
    size_t E = (size_t)hp->n_embd, qd = (size_t)hp->n_head * hp->head_dim, ff = (size_t)hp->n_ff;
    size_t big = E > qd ? E : qd;
    big = big > ff ? big : ff;
    big = big > (size_t)hp->n_vocab ? big : (size_t)hp->n_vocab;
    float *x = malloc(big * sizeof(float)), *y = malloc(big * sizeof(float)), *acc = malloc(big * sizeof(float));
    float *part = malloc(big * sizeof(float));
    void *scratch = malloc(1 << 20);
    CHECK(x && y && acc && part && scratch);
    for (int li = 0; li < hp->n_layer; li++) {
        /* column split: o over the attention output, down over the FFN rows */
        for (int which = 0; which < 2; which++) {
            const lm_weight *full = which ? &w->layers[li].w_down : &w->layers[li].wo;
            rand_fill(x, (size_t)full->cols, 17u + (unsigned)li);
            ops_matmul(NULL, y, full, x, 1, scratch);
            memset(acc, 0, E * sizeof(float));
            int64_t c0 = 0;
            for (int r = 0; r < N; r++) {
                const lm_weight *sw = which ? &s[r]->layers[li].w_down : &s[r]->layers[li].wo;
                ops_matmul(NULL, part, sw, x + c0, 1, scratch);
                for (size_t i = 0; i < E; i++) acc[i] += part[i];
                c0 += sw->cols;
            }
            CHECK(c0 == full->cols);
            double e = rel_l2(acc, y, E);
            CHECKF(e < 1e-5, "layer %d %s: rel L2 %g", li, which ? "down" : "o", e);
        }
        /* row split: q and gate, side by side */
        for (int which = 0; which < 2; which++) {
            const lm_weight *full = which ? &w->layers[li].w_gate : &w->layers[li].wq;
            rand_fill(x, E, 29u + (unsigned)li);
            ops_matmul(NULL, y, full, x, 1, scratch);
            int64_t r0 = 0;
            for (int r = 0; r < N; r++) {
                const lm_weight *sw = which ? &s[r]->layers[li].w_gate : &s[r]->layers[li].wq;
                ops_matmul(NULL, part, sw, x, 1, scratch);
                CHECKF(!memcmp(part, y + r0, (size_t)sw->rows * sizeof(float)), "layer %d rank %d rows differ", li, r);
                r0 += sw->rows;
            }
            CHECK(r0 == full->rows);
        }
    }
    /* the LM head's vocabulary slices, gathered, are the whole row */
    rand_fill(x, E, 5);
    ops_matmul(NULL, y, &w->output, x, 1, scratch);
    for (int r = 0; r < N; r++) {
        ops_matmul(NULL, part, &s[r]->output, x, 1, scratch);
        CHECK(!memcmp(part, y + s[r]->tp.vocab0, (size_t)s[r]->tp.n_vocab * sizeof(float)));
    }
    free(x);
    free(y);
    free(acc);
    free(part);
    free(scratch);
    for (int r = 0; r < N; r++) model_free(s[r]);
    model_free(w);
}

static void test_split_2(void) { check_split(2); }
static void test_split_4(void) { check_split(4); }

/* The best largest-stage bytes over every contiguous split with a layer per
 * stage (brute force, recursive). */
static uint64_t best_max(const uint64_t *lb, int n, int from, int stages, uint64_t head, uint64_t tail) {
    if (stages == 1) {
        uint64_t b = head + tail;
        for (int i = from; i < n; i++) b += lb[i];
        return b;
    }
    uint64_t best = UINT64_MAX, b = head;
    for (int end = from + 1; end <= n - (stages - 1); end++) {
        b += lb[end - 1];
        uint64_t rest = best_max(lb, n, end, stages - 1, 0, tail), mx = b > rest ? b : rest;
        if (mx < best) best = mx;
    }
    return best;
}

static void test_pp_split(void) {
    lm_model *w = load(0, 1);
    CHECK(w);
    int n = w->hp.n_layer, first[LM_TP_MAX + 1];
    uint64_t lb[64], bytes[LM_TP_MAX], total = 0;
    uint64_t head = (uint64_t)w->tok_embd.rows * w->tok_embd.row_bytes;
    uint64_t tail = (uint64_t)w->output.rows * w->output.row_bytes + (uint64_t)w->hp.n_embd * sizeof(float);
    for (int i = 0; i < n; i++) total += lb[i] = model_layer_bytes(w, i);
    char err[LM_ERRLEN];
    for (int S = 1; S <= n; S++) {
        CHECK(model_pp_split(w, S, first, bytes, err, sizeof err) == 0);
        uint64_t mx = 0, sum = 0;
        CHECK(first[0] == 0 && first[S] == n);
        for (int s = 0; s < S; s++) {
            CHECK(first[s + 1] > first[s]);
            mx = bytes[s] > mx ? bytes[s] : mx;
            sum += bytes[s];
        }
        CHECKF(sum == total + head + tail, "S=%d: stages add up to %llu, not %llu", S, (unsigned long long)sum,
               (unsigned long long)(total + head + tail));
        uint64_t best = best_max(lb, n, 0, S, head, tail);
        CHECKF(mx == best, "S=%d: largest stage %llu bytes, the best split has %llu", S, (unsigned long long)mx,
               (unsigned long long)best);
    }
    CHECK(model_pp_split(w, n + 1, first, bytes, err, sizeof err) != 0 &&
          strstr(err, "6 pipeline stages for 5 layers"));
    lm_status st;
    lm_model *m = model_load_grid(MODEL, NULL, 0, 1, 0, 6, &st, err, sizeof err);
    CHECK(!m && st == LM_ERR_UNSUPPORTED && strstr(err, "pipeline stages"));
    model_free(w);
}

/* A pool of layers [2, 4) of 6, two of them local (window): the whole
 * pool's block counts, the range's bytes. */
static void test_kv_layer_range(void) {
    static const uint8_t local[6] = {1, 1, 0, 1, 1, 0};
    kv_config c;
    kv_config_init(&c, 6, 2, 32);
    c.window = 8;
    c.layer_local = local;
    c.chunk = 4;
    c.n_ctx = 64;
    c.n_seqs = 3;
    kv_plan whole, part;
    char err[LM_ERRLEN];
    CHECK(kv_plan_make(&c, &whole, err, sizeof err) == 0);
    c.layer0 = 2;
    c.layer1 = 4;
    CHECK(kv_plan_make(&c, &part, err, sizeof err) == 0);
    CHECK(part.cls[KV_GLOBAL].n_blocks == whole.cls[KV_GLOBAL].n_blocks);
    CHECK(part.cls[KV_LOCAL].n_blocks == whole.cls[KV_LOCAL].n_blocks);
    CHECK(part.cls[KV_GLOBAL].n_held == 1 && part.cls[KV_LOCAL].n_held == 1);
    CHECK(part.cls[KV_GLOBAL].n_layer == 2 && part.cls[KV_LOCAL].n_layer == 4);
    CHECK(part.cls[KV_GLOBAL].block_bytes * 2 == whole.cls[KV_GLOBAL].block_bytes);
    CHECK(part.cls[KV_LOCAL].block_bytes * 4 == whole.cls[KV_LOCAL].block_bytes);
    CHECK(part.bytes_per_token * 3 == whole.bytes_per_token);
    c.mem_bytes = 1 << 20; /* a budget: the counts are still the whole model's */
    CHECK(kv_plan_make(&c, &part, err, sizeof err) == 0);
    c.layer0 = c.layer1 = 0;
    CHECK(kv_plan_make(&c, &whole, err, sizeof err) == 0);
    CHECK(part.n_blocks == whole.n_blocks && part.cls[KV_LOCAL].n_blocks == whole.cls[KV_LOCAL].n_blocks);
    CHECK(part.data_bytes < whole.data_bytes);
    c.layer0 = 4;
    c.layer1 = 7;
    CHECK(kv_plan_make(&c, &part, err, sizeof err) != 0 && strstr(err, "not inside 6 layers"));
}

/* Two stages in one process: micro-batches of 5 rows (the prompt's one
 * segment cut), stage 0's x copied into stage 1's, against one pass of the
 * whole model. */
static void test_pp_stages_in_process(void) {
    char err[LM_ERRLEN];
    lm_status st;
    lm_model *w = load(0, 1), *s0 = model_load_grid(MODEL, NULL, 0, 1, 0, 2, &st, err, sizeof err),
             *s1 = model_load_grid(MODEL, NULL, 0, 1, 1, 2, &st, err, sizeof err);
    CHECK(w && s0 && s1);
    CHECK(s0->pp.layer0 == 0 && s0->pp.layer1 == s1->pp.layer0 && s1->pp.layer1 == w->hp.n_layer);
    enum { N = 23, MB = 5 };
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = 1 + (i * 37) % 400;
    int V = w->hp.n_vocab;
    float *want = malloc((size_t)N * V * sizeof(float)), *got = malloc((size_t)N * V * sizeof(float));
    lm_seqrun *rw = seqrun_new(w, NULL, 64, 32, LM_TYPE_F16, err, sizeof err);
    lm_seqrun *r0 = seqrun_new(s0, NULL, 64, 32, LM_TYPE_F16, err, sizeof err);
    lm_seqrun *r1 = seqrun_new(s1, NULL, 64, 32, LM_TYPE_F16, err, sizeof err);
    CHECK(want && got && rw && r0 && r1);
    /* each stage's pool holds its layers only, the same blocks */
    CHECK(kv_pool_plan(r0->kv)->n_blocks == kv_pool_plan(rw->kv)->n_blocks);
    CHECK(kv_pool_plan(r0->kv)->bytes_per_token + kv_pool_plan(r1->kv)->bytes_per_token ==
          kv_pool_plan(rw->kv)->bytes_per_token);
    CHECK(seqrun_forward(rw, tok, N, want, true, err, sizeof err) == 0);
    CHECK(kv_append(r0->kv, r0->seq, N, err, sizeof err) == KV_OK &&
          kv_append(r1->kv, r1->seq, N, err, sizeof err) == KV_OK);
    size_t E = (size_t)w->hp.n_embd;
    fwd_span sp0 = fwd_span_stage(s0, NULL), sp1 = fwd_span_stage(s1, NULL);
    CHECK(sp0.embed && !sp0.head && !sp1.embed && sp1.head && sp0.layer1 == sp1.layer0);
    for (int p0 = 0; p0 < N; p0 += MB) {
        int n = N - p0 < MB ? N - p0 : MB;
        lm_seg g0 = {.seq = r0->seq, .pos0 = p0, .n = n, .n_logits = n}, g1 = g0;
        g1.seq = r1->seq;
        CHECK(fwd_pass(r0->fwd, &sp0, tok + p0, n, &g0, 1, got, err, sizeof err) == 0); /* no logits on stage 0 */
        memcpy(r1->fwd->x, r0->fwd->x, (size_t)n * E * sizeof(float));
        CHECK(fwd_pass(r1->fwd, &sp1, tok + p0, n, &g1, 1, got + (size_t)p0 * V, err, sizeof err) == 0);
    }
    /* a span outside the stage's layers is refused */
    fwd_span wide = sp1;
    wide.layer0 = 0;
    lm_seg g = {.seq = r1->seq, .pos0 = 0, .n = 1, .n_logits = 1};
    CHECKF(fwd_pass(r1->fwd, &wide, tok, 1, &g, 1, got, err, sizeof err) != 0 && strstr(err, "layers 0.."), "%s", err);
    CHECKF(!memcmp(got, want, (size_t)N * V * sizeof(float)), "pipelined logits differ from the whole model's");
    seqrun_free(rw);
    seqrun_free(r0);
    seqrun_free(r1);
    free(want);
    free(got);
    model_free(w);
    model_free(s0);
    model_free(s1);
}

/* The local pass of a tensor-parallel shard refuses to run without the
 * hooks that sum its partial products; with hooks that sum one rank (the
 * identity) it runs. */
static void test_shard_needs_hooks(void) {
    char err[LM_ERRLEN];
    lm_model *m = load(0, 2);
    CHECK(m && m->tp.size == 2);
    lm_seqrun *r = seqrun_new(m, NULL, 16, 8, LM_TYPE_F16, err, sizeof err);
    CHECK(r && kv_append(r->kv, r->seq, 2, err, sizeof err) == KV_OK);
    int32_t tok[2] = {1, 2};
    float *lg = malloc((size_t)m->hp.n_vocab * sizeof(float));
    lm_seg g = {.seq = r->seq, .pos0 = 0, .n = 2, .n_logits = 1};
    fwd_span sp = fwd_span_stage(m, NULL);
    CHECKF(fwd_pass(r->fwd, &sp, tok, 2, &g, 1, lg, err, sizeof err) != 0 && strstr(err, "hooks"), "%s", err);
    fwd_hooks one = {.reduce = dist_allreduce_sum, .gather_cols = dist_allgather_cols};
    sp = fwd_span_stage(m, &one);
    CHECKF(fwd_pass(r->fwd, &sp, tok, 2, &g, 1, lg, err, sizeof err) == 0, "%s", err);
    free(lg);
    seqrun_free(r);
    model_free(m);
}

/* One rank (no MPI, or before dist_init): every collective is the identity. */
static void test_dist_one_rank(void) {
    char err[LM_ERRLEN];
    CHECK(dist_rank() == 0 && dist_size() == 1);
    float x[4] = {1, 2, 3, 4}, out[4] = {0};
    CHECK(dist_allreduce_sum(x, 4, err, sizeof err) == 0 && x[0] == 1 && x[3] == 4);
    int cols[1] = {2};
    CHECK(dist_allgather_cols(x, 2, cols, out, err, sizeof err) == 0 && !memcmp(out, x, sizeof x));
    CHECK(dist_bcast(x, sizeof x, 0, err, sizeof err) == 0 && x[2] == 3);
    CHECK(dist_barrier(err, sizeof err) == 0);
    /* the all-to-all to oneself: a copy of send, when the counts agree */
    int n3[1] = {3}, n2[1] = {2};
    memset(out, 0, sizeof out);
    CHECK(dist_alltoallv(x, n3, out, n3, sizeof(float), err, sizeof err) == 0 && !memcmp(out, x, 3 * sizeof(float)) &&
          out[3] == 0);
    CHECKF(dist_alltoallv(x, n3, out, n2, sizeof(float), err, sizeof err) != 0 && strstr(err, "2 expected"), "%s", err);
}

/* --ep on a dense model is refused, naming it, with LM_ERR_UNSUPPORTED; one
 * rank of one keeps every expert (ep.size 1). */
static void test_ep_refusals(void) {
    char err[LM_ERRLEN];
    lm_status st;
    lm_model *m = model_load_ep(MODEL, NULL, 0, 1, 0, 1, 0, 2, NULL, &st, err, sizeof err);
    CHECKF(!m && st == LM_ERR_UNSUPPORTED && strstr(err, "is a dense model without experts"), "%s", err);
    model_free(m);
    m = model_load_ep(MODEL, NULL, 0, 1, 0, 1, 0, 1, NULL, &st, err, sizeof err);
    CHECKF(m && m->ep.size == 1 && m->ep.e0 == 0 && m->ep.e1 == m->hp.n_expert, "%s", err);
    model_free(m);
}

/* The balanced placement (ep_place_balanced): a skewed layer's experts,
 * heaviest first to the least-loaded rank with room, worked by hand: loads
 * 9 7 5 3 1 1 1 1 on 2 ranks go 9 -> 0, 7 -> 1, 5 -> 1, 3 -> 0, 1 -> 0 (a
 * tie: the lower rank), 1 -> 1, 1 -> 0 (rank 0 then holds 4, its share), 1
 * -> 1: 14 rows each, imbalance 1, against the contiguous placement's 24 and
 * 4 (24 / 14). On random loads over 1 to 8 ranks: every rank holds at most
 * ceil(X / N) experts, every expert one rank, and the busiest rank never
 * holds more than the contiguous placement's busiest plus the heaviest expert
 * (greedy's bound). Bad rank counts fail. */
static void test_ep_balanced(void) {
    const uint64_t rows[8] = {9, 7, 5, 3, 1, 1, 1, 1};
    const int16_t want[8] = {0, 1, 1, 0, 0, 1, 0, 1};
    int16_t own[64];
    CHECK(ep_place_balanced(rows, 8, 2, own) == 0 && !memcmp(own, want, sizeof want));
    CHECKF(fabs(ep_imbalance(rows, 8, 2, NULL) - 24.0 / 14.0) < 1e-12, "%f", ep_imbalance(rows, 8, 2, NULL));
    CHECKF(ep_imbalance(rows, 8, 2, own) == 1.0, "%f", ep_imbalance(rows, 8, 2, own));
    CHECK(ep_place_balanced(rows, 8, 9, own) != 0 && ep_place_balanced(rows, 8, 0, own) != 0);
    lm_rng rng;
    lm_rng_seed(&rng, 7);
    for (int trial = 0; trial < 200; trial++) {
        int X = 1 + (int)(lm_rng_u64(&rng) % 64), N = 1 + (int)(lm_rng_u64(&rng) % 8);
        if (N > X) N = X;
        uint64_t r[64], heaviest = 0, sum = 0;
        for (int e = 0; e < X; e++) {
            r[e] = lm_rng_u64(&rng) % 1000 * (lm_rng_u64(&rng) % 4 == 0 ? 10 : 1); /* a few hot experts */
            heaviest = r[e] > heaviest ? r[e] : heaviest;
            sum += r[e];
        }
        CHECK(ep_place_balanced(r, X, N, own) == 0);
        int held[8] = {0};
        bool ok = true;
        for (int e = 0; e < X; e++) ok = ok && own[e] >= 0 && own[e] < N && ++held[own[e]] <= (X + N - 1) / N;
        CHECKF(ok, "trial %d: X %d N %d", trial, X, N);
        double bal = ep_imbalance(r, X, N, own), con = ep_imbalance(r, X, N, NULL);
        if (sum)
            CHECKF(bal * (double)sum / N <= con * (double)sum / N + (double)heaviest + 1e-9,
                   "trial %d: balanced %f, contiguous %f", trial, bal, con);
    }
}

int main(void) {
    kernels_init();
    TEST_RUN(test_ep_balanced);
    TEST_RUN(test_shard_counts);
    TEST_RUN(test_ep_refusals);
    TEST_RUN(test_shard_refusals);
    TEST_RUN(test_split_2);
    TEST_RUN(test_split_4);
    TEST_RUN(test_dist_one_rank);
    TEST_RUN(test_pp_split);
    TEST_RUN(test_kv_layer_range);
    TEST_RUN(test_pp_stages_in_process);
    TEST_RUN(test_shard_needs_hooks);
    return TEST_DONE();
}
