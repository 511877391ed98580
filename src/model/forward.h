/*
 * forward.h - the forward pass: a batch workspace that runs a flat batch of
 * tokens from many sequences, and a single-sequence helper built on it.
 *
 * The batch budget. One number, n_batch (fwd_dims), is the most tokens one
 * forward pass takes. It sizes the workspace's activation rows, the
 * engine's token budget per iteration and the most positions one kv_append
 * adds to a sequence (kv_config.chunk, which sizes the sliding-window
 * layers' blocks, kv.h). If those disagreed, a pass could overrun its
 * buffers or a sequence hold more local blocks than its pool planned, so
 * all of them take it from fwd_dims_make and fwd_kv_config below, and
 * fwd_new refuses a windowed pool planned for shorter appends.
 *
 * lm_fwd, the workspace: the activation buffers for up to n_batch tokens,
 * attention scratch per thread, quantized activations and the profile
 * counters, allocated once in fwd_new. It holds no sequence: fwd_run runs
 * segments of sequences that live in the workspace's KV pool (the engine's
 * batch). The linear layers run once over all the batch's tokens (each
 * weight read once per pass), attention per segment over its own blocks,
 * and only the rows that want logits go through the LM head.
 *
 * lm_seqrun, one sequence: a workspace, a KV sequence in its own pool or a
 * shared one, and n_past. seqrun_forward appends n tokens at positions
 * n_past .. n_past+n-1 in passes of at most n_batch tokens. For perplexity,
 * bench, single-prompt generation (`lamina run`) and tests.
 */
#ifndef LAMINA_FORWARD_H
#define LAMINA_FORWARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/attn.h"
#include "kv/kv.h"
#include "kv/rstate.h"
#include "model/model.h"
#include "base/pool.h"

/* ---- the batch budget ---------------------------------------------------- */

/* Tokens per forward pass unless a caller asks for another number. */
#define FWD_BATCH_DEFAULT 512

typedef struct {
    int n_ctx;   /* positions one sequence may hold, >= 1 */
    int n_batch; /* tokens per forward pass, 1 .. n_ctx */
} fwd_dims;

/* The one place batch sizes are derived: n_ctx <= 0 takes the model's
 * training context; n_batch <= 0 takes FWD_BATCH_DEFAULT, and n_batch never
 * exceeds n_ctx (no pass holds more than one context). */
fwd_dims fwd_dims_make(const lm_model *m, int n_ctx, int n_batch);

/* The KV pool config for sequences run with dims d (kv_config_init's
 * defaults otherwise): the model's layers, KV heads and head dim, its
 * sliding-window layers as the pool's local class (c->layer_local points
 * into the model), n_ctx = d->n_ctx and chunk = d->n_batch. */
void fwd_kv_config(const lm_model *m, const fwd_dims *d, kv_config *c);

/* ---- the batch workspace ------------------------------------------------- */

/* Where a forward pass spends its time (seconds, accumulated while
 * lm_fwd.profile is set). */
enum {
    LM_PROF_EMBED,
    LM_PROF_NORM,
    LM_PROF_QKV,
    LM_PROF_ROPE,
    LM_PROF_ATTN,
    LM_PROF_RECUR, /* recurrent layers (gdn.h): projections, conv, gates, delta rule, gated norm */
    LM_PROF_WO,
    LM_PROF_FFN_UP,
    LM_PROF_FFN_ACT,
    LM_PROF_FFN_DOWN,
    LM_PROF_LM_HEAD,
    LM_PROF_COUNT
};
extern const char *const lm_prof_names[LM_PROF_COUNT];

typedef struct lm_fwd {
    const lm_model *m;
    lm_pool *pool;      /* not owned */
    kv_pool *kv;        /* not owned: where the sequences of fwd_run live */
    fwd_dims dims;      /* n_batch: rows of every buffer below; n_ctx: a segment's last position + 1 */
    attn_scratch **scr; /* (n_scr) attention scratch, one per pool thread */
    int n_scr;
    struct fwd_run *run; /* (n_scr) each pool thread's run of attention units (forward.c) */
    float *x;            /* (n_batch, n_embd) residual stream */
    float *xb;           /* (n_batch, max(n_embd, q_dim)) normed input / attention output */
    float *q;            /* (n_batch, n_head * head_dim) */
    float *k, *v;        /* (n_batch, n_head_kv * head_dim) */
    float *hb, *hb2;     /* (n_batch, max(n_ff, n_embd)), (n_batch, n_ff) */
    float *cs;           /* (n_batch, n_rot) rope cos/sin */
    int *pos;            /* (n_batch) each row's position */
    int *seg_row0;       /* (n_batch + 1) a segment's first row */
    int *seg_item0;      /* (n_batch + 1) a segment's first attention work item */
    int *seg_unit0;      /* (n_batch + 1) a segment's first split-K unit (forward.c's attention plan) */
    int *seg_units;      /* (n_batch) split-K units per work item of a segment: 1, or its splits' share */
    size_t *seg_part0;   /* (n_batch) where a split segment's partials start in part */
    float *part;         /* (part_cap) split-K partials (attn_tile_part), NULL when a thread alone */
    size_t part_cap;
    int attn_split_min;    /* split-K: the fewest key splits an item is cut from; 0: off (whole items
                           only). FWD_ATTN_SPLIT_MIN, or LAMINA_ATTN_SPLIT read by fwd_new */
    long attn_split_items; /* items attention has cut into units so far (tests, profiles) */

    /* attention units planned so far, and run: equal after every pass, each
     * unit run once whichever thread took it (tests) */
    long attn_units_planned;
    _Atomic long attn_units_run;

    struct moe_ws *moe; /* the expert workspace (moe.h), NULL without experts */
    struct mla_ws *mla; /* the latent attention workspace (mla.h), NULL without it */
    struct gdn_ws *gdn; /* the linear attention workspace (gdn.h), NULL without recurrent layers */
    float *qg, *gate;   /* (n_batch, 2 q_dim), (n_batch, q_dim) gated attention's query and gate
                             (hp.attn_gate), else NULL */
    void *act;          /* quantized activations for ops_matmul */
    size_t act_bytes;
    size_t ws_bytes; /* every byte of the workspace allocated by fwd_new (fwd_workspace_bytes) */
    bool profile;    /* accumulate per-op times into prof[] */
    double prof[LM_PROF_COUNT];
    double prof_gap[LM_PROF_COUNT];    /* of prof[]: the pool's dispatch time (pool_timing, when enabled) */
    double prof_gap_mark;              /* pool_timing wait_s at the last profile mark */
    double prof_sleeps[LM_PROF_COUNT]; /* of prof[]'s pool runs: those a worker met asleep (pool_timing) */
    long prof_sleep_mark;              /* pool_timing sleeps at the last profile mark */
    const struct fwd_head_sel *head;   /* NULL: the whole LM head; else logits over a subset (below) */
    float *hid; /* (n_batch, n_embd) not owned, NULL (default): none. When set, a pass that runs the
                   model's end writes every row's state after the final norm here, in batch order
                   (the next-token-prediction head's input, mtp.h) */
} lm_fwd;

/* Decode attention's split-K (forward.c's attn_plan): when a layer's
 * attention items are fewer than the pool's threads, a one-tile causal item
 * of at least this many key splits (ATTN_SPLIT keys each) is cut into one
 * unit per split, spread over the threads and merged in one order (the bits
 * of the item run whole). The environment variable LAMINA_ATTN_SPLIT, read
 * once by fwd_new, overrides it: 0 turns split-K off, N >= 1 cuts items
 * from max(N, 2) splits; anything else makes fwd_new fail with a message. */
#define FWD_ATTN_SPLIT_MIN 2

/* A workspace for passes of up to d->n_batch tokens over sequences of kv
 * (which must outlive it). Fails when kv has sliding-window layers planned
 * for appends shorter than n_batch (kv_plan.chunk), or LAMINA_ATTN_SPLIT is
 * malformed. */
lm_fwd *fwd_new(const lm_model *m, lm_pool *pool, kv_pool *kv, const fwd_dims *d, char *err, size_t errlen);
/* The bytes fwd_new allocates for its buffers with n_threads pool threads
 * (activations, per-thread attention scratch, the matmul activation scratch,
 * the expert workspace), known before any pool exists: the memory budget
 * subtracts it before sizing the KV pool. Equals the new lm_fwd's ws_bytes. */
size_t fwd_workspace_bytes(const lm_model *m, const fwd_dims *d, int n_threads);
void fwd_free(lm_fwd *f);

/*
 * Many sequences in one pass (the engine's batch): segment g runs tokens
 * [row0, row0 + n) of the flat token array at positions pos0 .. pos0+n-1 of
 * its own sequence seq, which must live in f->kv and already hold those
 * positions (kv_append; with sliding-window layers pos0 must not precede
 * the length seq had before that append, see kv.h). logits receives,
 * segment after segment, the rows of each segment's last n_logits tokens
 * (may be NULL when no segment wants any). Rows never interact, so a row's
 * result does not depend on the rest of the batch. Fails without running
 * when the batch exceeds dims.n_batch tokens, a segment is malformed or
 * passes dims.n_ctx, or a token id is out of range.
 */
typedef struct {
    kv_seq *seq;
    int pos0, n;
    int n_logits; /* 0 .. n */
    /* with recurrent layers (m->hp.n_rlayer > 0; gdn.h): the sequence's
     * state per recurrent layer r, the conv window rconv[r] (K - 1, conv)
     * and the matrices rmat[r] (hv, dk, dv), holding position pos0 - 1's
     * state (zeros at 0) and left at pos0 + n - 1's; NULL otherwise. The
     * arrays have n_rlayer entries; only those of this pipeline stage's
     * recurrent layers (lm_pp.rec0 .. rec1) are read, and a stage without
     * any may pass NULL. Under tensor parallelism hv and conv are this
     * rank's (its heads' state only: shard.c). */
    float *const *rconv, *const *rmat;
    /* a verification segment's checkpoints (speculative decoding, with
     * rconv and rmat): the state store holding them and the live slot whose
     * reservation covers positions pos0+1 .. pos0+n (rstate.h). Its
     * recurrent layers then run token by token (the recurrence, as decoding
     * one token at a time runs them: the same bits) and leave each layer's
     * state after the token at pos0+i in the checkpoint of position
     * pos0+i+1; the live state still ends at pos0+n-1's. NULL: none */
    rstate_pool *ck;
    int ck_slot;
} lm_seg;
int fwd_run(lm_fwd *f, const int32_t *tokens, const lm_seg *segs, int n_seg, float *logits, char *err, size_t errlen);

/* ---- the local pass ------------------------------------------------------ */

/*
 * fwd_run is a runner (run.c) over the local pass below: it checks the
 * batch, sends a serving leader's plan (tp_plan.c) and runs this rank's part
 * (pp.c: the pipeline's micro-batches and stages, the tensor-parallel hooks).
 * The local pass computes layers [layer0, layer1) of this process's model
 * for one batch and knows nothing of the other ranks: where a shard's
 * products are partial sums (m->tp.size > 1) it calls the span's hooks.
 *
 * Each layer is an attention block (multi-head, or latent for deepseek2:
 * mla.h), its output product and residual add, then an FFN block (dense, or
 * experts: moe.h), its residual add; after the span's last layer, when it
 * holds the model's end, the final norm and the LM head (whole, this rank's
 * vocabulary slice gathered by the hooks, or a draft's subset: head_sub.c)
 * for the rows that want logits.
 */

/* What a tensor-parallel shard's pass, or an expert-parallel one's MoE
 * layers, need from the ranks of its group; each returns 0, or -1 with a
 * message. */
typedef struct {
    /* x (count floats): replaced on every rank by the sum of every rank's x,
     * added in rank order (the same bits on every rank) */
    int (*reduce)(float *x, size_t count, char *err, size_t errlen);
    /* out (rows, sum of cols): row r holds every rank's part row r, rank
     * after rank; part is this rank's (rows, cols[rank]) and may alias the
     * front of out */
    int (*gather_cols)(const float *part, int rows, const int *cols, float *out, char *err, size_t errlen);
    /* expert parallelism (ep.h), inside the expert group (its ranks are
     * m->ep's; with --tp too, the ranks of this tensor rank): send_n[r]
     * elements of elem bytes to rank r, recv_n[r] from it, each side rank
     * after rank (dist_alltoallv); and gather_cols over that group */
    int (*alltoallv)(const void *send, const int *send_n, void *recv, const int *recv_n, size_t elem, char *err,
                     size_t errlen);
    int (*gather_ep)(const float *part, int rows, const int *cols, float *out, char *err, size_t errlen);
} fwd_hooks;

/* The part of the model one local pass runs. */
typedef struct {
    int layer0, layer1;     /* layers [layer0, layer1), inside m->pp's */
    bool embed;             /* x from the tokens' embeddings; else x holds the rows' input (a stage's) */
    bool head;              /* after the layers, the final norm and LM head for the rows that want logits */
    const fwd_hooks *hooks; /* needed when m->tp.size > 1 or m->ep.size > 1; NULL for a whole model */
} fwd_span;

/* The span of m's pipeline stage (the whole model without pipeline
 * parallelism): its layers, embedding on stage 0, the head on the last. */
fwd_span fwd_span_stage(const lm_model *m, const fwd_hooks *hooks);

/* fwd_run's checks of a batch (its contract above): 0 with *n the batch's
 * tokens, or -1 with a message. */
int fwd_check(const lm_fwd *f, const int32_t *tokens, const lm_seg *segs, int n_seg, int *n, char *err, size_t errlen);

/* One local pass over the n tokens of segs (checked, as fwd_check does):
 * span's layers over f->x (embedded first when span->embed), then with
 * span->head and logits not NULL the logits rows as fwd_run writes them;
 * without span->head, f->x (n, n_embd) holds the rows' output. Fails only
 * when a hook does, or (without running) when the span is not inside the
 * model's layers or a shard has no hooks. */
int fwd_pass(lm_fwd *f, const fwd_span *span, const int32_t *tokens, int n, const lm_seg *segs, int n_seg,
             float *logits, char *err, size_t errlen);

/* ---- an LM head over a vocabulary subset (head_sub.c) --------------------- */

/*
 * A draft model guesses from logits of a few tokens only: the LM head's
 * rows of a fixed subset, copied at load into a packed matrix of their own
 * (head_sub), plus a short list of extra token ids whose rows are gathered
 * for a few passes (fwd_head_sel, head_sub_gather). With f->head set,
 * every logits row fwd_run writes holds the head's product (and softcap)
 * for those tokens, the same values as the whole head's within float
 * rounding (the same kernels on the same rows: the type's packed kernel on
 * the subset, the row-major one on the extras), and -inf for every other
 * token. Never with tensor or
 * pipeline parallelism (head_sub_new refuses). The target never sets it.
 */
typedef struct {
    lm_weight w;  /* (n, n_embd) the subset's rows of the LM head, in its type (packed when the
                             kernels have a packed form) */
    int32_t *ids; /* (n) their token ids, ascending */
    int n;
    void *mem;    /* owns w's rows and packed copy */
    size_t bytes; /* of mem and ids: head_sub_bytes */
} lm_head_sub;

typedef struct fwd_head_sel {
    const lm_head_sub *sub;
    const int32_t *extra; /* (n_extra) more token ids, none of them in sub */
    int n_extra;
    uint8_t *gather; /* (n_extra, output.row_bytes) scratch for their rows */
    float *out;      /* (rows, sub->n + n_extra) scratch: the products before the scatter */
} fwd_head_sel;

/* The bytes head_sub_new allocates for n rows of m's LM head. */
size_t head_sub_bytes(const lm_model *m, int n);
/* The subset of the n token ids in ids (distinct, in [0, n_vocab); any
 * order: kept ascending). NULL with a message. */
lm_head_sub *head_sub_new(const lm_model *m, const int32_t *ids, int n, char *err, size_t errlen);
void head_sub_free(lm_head_sub *h);
/* Copy the extras' rows of m's LM head into s->gather: after setting
 * s->extra, before the passes that use it. */
void head_sub_gather(const lm_model *m, const fwd_head_sel *s);
/* forward.c's LM head when f->head is set: rows normed inputs in f->xb ->
 * logits (rows, n_vocab) as above. */
void head_sub_logits(lm_fwd *f, float *logits, int rows);

/* ---- one sequence -------------------------------------------------------- */

typedef struct lm_seqrun {
    lm_fwd *fwd;  /* owned: the workspace its passes run in */
    kv_pool *kv;  /* its own (owns_kv) or a caller's */
    bool owns_kv; /* kv is freed with it */
    kv_seq *seq;  /* the sequence, in kv */
    int n_ctx;    /* positions it may hold (fwd->dims.n_ctx) */
    int n_past;   /* positions filled */
    /* with recurrent layers: the sequence's state (gdn.h) of the layers
     * this pipeline stage runs (lm_pp.rec0 .. rec1; all without a
     * pipeline), every layer's conv window then every layer's matrices,
     * and pointers into it (NULL for the other stages' layers) */
    float *rstate;
    size_t rstate_floats;
    float **rconv, **rmat; /* (n_rlayer) each */
} lm_seqrun;

/* A sequence in a pool of its own: one sequence of n_ctx positions (<= 0:
 * the model's training context), KV elements of kv_type (LM_TYPE_F32,
 * LM_TYPE_F16 or LM_TYPE_Q8_0), sliding-window layers keeping only their
 * window (kv.h); passes of n_batch tokens (<= 0: FWD_BATCH_DEFAULT). */
lm_seqrun *seqrun_new(const lm_model *m, lm_pool *pool, int n_ctx, int n_batch, uint32_t kv_type, char *err,
                      size_t errlen);
/* A sequence in a caller's pool, shared with others (prefix caching and
 * forks work across them). The pool must outlive it. */
lm_seqrun *seqrun_new_shared(const lm_model *m, lm_pool *pool, kv_pool *kv, int n_ctx, int n_batch, char *err,
                             size_t errlen);
/* A new sequence continuing src's, with a workspace of its own: every KV
 * block is shared until one side writes into a shared partial block, which
 * is then copied. The fork uses src's KV pool: free it before src if src
 * owns that pool. */
lm_seqrun *seqrun_fork(const lm_seqrun *src, char *err, size_t errlen);
void seqrun_free(lm_seqrun *r);
/* Forget every position (the cache is reused). */
void seqrun_reset(lm_seqrun *r);
/* Prefix caching: on an empty sequence, take every leading full block of
 * tokens[0..n) already cached under salt and return how many positions are
 * now filled (n_past); prefill only the rest. (None with recurrent layers:
 * the cache holds no state to resume from; 0.) seqrun_prefix_commit
 * registers the sequence's full blocks (tokens[0..n_past) are its tokens). */
int seqrun_prefix_match(lm_seqrun *r, const int32_t *tokens, int n, uint64_t salt);
void seqrun_prefix_commit(lm_seqrun *r, const int32_t *tokens, uint64_t salt);

/*
 * Run n tokens. logits receives n_vocab floats per requested row: the last
 * token's row only (all_logits false), or one row per token (true). logits
 * may be NULL when no output is wanted (e.g. a prompt prefix). Fails
 * (without touching the cache) when n_past + n would pass n_ctx or a token
 * id is out of range.
 */
int seqrun_forward(lm_seqrun *r, const int32_t *tokens, int n, float *logits, bool all_logits, char *err,
                   size_t errlen);

#endif
