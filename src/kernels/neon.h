/*
 * neon.h - the AArch64 NEON matrix-product and conversion kernels.
 *
 * Two variants of the same code, for the weight types lamina multiplies
 * (F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, MXFP4, Q4_K, Q5_K, Q6_K):
 *
 *   neon      plain Armv8-A Advanced SIMD (every AArch64 CPU has it): the
 *             int8 dot products of the quantized types as widening
 *             multiplies (smull) and pairwise adds (sadalp);
 *   neondot   the same with the dot-product extension (sdot, Armv8.2-A
 *             FEAT_DotProd; HWCAP_ASIMDDP), the only build compiled with
 *             -march=armv8.2-a+dotprod, so the binary still runs on plain
 *             Armv8-A.
 *
 * kernels/neon_tiles.c holds the dot products and tiles, built once per
 * variant (Makefile, kernels/variant.h: names neon_* and neon_dot_*) with
 * the int8 dot product of the variant; kernels/neon_quant.c the
 * quantizers and conversions both share. The activation types are those of the scalar reference
 * (format/quant.h: Q8_0 for the 32-element types, Q8_K for the K-quants, F16
 * for F16 weights, F32 for F32 and BF16).
 *
 * Contracts (as kernels/avx2.h):
 *  - vec_dot agrees with quant_vec_dot_ref within float rounding (tests:
 *    1e-5 of sum |w x|). The integer work per block is exact; the float
 *    steps are: 32-element types acc = fma(float(isum_b) lanes, dw_b * dx_b,
 *    acc) over blocks in order, one 4-lane accumulator (Q4_1/Q5_1 add
 *    m_b * dx_b * sum(xq_b) into a second one); K-quants one scalar
 *    accumulator per row, acc += dx d isum - dx dmin msum per super-block;
 *    float types four 4-lane fma accumulators over groups of 16 elements
 *    (a tail shorter than 16 zero-padded). Every output ends with the same
 *    horizontal sums.
 *  - gemm computes each output of its tile with that type's vec_dot, so it
 *    is bit-identical to vec_dot whatever nr and nc (the batch never
 *    changes a token's result).
 *  - from_float (Q8_0, Q8_K, F16) gives the reference's bytes; to_float
 *    (F16, Q8_0) the reference's bits (F16: NaN payloads aside; every
 *    non-NaN half converts exactly, FCVTL). Round-to-nearest, ties away
 *    (roundf) is FCVTAS; the f16 conversions are NEON's FCVTN/FCVTL, IEEE
 *    round to nearest even under Linux's default FPCR.
 *  - Interleaved (packed) tiles for Q8_0, Q4_0 and MXFP4 (quant.h's layout
 *    of 8 rows, against block_q8_0s activations; neon_tiles.c): per (row, token)
 *    acc = fma(float(isum_b), dw_b * dx_b, acc) over the block columns in
 *    order, the integer sums exact, so both variants give the same bits and
 *    a token's result does not depend on its tile (1 to NEON_PACK_TILE
 *    tokens); packed_act gives quant_packed_act_ref's bytes. The other
 *    types stay row-major on AArch64 (packed_gemm NULL in the table).
 *  - attn_scores_q8_0_q8 is kernels.h's scores_q8_0_q8 (the scalar
 *    reference's bits, in both variants; neon_tiles.c), which
 *    kernels/dispatch.c puts in the attention entries.
 *
 * Call the neon_* functions only when cpu_has_neon() is true and the
 * neon_dot_* ones when cpu_has_neon_dot() is; neon_kernels() hands them out
 * by type to the kernel table (kernels/dispatch.c). On other targets it
 * returns NULL and the cpu_has_* functions false.
 */
#ifndef LAMINA_NEON_H
#define LAMINA_NEON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/quant.h"

/* True on an AArch64 CPU with Advanced SIMD (HWCAP_ASIMD and HWCAP_FP). */
bool cpu_has_neon(void);
/* True when it also has the dot-product extension (HWCAP_ASIMDDP). */
bool cpu_has_neon_dot(void);

/* The NEON kernels of one type; NULL members keep the reference. */
typedef struct {
    lm_to_float_fn to_float;       /* this type to floats */
    lm_from_float_fn from_float;   /* quantize floats into this type */
    lm_vec_dot_fn vec_dot;         /* weights of this type · vec_dot_type */
    lm_gemm_fn gemm;               /* tile matching vec_dot bit for bit */
    lm_packed_gemm_fn packed_gemm; /* interleaved weights (Q8_0, Q4_0, MXFP4), or NULL */
    lm_from_float_fn packed_act;   /* floats -> packed_gemm's block_q8_0s rows */
    int pack_tile;                 /* most tokens per packed_gemm call */
} lm_neon_kernels;

/* Tokens per packed tile: two float accumulators per token beside the 16
 * vectors of a block column's weights stay within the 32 NEON registers. */
#define NEON_PACK_TILE 4

/* The kernels of a type for the plain (dot false) or dot-product variant,
 * or NULL when there are none (or not AArch64). */
const lm_neon_kernels *neon_kernels(uint32_t type, bool dot);

#if defined(__aarch64__)
#define NEON_DECL(P)                                                                                                   \
    float P##vec_dot_f32(int64_t n, const void *w, const void *x);                                                     \
    float P##vec_dot_f16(int64_t n, const void *w, const void *x);                                                     \
    float P##vec_dot_bf16(int64_t n, const void *w, const void *x);                                                    \
    float P##vec_dot_q8_0(int64_t n, const void *w, const void *x);                                                    \
    float P##vec_dot_q4_0(int64_t n, const void *w, const void *x);                                                    \
    float P##vec_dot_q5_0(int64_t n, const void *w, const void *x);                                                    \
    float P##vec_dot_q4_1(int64_t n, const void *w, const void *x);                                                    \
    float P##vec_dot_q5_1(int64_t n, const void *w, const void *x);                                                    \
    float P##vec_dot_mxfp4(int64_t n, const void *w, const void *x);                                                   \
    float P##vec_dot_q4_K(int64_t n, const void *w, const void *x);                                                    \
    float P##vec_dot_q5_K(int64_t n, const void *w, const void *x);                                                    \
    float P##vec_dot_q6_K(int64_t n, const void *w, const void *x);                                                    \
    void P##gemm_f32(int64_t, const void *, size_t, int, const void *, size_t, int, float *, size_t);                  \
    void P##gemm_f16(int64_t, const void *, size_t, int, const void *, size_t, int, float *, size_t);                  \
    void P##gemm_bf16(int64_t, const void *, size_t, int, const void *, size_t, int, float *, size_t);                 \
    void P##gemm_q8_0(int64_t, const void *, size_t, int, const void *, size_t, int, float *, size_t);                 \
    void P##gemm_q4_0(int64_t, const void *, size_t, int, const void *, size_t, int, float *, size_t);                 \
    void P##gemm_q5_0(int64_t, const void *, size_t, int, const void *, size_t, int, float *, size_t);                 \
    void P##gemm_q4_1(int64_t, const void *, size_t, int, const void *, size_t, int, float *, size_t);                 \
    void P##gemm_q5_1(int64_t, const void *, size_t, int, const void *, size_t, int, float *, size_t);                 \
    void P##gemm_mxfp4(int64_t, const void *, size_t, int, const void *, size_t, int, float *, size_t);                \
    void P##gemm_q4_K(int64_t, const void *, size_t, int, const void *, size_t, int, float *, size_t);                 \
    void P##gemm_q5_K(int64_t, const void *, size_t, int, const void *, size_t, int, float *, size_t);                 \
    void P##gemm_q6_K(int64_t, const void *, size_t, int, const void *, size_t, int, float *, size_t);                 \
    void P##packed_gemm_q8_0(int64_t, const void *, int, const void *, size_t, int, float *, size_t);                  \
    void P##packed_gemm_q4_0(int64_t, const void *, int, const void *, size_t, int, float *, size_t);                  \
    void P##packed_gemm_mxfp4(int64_t, const void *, int, const void *, size_t, int, float *, size_t);                 \
    void P##attn_scores_q8_0_q8(const void *, int, int, const void *const *, int, float *, int, const void *const *,   \
                                int);
NEON_DECL(neon_)
NEON_DECL(neon_dot_)

void neon_to_float_f16(const void *src, float *dst, int64_t n);
void neon_to_float_q8_0(const void *src, float *dst, int64_t n);
void neon_from_float_f16(const float *src, void *dst, int64_t n);
void neon_from_float_q8_0(const float *src, void *dst, int64_t n);
void neon_from_float_q8_K(const float *src, void *dst, int64_t n);
void neon_packed_act(const float *src, void *dst, int64_t n);
#endif

#endif
