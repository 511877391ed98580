/*
 * proposer.c - the two proposers behind proposer.h's seam: prompt lookup
 * (decode/spec.h: the guesses copied from the sequence's own earlier text;
 * no state, no cost) and the draft model (draft.h: its KV kept to the
 * tokens that agree with its last guesses, every sequence's guesses made in
 * the same passes).
 *
 * A draft's state in step. After a proposal the draft's KV holds the
 * tokens up to base and the guesses it fed; once tokens follow (a verified
 * step, or plain steps), only the positions whose guess equals the token
 * taken still hold the sequence (draft_keep cuts the rest). sync and
 * observe both do this; a second call finds nothing left to cut.
 */
#include "sched/proposer.h"

#include <string.h>

#include "base/util.h"
#include "decode/spec.h"

/* ---- prompt lookup -------------------------------------------------------- */

static void ngram_propose(spec_proposer *p, spec_job *jobs, int n_jobs) {
    (void)p;
    for (int i = 0; i < n_jobs; i++) {
        spec_job *j = &jobs[i];
        j->n_out = spec_ngram_propose(j->toks, j->n_toks, j->k, j->s->guess);
        j->s->base = j->n_toks;
    }
}

static void ngram_free(spec_proposer *p) { lm_free(p); }

static const spec_proposer_ops ngram_ops = {
    .name = "ngram", .early = true, .propose = ngram_propose, .free = ngram_free};

spec_proposer *spec_prop_ngram(void) {
    spec_proposer *p = lm_calloc(1, sizeof *p);
    if (p) p->ops = &ngram_ops;
    return p;
}

/* ---- the draft model -------------------------------------------------------- */

static int draft_seq_start(spec_proposer *p, spec_pseq *s, const lm_sample_params *sp, const int32_t *bias_ids,
                           const float *bias_vals, int n_bias) {
    lm_sample_params dsp = *sp;
    if (draft_seq_init(p->dr, &s->ds, &dsp) != 0) return -1;
    for (int b = 0; b < n_bias; b++) draft_seq_set_bias(&s->ds, bias_ids[b], bias_vals[b]);
    return 0;
}

static void draft_release(spec_proposer *p, spec_pseq *s) { draft_seq_release(p->dr, &s->ds); }

/* The draft model's KV keeps only what still agrees with the tokens: its
 * guesses after tokens[0 .. base) as far as they were taken. */
static void draft_resync(spec_proposer *p, spec_pseq *s, const int32_t *toks, int n_toks) {
    draft_seq *ds = &s->ds;
    if (!ds->kv) return;
    int fed = ds->off + ds->n, agree = fed < s->base ? fed : s->base;
    while (agree < fed && agree < n_toks && toks[agree] == s->guess[agree - s->base]) agree++;
    draft_keep(p->dr, ds, agree);
}

static void draft_observe(spec_proposer *p, spec_pseq *s, const int32_t *toks, int n_toks, int proposed, int accepted) {
    (void)proposed, (void)accepted; /* the tokens say which guesses were taken */
    draft_resync(p, s, toks, n_toks);
}

static void draft_run(spec_proposer *p, spec_job *jobs, int n_jobs) {
    for (int i = 0; i < n_jobs; i++) {
        const spec_job *j = &jobs[i];
        j->s->base = j->n_toks;
        p->jobs[i] = (draft_job){.ds = &j->s->ds,
                                 .toks = j->toks,
                                 .n_toks = j->n_toks,
                                 .hist = j->hist,
                                 .gm = j->gm,
                                 .mask = j->mask,
                                 .n_mask = j->n_mask,
                                 .k = j->k,
                                 .out = j->s->guess,
                                 .q = j->q};
    }
    draft_propose(p->dr, p->jobs, n_jobs, p->min, p->p_min);
    for (int i = 0; i < n_jobs; i++) jobs[i].n_out = p->jobs[i].n_out;
}

static void draft_destroy(spec_proposer *p) {
    draft_free(p->dr);
    lm_free(p->jobs);
    lm_free(p);
}

static const spec_proposer_ops draft_ops = {.name = "draft",
                                            .early = false,
                                            .seq_init = draft_seq_start,
                                            .seq_release = draft_release,
                                            .sync = draft_resync,
                                            .propose = draft_run,
                                            .observe = draft_observe,
                                            .free = draft_destroy};

spec_proposer *spec_prop_draft(const lm_model *dm, lm_pool *pool, const kv_config *kc, int n_ctx, int n_batch,
                               int max_seqs, int vocab, int min, float p_min, char *err, size_t errlen) {
    spec_proposer *p = lm_calloc(1, sizeof *p);
    if (!p || !(p->jobs = lm_calloc((size_t)max_seqs, sizeof *p->jobs))) {
        lm_free(p);
        lm_err(err, errlen, "out of memory");
        return NULL;
    }
    p->ops = &draft_ops;
    p->min = min, p->p_min = p_min, p->max_seqs = max_seqs;
    if (!(p->dr = draft_new(dm, pool, kc, n_ctx, n_batch, max_seqs, vocab, err, errlen))) {
        lm_free(p->jobs);
        lm_free(p);
        return NULL;
    }
    return p;
}

/* ---- the seam ----------------------------------------------------------------- */

bool spec_prop_early(const spec_proposer *p) { return p->ops->early; }
draft_runner *spec_prop_runner(const spec_proposer *p) { return p ? p->dr : NULL; }

int spec_pseq_init(spec_proposer *p, spec_pseq *s, int cap, const lm_sample_params *sp, const int32_t *bias_ids,
                   const float *bias_vals, int n_bias) {
    memset(s, 0, sizeof *s);
    s->cap = cap;
    if (!(s->guess = lm_malloc((size_t)cap * sizeof *s->guess))) return -1;
    return p->ops->seq_init ? p->ops->seq_init(p, s, sp, bias_ids, bias_vals, n_bias) : 0;
}

void spec_pseq_free(spec_pseq *s) {
    lm_free(s->guess);
    s->guess = NULL;
    draft_seq_free(NULL, &s->ds);
}

void spec_prop_release(spec_proposer *p, spec_pseq *s) {
    if (p->ops->seq_release) p->ops->seq_release(p, s);
}

void spec_prop_sync(spec_proposer *p, spec_pseq *s, const int32_t *toks, int n_toks) {
    if (p->ops->sync) p->ops->sync(p, s, toks, n_toks);
}

void spec_prop_propose(spec_proposer *p, spec_job *jobs, int n_jobs) { p->ops->propose(p, jobs, n_jobs); }

void spec_prop_observe(spec_proposer *p, spec_pseq *s, const int32_t *toks, int n_toks, int proposed, int accepted) {
    if (p->ops->observe) p->ops->observe(p, s, toks, n_toks, proposed, accepted);
}

void spec_prop_hidden(spec_proposer *p, spec_pseq *s, const int32_t *toks, int pos0, const float *h, int n) {
    if (p->ops->hidden) p->ops->hidden(p, s, toks, pos0, h, n);
}

void spec_prop_free(spec_proposer *p) {
    if (p) p->ops->free(p);
}
