/*
 * cmd_route.c - `lamina route`: the router (src/route) in front of
 * replicas given as URLs (--replica) or started here (--spawn N -m MODEL,
 * with the options after `--` passed to each `lamina serve`).
 *
 * Spawned replicas: each gets a free port on 127.0.0.1 chosen here once
 * (kept across restarts, so its URL never changes), runs this same binary
 * as `lamina serve`, and dies with the router (PR_SET_PDEATHSIG). A
 * supervisor thread reaps them every 100 ms and starts again one that
 * exited (after a short pause, longer when it keeps dying); the router
 * itself ejects it meanwhile and re-admits it once its /health is 200. On
 * SIGINT/SIGTERM: the router stops taking connections and requests (503),
 * lets what is queued or in flight finish for at most --drain-timeout
 * seconds, then (or at a second signal) fails what is left (503, or a
 * stream's error event); then each replica gets SIGTERM, and SIGKILL after
 * 10 s.
 *
 * With -m the router reads the model's tokenizer and chat template, so
 * that prefix-affinity keys are the very block keys of the replicas'
 * prefix caches; without it (replicas elsewhere, model unknown here) keys
 * come from the prompt's text.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "format/gguf.h"
#include "route/route.h"
#include "text/chat.h"
#include "base/util.h"

static void usage_route(FILE *f) {
    fprintf(f,
            "usage: lamina route (--replica URL ... | --spawn N -m MODEL.gguf) [options] [-- serve options]\n"
            "An OpenAI-compatible front end that queues, admits and routes requests over replicas\n"
            "(`lamina serve` processes), with the same routes as `lamina serve`.\n\n"
            "  --replica URL          a replica's base URL, e.g. http://10.0.0.2:8080 (repeatable)\n"
            "  --spawn N              start and supervise N local `lamina serve -m MODEL` replicas\n"
            "                         (restarted when they exit, stopped with the router); the options\n"
            "                         after `--` go to each of them (e.g. -- -t 1 --max-seqs 64)\n"
            "  -m, --model FILE       the model: spawned replicas serve it, and its tokenizer gives\n"
            "                         prefix-affinity the replicas' own block keys (else prompt text)\n"
            "      --host ADDR        address to bind (default 127.0.0.1)\n"
            "      --port N           TCP port (default 8080; 0 picks a free one)\n"
            "      --api-key KEY      require 'Authorization: Bearer KEY' on /v1/*\n"
            "      --upstream-key KEY the key sent to the replicas (spawned ones are started with it)\n"
            "      --policy P         prefix-affinity (default), round-robin, least-outstanding\n"
            "      --max-queue N      requests held at the router before answering 429 (default 1024)\n"
            "      --max-inflight-per-replica N  a fixed in-flight limit per replica (default: learnt\n"
            "                         from each replica's /metrics)\n"
            "      --max-attempts N   replicas a request may try before it fails (default 3)\n"
            "      --poll-interval S  seconds between health and metrics polls (default 0.2)\n"
            "      --timeout S        seconds per upstream transfer and in the queue (default 600)\n"
            "      --drain-timeout S  on Ctrl-C or SIGTERM, let the requests in progress finish for at most\n"
            "                         this long before cancelling them (default 30; a second Ctrl-C: at once)\n"
            "      --stall-timeout S  a replica whose engine makes no iteration this long while requests\n"
            "                         are in flight there is ejected and its requests retried (default 30;\n"
            "                         0: never)\n"
            "      --first-byte-timeout S  a streamed request whose replica has sent no byte of the\n"
            "                         answer S seconds after it was sent is taken from that replica\n"
            "                         (whose in-flight limit halves) and retried on one it has not tried;\n"
            "                         with none, 504 (default 30; 0: never; whole answers: no such limit)\n"
            "      --max-body BYTES   largest request body (default 1M)\n"
            "      --max-connections N  open client connections (default 512)\n"
            "      --max-connections-per-ip N  from one client address (default 256)\n"
            "      --idle-timeout S   close a client connection silent this long (default 60)\n"
            "      --read-timeout S   close a client connection that has not sent all of a request S\n"
            "                         seconds after its first byte (default 30; 0: no limit)\n"
            "      --trace FILE       write the concurrency trace (JSON lines; see `lamina trace`)\n"
            "  -h, --help             this text\n");
}

static void log_line(void *user, const char *line) { fprintf(stderr, "lamina route: %s\n", line); }

/* ----------------------------------------------------------- supervision */

typedef struct {
    int n;
    int ports[RT_MAX_REPLICAS];
    pid_t pids[RT_MAX_REPLICAS];
    int restarts[RT_MAX_REPLICAS];
    double died_at[RT_MAX_REPLICAS];
    char **argv;  /* (argc + 1) the serve command, "--port" value patched per replica */
    int port_arg; /* index of the port value in argv */
    atomic_bool stopping;
    pthread_mutex_t mu;
} spawner;

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (!bind(fd, (struct sockaddr *)&a, sizeof a) && !getsockname(fd, (struct sockaddr *)&a, &len))
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static pid_t spawn_one(spawner *s, int i) {
    char port[16];
    snprintf(port, sizeof port, "%d", s->ports[i]);
    s->argv[s->port_arg] = port;
    pid_t pid = fork();
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        pthread_sigmask(SIG_SETMASK, &none, NULL);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        execv("/proc/self/exe", s->argv);
        _exit(127);
    }
    if (pid > 0) fprintf(stderr, "lamina route: replica %d pid %d at http://127.0.0.1:%d\n", i, (int)pid, s->ports[i]);
    return pid;
}

static void *supervise(void *arg) {
    spawner *s = arg;
    while (!atomic_load(&s->stopping)) {
        pthread_mutex_lock(&s->mu);
        for (int i = 0; i < s->n; i++) {
            int st;
            if (s->pids[i] > 0 && waitpid(s->pids[i], &st, WNOHANG) == s->pids[i]) {
                fprintf(stderr, "lamina route: replica %d (pid %d) %s %d; restarting\n", i, (int)s->pids[i],
                        WIFSIGNALED(st) ? "killed by signal" : "exited with",
                        WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
                s->pids[i] = 0;
                s->died_at[i] = lm_now();
                s->restarts[i]++;
            }
            /* a pause before a restart, growing while it keeps dying (at most 5 s) */
            double pause = 0.2 * (s->restarts[i] < 5 ? (1 << s->restarts[i]) / 2.0 : 5);
            if (s->pids[i] == 0 && !atomic_load(&s->stopping) && lm_now() - s->died_at[i] >= pause)
                s->pids[i] = spawn_one(s, i);
        }
        pthread_mutex_unlock(&s->mu);
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void stop_all(spawner *s) {
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n; i++)
        if (s->pids[i] > 0) kill(s->pids[i], SIGTERM);
    double t0 = lm_now();
    for (int i = 0; i < s->n; i++) {
        while (s->pids[i] > 0) {
            int st;
            pid_t w = waitpid(s->pids[i], &st, WNOHANG);
            if (w == s->pids[i] || (w < 0 && errno != EINTR)) s->pids[i] = 0;
            else if (lm_now() - t0 > 10) {
                kill(s->pids[i], SIGKILL);
                waitpid(s->pids[i], &st, 0);
                s->pids[i] = 0;
            } else {
                struct timespec ts = {0, 20000000};
                nanosleep(&ts, NULL);
            }
        }
    }
    pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------- the model */

typedef struct {
    lm_tokenizer *tok;
    lm_chat_template chat;
    lm_server_parse_ctx pctx;
} route_model;

/* The tokenizer and chat template for prefix keys; serve_args are scanned
 * for --chat-template (a family name) and --model-name as the replicas see
 * them. */
static void model_open(route_model *rm, const char *path, const char *name, const char *tmpl) {
    rm->tok = load_tok_or_die("route", path);
    char err[LM_ERRLEN];
    gguf_ctx *g = gguf_open(path, err, sizeof err);
    rm->pctx.chat_family = -1;
    if (g) {
        char *text = NULL;
        const char *fam = NULL;
        if (tmpl && !chat_template_choice("route", tmpl, &fam, &text)) fam = tmpl;
        if (chat_template_resolve(&rm->chat, g, fam, text, err, sizeof err) == CHAT_OK) {
            rm->pctx.chat_family = rm->chat.family;
            rm->pctx.chat_template = rm->chat.text;
        } else rm->pctx.chat_error = "no chat template";
        free(text);
        gguf_close(g);
    }
    rm->pctx.tok = rm->tok;
    rm->pctx.n_ctx = 1 << 30; /* the replica checks lengths; the router only needs the tokens */
    rm->pctx.model_name = name;
    rm->pctx.max_n = 1 << 20;
}

/* ------------------------------------------------------------------ main */

static int parse_policy(args *a) {
    const char *v = need_val(a);
    if (!strcmp(v, "prefix-affinity") || !strcmp(v, "prefix")) return RT_POLICY_PREFIX;
    if (!strcmp(v, "round-robin") || !strcmp(v, "rr")) return RT_POLICY_RR;
    if (!strcmp(v, "least-outstanding") || !strcmp(v, "least")) return RT_POLICY_LEAST;
    die_usage(a, "unknown policy '%s' (prefix-affinity, round-robin, least-outstanding)", v);
}

static int active_calls(void *server) { return route_active_calls(server); }

int cmd_route(int argc, char **argv) {
    args a = {argc, argv, 0, "route", usage_route};
    rt_config rc;
    route_config_default(&rc);
    double drain = 30; /* --drain-timeout */
    const char *model = NULL;
    const char *urls[RT_MAX_REPLICAS];
    int n_urls = 0, n_spawn = 0, serve_from = argc;
    for (a.i = 1; a.i < argc; a.i++) {
        if (!strcmp(argv[a.i], "--")) {
            serve_from = a.i + 1;
            break;
        }
        if (is_help(&a)) continue;
        if (is_flag(&a, "--replica", NULL)) {
            if (n_urls >= RT_MAX_REPLICAS) die_usage(&a, "at most %s replicas", "64");
            urls[n_urls++] = need_val(&a);
        } else if (is_flag(&a, "--spawn", NULL)) n_spawn = (int)need_int(&a, 1, RT_MAX_REPLICAS);
        else if (is_flag(&a, "-m", "--model")) model = need_val(&a);
        else if (is_flag(&a, "--host", NULL)) rc.host = need_val(&a);
        else if (is_flag(&a, "--port", NULL)) rc.port = (int)need_int(&a, 0, 65535);
        else if (is_flag(&a, "--api-key", NULL)) rc.api_key = need_val(&a);
        else if (is_flag(&a, "--upstream-key", NULL)) rc.upstream_key = need_val(&a);
        else if (is_flag(&a, "--policy", NULL)) rc.policy = parse_policy(&a);
        else if (is_flag(&a, "--max-queue", NULL)) rc.max_queue = (int)need_int(&a, 1, 1 << 24);
        else if (is_flag(&a, "--max-inflight-per-replica", NULL)) rc.max_inflight = (int)need_int(&a, 1, 1 << 20);
        else if (is_flag(&a, "--max-attempts", NULL)) rc.max_attempts = (int)need_int(&a, 1, 100);
        else if (is_flag(&a, "--poll-interval", NULL)) rc.poll_interval = need_float(&a, 0.01, 60);
        else if (is_flag(&a, "--timeout", NULL)) rc.timeout = need_float(&a, 0, 1e7);
        else if (is_flag(&a, "--stall-timeout", NULL)) rc.stall_timeout = need_float(&a, 0, 1e7);
        else if (is_flag(&a, "--first-byte-timeout", NULL)) rc.first_byte_timeout = need_float(&a, 0, 1e7);
        else if (is_flag(&a, "--drain-timeout", NULL)) drain = need_float(&a, 0, 1e7);
        else if (is_flag(&a, "--max-connections", NULL)) rc.max_connections = (int)need_int(&a, 1, 1000000);
        else if (is_flag(&a, "--max-connections-per-ip", NULL))
            rc.max_connections_per_ip = (int)need_int(&a, 1, 1000000);
        else if (is_flag(&a, "--idle-timeout", NULL)) rc.idle_timeout = (int)need_int(&a, 1, 86400);
        else if (is_flag(&a, "--read-timeout", NULL)) rc.read_timeout = need_float(&a, 0, 86400);
        else if (is_flag(&a, "--max-body", NULL)) rc.max_body = (size_t)need_bytes(&a);
        else if (is_flag(&a, "--trace", NULL)) rc.trace_path = need_val(&a);
        else die_usage(&a, "unknown argument '%s'", argv[a.i]);
    }
    if (!n_urls && !n_spawn) die_usage(&a, "%s", "no replicas (--replica URL or --spawn N -m MODEL)");
    if (n_spawn && !model) die_usage(&a, "%s", "--spawn needs the model (-m MODEL.gguf)");
    if (n_urls + n_spawn > RT_MAX_REPLICAS) die_usage(&a, "at most %s replicas", "64");

    /* what the replicas are told: the model name and template, for the router's own tokenizing */
    const char *name = NULL, *tmpl = NULL;
    for (int i = serve_from; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--model-name")) name = argv[i + 1];
        if (!strcmp(argv[i], "--chat-template")) tmpl = argv[i + 1];
    }
    route_model rm = {0};
    if (model) {
        if (!name) name = strrchr(model, '/') ? strrchr(model, '/') + 1 : model;
        model_open(&rm, model, name, tmpl);
        rc.pctx = &rm.pctx;
    }

    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    spawner sp = {.n = n_spawn};
    pthread_mutex_init(&sp.mu, NULL);
    pthread_t sup;
    bool sup_started = false;
    char spawn_urls[RT_MAX_REPLICAS][64];
    if (n_spawn) {
        int n_extra = argc - serve_from;
        sp.argv = calloc((size_t)n_extra + 12, sizeof *sp.argv);
        if (!sp.argv) fail("route", "out of memory");
        int k = 0;
        sp.argv[k++] = "lamina";
        sp.argv[k++] = "serve";
        sp.argv[k++] = "-m";
        sp.argv[k++] = (char *)model;
        sp.argv[k++] = "--host";
        sp.argv[k++] = "127.0.0.1";
        sp.argv[k++] = "--port";
        sp.port_arg = k++;
        if (rc.upstream_key) {
            sp.argv[k++] = "--api-key";
            sp.argv[k++] = (char *)rc.upstream_key;
        }
        for (int i = serve_from; i < argc; i++) sp.argv[k++] = argv[i];
        sp.argv[k] = NULL;
        for (int i = 0; i < n_spawn; i++) {
            sp.ports[i] = free_port();
            if (sp.ports[i] < 0) fail("route", "no free port for a replica");
            snprintf(spawn_urls[i], sizeof spawn_urls[i], "http://127.0.0.1:%d", sp.ports[i]);
            urls[n_urls + i] = spawn_urls[i];
            sp.pids[i] = spawn_one(&sp, i);
        }
        if (pthread_create(&sup, NULL, supervise, &sp)) fail("route", "cannot start a thread");
        sup_started = true;
    }
    rc.replicas = urls;
    rc.n_replicas = n_urls + n_spawn;
    rc.log = log_line;

    char err[LM_ERRLEN];
    lm_router *r = route_new(&rc, err, sizeof err);
    if (!r) {
        if (sup_started) {
            atomic_store(&sp.stopping, true);
            pthread_join(sup, NULL);
            stop_all(&sp);
        }
        fail("route", err);
    }
    bool v6 = strchr(rc.host, ':') != NULL;
    fprintf(stderr, "lamina route: listening on http://%s%s%s:%d (%d replicas)\n", v6 ? "[" : "", rc.host,
            v6 ? "]" : "", route_port(r), rc.n_replicas);

    int sig = 0;
    while (sigwait(&stop, &sig) != 0) continue;
    route_quiesce(r);
    drain_wait("route", &stop, sig, drain, active_calls, r);
    fprintf(stderr, "lamina route: %s, stopping\n", sig == SIGINT ? "interrupted" : "terminated");
    if (sup_started) {
        atomic_store(&sp.stopping, true);
        pthread_join(sup, NULL);
    }
    char ferr[LM_ERRLEN];
    int saved = route_free(r, ferr, sizeof ferr);
    if (sup_started) stop_all(&sp);
    free(sp.argv);
    pthread_mutex_destroy(&sp.mu);
    if (rm.tok) tok_free(rm.tok);
    chat_template_free(&rm.chat);
    if (saved != 0) {
        fprintf(stderr, "lamina route: the trace was not saved: %s\n", ferr);
        return 1;
    }
    return 0;
}
