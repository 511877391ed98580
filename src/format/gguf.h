/*
 * gguf.h - reading and writing GGUF files (versions 2 and 3).
 *
 * The format, in prose. A GGUF file is little-endian:
 *   magic "GGUF" (4 bytes), version (u32), tensor count (u64), kv count (u64),
 *   then kv_count metadata entries: key (string), value type (u32), value;
 *   then tensor_count tensor infos: name (string), n_dims (u32, 1..4),
 *   ne[n_dims] (u64 each, ne[0] fastest-varying), ggml type (u32),
 *   offset (u64, relative to the data section, a multiple of the alignment);
 *   then padding to `general.alignment` (default 32), then the data section.
 * A string is a u64 length and that many bytes (no terminator). An array is
 * element type (u32), count (u64), then the elements; arrays may nest.
 * (Version 1 used u32 counts and is not supported.)
 *
 * The reader maps the file (or takes a caller's buffer) and validates
 * everything before handing out a pointer: every length, count, offset and
 * tensor extent is checked against the file size with overflow-safe
 * arithmetic; nothing is allocated in proportion to an unchecked count. A bad
 * file gives NULL and a message naming what is wrong.
 *
 * A split model (llama.cpp's gguf-split: PREFIX-00001-of-0000N.gguf and the
 * files after it, with the split.count / split.no keys) opens from its first
 * part as one context: gguf_open maps every part and finds each tensor in
 * the file that holds it; the metadata is the first part's (gguf_split.c
 * has the rules). gguf_open_mem reads one buffer, never parts.
 *
 * Ownership: strings, arrays and tensor data returned by the reader point into
 * the mapping and live until gguf_close(). Tensor names are NUL-terminated
 * copies owned by the context.
 */
#ifndef LAMINA_GGUF_H
#define LAMINA_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/safefile.h"
#include "lamina.h" /* lm_status */

enum gguf_vtype {
    GGUF_UINT8 = 0,
    GGUF_INT8 = 1,
    GGUF_UINT16 = 2,
    GGUF_INT16 = 3,
    GGUF_UINT32 = 4,
    GGUF_INT32 = 5,
    GGUF_FLOAT32 = 6,
    GGUF_BOOL = 7,
    GGUF_STRING = 8,
    GGUF_ARRAY = 9,
    GGUF_UINT64 = 10,
    GGUF_INT64 = 11,
    GGUF_FLOAT64 = 12,
    GGUF_VTYPE_COUNT
};

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

typedef struct {
    const char *ptr;
    uint64_t len;
} gguf_str; /* not NUL-terminated */

/* An array value: elem_type, n elements. For fixed-size element types `data`
 * points at n packed little-endian elements. String and nested-array elements
 * are reached through gguf_arr_str / gguf_arr_arr (the reader indexes them). */
typedef struct {
    enum gguf_vtype type;
    uint64_t n;
    const void *data;
    const void *index; /* reader-internal: per-element offsets for strings/arrays */
} gguf_arr;

typedef struct {
    char *name; /* NUL-terminated, owned by the context */
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* unused dims are 1 */
    uint32_t type;              /* ggml type id (see quant.h) */
    uint64_t offset;            /* relative to the data section of the file holding it */
    uint64_t nbytes;
    const void *data; /* into the mapping */
} gguf_tensor;

typedef struct gguf_ctx gguf_ctx;

gguf_ctx *gguf_open(const char *path, char *err, size_t errlen);
/* The same, saying what kind of failure it was in *status: LM_ERR_IO (cannot
 * open, read or map the file), LM_ERR_FORMAT (malformed), LM_ERR_UNSUPPORTED
 * (a GGUF version or tensor type lamina does not know), LM_ERR_NOMEM; LM_OK
 * on success. */
gguf_ctx *gguf_open_status(const char *path, lm_status *status, char *err, size_t errlen);
/* Parse a caller-owned buffer (not copied; must outlive the context). */
gguf_ctx *gguf_open_mem(const void *data, size_t size, char *err, size_t errlen);
void gguf_close(gguf_ctx *ctx);

uint32_t gguf_version(const gguf_ctx *ctx);
uint32_t gguf_alignment(const gguf_ctx *ctx);
uint64_t gguf_file_size(const gguf_ctx *ctx);
uint64_t gguf_data_offset(const gguf_ctx *ctx); /* absolute offset of the data section */
/* The files a context maps: 1, or a split model's parts; and their bytes
 * together (gguf_file_size is the first file's). */
int gguf_n_files(const gguf_ctx *ctx);
uint64_t gguf_size_all(const gguf_ctx *ctx);

/* Metadata. Keys are looked up by exact name; -1 when absent. */
int64_t gguf_n_kv(const gguf_ctx *ctx);
int64_t gguf_find_key(const gguf_ctx *ctx, const char *key);
gguf_str gguf_kv_key(const gguf_ctx *ctx, int64_t i);
enum gguf_vtype gguf_kv_type(const gguf_ctx *ctx, int64_t i);

/* Typed getters by key. They return false when the key is absent or its value
 * cannot be represented as asked (get_int takes any integer type and bool,
 * get_float any integer or float type). */
bool gguf_get_int(const gguf_ctx *ctx, const char *key, int64_t *out);
bool gguf_get_uint(const gguf_ctx *ctx, const char *key, uint64_t *out);
bool gguf_get_float(const gguf_ctx *ctx, const char *key, double *out);
bool gguf_get_bool(const gguf_ctx *ctx, const char *key, bool *out);
bool gguf_get_str(const gguf_ctx *ctx, const char *key, gguf_str *out);
bool gguf_get_arr(const gguf_ctx *ctx, const char *key, gguf_arr *out);

/* The same, by kv index (for listing everything, e.g. `lamina info`). */
bool gguf_kv_int(const gguf_ctx *ctx, int64_t i, int64_t *out);
bool gguf_kv_float(const gguf_ctx *ctx, int64_t i, double *out);
bool gguf_kv_str(const gguf_ctx *ctx, int64_t i, gguf_str *out);
bool gguf_kv_arr(const gguf_ctx *ctx, int64_t i, gguf_arr *out);

/* Array element access; i must be < arr->n. Numeric getters convert like the
 * typed getters above and return false on a type that cannot convert. */
bool gguf_arr_int(const gguf_arr *arr, uint64_t i, int64_t *out);
bool gguf_arr_float(const gguf_arr *arr, uint64_t i, double *out);
bool gguf_arr_str(const gguf_arr *arr, uint64_t i, gguf_str *out);
bool gguf_arr_arr(const gguf_arr *arr, uint64_t i, gguf_arr *out);

/* Tensors. */
int64_t gguf_n_tensors(const gguf_ctx *ctx);
const gguf_tensor *gguf_tensor_at(const gguf_ctx *ctx, int64_t i);
const gguf_tensor *gguf_find_tensor(const gguf_ctx *ctx, const char *name);

/* Compare a gguf_str with a C string. */
bool gguf_str_eq(gguf_str s, const char *cstr);
/* Human name of a value type ("uint32", "array", ...). */
const char *gguf_vtype_name(enum gguf_vtype t);

/*
 * Writer: collect metadata and tensors, then write a version-3 file.
 * Keys keep insertion order; setting an existing key replaces its value.
 * Tensor data is referenced, not copied: it must stay valid until
 * gguf_writer_write() returns. Tensors are laid out in insertion order at
 * the writer's alignment (general.alignment if set, else 32).
 */
typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_new(void);
void gguf_writer_free(gguf_writer *w);

int gguf_w_set_u16(gguf_writer *w, const char *key, uint16_t v);
int gguf_w_set_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_w_set_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_w_set_u64(gguf_writer *w, const char *key, uint64_t v);
int gguf_w_set_f32(gguf_writer *w, const char *key, float v);
int gguf_w_set_bool(gguf_writer *w, const char *key, bool v);
int gguf_w_set_str(gguf_writer *w, const char *key, const char *v);
/* Array of fixed-size elements (any numeric type or bool), copied. */
int gguf_w_set_arr(gguf_writer *w, const char *key, enum gguf_vtype type, const void *data, uint64_t n);
/* Array of strings, copied. */
int gguf_w_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n);
/* Copy one kv (any type, nested arrays included) from a reader. */
int gguf_w_copy_kv(gguf_writer *w, const gguf_ctx *src, int64_t i);
int gguf_w_remove_kv(gguf_writer *w, const char *key);

/* ne[] has n_dims entries, ne[0] fastest-varying; nbytes must equal the
 * size implied by type and ne (checked at write time). */
int gguf_w_add_tensor(gguf_writer *w, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                      const void *data, uint64_t nbytes);

/* Write the file at `path` through a safefile (base/safefile.h): a
 * temporary file beside it, renamed into place only when complete; on any
 * failure the temporary file is removed and `path` is untouched. A path
 * that is a directory, device or FIFO is refused. 0, or -1 with a message. */
int gguf_writer_write(gguf_writer *w, const char *path, char *err, size_t errlen);
/* The same into a safefile the caller created (before its long work, so a
 * bad destination is refused first) and commits or aborts afterwards. */
int gguf_writer_write_file(gguf_writer *w, safefile *f, char *err, size_t errlen);

#endif
