/*
 * json_schema.h - JSON Schema to GBNF: the grammar of the JSON texts a
 * schema accepts, for constrained decoding (structured outputs, tool-call
 * arguments).
 *
 * Supported: type (object, array, string, number, integer, boolean, null,
 * and lists of types), properties, required, additionalProperties (false,
 * true or a schema), items, prefixItems, minItems, maxItems, enum, const,
 * anyOf, oneOf, allOf (where it can be expressed), $ref into $defs or
 * definitions (recursive schemas too), minLength, maxLength, minimum and
 * maximum for integers, pattern (a regular-expression subset compiled to
 * grammar rules), format (date, time, date-time, uuid, email). Annotation
 * keywords ($schema, $id, title, description, examples, default, ...) are
 * ignored. Any other keyword is refused with an error that names it and
 * where it is (a JSON pointer), never silently ignored.
 *
 * The grammar fixes property order (properties' order in the schema,
 * required ones first is not assumed) and bounds whitespace between JSON
 * tokens, so a model cannot loop on blanks.
 */
#ifndef LAMINA_JSON_SCHEMA_H
#define LAMINA_JSON_SCHEMA_H

#include <stddef.h>

#include "lamina.h"

/* The GBNF text (root rule "root") for the schema in json (len bytes), to
 * free with lm_free; NULL with err on a schema that is not valid JSON, not
 * a schema, or uses an unsupported keyword. */
char *json_schema_to_gbnf(const char *json, size_t len, char *err, size_t errlen);

/* The GBNF text for any JSON object ({"type": "json_object"}). */
char *json_schema_any_object_gbnf(void);

#endif
