/*
 * chat_harmony.c - gpt-oss's chat format (OpenAI's "harmony"), rendered as
 * its template does (llama.cpp's models/templates/openai-gpt-oss-120b.jinja,
 * the chat_template of openai/gpt-oss-20b and -120b), byte for byte as
 * jinja2 renders it with transformers' settings.
 *
 * What the template writes, in order:
 *   1. its own system message: <|start|>system<|message|> the model
 *      identity, "Knowledge cutoff: 2024-06", "Current date: YYYY-MM-DD"
 *      (strftime_now: the caller's date, or today's in local time),
 *      "Reasoning: EFFORT" (default medium), the valid channels <|end|>;
 *   2. a developer message when the conversation opens with a system
 *      message: "# Instructions\n\n" TEXT "\n\n";
 *   3. per message: a user turn; an assistant answer in the final channel;
 *      a later system message is dropped, as the template drops it;
 *   4. the generation prompt <|start|>assistant.
 * The last assistant message of a render without the generation prompt
 * ends with <|return|> (the training form) and keeps its reasoning (the
 * template's "thinking") in an analysis-channel turn before it; earlier
 * answers drop their reasoning.
 *
 * The template raises (and so does this renderer) on an assistant message
 * whose content or reasoning already holds channel markers.
 */
#include "text/chat.h"
#include "text/chat_int.h"

#include <string.h>
#include <time.h>

#include "base/util.h"

static const char IDENTITY[] = "You are ChatGPT, a large language model trained by OpenAI.";
static const char CHANNEL_MARKERS_ERR[] =
    "chat (gpt-oss): message %d passes <|channel|> tags in its %s; pass the analysis text as the reasoning and the "
    "final text as the content";

/* "<|channel|>analysis<|message|>" in s or "<|channel|>final<|message|>" in s */
static bool has_channel_tags(const char *s) {
    return s && (strstr(s, "<|channel|>analysis<|message|>") || strstr(s, "<|channel|>final<|message|>"));
}

/* strftime_now("%Y-%m-%d"): today in local time, as Python's datetime.now(). */
static void today(char buf[16]) {
    time_t now = time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm) || !strftime(buf, 16, "%Y-%m-%d", &tm)) strcpy(buf, "1970-01-01");
}

/* build_system_message() inside <|start|>system<|message|> ... <|end|>. */
static void put_system(strbuf *b, const char *effort, const char *date, bool tools) {
    char day[16];
    if (!date) {
        today(day);
        date = day;
    }
    strbuf_puts(b, "<|start|>system<|message|>");
    strbuf_puts(b, IDENTITY);
    strbuf_puts(b, "\nKnowledge cutoff: 2024-06\nCurrent date: ");
    strbuf_puts(b, date);
    strbuf_puts(b, "\n\nReasoning: ");
    strbuf_puts(b, effort ? effort : "medium");
    strbuf_puts(b, "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.");
    if (tools) strbuf_puts(b, "\nCalls to these tools must go to the commentary channel: 'functions'.");
    strbuf_puts(b, "<|end|>");
}

int chat_render_harmony(const lm_chat_xmsg *m, int n, const char *const *tools, int n_tools, const char *effort,
                        const char *date, bool gen, strbuf *b, char *err, size_t errlen) {
    (void)tools;
    for (int i = 0; i < n; i++)
        if (!strcmp(m[i].role, "assistant")) {
            if (has_channel_tags(m[i].content)) return lm_err(err, errlen, CHANNEL_MARKERS_ERR, i, "content");
            if (has_channel_tags(m[i].reasoning)) return lm_err(err, errlen, CHANNEL_MARKERS_ERR, i, "reasoning");
        }
    put_system(b, effort, date, n_tools > 0);
    /* developer_message = messages[0].content when it is a system message */
    int first = !strcmp(m[0].role, "system");
    if (first && m[0].content[0]) {
        strbuf_puts(b, "<|start|>developer<|message|># Instructions\n\n");
        strbuf_puts(b, m[0].content);
        strbuf_puts(b, "\n\n<|end|>");
    }
    for (int i = first; i < n; i++) {
        const char *role = m[i].role;
        if (!strcmp(role, "user")) {
            strbuf_puts(b, "<|start|>user<|message|>");
            strbuf_puts(b, m[i].content);
            strbuf_puts(b, "<|end|>");
        } else if (!strcmp(role, "assistant")) {
            bool last = i == n - 1 && !gen;
            if (last && m[i].reasoning) {
                strbuf_puts(b, "<|start|>assistant<|channel|>analysis<|message|>");
                strbuf_puts(b, m[i].reasoning);
                strbuf_puts(b, "<|end|>");
            }
            strbuf_puts(b, "<|start|>assistant<|channel|>final<|message|>");
            strbuf_puts(b, m[i].content);
            strbuf_puts(b, last ? "<|return|>" : "<|end|>");
        }
    }
    if (gen) strbuf_puts(b, "<|start|>assistant");
    return 0;
}
