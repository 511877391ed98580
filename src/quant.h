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
 *
 * Quantized weights are multiplied against activations that are themselves
 * quantized to `vec_dot_type` (Q8_0 for the 8- and 4-bit types), with integer
 * dot products per block, as GGUF engines do. Float weight types use F32
 * activations.
 *
 * quant_init() fills the function pointers once, choosing the fastest
 * variant the CPU supports; the `*_ref` scalar functions stay available for
 * tests.
 */
#ifndef LAMINA_QUANT_H
#define LAMINA_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum lm_type {
    LM_TYPE_F32 = 0, LM_TYPE_F16 = 1, LM_TYPE_Q4_0 = 2, LM_TYPE_Q4_1 = 3,
    LM_TYPE_Q5_0 = 6, LM_TYPE_Q5_1 = 7, LM_TYPE_Q8_0 = 8, LM_TYPE_Q8_1 = 9,
    LM_TYPE_Q2_K = 10, LM_TYPE_Q3_K = 11, LM_TYPE_Q4_K = 12, LM_TYPE_Q5_K = 13,
    LM_TYPE_Q6_K = 14, LM_TYPE_Q8_K = 15,
    LM_TYPE_IQ2_XXS = 16, LM_TYPE_IQ2_XS = 17, LM_TYPE_IQ3_XXS = 18,
    LM_TYPE_IQ1_S = 19, LM_TYPE_IQ4_NL = 20, LM_TYPE_IQ3_S = 21,
    LM_TYPE_IQ2_S = 22, LM_TYPE_IQ4_XS = 23, LM_TYPE_I8 = 24, LM_TYPE_I16 = 25,
    LM_TYPE_I32 = 26, LM_TYPE_I64 = 27, LM_TYPE_F64 = 28, LM_TYPE_IQ1_M = 29,
    LM_TYPE_BF16 = 30, LM_TYPE_TQ1_0 = 34, LM_TYPE_TQ2_0 = 35, LM_TYPE_MXFP4 = 39,
    LM_TYPE_COUNT = 40
};

#define QK8_0 32
#define QK4_0 32

typedef struct { uint16_t d; int8_t qs[QK8_0]; } block_q8_0;      /* 34 bytes */
typedef struct { uint16_t d; uint8_t qs[QK4_0 / 2]; } block_q4_0; /* 18 bytes */

/* One weight row (n elements of the weight type) dotted with one activation
 * row (n elements of vec_dot_type); n is a multiple of the block size. */
typedef float (*lm_vec_dot_fn)(int64_t n, const void *w, const void *x);
typedef void (*lm_to_float_fn)(const void *src, float *dst, int64_t n);
typedef void (*lm_from_float_fn)(const float *src, void *dst, int64_t n);

typedef struct {
    const char *name;         /* "F32", "Q4_K", ... as GGUF tools print them */
    int64_t blck;             /* elements per block */
    size_t type_size;         /* bytes per block */
    bool is_quantized;
    /* NULL where lamina does not implement the type: */
    lm_to_float_fn to_float;
    lm_from_float_fn from_float;
    uint32_t vec_dot_type;
    lm_vec_dot_fn vec_dot;
} lm_type_traits;

/* Fill the function pointers (idempotent, thread-safe after the first call
 * returns; call once at start-up). */
void quant_init(void);

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

/* Scalar reference implementations, for tests and as the portable path. */
void quant_to_float_ref(uint32_t type, const void *src, float *dst, int64_t n);
void quant_from_float_ref(uint32_t type, const float *src, void *dst, int64_t n);
float quant_vec_dot_ref(uint32_t type, int64_t n, const void *w, const void *x);

#endif
