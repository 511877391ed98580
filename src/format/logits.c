/*
 * logits.c - the saved-logits file (header, tokens, rows; layout in
 * logits.h) and the comparison of two runs' distributions.
 *
 * Invariants: a header is only accepted when every size it implies fits
 * (n_chunk x n_ctx <= 2^28 tokens, n_vocab <= 2^24, so the file size stays
 * far inside 64 bits); a reader only hands out rows of a file whose size was
 * checked against the header, and tokens in [0, n_vocab). Per-token
 * statistics are computed in double by logits_compare alone, so identical
 * logits on both sides give KL exactly 0.
 */
#include "format/logits.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/safefile.h"
#include "base/sha256.h"
#include "base/util.h"

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void logits_hdr_encode(const logits_hdr *h, uint8_t out[LOGITS_HDR_BYTES]) {
    memset(out, 0, LOGITS_HDR_BYTES);
    memcpy(out, LOGITS_MAGIC, 8);
    put32(out + 8, LOGITS_VERSION);
    put32(out + 12, h->n_vocab);
    put32(out + 16, h->n_ctx);
    put32(out + 20, h->n_chunk);
    put32(out + 24, h->first);
    memcpy(out + 32, h->vocab_sha, 32);
}

int logits_hdr_decode(const uint8_t *buf, size_t len, logits_hdr *h, char *err, size_t errlen) {
    if (len < LOGITS_HDR_BYTES || memcmp(buf, LOGITS_MAGIC, 8) != 0)
        return lm_err(err, errlen, "not a lamina saved-logits file (no LMLOGITS header)");
    uint32_t ver = get32(buf + 8);
    if (ver != LOGITS_VERSION)
        return lm_err(err, errlen, "saved-logits version %u, this build reads %d", ver, LOGITS_VERSION);
    if (get32(buf + 28) != 0) return lm_err(err, errlen, "saved-logits header: reserved field is not 0");
    h->n_vocab = get32(buf + 12);
    h->n_ctx = get32(buf + 16);
    h->n_chunk = get32(buf + 20);
    h->first = get32(buf + 24);
    memcpy(h->vocab_sha, buf + 32, 32);
    if (h->n_vocab < 1 || h->n_vocab > LOGITS_MAX_VOCAB)
        return lm_err(err, errlen, "saved-logits header: vocabulary of %u tokens", h->n_vocab);
    if (h->n_ctx < 2 || h->n_chunk < 1 || (uint64_t)h->n_ctx * h->n_chunk > LOGITS_MAX_TOKENS)
        return lm_err(err, errlen, "saved-logits header: %u chunks of %u tokens", h->n_chunk, h->n_ctx);
    if (h->first > h->n_ctx - 2)
        return lm_err(err, errlen, "saved-logits header: first scored position %u of a %u-token chunk", h->first,
                      h->n_ctx);
    return 0;
}

uint64_t logits_file_bytes(const logits_hdr *h) {
    uint64_t toks, rows, cells, b;
    if (!lm_mul_u64(h->n_chunk, h->n_ctx, &toks)) return 0;
    if (h->first + 1 > h->n_ctx) return 0;
    if (!lm_mul_u64(h->n_chunk, logits_rows_per_chunk(h), &rows)) return 0;
    if (!lm_mul_u64(rows, h->n_vocab, &cells)) return 0;
    if (!lm_mul_u64(cells, 4, &cells) || !lm_mul_u64(toks, 4, &toks)) return 0;
    if (!lm_add_u64(LOGITS_HDR_BYTES, toks, &b) || !lm_add_u64(b, cells, &b)) return 0;
    return b;
}

int logits_parse(const uint8_t *buf, size_t len, uint64_t size, logits_hdr *h, int32_t *tokens, char *err,
                 size_t errlen) {
    if (logits_hdr_decode(buf, len, h, err, errlen)) return -1;
    uint64_t want = logits_file_bytes(h);
    if (want == 0 || size != want)
        return lm_err(err, errlen,
                      "saved-logits file is %llu bytes, its header (%u chunks of %u tokens, %u "
                      "vocabulary) needs %llu",
                      (unsigned long long)size, h->n_chunk, h->n_ctx, h->n_vocab, (unsigned long long)want);
    size_t nt = (size_t)h->n_chunk * h->n_ctx;
    if ((len - LOGITS_HDR_BYTES) / 4 < nt) return lm_err(err, errlen, "saved-logits file: tokens cut short");
    const uint8_t *p = buf + LOGITS_HDR_BYTES;
    for (size_t i = 0; i < nt; i++) {
        uint32_t t = get32(p + 4 * i);
        if (t >= h->n_vocab)
            return lm_err(err, errlen, "saved-logits file: token %zu is %u, outside a vocabulary of %u", i, t,
                          h->n_vocab);
        if (tokens) tokens[i] = (int32_t)t;
    }
    return 0;
}

int logits_open(logits_reader *r, const char *path, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    uint8_t hb[LOGITS_HDR_BYTES];
    uint8_t *buf = NULL;
    char why[LM_ERRLEN];
    r->f = fopen(path, "rb");
    if (!r->f) return lm_err(err, errlen, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(r->f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        lm_err(err, errlen, "%s: not a regular file", path);
        goto fail;
    }
    safefile_note_input(path);
    if (fread(hb, 1, sizeof hb, r->f) != sizeof hb) {
        lm_err(err, errlen, "%s: not a lamina saved-logits file (shorter than its header)", path);
        goto fail;
    }
    if (logits_hdr_decode(hb, sizeof hb, &r->h, why, sizeof why)) {
        lm_err(err, errlen, "%s: %s", path, why);
        goto fail;
    }
    size_t nt = (size_t)r->h.n_chunk * r->h.n_ctx;
    buf = lm_malloc(LOGITS_HDR_BYTES + 4 * nt);
    r->tokens = lm_malloc(nt * sizeof *r->tokens);
    if (!buf || !r->tokens) {
        lm_err(err, errlen, "out of memory reading %s", path);
        goto fail;
    }
    memcpy(buf, hb, sizeof hb);
    if (fread(buf + LOGITS_HDR_BYTES, 4, nt, r->f) != nt) {
        lm_err(err, errlen, "%s: tokens cut short", path);
        goto fail;
    }
    if (logits_parse(buf, LOGITS_HDR_BYTES + 4 * nt, (uint64_t)sb.st_size, &r->h, r->tokens, why, sizeof why)) {
        lm_err(err, errlen, "%s: %s", path, why);
        goto fail;
    }
    lm_free(buf);
    return 0;
fail:
    lm_free(buf);
    logits_close(r);
    return -1;
}

int logits_read_row(logits_reader *r, float *row, char *err, size_t errlen) {
    if (fread(row, sizeof(float), r->h.n_vocab, r->f) != r->h.n_vocab)
        return lm_err(err, errlen, "saved-logits file cut short while reading");
    return 0;
}

void logits_close(logits_reader *r) {
    if (r->f) fclose(r->f);
    lm_free(r->tokens);
    memset(r, 0, sizeof *r);
}

/* ---- comparing two runs ------------------------------------------------- */

/* log of the sum of exp over a row, and its argmax (first on ties) */
static double row_lse(const float *x, int n, int *amax) {
    double mx = -INFINITY;
    int am = 0;
    for (int i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i], am = i;
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)x[i] - mx);
    *amax = am;
    return mx + log(s);
}

void logits_compare(const float *base, const float *cur, int n_vocab, int32_t target, logits_cmp *out) {
    int ab, ac;
    double lb = row_lse(base, n_vocab, &ab), lc = row_lse(cur, n_vocab, &ac);
    double kl = 0;
    for (int i = 0; i < n_vocab; i++) {
        double pb = (double)base[i] - lb, pc = (double)cur[i] - lc;
        kl += exp(pb) * (pb - pc);
    }
    out->kl = kl > 0 ? kl : 0; /* rounding may leave a tiny negative sum */
    out->nll_base = lb - (double)base[target];
    out->nll_cur = lc - (double)cur[target];
    out->top1_same = ab == ac;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *sorted, long n, double q) { return sorted[(long)floor(q * (double)(n - 1))]; }

void logits_summarize(const logits_cmp *c, double *kl, long n, logits_summary *s) {
    memset(s, 0, sizeof *s);
    s->n = n;
    if (n < 1) return;
    double skl = 0, skl2 = 0, sb = 0, sc = 0, sd = 0, sd2 = 0;
    long same = 0;
    for (long i = 0; i < n; i++) {
        kl[i] = c[i].kl;
        skl += c[i].kl;
        skl2 += c[i].kl * c[i].kl;
        sb += c[i].nll_base;
        sc += c[i].nll_cur;
        double d = c[i].nll_cur - c[i].nll_base;
        sd += d;
        sd2 += d * d;
        same += c[i].top1_same;
    }
    double dn = (double)n;
    s->kl_mean = skl / dn;
    s->ln_ratio = sd / dn;
    s->top1 = (double)same / dn;
    if (n > 1) {
        double v = skl2 / dn - s->kl_mean * s->kl_mean;
        s->kl_err = v > 0 ? sqrt(v / (dn - 1)) : 0;
        v = sd2 / dn - s->ln_ratio * s->ln_ratio;
        s->ln_ratio_err = v > 0 ? sqrt(v / (dn - 1)) : 0;
        s->top1_err = sqrt(s->top1 * (1 - s->top1) / (dn - 1));
    }
    s->ppl_base = exp(sb / dn);
    s->ppl_cur = exp(sc / dn);
    s->dppl = s->ppl_cur - s->ppl_base;
    qsort(kl, (size_t)n, sizeof *kl, cmp_double);
    s->kl_median = pct(kl, n, 0.5);
    s->kl_p90 = pct(kl, n, 0.9);
    s->kl_p99 = pct(kl, n, 0.99);
    s->kl_max = kl[n - 1];
}

void logits_vocab_hash(logits_piece_fn piece, const void *ctx, int n_vocab, uint8_t out[32]) {
    sha256_ctx sc;
    sha256_init(&sc);
    for (int32_t id = 0; id < n_vocab; id++) {
        size_t len = 0;
        const char *p = piece(ctx, id, &len);
        if (!p) len = 0;
        uint8_t lb[4];
        put32(lb, (uint32_t)len);
        sha256_update(&sc, lb, 4);
        if (len) sha256_update(&sc, p, len);
    }
    sha256_final(&sc, out);
}
