/*
 * avx2_q5_0.h - AVX2 kernels for Q5_0 weights against Q8_0 activations.
 * Call only when cpu_has_avx2() is true.
 */
#ifndef LAMINA_AVX2_Q5_0_H
#define LAMINA_AVX2_Q5_0_H

#include <stddef.h>
#include <stdint.h>

float avx2_vec_dot_q5_0(int64_t n, const void *w, const void *x);
/* Tile kernel with the lm_gemm_fn contract; each output is exactly
 * avx2_vec_dot_q5_0 of its row pair. */
void avx2_gemm_q5_0(int64_t n, const void *w, size_t w_stride, int nr, const void *x, size_t x_stride, int nc,
                    float *y, size_t y_stride);

#endif
