/*
 * utf8.c - UTF-8 validation and encoding (see utf8.h for the rules).
 */
#include "base/utf8.h"

bool utf8_valid(const char *str, size_t len) {
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < len;) {
        if (s[i] < 0x80) { /* the common case, without the call */
            i++;
            continue;
        }
        int l = utf8_seq(s + i, len - i);
        if (l <= 0) return false;
        i += (size_t)l;
    }
    return true;
}

int utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp >= 0xD800 && cp < 0xE000) return 0;
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp < 0x110000) {
        out[0] = (char)(0xF0 | (cp >> 18));
        out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[3] = (char)(0x80 | (cp & 0x3F));
        return 4;
    }
    return 0;
}
