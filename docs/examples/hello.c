/* hello.c - load the bundled model and print a greedy completion. */
#include <stdio.h>
#include <string.h>

#include "lamina.h"

static void on_text(void *user, const lm_event *ev) { (void)user, fwrite(ev->text, 1, ev->text_len, stdout); }

int main(void) {
    char err[LM_ERRLEN];
    lm_model *model;
    lm_engine *engine;
    lm_request_params rp;
    lm_request_params_default(&rp);
    rp.text = "Once upon a time", rp.text_len = strlen(rp.text), rp.max_tokens = 30;
    rp.sp.temp = 0, rp.on_event = on_text; /* greedy; text arrives on the engine's thread */
    fputs(rp.text, stdout); /* the prompt, then the events' text */
    if (lm_model_load("models/stories260K.gguf", NULL, &model, err, sizeof err) != LM_OK ||
        lm_engine_new(model, NULL, &engine, err, sizeof err) != LM_OK ||
        lm_engine_submit(engine, &rp, NULL, err, sizeof err) != LM_OK)
        return fprintf(stderr, "hello: %s\n", err), 1;
    lm_engine_wait_idle(engine); /* every event has arrived */
    putchar('\n');
    lm_engine_free(engine);
    lm_model_free(model);
    return 0;
}
