/*
 * x86.h - the x86 kernel variants beyond AVX2: their CPU checks (cpu.c) and
 * their kernel lookups (the AVX2 sources built again per variant, see
 * kernels/variant.h).
 *
 *   variant      CPU check             built with
 *   avxvnni      cpu_has_avxvnni()     AVX2 flags + -mavxvnni
 *   avx512       cpu_has_avx512()      AVX2 flags + -mavx512f -mavx512bw -mavx512vl
 *   avx512vnni   cpu_has_avx512vnni()  the avx512 flags + -mavx512vnni
 *   avx512bf16   cpu_has_avx512bf16()  the avx512vnni flags + -mavx512bf16
 *
 * Each lookup has avx2_kernels()'s contract (kernels/avx2.h) and returns
 * entries for the same types; their results equal the AVX2 entries' bit for
 * bit (the integer sums are exact either way). avx512bf16 is the exception
 * for BF16 weights only (vdpbf16ps, kernels/avx512bf16_dot.c: activations
 * rounded to BF16, a stated bound instead of equal bits); its other types
 * are avx512vnni's. Call a variant's kernels only
 * when its check said yes. Off x86 every check is false and every lookup
 * returns NULL.
 */
#ifndef LAMINA_X86_H
#define LAMINA_X86_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/avx2.h"

/* LAMINA_X86_BASE_ONLY (the sanitizer builds, make asan and make fuzz, set
 * it): the variants below are left out, their objects holding only lookups
 * that return NULL (kernels/variant.h) and the CPU reported without them,
 * so those builds compile the large AVX2 kernels once rather than four
 * times. The variants equal avx2 bit for bit,
 * and the plain build tests them. */
#if defined(LAMINA_X86_BASE_ONLY)
#define X86_VARIANTS 0
#else
#define X86_VARIANTS 1
#endif

/* AVX2 (cpu_has_avx2) plus AVX512F/BW/VL and the OS's AVX-512 state. */
bool cpu_has_avx512(void);
/* cpu_has_avx512() plus AVX512-VNNI. */
bool cpu_has_avx512vnni(void);
/* AVX2 (cpu_has_avx2) plus AVX-VNNI (the VEX encoding). */
bool cpu_has_avxvnni(void);
/* cpu_has_avx512vnni() plus AVX512_BF16. */
bool cpu_has_avx512bf16(void);

const lm_avx2_kernels *avx512_kernels(uint32_t type);
const lm_avx2_kernels *avx512vnni_kernels(uint32_t type);
const lm_avx2_kernels *avxvnni_kernels(uint32_t type);
const lm_avx2_kernels *avx512bf16_kernels(uint32_t type);

#endif
