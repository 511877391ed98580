/*
 * lamina.c - the command-line front end. Each subcommand parses its own
 * flags, calls into the library, prints, and decides the exit status:
 * 0 success, 1 failure (message on stderr), 2 usage error.
 *
 * run generates through the engine (sched/engine.h) as the server does: one
 * request on an engine with one sequence slot, its text printed from the
 * event callback; chat prompts are rendered by chat_template_resolve and
 * chat_apply (text/chat.h), also the server's. tokenize needs only the
 * tokenizer, so a vocabulary-only GGUF file works too.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "text/chat.h"
#include "text/reasoning.h"
#include "cli.h"
#include "format/convert.h"
#include "model/embed.h"
#include "model/forward.h"
#include "format/gguf.h"
#include "model/model.h"
#include "base/pool.h"
#include "base/safefile.h"
#include "format/quant.h"
#include "kernels/kernels.h"
#include "decode/json_schema.h"
#include "decode/sample.h"
#include "kv/kv.h"
#include "sched/engine.h"
#include "text/tokenizer.h"
#include "base/strbuf.h"
#include "base/util.h"
#include "dist/dist.h"
#include "version.h"

/* ---- run --------------------------------------------------------------- */

static void usage_run(FILE *f) {
    fprintf(f,
            "usage: lamina run [-m] MODEL.gguf -p PROMPT [options]\n"
            "Generate text after PROMPT, printing it as it is produced; a stats line goes to stderr.\n\n"
            "  -m, --model FILE     GGUF model\n"
            "  -p, --prompt TEXT    prompt text\n"
            "  -f, --file FILE      read the prompt from a file\n"
            "  -n, --n-predict N    tokens to generate (default 128; -1: until EOS or context end)\n"
            "  -c, --ctx-size N     context length (default: the model's, at most 4096)\n"
            "      --ctx-extend     allow -c above the model's trained context (with a warning)\n"
            "  -t, --threads N      threads (default: physical cores)\n"
            "      --kv-type T      KV cache element type: F16 (default), F32, Q8_0\n"
            "      --mem BYTES      memory budget, e.g. 2G: weights, workspace and the one sequence's KV\n"
            "                       must fit in it, or it is an error (default: 80%% of the memory\n"
            "                       available); prints the split\n"
            "      --temp T         temperature (default 0.8; 0 = greedy)\n"
            "      --top-k K        top-k (default 40; 0 = off)\n"
            "      --top-p P        top-p (default 0.95; 1 = off)\n"
            "      --min-p P        min-p (default 0.05; 0 = off)\n"
            "      --repeat-penalty R  repetition penalty (default 1 = off)\n"
            "      --repeat-last-n N   penalty window (default 64)\n"
            "      --frequency-penalty F, --presence-penalty P\n"
            "      --seed S         RNG seed (default 0)\n"
            "      --ignore-eos     keep generating past end-of-generation tokens\n"
            "      --grammar FILE   constrain the output to a GBNF grammar (root rule \"root\"):\n"
            "                       tokens that cannot continue it are never sampled, and the\n"
            "                       text ends when the grammar is complete\n"
            "      --json-schema FILE  constrain the output to JSON that validates against the JSON\n"
            "                       Schema in FILE (compiled to a grammar; unsupported keywords\n"
            "                       are refused, naming them and where they are)\n"
            "      --json           constrain the output to a JSON object\n"
            "      --spec ngram     speculative decoding by prompt lookup: tokens that followed an\n"
            "                       earlier occurrence of the text's last words are proposed and\n"
            "                       verified in one pass (greedy output is unchanged; sampled\n"
            "                       output keeps its distribution)\n"
            "      --spec mtp       speculative decoding by the model's next-token-prediction layer\n"
            "                       (qwen35 files with one; refused by name without): greedy\n"
            "                       drafts chained from the model's own states\n"
            "      --draft-model FILE  speculative decoding by a draft model: a smaller model with the\n"
            "                       same tokenizer guesses, the model verifies (its own KV, kept in\n"
            "                       step; sampled output keeps the model's distribution)\n"
            "      --draft-max K    tokens proposed per step at most (default 4, 3 with --draft-model;\n"
            "                       adapted to acceptance and, for a draft, its cost)\n"
            "      --draft-min N    with --draft-model: fewer guesses than N propose nothing (default 0)\n"
            "      --draft-p-min P  with --draft-model: stop guessing where the draft's top probability\n"
            "                       is below P (default 0)\n"
            "      --draft-cost P   with --draft-model: a draft pass's price as a share of a model pass,\n"
            "                       for sizing guesses (default: timed at start; negative: guesses\n"
            "                       sized by acceptance alone)\n"
            "      --draft-vocab N  with --draft-model: the draft's LM head computes only N tokens' logits\n"
            "                       (the best ranked by the tokenizer) and the sequence's own tokens\n"
            "                       (default 32768 for vocabularies over 65536, else all; 0: all)\n"
            "      --spec-widths W:T,...  the model pass's time at W rows, relative to one row (W = 1\n"
            "                       among them), which sizes the batch's proposals: guesses widen\n"
            "                       the shared pass (default: timed at start; flat with --draft-cost)\n"
            "      --show-ids       also print the prompt and generated token ids to stderr\n"
            "      --chat           treat the prompt as a user message: render it with the model's\n"
            "                       chat template and print only the reply\n"
            "      --system TEXT    with --chat: a system message first\n"
            "      --chat-template NAME|FILE  with --chat: a template family by name (chatml,\n"
            "                       llama2, llama3, mistral, gemma, phi3, zephyr, ...) or a\n"
            "                       Jinja template file, instead of the model's own\n"
            "      --show-reasoning with --chat, a thinking model (qwen3, qwen3.5, deepseek-r1): its\n"
            "                       reasoning to stderr (dimmed on a terminal); without it only the\n"
            "                       answer is printed\n"
            "      --no-think       with --chat: reasoning off where the template has that switch\n"
            "                       (Qwen3's enable_thinking=False: an empty <think></think> block\n"
            "                       after the prompt); other templates: ignored, with a note\n"
            "      --reasoning-effort low|medium|high  with --chat: gpt-oss's reasoning effort\n"
            "                       (the template's default: medium); other templates: ignored,\n"
            "                       with a note\n"
            "  -h, --help           this text\n");
}

/* Render a one-turn conversation (optional system message, then `user`)
 * with the chosen or the model's chat template (chat_template_resolve), ready
 * to tokenize with special tokens parsed and add_bos = *add_bos. */
static char *render_chat(const lm_model *m, const char *user, const char *system, const char *tmpl_arg, bool no_think,
                         const char *effort, bool *add_bos, int *family_out) {
    char err[LM_ERRLEN];
    lm_chat_xmsg msgs[2];
    int n = 0;
    if (system) msgs[n++] = (lm_chat_xmsg){.role = "system", .content = system};
    msgs[n++] = (lm_chat_xmsg){.role = "user", .content = user};
    const char *name;
    char *file_text;
    if (!chat_template_choice("run", tmpl_arg, &name, &file_text)) {
        fprintf(stderr, "lamina run: --chat-template '%s' is neither a template name nor a readable file\n", tmpl_arg);
        exit(2);
    }
    lm_chat_template t;
    int rc = chat_template_resolve(&t, m->gguf, name, file_text, err, sizeof err);
    free(file_text);
    if (rc == CHAT_NONE) {
        char msg[LM_ERRLEN + 40];
        snprintf(msg, sizeof msg, "%s; pick one with --chat-template", err);
        fail("run", msg);
    }
    if (rc) fail("run", err);
    char *out;
    int family = t.family >= 0 ? t.family : chat_detect(t.text);
    *family_out = family;
    lm_chat_conv conv = {.msgs = msgs, .n = n, .thinking_off = no_think, .reasoning_effort = effort};
    rc = chat_prompt(t.family, t.text, m->tok, &conv, &out, add_bos, err, sizeof err);
    chat_template_free(&t);
    if (rc) fail("run", err);
    if (no_think && !chat_thinking_off(family))
        fprintf(stderr, "lamina run: note: this chat template has no thinking switch; --no-think ignored\n");
    if (effort && family != CHAT_GPT_OSS)
        fprintf(stderr, "lamina run: note: this chat template takes no reasoning effort; --reasoning-effort ignored\n");
    return out;
}

/* What run's event callback (on the engine thread) writes and the main
 * thread reads once done is set. */
typedef struct {
    const lm_tokenizer *tok;
    bool ignore_eos;
    bool quiet;       /* -n 0: the one token the engine must sample is not output */
    int32_t *gen_ids; /* (ids_cap) generated ids for --show-ids, or NULL */
    int ids_cap;
    int n_gen; /* tokens output (an end-of-generation token is not) */
    lm_finish finish;
    lm_request_stats stats;
    char error[LM_ERRLEN];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    /* the prompt is echoed when the first event comes (after the prefill), so
     * that a progress line on a terminal never overwrites it */
    const char *echo; /* (echo_len) bytes to print first, or NULL */
    size_t echo_len;
    bool prefilled;     /* the first event came (under mu) */
    progress_line prog; /* the prefill's progress line (under mu) */
    /* --chat with a thinking family: the reasoning apart (text/reasoning.h),
     * to stderr with --show-reasoning (dimmed on a terminal), else dropped */
    bool split, show_reasoning, dim, reasoned;
    lm_reason rs;
} run_out;

/* The text of one event: as it is, or split into reasoning and answer. */
static void run_text(run_out *o, const char *s, size_t n, bool final) {
    if (!o->split) {
        fwrite(s, 1, n, stdout);
        return;
    }
    lm_reason_out ro = {0};
    reason_feed(&o->rs, s, n, final, &ro);
    for (int k = 0; k < ro.n; k++) {
        const lm_reason_seg *g = &ro.seg[k];
        const char *p = ro.text.p + g->off;
        if (g->kind == RSEG_REASONING) {
            if (!o->show_reasoning) continue;
            if (o->dim) fputs("\x1b[2m", stderr);
            fwrite(p, 1, g->len, stderr);
            if (o->dim) fputs("\x1b[0m", stderr);
            fflush(stderr);
            o->reasoned = true;
            continue;
        }
        if (o->reasoned) { /* the reasoning's line ends before the answer */
            fputc('\n', stderr);
            o->reasoned = false;
        }
        if (g->kind == RSEG_CALL) printf("[call %.*s] ", (int)g->len, p);
        else fwrite(p, 1, g->len, stdout);
    }
    if (final && o->reasoned) fputc('\n', stderr);
    reason_out_free(&ro);
}

/* The first event: the prefill is over; clear its progress line, then echo
 * the prompt. */
static void run_first_event(run_out *o) {
    pthread_mutex_lock(&o->mu);
    bool first = !o->prefilled;
    if (first) {
        o->prefilled = true;
        progress_end(&o->prog);
    }
    pthread_mutex_unlock(&o->mu);
    if (first && o->echo) {
        fwrite(o->echo, 1, o->echo_len, stdout);
        fflush(stdout);
    }
}

/* Print each token's text as it comes; at the end, the text the
 * detokenizer still held, then wake the main thread. */
static void run_event(void *user, const lm_event *ev) {
    run_out *o = user;
    run_first_event(o);
    if (!ev->done) {
        if (o->quiet || (!o->ignore_eos && tok_is_eog(o->tok, ev->token))) return;
        if (o->gen_ids && o->n_gen < o->ids_cap) o->gen_ids[o->n_gen] = ev->token;
        o->n_gen++;
        run_text(o, ev->text, ev->text_len, false);
        fflush(stdout);
        return;
    }
    if (!o->quiet && ev->finish != LM_FINISH_ERROR) run_text(o, ev->text, ev->text_len, true);
    pthread_mutex_lock(&o->mu);
    o->finish = ev->finish;
    o->stats = *ev->stats;
    snprintf(o->error, sizeof o->error, "%s", ev->error ? ev->error : "");
    o->done = true;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

/* Wait for the request to end; meanwhile, on a terminal, show how much of the
 * prompt (n_tok tokens) the engine has prefilled, from its batch-token count
 * (it runs this one request alone). The engine's stats are read outside
 * o->mu: the engine thread holds its own lock while it calls run_event. */
static void wait_run(lm_engine *eng, run_out *o, int n_tok) {
    bool poll = o->prog.on; /* until the prefill is over */
    for (;;) {
        lm_engine_stats st;
        if (poll) engine_stats(eng, &st);
        pthread_mutex_lock(&o->mu);
        if (o->done) {
            pthread_mutex_unlock(&o->mu);
            return;
        }
        if (o->prefilled) poll = false;
        if (poll)
            progress_update(
                &o->prog,
                (long long)(st.batch_tokens_total < (uint64_t)n_tok ? st.batch_tokens_total : (uint64_t)n_tok), n_tok);
        if (!poll) {
            pthread_cond_wait(&o->cv, &o->mu);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100 * 1000 * 1000;
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&o->cv, &o->mu, &ts);
        }
        pthread_mutex_unlock(&o->mu);
    }
}

/* The engine for one sequence of n_ctx positions: its KV pool holds exactly
 * that sequence, whatever its size (the engine's default caps a pool at 4 GiB). */
static lm_engine *run_engine(const lm_model *m, int n_ctx, int threads, uint32_t kv_type, const spec_opts *so,
                             const lm_engine_config *sc, unsigned long long mem) {
    char err[LM_ERRLEN];
    lm_engine_config ec = *sc; /* its speculation fields */
    ec.n_threads = threads;
    ec.max_seqs = 1;
    ec.n_ctx = n_ctx;
    ec.kv_type = kv_type;
    ec.prefix_cache = false;
    fwd_dims d = fwd_dims_make(m, n_ctx, ec.batch_tokens); /* the sizes engine_new derives */
    kv_config kc;
    fwd_kv_config(m, &d, &kc);
    kc.type = kv_type;
    kc.block_size = ec.block_size;
    kc.n_seqs = 1;
    kv_plan pl;
    if (kv_plan_make(&kc, &pl, err, sizeof err) != KV_OK) fail("run", err);
    if (pl.data_bytes > (4ull << 30)) ec.kv_mem = pl.data_bytes;
    /* a budget bounds the one sequence's pool: weights, workspace and the
     * sequence must fit, the rest stays unused */
    if (mem) ec.kv_mem = 0;
    mem_apply(&ec, mem);
    ec.mem_cap = true;
    lm_status status;
    lm_engine *e =
        engine_new_tuned(m, m->tok, &ec, &(engine_tuning){.spec_widths = so->widths}, &status, err, sizeof err);
    if (!e) fail("run", err);
    if (mem) {
        lm_engine_stats st;
        engine_stats(e, &st);
        mem_print(stderr, "run", &st, kv_type, engine_n_ctx(e));
    }
    return e;
}

static int cmd_run(int argc, char **argv) {
    args a = {argc, argv, 0, "run", usage_run};
    const char *model = NULL, *prompt = NULL, *pfile = NULL;
    long long n_predict = 128, n_ctx = 0, threads = pool_default_threads();
    bool ignore_eos = false, show_ids = false, chat = false, ctx_extend = false, no_think = false;
    bool show_reasoning = false;
    int family = -1;
    uint32_t kv_type = LM_TYPE_F16;
    const char *system = NULL, *chat_tmpl = NULL, *gfile = NULL, *sfile = NULL, *effort = NULL;
    bool json_any = false;
    unsigned long long mem = 0;
    spec_opts so;
    spec_opts_default(&so);
    lm_sample_params sp;
    sample_params_default(&sp);
    for (a.i = 1; a.i < argc; a.i++) {
        if (is_help(&a)) continue;
        if (is_flag(&a, "-m", "--model")) model = need_val(&a);
        else if (is_flag(&a, "-p", "--prompt")) prompt = need_val(&a);
        else if (is_flag(&a, "-f", "--file")) pfile = need_val(&a);
        else if (is_flag(&a, "-n", "--n-predict")) n_predict = need_int(&a, -1, 1 << 30);
        else if (is_flag(&a, "-c", "--ctx-size")) n_ctx = need_int(&a, 0, 1 << 24);
        else if (is_flag(&a, "--ctx-extend", NULL)) ctx_extend = true;
        else if (is_flag(&a, "-t", "--threads")) threads = need_int(&a, 1, 1024);
        else if (is_flag(&a, "--kv-type", NULL)) kv_type = need_kv_type(&a);
        else if (is_flag(&a, "--mem", NULL)) mem = need_bytes(&a);
        else if (is_flag(&a, "--temp", NULL)) sp.temp = (float)need_float(&a, 0, 100);
        else if (is_flag(&a, "--top-k", NULL)) sp.top_k = (int)need_int(&a, 0, 1 << 30);
        else if (is_flag(&a, "--top-p", NULL)) sp.top_p = (float)need_float(&a, 0, 1);
        else if (is_flag(&a, "--min-p", NULL)) sp.min_p = (float)need_float(&a, 0, 1);
        else if (is_flag(&a, "--repeat-penalty", NULL)) sp.repeat_penalty = (float)need_float(&a, 0, 100);
        else if (is_flag(&a, "--repeat-last-n", NULL)) sp.repeat_last_n = (int)need_int(&a, -1, 1 << 30);
        else if (is_flag(&a, "--frequency-penalty", NULL)) sp.freq_penalty = (float)need_float(&a, -2, 2);
        else if (is_flag(&a, "--presence-penalty", NULL)) sp.presence_penalty = (float)need_float(&a, -2, 2);
        else if (is_flag(&a, "--seed", NULL)) sp.seed = (uint64_t)need_int(&a, 0, 0x7fffffffffffffffLL);
        else if (is_flag(&a, "--ignore-eos", NULL)) ignore_eos = true;
        else if (is_flag(&a, "--grammar", NULL)) gfile = need_val(&a);
        else if (is_flag(&a, "--json-schema", NULL)) sfile = need_val(&a);
        else if (is_flag(&a, "--json", NULL)) json_any = true;
        else if (is_flag(&a, "--show-ids", NULL)) show_ids = true;
        else if (spec_opts_flag(&a, &so)) continue;
        else if (is_flag(&a, "--chat", NULL)) chat = true;
        else if (is_flag(&a, "--system", NULL)) system = need_val(&a);
        else if (is_flag(&a, "--chat-template", NULL)) chat_tmpl = need_val(&a);
        else if (is_flag(&a, "--no-think", NULL)) no_think = true;
        else if (is_flag(&a, "--show-reasoning", NULL)) show_reasoning = true;
        else if (is_flag(&a, "--reasoning-effort", NULL)) {
            effort = need_val(&a);
            if (!chat_effort_valid(effort))
                die_usage(&a, "--reasoning-effort must be low, medium or high, not '%s'", effort);
        } else die_usage(&a, "unknown argument '%s'", argv[a.i]);
    }
    char *pbuf = NULL;
    size_t plen = 0;
    if (pfile) {
        char rerr[LM_ERRLEN];
        pbuf = safefile_read(pfile, &plen, rerr, sizeof rerr);
        if (!pbuf) fail("run", rerr);
        prompt = pbuf;
    }
    if (!prompt) die_usage(&a, "%s", "no prompt given (-p TEXT or -f FILE)");
    if (!pfile) plen = strlen(prompt);
    if ((gfile != NULL) + (sfile != NULL) + json_any > 1)
        die_usage(&a, "%s", "--grammar, --json-schema and --json exclude each other");
    char *gbuf = NULL;
    size_t glen = 0;
    if (gfile) {
        char rerr[LM_ERRLEN];
        if (!(gbuf = safefile_read(gfile, &glen, rerr, sizeof rerr))) fail("run", rerr);
        if (glen == 0) fail("run", "the grammar file is empty");
    } else if (sfile) { /* the schema's grammar */
        char rerr[LM_ERRLEN];
        size_t slen;
        char *sbuf = safefile_read(sfile, &slen, rerr, sizeof rerr);
        if (!sbuf) fail("run", rerr);
        gbuf = json_schema_to_gbnf(sbuf, slen, rerr, sizeof rerr);
        lm_free(sbuf);
        if (!gbuf) fail("run", rerr);
        glen = strlen(gbuf);
    } else if (json_any) {
        if (!(gbuf = json_schema_any_object_gbnf())) fail("run", "out of memory");
        glen = strlen(gbuf);
    }

    double t0 = lm_now();
    lm_model *m = load_or_die("run", model);
    if (!m->tok) fail("run", "the model file has no tokenizer");
    /* default context: the model's, capped at 4096 so a 128k-context model
     * does not reserve a huge cache for a short run */
    if (n_ctx == 0) n_ctx = m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096;
    ctx_check("run", "-c", n_ctx, m->hp.n_ctx_train, ctx_extend);
    lm_engine_config sec;
    engine_config_default(&sec);
    spec_opts_apply(&a, &so, &sec);
    lm_engine *eng = run_engine(m, (int)n_ctx, (int)threads, kv_type, &so, &sec, mem);
    double t_load = lm_now() - t0;

    char *rendered = NULL;
    bool add_bos = tok_add_bos(m->tok);
    if (chat) {
        rendered = render_chat(m, prompt, system, chat_tmpl, no_think, effort, &add_bos, &family);
        prompt = rendered;
        plen = strlen(rendered);
    }
    int32_t *toks = NULL;
    int n_tok = encode_all(m->tok, prompt, plen, add_bos, true, &toks);
    if (n_tok < 0) fail("run", "tokenization failed");
    if (n_tok == 0) fail("run", "the prompt encodes to no tokens");
    char err[LM_ERRLEN];
    if (n_tok >= n_ctx) {
        snprintf(err, sizeof err, "the prompt has %d tokens, which does not fit the context of %d (use -c)", n_tok,
                 (int)n_ctx);
        fail("run", err);
    }
    /* one request; -n -1 runs until the end of text or of the context, and
     * -n 0 still samples one token, which is not output */
    run_out out = {.tok = m->tok, .ignore_eos = ignore_eos, .quiet = n_predict == 0};
    if (chat && reason_syntax(family) != REASON_NONE) {
        out.split = true;
        out.show_reasoning = show_reasoning;
        out.dim = isatty(2);
        reason_init(&out.rs, reason_syntax(family), reason_prompt_open(rendered, strlen(rendered)));
    } else if (chat && show_reasoning) {
        fprintf(stderr, "lamina run: note: this chat template has no reasoning; --show-reasoning ignored\n");
    }
    pthread_mutex_init(&out.mu, NULL);
    pthread_cond_init(&out.cv, NULL);
    if (show_ids) {
        out.ids_cap = (int)(n_predict < 0 || n_predict > n_ctx ? n_ctx : n_predict) + 1;
        if (!(out.gen_ids = malloc((size_t)out.ids_cap * sizeof(int32_t)))) fail("run", "out of memory");
    }
    lm_request_params rp;
    engine_request_params_default(&rp);
    rp.prompt = toks;
    rp.n_prompt = n_tok;
    /* more than fits asks for the rest of the context (engine_fit_context) */
    rp.max_tokens = n_predict < 0 || n_predict > n_ctx + 1 - n_tok ? -1 : n_predict == 0 ? 1 : (int)n_predict;
    rp.sp = sp;
    rp.ignore_eos = ignore_eos;
    rp.penalize_prompt = true;
    rp.grammar = gbuf;
    rp.grammar_len = glen;
    rp.special_text = out.split && out.rs.syntax == REASON_HARMONY; /* its channels' markers */
    rp.on_event = run_event;
    rp.user = &out;

    if (!chat) {
        out.echo = prompt;
        out.echo_len = plen;
    }
    progress_begin(&out.prog, "run", "prompt", "tokens");
    progress_update(&out.prog, 0, n_tok); /* shown at once only when LAMINA_PROGRESS_AFTER is 0 */
    if (engine_submit(eng, &rp, NULL, err, sizeof err) != LM_OK) {
        if (out.echo) fwrite(out.echo, 1, out.echo_len, stdout);
        fflush(stdout);
        fail("run", err);
    }
    wait_run(eng, &out, n_tok);
    if (out.finish == LM_FINISH_ERROR || out.finish == LM_FINISH_CANCELLED) {
        fflush(stdout);
        fail("run", out.error[0] ? out.error : "generation ended early");
    }
    int n_gen = out.n_gen;
    /* the engine's times: submission -> first token (the prompt), first
     * token -> the end (the generated ones) */
    double t_prompt = out.stats.ttft, t_gen = out.stats.e2e - out.stats.ttft;
    bool ctx_full = out.finish == LM_FINISH_LENGTH && (n_predict < 0 || n_gen < n_predict);
    printf("\n");
    fflush(stdout);
    if (show_ids) {
        /* one write: under mpirun every rank prints these lines, and
         * writes of a few ids each would interleave with the other ranks' */
        strbuf ids = {0};
        strbuf_puts(&ids, "prompt ids:");
        for (int i = 0; i < n_tok; i++) strbuf_printf(&ids, " %d", toks[i]);
        strbuf_puts(&ids, "\ngenerated ids:");
        for (int i = 0; i < n_gen && i < out.ids_cap; i++) strbuf_printf(&ids, " %d", out.gen_ids[i]);
        strbuf_puts(&ids, "\n");
        if (ids.len && write(STDERR_FILENO, ids.p, ids.len) < 0) perror("lamina run: stderr");
        strbuf_free(&ids);
        free(out.gen_ids);
    }
    if (ctx_full)
        fprintf(stderr, "lamina run: stopped: the context of %d tokens is full (%s)\n", (int)n_ctx,
                n_ctx < m->hp.n_ctx_train ? "use -c for more"
                                          : "the model's trained context; -c above it needs --ctx-extend");
    fprintf(stderr, "load %.3f s | prompt %d tok, %.1f tok/s | generated %d tok, %.1f tok/s | threads %d\n", t_load,
            n_tok, t_prompt > 0 ? n_tok / t_prompt : 0.0, n_gen, t_gen > 0 && n_gen > 1 ? (n_gen - 1) / t_gen : 0.0,
            (int)threads);
    if (sec.spec)
        fprintf(stderr, "speculation: %d proposed, %d accepted (%.1f%%), %.2f tokens per verifying pass\n",
                out.stats.spec_proposed, out.stats.spec_accepted,
                out.stats.spec_proposed ? 100.0 * out.stats.spec_accepted / out.stats.spec_proposed : 0.0,
                out.stats.spec_steps ? 1.0 + (double)out.stats.spec_accepted / out.stats.spec_steps : 0.0);
    engine_free(eng);
    pthread_mutex_destroy(&out.mu);
    if (out.split) reason_free(&out.rs);
    pthread_cond_destroy(&out.cv);
    free(toks);
    lm_free(pbuf);
    lm_free(gbuf);
    lm_free(rendered);
    spec_opts_free(&so);
    model_free(m);
    return 0;
}

/* ---- tokenize ---------------------------------------------------------- */

static void usage_tokenize(FILE *f) {
    fprintf(f,
            "usage: lamina tokenize [-m] MODEL.gguf [--ids] [--bos] [--no-parse-special] [--lines] < TEXT\n"
            "Tokenize standard input (no BOS unless --bos); print ids space-separated with --ids,\n"
            "else the vocabulary pieces space-separated. MODEL.gguf may be a whole model or a\n"
            "vocabulary-only file (tokenizer metadata, no tensors). With --lines every input line\n"
            "(without its newline) is tokenized on its own and gives one output line.\n");
}

static int cmd_tokenize(int argc, char **argv) {
    args a = {argc, argv, 0, "tokenize", usage_tokenize};
    const char *model = NULL;
    bool ids = false, bos = false, special = true, lines = false;
    for (a.i = 1; a.i < argc; a.i++) {
        if (is_help(&a)) continue;
        if (is_flag(&a, "-m", "--model")) model = need_val(&a);
        else if (is_flag(&a, "--ids", NULL)) ids = true;
        else if (is_flag(&a, "--bos", NULL)) bos = true;
        else if (is_flag(&a, "--no-parse-special", NULL)) special = false;
        else if (is_flag(&a, "--lines", NULL)) lines = true;
        else die_usage(&a, "unknown argument '%s'", argv[a.i]);
    }
    lm_tokenizer *tok = load_tok_or_die("tokenize", model);
    size_t len;
    char rerr[LM_ERRLEN];
    char *text = safefile_read(NULL, &len, rerr, sizeof rerr);
    if (!text) fail("tokenize", rerr);
    size_t start = 0;
    while (start < len || (!lines && start == 0)) {
        size_t end = len;
        if (lines) {
            const char *nl = memchr(text + start, '\n', len - start);
            end = nl ? (size_t)(nl - text) : len;
        }
        int32_t *toks = NULL;
        int n = encode_all(tok, text + start, end - start, bos, special, &toks);
        if (n < 0) fail("tokenize", "tokenization failed");
        for (int i = 0; i < n; i++) {
            if (i) putchar(' ');
            if (ids) {
                printf("%d", toks[i]);
            } else {
                size_t pl;
                const char *p = tok_piece(tok, toks[i], &pl);
                fwrite(p, 1, pl, stdout);
            }
        }
        putchar('\n');
        free(toks);
        start = end + 1;
        if (!lines) break;
    }
    lm_free(text);
    tok_free(tok);
    return 0;
}

/* ---- convert ----------------------------------------------------------- */

static void usage_convert(FILE *f) {
    fprintf(f,
            "usage: lamina convert --llama2c MODEL.bin --tokenizer TOK.bin -o OUT.gguf\n"
            "Import a llama2.c checkpoint and its tokenizer into a GGUF file (F32 weights).\n");
}

static int cmd_convert(int argc, char **argv) {
    args a = {argc, argv, 0, "convert", usage_convert};
    const char *bin = NULL, *tokf = NULL, *out = NULL;
    for (a.i = 1; a.i < argc; a.i++) {
        if (is_help(&a)) continue;
        if (is_flag(&a, "--llama2c", NULL)) bin = need_val(&a);
        else if (is_flag(&a, "--tokenizer", NULL)) tokf = need_val(&a);
        else if (is_flag(&a, "-o", "--output")) out = need_val(&a);
        else die_usage(&a, "unknown argument '%s'", argv[a.i]);
    }
    if (!bin || !tokf || !out) die_usage(&a, "%s", "--llama2c, --tokenizer and -o are all required");
    char err[LM_ERRLEN];
    if (convert_llama2c(bin, tokf, out, err, sizeof err)) fail("convert", err);
    fprintf(stderr, "wrote %s\n", out);
    return 0;
}

/* ---- info -------------------------------------------------------------- */

static void usage_info(FILE *f) {
    fprintf(f,
            "usage: lamina info [-m] MODEL.gguf [--kv]\n"
            "Print the architecture, shapes, tensor types, parameter count, KV bytes per token and\n"
            "the kernel variant this CPU runs: the best of avx512bf16, avx512vnni, avx512, avxvnni,\n"
            "avx2 (x86-64) or neondot, neon (AArch64), else scalar. LAMINA_CPU=NAME picks one of\n"
            "these, capped at what the CPU has; LAMINA_NO_SIMD=1 keeps the scalar reference.\n"
            "--kv also lists every metadata key.\n");
}

static int cmd_info(int argc, char **argv) {
    args a = {argc, argv, 0, "info", usage_info};
    const char *model = NULL;
    bool kv = false;
    for (a.i = 1; a.i < argc; a.i++) {
        if (is_help(&a)) continue;
        if (is_flag(&a, "-m", "--model")) model = need_val(&a);
        else if (is_flag(&a, "--kv", NULL)) kv = true;
        else if (argv[a.i][0] != '-' && !model) model = argv[a.i]; /* lamina info MODEL.gguf */
        else die_usage(&a, "unknown argument '%s'", argv[a.i]);
    }
    lm_model *m = load_or_die("info", model);
    const lm_hparams *hp = &m->hp;
    gguf_ctx *g = m->gguf;
    if (gguf_n_files(g) > 1)
        printf("file:          %s (GGUF v%u, split: %d files, %llu bytes)\n", model, gguf_version(g), gguf_n_files(g),
               (unsigned long long)gguf_size_all(g));
    else
        printf("file:          %s (GGUF v%u, %llu bytes)\n", model, gguf_version(g),
               (unsigned long long)gguf_file_size(g));
    printf("name:          %s\n", m->name);
    printf("architecture:  %s\n", model_arch_name(hp->arch));
    printf("layers:        %d\n", hp->n_layer);
    printf("embedding:     %d\n", hp->n_embd);
    printf("heads:         %d query, %d key/value (%s), head dim %d\n", hp->n_head, hp->n_head_kv,
           hp->n_head_kv == hp->n_head ? "MHA"
               : hp->n_head_kv == 1    ? "MQA"
                                       : "GQA",
           hp->head_dim);
    printf("feed-forward:  %d\n", hp->n_ff);
    printf("vocabulary:    %d%s\n", hp->n_vocab, m->tok ? "" : " (no tokenizer in file)");
    if (m->tok) printf("tokenizer:     %s, bos %d, eos %d\n", tok_model_name(m->tok), tok_bos(m->tok), tok_eos(m->tok));
    printf("context:       %d (trained)\n", hp->n_ctx_train);
    printf("rope:          %d dims, base %g, %s pairs\n", hp->n_rot, hp->rope_base,
           hp->rope_style == LM_ROPE_NEOX ? "neox (halves)" : "adjacent");
    printf("%s   %g\n", hp->encoder ? "ln epsilon: " : "rms epsilon:", hp->norm_eps);
    printf("output:        %s\n",
           hp->encoder || !m->output.rows ? "none: an encoder's hidden states (non-causal attention)"
               : hp->tied_output          ? "tied to the embedding"
                                          : "separate output.weight");
    if (hp->pooling != LM_POOL_NONE) /* an embedding model (docs/embeddings.md) */
        printf("pooling:       %s%s\n", embed_pooling_name(hp->pooling),
               m->tok && tok_add_eos(m->tok) ? " (EOS appended to each input)" : "");
    printf("parameters:    %llu (%.2f M)\n", (unsigned long long)m->n_params, m->n_params / 1e6);
    printf("weight bytes:  %llu (%.2f MiB)\n", (unsigned long long)m->weight_bytes, m->weight_bytes / 1048576.0);
    printf("KV per token:  %llu bytes F32, %llu bytes F16\n", (unsigned long long)model_kv_bytes_per_token(m, 4),
           (unsigned long long)model_kv_bytes_per_token(m, 2));
    int n_local = 0;
    for (int i = 0; i < hp->n_layer; i++) n_local += m->layer_local[i];
    if (hp->swa_window > 0 && n_local > 0)
        printf("local layers:  %d of %d, sliding window %d tokens%s\n", n_local, hp->n_layer, hp->swa_window,
               n_local < hp->n_layer ? " (the KV cache keeps only the window there: see lamina kv)" : "");
    uint64_t by_type[LM_TYPE_COUNT] = {0};
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        if (t->type < LM_TYPE_COUNT) by_type[t->type]++;
    }
    printf("tensor types: ");
    for (int t = 0; t < LM_TYPE_COUNT; t++)
        if (by_type[t]) printf(" %s x%llu", quant_type_name((uint32_t)t), (unsigned long long)by_type[t]);
    printf(" (%lld tensors)\n", (long long)gguf_n_tensors(g));
    printf("kernels:       %s\n", kernels_isa_name());
    if (*kernels_cap_note()) fprintf(stderr, "note: %s\n", kernels_cap_note());
    if (kv) {
        for (int64_t i = 0; i < gguf_n_kv(g); i++) {
            gguf_str k = gguf_kv_key(g, i), s;
            int64_t iv;
            double fv;
            gguf_arr arr;
            printf("  %.*s = ", (int)k.len, k.ptr);
            if (gguf_kv_str(g, i, &s)) printf("\"%.*s\"\n", (int)(s.len > 80 ? 80 : s.len), s.ptr);
            else if (gguf_kv_arr(g, i, &arr))
                printf("[%s x %llu]\n", gguf_vtype_name(arr.type), (unsigned long long)arr.n);
            else if (gguf_kv_type(g, i) == GGUF_FLOAT32 || gguf_kv_type(g, i) == GGUF_FLOAT64) {
                gguf_kv_float(g, i, &fv);
                printf("%g\n", fv);
            } else if (gguf_kv_int(g, i, &iv)) printf("%lld\n", (long long)iv);
            else printf("(%s)\n", gguf_vtype_name(gguf_kv_type(g, i)));
        }
    }
    model_free(m);
    return 0;
}

/* ---- main -------------------------------------------------------------- */

static void usage_main(FILE *f) {
    fprintf(f,
            "usage: lamina COMMAND [options]   (lamina COMMAND --help for each)\n\n"
            "commands:\n"
            "  run         generate text from a prompt\n"
            "  tokenize    print the tokens of standard input\n"
            "  perplexity  measure perplexity on a text file (llama.cpp's method)\n"
            "  logits      the largest logits after a prompt (for comparing implementations)\n"
            "  embed       embeddings of texts: hidden states pooled into one vector each\n"
            "  info        describe a GGUF model\n"
            "  convert     import a llama2.c checkpoint into GGUF\n"
            "  bench       measure prompt and generation speed\n"
            "  mkmodel     write a random-weight GGUF of a real shape\n"
            "  quantize    convert a model's weights to another type\n"
            "  kv          KV cache size: bytes per token, tokens and sequences that fit\n"
            "  serve       OpenAI-compatible HTTP server (continuous batching)\n"
            "  route       router in front of serve replicas (admission, prefix affinity, faults)\n"
            "  trace       where concurrency was lost, from a `lamina route --trace` file (and an SVG)\n"
            "  pull        download a model from the hub into the cache (hf://OWNER/REPO/FILE.gguf, OWNER/REPO:TAG)\n"
            "  list        the cached models\n"
            "  rm          remove a cached model\n"
            "  version     the version, commit, compiler and kernel variant (also --version)\n\n"
            "-m (and --draft-model) of every command also takes hf://... and OWNER/REPO:TAG: the cached file,\n"
            "pulled first when absent (lamina pull --help).\n"
            "Long work (loading a large model, quantize, perplexity, mkmodel, bench) draws a progress line\n"
            "when stderr is a terminal; --progress, accepted by every command, draws it on a pipe too.\n"
            "run, bench, perplexity and serve take --tp N: tensor parallelism over N ranks of the MPI\n"
            "build (make MPI=1; mpirun -np N build/mpi/lamina CMD ... --tp N); kv --tp N sizes one rank's cache.\n"
            "--pp M: pipeline parallelism over M stages of contiguous layers (mpirun -np M ... --pp M), with\n"
            "--tp N too on N x M ranks; kv --pp M prints each stage's layers, bytes and KV cache.\n");
}

/* A command that writes a file removes its temporary file when a signal
 * ends it, then dies of the signal as it would have: every signal whose
 * default ends the process and that can be caught (SIGPIPE from `| head`,
 * SIGXFSZ past `ulimit -f`, SIGUSR1, ...). A signal the parent left ignored
 * (nohup's SIGHUP) stays ignored. SIGKILL cannot be caught: the next write
 * of the same output removes that temporary file (base/safefile.h). serve
 * and route take SIGINT and SIGTERM for a clean stop themselves. */
static void on_fatal_signal(int sig) {
    safefile_remove_temps();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void remove_temps_on_signal(void) {
    static const int sigs[] = {SIGINT,  SIGTERM, SIGHUP,  SIGQUIT, SIGPIPE,   SIGXFSZ,
                               SIGXCPU, SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old;
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN) continue;
        signal(sigs[i], on_fatal_signal);
    }
}

/* --tp N, --pp N and --ep N anywhere after the subcommand: taken out of
 * argv here, so every subcommand gets them through load_or_die. `lamina kv
 * --tp N --pp M` only computes (no runtime); any other command starts the
 * runtime and wants exactly N x M ranks (mpirun -np N*M), world rank = stage
 * x N + tensor rank; with --ep E, E x N x M ranks, world rank = (stage x E +
 * expert rank) x N + tensor rank (dist_grid_ep). */
static int take_par(int *argc, char **argv, const char *flag) {
    int v0 = 0, o = 1;
    for (int i = 1; i < *argc; i++) {
        if (i >= 2 && !strcmp(argv[i], flag)) {
            char *end = NULL;
            long v = i + 1 < *argc ? strtol(argv[i + 1], &end, 10) : 0;
            if (!end || *end || v < 1 || v > LM_TP_MAX) {
                fprintf(stderr, "lamina: %s wants a number of ranks from 1 to %d\n", flag, LM_TP_MAX);
                exit(2);
            }
            v0 = (int)v;
            i++;
            continue;
        }
        argv[o++] = argv[i];
    }
    *argc = o;
    argv[o] = NULL;
    return v0;
}

/* --ep-place and --ep-counts: their value taken out of argv as take_par's (NULL: absent). */
static const char *take_str(int *argc, char **argv, const char *flag) {
    const char *v0 = NULL;
    int o = 1;
    for (int i = 1; i < *argc; i++) {
        if (i >= 2 && !strcmp(argv[i], flag)) {
            if (i + 1 >= *argc) {
                fprintf(stderr, "lamina: %s wants a value\n", flag);
                exit(2);
            }
            v0 = argv[++i];
            continue;
        }
        argv[o++] = argv[i];
    }
    *argc = o;
    argv[o] = NULL;
    return v0;
}

/* --ep-place contiguous|balanced [--ep-counts FILE]: the placement load_or_die
 * asks for (cli_ep_counts), checked before the runtime starts. */
static void take_place(int *argc, char **argv, int ep) {
    const char *place = take_str(argc, argv, "--ep-place"), *path = take_str(argc, argv, "--ep-counts");
    if (!place && !path) return;
    if (place && strcmp(place, "contiguous") && strcmp(place, "balanced")) {
        fprintf(stderr, "lamina: --ep-place is contiguous or balanced, not '%s'\n", place);
        exit(2);
    }
    bool balanced = place && !strcmp(place, "balanced");
    if (ep < 2 || (balanced != (path != NULL))) {
        fprintf(stderr, "lamina: %s\n",
                ep < 2     ? "--ep-place and --ep-counts place experts under --ep N (N of 2 or more)"
                    : path ? "--ep-counts gives the counts of --ep-place balanced"
                           : "--ep-place balanced places experts by routing counts: --ep-counts FILE (lamina "
                             "bench --ep N --ep-counts-out FILE writes one)");
        exit(2);
    }
    if (!balanced) return;
    char err[LM_ERRLEN];
    static lm_ep_counts *counts; /* the process's, until it exits */
    if (!(counts = ep_counts_read(path, err, sizeof err))) {
        fprintf(stderr, "lamina: --ep-counts %s\n", err);
        exit(2);
    }
    cli_ep_counts = counts;
}

static int start_tp(int tp, int pp, int ep, int *argc, char ***argv) {
    if (!strcmp((*argv)[1], "kv")) {
        cli_tp_size = tp;
        cli_pp_size = pp;
        cli_ep_size = ep;
        return 0;
    }
    const char *what = ep > 1 ? (pp > 1       ? "--ep/--pp"
                                     : tp > 1 ? "--ep/--tp"
                                              : "--ep")
        : pp > 1              ? (tp > 1 ? "--tp/--pp" : "--pp")
                              : "--tp";
    if (tp * pp * ep > 1 && !dist_available()) {
        fprintf(stderr, "lamina: %s needs the MPI build (make MPI=1, then mpirun -np %d build/mpi/lamina ...)\n", what,
                tp * pp * ep);
        exit(2);
    }
    char err[LM_ERRLEN];
    if (dist_init(argc, argv, err, sizeof err)) {
        fprintf(stderr, "lamina: %s\n", err);
        exit(1);
    }
    if (dist_size() != tp * pp * ep) {
        if (ep > 1)
            fprintf(stderr, "lamina: --ep %d%s wants %d ranks, this job has %d (mpirun -np %d)\n", ep,
                    tp > 1 && pp > 1 ? " with --tp and --pp (ep x tp x pp)"
                        : tp > 1     ? " with --tp (ep x tp)"
                        : pp > 1     ? " with --pp (ep x pp)"
                                     : "",
                    ep * tp * pp, dist_size(), ep * tp * pp);
        else if (pp > 1)
            fprintf(stderr, "lamina: --tp %d --pp %d wants %d ranks (tp x pp), this job has %d (mpirun -np %d)\n", tp,
                    pp, tp * pp, dist_size(), tp * pp);
        else
            fprintf(stderr, "lamina: --tp %d wants %d ranks, this job has %d (mpirun -np %d)\n", tp, tp, dist_size(),
                    tp);
        dist_finalize();
        exit(2);
    }
    if (dist_grid_ep(tp, ep, pp, err, sizeof err)) {
        fprintf(stderr, "lamina: %s\n", err);
        dist_abort(1);
    }
    cli_rank = dist_rank();
    cli_tp_rank = dist_tp_rank();
    cli_tp_size = tp;
    cli_ep_rank = dist_ep_rank();
    cli_ep_size = ep;
    cli_pp_stage = dist_stage();
    cli_pp_size = pp;
    if (cli_rank != 0 && !freopen("/dev/null", "w", stdout)) {
        fprintf(stderr, "lamina: rank %d cannot silence its output\n", cli_rank);
        dist_abort(1);
    }
    return 1;
}

static int run_cmd(int argc, char **argv);

/* lamina --version: the release, the commit it was built from (LAMINA_GIT,
 * from build/gen/version.h; "unknown" outside a git checkout), the compiler
 * and the kernel variant this CPU runs. */
static int cmd_version(void) {
    printf("lamina %s\n", LM_VERSION_STRING);
    printf("commit:   %s\n", LAMINA_GIT);
#if defined(__clang__)
    printf("compiler: clang %s\n", __clang_version__);
#elif defined(__GNUC__)
    printf("compiler: gcc %d.%d.%d\n", __GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__);
#else
    printf("compiler: unknown\n");
#endif
    const char *note = kernels_cap_note();
    bool capped = note && *note;
    printf("kernels:  %s%s%s%s\n", kernels_isa_name(), capped ? " (" : "", capped ? note : "", capped ? ")" : "");
    printf("mpi:      %s\n", dist_available() ? "yes (tensor and pipeline parallel)" : "no (make MPI=1 adds it)");
    return 0;
}

int main(int argc, char **argv) {
    kernels_init();
    int tp = argc >= 2 ? take_par(&argc, argv, "--tp") : 0, pp = argc >= 2 ? take_par(&argc, argv, "--pp") : 0;
    int ep = argc >= 2 ? take_par(&argc, argv, "--ep") : 0;
    if (argc >= 2) take_place(&argc, argv, ep);
    if ((tp || pp || ep) && start_tp(tp ? tp : 1, pp ? pp : 1, ep ? ep : 1, &argc, &argv)) {
        int rc = run_cmd(argc, argv);
        fflush(stdout);
        if (rc) dist_abort(rc); /* the other ranks may wait in a collective */
        dist_finalize();
        return 0;
    }
    return run_cmd(argc, argv);
}

static int run_cmd(int argc, char **argv) {
    if (argc < 2) {
        usage_main(stderr);
        return 2;
    }
    const char *c = argv[1];
    if (!strcmp(c, "-h") || !strcmp(c, "--help") || !strcmp(c, "help")) {
        usage_main(stdout);
        return 0;
    }
    remove_temps_on_signal();
    safefile_guard_inputs(); /* no output onto an input (base/safefile.h) */
    if (!strcmp(c, "pull")) return cmd_pull(argc - 1, argv + 1);
    if (!strcmp(c, "list")) return cmd_list(argc - 1, argv + 1);
    if (!strcmp(c, "rm")) return cmd_rm(argc - 1, argv + 1);
    argv = cli_model_word(&argc, argv); /* lamina run MODEL: -m MODEL (tools/cmd_pull.c) */
    cli_resolve_models(argc, argv);     /* -m hf://... names the cached file */
    if (!strcmp(c, "run")) return cmd_run(argc - 1, argv + 1);
    if (!strcmp(c, "tokenize")) return cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(c, "perplexity")) return cmd_perplexity(argc - 1, argv + 1);
    if (!strcmp(c, "convert")) return cmd_convert(argc - 1, argv + 1);
    if (!strcmp(c, "info")) return cmd_info(argc - 1, argv + 1);
    if (!strcmp(c, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(c, "mkmodel")) return cmd_mkmodel(argc - 1, argv + 1);
    if (!strcmp(c, "quantize")) return cmd_quantize(argc - 1, argv + 1);
    if (!strcmp(c, "kv")) return cmd_kv(argc - 1, argv + 1);
    if (!strcmp(c, "serve")) return cmd_serve(argc - 1, argv + 1);
    if (!strcmp(c, "route")) return cmd_route(argc - 1, argv + 1);
    if (!strcmp(c, "trace")) return cmd_trace(argc - 1, argv + 1);
    if (!strcmp(c, "logits")) return cmd_logits(argc - 1, argv + 1);
    if (!strcmp(c, "embed")) return cmd_embed(argc - 1, argv + 1);
    if (!strcmp(c, "version") || !strcmp(c, "--version") || !strcmp(c, "-V")) return cmd_version();
    fprintf(stderr, "lamina: unknown command '%s'\nTry 'lamina --help'.\n", c);
    return 2;
}
