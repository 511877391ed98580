/*
 * server_error.c - the error every request-side file of the server fills:
 * lm_server_error (server.h), an HTTP status with OpenAI's error fields.
 *
 * A leaf: it calls nothing of the server, so server_parse.c, server_tools.c,
 * server_embed.c and server_gen.c all use it without depending on one
 * another. It also holds the two helpers those parsers share (server_int.h):
 * an optional JSON field (srv_field) and the parse's out-of-memory answer
 * (srv_oom).
 */
#include <stdarg.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "serve/server.h"
#include "serve/server_int.h"

int server_error(lm_server_error *e, int status, const char *type, const char *param, const char *code, const char *fmt,
                 ...) {
    if (!e) return -1;
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type ? type : "invalid_request_error");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

const cJSON *srv_field(const cJSON *obj, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

int srv_oom(lm_server_error *e) {
    return server_error(e, 500, "server_error", NULL, NULL, "out of memory while parsing the request");
}
