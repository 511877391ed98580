/*
 * test_pull.c - the pieces of `lamina pull` that need no network:
 *   - hub_name_parse on every accepted form (fields checked) and on bad
 *     names: "..", absolute and empty parts, a query, spaces, a missing
 *     ".gguf", over-long parts, a bad tag; plus random bytes and random
 *     mutations of good names (no crash; an accepted name never holds
 *     "..", a leading '/', or a character outside the name sets);
 *   - hub_name_like on -m values;
 *   - hub_pick's choice by tag, the default order (Q4_K_M, Q8_0, first),
 *     mmproj and later split parts skipped;
 *   - split part names: hub_split_info reads "-0000k-of-0000N.gguf" (and
 *     refuses part 0, a part past the count, a short or non-digit tail),
 *     hub_split_name makes every part's name of a set and refuses one
 *     outside it or a buffer too short;
 *   - safefile_resume: a fixed ".NAME.partial" that outlives a keep, is
 *     found again with its size, is emptied by restart, renamed by commit
 *     (no partial left) and removed by abort; a symbolic link under the
 *     partial name is refused.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/hubname.h"
#include "base/safefile.h"
#include "test.h"

static void test_good_names(void) {
    hub_name n;
    char err[256];
    CHECK(hub_name_parse("hf://ggml-org/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q8_0.gguf", &n, err, sizeof err) == 0);
    CHECK(!strcmp(n.owner, "ggml-org") && !strcmp(n.repo, "Qwen3-0.6B-GGUF") &&
          !strcmp(n.path, "Qwen3-0.6B-Q8_0.gguf"));
    CHECK(n.tag[0] == 0);
    CHECK(hub_name_parse("bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M", &n, err, sizeof err) == 0);
    CHECK(!strcmp(n.repo, "Llama-3.2-1B-Instruct-GGUF") && !strcmp(n.tag, "Q4_K_M") && n.path[0] == 0);
    CHECK(hub_name_parse("hf://a/b", &n, err, sizeof err) == 0 && !strcmp(n.owner, "a") && !strcmp(n.repo, "b"));
    CHECK(n.tag[0] == 0 && n.path[0] == 0);
    CHECK(hub_name_parse("o/r/sub/dir/m+x.gguf", &n, err, sizeof err) == 0 && !strcmp(n.path, "sub/dir/m+x.gguf"));
}

static void test_bad_names(void) {
    static const char *bad[] = {
        "",
        "hf://",
        "noslash",
        "/abs/path.gguf",
        "hf:///r/f.gguf",
        "o//f.gguf",
        "o/r/",
        "o/r/../x.gguf",
        "o/r/a/../../x.gguf",
        "../r:Q4",
        "o/../x.gguf",
        "o/r..x:Q4",
        "o/r/.hidden.gguf",
        "o/r/a//b.gguf",
        "o/r/file.bin",
        "o/r/file.gguf?download=1",
        "o/r/fi le.gguf",
        "o/r:",
        "o/r:Q4 K",
        "o/r:Q4/x",
        "o/r:Q4:Q8",
        "-o/r:Q4",
        ".o/r:Q4",
        "o/r\\x.gguf",
        "o/r/x.gguf\n",
        "http://host/o/r/x.gguf",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        hub_name n;
        char err[256] = "";
        int rc = hub_name_parse(bad[i], &n, err, sizeof err);
        CHECKF(rc == -1 && err[0], "'%s' was accepted", bad[i]);
        CHECK(n.owner[0] == 0 && n.path[0] == 0);
    }
    char longp[HUB_PART_MAX + 20];
    memset(longp, 'a', sizeof longp);
    memcpy(longp + HUB_PART_MAX + 1, "/r:Q4", 6);
    hub_name n;
    char err[256];
    CHECK(hub_name_parse(longp, &n, err, sizeof err) == -1);
    memcpy(longp + HUB_PART_MAX, "/r:Q4", 6); /* exactly HUB_PART_MAX */
    CHECK(hub_name_parse(longp, &n, err, sizeof err) == 0);
}

/* An accepted name has only safe fields. */
static int safe_fields(const hub_name *n) {
    const char *f[] = {n->owner, n->repo, n->path, n->tag};
    for (int k = 0; k < 4; k++) {
        if (strstr(f[k], "..") || f[k][0] == '/' || f[k][0] == '.') return 0;
        for (const char *p = f[k]; *p; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                  strchr("._-+/", *p)))
                return 0;
        if (k < 2 && (strchr(f[k], '/') || !f[k][0])) return 0;
    }
    return 1;
}

static void test_fuzz(void) {
    static const char *seeds[] = {"hf://o/r/x.gguf", "o/r:Q4_K_M", "hf://ab/cd/e/f.gguf", "o/r"};
    static const char alpha[] = "ab./:_-+%\\ \x01\xff"
                                "gguf";
    uint64_t s = 0x9e3779b97f4a7c15ull;
    int accepted = 0;
    for (int it = 0; it < 200000; it++) {
        char buf[64];
        size_t len;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        if (it & 1) {
            len = (s >> 33) % 40;
            for (size_t i = 0; i < len; i++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                buf[i] = alpha[(s >> 33) % (sizeof alpha - 1)];
            }
        } else {
            const char *seed = seeds[(s >> 40) % 4];
            len = strlen(seed);
            memcpy(buf, seed, len);
            for (int m = 0; m < 3; m++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                buf[(s >> 33) % len] = alpha[(s >> 20) % (sizeof alpha - 1)];
            }
        }
        buf[len] = 0;
        hub_name n;
        char err[256];
        if (hub_name_parse(buf, &n, err, sizeof err) == 0) {
            accepted++;
            CHECKF(safe_fields(&n), "'%s' accepted with an unsafe field", buf);
        }
    }
    CHECK(accepted > 100); /* the mutations do reach the accepting paths */
}

static void test_like(void) {
    CHECK(hub_name_like("hf://o/r/x.gguf"));
    CHECK(hub_name_like("o/r:Q4_K_M"));
    CHECK(!hub_name_like("models/x.gguf"));
    CHECK(!hub_name_like("/abs/o/r:Q4"));
    CHECK(!hub_name_like("a/b/c:Q4"));
    CHECK(!hub_name_like("x.gguf"));
    CHECK(!hub_name_like(NULL));
}

static void test_pick(void) {
    const char *files[] = {"README.md",
                           "mmproj-model-Q8_0.gguf",
                           "model-Q2_K.gguf",
                           "model-Q8_0.gguf",
                           "big/model-Q4_K_M-00002-of-00002.gguf",
                           "big/model-Q4_K_M-00001-of-00002.gguf",
                           "model-q4_k_m.gguf",
                           "model-Q4_K_S.gguf"};
    int n = 8;
    CHECK(hub_pick(files, n, "Q8_0") == 3);
    CHECK(hub_pick(files, n, "q2_k") == 2);
    CHECK(hub_pick(files, n, "Q4_K_M") == 5); /* first part of the split, listed after the second */
    CHECK(hub_pick(files, n, "Q4_K") == -1);  /* no "Q4_K." or "Q4_K-" */
    CHECK(hub_pick(files, n, "Q6_K") == -1);
    CHECK(hub_pick(files, n, "") == 5);       /* default: Q4_K_M first */
    CHECK(hub_pick(files + 6, 2, NULL) == 0); /* case-insensitive Q4_K_M */
    const char *q8[] = {"a-Q2_K.gguf", "a-Q8_0.gguf"};
    CHECK(hub_pick(q8, 2, NULL) == 1);
    const char *other[] = {"mmproj-f16.gguf", "a-F16.gguf"};
    CHECK(hub_pick(other, 2, NULL) == 1);
    CHECK(hub_pick(other, 1, NULL) == -1);
    CHECK(!hub_is_model("x.gguf.txt") && hub_is_model("d/x.gguf") && !hub_is_model("imatrix.gguf"));
}

static void test_split_names(void) {
    int idx = 0, cnt = 0;
    CHECK(hub_split_info("d/m-Q8_0-00002-of-00003.gguf", &idx, &cnt) && idx == 2 && cnt == 3);
    CHECK(hub_split_info("-00001-of-00001.gguf", &idx, &cnt) && idx == 1 && cnt == 1);
    static const char *plain[] = {"m.gguf",
                                  "m-00000-of-00003.gguf",
                                  "m-00004-of-00003.gguf",
                                  "m-0001-of-00003.gguf",
                                  "m-0000a-of-00003.gguf",
                                  "m-00001-of-00003.gguf.part",
                                  "m-00001_of-00003.gguf"};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        CHECK(!hub_split_info(plain[i], &idx, &cnt));
        CHECK(idx == 1 && cnt == 1);
    }
    char out[64];
    CHECK(hub_split_name(out, sizeof out, "a/m-00002-of-00012.gguf", 1) == 0);
    CHECK(!strcmp(out, "a/m-00001-of-00012.gguf"));
    CHECK(hub_split_name(out, sizeof out, "a/m-00002-of-00012.gguf", 12) == 0);
    CHECK(!strcmp(out, "a/m-00012-of-00012.gguf"));
    CHECK(hub_split_name(out, sizeof out, "a/m-00002-of-00012.gguf", 13) == -1);
    CHECK(hub_split_name(out, sizeof out, "a/m-00002-of-00012.gguf", 0) == -1);
    CHECK(hub_split_name(out, sizeof out, "a/m.gguf", 1) == -1);
    CHECK(hub_split_name(out, 10, "a/m-00002-of-00012.gguf", 1) == -1);
}

static void test_resume(void) {
    char dir[] = "/tmp/lamina-test-pull-XXXXXX";
    CHECK(mkdtemp(dir));
    char dest[256], part[256];
    snprintf(dest, sizeof dest, "%s/m.gguf", dir);
    snprintf(part, sizeof part, "%s/.m.gguf.partial", dir);
    char err[256];
    long long have = -1;
    safefile *f = safefile_resume(dest, &have, err, sizeof err);
    CHECK(f && have == 0);
    CHECK(safefile_write(f, "hello ", 6) == 0);
    safefile_keep(f);
    struct stat st;
    CHECK(stat(part, &st) == 0 && st.st_size == 6 && stat(dest, &st) != 0);
    f = safefile_resume(dest, &have, err, sizeof err);
    CHECK(f && have == 6);
    CHECK(safefile_write(f, "world", 5) == 0);
    CHECK(safefile_commit(f, err, sizeof err) == 0);
    CHECK(stat(part, &st) != 0 && errno == ENOENT);
    size_t len;
    char *got = safefile_read(dest, &len, err, sizeof err);
    CHECK(got && len == 11 && !memcmp(got, "hello world", 11));
    free(got);
    f = safefile_resume(dest, &have, err, sizeof err); /* a new partial beside the finished file */
    CHECK(f && have == 0);
    CHECK(safefile_write(f, "abc", 3) == 0);
    safefile_keep(f);
    f = safefile_resume(dest, &have, err, sizeof err);
    CHECK(f && have == 3);
    CHECK(safefile_restart(f) == 0 && safefile_write(f, "xy", 2) == 0);
    safefile_keep(f);
    CHECK(stat(part, &st) == 0 && st.st_size == 2);
    f = safefile_resume(dest, &have, err, sizeof err);
    CHECK(f && have == 2);
    safefile_abort(f);
    CHECK(stat(part, &st) != 0);
    got = safefile_read(dest, &len, err, sizeof err); /* the finished file untouched */
    CHECK(got && len == 11);
    free(got);
    CHECK(symlink("/etc/passwd", part) == 0);
    f = safefile_resume(dest, &have, err, sizeof err);
    CHECK(!f && strstr(err, "partial"));
    unlink(part);
    unlink(dest);
    rmdir(dir);
}

int main(void) {
    TEST_RUN(test_good_names);
    TEST_RUN(test_bad_names);
    TEST_RUN(test_fuzz);
    TEST_RUN(test_like);
    TEST_RUN(test_pick);
    TEST_RUN(test_split_names);
    TEST_RUN(test_resume);
    return TEST_DONE();
}
