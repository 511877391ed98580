/*
 * sample.h - decoding policy: turning a row of logits into the next token.
 *
 * Order of operations (as llama.cpp and vLLM apply them): logit bias ->
 * repetition / frequency / presence penalties over the recent history ->
 * greedy if temp <= 0, else top-k -> top-p -> min-p -> temperature ->
 * softmax -> draw with the seeded RNG. The same seed and the same logits give
 * the same tokens on every run and machine.
 */
#ifndef LAMINA_SAMPLE_H
#define LAMINA_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include "util.h"

typedef struct {
    float temp;            /* <= 0: greedy */
    int top_k;             /* <= 0: off */
    float top_p;           /* >= 1: off */
    float min_p;           /* <= 0: off */
    float repeat_penalty;  /* 1: off (llama.cpp semantics: divide positive logits, multiply negative) */
    int repeat_last_n;     /* history window for penalties; 0: off, -1: whole history */
    float freq_penalty;    /* OpenAI semantics: logit -= count * freq_penalty */
    float presence_penalty;/* logit -= (count > 0) * presence_penalty */
    uint64_t seed;
} lm_sample_params;

void sample_params_default(lm_sample_params *p); /* temp 0.8, top_k 40, top_p 0.95, min_p 0.05, penalties off, window 64, seed 0 */

typedef struct lm_sampler lm_sampler;

lm_sampler *sampler_new(const lm_sample_params *p, int32_t n_vocab);
void sampler_free(lm_sampler *s);
void sampler_reset(lm_sampler *s);               /* clear history, reseed */
/* Record a token in the penalty history (prompt tokens too, if wanted). */
void sampler_accept(lm_sampler *s, int32_t tok);
/* Additive bias on one token's logit (e.g. OpenAI logit_bias); -INFINITY bans it. */
void sampler_set_bias(lm_sampler *s, int32_t tok, float bias);
/* Pick the next token. logits (n_vocab) is used as scratch and modified. */
int32_t sampler_sample(lm_sampler *s, float *logits);

/* Index of the largest value (first on ties). */
int32_t sample_argmax(const float *x, int32_t n);

#endif
