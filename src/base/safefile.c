/*
 * safefile.c - temporary file, fsync, rename (see safefile.h).
 *
 * Invariants: a safefile owns exactly one path on disk, its temporary file,
 * from safefile_create until commit or abort; no other path is ever
 * unlinked, opened for writing or truncated here. The temporary file is
 * created with O_EXCL, so it cannot be anything that existed before; the
 * one exception is safefile_resume's ".NAME.partial", a name only lamina
 * gives, opened without following links and only when it is a regular file.
 * Live temporary files are also listed in a small static table (copies of
 * their paths) so that safefile_remove_temps can unlink them from a signal
 * handler, using only unlink and atomic loads.
 *
 * A temporary file is flock'ed by its writer from the moment it exists (a
 * cleaner that removed it in the instant between the creating open and the
 * flock is noticed: the name no longer leads to the writer's file, and the
 * writer takes another name). The cleaner unlinks only a file whose lock it
 * holds and that its name still leads to.
 */
#include "base/safefile.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/util.h"

struct safefile {
    char *path; /* as given, for messages */
    char *dest; /* the file that is replaced (symbolic links resolved) */
    char *dir;  /* dest's folder */
    char *tmp;  /* the temporary file, owned */
    FILE *fp;
    int failed; /* errno of the first failed write, 0 if none */
    int slot;   /* index in live[], -1 if none */
};

static atomic_long fail_after = -1;

/* The temporary files alive now, for safefile_remove_temps from a signal
 * handler: each slot holds a copy of the path (never freed or changed while
 * `used` is set), so the handler reads no memory that may be freed. */
#define N_LIVE 8
static struct {
    atomic_int used;
    char path[4096];
} live[N_LIVE];

static int live_add(const char *tmp) {
    if (strlen(tmp) >= sizeof live[0].path) return -1;
    for (int i = 0; i < N_LIVE; i++) {
        int expect = 0;
        if (atomic_compare_exchange_strong(&live[i].used, &expect, 2)) { /* 2: being filled */
            strcpy(live[i].path, tmp);
            atomic_store(&live[i].used, 1);
            return i;
        }
    }
    return -1; /* more than N_LIVE at once: not covered by the signal cleanup */
}

static void live_drop(int slot) {
    if (slot >= 0) atomic_store(&live[slot].used, 0);
}

void safefile_remove_temps(void) {
    for (int i = 0; i < N_LIVE; i++)
        if (atomic_load(&live[i].used) == 1) unlink(live[i].path);
}

void safefile_fail_after(long n) { atomic_store(&fail_after, n < 0 ? -1 : n); }

/* The inputs noted so far: device, inode and the path for messages. */
static struct {
    pthread_mutex_t mu;
    int n;
    dev_t dev[SAFEFILE_MAX_INPUTS];
    ino_t ino[SAFEFILE_MAX_INPUTS];
    char *path[SAFEFILE_MAX_INPUTS];
} inputs = {.mu = PTHREAD_MUTEX_INITIALIZER};

static atomic_bool guarding;

void safefile_guard_inputs(void) { atomic_store(&guarding, true); }

void safefile_note_input(const char *path) {
    struct stat st;
    if (!atomic_load(&guarding) || !path || stat(path, &st) != 0) return;
    pthread_mutex_lock(&inputs.mu);
    bool known = false;
    for (int i = 0; i < inputs.n; i++) known |= inputs.dev[i] == st.st_dev && inputs.ino[i] == st.st_ino;
    if (!known && inputs.n < SAFEFILE_MAX_INPUTS) {
        char *copy = lm_strndup(path, strlen(path));
        if (copy) {
            inputs.dev[inputs.n] = st.st_dev;
            inputs.ino[inputs.n] = st.st_ino;
            inputs.path[inputs.n++] = copy;
        }
    }
    pthread_mutex_unlock(&inputs.mu);
}

void safefile_forget_inputs(void) {
    pthread_mutex_lock(&inputs.mu);
    for (int i = 0; i < inputs.n; i++) lm_free(inputs.path[i]);
    inputs.n = 0;
    pthread_mutex_unlock(&inputs.mu);
}

/* -1 with a message when `out` (stat'ed as st) is a noted input. */
static int check_not_input(const char *out, const struct stat *st, char *err, size_t errlen) {
    int rc = 0;
    pthread_mutex_lock(&inputs.mu);
    for (int i = 0; i < inputs.n && !rc; i++)
        if (inputs.dev[i] == st->st_dev && inputs.ino[i] == st->st_ino)
            rc = lm_err(err, errlen, "output %s is the input %s (the same file); write to another path", out,
                        inputs.path[i]);
    pthread_mutex_unlock(&inputs.mu);
    return rc;
}

static const char *kind_of(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

static void sf_free(safefile *f) {
    if (!f) return;
    lm_free(f->path);
    lm_free(f->dest);
    lm_free(f->dir);
    lm_free(f->tmp);
    lm_free(f);
}

/* Resolve dest (following a symbolic link) and split off its folder. */
static int resolve(safefile *f, const char *path, struct stat *st, bool *exists, char *err, size_t errlen) {
    struct stat lst;
    *exists = false;
    if (lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode)) {
        char *real = realpath(path, NULL);
        if (!real) return lm_err(err, errlen, "%s: a symbolic link that cannot be followed: %s", path, strerror(errno));
        f->dest = lm_strndup(real, strlen(real));
        free(real);
    } else {
        f->dest = lm_strndup(path, strlen(path));
    }
    if (!f->dest) return lm_err(err, errlen, "%s: out of memory", path);
    if (stat(f->dest, st) == 0) {
        if (!S_ISREG(st->st_mode))
            return lm_err(err, errlen, "%s: is %s, not a regular file; lamina will not write over it", path,
                          kind_of(st->st_mode));
        if (check_not_input(path, st, err, errlen)) return -1;
        *exists = true;
    } else if (errno != ENOENT) {
        return lm_err(err, errlen, "%s: cannot create the output there: %s", path, strerror(errno));
    }
    const char *slash = strrchr(f->dest, '/');
    if (!slash) f->dir = lm_strndup(".", 1);
    else f->dir = lm_strndup(f->dest, slash == f->dest ? 1 : (size_t)(slash - f->dest));
    if (!f->dir) return lm_err(err, errlen, "%s: out of memory", path);
    return 0;
}

/* Whether name is ".BASE.tmp-XXXXXX" (6 hex digits) for the first blen
 * bytes of base. */
static bool is_temp_of(const char *name, const char *base, size_t blen) {
    if (name[0] != '.' || strncmp(name + 1, base, blen) != 0) return false;
    const char *t = name + 1 + blen;
    if (strncmp(t, ".tmp-", 5) != 0) return false;
    t += 5;
    for (int i = 0; i < 6; i++)
        if (!((t[i] >= '0' && t[i] <= '9') || (t[i] >= 'a' && t[i] <= 'f'))) return false;
    return t[6] == 0;
}

/* Remove the temporary files beside dest whose writers are dead: those
 * whose flock can be taken (a live writer holds its own). */
static void remove_stale(const char *dir, const char *base, size_t blen) {
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return;
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!is_temp_of(de->d_name, base, blen)) continue;
        int fd = openat(dfd, de->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) continue;
        struct stat a, b;
        if (fstat(fd, &a) == 0 && S_ISREG(a.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0 &&
            fstatat(dfd, de->d_name, &b, AT_SYMLINK_NOFOLLOW) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
            (void)unlinkat(dfd, de->d_name, 0);
        close(fd);
    }
    closedir(d);
}

/* Create ".NAME.tmp-XXXXXX" beside dest with O_EXCL (mode 0666 less the
 * umask, as fopen would), flock'ed; a few names are tried if one is taken. */
static int make_temp(safefile *f, char *err, size_t errlen) {
    const char *slash = strrchr(f->dest, '/');
    const char *base = slash ? slash + 1 : f->dest;
    size_t blen = strlen(base);
    if (blen > 200) blen = 200; /* keep the name under NAME_MAX */
    remove_stale(f->dir, base, blen);
    size_t cap = strlen(f->dir) + blen + 32;
    f->tmp = lm_malloc(cap);
    if (!f->tmp) return lm_err(err, errlen, "%s: out of memory", f->path);
    static atomic_uint counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int e = 0;
    for (int tries = 0; tries < 64; tries++) {
        uint32_t x = (uint32_t)getpid() * 2654435761u ^ (uint32_t)ts.tv_nsec ^
            (atomic_fetch_add(&counter, 1) + (uint32_t)tries) * 40503u;
        snprintf(f->tmp, cap, "%s/.%.*s.tmp-%06x", f->dir, (int)blen, base, x & 0xffffff);
        int fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0) {
            /* no flock on this filesystem: written all the same, and never
             * taken for a dead writer's (a cleaner cannot lock it either) */
            bool held = flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
            struct stat a, b;
            if (held || fstat(fd, &a) != 0 || stat(f->tmp, &b) != 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
                /* a cleaner took the file before the lock (and removes it): another name */
                e = EEXIST;
                close(fd);
                continue;
            }
            f->slot = live_add(f->tmp);
            f->fp = fdopen(fd, "wb");
            if (!f->fp) {
                e = errno;
                close(fd);
                live_drop(f->slot);
                f->slot = -1;
                unlink(f->tmp);
                break;
            }
            return 0;
        }
        e = errno;
        if (e != EEXIST) break;
    }
    lm_free(f->tmp);
    f->tmp = NULL;
    return lm_err(err, errlen, "%s: cannot create a file in the folder %s: %s", f->path, f->dir, strerror(e));
}

/* A guard for path with nothing opened yet (the LAMINA_WRITE_FAIL_AFTER
 * test hook read), or NULL with err set. */
static safefile *sf_new(const char *path, char *err, size_t errlen) {
    if (!path || !*path) {
        lm_err(err, errlen, "no output path");
        return NULL;
    }
    const char *env = getenv("LAMINA_WRITE_FAIL_AFTER");
    if (env && *env) safefile_fail_after(strtol(env, NULL, 10));
    safefile *f = lm_calloc(1, sizeof *f);
    if (f) f->slot = -1;
    if (!f || !(f->path = lm_strndup(path, strlen(path)))) {
        lm_free(f);
        lm_err(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    return f;
}

safefile *safefile_create(const char *path, char *err, size_t errlen) {
    safefile *f = sf_new(path, err, errlen);
    if (!f) return NULL;
    struct stat st;
    bool exists;
    if (resolve(f, path, &st, &exists, err, errlen) || make_temp(f, err, errlen)) {
        sf_free(f);
        return NULL;
    }
    /* replacing a file keeps its permission bits */
    if (exists) (void)fchmod(fileno(f->fp), st.st_mode & 07777);
    return f;
}

safefile *safefile_resume(const char *path, long long *have, char *err, size_t errlen) {
    *have = 0;
    safefile *f = sf_new(path, err, errlen);
    if (!f) return NULL;
    struct stat st;
    bool exists;
    if (resolve(f, path, &st, &exists, err, errlen)) {
        sf_free(f);
        return NULL;
    }
    const char *slash = strrchr(f->dest, '/');
    const char *base = slash ? slash + 1 : f->dest;
    size_t cap = strlen(f->dir) + strlen(base) + 16;
    if (strlen(base) > 200 || !(f->tmp = lm_malloc(cap))) {
        lm_err(err, errlen, "%s: %s", path, f->tmp ? "out of memory" : "name too long for a partial file");
        sf_free(f);
        return NULL;
    }
    snprintf(f->tmp, cap, "%s/.%s.partial", f->dir, base);
    /* O_NOFOLLOW: a link under the partial name is refused, never followed */
    int fd = open(f->tmp, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
    struct stat ps;
    if (fd < 0 || fstat(fd, &ps) != 0 || !S_ISREG(ps.st_mode)) {
        int e = fd < 0 ? errno : EINVAL;
        lm_err(err, errlen, "%s: cannot open the partial file %s: %s", path, f->tmp,
               fd >= 0 ? "not a regular file" : strerror(e));
        if (fd >= 0) close(fd);
        lm_free(f->tmp);
        f->tmp = NULL; /* not ours to remove */
        sf_free(f);
        return NULL;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
        lm_err(err, errlen, "%s: another process is writing %s", path, f->tmp);
        close(fd);
        lm_free(f->tmp);
        f->tmp = NULL;
        sf_free(f);
        return NULL;
    }
    f->fp = fdopen(fd, "ab");
    if (!f->fp) {
        lm_err(err, errlen, "%s: %s", path, strerror(errno));
        close(fd);
        lm_free(f->tmp);
        f->tmp = NULL;
        sf_free(f);
        return NULL;
    }
    if (exists) (void)fchmod(fd, st.st_mode & 07777);
    *have = (long long)ps.st_size;
    return f;
}

int safefile_restart(safefile *f) {
    if (fflush(f->fp) != 0 || ftruncate(fileno(f->fp), 0) != 0) return -1;
    return 0;
}

void safefile_keep(safefile *f) {
    if (!f) return;
    if (f->fp) fclose(f->fp);
    sf_free(f);
}

int safefile_write(safefile *f, const void *p, size_t n) {
    if (f->failed) {
        errno = f->failed;
        return -1;
    }
    if (n == 0) return 0;
    long left = atomic_load(&fail_after);
    if (left >= 0) {
        if (left == 0) {
            atomic_store(&fail_after, -1);
            f->failed = ENOSPC;
            errno = ENOSPC;
            return -1;
        }
        atomic_store(&fail_after, left - 1);
    }
    if (fwrite(p, 1, n, f->fp) != n) {
        f->failed = errno ? errno : EIO;
        errno = f->failed;
        return -1;
    }
    return 0;
}

const char *safefile_temp(const safefile *f) { return f->tmp; }

const char *safefile_path(const safefile *f) { return f->path; }

FILE *safefile_stream(safefile *f) { return f->fp; }

void safefile_abort(safefile *f) {
    if (!f) return;
    if (f->fp) fclose(f->fp);
    if (f->tmp) unlink(f->tmp);
    live_drop(f->slot);
    sf_free(f);
}

int safefile_commit(safefile *f, char *err, size_t errlen) {
    int e = f->failed;
    const char *what = "write failed";
    if (!e && fflush(f->fp) != 0) e = errno;
    if (!e && ferror(f->fp)) e = EIO;
    /* an input read after the output was created */
    struct stat st;
    if (!e && stat(f->dest, &st) == 0 && check_not_input(f->path, &st, err, errlen)) {
        safefile_abort(f);
        return -1;
    }
    if (!e && fsync(fileno(f->fp)) != 0) e = errno, what = "fsync failed";
    if (!e) { /* the file the path names now, should a program have replaced ours (safefile_temp) */
        int fd = open(f->tmp, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || fsync(fd) != 0) e = errno, what = "fsync failed";
        if (fd >= 0) close(fd);
    }
    int closed = fclose(f->fp);
    f->fp = NULL;
    if (!e && closed != 0) e = errno;
    if (!e) {
        live_drop(f->slot); /* a signal from here on leaves the finished file */
        f->slot = -1;
        if (rename(f->tmp, f->dest) != 0) e = errno, what = "cannot rename the finished file into place";
    }
    if (e) {
        lm_err(err, errlen, "%s: %s: %s (nothing written; the destination is untouched)", f->path, what, strerror(e));
        safefile_abort(f);
        return -1;
    }
    /* the rename itself is durable once the folder is synced */
    int dfd = open(f->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    lm_free(f->tmp);
    f->tmp = NULL;
    sf_free(f);
    return 0;
}

int safefile_check_distinct(const char *in, const char *out, char *err, size_t errlen) {
    struct stat a, b;
    if (!in || !out || stat(in, &a) != 0 || stat(out, &b) != 0) return 0;
    if (a.st_dev == b.st_dev && a.st_ino == b.st_ino)
        return lm_err(err, errlen, "output %s is the input %s (the same file); write to another path", out, in);
    return 0;
}

/* Read fd to its end into a growing buffer (start with cap bytes). */
static char *read_fd(int fd, size_t cap, size_t *len, const char *name, char *err, size_t errlen) {
    size_t n = 0;
    if (cap < 4096) cap = 4096;
    char *buf = lm_malloc(cap + 1);
    if (!buf) goto nomem;
    for (;;) {
        if (n == cap) {
            if (cap > SIZE_MAX / 2 - 1) goto nomem;
            char *nb = lm_realloc(buf, cap * 2 + 1);
            if (!nb) goto nomem;
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            lm_err(err, errlen, "%s: cannot read: %s", name, strerror(errno));
            lm_free(buf);
            return NULL;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    buf[n] = 0;
    *len = n;
    return buf;
nomem:
    lm_free(buf);
    lm_err(err, errlen, "%s: out of memory", name);
    return NULL;
}

char *safefile_read(const char *path, size_t *len, char *err, size_t errlen) {
    struct stat st;
    if (!path) {
        if (fstat(0, &st) != 0) {
            lm_err(err, errlen, "standard input: cannot read: %s", strerror(errno));
            return NULL;
        }
        if (S_ISDIR(st.st_mode)) {
            lm_err(err, errlen, "standard input is a directory, not text");
            return NULL;
        }
        return read_fd(0, S_ISREG(st.st_mode) ? (size_t)st.st_size : 0, len, "standard input", err, errlen);
    }
    /* O_NONBLOCK: opening a FIFO must not wait for a writer */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        lm_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    if (fstat(fd, &st) != 0) {
        lm_err(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        if (S_ISFIFO(st.st_mode))
            lm_err(err, errlen, "%s: is a FIFO, not a file (pipe it to standard input instead)", path);
        else lm_err(err, errlen, "%s: is %s, not a file", path, kind_of(st.st_mode));
        close(fd);
        return NULL;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    safefile_note_input(path);
    char *buf = read_fd(fd, (size_t)st.st_size, len, path, err, errlen);
    close(fd);
    return buf;
}
