/*
 * quant.h - numerical formats: the table of ggml tensor types.
 *
 * Every type GGUF files may carry has an entry (so the reader can size any
 * tensor and errors can name the type); the ones lamina computes with also
 * have conversion and dot-product functions. Layouts follow GGUF exactly, so
 * files written by other tools load bit-for-bit:
 *
 *   F32, F16, BF16     one value per element
 *   Q8_0  (32 / 34 B)  f16 scale d, 32 x int8 q;        x = d * q
 *   Q4_0  (32 / 18 B)  f16 scale d, 16 bytes of nibbles; element j (j < 16)
 *                      is the low nibble of byte j, element j+16 the high
 *                      nibble of byte j;                x = d * (q - 8)
 *   Q5_0  (32 / 22 B)  f16 d, 4 bytes qh (bit j of the little-endian u32
 *                      is bit 4 of element j), 16 bytes of nibbles as
 *                      Q4_0;                            x = d * (q - 16)
 *   Q4_1  (32 / 20 B)  f16 d, f16 m, nibbles as Q4_0;   x = d * q + m
 *   Q5_1  (32 / 24 B)  f16 d, f16 m, qh and nibbles as Q5_0; x = d * q + m
 *
 *   MXFP4 (32 / 17 B)  one E8M0 byte e (the power of two 2^(e - 127)),
 *                      then 16 bytes of nibbles laid out as Q4_0's, each
 *                      an E2M1 code (bit 3 the sign, bits 0..2 the
 *                      magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6). As GGUF
 *                      tools do, the table holds the doubled values
 *                      (quant_mxfp4_kvalues: 0 1 2 3 4 6 8 12, then the
 *                      same negated) and the scale is halved:
 *                                                      x = kv[q] * 2^(e - 128)
 *
 *   K-quants: super-blocks of QK_K = 256 elements (layouts below)
 *   Q4_K (144 B)  f16 d, f16 dmin, 12 bytes of 6-bit scales and mins for the
 *                 8 sub-blocks of 32, 128 bytes of nibbles;
 *                 x = d*sc[j]*q - dmin*m[j],  q in 0..15
 *   Q5_K (176 B)  as Q4_K plus qh[32] holding each element's fifth bit;
 *                 q in 0..31
 *   Q6_K (210 B)  ql[128] low nibbles, qh[64] top two bits, int8 scales for
 *                 the 16 sub-blocks of 16, f16 d;  x = d*sc[j]*(q - 32)
 *   Q8_K (292 B)  f32 d, 256 x int8 q, int16 sums of each 16 q (bsums);
 *                 activation format only, x = d * q
 *
 * Element order inside a K-quant super-block (e = element index 0..255):
 *   Q4_K/Q5_K  chunk c = e / 64, l = e % 32: elements 64c + l take the low
 *              nibble of qs[32c + l], elements 64c + 32 + l the high nibble;
 *              Q5_K's fifth bit of element e is bit (e / 32) of qh[e % 32].
 *              Sub-block j = e / 32 uses scale/min pair j.
 *   Q6_K       half h = e / 128, k = (e % 128) / 32, l = e % 32: the low four
 *              bits come from ql[64h + 32(k & 1) + l] (low nibble for k < 2,
 *              high nibble for k >= 2), the top two from bits 2k..2k+1 of
 *              qh[32h + l]. Sub-block j = e / 16 uses scales[j].
 *   Q4_K/Q5_K scale/min pair j (6 bits each) in scales[12]: for j < 4 the
 *              low 6 bits of scales[j] (scale) and scales[j + 4] (min); for
 *              j >= 4 the low nibble (scale) and high nibble (min) of
 *              scales[j + 4], with their top two bits in bits 6..7 of
 *              scales[j - 4] (scale) and scales[j] (min).
 *
 * Quantized weights are multiplied against activations that are themselves
 * quantized to `vec_dot_type` (Q8_0 for Q8_0, Q4_0, Q5_0, Q4_1, Q5_1
 * (whose m term takes the sum of the activation quants) and MXFP4, Q8_K for the
 * K-quants), with integer dot products per block, as GGUF engines do. F16
 * weights take activations rounded to F16 (relative error <= 2^-11 each,
 * values past 65504 become infinite; products and sums stay in F32), which
 * halves the bytes a prefill streams; F32 and BF16 weights take F32.
 *
 * MXFP4's scale is a bare power of two, 2^(e - 128) from 2^-128 to 2^127
 * (e = 255 overflows for codes of magnitude 2 and up), so it covers block
 * maxima of about 1e-38 to 3e38, each value to one bit past the leading
 * one (E2M1: relative steps of 1/4 to 1/2 at the top of the block).
 *
 * The other scales are stored as f16, so the quantized types keep their accuracy for
 * block maxima from about 2e-3 up to 5e5 (Q4_0's limit, 8 * 65504; the
 * others reach further); below, the scale goes subnormal and loses
 * precision until values flush to zero (~1e-6), above it overflows. Block
 * data must be aligned like its struct (2 bytes; 4 for Q8_K), which GGUF
 * tensor alignment guarantees.
 *
 * This table holds the layouts and the scalar reference functions only; they
 * define what every faster variant computes. The kernels layer
 * (kernels/kernels.h) picks the variants the CPU runs, by type, once at
 * start-up; every matrix product, conversion and dot product of the forward
 * pass goes through that table. Every to_float variant must return the
 * reference's bits (the products involved are exact, see quant.c); vec_dot
 * variants agree with the reference within float rounding (tests allow 1e-5
 * of sum |w*x|).
 */
#ifndef LAMINA_QUANT_H
#define LAMINA_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum lm_type {
    LM_TYPE_F32 = 0,
    LM_TYPE_F16 = 1,
    LM_TYPE_Q4_0 = 2,
    LM_TYPE_Q4_1 = 3,
    LM_TYPE_Q5_0 = 6,
    LM_TYPE_Q5_1 = 7,
    LM_TYPE_Q8_0 = 8,
    LM_TYPE_Q8_1 = 9,
    LM_TYPE_Q2_K = 10,
    LM_TYPE_Q3_K = 11,
    LM_TYPE_Q4_K = 12,
    LM_TYPE_Q5_K = 13,
    LM_TYPE_Q6_K = 14,
    LM_TYPE_Q8_K = 15,
    LM_TYPE_IQ2_XXS = 16,
    LM_TYPE_IQ2_XS = 17,
    LM_TYPE_IQ3_XXS = 18,
    LM_TYPE_IQ1_S = 19,
    LM_TYPE_IQ4_NL = 20,
    LM_TYPE_IQ3_S = 21,
    LM_TYPE_IQ2_S = 22,
    LM_TYPE_IQ4_XS = 23,
    LM_TYPE_I8 = 24,
    LM_TYPE_I16 = 25,
    LM_TYPE_I32 = 26,
    LM_TYPE_I64 = 27,
    LM_TYPE_F64 = 28,
    LM_TYPE_IQ1_M = 29,
    LM_TYPE_BF16 = 30,
    LM_TYPE_TQ1_0 = 34,
    LM_TYPE_TQ2_0 = 35,
    LM_TYPE_MXFP4 = 39,
    LM_TYPE_COUNT = 40
};

#define QK8_0 32
#define QK4_0 32

#define QK_K 256
#define K_SCALE_SIZE 12

typedef struct {
    uint16_t d;
    int8_t qs[QK8_0];
} block_q8_0; /* 34 bytes */
typedef struct {
    uint16_t d;
    uint8_t qs[QK4_0 / 2];
} block_q4_0; /* 18 bytes */
#define QK5_0 32
typedef struct {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[QK5_0 / 2];
} block_q5_0; /* 22 bytes */
#define QK4_1 32
#define QK5_1 32
typedef struct {
    uint16_t d, m;
    uint8_t qs[QK4_1 / 2];
} block_q4_1; /* 20 bytes */
typedef struct {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
} block_q5_1; /* 24 bytes */

#define QK_MXFP4 32
typedef struct {
    uint8_t e;                /* E8M0 exponent: scale 2^(e - 127) */
    uint8_t qs[QK_MXFP4 / 2]; /* E2M1 codes, nibbles as Q4_0 */
} block_mxfp4;                /* 17 bytes, no padding */

/* MXFP4's E2M1 values doubled (index: the 4-bit code), and the halved
 * scale 2^(e - 128) of an exponent byte (subnormal for e < 2), as floats:
 * x = quant_mxfp4_kvalues[q] * quant_e8m0_half(e), exact. */
extern const int8_t quant_mxfp4_kvalues[16];
float quant_e8m0_half(uint8_t e);

typedef struct {   /* 144 bytes */
    uint16_t d;    /* f16 scale of the 6-bit sub-block scales */
    uint16_t dmin; /* f16 scale of the 6-bit sub-block mins */
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
} block_q4_K;

typedef struct { /* 176 bytes */
    uint16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8]; /* fifth bit of each element */
    uint8_t qs[QK_K / 2]; /* low four bits */
} block_q5_K;

typedef struct {          /* 210 bytes */
    uint8_t ql[QK_K / 2]; /* low four bits */
    uint8_t qh[QK_K / 4]; /* top two bits */
    int8_t scales[QK_K / 16];
    uint16_t d;
} block_q6_K;

typedef struct { /* 292 bytes */
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16]; /* sum of qs over each group of 16 */
} block_q8_K;

/* One weight row (n elements of the weight type) dotted with one activation
 * row (n elements of vec_dot_type); n is a multiple of the block size. */
typedef float (*lm_vec_dot_fn)(int64_t n, const void *w, const void *x);
/* A tile of y = x·wᵀ: nr weight rows by nc activation rows (each 1 to
 * LM_GEMM_TILE), y[c * y_stride + r] = vec_dot(n, w + r*w_stride, x + c*x_stride),
 * every output bit-identical to the same type's vec_dot (so a token's result
 * does not depend on the batch it shares). Strides: bytes for w and x,
 * floats for y. */
#define LM_GEMM_TILE 4
typedef void (*lm_gemm_fn)(int64_t n, const void *w, size_t w_stride, int nr, const void *x, size_t x_stride, int nc,
                           float *y, size_t y_stride);
/* Interleaved weights (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, MXFP4, Q4_K and F16).
 *
 * For matrix products a Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, MXFP4, Q4_K or F16 weight matrix may be copied once,
 * at model load, into an interleaved layout: its rows in groups of
 * quant_pack_rows(type) (the last group padded with zero rows), each group
 * stored column by column, groups one after another.
 *
 * Q8_0, Q4_0, Q5_0, Q4_1, Q5_1 and MXFP4: groups of LM_PACK_ROWS = 8 rows, block column by block
 * column (the cols / 32 blocks of the 8 rows at the same position):
 *
 *   Q4_0x8  144 B per block column: d[8] (f16, row r's scale at d[r]), then
 *           qs[128] where bytes 4k..4k+3 of row r's 16 nibble bytes sit at
 *           qs[32k + 4r] (k < 4)
 *   Q8_0x8  272 B per block column: d[8], then qs[256] where bytes 4k..4k+3
 *           of row r's 32 quants sit at qs[32k + 4r] (k < 8)
 *   Q5_0x8  176 B per block column: d[8], then qh[32] with row r's 4 qh
 *           bytes at qh[4r], then qs[128] as in Q4_0x8
 *   Q4_1x8  160 B per block column: d[8], m[8] (f16, row r's at [r]), then
 *           qs[128] as in Q4_0x8
 *   Q5_1x8  192 B per block column: d[8], m[8], then qh[32] and qs[128] as
 *           in Q5_0x8
 *   MXFP4x8 136 B per block column: e[8] (row r's exponent byte at e[r]),
 *           then qs[128] as in Q4_0x8
 *
 * So one 32-byte load holds four consecutive quants (Q4_0: eight, low and
 * high nibbles) of each of the 8 rows, one row per 32-bit lane, and a
 * kernel keeps one float accumulator lane per weight row: no horizontal
 * sums, and the 8 rows' scales convert with one instruction (MXFP4: a
 * few integer ones). These kernels
 * take activations as block_q8_0s rows: the Q8_0 quants and scale of the
 * same values (bit for bit what Q8_0's from_float gives), the scale already
 * widened to f32, plus 8 * the sum of the quants (the correction for
 * Q4_0's offset of -8; Q4_1 and Q5_1 multiply the sum by m * dx).
 *
 * Q4_K: groups of 8 rows, super-block column by super-block column, 1152 B
 * each: d[8], then dmin[8] (f16, row r's at [r]), then the three 4-byte
 * words of each row's 12 scale bytes (word w of row r at 32 + 32w + 4r),
 * then qs[1024] where bytes 4k..4k+3 of row r's 128 quant bytes sit at
 * 128 + 32k + 4r (k < 32). The kernels unpack the 8 rows' 6-bit scales and
 * mins with the same word operations at once, take Q8_K activations, and
 * keep one integer sum per row per super-block: sum_j scale_j * dot_j and
 * sum_j min_j * bsum_j, added in float as acc += d dx isum - dmin dx msum.
 *
 * F16 panels: groups of LM_PANEL_ROWS = 16 rows, element by element: row
 * r's element k at half 16k + r of its group (32 bytes per column, any
 * number of columns). The kernels take F32 activations. Each output is
 * the sum of LM_PANEL_SEGS = 4 segments of the row: with q = n / 4, s_j
 * covers elements [jq, (j+1)q) (s_3: [3q, n)) and is the fmaf chain
 * acc = fma(w[k], x[k], acc) in order from acc = 0; the result is
 * (s_0 + s_1) + (s_2 + s_3) (quant_panel_dot_ref). One token runs the
 * four chains side by side, several tokens one segment after another, with
 * the same bits.
 *
 * Files always carry the standard layout; the interleaved copy exists only
 * in memory. */
#define LM_PACK_ROWS 8
#define LM_PANEL_ROWS 16
#define LM_PANEL_SEGS 4
typedef struct {
    float d;
    int32_t s8;
    int8_t qs[QK8_0];
} block_q8_0s; /* 40 bytes */

/* An interleaved tile: rows [0, nr) (nr <= quant_pack_rows) of the group at
 * wp against nc activation rows (x_stride bytes apart; 1 <= nc <= the
 * type's pack_tile): y[c * y_stride + r] = row r · token c. Activations are
 * block_q8_0s rows for Q8_0, Q4_0, Q5_0, Q4_1, Q5_1 and MXFP4, Q8_K rows for Q4_K, floats for
 * F16. Each output has its
 * own accumulator and the same float steps in the same order for every nc
 * and position, so results do not depend on the batch. */
#define LM_PACK_TILE 8
typedef void (*lm_packed_gemm_fn)(int64_t n, const void *wp, int nr, const void *x, size_t x_stride, int nc, float *y,
                                  size_t y_stride);
typedef void (*lm_to_float_fn)(const void *src, float *dst, int64_t n);
typedef void (*lm_from_float_fn)(const float *src, void *dst, int64_t n);

/* One ggml type: its block layout and, where lamina computes with it, the
 * scalar reference conversions and dot product. Constant: nothing here
 * changes at run time. */
typedef struct {
    const char *name; /* "F32", "Q4_K", ... as GGUF tools print them */
    int64_t blck;     /* elements per block */
    size_t type_size; /* bytes per block */
    bool is_quantized;
    /* scalar references, NULL where lamina does not implement the type: */
    lm_to_float_fn to_float;
    lm_from_float_fn from_float;
    uint32_t vec_dot_type; /* activation type of vec_dot (weight types only) */
    lm_vec_dot_fn vec_dot;
} lm_type_traits;

/* NULL for an id that is not a known ggml type. */
const lm_type_traits *quant_traits(uint32_t type);
/* "Q4_K", or "unknown" for an unknown id. */
const char *quant_type_name(uint32_t type);
/* Parse a type name (case-insensitive), -1 if unknown. */
int quant_type_from_name(const char *name);
/* True when lamina can run matrix products with weights of this type. */
bool quant_supported(uint32_t type);
/* Bytes of a row of n elements; 0 if the type is unknown or n is not a
 * multiple of its block size. */
size_t quant_row_size(uint32_t type, int64_t n);

/* Scalar reference implementations, for tests and as the portable path.
 * `type` must be one with the function (asserted); n a multiple of its block
 * size. quant_from_float_ref for Q8_0, Q4_0, Q5_0, Q4_1, Q5_1 and MXFP4 reproduces GGUF
 * tools bit for bit (MXFP4: for block maxima from 2^-125 up; below, GGUF
 * tools wrap the exponent byte around and lamina writes e = 0); for the K-quants it is lamina's own search (valid blocks, not
 * byte-identical to other quantizers). vec_dot's `x` is in vec_dot_type. */
void quant_to_float_ref(uint32_t type, const void *src, float *dst, int64_t n);
void quant_from_float_ref(uint32_t type, const float *src, void *dst, int64_t n);
float quant_vec_dot_ref(uint32_t type, int64_t n, const void *w, const void *x);

/* For matrix products: bytes of one activation row of n elements in the
 * weight type's vec_dot_type (0 if the type is not supported or n is not a
 * multiple of the block size), and the conversion of n floats into that
 * format by the reference quantizer (every variant gives the same bits). */
size_t quant_act_row_size(uint32_t weight_type, int64_t n);
void quant_act_from_float(uint32_t weight_type, const float *x, void *dst, int64_t n);

/* Rows per interleaved group of a type: LM_PACK_ROWS for Q8_0, Q4_0, Q5_0,
 * Q4_1, Q5_1, MXFP4 and Q4_K, LM_PANEL_ROWS for F16, 0 for types without the layout. */
int quant_pack_rows(uint32_t type);
/* Bytes of the interleaved copy of a (rows, cols) matrix of Q8_0, Q4_0,
 * Q5_0, Q4_1, Q5_1, MXFP4, Q4_K or F16 (rows rounded up to a whole group); 0 for other types or a cols that
 * is not a multiple of the block size. The layout exists whatever the CPU;
 * whether anything computes with it is the kernel table's packed_gemm. */
size_t quant_pack_size(uint32_t type, int64_t rows, int64_t cols);
/* Write the interleaved copy of `rows` rows of src (src_stride bytes apart)
 * into dst (quant_pack_size bytes). */
void quant_pack(uint32_t type, const void *src, size_t src_stride, int64_t rows, int64_t cols, void *dst);
/* What an F16 panel kernel computes for row r (< LM_PANEL_ROWS) of the
 * group at wp and the floats x: the four segments' fmaf chains, summed. */
float quant_panel_dot_ref(int64_t n, const void *wp, int r, const float *x);
/* Bytes of one activation row of n elements that the packed kernels of a
 * weight type take: block_q8_0s rows (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, MXFP4), Q8_K rows (Q4_K),
 * floats (F16); 0 for other types. */
size_t quant_packed_x_row_size(uint32_t type, int64_t n);
/* Bytes of one block_q8_0s activation row of n elements (n % 32 == 0). */
size_t quant_packed_act_row_size(int64_t n);
/* Reference quantizer to block_q8_0s (every variant gives the same bits). */
void quant_packed_act_ref(const float *src, void *dst, int64_t n);

#endif
