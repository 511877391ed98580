/*
 * kv.c - the paged KV cache (see kv.h for the model).
 *
 * The pool has one block class, or two (global, local) with sliding-window
 * layers; each class is the same machinery over its own blocks. Bookkeeping,
 * per physical block b of a class:
 *   ref       sequences whose table for the class holds b (a table holds a
 *             block at most once, so this is also the number of table
 *             entries naming b)
 *   fill      positions of b that hold data (the largest coverage any owner
 *             had when it last grew into b); counted in the class's fill_sum
 *             while b is used, which gives the waste figure in O(1)
 *   has_key   b is in the class's prefix hash table under key
 *   prev/next links in exactly one list when ref == 0: the free list (no
 *             key; singly linked through next) or the LRU list (keyed;
 *             doubly linked, head = least recently released)
 *   hnext     next block in b's hash bucket
 * Invariants (kv_pool_check verifies them, per class): n_used + n_free +
 * n_cached == n_blocks; a keyed block is full and its data never changes
 * while keyed (a write into it first drops the key or copies the block); a
 * writable position (appended, not yet shared) lives in a block with ref == 1
 * and no key. A sequence's local table is -1 exactly on its first n_dropped
 * entries, and n_dropped never passes the drop point of its length (the
 * blocks wholly below len - window + 1).
 *
 * Hash tables: per class 2^k buckets (k such that buckets >= its blocks),
 * indexed by the key's first 8 bytes, chained through hnext; lookups compare
 * all 32 bytes. Both classes key a block by the same chain key.
 *
 * Each sequence keeps the chain key of its leading full blocks (keys[i] for
 * i < n_keyed), computed once, so commit after every pass hashes only the
 * blocks that became full.
 */
#include "kv/kv.h"

#include <assert.h>
#include <limits.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels/kernels.h"
#include "format/quant.h"
#include "base/sha256.h"
#include "base/util.h"

#define HUGE_ALIGN ((size_t)2 << 20)

typedef struct {
    int32_t ref;
    int32_t fill;
    int32_t prev, next;
    int32_t hnext;
    uint8_t has_key;
    uint8_t key[KV_KEY_LEN];
} kv_block;

/* One block class: its blocks' data, records, lists and hash table. */
typedef struct {
    kv_layout lay;
    int64_t n_blocks;
    uint64_t bytes_per_token;
    void *slab;      /* unaligned allocation holding data */
    uint8_t *data;   /* n_blocks x block_bytes, slab-major (kv.h), 64-byte aligned */
    kv_block *blk;   /* (n_blocks) */
    int32_t *bucket; /* (bucket_mask + 1) first block of each chain, -1 empty */
    uint64_t bucket_mask;
    int32_t free_head;          /* free list, -1 empty */
    int32_t lru_head, lru_tail; /* cached list, -1 empty */
    int64_t n_used, n_free, n_cached;
    int64_t fill_sum;
    uint64_t n_evicted, n_cow, n_dedup;
    kv_evict_fn on_evict; /* the pool's eviction hook (kv_set_evict_hook), or NULL */
    void *evict_ctx;
} kv_class;

struct kv_seq {
    int32_t *table[KV_N_CLASS];  /* (cap) physical block per logical block, per class used */
    uint8_t (*keys)[KV_KEY_LEN]; /* (cap) chain key of logical block i, i < n_keyed */
    int n_blocks, cap;           /* n_blocks == ceil(len / B), in every table */
    int len;                     /* positions held */
    int n_keyed;                 /* leading blocks whose chain key is in keys */
    int n_dropped;               /* leading local entries released out of the window (-1) */
    uint64_t salt;               /* salt keys were computed with */
    kv_seq *sprev, *snext;       /* pool's list of live sequences */
    bool mirror;                 /* tables set by kv_seq_mirror: holds no references */
};

struct kv_pool {
    kv_config cfg; /* as given, layer_local cleared (see layer_class) */
    kv_plan plan;
    int n_class; /* 1, or 2 with local layers */
    int window;  /* local layers' window; 0 with one class */
    int block_size;
    kv_class cls[KV_N_CLASS];
    int *layer_class, *layer_slot; /* (n_layer) each: a layer's class and index in it */
    kv_seq *seqs;                  /* live sequences */
    int64_t n_seqs;
    uint64_t prefix_queries, prefix_hit_blocks;
    kv_copy *copies; /* (KV_COPY_LOG) block copies since kv_copies_take, when logged */
    int n_copies;    /* entries; -1 after an overflow */
};

void kv_config_init(kv_config *c, int n_layer, int n_head_kv, int head_dim) {
    memset(c, 0, sizeof *c);
    c->n_layer = n_layer;
    c->n_head_kv = n_head_kv;
    c->head_dim = head_dim;
    c->type = LM_TYPE_F16;
    c->block_size = KV_DEFAULT_BLOCK;
    c->n_seqs = 1;
}

int kv_type_from_name(const char *name, uint32_t *type, char *err, size_t errlen) {
    int t = name ? quant_type_from_name(name) : -1;
    if (t != LM_TYPE_F32 && t != LM_TYPE_F16 && t != LM_TYPE_Q8_0)
        return lm_err(err, errlen, "KV type '%s' is not one of F32, F16, Q8_0", name ? name : "(null)");
    *type = (uint32_t)t;
    return 0;
}

/* Layers of the local class: those flagged, or 0 when there is no window or
 * every layer is flagged (nothing would be global: one class then). */
static int count_local(const kv_config *c) {
    if (c->window <= 0 || !c->layer_local) return 0;
    int n = 0;
    for (int i = 0; i < c->n_layer; i++) n += c->layer_local[i] != 0;
    return n == c->n_layer ? 0 : n;
}

/* A pool of a layer range (pipeline stage): the counts stay those of every
 * layer; the bytes per token, per block and of the slabs become the held
 * layers' (cls[].n_held). Without a range n_held is n_layer. */
static int held_range(const kv_config *c, kv_plan *plan, size_t row, int B, int64_t ng, int64_t nl, uint64_t *per_tok,
                      uint64_t *blk_bytes, uint64_t *gbytes, uint64_t *lbytes, uint64_t *total, char *err,
                      size_t errlen) {
    int n_local = count_local(c);
    for (int k = 0; k < KV_N_CLASS; k++) plan->cls[k].n_held = plan->cls[k].n_layer;
    if (c->layer0 == 0 && c->layer1 == 0) return 0;
    if (c->layer0 < 0 || c->layer1 <= c->layer0 || c->layer1 > c->n_layer)
        return lm_err(err, errlen, "KV layer range [%d, %d) is not inside %d layers", c->layer0, c->layer1, c->n_layer);
    int held[KV_N_CLASS] = {0, 0};
    const uint64_t n_slab = c->latent_v ? 1 : 2; /* K and V slabs, or the latent row alone */
    for (int i = c->layer0; i < c->layer1; i++) held[n_local && c->layer_local[i] ? KV_LOCAL : KV_GLOBAL]++;
    for (int k = 0; k < KV_N_CLASS; k++) {
        plan->cls[k].n_held = held[k];
        plan->cls[k].bytes_per_token = n_slab * (uint64_t)held[k] * (uint64_t)c->n_head_kv * row;
        plan->cls[k].block_bytes = plan->cls[k].bytes_per_token * (uint64_t)B;
    }
    *per_tok = n_slab * (uint64_t)(c->layer1 - c->layer0) * (uint64_t)c->n_head_kv * row;
    *blk_bytes = *per_tok * (uint64_t)B;
    *gbytes = (uint64_t)ng * plan->cls[KV_GLOBAL].block_bytes; /* no overflow: parts of the whole's */
    *lbytes = (uint64_t)nl * plan->cls[KV_LOCAL].block_bytes;
    *total = *gbytes + *lbytes;
    return 0;
}

int kv_plan_make(const kv_config *c, kv_plan *plan, char *err, size_t errlen) {
    memset(plan, 0, sizeof *plan);
    if (c->n_layer <= 0 || c->n_head_kv <= 0 || c->head_dim <= 0)
        return lm_err(err, errlen, "KV cache needs positive layers, KV heads and head dim (got %d, %d, %d)", c->n_layer,
                      c->n_head_kv, c->head_dim);
    if (c->block_size <= 0 || c->block_size > (1 << 20))
        return lm_err(err, errlen, "KV block size must be in 1..%d tokens, got %d", 1 << 20, c->block_size);
    if (c->window < 0) return lm_err(err, errlen, "KV sliding window must be >= 0 tokens, got %d", c->window);
    size_t row;
    if (c->type == LM_TYPE_F32) row = 4 * (size_t)c->head_dim;
    else if (c->type == LM_TYPE_F16) row = 2 * (size_t)c->head_dim;
    else if (c->type == LM_TYPE_Q8_0) {
        if (c->head_dim % QK8_0)
            return lm_err(err, errlen,
                          "KV type Q8_0 needs a head dimension that is a multiple of %d (it stores blocks of %d "
                          "values); this model's head dimension is %d: use F16 or F32",
                          QK8_0, QK8_0, c->head_dim);
        row = (size_t)c->head_dim / QK8_0 * sizeof(block_q8_0);
    } else {
        return lm_err(err, errlen, "KV type %s is not supported (use F32, F16 or Q8_0)", quant_type_name(c->type));
    }
    int B = c->block_size;
    uint64_t per_tok, blk_bytes;
    if (c->latent_v < 0 || c->latent_v > c->head_dim || (c->latent_v && c->n_head_kv != 1))
        return lm_err(err, errlen, "KV latent layout needs one KV head and a value width in 1..%d, got %d heads, %d",
                      c->head_dim, c->n_head_kv, c->latent_v);
    const uint64_t n_slab = c->latent_v ? 1 : 2; /* K and V slabs, or the latent row alone */
    if (!lm_mul_u64(n_slab * (uint64_t)c->n_layer * (uint64_t)c->n_head_kv, row, &per_tok) ||
        !lm_mul_u64(per_tok, (uint64_t)B, &blk_bytes))
        return lm_err(err, errlen, "KV block size overflows");
    /* per class: the same formula over the class's layers (no overflow: a
     * part of per_tok) */
    int n_local = count_local(c);
    int n_cls_layer[KV_N_CLASS] = {c->n_layer - n_local, n_local};
    for (int k = 0; k < KV_N_CLASS; k++) {
        plan->cls[k].n_layer = n_cls_layer[k];
        plan->cls[k].bytes_per_token = n_slab * (uint64_t)n_cls_layer[k] * (uint64_t)c->n_head_kv * row;
        plan->cls[k].block_bytes = plan->cls[k].bytes_per_token * (uint64_t)B;
    }
    /* local blocks one sequence holds at most: after an append of up to
     * chunk positions at length len, positions from the drop point
     * floor((len - window + 1) / B) * B to len + chunk - 1, i.e. at most
     * ceil((window + chunk + B - 2) / B) blocks; and never more than its
     * context's blocks */
    int64_t per_seq = 0;
    if (n_local) {
        if (c->chunk < 1)
            return lm_err(err, errlen,
                          "KV sliding-window layers need the most positions one append adds "
                          "(chunk >= 1), got %d",
                          c->chunk);
        int64_t chunk = c->chunk;
        per_seq = ((int64_t)c->window + chunk + 2 * (int64_t)B - 3) / B;
        if (c->n_ctx > 0 && ((int64_t)c->n_ctx + B - 1) / B < per_seq) per_seq = ((int64_t)c->n_ctx + B - 1) / B;
    }
    int64_t ng, nl = 0;
    if (c->mem_bytes > 0) {
        int64_t n_plain = (int64_t)(c->mem_bytes / blk_bytes); /* what one class of every layer would get */
        if (n_plain < 1)
            return lm_err(err, errlen, "KV budget of %llu bytes is smaller than one block (%llu bytes = %d tokens)",
                          (unsigned long long)c->mem_bytes, (unsigned long long)blk_bytes, B);
        ng = n_plain;
        if (n_local) {
            int64_t seqs = c->n_seqs > 0 ? c->n_seqs : 1;
            nl = seqs > n_plain / per_seq ? n_plain : seqs * per_seq;
            /* the rest buys global blocks: at least n_plain of them, as
             * nl x local + n_plain x global <= n_plain x (local + global) */
            ng = (int64_t)((c->mem_bytes - (uint64_t)nl * plan->cls[KV_LOCAL].block_bytes) /
                           plan->cls[KV_GLOBAL].block_bytes);
        }
    } else {
        if (c->n_ctx <= 0 || c->n_seqs <= 0)
            return lm_err(err, errlen, "KV pool needs a byte budget or a positive context and sequence count");
        ng = (int64_t)c->n_seqs * (((int64_t)c->n_ctx + B - 1) / B);
        if (n_local) nl = (int64_t)c->n_seqs * per_seq;
    }
    if (ng > INT32_MAX - 1 || nl > INT32_MAX - 1)
        return lm_err(err, errlen, "KV pool of %lld blocks is too many (max %d)", (long long)(ng > nl ? ng : nl),
                      INT32_MAX - 1);
    uint64_t gbytes, lbytes, total;
    if (!lm_mul_u64((uint64_t)ng, plan->cls[KV_GLOBAL].block_bytes, &gbytes) ||
        !lm_mul_u64((uint64_t)nl, plan->cls[KV_LOCAL].block_bytes, &lbytes) || !lm_add_u64(gbytes, lbytes, &total) ||
        total > (1ull << 52))
        return lm_err(err, errlen, "KV pool of %lld blocks x %llu bytes is too large", (long long)ng,
                      (unsigned long long)blk_bytes);
    if (held_range(c, plan, row, B, ng, nl, &per_tok, &blk_bytes, &gbytes, &lbytes, &total, err, errlen)) return -1;
    plan->cls[KV_GLOBAL].n_blocks = ng;
    plan->cls[KV_GLOBAL].data_bytes = gbytes;
    plan->cls[KV_LOCAL].n_blocks = nl;
    plan->cls[KV_LOCAL].data_bytes = lbytes;
    plan->row_bytes = row;
    plan->bytes_per_token = per_tok;
    plan->block_bytes = blk_bytes;
    plan->n_blocks = ng;
    plan->n_tokens = ng * B;
    plan->data_bytes = total;
    plan->window = n_local ? c->window : 0;
    plan->local_blocks_per_seq = per_seq;
    plan->chunk = n_local ? c->chunk : 0;
    return KV_OK;
}

/* ---- lists and hash table (one class) -------------------------------------- */

static void lru_unlink(kv_class *k, int32_t b) {
    kv_block *x = &k->blk[b];
    if (x->prev >= 0) k->blk[x->prev].next = x->next;
    else k->lru_head = x->next;
    if (x->next >= 0) k->blk[x->next].prev = x->prev;
    else k->lru_tail = x->prev;
    x->prev = x->next = -1;
}

static void lru_push_tail(kv_class *k, int32_t b) {
    kv_block *x = &k->blk[b];
    x->next = -1;
    x->prev = k->lru_tail;
    if (k->lru_tail >= 0) k->blk[k->lru_tail].next = b;
    else k->lru_head = b;
    k->lru_tail = b;
}

static uint64_t key_bucket(const kv_class *k, const uint8_t *key) {
    uint64_t h;
    memcpy(&h, key, sizeof h);
    return h & k->bucket_mask;
}

static int32_t hash_find(const kv_class *k, const uint8_t *key) {
    for (int32_t b = k->bucket[key_bucket(k, key)]; b >= 0; b = k->blk[b].hnext)
        if (!memcmp(k->blk[b].key, key, KV_KEY_LEN)) return b;
    return -1;
}

static void hash_insert(kv_class *k, int32_t b, const uint8_t *key) {
    kv_block *x = &k->blk[b];
    assert(!x->has_key);
    memcpy(x->key, key, KV_KEY_LEN);
    x->has_key = 1;
    uint64_t h = key_bucket(k, key);
    x->hnext = k->bucket[h];
    k->bucket[h] = b;
}

static void hash_remove(kv_class *k, int32_t b) {
    kv_block *x = &k->blk[b];
    assert(x->has_key);
    int32_t *link = &k->bucket[key_bucket(k, x->key)];
    while (*link != b) link = &k->blk[*link].hnext;
    *link = x->hnext;
    x->hnext = -1;
    x->has_key = 0;
}

/* b's key leaves the cache: out of the hash table, and told to the hook. */
static void drop_key(kv_class *k, int32_t b) {
    hash_remove(k, b);
    if (k->on_evict) k->on_evict(k->evict_ctx, k->blk[b].key); /* the bytes stay until the next insert */
}

/* ---- block lifetime (one class) -------------------------------------------- */

static void set_fill(kv_class *k, int32_t b, int fill) {
    kv_block *x = &k->blk[b];
    assert(x->ref > 0 && fill >= 0 && fill <= k->lay.block_size);
    k->fill_sum += fill - x->fill;
    x->fill = fill;
}

/* A block with ref 1 and fill 0: from the free list, else the least recently
 * released cached block (its key dropped). -1 when none is left. */
static int32_t take_block(kv_class *k) {
    int32_t b;
    if (k->free_head >= 0) {
        b = k->free_head;
        k->free_head = k->blk[b].next;
        k->n_free--;
    } else if (k->lru_head >= 0) {
        b = k->lru_head;
        lru_unlink(k, b);
        drop_key(k, b);
        k->n_cached--;
        k->n_evicted++;
    } else {
        return -1;
    }
    kv_block *x = &k->blk[b];
    x->ref = 1;
    x->fill = 0;
    x->prev = x->next = -1;
    k->n_used++;
    return b;
}

/* Take another reference to b, reviving it from the cached list if unused. */
static void ref_block(kv_class *k, int32_t b) {
    kv_block *x = &k->blk[b];
    if (x->ref == 0) {
        assert(x->has_key);
        lru_unlink(k, b);
        k->n_cached--;
        k->n_used++;
        x->fill = k->lay.block_size; /* keyed blocks are full */
        k->fill_sum += x->fill;
    }
    x->ref++;
}

static void release_block(kv_class *k, int32_t b) {
    kv_block *x = &k->blk[b];
    assert(x->ref > 0);
    if (--x->ref > 0) return;
    k->fill_sum -= x->fill;
    k->n_used--;
    if (x->has_key) {
        lru_push_tail(k, b);
        k->n_cached++;
    } else {
        x->fill = 0;
        x->prev = -1;
        x->next = k->free_head;
        k->free_head = b;
        k->n_free++;
    }
}

/* ---- pool ------------------------------------------------------------- */

/* Allocate one class's memory (slab-major, kv.h), records and hash table
 * for its planned blocks (every block free). -1 when out of memory. */
static int class_init(kv_class *k, const kv_class_plan *cp, const kv_config *c, const kv_plan *plan) {
    int32_t nb = (int32_t)cp->n_blocks;
    uint64_t nbuck = 1;
    while (nbuck < (uint64_t)nb) nbuck <<= 1;
    k->bucket_mask = nbuck - 1;
    k->n_blocks = nb;
    k->bytes_per_token = cp->bytes_per_token;
    /* 2 MiB alignment lets the kernel back a large pool with huge pages:
     * attention's reads jump between the slabs' regions and, where
     * sequences interleave, between blocks of one region; with 4 KiB pages
     * nearly every block's slab it reads would miss the TLB. */
    size_t align = cp->data_bytes >= HUGE_ALIGN ? HUGE_ALIGN : 64;
    k->slab = lm_malloc((size_t)cp->data_bytes + align);
    k->blk = lm_calloc((size_t)nb, sizeof *k->blk);
    k->bucket = lm_malloc((size_t)nbuck * sizeof *k->bucket);
    if (!k->slab || !k->blk || !k->bucket) return -1;
    k->data = (uint8_t *)(((uintptr_t)k->slab + align - 1) & ~(uintptr_t)(align - 1));
#ifdef MADV_HUGEPAGE
    if (align == HUGE_ALIGN) madvise(k->data, (size_t)cp->data_bytes / HUGE_ALIGN * HUGE_ALIGN, MADV_HUGEPAGE);
#endif
    for (uint64_t i = 0; i < nbuck; i++) k->bucket[i] = -1;
    /* free list in ascending order, so a fresh pool hands out 0, 1, 2, ... */
    for (int32_t b = 0; b < nb; b++) {
        k->blk[b].prev = -1;
        k->blk[b].next = b + 1 < nb ? b + 1 : -1;
        k->blk[b].hnext = -1;
    }
    k->free_head = nb > 0 ? 0 : -1;
    k->lru_head = k->lru_tail = -1;
    k->n_free = nb;
    uint64_t stride = (uint64_t)c->block_size * plan->row_bytes; /* one slab of one block */
    k->lay = (kv_layout){.data = k->data,
                         .block_bytes = cp->block_bytes,
                         .block_stride = stride,
                         .slab_stride = stride * (uint64_t)nb,
                         .row_bytes = plan->row_bytes,
                         .block_size = c->block_size,
                         .n_layer = cp->n_held,
                         .n_head_kv = c->n_head_kv,
                         .head_dim = c->head_dim,
                         .type = c->type,
                         .n_slab = c->latent_v ? 1 : 2,
                         .v_dim = c->latent_v ? c->latent_v : c->head_dim};
    return 0;
}

kv_pool *kv_pool_new(const kv_config *c, char *err, size_t errlen) {
    kv_plan plan;
    if (kv_plan_make(c, &plan, err, errlen)) return NULL;
    kv_pool *p = lm_calloc(1, sizeof *p);
    if (!p) {
        lm_err(err, errlen, "out of memory");
        return NULL;
    }
    p->cfg = *c;
    p->cfg.layer_local = NULL; /* the caller's array: not kept */
    p->plan = plan;
    p->n_class = plan.cls[KV_LOCAL].n_layer > 0 ? 2 : 1;
    p->window = plan.window;
    p->block_size = c->block_size;
    p->layer_class = lm_malloc(2 * (size_t)c->n_layer * sizeof *p->layer_class);
    bool ok = p->layer_class != NULL;
    if (ok) {
        p->layer_slot = p->layer_class + c->n_layer;
        int next[KV_N_CLASS] = {0, 0}, l0 = c->layer0, l1 = c->layer1 ? c->layer1 : c->n_layer;
        for (int i = 0; i < c->n_layer; i++) {
            int k = p->n_class > 1 && c->layer_local[i] ? KV_LOCAL : KV_GLOBAL;
            p->layer_class[i] = k;
            p->layer_slot[i] = i >= l0 && i < l1 ? next[k]++ : -1; /* -1: not held (pipeline stage) */
        }
    }
    for (int k = 0; ok && k < p->n_class; k++) ok = class_init(&p->cls[k], &plan.cls[k], c, &plan) == 0;
    if (!ok) {
        lm_err(err, errlen, "out of memory allocating the KV pool (%llu bytes for %lld blocks)",
               (unsigned long long)plan.data_bytes,
               (long long)(plan.cls[KV_GLOBAL].n_blocks + plan.cls[KV_LOCAL].n_blocks));
        kv_pool_free(p);
        return NULL;
    }
    if (p->n_class == 1) /* an unused class: a layout of no layer */
        p->cls[KV_LOCAL].lay = (kv_layout){.row_bytes = plan.row_bytes,
                                           .block_size = c->block_size,
                                           .n_head_kv = c->n_head_kv,
                                           .head_dim = c->head_dim,
                                           .type = c->type,
                                           .n_slab = c->latent_v ? 1 : 2,
                                           .v_dim = c->latent_v ? c->latent_v : c->head_dim};
    return p;
}

void kv_pool_free(kv_pool *p) {
    if (!p) return;
    while (p->seqs) kv_seq_free(p, p->seqs);
    for (int k = 0; k < KV_N_CLASS; k++) {
        lm_free(p->cls[k].slab);
        lm_free(p->cls[k].blk);
        lm_free(p->cls[k].bucket);
    }
    lm_free(p->layer_class);
    lm_free(p->copies);
    lm_free(p);
}

const kv_plan *kv_pool_plan(const kv_pool *p) { return &p->plan; }
int kv_pool_window(const kv_pool *p) { return p->window; }
const kv_layout *kv_pool_layout(const kv_pool *p) { return &p->cls[KV_GLOBAL].lay; }

const kv_layout *kv_class_layout(const kv_pool *p, int cls) {
    assert(cls >= 0 && cls < KV_N_CLASS);
    return &p->cls[cls].lay;
}

int kv_layer_class(const kv_pool *p, int layer, int *slot) {
    assert(layer >= 0 && layer < p->cfg.n_layer && p->layer_slot[layer] >= 0);
    if (slot) *slot = p->layer_slot[layer];
    return p->layer_class[layer];
}

int64_t kv_available(const kv_pool *p, int cls) {
    if (cls < 0 || cls >= p->n_class) return 0;
    return p->cls[cls].n_free + p->cls[cls].n_cached;
}

int kv_class_refcount(const kv_pool *p, int cls, int32_t block) {
    if (cls < 0 || cls >= p->n_class) return -1;
    return block >= 0 && block < p->cls[cls].n_blocks ? p->cls[cls].blk[block].ref : -1;
}

int kv_block_refcount(const kv_pool *p, int32_t block) { return kv_class_refcount(p, KV_GLOBAL, block); }

void kv_stats_get(const kv_pool *p, kv_stats *st) {
    memset(st, 0, sizeof *st);
    int B = p->block_size;
    for (int c = 0; c < p->n_class; c++) {
        const kv_class *k = &p->cls[c];
        kv_class_stats *cs = &st->cls[c];
        cs->n_layer = k->lay.n_layer;
        cs->n_blocks = k->n_blocks;
        cs->n_used = k->n_used;
        cs->n_free = k->n_free;
        cs->n_cached = k->n_cached;
        cs->block_bytes = k->lay.block_bytes;
        cs->bytes_total = (uint64_t)k->n_blocks * k->lay.block_bytes;
        cs->bytes_used = (uint64_t)k->n_used * k->lay.block_bytes;
        cs->slots_filled = k->fill_sum;
        cs->slots_wasted = k->n_used * B - k->fill_sum;
        st->bytes_total += cs->bytes_total;
        st->bytes_used += cs->bytes_used;
        st->bytes_wasted += (uint64_t)cs->slots_wasted * k->bytes_per_token;
        st->n_evicted += k->n_evicted;
        st->n_cow += k->n_cow;
        st->n_dedup += k->n_dedup;
    }
    const kv_class_stats *g = &st->cls[KV_GLOBAL];
    st->n_blocks = g->n_blocks;
    st->n_used = g->n_used;
    st->n_free = g->n_free;
    st->n_cached = g->n_cached;
    st->block_size = B;
    st->block_bytes = g->block_bytes;
    st->slots_filled = g->slots_filled;
    st->slots_wasted = g->slots_wasted;
    st->n_seqs = p->n_seqs;
    st->prefix_queries = p->prefix_queries;
    st->prefix_hit_blocks = p->prefix_hit_blocks;
}

/* ---- sequences ----------------------------------------------------------- */

/* Make room in s's tables for cap_needed logical blocks. */
static int seq_reserve(const kv_pool *p, kv_seq *s, int cap_needed) {
    if (cap_needed <= s->cap) return 0;
    int cap = s->cap ? s->cap : 16;
    while (cap < cap_needed) cap = cap > INT_MAX / 2 ? cap_needed : cap * 2;
    for (int c = 0; c < p->n_class; c++) {
        int32_t *t = lm_realloc(s->table[c], (size_t)cap * sizeof *t);
        if (!t) return -1;
        s->table[c] = t;
    }
    uint8_t(*k)[KV_KEY_LEN] = lm_realloc(s->keys, (size_t)cap * KV_KEY_LEN);
    if (!k) return -1;
    s->keys = k;
    s->cap = cap;
    return 0;
}

/* Leading logical blocks a sequence of length len no longer needs in the
 * local class: those wholly below len - window + 1, the first position a
 * query at len sees. 0 with one class. */
static int drop_point(const kv_pool *p, int len) {
    if (p->n_class < 2) return 0;
    int64_t first = (int64_t)len - p->window + 1;
    return first > 0 ? (int)(first / p->block_size) : 0;
}

kv_seq *kv_seq_new(kv_pool *p, char *err, size_t errlen) {
    kv_seq *s = lm_calloc(1, sizeof *s);
    if (!s) {
        lm_err(err, errlen, "out of memory allocating a KV sequence");
        return NULL;
    }
    s->snext = p->seqs;
    if (p->seqs) p->seqs->sprev = s;
    p->seqs = s;
    p->n_seqs++;
    return s;
}

void kv_seq_free(kv_pool *p, kv_seq *s) {
    if (!s) return;
    for (int c = 0; c < p->n_class && !s->mirror; c++)
        for (int i = s->n_blocks - 1; i >= 0; i--)
            if (s->table[c][i] >= 0) release_block(&p->cls[c], s->table[c][i]);
    if (s->sprev) s->sprev->snext = s->snext;
    else p->seqs = s->snext;
    if (s->snext) s->snext->sprev = s->sprev;
    p->n_seqs--;
    for (int c = 0; c < KV_N_CLASS; c++) lm_free(s->table[c]);
    lm_free(s->keys);
    lm_free(s);
}

kv_seq *kv_fork(kv_pool *p, const kv_seq *src, char *err, size_t errlen) {
    kv_seq *s = kv_seq_new(p, err, errlen);
    if (!s) return NULL;
    if (seq_reserve(p, s, src->n_blocks)) {
        kv_seq_free(p, s);
        lm_err(err, errlen, "out of memory forking a KV sequence of %d blocks", src->n_blocks);
        return NULL;
    }
    for (int c = 0; c < p->n_class; c++)
        for (int i = 0; i < src->n_blocks; i++) {
            s->table[c][i] = src->table[c][i];
            if (src->table[c][i] >= 0) ref_block(&p->cls[c], src->table[c][i]);
        }
    if (src->n_keyed) memcpy(s->keys, src->keys, (size_t)src->n_keyed * KV_KEY_LEN);
    s->n_blocks = src->n_blocks;
    s->len = src->len;
    s->n_keyed = src->n_keyed;
    s->n_dropped = src->n_dropped;
    s->salt = src->salt;
    return s;
}

int kv_seq_len(const kv_seq *s) { return s->len; }
const int32_t *kv_seq_blocks(const kv_seq *s) { return s->table[KV_GLOBAL]; }

const int32_t *kv_seq_table(const kv_seq *s, int cls) {
    assert(cls >= 0 && cls < KV_N_CLASS);
    return s->table[cls];
}

int kv_seq_held(const kv_seq *s, int cls) {
    if (cls < 0 || cls >= KV_N_CLASS || !s->table[cls]) return 0;
    return cls == KV_LOCAL ? s->n_blocks - s->n_dropped : s->n_blocks;
}

/* Whether s's last block of class c must be copied before s writes past len. */
static bool needs_cow(const kv_pool *p, const kv_seq *s, int c) {
    return s->len % p->block_size != 0 && p->cls[c].blk[s->table[c][s->n_blocks - 1]].ref > 1;
}

int64_t kv_blocks_needed(const kv_pool *p, const kv_seq *s, int n, int cls) {
    int B = p->block_size;
    if (n <= 0 || cls < 0 || cls >= p->n_class) return 0;
    int64_t need = ((int64_t)s->len + n + B - 1) / B - s->n_blocks + (needs_cow(p, s, cls) ? 1 : 0);
    if (cls == KV_LOCAL) {
        /* blocks sliding out of the window return to the pool first, those
         * this sequence alone holds */
        const kv_class *k = &p->cls[KV_LOCAL];
        for (int i = s->n_dropped, end = drop_point(p, s->len); i < end; i++)
            need -= k->blk[s->table[KV_LOCAL][i]].ref == 1;
        if (need < 0) need = 0;
    }
    return need;
}

/* Release s's local blocks that no query at s->len or later can see. */
static void drop_window(kv_pool *p, kv_seq *s) {
    int end = drop_point(p, s->len);
    for (; s->n_dropped < end; s->n_dropped++) {
        int32_t *e = &s->table[KV_LOCAL][s->n_dropped];
        release_block(&p->cls[KV_LOCAL], *e);
        *e = -1;
    }
}

/* Block src's rows into block dst, slab by slab (kv.h: the pool is
 * slab-major). */
static void copy_block(kv_class *k, int32_t dst, int32_t src) {
    const kv_layout *l = &k->lay;
    for (uint64_t off = 0; off < (uint64_t)k->n_blocks * l->block_bytes; off += l->slab_stride)
        memcpy(k->data + off + (size_t)dst * l->block_stride, k->data + off + (size_t)src * l->block_stride,
               (size_t)l->block_stride);
}

/* Give s a private copy of its partial last block of class c (the caller
 * reserved it). */
static void cow_last(kv_pool *p, kv_seq *s, int c) {
    kv_class *k = &p->cls[c];
    int32_t old = s->table[c][s->n_blocks - 1];
    int32_t b = take_block(k);
    assert(b >= 0);
    copy_block(k, b, old);
    set_fill(k, b, s->len % p->block_size);
    s->table[c][s->n_blocks - 1] = b;
    release_block(k, old);
    k->n_cow++;
    if (p->copies && p->n_copies >= 0)
        p->copies[p->n_copies < KV_COPY_LOG ? p->n_copies++ : (p->n_copies = -1, 0)] =
            (kv_copy){.cls = c, .src = old, .dst = b};
}

int kv_append(kv_pool *p, kv_seq *s, int n, char *err, size_t errlen) {
    int B = p->block_size;
    if (n < 0) return lm_err(err, errlen, "cannot append %d positions", n);
    if (n == 0) return KV_OK;
    if (n > INT_MAX - B - s->len) return lm_err(err, errlen, "sequence length %d + %d overflows", s->len, n);
    int new_len = s->len + n;
    int nb_new = (new_len + B - 1) / B;
    for (int c = 0; c < p->n_class; c++) {
        int64_t need = kv_blocks_needed(p, s, n, c);
        if (need > kv_available(p, c)) {
            lm_err(err, errlen, "KV cache full: %lld more %sblocks needed for %d tokens, %lld available of %lld",
                   (long long)need,
                   p->n_class == 1     ? ""
                       : c == KV_LOCAL ? "local "
                                       : "global ",
                   n, (long long)kv_available(p, c), (long long)p->cls[c].n_blocks);
            return KV_FULL;
        }
    }
    if (seq_reserve(p, s, nb_new)) return lm_err(err, errlen, "out of memory growing a KV block table to %d", nb_new);
    if (p->n_class > 1) drop_window(p, s);
    for (int c = 0; c < p->n_class; c++) {
        kv_class *k = &p->cls[c];
        if (s->len % B) {
            int32_t last = s->table[c][s->n_blocks - 1];
            assert(last >= 0); /* a partial block holds position len: never out of the window */
            if (k->blk[last].ref > 1) cow_last(p, s, c);
            else if (k->blk[last].has_key) drop_key(k, last); /* its data is about to change */
        }
        for (int i = s->n_blocks; i < nb_new; i++) {
            int32_t b = take_block(k);
            assert(b >= 0);
            s->table[c][i] = b;
        }
        /* every block from the old tail on is private now */
        for (int i = s->len / B; i < nb_new; i++)
            set_fill(k, s->table[c][i], new_len - i * B < B ? new_len - i * B : B);
    }
    s->n_blocks = nb_new;
    s->len = new_len;
    return KV_OK;
}

int kv_truncate(kv_pool *p, kv_seq *s, int n, char *err, size_t errlen) {
    int B = p->block_size;
    if (n < 0 || n > s->len) return lm_err(err, errlen, "cannot truncate a sequence of %d positions to %d", s->len, n);
    /* a query at n sees n - window + 1 .. n: those blocks must still be held */
    if (n > 0 && s->n_dropped > 0 && (int64_t)s->n_dropped * B > (int64_t)n - p->window + 1)
        return lm_err(err, errlen,
                      "cannot truncate a sequence of %d positions to %d: the sliding window's blocks below "
                      "position %d were released",
                      s->len, n, s->n_dropped * B);
    int nb = (n + B - 1) / B;
    for (int c = 0; c < p->n_class; c++)
        for (int i = s->n_blocks - 1; i >= nb; i--)
            if (s->table[c][i] >= 0) release_block(&p->cls[c], s->table[c][i]);
    s->n_blocks = nb;
    s->len = n;
    if (s->n_dropped > nb) s->n_dropped = nb; /* n == 0: nothing is left to release */
    /* A private partial tail block now holds n % B positions in use; a
     * shared one keeps its other owners' fill, and kv_append copies it
     * before writing. A keyed block keeps its key until a write (its data is
     * unchanged, so released now it is still a valid cached block). */
    for (int c = 0; c < p->n_class; c++)
        if (n % B && p->cls[c].blk[s->table[c][nb - 1]].ref == 1) set_fill(&p->cls[c], s->table[c][nb - 1], n % B);
    if (s->n_keyed > n / B) s->n_keyed = n / B;
    return KV_OK;
}

/* ---- K/V writes ----------------------------------------------------------- */

void kv_store_rows(kv_pool *p, const kv_seq *s, int layer, int pos0, int n, const float *k, size_t k_stride,
                   const float *v, size_t v_stride) {
    assert(layer >= 0 && layer < p->cfg.n_layer && pos0 >= 0 && n >= 0 && pos0 + n <= s->len &&
           p->layer_slot[layer] >= 0);
    int c = p->layer_class[layer], slot = p->layer_slot[layer];
    kv_class *kc = &p->cls[c];
    const kv_layout *l = &kc->lay;
    int B = l->block_size, hd = l->head_dim;
    /* the kernel table's conversion, as attention's reads (not for F32) */
    lm_from_float_fn from_float = l->type == LM_TYPE_F32 ? NULL : kernels_type(l->type)->from_float;
    for (int t = 0; t < n; t++) {
        int pos = pos0 + t;
        int32_t b = s->table[c][pos / B];
        assert(b >= 0 &&
               (s->mirror || (kc->blk[b].ref == 1 && !kc->blk[b].has_key))); /* a mirror's blocks are the leader's */
        /* kv_row's offset of row pos % B in block b, less the slab's */
        size_t row = (size_t)b * l->block_stride + (size_t)(pos % B) * l->row_bytes;
        for (int which = 0; which < l->n_slab; which++) { /* latent: the key row alone */
            const float *src = which ? v + (size_t)t * v_stride : k + (size_t)t * k_stride;
            for (int h = 0; h < l->n_head_kv; h++) {
                uint8_t *dst = kc->data + row + kv_slab_offset(l, slot, which, h);
                if (l->type == LM_TYPE_F32) memcpy(dst, src + (size_t)h * hd, (size_t)hd * sizeof(float));
                else from_float(src + (size_t)h * hd, dst, hd);
            }
        }
    }
}

void kv_store(kv_pool *p, const kv_seq *s, int layer, int pos, const float *k, const float *v) {
    kv_store_rows(p, s, layer, pos, 1, k, 0, v, 0);
}

/* ---- prefix cache ------------------------------------------------------- */

void kv_prefix_key(const uint8_t parent[KV_KEY_LEN], uint64_t salt, const int32_t *tokens, int block_size,
                   uint8_t out[KV_KEY_LEN]) {
    static const uint8_t zero[KV_KEY_LEN];
    uint8_t buf[8];
    sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, parent ? parent : zero, KV_KEY_LEN);
    /* integers little-endian, so keys do not depend on the host */
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(salt >> (8 * i));
    sha256_update(&c, buf, 8);
    for (int t = 0; t < block_size; t++) {
        uint32_t u = (uint32_t)tokens[t];
        for (int i = 0; i < 4; i++) buf[i] = (uint8_t)(u >> (8 * i));
        sha256_update(&c, buf, 4);
    }
    sha256_final(&c, out);
}

const uint8_t *kv_seq_key(const kv_seq *s, int i) { return i >= 0 && i < s->n_keyed ? s->keys[i] : NULL; }

void kv_set_evict_hook(kv_pool *p, kv_evict_fn fn, void *ctx) {
    for (int c = 0; c < KV_N_CLASS; c++) {
        p->cls[c].on_evict = fn;
        p->cls[c].evict_ctx = ctx;
    }
}

/* Whether the local blocks a query at position k*B sees (keys[i] for i from
 * the drop point of k*B up to k) are all cached. */
static bool local_ready(const kv_pool *p, const kv_seq *s, int k) {
    if (p->n_class < 2) return true;
    for (int i = drop_point(p, k * p->block_size); i < k; i++)
        if (hash_find(&p->cls[KV_LOCAL], s->keys[i]) < 0) return false;
    return true;
}

int kv_prefix_match(kv_pool *p, kv_seq *s, const int32_t *tokens, int n, uint64_t salt) {
    int B = p->block_size;
    p->prefix_queries++;
    if (s->len != 0 || n <= 1) return 0;
    int max_blocks = (n - 1) / B;
    if (max_blocks == 0 || seq_reserve(p, s, max_blocks)) return 0;
    /* the longest chain of cached global blocks ... */
    int k = 0;
    for (; k < max_blocks; k++) {
        kv_prefix_key(k ? s->keys[k - 1] : NULL, salt, tokens + (size_t)k * B, B, s->keys[k]);
        if (hash_find(&p->cls[KV_GLOBAL], s->keys[k]) < 0) break;
    }
    /* ... shortened until the local blocks its next query sees are cached */
    while (k > 0 && !local_ready(p, s, k)) k--;
    int d = drop_point(p, k * B);
    for (int c = 0; c < p->n_class; c++) {
        kv_class *kc = &p->cls[c];
        for (int i = 0; i < k; i++) {
            if (c == KV_LOCAL && i < d) {
                s->table[c][i] = -1; /* out of the window: never taken */
                continue;
            }
            int32_t b = hash_find(kc, s->keys[i]);
            assert(b >= 0);
            ref_block(kc, b);
            if (kc->blk[b].fill < B) set_fill(kc, b, B); /* an owner may have truncated into it */
            s->table[c][i] = b;
        }
    }
    s->n_blocks = k;
    s->len = k * B;
    s->n_keyed = k;
    s->n_dropped = d;
    s->salt = salt;
    p->prefix_hit_blocks += (uint64_t)k;
    return k * B;
}

void kv_prefix_commit(kv_pool *p, kv_seq *s, const int32_t *tokens, int n_tokens_written, uint64_t salt) {
    int B = p->block_size;
    if (n_tokens_written > s->len) n_tokens_written = s->len;
    int full = n_tokens_written / B;
    if (s->salt != salt) s->n_keyed = 0, s->salt = salt;
    for (int i = s->n_keyed; i < full; i++) {
        kv_prefix_key(i ? s->keys[i - 1] : NULL, salt, tokens + (size_t)i * B, B, s->keys[i]);
        s->n_keyed = i + 1;
        for (int c = 0; c < p->n_class; c++) {
            kv_class *k = &p->cls[c];
            int32_t b = s->table[c][i];
            /* released out of the window, or registered already (matched, or
             * by a fork relative) */
            if (b < 0 || k->blk[b].has_key) continue;
            int32_t other = hash_find(k, s->keys[i]);
            if (other < 0) {
                hash_insert(k, b, s->keys[i]);
            } else {
                /* same prefix computed twice: keep the cached block, drop ours */
                ref_block(k, other);
                if (k->blk[other].fill < B) set_fill(k, other, B);
                s->table[c][i] = other;
                release_block(k, b);
                k->n_dedup++;
            }
        }
    }
}

/* ---- invariants ----------------------------------------------------------- */

/* Every invariant of class c, given refs (zeroed, one per block) as scratch. */
static int check_class(const kv_pool *p, int c, int32_t *refs, char *err, size_t errlen) {
    const kv_class *k = &p->cls[c];
    const char *name = p->n_class == 1 ? "" : c == KV_LOCAL ? "local " : "global ";
    int64_t nb = k->n_blocks, n_free = 0, n_lru = 0, used = 0, fill = 0, keyed_in_hash = 0, keyed = 0;
    int B = p->block_size;
    for (const kv_seq *s = p->seqs; s; s = s->snext) {
        if (s->n_blocks != (s->len + B - 1) / B)
            return lm_err(err, errlen, "sequence of length %d holds %d blocks", s->len, s->n_blocks);
        if (s->n_dropped < 0 || s->n_dropped > drop_point(p, s->len))
            return lm_err(err, errlen, "sequence of length %d released %d local blocks (at most %d)", s->len,
                          s->n_dropped, drop_point(p, s->len));
        for (int i = 0; i < s->n_blocks; i++) {
            int32_t b = s->table[c][i];
            bool dropped = c == KV_LOCAL && i < s->n_dropped;
            if (dropped != (b == -1) || b < -1 || b >= nb)
                return lm_err(err, errlen, "sequence of length %d: %stable entry %d is %d (%d released)", s->len, name,
                              i, b, s->n_dropped);
            if (b >= 0) refs[b]++;
        }
    }
    for (int32_t b = k->free_head; b >= 0 && n_free <= nb; b = k->blk[b].next, n_free++)
        if (k->blk[b].ref || k->blk[b].has_key)
            return lm_err(err, errlen, "free-list %sblock %d has ref %d key %d", name, b, k->blk[b].ref,
                          k->blk[b].has_key);
    int32_t prev = -1;
    for (int32_t b = k->lru_head; b >= 0 && n_lru <= nb; prev = b, b = k->blk[b].next, n_lru++)
        if (k->blk[b].ref || !k->blk[b].has_key || k->blk[b].prev != prev)
            return lm_err(err, errlen, "LRU %sblock %d is inconsistent", name, b);
    if (prev != k->lru_tail) return lm_err(err, errlen, "%sLRU tail is %d, list ends at %d", name, k->lru_tail, prev);
    for (int64_t b = 0; b < nb; b++) {
        const kv_block *x = &k->blk[b];
        if (x->ref != refs[b])
            return lm_err(err, errlen, "%sblock %lld has refcount %d but %d table entries", name, (long long)b, x->ref,
                          refs[b]);
        if (x->ref) used++, fill += x->fill;
        if (x->has_key) {
            keyed++;
            if (hash_find(k, x->key) != (int32_t)b)
                return lm_err(err, errlen, "keyed %sblock %lld is not found under its key", name, (long long)b);
        }
    }
    for (uint64_t h = 0; h <= k->bucket_mask; h++)
        for (int32_t b = k->bucket[h]; b >= 0; b = k->blk[b].hnext) keyed_in_hash++;
    if (n_free != k->n_free || n_lru != k->n_cached || used != k->n_used || used + n_free + n_lru != nb)
        return lm_err(err, errlen, "%scounters: used %lld/%lld free %lld/%lld cached %lld/%lld of %lld", name,
                      (long long)used, (long long)k->n_used, (long long)n_free, (long long)k->n_free, (long long)n_lru,
                      (long long)k->n_cached, (long long)nb);
    if (fill != k->fill_sum || keyed != keyed_in_hash)
        return lm_err(err, errlen, "%sfill sum %lld vs %lld, keyed %lld vs %lld in hash", name, (long long)fill,
                      (long long)k->fill_sum, (long long)keyed, (long long)keyed_in_hash);
    return KV_OK;
}

int kv_pool_check(const kv_pool *p, char *err, size_t errlen) {
    int rc = KV_OK;
    for (int c = 0; c < p->n_class && rc == KV_OK; c++) {
        int32_t *refs = lm_calloc((size_t)p->cls[c].n_blocks, sizeof *refs);
        if (!refs) return lm_err(err, errlen, "out of memory checking the pool");
        rc = check_class(p, c, refs, err, errlen);
        lm_free(refs);
    }
    return rc;
}

/* ---- tensor-parallel followers ------------------------------------------- */

const kv_config *kv_pool_config(const kv_pool *p) { return &p->cfg; }

int kv_copies_log(kv_pool *p, char *err, size_t errlen) {
    if (p->copies) return 0;
    if (!(p->copies = lm_malloc(KV_COPY_LOG * sizeof *p->copies)))
        return lm_err(err, errlen, "out of memory for the KV copy log");
    p->n_copies = 0;
    return 0;
}

int kv_copies_take(kv_pool *p, kv_copy *out) {
    int n = p->copies ? p->n_copies : 0;
    if (n > 0) memcpy(out, p->copies, (size_t)n * sizeof *out);
    if (p->copies) p->n_copies = 0;
    return n;
}

int kv_block_copy(kv_pool *p, const kv_copy *c) {
    if (c->cls < 0 || c->cls >= p->n_class) return -1;
    kv_class *k = &p->cls[c->cls];
    if (c->src < 0 || c->dst < 0 || c->src >= k->n_blocks || c->dst >= k->n_blocks) return -1;
    copy_block(k, c->dst, c->src);
    return 0;
}

int kv_seq_mirror(kv_pool *p, kv_seq *s, const int32_t *const tables[KV_N_CLASS], int n_blocks, int len, int n_dropped,
                  char *err, size_t errlen) {
    int B = p->block_size;
    if (n_blocks < 0 || len < 0 || n_blocks != (len + B - 1) / B || n_dropped < 0 || n_dropped > n_blocks)
        return lm_err(err, errlen, "a mirrored sequence of %d blocks for %d positions", n_blocks, len);
    if (seq_reserve(p, s, n_blocks)) return lm_err(err, errlen, "out of memory mirroring %d blocks", n_blocks);
    for (int c = 0; c < p->n_class; c++)
        for (int i = 0; i < n_blocks; i++) {
            int32_t b = tables[c][i];
            if (b < -1 || b >= p->cls[c].n_blocks || (b < 0 && !(c == KV_LOCAL && i < n_dropped)))
                return lm_err(err, errlen, "block %d of a mirrored table is out of range", (int)b);
            s->table[c][i] = b;
        }
    s->mirror = true;
    s->n_blocks = n_blocks;
    s->len = len;
    s->n_dropped = n_dropped;
    s->n_keyed = 0;
    return 0;
}

int kv_seq_dropped(const kv_seq *s) { return s->n_dropped; }
