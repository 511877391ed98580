/*
 * json_gbnf.h - GBNF text for pieces of JSON (literals, JSON string
 * characters, integer ranges, patterns, formats); the building blocks of
 * json_schema.c. Everything appends to a strbuf (allocation failures set
 * its flag, which the caller checks).
 */
#ifndef LAMINA_JSON_GBNF_H
#define LAMINA_JSON_GBNF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/strbuf.h"

#define JGBNF_MAX_DEPTH 64    /* nesting of schemas and of pattern groups */
#define JGBNF_MAX_COUNT 10000 /* the largest repetition count accepted */

/* The fixed format rules, as bits for jgbnf_format_rules. */
enum { JGBNF_DATE = 1, JGBNF_TIME = 2, JGBNF_DATE_TIME = 4, JGBNF_UUID = 8, JGBNF_EMAIL = 16 };

/* Bytes as a GBNF literal "..." (quote, backslash, control bytes escaped). */
void jgbnf_lit(strbuf *b, const char *s, size_t n);
/* A code point inside a GBNF class [...]. */
void jgbnf_class_cp(strbuf *b, uint32_t cp);
/* The JSON string-content spelling of a code point, as a GBNF literal. */
void jgbnf_json_cp(strbuf *b, uint32_t cp);
/* Decode one UTF-8 code point (n bytes left): its length, 0 if malformed. */
int jgbnf_utf8(const char *s, size_t n, uint32_t *cp);
/* A repetition suffix {m,n} (n < 0: unbounded), shortest form. */
void jgbnf_repeat(strbuf *b, long m, long n);
/* An expression for the integers in [lo, hi]; a side without its has_
 * flag is unbounded (up to 16 digits). */
void jgbnf_int_range(strbuf *e, bool has_lo, int64_t lo, bool has_hi, int64_t hi);
/* The same for numbers: the integers in range and the decimals i.f whose
 * every value is in range (exponents not written). */
void jgbnf_num_range(strbuf *e, bool has_lo, int64_t lo, bool has_hi, int64_t hi);
/* A JSON string matching the pattern (search semantics), "\"" ... "\"".
 * Sets *any_char when the expression uses the rule "char". -1 with err
 * naming what is unsupported and its offset. */
int jgbnf_regex(strbuf *e, const char *pat, bool *any_char, char *err, size_t errlen);
/* The rules date, time, date-time, uuid, email selected by bits (JGBNF_*;
 * uuid refers to "hex", email is self-contained). */
void jgbnf_format_rules(strbuf *o, unsigned bits);

#endif
