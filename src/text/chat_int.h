/*
 * chat_int.h - what chat.c lends chat_tools.c (the renders of conversations
 * with tools): Python's str.strip() span, and the fixed system message a
 * ChatML template writes; and what chat_tools.c and chat_harmony.c lend
 * chat.c: the qwen3.5 and gpt-oss renderers, which write plain
 * conversations and those with tools alike.
 * Not used outside src/text/.
 */
#ifndef LAMINA_CHAT_INT_H
#define LAMINA_CHAT_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "base/strbuf.h"
#include "text/chat.h"

/* The span of s[0..n) left after Python's str.strip(): *start .. *start + *len. */
void chat_strip_span(const char *s, size_t n, size_t *start, size_t *len);

/* The fixed system message of a ChatML template text (Qwen2/2.5, SmolLM2),
 * decoded into *out (NUL-terminated when non-empty); false when the text has
 * none (or out->failed when memory ran out). */
bool chat_default_system(const char *template_text, strbuf *out);

/* tojson of a string: s as Python's json.dumps(ensure_ascii=False) writes
 * it, quotes included (chat_tools.c). */
void chat_put_pystr(strbuf *b, const char *s);

/* tojson of tool-call arguments: their JSON text re-printed as json.dumps
 * prints it, or, when it is not valid JSON, the text as a JSON string. */
void chat_put_args(strbuf *b, const char *args);

/* The qwen3.5 family (chat.h) over checked messages (roles system, user,
 * assistant, tool; contents not NULL; calls with names and arguments) and
 * n_tools tool objects as JSON text, appended to *b: 0, or -1 with a
 * message in err where the template raises (a system message after the
 * first, no user query, arguments that are not a JSON object). */
int chat_render_qwen35(const lm_chat_xmsg *m, int n, const char *const *tools, int n_tools, bool gen, strbuf *b,
                       char *err, size_t errlen);

/* The gpt-oss family (chat.h, chat_harmony.c) over checked messages, as
 * chat_render_qwen35, with the template inputs of opts (reasoning_effort,
 * date, model_identity; opts NULL or a field NULL: the template's defaults,
 * medium, today's date, its identity). -1 with a message in err where the
 * template raises. */
int chat_render_harmony(const lm_chat_xmsg *m, int n, const char *const *tools, int n_tools, const lm_chat_conv *opts,
                        bool gen, strbuf *b, char *err, size_t errlen);

#endif
