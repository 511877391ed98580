/*
 * logits.h - saved logits of a perplexity run, and the statistics comparing
 * another run's distributions with them (KL divergence, top-1 agreement,
 * the change of perplexity).
 *
 * `lamina perplexity --save-logits FILE` writes the logits of every scored
 * position; `--kl-divergence FILE` reruns the same text with another model
 * file (another quantization of the same model) or KV type and compares.
 * The file is lamina's own, little-endian:
 *
 *   offset  size  field
 *   0       8     magic "LMLOGITS"
 *   8       4     version (1)
 *   12      4     n_vocab
 *   16      4     n_ctx: tokens per chunk
 *   20      4     n_chunk
 *   24      4     first: the first scored position of a chunk (positions
 *                 first .. n_ctx - 2 are scored, each predicting the next)
 *   28      4     reserved, 0
 *   32      32    SHA-256 of the vocabulary (logits_vocab_hash)
 *   64      4 x n_chunk x n_ctx   the tokens of every chunk (int32), as fed
 *   ...     4 x n_chunk x (n_ctx - 1 - first) x n_vocab   the raw logits
 *                 (float32) of the scored positions, chunk by chunk
 *
 * The file's size must be exactly what the header implies. A comparison is
 * refused unless vocabulary hash, n_vocab, chunk size and tokens all match:
 * the two runs must have predicted the same tokens from the same contexts.
 *
 * The statistics are taken in double from the raw logits of both runs, by
 * one function, so a run compared with its own saved logits (same model,
 * same build) gives a KL divergence of exactly 0 and 100% agreement.
 */
#ifndef LAMINA_LOGITS_H
#define LAMINA_LOGITS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define LOGITS_MAGIC "LMLOGITS"
#define LOGITS_VERSION 1
#define LOGITS_HDR_BYTES 64
#define LOGITS_MAX_VOCAB (1 << 24)
#define LOGITS_MAX_TOKENS (1 << 28) /* n_chunk x n_ctx */

typedef struct {
    uint32_t n_vocab, n_ctx, n_chunk, first;
    uint8_t vocab_sha[32];
} logits_hdr;

/* The scored positions per chunk: n_ctx - 1 - first. */
static inline uint32_t logits_rows_per_chunk(const logits_hdr *h) { return h->n_ctx - 1 - h->first; }

/* Encode the fixed 64-byte header. */
void logits_hdr_encode(const logits_hdr *h, uint8_t out[LOGITS_HDR_BYTES]);
/* Decode and validate the fixed header (magic, version, reserved 0,
 * 1 <= n_vocab <= 2^24, 2 <= n_ctx, 1 <= n_chunk, n_chunk x n_ctx <= 2^28,
 * first <= n_ctx - 2): 0, or -1 with a message. */
int logits_hdr_decode(const uint8_t *buf, size_t len, logits_hdr *h, char *err, size_t errlen);
/* The bytes a file with this header holds in all (header, tokens, logits);
 * 0 when that overflows 64 bits (never after a successful decode). */
uint64_t logits_file_bytes(const logits_hdr *h);
/* Parse a header and the token array from memory (what the file reader
 * reads, and what the fuzz target feeds): the header is decoded, `size` (the
 * whole file's length) must equal logits_file_bytes, `len` must hold the
 * tokens, and every token must be in [0, n_vocab). 0 with tokens copied to
 * `tokens` (n_chunk x n_ctx entries, may be NULL), or -1 with a message. */
int logits_parse(const uint8_t *buf, size_t len, uint64_t size, logits_hdr *h, int32_t *tokens, char *err,
                 size_t errlen);

/* A saved-logits file opened for reading; rows are read in order. */
typedef struct {
    FILE *f;
    logits_hdr h;
    int32_t *tokens; /* (n_chunk, n_ctx) */
} logits_reader;

/* Open and check a file (header, exact size, tokens): 0, or -1 with a
 * message naming the file. */
int logits_open(logits_reader *r, const char *path, char *err, size_t errlen);
/* The next scored row (n_vocab floats): 0, or -1 on a short read. */
int logits_read_row(logits_reader *r, float *row, char *err, size_t errlen);
void logits_close(logits_reader *r);

/* ---- comparing two runs ------------------------------------------------- */

/* Per-token figures of one scored position. base and cur are raw logits
 * (n_vocab); target the token that followed. */
typedef struct {
    double kl;       /* KL(base || cur) in nats, >= 0 */
    double nll_base; /* -log p_base(target) */
    double nll_cur;  /* -log p_cur(target) */
    int top1_same;   /* argmax base == argmax cur (first index on ties) */
} logits_cmp;

void logits_compare(const float *base, const float *cur, int n_vocab, int32_t target, logits_cmp *out);

/* The summary over n scored positions. */
typedef struct {
    long n;
    double kl_mean, kl_err; /* mean and its standard error */
    double kl_median, kl_p90, kl_p99, kl_max;
    double top1, top1_err;          /* share of positions whose argmax agrees, in [0, 1] */
    double ppl_base, ppl_cur, dppl; /* exp(mean nll); dppl = ppl_cur - ppl_base */
    double ln_ratio, ln_ratio_err;  /* mean of nll_cur - nll_base = ln(ppl_cur / ppl_base) */
} logits_summary;

/* Summarize n per-token comparisons (n >= 1). kl is sorted in place for the
 * percentiles (the value at index floor(q x (n - 1)) of the sorted list). */
void logits_summarize(const logits_cmp *c, double *kl_scratch, long n, logits_summary *s);

/* SHA-256 over the vocabulary: for each id in order, its length (uint32,
 * little-endian) then its bytes. piece(ctx, id, &len) gives a token's text. */
typedef const char *(*logits_piece_fn)(const void *ctx, int32_t id, size_t *len);
void logits_vocab_hash(logits_piece_fn piece, const void *ctx, int n_vocab, uint8_t out[32]);

#endif
