/*
 * cmd_serve.c - `lamina serve`: the OpenAI-compatible HTTP server.
 *
 * Order of start-up: the HTTP server listens first (so /health can answer
 * 503 while the model loads), then the model is loaded and the engine
 * started and attached. SIGINT and SIGTERM are blocked in every thread (the
 * mask is set before any thread starts) and taken here with sigwait. The
 * first one stops gracefully: no new connection or request (503), the
 * requests in progress finish, for at most --drain-timeout seconds; a second
 * signal, or that deadline, cancels what is left (each still gets its
 * answer: 503, or a stream's error event and [DONE]). Then the engine stops,
 * then the model is freed.
 */
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "model/forward.h"
#include "model/tp_plan.h"
#include "dist/dist.h"
#include "base/pool.h"
#include "sched/engine.h"
#include "format/quant.h"
#include "serve/server.h"
#include "base/util.h"

static void usage_serve(FILE *f) {
    fprintf(
        f,
        "usage: lamina serve [-m] MODEL.gguf [options]\n"
        "Serve the model over HTTP: a chat page at / (open it in a browser), and OpenAI's API:\n"
        "POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,\n"
        "GET /metrics (Prometheus).\n\n"
        "  -m, --model FILE       GGUF model\n"
        "      --host ADDR        address to bind (default 127.0.0.1)\n"
        "      --port N           TCP port (default 8080; 0 picks a free one)\n"
        "      --api-key KEY      require 'Authorization: Bearer KEY' on /v1/*; repeat it for several\n"
        "                         keys, each a tenant with its own prefix cache (requests may add\n"
        "                         a \"cache_salt\" string to split a key's cache further)\n"
        "      --model-name NAME  the name requests use (default: the file's base name)\n"
        "      --chat-template NAME|FILE  a template family (chatml, llama2, llama3, mistral, gemma,\n"
        "                         phi3, zephyr, ...) or a Jinja template file, instead of the model's\n"
        "      --reasoning-format separate|inline  thinking models (qwen3, qwen3.5, deepseek-r1):\n"
        "                         the reasoning apart as reasoning_content (default), or left inline\n"
        "                         in content; a request's \"reasoning_format\" overrides it\n"
        "      --pooling mean|cls|last  /v1/embeddings pools the hidden states this way instead of\n"
        "                         the model's pooling_type; the opt-in that lets a generative model\n"
        "                         (no pooling_type) answer embeddings requests\n"
        "  -c, --ctx-size N       positions per sequence (default: the model's)\n"
        "      --ctx-extend       allow -c above the model's trained context (with a warning)\n"
        "  -t, --threads N        threads (default: physical cores)\n"
        "      --max-seqs N       sequences generating at once (default 64)\n"
        "      --batch-tokens N   tokens per engine iteration (default %d; at least 64 for a hybrid\n"
        "                         model, whose prompt chunks end on the delta rule's 64-token grid)\n"
        "      --itl-factor F     beside running decodes, cut prompt chunks so that a pass is predicted\n"
        "                         to take at most F times a decode-only one, 16 prompt tokens at\n"
        "                         least, e.g. 2 (default 0: off, a prompt takes what --batch-tokens leaves)\n"
        "      --mem BYTES        the whole memory budget, e.g. 8G: weights, workspace, and the KV\n"
        "                         pool gets the rest (default: 80%% of the memory available, as a\n"
        "                         bound on the --kv-mem default); too small for one full context:\n"
        "                         an error (exit 1)\n"
        "      --kv-mem BYTES     KV cache pool size, e.g. 512M (default: context x max-seqs, at most 4G)\n"
        "      --kv-type T        KV cache element type: F16 (default), F32, Q8_0\n"
        "      --state-snapshots N  hybrid models: slots for the recurrent state at cached prefixes'\n"
        "                         ends (default: --max-seqs, within --mem's quarter; 0: none)\n"
        "      --spec ngram       speculative decoding by prompt lookup, on for every request unless\n"
        "                         it sends \"speculative\": false or \"draft_max\": 0\n"
        "      --spec mtp         the model's next-token-prediction layer guesses (qwen35 files with\n"
        "                         one; refused by name without)\n"
        "      --draft-model FILE speculative decoding by a draft model with the same tokenizer, on\n"
        "                         for every request in the same way\n"
        "      --draft-max K      tokens proposed per step at most (default 4, 3 with --draft-model;\n"
        "                         a request's \"draft_max\" may ask for fewer)\n"
        "      --draft-min N, --draft-p-min P, --draft-cost P, --draft-vocab N  with --draft-model: see lamina run --help\n"
        "      --spec-widths W:T,...  the model pass's time by its rows: see lamina run --help\n"
        "      --max-waiting N    queued requests before answering 429 (default 256; 0: unbounded)\n"
        "      --timeout SECONDS  cancel a request after this long, answering with what it has (default 600)\n"
        "      --keepalive SECONDS  a streaming comment line after this much silence (default 3)\n"
        "      --idle-timeout SECONDS  close a connection idle this long (default 60)\n"
        "      --drain-timeout SECONDS  on Ctrl-C or SIGTERM, let the requests in progress finish for at\n"
        "                       most this long before cancelling them (default 30; a second Ctrl-C: at once)\n"
        "      --read-timeout SECONDS  close a connection whose request (headers and body) has not all\n"
        "                         arrived this long after its first byte (default 30; 0: no limit)\n"
        "      --max-connections N  connections at once (default 512); past it a new one is closed\n"
        "                         at once\n"
        "      --max-connections-per-ip N  connections from one address (default 256; 0: no limit);\n"
        "                         past it a new one is closed at once\n"
        "      --conn-memory BYTES  memory per connection for the request line, headers and buffers\n"
        "                         (default 32K, at least 8K; a request line or headers past it: 414, 431)\n"
        "      --max-headers N    header lines in a request (default 100; more: 431)\n"
        "      --max-body BYTES   largest request body (default 1M; larger: 413)\n"
        "      --stream-buffer BYTES  generated text and logprobs a stream may hold unsent (once the\n"
        "                         socket's buffer is full) before its request is cancelled (default 4M)\n"
        "      --max-tokens N     max_tokens of a request that sets none (default: 1024 on chat, 16 on\n"
        "                         completions as OpenAI's API; chat never past the context)\n"
        "      --max-tokens-cap N largest max_tokens a request may ask for (default: the context)\n"
        "      --temp T, --top-k K, --top-p P, --min-p P  sampling for a request that sets none of\n"
        "                         these fields (defaults 0.8, 40, 0.95, 0.05, as lamina run; a\n"
        "                         request's temperature 0 is greedy)\n"
        "      --max-n N          largest n (choices per prompt; default 16)\n"
        "  -h, --help             this text\n",
        FWD_BATCH_DEFAULT);
}

/* Each connection holds a descriptor: raise the soft limit on open files
 * (up to the hard one) so that --max-connections fits, with room for the
 * model and the listening socket; refuse a limit that cannot fit. */
static void fd_limit(int max_connections) {
    struct rlimit rl;
    rlim_t want = (rlim_t)max_connections + 64;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= want) return;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want) {
        char msg[200];
        snprintf(msg, sizeof msg, "--max-connections %d needs %llu open files, and the limit is %llu (ulimit -n)",
                 max_connections, (unsigned long long)want, (unsigned long long)rl.rlim_max);
        fail("serve", msg);
    }
    rl.rlim_cur = want;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) fail("serve", "cannot raise the limit on open files (ulimit -n)");
}

static void log_line(void *user, const char *line) { fprintf(stderr, "lamina serve: %s\n", line); }

/* --chat-template: a family name, or a file whose text is a template. An
 * unknown name that is no readable file is passed on as a name: the server
 * reports it once the model is loaded and chat requests fail with 400. */
static void chat_option(const char *v, lm_server_config *sc, char **file_text) {
    const char *name;
    if (!chat_template_choice("serve", v, &name, file_text)) name = v;
    sc->chat_template = name;
    sc->chat_template_text = *file_text;
}

/* Tensor or pipeline parallel, ranks other than 0: no server; run the passes rank 0's
 * engine plans, on this rank's shard, until it stops. An error here ends the
 * whole job (rank 0 would wait for this rank forever). */
static int follow(const char *model, int threads) {
    lm_model *m = load_or_die("serve", model);
    lm_pool *pool = pool_new(threads > 0 ? threads : pool_default_threads());
    if (!pool) fail("serve", "cannot start threads");
    char err[LM_ERRLEN];
    if (tp_plan_follow(m, pool, err, sizeof err)) {
        fprintf(stderr, "lamina serve: rank %d: %s\n", cli_rank, err);
        dist_abort(1);
    }
    pool_free(pool);
    model_free(m);
    return 0;
}

static int active_calls(void *server) { return server_active_calls(server); }

int cmd_serve(int argc, char **argv) {
    args a = {argc, argv, 0, "serve", usage_serve};
    const char *model = NULL, *tmpl = NULL;
    lm_server_config sc;
    server_config_default(&sc);
    double drain = 30; /* --drain-timeout */
    lm_engine_config ec;
    engine_config_default(&ec);
    ec.max_waiting = 256;
    bool ctx_extend = false;
    unsigned long long mem = 0;
    spec_opts so;
    spec_opts_default(&so);
    const char *keys[64];
    int n_keys = 0;
    for (a.i = 1; a.i < argc; a.i++) {
        if (is_help(&a)) continue;
        if (is_flag(&a, "-m", "--model")) model = need_val(&a);
        else if (is_flag(&a, "--mem", NULL)) mem = need_bytes(&a);
        else if (is_flag(&a, "--host", NULL)) sc.host = need_val(&a);
        else if (is_flag(&a, "--port", NULL)) sc.port = (int)need_int(&a, 0, 65535);
        else if (is_flag(&a, "--api-key", NULL)) {
            if (n_keys == (int)(sizeof keys / sizeof *keys)) fail("serve", "at most 64 --api-key flags");
            keys[n_keys++] = need_val(&a);
        } else if (is_flag(&a, "--model-name", NULL)) sc.model_name = need_val(&a);
        else if (is_flag(&a, "--chat-template", NULL)) tmpl = need_val(&a);
        else if (is_flag(&a, "--reasoning-format", NULL)) {
            const char *v = need_val(&a);
            if (strcmp(v, "separate") && strcmp(v, "inline"))
                die_usage(&a, "--reasoning-format must be 'separate' or 'inline' (got '%s')", v);
            sc.reasoning_inline = !strcmp(v, "inline");
        } else if (is_flag(&a, "--pooling", NULL)) {
            const char *v = need_val(&a);
            sc.pooling = !strcmp(v, "mean") ? LM_POOL_MEAN
                : !strcmp(v, "cls")         ? LM_POOL_CLS
                : !strcmp(v, "last")        ? LM_POOL_LAST
                                            : LM_POOL_NONE;
            if (sc.pooling == LM_POOL_NONE) die_usage(&a, "--pooling must be 'mean', 'cls' or 'last' (got '%s')", v);
        } else if (is_flag(&a, "-c", "--ctx-size")) ec.n_ctx = (int)need_int(&a, 0, 1 << 24);
        else if (is_flag(&a, "--ctx-extend", NULL)) ctx_extend = true;
        else if (is_flag(&a, "-t", "--threads")) ec.n_threads = (int)need_int(&a, 1, 1024);
        else if (is_flag(&a, "--max-seqs", NULL)) ec.max_seqs = (int)need_int(&a, 1, 1 << 16);
        else if (is_flag(&a, "--batch-tokens", NULL)) ec.batch_tokens = (int)need_int(&a, 1, 1 << 20);
        else if (is_flag(&a, "--kv-mem", NULL)) ec.kv_mem = need_bytes(&a);
        else if (is_flag(&a, "--kv-type", NULL)) ec.kv_type = need_kv_type(&a);
        else if (is_flag(&a, "--state-snapshots", NULL)) ec.state_snapshots = snapshots_flag(&a);
        else if (is_flag(&a, "--itl-factor", NULL)) ec.itl_factor = itl_factor_flag(&a);
        else if (spec_opts_flag(&a, &so)) continue;
        else if (is_flag(&a, "--max-waiting", NULL)) ec.max_waiting = (int)need_int(&a, 0, 1 << 24);
        else if (is_flag(&a, "--timeout", NULL)) sc.timeout = need_float(&a, 0, 1e7);
        else if (is_flag(&a, "--drain-timeout", NULL)) drain = need_float(&a, 0, 1e7);
        else if (is_flag(&a, "--keepalive", NULL)) sc.keepalive = need_float(&a, 0.01, 3600);
        else if (is_flag(&a, "--idle-timeout", NULL)) sc.idle_timeout = (int)need_int(&a, 1, 86400);
        else if (is_flag(&a, "--read-timeout", NULL)) sc.read_timeout = need_float(&a, 0, 86400);
        else if (is_flag(&a, "--max-connections", NULL)) sc.max_connections = (int)need_int(&a, 1, 1 << 20);
        else if (is_flag(&a, "--max-connections-per-ip", NULL)) sc.max_conn_per_ip = (int)need_int(&a, 0, 1 << 20);
        else if (is_flag(&a, "--conn-memory", NULL)) sc.conn_memory = (size_t)need_bytes(&a);
        else if (is_flag(&a, "--max-headers", NULL)) sc.max_headers = (int)need_int(&a, 1, 1 << 16);
        else if (is_flag(&a, "--max-body", NULL)) sc.max_body = (size_t)need_bytes(&a);
        else if (is_flag(&a, "--stream-buffer", NULL)) sc.stream_buffer = (size_t)need_bytes(&a);
        else if (is_flag(&a, "--max-tokens", NULL)) sc.max_tokens_default = (int)need_int(&a, 1, 1 << 30);
        else if (is_flag(&a, "--temp", NULL)) sc.sampling.temp = need_float(&a, 0, 2);
        else if (is_flag(&a, "--top-k", NULL)) sc.sampling.top_k = (int)need_int(&a, 0, 1 << 30);
        else if (is_flag(&a, "--top-p", NULL)) sc.sampling.top_p = need_float(&a, 0, 1);
        else if (is_flag(&a, "--min-p", NULL)) sc.sampling.min_p = need_float(&a, 0, 1);
        else if (is_flag(&a, "--max-tokens-cap", NULL)) sc.max_tokens_cap = (int)need_int(&a, 1, 1 << 30);
        else if (is_flag(&a, "--max-n", NULL)) sc.max_n = (int)need_int(&a, 1, 1024);
        else die_usage(&a, "unknown argument '%s'", argv[a.i]);
    }
    if (!model) die_usage(&a, "%s", "no model given (-m MODEL.gguf)");
    if (mem && ec.kv_mem)
        die_usage(&a, "%s", "--mem is the whole budget (the KV pool gets the rest): give --mem or --kv-mem, not both");
    mem_apply(&ec, mem);
    if (sc.conn_memory < 8 << 10) die_usage(&a, "%s", "--conn-memory must be at least 8K");
    fd_limit(sc.max_connections);
    if (!sc.model_name) {
        const char *slash = strrchr(model, '/');
        sc.model_name = slash ? slash + 1 : model;
    }
    char *tmpl_text = NULL;
    chat_option(tmpl, &sc, &tmpl_text);
    sc.log = log_line;

    /* every thread started from here on inherits the blocked signals */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    char err[LM_ERRLEN];
    const bool dist = cli_tp_size * cli_pp_size * cli_ep_size > 1; /* tensor, pipeline and/or expert parallel */
    if (dist && cli_rank != 0) return follow(model, ec.n_threads);
    sc.api_keys = keys;
    sc.n_api_keys = n_keys;
    lm_server *srv = server_new(NULL, &sc, err, sizeof err);
    if (!srv) fail("serve", err);
    bool v6 = strchr(sc.host, ':') != NULL;
    fprintf(stderr, "lamina serve: listening on http://%s%s%s:%d\n", v6 ? "[" : "", sc.host, v6 ? "]" : "",
            server_port(srv));

    double t0 = lm_now();
    lm_model *m = load_or_die("serve", model);
    if (!m->tok) fail("serve", "the model file has no tokenizer");
    ctx_check("serve", "-c", ec.n_ctx, m->hp.n_ctx_train, ctx_extend);
    m->tp.lead = dist; /* rank 0: each pass's plan goes to the other ranks first */
    spec_opts_apply(&a, &so, &ec);
    lm_status st;
    lm_engine *eng = engine_new_tuned(m, m->tok, &ec, &(engine_tuning){.spec_widths = so.widths}, &st, err, sizeof err);
    if (!eng) fail("serve", err);
    if (server_set_engine(srv, eng, err, sizeof err)) fail("serve", err);
    fprintf(stderr, "lamina serve: model '%s' ready in %.2f s (context %d)\n", sc.model_name, lm_now() - t0,
            engine_n_ctx(eng));
    lm_engine_stats est;
    engine_stats(eng, &est);
    mem_print(stderr, "serve", &est, ec.kv_type, engine_n_ctx(eng));
    fprintf(stderr, "lamina serve: chat page: http://%s%s%s:%d/  OpenAI API: http://%s%s%s:%d/v1  (Ctrl-C stops)\n",
            v6 ? "[" : "", sc.host, v6 ? "]" : "", server_port(srv), v6 ? "[" : "", sc.host, v6 ? "]" : "",
            server_port(srv));

    int sig = 0;
    while (sigwait(&stop, &sig) != 0) continue;
    server_quiesce(srv);
    drain_wait("serve", &stop, sig, drain, active_calls, srv);
    fprintf(stderr, "lamina serve: %s, stopping\n", sig == SIGINT ? "interrupted" : "terminated");
    server_free(srv);
    engine_free(eng);
    if (dist && tp_plan_stop(err, sizeof err)) fail("serve", err);
    spec_opts_free(&so);
    model_free(m);
    free(tmpl_text);
    return 0;
}
