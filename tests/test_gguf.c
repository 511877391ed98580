/*
 * test_gguf.c - the GGUF reader and writer.
 *
 * Cases: facts of the bundled stories260K.gguf (cross-checked against the
 * same weights in the llama2.c file models/stories260K.bin); open errors for
 * missing, directory, empty and special files; a writer -> reader round trip
 * of every value type (nested arrays through gguf_w_copy_kv from a
 * hand-built file) and of tensors of several types at several alignments;
 * writer misuse; the committed corpus of bad files in tests/data/gguf_bad/
 * (each must fail, with the message its manifest names); every truncation
 * of a small valid file (each prefix is copied into an exactly-sized heap
 * buffer, so under ASan a read past the end is caught); random byte
 * corruption; allocation failure at every allocation of an open.
 */
#include "format/gguf.h"

#include <dirent.h>
#include <inttypes.h>
#include <stdint.h>
#include <unistd.h>

#include "format/quant.h"
#include "test.h"
#include "base/util.h"

#define BAD_DIR "tests/data/gguf_bad"

static char tmp_path[256];

static const char *tmp_file(const char *tag) {
    const char *dir = getenv("TMPDIR");
    snprintf(tmp_path, sizeof tmp_path, "%s/lamina_test_gguf_%ld_%s.gguf", dir && *dir ? dir : "/tmp", (long)getpid(),
             tag);
    return tmp_path;
}

/* Whole file into a malloc'ed buffer; NULL on failure. */
static uint8_t *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(n > 0 ? (size_t)n : 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return b;
}

/* ---- a byte builder for hand-made files --------------------------------- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} buf;

static void b_raw(buf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}
static void b_u32(buf *b, uint32_t v) { b_raw(b, &v, 4); }
static void b_u64(buf *b, uint64_t v) { b_raw(b, &v, 8); }
static void b_str(buf *b, const char *s) {
    b_u64(b, strlen(s));
    b_raw(b, s, strlen(s));
}
static void b_header(buf *b, uint32_t version, uint64_t nt, uint64_t nkv) {
    b_raw(b, "GGUF", 4);
    b_u32(b, version);
    b_u64(b, nt);
    b_u64(b, nkv);
}

/* ---- deep comparison of array values -------------------------------------- */

static size_t fixed_size(enum gguf_vtype t) {
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

static bool arr_equal(const gguf_arr *a, const gguf_arr *b) {
    if (a->type != b->type || a->n != b->n) return false;
    size_t sz = fixed_size(a->type);
    if (sz) return a->n == 0 || memcmp(a->data, b->data, a->n * sz) == 0;
    for (uint64_t i = 0; i < a->n; i++) {
        if (a->type == GGUF_STRING) {
            gguf_str x, y;
            if (!gguf_arr_str(a, i, &x) || !gguf_arr_str(b, i, &y)) return false;
            if (x.len != y.len || memcmp(x.ptr, y.ptr, x.len) != 0) return false;
        } else {
            gguf_arr x, y;
            if (!gguf_arr_arr(a, i, &x) || !gguf_arr_arr(b, i, &y)) return false;
            if (!arr_equal(&x, &y)) return false;
        }
    }
    return true;
}

/* ---- stories260K ---------------------------------------------------------------- */

static void test_stories_facts(void) {
    char err[LM_ERRLEN] = "";
    gguf_ctx *c = gguf_open(TEST_MODEL, err, sizeof err);
    CHECKF(c != NULL, "%s", err);
    CHECK(gguf_version(c) == 3);
    CHECK(gguf_alignment(c) == 32);
    CHECK(gguf_n_tensors(c) == 48);
    CHECK(gguf_n_kv(c) == 19);
    CHECK(gguf_data_offset(c) % 32 == 0);
    int64_t v;
    uint64_t u;
    double f;
    gguf_str s;
    CHECK(gguf_get_int(c, "llama.block_count", &v) && v == 5);
    CHECK(gguf_get_uint(c, "llama.embedding_length", &u) && u == 64);
    CHECK(gguf_get_int(c, "llama.feed_forward_length", &v) && v == 172);
    CHECK(gguf_get_int(c, "llama.attention.head_count", &v) && v == 8);
    CHECK(gguf_get_int(c, "llama.attention.head_count_kv", &v) && v == 4);
    CHECK(gguf_get_float(c, "llama.attention.layer_norm_rms_epsilon", &f) && fabs(f - 1e-5) < 1e-10);
    CHECK(gguf_get_float(c, "llama.block_count", &f) && f == 5.0);
    CHECK(gguf_get_str(c, "general.architecture", &s) && gguf_str_eq(s, "llama"));
    CHECK(!gguf_get_str(c, "llama.block_count", &s));
    CHECK(!gguf_get_int(c, "general.architecture", &v));
    CHECK(!gguf_get_int(c, "llama.no_such_key", &v));
    CHECK(gguf_find_key(c, "llama.no_such_key") == -1);
    int64_t ki = gguf_find_key(c, "llama.block_count");
    CHECK(ki >= 0 && gguf_str_eq(gguf_kv_key(c, ki), "llama.block_count"));
    CHECK(gguf_kv_type(c, ki) == GGUF_UINT32);
    /* u32 0xffffffff fits int64 and uint64 */
    CHECK(gguf_get_int(c, "tokenizer.ggml.seperator_token_id", &v) && v == 4294967295LL);

    gguf_arr toks, scores, types;
    CHECK(gguf_get_arr(c, "tokenizer.ggml.tokens", &toks) && toks.type == GGUF_STRING && toks.n == 512);
    CHECK(gguf_get_arr(c, "tokenizer.ggml.scores", &scores) && scores.type == GGUF_FLOAT32 && scores.n == 512);
    CHECK(gguf_get_arr(c, "tokenizer.ggml.token_type", &types) && types.type == GGUF_INT32 && types.n == 512);
    CHECK(gguf_arr_str(&toks, 1, &s) && gguf_str_eq(s, "<s>"));
    CHECK(gguf_arr_str(&toks, 2, &s) && gguf_str_eq(s, "</s>"));
    CHECK(!gguf_arr_str(&toks, 512, &s));
    CHECK(!gguf_arr_int(&toks, 0, &v));
    CHECK(gguf_arr_int(&types, 1, &v) && v == 3); /* control token */
    CHECK(gguf_arr_float(&scores, 300, &f) && isfinite(f));

    const uint64_t file_size = gguf_file_size(c);
    const gguf_tensor *emb = gguf_find_tensor(c, "token_embd.weight");
    CHECK(emb != NULL);
    CHECK(emb->n_dims == 2 && emb->ne[0] == 64 && emb->ne[1] == 512 && emb->ne[2] == 1);
    CHECK(emb->type == LM_TYPE_F32 && emb->nbytes == 64 * 512 * 4);
    CHECK(gguf_find_tensor(c, "blk.4.ffn_down.weight") != NULL);
    CHECK(gguf_find_tensor(c, "blk.5.ffn_down.weight") == NULL);
    for (int64_t i = 0; i < gguf_n_tensors(c); i++) {
        const gguf_tensor *t = gguf_tensor_at(c, i);
        CHECK(t && t->type == LM_TYPE_F32 && t->offset % 32 == 0);
        CHECK(gguf_find_tensor(c, t->name) == t);
        CHECK(gguf_data_offset(c) + t->offset + t->nbytes <= file_size);
    }
    CHECK(gguf_tensor_at(c, 48) == NULL && gguf_tensor_at(c, -1) == NULL);

    /* The same embedding table sits after the 28-byte header of the llama2.c file. */
    size_t bn;
    uint8_t *bin = read_all("models/stories260K.bin", &bn);
    CHECK(bin != NULL && bn >= 28 + emb->nbytes);
    int same = memcmp(bin + 28, emb->data, emb->nbytes) == 0;
    free(bin);
    CHECK(same);
    gguf_close(c);
}

/* gguf_open_mem on the same bytes gives the same directory, and version 2
 * (same layout) is accepted. */
static void test_mem_and_v2(void) {
    size_t n;
    uint8_t *b = read_all(TEST_MODEL, &n);
    CHECK(b != NULL);
    char err[LM_ERRLEN] = "";
    b[4] = 2;
    gguf_ctx *c = gguf_open_mem(b, n, err, sizeof err);
    CHECKF(c != NULL, "%s", err);
    CHECK(gguf_version(c) == 2 && gguf_n_tensors(c) == 48);
    const gguf_tensor *t = gguf_find_tensor(c, "output.weight");
    CHECK(t && (const uint8_t *)t->data == b + gguf_data_offset(c) + t->offset);
    gguf_close(c);
    free(b);
}

static void test_open_errors(void) {
    char err[LM_ERRLEN];
    err[0] = 0;
    CHECK(gguf_open("tests/data/no_such_file.gguf", err, sizeof err) == NULL);
    CHECKF(strstr(err, "no_such_file.gguf") && strstr(err, "No such file"), "%s", err);
    err[0] = 0;
    CHECK(gguf_open("tests", err, sizeof err) == NULL);
    CHECKF(strstr(err, "directory"), "%s", err);
    err[0] = 0;
    CHECK(gguf_open("/dev/null", err, sizeof err) == NULL);
    CHECKF(err[0], "empty message");
    const char *p = tmp_file("empty");
    FILE *f = fopen(p, "wb");
    CHECK(f != NULL);
    fclose(f);
    err[0] = 0;
    gguf_ctx *c = gguf_open(p, err, sizeof err);
    remove(p);
    CHECK(c == NULL);
    CHECKF(strstr(err, "empty"), "%s", err);
    err[0] = 0;
    CHECK(gguf_open_mem("", 0, err, sizeof err) == NULL && err[0]);
    CHECK(gguf_open_mem(NULL, 0, NULL, 0) == NULL); /* NULL err is allowed */
}

/* ---- writer round trip ---------------------------------------------------------- */

/* A hand-built file holding nested arrays (the writer's own API has no
 * nested-array setter; they arrive through gguf_w_copy_kv). depth 8 is the
 * deepest the reader accepts. */
static buf nested_file(void) {
    buf b = {0};
    b_header(&b, 3, 0, 3);
    /* nest.mixed = [[1u8, 2u8], [], [[-5i32]]] : array of arrays */
    b_str(&b, "nest.mixed");
    b_u32(&b, GGUF_ARRAY);
    b_u32(&b, GGUF_ARRAY);
    b_u64(&b, 3);
    b_u32(&b, GGUF_UINT8);
    b_u64(&b, 2);
    b_raw(&b, "\x01\x02", 2);
    b_u32(&b, GGUF_FLOAT64);
    b_u64(&b, 0);
    b_u32(&b, GGUF_ARRAY);
    b_u64(&b, 1);
    b_u32(&b, GGUF_INT32);
    b_u64(&b, 1);
    b_u32(&b, (uint32_t)-5);
    /* nest.strs = [["a", ""], ["xyz"]] */
    b_str(&b, "nest.strs");
    b_u32(&b, GGUF_ARRAY);
    b_u32(&b, GGUF_ARRAY);
    b_u64(&b, 2);
    b_u32(&b, GGUF_STRING);
    b_u64(&b, 2);
    b_str(&b, "a");
    b_str(&b, "");
    b_u32(&b, GGUF_STRING);
    b_u64(&b, 1);
    b_str(&b, "xyz");
    /* nest.deep: 8 levels, innermost = ["deep"] */
    b_str(&b, "nest.deep");
    b_u32(&b, GGUF_ARRAY);
    for (int d = 1; d < 8; d++) {
        b_u32(&b, GGUF_ARRAY);
        b_u64(&b, 1);
    }
    b_u32(&b, GGUF_STRING);
    b_u64(&b, 1);
    b_str(&b, "deep");
    return b;
}

static void test_nested_read(void) {
    buf b = nested_file();
    char err[LM_ERRLEN] = "";
    gguf_ctx *c = gguf_open_mem(b.p, b.n, err, sizeof err);
    CHECKF(c != NULL, "%s", err);
    gguf_arr a, x, y;
    int64_t v;
    gguf_str s;
    CHECK(gguf_get_arr(c, "nest.mixed", &a) && a.type == GGUF_ARRAY && a.n == 3);
    CHECK(gguf_arr_arr(&a, 0, &x) && x.type == GGUF_UINT8 && x.n == 2);
    CHECK(gguf_arr_int(&x, 1, &v) && v == 2);
    CHECK(gguf_arr_arr(&a, 1, &x) && x.type == GGUF_FLOAT64 && x.n == 0);
    CHECK(gguf_arr_arr(&a, 2, &x) && x.type == GGUF_ARRAY && x.n == 1);
    CHECK(gguf_arr_arr(&x, 0, &y) && y.type == GGUF_INT32 && gguf_arr_int(&y, 0, &v) && v == -5);
    CHECK(!gguf_arr_arr(&a, 3, &x) && !gguf_arr_int(&a, 0, &v) && !gguf_arr_str(&a, 0, &s));
    CHECK(gguf_get_arr(c, "nest.strs", &a) && gguf_arr_arr(&a, 0, &x));
    CHECK(gguf_arr_str(&x, 0, &s) && gguf_str_eq(s, "a") && gguf_arr_str(&x, 1, &s) && s.len == 0);
    CHECK(gguf_get_arr(c, "nest.deep", &a));
    int depth = 1;
    while (a.type == GGUF_ARRAY) {
        CHECK(gguf_arr_arr(&a, 0, &x));
        a = x;
        depth++;
    }
    CHECK(depth == 8 && gguf_arr_str(&a, 0, &s) && gguf_str_eq(s, "deep"));
    gguf_close(c);
    free(b.p);
}

typedef struct {
    const char *name;
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[4];
} tspec;

static const tspec tensors[] = {
    {"t.f32", LM_TYPE_F32, 2, {3, 5, 1, 1}},     {"t.f16", LM_TYPE_F16, 1, {7, 1, 1, 1}},
    {"t.q8_0", LM_TYPE_Q8_0, 2, {64, 3, 1, 1}},  {"t.q4_0", LM_TYPE_Q4_0, 3, {32, 2, 2, 1}},
    {"t.q4_k", LM_TYPE_Q4_K, 1, {256, 1, 1, 1}}, {"t.q6_k", LM_TYPE_Q6_K, 2, {512, 1, 1, 1}},
    {"t.bf16", LM_TYPE_BF16, 4, {2, 3, 1, 2}},   {"t.i8", LM_TYPE_I8, 1, {1, 1, 1, 1}},
};
#define N_TENSORS (sizeof tensors / sizeof tensors[0])

/* Fill a writer with every value type and the tensors above; the tensor
 * bytes are a deterministic pattern kept in pool (caller frees). */
static int fill_writer(gguf_writer *w, const gguf_ctx *nested, uint8_t **pool) {
    const uint8_t u8s[] = {0, 1, 255};
    const int8_t i8s[] = {-128, 0, 127};
    const uint16_t u16s[] = {0, 65535};
    const int16_t i16s[] = {-32768, 32767};
    const uint32_t u32s[] = {0, 4294967295u};
    const int32_t i32s[] = {INT32_MIN, -1, INT32_MAX};
    const float f32s[] = {1.5f, -0.0f, 3.0e38f};
    const uint8_t bools[] = {1, 0, 7}; /* 7 is stored as 1 */
    const uint64_t u64s[] = {0, UINT64_MAX};
    const int64_t i64s[] = {INT64_MIN, INT64_MAX};
    const double f64s[] = {0.1, -1e300};
    const char *strs[] = {"alpha", "", "gamma \xce\xb3"};
    int rc = 0;
    rc |= gguf_w_set_str(w, "general.architecture", "test");
    rc |= gguf_w_set_u32(w, "k.u32", 4000000000u);
    rc |= gguf_w_set_i32(w, "k.i32", -7);
    rc |= gguf_w_set_u64(w, "k.u64", UINT64_MAX);
    rc |= gguf_w_set_f32(w, "k.f32", 0.25f);
    rc |= gguf_w_set_bool(w, "k.bool", true);
    rc |= gguf_w_set_str(w, "k.str", "hello");
    rc |= gguf_w_set_str(w, "k.empty", "");
    rc |= gguf_w_set_arr(w, "a.u8", GGUF_UINT8, u8s, 3);
    rc |= gguf_w_set_arr(w, "a.i8", GGUF_INT8, i8s, 3);
    rc |= gguf_w_set_arr(w, "a.u16", GGUF_UINT16, u16s, 2);
    rc |= gguf_w_set_arr(w, "a.i16", GGUF_INT16, i16s, 2);
    rc |= gguf_w_set_arr(w, "a.u32", GGUF_UINT32, u32s, 2);
    rc |= gguf_w_set_arr(w, "a.i32", GGUF_INT32, i32s, 3);
    rc |= gguf_w_set_arr(w, "a.f32", GGUF_FLOAT32, f32s, 3);
    rc |= gguf_w_set_arr(w, "a.bool", GGUF_BOOL, bools, 3);
    rc |= gguf_w_set_arr(w, "a.u64", GGUF_UINT64, u64s, 2);
    rc |= gguf_w_set_arr(w, "a.i64", GGUF_INT64, i64s, 2);
    rc |= gguf_w_set_arr(w, "a.f64", GGUF_FLOAT64, f64s, 2);
    rc |= gguf_w_set_arr(w, "a.empty", GGUF_INT32, NULL, 0);
    rc |= gguf_w_set_arr_str(w, "a.str", strs, 3);
    rc |= gguf_w_set_u32(w, "k.replaced", 1);
    rc |= gguf_w_set_str(w, "k.replaced", "now a string"); /* keeps its position */
    rc |= gguf_w_set_u32(w, "k.removed", 9);
    rc |= gguf_w_remove_kv(w, "k.removed");
    for (int64_t i = 0; i < gguf_n_kv(nested); i++) rc |= gguf_w_copy_kv(w, nested, i);
    size_t total = 0;
    for (size_t i = 0; i < N_TENSORS; i++) {
        const tspec *t = &tensors[i];
        total += quant_row_size(t->type, (int64_t)t->ne[0]) * t->ne[1] * t->ne[2] * t->ne[3];
    }
    *pool = malloc(total);
    for (size_t i = 0; i < total; i++) (*pool)[i] = (uint8_t)(i * 131 + 7);
    size_t at = 0;
    for (size_t i = 0; i < N_TENSORS; i++) {
        const tspec *t = &tensors[i];
        size_t nb = quant_row_size(t->type, (int64_t)t->ne[0]) * t->ne[1] * t->ne[2] * t->ne[3];
        rc |= gguf_w_add_tensor(w, t->name, t->n_dims, t->ne, t->type, *pool + at, nb);
        at += nb;
    }
    return rc;
}

/* Check every value written by fill_writer. */
static void check_values(const gguf_ctx *c, const gguf_ctx *nested) {
    int64_t v;
    uint64_t u;
    double f;
    bool bo;
    gguf_str s;
    gguf_arr a;
    CHECK(gguf_get_uint(c, "k.u32", &u) && u == 4000000000u);
    CHECK(gguf_get_int(c, "k.i32", &v) && v == -7);
    CHECK(!gguf_get_uint(c, "k.i32", &u)); /* negative */
    CHECK(gguf_get_uint(c, "k.u64", &u) && u == UINT64_MAX);
    CHECK(!gguf_get_int(c, "k.u64", &v)); /* above INT64_MAX */
    CHECK(gguf_get_float(c, "k.u64", &f) && f == 18446744073709551615.0);
    CHECK(gguf_get_float(c, "k.f32", &f) && f == 0.25);
    CHECK(!gguf_get_int(c, "k.f32", &v));
    CHECK(gguf_get_bool(c, "k.bool", &bo) && bo);
    CHECK(gguf_get_int(c, "k.bool", &v) && v == 1);
    CHECK(!gguf_get_float(c, "k.bool", &f));
    CHECK(!gguf_get_bool(c, "k.u32", &bo));
    CHECK(gguf_get_str(c, "k.str", &s) && gguf_str_eq(s, "hello"));
    CHECK(gguf_get_str(c, "k.empty", &s) && s.len == 0);
    CHECK(gguf_find_key(c, "k.removed") < 0);
    int64_t ri = gguf_find_key(c, "k.replaced");
    CHECK(ri >= 0 && gguf_kv_type(c, ri) == GGUF_STRING && gguf_kv_str(c, ri, &s) && gguf_str_eq(s, "now a string"));
    CHECK(ri == gguf_find_key(c, "a.str") + 1); /* insertion order kept */
    CHECK(gguf_find_key(c, "general.architecture") == 0);

    CHECK(gguf_get_arr(c, "a.u8", &a) && a.type == GGUF_UINT8 && a.n == 3 && gguf_arr_int(&a, 2, &v) && v == 255);
    CHECK(gguf_get_arr(c, "a.i8", &a) && a.type == GGUF_INT8 && gguf_arr_int(&a, 0, &v) && v == -128);
    CHECK(gguf_get_arr(c, "a.u16", &a) && a.type == GGUF_UINT16 && gguf_arr_int(&a, 1, &v) && v == 65535);
    CHECK(gguf_get_arr(c, "a.i16", &a) && a.type == GGUF_INT16 && gguf_arr_int(&a, 0, &v) && v == -32768);
    CHECK(gguf_get_arr(c, "a.u32", &a) && a.type == GGUF_UINT32 && gguf_arr_int(&a, 1, &v) && v == 4294967295LL);
    CHECK(gguf_get_arr(c, "a.i32", &a) && a.type == GGUF_INT32 && gguf_arr_int(&a, 0, &v) && v == INT32_MIN);
    CHECK(gguf_get_arr(c, "a.f32", &a) && a.type == GGUF_FLOAT32 && gguf_arr_float(&a, 2, &f) && f == (double)3.0e38f);
    CHECK(gguf_arr_float(&a, 1, &f) && f == 0 && signbit(f) && !gguf_arr_int(&a, 0, &v));
    CHECK(gguf_get_arr(c, "a.bool", &a) && a.type == GGUF_BOOL && a.n == 3);
    CHECK(gguf_arr_int(&a, 0, &v) && v == 1 && gguf_arr_int(&a, 1, &v) && v == 0 && gguf_arr_int(&a, 2, &v) && v == 1);
    CHECK(gguf_get_arr(c, "a.u64", &a) && a.type == GGUF_UINT64 && !gguf_arr_int(&a, 1, &v));
    CHECK(gguf_arr_float(&a, 1, &f) && f == 18446744073709551615.0);
    CHECK(gguf_get_arr(c, "a.i64", &a) && a.type == GGUF_INT64 && gguf_arr_int(&a, 0, &v) && v == INT64_MIN);
    CHECK(gguf_arr_int(&a, 1, &v) && v == INT64_MAX && !gguf_arr_int(&a, 2, &v));
    CHECK(gguf_get_arr(c, "a.f64", &a) && a.type == GGUF_FLOAT64 && gguf_arr_float(&a, 1, &f) && f == -1e300);
    CHECK(gguf_get_arr(c, "a.empty", &a) && a.type == GGUF_INT32 && a.n == 0);
    CHECK(gguf_get_arr(c, "a.str", &a) && a.type == GGUF_STRING && a.n == 3);
    CHECK(gguf_arr_str(&a, 1, &s) && s.len == 0 && gguf_arr_str(&a, 2, &s) && gguf_str_eq(s, "gamma \xce\xb3"));
    for (int64_t i = 0; i < gguf_n_kv(nested); i++) {
        gguf_arr x, y;
        gguf_str k = gguf_kv_key(nested, i);
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)k.len, k.ptr);
        CHECK(gguf_kv_arr(nested, i, &x) && gguf_get_arr(c, key, &y));
        CHECKF(arr_equal(&x, &y), "nested kv %s differs", key);
    }
}

static void check_tensors(const gguf_ctx *c, const uint8_t *pool, uint32_t align) {
    CHECK(gguf_n_tensors(c) == (int64_t)N_TENSORS);
    CHECK(gguf_alignment(c) == align && gguf_data_offset(c) % align == 0);
    size_t at = 0;
    uint64_t prev_end = 0;
    for (size_t i = 0; i < N_TENSORS; i++) {
        const tspec *sp = &tensors[i];
        const gguf_tensor *t = gguf_tensor_at(c, (int64_t)i);
        CHECK(t && strcmp(t->name, sp->name) == 0 && gguf_find_tensor(c, sp->name) == t);
        CHECK(t->type == sp->type && t->n_dims == sp->n_dims);
        for (int d = 0; d < 4; d++) CHECK(t->ne[d] == sp->ne[d]);
        size_t nb = quant_row_size(sp->type, (int64_t)sp->ne[0]) * sp->ne[1] * sp->ne[2] * sp->ne[3];
        CHECK(t->nbytes == nb);
        CHECKF(t->offset % align == 0 && t->offset >= prev_end, "tensor %s offset %" PRIu64, t->name, t->offset);
        CHECK(memcmp(t->data, pool + at, nb) == 0);
        prev_end = t->offset + nb;
        at += nb;
    }
    /* the writer pads the last tensor too, so the file ends on the alignment */
    CHECK(gguf_file_size(c) % align == 0);
    CHECK(gguf_file_size(c) - gguf_data_offset(c) - prev_end < align);
}

static void test_roundtrip(void) {
    buf nb = nested_file();
    char err[LM_ERRLEN] = "";
    gguf_ctx *nested = gguf_open_mem(nb.p, nb.n, err, sizeof err);
    CHECKF(nested != NULL, "%s", err);
    const uint32_t aligns[] = {0, 1, 8, 64, 4096};
    for (size_t ai = 0; ai < sizeof aligns / sizeof aligns[0]; ai++) {
        gguf_writer *w = gguf_writer_new();
        uint8_t *pool = NULL;
        CHECK(w != NULL);
        CHECK(fill_writer(w, nested, &pool) == 0);
        if (aligns[ai]) CHECK(gguf_w_set_u32(w, "general.alignment", aligns[ai]) == 0);
        const char *p = tmp_file("rt");
        err[0] = 0;
        int rc = gguf_writer_write(w, p, err, sizeof err);
        gguf_writer_free(w);
        CHECKF(rc == 0, "%s", err);
        gguf_ctx *c = gguf_open(p, err, sizeof err);
        remove(p);
        CHECKF(c != NULL, "%s", err);
        CHECK(gguf_version(c) == 3);
        test_cur_failed_ = 0;
        check_values(c, nested);
        if (!test_cur_failed_) check_tensors(c, pool, aligns[ai] ? aligns[ai] : 32);
        int failed = test_cur_failed_;
        /* copy the whole file through copy_kv: same kvs again */
        gguf_writer *w2 = gguf_writer_new();
        for (int64_t i = 0; i < gguf_n_kv(c); i++) CHECK(gguf_w_copy_kv(w2, c, i) == 0);
        const char *p2 = tmp_file("rt2");
        CHECK(gguf_writer_write(w2, p2, err, sizeof err) == 0);
        gguf_writer_free(w2);
        gguf_ctx *c2 = gguf_open(p2, err, sizeof err);
        remove(p2);
        CHECKF(c2 != NULL, "%s", err);
        CHECK(gguf_n_kv(c2) == gguf_n_kv(c) && gguf_n_tensors(c2) == 0);
        check_values(c2, nested);
        gguf_close(c2);
        gguf_close(c);
        free(pool);
        if (failed || test_cur_failed_) {
            test_cur_failed_ = 1;
            fprintf(stderr, "  (alignment %u)\n", aligns[ai]);
            break;
        }
    }
    gguf_close(nested);
    free(nb.p);
}

/* Misuse of the writer: the first failed call makes the write fail. */
static void test_writer_errors(void) {
    char err[LM_ERRLEN];
    const char *p = tmp_file("bad");
    float x[4] = {0};
    const uint64_t ne4[] = {4}, ne0[] = {0}, ne17[] = {17};
    gguf_writer *w = gguf_writer_new();
    CHECK(gguf_w_add_tensor(w, "x", 1, ne4, LM_TYPE_F32, x, 15) == -1); /* wrong nbytes */
    err[0] = 0;
    CHECK(gguf_writer_write(w, p, err, sizeof err) == -1);
    CHECKF(strstr(err, "'x'") && access(p, F_OK) != 0, "%s", err);
    gguf_writer_free(w);

    w = gguf_writer_new();
    CHECK(gguf_w_add_tensor(w, "x", 1, ne4, LM_TYPE_F32, x, 16) == 0);
    CHECK(gguf_w_add_tensor(w, "x", 1, ne4, LM_TYPE_F32, x, 16) == -1); /* duplicate */
    CHECK(gguf_writer_write(w, p, err, sizeof err) == -1 && strstr(err, "twice"));
    gguf_writer_free(w);

    w = gguf_writer_new();
    CHECK(gguf_w_add_tensor(w, "z", 1, ne0, LM_TYPE_F32, x, 0) == -1); /* zero dim */
    gguf_writer_free(w);
    w = gguf_writer_new();
    CHECK(gguf_w_add_tensor(w, "q", 1, ne17, LM_TYPE_Q8_0, x, 34) == -1); /* not a block multiple */
    gguf_writer_free(w);
    w = gguf_writer_new();
    CHECK(gguf_w_add_tensor(w, "u", 1, ne4, 99, x, 16) == -1); /* unknown type */
    gguf_writer_free(w);
    w = gguf_writer_new();
    CHECK(gguf_w_add_tensor(w, "u", 5, ne4, LM_TYPE_F32, x, 16) == -1); /* n_dims */
    CHECK(gguf_w_set_u32(w, "", 1) == -1);
    gguf_writer_free(w);
    w = gguf_writer_new();
    CHECK(gguf_w_set_arr(w, "a", GGUF_STRING, x, 1) == -1);
    gguf_writer_free(w);

    w = gguf_writer_new();
    CHECK(gguf_w_set_u32(w, "general.alignment", 48) == 0); /* not a power of two */
    CHECK(gguf_writer_write(w, p, err, sizeof err) == -1 && strstr(err, "alignment"));
    CHECK(gguf_w_set_u64(w, "general.alignment", 64) == 0); /* wrong type */
    CHECK(gguf_writer_write(w, p, err, sizeof err) == -1 && strstr(err, "uint32"));
    CHECK(gguf_w_remove_kv(w, "general.alignment") == 0 && gguf_w_remove_kv(w, "general.alignment") == -1);
    CHECK(gguf_writer_write(w, "/nonexistent-dir/x.gguf", err, sizeof err) == -1 && strstr(err, "nonexistent"));
    CHECK(gguf_writer_write(w, p, err, sizeof err) == 0); /* the failures above were not sticky */
    gguf_ctx *c = gguf_open(p, err, sizeof err);
    remove(p);
    CHECKF(c && gguf_n_kv(c) == 0 && gguf_n_tensors(c) == 0, "%s", err);
    gguf_close(c);
    gguf_writer_free(w);
}

/* ---- the bad-file corpus -------------------------------------------------------- */

/* manifest.txt: "<file> <expected substring of the message>" per line, or
 * "<file> OK" for a control file built the same way that must open. Every
 * .gguf in the directory must be listed. */
static void test_bad_corpus(void) {
    FILE *m = fopen(BAD_DIR "/manifest.txt", "r");
    CHECKF(m != NULL, "cannot open %s/manifest.txt", BAD_DIR);
    char line[512];
    int n_bad = 0, n_ok = 0;
    char listed[4096] = " ";
    while (fgets(line, sizeof line, m)) {
        line[strcspn(line, "\n")] = 0;
        if (!line[0] || line[0] == '#') continue;
        char *sp = strchr(line, ' ');
        if (!sp) continue;
        *sp = 0;
        const char *want = sp + 1;
        char path[600], err[LM_ERRLEN] = "";
        snprintf(path, sizeof path, "%s/%s", BAD_DIR, line);
        if (strlen(listed) + strlen(line) + 2 < sizeof listed) {
            strcat(listed, line);
            strcat(listed, " ");
        }
        gguf_ctx *c = gguf_open(path, err, sizeof err);
        if (strcmp(want, "OK") == 0) {
            if (!c) fclose(m);
            CHECKF(c != NULL, "%s should open: %s", line, err);
            gguf_close(c);
            n_ok++;
            continue;
        }
        if (c) {
            gguf_close(c);
            fclose(m);
            CHECKF(0, "%s opened but must fail (%s)", line, want);
        }
        if (!strstr(err, want)) fclose(m);
        CHECKF(strstr(err, want) != NULL, "%s: message \"%s\" lacks \"%s\"", line, err, want);
        n_bad++;
    }
    fclose(m);
    CHECKF(n_bad >= 30 && n_ok >= 1, "%d bad, %d ok files", n_bad, n_ok);
    DIR *d = opendir(BAD_DIR);
    CHECK(d != NULL);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 5, ".gguf") != 0) continue;
        char pat[300];
        snprintf(pat, sizeof pat, " %s ", e->d_name);
        if (!strstr(listed, pat)) {
            closedir(d);
            CHECKF(0, "%s is not in the manifest", e->d_name);
        }
    }
    closedir(d);
}

/* ---- truncation, corruption, allocation failure -------------------------------- */

/* A small valid file with strings, arrays, nested arrays and 3 tensors. */
static uint8_t *small_file(size_t *n, uint64_t *need_end) {
    buf nb = nested_file();
    gguf_ctx *nested = gguf_open_mem(nb.p, nb.n, NULL, 0);
    gguf_writer *w = gguf_writer_new();
    const char *strs[] = {"a", "bc", ""};
    float f[48];
    for (int i = 0; i < 48; i++) f[i] = (float)i;
    const uint64_t ne1[] = {5}, ne2[] = {4, 3}, ne3[] = {32};
    gguf_w_set_str(w, "general.architecture", "tiny");
    gguf_w_set_arr_str(w, "tokens", strs, 3);
    gguf_w_set_u32(w, "general.alignment", 16);
    gguf_w_set_bool(w, "b", true);
    for (int64_t i = 0; nested && i < gguf_n_kv(nested); i++) gguf_w_copy_kv(w, nested, i);
    gguf_w_add_tensor(w, "a", 1, ne1, LM_TYPE_F32, f, 20);
    gguf_w_add_tensor(w, "b", 2, ne2, LM_TYPE_F32, f, 48);
    gguf_w_add_tensor(w, "c", 1, ne3, LM_TYPE_Q8_0, f, 34);
    const char *p = tmp_file("small");
    int rc = gguf_writer_write(w, p, NULL, 0);
    gguf_writer_free(w);
    gguf_close(nested);
    free(nb.p);
    if (rc) return NULL;
    uint8_t *b = read_all(p, n);
    remove(p);
    gguf_ctx *c = b ? gguf_open_mem(b, *n, NULL, 0) : NULL;
    if (!c) {
        free(b);
        return NULL;
    }
    const gguf_tensor *t = gguf_tensor_at(c, gguf_n_tensors(c) - 1);
    *need_end = gguf_data_offset(c) + t->offset + t->nbytes;
    gguf_close(c);
    return b;
}

static void test_truncation(void) {
    size_t n;
    uint64_t need_end;
    uint8_t *full = small_file(&n, &need_end);
    CHECK(full != NULL);
    CHECK(need_end < n); /* the tail padding makes the check below meaningful */
    int bad = 0;
    for (size_t len = 0; len <= n && !bad; len++) {
        uint8_t *b = malloc(len ? len : 1); /* exactly len bytes: ASan sees any over-read */
        memcpy(b, full, len);
        char err[LM_ERRLEN] = "";
        gguf_ctx *c = gguf_open_mem(b, len, err, sizeof err);
        if (len >= need_end) {
            if (!c || gguf_n_tensors(c) != 3 || gguf_n_kv(c) != 7) {
                fprintf(stderr, "  length %zu (complete at %" PRIu64 "): %s\n", len, need_end, err);
                bad = 1;
            }
        } else if (c || !err[0]) {
            fprintf(stderr, "  truncated at %zu of %zu: %s\n", len, n, c ? "opened" : "no message");
            bad = 1;
        }
        gguf_close(c);
        free(b);
    }
    free(full);
    CHECK(!bad);
}

/* Random byte corruption: must never crash or read out of bounds (the
 * sanitizers judge); a corrupted file that opens is walked completely. */
static void walk(const gguf_ctx *c, uint64_t *sink) {
    for (int64_t i = 0; i < gguf_n_kv(c); i++) {
        gguf_arr a;
        gguf_str s;
        int64_t v;
        double f;
        if (gguf_kv_int(c, i, &v)) *sink += (uint64_t)v;
        if (gguf_kv_float(c, i, &f)) *sink += f != f;
        if (gguf_kv_str(c, i, &s) && s.len) *sink += (uint8_t)s.ptr[s.len - 1];
        if (gguf_kv_arr(c, i, &a))
            for (uint64_t j = 0; j < a.n; j++)
                if (gguf_arr_str(&a, j, &s) && s.len) *sink += (uint8_t)s.ptr[0];
    }
    for (int64_t i = 0; i < gguf_n_tensors(c); i++) {
        const gguf_tensor *t = gguf_tensor_at(c, i);
        *sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->nbytes - 1];
    }
}

static void test_corruption(void) {
    size_t n;
    uint64_t need_end;
    uint8_t *full = small_file(&n, &need_end);
    CHECK(full != NULL);
    lm_rng r;
    lm_rng_seed(&r, 12345);
    uint64_t sink = 0;
    int opened = 0, failed_msg = 1;
    for (int it = 0; it < 3000; it++) {
        uint8_t *b = malloc(n);
        memcpy(b, full, n);
        int flips = 1 + (int)(lm_rng_u64(&r) % 4);
        size_t hdr = (size_t)(need_end < n ? need_end : n);
        for (int k = 0; k < flips; k++) {
            size_t at = (size_t)(lm_rng_u64(&r) % hdr);
            b[at] = (lm_rng_u64(&r) & 1) ? (uint8_t)lm_rng_u64(&r) : (uint8_t)(b[at] ^ (1u << (lm_rng_u64(&r) % 8)));
        }
        char err[LM_ERRLEN] = "";
        gguf_ctx *c = gguf_open_mem(b, n, err, sizeof err);
        if (c) {
            opened++;
            walk(c, &sink);
            gguf_close(c);
        } else if (!err[0]) {
            failed_msg = 0;
        }
        free(b);
    }
    free(full);
    CHECK(failed_msg);
    CHECK(opened > 0 && opened < 3000); /* some flips land in tensor data, some break the header */
}

static void test_alloc_failure(void) {
    size_t n;
    uint64_t need_end;
    uint8_t *full = small_file(&n, &need_end);
    CHECK(full != NULL);
    int ok_seen = 0, bad = 0;
    for (long k = 0; k < 200 && !ok_seen; k++) {
        char err[LM_ERRLEN] = "";
        lm_alloc_fail_after(k);
        gguf_ctx *c = gguf_open_mem(full, n, err, sizeof err);
        lm_alloc_fail_after(-1);
        if (c) {
            ok_seen = 1;
            bad |= gguf_n_tensors(c) != 3;
        } else {
            bad |= !strstr(err, "out of memory");
        }
        gguf_close(c);
    }
    free(full);
    CHECK(ok_seen && !bad);
}

int main(void) {
    TEST_RUN(test_stories_facts);
    TEST_RUN(test_mem_and_v2);
    TEST_RUN(test_open_errors);
    TEST_RUN(test_nested_read);
    TEST_RUN(test_roundtrip);
    TEST_RUN(test_writer_errors);
    TEST_RUN(test_bad_corpus);
    TEST_RUN(test_truncation);
    TEST_RUN(test_corruption);
    TEST_RUN(test_alloc_failure);
    return TEST_DONE();
}
