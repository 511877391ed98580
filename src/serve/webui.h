/*
 * webui.h - the chat page `lamina serve` answers at / (webui.c): files of
 * src/serve/webui/ embedded into the binary at build time. The Makefile runs
 * scripts/embed_webui.py over that folder and compiles the table it writes
 * (build/gen/webui_assets.c), so the page needs nothing at run time: no
 * files, no network. Not a public header: the contract is server.h.
 */
#ifndef LAMINA_WEBUI_H
#define LAMINA_WEBUI_H

#include <stddef.h>

struct MHD_Connection;
typedef struct lm_server lm_server;

/* One embedded file: its URL path ("/" for index.html), its media type and
 * its bytes (len of them, not NUL-terminated). */
typedef struct {
    const char *path;
    const char *ctype;
    const unsigned char *data;
    size_t len;
} srv_asset;

/* The table the build generates, n_srv_assets entries. */
extern const srv_asset srv_assets[];
extern const int n_srv_assets;

/* The embedded file served at url, or NULL when url names none. */
const srv_asset *webui_find(const char *url);
/* Answer 200 with the file and the page's security headers (a Content-
 * Security-Policy allowing only the page's own script, style and API,
 * nosniff, no framing, no referrer). Returns the MHD_Result. */
int webui_respond(lm_server *s, struct MHD_Connection *conn, const srv_asset *a);

#endif
