/*
 * hubname.h - names of model files on a Hugging Face style hub, as
 * `lamina pull`, `lamina rm` and every -m take them, and the rules that
 * pick a repository's file by its quantization tag.
 *
 * Accepted forms (parsed by hub_name_parse; nothing else):
 *   hf://OWNER/REPO/PATH.gguf   one file (PATH may have folders)
 *   hf://OWNER/REPO:TAG         the file of that type (Q4_K_M, Q8_0, ...)
 *   hf://OWNER/REPO             the default type (HUB_DEFAULT_TAGS)
 *   the same three without "hf://" (what `lamina list` prints)
 * OWNER and REPO: 1..HUB_PART_MAX bytes of letters, digits, '.', '_', '-',
 * starting with a letter or digit, no "..". PATH: segments of 1..255 such
 * bytes (and '+'), none starting with '.', no ".." anywhere, at most HUB_PATH_MAX bytes in all,
 * ending in ".gguf". TAG: 1..HUB_TAG_MAX letters, digits, '_', '-', '.',
 * starting with a letter or digit, no "..".
 * Anything else - "..", an absolute path, an empty part, a space, a
 * query - is refused with a message, so a name can never leave the cache
 * folder it is joined to.
 *
 * Picking by tag (hub_pick, as llama.cpp's -hf does): among the model files
 * (hub_is_model: ".gguf", not an mmproj, imatrix or draft-head file; of a
 * split file only its first part), the first, in the order given, whose path
 * contains TAG followed by '.' or '-', case-insensitively; with no tag,
 * Q4_K_M, then Q8_0, then the first model file.
 *
 * Split models (llama.cpp's gguf-split): a model cut into N files named
 * PREFIX-00001-of-0000N.gguf ... PREFIX-0000N-of-0000N.gguf (five digits
 * each, parts counted from 1); the first part holds the metadata, every
 * part some of the tensors. hub_split_info reads a name's place in its set,
 * hub_split_name makes the name of another part; the loader
 * (format/gguf.h) and `lamina pull` find the parts by these names.
 *
 * Pure string work: no I/O, no allocation.
 */
#ifndef LAMINA_HUBNAME_H
#define LAMINA_HUBNAME_H

#include <stdbool.h>
#include <stddef.h>

#define HUB_PART_MAX 96
#define HUB_PATH_MAX 512
#define HUB_TAG_MAX 64

typedef struct {
    char owner[HUB_PART_MAX + 1];
    char repo[HUB_PART_MAX + 1];
    char path[HUB_PATH_MAX + 1]; /* "" when a tag (or the default) names the file */
    char tag[HUB_TAG_MAX + 1];   /* "" for the default, or when path is set */
} hub_name;

/* Parse s (any accepted form). 0, or -1 with a message naming what is wrong. */
int hub_name_parse(const char *s, hub_name *n, char *err, size_t errlen);
/* Whether a -m value means the hub: "hf://..." or the OWNER/REPO:TAG shape
 * (exactly one '/', then ':'), which no model file path has. */
bool hub_name_like(const char *s);
/* Whether path is a part of a split model: *index (1-based) and *count
 * from its "-00002-of-00003.gguf" tail (1 <= index <= count); 1 of 1 and
 * false for any other name. */
bool hub_split_info(const char *path, int *index, int *count);
/* The name of part `index` (1..count) of path's split set into out: 0, or
 * -1 when path is not a split part, index is out of range or out is short. */
int hub_split_name(char *out, size_t cap, const char *path, int index);
/* A model file of a repository (see above), by its path in the repository. */
bool hub_is_model(const char *path);
/* Whether path carries tag (TAG then '.' or '-', any case). */
bool hub_tag_matches(const char *path, const char *tag);
/* The index of the file hub_pick takes from paths[0..n) for tag ("" or
 * NULL: the default), -1 if none. */
int hub_pick(const char *const *paths, int n, const char *tag);

#endif
