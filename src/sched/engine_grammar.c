/*
 * engine_grammar.c - the engine's constrained decoding (contract in
 * engine.h: a request's GBNF grammar, lazy with trigger strings): the cache
 * of compiled grammars with the per-vocabulary tables, under mu, and the
 * masking of a choice's logits and the grammar's step after each token.
 * It sees only its own state (egram) and a choice's; it never ends a
 * choice: a grammar that cannot go on returns why (egram_end) and the
 * engine finishes the choice.
 *
 * Threads. Submitters build the per-vocabulary tables (grammar_tables: the
 * vocabulary's byte trie and the two buffers the masking uses) and look a
 * grammar up in the cache under mu; a new one is compiled and probed
 * against the matcher's bounds (gmatch_probe) outside it, then kept under
 * mu again (engine_grammar_get);
 * request_new copies the start state into each choice
 * (engine_grammar_choice). Masks and steps (engine_grammar_pick,
 * engine_grammar_advance) run on the engine thread only, as does
 * engine_grammar_free when the engine is destroyed.
 *
 * Invariants. The tables are built once and never change. Every request
 * holds its own copy of its grammar's start state; the copies of one
 * grammar share its matcher's cache, which owns the compiled grammar and is
 * freed with the last copy, so dropping an entry from the engine's cache
 * never disturbs a request using it. Only the engine thread steps
 * matchers, so only it measures the kept ones (engine_grammar_trim). A
 * grammar a step found past the matcher's bounds is refused at submission
 * from then on (gmatch_spoiled; once trimmed, its entry keeps only the
 * reason, and is dropped like any other when least recently used). A
 * choice's parse
 * state depends only on the tokens it took, so forks, preemption and
 * batching leave the output unchanged. The mask bans tokens before the
 * sampler runs, as a logit bias would; the greedy and sparse shortcuts
 * take the same token as the masked row.
 *
 * Bounds. A grammar is at most ENGINE_MAX_GRAMMAR_BYTES of text (its
 * compilation grows faster than its size). The cache keeps at most
 * MAX_GRAMMARS grammars and cap_bytes (ENGINE_GRAMMAR_CACHE_BYTES) of them,
 * their matchers' caches included as last measured: a new one, and the
 * trim after an iteration, drop the least recently used until the rest
 * fit; one larger than the whole budget is never kept. Requests in flight
 * hold their grammars beyond the budget until they end;
 * gwork holds n_vocab floats, gmask (max(n_vocab, the trie's size) + 31) / 32
 * words. A lazy grammar's look-behind (lz) holds the longest trigger less
 * one byte plus one token's text (piece_cap).
 */
#include "sched/engine_int.h"

#include <pthread.h>
#include <string.h>

#include "base/util.h"
#include "decode/grammar.h"
#include "decode/sample.h"
#include "sched/stop.h"
#include "text/tokenizer.h"

/* ---- the grammar cache (submitters, under mu) ------------------------- */

/* The per-vocabulary grammar tables and buffers, built by the first request
 * with a grammar. 0, or -1 when out of memory. */
static int grammar_tables(egram *e) {
    int rc = 0;
    pthread_mutex_lock(&e->mu);
    if (!e->gvocab) {
        int32_t V = e->n_vocab;
        lm_gvocab *gv = grammar_vocab_new(e->tok, NULL, 0);
        int32_t n = gv ? (grammar_vocab_size(gv) > V ? grammar_vocab_size(gv) : V) : 0;
        e->gwork = lm_malloc((size_t)V * sizeof *e->gwork);
        e->gmask = lm_malloc((size_t)(n + 31) / 32 * sizeof *e->gmask);
        if (gv && e->gwork && e->gmask) e->gvocab = gv;
        else {
            grammar_vocab_free(gv);
            lm_free(e->gwork);
            lm_free(e->gmask);
            e->gwork = NULL, e->gmask = NULL;
            rc = -1;
        }
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

/* The kept entry for this text and root, or NULL (under mu). */
static gentry *cache_find(egram *e, const char *text, size_t len, const char *root) {
    for (int i = 0; i < e->n_gtab; i++) {
        gentry *t = e->gtab[i];
        if (t->len == len && !memcmp(t->text, text, len) && !strcmp(t->root, root)) return t;
    }
    return NULL;
}

/* The request's copy of a kept entry's start state, or LM_ERR_INVALID when
 * an earlier request found the grammar past the matcher's bounds (under
 * mu). */
static lm_status cache_use(egram *e, gentry *t, lm_gmatch **proto, char *err, size_t errlen) {
    t->used = ++e->tick;
    const char *why = t->spoiled ? t->spoiled : gmatch_spoiled(t->proto);
    if (why) return lm_err(err, errlen, "grammar: %s", why), LM_ERR_INVALID;
    if (!(*proto = gmatch_copy(t->proto))) return lm_err(err, errlen, "out of memory"), LM_ERR_NOMEM;
    return LM_OK;
}

static void entry_free(gentry *t) {
    if (!t) return;
    gmatch_free(t->proto); /* the grammar and its cache go with the last request's copy */
    lm_free(t->spoiled);
    lm_free(t->text);
    lm_free(t->root);
    lm_free(t);
}

/* Drop the least recently used kept grammar (under mu). Requests using it
 * keep their copies; only the cache lets go. */
static void cache_evict_lru(egram *e) {
    int old = 0;
    for (int i = 1; i < e->n_gtab; i++)
        if (e->gtab[i]->used < e->gtab[old]->used) old = i;
    gentry *t = e->gtab[old];
    e->kept_bytes -= t->bytes;
    e->gtab[old] = e->gtab[--e->n_gtab];
    e->evictions++;
    entry_free(t);
}

/* The request's grammar: a copy of the engine's compiled grammar for the
 * same text and root if it keeps one, else compiled now and kept when it
 * fits (dropping the least recently used for room). The compilation runs
 * outside mu, so a large grammar never holds up the requests that find
 * theirs kept; two requests compiling the same text at once keep the first
 * copy that is done. *proto is the request's own start state. LM_ERR_INVALID
 * for a bad grammar or one over ENGINE_MAX_GRAMMAR_BYTES, LM_ERR_NOMEM. */
lm_status engine_grammar_get(egram *e, const lm_request_params *p, lm_gmatch **proto, char *err, size_t errlen) {
    size_t len = p->grammar_len ? p->grammar_len : strlen(p->grammar);
    const char *root = p->grammar_root ? p->grammar_root : "root";
    if (len > ENGINE_MAX_GRAMMAR_BYTES)
        return lm_err(err, errlen, "grammar: %zu bytes, more than the %d a request may send", len,
                      ENGINE_MAX_GRAMMAR_BYTES),
               LM_ERR_INVALID;
    if (grammar_tables(e) != 0)
        return lm_err(err, errlen, "out of memory building the grammar's vocabulary tables"), LM_ERR_NOMEM;
    pthread_mutex_lock(&e->mu);
    gentry *kept = cache_find(e, p->grammar, len, root);
    lm_status rc = kept ? cache_use(e, kept, proto, err, errlen) : LM_OK;
    if (!kept) e->compiles++;
    pthread_mutex_unlock(&e->mu);
    if (kept) return rc;

    /* compile and probe, unlocked (gvocab never changes once built) */
    char gerr[LM_ERRLEN];
    lm_grammar *g = grammar_parse(p->grammar, len, root, gerr, sizeof gerr);
    if (!g) return lm_err(err, errlen, "grammar: %s", gerr), LM_ERR_INVALID;
    lm_gmatch *m = gmatch_new(g, e->gvocab, gerr, sizeof gerr);
    if (!m || gmatch_probe(m, gerr, sizeof gerr) < 0) { /* a grammar past the matcher's bounds is refused here */
        rc = m || !strstr(gerr, "out of memory") ? LM_ERR_INVALID : LM_ERR_NOMEM;
        gmatch_free(m);
        grammar_free(g);
        return lm_err(err, errlen, "grammar: %s", gerr), rc;
    }
    gmatch_own_grammar(m, g);
    size_t bytes = gmatch_bytes(m) + len + strlen(root) + 1 + sizeof(gentry);

    pthread_mutex_lock(&e->mu);
    if ((kept = cache_find(e, p->grammar, len, root))) { /* another request kept it meanwhile */
        rc = cache_use(e, kept, proto, err, errlen);
        pthread_mutex_unlock(&e->mu);
        gmatch_free(m);
        return rc;
    }
    gentry *t = bytes <= e->cap_bytes ? lm_calloc(1, sizeof *t) : NULL;
    if (t && (t->text = lm_strndup(p->grammar, len)) && (t->root = lm_strndup(root, strlen(root))) &&
        (*proto = gmatch_copy(m))) {
        while (e->n_gtab > 0 && (e->n_gtab == MAX_GRAMMARS || e->kept_bytes + bytes > e->cap_bytes)) cache_evict_lru(e);
        t->len = len, t->proto = m, t->bytes = bytes, t->used = ++e->tick;
        e->gtab[e->n_gtab++] = t;
        e->kept_bytes += bytes;
    } else { /* too large to keep, or no memory to keep it: the request's alone */
        if (t) lm_free(t->text), lm_free(t->root), lm_free(t);
        *proto = m;
    }
    pthread_mutex_unlock(&e->mu);
    return LM_OK;
}

/* Choice c's grammar state: a copy of the request's start state. 0, or -1
 * when out of memory. */
int engine_grammar_choice(egram *e, const lm_gmatch *proto, const stop_set *triggers, eseq *c) {
    c->gm = gmatch_copy(proto);
    if (!c->gm) return -1;
    c->gm_on = triggers->n == 0;
    if (!c->gm_on) {
        c->lz_cap = triggers->max_len - 1 + e->piece_cap;
        if (!(c->lz = lm_malloc((size_t)c->lz_cap))) return -1;
    }
    return 0;
}

/* ---- masking and stepping (the engine thread) -------------------------- */

/* Choice c's next token under its grammar: the tokens the grammar refuses
 * are set to -INFINITY before the sampler runs (as a banned logit bias, so
 * before penalties, top-k/p, min-p and temperature). Greedy shortcut: the
 * unconstrained argmax, when the grammar allows it, is the constrained one
 * (the sampler's order and tie-break are the same over fewer candidates).
 * When the mask allows few tokens the sampler runs over their list alone
 * (sampler_sample_sparse: the same token as over the masked row); greedy
 * goes there directly when the state's mask is cached. draft >= 0: verify
 * that proposed token against the masked row (sampler_sample_spec; greedy
 * takes its argmax as always and the caller compares). The token, or -2
 * with *end when the choice must end (no token continues the grammar, or
 * every token it allows is banned): the engine finishes it. */
int32_t engine_grammar_pick(egram *e, eseq *c, float *row, int32_t draft, const float *q, egram_end *end) {
    int32_t V = e->n_vocab;
    if (sampler_greedy(c->smp) && !gmatch_mask_cached(c->gm)) { /* (a cached mask is cheaper) */
        memcpy(e->gwork, row, (size_t)V * sizeof *row);
        int32_t t = sampler_sample(c->smp, e->gwork);
        if (t >= 0 && gmatch_allows(c->gm, t)) return t;
    }
    int32_t n = gmatch_mask(c->gm, e->gmask);
    if (n <= 0) {
        const char *why = gmatch_error(c->gm);
        lm_status st = !why ? LM_ERR_INTERNAL : gmatch_spoiled(c->gm) ? LM_ERR_INVALID : LM_ERR_NOMEM;
        *end = (egram_end){st, why ? why : "internal: no token continues the grammar"};
        return -2;
    }
    int32_t n_ids, t;
    const int32_t *ids = gmatch_mask_ids(c->gm, &n_ids);
    while (n_ids > 0 && ids[n_ids - 1] >= V) n_ids--; /* tokens without a logit */
    if (draft >= 0 && !sampler_greedy(c->smp)) {      /* a proposal to verify: over the masked row */
        grammar_mask_apply(e->gmask, grammar_vocab_size(e->gvocab), row, V);
        bool acc;
        t = sampler_sample_spec(c->smp, row, draft, q, &acc);
    } else if (ids) { /* few allowed: sample over them alone (the same token as over the masked row) */
        t = sampler_sample_sparse(c->smp, row, ids, n_ids, e->gwork);
    } else {
        grammar_mask_apply(e->gmask, grammar_vocab_size(e->gvocab), row, V);
        t = sampler_sample(c->smp, row);
    }
    if (t < 0) {
        *end = (egram_end){LM_ERR_INVALID, "every token the grammar allows is banned (logit_bias)"};
        return -2;
    }
    return t;
}

/* After token t: advance the grammar, or (a lazy one) look for a trigger
 * in the output's last bytes and start the grammar at its first byte. 0,
 * or -1 with *end when the choice must end (the engine finishes it). */
int engine_grammar_advance(egram *e, eseq *c, const stop_set *tr, int32_t t, egram_end *end) {
    e->stepped = true;
    if (c->gm_on) {
        if (tok_is_eog(e->tok, t) || gmatch_accept(c->gm, t) == 0) return 0;
        const char *why = gmatch_error(c->gm);
        *end = (egram_end){why ? LM_ERR_INVALID : LM_ERR_INTERNAL,
                           why ? why : "internal: the grammar refused the token it allowed"};
        return -1;
    }
    int w = tok_token_bytes(e->tok, t, false, c->lz + c->n_lz, c->lz_cap - c->n_lz);
    if (w < 0) w = 0;
    if (w > c->lz_cap - c->n_lz) w = c->lz_cap - c->n_lz;
    c->n_lz += w;
    int first = -1;
    for (int i = 0; i < tr->n; i++) {
        size_t n = strlen(tr->s[i]);
        for (int k = 0; k + (int)n <= c->n_lz; k++)
            if (memcmp(c->lz + k, tr->s[i], n) == 0) {
                if (first < 0 || k < first) first = k;
                break;
            }
    }
    if (first >= 0) {
        c->gm_on = true;
        if (gmatch_accept_bytes(c->gm, c->lz + first, (size_t)(c->n_lz - first)) < 0) {
            const char *why = gmatch_error(c->gm);
            *end = (egram_end){LM_ERR_INVALID,
                               why ? why : "the text from the grammar's trigger on does not match the grammar"};
            return -1;
        }
        return 0;
    }
    /* keep what could still begin a trigger */
    int keep = tr->max_len - 1;
    if (c->n_lz > keep) {
        memmove(c->lz, c->lz + c->n_lz - keep, (size_t)keep);
        c->n_lz = keep;
    }
    return 0;
}

/* Measure the kept grammars again (steps on the engine thread grow their
 * caches; no other thread changes them, so reading them here is safe) and
 * drop the least recently used until the rest fit. */
void engine_grammar_trim(egram *e) {
    if (!e->stepped) return;
    e->stepped = false;
    pthread_mutex_lock(&e->mu);
    size_t sum = 0;
    for (int i = 0; i < e->n_gtab; i++) {
        gentry *t = e->gtab[i];
        const char *why = t->proto ? gmatch_spoiled(t->proto) : NULL;
        char *keep = why ? lm_strndup(why, strlen(why)) : NULL;
        if (keep) { /* spoiled: keep only the reason, to refuse the text at submission */
            t->spoiled = keep;
            gmatch_free(t->proto);
            t->proto = NULL;
        }
        t->bytes =
            (t->proto ? gmatch_bytes(t->proto) : strlen(t->spoiled) + 1) + t->len + strlen(t->root) + 1 + sizeof *t;
        sum += t->bytes;
    }
    e->kept_bytes = sum;
    while (e->n_gtab > 0 && e->kept_bytes > e->cap_bytes) cache_evict_lru(e);
    pthread_mutex_unlock(&e->mu);
}

void engine_grammar_stats(egram *e, lm_engine_stats *st) {
    pthread_mutex_lock(&e->mu);
    st->grammar_cache_bytes = e->kept_bytes;
    st->grammar_cache_entries = e->n_gtab;
    st->grammar_compiles_total = e->compiles;
    st->grammar_evictions_total = e->evictions;
    pthread_mutex_unlock(&e->mu);
}

/* Free the grammar cache and the tables (the engine is being destroyed;
 * requests still holding copies keep their grammars). */
void engine_grammar_free(egram *e) {
    for (int i = 0; i < e->n_gtab; i++) entry_free(e->gtab[i]);
    grammar_vocab_free(e->gvocab);
    lm_free(e->gwork);
    lm_free(e->gmask);
    pthread_mutex_destroy(&e->mu);
}
