/*
 * test_deltanet.c - the linear-attention kernels (kernels/deltanet.h) of
 * every variant this CPU runs (scalar, avx2, avx512, neon; the other x86
 * variants and neondot carry one of those sets, which test_dispatch
 * checks) against float64 references written here, and against each
 * other.
 *
 *  - conv: y and the rolled state against a float64 conv (SiLU on and
 *    off), k = 1..8 taps, 1..520 channels (past the SIMD channel tile),
 *    rows wider than the channels: |y - ref| <= 1e-6 (sum_i |w_i x_i| +
 *    |ref|) (measured: 1.2e-7), the state exact, nothing outside the
 *    channels written. A prompt in one call, token by token, and split in
 *    two give the same y and state bit for bit; so do two channel ranges
 *    and the whole.
 *  - l2norm (also a zero row and rows whose norm is under eps: the eps
 *    floor) and norm_gated: |y - ref| <= 1e-6 |ref| + 1e-30 (measured:
 *    under 3e-7), in place too.
 *  - gates: g and beta against float64 softplus and sigmoid of the float
 *    sum a + dt_bias (both sides of the threshold at 20): 1e-6 relative.
 *  - recur and chunk against the float64 recurrence in llama.cpp's order
 *    (S = e^g S; delta = beta (v - S^T k); S += k delta^T; o = scale S^T q)
 *    from a nonzero initial state, for (dk, dv) from (1, 1) to (256, 256)
 *    and prompts of 1, 63, 64, 65 and 200 tokens (chunk boundaries), rows
 *    at strides: outputs and final state each within rel L2 2e-6 and max
 *    |err| 1e-5, both relative to the data's scale with a floor of 1
 *    (errs(); measured over many seeds: rel L2 under 4e-7, max under
 *    1.8e-6); also strong decays (g down to -30, the chunk's exponentials
 *    underflowing), strong then weak decays within a chunk (cumulative
 *    sums near -640: float ones fail), and no decay with beta 1 on
 *    near-parallel keys. chunk
 *    against recur, and the scalar chunk against each variant's recur,
 *    within the same bounds. recur over n tokens equals n calls of one
 *    token bit for bit; chunk over a prompt split anywhere agrees with one
 *    call within the bounds; nothing is written past the scratch or
 *    outside the output rows.
 *  - a layer's core (gates, conv + SiLU, L2 norms, the delta rule, gated
 *    RMSNorm) over a 70-token prompt by chunk then 3 decoded tokens by
 *    recur, with 2 key heads for 4 value heads mapped both ways (Qwen3.5's
 *    h % H_k, Qwen3-Next's h / (H_v / H_k)), against the same composition
 *    in float64: outputs and states within rel L2 2e-6 (measured: 2.3e-7).
 *  - dispatch: the scalar table holds the scalar_dn_* entries, avx2 and
 *    avxvnni AVX2's, the avx512 variants AVX-512's, neon and neondot
 *    NEON's; gates is the scalar one in every table.
 *
 * A variant the CPU lacks prints NOT RUN for each of its checks (counted
 * as skipped, never as passed).
 */
#include "kernels/deltanet.h"
#include "kernels/kernels.h"

#include "kernel_check.h"

#define EPS 1e-6f

static void fill_uniform(float *x, int n, double lo, double hi) {
    for (int i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * lm_rng_uniform(&rng));
}

static double silu_d(double x) { return x / (1.0 + exp(-x)); }

/* ---- conv ------------------------------------------------------------------- */

/* y (n_tok, ld) = the float64 conv of x with the state; st (k - 1, ld) the
 * state it leaves. */
static void ref_conv(double *y, float *st, const float *x, const float *state, const float *w, int n_tok, int n_ch,
                     int k, int ld, bool silu, double *mag) {
    int km = k - 1;
    for (int t = 0; t < n_tok; t++)
        for (int c = 0; c < n_ch; c++) {
            double acc = 0, m = 0;
            for (int i = 0; i < k; i++) {
                int r = t + i;
                double xv = r < km ? state[r * ld + c] : x[(r - km) * ld + c], p = (double)w[i * ld + c] * xv;
                acc += p;
                m += fabs(p);
            }
            y[t * ld + c] = silu ? silu_d(acc) : acc;
            mag[t * ld + c] = m;
        }
    for (int r = 0; r < km; r++)
        for (int c = 0; c < n_ch; c++) {
            int src = r + n_tok;
            st[r * ld + c] = src < km ? state[src * ld + c] : x[(src - km) * ld + c];
        }
}

static void test_conv(void) {
    const lm_dn_kernels *dn = &kernels()->dn;
    static const int chans[] = {1, 7, 8, 37, 300, 520};
    static const int taps[] = {1, 2, 4, 8};
    static const int toks[] = {1, 5, 17};
    const float SENT = 1234.5f;
    for (size_t ci = 0; ci < sizeof chans / sizeof chans[0]; ci++)
        for (size_t ki = 0; ki < sizeof taps / sizeof taps[0]; ki++)
            for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++)
                for (int silu = 0; silu < 2; silu++) {
                    const int n_ch = chans[ci], k = taps[ki], T = toks[ti], ld = n_ch + 3, km = k - 1;
                    float *x = lm_malloc(sizeof(float) * T * ld), *w = lm_malloc(sizeof(float) * k * ld);
                    float *st0 = lm_malloc(sizeof(float) * (km + 1) * ld),
                          *st = lm_malloc(sizeof(float) * (km + 1) * ld);
                    float *stw = lm_malloc(sizeof(float) * (km + 1) * ld), *y = lm_malloc(sizeof(float) * T * ld);
                    double *yr = lm_malloc(sizeof(double) * T * ld), *mag = lm_malloc(sizeof(double) * T * ld);
                    fill_normal(x, (int64_t)T * ld, 1.0);
                    fill_normal(w, (int64_t)k * ld, 0.5);
                    fill_normal(st0, (int64_t)(km + 1) * ld, 1.0);
                    memcpy(st, st0, sizeof(float) * (km + 1) * ld);
                    memcpy(stw, st0, sizeof(float) * (km + 1) * ld);
                    for (int i = 0; i < T * ld; i++) y[i] = SENT;
                    ref_conv(yr, stw, x, st0, w, T, n_ch, k, ld, silu, mag);
                    dn->conv(y, x, st, w, T, n_ch, k, (size_t)ld, silu);
                    int bad = -1, pad = -1;
                    for (int t = 0; t < T && bad < 0 && pad < 0; t++) {
                        for (int c = 0; c < n_ch; c++) {
                            double r = yr[t * ld + c];
                            if (!(fabs(y[t * ld + c] - r) <= 1e-6 * (mag[t * ld + c] + fabs(r)))) bad = t * ld + c;
                        }
                        for (int c = n_ch; c < ld; c++)
                            if (y[t * ld + c] != SENT) pad = t * ld + c;
                    }
                    int st_same = !memcmp(st, stw, sizeof(float) * (km + 1) * ld);
                    lm_free(x), lm_free(w), lm_free(st0), lm_free(st), lm_free(stw), lm_free(y), lm_free(yr);
                    lm_free(mag);
                    CHECKF(bad < 0, "%s conv n_ch %d k %d T %d silu %d: element %d", kernels_isa_name(), n_ch, k, T,
                           silu, bad);
                    CHECKF(pad < 0, "%s conv n_ch %d: wrote past the channels at %d", kernels_isa_name(), n_ch, pad);
                    CHECKF(st_same, "%s conv n_ch %d k %d T %d: state differs", kernels_isa_name(), n_ch, k, T);
                }
}

/* A prompt in one call, token by token, split in two, and by channel
 * ranges: the same y and state, bit for bit. */
static void test_conv_split(void) {
    const lm_dn_kernels *dn = &kernels()->dn;
    enum { T = 23, NC = 301, LD = 304, K = 4, KM = K - 1 };
    float *x = lm_malloc(sizeof(float) * T * LD), *w = lm_malloc(sizeof(float) * K * LD);
    float *st0 = lm_malloc(sizeof(float) * KM * LD), *st[4], *y[4];
    fill_normal(x, T * LD, 1.0);
    fill_normal(w, K * LD, 0.5);
    fill_normal(st0, KM * LD, 1.0);
    for (int m = 0; m < 4; m++) {
        st[m] = lm_malloc(sizeof(float) * KM * LD);
        y[m] = lm_calloc((size_t)T * LD, sizeof(float));
        memcpy(st[m], st0, sizeof(float) * KM * LD);
    }
    dn->conv(y[0], x, st[0], w, T, NC, K, LD, true);
    for (int t = 0; t < T; t++) dn->conv(y[1] + t * LD, x + t * LD, st[1], w, 1, NC, K, LD, true);
    dn->conv(y[2], x, st[2], w, 2, NC, K, LD, true); /* shorter than the state */
    dn->conv(y[2] + 2 * LD, x + 2 * LD, st[2], w, T - 2, NC, K, LD, true);
    dn->conv(y[3], x, st[3], w, T, 77, K, LD, true);
    dn->conv(y[3] + 77, x + 77, st[3] + 77, w + 77, T, NC - 77, K, LD, true);
    int same = 1;
    for (int m = 1; m < 4; m++)
        same &= !memcmp(y[m], y[0], sizeof(float) * T * LD) && !memcmp(st[m], st[0], sizeof(float) * KM * LD);
    for (int m = 0; m < 4; m++) lm_free(st[m]), lm_free(y[m]);
    lm_free(x), lm_free(w), lm_free(st0);
    CHECKF(same, "%s conv: one call, token by token, split and by channels differ", kernels_isa_name());
}

/* ---- norms and gates -------------------------------------------------------- */

static void test_norms(void) {
    const lm_dn_kernels *dn = &kernels()->dn;
    enum { N = 300 };
    float x[N], w[N], z[N], y[N];
    for (int n = 1; n <= N; n += 13) {
        for (int kind = 0; kind < 4; kind++) {
            /* Gaussian, larger, zero, and a norm under eps (the floor then sets the scale) */
            double sc = kind == 0 ? 1.0 : kind == 1 ? 30.0 : kind == 2 ? 0.0 : 1e-9;
            fill_normal(x, n, sc);
            double ss = 0;
            for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
            double f = 1.0 / fmax(sqrt(ss), EPS);
            memcpy(y, x, sizeof(float) * n);
            dn->l2norm(y, y, n, EPS); /* in place */
            for (int i = 0; i < n; i++) {
                double r = x[i] * f;
                CHECKF(fabs(y[i] - r) <= 1e-6 * fabs(r) + 1e-30, "%s l2norm n %d kind %d [%d]: %.9g vs %.9g",
                       kernels_isa_name(), n, kind, i, y[i], r);
            }
        }
        fill_normal(x, n, 3.0);
        fill_normal(w, n, 1.0);
        fill_normal(z, n, 2.0);
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
        double f = 1.0 / sqrt(ss / n + EPS);
        dn->norm_gated(y, x, w, z, n, EPS);
        for (int i = 0; i < n; i++) {
            double r = x[i] * f * w[i] * silu_d(z[i]);
            CHECKF(fabs(y[i] - r) <= 1e-6 * fabs(r) + 1e-30, "%s norm_gated n %d [%d]: %.9g vs %.9g",
                   kernels_isa_name(), n, i, y[i], r);
        }
        memcpy(y, z, sizeof(float) * n);
        dn->norm_gated(y, x, w, y, n, EPS); /* y aliasing z */
        for (int i = 0; i < n; i++) {
            double r = x[i] * f * w[i] * silu_d(z[i]);
            CHECKF(fabs(y[i] - r) <= 1e-6 * fabs(r) + 1e-30, "%s norm_gated in place n %d [%d]", kernels_isa_name(), n,
                   i);
        }
    }
}

static void test_gates(void) {
    enum { N = 64 };
    float a[N], b[N], A[N], dt[N], g[N], beta[N];
    fill_uniform(a, N, -30, 30);
    fill_normal(b, N, 4.0);
    fill_uniform(A, N, -8, -0.01);
    fill_uniform(dt, N, -2, 2);
    a[0] = 19.999f, dt[0] = 0, a[1] = 20.001f, dt[1] = 0; /* both sides of the threshold */
    kernels()->dn.gates(g, beta, a, b, A, dt, N);
    for (int h = 0; h < N; h++) {
        float uf = a[h] + dt[h]; /* the sum the contract takes, in float */
        double u = uf, sp = u > 20 ? u : log1p(exp(u));
        double rg = A[h] * sp, rb = 1.0 / (1.0 + exp(-(double)b[h]));
        CHECKF(fabs(g[h] - rg) <= 1e-6 * fabs(rg) + 1e-30, "%s gates g[%d] %.9g vs %.9g", kernels_isa_name(), h, g[h],
               rg);
        CHECKF(fabs(beta[h] - rb) <= 1e-6 * rb, "%s gates beta[%d]", kernels_isa_name(), h);
    }
}

/* ---- the delta rule ------------------------------------------------------------ */

/* One head's tokens in strided buffers: q, k in rows of qk_stride, v in
 * rows of v_stride, g and beta interleaved with another head's. */
typedef struct {
    lm_dn_seq s;
    float *qk, *v, *gb, *S0;
} head;

enum { MODE_PLAIN, MODE_STRONG, MODE_FORGET, MODE_PARALLEL };

static void unit(float *x, int n) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    for (int i = 0; i < n; i++) x[i] = (float)(x[i] / sqrt(ss));
}

/* MODE_PLAIN: g in [-3, 0], beta in (0, 1); MODE_STRONG: g in [-30, -5]
 * (decays that underflow within a chunk); MODE_FORGET: g -20 on the first
 * 32 tokens of every 64, then in [-0.01, 0] (cumulative decays near -640
 * with factors near 1 between late tokens: float cumulative sums would
 * lose 6e-5 there); MODE_PARALLEL: g 0, beta 1, keys near one direction. */
static head make_head(int T, int dk, int dv, int mode) {
    head h;
    size_t qks = 2 * (size_t)dk + 3, vs = (size_t)dv + 1;
    h.qk = lm_malloc(sizeof(float) * T * qks);
    h.v = lm_malloc(sizeof(float) * T * vs);
    h.gb = lm_malloc(sizeof(float) * T * 3);
    h.S0 = lm_malloc(sizeof(float) * dk * dv);
    float dir[LM_DN_MAX_DIM];
    fill_normal(dir, dk, 1.0);
    for (int t = 0; t < T; t++) {
        float *q = h.qk + t * qks, *k = q + dk + 3;
        fill_normal(q, dk, 1.0);
        fill_normal(k, dk, 1.0);
        if (mode == MODE_PARALLEL || mode == MODE_FORGET)
            for (int i = 0; i < dk; i++) k[i] = dir[i] + 0.05f * k[i];
        if (mode == MODE_FORGET)
            for (int i = 0; i < dk; i++) q[i] = dir[i] + 0.05f * q[i];
        unit(q, dk);
        unit(k, dk);
        fill_normal(h.v + t * vs, dv, 1.0);
        float *gb = h.gb + t * 3;
        gb[0] = (float)(mode == MODE_PLAIN        ? -3.0 * lm_rng_uniform(&rng)
                            : mode == MODE_STRONG ? -5.0 - 25.0 * lm_rng_uniform(&rng)
                            : mode == MODE_FORGET ? (t % 64 < 32 ? -20.0 : -0.01 * lm_rng_uniform(&rng))
                                                  : 0.0);
        gb[1] = mode == MODE_PARALLEL ? 1.0f : (float)lm_rng_uniform(&rng);
        gb[2] = 0;
    }
    fill_normal(h.S0, (int64_t)dk * dv, 0.5);
    h.s = (lm_dn_seq){.q = h.qk,
                      .k = h.qk + dk + 3,
                      .v = h.v,
                      .g = h.gb,
                      .beta = h.gb + 1,
                      .qk_stride = qks,
                      .v_stride = vs,
                      .gb_stride = 3,
                      .n_tok = T,
                      .dk = dk,
                      .dv = dv,
                      .scale = (float)(1.0 / sqrt(dk))};
    return h;
}

static void free_head(head *h) { lm_free(h->qk), lm_free(h->v), lm_free(h->gb), lm_free(h->S0); }

/* The float64 recurrence in llama.cpp's order; S (dk, dv) in place, o (T, dv). */
static void ref_delta(double *S, double *o, const lm_dn_seq *s) {
    const int dk = s->dk, dv = s->dv;
    double d[LM_DN_MAX_DIM];
    for (int t = 0; t < s->n_tok; t++) {
        const float *q = s->q + t * s->qk_stride, *k = s->k + t * s->qk_stride, *v = s->v + t * s->v_stride;
        double e = exp((double)s->g[t * s->gb_stride]), beta = s->beta[t * s->gb_stride];
        for (int i = 0; i < dk * dv; i++) S[i] *= e;
        for (int j = 0; j < dv; j++) {
            double kv = 0;
            for (int i = 0; i < dk; i++) kv += S[i * dv + j] * k[i];
            d[j] = beta * (v[j] - kv);
        }
        for (int i = 0; i < dk; i++)
            for (int j = 0; j < dv; j++) S[i * dv + j] += k[i] * d[j];
        for (int j = 0; j < dv; j++) {
            double a = 0;
            for (int i = 0; i < dk; i++) a += S[i * dv + j] * q[i];
            o[t * dv + j] = s->scale * a;
        }
    }
}

/* The errors of rows of m floats (stride apart) against a dense double
 * array, relative to the data's scale with a floor of 1 (the inputs are
 * of unit scale, so a state or output that cancels to near 0 is held to
 * the scale of its terms): rel = ||err|| / max(||ref||, sqrt(count)),
 * mx = max |err| / max(max |ref|, 1). */
static void errs(const float *a, size_t stride, int rows, int m, const double *ref, double *rel, double *mx) {
    double num = 0, den = 0, emax = 0, rmax = 0;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < m; j++) {
            double d = (double)a[r * stride + j] - ref[r * m + j];
            num += d * d;
            den += ref[r * m + j] * ref[r * m + j];
            emax = fmax(emax, fabs(d));
            rmax = fmax(rmax, fabs(ref[r * m + j]));
        }
    *rel = sqrt(num / fmax(den, (double)rows * m));
    *mx = emax / fmax(rmax, 1.0);
    if (isnan(num)) *rel = *mx = INFINITY;
}

#define REL_TOL 2e-6
#define MAX_TOL 1e-5

/* Runs a form (chunk when chunked) over the head from S0; o (T, dv + 2) with
 * sentinels past dv, S the final state. false when a sentinel changed. */
static bool run_form(const lm_dn_kernels *dn, head *h, bool chunked, float *o, float *S) {
    const int T = h->s.n_tok, dv = h->s.dv;
    const size_t os = (size_t)dv + 2, nw = dn_chunk_work(h->s.dk, dv);
    float *work = lm_malloc(sizeof(float) * (nw + 16));
    for (size_t i = 0; i < nw + 16; i++) work[i] = -777.0f;
    for (size_t i = 0; i < T * os; i++) o[i] = 4321.0f;
    memcpy(S, h->S0, sizeof(float) * h->s.dk * dv);
    lm_dn_seq s = h->s;
    s.o = o, s.o_stride = os;
    if (chunked) dn->chunk(S, &s, work);
    else dn->recur(S, &s);
    bool ok = true;
    for (size_t i = nw; i < nw + 16; i++) ok &= work[i] == -777.0f;
    for (int t = 0; t < T; t++) ok &= o[t * os + dv] == 4321.0f && o[t * os + dv + 1] == 4321.0f;
    lm_free(work);
    return ok;
}

static double worst_rel, worst_max; /* the largest errors measured against float64 (NOTE line) */

static void test_delta_ref(void) {
    static const int dims[][2] = {{128, 128}, {64, 64}, {16, 24}, {1, 1}, {100, 72}, {256, 256}, {33, 7}};
    static const int toks[] = {1, 63, 64, 65, 200};
    const lm_dn_kernels *dn = &kernels()->dn;
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++)
            for (int mode = MODE_PLAIN; mode <= MODE_PARALLEL; mode++) {
                const int dk = dims[di][0], dv = dims[di][1], T = toks[ti];
                if (dk * dv > 128 * 128 && T > 65) continue; /* the largest heads on the boundary lengths only */
                if (mode != MODE_PLAIN && (dk != 128 || T == 1)) continue;
                head h = make_head(T, dk, dv, mode);
                double *S = lm_malloc(sizeof(double) * dk * dv), *ro = lm_malloc(sizeof(double) * T * dv);
                for (int i = 0; i < dk * dv; i++) S[i] = h.S0[i];
                ref_delta(S, ro, &h.s);
                float *o = lm_malloc(sizeof(float) * T * (dv + 2)), *Sf = lm_malloc(sizeof(float) * dk * dv);
                double e[2][4];
                bool fences[2];
                for (int form = 0; form < 2; form++) {
                    fences[form] = run_form(dn, &h, form == 1, o, Sf);
                    errs(o, (size_t)dv + 2, T, dv, ro, &e[form][0], &e[form][1]);
                    errs(Sf, (size_t)dv, dk, dv, S, &e[form][2], &e[form][3]);
                }
                lm_free(S), lm_free(ro), lm_free(o), lm_free(Sf);
                free_head(&h);
                for (int form = 0; form < 2; form++) {
                    const char *name = form ? "chunk" : "recur";
                    worst_rel = fmax(worst_rel, fmax(e[form][0], e[form][2]));
                    worst_max = fmax(worst_max, fmax(e[form][1], e[form][3]));
                    CHECKF(fences[form], "%s %s dk %d dv %d T %d: wrote outside its rows or scratch",
                           kernels_isa_name(), name, dk, dv, T);
                    CHECKF(e[form][0] <= REL_TOL && e[form][1] <= MAX_TOL,
                           "%s %s dk %d dv %d T %d mode %d: outputs rel %.3g max %.3g", kernels_isa_name(), name, dk,
                           dv, T, mode, e[form][0], e[form][1]);
                    CHECKF(e[form][2] <= REL_TOL && e[form][3] <= MAX_TOL,
                           "%s %s dk %d dv %d T %d mode %d: state rel %.3g max %.3g", kernels_isa_name(), name, dk, dv,
                           T, mode, e[form][2], e[form][3]);
                }
            }
}

/* chunk against recur, and this variant against the scalar one, on the
 * same head: within the float64 bounds. */
static void test_delta_cross(void) {
    static const int toks[] = {1, 63, 64, 65, 200};
    const lm_dn_kernels *dn = &kernels()->dn;
    const lm_dn_kernels sc = {scalar_dn_conv,  scalar_dn_l2norm, scalar_dn_norm_gated,
                              scalar_dn_gates, scalar_dn_recur,  scalar_dn_chunk};
    for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++) {
        const int T = toks[ti], dk = 128, dv = 128;
        head h = make_head(T, dk, dv, MODE_PLAIN);
        float *o[3], *S[3];
        double *od = lm_malloc(sizeof(double) * T * dv), *Sd = lm_malloc(sizeof(double) * dk * dv);
        for (int m = 0; m < 3; m++) {
            o[m] = lm_malloc(sizeof(float) * T * (dv + 2));
            S[m] = lm_malloc(sizeof(float) * dk * dv);
        }
        run_form(dn, &h, false, o[0], S[0]);
        run_form(dn, &h, true, o[1], S[1]);
        run_form(&sc, &h, true, o[2], S[2]);
        double e[2][4];
        for (int m = 1; m < 3; m++) {
            /* the reference of comparison: recur of this variant, as doubles */
            for (int t = 0; t < T; t++)
                for (int j = 0; j < dv; j++) od[t * dv + j] = o[0][t * (dv + 2) + j];
            for (int i = 0; i < dk * dv; i++) Sd[i] = S[0][i];
            errs(o[m], (size_t)dv + 2, T, dv, od, &e[m - 1][0], &e[m - 1][1]);
            errs(S[m], (size_t)dv, dk, dv, Sd, &e[m - 1][2], &e[m - 1][3]);
        }
        for (int m = 0; m < 3; m++) lm_free(o[m]), lm_free(S[m]);
        lm_free(od), lm_free(Sd);
        free_head(&h);
        CHECKF(e[0][0] <= REL_TOL && e[0][1] <= MAX_TOL && e[0][2] <= REL_TOL && e[0][3] <= MAX_TOL,
               "%s chunk vs recur T %d: outputs %.3g/%.3g state %.3g/%.3g", kernels_isa_name(), T, e[0][0], e[0][1],
               e[0][2], e[0][3]);
        CHECKF(e[1][0] <= REL_TOL && e[1][1] <= MAX_TOL && e[1][2] <= REL_TOL && e[1][3] <= MAX_TOL,
               "%s scalar chunk vs this recur T %d: outputs %.3g/%.3g state %.3g/%.3g", kernels_isa_name(), T, e[1][0],
               e[1][1], e[1][2], e[1][3]);
    }
}

/* recur over n tokens equals n calls of one token bit for bit; chunk over
 * a prompt split anywhere agrees with one call within the bounds. */
static void test_delta_split(void) {
    const lm_dn_kernels *dn = &kernels()->dn;
    enum { T = 150, DK = 128, DV = 128 };
    head h = make_head(T, DK, DV, MODE_PLAIN);
    float *o0 = lm_malloc(sizeof(float) * T * DV), *o1 = lm_malloc(sizeof(float) * T * DV);
    float *S0 = lm_malloc(sizeof(float) * DK * DV), *S1 = lm_malloc(sizeof(float) * DK * DV);
    float *work = lm_malloc(sizeof(float) * dn_chunk_work(DK, DV));
    lm_dn_seq s = h.s;
    s.o_stride = DV;
    memcpy(S0, h.S0, sizeof(float) * DK * DV);
    s.o = o0;
    dn->recur(S0, &s);
    memcpy(S1, h.S0, sizeof(float) * DK * DV);
    for (int t = 0; t < T; t++) {
        lm_dn_seq one = s;
        one.q += t * s.qk_stride, one.k += t * s.qk_stride, one.v += t * s.v_stride;
        one.g += t * s.gb_stride, one.beta += t * s.gb_stride, one.o = o1 + t * DV, one.n_tok = 1;
        dn->recur(S1, &one);
    }
    int same = !memcmp(o0, o1, sizeof(float) * T * DV) && !memcmp(S0, S1, sizeof(float) * DK * DV);
    /* chunk: one call against splits at 1, 40, 64, 100 */
    static const int cuts[] = {1, 40, 64, 100};
    double worst = 0;
    memcpy(S0, h.S0, sizeof(float) * DK * DV);
    s.o = o0;
    dn->chunk(S0, &s, work);
    double *od = lm_malloc(sizeof(double) * T * DV), *Sd = lm_malloc(sizeof(double) * DK * DV);
    for (int i = 0; i < T * DV; i++) od[i] = o0[i];
    for (int i = 0; i < DK * DV; i++) Sd[i] = S0[i];
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        memcpy(S1, h.S0, sizeof(float) * DK * DV);
        lm_dn_seq a = s, b = s;
        a.o = o1, a.n_tok = cuts[c];
        b.q += cuts[c] * s.qk_stride, b.k += cuts[c] * s.qk_stride, b.v += cuts[c] * s.v_stride;
        b.g += cuts[c] * s.gb_stride, b.beta += cuts[c] * s.gb_stride, b.o = o1 + cuts[c] * DV;
        b.n_tok = T - cuts[c];
        dn->chunk(S1, &a, work);
        dn->chunk(S1, &b, work);
        double e[4];
        errs(o1, DV, T, DV, od, &e[0], &e[1]);
        errs(S1, DV, DK, DV, Sd, &e[2], &e[3]);
        worst = fmax(worst, fmax(fmax(e[0], e[2]) / REL_TOL, fmax(e[1], e[3]) / MAX_TOL));
    }
    lm_free(o0), lm_free(o1), lm_free(S0), lm_free(S1), lm_free(work), lm_free(od), lm_free(Sd);
    free_head(&h);
    CHECKF(same, "%s recur: n tokens in one call and one at a time differ", kernels_isa_name());
    CHECKF(worst <= 1, "%s chunk split: %.3g of the bound", kernels_isa_name(), worst);
}

/* ---- a layer's core ------------------------------------------------------------- */

enum { HK = 2, HV = 4, D = 32, KC = 4, NCH = 2 * HK * D + HV * D, LT = 70, LD = 3 };

/* The float64 composition: gates, conv + SiLU, L2 norms, the delta rule,
 * gated RMSNorm, over T tokens from the states given (updated). */
static void ref_layer(double *y, const float *qkv, const float *z, const float *a, const float *b, const float *A,
                      const float *dt, const float *cw, const float *nw, double *cst, double *S, int T, int tiled) {
    double c[NCH], q[HK][D], k[HK][D], o[D];
    for (int t = 0; t < T; t++) {
        for (int ch = 0; ch < NCH; ch++) {
            double acc = 0;
            for (int i = 0; i < KC; i++)
                acc += (double)cw[i * NCH + ch] * (i < KC - 1 ? cst[i * NCH + ch] : qkv[t * NCH + ch]);
            c[ch] = silu_d(acc);
        }
        for (int r = 0; r < KC - 2; r++)
            for (int ch = 0; ch < NCH; ch++) cst[r * NCH + ch] = cst[(r + 1) * NCH + ch];
        for (int ch = 0; ch < NCH; ch++) cst[(KC - 2) * NCH + ch] = qkv[t * NCH + ch];
        for (int hk = 0; hk < HK; hk++)
            for (int part = 0; part < 2; part++) {
                double *x = part ? k[hk] : q[hk], ss = 0;
                for (int i = 0; i < D; i++) ss += c[part * HK * D + hk * D + i] * c[part * HK * D + hk * D + i];
                double f = 1.0 / fmax(sqrt(ss), EPS);
                for (int i = 0; i < D; i++) x[i] = c[part * HK * D + hk * D + i] * f;
            }
        for (int h = 0; h < HV; h++) {
            int hk = tiled ? h % HK : h / (HV / HK);
            double u = (double)a[t * HV + h] + dt[h], g = A[h] * (u > 20 ? u : log1p(exp(u)));
            double beta = 1.0 / (1.0 + exp(-(double)b[t * HV + h])), e = exp(g), d[D];
            double *Sh = S + h * D * D;
            const double *v = c + 2 * HK * D + h * D;
            for (int i = 0; i < D * D; i++) Sh[i] *= e;
            for (int j = 0; j < D; j++) {
                double kv = 0;
                for (int i = 0; i < D; i++) kv += Sh[i * D + j] * k[hk][i];
                d[j] = beta * (v[j] - kv);
            }
            for (int i = 0; i < D; i++)
                for (int j = 0; j < D; j++) Sh[i * D + j] += k[hk][i] * d[j];
            double ss = 0;
            for (int j = 0; j < D; j++) {
                double acc = 0;
                for (int i = 0; i < D; i++) acc += Sh[i * D + j] * q[hk][i];
                o[j] = acc / sqrt((double)D);
                ss += o[j] * o[j];
            }
            double f = 1.0 / sqrt(ss / D + EPS);
            for (int j = 0; j < D; j++) y[(t * HV + h) * D + j] = o[j] * f * nw[j] * silu_d(z[(t * HV + h) * D + j]);
        }
    }
}

/* The kernels' composition over T tokens (chunk when chunked). */
static void kernel_layer(float *y, const float *qkv, const float *z, const float *a, const float *b, const float *A,
                         const float *dt, const float *cw, const float *nw, float *cst, float *S, int T, int tiled,
                         bool chunked, float *work) {
    const lm_dn_kernels *dn = &kernels()->dn;
    float *c = lm_malloc(sizeof(float) * T * NCH), *g = lm_malloc(sizeof(float) * T * HV);
    float *beta = lm_malloc(sizeof(float) * T * HV);
    for (int t = 0; t < T; t++) dn->gates(g + t * HV, beta + t * HV, a + t * HV, b + t * HV, A, dt, HV);
    dn->conv(c, qkv, cst, cw, T, NCH, KC, NCH, true);
    for (int t = 0; t < T; t++)
        for (int hk = 0; hk < 2 * HK; hk++) dn->l2norm(c + t * NCH + hk * D, c + t * NCH + hk * D, D, EPS);
    for (int h = 0; h < HV; h++) {
        int hk = tiled ? h % HK : h / (HV / HK);
        lm_dn_seq s = {.q = c + hk * D,
                       .k = c + HK * D + hk * D,
                       .v = c + 2 * HK * D + h * D,
                       .g = g + h,
                       .beta = beta + h,
                       .o = y + h * D,
                       .qk_stride = NCH,
                       .v_stride = NCH,
                       .gb_stride = HV,
                       .o_stride = HV * D,
                       .n_tok = T,
                       .dk = D,
                       .dv = D,
                       .scale = (float)(1.0 / sqrt(D))};
        if (chunked) dn->chunk(S + h * D * D, &s, work);
        else dn->recur(S + h * D * D, &s);
    }
    for (int t = 0; t < T; t++)
        for (int h = 0; h < HV; h++)
            dn->norm_gated(y + (t * HV + h) * D, y + (t * HV + h) * D, nw, z + (t * HV + h) * D, D, EPS);
    lm_free(c), lm_free(g), lm_free(beta);
}

static void test_layer(void) {
    const int T = LT + LD;
    float *qkv = lm_malloc(sizeof(float) * T * NCH), *z = lm_malloc(sizeof(float) * T * HV * D);
    float *a = lm_malloc(sizeof(float) * T * HV), *b = lm_malloc(sizeof(float) * T * HV);
    float A[HV], dt[HV], nw[D], cw[KC * NCH], cst0[(KC - 1) * NCH], S0[HV * D * D];
    fill_normal(qkv, T * NCH, 1.0);
    fill_normal(z, T * HV * D, 1.0);
    fill_normal(a, T * HV, 1.0);
    fill_normal(b, T * HV, 1.0);
    fill_uniform(A, HV, -4, -0.1);
    fill_uniform(dt, HV, -1, 1);
    fill_normal(nw, D, 1.0);
    fill_normal(cw, KC * NCH, 0.5);
    fill_normal(cst0, (KC - 1) * NCH, 1.0);
    fill_normal(S0, HV * D * D, 0.3);
    float *y = lm_malloc(sizeof(float) * T * HV * D), *work = lm_malloc(sizeof(float) * dn_chunk_work(D, D));
    double *yr = lm_malloc(sizeof(double) * T * HV * D);
    double worst = 0;
    for (int tiled = 0; tiled < 2; tiled++) {
        float cst[(KC - 1) * NCH], S[HV * D * D];
        double cstd[(KC - 1) * NCH], Sd[HV * D * D];
        memcpy(cst, cst0, sizeof cst);
        memcpy(S, S0, sizeof S);
        for (int i = 0; i < (KC - 1) * NCH; i++) cstd[i] = cst0[i];
        for (int i = 0; i < HV * D * D; i++) Sd[i] = S0[i];
        ref_layer(yr, qkv, z, a, b, A, dt, cw, nw, cstd, Sd, T, tiled);
        /* the prompt chunkwise, then each decoded token by the recurrence */
        kernel_layer(y, qkv, z, a, b, A, dt, cw, nw, cst, S, LT, tiled, true, work);
        for (int t = LT; t < T; t++)
            kernel_layer(y + t * HV * D, qkv + t * NCH, z + t * HV * D, a + t * HV, b + t * HV, A, dt, cw, nw, cst, S,
                         1, tiled, false, work);
        double rel = test_rel_l2(y, yr, (size_t)T * HV * D), srel = test_rel_l2(S, Sd, HV * D * D);
        worst = fmax(worst, fmax(rel, srel));
    }
    lm_free(qkv), lm_free(z), lm_free(a), lm_free(b), lm_free(y), lm_free(work), lm_free(yr);
    CHECKF(worst <= 2e-6, "%s layer core: rel L2 %.3g", kernels_isa_name(), worst);
}

/* ---- dispatch ------------------------------------------------------------------ */

static bool dn_equal(const lm_dn_kernels *a, const lm_dn_kernels *b) {
    return a->conv == b->conv && a->l2norm == b->l2norm && a->norm_gated == b->norm_gated && a->gates == b->gates &&
        a->recur == b->recur && a->chunk == b->chunk;
}

static void test_dispatch(void) {
    const lm_dn_kernels sc = {scalar_dn_conv,  scalar_dn_l2norm, scalar_dn_norm_gated,
                              scalar_dn_gates, scalar_dn_recur,  scalar_dn_chunk};
    lm_dn_kernels x2 = sc, x5 = sc, nn = sc;
    bool has2 = avx2_dn_fill(&x2), hasn = neon_dn_fill(&nn);
    if (has2) {
        x5 = x2;
        avx512_dn_fill(&x5);
    }
    CHECK(kernels_use(LM_ISA_SCALAR) == 0 && dn_equal(&kernels()->dn, &sc));
    for (int isa = LM_ISA_AVX2; isa <= LM_ISA_AVX512BF16; isa++) {
        if (!kernels_cpu_has((lm_isa)isa)) continue;
        CHECK(has2 && kernels_use(isa) == 0);
        CHECKF(dn_equal(&kernels()->dn, isa >= LM_ISA_AVX512 ? &x5 : &x2), "%s", kernels_isa_name());
        CHECKF(kernels()->dn.gates == scalar_dn_gates, "%s", kernels_isa_name());
    }
    if (kernels_cpu_has(LM_ISA_AVX512)) CHECK(x5.recur != x2.recur && x5.chunk != x2.chunk && x5.conv != x2.conv);
    /* AArch64: NEON's entries in both NEON tables, each of them its own */
    CHECK(hasn == kernels_cpu_has(LM_ISA_NEON));
    if (hasn)
        CHECK(nn.conv != sc.conv && nn.l2norm != sc.l2norm && nn.norm_gated != sc.norm_gated && nn.gates == sc.gates &&
              nn.recur != sc.recur && nn.chunk != sc.chunk);
    for (int isa = LM_ISA_NEON; isa <= LM_ISA_NEONDOT; isa++)
        if (kernels_cpu_has((lm_isa)isa))
            CHECKF(kernels_use(isa) == 0 && dn_equal(&kernels()->dn, &nn), "%s", kernels_isa_name());
    /* the work size: two (C, C) matrices, U, W and a C vector */
    CHECK(dn_chunk_work(128, 96) == (size_t)LM_DN_CHUNK * (1 + 2 * LM_DN_CHUNK + 128 + 96));
}

int main(void) {
    lm_rng_seed(&rng, 20261207);
    kernels_init();
    const lm_isa start = kernels()->isa;
    static const lm_isa isas[] = {LM_ISA_SCALAR, LM_ISA_AVX2, LM_ISA_AVX512, LM_ISA_NEON};
    for (size_t v = 0; v < sizeof isas / sizeof isas[0]; v++) {
        bool can = kernels_cpu_has(isas[v]);
        kc_variant(kernels_isa_str(isas[v]), can ? NULL : "this CPU (or build) lacks it");
        if (can) kernels_use(isas[v]);
        KC_CHECK(test_conv);
        KC_CHECK(test_conv_split);
        KC_CHECK(test_norms);
        KC_CHECK(test_gates);
        KC_CHECK(test_delta_ref);
        KC_CHECK(test_delta_cross);
        KC_CHECK(test_delta_split);
        KC_CHECK(test_layer);
    }
    printf("NOTE delta rule, largest error against float64: rel L2 %.3g, max %.3g of max(max |ref|, 1)\n", worst_rel,
           worst_max);
    TEST_RUN(test_dispatch);
    kernels_use(start);
    return kc_done();
}
