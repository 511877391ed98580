/*
 * cli.c - see cli.h.
 */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/safefile.h"
#include "format/quant.h"
#include "kv/kv.h"
#include "text/chat.h"
#include "base/util.h"

void die_usage(args *a, const char *fmt, const char *what) {
    fprintf(stderr, "lamina %s: ", a->cmd);
    fprintf(stderr, fmt, what);
    fprintf(stderr, "\nTry 'lamina %s --help'.\n", a->cmd);
    exit(2);
}

/* The value after flag argv[i]; exits with usage when missing. */
const char *need_val(args *a) {
    if (a->i + 1 >= a->argc) die_usage(a, "flag %s needs a value", a->argv[a->i]);
    return a->argv[++a->i];
}

long long need_int(args *a, long long lo, long long hi) {
    const char *flag = a->argv[a->i];
    const char *v = need_val(a);
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s wants an integer in [%lld, %lld], got '%s'", flag, lo, hi, v);
        die_usage(a, "%s", msg);
    }
    return x;
}

double need_float(args *a, double lo, double hi) {
    const char *flag = a->argv[a->i];
    const char *v = need_val(a);
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || *end || end == v || !(x >= lo && x <= hi)) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s wants a number in [%g, %g], got '%s'", flag, lo, hi, v);
        die_usage(a, "%s", msg);
    }
    return x;
}

bool is_flag(args *a, const char *s1, const char *s2) {
    const char *f = a->argv[a->i];
    return strcmp(f, s1) == 0 || (s2 && strcmp(f, s2) == 0);
}

bool progress_force;

bool is_help(args *a) {
    if (is_flag(a, "--progress", NULL)) { /* every command's, see cli.h */
        progress_force = true;
        return true;
    }
    if (is_flag(a, "-h", "--help")) {
        a->usage(stdout);
        exit(0);
    }
    return false;
}

void fail(const char *cmd, const char *msg) {
    fprintf(stderr, "lamina %s: %s\n", cmd, msg);
    exit(1);
}

char *read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) return NULL;
    for (;;) {
        if (n == cap) {
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* Tokenize text into a growing buffer; returns count or -1. */
int encode_all(const lm_tokenizer *tok, const char *text, size_t len, bool bos, bool special, int32_t **out) {
    int cap = (int)(len < 1000000 ? len : 1000000) + 16;
    *out = malloc((size_t)cap * sizeof(int32_t));
    if (!*out) return -1;
    int n = tok_encode(tok, text, len, bos, special, *out, cap);
    if (n > cap) {
        int32_t *nb = realloc(*out, (size_t)n * sizeof(int32_t));
        if (!nb) return -1;
        *out = nb;
        n = tok_encode(tok, text, len, bos, special, *out, n);
    }
    return n;
}

unsigned long long need_bytes(args *a) {
    const char *flag = a->argv[a->i];
    const char *v = need_val(a);
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    double mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') mul = 1048576.0, end++;
    else if (*end == 'G' || *end == 'g') mul = 1073741824.0, end++;
    if (*end == 'i' || *end == 'B') end++;
    if (*end == 'B') end++;
    if (errno || *end || end == v || !(x > 0) || x * mul > 1e15) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s wants a byte count like 512M or 2G, got '%s'", flag, v);
        die_usage(a, "%s", msg);
    }
    return (unsigned long long)(x * mul);
}

static void die_no_model(const char *cmd, const char *path) {
    if (!path) {
        fprintf(stderr, "lamina %s: no model given (-m MODEL.gguf)\n", cmd);
        exit(2);
    }
}

/* "lamina CMD: PATH: ERR" (reader messages already start with the path), exit 1. */
static void die_load(const char *cmd, const char *path, const char *err) {
    if (strncmp(err, path, strlen(path)) == 0) fprintf(stderr, "lamina %s: %s\n", cmd, err);
    else fprintf(stderr, "lamina %s: %s: %s\n", cmd, path, err);
    exit(1);
}

int cli_tp_rank = 0, cli_tp_size = 1, cli_rank = 0, cli_pp_stage = 0, cli_pp_size = 1;
int cli_ep_rank = 0, cli_ep_size = 1;
const lm_ep_counts *cli_ep_counts;

static bool on_load(void *user, float done) {
    progress_update(user, (long long)(done * 100.0f + 0.5f), 100);
    return true;
}

lm_model *load_or_die(const char *cmd, const char *path) {
    die_no_model(cmd, path);
    char err[LM_ERRLEN];
    /* the library's loading callback, drawn on a terminal (or --progress)
     * when loading takes longer than LAMINA_PROGRESS_AFTER: large files */
    progress_line prog;
    progress_begin(&prog, cmd, "loading the model", NULL);
    lm_load_params lp = {.size = sizeof lp, .progress = on_load, .progress_user = &prog};
    lm_status st;
    lm_model *m = model_load_ep(path, &lp, cli_tp_rank, cli_tp_size, cli_pp_stage, cli_pp_size, cli_ep_rank,
                                cli_ep_size, cli_ep_counts, &st, err, sizeof err);
    progress_end(&prog);
    if (!m) die_load(cmd, path, err);
    return m;
}

lm_tokenizer *load_tok_or_die(const char *cmd, const char *path) {
    die_no_model(cmd, path);
    char err[LM_ERRLEN];
    gguf_ctx *g = gguf_open(path, err, sizeof err);
    if (!g) die_load(cmd, path, err);
    if (gguf_find_key(g, "tokenizer.ggml.model") < 0) {
        gguf_close(g);
        fail(cmd, "the model file has no tokenizer");
    }
    lm_tokenizer *t = tok_load(g, err, sizeof err);
    gguf_close(g); /* the tokenizer keeps no pointer into the file */
    if (!t) {
        char msg[LM_ERRLEN + 16];
        snprintf(msg, sizeof msg, "tokenizer: %s", err);
        die_load(cmd, path, msg);
    }
    return t;
}

uint32_t need_kv_type(args *a) {
    const char *v = need_val(a);
    uint32_t t;
    char err[LM_ERRLEN];
    if (kv_type_from_name(v, &t, err, sizeof err)) die_usage(a, "%s", err);
    return t;
}

int snapshots_flag(args *a) {
    int n = (int)need_int(a, 0, 1 << 20);
    return n ? n : -1;
}

double itl_factor_flag(args *a) {
    double f = need_float(a, 0, 1e6);
    if (f > 0 && f < 1) die_usage(a, "--itl-factor must be 0 (off) or at least 1 (got '%s')", a->argv[a->i]);
    return f;
}

int need_spec(args *a) {
    const char *v = need_val(a);
    if (!strcmp(v, "ngram")) return LM_SPEC_NGRAM;
    if (!strcmp(v, "mtp")) return LM_SPEC_MTP;
    if (!strcmp(v, "none") || !strcmp(v, "off")) return LM_SPEC_NONE;
    die_usage(a, "unknown speculative proposer '%s' (ngram, mtp or none)", v);
    return LM_SPEC_NONE;
}

/* max 0: the default, 4 for prompt lookup and 3 for a draft model (whose
 * guesses cost passes: bench/results/speculative.md) */
void spec_opts_default(spec_opts *o) { *o = (spec_opts){.spec = LM_SPEC_NONE, .max = 0, .vocab = -1}; }

bool spec_opts_flag(args *a, spec_opts *o) {
    if (is_flag(a, "--spec", NULL)) o->spec = need_spec(a);
    else if (is_flag(a, "--draft-model", NULL)) o->draft_path = need_val(a);
    else if (is_flag(a, "--draft-max", NULL)) o->max = (int)need_int(a, 1, 64);
    else if (is_flag(a, "--draft-min", NULL)) o->min = (int)need_int(a, 0, 64);
    else if (is_flag(a, "--draft-p-min", NULL)) o->p_min = (float)need_float(a, 0, 1);
    else if (is_flag(a, "--draft-cost", NULL)) o->cost = (float)need_float(a, -1, 100);
    else if (is_flag(a, "--draft-vocab", NULL)) o->vocab = (int)need_int(a, 0, INT32_MAX);
    else if (is_flag(a, "--spec-widths", NULL)) o->widths = need_val(a);
    else return false;
    return true;
}

void spec_opts_apply(args *a, spec_opts *o, lm_engine_config *ec) {
    if (o->draft_path && (o->spec == LM_SPEC_NGRAM || o->spec == LM_SPEC_MTP))
        die_usage(a, "%s", "--spec and --draft-model exclude each other");
    if (o->max == 0) o->max = o->draft_path ? 3 : 4;
    if (o->min > o->max) die_usage(a, "%s", "--draft-min is above --draft-max");
    if (o->draft_path && cli_tp_size * cli_pp_size * cli_ep_size > 1)
        die_usage(a, "%s", "--draft-model does not run under tensor, pipeline or expert parallelism");
    int kind = o->draft_path ? LM_SPEC_DRAFT : o->spec;
    if (o->draft_path) o->draft = load_or_die(a->cmd, o->draft_path);
    /* every field set: the struct is whole (sizeof), as lm_spec_config_default would make it */
    o->cfg = (lm_spec_config){.size = sizeof o->cfg,
                              .proposer = kind == LM_SPEC_DRAFT || kind == LM_SPEC_MTP ? kind : LM_SPEC_NGRAM,
                              .max = o->max,
                              .draft_model = o->draft,
                              .min = o->min,
                              .p_min = o->p_min,
                              .cost = o->cost,
                              .draft_vocab = o->vocab};
    ec->spec = kind == LM_SPEC_NONE ? NULL : &o->cfg;
}

void spec_opts_free(spec_opts *o) {
    if (o->draft) model_free(o->draft);
    o->draft = NULL;
}

bool chat_template_choice(const char *cmd, const char *v, const char **name, char **text) {
    *name = NULL;
    *text = NULL;
    if (!v) return true;
    if (chat_family_from_name(v) >= 0) {
        *name = v;
        return true;
    }
    struct stat st;
    if (stat(v, &st) != 0) return false;
    size_t len;
    char err[LM_ERRLEN];
    *text = safefile_read(v, &len, err, sizeof err); /* a directory or FIFO is an error */
    if (!*text) fail(cmd, err);
    return true;
}

void ctx_check(const char *cmd, const char *flag, long long n_ctx, int n_train, bool extend) {
    if (n_train <= 0 || n_ctx <= n_train) return;
    if (!extend) {
        fprintf(stderr,
                "lamina %s: %s %lld is above the model's trained context of %d tokens; "
                "pass --ctx-extend to use it anyway\n",
                cmd, flag, n_ctx, n_train);
        exit(1);
    }
    fprintf(stderr,
            "lamina %s: warning: %s %lld is past the model's trained context of %d tokens (--ctx-extend); "
            "output past position %d may be of poor quality\n",
            cmd, flag, n_ctx, n_train, n_train);
}

void progress_begin(progress_line *p, const char *cmd, const char *what, const char *unit) {
    *p = (progress_line){.on = progress_force || isatty(2) == 1, .cmd = cmd, .what = what, .unit = unit, .after = 2.0};
    const char *env = getenv("LAMINA_PROGRESS_AFTER");
    if (env && *env) {
        char *end;
        double x = strtod(env, &end);
        if (!*end && x >= 0) p->after = x;
    }
    p->start = lm_now();
    p->last = -1e30;
}

void progress_bytes(progress_line *p, unsigned long long done, unsigned long long total) {
    p->bytes = done;
    p->bytes_total = total;
}

void progress_note(progress_line *p, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->note, sizeof p->note, fmt, ap);
    va_end(ap);
}

/* "1 h 02 min", "3 min 05 s", "12 s". */
static void fmt_eta(char *b, size_t n, double s) {
    long long t = (long long)(s + 0.5);
    if (t >= 3600) snprintf(b, n, "%lld h %02lld min", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(b, n, "%lld min %02lld s", t / 60, t % 60);
    else snprintf(b, n, "%lld s", t);
}

void progress_update(progress_line *p, long long done, long long total) {
    if (!p->on) return;
    double now = lm_now();
    if (now - p->start < p->after || (now - p->last < 0.25 && done != total)) return; /* the end is always drawn */
    p->last = now;
    p->shown = true;
    if (!p->unit) /* a share only: done of total percent */
        fprintf(stderr, "\r\033[K%s: %s (%.0f%%)", p->cmd, p->what, total > 0 ? 100.0 * done / total : 0.0);
    else if (total > 0)
        fprintf(stderr, "\r\033[K%s: %s %lld/%lld %s (%.0f%%)", p->cmd, p->what, done, total, p->unit,
                100.0 * (double)done / (double)total);
    else fprintf(stderr, "\r\033[K%s: %s %lld %s", p->cmd, p->what, done, p->unit);
    if (p->bytes_total)
        fprintf(stderr, ", %.1f/%.1f MiB", (double)p->bytes / 1048576.0, (double)p->bytes_total / 1048576.0);
    if (p->note[0]) fprintf(stderr, ", %s", p->note);
    double frac = p->bytes_total ? (double)p->bytes / (double)p->bytes_total
        : total > 0              ? (double)done / (double)total
                                 : 0;
    if (frac > 0 && frac < 1) {
        char eta[32];
        fmt_eta(eta, sizeof eta, (now - p->start) * (1 - frac) / frac);
        fprintf(stderr, ", ETA %s", eta);
    }
    fflush(stderr);
}

void progress_hide(progress_line *p) {
    if (p->shown) fprintf(stderr, "\r\033[K");
    p->shown = false;
    p->last = -1e30; /* drawn again at the next update */
}

void progress_end(progress_line *p) {
    if (p->shown) fprintf(stderr, "\r\033[K");
    fflush(stderr);
    p->shown = false;
}

/* ---- the memory budget ---------------------------------------------------- */

/* The first number after `key` in a file (key NULL: the file's first number). */
static bool read_num(const char *path, const char *key, uint64_t *out) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[256];
    bool ok = false;
    while (!ok && fgets(line, sizeof line, f)) {
        const char *p = line;
        if (key) {
            if (strncmp(line, key, strlen(key)) != 0) continue;
            p += strlen(key);
        }
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end != p) *out = v, ok = true;
        if (!key) break;
    }
    fclose(f);
    return ok;
}

uint64_t mem_available(void) {
    const char *env = getenv("LAMINA_MEM_AVAILABLE");
    if (env && *env) return strtoull(env, NULL, 10);
    uint64_t avail = 0, lim, used;
    if (read_num("/proc/meminfo", "MemAvailable:", &avail)) avail *= 1024;
    /* cgroup v2, then v1 ("max" or a huge v1 value reads as no limit) */
    if ((read_num("/sys/fs/cgroup/memory.max", NULL, &lim) && read_num("/sys/fs/cgroup/memory.current", NULL, &used)) ||
        (read_num("/sys/fs/cgroup/memory/memory.limit_in_bytes", NULL, &lim) &&
         read_num("/sys/fs/cgroup/memory/memory.usage_in_bytes", NULL, &used))) {
        uint64_t left = lim > used ? lim - used : 0;
        if (lim < (1ull << 60) && (avail == 0 || left < avail)) avail = left;
    }
    return avail;
}

void mem_apply(lm_engine_config *c, unsigned long long mem) {
    if (mem) {
        c->mem = mem;
        c->mem_cap = false;
    } else if (!c->kv_mem) {
        c->mem = (uint64_t)((double)mem_available() * MEM_DEFAULT_FRACTION);
        c->mem_cap = true;
    }
}

static const char *hb(uint64_t b, char *buf, size_t n) {
    if (b >= (1ull << 30)) snprintf(buf, n, "%.2f GiB", (double)b / (double)(1ull << 30));
    else if (b >= (1ull << 20)) snprintf(buf, n, "%.1f MiB", (double)b / (double)(1ull << 20));
    else snprintf(buf, n, "%.1f KiB", (double)b / 1024.0);
    return buf;
}

void mem_print(FILE *f, const char *cmd, const lm_engine_stats *st, uint32_t kv_type, int n_ctx) {
    char a[32], b[32], c[32], d[32], e[32], g[32];
    uint64_t draft = st->mem_draft_weights + st->mem_draft_workspace + st->mem_draft_kv;
    uint64_t used = st->mem_weights + st->mem_packed + st->mem_workspace + st->mem_state + st->mem_kv + draft;
    char dpart[48] = "", spart[80] = "";
    if (draft) snprintf(dpart, sizeof dpart, " + draft model %s", hb(draft, g, sizeof g));
    char h[32];
    if (st->mem_state_snap)
        snprintf(spart, sizeof spart, " + state %s (of it snapshots %s)", hb(st->mem_state, g, sizeof g),
                 hb(st->mem_state_snap, h, sizeof h));
    else if (st->mem_state) snprintf(spart, sizeof spart, " + state %s", hb(st->mem_state, g, sizeof g));
    if (st->mem_budget)
        fprintf(f, "lamina %s: memory budget %s = weights %s + workspace %s%s + KV %s%s + unused %s\n", cmd,
                hb(st->mem_budget, a, sizeof a), hb(st->mem_weights + st->mem_packed, b, sizeof b),
                hb(st->mem_workspace, c, sizeof c), spart, hb(st->mem_kv, d, sizeof d), dpart,
                hb(st->mem_budget > used ? st->mem_budget - used : 0, e, sizeof e));
    else
        fprintf(f, "lamina %s: memory (no budget) weights %s + workspace %s%s + KV %s%s = %s\n", cmd,
                hb(st->mem_weights + st->mem_packed, b, sizeof b), hb(st->mem_workspace, c, sizeof c), spart,
                hb(st->mem_kv, d, sizeof d), dpart, hb(used, a, sizeof a));
    fprintf(f, "lamina %s: KV pool %s: %lld tokens, %lld sequence%s of %d at once\n", cmd, quant_type_name(kv_type),
            (long long)st->kv_max_tokens, (long long)st->kv_max_seqs, st->kv_max_seqs == 1 ? "" : "s", n_ctx);
    if (draft)
        fprintf(f, "lamina %s: draft model %s = weights %s + workspace %s + KV %s (F16)\n", cmd, hb(draft, g, sizeof g),
                hb(st->mem_draft_weights, b, sizeof b), hb(st->mem_draft_workspace, c, sizeof c),
                hb(st->mem_draft_kv, d, sizeof d));
}

void drain_wait(const char *cmd, sigset_t *stop, int sig, double drain, int (*active)(void *), void *obj) {
    int busy = active(obj);
    if (busy <= 0 || drain <= 0) return;
    const char *why = sig == SIGINT ? "interrupted" : "terminated";
    fprintf(stderr, "lamina %s: %s, finishing %d request%s in progress (at most %.0f s; Ctrl-C again stops at once)\n",
            cmd, why, busy, busy == 1 ? "" : "s", drain);
    double until = lm_now() + drain;
    while (active(obj) > 0 && lm_now() < until) {
        struct timespec ts = {0, 50000000};
        if (sigtimedwait(stop, NULL, &ts) > 0) break; /* a second signal */
    }
    busy = active(obj);
    if (busy > 0) fprintf(stderr, "lamina %s: cancelling %d request%s\n", cmd, busy, busy == 1 ? "" : "s");
}
