/*
 * avxvnni_panel.c - the avxvnni variant's F16 panel tiles
 * (kernels/avx2_panel.c). AVX2 with AVX-VNNI: the AVX2 kernels with the VEX
 * vpdpbusd for the int8 sums; see kernels/x86_variant.h. Compiled with the
 * variant's flags (Makefile); nothing here runs unless dispatch.c found the
 * variant on this CPU.
 */
#define X86_PREFIX avxvnni_
#define X86_VNNI 2
#include "kernels/x86_variant.h"
#include "kernels/x86.h"

#if X86_VARIANTS
#include "kernels/avx2_panel.c"
#else
typedef int lm_avxvnni_unused; /* sanitizer builds leave the variant out (kernels/x86.h) */
#endif
