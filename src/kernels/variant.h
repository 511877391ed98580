/*
 * variant.h - the symbol names of a kernel variant. A source that builds
 * more than one variant of the kernel table is compiled once per variant
 * by the Makefile (build/obj/kernels/<variant>/<file>.o), each time with
 * that variant's target flags and -DLM_VARIANT=<variant>; this header,
 * included before anything else, turns LM_VARIANT into the prefix of
 * every function the source defines for other files, so each variant is
 * its own set of symbols with the same contracts. Without LM_VARIANT
 * (the file's own, first variant) nothing is renamed.
 *
 *   LM_VFN(name)   LM_VARIANT ## _ ## name (avx512vnni_pair_kernel, ...)
 *
 * x86: kernels/avx2_quant.c, avx2_packed.c and avx2_panel.c are avx2's
 * and, built again, avxvnni's, avx512's and avx512vnni's (the variants
 * and their flags are in kernels/x86.h); kernels/avx512_pair.c is
 * avx512's and avx512vnni's. The names kernels/avx2.h declares become
 * the variant's (avx2_vec_dot_q8_0 is avx512vnni_vec_dot_q8_0 in the
 * avx512vnni build, avx2_kernels avx512vnni_kernels, ...); cpu_has_avx2
 * and the lm_avx2_kernels type keep their names. The compiler then
 * encodes the same operations with the variant's instructions (EVEX, 32
 * vector registers), and nothing of it runs unless dispatch.c checked the
 * CPU (cpu.c) for that variant.
 *
 * With VNNI among the variant's flags (-mavx512vnni with AVX512VL: the
 * EVEX form on 256-bit vectors; -mavxvnni: the VEX form),
 * X86_DPBUSD(acc, u, s) is vpdpbusd on 256-bit vectors: acc + the sums of
 * four products u8 x s8 per 32-bit lane. The sources use it where the AVX2
 * path forms the same exact int32 sums with pmaddubsw and pmaddwd (no step
 * of which saturates in those places), so a VNNI variant's integer sums,
 * and hence every float result, equal the AVX2 path's bit for bit: the
 * tests compare the variants with memcmp.
 *
 * X86_DPWSSD(acc, a, b) is vpdpwssd: acc + a0*b0 + a1*b1 per 32-bit lane,
 * a and b read as int16 pairs (no saturation). The K-quants use it to apply
 * a sub-block scale to an int32 sum that fits in int16 (a vpdpbusd of four
 * products, at most 4 * 63 * 128 = 32256): b holds the scale in the lane's
 * low int16 and zero in its high one, so the sum's sign-extension bits are
 * multiplied by zero and the lane gains exactly sum * scale, what pmaddwd
 * and an add give on the AVX2 path.
 *
 * LM_VARIANT_ON is 1 where a variant build holds kernels: 0 off x86-64, and
 * in the sanitizer builds (LAMINA_X86_BASE_ONLY, kernels/x86.h), whose
 * variant objects hold only lookups that return NULL.
 */
#ifndef LAMINA_VARIANT_H
#define LAMINA_VARIANT_H

#define LM_VNAME_(p, n) p##_##n
#define LM_VNAME(p, n) LM_VNAME_(p, n)

#if defined(LM_VARIANT)
#define LM_VFN(name) LM_VNAME(LM_VARIANT, name)
#endif

#if (defined(__x86_64__) || defined(__i386__)) && !(defined(LM_VARIANT) && defined(LAMINA_X86_BASE_ONLY))
#define LM_VARIANT_ON 1
#else
#define LM_VARIANT_ON 0
#endif

#if defined(LM_VARIANT) && LM_VARIANT_ON
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define X86_DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#define X86_DPWSSD(acc, a, b) _mm256_dpwssd_epi32(acc, a, b)
#elif defined(__AVXVNNI__)
#define X86_DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#define X86_DPWSSD(acc, a, b) _mm256_dpwssd_avx_epi32(acc, a, b)
#endif
#endif

#if defined(LM_VARIANT)
#define avx2_from_float_f16 LM_VFN(from_float_f16)
#define avx2_from_float_q8_0 LM_VFN(from_float_q8_0)
#define avx2_from_float_q8_K LM_VFN(from_float_q8_K)
#define avx2_gemm_bf16 LM_VFN(gemm_bf16)
#define avx2_gemm_f16 LM_VFN(gemm_f16)
#define avx2_gemm_f32 LM_VFN(gemm_f32)
#define avx2_gemm_mxfp4 LM_VFN(gemm_mxfp4)
#define avx2_gemm_q4_0 LM_VFN(gemm_q4_0)
#define avx2_gemm_q4_1 LM_VFN(gemm_q4_1)
#define avx2_gemm_q4_K LM_VFN(gemm_q4_K)
#define avx2_gemm_q5_0 LM_VFN(gemm_q5_0)
#define avx2_gemm_q5_1 LM_VFN(gemm_q5_1)
#define avx2_gemm_q5_K LM_VFN(gemm_q5_K)
#define avx2_gemm_q6_K LM_VFN(gemm_q6_K)
#define avx2_gemm_q8_0 LM_VFN(gemm_q8_0)
#define avx2_kernels LM_VFN(kernels)
#define avx2_packed_act LM_VFN(packed_act)
#define avx2_packed_gemm_f16 LM_VFN(packed_gemm_f16)
#define avx2_packed_gemm_mxfp4 LM_VFN(packed_gemm_mxfp4)
#define avx2_packed_gemm_q4_0 LM_VFN(packed_gemm_q4_0)
#define avx2_packed_gemm_q4_1 LM_VFN(packed_gemm_q4_1)
#define avx2_packed_gemm_q4_K LM_VFN(packed_gemm_q4_K)
#define avx2_packed_gemm_q5_0 LM_VFN(packed_gemm_q5_0)
#define avx2_packed_gemm_q5_1 LM_VFN(packed_gemm_q5_1)
#define avx2_packed_gemm_q8_0 LM_VFN(packed_gemm_q8_0)
#define avx2_to_float_f16 LM_VFN(to_float_f16)
#define avx2_to_float_q8_0 LM_VFN(to_float_q8_0)
#define avx2_vec_dot_bf16 LM_VFN(vec_dot_bf16)
#define avx2_vec_dot_f16 LM_VFN(vec_dot_f16)
#define avx2_vec_dot_f32 LM_VFN(vec_dot_f32)
#define avx2_vec_dot_mxfp4 LM_VFN(vec_dot_mxfp4)
#define avx2_vec_dot_q4_0 LM_VFN(vec_dot_q4_0)
#define avx2_vec_dot_q4_1 LM_VFN(vec_dot_q4_1)
#define avx2_vec_dot_q4_K LM_VFN(vec_dot_q4_K)
#define avx2_vec_dot_q5_0 LM_VFN(vec_dot_q5_0)
#define avx2_vec_dot_q5_1 LM_VFN(vec_dot_q5_1)
#define avx2_vec_dot_q5_K LM_VFN(vec_dot_q5_K)
#define avx2_vec_dot_q6_K LM_VFN(vec_dot_q6_K)
#define avx2_vec_dot_q8_0 LM_VFN(vec_dot_q8_0)
#endif

#endif
