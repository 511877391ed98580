/*
 * neon_tiles.c - the dot products and gemm tiles of the NEON kernels and
 * their Q8_0 attention scores, written once for both variants (contracts in
 * kernels/neon.h and kernels.h).
 *
 * Built once per variant (Makefile, kernels/variant.h): neon (no extra
 * flags: NEON is part of the AArch64 base; NT_DOT 0, names neon_*) and
 * neon_dot (-march=armv8.2-a+dotprod; NT_DOT 1, names neon_dot_*); nothing
 * of the second runs unless cpu_has_neon_dot() said yes (HWCAP_ASIMDDP), so
 * the binary still runs on plain Armv8-A. The two differ only
 * in dot16(), the exact int8 dot product of 16 lanes into four int32
 * partial sums, q4dot (the same with lane j the sum of bytes 4j .. 4j+3,
 * for the Q8_0 attention scores) and NP_DOT (by 4-byte lane, for the
 * packed tiles at the end): sdot with the extension, smull + sadalp (or
 * saddlp + addp) without. Every integer sum is reduced across its lanes
 * (exact) before it meets a float, q4dot's lanes being the same exact sums
 * in both, so both variants return the same bits.
 *
 * Float steps: the 32-element types take blocks four at a time, the four
 * block sums in one int32x4 (lane k: block b + k; a missing block past the
 * row's end is a zero sum with zero scales), acc = fma(float(isum),
 * dw * dx, acc), and Q4_1/Q5_1 accm = fma(float(sum xq), m * dx, accm);
 * the result is the horizontal sum of acc + accm. K-quants: per
 * super-block acc = fma(float(isum), dx * d, acc), then acc = fma(-float(msum),
 * dx * dmin, acc). Float types: groups of 16 elements into four fma
 * accumulators (a tail shorter than 16 zero-padded), summed (a0 + a1) +
 * (a2 + a3) then across lanes.
 *
 * MXFP4 blocks are decoded by a table lookup (tbl) into int8 values
 * -12..12 and take the 32-element path, with the scale 2^(e - 128); the
 * interleaved MXFP4 tiles (at the end) decode them the same way.
 *
 * Integer bounds: a product is at most 128 * 128 = 2^14 (fits the int16 of
 * smull); a 32-element block sum at most 2^19; Q4_K/Q5_K sc * dot <= 63 *
 * 31 * 128 * 32 per sub-block, eight of them: < 2^26; Q6_K |sc| <= 128,
 * sixteen sub-blocks of 16 * 32 * 128: < 2^28. All fit int32.
 */
#include "kernels/variant.h" /* first: the variant's names */

#include "kernels/neon.h"

#if !defined(LM_VARIANT)
#error "neon_tiles.c is built per variant: -DLM_VARIANT=neon or neon_dot (Makefile)"
#endif

#if defined(__aarch64__)

#if defined(__ARM_FEATURE_DOTPROD)
#define NT_DOT 1
#else
#define NT_DOT 0
#endif
#define NT_FN(name) LM_VFN(name)

#include <arm_neon.h>
#include <math.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

/* ---- helpers --------------------------------------------------------------- */

/* acc + the products a[i] * b[i] of 16 int8 lanes, as four int32 partial
 * sums (which lane holds which products differs between the variants; only
 * the total is used). */
INLINE int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if NT_DOT
    return vdotq_s32(acc, a, b);
#else
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
#endif
}

/* The f16 at p as a float (FCVT: exact). */
INLINE float h2f(const void *p) {
    __fp16 h;
    memcpy(&h, p, 2);
    return (float)h;
}

/* The fifth bits of 16 elements of a Q5 block: lane i is 0x10 when bit i
 * of the 16 little-endian bits at qh is set, else 0. */
INLINE uint8x16_t fifth_bits(const uint8_t *qh) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint8x16_t h = vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1]));
    return vandq_u8(vtstq_u8(h, vld1q_u8(bit)), vdupq_n_u8(0x10));
}

/* ---- 32-element types against Q8_0 ------------------------------------------ */

enum { K8_0, K4_0, K5_0, K4_1, K5_1, KMX };

INLINE size_t bsize(int kind) {
    switch (kind) {
        case KMX: return sizeof(block_mxfp4);
        case K8_0: return sizeof(block_q8_0);
        case K4_0: return sizeof(block_q4_0);
        case K5_0: return sizeof(block_q5_0);
        case K4_1: return sizeof(block_q4_1);
        default: return sizeof(block_q5_1);
    }
}

/* The weight block at p as two int8x16 (elements 0..15, 16..31) and its
 * scale d (and m for the affine kinds). */
INLINE void decode32(int kind, const uint8_t *p, int8x16_t *w0, int8x16_t *w1, float *d, float *m) {
    *m = 0.0f;
    if (kind == KMX) { /* MXFP4: codes through a table lookup, scale 2^(e - 128) */
        static const int8_t kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
        const uint32_t e = p[0], bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
        memcpy(d, &bits, 4);
        const uint8x16_t q = vld1q_u8(p + 1), t = vreinterpretq_u8_s8(vld1q_s8(kv));
        *w0 = vreinterpretq_s8_u8(vqtbl1q_u8(t, vandq_u8(q, vdupq_n_u8(0x0F))));
        *w1 = vreinterpretq_s8_u8(vqtbl1q_u8(t, vshrq_n_u8(q, 4)));
        return;
    }
    *d = h2f(p);
    if (kind == K8_0) {
        *w0 = vld1q_s8((const int8_t *)(p + 2));
        *w1 = vld1q_s8((const int8_t *)(p + 18));
        return;
    }
    const uint8_t *qs = p + (kind == K4_0 ? 2 : kind == K5_0 ? 6 : kind == K4_1 ? 4 : 8);
    uint8x16_t q = vld1q_u8(qs);
    uint8x16_t lo = vandq_u8(q, vdupq_n_u8(0x0F)), hi = vshrq_n_u8(q, 4);
    if (kind == K5_0 || kind == K5_1) {
        const uint8_t *qh = p + (kind == K5_0 ? 2 : 4);
        lo = vorrq_u8(lo, fifth_bits(qh));
        hi = vorrq_u8(hi, fifth_bits(qh + 2));
    }
    if (kind == K4_1 || kind == K5_1) *m = h2f(p + 2);
    int off = kind == K4_0 ? 8 : kind == K5_0 ? 16 : 0;
    *w0 = vsubq_s8(vreinterpretq_s8_u8(lo), vdupq_n_s8((int8_t)off));
    *w1 = vsubq_s8(vreinterpretq_s8_u8(hi), vdupq_n_s8((int8_t)off));
}

INLINE float dot32_row(int kind, int64_t n, const void *w, const void *x) {
    const uint8_t *wp = w;
    const block_q8_0 *xb = x;
    const int64_t nb = n / 32;
    const size_t bs = bsize(kind);
    const bool affine = kind == K4_1 || kind == K5_1;
    float32x4_t acc = vdupq_n_f32(0.0f), accm = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b += 4) {
        int32x4_t s[4];
        float sc[4], msc[4];
        int32_t sx[4];
        for (int k = 0; k < 4; k++) {
            s[k] = vdupq_n_s32(0);
            sc[k] = msc[k] = 0.0f;
            sx[k] = 0;
            if (b + k >= nb) continue;
            const block_q8_0 *xk = &xb[b + k];
            int8x16_t w0, w1, x0 = vld1q_s8(xk->qs), x1 = vld1q_s8(xk->qs + 16);
            float d, m;
            decode32(kind, wp + (size_t)(b + k) * bs, &w0, &w1, &d, &m);
            s[k] = dot16(dot16(s[k], w0, x0), w1, x1);
            float dx = h2f(&xk->d);
            sc[k] = d * dx;
            if (affine) {
                msc[k] = m * dx;
                sx[k] = vaddlvq_s8(x0) + vaddlvq_s8(x1);
            }
        }
        int32x4_t isum = vpaddq_s32(vpaddq_s32(s[0], s[1]), vpaddq_s32(s[2], s[3]));
        acc = vfmaq_f32(acc, vcvtq_f32_s32(isum), vld1q_f32(sc));
        if (affine) accm = vfmaq_f32(accm, vcvtq_f32_s32(vld1q_s32(sx)), vld1q_f32(msc));
    }
    return vaddvq_f32(vaddq_f32(acc, accm));
}

float NT_FN(vec_dot_q8_0)(int64_t n, const void *w, const void *x) { return dot32_row(K8_0, n, w, x); }
float NT_FN(vec_dot_q4_0)(int64_t n, const void *w, const void *x) { return dot32_row(K4_0, n, w, x); }
float NT_FN(vec_dot_q5_0)(int64_t n, const void *w, const void *x) { return dot32_row(K5_0, n, w, x); }
float NT_FN(vec_dot_q4_1)(int64_t n, const void *w, const void *x) { return dot32_row(K4_1, n, w, x); }
float NT_FN(vec_dot_q5_1)(int64_t n, const void *w, const void *x) { return dot32_row(K5_1, n, w, x); }
float NT_FN(vec_dot_mxfp4)(int64_t n, const void *w, const void *x) { return dot32_row(KMX, n, w, x); }

/* ---- K-quants against Q8_K ---------------------------------------------------- */

/* The 6-bit scales and mins of the eight sub-blocks (quant.h's packing). */
INLINE void k_scales(const uint8_t *s, int sc[8], int mn[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
    }
    for (int j = 4; j < 8; j++) {
        sc[j] = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        mn[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q4_K (q5 false) and Q5_K: one super-block's sum_j sc_j (q . xq)_j. */
INLINE int32_t k45_isum(bool q5, const uint8_t *qs, const uint8_t *qh, const int8_t *xq, const int sc[8]) {
    int32_t isum = 0;
    uint8x16_t h0 = vdupq_n_u8(0), h1 = h0;
    if (q5) {
        h0 = vld1q_u8(qh);
        h1 = vld1q_u8(qh + 16);
    }
    const uint8x16_t m4 = vdupq_n_u8(0x0F), b4 = vdupq_n_u8(0x10);
    for (int c = 0; c < 4; c++) {
        uint8x16_t q0 = vld1q_u8(qs + 32 * c), q1 = vld1q_u8(qs + 32 * c + 16);
        uint8x16_t l0 = vandq_u8(q0, m4), l1 = vandq_u8(q1, m4);
        uint8x16_t u0 = vshrq_n_u8(q0, 4), u1 = vshrq_n_u8(q1, 4);
        if (q5) {
            uint8x16_t bl = vdupq_n_u8((uint8_t)(1u << (2 * c))), bu = vdupq_n_u8((uint8_t)(1u << (2 * c + 1)));
            l0 = vorrq_u8(l0, vandq_u8(vtstq_u8(h0, bl), b4));
            l1 = vorrq_u8(l1, vandq_u8(vtstq_u8(h1, bl), b4));
            u0 = vorrq_u8(u0, vandq_u8(vtstq_u8(h0, bu), b4));
            u1 = vorrq_u8(u1, vandq_u8(vtstq_u8(h1, bu), b4));
        }
        const int8_t *x = xq + 64 * c;
        int32x4_t z = vdupq_n_s32(0);
        int32x4_t sl = dot16(dot16(z, vreinterpretq_s8_u8(l0), vld1q_s8(x)), vreinterpretq_s8_u8(l1), vld1q_s8(x + 16));
        int32x4_t su =
            dot16(dot16(z, vreinterpretq_s8_u8(u0), vld1q_s8(x + 32)), vreinterpretq_s8_u8(u1), vld1q_s8(x + 48));
        isum += sc[2 * c] * vaddvq_s32(sl) + sc[2 * c + 1] * vaddvq_s32(su);
    }
    return isum;
}

INLINE float k45_row(bool q5, int64_t n, const void *w, const void *x) {
    const block_q8_K *xb = x;
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *scales, *qs, *qh = NULL;
        const uint16_t *dd;
        if (q5) {
            const block_q5_K *b = (const block_q5_K *)w + i;
            dd = &b->d, scales = b->scales, qs = b->qs, qh = b->qh;
        } else {
            const block_q4_K *b = (const block_q4_K *)w + i;
            dd = &b->d, scales = b->scales, qs = b->qs;
        }
        int sc[8], mn[8];
        k_scales(scales, sc, mn);
        int32_t isum = k45_isum(q5, qs, qh, xb[i].qs, sc);
        int32_t msum = 0;
        for (int j = 0; j < 8; j++) msum += mn[j] * (xb[i].bsums[2 * j] + xb[i].bsums[2 * j + 1]);
        float dx = xb[i].d;
        acc = fmaf((float)isum, dx * h2f(dd), acc);
        acc = fmaf(-(float)msum, dx * h2f(dd + 1), acc);
    }
    return acc;
}

float NT_FN(vec_dot_q4_K)(int64_t n, const void *w, const void *x) { return k45_row(false, n, w, x); }
float NT_FN(vec_dot_q5_K)(int64_t n, const void *w, const void *x) { return k45_row(true, n, w, x); }

float NT_FN(vec_dot_q6_K)(int64_t n, const void *w, const void *x) {
    const block_q6_K *wb = w;
    const block_q8_K *xb = x;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m3 = vdupq_n_u8(3);
    const int8x16_t off = vdupq_n_s8(32);
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const block_q6_K *b = &wb[i];
        int32_t isum = 0;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
            uint8x16_t qh0 = vld1q_u8(qh), qh1 = vld1q_u8(qh + 16);
            for (int k = 0; k < 4; k++) {
                uint8x16_t lo0 = vld1q_u8(ql + 32 * (k & 1)), lo1 = vld1q_u8(ql + 32 * (k & 1) + 16);
                if (k < 2) {
                    lo0 = vandq_u8(lo0, m4);
                    lo1 = vandq_u8(lo1, m4);
                } else {
                    lo0 = vshrq_n_u8(lo0, 4);
                    lo1 = vshrq_n_u8(lo1, 4);
                }
                int8x16_t sh = vdupq_n_s8((int8_t)(-2 * k)); /* right shift by 2k */
                uint8x16_t hi0 = vandq_u8(vshlq_u8(qh0, sh), m3), hi1 = vandq_u8(vshlq_u8(qh1, sh), m3);
                int8x16_t q0 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo0, vshlq_n_u8(hi0, 4))), off);
                int8x16_t q1 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo1, vshlq_n_u8(hi1, 4))), off);
                const int8_t *xq = xb[i].qs + 128 * h + 32 * k;
                int32x4_t z = vdupq_n_s32(0);
                int j = 8 * h + 2 * k;
                isum += b->scales[j] * vaddvq_s32(dot16(z, q0, vld1q_s8(xq))) +
                    b->scales[j + 1] * vaddvq_s32(dot16(z, q1, vld1q_s8(xq + 16)));
            }
        }
        acc = fmaf((float)isum, xb[i].d * h2f(&b->d), acc);
    }
    return acc;
}

/* ---- F32, F16, BF16 --------------------------------------------------------- */

enum { KF32, KF16, KBF16 };

/* Four floats from element 0 at p of a kind (exact conversions). */
INLINE float32x4_t fload4(int kind, const uint8_t *p) {
    if (kind == KF32) return vld1q_f32((const float *)(const void *)p);
    if (kind == KF16) return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(const void *)p)));
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)(const void *)p), 16));
}

/* 16 elements of w (kind) against 16 of x (xkind) into a[0..3]. */
INLINE void fstep16(int kind, int xkind, const uint8_t *w, const uint8_t *x, float32x4_t a[4]) {
    size_t we = kind == KF32 ? 4 : 2, xe = xkind == KF32 ? 4 : 2;
    for (int k = 0; k < 4; k++) a[k] = vfmaq_f32(a[k], fload4(kind, w + 4 * k * we), fload4(xkind, x + 4 * k * xe));
}

INLINE float float_row(int kind, int64_t n, const void *w, const void *x) {
    const int xkind = kind == KF16 ? KF16 : KF32;
    const size_t we = kind == KF32 ? 4 : 2, xe = xkind == KF32 ? 4 : 2;
    const uint8_t *wp = w, *xp = x;
    float32x4_t a[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) fstep16(kind, xkind, wp + (size_t)i * we, xp + (size_t)i * xe, a);
    if (i < n) {
        uint8_t wt[64] = {0}, xt[64] = {0};
        memcpy(wt, wp + (size_t)i * we, (size_t)(n - i) * we);
        memcpy(xt, xp + (size_t)i * xe, (size_t)(n - i) * xe);
        fstep16(kind, xkind, wt, xt, a);
    }
    return vaddvq_f32(vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3])));
}

float NT_FN(vec_dot_f32)(int64_t n, const void *w, const void *x) { return float_row(KF32, n, w, x); }
float NT_FN(vec_dot_f16)(int64_t n, const void *w, const void *x) { return float_row(KF16, n, w, x); }
float NT_FN(vec_dot_bf16)(int64_t n, const void *w, const void *x) { return float_row(KBF16, n, w, x); }

/* ---- gemm tiles: each output is vec_dot's, so bit for bit the same ------------ */

#define NT_GEMM(T)                                                                                                     \
    void NT_FN(gemm_##T)(int64_t n, const void *w, size_t w_stride, int nr, const void *x, size_t x_stride, int nc,    \
                         float *y, size_t y_stride) {                                                                  \
        for (int c = 0; c < nc; c++)                                                                                   \
            for (int r = 0; r < nr; r++)                                                                               \
                y[(size_t)c * y_stride + r] = NT_FN(vec_dot_##T)(n, (const uint8_t *)w + (size_t)r * w_stride,         \
                                                                 (const uint8_t *)x + (size_t)c * x_stride);           \
    }
NT_GEMM(f32)
NT_GEMM(f16)
NT_GEMM(bf16)
NT_GEMM(q8_0)
NT_GEMM(q4_0)
NT_GEMM(q5_0)
NT_GEMM(q4_1)
NT_GEMM(q5_1)
NT_GEMM(mxfp4)
NT_GEMM(q4_K)
NT_GEMM(q5_K)
NT_GEMM(q6_K)
#undef NT_GEMM

/* ---- Q8_0 attention scores by integer dot products ----------------------------- */

/* kernels.h's scores_q8_0_q8 (the scalar reference's bits). A block's
 * integer lanes, lane j the exact sum of q_e k_e over elements 4j .. 4j+3:
 * q4dot of bytes 0..15 gives lanes 0-3, of bytes 16..31 lanes 4-7 (sdot;
 * without it smull, saddlp into int32 pairs and addp of the pairs, each
 * step exact: |lane| <= 4 * 2^14). The float part is the reference's: one
 * pair of accumulators (lanes 0-3, 4-7) per (row, key), each lane gaining
 * fma(dq * dk, (float)i_j, .) block after block (dq * dk, two F16 scales,
 * exact), then faddp twice gives ((l0 + l1) + (l2 + l3)) + ((l4 + l5) +
 * (l6 + l7)), and a third faddp packs four keys' scores. A tile is C rows x
 * K keys with C x K <= 4: 8 accumulators, which stay in registers beside
 * the blocks and the integer steps (at 12 or 16 GCC keeps some on the
 * stack). 4 rows x 1 key while 4 rows remain, so each key block is loaded
 * once per 4 rows (the query's from L1 again per key); then 3 x 1, 2 x 2 or
 * 1 x 4. The last keys are padded with the last one and the extra scores
 * dropped. */
INLINE int32x4_t q4dot(int8x16_t a, int8x16_t b) {
#if NT_DOT
    return vdotq_s32(vdupq_n_s32(0), a, b);
#else
    const int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpaddq_s32(lo, vpaddlq_s16(vmull_high_s8(a, b)));
#endif
}

/* Rows [0, C) of Qq (nb blocks apart) against keys k[0 .. K): s[c][0 .. K). */
INLINE void q8q_tile(const block_q8_0 *Qq, int nb, const void *const *k, int C, int K, float s[4][4]) {
    float32x4_t lo[4][4], hi[4][4];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++)
#pragma GCC unroll 4
        for (int t = 0; t < K; t++) lo[c][t] = hi[c][t] = vdupq_n_f32(0.0f);
    for (int b = 0; b < nb; b++) {
        int8x16_t k0[4], k1[4];
        float dk[4];
#pragma GCC unroll 4
        for (int t = 0; t < K; t++) {
            const block_q8_0 *kb = (const block_q8_0 *)k[t] + b;
            k0[t] = vld1q_s8(kb->qs);
            k1[t] = vld1q_s8(kb->qs + 16);
            dk[t] = h2f(&kb->d);
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const block_q8_0 *qb = Qq + (size_t)c * nb + b;
            const int8x16_t q0 = vld1q_s8(qb->qs), q1 = vld1q_s8(qb->qs + 16);
            const float dq = h2f(&qb->d);
#pragma GCC unroll 4
            for (int t = 0; t < K; t++) {
                const float32x4_t d = vdupq_n_f32(dq * dk[t]); /* exact */
                lo[c][t] = vfmaq_f32(lo[c][t], d, vcvtq_f32_s32(q4dot(q0, k0[t])));
                hi[c][t] = vfmaq_f32(hi[c][t], d, vcvtq_f32_s32(q4dot(q1, k1[t])));
            }
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        float32x4_t p[4]; /* key t: (l0 + l1, l2 + l3, l4 + l5, l6 + l7) */
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) p[t] = t < K ? vpaddq_f32(lo[c][t], hi[c][t]) : p[0];
        vst1q_f32(s[c], vpaddq_f32(vpaddq_f32(p[0], p[1]), vpaddq_f32(p[2], p[3])));
    }
}

/* Rows [0, C) against every key, K at a time. */
INLINE void q8q_rows(const block_q8_0 *Qq, int nb, const void *const *krow, int nk, float *S, int s_stride, int C,
                     int K) {
    for (int t = 0; t < nk; t += K) {
        const int n = nk - t < K ? nk - t : K;
        const void *k[4];
        for (int j = 0; j < K; j++) k[j] = krow[t + (j < n ? j : n - 1)];
        float s[4][4];
        q8q_tile(Qq, nb, k, C, K, s);
        for (int c = 0; c < C; c++)
            for (int j = 0; j < n; j++) S[(size_t)c * s_stride + t + j] = s[c][j];
    }
}

void NT_FN(attn_scores_q8_0_q8)(const void *Qq, int R, int hd, const void *const *krow, int nk, float *S, int s_stride,
                                const void *const *pf, int npf) {
    (void)pf, (void)npf; /* no prefetch on NEON (kernels.h: a hint) */
    const block_q8_0 *Q = Qq;
    const int nb = hd / QK8_0;
    int r = 0;
    for (; r + 4 <= R; r += 4) q8q_rows(Q + (size_t)r * nb, nb, krow, nk, S + (size_t)r * s_stride, s_stride, 4, 1);
    const block_q8_0 *q = Q + (size_t)r * nb;
    float *s = S + (size_t)r * s_stride;
    switch (R - r) {
        case 3: q8q_rows(q, nb, krow, nk, s, s_stride, 3, 1); break;
        case 2: q8q_rows(q, nb, krow, nk, s, s_stride, 2, 2); break;
        case 1: q8q_rows(q, nb, krow, nk, s, s_stride, 1, 4); break;
        default: break;
    }
}

/* ---- interleaved (packed) Q8_0, Q4_0 and MXFP4 tiles ------------------------- */

/* The layout is quant.h's (groups of LM_PACK_ROWS = 8 rows, block column
 * after block column): 32 bytes of a block column hold four consecutive
 * quants of each of the 8 rows, row r in bytes 4r..4r+3, so one 16-byte
 * NEON vector holds four rows ("a quad": rows 0-3, then rows 4-7) with one
 * row per 32-bit lane, and a 4-byte group of the token's quants meets all
 * four at once. Activations are block_q8_0s rows (quant.h: Q8_0's quants,
 * the scale widened to f32, 8 * the sum of the quants).
 *
 * Per (row, token) and block column: the exact int32 dot of the row's 32
 * quants with the token's (sdot by lane with the extension; smull of each
 * lane's four bytes against the group broadcast, pairwise adds into int32
 * without it: every step exact, so both variants give the same integers),
 * Q4_0's nibbles taken unsigned (0..15) and 8 * sum(x) = s8 subtracted,
 * MXFP4's codes through the E2M1 table (tbl: int8 values -12..12, as
 * decode32); then acc = fma(float(isum), dw * dx, acc), dw the row's scale
 * (f16 widened; MXFP4: 2^(e - 128) as a float, built from the exponent
 * byte's bits as the scalar reference does) and dx the token's. Each
 * output has its own accumulator lane, starts from zero and takes the
 * blocks in order, so tiles of any width and any position of a token in
 * its tile give the same bits. Integer bounds: |isum| < 2^20. */
#define NP_P4_BYTES 144  /* d[8], qs[128] */
#define NP_P8_BYTES 272  /* d[8], qs[256] */
#define NP_PMX_BYTES 136 /* e[8], qs[128] */
#define NP_QS 16
#define NP_QS_MX 8

/* The 4-byte group `lane` of x in every lane. */
#define NP_BCAST(x, lane) vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(x), lane))

#if NT_DOT
#define NP_DOT(a, b, w, x, lane) (a) = vdotq_laneq_s32((a), (w), (x), lane)
#else
/* a: lanes (row 0, row 0, row 1, row 1), b: (row 2, row 2, row 3, row 3),
 * each a partial sum of the row's products */
#define NP_DOT(a, b, w, x, lane)                                                                                       \
    do {                                                                                                               \
        int8x16_t xb_ = NP_BCAST(x, lane);                                                                             \
        (a) = vpadalq_s16((a), vmull_s8(vget_low_s8(w), vget_low_s8(xb_)));                                            \
        (b) = vpadalq_s16((b), vmull_high_s8((w), xb_));                                                               \
    } while (0)
#endif

/* The int32 dots of one quad's four rows with one token: w[k] holds the
 * quad's quants 4k..4k+3 (k < 8); x0, x1 the token's quants 0..15, 16..31. */
INLINE int32x4_t np_quad_dot(const int8x16_t w[8], int8x16_t x0, int8x16_t x1) {
    int32x4_t a = vdupq_n_s32(0), b = vdupq_n_s32(0);
    NP_DOT(a, b, w[0], x0, 0);
    NP_DOT(a, b, w[1], x0, 1);
    NP_DOT(a, b, w[2], x0, 2);
    NP_DOT(a, b, w[3], x0, 3);
    NP_DOT(a, b, w[4], x1, 0);
    NP_DOT(a, b, w[5], x1, 1);
    NP_DOT(a, b, w[6], x1, 2);
    NP_DOT(a, b, w[7], x1, 3);
#if NT_DOT
    (void)b;
    return a;
#else
    return vpaddq_s32(a, b);
#endif
}

/* Rows [0, nr) of a group's two quads lo (rows 0-3) and hi (4-7) to y. */
INLINE void np_store(float *y, int nr, float32x4_t lo, float32x4_t hi) {
    if (nr == LM_PACK_ROWS) {
        vst1q_f32(y, lo);
        vst1q_f32(y + 4, hi);
        return;
    }
    float t[8];
    vst1q_f32(t, lo);
    vst1q_f32(t + 4, hi);
    for (int r = 0; r < nr; r++) y[r] = t[r];
}

/* The eight rows' scales of an MXFP4x8 block column, 2^(e_r - 128) as
 * floats (rows 0-3 in lo, 4-7 in hi): exponent bits (e - 1) << 23 for e >= 2,
 * the subnormals 2^21 << e (bits) for e = 0 and 1, as the scalar reference. */
INLINE void np_e8m0(const uint8_t *e8, float32x4_t *lo, float32x4_t *hi) {
    const uint16x8_t e16 = vmovl_u8(vld1_u8(e8));
    const uint32x4_t e[2] = {vmovl_u16(vget_low_u16(e16)), vmovl_high_u16(e16)};
    uint32x4_t bits[2];
    for (int h = 0; h < 2; h++) {
        const uint32x4_t norm = vshlq_n_u32(vsubq_u32(e[h], vdupq_n_u32(1)), 23);
        const uint32x4_t sub = vshlq_u32(vdupq_n_u32(0x00200000u), vreinterpretq_s32_u32(e[h]));
        bits[h] = vbslq_u32(vcltq_u32(e[h], vdupq_n_u32(2)), sub, norm);
    }
    *lo = vreinterpretq_f32_u32(bits[0]);
    *hi = vreinterpretq_f32_u32(bits[1]);
}

/* One group of 8 rows of a kind (NP_Q8: Q8_0, NP_Q4: Q4_0, NP_MX: MXFP4)
 * by C tokens. */
enum { NP_Q8, NP_Q4, NP_MX };
INLINE void np_tile(int kind, int64_t nb, const uint8_t *w, int nr, const uint8_t *x, size_t xs, int C, float *y,
                    size_t ys) {
    const size_t bytes = kind == NP_MX ? NP_PMX_BYTES : kind == NP_Q4 ? NP_P4_BYTES : NP_P8_BYTES;
    static const int8_t kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}; /* E2M1, doubled */
    const int8x16_t tbl = vld1q_s8(kv);
    float32x4_t acc[NEON_PACK_TILE][2];
    for (int c = 0; c < C; c++) acc[c][0] = acc[c][1] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++, w += bytes) {
        float32x4_t dw0, dw1;
        if (kind == NP_MX) {
            np_e8m0(w, &dw0, &dw1);
        } else {
            dw0 = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(const void *)w)));
            dw1 = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(const void *)w + 4)));
        }
        int8x16_t q[2][8]; /* [quad][k]: quants 4k..4k+3 of the quad's rows */
        const uint8_t *qs = w + (kind == NP_MX ? NP_QS_MX : NP_QS);
        for (int h = 0; h < 2; h++) {
            if (kind == NP_Q4) {
                for (int k = 0; k < 4; k++) {
                    uint8x16_t v = vld1q_u8(qs + 32 * k + 16 * h);
                    q[h][k] = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F)));
                    q[h][k + 4] = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
                }
            } else if (kind == NP_MX) {
                for (int k = 0; k < 4; k++) {
                    uint8x16_t v = vld1q_u8(qs + 32 * k + 16 * h);
                    q[h][k] = vqtbl1q_s8(tbl, vandq_u8(v, vdupq_n_u8(0x0F)));
                    q[h][k + 4] = vqtbl1q_s8(tbl, vshrq_n_u8(v, 4));
                }
            } else {
                for (int k = 0; k < 8; k++) q[h][k] = vld1q_s8((const int8_t *)(qs + 32 * k + 16 * h));
            }
        }
        for (int c = 0; c < C; c++) {
            const uint8_t *xb = x + (size_t)c * xs + (size_t)b * sizeof(block_q8_0s);
            const block_q8_0s *xq = (const block_q8_0s *)(const void *)xb;
            const int8x16_t x0 = vld1q_s8(xq->qs), x1 = vld1q_s8(xq->qs + 16);
            int32x4_t s0 = np_quad_dot(q[0], x0, x1), s1 = np_quad_dot(q[1], x0, x1);
            if (kind == NP_Q4) {
                s0 = vsubq_s32(s0, vdupq_n_s32(xq->s8));
                s1 = vsubq_s32(s1, vdupq_n_s32(xq->s8));
            }
            acc[c][0] = vfmaq_f32(acc[c][0], vcvtq_f32_s32(s0), vmulq_n_f32(dw0, xq->d));
            acc[c][1] = vfmaq_f32(acc[c][1], vcvtq_f32_s32(s1), vmulq_n_f32(dw1, xq->d));
        }
    }
    for (int c = 0; c < C; c++) np_store(y + (size_t)c * ys, nr, acc[c][0], acc[c][1]);
}

/* One specialisation per tile width, so the token loop unrolls. */
#define NP_GEMM(T, KIND)                                                                                               \
    void NT_FN(packed_gemm_##T)(int64_t n, const void *wp, int nr, const void *x, size_t xs, int nc, float *y,         \
                                size_t ys) {                                                                           \
        switch (nc) {                                                                                                  \
            case 1: np_tile(KIND, n / 32, wp, nr, x, xs, 1, y, ys); break;                                             \
            case 2: np_tile(KIND, n / 32, wp, nr, x, xs, 2, y, ys); break;                                             \
            case 3: np_tile(KIND, n / 32, wp, nr, x, xs, 3, y, ys); break;                                             \
            case 4: np_tile(KIND, n / 32, wp, nr, x, xs, 4, y, ys); break;                                             \
            default: break;                                                                                            \
        }                                                                                                              \
    }
_Static_assert(NEON_PACK_TILE == 4, "NP_GEMM's cases assume 4");
NP_GEMM(q4_0, NP_Q4)
NP_GEMM(q8_0, NP_Q8)
NP_GEMM(mxfp4, NP_MX)
#undef NP_GEMM
#undef NP_DOT
#undef NP_BCAST

#endif
