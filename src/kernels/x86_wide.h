/*
 * x86_wide.h - the avx512vnni variant's 512-bit prefill tiles for K-quant
 * weights in the interleaved layout (quant.h): two consecutive groups (16
 * weight rows, the second group quant_pack_size(type, 8, n) bytes after
 * the first) against LM_PAIR_TILE < nc <= LM_WIDE_TILE activation rows in
 * the packed kernels' format (Q8_K for Q4_K). Same call as a packed_gemm
 * (nr in (8, 16] rows).
 *
 * Contract: the outputs equal packed_gemm's on each group, bit for bit
 * (the integer sums are exact and the float steps are the same, in the
 * same order), so a (row, token) gets the same bits whichever tile and
 * group layout computes it: batch invariance holds.
 *
 * avx512vnni_wide_kernel(type) gives the kernel for Q4_K (NULL for any
 * other type, off x86, and in the sanitizer builds: LAMINA_X86_BASE_ONLY).
 * Call it only when the CPU runs avx512vnni (kernels_cpu_has); dispatch.c
 * puts it in the kernel table as packed_wide for the avx512vnni and
 * avx512bf16 variants.
 */
#ifndef LAMINA_X86_WIDE_H
#define LAMINA_X86_WIDE_H

#include <stdint.h>

#include "format/quant.h"

/* The most tokens a wide kernel takes: the packed tile's width. */
#define LM_WIDE_TILE LM_PACK_TILE

lm_packed_gemm_fn avx512vnni_wide_kernel(uint32_t type);

/* The row-major Q6_K gemm tile (quant.h's lm_gemm_fn) with two weight rows
 * per 512-bit vector, bit-identical to the avx512vnni variant's vec_dot
 * and 256-bit tile (avx512vnni_gemm_q6_K, to which it leaves one row or
 * one token): the avx512vnni variant's kernel table (kernels/avx2_quant.c
 * built as that variant) holds it as Q6_K's gemm, and so avx512bf16's.
 * Only in the avx512vnni variant's build (not off x86, not in the
 * sanitizer builds). */
void avx512vnni_wide_gemm_q6_K(int64_t n, const void *w, size_t ws, int nr, const void *x, size_t xs, int nc, float *y,
                               size_t ys);
/* The variant's 256-bit Q6_K tile (kernels/avx2_quant.c's avx2_gemm_q6_K
 * under the avx512vnni_ prefix, kernels/variant.h). */
void avx512vnni_gemm_q6_K(int64_t n, const void *w, size_t ws, int nr, const void *x, size_t xs, int nc, float *y,
                          size_t ys);

#endif
