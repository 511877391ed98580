/*
 * test_gguf_split.c - a model split over several GGUF files (llama.cpp's
 * gguf-split layout: PREFIX-0000k-of-0000N.gguf, the metadata in the first
 * part, split.no / split.count / split.tensors.count as u16, u16, i32 in
 * every part), written here from models/stories260K.gguf with lamina's own
 * writer, and opened from its first part:
 *   - every tensor is found, of the same shape and type, its bytes equal to
 *     the unsplit file's; the files and their bytes are counted;
 *   - the logits of a prompt (every position) from the split model equal
 *     the unsplit model's bit for bit;
 *   - quantize_file of the split model writes one file, byte for byte the
 *     one written from the unsplit model (no split.* key carried over);
 *   - refused with a message: a later part given instead of the first (the
 *     first named), a missing part (LM_ERR_IO), a set whose names lack the
 *     -0000k-of-0000N tail, a part whose split.no is wrong, a tensor in two
 *     parts, a split.tensors.count the parts do not hold; a file with
 *     split.count 1 opens as a plain file.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/pool.h"
#include "base/util.h"
#include "format/gguf.h"
#include "format/quant.h"
#include "format/quantize.h"
#include "base/safefile.h"
#include "kv/kv.h"
#include "model/forward.h"
#include "model/model.h"
#include "test.h"

#define SRC "models/stories260K.gguf"
#define N_PARTS 3

static char dir[64];

/* Write src as n parts named PREFIX-0000k-of-0000n.gguf under dir.
 * no_of(k) gives part k's split.no (k - 1 unless a test breaks it); dup
 * puts the first tensor in the second part too; count_fix adds to
 * split.tensors.count. */
typedef struct {
    int wrong_no_part; /* 1-based part whose split.no is off by one, 0: none */
    bool dup;
    int count_delta;
    int n_split_key; /* split.count written (0: n) */
} split_opts;

static int write_split(const gguf_ctx *src, const char *prefix, int n, const split_opts *o) {
    int64_t nt = gguf_n_tensors(src);
    for (int k = 1; k <= n; k++) {
        gguf_writer *w = gguf_writer_new();
        if (!w) return -1;
        if (k == 1)
            for (int64_t i = 0; i < gguf_n_kv(src); i++) gguf_w_copy_kv(w, src, i);
        gguf_w_set_u16(w, "split.no", (uint16_t)(k - 1 + (o && o->wrong_no_part == k)));
        gguf_w_set_u16(w, "split.count", (uint16_t)(o && o->n_split_key && k == 2 ? o->n_split_key : n));
        gguf_w_set_i32(w, "split.tensors.count", (int32_t)nt + (o ? o->count_delta : 0));
        int64_t a = nt * (k - 1) / n, b = nt * k / n;
        for (int64_t i = a; i < b; i++) {
            const gguf_tensor *t = gguf_tensor_at(src, i);
            gguf_w_add_tensor(w, t->name, t->n_dims, t->ne, t->type, t->data, t->nbytes);
        }
        if (o && o->dup && k == 2) {
            const gguf_tensor *t = gguf_tensor_at(src, 0);
            gguf_w_add_tensor(w, t->name, t->n_dims, t->ne, t->type, t->data, t->nbytes);
        }
        char path[256], err[LM_ERRLEN];
        snprintf(path, sizeof path, "%s/%s-%05d-of-%05d.gguf", dir, prefix, k, n);
        int rc = gguf_writer_write(w, path, err, sizeof err);
        gguf_writer_free(w);
        if (rc) {
            fprintf(stderr, "  %s\n", err);
            return -1;
        }
    }
    return 0;
}

static void part_path(char *out, size_t cap, const char *prefix, int k, int n) {
    snprintf(out, cap, "%s/%s-%05d-of-%05d.gguf", dir, prefix, k, n);
}

static void remove_set(const char *prefix, int n) {
    char p[256];
    for (int k = 1; k <= n; k++) {
        part_path(p, sizeof p, prefix, k, n);
        unlink(p);
    }
}

static void test_tensors(void) {
    char err[LM_ERRLEN], p1[256];
    gguf_ctx *src = gguf_open(SRC, err, sizeof err);
    CHECKF(src, "%s", err);
    CHECK(write_split(src, "m", N_PARTS, NULL) == 0);
    part_path(p1, sizeof p1, "m", 1, N_PARTS);
    gguf_ctx *g = gguf_open(p1, err, sizeof err);
    CHECKF(g, "%s", err);
    CHECK(gguf_n_files(g) == N_PARTS && gguf_n_files(src) == 1);
    CHECK(gguf_n_tensors(g) == gguf_n_tensors(src));
    uint64_t sum = 0;
    for (int k = 1; k <= N_PARTS; k++) {
        char p[256];
        part_path(p, sizeof p, "m", k, N_PARTS);
        FILE *f = fopen(p, "rb");
        CHECK(f && fseek(f, 0, SEEK_END) == 0);
        sum += (uint64_t)ftell(f);
        fclose(f);
    }
    CHECK(gguf_size_all(g) == sum && gguf_file_size(g) < sum);
    for (int64_t i = 0; i < gguf_n_tensors(src); i++) {
        const gguf_tensor *a = gguf_tensor_at(src, i), *b = gguf_find_tensor(g, a->name);
        CHECKF(b, "tensor %s missing", a->name);
        CHECK(b->type == a->type && b->n_dims == a->n_dims && !memcmp(b->ne, a->ne, sizeof a->ne));
        CHECK(b->nbytes == a->nbytes && !memcmp(b->data, a->data, a->nbytes));
    }
    gguf_str s;
    CHECK(gguf_get_str(g, "general.architecture", &s) && gguf_str_eq(s, "llama"));
    gguf_close(g);
    gguf_close(src);
}

/* Logits of every position of a fixed prompt, (T, n_vocab). */
static float *logits_of(const char *path, int T, const int32_t *toks, int *V) {
    char err[LM_ERRLEN];
    lm_model *m = model_load(path, err, sizeof err);
    if (!m) {
        fprintf(stderr, "  %s\n", err);
        return NULL;
    }
    lm_pool *pool = pool_new(2);
    fwd_dims d = fwd_dims_make(m, 32, 16);
    kv_config kc;
    fwd_kv_config(m, &d, &kc);
    kc.type = LM_TYPE_F32;
    kc.n_seqs = 1;
    kv_pool *kv = kv_pool_new(&kc, err, sizeof err);
    lm_fwd *f = kv ? fwd_new(m, pool, kv, &d, err, sizeof err) : NULL;
    float *out = NULL;
    kv_seq *s = f ? kv_seq_new(kv, err, sizeof err) : NULL;
    if (s && kv_append(kv, s, T, err, sizeof err) == KV_OK) {
        *V = m->hp.n_vocab;
        out = malloc((size_t)T * (size_t)*V * sizeof(float));
        lm_seg seg = {.seq = s, .pos0 = 0, .n = T, .n_logits = T};
        if (out && fwd_run(f, toks, &seg, 1, out, err, sizeof err) != 0) {
            free(out);
            out = NULL;
        }
    }
    if (!out) fprintf(stderr, "  %s\n", err);
    if (s) kv_seq_free(kv, s);
    fwd_free(f);
    kv_pool_free(kv);
    pool_free(pool);
    model_free(m);
    return out;
}

static void test_logits(void) {
    char p1[256];
    part_path(p1, sizeof p1, "m", 1, N_PARTS);
    const int32_t toks[] = {1, 403, 407, 261, 378, 66, 300, 9, 42, 500};
    int T = 10, va = 0, vb = 0;
    float *a = logits_of(SRC, T, toks, &va), *b = logits_of(p1, T, toks, &vb);
    CHECK(a && b && va == vb && va > 0);
    double sumsq = 0;
    for (size_t i = 0; i < (size_t)T * (size_t)va; i++) sumsq += (double)a[i] * a[i];
    CHECK(sumsq > 0); /* the comparison below compares something */
    CHECK(!memcmp(a, b, (size_t)T * (size_t)va * sizeof(float)));
    free(a);
    free(b);
}

static void test_quantize(void) {
    char p1[256], a[300], b[300], err[LM_ERRLEN];
    part_path(p1, sizeof p1, "m", 1, N_PARTS);
    snprintf(a, sizeof a, "%s/q-whole.gguf", dir);
    snprintf(b, sizeof b, "%s/q-split.gguf", dir);
    CHECKF(quantize_file(SRC, a, "Q8_0", NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    CHECKF(quantize_file(p1, b, "Q8_0", NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    size_t la = 0, lb = 0;
    char *ba = safefile_read(a, &la, err, sizeof err), *bb = safefile_read(b, &lb, err, sizeof err);
    unlink(a);
    unlink(b);
    CHECK(ba && bb && la > 0 && la == lb && !memcmp(ba, bb, la));
    free(ba);
    free(bb);
}

static gguf_ctx *open_status(const char *path, lm_status *st, char *err, size_t errlen) {
    return gguf_open_status(path, st, err, errlen);
}

static void test_refused(void) {
    char err[LM_ERRLEN], p[256], q[256];
    lm_status st;
    /* a later part */
    part_path(p, sizeof p, "m", 2, N_PARTS);
    part_path(q, sizeof q, "m", 1, N_PARTS);
    CHECK(!open_status(p, &st, err, sizeof err));
    CHECKF(st == LM_ERR_INVALID && strstr(err, "give its first part") && strstr(err, q), "%s", err);
    /* a missing part */
    part_path(p, sizeof p, "m", 3, N_PARTS);
    char moved[300];
    snprintf(moved, sizeof moved, "%s/moved.gguf", dir);
    CHECK(rename(p, moved) == 0);
    CHECK(!open_status(q, &st, err, sizeof err));
    CHECKF(st == LM_ERR_IO && strstr(err, "part 3 of 3") && strstr(err, p), "%s", err);
    /* a first part whose name lacks the tail */
    CHECK(rename(q, moved) == 0);
    CHECK(!open_status(moved, &st, err, sizeof err));
    CHECKF(st == LM_ERR_FORMAT && strstr(err, "-00001-of-00003.gguf"), "%s", err);
    unlink(moved);
    remove_set("m", N_PARTS);

    gguf_ctx *src = gguf_open(SRC, err, sizeof err);
    CHECKF(src, "%s", err);
    struct {
        split_opts o;
        const char *want;
    } bad[] = {
        {{.wrong_no_part = 2}, "split.no 2"},
        {{.dup = true}, "in part 2 and in an earlier part"},
        {{.count_delta = 1}, "split.tensors.count"},
        {{.n_split_key = 2}, "split.count"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(write_split(src, "b", N_PARTS, &bad[i].o) == 0);
        part_path(p, sizeof p, "b", 1, N_PARTS);
        gguf_ctx *g = open_status(p, &st, err, sizeof err);
        remove_set("b", N_PARTS);
        CHECKF(!g && st == LM_ERR_FORMAT && strstr(err, bad[i].want), "case %zu: %s", i, err);
    }
    /* split.count 1: a plain file, whatever its name */
    CHECK(write_split(src, "one", 1, NULL) == 0);
    part_path(p, sizeof p, "one", 1, 1);
    gguf_ctx *g = gguf_open(p, err, sizeof err);
    remove_set("one", 1);
    CHECKF(g && gguf_n_files(g) == 1 && gguf_n_tensors(g) == gguf_n_tensors(src), "%s", err);
    gguf_close(g);
    gguf_close(src);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/lamina-test-split-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    TEST_RUN(test_tensors);
    TEST_RUN(test_logits);
    TEST_RUN(test_quantize);
    TEST_RUN(test_refused);
    remove_set("m", N_PARTS);
    rmdir(dir);
    return TEST_DONE();
}
