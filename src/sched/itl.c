/*
 * itl.c - the pass-time predictor (contract and model in itl.h).
 */
#include "sched/itl.h"

#include <math.h>

#include "model/cost.h"

void itl_init(itl_pred *p, double factor, int floor, double tok_flops, double pos_flops) {
    bool ok = tok_flops > 0 && isfinite(tok_flops) && pos_flops >= 0 && isfinite(pos_flops);
    *p = (itl_pred){.factor = factor,
                    .floor = floor > 0 ? floor : 0,
                    .tok_flops = ok ? tok_flops : 1,
                    .pos_flops = ok ? pos_flops : 0};
}

/* FLOPs of one pass of a chunk of n tokens at depth (its one logits row
 * included), or -1. */
static double pass_flops(const lm_model *m, uint32_t kv_type, int n, int depth) {
    cost_pass c;
    if (cost_forward(m, kv_type, 1, n, depth, &c, NULL, 0) != 0) return -1;
    return cost_total(&c).flops;
}

void itl_init_model(itl_pred *p, double factor, int floor, const lm_model *m, uint32_t kv_type, int n_ctx) {
    /* F(n, d) = head + n tok + pos (n d + n (n + 1) / 2): the differences
     * of F(1, 0), F(2, 0) and F(1, D) give pos, then tok; the logits row
     * (head) is left out, one per chunk next to many tokens */
    int D = n_ctx - 2 < 4096 ? n_ctx - 2 : 4096;
    double f10 = pass_flops(m, kv_type, 1, 0), f20 = pass_flops(m, kv_type, 2, 0);
    double f1d = D >= 1 ? pass_flops(m, kv_type, 1, D) : f10;
    double pos = D >= 1 ? (f1d - f10) / D : 0, tok = f20 - f10 - 2 * pos;
    if (f10 < 0 || f20 < 0 || f1d < 0 || pos < 0) tok = pos = -1; /* no cost model: tokens alone */
    itl_init(p, factor, floor, tok, pos);
}

double itl_flops(const itl_pred *p, int n, int depth) {
    double N = n, d = depth;
    return N * p->tok_flops + p->pos_flops * (N * d + N * (N + 1) / 2);
}

/* The running mean's next value (the first sample taken whole). */
static double mean_in(double mean, double x) { return mean > 0 ? mean + ITL_ALPHA * (x - mean) : x; }

void itl_observe(itl_pred *p, double seconds, bool decodes, double prompt_flops) {
    if (!(seconds > 0) || !isfinite(seconds)) return;
    if (prompt_flops <= 0) {
        if (decodes) p->t_dec = mean_in(p->t_dec, seconds);
        return;
    }
    if (decodes && p->t_dec <= 0) return; /* nothing yet to take the decodes' share out */
    double s = (seconds - (decodes ? p->t_dec : 0)) / prompt_flops;
    if (s > 0 && isfinite(s)) p->s_flop = mean_in(p->s_flop, s);
}

sched_cap itl_cap(const itl_pred *p) {
    if (!(p->factor > 0) || p->t_dec <= 0) return (sched_cap){.on = false};
    sched_cap c = {.on = true, .budget = -1, .floor = p->floor}; /* no s yet: a budget that buys nothing */
    if (p->s_flop > 0) {
        c.budget = (p->factor - 1) * p->t_dec;
        c.tok = p->s_flop * p->tok_flops;
        c.pos = p->s_flop * p->pos_flops;
    }
    return c;
}
