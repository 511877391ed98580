/*
 * attn.c - tiled causal attention over the paged KV cache (see attn.h for
 * the recurrence and the contract).
 *
 * Work of one attn_tile call, for each sub-tile of nq query tokens
 * (R = nq x group rows, row r = query i = r / group, head g = r % group):
 *   1. Qs (R, hd) = the rows' query vectors times scale; m = -inf, l = 0, O = 0
 *   2. for each chunk of up to ATTN_KV_CHUNK positions c0 .. c0+nk-1 up to
 *      the sub-tile's last position (chunks on a fixed grid from the first
 *      key, so a row's chunking does not depend on how queries are tiled):
 *        gather the chunk's key rows (pointers into F32 blocks, or rows
 *        converted once into Kf for F16/Q8_0)
 *        S (R, nk) = Qs · Kᵀ
 *        per row: keys t in [lo, vis) are visible, vis = clamp(pos - c0 + 1,
 *        0, nk) and lo > 0 only under a sliding window; m' = max(m, max S),
 *        p = exp(S - m') (masked keys get 0), l = l e^(m-m') + Σ p,
 *        O *= e^(m-m')
 *        gather the value rows likewise; O += P · V
 *   3. out = O / l (or, for a split-KV part, O, m and l as they are)
 * Every visible key adds exp(s - m') <= 1 with the row's own running max
 * among them, so l >= 1 at the end and nothing overflows.
 *
 * Scratch (floats): Qs, O (RMAX, hd); S (RMAX, CHUNK); Kf, Vf (CHUNK, hd);
 * m, l (RMAX); a zero row (hd, read in place of keys and values of blocks
 * released out of a sliding window); plus CHUNK row pointers each for K and
 * V. RMAX = 64 rows, so with hd = 128 a scratch is about 150 KiB whatever
 * the context.
 */
#include "kv/attn.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "kernels/avx2_attn.h"
#include "kernels/kernels.h"
#include "format/quant.h"
#include "base/util.h"

#define RMAX 64
#define CHUNK ATTN_KV_CHUNK

struct attn_scratch {
    int group, hd, tq;          /* tq = query tokens per sub-tile = max(1, RMAX / group) */
    int rows;                   /* tq * group */
    bool simd;
    size_t bytes;
    float *qs, *o;              /* (rows, hd) */
    float *s;                   /* (rows, CHUNK) scores, then probabilities */
    float *kf, *vf;             /* (CHUNK, hd) converted keys / values */
    float *m, *l;               /* (rows) */
    float *zero;                /* (hd) zeros: stand-in for keys/values of released blocks */
    const float **krow, **vrow; /* (CHUNK) */
    void *mem;
};

/* ---- scalar kernels (same contracts as kernels/avx2_attn.h) ------------------ */

static float dot_scalar(const float *a, const float *b, int n) {
    /* eight partial sums: a fixed order the compiler can also vectorize */
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    for (; i < n; i++) acc[0] += a[i] * b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static void scores_scalar(const float *Q, int R, int hd, const float *const *krow, int nk, float *S, int s_stride) {
    for (int r = 0; r < R; r++)
        for (int t = 0; t < nk; t++) S[(size_t)r * s_stride + t] = dot_scalar(Q + (size_t)r * hd, krow[t], hd);
}

static void pv_scalar(float *O, int R, int hd, const float *P, int p_stride, const float *const *vrow, int nk) {
    for (int r = 0; r < R; r++) {
        float *o = O + (size_t)r * hd;
        const float *p = P + (size_t)r * p_stride;
        for (int t = 0; t < nk; t++) {
            float w = p[t];
            if (w == 0.0f) continue;
            const float *v = vrow[t];
            for (int d = 0; d < hd; d++) o[d] += w * v[d];
        }
    }
}

static float exp_sum_scalar(float *x, int n, float m) {
    float s = 0;
    for (int t = 0; t < n; t++) {
        x[t] = expf(x[t] - m);
        s += x[t];
    }
    return s;
}

/* dst = src * c over a row of n (a multiple of 8 on the SIMD path). */
static void scale_row(bool simd, float *dst, const float *src, int n, float c) {
#if defined(__x86_64__) || defined(__i386__)
    if (simd) {
        attn_scale_avx2(dst, src, n, c);
        return;
    }
#endif
    for (int i = 0; i < n; i++) dst[i] = src[i] * c;
}

/* The largest of x[0 .. n), n >= 1. */
static float row_max(bool simd, const float *x, int n) {
#if defined(__x86_64__) || defined(__i386__)
    if (simd) return attn_max_avx2(x, n);
#endif
    float m = x[0];
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* n elements of the pool's type at src to floats. */
static void convert_rows(uint32_t type, bool simd, const uint8_t *src, float *dst, int n) {
    if (type == LM_TYPE_F16) {
#if defined(__x86_64__) || defined(__i386__)
        if (simd) {
            attn_f16_to_f32_avx2((const uint16_t *)(const void *)src, dst, n);
            return;
        }
#endif
        uint16_t h;
        for (int i = 0; i < n; i++) {
            memcpy(&h, src + 2 * (size_t)i, 2);
            dst[i] = lm_f16_to_f32(h);
        }
    } else {
        assert(type == LM_TYPE_Q8_0);
#if defined(__x86_64__) || defined(__i386__)
        if (simd) {
            attn_q8_0_to_f32_avx2(src, dst, n);
            return;
        }
#endif
        for (int i = 0; i < n; i += QK8_0, src += sizeof(block_q8_0)) {
            uint16_t h;
            memcpy(&h, src, 2);
            float d = lm_f16_to_f32(h);
            const int8_t *q = (const int8_t *)(src + 2);
            for (int j = 0; j < QK8_0; j++) dst[i + j] = d * (float)q[j];
        }
    }
}

/* ---- scratch ------------------------------------------------------------------- */

attn_scratch *attn_scratch_new(const kv_pool *p, int n_head, char *err, size_t errlen) {
    const kv_layout *lay = kv_pool_layout(p);
    if (n_head <= 0 || n_head % lay->n_head_kv) {
        lm_err(err, errlen, "attention needs query heads (%d) to be a multiple of KV heads (%d)", n_head,
               lay->n_head_kv);
        return NULL;
    }
    attn_scratch *scr = lm_calloc(1, sizeof *scr);
    if (!scr) {
        lm_err(err, errlen, "out of memory");
        return NULL;
    }
    scr->group = n_head / lay->n_head_kv;
    scr->hd = lay->head_dim;
    scr->tq = scr->group >= RMAX ? 1 : RMAX / scr->group;
    scr->rows = scr->tq * scr->group;
    scr->simd = cpu_has_avx2() && scr->hd % 8 == 0;
    size_t R = (size_t)scr->rows, hd = (size_t)scr->hd;
    size_t nf = 2 * R * hd + R * CHUNK + 2 * (size_t)CHUNK * hd + 2 * R + hd;
    scr->bytes = nf * sizeof(float) + 2 * CHUNK * sizeof(float *);
    scr->mem = lm_malloc(scr->bytes);
    if (!scr->mem) {
        lm_err(err, errlen, "out of memory allocating %zu bytes of attention scratch", scr->bytes);
        lm_free(scr);
        return NULL;
    }
    float *f = scr->mem;
    scr->qs = f, f += R * hd;
    scr->o = f, f += R * hd;
    scr->s = f, f += R * CHUNK;
    scr->kf = f, f += (size_t)CHUNK * hd;
    scr->vf = f, f += (size_t)CHUNK * hd;
    scr->m = f, f += R;
    scr->l = f, f += R;
    scr->zero = f, f += hd;
    memset(scr->zero, 0, hd * sizeof(float));
    scr->krow = (const float **)(void *)f;
    scr->vrow = scr->krow + CHUNK;
    return scr;
}

void attn_scratch_free(attn_scratch *scr) {
    if (!scr) return;
    lm_free(scr->mem);
    lm_free(scr);
}

size_t attn_scratch_bytes(const attn_scratch *scr) { return scr->bytes + sizeof *scr; }
int attn_tile_rows(const attn_scratch *scr) { return scr->rows; }
void attn_scratch_set_scalar(attn_scratch *scr, bool scalar) {
    scr->simd = !scalar && cpu_has_avx2() && scr->hd % 8 == 0;
}
bool attn_scratch_simd(const attn_scratch *scr) { return scr->simd; }

/* ---- the kernel --------------------------------------------------------------- */

/* Row pointers of positions c0 .. c0+nk-1 of one (layer, K|V, head) slab:
 * straight into F32 blocks, else through rows converted into buf. Positions
 * below lo are visible to no row of the caller; their block may have been
 * released out of a sliding window (table entry -1), and then they read as
 * zeros (finite: their probability is 0, so they add exactly nothing). */
static void gather(const kv_layout *lay, const int32_t *table, int layer, int which, int kv_head, int c0, int nk,
                   int lo, bool simd, float *buf, const float *zero, const float **rows) {
    int B = lay->block_size, hd = lay->head_dim;
    size_t slab = kv_slab_offset(lay, layer, which, kv_head);
    for (int pos = c0; pos < c0 + nk;) {
        int off = pos % B, seg = B - off < c0 + nk - pos ? B - off : c0 + nk - pos;
        int32_t b = table[pos / B];
        if (b < 0) {
            assert(pos + seg <= lo); /* only keys out of every row's window are ever released */
            for (int t = 0; t < seg; t++) rows[pos - c0 + t] = zero;
            pos += seg;
            continue;
        }
        const uint8_t *src = lay->data + (size_t)b * lay->block_bytes + slab + (size_t)off * lay->row_bytes;
        if (lay->type == LM_TYPE_F32) {
            for (int t = 0; t < seg; t++) rows[pos - c0 + t] = (const float *)(const void *)src + (size_t)t * hd;
        } else {
            float *dst = buf + (size_t)(pos - c0) * hd;
            convert_rows(lay->type, simd, src, dst, seg * hd);
            for (int t = 0; t < seg; t++) rows[pos - c0 + t] = dst + (size_t)t * hd;
        }
        pos += seg;
    }
}

/* Ask for the cache lines of positions c0 .. c0+nk-1 of one slab ahead of
 * use: consecutive chunks live in blocks scattered over the pool, where the
 * hardware prefetchers, which follow one page at a time, do not reach. */
static void prefetch_chunk(const kv_layout *lay, const int32_t *table, int layer, int which, int kv_head, int c0,
                           int nk) {
    int B = lay->block_size;
    size_t slab = kv_slab_offset(lay, layer, which, kv_head);
    for (int pos = c0; pos < c0 + nk;) {
        int off = pos % B, seg = B - off < c0 + nk - pos ? B - off : c0 + nk - pos;
        int32_t b = table[pos / B];
        if (b < 0) { /* released out of the window: never read */
            pos += seg;
            continue;
        }
        const uint8_t *src = lay->data + (size_t)b * lay->block_bytes + slab + (size_t)off * lay->row_bytes;
        size_t bytes = (size_t)seg * lay->row_bytes;
        for (size_t i = 0; i < bytes; i += 64) __builtin_prefetch(src + i);
        pos += seg;
    }
}

/* One call's fixed arguments. Keys considered: positions [k0, k1) up to
 * each query's own; the result goes to out (normalized) or, when out is
 * NULL, to the partial state po / pml. */
typedef struct {
    const kv_layout *lay;   /* the layer's block class */
    const int32_t *table;   /* the sequence's table for that class */
    int layer, kv_head;     /* layer: its index inside the class's blocks */
    const float *q;
    size_t q_stride;
    float scale;
    int window;             /* > 0: query at pos sees keys pos-window+1 .. pos */
    int k0, k1;
    float *out;
    size_t out_stride;
    float *po, *pml;        /* (n_q * group, hd), (n_q * group, 2) */
} tile_args;

/* One sub-tile: queries i0 .. i0+nq-1 of the call (positions qpos0 ..), all
 * heads of the group. */
static void subtile(const tile_args *a, int i0, int nq, int qpos0, attn_scratch *scr) {
    const kv_layout *lay = a->lay;
    int G = scr->group, hd = scr->hd, R = nq * G, kh = a->kv_head;
    bool simd = scr->simd;
    for (int r = 0; r < R; r++) {
        const float *src = a->q + (size_t)(i0 + r / G) * a->q_stride + (size_t)(kh * G + r % G) * hd;
        scale_row(simd, scr->qs + (size_t)r * hd, src, hd, a->scale);
        scr->m[r] = -INFINITY;
        scr->l[r] = 0;
    }
    memset(scr->o, 0, (size_t)R * hd * sizeof(float));
    int c_end = qpos0 + nq < a->k1 ? qpos0 + nq : a->k1; /* keys up to the last query's position */
    /* with a window, skip whole chunks below the first query's window (chunk
     * starts stay on the k0 + multiple-of-CHUNK grid) */
    int c_begin = a->k0, wlo = a->window > 0 ? qpos0 + 1 - a->window : 0; /* no row sees a key below wlo */
    if (wlo > c_begin) c_begin += (wlo - c_begin) / CHUNK * CHUNK;
    for (int c0 = c_begin; c0 < c_end; c0 += CHUNK) {
        int nk = c_end - c0 < CHUNK ? c_end - c0 : CHUNK;
        if (c0 + CHUNK < c_end) {
            int nk2 = c_end - c0 - CHUNK < CHUNK ? c_end - c0 - CHUNK : CHUNK;
            prefetch_chunk(lay, a->table, a->layer, 0, kh, c0 + CHUNK, nk2);
            prefetch_chunk(lay, a->table, a->layer, 1, kh, c0 + CHUNK, nk2);
        }
        gather(lay, a->table, a->layer, 0, kh, c0, nk, wlo, simd, scr->kf, scr->zero, scr->krow);
#if defined(__x86_64__) || defined(__i386__)
        if (simd) attn_scores_avx2(scr->qs, R, hd, scr->krow, nk, scr->s, CHUNK);
        else
#endif
            scores_scalar(scr->qs, R, hd, scr->krow, nk, scr->s, CHUNK);
        int nv = 0; /* values any row needs */
        for (int r = 0; r < R; r++) {
            float *s = scr->s + (size_t)r * CHUNK;
            /* visible keys of this row in the chunk: t in [lo, vis) */
            int pos = qpos0 + r / G, vis = pos - c0 + 1, lo = a->window > 0 ? pos + 1 - a->window - c0 : 0;
            vis = vis < 0 ? 0 : vis > nk ? nk : vis;
            lo = lo < 0 ? 0 : lo > vis ? vis : lo;
            if (lo == vis) {
                memset(s, 0, (size_t)nk * sizeof(float));
                continue;
            }
            float mx = row_max(simd, s + lo, vis - lo);
            float m_new = mx > scr->m[r] ? mx : scr->m[r];
            float sum;
#if defined(__x86_64__) || defined(__i386__)
            if (simd) sum = attn_exp_sum_avx2(s + lo, vis - lo, m_new);
            else
#endif
                sum = exp_sum_scalar(s + lo, vis - lo, m_new);
            if (lo) memset(s, 0, (size_t)lo * sizeof(float));
            if (vis < nk) memset(s + vis, 0, (size_t)(nk - vis) * sizeof(float));
            if (m_new > scr->m[r]) {
                float corr = expf(scr->m[r] - m_new); /* 0 on the first visible chunk */
                scr->l[r] *= corr;
                float *o = scr->o + (size_t)r * hd;
                scale_row(simd, o, o, hd, corr);
                scr->m[r] = m_new;
            }
            scr->l[r] += sum;
            nv = vis > nv ? vis : nv;
        }
        if (nv == 0) continue;
        gather(lay, a->table, a->layer, 1, kh, c0, nv, wlo, simd, scr->vf, scr->zero, scr->vrow);
#if defined(__x86_64__) || defined(__i386__)
        if (simd) attn_pv_avx2(scr->o, R, hd, scr->s, CHUNK, scr->vrow, nv);
        else
#endif
            pv_scalar(scr->o, R, hd, scr->s, CHUNK, scr->vrow, nv);
    }
    for (int r = 0; r < R; r++) {
        const float *o = scr->o + (size_t)r * hd;
        if (a->out) {
            float *dst = a->out + (size_t)(i0 + r / G) * a->out_stride + (size_t)(kh * G + r % G) * hd;
            scale_row(simd, dst, o, hd, 1.0f / scr->l[r]);
        } else {
            size_t row = (size_t)i0 * G + (size_t)r;
            memcpy(a->po + row * hd, o, (size_t)hd * sizeof(float));
            a->pml[2 * row] = scr->m[r];
            a->pml[2 * row + 1] = scr->l[r];
        }
    }
}

static void run_tiles(const tile_args *a, int n_q, int pos0, attn_scratch *scr) {
    for (int i0 = 0; i0 < n_q; i0 += scr->tq) {
        int nq = n_q - i0 < scr->tq ? n_q - i0 : scr->tq;
        subtile(a, i0, nq, pos0 + i0, scr);
    }
}

/* The fixed arguments of a call on model layer `layer`: its block class's
 * layout and table, and its index inside that class's blocks. A local
 * (sliding-window) layer's blocks are released once out of the pool's
 * window, so its attention window must not be wider. */
static tile_args layer_args(const kv_pool *p, const kv_seq *s, int layer, int window, attn_scratch *scr) {
    int slot, cls = kv_layer_class(p, layer, &slot);
    const kv_layout *lay = kv_class_layout(p, cls);
    assert(lay->head_dim == scr->hd && slot < lay->n_layer);
    assert(cls == KV_GLOBAL || (window > 0 && window <= kv_pool_window(p)));
    return (tile_args){.lay = lay, .table = kv_seq_table(s, cls), .layer = slot, .window = window};
}

void attn_tile(const kv_pool *p, const kv_seq *s, int layer, int kv_head, const float *q, size_t q_stride, int n_q,
               int pos0, float scale, int window, float *out, size_t out_stride, attn_scratch *scr) {
    tile_args a = layer_args(p, s, layer, window, scr);
    assert(kv_head >= 0 && kv_head < a.lay->n_head_kv && pos0 >= 0 && n_q >= 0 && pos0 + n_q <= kv_seq_len(s));
    a.kv_head = kv_head;
    a.q = q;
    a.q_stride = q_stride;
    a.scale = scale;
    a.k0 = 0;
    a.k1 = pos0 + n_q;
    a.out = out;
    a.out_stride = out_stride;
    run_tiles(&a, n_q, pos0, scr);
}

void attn_tile_part(const kv_pool *p, const kv_seq *s, int layer, int kv_head, const float *q, size_t q_stride,
                    int n_q, int pos0, float scale, int window, int k0, int k1, float *po, float *pml,
                    attn_scratch *scr) {
    tile_args a = layer_args(p, s, layer, window, scr);
    assert(kv_head >= 0 && kv_head < a.lay->n_head_kv && pos0 >= 0 && n_q >= 0 && pos0 + n_q <= kv_seq_len(s) &&
           k0 >= 0 && k0 <= k1);
    a.kv_head = kv_head;
    a.q = q;
    a.q_stride = q_stride;
    a.scale = scale;
    a.k0 = k0;
    a.k1 = k1;
    a.po = po;
    a.pml = pml;
    run_tiles(&a, n_q, pos0, scr);
}

void attn_merge(int n_parts, const float *const *po, const float *const *pml, int n_q, int group, int head_dim,
                int kv_head, float *out, size_t out_stride) {
    for (int r = 0; r < n_q * group; r++) {
        float m = -INFINITY;
        for (int i = 0; i < n_parts; i++) m = pml[i][2 * r] > m ? pml[i][2 * r] : m;
        assert(m > -INFINITY); /* every query sees at least its own key in some part */
        float *dst = out + (size_t)(r / group) * out_stride + (size_t)(kv_head * group + r % group) * head_dim;
        memset(dst, 0, (size_t)head_dim * sizeof(float));
        float l = 0;
        for (int i = 0; i < n_parts; i++) {
            if (pml[i][2 * r] == -INFINITY) continue; /* this part saw no key of the row */
            float w = expf(pml[i][2 * r] - m);
            l += w * pml[i][2 * r + 1];
            const float *o = po[i] + (size_t)r * head_dim;
            for (int d = 0; d < head_dim; d++) dst[d] += w * o[d];
        }
        float inv = 1.0f / l;
        for (int d = 0; d < head_dim; d++) dst[d] *= inv;
    }
}
