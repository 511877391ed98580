/*
 * draft.c - the draft-model proposer (see draft.h for the contract).
 *
 * One call of draft_propose is a loop of passes over the draft's own
 * workspace. Each job's stream is toks[off .. n_toks) followed by its
 * guesses so far; the draft's KV holds the first n of it. A pass feeds every
 * live job the rest of its stream (up to what the pass budget leaves), with
 * a logits row when that reaches the stream's end; each row gives one more
 * guess. A job leaves the loop when it has k guesses, when p_min stops it,
 * or when its KV cannot grow. So the first pass is the catch-up (the prompt
 * on a sequence's first proposal, the target's last token or two after
 * that) and the next k - 1 passes are one token per job. The last guess is
 * never fed: the target verifies it, and if accepted the next catch-up
 * feeds it.
 *
 * Invariant: ds->kv holds exactly ds->n positions (kv_seq_len), those of
 * the stream's first n tokens; a pass that fails drops every job's state.
 *
 * A job with a grammar (j->gm) gets its own copy of the parse state for the
 * call (gw[i]), advanced by each guess; a guess where the matcher fails
 * (memory, a bound) or allows nothing ends the proposal, never the choice.
 */
#include "sched/draft.h"

#include <math.h>
#include <string.h>

#include "format/quant.h"
#include "model/forward.h"
#include "text/tokenizer.h"

struct draft_runner {
    const lm_model *m;
    kv_pool *kv;
    lm_fwd *fwd;
    int n_ctx, n_batch, max_seqs;
    int32_t *btok;      /* (n_batch) */
    lm_seg *segs;       /* (max_seqs) */
    int *seg_job;       /* (max_seqs) */
    bool *live;         /* (max_seqs) jobs still guessing */
    float *logits;      /* (max_seqs, n_vocab) */
    int32_t *ids;       /* (n_vocab) sampler_dist's survivors */
    float *probs;       /* (n_vocab) */
    lm_gmatch **gw;     /* (max_seqs) the jobs' parse states during a call (NULL: no grammar) */
    uint64_t ws_bytes;  /* the workspace and the buffers above, as draft_plan counts them */
    bool no_mask;       /* tests: guess without the grammar's mask */
};

int draft_check_vocab(const lm_model *target, const lm_model *draft, char *err, size_t errlen) {
    const lm_tokenizer *a = target->tok, *b = draft->tok;
    if (!a || !b) return lm_err(err, errlen, "the %s model has no tokenizer", a ? "draft" : "target");
    if (target->hp.n_vocab != draft->hp.n_vocab || tok_n_vocab(a) != tok_n_vocab(b))
        return lm_err(err, errlen, "the draft's vocabulary has %d tokens (%d logits); the target's %d (%d logits)",
                      tok_n_vocab(b), draft->hp.n_vocab, tok_n_vocab(a), target->hp.n_vocab);
    if (strcmp(tok_model_name(a), tok_model_name(b)) != 0)
        return lm_err(err, errlen, "the draft's tokenizer is '%s'; the target's '%s'", tok_model_name(b),
                      tok_model_name(a));
    if (tok_bos(a) != tok_bos(b) || tok_eos(a) != tok_eos(b) || tok_eot(a) != tok_eot(b) ||
        tok_add_bos(a) != tok_add_bos(b))
        return lm_err(err, errlen, "special tokens differ: draft BOS %d EOS %d EOT %d add-BOS %d; target BOS %d "
                      "EOS %d EOT %d add-BOS %d", tok_bos(b), tok_eos(b), tok_eot(b), tok_add_bos(b), tok_bos(a),
                      tok_eos(a), tok_eot(a), tok_add_bos(a));
    for (int32_t i = 0; i < tok_n_vocab(a); i++) {
        size_t la, lb;
        const char *pa = tok_piece(a, i, &la), *pb = tok_piece(b, i, &lb);
        if (la != lb || (la && memcmp(pa, pb, la) != 0))
            return lm_err(err, errlen, "token %d differs: the draft's is '%.*s', the target's '%.*s'", i,
                          (int)(lb > 40 ? 40 : lb), pb, (int)(la > 40 ? 40 : la), pa);
        if (tok_is_control(a, i) != tok_is_control(b, i) || tok_is_eog(a, i) != tok_is_eog(b, i))
            return lm_err(err, errlen, "token %d ('%.*s') is a control or end token in one tokenizer only", i,
                          (int)(la > 40 ? 40 : la), pa);
    }
    return 0;
}

void draft_free(draft_runner *d) {
    if (!d) return;
    fwd_free(d->fwd);
    kv_pool_free(d->kv);
    lm_free(d->btok);
    lm_free(d->segs);
    lm_free(d->seg_job);
    lm_free(d->live);
    lm_free(d->logits);
    lm_free(d->ids);
    lm_free(d->probs);
    lm_free(d->gw);
    lm_free(d);
}

/* The dims of the draft's passes: the target's context, or the draft's
 * own when shorter. */
static fwd_dims draft_dims(const lm_model *dm, int n_ctx, int n_batch) {
    if (dm->hp.n_ctx_train > 0 && n_ctx > dm->hp.n_ctx_train) n_ctx = dm->hp.n_ctx_train;
    return fwd_dims_make(dm, n_ctx, n_batch);
}

/* btok, logits, ids, probs */
static uint64_t buffer_bytes(const lm_model *dm, const fwd_dims *dims, int max_seqs) {
    uint64_t V = (uint64_t)dm->hp.n_vocab;
    return (uint64_t)dims->n_batch * sizeof(int32_t) + ((uint64_t)max_seqs * V + 2 * V) * sizeof(float);
}

int draft_plan(const lm_model *dm, int n_ctx, int n_batch, int max_seqs, int n_threads, kv_config *kc,
               uint64_t *workspace, char *err, size_t errlen) {
    fwd_dims dims = draft_dims(dm, n_ctx, n_batch);
    fwd_kv_config(dm, &dims, kc);
    kc->type = LM_TYPE_F16;
    kc->n_seqs = max_seqs;
    kc->mem_bytes = 0;
    *workspace = fwd_workspace_bytes(dm, &dims, n_threads) + buffer_bytes(dm, &dims, max_seqs);
    kv_plan pl;
    return kv_plan_make(kc, &pl, err, errlen) == KV_OK ? 0 : -1;
}

int draft_pool_default(const kv_config *kc, uint64_t *bytes, char *err, size_t errlen) {
    kv_config c = *kc;
    c.mem_bytes = 0;
    kv_plan pl;
    if (kv_plan_make(&c, &pl, err, errlen) != KV_OK) return -1;
    *bytes = pl.data_bytes > (2ull << 30) ? 2ull << 30 : pl.data_bytes;
    return 0;
}

draft_runner *draft_new(const lm_model *dm, lm_pool *pool, const kv_config *kcin, int n_ctx, int n_batch,
                        int max_seqs, char *err, size_t errlen) {
    draft_runner *d = lm_calloc(1, sizeof *d);
    if (!d) return lm_err(err, errlen, "out of memory"), NULL;
    d->m = dm;
    fwd_dims dims = draft_dims(dm, n_ctx, n_batch);
    d->n_ctx = dims.n_ctx;
    d->n_batch = dims.n_batch;
    d->max_seqs = max_seqs;
    kv_config kc;
    uint64_t ws;
    if (draft_plan(dm, n_ctx, n_batch, max_seqs, pool_size(pool), &kc, &ws, err, errlen) != 0) goto fail;
    if (kcin) {
        kc = *kcin;
    } else { /* the full pool, at most 2 GiB */
        kv_plan pl;
        if (kv_plan_make(&kc, &pl, err, errlen) != KV_OK) goto fail;
        if (pl.data_bytes > (2ull << 30)) kc.mem_bytes = 2ull << 30;
    }
    size_t V = (size_t)dm->hp.n_vocab;
    if (!(d->kv = kv_pool_new(&kc, err, errlen))) goto fail;
    if (!(d->fwd = fwd_new(dm, pool, d->kv, &dims, err, errlen))) goto fail;
    d->ws_bytes = d->fwd->ws_bytes + buffer_bytes(dm, &dims, max_seqs);
    d->btok = lm_malloc((size_t)d->n_batch * sizeof *d->btok);
    d->segs = lm_calloc((size_t)max_seqs, sizeof *d->segs);
    d->seg_job = lm_calloc((size_t)max_seqs, sizeof *d->seg_job);
    d->live = lm_calloc((size_t)max_seqs, sizeof *d->live);
    d->logits = lm_malloc((size_t)max_seqs * V * sizeof *d->logits);
    d->ids = lm_malloc(V * sizeof *d->ids);
    d->probs = lm_malloc(V * sizeof *d->probs);
    d->gw = lm_calloc((size_t)max_seqs, sizeof *d->gw);
    if (!d->btok || !d->segs || !d->seg_job || !d->live || !d->logits || !d->ids || !d->probs || !d->gw) {
        lm_err(err, errlen, "out of memory allocating the draft model's buffers");
        goto fail;
    }
    return d;
fail:
    draft_free(d);
    return NULL;
}

uint64_t draft_workspace_bytes(const draft_runner *d) { return d->ws_bytes; }

uint64_t draft_kv_bytes(const draft_runner *d) { return kv_pool_plan(d->kv)->data_bytes; }

int64_t draft_kv_tokens(const draft_runner *d) { return kv_pool_plan(d->kv)->n_tokens; }

void draft_set_masking(draft_runner *d, bool on) { d->no_mask = !on; }

double draft_time_pass(draft_runner *d, int32_t tok) {
    char err[LM_ERRLEN];
    kv_seq *s = kv_seq_new(d->kv, err, sizeof err);
    if (!s) return -1;
    double t = -1;
    if (kv_append(d->kv, s, 1, err, sizeof err) == KV_OK) {
        lm_seg seg = {.seq = s, .pos0 = 0, .n = 1, .n_logits = 1};
        double t0 = lm_now();
        if (fwd_run(d->fwd, &tok, &seg, 1, d->logits, err, sizeof err) == 0) t = lm_now() - t0;
    }
    kv_seq_free(d->kv, s);
    return t;
}

int draft_seq_init(draft_runner *d, draft_seq *ds, const lm_sample_params *sp) {
    memset(ds, 0, sizeof *ds);
    ds->smp = sampler_new(sp, d->m->hp.n_vocab);
    lm_rng_seed(&ds->rng, sp->seed ^ 0x9e3779b97f4a7c15ull);
    return ds->smp ? 0 : -1;
}

void draft_seq_set_bias(draft_seq *ds, int32_t tok, float bias) { sampler_set_bias(ds->smp, tok, bias); }

void draft_seq_release(draft_runner *d, draft_seq *ds) {
    if (ds->kv) kv_seq_free(d->kv, ds->kv);
    ds->kv = NULL;
    ds->off = ds->n = 0;
}

void draft_seq_free(draft_runner *d, draft_seq *ds) {
    if (d) draft_seq_release(d, ds);
    sampler_free(ds->smp);
    ds->smp = NULL;
}

/* The stream's token i: toks[off + i], then the guesses. */
static int32_t stream_at(const draft_job *j, int i) {
    int t = j->ds->off + i;
    return t < j->n_toks ? j->toks[t] : j->out[t - j->n_toks];
}

/* Where job j's draft starts this call: carry on, or restart on a short
 * window when it is far behind, has no KV, or would pass its context. */
static void place(draft_runner *d, draft_job *j) {
    draft_seq *ds = j->ds;
    int behind = j->n_toks - (ds->off + ds->n);
    bool fits = j->n_toks + j->k - ds->off <= d->n_ctx;
    if (ds->kv && behind >= 0 && behind <= DRAFT_GAP_MAX && fits) return;
    bool fresh = !ds->started;
    ds->started = true;
    draft_seq_release(d, ds);
    /* the first time the whole sequence (when it fits), else a short window */
    int ctx = fresh && j->n_toks + j->k <= d->n_ctx ? j->n_toks : DRAFT_RESTART_CTX;
    if (ctx > d->n_ctx - j->k) ctx = d->n_ctx - j->k;
    if (ctx > j->n_toks) ctx = j->n_toks;
    if (ctx < 1) ctx = 1;
    ds->off = j->n_toks - ctx;
    char err[LM_ERRLEN];
    ds->kv = kv_seq_new(d->kv, err, sizeof err);
}

/* The largest probability of the row (its softmax), O(V). */
static float top_prob(const float *row, int32_t V) {
    float m = -INFINITY;
    for (int32_t i = 0; i < V; i++)
        if (row[i] > m) m = row[i];
    if (!isfinite(m)) return 1.0f;
    double s = 0;
    for (int32_t i = 0; i < V; i++)
        if (row[i] > -INFINITY) s += exp((double)row[i] - m);
    return (float)(1.0 / s);
}

/* The guess from row (the draft's logits for job j's next token, g its
 * parse state or NULL), written to j->out and, sampling, its distribution
 * to j->q. false when p_min stops the proposal, every token is banned, or
 * the grammar allows nothing; *last when nothing may follow the guess (a
 * grammar that can only end, or one the matcher failed on). */
static bool guess(draft_runner *d, draft_job *j, lm_gmatch *g, float *row, float p_min, bool *last) {
    int32_t V = d->m->hp.n_vocab;
    lm_sampler *s = j->ds->smp;
    int32_t t;
    *last = false;
    if (g) { /* the target's row gets the same mask before its sampler */
        if (gmatch_mask(g, j->mask) <= 0) return false;
        grammar_mask_apply(j->mask, j->n_mask, row, V);
    }
    if (sampler_greedy(s)) {
        t = sampler_sample(s, row); /* bias and penalties applied to row, then its argmax */
        if (t < 0 || (p_min > 0 && top_prob(row, V) < p_min)) return false;
    } else {
        int32_t n = sampler_dist(s, row, d->ids, d->probs);
        if (n <= 0) return false;
        float top = 0;
        double sum = 0;
        for (int32_t i = 0; i < n; i++) {
            if (d->probs[i] > top) top = d->probs[i];
            sum += d->probs[i];
        }
        if (top < p_min) return false; /* decided before the draw: q stays exact */
        double u = lm_rng_uniform(&j->ds->rng) * sum, cum = 0;
        t = d->ids[n - 1];
        for (int32_t i = 0; i < n; i++)
            if (u < (cum += d->probs[i])) {
                t = d->ids[i];
                break;
            }
        float *q = j->q + (size_t)j->n_out * V;
        memset(q, 0, (size_t)V * sizeof *q);
        for (int32_t i = 0; i < n; i++) q[d->ids[i]] = (float)(d->probs[i] / sum);
    }
    j->out[j->n_out++] = t;
    sampler_accept(s, t);
    /* as the engine's grammar_advance: an end-of-generation token leaves the state */
    if (g && !tok_is_eog(d->m->tok, t) && (gmatch_accept(g, t) != 0 || gmatch_must_end(g))) *last = true;
    return true;
}

void draft_propose(draft_runner *d, draft_job *jobs, int n_jobs, int min, float p_min) {
    int32_t V = d->m->hp.n_vocab;
    char err[LM_ERRLEN];
    bool *live = d->live;
    if (n_jobs > d->max_seqs) n_jobs = d->max_seqs;
    for (int i = 0; i < n_jobs; i++) {
        draft_job *j = &jobs[i];
        j->n_out = 0;
        place(d, j);
        live[i] = j->ds->kv != NULL && j->k > 0;
        if (live[i]) sampler_copy_history(j->ds->smp, j->hist);
        d->gw[i] = NULL;
        if (live[i] && j->gm && !d->no_mask && !(d->gw[i] = gmatch_copy(j->gm))) live[i] = false;
    }
    for (;;) {
        int n_seg = 0, n_tok = 0;
        for (int i = 0; i < n_jobs && n_seg < d->max_seqs; i++) {
            draft_job *j = &jobs[i];
            if (!live[i]) continue;
            draft_seq *ds = j->ds;
            int len = j->n_toks - ds->off + j->n_out;
            int n = len - ds->n;
            if (n > d->n_batch - n_tok) n = d->n_batch - n_tok;
            if (n <= 0) continue;
            if (kv_append(d->kv, ds->kv, n, err, sizeof err) != KV_OK) { /* full: no proposal this time */
                draft_seq_release(d, ds);
                live[i] = false;
                j->n_out = 0;
                continue;
            }
            for (int t = 0; t < n; t++) d->btok[n_tok + t] = stream_at(j, ds->n + t);
            d->segs[n_seg] = (lm_seg){.seq = ds->kv, .pos0 = ds->n, .n = n, .n_logits = ds->n + n == len};
            d->seg_job[n_seg++] = i;
            n_tok += n;
        }
        if (n_seg == 0) break;
        if (fwd_run(d->fwd, d->btok, d->segs, n_seg, d->logits, err, sizeof err) != 0) {
            for (int i = 0; i < n_jobs; i++) {
                draft_seq_release(d, jobs[i].ds);
                jobs[i].n_out = 0;
            }
            break;
        }
        int row = 0;
        for (int g = 0; g < n_seg; g++) {
            int i = d->seg_job[g];
            draft_job *j = &jobs[i];
            j->ds->n += d->segs[g].n;
            if (!d->segs[g].n_logits) continue;
            bool last;
            if (!guess(d, j, d->gw[i], d->logits + (size_t)row++ * V, p_min, &last) || last || j->n_out >= j->k)
                live[i] = false;
        }
    }
    for (int i = 0; i < n_jobs; i++) {
        gmatch_free(d->gw[i]);
        d->gw[i] = NULL;
        if (jobs[i].n_out < min) jobs[i].n_out = 0;
    }
}

void draft_keep(draft_runner *d, draft_seq *ds, int agree) {
    if (!ds->kv) return;
    int keep = agree - ds->off;
    if (keep < 0) keep = 0;
    if (keep >= ds->n) return;
    char err[LM_ERRLEN];
    if (kv_truncate(d->kv, ds->kv, keep, err, sizeof err) != KV_OK) { /* a window refuses: start again later */
        draft_seq_release(d, ds);
        return;
    }
    ds->n = keep;
}

int64_t draft_live(const draft_runner *d) {
    kv_stats ks;
    kv_stats_get(d->kv, &ks);
    return ks.n_seqs;
}

int draft_check(draft_runner *d, char *err, size_t errlen) {
    return kv_pool_check(d->kv, err, errlen) == KV_OK ? 0 : -1;
}
