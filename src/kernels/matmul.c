/*
 * matmul.c - which kernels compute a matrix product, and the loops that
 * run them over a range of output rows (kernels.h: kernels_matmul_*).
 *
 * One ordered list of rules (rules[] below) names every path a product can
 * take, each with the tokens and columns it takes and the weight layout it
 * reads; kernels_matmul_fill() keeps, per tensor type and variant, the
 * rules whose kernels the table has, in that order, and
 * kernels_matmul_pick() walks the list and returns the first that applies
 * (through dispatch.c, which owns the table: the matmul_list_* functions
 * here are handed a type's entry). Each threshold stands in its rule's
 * line, or above it, with where its figure came from. A variant that lacks
 * a kernel (the scalar reference, avx2 without 512-bit tiles,
 * LAMINA_NO_REPACK) simply has fewer entries.
 *
 * Tiled paths (pair, wide, packed) cut the tokens into tiles of `tile`
 * (the type's pack_tile) and each tile of nc tokens runs the first tiled
 * entry that takes nc, so a product of 10 tokens on Q4_K in the avx512vnni
 * variant runs one wide tile of 8 and one pair tile of 2. Every path gives
 * a (row, token) the same bits as the type's packed_gemm or vec_dot (the
 * kernels' contracts, kernels.h), so the choice never changes a result.
 *
 * Bounds: tiles of at most PANEL_TOK tokens on the panel path (its carry
 * buffer), pack_tile on the others; row ranges are whole groups of the
 * interleaved layout except at the matrix's end. Compiled without ISA
 * flags: it only calls through pointers.
 */
#include <limits.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/matmul.h"
#include "kernels/x86_pair.h"
#include "kernels/x86_wide.h"

/* F16 panels by many tokens in k-blocks (mm_panel_rows): tokens in blocks
 * of PANEL_TOK, within a block two groups at a time, and for each block of
 * PANEL_K columns of those two groups the columns are widened to floats
 * once (2 x 16 x PANEL_K floats, 16 KiB: they stay in L1) and every token
 * tile of the block runs over them, its chains carried in st between
 * column blocks. The block's activations (PANEL_TOK rows) stay in L2
 * across the chunk's groups. Each (row, token) is the same fmaf chains in
 * the same order as packed_gemm's, so the bits do not depend on the
 * blocking. */
#define PANEL_K 128
#define PANEL_TOK 48
/* Fewer tokens: the widening does not pay. Set with the k-blocked tiles
 * (2026-12-02): a harness at 512 tokens, n = 2048, measured 115-124
 * GFLOP/s against 108-116 for the single-group tile (bench/README.md,
 * "F16 panels, k-blocked"); below two of the 12-token tiles the widened
 * block serves too few tokens. */
#define PANEL_MIN_TOK 24
#define PANEL_MIN_COLS 64 /* one column block at least: shorter rows gain nothing */

/* The activation bytes per block of tokens in the gemm loop (mm_gemm_rows):
 * about half the L2. */
#define GEMM_BLOCK_BYTES (256 * 1024)

/* Output rows per unit of work: a multiple of every quant_pack_rows (16
 * for F16 panels, 8 for the interleaved Q types). With four tiles' worth
 * of tokens or more, four times as many, so each token tile's activations
 * are read once per 64 rows rather than per 16. */
#define CHUNK_ROWS 16

typedef struct {
    lm_mm_kind kind;
    const char *name;
    bool packed, tiled;
    int min_tok, max_tok;
    int64_t min_cols;
} mm_rule;

/* The paths in the order they are tried. */
static const mm_rule rules[] = {
    /* F16 in the avx512 variants (kernels/avx512_gemm.h): k-blocked panel tiles, thresholds above */
    {LM_MM_PANEL, "panel", true, false, PANEL_MIN_TOK, INT_MAX, PANEL_MIN_COLS},
    /* the AVX-512 variants' decode tiles (kernels/x86_pair.h): a tile of up to LM_PAIR_TILE tokens
     * (4: the 512-bit accumulators of two groups by four tokens fill the registers; bench/README.md,
     * "Decode tiles", 0.82-1.09 of a plain read of the weights) */
    {LM_MM_PAIR, "pair", true, true, 1, LM_PAIR_TILE, 0},
    /* the VNNI variants' Q4_K prefill tile (kernels/x86_wide.h): the tiles wider than the pair tile,
     * up to the packed tile's width (LM_WIDE_TILE) */
    {LM_MM_WIDE, "wide", true, true, LM_PAIR_TILE + 1, LM_WIDE_TILE, 0},
    /* interleaved weights, one group per call: every token count (quant.h, kernels/avx2.h) */
    {LM_MM_PACKED, "packed", true, true, 1, INT_MAX, 0},
    /* row-major weights: the gemm tile where the type has one, else vec_dot */
    {LM_MM_GEMM, "gemm", false, false, 1, INT_MAX, 0},
    {LM_MM_DOT, "dot", false, false, 1, INT_MAX, 0},
};

/* The path rule r gives type t in table k; false when the table lacks its kernels. */
static bool mm_bind(const lm_kernels *k, uint32_t t, const mm_rule *r, lm_mm_path *p) {
    const lm_type_kernels *e = &k->type[t];
    const lm_type_traits *tr = quant_traits(t);
    memset(p, 0, sizeof *p);
    if (r->packed) {
        if (!e->packed_gemm) return false;
        p->tile = e->pack_tile;
        p->one = e->packed_gemm;
        p->act = e->packed_act ? LM_MM_ACT_PACKED : LM_MM_ACT_F32;
        p->conv = e->packed_act;
    } else {
        if (!e->vec_dot) return false;
        p->tile = e->gemm_cols;
        p->dot = e->vec_dot;
        p->act = tr->vec_dot_type == LM_TYPE_F32 ? LM_MM_ACT_F32 : LM_MM_ACT_VEC_DOT;
        p->conv = tr->vec_dot_type == LM_TYPE_F32 ? NULL : k->type[tr->vec_dot_type].from_float;
    }
    switch (r->kind) {
        case LM_MM_PANEL:
            if (!e->panel_widen || !e->panel2 || e->pack_tile > PANEL_TOK) return false;
            p->widen = e->panel_widen;
            p->panel2 = e->panel2;
            break;
        case LM_MM_PAIR: p->two = e->packed_pair; break;
        case LM_MM_WIDE: p->two = e->packed_wide; break;
        case LM_MM_GEMM: p->gemm = e->gemm; break;
        case LM_MM_PACKED:
        case LM_MM_DOT: break;
    }
    if ((r->kind == LM_MM_PAIR || r->kind == LM_MM_WIDE) && !p->two) return false;
    if (r->kind == LM_MM_GEMM && !p->gemm) return false;
    p->kind = r->kind;
    p->name = r->name;
    p->packed = r->packed;
    p->tiled = r->tiled;
    p->min_tok = r->min_tok;
    p->max_tok = r->max_tok;
    p->min_cols = r->min_cols;
    return true;
}

void kernels_matmul_fill(lm_kernels *k) {
    for (uint32_t t = 0; t < LM_TYPE_COUNT; t++) {
        lm_type_kernels *e = &k->type[t];
        e->n_mm = 0;
        if (!quant_traits(t)) continue;
        for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
            if (mm_bind(k, t, &rules[i], &e->mm[e->n_mm])) e->n_mm++;
    }
}

static bool mm_takes(const lm_mm_path *p, int n_tok, int64_t cols, bool has_copy) {
    return (has_copy || !p->packed) && n_tok >= p->min_tok && n_tok <= p->max_tok && cols >= p->min_cols;
}

const lm_mm_path *matmul_list_pick(const lm_type_kernels *e, int n_tok, int64_t cols, bool has_copy) {
    for (int i = 0; i < e->n_mm; i++)
        if (mm_takes(&e->mm[i], n_tok, cols, has_copy)) return &e->mm[i];
    return NULL;
}

bool matmul_list_packs(const lm_type_kernels *e) {
    for (int i = 0; i < e->n_mm; i++)
        if (e->mm[i].packed) return true;
    return false;
}

size_t kernels_matmul_act_row(uint32_t type, const lm_mm_path *p, int64_t cols) {
    switch (p->act) {
        case LM_MM_ACT_VEC_DOT: return quant_row_size(quant_traits(type)->vec_dot_type, cols);
        case LM_MM_ACT_PACKED: return quant_packed_x_row_size(type, cols);
        case LM_MM_ACT_F32: break;
    }
    return (size_t)cols * sizeof(float);
}

size_t matmul_list_scratch_row(const lm_type_kernels *e, uint32_t type, int64_t cols) {
    size_t row = 0;
    for (int i = 0; i < e->n_mm; i++) {
        size_t r = kernels_matmul_act_row(type, &e->mm[i], cols);
        if (e->mm[i].act != LM_MM_ACT_F32 && r > row) row = r;
    }
    return row;
}

/* The first tiled entry of the list that takes a tile of nc tokens. */
static const lm_mm_path *mm_tile_pick(const lm_type_kernels *e, int nc) {
    for (int i = 0; i < e->n_mm; i++) {
        const lm_mm_path *p = &e->mm[i];
        if (p->tiled && nc >= p->min_tok && nc <= p->max_tok) return p;
    }
    return NULL;
}

void matmul_list_plan(lm_mm_plan *pl, const lm_type_kernels *e, const lm_mm_path *p, int n_tok, int tile) {
    pl->path = p;
    pl->n_tok = n_tok;
    pl->tile = tile > 0 && p->packed ? tile : p->tile;
    pl->full = pl->last = NULL;
    if (!p->tiled) return;
    if (n_tok >= pl->tile) pl->full = mm_tile_pick(e, pl->tile);
    if (n_tok % pl->tile) pl->last = mm_tile_pick(e, n_tok % pl->tile);
}

long kernels_matmul_chunk_rows(const lm_mm_plan *pl) {
    return pl->path->packed && pl->n_tok >= 4 * pl->tile ? 4 * CHUNK_ROWS : CHUNK_ROWS;
}

/* The panel path over rows [r0, r1). */
static void mm_panel_rows(const lm_mm_plan *pl, const lm_mm_weight *w, long r0, long r1, const void *x, size_t x_row,
                          float *y) {
    const lm_mm_path *p = pl->path;
    const int tile = pl->tile, n_tok = pl->n_tok;
    const int64_t n = w->cols;
    const size_t gb = quant_pack_size(w->type, LM_PANEL_ROWS, n);
    _Alignas(64) float wf[2 * LM_PANEL_ROWS * PANEL_K]; /* (2, PANEL_K, 16): the two groups' widened columns */
    _Alignas(64) float st[PANEL_TOK * 2 * 48];          /* (PANEL_TOK, 2, 48): open chain, s0 + s1, s2 */
    for (int c0 = 0; c0 < n_tok; c0 += PANEL_TOK) {
        const int c1 = n_tok - c0 < PANEL_TOK ? n_tok : c0 + PANEL_TOK;
        for (long r = r0; r < r1; r += 2 * LM_PANEL_ROWS) {
            const int nr0 = r1 - r < LM_PANEL_ROWS ? (int)(r1 - r) : LM_PANEL_ROWS;
            const long rest = r1 - r - LM_PANEL_ROWS;
            const int nr1 = rest <= 0 ? 0 : rest < LM_PANEL_ROWS ? (int)rest : LM_PANEL_ROWS;
            const char *g0 = (const char *)w->packed + (size_t)(r / LM_PANEL_ROWS) * gb;
            for (int64_t k0 = 0; k0 < n; k0 += PANEL_K) {
                const int64_t k1 = n - k0 < PANEL_K ? n : k0 + PANEL_K;
                p->widen(g0, k0, k1, wf);
                if (nr1) p->widen(g0 + gb, k0, k1, wf + LM_PANEL_ROWS * (k1 - k0));
                for (int c = c0; c < c1; c += tile) {
                    const int nc = c1 - c < tile ? c1 - c : tile;
                    p->panel2(n, k0, k1, wf, nr0, nr1, (const char *)x + (size_t)c * x_row, x_row, nc,
                              st + (size_t)(c - c0) * 96, y + (size_t)c * (size_t)w->rows + r, (size_t)w->rows);
                }
            }
        }
    }
}

/* The tiled paths: groups of interleaved rows x tiles of tokens, tokens in
 * the outer loop, so the chunk's groups stay in cache across all tokens
 * and each token tile's activations across the groups. A two-group entry
 * runs its one-group kernel on a lone last group. */
static void mm_packed_rows(const lm_mm_plan *pl, const lm_mm_weight *w, long r0, long r1, const void *x, size_t x_row,
                           float *y) {
    const int gr = quant_pack_rows(w->type), tile = pl->tile, n_tok = pl->n_tok;
    const size_t gb = quant_pack_size(w->type, gr, w->cols);
    for (int c = 0; c < n_tok; c += tile) {
        const int nc = n_tok - c < tile ? n_tok - c : tile;
        const lm_mm_path *p = nc == tile ? pl->full : pl->last;
        for (long r = r0; r < r1;) {
            const bool two = p->two && r1 - r > gr;
            const int span = two ? 2 * gr : gr;
            const int nr = r1 - r < span ? (int)(r1 - r) : span;
            (two ? p->two : p->one)(w->cols, (const char *)w->packed + (size_t)(r / gr) * gb, nr,
                                    (const char *)x + (size_t)c * x_row, x_row, nc, y + (size_t)c * (size_t)w->rows + r,
                                    (size_t)w->rows);
            r += span;
        }
    }
}

/* Tiles of up to LM_GEMM_TILE weight rows x gemm_cols tokens: each weight
 * block is decoded once per tile of tokens, each activation block loaded
 * once per row tile. Float weights: the tokens go in blocks of
 * GEMM_BLOCK_BYTES of activations, and within a block each row tile meets
 * every token tile in turn, so its weights stay in L1 while the block's
 * activations stream from L2. Quantized weights (small rows, small 8-bit
 * activations): each token tile meets the chunk's row tiles in turn, the
 * chunk's rows staying in L2. */
static void mm_gemm_rows(const lm_mm_plan *pl, const lm_mm_weight *w, long r0, long r1, const void *x, size_t x_row,
                         float *y) {
    const int tc = pl->tile, n_tok = pl->n_tok;
    int bt = tc;
    if (!quant_traits(w->type)->is_quantized) {
        bt = (int)(GEMM_BLOCK_BYTES / x_row) / tc * tc;
        if (bt < tc) bt = tc;
    }
    for (int c0 = 0; c0 < n_tok; c0 += bt) {
        const int c1 = n_tok - c0 < bt ? n_tok : c0 + bt;
        for (long r = r0; r < r1; r += LM_GEMM_TILE) {
            const int nr = r1 - r < LM_GEMM_TILE ? (int)(r1 - r) : LM_GEMM_TILE;
            for (int c = c0; c < c1; c += tc) {
                const int nc = c1 - c < tc ? c1 - c : tc;
                pl->path->gemm(w->cols, (const char *)w->data + (size_t)r * w->row_bytes, w->row_bytes, nr,
                               (const char *)x + (size_t)c * x_row, x_row, nc, y + (size_t)c * (size_t)w->rows + r,
                               (size_t)w->rows);
            }
        }
    }
}

void kernels_matmul_rows(const lm_mm_plan *pl, const lm_mm_weight *w, long r0, long r1, const void *x, size_t x_row,
                         float *y) {
    switch (pl->path->kind) {
        case LM_MM_PANEL: mm_panel_rows(pl, w, r0, r1, x, x_row, y); return;
        case LM_MM_PAIR:
        case LM_MM_WIDE:
        case LM_MM_PACKED: mm_packed_rows(pl, w, r0, r1, x, x_row, y); return;
        case LM_MM_GEMM: mm_gemm_rows(pl, w, r0, r1, x, x_row, y); return;
        case LM_MM_DOT: break;
    }
    for (int t = 0; t < pl->n_tok; t++) {
        const char *xt = (const char *)x + (size_t)t * x_row;
        float *yt = y + (size_t)t * (size_t)w->rows;
        for (long r = r0; r < r1; r++)
            yt[r] = pl->path->dot(w->cols, (const char *)w->data + (size_t)r * w->row_bytes, xt);
    }
}
