/*
 * cmd_pull.c - lamina pull, lamina list, lamina rm: model files fetched by
 * name from a Hugging Face style hub into a local cache, and the -m of every
 * command given such a name (cli_resolve_models).
 *
 * The cache. $LAMINA_CACHE/models, else ~/.cache/lamina/models; a file
 * hf://OWNER/REPO/PATH is CACHE/OWNER/REPO/PATH, so two repositories never
 * share a name. Names are checked by hub_name_parse (base/hubname.h), which
 * refuses "..", absolute paths and every character outside the name sets,
 * so no name leads outside the cache.
 *
 * The hub. HF_ENDPOINT (default https://huggingface.co) is its address.
 * A tag (OWNER/REPO:Q4_K_M) is picked (hub_pick) from the listing
 * GET /api/models/OWNER/REPO/tree/main?recursive=true, page after page
 * while an answer names the next one (Link: <URL>; rel="next"; at most
 * LISTING_PAGES, each on the hub's own address); a file is downloaded
 * from /OWNER/REPO/resolve/main/PATH, following redirects (the hub sends
 * large files to a CDN host). With HF_TOKEN set, "Authorization: Bearer
 * TOKEN" goes to the hub; libcurl drops it on a redirect to another host
 * or port (the CDN's signed address needs none), so the token never leaves
 * the hub.
 *
 * A download writes ".PATH.partial" beside the final name
 * (safefile_resume: never the final name). An interrupted download keeps
 * it, and the next pull asks for the rest with "Range: bytes=N-" (a server
 * that answers 200 with the whole file starts it over; a 416 too). The
 * SHA-256 of the whole file is checked against the one the hub publishes
 * for an LFS file (X-Linked-Etag, else the ETag of the hub's own answer,
 * when it is 64 hex digits) before the file is fsynced and renamed into
 * place; on a mismatch the partial file is removed, nothing is left under
 * the final name and the command fails. A file the hub publishes no SHA-256
 * for is kept with a warning. No data for LAMINA_PULL_TIMEOUT seconds
 * (default 60) ends the download with a message (the partial file kept).
 * Progress: a line on stderr on a terminal (or --progress), else nothing.
 *
 * A split model (PREFIX-0000k-of-0000N.gguf, base/hubname.h) is one model:
 * a tag picks its first part, and pulling any part fetches every part of
 * the set, each one a download of its own as above, the first part last;
 * the path given back is the first part's, from which the loader maps the
 * rest (format/gguf.h). list shows the set once; rm removes every part.
 *
 * The model as the first word (cli_model_word): `lamina run NAME ...` is
 * `lamina run -m NAME ...` for the commands that load one model (run,
 * serve, logits, perplexity, kv, tokenize, info; not bench, whose first
 * word may be its mode). Only the word right after the command, which no
 * flag's value can be, and only without -m: none of these commands takes
 * another word of its own, so nothing else is read as a model (both: a
 * usage error).
 *
 * -m NAME (cli_resolve_models): hf://... or OWNER/REPO:TAG is replaced by
 * the cached file's path before a command parses its flags; a file not in
 * the cache is pulled first, as llama.cpp's -hf does. A tag is looked up in
 * the cache before the hub is asked, so cached models work offline.
 */
#include <errno.h>
#include <stdarg.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "cli.h"
#include "base/hubname.h"
#include "base/safefile.h"
#include "base/sha256.h"
#include "base/util.h"
#include "format/gguf.h"
#include "format/quant.h"

#define PULL_PATH_MAX 4096

/* snprintf, its truncation checked by the callers that care (paths are
 * bounded by the name parser's limits, far below PULL_PATH_MAX). */
static int sfmt(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int sfmt(char *out, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    return n;
}
#define LISTING_MAX (16u << 20) /* bytes of one page of a repository listing */
#define LISTING_PAGES 64        /* pages of one listing followed (Link: rel="next") */

/* CACHE/models into out; -1 with a message when neither variable is set. */
static int cache_root(char *out, size_t cap, char *err, size_t errlen) {
    const char *c = getenv("LAMINA_CACHE");
    const char *home = getenv("HOME");
    int n;
    if (c && *c) n = sfmt(out, cap, "%s/models", c);
    else if (home && *home) n = sfmt(out, cap, "%s/.cache/lamina/models", home);
    else return lm_err(err, errlen, "neither LAMINA_CACHE nor HOME is set: no model cache");
    if (n < 0 || (size_t)n >= cap) return lm_err(err, errlen, "the cache path is too long");
    return 0;
}

static void endpoint(char *out, size_t cap) {
    const char *e = getenv("HF_ENDPOINT");
    sfmt(out, cap, "%s", e && *e ? e : "https://huggingface.co");
    size_t n = strlen(out);
    while (n > 0 && out[n - 1] == '/') out[--n] = 0;
}

/* mkdir -p of the folders of file path p (not p itself). */
static int make_parents(const char *p, char *err, size_t errlen) {
    char buf[PULL_PATH_MAX];
    sfmt(buf, sizeof buf, "%s", p);
    for (char *s = buf + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return lm_err(err, errlen, "cannot create %s: %s", buf, strerror(errno));
        struct stat st;
        if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode)) return lm_err(err, errlen, "%s is not a folder", buf);
        *s = '/';
    }
    return 0;
}

/* ---- HTTP ---- */

typedef struct {
    progress_line prog;
    safefile *out;   /* download: where the body goes */
    sha256_ctx sha;  /* download: over every byte of the file */
    long long have;  /* download: bytes in the partial file before this transfer */
    long long got;   /* bytes of the body received */
    bool started;    /* the final response's status has been checked */
    bool restarted;  /* the server sent the whole file: the partial was emptied */
    bool bad_status; /* a body with an unexpected status */
    char *buf;       /* listing: the body */
    size_t len;
    CURL *h;                              /* download: the transfer, for the status of the answer */
    int n_resp;                           /* status lines seen (one per redirect) */
    char linked_etag[80], first_etag[80]; /* as sent, quotes removed */
    char content_range[80];
    char next[2048]; /* listing: the next page's address (Link: <...>; rel="next"), "" on the last */
} xfer;

/* The address of rel="next" in a Link header's value v[0..len) into out
 * ("" when none, or when it does not fit). */
static void link_next(const char *v, size_t len, char *out, size_t cap) {
    out[0] = 0;
    const char *end = v + len;
    for (const char *p = v; p < end;) {
        const char *lt = memchr(p, '<', (size_t)(end - p));
        if (!lt) return;
        const char *gt = memchr(lt, '>', (size_t)(end - lt));
        if (!gt) return;
        const char *comma = memchr(gt, ',', (size_t)(end - gt));
        const char *stop = comma ? comma : end;
        /* the parameters between '>' and the next link: rel="next" or rel=next */
        for (const char *q = gt; q + 8 <= stop; q++) {
            if (strncasecmp(q, "rel=", 4)) continue;
            const char *r = q + 4 + (q[4] == '"');
            if (r + 4 <= stop && !strncasecmp(r, "next", 4) && (r + 4 == stop || strchr("\"; \t,", r[4]))) {
                size_t ul = (size_t)(gt - lt - 1);
                if (ul < cap) {
                    memcpy(out, lt + 1, ul);
                    out[ul] = 0;
                }
                return;
            }
        }
        p = stop + (comma != NULL);
    }
}

static size_t on_header(char *p, size_t size, size_t n, void *ud) {
    xfer *x = ud;
    size_t len = size * n;
    if (len >= 5 && !strncmp(p, "HTTP/", 5)) {
        x->n_resp++;
        x->content_range[0] = 0;
        x->next[0] = 0;
        return len;
    }
    const char *colon = memchr(p, ':', len);
    if (!colon) return len;
    size_t klen = (size_t)(colon - p);
    const char *v = colon + 1, *end = p + len;
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ')) end--;
    if (end - v >= 2 && v[0] == 'W' && v[1] == '/') v += 2;
    if (end > v && *v == '"') v++;
    if (end > v && end[-1] == '"') end--;
    int vl = (int)(end - v) < 79 ? (int)(end - v) : 79;
    if (klen == 13 && !strncasecmp(p, "X-Linked-Etag", 13)) sfmt(x->linked_etag, sizeof x->linked_etag, "%.*s", vl, v);
    else if (klen == 4 && !strncasecmp(p, "ETag", 4) && x->n_resp == 1)
        sfmt(x->first_etag, sizeof x->first_etag, "%.*s", vl, v);
    else if (klen == 4 && !strncasecmp(p, "Link", 4))
        link_next(colon + 1, (size_t)(p + len - colon - 1), x->next, sizeof x->next);
    else if (klen == 13 && !strncasecmp(p, "Content-Range", 13))
        sfmt(x->content_range, sizeof x->content_range, "%.*s", vl, v);
    return len;
}

static size_t on_listing(char *p, size_t size, size_t n, void *ud) {
    xfer *x = ud;
    size_t len = size * n;
    if (x->len + len > LISTING_MAX) return 0; /* curl fails the transfer */
    char *b = lm_realloc(x->buf, x->len + len + 1);
    if (!b) return 0;
    memcpy(b + x->len, p, len);
    x->buf = b;
    x->len += len;
    b[x->len] = 0;
    return len;
}

static CURL *easy_for(const char *url, struct curl_slist **hd, xfer *x) {
    CURL *h = curl_easy_init();
    if (!h) return NULL;
    const char *tok = getenv("HF_TOKEN");
    *hd = NULL;
    if (tok && *tok) {
        char line[4200];
        sfmt(line, sizeof line, "Authorization: Bearer %s", tok);
        *hd = curl_slist_append(NULL, line);
    }
    const char *t = getenv("LAMINA_PULL_TIMEOUT");
    long timeout = t && *t ? strtol(t, NULL, 10) : 60;
    if (timeout < 1) timeout = 1;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "lamina");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(h, CURLOPT_UNRESTRICTED_AUTH, 0L); /* the token stays with the hub's host */
    curl_easy_setopt(h, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, timeout);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
    if (*hd) curl_easy_setopt(h, CURLOPT_HTTPHEADER, *hd);
    return h;
}

/* The message for a failed transfer: an HTTP status the user can act on,
 * or curl's words. */
static void transfer_error(const char *what, CURLcode rc, long status, const char *cerr, char *err, size_t errlen) {
    if (rc == CURLE_HTTP_RETURNED_ERROR && (status == 401 || status == 403))
        lm_err(err, errlen, "%s: HTTP %ld: the repository is gated or private%s", what, status,
               getenv("HF_TOKEN") && *getenv("HF_TOKEN") ? " and HF_TOKEN does not give access to it"
                                                         : ": set HF_TOKEN to a token that has access");
    else if (rc == CURLE_HTTP_RETURNED_ERROR && status == 404)
        lm_err(err, errlen, "%s: HTTP 404: no such repository or file on the hub", what);
    else if (rc == CURLE_HTTP_RETURNED_ERROR) lm_err(err, errlen, "%s: HTTP %ld", what, status);
    else if (rc == CURLE_OPERATION_TIMEDOUT)
        lm_err(err, errlen, "%s: timed out: %s (LAMINA_PULL_TIMEOUT sets the seconds without data)", what,
               *cerr ? cerr : curl_easy_strerror(rc));
    else lm_err(err, errlen, "%s: %s", what, *cerr ? cerr : curl_easy_strerror(rc));
}

static void free_paths(char **p, int n) {
    for (int i = 0; i < n; i++) lm_free(p[i]);
    lm_free(p);
}

/* Append the file paths of one listing page (a JSON list) to *paths. */
static int take_page(const char *body, char ***paths, int *count, const char *what, char *err, size_t errlen) {
    cJSON *j = body ? cJSON_Parse(body) : NULL;
    if (!cJSON_IsArray(j)) {
        cJSON_Delete(j);
        return lm_err(err, errlen, "%s: the hub's answer is not a JSON list of files", what);
    }
    int more = cJSON_GetArraySize(j);
    char **out = lm_realloc(*paths, ((size_t)*count + (size_t)more + 1) * sizeof *out);
    if (!out) {
        cJSON_Delete(j);
        return lm_err(err, errlen, "out of memory");
    }
    *paths = out;
    const cJSON *it;
    cJSON_ArrayForEach(it, j) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "type");
        const cJSON *path = cJSON_GetObjectItemCaseSensitive(it, "path");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "file") || !cJSON_IsString(path)) continue;
        out[*count] = lm_strndup(path->valuestring, strlen(path->valuestring));
        if (out[*count]) (*count)++;
    }
    cJSON_Delete(j);
    return 0;
}

/* The paths of the repository's files, from its listing: page after page
 * while the hub's answer names a next one (Link: <URL>; rel="next"), at
 * most LISTING_PAGES. A next page must be on the hub (HF_ENDPOINT, or a
 * path on it): the token goes with each request. */
static int fetch_listing(const hub_name *n, char ***paths, int *count, char *err, size_t errlen) {
    char ep[1024], url[2048], cerr[CURL_ERROR_SIZE] = "", what[300];
    endpoint(ep, sizeof ep);
    sfmt(url, sizeof url, "%s/api/models/%s/%s/tree/main?recursive=true", ep, n->owner, n->repo);
    sfmt(what, sizeof what, "listing %s/%s", n->owner, n->repo);
    *paths = NULL;
    *count = 0;
    size_t eplen = strlen(ep);
    for (int page = 0;; page++) {
        if (page == LISTING_PAGES) {
            lm_err(err, errlen, "%s: more than %d pages", what, LISTING_PAGES);
            goto fail;
        }
        xfer x = {0};
        struct curl_slist *hd;
        CURL *h = easy_for(url, &hd, &x);
        if (!h) {
            lm_err(err, errlen, "cannot start a transfer");
            goto fail;
        }
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_listing);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &x);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr);
        CURLcode rc = curl_easy_perform(h);
        long status = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_cleanup(h);
        curl_slist_free_all(hd);
        if (rc != CURLE_OK) {
            lm_free(x.buf);
            transfer_error(what, rc, status, cerr, err, errlen);
            goto fail;
        }
        int bad = take_page(x.buf, paths, count, what, err, errlen);
        lm_free(x.buf);
        if (bad) goto fail;
        if (!x.next[0]) break;
        if (x.next[0] == '/' && x.next[1] != '/') {
            sfmt(url, sizeof url, "%s%s", ep, x.next);
        } else if (!strncmp(x.next, ep, eplen) && x.next[eplen] == '/') {
            sfmt(url, sizeof url, "%s", x.next);
        } else {
            lm_err(err, errlen, "%s: the next page is not on the hub (%.200s)", what, x.next);
            goto fail;
        }
    }
    if (!*paths && !(*paths = lm_calloc(1, sizeof **paths))) return lm_err(err, errlen, "out of memory");
    return 0;
fail:
    free_paths(*paths, *count);
    *paths = NULL;
    *count = 0;
    return -1;
}

static size_t on_body(char *p, size_t size, size_t n, void *ud) {
    xfer *x = ud;
    size_t len = size * n;
    if (!x->started) {
        x->started = true;
        long status = 0;
        curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &status);
        if (status == 200 && x->have > 0) { /* the range was ignored: the whole file again */
            if (safefile_restart(x->out) != 0) return 0;
            sha256_init(&x->sha);
            x->have = 0;
            x->restarted = true;
        } else if (status == 206) {
            long long from = -1;
            if (sscanf(x->content_range, "bytes %lld-", &from) != 1 || from != x->have) {
                x->bad_status = true;
                return 0;
            }
        } else if (status != 200) {
            x->bad_status = true;
            return 0;
        }
    }
    if (safefile_write(x->out, p, len) != 0) return 0;
    sha256_update(&x->sha, p, len);
    x->got += (long long)len;
    return len;
}

static int on_xfer(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ut, curl_off_t un) {
    (void)ut, (void)un;
    xfer *x = ud;
    if (dltotal <= 0) return 0;
    unsigned long long done = (unsigned long long)(x->have + dlnow), total = (unsigned long long)(x->have + dltotal);
    progress_bytes(&x->prog, done, total);
    progress_update(&x->prog, (long long)(done >> 20), (long long)(total >> 20));
    return 0;
}

/* Hash the partial file's first `have` bytes into c. */
static int hash_partial(const char *part, long long have, sha256_ctx *c, char *err, size_t errlen) {
    FILE *f = fopen(part, "rb");
    if (!f) return lm_err(err, errlen, "cannot read %s: %s", part, strerror(errno));
    static unsigned char buf[1 << 16];
    long long left = have;
    while (left > 0) {
        size_t want = left < (long long)sizeof buf ? (size_t)left : sizeof buf;
        size_t got = fread(buf, 1, want, f);
        if (got == 0) break;
        sha256_update(c, buf, got);
        left -= (long long)got;
    }
    fclose(f);
    if (left) return lm_err(err, errlen, "cannot read %s to its end", part);
    return 0;
}

static bool is_sha256_hex(const char *s) {
    if (strlen(s) != 64) return false;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

/* Download n (its path set) into dest. */
static int download(const char *cmd, const hub_name *n, const char *dest, char *err, size_t errlen) {
    if (make_parents(dest, err, errlen)) return -1;
    char ep[1024], url[2048], cerr[CURL_ERROR_SIZE] = "", what[700];
    endpoint(ep, sizeof ep);
    sfmt(url, sizeof url, "%s/%s/%s/resolve/main/%s", ep, n->owner, n->repo, n->path);
    sfmt(what, sizeof what, "%s/%s/%s", n->owner, n->repo, n->path);
    for (int attempt = 0; attempt < 2; attempt++) {
        xfer x = {0};
        x.out = safefile_resume(dest, &x.have, err, errlen);
        if (!x.out) return -1;
        sha256_init(&x.sha);
        if (x.have > 0 && hash_partial(safefile_temp(x.out), x.have, &x.sha, err, errlen)) {
            safefile_keep(x.out);
            return -1;
        }
        struct curl_slist *hd;
        CURL *h = easy_for(url, &hd, &x);
        if (!h) {
            safefile_keep(x.out);
            return lm_err(err, errlen, "cannot start a transfer");
        }
        char range[48];
        sfmt(range, sizeof range, "%lld-", x.have);
        if (x.have > 0) curl_easy_setopt(h, CURLOPT_RANGE, range);
        x.h = h;
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &x);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr);
        curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_xfer);
        curl_easy_setopt(h, CURLOPT_XFERINFODATA, &x);
        progress_begin(&x.prog, cmd, "downloading", "MiB");
        if (x.have > 0) fprintf(stderr, "lamina %s: %s: resuming at byte %lld\n", cmd, what, x.have);
        CURLcode rc = curl_easy_perform(h);
        progress_end(&x.prog);
        long status = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_cleanup(h);
        curl_slist_free_all(hd);
        if (rc == CURLE_HTTP_RETURNED_ERROR && status == 416 && x.have > 0 && attempt == 0) {
            safefile_abort(x.out); /* the range is past the file: start over */
            continue;
        }
        if (rc != CURLE_OK) {
            if (x.bad_status)
                lm_err(err, errlen, "%s: unexpected answer (HTTP %ld, Content-Range '%s')", what, status,
                       x.content_range);
            else transfer_error(what, rc, status, cerr, err, errlen);
            long long kept = x.have + x.got;
            if (kept > 0 && !x.bad_status) {
                size_t l = strlen(err);
                sfmt(err + l, errlen - l, "; %lld bytes kept, 'lamina pull' again resumes", kept);
                safefile_keep(x.out);
            } else {
                safefile_abort(x.out);
            }
            return -1;
        }
        const char *want = is_sha256_hex(x.linked_etag) ? x.linked_etag
            : is_sha256_hex(x.first_etag)               ? x.first_etag
                                                        : NULL;
        uint8_t d[SHA256_LEN];
        sha256_final(&x.sha, d);
        char hex[65];
        for (int i = 0; i < SHA256_LEN; i++) sfmt(hex + 2 * i, 3, "%02x", d[i]);
        if (want && strcmp(hex, want) != 0) {
            safefile_abort(x.out);
            return lm_err(err, errlen,
                          "%s: SHA-256 mismatch: the file's is %s, the hub publishes %s; the download was removed",
                          what, hex, want);
        }
        if (!want)
            fprintf(stderr, "lamina %s: warning: %s: the hub publishes no SHA-256 for this file; not checked\n", cmd,
                    what);
        if (safefile_commit(x.out, err, errlen)) return -1;
        fprintf(stderr, "lamina %s: %s: %lld bytes%s\n", cmd, what, x.have + x.got, want ? ", SHA-256 verified" : "");
        return 0;
    }
    return lm_err(err, errlen, "%s: the server refused the range of the partial file twice", what);
}

/* ---- the cache ---- */

/* The .gguf files under dir (relative to it, sorted), for picking a tag
 * offline and for list. */
static void walk(const char *root, const char *rel, char ***out, int *n, int *cap) {
    char dir[PULL_PATH_MAX];
    sfmt(dir, sizeof dir, "%s%s%s", root, *rel ? "/" : "", rel);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue; /* ".", "..", partial and temporary files */
        char r[PULL_PATH_MAX], full[PULL_PATH_MAX];
        sfmt(r, sizeof r, "%s%s%s", rel, *rel ? "/" : "", de->d_name);
        sfmt(full, sizeof full, "%s/%s", root, r);
        struct stat st;
        if (lstat(full, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) walk(root, r, out, n, cap);
        else if (S_ISREG(st.st_mode) && strlen(r) > 5 && !strcmp(r + strlen(r) - 5, ".gguf")) {
            if (*n == *cap) {
                int nc = *cap ? *cap * 2 : 16;
                char **g = lm_realloc(*out, (size_t)nc * sizeof *g);
                if (!g) break;
                *out = g;
                *cap = nc;
            }
            if (((*out)[*n] = lm_strndup(r, strlen(r)))) (*n)++;
        }
    }
    closedir(d);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Resolve n to a file path (n->path filled) and its place in the cache. With
 * fetch, a file not in the cache is downloaded; offline_first looks for a
 * tag's file in the cache before asking the hub. */
static int resolve_name(const char *cmd, hub_name *n, bool offline_first, char *dest, size_t cap, char *err,
                        size_t errlen) {
    char root[PULL_PATH_MAX];
    if (cache_root(root, sizeof root, err, errlen)) return -1;
    if (!*n->path && offline_first) {
        char repo[PULL_PATH_MAX];
        sfmt(repo, sizeof repo, "%s/%s/%s", root, n->owner, n->repo);
        char **files = NULL;
        int cnt = 0, fcap = 0;
        walk(repo, "", &files, &cnt, &fcap);
        if (cnt) qsort(files, (size_t)cnt, sizeof *files, cmp_str);
        int k = hub_pick((const char *const *)files, cnt, n->tag);
        if (k >= 0) sfmt(n->path, sizeof n->path, "%s", files[k]);
        free_paths(files, cnt);
    }
    if (!*n->path) {
        char **files = NULL;
        int cnt = 0;
        if (fetch_listing(n, &files, &cnt, err, errlen)) return -1;
        int k = hub_pick((const char *const *)files, cnt, n->tag);
        char e2[300];
        if (k < 0) {
            free_paths(files, cnt);
            return lm_err(err, errlen, "%s/%s has no .gguf model file%s%s", n->owner, n->repo,
                          *n->tag ? " of type " : "", n->tag);
        }
        char full[HUB_PATH_MAX + 2 * HUB_PART_MAX + 8];
        sfmt(full, sizeof full, "%s/%s/%s", n->owner, n->repo, files[k]);
        free_paths(files, cnt);
        hub_name picked; /* the hub's listing is checked as any name */
        if (hub_name_parse(full, &picked, e2, sizeof e2))
            return lm_err(err, errlen, "the hub lists a file lamina will not take: %s", e2);
        *n = picked;
    }
    int w = sfmt(dest, cap, "%s/%s/%s/%s", root, n->owner, n->repo, n->path);
    if (w < 0 || (size_t)w >= cap) return lm_err(err, errlen, "the cache path is too long");
    (void)cmd;
    return 0;
}

/* Whether path exists as a regular file. */
static bool is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* n's place in the cache. */
static int cache_path(const hub_name *n, char *dest, size_t cap, char *err, size_t errlen) {
    char root[PULL_PATH_MAX];
    if (cache_root(root, sizeof root, err, errlen)) return -1;
    int w = sfmt(dest, cap, "%s/%s/%s/%s", root, n->owner, n->repo, n->path);
    if (w < 0 || (size_t)w >= cap) return lm_err(err, errlen, "the cache path is too long");
    return 0;
}

/* Fetch what name means into the cache unless it is there; dest: the file
 * to load. A part of a split model (base/hubname.h) brings every part of
 * its set, each downloaded and checked as a file of its own; dest is then
 * the first part's path, from which the loader finds the others. */
static int pull_one(const char *cmd, const char *name, bool offline_first, char *dest, size_t cap, char *err,
                    size_t errlen) {
    hub_name n;
    if (hub_name_parse(name, &n, err, errlen)) return -1;
    if (resolve_name(cmd, &n, offline_first, dest, cap, err, errlen)) return -1;
    int idx, cnt;
    if (!hub_split_info(n.path, &idx, &cnt)) return is_file(dest) ? 0 : download(cmd, &n, dest, err, errlen);
    for (int k = cnt; k >= 1; k--) { /* the first part last: a set whose first part is cached is whole */
        hub_name part = n;
        char d[PULL_PATH_MAX];
        if (hub_split_name(part.path, sizeof part.path, n.path, k) || cache_path(&part, d, sizeof d, err, errlen))
            return lm_err(err, errlen, "%s: the name of part %d is too long", name, k);
        if (!is_file(d) && download(cmd, &part, d, err, errlen)) return -1;
        if (k == 1) sfmt(dest, cap, "%s", d);
    }
    return 0;
}

static void usage_pull(FILE *f) {
    fprintf(f,
            "usage: lamina pull NAME [--progress]\n"
            "  NAME: hf://OWNER/REPO/FILE.gguf, OWNER/REPO:TAG (Q4_K_M, Q8_0, ...) or OWNER/REPO\n"
            "  Downloads into $LAMINA_CACHE/models (else ~/.cache/lamina/models), resumes a\n"
            "  partial download, checks the hub's SHA-256; prints the file's path.\n"
            "  HF_TOKEN: token for gated repositories; HF_ENDPOINT: the hub (https://huggingface.co).\n");
}

/* The one NAME that pull and rm take (and --help); a usage error otherwise. */
static const char *one_name(args *a) {
    const char *name = NULL;
    for (a->i = 1; a->i < a->argc; a->i++) {
        if (is_help(a)) continue;
        if (a->argv[a->i][0] == '-') die_usage(a, "unknown argument '%s'", a->argv[a->i]);
        if (name) die_usage(a, "%s", "one NAME at a time");
        name = a->argv[a->i];
    }
    if (!name) die_usage(a, "%s", "no NAME given");
    return name;
}

int cmd_pull(int argc, char **argv) {
    args a = {argc, argv, 0, "pull", usage_pull};
    const char *name = one_name(&a);
    char dest[PULL_PATH_MAX], err[1024];
    curl_global_init(CURL_GLOBAL_DEFAULT);
    int rc = pull_one("pull", name, false, dest, sizeof dest, err, sizeof err);
    curl_global_cleanup();
    if (rc) fail("pull", err);
    printf("%s\n", dest);
    return 0;
}

static void usage_list(FILE *f) {
    fprintf(f,
            "usage: lamina list\n"
            "  The cached model files: NAME (for -m and rm), size in bytes, type (the\n"
            "  tensor type of most of the weights), and partial downloads.\n");
}

/* The tensor type holding most of the file's bytes, or "?" */
static const char *main_type(const char *path) {
    char err[256];
    gguf_ctx *g = gguf_open(path, err, sizeof err);
    if (!g) return "?";
    static uint64_t by[LM_TYPE_COUNT];
    memset(by, 0, sizeof by);
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        if (t->type < LM_TYPE_COUNT && t->n_dims >= 2) by[t->type] += t->nbytes;
    }
    gguf_close(g);
    int best = -1;
    for (int t = 0; t < LM_TYPE_COUNT; t++)
        if (by[t] && (best < 0 || by[t] > by[best])) best = t;
    return best < 0 ? "?" : quant_type_name((uint32_t)best);
}

int cmd_list(int argc, char **argv) {
    args a = {argc, argv, 0, "list", usage_list};
    for (a.i = 1; a.i < argc; a.i++) {
        if (is_help(&a)) continue;
        die_usage(&a, "unknown argument '%s'", argv[a.i]);
    }
    char root[PULL_PATH_MAX], err[512];
    if (cache_root(root, sizeof root, err, sizeof err)) fail("list", err);
    char **files = NULL;
    int n = 0, cap = 0;
    walk(root, "", &files, &n, &cap);
    if (n) qsort(files, (size_t)n, sizeof *files, cmp_str);
    for (int i = 0; i < n; i++) {
        char full[PULL_PATH_MAX];
        sfmt(full, sizeof full, "%s/%s", root, files[i]);
        struct stat st;
        hub_name hn;
        if (stat(full, &st) != 0 || hub_name_parse(files[i], &hn, err, sizeof err)) continue;
        long long bytes = (long long)st.st_size;
        int idx, cnt;
        if (hub_split_info(files[i], &idx, &cnt)) { /* a split model: one line, its first part's */
            if (idx != 1) continue;
            for (int k = 2; k <= cnt; k++) {
                char part[PULL_PATH_MAX];
                if (hub_split_name(part, sizeof part, full, k) == 0 && stat(part, &st) == 0) bytes += st.st_size;
            }
        }
        printf("%s\t%lld\t%s\n", files[i], bytes, main_type(full));
    }
    free_paths(files, n);
    return 0;
}

static void usage_rm(FILE *f) {
    fprintf(f,
            "usage: lamina rm NAME\n"
            "  Removes one cached model file (NAME as lamina list prints it, or any\n"
            "  name pull takes) and its partial download.\n");
}

static int rm_file(const char *name, const char *root, const hub_name *n);

int cmd_rm(int argc, char **argv) {
    args a = {argc, argv, 0, "rm", usage_rm};
    const char *name = one_name(&a);
    hub_name n;
    char err[1024], root[PULL_PATH_MAX];
    if (hub_name_parse(name, &n, err, sizeof err)) fail("rm", err);
    if (cache_root(root, sizeof root, err, sizeof err)) fail("rm", err);
    if (!*n.path) { /* a tag: only what the cache holds */
        char repo[PULL_PATH_MAX];
        sfmt(repo, sizeof repo, "%s/%s/%s", root, n.owner, n.repo);
        char **files = NULL;
        int cnt = 0, cap = 0;
        walk(repo, "", &files, &cnt, &cap);
        if (cnt) qsort(files, (size_t)cnt, sizeof *files, cmp_str);
        int k = hub_pick((const char *const *)files, cnt, n.tag);
        if (k >= 0) sfmt(n.path, sizeof n.path, "%s", files[k]);
        free_paths(files, cnt);
        if (k < 0) {
            sfmt(err, sizeof err, "%s: no such model in the cache %s", name, root);
            fail("rm", err);
        }
    }
    int idx, cnt;
    if (!hub_split_info(n.path, &idx, &cnt)) return rm_file(name, root, &n);
    int rc = 1; /* a split model: every part */
    for (int k = 1; k <= cnt; k++) {
        hub_name part = n;
        if (hub_split_name(part.path, sizeof part.path, n.path, k) == 0 && rm_file(NULL, root, &part) == 0) rc = 0;
    }
    if (rc) {
        sfmt(err, sizeof err, "%s: no such model in the cache %s", name, root);
        fail("rm", err);
    }
    return 0;
}

/* Remove n's file and its partial download from the cache (root), and the
 * folders that leaves empty. 0 when there was either; else 1, or with a
 * name, the command fails saying so. */
static int rm_file(const char *name, const char *root, const hub_name *n) {
    char err[1024], dest[PULL_PATH_MAX];
    sfmt(dest, sizeof dest, "%s/%s/%s/%s", root, n->owner, n->repo, n->path);
    const char *slash = strrchr(dest, '/');
    char part[PULL_PATH_MAX];
    sfmt(part, sizeof part, "%.*s/.%s.partial", (int)(slash - dest), dest, slash + 1);
    struct stat st;
    bool had_part = lstat(part, &st) == 0 && S_ISREG(st.st_mode);
    if (had_part) unlink(part);
    if (lstat(dest, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (had_part) return 0;
        if (!name) return 1;
        sfmt(err, sizeof err, "%s: no such model in the cache %s", name, root);
        fail("rm", err);
    }
    if (unlink(dest) != 0) {
        sfmt(err, sizeof err, "cannot remove %s: %s", dest, strerror(errno));
        fail("rm", err);
    }
    /* the folders it leaves empty, up to the cache root */
    char d[PULL_PATH_MAX];
    sfmt(d, sizeof d, "%s", dest);
    for (char *s = strrchr(d, '/'); s && (size_t)(s - d) > strlen(root); s = strrchr(d, '/')) {
        *s = 0;
        if (rmdir(d) != 0) break;
    }
    fprintf(stderr, "lamina rm: removed %s\n", dest);
    return 0;
}

char **cli_model_word(int *argc, char **argv) {
    static const char *const takes[] = {"run", "serve", "logits", "perplexity", "kv", "tokenize", "info"};
    if (*argc < 3 || argv[2][0] == '-' || !argv[2][0]) return argv;
    bool known = false;
    for (size_t i = 0; i < sizeof takes / sizeof takes[0]; i++) known |= !strcmp(argv[1], takes[i]);
    if (!known) return argv;
    for (int i = 3; i < *argc; i++)
        if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) {
            fprintf(stderr, "lamina %s: the model is named twice: '%s' and %s %s\nTry 'lamina %s --help'.\n", argv[1],
                    argv[2], argv[i], i + 1 < *argc ? argv[i + 1] : "", argv[1]);
            exit(2);
        }
    static char **out; /* the new argv, for the rest of the process */
    out = lm_malloc(((size_t)*argc + 2) * sizeof *out);
    if (!out) fail(argv[1], "out of memory");
    out[0] = argv[0];
    out[1] = argv[1];
    out[2] = "-m";
    for (int i = 2; i <= *argc; i++) out[i + 1] = argv[i]; /* argv[argc] is NULL */
    (*argc)++;
    return out;
}

void cli_resolve_models(int argc, char **argv) {
    static char paths[4][PULL_PATH_MAX];
    int used = 0;
    bool inited = false;
    for (int i = 1; i + 1 < argc; i++) {
        const char *f = argv[i];
        if (strcmp(f, "-m") && strcmp(f, "--model") && strcmp(f, "--draft-model")) continue;
        const char *v = argv[i + 1];
        if (!hub_name_like(v) || is_file(v)) continue;
        if (used == 4) fail("pull", "more than 4 hub names in one command");
        char err[1024];
        if (!inited) curl_global_init(CURL_GLOBAL_DEFAULT), inited = true;
        if (pull_one("pull", v, true, paths[used], sizeof paths[used], err, sizeof err)) fail("pull", err);
        argv[i + 1] = paths[used++];
    }
    if (inited) curl_global_cleanup();
}
