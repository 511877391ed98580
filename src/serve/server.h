/*
 * server.h - an OpenAI-compatible HTTP front end for the engine.
 *
 * Routes (JSON in and out, OpenAI's request and response shapes):
 *   POST /v1/completions        text completion; prompt a string, an array of
 *                               strings, an array of token ids or an array of
 *                               such arrays (each its own prompt)
 *   POST /v1/chat/completions   chat: messages rendered with the chat template
 *   POST /v1/embeddings         embeddings (server_embed.c): input a string,
 *                               an array of strings, of token ids or of such
 *                               arrays; each input one engine embedding
 *                               request, all submitted, then collected
 *   GET  /v1/models             the one model served
 *   GET  /health                503 while the model loads, 200 when ready
 *   GET  /metrics               Prometheus text: engine gauges, counters and
 *                               histograms, HTTP requests by status
 * With "stream": true the answer comes as Server-Sent Events, one chunk per
 * released piece of text, a final chunk with the finish reason, an optional
 * usage chunk, then "data: [DONE]"; comment lines keep the connection alive
 * while nothing else is sent.
 *
 * finish_reason is "stop" (an end-of-generation token or a stop string),
 * "length" (max_tokens or the context), "tool_calls" (the answer is tool
 * calls) or "abort" (cut by the request timeout; vLLM's value for an
 * aborted request).
 *
 * Structured outputs (server_tools.c): response_format {"type":
 * "json_object"} or {"type": "json_schema", "json_schema": {"name",
 * "schema", "strict"}} on both routes, and the extensions "grammar" (GBNF
 * text) and "json_schema" (a schema), constrain every choice's text through
 * the engine's grammar; a grammar or schema that does not compile is a 400
 * naming the problem. Tools on chat: "tools" (functions with a JSON Schema
 * of their parameters) are written into the prompt by the chat template in
 * its family's syntax (chat.h), "tool_choice" none / auto / required / a
 * named function and "parallel_tool_calls" pick the constraint (a grammar
 * from the first token, or a lazy one from the syntax's opener for auto),
 * and the answer's text is read back into "tool_calls" (each call once: a
 * repeat of an earlier call of the answer is dropped; whole, or streamed
 * as OpenAI's incremental tool_calls deltas), with finish_reason
 * "tool_calls". Messages with role "tool" and assistant messages with
 * "tool_calls" are rendered by the template. An error the engine meets
 * while generating is no finish reason: the answer is an error object, with
 * the status its lm_status maps to (400 for the request's own fault, 503 out
 * of memory, 500 otherwise), as the last event of a stream.
 *
 * Reasoning (text/reasoning.h): with a thinking family's template (qwen3,
 * qwen3.5, deepseek-r1, gpt-oss) a chat answer's reasoning is split off
 * into message.reasoning_content / delta.reasoning_content and content
 * holds only the answer (gpt-oss's commentary calls become tool_calls),
 * unless the request's "reasoning_format" or the server's
 * reasoning_inline keeps it inline; response_format and tool grammars
 * then wait for the reasoning's end (a lazy trigger), the raw "grammar"
 * holds the whole output, and gpt-oss's requests ask the engine for the
 * control tokens' text (special_text).
 *
 * Threads: the HTTP library runs one thread per connection. A slow client
 * (a trickled request, a stream it does not read) blocks only its own
 * thread, which waits in poll() and costs its stack's touched pages and
 * the connection's memory pool; the limits below bound how many there are.
 * Generation goes through the engine only (engine_submit / engine_cancel); the engine calls
 * back on its own thread, and that callback only appends to a bounded
 * per-request queue and signals, never blocks. The connection's thread turns
 * the queue into JSON. A request whose client went away, whose queue
 * overflowed (a client that does not read) or that ran past the timeout is
 * cancelled, and its KV blocks return to the pool.
 *
 * Request parsing is a pure function (server_parse_request): body bytes in,
 * engine-ready parameters or an HTTP status with an OpenAI error out, no
 * sockets and no engine, so it can be unit-tested and fuzzed.
 *
 * Library code: nothing here prints or exits. Notices (an unusable chat
 * template) go to the log callback of the configuration.
 */
#ifndef LAMINA_SERVER_H
#define LAMINA_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sched/engine.h"
#include "decode/sample.h"
#include "text/tokenizer.h"

/* ---------------------------------------------------------------- parsing */

#define SERVER_MAX_STOP 16          /* stop strings a request may give */
#define SERVER_MAX_STOP_LEN 256     /* bytes per stop string */
#define SERVER_MAX_CACHE_SALT 256   /* bytes of a cache_salt string */
#define SERVER_MAX_PROMPTS 64       /* prompts in one completions request */
#define SERVER_MAX_BIAS 1024        /* logit_bias entries */
#define SERVER_MAX_TOOLS 128        /* tools in one chat request */
#define SERVER_MAX_TOKENS_CHAT 1024 /* a chat request's max_tokens when it sets none */

/* What the parser needs to know about the model and the limits. */
typedef struct {
    const lm_tokenizer *tok;
    int n_ctx;                        /* positions per sequence */
    const char *model_name;           /* requests naming another model get 404 */
    int chat_family;                  /* a family (chat.h), or -1 to use chat_template */
    const char *chat_template;        /* Jinja text for chat_render_template, or NULL */
    const char *chat_error;           /* when neither is usable: why chat requests fail */
    int max_n;                        /* largest n (choices per prompt) */
    int max_tokens_cap;               /* largest max_tokens; 0: only the context limits it */
    int max_tokens_default;           /* a request without max_tokens: this many (within the context);
                                  0: SERVER_MAX_TOKENS_CHAT for chat, 16 for completions */
    const lm_sample_params *sampling; /* temperature, top_k, top_p and min_p for a request that
                                  leaves them out; NULL: sample_params_default's */
    int max_seqs;                     /* the engine's sequences at once (n above it: 400); 0: no limit */
    bool reasoning_inline;            /* the server's reasoning format is inline (a request's
                                  reasoning_format overrides it) */
    int n_embd;                       /* /v1/embeddings: the width of the model's embedding vector
                                  (dimensions above it: 400) */
    const char *embed_error;          /* when embeddings cannot be served: why (a 400 to every
                                  embeddings request); NULL: they can */
} lm_server_parse_ctx;

/* An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}. */
typedef struct {
    int status; /* HTTP status; 200 when there is no error */
    char message[320];
    char type[40];  /* "invalid_request_error", "authentication_error", ... */
    char param[48]; /* the offending parameter, "" for none */
    char code[40];  /* "" for none */
} lm_server_error;

/* One request, ready for engine_submit (one submission per prompt). */
typedef struct {
    bool chat;
    bool stream, include_usage;
    bool echo;         /* completions: prepend the prompt text */
    int n_prompts;     /* >= 1 */
    int32_t **prompts; /* (n_prompts) token arrays */
    int *n_prompt;     /* (n_prompts) their lengths, >= 1 */
    char **echo_text;  /* (n_prompts) with echo: the prompt as text, else NULL */
    /* What every prompt's submission shares: max_tokens (>= 1, every prompt
     * plus max_tokens within the context: engine_fit_context), n, sampling,
     * logit bias (bias_ids, bias_vals owned by this request; -INFINITY bans
     * a token), stop strings (pointing into stops; the chat stop marker
     * included), ignore_eos, logprobs, top_logprobs (0 ..
     * LM_MAX_TOP_LOGPROBS), priority. The prompt, each prompt's seed (unless
     * seed_given) and the callback are filled at submission. */
    lm_request_params p;
    bool seed_given;                  /* else the caller picks a seed */
    char *stops[SERVER_MAX_STOP + 1]; /* (p.n_stop) owned */
    /* Constrained output (owned): the GBNF text every choice's text must
     * match (response_format json_object / json_schema, grammar, json_schema,
     * or the tool-call grammar), or NULL. With triggers the grammar is lazy:
     * the text is free until one of them appears, and the grammar matches
     * from the trigger's first byte on (tool_choice auto; a thinking
     * family's answer grammar, triggered by the reasoning's end:
     * srv_reason_grammar). Triggers never come without a grammar. */
    char *grammar;
    char *grammar_triggers[2]; /* (n_grammar_triggers) owned */
    int n_grammar_triggers;
    /* Tool calls: the answer's text is read for calls in tool_syntax
     * (chat_tool_syntax of the template's family) and answered as tool_calls. */
    bool tool_calls;
    int tool_syntax;
    /* The xml syntax: which parameters of which tool are read back as text
     * (strings; the others as JSON), a list of NUL-terminated names: per
     * tool its name and its text parameters, an empty name ending each
     * tool. Owned; NULL otherwise. */
    char *tool_strings;
    /* Reasoning (chat, a thinking family: text/reasoning.h): reason_syntax
     * is the family's REASON_* (REASON_NONE: none), reason_open whether the prompt
     * ended inside the reasoning; reason_split: answer it apart as
     * reasoning_content (reasoning_format separate), else inline in content.
     * grammar_raw: the grammar came from the "grammar" field, which covers
     * the whole output; response_format, json_schema and tools grammars
     * start where the reasoning ends. */
    int reason_syntax;
    bool reason_open, reason_split, grammar_raw;
    /* cache_salt: given (a string of 1..SERVER_MAX_CACHE_SALT bytes), and
     * the first 8 bytes of its SHA-256 (server_request_salt mixes it in). */
    bool cache_salt_given;
    uint64_t cache_salt_hash;
} lm_server_request;

/*
 * Parse a request body for /v1/completions (chat false) or
 * /v1/chat/completions (chat true): validate it, render and tokenize the
 * prompt, check the limits. Returns 0 with *out filled (release it with
 * server_request_free), or -1 with *e set (a 4xx status) and *out empty.
 * Never reads past len; the body need not be NUL-terminated.
 */
int server_parse_request(const lm_server_parse_ctx *c, bool chat, const char *body, size_t len, lm_server_request *out,
                         lm_server_error *e);
void server_request_free(lm_server_request *r);

/* ------------------------------------------------------------- embeddings */

#define SERVER_MAX_EMBED_INPUTS 2048   /* inputs in one embeddings request (OpenAI's bound) */
#define SERVER_MAX_EMBED_TOKENS 262144 /* tokens of all the inputs of one request */

/* One POST /v1/embeddings request (server_embed.c): each input a token array
 * for one engine embedding request. */
typedef struct {
    int n_inputs;       /* 1 .. SERVER_MAX_EMBED_INPUTS */
    int32_t **inputs;   /* (n_inputs) token arrays, owned */
    int *n_input;       /* (n_inputs) their lengths, 1 .. n_ctx */
    long long n_tokens; /* their sum (usage.prompt_tokens), <= SERVER_MAX_EMBED_TOKENS */
    bool base64;        /* encoding_format "base64": little-endian float32 bytes */
    int dimensions;     /* the answer's width: the given dimensions, else the model's */
    bool normalize;     /* L2-normalize after truncating (default; "normalize": false, lamina's
                            extension, answers the pooled vector as it is) */
} lm_server_embed_request;

/*
 * Parse a /v1/embeddings body: input (a string, an array of strings, an
 * array of token ids, or an array of such arrays; strings tokenized as
 * `lamina embed` does: BOS, special tokens, EOS when tok_add_eos), encoding_format ("float" or "base64"),
 * dimensions (1 .. c->n_embd), model, user, normalize. Checks in the order
 * bytes -> JSON -> object -> model -> embed_error -> encoding_format ->
 * dimensions -> user -> normalize -> input (shape, count, each input, the
 * total). Returns 0 with *out filled (server_embed_request_free), or -1
 * with *e set and *out empty. Never reads past len.
 */
int server_parse_embed(const lm_server_parse_ctx *c, const char *body, size_t len, lm_server_embed_request *out,
                       lm_server_error *e);
void server_embed_request_free(lm_server_embed_request *r);

/* One answer vector from a pooled one: its first r->dimensions floats of
 * pooled (width floats, width >= r->dimensions), L2-normalized when
 * r->normalize (a zero vector stays zero) into out (r->dimensions floats).
 * -1 when a value is not finite (nothing JSON can carry). out may be pooled
 * itself or lie before it in the same buffer (each value is read before any
 * write reaches it). */
int server_embed_vector(const lm_server_embed_request *r, const float *pooled, int width, float *out);

/* The answer: {"object": "list", "data": [{"object": "embedding", "index":
 * i, "embedding": [floats] or "base64"}, ...], "model", "usage":
 * {"prompt_tokens", "total_tokens"}} over vecs (n_inputs, dimensions) as
 * server_embed_vector made them; floats printed to round-trip (%.9g).
 * lm_malloc'ed text (lm_free), or NULL when out of memory. */
char *server_embed_answer(const lm_server_embed_request *r, const char *model, const float *vecs);

/* Prefix-cache salts. A tenant's salt: 0 without authentication, else the
 * first 8 bytes of SHA-256 of a domain tag and the API key. A request's
 * salt: the tenant's, or with a cache_salt field SHA-256 of the tenant's
 * salt and that string's hash, so neither a key nor a cache_salt can reach
 * another's namespace short of a SHA-256 collision. */
uint64_t server_tenant_salt(const char *api_key);
uint64_t server_request_salt(uint64_t tenant, const lm_server_request *r);

/* Fill *e and return -1 (for `return server_error(...)`). */
int server_error(lm_server_error *e, int status, const char *type, const char *param, const char *code, const char *fmt,
                 ...) __attribute__((format(printf, 6, 7)));

/* ----------------------------------------------------------------- server */

typedef void (*lm_server_log_fn)(void *user, const char *line);

typedef struct {
    const char *host;    /* numeric address or name to bind (default 127.0.0.1) */
    int port;            /* 0: any free port (see server_port) */
    const char *api_key; /* NULL or "": no authentication */
    /* More accepted keys (each a tenant of its own, like api_key): with any
     * key set, the /v1 routes need one of them. Every key's requests get their own
     * prefix-cache salt (server_tenant_salt), so cached prefixes are shared
     * within a key and never across keys. */
    const char *const *api_keys;
    int n_api_keys;
    const char *model_name;         /* the name /v1/models reports and requests may use */
    const char *chat_template;      /* a family name, or NULL for the model's own */
    const char *chat_template_text; /* a template's text (from a file), or NULL */
    bool reasoning_inline;          /* thinking families' reasoning left inline in content
                                  (--reasoning-format inline); default: apart, as reasoning_content */
    int pooling;                    /* /v1/embeddings (lm_pooling): LM_POOL_MEAN, _CLS or _LAST pool
                                  that way whatever the model says (--pooling; the opt-in that lets
                                  a generative model embed); LM_POOL_DEFAULT (default) or
                                  LM_POOL_NONE: the model's pooling_type, and a generative model's
                                  embeddings requests get a 400 saying why */
    size_t max_body;                /* request body bytes (default 1 MiB) */
    int max_n;                      /* default 16 */
    int max_tokens_cap;             /* 0: the context is the only limit */
    /* The server's defaults for what a request leaves out: sampling (only
     * temperature, top_k, top_p and min_p are read; server_config_default
     * sets sample_params_default's, the values `lamina run` uses) and
     * max_tokens (0: SERVER_MAX_TOKENS_CHAT on chat, OpenAI's 16 on
     * completions). */
    lm_sample_params sampling;
    int max_tokens_default;
    double timeout;       /* seconds per request, then it is cancelled; 0: none */
    double keepalive;     /* seconds of silence before a keep-alive comment (default 3) */
    int idle_timeout;     /* seconds a connection may sit idle (no request, or a client that
                                  reads nothing) before it is closed (default 60) */
    size_t stream_buffer; /* bytes a streaming request may hold unsent before it is
                                  cancelled (default 4 MiB) */
    /* Connections. The HTTP library holds a connection's request line,
     * headers and buffers in one pool of conn_memory bytes: a request line or
     * headers that do not fit get 414 or 431. The whole request (headers and
     * body) must arrive within read_timeout seconds of its first byte, or the
     * connection is closed. A new connection past max_connections, or from
     * an address that already holds max_conn_per_ip, is closed at once (the
     * library accepts and closes it). */
    int max_connections;  /* default 512 */
    int max_conn_per_ip;  /* default 256 (half the connections); 0: no limit */
    size_t conn_memory;   /* bytes per connection (default 32 KiB, at least 8 KiB) */
    double read_timeout;  /* seconds to receive one request (default 30); 0: no limit */
    int max_headers;      /* request header lines; more: 431 (default 100) */
    lm_server_log_fn log; /* notices; may be NULL */
    void *log_user;
} lm_server_config;

void server_config_default(lm_server_config *c);

typedef struct lm_server lm_server;

/*
 * Start listening. The engine may be NULL: the server then answers /health
 * with 503 and the generation routes with 503 until server_set_engine. The
 * configuration's strings are copied. NULL with a message on failure (the
 * address cannot be bound, ...).
 */
lm_server *server_new(lm_engine *e, const lm_server_config *c, char *err, size_t errlen);
/* Attach the engine once the model is loaded (once). Resolves the chat
 * template; one that cannot be used is logged, and chat requests then fail
 * with 400 naming why. Returns 0, or -1 with a message. */
int server_set_engine(lm_server *s, lm_engine *e, char *err, size_t errlen);
/* The port listened on (the chosen one when the configuration said 0). */
int server_port(const lm_server *s);
/* The first half of a graceful stop: close the listening socket (no new
 * connection), and answer every new request on an open one, /health
 * included, with 503 "the server is shutting down" and Connection: close.
 * The requests already taken go on. */
void server_quiesce(lm_server *s);
/* Generation requests taken and not yet answered to the end (their answer
 * fully sent, or their connection gone). */
int server_active_calls(lm_server *s);
/* Stop accepting, cancel what is still in flight (a whole request gets 503
 * "the server is shutting down", a stream that error event and [DONE]),
 * give those answers up to 5 s to go out, wait for every connection's
 * thread, free. The engine is not freed (the caller owns it and frees it
 * after this returns). */
void server_free(lm_server *s);

#endif
