/*
 * tp_plan.c - the batch plan a serving leader broadcasts and its followers
 * execute (tp_plan.h).
 *
 * Each message is a header of 8 int32 (kind, n_seg, n_tok, n_copies,
 * logits wanted, payload words) then, for a pass, one int32 payload:
 *   tokens (n_tok);
 *   per segment: pos0, n, n_logits, len, n_blocks, n_dropped (6 each);
 *   per segment and KV class: its block table (n_blocks each);
 *   the block copies the leader's pool made since the last pass (cls, src,
 *   dst each), repeated first.
 * The setup message (first pass) carries the leader's kv_config and
 * fwd_dims instead, so the follower's pool has the same plan and the block
 * numbers mean the same blocks; layer_local and, under pipeline
 * parallelism, the stage's layer range come from the follower's own model
 * (the plan's block counts are the whole model's on every stage, kv.h).
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

typedef struct {
    kv_config kc; /* layer_local NULL on the wire */
    fwd_dims dims;
} tp_setup;

static bool g_sent_setup;
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

static int send_header(int kind, int n_seg, int n_tok, int n_copies, int logits, size_t words, char *err,
                       size_t errlen) {
    int32_t h[TP_HDR] = {kind, n_seg, n_tok, n_copies, logits, (int32_t)words, 0, 0};
    return dist_bcast_idle(h, sizeof h, 0, err, errlen);
}

int tp_plan_send(lm_fwd *f, const int32_t *tokens, const lm_seg *segs, int n_seg, bool logits, char *err,
                 size_t errlen) {
    if (!g_sent_setup) {
        tp_setup su = {.kc = *kv_pool_config(f->kv), .dims = f->dims};
        su.kc.layer_local = NULL;
        if (kv_copies_log(f->kv, err, errlen) || send_header(TP_SETUP, 0, 0, 0, 0, 0, err, errlen) ||
            dist_bcast(&su, sizeof su, 0, err, errlen))
            return -1;
        g_sent_setup = true;
    }
    int n_class = kv_pool_plan(f->kv)->cls[KV_LOCAL].n_blocks > 0 ? 2 : 1;
    int n_copies = kv_copies_take(f->kv, g_copies);
    if (n_copies < 0) return lm_err(err, errlen, "more than %d KV block copies in one pass", KV_COPY_LOG);
    int n_tok = 0;
    size_t words = 0;
    for (int g = 0; g < n_seg; g++) {
        n_tok += segs[g].n;
        words += 6 + (size_t)n_class * (size_t)kv_seq_held(segs[g].seq, KV_GLOBAL);
    }
    words += (size_t)n_tok + 3 * (size_t)n_copies;
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
    if (send_header(TP_RUN, n_seg, n_tok, n_copies, logits, words, err, errlen)) return -1;
    return dist_bcast(g_buf, words * sizeof *g_buf, 0, err, errlen);
}

int tp_plan_stop(char *err, size_t errlen) { return send_header(TP_STOP, 0, 0, 0, 0, 0, err, errlen); }

typedef struct {
    kv_pool *kv;
    lm_fwd *fwd;
    kv_seq **seqs; /* (n_seqs) mirror sequences, reused pass after pass */
    int n_seqs;
    lm_seg *segs;  /* (dims.n_batch) */
    float *logits; /* (dims.n_batch, n_vocab) */
} follower;

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
    size_t B = (size_t)su.dims.n_batch;
    fl->segs = lm_calloc(B, sizeof *fl->segs);
    fl->seqs = lm_calloc(B, sizeof *fl->seqs);
    fl->logits = lm_malloc(B * (size_t)m->hp.n_vocab * sizeof(float));
    if (!fl->segs || !fl->seqs || !fl->logits) return lm_err(err, errlen, "out of memory");
    return 0;
}

static int follow_run(follower *fl, const int32_t *h, char *err, size_t errlen) {
    int n_seg = h[1], n_tok = h[2], n_copies = h[3];
    size_t words = (size_t)(uint32_t)h[5];
    if (!fl->fwd) return lm_err(err, errlen, "a pass before the setup message");
    if (n_seg < 1 || n_seg > fl->fwd->dims.n_batch || n_tok < 1 || n_copies < 0 || n_copies > KV_COPY_LOG)
        return lm_err(err, errlen, "a malformed batch plan (%d segments, %d tokens)", n_seg, n_tok);
    if (grow(words, err, errlen) || dist_bcast(g_buf, words * sizeof *g_buf, 0, err, errlen)) return -1;
    int n_class = kv_pool_plan(fl->kv)->cls[KV_LOCAL].n_blocks > 0 ? 2 : 1;
    const int32_t *tok = g_buf, *meta = g_buf + n_tok, *tab = meta + 6 * (size_t)n_seg, *end = g_buf + words;
    if (tab > end) return lm_err(err, errlen, "a batch plan shorter than its header says");
    for (int g = 0; g < n_seg; g++) {
        const int32_t *mt = meta + 6 * g;
        const int32_t *tables[KV_N_CLASS] = {tab, n_class > 1 ? tab + mt[4] : tab};
        if (mt[4] < 0 || tab + (size_t)n_class * (size_t)mt[4] > end)
            return lm_err(err, errlen, "a batch plan shorter than its tables");
        tab += (size_t)n_class * (size_t)mt[4];
        while (fl->n_seqs <= g)
            if (!(fl->seqs[fl->n_seqs++] = kv_seq_new(fl->kv, err, errlen))) return fl->n_seqs--, -1;
        if (kv_seq_mirror(fl->kv, fl->seqs[g], tables, mt[4], mt[3], mt[5], err, errlen)) return -1;
        fl->segs[g] = (lm_seg){.seq = fl->seqs[g], .pos0 = mt[0], .n = mt[1], .n_logits = mt[2]};
    }
    if (tab + 3 * (size_t)n_copies != end) return lm_err(err, errlen, "a batch plan of the wrong length");
    for (int i = 0; i < n_copies; i++) {
        kv_copy c = {tab[3 * i], tab[3 * i + 1], tab[3 * i + 2]};
        if (kv_block_copy(fl->kv, &c)) return lm_err(err, errlen, "a block copy out of range");
    }
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
    lm_free(g_buf);
    g_buf = NULL;
    g_cap = 0;
    return rc;
}
