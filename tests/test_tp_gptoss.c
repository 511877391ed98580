/*
 * test_tp_gptoss.c - tensor and pipeline parallelism of gpt-oss
 * (model/shard.c, model/moe.c, model/forward.c) in one process, without MPI.
 *
 * The files are mkmodel's gpt-oss-small (F16, the experts F16 and then
 * MXFP4; written by $LAMINA_BIN mkmodel into a temporary folder): 4 layers, 8 query heads of 64 with their sinks
 * and 2 KV heads, with biases, a window of 128 on layers 0 and 2, 32
 * experts of 256 (top 4) with the router's and the three products' biases,
 * the output bias.
 *
 * Tensor parallel, 2 and 4 ranks (4: each KV head held by 2 ranks): the
 * shards run the same passes on as many threads, whose hooks sum the
 * partial products in rank order and gather the vocabulary slices as dist.h
 * does across processes. A 200-token prompt (past the window) and three
 * single-token steps give the whole model's logits within 1e-3 with F16
 * experts (max |difference|, logits of about 5; the split sums round
 * differently), 0.15 with MXFP4 experts (main() says why), every rank the
 * same bits. What each rank must slice and what it must not:
 * Q/K/V biases and sinks by head, each expert's gate and up bias rows by
 * its rows; the router's bias whole, the output bias added once after the
 * sum, the experts' down bias on rank 0 only. A shard that added the down
 * or output bias on every rank, or took another rank's bias rows, is off
 * by far more (the biases are of 0.1), and so is one that took the first
 * rank's sinks on every rank (they are of 1).
 *
 * Pipeline: two stages side by side, stage 0's residual stream copied into
 * stage 1's, the prompt cut into micro-batches: bit for bit the whole
 * model's logits.
 */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "test.h"
#include "tp_threads.h"
#include "model/forward.h"
#include "model/model.h"
#include "kernels/kernels.h"
#include "base/util.h"

static char path[256];  /* the file under test */
static lm_model *whole; /* it, whole */
static double tp_tol;   /* max |logit difference| of its shards */

enum { N_PROMPT = 200, N_STEP = 3, N_TOK = N_PROMPT + N_STEP, CTX = 512, MAX_RANKS = 4 };

static void tokens(int32_t *tok, int n) {
    for (int i = 0; i < n; i++) tok[i] = 1 + (i * 7919) % 50000;
}

/* The prompt as one pass, then each step as one (the same calls on every
 * rank, as under mpirun). */
static int run_passes(lm_model *m, const fwd_hooks *hk, float *logits, char *err, size_t errlen) {
    int32_t tok[N_TOK];
    tokens(tok, N_TOK);
    lm_seqrun *r = seqrun_new(m, NULL, CTX, 256, LM_TYPE_F32, err, errlen);
    if (!r) return -1;
    fwd_span sp = fwd_span_stage(m, hk);
    const size_t V = (size_t)whole->hp.n_vocab;
    int rc = 0;
    for (int p0 = 0; p0 < N_TOK && !rc; p0 += p0 ? 1 : N_PROMPT) {
        int n = p0 ? 1 : N_PROMPT;
        lm_seg g = {.seq = r->seq, .pos0 = p0, .n = n, .n_logits = n};
        rc = kv_append(r->kv, r->seq, n, err, errlen) != KV_OK ||
            fwd_pass(r->fwd, &sp, tok + p0, n, &g, 1, logits + (size_t)p0 * V, err, errlen);
    }
    seqrun_free(r);
    return rc ? -1 : 0;
}

static lm_model *load(int rank, int size, int stage, int stages, char *err, size_t errlen) {
    lm_status st;
    return model_load_grid(path, NULL, rank, size, stage, stages, &st, err, errlen);
}

static void check_tp(int size) {
    char err[LM_ERRLEN] = "";
    lm_model *s[MAX_RANKS] = {0};
    bool ok = true;
    for (int r = 0; r < size; r++) ok = (s[r] = load(r, size, 0, 1, err, sizeof err)) != NULL && ok;
    CHECKF(ok, "%s", err);
    const lm_hparams *hw = &whole->hp;
    const size_t V = (size_t)hw->n_vocab, L = (size_t)N_TOK * V;
    float *want = malloc(L * sizeof(float)), *got[MAX_RANKS] = {0};
    for (int r = 0; r < size; r++) ok = (got[r] = malloc(L * sizeof(float))) != NULL && ok;
    CHECK(ok && want);
    if (!ok || !want) goto done;
    for (int r = 0; r < size; r++) { /* what each rank holds (values: each model has its own vectors) */
        const lm_hparams *h = &s[r]->hp;
        const lm_layer *l = &s[r]->layers[0], *lw = &whole->layers[0];
        const int hd = h->head_dim, kv0 = s[r]->tp.kv_head0, F = h->n_ff_exp, FW = hw->n_ff_exp;
        CHECK(h->n_head == hw->n_head / size && F == FW / size && l->moe->b_stride == FW);
        CHECK(l->sinks[0] == lw->sinks[r * h->n_head] && l->sinks[h->n_head - 1] == lw->sinks[(r + 1) * h->n_head - 1]);
        CHECK(l->bq[0] == lw->bq[r * h->n_head * hd] && l->bk[hd - 1] == lw->bk[(kv0 + 1) * hd - 1]);
        CHECK(!memcmp(l->bo, lw->bo, (size_t)hw->n_embd * sizeof(float)));
        CHECK(!memcmp(l->moe->gate_inp_b, lw->moe->gate_inp_b, (size_t)hw->n_expert * sizeof(float)));
        CHECK(l->moe->gate_b[5 * FW] == lw->moe->gate_b[5 * FW + r * F] &&
              l->moe->up_b[F - 1] == lw->moe->up_b[(r + 1) * F - 1]);
        CHECK(l->moe->down_b[7] == lw->moe->down_b[7]);
    }
    CHECKF(run_passes(whole, NULL, want, err, sizeof err) == 0, "%s", err);
    CHECKF(tp_threads_run(run_passes, s, got, size, L, err, sizeof err) == 0, "%s", err);
    double d = 0, top = 0;
    for (size_t i = 0; i < L; i++) {
        d = fmax(d, fabs((double)got[0][i] - want[i]));
        top = fmax(top, fabs((double)want[i]));
    }
    fprintf(stderr, "  tp %d: max |logit difference| %.3g (logits up to %.3g)\n", size, d, top);
    CHECKF(top > 0.5 && d <= tp_tol, "max difference %g, largest logit %g (tolerance %g)", d, top, tp_tol);
    for (int r = 1; r < size; r++) CHECKF(!memcmp(got[0], got[r], L * sizeof(float)), "rank %d's logits differ", r);
done:
    free(want);
    for (int r = 0; r < size; r++) free(got[r]), model_free(s[r]);
}

static void test_tp_2(void) { check_tp(2); }
static void test_tp_4(void) { check_tp(4); }

/* ---- two pipeline stages --------------------------------------------------- */

static void test_pp_stages(void) {
    char err[LM_ERRLEN];
    lm_model *s0 = load(0, 1, 0, 2, err, sizeof err), *s1 = load(0, 1, 1, 2, err, sizeof err);
    CHECKF(s0 && s1, "%s", err);
    if (!s0 || !s1) {
        model_free(s0);
        model_free(s1);
        return;
    }
    CHECK(s0->pp.layer1 == s1->pp.layer0 && s0->pp.layer1 > 0 && s1->pp.layer1 == whole->hp.n_layer);
    enum { N = 200 };
    int32_t tok[N];
    tokens(tok, N);
    const size_t V = (size_t)whole->hp.n_vocab, E = (size_t)whole->hp.n_embd;
    float *want = malloc((size_t)N * V * sizeof(float)), *got = malloc((size_t)N * V * sizeof(float));
    lm_seqrun *rw = seqrun_new(whole, NULL, CTX, 256, LM_TYPE_F16, err, sizeof err);
    lm_seqrun *r0 = seqrun_new(s0, NULL, CTX, 256, LM_TYPE_F16, err, sizeof err);
    lm_seqrun *r1 = seqrun_new(s1, NULL, CTX, 256, LM_TYPE_F16, err, sizeof err);
    CHECK(want && got && rw && r0 && r1);
    if (want && got && rw && r0 && r1) {
        CHECKF(seqrun_forward(rw, tok, N, want, true, err, sizeof err) == 0, "%s", err);
        CHECK(kv_append(r0->kv, r0->seq, N, err, sizeof err) == KV_OK &&
              kv_append(r1->kv, r1->seq, N, err, sizeof err) == KV_OK);
        fwd_span sp0 = fwd_span_stage(s0, NULL), sp1 = fwd_span_stage(s1, NULL);
        const int cuts[] = {0, 64, 150, N}; /* micro-batches, the second past the window */
        for (int c = 0; c < 3; c++) {
            int a = cuts[c], n = cuts[c + 1] - a;
            lm_seg g0 = {.seq = r0->seq, .pos0 = a, .n = n, .n_logits = n};
            lm_seg g1 = {.seq = r1->seq, .pos0 = a, .n = n, .n_logits = n};
            CHECKF(fwd_pass(r0->fwd, &sp0, tok + a, n, &g0, 1, NULL, err, sizeof err) == 0, "%s", err);
            memcpy(r1->fwd->x, r0->fwd->x, (size_t)n * E * sizeof(float));
            CHECKF(fwd_pass(r1->fwd, &sp1, tok + a, n, &g1, 1, got + (size_t)a * V, err, sizeof err) == 0, "%s", err);
        }
        CHECKF(!memcmp(got, want, (size_t)N * V * sizeof(float)), "pipelined logits differ from the whole model's");
    }
    seqrun_free(rw);
    seqrun_free(r0);
    seqrun_free(r1);
    free(want);
    free(got);
    model_free(s0);
    model_free(s1);
}

static void test_refusals(void) {
    char err[LM_ERRLEN] = "";
    lm_model *m = load(0, 3, 0, 1, err, sizeof err);
    CHECKF(!m && strstr(err, "8 attention heads do not split over 3 ranks"), "%s", err);
    model_free(m);
}

/* Write mkmodel's gpt-oss-small with the experts in xtype into path and
 * load it whole; -1 when that fails. */
static int open_file(const char *xtype) {
    const char *bin = getenv("LAMINA_BIN") ? getenv("LAMINA_BIN") : "build/lamina";
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(path, sizeof path, "%s/test_tp_gptoss_%d_%s.gguf", dir, (int)getpid(), xtype);
    char cmd[1024], err[LM_ERRLEN];
    snprintf(cmd, sizeof cmd,
             "%s mkmodel --preset gpt-oss-small --type F16 --expert-type %s --vocab-from "
             "tests/data/vocab/ggml-vocab-gpt-2.gguf -o %s -t 2 >/dev/null",
             bin, xtype, path);
    if (system(cmd) != 0 || !(whole = model_load(path, err, sizeof err))) {
        fprintf(stderr, "cannot write or load the gpt-oss-small file (%s): %s\n", cmd, whole ? "" : err);
        unlink(path);
        return -1;
    }
    fprintf(stderr, "experts in %s\n", xtype);
    return 0;
}

int main(void) {
    kernels_init();
    /* F16 experts: the split sums' rounding alone (measured 2e-5) */
    if (open_file("F16")) return 1;
    tp_tol = 1e-3;
    TEST_RUN(test_tp_2);
    TEST_RUN(test_tp_4);
    TEST_RUN(test_pp_stages);
    TEST_RUN(test_refusals);
    model_free(whole);
    unlink(path);
    /* MXFP4 experts, as the released files: their products take 8-bit activations, whose
     * quantization steps turn the split sums' last-bit differences into steps, and a router's
     * near-tie can then choose another expert: measured 0.016 under 4 ranks, 0.098 under 2 (rows 0
     * to 18 within 0.01, the later ones 0.01 to 0.1 apart: an expert choice of token 18 flipped,
     * which the later rows see through attention); the bound is e2e_mpi.sh's for the quantized
     * MoE files, 0.15. A wrongly sliced bias or expert moves logits by 1 or more from row 0. */
    if (open_file("MXFP4")) return 1;
    tp_tol = 0.15;
    TEST_RUN(test_tp_2);
    TEST_RUN(test_tp_4);
    TEST_RUN(test_pp_stages);
    model_free(whole);
    unlink(path);
    return TEST_DONE();
}
