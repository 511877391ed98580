/*
 * run.c - the runner of forward passes (forward.h): fwd_run, and the
 * single-sequence helper lm_seqrun built on it.
 *
 * fwd_run checks the batch (fwd_check), sends a serving leader's plan to
 * its followers (tp_plan_send, when m->tp.lead) and runs this rank's part
 * of the pass (pp_forward: the local pass with the tensor-parallel hooks,
 * or a pipeline stage's micro-batches). seqrun_forward cuts a sequence's
 * tokens into passes of at most n_batch and runs each the same way (every
 * rank of a job in lockstep; no plan is sent). The calls go one way: this
 * file calls tp_plan.c, pp.c and forward.c; none of them calls back here.
 */
#include "model/forward.h"

#include <string.h>

#include "model/gdn.h"

#include "model/pp.h"
#include "model/tp_plan.h"
#include "base/util.h"

int fwd_run(lm_fwd *f, const int32_t *tokens, const lm_seg *segs, int n_seg, float *logits, char *err, size_t errlen) {
    int n;
    if (fwd_check(f, tokens, segs, n_seg, &n, err, errlen)) return -1;
    if (f->m->tp.lead && tp_plan_send(f, tokens, segs, n_seg, logits != NULL, err, errlen)) return -1;
    return pp_forward(f, tokens, n, segs, n_seg, logits, err, errlen);
}

/* ---- one sequence -------------------------------------------------------- */

/* The common part of every constructor: a workspace over kv and a sequence
 * in it (kv taken over when owns_kv, freed on failure too). */
static lm_seqrun *seqrun_build(const lm_model *m, lm_pool *pool, kv_pool *kv, bool owns_kv, const fwd_dims *d,
                               bool with_seq, char *err, size_t errlen) {
    lm_seqrun *r = lm_calloc(1, sizeof *r);
    if (!r) {
        if (owns_kv) kv_pool_free(kv);
        lm_err(err, errlen, "out of memory");
        return NULL;
    }
    r->kv = kv;
    r->owns_kv = owns_kv;
    r->n_ctx = d->n_ctx;
    const lm_hparams *hp = &m->hp;
    if (hp->n_rlayer) { /* the state of this stage's recurrent layers only (lm_pp.rec0 .. rec1) */
        const lm_pp *pp = &m->pp;
        size_t cf = gdn_conv_floats(hp), mf = gdn_mat_floats(hp), R = (size_t)(pp->rec1 - pp->rec0);
        r->rstate_floats = R * (cf + mf);
        r->rstate = lm_calloc(r->rstate_floats ? r->rstate_floats : 1, sizeof(float));
        r->rconv = lm_calloc((size_t)hp->n_rlayer, sizeof *r->rconv);
        r->rmat = lm_calloc((size_t)hp->n_rlayer, sizeof *r->rmat);
        if (!r->rstate || !r->rconv || !r->rmat) {
            lm_err(err, errlen, "out of memory for the recurrent state");
            seqrun_free(r);
            return NULL;
        }
        for (size_t i = 0; i < R; i++)
            r->rconv[pp->rec0 + i] = r->rstate + i * cf, r->rmat[pp->rec0 + i] = r->rstate + R * cf + i * mf;
    }
    if ((with_seq && !(r->seq = kv_seq_new(kv, err, errlen))) || !(r->fwd = fwd_new(m, pool, kv, d, err, errlen))) {
        seqrun_free(r);
        return NULL;
    }
    return r;
}

lm_seqrun *seqrun_new(const lm_model *m, lm_pool *pool, int n_ctx, int n_batch, uint32_t kv_type, char *err,
                      size_t errlen) {
    fwd_dims d = fwd_dims_make(m, n_ctx, n_batch);
    kv_config kc;
    fwd_kv_config(m, &d, &kc);
    kc.type = kv_type;
    kc.n_seqs = 1;
    kv_pool *kv = kv_pool_new(&kc, err, errlen);
    if (!kv) return NULL;
    return seqrun_build(m, pool, kv, true, &d, true, err, errlen);
}

lm_seqrun *seqrun_new_shared(const lm_model *m, lm_pool *pool, kv_pool *kv, int n_ctx, int n_batch, char *err,
                             size_t errlen) {
    fwd_dims d = fwd_dims_make(m, n_ctx, n_batch);
    return seqrun_build(m, pool, kv, false, &d, true, err, errlen);
}

lm_seqrun *seqrun_fork(const lm_seqrun *src, char *err, size_t errlen) {
    lm_seqrun *r = seqrun_build(src->fwd->m, src->fwd->pool, src->kv, false, &src->fwd->dims, false, err, errlen);
    if (!r) return NULL;
    if (!(r->seq = kv_fork(r->kv, src->seq, err, errlen))) {
        seqrun_free(r);
        return NULL;
    }
    r->n_past = src->n_past;
    if (src->rstate_floats) memcpy(r->rstate, src->rstate, src->rstate_floats * sizeof(float));
    return r;
}

void seqrun_free(lm_seqrun *r) {
    if (!r) return;
    fwd_free(r->fwd);
    if (r->owns_kv) kv_pool_free(r->kv); /* frees r->seq too */
    else if (r->seq) kv_seq_free(r->kv, r->seq);
    lm_free(r->rstate);
    lm_free(r->rconv);
    lm_free(r->rmat);
    lm_free(r);
}

void seqrun_reset(lm_seqrun *r) {
    kv_truncate(r->kv, r->seq, 0, NULL, 0);
    r->n_past = 0;
    if (r->rstate_floats) memset(r->rstate, 0, r->rstate_floats * sizeof(float));
}

int seqrun_prefix_match(lm_seqrun *r, const int32_t *tokens, int n, uint64_t salt) {
    if (r->n_past != 0 || r->fwd->m->hp.n_rlayer) return 0;
    if (n > r->n_ctx) n = r->n_ctx;
    r->n_past = kv_prefix_match(r->kv, r->seq, tokens, n, salt);
    return r->n_past;
}

void seqrun_prefix_commit(lm_seqrun *r, const int32_t *tokens, uint64_t salt) {
    kv_prefix_commit(r->kv, r->seq, tokens, r->n_past, salt);
}

int seqrun_forward(lm_seqrun *r, const int32_t *tokens, int n, float *logits, bool all_logits, char *err,
                   size_t errlen) {
    lm_fwd *f = r->fwd;
    const lm_hparams *hp = &f->m->hp;
    const int n_batch = f->dims.n_batch;
    if (n <= 0) return lm_err(err, errlen, "no tokens to process");
    if (n > r->n_ctx - r->n_past)
        return lm_err(err, errlen, "context is full: %d positions used of %d, %d more requested", r->n_past, r->n_ctx,
                      n);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
            return lm_err(err, errlen, "token id %d is out of range [0, %d)", tokens[i], hp->n_vocab);
    for (int done = 0; done < n;) {
        int b = n - done < n_batch ? n - done : n_batch;
        bool last = done + b == n;
        float *out = NULL;
        if (logits && all_logits) out = logits + (size_t)done * hp->n_vocab;
        else if (logits && last) out = logits;
        /* positions n_past .. n_past+b-1 get cache slots before the pass writes them */
        if (kv_append(r->kv, r->seq, b, err, errlen) != KV_OK) return -1;
        lm_seg seg = {.seq = r->seq,
                      .pos0 = r->n_past,
                      .n = b,
                      .n_logits = !out ? 0
                          : all_logits ? b
                                       : 1,
                      .rconv = r->rconv,
                      .rmat = r->rmat};
        if (pp_forward(f, tokens + done, b, &seg, 1, out, err, errlen)) return -1;
        r->n_past += b;
        done += b;
    }
    return 0;
}
