/*
 * conn_guard.c - open connections and the deadline for receiving a request
 * (contract in conn_guard.h).
 *
 * The HTTP library bounds a connection's silence (--idle-timeout: no byte
 * in or out for that long closes it) but not its slowness: a client that
 * sends one byte of its headers or body every few seconds would hold its
 * connection, and its thread, forever. Here every connection is registered
 * (the library's connection-started and -closed notices) with its socket
 * and a state:
 *
 *   receiving  from the connection's start, and again after each answer,
 *              until the access handler has the whole request (headers,
 *              and body for the generation routes); the clock starts at
 *              the request's first byte, seen as a rise in the kernel's
 *              count of bytes received on the socket (TCP_INFO), so an
 *              idle kept-alive connection is left to the idle timeout;
 *   answering  from then until the request-completed notice: no deadline
 *              here (the request's own --timeout applies).
 *
 * A guard thread wakes a few times a second (at most read_timeout / 8
 * apart) and shuts down (shutdown(2), both ways) the socket of every
 * connection still receiving read_timeout seconds after its request's
 * first byte. The connection's own thread then reads end-of-file and the
 * library closes the connection as a client abort: a clean close, and the
 * request-completed callback frees what the request held.
 *
 * Invariants. mu guards the list and every gconn's fields. An
 * entry lives from the started notice to the closed notice, and the
 * library closes the socket only after the closed notice (daemon.c in
 * libmicrohttpd 0.9.75), so a socket the guard shuts down under mu is
 * never one reused by another connection. Without TCP_INFO's byte count
 * (kernels before 4.1) the clock starts at the connection's start or the
 * previous answer instead.
 */
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "serve/conn_guard.h"

#include "base/util.h"

struct gconn {
    struct gconn *prev, *next;
    int fd;
    bool receiving; /* no whole request yet (see the top of the file) */
    bool started;   /* receiving: the request's first byte is in */
    bool killed;    /* shut down by the guard */
    double t0;      /* started: when the first byte was seen */
    uint64_t base;  /* bytes received on the socket when receiving began */
};

/* Bytes the kernel has received on a TCP socket; false when it cannot say. */
static bool bytes_in(int fd, uint64_t *n) {
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return false;
    if (len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received) return false;
    *n = ti.tcpi_bytes_received;
    return true;
}

/* Start receiving a request: its clock starts at its first byte, the
 * first one received past sc->base. On a new connection that is any byte
 * (some may have come before the connection was accepted); after an answer,
 * a byte past what the socket had received by then. Under conn_mu. */
static void begin_receiving(gconn *sc, bool fresh) {
    sc->receiving = true;
    sc->started = !bytes_in(sc->fd, &sc->base);
    if (fresh) sc->base = 0;
    sc->t0 = lm_now();
}

static gconn *conn_of(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Shut down sc's socket (under mu): its thread reads end-of-file and the
 * library closes the connection. */
static void kill_conn(conn_guard *s, gconn *sc) {
    sc->killed = true;
    shutdown(sc->fd, SHUT_RDWR);
    if (s->max_open > 0) s->n_live--;
}

/* One connection past max_open (newest, just registered): close the oldest
 * that has no whole request - first one waiting for its next request or
 * silent since it connected, then one trickling a request - or, when every
 * other connection has a request being answered, the newest itself. Under
 * mu. */
static void make_room(conn_guard *s, gconn *newest) {
    gconn *idle = NULL, *slow = NULL, *last = s->list;
    while (last && last->next) last = last->next;
    for (gconn *c = last; c && (!idle || !slow); c = c->prev) { /* oldest first */
        if (c == newest || c->killed || !c->receiving) continue;
        if (!c->started && !idle) idle = c;
        else if (c->started && !slow) slow = c;
    }
    gconn *victim = idle ? idle : slow;
    if (victim) {
        kill_conn(s, victim);
        atomic_fetch_add(&s->evictions, 1);
    } else {
        kill_conn(s, newest);
        atomic_fetch_add(&s->refused, 1);
    }
}

void conn_guard_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                       enum MHD_ConnectionNotificationCode toe) {
    conn_guard *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        atomic_fetch_add(&s->total, 1);
        atomic_fetch_add(&s->open, 1);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        gconn *sc = ci ? lm_calloc(1, sizeof *sc) : NULL;
        *socket_context = sc;
        if (!sc) return; /* out of memory: the connection has the idle timeout only */
        sc->fd = ci->connect_fd;
        pthread_mutex_lock(&s->mu);
        begin_receiving(sc, true);
        sc->next = s->list;
        if (s->list) s->list->prev = sc;
        s->list = sc;
        if (s->max_open > 0 && ++s->n_live > s->max_open) make_room(s, sc);
        pthread_mutex_unlock(&s->mu);
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        atomic_fetch_sub(&s->open, 1);
        gconn *sc = *socket_context;
        *socket_context = NULL;
        if (!sc) return;
        pthread_mutex_lock(&s->mu);
        if (sc->prev) sc->prev->next = sc->next;
        else s->list = sc->next;
        if (sc->next) sc->next->prev = sc->prev;
        if (s->max_open > 0 && !sc->killed) s->n_live--;
        pthread_mutex_unlock(&s->mu);
        lm_free(sc);
    }
}

void conn_guard_received(conn_guard *s, struct MHD_Connection *conn) {
    gconn *sc = conn_of(conn);
    if (!sc) return;
    pthread_mutex_lock(&s->mu);
    sc->receiving = false;
    pthread_mutex_unlock(&s->mu);
}

void conn_guard_done(conn_guard *s, struct MHD_Connection *conn) {
    gconn *sc = conn_of(conn);
    if (!sc) return;
    pthread_mutex_lock(&s->mu);
    begin_receiving(sc, false);
    pthread_mutex_unlock(&s->mu);
}

/* One pass over the connections: start clocks, shut down the overdue. Under conn_mu. */
static void guard_pass(conn_guard *s, double now) {
    double limit = s->read_timeout;
    for (gconn *sc = s->list; sc; sc = sc->next) {
        if (!sc->receiving || sc->killed) continue;
        if (!sc->started) {
            uint64_t n;
            if (bytes_in(sc->fd, &n) && n == sc->base) continue; /* nothing of the next request yet */
            sc->started = true;
            sc->t0 = now;
            continue;
        }
        if (now - sc->t0 <= limit) continue;
        kill_conn(s, sc);
        atomic_fetch_add(&s->read_timeouts, 1);
    }
}

static void *guard_main(void *arg) {
    conn_guard *s = arg;
    double period = s->read_timeout / 8;
    if (period > 0.25) period = 0.25;
    if (period < 0.01) period = 0.01;
    pthread_mutex_lock(&s->mu);
    while (!s->guard_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ns = ts.tv_nsec + (long)(period * 1e9);
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        if (!s->guard_stop) guard_pass(s, lm_now());
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int conn_guard_start(conn_guard *s, double read_timeout, int max_open, char *err, size_t errlen) {
    s->read_timeout = read_timeout;
    s->max_open = max_open;
    if (pthread_mutex_init(&s->mu, NULL)) return lm_err(err, errlen, "cannot create a mutex");
    if (pthread_cond_init(&s->cv, NULL)) {
        pthread_mutex_destroy(&s->mu);
        return lm_err(err, errlen, "cannot create a condition variable");
    }
    s->sync = true;
    if (read_timeout > 0) {
        int rc = pthread_create(&s->guard, NULL, guard_main, s);
        if (rc) return lm_err(err, errlen, "cannot start the connection guard: %s", strerror(rc));
        s->guard_started = true;
    }
    return 0;
}

void conn_guard_stop(conn_guard *s) {
    if (!s->sync) return;
    if (s->guard_started) {
        pthread_mutex_lock(&s->mu);
        s->guard_stop = true;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->guard, NULL);
        s->guard_started = false;
    }
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    s->sync = false;
}
