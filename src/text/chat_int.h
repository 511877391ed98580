/*
 * chat_int.h - what chat.c lends chat_tools.c (the renders of conversations
 * with tools): Python's str.strip() span, and the fixed system message a
 * ChatML template writes. Not used outside src/text/.
 */
#ifndef LAMINA_CHAT_INT_H
#define LAMINA_CHAT_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "base/strbuf.h"

/* The span of s[0..n) left after Python's str.strip(): *start .. *start + *len. */
void chat_strip_span(const char *s, size_t n, size_t *start, size_t *len);

/* The fixed system message of a ChatML template text (Qwen2/2.5, SmolLM2),
 * decoded into *out (NUL-terminated when non-empty); false when the text has
 * none (or out->failed when memory ran out). */
bool chat_default_system(const char *template_text, strbuf *out);

#endif
