/*
 * x86_shadow.h - how the x86 fused attention entries use their pf rows
 * (kernels.h): a "shadow" prefetch. As an entry reads its rows, it asks
 * for the lines of pf's rows (the ones the caller reads next: attention's
 * next chunk), about one request per line it reads, into L2
 * (prefetcht1). The requests are spread through the work at the rate the
 * rows are read, one chunk ahead, so memory streams while the arithmetic
 * runs, where a burst of the whole chunk up front stalls the core once
 * the fill buffers are full; into L2 rather than L1, because prefetcht0
 * holds an L1 fill buffer until the line arrives, which caps one core's
 * lines in flight. Measured on the Xeon (bench/README.md, "Attention and
 * long context"): one layer's decode attention from memory read 1.3-1.4x
 * faster than with the burst into L1.
 *
 * The order of the requests. The entries visit a chunk across its columns
 * (the scores a few rows at a time along the head dim, P·V each column
 * tile down every row): asked in that order, consecutive requests are a
 * row (512 bytes at head dim 256) apart, and the L2's own streamer, which
 * follows ascending lines within a page, never joins in. So the entries
 * ask in address order: their i-th request asks for the i-th line of the
 * pf rows taken end to end (the same lines). For F16 rows of whole,
 * line-aligned lines (2 hd / 64 of them, a power of two) that is
 * shadow_seq, a shift and a mask per request; for other rows (Q8_0's 34-byte
 * blocks) shadow_run, a cursor. Measured on the Xeon (bench/README.md,
 * "Prefetch in address order"), against the reading order, Gemma 3 270M's
 * decode attention at depth 16384 took 0.91-0.98x the time with an F16
 * cache (0.88-0.91x on the AVX2 entries) and 0.92-0.97x with a Q8_0 one
 * (AVX2's 0.99-1.01x, bound by arithmetic); the TinyLlama shape (head
 * dim 64) 1.01-1.05x, within the runs' noise. shadow_f16 keeps the
 * reading order for F16 rows that do not qualify.
 *
 * The hint never faults and never changes a result.
 */
#ifndef LAMINA_X86_SHADOW_H
#define LAMINA_X86_SHADOW_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#define SHADOW_INLINE static inline __attribute__((always_inline))

SHADOW_INLINE void shadow_line(const void *p, size_t off) { _mm_prefetch((const char *)p + off, _MM_HINT_T1); }

/* The reading order, for an F16 row of hd halves read at element d: where
 * d begins a line of the row, the same line of pf (a pf row that does not
 * start on a line boundary has its last line asked for at d = 0 too). */
SHADOW_INLINE void shadow_f16(const void *pf, int d, int hd) {
    if (d % 32 == 0) shadow_line(pf, 2 * (size_t)d);
    if (d == 0 && (((uintptr_t)pf | (uintptr_t)(2 * hd)) & 63)) shadow_line(pf, 2 * (size_t)hd - 1);
}

/* log2 of the lines of each of pf's n F16 rows of hd halves when they are
 * whole lines, a power of two of them, and line-aligned; else -1 (then
 * shadow_f16). */
SHADOW_INLINE int shadow_seq_shift(const void *const *pf, int n, int hd) {
    int L = hd / 32;
    if (hd % 32 || (L & (L - 1))) return -1;
    uintptr_t a = 0;
    for (int t = 0; t < n; t++) a |= (uintptr_t)pf[t];
    return a & 63 ? -1 : __builtin_ctz((unsigned)L);
}

/* The line of slot k of rows pf of 2^sh lines each (shadow_seq_shift),
 * and the request for it. */
SHADOW_INLINE const char *shadow_seq_at(const void *const *pf, size_t k, int sh) {
    return (const char *)pf[k >> sh] + (k & (((size_t)1 << sh) - 1)) * 64;
}

SHADOW_INLINE void shadow_seq(const void *const *pf, size_t k, int sh) { shadow_line(shadow_seq_at(pf, k, sh), 0); }

/* A cursor over n rows of rb bytes taken end to end, as a pool block's
 * rows lie (16 Q8_0 rows of 272 bytes are 68 whole lines): each call asks
 * for the next line, then nothing once past the last row. Where rows do
 * not lie end to end from a line boundary, the one line a row shares with
 * its neighbour may go unasked. Q8_0 entries make about two calls per
 * line, so their requests come in the first half of the work. */
typedef struct {
    const char *const *pf;
    int n, row;
    size_t rb, off;
} shadow_run;

SHADOW_INLINE shadow_run shadow_run_of(const void *const *pf, int n, size_t rb) {
    return (shadow_run){(const char *const *)pf, n, 0, rb, 0};
}

/* The cursor's next line, or NULL past the last row; and the request. */
SHADOW_INLINE const char *shadow_run_at(shadow_run *r) {
    if (r->row >= r->n) return NULL;
    const char *p = r->pf[r->row] + r->off;
    r->off += 64;
    while (r->off >= r->rb)
        if (r->off -= r->rb, ++r->row >= r->n) break;
    return p;
}

SHADOW_INLINE void shadow_run_next(shadow_run *r) {
    const char *p = shadow_run_at(r);
    if (p) shadow_line(p, 0);
}

#endif
