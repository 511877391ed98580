/*
 * embed.h - pooling a sequence's hidden states into one embedding.
 *
 * An embedding is the rows of a prompt's tokens after the model's final
 * norm (lm_fwd.hid), pooled into one vector of n_embd floats: their mean
 * (LM_POOL_MEAN), the first token's row (LM_POOL_CLS) or the last token's
 * (LM_POOL_LAST), as GGUF's <arch>.pooling_type names them (lm_pooling in
 * lamina.h; model_hparams.c reads the model's into lm_hparams.pooling).
 *
 * The rows arrive in order and in pieces (a prompt prefilled in chunks,
 * each chunk's rows after its pass), so an embed_pool accumulates: the sum
 * of the rows in double for the mean, the first row for CLS, the latest for
 * LAST. A piece that starts at position 0 starts the pooling over (a
 * sequence recomputed from the start after a preemption). The result does
 * not depend on how the rows were cut into pieces, except for the mean's
 * last bits of double rounding.
 *
 * A model may project the pooled vector (gemma-embedding's dense_2 then
 * dense_3, sentence-transformers' Dense modules: y = W·v, no bias, no
 * activation): embed_pool_project sets the matrices and embed_pool_finish
 * applies them, in double, to the pooled vector, whose width becomes the
 * last matrix's rows (embed_dim).
 *
 * Bounds: n_embd >= 1; the mean's count is an int (a sequence's positions).
 */
#ifndef LAMINA_EMBED_H
#define LAMINA_EMBED_H

#include <stddef.h>

#include "model/model.h"

typedef struct embed_pool {
    int pooling; /* LM_POOL_MEAN, LM_POOL_CLS or LM_POOL_LAST */
    int n_embd;
    int n;                     /* rows pooled so far */
    double *acc;               /* (n_embd) MEAN: the rows' sum; CLS: the first row; LAST: the latest row */
    float *vec;                /* (n_out) the pooled (and projected) vector, written by embed_pool_finish */
    const lm_weight *dense[2]; /* the projections, in order (NULL: none) */
    int n_out;                 /* the vector's width: n_embd, or the last projection's rows */
    int wide;                  /* the widest of n_embd and the projections' rows */
    double *tmp;               /* (2 * wide) a projection's input and output */
    float *row;                /* (the widest input) one matrix row as floats */
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
/* The model's post-pooling projections (either of d2, d3 may be NULL or
 * have rows 0: absent; d3's cols are d2's rows, or n_embd alone, as
 * model.c loads them). 0, or -1 when out of memory. */
int embed_pool_project(embed_pool *p, const lm_weight *d2, const lm_weight *d3);
/* The width of a model's embedding: its last projection's rows, else n_embd. */
int embed_dim(const lm_model *m);
/* Pool n rows of a sequence (row i at rows + i * stride floats) that hold
 * positions pos0 .. pos0 + n - 1; pos0 0 starts over. */
void embed_pool_add(embed_pool *p, const float *rows, size_t stride, int n, int pos0);
/* The pooled vector (p->vec, n_out floats, projected) of the rows added
 * since the last start; NULL when none were. */
const float *embed_pool_finish(embed_pool *p);

#endif
