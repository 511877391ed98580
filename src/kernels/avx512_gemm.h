/*
 * avx512_gemm.h - 512-bit (zmm) matrix tiles for prompt processing in the
 * avx512 and avx512vnni variants, laid by kernels/dispatch.c over the
 * AVX2 sources re-encoded for those variants (kernels/x86.h).
 *
 *   type   entry                      layout / activations
 *   F16    avx512_gemm_panel_f16    panels of 16 rows (quant.h) / F32
 *   F16    avx512_panel_widen_block  a block of a panel's columns -> F32
 *          avx512_gemm_panel2_f32   two widened groups x 12 tokens, k-blocked
 *
 * Contracts: those of the entries they replace (kernels/avx2.h). The F16
 * panel tile computes, lane r = row r of the group, the same fmaf chains
 * in the same order as quant_panel_dot_ref, so its outputs equal the AVX2
 * panel tile's and the reference's bit for bit, for every tile width and
 * token position: batch invariance holds, and decode (one token) and
 * prefill (tiles of up to pack_tile tokens) give the same bits for a
 * (row, token). Call only when cpu_has_avx512() is true.
 */
#ifndef LAMINA_AVX512_GEMM_H
#define LAMINA_AVX512_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/avx2.h"
#include "kernels/kernels.h"

/* The 512-bit entries for a type, NULL members meaning "keep the variant's
 * own"; NULL when there are none (other types, not x86-64, or the
 * sanitizer builds that leave the variants out, LAMINA_X86_BASE_ONLY).
 * vnni: the avx512vnni variant (its int8 products may use vpdpbusd). */
const lm_avx2_kernels *avx512_gemm_kernels(uint32_t type, bool vnni);

/* The k-blocked F16 entries (kernels.h: panel_widen, panel2) for a type;
 * both NULL where there are none (as avx512_gemm_kernels). */
void avx512_gemm_panel2_lookup(uint32_t type, lm_panel_widen_fn *widen, lm_panel2_fn *tile);

#if defined(__x86_64__) || defined(__i386__)
void avx512_gemm_panel_f16(int64_t n, const void *wp, int nr, const void *x, size_t x_stride, int nc, float *y,
                           size_t y_stride);
/* Columns [k0, k1) of the F16 panel group at wp widened to floats at wf
 * ((k1 - k0) x 16: element k of row r at wf[16 (k - k0) + r]). */
void avx512_panel_widen_block(const void *wp, int64_t k0, int64_t k1, float *wf);
/* Two consecutive groups (rows [0, nr0) of y and [16, 16 + nr1), nr1 = 0:
 * one group) by nc <= 12 tokens over columns [k0, k1) of a row of n >= 4
 * elements, on the groups' columns widened by avx512_panel_widen_block
 * (group 1's after group 0's, at wf + 16 (k1 - k0)). st holds each
 * token's chains between calls (nc x 96 floats, untouched by the caller):
 * call with consecutive blocks from k0 = 0 to k1 = n, the same st, x and
 * y; the outputs are written by the call that reaches n, and are
 * avx512_gemm_panel_f16's bit for bit, however [0, n) is cut. */
void avx512_gemm_panel2_f32(int64_t n, int64_t k0, int64_t k1, const float *wf, int nr0, int nr1, const void *x,
                            size_t x_stride, int nc, float *st, float *y, size_t y_stride);
#endif

#endif
