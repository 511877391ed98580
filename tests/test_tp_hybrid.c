/*
 * test_tp_hybrid.c - tensor and pipeline parallelism of a hybrid model
 * (model/shard.c, model/gdn.c, model/pp.c) in one process, without MPI.
 *
 * The file is mkmodel's qwen35-small (F16; written by $LAMINA_BIN mkmodel
 * into a temporary folder): 8 layers, gated-DeltaNet layers of 2 key heads
 * and 4 value heads of 64 (value head h reads key head h % 2) and gated
 * attention layers of 4 heads, 2 KV heads.
 *
 * Tensor parallel: the whole model and its two shards. Each shard holds 1
 * key head and 2 value heads (hp), so its state is half the whole's. The
 * two shards run the same pass on two threads whose hooks sum the partial
 * products in rank order and gather the vocabulary slices, as dist.h does
 * across processes: a 70-token prompt (a full chunk of 64, then 6) and
 * three single-token steps (the recurrence) give the whole model's logits
 * within 1e-4 (max |difference|; the logits are of the order of 4, and the
 * split sums round differently: measured 6e-6, F32 KV), both ranks the
 * same bits. A shard that took the value heads as one range (heads 2r and
 * 2r + 1, reading the wrong key head) is off by far more.
 *
 * Pipeline: two stages side by side, stage 0's residual stream copied into
 * stage 1's, the prompt cut into micro-batches on multiples of 64
 * positions as pp.c cuts a hybrid's: bit for bit the whole model's logits;
 * each stage's state holds its own recurrent layers only.
 *
 * The split of 2 stages under 2 ranks keeps a full-attention layer in each,
 * and each rank keeps the slices of its stage's recurrent layers only.
 * Refusals: 4 ranks (2 key heads), 4 stages (2 full-attention layers).
 */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "test.h"
#include "tp_threads.h"
#include "model/forward.h"
#include "model/gdn.h"
#include "model/model.h"
#include "kernels/kernels.h"
#include "base/util.h"

static char path[256];
static lm_model *whole;

enum { N_PROMPT = 70, N_STEP = 3, N_TOK = N_PROMPT + N_STEP, CTX = 256 };

static void tokens(int32_t *tok, int n) {
    for (int i = 0; i < n; i++) tok[i] = 1 + (i * 7919) % 31000;
}

/* The prompt as one pass, then each step as one: a rank's passes over its
 * shard (the same calls on both ranks, as under mpirun). */
static int run_passes(lm_model *m, const fwd_hooks *hk, float *logits, char *err, size_t errlen) {
    int32_t tok[N_TOK];
    tokens(tok, N_TOK);
    lm_seqrun *r = seqrun_new(m, NULL, CTX, 128, LM_TYPE_F32, err, errlen);
    if (!r) return -1;
    fwd_span sp = fwd_span_stage(m, hk);
    const size_t V = (size_t)whole->hp.n_vocab;
    int rc = 0;
    for (int p0 = 0; p0 < N_TOK && !rc; p0 += p0 ? 1 : N_PROMPT) {
        int n = p0 ? 1 : N_PROMPT;
        lm_seg g = {.seq = r->seq, .pos0 = p0, .n = n, .n_logits = n, .rconv = r->rconv, .rmat = r->rmat};
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

static void test_tp_shards(void) {
    char err[LM_ERRLEN];
    lm_model *s[2] = {load(0, 2, 0, 1, err, sizeof err), load(1, 2, 0, 1, err, sizeof err)};
    CHECKF(s[0] && s[1], "%s", err);
    if (!s[0] || !s[1]) return;
    const lm_hparams *hw = &whole->hp;
    for (int r = 0; r < 2; r++) {
        const lm_hparams *h = &s[r]->hp;
        CHECK(h->ssm_hk == 1 && h->ssm_hv == 2 && s[r]->tp.ssm_hk == 2 && s[r]->tp.ssm_hv == 4);
        CHECK(s[r]->tp.ssm_k0 == r && h->n_head == 2 && s[r]->shard_mem != NULL);
        CHECK(2 * gdn_mat_floats(h) == gdn_mat_floats(hw) && 2 * gdn_conv_floats(h) == gdn_conv_floats(hw));
    }
    const size_t V = (size_t)hw->n_vocab, L = (size_t)N_TOK * V;
    float *want = malloc(L * sizeof(float)), *got[2] = {malloc(L * sizeof(float)), malloc(L * sizeof(float))};
    CHECK(want && got[0] && got[1]);
    CHECKF(run_passes(whole, NULL, want, err, sizeof err) == 0, "%s", err);
    CHECKF(tp_threads_run(run_passes, s, got, 2, L, err, sizeof err) == 0, "%s", err);
    double d = 0, top = 0;
    for (size_t i = 0; i < L; i++) {
        d = fmax(d, fabs((double)got[0][i] - want[i]));
        top = fmax(top, fabs((double)want[i]));
    }
    fprintf(stderr, "  tp 2: max |logit difference| %.3g (logits up to %.3g)\n", d, top);
    CHECKF(top > 0.5 && d <= 1e-4, "max difference %g, largest logit %g", d, top);
    CHECKF(!memcmp(got[0], got[1], L * sizeof(float)), "the ranks' logits differ");
    free(want);
    free(got[0]);
    free(got[1]);
    model_free(s[0]);
    model_free(s[1]);
}

/* ---- two pipeline stages --------------------------------------------------- */

static void test_pp_stages(void) {
    char err[LM_ERRLEN];
    lm_model *s0 = load(0, 1, 0, 2, err, sizeof err), *s1 = load(0, 1, 1, 2, err, sizeof err);
    CHECKF(s0 && s1, "%s", err);
    if (!s0 || !s1) return;
    const lm_pp *p0 = &s0->pp, *p1 = &s1->pp;
    CHECK(p0->layer1 == p1->layer0 && p0->rec0 == 0 && p0->rec1 == p1->rec0 && p1->rec1 == whole->hp.n_rlayer);
    CHECK(p0->kv0 == 0 && p0->kv1 == p1->kv0 && p1->kv1 == whole->hp.n_layer - whole->hp.n_rlayer);
    CHECK(p0->kv1 > p0->kv0 && p1->kv1 > p1->kv0 && p0->rec1 > p0->rec0 && p1->rec1 > p1->rec0);
    enum { N = 130 };
    int32_t tok[N];
    tokens(tok, N);
    const size_t V = (size_t)whole->hp.n_vocab, E = (size_t)whole->hp.n_embd;
    float *want = malloc((size_t)N * V * sizeof(float)), *got = malloc((size_t)N * V * sizeof(float));
    lm_seqrun *rw = seqrun_new(whole, NULL, CTX, 128, LM_TYPE_F16, err, sizeof err);
    lm_seqrun *r0 = seqrun_new(s0, NULL, CTX, 128, LM_TYPE_F16, err, sizeof err);
    lm_seqrun *r1 = seqrun_new(s1, NULL, CTX, 128, LM_TYPE_F16, err, sizeof err);
    CHECK(want && got && rw && r0 && r1);
    /* each stage's state: its own recurrent layers */
    CHECK(r0->rstate_floats + r1->rstate_floats == rw->rstate_floats && r0->rstate_floats > 0);
    CHECK(r0->rconv[p0->rec0] && !r0->rconv[p1->rec0] && r1->rconv[p1->rec0] && !r1->rconv[0]);
    CHECKF(seqrun_forward(rw, tok, 64, want, true, err, sizeof err) == 0 &&
               seqrun_forward(rw, tok + 64, N - 64, want + 64 * V, true, err, sizeof err) == 0,
           "%s", err);
    CHECK(kv_append(r0->kv, r0->seq, N, err, sizeof err) == KV_OK &&
          kv_append(r1->kv, r1->seq, N, err, sizeof err) == KV_OK);
    fwd_span sp0 = fwd_span_stage(s0, NULL), sp1 = fwd_span_stage(s1, NULL);
    const int cuts[] = {0, 64, 128, N}; /* micro-batches on the delta rule's grid (pp.c) */
    for (int c = 0; c < 3; c++) {
        int a = cuts[c], n = cuts[c + 1] - a;
        lm_seg g0 = {.seq = r0->seq, .pos0 = a, .n = n, .n_logits = n, .rconv = r0->rconv, .rmat = r0->rmat};
        lm_seg g1 = {.seq = r1->seq, .pos0 = a, .n = n, .n_logits = n, .rconv = r1->rconv, .rmat = r1->rmat};
        CHECKF(fwd_pass(r0->fwd, &sp0, tok + a, n, &g0, 1, NULL, err, sizeof err) == 0, "%s", err);
        memcpy(r1->fwd->x, r0->fwd->x, (size_t)n * E * sizeof(float));
        CHECKF(fwd_pass(r1->fwd, &sp1, tok + a, n, &g1, 1, got + (size_t)a * V, err, sizeof err) == 0, "%s", err);
    }
    CHECKF(!memcmp(got, want, (size_t)N * V * sizeof(float)), "pipelined logits differ from the whole model's");
    seqrun_free(rw);
    seqrun_free(r0);
    seqrun_free(r1);
    free(want);
    free(got);
    model_free(s0);
    model_free(s1);
}

/* Under --tp 2 the embedding (replicated) outweighs the LM head (split):
 * the byte-balanced split would give stage 0 layer 0 alone, all linear
 * attention; each stage keeps a full-attention layer instead. */
static void test_pp_split_anchors(void) {
    char err[LM_ERRLEN];
    lm_model *m = load(0, 2, 0, 2, err, sizeof err);
    CHECKF(m, "%s", err);
    if (!m) return;
    const lm_pp *pp = &m->pp;
    CHECKF(pp->first[1] == 4 && pp->kv1 - pp->kv0 == 1 && pp->rec1 - pp->rec0 == 3, "stage 0: layers %d..%d",
           pp->first[0], pp->first[1] - 1);
    /* the rank keeps the gathered slices of its stage's recurrent layers only: half of the rank's whole */
    lm_model *t = load(0, 2, 0, 1, err, sizeof err), *m1 = load(0, 2, 1, 2, err, sizeof err);
    CHECKF(t && m1, "%s", err);
    if (t && m1) {
        CHECKF(m->shard_bytes + m1->shard_bytes == t->shard_bytes && m->shard_bytes == t->shard_bytes / 2,
               "stage slices %zu + %zu bytes, the rank's whole %zu", m->shard_bytes, m1->shard_bytes, t->shard_bytes);
        CHECK(m->layers[0].gdn->qkv.data && !m->layers[4].gdn->qkv.data);
        CHECK(!m1->layers[0].gdn->out.data && m1->layers[4].gdn->out.data && m1->layers[4].gdn->a);
    }
    model_free(t);
    model_free(m1);
    model_free(m);
}

static void test_refusals(void) {
    char err[LM_ERRLEN] = "";
    lm_model *m = load(0, 4, 0, 1, err, sizeof err);
    CHECKF(!m && strstr(err, "2 key heads of the linear-attention layers do not split over 4 ranks"), "%s", err);
    model_free(m);
    m = load(0, 1, 0, 4, err, sizeof err);
    CHECKF(!m && strstr(err, "into 4 stages each holding a full-attention layer"), "%s", err);
    model_free(m);
}

int main(void) {
    kernels_init();
    const char *bin = getenv("LAMINA_BIN") ? getenv("LAMINA_BIN") : "build/lamina";
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(path, sizeof path, "%s/test_tp_hybrid_%d.gguf", dir, (int)getpid());
    char cmd[1024], err[LM_ERRLEN];
    snprintf(cmd, sizeof cmd,
             "%s mkmodel --preset qwen35-small --type F16 --vocab-from tests/data/vocab/ggml-vocab-llama-spm.gguf "
             "-o %s -t 2 >/dev/null",
             bin, path);
    if (system(cmd) != 0 || !(whole = model_load(path, err, sizeof err))) {
        fprintf(stderr, "cannot write or load the qwen35-small file (%s): %s\n", cmd, whole ? "" : err);
        unlink(path);
        return 1;
    }
    TEST_RUN(test_tp_shards);
    TEST_RUN(test_pp_stages);
    TEST_RUN(test_pp_split_anchors);
    TEST_RUN(test_refusals);
    model_free(whole);
    unlink(path);
    return TEST_DONE();
}
