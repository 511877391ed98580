/*
 * neon_quant.c - the activation quantizers and KV conversions both NEON
 * variants share (Armv8-A Advanced SIMD, which every AArch64 CPU has), and
 * neon_kernels(), the per-type list the kernel table takes them and the
 * variants' dot products and tiles (kernels/neon_tiles.c) from (contracts
 * in kernels/neon.h).
 *
 * Conversions give the scalar reference's bits (format/quant.c):
 *  - F16 -> float: FCVTL, exact for every half; infinities and NaNs are
 *    rebuilt from their bits as lm_f16_to_f32 does (FCVTL would quieten a
 *    signalling NaN).
 *  - float -> F16: FCVTN (round to nearest even, like lm_f32_to_f16, with
 *    subnormal halves); a NaN becomes sign | 0x7e00 as in lm_f32_to_f16.
 *  - Q8_0: d = max|x| / 127, id = 1 / d (0 for an all-zero block), q =
 *    round(x * id) with ties away from zero (FCVTAS, as roundf) clamped to
 *    [-127, 127]; NaN products give -127 like round_clamp.
 *  - Q8_K: the value of largest magnitude (the first on a tie) maps to -128:
 *    iscale = -128 / max, q = round(iscale * x) in [-128, 127], bsums, d =
 *    1 / iscale.
 * Compiled without extra flags: NEON is part of the AArch64 base.
 */
#include "kernels/neon.h"

#if defined(__aarch64__)

#include <arm_neon.h>
#include <math.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

/* The f16 at p as a float (FCVT: exact). */
INLINE float h2f(const void *p) {
    __fp16 h;
    memcpy(&h, p, 2);
    return (float)h;
}

/* ---- F16 ---------------------------------------------------------------------- */

/* Four halves to floats with lm_f16_to_f32's bits. */
INLINE float32x4_t f16x4_to_f32(uint16x4_t h) {
    float32x4_t f = vcvt_f32_f16(vreinterpret_f16_u16(h));
    uint32x4_t w = vmovl_u16(h);
    uint32x4_t special = vceqq_u32(vandq_u32(w, vdupq_n_u32(0x7c00)), vdupq_n_u32(0x7c00));
    uint32x4_t bits = vorrq_u32(vorrq_u32(vshlq_n_u32(vandq_u32(w, vdupq_n_u32(0x8000)), 16), vdupq_n_u32(0x7f800000)),
                                vshlq_n_u32(vandq_u32(w, vdupq_n_u32(0x3ff)), 13));
    return vbslq_f32(special, vreinterpretq_f32_u32(bits), f);
}

/* Four floats to halves with lm_f32_to_f16's bits. */
INLINE uint16x4_t f32x4_to_f16(float32x4_t f) {
    uint16x4_t h = vreinterpret_u16_f16(vcvt_f16_f32(f));
    uint32x4_t u = vreinterpretq_u32_f32(f);
    uint16x4_t nan = vmovn_u32(vorrq_u32(vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(0x8000)), vdupq_n_u32(0x7e00)));
    uint16x4_t ok = vmovn_u32(vceqq_f32(f, f));
    return vbsl_u16(ok, h, nan);
}

void neon_to_float_f16(const void *src, float *dst, int64_t n) {
    const uint16_t *h = src;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, f16x4_to_f32(vld1_u16(h + i)));
    if (i < n) {
        uint16_t t[4] = {0};
        float o[4];
        memcpy(t, h + i, (size_t)(n - i) * 2);
        vst1q_f32(o, f16x4_to_f32(vld1_u16(t)));
        memcpy(dst + i, o, (size_t)(n - i) * sizeof(float));
    }
}

void neon_from_float_f16(const float *src, void *dst, int64_t n) {
    uint16_t *h = dst;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(h + i, f32x4_to_f16(vld1q_f32(src + i)));
    if (i < n) {
        float t[4] = {0};
        uint16_t o[4];
        memcpy(t, src + i, (size_t)(n - i) * sizeof(float));
        vst1_u16(o, f32x4_to_f16(vld1q_f32(t)));
        memcpy(h + i, o, (size_t)(n - i) * 2);
    }
}

/* ---- Q8_0 and Q8_K ------------------------------------------------------------- */

void neon_to_float_q8_0(const void *src, float *dst, int64_t n) {
    const block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        float32x4_t d = vdupq_n_f32(h2f(&b[i].d));
        for (int k = 0; k < 2; k++) {
            int8x16_t q = vld1q_s8(b[i].qs + 16 * k);
            int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
            float *o = dst + i * QK8_0 + 16 * k;
            vst1q_f32(o, vmulq_f32(d, vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)))));
            vst1q_f32(o + 4, vmulq_f32(d, vcvtq_f32_s32(vmovl_high_s16(lo))));
            vst1q_f32(o + 8, vmulq_f32(d, vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)))));
            vst1q_f32(o + 12, vmulq_f32(d, vcvtq_f32_s32(vmovl_high_s16(hi))));
        }
    }
}

/* round(v) with ties away from zero, clamped to [lo, hi]; NaN gives lo. */
INLINE int32x4_t round_clamp4(float32x4_t v, float lo, float hi) {
    v = vbslq_f32(vceqq_f32(v, v), v, vdupq_n_f32(lo));
    v = vminq_f32(vmaxq_f32(v, vdupq_n_f32(lo)), vdupq_n_f32(hi));
    return vcvtaq_s32_f32(v);
}

/* 16 int32 lanes (values in int8 range) to int8s at q. */
INLINE void store_q16(int8_t *q, int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d) {
    int16x8_t ab = vcombine_s16(vmovn_s32(a), vmovn_s32(b)), cd = vcombine_s16(vmovn_s32(c), vmovn_s32(d));
    vst1q_s8(q, vcombine_s8(vmovn_s16(ab), vmovn_s16(cd)));
}

void neon_from_float_q8_0(const float *src, void *dst, int64_t n) {
    block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const float *x = src + i * QK8_0;
        float32x4_t v[8];
        float32x4_t m = vdupq_n_f32(0.0f);
        for (int k = 0; k < 8; k++) {
            v[k] = vld1q_f32(x + 4 * k);
            m = vmaxnmq_f32(m, vabsq_f32(v[k]));
        }
        float amax = vmaxnmvq_f32(m);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        __fp16 dh = (__fp16)d;
        memcpy(&b[i].d, &dh, 2);
        int32x4_t q[8];
        for (int k = 0; k < 8; k++) q[k] = round_clamp4(vmulq_n_f32(v[k], id), -127.0f, 127.0f);
        store_q16(b[i].qs, q[0], q[1], q[2], q[3]);
        store_q16(b[i].qs + 16, q[4], q[5], q[6], q[7]);
    }
}

void neon_from_float_q8_K(const float *src, void *dst, int64_t n) {
    block_q8_K *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, b++) {
        const float *x = src + i * QK_K;
        float32x4_t m = vdupq_n_f32(0.0f);
        for (int e = 0; e < QK_K; e += 4) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + e)));
        float amax = vmaxnmvq_f32(m), max = 0.0f;
        for (int e = 0; e < QK_K; e++)
            if (fabsf(x[e]) == amax) {
                max = x[e];
                break;
            }
        if (max == 0.0f) {
            memset(b, 0, sizeof *b);
            continue;
        }
        float iscale = -128.0f / max;
        for (int e = 0; e < QK_K; e += 16) {
            int32x4_t q[4];
            for (int k = 0; k < 4; k++)
                q[k] = round_clamp4(vmulq_n_f32(vld1q_f32(x + e + 4 * k), iscale), -128.0f, 127.0f);
            store_q16(b->qs + e, q[0], q[1], q[2], q[3]);
            b->bsums[e / 16] = (int16_t)vaddlvq_s8(vld1q_s8(b->qs + e));
        }
        b->d = 1.0f / iscale;
    }
}

/* block_q8_0s rows for the packed tiles: this file's Q8_0 quantizer (the
 * reference's bytes), the scale widened (exact) and 8 * the sum of the
 * quants, as quant_packed_act_ref. */
void neon_packed_act(const float *src, void *dst, int64_t n) {
    block_q8_0s *o = dst;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        block_q8_0 b;
        neon_from_float_q8_0(src + i * QK8_0, &b, QK8_0);
        o[i].d = h2f(&b.d);
        o[i].s8 = 8 * (vaddlvq_s8(vld1q_s8(b.qs)) + vaddlvq_s8(vld1q_s8(b.qs + 16)));
        memcpy(o[i].qs, b.qs, QK8_0);
    }
}

/* ---- the list the kernel table reads ------------------------------------------ */

#define NK(P, T)                                                                                                       \
    { .vec_dot = P##vec_dot_##T, .gemm = P##gemm_##T }
#define NEON_TABLE(P)                                                                                                  \
    {                                                                                                                  \
        [LM_TYPE_F32] = NK(P, f32),                                                                                    \
        [LM_TYPE_F16] = {.to_float = neon_to_float_f16,                                                                \
                         .from_float = neon_from_float_f16,                                                            \
                         .vec_dot = P##vec_dot_f16,                                                                    \
                         .gemm = P##gemm_f16},                                                                         \
        [LM_TYPE_BF16] = NK(P, bf16),                                                                                  \
        [LM_TYPE_Q8_0] = {.to_float = neon_to_float_q8_0,                                                              \
                          .from_float = neon_from_float_q8_0,                                                          \
                          .vec_dot = P##vec_dot_q8_0,                                                                  \
                          .gemm = P##gemm_q8_0,                                                                        \
                          .packed_gemm = P##packed_gemm_q8_0,                                                          \
                          .packed_act = neon_packed_act,                                                               \
                          .pack_tile = NEON_PACK_TILE},                                                                \
        [LM_TYPE_Q4_0] = {.vec_dot = P##vec_dot_q4_0,                                                                  \
                          .gemm = P##gemm_q4_0,                                                                        \
                          .packed_gemm = P##packed_gemm_q4_0,                                                          \
                          .packed_act = neon_packed_act,                                                               \
                          .pack_tile = NEON_PACK_TILE},                                                                \
        [LM_TYPE_Q5_0] = NK(P, q5_0), [LM_TYPE_Q4_1] = NK(P, q4_1), [LM_TYPE_Q5_1] = NK(P, q5_1),                      \
        [LM_TYPE_MXFP4] = {.vec_dot = P##vec_dot_mxfp4,                                                                \
                           .gemm = P##gemm_mxfp4,                                                                      \
                           .packed_gemm = P##packed_gemm_mxfp4,                                                        \
                           .packed_act = neon_packed_act,                                                              \
                           .pack_tile = NEON_PACK_TILE},                                                               \
        [LM_TYPE_Q4_K] = NK(P, q4_K), [LM_TYPE_Q5_K] = NK(P, q5_K), [LM_TYPE_Q6_K] = NK(P, q6_K),                      \
        [LM_TYPE_Q8_K] = {.from_float = neon_from_float_q8_K},                                                         \
    }

static const lm_neon_kernels plain[LM_TYPE_COUNT] = NEON_TABLE(neon_);
static const lm_neon_kernels dotp[LM_TYPE_COUNT] = NEON_TABLE(neon_dot_);

const lm_neon_kernels *neon_kernels(uint32_t type, bool dot) {
    if (type >= LM_TYPE_COUNT) return NULL;
    const lm_neon_kernels *k = dot ? &dotp[type] : &plain[type];
    return k->to_float || k->from_float || k->vec_dot ? k : NULL;
}

#else

const lm_neon_kernels *neon_kernels(uint32_t type, bool dot) {
    (void)type;
    (void)dot;
    return NULL;
}

#endif
