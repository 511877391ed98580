/*
 * dispatch.c - fills the kernel table (kernels.h).
 *
 * The table starts as the scalar reference of every op (format/quant.c for
 * the tensor types, kernels/scalar.c for the rest); fill() then lays the
 * chosen ISA's entries over it, type by type and op by op, so an ISA that
 * lacks a kernel keeps the reference for it. fill() is the one function
 * that knows which ISA provides what; the ISA's own files say which kernels
 * they have (avx2_kernels() for the tensor types).
 *
 * The ISA is the best the CPU runs (kernels_cpu_isa: CPUID and the OS's
 * saved register state, cpu.c), or scalar when LAMINA_NO_SIMD is set to
 * anything but "" or "0". LAMINA_CPU names a variant to use instead, capped
 * at the best one the CPU runs down its line (isa_below). LAMINA_NO_REPACK
 * (same rule as LAMINA_NO_SIMD) drops the interleaved-weight kernels. All
 * three are read when the table is filled.
 *
 * The x86 variants: avx2 (kernels/avx2_*.c), and avxvnni, avx512 and
 * avx512vnni (the same sources built again with their flags, kernels/x86.h),
 * and avx512bf16 (avx512vnni's, with BF16 weights through vdpbf16ps,
 * kernels/avx512bf16_dot.c): their matrix kernels replace avx2's, and in
 * the avx512 ones the 512-bit tiles of kernels/avx512_gemm.h replace some
 * of those; the element-wise and attention entries are avx2's in all of
 * them. The avx512 ones add their 512-bit decode tiles (packed_pair,
 * kernels/x86_pair.h) for Q4_0, Q5_0, Q4_1, Q5_1, Q8_0 and Q4_K
 * (avx512bf16 takes avx512vnni's, as it does its other Q kernels). The
 * linear-attention entries (kernels/deltanet.h) are avx2_dn_fill's in
 * avx2 and avxvnni, avx512_dn_fill's 512-bit ones in the avx512 variants.
 *
 * On AArch64 the variants are neon and neondot (kernels/neon.h: the same
 * kernels, the quantized dot products with sdot in the second), with the
 * element-wise and attention loops of kernels/neon_ops.h and the
 * linear-attention entries of neon_dn_fill (kernels/neon_deltanet.c) in
 * both; the integer Q8_0 scores (scores_q8_0_q8) are each variant's own
 * (kernels/neon_tiles.c: sdot in neondot).
 *
 * Once the entries are in place, kernels_matmul_fill (kernels/matmul.c)
 * derives each type's matrix-product path list from them.
 *
 * This file is compiled without ISA flags: it only stores pointers.
 */
#include "kernels/kernels.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/avx2.h"
#include "kernels/avx2_attn.h"
#include "kernels/avx2_ops.h"
#include "kernels/avx2_peak.h"
#include "kernels/avx512_gemm.h"
#include "kernels/deltanet.h"
#include "kernels/matmul.h"
#include "kernels/neon.h"
#include "kernels/neon_ops.h"
#include "kernels/scalar.h"
#include "kernels/x86.h"
#include "kernels/x86_pair.h"
#include "kernels/x86_wide.h"

static lm_kernels table;
static char cap_note[128]; /* kernels_cap_note: set when the table is filled from the environment */
static atomic_bool ready;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static const lm_attn_kernels scalar_attn = {.scores = scalar_attn_scores,
                                            .pv = scalar_attn_pv,
                                            .scores_f16 = scalar_attn_scores_f16,
                                            .pv_f16 = scalar_attn_pv_f16,
                                            .pv_q8_0 = scalar_attn_pv_q8_0,
                                            .scores_q8_0_q8 = scalar_attn_scores_q8_0_q8,
                                            .max = scalar_attn_max,
                                            .scale = scalar_attn_scale,
                                            .exp_sum = scalar_attn_exp_sum,
                                            .head_multiple = 1};

static bool env_set(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

#if defined(__x86_64__) || defined(__i386__)
/* The matrix kernels of an x86 variant for one type (NULL: none). */
static const lm_avx2_kernels *x86_lookup(lm_isa isa, uint32_t t) {
    switch (isa) {
        case LM_ISA_AVXVNNI: return avxvnni_kernels(t);
        case LM_ISA_AVX512: return avx512_kernels(t);
        case LM_ISA_AVX512VNNI: return avx512vnni_kernels(t);
        case LM_ISA_AVX512BF16: return avx512bf16_kernels(t);
        default: return avx2_kernels(t);
    }
}
#endif

/* The table for one ISA (which the CPU must run). */
static void fill(lm_kernels *k, lm_isa isa, bool repack) {
    memset(k, 0, sizeof *k);
    k->isa = isa;
    /* the reference of everything */
    for (uint32_t t = 0; t < LM_TYPE_COUNT; t++) {
        const lm_type_traits *tr = quant_traits(t);
        if (!tr) continue;
        k->type[t] = (lm_type_kernels){
            .to_float = tr->to_float, .from_float = tr->from_float, .vec_dot = tr->vec_dot, .gemm_cols = LM_GEMM_TILE};
    }
    k->ew = (lm_ew_kernels){scalar_rmsnorm, scalar_swiglu, scalar_geglu, scalar_gelu, scalar_rope};
    k->attn = scalar_attn;
    k->dn = (lm_dn_kernels){scalar_dn_conv,  scalar_dn_l2norm, scalar_dn_norm_gated,
                            scalar_dn_gates, scalar_dn_recur,  scalar_dn_chunk};
    k->peak = (lm_peak_kernel){scalar_fma_probe, SCALAR_PEAK_FLOPS};

    switch (isa) {
        case LM_ISA_AVX2:
        case LM_ISA_AVXVNNI:
        case LM_ISA_AVX512:
        case LM_ISA_AVX512VNNI:
        case LM_ISA_AVX512BF16:
#if defined(__x86_64__) || defined(__i386__)
            for (uint32_t t = 0; t < LM_TYPE_COUNT; t++) {
                const lm_avx2_kernels *a = x86_lookup(isa, t);
                if (!a) continue;
                lm_type_kernels *e = &k->type[t];
                if (a->to_float) e->to_float = a->to_float;
                if (a->from_float) e->from_float = a->from_float;
                if (a->vec_dot) {
                    e->vec_dot = a->vec_dot;
                    e->gemm = a->gemm;
                    if (a->gemm_cols) e->gemm_cols = a->gemm_cols;
                }
                if (a->packed_gemm) {
                    e->packed_gemm = a->packed_gemm;
                    e->packed_act = a->packed_act;
                    e->pack_tile = a->pack_tile;
                }
                /* the avx512 variants' 512-bit prefill tiles (kernels/avx512_gemm.h) */
                const lm_avx2_kernels *z = isa >= LM_ISA_AVX512 ? avx512_gemm_kernels(t, isa != LM_ISA_AVX512) : NULL;
                if (z && z->packed_gemm) {
                    e->packed_gemm = z->packed_gemm;
                    if (z->packed_act) e->packed_act = z->packed_act;
                    e->pack_tile = z->pack_tile;
                }
                if (isa >= LM_ISA_AVX512) avx512_gemm_panel2_lookup(t, &e->panel_widen, &e->panel2);
            }
            /* the AVX-512 variants' 512-bit decode tiles (kernels/x86_pair.h) */
            for (uint32_t t = 0; t < LM_TYPE_COUNT && isa >= LM_ISA_AVX512 && isa <= LM_ISA_AVX512BF16; t++) {
                lm_packed_gemm_fn pf = isa == LM_ISA_AVX512 ? avx512_pair_kernel(t) : avx512vnni_pair_kernel(t);
                if (!pf || !k->type[t].packed_gemm) continue;
                k->type[t].packed_pair = pf;
                k->type[t].pair_tile = LM_PAIR_TILE;
            }
            /* the VNNI variants' 512-bit prefill tiles (kernels/x86_wide.h) */
            for (uint32_t t = 0; t < LM_TYPE_COUNT && isa >= LM_ISA_AVX512VNNI && isa <= LM_ISA_AVX512BF16; t++) {
                lm_packed_gemm_fn wf = avx512vnni_wide_kernel(t);
                if (wf && k->type[t].packed_gemm && k->type[t].pack_tile <= LM_WIDE_TILE) k->type[t].packed_wide = wf;
            }
            k->ew = (lm_ew_kernels){avx2_rmsnorm, avx2_swiglu, avx2_geglu, avx2_gelu, avx2_rope_apply};
            k->attn = (lm_attn_kernels){.scores = attn_scores_avx2,
                                        .pv = attn_pv_avx2,
                                        .scores_f16 = attn_scores_f16_avx2,
                                        .pv_f16 = attn_pv_f16_avx2,
                                        .pv_q8_0 = attn_pv_q8_0_avx2,
                                        .scores_q8_0_q8 = attn_scores_q8_0_q8_avx2,
                                        .max = attn_max_avx2,
                                        .scale = attn_scale_avx2,
                                        .exp_sum = attn_exp_sum_avx2,
                                        .head_multiple = 8};
            if (isa >= LM_ISA_AVX512) avx512_attn_fill(&k->attn); /* 512-bit fused KV reads, the same bits */
            /* integer Q8_0 scores by vpdpbusd (the sign trick's bits) */
            if (isa == LM_ISA_AVXVNNI) avxvnni_attn_fill(&k->attn);
            if (isa >= LM_ISA_AVX512VNNI) avx512vnni_attn_fill(&k->attn);
            k->peak = (lm_peak_kernel){avx2_fma_probe, AVX2_PEAK_FLOPS};
            /* the linear-attention ops: AVX2's, the avx512 variants' 512-bit ones over them */
            avx2_dn_fill(&k->dn);
            if (isa >= LM_ISA_AVX512) avx512_dn_fill(&k->dn);
#endif
            break;
        case LM_ISA_NEON:
        case LM_ISA_NEONDOT:
#if defined(__aarch64__)
            for (uint32_t t = 0; t < LM_TYPE_COUNT; t++) {
                const lm_neon_kernels *a = neon_kernels(t, isa == LM_ISA_NEONDOT);
                if (!a) continue;
                lm_type_kernels *e = &k->type[t];
                if (a->to_float) e->to_float = a->to_float;
                if (a->from_float) e->from_float = a->from_float;
                if (a->vec_dot) {
                    e->vec_dot = a->vec_dot;
                    e->gemm = a->gemm;
                }
                if (a->packed_gemm) {
                    e->packed_gemm = a->packed_gemm;
                    e->packed_act = a->packed_act;
                    e->pack_tile = a->pack_tile;
                }
            }
            k->ew = (lm_ew_kernels){neon_rmsnorm, neon_swiglu, neon_geglu, neon_gelu, neon_rope};
            /* no fused F16 / Q8_0 entries: attention converts those rows first, but for Q8_0 keys,
             * which the integer scores of the variant's neon_tiles.c build read in place */
            k->attn = (lm_attn_kernels){.scores = neon_attn_scores,
                                        .pv = neon_attn_pv,
                                        .scores_q8_0_q8 = isa == LM_ISA_NEONDOT ? neon_dot_attn_scores_q8_0_q8
                                                                                : neon_attn_scores_q8_0_q8,
                                        .max = neon_attn_max,
                                        .scale = neon_attn_scale,
                                        .exp_sum = neon_attn_exp_sum,
                                        .head_multiple = 4};
            neon_dn_fill(&k->dn);
#endif
            break;
        case LM_ISA_SCALAR:
        case LM_ISA_COUNT: break;
    }

    if (!repack)
        for (int t = 0; t < LM_TYPE_COUNT; t++) {
            k->type[t].packed_gemm = NULL;
            k->type[t].packed_act = NULL;
            k->type[t].pack_tile = 0;
            k->type[t].packed_pair = NULL;
            k->type[t].pair_tile = 0;
            k->type[t].panel_widen = NULL;
            k->type[t].panel2 = NULL;
            k->type[t].packed_wide = NULL;
        }
    kernels_matmul_fill(k);
}

static lm_isa cpu_isa_noted(char *note, size_t len);

/* The ISA the environment asks for, on this CPU. */
static lm_isa env_isa(void) {
    cap_note[0] = 0;
    if (env_set("LAMINA_NO_SIMD")) return LM_ISA_SCALAR;
    return cpu_isa_noted(cap_note, sizeof cap_note);
}

static void init_once(void) {
    fill(&table, env_isa(), !env_set("LAMINA_NO_REPACK"));
    atomic_store_explicit(&ready, true, memory_order_release);
}

void kernels_init(void) { pthread_once(&once, init_once); }

const lm_kernels *kernels(void) {
    if (!atomic_load_explicit(&ready, memory_order_acquire)) kernels_init();
    return &table;
}

const lm_type_kernels *kernels_type(uint32_t type) {
    if (type >= LM_TYPE_COUNT || !quant_traits(type)) return NULL;
    return &kernels()->type[type];
}

const lm_mm_path *kernels_matmul_pick(uint32_t type, int n_tok, int64_t cols, bool has_copy) {
    const lm_type_kernels *e = kernels_type(type);
    return e ? matmul_list_pick(e, n_tok, cols, has_copy) : NULL;
}

bool kernels_matmul_packs(uint32_t type) {
    const lm_type_kernels *e = kernels_type(type);
    return e && matmul_list_packs(e);
}

size_t kernels_matmul_scratch_row(uint32_t type, int64_t cols) {
    const lm_type_kernels *e = kernels_type(type);
    return e ? matmul_list_scratch_row(e, type, cols) : 0;
}

void kernels_matmul_plan(lm_mm_plan *pl, uint32_t type, const lm_mm_path *p, int n_tok, int tile) {
    matmul_list_plan(pl, kernels_type(type), p, n_tok, tile);
}

const lm_attn_kernels *kernels_attn(int head_dim) {
    const lm_attn_kernels *a = &kernels()->attn;
    return head_dim % a->head_multiple == 0 ? a : &scalar_attn;
}

const char *kernels_isa_str(lm_isa isa) {
    switch (isa) {
        case LM_ISA_SCALAR: return "scalar";
        case LM_ISA_AVX2: return "avx2";
        case LM_ISA_AVXVNNI: return "avxvnni";
        case LM_ISA_AVX512: return "avx512";
        case LM_ISA_AVX512VNNI: return "avx512vnni";
        case LM_ISA_AVX512BF16: return "avx512bf16";
        case LM_ISA_NEON: return "neon";
        case LM_ISA_NEONDOT: return "neondot";
        case LM_ISA_COUNT: break;
    }
    return "unknown";
}

int kernels_isa_parse(const char *name) {
    for (int i = 0; name && i < LM_ISA_COUNT; i++)
        if (!strcmp(name, kernels_isa_str((lm_isa)i))) return i;
    return -1;
}

const char *kernels_cap_note(void) {
    kernels_init();
    return cap_note;
}

const char *kernels_isa_name(void) { return kernels_isa_str(kernels()->isa); }

/* The variant below an ISA in its line, the one LAMINA_CPU falls back to:
 * avx512bf16 -> avx512vnni -> avx512 -> avxvnni -> avx2 -> scalar,
 * neondot -> neon -> scalar. */
static lm_isa isa_below(lm_isa isa) {
    switch (isa) {
        case LM_ISA_NEONDOT: return LM_ISA_NEON;
        case LM_ISA_AVXVNNI:
        case LM_ISA_AVX512:
        case LM_ISA_AVX512VNNI:
        case LM_ISA_AVX512BF16: return (lm_isa)(isa - 1);
        default: return LM_ISA_SCALAR;
    }
}

/* The best ISA the CPU runs down the line from `cap`. */
static lm_isa best_upto(lm_isa cap) {
    lm_isa i = cap;
    while (i != LM_ISA_SCALAR && !kernels_cpu_has(i)) i = isa_below(i);
    return i;
}

/* The best ISA the CPU runs, capped by LAMINA_CPU; a line into note (of
 * len bytes, "" when none) when that name is unknown or capped. */
static lm_isa cpu_isa_noted(char *note, size_t len) {
    note[0] = 0;
    const char *v = getenv("LAMINA_CPU");
    lm_isa best = best_upto(LM_ISA_AVX512BF16);
    if (best == LM_ISA_SCALAR) best = best_upto(LM_ISA_NEONDOT);
    if (!v || !*v) return best;
    int want = kernels_isa_parse(v);
    if (want < 0) {
        snprintf(note, len, "LAMINA_CPU=%.40s: no such variant, using %s", v, kernels_isa_str(best));
        return best;
    }
    lm_isa got = best_upto((lm_isa)want);
    if ((int)got != want)
        snprintf(note, len, "LAMINA_CPU=%s: this CPU does not run it, using %s", v, kernels_isa_str(got));
    return got;
}

lm_isa kernels_cpu_isa(void) {
    char note[128];
    return cpu_isa_noted(note, sizeof note);
}

bool kernels_cpu_has(lm_isa isa) {
    switch (isa) {
        case LM_ISA_SCALAR: return true;
        case LM_ISA_AVX2: return cpu_has_avx2();
        case LM_ISA_AVXVNNI: return cpu_has_avxvnni();
        case LM_ISA_AVX512: return cpu_has_avx512();
        case LM_ISA_AVX512VNNI: return cpu_has_avx512vnni();
        case LM_ISA_AVX512BF16: return cpu_has_avx512bf16();
        case LM_ISA_NEON: return cpu_has_neon();
        case LM_ISA_NEONDOT: return cpu_has_neon_dot();
        case LM_ISA_COUNT: break;
    }
    return false;
}

int kernels_use(int isa) {
    kernels_init();
    bool repack = !env_set("LAMINA_NO_REPACK");
    if (isa < 0) {
        fill(&table, env_isa(), repack);
        return 0;
    }
    if (isa >= LM_ISA_COUNT || !kernels_cpu_has((lm_isa)isa)) return -1;
    fill(&table, (lm_isa)isa, repack);
    return 0;
}
