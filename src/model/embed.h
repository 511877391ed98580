/*
 * embed.h - pooling a sequence's hidden states into one embedding.
 *
 * An embedding is the rows of a prompt's tokens after the model's final
 * norm (lm_fwd.hid), pooled into one vector of n_embd floats: their mean
 * (LM_POOL_MEAN), the first token's row (LM_POOL_CLS) or the last token's
 * (LM_POOL_LAST), as GGUF's <arch>.pooling_type names them (lm_pooling in
 * lamina.h; model.c reads the model's into lm_hparams.pooling).
 *
 * The rows arrive in order and in pieces (a prompt prefilled in chunks,
 * each chunk's rows after its pass), so an embed_pool accumulates: the sum
 * of the rows in double for the mean, the first row for CLS, the latest for
 * LAST. A piece that starts at position 0 starts the pooling over (a
 * sequence recomputed from the start after a preemption). The result does
 * not depend on how the rows were cut into pieces, except for the mean's
 * last bits of double rounding.
 *
 * Bounds: n_embd >= 1; the mean's count is an int (a sequence's positions).
 */
#ifndef LAMINA_EMBED_H
#define LAMINA_EMBED_H

#include <stddef.h>

typedef struct embed_pool {
    int pooling; /* LM_POOL_MEAN, LM_POOL_CLS or LM_POOL_LAST */
    int n_embd;
    int n;       /* rows pooled so far */
    double *acc; /* (n_embd) MEAN: the rows' sum; CLS: the first row; LAST: the latest row */
    float *vec;  /* (n_embd) the pooled vector, written by embed_pool_finish */
} embed_pool;

/* The pooling a request gets: `want` (LM_POOL_MEAN, CLS or LAST), or with
 * LM_POOL_DEFAULT the model's `model_pooling`. -1 with a message when
 * `want` is none of these, or is LM_POOL_DEFAULT for a generative model
 * (model_pooling LM_POOL_NONE). */
int embed_pooling_resolve(int want, int model_pooling, char *err, size_t errlen);
/* "none", "mean", "cls", "last" (and "default" for LM_POOL_DEFAULT);
 * NULL for another value. */
const char *embed_pooling_name(int pooling);
/* The lm_pooling value of a name embed_pooling_name gives, or -2. */
int embed_pooling_parse(const char *name);

/* A pool for vectors of n_embd floats; NULL when out of memory or pooling
 * is not MEAN, CLS or LAST. */
embed_pool *embed_pool_new(int pooling, int n_embd);
void embed_pool_free(embed_pool *p);
/* Pool n rows of a sequence (row i at rows + i * stride floats) that hold
 * positions pos0 .. pos0 + n - 1; pos0 0 starts over. */
void embed_pool_add(embed_pool *p, const float *rows, size_t stride, int n, int pos0);
/* The pooled vector (p->vec, n_embd floats) of the rows added since the
 * last start; NULL when none were. */
const float *embed_pool_finish(embed_pool *p);

#endif
