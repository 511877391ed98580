/*
 * test_server_embed.c - the /v1/embeddings request parser and answer writer
 * (server_embed.c), without sockets or an engine: each shape of "input" to
 * the token arrays tok_encode gives, a table of bad bodies each to its
 * status and parameter, the bounds on inputs and tokens, dimensions'
 * truncation and normalization against a float64 reference, the answer's
 * JSON read back (floats exactly, base64 decoded to the same bytes), and
 * every allocation made to fail in turn.
 *
 * The tokenizer is the bundled model's (SentencePiece, 512 tokens, BOS 1);
 * the context is 128 and the embedding width 16.
 */
#include <math.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "serve/server.h"
#include "test.h"
#include "server_parse_test.h"
#include "text/tokenizer.h"
#include "base/util.h"

#define N_EMBD 16

static int pe(const char *body, lm_server_embed_request *r, lm_server_error *e) {
    return server_parse_embed(&ctx, body, strlen(body), r, e);
}

static int encode(const char *text, int32_t *ids, int cap) {
    return tok_encode(tok, text, strlen(text), tok_add_bos(tok), true, ids, cap);
}

static void test_string_input(void) {
    lm_server_embed_request r;
    lm_server_error e;
    CHECKF(pe("{\"input\": \"Once upon a time\", \"model\": \"m\"}", &r, &e) == 0, "%s", e.message);
    int32_t ids[64];
    int n = encode("Once upon a time", ids, 64);
    bool same = r.n_inputs == 1 && r.n_input[0] == n && !memcmp(r.inputs[0], ids, (size_t)n * sizeof(int32_t));
    bool defaults = !r.base64 && r.dimensions == N_EMBD && r.normalize && r.n_tokens == n;
    server_embed_request_free(&r);
    CHECK(n > 1);
    CHECK(same);
    CHECK(defaults);
}

static void test_list_inputs(void) {
    lm_server_embed_request r;
    lm_server_error e;
    CHECKF(pe("{\"input\": [\"a cat\", \"the dog ran\", \"x\"], \"encoding_format\": \"base64\", \"dimensions\": 4, "
              "\"user\": \"u\", \"normalize\": false}",
              &r, &e) == 0,
           "%s", e.message);
    const char *texts[3] = {"a cat", "the dog ran", "x"};
    bool ok = r.n_inputs == 3 && r.base64 && r.dimensions == 4 && !r.normalize;
    long long total = 0;
    for (int i = 0; ok && i < 3; i++) {
        int32_t ids[64];
        int n = encode(texts[i], ids, 64);
        ok = r.n_input[i] == n && !memcmp(r.inputs[i], ids, (size_t)n * sizeof(int32_t));
        total += n;
    }
    ok = ok && r.n_tokens == total;
    server_embed_request_free(&r);
    CHECK(ok);

    /* one id array is one input; an array of arrays is one input each */
    CHECKF(pe("{\"input\": [5, 6, 7.0]}", &r, &e) == 0, "%s", e.message);
    ok = r.n_inputs == 1 && r.n_input[0] == 3 && r.inputs[0][0] == 5 && r.inputs[0][2] == 7 && r.n_tokens == 3;
    server_embed_request_free(&r);
    CHECK(ok);
    CHECKF(pe("{\"input\": [[1, 2], [511], [3, 4, 5]]}", &r, &e) == 0, "%s", e.message);
    ok = r.n_inputs == 3 && r.n_input[0] == 2 && r.n_input[1] == 1 && r.inputs[1][0] == 511 && r.n_input[2] == 3 &&
        r.n_tokens == 6;
    server_embed_request_free(&r);
    CHECK(ok);
}

/* Bad bodies: each its status, parameter and (where there is one) code. */
static void test_bad_bodies(void) {
    static const struct {
        const char *body;
        int status;
        const char *param;
        const char *code;
    } cases[] = {
        {"", 400, "", ""},
        {"[1]", 400, "", ""},
        {"{\"input\": \"a\"} x", 400, "", ""},
        {"{\"input\": \"a\\u0000\"}", 400, "input", ""},
        {"{}", 400, "input", ""},
        {"{\"input\": null}", 400, "input", ""},
        {"{\"input\": \"\"}", 400, "input", ""},
        {"{\"input\": []}", 400, "input", ""},
        {"{\"input\": 5}", 400, "input", ""},
        {"{\"input\": {\"a\": 1}}", 400, "input", ""},
        {"{\"input\": [\"a\", 5]}", 400, "input", ""},
        {"{\"input\": [[1], \"a\"]}", 400, "input", ""},
        {"{\"input\": [\"a\", \"\"]}", 400, "input[1]", ""},
        {"{\"input\": [[1], []]}", 400, "input[1]", ""},
        {"{\"input\": [[1], [2, \"x\"]]}", 400, "input[1]", ""},
        {"{\"input\": [[1], [[2]]]}", 400, "input[1]", ""},
        {"{\"input\": [true]}", 400, "input", ""},
        {"{\"input\": [512]}", 400, "input", ""},
        {"{\"input\": [-1]}", 400, "input", ""},
        {"{\"input\": [1.5]}", 400, "input", ""},
        {"{\"input\": [[3], [1e300]]}", 400, "input[1]", ""},
        {"{\"input\": \"a\", \"model\": \"other\"}", 404, "model", "model_not_found"},
        {"{\"input\": \"a\", \"model\": 3}", 400, "model", ""},
        {"{\"input\": \"a\", \"encoding_format\": \"hex\"}", 400, "encoding_format", ""},
        {"{\"input\": \"a\", \"encoding_format\": 1}", 400, "encoding_format", ""},
        {"{\"input\": \"a\", \"dimensions\": 0}", 400, "dimensions", ""},
        {"{\"input\": \"a\", \"dimensions\": 17}", 400, "dimensions", ""},
        {"{\"input\": \"a\", \"dimensions\": 2.5}", 400, "dimensions", ""},
        {"{\"input\": \"a\", \"dimensions\": \"4\"}", 400, "dimensions", ""},
        {"{\"input\": \"a\", \"user\": 7}", 400, "user", ""},
        {"{\"input\": \"a\", \"normalize\": 1}", 400, "normalize", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lm_server_embed_request r;
        lm_server_error e;
        int rc = pe(cases[i].body, &r, &e);
        CHECKF(rc == -1 && e.status == cases[i].status && !strcmp(e.param, cases[i].param) &&
                   !strcmp(e.code, cases[i].code) && e.message[0] && r.inputs == NULL && r.n_inputs == 0,
               "case %zu (%s): rc %d status %d param '%s' code '%s': %s", i, cases[i].body, rc, e.status, e.param,
               e.code, e.message);
    }
}

/* A body of `count` inputs, each `per` ids (or strings "a" when per is 0). */
static char *many(int count, int per) {
    size_t cap = (size_t)count * ((size_t)per * 4 + 8) + 64, at = 0;
    char *b = malloc(cap);
    at += (size_t)sprintf(b + at, "{\"input\": [");
    for (int i = 0; i < count; i++) {
        if (i) b[at++] = ',';
        if (per == 0) {
            at += (size_t)sprintf(b + at, "\"a\"");
            continue;
        }
        b[at++] = '[';
        for (int k = 0; k < per; k++) at += (size_t)sprintf(b + at, k ? ",%d" : "%d", 3 + k % 100);
        b[at++] = ']';
    }
    sprintf(b + at, "]}");
    return b;
}

static void test_bounds(void) {
    lm_server_embed_request r;
    lm_server_error e;
    /* the count: SERVER_MAX_EMBED_INPUTS is taken, one more is not */
    char *b = many(SERVER_MAX_EMBED_INPUTS, 0);
    int rc = pe(b, &r, &e);
    bool ok = rc == 0 && r.n_inputs == SERVER_MAX_EMBED_INPUTS;
    server_embed_request_free(&r);
    free(b);
    CHECKF(ok, "%s", e.message);
    b = many(SERVER_MAX_EMBED_INPUTS + 1, 0);
    rc = pe(b, &r, &e);
    free(b);
    CHECK(rc == -1 && e.status == 400 && !strcmp(e.param, "input"));
    /* one input longer than the context */
    b = many(2, ctx.n_ctx + 1);
    rc = pe(b, &r, &e);
    free(b);
    CHECK(rc == -1 && !strcmp(e.param, "input[0]") && !strcmp(e.code, "context_length_exceeded"));
    b = many(1, ctx.n_ctx);
    rc = pe(b, &r, &e);
    ok = rc == 0 && r.n_input[0] == ctx.n_ctx;
    server_embed_request_free(&r);
    free(b);
    CHECK(ok);
    /* the total: inputs that each fit, too many tokens together */
    int n_ctx = ctx.n_ctx;
    ctx.n_ctx = 512;
    int count = SERVER_MAX_EMBED_TOKENS / 512 + 1;
    b = many(count, 512);
    rc = pe(b, &r, &e);
    free(b);
    ctx.n_ctx = n_ctx;
    CHECK(rc == -1 && e.status == 400 && !strcmp(e.param, "input") && strstr(e.message, "in all"));
}

/* A server that cannot embed with this model says why, before anything else
 * of the body but its model. */
static void test_embed_error(void) {
    lm_server_embed_request r;
    lm_server_error e;
    ctx.embed_error = "the model is a generative model; start the server with --pooling";
    int rc = pe("{\"input\": \"a\", \"dimensions\": 99}", &r, &e);
    ctx.embed_error = NULL;
    CHECK(rc == -1 && e.status == 400 && strstr(e.message, "--pooling"));
}

/* Truncation then normalization, against float64. */
static void test_vector(void) {
    float pooled[N_EMBD];
    for (int i = 0; i < N_EMBD; i++) pooled[i] = (float)sin(1.0 + i) * (float)(i + 1);
    lm_server_embed_request r = {.dimensions = 5, .normalize = true};
    float out[N_EMBD];
    CHECK(server_embed_vector(&r, pooled, N_EMBD, out) == 0);
    double ss = 0;
    for (int i = 0; i < 5; i++) ss += (double)pooled[i] * pooled[i];
    for (int i = 0; i < 5; i++) CHECKF(fabs(out[i] - pooled[i] / sqrt(ss)) < 1e-7, "%d: %g", i, out[i]);
    double n2 = 0;
    for (int i = 0; i < 5; i++) n2 += (double)out[i] * out[i];
    CHECK(fabs(n2 - 1) < 1e-6);
    /* not normalized: the leading values as they are */
    r.normalize = false;
    CHECK(server_embed_vector(&r, pooled, N_EMBD, out) == 0);
    for (int i = 0; i < 5; i++) CHECK(out[i] == pooled[i]);
    /* a zero vector stays zero; a non-finite value is refused */
    r.normalize = true;
    float zero[N_EMBD] = {0};
    CHECK(server_embed_vector(&r, zero, N_EMBD, out) == 0 && out[0] == 0 && out[4] == 0);
    pooled[3] = NAN;
    CHECK(server_embed_vector(&r, pooled, N_EMBD, out) == -1);
    pooled[3] = INFINITY;
    CHECK(server_embed_vector(&r, pooled, N_EMBD, out) == -1);
    pooled[3] = 1;
    pooled[7] = NAN; /* past the kept width: not looked at */
    CHECK(server_embed_vector(&r, pooled, N_EMBD, out) == 0);
}

static int b64val(char ch) {
    if (ch >= 'A' && ch <= 'Z') return ch - 'A';
    if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9') return ch - '0' + 52;
    return ch == '+' ? 62 : ch == '/' ? 63 : -1;
}

/* Decode base64 (padded) into out; the byte count or -1. */
static int b64dec(const char *s, uint8_t *out, int cap) {
    size_t n = strlen(s);
    if (n % 4) return -1;
    int at = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int k = 0; k < 4; k++) v[k] = s[i + k] == '=' ? 0 : b64val(s[i + k]);
        if (v[0] < 0 || v[1] < 0 || v[2] < 0 || v[3] < 0) return -1;
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        int take = s[i + 2] == '=' ? 1 : s[i + 3] == '=' ? 2 : 3;
        for (int k = 0; k < take; k++) {
            if (at >= cap) return -1;
            out[at++] = (uint8_t)(w >> (16 - 8 * k));
        }
    }
    return at;
}

/* The answer read back: shape, usage, each float exactly, base64's bytes. */
static void check_answer(bool base64, int dims) {
    lm_server_embed_request r = {.n_inputs = 3, .n_tokens = 11, .base64 = base64, .dimensions = dims};
    float vecs[3 * N_EMBD];
    for (int i = 0; i < 3 * dims; i++) vecs[i] = (float)(cos(0.37 * i) / (1 + i)) * (i % 5 == 0 ? 1e-30f : 1.0f);
    vecs[1] = -0.0f;
    char *a = server_embed_answer(&r, "my \"model\"", vecs);
    CHECK(a);
    cJSON *o = cJSON_Parse(a);
    lm_free(a);
    CHECK(o);
    const cJSON *data = cJSON_GetObjectItem(o, "data"), *usage = cJSON_GetObjectItem(o, "usage");
    bool ok = !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(o, "object")), "list") &&
        !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(o, "model")), "my \"model\"") &&
        cJSON_GetArraySize(data) == 3 && cJSON_GetObjectItem(usage, "prompt_tokens")->valuedouble == 11 &&
        cJSON_GetObjectItem(usage, "total_tokens")->valuedouble == 11;
    for (int i = 0; ok && i < 3; i++) {
        const cJSON *d = cJSON_GetArrayItem(data, i), *emb = cJSON_GetObjectItem(d, "embedding");
        ok = !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(d, "object")), "embedding") &&
            cJSON_GetObjectItem(d, "index")->valuedouble == i;
        if (base64) {
            uint8_t bytes[4 * N_EMBD];
            ok = ok && cJSON_IsString(emb) && b64dec(emb->valuestring, bytes, sizeof bytes) == 4 * dims;
            for (int k = 0; ok && k < dims; k++) {
                uint32_t u = (uint32_t)bytes[4 * k] | (uint32_t)bytes[4 * k + 1] << 8 |
                    (uint32_t)bytes[4 * k + 2] << 16 | (uint32_t)bytes[4 * k + 3] << 24;
                float f;
                memcpy(&f, &u, 4);
                ok = memcmp(&f, &vecs[i * dims + k], 4) == 0;
            }
        } else {
            ok = ok && cJSON_GetArraySize(emb) == dims;
            for (int k = 0; ok && k < dims; k++)
                ok = (float)cJSON_GetArrayItem(emb, k)->valuedouble == vecs[i * dims + k];
        }
    }
    cJSON_Delete(o);
    CHECK(ok);
}

static void test_answer(void) {
    /* 1, 2, 3 and 0 bytes left over in base64's last group: widths 16, 5, 1, 3 */
    check_answer(false, N_EMBD);
    check_answer(true, N_EMBD);
    check_answer(true, 5);
    check_answer(true, 1);
    check_answer(true, 3);
    check_answer(false, 1);
}

/* Every allocation made to fail in turn: a clean error each time, then success. */
static void test_alloc_failure(void) {
    const char *bodies[] = {"{\"input\": [\"Once upon a time\", \"b\"], \"dimensions\": 3}",
                            "{\"input\": [[1, 2], [3]]}"};
    for (int b = 0; b < 2; b++) {
        bool done = false;
        for (long k = 0; k < 1000 && !done; k++) {
            lm_server_embed_request r;
            lm_server_error e;
            lm_alloc_fail_after(k);
            int rc = pe(bodies[b], &r, &e);
            char *a = NULL;
            float vecs[2 * N_EMBD] = {0};
            if (rc == 0) a = server_embed_answer(&r, "m", vecs);
            lm_alloc_fail_after(-1);
            if (rc == 0 && a) done = true;
            /* cJSON cannot tell a failed allocation from bad JSON: 400 or 500 */
            else if (rc)
                CHECKF((e.status == 500 || e.status == 400) && r.inputs == NULL, "k=%ld status %d: %s", k, e.status,
                       e.message);
            lm_free(a);
            server_embed_request_free(&r);
        }
        CHECK(done);
    }
}

int main(void) {
    server_test_setup(CHAT_CHATML, 128);
    ctx.n_embd = N_EMBD;
    TEST_RUN(test_string_input);
    TEST_RUN(test_list_inputs);
    TEST_RUN(test_bad_bodies);
    TEST_RUN(test_bounds);
    TEST_RUN(test_embed_error);
    TEST_RUN(test_vector);
    TEST_RUN(test_answer);
    TEST_RUN(test_alloc_failure);
    tok_free(tok);
    return TEST_DONE();
}
