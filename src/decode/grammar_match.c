/*
 * grammar_match.c - the byte-level matcher of grammar.h: parse states as
 * sets of hash-consed stacks, a lazily built transition table over them,
 * and token masks by one preorder pass over the vocabulary's byte trie.
 *
 * Frames. A frame is (pos, parent): pos an element index, parent the frame
 * below (0: none). Frame 0 is the empty stack (nothing left to match: the
 * grammar may end). Frames are interned, so a stack is one frame id and two
 * equal stacks are the same id.
 *
 * States. A state is a sorted set of frame ids whose top element is a
 * class (or frame 0), plus a pending partial UTF-8 character `part`
 * (0: none; else need | len << 2 | acc << 5: need continuation bytes still
 * to come, len the character's length, acc the bits so far). A state with a
 * partial character keeps only the stacks whose class meets the range of
 * code points the character can still become. States are interned; state
 * ids never change. trans[s][b] caches the state after byte b (-2 not yet
 * known, -1 no such state: b cannot follow).
 *
 * Expansion (closure) of a frame whose top is a reference or the end of an
 * alternative runs on an explicit work list, each frame visited once per
 * step (a stamp per frame), so shared sub-stacks are not expanded twice and
 * deep grammars cannot overflow the C stack. It terminates because the
 * compiler refused left recursion.
 *
 * Masks. A state's mask is cached with its allowed count; when it allows
 * at most an eighth of the vocabulary its ids are kept too (ascending), for
 * samplers that visit only those. All cached masks are dropped together
 * past GM_MASK_BYTES.
 *
 * Bounds. Each public call starts a budget of GM_WORK operations (a frame
 * expanded, a stack stepped or interned, a new row's pass over its stacks);
 * a state may hold GM_MAX_STACKS stacks and the cache GM_CACHE_BYTES. A
 * call past one fails (T_BOUND inside, -1 or false outside) with the reason
 * in `why`; failed steps are not cached, and the cache is marked spoiled
 * (atomically: submitters read it to refuse the grammar). gmatch_probe
 * explores the first states, most stacks first, to find such grammars
 * before a request uses them.
 */
#include <assert.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "decode/grammar.h"
#include "decode/grammar_int.h"

enum { T_UNKNOWN = -2, T_DEAD = -1, T_NOMEM = -3, T_BOUND = -4 };
#define GM_MASK_BYTES ((size_t)64 << 20)   /* cached masks above this are dropped */
#define GM_MAX_STACKS (1 << 16)            /* stacks in one state: beyond, the grammar is refused as too ambiguous */
#define GM_WORK ((int64_t)1 << 24)         /* operations of one call (frames expanded, stacks stepped) */
#define GM_CACHE_BYTES ((size_t)256 << 20) /* frames, states and transitions of one grammar's cache */
#define GM_PROBE_STATES 96                 /* states gmatch_probe explores */
#define GM_SPARSE_DIV 8                    /* masks allowing at most n_vocab / 8 tokens also keep a list of ids */

typedef struct {
    int32_t pos, parent;
} gframe;

typedef struct {
    atomic_int refs; /* matchers sharing it (copies may be made and freed on any thread) */
    const lm_grammar *g;
    lm_grammar *own_g; /* g, when the cache frees it (gmatch_own_grammar), else NULL */
    const lm_gvocab *v;
    gframe *fr;      /* (n_fr) interned frames; fr[0] is the empty stack */
    uint32_t *stamp; /* (n_fr) last expansion step that visited the frame */
    int32_t n_fr, cap_fr;
    int32_t *fr_ht; /* (fr_htcap) open addressing, frame id + 1, 0 empty */
    uint32_t fr_htcap;
    uint32_t cur_stamp;
    int32_t *items; /* (n_items) every state's frame ids, concatenated */
    int64_t n_items, cap_items;
    int64_t *st_off;   /* (n_st) state s's items are items[st_off[s] .. + st_len[s]) */
    int32_t *st_len;   /* (n_st) */
    uint32_t *st_part; /* (n_st) pending partial character */
    uint64_t *st_hash; /* (n_st) */
    int32_t **trans;   /* (n_st) NULL or (256) next state per byte */
    uint32_t **mask;   /* (n_st) NULL or the cached mask ((n_vocab + 31) / 32 words) */
    int32_t *mask_n;   /* (n_st) allowed count of the cached mask */
    int32_t **ids;     /* (n_st) NULL or the cached mask's allowed ids, ascending (mask_n[s]), when
                            at most GM_SPARSE_DIV-th of the vocabulary */
    int32_t n_st, cap_st;
    int32_t *st_ht; /* (st_htcap) state id + 1, 0 empty */
    uint32_t st_htcap;
    size_t mask_bytes;   /* bytes of masks cached now */
    int32_t *work, *out; /* (cap_work), (cap_out) expansion scratch */
    int32_t cap_work, cap_out, n_work, n_out;
    int32_t *walk; /* (max_depth + 1) state per trie depth during a mask */
    int32_t *eog;  /* (n_eog) the vocabulary's EOG tokens */
    int32_t n_eog;
    int32_t n_rows;      /* transition rows allocated */
    int64_t ops;         /* operations in the current call, against GM_WORK */
    int fail;            /* why the last call failed: 0, T_NOMEM or T_BOUND */
    char why[160];       /* what bound it passed (fail == T_BOUND) */
    atomic_bool spoiled; /* some call passed a bound: the grammar is refused from then on */
} gcache;

struct lm_gmatch {
    gcache *c; /* shared by copies */
    int32_t start, cur;
};

static uint64_t mix(uint64_t h, uint64_t x) {
    h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return h * 0xFF51AFD7ED558CCDull;
}

/* ---- bounds -------------------------------------------------------------- */

/* Memory the cache holds now (its arrays at capacity, the transition rows). */
static size_t cache_bytes(const gcache *c) {
    return (size_t)c->cap_fr * (sizeof *c->fr + sizeof *c->stamp) + (size_t)c->fr_htcap * sizeof *c->fr_ht +
        (size_t)c->cap_items * sizeof *c->items + (size_t)c->st_htcap * sizeof *c->st_ht +
        (size_t)c->cap_st *
        (sizeof *c->st_off + sizeof *c->st_len + sizeof *c->st_part + sizeof *c->st_hash + sizeof *c->trans +
         sizeof *c->mask + sizeof *c->mask_n + sizeof *c->ids) +
        (size_t)c->n_rows * 256 * sizeof(int32_t) + (size_t)(c->cap_work + c->cap_out) * sizeof(int32_t);
}

/* Record that a bound was passed: T_BOUND. */
static int32_t bound(gcache *c, const char *what) {
    /* the first reason stays once the grammar is spoiled: other threads may read it then */
    if (c->fail != T_BOUND && !atomic_load(&c->spoiled)) lm_err(c->why, sizeof c->why, "%s", what);
    c->fail = T_BOUND;
    return T_BOUND;
}

/* Count n operations of the current call: 0, or T_BOUND past the budget. */
static inline int32_t spend(gcache *c, int64_t n) {
    c->ops += n;
    if (c->ops <= GM_WORK) return 0;
    return bound(c, "one step of the grammar took more than 16,777,216 operations (a grammar too ambiguous)");
}

/* ---- frames -------------------------------------------------------------- */

static int fr_rehash(gcache *c, uint32_t cap) {
    int32_t *ht = lm_calloc(cap, sizeof *ht);
    if (!ht) return -1;
    for (int32_t id = 0; id < c->n_fr; id++) {
        uint32_t h = (uint32_t)mix((uint64_t)c->fr[id].pos, (uint64_t)c->fr[id].parent) & (cap - 1);
        while (ht[h]) h = (h + 1) & (cap - 1);
        ht[h] = id + 1;
    }
    lm_free(c->fr_ht);
    c->fr_ht = ht;
    c->fr_htcap = cap;
    return 0;
}

/* The frame (pos, parent), created if new; -1 when memory runs out. */
static int32_t fr_intern(gcache *c, int32_t pos, int32_t parent) {
    uint32_t h = (uint32_t)mix((uint64_t)pos, (uint64_t)parent) & (c->fr_htcap - 1);
    for (;;) {
        int32_t id = c->fr_ht[h] - 1;
        if (id < 0) break;
        if (c->fr[id].pos == pos && c->fr[id].parent == parent) return id;
        h = (h + 1) & (c->fr_htcap - 1);
    }
    if (c->n_fr == c->cap_fr) {
        int32_t nc = c->cap_fr * 2;
        gframe *f = lm_realloc(c->fr, (size_t)nc * sizeof *f);
        if (!f) return -1;
        c->fr = f;
        uint32_t *s = lm_realloc(c->stamp, (size_t)nc * sizeof *s);
        if (!s) return -1;
        c->stamp = s;
        c->cap_fr = nc;
    }
    int32_t id = c->n_fr++;
    c->fr[id] = (gframe){pos, parent};
    c->stamp[id] = 0;
    c->fr_ht[h] = id + 1;
    if ((uint32_t)c->n_fr * 2 > c->fr_htcap && fr_rehash(c, c->fr_htcap * 2) < 0) return -1;
    return id;
}

/* ---- states -------------------------------------------------------------- */

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t st_hash_of(const int32_t *it, int32_t n, uint32_t part) {
    uint64_t h = mix(0x1234567ull, part);
    for (int32_t i = 0; i < n; i++) h = mix(h, (uint64_t)it[i]);
    return h;
}

static int st_rehash(gcache *c, uint32_t cap) {
    int32_t *ht = lm_calloc(cap, sizeof *ht);
    if (!ht) return -1;
    for (int32_t s = 0; s < c->n_st; s++) {
        uint32_t h = (uint32_t)c->st_hash[s] & (cap - 1);
        while (ht[h]) h = (h + 1) & (cap - 1);
        ht[h] = s + 1;
    }
    lm_free(c->st_ht);
    c->st_ht = ht;
    c->st_htcap = cap;
    return 0;
}

#define REGROW(arr, cap)                                                                                               \
    do {                                                                                                               \
        void *p_ = lm_realloc((arr), (size_t)(cap) * sizeof *(arr));                                                   \
        if (!p_) return T_NOMEM;                                                                                       \
        (arr) = p_;                                                                                                    \
    } while (0)

/* The state of the frames in c->out (sorted and deduplicated here) with
 * partial character part: its id, T_DEAD when there are no frames. */
static int32_t st_intern(gcache *c, uint32_t part) {
    int32_t n = c->n_out;
    if (n == 0) return T_DEAD;
    if (n > GM_MAX_STACKS) return bound(c, "a parse state held more than 65,536 stacks (a grammar too ambiguous)");
    if (spend(c, n) < 0) return T_BOUND;
    qsort(c->out, (size_t)n, sizeof *c->out, cmp_i32);
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++)
        if (!m || c->out[m - 1] != c->out[i]) c->out[m++] = c->out[i];
    uint64_t hash = st_hash_of(c->out, m, part);
    uint32_t h = (uint32_t)hash & (c->st_htcap - 1);
    for (;;) {
        int32_t s = c->st_ht[h] - 1;
        if (s < 0) break;
        if (c->st_hash[s] == hash && c->st_len[s] == m && c->st_part[s] == part &&
            memcmp(c->items + c->st_off[s], c->out, (size_t)m * sizeof *c->out) == 0)
            return s;
        h = (h + 1) & (c->st_htcap - 1);
    }
    if (c->n_items + m > c->cap_items) {
        int64_t nc = c->cap_items;
        while (nc < c->n_items + m) nc *= 2;
        REGROW(c->items, nc);
        c->cap_items = nc;
    }
    if (c->n_st == c->cap_st) {
        int32_t nc = c->cap_st * 2;
        REGROW(c->st_off, nc);
        REGROW(c->st_len, nc);
        REGROW(c->st_part, nc);
        REGROW(c->st_hash, nc);
        REGROW(c->trans, nc);
        REGROW(c->mask, nc);
        REGROW(c->mask_n, nc);
        REGROW(c->ids, nc);
        c->cap_st = nc;
    }
    if (cache_bytes(c) > GM_CACHE_BYTES) return bound(c, "the grammar's parse states outgrew 256 MiB");
    int32_t s = c->n_st++;
    memcpy(c->items + c->n_items, c->out, (size_t)m * sizeof *c->out);
    c->st_off[s] = c->n_items;
    c->n_items += m;
    c->st_len[s] = m;
    c->st_part[s] = part;
    c->st_hash[s] = hash;
    c->trans[s] = NULL;
    c->mask[s] = NULL;
    c->mask_n[s] = 0;
    c->ids[s] = NULL;
    c->st_ht[h] = s + 1;
    if ((uint32_t)c->n_st * 2 > c->st_htcap && st_rehash(c, c->st_htcap * 2) < 0) return T_NOMEM;
    return s;
}

/* ---- expansion ----------------------------------------------------------- */

static int push_work(gcache *c, int32_t id) {
    if (id < 0) return -1;
    if (c->n_work == c->cap_work) {
        int32_t nc = c->cap_work * 2;
        int32_t *w = lm_realloc(c->work, (size_t)nc * sizeof *w);
        if (!w) return -1;
        c->work = w;
        c->cap_work = nc;
    }
    c->work[c->n_work++] = id;
    return 0;
}

static int push_out(gcache *c, int32_t id) {
    if (c->n_out == c->cap_out) {
        int32_t nc = c->cap_out * 2;
        int32_t *w = lm_realloc(c->out, (size_t)nc * sizeof *w);
        if (!w) return -1;
        c->out = w;
        c->cap_out = nc;
    }
    c->out[c->n_out++] = id;
    return 0;
}

/* Expand the work list into c->out: frames whose top is a class, and frame
 * 0 when a stack can end. Frames already visited in this step are skipped.
 * 0, T_NOMEM, or T_BOUND past the work budget. */
static int expand(gcache *c) {
    const lm_grammar *g = c->g;
    while (c->n_work) {
        int32_t id = c->work[--c->n_work];
        if (c->stamp[id] == c->cur_stamp) continue;
        c->stamp[id] = c->cur_stamp;
        if (spend(c, 1) < 0) return T_BOUND;
        if (id == 0) {
            if (push_out(c, 0) < 0) return T_NOMEM;
            continue;
        }
        gframe f = c->fr[id];
        gelem e = g->el[f.pos];
        if (e.type == E_CLASS) {
            if (push_out(c, id) < 0) return T_NOMEM;
        } else if (e.type == E_REF) {
            uint8_t nt = g->el[f.pos + 1].type;
            int32_t cont = (nt == E_ALT || nt == E_END) ? f.parent : fr_intern(c, f.pos + 1, f.parent);
            if (cont < 0) return T_NOMEM;
            for (int32_t a = g->alt_off[e.val]; a < g->alt_off[e.val + 1]; a++)
                if (push_work(c, fr_intern(c, g->alt_pos[a], cont)) < 0) return T_NOMEM;
        } else if (push_work(c, f.parent) < 0) /* end of an alternative: return to the parent */
            return T_NOMEM;
    }
    if (cache_bytes(c) > GM_CACHE_BYTES) return bound(c, "the grammar's parse states outgrew 256 MiB");
    return 0;
}

static void new_step(gcache *c) {
    c->n_work = c->n_out = 0;
    if (++c->cur_stamp == 0) { /* wrapped: clear every stamp */
        memset(c->stamp, 0, (size_t)c->n_fr * sizeof *c->stamp);
        c->cur_stamp = 1;
    }
}

/* ---- steps --------------------------------------------------------------- */

/* The code points a partial character can still become: [*lo, *hi], false
 * when none (overlong, surrogate or above U+10FFFF). */
static bool part_range(uint32_t part, uint32_t *lo, uint32_t *hi) {
    uint32_t need = part & 3, len = (part >> 2) & 7, acc = part >> 5;
    uint32_t l = acc << (6 * need), h = l | ((1u << (6 * need)) - 1);
    static const uint32_t mn[5] = {0, 0, 0x80, 0x800, 0x10000}, mx[5] = {0, 0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    if (l < mn[len]) l = mn[len];
    if (h > mx[len]) h = mx[len];
    if (l >= 0xD800 && h <= 0xDFFF) return false;
    if (l < 0xD800 && h >= 0xD800) h = 0xD7FF;
    if (l <= 0xDFFF && h > 0xDFFF && l >= 0xD800) l = 0xE000;
    *lo = l, *hi = h;
    return l <= h;
}

/* The state after a whole code point cp from state s. */
static int32_t step_cp(gcache *c, int32_t s, uint32_t cp) {
    const lm_grammar *g = c->g;
    new_step(c);
    if (spend(c, c->st_len[s]) < 0) return T_BOUND;
    for (int32_t i = 0; i < c->st_len[s]; i++) {
        int32_t id = c->items[c->st_off[s] + i];
        if (id == 0) continue;
        gframe f = c->fr[id];
        if (!class_has(g, &g->cls[g->el[f.pos].val], cp)) continue;
        if (push_work(c, fr_intern(c, f.pos + 1, f.parent)) < 0) return T_NOMEM;
    }
    int rc = expand(c);
    if (rc < 0) return rc;
    return st_intern(c, 0);
}

/* The state s narrowed to the stacks whose class can still hold the
 * partial character part. */
static int32_t step_part(gcache *c, int32_t s, uint32_t part) {
    const lm_grammar *g = c->g;
    uint32_t lo, hi;
    if (!part_range(part, &lo, &hi)) return T_DEAD;
    new_step(c);
    if (spend(c, c->st_len[s]) < 0) return T_BOUND;
    for (int32_t i = 0; i < c->st_len[s]; i++) {
        int32_t id = c->items[c->st_off[s] + i];
        if (id == 0 || !class_meets(g, &g->cls[g->el[c->fr[id].pos].val], lo, hi)) continue;
        if (push_out(c, id) < 0) return T_NOMEM;
    }
    return st_intern(c, part);
}

static int32_t step_byte(gcache *c, int32_t s, uint8_t b) {
    uint32_t part = c->st_part[s];
    if (part == 0) {
        if (b < 0x80) return step_cp(c, s, b);
        uint32_t len = b >= 0xF8 ? 0 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 0;
        if (!len) return T_DEAD;
        uint32_t acc = b & (0x7Fu >> len);
        return step_part(c, s, (len - 1) | len << 2 | acc << 5);
    }
    if ((b & 0xC0) != 0x80) return T_DEAD;
    uint32_t need = (part & 3) - 1, len = (part >> 2) & 7, acc = (part >> 5) << 6 | (b & 0x3F);
    if (need == 0) {
        uint32_t lo, hi;
        if (!part_range(len << 2 | acc << 5, &lo, &hi) || acc < lo || acc > hi) return T_DEAD;
        return step_cp(c, s, acc);
    }
    return step_part(c, s, need | len << 2 | acc << 5);
}

/* The bytes that may follow state s (a superset): bit b of live[b >> 6]. */
static void live_bytes(const gcache *c, int32_t s, uint64_t live[4]) {
    const lm_grammar *g = c->g;
    live[0] = live[1] = live[2] = live[3] = 0;
    if (c->st_part[s]) { /* inside a character: its continuation bytes */
        live[2] = ~0ull;
        return;
    }
    for (int32_t i = 0; i < c->st_len[s]; i++) {
        int32_t id = c->items[c->st_off[s] + i];
        if (id == 0) continue;
        const gclass *k = &g->cls[g->el[c->fr[id].pos].val];
        live[0] |= k->ascii[0], live[1] |= k->ascii[1];
        if (k->n > 0 && g->ranges[k->off + k->n - 1].hi >= 0x80) live[3] |= ~0ull; /* lead bytes 0xC0-0xFF */
    }
}

/* trans[s][b], computed on first use. A new row starts with the bytes no
 * stack can take marked dead (one pass over the stacks), so a state with
 * many stacks costs its stacks once per byte that may follow, not per byte. */
static inline int32_t step(gcache *c, int32_t s, uint8_t b) {
    int32_t *row = c->trans[s];
    if (row && row[b] != T_UNKNOWN) return row[b];
    if (!row) {
        if (spend(c, c->st_len[s]) < 0) return T_BOUND;
        if (!(row = lm_malloc(256 * sizeof *row))) return c->fail = T_NOMEM;
        uint64_t live[4];
        live_bytes(c, s, live);
        for (int i = 0; i < 256; i++) row[i] = (live[i >> 6] >> (i & 63)) & 1 ? T_UNKNOWN : T_DEAD;
        c->trans[s] = row;
        c->n_rows++;
        if (row[b] != T_UNKNOWN) return row[b];
    }
    int32_t t = step_byte(c, s, b);
    if (t == T_NOMEM || t == T_BOUND) { /* not cached: a later call fails the same way or succeeds */
        if (t == T_NOMEM && !c->fail) c->fail = T_NOMEM;
        return t;
    }
    row[b] = t;
    return t;
}

/* ---- the cache ----------------------------------------------------------- */

static void cache_free(gcache *c) {
    if (!c) return;
    for (int32_t s = 0; s < c->n_st; s++) {
        lm_free(c->trans[s]);
        lm_free(c->mask[s]);
        lm_free(c->ids[s]);
    }
    lm_free(c->fr);
    lm_free(c->stamp);
    lm_free(c->fr_ht);
    lm_free(c->items);
    lm_free(c->st_off);
    lm_free(c->st_len);
    lm_free(c->st_part);
    lm_free(c->st_hash);
    lm_free(c->trans);
    lm_free(c->mask);
    lm_free(c->mask_n);
    lm_free(c->ids);
    lm_free(c->st_ht);
    lm_free(c->work);
    lm_free(c->out);
    lm_free(c->walk);
    lm_free(c->eog);
    grammar_free(c->own_g);
    lm_free(c);
}

static gcache *cache_new(const lm_grammar *g, const lm_gvocab *v) {
    gcache *c = lm_calloc(1, sizeof *c);
    if (!c) return NULL;
    atomic_init(&c->refs, 1);
    c->g = g;
    c->v = v;
    c->cap_fr = 256, c->fr_htcap = 1024, c->cap_items = 1024, c->cap_st = 64, c->st_htcap = 256;
    c->cap_work = c->cap_out = 256;
    c->fr = lm_malloc((size_t)c->cap_fr * sizeof *c->fr);
    c->stamp = lm_malloc((size_t)c->cap_fr * sizeof *c->stamp);
    c->fr_ht = lm_calloc(c->fr_htcap, sizeof *c->fr_ht);
    c->items = lm_malloc((size_t)c->cap_items * sizeof *c->items);
    c->st_off = lm_malloc((size_t)c->cap_st * sizeof *c->st_off);
    c->st_len = lm_malloc((size_t)c->cap_st * sizeof *c->st_len);
    c->st_part = lm_malloc((size_t)c->cap_st * sizeof *c->st_part);
    c->st_hash = lm_malloc((size_t)c->cap_st * sizeof *c->st_hash);
    c->trans = lm_malloc((size_t)c->cap_st * sizeof *c->trans);
    c->mask = lm_malloc((size_t)c->cap_st * sizeof *c->mask);
    c->mask_n = lm_malloc((size_t)c->cap_st * sizeof *c->mask_n);
    c->ids = lm_malloc((size_t)c->cap_st * sizeof *c->ids);
    c->st_ht = lm_calloc(c->st_htcap, sizeof *c->st_ht);
    c->work = lm_malloc((size_t)c->cap_work * sizeof *c->work);
    c->out = lm_malloc((size_t)c->cap_out * sizeof *c->out);
    c->walk = lm_malloc((size_t)(v->max_depth + 1) * sizeof *c->walk);
    int32_t n_eog = 0;
    for (int32_t t = 0; t < v->n_vocab; t++) n_eog += v->eog[t];
    c->eog = lm_malloc((size_t)(n_eog ? n_eog : 1) * sizeof *c->eog);
    if (!c->fr || !c->stamp || !c->fr_ht || !c->items || !c->st_off || !c->st_len || !c->st_part || !c->st_hash ||
        !c->trans || !c->mask || !c->mask_n || !c->ids || !c->st_ht || !c->work || !c->out || !c->walk || !c->eog) {
        cache_free(c);
        return NULL;
    }
    for (int32_t t = 0; t < v->n_vocab; t++)
        if (v->eog[t]) c->eog[c->n_eog++] = t;
    c->fr[0] = (gframe){-1, 0};
    c->stamp[0] = 0;
    c->n_fr = 1; /* frame 0 is not in the hash table: it is never interned */
    return c;
}

/* ---- the interface ------------------------------------------------------- */

lm_gmatch *gmatch_new(const lm_grammar *g, const lm_gvocab *v, char *err, size_t errlen) {
    lm_gmatch *m = lm_calloc(1, sizeof *m);
    gcache *c = m ? cache_new(g, v) : NULL;
    if (!c) {
        lm_free(m);
        lm_err(err, errlen, "out of memory starting a grammar");
        return NULL;
    }
    m->c = c;
    new_step(c);
    for (int32_t a = g->alt_off[g->root]; a < g->alt_off[g->root + 1]; a++)
        if (push_work(c, fr_intern(c, g->alt_pos[a], 0)) < 0) goto fail;
    int rc = expand(c);
    if (rc < 0 || (m->start = st_intern(c, 0)) < 0) goto fail;
    m->cur = m->start;
    return m;
fail:
    if (c->fail == T_BOUND) lm_err(err, errlen, "%s", c->why);
    else lm_err(err, errlen, "out of memory starting a grammar");
    gmatch_free(m);
    return NULL;
}

lm_gmatch *gmatch_copy(const lm_gmatch *m) {
    lm_gmatch *k = lm_malloc(sizeof *k);
    if (!k) return NULL;
    *k = *m;
    atomic_fetch_add(&k->c->refs, 1);
    return k;
}

void gmatch_free(lm_gmatch *m) {
    if (!m) return;
    if (atomic_fetch_sub(&m->c->refs, 1) == 1) cache_free(m->c);
    lm_free(m);
}

void gmatch_own_grammar(lm_gmatch *m, lm_grammar *g) {
    assert(g == m->c->g);
    m->c->own_g = g;
}

size_t gmatch_bytes(const lm_gmatch *m) {
    const gcache *c = m->c; /* (mask_bytes counts the masks and their lists of ids) */
    return sizeof *c + cache_bytes(c) + c->mask_bytes + (c->own_g ? grammar_bytes(c->own_g) : 0);
}

void gmatch_reset(lm_gmatch *m) { m->cur = m->start; }

static bool st_can_end(const gcache *c, int32_t s) {
    return c->st_part[s] == 0 && c->st_len[s] > 0 && c->items[c->st_off[s]] == 0;
}

bool gmatch_can_end(const lm_gmatch *m) { return st_can_end(m->c, m->cur); }

bool gmatch_must_end(const lm_gmatch *m) {
    const gcache *c = m->c;
    return st_can_end(c, m->cur) && c->st_len[m->cur] == 1;
}

void grammar_mask_apply(const uint32_t *allow, int32_t n_mask, float *row, int32_t n_vocab) {
    int32_t full = (n_mask < n_vocab ? n_mask : n_vocab) / 32;
    for (int32_t w = 0; w < full; w++) {
        uint32_t bits = allow[w];
        float *x = row + (size_t)w * 32;
        if (bits == 0xFFFFFFFFu) continue;
        if (bits == 0) {
            for (int k = 0; k < 32; k++) x[k] = -INFINITY;
            continue;
        }
        uint32_t u[32];
        memcpy(u, x, sizeof u);
        for (int k = 0; k < 32; k++) {
            uint32_t keep = 0u - ((bits >> k) & 1u);
            u[k] = (u[k] & keep) | (0xFF800000u & ~keep); /* 0xFF800000: the bits of -INFINITY */
        }
        memcpy(x, u, sizeof u);
    }
    for (int32_t i = full * 32; i < n_vocab; i++)
        if (i >= n_mask || !((allow[i >> 5] >> (i & 31)) & 1)) row[i] = -INFINITY;
}

/* A public call starts: a fresh work budget. */
static void begin(gcache *c) {
    c->ops = 0;
    c->fail = 0;
}

/* A public call ends with result t: a bound passed spoils the grammar. */
static int32_t end_call(gcache *c, int32_t t) {
    if (c->fail == T_BOUND) atomic_store(&c->spoiled, true);
    return t;
}

/* The state after n bytes from s, or a negative T_ value. */
static int32_t walk_bytes(gcache *c, int32_t s, const char *bytes, size_t n) {
    begin(c);
    for (size_t i = 0; i < n && s >= 0; i++) s = step(c, s, (uint8_t)bytes[i]);
    return end_call(c, s);
}

const char *gmatch_error(const lm_gmatch *m) {
    const gcache *c = m->c;
    return c->fail == T_BOUND ? c->why : c->fail == T_NOMEM ? "out of memory following the grammar" : NULL;
}

const char *gmatch_spoiled(const lm_gmatch *m) { return atomic_load(&m->c->spoiled) ? m->c->why : NULL; }

/* Explore the states the first bytes lead to, most stacks first, up to
 * GM_PROBE_STATES of them: a grammar whose stacks multiply with repeated
 * input (ambiguous repetitions nested in each other) passes a bound here,
 * before any request generates with it. The exploration itself stops,
 * with no verdict, after GM_WORK / 4 operations in all. */
int gmatch_probe(lm_gmatch *m, char *err, size_t errlen) {
    gcache *c = m->c;
    int32_t todo[GM_PROBE_STATES], n_todo = 0, seen = 0;
    todo[n_todo++] = m->start;
    int64_t spent = 0;
    while (n_todo > 0 && seen < GM_PROBE_STATES && spent <= GM_WORK / 4) {
        int32_t k = 0;
        for (int32_t i = 1; i < n_todo; i++)
            if (c->st_len[todo[i]] > c->st_len[todo[k]]) k = i;
        int32_t s = todo[k];
        todo[k] = todo[--n_todo];
        seen++;
        uint64_t live[4];
        live_bytes(c, s, live);
        for (int b = 0; b < 256 && spent <= GM_WORK / 4; b++) {
            if (!((live[b >> 6] >> (b & 63)) & 1)) continue;
            bool fresh = !c->trans[s] || c->trans[s][b] == T_UNKNOWN;
            begin(c);
            int32_t t = step(c, s, (uint8_t)b);
            spent += c->ops + 1;
            if (t == T_NOMEM || t == T_BOUND) {
                end_call(c, t);
                lm_err(err, errlen, "%s", gmatch_error(m));
                return -1;
            }
            if (t >= 0 && fresh && n_todo < GM_PROBE_STATES) todo[n_todo++] = t;
        }
    }
    return 0;
}

bool gmatch_allows(lm_gmatch *m, int32_t tok) {
    const lm_gvocab *v = m->c->v;
    if (tok < 0 || tok >= v->n_vocab) return false;
    m->c->fail = 0;
    if (v->eog[tok]) return gmatch_can_end(m);
    int64_t n = v->off[tok + 1] - v->off[tok];
    return n > 0 && walk_bytes(m->c, m->cur, v->bytes + v->off[tok], (size_t)n) >= 0;
}

int gmatch_accept(lm_gmatch *m, int32_t tok) {
    const lm_gvocab *v = m->c->v;
    m->c->fail = 0;
    if (tok < 0 || tok >= v->n_vocab) return -1;
    if (v->eog[tok]) return gmatch_can_end(m) ? 0 : -1;
    int64_t n = v->off[tok + 1] - v->off[tok];
    if (n <= 0) return -1;
    int32_t s = walk_bytes(m->c, m->cur, v->bytes + v->off[tok], (size_t)n);
    if (s < 0) return -1;
    m->cur = s;
    return 0;
}

int gmatch_accept_bytes(lm_gmatch *m, const char *bytes, size_t n) {
    int32_t s = walk_bytes(m->c, m->cur, bytes, n);
    if (s < 0) return -1;
    m->cur = s;
    return 0;
}

int32_t gmatch_mask(lm_gmatch *m, uint32_t *allow) {
    gcache *c = m->c;
    const lm_gvocab *v = c->v;
    int32_t s = m->cur;
    size_t nw = ((size_t)v->n_vocab + 31) / 32;
    begin(c);
    if (c->mask[s]) {
        memcpy(allow, c->mask[s], nw * sizeof *allow);
        return c->mask_n[s];
    }
    memset(allow, 0, nw * sizeof *allow);
    int32_t count = 0;
    if (st_can_end(c, s))
        for (int32_t i = 0; i < c->n_eog; i++) allow[c->eog[i] >> 5] |= 1u << (c->eog[i] & 31), count++;
    /* one preorder pass over the trie: a dead byte skips its subtree */
    int32_t *ws = c->walk;
    ws[0] = s;
    const uint8_t *nb = v->nb;
    const uint16_t *depth = v->depth;
    const int32_t *end = v->end, *toff = v->tok_off, *toks = v->toks;
    int32_t n_nodes = v->n_nodes;
    for (int32_t i = 1; i < n_nodes;) {
        int32_t from = ws[depth[i] - 1];
        const int32_t *row = c->trans[from];
        int32_t t = row && row[nb[i]] != T_UNKNOWN ? row[nb[i]] : step(c, from, nb[i]);
        if (t < 0) {
            if (t == T_BOUND) break; /* no use going on: the call has failed */
            i = end[i];
            continue;
        }
        ws[depth[i]] = t;
        for (int32_t k = toff[i]; k < toff[i + 1]; k++) allow[toks[k] >> 5] |= 1u << (toks[k] & 31), count++;
        i++;
    }
    if (c->fail) return end_call(c, -1);
    /* cache it, with the list of ids when it is short (dropping every
     * cached mask past the memory bound) */
    bool sparse = count <= v->n_vocab / GM_SPARSE_DIV;
    size_t bytes = nw * sizeof *allow + (sparse ? (size_t)count * sizeof(int32_t) : 0);
    if (c->mask_bytes + bytes > GM_MASK_BYTES) {
        for (int32_t k = 0; k < c->n_st; k++) {
            lm_free(c->mask[k]);
            lm_free(c->ids[k]);
            c->mask[k] = NULL;
            c->ids[k] = NULL;
        }
        c->mask_bytes = 0;
    }
    uint32_t *keep = lm_malloc(nw * sizeof *keep);
    int32_t *ids = sparse ? lm_malloc((size_t)(count ? count : 1) * sizeof *ids) : NULL;
    if (keep && (ids || !sparse)) {
        memcpy(keep, allow, nw * sizeof *keep);
        if (ids) {
            int32_t k = 0;
            for (size_t w = 0; w < nw; w++)
                for (uint32_t bits = allow[w]; bits; bits &= bits - 1)
                    ids[k++] = (int32_t)(w * 32) + __builtin_ctz(bits);
        }
        c->mask[s] = keep;
        c->ids[s] = ids;
        c->mask_n[s] = count;
        c->mask_bytes += bytes;
    } else {
        lm_free(keep);
        lm_free(ids);
    }
    return count;
}

bool gmatch_mask_cached(const lm_gmatch *m) { return m->c->mask[m->cur] != NULL; }

const int32_t *gmatch_mask_ids(const lm_gmatch *m, int32_t *n) {
    const gcache *c = m->c;
    *n = c->ids[m->cur] ? c->mask_n[m->cur] : 0;
    return c->ids[m->cur];
}
