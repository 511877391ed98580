/*
 * avx512vnni_pair.c - the avx512vnni variant's 512-bit pair tiles
 * (kernels/x86_pair.h): kernels/avx512_pair.c built again with vpdpbusd and
 * vpdpwssd for the exact integer sums. Compiled with the variant's flags
 * (Makefile); nothing here runs unless dispatch.c found the variant on this
 * CPU.
 */
#define PAIR_PREFIX avx512vnni_
#define PAIR_VNNI 1
#include "kernels/avx512_pair.c"
