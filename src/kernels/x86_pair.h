/*
 * x86_pair.h - 512-bit decode tiles of the AVX-512 variants: two
 * interleaved groups of weight rows at once against a few tokens.
 *
 * A pair kernel (lm_packed_gemm_fn's signature, quant.h) computes rows
 * [0, nr) of the TWO consecutive groups at wp (8 < nr <= 16: rows 0..7 are
 * the first group's, 8..15 the second's, which starts quant_pack_size(type,
 * 8, n) bytes after the first) against nc <= LM_PAIR_TILE activation rows
 * in the packed kernels' format (block_q8_0s; Q8_K for Q4_K):
 *     y[c * y_stride + r] = row r . token c
 * Row r of the first group sits in 32-bit lane r of every 512-bit vector,
 * row r of the second in lane 8 + r, so the 16 rows' quants of one block
 * column unpack with one instruction per four quants of each row, and one
 * broadcast of the token's four quants serves both groups. Each thread then
 * reads two streams of weight bytes (the groups, one group's bytes apart).
 *
 * Every output equals the same variant's (and avx2's) packed_gemm output
 * bit for bit: the integer sums of a block are exact either way, and each
 * lane takes the float steps of kernels/avx2_packed.c in the same order
 * (acc = fma(float(isum), dw * dx, acc) per block, blocks in order; Q4_1
 * and Q5_1 their second step with m, Q4_K its two steps per super-block).
 * So a token's result does not depend on which kernel ran it, nor on the
 * batch it shares.
 *
 *   variant      built with                      integer sums
 *   avx512       -mavx512f -mavx512bw -mavx512vl pmaddubsw / pmaddwd
 *   avx512vnni   the same + -mavx512vnni         vpdpbusd (Q4_0..Q5_1, Q8_0), vpdpwssd (Q4_K)
 *
 * avx512_pair_kernel(type) and avx512vnni_pair_kernel(type) give the
 * kernel for Q4_0, Q5_0, Q4_1, Q5_1, Q8_0 and Q4_K (NULL for any other
 * type, off x86, and in the sanitizer builds: LAMINA_X86_BASE_ONLY). Call
 * one only when the CPU runs its variant (kernels_cpu_has); dispatch.c puts
 * them in the kernel table as packed_pair.
 */
#ifndef LAMINA_X86_PAIR_H
#define LAMINA_X86_PAIR_H

#include <stdint.h>

#include "format/quant.h"

/* The most tokens a pair kernel takes: decode and small batches (more
 * tokens go through packed_gemm, which reuses each unpacked block more). */
#define LM_PAIR_TILE 4

lm_packed_gemm_fn avx512_pair_kernel(uint32_t type);
lm_packed_gemm_fn avx512vnni_pair_kernel(uint32_t type);

#endif
