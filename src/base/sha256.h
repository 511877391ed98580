/*
 * sha256.h - SHA-256 (FIPS 180-4), used to key prefix-cache blocks.
 *
 * Streaming (init / update / final) and one-shot forms. The digest is the
 * standard 32 bytes, big-endian words, as every other implementation prints
 * it. No allocation, no global state; a context may be copied to fork a
 * running hash.
 */
#ifndef LAMINA_SHA256_H
#define LAMINA_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_LEN 32

typedef struct {
    uint32_t h[8];    /* chaining value */
    uint64_t n_bytes; /* message bytes consumed so far */
    uint8_t buf[64];  /* partial block, buf_len bytes valid */
    size_t buf_len;
} sha256_ctx;

void sha256_init(sha256_ctx *c);
void sha256_update(sha256_ctx *c, const void *data, size_t len);
/* Writes the digest and leaves c in an unspecified state (init again to reuse). */
void sha256_final(sha256_ctx *c, uint8_t out[SHA256_LEN]);
void sha256(const void *data, size_t len, uint8_t out[SHA256_LEN]);

#endif
