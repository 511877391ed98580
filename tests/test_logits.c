/*
 * test_logits.c - the saved-logits file (format/logits.h) and the statistics
 * comparing two runs: header round trip and refusals, KL divergence and
 * negative log-likelihoods against a float64 reference written here from
 * the definitions (probabilities normalised by direct division), the
 * summary's mean, standard error and percentiles on known data, and a file
 * written and read back through logits_open.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "format/logits.h"
#include "base/util.h"
#include "test.h"

static logits_hdr sample_hdr(void) {
    logits_hdr h = {.n_vocab = 7, .n_ctx = 6, .n_chunk = 2, .first = 3};
    for (int i = 0; i < 32; i++) h.vocab_sha[i] = (uint8_t)(i * 7 + 1);
    return h;
}

static void test_header_round_trip(void) {
    logits_hdr h = sample_hdr(), g;
    uint8_t b[LOGITS_HDR_BYTES];
    logits_hdr_encode(&h, b);
    char err[LM_ERRLEN];
    CHECKF(logits_hdr_decode(b, sizeof b, &g, err, sizeof err) == 0, "%s", err);
    CHECK(g.n_vocab == 7 && g.n_ctx == 6 && g.n_chunk == 2 && g.first == 3);
    CHECK(!memcmp(g.vocab_sha, h.vocab_sha, 32));
    /* 64 + 4 x 12 tokens + 4 x 2 chunks x 2 rows x 7 */
    CHECK(logits_file_bytes(&g) == 64 + 48 + 112);
    CHECK(logits_rows_per_chunk(&g) == 2);
}

static void test_header_refusals(void) {
    logits_hdr h = sample_hdr(), g;
    uint8_t b[LOGITS_HDR_BYTES], c[LOGITS_HDR_BYTES];
    logits_hdr_encode(&h, b);
    char err[LM_ERRLEN];
    CHECK(logits_hdr_decode(b, 63, &g, err, sizeof err) == -1);
    memcpy(c, b, sizeof b), c[0] = 'X';
    CHECK(logits_hdr_decode(c, sizeof c, &g, err, sizeof err) == -1 && strstr(err, "LMLOGITS"));
    memcpy(c, b, sizeof b), c[8] = 2;
    CHECK(logits_hdr_decode(c, sizeof c, &g, err, sizeof err) == -1 && strstr(err, "version"));
    memcpy(c, b, sizeof b), c[28] = 1;
    CHECK(logits_hdr_decode(c, sizeof c, &g, err, sizeof err) == -1);
    logits_hdr bad = h;
    bad.n_vocab = 0;
    logits_hdr_encode(&bad, c);
    CHECK(logits_hdr_decode(c, sizeof c, &g, err, sizeof err) == -1);
    bad = h, bad.first = 5; /* no position left to score */
    logits_hdr_encode(&bad, c);
    CHECK(logits_hdr_decode(c, sizeof c, &g, err, sizeof err) == -1);
    bad = h, bad.n_chunk = 1u << 20, bad.n_ctx = 1u << 10; /* 2^30 tokens */
    logits_hdr_encode(&bad, c);
    CHECK(logits_hdr_decode(c, sizeof c, &g, err, sizeof err) == -1);
    /* tokens: a size that is not the header's, a token outside the vocabulary */
    uint8_t f[64 + 48];
    memcpy(f, b, 64);
    memset(f + 64, 0, 48);
    int32_t toks[12];
    CHECK(logits_parse(f, sizeof f, 64 + 48 + 112, &g, toks, err, sizeof err) == 0);
    CHECK(logits_parse(f, sizeof f, 64 + 48 + 111, &g, toks, err, sizeof err) == -1 && strstr(err, "bytes"));
    CHECK(logits_parse(f, sizeof f - 4, 64 + 48 + 112, &g, toks, err, sizeof err) == -1);
    f[64 + 4 * 5] = 7;
    CHECK(logits_parse(f, sizeof f, 64 + 48 + 112, &g, toks, err, sizeof err) == -1 && strstr(err, "token 5"));
}

/* float64 reference: p = exp(x) / sum exp(x), KL = sum p log(p / q) */
static void ref_compare(const float *b, const float *c, int n, int t, double *kl, double *nb, double *nc) {
    double sb = 0, sc = 0;
    for (int i = 0; i < n; i++) sb += exp((double)b[i]), sc += exp((double)c[i]);
    *kl = 0;
    for (int i = 0; i < n; i++) {
        double p = exp((double)b[i]) / sb, q = exp((double)c[i]) / sc;
        if (p > 0) *kl += p * log(p / q);
    }
    *nb = -log(exp((double)b[t]) / sb);
    *nc = -log(exp((double)c[t]) / sc);
}

static void test_compare_reference(void) {
    lm_rng r;
    lm_rng_seed(&r, 42);
    enum { V = 300 };
    float b[V], c[V];
    for (int k = 0; k < 20; k++) {
        for (int i = 0; i < V; i++) {
            b[i] = 6 * (float)lm_rng_uniform(&r) - 3;
            c[i] = b[i] + (float)(k * 0.05) * ((float)lm_rng_uniform(&r) - 0.5f);
        }
        int t = k * 13 % V;
        logits_cmp o;
        logits_compare(b, c, V, t, &o);
        double kl, nb, nc;
        ref_compare(b, c, V, t, &kl, &nb, &nc);
        CHECKF(fabs(o.kl - kl) <= 1e-12 + 1e-9 * kl, "kl %.15g ref %.15g", o.kl, kl);
        CHECK(fabs(o.nll_base - nb) < 1e-10 && fabs(o.nll_cur - nc) < 1e-10);
        CHECK(o.kl >= 0);
        if (k == 0) CHECK(o.kl == 0 && o.top1_same == 1);
    }
    /* a shift of all logits changes nothing; a different argmax is seen */
    for (int i = 0; i < V; i++) b[i] = (float)(i % 17), c[i] = b[i] + 5;
    logits_cmp o;
    logits_compare(b, c, V, 3, &o);
    CHECK(o.kl < 1e-12 && o.top1_same && fabs(o.nll_base - o.nll_cur) < 1e-9);
    c[0] = 100;
    logits_compare(b, c, V, 3, &o);
    CHECK(!o.top1_same && o.kl > 1);
}

static void test_summary(void) {
    enum { N = 101 };
    logits_cmp c[N];
    double scratch[N];
    for (int i = 0; i < N; i++) {
        /* KL 0.00 .. 1.00 in a shuffled order; nll_cur = nll_base + 0.1 */
        int v = (i * 37) % N;
        c[i] = (logits_cmp){.kl = v / 100.0, .nll_base = 1.0, .nll_cur = 1.1, .top1_same = v < 75};
    }
    logits_summary s;
    logits_summarize(c, scratch, N, &s);
    CHECK(s.n == N);
    CHECK(fabs(s.kl_mean - 0.5) < 1e-12);
    /* standard error of 0..1 in steps of 0.01: population sd / sqrt(n - 1) */
    double var = 0;
    for (int v = 0; v < N; v++) var += (v / 100.0 - 0.5) * (v / 100.0 - 0.5);
    var /= N;
    CHECK(fabs(s.kl_err - sqrt(var / (N - 1))) < 1e-12);
    CHECK(fabs(s.kl_median - 0.5) < 1e-12 && fabs(s.kl_p90 - 0.9) < 1e-12 && fabs(s.kl_p99 - 0.99) < 1e-12);
    CHECK(s.kl_max == 1.0);
    CHECK(fabs(s.top1 - 75.0 / N) < 1e-12);
    CHECK(fabs(s.ppl_base - exp(1.0)) < 1e-12 && fabs(s.ppl_cur - exp(1.1)) < 1e-12);
    CHECK(fabs(s.dppl - (exp(1.1) - exp(1.0))) < 1e-12 && fabs(s.ln_ratio - 0.1) < 1e-12 && s.ln_ratio_err < 1e-9);
}

static const char *piece(const void *ctx, int32_t id, size_t *len) {
    static const char *v[] = {"a", "bb", "", "ccc"};
    (void)ctx;
    *len = strlen(v[id]);
    return v[id];
}

static const char *piece2(const void *ctx, int32_t id, size_t *len) {
    static const char *v[] = {"a", "b", "b", "ccc"};
    (void)ctx;
    *len = strlen(v[id]);
    return v[id];
}

static void test_vocab_hash(void) {
    uint8_t a[32], b[32], c[32];
    logits_vocab_hash(piece, NULL, 4, a);
    logits_vocab_hash(piece, NULL, 4, b);
    logits_vocab_hash(piece2, NULL, 4, c); /* same bytes, other boundaries */
    CHECK(!memcmp(a, b, 32) && memcmp(a, c, 32));
    logits_vocab_hash(piece, NULL, 3, b);
    CHECK(memcmp(a, b, 32));
}

static void test_file_round_trip(void) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/lamina_test_logits_%d", (int)getpid());
    logits_hdr h = sample_hdr();
    uint8_t b[LOGITS_HDR_BYTES];
    logits_hdr_encode(&h, b);
    FILE *f = fopen(path, "wb");
    CHECK(f);
    fwrite(b, 1, sizeof b, f);
    for (int32_t i = 0; i < 12; i++) fwrite(&(int32_t){i % 7}, 4, 1, f);
    for (int i = 0; i < 28; i++) fwrite(&(float){(float)i}, 4, 1, f);
    fclose(f);
    logits_reader r;
    char err[LM_ERRLEN];
    CHECKF(logits_open(&r, path, err, sizeof err) == 0, "%s", err);
    CHECK(r.tokens[11] == 4 && r.h.n_vocab == 7);
    float row[7];
    for (int k = 0; k < 4; k++) {
        CHECK(logits_read_row(&r, row, err, sizeof err) == 0);
        CHECK(row[0] == (float)(7 * k) && row[6] == (float)(7 * k + 6));
    }
    CHECK(logits_read_row(&r, row, err, sizeof err) == -1);
    logits_close(&r);
    /* one byte more: refused with the sizes named */
    f = fopen(path, "ab");
    fputc(0, f);
    fclose(f);
    CHECK(logits_open(&r, path, err, sizeof err) == -1 && strstr(err, "bytes"));
    CHECK(logits_open(&r, "/nonexistent/x.logits", err, sizeof err) == -1);
    unlink(path);
}

int main(void) {
    TEST_RUN(test_header_round_trip);
    TEST_RUN(test_header_refusals);
    TEST_RUN(test_compare_reference);
    TEST_RUN(test_summary);
    TEST_RUN(test_vocab_hash);
    TEST_RUN(test_file_round_trip);
    return TEST_DONE();
}
