/*
 * fuzz_chat.c - libFuzzer target for the chat template renderer
 * (text/chat.c): a template text and a conversation, both from the fuzzer's
 * bytes, go through chat_detect, chat_family_from_name, chat_render_template
 * and chat_render for one family; and, as gpt-oss (chat_render_conv), the
 * conversation with the template text as a tool's JSON, every assistant
 * message carrying a call whose arguments are that text, its content the
 * reasoning (the tool schema printer and the harmony renderer).
 *
 * Input layout: byte 0 is the options (bit 0: add_generation_prompt; bits
 * 1..4: the family rendered with chat_render, modulo CHAT_N_FAMILIES); the
 * rest is split at NUL bytes into the template text, then role, content,
 * role, content, ... (at most 16 messages; a role without content gets "").
 * Roles and contents are arbitrary bytes, invalid UTF-8 included.
 *
 * Invariants checked (abort on violation): a successful render returns a
 * non-NULL, NUL-terminated string whose strlen is its length; a failed one
 * sets *out to NULL and writes a non-empty message; chat_detect returns a
 * valid family or -1, and a detected family has a name. ASan/LSan catch
 * crashes and leaks.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "format/gguf.h"
#include "text/chat.h"
#include "text/tokenizer.h"

enum { MAX_MSGS = 16, MAX_FIELDS = 1 + 2 * MAX_MSGS };

static gguf_ctx *model;
static lm_tokenizer *tok;

static void check(int rc, char *out, const char *err) {
    if (rc == 0) {
        if (!out) abort();
        size_t n = strlen(out);
        if (out[n] != '\0') abort();
        lm_free(out);
    } else {
        if (out) abort();
        if (err[0] == '\0') abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!model) {
        char e[256];
        if (!(model = gguf_open("models/stories260K.gguf", e, sizeof e))) abort();
        if (!(tok = tok_load(model, e, sizeof e))) abort();
    }
    if (size < 1) return 0;
    uint8_t opt = data[0];
    /* One NUL-terminated copy, split in place at its NUL bytes. */
    char *buf = malloc(size);
    if (!buf) return 0;
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = '\0';
    const char *field[MAX_FIELDS];
    int nf = 0;
    for (size_t i = 0; i < size && nf < MAX_FIELDS;) {
        field[nf++] = buf + i;
        i += strlen(buf + i) + 1;
    }
    const char *tmpl = field[0];
    lm_chat_msg msgs[MAX_MSGS];
    int n = 0;
    for (int f = 1; f < nf; f += 2) {
        msgs[n].role = field[f];
        msgs[n].content = f + 1 < nf ? field[f + 1] : "";
        n++;
    }
    bool gen = opt & 1;

    int fam = chat_detect(tmpl);
    if (fam < -1 || fam >= CHAT_N_FAMILIES) abort();
    if (fam >= 0 && !chat_family_name(fam)) abort();
    int byname = chat_family_from_name(tmpl);
    if (byname < -1 || byname >= CHAT_N_FAMILIES) abort();

    char err[256];
    char *out;
    err[0] = '\0';
    out = (char *)1;
    check(chat_render_template(tmpl, msgs, n, gen, "<s>", "</s>", &out, err, sizeof err), out, err);

    int family = (opt >> 1) % CHAT_N_FAMILIES;
    if (!chat_family_name(family) || !chat_stop_marker(family)) abort();
    err[0] = '\0';
    out = (char *)1;
    check(chat_render(family, msgs, n, gen, "<s>", "</s>", &out, err, sizeof err), out, err);

    lm_chat_xmsg x[MAX_MSGS];
    lm_chat_call call = {"c1", "f", tmpl};
    for (int i = 0; i < n; i++) {
        bool asst = !strcmp(msgs[i].role, "assistant");
        x[i] = (lm_chat_xmsg){.role = msgs[i].role,
                              .content = msgs[i].content,
                              .calls = asst && (opt & 32) ? &call : NULL,
                              .n_calls = asst && (opt & 32),
                              .reasoning = asst && (opt & 64) ? msgs[i].content : NULL};
    }
    lm_chat_conv conv = {
        .msgs = x, .n = n, .tools = &tmpl, .n_tools = 1, .reasoning_effort = "low", .date = "2025-01-01"};
    err[0] = '\0';
    out = (char *)1;
    check(chat_render_conv(CHAT_GPT_OSS, NULL, &conv, gen, NULL, NULL, &out, err, sizeof err), out, err);

    lm_chat_template t;
    err[0] = '\0';
    int rc = chat_template_resolve(&t, model, NULL, tmpl, err, sizeof err);
    if (rc == CHAT_OK) {
        if ((t.family < 0) == (t.text == NULL)) abort();
        bool add_bos;
        err[0] = '\0';
        out = (char *)1;
        check(chat_apply(t.family, t.text, tok, msgs, n, &out, &add_bos, err, sizeof err), out, err);
        chat_template_free(&t);
    } else if (rc != CHAT_ERR || err[0] == '\0' || t.family != -1 || t.text) {
        abort();
    }
    free(buf);
    return 0;
}
