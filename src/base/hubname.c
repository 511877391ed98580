/*
 * hubname.c - hub model names and picking a file by tag (see hubname.h).
 */
#include "base/hubname.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "base/util.h"

static bool part_char(char c) { return isalnum((unsigned char)c) || c == '.' || c == '_' || c == '-'; }

/* OWNER or REPO: [A-Za-z0-9][A-Za-z0-9._-]*, no "..". */
static int check_part(const char *what, const char *s, size_t len, char *err, size_t errlen) {
    if (len == 0) return lm_err(err, errlen, "the %s is empty", what);
    if (len > HUB_PART_MAX) return lm_err(err, errlen, "the %s is longer than %d characters", what, HUB_PART_MAX);
    if (!isalnum((unsigned char)s[0])) return lm_err(err, errlen, "the %s must start with a letter or digit", what);
    for (size_t i = 0; i < len; i++) {
        if (!part_char(s[i])) return lm_err(err, errlen, "the %s holds a character not allowed in a name", what);
        if (i + 1 < len && s[i] == '.' && s[i + 1] == '.') return lm_err(err, errlen, "the %s holds \"..\"", what);
    }
    return 0;
}

static int check_path(const char *s, size_t len, char *err, size_t errlen) {
    if (len > HUB_PATH_MAX) return lm_err(err, errlen, "the file path is longer than %d characters", HUB_PATH_MAX);
    if (len < 6 || strncmp(s + len - 5, ".gguf", 5) != 0) return lm_err(err, errlen, "the file must be a .gguf file");
    if (memmem(s, len, "..", 2)) return lm_err(err, errlen, "the file path holds \"..\"");
    size_t seg = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i == len || s[i] == '/') {
            if (seg == 0) return lm_err(err, errlen, "the file path has an empty folder name");
            if (seg > 255) return lm_err(err, errlen, "a part of the file path is longer than 255 characters");
            seg = 0;
            continue;
        }
        if (seg == 0 && s[i] == '.') return lm_err(err, errlen, "a part of the file path starts with '.'");
        if (!part_char(s[i]) && s[i] != '+')
            return lm_err(err, errlen, "the file path holds a character not allowed in a name");
        seg++;
    }
    return 0;
}

static int check_tag(const char *s, size_t len, char *err, size_t errlen) {
    if (len == 0) return lm_err(err, errlen, "the tag after ':' is empty");
    if (len > HUB_TAG_MAX) return lm_err(err, errlen, "the tag is longer than %d characters", HUB_TAG_MAX);
    if (!isalnum((unsigned char)s[0])) return lm_err(err, errlen, "the tag must start with a letter or digit");
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-' && s[i] != '.')
            return lm_err(err, errlen, "the tag holds a character other than letters, digits, '_', '-', '.'");
    if (strstr(s, "..")) return lm_err(err, errlen, "the tag holds \"..\"");
    return 0;
}

int hub_name_parse(const char *s, hub_name *n, char *err, size_t errlen) {
    memset(n, 0, sizeof *n);
    if (!s || !*s) return lm_err(err, errlen, "no model name");
    const char *full = s;
    if (!strncmp(s, "hf://", 5)) s += 5;
    const char *slash = strchr(s, '/');
    if (!slash)
        return lm_err(err, errlen, "'%.200s': not a hub name (hf://OWNER/REPO/FILE.gguf or OWNER/REPO:TAG)", full);
    size_t olen = (size_t)(slash - s);
    if (check_part("owner", s, olen, err, errlen)) goto bad;
    const char *r = slash + 1;
    size_t rlen = strcspn(r, "/:");
    if (check_part("repository", r, rlen, err, errlen)) goto bad;
    const char *rest = r + rlen;
    if (*rest == ':') {
        size_t tlen = strlen(rest + 1);
        if (check_tag(rest + 1, tlen, err, errlen)) goto bad;
        memcpy(n->tag, rest + 1, tlen);
    } else if (*rest == '/') {
        size_t plen = strlen(rest + 1);
        if (check_path(rest + 1, plen, err, errlen)) goto bad;
        memcpy(n->path, rest + 1, plen);
    }
    memcpy(n->owner, s, olen);
    memcpy(n->repo, r, rlen);
    return 0;
bad:;
    char why[160];
    snprintf(why, sizeof why, "%s", err);
    memset(n, 0, sizeof *n);
    return lm_err(err, errlen, "'%.200s': %s", full, why);
}

bool hub_name_like(const char *s) {
    if (!s) return false;
    if (!strncmp(s, "hf://", 5)) return true;
    const char *slash = strchr(s, '/');
    if (!slash || strchr(slash + 1, '/')) return false;
    return strchr(slash + 1, ':') != NULL;
}

static bool contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

bool hub_split_info(const char *path, int *index, int *count) {
    *index = *count = 1;
    size_t len = strlen(path);
    const char *tail = "-00000-of-00000.gguf";
    size_t tl = strlen(tail);
    if (len < tl) return false;
    const char *t = path + len - tl;
    for (size_t i = 0; i < tl; i++) {
        bool digit = tail[i] == '0';
        if (digit ? !isdigit((unsigned char)t[i]) : t[i] != tail[i]) return false;
    }
    int a = 0, b = 0;
    for (int i = 1; i <= 5; i++) a = a * 10 + (t[i] - '0');
    for (int i = 10; i <= 14; i++) b = b * 10 + (t[i] - '0');
    if (a < 1 || b < 1 || a > b) return false;
    *index = a;
    *count = b;
    return true;
}

int hub_split_name(char *out, size_t cap, const char *path, int index) {
    int idx, cnt;
    if (!hub_split_info(path, &idx, &cnt) || index < 1 || index > cnt) return -1;
    size_t plen = strlen(path) - strlen("-00000-of-00000.gguf");
    int w = snprintf(out, cap, "%.*s-%05d-of-%05d.gguf", (int)plen, path, index, cnt);
    return w < 0 || (size_t)w >= cap ? -1 : 0;
}

bool hub_is_model(const char *path) {
    size_t len = strlen(path);
    if (len < 5 || strcmp(path + len - 5, ".gguf") != 0) return false;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (contains(base, "mmproj") || contains(base, "imatrix") || contains(base, "mtp-") || contains(base, "eagle3-") ||
        contains(base, "dflash-") || contains(base, "dspark-"))
        return false;
    int idx, cnt;
    hub_split_info(path, &idx, &cnt);
    return idx == 1;
}

bool hub_tag_matches(const char *path, const char *tag) {
    size_t tl = strlen(tag);
    if (tl == 0) return false;
    for (const char *p = path; *p; p++) {
        size_t i = 0;
        while (i < tl && p[i] && tolower((unsigned char)p[i]) == tolower((unsigned char)tag[i])) i++;
        if (i == tl && (p[tl] == '.' || p[tl] == '-')) return true;
    }
    return false;
}

int hub_pick(const char *const *paths, int n, const char *tag) {
    static const char *const dflt[] = {"Q4_K_M", "Q8_0"};
    bool have_tag = tag && *tag;
    int nt = have_tag ? 1 : 2;
    for (int t = 0; t < nt; t++) {
        const char *want = have_tag ? tag : dflt[t];
        for (int i = 0; i < n; i++)
            if (hub_is_model(paths[i]) && hub_tag_matches(paths[i], want)) return i;
    }
    if (!have_tag)
        for (int i = 0; i < n; i++)
            if (hub_is_model(paths[i])) return i;
    return -1;
}
