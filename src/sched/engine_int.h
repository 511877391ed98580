/*
 * engine_int.h - the engine's own objects, shared by the files that make up
 * the engine (engine.c: requests, the iteration, lifetime; engine_grammar.c:
 * the grammar cache and masking; engine_mem.c: the configuration's
 * defaults and the memory plan; engine_fair.c: clients' tags and the fair
 * share of the slots; engine_state.c: hybrid models' recurrent state;
 * engine_mtp.c: the model's states for the MTP proposer; engine_spec.c:
 * speculation's setup and prices; engine_embed.c: embedding requests). Nothing outside src/sched/engine*.c
 * includes it; everyone else sees the opaque handles of engine.h. The
 * speculation policy (spec_sched.h) and the proposers (proposer.h) are
 * objects the engine holds; they do not see these.
 *
 * Every field belongs to the engine thread except those engine.c marks as
 * guarded by mu or gr.mu. The functions here run on the engine thread.
 */
#ifndef LAMINA_ENGINE_INT_H
#define LAMINA_ENGINE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/pool.h"
#include "decode/grammar.h"
#include "decode/spec.h"
#include "kv/kv.h"
#include "kv/rstate.h"
#include "model/forward.h"
#include "model/tp_plan.h"
#include "sched/draft.h"
#include "sched/engine.h"
#include "sched/itl.h"
#include "sched/proposer.h"
#include "sched/sched.h"
#include "sched/spec_sched.h"
#include "sched/stop.h"

#define MAX_STOP_LEN 1024                             /* bytes of one stop string */
#define MAX_TRIGGERS 64                               /* lazy-grammar triggers of one request */
#define MAX_GRAMMARS 64                               /* compiled grammars the engine keeps for reuse */
#define ENGINE_GRAMMAR_CACHE_BYTES ((size_t)64 << 20) /* their memory, least recently used dropped first */
#define ENGINE_MAX_CLIENTS 4096                       /* clients counted for fairness at once (more: unordered) */
#define ENGINE_MAX_GRAMMAR_BYTES (256 << 10)          /* GBNF text of one request */

/* A compiled grammar kept for the requests that send the same text: they
 * share its matcher's cache (states, transitions, masks), so a schema
 * served many times computes each mask once. */
typedef struct {
    char *text; /* (len) the GBNF text */
    size_t len;
    char *root;       /* the start rule's name */
    lm_gmatch *proto; /* at the start; requests copy it; its cache owns the grammar (NULL once spoiled) */
    char *spoiled;    /* NULL, or why a step refused the grammar: it is refused at submission from then on */
    size_t bytes;     /* the grammar and its cache, as last measured (engine_grammar_trim) */
    uint64_t used;    /* when a request last took it (egram.tick), for least-recently-used eviction */
} gentry;

/* The engine's constrained decoding (engine_grammar.c): built on the first
 * request with a grammar. */
typedef struct {
    const lm_tokenizer *tok;
    int32_t n_vocab;
    int piece_cap;              /* one token's text at most (a lazy grammar's look-behind) */
    pthread_mutex_t mu;         /* guards gvocab's creation, gtab and the counts below (submitters) */
    lm_gvocab *gvocab;          /* the vocabulary's byte trie, shared by every grammar */
    gentry *gtab[MAX_GRAMMARS]; /* (n_gtab) grammars kept for reuse (under mu) */
    int n_gtab;
    size_t cap_bytes;   /* the kept grammars' bytes at most (ENGINE_GRAMMAR_CACHE_BYTES or tuning) */
    size_t kept_bytes;  /* sum of gtab[i]->bytes */
    uint64_t tick;      /* uses so far (LRU clock) */
    uint64_t compiles;  /* grammars compiled (cache misses) */
    uint64_t evictions; /* kept grammars dropped for room */
    bool stepped;       /* (engine thread) a choice stepped a grammar since the last trim */
    float *gwork;       /* (n_vocab) a logits copy for the greedy shortcut, or the allowed tokens' logits */
    uint32_t *gmask;    /* ((max(n_vocab, gvocab size) + 31) / 32) allowed tokens */
} egram;

/* Why the grammar ended a choice: the engine finishes it with an error of
 * this kind and text. */
typedef struct {
    lm_status status;
    const char *error;
} egram_end;

typedef enum { CH_PENDING_FORK, CH_LIVE, CH_DONE } ch_state;

typedef struct eseq {
    sched_seq sq; /* the scheduler's handle: first, so a sched_seq * is the choice */
    struct lm_request *req;
    int index;
    ch_state state;  /* CH_LIVE: queued in the scheduler (sq.where) */
    int32_t *tokens; /* (cap) prompt then generated */
    int n_tokens, cap, n_prompt;
    int n_computed; /* KV positions written */
    int n_gen;
    kv_seq *kv;    /* NULL unless running */
    kv_seq *probe; /* this iteration's admission probe, or NULL */
    int rslot;     /* hybrid models: its live slot in the state store while it runs, else -1 */
    float **rptr;  /* (2 n_rlayer) hybrid models: the slot's conv windows, then its matrices (lm_seg) */
    int n_defer;   /* hybrid models: iterations in a row its prompt chunk waited for the grid (engine_state_trim) */
    int snap_k;    /* hybrid models: its probe's KV match ends at the snapshot of block snap_k - 1, restored */
    uint8_t snap_key[KV_KEY_LEN]; /*   at admission (0: none), under this key */
    int snap_at;                  /*   the snapshot point below its last probe's uncut match (0: none) */
    lm_sampler *smp;
    lm_detok dt;
    stop_text held; /* released text not yet emitted (stop-string look-behind) */
    bool stop_hit;  /* a stop string ended the text */
    lm_gmatch *gm;  /* the grammar's parse state (NULL: no grammar) */
    bool gm_on;     /* the grammar constrains now (a lazy one: after a trigger) */
    char *lz;       /* (lz_cap) lazy grammar: the output's last bytes, searched for triggers */
    int n_lz, lz_cap;
    spec_pseq ps;           /* speculation: the proposer's state, this iteration's proposal in ps.guess */
    int n_draft;            /*   of it in this iteration's batch (0: a plain decode) */
    int spec_k;             /*   the most it proposes per step (0: it does not speculate) */
    spec_ctl ctl;           /*   the proposal's size, from its acceptance so far (the policy's) */
    int n_prop;             /*   proposed this iteration (n_draft of them in the batch) */
    float *q;               /*   (n_prop, n_vocab) the guesses' distributions (sampling), or NULL */
    int32_t pre;            /* this iteration's token, drawn ahead on the pool (presample), or PRE_NONE */
    uint64_t pre_iter;      /*   the iteration that drew it (a draw is never used in another) */
    struct embed_pool *emb; /* an embedding request: the pooling of its rows (embed.h), else NULL */
    lm_request_stats stats;
} eseq;

#define PRE_NONE (-3)

struct lm_request {
    atomic_int refs; /* engine + submitter (when it asked for a handle) */
    atomic_bool cancel;
    lm_request_params p;     /* as submitted; prompt, text and bias cleared (the choices and
                                 samplers hold them), stop pointing into `stop`, max_tokens resolved */
    stop_set stop;           /* owned copies of the stop strings */
    lm_gmatch *gproto;       /* the grammar's start state, which choices copy (the request's own copy) */
    stop_set triggers;       /* owned copies of the lazy grammar's triggers */
    int n_live;              /* choices not yet done */
    bool counted;            /* its choices count in the engine's clients (p.client) */
    bool started;            /* a choice of it has been admitted (it no longer waits) */
    eseq *ch;                /* (p.n) */
    struct lm_request *next; /* inbox link */
};

struct lm_engine {
    const lm_model *m;
    const lm_tokenizer *tok;
    lm_engine_config cfg;    /* resolved; cfg.spec points to spec, or NULL */
    lm_spec_config spec;     /* speculation's settings, resolved */
    const char *spec_widths; /* engine_tuning's width curve (read by spec_setup only) */
    int n_ctx;
    lm_pool *pool;
    kv_pool *kv;
    rstate_pool *rs;          /* hybrid models: the recurrent state store, a live slot per running choice,
                                 snapshots and checkpoints (engine_ckpt_slots); else NULL */
    int ck_left;              /*   checkpoints this iteration's wishes have not yet promised */
    int snap_grid;            /*   the snapshot points' grid: lcm(block size, GDN_CHUNK) positions */
    uint64_t snap_cut_blocks; /*   KV prefix-hit blocks cut back to a snapshot (not counted as hits) */
    lm_fwd *fwd;              /* the forward pass's workspace: batch_tokens rows */
    sched *sc;
    itl_pred itl; /* the latency bound's pass-time predictor (itl.h): set at engine_new, fed by step */
    int n_class;  /* KV block classes */
    int64_t total_blocks[KV_N_CLASS];
    int64_t local_per_seq; /* most local blocks one sequence holds (0: no window) */

    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t wake;    /* engine thread: work arrived */
    pthread_cond_t idle_cv; /* waiters of engine_wait_idle / engine_check */
    bool stop;
    lm_request *inbox, *inbox_tail;
    int n_inbox;
    int n_req_waiting; /* requests submitted and not yet started or finished (max_waiting counts these) */
    uint64_t next_arrival;
    /* fair queuing (under mu): the clients with choices not yet finished, how many and
     * their last tag; vtime, the largest tag admitted so far */
    struct eclient {
        uint64_t id;
        int n;
        int64_t last;
    } * clients;
    int n_clients, clients_cap;
    int64_t vtime;
    bool check_req, check_done;
    int check_rc;
    char check_msg[LM_ERRLEN];

    /* per-iteration buffers */
    int32_t *btok; /* (batch_tokens) */
    lm_seg *segs;  /* (max_seqs) */
    eseq **seg_ch; /* (max_seqs) */
    eseq **probes; /* (2 max_seqs + 2) choices holding a probe this iteration */
    eseq **job_ch; /* (max_seqs) the choice of each proposal job */
    int n_probes;
    float *logits;       /* (max_seqs + spec_cap + 2, n_vocab): batch rows, a fork's source and work rows */
    int spec_cap;        /* proposed tokens one iteration verifies at most (0: no proposer) */
    spec_proposer *prop; /* the proposer (proposer.h), or NULL */
    draft_runner *dr;    /*   its draft model's runner (LM_SPEC_DRAFT), or NULL */
    spec_policy pol;     /* the speculation policy (spec_sched.h): its decisions */
    spec_view *views;    /*   (max_seqs) the running choices as it sees them */
    eseq **want_ch;      /*   (max_seqs) the choices of its wishes, in order */
    spec_job *jobs;      /* (max_seqs) this iteration's proposals made after the sizing */
    float *dq;           /* (spec_cap, n_vocab) their distributions, made on the first sampled one */
    float *lp;           /* (n_vocab) log-probabilities / sampling scratch */
    char *piece;         /* (piece_cap) one token's text: detok_max_out bytes */
    int piece_cap;
    char *emit; /* (emit_cap) text of one event: held text, a piece and a flush */
    int emit_cap;
    uint64_t plan_misses; /* appends a plan allowed that failed (engine_check reports them) */
    eseq **pre_ch;        /* (max_seqs) presample: the choices sampled on the pool */
    float **pre_row;      /* (max_seqs) and their logits rows */
    int n_pre;
    uint64_t iter;         /* iterations with a forward pass, counted */
    bool serial_sampling;  /* engine_set_serial_sampling: no presample (for comparisons) */
    bool prof_on;          /* engine_set_profile: time the parts of each iteration */
    engine_profile_t prof; /* (engine thread) what they took */

    egram gr; /* constrained decoding */

    float *emb_hid; /* (batch_tokens, n_embd) the rows' states of passes with embedding requests' rows
                       (lm_fwd.hid), made at engine_new and counted in the workspace
                       (engine_embed_hid_bytes); NULL under the MTP proposer (its buffer) or
                       pipeline parallelism */

    lm_engine_stats stats; /* published under mu */
};

#define CHOICE(q) ((eseq *)(q))

/* ---- engine_grammar.c: constrained decoding ----------------------------- */

/* Any thread: request p's grammar, the cache's compiled copy of the same
 * text and root, else compiled now (and kept when it fits the cache);
 * builds the per-vocabulary tables on first use. *proto is its start
 * state, the request's own (gmatch_free it; the grammar goes with the last
 * copy). LM_OK, LM_ERR_INVALID for a bad grammar or one past the matcher's
 * bounds, LM_ERR_NOMEM. */
lm_status engine_grammar_get(egram *g, const lm_request_params *p, lm_gmatch **proto, char *err, size_t errlen);
/* Choice c's grammar state, a copy of the start state proto, and a lazy
 * grammar's look-behind buffer (triggers: the request's). 0, or -1 when
 * out of memory. */
int engine_grammar_choice(egram *g, const lm_gmatch *proto, const stop_set *triggers, eseq *c);
/* Choice c's next token from its logits row (modified) under its grammar's
 * mask; draft >= 0: a proposed token the row verifies, q its distribution
 * or NULL. The token, or -2 with *end: the choice must end with that
 * error. */
int32_t engine_grammar_pick(egram *g, eseq *c, float *row, int32_t draft, const float *q, egram_end *end);
/* After token t: the grammar's step, or a lazy grammar's search for its
 * triggers. 0, or -1 with *end: the choice must end with that error. */
int engine_grammar_advance(egram *g, eseq *c, const stop_set *triggers, int32_t t, egram_end *end);
/* Engine thread, after an iteration: measure the kept grammars' caches
 * (their steps grow them) and drop the least recently used past the
 * cache's bytes. Cheap when no choice stepped a grammar. */
void engine_grammar_trim(egram *g);
/* The cache's figures for the engine's stats (any thread). */
void engine_grammar_stats(egram *g, lm_engine_stats *st);
/* Free the cache and the tables (engine destruction). */
void engine_grammar_free(egram *g);

/* ---- engine.c, for the files below ---------------------------------------- */

/* Free running choice c's KV and state; the scheduler already moved it to
 * waiting (it recomputes from position 0 with the same output). */
void engine_preempt(lm_engine *e, eseq *c);

/* ---- engine_fair.c: fairness between clients ----------------------------- */

/* Under mu: the first of n fair-queuing tags for a request of client id
 * (0: none, tags 0); *counted says whether the client is remembered. */
int64_t engine_client_take(lm_engine *e, uint64_t id, int n, bool *counted);
/* Under mu: one choice of client id finished. */
void engine_client_done(lm_engine *e, uint64_t id);
/* Choice c was admitted: the virtual time reaches its tag and its request
 * no longer waits (takes mu). */
void engine_request_started(lm_engine *e, eseq *c);
/* Request r ended with no choice admitted: it no longer waits (takes mu). */
void engine_request_ended_waiting(lm_engine *e, lm_request *r);
/* Engine thread, before planning: when every slot runs and a client with
 * nothing running waits, preempt one choice of the largest holder for it. */
void engine_fair_preempt(lm_engine *e);

/* ---- engine_state.c: hybrid models' recurrent state --------------------- */

#define STATE_MAX_DEFER 16 /* iterations in a row a hybrid prompt waits for a chunk on the grid */

/* Once the state store and the KV pool exist: the snapshot grid, and the
 * KV pool's eviction hook dropping a snapshot with its block. */
void engine_state_init(lm_engine *e);
/* A live slot for c: a copy of from's (a fork; NULL: none), else the
 * snapshot c's admitted probe matched (engine_state_match), else zeroed;
 * its pointers bound. 0, or -1 with a message. No-op without recurrent
 * layers. */
int engine_state_take(lm_engine *e, eseq *c, const eseq *from, char *err, size_t errlen);
/* Give c's slot back (none held: no-op). */
void engine_state_drop(lm_engine *e, eseq *c);
/* After kv_prefix_match on c's probe: cut the match back to the longest
 * prefix with a state snapshot, kept for the admission. No-op without
 * recurrent layers. */
void engine_state_match(lm_engine *e, eseq *c);
/* After a pass fed c (its prompt's blocks committed): save a snapshot when
 * its state stands on a snapshot point of its prompt. */
void engine_state_save(lm_engine *e, eseq *c);
/* Of the n tokens the plan gives c, those it feeds now (0: it waits), so
 * that a hybrid prompt splits only on the grid, its end and its snapshot
 * points, and a non-causal model's prompt not at all; n otherwise (no
 * recurrent layers, or a decode). */
int engine_state_trim(const lm_engine *e, eseq *c, int n, bool busy);
/* The snapshots' figures into st, prefix hits less the cut ones (mu held). */
void engine_state_stats(const lm_engine *e, lm_engine_stats *st);
/* Speculation on a hybrid model: a verification segment of n tokens (the
 * pending one and n - 1 proposals, any proposer) needs n checkpoints, and
 * every wish of an iteration is bounded by what is free.
 * engine_state_iter: the iteration's count starts from the free ones.
 * engine_state_wish: wish bounded by the checkpoints left (one for the
 * pending token, one per proposal: fewer, or 0 when short; a cut is
 * counted), unchanged without recurrent layers. engine_state_promise: a
 * queued wish of k takes k + 1 of them. */
void engine_state_iter(lm_engine *e);
int engine_state_wish(lm_engine *e, int wish);
void engine_state_promise(lm_engine *e, int k);
/* Before c's verification segment of n tokens from c->n_computed enters
 * the batch: reserve its checkpoints. n, or 1 (no proposal: a plain
 * decode) when they cannot be had. n without recurrent layers. */
int engine_state_reserve(lm_engine *e, eseq *c, int n);
/* After c's verification (c->n_computed: the position after its last
 * accepted token): restore the state of that position unless every
 * proposal was accepted (a rollback, counted), and release the
 * checkpoints. 0, or -1 with a message. */
int engine_state_rollback(lm_engine *e, eseq *c, char *err, size_t errlen);

/* ---- engine_mtp.c: the target's states for the MTP proposer ------------- */

/* After this iteration's pass: hand the proposer c's settled positions of
 * its segment (segment start .. c->n_computed) with their rows of the
 * pass's states (lm_fwd.hid). No-op when the proposer wants none or c has
 * no segment in the batch. */
void engine_mtp_feed(lm_engine *e, eseq *c);

/* ---- engine_embed.c: embedding requests --------------------------------- */

/* Submission, every request: p without embed is LM_OK (*q untouched) but on
 * a model that only embeds (an encoder, a non-causal model: LM_ERR_INVALID).
 * p with embed as the engine runs it, into *q: its pooling resolved, one
 * token wanted and no sampling extras. LM_OK, LM_ERR_INVALID (n not 1, a bad
 * pooling, a generative model without one), LM_ERR_TOO_LONG (a non-causal
 * input past the batch), LM_ERR_UNSUPPORTED (pipeline parallelism). */
lm_status engine_embed_params(const lm_engine *e, const lm_request_params *p, lm_request_params *q, char *err,
                              size_t errlen);
/* Submission, any thread: a new request's pooling (its choice's emb), with
 * the model's post-pooling projections. NULL when out of memory. */
struct embed_pool *engine_embed_pool(lm_engine *e, int pooling);
/* Before the pass over n_seg segments: lm_fwd.hid set when one of them is
 * an embedding's (the MTP proposer's buffer is kept). */
void engine_embed_begin(lm_engine *e, int n_seg);
/* After the pass, for segment g of an embedding (n_computed advanced): pool
 * its rows; whether its prompt is complete (engine.c then finishes it). */
bool engine_embed_feed(lm_engine *e, int g);

/* ---- engine_spec.c: speculation's setup -------------------------------- */

/* At engine_new, once the pool, workspace and buffers are made: the
 * proposer (a draft model's runner: dkc its pool's configuration), the
 * policy and its prices (passes timed on a scratch sequence). No-op
 * without speculation. 0, or -1 with a message. */
int engine_spec_setup(lm_engine *e, const kv_config *dkc, char *err, size_t errlen);

/* ---- engine_mem.c: the configuration and the memory plan ---------------- */

/* Defaults and bounds of configuration c (resolved in place; its
 * speculation settings read into *spec and resolved there, c->spec then
 * pointing to it), and the forward pass's dims: 0, or -1 with a message
 * (an invalid configuration). */
int engine_resolve_config(const lm_model *m, lm_engine_config *c, lm_spec_config *spec, fwd_dims *dims, char *err,
                          size_t errlen);
/* A resolved configuration's proposer: LM_SPEC_NONE without speculation. */
static inline int engine_spec_kind(const lm_engine_config *c) { return c->spec ? c->spec->proposer : LM_SPEC_NONE; }
/* The split of the memory for resolved configuration c (engine_mem_plan
 * after engine_resolve_config): 0, or -1 with a message. */
int engine_mem_split(const lm_model *m, const lm_engine_config *c, const fwd_dims *dims, engine_mem *o, char *err,
                     size_t errlen);
/* Checkpoint slots of a hybrid model's state store under resolved c. */
int engine_ckpt_slots(const lm_engine_config *c);
/* The engine's own large buffers under resolved c: the logits rows, one
 * log-probability row, the batch's tokens, the embeddings' rows (a part of
 * the workspace). */
uint64_t engine_buffer_bytes(const lm_model *m, const lm_engine_config *c);
/* Of those, the embeddings' rows (emb_hid): batch_tokens x n_embd floats;
 * 0 under the MTP proposer or pipeline parallelism. */
uint64_t engine_embed_hid_bytes(const lm_model *m, const lm_engine_config *c);

#endif
