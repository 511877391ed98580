/*
 * avx512vnni_panel.c - the avx512vnni variant's F16 panel tiles
 * (kernels/avx2_panel.c). AVX-512 F/BW/VL with AVX512-VNNI: the AVX2 kernels
 * with vpdpbusd (EVEX, 256-bit) for the int8 sums; see
 * kernels/x86_variant.h. Compiled with the variant's flags (Makefile);
 * nothing here runs unless dispatch.c found the variant on this CPU.
 */
#define X86_PREFIX avx512vnni_
#define X86_VNNI 1
#include "kernels/x86_variant.h"
#include "kernels/x86.h"

#if X86_VARIANTS
#include "kernels/avx2_panel.c"
#else
typedef int lm_avx512vnni_unused; /* sanitizer builds leave the variant out (kernels/x86.h) */
#endif
