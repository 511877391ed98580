/*
 * wpm.c - WordPiece normalization and word split (see wpm.h).
 *
 * One pass over the code points, llama.cpp's order: decompose and drop the
 * marks (strip_accents), then whitespace, dropped characters, lowercasing,
 * one-character words, the rest joined. The tables (wpm_tables.h) are
 * sorted ranges searched by bisection; code points above the Basic
 * Multilingual Plane are letters of a word unless they are CJK ideographs.
 */
#include "text/wpm.h"

#include <stdint.h>
#include <string.h>

#include "text/wpm_tables.h"
#include "base/utf8.h"

#define N_OF(a) (sizeof(a) / sizeof *(a))

/* Whether cp lies in one of n sorted closed ranges. */
static bool in_ranges(const uint16_t (*r)[2], size_t n, uint32_t cp) {
    if (cp > 0xFFFF) return false;
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid][0]) hi = mid;
        else if (cp > r[mid][1]) lo = mid + 1;
        else return true;
    }
    return false;
}

/* The first code point of cp's canonical decomposition when the rest are
 * marks (dropped anyway), else cp. */
static uint32_t base_of(uint32_t cp) {
    if (cp < 0xC0 || cp > 0xFFFF) return cp;
    size_t lo = 0, hi = N_OF(WPM_BASE);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < WPM_BASE[mid][0]) hi = mid;
        else if (cp > WPM_BASE[mid][0]) lo = mid + 1;
        else return WPM_BASE[mid][1];
    }
    return cp;
}

static uint32_t lower(uint32_t cp) {
    if (cp < 0x80) return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
    for (size_t i = 0; i < N_OF(WPM_LOWER) && (int32_t)cp >= WPM_LOWER[i][0]; i++)
        if ((int32_t)cp <= WPM_LOWER[i][1] && ((int32_t)cp - WPM_LOWER[i][0]) % WPM_LOWER[i][2] == 0)
            return (uint32_t)((int32_t)cp + WPM_LOWER[i][3]);
    return cp;
}

static bool is_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
        (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

static bool is_cjk(uint32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
        (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
        (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

/* One character alone in its word: punctuation, an ASCII symbol, CJK. */
static bool is_single(uint32_t cp) {
    if (cp < 0x80 && strchr("$+<=>^`|~", (int)cp)) return true;
    return in_ranges(WPM_PUNCT, N_OF(WPM_PUNCT), cp) || is_cjk(cp);
}

size_t wpm_out_cap(size_t len) { return 8 * len + 8; }

typedef struct {
    char *out;
    size_t n;
    bool open; /* a word has been started (its prefix written) */
} words;

static void word_end(words *w) {
    if (w->open) w->out[w->n++] = '\0';
    w->open = false;
}

static void word_put(words *w, uint32_t cp) {
    if (!w->open) {
        memcpy(w->out + w->n, "\xE2\x96\x81", 3);
        w->n += 3;
        w->open = true;
    }
    w->n += (size_t)utf8_encode(cp, w->out + w->n);
}

size_t wpm_words(const char *text, size_t len, bool lowercase, bool strip_accents, char *out) {
    words w = {out, 0, false};
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        int n = utf8_seq(s + i, len - i);
        if (n <= 0) { /* an invalid or cut-off byte: dropped */
            i++;
            continue;
        }
        uint32_t cp = n == 1 ? s[i]
            : n == 2         ? (uint32_t)(s[i] & 0x1F) << 6 | (s[i + 1] & 0x3F)
            : n == 3         ? (uint32_t)(s[i] & 0x0F) << 12 | (uint32_t)(s[i + 1] & 0x3F) << 6 | (s[i + 2] & 0x3F)
                             : (uint32_t)(s[i] & 0x07) << 18 | (uint32_t)(s[i + 1] & 0x3F) << 12 |
                (uint32_t)(s[i + 2] & 0x3F) << 6 | (s[i + 3] & 0x3F);
        i += (size_t)n;
        if (strip_accents) cp = base_of(cp);
        if (is_space(cp)) {
            word_end(&w);
            continue;
        }
        if (cp == 0 || cp == 0xFFFD || in_ranges(WPM_CTRL, N_OF(WPM_CTRL), cp)) continue;
        if (strip_accents && in_ranges(WPM_MARKS, N_OF(WPM_MARKS), cp)) continue;
        if (lowercase) cp = lower(cp);
        if (is_single(cp)) {
            word_end(&w);
            word_put(&w, cp);
            word_end(&w);
        } else {
            word_put(&w, cp);
        }
    }
    word_end(&w);
    return w.n;
}
