/*
 * wpm.h - the normalization and word split of BERT's WordPiece tokenizer
 * (tokenizer.ggml.model "bert"), as llama.cpp's WPM tokenizer does it; the
 * longest-match of each word against the vocabulary is tokenizer.c's.
 *
 * The text is read as UTF-8 code points (an invalid byte is dropped) and:
 *   - with strip_accents, each code point is decomposed (NFD) and the
 *     combining marks (\p{M}) are dropped;
 *   - whitespace ends a word; NUL, U+FFFD and control characters (\p{C})
 *     are dropped;
 *   - with lowercase, each code point is lowercased;
 *   - punctuation (\p{P}), ASCII symbols ($ + < = > ^ ` | ~) and CJK
 *     ideographs are words of one character each;
 *   - every other code point joins the current word.
 * Each word is written prefixed with U+2581 (the GGUF vocabulary's mark of
 * a word's first piece; "##" continuations are stored bare) and ended by a
 * NUL byte.
 *
 * Bounds of the Unicode knowledge (tables of our own, not the whole UCD):
 * decomposition and lowercasing cover Latin-1, Latin Extended-A and
 * Additional, Greek, Cyrillic, Armenian and the fullwidth Latin letters;
 * marks, punctuation, whitespace and controls are the common blocks'
 * (Latin, Greek, Cyrillic, Hebrew, Arabic, Devanagari, general and CJK
 * punctuation, combining blocks). Text outside them is kept as it is.
 */
#ifndef LAMINA_WPM_H
#define LAMINA_WPM_H

#include <stdbool.h>
#include <stddef.h>

/* Bytes of out a text of len bytes may need (every code point a word of
 * its own, prefixed and ended). */
size_t wpm_out_cap(size_t len);
/* The words of text into out (wpm_out_cap(len) bytes), each "\xE2\x96\x81"
 * word "\0"; returns the bytes written. */
size_t wpm_words(const char *text, size_t len, bool lowercase, bool strip_accents, char *out);

#endif
