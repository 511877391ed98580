/*
 * rstate.c - the recurrent state store (see rstate.h for the model).
 *
 * One slab holds every slot, live ones first, then checkpoints, then
 * snapshots: slot i of the slab starts at data + i x slot_floats. Beside it,
 * per kind:
 *   live        used flag; free ones on a stack (next), lowest index on top
 *               at creation; per used slot its reservation: the first
 *               checkpoint of a chain (ck_next) and the position before
 *               its first entry (ck_pos0)
 *   checkpoint  owner (live slot, -1 free); free ones on a stack through
 *               ck_next; saved[e * n_layer + layer] = 1 once that layer was
 *               copied in since the reservation; a reserved chain holds
 *               positions pos0+1, pos0+2, ... in order
 *   snapshot    key; unused ones on a stack through next; used ones on the
 *               LRU list (prev/next, head = least recently used) and in a
 *               hash table of 2^k buckets (k such that buckets >= n_snap)
 *               indexed by the key's first 8 bytes, chained through hnext
 * Invariants (rstate_pool_check verifies them): the counters equal the
 * lists' lengths; a live slot's chain has ck_n entries, each owned by it; a
 * free checkpoint has no owner; every used snapshot is found under its key,
 * and no key is stored twice.
 */
#include "kv/rstate.h"

#include <assert.h>
#include <string.h>
#include <sys/mman.h>

#include "base/util.h"

#define ALIGN_FLOATS 16 /* 64 bytes */
#define HUGE_ALIGN ((size_t)2 << 20)

typedef struct {
    uint8_t key[KV_KEY_LEN];
    uint8_t used;
    int32_t prev, next; /* LRU list when used, free stack (next) otherwise */
    int32_t hnext;      /* next snapshot in the key's bucket */
} rs_snap;

struct rstate_pool {
    rstate_config cfg;
    rstate_plan plan;
    size_t slot_floats, layer_floats, conv_pad; /* slot and layer strides, the matrix's offset in a layer */
    void *slab;                                 /* unaligned allocation holding data */
    float *data;                                /* (n_slots, slot_floats), 64-byte aligned */
    void *meta;                                 /* one allocation holding every array below */
    /* live slots */
    uint8_t *live_used; /* (n_seqs) */
    int32_t *live_next; /* (n_seqs) free stack */
    int32_t *ck_head;   /* (n_seqs) first checkpoint of the slot's reservation, -1 none */
    int32_t *ck_pos0;   /* (n_seqs) the reservation's pos0 */
    int32_t *ck_n;      /* (n_seqs) checkpoints reserved */
    int32_t live_free;  /* top of the free stack, -1 empty */
    int64_t n_live_used;
    /* checkpoints */
    int32_t *ck_owner; /* (n_ckpt) live slot, -1 free */
    int32_t *ck_next;  /* (n_ckpt) next in its chain or on the free stack */
    uint8_t *ck_saved; /* (n_ckpt, n_layer) */
    int32_t ck_free;
    int64_t n_ckpt_used;
    /* snapshots */
    rs_snap *snap;   /* (n_snap) */
    int32_t *bucket; /* (bucket_mask + 1) first snapshot of each chain, -1 empty */
    uint64_t bucket_mask;
    int32_t snap_free;
    int32_t lru_head, lru_tail;
    int64_t n_snap_used;
    uint64_t snap_saved, snap_restored, snap_evicted, snap_dropped;
    /* the operation log (rstate_log_start): NULL and off until started */
    bool logging, log_lost;
    rstate_op *log; /* (log_cap) operations since the last rstate_log_take */
    int log_n, log_cap;
};

void rstate_config_init(rstate_config *c, int n_layer, int d_conv, int conv_channels, int n_v_heads, int head_k_dim,
                        int head_v_dim) {
    memset(c, 0, sizeof *c);
    c->n_layer = n_layer;
    c->d_conv = d_conv;
    c->conv_channels = conv_channels;
    c->n_v_heads = n_v_heads;
    c->head_k_dim = head_k_dim;
    c->head_v_dim = head_v_dim;
    c->n_seqs = 1;
}

static uint64_t pad_floats(uint64_t n) { return (n + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS; }

int rstate_plan_make(const rstate_config *c, rstate_plan *plan, char *err, size_t errlen) {
    memset(plan, 0, sizeof *plan);
    if (c->n_layer <= 0 || c->d_conv <= 0 || c->conv_channels <= 0 || c->n_v_heads <= 0 || c->head_k_dim <= 0 ||
        c->head_v_dim <= 0)
        return lm_err(err, errlen,
                      "recurrent state needs positive layers, convolution width and channels, value heads and head "
                      "dims (got %d, %d, %d, %d, %d, %d)",
                      c->n_layer, c->d_conv, c->conv_channels, c->n_v_heads, c->head_k_dim, c->head_v_dim);
    if (c->n_seqs <= 0 || c->n_ckpt < 0 || c->n_snap < 0)
        return lm_err(err, errlen,
                      "recurrent state needs at least one live slot and no negative count (got %d live, %d "
                      "checkpoint, %d snapshot slots)",
                      c->n_seqs, c->n_ckpt, c->n_snap);
    int64_t n_slots = (int64_t)c->n_seqs + c->n_ckpt + c->n_snap;
    if (n_slots > INT32_MAX - 1)
        return lm_err(err, errlen, "recurrent state of %lld slots is too many (max %d)", (long long)n_slots,
                      INT32_MAX - 1);
    /* every factor below 2^31: the products of two fit, three are checked */
    uint64_t conv = (uint64_t)(c->d_conv - 1) * (uint64_t)c->conv_channels, mat, layer, slot, total;
    if (!lm_mul_u64((uint64_t)c->n_v_heads * (uint64_t)c->head_k_dim, (uint64_t)c->head_v_dim, &mat) ||
        !lm_add_u64(pad_floats(conv), pad_floats(mat), &layer) || !lm_mul_u64(layer, 4 * (uint64_t)c->n_layer, &slot) ||
        !lm_mul_u64(slot, (uint64_t)n_slots, &total) || total > (1ull << 52))
        return lm_err(err, errlen, "recurrent state of %lld slots of %d layers is too large", (long long)n_slots,
                      c->n_layer);
    plan->conv_floats = (int64_t)conv;
    plan->mat_floats = (int64_t)mat;
    plan->layer_bytes = layer * 4;
    plan->slot_bytes = slot;
    plan->n_slots = n_slots;
    plan->live_bytes = (uint64_t)c->n_seqs * slot;
    plan->ckpt_bytes = (uint64_t)c->n_ckpt * slot;
    plan->snap_bytes = (uint64_t)c->n_snap * slot;
    plan->data_bytes = total;
    return RSTATE_OK;
}

/* ---- pool ------------------------------------------------------------------ */

static size_t rnd8(size_t n) { return (n + 7) / 8 * 8; }

/* Carve n elements of size sz from *cur, keeping it 8-byte aligned. */
static void *carve(uint8_t **cur, size_t n, size_t sz) {
    void *p = *cur;
    *cur += rnd8(n * sz);
    return p;
}

rstate_pool *rstate_pool_new(const rstate_config *c, char *err, size_t errlen) {
    rstate_plan plan;
    if (rstate_plan_make(c, &plan, err, errlen)) return NULL;
    rstate_pool *p = lm_calloc(1, sizeof *p);
    if (!p) {
        lm_err(err, errlen, "out of memory");
        return NULL;
    }
    p->cfg = *c;
    p->plan = plan;
    p->conv_pad = (size_t)pad_floats((uint64_t)plan.conv_floats);
    p->layer_floats = (size_t)(plan.layer_bytes / 4);
    p->slot_floats = (size_t)(plan.slot_bytes / 4);
    size_t ns = (size_t)c->n_seqs, nc = (size_t)c->n_ckpt, nn = (size_t)c->n_snap;
    uint64_t nbuck = 1;
    while (nbuck < (uint64_t)nn) nbuck <<= 1;
    p->bucket_mask = nbuck - 1;
    size_t meta = rnd8(ns) + 4 * rnd8(ns * 4) + 2 * rnd8(nc * 4) + rnd8(nc * (size_t)c->n_layer) +
        rnd8(nn * sizeof(rs_snap)) + rnd8((size_t)nbuck * 4);
    /* 2 MiB alignment lets the kernel back a large slab with huge pages */
    size_t align = plan.data_bytes >= HUGE_ALIGN ? HUGE_ALIGN : 64;
    p->slab = lm_malloc((size_t)plan.data_bytes + align);
    p->meta = lm_calloc(1, meta);
    if (!p->slab || !p->meta) {
        lm_err(err, errlen, "out of memory allocating the recurrent state (%llu bytes for %lld slots)",
               (unsigned long long)plan.data_bytes, (long long)plan.n_slots);
        rstate_pool_free(p);
        return NULL;
    }
    p->data = (float *)(((uintptr_t)p->slab + align - 1) & ~(uintptr_t)(align - 1));
#ifdef MADV_HUGEPAGE
    if (align == HUGE_ALIGN) madvise(p->data, (size_t)plan.data_bytes / HUGE_ALIGN * HUGE_ALIGN, MADV_HUGEPAGE);
#endif
    uint8_t *cur = p->meta;
    p->live_used = carve(&cur, ns, 1);
    p->live_next = carve(&cur, ns, 4);
    p->ck_head = carve(&cur, ns, 4);
    p->ck_pos0 = carve(&cur, ns, 4);
    p->ck_n = carve(&cur, ns, 4);
    p->ck_owner = carve(&cur, nc, 4);
    p->ck_next = carve(&cur, nc, 4);
    p->ck_saved = carve(&cur, nc * (size_t)c->n_layer, 1);
    p->snap = carve(&cur, nn, sizeof(rs_snap));
    p->bucket = carve(&cur, (size_t)nbuck, 4);
    assert((size_t)(cur - (uint8_t *)p->meta) <= meta);
    /* free stacks hand out 0, 1, 2, ... */
    for (size_t i = 0; i < ns; i++) {
        p->live_next[i] = i + 1 < ns ? (int32_t)i + 1 : -1;
        p->ck_head[i] = -1;
    }
    p->live_free = 0;
    for (size_t i = 0; i < nc; i++) {
        p->ck_owner[i] = -1;
        p->ck_next[i] = i + 1 < nc ? (int32_t)i + 1 : -1;
    }
    p->ck_free = nc ? 0 : -1;
    for (size_t i = 0; i < nn; i++) {
        p->snap[i].prev = p->snap[i].hnext = -1;
        p->snap[i].next = i + 1 < nn ? (int32_t)i + 1 : -1;
    }
    p->snap_free = nn ? 0 : -1;
    for (uint64_t h = 0; h < nbuck; h++) p->bucket[h] = -1;
    p->lru_head = p->lru_tail = -1;
    return p;
}

void rstate_pool_free(rstate_pool *p) {
    if (!p) return;
    lm_free(p->log);
    lm_free(p->slab);
    lm_free(p->meta);
    lm_free(p);
}

const rstate_plan *rstate_pool_plan(const rstate_pool *p) { return &p->plan; }
const rstate_config *rstate_pool_config(const rstate_pool *p) { return &p->cfg; }

/* Slot i of the slab (live, then checkpoints, then snapshots). */
static float *slab_slot(const rstate_pool *p, int64_t i) { return p->data + (size_t)i * p->slot_floats; }
static float *ckpt_slot(const rstate_pool *p, int32_t e) { return slab_slot(p, p->cfg.n_seqs + (int64_t)e); }
static float *snap_slot(const rstate_pool *p, int32_t s) {
    return slab_slot(p, (int64_t)p->cfg.n_seqs + p->cfg.n_ckpt + s);
}

static void ck_free_chain(rstate_pool *p, int slot);

/* ---- the operation log ----------------------------------------------------- */

/* Append one operation that changed the store (logging only). An append
 * that cannot grow the log marks it lost: rstate_log_take then fails. */
static void log_op(rstate_pool *p, int op, int a, int b, int c, const uint8_t *key) {
    if (!p->logging || p->log_lost) return;
    if (p->log_n == p->log_cap) {
        int cap = p->log_cap ? 2 * p->log_cap : 64;
        rstate_op *n = cap > p->log_cap ? lm_realloc(p->log, (size_t)cap * sizeof *n) : NULL;
        if (!n) {
            p->log_lost = true;
            return;
        }
        p->log = n;
        p->log_cap = cap;
    }
    rstate_op *o = &p->log[p->log_n++];
    memset(o, 0, sizeof *o);
    o->op = op, o->a = a, o->b = b, o->c = c;
    if (key) memcpy(o->key, key, KV_KEY_LEN);
}

void rstate_log_start(rstate_pool *p) { p->logging = true; }

int rstate_log_take(rstate_pool *p, const rstate_op **ops) {
    int n = p->log_n;
    *ops = p->log;
    p->log_n = 0;
    if (p->log_lost) return p->log_lost = false, -1;
    return n;
}

/* ---- live slots ------------------------------------------------------------ */

bool rstate_acquired(const rstate_pool *p, int slot) { return slot >= 0 && slot < p->cfg.n_seqs && p->live_used[slot]; }

int rstate_available(const rstate_pool *p) { return p->cfg.n_seqs - (int)p->n_live_used; }

/* A free live slot marked used (contents as they were), or -1. */
static int take_live(rstate_pool *p) {
    int32_t s = p->live_free;
    if (s < 0) return -1;
    p->live_free = p->live_next[s];
    p->live_next[s] = -1;
    p->live_used[s] = 1;
    p->n_live_used++;
    return s;
}

static int full_live(const rstate_pool *p, char *err, size_t errlen) {
    lm_err(err, errlen, "recurrent state full: all %d live slots are taken", p->cfg.n_seqs);
    return RSTATE_FULL;
}

int rstate_acquire(rstate_pool *p, char *err, size_t errlen) {
    int s = take_live(p);
    if (s < 0) return full_live(p, err, errlen);
    memset(slab_slot(p, s), 0, p->plan.slot_bytes);
    log_op(p, RSTATE_OP_ACQUIRE, s, 0, 0, NULL);
    return s;
}

int rstate_release(rstate_pool *p, int slot) {
    if (slot < 0) return RSTATE_OK;
    if (!rstate_acquired(p, slot)) return RSTATE_ERR;
    ck_free_chain(p, slot);
    log_op(p, RSTATE_OP_RELEASE, slot, 0, 0, NULL);
    p->live_used[slot] = 0;
    p->live_next[slot] = p->live_free;
    p->live_free = slot;
    p->n_live_used--;
    return RSTATE_OK;
}

int rstate_fork(rstate_pool *p, int src, char *err, size_t errlen) {
    if (!rstate_acquired(p, src)) return lm_err(err, errlen, "cannot fork recurrent state slot %d: not acquired", src);
    int s = take_live(p);
    if (s < 0) return full_live(p, err, errlen);
    memcpy(slab_slot(p, s), slab_slot(p, src), p->plan.slot_bytes);
    log_op(p, RSTATE_OP_FORK, s, src, 0, NULL);
    return s;
}

int rstate_reset(rstate_pool *p, int slot) {
    if (!rstate_acquired(p, slot)) return RSTATE_ERR;
    ck_free_chain(p, slot);
    memset(slab_slot(p, slot), 0, p->plan.slot_bytes);
    log_op(p, RSTATE_OP_RESET, slot, 0, 0, NULL);
    return RSTATE_OK;
}

float *rstate_conv(rstate_pool *p, int slot, int layer) {
    assert(rstate_acquired(p, slot) && layer >= 0 && layer < p->cfg.n_layer);
    return slab_slot(p, slot) + (size_t)layer * p->layer_floats;
}

float *rstate_mat(rstate_pool *p, int slot, int layer) { return rstate_conv(p, slot, layer) + p->conv_pad; }

/* ---- checkpoints ----------------------------------------------------------- */

int rstate_ckpt_available(const rstate_pool *p) { return p->cfg.n_ckpt - (int)p->n_ckpt_used; }

/* Free slot's checkpoint chain (acquired slot), not logged: the callers
 * log what they do as one operation. */
static void ck_free_chain(rstate_pool *p, int slot) {
    for (int32_t e = p->ck_head[slot], next; e >= 0; e = next) {
        next = p->ck_next[e];
        p->ck_owner[e] = -1;
        p->ck_next[e] = p->ck_free;
        p->ck_free = e;
        p->n_ckpt_used--;
    }
    p->ck_head[slot] = -1;
    p->ck_n[slot] = 0;
}

void rstate_ckpt_release(rstate_pool *p, int slot) {
    if (!rstate_acquired(p, slot) || p->ck_head[slot] < 0) return;
    ck_free_chain(p, slot);
    log_op(p, RSTATE_OP_CK_RELEASE, slot, 0, 0, NULL);
}

int rstate_ckpt_reserve(rstate_pool *p, int slot, int pos0, int n, char *err, size_t errlen) {
    if (!rstate_acquired(p, slot))
        return lm_err(err, errlen, "cannot reserve checkpoints for recurrent state slot %d: not acquired", slot);
    if (n < 1 || pos0 < 0 || pos0 > INT32_MAX - n)
        return lm_err(err, errlen, "cannot reserve checkpoints for %d positions after %d", n, pos0);
    if (n > rstate_ckpt_available(p) + p->ck_n[slot]) {
        lm_err(err, errlen, "recurrent state checkpoints full: %d needed, %d of %d free", n,
               rstate_ckpt_available(p) + p->ck_n[slot], p->cfg.n_ckpt);
        return RSTATE_FULL;
    }
    ck_free_chain(p, slot);
    int32_t *link = &p->ck_head[slot];
    for (int i = 0; i < n; i++) {
        int32_t e = p->ck_free;
        p->ck_free = p->ck_next[e];
        p->ck_owner[e] = slot;
        p->ck_next[e] = -1;
        memset(p->ck_saved + (size_t)e * (size_t)p->cfg.n_layer, 0, (size_t)p->cfg.n_layer);
        *link = e;
        link = &p->ck_next[e];
    }
    p->n_ckpt_used += n;
    p->ck_pos0[slot] = pos0;
    p->ck_n[slot] = n;
    log_op(p, RSTATE_OP_CK_RESERVE, slot, pos0, n, NULL);
    return RSTATE_OK;
}

/* slot's checkpoint of position pos, or -1 when not reserved. */
static int32_t ckpt_find(const rstate_pool *p, int slot, int pos) {
    if (!rstate_acquired(p, slot)) return -1;
    int64_t i = (int64_t)pos - p->ck_pos0[slot] - 1;
    if (i < 0 || i >= p->ck_n[slot]) return -1;
    int32_t e = p->ck_head[slot];
    while (i-- > 0) e = p->ck_next[e];
    return e;
}

int rstate_ckpt_save_layer(rstate_pool *p, int slot, int layer, int pos) {
    int32_t e = ckpt_find(p, slot, pos);
    if (e < 0 || layer < 0 || layer >= p->cfg.n_layer) return RSTATE_ERR;
    size_t off = (size_t)layer * p->layer_floats;
    memcpy(ckpt_slot(p, e) + off, slab_slot(p, slot) + off, p->plan.layer_bytes);
    p->ck_saved[(size_t)e * (size_t)p->cfg.n_layer + (size_t)layer] = 1;
    return RSTATE_OK;
}

bool rstate_ckpt_reserved(const rstate_pool *p, int slot, int pos) { return ckpt_find(p, slot, pos) >= 0; }

int rstate_ckpt_layer(rstate_pool *p, int slot, int layer, int pos, float **conv, float **mat) {
    int32_t e = ckpt_find(p, slot, pos);
    if (e < 0 || layer < 0 || layer >= p->cfg.n_layer) return RSTATE_ERR;
    float *l = ckpt_slot(p, e) + (size_t)layer * p->layer_floats;
    *conv = l;
    *mat = l + p->conv_pad;
    p->ck_saved[(size_t)e * (size_t)p->cfg.n_layer + (size_t)layer] = 1;
    return RSTATE_OK;
}

int rstate_ckpt_save(rstate_pool *p, int slot, int pos) {
    if (ckpt_find(p, slot, pos) < 0) return RSTATE_ERR;
    for (int l = 0; l < p->cfg.n_layer; l++) rstate_ckpt_save_layer(p, slot, l, pos);
    return RSTATE_OK;
}

int rstate_ckpt_restore(rstate_pool *p, int slot, int pos, char *err, size_t errlen) {
    int32_t e = ckpt_find(p, slot, pos);
    if (e < 0) return lm_err(err, errlen, "recurrent state slot %d has no checkpoint of position %d", slot, pos);
    for (int l = 0; l < p->cfg.n_layer; l++)
        if (!p->ck_saved[(size_t)e * (size_t)p->cfg.n_layer + (size_t)l])
            return lm_err(err, errlen, "recurrent state slot %d: layer %d was not saved at position %d", slot, l, pos);
    memcpy(slab_slot(p, slot), ckpt_slot(p, e), p->plan.slot_bytes);
    log_op(p, RSTATE_OP_CK_RESTORE, slot, pos, 0, NULL);
    return RSTATE_OK;
}

/* ---- snapshots ------------------------------------------------------------- */

static uint64_t key_bucket(const rstate_pool *p, const uint8_t *key) {
    uint64_t h;
    memcpy(&h, key, sizeof h);
    return h & p->bucket_mask;
}

static int32_t snap_find(const rstate_pool *p, const uint8_t *key) {
    if (!p->cfg.n_snap) return -1;
    for (int32_t s = p->bucket[key_bucket(p, key)]; s >= 0; s = p->snap[s].hnext)
        if (!memcmp(p->snap[s].key, key, KV_KEY_LEN)) return s;
    return -1;
}

static void lru_unlink(rstate_pool *p, int32_t s) {
    rs_snap *x = &p->snap[s];
    if (x->prev >= 0) p->snap[x->prev].next = x->next;
    else p->lru_head = x->next;
    if (x->next >= 0) p->snap[x->next].prev = x->prev;
    else p->lru_tail = x->prev;
    x->prev = x->next = -1;
}

static void lru_push_tail(rstate_pool *p, int32_t s) {
    rs_snap *x = &p->snap[s];
    x->next = -1;
    x->prev = p->lru_tail;
    if (p->lru_tail >= 0) p->snap[p->lru_tail].next = s;
    else p->lru_head = s;
    p->lru_tail = s;
}

/* Take used snapshot s out of the LRU list and the hash table, onto the
 * free stack. */
static void snap_remove(rstate_pool *p, int32_t s) {
    rs_snap *x = &p->snap[s];
    lru_unlink(p, s);
    int32_t *link = &p->bucket[key_bucket(p, x->key)];
    while (*link != s) link = &p->snap[*link].hnext;
    *link = x->hnext;
    x->hnext = -1;
    x->used = 0;
    x->next = p->snap_free;
    p->snap_free = s;
    p->n_snap_used--;
}

int rstate_snap_save(rstate_pool *p, int slot, const uint8_t key[KV_KEY_LEN], char *err, size_t errlen) {
    if (!rstate_acquired(p, slot))
        return lm_err(err, errlen, "cannot snapshot recurrent state slot %d: not acquired", slot);
    if (!p->cfg.n_snap) {
        lm_err(err, errlen, "recurrent state has no snapshot slots");
        return RSTATE_FULL;
    }
    int32_t s = snap_find(p, key);
    log_op(p, RSTATE_OP_SNAP_SAVE, slot, 0, 0, key);
    if (s >= 0) { /* the same prefix's state: only used again */
        lru_unlink(p, s);
        lru_push_tail(p, s);
        return RSTATE_OK;
    }
    if (p->snap_free < 0) {
        snap_remove(p, p->lru_head);
        p->snap_evicted++;
    }
    s = p->snap_free;
    rs_snap *x = &p->snap[s];
    p->snap_free = x->next;
    memcpy(x->key, key, KV_KEY_LEN);
    x->used = 1;
    uint64_t h = key_bucket(p, key);
    x->hnext = p->bucket[h];
    p->bucket[h] = s;
    lru_push_tail(p, s);
    p->n_snap_used++;
    p->snap_saved++;
    memcpy(snap_slot(p, s), slab_slot(p, slot), p->plan.slot_bytes);
    return RSTATE_OK;
}

bool rstate_snap_has(const rstate_pool *p, const uint8_t key[KV_KEY_LEN]) { return snap_find(p, key) >= 0; }

int rstate_snap_match(const rstate_pool *p, const kv_seq *s, uint8_t key[KV_KEY_LEN]) {
    if (!p->n_snap_used) return 0;
    int k = 0;
    while (kv_seq_key(s, k)) k++;
    for (; k > 0; k--) {
        const uint8_t *kk = kv_seq_key(s, k - 1);
        if (snap_find(p, kk) >= 0) {
            memcpy(key, kk, KV_KEY_LEN);
            return k;
        }
    }
    return 0;
}

int rstate_snap_restore(rstate_pool *p, const uint8_t key[KV_KEY_LEN], int slot, char *err, size_t errlen) {
    if (!rstate_acquired(p, slot))
        return lm_err(err, errlen, "cannot restore into recurrent state slot %d: not acquired", slot);
    int32_t s = snap_find(p, key);
    if (s < 0) return lm_err(err, errlen, "no recurrent state snapshot under that prefix key");
    ck_free_chain(p, slot);
    memcpy(slab_slot(p, slot), snap_slot(p, s), p->plan.slot_bytes);
    log_op(p, RSTATE_OP_SNAP_RESTORE, slot, 0, 0, key);
    lru_unlink(p, s);
    lru_push_tail(p, s);
    p->snap_restored++;
    return RSTATE_OK;
}

void rstate_snap_evict(void *pool, const uint8_t key[KV_KEY_LEN]) {
    rstate_pool *p = pool;
    int32_t s = snap_find(p, key);
    if (s < 0) return;
    snap_remove(p, s);
    p->snap_dropped++;
    log_op(p, RSTATE_OP_SNAP_EVICT, 0, 0, 0, key);
}

int rstate_replay(rstate_pool *p, const rstate_op *o, char *err, size_t errlen) {
    int rc;
    switch (o->op) {
        case RSTATE_OP_ACQUIRE:
            rc = rstate_acquire(p, err, errlen);
            if (rc >= 0 && rc != o->a) return lm_err(err, errlen, "replayed acquire gave slot %d, not %d", rc, o->a);
            return rc < 0 ? RSTATE_ERR : RSTATE_OK;
        case RSTATE_OP_FORK:
            rc = rstate_fork(p, o->b, err, errlen);
            if (rc >= 0 && rc != o->a) return lm_err(err, errlen, "replayed fork gave slot %d, not %d", rc, o->a);
            return rc < 0 ? RSTATE_ERR : RSTATE_OK;
        case RSTATE_OP_RELEASE:
            return rstate_release(p, o->a) ? lm_err(err, errlen, "replayed release of slot %d not acquired", o->a) : 0;
        case RSTATE_OP_RESET:
            return rstate_reset(p, o->a) ? lm_err(err, errlen, "replayed reset of slot %d not acquired", o->a) : 0;
        case RSTATE_OP_CK_RESERVE:
            return rstate_ckpt_reserve(p, o->a, o->b, o->c, err, errlen) ? RSTATE_ERR : RSTATE_OK;
        case RSTATE_OP_CK_RESTORE: return rstate_ckpt_restore(p, o->a, o->b, err, errlen);
        case RSTATE_OP_CK_RELEASE:
            if (!rstate_acquired(p, o->a)) return lm_err(err, errlen, "replayed checkpoint release of slot %d", o->a);
            rstate_ckpt_release(p, o->a);
            return RSTATE_OK;
        case RSTATE_OP_SNAP_SAVE: return rstate_snap_save(p, o->a, o->key, err, errlen) ? RSTATE_ERR : RSTATE_OK;
        case RSTATE_OP_SNAP_RESTORE: return rstate_snap_restore(p, o->key, o->a, err, errlen);
        case RSTATE_OP_SNAP_EVICT: rstate_snap_evict(p, o->key); return RSTATE_OK;
        default: return lm_err(err, errlen, "an unknown recurrent state operation %d", o->op);
    }
}

/* ---- accounting ------------------------------------------------------------ */

void rstate_stats_get(const rstate_pool *p, rstate_stats *st) {
    memset(st, 0, sizeof *st);
    uint64_t b = p->plan.slot_bytes;
    st->n_live = p->cfg.n_seqs;
    st->n_live_used = p->n_live_used;
    st->n_ckpt = p->cfg.n_ckpt;
    st->n_ckpt_used = p->n_ckpt_used;
    st->n_snap = p->cfg.n_snap;
    st->n_snap_used = p->n_snap_used;
    st->slot_bytes = b;
    st->bytes_total = p->plan.data_bytes;
    st->live_bytes_used = (uint64_t)p->n_live_used * b;
    st->ckpt_bytes_used = (uint64_t)p->n_ckpt_used * b;
    st->snap_bytes_used = (uint64_t)p->n_snap_used * b;
    st->snap_saved = p->snap_saved;
    st->snap_restored = p->snap_restored;
    st->snap_evicted = p->snap_evicted;
    st->snap_dropped = p->snap_dropped;
}

int rstate_pool_check(const rstate_pool *p, char *err, size_t errlen) {
    int ns = p->cfg.n_seqs, nc = p->cfg.n_ckpt, nn = p->cfg.n_snap;
    /* live: the free stack and the used flags partition the slots */
    int64_t n_free = 0, n_used = 0;
    for (int32_t s = p->live_free; s >= 0 && n_free <= ns; s = p->live_next[s], n_free++)
        if (p->live_used[s]) return lm_err(err, errlen, "free live slot %d is marked used", s);
    for (int s = 0; s < ns; s++) n_used += p->live_used[s] != 0;
    if (n_used != p->n_live_used || n_used + n_free != ns)
        return lm_err(err, errlen, "live slots: %lld used (counted %lld), %lld free, of %d", (long long)n_used,
                      (long long)p->n_live_used, (long long)n_free, ns);
    /* checkpoints: each used slot's chain, then the free stack */
    int64_t n_owned = 0, n_ck_free = 0;
    for (int s = 0; s < ns; s++) {
        int len = 0;
        if (!p->live_used[s] && p->ck_head[s] >= 0) return lm_err(err, errlen, "free live slot %d has checkpoints", s);
        for (int32_t e = p->ck_head[s]; e >= 0 && len <= nc; e = p->ck_next[e], len++)
            if (p->ck_owner[e] != s)
                return lm_err(err, errlen, "checkpoint %d in slot %d's chain is owned by %d", e, s, p->ck_owner[e]);
        if (p->live_used[s] && len != p->ck_n[s])
            return lm_err(err, errlen, "slot %d reserved %d checkpoints, its chain has %d", s, p->ck_n[s], len);
        n_owned += len;
    }
    for (int32_t e = p->ck_free; e >= 0 && n_ck_free <= nc; e = p->ck_next[e], n_ck_free++)
        if (p->ck_owner[e] != -1) return lm_err(err, errlen, "free checkpoint %d is owned by %d", e, p->ck_owner[e]);
    if (n_owned != p->n_ckpt_used || n_owned + n_ck_free != nc)
        return lm_err(err, errlen, "checkpoints: %lld reserved (counted %lld), %lld free, of %d", (long long)n_owned,
                      (long long)p->n_ckpt_used, (long long)n_ck_free, nc);
    /* snapshots: the LRU list, the free stack, the hash table */
    int64_t n_lru = 0, n_sn_free = 0, n_hashed = 0;
    int32_t prev = -1;
    for (int32_t s = p->lru_head; s >= 0 && n_lru <= nn; prev = s, s = p->snap[s].next, n_lru++) {
        if (!p->snap[s].used || p->snap[s].prev != prev)
            return lm_err(err, errlen, "LRU snapshot %d is inconsistent", s);
        if (snap_find(p, p->snap[s].key) != s)
            return lm_err(err, errlen, "snapshot %d is not found under its key (or its key is stored twice)", s);
    }
    if (prev != p->lru_tail) return lm_err(err, errlen, "snapshot LRU tail is %d, list ends at %d", p->lru_tail, prev);
    for (int32_t s = p->snap_free; s >= 0 && n_sn_free <= nn; s = p->snap[s].next, n_sn_free++)
        if (p->snap[s].used) return lm_err(err, errlen, "free snapshot %d is marked used", s);
    for (uint64_t h = 0; nn && h <= p->bucket_mask; h++)
        for (int32_t s = p->bucket[h]; s >= 0 && n_hashed <= nn; s = p->snap[s].hnext, n_hashed++)
            if (!p->snap[s].used || key_bucket(p, p->snap[s].key) != h)
                return lm_err(err, errlen, "snapshot %d is in the wrong hash bucket", s);
    if (n_lru != p->n_snap_used || n_hashed != n_lru || n_lru + n_sn_free != nn)
        return lm_err(err, errlen, "snapshots: %lld in LRU (counted %lld), %lld hashed, %lld free, of %d",
                      (long long)n_lru, (long long)p->n_snap_used, (long long)n_hashed, (long long)n_sn_free, nn);
    return RSTATE_OK;
}
