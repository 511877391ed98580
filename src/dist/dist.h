/*
 * dist.h - parallelism and communication: the processes of one job (ranks)
 * and the collectives the tensor-parallel forward pass and the command line
 * need, over MPI.
 *
 * Built with MPI (make MPI=1: -DLAMINA_MPI and mpicc's flags) the job is
 * MPI_COMM_WORLD as mpirun started it; built without, there is one rank and
 * every collective is the identity (a sum over one rank, a broadcast from
 * oneself), so callers need no #ifdef.
 *
 * Invariants:
 *  - Deterministic reductions: dist_allreduce_sum gathers every rank's
 *    partial vector and adds them in rank order 0, 1, ..., N-1 on every
 *    rank, so the result is bit-identical on all ranks and does not depend
 *    on timing or on the MPI library's choice of algorithm. The replicated
 *    state of the forward pass (the residual stream) stays identical.
 *  - Collectives are called by one thread at a time (MPI_THREAD_SERIALIZED),
 *    by every rank in the same order.
 *  - A failure of the runtime is fatal to the whole job (MPI's default error
 *    handler): a rank that dies makes mpirun end every rank, never a hang.
 *  - dist keeps counters of time spent in collectives and bytes moved, for
 *    `lamina bench` (dist_stats_get).
 *  - The grid (dist_grid_ep): pp stages of ep x tp ranks, world rank =
 *    (stage * ep + expert rank) * tp + tensor rank. A stage's tensor group
 *    (the ranks of one expert rank, consecutive) runs the all-reduce and the
 *    column gather; its expert group (the ranks of one tensor rank, every
 *    tp-th) runs the all-to-all and the dist_ep_ collectives. Both are the
 *    whole job until a grid is set; dist_grid is dist_grid_ep with ep 1.
 *    Broadcasts and barriers span the job; dist_send/dist_recv pass a
 *    stage's activations to the same rank of the next stage.
 */
#ifndef LAMINA_DIST_H
#define LAMINA_DIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* True when built with MPI. */
bool dist_available(void);

/* Start the runtime (MPI_Init_thread; nothing without MPI). argc/argv may be
 * NULL. Fails when the runtime cannot start or cannot give the thread level. */
int dist_init(int *argc, char ***argv, char *err, size_t errlen);
/* End the runtime; every rank calls it once, after its last collective. */
void dist_finalize(void);
/* End every rank of the job at once with this exit code (an error on one rank
 * that the others cannot see). Does not return. */
void dist_abort(int code) __attribute__((noreturn));

int dist_rank(void); /* 0 before dist_init or without MPI */
int dist_size(void); /* 1 before dist_init or without MPI */

/* Arrange the job as pp stages of tp ranks (tp * pp must be dist_size()). */
int dist_grid(int tp, int pp, char *err, size_t errlen);
/* Arrange it as pp stages of ep expert ranks of tp tensor ranks each (tp *
 * ep * pp must be dist_size()). */
int dist_grid_ep(int tp, int ep, int pp, char *err, size_t errlen);
int dist_tp_rank(void); /* rank inside this stage's tensor group */
int dist_tp_size(void);
int dist_ep_rank(void); /* rank inside this stage's expert group */
int dist_ep_size(void);
int dist_stage(void); /* pipeline stage */
int dist_n_stages(void);
/* Point to point (world ranks): bytes to peer, or from peer; counted in the
 * stats (a receive's wait for its sender is its communication time). */
int dist_send(const void *buf, size_t bytes, int peer, char *err, size_t errlen);
int dist_recv(void *buf, size_t bytes, int peer, char *err, size_t errlen);

/* x (n) := the sum over ranks of each rank's x, added in rank order. */
int dist_allreduce_sum(float *x, size_t n, char *err, size_t errlen);
/* Every rank's part: rank r gives part (rows, cols[r]); out (rows, sum of cols)
 * receives on every rank, row by row, rank 0's columns, then rank 1's, ...
 * (the columns of a matrix split by column blocks). */
int dist_allgather_cols(const float *part, int rows, const int *cols, float *out, char *err, size_t errlen);
/* dist_allreduce_sum and dist_allgather_cols inside the expert group. */
int dist_ep_allreduce_sum(float *x, size_t n, char *err, size_t errlen);
int dist_ep_allgather_cols(const float *part, int rows, const int *cols, float *out, char *err, size_t errlen);
/* Personalised exchange inside the stage's expert group (MPI_Alltoallv): send holds
 * send_n[0] elements of elem bytes for rank 0, then send_n[1] for rank 1, ...;
 * recv receives recv_n[r] elements from rank r, rank after rank (the caller
 * knows them: exchange the counts first, one int to each rank). One rank
 * (or a group of one): send copied to recv. Counted in the stats. */
int dist_alltoallv(const void *send, const int *send_n, void *recv, const int *recv_n, size_t elem, char *err,
                   size_t errlen);
/* buf (bytes) from root to every rank. */
int dist_bcast(void *buf, size_t bytes, int root, char *err, size_t errlen);
/* dist_bcast for a rank that may wait long (a follower between requests):
 * polls the broadcast with short sleeps instead of spinning a core. */
int dist_bcast_idle(void *buf, size_t bytes, int root, char *err, size_t errlen);
/* Wait for every rank. */
int dist_barrier(char *err, size_t errlen);

/* Time in collectives and bytes this rank sent into them, since the last reset. */
typedef struct {
    double comm_s;      /* seconds inside collectives */
    uint64_t bytes;     /* bytes this rank contributed */
    uint64_t calls;     /* collectives */
    double p2p_s;       /* of comm_s: seconds in dist_send/dist_recv (pipeline) */
    uint64_t p2p_bytes; /* of bytes: bytes sent by dist_send */
} dist_stats;
void dist_stats_get(dist_stats *s);
void dist_stats_reset(void);

#endif
