/*
 * kv.h - the paged KV cache: one pool of fixed-size blocks shared by every
 * sequence, per-sequence block tables, reference counts with copy-on-write,
 * and automatic prefix caching.
 *
 * Pool. Sized once at creation (kv_plan) from a byte budget or from a context
 * length x number of sequences, and allocated in one slab; nothing is
 * allocated per token. A block holds block_size consecutive positions of one
 * sequence, for every layer, keys and values of every KV head:
 *
 *   block  (n_layer, 2 [K, V], n_head_kv, block_size, row_bytes)
 *
 * where a row is head_dim elements of the pool's type (F32, F16, or Q8_0 with
 * 34 bytes per 32 elements). So one (layer, K|V, head) slab of a block is
 * block_size rows back to back, and attention reads it in one sweep. KV bytes
 * per token = 2 x n_layer x n_head_kv x row_bytes, i.e. 2 x layers x KV heads
 * x head_dim x bytes per element (34/32 for Q8_0); kv_plan computes exactly
 * the bytes kv_pool_new allocates for K/V.
 *
 * Sequences. A kv_seq is a table mapping logical block i (positions
 * i*B .. i*B+B-1) to a physical block, and a length. kv_append takes blocks
 * on demand; kv_seq_free (and kv_truncate) give them back. Every block has a
 * reference count: kv_fork shares all of a sequence's blocks; the first
 * append into a shared partial block copies it (copy-on-write), so each
 * branch then writes only its own copy. A block with refcount 0 is either
 * free, or cached (it carries a prefix key, see below) and evictable.
 *
 * Prefix cache. A FULL block is keyed by SHA-256(parent block's key ||
 * salt || its block_size token ids), salt as 8 and each token id as 4
 * little-endian bytes, the first block's parent key being 32 zero bytes;
 * the key therefore names the whole prefix up to the block's end, per
 * tenant salt. kv_prefix_commit registers a sequence's full blocks;
 * kv_prefix_match gives a new sequence every leading block of its prompt that
 * is cached (never the whole prompt: at least the last token is left to
 * compute, for its logits). Keys are compared in all 32 bytes, so a hash-table
 * bucket collision can never hand one prompt another's block. Released keyed
 * blocks stay cached and are evicted least-recently-released first, only when
 * no free block is left; a sequence's blocks are released last-to-first, so a
 * prefix's early blocks (the most shareable) outlive its tail.
 *
 * Errors. Functions that can fail return KV_OK, KV_ERR (bad argument, out of
 * memory for a table) or KV_FULL (the pool has no block to give: the caller,
 * the scheduler, preempts or waits), with a message in err. A failed call
 * changes nothing.
 *
 * Threads. Pool and sequence bookkeeping (everything but kv_store*, the
 * layout accessors and kv_stats_get) is for one thread at a time. kv_store*
 * writes only block data and may run on many threads at once for distinct
 * (layer, position) pairs, concurrently with attention reading other
 * positions. Sequences must be freed before their pool.
 */
#ifndef LAMINA_KV_H
#define LAMINA_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { KV_OK = 0, KV_ERR = -1, KV_FULL = -2 };

#define KV_DEFAULT_BLOCK 16
#define KV_KEY_LEN 32

typedef struct kv_pool kv_pool;
typedef struct kv_seq kv_seq;

typedef struct {
    int n_layer, n_head_kv, head_dim;
    uint32_t type;          /* LM_TYPE_F32, LM_TYPE_F16 or LM_TYPE_Q8_0 (quant.h) */
    int block_size;         /* tokens per block, >= 1 */
    /* Size: mem_bytes > 0 takes floor(mem_bytes / block_bytes) blocks;
     * otherwise n_seqs x ceil(n_ctx / block_size) blocks. */
    uint64_t mem_bytes;
    int n_ctx, n_seqs;
} kv_config;

/* Defaults: F16, block 16, n_seqs 1; the size fields are left for the caller. */
void kv_config_init(kv_config *c, int n_layer, int n_head_kv, int head_dim);

typedef struct {
    size_t row_bytes;         /* one head's K (or V) of one token: head_dim elements */
    uint64_t bytes_per_token; /* 2 x n_layer x n_head_kv x row_bytes */
    uint64_t block_bytes;     /* block_size x bytes_per_token */
    int64_t n_blocks;
    int64_t n_tokens;         /* n_blocks x block_size */
    uint64_t data_bytes;      /* n_blocks x block_bytes: the K/V slab kv_pool_new allocates */
} kv_plan;

/* Validate a config and size the pool without allocating. KV_ERR with a
 * message for: unsupported type, Q8_0 with head_dim not a multiple of 32,
 * non-positive dimensions or block size, a budget below one block, or sizes
 * past 2^31 blocks / 2^64 bytes. */
int kv_plan_make(const kv_config *c, kv_plan *plan, char *err, size_t errlen);

kv_pool *kv_pool_new(const kv_config *c, char *err, size_t errlen);
void kv_pool_free(kv_pool *p);

/* Storage layout, for the attention kernel. data + block * block_bytes +
 * kv_slab_offset(...) is the first row of that (layer, K|V, head) slab. */
typedef struct {
    const uint8_t *data;
    uint64_t block_bytes;
    size_t row_bytes;
    int block_size, n_layer, n_head_kv, head_dim;
    uint32_t type;
} kv_layout;
const kv_layout *kv_pool_layout(const kv_pool *p);
/* which: 0 keys, 1 values. */
static inline size_t kv_slab_offset(const kv_layout *l, int layer, int which, int head) {
    return ((size_t)(layer * 2 + which) * (size_t)l->n_head_kv + (size_t)head) * (size_t)l->block_size * l->row_bytes;
}

/* ---- sequences ------------------------------------------------------- */

/* An empty sequence (holds no block). NULL only when out of memory. */
kv_seq *kv_seq_new(kv_pool *p, char *err, size_t errlen);
/* Release every block (last to first) and free the sequence. NULL is a no-op. */
void kv_seq_free(kv_pool *p, kv_seq *s);
/* A new sequence sharing all of src's blocks (refcounts + 1); needs no block. */
kv_seq *kv_fork(kv_pool *p, const kv_seq *src, char *err, size_t errlen);

int kv_seq_len(const kv_seq *s);
/* Block table: kv_seq_blocks(s)[i] holds positions i*B .. i*B+B-1;
 * ceil(len / B) entries. Valid until the next bookkeeping call on s. */
const int32_t *kv_seq_blocks(const kv_seq *s);

/* Blocks an append of n more tokens would take from the pool (new blocks
 * plus a copy-on-write of a shared partial last block): what admission
 * control compares with kv_available(). */
int64_t kv_blocks_needed(const kv_pool *p, const kv_seq *s, int n);
/* Blocks that can be handed out now: free plus cached (evictable). */
int64_t kv_available(const kv_pool *p);

/* Grow s by n positions (len .. len+n-1), taking blocks as needed and copying
 * a shared partial last block first, so the new positions are writable by
 * this sequence alone. The caller then writes their K/V with kv_store* in
 * every layer before attention reads them. KV_FULL when the pool cannot give
 * the blocks (nothing changes: cached blocks are evicted only as part of an
 * append that succeeds). */
int kv_append(kv_pool *p, kv_seq *s, int n, char *err, size_t errlen);
/* Shrink s to its first n positions (n <= len), releasing whole blocks past
 * them: e.g. rejected speculative tokens, or a failed pass. */
int kv_truncate(kv_pool *p, kv_seq *s, int n, char *err, size_t errlen);

/* Write one token's keys and values, (n_head_kv * head_dim) floats each, in
 * every head, converting to the pool's type. pos < len and pos made writable
 * by kv_append (asserted). */
void kv_store(kv_pool *p, const kv_seq *s, int layer, int pos, const float *k, const float *v);
/* Same for n tokens at pos0 .. pos0+n-1; row t at k + t*k_stride (floats). */
void kv_store_rows(kv_pool *p, const kv_seq *s, int layer, int pos0, int n, const float *k, size_t k_stride,
                   const float *v, size_t v_stride);

/* ---- prefix cache ------------------------------------------------------ */

/* For an EMPTY sequence and its prompt tokens[0..n): put every leading full
 * block already cached under this salt into s's table and return the number
 * of positions now filled (a multiple of block_size, at most n - 1, rounded
 * down; the caller prefills only tokens from there). 0 when nothing matches,
 * s is not empty, or a table cannot grow. */
int kv_prefix_match(kv_pool *p, kv_seq *s, const int32_t *tokens, int n, uint64_t salt);
/* Register s's full blocks among its first n_tokens_written positions
 * (tokens[0..n_tokens_written) are s's tokens from position 0; those
 * positions' K/V must be written in every layer). A block whose key is
 * already cached elsewhere is replaced by that block and its own copy
 * released (deduplication). Safe to call after every pass. */
void kv_prefix_commit(kv_pool *p, kv_seq *s, const int32_t *tokens, int n_tokens_written, uint64_t salt);
/* The key of a full block with the given parent key (NULL for the first
 * block), as the cache computes it. */
void kv_prefix_key(const uint8_t parent[KV_KEY_LEN], uint64_t salt, const int32_t *tokens, int block_size,
                   uint8_t out[KV_KEY_LEN]);

/* ---- accounting -------------------------------------------------------- */

typedef struct {
    int64_t n_blocks;      /* total */
    int64_t n_used;        /* refcount > 0 */
    int64_t n_free;        /* refcount 0, no key */
    int64_t n_cached;      /* refcount 0, keyed: reusable by a prefix match, evictable */
    int block_size;
    uint64_t block_bytes;
    uint64_t bytes_total;  /* n_blocks x block_bytes */
    uint64_t bytes_used;   /* n_used x block_bytes */
    int64_t slots_filled;  /* positions written in used blocks (a shared block counted once) */
    int64_t slots_wasted;  /* n_used x block_size - slots_filled: unfilled tails of last blocks */
    uint64_t bytes_wasted; /* slots_wasted x bytes_per_token */
    int64_t n_seqs;        /* live sequences */
    /* running counters since the pool was made */
    uint64_t prefix_queries, prefix_hit_blocks, n_evicted, n_cow, n_dedup;
} kv_stats;

void kv_stats_get(const kv_pool *p, kv_stats *st);
/* Refcount of a physical block (tests and diagnostics). */
int kv_block_refcount(const kv_pool *p, int32_t block);
/* Check every invariant of the pool's bookkeeping (free list, LRU list, hash
 * table, counters, fill sum); KV_ERR and a message naming the first broken one. */
int kv_pool_check(const kv_pool *p, char *err, size_t errlen);

#endif
