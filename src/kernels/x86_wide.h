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

#endif
