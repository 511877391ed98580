/*
 * test_api.c - the public API (include/lamina.h) as an embedder sees it.
 *
 * Every check goes through lamina.h: status and finish names, the version,
 * load failures with the right lm_status (missing file, directory, empty,
 * not GGUF, truncated, unsupported architecture, NULL arguments), the
 * progress callback (increasing from 0 to 1, and a cancel at any point
 * failing cleanly), model info, tokenize/detokenize against recorded ids,
 * tokenizers loaded from vocabulary-only GGUF files (one made from the
 * bundled model, and llama.cpp's in tests/data/vocab against their reference
 * ids), chat rendering (by name, the model's own template, BOS left out
 * once), and the engine: text and token prompts, greedy output independent
 * of batching, cancellation, a full queue, bad parameters and a prompt too
 * long; embeddings (lm_embed, lm_embd_normalize, lm_model_embd_dim).
 *
 * Internal headers serve the fixtures only: format/gguf.h writes two files
 * (the bundled model's tokenizer metadata with no tensors under an
 * architecture name lamina does not run, and the bundled model with a chat
 * template), and base/util.h's allocation failure injection checks that
 * running out of memory anywhere in a load is LM_ERR_NOMEM.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lamina.h"
#include "base/util.h"
#include "format/gguf.h"
#include "test.h"

#define TEST_MODEL "models/stories260K.gguf"

static char tmpdir[] = "/tmp/lamina_test_api_XXXXXX";
static char path_buf[512];

static const char *tmp_path(const char *name) {
    snprintf(path_buf, sizeof path_buf, "%s/%s", tmpdir, name);
    return path_buf;
}

static bool write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static void *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc((size_t)len);
    if (p && fread(p, 1, (size_t)len, f) != (size_t)len) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *n = (size_t)len;
    return p;
}

static void test_names_and_version(void) {
    CHECK(strcmp(lm_status_name(LM_OK), "ok") == 0);
    CHECK(strcmp(lm_status_name(LM_ERR_INVALID), "invalid") == 0);
    CHECK(strcmp(lm_status_name(LM_ERR_TOO_LONG), "too_long") == 0);
    CHECK(strcmp(lm_status_name(LM_ERR_BUSY), "busy") == 0);
    CHECK(strcmp(lm_status_name(LM_ERR_NOMEM), "nomem") == 0);
    CHECK(strcmp(lm_status_name(LM_ERR_IO), "io") == 0);
    CHECK(strcmp(lm_status_name(LM_ERR_FORMAT), "format") == 0);
    CHECK(strcmp(lm_status_name(LM_ERR_UNSUPPORTED), "unsupported") == 0);
    CHECK(strcmp(lm_status_name(LM_ERR_CANCELLED), "cancelled") == 0);
    CHECK(strcmp(lm_status_name(LM_ERR_INTERNAL), "internal") == 0);
    CHECK(strcmp(lm_status_name((lm_status)-100), "unknown") == 0);
    CHECK(strcmp(lm_status_name((lm_status)1), "unknown") == 0);
    CHECK(strcmp(lm_finish_name(LM_FINISH_NONE), "none") == 0);
    CHECK(strcmp(lm_finish_name(LM_FINISH_STOP), "stop") == 0);
    CHECK(strcmp(lm_finish_name(LM_FINISH_LENGTH), "length") == 0);
    CHECK(strcmp(lm_finish_name(LM_FINISH_CANCELLED), "cancelled") == 0);
    CHECK(strcmp(lm_finish_name(LM_FINISH_ERROR), "error") == 0);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", LM_VERSION_MAJOR, LM_VERSION_MINOR, LM_VERSION_PATCH);
    CHECK(strcmp(lm_version(), want) == 0);
    CHECK(strcmp(LM_VERSION_STRING, want) == 0);
    /* the documented sampling defaults (lamina.h) */
    lm_sample_params sp;
    memset(&sp, 0xff, sizeof sp);
    lm_sample_params_default(&sp);
    CHECK(sp.temp == 0.8f && sp.top_k == 40 && sp.top_p == 0.95f && sp.min_p == 0.05f);
    CHECK(sp.repeat_penalty == 1.0f && sp.repeat_last_n == 64 && sp.freq_penalty == 0 && sp.presence_penalty == 0);
    CHECK(sp.seed == 0);
}

/* Load path expecting status want; the message must be non-empty. */
static lm_status load_status(const char *path, char *err) {
    lm_model *m = (lm_model *)1;
    err[0] = 0;
    lm_status st = lm_model_load(path, NULL, &m, err, LM_ERRLEN);
    if (st != LM_OK && m != NULL) return LM_ERR_INTERNAL; /* *out must be NULL on failure */
    if (st == LM_OK) lm_model_free(m);
    return st;
}

static void test_load_errors(void) {
    char err[LM_ERRLEN];
    CHECK(load_status(tmp_path("does-not-exist.gguf"), err) == LM_ERR_IO);
    CHECK(strstr(err, "does-not-exist.gguf") != NULL);
    CHECK(load_status(tmpdir, err) == LM_ERR_IO); /* a directory */
    CHECK(write_file(tmp_path("empty.gguf"), "", 0));
    CHECK(load_status(tmp_path("empty.gguf"), err) == LM_ERR_FORMAT);
    const char text[] = "this is not a model file, just some text\n";
    CHECK(write_file(tmp_path("text.gguf"), text, sizeof text - 1));
    CHECK(load_status(tmp_path("text.gguf"), err) == LM_ERR_FORMAT);
    CHECKF(strstr(err, "GGUF") != NULL, "%s", err);
    size_t n;
    unsigned char *model = read_file(TEST_MODEL, &n);
    CHECK(model && n > 4096);
    /* cut in the header, in the metadata, in the tensor data */
    size_t cuts[] = {6, 100, 2000, n / 2, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        bool ok = write_file(tmp_path("cut.gguf"), model, cuts[i]);
        lm_status st = load_status(tmp_path("cut.gguf"), err);
        if (!ok || st != LM_ERR_FORMAT) free(model);
        CHECKF(ok && st == LM_ERR_FORMAT, "cut at %zu: %s (%s)", cuts[i], lm_status_name(st), err);
    }
    /* version 1 is a GGUF lamina does not read */
    model[4] = 1;
    bool ok = write_file(tmp_path("v1.gguf"), model, n);
    free(model);
    CHECK(ok);
    CHECK(load_status(tmp_path("v1.gguf"), err) == LM_ERR_UNSUPPORTED);
    /* NULL arguments */
    lm_model *m;
    CHECK(lm_model_load(NULL, NULL, &m, err, sizeof err) == LM_ERR_INVALID && m == NULL);
    CHECK(lm_model_load(TEST_MODEL, NULL, NULL, err, sizeof err) == LM_ERR_INVALID);
    CHECK(lm_model_load(tmp_path("nope"), NULL, &m, NULL, 0) == LM_ERR_IO); /* err may be NULL */
}

/* Fail the k-th allocation of a load for every k until the load succeeds:
 * each failure is LM_ERR_NOMEM, with *out NULL (ASan: nothing leaks). */
static void test_load_nomem(void) {
    char err[LM_ERRLEN];
    int fails = 0, other = 0;
    bool done = false;
    for (long k = 0; k < 10000 && !done; k++) {
        lm_model *m = (lm_model *)1;
        lm_alloc_fail_after(k);
        lm_status st = lm_model_load(TEST_MODEL, NULL, &m, err, sizeof err);
        lm_alloc_fail_after(-1);
        if (st == LM_OK) lm_model_free(m);
        done = st == LM_OK;
        fails += st == LM_ERR_NOMEM && m == NULL;
        if (st != LM_OK && (st != LM_ERR_NOMEM || m != NULL) && other++ == 0)
            fprintf(stderr, "  model, allocation %ld: %s: %s\n", k, lm_status_name(st), err);
    }
    CHECK(done && fails > 5 && other == 0);
    done = false;
    fails = 0;
    for (long k = 0; k < 10000 && !done; k++) {
        lm_tokenizer *t = (lm_tokenizer *)1;
        lm_alloc_fail_after(k);
        lm_status st = lm_tokenizer_load("tests/data/vocab/ggml-vocab-gpt-2.gguf", &t, err, sizeof err);
        lm_alloc_fail_after(-1);
        if (st == LM_OK) lm_tokenizer_free(t);
        done = st == LM_OK;
        fails += st == LM_ERR_NOMEM && t == NULL;
        if (st != LM_OK && (st != LM_ERR_NOMEM || t != NULL) && other++ == 0)
            fprintf(stderr, "  tokenizer, allocation %ld: %s: %s\n", k, lm_status_name(st), err);
    }
    CHECK(done && fails > 5 && other == 0);
}

typedef struct {
    float seen[4096];
    int n;
    int stop_at; /* answer false on this call (0-based); -1 never */
} progress_log;

static bool on_progress(void *user, float done) {
    progress_log *p = user;
    if (p->n < 4096) p->seen[p->n] = done;
    return p->n++ != p->stop_at;
}

static void test_progress(void) {
    char err[LM_ERRLEN];
    progress_log *log = calloc(1, sizeof *log);
    CHECK(log);
    log->stop_at = -1;
    lm_load_params lp;
    lm_load_params_default(&lp);
    lp.progress = on_progress;
    lp.progress_user = log;
    lm_model *m;
    lm_status st = lm_model_load(TEST_MODEL, &lp, &m, err, sizeof err);
    int n = log->n;
    bool increasing = true;
    for (int i = 1; i < n; i++) increasing &= log->seen[i] >= log->seen[i - 1];
    float first = log->seen[0], last = log->seen[n - 1];
    lm_model_free(m);
    if (st != LM_OK || n < 3 || !increasing) free(log);
    CHECKF(st == LM_OK, "%s", err);
    CHECKF(n >= 7, "%d progress calls (header, 5 layers, end)", n);
    CHECK(increasing);
    CHECK(first == 0.0f && last == 1.0f);
    /* stop at every call in turn: each load fails cleanly with CANCELLED
     * (the sanitizer build checks that nothing leaks) */
    for (int stop = 0; stop < n; stop++) {
        memset(log, 0, sizeof *log);
        log->stop_at = stop;
        m = (lm_model *)1;
        st = lm_model_load(TEST_MODEL, &lp, &m, err, sizeof err);
        int calls = log->n;
        if (st != LM_ERR_CANCELLED || m != NULL || calls != stop + 1) free(log);
        CHECKF(st == LM_ERR_CANCELLED && m == NULL, "stop at call %d: %s", stop, lm_status_name(st));
        CHECK(calls == stop + 1); /* no call after the stop */
    }
    free(log);
}

static lm_model *model;
static const lm_tokenizer *mtok;

static void test_model_info(void) {
    lm_model_info info;
    lm_model_get_info(model, &info);
    CHECK(strcmp(info.arch, "llama") == 0);
    CHECK(info.name && info.name[0]);
    CHECK(info.n_vocab == 512 && info.n_layer == 5 && info.n_embd == 64);
    CHECK(info.n_head == 8 && info.n_head_kv == 4 && info.n_ctx_train == 128);
    CHECK(info.n_params == 292800 && info.weight_bytes == 1171200);
    CHECK(mtok != NULL);
    CHECK(lm_vocab_size(mtok) == 512);
    CHECK(lm_token_bos(mtok) == 1 && lm_token_eos(mtok) == 2);
    CHECK(lm_token_is_eog(mtok, 2) && !lm_token_is_eog(mtok, 1) && !lm_token_is_eog(mtok, 300));
    CHECK(lm_tokenizer_adds_bos(mtok) && !lm_tokenizer_adds_eos(mtok) && !lm_tokenizer_adds_eos(NULL));
}

static void test_tokenize_roundtrip(void) {
    const char *text = "Once upon a time, there was a little girl.";
    /* recorded with `lamina tokenize --ids` */
    static const int32_t want[] = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 426};
    const int nw = (int)(sizeof want / sizeof want[0]);
    int32_t ids[64];
    int n = lm_tokenize(mtok, text, strlen(text), true, false, ids, 64);
    CHECK(n == nw);
    CHECK(memcmp(ids, want, sizeof want) == 0);
    /* without BOS; a short buffer still tells the full count */
    CHECK(lm_tokenize(mtok, text, strlen(text), false, false, ids, 64) == nw - 1 && ids[0] == want[1]);
    int32_t few[3];
    CHECK(lm_tokenize(mtok, text, strlen(text), true, false, few, 3) == nw);
    CHECK(few[0] == want[0] && few[2] == want[2]);
    CHECK(lm_tokenize(mtok, text, strlen(text), true, false, NULL, 0) == nw);
    CHECK(lm_tokenize(mtok, "", 0, true, false, ids, 64) == 1 && ids[0] == 1);
    CHECK(lm_tokenize(mtok, "", 0, false, false, ids, 64) == 0);
    /* detokenize: the text again (BOS is a control token: no text) */
    char out[256];
    long len = lm_detokenize(mtok, want, nw, false, out, sizeof out);
    CHECK(len == (long)strlen(text) && memcmp(out, text, (size_t)len) == 0);
    len = lm_detokenize(mtok, want, nw, true, out, sizeof out);          /* with control tokens */
    CHECK(len == (long)strlen(text) + 4 && memcmp(out, "<s> ", 4) == 0); /* the space is no longer first */
    char small[5];
    CHECK(lm_detokenize(mtok, want, nw, false, small, sizeof small) == (long)strlen(text));
    CHECK(memcmp(small, text, sizeof small) == 0);
    CHECK(lm_detokenize(mtok, want, nw, false, NULL, 0) == (long)strlen(text));
    CHECK(lm_detokenize(mtok, want, 0, false, out, sizeof out) == 0);
    /* UTF-8 through byte tokens */
    const char *utf = "caf\xc3\xa9 \xe2\x82\xac 1";
    n = lm_tokenize(mtok, utf, strlen(utf), false, false, ids, 64);
    CHECK(n > 0 && n <= 64);
    len = lm_detokenize(mtok, ids, n, false, out, sizeof out);
    CHECK(len == (long)strlen(utf) && memcmp(out, utf, (size_t)len) == 0);
    /* bad arguments */
    CHECK(lm_tokenize(NULL, text, 4, true, false, ids, 64) == LM_ERR_INVALID);
    CHECK(lm_tokenize(mtok, NULL, 4, true, false, ids, 64) == LM_ERR_INVALID);
    CHECK(lm_tokenize(mtok, text, 4, true, false, NULL, 64) == LM_ERR_INVALID);
    CHECK(lm_tokenize(mtok, text, 4, true, false, ids, -1) == LM_ERR_INVALID);
    int32_t bad[] = {1, 512};
    CHECK(lm_detokenize(mtok, bad, 2, false, out, sizeof out) == LM_ERR_INVALID);
    bad[1] = -1;
    CHECK(lm_detokenize(mtok, bad, 2, false, out, sizeof out) == LM_ERR_INVALID);
    CHECK(lm_detokenize(mtok, NULL, 2, false, out, sizeof out) == LM_ERR_INVALID);
}

/* The bundled model's tokenizer metadata with no tensors, as an
 * architecture lamina does not run: the kind of file llama.cpp's tokenizer
 * tests use. */
static int write_vocab_only(const char *dst, char *err, size_t errlen) {
    gguf_ctx *g = gguf_open(TEST_MODEL, err, errlen);
    if (!g) return -1;
    gguf_writer *w = gguf_writer_new();
    int rc = w ? 0 : -1;
    for (int64_t i = 0; i < gguf_n_kv(g) && !rc; i++) {
        gguf_str key = gguf_kv_key(g, i);
        if (key.len > 10 && memcmp(key.ptr, "tokenizer.", 10) == 0) rc = gguf_w_copy_kv(w, g, i);
    }
    if (!rc) rc = gguf_w_set_str(w, "general.architecture", "vocab-only-test");
    if (!rc) rc = gguf_writer_write(w, dst, err, errlen);
    gguf_writer_free(w);
    gguf_close(g);
    return rc;
}

/* The bundled model with tokenizer.chat_template set to text. */
static int write_with_template(const char *dst, const char *text, char *err, size_t errlen) {
    gguf_ctx *g = gguf_open(TEST_MODEL, err, errlen);
    if (!g) return -1;
    gguf_writer *w = gguf_writer_new();
    int rc = w ? 0 : -1;
    for (int64_t i = 0; i < gguf_n_kv(g) && !rc; i++) rc = gguf_w_copy_kv(w, g, i);
    for (int64_t i = 0; i < gguf_n_tensors(g) && !rc; i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        rc = gguf_w_add_tensor(w, t->name, t->n_dims, t->ne, t->type, t->data, t->nbytes);
    }
    if (!rc) rc = gguf_w_set_str(w, "tokenizer.chat_template", text);
    if (!rc) rc = gguf_writer_write(w, dst, err, errlen);
    gguf_writer_free(w);
    gguf_close(g);
    return rc;
}

static void test_vocab_only_tokenizer(void) {
    char err[LM_ERRLEN];
    const char *path = tmp_path("vocab.gguf");
    CHECKF(write_vocab_only(path, err, sizeof err) == 0, "%s", err);
    lm_tokenizer *t;
    lm_status st = lm_tokenizer_load(path, &t, err, sizeof err);
    CHECKF(st == LM_OK, "%s", err);
    /* the same answers as the model's own tokenizer */
    const char *texts[] = {"Once upon a time, there was a little girl.", "Hello world", "  two  spaces\nand a line",
                           "caf\xc3\xa9", ""};
    bool same = lm_vocab_size(t) == 512 && lm_token_bos(t) == 1 && lm_token_eos(t) == 2 && lm_tokenizer_adds_bos(t);
    for (size_t i = 0; i < sizeof texts / sizeof texts[0] && same; i++) {
        int32_t a[128], b[128];
        int na = lm_tokenize(t, texts[i], strlen(texts[i]), true, true, a, 128);
        int nb = lm_tokenize(mtok, texts[i], strlen(texts[i]), true, true, b, 128);
        same = na == nb && na > 0 && memcmp(a, b, (size_t)na * sizeof *a) == 0;
        char out[256];
        long len = lm_detokenize(t, a, na, false, out, sizeof out);
        same = same && len == (long)strlen(texts[i]) && memcmp(out, texts[i], (size_t)len) == 0;
    }
    lm_tokenizer_free(t);
    CHECK(same);
    /* as a model it is an architecture lamina does not run */
    CHECK(load_status(path, err) == LM_ERR_UNSUPPORTED);
    CHECKF(strstr(err, "vocab-only-test") != NULL, "%s", err);
    /* a full model file works too */
    CHECK(lm_tokenizer_load(TEST_MODEL, &t, err, sizeof err) == LM_OK);
    CHECK(lm_vocab_size(t) == 512);
    lm_tokenizer_free(t);
    /* failures */
    t = (lm_tokenizer *)1;
    CHECK(lm_tokenizer_load(tmp_path("missing.gguf"), &t, err, sizeof err) == LM_ERR_IO && t == NULL);
    CHECK(lm_tokenizer_load(tmp_path("text.gguf"), &t, err, sizeof err) == LM_ERR_FORMAT);
    CHECK(lm_tokenizer_load(NULL, &t, err, sizeof err) == LM_ERR_INVALID);
}

/* llama.cpp's vocabulary-only files (tests/data/vocab): each loads as a
 * tokenizer handle and encodes every reference case to the recorded ids. */
static void test_vocab_files(void) {
    static const char *const names[] = {"ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf", "ggml-vocab-gpt-2.gguf"};
    const char *sep = "\n__ggml_vocab_test__\n";
    for (size_t f = 0; f < sizeof names / sizeof names[0]; f++) {
        char path[256], err[LM_ERRLEN];
        snprintf(path, sizeof path, "tests/data/vocab/%s", names[f]);
        lm_tokenizer *t;
        lm_status st = lm_tokenizer_load(path, &t, err, sizeof err);
        CHECKF(st == LM_OK, "%s: %s", path, err);
        size_t ni, no;
        snprintf(path, sizeof path, "tests/data/vocab/%s.inp", names[f]);
        char *inp = read_file(path, &ni);
        snprintf(path, sizeof path, "tests/data/vocab/%s.out", names[f]);
        char *outs = read_file(path, &no);
        int cases = 0, bad = -1;
        if (inp && outs) {
            inp = realloc(inp, ni + 1);
            outs = realloc(outs, no + 1);
            inp[ni] = outs[no] = 0;
            char *text = inp, *line = outs;
            for (char *end; (end = strstr(text, sep)) && bad < 0; text = end + strlen(sep), cases++) {
                char *nl = strchr(line, '\n');
                if (!nl) {
                    bad = cases;
                    break;
                }
                *nl = 0;
                int32_t want[512], got[512];
                int nw = 0;
                for (char *q = line; *q && nw < 512;) {
                    char *e;
                    long v = strtol(q, &e, 10);
                    if (e == q) break;
                    want[nw++] = (int32_t)v;
                    q = e;
                }
                int n = lm_tokenize(t, text, (size_t)(end - text), false, false, got, 512);
                if (n != nw || memcmp(got, want, (size_t)nw * sizeof *got) != 0) bad = cases;
                line = nl + 1;
            }
        }
        free(inp);
        free(outs);
        lm_tokenizer_free(t);
        CHECKF(cases >= 10 && bad < 0, "%s: %d cases, case %d differs", names[f], cases, bad);
    }
}

/* lm_chat_render_opts: gpt-oss's effort and date, Qwen3's thinking switch,
 * bad options refused. */
static void test_chat_render_opts(void) {
    char err[LM_ERRLEN], *out = NULL;
    lm_chat_msg msgs[] = {{"system", "Be brief."}, {"user", "Hi"}};
    lm_chat_options o;
    lm_chat_options_default(&o);
    CHECK(o.size == sizeof o && !o.reasoning_effort && !o.thinking_off && !o.date && !o.model_identity);
    o.reasoning_effort = "high";
    o.date = "2025-08-05";
    CHECKF(lm_chat_render_opts(model, "gpt-oss", msgs, 2, &o, &out, err, sizeof err) == LM_OK, "%s", err);
    int same = strcmp(out,
                      "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
                      "Knowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: high\n\n# Valid "
                      "channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
                      "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|><|start|>user<|message|>"
                      "Hi<|end|><|start|>assistant");
    if (same) fprintf(stderr, "  gpt-oss gave: %s\n", out);
    lm_string_free(out);
    CHECK(same == 0);
    o.model_identity = "You are X.";
    CHECK(lm_chat_render_opts(model, "gpt-oss", msgs, 2, &o, &out, err, sizeof err) == LM_OK);
    CHECK(!strncmp(out, "<|start|>system<|message|>You are X.\nKnowledge cutoff: 2024-06\n", 60));
    lm_string_free(out);
    /* the options a family has no place for change nothing; thinking_off does for Qwen3 */
    char *plain = NULL;
    CHECK(lm_chat_render(model, "qwen3", msgs, 2, &plain, err, sizeof err) == LM_OK);
    CHECK(lm_chat_render_opts(model, "qwen3", msgs, 2, &o, &out, err, sizeof err) == LM_OK);
    CHECK(!strcmp(out, plain));
    lm_string_free(out);
    o.thinking_off = true;
    CHECK(lm_chat_render_opts(model, "qwen3", msgs, 2, &o, &out, err, sizeof err) == LM_OK);
    size_t pl = strlen(plain);
    CHECK(!strncmp(out, plain, pl) && !strcmp(out + pl, "<think>\n\n</think>\n\n"));
    lm_string_free(out);
    lm_string_free(plain);
    /* NULL options: lm_chat_render */
    CHECK(lm_chat_render_opts(model, "chatml", msgs, 2, NULL, &out, err, sizeof err) == LM_OK &&
          !strncmp(out, "<|im_start|>system\nBe brief.", 28));
    lm_string_free(out);
    /* refused: an effort, a date, a size, a role */
    static const char *efforts[] = {"extreme", "", "HIGH"}, *dates[] = {"2025-8-05", "tomorrow", "2025-08-051"};
    lm_chat_options_default(&o);
    for (int i = 0; i < 3; i++) {
        o.reasoning_effort = efforts[i];
        out = (char *)1;
        CHECK(lm_chat_render_opts(model, "gpt-oss", msgs, 2, &o, &out, err, sizeof err) == LM_ERR_INVALID && !out);
        o.reasoning_effort = NULL;
        o.date = dates[i];
        CHECK(lm_chat_render_opts(model, "gpt-oss", msgs, 2, &o, &out, err, sizeof err) == LM_ERR_INVALID && !out);
        o.date = NULL;
    }
    o.size = sizeof o + 8;
    CHECK(lm_chat_render_opts(model, "gpt-oss", msgs, 2, &o, &out, err, sizeof err) == LM_ERR_INVALID);
    lm_chat_options_default(&o);
    lm_chat_msg tool[] = {{"tool", "x"}};
    CHECK(lm_chat_render_opts(model, "gpt-oss", tool, 1, &o, &out, err, sizeof err) == LM_ERR_INVALID && !out);
}

static void test_chat_render(void) {
    char err[LM_ERRLEN];
    lm_chat_msg msgs[] = {{"system", "Be brief."}, {"user", "Hi"}};
    char *out = NULL;
    CHECKF(lm_chat_render(model, "chatml", msgs, 2, &out, err, sizeof err) == LM_OK, "%s", err);
    int same = strcmp(out,
                      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                      "<|im_start|>assistant\n");
    lm_string_free(out);
    CHECK(same == 0);
    /* llama3 writes BOS first; the model's tokenizer adds BOS itself, so the
     * written one is dropped (one BOS either way) */
    CHECK(lm_chat_render(model, "llama3", msgs + 1, 1, &out, err, sizeof err) == LM_OK);
    same = strcmp(out,
                  "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    lm_string_free(out);
    CHECK(same == 0);
    /* llama2 writes BOS before each user turn: only the first is dropped */
    lm_chat_msg turns[] = {{"user", "A"}, {"assistant", "B"}, {"user", "C"}};
    CHECK(lm_chat_render(model, "llama2", turns, 3, &out, err, sizeof err) == LM_OK);
    same = strcmp(out, "[INST] A [/INST] B </s><s>[INST] C [/INST]");
    if (same) fprintf(stderr, "  llama2 gave: %s\n", out);
    lm_string_free(out);
    CHECK(same == 0);
    /* the bundled model has no template of its own */
    out = (char *)1;
    CHECK(lm_chat_render(model, NULL, msgs, 2, &out, err, sizeof err) == LM_ERR_UNSUPPORTED && out == NULL);
    CHECK(lm_chat_render(model, "no-such-family", msgs, 2, &out, err, sizeof err) == LM_ERR_INVALID);
    lm_chat_msg bad[] = {{"robot", "Hi"}};
    CHECK(lm_chat_render(model, "chatml", bad, 1, &out, err, sizeof err) == LM_ERR_INVALID && out == NULL);
    CHECK(lm_chat_render(model, "chatml", msgs, 0, &out, err, sizeof err) == LM_ERR_INVALID);
    CHECK(lm_chat_render(NULL, "chatml", msgs, 2, &out, err, sizeof err) == LM_ERR_INVALID);
    /* a model with a template of its own: a Llama 3 one writes BOS, which is
     * dropped as the tokenizer adds it; one of no known family is refused */
    const char *llama3 = "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
                         "<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
                         "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";
    const char *path = tmp_path("templ.gguf");
    CHECKF(write_with_template(path, llama3, err, sizeof err) == 0, "%s", err);
    lm_model *m2;
    CHECKF(lm_model_load(path, NULL, &m2, err, sizeof err) == LM_OK, "%s", err);
    lm_status st = lm_chat_render(m2, NULL, msgs + 1, 1, &out, err, sizeof err);
    lm_model_free(m2);
    CHECKF(st == LM_OK, "%s", err);
    same = strcmp(out,
                  "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    lm_string_free(out);
    CHECK(same == 0);
    CHECKF(write_with_template(path, "{{ messages }}", err, sizeof err) == 0, "%s", err);
    CHECKF(lm_model_load(path, NULL, &m2, err, sizeof err) == LM_OK, "%s", err);
    st = lm_chat_render(m2, NULL, msgs, 2, &out, err, sizeof err);
    lm_status st2 = lm_chat_render(m2, "chatml", msgs, 2, &out, err, sizeof err); /* a name still works */
    lm_string_free(out);
    lm_model_free(m2);
    CHECK(st == LM_ERR_UNSUPPORTED && st2 == LM_OK);
}

/* ---- the engine ---------------------------------------------------------- */

/* One request's events, collected on the engine thread. */
typedef struct {
    char text[4096];
    size_t len;
    int32_t ids[512];
    int n_tok, n_done;
    lm_finish finish;
    lm_status status;
    int completion_tokens;
    /* blocking: the second token event (in the engine's second iteration,
     * after the first one's bookkeeping) waits until `release` is set */
    atomic_bool block, blocked, release;
} collect;

static void on_event(void *user, const lm_event *ev) {
    collect *c = user;
    if (ev->text_len && c->len + ev->text_len < sizeof c->text) {
        memcpy(c->text + c->len, ev->text, ev->text_len);
        c->len += ev->text_len;
    }
    if (!ev->done) {
        if (c->n_tok < 512) c->ids[c->n_tok] = ev->token;
        c->n_tok++;
        if (c->n_tok == 2 && atomic_load(&c->block)) {
            atomic_store(&c->block, false);
            atomic_store(&c->blocked, true);
            while (!atomic_load(&c->release)) usleep(1000);
        }
        return;
    }
    c->n_done++;
    c->finish = ev->finish;
    c->status = ev->status;
    c->completion_tokens = ev->stats ? ev->stats->completion_tokens : -1;
}

static lm_request_params greedy(collect *c, const char *text, int max_tokens) {
    lm_request_params p;
    lm_request_params_default(&p);
    p.text = text;
    p.text_len = text ? strlen(text) : 0;
    p.max_tokens = max_tokens;
    p.sp.temp = 0;
    p.on_event = on_event;
    p.user = c;
    return p;
}

static void test_engine_generate(void) {
    char err[LM_ERRLEN];
    lm_engine_config cfg;
    lm_engine_config_default(&cfg);
    cfg.n_threads = 1;
    lm_engine *e;
    CHECKF(lm_engine_new(model, &cfg, &e, err, sizeof err) == LM_OK, "%s", err);
    static collect a, b, c;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    memset(&c, 0, sizeof c);
    /* the same prompt as text, as token ids, and alongside another prompt */
    const char *prompt = "Once upon a time";
    int32_t ids[32];
    int n = lm_tokenize(mtok, prompt, strlen(prompt), true, true, ids, 32);
    lm_request_params pa = greedy(&a, prompt, 40);
    lm_request_params pb = greedy(&b, NULL, 40);
    pb.prompt = ids;
    pb.n_prompt = n;
    lm_request_params pc = greedy(&c, "The little dog", 40);
    lm_status sa = lm_engine_submit(e, &pa, NULL, err, sizeof err);
    lm_status sb = lm_engine_submit(e, &pb, NULL, err, sizeof err);
    lm_status sc = lm_engine_submit(e, &pc, NULL, err, sizeof err);
    lm_engine_wait_idle(e);
    lm_engine_stats st;
    lm_engine_get_stats(e, &st);
    lm_engine_free(e);
    CHECK(sa == LM_OK && sb == LM_OK && sc == LM_OK);
    CHECK(a.n_done == 1 && b.n_done == 1 && c.n_done == 1);
    CHECK(a.finish == LM_FINISH_LENGTH || a.finish == LM_FINISH_STOP);
    CHECK(a.status == LM_OK && a.completion_tokens == a.n_tok);
    CHECK(a.n_tok == b.n_tok && memcmp(a.ids, b.ids, (size_t)a.n_tok * sizeof a.ids[0]) == 0);
    CHECK(a.len == b.len && memcmp(a.text, b.text, a.len) == 0);
    /* the demo's story (e2e_cli.sh), up to where 40 tokens reach */
    const char *story = ", there was a little girl named Lily. She loved to play outside in the park.";
    CHECKF(a.len >= strlen(story) && memcmp(a.text, story, strlen(story)) == 0, "%.*s", (int)a.len, a.text);
    /* the detokenized ids are the streamed text */
    char out[4096];
    long len = lm_detokenize(mtok, a.ids, a.n_tok, false, out, sizeof out);
    CHECK(len == (long)a.len && memcmp(out, a.text, a.len) == 0);
    CHECK(st.requests_finished == 3 && st.running == 0 && st.waiting == 0);
    CHECK(st.generation_tokens_total == (uint64_t)(a.n_tok + b.n_tok + c.n_tok));
    CHECK(st.iterations > 0 && st.kv_blocks_used == 0);
}

/* Speculation through the public struct: lm_spec_config_default sets the
 * size and the defaults; a program built with fewer fields (a smaller
 * size) gets the rest at their defaults, beyond it nothing is read; prompt
 * lookup through lm_engine_new gives the plain greedy output and counts
 * its proposals; a struct without its size is refused. */
static void test_engine_spec(void) {
    lm_spec_config sc;
    memset(&sc, 0xab, sizeof sc);
    lm_spec_config_default(&sc);
    CHECK(sc.size == sizeof sc && sc.proposer == LM_SPEC_NGRAM && sc.max == 4 && !sc.draft_model && sc.min == 0 &&
          sc.p_min == 0 && sc.cost == 0 && sc.draft_vocab == -1);
    /* an older program's struct: only up to max */
    struct {
        lm_spec_config c;
        char tail[16];
    } small;
    memset(&small, 0x5a, sizeof small);
    size_t n = offsetof(lm_spec_config, max) + sizeof small.c.max;
    lm_spec_config_init(&small.c, n);
    CHECK(small.c.size == n && small.c.proposer == LM_SPEC_NGRAM && small.c.max == 4);
    CHECK(((unsigned char *)&small.c)[n] == 0x5a); /* nothing past its size written */
    CHECK(small.tail[0] == 0x5a);
    char err[LM_ERRLEN];
    static collect plain, spec;
    for (int k = 0; k < 2; k++) {
        lm_engine_config cfg;
        lm_engine_config_default(&cfg);
        CHECK(cfg.spec == NULL); /* no speculation by default */
        cfg.n_threads = 1;
        if (k) {
            small.c.max = 6; /* the rest (draft fields, cost) past the size: not read */
            cfg.spec = &small.c;
        }
        lm_engine *e;
        CHECKF(lm_engine_new(model, &cfg, &e, err, sizeof err) == LM_OK, "%s", err);
        collect *c = k ? &spec : &plain;
        memset(c, 0, sizeof *c);
        const char *prompt = "Once upon a time there was a little girl named Lily. Once upon a time";
        lm_request_params p = greedy(c, prompt, 40);
        CHECK(lm_engine_submit(e, &p, NULL, err, sizeof err) == LM_OK);
        lm_engine_wait_idle(e);
        lm_engine_stats st;
        lm_engine_get_stats(e, &st);
        lm_engine_free(e);
        /* the cost is past the size: measured at start, and under an emulator (make test-arm)
         * guesses may never pay for themselves there */
        if (!k) CHECK(st.spec_proposed_total == 0);
        else if (!getenv("LAMINA_EMULATED"))
            CHECKF(st.spec_proposed_total > 0 && st.spec_accepted_total > 0, "%llu proposed",
                   (unsigned long long)st.spec_proposed_total);
    }
    CHECK(plain.n_tok == spec.n_tok && memcmp(plain.ids, spec.ids, (size_t)plain.n_tok * sizeof plain.ids[0]) == 0);
    /* a struct not filled by the default (size 0) */
    lm_spec_config bad = {.proposer = LM_SPEC_NGRAM};
    lm_engine_config cfg;
    lm_engine_config_default(&cfg);
    cfg.spec = &bad;
    lm_engine *e = NULL;
    CHECK(lm_engine_new(model, &cfg, &e, err, sizeof err) == LM_ERR_INVALID && !e);
    CHECKF(strstr(err, "lm_spec_config.size") != NULL, "%s", err);
    /* nor one from a newer lamina.h (larger than this library's) */
    lm_spec_config_default(&bad);
    bad.size = sizeof bad + 8;
    CHECK(lm_engine_new(model, &cfg, &e, err, sizeof err) == LM_ERR_INVALID && !e);
}

static void test_engine_cancel_busy(void) {
    char err[LM_ERRLEN];
    lm_engine_config cfg;
    lm_engine_config_default(&cfg);
    cfg.n_threads = 1;
    cfg.max_waiting = 1;
    lm_engine *e;
    CHECKF(lm_engine_new(model, &cfg, &e, err, sizeof err) == LM_OK, "%s", err);
    static collect a, b, c;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    memset(&c, 0, sizeof c);
    atomic_store(&a.block, true);
    lm_request_params pa = greedy(&a, "Once upon a time", 100);
    pa.ignore_eos = true;
    lm_request *ra = NULL;
    lm_status s1 = lm_engine_submit(e, &pa, &ra, err, sizeof err);
    /* the engine thread now waits inside a's second token event */
    for (int i = 0; i < 5000 && !atomic_load(&a.blocked); i++) usleep(1000);
    bool blocked = atomic_load(&a.blocked);
    lm_request_params pb = greedy(&b, "The little dog", 10);
    lm_request_params pc = greedy(&c, "The little dog", 10);
    lm_status s2 = lm_engine_submit(e, &pb, NULL, err, sizeof err); /* waits: the queue is full */
    lm_status s3 = lm_engine_submit(e, &pc, NULL, err, sizeof err);
    lm_request_cancel(e, ra);
    atomic_store(&a.release, true);
    lm_engine_wait_idle(e);
    lm_request_cancel(e, ra); /* after it finished: harmless */
    lm_request_release(e, ra);
    lm_engine_stats st;
    lm_engine_get_stats(e, &st);
    lm_engine_free(e);
    CHECK(s1 == LM_OK && ra != NULL && blocked);
    CHECK(s2 == LM_OK);
    CHECKF(s3 == LM_ERR_BUSY, "%s", lm_status_name(s3));
    CHECK(a.n_done == 1 && a.finish == LM_FINISH_CANCELLED && a.n_tok < 100);
    CHECK(b.n_done == 1 && b.finish != LM_FINISH_CANCELLED && b.n_tok > 0);
    CHECK(c.n_done == 0); /* a refused request gets no event */
    CHECK(st.requests_rejected == 1);
}

static void test_engine_bad_requests(void) {
    char err[LM_ERRLEN];
    lm_engine_config cfg;
    lm_engine_config_default(&cfg);
    cfg.n_threads = 1;
    cfg.n_ctx = 64;
    lm_engine *e;
    CHECKF(lm_engine_new(model, &cfg, &e, err, sizeof err) == LM_OK, "%s", err);
    static collect c;
    memset(&c, 0, sizeof c);
    lm_request_params p = greedy(&c, "Once upon a time", 8);
    lm_request *r = (lm_request *)1;
    p.max_tokens = 0;
    lm_status s_max = lm_engine_submit(e, &p, &r, err, sizeof err);
    lm_request *r_after = r;
    p = greedy(&c, "Once upon a time", 8);
    p.n = 0;
    lm_status s_n = lm_engine_submit(e, &p, NULL, err, sizeof err);
    p = greedy(&c, "Once upon a time", 8);
    p.on_event = NULL;
    lm_status s_cb = lm_engine_submit(e, &p, NULL, err, sizeof err);
    int32_t ids[] = {1, 512};
    p = greedy(&c, NULL, 8);
    p.prompt = ids;
    p.n_prompt = 2;
    lm_status s_id = lm_engine_submit(e, &p, NULL, err, sizeof err);
    p = greedy(&c, NULL, 8);
    lm_status s_empty = lm_engine_submit(e, &p, NULL, err, sizeof err);
    p = greedy(&c, "Once upon a time", 8);
    p.top_logprobs = LM_MAX_TOP_LOGPROBS + 1;
    lm_status s_top = lm_engine_submit(e, &p, NULL, err, sizeof err);
    /* 100 prompt tokens never fit a 64-token context */
    int32_t longp[100];
    for (int i = 0; i < 100; i++) longp[i] = 300 + i % 50;
    p = greedy(&c, NULL, 8);
    p.prompt = longp;
    p.n_prompt = 100;
    lm_status s_long = lm_engine_submit(e, &p, NULL, err, sizeof err);
    lm_status s_null = lm_engine_submit(e, NULL, NULL, err, sizeof err);
    lm_engine_wait_idle(e);
    lm_engine_free(e);
    CHECK(s_max == LM_ERR_INVALID && r_after == NULL);
    CHECK(s_n == LM_ERR_INVALID && s_cb == LM_ERR_INVALID && s_id == LM_ERR_INVALID);
    CHECK(s_empty == LM_ERR_INVALID && s_top == LM_ERR_INVALID && s_null == LM_ERR_INVALID);
    CHECKF(s_long == LM_ERR_TOO_LONG, "%s", lm_status_name(s_long));
    CHECK(c.n_done == 0 && c.n_tok == 0);
    /* bad engine configurations */
    cfg.watermark = 1.5;
    e = (lm_engine *)1;
    CHECK(lm_engine_new(model, &cfg, &e, err, sizeof err) == LM_ERR_INVALID && e == NULL);
    lm_engine_config_default(&cfg);
    cfg.kv_type = 2;
    CHECK(lm_engine_new(model, &cfg, &e, err, sizeof err) == LM_ERR_INVALID);
    CHECK(lm_engine_new(NULL, NULL, &e, err, sizeof err) == LM_ERR_INVALID);
    static const double bad_itl[] = {0.5, -1, NAN, INFINITY}; /* the latency bound: 0 or finite >= 1 */
    for (int i = 0; i < 4; i++) {
        lm_engine_config_default(&cfg);
        CHECK(cfg.itl_factor == 0.0);
        cfg.itl_factor = bad_itl[i];
        e = (lm_engine *)1;
        lm_status s_itl = lm_engine_new(model, &cfg, &e, err, sizeof err);
        CHECKF(s_itl == LM_ERR_INVALID && e == NULL && strstr(err, "itl_factor"), "%g: %s", bad_itl[i], err);
    }
    /* a KV budget too small for one block of every layer: the caller's mistake, not memory */
    lm_engine_config_default(&cfg);
    cfg.kv_mem = 64;
    e = (lm_engine *)1;
    lm_status s_kv = lm_engine_new(model, &cfg, &e, err, sizeof err);
    CHECKF(s_kv == LM_ERR_INVALID && e == NULL && err[0], "%s: %s", lm_status_name(s_kv), err);
}

/* Structs that grow (lamina.h): a program built against an older lamina.h
 * passes a shorter struct, and lamina reads only its `size` bytes (the
 * fields past them keep their defaults); a struct lamina fills is written
 * only as far as the program's size. A field past a shortened size holds
 * an invalid value here, so reading it would fail the call. */
static void test_struct_growth(void) {
    char err[LM_ERRLEN];
    /* defaults written only up to size: the bytes after stay as they were */
    _Alignas(max_align_t) unsigned char raw[sizeof(lm_engine_config) + 16];
    memset(raw, 0xa5, sizeof raw);
    size_t cut = offsetof(lm_engine_config, watermark);
    lm_engine_config_init((lm_engine_config *)(void *)raw, cut);
    size_t size;
    memcpy(&size, raw, sizeof size);
    bool untouched = true;
    for (size_t i = cut; i < sizeof raw; i++) untouched &= raw[i] == 0xa5;
    CHECK(size == cut && untouched);
    lm_engine_config cfg;
    lm_engine_config_default(&cfg);
    CHECK(cfg.size == sizeof cfg && cfg.watermark == 0.01 && cfg.prefix_cache);
    /* an older program's engine config: watermark is past its size */
    cfg.n_threads = 1;
    cfg.watermark = 5.0;
    lm_engine *e = NULL;
    CHECK(lm_engine_new(model, &cfg, &e, err, sizeof err) == LM_ERR_INVALID && e == NULL);
    cfg.size = cut;
    lm_status s_old = lm_engine_new(model, &cfg, &e, err, sizeof err);
    CHECKF(s_old == LM_OK && e, "%s: %s", lm_status_name(s_old), err);
    /* sizes no lamina.h gives */
    lm_engine *e2 = (lm_engine *)1;
    cfg.size = 0;
    CHECK(lm_engine_new(model, &cfg, &e2, err, sizeof err) == LM_ERR_INVALID && e2 == NULL);
    CHECKF(strstr(err, "lm_engine_config.size is 0") != NULL, "%s", err);
    cfg.size = sizeof cfg + 8;
    CHECK(lm_engine_new(model, &cfg, &e2, err, sizeof err) == LM_ERR_INVALID);
    /* an older program's request: top_logprobs past its size keeps its default (0) */
    static collect c;
    memset(&c, 0, sizeof c);
    lm_request_params p = greedy(&c, "Once upon a time", 8);
    p.top_logprobs = LM_MAX_TOP_LOGPROBS + 1;
    CHECK(lm_engine_submit(e, &p, NULL, err, sizeof err) == LM_ERR_INVALID);
    p.size = offsetof(lm_request_params, top_logprobs);
    lm_status s_req = lm_engine_submit(e, &p, NULL, err, sizeof err);
    CHECKF(s_req == LM_OK, "%s: %s", lm_status_name(s_req), err);
    p.size = 4;
    CHECK(lm_engine_submit(e, &p, NULL, err, sizeof err) == LM_ERR_INVALID);
    lm_engine_wait_idle(e);
    CHECK(c.n_done == 1 && c.n_tok > 0);
    /* an older program's stats: only its bytes are written */
    _Alignas(max_align_t) unsigned char st_raw[sizeof(lm_engine_stats)];
    memset(st_raw, 0xa5, sizeof st_raw);
    size_t st_cut = offsetof(lm_engine_stats, requests_finished) + sizeof(uint64_t);
    lm_engine_stats_get(e, (lm_engine_stats *)(void *)st_raw, st_cut);
    lm_engine_stats whole;
    lm_engine_get_stats(e, &whole);
    untouched = true;
    for (size_t i = st_cut; i < sizeof st_raw; i++) untouched &= st_raw[i] == 0xa5;
    uint64_t finished;
    memcpy(&finished, st_raw + offsetof(lm_engine_stats, requests_finished), sizeof finished);
    CHECK(untouched && finished == 1 && whole.requests_finished == 1);
    lm_engine_free(e);
    /* model info the same way */
    _Alignas(max_align_t) unsigned char info_raw[sizeof(lm_model_info)];
    memset(info_raw, 0xa5, sizeof info_raw);
    size_t info_cut = offsetof(lm_model_info, n_ctx_train);
    lm_model_info_get(model, (lm_model_info *)(void *)info_raw, info_cut);
    int n_vocab;
    memcpy(&n_vocab, info_raw + offsetof(lm_model_info, n_vocab), sizeof n_vocab);
    untouched = true;
    for (size_t i = info_cut; i < sizeof info_raw; i++) untouched &= info_raw[i] == 0xa5;
    CHECK(n_vocab == 512 && untouched);
    /* load parameters: a size of 0 (never filled) is refused, not guessed at */
    lm_load_params lp = {.progress = NULL};
    lm_model *m2 = (lm_model *)1;
    CHECK(lm_model_load(TEST_MODEL, &lp, &m2, err, sizeof err) == LM_ERR_INVALID && m2 == NULL);
    CHECKF(strstr(err, "lm_load_params.size is 0") != NULL, "%s", err);
}

/* Embeddings through the public API: the width, the L2 normalization
 * against a double reference, lm_embed against the embedding requests'
 * own events (the same floats), normalized and truncated (Matryoshka)
 * rows, and its errors. */
static void embed_event(void *user, const lm_event *ev) {
    if (ev->done && ev->embedding) memcpy(user, ev->embedding, (size_t)ev->n_embedding * sizeof(float));
}

static void test_embed_api(void) {
    char err[LM_ERRLEN];
    lm_model_info info;
    lm_model_get_info(model, &info);
    CHECK(info.pooling == LM_POOL_NONE && lm_model_embd_dim(model) == 64 && lm_model_embd_dim(NULL) == 0);
    CHECK(info.causal);
    lm_model_info old; /* a caller built before causal: nothing written past what it knows */
    memset(&old, 0xab, sizeof old);
    lm_model_info_get(model, &old, offsetof(lm_model_info, causal));
    CHECK(old.pooling == LM_POOL_NONE && old.n_embd == 64 && *(unsigned char *)&old.causal == 0xab);
    lm_request_params dp;
    lm_request_params_default(&dp);
    CHECK(!dp.embed && dp.pooling == LM_POOL_DEFAULT);
    float v[5] = {3, 0, -4, 0, 0}, z[3] = {0, 0, 0};
    lm_embd_normalize(v, 5);
    CHECK(fabs(v[0] - 0.6) < 1e-7 && fabs(v[2] + 0.8) < 1e-7 && v[1] == 0);
    lm_embd_normalize(z, 3);
    CHECK(z[0] == 0 && z[1] == 0 && z[2] == 0);
    lm_engine_config cfg;
    lm_engine_config_default(&cfg);
    cfg.n_threads = 1;
    lm_engine *e;
    CHECKF(lm_engine_new(model, &cfg, &e, err, sizeof err) == LM_OK, "%s", err);
    const char *texts[3] = {"Once upon a time", "The little dog ran to the park to play with the ball", "Lily"};
    int32_t ids[3][32];
    const int32_t *tok[3] = {ids[0], ids[1], ids[2]};
    int nt[3];
    for (int i = 0; i < 3; i++) nt[i] = lm_tokenize(mtok, texts[i], strlen(texts[i]), true, false, ids[i], 32);
    static float raw[3][64], one[3][64], nrm[3][64], cut[3][16];
    for (int i = 0; i < 3; i++) { /* each alone through lm_engine_submit */
        lm_request_params p;
        lm_request_params_default(&p);
        p.embed = true;
        p.pooling = LM_POOL_MEAN;
        p.prompt = ids[i];
        p.n_prompt = nt[i];
        p.on_event = embed_event;
        p.user = one[i];
        CHECKF(lm_engine_submit(e, &p, NULL, err, sizeof err) == LM_OK, "%s", err);
    }
    lm_engine_wait_idle(e);
    CHECKF(lm_embed(e, tok, nt, 3, LM_POOL_MEAN, 0, false, &raw[0][0], err, sizeof err) == LM_OK, "%s", err);
    CHECK(!memcmp(raw, one, sizeof raw));
    CHECK(lm_embed(e, tok, nt, 3, LM_POOL_MEAN, 0, true, &nrm[0][0], err, sizeof err) == LM_OK);
    CHECK(lm_embed(e, tok, nt, 3, LM_POOL_MEAN, 16, true, &cut[0][0], err, sizeof err) == LM_OK);
    for (int i = 0; i < 3; i++) {
        double ss = 0, ss16 = 0;
        for (int j = 0; j < 64; j++) ss += (double)raw[i][j] * raw[i][j];
        for (int j = 0; j < 16; j++) ss16 += (double)raw[i][j] * raw[i][j];
        CHECK(ss > 0);
        for (int j = 0; j < 64; j++) CHECKF(fabs(nrm[i][j] - raw[i][j] / sqrt(ss)) < 1e-6, "row %d dim %d", i, j);
        for (int j = 0; j < 16; j++) CHECKF(fabs(cut[i][j] - raw[i][j] / sqrt(ss16)) < 1e-6, "row %d dim %d", i, j);
    }
    /* the inputs differ, and so do their vectors */
    CHECK(memcmp(raw[0], raw[1], sizeof raw[0]) != 0);
    /* errors */
    CHECK(lm_embed(e, tok, nt, 3, LM_POOL_MEAN, 65, true, &raw[0][0], err, sizeof err) == LM_ERR_INVALID);
    CHECK(lm_embed(e, tok, nt, 3, LM_POOL_DEFAULT, 0, true, &raw[0][0], err, sizeof err) == LM_ERR_INVALID);
    CHECKF(strstr(err, "generative") != NULL, "%s", err);
    int bad[3] = {nt[0], 0, nt[2]};
    CHECK(lm_embed(e, tok, bad, 3, LM_POOL_MEAN, 0, true, &raw[0][0], err, sizeof err) == LM_ERR_INVALID);
    CHECK(lm_embed(e, tok, nt, 0, LM_POOL_MEAN, 0, true, NULL, err, sizeof err) == LM_OK);
    CHECK(lm_embed(NULL, tok, nt, 3, LM_POOL_MEAN, 0, true, &raw[0][0], err, sizeof err) == LM_ERR_INVALID);
    lm_engine_stats st;
    lm_engine_get_stats(e, &st);
    CHECK(st.kv_blocks_used == 0 && st.kv_blocks_cached == 0 && st.generation_tokens_total == 0);
    lm_engine_free(e);
}

int main(void) {
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    TEST_RUN(test_names_and_version);
    TEST_RUN(test_load_errors);
    TEST_RUN(test_progress);
    TEST_RUN(test_load_nomem);
    char err[LM_ERRLEN];
    if (lm_model_load(TEST_MODEL, NULL, &model, err, sizeof err) != LM_OK) {
        fprintf(stderr, "cannot load %s: %s\n", TEST_MODEL, err);
        return 1;
    }
    mtok = lm_model_tokenizer(model);
    TEST_RUN(test_model_info);
    TEST_RUN(test_tokenize_roundtrip);
    TEST_RUN(test_vocab_only_tokenizer);
    TEST_RUN(test_vocab_files);
    TEST_RUN(test_chat_render);
    TEST_RUN(test_chat_render_opts);
    TEST_RUN(test_engine_generate);
    TEST_RUN(test_engine_spec);
    TEST_RUN(test_engine_cancel_busy);
    TEST_RUN(test_engine_bad_requests);
    TEST_RUN(test_struct_growth);
    TEST_RUN(test_embed_api);
    lm_model_free(model);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", tmpdir);
    return TEST_DONE();
}
