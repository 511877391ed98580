/*
 * strbuf.c - the growable byte string (see strbuf.h). Capacity doubles from
 * 256 bytes, so n appends cost O(total bytes).
 */
#include "base/strbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/utf8.h"
#include "base/util.h"

void strbuf_put(strbuf *b, const void *s, size_t n) {
    if (b->failed || n == 0) return;
    if (n > SIZE_MAX / 2 - b->len) {
        b->failed = true;
        return;
    }
    size_t need = b->len + n + 1;
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need) cap *= 2;
        char *p = lm_realloc(b->p, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void strbuf_puts(strbuf *b, const char *s) {
    if (s) strbuf_put(b, s, strlen(s));
}

void strbuf_printf(strbuf *b, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = true;
        return;
    }
    if ((size_t)n < sizeof small) {
        strbuf_put(b, small, (size_t)n);
        return;
    }
    char *big = lm_malloc((size_t)n + 1);
    if (!big) {
        b->failed = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    strbuf_put(b, big, (size_t)n);
    lm_free(big);
}

void strbuf_free(strbuf *b) {
    lm_free(b->p);
    memset(b, 0, sizeof *b);
}

size_t strbuf_put_utf8(strbuf *b, const char *str, size_t n, bool final) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        int len = utf8_seq(s + i, n - i);
        if (len == 0 && !final) break;
        if (len <= 0 || s[i] == 0) {
            strbuf_put(b, "\xef\xbf\xbd", 3);
            i++;
        } else {
            strbuf_put(b, s + i, (size_t)len);
            i += (size_t)len;
        }
    }
    return i;
}
