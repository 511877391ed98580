/*
 * head_sub.c - the LM head over a vocabulary subset (forward.h): a draft
 * model's logits for a fixed set of tokens, copied at load into a matrix of
 * their own, plus a few extra tokens per pass gathered then.
 *
 * head_sub_new copies the subset's rows of the LM head (the file's rows, in
 * their quantized type, row r of the copy is token ids[r]) and, when the
 * kernel table has a packed form of the type, interleaves them as the
 * model's loader does, so a product over the subset runs the same kernel
 * the whole head would and reads n / n_vocab of its bytes. head_sub_logits
 * fills a pass's logits rows: -inf everywhere, then the subset's products
 * and the extras' (their rows memcpy'd into the selection's gather scratch
 * by head_sub_gather, once for as many passes as keep the same extras, a
 * row-major matrix) scattered to their token ids, the final softcap
 * applied to the products only.
 *
 * Invariant: the subset's ids are distinct and ascending; the extras are
 * distinct and none is in the subset (the caller's duty: a duplicate would
 * only be written twice with the same value).
 */
#include "model/forward.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "format/quant.h"
#include "kernels/kernels.h"
#include "model/ops.h"

#define HEAD_ALIGN 64

static size_t packed_size(const lm_weight *o, int n) {
    if (!o->packed || !kernels_matmul_packs(o->type)) return 0;
    return quant_pack_size(o->type, n, o->cols);
}

size_t head_sub_bytes(const lm_model *m, int n) {
    const lm_weight *o = &m->output;
    return (size_t)n * o->row_bytes + packed_size(o, n) + 2 * HEAD_ALIGN + (size_t)n * sizeof(int32_t);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

lm_head_sub *head_sub_new(const lm_model *m, const int32_t *ids, int n, char *err, size_t errlen) {
    const lm_weight *o = &m->output;
    if (m->tp.size > 1 || m->pp.size > 1)
        return lm_err(err, errlen, "a vocabulary subset's LM head does not run under tensor or pipeline parallelism"),
               NULL;
    if (n < 1 || n > m->hp.n_vocab || o->rows != m->hp.n_vocab)
        return lm_err(err, errlen, "a vocabulary subset of %d tokens of %d", n, m->hp.n_vocab), NULL;
    lm_head_sub *h = lm_calloc(1, sizeof *h);
    if (!h) return lm_err(err, errlen, "out of memory"), NULL;
    size_t rows_b = (size_t)n * o->row_bytes, pk = packed_size(o, n);
    h->ids = lm_malloc((size_t)n * sizeof *h->ids);
    h->mem = lm_malloc(rows_b + pk + 2 * HEAD_ALIGN);
    if (!h->ids || !h->mem) {
        head_sub_free(h);
        return lm_err(err, errlen, "out of memory for the draft's LM head subset"), NULL;
    }
    memcpy(h->ids, ids, (size_t)n * sizeof *h->ids);
    qsort(h->ids, (size_t)n, sizeof *h->ids, cmp_i32);
    for (int i = 0; i < n; i++)
        if (h->ids[i] < 0 || h->ids[i] >= m->hp.n_vocab || (i && h->ids[i] == h->ids[i - 1])) {
            head_sub_free(h);
            return lm_err(err, errlen, "the vocabulary subset's ids must be distinct and in range"), NULL;
        }
    uint8_t *rows = (uint8_t *)(((uintptr_t)h->mem + HEAD_ALIGN - 1) & ~(uintptr_t)(HEAD_ALIGN - 1));
    for (int i = 0; i < n; i++)
        memcpy(rows + (size_t)i * o->row_bytes, (const uint8_t *)o->data + (size_t)h->ids[i] * o->row_bytes,
               o->row_bytes);
    h->w = (lm_weight){.data = rows, .type = o->type, .rows = n, .cols = o->cols, .row_bytes = o->row_bytes};
    if (pk) {
        uint8_t *p = (uint8_t *)(((uintptr_t)(rows + rows_b) + HEAD_ALIGN - 1) & ~(uintptr_t)(HEAD_ALIGN - 1));
        quant_pack(o->type, rows, o->row_bytes, n, o->cols, p);
        h->w.packed = p;
    }
    h->n = n;
    h->bytes = head_sub_bytes(m, n);
    return h;
}

void head_sub_free(lm_head_sub *h) {
    if (!h) return;
    lm_free(h->ids);
    lm_free(h->mem);
    lm_free(h);
}

void head_sub_gather(const lm_model *m, const fwd_head_sel *s) {
    const lm_weight *o = &m->output;
    for (int i = 0; i < s->n_extra; i++)
        memcpy(s->gather + (size_t)i * o->row_bytes, (const uint8_t *)o->data + (size_t)s->extra[i] * o->row_bytes,
               o->row_bytes);
}

void head_sub_logits(lm_fwd *f, float *logits, int rows) {
    const lm_model *m = f->m;
    const fwd_head_sel *s = f->head;
    const lm_weight *o = &m->output;
    const int n = s->sub->n, nx = s->n_extra;
    const size_t V = (size_t)m->hp.n_vocab;
    /* out: (rows, w), the subset's products then the extras' */
    ops_matmul(f->pool, s->out, &s->sub->w, f->xb, rows, f->act);
    float *xo = NULL;
    if (nx > 0) { /* the rows head_sub_gather copied */
        lm_weight g = {.data = s->gather, .type = o->type, .rows = nx, .cols = o->cols, .row_bytes = o->row_bytes};
        xo = s->out + (size_t)rows * n; /* (rows, nx) after the subset's block */
        ops_matmul(f->pool, xo, &g, f->xb, rows, f->act);
    }
    float cap = m->hp.final_softcap;
    for (int r = 0; r < rows; r++) {
        float *row = logits + (size_t)r * V;
        for (size_t i = 0; i < V; i++) row[i] = -INFINITY;
        const float *a = s->out + (size_t)r * n;
        for (int i = 0; i < n; i++) row[s->sub->ids[i]] = cap > 0 ? cap * tanhf(a[i] / cap) : a[i];
        for (int i = 0; i < nx; i++) {
            float v = xo[(size_t)r * nx + i];
            row[s->extra[i]] = cap > 0 ? cap * tanhf(v / cap) : v;
        }
    }
}
