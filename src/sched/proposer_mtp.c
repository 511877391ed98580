/*
 * proposer_mtp.c - the next-token-prediction head as a proposer
 * (LM_SPEC_MTP, proposer.h): a qwen35 file's MTP layer (model/mtp.h)
 * guesses from the target's own states.
 *
 * Per running sequence a slot: an MTP head with its own cache of n_ctx
 * positions, `filled` (the positions it has caught up on, always a prefix
 * 0 .. filled - 1 of the sequence) and `last`, the target's state at
 * filled - 1. The engine hands the target's states of every settled
 * segment (spec_prop_hidden): token p is paired with the state at p - 1
 * (zeros at 0) and run through the head at p, so the head's cache follows
 * the sequence. A wish on a sequence of n tokens whose head has caught up
 * on n - 1 positions runs the head from the last token and `last`, then on
 * each draft with the head's own output state, k times (greedy: the
 * argmax; llama.cpp and DeepSeek chain theirs the same way). Rows written
 * for drafts past the settled positions are written again when the
 * verified ones arrive.
 *
 * A segment that does not start where the head stopped (a fork that took
 * its prompt from another choice, a prefix-cache hit) leaves the head
 * behind: it proposes nothing until the sequence starts again from
 * position 0 (after a preemption). There are max_seqs slots; a sequence
 * takes a free one at its first segment from position 0 and gives it back
 * when it leaves the running set. A slot's head (its cache: 2 x n_ctx x
 * kv_dim floats) is made the first time the slot is taken and kept, so at
 * most max_seqs are ever made, as many as sequences ran at once; a head
 * that cannot be made leaves the sequence without guesses. That memory is
 * not in the engine's --mem plan.
 */
#include <string.h>

#include "model/mtp.h"
#include "sched/proposer.h"
#include "base/util.h"

struct mtp_slot {
    mtp_head *head;
    int filled;  /* positions caught up on; -1: behind (a segment skipped positions) */
    float *last; /* (n_embd) the target's state at filled - 1 (zeros at filled 0) */
    float *hout; /* (n_embd) the head's own state after a draft */
    bool used;
};

struct mtp_prop {
    const lm_model *m;
    lm_pool *pool;          /* not owned */
    struct mtp_slot *slots; /* (max_seqs) */
    int n_slots, n_ctx;
    float *hid;    /* (n_batch, n_embd) the target pass's states (lm_fwd.hid) */
    float *logits; /* (n_vocab) */
};

static void mtp_release(spec_proposer *p, spec_pseq *s) {
    (void)p;
    if (s->mtp) s->mtp->used = false;
    s->mtp = NULL;
}

static void mtp_hidden(spec_proposer *p, spec_pseq *s, const int32_t *toks, int pos0, const float *h, int n) {
    struct mtp_prop *mp = p->mtp;
    const int E = mp->m->hp.n_embd;
    if (!s->mtp && pos0 == 0)
        for (int i = 0; i < mp->n_slots && !s->mtp; i++) {
            struct mtp_slot *f = &mp->slots[i];
            if (f->used) continue;
            if (!f->head && !(f->head = mtp_new(mp->m, mp->pool, mp->n_ctx, NULL, NULL, 0))) return;
            s->mtp = f, f->used = true;
        }
    struct mtp_slot *t = s->mtp;
    if (!t || n <= 0) return;
    if (pos0 == 0) {
        t->filled = 0;
        memset(t->last, 0, (size_t)E * sizeof *t->last);
    }
    if (t->filled != pos0 || pos0 + n > mp->n_ctx) {
        t->filled = -1;
        return;
    }
    for (int r = 0; r < n; r++) { /* token pos0 + r with the state at pos0 + r - 1 */
        if (mtp_run(t->head, r ? h + (size_t)(r - 1) * E : t->last, toks + pos0 + r, 1, pos0 + r, NULL, NULL, NULL,
                    0)) {
            t->filled = -1;
            return;
        }
    }
    memcpy(t->last, h + (size_t)(n - 1) * E, (size_t)E * sizeof *t->last);
    t->filled = pos0 + n;
}

static void mtp_propose(spec_proposer *p, spec_job *jobs, int n_jobs) {
    struct mtp_prop *mp = p->mtp;
    const int V = mp->m->hp.n_vocab;
    for (int j = 0; j < n_jobs; j++) {
        spec_job *jb = &jobs[j];
        struct mtp_slot *t = jb->s->mtp;
        jb->n_out = 0;
        jb->s->base = jb->n_toks;
        int L = jb->n_toks - 1; /* the last token's position: the target has not run it yet */
        if (!t || t->filled != L || L < 1) continue;
        int k = jb->k < jb->s->cap ? jb->k : jb->s->cap;
        if (k > mp->n_ctx - L) k = mp->n_ctx - L;
        const float *h = t->last;
        int32_t tok = jb->toks[L];
        for (int i = 0; i < k; i++) { /* the chain: each draft fed back with the head's own state */
            if (mtp_run(t->head, h, &tok, 1, L + i, mp->logits, t->hout, NULL, 0)) break;
            tok = mtp_argmax(mp->logits, V);
            jb->s->guess[jb->n_out++] = tok;
            h = t->hout;
        }
    }
}

static void mtp_destroy(spec_proposer *p) {
    struct mtp_prop *mp = p->mtp;
    if (mp) {
        for (int i = 0; mp->slots && i < mp->n_slots; i++) {
            mtp_free(mp->slots[i].head);
            lm_free(mp->slots[i].last);
            lm_free(mp->slots[i].hout);
        }
        lm_free(mp->slots);
        lm_free(mp->hid);
        lm_free(mp->logits);
        lm_free(mp);
    }
    lm_free(p);
}

static const spec_proposer_ops mtp_ops = {.name = "mtp",
                                          .early = true,
                                          .seq_release = mtp_release,
                                          .propose = mtp_propose,
                                          .free = mtp_destroy,
                                          .hidden = mtp_hidden};

spec_proposer *spec_prop_mtp(const lm_model *m, lm_pool *pool, int n_ctx, int n_batch, int max_seqs, char *err,
                             size_t errlen) {
    spec_proposer *p = lm_calloc(1, sizeof *p);
    struct mtp_prop *mp = lm_calloc(1, sizeof *mp);
    if (!p || !mp) {
        lm_free(p), lm_free(mp);
        lm_err(err, errlen, "out of memory");
        return NULL;
    }
    p->ops = &mtp_ops;
    p->mtp = mp;
    mp->m = m;
    mp->pool = pool;
    mp->n_slots = max_seqs;
    mp->n_ctx = n_ctx;
    const size_t E = (size_t)m->hp.n_embd;
    mp->slots = lm_calloc((size_t)max_seqs, sizeof *mp->slots);
    mp->hid = lm_malloc((size_t)n_batch * E * sizeof *mp->hid);
    mp->logits = lm_malloc((size_t)m->hp.n_vocab * sizeof *mp->logits);
    if (!mp->slots || !mp->hid || !mp->logits) {
        mtp_destroy(p);
        lm_err(err, errlen, "out of memory");
        return NULL;
    }
    /* the first slot's head now: a model the head cannot run is refused at the start */
    if (!(mp->slots[0].head = mtp_new(m, pool, n_ctx, NULL, err, errlen))) {
        mtp_destroy(p);
        return NULL;
    }
    for (int i = 0; i < max_seqs; i++) {
        struct mtp_slot *t = &mp->slots[i];
        t->last = lm_calloc(E, sizeof *t->last);
        t->hout = lm_malloc(E * sizeof *t->hout);
        if (!t->last || !t->hout) {
            mtp_destroy(p);
            lm_err(err, errlen, "out of memory");
            return NULL;
        }
    }
    return p;
}

float *spec_prop_hid(const spec_proposer *p) { return p && p->mtp ? p->mtp->hid : NULL; }
