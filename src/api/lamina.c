/*
 * lamina.c - the public C API (include/lamina.h) over the layers above it.
 *
 * Every function here is thin: it checks the caller's arguments (a bad one
 * is LM_ERR_INVALID, never a crash), calls the module that does the work and
 * turns that module's result into an lm_status. The opaque handles of
 * lamina.h are the internal structs themselves: an lm_model is model.h's
 * struct, an lm_tokenizer tokenizer.h's, an lm_engine and lm_request the
 * engine's. So a handle costs no allocation of its own, and the engine,
 * server and command line work on exactly what an embedder holds.
 *
 * A tokenizer loaded on its own (lm_tokenizer_load) needs nothing else:
 * tok_load copies what it reads, so the GGUF file is closed before the
 * handle is returned. A model's tokenizer belongs to the model.
 *
 * These are the only functions the shared library exports (everything else
 * is compiled with hidden visibility); each is marked LM_API in lamina.h.
 *
 * Structs that grow (lamina.h): a struct a program passes in is copied over
 * this library's defaults, its own `size` bytes of it (widened), before any
 * module sees it; inside the library every struct is whole. A struct lamina
 * fills is made whole here and its first `size` bytes copied out.
 */
#include "lamina.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#include "base/util.h"
#include "decode/sample.h"
#include "format/gguf.h"
#include "model/embed.h"
#include "model/model.h"
#include "sched/engine.h"
#include "text/chat.h"
#include "text/tokenizer.h"

/* The most bytes lm_tokenize accepts (the tokenizer's own limit is 512 MiB). */
#define API_MAX_TEXT ((size_t)1 << 29)

static lm_status fail(lm_status s, char *err, size_t errlen, const char *msg) {
    lm_err(err, errlen, "%s", msg);
    return s;
}

/* Widen a caller's struct of `size` bytes (its first field) into whole, which
 * holds the defaults: LM_ERR_INVALID for a size no lamina.h gives. */
static lm_status widen(void *whole, size_t whole_size, const void *in, const char *what, char *err, size_t errlen) {
    size_t size;
    memcpy(&size, in, sizeof size);
    if (size < sizeof size || size > whole_size) {
        lm_err(err, errlen,
               "%s.size is %zu, this library's is %zu: fill the struct with its _default macro (a size above "
               "the library's means a newer lamina.h than the library)",
               what, size, whole_size);
        return LM_ERR_INVALID;
    }
    memcpy(whole, in, size);
    memcpy(whole, &whole_size, sizeof whole_size);
    return LM_OK;
}

/* Write the first size bytes of whole to out. */
static void narrow(void *out, size_t size, const void *whole, size_t whole_size) {
    memcpy(out, whole, size < whole_size ? size : whole_size);
}

/* ---- status, version --------------------------------------------------- */

const char *lm_status_name(lm_status s) {
    switch (s) {
        case LM_OK: return "ok";
        case LM_ERR_INVALID: return "invalid";
        case LM_ERR_TOO_LONG: return "too_long";
        case LM_ERR_BUSY: return "busy";
        case LM_ERR_NOMEM: return "nomem";
        case LM_ERR_IO: return "io";
        case LM_ERR_FORMAT: return "format";
        case LM_ERR_UNSUPPORTED: return "unsupported";
        case LM_ERR_CANCELLED: return "cancelled";
        case LM_ERR_INTERNAL: return "internal";
    }
    return "unknown";
}

const char *lm_version(void) { return LM_VERSION_STRING; }

/* ---- models -------------------------------------------------------------- */

lm_status lm_model_load(const char *path, const lm_load_params *p, lm_model **out, char *err, size_t errlen) {
    if (out) *out = NULL;
    if (!path || !out) return fail(LM_ERR_INVALID, err, errlen, "lm_model_load: path and out are required");
    lm_load_params whole = {.size = sizeof whole};
    if (p) {
        lm_status st = widen(&whole, sizeof whole, p, "lm_load_params", err, errlen);
        if (st != LM_OK) return st;
        p = &whole;
    }
    lm_status st;
    *out = model_load_params(path, p, &st, err, errlen);
    return *out ? LM_OK : st;
}

void lm_model_free(lm_model *m) { model_free(m); }

void lm_load_params_init(lm_load_params *p, size_t size) {
    if (!p) return;
    lm_load_params whole = {.size = size};
    narrow(p, size, &whole, sizeof whole);
}

void lm_model_info_get(const lm_model *m, lm_model_info *info, size_t size) {
    if (!m || !info) return;
    const lm_hparams *hp = &m->hp;
    lm_model_info whole = (lm_model_info){
        .name = m->name,
        .arch = model_arch_name(hp->arch),
        .n_vocab = hp->n_vocab,
        .n_ctx_train = hp->n_ctx_train,
        .n_embd = hp->n_embd,
        .n_layer = hp->n_layer,
        .n_head = hp->n_head,
        .n_head_kv = hp->n_head_kv,
        .n_params = m->n_params,
        .weight_bytes = m->weight_bytes,
        .pooling = hp->pooling,
        .causal = hp->causal,
    };
    narrow(info, size, &whole, sizeof whole);
}

const lm_tokenizer *lm_model_tokenizer(const lm_model *m) { return m ? m->tok : NULL; }

/* ---- tokenizer ----------------------------------------------------------- */

lm_status lm_tokenizer_load(const char *path, lm_tokenizer **out, char *err, size_t errlen) {
    if (out) *out = NULL;
    if (!path || !out) return fail(LM_ERR_INVALID, err, errlen, "lm_tokenizer_load: path and out are required");
    lm_status st;
    gguf_ctx *g = gguf_open_status(path, &st, err, errlen);
    if (!g) return st;
    if (gguf_find_key(g, "tokenizer.ggml.model") < 0) {
        gguf_close(g);
        lm_err(err, errlen, "%s: no tokenizer metadata (tokenizer.ggml.model)", path);
        return LM_ERR_FORMAT;
    }
    char terr[LM_ERRLEN];
    *out = tok_load_status(g, &st, terr, sizeof terr);
    gguf_close(g); /* the tokenizer copied what it needs */
    if (!*out) lm_err(err, errlen, "%s: tokenizer: %s", path, terr);
    return *out ? LM_OK : st;
}

void lm_tokenizer_free(lm_tokenizer *t) { tok_free(t); }

int32_t lm_vocab_size(const lm_tokenizer *t) { return t ? tok_n_vocab(t) : 0; }
int32_t lm_token_bos(const lm_tokenizer *t) { return t ? tok_bos(t) : -1; }
int32_t lm_token_eos(const lm_tokenizer *t) { return t ? tok_eos(t) : -1; }
bool lm_token_is_eog(const lm_tokenizer *t, int32_t id) { return t && tok_is_eog(t, id); }
bool lm_tokenizer_adds_bos(const lm_tokenizer *t) { return t && tok_add_bos(t) && tok_bos(t) >= 0; }
bool lm_tokenizer_adds_eos(const lm_tokenizer *t) { return t && tok_add_eos(t) && tok_eos(t) >= 0; }

int lm_tokenize(const lm_tokenizer *t, const char *text, size_t len, bool add_bos, bool parse_special, int32_t *out,
                int cap) {
    if (!t || (len && !text) || cap < 0 || (cap > 0 && !out)) return LM_ERR_INVALID;
    if (len >= API_MAX_TEXT) return LM_ERR_TOO_LONG;
    int n = tok_encode(t, text, len, add_bos && lm_tokenizer_adds_bos(t), parse_special, out, cap);
    return n >= 0 ? n : LM_ERR_NOMEM; /* the arguments were checked: only allocation can fail */
}

/* Append n bytes to out (cap bytes) at *len, counting what does not fit. */
static void put_bytes(char *out, size_t cap, size_t *len, const char *s, int n) {
    if (n <= 0) return;
    if (*len < cap) memcpy(out + *len, s, (size_t)n < cap - *len ? (size_t)n : cap - *len);
    *len += (size_t)n;
}

long lm_detokenize(const lm_tokenizer *t, const int32_t *ids, int n, bool special, char *out, size_t cap) {
    if (!t || n < 0 || (n > 0 && !ids) || (cap > 0 && !out)) return LM_ERR_INVALID;
    int32_t nv = tok_n_vocab(t);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= nv) return LM_ERR_INVALID;
    int pcap = detok_max_out(t);
    char *piece = lm_malloc((size_t)pcap);
    if (!piece) return LM_ERR_NOMEM;
    lm_detok d;
    /* strip the space prefix the tokenizer adds, so that detokenizing what
     * lm_tokenize made gives the text back */
    detok_init(&d, t, true, special);
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        int w = detok_push(&d, ids[i], piece, pcap);
        if (w < 0) {
            lm_free(piece);
            return LM_ERR_NOMEM; /* pcap always fits one token: only allocation fails */
        }
        put_bytes(out, cap, &len, piece, w);
    }
    put_bytes(out, cap, &len, piece, detok_flush(&d, piece, pcap));
    lm_free(piece);
    return (long)len;
}

/* ---- chat ------------------------------------------------------------------ */

lm_status lm_chat_render(const lm_model *m, const char *tmpl, const lm_chat_msg *msgs, int n, char **out, char *err,
                         size_t errlen) {
    return lm_chat_render_opts(m, tmpl, msgs, n, NULL, out, err, errlen);
}

void lm_chat_options_init(lm_chat_options *o, size_t size) {
    if (!o) return;
    lm_chat_options whole = {.size = size};
    narrow(o, size, &whole, sizeof whole);
}

/* YYYY-MM-DD: four digits, two, two, with dashes. */
static bool is_date(const char *d) {
    for (int i = 0; i < 10; i++)
        if (!d[i] || (i == 4 || i == 7 ? d[i] != '-' : d[i] < '0' || d[i] > '9')) return false;
    return d[10] == '\0';
}

/* The messages of lm_chat_render (system, user, assistant) as the
 * renderer's, checked; NULL with err set on a bad one (or out of memory). */
static lm_chat_xmsg *chat_xmsgs(const lm_chat_msg *msgs, int n, lm_status *st, char *err, size_t errlen) {
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content ||
            (strcmp(msgs[i].role, "system") && strcmp(msgs[i].role, "user") && strcmp(msgs[i].role, "assistant"))) {
            lm_err(err, errlen, "chat: message %d needs a role (system, user or assistant) and content", i);
            *st = LM_ERR_INVALID;
            return NULL;
        }
    lm_chat_xmsg *x = lm_calloc((size_t)n, sizeof *x);
    if (!x) *st = fail(LM_ERR_NOMEM, err, errlen, "out of memory");
    for (int i = 0; x && i < n; i++) x[i] = (lm_chat_xmsg){.role = msgs[i].role, .content = msgs[i].content};
    return x;
}

lm_status lm_chat_render_opts(const lm_model *m, const char *tmpl, const lm_chat_msg *msgs, int n,
                              const lm_chat_options *o, char **out, char *err, size_t errlen) {
    if (out) *out = NULL;
    if (!m || !out || n < 1 || !msgs)
        return fail(LM_ERR_INVALID, err, errlen, "lm_chat_render: a model, messages and out are required");
    lm_chat_options opt = {.size = sizeof opt};
    if (o) {
        lm_status st = widen(&opt, sizeof opt, o, "lm_chat_options", err, errlen);
        if (st != LM_OK) return st;
        if (opt.reasoning_effort && !chat_effort_valid(opt.reasoning_effort))
            return fail(LM_ERR_INVALID, err, errlen, "lm_chat_options.reasoning_effort must be low, medium or high");
        if (opt.date && !is_date(opt.date))
            return fail(LM_ERR_INVALID, err, errlen, "lm_chat_options.date must be YYYY-MM-DD");
    }
    if (!m->tok) return fail(LM_ERR_INVALID, err, errlen, "the model has no tokenizer");
    if (tmpl && chat_family_from_name(tmpl) < 0) {
        lm_err(err, errlen, "unknown chat template '%s'", tmpl);
        return LM_ERR_INVALID;
    }
    /* the one resolution every caller uses: the name, else the model's own
     * template, else its architecture's family */
    lm_chat_template t;
    if (chat_template_resolve(&t, m->gguf, tmpl, NULL, err, errlen) != CHAT_OK)
        return LM_ERR_UNSUPPORTED; /* no template, or one of no family lamina renders */
    bool add_bos;
    int rc;
    if (!o) {
        rc = chat_apply(t.family, t.text, m->tok, msgs, n, out, &add_bos, err, errlen);
    } else {
        lm_status st = LM_OK;
        lm_chat_xmsg *x = chat_xmsgs(msgs, n, &st, err, errlen);
        if (!x) {
            chat_template_free(&t);
            return st;
        }
        lm_chat_conv conv = {.msgs = x,
                             .n = n,
                             .thinking_off = opt.thinking_off,
                             .reasoning_effort = opt.reasoning_effort,
                             .date = opt.date,
                             .model_identity = opt.model_identity};
        rc = chat_prompt(t.family, t.text, m->tok, &conv, out, &add_bos, err, errlen);
        lm_free(x);
    }
    chat_template_free(&t);
    return rc ? LM_ERR_INVALID : LM_OK; /* the template refuses this conversation */
}

void lm_string_free(char *s) { lm_free(s); }

/* ---- sampling, engine ------------------------------------------------------ */

void lm_sample_params_default(lm_sample_params *p) {
    if (p) sample_params_default(p);
}

void lm_engine_config_init(lm_engine_config *c, size_t size) {
    if (!c) return;
    lm_engine_config whole;
    engine_config_default(&whole);
    whole.size = size;
    narrow(c, size, &whole, sizeof whole);
}

void lm_spec_config_init(lm_spec_config *c, size_t size) {
    if (!c) return;
    lm_spec_config whole;
    engine_spec_default(&whole);
    whole.size = size;
    narrow(c, size, &whole, sizeof whole);
}

void lm_request_params_init(lm_request_params *p, size_t size) {
    if (!p) return;
    lm_request_params whole;
    engine_request_params_default(&whole);
    whole.size = size;
    narrow(p, size, &whole, sizeof whole);
}

const char *lm_finish_name(lm_finish f) { return engine_finish_name(f); }

lm_status lm_engine_new(const lm_model *m, const lm_engine_config *c, lm_engine **out, char *err, size_t errlen) {
    if (out) *out = NULL;
    if (!m || !out) return fail(LM_ERR_INVALID, err, errlen, "lm_engine_new: a model and out are required");
    if (!m->tok) return fail(LM_ERR_INVALID, err, errlen, "the model has no tokenizer");
    lm_engine_config whole;
    lm_spec_config spec;
    if (c) {
        engine_config_default(&whole);
        lm_status st = widen(&whole, sizeof whole, c, "lm_engine_config", err, errlen);
        if (st != LM_OK) return st;
        if (whole.spec) { /* its own size, widened the same way */
            engine_spec_default(&spec);
            if ((st = widen(&spec, sizeof spec, whole.spec, "lm_spec_config", err, errlen)) != LM_OK) return st;
            whole.spec = &spec;
        }
        c = &whole;
        if (!(c->watermark >= 0 && c->watermark < 1))
            return fail(LM_ERR_INVALID, err, errlen, "watermark must be in [0, 1)");
        if (c->kv_type != LM_KV_F32 && c->kv_type != LM_KV_F16 && c->kv_type != LM_KV_Q8_0)
            return fail(LM_ERR_INVALID, err, errlen, "kv_type must be LM_KV_F32, LM_KV_F16 or LM_KV_Q8_0");
        if (c->max_waiting < 0) return fail(LM_ERR_INVALID, err, errlen, "max_waiting must be >= 0");
    }
    lm_status st;
    *out = engine_new_status(m, NULL, c, &st, err, errlen);
    return st;
}

void lm_engine_free(lm_engine *e) { engine_free(e); }

lm_status lm_engine_submit(lm_engine *e, const lm_request_params *p, lm_request **out, char *err, size_t errlen) {
    if (out) *out = NULL;
    if (!e || !p) return fail(LM_ERR_INVALID, err, errlen, "lm_engine_submit: an engine and parameters are required");
    lm_request_params whole;
    engine_request_params_default(&whole);
    lm_status st = widen(&whole, sizeof whole, p, "lm_request_params", err, errlen);
    if (st != LM_OK) return st;
    return engine_submit(e, &whole, out, err, errlen);
}

void lm_request_cancel(lm_engine *e, lm_request *r) {
    if (e && r) engine_cancel(e, r);
}

void lm_request_release(lm_engine *e, lm_request *r) {
    if (e && r) engine_request_release(e, r);
}

void lm_engine_wait_idle(lm_engine *e) {
    if (e) engine_wait_idle(e);
}

/* ---- embeddings ------------------------------------------------------------ */

int lm_model_embd_dim(const lm_model *m) { return m ? embed_dim(m) : 0; }

void lm_embd_normalize(float *v, int n) {
    if (!v || n <= 0) return;
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)v[i] * v[i];
    if (ss == 0) return;
    double inv = 1.0 / sqrt(ss);
    for (int i = 0; i < n; i++) v[i] = (float)(v[i] * inv);
}

/* lm_embed's requests: each done event copies its vector's first `dim`
 * floats into its row of out; the first failure is kept. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int left; /* requests without their done event */
    int dim;
    float *out; /* (n, dim) */
    lm_status st;
    char msg[LM_ERRLEN];
} embed_wait;

typedef struct {
    embed_wait *w;
    int i;
} embed_slot;

static void on_embed(void *user, const lm_event *ev) {
    if (!ev->done) return;
    const embed_slot *s = user;
    embed_wait *w = s->w;
    pthread_mutex_lock(&w->mu);
    if (ev->finish == LM_FINISH_STOP && ev->embedding && ev->n_embedding >= w->dim) {
        memcpy(w->out + (size_t)s->i * (size_t)w->dim, ev->embedding, (size_t)w->dim * sizeof *w->out);
    } else if (w->st == LM_OK) {
        w->st = ev->finish == LM_FINISH_ERROR   ? ev->status
            : ev->finish == LM_FINISH_CANCELLED ? LM_ERR_CANCELLED
                                                : LM_ERR_INTERNAL;
        lm_err(w->msg, sizeof w->msg, "input %d: %s", s->i, ev->error ? ev->error : lm_finish_name(ev->finish));
    }
    if (--w->left == 0) pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

lm_status lm_embed(lm_engine *e, const int32_t *const *tokens, const int *n_tokens, int n, int pooling, int dimensions,
                   bool normalize, float *out, char *err, size_t errlen) {
    if (!e || n < 0 || (n > 0 && (!tokens || !n_tokens || !out)))
        return fail(LM_ERR_INVALID, err, errlen, "lm_embed: an engine, the inputs and out are required");
    const int E = embed_dim(engine_model(e));
    if (dimensions < 0 || dimensions > E) {
        lm_err(err, errlen, "dimensions %d is outside [1, %d] (0: the model's width)", dimensions, E);
        return LM_ERR_INVALID;
    }
    for (int i = 0; i < n; i++)
        if (!tokens[i] || n_tokens[i] < 1) {
            lm_err(err, errlen, "input %d is empty", i);
            return LM_ERR_INVALID;
        }
    if (n == 0) return LM_OK;
    embed_wait w = {.left = n, .dim = dimensions ? dimensions : E, .out = out, .st = LM_OK};
    embed_slot *slots = lm_malloc((size_t)n * sizeof *slots);
    lm_request **reqs = lm_calloc((size_t)n, sizeof *reqs);
    if (!slots || !reqs) {
        lm_free(slots);
        lm_free(reqs);
        return fail(LM_ERR_NOMEM, err, errlen, "out of memory");
    }
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    lm_request_params p;
    engine_request_params_default(&p);
    p.embed = true;
    p.pooling = pooling;
    p.on_event = on_embed;
    lm_status st = LM_OK;
    int sent = 0;
    for (; sent < n; sent++) {
        slots[sent] = (embed_slot){&w, sent};
        p.user = &slots[sent];
        p.prompt = tokens[sent];
        p.n_prompt = n_tokens[sent];
        if ((st = engine_submit(e, &p, &reqs[sent], err, errlen)) != LM_OK) break;
    }
    if (st != LM_OK) /* a submission failed: the others end cancelled */
        for (int i = 0; i < sent; i++) engine_cancel(e, reqs[i]);
    pthread_mutex_lock(&w.mu);
    w.left -= n - sent; /* those never submitted get no event */
    while (w.left > 0) pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    for (int i = 0; i < sent; i++) engine_request_release(e, reqs[i]);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    lm_free(slots);
    lm_free(reqs);
    if (st == LM_OK && w.st != LM_OK) st = w.st, lm_err(err, errlen, "%s", w.msg);
    if (st == LM_OK && normalize)
        for (int i = 0; i < n; i++) lm_embd_normalize(out + (size_t)i * (size_t)w.dim, w.dim);
    return st;
}

void lm_engine_stats_get(lm_engine *e, lm_engine_stats *st, size_t size) {
    if (!e || !st) return;
    lm_engine_stats whole;
    engine_stats(e, &whole);
    narrow(st, size, &whole, sizeof whole);
}
