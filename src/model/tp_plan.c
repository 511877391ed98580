/*
 * tp_plan.c - the batch plan a serving leader broadcasts and its followers
 * execute (tp_plan.h).
 *
 * Each message is a header of 8 int32 (kind, n_seg, n_tok, n_copies,
 * logits wanted, payload words, n_rops) then, for a pass, one int32
 * payload:
 *   tokens (n_tok);
 *   per segment: pos0, n, n_logits, len, n_blocks, n_dropped, its state
 *   slot (-1: none), checkpoints (1: a verification segment) (8 each);
 *   per segment and KV class: its block table (n_blocks each);
 *   the block copies the leader's pool made since the last pass (cls, src,
 *   dst each), repeated first;
 *   a hybrid model's recurrent-state operations since the last pass
 *   (rstate_op, 12 words each), replayed in order.
 * The setup message (first pass) carries the leader's kv_config and
 * fwd_dims instead, so the follower's pool has the same plan and the block
 * numbers mean the same blocks; layer_local and, under pipeline
 * parallelism, the stage's layer range come from the follower's own model
 * (the plan's block counts are the whole model's on every stage, kv.h).
 * With recurrent layers it also carries the counts of the leader's state
 * store (live, checkpoint and snapshot slots): the follower makes its own
 * store of those counts over its own part of every slot (its stage's
 * recurrent layers, its heads), and replays the leader's operations
 * (rstate.h's log) on it before each pass, so the slot indices in the
 * segments name the same sequences' states on every rank (the replay
 * checks every index it is handed).
 * The follower mirrors each segment's tables into sequences of its own
 * pool (kv_seq_mirror: no references, no bookkeeping) and runs what
 * fwd_run runs after the plan is sent (fwd_check, then this rank's part:
 * pp_forward), whose collectives then pair with the leader's. The header is received by
 * polling (dist_bcast_idle), so an idle follower sleeps.
 */
#include "model/tp_plan.h"

#include <string.h>

#include "model/pp.h"

#include "dist/dist.h"
#include "base/util.h"

enum { TP_STOP = 0, TP_SETUP = 1, TP_RUN = 2 };
#define TP_HDR 8
#define TP_META 8                                          /* words per segment */
#define TP_OP ((int)(sizeof(rstate_op) / sizeof(int32_t))) /* words per state operation */
_Static_assert(sizeof(rstate_op) % sizeof(int32_t) == 0, "a state operation is whole int32 words");

typedef struct {
    kv_config kc; /* layer_local NULL on the wire */
    fwd_dims dims;
    int32_t rs_seqs, rs_ckpt, rs_snap; /* the leader's state store's slot counts; 0 live: none */
} tp_setup;

static bool g_sent_setup;
static rstate_pool *g_rs; /* the leader's state store (tp_plan_state), not owned */
static kv_copy g_copies[KV_COPY_LOG];
static int32_t *g_buf; /* (g_cap) payload words */
static size_t g_cap;

static int grow(size_t n, char *err, size_t errlen) {
    if (n <= g_cap) return 0;
    size_t cap = g_cap ? g_cap : 1024;
    while (cap < n) cap *= 2;
    int32_t *p = lm_realloc(g_buf, cap * sizeof *p);
    if (!p) return lm_err(err, errlen, "out of memory for a batch plan of %zu words", n);
    g_buf = p;
    g_cap = cap;
    return 0;
}

void tp_plan_state(rstate_pool *rs) {
    g_rs = rs;
    if (rs) rstate_log_start(rs);
}

static int send_header(int kind, int n_seg, int n_tok, int n_copies, int logits, size_t words, int n_rops, char *err,
                       size_t errlen) {
    int32_t h[TP_HDR] = {kind, n_seg, n_tok, n_copies, logits, (int32_t)words, n_rops, 0};
    return dist_bcast_idle(h, sizeof h, 0, err, errlen);
}

int tp_plan_send(lm_fwd *f, const int32_t *tokens, const lm_seg *segs, int n_seg, bool logits, char *err,
                 size_t errlen) {
    if (!g_sent_setup) {
        tp_setup su = {.kc = *kv_pool_config(f->kv), .dims = f->dims};
        su.kc.layer_local = NULL;
        if (g_rs) {
            const rstate_config *rc = rstate_pool_config(g_rs);
            su.rs_seqs = rc->n_seqs, su.rs_ckpt = rc->n_ckpt, su.rs_snap = rc->n_snap;
        }
        if (kv_copies_log(f->kv, err, errlen) || send_header(TP_SETUP, 0, 0, 0, 0, 0, 0, err, errlen) ||
            dist_bcast(&su, sizeof su, 0, err, errlen))
            return -1;
        g_sent_setup = true;
    }
    int n_class = kv_pool_plan(f->kv)->cls[KV_LOCAL].n_blocks > 0 ? 2 : 1;
    int n_copies = kv_copies_take(f->kv, g_copies);
    if (n_copies < 0) return lm_err(err, errlen, "more than %d KV block copies in one pass", KV_COPY_LOG);
    const rstate_op *rops = NULL;
    int n_rops = g_rs ? rstate_log_take(g_rs, &rops) : 0;
    if (n_rops < 0) return lm_err(err, errlen, "out of memory logging the recurrent state's operations");
    int n_tok = 0;
    size_t words = 0;
    for (int g = 0; g < n_seg; g++) {
        n_tok += segs[g].n;
        words += TP_META + (size_t)n_class * (size_t)kv_seq_held(segs[g].seq, KV_GLOBAL);
    }
    words += (size_t)n_tok + 3 * (size_t)n_copies + (size_t)TP_OP * (size_t)n_rops;
    if (grow(words, err, errlen)) return -1;
    int32_t *w = g_buf;
    memcpy(w, tokens, (size_t)n_tok * sizeof *w);
    w += n_tok;
    for (int g = 0; g < n_seg; g++) {
        const kv_seq *s = segs[g].seq;
        int nb = kv_seq_held(s, KV_GLOBAL);
        *w++ = segs[g].pos0;
        *w++ = segs[g].n;
        *w++ = segs[g].n_logits;
        *w++ = kv_seq_len(s);
        *w++ = nb;
        *w++ = kv_seq_dropped(s);
        *w++ = g_rs && segs[g].rconv ? segs[g].ck_slot : -1;
        *w++ = segs[g].ck != NULL;
    }
    for (int g = 0; g < n_seg; g++)
        for (int c = 0; c < n_class; c++) {
            int nb = kv_seq_held(segs[g].seq, KV_GLOBAL);
            memcpy(w, kv_seq_table(segs[g].seq, c), (size_t)nb * sizeof *w);
            w += nb;
        }
    for (int i = 0; i < n_copies; i++) {
        *w++ = g_copies[i].cls;
        *w++ = g_copies[i].src;
        *w++ = g_copies[i].dst;
    }
    if (n_rops) memcpy(w, rops, (size_t)n_rops * sizeof *rops);
    if (send_header(TP_RUN, n_seg, n_tok, n_copies, logits, words, n_rops, err, errlen)) return -1;
    return dist_bcast(g_buf, words * sizeof *g_buf, 0, err, errlen);
}

int tp_plan_stop(char *err, size_t errlen) { return send_header(TP_STOP, 0, 0, 0, 0, 0, 0, err, errlen); }

typedef struct {
    kv_pool *kv;
    lm_fwd *fwd;
    kv_seq **seqs; /* (n_seqs) mirror sequences, reused pass after pass */
    int n_seqs;
    lm_seg *segs;    /* (dims.n_batch) */
    float *logits;   /* (dims.n_batch, n_vocab) */
    rstate_pool *rs; /* this rank's part of the leader's state store; NULL: none here */
    float **rptr;    /* (dims.n_batch, 2 n_rlayer) per segment: its slot's conv windows, then its matrices */
} follower;

/* This rank's state store: the leader's slot counts over the recurrent
 * layers this rank runs (its stage's, its heads': as engine_mem.c sizes
 * the leader's). No store when this rank runs no recurrent layer. */
static int follow_state(follower *fl, const lm_model *m, const tp_setup *su, char *err, size_t errlen) {
    const lm_hparams *hp = &m->hp;
    if (m->pp.rec1 <= m->pp.rec0) return 0;
    if (su->rs_seqs < 1)
        return lm_err(err, errlen, "the leader keeps no recurrent state, and this rank runs recurrent layers");
    rstate_config rc;
    rstate_config_init(&rc, m->pp.rec1 - m->pp.rec0, hp->ssm_conv,
                       2 * hp->ssm_hk * hp->ssm_dk + hp->ssm_hv * hp->ssm_dv, hp->ssm_hv, hp->ssm_dk, hp->ssm_dv);
    rc.n_seqs = su->rs_seqs, rc.n_ckpt = su->rs_ckpt, rc.n_snap = su->rs_snap;
    if (!(fl->rs = rstate_pool_new(&rc, err, errlen))) return -1;
    fl->rptr = lm_calloc((size_t)su->dims.n_batch * 2 * (size_t)hp->n_rlayer, sizeof *fl->rptr);
    return fl->rptr ? 0 : lm_err(err, errlen, "out of memory");
}

static int follow_setup(follower *fl, const lm_model *m, lm_pool *pool, char *err, size_t errlen) {
    tp_setup su;
    if (dist_bcast(&su, sizeof su, 0, err, errlen)) return -1;
    if (fl->kv) return lm_err(err, errlen, "a second setup message");
    kv_config kc = su.kc;
    kc.layer_local = m->layer_local;
    kc.layer0 = m->pp.size > 1 ? m->pp.kv0 : 0; /* a pipeline stage: its own layers, the leader's blocks */
    kc.layer1 = m->pp.size > 1 ? m->pp.kv1 : 0;
    if (!(fl->kv = kv_pool_new(&kc, err, errlen))) return -1;
    if (!(fl->fwd = fwd_new(m, pool, fl->kv, &su.dims, err, errlen))) return -1;
    if (follow_state(fl, m, &su, err, errlen)) return -1;
    size_t B = (size_t)su.dims.n_batch;
    fl->segs = lm_calloc(B, sizeof *fl->segs);
    fl->seqs = lm_calloc(B, sizeof *fl->seqs);
    fl->logits = lm_malloc(B * (size_t)m->hp.n_vocab * sizeof(float));
    if (!fl->segs || !fl->seqs || !fl->logits) return lm_err(err, errlen, "out of memory");
    return 0;
}

/* Segment g's recurrent state: slot's pointers for this rank's layers
 * (the others' NULL), its checkpoints with ck. */
static int follow_seg_state(follower *fl, int g, int slot, int ck, char *err, size_t errlen) {
    if (!fl->rs || slot < 0) return 0;
    if (!rstate_acquired(fl->rs, slot))
        return lm_err(err, errlen, "segment %d names state slot %d, not acquired", g, slot);
    const lm_model *m = fl->fwd->m;
    int R = m->hp.n_rlayer, r0 = m->pp.rec0;
    float **p = fl->rptr + (size_t)g * 2 * (size_t)R;
    for (int r = r0; r < m->pp.rec1; r++) {
        p[r] = rstate_conv(fl->rs, slot, r - r0);
        p[R + r] = rstate_mat(fl->rs, slot, r - r0);
    }
    lm_seg *sg = &fl->segs[g];
    sg->rconv = p;
    sg->rmat = p + R;
    sg->ck = ck ? fl->rs : NULL;
    sg->ck_slot = slot;
    return 0;
}

static int follow_run(follower *fl, const int32_t *h, char *err, size_t errlen) {
    int n_seg = h[1], n_tok = h[2], n_copies = h[3], n_rops = h[6];
    size_t words = (size_t)(uint32_t)h[5];
    if (!fl->fwd) return lm_err(err, errlen, "a pass before the setup message");
    if (n_seg < 1 || n_seg > fl->fwd->dims.n_batch || n_tok < 1 || n_copies < 0 || n_copies > KV_COPY_LOG || n_rops < 0)
        return lm_err(err, errlen, "a malformed batch plan (%d segments, %d tokens)", n_seg, n_tok);
    if (grow(words, err, errlen) || dist_bcast(g_buf, words * sizeof *g_buf, 0, err, errlen)) return -1;
    int n_class = kv_pool_plan(fl->kv)->cls[KV_LOCAL].n_blocks > 0 ? 2 : 1;
    const int32_t *tok = g_buf, *meta = g_buf + n_tok, *tab = meta + TP_META * (size_t)n_seg, *end = g_buf + words;
    if (tab > end) return lm_err(err, errlen, "a batch plan shorter than its header says");
    for (int g = 0; g < n_seg; g++) {
        const int32_t *mt = meta + TP_META * g;
        const int32_t *tables[KV_N_CLASS] = {tab, n_class > 1 ? tab + mt[4] : tab};
        if (mt[4] < 0 || tab + (size_t)n_class * (size_t)mt[4] > end)
            return lm_err(err, errlen, "a batch plan shorter than its tables");
        tab += (size_t)n_class * (size_t)mt[4];
        while (fl->n_seqs <= g)
            if (!(fl->seqs[fl->n_seqs++] = kv_seq_new(fl->kv, err, errlen))) return fl->n_seqs--, -1;
        if (kv_seq_mirror(fl->kv, fl->seqs[g], tables, mt[4], mt[3], mt[5], err, errlen)) return -1;
        fl->segs[g] = (lm_seg){.seq = fl->seqs[g], .pos0 = mt[0], .n = mt[1], .n_logits = mt[2]};
    }
    size_t left = (size_t)(end - tab); /* the copies and the state operations */
    if (left < 3 * (size_t)n_copies || left - 3 * (size_t)n_copies != (size_t)TP_OP * (size_t)n_rops)
        return lm_err(err, errlen, "a batch plan of the wrong length");
    const int32_t *ops = tab + 3 * (size_t)n_copies;
    for (int i = 0; i < n_copies; i++) {
        kv_copy c = {tab[3 * i], tab[3 * i + 1], tab[3 * i + 2]};
        if (kv_block_copy(fl->kv, &c)) return lm_err(err, errlen, "a block copy out of range");
    }
    /* the leader's state operations, in its order, then each segment's slot */
    for (int i = 0; fl->rs && i < n_rops; i++) {
        rstate_op o;
        memcpy(&o, ops + (size_t)TP_OP * (size_t)i, sizeof o);
        if (rstate_replay(fl->rs, &o, err, errlen) != RSTATE_OK) return -1;
    }
    for (int g = 0; g < n_seg; g++)
        if (follow_seg_state(fl, g, meta[TP_META * g + 6], meta[TP_META * g + 7], err, errlen)) return -1;
    /* fwd_run's checks and this rank's part, without the leader's plan */
    int n;
    if (fwd_check(fl->fwd, tok, fl->segs, n_seg, &n, err, errlen)) return -1;
    return pp_forward(fl->fwd, tok, n, fl->segs, n_seg, h[4] ? fl->logits : NULL, err, errlen);
}

int tp_plan_follow(const lm_model *m, lm_pool *pool, char *err, size_t errlen) {
    follower fl = {0};
    int rc = -1;
    for (;;) {
        int32_t h[TP_HDR];
        if (dist_bcast_idle(h, sizeof h, 0, err, errlen)) break;
        if (h[0] == TP_STOP) {
            rc = 0;
            break;
        }
        if (h[0] == TP_SETUP     ? follow_setup(&fl, m, pool, err, errlen)
                : h[0] == TP_RUN ? follow_run(&fl, h, err, errlen)
                                 : lm_err(err, errlen, "an unknown message %d", h[0]))
            break;
    }
    fwd_free(fl.fwd);
    kv_pool_free(fl.kv); /* frees the mirrors too */
    lm_free(fl.seqs);
    lm_free(fl.segs);
    lm_free(fl.logits);
    lm_free(fl.rptr);
    rstate_pool_free(fl.rs);
    lm_free(g_buf);
    g_buf = NULL;
    g_cap = 0;
    return rc;
}
