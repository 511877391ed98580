/*
 * cmd_trace.c - `lamina trace FILE`: read a concurrency trace written by
 * `lamina route --trace FILE` and say where concurrency was lost between
 * the clients and the engines, then draw it (an SVG of queue depth per hop
 * over time).
 *
 * The trace (route.c) is JSON lines: one "start" line, "sample" lines (every
 * poll: the router's queue, and per replica its in-flight count and limit
 * at the router and the running and waiting counts and mean batch its
 * engine reported), and one "req" line per request (arrive, admit, send,
 * engine_admit, first byte, done, seconds since the router started;
 * engine_admit, when the replica reported its engine's queue time, is the
 * send plus that time, else null).
 *
 * The summary averages each hop over the time requests were present: the
 * clients' concurrency (requests between arrival and done, from the req
 * lines), what the router held in its queue, what it had in flight at each
 * replica, what each engine ran and kept waiting, and its mean batch. The
 * hop where the count falls most is named as the one that lost concurrency.
 * Where the replicas reported their engines' queue times, the requests
 * waiting inside the engines are counted from those (Little's law: the sum
 * of the waits over the span) rather than from the sampled waiting counts,
 * and the verdict weighs the time held at the router against the time
 * queued inside the engines.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/safefile.h"
#include "cli.h"
#include "route/route.h"
#include "base/util.h"

static void usage_trace(FILE *f) {
    fprintf(f,
            "usage: lamina trace FILE [--svg OUT.svg]\n"
            "Summarize a concurrency trace from `lamina route --trace FILE`: where requests waited and\n"
            "how much concurrency reached the engines; draw queue depth per hop over time\n"
            "(default OUT: FILE.svg).\n");
}

typedef struct {
    double t, queue;
    int n;
    double inflight[RT_MAX_REPLICAS], running[RT_MAX_REPLICAS], waiting[RT_MAX_REPLICAS], batch[RT_MAX_REPLICAS];
} sample;

typedef struct {
    double arrive, admit, send, engine_admit, first, done; /* engine_admit -1: the replica did not say */
    int replica, status, error;
} req;

static double num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p) {
    if (!n) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[(int)lround(p * (n - 1))];
}

/* One polyline of the SVG: y values over the samples' times. */
static void poly(FILE *f, const sample *s, int ns, int which, int rep, double t_max, double y_max, const char *color,
                 double x0, double w, double y0, double h) {
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", color);
    for (int i = 0; i < ns; i++) {
        double v = which == 0 ? s[i].queue
            : which == 1      ? s[i].inflight[rep]
            : which == 2      ? s[i].running[rep]
                              : s[i].waiting[rep];
        if (v < 0) v = 0;
        fprintf(f, "%.1f,%.1f ", x0 + w * s[i].t / t_max, y0 + h - h * v / y_max);
    }
    fputs("\"/>\n", f);
}

/* Through the output guard (base/safefile.h): never onto the trace it read. */
static void write_svg(const char *path, const sample *s, int ns, int n_rep, double t_max) {
    char err[LM_ERRLEN];
    safefile *sf = safefile_create(path, err, sizeof err);
    if (!sf) fail("trace", err);
    FILE *f = safefile_stream(sf);
    double y_max = 1;
    for (int i = 0; i < ns; i++) {
        if (s[i].queue > y_max) y_max = s[i].queue;
        for (int r = 0; r < n_rep; r++) {
            y_max = fmax(y_max, s[i].inflight[r]);
            y_max = fmax(y_max, s[i].running[r]);
            y_max = fmax(y_max, s[i].waiting[r]);
        }
    }
    if (t_max <= 0) t_max = 1;
    const double W = 900, x0 = 60, y0 = 20, w = 640, h = 300;
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
            "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, y0 + h + 50);
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", x0, y0 + h, x0 + w,
            y0 + h);
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", x0, y0, x0, y0 + h);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">%.0f</text>\n<text x=\"%.0f\" y=\"%.0f\">0</text>\n", x0 - 40, y0 + 10,
            y_max, x0 - 20, y0 + h);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">0 s</text>\n<text x=\"%.0f\" y=\"%.0f\">%.1f s</text>\n", x0, y0 + h + 20,
            x0 + w - 40, y0 + h + 20, t_max);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">requests at each hop over time</text>\n", x0 + 200, y0 + h + 40);
    static const char *colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"};
    int line = 0;
    poly(f, s, ns, 0, 0, t_max, y_max, "black", x0, w, y0, h);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" fill=\"black\">router queue</text>\n", x0 + w + 10, y0 + 15.0 * ++line);
    static const char *what[] = {"", "in flight", "engine running", "engine waiting"};
    static const char *dash[] = {"", "", "4,2", "1,2"};
    for (int r = 0; r < n_rep && r < 6; r++)
        for (int k = 1; k <= 3; k++) {
            fprintf(f, "<g stroke-dasharray=\"%s\">", dash[k]);
            poly(f, s, ns, k, r, t_max, y_max, colors[r], x0, w, y0, h);
            fputs("</g>\n", f);
            fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" fill=\"%s\">replica %d %s%s</text>\n", x0 + w + 10,
                    y0 + 15.0 * ++line, colors[r], r, what[k],
                    k == 2       ? " (dashed)"
                        : k == 3 ? " (dotted)"
                                 : "");
        }
    fputs("</svg>\n", f);
    if (safefile_commit(sf, err, sizeof err)) fail("trace", err);
}

/* The trace's samples and request lines (malloc'ed arrays); lines of
 * other kinds or not JSON are skipped. */
static void read_trace(const char *path, sample **s_out, int *ns_out, req **q_out, int *nq_out, int *n_rep_out) {
    FILE *f = fopen(path, "r");
    if (!f) fail("trace", "cannot read the trace file");
    safefile_note_input(path);
    sample *s = NULL;
    req *q = NULL;
    int ns = 0, nq = 0, cap_s = 0, cap_q = 0, n_rep = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) > 0) {
        cJSON *o = cJSON_ParseWithLength(line, (size_t)len);
        const cJSON *kind = cJSON_GetObjectItemCaseSensitive(o, "kind");
        if (!cJSON_IsString(kind)) {
            cJSON_Delete(o);
            continue;
        }
        if (!strcmp(kind->valuestring, "sample")) {
            if (ns == cap_s && !(s = realloc(s, (size_t)(cap_s = cap_s ? 2 * cap_s : 256) * sizeof *s)))
                fail("trace", "out of memory");
            sample *p = &s[ns++];
            memset(p, 0, sizeof *p);
            p->t = num(o, "t");
            p->queue = num(o, "queue");
            const cJSON *reps = cJSON_GetObjectItemCaseSensitive(o, "replicas"), *r;
            cJSON_ArrayForEach(r, reps) {
                if (p->n >= RT_MAX_REPLICAS) break;
                p->inflight[p->n] = num(r, "inflight");
                p->running[p->n] = num(r, "running");
                p->waiting[p->n] = num(r, "waiting");
                p->batch[p->n] = num(r, "batch");
                p->n++;
            }
            if (p->n > n_rep) n_rep = p->n;
        } else if (!strcmp(kind->valuestring, "req")) {
            if (nq == cap_q && !(q = realloc(q, (size_t)(cap_q = cap_q ? 2 * cap_q : 256) * sizeof *q)))
                fail("trace", "out of memory");
            req *p = &q[nq++];
            p->arrive = num(o, "arrive");
            p->admit = num(o, "admit");
            p->send = num(o, "send");
            p->engine_admit = num(o, "engine_admit");
            p->first = num(o, "first");
            p->done = num(o, "done");
            p->replica = (int)num(o, "replica");
            p->status = (int)num(o, "status");
            p->error = (int)num(o, "error");
        }
        cJSON_Delete(o);
    }
    free(line);
    fclose(f);
    *s_out = s, *ns_out = ns, *q_out = q, *nq_out = nq, *n_rep_out = n_rep;
}

int cmd_trace(int argc, char **argv) {
    args a = {argc, argv, 0, "trace", usage_trace};
    const char *path = NULL, *svg = NULL;
    for (a.i = 1; a.i < argc; a.i++) {
        if (is_help(&a)) continue;
        if (is_flag(&a, "--svg", NULL)) svg = need_val(&a);
        else if (argv[a.i][0] == '-') die_usage(&a, "unknown argument '%s'", argv[a.i]);
        else path = argv[a.i];
    }
    if (!path) die_usage(&a, "%s", "no trace file given");
    sample *s = NULL;
    req *q = NULL;
    int ns = 0, nq = 0, n_rep = 0;
    read_trace(path, &s, &ns, &q, &nq, &n_rep);
    if (!nq) fail("trace", "the trace holds no request");

    /* the busy span: first arrival to last done */
    double t_lo = INFINITY, t_hi = 0, busy = 0;
    int ok = 0;
    double *ttft = calloc((size_t)nq, sizeof *ttft), *queued = calloc((size_t)nq, sizeof *queued);
    double *eq = calloc((size_t)nq, sizeof *eq); /* queued inside the replicas' engines */
    int n_ttft = 0, n_eq = 0;
    double ttft_sum = 0, queued_sum = 0, eq_sum = 0;
    if (!ttft || !queued || !eq) fail("trace", "out of memory");
    for (int i = 0; i < nq; i++) {
        t_lo = fmin(t_lo, q[i].arrive);
        t_hi = fmax(t_hi, q[i].done);
        busy += q[i].done - q[i].arrive;
        ok += q[i].error == 0 && q[i].status == 200;
        queued[i] = q[i].admit >= 0 ? q[i].admit - q[i].arrive : q[i].done - q[i].arrive;
        queued_sum += queued[i];
        if (q[i].engine_admit >= 0 && q[i].send >= 0)
            eq[n_eq] = fmax(q[i].engine_admit - q[i].send, 0), eq_sum += eq[n_eq++];
        if (q[i].first >= 0) ttft[n_ttft++] = q[i].first - q[i].arrive, ttft_sum += q[i].first - q[i].arrive;
    }
    double span = t_hi - t_lo > 0 ? t_hi - t_lo : 1e-9;
    double clients = busy / span;
    /* samples inside the busy span */
    double m_queue = 0, m_inf[RT_MAX_REPLICAS] = {0}, m_run[RT_MAX_REPLICAS] = {0}, m_wait[RT_MAX_REPLICAS] = {0};
    double b_sum[RT_MAX_REPLICAS] = {0};
    int n_in = 0, b_n[RT_MAX_REPLICAS] = {0};
    for (int i = 0; i < ns; i++) {
        if (s[i].t < t_lo || s[i].t > t_hi) continue;
        n_in++;
        m_queue += s[i].queue;
        for (int r = 0; r < s[i].n; r++) {
            m_inf[r] += s[i].inflight[r];
            m_run[r] += fmax(s[i].running[r], 0);
            m_wait[r] += fmax(s[i].waiting[r], 0);
            if (s[i].batch[r] > 0) b_sum[r] += s[i].batch[r], b_n[r]++;
        }
    }
    double d = n_in ? n_in : 1, tot_run = 0, tot_wait = 0;
    printf("trace %s: %d requests (%d answered 200), %d samples, %d replicas, %.2f s busy\n", path, nq, ok, ns, n_rep,
           span);
    printf("throughput %.2f requests/s; TTFT mean %.3f s, p50 %.3f s, p90 %.3f s; queued at the router "
           "p50 %.3f s, p90 %.3f s\n",
           nq / span, n_ttft ? ttft_sum / n_ttft : 0, pct(ttft, n_ttft, 0.5), pct(ttft, n_ttft, 0.9),
           pct(queued, nq, 0.5), pct(queued, nq, 0.9));
    if (n_eq)
        printf("queued in the replicas' engines p50 %.3f s, p90 %.3f s (%d of %d requests reported); mean wait "
               "%.3f s held at the router, %.3f s queued inside the engines\n",
               pct(eq, n_eq, 0.5), pct(eq, n_eq, 0.9), n_eq, nq, queued_sum / nq, eq_sum / n_eq);
    else printf("queued in the replicas' engines: not reported (replicas other than lamina serve)\n");
    printf(
        "concurrency (mean over the busy span):\n  clients had %.1f requests open\n  router held %.1f in its queue\n",
        clients, m_queue / d);
    for (int r = 0; r < n_rep; r++) {
        printf("  replica %d: %.1f in flight from the router; engine ran %.1f, kept %.1f waiting; engine batch mean "
               "%.2f\n",
               r, m_inf[r] / d, m_run[r] / d, m_wait[r] / d, b_n[r] ? b_sum[r] / b_n[r] : 0.0);
        tot_run += m_run[r] / d;
        tot_wait += m_wait[r] / d;
    }
    /* where it was lost: the largest share of the clients' requests held at one hop;
     * with reported engine queue times, the engines' waiting count is theirs */
    if (n_eq) tot_wait = eq_sum * ((double)nq / n_eq) / span;
    const char *where;
    double wait_per = n_rep ? tot_wait / n_rep : 0;
    if (m_queue / d >= 0.5 * clients && wait_per >= 1)
        where = "nowhere the router could help: the engines are full (their own queues are not empty) and the "
                "router holds the excess";
    else if (m_queue / d >= 0.5 * clients)
        where = "at the router: its in-flight limits let too little through (the replicas' own queues are empty)";
    else if (tot_wait >= tot_run && tot_wait > 1)
        where = "at the replicas' engines: requests wait there (sequence slots or KV blocks)";
    else if (tot_run < 0.5 * clients)
        where = "between the router and the engines (transfers, or requests finishing faster than sampled)";
    else where = "nowhere: concurrency reaches the engines";
    printf("router held %.0f of %.0f; replicas ran %.1f in all; concurrency lost %s\n", m_queue / d, clients, tot_run,
           where);
    if (n_eq)
        printf("waiting: %.1f requests held at the router, %.1f queued inside the engines (from the per-request "
               "times); %s\n",
               queued_sum / span, tot_wait,
               queued_sum / span > 2 * tot_wait       ? "the wait is at the router"
                   : tot_wait > 2 * queued_sum / span ? "the wait is inside the engines"
                                                      : "the wait is shared between the router and the engines");
    char def[1024];
    if (!svg) {
        snprintf(def, sizeof def, "%s.svg", path);
        svg = def;
    }
    double t_end = t_hi; /* the picture spans every sample, the last ones after the last request too */
    for (int i = 0; i < ns; i++) t_end = fmax(t_end, s[i].t);
    write_svg(svg, s, ns, n_rep, t_end);
    printf("picture: %s\n", svg);
    free(s);
    free(q);
    free(ttft);
    free(queued);
    free(eq);
    return 0;
}
