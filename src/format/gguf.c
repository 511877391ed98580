/*
 * gguf.c - GGUF v2/v3 reader (mmap or caller buffer) and v3 writer.
 *
 * Reader. The whole header (kv section and tensor directory) is parsed once
 * at open time by a cursor that never reads a byte before checking, with
 * overflow-safe arithmetic, that the byte lies inside the file. Values are
 * not copied: a kv records where its value bytes start in the mapping, and
 * getters decode them on demand (unaligned-safe, with memcpy). Arrays of
 * strings and arrays of arrays get a per-element index, allocated only after
 * the cursor has checked that the bytes left could hold that many minimal
 * elements (8 bytes per string, 12 per nested array), so memory stays linear
 * in the file size whatever the counts claim. The same rule sizes the kv and
 * tensor tables.
 *
 * What the reader refuses, each with a message naming the place:
 *   - a magic other than "GGUF"; versions other than 2 and 3 (1 by name);
 *   - a truncated header, or a length / count that the file cannot hold;
 *   - an unknown value type; arrays nested deeper than GGUF_MAX_NESTING;
 *     a bool byte other than 0 or 1;
 *   - an empty key, a key over 65535 bytes or holding a NUL byte, a
 *     duplicate key;
 *   - `general.alignment` that is not a u32 power of two;
 *   - a tensor name that is empty, over GGUF_MAX_NAME bytes or holds a NUL
 *     byte; a duplicate tensor name;
 *   - n_dims outside 1..4; a dimension of 0 (lamina does not load
 *     zero-size tensors); an element count over INT64_MAX; an unknown ggml
 *     type; ne[0] not a multiple of the type's block size;
 *   - a tensor offset that is not a multiple of the alignment, a data extent
 *     past the end of the file, or two tensors whose data overlap.
 * A file without tensors may end right after its header (the padding before
 * an empty data section is not required).
 *
 * Writer. Each kv is kept as its key and its serialized value bytes (type
 * tag excluded), so copying a kv from a reader is a byte copy of a region
 * the reader has already validated, nested arrays included. The first
 * failed set/add call is remembered and makes gguf_writer_write() fail with
 * its message, so a caller cannot write a file silently missing an entry.
 * Files are written through base/safefile: a temporary file renamed over
 * the destination only when complete, so a failed write leaves whatever
 * was at the destination as it was. The host is assumed little-endian, as
 * GGUF is (checked at compile time).
 */
#include "format/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/gguf_int.h"
#include "format/quant.h"
#include "base/safefile.h"
#include "base/util.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c assumes a little-endian host"
#endif

#define GGUF_MAGIC "GGUF"
#define GGUF_MAX_NESTING 8  /* array depth: a top-level array is depth 1 */
#define GGUF_MAX_NAME 256   /* bytes in a tensor name */
#define GGUF_MAX_KEY 65535  /* bytes in a key */
#define MIN_KV_BYTES 14     /* key len (8) + 1 key byte + type (4) + 1 value byte */
#define MIN_TENSOR_BYTES 33 /* name len (8) + 1 name byte + n_dims (4) + ne (8) + type (4) + offset (8) */

/* ---- small helpers --------------------------------------------------------- */

static uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Bytes of one element of a fixed-size type; 0 for string, array, unknown. */
static size_t vtype_size(uint32_t t) {
    switch (t) {
        case GGUF_UINT8:
        case GGUF_INT8:
        case GGUF_BOOL: return 1;
        case GGUF_UINT16:
        case GGUF_INT16: return 2;
        case GGUF_UINT32:
        case GGUF_INT32:
        case GGUF_FLOAT32: return 4;
        case GGUF_UINT64:
        case GGUF_INT64:
        case GGUF_FLOAT64: return 8;
        default: return 0;
    }
}

const char *gguf_vtype_name(enum gguf_vtype t) {
    static const char *names[GGUF_VTYPE_COUNT] = {
        "uint8", "int8",   "uint16", "int16",  "uint32", "int32",   "float32",
        "bool",  "string", "array",  "uint64", "int64",  "float64",
    };
    return (unsigned)t < GGUF_VTYPE_COUNT ? names[t] : "unknown";
}

bool gguf_str_eq(gguf_str s, const char *cstr) {
    if (!cstr || (!s.ptr && s.len)) return false;
    size_t n = strlen(cstr);
    return s.len == n && (n == 0 || memcmp(s.ptr, cstr, n) == 0);
}

static uint64_t hash_bytes(const void *p, uint64_t n) {
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (uint64_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static bool is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

/* Round x up to a multiple of the power of two a; false on overflow. */
static bool align_up(uint64_t x, uint64_t a, uint64_t *out) {
    uint64_t t;
    if (!lm_add_u64(x, a - 1, &t)) return false;
    *out = t & ~(a - 1);
    return true;
}

/* ---- bump arena for the reader's indexes and names ---------------------- */

typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char mem[];
} arena_block;

static void *arena_alloc(arena_block **head, size_t n) {
    n = (n + 15) & ~(size_t)15;
    arena_block *b = *head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        b = lm_malloc(sizeof(arena_block) + cap);
        if (!b) return NULL;
        b->next = *head;
        b->used = 0;
        b->cap = cap;
        *head = b;
    }
    void *p = b->mem + b->used;
    b->used += n;
    return p;
}

static void arena_free(arena_block *b) {
    while (b) {
        arena_block *n = b->next;
        lm_free(b);
        b = n;
    }
}

/* ---- the context ------------------------------------------------------------ */

typedef struct {
    gguf_str key;
    enum gguf_vtype type;
    const uint8_t *val; /* value bytes in the mapping (after the type tag) */
    uint64_t val_len;
    gguf_arr arr; /* filled when type == GGUF_ARRAY */
} kv_entry;

struct gguf_ctx {
    const uint8_t *base; /* (size) file bytes */
    uint64_t size;
    void *map; /* non-NULL when gguf_open mapped the file */
    size_t map_len;
    uint32_t version, alignment;
    uint64_t data_off;
    int64_t n_kv, n_tensors;
    kv_entry *kv;         /* (n_kv) */
    gguf_tensor *tensors; /* (n_tensors) */
    uint32_t *kv_hash;    /* (kv_hmask + 1) slots: kv index + 1, 0 = empty */
    uint32_t *t_hash;     /* (t_hmask + 1) slots: tensor index + 1 */
    uint64_t kv_hmask, t_hmask;
    arena_block *arena; /* array indexes and tensor names */
    gguf_ctx **parts;   /* (n_parts) the other files of a split model, owned; tensors point into them */
    int n_parts;
    uint64_t size_all; /* bytes of this file and its parts */
};

/* Parser state: a cursor over the file plus the context being filled. */
typedef struct {
    gguf_ctx *ctx;
    uint64_t off;
    char *err;
    size_t errlen;
    char where[320];  /* "kv 3 'general.name'" or "tensor 7 'output.weight'" */
    lm_status status; /* the kind of the failure: LM_ERR_FORMAT unless set otherwise */
} parser;

/* Mark the failure being reported as out of memory / not supported; returns
 * -1 like lm_err, so `return nomem(p), lm_err(...)` reads as one failure. */
static int nomem(parser *p) {
    p->status = LM_ERR_NOMEM;
    return -1;
}
static int unsupported(parser *p) {
    p->status = LM_ERR_UNSUPPORTED;
    return -1;
}

/* Check that n bytes are left at the cursor. `what` names the field; idx >= 0
 * adds an array element index. */
static int need(parser *p, uint64_t n, const char *what, int64_t idx) {
    uint64_t left = p->ctx->size - p->off;
    if (n <= left) return 0;
    char elem[48] = "";
    if (idx >= 0) snprintf(elem, sizeof elem, "element %" PRId64 ": ", idx);
    return lm_err(p->err, p->errlen,
                  "%s%s%s%s at offset %" PRIu64 " needs %" PRIu64 " bytes, only %" PRIu64 " left (file is %" PRIu64
                  " bytes)",
                  p->where, p->where[0] ? ": " : "", elem, what, p->off, n, left, p->ctx->size);
}

static int take_u32(parser *p, uint32_t *v, const char *what, int64_t idx) {
    if (need(p, 4, what, idx)) return -1;
    *v = rd32(p->ctx->base + p->off);
    p->off += 4;
    return 0;
}

static int take_u64(parser *p, uint64_t *v, const char *what, int64_t idx) {
    if (need(p, 8, what, idx)) return -1;
    *v = rd64(p->ctx->base + p->off);
    p->off += 8;
    return 0;
}

/* A string: u64 length then the bytes. */
static int take_str(parser *p, gguf_str *s, const char *what, int64_t idx) {
    uint64_t len;
    if (take_u64(p, &len, what, idx)) return -1;
    if (len > p->ctx->size - p->off) {
        char elem[48] = "";
        if (idx >= 0) snprintf(elem, sizeof elem, "element %" PRId64 ": ", idx);
        return lm_err(p->err, p->errlen,
                      "%s%s%s%s length %" PRIu64 " at offset %" PRIu64 " exceeds the %" PRIu64
                      " bytes left in the file (%" PRIu64 " bytes)",
                      p->where, p->where[0] ? ": " : "", elem, what, len, p->off - 8, p->ctx->size - p->off,
                      p->ctx->size);
    }
    s->ptr = (const char *)p->ctx->base + p->off;
    s->len = len;
    p->off += len;
    return 0;
}

static int parse_array(parser *p, int depth, gguf_arr *arr);

/* Fixed-size elements: one bounds check for all of them, then bools. */
static int parse_fixed_elems(parser *p, gguf_arr *arr) {
    size_t esz = vtype_size(arr->type);
    uint64_t total;
    if (!lm_mul_u64(arr->n, esz, &total) || total > p->ctx->size - p->off)
        return lm_err(p->err, p->errlen,
                      "%s: array of %" PRIu64 " %s at offset %" PRIu64 " does not fit in the %" PRIu64
                      " bytes left in the file (%" PRIu64 " bytes)",
                      p->where, arr->n, gguf_vtype_name(arr->type), p->off, p->ctx->size - p->off, p->ctx->size);
    const uint8_t *b = p->ctx->base + p->off;
    if (arr->type == GGUF_BOOL)
        for (uint64_t i = 0; i < arr->n; i++)
            if (b[i] > 1)
                return lm_err(p->err, p->errlen, "%s: array element %" PRIu64 ": bool value %u is not 0 or 1", p->where,
                              i, b[i]);
    p->off += total;
    return 0;
}

/* Strings or nested arrays: each element is indexed. The count is checked
 * against the smallest possible element before the index is allocated. */
static int parse_indexed_elems(parser *p, int depth, gguf_arr *arr) {
    uint64_t min = arr->type == GGUF_STRING ? 8 : 12;
    uint64_t left = p->ctx->size - p->off;
    if (arr->n > left / min)
        return lm_err(p->err, p->errlen,
                      "%s: array count %" PRIu64 " of %s at offset %" PRIu64 " cannot fit in the %" PRIu64
                      " bytes left in the file (%" PRIu64 " bytes)",
                      p->where, arr->n, gguf_vtype_name(arr->type), p->off, left, p->ctx->size);
    if (arr->n == 0) return 0;
    size_t esz = arr->type == GGUF_STRING ? sizeof(uint64_t) : sizeof(gguf_arr);
    void *index = arena_alloc(&p->ctx->arena, (size_t)arr->n * esz);
    if (!index)
        return nomem(p),
               lm_err(p->err, p->errlen, "%s: out of memory indexing %" PRIu64 " array elements", p->where, arr->n);
    arr->index = index;
    uint64_t start = p->off;
    for (uint64_t i = 0; i < arr->n; i++) {
        if (arr->type == GGUF_STRING) {
            gguf_str s;
            ((uint64_t *)index)[i] = p->off - start;
            if (take_str(p, &s, "array string", (int64_t)i)) return -1;
        } else {
            if (parse_array(p, depth + 1, &((gguf_arr *)index)[i])) return -1;
        }
    }
    return 0;
}

/* An array value: element type (u32), count (u64), elements. depth counts
 * this array (1 for a kv's own array). */
static int parse_array(parser *p, int depth, gguf_arr *arr) {
    memset(arr, 0, sizeof *arr);
    if (depth > GGUF_MAX_NESTING)
        return lm_err(p->err, p->errlen, "%s: arrays nested deeper than %d levels at offset %" PRIu64, p->where,
                      GGUF_MAX_NESTING, p->off);
    uint32_t et;
    uint64_t n;
    if (take_u32(p, &et, "array element type", -1)) return -1;
    if (et >= GGUF_VTYPE_COUNT)
        return lm_err(p->err, p->errlen, "%s: unknown array element type %u at offset %" PRIu64, p->where, et,
                      p->off - 4);
    if (take_u64(p, &n, "array count", -1)) return -1;
    arr->type = (enum gguf_vtype)et;
    arr->n = n;
    arr->data = p->ctx->base + p->off;
    if (vtype_size(et)) return parse_fixed_elems(p, arr);
    return parse_indexed_elems(p, depth, arr);
}

static int parse_value(parser *p, kv_entry *e) {
    e->val = p->ctx->base + p->off;
    uint64_t start = p->off;
    size_t sz = vtype_size(e->type);
    if (sz) {
        if (need(p, sz, gguf_vtype_name(e->type), -1)) return -1;
        if (e->type == GGUF_BOOL && e->val[0] > 1)
            return lm_err(p->err, p->errlen, "%s: bool value %u is not 0 or 1", p->where, e->val[0]);
        p->off += sz;
    } else if (e->type == GGUF_STRING) {
        gguf_str s;
        if (take_str(p, &s, "string", -1)) return -1;
    } else if (parse_array(p, 1, &e->arr)) {
        return -1;
    }
    e->val_len = p->off - start;
    return 0;
}

/* Open-addressing tables keyed by name; slots hold index + 1. */
static uint32_t *hash_new(int64_t n, uint64_t *mask) {
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2) cap <<= 1;
    *mask = cap - 1;
    return lm_calloc(cap, sizeof(uint32_t));
}

/* Returns the slot where name is or would go. name_at(i) gives entry i's name. */
typedef gguf_str (*name_fn)(const gguf_ctx *ctx, uint32_t i);
static gguf_str kv_name(const gguf_ctx *ctx, uint32_t i) { return ctx->kv[i].key; }
static gguf_str tensor_name(const gguf_ctx *ctx, uint32_t i) {
    gguf_str s = {ctx->tensors[i].name, strlen(ctx->tensors[i].name)};
    return s;
}

static uint64_t hash_slot(const gguf_ctx *ctx, const uint32_t *tab, uint64_t mask, name_fn fn, const char *name,
                          uint64_t len) {
    uint64_t h = hash_bytes(name, len) & mask;
    while (tab[h]) {
        gguf_str s = fn(ctx, tab[h] - 1);
        if (s.len == len && memcmp(s.ptr, name, len) == 0) break;
        h = (h + 1) & mask;
    }
    return h;
}

/* Header: magic, version, counts; checks the counts against the bytes left. */
static int parse_header(parser *p) {
    gguf_ctx *c = p->ctx;
    if (c->size < 4 || memcmp(c->base, GGUF_MAGIC, 4) != 0) {
        if (c->size < 4)
            return lm_err(p->err, p->errlen, "not a GGUF file: %" PRIu64 " bytes, too short for the magic", c->size);
        return lm_err(p->err, p->errlen, "not a GGUF file: magic is %02x %02x %02x %02x, expected \"GGUF\"", c->base[0],
                      c->base[1], c->base[2], c->base[3]);
    }
    p->off = 4;
    uint32_t v;
    uint64_t nt, nkv;
    if (take_u32(p, &v, "header version", -1)) return -1;
    if (v == 1)
        return unsupported(p),
               lm_err(p->err, p->errlen,
                      "GGUF version 1 is not supported (it uses 32-bit counts); "
                      "convert the file to version 3");
    if (v != 2 && v != 3) {
        unsupported(p);
        if (v == 0x02000000u || v == 0x03000000u)
            return lm_err(p->err, p->errlen, "GGUF version %u is not supported (a big-endian file?)", v);
        return lm_err(p->err, p->errlen, "GGUF version %u is not supported (only 2 and 3)", v);
    }
    c->version = v;
    if (take_u64(p, &nt, "header tensor count", -1)) return -1;
    if (take_u64(p, &nkv, "header kv count", -1)) return -1;
    uint64_t left = c->size - p->off;
    uint64_t kv_min, t_min, sum;
    if (!lm_mul_u64(nkv, MIN_KV_BYTES, &kv_min) || kv_min > left)
        return lm_err(p->err, p->errlen,
                      "kv count %" PRIu64 " cannot fit in the %" PRIu64 " bytes after the header (file is %" PRIu64
                      " bytes)",
                      nkv, left, c->size);
    if (!lm_mul_u64(nt, MIN_TENSOR_BYTES, &t_min) || !lm_add_u64(kv_min, t_min, &sum) || sum > left)
        return lm_err(p->err, p->errlen,
                      "tensor count %" PRIu64 " cannot fit in the %" PRIu64 " bytes after the header (file is %" PRIu64
                      " bytes)",
                      nt, left, c->size);
    if (nkv > UINT32_MAX - 1 || nt > UINT32_MAX - 1)
        return lm_err(p->err, p->errlen, "too many entries (%" PRIu64 " kvs, %" PRIu64 " tensors)", nkv, nt);
    c->n_kv = (int64_t)nkv;
    c->n_tensors = (int64_t)nt;
    return 0;
}

static void set_where_kv(parser *p, int64_t i, gguf_str key) {
    int n = key.len > 200 ? 200 : (int)key.len;
    snprintf(p->where, sizeof p->where, "kv %" PRId64 " '%.*s%s'", i, n, key.ptr, key.len > 200 ? "..." : "");
}

static int parse_kvs(parser *p) {
    gguf_ctx *c = p->ctx;
    c->kv = lm_calloc((size_t)c->n_kv, sizeof(kv_entry));
    c->kv_hash = hash_new(c->n_kv, &c->kv_hmask);
    if (!c->kv || !c->kv_hash) return nomem(p), lm_err(p->err, p->errlen, "out of memory for %" PRId64 " kvs", c->n_kv);
    for (int64_t i = 0; i < c->n_kv; i++) {
        kv_entry *e = &c->kv[i];
        snprintf(p->where, sizeof p->where, "kv %" PRId64, i);
        if (take_str(p, &e->key, "key", -1)) return -1;
        if (e->key.len == 0) return lm_err(p->err, p->errlen, "kv %" PRId64 ": empty key", i);
        if (e->key.len > GGUF_MAX_KEY)
            return lm_err(p->err, p->errlen, "kv %" PRId64 ": key of %" PRIu64 " bytes (at most %d)", i, e->key.len,
                          GGUF_MAX_KEY);
        if (memchr(e->key.ptr, 0, e->key.len))
            return lm_err(p->err, p->errlen, "kv %" PRId64 ": key contains a NUL byte", i);
        set_where_kv(p, i, e->key);
        uint64_t slot = hash_slot(c, c->kv_hash, c->kv_hmask, kv_name, e->key.ptr, e->key.len);
        if (c->kv_hash[slot])
            return lm_err(p->err, p->errlen, "%s: duplicate key (first seen as kv %u)", p->where, c->kv_hash[slot] - 1);
        c->kv_hash[slot] = (uint32_t)i + 1;
        uint32_t t;
        if (take_u32(p, &t, "value type", -1)) return -1;
        if (t >= GGUF_VTYPE_COUNT)
            return lm_err(p->err, p->errlen, "%s: unknown value type %u at offset %" PRIu64, p->where, t, p->off - 4);
        e->type = (enum gguf_vtype)t;
        if (parse_value(p, e)) return -1;
    }
    p->where[0] = 0;
    return 0;
}

static int parse_alignment(parser *p) {
    gguf_ctx *c = p->ctx;
    c->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = gguf_find_key(c, "general.alignment");
    if (i < 0) return 0;
    if (c->kv[i].type != GGUF_UINT32)
        return lm_err(p->err, p->errlen, "general.alignment has type %s, expected uint32",
                      gguf_vtype_name(c->kv[i].type));
    uint32_t a = rd32(c->kv[i].val);
    if (!is_pow2(a)) return lm_err(p->err, p->errlen, "general.alignment %u is not a non-zero power of two", a);
    c->alignment = a;
    return 0;
}

/* Shape and type of one tensor info; fills t->ne, n_dims, type, nbytes. */
static int parse_tensor_shape(parser *p, gguf_tensor *t) {
    if (take_u32(p, &t->n_dims, "n_dims", -1)) return -1;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return lm_err(p->err, p->errlen, "%s: n_dims %u is outside 1..%d", p->where, t->n_dims, GGUF_MAX_DIMS);
    uint64_t nel = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (take_u64(p, &t->ne[d], "dimension", -1)) return -1;
        if (t->ne[d] == 0)
            return lm_err(p->err, p->errlen, "%s: dimension %u is 0 (zero-size tensors are not supported)", p->where,
                          d);
        if (!lm_mul_u64(nel, t->ne[d], &nel) || nel > (uint64_t)INT64_MAX)
            return lm_err(p->err, p->errlen, "%s: element count overflows at dimension %u (ne %" PRIu64 ")", p->where,
                          d, t->ne[d]);
    }
    if (take_u32(p, &t->type, "type", -1)) return -1;
    const lm_type_traits *tr = quant_traits(t->type);
    if (!tr) return unsupported(p), lm_err(p->err, p->errlen, "%s: unknown ggml type %u", p->where, t->type);
    if (t->ne[0] % (uint64_t)tr->blck)
        return lm_err(p->err, p->errlen, "%s: ne[0] = %" PRIu64 " is not a multiple of the %s block size %" PRId64,
                      p->where, t->ne[0], tr->name, tr->blck);
    uint64_t rows = nel / t->ne[0];
    uint64_t row;
    if (!lm_mul_u64(t->ne[0] / (uint64_t)tr->blck, tr->type_size, &row) || !lm_mul_u64(row, rows, &t->nbytes))
        return lm_err(p->err, p->errlen, "%s: byte size overflows", p->where);
    return 0;
}

static int parse_tensor_infos(parser *p) {
    gguf_ctx *c = p->ctx;
    c->tensors = lm_calloc((size_t)c->n_tensors, sizeof(gguf_tensor));
    c->t_hash = hash_new(c->n_tensors, &c->t_hmask);
    if (!c->tensors || !c->t_hash)
        return nomem(p), lm_err(p->err, p->errlen, "out of memory for %" PRId64 " tensors", c->n_tensors);
    for (int64_t i = 0; i < c->n_tensors; i++) {
        gguf_tensor *t = &c->tensors[i];
        gguf_str name;
        snprintf(p->where, sizeof p->where, "tensor %" PRId64, i);
        if (take_str(p, &name, "name", -1)) return -1;
        if (name.len == 0) return lm_err(p->err, p->errlen, "tensor %" PRId64 ": empty name", i);
        if (name.len > GGUF_MAX_NAME)
            return lm_err(p->err, p->errlen, "tensor %" PRId64 ": name of %" PRIu64 " bytes (at most %d)", i, name.len,
                          GGUF_MAX_NAME);
        if (memchr(name.ptr, 0, name.len))
            return lm_err(p->err, p->errlen, "tensor %" PRId64 ": name contains a NUL byte", i);
        t->name = arena_alloc(&c->arena, name.len + 1);
        if (!t->name) return nomem(p), lm_err(p->err, p->errlen, "out of memory for tensor names");
        memcpy(t->name, name.ptr, name.len);
        t->name[name.len] = 0;
        snprintf(p->where, sizeof p->where, "tensor '%s'", t->name);
        uint64_t slot = hash_slot(c, c->t_hash, c->t_hmask, tensor_name, name.ptr, name.len);
        if (c->t_hash[slot])
            return lm_err(p->err, p->errlen, "%s: duplicate tensor name (tensors %u and %" PRId64 ")", p->where,
                          c->t_hash[slot] - 1, i);
        c->t_hash[slot] = (uint32_t)i + 1;
        if (parse_tensor_shape(p, t)) return -1;
        if (take_u64(p, &t->offset, "offset", -1)) return -1;
    }
    p->where[0] = 0;
    return 0;
}

typedef struct {
    uint64_t off, end;
    int64_t i;
} extent;

static int cmp_extent(const void *a, const void *b) {
    const extent *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Data section and each tensor's extent; then overlaps. */
static int check_tensor_data(parser *p) {
    gguf_ctx *c = p->ctx;
    if (!align_up(p->off, c->alignment, &c->data_off))
        return lm_err(p->err, p->errlen, "data section offset overflows");
    if (c->n_tensors == 0) return 0;
    if (c->data_off > c->size)
        return lm_err(p->err, p->errlen,
                      "data section starts at %" PRIu64 ", past the end of the file (%" PRIu64 " bytes)", c->data_off,
                      c->size);
    uint64_t room = c->size - c->data_off;
    extent *ex = lm_malloc((size_t)c->n_tensors * sizeof(extent));
    if (!ex) return nomem(p), lm_err(p->err, p->errlen, "out of memory checking %" PRId64 " tensors", c->n_tensors);
    for (int64_t i = 0; i < c->n_tensors; i++) {
        gguf_tensor *t = &c->tensors[i];
        if (t->offset % c->alignment) {
            lm_free(ex);
            return lm_err(p->err, p->errlen,
                          "tensor '%s': data offset %" PRIu64 " is not a multiple of the alignment %u", t->name,
                          t->offset, c->alignment);
        }
        if (t->offset > room || t->nbytes > room - t->offset) {
            lm_free(ex);
            return lm_err(p->err, p->errlen,
                          "tensor '%s': data [offset %" PRIu64 ", +%" PRIu64
                          " bytes] extends past end of file (%" PRIu64 " bytes, data section at %" PRIu64 ")",
                          t->name, t->offset, t->nbytes, c->size, c->data_off);
        }
        t->data = c->base + c->data_off + t->offset;
        ex[i] = (extent){t->offset, t->offset + t->nbytes, i};
    }
    qsort(ex, (size_t)c->n_tensors, sizeof(extent), cmp_extent);
    for (int64_t i = 1; i < c->n_tensors; i++) {
        if (ex[i].off < ex[i - 1].end) {
            const char *a = c->tensors[ex[i - 1].i].name, *b = c->tensors[ex[i].i].name;
            lm_free(ex);
            return lm_err(p->err, p->errlen, "tensors '%s' and '%s': data overlap", a, b);
        }
    }
    lm_free(ex);
    return 0;
}

static void ctx_free(gguf_ctx *c) {
    if (!c) return;
    for (int i = 0; i < c->n_parts; i++) ctx_free(c->parts[i]);
    lm_free(c->parts);
    lm_free(c->kv);
    lm_free(c->tensors);
    lm_free(c->kv_hash);
    lm_free(c->t_hash);
    arena_free(c->arena);
    if (c->map) munmap(c->map, c->map_len);
    lm_free(c);
}

static gguf_ctx *parse_all(gguf_ctx *c, lm_status *status, char *err, size_t errlen) {
    parser p = {.ctx = c, .off = 0, .err = err, .errlen = errlen, .where = "", .status = LM_ERR_FORMAT};
    if (parse_header(&p) || parse_kvs(&p) || parse_alignment(&p) || parse_tensor_infos(&p) || check_tensor_data(&p)) {
        ctx_free(c);
        *status = p.status;
        return NULL;
    }
    *status = LM_OK;
    return c;
}

gguf_ctx *gguf_open_mem(const void *data, size_t size, char *err, size_t errlen) {
    if (!data && size) {
        lm_err(err, errlen, "no buffer given");
        return NULL;
    }
    gguf_ctx *c = lm_calloc(1, sizeof *c);
    if (!c) {
        lm_err(err, errlen, "out of memory");
        return NULL;
    }
    static const uint8_t empty[1];
    c->base = data ? data : empty;
    c->size = c->size_all = size;
    lm_status st;
    return parse_all(c, &st, err, errlen);
}

gguf_ctx *gguf_open(const char *path, char *err, size_t errlen) {
    lm_status st;
    return gguf_open_status(path, &st, err, errlen);
}

gguf_ctx *gguf_open_status(const char *path, lm_status *status, char *err, size_t errlen) {
    gguf_ctx *c = gguf_open_one(path, status, err, errlen);
    int64_t n_split;
    if (!c || !gguf_get_int(c, GGUF_KEY_SPLIT_COUNT, &n_split) || n_split <= 1) return c;
    return gguf_split_load(c, path, status, err, errlen);
}

gguf_ctx *gguf_open_one(const char *path, lm_status *status, char *err, size_t errlen) {
    *status = LM_ERR_IO;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO must not block the open */
    if (fd < 0) {
        lm_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        lm_err(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (S_ISDIR(st.st_mode) || !S_ISREG(st.st_mode)) {
        lm_err(err, errlen, "%s: %s", path, S_ISDIR(st.st_mode) ? "is a directory" : "is not a regular file");
        close(fd);
        return NULL;
    }
    safefile_note_input(path); /* never an output of this process (base/safefile.h) */
    if (st.st_size == 0) {
        *status = LM_ERR_FORMAT;
        lm_err(err, errlen, "%s: file is empty", path);
        close(fd);
        return NULL;
    }
    size_t len = (size_t)st.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (map == MAP_FAILED) {
        lm_err(err, errlen, "%s: cannot map %zu bytes: %s", path, len, strerror(map_errno));
        return NULL;
    }
    gguf_ctx *c = lm_calloc(1, sizeof *c);
    if (!c) {
        munmap(map, len);
        *status = LM_ERR_NOMEM;
        lm_err(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    c->base = map;
    c->size = c->size_all = len;
    c->map = map;
    c->map_len = len;
    char msg[LM_ERRLEN];
    gguf_ctx *r = parse_all(c, status, msg, sizeof msg);
    if (!r) lm_err(err, errlen, "%s: %s", path, msg);
    return r;
}

void gguf_close(gguf_ctx *ctx) { ctx_free(ctx); }

int gguf_join(gguf_ctx *c, gguf_ctx **parts, int n, char *err, size_t errlen) {
    int64_t total = c->n_tensors;
    uint64_t size_all = c->size;
    for (int i = 0; i < n; i++) {
        total += parts[i]->n_tensors; /* each under the file-size bound: no overflow */
        size_all += parts[i]->size;
    }
    if (total > (int64_t)UINT32_MAX - 1) return lm_err(err, errlen, "%" PRId64 " tensors in all: too many", total);
    gguf_ctx tmp = *c; /* the joined table, hashed before c changes */
    tmp.n_tensors = total;
    tmp.tensors = lm_calloc((size_t)total ? (size_t)total : 1, sizeof(gguf_tensor));
    tmp.t_hash = hash_new(total, &tmp.t_hmask);
    if (!tmp.tensors || !tmp.t_hash) {
        lm_free(tmp.tensors);
        lm_free(tmp.t_hash);
        return lm_err(err, errlen, "out of memory for %" PRId64 " tensors", total);
    }
    int64_t k = 0;
    for (int f = -1; f < n; f++) {
        const gguf_ctx *src = f < 0 ? c : parts[f];
        for (int64_t i = 0; i < src->n_tensors; i++, k++) {
            tmp.tensors[k] = src->tensors[i];
            const char *name = tmp.tensors[k].name;
            uint64_t slot = hash_slot(&tmp, tmp.t_hash, tmp.t_hmask, tensor_name, name, strlen(name));
            if (tmp.t_hash[slot]) {
                lm_free(tmp.tensors);
                lm_free(tmp.t_hash);
                return lm_err(err, errlen, "tensor '%s' is in part %d and in an earlier part", name, f + 2);
            }
            tmp.t_hash[slot] = (uint32_t)k + 1;
        }
    }
    lm_free(c->tensors);
    lm_free(c->t_hash);
    c->tensors = tmp.tensors;
    c->t_hash = tmp.t_hash;
    c->t_hmask = tmp.t_hmask;
    c->n_tensors = total;
    c->parts = parts;
    c->n_parts = n;
    c->size_all = size_all;
    return 0;
}

uint32_t gguf_version(const gguf_ctx *ctx) { return ctx->version; }
uint32_t gguf_alignment(const gguf_ctx *ctx) { return ctx->alignment; }
uint64_t gguf_file_size(const gguf_ctx *ctx) { return ctx->size; }
uint64_t gguf_data_offset(const gguf_ctx *ctx) { return ctx->data_off; }
int gguf_n_files(const gguf_ctx *ctx) { return 1 + ctx->n_parts; }
uint64_t gguf_size_all(const gguf_ctx *ctx) { return ctx->size_all; }

/* ---- metadata getters ------------------------------------------------------- */

int64_t gguf_n_kv(const gguf_ctx *ctx) { return ctx->n_kv; }

int64_t gguf_find_key(const gguf_ctx *ctx, const char *key) {
    if (!key || !ctx->kv_hash) return -1;
    uint64_t s = hash_slot(ctx, ctx->kv_hash, ctx->kv_hmask, kv_name, key, strlen(key));
    return ctx->kv_hash[s] ? (int64_t)ctx->kv_hash[s] - 1 : -1;
}

gguf_str gguf_kv_key(const gguf_ctx *ctx, int64_t i) {
    gguf_str none = {NULL, 0};
    return i >= 0 && i < ctx->n_kv ? ctx->kv[i].key : none;
}

enum gguf_vtype gguf_kv_type(const gguf_ctx *ctx, int64_t i) {
    return i >= 0 && i < ctx->n_kv ? ctx->kv[i].type : GGUF_VTYPE_COUNT;
}

/* Decode one scalar at p of type t. is_int: integer or bool (in *iv, with
 * *neg for a negative value, *uv for the unsigned magnitude); else float. */
typedef struct {
    bool ok, is_int, neg;
    uint64_t u;
    int64_t i;
    double f;
} scalar;

static scalar decode_scalar(enum gguf_vtype t, const uint8_t *p) {
    scalar s = {true, true, false, 0, 0, 0};
    switch (t) {
        case GGUF_UINT8:
        case GGUF_BOOL: s.u = p[0]; break;
        case GGUF_UINT16: s.u = rd16(p); break;
        case GGUF_UINT32: s.u = rd32(p); break;
        case GGUF_UINT64: s.u = rd64(p); break;
        case GGUF_INT8:
            s.i = (int8_t)p[0];
            s.neg = s.i < 0;
            break;
        case GGUF_INT16:
            s.i = (int16_t)rd16(p);
            s.neg = s.i < 0;
            break;
        case GGUF_INT32:
            s.i = (int32_t)rd32(p);
            s.neg = s.i < 0;
            break;
        case GGUF_INT64:
            s.i = (int64_t)rd64(p);
            s.neg = s.i < 0;
            break;
        case GGUF_FLOAT32: {
            float f;
            memcpy(&f, p, 4);
            s.f = f;
            s.is_int = false;
            return s;
        }
        case GGUF_FLOAT64:
            memcpy(&s.f, p, 8);
            s.is_int = false;
            return s;
        default: s.ok = false; return s;
    }
    bool is_signed = t == GGUF_INT8 || t == GGUF_INT16 || t == GGUF_INT32 || t == GGUF_INT64;
    if (is_signed) {
        if (!s.neg) s.u = (uint64_t)s.i;
    } else {
        s.i = (int64_t)s.u; /* meaningful only when s.u <= INT64_MAX */
    }
    s.f = is_signed ? (double)s.i : (double)s.u;
    return s;
}

static bool scalar_int(scalar s, int64_t *out) {
    if (!s.ok || !s.is_int) return false;
    if (!s.neg && s.u > (uint64_t)INT64_MAX) return false;
    if (out) *out = s.i;
    return true;
}

static bool scalar_uint(scalar s, uint64_t *out) {
    if (!s.ok || !s.is_int || s.neg) return false;
    if (out) *out = s.u;
    return true;
}

static bool scalar_float(scalar s, enum gguf_vtype t, double *out) {
    if (!s.ok || t == GGUF_BOOL) return false;
    if (out) *out = s.f;
    return true;
}

static scalar kv_scalar(const gguf_ctx *ctx, int64_t i) {
    scalar none = {false, false, false, 0, 0, 0};
    if (i < 0 || i >= ctx->n_kv) return none;
    return decode_scalar(ctx->kv[i].type, ctx->kv[i].val);
}

bool gguf_kv_int(const gguf_ctx *ctx, int64_t i, int64_t *out) { return scalar_int(kv_scalar(ctx, i), out); }

bool gguf_kv_float(const gguf_ctx *ctx, int64_t i, double *out) {
    return scalar_float(kv_scalar(ctx, i), gguf_kv_type(ctx, i), out);
}

bool gguf_kv_str(const gguf_ctx *ctx, int64_t i, gguf_str *out) {
    if (i < 0 || i >= ctx->n_kv || ctx->kv[i].type != GGUF_STRING) return false;
    if (out) {
        out->len = rd64(ctx->kv[i].val);
        out->ptr = (const char *)ctx->kv[i].val + 8;
    }
    return true;
}

bool gguf_kv_arr(const gguf_ctx *ctx, int64_t i, gguf_arr *out) {
    if (i < 0 || i >= ctx->n_kv || ctx->kv[i].type != GGUF_ARRAY) return false;
    if (out) *out = ctx->kv[i].arr;
    return true;
}

bool gguf_get_int(const gguf_ctx *ctx, const char *key, int64_t *out) {
    return gguf_kv_int(ctx, gguf_find_key(ctx, key), out);
}

bool gguf_get_uint(const gguf_ctx *ctx, const char *key, uint64_t *out) {
    return scalar_uint(kv_scalar(ctx, gguf_find_key(ctx, key)), out);
}

bool gguf_get_float(const gguf_ctx *ctx, const char *key, double *out) {
    return gguf_kv_float(ctx, gguf_find_key(ctx, key), out);
}

bool gguf_get_bool(const gguf_ctx *ctx, const char *key, bool *out) {
    int64_t i = gguf_find_key(ctx, key);
    if (i < 0 || ctx->kv[i].type != GGUF_BOOL) return false;
    if (out) *out = ctx->kv[i].val[0] != 0;
    return true;
}

bool gguf_get_str(const gguf_ctx *ctx, const char *key, gguf_str *out) {
    return gguf_kv_str(ctx, gguf_find_key(ctx, key), out);
}

bool gguf_get_arr(const gguf_ctx *ctx, const char *key, gguf_arr *out) {
    return gguf_kv_arr(ctx, gguf_find_key(ctx, key), out);
}

/* ---- array elements --------------------------------------------------------- */

static scalar arr_scalar(const gguf_arr *arr, uint64_t i) {
    scalar none = {false, false, false, 0, 0, 0};
    size_t sz = vtype_size(arr->type);
    if (!sz || i >= arr->n) return none;
    return decode_scalar(arr->type, (const uint8_t *)arr->data + i * sz);
}

bool gguf_arr_int(const gguf_arr *arr, uint64_t i, int64_t *out) { return scalar_int(arr_scalar(arr, i), out); }

bool gguf_arr_float(const gguf_arr *arr, uint64_t i, double *out) {
    return scalar_float(arr_scalar(arr, i), arr->type, out);
}

bool gguf_arr_str(const gguf_arr *arr, uint64_t i, gguf_str *out) {
    if (arr->type != GGUF_STRING || i >= arr->n || !arr->index) return false;
    const uint8_t *p = (const uint8_t *)arr->data + ((const uint64_t *)arr->index)[i];
    if (out) {
        out->len = rd64(p);
        out->ptr = (const char *)p + 8;
    }
    return true;
}

bool gguf_arr_arr(const gguf_arr *arr, uint64_t i, gguf_arr *out) {
    if (arr->type != GGUF_ARRAY || i >= arr->n || !arr->index) return false;
    if (out) *out = ((const gguf_arr *)arr->index)[i];
    return true;
}

/* ---- tensors ------------------------------------------------------------------- */

int64_t gguf_n_tensors(const gguf_ctx *ctx) { return ctx->n_tensors; }

const gguf_tensor *gguf_tensor_at(const gguf_ctx *ctx, int64_t i) {
    return i >= 0 && i < ctx->n_tensors ? &ctx->tensors[i] : NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_ctx *ctx, const char *name) {
    if (!name || !ctx->t_hash) return NULL;
    uint64_t s = hash_slot(ctx, ctx->t_hash, ctx->t_hmask, tensor_name, name, strlen(name));
    return ctx->t_hash[s] ? &ctx->tensors[ctx->t_hash[s] - 1] : NULL;
}

/* ---- writer ----------------------------------------------------------------- */

typedef struct {
    char *key; /* NUL-terminated copy */
    uint32_t type;
    uint8_t *val; /* (len) serialized value, type tag excluded */
    size_t len;
} wkv;

typedef struct {
    char *name;
    uint32_t n_dims, type;
    uint64_t ne[GGUF_MAX_DIMS];
    const void *data; /* caller's, valid until gguf_writer_write returns */
    uint64_t nbytes;
    uint64_t offset; /* assigned by gguf_writer_write */
} wtensor;

struct gguf_writer {
    wkv *kv; /* (n_kv of cap_kv) in insertion order */
    size_t n_kv, cap_kv;
    wtensor *t; /* (n_t of cap_t) in insertion order */
    size_t n_t, cap_t;
    bool failed; /* a set/add call failed: write refuses, with msg */
    char msg[LM_ERRLEN];
};

gguf_writer *gguf_writer_new(void) { return lm_calloc(1, sizeof(gguf_writer)); }

void gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        lm_free(w->kv[i].key);
        lm_free(w->kv[i].val);
    }
    for (size_t i = 0; i < w->n_t; i++) lm_free(w->t[i].name);
    lm_free(w->kv);
    lm_free(w->t);
    lm_free(w);
}

/* Record the first failure; always returns -1. */
static int wfail(gguf_writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int wfail(gguf_writer *w, const char *fmt, ...) {
    if (!w->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->msg, sizeof w->msg, fmt, ap);
        va_end(ap);
        w->failed = true;
    }
    return -1;
}

static int64_t wfind(const gguf_writer *w, const char *key) {
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) return (int64_t)i;
    return -1;
}

/* Take ownership of val (len bytes, lm_malloc'ed) as key's value. */
static int wset(gguf_writer *w, const char *key, uint32_t type, uint8_t *val, size_t len) {
    if (!key || !key[0] || strlen(key) > GGUF_MAX_KEY) {
        lm_free(val);
        return wfail(w, "%s key", !key ? "NULL" : !key[0] ? "empty" : "over-long (more than 65535 bytes)");
    }
    int64_t i = wfind(w, key);
    if (i >= 0) {
        lm_free(w->kv[i].val);
        w->kv[i].type = type;
        w->kv[i].val = val;
        w->kv[i].len = len;
        return 0;
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? w->cap_kv * 2 : 16;
        wkv *nk = lm_realloc(w->kv, cap * sizeof(wkv));
        if (!nk) {
            lm_free(val);
            return wfail(w, "out of memory adding key '%s'", key);
        }
        w->kv = nk;
        w->cap_kv = cap;
    }
    char *k = lm_strndup(key, strlen(key));
    if (!k) {
        lm_free(val);
        return wfail(w, "out of memory adding key '%s'", key);
    }
    w->kv[w->n_kv++] = (wkv){k, type, val, len};
    return 0;
}

static int wset_bytes(gguf_writer *w, const char *key, uint32_t type, const void *src, size_t len) {
    uint8_t *val = lm_malloc(len);
    if (!val) return wfail(w, "out of memory setting '%s'", key ? key : "(null)");
    memcpy(val, src, len);
    return wset(w, key, type, val, len);
}

int gguf_w_set_u16(gguf_writer *w, const char *key, uint16_t v) { return wset_bytes(w, key, GGUF_UINT16, &v, 2); }
int gguf_w_set_u32(gguf_writer *w, const char *key, uint32_t v) { return wset_bytes(w, key, GGUF_UINT32, &v, 4); }
int gguf_w_set_i32(gguf_writer *w, const char *key, int32_t v) { return wset_bytes(w, key, GGUF_INT32, &v, 4); }
int gguf_w_set_u64(gguf_writer *w, const char *key, uint64_t v) { return wset_bytes(w, key, GGUF_UINT64, &v, 8); }
int gguf_w_set_f32(gguf_writer *w, const char *key, float v) { return wset_bytes(w, key, GGUF_FLOAT32, &v, 4); }

int gguf_w_set_bool(gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    return wset_bytes(w, key, GGUF_BOOL, &b, 1);
}

int gguf_w_set_str(gguf_writer *w, const char *key, const char *v) {
    if (!v) return wfail(w, "'%s': NULL string", key ? key : "(null)");
    uint64_t n = strlen(v);
    uint8_t *val = lm_malloc(8 + n);
    if (!val) return wfail(w, "out of memory setting '%s'", key ? key : "(null)");
    memcpy(val, &n, 8);
    memcpy(val + 8, v, n);
    return wset(w, key, GGUF_STRING, val, 8 + n);
}

int gguf_w_set_arr(gguf_writer *w, const char *key, enum gguf_vtype type, const void *data, uint64_t n) {
    const char *k = key ? key : "(null)";
    size_t esz = vtype_size(type);
    if (!esz)
        return wfail(w, "'%s': gguf_w_set_arr takes a numeric or bool element type, not %s", k, gguf_vtype_name(type));
    uint64_t bytes, total;
    if (!lm_mul_u64(n, esz, &bytes) || !lm_add_u64(bytes, 12, &total) || total > SIZE_MAX / 2 || (n && !data))
        return wfail(w, "'%s': bad array of %" PRIu64 " elements", k, n);
    uint8_t *val = lm_malloc((size_t)total);
    if (!val) return wfail(w, "out of memory setting '%s'", k);
    uint32_t t = (uint32_t)type;
    memcpy(val, &t, 4);
    memcpy(val + 4, &n, 8);
    if (bytes) memcpy(val + 12, data, (size_t)bytes);
    if (type == GGUF_BOOL) /* the reader accepts only 0 and 1 */
        for (uint64_t i = 0; i < n; i++) val[12 + i] = val[12 + i] != 0;
    return wset(w, key, GGUF_ARRAY, val, (size_t)total);
}

int gguf_w_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n) {
    const char *k = key ? key : "(null)";
    if (n && !strs) return wfail(w, "'%s': NULL string array", k);
    uint64_t total = 12;
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i]) return wfail(w, "'%s': element %" PRIu64 " is NULL", k, i);
        if (!lm_add_u64(total, 8 + (uint64_t)strlen(strs[i]), &total) || total > SIZE_MAX / 2)
            return wfail(w, "'%s': string array too large", k);
    }
    uint8_t *val = lm_malloc((size_t)total);
    if (!val) return wfail(w, "out of memory setting '%s'", k);
    uint8_t *p = val + 12;
    uint32_t t = GGUF_STRING;
    memcpy(val, &t, 4);
    memcpy(val + 4, &n, 8);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = strlen(strs[i]);
        memcpy(p, &len, 8);
        memcpy(p + 8, strs[i], len);
        p += 8 + len;
    }
    return wset(w, key, GGUF_ARRAY, val, (size_t)total);
}

int gguf_w_copy_kv(gguf_writer *w, const gguf_ctx *src, int64_t i) {
    if (!src || i < 0 || i >= src->n_kv) return wfail(w, "copy of kv %" PRId64 ": no such kv", i);
    const kv_entry *e = &src->kv[i];
    char *key = lm_strndup(e->key.ptr, (size_t)e->key.len); /* keys hold no NUL: checked on open */
    if (!key) return wfail(w, "out of memory copying kv %" PRId64, i);
    int rc = wset_bytes(w, key, e->type, e->val, (size_t)e->val_len);
    lm_free(key);
    return rc;
}

int gguf_w_remove_kv(gguf_writer *w, const char *key) {
    int64_t i = key ? wfind(w, key) : -1;
    if (i < 0) return -1; /* not sticky: removing an absent key harms no file */
    lm_free(w->kv[i].key);
    lm_free(w->kv[i].val);
    memmove(&w->kv[i], &w->kv[i + 1], (w->n_kv - (size_t)i - 1) * sizeof(wkv));
    w->n_kv--;
    return 0;
}

/* Byte size implied by type and shape, 0 when the shape is invalid. */
static uint64_t tensor_bytes(uint32_t type, uint32_t n_dims, const uint64_t *ne) {
    const lm_type_traits *tr = quant_traits(type);
    if (!tr || n_dims < 1 || n_dims > GGUF_MAX_DIMS || !ne) return 0;
    uint64_t nel = 1, rows = 1, row;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] == 0 || !lm_mul_u64(nel, ne[d], &nel) || nel > (uint64_t)INT64_MAX) return 0;
        if (d > 0) rows *= ne[d]; /* <= nel: cannot overflow */
    }
    if (ne[0] % (uint64_t)tr->blck) return 0;
    if (!lm_mul_u64(ne[0] / (uint64_t)tr->blck, tr->type_size, &row) || !lm_mul_u64(row, rows, &row)) return 0;
    return row;
}

int gguf_w_add_tensor(gguf_writer *w, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                      const void *data, uint64_t nbytes) {
    size_t len = name ? strlen(name) : 0;
    if (len == 0 || len > GGUF_MAX_NAME)
        return wfail(w, "tensor name '%s' is empty or longer than %d bytes", name ? name : "(null)", GGUF_MAX_NAME);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0) return wfail(w, "tensor '%s' added twice", name);
    if (!quant_traits(type)) return wfail(w, "tensor '%s': unknown ggml type %u", name, type);
    uint64_t want = tensor_bytes(type, n_dims, ne);
    if (want == 0)
        return wfail(w, "tensor '%s': bad shape for %s (n_dims %u, dims must be >= 1, ne[0] a multiple of the block)",
                     name, quant_type_name(type), n_dims);
    if (nbytes != want)
        return wfail(w, "tensor '%s': %" PRIu64 " bytes given, %s shape needs %" PRIu64, name, nbytes,
                     quant_type_name(type), want);
    if (!data) return wfail(w, "tensor '%s': NULL data", name);
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? w->cap_t * 2 : 16;
        wtensor *nt = lm_realloc(w->t, cap * sizeof(wtensor));
        if (!nt) return wfail(w, "out of memory adding tensor '%s'", name);
        w->t = nt;
        w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    t->name = lm_strndup(name, len);
    if (!t->name) return wfail(w, "out of memory adding tensor '%s'", name);
    t->n_dims = n_dims;
    t->type = type;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->data = data;
    t->nbytes = nbytes;
    w->n_t++;
    return 0;
}

static bool put(safefile *f, const void *p, size_t n) { return safefile_write(f, p, n) == 0; }
static bool put_u32(safefile *f, uint32_t v) { return put(f, &v, 4); }
static bool put_u64(safefile *f, uint64_t v) { return put(f, &v, 8); }
static bool put_str(safefile *f, const char *s) {
    size_t n = strlen(s);
    return put_u64(f, n) && put(f, s, n);
}

static bool put_zeros(safefile *f, uint64_t n) {
    static const uint8_t zeros[256];
    while (n) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        if (!put(f, zeros, k)) return false;
        n -= k;
    }
    return true;
}

/* Alignment from general.alignment (validated as the reader would). */
static int writer_alignment(gguf_writer *w, uint32_t *align, char *err, size_t errlen) {
    *align = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = wfind(w, "general.alignment");
    if (i < 0) return 0;
    if (w->kv[i].type != GGUF_UINT32)
        return lm_err(err, errlen, "general.alignment has type %s, expected uint32", gguf_vtype_name(w->kv[i].type));
    uint32_t a = rd32(w->kv[i].val);
    if (!is_pow2(a)) return lm_err(err, errlen, "general.alignment %u is not a non-zero power of two", a);
    *align = a;
    return 0;
}

/* Header, kvs, tensor infos, padding, data; offsets assigned beforehand. */
static bool write_body(gguf_writer *w, safefile *f, uint32_t align) {
    uint64_t pos = 24;
    if (!put(f, GGUF_MAGIC, 4) || !put_u32(f, 3) || !put_u64(f, w->n_t) || !put_u64(f, w->n_kv)) return false;
    for (size_t i = 0; i < w->n_kv; i++) {
        if (!put_str(f, w->kv[i].key) || !put_u32(f, w->kv[i].type) || !put(f, w->kv[i].val, w->kv[i].len))
            return false;
        pos += 8 + strlen(w->kv[i].key) + 4 + w->kv[i].len;
    }
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        if (!put_str(f, t->name) || !put_u32(f, t->n_dims)) return false;
        for (uint32_t d = 0; d < t->n_dims; d++)
            if (!put_u64(f, t->ne[d])) return false;
        if (!put_u32(f, t->type) || !put_u64(f, t->offset)) return false;
        pos += 8 + strlen(t->name) + 4 + 8 * (uint64_t)t->n_dims + 4 + 8;
    }
    uint64_t data_off, end = 0;
    if (!align_up(pos, align, &data_off) || !put_zeros(f, data_off - pos)) return false;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        if (!put_zeros(f, t->offset - end)) return false;
        if (!put(f, t->data, (size_t)t->nbytes)) return false;
        end = t->offset + t->nbytes;
    }
    uint64_t tail;
    return align_up(end, align, &tail) && put_zeros(f, tail - end);
}

int gguf_writer_write_file(gguf_writer *w, safefile *f, char *err, size_t errlen) {
    const char *path = safefile_path(f);
    if (w->failed) return lm_err(err, errlen, "%s: not written: %s", path, w->msg);
    uint32_t align;
    char msg[LM_ERRLEN];
    if (writer_alignment(w, &align, msg, sizeof msg)) return lm_err(err, errlen, "%s: %s", path, msg);
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        wtensor *t = &w->t[i];
        uint64_t want = tensor_bytes(t->type, t->n_dims, t->ne);
        if (want != t->nbytes)
            return lm_err(err, errlen, "%s: tensor '%s': %" PRIu64 " bytes given, shape needs %" PRIu64, path, t->name,
                          t->nbytes, want);
        t->offset = off;
        if (!lm_add_u64(off, t->nbytes, &off) || !align_up(off, align, &off))
            return lm_err(err, errlen, "%s: data section size overflows", path);
    }
    if (!write_body(w, f, align)) return lm_err(err, errlen, "%s: write failed: %s", path, strerror(errno));
    return 0;
}

int gguf_writer_write(gguf_writer *w, const char *path, char *err, size_t errlen) {
    safefile *f = safefile_create(path, err, errlen);
    if (!f) return -1;
    if (gguf_writer_write_file(w, f, err, errlen)) {
        safefile_abort(f);
        return -1;
    }
    return safefile_commit(f, err, errlen);
}
