/*
 * kernels.h - the kernel table: which variant of every kernel this process
 * runs.
 *
 * One table, filled once at start-up from CPUID and the environment, is the
 * only place anything picks a kernel variant. It holds:
 *
 *   type[t]   per tensor type (quant.h): to_float (weights and KV rows to
 *             floats), from_float (floats to the type: activations and KV
 *             writes), vec_dot, the gemm tile and the interleaved-weight
 *             kernels with their tile sizes;
 *   ew        the element-wise ops of the forward pass (RMSNorm, SwiGLU,
 *             GeGLU, RoPE, the encoders' GELU);
 *   attn      the inner loops of tiled attention (scores, P·V, row max, row
 *             scaling, exp-and-sum; scores and P·V also fused with the
 *             F16 / Q8_0 KV rows' conversion; Q8_0 scores by integer dot
 *             products against quantized queries), reached through kernels_attn(); the
 *             online softmax around them (mask, windows, softcap, sinks)
 *             is kv/attn.c's, one for every variant;
 *   dn        the ops of a gated-DeltaNet linear-attention layer (causal
 *             conv with its rolling state, L2 norm, gated RMSNorm, decay
 *             gates, the delta rule token by token and chunkwise;
 *             contracts in kernels/deltanet.h);
 *   type[t].mm  the matrix-product paths of the type in the order tried
 *             (kernels/matmul.c), reached through kernels_matmul_pick().
 *
 * Each op has a scalar reference that defines what it computes (the tensor
 * types' in format/quant.c, the linear-attention ops' in kernels/deltanet.c,
 * the others in kernels/scalar.c); an ISA's files
 * (kernels/<isa>_*.c) provide its faster entries, and kernels/dispatch.c
 * chooses, per ISA in one function, which entries replace the reference.
 * Adding an ISA is: its files, an lm_isa value, its CPUID check, its lines
 * in that function.
 *
 * Environment (read once, when the table is filled):
 *   LAMINA_NO_SIMD=1    every entry stays the scalar reference (matrix
 *                       products, element-wise ops, attention, conversions)
 *   LAMINA_CPU=NAME     use the variant NAME (scalar; avx2, avxvnni, avx512,
 *                       avx512vnni, avx512bf16 on x86-64; neon, neondot on
 *                       AArch64), capped at the best the CPU runs down its
 *                       line (avx512bf16 -> avx512vnni -> avx512 -> avxvnni
 *                       -> avx2 -> scalar, neondot -> neon -> scalar;
 *                       kernels_cap_note says when it was capped); an
 *                       unknown name is ignored (kernels_cap_note says so
 *                       too). LAMINA_NO_SIMD wins.
 *   LAMINA_NO_REPACK=1  no interleaved-weight kernels (row-major ones only)
 *
 * What varies between variants, and what does not:
 *   - to_float and from_float give the reference's bits in every variant,
 *     so the KV cache and quantized activations hold the same bytes
 *     whichever ISA wrote them;
 *   - vec_dot, gemm and packed_gemm agree with the reference within float
 *     rounding (avx512bf16's BF16 kernels, which round the activations to
 *     BF16, within the bound kernels/avx512bf16_dot.c states); within one
 *     variant, gemm outputs equal vec_dot's bit for bit and packed_gemm
 *     outputs do not depend on the batch (kernels/avx2.h);
 *     packed_pair (the AVX-512 variants' 512-bit decode tiles over two
 *     groups, Q4_0, Q5_0, Q4_1, Q5_1, Q8_0, Q4_K) equals packed_gemm bit for bit;
 *     so does packed_wide (the VNNI variants' 512-bit prefill tile over two
 *     groups, Q4_K; kernels/x86_wide.h);
 *   - element-wise and attention variants agree with the reference to a few
 *     ulps (the integer Q8_0 scores, scores_q8_0_q8, give its bits), the
 *     linear-attention ones within the bounds
 *     tests/test_deltanet.c states; an element's result never depends on
 *     how many tokens share the call.
 *
 * Threads: reading the table is safe from any thread once kernels_init()
 * returned (kernels() calls it on first use). kernels_use() rewrites it in
 * place: tests and benchmarks only, with nothing else running.
 */
#ifndef LAMINA_KERNELS_H
#define LAMINA_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "format/quant.h"
#include "kernels/deltanet.h"

/* Instruction sets, in the order dispatch prefers them (higher is faster). */
typedef enum {
    LM_ISA_SCALAR = 0,     /* portable C: the reference of every op */
    LM_ISA_AVX2 = 1,       /* x86-64 AVX2 + FMA + F16C */
    LM_ISA_AVXVNNI = 2,    /* AVX2 + AVX-VNNI (VEX vpdpbusd) */
    LM_ISA_AVX512 = 3,     /* AVX2 + AVX-512 F/BW/VL */
    LM_ISA_AVX512VNNI = 4, /* AVX-512 F/BW/VL + AVX512-VNNI */
    LM_ISA_AVX512BF16 = 5, /* AVX512-VNNI + AVX512_BF16 (vdpbf16ps for BF16 weights) */
    LM_ISA_NEON = 6,       /* AArch64 Advanced SIMD (Armv8-A) */
    LM_ISA_NEONDOT = 7,    /* AArch64 NEON + the dot-product extension (sdot) */
    LM_ISA_COUNT
} lm_isa;

/* F16 panels in k-blocks (kernels/avx512_gemm.h, kernels/avx2.h): columns [k0, k1) of one
 * group widened to floats, and a tile of two groups by up to pack_tile
 * tokens over them, chains carried between blocks in st. */
typedef void (*lm_panel_widen_fn)(const void *wp, int64_t k0, int64_t k1, float *wf);
typedef void (*lm_panel2_fn)(int64_t n, int64_t k0, int64_t k1, const float *wf, int nr0, int nr1, const void *x,
                             size_t x_stride, int nc, float *st, float *y, size_t y_stride);

/* One way to compute a matrix product y = x · wᵀ for a weight type: which
 * kernels run, on which weight layout, with the activations in which
 * format, for how many tokens. Each type's list (lm_type_kernels.mm) holds
 * the paths its kernels allow, in the order of kernels/matmul.c's rules,
 * where each threshold stands beside its path with where its figure came
 * from. */
typedef enum {
    LM_MM_PANEL,  /* F16 panels in k-blocks: panel_widen + panel2, many tokens */
    LM_MM_PAIR,   /* interleaved copy, two groups per call (packed_pair), few tokens */
    LM_MM_WIDE,   /* interleaved copy, two groups per call (packed_wide), a tile's worth */
    LM_MM_PACKED, /* interleaved copy, one group per call (packed_gemm) */
    LM_MM_GEMM,   /* row-major weights, LM_GEMM_TILE rows x gemm_cols tokens (gemm) */
    LM_MM_DOT     /* row-major weights, one vec_dot per (row, token) */
} lm_mm_kind;

/* The activation rows a path reads. */
typedef enum {
    LM_MM_ACT_F32,     /* the floats as given */
    LM_MM_ACT_VEC_DOT, /* rows of the type's vec_dot_type (that type's from_float) */
    LM_MM_ACT_PACKED   /* rows of packed_act (quant_packed_x_row_size) */
} lm_mm_act;

#define LM_MM_MAX 6

typedef struct {
    lm_mm_kind kind;
    const char *name;        /* "panel", "pair", "wide", "packed", "gemm", "dot" */
    bool packed;             /* reads the weight's interleaved copy (quant.h), not its rows */
    bool tiled;              /* one kernel call per tile of `tile` tokens; the range is a tile's */
    int min_tok, max_tok;    /* tokens it takes: of the product, or of one tile where tiled */
    int64_t min_cols;        /* fewest weight columns it takes */
    int tile;                /* tokens per kernel call (gemm_cols, pack_tile) */
    lm_mm_act act;           /* the same for every entry of one layout of a type */
    lm_from_float_fn conv;   /* floats -> act's rows (NULL for LM_MM_ACT_F32) */
    lm_vec_dot_fn dot;       /* LM_MM_DOT */
    lm_gemm_fn gemm;         /* LM_MM_GEMM */
    lm_packed_gemm_fn one;   /* interleaved paths: one group (and a lone last group of PAIR, WIDE) */
    lm_packed_gemm_fn two;   /* PAIR, WIDE: two consecutive groups */
    lm_panel_widen_fn widen; /* PANEL */
    lm_panel2_fn panel2;
} lm_mm_path;

/* The kernels of one tensor type. An entry is NULL where the type has no
 * such kernel (types lamina does not compute with have all NULL). */
typedef struct {
    lm_to_float_fn to_float;       /* n elements of this type to floats */
    lm_from_float_fn from_float;   /* n floats to this type */
    lm_vec_dot_fn vec_dot;         /* weight row · activation row in vec_dot_type */
    lm_gemm_fn gemm;               /* tile matching vec_dot bit for bit, or NULL */
    int gemm_cols;                 /* activation rows per gemm call it is fastest with */
    lm_packed_gemm_fn packed_gemm; /* interleaved weights (quant.h), or NULL */
    lm_from_float_fn packed_act;   /* floats -> packed_gemm's activation rows;
                                        NULL: it takes the floats (F16 panels) */
    int pack_tile;                 /* most activation rows per packed_gemm call */
    lm_packed_gemm_fn packed_pair; /* two consecutive groups at once (kernels/x86_pair.h),
                                        bit-identical to packed_gemm; or NULL */
    int pair_tile;                 /* most activation rows per packed_pair call */
    lm_panel_widen_fn panel_widen; /* F16 panels, many tokens: k-blocked tiles bit-identical */
    lm_panel2_fn panel2;           /* to packed_gemm (both or neither), or NULL */
    lm_packed_gemm_fn packed_wide; /* two consecutive groups by pair_tile < nc <= pack_tile
                                        rows (prefill, kernels/x86_wide.h), bit-identical to
                                        packed_gemm; or NULL */
    lm_mm_path mm[LM_MM_MAX];      /* the matrix-product paths, in the order tried
                                        (kernels_matmul_pick) */
    int n_mm;
} lm_type_kernels;

/* Element-wise ops (contracts: model/ops.h). */
typedef struct {
    /* y = x / sqrt(mean(x^2) + eps) * w over n (y may alias x) */
    void (*rmsnorm)(float *y, const float *x, const float *w, int n, float eps);
    /* g = silu(g) * u */
    void (*swiglu)(float *g, const float *u, int n);
    /* g = gelu_tanh(g) * u */
    void (*geglu)(float *g, const float *u, int n);
    /* x = gelu_tanh(x) in place: geglu's activation without the product */
    void (*gelu)(float *x, int n);
    /* RoPE in place on n_heads heads of head_dim floats; neox: pairs
     * (i, i + n_rot/2), else adjacent pairs; cs = (cos, sin) per pair */
    void (*rope)(float *x, int n_heads, int head_dim, int n_rot, const float *cs, int neox);
} lm_ew_kernels;

/* Scores (F16) and P·V (F16, Q8_0) against KV rows in the cache's own
 * element type (F16: hd halves; Q8_0: hd / 32 block_q8_0s, hd a multiple
 * of 32), each element
 * converted in registers as the type's to_float would: the float entries'
 * contracts otherwise.
 * pf (these entries and scores_q8_0_q8): NULL, or npf rows of the same
 * type and width that the caller reads next (attention: the next chunk's).
 * An entry may ask for their cache lines as it goes, row t of pf beside
 * row t of its own for t < min(nk, npf): a hint, never read as data and
 * never a change to a result. The x86 entries ask, into L2, for each
 * line at the offset where they read the matching row (kernels/x86_shadow.h);
 * the scalar reference and NEON ignore it. */
typedef void (*lm_attn_scores_kv_fn)(const float *Q, int R, int hd, const void *const *krow, int nk, float *S,
                                     int s_stride, const void *const *pf, int npf);
typedef void (*lm_attn_pv_kv_fn)(float *O, int R, int hd, const float *P, int p_stride, const void *const *vrow, int nk,
                                 const void *const *pf, int npf);

/* Q8_0 scores by integer dot products: Qq holds R query rows already in
 * Q8_0 (hd / 32 block_q8_0s each, one row after the other), krow Q8_0 key
 * rows. The scalar reference (kernels/scalar.c) defines each score, and
 * every variant gives its bits: for block b of the row and lane j < 8, the
 * exact integer sum i_bj = Σ q_e k_e over the block's elements 4j .. 4j+3;
 * l_j = fma(dq_b * dk_b, (float)i_bj, l_j) over the blocks in order from
 * l_j = 0 (dq_b * dk_b, a product of two F16 scales, is exact in float);
 * the score ((l_0 + l_1) + (l_2 + l_3)) + ((l_4 + l_5) + (l_6 + l_7)). */
typedef void (*lm_attn_scores_q8q_fn)(const void *Qq, int R, int hd, const void *const *krow, int nk, float *S,
                                      int s_stride, const void *const *pf, int npf);

/* Attention inner loops (contracts: kernels/avx2_attn.h). `scale` is
 * called with n = head_dim only. The fused entries (scores_f16, pv_f16,
 * pv_q8_0; NULL where a variant has none: attention then converts the rows
 * to floats first) give, within one variant, the bits of to_float followed
 * by scores / pv, so the choice between them never changes a result.
 * scores_q8_0_q8 (set in the scalar reference and in every variant, x86 and
 * NEON) replaces the converted scores for a Q8_0 cache in every
 * sub-tile wherever it is set (kv/attn.c): its results differ from the
 * float entries' (the query is quantized), so it is all or nothing. */
typedef struct {
    void (*scores)(const float *Q, int R, int hd, const float *const *krow, int nk, float *S, int s_stride);
    void (*pv)(float *O, int R, int hd, const float *P, int p_stride, const float *const *vrow, int nk);
    lm_attn_scores_kv_fn scores_f16;
    lm_attn_pv_kv_fn pv_f16, pv_q8_0;
    lm_attn_scores_q8q_fn scores_q8_0_q8;
    float (*max)(const float *x, int n);
    void (*scale)(float *dst, const float *src, int n, float c);
    float (*exp_sum)(float *x, int n, float m);
    int head_multiple; /* head_dim must be a multiple of this (1: any) */
} lm_attn_kernels;

/* The FMA-rate probe: rounds x flops_per_round flops of independent
 * multiply-adds held in registers (nothing read from memory), the compute
 * roof `lamina bench --roofline` measures; the result only keeps the work
 * from being removed. */
typedef struct {
    float (*run)(long rounds);
    int flops_per_round;
} lm_peak_kernel;

typedef struct {
    lm_isa isa; /* the ISA whose entries were chosen */
    lm_type_kernels type[LM_TYPE_COUNT];
    lm_ew_kernels ew;
    lm_attn_kernels attn;
    lm_dn_kernels dn;
    lm_peak_kernel peak;
} lm_kernels;

/* Fill the table from CPUID and the environment (idempotent, thread-safe).
 * Called at start-up; kernels() calls it too, so a read never sees an
 * empty table. */
void kernels_init(void);

/* The table. */
const lm_kernels *kernels(void);

/* The kernels of one tensor type (a type lamina does not know: NULL). */
const lm_type_kernels *kernels_type(uint32_t type);

/* Matrix products (kernels/matmul.c). A weight as the paths read it: its
 * rows, and its interleaved copy or NULL. */
typedef struct {
    const void *data; /* (rows, cols) in type, row r at data + r * row_bytes */
    const void *packed;
    size_t row_bytes;
    int64_t rows, cols;
    uint32_t type;
} lm_mm_weight;

/* A product's kernels, resolved once per call: its path, and for a tiled
 * path the entries that take a full tile (`tile` tokens) and the last,
 * shorter one (n_tok % tile tokens, or n_tok < tile: the only one). */
typedef struct {
    const lm_mm_path *path;
    const lm_mm_path *full, *last;
    int tile, n_tok;
} lm_mm_plan;

/* The first path in type's list that takes n_tok tokens against cols
 * columns, on the interleaved copy only when has_copy (the weight has
 * one); NULL for a type lamina does not compute with. */
const lm_mm_path *kernels_matmul_pick(uint32_t type, int n_tok, int64_t cols, bool has_copy);

/* Whether a weight of this type should get an interleaved copy at load:
 * some path of its list reads one. */
bool kernels_matmul_packs(uint32_t type);

/* Bytes of one activation row of cols inputs in path p's format (cols
 * floats for LM_MM_ACT_F32, which reads them in place), and the most
 * scratch any path of the type needs for one row: its converted formats
 * only (0 when every path reads floats, or for an unknown type). */
size_t kernels_matmul_act_row(uint32_t type, const lm_mm_path *p, int64_t cols);
size_t kernels_matmul_scratch_row(uint32_t type, int64_t cols);

/* Resolve path p (picked for type with n_tok tokens) into pl. tile: the
 * tokens per call of an interleaved path (0: p->tile); products sharing
 * one activation pass take the first one's. */
void kernels_matmul_plan(lm_mm_plan *pl, uint32_t type, const lm_mm_path *p, int n_tok, int tile);

/* Output rows per unit of work handed to a thread (a multiple of every
 * type's quant_pack_rows). */
long kernels_matmul_chunk_rows(const lm_mm_plan *pl);

/* Rows [r0, r1) of y (n_tok, w->rows) = x · wᵀ by the plan, x being
 * n_tok rows of x_row bytes in the plan's activation format (r0 a
 * multiple of the chunk rows). A (row, token)'s bits do not depend on r0,
 * r1 or n_tok. */
void kernels_matmul_rows(const lm_mm_plan *pl, const lm_mm_weight *w, long r0, long r1, const void *x, size_t x_row,
                         float *y);

/* The attention kernels for a head dimension: the table's, or the scalar
 * ones where head_dim is not a multiple of their head_multiple. */
const lm_attn_kernels *kernels_attn(int head_dim);

/* "avx2", "neon", "scalar": the ISA of the table now. */
const char *kernels_isa_name(void);
/* The name of an ISA ("scalar", "avx2", "avx512vnni", "neon", ...). */
const char *kernels_isa_str(lm_isa isa);

/* The best ISA this CPU runs (capped by LAMINA_CPU when that is set), and
 * whether it runs a given one. */
lm_isa kernels_cpu_isa(void);
bool kernels_cpu_has(lm_isa isa);

/* Tests and benchmarks: fill the table with an ISA's entries (the scalar
 * reference for LM_ISA_SCALAR), or, with isa < 0, again from CPUID and the
 * environment (LAMINA_NO_SIMD, LAMINA_CPU). -1 when the CPU cannot run that ISA (table unchanged).
 * LAMINA_NO_REPACK is honoured in every case. Not thread-safe: call with
 * nothing else running. */
int kernels_use(int isa);

/* The ISA a LAMINA_CPU value names (scalar, avx2, avxvnni, avx512,
 * avx512vnni, avx512bf16, neon, neondot), or -1. */
int kernels_isa_parse(const char *name);

/* One line about LAMINA_CPU when the table was last filled from the
 * environment: why the variant differs from what was asked ("LAMINA_CPU=
 * avx512vnni: this CPU runs at most avx2"), or "" when it does not. */
const char *kernels_cap_note(void);

#endif
