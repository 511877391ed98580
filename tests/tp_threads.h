/*
 * tp_threads.h - tensor-parallel ranks on threads of one process, for the
 * tests of model shards (test_tp_gptoss.c, test_tp_hybrid.c), without MPI.
 *
 * tp_threads_run runs a test's passes over each rank's shard on a thread
 * of its own, with forward-pass hooks (model/forward.h: fwd_hooks) that do
 * what dist.h does across processes: reduce sums the ranks' partial
 * products in rank order (((p0 + p1) + p2) + ..., the order an MPI job's
 * rank-ordered all-reduce keeps), gather_cols lays the ranks' column
 * slices side by side; every rank gets the same result. The ranks meet at
 * a barrier three times per hook call, so every rank must make the same
 * calls, as under mpirun.
 *
 * Bounds: at most TP_THREADS_MAX ranks; the hooks' largest result (rows x
 * all columns) must fit the scratch of `floats` floats the caller names.
 * A thread that cannot be started aborts the test program: the others
 * would wait at the barrier for ever. One run at a time (file-scope state).
 */
#ifndef LAMINA_TP_THREADS_H
#define LAMINA_TP_THREADS_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "model/forward.h"
#include "model/model.h"

#define TP_THREADS_MAX 8

/* A test's passes over one rank's model m with hooks hk (NULL: the whole
 * model alone), its logits into `logits`; 0, or -1 with a message. */
typedef int (*tp_passes_fn)(lm_model *m, const fwd_hooks *hk, float *logits, char *err, size_t errlen);

static int tp_size_;
static pthread_barrier_t tp_bar_;
static const float *tp_part_[TP_THREADS_MAX];
static float *tp_tmp_; /* (floats) the rank-ordered sum or the gathered rows */
static _Thread_local int tp_rank_;

static int tp_hook_reduce_(float *y, size_t n, char *err, size_t errlen) {
    (void)err, (void)errlen;
    tp_part_[tp_rank_] = y;
    pthread_barrier_wait(&tp_bar_);
    if (tp_rank_ == 0)
        for (size_t i = 0; i < n; i++) {
            float s = tp_part_[0][i];
            for (int r = 1; r < tp_size_; r++) s += tp_part_[r][i];
            tp_tmp_[i] = s;
        }
    pthread_barrier_wait(&tp_bar_);
    memcpy(y, tp_tmp_, n * sizeof *y);
    pthread_barrier_wait(&tp_bar_);
    return 0;
}

static int tp_hook_gather_(const float *part, int rows, const int *cols, float *out, char *err, size_t errlen) {
    (void)err, (void)errlen;
    tp_part_[tp_rank_] = part;
    pthread_barrier_wait(&tp_bar_);
    size_t total = 0;
    for (int r = 0; r < tp_size_; r++) total += (size_t)cols[r];
    if (tp_rank_ == 0)
        for (int i = 0; i < rows; i++)
            for (int r = 0, c0 = 0; r < tp_size_; c0 += cols[r], r++)
                memcpy(tp_tmp_ + (size_t)i * total + (size_t)c0, tp_part_[r] + (size_t)i * (size_t)cols[r],
                       (size_t)cols[r] * sizeof(float));
    pthread_barrier_wait(&tp_bar_);
    memcpy(out, tp_tmp_, (size_t)rows * total * sizeof *out);
    pthread_barrier_wait(&tp_bar_);
    return 0;
}

typedef struct {
    tp_passes_fn fn;
    lm_model *m;
    int rank;
    float *logits;
    int rc;
    char err[LM_ERRLEN];
} tp_job_;

static void *tp_rank_main_(void *arg) {
    static const fwd_hooks hooks = {.reduce = tp_hook_reduce_, .gather_cols = tp_hook_gather_};
    tp_job_ *j = arg;
    tp_rank_ = j->rank;
    j->rc = j->fn(j->m, &hooks, j->logits, j->err, sizeof j->err);
    return NULL;
}

/* fn over the shards s[0..size) on size threads, rank r's logits into
 * logits[r]; `floats`: the scratch the hooks need. 0, or -1 with the first
 * failing rank's message. */
static int tp_threads_run(tp_passes_fn fn, lm_model *const *s, float *const *logits, int size, size_t floats, char *err,
                          size_t errlen) {
    if (size < 1 || size > TP_THREADS_MAX) return lm_err(err, errlen, "%d ranks (1 to %d)", size, TP_THREADS_MAX);
    tp_tmp_ = malloc(floats * sizeof(float));
    if (!tp_tmp_) return lm_err(err, errlen, "out of memory");
    tp_size_ = size;
    pthread_barrier_init(&tp_bar_, NULL, (unsigned)size);
    tp_job_ jobs[TP_THREADS_MAX];
    pthread_t th[TP_THREADS_MAX];
    for (int r = 0; r < size; r++) {
        jobs[r] = (tp_job_){.fn = fn, .m = s[r], .rank = r, .logits = logits[r]};
        if (pthread_create(&th[r], NULL, tp_rank_main_, &jobs[r]) != 0) {
            fprintf(stderr, "tp_threads_run: cannot start the thread of rank %d\n", r);
            abort();
        }
    }
    for (int r = 0; r < size; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&tp_bar_);
    free(tp_tmp_);
    tp_tmp_ = NULL;
    for (int r = 0; r < size; r++)
        if (jobs[r].rc) return lm_err(err, errlen, "rank %d: %s", r, jobs[r].err);
    return 0;
}

#endif
