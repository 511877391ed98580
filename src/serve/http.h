/*
 * http.h - the server's HTTP answers (http.c): a body with its status, an
 * OpenAI error object, and whether the client has gone. Every answer the
 * server queues goes through srv_respond, which counts it by status for
 * /metrics. Not a public header: the contract is server.h.
 */
#ifndef LAMINA_HTTP_H
#define LAMINA_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include "serve/server.h"

struct MHD_Connection;

/* Queue a response with its status and content type (and one more header
 * when hdr is not NULL), counting it. Returns the MHD_Result. */
int srv_respond(lm_server *s, struct MHD_Connection *conn, int status, const char *ctype, const char *body, size_t len,
                const char *hdr, const char *hdr_val);
/* The error object {"error": {...}} as a response with e->status. */
int srv_respond_error(lm_server *s, struct MHD_Connection *conn, const lm_server_error *e);
/* The same in one call: status, type, code, an extra header, and the message. */
int srv_respond_errf(lm_server *s, struct MHD_Connection *conn, int status, const char *type, const char *code,
                     const char *hdr, const char *hdr_val, const char *fmt, ...) __attribute__((format(printf, 8, 9)));
/* The error object as a JSON string (lm_malloc'ed, NULL when out of memory). */
char *srv_error_json(const lm_server_error *e);
/* Whether the connection's peer has closed its side. */
bool srv_peer_gone(struct MHD_Connection *conn);

#endif
