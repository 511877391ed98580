/*
 * gguf_int.h - what gguf.c and gguf_split.c share, and nothing else does:
 * opening one file, and joining the files of a split model into the
 * context of its first part.
 */
#ifndef LAMINA_GGUF_INT_H
#define LAMINA_GGUF_INT_H

#include "format/gguf.h"

#define GGUF_KEY_SPLIT_NO "split.no"
#define GGUF_KEY_SPLIT_COUNT "split.count"
#define GGUF_KEY_SPLIT_TENSORS "split.tensors.count"

/* gguf_open_status for one file: a split model's first part alone. */
gguf_ctx *gguf_open_one(const char *path, lm_status *status, char *err, size_t errlen);
/* The tensors of parts[0..n) become c's too, after c's own, their data
 * still in the parts' mappings; c owns `parts` and the contexts in it from
 * then on (gguf_close closes them). -1 with a message (a tensor name in two
 * files, no memory), c and the parts unchanged and still the caller's. */
int gguf_join(gguf_ctx *c, gguf_ctx **parts, int n, char *err, size_t errlen);
/* Open the other parts of the split model whose first part is `first`
 * (opened from path, split.count > 1) and join them into it (gguf_split.c).
 * `first` on success; NULL with *status and a message otherwise, `first`
 * closed. */
gguf_ctx *gguf_split_load(gguf_ctx *first, const char *path, lm_status *status, char *err, size_t errlen);

#endif
