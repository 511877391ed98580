/*
 * avx2.h - the x86-64 AVX2 matrix-product and conversion kernels.
 *
 * The scalar reference kernels live in format/quant.c and define what every
 * variant here computes. This header declares the AVX2 variants (AVX2 + FMA +
 * F16C, in kernels/avx2_quant.c) for the weight types lamina multiplies:
 *
 *   weight type   activation (vec_dot_type)   vec_dot / gemm          from_float
 *   F32, BF16        F32                      avx2_vec_dot_<t>, _gemm_ -
 *   F16              F16 (panels: F32)        avx2_vec_dot_f16, _gemm_ avx2_from_float_f16
 *   Q8_0, Q4_0, Q5_0 Q8_0                     avx2_vec_dot_<t>, _gemm_ avx2_from_float_q8_0
 *   Q4_1, Q5_1       Q8_0                     avx2_vec_dot_<t>, _gemm_ -
 *   MXFP4            Q8_0                     avx2_vec_dot_<t>, _gemm_ -
 *   Q4_K, Q5_K, Q6_K Q8_K                     avx2_vec_dot_<t>, _gemm_ avx2_from_float_q8_K
 *
 * and, for Q8_0, Q4_0, Q5_0, Q4_1, Q5_1 and MXFP4 weights in the interleaved layout of quant.h
 * (kernels/avx2_packed.c), avx2_packed_gemm_<t> against block_q8_0s
 * activations from avx2_packed_act; for Q4_K weights likewise
 * avx2_packed_gemm_q4_K against Q8_K activations; for F16 weights in the panel layout
 * (kernels/avx2_panel.c), avx2_packed_gemm_f16 against F32 activations.
 *
 * Contracts:
 *  - vec_dot has the signature of lm_vec_dot_fn: one weight row of n elements
 *    against one activation row already in vec_dot_type; n a multiple of the
 *    block size (any n >= 0 for the float types). Results agree with
 *    quant_vec_dot_ref to float rounding (tests state the tolerances).
 *  - gemm (lm_gemm_fn and LM_GEMM_TILE are in quant.h) computes a tile of
 *    nr weight rows by nc activation rows (1 <= nr, nc <= LM_GEMM_TILE; 0
 *    does nothing):
 *        y[c * y_stride + r] = vec_dot(n, w + r * w_stride, x + c * x_stride)
 *    and every one of those floats is BIT-IDENTICAL to what the same type's
 *    avx2_vec_dot returns, whatever nr and nc are: each output has its own
 *    accumulators and the same sequence of float operations in both. This
 *    is what lets a token's output not depend on the batch it shares. Each
 *    weight block is decoded once per tile and each activation block loaded
 *    once per weight row, so wider tiles do less work per output. With
 *    nc == 1 the rows are simply done one after another (that streams from
 *    memory best), so decode may call gemm or vec_dot per row alike; the
 *    float types instead run the tile's rows together with nc == 1 (one
 *    accumulator per output needs several chains to cover FMA latency). The
 *    kernels prefetch the weight bytes they will read 4 KiB later.
 *  - packed_gemm (lm_packed_gemm_fn, quant.h) computes rows [0, nr) of one
 *    interleaved group (8 rows; F16: 16) against nc <= pack_tile activation
 *    rows:
 *        y[c * y_stride + r] = row r · token c
 *    Each output has its own accumulator lane and the same float steps in
 *    the same order whatever nc and the token's place in the tile, so every
 *    product of a packed matrix, one token or many, gives the same bits for
 *    a (row, token). Its results differ from vec_dot's in rounding only (a
 *    matrix uses one family or the other for all its products), and agree
 *    with quant_vec_dot_ref within the same tolerance (F16 panels: equal to
 *    quant_panel_dot_ref bit for bit). Rows past nr in the group are
 *    computed from the zero padding and not stored.
 *  - from_float produces blocks bit-identical to quant_from_float_ref, so
 *    nothing downstream depends on which path quantized; likewise
 *    packed_act and quant_packed_act_ref, and to_float (F16 and Q8_0, the
 *    KV cache's types: every value is exact in float) and
 *    quant_to_float_ref (NaN payloads aside).
 *  - Strides are in bytes for w and x, in floats for y. Rows must be aligned
 *    like their block struct (2 bytes; 4 for Q8_K), as GGUF guarantees.
 *  - Activations in Q8_0 must lie in [-127, 127], which both quantizers
 *    produce (the sign trick of the Q8_0 weight kernel cannot negate -128).
 *
 * These functions use AVX2/FMA/F16C instructions: call them only when
 * cpu_has_avx2() is true. avx2_kernels() hands them out by type to the
 * kernel table (kernels/dispatch.c); on non-x86 builds it returns NULL and
 * nothing else is defined.
 */
#ifndef LAMINA_AVX2_H
#define LAMINA_AVX2_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/quant.h"

/* True when the CPU has AVX2, FMA and F16C and the OS saves YMM state. */
bool cpu_has_avx2(void);

/* The AVX2 kernels of one type; NULL members keep the reference. */
typedef struct {
    lm_to_float_fn to_float;       /* this type to floats */
    lm_from_float_fn from_float;   /* quantize floats into this type */
    lm_vec_dot_fn vec_dot;         /* weights of this type · vec_dot_type */
    lm_gemm_fn gemm;               /* tile kernel matching vec_dot bit for bit */
    lm_packed_gemm_fn packed_gemm; /* interleaved weights (quant.h), or NULL */
    lm_from_float_fn packed_act;   /* floats -> block_q8_0s, with packed_gemm */
    int gemm_cols;                 /* activation rows per gemm call it is fastest
                                      with; 0: LM_GEMM_TILE */
    int pack_tile;                 /* most activation rows per packed_gemm call */
} lm_avx2_kernels;

/* The kernels for a type, or NULL when there are none (or not x86-64). */
const lm_avx2_kernels *avx2_kernels(uint32_t type);

#if defined(__x86_64__) || defined(__i386__)
float avx2_vec_dot_f32(int64_t n, const void *w, const void *x);
float avx2_vec_dot_f16(int64_t n, const void *w, const void *x);
float avx2_vec_dot_bf16(int64_t n, const void *w, const void *x);
float avx2_vec_dot_q8_0(int64_t n, const void *w, const void *x);
float avx2_vec_dot_q4_0(int64_t n, const void *w, const void *x);
float avx2_vec_dot_q5_0(int64_t n, const void *w, const void *x);
float avx2_vec_dot_q4_1(int64_t n, const void *w, const void *x);
float avx2_vec_dot_q5_1(int64_t n, const void *w, const void *x);
float avx2_vec_dot_mxfp4(int64_t n, const void *w, const void *x);
float avx2_vec_dot_q4_K(int64_t n, const void *w, const void *x);
float avx2_vec_dot_q5_K(int64_t n, const void *w, const void *x);
float avx2_vec_dot_q6_K(int64_t n, const void *w, const void *x);

void avx2_gemm_f32(int64_t n, const void *w, size_t w_stride, int nr, const void *x, size_t x_stride, int nc, float *y,
                   size_t y_stride);
void avx2_gemm_f16(int64_t n, const void *w, size_t w_stride, int nr, const void *x, size_t x_stride, int nc, float *y,
                   size_t y_stride);
void avx2_gemm_bf16(int64_t n, const void *w, size_t w_stride, int nr, const void *x, size_t x_stride, int nc, float *y,
                    size_t y_stride);
void avx2_gemm_q8_0(int64_t n, const void *w, size_t w_stride, int nr, const void *x, size_t x_stride, int nc, float *y,
                    size_t y_stride);
void avx2_gemm_q4_0(int64_t n, const void *w, size_t w_stride, int nr, const void *x, size_t x_stride, int nc, float *y,
                    size_t y_stride);
void avx2_gemm_q5_0(int64_t n, const void *w, size_t w_stride, int nr, const void *x, size_t x_stride, int nc, float *y,
                    size_t y_stride);
void avx2_gemm_q4_1(int64_t n, const void *w, size_t w_stride, int nr, const void *x, size_t x_stride, int nc, float *y,
                    size_t y_stride);
void avx2_gemm_q5_1(int64_t n, const void *w, size_t w_stride, int nr, const void *x, size_t x_stride, int nc, float *y,
                    size_t y_stride);
void avx2_gemm_mxfp4(int64_t n, const void *w, size_t w_stride, int nr, const void *x, size_t x_stride, int nc,
                     float *y, size_t y_stride);
void avx2_gemm_q4_K(int64_t n, const void *w, size_t w_stride, int nr, const void *x, size_t x_stride, int nc, float *y,
                    size_t y_stride);
void avx2_gemm_q5_K(int64_t n, const void *w, size_t w_stride, int nr, const void *x, size_t x_stride, int nc, float *y,
                    size_t y_stride);
void avx2_gemm_q6_K(int64_t n, const void *w, size_t w_stride, int nr, const void *x, size_t x_stride, int nc, float *y,
                    size_t y_stride);

void avx2_packed_gemm_q8_0(int64_t n, const void *wp, int nr, const void *x, size_t x_stride, int nc, float *y,
                           size_t y_stride);
void avx2_packed_gemm_q4_0(int64_t n, const void *wp, int nr, const void *x, size_t x_stride, int nc, float *y,
                           size_t y_stride);
void avx2_packed_gemm_q5_0(int64_t n, const void *wp, int nr, const void *x, size_t x_stride, int nc, float *y,
                           size_t y_stride);
void avx2_packed_gemm_q4_1(int64_t n, const void *wp, int nr, const void *x, size_t x_stride, int nc, float *y,
                           size_t y_stride);
void avx2_packed_gemm_q5_1(int64_t n, const void *wp, int nr, const void *x, size_t x_stride, int nc, float *y,
                           size_t y_stride);
void avx2_packed_gemm_mxfp4(int64_t n, const void *wp, int nr, const void *x, size_t x_stride, int nc, float *y,
                            size_t y_stride);
void avx2_packed_gemm_q4_K(int64_t n, const void *wp, int nr, const void *x, size_t x_stride, int nc, float *y,
                           size_t y_stride);
void avx2_packed_gemm_f16(int64_t n, const void *wp, int nr, const void *x, size_t x_stride, int nc, float *y,
                          size_t y_stride);
void avx2_packed_act(const float *src, void *dst, int64_t n);

void avx2_to_float_f16(const void *src, float *dst, int64_t n);
void avx2_to_float_q8_0(const void *src, float *dst, int64_t n);
void avx2_from_float_f16(const float *src, void *dst, int64_t n);
void avx2_from_float_q8_0(const float *src, void *dst, int64_t n);
void avx2_from_float_q8_K(const float *src, void *dst, int64_t n);
#endif

#endif
