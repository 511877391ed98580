/*
 * pp.h - this rank's part of a forward pass across the job's ranks: the
 * local pass given the tensor-parallel hooks, and under pipeline
 * parallelism a stage's pass split into micro-batches, the activations
 * passed stage to stage (pp.c).
 */
#ifndef LAMINA_PP_H
#define LAMINA_PP_H

#include <stddef.h>
#include <stdint.h>

#include "model/forward.h"

/* Micro-batches per pass: 2 per stage (fewer when the pass has fewer rows). */
#define PP_MICRO_PER_STAGE 2

/* This rank's part of one pass of fwd_run's contract (the batch checked:
 * fwd_check), every rank of the job calling it with the same batch. The
 * local pass (fwd_pass) runs this rank's span (fwd_span_stage), with the
 * tensor-parallel hooks over dist.h when m->tp.size > 1. Without pipeline
 * parallelism that is one local pass. On a pipeline stage (f->m->pp.size >
 * 1) the tokens are cut into up to PP_MICRO_PER_STAGE x stages
 * micro-batches of about equal rows (a segment may be cut too: its later
 * rows attend to the earlier ones' K/V, stored by then on every stage);
 * stage s receives each micro-batch's residual stream from stage s - 1
 * (stage 0 embeds it), runs its layers and sends it to s + 1, so stage s
 * works on micro-batch i while s + 1 works on i - 1; the last stage's
 * logits rows are then broadcast to every rank. */
int pp_forward(lm_fwd *f, const int32_t *tokens, int n, const lm_seg *segs, int n_seg, float *logits, char *err,
               size_t errlen);

/* Counters since the last reset: passes, micro-batches, seconds on this
 * rank in its stage's layers (compute, tensor-parallel collectives
 * included; its sends and receives are in dist_stats.p2p_s), in the logits
 * broadcast, and the bubble the schedule leaves: per pass of m
 * micro-batches over S stages, (S - 1) / (m + S - 1) of the pass is idle on
 * each stage when the stages take equal time; bubble is the average. */
typedef struct {
    uint64_t passes, micro;
    double compute_s;
    double bcast_s; /* in the broadcast of the last stage's logits (waiting for it, mostly) */
    double bubble;
} pp_stats;
void pp_stats_get(pp_stats *s);
void pp_stats_reset(void);

#endif
