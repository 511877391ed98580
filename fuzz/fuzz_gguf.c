/*
 * fuzz_gguf.c - libFuzzer entry for the GGUF reader.
 *
 * Each input is parsed with gguf_open_mem. When it opens, everything the
 * reader hands out is walked: every kv through every typed getter, by index
 * and by key; every array element, nested arrays recursively; every tensor,
 * touching the first and last byte of its data. The sanitizers catch reads
 * out of bounds; the checks below abort on broken invariants (lookups that
 * do not find what was listed, data outside the input, misaligned offsets).
 *
 *   make fuzz    (or: clang -fsanitize=fuzzer,address,undefined ...)
 * Seeds: fuzz/seeds/fuzz_gguf/ (written by tests/data/gguf_bad/make_corpus.py).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "base/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

static void walk_arr(const gguf_arr *a, int depth) {
    if (depth > 8) abort(); /* the reader limits nesting to 8 */
    for (uint64_t i = 0; i < a->n; i++) {
        int64_t v;
        double f;
        gguf_str s;
        gguf_arr sub;
        if (gguf_arr_int(a, i, &v)) sink += (uint64_t)v;
        if (gguf_arr_float(a, i, &f)) sink += f == f;
        if (gguf_arr_str(a, i, &s) && s.len) sink += (uint8_t)s.ptr[0] + (uint8_t)s.ptr[s.len - 1];
        if (gguf_arr_arr(a, i, &sub)) walk_arr(&sub, depth + 1);
    }
    int64_t v;
    if (gguf_arr_int(a, a->n, &v)) abort(); /* one past the end */
}

static void walk_kv(const gguf_ctx *c, int64_t i) {
    gguf_str k = gguf_kv_key(c, i), s;
    char key[65536];
    if (k.len == 0 || k.len >= sizeof key) abort();
    memcpy(key, k.ptr, k.len);
    key[k.len] = 0;
    if (gguf_find_key(c, key) != i) abort();
    int64_t v;
    uint64_t u;
    double f;
    bool b;
    gguf_arr a;
    if (gguf_kv_int(c, i, &v)) sink += (uint64_t)v;
    if (gguf_kv_float(c, i, &f)) sink += f == f;
    if (gguf_kv_str(c, i, &s) && s.len) sink += (uint8_t)s.ptr[0] + (uint8_t)s.ptr[s.len - 1];
    if (gguf_get_int(c, key, &v)) sink += (uint64_t)v;
    if (gguf_get_uint(c, key, &u)) sink += u;
    if (gguf_get_float(c, key, &f)) sink += f == f;
    if (gguf_get_bool(c, key, &b)) sink += b;
    if (gguf_get_str(c, key, &s) && s.len) sink += (uint8_t)s.ptr[s.len - 1];
    if (gguf_kv_arr(c, i, &a)) {
        if (!gguf_get_arr(c, key, &a) || (unsigned)a.type >= GGUF_VTYPE_COUNT) abort();
        walk_arr(&a, 1);
    }
    sink += (uint64_t)gguf_kv_type(c, i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[LM_ERRLEN];
    err[0] = 0;
    gguf_ctx *c = gguf_open_mem(data, size, err, sizeof err);
    if (!c) {
        if (!err[0]) abort(); /* every failure names its reason */
        return 0;
    }
    for (int64_t i = 0; i < gguf_n_kv(c); i++) walk_kv(c, i);
    uint32_t align = gguf_alignment(c);
    for (int64_t i = 0; i < gguf_n_tensors(c); i++) {
        const gguf_tensor *t = gguf_tensor_at(c, i);
        if (gguf_find_tensor(c, t->name) != t) abort();
        const uint8_t *p = t->data;
        if (t->nbytes == 0 || t->offset % align || p < data || p + t->nbytes > data + size) abort();
        sink += p[0] + p[t->nbytes - 1];
    }
    gguf_close(c);
    return 0;
}
