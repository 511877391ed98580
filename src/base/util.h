/*
 * util.h - small shared helpers: error text, checked allocation, half-precision
 * conversion, overflow-safe size arithmetic and a monotonic clock.
 *
 * Error convention used across lamina: a function that can fail returns a
 * status (0 ok, -1 failure) or NULL, and writes a one-line message into a
 * caller-owned buffer `char *err` of `errlen` bytes (LM_ERRLEN is a good size).
 * `err` may be NULL, in which case the message is dropped. Library code never
 * prints and never exits.
 */
#ifndef LAMINA_UTIL_H
#define LAMINA_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lamina.h" /* LM_ERRLEN, lm_status */

/* printf-style message into err (truncated to errlen); always returns -1 so
 * callers can write `return lm_err(err, errlen, "...")`. */
int lm_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Allocation goes through these wrappers so tests can make them fail on
 * purpose: lm_alloc_fail_after(n) makes the (n+1)-th allocation from now
 * return NULL; a negative n switches failure injection off. */
void *lm_malloc(size_t n);
void *lm_calloc(size_t count, size_t size);
void *lm_realloc(void *p, size_t n);
void lm_free(void *p);
/* The n bytes at s (need not be NUL-terminated) as a new NUL-terminated
 * string from lm_malloc, or NULL when memory runs out. */
char *lm_strndup(const char *s, size_t n);
void lm_alloc_fail_after(long n);

/* Overflow-safe arithmetic: return false (and leave *out unspecified) when the
 * exact result does not fit in 64 bits. */
static inline bool lm_add_u64(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_add_overflow(a, b, out); }
static inline bool lm_mul_u64(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_mul_overflow(a, b, out); }

/* IEEE half and bfloat16 <-> float, exact for every finite value (round to
 * nearest even on the way down, NaN kept NaN). */
float lm_f16_to_f32(uint16_t h);
uint16_t lm_f32_to_f16(float f);
float lm_bf16_to_f32(uint16_t h);
uint16_t lm_f32_to_bf16(float f);

/* Seconds from an arbitrary fixed point, monotonic. */
double lm_now(void);

/* Deterministic 64-bit PRNG (xoshiro256**-style splitmix seeding) used by the
 * sampler, mkmodel and tests, so one seed gives the same stream everywhere. */
typedef struct {
    uint64_t s[4];
} lm_rng;
void lm_rng_seed(lm_rng *r, uint64_t seed);
uint64_t lm_rng_u64(lm_rng *r);
double lm_rng_uniform(lm_rng *r); /* [0, 1) */
float lm_rng_normal(lm_rng *r);   /* standard normal */

#endif
