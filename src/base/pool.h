/*
 * pool.h - a pthread pool of persistent workers for data-parallel kernels.
 *
 * pool_run(p, fn, arg) calls fn(arg, ith, nth) once on each of nth threads
 * (the caller is thread 0) and returns when all have returned. Work inside fn
 * is split by (ith, nth) or through an atomic chunk counter that fn's
 * argument carries. Workers are started once and sleep between runs; no
 * thread is created per call. A pool is driven by one thread at a time.
 */
#ifndef LAMINA_POOL_H
#define LAMINA_POOL_H

typedef struct lm_pool lm_pool;
typedef void (*lm_pool_fn)(void *arg, int ith, int nth);

/* n_threads >= 1 (1: no workers, everything runs on the caller). NULL when
 * out of memory or threads cannot be created. */
lm_pool *pool_new(int n_threads);
void pool_free(lm_pool *p);
int pool_size(const lm_pool *p);
/* p may be NULL: fn then runs once as (arg, 0, 1). */
void pool_run(lm_pool *p, lm_pool_fn fn, void *arg);

/* Dispatch timing, for profiles (off by default; when off a run pays one
 * relaxed load). With it on, each run adds to two counters, in seconds:
 * wait_s, the caller's time outside its own share of the work (publishing
 * the run, then waiting at the barrier for the other threads: their
 * wake-up, and any imbalance), and wake_s, each worker's delay from the
 * publication to starting its share, summed over workers. runs counts the
 * runs that woke workers; sleeps, over workers, the runs a worker met
 * asleep (its spin after the previous run ran out: a futex wake-up). */
typedef struct {
    double wait_s, wake_s;
    long runs, sleeps;
} pool_timing;
void pool_timing_enable(lm_pool *p, int on);
/* The counters so far (zeros for a NULL pool). */
void pool_timing_get(const lm_pool *p, pool_timing *t);
void pool_timing_reset(lm_pool *p);

/* Physical cores of this machine (best effort; at least 1). */
int pool_default_threads(void);

#endif
