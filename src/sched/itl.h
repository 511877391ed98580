/*
 * itl.h - the pass-time predictor behind the engine's latency bound: from
 * the passes it has run, what a decode-only pass takes and what a prompt
 * token adds, turned into the scheduler's chunk bound (sched_cap).
 *
 * The model. A pass that holds decodes and prompt chunks takes about
 *   t_dec + s x F(chunks)
 * seconds: t_dec, a decode-only pass's time, and F, the FLOPs of the
 * chunks' prompt tokens by the model's cost model (cost.h), linear in the
 * tokens and in the positions they attend (so a deep chunk costs more):
 * a chunk of n tokens at depth d is n x tok_flops + pos_flops x (n d +
 * n (n + 1) / 2). The cost model gives the shape (tok_flops, pos_flops,
 * read once from cost_forward at depths 0 and D); the passes give the two
 * scales, each a running mean (weight ITL_ALPHA on the newest pass):
 *   - t_dec from decode-only passes' times;
 *   - s, the seconds per prompt FLOP, from passes with prompt tokens: their
 *     time less t_dec when they also hold decodes, over their FLOPs (a pass
 *     that would give a negative or non-finite sample gives none).
 * Bound. With factor f, a pass beside decodes should take at most f x
 * t_dec, so its prompt chunks get a budget of (f - 1) x t_dec seconds at
 * s x tok_flops per token and s x pos_flops per attended position, and the
 * floor's tokens whatever they cost. Off until a decode-only pass was timed
 * (no t_dec: the scheduler plans as without a bound); with t_dec but no s
 * yet, a budget that buys nothing (the floor alone, a pass that teaches s).
 *
 * Pure arithmetic on a caller's struct, besides itl_init_model (which asks
 * cost.h); the engine calls it from its own thread only.
 */
#ifndef LAMINA_ITL_H
#define LAMINA_ITL_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"
#include "sched/sched.h"

#define ITL_ALPHA 0.25     /* the running means' weight on the newest pass */
#define ITL_FLOOR 16       /* prompt tokens a pass beside decodes takes at least */
#define ITL_FACTOR_DEF 0.0 /* lm_engine_config.itl_factor's default: no bound */

typedef struct {
    double factor;    /* a pass beside decodes takes at most factor x t_dec; 0: no bound */
    int floor;        /* prompt tokens such a pass takes at least */
    double tok_flops; /* FLOPs of a prompt token at depth 0, > 0 */
    double pos_flops; /* FLOPs per position a prompt token attends, >= 0 */
    double t_dec;     /* seconds of a decode-only pass, running mean; 0: none timed yet */
    double s_flop;    /* seconds per prompt FLOP, running mean; 0: none timed yet */
} itl_pred;

/* A predictor with the given shape (tok_flops > 0, pos_flops >= 0: else
 * 1 and 0, the tokens alone) and nothing timed. */
void itl_init(itl_pred *p, double factor, int floor, double tok_flops, double pos_flops);
/* The same with the shape from m's cost model (KV elements of kv_type,
 * the depth slope measured over n_ctx positions at most). */
void itl_init_model(itl_pred *p, double factor, int floor, const lm_model *m, uint32_t kv_type, int n_ctx);

/* The prompt FLOPs of a chunk of n tokens at depth. */
double itl_flops(const itl_pred *p, int n, int depth);
/* A pass timed: seconds, whether it held decodes, its prompt FLOPs (0: a
 * decode-only pass). */
void itl_observe(itl_pred *p, double seconds, bool decodes, double prompt_flops);
/* The bound for the next plan (sched_cap.on false: none). */
sched_cap itl_cap(const itl_pred *p);

#endif
