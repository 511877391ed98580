/*
 * metrics.h - the engine's counters and histograms (lm_engine_stats, in
 * lamina.h): what a finished choice, an iteration and the KV pool add to
 * them. Plain functions over the struct: the engine calls them with its
 * statistics lock held and publishes the struct as it is.
 */
#ifndef LAMINA_METRICS_H
#define LAMINA_METRICS_H

#include <stdbool.h>

#include "lamina.h"
#include "kv/kv.h"

/* Zero everything and set the histograms' bounds (batch size in sequences;
 * TTFT, TPOT and end-to-end latency in seconds). */
void metrics_init(lm_engine_stats *st);
/* One observation into a histogram. */
void metrics_hist_add(lm_hist *h, double v);
/* A choice ended: requests finished counts its first choice; the latency
 * histograms take choices that ended normally (stop or length). */
void metrics_finished(lm_engine_stats *st, const lm_request_stats *rs, int index, lm_finish why);
/* One iteration ran n_seqs sequences and n_tokens tokens. */
void metrics_iteration(lm_engine_stats *st, int n_seqs, int n_tokens);
/* The queues' lengths and the pool's block counts. */
void metrics_queues(lm_engine_stats *st, int running, int waiting, const kv_stats *ks);

#endif
