/*
 * webui.c - the chat page at / of `lamina serve`: looks up the files the
 * build embedded (webui.h) and answers them with the page's security
 * headers.
 *
 * The policy: the page runs only the script served from this origin
 * (/webui.js; no inline script, no eval), loads only its own style sheet,
 * talks only to this origin (the /v1 routes), cannot be framed, and sends
 * no referrer. Model text reaches the page as JSON and is only ever put into
 * the document as text nodes (webui.js), so even an injected <script> stays
 * text, and the policy is the second wall. The files are static: their
 * buffers are the embedded arrays themselves, never copied or freed.
 */
#include <stdatomic.h>
#include <string.h>

#include <microhttpd.h>

#include "serve/server_int.h"
#include "serve/webui.h"

static const char csp[] = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                          "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const srv_asset *webui_find(const char *url) {
    for (int i = 0; i < n_srv_assets; i++)
        if (!strcmp(url, srv_assets[i].path)) return &srv_assets[i];
    return NULL;
}

int webui_respond(lm_server *s, struct MHD_Connection *conn, const srv_asset *a) {
    struct MHD_Response *r = MHD_create_response_from_buffer(a->len, (void *)a->data, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", a->ctype);
    MHD_add_response_header(r, "Content-Security-Policy", csp);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(conn, 200, r);
    MHD_destroy_response(r);
    if (ret == MHD_YES) atomic_fetch_add(&s->http_status[200], 1);
    return ret;
}
