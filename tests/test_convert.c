/*
 * test_convert.c - llama2.c import against the shipped reference GGUF.
 *
 * models/stories260K.gguf was converted from models/stories260K.bin +
 * models/tok512.bin by another tool. Converting the same inputs must give:
 * the same tensors (names, order, shapes, types, bytes), the same metadata
 * keys with the same types and values (tokens, scores bit for bit, token
 * types) except llama.context_length, which lamina takes from the
 * checkpoint's seq_len (512, the trained length) where the reference holds
 * its tool's default of 128. Then the error paths: truncated or padded
 * checkpoints and tokenizers, absurd headers (rejected before any
 * allocation: allocation failure is switched on while converting them),
 * versioned exports, writing over an input, allocation failure at every
 * allocation; and a synthetic checkpoint with a separate classifier and
 * pieces that exercise every token rule.
 */
#include "format/convert.h"

#include <inttypes.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/gguf.h"
#include "format/quant.h"
#include "test.h"
#include "base/util.h"

#define REF_GGUF "models/stories260K.gguf"
#define REF_BIN "models/stories260K.bin"
#define REF_TOK "models/tok512.bin"

static char path_buf[4][256];

/* A per-process temp path; slot picks one of a few buffers. */
static const char *tmp(int slot, const char *tag) {
    const char *dir = getenv("TMPDIR");
    snprintf(path_buf[slot], sizeof path_buf[slot], "%s/lamina_test_convert_%ld_%s", dir && *dir ? dir : "/tmp",
             (long)getpid(), tag);
    return path_buf[slot];
}

static uint8_t *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(n > 0 ? (size_t)n : 1);
    if (b && n > 0 && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return b;
}

static int write_all(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* ---- comparing two files ---------------------------------------------------- */

static bool float_bits_eq(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

/* Same type and value, arrays element by element (fixed-size elements as
 * raw bytes, so float bits are compared exactly). */
static bool kv_equal(const gguf_ctx *a, int64_t ia, const gguf_ctx *b, int64_t ib, char *why, size_t wl) {
    enum gguf_vtype t = gguf_kv_type(a, ia);
    if (t != gguf_kv_type(b, ib)) {
        snprintf(why, wl, "types %s vs %s", gguf_vtype_name(t), gguf_vtype_name(gguf_kv_type(b, ib)));
        return false;
    }
    if (t == GGUF_STRING) {
        gguf_str x, y;
        bool ok = gguf_kv_str(a, ia, &x) && gguf_kv_str(b, ib, &y) && x.len == y.len &&
            memcmp(x.ptr, y.ptr, (size_t)x.len) == 0;
        if (!ok) snprintf(why, wl, "strings differ");
        return ok;
    }
    if (t == GGUF_FLOAT32 || t == GGUF_FLOAT64) {
        double x, y;
        bool ok = gguf_kv_float(a, ia, &x) && gguf_kv_float(b, ib, &y) && float_bits_eq(x, y);
        if (!ok) snprintf(why, wl, "floats differ");
        return ok;
    }
    if (t != GGUF_ARRAY) {
        int64_t x, y;
        bool ok = gguf_kv_int(a, ia, &x) && gguf_kv_int(b, ib, &y) && x == y;
        if (!ok) snprintf(why, wl, "integers differ");
        return ok;
    }
    gguf_arr x, y;
    if (!gguf_kv_arr(a, ia, &x) || !gguf_kv_arr(b, ib, &y) || x.type != y.type || x.n != y.n) {
        snprintf(why, wl, "array types or lengths differ");
        return false;
    }
    for (uint64_t i = 0; i < x.n; i++) {
        if (x.type == GGUF_STRING) {
            gguf_str p = {"", 0}, q = {"", 0};
            if (!gguf_arr_str(&x, i, &p) || !gguf_arr_str(&y, i, &q) || p.len != q.len ||
                memcmp(p.ptr, q.ptr, (size_t)p.len) != 0) {
                snprintf(why, wl, "element %" PRIu64 ": '%.*s' vs '%.*s'", i, (int)p.len, p.ptr, (int)q.len, q.ptr);
                return false;
            }
        } else if (x.type == GGUF_FLOAT32 || x.type == GGUF_FLOAT64) {
            double p = 0, q = 0;
            if (!gguf_arr_float(&x, i, &p) || !gguf_arr_float(&y, i, &q) || !float_bits_eq(p, q)) {
                snprintf(why, wl, "element %" PRIu64 ": %g vs %g", i, p, q);
                return false;
            }
        } else {
            int64_t p = 0, q = 0;
            if (!gguf_arr_int(&x, i, &p) || !gguf_arr_int(&y, i, &q) || p != q) {
                snprintf(why, wl, "element %" PRIu64 ": %" PRId64 " vs %" PRId64, i, p, q);
                return false;
            }
        }
    }
    return true;
}

static int32_t bin_header(int i) {
    size_t n;
    uint8_t *b = read_all(REF_BIN, &n);
    int32_t v = -1;
    if (b && n >= 28) memcpy(&v, b + 4 * i, 4);
    free(b);
    return v;
}

/* ---- the shipped model -------------------------------------------------------- */

static void test_reference_tensors(void) {
    char err[LM_ERRLEN] = "";
    const char *out = tmp(0, "ref.gguf");
    CHECKF(convert_llama2c(REF_BIN, REF_TOK, out, err, sizeof err) == 0, "%s", err);
    gguf_ctx *ref = gguf_open(REF_GGUF, err, sizeof err);
    CHECKF(ref, "%s", err);
    gguf_ctx *got = gguf_open(out, err, sizeof err);
    if (!got) gguf_close(ref);
    CHECKF(got, "%s", err);
    int64_t n = gguf_n_tensors(ref);
    bool ok = n == gguf_n_tensors(got) && n == 48;
    char why[512] = "";
    if (!ok) snprintf(why, sizeof why, "%" PRId64 " tensors vs %" PRId64, n, gguf_n_tensors(got));
    for (int64_t i = 0; ok && i < n; i++) {
        const gguf_tensor *r = gguf_tensor_at(ref, i), *g = gguf_find_tensor(got, r->name);
        const gguf_tensor *same_place = gguf_tensor_at(got, i);
        if (!g) {
            snprintf(why, sizeof why, "%s missing", r->name);
            ok = false;
            break;
        }
        ok = g == same_place && r->n_dims == g->n_dims && r->type == g->type && r->type == LM_TYPE_F32 &&
            r->nbytes == g->nbytes && memcmp(r->ne, g->ne, sizeof r->ne) == 0 &&
            memcmp(r->data, g->data, (size_t)r->nbytes) == 0;
        if (!ok) snprintf(why, sizeof why, "%s differs (place, shape, type or bytes)", r->name);
    }
    /* the check can fail: a tensor that is not the same must be told apart */
    const gguf_tensor *q0 = gguf_find_tensor(got, "blk.0.attn_q.weight");
    const gguf_tensor *k0 = gguf_find_tensor(ref, "blk.0.attn_k.weight");
    bool differs = q0 && k0 && memcmp(q0->data, k0->data, (size_t)k0->nbytes) != 0;
    gguf_close(got);
    gguf_close(ref);
    remove(out);
    CHECKF(ok, "%s", why);
    CHECK(differs);
}

static void test_reference_metadata(void) {
    char err[LM_ERRLEN] = "";
    const char *out = tmp(0, "meta.gguf");
    CHECKF(convert_llama2c(REF_BIN, REF_TOK, out, err, sizeof err) == 0, "%s", err);
    gguf_ctx *ref = gguf_open(REF_GGUF, err, sizeof err);
    CHECKF(ref, "%s", err);
    gguf_ctx *got = gguf_open(out, err, sizeof err);
    if (!got) gguf_close(ref);
    CHECKF(got, "%s", err);
    char why[600] = "";
    bool ok = gguf_n_kv(ref) == gguf_n_kv(got);
    if (!ok) snprintf(why, sizeof why, "%" PRId64 " keys vs %" PRId64, gguf_n_kv(ref), gguf_n_kv(got));
    int compared = 0;
    for (int64_t i = 0; ok && i < gguf_n_kv(ref); i++) {
        gguf_str k = gguf_kv_key(ref, i);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)k.len, k.ptr);
        int64_t j = gguf_find_key(got, key);
        if (j < 0) {
            snprintf(why, sizeof why, "key %s missing", key);
            ok = false;
            break;
        }
        if (strcmp(key, "llama.context_length") == 0) continue; /* below */
        char w2[400] = "";
        if (!kv_equal(ref, i, got, j, w2, sizeof w2)) {
            snprintf(why, sizeof why, "%s: %s", key, w2);
            ok = false;
        }
        compared++;
    }
    int64_t ctx_got = 0, ctx_ref = 0, n_tok = 0;
    gguf_arr toks;
    bool have = gguf_get_int(got, "llama.context_length", &ctx_got) &&
        gguf_get_int(ref, "llama.context_length", &ctx_ref) && gguf_get_arr(got, "tokenizer.ggml.tokens", &toks);
    if (have) n_tok = (int64_t)toks.n;
    gguf_close(got);
    gguf_close(ref);
    remove(out);
    CHECKF(ok, "%s", why);
    CHECKF(compared == 18, "%d keys compared", compared);
    CHECK(have);
    CHECK(n_tok == 512);
    /* the checkpoint says 512, the reference tool wrote its default 128 */
    CHECKF(ctx_got == bin_header(6) && ctx_got == 512, "context_length %" PRId64, ctx_got);
    CHECK(ctx_ref == 128);
}

/* The checks above can fail: a metadata value that differs is reported. */
static void test_compare_can_fail(void) {
    char err[LM_ERRLEN] = "", why[400] = "";
    gguf_ctx *ref = gguf_open(REF_GGUF, err, sizeof err);
    CHECKF(ref, "%s", err);
    int64_t a = gguf_find_key(ref, "llama.embedding_length"), b = gguf_find_key(ref, "llama.block_count");
    int64_t s = gguf_find_key(ref, "tokenizer.ggml.scores"), t = gguf_find_key(ref, "tokenizer.ggml.token_type");
    bool ne1 = a >= 0 && b >= 0 && !kv_equal(ref, a, ref, b, why, sizeof why);
    bool ne2 = s >= 0 && t >= 0 && !kv_equal(ref, s, ref, t, why, sizeof why);
    bool eq = s >= 0 && kv_equal(ref, s, ref, s, why, sizeof why);
    gguf_close(ref);
    CHECK(ne1 && ne2 && eq);
}

/* ---- bad inputs ------------------------------------------------------------------- */

/* Convert and expect failure with a message containing `needle`, and no
 * output file. */
static bool fails_with(const char *model, const char *tok, const char *needle, char *err, size_t errlen) {
    const char *out = tmp(3, "bad_out.gguf");
    remove(out);
    err[0] = 0;
    int rc = convert_llama2c(model, tok, out, err, errlen);
    bool ok = rc == -1 && strstr(err, needle) != NULL && !exists(out);
    if (!ok) fprintf(stderr, "  rc %d, message: %s (wanted '%s')\n", rc, err, needle);
    remove(out);
    return ok;
}

static void test_truncated_checkpoint(void) {
    size_t n;
    uint8_t *b = read_all(REF_BIN, &n);
    CHECK(b && n > 1000);
    const char *p = tmp(1, "trunc.bin");
    char err[LM_ERRLEN];
    const size_t cuts[] = {n - 1, n - 4, n / 2, 29, 28};
    bool ok = true;
    for (size_t i = 0; ok && i < sizeof cuts / sizeof cuts[0]; i++)
        ok = write_all(p, b, cuts[i]) && fails_with(p, REF_TOK, "truncated", err, sizeof err);
    ok = ok && write_all(p, b, 27) && fails_with(p, REF_TOK, "too short", err, sizeof err);
    ok = ok && write_all(p, b, 0) && fails_with(p, REF_TOK, "too short", err, sizeof err);
    /* bytes past the end: a mismatch, not silently ignored */
    uint8_t *longer = malloc(n + 4);
    if (longer) {
        memcpy(longer, b, n);
        memset(longer + n, 0, 4);
        ok = ok && write_all(p, longer, n + 4) && fails_with(p, REF_TOK, "past the", err, sizeof err);
    }
    free(longer);
    free(b);
    ok = ok && fails_with("models/no_such_file.bin", REF_TOK, "cannot open", err, sizeof err);
    ok = ok && fails_with("models", REF_TOK, "not a regular file", err, sizeof err);
    remove(p);
    CHECK(ok);
}

static void test_truncated_tokenizer(void) {
    size_t n;
    uint8_t *b = read_all(REF_TOK, &n);
    CHECK(b && n > 100);
    const char *p = tmp(1, "trunc_tok.bin");
    char err[LM_ERRLEN];
    bool ok = true;
    /* cut inside a record header and inside a piece, at the very end */
    const size_t cuts[] = {n - 1, n - 3, n / 2, 9, 5};
    for (size_t i = 0; ok && i < sizeof cuts / sizeof cuts[0]; i++) {
        ok = write_all(p, b, cuts[i]) && fails_with(REF_BIN, p, "tokenizer", err, sizeof err) &&
            (strstr(err, "truncated") || strstr(err, "claims"));
        if (!ok) fprintf(stderr, "  cut %zu: %s\n", cuts[i], err);
    }
    ok = ok && write_all(p, b, 4) && fails_with(REF_BIN, p, "truncated at token 0", err, sizeof err);
    ok = ok && write_all(p, b, 2) && fails_with(REF_BIN, p, "too short", err, sizeof err);
    /* an extra byte: more tokens than the checkpoint's vocabulary */
    uint8_t *c = malloc(n + 1);
    CHECK(c);
    memcpy(c, b, n);
    c[n] = 'x';
    ok = ok && write_all(p, c, n + 1) && fails_with(REF_BIN, p, "after the 512 tokens", err, sizeof err);
    /* a negative length, a huge length, a NUL inside a piece */
    int32_t v = -5;
    memcpy(c, b, n);
    memcpy(c + 4 + 4, &v, 4); /* token 0's len */
    ok = ok && write_all(p, c, n) && fails_with(REF_BIN, p, "token 0 claims -5 bytes", err, sizeof err);
    v = INT32_MAX;
    memcpy(c + 4 + 4, &v, 4);
    ok = ok && write_all(p, c, n) && fails_with(REF_BIN, p, "token 0 claims", err, sizeof err);
    memcpy(c, b, n);
    c[4 + 8 + 1] = 0; /* inside "<unk>" */
    ok = ok && write_all(p, c, n) && fails_with(REF_BIN, p, "NUL", err, sizeof err);
    memcpy(c, b, n);
    v = 0;
    memcpy(c, &v, 4);
    ok = ok && write_all(p, c, n) && fails_with(REF_BIN, p, "max_token_length", err, sizeof err);
    free(c);
    free(b);
    remove(p);
    CHECK(ok);
}

/* Headers that claim absurd sizes fail on the size check, before the
 * converter allocates anything (allocation is made to fail throughout, so a
 * premature allocation would show as "out of memory" instead). */
static void test_absurd_header(void) {
    const int32_t cases[][7] = {
        {1 << 30, 1 << 30, 1 << 30, 1 << 10, 1 << 10, 1 << 30, 1 << 30}, /* 2^90 floats: overflows */
        {1 << 20, 1 << 20, 1 << 10, 1 << 10, 1 << 10, 1 << 20, 1 << 20}, /* 2^52 floats: fits, far too big */
        {INT32_MAX - 1, INT32_MAX, INT32_MAX, 2, 2, INT32_MAX, INT32_MAX},
        {4096, 11008, 32, 32, 32, 32000, 2048}, /* a real 7B header, no weights */
        {64, 172, 5, 8, 4, -(1 << 30), 512},    /* separate classifier, huge */
    };
    const char *needles[] = {"overflow", "truncated", "", "truncated", "truncated"};
    const int32_t bad[][7] = {
        {0, 172, 5, 8, 4, 512, 512},        {64, -1, 5, 8, 4, 512, 512},   {64, 172, 5, 8, 4, 0, 512},
        {64, 172, 5, 8, 4, INT32_MIN, 512}, {64, 172, 5, 7, 7, 512, 512},                                  /* 64 % 7 */
        {64, 172, 5, 8, 3, 512, 512},       {64, 172, 5, 8, 16, 512, 512}, {64, 172, 5, 64, 64, 512, 512}, /* hs 1 */
        {64, 172, 5, 8, 4, 512, 0},
    };
    const char *p = tmp(1, "absurd.bin");
    char err[LM_ERRLEN];
    bool ok = true;
    for (size_t i = 0; ok && i < sizeof cases / sizeof cases[0]; i++) {
        lm_alloc_fail_after(0);
        ok =
            write_all(p, cases[i], 28) && fails_with(p, REF_TOK, needles[i], err, sizeof err) && !strstr(err, "memory");
        lm_alloc_fail_after(-1);
        if (!ok) fprintf(stderr, "  case %zu: %s\n", i, err);
    }
    for (size_t i = 0; ok && i < sizeof bad / sizeof bad[0]; i++) {
        lm_alloc_fail_after(0);
        ok = write_all(p, bad[i], 28) && fails_with(p, REF_TOK, "checkpoint", err, sizeof err) &&
            !strstr(err, "memory") && !strstr(err, "truncated");
        lm_alloc_fail_after(-1);
        if (!ok) fprintf(stderr, "  bad %zu: %s\n", i, err);
    }
    /* a versioned export */
    const char magic[32] = "ak42\x02";
    ok = ok && write_all(p, magic, sizeof magic) && fails_with(p, REF_TOK, "legacy", err, sizeof err);
    remove(p);
    CHECK(ok);
}

static void test_output_is_input(void) {
    size_t n, m;
    uint8_t *b = read_all(REF_BIN, &n), *t = read_all(REF_TOK, &m);
    CHECK(b && t);
    const char *pb = tmp(1, "self.bin"), *pt = tmp(2, "self_tok.bin");
    bool ok = write_all(pb, b, n) && write_all(pt, t, m);
    char err[LM_ERRLEN] = "";
    ok = ok && convert_llama2c(pb, pt, pb, err, sizeof err) == -1 && strstr(err, "input");
    ok = ok && convert_llama2c(pb, pt, pt, err, sizeof err) == -1 && strstr(err, "input");
    size_t n2 = 0, m2 = 0;
    uint8_t *b2 = read_all(pb, &n2), *t2 = read_all(pt, &m2);
    ok = ok && b2 && t2 && n2 == n && m2 == m && memcmp(b, b2, n) == 0 && memcmp(t, t2, m) == 0;
    free(b);
    free(t);
    free(b2);
    free(t2);
    remove(pb);
    remove(pt);
    CHECKF(ok, "%s", err);
}

/* Allocation failure at each allocation in turn: a clean error each time,
 * never a partial file, until enough allocations succeed. */
static void test_alloc_failure(void) {
    const char *out = tmp(0, "oom.gguf");
    char err[LM_ERRLEN];
    int failures = 0;
    bool done = false, clean = true;
    for (long k = 0; k < 1000 && !done; k++) {
        remove(out);
        err[0] = 0;
        lm_alloc_fail_after(k);
        int rc = convert_llama2c(REF_BIN, REF_TOK, out, err, sizeof err);
        lm_alloc_fail_after(-1);
        if (rc == 0) {
            done = true;
        } else {
            failures++;
            if (!err[0] || exists(out)) clean = false;
        }
    }
    printf("NOTE conversion failed cleanly at each of its first %d allocations\n", failures);
    gguf_ctx *g = done ? gguf_open(out, err, sizeof err) : NULL;
    bool valid = g && gguf_n_tensors(g) == 48;
    gguf_close(g);
    remove(out);
    CHECK(done);
    CHECKF(failures > 10, "only %d allocations", failures);
    CHECK(clean);
    CHECK(valid);
}

/* ---- a synthetic checkpoint ----------------------------------------------------- */

/* dim 8, hidden 12, 2 layers, 2 heads, 1 kv head, vocab 300 with a separate
 * classifier, seq_len 16; every float is its own index so misplaced data
 * shows. Pieces: <unk>, "\n<s>\n", "\n</s>\n", 256 "<0xXX>", then pieces with
 * spaces in several places, an empty piece and a "<0x4g>" look-alike. */
enum { SD = 8, SH = 12, SL = 2, SNH = 2, SNKV = 1, SV = 300, SSEQ = 16 };

static size_t synth_floats(void) {
    const size_t hs = SD / SNH, kvd = SNKV * hs;
    return (size_t)SV * SD + SL * SD + SL * SD * SD + 2 * SL * SD * kvd + SL * SD * SD + SL * SD +
        3 * (size_t)SL * SH * SD + SD + 2 * SSEQ * hs / 2 + (size_t)SV * SD;
}

static const char *synth_piece(int i, char *buf) {
    if (i == 0) return "<unk>";
    if (i == 1) return "\n<s>\n";
    if (i == 2) return "\n</s>\n";
    if (i < 259) {
        snprintf(buf, 16, "<0x%02X>", i - 3);
        return buf;
    }
    switch (i) {
        case 259: return " the";
        case 260: return "a b";
        case 261: return "  ";
        case 262: return "";
        case 263: return "<0x4g>";
        case 264: return "x ";
        default: snprintf(buf, 16, "t%d", i); return buf;
    }
}

static const char *synth_expect(int i, char *buf) {
    switch (i) {
        case 1: return "<s>";
        case 2: return "</s>";
        case 259: return "\xe2\x96\x81the";
        case 260:
            return "a\xe2\x96\x81"
                   "b";
        case 261: return "\xe2\x96\x81\xe2\x96\x81";
        case 264: return "x\xe2\x96\x81";
        default: return synth_piece(i, buf);
    }
}

static int synth_type(int i) {
    if (i == 0) return 2;
    if (i <= 2 || i == 262) return 3;
    if (i < 259) return 6;
    return 1;
}

static bool write_synth(const char *model, const char *tok) {
    size_t nf = synth_floats();
    int32_t h[7] = {SD, SH, SL, SNH, SNKV, -SV, SSEQ};
    float *w = malloc(nf * sizeof(float));
    if (!w) return false;
    for (size_t i = 0; i < nf; i++) w[i] = (float)i;
    FILE *f = fopen(model, "wb");
    bool ok = f && fwrite(h, 4, 7, f) == 7 && fwrite(w, 4, nf, f) == nf;
    if (f) ok = fclose(f) == 0 && ok;
    free(w);
    f = fopen(tok, "wb");
    int32_t maxlen = 7;
    ok = ok && f && fwrite(&maxlen, 4, 1, f) == 1;
    for (int i = 0; ok && i < SV; i++) {
        char buf[16];
        const char *s = synth_piece(i, buf);
        float score = -(float)i * 0.5f;
        int32_t len = (int32_t)strlen(s);
        ok = fwrite(&score, 4, 1, f) == 1 && fwrite(&len, 4, 1, f) == 1 && fwrite(s, 1, (size_t)len, f) == (size_t)len;
    }
    if (f) ok = fclose(f) == 0 && ok;
    return ok;
}

/* Float offset, in the synthetic checkpoint, of the start of a tensor. */
static bool tensor_starts_at(const gguf_ctx *g, const char *name, size_t off, uint64_t ne0, uint64_t ne1) {
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t || t->ne[0] != ne0 || t->ne[1] != ne1 || t->nbytes != ne0 * ne1 * 4) return false;
    for (uint64_t i = 0; i < ne0 * ne1; i++) {
        float v;
        memcpy(&v, (const uint8_t *)t->data + 4 * i, 4);
        if (v != (float)(off + i)) return false;
    }
    return true;
}

static void test_synthetic(void) {
    const char *pm = tmp(1, "synth.bin"), *pt = tmp(2, "synth_tok.bin"), *out = tmp(0, "synth.gguf");
    CHECK(write_synth(pm, pt));
    char err[LM_ERRLEN] = "";
    int rc = convert_llama2c(pm, pt, out, err, sizeof err);
    remove(pm);
    remove(pt);
    CHECKF(rc == 0, "%s", err);
    gguf_ctx *g = gguf_open(out, err, sizeof err);
    if (!g) remove(out);
    CHECKF(g, "%s", err);
    const size_t hs = SD / SNH, kvd = SNKV * hs;
    const size_t o_att = (size_t)SV * SD, o_wq = o_att + SL * SD, o_wk = o_wq + SL * SD * SD,
                 o_wv = o_wk + SL * SD * kvd, o_wo = o_wv + SL * SD * kvd, o_ffn = o_wo + SL * SD * SD,
                 o_w1 = o_ffn + SL * SD, o_w2 = o_w1 + SL * SH * SD, o_w3 = o_w2 + SL * SD * SH,
                 o_fin = o_w3 + SL * SH * SD, o_cls = o_fin + SD + SSEQ * hs;
    bool ok = gguf_n_tensors(g) == 3 + 9 * SL && tensor_starts_at(g, "token_embd.weight", 0, SD, SV) &&
        tensor_starts_at(g, "output.weight", o_cls, SD, SV) &&
        tensor_starts_at(g, "output_norm.weight", o_fin, SD, 1) &&
        tensor_starts_at(g, "blk.1.attn_q.weight", o_wq + SD * SD, SD, SD) &&
        tensor_starts_at(g, "blk.1.attn_k.weight", o_wk + SD * kvd, SD, kvd) &&
        tensor_starts_at(g, "blk.1.attn_v.weight", o_wv + SD * kvd, SD, kvd) &&
        tensor_starts_at(g, "blk.1.attn_output.weight", o_wo + SD * SD, SD, SD) &&
        tensor_starts_at(g, "blk.1.attn_norm.weight", o_att + SD, SD, 1) &&
        tensor_starts_at(g, "blk.1.ffn_norm.weight", o_ffn + SD, SD, 1) &&
        tensor_starts_at(g, "blk.1.ffn_gate.weight", o_w1 + SH * SD, SD, SH) &&
        tensor_starts_at(g, "blk.1.ffn_down.weight", o_w2 + SD * SH, SH, SD) &&
        tensor_starts_at(g, "blk.1.ffn_up.weight", o_w3 + SH * SD, SD, SH);
    int64_t v[8] = {0};
    ok = ok && gguf_get_int(g, "llama.context_length", &v[0]) && gguf_get_int(g, "llama.embedding_length", &v[1]) &&
        gguf_get_int(g, "llama.feed_forward_length", &v[2]) && gguf_get_int(g, "llama.block_count", &v[3]) &&
        gguf_get_int(g, "llama.attention.head_count", &v[4]) &&
        gguf_get_int(g, "llama.attention.head_count_kv", &v[5]) && gguf_get_int(g, "llama.rope.dimension_count", &v[6]);
    ok = ok && v[0] == SSEQ && v[1] == SD && v[2] == SH && v[3] == SL && v[4] == SNH && v[5] == SNKV &&
        v[6] == (int64_t)hs;
    gguf_arr toks, scores, types;
    ok = ok && gguf_get_arr(g, "tokenizer.ggml.tokens", &toks) && gguf_get_arr(g, "tokenizer.ggml.scores", &scores) &&
        gguf_get_arr(g, "tokenizer.ggml.token_type", &types) && toks.n == SV && scores.n == SV && types.n == SV;
    for (int i = 0; ok && i < SV; i++) {
        char buf[16];
        const char *want = synth_expect(i, buf);
        gguf_str s = {"", 0};
        double sc = 0;
        int64_t ty = 0;
        ok = gguf_arr_str(&toks, (uint64_t)i, &s) && s.len == strlen(want) && memcmp(s.ptr, want, s.len) == 0 &&
            gguf_arr_float(&scores, (uint64_t)i, &sc) && sc == -(double)i * 0.5 &&
            gguf_arr_int(&types, (uint64_t)i, &ty) && ty == synth_type(i);
        if (!ok) fprintf(stderr, "  token %d: '%.*s' wanted '%s'\n", i, (int)s.len, s.ptr, want);
    }
    gguf_close(g);
    remove(out);
    CHECK(ok);
}

int main(void) {
    TEST_RUN(test_reference_tensors);
    TEST_RUN(test_reference_metadata);
    TEST_RUN(test_compare_can_fail);
    TEST_RUN(test_truncated_checkpoint);
    TEST_RUN(test_truncated_tokenizer);
    TEST_RUN(test_absurd_header);
    TEST_RUN(test_output_is_input);
    TEST_RUN(test_alloc_failure);
    TEST_RUN(test_synthetic);
    return TEST_DONE();
}
