/*
 * utf8.h - UTF-8 as lamina reads and writes it, in one place: which bytes
 * start a character, how long it is, whether a text is well formed, and
 * code points to bytes.
 *
 * Well formed means RFC 3629: no overlong forms, no surrogates (U+D800 ..
 * U+DFFF), nothing past U+10FFFF. The rules live in the lead byte: it fixes
 * the length and the range of the second byte (E0: A0..BF, ED: 80..9F,
 * F0: 90..BF, F4: 80..8F, otherwise 80..BF); later bytes are 80..BF.
 * utf8_lead and utf8_seq are inline: the tokenizer calls them per character.
 */
#ifndef LAMINA_UTF8_H
#define LAMINA_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bytes of the character lead byte c starts (1 .. 4), with the allowed
 * range of its second byte in *lo, *hi; 0 when c cannot start one (a
 * continuation byte, C0, C1, F5 .. FF). */
static inline int utf8_lead(unsigned char c, unsigned char *lo, unsigned char *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) {
        if (c == 0xE0) *lo = 0xA0;
        if (c == 0xED) *hi = 0x9F;
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (c == 0xF0) *lo = 0x90;
        if (c == 0xF4) *hi = 0x8F;
        return 4;
    }
    return 0;
}

/* The character at s, n >= 1 bytes readable: its length (> 0) when it is
 * complete and well formed, 0 when it is a well-formed start cut off by the
 * end, -1 when it is malformed (drop or replace one byte and go on). */
static inline int utf8_seq(const unsigned char *s, size_t n) {
    unsigned char lo, hi;
    int len = utf8_lead(s[0], &lo, &hi);
    if (len == 0) return -1;
    for (int k = 1; k < len; k++) {
        if ((size_t)k >= n) return 0;
        if (s[k] < lo || s[k] > hi) return -1;
        lo = 0x80, hi = 0xBF; /* only the second byte has a narrowed range */
    }
    return len;
}

/* Whether len bytes are well-formed UTF-8 (an incomplete tail is not). */
bool utf8_valid(const char *s, size_t len);

/* Code point cp as UTF-8 into out (4 bytes of room): the byte count, or 0
 * for a surrogate or a value past U+10FFFF. */
int utf8_encode(uint32_t cp, char *out);

#endif
