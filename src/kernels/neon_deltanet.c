/*
 * neon_deltanet.c - the linear-attention kernels (kernels/deltanet.h) in
 * AArch64 NEON: the body of kernels/simd_deltanet.h over 4-lane vectors,
 * fp32 fused multiply-adds (vfmaq_f32, vfmsq_f32), exp4
 * (kernels/neon_math.h, exp8's reduction and polynomial) for the
 * exponentials, the norms' sums of squares in float64 lanes, and the last
 * partial vector of a row through a zero-padded copy on the stack (NEON has
 * no masked loads and stores; nothing past the row is read or written).
 * Plain Armv8-A, no compiler flags, so both NEON variants (neon, neondot)
 * take the same entries (dispatch.c); `gates` keeps the scalar reference,
 * as on x86. Off AArch64 the file holds only a fill that returns false.
 */
#include "kernels/deltanet.h"

#if defined(__aarch64__)

#include <arm_neon.h>
#include <string.h>

#include "kernels/neon_math.h"

typedef float32x4_t vf;
#define DN_VL 4

static inline vf v_zero(void) { return vdupq_n_f32(0.0f); }
static inline vf v_set1(float a) { return vdupq_n_f32(a); }
static inline vf v_load(const float *p) { return vld1q_f32(p); }
static inline void v_store(float *p, vf x) { vst1q_f32(p, x); }
static inline vf v_loadn(const float *p, int n) {
    float b[DN_VL] = {0};
    memcpy(b, p, sizeof(float) * (size_t)n);
    return vld1q_f32(b);
}
static inline void v_storen(float *p, vf x, int n) {
    float b[DN_VL];
    vst1q_f32(b, x);
    memcpy(p, b, sizeof(float) * (size_t)n);
}
static inline vf v_add(vf a, vf b) { return vaddq_f32(a, b); }
static inline vf v_sub(vf a, vf b) { return vsubq_f32(a, b); }
static inline vf v_mul(vf a, vf b) { return vmulq_f32(a, b); }
static inline vf v_div(vf a, vf b) { return vdivq_f32(a, b); }
static inline vf v_fmadd(vf a, vf b, vf c) { return vfmaq_f32(c, a, b); }
static inline vf v_fnmadd(vf a, vf b, vf c) { return vfmsq_f32(c, a, b); }
static inline vf v_exp(vf x) { return exp4(x); }
static inline float v_hsum(vf x) { return vaddvq_f32(x); }
static inline double dsumsq(const float *x, int n) { return sumsq_f64(x, n); }

#include "kernels/simd_deltanet.h"

bool neon_dn_fill(lm_dn_kernels *k) {
    k->conv = dn_conv;
    k->l2norm = dn_l2norm;
    k->norm_gated = dn_norm_gated;
    k->recur = dn_recur;
    k->chunk = dn_chunk;
    return true;
}

#else

bool neon_dn_fill(lm_dn_kernels *k) { return false; }

#endif
