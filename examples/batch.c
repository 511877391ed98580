/*
 * batch.c - several prompts at once through one engine: every request is
 * submitted before any finishes, the engine runs them together (one flat
 * batch per iteration), and the results are printed per prompt at the end.
 *
 *   batch MODEL.gguf [-n MAX_TOKENS] [PROMPT ...]
 *
 * Each result is a line "=== PROMPT_INDEX FINISH TOKENS" followed by the
 * prompt, its greedy completion and a newline: the same text each prompt
 * gives alone (`simple MODEL.gguf PROMPT MAX_TOKENS`), since a sequence's
 * output does not depend on what else is in the batch.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lamina.h"

/* One prompt's output, filled on the engine's thread. */
typedef struct {
    const char *prompt;
    char *text; /* (len) bytes of completion, grown as events arrive */
    size_t len, cap;
    int tokens;
    lm_finish finish;
    char error[256];
} job;

static void on_event(void *user, const lm_event *ev) {
    job *j = user;
    if (j->len + ev->text_len + 1 > j->cap) {
        size_t cap = 2 * (j->len + ev->text_len + 1);
        char *t = realloc(j->text, cap);
        if (!t) abort(); /* an example: a real program would cancel the request */
        j->text = t;
        j->cap = cap;
    }
    memcpy(j->text + j->len, ev->text, ev->text_len);
    j->len += ev->text_len;
    if (!ev->done) j->tokens++;
    else {
        j->finish = ev->finish;
        if (ev->error) snprintf(j->error, sizeof j->error, "%s", ev->error);
    }
}

int main(int argc, char **argv) {
    static const char *defaults[] = {"Once upon a time", "The little dog", "Lily and Ben went to the park",
                                     "One day, a big bird"};
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [-n MAX_TOKENS] [PROMPT ...]\n", argv[0]);
        return 2;
    }
    int a = 2, max_tokens = 48;
    if (a + 1 < argc && strcmp(argv[a], "-n") == 0) {
        max_tokens = atoi(argv[a + 1]);
        a += 2;
    }
    int n = argc - a;
    const char **prompts = n > 0 ? (const char **)argv + a : defaults;
    if (n == 0) n = (int)(sizeof defaults / sizeof defaults[0]);

    char err[LM_ERRLEN];
    lm_model *model;
    lm_engine *engine;
    lm_status st = lm_model_load(argv[1], NULL, &model, err, sizeof err);
    if (st == LM_OK && (st = lm_engine_new(model, NULL, &engine, err, sizeof err)) != LM_OK) lm_model_free(model);
    if (st != LM_OK) {
        fprintf(stderr, "batch: %s (%s)\n", err, lm_status_name(st));
        return 1;
    }

    job *jobs = calloc((size_t)n, sizeof *jobs);
    int rc = jobs ? 0 : 1;
    for (int i = 0; i < n && !rc; i++) {
        jobs[i].prompt = prompts[i];
        lm_request_params rp;
        lm_request_params_default(&rp);
        rp.text = prompts[i];
        rp.text_len = strlen(prompts[i]);
        rp.max_tokens = max_tokens;
        rp.sp.temp = 0;
        rp.on_event = on_event;
        rp.user = &jobs[i];
        if ((st = lm_engine_submit(engine, &rp, NULL, err, sizeof err)) != LM_OK) {
            fprintf(stderr, "batch: prompt %d: %s (%s)\n", i, err, lm_status_name(st));
            rc = 1;
        }
    }
    lm_engine_wait_idle(engine); /* all submitted requests have delivered their final event */

    lm_engine_stats stats;
    lm_engine_get_stats(engine, &stats);
    for (int i = 0; i < n && jobs; i++) {
        printf("=== %d %s %d\n%s%.*s\n", i, lm_finish_name(jobs[i].finish), jobs[i].tokens, jobs[i].prompt,
               (int)jobs[i].len, jobs[i].text ? jobs[i].text : "");
        if (jobs[i].finish == LM_FINISH_ERROR) {
            fprintf(stderr, "batch: prompt %d: %s\n", i, jobs[i].error);
            rc = 1;
        }
        free(jobs[i].text);
    }
    fprintf(stderr, "batch: %d prompts, %llu iterations, %.2f sequences per iteration\n", n,
            (unsigned long long)stats.iterations,
            stats.iterations ? (double)stats.batch_seqs_total / (double)stats.iterations : 0.0);
    free(jobs);
    lm_engine_free(engine);
    lm_model_free(model);
    return rc;
}
