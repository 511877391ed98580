/*
 * engine_test.h - the engine set-up the engine tests share: the test model
 * loaded, and an engine over it with the tests' settings (2 threads, an F32
 * KV cache so that every comparison with a float64 reference is exact to
 * float rounding, the batch, sequence and KV budgets each test chooses;
 * everything else at engine_config_default's values).
 *
 * A test that needs more (speculation, a grammar cache) fills its config
 * with test_engine_config and sets its own fields before engine_new.
 */
#ifndef LAMINA_ENGINE_TEST_H
#define LAMINA_ENGINE_TEST_H

#include <stdint.h>
#include <stdio.h>

#include "model/model.h"
#include "sched/engine.h"
#include "test.h"

static inline void test_engine_config(lm_engine_config *ec, int batch_tokens, int max_seqs, uint64_t kv_mem) {
    engine_config_default(ec);
    ec->n_threads = 2;
    ec->batch_tokens = batch_tokens;
    ec->max_seqs = max_seqs;
    ec->kv_mem = kv_mem;
    ec->kv_type = LM_TYPE_F32;
}

/* An engine over m with test_engine_config's settings; NULL with the
 * reason on stderr. */
static inline lm_engine *test_engine_new(const lm_model *m, int batch_tokens, int max_seqs, uint64_t kv_mem) {
    lm_engine_config ec;
    test_engine_config(&ec, batch_tokens, max_seqs, kv_mem);
    char err[LM_ERRLEN];
    lm_engine *e = engine_new(m, m->tok, &ec, err, sizeof err);
    if (!e) fprintf(stderr, "engine_new: %s\n", err);
    return e;
}

/* TEST_MODEL loaded; NULL with the reason on stderr. */
static inline lm_model *test_model_load(void) {
    char err[LM_ERRLEN];
    lm_model *m = model_load(TEST_MODEL, err, sizeof err);
    if (!m) fprintf(stderr, "%s\n", err);
    return m;
}

#endif
