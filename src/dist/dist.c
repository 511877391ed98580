/*
 * dist.c - the job's ranks and collectives (dist.h): MPI when built with
 * LAMINA_MPI, a single rank otherwise.
 *
 * dist_allreduce_sum is an all-gather of the partial vectors into a scratch
 * buffer (N, n) followed by a sum in rank order on every rank: twice the
 * bytes of a reduce-scatter ring for two ranks, but bit-identical on every
 * rank whatever algorithm MPI picks, which the replicated residual stream
 * of tensor parallelism relies on. The scratch grows to the largest call
 * and is kept (one allocation per size, never per token once warm).
 */
#include "dist/dist.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/util.h"

#ifdef LAMINA_MPI
#include <mpi.h>
#endif

static int g_rank = 0, g_size = 1;
static int g_tp_rank = 0, g_tp_size = 1, g_stage = 0, g_stages = 1;
static int g_ep_rank = 0, g_ep_size = 1;
static bool g_init = false;
static dist_stats g_stats;
static float *g_scratch; /* (g_scratch_n) floats: gathered parts */
static size_t g_scratch_n;
#ifdef LAMINA_MPI
static MPI_Comm g_tp_comm = MPI_COMM_NULL; /* this stage's tensor group (the world until dist_grid) */
static MPI_Comm g_ep_comm = MPI_COMM_NULL; /* this stage's expert group (the world until dist_grid) */
#endif

bool dist_available(void) {
#ifdef LAMINA_MPI
    return true;
#else
    return false;
#endif
}

int dist_rank(void) { return g_rank; }
int dist_size(void) { return g_size; }
int dist_tp_rank(void) { return g_tp_rank; }
int dist_tp_size(void) { return g_tp_size; }
int dist_ep_rank(void) { return g_ep_rank; }
int dist_ep_size(void) { return g_ep_size; }
int dist_stage(void) { return g_stage; }
int dist_n_stages(void) { return g_stages; }

void dist_stats_get(dist_stats *s) { *s = g_stats; }
void dist_stats_reset(void) { memset(&g_stats, 0, sizeof g_stats); }

#ifdef LAMINA_MPI
static int grow(size_t n, char *err, size_t errlen) {
    if (n <= g_scratch_n) return 0;
    float *p = lm_realloc(g_scratch, n * sizeof(float));
    if (!p) return lm_err(err, errlen, "out of memory for %zu floats of communication scratch", n);
    g_scratch = p;
    g_scratch_n = n;
    return 0;
}

static int mpi_fail(int rc, const char *what, char *err, size_t errlen) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, s, &len);
    return lm_err(err, errlen, "%s: %.*s", what, len, s);
}
#endif

int dist_init(int *argc, char ***argv, char *err, size_t errlen) {
    if (g_init) return 0;
#ifdef LAMINA_MPI
    int provided = 0, rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Init_thread", err, errlen);
    if (provided < MPI_THREAD_SERIALIZED) {
        MPI_Finalize();
        return lm_err(err, errlen, "the MPI library gives thread level %d, lamina needs MPI_THREAD_SERIALIZED",
                      provided);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    g_tp_comm = g_ep_comm = MPI_COMM_WORLD;
#endif
    g_tp_rank = g_ep_rank = g_rank;
    g_tp_size = g_ep_size = g_size;
    g_init = true;
    return 0;
}

void dist_finalize(void) {
    if (!g_init) return;
#ifdef LAMINA_MPI
    if (g_tp_comm != MPI_COMM_WORLD && g_tp_comm != MPI_COMM_NULL) MPI_Comm_free(&g_tp_comm);
    if (g_ep_comm != MPI_COMM_WORLD && g_ep_comm != MPI_COMM_NULL) MPI_Comm_free(&g_ep_comm);
    g_tp_comm = g_ep_comm = MPI_COMM_NULL;
    MPI_Finalize();
#endif
    g_init = false;
    lm_free(g_scratch);
    g_scratch = NULL;
    g_scratch_n = 0;
}

void dist_abort(int code) {
#ifdef LAMINA_MPI
    if (g_init && g_size > 1) MPI_Abort(MPI_COMM_WORLD, code);
#endif
    _Exit(code);
}

int dist_grid(int tp, int pp, char *err, size_t errlen) { return dist_grid_ep(tp, 1, pp, err, errlen); }

int dist_grid_ep(int tp, int ep, int pp, char *err, size_t errlen) {
    if (tp < 1 || ep < 1 || pp < 1 || (int64_t)tp * ep * pp != g_size)
        return lm_err(err, errlen, "a grid of %d x %d x %d ranks for a job of %d", tp, ep, pp, g_size);
    g_tp_size = tp;
    g_tp_rank = g_rank % tp;
    g_ep_size = ep;
    g_ep_rank = g_rank / tp % ep;
    g_stages = pp;
    g_stage = g_rank / (tp * ep);
#ifdef LAMINA_MPI
    /* the tensor group: one stage's one expert rank (consecutive world ranks); the expert
     * group: one stage's ranks of one tensor rank (every tp-th) */
    if (tp > 1 && tp != g_size) {
        int rc = MPI_Comm_split(MPI_COMM_WORLD, g_rank / tp, g_tp_rank, &g_tp_comm);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "splitting the job into tensor groups", err, errlen);
    }
    if (ep > 1 && ep != g_size) { /* a group of one calls no collective */
        int rc = MPI_Comm_split(MPI_COMM_WORLD, g_stage * tp + g_tp_rank, g_ep_rank, &g_ep_comm);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "splitting the job into expert groups", err, errlen);
    }
#endif
    return 0;
}

int dist_send(const void *buf, size_t bytes, int peer, char *err, size_t errlen) {
#ifdef LAMINA_MPI
    double t0 = lm_now();
    if (bytes > (size_t)0x7fffffff) return lm_err(err, errlen, "a message of %zu bytes is too large", bytes);
    int rc = MPI_Send(buf, (int)bytes, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "send", err, errlen);
    double dt = lm_now() - t0;
    g_stats.comm_s += dt;
    g_stats.p2p_s += dt;
    g_stats.bytes += bytes;
    g_stats.p2p_bytes += bytes;
    g_stats.calls++;
    return 0;
#else
    return lm_err(err, errlen, "built without MPI");
#endif
}

int dist_recv(void *buf, size_t bytes, int peer, char *err, size_t errlen) {
#ifdef LAMINA_MPI
    double t0 = lm_now();
    if (bytes > (size_t)0x7fffffff) return lm_err(err, errlen, "a message of %zu bytes is too large", bytes);
    MPI_Status st;
    int rc = MPI_Recv(buf, (int)bytes, MPI_BYTE, peer, 0, MPI_COMM_WORLD, &st), got = 0;
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "receive", err, errlen);
    MPI_Get_count(&st, MPI_BYTE, &got);
    if ((size_t)got != bytes)
        return lm_err(err, errlen, "received %d bytes from rank %d, %zu expected", got, peer, bytes);
    double dt = lm_now() - t0;
    g_stats.comm_s += dt;
    g_stats.p2p_s += dt;
    g_stats.calls++;
    return 0;
#else
    return lm_err(err, errlen, "built without MPI");
#endif
}

#ifdef LAMINA_MPI
typedef struct {
    MPI_Comm comm;
    int rank, size;
} group;
static group tp_group(void) { return (group){g_tp_comm, g_tp_rank, g_tp_size}; }
static group ep_group(void) { return (group){g_ep_comm, g_ep_rank, g_ep_size}; }

static int allreduce_in(group g, float *x, size_t n, char *err, size_t errlen) {
    double t0 = lm_now();
    if (n > (size_t)0x7fffffff) return lm_err(err, errlen, "all-reduce of %zu floats is too large", n);
    if (grow(n * (size_t)g.size, err, errlen)) return -1;
    int rc = MPI_Allgather(x, (int)n, MPI_FLOAT, g_scratch, (int)n, MPI_FLOAT, g.comm);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "all-reduce", err, errlen);
    memcpy(x, g_scratch, n * sizeof(float));
    for (int r = 1; r < g.size; r++) {
        const float *p = g_scratch + (size_t)r * n;
        for (size_t i = 0; i < n; i++) x[i] += p[i];
    }
    g_stats.comm_s += lm_now() - t0;
    g_stats.bytes += n * sizeof(float);
    g_stats.calls++;
    return 0;
}

static int gather_in(group g, const float *part, int rows, const int *cols, float *out, char *err, size_t errlen) {
    double t0 = lm_now();
    size_t total = 0;
    for (int r = 0; r < g.size; r++) total += (size_t)cols[r];
    if ((size_t)rows * total > (size_t)0x7fffffff) return lm_err(err, errlen, "gather of %d rows is too large", rows);
    if (grow((size_t)rows * total, err, errlen)) return -1;
    int counts[g.size], displs[g.size];
    for (int r = 0, d = 0; r < g.size; r++) {
        counts[r] = rows * cols[r];
        displs[r] = d;
        d += counts[r];
    }
    int rc = MPI_Allgatherv(part, counts[g.rank], MPI_FLOAT, g_scratch, counts, displs, MPI_FLOAT, g.comm);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "gather", err, errlen);
    /* scratch: rank blocks (rows, cols[r]) one after another -> out (rows, total) */
    for (int r = 0, c0 = 0; r < g.size; c0 += cols[r], r++)
        for (int i = 0; i < rows; i++)
            memcpy(out + (size_t)i * total + (size_t)c0, g_scratch + displs[r] + (size_t)i * (size_t)cols[r],
                   (size_t)cols[r] * sizeof(float));
    g_stats.comm_s += lm_now() - t0;
    g_stats.bytes += (size_t)counts[g.rank] * sizeof(float);
    g_stats.calls++;
    return 0;
}
#endif

int dist_allreduce_sum(float *x, size_t n, char *err, size_t errlen) {
    if (g_tp_size == 1 || n == 0) return 0;
#ifdef LAMINA_MPI
    return allreduce_in(tp_group(), x, n, err, errlen);
#else
    return lm_err(err, errlen, "built without MPI");
#endif
}

int dist_ep_allreduce_sum(float *x, size_t n, char *err, size_t errlen) {
    if (g_ep_size == 1 || n == 0) return 0;
#ifdef LAMINA_MPI
    return allreduce_in(ep_group(), x, n, err, errlen);
#else
    return lm_err(err, errlen, "built without MPI");
#endif
}

int dist_allgather_cols(const float *part, int rows, const int *cols, float *out, char *err, size_t errlen) {
    if (g_tp_size == 1) {
        if (out != part) memcpy(out, part, (size_t)rows * (size_t)cols[0] * sizeof(float));
        return 0;
    }
#ifdef LAMINA_MPI
    return gather_in(tp_group(), part, rows, cols, out, err, errlen);
#else
    return lm_err(err, errlen, "built without MPI");
#endif
}

int dist_ep_allgather_cols(const float *part, int rows, const int *cols, float *out, char *err, size_t errlen) {
    if (g_ep_size == 1) {
        if (out != part) memcpy(out, part, (size_t)rows * (size_t)cols[0] * sizeof(float));
        return 0;
    }
#ifdef LAMINA_MPI
    return gather_in(ep_group(), part, rows, cols, out, err, errlen);
#else
    return lm_err(err, errlen, "built without MPI");
#endif
}

int dist_alltoallv(const void *send, const int *send_n, void *recv, const int *recv_n, size_t elem, char *err,
                   size_t errlen) {
    if (g_ep_size == 1) {
        if (send_n[0] != recv_n[0])
            return lm_err(err, errlen, "all-to-all of %d elements to oneself, %d expected", send_n[0], recv_n[0]);
        if (send_n[0] > 0 && recv != send) memcpy(recv, send, (size_t)send_n[0] * elem);
        return 0;
    }
#ifdef LAMINA_MPI
    double t0 = lm_now();
    const int N = g_ep_size;
    int sc[N], sd[N], rc_[N], rd[N];
    size_t s_tot = 0, r_tot = 0;
    for (int r = 0; r < N; r++) { /* counts in bytes, each and in all under INT_MAX */
        if (send_n[r] < 0 || recv_n[r] < 0) return lm_err(err, errlen, "all-to-all with a negative count");
        size_t sb = (size_t)send_n[r] * elem, rb = (size_t)recv_n[r] * elem;
        if (s_tot + sb > (size_t)0x7fffffff || r_tot + rb > (size_t)0x7fffffff)
            return lm_err(err, errlen, "all-to-all of more than 2 GiB");
        sc[r] = (int)sb, sd[r] = (int)s_tot, rc_[r] = (int)rb, rd[r] = (int)r_tot;
        s_tot += sb, r_tot += rb;
    }
    int rc = MPI_Alltoallv(send, sc, sd, MPI_BYTE, recv, rc_, rd, MPI_BYTE, g_ep_comm);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "all-to-all", err, errlen);
    g_stats.comm_s += lm_now() - t0;
    g_stats.bytes += s_tot - (size_t)sc[g_ep_rank]; /* what left this rank */
    g_stats.calls++;
    return 0;
#else
    return lm_err(err, errlen, "built without MPI");
#endif
}

int dist_bcast(void *buf, size_t bytes, int root, char *err, size_t errlen) {
    if (g_size == 1 || bytes == 0) return 0;
#ifdef LAMINA_MPI
    double t0 = lm_now();
    if (bytes > (size_t)0x7fffffff) return lm_err(err, errlen, "broadcast of %zu bytes is too large", bytes);
    int rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "broadcast", err, errlen);
    g_stats.comm_s += lm_now() - t0;
    if (g_rank == root) g_stats.bytes += bytes;
    g_stats.calls++;
    return 0;
#else
    return lm_err(err, errlen, "built without MPI");
#endif
}

int dist_bcast_idle(void *buf, size_t bytes, int root, char *err, size_t errlen) {
    if (g_size == 1 || bytes == 0) return 0;
#ifdef LAMINA_MPI
    if (bytes > (size_t)0x7fffffff) return lm_err(err, errlen, "broadcast of %zu bytes is too large", bytes);
    MPI_Request rq;
    int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD, &rq), done = 0;
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "broadcast", err, errlen);
    for (int spins = 0; !done; spins++) {
        if ((rc = MPI_Test(&rq, &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS)
            return mpi_fail(rc, "broadcast", err, errlen);
        if (!done && spins > 1000) nanosleep(&(struct timespec){.tv_nsec = 200000}, NULL);
    }
    g_stats.calls++;
    return 0;
#else
    return lm_err(err, errlen, "built without MPI");
#endif
}

int dist_barrier(char *err, size_t errlen) {
    if (g_size == 1) return 0;
#ifdef LAMINA_MPI
    int rc = MPI_Barrier(MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "barrier", err, errlen);
    return 0;
#else
    return lm_err(err, errlen, "built without MPI");
#endif
}
