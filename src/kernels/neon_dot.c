/*
 * neon_dot.c - the NEON kernels with the dot-product extension (sdot,
 * Armv8.2-A FEAT_DotProd): kernels/neon_tmpl.h with NT_DOT 1, names
 * neon_dot_*. The only file compiled with -march=armv8.2-a+dotprod; nothing
 * here runs unless cpu_has_neon_dot() said yes (HWCAP_ASIMDDP), so the
 * binary still runs on plain Armv8-A.
 */
#include "kernels/neon.h"

#if defined(__aarch64__)

#if !defined(__ARM_FEATURE_DOTPROD)
#error "neon_dot.c must be compiled with -march=armv8.2-a+dotprod"
#endif

#define NT_DOT 1
#define NT_FN(name) neon_dot_##name
#include "kernels/neon_tmpl.h"

#endif
