/*
 * http.c - HTTP answers of the server: a body with its status (counted for
 * /metrics), OpenAI's error object, and whether a client is still there.
 * Shared by the routing (server.c) and generation (server_gen.c) files, and
 * depending on neither.
 */
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "base/strbuf.h"
#include "base/util.h"
#include "serve/http.h"
#include "serve/server_int.h"

int srv_respond(lm_server *s, struct MHD_Connection *conn, int status, const char *ctype, const char *body, size_t len,
                const char *hdr, const char *hdr_val) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    if (hdr) MHD_add_response_header(r, hdr, hdr_val);
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    if (ret == MHD_YES && status > 0 && status < SRV_STATUS_MAX) atomic_fetch_add(&s->http_status[status], 1);
    return ret;
}

char *srv_error_json(const lm_server_error *e) {
    cJSON *o = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(o, "error");
    strbuf msg = {0};
    strbuf_put_utf8(&msg, e->message, strlen(e->message), true);
    cJSON_AddStringToObject(err, "message", msg.p ? msg.p : "");
    strbuf_free(&msg);
    cJSON_AddStringToObject(err, "type", e->type[0] ? e->type : "invalid_request_error");
    if (e->param[0]) cJSON_AddStringToObject(err, "param", e->param);
    else cJSON_AddNullToObject(err, "param");
    if (e->code[0]) cJSON_AddStringToObject(err, "code", e->code);
    else cJSON_AddNullToObject(err, "code");
    char *p = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return p; /* cJSON allocates through lm_malloc (server_parse.c's hooks) */
}

int srv_respond_error(lm_server *s, struct MHD_Connection *conn, const lm_server_error *e) {
    char *j = srv_error_json(e);
    static const char fallback[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                                   "\"param\":null,\"code\":null}}";
    int ret = srv_respond(s, conn, e->status, "application/json", j ? j : fallback, j ? strlen(j) : strlen(fallback),
                          NULL, NULL);
    lm_free(j);
    return ret;
}

int srv_respond_errf(lm_server *s, struct MHD_Connection *conn, int status, const char *type, const char *code,
                     const char *hdr, const char *hdr_val, const char *fmt, ...) {
    lm_server_error e;
    server_error(&e, status, type, NULL, code, "%s", "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    char *j = srv_error_json(&e);
    int ret = srv_respond(s, conn, status, "application/json", j ? j : "{}", j ? strlen(j) : 2, hdr, hdr_val);
    lm_free(j);
    return ret;
}

bool srv_peer_gone(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}
