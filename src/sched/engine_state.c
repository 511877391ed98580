/*
 * engine_state.c - the recurrent state of a hybrid model's running choices
 * (contract in engine_int.h): one live slot of the engine's state store
 * (kv/rstate.h) per running choice, taken at admission (zeroed, or copied
 * from choice 0 for a fork) and given back when the choice finishes, is
 * cancelled or is preempted; the choice's per-layer pointers (rptr) point
 * into it for the forward pass's segments. No-ops without recurrent layers.
 * Engine thread only.
 */
#include "sched/engine_int.h"

#include "kv/rstate.h"

/* Point c's per-layer arrays at its live slot. */
static void state_bind(lm_engine *e, eseq *c) {
    int R = e->m->hp.n_rlayer;
    for (int r = 0; r < R; r++) {
        c->rptr[r] = rstate_conv(e->rs, c->rslot, r);
        c->rptr[R + r] = rstate_mat(e->rs, c->rslot, r);
    }
}

/* A zeroed live slot (the state of position 0) for c, which starts from
 * position 0 (no prefix-cache hit for hybrid models): 0, or -1 with a
 * message (no slot free: the plan admitted past max_seqs). No-op without
 * recurrent layers. from: a running choice whose state c copies (a fork),
 * or NULL. */
int engine_state_take(lm_engine *e, eseq *c, const eseq *from, char *err, size_t errlen) {
    if (!e->rs) return 0;
    int s = from ? rstate_fork(e->rs, from->rslot, err, errlen) : rstate_acquire(e->rs, err, errlen);
    if (s < 0) return -1;
    c->rslot = s;
    state_bind(e, c);
    return 0;
}

/* Give c's slot back (finished, cancelled or preempted: a preempted choice
 * recomputes from position 0 with a fresh slot). */
void engine_state_drop(lm_engine *e, eseq *c) {
    if (!e->rs || c->rslot < 0) return;
    rstate_release(e->rs, c->rslot);
    c->rslot = -1;
}
