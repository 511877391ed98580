/*
 * strbuf.h - a growable byte string for building text (JSON, Prometheus
 * metrics, rendered chat prompts, streamed answers).
 *
 * Appends never fail at the call: an allocation failure or a size overflow
 * sets `failed`, later appends do nothing, and the owner checks the flag
 * once when the text is complete. The content is NUL-terminated whenever len
 * > 0 (p is NULL until the first append), so p can be used as a C string.
 * A zeroed strbuf is empty and ready; strbuf_free returns it to that state.
 * Memory comes from lm_malloc/lm_realloc (tests can make them fail).
 */
#ifndef LAMINA_STRBUF_H
#define LAMINA_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *p;     /* (cap) NUL-terminated when len > 0; NULL until the first append */
    size_t len;  /* bytes written, not counting the NUL */
    size_t cap;  /* bytes allocated */
    bool failed; /* an allocation failed or a size overflowed: the content is incomplete */
} strbuf;

void strbuf_put(strbuf *b, const void *s, size_t n);
void strbuf_puts(strbuf *b, const char *s); /* NULL: nothing */
void strbuf_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void strbuf_free(strbuf *b);
/* Append the longest prefix of s[0..n) that is complete UTF-8, each
 * malformed byte (and NUL, which cannot travel in a C string) replaced by
 * U+FFFD; returns the bytes consumed. With final set an incomplete tail is
 * replaced too and everything is consumed. */
size_t strbuf_put_utf8(strbuf *b, const char *s, size_t n, bool final);

#endif
