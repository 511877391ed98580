/*
 * kv.h - the paged KV cache: pools of fixed-size blocks shared by every
 * sequence, per-sequence block tables, reference counts with copy-on-write,
 * automatic prefix caching, and sliding-window layers that keep only the
 * blocks their window can still see.
 *
 * Pool. Sized once at creation (kv_plan) from a byte budget or from a context
 * length x number of sequences, and allocated once per block class;
 * nothing is allocated per token. A block holds block_size consecutive
 * positions of one sequence, for every layer of its class, keys and values
 * of every KV head, as one slab per (layer, K|V, head): block_size rows back
 * to back, where a row is head_dim elements of the pool's type (F32, F16, or
 * Q8_0 with 34 bytes per 32 elements). The pool's memory is slab-major:
 *
 *   data  (n_layer, 2 [K, V], n_head_kv, n_blocks, block_size, row_bytes)
 *
 * so block b's slab of (layer, K|V, head) sits at slab index x slab_stride
 * + b x block_stride (kv_layout), and the same slab of consecutive blocks
 * is consecutive memory. Attention reads one (layer, K|V, head) of a
 * sequence's blocks in order; a sequence's blocks are mostly consecutive
 * (a fresh pool hands them out in ascending order, and a prompt's chunk
 * takes many at once), so it reads long runs rather than one block_size x
 * row_bytes piece per block, strided by every other layer's slabs. Reading
 * 16 KiB pieces 240 KiB apart (Gemma 3's 15 sliding-window layers, one F16
 * head of 256) ran at 18-22 GB/s on the Xeon where a run reads at 27-30.
 * KV bytes per token = 2 x n_layer x n_head_kv x row_bytes, i.e. 2 x layers
 * x KV heads x head_dim x bytes per element (34/32 for Q8_0); kv_plan
 * computes exactly the bytes kv_pool_new allocates for K/V.
 *
 * Latent layout (kv_config.latent_v > 0, multi-head latent attention): one
 * KV head whose key row is [c_kv (latent_v), rope key] and whose value is
 * that row's first latent_v elements, so a block has one slab per layer
 * (n_layer x 1 x 1 slabs of block_size rows) and KV bytes per token =
 * n_layer x row_bytes: the compressed latent and the shared RoPE key only.
 * Everything else (paging, sharing, copy-on-write, prefix cache, element
 * types) is the same.
 *
 * Sequences. A kv_seq is a table mapping logical block i (positions
 * i*B .. i*B+B-1) to a physical block, and a length. kv_append takes blocks
 * on demand; kv_seq_free (and kv_truncate) give them back. Every block has a
 * reference count: kv_fork shares all of a sequence's blocks; the first
 * append into a shared partial block copies it (copy-on-write), so each
 * branch then writes only its own copy. A block with refcount 0 is either
 * free, or cached (it carries a prefix key, see below) and evictable.
 *
 * Sliding-window layers: two block classes. A model whose "local" layers
 * attend only to their last `window` positions (gemma3: all layers but every
 * sixth) names them in kv_config (window, layer_local). The pool then keeps
 * two classes of blocks, each with its own slab, free list, LRU list, hash
 * table and refcounts: GLOBAL blocks hold the K/V of the global layers,
 * LOCAL blocks those of the local layers, both over block_size positions
 * (a layer's index inside its class's blocks is its rank among that class's
 * layers: kv_layer_class). A sequence has one table per class over the same
 * logical blocks. A query at position p of a local layer sees keys
 * p-window+1 .. p, and every caller runs queries only at the positions it
 * has just appended (a pass over len .. len+n-1 follows kv_append(n)), so
 * when kv_append grows a sequence of length len, the local blocks lying
 * wholly below len-window+1 can never be read again: kv_append releases
 * them and marks their table entries -1 (always a leading run of the local
 * table). A sequence of length len therefore holds ceil(len/B) global blocks
 * but at most ceil((window + chunk + B - 2) / B) local ones, chunk being the
 * most positions one append adds (kv_plan.local_blocks_per_seq). Attention
 * skips keys below a query's window and never reads a released block (it
 * stands in zeros for the masked keys of the one chunk that straddles the
 * window's start). Without a window, or when no layer or every layer is
 * local, there is one class holding every layer: the layout above, unchanged.
 *
 * Sizing with a window. From a context length: n_seqs x ceil(n_ctx/B) global
 * blocks and n_seqs x local_blocks_per_seq local ones. From a byte budget:
 * let N = budget / (block bytes of every layer), the blocks the one-class
 * layout would get; local blocks = min(N, n_seqs x local_blocks_per_seq) and
 * the rest of the budget buys global blocks. So the pool never holds fewer
 * positions than the one-class layout would from the same bytes (with N local
 * blocks it holds exactly as many), and once n_seqs sequences' windows are
 * covered every further byte buys context in the global layers alone.
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
 * no free block of their class is left; a sequence's blocks are released
 * last-to-first, so a prefix's early blocks (the most shareable) outlive its
 * tail. With a window, a full local block is keyed like the global block of
 * the same positions (in its own class's table), and a match of k blocks
 * counts only when the local blocks a query at k*B can see (those reaching
 * past k*B-window) are cached too: kv_prefix_match shortens the match until
 * they are, and takes only those local blocks. Local blocks leave a growing
 * sequence oldest first; those keyed by then (kv_prefix_commit after every
 * pass, as the engine does) stay cached like any released block, the others
 * are free at once.
 *
 * Errors. Functions that can fail return KV_OK, KV_ERR (bad argument, out of
 * memory for a table) or KV_FULL (a class has no block to give: the caller,
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

/* Block classes: global layers (every layer without a window) and local
 * (sliding-window) layers. */
enum { KV_GLOBAL = 0, KV_LOCAL = 1, KV_N_CLASS = 2 };

#define KV_DEFAULT_BLOCK 16
#define KV_KEY_LEN 32

typedef struct kv_pool kv_pool;
typedef struct kv_seq kv_seq;

typedef struct {
    int n_layer, n_head_kv, head_dim;
    uint32_t type;  /* LM_TYPE_F32, LM_TYPE_F16 or LM_TYPE_Q8_0 (quant.h) */
    int block_size; /* tokens per block, >= 1 */
    /* Sliding-window layers: with window > 0, layer i is local when
     * layer_local[i] != 0. The array (n_layer entries) is only read by
     * kv_plan_make and kv_pool_new. window 0 or layer_local NULL: none. */
    int window;
    const uint8_t *layer_local;
    /* Latent layout (multi-head latent attention): latent_v > 0 stores one
     * row per (layer, position), the key, whose first latent_v elements are
     * also the value; no V slab. Needs n_head_kv 1. 0: keys and values. */
    int latent_v;
    int chunk; /* most positions one kv_append adds to a sequence (its
                               prefill chunk); sizes the local class, so >= 1 is required
                               when there is one (the forward pass's batch, forward.h) */
    /* Size: mem_bytes > 0 spends that budget (n_seqs, and n_ctx when > 0,
     * then only size the local class); otherwise n_seqs sequences of n_ctx
     * positions. */
    uint64_t mem_bytes;
    int n_ctx, n_seqs;
    /* Pipeline parallelism: the pool stores only layers [layer0, layer1) of
     * the n_layer (both 0: all). Block counts, classes and block numbers are
     * planned over all n_layer as without a range, so every stage's pool
     * numbers the same blocks; only the bytes shrink. A layer outside the
     * range is never stored or read (kv_layer_class asserts). */
    int layer0, layer1;
} kv_config;

/* Defaults: F16, block 16, n_seqs 1, no window; the size fields are left for
 * the caller. */
void kv_config_init(kv_config *c, int n_layer, int n_head_kv, int head_dim);

/* The KV element type named name (F32, F16 or Q8_0, any case): 0 with *type
 * set, or -1 with a message naming the accepted types (*type untouched). */
int kv_type_from_name(const char *name, uint32_t *type, char *err, size_t errlen);

/* One block class's share of a plan. */
typedef struct {
    int n_layer;              /* layers of the class (0: class unused) */
    int n_held;               /* of them, the layers this pool stores (kv_config.layer0/1) */
    uint64_t bytes_per_token; /* 2 x n_layer x n_head_kv x row_bytes */
    uint64_t block_bytes;     /* block_size x bytes_per_token */
    int64_t n_blocks;
    uint64_t data_bytes; /* n_blocks x block_bytes */
} kv_class_plan;

typedef struct {
    size_t row_bytes;         /* one head's K (or V) of one token: head_dim elements */
    uint64_t bytes_per_token; /* every layer: 2 x n_layer x n_head_kv x row_bytes */
    uint64_t block_bytes;     /* every layer: block_size x bytes_per_token */
    int64_t n_blocks;         /* global blocks (all of them without a window) */
    int64_t n_tokens;         /* n_blocks x block_size: positions of context the pool holds */
    uint64_t data_bytes;      /* both classes' slabs: what kv_pool_new allocates for K/V
                                 (n_tokens x bytes_per_token without a window) */
    kv_class_plan cls[KV_N_CLASS];
    int window;                   /* the local class's window; 0: one class */
    int64_t local_blocks_per_seq; /* most local blocks one sequence holds (0: one class) */
    int chunk;                    /* the kv_config.chunk that bound was planned for (0: one class) */
} kv_plan;

/* Validate a config and size the pool without allocating. KV_ERR with a
 * message for: unsupported type, Q8_0 with head_dim not a multiple of 32,
 * non-positive dimensions or block size, a negative window, a budget below
 * one block of every layer, a local class without a chunk, or sizes past
 * 2^31 blocks / 2^52 bytes. */
int kv_plan_make(const kv_config *c, kv_plan *plan, char *err, size_t errlen);

kv_pool *kv_pool_new(const kv_config *c, char *err, size_t errlen);
void kv_pool_free(kv_pool *p);
const kv_plan *kv_pool_plan(const kv_pool *p);
/* The local class's window, 0 when the pool has one class. */
int kv_pool_window(const kv_pool *p);

/* Storage layout of one block class, for the attention kernel.
 * data + block * block_stride + kv_slab_offset(...) is the first row of
 * that block's (layer, K|V, head) slab, layer counted inside the class
 * (kv_row). */
typedef struct {
    const uint8_t *data;
    uint64_t block_bytes;  /* a block's bytes, every slab */
    uint64_t block_stride; /* from a block's slab to the next block's same slab: block_size x row_bytes */
    uint64_t slab_stride;  /* from one slab index to the next: n_blocks x block_stride */
    size_t row_bytes;
    int block_size, n_layer, n_head_kv, head_dim;
    uint32_t type;
    int n_slab; /* slabs per layer: 2 (K, V), or 1 in the latent layout (the key row holds the value) */
    int v_dim;  /* a value row's elements: head_dim, or latent_v read from the key row's start */
} kv_layout;
/* The global class's layout: every layer when the pool has one class. */
const kv_layout *kv_pool_layout(const kv_pool *p);
/* A class's layout (n_layer 0 for a class the pool does not use). */
const kv_layout *kv_class_layout(const kv_pool *p, int cls);
/* The class holding model layer `layer`, and in *slot its index among that
 * class's layers (the layer argument of kv_slab_offset). */
int kv_layer_class(const kv_pool *p, int layer, int *slot);
/* which: 0 keys, 1 values (0 only in the latent layout). */
static inline size_t kv_slab_offset(const kv_layout *l, int layer, int which, int head) {
    return ((size_t)(layer * l->n_slab + which) * (size_t)l->n_head_kv + (size_t)head) * (size_t)l->slab_stride;
}

/* Row `off` of block b's slab at offset slab (kv_slab_offset). */
static inline const uint8_t *kv_row(const kv_layout *l, int32_t b, size_t slab, int off) {
    return l->data + (size_t)b * l->block_stride + slab + (size_t)off * l->row_bytes;
}

/* ---- sequences ------------------------------------------------------- */

/* An empty sequence (holds no block). NULL only when out of memory. */
kv_seq *kv_seq_new(kv_pool *p, char *err, size_t errlen);
/* Release every block (last to first) and free the sequence. NULL is a no-op. */
void kv_seq_free(kv_pool *p, kv_seq *s);
/* A new sequence sharing all of src's blocks (refcounts + 1); needs no block. */
kv_seq *kv_fork(kv_pool *p, const kv_seq *src, char *err, size_t errlen);

int kv_seq_len(const kv_seq *s);
/* Block tables: kv_seq_table(s, cls)[i] holds positions i*B .. i*B+B-1 in
 * class cls; ceil(len / B) entries, -1 for a local block released out of the
 * window; NULL for a class the pool does not use. kv_seq_blocks is the global
 * table. Valid until the next bookkeeping call on s. */
const int32_t *kv_seq_blocks(const kv_seq *s);
const int32_t *kv_seq_table(const kv_seq *s, int cls);
/* Blocks of class cls s holds (its table's entries other than -1). */
int kv_seq_held(const kv_seq *s, int cls);

/* Blocks of class cls an append of n more tokens would take from the pool:
 * new blocks plus a copy-on-write of a shared partial last block, less (for
 * the local class) the blocks the append releases out of the window first,
 * never below 0. Admission control compares it with kv_available(p, cls) for
 * every class; kv_append fails with KV_FULL exactly when one exceeds it. */
int64_t kv_blocks_needed(const kv_pool *p, const kv_seq *s, int n, int cls);
/* Blocks of class cls that can be handed out now: free plus cached
 * (evictable); 0 for a class the pool does not use. */
int64_t kv_available(const kv_pool *p, int cls);

/* Grow s by n positions (len .. len+n-1), taking blocks as needed and copying
 * a shared partial last block first, so the new positions are writable by
 * this sequence alone; with a window, first release the local blocks no
 * query at len or later can see. The caller then writes their K/V with
 * kv_store* in every layer before attention reads them, and queries only
 * positions >= len (the old length) from then on. KV_FULL when the pool
 * cannot give the blocks (nothing changes: cached blocks are evicted only as
 * part of an append that succeeds). */
int kv_append(kv_pool *p, kv_seq *s, int n, char *err, size_t errlen);
/* Shrink s to its first n positions (n <= len), releasing whole blocks past
 * them: e.g. rejected speculative tokens, or a failed pass. With a window, n
 * must be 0 or leave every local block a query at n can see (so n may go
 * back to the start of the last append, never further than that may need):
 * KV_ERR otherwise. */
int kv_truncate(kv_pool *p, kv_seq *s, int n, char *err, size_t errlen);

/* Write one token's keys and values, (n_head_kv * head_dim) floats each, in
 * every head, converting to the pool's type (latent layout: the key row
 * only; v is not read and may be NULL). pos < len and pos made writable
 * by kv_append (asserted). */
void kv_store(kv_pool *p, const kv_seq *s, int layer, int pos, const float *k, const float *v);
/* Same for n tokens at pos0 .. pos0+n-1; row t at k + t*k_stride (floats). */
void kv_store_rows(kv_pool *p, const kv_seq *s, int layer, int pos0, int n, const float *k, size_t k_stride,
                   const float *v, size_t v_stride);

/* ---- prefix cache ------------------------------------------------------ */

/* For an EMPTY sequence and its prompt tokens[0..n): put every leading full
 * block already cached under this salt into s's tables and return the number
 * of positions now filled (a multiple of block_size, at most n - 1, rounded
 * down; with a window, shortened until the local blocks a query there sees
 * are cached; the caller prefills only tokens from there). 0 when nothing
 * matches, s is not empty, or a table cannot grow. */
int kv_prefix_match(kv_pool *p, kv_seq *s, const int32_t *tokens, int n, uint64_t salt);
/* Register s's full blocks among its first n_tokens_written positions
 * (tokens[0..n_tokens_written) are s's tokens from position 0; those
 * positions' K/V must be written in every layer), in every class (a local
 * block already released is skipped). A block whose key is already cached
 * elsewhere is replaced by that block and its own copy released
 * (deduplication). Safe to call after every pass. */
void kv_prefix_commit(kv_pool *p, kv_seq *s, const int32_t *tokens, int n_tokens_written, uint64_t salt);
/* The key of a full block with the given parent key (NULL for the first
 * block), as the cache computes it. */
void kv_prefix_key(const uint8_t parent[KV_KEY_LEN], uint64_t salt, const int32_t *tokens, int block_size,
                   uint8_t out[KV_KEY_LEN]);
/* The key of s's logical block i (the prefix of positions 0 .. (i+1)*B - 1
 * under s's salt) once kv_prefix_match or kv_prefix_commit computed it;
 * NULL for a block not keyed yet. Valid until the next bookkeeping call on s.
 * The recurrent state store keys its snapshots by it (rstate.h). */
const uint8_t *kv_seq_key(const kv_seq *s, int i);
/* Called with the key of every block that leaves the prefix cache: a cached
 * block evicted for reuse, or a keyed block a sequence truncated into and
 * writes again. In any class (a key can then still be cached in the other).
 * It runs inside kv_append, and must not call back into the pool. */
typedef void (*kv_evict_fn)(void *ctx, const uint8_t key[KV_KEY_LEN]);
/* Set (fn NULL: clear) the pool's eviction hook. */
void kv_set_evict_hook(kv_pool *p, kv_evict_fn fn, void *ctx);

/* ---- accounting -------------------------------------------------------- */

typedef struct {
    int n_layer;
    int64_t n_blocks, n_used, n_free, n_cached;
    uint64_t block_bytes;
    uint64_t bytes_total, bytes_used;
    int64_t slots_filled, slots_wasted;
} kv_class_stats;

typedef struct {
    /* block counts: the global class (every block without a window) */
    int64_t n_blocks; /* total */
    int64_t n_used;   /* refcount > 0 */
    int64_t n_free;   /* refcount 0, no key */
    int64_t n_cached; /* refcount 0, keyed: reusable by a prefix match, evictable */
    int block_size;
    uint64_t block_bytes;
    uint64_t bytes_total;  /* both classes: every block's bytes */
    uint64_t bytes_used;   /* both classes: used blocks' bytes */
    int64_t slots_filled;  /* global class: positions written in used blocks (a shared block counted once) */
    int64_t slots_wasted;  /* global class: n_used x block_size - slots_filled: unfilled tails of last blocks */
    uint64_t bytes_wasted; /* both classes: wasted slots x their class's bytes per token */
    int64_t n_seqs;        /* live sequences */
    /* running counters since the pool was made (both classes; prefix_hit_blocks
     * counts logical blocks) */
    uint64_t prefix_queries, prefix_hit_blocks, n_evicted, n_cow, n_dedup;
    kv_class_stats cls[KV_N_CLASS]; /* per class (the local one all zero without a window) */
} kv_stats;

void kv_stats_get(const kv_pool *p, kv_stats *st);
/* Refcount of a physical block of the global class, or of class cls (tests
 * and diagnostics); -1 for a block out of range. */
int kv_block_refcount(const kv_pool *p, int32_t block);
int kv_class_refcount(const kv_pool *p, int cls, int32_t block);
/* Check every invariant of the pool's bookkeeping in every class (free list,
 * LRU list, hash table, counters, fill sum, released local entries); KV_ERR
 * and a message naming the first broken one. */
int kv_pool_check(const kv_pool *p, char *err, size_t errlen);

/* ---- tensor-parallel followers (model/tp_plan.c) --------------------------
 * A follower rank keeps a pool of the same plan as the leader's and copies of
 * its block tables: the leader logs the blocks it copies (copy-on-write),
 * and each pass the follower repeats those copies and sets the tables of
 * its mirror sequences, which hold no references (kv_seq_free of one
 * releases nothing). */
typedef struct {
    int32_t cls, src, dst;
} kv_copy;
#define KV_COPY_LOG 4096
const kv_config *kv_pool_config(const kv_pool *p); /* layer_local cleared */
/* Log every block copy from now on (leader). */
int kv_copies_log(kv_pool *p, char *err, size_t errlen);
/* The copies logged since the last call into out (KV_COPY_LOG entries), in
 * order; -1 when more happened than the log holds. */
int kv_copies_take(kv_pool *p, kv_copy *out);
/* Repeat one copy (follower); -1 for a block out of range. */
int kv_block_copy(kv_pool *p, const kv_copy *c);
/* Make s a mirror: its tables (one per class, n_blocks entries each, -1 only
 * on a local table's first n_dropped entries), length and dropped count
 * as given (every block checked against the pool). */
int kv_seq_mirror(kv_pool *p, kv_seq *s, const int32_t *const tables[KV_N_CLASS], int n_blocks, int len, int n_dropped,
                  char *err, size_t errlen);
int kv_seq_dropped(const kv_seq *s);

#endif
