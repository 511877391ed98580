/*
 * engine_mtp.c - the target's states for the next-token-prediction
 * proposer (proposer_mtp.c, LM_SPEC_MTP).
 *
 * The forward pass writes every batch row's state after the final norm into
 * lm_fwd.hid (in the order of the batch's tokens, segment after segment)
 * when the proposer gives it a buffer. After the pass, each choice's
 * settled positions (a prompt chunk, a decoded token, a verified
 * proposal's pending token and accepted guesses, never a rejected one) go
 * to the proposer with their rows, before the next pass overwrites them.
 */
#include "sched/engine_int.h"

void engine_mtp_feed(lm_engine *e, eseq *c) {
    const float *hid = e->fwd->hid;
    if (!hid || !e->prop) return;
    size_t row = 0;
    /* c's segment: the arrays hold max_seqs entries, the batch's first; a choice
     * fed here is in the batch, so its first match is its segment of this pass */
    for (int g = 0; g < e->cfg.max_seqs; g++) {
        if (e->seg_ch[g] == c) {
            int pos0 = e->segs[g].pos0, n = c->n_computed - pos0;
            if (n > e->segs[g].n) n = e->segs[g].n;
            spec_prop_hidden(e->prop, &c->ps, c->tokens, pos0, hid + row * (size_t)e->m->hp.n_embd, n);
            return;
        }
        row += (size_t)e->segs[g].n;
    }
}
