/*
 * chat_model.c - a model's chat template: which one to use (the user's
 * choice, the GGUF's tokenizer.chat_template, the architecture's family) and
 * rendering a conversation for the model's tokenizer (its BOS/EOS texts, the
 * BOS it adds itself): chat_apply, chat_apply_tools, and chat_prompt, the one
 * call that gives a conversation's whole prompt (tools and the thinking
 * switch included). See chat.h for the order and the BOS rule.
 *
 * Invariants: a resolved lm_chat_template holds exactly one of a family
 * (>= 0) and an owned template text whose family chat_detect recognizes; on
 * any failure it is left empty, so chat_template_free is always safe.
 */
#include "text/chat.h"

#include <string.h>

#include "base/util.h"

/* Architectures whose files may lack a template but whose turn format is
 * known (general.architecture -> family name). */
static const struct {
    const char *arch, *family;
} FALLBACK[] = {
    {"gemma3", "gemma"},
    {"gemma2", "gemma"},
    {"qwen3", "qwen3"},
    {"qwen3moe", "qwen3"},
    {"qwen35", "qwen3.5"},
    {"qwen35moe", "qwen3.5"},
    {"phi3", "phi3"},
    {"gpt-oss", "gpt-oss"},
    /* Qwen3-Next's templates are Qwen3's (<tool_call> JSON, not Qwen3.5's <function=) */
    {"qwen3next", "qwen3"},
};

static int fallback_family(const gguf_ctx *g) {
    gguf_str a;
    if (!g || !gguf_get_str(g, "general.architecture", &a)) return -1;
    for (size_t i = 0; i < sizeof FALLBACK / sizeof FALLBACK[0]; i++)
        if (gguf_str_eq(a, FALLBACK[i].arch)) return chat_family_from_name(FALLBACK[i].family);
    return -1;
}

/* Take a template text (copied) whose family must be detected. */
static int take_text(lm_chat_template *t, const char *text, size_t len, lm_chat_source src, char *err, size_t errlen) {
    char *copy = lm_strndup(text, len);
    if (!copy) return lm_err(err, errlen, "out of memory reading the chat template");
    if (chat_detect(copy) < 0) {
        lm_free(copy);
        return lm_err(err, errlen,
                      "the %s chat template is not one lamina recognizes; choose a family by name: "
                      "chatml, llama2, llama3, mistral-legacy, mistral-v1, mistral-v3, mistral-v3-tekken, gemma, "
                      "phi3, zephyr, qwen3, qwen3.5, deepseek3, deepseek-r1, gpt-oss",
                      src == CHAT_SRC_FILE ? "given" : "model's");
    }
    t->text = copy;
    t->source = src;
    return CHAT_OK;
}

int chat_template_resolve(lm_chat_template *t, const gguf_ctx *g, const char *name, const char *user_text, char *err,
                          size_t errlen) {
    *t = (lm_chat_template){.family = -1, .text = NULL, .source = CHAT_SRC_NAME};
    if (name) {
        t->family = chat_family_from_name(name);
        if (t->family < 0) return lm_err(err, errlen, "chat template '%.100s' is not a known family name", name);
        return CHAT_OK;
    }
    if (user_text) return take_text(t, user_text, strlen(user_text), CHAT_SRC_FILE, err, errlen);
    gguf_str s;
    if (g && gguf_get_str(g, "tokenizer.chat_template", &s))
        return take_text(t, s.ptr, s.len, CHAT_SRC_MODEL, err, errlen);
    t->family = fallback_family(g);
    if (t->family >= 0) {
        t->source = CHAT_SRC_FALLBACK;
        return CHAT_OK;
    }
    lm_err(err, errlen, "the model has no chat template (tokenizer.chat_template)");
    return CHAT_NONE;
}

void chat_template_free(lm_chat_template *t) {
    if (!t) return;
    lm_free(t->text);
    t->text = NULL;
    t->family = -1;
}

/* A token's vocabulary text (lm_malloc), "" for id < 0; NULL when out of memory. */
static char *piece_text(const lm_tokenizer *tok, int32_t id) {
    size_t len = 0;
    const char *p = id >= 0 ? tok_piece(tok, id, &len) : NULL;
    return lm_strndup(p ? p : "", p ? len : 0);
}

int chat_apply(int family, const char *text, const lm_tokenizer *tok, const lm_chat_msg *msgs, int n, char **out,
               bool *add_bos, char *err, size_t errlen) {
    *out = NULL;
    *add_bos = tok_add_bos(tok);
    if (family < 0 && !text) return lm_err(err, errlen, "no chat template");
    char *bos = piece_text(tok, tok_bos(tok)), *eos = piece_text(tok, tok_eos(tok));
    int rc = -1;
    if (!bos || !eos) lm_err(err, errlen, "out of memory");
    else if (family >= 0) rc = chat_render(family, msgs, n, true, bos, eos, out, err, errlen);
    else rc = chat_render_template(text, msgs, n, true, bos, eos, out, err, errlen);
    size_t bl = bos ? strlen(bos) : 0;
    if (rc == 0 && *add_bos && bl && strncmp(*out, bos, bl) == 0) memmove(*out, *out + bl, strlen(*out + bl) + 1);
    lm_free(bos);
    lm_free(eos);
    return rc;
}

/* chat_render_conv with the generation prompt, then the BOS rule. */
static int apply_conv(int family, const char *text, const lm_tokenizer *tok, const lm_chat_conv *conv, char **out,
                      bool *add_bos, char *err, size_t errlen) {
    *out = NULL;
    *add_bos = tok_add_bos(tok);
    if (family < 0 && !text) return lm_err(err, errlen, "no chat template");
    char *bos = piece_text(tok, tok_bos(tok)), *eos = piece_text(tok, tok_eos(tok));
    int rc = -1;
    if (!bos || !eos) lm_err(err, errlen, "out of memory");
    else rc = chat_render_conv(family, family >= 0 ? NULL : text, conv, true, bos, eos, out, err, errlen);
    size_t bl = bos ? strlen(bos) : 0;
    if (rc == 0 && *add_bos && bl && strncmp(*out, bos, bl) == 0) memmove(*out, *out + bl, strlen(*out + bl) + 1);
    lm_free(bos);
    lm_free(eos);
    return rc;
}

int chat_apply_tools(int family, const char *text, const lm_tokenizer *tok, const lm_chat_xmsg *msgs, int n,
                     const char *const *tools, int n_tools, char **out, bool *add_bos, char *err, size_t errlen) {
    lm_chat_conv conv = {.msgs = msgs, .n = n, .tools = tools, .n_tools = n_tools};
    return apply_conv(family, text, tok, &conv, out, add_bos, err, errlen);
}

int chat_prompt(int family, const char *text, const lm_tokenizer *tok, const lm_chat_conv *conv, char **out,
                bool *add_bos, char *err, size_t errlen) {
    int rc = apply_conv(family, text, tok, conv, out, add_bos, err, errlen);
    const char *sfx =
        rc == 0 && conv->thinking_off ? chat_thinking_off(family >= 0 ? family : chat_detect(text)) : NULL;
    if (!sfx) return rc;
    size_t tl = strlen(*out), sl = strlen(sfx);
    char *t = lm_malloc(tl + sl + 1);
    if (!t) {
        lm_free(*out);
        *out = NULL;
        return lm_err(err, errlen, "out of memory");
    }
    memcpy(t, *out, tl);
    memcpy(t + tl, sfx, sl + 1);
    lm_free(*out);
    *out = t;
    return 0;
}
