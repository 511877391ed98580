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

/* Physical cores of this machine (best effort; at least 1). */
int pool_default_threads(void);

#endif
