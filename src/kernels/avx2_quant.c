/*
 * avx2_quant.c - AVX2 + FMA + F16C dot products, gemm tiles, activation
 * quantizers and the KV types' conversions to float for the types in
 * quant.h. Compiled with -mavx2 -mfma -mf16c; nothing here runs unless
 * cpu_has_avx2() said yes.
 *
 * One code path per type. Each type has a tile function, always inlined,
 * that computes R x C outputs (R weight rows, C activation rows, both
 * compile-time constants after inlining); vec_dot is that function with
 * R = C = 1 and gemm dispatches to the specialisations. For every (row,
 * column) a tile performs the same float operations in the same order on
 * the same values, with its own accumulators, whatever the tile size, so
 * gemm outputs are bit-identical to vec_dot. Integer work is exact, so how
 * it is organised is free; the float steps are fixed as follows.
 *
 *  - F32, F16, BF16: one accumulator per output, acc = fma(wk, xk, acc)
 *    for the vectors of 8 of the row in order, from zero. A short tail is
 *    zero-padded to a full group of 32 (zero products leave the sums
 *    unchanged). One accumulator keeps a tile's outputs in registers; the
 *    FMA latency is covered by running several outputs of a tile together
 *    (all rows of the tile when there is one column, as in decode).
 *  - Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, MXFP4: per block b of 32, the exact integer dot
 *    as eight int32 partial sums s_b (pmaddubsw + pmaddwd); then
 *    acc[b % 2] = fma(float(s_b), dw_b * dx_b, acc[b % 2]), the scale
 *    product formed in float for eight blocks at a time. Q4_1/Q5_1 add
 *    their m term per group of eight blocks, lane b of a third accumulator:
 *    fma(m_b, float(sum x_b) * dx_b, .). A last partial group of eight is
 *    copied into zeroed blocks (zero scales, zero sums).
 *  - Q4_K, Q5_K, Q6_K: per super-block of 256 the sub-block scales are
 *    applied in int32 (pmaddwd against the scale), giving exact partial
 *    sums SI (and for Q4_K/Q5_K the min term MV from bsums); then
 *    acc = fma(float(SI), dx * d, acc) and acc = acc - float(MV) * (dx * dmin)
 *    (one fnmadd).
 * Every output ends with the same horizontal sum of its 8 lanes (of
 * acc[0] + acc[1] for the 32-element types, (acc[0] + acc[1]) + acc[2]
 * for Q4_1/Q5_1).
 *
 * Integer bounds (so no pmaddubsw saturation and no int32 overflow):
 * Q8_0 |w| <= 128 (abs of -128 read unsigned), |x| <= 127: pairs <= 32512.
 * Q4_0 q <= 15: q*x pairs <= 3810, minus 8*x pairs: |.| <= 2032.
 * MXFP4 |w| <= 12 (a table lookup by pshufb; the sign moved onto x):
 * pairs <= 3048. Its scale 2^(e-128) times dx is exact (but for underflow).
 * Q4_K/Q5_K q <= 31, |x| <= 128: pairs <= 7936, times a scale <= 63, eight
 * sub-blocks: < 2^23. Q6_K q <= 63: pairs <= 16128, scales |s| <= 128,
 * eight chunks: < 2^26, minus the -32 correction, at most 2^24. Sums above
 * 2^24 round when converted to float, identically in every path.
 *
 * The VNNI variants (kernels/variant.h) form the same integer sums
 * with vpdpbusd: Q8_0 blocks directly; the K-quants per 32-byte chunk
 * (four products per lane, at most 4 * 63 * 128 = 32256, so an int16
 * holds it) and then vpdpwssd against the scale in the lane's low int16,
 * which replaces pmaddubsw, pmaddwd and the add by two instructions. The
 * lane sums are the AVX2 path's, so every float result is too.
 */
#include "kernels/variant.h" /* first: the variant's names (built once per variant, Makefile) */

#include "kernels/avx2.h"

#if LM_VARIANT_ON

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "avx2_quant.c must be compiled with -mavx2 -mfma -mf16c"
#endif

#include <assert.h>
#include <immintrin.h>
#include <string.h>

#include "base/util.h"

/* The avx512vnni variant's Q6_K gemm: two rows per 512-bit vector,
 * the same bits as the tile below (kernels/x86_wide.h). */
#if defined(LM_VARIANT) && defined(__AVX512VNNI__)
#include "kernels/x86_wide.h"
#define Q6K_GEMM avx512vnni_wide_gemm_q6_K
#else
#define Q6K_GEMM avx2_gemm_q6_K
#endif

#define INLINE static inline __attribute__((always_inline))

/* ---- small helpers ------------------------------------------------------ */

INLINE uint16_t ld16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

INLINE float ldf(const uint8_t *p) {
    float v;
    memcpy(&v, p, sizeof v);
    return v;
}

INLINE __m256i ld256(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* Sum of the 8 lanes in one fixed order: halves, then pairs, then the two. */
INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Weight rows are streamed from memory once per token in decode. The
 * hardware prefetchers alone left single-row dot products well short of
 * the memory bandwidth, so each kernel also prefetches the weight bytes it
 * will read PREFETCH_AHEAD bytes later (possibly past the row: prefetches
 * never fault and the next row is usually read next). */
#define PREFETCH_AHEAD 4096

/* Prefetch the cache lines of [p, p + bytes) + PREFETCH_AHEAD; consecutive
 * calls for consecutive ranges leave no line out. The address is formed as
 * an integer: it may lie outside any object, where pointer arithmetic would
 * be undefined. */
INLINE void prefetch_ahead(const uint8_t *p, size_t bytes) {
    uintptr_t a = (uintptr_t)p + PREFETCH_AHEAD;
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)(a + o), _MM_HINT_T0);
    _mm_prefetch((const char *)(a + bytes - 1), _MM_HINT_T0);
}

/* Eight int32x8 vectors -> one vector whose lane b is the sum of s[b]'s
 * lanes (exact). The hadd steps give partial sums per 128-bit half; the
 * final cross-half add completes them. */
INLINE __m256i tree8(const __m256i s[8]) {
    __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* The f16 scales at offset 0 of eight consecutive blocks (bs bytes apart),
 * as floats. */
INLINE __m256 scales8(const uint8_t *p, size_t bs) {
    __m128i h = _mm_setr_epi16((short)ld16(p), (short)ld16(p + bs), (short)ld16(p + 2 * bs), (short)ld16(p + 3 * bs),
                               (short)ld16(p + 4 * bs), (short)ld16(p + 5 * bs), (short)ld16(p + 6 * bs),
                               (short)ld16(p + 7 * bs));
    return _mm256_cvtph_ps(h);
}

/* Tile specialisations: CASES(K) expands K(nr, nc) for the shapes with
 * nc >= 2. With one activation row the quantized gemms run the weight rows
 * one after another instead: interleaving several rows' streams measured
 * slower when the weights come from memory (decode), and one column has
 * nothing to share between rows but its scales. */
#define CASES(K) K(1, 2) K(1, 3) K(1, 4) K(2, 2) K(2, 3) K(2, 4) K(3, 2) K(3, 3) K(3, 4) K(4, 2) K(4, 3) K(4, 4)

/* ---- F32, F16, BF16 ------------------------------------------------------- */

enum { KF32, KF16, KBF16 };

INLINE size_t fsize(int kind) { return kind == KF32 ? 4 : 2; }

/* The activations' format for weights of a kind: F16 weights take F16
 * activations (half the bytes to stream in prefill), the others F32. */
INLINE int xkind(int kind) { return kind == KF16 ? KF16 : KF32; }

/* Weight elements [0, 8) at p as floats (exact conversions). */
INLINE __m256 wload8(int kind, const uint8_t *p) {
    if (kind == KF32) return _mm256_loadu_ps((const float *)(const void *)p);
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
    if (kind == KF16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Elements are taken in groups of 32 (four vectors of 8); each output
 * (row, column) has ONE accumulator, acc = fma(w_k, x_k, acc) for the
 * vectors k of the row in order, starting from zero, summed across its
 * lanes at the end. Every kernel below keeps that order, so a tile's
 * outputs are bit-identical to vec_dot whatever its shape. */

/* Groups [0, ng) of R weight rows (ws bytes apart) against one column,
 * into acc[r]. */
INLINE void float_block(int kind, int64_t ng, const uint8_t *w, size_t ws, int R, const uint8_t *x, __m256 acc[4]) {
    const size_t es = fsize(kind), xes = fsize(xkind(kind));
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *wg = w + (size_t)g * 32 * es;
        const uint8_t *xg = x + (size_t)g * 32 * xes;
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) prefetch_ahead(wg + (size_t)r * ws, 32 * es);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __m256 xv = wload8(xkind(kind), xg + (size_t)k * 8 * xes);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r] = _mm256_fmadd_ps(wload8(kind, wg + (size_t)r * ws + (size_t)k * 8 * es), xv, acc[r]);
        }
    }
}

/* float_block with R = 1..4 a constant after inlining (fully unrolled). */
INLINE void float_rows(int kind, int64_t ng, const uint8_t *w, size_t ws, int R, const uint8_t *x, __m256 acc[4]) {
    switch (R) {
        case 1: float_block(kind, ng, w, ws, 1, x, acc); break;
        case 2: float_block(kind, ng, w, ws, 2, x, acc); break;
        case 3: float_block(kind, ng, w, ws, 3, x, acc); break;
        default: float_block(kind, ng, w, ws, 4, x, acc); break;
    }
}

/* One step of 8 elements for R <= 4 rows by C <= 3 columns: C activation
 * vectors loaded, each weight vector loaded (and converted) once for C
 * FMAs. */
INLINE void float_step(int kind, const uint8_t *w, size_t ws, int R, const uint8_t *x, size_t xs, int C,
                       __m256 acc[4][3]) {
    __m256 xv[3];
#pragma GCC unroll 3
    for (int c = 0; c < C; c++) xv[c] = wload8(xkind(kind), x + (size_t)c * xs);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        __m256 wv = wload8(kind, w + (size_t)r * ws);
#pragma GCC unroll 3
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
    }
}

/* Several columns (prefill): R <= 4 rows by C <= 3 columns over the whole
 * row. The 12 accumulators, 3 activation vectors and one weight vector fill
 * the 16 registers, and nothing goes back to memory until the end; the
 * caller runs one tile's rows against many tiles of tokens in a row, so the
 * rows stay in L1 while the activations stream. */
INLINE void float_panel(int kind, int64_t n, const uint8_t *w, size_t ws, int R, const uint8_t *x, size_t xs, int C,
                        float *y, size_t ys) {
    const size_t es = fsize(kind), xes = fsize(xkind(kind));
    __m256 acc[4][3];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 3
        for (int c = 0; c < 3; c++) acc[r][c] = _mm256_setzero_ps();
    const int64_t nf = n / 32 * 32;
    for (int64_t i = 0; i < nf; i += 8) float_step(kind, w + (size_t)i * es, ws, R, x + (size_t)i * xes, xs, C, acc);
    if (nf < n) { /* zero-padded last group, as in float_tile */
        _Alignas(32) uint8_t wpad[4][128];
        _Alignas(32) uint8_t xpad[3][128];
        memset(wpad, 0, sizeof wpad);
        memset(xpad, 0, sizeof xpad);
        size_t left = (size_t)(n - nf);
        for (int r = 0; r < R; r++) memcpy(wpad[r], w + (size_t)r * ws + (size_t)nf * es, left * es);
        for (int c = 0; c < C; c++) memcpy(xpad[c], x + (size_t)c * xs + (size_t)nf * xes, left * xes);
        for (int i = 0; i < 32; i += 8)
            float_step(kind, wpad[0] + (size_t)i * es, sizeof wpad[0], R, xpad[0] + (size_t)i * xes, sizeof xpad[0], C,
                       acc);
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[(size_t)c * ys + (size_t)r] = hsum8(acc[r][c]);
}

/* One column (decode, and vec_dot): all R <= 4 rows of the tile run
 * together, R independent chains to cover the FMA latency while weights
 * stream. */
INLINE void float_tile(int kind, int64_t n, const uint8_t *w, size_t ws, int R, const uint8_t *x, float *y) {
    const size_t es = fsize(kind), xes = fsize(xkind(kind));
    __m256 acc[4];
    for (int r = 0; r < 4; r++) acc[r] = _mm256_setzero_ps();
    const int64_t nf = n / 32 * 32;
    if (nf > 0) float_rows(kind, nf / 32, w, ws, R, x, acc);
    if (nf < n) { /* zero-padded last group */
        _Alignas(32) uint8_t wpad[4][128];
        _Alignas(32) uint8_t xpad[128];
        memset(wpad, 0, sizeof wpad);
        memset(xpad, 0, sizeof xpad);
        size_t left = (size_t)(n - nf);
        for (int r = 0; r < R; r++) memcpy(wpad[r], w + (size_t)r * ws + (size_t)nf * es, left * es);
        memcpy(xpad, x + (size_t)nf * xes, left * xes);
        float_rows(kind, 1, wpad[0], sizeof wpad[0], R, xpad, acc);
    }
    for (int r = 0; r < R; r++) y[r] = hsum8(acc[r]);
}

INLINE void float_gemm(int kind, int64_t n, const void *w, size_t ws, int nr, const void *x, size_t xs, int nc,
                       float *y, size_t ys) {
    assert(nr >= 0 && nr <= LM_GEMM_TILE && nc >= 0 && nc <= LM_GEMM_TILE && n >= 0);
    const uint8_t *wb = (const uint8_t *)w, *xb = (const uint8_t *)x;
    if (nc == 4) { /* two tiles of two columns */
        float_gemm(kind, n, w, ws, nr, x, xs, 2, y, ys);
        float_gemm(kind, n, w, ws, nr, xb + 2 * xs, xs, 2, y + 2 * ys, ys);
        return;
    }
#define FT(R, C)                                                                                                       \
    case R * 8 + C:                                                                                                    \
        float_panel(kind, n, wb, ws, R, xb, xs, C, y, ys);                                                             \
        break;
#define F1(R)                                                                                                          \
    case R * 8 + 1: float_tile(kind, n, wb, ws, R, xb, y); break;
    switch (nr * 8 + nc) {
        F1(1) F1(2) F1(3) F1(4) FT(1, 2) FT(1, 3) FT(2, 2) FT(2, 3) FT(3, 2) FT(3, 3) FT(4, 2) FT(4, 3) default : break;
    }
#undef F1
#undef FT
}

float avx2_vec_dot_f32(int64_t n, const void *w, const void *x) {
    float y;
    float_tile(KF32, n, w, 0, 1, x, &y);
    return y;
}

float avx2_vec_dot_f16(int64_t n, const void *w, const void *x) {
    float y;
    float_tile(KF16, n, w, 0, 1, x, &y);
    return y;
}

float avx2_vec_dot_bf16(int64_t n, const void *w, const void *x) {
    float y;
    float_tile(KBF16, n, w, 0, 1, x, &y);
    return y;
}

void avx2_gemm_f32(int64_t n, const void *w, size_t ws, int nr, const void *x, size_t xs, int nc, float *y, size_t ys) {
    float_gemm(KF32, n, w, ws, nr, x, xs, nc, y, ys);
}

void avx2_gemm_f16(int64_t n, const void *w, size_t ws, int nr, const void *x, size_t xs, int nc, float *y, size_t ys) {
    float_gemm(KF16, n, w, ws, nr, x, xs, nc, y, ys);
}

void avx2_gemm_bf16(int64_t n, const void *w, size_t ws, int nr, const void *x, size_t xs, int nc, float *y,
                    size_t ys) {
    float_gemm(KBF16, n, w, ws, nr, x, xs, nc, y, ys);
}

/* ---- Q8_0 and Q4_0 weights against Q8_0 activations ----------------------- */

enum { KQ8_0, KQ4_0, KQ5_0, KQ4_1, KQ5_1, KMXFP4 };

INLINE size_t q32_block_size(int kind) {
    return kind == KQ4_0 ? sizeof(block_q4_0)
        : kind == KQ5_0  ? sizeof(block_q5_0)
        : kind == KQ4_1  ? sizeof(block_q4_1)
        : kind == KQ5_1  ? sizeof(block_q5_1)
        : kind == KMXFP4 ? sizeof(block_mxfp4)
                         : sizeof(block_q8_0);
}

/* Bytes before the quant data of a block: an f16 d, or MXFP4's exponent. */
INLINE size_t q32_head(int kind) { return kind == KMXFP4 ? 1 : 2; }

/* MXFP4: the scales 2^(e - 128) of eight consecutive blocks (bs bytes
 * apart), exactly quant_e8m0_half's: the exponent field e - 1, or for
 * e < 2 the subnormals 2^-128 and 2^-127. */
INLINE __m256 e8m0_scales8(const uint8_t *p, size_t bs) {
    __m256i e = _mm256_setr_epi32(p[0], p[bs], p[2 * bs], p[3 * bs], p[4 * bs], p[5 * bs], p[6 * bs], p[7 * bs]);
    __m256i norm = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(norm, sub, small));
}

/* The weight scales of eight consecutive blocks of a kind. */
INLINE __m256 q32_scales(int kind, const uint8_t *p, size_t bs) {
    return kind == KMXFP4 ? e8m0_scales8(p, bs) : scales8(p, bs);
}

/* MXFP4's codes to their doubled E2M1 values, int8, for pshufb. */
INLINE __m256i mxfp4_table(void) {
    return _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12, 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2,
                            -3, -4, -6, -8, -12);
}

/* Q4_1 and Q5_1: x = d * q + m, with an f16 m after d. */
INLINE bool q32_affine(int kind) { return kind == KQ4_1 || kind == KQ5_1; }

/* Byte j of the result is 0xFF when bit j of bits is set. */
INLINE __m256i spread_bits(uint32_t bits) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0);
    const __m256i mask = _mm256_set1_epi64x((long long)0x7fbfdfeff7fbfdfeULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    return _mm256_cmpeq_epi8(_mm256_or_si256(v, mask), _mm256_set1_epi64x(-1));
}

#define GROUP 8 /* blocks whose f16 scales are converted together */
#define REP8(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)

/* The exact integer dot of one block as eight int32 partial sums. u is the
 * unsigned pmaddubsw operand from the weight block (Q4_0: q in 0..15; Q5_0:
 * q in 0..31; Q8_0: |w|), except for MXFP4, where it holds the signed
 * values (-12..12; |u| is the operand and their signs move onto x, pairs
 * <= 2 * 12 * 127); xq the activation's 32 int8, wq the Q8_0 weight
 * bytes (their signs move onto x), e for Q4_0/Q5_0 the int16 pair sums of
 * 8*x / 16*x, subtracted for the -8 / -16 offset. */
INLINE __m256i q32_dot(int kind, __m256i u, const uint8_t *wq, const uint8_t *xq, __m256i e) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i xv = ld256(xq);
#ifdef X86_DPBUSD /* VNNI variants (kernels/variant.h): the same exact sums */
    if (kind == KQ8_0) return X86_DPBUSD(_mm256_setzero_si256(), u, _mm256_sign_epi8(xv, ld256(wq)));
    if (kind == KMXFP4) return X86_DPBUSD(_mm256_setzero_si256(), _mm256_abs_epi8(u), _mm256_sign_epi8(xv, u));
#endif
    if (kind == KMXFP4)
        return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(u), _mm256_sign_epi8(xv, u)), ones);
    if (kind == KQ8_0) return _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(xv, ld256(wq))), ones);
    return _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(u, xv), e), ones);
}

/* q points just past the block's f16 scale d (Q4_1, Q5_1: at m; MXFP4:
 * past its exponent byte, and the result is the signed values). */
INLINE __m256i q32_unsigned(int kind, const uint8_t *q) {
    if (kind == KQ8_0) return _mm256_abs_epi8(ld256(q));
    /* the 16 nibble bytes in both halves, the upper half shifted down a
     * nibble (Q5_0, Q5_1: after the 4 bytes of fifth bits) */
    const uint8_t *qhp = kind == KQ5_1 ? q + 2 : q;
    const uint8_t *nib = kind == KQ5_0 ? q + 4 : kind == KQ4_1 ? q + 2 : kind == KQ5_1 ? q + 6 : q;
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)nib));
    v = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    v = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
    if (kind == KMXFP4) return _mm256_shuffle_epi8(mxfp4_table(), v);
    if (kind == KQ5_0 || kind == KQ5_1) { /* bit j of qh is bit 4 of element j */
        uint32_t qh;
        memcpy(&qh, qhp, 4);
        v = _mm256_or_si256(v, _mm256_and_si256(spread_bits(qh), _mm256_set1_epi8(0x10)));
    }
    return v;
}

/* One group of 8 blocks for R rows and C columns; w points at row 0's
 * first block of the group, x at column 0's. acc[r][c][0] takes the even
 * blocks and [1] the odd ones (two chains, so a single row is not bound by
 * the FMA latency). The weight block is unpacked once per row and reused
 * for every column; the activation side (scales, 8*x sums) once per column.
 * Q4_1/Q5_1 add their m term in acc[r][c][2], lane b for block b of the
 * group: fma(m_b, float(sum of x_b's quants) * dx_b, .) (that product is
 * exact: a sum below 2^12 times an f16 scale). */
INLINE void q32_group(int kind, const uint8_t *w, size_t ws, int R, const uint8_t *x, size_t xs, int C,
                      __m256 acc[4][4][3]) {
    const size_t wbs = q32_block_size(kind);
    const size_t xbs = sizeof(block_q8_0);
    const __m256i eight = _mm256_set1_epi8(kind == KQ5_0 ? 16 : 8); /* the offset */
    /* Q4_0/Q5_0 with one row compute the offset sums inline; wider tiles
     * keep them here */
    const bool offset = kind == KQ4_0 || kind == KQ5_0;
    const bool keep_e = offset && R > 1;
    const bool affine = q32_affine(kind);
    __m256 dx[4], sxd[4];
    __m256i e8[4][GROUP];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        const uint8_t *xc = x + (size_t)c * xs;
        dx[c] = scales8(xc, xbs);
        if (affine) {
            __m256i sx[GROUP];
#define SX(b)                                                                                                          \
    sx[b] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), ld256(xc + b * xbs + 2)), _mm256_set1_epi16(1));
            REP8(SX)
#undef SX
            sxd[c] = _mm256_mul_ps(_mm256_cvtepi32_ps(tree8(sx)), dx[c]);
        }
        if (keep_e) {
#define E8(b) e8[c][b] = _mm256_maddubs_epi16(eight, ld256(xc + b * xbs + 2));
            REP8(E8)
#undef E8
        }
    }
    for (int r = 0; r < R; r++) {
        const uint8_t *wr = w + (size_t)r * ws;
        prefetch_ahead(wr, GROUP * wbs);
        __m256 dw = q32_scales(kind, wr, wbs);
        __m256 mw = affine ? scales8(wr + 2, wbs) : _mm256_setzero_ps();
#define U(b) __m256i u##b = q32_unsigned(kind, wr + b * wbs + q32_head(kind));
        REP8(U)
#undef U
        for (int c = 0; c < C; c++) {
            const uint8_t *xc = x + (size_t)c * xs;
            _Alignas(32) float sc[GROUP]; /* dw * dx per block, broadcast from memory */
            _mm256_store_ps(sc, _mm256_mul_ps(dw, dx[c]));
            __m256 a0 = acc[r][c][0], a1 = acc[r][c][1];
#define STEP(b)                                                                                                        \
    {                                                                                                                  \
        const uint8_t *xq = xc + b * xbs + 2;                                                                          \
        __m256i e = !offset ? _mm256_setzero_si256() : keep_e ? e8[c][b] : _mm256_maddubs_epi16(eight, ld256(xq));     \
        __m256 sb = _mm256_cvtepi32_ps(q32_dot(kind, u##b, wr + b * wbs + q32_head(kind), xq, e));                     \
        if (b & 1) a1 = _mm256_fmadd_ps(sb, _mm256_broadcast_ss(sc + b), a1);                                          \
        else a0 = _mm256_fmadd_ps(sb, _mm256_broadcast_ss(sc + b), a0);                                                \
    }
            REP8(STEP)
#undef STEP
            acc[r][c][0] = a0;
            acc[r][c][1] = a1;
            if (affine) acc[r][c][2] = _mm256_fmadd_ps(mw, sxd[c], acc[r][c][2]);
        }
    }
}

INLINE void q32_tile(int kind, int64_t n, const uint8_t *w, size_t ws, int R, const uint8_t *x, size_t xs, int C,
                     float *y, size_t ys) {
    const size_t wbs = q32_block_size(kind);
    const size_t xbs = sizeof(block_q8_0);
    const int64_t nb = n / 32;
    __m256 acc[4][4][3];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c][0] = acc[r][c][1] = acc[r][c][2] = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + GROUP <= nb; g += GROUP) q32_group(kind, w + (size_t)g * wbs, ws, R, x + (size_t)g * xbs, xs, C, acc);
    if (g < nb) { /* zero-padded last group: zero scales, zero sums */
        _Alignas(32) uint8_t wp[4][GROUP * sizeof(block_q8_0)];
        _Alignas(32) uint8_t xp[4][GROUP * sizeof(block_q8_0)];
        memset(wp, 0, sizeof wp);
        memset(xp, 0, sizeof xp);
        size_t left = (size_t)(nb - g);
        for (int r = 0; r < R; r++) memcpy(wp[r], w + (size_t)r * ws + (size_t)g * wbs, left * wbs);
        for (int c = 0; c < C; c++) memcpy(xp[c], x + (size_t)c * xs + (size_t)g * xbs, left * xbs);
        q32_group(kind, wp[0], sizeof wp[0], R, xp[0], sizeof xp[0], C, acc);
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            y[(size_t)c * ys + (size_t)r] =
                hsum8(q32_affine(kind) ? _mm256_add_ps(_mm256_add_ps(acc[r][c][0], acc[r][c][1]), acc[r][c][2])
                                       : _mm256_add_ps(acc[r][c][0], acc[r][c][1]));
}

float avx2_vec_dot_q8_0(int64_t n, const void *w, const void *x) {
    float y;
    q32_tile(KQ8_0, n, w, 0, 1, x, 0, 1, &y, 1);
    return y;
}

float avx2_vec_dot_q4_0(int64_t n, const void *w, const void *x) {
    float y;
    q32_tile(KQ4_0, n, w, 0, 1, x, 0, 1, &y, 1);
    return y;
}

float avx2_vec_dot_q5_0(int64_t n, const void *w, const void *x) {
    float y;
    q32_tile(KQ5_0, n, w, 0, 1, x, 0, 1, &y, 1);
    return y;
}

float avx2_vec_dot_q4_1(int64_t n, const void *w, const void *x) {
    float y;
    q32_tile(KQ4_1, n, w, 0, 1, x, 0, 1, &y, 1);
    return y;
}

float avx2_vec_dot_q5_1(int64_t n, const void *w, const void *x) {
    float y;
    q32_tile(KQ5_1, n, w, 0, 1, x, 0, 1, &y, 1);
    return y;
}

float avx2_vec_dot_mxfp4(int64_t n, const void *w, const void *x) {
    float y;
    q32_tile(KMXFP4, n, w, 0, 1, x, 0, 1, &y, 1);
    return y;
}

#define Q32(R, C)                                                                                                      \
    case R * 8 + C: q32_tile(KIND, n, w, ws, R, x, xs, C, y, ys); break;

void avx2_gemm_q8_0(int64_t n, const void *w, size_t ws, int nr, const void *x, size_t xs, int nc, float *y,
                    size_t ys) {
    assert(nr >= 0 && nr <= LM_GEMM_TILE && nc >= 0 && nc <= LM_GEMM_TILE && n % 32 == 0);
    if (nc == 1) {
        for (int r = 0; r < nr; r++) y[r] = avx2_vec_dot_q8_0(n, (const uint8_t *)w + (size_t)r * ws, x);
        return;
    }
#define KIND KQ8_0
    switch (nr * 8 + nc) {
        CASES(Q32)
        default: break;
    }
#undef KIND
}

void avx2_gemm_q4_0(int64_t n, const void *w, size_t ws, int nr, const void *x, size_t xs, int nc, float *y,
                    size_t ys) {
    assert(nr >= 0 && nr <= LM_GEMM_TILE && nc >= 0 && nc <= LM_GEMM_TILE && n % 32 == 0);
    if (nc == 1) {
        for (int r = 0; r < nr; r++) y[r] = avx2_vec_dot_q4_0(n, (const uint8_t *)w + (size_t)r * ws, x);
        return;
    }
#define KIND KQ4_0
    switch (nr * 8 + nc) {
        CASES(Q32)
        default: break;
    }
#undef KIND
}

void avx2_gemm_q5_0(int64_t n, const void *w, size_t ws, int nr, const void *x, size_t xs, int nc, float *y,
                    size_t ys) {
    assert(nr >= 0 && nr <= LM_GEMM_TILE && nc >= 0 && nc <= LM_GEMM_TILE && n % 32 == 0);
    /* rows of Q5_0 matrices are short (Gemma's 640 = 20 blocks): one token
     * runs the tile's rows together too, sharing the activation side and
     * the padded last group */
#define KIND KQ5_0
    switch (nr * 8 + nc) { Q32(1, 1) Q32(2, 1) Q32(3, 1) Q32(4, 1) CASES(Q32) default : break; }
#undef KIND
}

/* Q4_1 and Q5_1 as Q5_0: SmolLM2's rows are 576 (18 blocks) long, so one
 * token runs the tile's rows together too. */
void avx2_gemm_q4_1(int64_t n, const void *w, size_t ws, int nr, const void *x, size_t xs, int nc, float *y,
                    size_t ys) {
    assert(nr >= 0 && nr <= LM_GEMM_TILE && nc >= 0 && nc <= LM_GEMM_TILE && n % 32 == 0);
#define KIND KQ4_1
    switch (nr * 8 + nc) { Q32(1, 1) Q32(2, 1) Q32(3, 1) Q32(4, 1) CASES(Q32) default : break; }
#undef KIND
}

void avx2_gemm_q5_1(int64_t n, const void *w, size_t ws, int nr, const void *x, size_t xs, int nc, float *y,
                    size_t ys) {
    assert(nr >= 0 && nr <= LM_GEMM_TILE && nc >= 0 && nc <= LM_GEMM_TILE && n % 32 == 0);
#define KIND KQ5_1
    switch (nr * 8 + nc) { Q32(1, 1) Q32(2, 1) Q32(3, 1) Q32(4, 1) CASES(Q32) default : break; }
#undef KIND
}

/* MXFP4 as Q4_0: gpt-oss's rows are 2880 long (90 blocks), so one token
 * runs the rows one after another. */
void avx2_gemm_mxfp4(int64_t n, const void *w, size_t ws, int nr, const void *x, size_t xs, int nc, float *y,
                     size_t ys) {
    assert(nr >= 0 && nr <= LM_GEMM_TILE && nc >= 0 && nc <= LM_GEMM_TILE && n % 32 == 0);
    if (nc == 1) {
        for (int r = 0; r < nr; r++) y[r] = avx2_vec_dot_mxfp4(n, (const uint8_t *)w + (size_t)r * ws, x);
        return;
    }
#define KIND KMXFP4
    switch (nr * 8 + nc) {
        CASES(Q32)
        default: break;
    }
#undef KIND
}
#undef Q32

/* ---- K-quants against Q8_K activations ----------------------------------- */

enum { KQ4_K, KQ5_K }; /* Q6_K has its own fused tile, q6k_tile */

/* Offsets inside block_q8_K: d, qs[256], bsums[16]. */
#define Q8K_QS 4
#define Q8K_BSUMS (4 + QK_K)

/* One Q4_K/Q5_K weight super-block decoded for reuse across columns. u[j]:
 * the 32 unsigned q of chunk j (elements 32j..32j+31, activation order);
 * scv[j]: the int16 pmaddwd multipliers for chunk j (its 6-bit scale
 * everywhere); m16: the mins, each twice, against bsums; d, dmin: the float
 * super-block scales. */
typedef struct {
    __m256i u[8];
    __m256i scv[8];
    __m256i m16;
    float d, dmin;
} krow;

/* Q4_K/Q5_K: the eight 6-bit scales and mins (layout in quant.h) unpacked
 * with 32-bit word operations, four bytes at a time, into scv and m16. */
INLINE void k4_scales(const uint8_t *s, krow *k) {
    uint32_t s0, s1, s2;
    memcpy(&s0, s, 4);
    memcpy(&s1, s + 4, 4);
    memcpy(&s2, s + 8, 4);
    uint32_t sc_lo = s0 & 0x3f3f3f3fu, m_lo = s1 & 0x3f3f3f3fu;
    uint32_t sc_hi = (s2 & 0x0f0f0f0fu) | ((s0 >> 2) & 0x30303030u); /* bits 6-7 -> 4-5 */
    uint32_t m_hi = ((s2 >> 4) & 0x0f0f0f0fu) | ((s1 >> 2) & 0x30303030u);
    __m256i w16 = _mm256_cvtepu8_epi16(_mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)m_lo, (int)m_hi));
    __m256i sc = _mm256_permute4x64_epi64(w16, 0x44); /* sc0..sc7 in both halves */
#ifdef X86_DPBUSD /* VNNI: the scale in each lane's low int16, zero in the high one (X86_DPWSSD) */
#define SCV(j)                                                                                                         \
    k->scv[j] = _mm256_shuffle_epi8(sc, _mm256_set1_epi32((int)(0x80800000u | ((2u * j + 1) << 8) | (2u * j))));
#else
#define SCV(j) k->scv[j] = _mm256_shuffle_epi8(sc, _mm256_set1_epi16((short)(0x0100 * (2 * j + 1) + 2 * j)));
#endif
    REP8(SCV)
#undef SCV
    __m128i m = _mm256_extracti128_si256(w16, 1);
    k->m16 = _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m));
}

INLINE void k_prep(int kind, const uint8_t *blk, krow *k) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    /* Q4_K/Q5_K share d, dmin, scales; 64 elements per 32 bytes of qs: the low
     * nibbles, then the high ones */
    const uint8_t *qs = blk + (kind == KQ4_K ? offsetof(block_q4_K, qs) : offsetof(block_q5_K, qs));
#define Q4U(c)                                                                                                         \
    {                                                                                                                  \
        __m256i v = ld256(qs + 32 * c);                                                                                \
        k->u[2 * c] = _mm256_and_si256(v, low4);                                                                       \
        k->u[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);                                             \
    }
    /* clang-format off */
    Q4U(0)
    Q4U(1) Q4U(2) Q4U(3)
    /* clang-format on */
#undef Q4U
        if (kind == KQ5_K) { /* bit j of qh[l] is the fifth bit of element 32j + l */
        __m256i hv = ld256(blk + offsetof(block_q5_K, qh));
        const __m256i bit4 = _mm256_set1_epi8(0x10);
        /* before step j, bit 0 of each byte of hv is bit j of qh (16-bit shifts
         * carry bits across bytes, but only into bits the mask drops) */
#define Q5H(j)                                                                                                         \
    k->u[j] = _mm256_or_si256(k->u[j], _mm256_and_si256(_mm256_slli_epi16(hv, 4), bit4));                              \
    hv = _mm256_srli_epi16(hv, 1);
        REP8(Q5H)
#undef Q5H
    }
    k4_scales(blk + offsetof(block_q4_K, scales), k);
    k->d = _cvtsh_ss(ld16(blk + offsetof(block_q4_K, d)));
    k->dmin = _cvtsh_ss(ld16(blk + offsetof(block_q4_K, dmin)));
}

/* One decoded weight super-block against one Q8_K block into acc. */
INLINE __m256 k_dot(int kind, const krow *k, const uint8_t *xb, __m256 acc) {
    const float dx = ldf(xb);
    const uint8_t *xq = xb + Q8K_QS;
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
#ifdef X86_DPBUSD /* VNNI: four products per lane (|.| <= 15872), times the scale (kernels/variant.h) */
#define KSTEP(j)                                                                                                       \
    {                                                                                                                  \
        __m256i p = X86_DPBUSD(_mm256_setzero_si256(), k->u[j], ld256(xq + 32 * j));                                   \
        if (j & 1) s1 = X86_DPWSSD(s1, p, k->scv[j]);                                                                  \
        else s0 = X86_DPWSSD(s0, p, k->scv[j]);                                                                        \
    }
#else
#define KSTEP(j)                                                                                                       \
    {                                                                                                                  \
        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(k->u[j], ld256(xq + 32 * j)), k->scv[j]);                   \
        if (j & 1) s1 = _mm256_add_epi32(s1, p);                                                                       \
        else s0 = _mm256_add_epi32(s0, p);                                                                             \
    }
#endif
    REP8(KSTEP)
#undef KSTEP
    __m256i si = _mm256_add_epi32(s0, s1);
    __m256i bs = ld256(xb + Q8K_BSUMS);
    __m256i mv = _mm256_madd_epi16(bs, k->m16); /* sum_j m_j * (bsum_2j + bsum_2j+1) */
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_set1_ps(dx * k->d), acc);
    return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mv), _mm256_set1_ps(dx * k->dmin), acc);
}

INLINE size_t kbs(int kind) { return kind == KQ4_K ? sizeof(block_q4_K) : sizeof(block_q5_K); }

INLINE void k_tile(int kind, int64_t n, const uint8_t *w, size_t ws, int R, const uint8_t *x, size_t xs, int C,
                   float *y, size_t ys) {
    const size_t wbs = kbs(kind), xbs = sizeof(block_q8_K);
    __m256 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        for (int r = 0; r < R; r++) {
            krow k;
            const uint8_t *wb = w + (size_t)r * ws + (size_t)i * wbs;
            prefetch_ahead(wb, wbs);
            k_prep(kind, wb, &k);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) acc[r][c] = k_dot(kind, &k, x + (size_t)c * xs + (size_t)i * xbs, acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[(size_t)c * ys + (size_t)r] = hsum8(acc[r][c]);
}

float avx2_vec_dot_q4_K(int64_t n, const void *w, const void *x) {
    float y;
    k_tile(KQ4_K, n, w, 0, 1, x, 0, 1, &y, 1);
    return y;
}

float avx2_vec_dot_q5_K(int64_t n, const void *w, const void *x) {
    float y;
    k_tile(KQ5_K, n, w, 0, 1, x, 0, 1, &y, 1);
    return y;
}

/* Q6_K super-block of one row against C <= 4 tokens' Q8_K blocks (xs bytes
 * apart), k_prep and k_dot fused: each chunk's quants and scale vector are
 * formed just before their products with every token, instead of into a
 * krow (17 vectors, which did not fit the registers and went through the
 * stack: the fused loop measured 1.17x on 1-token products). Sums of
 * scale * q * x are exact in int32; the -32 offset comes off as 32 * sum_j
 * scale_j * bsum_j; then one fma per token into its accumulator. */
INLINE void q6k_block(const uint8_t *blk, const uint8_t *xb, size_t xs, int C, __m256 acc[4]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), top2 = _mm256_set1_epi8(0x30);
    const uint8_t *ql = blk + offsetof(block_q6_K, ql), *qh = blk + offsetof(block_q6_K, qh);
    const __m256i s16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(blk + offsetof(block_q6_K, scales))));
    const __m256i lo = _mm256_permute4x64_epi64(s16, 0x44), hi = _mm256_permute4x64_epi64(s16, 0xEE);
    __m256i si[4];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) si[c] = _mm256_setzero_si256();
        /* chunk j = 4h + t: low nibble (t < 2) or high nibble of ql[64h + 32(t&1) + l],
     * top two bits from bits 2t..2t+1 of qh[32h + l], moved to bits 4..5
     * (16-bit shifts move bits across bytes but the masks drop them); its
     * pmaddwd multipliers: scales[2j] for the first 16 elements, scales[2j+1]
     * for the rest (one per 128-bit half) */
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i l0 = ld256(ql + 64 * h), l1 = ld256(ql + 64 * h + 32), hv = ld256(qh + 32 * h);
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) {
            const __m256i lq = t & 1 ? l1 : l0;
            const __m256i lown = t < 2 ? lq : _mm256_srli_epi16(lq, 4);
            const __m256i top = t == 0 ? _mm256_slli_epi16(hv, 4)
                : t == 1               ? _mm256_slli_epi16(hv, 2)
                : t == 2               ? hv
                                       : _mm256_srli_epi16(hv, 2);
            const __m256i u = _mm256_or_si256(_mm256_and_si256(lown, low4), _mm256_and_si256(top, top2));
#ifdef X86_DPBUSD /* VNNI: the scale in each lane's low int16, zero in the high one */
            const __m256i idx =
                _mm256_set_m128i(_mm_set1_epi32((int)(0x80800000u | ((4u * t + 3) << 8) | (4u * t + 2))),
                                 _mm_set1_epi32((int)(0x80800000u | ((4u * t + 1) << 8) | (4u * t))));
#else
            const __m256i idx = _mm256_set_m128i(_mm_set1_epi16((short)(0x0100 * (4 * t + 3) + 4 * t + 2)),
                                                 _mm_set1_epi16((short)(0x0100 * (4 * t + 1) + 4 * t)));
#endif
            const __m256i sc = _mm256_shuffle_epi8(h ? hi : lo, idx);
            const int j = 4 * h + t;
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const uint8_t *xq = xb + (size_t)c * xs + Q8K_QS;
#ifdef X86_DPBUSD /* VNNI: four products u * x per lane, |.| <= 4 * 63 * 128 = 32256, times the scale */
                si[c] = X86_DPWSSD(si[c], X86_DPBUSD(_mm256_setzero_si256(), u, ld256(xq + 32 * j)), sc);
#else
                si[c] = _mm256_add_epi32(si[c], _mm256_madd_epi16(_mm256_maddubs_epi16(u, ld256(xq + 32 * j)), sc));
#endif
            }
        }
    }
    const float d = _cvtsh_ss(ld16(blk + offsetof(block_q6_K, d)));
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) { /* q - 32: subtract 32 * sum_j scale_j * bsum_j */
        const uint8_t *xc = xb + (size_t)c * xs;
        const __m256i corr = _mm256_madd_epi16(ld256(xc + Q8K_BSUMS), s16);
        const __m256i v = _mm256_sub_epi32(si[c], _mm256_slli_epi32(corr, 5));
        acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(ldf(xc) * d), acc[c]);
    }
}

/* R <= 4 Q6_K rows by C <= 4 tokens, as k_tile. */
INLINE void q6k_tile(int64_t n, const uint8_t *w, size_t ws, int R, const uint8_t *x, size_t xs, int C, float *y,
                     size_t ys) {
    __m256 acc[4][4];
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++)
        for (int r = 0; r < R; r++) {
            const uint8_t *wb = w + (size_t)r * ws + (size_t)i * sizeof(block_q6_K);
            prefetch_ahead(wb, sizeof(block_q6_K));
            q6k_block(wb, x + (size_t)i * sizeof(block_q8_K), xs, C, acc[r]);
        }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[(size_t)c * ys + (size_t)r] = hsum8(acc[r][c]);
}

float avx2_vec_dot_q6_K(int64_t n, const void *w, const void *x) {
    float y;
    q6k_tile(n, w, 0, 1, x, 0, 1, &y, 1);
    return y;
}

#define KT(R, C)                                                                                                       \
    case R * 8 + C:                                                                                                    \
        KTILE(n, w, ws, R, x, xs, C, y, ys);                                                                           \
        break;
#define K_GEMM(name, dot)                                                                                              \
    void name(int64_t n, const void *w, size_t ws, int nr, const void *x, size_t xs, int nc, float *y, size_t ys) {    \
        assert(nr >= 0 && nr <= LM_GEMM_TILE && nc >= 0 && nc <= LM_GEMM_TILE && n % QK_K == 0);                       \
        if (nc == 1) {                                                                                                 \
            for (int r = 0; r < nr; r++) y[r] = dot(n, (const uint8_t *)w + (size_t)r * ws, x);                        \
            return;                                                                                                    \
        }                                                                                                              \
        switch (nr * 8 + nc) {                                                                                         \
            CASES(KT)                                                                                                  \
            default: break;                                                                                            \
        }                                                                                                              \
    }
#define KTILE(...) k_tile(KQ4_K, __VA_ARGS__)
K_GEMM(avx2_gemm_q4_K, avx2_vec_dot_q4_K)
#undef KTILE
#define KTILE(...) k_tile(KQ5_K, __VA_ARGS__)
K_GEMM(avx2_gemm_q5_K, avx2_vec_dot_q5_K)
#undef KTILE
#define KTILE q6k_tile
K_GEMM(avx2_gemm_q6_K, avx2_vec_dot_q6_K)
#undef KTILE
#undef K_GEMM
#undef KT

/* ---- activation quantizers ------------------------------------------------ */
/* Same float operations as the reference (quant.c), element for element:
 * the block maximum, scalar d and 1/d, one multiply per element, then
 * round half away from zero (roundf) and clamp, NaN to the low bound. */

/* roundf for each lane: truncate, then step away from zero when the
 * dropped fraction (exact: v - trunc(v)) is at least one half. */
INLINE __m256 round_away(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    __m256 step = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
    return _mm256_add_ps(t, _mm256_and_ps(up, step));
}

/* round_away then clamp to [lo, hi] and convert; max_ps returns its second
 * operand when the first is NaN, so NaN gives lo as in the reference. */
INLINE __m256i round_clamp8(__m256 v, float lo, float hi) {
    __m256 r = _mm256_max_ps(round_away(v), _mm256_set1_ps(lo));
    return _mm256_cvttps_epi32(_mm256_min_ps(r, _mm256_set1_ps(hi)));
}

/* Four int32x8 (32 values in order) -> 32 int8 in order (values fit). */
INLINE __m256i pack32(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    __m256i q = _mm256_packs_epi16(ab, cd); /* dwords: a0 b0 c0 d0 a1 b1 c1 d1 */
    return _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* F16 to floats (F16C): exact, so the reference's bits for every non-NaN
 * value (a signalling NaN comes back quietened). Any n: the tail goes
 * through lm_f16_to_f32. */
void avx2_to_float_f16(const void *src, float *dst, int64_t n) {
    const uint16_t *h = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < n; i++) dst[i] = lm_f16_to_f32(h[i]);
}

/* Q8_0 blocks to floats: d * q, one exact product per value (an f16 scale
 * times an int8), as the reference. */
void avx2_to_float_q8_0(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QK8_0, b += sizeof(block_q8_0)) {
        __m256 d = _mm256_set1_ps(_cvtsh_ss(ld16(b)));
        for (int j = 0; j < 4; j++) {
            __m128i q8 = _mm_loadl_epi64((const __m128i *)(const void *)(b + 2 + 8 * j));
            __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
            _mm256_storeu_ps(dst + i + 8 * j, _mm256_mul_ps(d, q));
        }
    }
}

/* Floats to F16, rounded to nearest-even (F16C), as lm_f32_to_f16 does for
 * every finite value and infinity (NaNs stay NaNs). */
void avx2_from_float_f16(const float *src, void *dst, int64_t n) {
    uint16_t *h = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(h + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) h[i] = lm_f32_to_f16(src[i]);
}
/* max |x| over 32 * nv floats; NaN lanes are skipped (the NaN operand of
 * max_ps goes first) as the reference's strict > skips them. */
INLINE float absmax(const float *x, int nv) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < nv; i++) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * i)), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

void avx2_from_float_q8_0(const float *src, void *dst, int64_t n) {
    block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const float *x = src + i * QK8_0;
        float amax = absmax(x, 4);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = lm_f32_to_f16(d);
        __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] = round_clamp8(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), vid), -127.0f, 127.0f);
        _mm256_storeu_si256((__m256i *)(void *)b[i].qs, pack32(q[0], q[1], q[2], q[3]));
    }
}

void avx2_from_float_q8_K(const float *src, void *dst, int64_t n) {
    block_q8_K *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, b++) {
        const float *x = src + i * QK_K;
        float amax = absmax(x, QK_K / 8);
        if (amax == 0.0f) {
            memset(b, 0, sizeof *b);
            continue;
        }
        /* the reference keeps the sign of the first element of largest
         * magnitude */
        const __m256 sign = _mm256_set1_ps(-0.0f), va = _mm256_set1_ps(amax);
        float max = amax;
        for (int k = 0; k < QK_K / 8; k++) {
            __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * k));
            int hit = _mm256_movemask_ps(_mm256_cmp_ps(a, va, _CMP_EQ_OQ));
            if (hit) {
                max = x[8 * k + __builtin_ctz((unsigned)hit)];
                break;
            }
        }
        float iscale = -128.0f / max;
        __m256 vs = _mm256_set1_ps(iscale);
        __m256i gs[16]; /* per 16 elements: two int32x8 added, summed by tree8 */
        for (int c = 0; c < QK_K / 32; c++) {
            __m256i q[4];
            for (int k = 0; k < 4; k++)
                q[k] = round_clamp8(_mm256_mul_ps(vs, _mm256_loadu_ps(x + 32 * c + 8 * k)), -128.0f, 127.0f);
            _mm256_storeu_si256((__m256i *)(void *)(b->qs + 32 * c), pack32(q[0], q[1], q[2], q[3]));
            gs[2 * c] = _mm256_add_epi32(q[0], q[1]);
            gs[2 * c + 1] = _mm256_add_epi32(q[2], q[3]);
        }
        __m256i s0 = tree8(gs), s1 = tree8(gs + 8); /* lane g: bsum g (and 8 + g) */
        __m256i s16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(s0, s1), 0xD8);
        _mm256_storeu_si256((__m256i *)(void *)b->bsums, s16);
        b->d = 1.0f / iscale;
    }
}

/* ---- table ---------------------------------------------------------------- */

static const lm_avx2_kernels table[LM_TYPE_COUNT] = {
    [LM_TYPE_F32] = {.vec_dot = avx2_vec_dot_f32, .gemm = avx2_gemm_f32, .gemm_cols = 3},
    [LM_TYPE_F16] = {.to_float = avx2_to_float_f16,
                     .from_float = avx2_from_float_f16,
                     .vec_dot = avx2_vec_dot_f16,
                     .gemm = avx2_gemm_f16,
                     .packed_gemm = avx2_packed_gemm_f16,
                     .gemm_cols = 3,
                     .pack_tile = 6},
    [LM_TYPE_BF16] = {.vec_dot = avx2_vec_dot_bf16, .gemm = avx2_gemm_bf16, .gemm_cols = 3},
    [LM_TYPE_Q8_0] = {.to_float = avx2_to_float_q8_0,
                      .from_float = avx2_from_float_q8_0,
                      .vec_dot = avx2_vec_dot_q8_0,
                      .gemm = avx2_gemm_q8_0,
                      .packed_gemm = avx2_packed_gemm_q8_0,
                      .packed_act = avx2_packed_act,
                      .pack_tile = LM_PACK_TILE},
    [LM_TYPE_Q4_0] = {.vec_dot = avx2_vec_dot_q4_0,
                      .gemm = avx2_gemm_q4_0,
                      .packed_gemm = avx2_packed_gemm_q4_0,
                      .packed_act = avx2_packed_act,
                      .pack_tile = LM_PACK_TILE},
    [LM_TYPE_Q5_0] = {.vec_dot = avx2_vec_dot_q5_0,
                      .gemm = avx2_gemm_q5_0,
                      .packed_gemm = avx2_packed_gemm_q5_0,
                      .packed_act = avx2_packed_act,
                      .pack_tile = LM_PACK_TILE},
    [LM_TYPE_Q4_1] = {.vec_dot = avx2_vec_dot_q4_1,
                      .gemm = avx2_gemm_q4_1,
                      .packed_gemm = avx2_packed_gemm_q4_1,
                      .packed_act = avx2_packed_act,
                      .pack_tile = LM_PACK_TILE},
    [LM_TYPE_Q5_1] = {.vec_dot = avx2_vec_dot_q5_1,
                      .gemm = avx2_gemm_q5_1,
                      .packed_gemm = avx2_packed_gemm_q5_1,
                      .packed_act = avx2_packed_act,
                      .pack_tile = LM_PACK_TILE},
    [LM_TYPE_MXFP4] = {.vec_dot = avx2_vec_dot_mxfp4,
                       .gemm = avx2_gemm_mxfp4,
                       .packed_gemm = avx2_packed_gemm_mxfp4,
                       .packed_act = avx2_packed_act,
                       .pack_tile = LM_PACK_TILE},
    [LM_TYPE_Q4_K] = {.vec_dot = avx2_vec_dot_q4_K,
                      .gemm = avx2_gemm_q4_K,
                      .packed_gemm = avx2_packed_gemm_q4_K,
                      .packed_act = avx2_from_float_q8_K,
                      .pack_tile = LM_PACK_TILE},
    [LM_TYPE_Q5_K] = {.vec_dot = avx2_vec_dot_q5_K, .gemm = avx2_gemm_q5_K},
    [LM_TYPE_Q6_K] = {.vec_dot = avx2_vec_dot_q6_K, .gemm = Q6K_GEMM},
    [LM_TYPE_Q8_K] = {.from_float = avx2_from_float_q8_K},
};

const lm_avx2_kernels *avx2_kernels(uint32_t type) {
    if (type >= LM_TYPE_COUNT) return NULL;
    const lm_avx2_kernels *k = &table[type];
    return k->to_float || k->from_float || k->vec_dot ? k : NULL;
}

#else /* not x86, or a variant left out (kernels/variant.h): no kernels here */

const lm_avx2_kernels *avx2_kernels(uint32_t type) {
    (void)type;
    return NULL;
}

#endif
