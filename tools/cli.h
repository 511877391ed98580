/*
 * cli.h - shared pieces of the command-line front end: flag parsing with
 * usage errors (exit 2), failure exits (exit 1), reading files and stdin,
 * tokenizing into a growing buffer, the context-length check against the
 * model's trained context (--ctx-extend), and progress lines on a terminal.
 * Each subcommand lives in its own tools/cmd_*.c (or in lamina.c) as
 * `int cmd_NAME(int argc, char **argv)`.
 */
#ifndef LAMINA_CLI_H
#define LAMINA_CLI_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "lamina.h"
#include "model/model.h"
#include "text/tokenizer.h"

typedef struct {
    int argc;
    char **argv;
    int i;           /* index of the flag being parsed */
    const char *cmd; /* subcommand name, for messages */
    void (*usage)(FILE *);
} args;

/* Print "lamina CMD: <msg>", the usage text, and exit 2. */
void die_usage(args *a, const char *fmt, const char *what) __attribute__((noreturn));
/* The value after the current flag (exit 2 when missing). */
const char *need_val(args *a);
long long need_int(args *a, long long lo, long long hi);
double need_float(args *a, double lo, double hi);
/* Byte count with an optional K/M/G suffix (powers of 1024). */
unsigned long long need_bytes(args *a);
bool is_flag(args *a, const char *s1, const char *s2);
/* -h/--help prints usage to stdout and exits 0. */
bool is_help(args *a);
void fail(const char *cmd, const char *msg) __attribute__((noreturn));
char *read_all(FILE *f, size_t *len);
int encode_all(const lm_tokenizer *tok, const char *text, size_t len, bool bos, bool special, int32_t **out);
lm_model *load_or_die(const char *cmd, const char *path);

/* Tensor parallelism (--tp N, taken out of argv by main before the
 * subcommand parses it): this process is rank cli_tp_rank of cli_tp_size
 * (1: the whole model). load_or_die loads this rank's shard. Every rank
 * runs the same command on the same arguments (mpirun starts them), so the
 * sampling and the KV cache's bookkeeping are the same everywhere; ranks
 * other than 0 write nothing to stdout. */
extern int cli_tp_rank, cli_tp_size;
/* Pipeline parallelism (--pp M, taken out the same way): this process runs
 * stage cli_pp_stage of cli_pp_size; cli_rank is its rank in the job
 * (stage x cli_tp_size + cli_tp_rank), 0 the one that writes. */
extern int cli_rank, cli_pp_stage, cli_pp_size;
/* Expert parallelism (--ep N, taken out the same way; with --tp, each of
 * the N expert ranks of a stage is a tensor group): this process holds the
 * MoE layers' experts of rank cli_ep_rank of cli_ep_size (model/ep.h), its
 * tensor slice of each; load_or_die loads only those. cli_rank is then
 * (stage x cli_ep_size + cli_ep_rank) x cli_tp_size + cli_tp_rank. */
extern int cli_ep_rank, cli_ep_size;
/* --ep-place balanced --ep-counts FILE: the routing count the placement is
 * made from (NULL: contiguous); read by main before the subcommand. */
extern const lm_ep_counts *cli_ep_counts;
/* The routing-count file (tools/ep_counts.c): read (NULL and a message when
 * it is not one), freed, written (-1 and a message). */
lm_ep_counts *ep_counts_read(const char *path, char *err, size_t errlen);
void ep_counts_free(lm_ep_counts *c);
int ep_counts_write(const char *path, const uint64_t *rows, int L, int X, char *err, size_t errlen);
/* The tokenizer of a GGUF file alone (a full model or a vocabulary-only file
 * of any architecture); exits 1 when the file or its tokenizer cannot be read. */
lm_tokenizer *load_tok_or_die(const char *cmd, const char *path);

/* The value of --chat-template: a family name (*name = v) or else a readable
 * file (*text = its contents, to free); false when v is neither. v NULL:
 * both NULL (the model's own template). Out of memory exits 1 (as cmd). */
bool chat_template_choice(const char *cmd, const char *v, const char **name, char **text);

/* Subcommands (tools/lamina.c and tools/cmd_*.c). */
int cmd_bench(int argc, char **argv);
int cmd_bench_serve(int argc, char **argv); /* lamina bench serve */
int cmd_bench_spec(int argc, char **argv);  /* lamina bench spec */
int cmd_mkmodel(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_kv(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_route(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_embed(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_pull(int argc, char **argv); /* lamina pull, list, rm: tools/cmd_pull.c */
int cmd_list(int argc, char **argv);
int cmd_rm(int argc, char **argv);
/* `lamina CMD MODEL ...` as `lamina CMD -m MODEL ...` for the commands
 * that load one model (run, serve, logits, perplexity, kv, tokenize, info;
 * not bench, whose first word may be its mode): argv, or a new one with
 * "-m" before the first word after CMD when that word is not a flag
 * (*argc grows by one); MODEL and -m both: exits 2. */
char **cli_model_word(int *argc, char **argv);
/* Replace the value of every -m, --model and --draft-model that names a
 * hub model (hf://..., OWNER/REPO:TAG; not an existing file) with the
 * cached file's path, pulling it first when absent; exits 1 on failure. */
void cli_resolve_models(int argc, char **argv);

/* The value after the current flag as a KV cache element type (kv_type_from_name:
 * F32, F16, Q8_0); exits 2 otherwise. */
uint32_t need_kv_type(args *a);
/* --state-snapshots N as lm_engine_config.state_snapshots: N > 0 that many,
 * 0 none (-1); exits 2 for a value out of [0, 2^20]. */
int snapshots_flag(args *a);
/* --itl-factor F as lm_engine_config.itl_factor: 0 (no latency bound) or
 * F in [1, 1e6]; exits 2 otherwise. */
double itl_factor_flag(args *a);
/* The value after the current flag as a speculative proposer: "ngram"
 * (LM_SPEC_NGRAM) or "none"/"off" (LM_SPEC_NONE); exits 2 otherwise (a
 * draft model is chosen by --draft-model). */
int need_spec(args *a);

/* Speculative decoding's flags, shared by run, serve, bench spec and bench
 * serve: --spec ngram|none, --draft-model FILE, --draft-max K, --draft-min N,
 * --draft-p-min P, --draft-cost P, --draft-vocab N, --spec-widths W:T,... */
typedef struct {
    int spec;               /* LM_SPEC_* from --spec (LM_SPEC_NONE unless given) */
    const char *draft_path; /* --draft-model */
    int max, min;           /* --draft-max (default 4), --draft-min (default 0) */
    float p_min;            /* --draft-p-min (default 0) */
    float cost;             /* --draft-cost: a draft pass's price as a share of the model's
                               (0, the default: measured at start; negative: no cost model) */
    int vocab;              /* --draft-vocab N: the draft's LM head over N tokens (0: all; default -1:
                               32768 above 65536 tokens) */
    const char *widths;     /* --spec-widths W:T,...: the model pass's time by its rows (NULL: timed) */
    lm_model *draft;        /* loaded by spec_opts_apply */
    lm_spec_config cfg;     /* what spec_opts_apply points the engine config's spec to */
} spec_opts;
void spec_opts_default(spec_opts *o);
/* Whether the current argument is one of those flags (consuming its value). */
bool spec_opts_flag(args *a, spec_opts *o);
/* Check the combination, load the draft model and point the engine
 * config's spec to o->cfg (NULL without a proposer); exits on an error.
 * spec_opts_free frees the draft. o->widths goes to the engine as
 * engine_tuning's (engine_new_tuned). */
void spec_opts_apply(args *a, spec_opts *o, lm_engine_config *ec);
void spec_opts_free(spec_opts *o);

/* The context length a command is about to use (what `flag` asked, or its
 * default), checked against the model's trained context n_train: above it,
 * exit 1 with a message naming both and --ctx-extend, unless extend, when a
 * warning about quality past the trained context goes to stderr instead.
 * n_train <= 0 (not recorded in the file): anything is accepted. The engine
 * itself takes any n_ctx; this check is the command line's. */
void ctx_check(const char *cmd, const char *flag, long long n_ctx, int n_train, bool extend);

/* The memory budget (lm_engine_config.mem). mem_available: what this
 * process may use now, MemAvailable of /proc/meminfo or the cgroup's limit
 * less its usage when lower (v2 memory.max, v1 memory.limit_in_bytes); 0
 * when unknown; LAMINA_MEM_AVAILABLE (bytes) replaces it (tests).
 * mem_apply: --mem BYTES (mem > 0) is the whole budget and the KV pool gets
 * what weights and workspace leave; without it (mem 0) and without --kv-mem
 * the default budget, MEM_DEFAULT_FRACTION of mem_available(), bounds the
 * pool the engine would size anyway (mem_cap); --kv-mem alone keeps its
 * meaning. mem_print: the split and the pool's capacity, two lines, and
 * with a draft model a third with its parts. */
#define MEM_DEFAULT_FRACTION 0.8
uint64_t mem_available(void);
void mem_apply(lm_engine_config *c, unsigned long long mem);
void mem_print(FILE *f, const char *cmd, const lm_engine_stats *st, uint32_t kv_type, int n_ctx);

/* A server's stop (serve, route): after the first of the signals in stop
 * (sig) and the server's quiesce, wait while active(obj) calls are in
 * progress, for at most drain seconds or until a second signal, saying so
 * on stderr. */
void drain_wait(const char *cmd, sigset_t *stop, int sig, double drain, int (*active)(void *), void *obj);

/* Progress of one long phase on stderr, when stderr is a terminal or the
 * command was given --progress (progress_force):
 * "\r<cmd>: <what> <done>/<total> <unit> (<pct>%)[, <MiB>][, <note>][, ETA <t>]"
 * (a NULL unit shows the percentage alone, as model loading does),
 * rewritten in place at most 4 times a second (and at done == total), starting once the phase has
 * run for LAMINA_PROGRESS_AFTER seconds (default 2; 0 shows it at once, as
 * the tests do). The ETA is the time so far scaled by what is left (by
 * bytes when progress_bytes gave them, else by steps). progress_end clears
 * the line. Nothing at all otherwise, so logs and pipes stay clean. */
typedef struct {
    bool on;    /* stderr is a terminal, or --progress */
    bool shown; /* a line is on the screen */
    double start, last, after;
    const char *cmd, *what, *unit;
    unsigned long long bytes, bytes_total; /* progress_bytes: weight of the ETA */
    char note[96];                         /* progress_note: shown after the percentage */
} progress_line;

/* --progress, accepted by every command (is_help sees it first): draw
 * progress lines even when stderr is not a terminal. */
extern bool progress_force;

void progress_begin(progress_line *p, const char *cmd, const char *what, const char *unit);
void progress_update(progress_line *p, long long done, long long total);
/* Bytes done of a total, shown as MiB and used for the ETA (before update). */
void progress_bytes(progress_line *p, unsigned long long done, unsigned long long total);
/* A short figure shown after the percentage ("ppl 12.34"); "" for none. */
void progress_note(progress_line *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Clear the line before printing a line of output under it (the next
 * progress_update draws it again). */
void progress_hide(progress_line *p);
void progress_end(progress_line *p);

#endif
