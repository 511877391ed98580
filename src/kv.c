/*
 * kv.c - the paged KV cache (see kv.h for the model).
 *
 * Bookkeeping, per physical block b:
 *   ref       sequences whose table holds b (a table holds a block at most
 *             once, so this is also the number of table entries naming b)
 *   fill      positions of b that hold data (the largest coverage any owner
 *             had when it last grew into b); counted in fill_sum while b is
 *             used, which gives the waste figure in O(1)
 *   has_key   b is in the prefix hash table under key
 *   prev/next links in exactly one list when ref == 0: the free list (no
 *             key; singly linked through next) or the LRU list (keyed;
 *             doubly linked, head = least recently released)
 *   hnext     next block in b's hash bucket
 * Invariants (kv_pool_check verifies them): n_used + n_free + n_cached ==
 * n_blocks; a keyed block is full and its data never changes while keyed
 * (a write into it first drops the key or copies the block); a writable
 * position (appended, not yet shared) lives in a block with ref == 1 and no
 * key.
 *
 * Hash table: 2^k buckets (k such that buckets >= n_blocks), indexed by the
 * key's first 8 bytes, chained through hnext; lookups compare all 32 bytes.
 *
 * Each sequence keeps the chain key of its leading full blocks (keys[i] for
 * i < n_keyed), computed once, so commit after every pass hashes only the
 * blocks that became full.
 */
#include "kv.h"

#include <assert.h>
#include <limits.h>
#include <string.h>
#include <sys/mman.h>

#include "quant.h"
#include "sha256.h"
#include "util.h"

#define HUGE_ALIGN ((size_t)2 << 20)

typedef struct {
    int32_t ref;
    int32_t fill;
    int32_t prev, next;
    int32_t hnext;
    uint8_t has_key;
    uint8_t key[KV_KEY_LEN];
} kv_block;

struct kv_seq {
    int32_t *table;               /* (cap) physical block per logical block */
    uint8_t (*keys)[KV_KEY_LEN];  /* (cap) chain key of logical block i, i < n_keyed */
    int n_blocks, cap;            /* n_blocks == ceil(len / B) */
    int len;                      /* positions held */
    int n_keyed;                  /* leading blocks whose chain key is in keys */
    uint64_t salt;                /* salt keys were computed with */
    kv_seq *sprev, *snext;        /* pool's list of live sequences */
};

struct kv_pool {
    kv_config cfg;
    kv_plan plan;
    kv_layout lay;
    void *slab;                   /* unaligned allocation holding data */
    uint8_t *data;                /* (n_blocks, block_bytes), 64-byte aligned */
    kv_block *blk;                /* (n_blocks) */
    int32_t *bucket;              /* (bucket_mask + 1) first block of each chain, -1 empty */
    uint64_t bucket_mask;
    int32_t free_head;            /* free list, -1 empty */
    int32_t lru_head, lru_tail;   /* cached list, -1 empty */
    int64_t n_used, n_free, n_cached;
    int64_t fill_sum;
    kv_seq *seqs;                 /* live sequences */
    int64_t n_seqs;
    uint64_t prefix_queries, prefix_hit_blocks, n_evicted, n_cow, n_dedup;
    const lm_type_traits *tt;     /* conversion of the element type */
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

int kv_plan_make(const kv_config *c, kv_plan *plan, char *err, size_t errlen) {
    memset(plan, 0, sizeof *plan);
    if (c->n_layer <= 0 || c->n_head_kv <= 0 || c->head_dim <= 0)
        return lm_err(err, errlen, "KV cache needs positive layers, KV heads and head dim (got %d, %d, %d)",
                      c->n_layer, c->n_head_kv, c->head_dim);
    if (c->block_size <= 0 || c->block_size > (1 << 20))
        return lm_err(err, errlen, "KV block size must be in 1..%d tokens, got %d", 1 << 20, c->block_size);
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
    uint64_t per_tok, blk_bytes;
    if (!lm_mul_u64(2ull * (uint64_t)c->n_layer * (uint64_t)c->n_head_kv, row, &per_tok) ||
        !lm_mul_u64(per_tok, (uint64_t)c->block_size, &blk_bytes))
        return lm_err(err, errlen, "KV block size overflows");
    int64_t nb;
    if (c->mem_bytes > 0) {
        nb = (int64_t)(c->mem_bytes / blk_bytes);
        if (nb < 1)
            return lm_err(err, errlen, "KV budget of %llu bytes is smaller than one block (%llu bytes = %d tokens)",
                          (unsigned long long)c->mem_bytes, (unsigned long long)blk_bytes, c->block_size);
    } else {
        if (c->n_ctx <= 0 || c->n_seqs <= 0)
            return lm_err(err, errlen, "KV pool needs a byte budget or a positive context and sequence count");
        nb = (int64_t)c->n_seqs * (((int64_t)c->n_ctx + c->block_size - 1) / c->block_size);
    }
    if (nb > INT32_MAX - 1)
        return lm_err(err, errlen, "KV pool of %lld blocks is too many (max %d)", (long long)nb, INT32_MAX - 1);
    uint64_t total;
    if (!lm_mul_u64((uint64_t)nb, blk_bytes, &total) || total > (1ull << 52))
        return lm_err(err, errlen, "KV pool of %lld blocks x %llu bytes is too large", (long long)nb,
                      (unsigned long long)blk_bytes);
    plan->row_bytes = row;
    plan->bytes_per_token = per_tok;
    plan->block_bytes = blk_bytes;
    plan->n_blocks = nb;
    plan->n_tokens = nb * c->block_size;
    plan->data_bytes = total;
    return KV_OK;
}

/* ---- lists and hash table ---------------------------------------------- */

static void lru_unlink(kv_pool *p, int32_t b) {
    kv_block *k = &p->blk[b];
    if (k->prev >= 0) p->blk[k->prev].next = k->next;
    else p->lru_head = k->next;
    if (k->next >= 0) p->blk[k->next].prev = k->prev;
    else p->lru_tail = k->prev;
    k->prev = k->next = -1;
}

static void lru_push_tail(kv_pool *p, int32_t b) {
    kv_block *k = &p->blk[b];
    k->next = -1;
    k->prev = p->lru_tail;
    if (p->lru_tail >= 0) p->blk[p->lru_tail].next = b;
    else p->lru_head = b;
    p->lru_tail = b;
}

static uint64_t key_bucket(const kv_pool *p, const uint8_t *key) {
    uint64_t h;
    memcpy(&h, key, sizeof h);
    return h & p->bucket_mask;
}

static int32_t hash_find(const kv_pool *p, const uint8_t *key) {
    for (int32_t b = p->bucket[key_bucket(p, key)]; b >= 0; b = p->blk[b].hnext)
        if (!memcmp(p->blk[b].key, key, KV_KEY_LEN)) return b;
    return -1;
}

static void hash_insert(kv_pool *p, int32_t b, const uint8_t *key) {
    kv_block *k = &p->blk[b];
    assert(!k->has_key);
    memcpy(k->key, key, KV_KEY_LEN);
    k->has_key = 1;
    uint64_t h = key_bucket(p, key);
    k->hnext = p->bucket[h];
    p->bucket[h] = b;
}

static void hash_remove(kv_pool *p, int32_t b) {
    kv_block *k = &p->blk[b];
    assert(k->has_key);
    int32_t *link = &p->bucket[key_bucket(p, k->key)];
    while (*link != b) link = &p->blk[*link].hnext;
    *link = k->hnext;
    k->hnext = -1;
    k->has_key = 0;
}

/* ---- block lifetime ------------------------------------------------------ */

static void set_fill(kv_pool *p, int32_t b, int fill) {
    kv_block *k = &p->blk[b];
    assert(k->ref > 0 && fill >= 0 && fill <= p->lay.block_size);
    p->fill_sum += fill - k->fill;
    k->fill = fill;
}

/* A block with ref 1 and fill 0: from the free list, else the least recently
 * released cached block (its key dropped). -1 when none is left. */
static int32_t take_block(kv_pool *p) {
    int32_t b;
    if (p->free_head >= 0) {
        b = p->free_head;
        p->free_head = p->blk[b].next;
        p->n_free--;
    } else if (p->lru_head >= 0) {
        b = p->lru_head;
        lru_unlink(p, b);
        hash_remove(p, b);
        p->n_cached--;
        p->n_evicted++;
    } else {
        return -1;
    }
    kv_block *k = &p->blk[b];
    k->ref = 1;
    k->fill = 0;
    k->prev = k->next = -1;
    p->n_used++;
    return b;
}

/* Take another reference to b, reviving it from the cached list if unused. */
static void ref_block(kv_pool *p, int32_t b) {
    kv_block *k = &p->blk[b];
    if (k->ref == 0) {
        assert(k->has_key);
        lru_unlink(p, b);
        p->n_cached--;
        p->n_used++;
        k->fill = p->lay.block_size;  /* keyed blocks are full */
        p->fill_sum += k->fill;
    }
    k->ref++;
}

static void release_block(kv_pool *p, int32_t b) {
    kv_block *k = &p->blk[b];
    assert(k->ref > 0);
    if (--k->ref > 0) return;
    p->fill_sum -= k->fill;
    p->n_used--;
    if (k->has_key) {
        lru_push_tail(p, b);
        p->n_cached++;
    } else {
        k->fill = 0;
        k->prev = -1;
        k->next = p->free_head;
        p->free_head = b;
        p->n_free++;
    }
}

/* ---- pool ------------------------------------------------------------- */

kv_pool *kv_pool_new(const kv_config *c, char *err, size_t errlen) {
    kv_plan plan;
    if (kv_plan_make(c, &plan, err, errlen)) return NULL;
    kv_pool *p = lm_calloc(1, sizeof *p);
    if (!p) {
        lm_err(err, errlen, "out of memory");
        return NULL;
    }
    p->cfg = *c;
    p->plan = plan;
    int32_t nb = (int32_t)plan.n_blocks;
    uint64_t nbuck = 1;
    while (nbuck < (uint64_t)nb) nbuck <<= 1;
    p->bucket_mask = nbuck - 1;
    /* 2 MiB alignment lets the kernel back a large pool with huge pages:
     * attention walks blocks scattered over the whole slab, and with 4 KiB
     * pages nearly every block slab it reads would miss the TLB. */
    size_t align = plan.data_bytes >= HUGE_ALIGN ? HUGE_ALIGN : 64;
    p->slab = lm_malloc((size_t)plan.data_bytes + align);
    p->blk = lm_calloc((size_t)nb, sizeof *p->blk);
    p->bucket = lm_malloc((size_t)nbuck * sizeof *p->bucket);
    if (!p->slab || !p->blk || !p->bucket) {
        lm_err(err, errlen, "out of memory allocating the KV pool (%llu bytes for %lld blocks)",
               (unsigned long long)plan.data_bytes, (long long)plan.n_blocks);
        kv_pool_free(p);
        return NULL;
    }
    p->data = (uint8_t *)(((uintptr_t)p->slab + align - 1) & ~(uintptr_t)(align - 1));
#ifdef MADV_HUGEPAGE
    if (align == HUGE_ALIGN) madvise(p->data, (size_t)plan.data_bytes / HUGE_ALIGN * HUGE_ALIGN, MADV_HUGEPAGE);
#endif
    for (uint64_t i = 0; i < nbuck; i++) p->bucket[i] = -1;
    /* free list in ascending order, so a fresh pool hands out 0, 1, 2, ... */
    for (int32_t b = 0; b < nb; b++) {
        p->blk[b].prev = -1;
        p->blk[b].next = b + 1 < nb ? b + 1 : -1;
        p->blk[b].hnext = -1;
    }
    p->free_head = 0;
    p->lru_head = p->lru_tail = -1;
    p->n_free = nb;
    p->lay = (kv_layout){.data = p->data, .block_bytes = plan.block_bytes, .row_bytes = plan.row_bytes,
                         .block_size = c->block_size, .n_layer = c->n_layer, .n_head_kv = c->n_head_kv,
                         .head_dim = c->head_dim, .type = c->type};
    p->tt = quant_traits(c->type);
    return p;
}

void kv_pool_free(kv_pool *p) {
    if (!p) return;
    while (p->seqs) kv_seq_free(p, p->seqs);
    lm_free(p->slab);
    lm_free(p->blk);
    lm_free(p->bucket);
    lm_free(p);
}

const kv_layout *kv_pool_layout(const kv_pool *p) { return &p->lay; }

int64_t kv_available(const kv_pool *p) { return p->n_free + p->n_cached; }

int kv_block_refcount(const kv_pool *p, int32_t block) {
    return block >= 0 && block < p->plan.n_blocks ? p->blk[block].ref : -1;
}

void kv_stats_get(const kv_pool *p, kv_stats *st) {
    memset(st, 0, sizeof *st);
    int B = p->lay.block_size;
    st->n_blocks = p->plan.n_blocks;
    st->n_used = p->n_used;
    st->n_free = p->n_free;
    st->n_cached = p->n_cached;
    st->block_size = B;
    st->block_bytes = p->plan.block_bytes;
    st->bytes_total = p->plan.data_bytes;
    st->bytes_used = (uint64_t)p->n_used * p->plan.block_bytes;
    st->slots_filled = p->fill_sum;
    st->slots_wasted = p->n_used * B - p->fill_sum;
    st->bytes_wasted = (uint64_t)st->slots_wasted * p->plan.bytes_per_token;
    st->n_seqs = p->n_seqs;
    st->prefix_queries = p->prefix_queries;
    st->prefix_hit_blocks = p->prefix_hit_blocks;
    st->n_evicted = p->n_evicted;
    st->n_cow = p->n_cow;
    st->n_dedup = p->n_dedup;
}

/* ---- sequences ----------------------------------------------------------- */

/* Make room in s's table for cap_needed logical blocks. */
static int seq_reserve(kv_seq *s, int cap_needed) {
    if (cap_needed <= s->cap) return 0;
    int cap = s->cap ? s->cap : 16;
    while (cap < cap_needed) cap = cap > INT_MAX / 2 ? cap_needed : cap * 2;
    int32_t *t = lm_realloc(s->table, (size_t)cap * sizeof *t);
    if (!t) return -1;
    s->table = t;
    uint8_t(*k)[KV_KEY_LEN] = lm_realloc(s->keys, (size_t)cap * KV_KEY_LEN);
    if (!k) return -1;
    s->keys = k;
    s->cap = cap;
    return 0;
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
    for (int i = s->n_blocks - 1; i >= 0; i--) release_block(p, s->table[i]);
    if (s->sprev) s->sprev->snext = s->snext;
    else p->seqs = s->snext;
    if (s->snext) s->snext->sprev = s->sprev;
    p->n_seqs--;
    lm_free(s->table);
    lm_free(s->keys);
    lm_free(s);
}

kv_seq *kv_fork(kv_pool *p, const kv_seq *src, char *err, size_t errlen) {
    kv_seq *s = kv_seq_new(p, err, errlen);
    if (!s) return NULL;
    if (seq_reserve(s, src->n_blocks)) {
        kv_seq_free(p, s);
        lm_err(err, errlen, "out of memory forking a KV sequence of %d blocks", src->n_blocks);
        return NULL;
    }
    for (int i = 0; i < src->n_blocks; i++) {
        s->table[i] = src->table[i];
        ref_block(p, src->table[i]);
    }
    if (src->n_keyed) memcpy(s->keys, src->keys, (size_t)src->n_keyed * KV_KEY_LEN);
    s->n_blocks = src->n_blocks;
    s->len = src->len;
    s->n_keyed = src->n_keyed;
    s->salt = src->salt;
    return s;
}

int kv_seq_len(const kv_seq *s) { return s->len; }
const int32_t *kv_seq_blocks(const kv_seq *s) { return s->table; }

/* Whether s's last block must be copied before s writes past len. */
static bool needs_cow(const kv_pool *p, const kv_seq *s) {
    return s->len % p->lay.block_size != 0 && p->blk[s->table[s->n_blocks - 1]].ref > 1;
}

int64_t kv_blocks_needed(const kv_pool *p, const kv_seq *s, int n) {
    int B = p->lay.block_size;
    if (n <= 0) return 0;
    int64_t need = ((int64_t)s->len + n + B - 1) / B - s->n_blocks;
    return need + (needs_cow(p, s) ? 1 : 0);
}

/* Give s a private copy of its partial last block (the caller reserved it). */
static void cow_last(kv_pool *p, kv_seq *s) {
    int32_t old = s->table[s->n_blocks - 1];
    int32_t b = take_block(p);
    assert(b >= 0);
    memcpy(p->data + (size_t)b * p->plan.block_bytes, p->data + (size_t)old * p->plan.block_bytes,
           (size_t)p->plan.block_bytes);
    set_fill(p, b, s->len % p->lay.block_size);
    s->table[s->n_blocks - 1] = b;
    release_block(p, old);
    p->n_cow++;
}

int kv_append(kv_pool *p, kv_seq *s, int n, char *err, size_t errlen) {
    int B = p->lay.block_size;
    if (n < 0) return lm_err(err, errlen, "cannot append %d positions", n);
    if (n == 0) return KV_OK;
    if (n > INT_MAX - B - s->len)
        return lm_err(err, errlen, "sequence length %d + %d overflows", s->len, n);
    int new_len = s->len + n;
    int nb_new = (new_len + B - 1) / B;
    int64_t need = kv_blocks_needed(p, s, n);
    if (need > kv_available(p)) {
        lm_err(err, errlen, "KV cache full: %lld more blocks needed for %d tokens, %lld available of %lld",
               (long long)need, n, (long long)kv_available(p), (long long)p->plan.n_blocks);
        return KV_FULL;
    }
    if (seq_reserve(s, nb_new)) return lm_err(err, errlen, "out of memory growing a KV block table to %d", nb_new);
    if (s->len % B) {
        int32_t last = s->table[s->n_blocks - 1];
        if (p->blk[last].ref > 1) cow_last(p, s);
        else if (p->blk[last].has_key) hash_remove(p, last); /* its data is about to change */
    }
    while (s->n_blocks < nb_new) {
        int32_t b = take_block(p);
        assert(b >= 0);
        s->table[s->n_blocks++] = b;
    }
    /* every block from the old tail on is private now */
    for (int i = s->len / B; i < nb_new; i++) set_fill(p, s->table[i], new_len - i * B < B ? new_len - i * B : B);
    s->len = new_len;
    return KV_OK;
}

int kv_truncate(kv_pool *p, kv_seq *s, int n, char *err, size_t errlen) {
    int B = p->lay.block_size;
    if (n < 0 || n > s->len) return lm_err(err, errlen, "cannot truncate a sequence of %d positions to %d", s->len, n);
    int nb = (n + B - 1) / B;
    for (int i = s->n_blocks - 1; i >= nb; i--) release_block(p, s->table[i]);
    s->n_blocks = nb;
    s->len = n;
    /* A private partial tail block now holds n % B positions in use; a
     * shared one keeps its other owners' fill, and kv_append copies it
     * before writing. A keyed block keeps its key until a write (its data is
     * unchanged, so released now it is still a valid cached block). */
    if (n % B && p->blk[s->table[nb - 1]].ref == 1) set_fill(p, s->table[nb - 1], n % B);
    if (s->n_keyed > n / B) s->n_keyed = n / B;
    return KV_OK;
}

/* ---- K/V writes ----------------------------------------------------------- */

void kv_store_rows(kv_pool *p, const kv_seq *s, int layer, int pos0, int n, const float *k, size_t k_stride,
                   const float *v, size_t v_stride) {
    const kv_layout *l = &p->lay;
    int B = l->block_size, hd = l->head_dim;
    assert(layer >= 0 && layer < l->n_layer && pos0 >= 0 && n >= 0 && pos0 + n <= s->len);
    for (int t = 0; t < n; t++) {
        int pos = pos0 + t;
        int32_t b = s->table[pos / B];
        assert(p->blk[b].ref == 1 && !p->blk[b].has_key);
        uint8_t *base = p->data + (size_t)b * l->block_bytes + (size_t)(pos % B) * l->row_bytes;
        for (int which = 0; which < 2; which++) {
            const float *src = which ? v + (size_t)t * v_stride : k + (size_t)t * k_stride;
            for (int h = 0; h < l->n_head_kv; h++) {
                uint8_t *dst = base + kv_slab_offset(l, layer, which, h);
                if (l->type == LM_TYPE_F32) memcpy(dst, src + (size_t)h * hd, (size_t)hd * sizeof(float));
                else p->tt->from_float(src + (size_t)h * hd, dst, hd);
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

int kv_prefix_match(kv_pool *p, kv_seq *s, const int32_t *tokens, int n, uint64_t salt) {
    int B = p->lay.block_size;
    p->prefix_queries++;
    if (s->len != 0 || n <= 1) return 0;
    int max_blocks = (n - 1) / B;
    if (max_blocks == 0 || seq_reserve(s, max_blocks)) return 0;
    int i = 0;
    for (; i < max_blocks; i++) {
        kv_prefix_key(i ? s->keys[i - 1] : NULL, salt, tokens + (size_t)i * B, B, s->keys[i]);
        int32_t b = hash_find(p, s->keys[i]);
        if (b < 0) break;
        ref_block(p, b);
        if (p->blk[b].fill < B) set_fill(p, b, B); /* an owner may have truncated into it */
        s->table[i] = b;
    }
    s->n_blocks = i;
    s->len = i * B;
    s->n_keyed = i;
    s->salt = salt;
    p->prefix_hit_blocks += (uint64_t)i;
    return i * B;
}

void kv_prefix_commit(kv_pool *p, kv_seq *s, const int32_t *tokens, int n_tokens_written, uint64_t salt) {
    int B = p->lay.block_size;
    if (n_tokens_written > s->len) n_tokens_written = s->len;
    int full = n_tokens_written / B;
    if (s->salt != salt) s->n_keyed = 0, s->salt = salt;
    for (int i = s->n_keyed; i < full; i++) {
        kv_prefix_key(i ? s->keys[i - 1] : NULL, salt, tokens + (size_t)i * B, B, s->keys[i]);
        s->n_keyed = i + 1;
        int32_t b = s->table[i];
        if (p->blk[b].has_key) continue; /* registered already (matched, or by a fork relative) */
        int32_t other = hash_find(p, s->keys[i]);
        if (other < 0) {
            hash_insert(p, b, s->keys[i]);
        } else {
            /* same prefix computed twice: keep the cached block, drop ours */
            ref_block(p, other);
            if (p->blk[other].fill < B) set_fill(p, other, B);
            s->table[i] = other;
            release_block(p, b);
            p->n_dedup++;
        }
    }
}

/* ---- invariants ----------------------------------------------------------- */

int kv_pool_check(const kv_pool *p, char *err, size_t errlen) {
    int64_t nb = p->plan.n_blocks, n_free = 0, n_lru = 0, used = 0, fill = 0, keyed_in_hash = 0, keyed = 0;
    int B = p->lay.block_size;
    int32_t *refs = lm_calloc((size_t)nb, sizeof *refs);
    if (!refs) return lm_err(err, errlen, "out of memory checking the pool");
    int rc = KV_ERR;
    for (const kv_seq *s = p->seqs; s; s = s->snext) {
        if (s->n_blocks != (s->len + B - 1) / B) {
            lm_err(err, errlen, "sequence of length %d holds %d blocks", s->len, s->n_blocks);
            goto out;
        }
        for (int i = 0; i < s->n_blocks; i++) refs[s->table[i]]++;
    }
    for (int32_t b = p->free_head; b >= 0 && n_free <= nb; b = p->blk[b].next, n_free++)
        if (p->blk[b].ref || p->blk[b].has_key) {
            lm_err(err, errlen, "free-list block %d has ref %d key %d", b, p->blk[b].ref, p->blk[b].has_key);
            goto out;
        }
    int32_t prev = -1;
    for (int32_t b = p->lru_head; b >= 0 && n_lru <= nb; prev = b, b = p->blk[b].next, n_lru++)
        if (p->blk[b].ref || !p->blk[b].has_key || p->blk[b].prev != prev) {
            lm_err(err, errlen, "LRU block %d is inconsistent", b);
            goto out;
        }
    if (prev != p->lru_tail) {
        lm_err(err, errlen, "LRU tail is %d, list ends at %d", p->lru_tail, prev);
        goto out;
    }
    for (int64_t b = 0; b < nb; b++) {
        const kv_block *k = &p->blk[b];
        if (k->ref != refs[b]) {
            lm_err(err, errlen, "block %lld has refcount %d but %d table entries", (long long)b, k->ref, refs[b]);
            goto out;
        }
        if (k->ref) used++, fill += k->fill;
        if (k->has_key) {
            keyed++;
            if (hash_find(p, k->key) != (int32_t)b) {
                lm_err(err, errlen, "keyed block %lld is not found under its key", (long long)b);
                goto out;
            }
        }
    }
    for (uint64_t h = 0; h <= p->bucket_mask; h++)
        for (int32_t b = p->bucket[h]; b >= 0; b = p->blk[b].hnext) keyed_in_hash++;
    if (n_free != p->n_free || n_lru != p->n_cached || used != p->n_used || used + n_free + n_lru != nb) {
        lm_err(err, errlen, "counters: used %lld/%lld free %lld/%lld cached %lld/%lld of %lld", (long long)used,
               (long long)p->n_used, (long long)n_free, (long long)p->n_free, (long long)n_lru,
               (long long)p->n_cached, (long long)nb);
        goto out;
    }
    if (fill != p->fill_sum || keyed != keyed_in_hash) {
        lm_err(err, errlen, "fill sum %lld vs %lld, keyed %lld vs %lld in hash", (long long)fill,
               (long long)p->fill_sum, (long long)keyed, (long long)keyed_in_hash);
        goto out;
    }
    rc = KV_OK;
out:
    lm_free(refs);
    return rc;
}
