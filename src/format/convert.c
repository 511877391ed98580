/*
 * convert.c - llama2.c checkpoint + tokenizer -> GGUF (see convert.h for the
 * formats and the conventions of the output).
 *
 * Flow: map the checkpoint, validate its header and its exact length; map
 * the tokenizer and walk it twice (first to validate every record and size
 * the converted strings, then to fill one string slab); hand the writer
 * pointers into the checkpoint mapping for every tensor; write; unmap.
 *
 * Bounds: the header's numbers are only trusted after the byte count they
 * imply (computed in uint64 with overflow checks) equals the file size, and
 * nothing is allocated before that. The allocations afterwards are
 * proportional to vocab_size (which the checkpoint's own length bounds) and
 * to the tokenizer file's length.
 */
#include "format/convert.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/gguf.h"
#include "format/quant.h"
#include "base/safefile.h"
#include "base/util.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "convert.c assumes a little-endian host, as llama2.c files and GGUF are"
#endif

#define HEADER_BYTES 28 /* 7 x int32 */

/* llama.cpp token types, as tokenizer.ggml.token_type stores them */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_BYTE = 6 };

typedef struct {
    int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
} l2c_config;

typedef struct {
    const uint8_t *data; /* read-only mapping, NULL for an empty file */
    size_t size;
    dev_t dev;
    ino_t ino;
} mapped;

/* Offsets (in floats, after the header) of the arrays of the checkpoint. */
typedef struct {
    uint64_t emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, wcls, total;
    uint64_t kv_dim, head_size, vocab;
    bool shared;
} l2c_layout;

static int map_file(const char *path, const char *what, mapped *m, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO must not block the open */
    if (fd < 0) return lm_err(err, errlen, "%s %s: cannot open: %s", what, path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return lm_err(err, errlen, "%s %s: cannot stat: %s", what, path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return lm_err(err, errlen, "%s %s: not a regular file", what, path);
    }
    safefile_note_input(path);
    m->dev = st.st_dev;
    m->ino = st.st_ino;
    m->size = (size_t)st.st_size;
    if (m->size > 0) {
        void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return lm_err(err, errlen, "%s %s: cannot map: %s", what, path, strerror(e));
        }
        m->data = p;
    }
    close(fd); /* the mapping stays valid */
    return 0;
}

static void unmap_file(mapped *m) {
    if (m->data) munmap((void *)m->data, m->size);
    m->data = NULL;
}

static int32_t rd_i32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Running offset: *off += a * b * c floats, false on overflow. */
static bool take(uint64_t *off, uint64_t *at, uint64_t a, uint64_t b, uint64_t c) {
    uint64_t n;
    *at = *off;
    return lm_mul_u64(a, b, &n) && lm_mul_u64(n, c, &n) && lm_add_u64(*off, n, off);
}

/* Check the header's numbers for consistency and the file for the exact
 * length they imply; fill the array offsets. */
static int check_checkpoint(const char *path, const mapped *m, l2c_config *c, l2c_layout *lo, char *err,
                            size_t errlen) {
    if (m->size >= 4 && memcmp(m->data, "ak42", 4) == 0)
        return lm_err(err, errlen,
                      "checkpoint %s: a versioned llama2.c export (magic \"ak42\"); only the "
                      "legacy version 0 format is supported",
                      path);
    if (m->size < HEADER_BYTES)
        return lm_err(err, errlen, "checkpoint %s: %zu bytes, too short for the 28-byte header", path, m->size);
    int32_t h[7];
    for (int i = 0; i < 7; i++) h[i] = rd_i32(m->data + 4 * i);
    *c = (l2c_config){h[0], h[1], h[2], h[3], h[4], h[5], h[6]};
    if (c->dim <= 0 || c->hidden_dim <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
        c->seq_len <= 0 || c->vocab_size == 0 || c->vocab_size == INT32_MIN)
        return lm_err(err, errlen,
                      "checkpoint %s: bad header (dim %d, hidden_dim %d, n_layers %d, n_heads %d, "
                      "n_kv_heads %d, vocab_size %d, seq_len %d): sizes must be positive",
                      path, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size, c->seq_len);
    if (c->dim % c->n_heads != 0 || (c->dim / c->n_heads) % 2 != 0)
        return lm_err(err, errlen, "checkpoint %s: dim %d is not n_heads %d times an even head size", path, c->dim,
                      c->n_heads);
    if (c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads != 0)
        return lm_err(err, errlen, "checkpoint %s: n_heads %d is not a multiple of n_kv_heads %d", path, c->n_heads,
                      c->n_kv_heads);
    lo->shared = c->vocab_size > 0;
    lo->vocab = (uint64_t)(c->vocab_size > 0 ? (int64_t)c->vocab_size : -(int64_t)c->vocab_size);
    c->vocab_size = (int32_t)lo->vocab;
    lo->head_size = (uint64_t)(c->dim / c->n_heads);
    lo->kv_dim = (uint64_t)c->n_kv_heads * lo->head_size;
    const uint64_t d = (uint64_t)c->dim, hd = (uint64_t)c->hidden_dim, L = (uint64_t)c->n_layers;
    uint64_t off = 0, skip, bytes, want;
    bool ok = take(&off, &lo->emb, lo->vocab, d, 1) && take(&off, &lo->rms_att, L, d, 1) &&
        take(&off, &lo->wq, L, d, d) && take(&off, &lo->wk, L, d, lo->kv_dim) &&
        take(&off, &lo->wv, L, d, lo->kv_dim) && take(&off, &lo->wo, L, d, d) && take(&off, &lo->rms_ffn, L, d, 1) &&
        take(&off, &lo->w1, L, hd, d) && take(&off, &lo->w2, L, d, hd) && take(&off, &lo->w3, L, hd, d) &&
        take(&off, &lo->rms_final, d, 1, 1) &&
        take(&off, &skip, 2, (uint64_t)c->seq_len, lo->head_size / 2) && /* freq_cis_real, _imag */
        take(&off, &lo->wcls, lo->shared ? 0 : lo->vocab, d, 1) && lm_mul_u64(off, 4, &bytes) &&
        lm_add_u64(bytes, HEADER_BYTES, &want);
    if (!ok)
        return lm_err(err, errlen,
                      "checkpoint %s: header sizes overflow 64 bits (dim %d, hidden_dim %d, "
                      "n_layers %d, vocab_size %d)",
                      path, c->dim, c->hidden_dim, c->n_layers, c->vocab_size);
    lo->total = off;
    if ((uint64_t)m->size < want)
        return lm_err(err, errlen,
                      "checkpoint %s: truncated: the header (dim %d, hidden_dim %d, n_layers %d, "
                      "vocab_size %d, %s classifier) implies %" PRIu64 " bytes, the file has %zu",
                      path, c->dim, c->hidden_dim, c->n_layers, c->vocab_size, lo->shared ? "tied" : "separate", want,
                      m->size);
    if ((uint64_t)m->size > want)
        return lm_err(err, errlen,
                      "checkpoint %s: %" PRIu64 " bytes past the %" PRIu64 " the header implies: "
                      "not a legacy llama2.c checkpoint with these dimensions",
                      path, (uint64_t)m->size - want, want);
    return 0;
}

/* ---- tokenizer -------------------------------------------------------------- */

typedef struct {
    char **text; /* (vocab) NUL-terminated, into slab */
    char *slab;
    float *scores;  /* (vocab) */
    int32_t *types; /* (vocab) */
} l2c_vocab;

static void vocab_free(l2c_vocab *v) {
    lm_free(v->text);
    lm_free(v->slab);
    lm_free(v->scores);
    lm_free(v->types);
    memset(v, 0, sizeof *v);
}

static bool is_byte_piece(const uint8_t *s, int32_t len) {
    static const char hex[] = "0123456789ABCDEFabcdef";
    return len == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' && s[3] && s[4] && strchr(hex, s[3]) &&
        strchr(hex, s[4]);
}

/* The GGUF text and type of token id whose llama2.c piece is s[0..len). */
static const char *special_text(int32_t id) { return id == 0 ? "<unk>" : id == 1 ? "<s>" : id == 2 ? "</s>" : NULL; }

static int32_t token_type(int32_t id, const uint8_t *s, int32_t len) {
    if (id == 0) return TT_UNKNOWN;
    if (id <= 2 || len == 0) return TT_CONTROL;
    return is_byte_piece(s, len) ? TT_BYTE : TT_NORMAL;
}

/* Converted length of a piece (spaces become the 3-byte U+2581), without NUL. */
static uint64_t converted_len(int32_t id, const uint8_t *s, int32_t len) {
    if (special_text(id)) return strlen(special_text(id));
    uint64_t n = (uint64_t)len;
    for (int32_t i = 0; i < len; i++) n += s[i] == ' ' ? 2 : 0;
    return n;
}

static char *write_piece(char *dst, int32_t id, const uint8_t *s, int32_t len) {
    const char *sp = special_text(id);
    if (sp) {
        size_t n = strlen(sp);
        memcpy(dst, sp, n);
        dst += n;
    } else {
        for (int32_t i = 0; i < len; i++) {
            if (s[i] == ' ') {
                memcpy(dst, "\xe2\x96\x81", 3);
                dst += 3;
            } else {
                *dst++ = (char)s[i];
            }
        }
    }
    *dst++ = 0;
    return dst;
}

/* Pass 1: check every record lies in the file and holds no NUL; total the
 * converted bytes (NULs included). */
static int scan_tokenizer(const char *path, const mapped *m, int32_t vocab, uint64_t *slab_bytes, char *err,
                          size_t errlen) {
    if (m->size < 4) return lm_err(err, errlen, "tokenizer %s: %zu bytes, too short for the header", path, m->size);
    int32_t max_len = rd_i32(m->data);
    if (max_len <= 0) return lm_err(err, errlen, "tokenizer %s: max_token_length %d is not positive", path, max_len);
    uint64_t pos = 4, total = 0;
    for (int32_t id = 0; id < vocab; id++) {
        if (m->size - pos < 8)
            return lm_err(err, errlen, "tokenizer %s: truncated at token %d of %d (offset %" PRIu64 ")", path, id,
                          vocab, pos);
        int32_t len = rd_i32(m->data + pos + 4);
        pos += 8;
        if (len < 0 || (uint64_t)len > m->size - pos)
            return lm_err(err, errlen, "tokenizer %s: token %d claims %d bytes, %" PRIu64 " are left", path, id, len,
                          (uint64_t)m->size - pos);
        if (memchr(m->data + pos, 0, (size_t)len))
            return lm_err(err, errlen, "tokenizer %s: token %d holds a NUL byte", path, id);
        total += converted_len(id, m->data + pos, len) + 1; /* < 3 x file size: no overflow */
        pos += (uint64_t)len;
    }
    if (pos != m->size)
        return lm_err(err, errlen,
                      "tokenizer %s: %" PRIu64 " bytes after the %d tokens the checkpoint's "
                      "vocab_size calls for (a tokenizer for another vocabulary?)",
                      path, (uint64_t)m->size - pos, vocab);
    *slab_bytes = total;
    return 0;
}

static int load_tokenizer(const char *path, const mapped *m, int32_t vocab, l2c_vocab *v, char *err, size_t errlen) {
    memset(v, 0, sizeof *v);
    if (vocab < 3)
        return lm_err(err, errlen, "vocab_size %d is too small: a llama2.c vocabulary starts with <unk>, <s>, </s>",
                      vocab);
    uint64_t slab_bytes = 0;
    if (scan_tokenizer(path, m, vocab, &slab_bytes, err, errlen)) return -1;
    v->text = lm_malloc((size_t)vocab * sizeof *v->text);
    v->slab = lm_malloc((size_t)slab_bytes);
    v->scores = lm_malloc((size_t)vocab * sizeof *v->scores);
    v->types = lm_malloc((size_t)vocab * sizeof *v->types);
    if (!v->text || !v->slab || !v->scores || !v->types) {
        vocab_free(v);
        return lm_err(err, errlen, "tokenizer %s: out of memory for %d tokens", path, vocab);
    }
    /* Pass 2: the records were all checked by pass 1. */
    uint64_t pos = 4;
    char *dst = v->slab;
    for (int32_t id = 0; id < vocab; id++) {
        memcpy(&v->scores[id], m->data + pos, 4); /* bit copy: -0.0 stays -0.0 */
        int32_t len = rd_i32(m->data + pos + 4);
        const uint8_t *s = m->data + pos + 8;
        v->types[id] = token_type(id, s, len);
        v->text[id] = dst;
        dst = write_piece(dst, id, s, len);
        pos += 8 + (uint64_t)len;
    }
    return 0;
}

/* ---- GGUF ------------------------------------------------------------------- */

static void set_metadata(gguf_writer *w, const l2c_config *c, const l2c_layout *lo, const l2c_vocab *v) {
    /* key order as llama.cpp's converter writes them */
    gguf_w_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->text, lo->vocab);
    gguf_w_set_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, v->scores, lo->vocab);
    gguf_w_set_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, v->types, lo->vocab);
    gguf_w_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_w_set_str(w, "general.architecture", "llama");
    gguf_w_set_str(w, "general.name", "llama");
    gguf_w_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    gguf_w_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_w_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    gguf_w_set_u32(w, "tokenizer.ggml.seperator_token_id", UINT32_MAX); /* (sic) llama.cpp's key; none */
    gguf_w_set_u32(w, "tokenizer.ggml.padding_token_id", UINT32_MAX);   /* none */
    gguf_w_set_u32(w, "llama.context_length", (uint32_t)c->seq_len);
    gguf_w_set_u32(w, "llama.embedding_length", (uint32_t)c->dim);
    gguf_w_set_u32(w, "llama.feed_forward_length", (uint32_t)c->hidden_dim);
    gguf_w_set_u32(w, "llama.attention.head_count", (uint32_t)c->n_heads);
    gguf_w_set_u32(w, "llama.attention.head_count_kv", (uint32_t)c->n_kv_heads);
    gguf_w_set_u32(w, "llama.block_count", (uint32_t)c->n_layers);
    gguf_w_set_u32(w, "llama.rope.dimension_count", (uint32_t)lo->head_size);
    gguf_w_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
}

/* One F32 tensor of ne0 x ne1 floats (ne1 == 0: one dimension) at float
 * offset off of the checkpoint's weights. */
static void add_f32(gguf_writer *w, const char *name, const float *base, uint64_t off, uint64_t ne0, uint64_t ne1) {
    uint64_t ne[2] = {ne0, ne1};
    uint64_t n = ne1 ? ne0 * ne1 : ne0; /* no overflow: within the checked file size */
    gguf_w_add_tensor(w, name, ne1 ? 2 : 1, ne, LM_TYPE_F32, base + off, n * 4);
}

static void add_tensors(gguf_writer *w, const l2c_config *c, const l2c_layout *lo, const float *base) {
    const uint64_t d = (uint64_t)c->dim, hd = (uint64_t)c->hidden_dim, kv = lo->kv_dim;
    add_f32(w, "token_embd.weight", base, lo->emb, d, lo->vocab);
    add_f32(w, "output_norm.weight", base, lo->rms_final, d, 0);
    add_f32(w, "output.weight", base, lo->shared ? lo->emb : lo->wcls, d, lo->vocab);
    char name[64];
    for (uint64_t l = 0; l < (uint64_t)c->n_layers; l++) {
#define BLK(suffix) (snprintf(name, sizeof name, "blk.%" PRIu64 ".%s.weight", l, suffix), name)
        add_f32(w, BLK("attn_q"), base, lo->wq + l * d * d, d, d);
        add_f32(w, BLK("attn_k"), base, lo->wk + l * d * kv, d, kv);
        add_f32(w, BLK("attn_v"), base, lo->wv + l * d * kv, d, kv);
        add_f32(w, BLK("attn_output"), base, lo->wo + l * d * d, d, d);
        add_f32(w, BLK("attn_norm"), base, lo->rms_att + l * d, d, 0);
        add_f32(w, BLK("ffn_gate"), base, lo->w1 + l * hd * d, d, hd);
        add_f32(w, BLK("ffn_down"), base, lo->w2 + l * d * hd, hd, d);
        add_f32(w, BLK("ffn_up"), base, lo->w3 + l * hd * d, d, hd);
        add_f32(w, BLK("ffn_norm"), base, lo->rms_ffn + l * d, d, 0);
#undef BLK
    }
}

/* Refuse to write over an input: the checkpoint is mapped while writing. */
static int check_output(const char *out, const mapped *a, const mapped *b, char *err, size_t errlen) {
    struct stat st;
    if (stat(out, &st) != 0) return 0; /* does not exist yet */
    if ((st.st_dev == a->dev && st.st_ino == a->ino) || (st.st_dev == b->dev && st.st_ino == b->ino))
        return lm_err(err, errlen, "output %s is one of the input files", out);
    return 0;
}

int convert_llama2c(const char *model_bin, const char *tokenizer_bin, const char *out_gguf, char *err, size_t errlen) {
    mapped ck = {0}, tk = {0};
    l2c_config c = {0};
    l2c_layout lo = {0};
    l2c_vocab v = {0};
    gguf_writer *w = NULL;
    safefile *f = NULL;
    int rc = -1;
    if (!model_bin || !tokenizer_bin || !out_gguf) return lm_err(err, errlen, "convert: NULL path");
    if (map_file(model_bin, "checkpoint", &ck, err, errlen)) goto done;
    if (check_checkpoint(model_bin, &ck, &c, &lo, err, errlen)) goto done;
    if (map_file(tokenizer_bin, "tokenizer", &tk, err, errlen)) goto done;
    if (load_tokenizer(tokenizer_bin, &tk, c.vocab_size, &v, err, errlen)) goto done;
    if (check_output(out_gguf, &ck, &tk, err, errlen)) goto done;
    if (!(f = safefile_create(out_gguf, err, errlen))) goto done;
    w = gguf_writer_new();
    if (!w) {
        lm_err(err, errlen, "convert: out of memory");
        goto done;
    }
    /* set/add failures are sticky in the writer and reported by write */
    set_metadata(w, &c, &lo, &v);
    add_tensors(w, &c, &lo, (const float *)(const void *)(ck.data + HEADER_BYTES));
    if (gguf_writer_write_file(w, f, err, errlen) == 0) {
        rc = safefile_commit(f, err, errlen);
        f = NULL; /* commit frees it, success or not */
    }
done:
    safefile_abort(f);
    gguf_writer_free(w);
    vocab_free(&v);
    unmap_file(&tk);
    unmap_file(&ck);
    return rc;
}
