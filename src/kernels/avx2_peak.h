/*
 * avx2_peak.h - the FMA-rate probe in AVX2 + FMA (avx2_peak.c), reached
 * through the kernel table's `peak` entry (kernels.h) after a CPUID check.
 */
#ifndef LAMINA_AVX2_PEAK_H
#define LAMINA_AVX2_PEAK_H

/* rounds x AVX2_PEAK_FLOPS flops of independent fused multiply-adds held in
 * registers; returns a value derived from them (so they are not removed). */
#define AVX2_PEAK_FLOPS 192
float avx2_fma_probe(long rounds);

#endif
