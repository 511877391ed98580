/*
 * test_safefile.c - base/safefile and the GGUF writer on top of it:
 *   - a new file and a replaced file get exactly the bytes written, the
 *     replaced one keeps its permission bits, and no temporary file stays;
 *   - a write that fails (fault injection: the n-th write fails with ENOSPC)
 *     leaves an existing destination byte-identical with the same inode and
 *     nothing else in the folder; so does abort;
 *   - gguf_writer_write failed at every one of its writes in turn: each time
 *     the old file is untouched and the folder clean; unfailed, the file
 *     reads back;
 *   - destinations that are a directory, /dev/null, a FIFO, or a path under
 *     a regular file are refused at create, before anything is written;
 *     a symbolic link is followed (the target replaced, the link kept);
 *   - safefile_check_distinct on the same file, a hard link, a symbolic
 *     link, another file and a missing one;
 *   - safefile_read of a file, a directory and a FIFO (which must not block);
 *   - safefile_remove_temps removes live temporary files and nothing else;
 *   - an output that is a noted input (the file itself, a hard or symbolic
 *     link) is refused at create, and at commit for an input read after
 *     create, the input untouched;
 *   - the temporary file of a writer killed with SIGKILL is removed by the
 *     next create of the same output, a live writer's is not, and files of
 *     other names are left alone.
 * These do not depend on permissions, so they hold when run as root.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/safefile.h"
#include "base/util.h"
#include "format/gguf.h"
#include "format/quant.h"
#include "test.h"

static char dir[64];

static void path_in(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", dir, name); }

static int write_text(const char *path, const char *s) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    fputs(s, f);
    return fclose(f);
}

/* Whole file into buf (NUL-terminated); its length, or -1. */
static long read_text(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = 0;
    return (long)n;
}

/* Number of entries in the test folder (temporary files included). */
static int n_entries(void) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    if (d) closedir(d);
    return n;
}

/* Empty the test folder, and forget the inputs noted so far (a new file may
 * reuse a removed one's inode). */
static void clean_dir(void) {
    safefile_forget_inputs();
    DIR *d = opendir(dir);
    char p[512];
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (rmdir(p) != 0) unlink(p);
    }
    if (d) closedir(d);
}

static void test_new_and_replace(void) {
    clean_dir();
    char p[256], buf[256], err[LM_ERRLEN];
    path_in(p, sizeof p, "a.txt");
    safefile *f = safefile_create(p, err, sizeof err);
    CHECKF(f, "%s", err);
    CHECK(access(p, F_OK) != 0); /* nothing at the destination before commit */
    CHECK(safefile_write(f, "hello ", 6) == 0 && safefile_write(f, "world", 5) == 0);
    CHECKF(safefile_commit(f, err, sizeof err) == 0, "%s", err);
    CHECK(read_text(p, buf, sizeof buf) == 11 && !strcmp(buf, "hello world"));
    CHECK(n_entries() == 1);
    CHECK(chmod(p, 0640) == 0);
    f = safefile_create(p, err, sizeof err);
    CHECKF(f, "%s", err);
    CHECK(safefile_write(f, "new", 3) == 0);
    CHECKF(safefile_commit(f, err, sizeof err) == 0, "%s", err);
    struct stat st;
    CHECK(stat(p, &st) == 0 && (st.st_mode & 07777) == 0640);
    CHECK(read_text(p, buf, sizeof buf) == 3 && !strcmp(buf, "new"));
    CHECK(n_entries() == 1);
}

static void test_failed_write_keeps_old(void) {
    clean_dir();
    char p[256], buf[256], err[LM_ERRLEN];
    path_in(p, sizeof p, "keep.txt");
    CHECK(write_text(p, "precious data") == 0);
    struct stat before, after;
    CHECK(stat(p, &before) == 0);
    for (int n = 0; n < 3; n++) {
        safefile *f = safefile_create(p, err, sizeof err);
        CHECKF(f, "%s", err);
        CHECK(n_entries() == 2); /* the temporary file exists */
        safefile_fail_after(n);
        int rc = 0;
        for (int i = 0; i < 3; i++) rc |= safefile_write(f, "xxxx", 4);
        CHECK(rc == -1 && errno == ENOSPC);
        CHECK(safefile_write(f, "y", 1) == -1); /* sticky */
        CHECK(safefile_commit(f, err, sizeof err) == -1);
        CHECKF(strstr(err, "No space left") != NULL, "%s", err);
        CHECK(stat(p, &after) == 0 && after.st_ino == before.st_ino);
        CHECK(read_text(p, buf, sizeof buf) == 13 && !strcmp(buf, "precious data"));
        CHECK(n_entries() == 1);
    }
    safefile_fail_after(-1);
    safefile *f = safefile_create(p, err, sizeof err);
    CHECKF(f, "%s", err);
    CHECK(safefile_write(f, "zzz", 3) == 0);
    safefile_abort(f);
    CHECK(read_text(p, buf, sizeof buf) == 13 && !strcmp(buf, "precious data"));
    CHECK(n_entries() == 1);
}

/* A small GGUF: a few kvs and two tensors. */
static gguf_writer *small_writer(float *data /* (64) */) {
    gguf_writer *w = gguf_writer_new();
    if (!w) return NULL;
    for (int i = 0; i < 64; i++) data[i] = (float)i * 0.5f;
    gguf_w_set_str(w, "general.architecture", "llama");
    gguf_w_set_u32(w, "llama.block_count", 1);
    uint64_t ne[2] = {32, 1}, ne2[2] = {16, 2};
    gguf_w_add_tensor(w, "a.weight", 1, ne, LM_TYPE_F32, data, 32 * 4);
    gguf_w_add_tensor(w, "b.weight", 2, ne2, LM_TYPE_F32, data + 32, 32 * 4);
    return w;
}

static void test_gguf_fail_every_write(void) {
    clean_dir();
    char p[256], buf[256], err[LM_ERRLEN];
    path_in(p, sizeof p, "m.gguf");
    CHECK(write_text(p, "the old model") == 0);
    struct stat before, after;
    CHECK(stat(p, &before) == 0);
    float data[64];
    gguf_writer *w = small_writer(data);
    CHECK(w);
    int n = 0;
    for (;; n++) {
        safefile_fail_after(n);
        int rc = gguf_writer_write(w, p, err, sizeof err);
        safefile_fail_after(-1);
        if (rc == 0) break;
        CHECKF(strstr(err, "No space left") != NULL, "write %d: %s", n, err);
        CHECK(stat(p, &after) == 0 && after.st_ino == before.st_ino);
        CHECK(read_text(p, buf, sizeof buf) == 13 && !strcmp(buf, "the old model"));
        CHECKF(n_entries() == 1, "write %d left a file behind", n);
        CHECK(n < 1000);
    }
    CHECKF(n > 10, "only %d writes", n); /* header, kvs, infos, padding, data: failed at each */
    gguf_writer_free(w);
    gguf_ctx *g = gguf_open(p, err, sizeof err);
    CHECKF(g, "%s", err);
    CHECK(gguf_n_tensors(g) == 2);
    const gguf_tensor *t = gguf_find_tensor(g, "b.weight");
    CHECK(t && !memcmp(t->data, data + 32, 32 * 4));
    gguf_close(g);
    CHECK(n_entries() == 1);
}

static void test_refused_destinations(void) {
    clean_dir();
    char p[256], err[LM_ERRLEN];
    path_in(p, sizeof p, "sub");
    CHECK(mkdir(p, 0755) == 0);
    CHECK(safefile_create(p, err, sizeof err) == NULL);
    CHECKF(strstr(err, "directory") != NULL, "%s", err);
    CHECK(safefile_create("/dev/null", err, sizeof err) == NULL);
    CHECKF(strstr(err, "device") != NULL, "%s", err);
    path_in(p, sizeof p, "fifo");
    CHECK(mkfifo(p, 0644) == 0);
    CHECK(safefile_create(p, err, sizeof err) == NULL);
    CHECKF(strstr(err, "FIFO") != NULL, "%s", err);
    path_in(p, sizeof p, "plain");
    CHECK(write_text(p, "x") == 0);
    path_in(p, sizeof p, "plain/out.gguf");
    CHECK(safefile_create(p, err, sizeof err) == NULL);
    path_in(p, sizeof p, "missing/out.gguf");
    CHECK(safefile_create(p, err, sizeof err) == NULL);
    CHECK(n_entries() == 3); /* sub, fifo, plain: nothing created */
    /* '/dev/null' is still a device */
    struct stat st;
    CHECK(stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode));
}

static void test_symlink_followed(void) {
    clean_dir();
    char p[256], l[256], buf[256], err[LM_ERRLEN];
    path_in(p, sizeof p, "target.txt");
    path_in(l, sizeof l, "link.txt");
    CHECK(write_text(p, "old") == 0);
    CHECK(symlink("target.txt", l) == 0);
    safefile *f = safefile_create(l, err, sizeof err);
    CHECKF(f, "%s", err);
    CHECK(safefile_write(f, "new!", 4) == 0);
    CHECKF(safefile_commit(f, err, sizeof err) == 0, "%s", err);
    struct stat st;
    CHECK(lstat(l, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(read_text(p, buf, sizeof buf) == 4 && !strcmp(buf, "new!"));
    CHECK(n_entries() == 2);
}

static void test_check_distinct(void) {
    clean_dir();
    char a[256], h[256], s[256], o[256], err[LM_ERRLEN];
    path_in(a, sizeof a, "in.gguf");
    path_in(h, sizeof h, "hard.gguf");
    path_in(s, sizeof s, "sym.gguf");
    path_in(o, sizeof o, "other.gguf");
    CHECK(write_text(a, "model") == 0 && write_text(o, "model") == 0);
    CHECK(link(a, h) == 0 && symlink("in.gguf", s) == 0);
    CHECK(safefile_check_distinct(a, a, err, sizeof err) == -1);
    CHECKF(strstr(err, "is the input") != NULL, "%s", err);
    CHECK(safefile_check_distinct(a, h, err, sizeof err) == -1);
    CHECK(safefile_check_distinct(a, s, err, sizeof err) == -1);
    CHECK(safefile_check_distinct(s, a, err, sizeof err) == -1);
    CHECK(safefile_check_distinct(a, o, err, sizeof err) == 0);
    path_in(o, sizeof o, "new.gguf");
    CHECK(safefile_check_distinct(a, o, err, sizeof err) == 0);
}

static void test_read_inputs(void) {
    clean_dir();
    char p[256], err[LM_ERRLEN];
    size_t len = 99;
    path_in(p, sizeof p, "t.txt");
    CHECK(write_text(p, "some text\n") == 0);
    char *s = safefile_read(p, &len, err, sizeof err);
    CHECKF(s, "%s", err);
    CHECK(len == 10 && !strcmp(s, "some text\n"));
    lm_free(s);
    path_in(p, sizeof p, "empty.txt");
    CHECK(write_text(p, "") == 0);
    s = safefile_read(p, &len, err, sizeof err);
    CHECK(s && len == 0 && s[0] == 0);
    lm_free(s);
    CHECK(safefile_read(dir, &len, err, sizeof err) == NULL);
    CHECKF(strstr(err, "directory") != NULL, "%s", err);
    path_in(p, sizeof p, "fifo");
    CHECK(mkfifo(p, 0644) == 0);
    CHECK(safefile_read(p, &len, err, sizeof err) == NULL); /* returns: no writer is waited for */
    CHECKF(strstr(err, "FIFO") != NULL, "%s", err);
    path_in(p, sizeof p, "missing.txt");
    CHECK(safefile_read(p, &len, err, sizeof err) == NULL);
    CHECKF(strstr(err, "cannot open") != NULL, "%s", err);
}

/* safefile_remove_temps (the signal-handler cleanup) removes the live
 * temporary files only: not a committed file, not an existing destination. */
static void test_remove_temps(void) {
    clean_dir();
    char a[256], b[256], c[256], buf[64], err[LM_ERRLEN];
    path_in(a, sizeof a, "a.gguf");
    path_in(b, sizeof b, "b.gguf");
    path_in(c, sizeof c, "c.gguf");
    CHECK(write_text(a, "keep me") == 0);
    safefile *fc = safefile_create(c, err, sizeof err);
    CHECKF(fc, "%s", err);
    CHECK(safefile_write(fc, "done", 4) == 0 && safefile_commit(fc, err, sizeof err) == 0);
    safefile *fa = safefile_create(a, err, sizeof err), *fb = safefile_create(b, err, sizeof err);
    CHECK(fa && fb);
    CHECK(safefile_write(fa, "partial", 7) == 0);
    CHECK(n_entries() == 4);
    safefile_remove_temps();
    CHECK(n_entries() == 2);
    CHECK(read_text(a, buf, sizeof buf) == 7 && !strcmp(buf, "keep me"));
    CHECK(read_text(c, buf, sizeof buf) == 4 && !strcmp(buf, "done"));
    safefile_abort(fa);
    safefile_abort(fb);
    CHECK(n_entries() == 2);
}

static void test_inputs_refused(void) {
    clean_dir();
    safefile_forget_inputs();
    char in[256], hard[256], sym[256], other[256], buf[64], err[LM_ERRLEN];
    path_in(in, sizeof in, "in.txt");
    path_in(hard, sizeof hard, "hard.txt");
    path_in(sym, sizeof sym, "sym.txt");
    path_in(other, sizeof other, "other.txt");
    CHECK(write_text(in, "input") == 0 && link(in, hard) == 0 && symlink("in.txt", sym) == 0);
    size_t len;
    char *text = safefile_read(in, &len, err, sizeof err);
    CHECK(text && len == 5);
    lm_free(text);
    const char *outs[] = {in, hard, sym};
    for (int i = 0; i < 3; i++) {
        err[0] = 0;
        safefile *f = safefile_create(outs[i], err, sizeof err);
        CHECKF(!f && strstr(err, "is the input") != NULL, "%s: %s", outs[i], err);
        safefile_abort(f);
    }
    CHECK(read_text(in, buf, sizeof buf) == 5 && !strcmp(buf, "input") && n_entries() == 3);
    /* an input read after its output was created: refused at commit */
    CHECK(write_text(other, "before") == 0);
    safefile *f = safefile_create(other, err, sizeof err);
    CHECKF(f, "%s", err);
    safefile_note_input(other);
    CHECK(f && safefile_write(f, "after", 5) == 0);
    err[0] = 0;
    CHECKF(f && safefile_commit(f, err, sizeof err) == -1 && strstr(err, "is the input"), "%s", err);
    CHECK(read_text(other, buf, sizeof buf) == 6 && !strcmp(buf, "before") && n_entries() == 4);
    /* forgotten, the same file is an output like any other */
    safefile_forget_inputs();
    f = safefile_create(in, err, sizeof err);
    CHECKF(f, "%s", err);
    CHECK(f && safefile_write(f, "new", 3) == 0 && safefile_commit(f, err, sizeof err) == 0);
    CHECK(read_text(in, buf, sizeof buf) == 3 && !strcmp(buf, "new"));
}

/* The temporary files beside `name` in the test folder. */
static int n_temps_of(const char *name) {
    DIR *d = opendir(dir);
    int n = 0;
    char pre[128];
    snprintf(pre, sizeof pre, ".%s.tmp-", name);
    for (struct dirent *e; d && (e = readdir(d));)
        n += strncmp(e->d_name, pre, strlen(pre)) == 0 && strlen(e->d_name) == strlen(pre) + 6;
    if (d) closedir(d);
    return n;
}

static void test_stale_temps(void) {
    clean_dir();
    safefile_forget_inputs();
    char out[256], decoy1[256], decoy2[256], err[LM_ERRLEN];
    path_in(out, sizeof out, "s.gguf");
    path_in(decoy1, sizeof decoy1, ".t.gguf.tmp-123456"); /* another output's */
    path_in(decoy2, sizeof decoy2, ".s.gguf.tmp-zz");     /* not a name lamina makes */
    CHECK(write_text(decoy1, "x") == 0 && write_text(decoy2, "x") == 0);
    int ready[2];
    CHECK(pipe(ready) == 0);
    pid_t pid = fork();
    if (pid == 0) { /* a writer that stops half-way and waits to be killed */
        safefile *f = safefile_create(out, err, sizeof err);
        if (f) (void)safefile_write(f, "half", 4);
        char c = f ? 1 : 0;
        if (write(ready[1], &c, 1) != 1) _exit(1);
        for (;;) pause();
    }
    char c = 0;
    bool started = pid > 0 && read(ready[0], &c, 1) == 1 && c == 1;
    close(ready[0]);
    close(ready[1]);
    int n_child = n_temps_of("s.gguf");
    /* a live writer's temporary file stays */
    safefile *f = started ? safefile_create(out, err, sizeof err) : NULL;
    int n_both = n_temps_of("s.gguf");
    safefile_abort(f);
    int n_after = n_temps_of("s.gguf");
    /* killed, its file is removed by the next create; the decoys stay */
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    CHECK(started);
    CHECKF(f != NULL, "%s", err);
    CHECK(n_child == 1 && n_both == 2 && n_after == 1);
    f = safefile_create(out, err, sizeof err);
    CHECKF(f, "%s", err);
    CHECK(n_temps_of("s.gguf") == 1); /* only the new writer's */
    CHECK(f && safefile_write(f, "whole", 5) == 0 && safefile_commit(f, err, sizeof err) == 0);
    struct stat st;
    CHECK(n_temps_of("s.gguf") == 0 && stat(decoy1, &st) == 0 && stat(decoy2, &st) == 0);
    CHECK(n_entries() == 3);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/lamina-safefile-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    safefile_guard_inputs();
    TEST_RUN(test_new_and_replace);
    TEST_RUN(test_failed_write_keeps_old);
    TEST_RUN(test_gguf_fail_every_write);
    TEST_RUN(test_refused_destinations);
    TEST_RUN(test_symlink_followed);
    TEST_RUN(test_check_distinct);
    TEST_RUN(test_read_inputs);
    TEST_RUN(test_remove_temps);
    TEST_RUN(test_inputs_refused);
    TEST_RUN(test_stale_temps);
    clean_dir();
    rmdir(dir);
    return TEST_DONE();
}
