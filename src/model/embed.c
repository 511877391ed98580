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
#include "kernels/kernels.h"

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
    p->n_out = n_embd;
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
    lm_free(p->tmp);
    lm_free(p->row);
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

int embed_dim(const lm_model *m) {
    return m->dense3.rows > 0 ? (int)m->dense3.rows : m->dense2.rows > 0 ? (int)m->dense2.rows : m->hp.n_embd;
}

int embed_pool_project(embed_pool *p, const lm_weight *d2, const lm_weight *d3) {
    const lm_weight *w[2] = {d2, d3};
    int n = 0, wide = p->n_embd, in = p->n_embd;
    for (int i = 0; i < 2; i++) {
        if (!w[i] || w[i]->rows < 1) continue;
        if (w[i]->cols != in) return -1; /* model.c loads them chained */
        p->dense[n++] = w[i];
        in = (int)w[i]->rows;
        wide = in > wide ? in : wide;
    }
    p->n_out = in;
    lm_free(p->vec);
    p->vec = lm_calloc((size_t)wide, sizeof *p->vec);
    p->wide = wide;
    p->tmp = lm_calloc(2 * (size_t)wide, sizeof *p->tmp);
    p->row = lm_calloc((size_t)wide, sizeof *p->row);
    return p->vec && p->tmp && p->row ? 0 : -1;
}

/* y = W·x in double (x, y of the matrix's cols and rows) */
static void project(const lm_weight *w, const double *x, double *y, float *row) {
    lm_to_float_fn to_float = kernels_type(w->type)->to_float;
    for (int64_t r = 0; r < w->rows; r++) {
        const void *src = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        if (w->type == LM_TYPE_F32) memcpy(row, src, (size_t)w->cols * sizeof(float));
        else to_float(src, row, w->cols);
        double s = 0;
        for (int64_t c = 0; c < w->cols; c++) s += (double)row[c] * x[c];
        y[r] = s;
    }
}

const float *embed_pool_finish(embed_pool *p) {
    if (p->n == 0) return NULL;
    double div = p->pooling == LM_POOL_MEAN ? (double)p->n : 1.0;
    if (!p->dense[0]) {
        for (int j = 0; j < p->n_embd; j++) p->vec[j] = (float)(p->acc[j] / div);
        return p->vec;
    }
    /* the two halves of tmp take turns as a projection's input and output */
    double *v = p->tmp, *y = p->tmp + p->wide;
    for (int j = 0; j < p->n_embd; j++) v[j] = p->acc[j] / div;
    for (int i = 0; i < 2 && p->dense[i]; i++) {
        project(p->dense[i], v, y, p->row);
        double *t = v;
        v = y, y = t;
    }
    for (int j = 0; j < p->n_out; j++) p->vec[j] = (float)v[j];
    return p->vec;
}
