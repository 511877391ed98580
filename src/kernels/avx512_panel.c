/*
 * avx512_panel.c - the avx512 variant's F16 panel tiles
 * (kernels/avx2_panel.c). AVX-512 F/BW/VL: the AVX2 kernels encoded with
 * EVEX and 32 vector registers; see kernels/x86_variant.h. Compiled with the
 * variant's flags (Makefile); nothing here runs unless dispatch.c found the
 * variant on this CPU.
 */
#define X86_PREFIX avx512_
#include "kernels/x86_variant.h"
#include "kernels/x86.h"

#if X86_VARIANTS
#include "kernels/avx2_panel.c"
#else
typedef int lm_avx512_unused; /* sanitizer builds leave the variant out (kernels/x86.h) */
#endif
