/*
 * x86_variant.h - builds the AVX2 kernel sources (kernels/avx2_quant.c,
 * avx2_packed.c, avx2_panel.c) again as another x86 variant of the kernel
 * table: AVX-512 (F/BW/VL), AVX-512 with VNNI, or AVX-VNNI.
 *
 * A variant's files (kernels/avx512_*.c, avx512vnni_*.c, avxvnni_*.c) define
 * X86_PREFIX (the names' prefix: avx512_, ...) and, for the VNNI variants,
 * X86_VNNI (1: the EVEX form of AVX512-VNNI on 256-bit vectors, needs
 * AVX512VL; 2: the VEX form of AVX-VNNI), include this header and then the
 * AVX2 source. This header renames every function kernels/avx2.h declares
 * (avx2_vec_dot_q8_0 becomes avx512vnni_vec_dot_q8_0, avx2_kernels
 * avx512vnni_kernels, ...), so each variant is its own set of symbols with
 * the same contracts (kernels/avx2.h); cpu_has_avx2 and the lm_avx2_kernels
 * type keep their names.
 *
 * The Makefile compiles each variant's files with its own target flags
 * (-mavx512f -mavx512bw -mavx512vl, plus -mavx512vnni or -mavxvnni): the
 * compiler then encodes the same operations with the variant's instructions
 * (EVEX, 32 vector registers), and nothing of it runs unless dispatch.c
 * checked the CPU (cpu.c) for that variant.
 *
 * X86_DPBUSD(acc, u, s) is then defined as vpdpbusd on 256-bit vectors:
 * acc + the sums of four products u8 x s8 per 32-bit lane. The sources use
 * it where the AVX2 path forms the same exact int32 sums with pmaddubsw and
 * pmaddwd (no step of which saturates in those places), so a VNNI variant's
 * integer sums, and hence every float result, equal the AVX2 path's bit for
 * bit: the tests compare the variants with memcmp.
 *
 * X86_DPWSSD(acc, a, b) is vpdpwssd: acc + a0*b0 + a1*b1 per 32-bit lane,
 * a and b read as int16 pairs (no saturation). The K-quants use it to apply
 * a sub-block scale to an int32 sum that fits in int16 (a vpdpbusd of four
 * products, at most 4 * 63 * 128 = 32256): b holds the scale in the lane's
 * low int16 and zero in its high one, so the sum's sign-extension bits are
 * multiplied by zero and the lane gains exactly sum * scale, what pmaddwd
 * and an add give on the AVX2 path.
 */
#ifndef LAMINA_X86_VARIANT_H
#define LAMINA_X86_VARIANT_H

#if !defined(X86_PREFIX)
#error "define X86_PREFIX before including kernels/x86_variant.h"
#endif

#define X86_NAME_(p, n) p##n
#define X86_NAME(p, n) X86_NAME_(p, n)

#if !defined(__x86_64__) && !defined(__i386__)
/* another architecture: the AVX2 sources compile to empty lookups */
#elif defined(X86_VNNI) && X86_VNNI == 1
#if !defined(__AVX512VNNI__) || !defined(__AVX512VL__)
#error "X86_VNNI 1 needs -mavx512vnni -mavx512vl"
#endif
#define X86_DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#define X86_DPWSSD(acc, a, b) _mm256_dpwssd_epi32(acc, a, b)
#elif defined(X86_VNNI) && X86_VNNI == 2
#if !defined(__AVXVNNI__)
#error "X86_VNNI 2 needs -mavxvnni"
#endif
#define X86_DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#define X86_DPWSSD(acc, a, b) _mm256_dpwssd_avx_epi32(acc, a, b)
#endif

#define avx2_from_float_f16 X86_NAME(X86_PREFIX, from_float_f16)
#define avx2_from_float_q8_0 X86_NAME(X86_PREFIX, from_float_q8_0)
#define avx2_from_float_q8_K X86_NAME(X86_PREFIX, from_float_q8_K)
#define avx2_gemm_bf16 X86_NAME(X86_PREFIX, gemm_bf16)
#define avx2_gemm_f16 X86_NAME(X86_PREFIX, gemm_f16)
#define avx2_gemm_f32 X86_NAME(X86_PREFIX, gemm_f32)
#define avx2_gemm_q4_0 X86_NAME(X86_PREFIX, gemm_q4_0)
#define avx2_gemm_q4_1 X86_NAME(X86_PREFIX, gemm_q4_1)
#define avx2_gemm_q4_K X86_NAME(X86_PREFIX, gemm_q4_K)
#define avx2_gemm_q5_0 X86_NAME(X86_PREFIX, gemm_q5_0)
#define avx2_gemm_q5_1 X86_NAME(X86_PREFIX, gemm_q5_1)
#define avx2_gemm_q5_K X86_NAME(X86_PREFIX, gemm_q5_K)
#define avx2_gemm_q6_K X86_NAME(X86_PREFIX, gemm_q6_K)
#define avx2_gemm_q8_0 X86_NAME(X86_PREFIX, gemm_q8_0)
#define avx2_kernels X86_NAME(X86_PREFIX, kernels)
#define avx2_packed_act X86_NAME(X86_PREFIX, packed_act)
#define avx2_packed_gemm_f16 X86_NAME(X86_PREFIX, packed_gemm_f16)
#define avx2_packed_gemm_q4_0 X86_NAME(X86_PREFIX, packed_gemm_q4_0)
#define avx2_packed_gemm_q4_1 X86_NAME(X86_PREFIX, packed_gemm_q4_1)
#define avx2_packed_gemm_q4_K X86_NAME(X86_PREFIX, packed_gemm_q4_K)
#define avx2_packed_gemm_q5_0 X86_NAME(X86_PREFIX, packed_gemm_q5_0)
#define avx2_packed_gemm_q5_1 X86_NAME(X86_PREFIX, packed_gemm_q5_1)
#define avx2_packed_gemm_q8_0 X86_NAME(X86_PREFIX, packed_gemm_q8_0)
#define avx2_to_float_f16 X86_NAME(X86_PREFIX, to_float_f16)
#define avx2_to_float_q8_0 X86_NAME(X86_PREFIX, to_float_q8_0)
#define avx2_vec_dot_bf16 X86_NAME(X86_PREFIX, vec_dot_bf16)
#define avx2_vec_dot_f16 X86_NAME(X86_PREFIX, vec_dot_f16)
#define avx2_vec_dot_f32 X86_NAME(X86_PREFIX, vec_dot_f32)
#define avx2_vec_dot_q4_0 X86_NAME(X86_PREFIX, vec_dot_q4_0)
#define avx2_vec_dot_q4_1 X86_NAME(X86_PREFIX, vec_dot_q4_1)
#define avx2_vec_dot_q4_K X86_NAME(X86_PREFIX, vec_dot_q4_K)
#define avx2_vec_dot_q5_0 X86_NAME(X86_PREFIX, vec_dot_q5_0)
#define avx2_vec_dot_q5_1 X86_NAME(X86_PREFIX, vec_dot_q5_1)
#define avx2_vec_dot_q5_K X86_NAME(X86_PREFIX, vec_dot_q5_K)
#define avx2_vec_dot_q6_K X86_NAME(X86_PREFIX, vec_dot_q6_K)
#define avx2_vec_dot_q8_0 X86_NAME(X86_PREFIX, vec_dot_q8_0)

#endif
