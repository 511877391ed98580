/*
 * embed.c - pooling hidden-state rows into an embedding (contract in
 * embed.h). The mean is summed in double and divided once at the end, so
 * a prompt cut into chunks gives the mean of one pass within double
 * rounding of the float rows.
 */
#include "model/embed.h"

#include <string.h>

#include "lamina.h"
#include "base/util.h"

int embed_pooling_resolve(int want, int model_pooling, char *err, size_t errlen) {
    if (want == LM_POOL_DEFAULT) {
        if (model_pooling == LM_POOL_NONE)
            return lm_err(err, errlen,
                          "the model is a generative model; ask for a pooling (mean, cls or last) to embed with "
                          "its hidden states");
        want = model_pooling;
    }
    if (want != LM_POOL_MEAN && want != LM_POOL_CLS && want != LM_POOL_LAST)
        return lm_err(err, errlen, "pooling %d is not one of default, mean, cls or last", want);
    return want;
}

static const char *const names[] = {"default", "none", "mean", "cls", "last"};

const char *embed_pooling_name(int pooling) {
    return pooling >= LM_POOL_DEFAULT && pooling <= LM_POOL_LAST ? names[pooling + 1] : NULL;
}

int embed_pooling_parse(const char *name) {
    for (int i = 0; name && i < (int)(sizeof names / sizeof names[0]); i++)
        if (strcmp(name, names[i]) == 0) return i - 1;
    return -2;
}

embed_pool *embed_pool_new(int pooling, int n_embd) {
    if ((pooling != LM_POOL_MEAN && pooling != LM_POOL_CLS && pooling != LM_POOL_LAST) || n_embd < 1) return NULL;
    embed_pool *p = lm_calloc(1, sizeof *p);
    if (!p) return NULL;
    p->pooling = pooling;
    p->n_embd = n_embd;
    p->acc = lm_calloc((size_t)n_embd, sizeof *p->acc);
    p->vec = lm_calloc((size_t)n_embd, sizeof *p->vec);
    if (!p->acc || !p->vec) {
        embed_pool_free(p);
        return NULL;
    }
    return p;
}

void embed_pool_free(embed_pool *p) {
    if (!p) return;
    lm_free(p->acc);
    lm_free(p->vec);
    lm_free(p);
}

static void copy_row(double *dst, const float *row, int n) {
    for (int j = 0; j < n; j++) dst[j] = row[j];
}

void embed_pool_add(embed_pool *p, const float *rows, size_t stride, int n, int pos0) {
    const int E = p->n_embd;
    if (pos0 == 0) { /* the sequence starts (again) */
        p->n = 0;
        memset(p->acc, 0, (size_t)E * sizeof *p->acc);
    }
    if (n <= 0) return;
    switch (p->pooling) {
        case LM_POOL_MEAN:
            for (int i = 0; i < n; i++) {
                const float *r = rows + (size_t)i * stride;
                for (int j = 0; j < E; j++) p->acc[j] += r[j];
            }
            break;
        case LM_POOL_CLS:
            if (p->n == 0) copy_row(p->acc, rows, E);
            break;
        default: /* LM_POOL_LAST */ copy_row(p->acc, rows + (size_t)(n - 1) * stride, E); break;
    }
    p->n += n;
}

const float *embed_pool_finish(embed_pool *p) {
    if (p->n == 0) return NULL;
    double div = p->pooling == LM_POOL_MEAN ? (double)p->n : 1.0;
    for (int j = 0; j < p->n_embd; j++) p->vec[j] = (float)(p->acc[j] / div);
    return p->vec;
}
