/*
 * quantize.h - convert a GGUF model's weight matrices to another type,
 * telling the caller about each tensor (its type asked and written, so a
 * caller can report fallbacks and totals).
 */
#ifndef LAMINA_QUANTIZE_H
#define LAMINA_QUANTIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/pool.h"

/* One tensor as written. want != to is a fallback: the scheme asked for
 * `want`, but a row of row_len elements is not a whole number of its blocks
 * (quant_traits(want)->blck), so the tensor was written as `to` (Q8_0 when
 * rows are a multiple of 32, else F16). 1-D tensors keep their type
 * (want == to == from). */
typedef struct {
    int64_t i, n;            /* index of this tensor, tensors in the file */
    const char *name;        /* borrowed from the input file, valid during the call */
    uint32_t from, want, to; /* the input's type, the scheme's choice, the type written */
    int64_t row_len;         /* elements per row (ne[0]) */
    uint64_t n_elements;
    uint64_t in_bytes, out_bytes;
    uint64_t in_done, in_total; /* input bytes of tensors 0..i, and of all n */
} quantize_tensor_info;

/* Called after each tensor, i = 0 .. n-1 in order (the last call has
 * in_done == in_total): a progress line can show tensor i+1 of n, the
 * bytes and an ETA. */
typedef void (*quantize_progress_fn)(void *user, const quantize_tensor_info *t);

/* Parse a scheme name (F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q6_K
 * Q4_K_M MXFP4): the base
 * type and whether it is the Q4_K_M mix; -1 when unknown. */
int quantize_scheme(const char *name, uint32_t *base, bool *k_m);

/* The general.file_type value GGUF tools write for a scheme (0 if unknown). */
uint32_t quantize_file_type(const char *scheme);

/* Write `out` with every weight matrix of `in` converted under `scheme`,
 * rows split over the pool's threads. Before any work, `out` is refused
 * when it is `in` (same file through any link) or cannot be created; it is
 * written to a temporary file renamed into place only when complete (see
 * base/safefile.h). 0, or -1 with a message and `out` untouched. */
int quantize_file(const char *in, const char *out, const char *scheme, lm_pool *pool, quantize_progress_fn progress,
                  void *user, char *err, size_t errlen);

#endif
