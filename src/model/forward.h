/*
 * forward.h - one sequence's inference state and the forward pass.
 *
 * An lm_state holds a sequence's KV cache (per layer, keys and values of
 * every position so far; a sliding-window layer keeps only what its window
 * can still see) and the activation buffers for a batch of up to
 * max_batch tokens, all allocated once in state_new. state_forward appends
 * n tokens at positions n_past .. n_past+n-1: the linear layers run over the
 * whole batch (each weight read once per batch), attention reads the cache,
 * and decode of one token computes only that token's projections.
 */
#ifndef LAMINA_FORWARD_H
#define LAMINA_FORWARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/attn.h"
#include "kv/kv.h"
#include "model/model.h"
#include "base/pool.h"

/* Where a forward pass spends its time (seconds, accumulated while
 * lm_state.profile is set). */
enum {
    LM_PROF_EMBED, LM_PROF_NORM, LM_PROF_QKV, LM_PROF_ROPE, LM_PROF_ATTN, LM_PROF_WO, LM_PROF_FFN_UP,
    LM_PROF_FFN_ACT, LM_PROF_FFN_DOWN, LM_PROF_LM_HEAD, LM_PROF_COUNT
};
extern const char *const lm_prof_names[LM_PROF_COUNT];

typedef struct lm_state {
    const lm_model *m;
    lm_pool *pool;        /* not owned */
    int n_ctx;            /* positions the cache holds */
    int n_past;           /* positions filled */
    int max_batch;        /* tokens per internal pass */
    kv_pool *kv;          /* paged cache: its own (n_ctx positions) or shared */
    bool owns_kv;         /* kv is freed with the state */
    kv_seq *seq;          /* this state's sequence in kv */
    attn_scratch **scr;   /* (n_scr) attention scratch, one per pool thread */
    int n_scr;
    float *x;             /* (max_batch, n_embd) residual stream */
    float *xb;            /* (max_batch, max(n_embd, q_dim)) normed input / attention output */
    float *q;             /* (max_batch, n_head * head_dim) */
    float *k, *v;         /* (max_batch, n_head_kv * head_dim) */
    float *hb, *hb2;      /* (max_batch, n_ff) */
    float *cs;            /* (max_batch, n_rot) rope cos/sin */
    int *pos;             /* (max_batch) each row's position */
    int *seg_row0;        /* (max_batch + 1) a segment's first row */
    int *seg_item0;       /* (max_batch + 1) a segment's first attention work item */
    void *act;            /* quantized activations for ops_matmul */
    size_t act_bytes;
    bool profile;         /* accumulate per-op times into prof[] */
    double prof[LM_PROF_COUNT];
} lm_state;

/* The KV pool config of a model (kv_config_init's defaults): its layers,
 * KV heads and head dim, and its sliding-window layers as the pool's local
 * class (kv.h). c->layer_local points into the model. */
void state_kv_config(const lm_model *m, kv_config *c);

/* n_ctx <= 0 takes the model's training context. The state's own pool holds
 * one sequence of n_ctx positions, sliding-window layers keeping only their
 * window (kv.h). */
lm_state *state_new(const lm_model *m, lm_pool *pool, int n_ctx, int max_batch, char *err, size_t errlen);
/* Same with the KV element type (LM_TYPE_F32, LM_TYPE_F16, LM_TYPE_Q8_0);
 * state_new uses F32. */
lm_state *state_new_kv(const lm_model *m, lm_pool *pool, int n_ctx, int max_batch, uint32_t kv_type, char *err,
                       size_t errlen);
/* A state whose sequence lives in a caller's pool, shared with other states
 * (prefix caching and forks work across them). The pool must outlive it. */
lm_state *state_new_shared(const lm_model *m, lm_pool *pool, kv_pool *kv, int n_ctx, int max_batch, char *err,
                           size_t errlen);
/* A new state continuing src's sequence: every KV block is shared until one
 * side writes into a shared partial block, which is then copied. The fork
 * uses src's KV pool: free it before src if src owns that pool. */
lm_state *state_fork(const lm_state *src, char *err, size_t errlen);
/* Prefix caching: on an empty state, take every leading full block of
 * tokens[0..n) already cached under salt and return how many positions are
 * now filled (n_past); prefill only the rest. state_prefix_commit registers
 * the state's full blocks (tokens[0..n_past) are its tokens). */
int state_prefix_match(lm_state *s, const int32_t *tokens, int n, uint64_t salt);
void state_prefix_commit(lm_state *s, const int32_t *tokens, uint64_t salt);
void state_free(lm_state *s);
/* Forget every position (the cache is reused). */
void state_reset(lm_state *s);

/*
 * Run n tokens. logits receives n_vocab floats per requested row: the last
 * token's row only (all_logits false), or one row per token (true). logits
 * may be NULL when no output is wanted (e.g. a prompt prefix). Fails (without
 * touching the cache) when n_past + n would pass n_ctx or a token id is out
 * of range.
 */
int state_forward(lm_state *s, const int32_t *tokens, int n, float *logits, bool all_logits, char *err,
                  size_t errlen);

/*
 * Many sequences in one pass (the engine's batch): segment g runs tokens
 * [row0, row0 + n) of the flat token array at positions pos0 .. pos0+n-1 of
 * its own sequence seq, which must live in s->kv and already hold those
 * positions (kv_append; with sliding-window layers pos0 must not precede
 * the length seq had before that append, see kv.h). The linear layers run
 * once over all the batch's tokens; attention runs per segment over its own
 * blocks. logits receives, segment after segment, the rows of each
 * segment's last n_logits tokens (may be NULL when no segment wants any).
 * Rows never interact, so a row's result does not depend on the rest of the
 * batch. s->n_past and s->seq are not used. Fails without running when the
 * batch exceeds max_batch tokens, a segment is malformed or passes n_ctx,
 * or a token id is out of range.
 */
typedef struct {
    kv_seq *seq;
    int pos0, n;
    int n_logits;         /* 0 .. n */
} lm_seg;
int state_forward_segs(lm_state *s, const int32_t *tokens, const lm_seg *segs, int n_seg, float *logits, char *err,
                       size_t errlen);

#endif
