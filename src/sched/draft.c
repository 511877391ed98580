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
#include <stdlib.h>
#include <string.h>

#include "format/quant.h"
#include "model/forward.h"
#include "text/tokenizer.h"

struct draft_runner {
    const lm_model *m;
    kv_pool *kv;
    lm_fwd *fwd;
    int n_ctx, n_batch, max_seqs;
    int32_t *btok;  /* (n_batch) */
    lm_seg *segs;   /* (max_seqs) */
    int *seg_job;   /* (max_seqs) */
    bool *live;     /* (max_seqs) jobs still guessing */
    float *logits;  /* (max_seqs, n_vocab) */
    int32_t *ids;   /* (n_vocab) sampler_dist's survivors */
    float *probs;   /* (n_vocab) */
    lm_gmatch **gw; /* (max_seqs) the jobs' parse states during a call (NULL: no grammar) */
    /* the vocabulary subset (NULL sub: the whole LM head); see draft.h */
    lm_head_sub *sub;
    fwd_head_sel sel;        /* sub, the call's extras (ux), gather and out scratch */
    uint8_t *in_sub;         /* (n_vocab) 1 for the subset's tokens */
    uint32_t *jmark, *umark; /* (n_vocab) stamps: in this job's extras, in the call's */
    uint32_t tick;
    int32_t *ux; /* (DRAFT_EXTRA_MAX) the call's extras: the union of its jobs' */
    int32_t *jx; /* (DRAFT_EXTRA_MAX) each job's extras, job after job */
    int *jx0;    /* (max_seqs + 1) job i's are jx[jx0[i] .. jx0[i + 1]) */
    float *save; /* (DRAFT_EXTRA_MAX) a row's values of its job's extras */
    int32_t *xs; /* (DRAFT_EXTRA_MAX) a job's extras, ascending */
    int32_t *
        gids; /* (sub->n + DRAFT_EXTRA_MAX) a greedy guess's candidates: the subset's and its job's extras, ascending */
    float *gval;       /* (sub->n + DRAFT_EXTRA_MAX) their logits (sampler scratch) */
    uint64_t ws_bytes; /* the workspace and the buffers above, as draft_plan counts them */
    bool no_mask;      /* tests: guess without the grammar's mask */
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
        return lm_err(err, errlen,
                      "special tokens differ: draft BOS %d EOS %d EOT %d add-BOS %d; target BOS %d "
                      "EOS %d EOT %d add-BOS %d",
                      tok_bos(b), tok_eos(b), tok_eot(b), tok_add_bos(b), tok_bos(a), tok_eos(a), tok_eot(a),
                      tok_add_bos(a));
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
    head_sub_free(d->sub);
    lm_free(d->sel.gather);
    lm_free(d->sel.out);
    lm_free(d->in_sub);
    lm_free(d->jmark);
    lm_free(d->umark);
    lm_free(d->ux);
    lm_free(d->jx);
    lm_free(d->jx0);
    lm_free(d->save);
    lm_free(d->xs);
    lm_free(d->gids);
    lm_free(d->gval);
    lm_free(d);
}

/* The dims of the draft's passes: the target's context, or the draft's
 * own when shorter. */
static fwd_dims draft_dims(const lm_model *dm, int n_ctx, int n_batch) {
    if (dm->hp.n_ctx_train > 0 && n_ctx > dm->hp.n_ctx_train) n_ctx = dm->hp.n_ctx_train;
    return fwd_dims_make(dm, n_ctx, n_batch);
}

int draft_vocab_size(const lm_model *dm, int asked) {
    int V = dm->hp.n_vocab;
    if (asked < 0) asked = V > DRAFT_VOCAB_AUTO_ABOVE ? DRAFT_VOCAB_AUTO : 0;
    if (asked == 0 || dm->tp.size > 1 || dm->pp.size > 1) return 0;
    int n_eog = 0; /* always in the subset */
    for (int32_t i = 0; dm->tok && i < V; i++) n_eog += tok_is_eog(dm->tok, i);
    if (asked < n_eog) asked = n_eog;
    return asked >= V ? 0 : asked;
}

/* btok, logits, ids, probs; with a subset of n tokens its rows, the
 * extras' scratch and the stamps */
static uint64_t buffer_bytes(const lm_model *dm, const fwd_dims *dims, int max_seqs, int n) {
    uint64_t V = (uint64_t)dm->hp.n_vocab;
    uint64_t b = (uint64_t)dims->n_batch * sizeof(int32_t) + ((uint64_t)max_seqs * V + 2 * V) * sizeof(float);
    if (n > 0) {
        uint64_t X = DRAFT_EXTRA_MAX;
        b += head_sub_bytes(dm, n) + X * dm->output.row_bytes + (uint64_t)max_seqs * ((uint64_t)n + X) * sizeof(float);
        b += V * (1 + 2 * sizeof(uint32_t)) + X * (3 * sizeof(int32_t) + sizeof(float)) +
            ((uint64_t)max_seqs + 1) * sizeof(int) + ((uint64_t)n + X) * (sizeof(int32_t) + sizeof(float));
    }
    return b;
}

/* The subset's n tokens: the end-of-generation tokens, then the best by
 * the tokenizer's scores (SentencePiece's rank frequency; Gemma 3's fall
 * with the id among ordinary tokens), ties and files without scores by id. */
typedef struct {
    float score;
    int32_t id;
} ranked;

static int cmp_rank(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int make_subset(draft_runner *d, int n, char *err, size_t errlen) {
    const lm_model *dm = d->m;
    int32_t V = dm->hp.n_vocab;
    const float *sc = dm->tok ? tok_scores(dm->tok) : NULL;
    ranked *rk = lm_malloc((size_t)V * sizeof *rk);
    int32_t *order = lm_malloc((size_t)V * sizeof *order);
    if (!rk || !order) {
        lm_free(rk), lm_free(order);
        return lm_err(err, errlen, "out of memory");
    }
    int k = 0, n_eog = 0;
    for (int32_t i = 0; i < V; i++)
        if (dm->tok && tok_is_eog(dm->tok, i)) order[n_eog++] = i;
        else rk[k++] = (ranked){.score = sc && i < tok_n_vocab(dm->tok) ? sc[i] : 0, .id = i};
    qsort(rk, (size_t)k, sizeof *rk, cmp_rank);
    for (int i = 0; i < k; i++) order[n_eog + i] = rk[i].id;
    lm_free(rk);
    d->sub = head_sub_new(dm, order, n, err, errlen);
    lm_free(order);
    if (!d->sub) return -1;
    size_t X = DRAFT_EXTRA_MAX;
    d->sel.sub = d->sub;
    d->sel.gather = lm_malloc(X * dm->output.row_bytes);
    d->sel.out = lm_malloc((size_t)d->max_seqs * ((size_t)n + X) * sizeof(float));
    d->in_sub = lm_calloc((size_t)V, 1);
    d->jmark = lm_calloc((size_t)V, sizeof *d->jmark);
    d->umark = lm_calloc((size_t)V, sizeof *d->umark);
    d->ux = lm_malloc(X * sizeof *d->ux);
    d->jx = lm_malloc(X * sizeof *d->jx);
    d->jx0 = lm_malloc(((size_t)d->max_seqs + 1) * sizeof *d->jx0);
    d->save = lm_malloc(X * sizeof *d->save);
    d->xs = lm_malloc(X * sizeof *d->xs);
    d->gids = lm_malloc(((size_t)n + X) * sizeof *d->gids);
    d->gval = lm_malloc(((size_t)n + X) * sizeof *d->gval);
    if (!d->sel.gather || !d->sel.out || !d->in_sub || !d->jmark || !d->umark || !d->ux || !d->jx || !d->jx0 ||
        !d->save || !d->xs || !d->gids || !d->gval)
        return lm_err(err, errlen, "out of memory for the draft's vocabulary subset");
    for (int i = 0; i < d->sub->n; i++) d->in_sub[d->sub->ids[i]] = 1;
    return 0;
}

int draft_plan(const lm_model *dm, int n_ctx, int n_batch, int max_seqs, int n_threads, int vocab, kv_config *kc,
               uint64_t *workspace, char *err, size_t errlen) {
    fwd_dims dims = draft_dims(dm, n_ctx, n_batch);
    fwd_kv_config(dm, &dims, kc);
    kc->type = LM_TYPE_F16;
    kc->n_seqs = max_seqs;
    kc->mem_bytes = 0;
    *workspace =
        fwd_workspace_bytes(dm, &dims, n_threads) + buffer_bytes(dm, &dims, max_seqs, draft_vocab_size(dm, vocab));
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

draft_runner *draft_new(const lm_model *dm, lm_pool *pool, const kv_config *kcin, int n_ctx, int n_batch, int max_seqs,
                        int vocab, char *err, size_t errlen) {
    draft_runner *d = lm_calloc(1, sizeof *d);
    if (!d) return lm_err(err, errlen, "out of memory"), NULL;
    d->m = dm;
    fwd_dims dims = draft_dims(dm, n_ctx, n_batch);
    d->n_ctx = dims.n_ctx;
    d->n_batch = dims.n_batch;
    d->max_seqs = max_seqs;
    kv_config kc;
    uint64_t ws;
    int n_sub = draft_vocab_size(dm, vocab);
    if (draft_plan(dm, n_ctx, n_batch, max_seqs, pool_size(pool), vocab, &kc, &ws, err, errlen) != 0) goto fail;
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
    d->ws_bytes = d->fwd->ws_bytes + buffer_bytes(dm, &dims, max_seqs, n_sub);
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
    if (n_sub > 0 && make_subset(d, n_sub, err, errlen) != 0) goto fail;
    return d;
fail:
    draft_free(d);
    return NULL;
}

uint64_t draft_workspace_bytes(const draft_runner *d) { return d->ws_bytes; }

uint64_t draft_kv_bytes(const draft_runner *d) { return kv_pool_plan(d->kv)->data_bytes; }

int64_t draft_kv_tokens(const draft_runner *d) { return kv_pool_plan(d->kv)->n_tokens; }

void draft_set_masking(draft_runner *d, bool on) { d->no_mask = !on; }

int draft_vocab_n(const draft_runner *d, const int32_t **ids) {
    if (ids) *ids = d->sub ? d->sub->ids : NULL;
    return d->sub ? d->sub->n : 0;
}

/* The next stamp for jmark/umark (both cleared when it wraps). */
static uint32_t next_tick(draft_runner *d) {
    if (++d->tick == 0) {
        size_t V = (size_t)d->m->hp.n_vocab;
        memset(d->jmark, 0, V * sizeof *d->jmark);
        memset(d->umark, 0, V * sizeof *d->umark);
        d->tick = 1;
    }
    return d->tick;
}

/* The call's extras: each live job's context tokens outside the subset
 * (the latest first, DRAFT_EXTRA_MAX in all), and their union for the
 * passes' LM head. */
static void gather_extras(draft_runner *d, const draft_job *jobs, int n_jobs, const bool *live) {
    uint32_t call = next_tick(d);
    int nj = 0, nu = 0;
    for (int i = 0; i < n_jobs; i++) {
        d->jx0[i] = nj;
        if (!live[i]) continue;
        const draft_job *j = &jobs[i];
        uint32_t st = next_tick(d);
        for (int t = j->n_toks - 1; t >= 0 && nj < DRAFT_EXTRA_MAX; t--) {
            int32_t id = j->toks[t];
            if (d->in_sub[id] || d->jmark[id] == st) continue;
            d->jmark[id] = st;
            d->jx[nj++] = id;
            if (d->umark[id] != call) {
                d->umark[id] = call;
                d->ux[nu++] = id;
            }
        }
    }
    d->jx0[n_jobs] = nj;
    d->sel.extra = d->ux;
    d->sel.n_extra = nu;
    head_sub_gather(d->m, &d->sel);
}

/* Job i's row keeps only its own extras of the call's union. */
static void own_extras(draft_runner *d, int i, float *row) {
    int a = d->jx0[i], b = d->jx0[i + 1];
    if (b - a == d->sel.n_extra) return; /* its extras are the union */
    for (int k = a; k < b; k++) d->save[k - a] = row[d->jx[k]];
    for (int k = 0; k < d->sel.n_extra; k++) row[d->ux[k]] = -INFINITY;
    for (int k = a; k < b; k++) row[d->jx[k]] = d->save[k - a];
}

double draft_time_pass(draft_runner *d, int32_t tok) {
    char err[LM_ERRLEN];
    kv_seq *s = kv_seq_new(d->kv, err, sizeof err);
    if (!s) return -1;
    double t = -1;
    if (kv_append(d->kv, s, 1, err, sizeof err) == KV_OK) {
        lm_seg seg = {.seq = s, .pos0 = 0, .n = 1, .n_logits = 1};
        d->sel.n_extra = 0;
        d->fwd->head = d->sub ? &d->sel : NULL;
        double t0 = lm_now();
        if (fwd_run(d->fwd, &tok, &seg, 1, d->logits, err, sizeof err) == 0) t = lm_now() - t0;
        d->fwd->head = NULL;
    }
    kv_seq_free(d->kv, s);
    return t;
}

double draft_time_rows(draft_runner *d, int32_t tok, int n) {
    char err[LM_ERRLEN];
    kv_seq *s[64];
    if (n < 1 || n > d->max_seqs || n > d->n_batch || n > 64) return -1;
    int made = 0;
    double t = -1;
    for (; made < n; made++) {
        if (!(s[made] = kv_seq_new(d->kv, err, sizeof err))) break;
        if (kv_append(d->kv, s[made], 1, err, sizeof err) != KV_OK) {
            kv_seq_free(d->kv, s[made]);
            break;
        }
        d->segs[made] = (lm_seg){.seq = s[made], .pos0 = 0, .n = 1, .n_logits = 1};
        d->btok[made] = tok;
    }
    if (made == n) { /* the head its proposals use (the subset, when it has one) */
        d->sel.n_extra = 0;
        d->fwd->head = d->sub ? &d->sel : NULL;
        double t0 = lm_now();
        if (fwd_run(d->fwd, d->btok, d->segs, n, d->logits, err, sizeof err) == 0) t = lm_now() - t0;
        d->fwd->head = NULL;
    }
    for (int i = 0; i < made; i++) kv_seq_free(d->kv, s[i]);
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

static int cmp_id(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Job i's candidates in gids, ascending: the subset's ids and its own
 * extras, the only finite entries of its row (head_sub leaves -inf
 * elsewhere, own_extras the other jobs' extras). Returns their count. */
static int job_ids(draft_runner *d, int i) {
    int a = d->jx0[i], nx = d->jx0[i + 1] - a, n = d->sub->n, k = 0;
    memcpy(d->xs, d->jx + a, (size_t)nx * sizeof *d->xs);
    qsort(d->xs, (size_t)nx, sizeof *d->xs, cmp_id);
    const int32_t *ids = d->sub->ids;
    for (int p = 0, q = 0; p < n || q < nx;)
        d->gids[k++] = q >= nx || (p < n && ids[p] < d->xs[q]) ? ids[p++] : d->xs[q++];
    return k;
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
static bool guess(draft_runner *d, int ji, draft_job *j, lm_gmatch *g, float *row, float p_min, bool *last) {
    int32_t V = d->m->hp.n_vocab;
    lm_sampler *s = j->ds->smp;
    int32_t t;
    *last = false;
    if (g) { /* the target's row gets the same mask before its sampler */
        if (gmatch_mask(g, j->mask) <= 0) return false;
        grammar_mask_apply(j->mask, j->n_mask, row, V);
    }
    if (sampler_greedy(s) && d->sub && !g) {
        /* over the row's finite entries alone, ascending: the same argmax
         * (ties to the lower id) and the same top probability, summed in
         * the same order, as over the whole row */
        int n = job_ids(d, ji);
        t = sampler_sample_sparse(s, row, d->gids, n, d->gval);
        if (t < 0 || (p_min > 0 && top_prob(d->gval, n) < p_min)) return false;
    } else if (sampler_greedy(s)) {
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
    /* as the engine's engine_grammar_advance: an end-of-generation token leaves the state */
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
    if (d->sub) gather_extras(d, jobs, n_jobs, live);
    d->fwd->head = d->sub ? &d->sel : NULL;
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
            if (d->sub && (d->gw[i] || !sampler_greedy(j->ds->smp))) own_extras(d, i, d->logits + (size_t)row * V);
            if (!guess(d, i, j, d->gw[i], d->logits + (size_t)row++ * V, p_min, &last) || last || j->n_out >= j->k)
                live[i] = false;
        }
    }
    d->fwd->head = NULL;
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
