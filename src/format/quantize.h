/*
 * quantize.h - convert a GGUF model's weight matrices to another type.
 */
#ifndef LAMINA_QUANTIZE_H
#define LAMINA_QUANTIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/pool.h"

/* Called after each tensor: index, count, name, source and target types, bytes. */
typedef void (*quantize_progress_fn)(void *user, int64_t i, int64_t n, const char *name, uint32_t from, uint32_t to,
                                     uint64_t in_bytes, uint64_t out_bytes);

/* Parse a scheme name (F32 F16 BF16 Q8_0 Q4_0 Q4_K Q6_K Q4_K_M): the base
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
