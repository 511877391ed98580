/*
 * test_engine_text.c - a token's text reaches the engine's events whole,
 * however long it is, and lamina run prints it.
 *
 * The bundled model (greedy after "Once upon a time" its first token is id
 * 432) is copied with that token's vocabulary text replaced by LONG_BYTES
 * bytes of two-byte UTF-8 ('é' repeated): longer than any fixed buffer the
 * generation paths used (the engine's 1,024-byte piece, run's 4,096). The
 * engine sizes its buffers from detok_max_out, so the event text must hold
 * the whole piece: without stop strings, with one (the held-back path), and
 * with a 1,024-byte stop string (the largest hold-back). lamina run (a
 * client of the engine) must print it too. And special_text: a control
 * token's text (BOS, <s>) in the output only when the request asks.
 */
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"
#include "format/gguf.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "sched/engine.h"
#include "test.h"
#include "text/tokenizer.h"

#define TEST_MODEL "models/stories260K.gguf"
#define LONG_ID 432
#define LONG_BYTES 6000

static char path[] = "/tmp/lamina_test_engine_text_XXXXXX";
static char *long_text; /* (LONG_BYTES + 1) the replaced token's text */
static lm_model *model;

/* Write the bundled model with token LONG_ID's text replaced; 0 on success. */
static int write_model(void) {
    char err[LM_ERRLEN];
    gguf_ctx *g = gguf_open(TEST_MODEL, err, sizeof err);
    if (!g) return fprintf(stderr, "%s\n", err), -1;
    gguf_arr arr;
    if (!gguf_get_arr(g, "tokenizer.ggml.tokens", &arr) || arr.n <= LONG_ID) return gguf_close(g), -1;
    const char **strs = calloc(arr.n, sizeof *strs);
    char **own = calloc(arr.n, sizeof *own);
    gguf_writer *w = gguf_writer_new();
    int rc = strs && own && w ? 0 : -1;
    for (uint64_t i = 0; rc == 0 && i < arr.n; i++) {
        gguf_str s;
        if (!gguf_arr_str(&arr, i, &s) || !(own[i] = malloc(s.len + 1))) {
            rc = -1;
            break;
        }
        memcpy(own[i], s.ptr, s.len);
        own[i][s.len] = 0;
        strs[i] = i == LONG_ID ? long_text : own[i];
    }
    for (int64_t i = 0; rc == 0 && i < gguf_n_kv(g); i++) rc = gguf_w_copy_kv(w, g, i);
    if (rc == 0) rc = gguf_w_set_arr_str(w, "tokenizer.ggml.tokens", strs, arr.n);
    for (int64_t i = 0; rc == 0 && i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        rc = gguf_w_add_tensor(w, t->name, t->n_dims, t->ne, t->type, t->data, t->nbytes);
    }
    int fd = rc == 0 ? mkstemp(path) : -1;
    if (fd >= 0) close(fd);
    if (fd < 0 || gguf_writer_write(w, path, err, sizeof err)) rc = -1;
    for (uint64_t i = 0; own && i < arr.n; i++) free(own[i]);
    free(own);
    free(strs);
    gguf_writer_free(w);
    gguf_close(g);
    return rc;
}

typedef struct {
    char *text; /* (cap) */
    size_t len, cap;
    int n_tokens;
    atomic_bool done;
    lm_finish finish;
} collect;

static void on_event(void *user, const lm_event *ev) {
    collect *c = user;
    if (!ev->done) c->n_tokens++;
    if (c->len + ev->text_len <= c->cap) memcpy(c->text + c->len, ev->text, ev->text_len);
    c->len += ev->text_len;
    if (ev->done) {
        c->finish = ev->finish;
        atomic_store(&c->done, true);
    }
}

/* Greedy, 3 tokens after "Once upon a time" (ids), with the given stops. */
static int generate(lm_engine *e, const char *const *stop, int n_stop, collect *c) {
    static const int32_t prompt[] = {1, 403, 407, 261, 378};
    lm_request_params p;
    engine_request_params_default(&p);
    p.prompt = prompt;
    p.n_prompt = 5;
    p.max_tokens = 3;
    p.sp.temp = 0;
    p.stop = stop;
    p.n_stop = n_stop;
    p.on_event = on_event;
    p.user = c;
    c->cap = 4 * LONG_BYTES;
    c->text = malloc(c->cap);
    c->len = 0;
    c->n_tokens = 0;
    atomic_init(&c->done, false);
    char err[LM_ERRLEN];
    if (!c->text || engine_submit(e, &p, NULL, err, sizeof err) != LM_OK) return -1;
    engine_wait_idle(e);
    return atomic_load(&c->done) ? 0 : -1;
}

static void test_detok_max_covers_it(void) {
    /* two-byte characters: every byte may be a U+FFFD (3 bytes) when split */
    CHECK(detok_max_out(model->tok) >= LONG_BYTES);
    size_t len;
    const char *p = tok_piece(model->tok, LONG_ID, &len);
    CHECK(len == LONG_BYTES && memcmp(p, long_text, len) == 0);
}

static void test_events_hold_the_whole_token(void) {
    char err[LM_ERRLEN];
    lm_engine_config ec;
    engine_config_default(&ec);
    ec.n_threads = 2;
    ec.n_ctx = 128;
    ec.max_seqs = 2;
    lm_engine *e = engine_new(model, NULL, &ec, err, sizeof err);
    CHECKF(e != NULL, "%s", err);
    char *big_stop = malloc(1025);
    memset(big_stop, 'q', 1024);
    big_stop[1024] = 0;
    const char *stops[3][1] = {{NULL}, {"zzz"}, {big_stop}};
    int n_stops[3] = {0, 1, 1};
    size_t first_len = 0;
    for (int k = 0; k < 3; k++) {
        collect c;
        int rc = generate(e, n_stops[k] ? stops[k] : NULL, n_stops[k], &c);
        bool ok = rc == 0 && c.len <= c.cap && c.len > LONG_BYTES && c.n_tokens == 3 && c.finish == LM_FINISH_LENGTH &&
            memcmp(c.text, long_text, LONG_BYTES) == 0;
        if (k == 0) first_len = c.len;
        bool same = c.len == first_len;
        free(c.text);
        if (!ok || !same) {
            free(big_stop);
            engine_free(e);
        }
        CHECKF(ok, "stops case %d: rc %d, %zu bytes, %d tokens, finish %d", k, rc, c.len, c.n_tokens, c.finish);
        CHECKF(same, "stops case %d: %zu bytes, %zu without stops", k, c.len, first_len);
    }
    free(big_stop);
    CHECK(engine_check(e, err, sizeof err) == 0);
    engine_free(e);
}

/* special_text: a control token's text is in the output only when asked
 * (the BOS token <s>, made certain by a logit bias, three times). */
static void test_special_text(void) {
    char err[LM_ERRLEN];
    lm_engine_config ec;
    engine_config_default(&ec);
    ec.n_threads = 2;
    ec.n_ctx = 128;
    ec.max_seqs = 2;
    lm_engine *e = engine_new(model, NULL, &ec, err, sizeof err);
    CHECKF(e != NULL, "%s", err);
    CHECK(tok_is_control(model->tok, 1));
    static const int32_t prompt[] = {1, 403, 407, 261, 378};
    static const int32_t bias_id[] = {1};
    static const float bias_val[] = {100};
    size_t lens[2];
    char texts[2][64];
    for (int k = 0; k < 2; k++) {
        lm_request_params p;
        engine_request_params_default(&p);
        p.prompt = prompt, p.n_prompt = 5, p.max_tokens = 3, p.sp.temp = 0;
        p.bias_ids = bias_id, p.bias_vals = bias_val, p.n_bias = 1;
        p.special_text = k == 1;
        collect c = {.cap = 64, .text = texts[k]};
        atomic_init(&c.done, false);
        p.on_event = on_event, p.user = &c;
        CHECK(engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
        engine_wait_idle(e);
        CHECK(atomic_load(&c.done) && c.n_tokens == 3);
        lens[k] = c.len;
    }
    engine_free(e);
    CHECKF(lens[0] == 0, "%zu bytes without special_text", lens[0]);
    CHECKF(lens[1] == 9 && !memcmp(texts[1], "<s><s><s>", 9), "%.*s", (int)lens[1], texts[1]);
}

static void test_run_prints_it(void) {
    const char *bin = getenv("LAMINA_BIN") ? getenv("LAMINA_BIN") : "build/lamina";
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s run -m %s -p 'Once upon a time' -n 3 --temp 0 -t 2 2>/dev/null", bin, path);
    FILE *f = popen(cmd, "r");
    CHECK(f != NULL);
    char *out = malloc(4 * LONG_BYTES);
    size_t n = out ? fread(out, 1, 4 * LONG_BYTES, f) : 0;
    int rc = pclose(f);
    const char *echo = "Once upon a time";
    size_t el = strlen(echo);
    bool ok = out && rc == 0 && n > el + LONG_BYTES && memcmp(out, echo, el) == 0 &&
        memcmp(out + el, long_text, LONG_BYTES) == 0;
    free(out);
    CHECKF(ok, "'%s': exit %d, %zu bytes", cmd, rc, n);
}

int main(void) {
    kernels_init();
    long_text = malloc(LONG_BYTES + 1);
    for (int i = 0; i < LONG_BYTES; i += 2) memcpy(long_text + i, "\xc3\xa9", 2); /* U+00E9 */
    long_text[LONG_BYTES] = 0;
    char err[LM_ERRLEN];
    if (write_model() != 0 || !(model = model_load(path, err, sizeof err))) {
        fprintf(stderr, "cannot build the test model: %s\n", model ? "" : err);
        unlink(path);
        return 1;
    }
    TEST_RUN(test_detok_max_covers_it);
    TEST_RUN(test_events_hold_the_whole_token);
    TEST_RUN(test_run_prints_it);
    TEST_RUN(test_special_text);
    model_free(model);
    unlink(path);
    free(long_text);
    return TEST_DONE();
}
