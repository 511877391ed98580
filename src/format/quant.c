/*
 * quant.c - the table of ggml tensor types and the scalar reference kernels.
 *
 * Block sizes and byte sizes follow GGUF (see quant.h). Types lamina does not
 * compute with still have a row here so files carrying them can be sized,
 * listed and refused by name.
 *
 * The reference kernels are plain scalar C written to be read; they define
 * what every faster variant must compute (the variants, and the choice
 * between them, belong to the kernels layer: kernels/kernels.h):
 *  - to_float gives the same bits as GGUF tools, and so must any faster
 *    variant: every product in it is exact in float (an f16 scale has 11
 *    significant bits, a 6-bit or int8 sub-block scale at most 7 more, a
 *    quant at most 6 more: <= 24), so each value is rounded once, by the
 *    final subtraction of the min, whatever the evaluation order and with or
 *    without fused multiply-adds. Q8_K's f32 d times q is one rounding too;
 *    MXFP4's power-of-two scale times a table value is none.
 *  - from_float for Q8_0, Q4_0, Q5_0, Q4_1, Q5_1 and MXFP4 is the GGUF
 *    round-to-nearest bit for bit;
 *    for the K-quants a small least-squares search per sub-block (see
 *    fit_affine / fit_symmetric), then 6- or 8-bit sub-block scales against
 *    an f16 super-block scale, then every element rounded against the scale
 *    the decoder will really use.
 *  - vec_dot takes the activation row already converted to vec_dot_type.
 *
 * All kernels take n as a multiple of the type's block size; inputs to the
 * quantizers are finite (a NaN cannot cause undefined behaviour, but its
 * block decodes to garbage).
 */
#include "format/quant.h"

#include <assert.h>
#include <math.h>
#include <string.h>
#include <strings.h>

#include "base/util.h"

/* ---- helpers ------------------------------------------------------------ */

_Static_assert(sizeof(block_q8_0) == 34, "Q8_0 block is 34 bytes");
_Static_assert(sizeof(block_q4_0) == 18, "Q4_0 block is 18 bytes");
_Static_assert(sizeof(block_q5_0) == 22, "Q5_0 block is 22 bytes");
_Static_assert(sizeof(block_q4_1) == 20, "Q4_1 block is 20 bytes");
_Static_assert(sizeof(block_q5_1) == 24, "Q5_1 block is 24 bytes");
_Static_assert(sizeof(block_q4_K) == 144, "Q4_K block is 144 bytes");
_Static_assert(sizeof(block_q5_K) == 176, "Q5_K block is 176 bytes");
_Static_assert(sizeof(block_q6_K) == 210, "Q6_K block is 210 bytes");
_Static_assert(sizeof(block_q8_K) == 292, "Q8_K block is 292 bytes");
_Static_assert(sizeof(block_mxfp4) == 17, "MXFP4 block is 17 bytes");

static inline float f16(uint16_t h) { return lm_f16_to_f32(h); }

/* Round to nearest with ties away from zero (roundf, as GGUF tools round),
 * then clamp to [lo, hi]; NaN gives lo, so a cast never sees it. */
static inline int round_clamp(float v, int lo, int hi) {
    float r = roundf(v);
    if (!(r >= (float)lo)) return lo;
    if (r > (float)hi) return hi;
    return (int)r;
}

/* Nearest integer to v clamped to [lo, hi], ties to even, without a libm
 * call: adding 1.5 * 2^23 leaves no fraction bits, so the sum is rounded in
 * the default round-to-nearest-even mode (|v| <= hi < 2^22 here). For the
 * K-quant searches, where the tie rule is immaterial and roundf's library
 * call dominated the time. NaN gives lo. */
static inline int round_fast(float v, int lo, int hi) {
    if (!(v > (float)lo)) return lo;
    if (v > (float)hi) v = (float)hi;
    return (int)((v + 12582912.0f) - 12582912.0f);
}

/* The value of largest magnitude in x[0..n), sign kept; the first one on a
 * tie, as GGUF tools pick it. */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    }
    return max;
}

/* ---- F32, F16, BF16 ------------------------------------------------------ */

static void f32_to_float(const void *src, float *dst, int64_t n) { memmove(dst, src, (size_t)n * sizeof(float)); }

static void f32_from_float(const float *src, void *dst, int64_t n) { memmove(dst, src, (size_t)n * sizeof(float)); }

static void f16_to_float(const void *src, float *dst, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = lm_f16_to_f32(h[i]);
}

static void f16_from_float(const float *src, void *dst, int64_t n) {
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = lm_f32_to_f16(src[i]);
}

static void bf16_to_float(const void *src, float *dst, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = lm_bf16_to_f32(h[i]);
}

static void bf16_from_float(const float *src, void *dst, int64_t n) {
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = lm_f32_to_bf16(src[i]);
}

/* ---- Q8_0 and Q4_0 -------------------------------------------------------- */

static void q8_0_to_float(const void *src, float *dst, int64_t n) {
    const block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        float d = f16(b[i].d);
        for (int j = 0; j < QK8_0; j++) dst[i * QK8_0 + j] = d * (float)b[i].qs[j];
    }
}

/* d = max|x| / 127 and q = round(x / d) computed with the unrounded d (the
 * f16 rounding happens only on store), exactly as GGUF tools do. */
static void q8_0_from_float(const float *src, void *dst, int64_t n) {
    block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const float *x = src + i * QK8_0;
        float amax = fabsf(signed_absmax(x, QK8_0));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = lm_f32_to_f16(d);
        for (int j = 0; j < QK8_0; j++) b[i].qs[j] = (int8_t)round_clamp(x[j] * id, -127, 127);
    }
}

static void q4_0_to_float(const void *src, float *dst, int64_t n) {
    const block_q4_0 *b = src;
    for (int64_t i = 0; i < n / QK4_0; i++) {
        float d = f16(b[i].d);
        float *y = dst + i * QK4_0;
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[j] = d * (float)((b[i].qs[j] & 0x0F) - 8);
            y[j + QK4_0 / 2] = d * (float)((b[i].qs[j] >> 4) - 8);
        }
    }
}

/* The value of largest magnitude maps to q = 0 (x = -8d), so the sign of d
 * follows it and the 16 levels cover [-8d, 7d]; q = trunc(x/d + 8.5) capped
 * at 15, as GGUF tools do. */
static void q4_0_from_float(const float *src, void *dst, int64_t n) {
    block_q4_0 *b = dst;
    for (int64_t i = 0; i < n / QK4_0; i++) {
        const float *x = src + i * QK4_0;
        float d = signed_absmax(x, QK4_0) / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = lm_f32_to_f16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            uint8_t q[2];
            for (int h = 0; h < 2; h++) {
                float t = x[j + h * QK4_0 / 2] * id + 8.5f; /* in [0.5, 16.5] */
                q[h] = t >= 15.0f ? 15 : t > 0.0f ? (uint8_t)t : 0;
            }
            b[i].qs[j] = (uint8_t)(q[0] | (q[1] << 4));
        }
    }
}

/* ---- Q5_0 ------------------------------------------------------------------ */
/* 32 values: f16 d, 4 bytes qh holding bit 4 of every value (bit j of the
 * little-endian u32 for value j), 16 bytes qs of low nibbles laid out as in
 * Q4_0 (value j < 16 low nibble of qs[j], value j+16 high nibble);
 * x = d * (q - 16). */

static inline int q5_0_q(const block_q5_0 *b, int j) {
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    int lo = j < 16 ? (b->qs[j] & 0x0F) : (b->qs[j - 16] >> 4);
    return lo | (int)(((qh >> j) & 1u) << 4);
}

static void q5_0_to_float(const void *src, float *dst, int64_t n) {
    const block_q5_0 *b = src;
    for (int64_t i = 0; i < n / QK5_0; i++) {
        float d = f16(b[i].d);
        for (int j = 0; j < QK5_0; j++) dst[i * QK5_0 + j] = d * (float)(q5_0_q(&b[i], j) - 16);
    }
}

/* As Q4_0: the value of largest magnitude maps to q = 0 (x = -16d);
 * q = trunc(x/d + 16.5) capped at 31. */
static void q5_0_from_float(const float *src, void *dst, int64_t n) {
    block_q5_0 *b = dst;
    for (int64_t i = 0; i < n / QK5_0; i++) {
        const float *x = src + i * QK5_0;
        float d = signed_absmax(x, QK5_0) / -16.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = lm_f32_to_f16(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            uint8_t q[2];
            for (int h = 0; h < 2; h++) {
                float t = x[j + h * QK5_0 / 2] * id + 16.5f;
                q[h] = t >= 31.0f ? 31 : t > 0.0f ? (uint8_t)t : 0;
                qh |= (uint32_t)(q[h] >> 4) << (j + h * QK5_0 / 2);
            }
            b[i].qs[j] = (uint8_t)((q[0] & 0x0F) | ((q[1] & 0x0F) << 4));
        }
        memcpy(b[i].qh, &qh, 4);
    }
}

static float vec_dot_q5_0(int64_t n, const void *w, const void *x) {
    const block_q5_0 *a = w;
    const block_q8_0 *b = x;
    double acc = 0;
    for (int64_t i = 0; i < n / QK5_0; i++) {
        int sumi = 0;
        for (int j = 0; j < QK5_0; j++) sumi += (q5_0_q(&a[i], j) - 16) * b[i].qs[j];
        acc += (double)f16(a[i].d) * f16(b[i].d) * sumi;
    }
    return (float)acc;
}

/* ---- Q4_1 and Q5_1 ---------------------------------------------------------- */
/* 32 values each: f16 d, f16 m, then as Q4_0 (Q4_1) or Q5_0 (Q5_1) but
 * unsigned: x = d * q + m with q in 0..15 (0..31). The product d * q is
 * exact in float, so the one rounding is the addition of m. */

static inline int q4_1_q(const block_q4_1 *b, int j) { return j < 16 ? (b->qs[j] & 0x0F) : (b->qs[j - 16] >> 4); }

static inline int q5_1_q(const block_q5_1 *b, int j) {
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    int lo = j < 16 ? (b->qs[j] & 0x0F) : (b->qs[j - 16] >> 4);
    return lo | (int)(((qh >> j) & 1u) << 4);
}

static void q4_1_to_float(const void *src, float *dst, int64_t n) {
    const block_q4_1 *b = src;
    for (int64_t i = 0; i < n / QK4_1; i++) {
        float d = f16(b[i].d), m = f16(b[i].m);
        for (int j = 0; j < QK4_1; j++) dst[i * QK4_1 + j] = d * (float)q4_1_q(&b[i], j) + m;
    }
}

static void q5_1_to_float(const void *src, float *dst, int64_t n) {
    const block_q5_1 *b = src;
    for (int64_t i = 0; i < n / QK5_1; i++) {
        float d = f16(b[i].d), m = f16(b[i].m);
        for (int j = 0; j < QK5_1; j++) dst[i * QK5_1 + j] = d * (float)q5_1_q(&b[i], j) + m;
    }
}

/* The block's range [min, max] on 2^bits levels: d = (max - min) / nmax,
 * m = min (each rounded to f16 only on store), q = trunc((x - min) / d +
 * 0.5) capped at nmax, computed with the unrounded d and min and 1/d, as
 * GGUF tools do. */
static void affine_round(const float *x, int nmax, uint16_t *d16, uint16_t *m16, uint8_t q[32]) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    float d = (hi - lo) / (float)nmax;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    *d16 = lm_f32_to_f16(d);
    *m16 = lm_f32_to_f16(lo);
    for (int j = 0; j < 32; j++) {
        float t = (x[j] - lo) * id + 0.5f; /* >= 0.5 for finite x */
        q[j] = t >= (float)nmax ? (uint8_t)nmax : t > 0.0f ? (uint8_t)t : 0;
    }
}

static void q4_1_from_float(const float *src, void *dst, int64_t n) {
    block_q4_1 *b = dst;
    for (int64_t i = 0; i < n / QK4_1; i++) {
        uint8_t q[32];
        affine_round(src + i * QK4_1, 15, &b[i].d, &b[i].m, q);
        for (int j = 0; j < 16; j++) b[i].qs[j] = (uint8_t)(q[j] | (q[j + 16] << 4));
    }
}

static void q5_1_from_float(const float *src, void *dst, int64_t n) {
    block_q5_1 *b = dst;
    for (int64_t i = 0; i < n / QK5_1; i++) {
        uint8_t q[32];
        affine_round(src + i * QK5_1, 31, &b[i].d, &b[i].m, q);
        uint32_t qh = 0;
        for (int j = 0; j < 32; j++) qh |= (uint32_t)(q[j] >> 4) << j;
        for (int j = 0; j < 16; j++) b[i].qs[j] = (uint8_t)((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
        memcpy(b[i].qh, &qh, 4);
    }
}

/* Against Q8_0 activations (dx, qx): per block dw*dx*sum(q*qx) + m*dx*sum(qx). */
static float vec_dot_q4_1(int64_t n, const void *w, const void *x) {
    const block_q4_1 *a = w;
    const block_q8_0 *b = x;
    double acc = 0;
    for (int64_t i = 0; i < n / QK4_1; i++) {
        int sumi = 0, sumx = 0;
        for (int j = 0; j < QK4_1; j++) {
            sumi += q4_1_q(&a[i], j) * b[i].qs[j];
            sumx += b[i].qs[j];
        }
        double dx = f16(b[i].d);
        acc += (double)f16(a[i].d) * dx * sumi + (double)f16(a[i].m) * dx * sumx;
    }
    return (float)acc;
}

static float vec_dot_q5_1(int64_t n, const void *w, const void *x) {
    const block_q5_1 *a = w;
    const block_q8_0 *b = x;
    double acc = 0;
    for (int64_t i = 0; i < n / QK5_1; i++) {
        int sumi = 0, sumx = 0;
        for (int j = 0; j < QK5_1; j++) {
            sumi += q5_1_q(&a[i], j) * b[i].qs[j];
            sumx += b[i].qs[j];
        }
        double dx = f16(b[i].d);
        acc += (double)f16(a[i].d) * dx * sumi + (double)f16(a[i].m) * dx * sumx;
    }
    return (float)acc;
}

/* ---- MXFP4 ------------------------------------------------------------------ */
/* 32 values: one E8M0 byte e (a power of two, 2^(e - 127)), then 16 bytes
 * of nibbles laid out as Q4_0's. A nibble is an E2M1 code: bit 3 the sign,
 * bits 0..2 the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6. As GGUF tools do,
 * the table holds twice those (integers, quant_mxfp4_kvalues) and the scale is
 * halved (quant_e8m0_half: 2^(e - 128)), so x = kvalues[q] * 2^(e - 128). The
 * product is exact in float (a power of two times an integer of at most 4
 * significant bits; down to e = 0 it is a subnormal multiple of 2^-149),
 * so to_float has no rounding at all; e = 255 (2^127) overflows to
 * infinity for codes of magnitude 2 and up, as in GGUF tools. */

const int8_t quant_mxfp4_kvalues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 2^(e - 128) as a float: subnormal 2^-128 and 2^-127 for e = 0 and 1,
 * else the exponent field e - 1. */
float quant_e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline int mxfp4_q(const block_mxfp4 *b, int j) { return j < 16 ? (b->qs[j] & 0x0F) : (b->qs[j - 16] >> 4); }

static void mxfp4_to_float(const void *src, float *dst, int64_t n) {
    const block_mxfp4 *b = src;
    for (int64_t i = 0; i < n / QK_MXFP4; i++) {
        float d = quant_e8m0_half(b[i].e);
        for (int j = 0; j < QK_MXFP4; j++) dst[i * QK_MXFP4 + j] = (float)quant_mxfp4_kvalues[mxfp4_q(&b[i], j)] * d;
    }
}

/* The block's exponent from its largest magnitude a: e = floor(log2 a) - 2
 * + 127, so the largest code, 6 = 12 / 2, times 2^(e - 127) reaches a's
 * octave (a / 2^(e-127) lies in [4, 8)); 0 for an all-zero block. Then
 * each element takes the code of least |kvalues[q] * d - x| in float, the
 * first on a tie (so 0 before -0), as GGUF tools do. The exponent is
 * clamped to 0..254: blocks whose largest magnitude is under 2^-125 (where
 * GGUF tools wrap the byte around) get e = 0, which still represents them
 * to within half a step. */
static void mxfp4_from_float(const float *src, void *dst, int64_t n) {
    block_mxfp4 *b = dst;
    for (int64_t i = 0; i < n / QK_MXFP4; i++) {
        const float *x = src + i * QK_MXFP4;
        float amax = fabsf(signed_absmax(x, QK_MXFP4));
        int e = 0;
        if (amax > 0.0f) {
            float l = floorf(log2f(amax)) - 2.0f + 127.0f;
            e = !(l >= 0.0f) ? 0 : l > 254.0f ? 254 : (int)l;
        }
        float d = quant_e8m0_half((uint8_t)e);
        b[i].e = (uint8_t)e;
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            uint8_t q[2];
            for (int h = 0; h < 2; h++) {
                float v = x[j + h * QK_MXFP4 / 2];
                int best = 0;
                float best_err = fabsf((float)quant_mxfp4_kvalues[0] * d - v);
                for (int k = 1; k < 16; k++) {
                    float err = fabsf((float)quant_mxfp4_kvalues[k] * d - v);
                    if (err < best_err) best = k, best_err = err;
                }
                q[h] = (uint8_t)best;
            }
            b[i].qs[j] = (uint8_t)(q[0] | (q[1] << 4));
        }
    }
}

/* Against Q8_0 activations: per block 2^(e-128) * dx * sum(kvalues[q] * qx),
 * the integer sum exact (|sum| <= 32 * 12 * 127). */
static float vec_dot_mxfp4(int64_t n, const void *w, const void *x) {
    const block_mxfp4 *a = w;
    const block_q8_0 *b = x;
    double acc = 0;
    for (int64_t i = 0; i < n / QK_MXFP4; i++) {
        int sumi = 0;
        for (int j = 0; j < QK_MXFP4; j++) sumi += quant_mxfp4_kvalues[mxfp4_q(&a[i], j)] * b[i].qs[j];
        acc += (double)quant_e8m0_half(a[i].e) * f16(b[i].d) * sumi;
    }
    return (float)acc;
}

/* ---- K-quant element and scale access ------------------------------------ */
/* These accessors are the single statement of the element order given in
 * quant.h; the kernels below only loop over them. e is 0..255. */

static void get_scale_min_k4(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Inverse of get_scale_min_k4; s must start zeroed. sc, m in 0..63. */
static void set_scale_min_k4(int j, uint8_t *s, int sc, int m) {
    if (j < 4) {
        s[j] |= (uint8_t)sc;
        s[j + 4] |= (uint8_t)m;
    } else {
        s[j + 4] = (uint8_t)((sc & 0x0F) | ((m & 0x0F) << 4));
        s[j - 4] |= (uint8_t)((sc >> 4) << 6);
        s[j] |= (uint8_t)((m >> 4) << 6);
    }
}

/* Low four bits of element e in a Q4_K/Q5_K qs[128] array. */
static inline int k_nibble(const uint8_t *qs, int e) {
    uint8_t byte = qs[32 * (e / 64) + e % 32];
    return (e % 64) < 32 ? byte & 0x0F : byte >> 4;
}

/* Store the low four bits of q for element e; qs must start zeroed. */
static inline void k_set_nibble(uint8_t *qs, int e, int q) {
    uint8_t *p = &qs[32 * (e / 64) + e % 32];
    *p |= (uint8_t)((e % 64) < 32 ? (q & 0x0F) : (q & 0x0F) << 4);
}

static inline int q4_K_q(const block_q4_K *b, int e) { return k_nibble(b->qs, e); }

static inline int q5_K_q(const block_q5_K *b, int e) {
    return k_nibble(b->qs, e) | (((b->qh[e % 32] >> (e / 32)) & 1) << 4);
}

/* Signed value q - 32 in -32..31. */
static inline int q6_K_q(const block_q6_K *b, int e) {
    int h = e / 128, k = (e % 128) / 32, l = e % 32;
    uint8_t lo = b->ql[64 * h + 32 * (k & 1) + l];
    int low = k < 2 ? lo & 0x0F : lo >> 4;
    int high = (b->qh[32 * h + l] >> (2 * k)) & 3;
    return (low | (high << 4)) - 32;
}

/* Store q (0..63, i.e. value + 32) for element e; ql and qh start zeroed. */
static void q6_K_set(block_q6_K *b, int e, int q) {
    int h = e / 128, k = (e % 128) / 32, l = e % 32;
    uint8_t *lo = &b->ql[64 * h + 32 * (k & 1) + l];
    *lo |= (uint8_t)(k < 2 ? (q & 0x0F) : (q & 0x0F) << 4);
    b->qh[32 * h + l] |= (uint8_t)(((q >> 4) & 3) << (2 * k));
}

/* ---- K-quant dequantization ------------------------------------------------ */
/* Each sub-block's d*sc and dmin*m are formed first, as GGUF tools do; both
 * and their products with q are exact (see the top of the file). */

static void q4_K_to_float(const void *src, float *dst, int64_t n) {
    const block_q4_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b++) {
        float d = f16(b->d), dmin = f16(b->dmin);
        float *y = dst + i * QK_K;
        for (int j = 0; j < QK_K / 32; j++) {
            int sc, m;
            get_scale_min_k4(j, b->scales, &sc, &m);
            float dj = d * (float)sc, mj = dmin * (float)m;
            for (int e = 32 * j; e < 32 * j + 32; e++) y[e] = dj * (float)q4_K_q(b, e) - mj;
        }
    }
}

static void q5_K_to_float(const void *src, float *dst, int64_t n) {
    const block_q5_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b++) {
        float d = f16(b->d), dmin = f16(b->dmin);
        float *y = dst + i * QK_K;
        for (int j = 0; j < QK_K / 32; j++) {
            int sc, m;
            get_scale_min_k4(j, b->scales, &sc, &m);
            float dj = d * (float)sc, mj = dmin * (float)m;
            for (int e = 32 * j; e < 32 * j + 32; e++) y[e] = dj * (float)q5_K_q(b, e) - mj;
        }
    }
}

static void q6_K_to_float(const void *src, float *dst, int64_t n) {
    const block_q6_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b++) {
        float d = f16(b->d);
        float *y = dst + i * QK_K;
        for (int j = 0; j < QK_K / 16; j++) {
            float dj = d * (float)b->scales[j];
            for (int e = 16 * j; e < 16 * j + 16; e++) y[e] = dj * (float)q6_K_q(b, e);
        }
    }
}

static void q8_K_to_float(const void *src, float *dst, int64_t n) {
    const block_q8_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++)
        for (int e = 0; e < QK_K; e++) dst[i * QK_K + e] = b[i].d * (float)b[i].qs[e];
}

/* ---- K-quant quantization -------------------------------------------------- */

/* Fit x[0..n) ~ a*q + b with integer q in [0, nmax], a >= 0 and b <= 0 (the
 * formats store -b as a non-negative min). The plain min-max grid is the
 * first candidate; then 21 step widths from (nmax-1)/(hi-lo) to
 * (nmax+1)/(hi-lo) each round q on that grid and solve the least-squares
 * (a, b) for those q. The pair with the smallest squared error wins. */
static void fit_affine(const float *x, int n, int nmax, float *a_out, float *b_out) {
    assert(n <= 32);
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    if (lo > 0.0f) lo = 0.0f;
    if (!(hi > lo)) { /* constant non-positive block (or NaN): x = b */
        *a_out = 0.0f;
        *b_out = lo;
        return;
    }
    double range = (double)hi - lo;
    double best_a = range / nmax, best_b = lo, best_err = 0;
    for (int i = 0; i < n; i++) {
        double q = round_fast((float)((x[i] - lo) / best_a), 0, nmax);
        double e = best_a * q + best_b - x[i];
        best_err += e * e;
    }
    double sx = 0;
    for (int i = 0; i < n; i++) sx += x[i];
    for (int step = -10; step <= 10; step++) {
        float iscale = (float)((nmax + 0.1 * step) / range);
        int q[32], sq = 0, sqq = 0; /* exact: at most 32 * 31^2 */
        float sqx = 0.0f;
        for (int i = 0; i < n; i++) {
            q[i] = round_fast((x[i] - lo) * iscale, 0, nmax);
            sq += q[i];
            sqq += q[i] * q[i];
            sqx += (float)q[i] * x[i];
        }
        double det = (double)n * sqq - (double)sq * sq;
        if (det <= 0) continue; /* all q equal: no slope to fit */
        double a = ((double)n * sqx - (double)sq * sx) / det;
        double b = (sx - a * sq) / n;
        if (b > 0) { /* constrained optimum lies on b = 0 */
            b = 0;
            a = sqx / sqq;
        }
        if (a < 0) continue;
        float err = 0.0f, fa = (float)a, fb = (float)b;
        for (int i = 0; i < n; i++) {
            float e = fa * (float)q[i] + fb - x[i];
            err += e * e;
        }
        if (err < best_err) {
            best_err = err;
            best_a = a;
            best_b = b;
        }
    }
    *a_out = (float)best_a;
    *b_out = (float)best_b;
}

/* Squared error of coding x[0..n) as ea*q - em with q rounded to nearest
 * in [0, nmax] (q = 0 when ea is 0); stores the q when q_out is not NULL.
 * ea, em are the decoder's float products d*sc and dmin*m. */
static double affine_code_err(const float *x, int n, int nmax, float ea, float em, int *q_out) {
    float inv = ea > 0.0f ? 1.0f / ea : 0.0f; /* q = 0 throughout when ea is 0 */
    float err = 0.0f;
    for (int i = 0; i < n; i++) {
        int q = round_fast((x[i] + em) * inv, 0, nmax);
        float e = (ea * (float)q - em) - x[i];
        err += e * e;
        if (q_out) q_out[i] = q;
    }
    return err;
}

/* Q4_K (nmax 15) and Q5_K (nmax 31) share everything but the bit storage.
 * Each sub-block's (a_j, b_j) is fitted, d = max a / 63 and dmin =
 * max(-b) / 63 are rounded to f16, and the 6-bit codes start at round(a_j /
 * d), round(-b_j / dmin). Rounding those codes can cost more than the fit
 * itself, so each pair is then searched over its neighbours (and m = 0) with
 * the elements re-rounded against what the decoder will compute; the pair
 * with the smallest error is kept. Fills d, dmin, scales and q[256]. */
static void quantize_k_affine(const float *x, int nmax, uint16_t *d16, uint16_t *dmin16, uint8_t *scales, int *q) {
    float a[8], b[8], amax = 0.0f, mmax = 0.0f;
    for (int j = 0; j < 8; j++) {
        fit_affine(x + 32 * j, 32, nmax, &a[j], &b[j]);
        amax = fmaxf(amax, a[j]);
        mmax = fmaxf(mmax, -b[j]);
    }
    *d16 = lm_f32_to_f16(amax / 63.0f);
    *dmin16 = lm_f32_to_f16(mmax / 63.0f);
    float d = f16(*d16), dmin = f16(*dmin16);
    memset(scales, 0, K_SCALE_SIZE);
    for (int j = 0; j < 8; j++) {
        const float *xj = x + 32 * j;
        int sc0 = d > 0.0f ? round_fast(a[j] / d, 0, 63) : 0;
        int m0 = dmin > 0.0f ? round_fast(-b[j] / dmin, 0, 63) : 0;
        int best_sc = sc0, best_m = m0;
        double best = INFINITY;
        for (int sc = sc0 - 1; sc <= sc0 + 1; sc++) {
            for (int k = 0; k < 4; k++) {
                int m = k < 3 ? m0 - 1 + k : 0;
                if (sc < 0 || sc > 63 || m < 0 || m > 63) continue;
                double err = affine_code_err(xj, 32, nmax, d * (float)sc, dmin * (float)m, NULL);
                if (err < best) {
                    best = err;
                    best_sc = sc;
                    best_m = m;
                }
            }
        }
        set_scale_min_k4(j, scales, best_sc, best_m);
        affine_code_err(xj, 32, nmax, d * (float)best_sc, dmin * (float)best_m, q + 32 * j);
    }
}

static void q4_K_from_float(const float *src, void *dst, int64_t n) {
    block_q4_K *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, b++) {
        int q[QK_K];
        quantize_k_affine(src + i * QK_K, 15, &b->d, &b->dmin, b->scales, q);
        memset(b->qs, 0, sizeof b->qs);
        for (int e = 0; e < QK_K; e++) k_set_nibble(b->qs, e, q[e]);
    }
}

static void q5_K_from_float(const float *src, void *dst, int64_t n) {
    block_q5_K *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, b++) {
        int q[QK_K];
        quantize_k_affine(src + i * QK_K, 31, &b->d, &b->dmin, b->scales, q);
        memset(b->qs, 0, sizeof b->qs);
        memset(b->qh, 0, sizeof b->qh);
        for (int e = 0; e < QK_K; e++) {
            k_set_nibble(b->qs, e, q[e]);
            b->qh[e % 32] |= (uint8_t)(((q[e] >> 4) & 1) << (e / 32));
        }
    }
}

/* Fit x[0..n) ~ a*q with integer q in [-32, 31]. The value of largest
 * magnitude maps near -32 (the wider side); 21 step widths around that are
 * rounded and least-squares refit, keeping the smallest squared error. */
static float fit_symmetric(const float *x, int n) {
    assert(n <= 16);
    float max = signed_absmax(x, n);
    if (max == 0.0f) return 0.0f;
    double best_a = max / -32.0, best_err = INFINITY;
    for (int step = -10; step <= 10; step++) {
        float iscale = (float)(-(32.0 + 0.1 * step) / max);
        double sqq = 0, sqx = 0;
        int q[16];
        for (int i = 0; i < n; i++) {
            q[i] = round_fast(x[i] * iscale, -32, 31);
            sqq += (double)q[i] * q[i];
            sqx += (double)q[i] * x[i];
        }
        if (sqq == 0) continue;
        double a = sqx / sqq, err = 0;
        for (int i = 0; i < n; i++) err += (a * q[i] - x[i]) * (a * q[i] - x[i]);
        if (err < best_err) {
            best_err = err;
            best_a = a;
        }
    }
    return (float)best_a;
}

/* Squared error of coding the 16 values x as dj*q, q rounded to nearest in
 * [-32, 31] (0 when dj is 0); stores the q when q_out is not NULL. */
static double symmetric_code_err(const float *x, float dj, int *q_out) {
    float inv = dj != 0.0f ? 1.0f / dj : 0.0f; /* q = 0 throughout when dj is 0 */
    float err = 0.0f;
    for (int i = 0; i < 16; i++) {
        int q = round_fast(x[i] * inv, -32, 31);
        float e = dj * (float)q - x[i];
        err += e * e;
        if (q_out) q_out[i] = q;
    }
    return err;
}

/* Code one Q6_K super-block against the f16 super-scale d16: each int8
 * sub-block scale is the rounded a_j / d or a neighbour, whichever codes its
 * 16 values with the least error. Returns the block's squared error. */
static double q6_K_code(const float *x, const float *a, uint16_t d16, block_q6_K *b) {
    float d = f16(d16);
    double total = 0;
    b->d = d16;
    memset(b->ql, 0, sizeof b->ql);
    memset(b->qh, 0, sizeof b->qh);
    for (int j = 0; j < QK_K / 16; j++) {
        int sc0 = d > 0.0f ? round_fast(a[j] / d, -128, 127) : 0, best_sc = sc0;
        double best = INFINITY;
        for (int sc = sc0 - 1; sc <= sc0 + 1; sc++) {
            if (sc < -128 || sc > 127) continue;
            double err = symmetric_code_err(x + 16 * j, d * (float)sc, NULL);
            if (err < best) {
                best = err;
                best_sc = sc;
            }
        }
        int q[16];
        total += symmetric_code_err(x + 16 * j, d * (float)best_sc, q);
        b->scales[j] = (int8_t)best_sc;
        for (int e = 0; e < 16; e++) q6_K_set(b, 16 * j + e, q[e] + 32);
    }
    return total;
}

/* Sub-block scales a_j from fit_symmetric; the super-scale d = max|a| / 127
 * in f16 and its two neighbouring f16 values are tried, keeping the best.
 * The neighbours matter when d is an f16 subnormal (super-blocks with
 * max|x| below ~0.25), where its rounding is coarse. */
static void q6_K_from_float(const float *src, void *dst, int64_t n) {
    block_q6_K *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, b++) {
        const float *x = src + i * QK_K;
        float a[QK_K / 16], amax = 0.0f;
        for (int j = 0; j < QK_K / 16; j++) {
            a[j] = fit_symmetric(x + 16 * j, 16);
            amax = fmaxf(amax, fabsf(a[j]));
        }
        uint16_t d0 = lm_f32_to_f16(amax / 127.0f);
        double best = q6_K_code(x, a, d0, b);
        /* positive finite f16 values are ordered like their bit patterns */
        for (int k = -1; k <= 1 && d0 > 0 && d0 < 0x7c00; k += 2) {
            uint16_t dk = (uint16_t)(d0 + k);
            if (dk == 0 || dk >= 0x7c00) continue;
            block_q6_K trial;
            double err = q6_K_code(x, a, dk, &trial);
            if (err < best) {
                best = err;
                *b = trial;
            }
        }
    }
}

/* Activation format for the K-quants: the value of largest magnitude maps
 * to -128 (so d = -max/128) and the rest round to nearest, capped at 127;
 * bsums hold the sum of each 16 q for the K-quants' min terms. */
static void q8_K_from_float(const float *src, void *dst, int64_t n) {
    block_q8_K *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, b++) {
        const float *x = src + i * QK_K;
        float max = signed_absmax(x, QK_K);
        if (max == 0.0f) {
            memset(b, 0, sizeof *b);
            continue;
        }
        float iscale = -128.0f / max;
        for (int e = 0; e < QK_K; e++) b->qs[e] = (int8_t)round_clamp(iscale * x[e], -128, 127);
        for (int g = 0; g < QK_K / 16; g++) {
            int s = 0;
            for (int e = 16 * g; e < 16 * g + 16; e++) s += b->qs[e];
            b->bsums[g] = (int16_t)s;
        }
        b->d = 1.0f / iscale;
    }
}

/* ---- dot products ------------------------------------------------------------ */
/* Float types accumulate in double. Quantized types form exact integer dot
 * products per (sub-)block - int32 cannot overflow: the largest, Q6_K, is
 * bounded by 16 sub-blocks * 128 * 16 * 32 * 128 < 2^28 - and combine them
 * with the block scales in double, so the result is the dot product of the
 * two rows the blocks represent, up to the final rounding to float. */

static float vec_dot_f32(int64_t n, const void *w, const void *x) {
    const float *a = w, *b = x;
    double acc = 0;
    for (int64_t i = 0; i < n; i++) acc += (double)a[i] * b[i];
    return (float)acc;
}

static float vec_dot_f16(int64_t n, const void *w, const void *x) {
    const uint16_t *a = w, *b = x;
    double acc = 0;
    for (int64_t i = 0; i < n; i++) acc += (double)lm_f16_to_f32(a[i]) * lm_f16_to_f32(b[i]);
    return (float)acc;
}

static float vec_dot_bf16(int64_t n, const void *w, const void *x) {
    const uint16_t *a = w;
    const float *b = x;
    double acc = 0;
    for (int64_t i = 0; i < n; i++) acc += (double)lm_bf16_to_f32(a[i]) * b[i];
    return (float)acc;
}

static float vec_dot_q8_0(int64_t n, const void *w, const void *x) {
    const block_q8_0 *a = w, *b = x;
    double acc = 0;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        int sumi = 0;
        for (int j = 0; j < QK8_0; j++) sumi += a[i].qs[j] * b[i].qs[j];
        acc += (double)f16(a[i].d) * f16(b[i].d) * sumi;
    }
    return (float)acc;
}

static float vec_dot_q4_0(int64_t n, const void *w, const void *x) {
    const block_q4_0 *a = w;
    const block_q8_0 *b = x;
    double acc = 0;
    for (int64_t i = 0; i < n / QK4_0; i++) {
        int sumi = 0;
        for (int j = 0; j < QK4_0 / 2; j++) {
            sumi += ((a[i].qs[j] & 0x0F) - 8) * b[i].qs[j];
            sumi += ((a[i].qs[j] >> 4) - 8) * b[i].qs[j + QK4_0 / 2];
        }
        acc += (double)f16(a[i].d) * f16(b[i].d) * sumi;
    }
    return (float)acc;
}

/* Q4_K/Q5_K: sum_e (d sc_j q_e - dmin m_j) x_e
 *          = d * sum_j sc_j (q . xq)_j  -  dmin * sum_j m_j (sum of xq)_j,
 * all times the activation's d; the second sums come from bsums. */
static float vec_dot_q4_K(int64_t n, const void *w, const void *x) {
    const block_q4_K *a = w;
    const block_q8_K *b = x;
    double acc = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int sumi = 0, summ = 0;
        for (int j = 0; j < QK_K / 32; j++) {
            int sc, m, dot = 0;
            get_scale_min_k4(j, a[i].scales, &sc, &m);
            for (int e = 32 * j; e < 32 * j + 32; e++) dot += q4_K_q(&a[i], e) * b[i].qs[e];
            sumi += sc * dot;
            summ += m * (b[i].bsums[2 * j] + b[i].bsums[2 * j + 1]);
        }
        acc += (double)b[i].d * ((double)f16(a[i].d) * sumi - (double)f16(a[i].dmin) * summ);
    }
    return (float)acc;
}

static float vec_dot_q5_K(int64_t n, const void *w, const void *x) {
    const block_q5_K *a = w;
    const block_q8_K *b = x;
    double acc = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int sumi = 0, summ = 0;
        for (int j = 0; j < QK_K / 32; j++) {
            int sc, m, dot = 0;
            get_scale_min_k4(j, a[i].scales, &sc, &m);
            for (int e = 32 * j; e < 32 * j + 32; e++) dot += q5_K_q(&a[i], e) * b[i].qs[e];
            sumi += sc * dot;
            summ += m * (b[i].bsums[2 * j] + b[i].bsums[2 * j + 1]);
        }
        acc += (double)b[i].d * ((double)f16(a[i].d) * sumi - (double)f16(a[i].dmin) * summ);
    }
    return (float)acc;
}

static float vec_dot_q6_K(int64_t n, const void *w, const void *x) {
    const block_q6_K *a = w;
    const block_q8_K *b = x;
    double acc = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int sumi = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            int dot = 0;
            for (int e = 16 * j; e < 16 * j + 16; e++) dot += q6_K_q(&a[i], e) * b[i].qs[e];
            sumi += a[i].scales[j] * dot;
        }
        acc += (double)f16(a[i].d) * b[i].d * sumi;
    }
    return (float)acc;
}

/* ---- the table ------------------------------------------------------------- */

/* Every ggml type, with the reference kernels of those lamina computes with
 * (Q8_K is an activation format only: no weight kernel). */
static const lm_type_traits traits[LM_TYPE_COUNT] = {
    [LM_TYPE_F32] = {.name = "F32",
                     .blck = 1,
                     .type_size = 4,
                     .is_quantized = false,
                     .to_float = f32_to_float,
                     .from_float = f32_from_float,
                     .vec_dot_type = LM_TYPE_F32,
                     .vec_dot = vec_dot_f32},
    [LM_TYPE_F16] = {.name = "F16",
                     .blck = 1,
                     .type_size = 2,
                     .is_quantized = false,
                     .to_float = f16_to_float,
                     .from_float = f16_from_float,
                     .vec_dot_type = LM_TYPE_F16,
                     .vec_dot = vec_dot_f16},
    [LM_TYPE_Q4_0] = {.name = "Q4_0",
                      .blck = 32,
                      .type_size = 18,
                      .is_quantized = true,
                      .to_float = q4_0_to_float,
                      .from_float = q4_0_from_float,
                      .vec_dot_type = LM_TYPE_Q8_0,
                      .vec_dot = vec_dot_q4_0},
    [LM_TYPE_Q4_1] = {.name = "Q4_1",
                      .blck = 32,
                      .type_size = 20,
                      .is_quantized = true,
                      .to_float = q4_1_to_float,
                      .from_float = q4_1_from_float,
                      .vec_dot_type = LM_TYPE_Q8_0,
                      .vec_dot = vec_dot_q4_1},
    [LM_TYPE_Q5_0] = {.name = "Q5_0",
                      .blck = 32,
                      .type_size = 22,
                      .is_quantized = true,
                      .to_float = q5_0_to_float,
                      .from_float = q5_0_from_float,
                      .vec_dot_type = LM_TYPE_Q8_0,
                      .vec_dot = vec_dot_q5_0},
    [LM_TYPE_Q5_1] = {.name = "Q5_1",
                      .blck = 32,
                      .type_size = 24,
                      .is_quantized = true,
                      .to_float = q5_1_to_float,
                      .from_float = q5_1_from_float,
                      .vec_dot_type = LM_TYPE_Q8_0,
                      .vec_dot = vec_dot_q5_1},
    [LM_TYPE_Q8_0] = {.name = "Q8_0",
                      .blck = 32,
                      .type_size = 34,
                      .is_quantized = true,
                      .to_float = q8_0_to_float,
                      .from_float = q8_0_from_float,
                      .vec_dot_type = LM_TYPE_Q8_0,
                      .vec_dot = vec_dot_q8_0},
    [LM_TYPE_Q8_1] = {.name = "Q8_1", .blck = 32, .type_size = 36, .is_quantized = true},
    [LM_TYPE_Q2_K] = {.name = "Q2_K", .blck = 256, .type_size = 84, .is_quantized = true},
    [LM_TYPE_Q3_K] = {.name = "Q3_K", .blck = 256, .type_size = 110, .is_quantized = true},
    [LM_TYPE_Q4_K] = {.name = "Q4_K",
                      .blck = 256,
                      .type_size = 144,
                      .is_quantized = true,
                      .to_float = q4_K_to_float,
                      .from_float = q4_K_from_float,
                      .vec_dot_type = LM_TYPE_Q8_K,
                      .vec_dot = vec_dot_q4_K},
    [LM_TYPE_Q5_K] = {.name = "Q5_K",
                      .blck = 256,
                      .type_size = 176,
                      .is_quantized = true,
                      .to_float = q5_K_to_float,
                      .from_float = q5_K_from_float,
                      .vec_dot_type = LM_TYPE_Q8_K,
                      .vec_dot = vec_dot_q5_K},
    [LM_TYPE_Q6_K] = {.name = "Q6_K",
                      .blck = 256,
                      .type_size = 210,
                      .is_quantized = true,
                      .to_float = q6_K_to_float,
                      .from_float = q6_K_from_float,
                      .vec_dot_type = LM_TYPE_Q8_K,
                      .vec_dot = vec_dot_q6_K},
    [LM_TYPE_Q8_K] = {.name = "Q8_K",
                      .blck = 256,
                      .type_size = 292,
                      .is_quantized = true,
                      .to_float = q8_K_to_float,
                      .from_float = q8_K_from_float,
                      .vec_dot_type = LM_TYPE_F32,
                      .vec_dot = NULL},
    [LM_TYPE_IQ2_XXS] = {.name = "IQ2_XXS", .blck = 256, .type_size = 66, .is_quantized = true},
    [LM_TYPE_IQ2_XS] = {.name = "IQ2_XS", .blck = 256, .type_size = 74, .is_quantized = true},
    [LM_TYPE_IQ3_XXS] = {.name = "IQ3_XXS", .blck = 256, .type_size = 98, .is_quantized = true},
    [LM_TYPE_IQ1_S] = {.name = "IQ1_S", .blck = 256, .type_size = 50, .is_quantized = true},
    [LM_TYPE_IQ4_NL] = {.name = "IQ4_NL", .blck = 32, .type_size = 18, .is_quantized = true},
    [LM_TYPE_IQ3_S] = {.name = "IQ3_S", .blck = 256, .type_size = 110, .is_quantized = true},
    [LM_TYPE_IQ2_S] = {.name = "IQ2_S", .blck = 256, .type_size = 82, .is_quantized = true},
    [LM_TYPE_IQ4_XS] = {.name = "IQ4_XS", .blck = 256, .type_size = 136, .is_quantized = true},
    [LM_TYPE_I8] = {.name = "I8", .blck = 1, .type_size = 1, .is_quantized = false},
    [LM_TYPE_I16] = {.name = "I16", .blck = 1, .type_size = 2, .is_quantized = false},
    [LM_TYPE_I32] = {.name = "I32", .blck = 1, .type_size = 4, .is_quantized = false},
    [LM_TYPE_I64] = {.name = "I64", .blck = 1, .type_size = 8, .is_quantized = false},
    [LM_TYPE_F64] = {.name = "F64", .blck = 1, .type_size = 8, .is_quantized = false},
    [LM_TYPE_IQ1_M] = {.name = "IQ1_M", .blck = 256, .type_size = 56, .is_quantized = true},
    [LM_TYPE_BF16] = {.name = "BF16",
                      .blck = 1,
                      .type_size = 2,
                      .is_quantized = false,
                      .to_float = bf16_to_float,
                      .from_float = bf16_from_float,
                      .vec_dot_type = LM_TYPE_F32,
                      .vec_dot = vec_dot_bf16},
    [LM_TYPE_TQ1_0] = {.name = "TQ1_0", .blck = 256, .type_size = 54, .is_quantized = true},
    [LM_TYPE_TQ2_0] = {.name = "TQ2_0", .blck = 256, .type_size = 66, .is_quantized = true},
    [LM_TYPE_MXFP4] = {.name = "MXFP4",
                       .blck = 32,
                       .type_size = 17,
                       .is_quantized = true,
                       .to_float = mxfp4_to_float,
                       .from_float = mxfp4_from_float,
                       .vec_dot_type = LM_TYPE_Q8_0,
                       .vec_dot = vec_dot_mxfp4},
};

const lm_type_traits *quant_traits(uint32_t type) {
    if (type >= LM_TYPE_COUNT || traits[type].name == NULL) return NULL;
    return &traits[type];
}

const char *quant_type_name(uint32_t type) {
    const lm_type_traits *t = quant_traits(type);
    return t ? t->name : "unknown";
}

int quant_type_from_name(const char *name) {
    for (int i = 0; i < LM_TYPE_COUNT; i++)
        if (traits[i].name && strcasecmp(traits[i].name, name) == 0) return i;
    return -1;
}

bool quant_supported(uint32_t type) {
    const lm_type_traits *t = quant_traits(type);
    return t && t->vec_dot && t->to_float;
}

size_t quant_row_size(uint32_t type, int64_t n) {
    const lm_type_traits *t = quant_traits(type);
    if (!t || n < 0 || n % t->blck) return 0;
    return (size_t)(n / t->blck) * t->type_size;
}

void quant_to_float_ref(uint32_t type, const void *src, float *dst, int64_t n) {
    assert(type < LM_TYPE_COUNT && traits[type].to_float && n % traits[type].blck == 0);
    traits[type].to_float(src, dst, n);
}

void quant_from_float_ref(uint32_t type, const float *src, void *dst, int64_t n) {
    assert(type < LM_TYPE_COUNT && traits[type].from_float && n % traits[type].blck == 0);
    traits[type].from_float(src, dst, n);
}

float quant_vec_dot_ref(uint32_t type, int64_t n, const void *w, const void *x) {
    assert(type < LM_TYPE_COUNT && traits[type].vec_dot && n % traits[type].blck == 0);
    return traits[type].vec_dot(n, w, x);
}

size_t quant_act_row_size(uint32_t weight_type, int64_t n) {
    const lm_type_traits *t = quant_traits(weight_type);
    if (!t || !t->vec_dot || quant_row_size(weight_type, n) == 0) return 0;
    return quant_row_size(t->vec_dot_type, n);
}

void quant_act_from_float(uint32_t weight_type, const float *x, void *dst, int64_t n) {
    const lm_type_traits *t = quant_traits(weight_type);
    assert(t && t->vec_dot);
    const lm_type_traits *at = quant_traits(t->vec_dot_type);
    assert(at && at->from_float && n % at->blck == 0);
    at->from_float(x, dst, n);
}

/* ---- interleaved weights (layout in quant.h) ------------------------------ */

_Static_assert(sizeof(block_q8_0s) == 40, "block_q8_0s is 40 bytes");

/* Bytes of one block column of an interleaved group: 8 f16 scales, then the
 * 8 rows' quant bytes. */
static size_t pack_block_bytes(uint32_t type) {
    if (type == LM_TYPE_Q4_0) return 2 * LM_PACK_ROWS + LM_PACK_ROWS * QK4_0 / 2;
    if (type == LM_TYPE_Q8_0) return 2 * LM_PACK_ROWS + LM_PACK_ROWS * QK8_0;
    if (type == LM_TYPE_Q5_0) return 2 * LM_PACK_ROWS + LM_PACK_ROWS * (4 + QK5_0 / 2);
    if (type == LM_TYPE_Q4_1) return 4 * LM_PACK_ROWS + LM_PACK_ROWS * QK4_1 / 2;
    if (type == LM_TYPE_Q5_1) return 4 * LM_PACK_ROWS + LM_PACK_ROWS * (4 + QK5_1 / 2);
    if (type == LM_TYPE_MXFP4) return LM_PACK_ROWS + LM_PACK_ROWS * QK_MXFP4 / 2;
    return 0;
}

/* Scales at the head of a block: d (and m for Q4_1, Q5_1), and their
 * bytes each (2, f16; MXFP4's E8M0 exponent: 1). */
static int pack_scales(uint32_t type) { return type == LM_TYPE_Q4_1 || type == LM_TYPE_Q5_1 ? 2 : 1; }
static size_t pack_scale_bytes(uint32_t type) { return type == LM_TYPE_MXFP4 ? 1 : 2; }

int quant_pack_rows(uint32_t type) {
    if (type == LM_TYPE_Q4_0 || type == LM_TYPE_Q5_0 || type == LM_TYPE_Q8_0 || type == LM_TYPE_Q4_K ||
        type == LM_TYPE_Q4_1 || type == LM_TYPE_Q5_1 || type == LM_TYPE_MXFP4)
        return LM_PACK_ROWS;
    if (type == LM_TYPE_F16) return LM_PANEL_ROWS;
    return 0;
}

size_t quant_pack_size(uint32_t type, int64_t rows, int64_t cols) {
    if (rows < 0 || cols < 0) return 0;
    if (type == LM_TYPE_F16) {
        int64_t groups = (rows + LM_PANEL_ROWS - 1) / LM_PANEL_ROWS;
        return (size_t)groups * LM_PANEL_ROWS * (size_t)cols * sizeof(uint16_t);
    }
    int64_t groups = (rows + LM_PACK_ROWS - 1) / LM_PACK_ROWS;
    if (type == LM_TYPE_Q4_K)
        return cols % QK_K ? 0 : (size_t)groups * (size_t)(cols / QK_K) * LM_PACK_ROWS * sizeof(block_q4_K);
    size_t bb = pack_block_bytes(type);
    if (!bb || cols % 32) return 0;
    return (size_t)groups * (size_t)(cols / 32) * bb;
}

size_t quant_packed_x_row_size(uint32_t type, int64_t n) {
    if (n < 0) return 0;
    if (type == LM_TYPE_F16) return (size_t)n * sizeof(float);
    if (type == LM_TYPE_Q4_K) return quant_row_size(LM_TYPE_Q8_K, n);
    if (type == LM_TYPE_Q4_0 || type == LM_TYPE_Q5_0 || type == LM_TYPE_Q8_0 || type == LM_TYPE_Q4_1 ||
        type == LM_TYPE_Q5_1 || type == LM_TYPE_MXFP4)
        return quant_packed_act_row_size(n);
    return 0;
}

/* Q4_K: per super-block column the 8 rows' d, then dmin (f16 each), the
 * three 4-byte words of their scales (word w of row r at 32w + 4r), then
 * bytes 4k..4k+3 of row r's qs at 32k + 4r; padding rows zero (zero d and
 * dmin). */
static void pack_q4_K(const uint8_t *src, size_t src_stride, int64_t rows, int64_t cols, uint8_t *o) {
    const int64_t nb = cols / QK_K, groups = (rows + LM_PACK_ROWS - 1) / LM_PACK_ROWS;
    const size_t bb = LM_PACK_ROWS * sizeof(block_q4_K);
    memset(o, 0, quant_pack_size(LM_TYPE_Q4_K, rows, cols));
    for (int64_t g = 0; g < groups; g++) {
        for (int64_t b = 0; b < nb; b++, o += bb) {
            for (int r = 0; r < LM_PACK_ROWS && g * LM_PACK_ROWS + r < rows; r++) {
                const block_q4_K *blk =
                    (const block_q4_K *)(const void *)(src + (size_t)(g * LM_PACK_ROWS + r) * src_stride) + b;
                memcpy(o + 2 * r, &blk->d, 2);
                memcpy(o + 16 + 2 * r, &blk->dmin, 2);
                for (int wd = 0; wd < 3; wd++) memcpy(o + 32 + 32 * wd + 4 * r, blk->scales + 4 * wd, 4);
                for (int k = 0; k < QK_K / 8; k++) memcpy(o + 128 + 32 * k + 4 * r, blk->qs + 4 * k, 4);
            }
        }
    }
}

/* F16 panels: a transpose of each group of 16 rows, 16 columns at a time
 * (16 x 16 halves, 512 bytes, so the reads stay in L1); padding rows zero. */
static void pack_f16(const uint8_t *src, size_t src_stride, int64_t rows, int64_t cols, uint16_t *o) {
    const int64_t groups = (rows + LM_PANEL_ROWS - 1) / LM_PANEL_ROWS;
    memset(o, 0, quant_pack_size(LM_TYPE_F16, rows, cols));
    for (int64_t g = 0; g < groups; g++, o += (size_t)LM_PANEL_ROWS * (size_t)cols) {
        int nr = rows - g * LM_PANEL_ROWS < LM_PANEL_ROWS ? (int)(rows - g * LM_PANEL_ROWS) : LM_PANEL_ROWS;
        for (int64_t k0 = 0; k0 < cols; k0 += 16) {
            int nk = cols - k0 < 16 ? (int)(cols - k0) : 16;
            for (int r = 0; r < nr; r++) {
                uint16_t row[16];
                memcpy(row, src + (size_t)(g * LM_PANEL_ROWS + r) * src_stride + (size_t)k0 * 2, (size_t)nk * 2);
                for (int k = 0; k < nk; k++) o[(size_t)(k0 + k) * LM_PANEL_ROWS + (size_t)r] = row[k];
            }
        }
    }
}

/* Q8_0, Q4_0, Q5_0, Q4_1, Q5_1 and MXFP4: a pure byte shuffle: scales
 * (Q4_1, Q5_1: the 8 rows' d, then their m; MXFP4: the 8 exponent bytes)
 * and the bytes after them (Q5_0, Q5_1: qh, then qs) are copied unchanged,
 * in 4-byte chunks; padding rows are zero (zero scales, or for MXFP4 zero
 * codes, so they add nothing to anything and are never stored). */
void quant_pack(uint32_t type, const void *src, size_t src_stride, int64_t rows, int64_t cols, void *dst) {
    if (type == LM_TYPE_F16) {
        assert(rows >= 0 && cols >= 0);
        pack_f16(src, src_stride, rows, cols, dst);
        return;
    }
    if (type == LM_TYPE_Q4_K) {
        assert(rows >= 0 && cols % QK_K == 0);
        pack_q4_K(src, src_stride, rows, cols, dst);
        return;
    }
    const size_t bb = pack_block_bytes(type);
    assert(bb && cols % 32 == 0 && rows >= 0);
    const int ns = pack_scales(type);
    const size_t sw = pack_scale_bytes(type);
    const size_t head = sw * (size_t)ns * LM_PACK_ROWS; /* the group's scales */
    const size_t qbytes = (bb - head) / LM_PACK_ROWS;   /* quant bytes of one row's block */
    const size_t src_bs = traits[type].type_size;
    const int64_t nb = cols / 32, groups = (rows + LM_PACK_ROWS - 1) / LM_PACK_ROWS;
    uint8_t *o = dst;
    memset(o, 0, quant_pack_size(type, rows, cols));
    for (int64_t g = 0; g < groups; g++) {
        for (int64_t b = 0; b < nb; b++, o += bb) {
            for (int r = 0; r < LM_PACK_ROWS && g * LM_PACK_ROWS + r < rows; r++) {
                const uint8_t *blk =
                    (const uint8_t *)src + (size_t)(g * LM_PACK_ROWS + r) * src_stride + (size_t)b * src_bs;
                for (int s = 0; s < ns; s++) /* the scales */
                    memcpy(o + sw * LM_PACK_ROWS * (size_t)s + sw * (size_t)r, blk + sw * (size_t)s, sw);
                for (size_t k = 0; k < qbytes / 4; k++)
                    memcpy(o + head + 32 * k + 4 * (size_t)r, blk + sw * (size_t)ns + 4 * k, 4);
            }
        }
    }
}

float quant_panel_dot_ref(int64_t n, const void *wp, int r, const float *x) {
    const uint16_t *p = wp;
    const int64_t q = n / LM_PANEL_SEGS;
    float s[LM_PANEL_SEGS];
    for (int j = 0; j < LM_PANEL_SEGS; j++) {
        s[j] = 0.0f;
        for (int64_t k = j * q; k < (j == LM_PANEL_SEGS - 1 ? n : (j + 1) * q); k++)
            s[j] = fmaf(f16(p[(size_t)k * LM_PANEL_ROWS + (size_t)r]), x[k], s[j]);
    }
    return (s[0] + s[1]) + (s[2] + s[3]);
}

size_t quant_packed_act_row_size(int64_t n) {
    return n >= 0 && n % QK8_0 == 0 ? (size_t)(n / QK8_0) * sizeof(block_q8_0s) : 0;
}

/* Q8_0's reference quantizer, block by block, then the scale widened and
 * the sum taken. */
void quant_packed_act_ref(const float *src, void *dst, int64_t n) {
    block_q8_0s *o = dst;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        block_q8_0 b;
        q8_0_from_float(src + i * QK8_0, &b, QK8_0);
        int sum = 0;
        for (int j = 0; j < QK8_0; j++) sum += b.qs[j];
        o[i].d = f16(b.d);
        o[i].s8 = 8 * sum;
        memcpy(o[i].qs, b.qs, QK8_0);
    }
}
