/*
 * attn.c - tiled causal (or, for encoders, non-causal) attention over the
 * paged KV cache (see attn.h for the recurrence and the contract).
 *
 * Work of one attn_tile call, for each sub-tile of nq query tokens
 * (R = nq x group rows, row r = query i = r / group, head g = r % group):
 *   1. Qs (R, hd) = the rows' query vectors times scale; m = -inf, l = 0, O = 0
 *   2. for each chunk of up to ATTN_KV_CHUNK positions c0 .. c0+nk-1 up to
 *      the sub-tile's last position (chunks on a fixed grid from the first
 *      key, so a row's chunking does not depend on how queries are tiled):
 *        gather the chunk's key rows (pointers into F32 blocks; for
 *        F16/Q8_0 pointers to the stored rows when R <= FUSE_ROWS, or for
 *        Q8_0 with integer scores whatever R, else rows converted once
 *        into Kf by the type's to_float)
 *        S (R, nk) = Qs · Kᵀ (integer scores: Qq · Kᵀ, Qq = Qs in Q8_0)
 *        per row: keys t in [lo, vis) are visible, vis = clamp(pos - c0 + 1,
 *        0, nk) (non-causal: vis = nk, the chunks running to kv_end instead
 *        of the last query's position) and lo > 0 only under a sliding window; m' = max(m, max S),
 *        p = exp(S - m') (masked keys get 0), l = l e^(m-m') + Σ p,
 *        O *= e^(m-m')
 *        gather the value rows likewise; O += P · V
 *   3. out = O / l
 * Step 2 runs once per split of ATTN_SPLIT positions (the chunks of a split
 * are the same chunks on the same grid), each from m = -inf, l = 0, O = 0;
 * each split's (m, l, O) is merged into the row's accumulator in ascending
 * order by merge_row, which starts from the sink's term, and step 3 divides
 * the accumulator. attn_tile_part stores the splits' states instead, and
 * attn_tile_merge runs the same merge_row over them in the same order.
 * Every visible key (and the sink) adds exp(s - m') <= 1 with the row's own
 * running max among them, so l >= 1 at the end and nothing overflows. A
 * sink is only the accumulator's starting state (m = σ, l = 1, O = 0): the
 * merge's rescaling shrinks it once a larger score comes, so it costs no
 * pass of its own.
 *
 * Scratch (floats): Qs, O, the accumulator's O (RMAX, hd); S (RMAX, CHUNK);
 * Kf, Vf (CHUNK, hd); m, l and the accumulator's m, l (RMAX); a zero row
 * (hd, read in place of keys and values of blocks released out of a
 * sliding window; its bytes are zeros in F16 and Q8_0 too); plus CHUNK row
 * pointers each for K and V, as floats, as stored rows and as the next
 * chunk's stored rows (the prefetch below; the next chunk's pointers become
 * its rows' rather than being gathered twice); and Qq, the
 * RMAX query rows in Q8_0 (where hd is a multiple of 32). RMAX = 64 rows,
 * so with hd = 128 a scratch is about 190 KiB whatever the context.
 *
 * Kernels: every inner loop (scores, P·V, row max, row scaling, exp-sum)
 * and the KV rows' conversion to float come from the kernel table
 * (kernels/kernels.h), fetched once per call: the table's attention
 * kernels where the head dimension suits them, else the scalar ones, and
 * the KV type's to_float, the same table entry kv_store's from_float sits
 * beside. LAMINA_NO_SIMD=1 therefore runs the scalar reference throughout.
 * F16 and Q8_0 rows: a sub-tile of up to FUSE_ROWS rows (a decode step:
 * one query's group of heads) runs the table's fused entries (scores_f16,
 * pv_f16, pv_q8_0; Q8_0 keys take the integer scores below), which read
 * the stored rows and convert in registers, so
 * the chunk is read from the pool once and never written to Kf / Vf; a
 * larger one (prefill) converts each chunk once, which its many rows
 * amortise. A variant without fused entries (NEON) always converts (but
 * for a Q8_0 cache's keys, which the integer scores below read). The
 * fused entries give exactly the bits of to_float then the float entry of
 * the same variant (kernels.h), so the choice, which depends on the
 * sub-tile's row count, never changes a row's result: batch invariance
 * holds across it (tests/test_attn_fused.c).
 * Q8_0 keys by integer dot products: where the table has scores_q8_0_q8
 * (the scalar reference and every variant, x86 and NEON), each sub-tile
 * quantizes its scaled query rows Qs once into Qq by the Q8_0 from_float
 * (the reference's bits in every variant) and every chunk's Q8_0 scores
 * come from the integer entry, whatever the sub-tile's row count: its
 * results are not the float entries' (the query is rounded), so taking it
 * for some sub-tiles only would break batch invariance. Its scores are the
 * scalar reference's bits in every variant (kernels.h). The values (P·V)
 * stay float: fused up to FUSE_ROWS rows, converted above (a latent
 * layout's values then converted from the key rows, which the integer
 * scores read in place).
 */
#include "kv/attn.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "format/quant.h"
#include "base/util.h"

#define RMAX 64
#define CHUNK ATTN_KV_CHUNK
/* Sub-tiles of up to this many rows read F16 / Q8_0 rows in place through
 * the fused kernels; larger ones convert each chunk once into Kf / Vf,
 * which their many rows amortise (see the Kernels paragraph above). On the
 * Xeon (avx512bf16 and avx2 tables, one 64-key chunk, head dims 64 and
 * 256) the fused pair took 0.3-0.8 of convert-then-float's time up to 8
 * rows and about as long or longer from 12 rows, Q8_0 first: its in-register
 * dequantization is repeated per group of 4 rows. */
#define FUSE_ROWS 8

struct attn_scratch {
    int group, hd, tq; /* tq = query tokens per sub-tile = max(1, RMAX / group) */
    int rows;          /* tq * group */
    size_t bytes;
    float *qs, *o;              /* (rows, hd) */
    float *s;                   /* (rows, CHUNK) scores, then probabilities */
    float *kf, *vf;             /* (CHUNK, hd) converted keys / values */
    float *m, *l;               /* (rows) */
    float *acc, *am, *al;       /* (rows, hd), (rows), (rows): the merged splits' O, m, l */
    float *zero;                /* (hd) zeros: stand-in for keys/values of released blocks */
    const float **krow, **vrow; /* (CHUNK) */
    const void **kraw, **vraw;  /* (CHUNK) rows in the cache's type, for the fused kernels */
    const void **kpf, **vpf;    /* (CHUNK) the next chunk's rows, which the fused kernels
                                   prefetch as they go; after them Qq (scr_qq) */
    struct {                    /* the chunk this scratch's last split asked for, ahead */
        const int32_t *table;   /* (NULL: none) */
        int layer, kv_head, c0;
    } asked;
    void *mem;
};

/* ---- scratch ------------------------------------------------------------------- */

/* the buffers alone */
static size_t buffer_bytes(int n_head, int n_head_kv, int head_dim) {
    int group = n_head / n_head_kv, tq = group >= RMAX ? 1 : RMAX / group;
    size_t R = (size_t)tq * (size_t)group, hd = (size_t)head_dim;
    size_t nf = 3 * R * hd + R * CHUNK + 2 * (size_t)CHUNK * hd + 4 * R + hd;
    size_t nq8 = hd % QK8_0 ? 0 : R * hd / QK8_0; /* Q8_0 blocks of the quantized queries (integer scores) */
    return nf * sizeof(float) + 2 * CHUNK * sizeof(float *) + 4 * CHUNK * sizeof(void *) + nq8 * sizeof(block_q8_0);
}

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
    size_t R = (size_t)scr->rows, hd = (size_t)scr->hd;
    scr->bytes = buffer_bytes(n_head, lay->n_head_kv, lay->head_dim);
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
    scr->acc = f, f += R * hd;
    scr->am = f, f += R;
    scr->al = f, f += R;
    scr->zero = f, f += hd;
    memset(scr->zero, 0, hd * sizeof(float));
    scr->krow = (const float **)(void *)f;
    scr->vrow = scr->krow + CHUNK;
    scr->kraw = (const void **)(void *)(scr->vrow + CHUNK);
    scr->vraw = scr->kraw + CHUNK;
    scr->kpf = scr->vraw + CHUNK;
    scr->vpf = scr->kpf + CHUNK;
    return scr;
}

void attn_scratch_free(attn_scratch *scr) {
    if (!scr) return;
    lm_free(scr->mem);
    lm_free(scr);
}

size_t attn_scratch_bytes(const attn_scratch *scr) { return scr->bytes + sizeof *scr; }

size_t attn_scratch_size(int n_head, int n_head_kv, int head_dim) {
    return buffer_bytes(n_head, n_head_kv, head_dim) + sizeof(attn_scratch);
}
int attn_tile_rows(const attn_scratch *scr) { return scr->rows; }

/* ---- the kernel --------------------------------------------------------------- */

/* Qq: (rows, hd / 32) block_q8_0, the sub-tile's Qs quantized for
 * scores_q8_0_q8 (allocated where hd is a multiple of 32), after the row
 * pointers. */
static block_q8_0 *scr_qq(const attn_scratch *scr) { return (block_q8_0 *)(void *)(scr->vpf + CHUNK); }

/* Row pointers of positions c0 .. c0+nk-1 of one (layer, K|V, head) slab:
 * straight into F32 blocks, else through rows converted into buf. Positions
 * below lo are visible to no row of the caller; their block may have been
 * released out of a sliding window (table entry -1), and then they read as
 * zeros (finite: their probability is 0, so they add exactly nothing). */
static void gather(const kv_layout *lay, const int32_t *table, int layer, int which, int kv_head, int c0, int nk,
                   int lo, lm_to_float_fn to_float, float *buf, const float *zero, const float **rows) {
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
        const uint8_t *src = kv_row(lay, b, slab, off);
        if (lay->type == LM_TYPE_F32) {
            for (int t = 0; t < seg; t++) rows[pos - c0 + t] = (const float *)(const void *)src + (size_t)t * hd;
        } else {
            float *dst = buf + (size_t)(pos - c0) * hd;
            to_float(src, dst, (int64_t)seg * hd);
            for (int t = 0; t < seg; t++) rows[pos - c0 + t] = dst + (size_t)t * hd;
        }
        pos += seg;
    }
}

/* gather's row pointers without a conversion: positions c0 .. c0+nk-1 of
 * one slab as rows in the cache's type, for the fused kernels; a released
 * block's rows read the zero row (all-zero bytes are 0 in F16 and in Q8_0,
 * and the hd floats of zero cover a row of either). */
static void gather_raw(const kv_layout *lay, const int32_t *table, int layer, int which, int kv_head, int c0, int nk,
                       int lo, const void *zero, const void **rows) {
    int B = lay->block_size;
    size_t slab = kv_slab_offset(lay, layer, which, kv_head);
    for (int pos = c0; pos < c0 + nk;) {
        int off = pos % B, seg = B - off < c0 + nk - pos ? B - off : c0 + nk - pos;
        int32_t b = table[pos / B];
        if (b < 0) assert(pos + seg <= lo); /* as in gather */
        const uint8_t *src = b < 0 ? NULL : kv_row(lay, b, slab, off);
        for (int t = 0; t < seg; t++) rows[pos - c0 + t] = src ? src + (size_t)t * lay->row_bytes : zero;
        pos += seg;
    }
}

/* Ask for the cache lines of positions c0 .. c0+nk-1 of one slab ahead of
 * use, all at once: consecutive chunks live in blocks scattered over the
 * pool, where the hardware prefetchers, which follow one page at a time,
 * do not reach. The slabs the fused kernels read take their spread
 * prefetch instead (split_partial). */
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
        const uint8_t *src = kv_row(lay, b, slab, off);
        size_t bytes = (size_t)seg * lay->row_bytes;
        for (size_t i = 0; i < bytes; i += 64) __builtin_prefetch(src + i);
        pos += seg;
    }
}

/* One call's fixed arguments. Keys considered: positions up to each
 * query's own (and, with a window, not below it). */
typedef struct {
    const kv_layout *lay; /* the layer's block class */
    const int32_t *table; /* the sequence's table for that class */
    int layer, kv_head;   /* layer: its index inside the class's blocks */
    const float *q;
    size_t q_stride;
    float scale;
    float softcap;      /* > 0: scores become softcap·tanh(s / softcap) before the softmax */
    int window;         /* > 0: query at pos sees keys pos-window+1 .. pos */
    int kv_end;         /* > 0: non-causal, every query sees keys 0 .. kv_end-1 (window 0) */
    int half;           /* > 0 with kv_end: a symmetric window, query at pos sees keys pos-half .. pos+half */
    const float *sinks; /* (n_head) one logit per query head in the softmax's denominator, or NULL */
    float *out;
    size_t out_stride;
    const lm_attn_kernels *k;        /* the table's inner loops for this head_dim */
    const lm_attn_kernels *kv;       /* the same for the value width (P·V, the output's scaling) */
    lm_to_float_fn to_float;         /* the KV type's rows to floats (not F32) */
    lm_attn_scores_kv_fn scores_kv;  /* k's fused scores for the KV type (F16), or NULL */
    lm_attn_pv_kv_fn pv_kv;          /* kv's fused P·V for the KV type (F16, Q8_0), or NULL */
    lm_attn_scores_q8q_fn scores_q8; /* Q8_0 keys: k's integer scores (every sub-tile), or NULL */
    lm_from_float_fn quant_q;        /* with scores_q8: floats to Q8_0 (the query rows) */
} tile_args;

/* Gemma 2's soft-capping of R rows of nk scores (row stride CHUNK). */
static void softcap_rows(float *S, int R, int nk, float cap) {
    for (int r = 0; r < R; r++)
        for (int j = 0; j < nk; j++) S[(size_t)r * CHUNK + j] = cap * tanhf(S[(size_t)r * CHUNK + j] / cap);
}

/* The keys a sub-tile of nq queries at qpos0 .. qpos0+nq-1 may see, as
 * [*c_begin, *c_end): up to the last query's position (non-causal, kv_end
 * > 0: up to kv_end; with a symmetric half-window, no further than the
 * last query's pos + half), and with a window from the chunk holding the first
 * query's window start (chunk starts stay on the multiple-of-CHUNK grid);
 * *wlo: no row sees a key below it. */
static void key_span(int nq, int qpos0, int window, int kv_end, int half, int *c_begin, int *c_end, int *wlo) {
    *c_end = kv_end > 0 ? kv_end : qpos0 + nq;
    if (half > 0 && qpos0 + nq + half < *c_end) *c_end = qpos0 + nq + half; /* the last query's window */
    *wlo = window > 0 ? qpos0 + 1 - window : half > 0 ? qpos0 - half : 0;
    *c_begin = *wlo > 0 ? *wlo / CHUNK * CHUNK : 0;
}

/* One split's partial state of R = nq x G rows over keys c_lo .. c_hi-1
 * (c_lo on the chunk grid): scr->m, l, o from m = -inf, l = 0, O = 0 by the
 * online recurrence; Qs already in scr->qs. A row that sees none of these
 * keys keeps l = 0. The chunk after each one is prefetched up to c_pf (the
 * sub-tile's last key + 1), across the split's end, so the next split
 * starts on fetched lines: by the kernels that read a slab's rows in place
 * (their pf rows, kernels.h: spread through the work, into L2), else all at
 * once by prefetch_chunk. The x86 kernels' spread prefetch read one
 * layer's cache from memory 1.3-1.4x faster than the burst on the Xeon
 * (kernels/x86_shadow.h). The split's first chunk, unless this scratch's
 * previous split asked for it (a thread's next unit of split-K, or the
 * next split of the same call), is asked for all at once here: a thread's
 * first unit of a layer, and every unit of a short sliding-window item. */
static void split_partial(const tile_args *a, int nq, int qpos0, int c_lo, int c_hi, int c_pf, int wlo,
                          attn_scratch *scr) {
    const kv_layout *lay = a->lay;
    int G = scr->group, hd = scr->hd, dv = lay->v_dim, R = nq * G, kh = a->kv_head;
    const lm_attn_kernels *k = a->k, *kv = a->kv;
    bool latent = lay->n_slab == 1;                /* values: the first dv elements of the key rows */
    bool fused_k = a->scores_kv && R <= FUSE_ROWS; /* key rows read in place, no Kf */
    bool fused_v = a->pv_kv && R <= FUSE_ROWS;     /* value rows likewise, no Vf */
    bool kint = a->scores_q8 != NULL;              /* keys read in place by integer dots, whatever R */
    bool kraw = kint || fused_k;                   /* scr->kraw holds the chunk's key rows */
    bool vown = fused_v && !latent;                /* the value kernel reads the value slab in place */
    for (int r = 0; r < R; r++) scr->m[r] = -INFINITY, scr->l[r] = 0;
    memset(scr->o, 0, (size_t)R * dv * sizeof(float)); /* O (R, dv) */
    if (!(scr->asked.table == a->table && scr->asked.layer == a->layer && scr->asked.kv_head == kh &&
          scr->asked.c0 == c_lo)) { /* a first chunk nobody asked for: all its lines at once */
        int n0 = c_pf - c_lo < CHUNK ? c_pf - c_lo : CHUNK;
        prefetch_chunk(lay, a->table, a->layer, 0, kh, c_lo, n0);
        if (!latent) prefetch_chunk(lay, a->table, a->layer, 1, kh, c_lo, n0);
    }
    scr->asked.table = NULL;
    /* The rows read in place: this chunk's (kcur, vcur) and the next one's
     * (knext, vnext), gathered for the kernels to prefetch; the next
     * iteration swaps them in rather than gathering the same rows again. */
    const void **kcur = scr->kraw, **knext = scr->kpf, **vcur = scr->vraw, **vnext = scr->vpf;
    int next_c0 = -1, next_n = 0; /* the chunk whose first next_n rows knext / vnext hold (kraw / vown) */
    for (int c0 = c_lo; c0 < c_hi; c0 += CHUNK) {
        int nk = c_hi - c0 < CHUNK ? c_hi - c0 : CHUNK;
        bool held = next_c0 == c0 && next_n >= nk;
        if (held) {
            const void **t = kcur;
            kcur = knext, knext = t, t = vcur, vcur = vnext, vnext = t;
        }
        next_c0 = -1;
        int npf = 0; /* rows of the next chunk in knext / vnext */
        if (c0 + CHUNK < c_pf) {
            npf = c_pf - c0 - CHUNK < CHUNK ? c_pf - c0 - CHUNK : CHUNK;
            if (kraw) gather_raw(lay, a->table, a->layer, 0, kh, c0 + CHUNK, npf, wlo, scr->zero, knext);
            else prefetch_chunk(lay, a->table, a->layer, 0, kh, c0 + CHUNK, npf);
            if (vown) gather_raw(lay, a->table, a->layer, 1, kh, c0 + CHUNK, npf, wlo, scr->zero, vnext);
            else if (!latent) prefetch_chunk(lay, a->table, a->layer, 1, kh, c0 + CHUNK, npf);
            next_c0 = c0 + CHUNK, next_n = npf;
        }
        const void *const *kpf = npf ? knext : NULL, *const *vpf = npf ? vnext : NULL;
        if (npf)
            scr->asked.table = a->table, scr->asked.layer = a->layer, scr->asked.kv_head = kh,
            scr->asked.c0 = c0 + CHUNK;
        if (kraw && !held) gather_raw(lay, a->table, a->layer, 0, kh, c0, nk, wlo, scr->zero, kcur);
        if (kint) {
            a->scores_q8(scr_qq(scr), R, hd, kcur, nk, scr->s, CHUNK, kpf, npf);
        } else if (fused_k) {
            a->scores_kv(scr->qs, R, hd, kcur, nk, scr->s, CHUNK, kpf, npf);
        } else {
            gather(lay, a->table, a->layer, 0, kh, c0, nk, wlo, a->to_float, scr->kf, scr->zero, scr->krow);
            k->scores(scr->qs, R, hd, scr->krow, nk, scr->s, CHUNK);
        }
        if (a->softcap > 0) softcap_rows(scr->s, R, nk, a->softcap);
        int nv = 0; /* values any row needs */
        for (int r = 0; r < R; r++) {
            float *s = scr->s + (size_t)r * CHUNK;
            /* visible keys of this row in the chunk: t in [lo, vis) */
            int pos = qpos0 + r / G, vis = a->kv_end > 0 ? nk : pos - c0 + 1;
            int lo = a->window > 0 ? pos + 1 - a->window - c0 : a->half > 0 ? pos - a->half - c0 : 0;
            if (a->half > 0 && pos + a->half + 1 - c0 < vis) vis = pos + a->half + 1 - c0;
            vis = vis < 0 ? 0 : vis > nk ? nk : vis;
            lo = lo < 0 ? 0 : lo > vis ? vis : lo;
            if (lo == vis) {
                memset(s, 0, (size_t)nk * sizeof(float));
                continue;
            }
            float mx = k->max(s + lo, vis - lo);
            float m_new = mx > scr->m[r] ? mx : scr->m[r];
            float sum = k->exp_sum(s + lo, vis - lo, m_new);
            if (lo) memset(s, 0, (size_t)lo * sizeof(float));
            if (vis < nk) memset(s + vis, 0, (size_t)(nk - vis) * sizeof(float));
            if (m_new > scr->m[r]) {
                float corr = expf(scr->m[r] - m_new); /* 0 on the row's first visible chunk */
                scr->l[r] *= corr;
                float *o = scr->o + (size_t)r * dv;
                kv->scale(o, o, dv, corr);
                scr->m[r] = m_new;
            }
            scr->l[r] += sum;
            nv = vis > nv ? vis : nv;
        }
        if (nv == 0) continue;
        if (fused_v) {
            if (!latent) {
                if (!held) gather_raw(lay, a->table, a->layer, 1, kh, c0, nv, wlo, scr->zero, vcur);
            } else if (!kraw) /* the keys were converted: the values' rows in place now */
                gather_raw(lay, a->table, a->layer, 0, kh, c0, nv, wlo, scr->zero, kcur);
            a->pv_kv(scr->o, R, dv, scr->s, CHUNK, latent ? kcur : vcur, nv, vown ? vpf : NULL, npf);
            continue;
        }
        if (!latent) gather(lay, a->table, a->layer, 1, kh, c0, nv, wlo, a->to_float, scr->vf, scr->zero, scr->vrow);
        else if (kraw) /* the keys were read in place: convert the values' prefix now */
            gather(lay, a->table, a->layer, 0, kh, c0, nv, wlo, a->to_float, scr->kf, scr->zero, scr->krow);
        kv->pv(scr->o, R, dv, scr->s, CHUNK, latent ? scr->krow : scr->vrow, nv);
    }
}

/* acc := acc ⊕ (m, l, o), the exact combination of two softmax partials
 * over disjoint keys: M = max(acc.m, m), L = acc.l e^(acc.m-M) + l e^(m-M),
 * O likewise. A partial with l = 0 saw no key and changes nothing. The one
 * function both the in-call merge and attn_tile_merge run, so they give the
 * same bits. */
static void merge_row(float *am, float *al, float *ao, float m, float l, const float *o, int dv) {
    if (l == 0) return;
    float mn = m > *am ? m : *am;
    float ca = expf(*am - mn), cb = expf(m - mn); /* ca = 0 while acc is empty (m = -inf) */
    *al = *al * ca + l * cb;
    for (int i = 0; i < dv; i++) ao[i] = ao[i] * ca + o[i] * cb;
    *am = mn;
}

/* The starting state of head h's accumulator: the sink's own term (m = σ,
 * l = 1, O = 0), or nothing. */
static void acc_start(const tile_args *a, int h, float *am, float *al, float *ao, int dv) {
    *am = a->sinks ? a->sinks[h] : -INFINITY;
    *al = a->sinks ? 1.0f : 0.0f;
    memset(ao, 0, (size_t)dv * sizeof(float));
}

/* One sub-tile: queries i0 .. i0+nq-1 of the call (positions qpos0 ..), all
 * heads of the group. part == NULL: every split of the keys in turn, merged
 * in order into scr's accumulator, then out = O / l. Else only splits
 * split0 .. split0+n_split-1 of the grid, each split's partial rows stored
 * at part + (split - split0) * split_floats + (i0 * G + r) * (dv + 2) as
 * (m, l, O[dv]) for attn_tile_merge (rows that see no key of a split get
 * l = 0). */
static void subtile(const tile_args *a, int i0, int nq, int qpos0, int split0, int n_split, float *part,
                    size_t split_floats, attn_scratch *scr) {
    int G = scr->group, hd = scr->hd, dv = a->lay->v_dim, R = nq * G, kh = a->kv_head;
    for (int r = 0; r < R; r++) {
        const float *src = a->q + (size_t)(i0 + r / G) * a->q_stride + (size_t)(kh * G + r % G) * hd;
        a->k->scale(scr->qs + (size_t)r * hd, src, hd, a->scale);
        if (a->scores_q8) a->quant_q(scr->qs + (size_t)r * hd, scr_qq(scr) + (size_t)r * (hd / QK8_0), hd);
    }
    int c_begin, c_end, wlo;
    key_span(nq, qpos0, a->window, a->kv_end, a->half, &c_begin, &c_end, &wlo);
    if (!part) {
        split0 = c_begin / ATTN_SPLIT;
        n_split = (c_end - 1) / ATTN_SPLIT + 1 - split0;
        for (int r = 0; r < R; r++)
            acc_start(a, kh * G + r % G, &scr->am[r], &scr->al[r], scr->acc + (size_t)r * dv, dv);
    }
    for (int sp = split0; sp < split0 + n_split; sp++) {
        int c_lo = sp * ATTN_SPLIT > c_begin ? sp * ATTN_SPLIT : c_begin;
        int c_hi = (sp + 1) * ATTN_SPLIT < c_end ? (sp + 1) * ATTN_SPLIT : c_end;
        if (c_lo < c_hi) split_partial(a, nq, qpos0, c_lo, c_hi, c_end, wlo, scr);
        else
            for (int r = 0; r < R; r++) scr->l[r] = 0; /* this sub-tile sees nothing of the split */
        for (int r = 0; r < R; r++) {
            const float *o = scr->o + (size_t)r * dv;
            if (!part) {
                merge_row(&scr->am[r], &scr->al[r], scr->acc + (size_t)r * dv, scr->m[r], scr->l[r], o, dv);
                continue;
            }
            float *dst = part + (size_t)(sp - split0) * split_floats + ((size_t)i0 * G + (size_t)r) * (size_t)(dv + 2);
            dst[0] = scr->m[r], dst[1] = scr->l[r];
            if (scr->l[r] != 0) memcpy(dst + 2, o, (size_t)dv * sizeof(float));
        }
    }
    if (part) return;
    for (int r = 0; r < R; r++) {
        const float *o = scr->acc + (size_t)r * dv;
        float *dst = a->out + (size_t)(i0 + r / G) * a->out_stride + (size_t)(kh * G + r % G) * dv;
        a->kv->scale(dst, o, dv, 1.0f / scr->al[r]);
    }
}

static void run_tiles(const tile_args *a, int n_q, int pos0, int split0, int n_split, float *part, attn_scratch *scr) {
    size_t split_floats = (size_t)n_q * (size_t)scr->group * (size_t)(a->lay->v_dim + 2);
    for (int i0 = 0; i0 < n_q; i0 += scr->tq) {
        int nq = n_q - i0 < scr->tq ? n_q - i0 : scr->tq;
        subtile(a, i0, nq, pos0 + i0, split0, n_split, part, split_floats, scr);
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
    tile_args a = {.lay = lay,
                   .table = kv_seq_table(s, cls),
                   .layer = slot,
                   .window = window,
                   .k = kernels_attn(scr->hd),
                   .kv = kernels_attn(lay->v_dim),
                   .to_float = lay->type == LM_TYPE_F32 ? NULL : kernels_type(lay->type)->to_float};
    /* the fused entries: F16 keys and values; Q8_0 values (a value width
     * of whole blocks: a latent layout's values are a prefix of the keys) */
    if (lay->type == LM_TYPE_F16) a.scores_kv = a.k->scores_f16, a.pv_kv = a.kv->pv_f16;
    if (lay->type == LM_TYPE_Q8_0 && lay->v_dim % QK8_0 == 0) a.pv_kv = a.kv->pv_q8_0;
    /* Q8_0 keys by integer dots against the quantized queries, in every
     * sub-tile (they are not the float entries' bits) */
    if (lay->type == LM_TYPE_Q8_0 && a.k->scores_q8_0_q8 && lay->head_dim % QK8_0 == 0)
        a.scores_q8 = a.k->scores_q8_0_q8, a.quant_q = kernels_type(LM_TYPE_Q8_0)->from_float;
    return a;
}

/* layer_args with one KV head's queries: rows q + i·q_stride, scaled by
 * scale before the softmax, logits capped by softcap (0: none). */
static tile_args query_args(const kv_pool *p, const kv_seq *s, int layer, int window, int kv_head, const float *q,
                            size_t q_stride, float scale, float softcap, attn_scratch *scr) {
    tile_args a = layer_args(p, s, layer, window, scr);
    a.kv_head = kv_head;
    a.q = q;
    a.q_stride = q_stride;
    a.scale = scale;
    a.softcap = softcap;
    return a;
}

void attn_tile(const kv_pool *p, const kv_seq *s, int layer, int kv_head, const float *q, size_t q_stride, int n_q,
               int pos0, float scale, int window, float *out, size_t out_stride, attn_scratch *scr) {
    attn_tile_softcap(p, s, layer, kv_head, q, q_stride, n_q, pos0, scale, 0, window, out, out_stride, scr);
}

void attn_tile_softcap(const kv_pool *p, const kv_seq *s, int layer, int kv_head, const float *q, size_t q_stride,
                       int n_q, int pos0, float scale, float softcap, int window, float *out, size_t out_stride,
                       attn_scratch *scr) {
    attn_tile_sinks(p, s, layer, kv_head, q, q_stride, n_q, pos0, scale, softcap, window, NULL, out, out_stride, scr);
}

void attn_tile_sinks(const kv_pool *p, const kv_seq *s, int layer, int kv_head, const float *q, size_t q_stride,
                     int n_q, int pos0, float scale, float softcap, int window, const float *sinks, float *out,
                     size_t out_stride, attn_scratch *scr) {
    tile_args a = query_args(p, s, layer, window, kv_head, q, q_stride, scale, softcap, scr);
    a.sinks = sinks;
    assert(kv_head >= 0 && kv_head < a.lay->n_head_kv && pos0 >= 0 && n_q >= 0 && pos0 + n_q <= kv_seq_len(s));
    a.out = out;
    a.out_stride = out_stride;
    run_tiles(&a, n_q, pos0, 0, 0, NULL, scr);
}

int attn_split_range(int n_q, int pos0, int window, int *first) {
    int c_begin, c_end, wlo;
    key_span(n_q, pos0, window, 0, 0, &c_begin, &c_end, &wlo);
    *first = c_begin / ATTN_SPLIT;
    return (c_end - 1) / ATTN_SPLIT + 1 - *first;
}

size_t attn_part_floats(const kv_pool *p, int layer, int n_q, const attn_scratch *scr) {
    int slot, cls = kv_layer_class(p, layer, &slot);
    return (size_t)n_q * (size_t)scr->group * (size_t)(kv_class_layout(p, cls)->v_dim + 2);
}

void attn_tile_part(const kv_pool *p, const kv_seq *s, int layer, int kv_head, const float *q, size_t q_stride, int n_q,
                    int pos0, float scale, float softcap, int window, int split0, int n_split, float *part,
                    attn_scratch *scr) {
    tile_args a = query_args(p, s, layer, window, kv_head, q, q_stride, scale, softcap, scr);
    assert(kv_head >= 0 && kv_head < a.lay->n_head_kv && pos0 >= 0 && n_q > 0 && pos0 + n_q <= kv_seq_len(s));
    assert(split0 >= 0 && n_split > 0 && part);
    run_tiles(&a, n_q, pos0, split0, n_split, part, scr);
}

void attn_tile_merge(const kv_pool *p, int layer, int kv_head, int n_q, const float *part, int n_split,
                     const float *sinks, float *out, size_t out_stride, attn_scratch *scr) {
    int slot, cls = kv_layer_class(p, layer, &slot);
    int G = scr->group, dv = kv_class_layout(p, cls)->v_dim, R = n_q * G;
    size_t split_floats = (size_t)R * (size_t)(dv + 2);
    tile_args a = {.sinks = sinks, .kv = kernels_attn(dv)};
    for (int r = 0; r < R; r++) {
        int h = kv_head * G + r % G;
        acc_start(&a, h, scr->am, scr->al, scr->acc, dv);
        for (int sp = 0; sp < n_split; sp++) {
            const float *src = part + (size_t)sp * split_floats + (size_t)r * (size_t)(dv + 2);
            merge_row(scr->am, scr->al, scr->acc, src[0], src[1], src + 2, dv);
        }
        a.kv->scale(out + (size_t)(r / G) * out_stride + (size_t)h * dv, scr->acc, dv, 1.0f / scr->al[0]);
    }
}

void attn_tile_full(const kv_pool *p, const kv_seq *s, int layer, int kv_head, const float *q, size_t q_stride, int n_q,
                    int pos0, int kv_end, float scale, float softcap, const float *sinks, float *out, size_t out_stride,
                    attn_scratch *scr) {
    attn_tile_sym(p, s, layer, kv_head, q, q_stride, n_q, pos0, kv_end, scale, softcap, 0, sinks, out, out_stride, scr);
}

void attn_tile_sym(const kv_pool *p, const kv_seq *s, int layer, int kv_head, const float *q, size_t q_stride, int n_q,
                   int pos0, int kv_end, float scale, float softcap, int half, const float *sinks, float *out,
                   size_t out_stride, attn_scratch *scr) {
    tile_args a = query_args(p, s, layer, 0, kv_head, q, q_stride, scale, softcap, scr);
    assert(half >= 0);
    a.half = half;
    assert(kv_head >= 0 && kv_head < a.lay->n_head_kv && pos0 >= 0 && n_q >= 0 && pos0 + n_q <= kv_end &&
           kv_end <= kv_seq_len(s));
    a.sinks = sinks;
    a.kv_end = kv_end;
    a.out = out;
    a.out_stride = out_stride;
    run_tiles(&a, n_q, pos0, 0, 0, NULL, scr);
}

int attn_sinks_check(const float *sinks, int n_head, char *err, size_t errlen) {
    for (int h = 0; h < n_head; h++)
        if (isnan(sinks[h]) || sinks[h] == INFINITY) {
            lm_err(err, errlen, "attention sink of head %d is %s (a sink must be finite or -inf)", h,
                   isnan(sinks[h]) ? "NaN" : "+inf");
            return -1;
        }
    return 0;
}
