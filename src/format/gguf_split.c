/*
 * gguf_split.c - a model split over several GGUF files, opened as one.
 *
 * llama.cpp's gguf-split cuts a model into N files named
 * PREFIX-00001-of-0000N.gguf ... PREFIX-0000N-of-0000N.gguf
 * (base/hubname.h: hub_split_info, hub_split_name). Each is a whole GGUF
 * file: the first holds all the model's metadata, every one holds
 * split.no (its place, from 0), split.count (N) and split.tensors.count
 * (the tensors of the whole set), and some of the tensors, whose offsets
 * are relative to that file's own data section. A part may hold no tensor.
 *
 * gguf_open of the first part (split.count > 1, split.no 0) opens and maps
 * every other part by its name beside it, checks each one's split.no and
 * split.count, and joins their tensors into the first part's context
 * (gguf_join): the model loader then finds every tensor by name, its data
 * in the mapping of the file that holds it. The metadata is the first
 * part's; the others' metadata besides the split keys is not read.
 *
 * Refused, each with a message: a later part given instead of the first
 * (naming the first), a name that is not PREFIX-00001-of-0000N.gguf for
 * the N the file says, more than GGUF_SPLIT_MAX parts, a part missing or
 * unreadable (LM_ERR_IO), a part whose split.no or split.count disagree, a
 * tensor in two parts, a tensor count other than split.tensors.count.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/hubname.h"
#include "base/util.h"
#include "format/gguf_int.h"

#define GGUF_SPLIT_MAX 9999 /* parts of one model (each one mapped) */
#define SPLIT_PATH_MAX 4096

gguf_ctx *gguf_split_load(gguf_ctx *first, const char *path, lm_status *status, char *err, size_t errlen) {
    int64_t count = 0, no = -1, want = -1;
    gguf_ctx **parts = NULL;
    int n_open = 0;
    char name[SPLIT_PATH_MAX], msg[LM_ERRLEN];
    *status = LM_ERR_FORMAT;
    gguf_get_int(first, GGUF_KEY_SPLIT_COUNT, &count);
    if (count > GGUF_SPLIT_MAX) {
        lm_err(err, errlen, "%s: split.count %" PRId64 ": more than %d parts", path, count, GGUF_SPLIT_MAX);
        goto fail;
    }
    if (!gguf_get_int(first, GGUF_KEY_SPLIT_NO, &no) || no < 0 || no >= count) {
        lm_err(err, errlen, "%s: split.count is %" PRId64 " but split.no is missing or out of range", path, count);
        goto fail;
    }
    int idx, cnt;
    bool named = hub_split_info(path, &idx, &cnt) && cnt == count && idx == no + 1;
    if (no != 0) {
        if (named && hub_split_name(name, sizeof name, path, 1) == 0)
            lm_err(err, errlen, "%s is part %d of %d of a split model: give its first part, %s", path, idx, cnt, name);
        else lm_err(err, errlen, "%s is part %" PRId64 " of a split model: give its first part", path, no + 1);
        *status = LM_ERR_INVALID;
        goto fail;
    }
    if (!named) {
        lm_err(err, errlen,
               "%s: the first of %" PRId64 " parts of a split model, but its name does not end in -00001-of-%05d.gguf, "
               "by which lamina finds the other parts",
               path, count, (int)count);
        goto fail;
    }
    parts = lm_calloc((size_t)count - 1, sizeof *parts);
    if (!parts) {
        *status = LM_ERR_NOMEM;
        lm_err(err, errlen, "%s: out of memory", path);
        goto fail;
    }
    for (int k = 2; k <= count; k++) {
        if (hub_split_name(name, sizeof name, path, k)) {
            lm_err(err, errlen, "%s: the path is too long", path);
            goto fail;
        }
        gguf_ctx *p = gguf_open_one(name, status, msg, sizeof msg);
        if (!p) {
            lm_err(err, errlen, "part %d of %" PRId64 " of a split model: %s", k, count, msg);
            goto fail;
        }
        parts[n_open++] = p;
        int64_t pno = -1, pcount = -1;
        if (!gguf_get_int(p, GGUF_KEY_SPLIT_NO, &pno) || !gguf_get_int(p, GGUF_KEY_SPLIT_COUNT, &pcount) ||
            pno != k - 1 || pcount != count) {
            *status = LM_ERR_FORMAT;
            lm_err(err, errlen,
                   "%s: split.no %" PRId64 " of split.count %" PRId64 ", where part %d of %" PRId64
                   " should be split.no %d",
                   name, pno, pcount, k, count, k - 1);
            goto fail;
        }
    }
    if (gguf_join(first, parts, n_open, msg, sizeof msg)) {
        *status = LM_ERR_FORMAT;
        lm_err(err, errlen, "%s: split model: %s", path, msg);
        goto fail;
    }
    if (gguf_get_int(first, GGUF_KEY_SPLIT_TENSORS, &want) && want != gguf_n_tensors(first)) {
        *status = LM_ERR_FORMAT;
        lm_err(err, errlen,
               "%s: split model of %" PRId64 " tensors (split.tensors.count) but its %" PRId64 " parts hold %" PRId64,
               path, want, count, gguf_n_tensors(first));
        gguf_close(first); /* it owns the parts now */
        return NULL;
    }
    *status = LM_OK;
    return first;
fail:
    for (int i = 0; i < n_open; i++) gguf_close(parts[i]);
    lm_free(parts);
    gguf_close(first);
    return NULL;
}
