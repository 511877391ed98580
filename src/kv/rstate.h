/*
 * rstate.h - the recurrent state store: the runtime state of linear-attention
 * layers (gated DeltaNet, as in the hybrid models' recurrent layers), kept
 * beside the paged KV cache (kv.h). Where an attention layer keeps one K/V
 * row per position, a recurrent layer keeps, per sequence, a fixed-size
 * state that every token rewrites: the last d_conv - 1 inputs of its short
 * convolution and the recurrent state matrix.
 *
 * Slots. Every state lives in a slot of the same size, which holds every
 * recurrent layer of one sequence:
 *
 *   slot   (n_layer, [conv window | state matrix])
 *   conv   (d_conv - 1, conv_channels) floats: row 0 the oldest input
 *   matrix (n_v_heads, head_k_dim, head_v_dim) floats
 *
 * each part padded to a multiple of 16 floats, so every pointer the store
 * hands out is 64-byte aligned. A slot holds F32 only. There are three kinds
 * of slot, all in one slab allocated at creation (rstate_plan_make gives
 * its bytes without allocating; nothing is allocated later):
 *
 *   live        n_seqs: one per running sequence, the state the forward
 *               pass reads and rewrites (rstate_conv, rstate_mat)
 *   checkpoint  n_ckpt, shared: copies of live states at the positions of a
 *               verification pass, for speculative rollback
 *   snapshot    n_snap, shared: copies keyed by a prefix-cache block key,
 *               for the prefix cache
 *
 * A live slot is named by its index, 0 .. n_seqs - 1, from rstate_acquire or
 * rstate_fork until rstate_release. The store does not know the position a
 * live state has reached: the caller (the engine) keeps it with the
 * sequence's KV length, and a state of position n has consumed tokens
 * 0 .. n-1.
 *
 * Checkpoints (speculative decoding). A verification pass feeds n tokens
 * from position pos0 and the target then accepts a prefix of them; the state
 * must go back to the position after the last accepted token.
 * rstate_ckpt_reserve gives a live slot checkpoints for the positions
 * pos0+1 .. pos0+n (the states after each token); the forward pass, having
 * advanced one layer's state past the token at position q-1, copies that
 * layer into the checkpoint of q (rstate_ckpt_save_layer, or writes it
 * there directly through rstate_ckpt_layer); after
 * verification rstate_ckpt_restore(q) copies it back (nothing to do when
 * every token was accepted) and rstate_ckpt_release frees them. Bound: n_ckpt
 * checkpoints in all, shared by every live slot; a slot holds at most one
 * reservation (a new one replaces it), and a reservation that would take
 * more than are free is RSTATE_FULL. So the engine reserves before it puts
 * a verification segment into the batch, and a segment of the pending token
 * and K proposals (K + 1 tokens) needs K + 1 free checkpoints:
 * rstate_ckpt_available bounds what the speculation policy may propose.
 *
 * Snapshots (prefix cache). A snapshot is a copy of a live state of
 * position k x block_size, keyed by the KV prefix cache's key of the
 * sequence's block k-1 (kv_seq_key): SHA-256 over the salt and every token
 * id of the prefix, so a snapshot is only ever found for exactly the token
 * prefix (and tenant salt) whose state it holds. Keys are compared in all 32
 * bytes. rstate_snap_match finds, for a sequence whose leading blocks the KV
 * prefix cache matched, the longest of those prefixes that also has a
 * snapshot: the caller shortens its KV match to it (kv_truncate) and restores
 * the snapshot into the sequence's live slot, and so skips that prefill.
 * When all n_snap slots hold a snapshot, saving another evicts the least
 * recently saved or restored one. rstate_snap_evict drops the snapshot of a
 * key the KV cache no longer holds; it has the signature of kv_evict_fn, so
 * kv_set_evict_hook(kv, rstate_snap_evict, rs) drops each snapshot when its
 * block leaves the KV cache (a KV match stops at the first block not
 * cached, so it could not reach that snapshot until the same prefix is
 * computed and registered again).
 *
 * Errors. Functions that can fail return RSTATE_OK, RSTATE_ERR (bad
 * argument: a slot not acquired, a position without a checkpoint, a key
 * without a snapshot; out of memory at creation) or RSTATE_FULL (no slot of
 * that kind is free: the caller preempts, waits or goes without), with a
 * message in err where there is one. A failed call changes nothing. The
 * pointer accessors (rstate_conv, rstate_mat) assert their arguments, as
 * they are on the forward pass's path.
 *
 * The operation log (serving over several ranks). Under tensor or
 * pipeline parallelism every rank keeps its own store, holding its heads'
 * or its stage's layers' part of every slot; the leader's engine decides,
 * and each follower replays the leader's operations on its store in the
 * same order. After rstate_log_start every call that changes the
 * bookkeeping or copies states (acquire, fork, release, reset, checkpoint
 * reserve, restore and release, snapshot save, restore and evict; not the
 * forward pass's rstate_ckpt_save_layer / rstate_ckpt_layer, which every
 * rank's own pass does) appends one rstate_op, failed calls and no-ops
 * none; rstate_log_take hands the operations over. rstate_replay applies
 * one to another store of the same counts (n_seqs, n_ckpt, n_snap; its
 * layers and heads may differ): every operation is deterministic, so a
 * replica that saw the same operations hands out the same slot indices,
 * and a replayed acquire or fork that gives another index is an error.
 *
 * Threads. Bookkeeping (acquire, release, fork, reset, reserve, release of
 * checkpoints, snapshots, stats, check) is for one thread at a time. The
 * pointer accessors, rstate_ckpt_save_layer and rstate_ckpt_layer may run on
 * many threads at once for distinct (slot, layer) pairs.
 */
#ifndef LAMINA_RSTATE_H
#define LAMINA_RSTATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv.h"

enum { RSTATE_OK = 0, RSTATE_ERR = -1, RSTATE_FULL = -2 };

typedef struct rstate_pool rstate_pool;

typedef struct {
    int n_layer;       /* recurrent layers; layer arguments count only these, 0 .. n_layer-1 */
    int d_conv;        /* the convolution's kernel width, >= 1: the window holds d_conv - 1 inputs */
    int conv_channels; /* channels the convolution runs over (DeltaNet: the q, k and v projections together) */
    int n_v_heads, head_k_dim, head_v_dim; /* the state matrix: (n_v_heads, head_k_dim, head_v_dim) */
    int n_seqs;                            /* live slots, >= 1 */
    int n_ckpt;                            /* checkpoint slots, shared by all live slots, >= 0 */
    int n_snap;                            /* snapshot slots, >= 0 */
} rstate_config;

/* n_seqs 1, no checkpoint or snapshot slot. */
void rstate_config_init(rstate_config *c, int n_layer, int d_conv, int conv_channels, int n_v_heads, int head_k_dim,
                        int head_v_dim);

typedef struct {
    int64_t conv_floats;  /* one layer's window: (d_conv - 1) x conv_channels */
    int64_t mat_floats;   /* one layer's matrix: n_v_heads x head_k_dim x head_v_dim */
    uint64_t layer_bytes; /* one layer of a slot: window and matrix, each padded to a multiple of 64 bytes */
    uint64_t slot_bytes;  /* n_layer x layer_bytes */
    int64_t n_slots;      /* n_seqs + n_ckpt + n_snap */
    uint64_t live_bytes;  /* n_seqs x slot_bytes */
    uint64_t ckpt_bytes;  /* n_ckpt x slot_bytes */
    uint64_t snap_bytes;  /* n_snap x slot_bytes */
    uint64_t data_bytes;  /* n_slots x slot_bytes: what rstate_pool_new allocates for states */
} rstate_plan;

/* Validate a config and size the store without allocating. RSTATE_ERR with
 * a message for non-positive dimensions, layers or live slots, negative
 * checkpoint or snapshot counts, or sizes past 2^31 slots / 2^52 bytes. The
 * bookkeeping beside the slab (a few bytes per slot, a hash table of the
 * snapshots) is not in data_bytes, as the KV plan leaves out its block
 * records. */
int rstate_plan_make(const rstate_config *c, rstate_plan *plan, char *err, size_t errlen);

rstate_pool *rstate_pool_new(const rstate_config *c, char *err, size_t errlen);
void rstate_pool_free(rstate_pool *p); /* NULL is a no-op */
const rstate_plan *rstate_pool_plan(const rstate_pool *p);
const rstate_config *rstate_pool_config(const rstate_pool *p);

/* ---- live slots ------------------------------------------------------------ */

/* A free live slot, zeroed (the state of position 0): its index (>= 0), or
 * RSTATE_FULL when all n_seqs are taken. */
int rstate_acquire(rstate_pool *p, char *err, size_t errlen);
/* Give slot back, with its checkpoints. A negative slot is a no-op
 * (RSTATE_OK); RSTATE_ERR for a slot not acquired (a second release). */
int rstate_release(rstate_pool *p, int slot);
/* A new live slot holding a copy of src's state (checkpoints are not
 * copied): its index, RSTATE_FULL, or RSTATE_ERR for src not acquired. The
 * two states are independent from then on. */
int rstate_fork(rstate_pool *p, int src, char *err, size_t errlen);
/* Zero slot's state (position 0) and release its checkpoints; RSTATE_ERR
 * for a slot not acquired. */
int rstate_reset(rstate_pool *p, int slot);
/* Live slots free now. */
int rstate_available(const rstate_pool *p);
bool rstate_acquired(const rstate_pool *p, int slot);

/* Layer `layer`'s convolution window in live slot `slot`:
 * (d_conv - 1, conv_channels) floats. */
float *rstate_conv(rstate_pool *p, int slot, int layer);
/* Layer `layer`'s state matrix in live slot `slot`:
 * (n_v_heads, head_k_dim, head_v_dim) floats. */
float *rstate_mat(rstate_pool *p, int slot, int layer);

/* ---- checkpoints (speculative rollback) ------------------------------------ */

/* Reserve checkpoints for positions pos0+1 .. pos0+n of slot (a pass that
 * feeds n >= 1 tokens from pos0 >= 0), releasing slot's earlier ones first.
 * RSTATE_FULL when fewer than n checkpoint slots are free (counting those
 * the earlier reservation would give back; nothing changes). */
int rstate_ckpt_reserve(rstate_pool *p, int slot, int pos0, int n, char *err, size_t errlen);
/* Copy layer `layer` of slot's live state into its checkpoint of position
 * pos. RSTATE_ERR (nothing copied) when pos is not reserved for slot or
 * layer is out of range. */
int rstate_ckpt_save_layer(rstate_pool *p, int slot, int layer, int pos);
/* The same for every layer. */
int rstate_ckpt_save(rstate_pool *p, int slot, int pos);
/* Where layer `layer` of slot's checkpoint of position pos lives, for a
 * caller that writes the state there itself as it computes it (the forward
 * pass of a verification segment, which never holds the whole live layer at
 * pos): *conv (d_conv - 1, conv_channels) and *mat (n_v_heads, head_k_dim,
 * head_v_dim) floats, laid out as rstate_conv's and rstate_mat's. The layer
 * counts as saved at pos from this call on: the caller must fill both
 * before any rstate_ckpt_restore. RSTATE_ERR (nothing changed) when pos is
 * not reserved for slot or layer is out of range. Threads: as
 * rstate_ckpt_save_layer. */
int rstate_ckpt_layer(rstate_pool *p, int slot, int layer, int pos, float **conv, float **mat);
/* Copy the checkpoint of position pos back into slot's live state: every
 * layer must have been saved there since the reservation (RSTATE_ERR
 * otherwise, the live state untouched). The reservation stays. */
int rstate_ckpt_restore(rstate_pool *p, int slot, int pos, char *err, size_t errlen);
/* Whether slot's reservation holds a checkpoint of position pos. */
bool rstate_ckpt_reserved(const rstate_pool *p, int slot, int pos);
/* Free slot's checkpoints (none, or a slot not acquired: a no-op). */
void rstate_ckpt_release(rstate_pool *p, int slot);
/* Checkpoint slots free now. */
int rstate_ckpt_available(const rstate_pool *p);

/* ---- snapshots (prefix cache) ---------------------------------------------- */

/* Store a copy of slot's live state under key: the KV prefix key of the
 * block whose end is the state's position (kv_seq_key(s, pos / B - 1) for a
 * state of position pos, a multiple of the block size B). A key already
 * stored is only marked used (a prefix's state does not depend on who
 * computed it). With every snapshot slot taken, the least recently used
 * snapshot is evicted. RSTATE_FULL when the store has no snapshot slot
 * (n_snap 0), RSTATE_ERR for a slot not acquired. */
int rstate_snap_save(rstate_pool *p, int slot, const uint8_t key[KV_KEY_LEN], char *err, size_t errlen);
/* Whether a snapshot is stored under key. */
bool rstate_snap_has(const rstate_pool *p, const uint8_t key[KV_KEY_LEN]);
/* The longest prefix of s's keyed blocks (kv_seq_key) with a snapshot: its
 * number of blocks k (the state of position k x block size; 0: none), its
 * key copied into key when k > 0. After kv_prefix_match on an empty
 * sequence, its keyed blocks are the ones matched. */
int rstate_snap_match(const rstate_pool *p, const kv_seq *s, uint8_t key[KV_KEY_LEN]);
/* Copy the snapshot under key into live slot `slot` (its checkpoints
 * released) and mark it used. RSTATE_ERR when no snapshot has that key or
 * slot is not acquired. */
int rstate_snap_restore(rstate_pool *p, const uint8_t key[KV_KEY_LEN], int slot, char *err, size_t errlen);
/* Drop the snapshot under key, if any (pool: the rstate_pool; the signature
 * of kv_evict_fn, for kv_set_evict_hook). */
void rstate_snap_evict(void *pool, const uint8_t key[KV_KEY_LEN]);

/* ---- the operation log ------------------------------------------------------ */

enum {
    RSTATE_OP_ACQUIRE = 1,  /* a: the slot acquired */
    RSTATE_OP_FORK,         /* a: the new slot, b: its source */
    RSTATE_OP_RELEASE,      /* a: slot */
    RSTATE_OP_RESET,        /* a: slot */
    RSTATE_OP_CK_RESERVE,   /* a: slot, b: pos0, c: n */
    RSTATE_OP_CK_RESTORE,   /* a: slot, b: pos */
    RSTATE_OP_CK_RELEASE,   /* a: slot */
    RSTATE_OP_SNAP_SAVE,    /* a: slot, key */
    RSTATE_OP_SNAP_RESTORE, /* a: slot, key */
    RSTATE_OP_SNAP_EVICT,   /* key */
};

/* One operation: 12 int32 words, as it travels in a batch plan. */
typedef struct {
    int32_t op, a, b, c;
    uint8_t key[KV_KEY_LEN];
} rstate_op;

/* Record every operation from now on (the log grows as needed). */
void rstate_log_start(rstate_pool *p);
/* The operations since the last take, oldest first: their number, *ops
 * pointing at them until the next call that changes the store; the log is
 * emptied. -1 when an operation could not be recorded (out of memory): the
 * log is lost and a replica can no longer follow. */
int rstate_log_take(rstate_pool *p, const rstate_op **ops);
/* Apply o to p as the logged call did. RSTATE_OK, or RSTATE_ERR with a
 * message when it fails or gives another slot index than the original. */
int rstate_replay(rstate_pool *p, const rstate_op *o, char *err, size_t errlen);

/* ---- accounting ------------------------------------------------------------ */

typedef struct {
    int64_t n_live, n_live_used; /* live slots, and those acquired */
    int64_t n_ckpt, n_ckpt_used; /* checkpoint slots, and those reserved */
    int64_t n_snap, n_snap_used; /* snapshot slots, and those holding a snapshot */
    uint64_t slot_bytes;
    uint64_t bytes_total;                                       /* every slot: the plan's data_bytes */
    uint64_t live_bytes_used, ckpt_bytes_used, snap_bytes_used; /* used slots x slot_bytes, per kind */
    /* running counters since the store was made */
    uint64_t snap_saved;    /* snapshots stored (a key already stored not counted) */
    uint64_t snap_restored; /* snapshots copied into a live slot */
    uint64_t snap_evicted;  /* dropped for room (least recently used) */
    uint64_t snap_dropped;  /* dropped by rstate_snap_evict (their KV block left the cache) */
} rstate_stats;

void rstate_stats_get(const rstate_pool *p, rstate_stats *st);
/* Check every invariant of the store's bookkeeping (free lists, checkpoint
 * owners, the snapshots' LRU list and hash table, counters); RSTATE_ERR and a
 * message naming the first broken one. */
int rstate_pool_check(const rstate_pool *p, char *err, size_t errlen);

#endif
