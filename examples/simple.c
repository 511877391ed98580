/*
 * simple.c - the smallest program on lamina's public API: load a model and
 * stream a greedy completion of a prompt to stdout.
 *
 *   simple MODEL.gguf [PROMPT] [MAX_TOKENS]
 *
 * Prints the prompt, then the completion as the engine releases it, then a
 * newline (the same text as `lamina run -p PROMPT --temp 0 -n MAX_TOKENS`).
 * Build: cc simple.c $(pkg-config --cflags --libs lamina)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lamina.h"

/* What the engine thread reports back about the one request. */
typedef struct {
    lm_finish finish;
    char error[256];
} result;

/* Called on the engine's thread for every token and once more at the end. */
static void on_event(void *user, const lm_event *ev) {
    fwrite(ev->text, 1, ev->text_len, stdout);
    fflush(stdout);
    if (ev->done) {
        result *r = user;
        r->finish = ev->finish;
        if (ev->error) snprintf(r->error, sizeof r->error, "%s", ev->error);
    }
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: %s MODEL.gguf [PROMPT] [MAX_TOKENS]\n", argv[0]);
        return 2;
    }
    const char *prompt = argc > 2 ? argv[2] : "Once upon a time";
    int max_tokens = argc > 3 ? atoi(argv[3]) : 64;
    char err[LM_ERRLEN];

    lm_model *model;
    lm_status st = lm_model_load(argv[1], NULL, &model, err, sizeof err);
    if (st != LM_OK) {
        fprintf(stderr, "simple: %s (%s)\n", err, lm_status_name(st));
        return 1;
    }
    lm_engine *engine;
    if ((st = lm_engine_new(model, NULL, &engine, err, sizeof err)) != LM_OK) {
        fprintf(stderr, "simple: %s (%s)\n", err, lm_status_name(st));
        lm_model_free(model);
        return 1;
    }

    result res = {.finish = LM_FINISH_NONE};
    lm_request_params rp;
    lm_request_params_default(&rp);
    rp.text = prompt;
    rp.text_len = strlen(prompt);
    rp.max_tokens = max_tokens;
    rp.sp.temp = 0; /* greedy */
    rp.on_event = on_event;
    rp.user = &res;
    fputs(prompt, stdout);
    st = lm_engine_submit(engine, &rp, NULL, err, sizeof err);
    if (st == LM_OK) lm_engine_wait_idle(engine); /* every event has arrived once idle */
    putchar('\n');

    int rc = 0;
    if (st != LM_OK) {
        fprintf(stderr, "simple: %s (%s)\n", err, lm_status_name(st));
        rc = 1;
    } else if (res.finish == LM_FINISH_ERROR) {
        fprintf(stderr, "simple: %s\n", res.error);
        rc = 1;
    }
    lm_engine_free(engine);
    lm_model_free(model);
    return rc;
}
