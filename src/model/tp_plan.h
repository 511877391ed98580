/*
 * tp_plan.h - the leader and followers of a tensor-parallel job that serves:
 * rank 0 runs the engine (scheduler, sampling, HTTP) and, before each
 * forward pass, broadcasts the batch plan; every other rank runs the same
 * pass on its shard from that plan (tp_plan.c says what the plan holds).
 */
#ifndef LAMINA_TP_PLAN_H
#define LAMINA_TP_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/forward.h"

/* Leader (called by fwd_run when m->tp.lead): the pass's plan to every
 * follower. The first call also sends the KV pool's configuration and the
 * workspace's dims, from which the followers build their own. */
int tp_plan_send(lm_fwd *f, const int32_t *tokens, const lm_seg *segs, int n_seg, bool logits, char *err,
                 size_t errlen);
/* Leader, before the first pass: a hybrid model's state store (the
 * engine's, not owned; NULL: none), whose operations (rstate_log_start,
 * started here) each plan carries to the followers, which replay them on
 * stores of their own with the same slot counts (tp_plan.c). */
void tp_plan_state(rstate_pool *rs);
/* Leader: end the followers' loops (after the last pass). */
int tp_plan_stop(char *err, size_t errlen);
/* Follower: run passes on this rank's shard of m, from the leader's plans,
 * until tp_plan_stop; 0 then, -1 with a message when a plan cannot be
 * followed (the caller ends the job: the leader would wait forever). */
int tp_plan_follow(const lm_model *m, lm_pool *pool, char *err, size_t errlen);

#endif
