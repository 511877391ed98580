/*
 * test_base.c - the text helpers of src/base shared by every layer:
 *   - utf8_seq / utf8_valid against a reference decoder written from the
 *     definition (decode the code point, then reject overlongs, surrogates
 *     and values past U+10FFFF), on every sequence of one to three bytes and
 *     on every four-byte sequence with a given lead and second byte;
 *   - utf8_encode: every code point encodes to what utf8_seq decodes back,
 *     and surrogates and values past U+10FFFF are refused;
 *   - strbuf: appends, printf past its small buffer, U+FFFD replacement of
 *     malformed bytes and NUL, the incomplete tail kept or replaced, and an
 *     allocation failure that sticks until the buffer is freed.
 */
#include <string.h>

#include "base/strbuf.h"
#include "base/utf8.h"
#include "base/util.h"
#include "test.h"

/* The reference: length of the well-formed character at s (n bytes), 0 if
 * cut off while still well formed so far, -1 if malformed. */
static int ref_seq(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    int len;
    uint32_t cp;
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07;
    else return -1;
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    for (int k = 1; k < len; k++) {
        if ((size_t)k >= n) {
            /* cut off: well formed so far when some completion is valid */
            for (uint32_t lo = 0; lo < 64; lo++) {
                unsigned char t[4];
                memcpy(t, s, (size_t)k);
                for (int j = k; j < len; j++) t[j] = (unsigned char)(0x80 | (j == k ? lo : 0x3F * (lo & 1)));
                if (ref_seq(t, (size_t)len) > 0) return 0;
                for (int j = k; j < len; j++) t[j] = (unsigned char)(0x80 | (j == k ? lo : 0));
                if (ref_seq(t, (size_t)len) > 0) return 0;
            }
            return -1;
        }
        if ((s[k] & 0xC0) != 0x80) return -1;
        cp = cp << 6 | (s[k] & 0x3F);
    }
    if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
    return len;
}

/* Malformedness found at the first bad byte: the reference may see a bad
 * later byte only once the earlier ones are checked, so compare validity
 * and length, and for cut-off sequences the 0. */
static bool agree(const unsigned char *s, size_t n) {
    int a = utf8_seq(s, n), b = ref_seq(s, n);
    return a == b || (a < 0 && b < 0);
}

static void test_utf8_seq(void) {
    unsigned char s[4];
    for (int a = 0; a < 256; a++) {
        s[0] = (unsigned char)a;
        CHECKF(agree(s, 1), "%02x", a);
        for (int b = 0; b < 256; b++) {
            s[1] = (unsigned char)b;
            CHECKF(agree(s, 2), "%02x %02x", a, b);
            if (a < 0xE0) continue;
            for (int c = 0; c < 256; c++) {
                s[2] = (unsigned char)c;
                CHECKF(agree(s, 3), "%02x %02x %02x", a, b, c);
            }
        }
    }
    static const unsigned char leads[5][2] = {{0xF0, 0x90}, {0xF0, 0x8F}, {0xF4, 0x8F}, {0xF4, 0x90}, {0xF2, 0xBF}};
    for (int l = 0; l < 5; l++)
        for (int c = 0; c < 256; c++)
            for (int d = 0; d < 256; d++) {
                unsigned char t[4] = {leads[l][0], leads[l][1], (unsigned char)c, (unsigned char)d};
                CHECKF(agree(t, 4), "%02x %02x %02x %02x", t[0], t[1], c, d);
            }
    /* utf8_valid over whole texts */
    CHECK(utf8_valid("", 0));
    CHECK(utf8_valid("abc \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 15));
    CHECK(!utf8_valid("ab\xc3", 3));
    CHECK(!utf8_valid("\xed\xa0\x80", 3));
    CHECK(!utf8_valid("a\x80", 2));
}

static void test_utf8_encode(void) {
    char u[4];
    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        int n = utf8_encode(cp, u);
        if (cp >= 0xD800 && cp <= 0xDFFF) {
            CHECK(n == 0);
            continue;
        }
        CHECKF(n == (cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4), "U+%04X: %d bytes", cp, n);
        CHECKF(utf8_seq((const unsigned char *)u, (size_t)n) == n, "U+%04X does not decode", cp);
        uint32_t back = n == 1 ? (uint32_t)u[0] : (uint32_t)(u[0] & (0x7F >> n));
        for (int k = 1; k < n; k++) back = back << 6 | (uint32_t)(u[k] & 0x3F);
        CHECKF(back == cp, "U+%04X decodes to U+%04X", cp, back);
    }
    CHECK(utf8_encode(0x110000, u) == 0 && utf8_encode(0xFFFFFFFF, u) == 0);
}

static void test_strbuf(void) {
    strbuf b = {0};
    strbuf_puts(&b, "abc");
    strbuf_put(&b, "de", 2);
    strbuf_puts(&b, NULL);
    CHECK(b.len == 5 && !strcmp(b.p, "abcde") && !b.failed);
    char big[2000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    strbuf_printf(&b, "[%s|%d]", big, 42);
    CHECK(b.len == 5 + 1 + 1999 + 4 && !memcmp(b.p + b.len - 4, "|42]", 4) && b.p[b.len] == 0);
    strbuf_free(&b);
    CHECK(!b.p && !b.len && !b.cap && !b.failed);
    /* U+FFFD for malformed bytes and NUL; an incomplete tail waits unless final */
    const char in[] = "a\x80"
                      "b\0c\xe2\x82";
    size_t used = strbuf_put_utf8(&b, in, sizeof in - 1, false);
    CHECK(used == sizeof in - 1 - 2);
    CHECK(b.len == 1 + 3 + 1 + 3 + 1 &&
          !memcmp(b.p,
                  "a\xef\xbf\xbd"
                  "b\xef\xbf\xbd"
                  "c",
                  b.len));
    used = strbuf_put_utf8(&b, in + used, 2, true);
    CHECK(used == 2 && b.len == 9 + 6); /* E2 82 cut off: each byte replaced */
    strbuf_free(&b);
    /* a failed allocation sticks: later appends do nothing */
    lm_alloc_fail_after(0);
    strbuf_puts(&b, "x");
    lm_alloc_fail_after(-1);
    CHECK(b.failed && !b.p && b.len == 0);
    strbuf_puts(&b, "y");
    CHECK(b.failed && b.len == 0);
    strbuf_free(&b);
    CHECK(!b.failed);
    strbuf_puts(&b, "y");
    CHECK(!b.failed && b.len == 1);
    strbuf_free(&b);
}

int main(void) {
    TEST_RUN(test_utf8_seq);
    TEST_RUN(test_utf8_encode);
    TEST_RUN(test_strbuf);
    return TEST_DONE();
}
