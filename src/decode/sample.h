/*
 * sample.h - decoding policy: turning a row of logits into the next token.
 *
 * Order of operations (as llama.cpp and vLLM apply them): logit bias ->
 * repetition / frequency / presence penalties over the recent history ->
 * greedy if temp <= 0, else top-k -> top-p -> min-p -> temperature ->
 * softmax -> draw with the seeded RNG. The same seed and the same logits give
 * the same tokens on every run (and on every machine whose libm expf gives
 * the same results).
 *
 * Top-p and min-p act on the untempered distribution (softmax at temperature
 * 1), as in llama.cpp's default chain; temperature only reshapes what
 * survives. Ties between equal logits are broken towards the lower token id,
 * so the surviving set is always well defined.
 *
 * Non-finite logits: NaN is treated as -INFINITY (never drawn), +INFINITY as
 * the largest float (such tokens share all the mass). When every token is
 * -INFINITY / NaN (everything banned), sampler_sample returns -1.
 *
 * Cost per call: O(V) for the bias/penalty/sanitizing pass, top-k by a
 * bounded heap (O(V log k) worst case, O(V) typical); top-p without top-k
 * never sorts the vocabulary: one exp pass over V, then only tokens above
 * a threshold that provably holds the top-p mass are bucketed by logit and
 * just the bucket where the cut falls is ordered. No allocation happens
 * after sampler_new; a sampler holds 12 bytes per vocabulary entry (16 with
 * penalties on, 20 with penalties over the whole history).
 */
#ifndef LAMINA_SAMPLE_H
#define LAMINA_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include "lamina.h"
#include "base/util.h"

/* lm_sample_params is in lamina.h. */

void sample_params_default(
    lm_sample_params *p); /* temp 0.8, top_k 40, top_p 0.95, min_p 0.05, penalties off, window 64, seed 0 */

typedef struct lm_sampler lm_sampler;

/* NULL on allocation failure or n_vocab <= 0. Parameters are copied;
 * non-finite or non-positive repeat_penalty and non-finite freq/presence
 * penalties are treated as off, a NaN temp as greedy. */
lm_sampler *sampler_new(const lm_sample_params *p, int32_t n_vocab);
void sampler_free(lm_sampler *s);
void sampler_reset(lm_sampler *s);
/* Whether it picks the largest (biased, penalized) logit: temp <= 0 or NaN. */
bool sampler_greedy(const lm_sampler *s); /* clear history, reseed (biases are kept) */
/* Record a token in the penalty history (prompt tokens too, if wanted).
 * Out-of-range ids are ignored. */
void sampler_accept(lm_sampler *s, int32_t tok);
/* Make dst's penalty history a copy of src's (both made with the same
 * parameters and vocabulary; otherwise nothing happens). O(window): the
 * draft model's sampler follows its choice's this way. RNG and bias stay. */
void sampler_copy_history(lm_sampler *dst, const lm_sampler *src);
/* Additive bias on one token's logit (e.g. OpenAI logit_bias); -INFINITY bans it.
 * Setting a token again replaces its bias; 0 removes it; NaN counts as 0. */
void sampler_set_bias(lm_sampler *s, int32_t tok, float bias);
/* Pick the next token. logits (n_vocab) is used as scratch and modified.
 * Returns -1 only when every token is banned. */
int32_t sampler_sample(lm_sampler *s, float *logits);
/* sampler_sample over the tokens ids[0..n) alone (ascending, distinct, each
 * in [0, n_vocab)): the same token, and the same RNG and history state
 * after, as sampler_sample on a copy of logits where every other token is
 * -INFINITY, in O(n + history) instead of O(n_vocab) (a grammar's mask that
 * allows few tokens). logits (n_vocab) is read, not modified; scratch holds
 * n floats. -1 when every listed token is banned or n is 0. */
int32_t sampler_sample_sparse(lm_sampler *s, const float *logits, const int32_t *ids, int32_t n, float *scratch);
/* The distribution sampler_sample draws from, without drawing (the RNG is not
 * touched): writes the surviving token ids and their probabilities (summing
 * to 1, in no particular order; a token whose tempered weight underflows to
 * 0 is left out) into ids/probs, each of capacity n_vocab, and
 * returns their number (0 when every token is banned; greedy gives the argmax
 * with probability 1). logits is modified as by sampler_sample. */
int32_t sampler_dist(lm_sampler *s, float *logits, int32_t *ids, float *probs);

/* Index of the largest value (first on ties); NaN entries are skipped.
 * -1 when n <= 0 or every entry is NaN. */
int32_t sample_argmax(const float *x, int32_t n);

/* out[i] = log softmax(logits)[i], accumulated in double and stable for any
 * magnitude. NaN counts as -INFINITY and +INFINITY as the largest float; if
 * every entry is -INFINITY or NaN, every output is -INFINITY. out may be the
 * same array as logits. */
void sample_log_softmax(const float *logits, int32_t n, float *out);

/* The n largest entries of logprobs (n_vocab of them), largest first, ties to
 * the lower id, NaN counted as -INFINITY: writes min(n, n_vocab) ids and
 * values into ids/vals and returns that count (0 when n <= 0). */
int sample_top_n(const float *logprobs, int32_t n_vocab, int n, int32_t *ids, float *vals);

/* Speculative verification of one proposed token `draft` (the standard
 * rejection scheme): p is the distribution sampler_sample draws from this
 * row (every transform applied: bias, penalties, truncation, temperature;
 * a grammar's mask is the caller's, on the row first), q the proposer's
 * distribution over the vocabulary (n_vocab probabilities, the same
 * transforms applied), or NULL for a proposer that is certain (q a point
 * mass at draft, as prompt lookup). Accepts draft with probability
 * min(1, p(draft) / q(draft)); otherwise returns a draw from
 * max(0, p - q), normalised (p without draft for a point mass). The token
 * returned is then distributed exactly as sampler_sample's. Greedy: the
 * argmax, as sampler_sample (the caller compares it with draft). Two RNG
 * draws at most. *accepted says whether draft was taken. -1 when every token
 * is banned. logits is modified as by sampler_sample. */
int32_t sampler_sample_spec(lm_sampler *s, float *logits, int32_t draft, const float *q, bool *accepted);

#endif
