/*
 * pool.c - see pool.h.
 *
 * Dispatch: the caller publishes (fn, arg) and bumps `generation` under the
 * mutex and broadcasts; each worker runs fn once per generation and
 * decrements `pending`; the caller runs its own share, then spins briefly and
 * finally sleeps on `done_cv` until pending reaches zero. Workers spin a
 * little before sleeping too, so back-to-back operations (one per layer and
 * kernel during decode) do not pay a full futex wake-up each time.
 * Timing (pool_timing_enable, for profiles): the caller notes the
 * publication time under the mutex, each worker adds its delay from it to
 * wake_ns, and the caller adds its own time outside fn (publishing, then the
 * barrier) to wait_ns; a worker whose spin ran out before the run, and
 * which slept, counts one in sleeps; off, a run reads one relaxed flag.
 */
#include "base/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* A spin round is a pause; every 64th round yields the core instead, so a
 * spinning thread does not hold it from the thread it waits for when the
 * machine has more runnable threads than cores. About 50-100 us in all. */
#define SPIN_ROUNDS 4096
static inline void spin_pause(int round) {
    if ((round & 63) == 63) sched_yield();
    else cpu_relax();
}

struct lm_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    lm_pool_fn fn;
    void *arg;
    atomic_ulong generation;
    atomic_int pending;
    bool stop;
    /* dispatch timing (pool_timing_enable) */
    atomic_bool timing;
    double t_pub; /* when the current run was published */
    atomic_llong wait_ns, wake_ns;
    atomic_long runs, sleeps;
};

typedef struct {
    lm_pool *p;
    int ith;
} worker_arg;

static void *worker_main(void *v) {
    worker_arg wa = *(worker_arg *)v;
    lm_free(v);
    lm_pool *p = wa.p;
    unsigned long seen = 0;
    for (;;) {
        /* spin briefly for the next generation before sleeping; yield now
         * and then so a descheduled caller can run when cores are shared */
        unsigned long g = atomic_load_explicit(&p->generation, memory_order_acquire);
        for (int spin = 0; g == seen && spin < SPIN_ROUNDS; spin++) {
            spin_pause(spin);
            g = atomic_load_explicit(&p->generation, memory_order_acquire);
        }
        pthread_mutex_lock(&p->mu);
        bool slept = false; /* the spin ran out: this run pays a futex wake-up */
        while (!p->stop && atomic_load(&p->generation) == seen) {
            pthread_cond_wait(&p->work_cv, &p->mu);
            slept = true;
        }
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = atomic_load(&p->generation);
        lm_pool_fn fn = p->fn;
        void *arg = p->arg;
        double t_pub = p->t_pub;
        pthread_mutex_unlock(&p->mu);
        if (atomic_load_explicit(&p->timing, memory_order_relaxed)) {
            atomic_fetch_add_explicit(&p->wake_ns, (long long)(1e9 * (lm_now() - t_pub)), memory_order_relaxed);
            if (slept) atomic_fetch_add_explicit(&p->sleeps, 1, memory_order_relaxed);
        }
        fn(arg, wa.ith, p->n);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

lm_pool *pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    lm_pool *p = lm_calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->timing, false);
    atomic_init(&p->wait_ns, 0);
    atomic_init(&p->wake_ns, 0);
    atomic_init(&p->runs, 0);
    atomic_init(&p->sleeps, 0);
    p->threads = lm_calloc((size_t)n_threads, sizeof(pthread_t));
    if (!p->threads) goto fail;
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = lm_malloc(sizeof *wa);
        if (!wa) goto fail_started;
        wa->p = p;
        wa->ith = i;
        if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            lm_free(wa);
            goto fail_started;
        }
        continue;
    fail_started:
        p->n = i; /* join the ones already running */
        pool_free(p);
        return NULL;
    }
    return p;
fail:
    lm_free(p->threads);
    lm_free(p);
    return NULL;
}

void pool_free(lm_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    lm_free(p->threads);
    lm_free(p);
}

int pool_size(const lm_pool *p) { return p ? p->n : 1; }

void pool_run(lm_pool *p, lm_pool_fn fn, void *arg) {
    if (!p || p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    bool timing = atomic_load_explicit(&p->timing, memory_order_relaxed);
    double t0 = timing ? lm_now() : 0, t1 = 0;
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    if (timing) p->t_pub = t0;
    atomic_store(&p->pending, p->n - 1);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    if (timing) t1 = lm_now();
    fn(arg, 0, p->n);
    double t2 = timing ? lm_now() : 0;
    for (int spin = 0; spin < SPIN_ROUNDS && atomic_load_explicit(&p->pending, memory_order_acquire) > 0; spin++)
        spin_pause(spin);
    if (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->done_cv, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
    if (timing) {
        atomic_fetch_add_explicit(&p->wait_ns, (long long)(1e9 * (lm_now() - t2 + t1 - t0)), memory_order_relaxed);
        atomic_fetch_add_explicit(&p->runs, 1, memory_order_relaxed);
    }
}

void pool_timing_enable(lm_pool *p, int on) {
    if (p) atomic_store(&p->timing, on != 0);
}

void pool_timing_get(const lm_pool *p, pool_timing *t) {
    t->wait_s = p ? 1e-9 * (double)atomic_load(&((lm_pool *)p)->wait_ns) : 0;
    t->wake_s = p ? 1e-9 * (double)atomic_load(&((lm_pool *)p)->wake_ns) : 0;
    t->runs = p ? atomic_load(&((lm_pool *)p)->runs) : 0;
    t->sleeps = p ? atomic_load(&((lm_pool *)p)->sleeps) : 0;
}

void pool_timing_reset(lm_pool *p) {
    if (!p) return;
    atomic_store(&p->wait_ns, 0);
    atomic_store(&p->wake_ns, 0);
    atomic_store(&p->runs, 0);
    atomic_store(&p->sleeps, 0);
}

int pool_default_threads(void) {
    /* Count distinct (physical id, core id) pairs; fall back to online CPUs. */
    FILE *f = fopen("/proc/cpuinfo", "r");
    int cores = 0;
    if (f) {
        char line[256];
        int phys = 0, ids[1024][2], n = 0;
        while (fgets(line, sizeof line, f)) {
            int v;
            if (sscanf(line, "physical id : %d", &v) == 1) phys = v;
            if (sscanf(line, "core id : %d", &v) == 1) {
                bool seen = false;
                for (int i = 0; i < n; i++)
                    if (ids[i][0] == phys && ids[i][1] == v) seen = true;
                if (!seen && n < 1024) {
                    ids[n][0] = phys;
                    ids[n][1] = v;
                    n++;
                }
            }
        }
        fclose(f);
        cores = n;
    }
    if (cores < 1) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        cores = c > 0 ? (int)c : 1;
    }
    return cores;
}
