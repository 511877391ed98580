/*
 * server_embed.c - POST /v1/embeddings: the request's body to token arrays,
 * and pooled vectors to OpenAI's answer. Pure, as server_parse.c is: no
 * socket and no engine, so tests and the fuzzer (fuzz_request) call it
 * directly; server_embed_run.c submits and collects.
 *
 * The request (OpenAI's shape): "input" is a string, an array of strings,
 * an array of token ids, or an array of arrays of token ids. A string is
 * tokenized as llama-embedding and `lamina embed` do (BOS as the tokenizer
 * adds it, special tokens parsed, EOS appended when the tokenizer says so:
 * tok_add_eos, Qwen3-Embedding's files); token ids are taken as they are,
 * in [0, n_vocab). Nothing may be
 * empty (an empty string, array or inner array is a 400), an array mixes no
 * kinds, and each input must fit the context (n_ctx tokens; longer is a 400
 * context_length_exceeded). Bounds: at most SERVER_MAX_EMBED_INPUTS inputs
 * and SERVER_MAX_EMBED_TOKENS tokens in all, and the body itself is bounded
 * by the server's max_body. "encoding_format" is "float" (the default) or
 * "base64" (the float32 values' little-endian bytes, which the openai
 * Python client decodes with numpy.frombuffer); "dimensions" (1 .. the
 * model's width) keeps that many leading values before normalizing (the
 * Matryoshka rule); "user" must be a string and is not used; lamina's
 * extension "normalize" (default true) leaves the pooled vector as it is
 * when false. Conventions as server_parse.c's: null is absent, unknown
 * fields are ignored, integers may be integral floats, an error names its
 * parameter ("input", or "input[i]" for one input of an array).
 *
 * The answer is written by hand into one buffer (no JSON tree): a request
 * of 2048 inputs of 4096 floats is 8M numbers. Floats are printed with
 * %.9g, which reads back to the same float32.
 *
 * Memory: everything in lm_server_embed_request is lm_malloc'ed;
 * server_embed_request_free accepts a partly filled request, so every
 * failure path frees through it.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "serve/server.h"
#include "serve/server_int.h"
#include "base/strbuf.h"
#include "base/util.h"

static const char *INVALID = "invalid_request_error";
#define BAD(param, ...) server_error(e, 400, INVALID, (param), NULL, __VA_ARGS__)

static const char *SHAPE = "'input' must be a string, an array of strings, an array of token ids or an array of "
                           "arrays of token ids";

/* Every element of array a of cJSON type `type` (a is not empty). */
static bool all_of(const cJSON *a, int type) {
    for (const cJSON *t = a->child; t; t = t->next)
        if ((t->type & 0xff) != type) return false;
    return true;
}

/* One input's tokens from a string or an id array into a fresh array:
 * the count (>= 1), or -1 with *e. param names the input. */
static int one_input(const lm_server_parse_ctx *c, const cJSON *v, const char *param, int32_t **out,
                     lm_server_error *e) {
    *out = NULL;
    int n;
    if (cJSON_IsString(v)) {
        size_t len = strlen(v->valuestring);
        if (len == 0) return BAD(param, "'%s' is an empty string; every input needs some text", param);
        bool bos = tok_add_bos(c->tok);
        int32_t small[256];
        n = tok_encode(c->tok, v->valuestring, len, bos, true, small, 256);
        if (n < 0) return BAD(param, "'%s' could not be tokenized", param);
        int eos = tok_add_eos(c->tok) ? 1 : 0; /* an embedding model's inputs end with EOS */
        if (n + eos == 0) return BAD(param, "'%s' encodes to no tokens", param);
        if (n + eos > c->n_ctx) /* counted without a copy; the copy below would be large */
            return server_error(e, 400, INVALID, param, "context_length_exceeded",
                                "'%s' is %d tokens long; this model's context holds %d", param, n + eos, c->n_ctx);
        if (!(*out = lm_malloc((size_t)(n + eos) * sizeof(int32_t)))) return srv_oom(e);
        if (n <= 256) memcpy(*out, small, (size_t)n * sizeof(int32_t));
        else if (tok_encode(c->tok, v->valuestring, len, bos, true, *out, n) != n)
            return server_error(e, 500, "server_error", NULL, NULL, "tokenization is not deterministic");
        if (eos) (*out)[n] = tok_eos(c->tok);
        return n + eos;
    }
    n = cJSON_GetArraySize(v);
    if (n == 0) return BAD(param, "'%s' is an empty array of token ids", param);
    if (!all_of(v, cJSON_Number)) return BAD(param, "%s", SHAPE);
    if (n > c->n_ctx)
        return server_error(e, 400, INVALID, param, "context_length_exceeded",
                            "'%s' is %d tokens long; this model's context holds %d", param, n, c->n_ctx);
    if (!(*out = lm_malloc((size_t)n * sizeof(int32_t)))) return srv_oom(e);
    int32_t n_vocab = tok_n_vocab(c->tok);
    int i = 0;
    for (const cJSON *t = v->child; t; t = t->next, i++) {
        double x = t->valuedouble;
        if (floor(x) != x || !(x >= 0 && x < n_vocab))
            return BAD(param, "'%s' holds %.17g; token ids must be integers in [0, %d)", param, x, (int)n_vocab);
        (*out)[i] = (int32_t)x;
    }
    return n;
}

/* input -> r->inputs. */
static int parse_input(const lm_server_parse_ctx *c, const cJSON *root, lm_server_embed_request *r,
                       lm_server_error *e) {
    const cJSON *in = srv_field(root, "input");
    if (!in) return BAD("input", "'input' is required");
    int count = 1;
    bool several = false;
    if (cJSON_IsArray(in)) {
        count = cJSON_GetArraySize(in);
        if (count == 0) return BAD("input", "'input' is an empty array");
        if (all_of(in, cJSON_Number)) count = 1;
        else if (all_of(in, cJSON_String) || all_of(in, cJSON_Array)) several = true;
        else return BAD("input", "%s (an array holds one kind of them)", SHAPE);
    } else if (!cJSON_IsString(in)) {
        return BAD("input", "%s", SHAPE);
    }
    if (count > SERVER_MAX_EMBED_INPUTS)
        return BAD("input", "'input' holds %d inputs; at most %d per request", count, SERVER_MAX_EMBED_INPUTS);
    r->inputs = lm_calloc((size_t)count, sizeof *r->inputs);
    r->n_input = lm_calloc((size_t)count, sizeof *r->n_input);
    if (!r->inputs || !r->n_input) return srv_oom(e);
    const cJSON *one = several ? in->child : in;
    for (int i = 0; i < count; i++, one = one->next) {
        char param[24];
        if (several) snprintf(param, sizeof param, "input[%d]", i);
        else snprintf(param, sizeof param, "input");
        int n = one_input(c, one, param, &r->inputs[i], e);
        r->n_inputs = i + 1; /* owned from here: freed with the request */
        if (n < 0) return -1;
        r->n_input[i] = n;
        r->n_tokens += n;
        if (r->n_tokens > SERVER_MAX_EMBED_TOKENS)
            return BAD("input", "the inputs hold more than %d tokens in all; send fewer per request",
                       SERVER_MAX_EMBED_TOKENS);
    }
    return 0;
}

static int parse_root(const lm_server_parse_ctx *c, const cJSON *root, lm_server_embed_request *r, lm_server_error *e) {
    if (!cJSON_IsObject(root)) return BAD(NULL, "the request body must be a JSON object");
    const cJSON *v = srv_field(root, "model");
    if (v && !cJSON_IsString(v)) return BAD("model", "'model' must be a string");
    if (v && c->model_name && strcmp(v->valuestring, c->model_name) != 0)
        return server_error(e, 404, INVALID, "model", "model_not_found",
                            "The model '%.100s' does not exist (this server serves '%.100s').", v->valuestring,
                            c->model_name);
    if (c->embed_error) return BAD(NULL, "%s", c->embed_error);
    if (c->n_embd < 1) return BAD(NULL, "this server has no embedding width for its model");
    if ((v = srv_field(root, "encoding_format"))) {
        if (!cJSON_IsString(v) || (strcmp(v->valuestring, "float") && strcmp(v->valuestring, "base64")))
            return BAD("encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
        r->base64 = !strcmp(v->valuestring, "base64");
    }
    r->dimensions = c->n_embd;
    if ((v = srv_field(root, "dimensions"))) {
        double x = v->valuedouble;
        if (!cJSON_IsNumber(v) || !isfinite(x) || floor(x) != x)
            return BAD("dimensions", "'dimensions' must be an integer");
        if (x < 1 || x > c->n_embd)
            return BAD("dimensions", "'dimensions' must be between 1 and %d (this model's width), got %.17g", c->n_embd,
                       x);
        r->dimensions = (int)x;
    }
    if ((v = srv_field(root, "user")) && !cJSON_IsString(v)) return BAD("user", "'user' must be a string");
    r->normalize = true;
    if ((v = srv_field(root, "normalize"))) {
        if (!cJSON_IsBool(v)) return BAD("normalize", "'normalize' must be a boolean");
        r->normalize = cJSON_IsTrue(v);
    }
    return parse_input(c, root, r, e);
}

int server_parse_embed(const lm_server_parse_ctx *c, const char *body, size_t len, lm_server_embed_request *out,
                       lm_server_error *e) {
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    e->status = 200;
    cJSON *root;
    if (srv_parse_json(body, len, &root, e)) return -1;
    int rc = parse_root(c, root, out, e);
    cJSON_Delete(root);
    if (rc) server_embed_request_free(out);
    return rc;
}

void server_embed_request_free(lm_server_embed_request *r) {
    if (!r) return;
    for (int i = 0; i < r->n_inputs && r->inputs; i++) lm_free(r->inputs[i]);
    lm_free(r->inputs);
    lm_free(r->n_input);
    memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------------- answers */

int server_embed_vector(const lm_server_embed_request *r, const float *pooled, int width, float *out) {
    int d = r->dimensions < width ? r->dimensions : width;
    double ss = 0;
    for (int i = 0; i < d; i++) {
        if (!isfinite(pooled[i])) return -1;
        ss += (double)pooled[i] * pooled[i];
    }
    double scale = r->normalize && ss > 0 ? 1.0 / sqrt(ss) : 1.0;
    for (int i = 0; i < d; i++) out[i] = (float)(pooled[i] * scale);
    return 0;
}

/* n floats as base64 of their little-endian bytes (RFC 4648, padded). */
static void put_base64(strbuf *b, const float *v, int n) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t nb = (size_t)n * 4;
    char chunk[256];
    size_t at = 0;
    uint8_t in[3];
    int k = 0;
    for (size_t i = 0; i < nb; i++) {
        uint32_t u;
        memcpy(&u, &v[i / 4], 4);
        in[k++] = (uint8_t)(u >> (8 * (i % 4))); /* little-endian whatever the host */
        if (k == 3 || i + 1 == nb) {
            uint32_t w = (uint32_t)in[0] << 16 | (k > 1 ? (uint32_t)in[1] << 8 : 0) | (k > 2 ? in[2] : 0);
            chunk[at++] = A[w >> 18 & 63];
            chunk[at++] = A[w >> 12 & 63];
            chunk[at++] = k > 1 ? A[w >> 6 & 63] : '=';
            chunk[at++] = k > 2 ? A[w & 63] : '=';
            k = 0;
            if (at + 4 > sizeof chunk) {
                strbuf_put(b, chunk, at);
                at = 0;
            }
        }
    }
    strbuf_put(b, chunk, at);
}

char *server_embed_answer(const lm_server_embed_request *r, const char *model, const float *vecs) {
    strbuf b = {0};
    strbuf_puts(&b, "{\"object\":\"list\",\"data\":[");
    char num[40];
    for (int i = 0; i < r->n_inputs; i++) {
        strbuf_printf(&b, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":", i ? "," : "", i);
        const float *v = vecs + (size_t)i * (size_t)r->dimensions;
        if (r->base64) {
            strbuf_puts(&b, "\"");
            put_base64(&b, v, r->dimensions);
            strbuf_puts(&b, "\"");
        } else {
            strbuf_puts(&b, "[");
            for (int k = 0; k < r->dimensions; k++) {
                int w = snprintf(num, sizeof num, "%s%.9g", k ? "," : "", (double)v[k]);
                strbuf_put(&b, num, (size_t)w);
            }
            strbuf_puts(&b, "]");
        }
        strbuf_puts(&b, "}");
    }
    /* the model's name as a JSON string */
    cJSON *name = cJSON_CreateString(model ? model : "lamina");
    char *quoted = name ? cJSON_PrintUnformatted(name) : NULL;
    cJSON_Delete(name);
    if (!quoted) b.failed = true;
    strbuf_printf(&b, "],\"model\":%s,\"usage\":{\"prompt_tokens\":%lld,\"total_tokens\":%lld}}",
                  quoted ? quoted : "\"\"", r->n_tokens, r->n_tokens);
    if (quoted) cJSON_free(quoted);
    if (b.failed) {
        strbuf_free(&b);
        return NULL;
    }
    return b.p;
}
