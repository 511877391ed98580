/*
 * avxvnni_quant.c - the avxvnni variant's dot products, gemm tiles,
 * activation quantizers and conversions (kernels/avx2_quant.c). AVX2 with
 * AVX-VNNI: the AVX2 kernels with the VEX vpdpbusd for the int8 sums; see
 * kernels/x86_variant.h. Compiled with the variant's flags (Makefile);
 * nothing here runs unless dispatch.c found the variant on this CPU.
 */
#define X86_PREFIX avxvnni_
#define X86_VNNI 2
#include "kernels/x86_variant.h"
#include "kernels/x86.h"

#if X86_VARIANTS
#include "kernels/avx2_quant.c"
#else
/* sanitizer builds leave the variant out (kernels/x86.h): no kernels */
const lm_avx2_kernels *avxvnni_kernels(uint32_t type) {
    (void)type;
    return NULL;
}
#endif
