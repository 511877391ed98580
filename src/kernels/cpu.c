/*
 * cpu.c - which SIMD kernels this CPU can run.
 *
 * x86 variants (kernels/x86.h): AVX2 (below); AVX-512 needs CPUID leaf 7
 * AVX512F, AVX512BW and AVX512VL on top of AVX2, and XCR0 bits 5..7 (opmask,
 * upper ZMM halves, ZMM16..31) besides bits 1 and 2: an OS may enable AVX
 * but not AVX-512 state. AVX512-VNNI is leaf 7 ECX bit 11 on top of that;
 * AVX-VNNI (the VEX form) is leaf 7 subleaf 1 EAX bit 4, on top of AVX2.
 * AVX512_BF16 is leaf 7 subleaf 1 EAX bit 5, taken on top of AVX512-VNNI
 * (the avx512bf16 variant is avx512vnni plus vdpbf16ps).
 * AMX is never used (some hosts list it in CPUID and trap it).
 *
 * AVX2 kernels need three CPUID features (AVX2, FMA, F16C) and, separately,
 * an operating system that saves the YMM registers on context switches:
 * CPUID.1:ECX.OSXSAVE says XGETBV is usable, and XCR0 bits 1 and 2 (SSE and
 * AVX state) must both be set. A CPU can report AVX2 while the OS (or a
 * hypervisor) has not enabled that state, and then the instructions fault,
 * so both are checked here rather than trusting a compiler builtin whose
 * list of feature names differs between GCC and Clang versions.
 *
 * On AArch64 the kernel reports the CPU's features in the auxiliary vector:
 * getauxval(AT_HWCAP) has HWCAP_FP and HWCAP_ASIMD (Advanced SIMD, NEON:
 * part of every Linux AArch64 system, checked anyway) and HWCAP_ASIMDDP (the
 * dot-product instructions SDOT/UDOT, FEAT_DotProd). Those bits are what
 * the kernel lets user space execute, so no further OS check is needed.
 *
 * Plain C, compiled without SIMD flags; the answer does not change while the
 * process runs, and computing it is cheap, so nothing is cached.
 */
#include "kernels/avx2.h"
#include "kernels/x86.h"
#include "kernels/neon.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* XCR0 through XGETBV; only valid when CPUID reports OSXSAVE. The
 * instruction is written out so no -mxsave flag is needed. */
static uint64_t read_xcr0(void) {
    uint32_t lo, hi;
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

bool cpu_has_avx2(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    const unsigned fma = 1u << 12, osxsave = 1u << 27, avx = 1u << 28, f16c = 1u << 29;
    if ((c & (fma | osxsave | avx | f16c)) != (fma | osxsave | avx | f16c)) return false;
    if ((read_xcr0() & 6) != 6) return false; /* XMM and YMM state enabled */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return (b & (1u << 5)) != 0; /* leaf 7 EBX bit 5: AVX2 */
}

bool cpu_has_avx512(void) {
    if (!X86_VARIANTS || !cpu_has_avx2()) return false;
    if ((read_xcr0() & 0xE6) != 0xE6) return false; /* + opmask, ZMM_Hi256, Hi16_ZMM state */
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const unsigned f = 1u << 16, bw = 1u << 30, vl = 1u << 31;
    return (b & (f | bw | vl)) == (f | bw | vl);
}

bool cpu_has_avx512vnni(void) {
    unsigned a, b, c, d;
    if (!cpu_has_avx512() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return (c & (1u << 11)) != 0; /* leaf 7 ECX bit 11: AVX512_VNNI */
}

bool cpu_has_avxvnni(void) {
    unsigned a, b, c, d;
    if (!X86_VARIANTS || !cpu_has_avx2() || !__get_cpuid_count(7, 0, &a, &b, &c, &d) || a < 1) return false;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
    return (a & (1u << 4)) != 0; /* leaf 7 subleaf 1 EAX bit 4: AVX-VNNI */
}

bool cpu_has_avx512bf16(void) {
    unsigned a, b, c, d;
    if (!cpu_has_avx512vnni() || !__get_cpuid_count(7, 0, &a, &b, &c, &d) || a < 1) return false;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
    return (a & (1u << 5)) != 0; /* leaf 7 subleaf 1 EAX bit 5: AVX512_BF16 */
}

#else

bool cpu_has_avx2(void) { return false; }
bool cpu_has_avx512(void) { return false; }
bool cpu_has_avx512vnni(void) { return false; }
bool cpu_has_avxvnni(void) { return false; }
bool cpu_has_avx512bf16(void) { return false; }

#endif

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>

/* The bits of <asm/hwcap.h>, spelled out for C libraries that lack them. */
#define LM_HWCAP_FP (1ul << 0)
#define LM_HWCAP_ASIMD (1ul << 1)
#define LM_HWCAP_ASIMDDP (1ul << 20)

bool cpu_has_neon(void) {
    unsigned long h = getauxval(AT_HWCAP);
    return (h & (LM_HWCAP_FP | LM_HWCAP_ASIMD)) == (LM_HWCAP_FP | LM_HWCAP_ASIMD);
}

bool cpu_has_neon_dot(void) { return cpu_has_neon() && (getauxval(AT_HWCAP) & LM_HWCAP_ASIMDDP) != 0; }

#else

bool cpu_has_neon(void) { return false; }
bool cpu_has_neon_dot(void) { return false; }

#endif
