/*
 * conn_guard.h - the open connections of an HTTP daemon (libmicrohttpd,
 * one thread per connection) and the deadline for receiving a request,
 * shared by the server (serve/) and the router (route/).
 *
 * The HTTP library bounds a connection's silence (its connection timeout)
 * but not its slowness: a client that sends one byte of a request every few
 * seconds would hold its connection, and its thread, forever. A conn_guard
 * registers every connection (the library's connection notices) and shuts
 * down the socket of one still receiving its request read_timeout seconds
 * after that request's first byte (conn_guard.c says how). Counts of
 * connections open, ever opened and shut down for the deadline are kept for
 * /metrics.
 *
 * Room under abuse. With max_open > 0, a connection that would make more
 * than max_open closes the oldest connection that has no whole request:
 * first one idle between requests or silent since it connected, then one
 * trickling a request; a connection with a request being answered is never
 * closed for room. Only when every other one has a request being answered
 * is the new connection itself closed. So idle, silent and slow clients,
 * from however many addresses, cannot lock out a client that sends its
 * request: the daemon's own connection limit is set somewhat above
 * max_open so that new connections reach this choice.
 *
 * Use: conn_guard_start before the daemon starts; pass conn_guard_notify
 * with the guard as MHD_OPTION_NOTIFY_CONNECTION; call conn_guard_received
 * when the access handler has a whole request and conn_guard_done when it
 * is answered (the request-completed notice); conn_guard_stop after the
 * daemon stopped. A guard with read_timeout <= 0 only counts.
 */
#ifndef LAMINA_CONN_GUARD_H
#define LAMINA_CONN_GUARD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <microhttpd.h>

typedef struct gconn gconn; /* one open connection (conn_guard.c) */

typedef struct {
    double read_timeout; /* seconds from a request's first byte to all of it; <= 0: none */
    pthread_mutex_t mu;  /* guards the list and every entry */
    pthread_cond_t cv;
    bool sync;       /* mu and cv are initialised */
    pthread_t guard; /* the read-deadline thread */
    bool guard_started;
    bool guard_stop; /* under mu */
    gconn *list;     /* open connections, newest first */
    int max_open;    /* connections kept open at most (0: the daemon's limit only) */
    int n_live;      /* under mu: registered and not shut down */
    atomic_uint_least64_t open, total, read_timeouts;
    atomic_uint_least64_t evictions, refused; /* closed for room: an old one, or the new one */
} conn_guard;

/* 0, or -1 with a message (no thread, no mutex). max_open <= 0: no
 * closing for room. */
int conn_guard_start(conn_guard *g, double read_timeout, int max_open, char *err, size_t errlen);
/* What the daemon's MHD_OPTION_CONNECTION_LIMIT should be for max_open. */
#define CONN_GUARD_DAEMON_LIMIT(max_open) ((unsigned)(max_open) + 64u)
void conn_guard_stop(conn_guard *g);
/* The library's connection-started and -closed notice (cls: the guard). */
void conn_guard_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                       enum MHD_ConnectionNotificationCode toe);
/* The access handler has the whole request: no read deadline while it is
 * answered. */
void conn_guard_received(conn_guard *g, struct MHD_Connection *conn);
/* The request is over: the next one's deadline starts at its first byte. */
void conn_guard_done(conn_guard *g, struct MHD_Connection *conn);

#endif
