/*
 * metrics.c - the engine's counters and histograms (see metrics.h).
 *
 * Histogram buckets hold plain counts (the last one for values past every
 * bound); /metrics makes them cumulative when it prints them.
 */
#include "sched/metrics.h"

#include <string.h>

static void hist_init(lm_hist *h, const double *bounds, int n) {
    memset(h, 0, sizeof *h);
    h->n_bounds = n;
    memcpy(h->bounds, bounds, (size_t)n * sizeof *bounds);
}

void metrics_init(lm_engine_stats *st) {
    static const double b_batch[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
    static const double b_ttft[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
    static const double b_tpot[] = {0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5};
    static const double b_e2e[] = {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
    memset(st, 0, sizeof *st);
    hist_init(&st->batch_size, b_batch, 10);
    hist_init(&st->ttft, b_ttft, 12);
    hist_init(&st->tpot, b_tpot, 10);
    hist_init(&st->e2e, b_e2e, 12);
}

void metrics_hist_add(lm_hist *h, double v) {
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

void metrics_finished(lm_engine_stats *st, const lm_request_stats *rs, int index, lm_finish why) {
    st->requests_finished += index == 0;
    if (why != LM_FINISH_STOP && why != LM_FINISH_LENGTH) return;
    if (rs->completion_tokens > 0) metrics_hist_add(&st->ttft, rs->ttft);
    if (rs->completion_tokens > 1) metrics_hist_add(&st->tpot, rs->tpot);
    metrics_hist_add(&st->e2e, rs->e2e);
}

void metrics_iteration(lm_engine_stats *st, int n_seqs, int n_tokens) {
    st->iterations++;
    st->batch_seqs_total += (uint64_t)n_seqs;
    st->batch_tokens_total += (uint64_t)n_tokens;
    metrics_hist_add(&st->batch_size, n_seqs);
}

void metrics_queues(lm_engine_stats *st, int running, int waiting, const kv_stats *ks) {
    st->running = running;
    st->waiting = waiting;
    st->kv_blocks_total = ks->n_blocks;
    st->kv_blocks_used = ks->n_used;
    st->kv_blocks_free = ks->n_free + ks->n_cached;
    st->kv_blocks_cached = ks->n_cached;
    st->kv_local_blocks_total = ks->cls[KV_LOCAL].n_blocks;
    st->kv_local_blocks_used = ks->cls[KV_LOCAL].n_used;
    st->kv_local_blocks_free = ks->cls[KV_LOCAL].n_free + ks->cls[KV_LOCAL].n_cached;
    st->kv_local_blocks_cached = ks->cls[KV_LOCAL].n_cached;
    st->prefix_queries_total = ks->prefix_queries;
    st->prefix_hits_total = ks->prefix_hit_blocks;
}
