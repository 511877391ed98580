/*
 * safefile.h - writing files without ever losing what was there, and
 * reading inputs that are checked to be files.
 *
 * Writing. safefile_create() checks the destination and creates a
 * temporary file beside it (same folder, so the final rename is atomic):
 * ".NAME.tmp-XXXXXX". Writes go to the temporary file; safefile_commit()
 * flushes it, fsyncs it, renames it over the destination and fsyncs the
 * folder. Until the commit succeeds the destination is untouched: a failed
 * write, a failed commit or safefile_abort() removes only the temporary
 * file. lamina never deletes or truncates a path it did not create.
 *
 * The destination may be absent or an existing regular file (its
 * permission bits are kept). Anything else - a directory, a device such as
 * /dev/null or /dev/full, a FIFO, a socket - is refused. A symbolic link is
 * followed: the file it points to is replaced, the link stays. Calling
 * safefile_create() before any long work is the check that the destination
 * folder can be written: it fails at once when it cannot.
 *
 * Never onto an input. Every file the process reads is noted
 * (safefile_note_input: safefile_read, gguf_open and the other readers call
 * it), and an output that is a noted input - the same device and inode,
 * through any hard or symbolic link - is refused, both by safefile_create
 * and, for an input read after it, by safefile_commit (the input then stays
 * as it was). At most SAFEFILE_MAX_INPUTS files are noted per process, far
 * more than any command reads. Noting starts with safefile_guard_inputs(),
 * which the command line calls first: a program that embeds lamina keeps
 * no such list unless it asks for one.
 *
 * Temporary files of dead writers. The writer holds an exclusive flock on
 * its temporary file until commit or abort; the kernel drops it when the
 * process dies, however it dies (SIGKILL included). safefile_create first
 * removes every ".NAME.tmp-XXXXXX" beside the destination whose lock it can
 * take: those of dead writers, never a live one's. A catchable signal is
 * handled by the program (safefile_remove_temps from its handler).
 *
 * Reading. safefile_read() reads a whole input (a named file, or standard
 * input for NULL) and refuses what is not data: a directory, and, for a
 * named file, a FIFO, socket or device (a FIFO would block; pipe it to
 * standard input instead).
 *
 * Resumable writing. safefile_resume() is safefile_create for a long
 * download: its temporary file has a fixed name, ".NAME.partial" beside
 * the destination, that outlives the process, so a later run finds it and
 * goes on from its end (*have bytes). It is never the final name, is
 * flock'ed by its writer like any temporary file (a second live writer is
 * refused), is not removed by safefile_remove_temps (an interrupted
 * download keeps what it has), and is only opened when it is a regular
 * file (not a link). safefile_restart() empties it (the server sent the
 * whole file after all); safefile_keep() closes it, leaving it for the
 * next run; commit and abort work as for safefile_create (abort removes
 * it: a download that failed its check starts over).
 *
 * Fault injection for tests: safefile_fail_after(n) makes the (n+1)-th
 * safefile_write() from now fail with ENOSPC, as a full disk would; a
 * negative n switches it off. The environment variable
 * LAMINA_WRITE_FAIL_AFTER=n does the same for a whole process (read at each
 * safefile_create), so command-line tests can fail a write half-way.
 */
#ifndef LAMINA_SAFEFILE_H
#define LAMINA_SAFEFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef struct safefile safefile;

/* Check `path` as a destination and create its temporary file. NULL with a
 * message when the destination is not a regular file, or its folder cannot
 * hold a new file. */
safefile *safefile_create(const char *path, char *err, size_t errlen);
/* Append n bytes. 0, or -1 with errno set; the failure is sticky (commit
 * then fails and removes the temporary file). */
int safefile_write(safefile *f, const void *p, size_t n);
/* Flush, fsync, rename into place, fsync the folder; frees f. 0, or -1 with
 * a message and the temporary file removed (the destination untouched). */
int safefile_commit(safefile *f, char *err, size_t errlen);
/* Remove the temporary file and free f (NULL is a no-op). */
void safefile_abort(safefile *f);
/* The path given to safefile_create. */
const char *safefile_path(const safefile *f);
/* The temporary file's path, for a program lamina runs to write the file
 * (a picture converter): it must write that path and nothing else; commit
 * then syncs and renames whatever the path holds. */
const char *safefile_temp(const safefile *f);
/* The temporary file as a stdio stream, for text written with fprintf; an
 * error on it fails the commit. Do not close it. */
FILE *safefile_stream(safefile *f);

#define SAFEFILE_MAX_INPUTS 64
/* From now on, note the inputs of this process. */
void safefile_guard_inputs(void);
/* Note `path` as an input of this process (nothing happens before
 * safefile_guard_inputs, when it cannot be stat'ed, or when
 * SAFEFILE_MAX_INPUTS are noted). Thread-safe. */
void safefile_note_input(const char *path);
/* Forget every noted input (tests). */
void safefile_forget_inputs(void);

/* -1 with a message "OUT is the input IN" when `out` exists and is the same
 * file as `in` (same device and inode: hard links and symbolic links
 * count); 0 otherwise (also when either does not exist). */
int safefile_check_distinct(const char *in, const char *out, char *err, size_t errlen);

/* Read all of `path` (standard input when NULL) into a NUL-terminated
 * lm_malloc'd buffer, its length in *len. NULL with a message on a
 * directory, a non-regular named file, a read error or no memory. */
char *safefile_read(const char *path, size_t *len, char *err, size_t errlen);

/* Resumable writing (above): NULL with a message as safefile_create, or
 * when another live process writes the same partial file. */
safefile *safefile_resume(const char *path, long long *have, char *err, size_t errlen);
/* Empty the partial file (writes then start at byte 0). 0, or -1 with errno. */
int safefile_restart(safefile *f);
/* Flush and close, leaving the partial file for the next safefile_resume;
 * frees f (NULL is a no-op). */
void safefile_keep(safefile *f);

void safefile_fail_after(long n);

/* Unlink every temporary file not yet committed or aborted (at most 8 at
 * once are tracked). Async-signal-safe: for a SIGINT/SIGTERM handler of a
 * program that then exits, so an interrupted write leaves nothing behind. */
void safefile_remove_temps(void);

#endif
