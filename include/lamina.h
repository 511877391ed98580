/*
 * lamina.h - the public C API of lamina, an LLM inference and serving engine.
 *
 * The only header a program that embeds lamina needs. Link with
 * `$(pkg-config --cflags --libs lamina)` (shared) or `--static` (archive).
 * Every name the library exports starts with lm_.
 *
 * The objects:
 *   lm_model      a GGUF model file, loaded (weights memory-mapped) with its
 *                 tokenizer; read-only once loaded, shareable between engines.
 *   lm_tokenizer  text <-> token ids; from a model, or from a GGUF file that
 *                 holds only a vocabulary.
 *   lm_engine     the continuous-batching engine over one model: its own
 *                 thread runs every submitted request, many at once, each
 *                 iteration one flat batch through the model.
 *   lm_request    one submitted request, a handle to cancel it.
 *
 * Errors: every call that can fail returns an lm_status (LM_OK is 0, errors
 * are negative) and writes one line saying what is wrong into a caller's
 * buffer `err` of `errlen` bytes (LM_ERRLEN is enough; err may be NULL).
 * Nothing here prints or exits.
 *
 * Threads: loading, tokenizing and rendering are plain calls on the caller's
 * thread. An engine is safe to use from any number of threads; the event
 * callback of a request runs on the engine's thread and must return quickly
 * (copy the text out; never call lm_engine_free from it).
 *
 * Ownership: what a function returns through `**out` belongs to the caller
 * and has one free function (lm_model_free, lm_tokenizer_free,
 * lm_engine_free, lm_request_release, lm_string_free). A model must outlive
 * the engines and tokenizer handles made from it.
 *
 * This header also names the types the library uses inside (status codes,
 * finish reasons, sampling and request parameters, events, statistics), so
 * a request travels from the API to the engine without being copied into
 * another shape.
 *
 * Structs that grow: a newer lamina may add fields, always at the end, and a
 * program built against an older lamina.h keeps working with it.
 *   - A struct the program fills and passes in (lm_load_params,
 *     lm_engine_config, lm_spec_config, lm_request_params, lm_chat_options)
 *     begins with `size_t size`, the struct's size as the program was
 *     compiled. Fill it with its defaults
 *     macro (lm_engine_config_default(&c) calls lm_engine_config_init(&c,
 *     sizeof c)), then set fields. lamina reads only the first `size` bytes:
 *     a field past them keeps its default. A size below sizeof(size_t) or
 *     above the library's own struct (a program built against a newer
 *     lamina.h than the library it runs with) is LM_ERR_INVALID.
 *   - A struct lamina fills for the program (lm_model_info, lm_engine_stats)
 *     is written through a getter macro that passes sizeof: lamina writes only
 *     that many bytes.
 *   - lm_sample_params, lm_hist and lm_chat_msg never grow (they sit inside
 *     other structs or in arrays); new sampling fields go to the end of
 *     lm_request_params. lm_event and lm_request_stats are lamina's own
 *     memory, read through a pointer: their new fields come at the end.
 */
#ifndef LAMINA_H
#define LAMINA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LM_VERSION_MAJOR 0
#define LM_VERSION_MINOR 6
#define LM_VERSION_PATCH 0
#define LM_VERSION_STRING "0.6.0"

#if defined(__GNUC__) || defined(__clang__)
#define LM_API __attribute__((visibility("default")))
#else
#define LM_API
#endif

/* Bytes of an error-message buffer that always suffices. */
#define LM_ERRLEN 512

/* ---- status codes ------------------------------------------------------ */

typedef enum {
    LM_OK = 0,
    LM_ERR_INVALID = -1,     /* a bad argument or request field */
    LM_ERR_TOO_LONG = -2,    /* the prompt plus max_tokens can never fit the context or the KV pool */
    LM_ERR_BUSY = -3,        /* the engine's queue is full: try again later */
    LM_ERR_NOMEM = -4,       /* out of memory */
    LM_ERR_IO = -5,          /* a file cannot be opened, read or written */
    LM_ERR_FORMAT = -6,      /* a file is malformed (not GGUF, truncated, inconsistent) */
    LM_ERR_UNSUPPORTED = -7, /* well-formed but not supported (architecture, tensor type, tokenizer) */
    LM_ERR_CANCELLED = -8,   /* stopped on request (a progress callback said stop) */
    LM_ERR_INTERNAL = -9,    /* a bug in lamina: please report it */
} lm_status;

/* "ok", "invalid", "too_long", "busy", "nomem", "io", "format", "unsupported",
 * "cancelled", "internal"; "unknown" for any other value. */
LM_API const char *lm_status_name(lm_status s);

/* "MAJOR.MINOR.PATCH" of the library actually linked. */
LM_API const char *lm_version(void);

/* ---- opaque handles ---------------------------------------------------- */

typedef struct lm_model lm_model;
typedef struct lm_tokenizer lm_tokenizer;
typedef struct lm_engine lm_engine;
typedef struct lm_request lm_request;

/* ---- models -------------------------------------------------------------- */

/* Called during loading with the share done so far (0 .. 1, increasing);
 * returning false stops the load, which then fails with LM_ERR_CANCELLED. */
typedef bool (*lm_progress_fn)(void *user, float done);

typedef struct {
    size_t size;             /* sizeof(lm_load_params), set by lm_load_params_default */
    lm_progress_fn progress; /* may be NULL */
    void *progress_user;
} lm_load_params;

/* No progress callback. */
LM_API void lm_load_params_init(lm_load_params *p, size_t size);
#define lm_load_params_default(p) lm_load_params_init((p), sizeof *(p))

/* Open a GGUF model (p may be NULL). On success *out holds the model (free
 * with lm_model_free); on failure *out is NULL and the status says why:
 * LM_ERR_IO (cannot open or map the file), LM_ERR_FORMAT (not GGUF,
 * truncated, missing or misshapen tensors or metadata), LM_ERR_UNSUPPORTED
 * (an architecture, tensor type, tokenizer or option lamina does not run),
 * LM_ERR_NOMEM, LM_ERR_CANCELLED (the progress callback said stop; nothing
 * is left allocated), LM_ERR_INVALID (path or out NULL). */
LM_API lm_status lm_model_load(const char *path, const lm_load_params *p, lm_model **out, char *err, size_t errlen);
LM_API void lm_model_free(lm_model *m);

typedef struct {
    const char *name; /* general.name or the file's base name */
    const char *arch; /* "llama", "qwen2", "gemma3", ... */
    int n_vocab, n_ctx_train, n_embd, n_layer, n_head, n_head_kv;
    uint64_t n_params;
    uint64_t weight_bytes; /* bytes of all tensors in the file */
    int pooling;           /* lm_pooling: how the model pools an embedding (LM_POOL_NONE: a generative model) */
    bool causal;           /* attention is causal; false (bert, nomic-bert, gemma-embedding): the model only
                              embeds, each input in one pass of at most the batch's tokens */
} lm_model_info;

/* Fill the first size bytes of *info (lm_model_get_info passes sizeof); the
 * strings are valid while the model lives. */
LM_API void lm_model_info_get(const lm_model *m, lm_model_info *info, size_t size);
#define lm_model_get_info(m, info) lm_model_info_get((m), (info), sizeof *(info))
/* The model's tokenizer (owned by the model), or NULL when the file has none. */
LM_API const lm_tokenizer *lm_model_tokenizer(const lm_model *m);

/* ---- tokenizer ----------------------------------------------------------- */

/* A tokenizer from any GGUF file with tokenizer metadata: a full model or a
 * vocabulary-only file (no tensors, any architecture name). The file is
 * closed again before this returns. Errors as lm_model_load's (a file
 * without tokenizer metadata is LM_ERR_FORMAT). */
LM_API lm_status lm_tokenizer_load(const char *path, lm_tokenizer **out, char *err, size_t errlen);
/* Only for handles from lm_tokenizer_load (a model's belongs to the model). */
LM_API void lm_tokenizer_free(lm_tokenizer *t);

LM_API int32_t lm_vocab_size(const lm_tokenizer *t);
LM_API int32_t lm_token_bos(const lm_tokenizer *t); /* -1 if none */
LM_API int32_t lm_token_eos(const lm_tokenizer *t); /* -1 if none */
/* End of generation: EOS, end-of-turn or another such token. */
LM_API bool lm_token_is_eog(const lm_tokenizer *t, int32_t id);
/* Whether the model wants BOS before a prompt (what lm_tokenize adds with add_bos). */
LM_API bool lm_tokenizer_adds_bos(const lm_tokenizer *t);
/* Whether an input ends with EOS (tokenizer.ggml.add_eos_token, as an
 * embedding model's, Qwen3-Embedding's, asks): lm_tokenize never adds it;
 * append lm_token_eos before lm_embed, as `lamina embed` does. */
LM_API bool lm_tokenizer_adds_eos(const lm_tokenizer *t);

/* Encode len bytes of UTF-8 text. Writes up to cap ids into out and returns
 * how many the text encodes to (call again with a larger buffer when that is
 * more than cap), or a negative lm_status (LM_ERR_INVALID, LM_ERR_TOO_LONG
 * from 512 MiB of text, LM_ERR_NOMEM). add_bos adds BOS when the model uses
 * one (lm_tokenizer_adds_bos); parse_special matches control tokens written
 * in the text. Bytes that are not valid UTF-8 become byte tokens. */
LM_API int lm_tokenize(const lm_tokenizer *t, const char *text, size_t len, bool add_bos, bool parse_special,
                       int32_t *out, int cap);
/* Decode n ids to text (control tokens only when special). Writes up to cap
 * bytes (no NUL) and returns the full length, or a negative lm_status
 * (LM_ERR_INVALID for an id outside the vocabulary). The space a
 * SentencePiece tokenizer puts before the first word is dropped, so decoding
 * what lm_tokenize made gives the text back; a character split across the
 * last ids comes out as U+FFFD. */
LM_API long lm_detokenize(const lm_tokenizer *t, const int32_t *ids, int n, bool special, char *out, size_t cap);

/* ---- chat ------------------------------------------------------------------ */

typedef struct {
    const char *role;    /* "system", "user" or "assistant" */
    const char *content; /* UTF-8, NUL-terminated */
} lm_chat_msg;

/* Render a conversation as the prompt text the model expects, ending with
 * the header of the assistant's turn (ready for the reply). tmpl is a
 * template family name ("chatml", "llama2", "llama3", "mistral-v1",
 * "mistral-v3", "mistral-v3-tekken", "mistral-legacy", "gemma", "phi3",
 * "zephyr", "qwen3", "qwen3.5", "deepseek3", "deepseek-r1", "gpt-oss"), or NULL for the model's own template (with its architecture's
 * family where the file has none: Gemma 3 speaks "gemma"); `lamina run
 * --chat` and the server resolve templates the same way. When the tokenizer
 * adds BOS itself, a BOS the template writes first is left out, so the
 * prompt gets one BOS. On success *out is a NUL-terminated string to free
 * with lm_string_free; submit it as text (lm_request_params.text, which
 * parses special tokens). LM_ERR_INVALID: an unknown family name, or a
 * conversation the template refuses (roles that do not alternate, an
 * unknown role); LM_ERR_UNSUPPORTED: the model has no template, or one of no
 * family lamina renders. */
LM_API lm_status lm_chat_render(const lm_model *m, const char *tmpl, const lm_chat_msg *msgs, int n, char **out,
                                char *err, size_t errlen);

/* What a template takes beside the messages, for lm_chat_render_opts. */
typedef struct {
    size_t size;                  /* sizeof(lm_chat_options), set by lm_chat_options_default */
    const char *reasoning_effort; /* "low", "medium" or "high": gpt-oss's reasoning effort; NULL: the
                                     template's default (medium). Templates without it ignore it */
    bool thinking_off;            /* Qwen3's and Qwen3.5's enable_thinking=False; others ignore it */
    const char *date;             /* "YYYY-MM-DD": the day a template writes as today's (gpt-oss);
                                     NULL: today, local time */
    const char *model_identity;   /* gpt-oss's first system line; NULL: the template's own */
} lm_chat_options;
LM_API void lm_chat_options_init(lm_chat_options *o, size_t size);
#define lm_chat_options_default(o) lm_chat_options_init((o), sizeof *(o))

/* lm_chat_render with options (o NULL: lm_chat_render). LM_ERR_INVALID also
 * for an effort that is not low, medium or high, or a date that is not
 * YYYY-MM-DD. */
LM_API lm_status lm_chat_render_opts(const lm_model *m, const char *tmpl, const lm_chat_msg *msgs, int n,
                                     const lm_chat_options *o, char **out, char *err, size_t errlen);
LM_API void lm_string_free(char *s);

/* ---- embeddings ------------------------------------------------------------ */

/* How the hidden states of a prompt's tokens (after the final norm) become
 * one vector: GGUF's ARCH.pooling_type. LM_POOL_NONE is a generative model
 * (no pooling of its own); LM_POOL_DEFAULT asks for the model's. */
typedef enum {
    LM_POOL_DEFAULT = -1, /* the model's pooling_type */
    LM_POOL_NONE = 0,     /* none: a generative model (no embedding without an explicit pooling) */
    LM_POOL_MEAN = 1,     /* the average of every token's row */
    LM_POOL_CLS = 2,      /* the first token's row */
    LM_POOL_LAST = 3,     /* the last token's row */
} lm_pooling;

/* The width of an embedding vector (the model's n_embd); 0 for NULL. */
LM_API int lm_model_embd_dim(const lm_model *m);
/* Divide v (n floats) by its L2 norm, in place; a zero vector stays zero. */
LM_API void lm_embd_normalize(float *v, int n);

/* ---- sampling -------------------------------------------------------------- */

typedef struct {
    float temp;             /* <= 0: greedy */
    int top_k;              /* <= 0: off */
    float top_p;            /* >= 1: off; <= 0: the most likely token only */
    float min_p;            /* <= 0: off */
    float repeat_penalty;   /* 1: off (divide positive logits, multiply negative) */
    int repeat_last_n;      /* history window for penalties; 0: off, -1: whole history */
    float freq_penalty;     /* logit -= count * freq_penalty */
    float presence_penalty; /* logit -= (count > 0) * presence_penalty */
    uint64_t seed;
} lm_sample_params;

/* temp 0.8, top_k 40, top_p 0.95, min_p 0.05, penalties off, window 64, seed 0 */
LM_API void lm_sample_params_default(lm_sample_params *p);

/* ---- the engine ------------------------------------------------------------ */

/* KV cache element types (the GGUF tensor type ids). */
enum { LM_KV_F32 = 0, LM_KV_F16 = 1, LM_KV_Q8_0 = 8 };

/* LM_SPEC_MTP: the model's own next-token-prediction layer (qwen35 files with
 * nextn_predict_layers) guesses; a model without one is refused. */
enum { LM_SPEC_NONE = 0, LM_SPEC_NGRAM = 1, LM_SPEC_DRAFT = 2, LM_SPEC_MTP = 3 };

/* Speculative decoding's settings (lm_engine_config.spec), a struct that
 * grows (above): fill it with lm_spec_config_default, then set what
 * differs. */
typedef struct {
    size_t size;                 /* sizeof the struct this program was built with (set by the default) */
    int proposer;                /* LM_SPEC_NGRAM (default: prompt lookup), LM_SPEC_DRAFT (a draft model)
                             or LM_SPEC_MTP (the model's next-token-prediction layer) */
    int max;                     /* tokens proposed per step at most (<= 0: 4); the engine sizes each
                             proposal by its acceptance so far, and shrinks it under load */
    const lm_model *draft_model; /* LM_SPEC_DRAFT: the draft (its tokenizer must agree with the
                             target's; it must outlive the engine) */
    int min;                     /* LM_SPEC_DRAFT: fewer guesses than this propose nothing (default 0) */
    float p_min;                 /* LM_SPEC_DRAFT: a guess whose distribution's top probability is below
                             this ends the proposal (default 0: never) */
    float cost;                  /* a draft pass's time as a share of the model's, which sizes
                             proposals (a guess must pay for itself); 0 (default): measured once
                             when the engine starts, with the model pass's time by its rows;
                             > 0: priced flat; < 0: no cost model (propose while acceptance is
                             likely) */
    int draft_vocab;             /* LM_SPEC_DRAFT: the draft's LM head computes the logits of this many
                             tokens (its end-of-generation tokens and the best ranked by the
                             tokenizer's scores) and of the sequence's own tokens only, every
                             other token's -inf (its pass gets cheaper; output stays exact).
                             < 0 (default): 32768 for vocabularies over 65536 tokens, else the
                             whole vocabulary; 0: the whole vocabulary */
} lm_spec_config;

/* The defaults each field states; size bytes of *c are written. */
LM_API void lm_spec_config_init(lm_spec_config *c, size_t size);
#define lm_spec_config_default(c) lm_spec_config_init((c), sizeof *(c))

typedef struct {
    size_t size;                /* sizeof(lm_engine_config), set by lm_engine_config_default */
    int n_threads;              /* <= 0: one per core */
    int batch_tokens;           /* tokens per iteration; <= 0: the default (512); at least 64 for a hybrid model */
    int max_seqs;               /* sequences running at once (default 64) */
    int n_ctx;                  /* positions per sequence; <= 0: the model's */
    uint64_t kv_mem;            /* KV pool bytes; 0: n_ctx x max_seqs positions (capped at 4 GiB) */
    uint32_t kv_type;           /* LM_KV_F32, LM_KV_F16 (default) or LM_KV_Q8_0 */
    int block_size;             /* KV block tokens (default 16) */
    double watermark;           /* share of blocks kept free when admitting (default 0.01) */
    int max_waiting;            /* queued requests before submission fails LM_ERR_BUSY; 0: unbounded */
    bool prefix_cache;          /* share cached prompt blocks between requests (default true) */
    bool static_batching;       /* baseline for benchmarks: admit a batch only when nothing runs,
                             and none joins until all of it finished */
    uint64_t mem;               /* the whole memory budget in bytes: the weights (mapped, and their packed
                             copies), the workspace (activations, attention scratch per thread, the
                             logits rows) and the KV pool, which gets the rest (kv_mem is then
                             ignored); a rest too small for one sequence of n_ctx positions is
                             LM_ERR_INVALID. 0 (default): no budget, kv_mem's rule */
    bool mem_cap;               /* with mem: the pool takes at most what kv_mem 0 would give (n_ctx x
                             max_seqs positions, at most 4 GiB), the budget only a bound (the
                             command line's default budget); false: all the rest */
    const lm_spec_config *spec; /* speculative decoding (engine.md); NULL (default): none. Read by
                             lm_engine_new, which keeps a copy (its draft_model must outlive
                             the engine); requests speculate by default */
    int state_snapshots;        /* hybrid models with the prefix cache: slots for snapshots of the
                             recurrent state at cached prefixes' ends (engine.md). 0 (default): one
                             per max_seqs, with a budget at most a quarter of what the weights,
                             workspace and live state leave; < 0: none (a prefix hit then needs
                             the whole prefill); > 0: that many */
    double itl_factor;          /* the latency bound (engine.md): beside running decodes, prompt chunks
                             are cut so that a pass is predicted to take at most this many times a
                             decode-only pass (16 prompt tokens a pass at least); 0 or >= 1,
                             default 0: no bound (a prompt takes what batch_tokens leaves).
                             Models with recurrent layers (qwen35, qwen3next): none */
} lm_engine_config;

/* The defaults each field states; size bytes of *c are written. */
LM_API void lm_engine_config_init(lm_engine_config *c, size_t size);
#define lm_engine_config_default(c) lm_engine_config_init((c), sizeof *(c))

typedef enum {
    LM_FINISH_NONE = 0,  /* not finished (a token event) */
    LM_FINISH_STOP,      /* end-of-generation token or a stop string */
    LM_FINISH_LENGTH,    /* max_tokens or the context reached */
    LM_FINISH_CANCELLED, /* cancelled, or the engine shut down */
    LM_FINISH_ERROR,     /* see lm_event.error and lm_event.status */
} lm_finish;

/* "stop", "length", "cancelled", "error" ("none" for LM_FINISH_NONE). */
LM_API const char *lm_finish_name(lm_finish f);

/* Per-choice statistics, final in the done event. Times in seconds. */
typedef struct {
    int prompt_tokens; /* the prompt's length */
    int cached_tokens; /* of which taken from the prefix cache */
    int completion_tokens;
    int preemptions;
    double t_submit;   /* monotonic clock at submission */
    double queue;      /* submission -> first admitted into a batch by the scheduler (its
                                 first prefill chunk, or its fork from choice 0); a preempted and
                                 readmitted choice keeps its first value; 0 until admitted */
    double ttft;       /* submission -> first token */
    double e2e;        /* submission -> finish */
    double tpot;       /* (e2e - ttft) / (completion_tokens - 1); 0 if fewer than 2 */
    int spec_proposed; /* speculative decoding: tokens proposed, and of them accepted */
    int spec_accepted;
    int spec_steps; /*   passes that verified a proposal */
} lm_request_stats;

#define LM_MAX_TOP_LOGPROBS 20

typedef struct {
    int index;        /* the choice (0 .. n-1) */
    int32_t token;    /* the sampled token; -1 in a done event */
    const char *text; /* text released by this event (UTF-8, may be empty; */
    size_t text_len;  /*   held back while it could begin a stop string) */
    float logprob;    /* log p(token) under the model's distribution, if logprobs */
    int n_top;        /* top_logprobs entries below */
    const int32_t *top_ids;
    const float *top_logprobs;
    bool done; /* the choice's final event */
    lm_finish finish;
    lm_status status;  /* with LM_FINISH_ERROR: what kind of error */
    const char *error; /* with LM_FINISH_ERROR: what went wrong */
    const lm_request_stats *stats;
    const float *embedding; /* embed requests, in the done event with LM_FINISH_STOP: n_embedding floats,
                               pooled (after the model's post-pooling projections, if any), NOT
                               normalized; NULL otherwise */
    int n_embedding;
} lm_event;

/* Called on the engine's thread; everything ev points to is valid only
 * during the call. */
typedef void (*lm_event_fn)(void *user, const lm_event *ev);

typedef struct {
    size_t size;          /* sizeof(lm_request_params), set by lm_request_params_default */
    lm_event_fn on_event; /* required */
    void *user;
    const int32_t *prompt; /* token ids (copied at submission), at least one; or NULL and: */
    int n_prompt;
    const char *text;        /* the prompt as text, tokenized at submission (BOS as the model */
    size_t text_len;         /*   adds it, special tokens parsed) */
    int max_tokens;          /* > 0: the context is full when every position holds a token and
                                 one more is sampled from the last (n_ctx + 1 tokens in all);
                                 prompt + max_tokens beyond that is LM_ERR_TOO_LONG.
                                 < 0: until the context is full. */
    int n;                   /* choices sampled from one prompt (forked KV), >= 1 */
    lm_sample_params sp;     /* choice i uses seed sp.seed + i */
    const int32_t *bias_ids; /* logit bias entries (copied) */
    const float *bias_vals;
    int n_bias;
    const char *const *stop; /* stop strings (copied); not part of the output */
    int n_stop;
    bool ignore_eos;
    bool penalize_prompt;                /* the prompt's tokens enter the penalty history (repetition,
                                 frequency, presence), as lamina run does; else only generated ones */
    bool logprobs;                       /* fill logprob in token events */
    int top_logprobs;                    /* 0 .. LM_MAX_TOP_LOGPROBS */
    int priority;                        /* lower runs first (default 0) */
    uint64_t cache_salt;                 /* prefix-cache namespace */
    const char *grammar;                 /* GBNF text the output must follow (NULL: free), compiled at submission:
                                 a bad grammar is LM_ERR_INVALID naming its line and column. Tokens
                                 that cannot continue it are removed before any sampling step; when
                                 it can only end, the choice finishes with LM_FINISH_STOP */
    size_t grammar_len;                  /* its bytes (0: strlen(grammar)); at most 256 KiB */
    const char *grammar_root;            /* its start rule (NULL: "root") */
    const char *const *grammar_triggers; /* lazy grammar: the output is free until it contains one of */
    int n_grammar_triggers;              /*   these strings; the grammar then holds from the trigger's first byte */
    int spec_k;                          /* speculative decoding (an engine with a proposer): 0 its default,
                                 < 0 off, > 0 at most this many tokens per step (capped at spec->max).
                                 Greedy output is the same token for token; sampled output has the
                                 same distribution (a seed reproduces it at the same load) */
    uint64_t client;   /* who sent it, for fairness (0: none; such requests go by arrival alone, ahead of
                        the clients' turns). Among requests of one priority, clients take turns
                        (fair queuing): a client's choices queue behind its own earlier ones, and
                        a client with many queued never holds back another's first ones by more
                        than a turn */
    bool special_text; /* the text of control tokens is part of the output (gpt-oss's harmony
                          markers, <|channel|> and the like, which a reader of its channels needs);
                          end-of-generation tokens still leave no text */
    bool embed;        /* an embedding request: the prompt is prefilled only (nothing sampled; max_tokens,
                          sampling, grammar, stop, logprobs ignored; n must be 1) and the done event
                          carries its pooled vector (lm_event.embedding). Bypasses the prefix cache */
    int pooling;       /* with embed: LM_POOL_DEFAULT (default: the model's pooling_type), LM_POOL_MEAN,
                          LM_POOL_CLS or LM_POOL_LAST. A model whose pooling_type is LM_POOL_NONE (a
                          generative model) with LM_POOL_DEFAULT is LM_ERR_INVALID */
} lm_request_params;

/* The defaults each field states (sampling: lm_sample_params_default's);
 * on_event NULL. size bytes of *p are written. */
LM_API void lm_request_params_init(lm_request_params *p, size_t size);
#define lm_request_params_default(p) lm_request_params_init((p), sizeof *(p))

/* Start an engine (and its thread) over a model that must outlive it (c may
 * be NULL: the defaults). LM_ERR_INVALID for a model without a tokenizer or
 * a bad configuration; LM_ERR_NOMEM when the KV pool, buffers or threads
 * cannot be had. */
LM_API lm_status lm_engine_new(const lm_model *m, const lm_engine_config *c, lm_engine **out, char *err, size_t errlen);
/* Cancels everything still queued or running (each gets its final event),
 * stops the thread, frees the engine. */
LM_API void lm_engine_free(lm_engine *e);

/* Queue a request. On LM_OK every choice gets token events and exactly one
 * final (done) event; *out (when out is not NULL) is a handle for
 * lm_request_cancel, valid until lm_request_release. On failure no event is
 * ever called: LM_ERR_INVALID (a bad field), LM_ERR_TOO_LONG (can never fit),
 * LM_ERR_BUSY (max_waiting requests already wait). */
LM_API lm_status lm_engine_submit(lm_engine *e, const lm_request_params *p, lm_request **out, char *err, size_t errlen);
/* Ask a request to end (final event LM_FINISH_CANCELLED unless it finished
 * first). Any thread; safe after it finished. */
LM_API void lm_request_cancel(lm_engine *e, lm_request *r);
LM_API void lm_request_release(lm_engine *e, lm_request *r);
/* Block until nothing is queued or running. */
LM_API void lm_engine_wait_idle(lm_engine *e);

/* Embed n inputs, each a token list (tokens[i], n_tokens[i] >= 1), and
 * block until all are done; safe from any thread (not from an event
 * callback). pooling as lm_request_params.pooling. out receives n rows of
 * lm_model_embd_dim floats, or of dimensions floats when dimensions > 0
 * (Matryoshka: the leading dimensions, kept before normalizing), each
 * L2-normalized when normalize. LM_ERR_INVALID: a bad argument, dimensions
 * above the model's width, a generative model with LM_POOL_DEFAULT;
 * LM_ERR_TOO_LONG: an input that cannot fit the context; an input that fails
 * in the engine gives its status. On failure out is undefined. */
LM_API lm_status lm_embed(lm_engine *e, const int32_t *const *tokens, const int *n_tokens, int n, int pooling,
                          int dimensions, bool normalize, float *out, char *err, size_t errlen);

/* A histogram with fixed upper bounds (Prometheus style, cumulative on read). */
#define LM_HIST_MAX 16
typedef struct {
    int n_bounds;
    double bounds[LM_HIST_MAX];
    uint64_t counts[LM_HIST_MAX + 1]; /* per bucket, the last for > every bound (not cumulative) */
    double sum;
    uint64_t count;
} lm_hist;

typedef struct {
    int running, waiting;
    uint64_t requests_total, requests_finished, requests_rejected;
    uint64_t prompt_tokens_total, generation_tokens_total;
    uint64_t iterations, batch_seqs_total, batch_tokens_total;
    uint64_t preemptions_total;
    int64_t kv_blocks_total, kv_blocks_used, kv_blocks_free, kv_blocks_cached; /* global (all) blocks */
    /* blocks of sliding-window layers, all 0 without them */
    int64_t kv_local_blocks_total, kv_local_blocks_used, kv_local_blocks_free, kv_local_blocks_cached;
    uint64_t prefix_queries_total, prefix_hits_total;
    lm_hist batch_size;                                                  /* sequences per iteration */
    lm_hist ttft, tpot, e2e;                                             /* seconds */
    uint64_t spec_proposed_total, spec_accepted_total, spec_steps_total; /* speculative decoding */
    /* the memory split, fixed at start, in bytes */
    uint64_t mem_budget;    /* lm_engine_config.mem; 0: none given */
    uint64_t mem_weights;   /* tensors mapped from the file */
    uint64_t mem_packed;    /* packed copies of weights (heap, beside the mapping) */
    uint64_t mem_workspace; /* forward-pass workspace, attention scratch per thread, logits rows,
                               the embeddings' hidden-state rows */
    uint64_t mem_kv;        /* the KV pool's K/V data (both classes) */
    int64_t kv_max_tokens;  /* positions of context the pool holds */
    int64_t kv_max_seqs;    /* sequences of the full context it holds at once */
    /* a draft model's share of the memory (LM_SPEC_DRAFT; 0 without one) */
    uint64_t mem_draft_weights;   /* its tensors, mapped and packed */
    uint64_t mem_draft_workspace; /* its forward pass, buffers, and the guesses' distributions */
    uint64_t mem_draft_kv;        /* its own KV pool */
    /* compiled grammars kept for reuse (bounded in bytes, least recently used dropped first) */
    uint64_t grammar_cache_bytes;     /* their memory, matchers' caches included, as last measured */
    int64_t grammar_cache_entries;    /* how many */
    uint64_t grammar_compiles_total;  /* grammars compiled (requests that found none kept) */
    uint64_t grammar_evictions_total; /* kept grammars dropped for room */
    /* hybrid models (linear-attention layers): the recurrent state store's
     * slots, one per running sequence, the snapshots and, with speculation,
     * the checkpoints verification rolls the state back to (0 for a model
     * without such layers) */
    uint64_t mem_state;
    /* of mem_state, the snapshots of the state the prefix cache restores (hybrid models) */
    uint64_t mem_state_snap;
    int64_t state_snap_slots, state_snap_used; /* snapshot slots, and those holding one */
    uint64_t state_snap_saved_total;           /* snapshots stored at a prompt's block boundary */
    uint64_t state_snap_restored_total;        /* prefix hits that restored one (the state at the hit's end) */
    uint64_t state_snap_evicted_total;         /* dropped for room, least recently used first */
    uint64_t state_snap_dropped_total;         /* dropped with their KV block (evicted from the prefix cache) */
    /* speculation on hybrid models: verification steps whose state was
     * rolled back to a checkpoint (a proposal rejected), and proposals cut
     * short (or left out) for want of free checkpoints */
    uint64_t spec_rollbacks_total, spec_ckpt_short_total;
} lm_engine_stats;

/* Fill the first size bytes of *st (lm_engine_get_stats passes sizeof). */
LM_API void lm_engine_stats_get(lm_engine *e, lm_engine_stats *st, size_t size);
#define lm_engine_get_stats(e, st) lm_engine_stats_get((e), (st), sizeof *(st))

#ifdef __cplusplus
}
#endif

#endif
