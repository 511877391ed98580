/*
 * x86_shadow.h - how the x86 fused attention entries use their pf rows
 * (kernels.h): a "shadow" prefetch. Wherever an entry first reads a cache
 * line of its row t, it asks for the line at the same offset of pf[t],
 * the row the caller reads next in that place (attention: the next
 * chunk's), into L2 (prefetcht1). The requests are spread through the
 * work at the rate the rows are read, one chunk ahead, so memory streams
 * while the arithmetic runs, where a burst of the whole chunk up front
 * stalls the core once the fill buffers are full; into L2 rather than L1,
 * because prefetcht0 holds an L1 fill buffer until the line arrives, which
 * caps one core's lines in flight. Measured on the Xeon (bench/README.md,
 * "Attention and long context"): one layer's decode attention from memory
 * read 1.3-1.4x faster than with the burst into L1.
 *
 * Both helpers take the element index d at which the entry reads its row
 * and ask only where d begins a 64-byte line of the row (the offsets are
 * the row's own: a row that does not start on a line boundary has its
 * last line asked for at d = 0 as well). The hint never faults and never
 * changes a result.
 */
#ifndef LAMINA_X86_SHADOW_H
#define LAMINA_X86_SHADOW_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "format/quant.h"

#define SHADOW_INLINE static inline __attribute__((always_inline))

SHADOW_INLINE void shadow_line(const void *p, size_t off) { _mm_prefetch((const char *)p + off, _MM_HINT_T1); }

/* An F16 row of hd halves read at element d. */
SHADOW_INLINE void shadow_f16(const void *pf, int d, int hd) {
    if (d % 32 == 0) shadow_line(pf, 2 * (size_t)d);
    if (d == 0 && (((uintptr_t)pf | (uintptr_t)(2 * hd)) & 63)) shadow_line(pf, 2 * (size_t)hd - 1);
}

/* A Q8_0 row (hd / 32 blocks of 34 bytes) read at element d: at each
 * block's start, the line holding its last byte, and the row's first line
 * at d = 0 (consecutive blocks' last bytes are 34 apart, so every line the
 * row touches is asked for). */
SHADOW_INLINE void shadow_q8(const void *pf, int d) {
    if (d % QK8_0) return;
    if (d == 0) shadow_line(pf, 0);
    shadow_line(pf, (size_t)(d / QK8_0) * sizeof(block_q8_0) + sizeof(block_q8_0) - 1);
}

/* Address order. The entries visit a chunk's rows across their columns
 * (the scores a few rows at a time along the head dim, P·V each column
 * tile down every row), so the shadow asks for lines 512 bytes apart and
 * the L2's own streamer, which follows ascending lines within a page,
 * never joins in. Where every pf row is whole 64-byte lines, L of them (L
 * = 2 hd / 64 a power of two) and line-aligned, an entry may number its
 * line slots instead, k = i n + t for the i-th line of row t of n, and
 * ask at slot k for line k mod L of row k / L: the same lines, asked in
 * address order, so the streamer runs ahead of them. Measured on the Xeon
 * (bench/README.md, "Prefetch in address order"): Gemma 3 270M's decode
 * attention at depth 16384 (head dim 256, F16) took 0.91-0.98x the time
 * of the reading order; the TinyLlama shape's (head dim 64) 1.01-1.05x,
 * within the runs' noise. Q8_0 rows (34-byte blocks) keep shadow_q8.
 * shadow_seq_shift gives log2(L), or -1 where the rows do not qualify
 * (then shadow_f16). */
SHADOW_INLINE int shadow_seq_shift(const void *const *pf, int n, int hd) {
    int L = hd / 32;
    if (hd % 32 || (L & (L - 1))) return -1;
    uintptr_t a = 0;
    for (int t = 0; t < n; t++) a |= (uintptr_t)pf[t];
    return a & 63 ? -1 : __builtin_ctz((unsigned)L);
}

/* Slot k of rows pf of 2^sh lines each (shadow_seq_shift). */
SHADOW_INLINE void shadow_seq(const void *const *pf, size_t k, int sh) {
    shadow_line(pf[k >> sh], (k & (((size_t)1 << sh) - 1)) * 64);
}

#endif
