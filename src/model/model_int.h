/*
 * model_int.h - what model.c and model_hparams.c share while a model loads
 * (internal to model/; nothing outside the folder includes it).
 *
 * model.c owns the load: it opens the file, fills a `loader`, calls
 * model_read_hparams first, then reads, shards and packs the tensors.
 * model_hparams.c reads every `<arch>.*` key into lm_model.hp and the
 * vocabulary size from token_embd.weight's rows; it reads no tensor data
 * and allocates nothing. A failure is -1 with the message in L->err and its
 * kind in L->status (LM_ERR_FORMAT unless marked otherwise).
 */
#ifndef LAMINA_MODEL_INT_H
#define LAMINA_MODEL_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "model/model.h"

/* A set of architectures as a bit mask; gemma3's blocks (gemma3, gemma-embedding). */
#define ARCH(a) (1u << (a))
#define GEMMA3_ARCHS (ARCH(LM_ARCH_GEMMA3) | ARCH(LM_ARCH_GEMMA_EMBED))

/* Loader state: the model being built plus where the next float vector goes. */
typedef struct {
    lm_model *m;
    size_t f32_used, f32_cap;
    char *err;
    size_t errlen;
    lm_status status;        /* the kind of a failure: LM_ERR_FORMAT unless set otherwise */
    lm_progress_fn progress; /* may be NULL */
    void *progress_user;
    bool kv_b_whole; /* deepseek2 file with attn_kv_b unsplit (no *_length_mla keys) */
} loader;

/* Mark the failure being reported as not supported / out of memory; returns
 * -1, so `return unsupported(L), lm_err(...)` reads as one failure. */
static inline int unsupported(loader *L) {
    L->status = LM_ERR_UNSUPPORTED;
    return -1;
}
static inline int nomem(loader *L) {
    L->status = LM_ERR_NOMEM;
    return -1;
}

/* Read the hyperparameters (architecture, shape, RoPE and its scaling, each
 * family's options) into L->m->hp, every value range-checked, then the
 * vocabulary size. 0, or -1 with L->err set. */
int model_read_hparams(loader *L);

#endif
