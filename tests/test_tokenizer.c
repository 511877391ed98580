/*
 * test_tokenizer.c - the tokenizer against reference vectors and by property.
 *
 * Reference vectors: tests/data/vocab/X.gguf with X.gguf.inp (cases separated
 * by "\n__ggml_vocab_test__\n") and X.gguf.out (line i: the ids of case i, no
 * BOS, special tokens not parsed; ggml-vocab-wpm.gguf's were recorded from
 * llama.cpp by make_wpm_vocab.py). They live in the repository: a missing
 * file fails its test (run from the repository root, as tests/run.sh does). The rest builds small GGUF files in
 * memory (hand-assembled bytes) or uses the bundled models/stories260K.gguf.
 */
#include "test.h"

#include <stdint.h>

#include "format/gguf.h"
#include "text/tokenizer.h"
#include "base/util.h"

#define VOCAB_DIR "tests/data/vocab/"

/* Time limits are loose (a quadratic blow-up on 100 KB takes many seconds)
 * and looser still under the sanitizers (make asan sets LAMINA_ASAN) and
 * under instruction-set emulation (make test-arm sets LAMINA_EMULATED). */
static double time_limit(double s) { return getenv("LAMINA_EMULATED") ? 20 * s : getenv("LAMINA_ASAN") ? 5 * s : s; }

/* ---- helpers --------------------------------------------------------------- */

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) buf[n] = 0;
    *len = n;
    return buf;
}

/* Load a tokenizer and close the GGUF right away (the tokenizer must not
 * keep pointers into it). */
static lm_tokenizer *load_path(const char *path) {
    char err[LM_ERRLEN];
    gguf_ctx *g = gguf_open(path, err, sizeof err);
    if (!g) {
        fprintf(stderr, "  %s: %s\n", path, err);
        return NULL;
    }
    lm_tokenizer *t = tok_load(g, err, sizeof err);
    if (!t) fprintf(stderr, "  %s: %s\n", path, err);
    gguf_close(g);
    return t;
}

/* Encode into a fresh array; *n gets the count (-1 on error). */
static int32_t *encode(const lm_tokenizer *t, const char *s, size_t len, bool bos, bool special, int *n) {
    int cap = (int)len + 8;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    *n = tok_encode(t, s, len, bos, special, ids, cap);
    return ids;
}

/* Stream ids through the detokenizer; returns a malloc'd string. */
static char *decode(const lm_tokenizer *t, const int32_t *ids, int n, bool strip, bool special, size_t *len) {
    int step = detok_max_out(t);
    if (step < 256) step = 256;
    char *out = malloc((size_t)(n + 1) * (size_t)step + 4);
    size_t m = 0;
    lm_detok d;
    detok_init(&d, t, strip, special);
    for (int i = 0; i < n; i++) {
        int k = detok_push(&d, ids[i], out + m, step);
        if (k < 0) {
            free(out);
            return NULL;
        }
        m += (size_t)k;
    }
    m += (size_t)detok_flush(&d, out + m, 4);
    out[m] = 0;
    *len = m;
    return out;
}

typedef struct {
    char *inp, *outf;
    size_t n_inp, n_out;
    const char *cs[128]; /* case starts */
    size_t cl[128];      /* case lengths */
    int ncase;
    const char *line[128];
    int nline;
} vectors;

static bool vectors_load(vectors *v, const char *name) {
    char p[256];
    memset(v, 0, sizeof *v);
    snprintf(p, sizeof p, VOCAB_DIR "%s.inp", name);
    v->inp = read_all(p, &v->n_inp);
    snprintf(p, sizeof p, VOCAB_DIR "%s.out", name);
    v->outf = read_all(p, &v->n_out);
    if (!v->inp || !v->outf) return false;
    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sl = sizeof sep - 1;
    const char *s = v->inp, *end = v->inp + v->n_inp;
    while (s < end && v->ncase < 128) { /* every case is followed by a separator */
        const char *q = memmem(s, (size_t)(end - s), sep, sl);
        if (!q) break;
        v->cs[v->ncase] = s;
        v->cl[v->ncase++] = (size_t)(q - s);
        s = q + sl;
    }
    char *l = v->outf;
    while (*l && v->nline < 128) {
        v->line[v->nline++] = l;
        char *nl = strchr(l, '\n');
        if (!nl) break;
        *nl = 0;
        l = nl + 1;
    }
    return true;
}

static void vectors_free(vectors *v) {
    free(v->inp);
    free(v->outf);
}

static void check_vectors(const char *name) {
    char p[256];
    snprintf(p, sizeof p, VOCAB_DIR "%s", name);
    lm_tokenizer *t = load_path(p);
    CHECK(t != NULL);
    vectors v;
    bool ok = vectors_load(&v, name);
    if (!ok) {
        vectors_free(&v);
        tok_free(t);
    }
    CHECK(ok);
    int bad = 0;
    CHECKF(v.ncase == v.nline && v.ncase > 40, "%d cases, %d expected lines", v.ncase, v.nline);
    for (int c = 0; c < v.ncase; c++) {
        int n;
        int32_t *ids = encode(t, v.cs[c], v.cl[c], false, false, &n);
        int32_t want[1024];
        int nw = 0;
        for (char *q = (char *)v.line[c], *e; nw < 1024; q = e) {
            long x = strtol(q, &e, 10);
            if (e == q) break;
            want[nw++] = (int32_t)x;
        }
        bool same = n == nw && (n == 0 || memcmp(ids, want, (size_t)n * sizeof *ids) == 0);
        if (!same && bad++ < 3) {
            fprintf(stderr, "  %s case %d (%.*s): got", name, c, (int)(v.cl[c] > 40 ? 40 : v.cl[c]), v.cs[c]);
            for (int i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n    want%s\n", v.line[c]);
        }
        free(ids);
    }
    int ncase = v.ncase;
    vectors_free(&v);
    tok_free(t);
    CHECKF(bad == 0, "%d of %d cases differ", bad, ncase);
}

/* decode(encode(x)) == x for every vector case, streamed token by token. */
static void check_roundtrip(const char *name) {
    char p[256];
    snprintf(p, sizeof p, VOCAB_DIR "%s", name);
    lm_tokenizer *t = load_path(p);
    CHECK(t != NULL);
    vectors v;
    bool ok = vectors_load(&v, name);
    int bad = 0;
    for (int c = 0; ok && c < v.ncase; c++) {
        int n;
        int32_t *ids = encode(t, v.cs[c], v.cl[c], true, false, &n);
        size_t m = 0;
        char *s = n >= 0 ? decode(t, ids, n, true, false, &m) : NULL;
        if (!s || m != v.cl[c] || memcmp(s, v.cs[c], m) != 0) {
            if (bad++ < 3) fprintf(stderr, "  %s case %d: decoded '%s'\n", name, c, s ? s : "(null)");
        }
        free(s);
        free(ids);
    }
    vectors_free(&v);
    tok_free(t);
    CHECK(ok);
    CHECKF(bad == 0, "%d cases do not round-trip", bad);
}

static void test_vectors_llama_spm(void) { check_vectors("ggml-vocab-llama-spm.gguf"); }
static void test_vectors_wpm(void) { check_vectors("ggml-vocab-wpm.gguf"); }

/* WordPiece beyond the vectors: the BOS is [CLS] and brings [SEP] after the
 * text (an empty text too); the ids come from the vocabulary's own texts
 * (a word's first piece "\u2581x", a continuation bare); a word with a
 * character no token starts with is one [UNK]; decoding puts a space before
 * each word and none inside one, and strip_space drops the first. */
static void test_wpm_specials(void) {
    lm_tokenizer *t = load_path(VOCAB_DIR "ggml-vocab-wpm.gguf");
    CHECK(t != NULL);
    CHECK(!strcmp(tok_model_name(t), "bert"));
    int32_t cls = tok_find(t, "[CLS]", 5), sep = tok_find(t, "[SEP]", 5), unk = tok_find(t, "[UNK]", 5);
    CHECK(cls >= 0 && sep >= 0 && unk >= 0 && tok_bos(t) == cls && tok_sep(t) == sep && tok_add_bos(t));
    int32_t jump = tok_find(t,
                            "\xE2\x96\x81"
                            "jump",
                            7),
            ing = tok_find(t, "ing", 3);
    int32_t fox = tok_find(t,
                           "\xE2\x96\x81"
                           "fox",
                           6),
            bang = tok_find(t,
                            "\xE2\x96\x81"
                            "!",
                            4);
    CHECK(jump >= 0 && ing >= 0 && fox >= 0 && bang >= 0);
    int32_t want[6] = {cls, jump, ing, fox, bang, sep};
    int32_t got[8];
    CHECK(tok_encode(t, "Jumping FOX!", 12, true, false, got, 8) == 6 && !memcmp(got, want, sizeof want));
    CHECK(tok_encode(t, "Jumping FOX!", 12, false, false, got, 8) == 4 && !memcmp(got, want + 1, 4 * sizeof *got));
    CHECK(tok_encode(t, "", 0, true, false, got, 8) == 2 && got[0] == cls && got[1] == sep);
    CHECK(tok_encode(t,
                     "fox \xF0\x9F\x98\x80"
                     "x",
                     9, false, false, got, 8) == 2 &&
          got[0] == fox && got[1] == unk);
    size_t len;
    char *s = decode(t, want + 1, 4, true, false, &len);
    CHECKF(s && !strcmp(s, "jumping fox !"), "decoded '%s'", s ? s : "(null)");
    free(s);
    tok_free(t);
}
static void test_vectors_harmony(void) { check_vectors("ggml-vocab-harmony.gguf"); }
static void test_roundtrip_harmony(void) { check_roundtrip("ggml-vocab-harmony.gguf"); }

/* Reads "KEY N a b c ..." (N ids) or "KEY a b c" (to the end of the line)
 * from facts into ids; returns the count, -1 when the key is missing. */
static int fact_ids(const char *facts, const char *key, bool counted, int32_t *ids, int cap) {
    size_t kl = strlen(key);
    for (const char *l = facts; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
        if (strncmp(l, key, kl) || l[kl] != ' ') continue;
        char *q = (char *)l + kl, *e;
        long want = counted ? strtol(q, &q, 10) : -1;
        int n = 0;
        for (long x; n < cap && (x = strtol(q, &e, 10), e != q) && *q != '\n'; q = e) ids[n++] = (int32_t)x;
        return counted && n != want ? -1 : n;
    }
    return -1;
}

/* The o200k_harmony stand-in (make_harmony_vocab.py) against what llama.cpp
 * makes of it (vocab_facts.cpp -> .facts): the special ids, end of
 * generation on <|return|>, <|call|> and <|endoftext|> but not <|end|>, the
 * framing tokens user-defined (matched without parse_special, shown when
 * decoding), and a rendered gpt-oss conversation's ids both ways. */
static void test_harmony_facts(void) {
    lm_tokenizer *t = load_path(VOCAB_DIR "ggml-vocab-harmony.gguf");
    size_t plen = 0, flen = 0;
    char *facts = read_all(VOCAB_DIR "ggml-vocab-harmony.gguf.facts", &flen);
    char *prompt = read_all(VOCAB_DIR "ggml-vocab-harmony.gguf.prompt", &plen);
    CHECK(t && facts && prompt);
    int32_t v[8], eog[16], user[16], want[4096];
    CHECK(fact_ids(facts, "n_vocab", false, v, 1) == 1 && tok_n_vocab(t) == v[0]);
    CHECK(fact_ids(facts, "bos", false, v, 1) == 1 && tok_bos(t) == v[0]);
    CHECK(fact_ids(facts, "eos", false, v, 1) == 1 && tok_eos(t) == v[0]);
    CHECK(fact_ids(facts, "eot", false, v, 1) == 1 && tok_eot(t) == v[0]);
    CHECK(!tok_add_bos(t) && !strcmp(tok_model_name(t), "gpt2"));
    int ne = fact_ids(facts, "eog", false, eog, 16), nu = fact_ids(facts, "user", false, user, 16);
    CHECKF(ne == 3 && nu == 5, "%d eog, %d user", ne, nu);
    for (int32_t id = 0, k = 0; id < tok_n_vocab(t); id++) {
        bool is = k < ne && eog[k] == id;
        k += is;
        CHECKF(tok_is_eog(t, id) == is, "token %d: end of generation %d, llama.cpp %d", id, tok_is_eog(t, id), is);
    }
    CHECK(tok_is_eog(t, tok_find(t, "<|return|>", 10)) && tok_is_eog(t, tok_find(t, "<|call|>", 8)) &&
          !tok_is_eog(t, tok_find(t, "<|end|>", 7)));
    for (int k = 0; k < nu; k++) { /* user-defined: not control, shown without special */
        char b[32];
        size_t pl;
        const char *piece = tok_piece(t, user[k], &pl);
        int n = tok_token_bytes(t, user[k], false, b, sizeof b);
        CHECKF(!tok_is_control(t, user[k]) && n == (int)pl && !memcmp(b, piece, pl), "token %d", user[k]);
    }
    for (int special = 1; special >= 0; special--) {
        int nw = fact_ids(facts, special ? "ids" : "ids_noparse", true, want, 4096), n;
        int32_t *ids = encode(t, prompt, plen, false, special, &n);
        bool same = nw > 0 && n == nw && !memcmp(ids, want, (size_t)n * sizeof *ids);
        CHECKF(same, "parse_special %d: %d ids, llama.cpp %d", special, n, nw);
        if (special) { /* decoded without special tokens: what llama.cpp shows */
            const char *d = strstr(facts, "\ndetok ");
            long dl = d ? strtol(d + 7, NULL, 10) : -1;
            const char *dt = d ? strchr(d + 1, '\n') + 1 : NULL;
            size_t m;
            char *out = decode(t, ids, n, false, false, &m);
            CHECKF(dt && out && (long)m == dl && !memcmp(out, dt, m), "decoded: %s", out ? out : "(null)");
            CHECK(out && !strstr(out, "<|call|>") && strstr(out, "<|start|>assistant<|channel|>final<|message|>"));
            free(out);
        }
        free(ids);
    }
    free(facts);
    free(prompt);
    tok_free(t);
}
static void test_vectors_phi3(void) { check_vectors("ggml-vocab-phi-3.gguf"); }
static void test_vectors_gpt2(void) { check_vectors("ggml-vocab-gpt-2.gguf"); }
static void test_roundtrip_llama_spm(void) { check_roundtrip("ggml-vocab-llama-spm.gguf"); }
static void test_roundtrip_phi3(void) { check_roundtrip("ggml-vocab-phi-3.gguf"); }
static void test_roundtrip_gpt2(void) { check_roundtrip("ggml-vocab-gpt-2.gguf"); }

/* ---- special tokens on the real vocabs ------------------------------------ */

static bool has_id(const int32_t *ids, int n, int32_t id) {
    for (int i = 0; i < n; i++)
        if (ids[i] == id) return true;
    return false;
}

static void test_parse_special(void) {
    lm_tokenizer *spm = load_path(VOCAB_DIR "ggml-vocab-llama-spm.gguf");
    lm_tokenizer *gpt = load_path(VOCAB_DIR "ggml-vocab-gpt-2.gguf");
    lm_tokenizer *phi = load_path(VOCAB_DIR "ggml-vocab-phi-3.gguf");
    CHECK(spm && gpt && phi);
    int n;
    const char *s1 = "<s>Hi there</s>";
    /* the text after a special token gets its own space prefix: <s> ▁Hi ▁there </s> */
    int nb;
    int32_t *a = encode(spm, s1, strlen(s1), false, true, &n);
    int32_t *b = encode(spm, "Hi there", 8, false, false, &nb);
    bool ok = nb >= 2 && n == nb + 2 && a[0] == 1 && a[n - 1] == 2 && memcmp(a + 1, b, (size_t)nb * sizeof *b) == 0;
    free(a);
    free(b);
    CHECK(ok);
    a = encode(spm, s1, strlen(s1), false, false, &n);
    ok = n > 4 && !has_id(a, n, 1) && !has_id(a, n, 2);
    free(a);
    CHECK(ok);

    const char *s2 = "a<|endoftext|>b";
    a = encode(gpt, s2, strlen(s2), false, true, &n);
    ok = n == 3 && a[1] == 50256 && tok_is_control(gpt, 50256);
    free(a);
    CHECK(ok);
    a = encode(gpt, s2, strlen(s2), false, false, &n);
    ok = n > 3 && !has_id(a, n, 50256);
    free(a);
    CHECK(ok);

    const char *s3 = "<|user|>\nHi<|end|>\n<|assistant|>";
    a = encode(phi, s3, strlen(s3), false, true, &n);
    ok = n >= 5 && a[0] == 32010 && has_id(a, n, 32007) && a[n - 1] == 32001;
    free(a);
    CHECK(ok);
    a = encode(phi, s3, strlen(s3), false, false, &n);
    ok = n > 5;
    for (int i = 0; i < n; i++) ok = ok && a[i] < 32000;
    free(a);
    CHECK(ok);
    /* user-defined tokens match whatever parse_special says, except those
     * whose text is an end-of-generation marker ("</s>" in this vocab), which
     * count as control tokens, as llama.cpp treats them (Gemma 3's reference
     * ids in tests/data/gemma3 show both rules) */
    a = encode(phi, "a</s>b", 6, false, false, &n);
    ok = !has_id(a, n, 2) && tok_find(phi, "</s>", 4) == 2;
    free(a);
    CHECK(ok);
    a = encode(phi, "a</s>b", 6, false, true, &n);
    ok = has_id(a, n, 2) && tok_is_eog(phi, 2);
    free(a);
    CHECK(ok);

    char buf[64];
    CHECK(tok_token_bytes(gpt, 50256, false, buf, sizeof buf) == 0);
    CHECK(tok_token_bytes(gpt, 50256, true, buf, sizeof buf) == 13 && memcmp(buf, "<|endoftext|>", 13) == 0);
    CHECK(tok_is_eog(phi, 32007) && tok_is_eog(phi, 32000) && tok_eos(phi) == 32000);
    CHECK(tok_eot(phi) == 32007 && !tok_is_eog(phi, 32010));
    CHECK(tok_is_eog(gpt, 50256) && tok_bos(gpt) == 50256 && !tok_add_bos(gpt));
    CHECK(strcmp(tok_model_name(gpt), "gpt2") == 0 && strcmp(tok_model_name(spm), "llama") == 0);
    tok_free(spm);
    tok_free(gpt);
    tok_free(phi);
}

/* The cap contract: the total count comes back, only cap ids are written. */
static void test_encode_cap(void) {
    lm_tokenizer *t = load_path(VOCAB_DIR "ggml-vocab-gpt-2.gguf");
    CHECK(t);
    const char *s = "Hello world, this is a test of the cap.";
    int32_t full[64], part[4] = {-7, -7, -7, -7};
    int n = tok_encode(t, s, strlen(s), false, false, full, 64);
    int m = tok_encode(t, s, strlen(s), false, false, part, 3);
    int z = tok_encode(t, s, strlen(s), false, false, NULL, 0);
    tok_free(t);
    CHECK(n > 3 && m == n && z == n);
    CHECK(memcmp(full, part, 3 * sizeof *part) == 0 && part[3] == -7);
}

/* Encoding several KB takes milliseconds; long runs stay near-linear. */
static void test_performance(void) {
    lm_tokenizer *spm = load_path(VOCAB_DIR "ggml-vocab-llama-spm.gguf");
    lm_tokenizer *gpt = load_path(VOCAB_DIR "ggml-vocab-gpt-2.gguf");
    size_t len;
    char *inp = read_all(VOCAB_DIR "ggml-vocab-gpt-2.gguf.inp", &len);
    CHECK(spm && gpt && inp);
    size_t big = 8 * len; /* ~16 KB of mixed text */
    char *text = malloc(big);
    for (size_t i = 0; i < 8; i++) memcpy(text + i * len, inp, len);
    const size_t runlen = 100000;
    char *run = malloc(runlen);
    double worst = 0;
    const char *what = "";
    for (int k = 0; k < 2; k++) {
        lm_tokenizer *t = k ? gpt : spm;
        int n;
        double t0 = lm_now();
        int32_t *ids = encode(t, text, big, false, false, &n);
        double dt = lm_now() - t0;
        free(ids);
        if (dt > worst) worst = dt, what = "16 KB text";
        CHECK(n > 1000);
        const char fill[] = {' ', 'a', '7', '\n', '!'};
        for (int f = 0; f < 5; f++) {
            memset(run, fill[f], runlen);
            t0 = lm_now();
            ids = encode(t, run, runlen, false, false, &n);
            dt = lm_now() - t0;
            free(ids);
            CHECK(n > 0);
            if (dt > worst) worst = dt, what = "100 KB run";
        }
    }
    printf("  tokenizer: slowest encode %.1f ms (%s)\n", worst * 1e3, what);
    free(run);
    free(text);
    free(inp);
    tok_free(spm);
    tok_free(gpt);
    CHECKF(worst < time_limit(1.0), "an encode took %.3f s", worst);
}

/* ---- stories260K ----------------------------------------------------------- */

static void test_stories(void) {
    lm_tokenizer *t = load_path(TEST_MODEL);
    CHECK(t);
    bool ok = tok_n_vocab(t) == 512 && tok_bos(t) == 1 && tok_eos(t) == 2 && tok_add_bos(t) && tok_is_eog(t, 2) &&
        !tok_is_eog(t, 1) && tok_is_control(t, 1) && !tok_is_control(t, 100);
    const char *texts[] = {"Once upon a time, there was a little girl named Lily.",
                           "She liked to play outside.\nThe sun was bright!",
                           "  two leading spaces and trailing  ",
                           "Zo\xC3\xAB ate 3 pies \xF0\x9F\x99\x82 \xE6\x97\xA5\xE6\x9C\xAC",
                           "x",
                           ""};
    for (size_t i = 0; ok && i < sizeof texts / sizeof texts[0]; i++) {
        int n;
        size_t m;
        int32_t *ids = encode(t, texts[i], strlen(texts[i]), true, false, &n);
        ok = n >= 1 && ids[0] == 1;
        for (int k = 0; ok && k < n; k++) ok = ids[k] >= 0 && ids[k] < 512;
        char *s = ok ? decode(t, ids, n, true, false, &m) : NULL;
        if (!s || strcmp(s, texts[i]) != 0) {
            fprintf(stderr, "  stories round trip of '%s' gave '%s'\n", texts[i], s ? s : "(null)");
            ok = false;
        }
        free(s);
        free(ids);
    }
    /* an ordinary word encodes to real pieces, not byte tokens */
    int n;
    int32_t *ids = encode(t, "Once upon a time", 16, false, false, &n);
    for (int k = 0; ok && k < n; k++) ok = ids[k] >= 259;
    size_t pl;
    const char *pc = tok_piece(t, ids[0], &pl);
    ok = ok && n >= 2 && n <= 8 && pc && pl >= 3 && memcmp(pc, "\xE2\x96\x81", 3) == 0;
    free(ids);
    tok_free(t);
    CHECK(ok);
}

/* ---- streaming UTF-8 ------------------------------------------------------- */

static int push_byte(lm_detok *d, const lm_tokenizer *t, int b, char *out) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    int32_t id = tok_find(t, name, 6);
    return id < 0 ? -100 : detok_push(d, id, out, 256);
}

static void test_utf8_streaming(void) {
    lm_tokenizer *t = load_path(TEST_MODEL);
    CHECK(t);
    char out[256];
    lm_detok d;
    /* EURO SIGN split over three byte tokens: nothing until the last byte */
    detok_init(&d, t, false, false);
    int a = push_byte(&d, t, 0xE2, out), b = push_byte(&d, t, 0x82, out), c = push_byte(&d, t, 0xAC, out);
    bool ok = a == 0 && b == 0 && c == 3 && memcmp(out, "\xE2\x82\xAC", 3) == 0;
    CHECK(ok);
    CHECK(detok_flush(&d, out, sizeof out) == 0);
    /* a 4-byte emoji, then an ordinary token: the emoji comes out whole first */
    detok_init(&d, t, false, false);
    ok = push_byte(&d, t, 0xF0, out) == 0 && push_byte(&d, t, 0x9F, out) == 0 && push_byte(&d, t, 0x99, out) == 0 &&
        push_byte(&d, t, 0x82, out) == 4 && memcmp(out, "\xF0\x9F\x99\x82", 4) == 0;
    CHECK(ok);
    /* a non-continuation byte ends a pending sequence: U+FFFD, then the byte */
    detok_init(&d, t, false, false);
    ok = push_byte(&d, t, 0xE2, out) == 0 && push_byte(&d, t, 0x41, out) == 4 &&
        memcmp(out,
               "\xEF\xBF\xBD"
               "A",
               4) == 0;
    CHECK(ok);
    /* an incomplete sequence at the end becomes U+FFFD at flush */
    detok_init(&d, t, false, false);
    ok = push_byte(&d, t, 0xF0, out) == 0 && push_byte(&d, t, 0x9F, out) == 0 &&
        detok_flush(&d, out, sizeof out) == 3 && memcmp(out, "\xEF\xBF\xBD", 3) == 0 &&
        detok_flush(&d, out, sizeof out) == 0;
    CHECK(ok);
    /* impossible bytes: a lone continuation, C0, and E0 80 (overlong) */
    detok_init(&d, t, false, false);
    ok = push_byte(&d, t, 0x80, out) == 3 && push_byte(&d, t, 0xC0, out) == 3 && push_byte(&d, t, 0xE0, out) == 0 &&
        push_byte(&d, t, 0x80, out) == 6 && memcmp(out, "\xEF\xBF\xBD\xEF\xBF\xBD", 6) == 0;
    CHECK(ok);
    /* strip_space drops the SPM prefix of the first token only */
    int n;
    int32_t *ids = encode(t, "Hi Hi", 5, true, false, &n);
    size_t m;
    char *s1 = decode(t, ids, n, true, false, &m);
    char *s2 = decode(t, ids, n, false, false, &m);
    ok = s1 && s2 && strcmp(s1, "Hi Hi") == 0 && strcmp(s2, " Hi Hi") == 0;
    free(s1);
    free(s2);
    /* a cap too small is refused and leaves the state alone */
    char piece[64];
    int np = tok_token_bytes(t, ids[1], false, piece, sizeof piece); /* " H..." */
    detok_init(&d, t, true, false);
    int r1 = detok_push(&d, ids[1], out, np - 2);
    int r2 = detok_push(&d, ids[1], out, 256);
    ok = ok && np >= 2 && piece[0] == ' ' && r1 == -1 && r2 == np - 1 && memcmp(out, piece + 1, (size_t)r2) == 0;
    free(ids);
    /* control tokens print only when asked */
    ok = ok && tok_token_bytes(t, 1, false, out, 256) == 0 && tok_token_bytes(t, 1, true, out, 256) == 3;
    tok_free(t);
    CHECK(ok);
}

/* ---- GGUF files built in memory --------------------------------------------- */

typedef struct {
    unsigned char *p;
    size_t n, cap;
    int nkv;
} gb;

static void gb_put(gb *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void gb_u32(gb *b, uint32_t v) { gb_put(b, &v, 4); }
static void gb_u64(gb *b, uint64_t v) { gb_put(b, &v, 8); }
static void gb_strn(gb *b, const char *s, size_t n) {
    gb_u64(b, n);
    gb_put(b, s, n);
}
static void gb_key(gb *b, const char *k, uint32_t type) {
    gb_strn(b, k, strlen(k));
    gb_u32(b, type);
    b->nkv++;
}
static void kv_str(gb *b, const char *k, const char *v) {
    gb_key(b, k, GGUF_STRING);
    gb_strn(b, v, strlen(v));
}
static void kv_u32(gb *b, const char *k, uint32_t v) {
    gb_key(b, k, GGUF_UINT32);
    gb_u32(b, v);
}
static void kv_arr_str(gb *b, const char *k, char **s, uint64_t n) {
    gb_key(b, k, GGUF_ARRAY);
    gb_u32(b, GGUF_STRING);
    gb_u64(b, n);
    for (uint64_t i = 0; i < n; i++) gb_strn(b, s[i], strlen(s[i]));
}
static void kv_arr_num(gb *b, const char *k, uint32_t type, const void *d, uint64_t n) {
    gb_key(b, k, GGUF_ARRAY);
    gb_u32(b, type);
    gb_u64(b, n);
    gb_put(b, d, n * 4);
}

/* Header + kvs into one buffer (caller frees). */
static unsigned char *gb_finish(gb *kvs, size_t *size) {
    gb f = {0};
    gb_put(&f, "GGUF", 4);
    gb_u32(&f, 3);
    gb_u64(&f, 0);
    gb_u64(&f, (uint64_t)kvs->nkv);
    gb_put(&f, kvs->p, kvs->n);
    free(kvs->p);
    *size = f.n;
    return f.p;
}

/* What to put in a synthetic vocab. */
typedef struct {
    const char *model; /* NULL: leave the key out */
    const char *pre;   /* NULL: leave the key out */
    int n_tokens;      /* -1: no tokens array */
    int n_scores;      /* -1: no scores */
    int n_types;       /* -1: no token_type */
    int bad_type;      /* put this value into token_type[5] when non-zero */
    int64_t bos;       /* -2: no key */
    bool merges;
} spec;

/* A byte-level vocab: the 256 GPT-2 byte stand-ins in byte order, then
 * "<s>", then the joined tokens of a few merges. Returns the GGUF bytes. */
static unsigned char *build_file(const spec *sp, size_t *size) {
    char *toks[300];
    int nt = 0;
    unsigned next = 256;
    for (int b = 0; b < 256; b++) {
        bool pr = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        unsigned cp = pr ? (unsigned)b : next++;
        char *s = malloc(4);
        if (cp < 0x80) s[0] = (char)cp, s[1] = 0;
        else s[0] = (char)(0xC0 | (cp >> 6)), s[1] = (char)(0x80 | (cp & 0x3F)), s[2] = 0;
        toks[nt++] = s;
    }
    const char *extra[] = {"<s>", "12", "123", "ab", "abc"};
    for (int i = 0; i < 5; i++) toks[nt++] = strdup(extra[i]);
    char *merges[] = {"1 2", "12 3", "a b", "ab c"};
    gb kv = {0};
    if (sp->model) kv_str(&kv, "tokenizer.ggml.model", sp->model);
    if (sp->pre) kv_str(&kv, "tokenizer.ggml.pre", sp->pre);
    if (sp->n_tokens >= 0) kv_arr_str(&kv, "tokenizer.ggml.tokens", toks, (uint64_t)(sp->n_tokens ? sp->n_tokens : nt));
    float sc[300] = {0};
    int32_t ty[300];
    for (int i = 0; i < 300; i++) ty[i] = 1;
    ty[256] = 3;
    if (sp->bad_type) ty[5] = sp->bad_type;
    if (sp->n_scores >= 0)
        kv_arr_num(&kv, "tokenizer.ggml.scores", GGUF_FLOAT32, sc, (uint64_t)(sp->n_scores ? sp->n_scores : nt));
    if (sp->n_types >= 0)
        kv_arr_num(&kv, "tokenizer.ggml.token_type", GGUF_INT32, ty, (uint64_t)(sp->n_types ? sp->n_types : nt));
    if (sp->merges) kv_arr_str(&kv, "tokenizer.ggml.merges", merges, 4);
    if (sp->bos != -2) kv_u32(&kv, "tokenizer.ggml.bos_token_id", (uint32_t)sp->bos);
    for (int i = 0; i < nt; i++) free(toks[i]);
    return gb_finish(&kv, size);
}

static lm_tokenizer *build(const spec *sp, char *err, size_t errlen) {
    size_t size;
    unsigned char *file = build_file(sp, &size);
    gguf_ctx *g = gguf_open_mem(file, size, err, errlen);
    lm_tokenizer *t = g ? tok_load(g, err, errlen) : NULL;
    if (g) gguf_close(g);
    free(file);
    return t;
}

static spec good_bpe(const char *pre) {
    spec s = {"gpt2", pre, 0, -1, 0, 0, 256, true};
    return s;
}

/* Pieces of text under a pre-tokenizer, joined with '|'. */
static void pieces(const lm_tokenizer *t, const char *text, char *out, size_t cap) {
    size_t st[256];
    size_t len = strlen(text);
    int n = tok_pretokenize(t, text, len, st, 256);
    size_t m = 0;
    for (int i = 0; i < n && m + 2 < cap; i++) {
        size_t e = i + 1 < n ? st[i + 1] : len;
        if (i) out[m++] = '|';
        for (size_t k = st[i]; k < e && m + 1 < cap; k++) out[m++] = text[k];
    }
    out[m] = 0;
}

#define CHECK_SPLIT(t, text, want)                                                                                     \
    do {                                                                                                               \
        char got_[512];                                                                                                \
        pieces(t, text, got_, sizeof got_);                                                                            \
        CHECKF(strcmp(got_, want) == 0, "split of \"%s\": got \"%s\", want \"%s\"", text, got_, want);                 \
    } while (0)

static void test_pretok_llama3(void) {
    char err[LM_ERRLEN] = "";
    spec s = good_bpe("llama-bpe");
    lm_tokenizer *t = build(&s, err, sizeof err);
    CHECKF(t, "%s", err);
    lm_tokenizer *keep = t;
    CHECK_SPLIT(t, "1234567 89", "123|456|7| |89");
    CHECK_SPLIT(t, "Hello world's end", "Hello| world|'s| end");
    CHECK_SPLIT(t, "I'LL DO IT'S", "I|'LL| DO| IT|'S");
    CHECK_SPLIT(t, "a  b\n\nc", "a| | b|\n\n|c");
    CHECK_SPLIT(t, "x!!\n  y", "x|!!\n| | y");
    CHECK_SPLIT(t,
                "\xC3\xA9t\xC3\xA9 \xE2\x82\xAC"
                "5",
                "\xC3\xA9t\xC3\xA9| \xE2\x82\xAC|5");
    CHECK(tok_add_bos(keep)); /* the llama3 family's default */
    tok_free(keep);
}

static void test_pretok_qwen2(void) {
    char err[LM_ERRLEN] = "";
    spec s = good_bpe("qwen2");
    lm_tokenizer *t = build(&s, err, sizeof err);
    CHECKF(t, "%s", err);
    lm_tokenizer *keep = t;
    CHECK_SPLIT(t, "1234 x", "1|2|3|4| x");
    CHECK_SPLIT(t, "He'S here", "He|'S| here");
    CHECK_SPLIT(t, "a\tb", "a|\tb");
    tok_free(keep);
}

static void test_pretok_gpt2_and_others(void) {
    char err[LM_ERRLEN] = "";
    spec s = good_bpe("gpt-2");
    lm_tokenizer *t = build(&s, err, sizeof err);
    CHECKF(t, "%s", err);
    lm_tokenizer *keep = t;
    CHECK_SPLIT(t, "I'LL 1234 it's", "I|'|LL| 1234| it|'s");
    CHECK_SPLIT(t, "a   b", "a|  | b");
    tok_free(keep);
    s = good_bpe("deepseek-coder");
    t = build(&s, err, sizeof err);
    CHECKF(t, "%s", err);
    keep = t;
    CHECK_SPLIT(t, "ab12 cd\n", "ab|1|2| cd|\n");
    tok_free(keep);
    s = good_bpe("falcon");
    t = build(&s, err, sizeof err);
    CHECKF(t, "%s", err);
    keep = t;
    CHECK_SPLIT(t, "x=1234567", "x|=|123|456|7");
    tok_free(keep);
    /* SmolLM2's "smollm": every digit alone, then the GPT-2 pattern
     * (llama.cpp's split; its ids on the real vocabulary: e2e_smollm2.py) */
    s = good_bpe("smollm");
    t = build(&s, err, sizeof err);
    CHECKF(t, "%s", err);
    keep = t;
    CHECK_SPLIT(t, "x=1234 it's  ok!\n", "x|=|1|2|3|4| it|'s| | ok|!|\n");
    tok_free(keep);
    /* every supported name compiles; an unknown one is refused by name */
    const char *names[] = {"default",      "gpt-2",          "llama3",      "llama-bpe",   "smaug-bpe", "qwen2",
                           "deepseek-llm", "deepseek-coder", "deepseek-v3", "falcon",      "starcoder", "refact",
                           "mpt",          "olmo",           "command-r",   "bloom",       "viking",    "tekken",
                           "gpt-4o",       "seed-coder",     "bailingmoe",  "chatglm-bpe", "dbrx",      "stablelm2",
                           "smollm"};
    /* long runs of one class stress backtracking (and the JIT stack) */
    const size_t runlen = 60000;
    char *run = malloc(4 * runlen);
    memset(run, ' ', runlen);
    memset(run + runlen, 'a', runlen);
    memset(run + 2 * runlen, '7', runlen);
    for (size_t i = 3 * runlen; i < 4 * runlen; i++) run[i] = " \n"[i & 1];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        s = good_bpe(names[i]);
        t = build(&s, err, sizeof err);
        if (!t) free(run);
        CHECKF(t, "pre '%s': %s", names[i], err);
        int n = tok_pretokenize(t, "Hello, world 123!\n", 18, NULL, 0);
        double t0 = lm_now();
        int nr = tok_encode(t, run, 4 * runlen, false, false, NULL, 0);
        double dt = lm_now() - t0;
        tok_free(t);
        bool fast = dt < time_limit(2.0);
        if (n < 3 || nr < 4 || !fast) free(run);
        CHECKF(n >= 3, "pre '%s' gave %d pieces", names[i], n);
        CHECKF(nr >= 4 && fast, "pre '%s': long runs gave %d ids in %.3f s", names[i], nr, dt);
    }
    free(run);
    s = good_bpe("no-such-pre");
    t = build(&s, err, sizeof err);
    CHECK(t == NULL && strstr(err, "no-such-pre"));
    s = good_bpe(NULL); /* a missing pre falls back to the GPT-2 pattern */
    t = build(&s, err, sizeof err);
    CHECKF(t, "%s", err);
    keep = t;
    CHECK_SPLIT(t, "I'LL 1234", "I|'|LL| 1234");
    tok_free(keep);
}

/* BPE merges by rank on the synthetic vocab; cut by the pre-tokenizer. */
static void test_bpe_merges(void) {
    char err[LM_ERRLEN] = "";
    spec s = good_bpe("llama3");
    lm_tokenizer *t = build(&s, err, sizeof err);
    CHECKF(t, "%s", err);
    int32_t ids[16];
    int n = tok_encode(t, "abc1234", 7, false, false, ids, 16);
    /* "abc" | "123" | "4": merges a+b, ab+c, 1+2, 12+3 */
    bool ok =
        n == 3 && ids[0] == tok_find(t, "abc", 3) && ids[1] == tok_find(t, "123", 3) && ids[2] == tok_find(t, "4", 1);
    n = tok_encode(t, "abc", 3, true, false, ids, 16);
    ok = ok && n == 2 && ids[0] == 256;
    char buf[8];
    ok = ok && tok_token_bytes(t, tok_find(t, "\xC4\xA0", 2), false, buf, 8) == 1 && buf[0] == ' ';
    tok_free(t);
    CHECK(ok);
}

static void expect_fail(const spec *s, const char *needle) {
    char err[LM_ERRLEN] = "";
    lm_tokenizer *t = build(s, err, sizeof err);
    if (t) tok_free(t);
    CHECKF(t == NULL, "loaded although it should fail (%s)", needle);
    CHECKF(strstr(err, needle) != NULL, "message '%s' lacks '%s'", err, needle);
}

static void test_bad_metadata(void) {
    spec s = {"llama", NULL, -1, 0, 0, 0, 256, false};
    expect_fail(&s, "tokenizer.ggml.tokens");
    s = (spec){"llama", NULL, 0, 100, 0, 0, 256, false};
    expect_fail(&s, "tokenizer.ggml.scores");
    s = (spec){"llama", NULL, 0, -1, 0, 0, 256, false};
    expect_fail(&s, "tokenizer.ggml.scores");
    s = (spec){"llama", NULL, 0, 0, 0, 0, 5000, false};
    expect_fail(&s, "bos_token_id");
    s = (spec){"llama", NULL, 0, 0, 7, 0, 256, false};
    expect_fail(&s, "token_type");
    s = (spec){"llama", NULL, 0, 0, 0, 9, 256, false};
    expect_fail(&s, "token_type[5]");
    s = (spec){"bert", NULL, 0, 0, 0, 0, 256, false};
    expect_fail(&s, "bert");
    s = (spec){NULL, NULL, 0, 0, 0, 0, 256, false};
    expect_fail(&s, "tokenizer.ggml.model");
    s = (spec){"gpt2", "gpt-2", 0, -1, 0, 0, 256, false};
    expect_fail(&s, "tokenizer.ggml.merges");
    /* the same metadata, well-formed, loads; an id of 0xFFFFFFFF means none */
    char err[LM_ERRLEN] = "";
    s = (spec){"llama", NULL, 0, 0, 0, 0, 0xFFFFFFFF, false};
    lm_tokenizer *t = build(&s, err, sizeof err);
    CHECKF(t, "%s", err);
    bool ok = tok_n_vocab(t) == 261 && tok_bos(t) == -1 && !tok_add_bos(t);
    int32_t id;
    ok = ok && tok_encode(t, "x", 1, true, false, &id, 1) == -1; /* no BOS to add */
    tok_free(t);
    CHECK(ok);
}

/* Every allocation failing in turn: tok_load and tok_encode fail cleanly
 * (ASan builds check that nothing leaks). */
static void alloc_failures_on(const gguf_ctx *g, const char *text, int *loads, int *encodes) {
    char err[LM_ERRLEN];
    lm_tokenizer *t = NULL;
    for (long k = 0; k < 200 && !t; k++) {
        lm_alloc_fail_after(k);
        t = tok_load(g, err, sizeof err);
        lm_alloc_fail_after(-1);
        if (!t) (*loads)++;
    }
    if (!t) return;
    int want = tok_encode(t, text, strlen(text), true, true, NULL, 0);
    for (long k = 0; k < 20; k++) {
        lm_alloc_fail_after(k);
        int n = tok_encode(t, text, strlen(text), true, true, NULL, 0);
        lm_alloc_fail_after(-1);
        if (n == -1) (*encodes)++;
        else if (n != want) *encodes = -1000;
    }
    tok_free(t);
}

static void test_alloc_failures(void) {
    char err[LM_ERRLEN];
    int loads = 0, encodes = 0;
    gguf_ctx *g = gguf_open(TEST_MODEL, err, sizeof err);
    CHECKF(g, "%s", err);
    alloc_failures_on(g, "Once upon a time, \xE6\x97\xA5 <s>", &loads, &encodes);
    gguf_close(g);
    spec s = good_bpe("llama3");
    size_t size;
    unsigned char *file = build_file(&s, &size);
    g = gguf_open_mem(file, size, err, sizeof err);
    if (g) alloc_failures_on(g, "abc 123 <s> x", &loads, &encodes);
    if (g) gguf_close(g);
    free(file);
    CHECK(g != NULL);
    CHECKF(loads >= 10 && encodes >= 4, "%d failed loads, %d failed encodes", loads, encodes);
}

int main(void) {
    TEST_RUN(test_vectors_llama_spm);
    TEST_RUN(test_vectors_wpm);
    TEST_RUN(test_wpm_specials);
    TEST_RUN(test_vectors_phi3);
    TEST_RUN(test_vectors_gpt2);
    TEST_RUN(test_roundtrip_llama_spm);
    TEST_RUN(test_roundtrip_phi3);
    TEST_RUN(test_roundtrip_gpt2);
    TEST_RUN(test_vectors_harmony);
    TEST_RUN(test_roundtrip_harmony);
    TEST_RUN(test_harmony_facts);
    TEST_RUN(test_parse_special);
    TEST_RUN(test_encode_cap);
    TEST_RUN(test_performance);
    TEST_RUN(test_stories);
    TEST_RUN(test_utf8_streaming);
    TEST_RUN(test_pretok_llama3);
    TEST_RUN(test_pretok_qwen2);
    TEST_RUN(test_pretok_gpt2_and_others);
    TEST_RUN(test_bpe_merges);
    TEST_RUN(test_bad_metadata);
    TEST_RUN(test_alloc_failures);
    return TEST_DONE();
}
