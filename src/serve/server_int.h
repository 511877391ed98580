/*
 * server_int.h - the data server.c (HTTP, routes, metrics) and server_gen.c
 * (generation requests: engine events, streaming, JSON answers) share, and
 * server_gen.c's entry points. Functions go one way: server.c calls
 * server_gen.c (call_*), both call http.c (responses) and server_parse.c,
 * server_parse.c calls server_tools.c (srv_parse_*) and server_gen.c its
 * answer side (srv_tc_*); none of those calls back. Every one of them fills
 * errors through server_error.c (server_error, declared in server.h), a leaf
 * that calls none of them. Not a public header: the contract is server.h.
 * The embeddings route goes the same way: call_run hands an embed call to
 * server_embed_run.c (embed_run), which calls server_embed.c's parser and
 * answer writer and server_gen.c's srv_status_error and srv_call_ended;
 * call_free hands it to embed_call_free.
 *
 * Ownership. A srv_call is one HTTP request on a generation route or the
 * embeddings route. It is created by the access handler, owned by its
 * connection's thread, and freed in the request-completed callback, which
 * first cancels what is still running and waits for every engine request's
 * final event: after that the engine holds no pointer into the call.
 *
 * Locking. call->mu guards what the engine thread writes (the event queue,
 * final counts, handles); the connection's thread takes the whole queue at
 * once (queue_take) and works on its own copy without the lock.
 */
#ifndef LAMINA_SERVER_INT_H
#define LAMINA_SERVER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <microhttpd.h>

#include "base/strbuf.h"
#include "sched/engine.h"
#include "serve/conn_guard.h"
#include "serve/server.h"
#include "text/chat.h"
#include "text/reasoning.h"

/* ------------------------------------------------------------------ server */

#define SRV_STATUS_MAX 600

struct lm_server {
    lm_server_config cfg; /* strings below are the owned copies */
    char *host, *model_name, *tmpl_name, *tmpl_text;
    char **keys;        /* (n_keys) accepted API keys (api_key, then api_keys); none: no auth */
    uint64_t *key_salt; /* (n_keys) server_tenant_salt of each */
    int n_keys;
    lm_chat_template chat; /* resolved at server_set_engine (pctx points into it) */
    struct MHD_Daemon *daemon;
    int port;
    _Atomic(lm_engine *) engine; /* NULL while the model loads */
    lm_server_parse_ctx pctx;    /* valid once engine is set */
    char chat_error[256];
    int embed_pooling;     /* what embeddings requests pool with (lm_pooling; NONE: refused) */
    char embed_error[320]; /* why embeddings requests fail ("": they do not) */
    atomic_bool stopping;
    atomic_bool quiesced; /* server_quiesce: new requests get 503 */
    atomic_int calls;     /* generation calls alive (call_new to call_free) */
    atomic_uint_least64_t next_id;
    uint64_t id_salt;
    long long started; /* time(NULL) at start, for /v1/models */
    atomic_uint_least64_t http_status[SRV_STATUS_MAX];
    char start_error[256]; /* the HTTP library's message while starting */
    atomic_bool starting;

    conn_guard conns; /* open connections and the read deadline (conn_guard.h) */
};

/* ------------------------------------------------------------------- calls */

typedef struct srv_call srv_call;

/* One engine submission: one prompt of the call. */
typedef struct {
    srv_call *call;
    int prompt;         /* index into req.prompts */
    lm_request *handle; /* set under call->mu after engine_submit */
} srv_sub;

/* One engine event as copied by the callback. */
typedef struct {
    int choice;    /* prompt * n + event index */
    int32_t token; /* -1 for a final event */
    float logprob;
    int n_top;
    size_t top_off;            /* into the queue's top arrays */
    size_t text_off, text_len; /* into the queue's text */
    bool done;
    lm_finish finish;
    lm_request_stats stats; /* with done */
} srv_ev;

typedef struct {
    srv_ev *ev;
    size_t n_ev, cap_ev;
    strbuf text;
    int32_t *top_ids; /* (cap_top) */
    float *top_lps;   /* (cap_top) */
    size_t n_top, cap_top;
} srv_queue;

/* ---------------------------------------------------------- tool calls */

/* server_tools.c, request side: the tools of a chat request as the chat
 * template takes them (each tool object printed as JSON). */
typedef struct {
    int n;
    char *json[SERVER_MAX_TOOLS]; /* (n) cJSON_Print'ed, cJSON_free */
} srv_tools;

struct cJSON;
/* server_error.c: the member `name` of obj, NULL when absent or JSON null
 * (the parsers' one reading of an optional field). */
const struct cJSON *srv_field(const struct cJSON *obj, const char *name);
/* A 500 "out of memory while parsing the request" into *e; returns -1. */
int srv_oom(lm_server_error *e);
/* response_format, grammar, json_schema -> r->grammar (checked); 0 or -1 with *e. */
int srv_parse_format(const struct cJSON *root, lm_server_request *r, lm_server_error *e);
/* tools, tool_choice, parallel_tool_calls for a template family -> *t (the
 * prompt's tools), r->grammar and its trigger, r->tool_calls; 0 or -1. */
int srv_parse_tools(const struct cJSON *root, int family, lm_server_request *r, srv_tools *t, lm_server_error *e);
void srv_tools_free(srv_tools *t);
/* A thinking family's response_format or tools grammar made to start where
 * the reasoning ends (lazy, on </think>); nothing when closed (the prompt
 * closed the reasoning). 0 or -1 with *e. */
int srv_reason_grammar(lm_server_request *r, bool closed, lm_server_error *e);

/* How far a scan of a call's text got: complete, cut by the end of the
 * text so far, not a call. */
enum { J_DONE, J_MORE, J_BAD };

/* server_tools.c's helpers that server_tools_xml.c shares: a schema object
 * to GBNF (NULL with a 400 about param, what naming it), and GBNF text with
 * every rule name prefixed (NULL when out of memory). */
char *srv_schema_gbnf(const struct cJSON *schema, const char *param, const char *what, lm_server_error *e);
char *srv_prefix_rules(const char *g, const char *prefix);

/* server_tools_xml.c: the XML syntax (CHAT_TOOLS_XML). A tool of the request. */
typedef struct {
    const char *name;
    const struct cJSON *params; /* NULL: any parameters */
} srv_tool_ref;

/* The rules after "root" of the calls to tools[0..n) in the XML syntax
 * (tc-call, tc-fn, each tool's parameters), appended to *g; the names of
 * the parameters read back as text (strings) appended to *raw as a list:
 * per tool its name, then its text parameters, each NUL-terminated, an
 * empty name ending the tool. 0, or -1 with a 400 (a schema lamina cannot
 * follow) or an out-of-memory error. */
int srv_xml_rules(const srv_tool_ref *tools, int n, strbuf *g, strbuf *raw, lm_server_error *e);

/* One call of the XML syntax read from s[p..n) (s[p] is past <tool_call>):
 * its name once its tag is closed, and the JSON text of its arguments so
 * far (each parameter once closed: text parameters of raw as JSON strings,
 * others as the JSON the model wrote). status J_DONE with end past
 * </tool_call>, J_MORE while the call is open at the end of the text,
 * J_BAD when it is no call. *r must start zeroed; each scan replaces it. */
typedef struct {
    int status;
    size_t end;
    bool has_name, has_args;
    size_t name_s, name_e; /* the name in s */
    strbuf args;           /* the arguments' JSON text so far (srv_xml_scan_free) */
} srv_xml_call;

void srv_xml_scan(const char *s, size_t n, size_t p, const char *raw, srv_xml_call *r);
void srv_xml_scan_free(srv_xml_call *r);

/* A call kept by srv_tc: its name and its arguments without the blanks
 * between JSON tokens, at `at` in srv_tc.kept. */
typedef struct {
    size_t at, name_len, args_len;
} srv_tc_kept;

/* Answer side: one choice's text read for tool calls as it comes. */
typedef struct {
    int syntax;             /* CHAT_TOOLS_* */
    const char *raw;        /* xml: srv_xml_rules' list of text parameters (the request's), or NULL */
    int phase;              /* text, calls, end */
    strbuf buf;             /* text: held back (a possible opener's start); calls: from the opener on */
    size_t pos;             /* calls: where the current call (or what precedes it) starts in buf */
    bool in_call, in_array; /* inside a call object; mistral: past "[TOOL_CALLS] [" */
    bool cur_named;         /* the current call's name is out */
    bool cur_held;          /* the current call may repeat a kept one: nothing of it out yet */
    size_t args_sent;       /* bytes of the current call's arguments out */
    int n_calls;            /* calls finished and kept (their indices 0 .. n_calls-1) */
    strbuf kept;            /* the kept calls' names and arguments, for repeats */
    srv_tc_kept *kept_at;   /* (n_kept) */
    int n_kept, kept_cap;
} srv_tc;

/* What one feed releases: content text, and call events in order. */
typedef struct {
    int index;  /* the call, 0 .. */
    char *name; /* the call's first event: its name; else NULL */
    char *args; /* a piece of its arguments' JSON text (may be "") */
    size_t args_len;
} srv_tc_ev;

typedef struct {
    strbuf content;
    srv_tc_ev *ev; /* (n) */
    int n, cap;
    bool failed; /* out of memory: events were lost */
} srv_tc_out;

/* raw: the request's tool_strings (the xml syntax), or NULL. */
void srv_tc_init(srv_tc *t, int syntax, const char *raw);
void srv_tc_free(srv_tc *t);
/* Feed text (complete UTF-8 characters); final: the text is complete. */
void srv_tc_feed(srv_tc *t, const char *s, size_t n, bool final, srv_tc_out *o);
void srv_tc_out_free(srv_tc_out *o);
/* A call's id: "call_" + 24 letters and digits, or 9 of them for the
 * mistral syntax (its template's rule), from the answer's id, the choice
 * and the call's index. */
void srv_tc_call_id(const char *seed, int choice, int index, int syntax, char *out, size_t cap);

/* What the connection's thread knows about one choice. */
typedef struct {
    strbuf text;       /* the answer so far (non-streaming), raw bytes */
    void *lp;          /* cJSON logprobs of the answer (non-streaming), or NULL */
    size_t text_total; /* bytes of text so far (completions' text_offset) */
    srv_tc tc;         /* streaming with tool calls: the reader of the text */
    lm_reason rs;      /* streaming, reasoning apart: the splitter of the text */
    int n_hcalls;      /* harmony calls begun (streaming) */
    bool done;
    lm_finish finish;
    lm_request_stats stats;
} srv_choice;

/* A choice's end as the callback recorded it (kept apart from the queue so
 * that it survives even when the queue cannot grow). */
typedef struct {
    bool done;
    lm_finish finish;
    lm_request_stats stats;
} srv_fin;

struct srv_embed;

struct srv_call {
    lm_server *srv;
    struct MHD_Connection *conn;
    bool chat;
    bool embed;            /* POST /v1/embeddings: run by server_embed_run.c (embed_run) */
    struct srv_embed *emb; /* its state once it runs, else NULL (owned; embed_call_free) */
    uint64_t tenant_salt;  /* the API key's prefix-cache salt (0 without keys) */
    strbuf body;
    bool too_big;
    lm_server_request req;
    bool parsed;
    char id[48];
    long long created;
    double t_start;
    int n_choices;     /* n_prompts * n */
    srv_sub *subs;     /* (n_prompts) */
    int n_subs;        /* submitted */
    srv_choice *ch;    /* (n_choices) */
    lm_engine *engine; /* the engine the subs went to */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool sync_init;
    /* under mu (written by the engine thread) */
    srv_queue q;
    srv_fin *fin;           /* (n_choices) */
    bool overflow;          /* the queue outgrew its bound: cancelled */
    int n_final;            /* final events received */
    char error[256];        /* the first engine error */
    lm_status error_status; /* its kind (lm_event.status) */

    /* connection thread only */
    bool cancelled, timed_out, disconnected;
    strbuf out; /* streaming: formatted, not yet handed to the HTTP library */
    size_t out_pos;
    bool out_end;     /* the last bytes are in out */
    bool out_started; /* the opening chunks are written */
    double t_last_send;
};

/* server_parse.c: cJSON allocates through lm_malloc/lm_free from here on. */
void srv_json_init(void);
/* A body's bytes checked (not empty, UTF-8, no raw control character, no
 * \u0000 escape) and parsed as one JSON value with nothing after it: 0 with
 * *root (cJSON_Delete it), or -1 with a 400 in *e. Both parsers start here. */
int srv_parse_json(const char *body, size_t len, struct cJSON **root, lm_server_error *e);

/* server_gen.c */
srv_call *call_new(lm_server *s, struct MHD_Connection *conn, bool chat);
/* Cancel what runs, wait for every final event, release, free. */
void call_free(srv_call *c);
/* Run a parsed call: submit, then answer (stream or whole). Returns the
 * MHD_Result to give back to the library. */
int call_run(srv_call *c);
/* An engine status as an HTTP error: busy 429, too long 400
 * context_length_exceeded about prompt_param, out of memory 503, invalid
 * 400, anything else 500; returns -1. */
int srv_status_error(lm_server_error *e, lm_status rc, const char *prompt_param, const char *err);
/* Who sent the call, for the engine's fairness (lm_request_params.client). */
uint64_t srv_call_client(const srv_call *c);
/* Whether a waiting call must end now (connection thread, between waits):
 * the server is stopping, the call passed cfg.timeout (sets c->timed_out) or
 * its client went away (sets c->disconnected). The caller cancels. */
bool srv_call_ended(srv_call *c);

/* server_embed_run.c: an embeddings call, from call_run once the engine is
 * there: parse, submit every input, collect, answer. */
int embed_run(srv_call *c);
/* Cancel what still runs, wait for every final event, release, free c->emb. */
void embed_call_free(srv_call *c);

#endif
