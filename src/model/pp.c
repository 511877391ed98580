/*
 * pp.c - this rank's part of a forward pass (pp.h): the runner between
 * fwd_run (run.c) and the local pass (fwd_pass, forward.c), which knows
 * nothing of the other ranks.
 *
 * Tensor parallel: the local pass's hooks are dist.h's rank-ordered
 * all-reduce and column gather over this stage's tensor group. Expert
 * parallel (ep.h): the MoE layers exchange rows through dist.h's all-to-all
 * and gather over the stage's expert group (with --tp too, the ranks of the
 * same tensor rank; a stage's ranks are ep x tp, world rank (stage * ep +
 * expert rank) * tp + tensor rank).
 *
 * Pipeline parallel: every rank runs the same calls (the command line's ranks in lockstep, or
 * a serving leader's followers from its plan, tp_plan.c), so each knows the
 * whole batch: tokens, segments, which rows want logits. A pass is cut into
 * micro-batches of consecutive rows; the i-th micro-batch of a stage is
 * received from the same rank of the previous stage (world rank
 * (stage - 1) * pp.tp + this rank's place in its stage), run through this stage's span by fwd_pass,
 * and sent to the next. Sends block until the receiver takes them, so
 * stage s computes micro-batch i + 1 while stage s + 1 computes i (the
 * GPipe forward schedule; no stage holds more than one micro-batch). After
 * the last micro-batch, the last stage's tensor rank 0 broadcasts the
 * logits rows to every rank, which all sample the same tokens.
 *
 * A row's arithmetic is the same whichever micro-batch holds it (forward.c),
 * so a pipelined pass gives the single process's logits bit for bit. A
 * hybrid model's recurrent layers keep that only when a sequence is cut
 * where the delta rule's pieces end (gdn.h): there micro-batches cut
 * segments on multiples of GDN_CHUNK positions (grid_cut), and a stage's
 * recurrent state (its own layers' only, lm_pp.rec0 .. rec1) advances
 * micro-batch by micro-batch in order.
 *
 * The scratch for cut segments grows to the largest pass and is kept.
 */
#include "model/pp.h"

#include "model/gdn.h"

#include "dist/dist.h"
#include "base/util.h"

static lm_seg *g_segs; /* (g_cap) segments of one micro-batch */
static int g_cap;
static pp_stats g_st;

void pp_stats_get(pp_stats *s) {
    *s = g_st;
    if (g_st.passes) s->bubble = g_st.bubble / (double)g_st.passes;
}
void pp_stats_reset(void) { g_st = (pp_stats){0}; }

static const fwd_hooks tp_hooks = {.reduce = dist_allreduce_sum,
                                   .gather_cols = dist_allgather_cols,
                                   .alltoallv = dist_alltoallv,
                                   .gather_ep = dist_ep_allgather_cols};

/* Rows of a segment cut at position p0 when take of its left rows fit
 * (take < left): a hybrid model's cut ends on a multiple of GDN_CHUNK
 * positions, where the delta rule's pieces end anyway (gdn.h), rounded
 * down when that leaves rows, else up (the micro-batch grows past its
 * share), so a cut segment gets the bits of the whole one. */
static int grid_cut(int p0, int take, int left) {
    int end = (p0 + take) / GDN_CHUNK * GDN_CHUNK;
    if (end > p0) return end - p0;
    end = (p0 / GDN_CHUNK + 1) * GDN_CHUNK;
    return end - p0 < left ? end - p0 : left;
}

/* A pipeline stage's pass: micro-batches received, run and sent on. */
static int stage_forward(lm_fwd *f, const fwd_span *span, const int32_t *tokens, int n, const lm_seg *segs, int n_seg,
                         float *logits, char *err, size_t errlen) {
    const lm_model *m = f->m;
    const lm_pp *pp = &m->pp;
    const size_t E = (size_t)m->hp.n_embd, V = (size_t)m->hp.n_vocab;
    const int in_stage = m->ep.rank * m->tp.size + m->tp.rank, last = pp->size - 1; /* this rank in its stage */
    const bool hybrid = m->hp.n_rlayer > 0;
    int micro = PP_MICRO_PER_STAGE * pp->size;
    if (micro > n) micro = n;
    if (n_seg + micro > g_cap) {
        lm_seg *p = lm_realloc(g_segs, (size_t)(n_seg + micro) * sizeof *p);
        if (!p) return lm_err(err, errlen, "out of memory for micro-batches");
        g_segs = p;
        g_cap = n_seg + micro;
    }
    int per = (n + micro - 1) / micro, g = 0, done_g = 0, row = 0, rows_out = 0, n_mb = 0;
    /* walk the segments, cutting them into micro-batches of up to per rows */
    while (row < n) {
        int rows = 0, ns = 0, mb_row0 = row, mb_logits = 0;
        bool cut = false;
        while (rows < per && g < n_seg && !cut) {
            const lm_seg *sg = &segs[g];
            int take = sg->n - done_g < per - rows ? sg->n - done_g : per - rows;
            if (hybrid && take < sg->n - done_g) take = grid_cut(sg->pos0 + done_g, take, sg->n - done_g);
            cut = take < sg->n - done_g;
            int lo = done_g > sg->n - sg->n_logits ? done_g : sg->n - sg->n_logits, hi = done_g + take;
            int nl = hi > lo ? hi - lo : 0;
            g_segs[ns++] = (lm_seg){.seq = sg->seq,
                                    .pos0 = sg->pos0 + done_g,
                                    .n = take,
                                    .n_logits = nl,
                                    .rconv = sg->rconv,
                                    .rmat = sg->rmat,
                                    .ck = sg->ck,
                                    .ck_slot = sg->ck_slot};
            mb_logits += nl;
            rows += take;
            done_g += take;
            if (done_g == sg->n) {
                g++;
                done_g = 0;
            }
        }
        int peer_prev = (pp->stage - 1) * pp->tp + in_stage, peer_next = (pp->stage + 1) * pp->tp + in_stage;
        if (pp->stage > 0 && dist_recv(f->x, (size_t)rows * E * sizeof(float), peer_prev, err, errlen)) return -1;
        double t0 = lm_now();
        float *out = logits && pp->stage == last ? logits + (size_t)rows_out * V : NULL;
        if (fwd_pass(f, span, tokens + mb_row0, rows, g_segs, ns, out, err, errlen)) return -1;
        g_st.compute_s += lm_now() - t0;
        if (pp->stage < last && dist_send(f->x, (size_t)rows * E * sizeof(float), peer_next, err, errlen)) return -1;
        rows_out += mb_logits;
        row += rows;
        n_mb++;
    }
    g_st.passes++;
    g_st.micro += (uint64_t)n_mb;
    g_st.bubble += (double)last / (double)(n_mb + last);
    if (!logits || !rows_out) return 0;
    double t0 = lm_now();
    int rc = dist_bcast(logits, (size_t)rows_out * V * sizeof(float), last * pp->tp, err, errlen);
    g_st.bcast_s += lm_now() - t0;
    return rc;
}

int pp_forward(lm_fwd *f, const int32_t *tokens, int n, const lm_seg *segs, int n_seg, float *logits, char *err,
               size_t errlen) {
    fwd_span span = fwd_span_stage(f->m, f->m->tp.size > 1 || f->m->ep.size > 1 ? &tp_hooks : NULL);
    if (f->m->pp.size > 1) return stage_forward(f, &span, tokens, n, segs, n_seg, logits, err, errlen);
    return fwd_pass(f, &span, tokens, n, segs, n_seg, logits, err, errlen);
}
