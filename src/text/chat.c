/*
 * chat.c - chat templates rendered without a Jinja interpreter.
 *
 * Each family is one function that writes what its reference template (see
 * chat.h) writes, in the same order, with the same checks: the comments name
 * the Jinja construct each step stands for. Output goes into a growable
 * buffer (sbuf) that records an allocation failure or a size overflow instead
 * of returning it at every step; the caller checks it once at the end.
 *
 * Invariants: messages are validated (n >= 1, every role one of
 * system/user/assistant, no NULL pointer) before any family code runs, so the
 * family functions index msgs[0..n-1] freely and compare roles by id. Nothing
 * here reads past a NUL: contents are measured with strlen, and the
 * whitespace tests look at most 3 bytes on either side within a known length.
 */
#include "text/chat.h"
#include "text/chat_int.h"

#include <stdint.h>
#include <string.h>

#include "base/strbuf.h"
#include "base/utf8.h"
#include "base/util.h"

/* ------------------------------------------------------------ output buffer */

/* base/strbuf.h's buffer under the short names this file uses. */
typedef strbuf sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) { strbuf_put(b, s, n); }

static void sb_puts(sbuf *b, const char *s) { strbuf_puts(b, s); }

/* ------------------------------------------------- Python's str.strip() */

/*
 * Byte length of the whitespace character (Python str.isspace) that starts
 * at s, given n readable bytes; 0 if s does not start with one. The non-ASCII
 * ones are matched as their UTF-8 encodings: U+0085 and U+00A0 (C2 85,
 * C2 A0), U+1680 (E1 9A 80), U+2000-200A (E2 80 80-8A), U+2028/2029/202F
 * (E2 80 A8/A9/AF), U+205F (E2 81 9F), U+3000 (E3 80 80).
 */
static size_t space_len(const unsigned char *s, size_t n) {
    if (n == 0) return 0;
    unsigned char c = s[0];
    if ((c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20)) return 1;
    if (c == 0xc2 && n >= 2 && (s[1] == 0x85 || s[1] == 0xa0)) return 2;
    if (n < 3) return 0;
    if (c == 0xe1 && s[1] == 0x9a && s[2] == 0x80) return 3;
    if (c == 0xe2 && s[1] == 0x80 && ((s[2] >= 0x80 && s[2] <= 0x8a) || s[2] == 0xa8 || s[2] == 0xa9 || s[2] == 0xaf))
        return 3;
    if (c == 0xe2 && s[1] == 0x81 && s[2] == 0x9f) return 3;
    if (c == 0xe3 && s[1] == 0x80 && s[2] == 0x80) return 3;
    return 0;
}

/* Byte length of a whitespace character that ends s[0..n-1], 0 if none. A
 * continuation byte cannot be ASCII and these lead bytes cannot be
 * continuations, so matching the tail alone finds whole characters in valid
 * UTF-8 (and never splits a valid character in invalid input). */
static size_t space_len_before(const unsigned char *s, size_t n) {
    if (n >= 1 && space_len(s + n - 1, 1) == 1) return 1;
    if (n >= 2 && space_len(s + n - 2, 2) == 2) return 2;
    if (n >= 3 && space_len(s + n - 3, 3) == 3) return 3;
    return 0;
}

/* The span of s[0..n) left after stripping: *start .. *start + *len. */
void chat_strip_span(const char *s, size_t n, size_t *start, size_t *len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, b = n, k;
    while (a < b && (k = space_len(u + a, b - a)) > 0) a += k;
    while (b > a && (k = space_len_before(u + a, b - a)) > 0) b -= k;
    *start = a;
    *len = b - a;
}

/* Jinja's `x | trim` / `x.strip()` of one string, appended. */
static void sb_put_stripped(sbuf *b, const char *s) {
    size_t a, n;
    chat_strip_span(s, strlen(s), &a, &n);
    sb_put(b, s + a, n);
}

/* Strips what was appended since offset p0, in place: for Llama 2, which
 * strips the concatenation of the <<SYS>> block and the first user text. */
static void sb_strip_from(sbuf *b, size_t p0) {
    if (b->failed || b->len <= p0) return;
    size_t a, n;
    chat_strip_span(b->p + p0, b->len - p0, &a, &n);
    memmove(b->p + p0, b->p + p0 + a, n);
    b->len = p0 + n;
    b->p[b->len] = '\0';
}

/* --------------------------------------------------------------- messages */

enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT };

static int role_id(const char *r) {
    if (!strcmp(r, "system")) return ROLE_SYSTEM;
    if (!strcmp(r, "user")) return ROLE_USER;
    if (!strcmp(r, "assistant")) return ROLE_ASSISTANT;
    return -1;
}

static int check_msgs(const lm_chat_msg *m, int n, char *err, size_t errlen) {
    if (!m || n <= 0) return lm_err(err, errlen, "chat: no messages to render");
    for (int i = 0; i < n; i++) {
        if (!m[i].role) return lm_err(err, errlen, "chat: message %d has no role", i);
        if (role_id(m[i].role) < 0)
            return lm_err(err, errlen,
                          "chat: message %d has unknown role '%.40s' (expected system, user or "
                          "assistant)",
                          i, m[i].role);
        if (!m[i].content) return lm_err(err, errlen, "chat: message %d (%s) has no content", i, m[i].role);
    }
    return 0;
}

/* What one rendering needs; msgs are validated. */
typedef struct {
    const lm_chat_msg *m;
    int n;
    bool gen;                   /* add_generation_prompt */
    const char *bos, *eos;      /* never NULL here ("" for none) */
    const char *default_system; /* chatml: written when m[0] is not system; or NULL */
    bool lead_bos;              /* chatml/phi3/zephyr: the template opens with BOS */
} rctx;

static int role_at(const rctx *c, int i) { return role_id(c->m[i].role); }

/* Llama 2, Mistral and Gemma templates: "(message['role'] == 'user') !=
 * (loop.index0 % 2 == 0)" over the messages after an optional system one. */
static bool breaks_alternation(const rctx *c, int i, int k) { return (role_at(c, i) == ROLE_USER) != (k % 2 == 0); }

static int alternation_error(const char *fam, const rctx *c, int i, char *err, size_t errlen) {
    return lm_err(err, errlen,
                  "chat (%s): conversation roles must alternate user/assistant/user/"
                  "assistant/..., starting with user after an optional system message "
                  "(message %d is %s)",
                  fam, i, c->m[i].role);
}

static int late_system_error(const char *fam, int i, char *err, size_t errlen) {
    return lm_err(err, errlen,
                  "chat (%s): only user and assistant roles are supported, with the exception "
                  "of an initial optional system message (message %d is system)",
                  fam, i);
}

/* --------------------------------------------------------------- families */

typedef int (*render_fn)(const rctx *c, sbuf *b, char *err, size_t errlen);

static int render_chatml(const rctx *c, sbuf *b, char *err, size_t errlen) {
    if (c->lead_bos) sb_puts(b, c->bos);
    /* Qwen2.5: {% if messages[0]['role'] != 'system' %}{{ default }}{% endif %} */
    if (c->default_system && role_at(c, 0) != ROLE_SYSTEM) {
        sb_puts(b, "<|im_start|>system\n");
        sb_puts(b, c->default_system);
        sb_puts(b, "<|im_end|>\n");
    }
    for (int i = 0; i < c->n; i++) {
        sb_puts(b, "<|im_start|>");
        sb_puts(b, c->m[i].role);
        sb_puts(b, "\n");
        sb_puts(b, c->m[i].content);
        sb_puts(b, "<|im_end|>\n");
    }
    if (c->gen) sb_puts(b, "<|im_start|>assistant\n");
    return 0;
}

static int render_llama2(const rctx *c, sbuf *b, char *err, size_t errlen) {
    int first = role_at(c, 0) == ROLE_SYSTEM; /* loop_messages = messages[1:] */
    for (int i = first; i < c->n; i++) {
        int k = i - first, r = role_at(c, i);
        if (breaks_alternation(c, i, k)) return alternation_error("llama2", c, i, err, errlen);
        if (r == ROLE_USER) {
            /* bos_token + '[INST] ' + content.strip() + ' [/INST]', where content
             * carries the <<SYS>> block on the first turn */
            sb_puts(b, c->bos);
            sb_puts(b, "[INST] ");
            size_t p0 = b->len;
            if (k == 0 && first) {
                sb_puts(b, "<<SYS>>\n");
                sb_puts(b, c->m[0].content);
                sb_puts(b, "\n<</SYS>>\n\n");
            }
            sb_puts(b, c->m[i].content);
            sb_strip_from(b, p0);
            sb_puts(b, " [/INST]");
        } else if (r == ROLE_ASSISTANT) {
            sb_puts(b, " "); /* ' '  + content.strip() + ' ' + eos_token */
            sb_put_stripped(b, c->m[i].content);
            sb_puts(b, " ");
            sb_puts(b, c->eos);
        }
        /* a system message at an odd position passes the check and is dropped */
    }
    return 0;
}

static int render_llama3(const rctx *c, sbuf *b, char *err, size_t errlen) {
    for (int i = 0; i < c->n; i++) {
        if (i == 0) sb_puts(b, c->bos);
        sb_puts(b, "<|start_header_id|>");
        sb_puts(b, c->m[i].role);
        sb_puts(b, "<|end_header_id|>\n\n");
        sb_put_stripped(b, c->m[i].content);
        sb_puts(b, "<|eot_id|>");
    }
    if (c->gen) sb_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return 0;
}

static int render_mistral_legacy(const rctx *c, sbuf *b, char *err, size_t errlen) {
    sb_puts(b, c->bos);
    for (int i = 0; i < c->n; i++) {
        int r = role_at(c, i);
        if (breaks_alternation(c, i, i))
            return lm_err(err, errlen,
                          "chat (mistral-legacy): conversation roles must alternate "
                          "user/assistant/user/assistant/..., starting with user; this template "
                          "has no system role (message %d is %s)",
                          i, c->m[i].role);
        if (r == ROLE_USER) {
            sb_puts(b, "[INST] ");
            sb_puts(b, c->m[i].content);
            sb_puts(b, " [/INST]");
        } else if (r == ROLE_ASSISTANT) {
            sb_puts(b, c->m[i].content);
            sb_puts(b, c->eos);
        } else {
            return lm_err(err, errlen,
                          "chat (mistral-legacy): only user and assistant roles are supported "
                          "(message %d is system)",
                          i);
        }
    }
    return 0;
}

static int render_mistral_v1(const rctx *c, sbuf *b, char *err, size_t errlen) {
    int first = role_at(c, 0) == ROLE_SYSTEM;
    sb_puts(b, c->bos);
    for (int i = first; i < c->n; i++) {
        int k = i - first, r = role_at(c, i);
        if (breaks_alternation(c, i, k)) return alternation_error("mistral-v1", c, i, err, errlen);
        if (r == ROLE_USER) {
            /* ' [INST] ' + [system_message + '\n\n' on loop.first] + content + ' [/INST]' */
            sb_puts(b, " [INST] ");
            if (k == 0 && first) {
                sb_puts(b, c->m[0].content);
                sb_puts(b, "\n\n");
            }
            sb_puts(b, c->m[i].content);
            sb_puts(b, " [/INST]");
        } else if (r == ROLE_ASSISTANT) {
            sb_puts(b, " ");
            sb_puts(b, c->m[i].content);
            sb_puts(b, c->eos);
        } else {
            return late_system_error("mistral-v1", i, err, errlen);
        }
    }
    return 0;
}

/* mistral-v3 and, with tekken set, mistral-v3-tekken. */
static int render_mistral_v3_any(const rctx *c, sbuf *b, bool tekken, char *err, size_t errlen) {
    const char *fam = tekken ? "mistral-v3-tekken" : "mistral-v3";
    int first = role_at(c, 0) == ROLE_SYSTEM;
    /* The template checks the alternation over all messages before writing. */
    for (int i = first; i < c->n; i++)
        if (breaks_alternation(c, i, i - first)) return alternation_error(fam, c, i, err, errlen);
    sb_puts(b, c->bos);
    for (int i = first; i < c->n; i++) {
        int r = role_at(c, i);
        if (r == ROLE_USER) {
            /* "[INST] " + [system_message + "\n\n" on loop.last] + content + "[/INST]" */
            sb_puts(b, tekken ? "[INST]" : "[INST] ");
            if (i == c->n - 1 && first) {
                sb_puts(b, c->m[0].content);
                sb_puts(b, "\n\n");
            }
            sb_puts(b, c->m[i].content);
            sb_puts(b, "[/INST]");
        } else if (r == ROLE_ASSISTANT) {
            if (tekken) {
                sb_puts(b, c->m[i].content); /* content + eos_token */
            } else {
                sb_puts(b, " "); /* " " + content|trim + eos_token */
                sb_put_stripped(b, c->m[i].content);
            }
            sb_puts(b, c->eos);
        } else {
            return late_system_error(fam, i, err, errlen);
        }
    }
    return 0;
}

static int render_mistral_v3(const rctx *c, sbuf *b, char *err, size_t errlen) {
    return render_mistral_v3_any(c, b, false, err, errlen);
}

static int render_mistral_v3_tekken(const rctx *c, sbuf *b, char *err, size_t errlen) {
    return render_mistral_v3_any(c, b, true, err, errlen);
}

static int render_gemma(const rctx *c, sbuf *b, char *err, size_t errlen) {
    int first = role_at(c, 0) == ROLE_SYSTEM;
    sb_puts(b, c->bos);
    for (int i = first; i < c->n; i++) {
        int k = i - first, r = role_at(c, i);
        if (breaks_alternation(c, i, k)) return alternation_error("gemma", c, i, err, errlen);
        /* '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first) */
        sb_puts(b, "<start_of_turn>");
        sb_puts(b, r == ROLE_ASSISTANT ? "model" : c->m[i].role);
        sb_puts(b, "\n");
        if (k == 0 && first) {
            sb_puts(b, c->m[0].content); /* messages[0]['content'] + '\n\n', untrimmed */
            sb_puts(b, "\n\n");
        }
        sb_put_stripped(b, c->m[i].content);
        sb_puts(b, "<end_of_turn>\n");
    }
    if (c->gen) sb_puts(b, "<start_of_turn>model\n");
    return 0;
}

static int render_phi3(const rctx *c, sbuf *b, char *err, size_t errlen) {
    if (c->lead_bos) sb_puts(b, c->bos);
    for (int i = 0; i < c->n; i++) {
        sb_puts(b, "<|");
        sb_puts(b, c->m[i].role);
        sb_puts(b, "|>\n");
        sb_puts(b, c->m[i].content);
        sb_puts(b, "<|end|>\n");
    }
    sb_puts(b, c->gen ? "<|assistant|>\n" : c->eos); /* {% else %}{{ eos_token }} */
    return 0;
}

static int render_zephyr(const rctx *c, sbuf *b, char *err, size_t errlen) {
    if (c->lead_bos) sb_puts(b, c->bos);
    for (int i = 0; i < c->n; i++) {
        sb_puts(b, "<|");
        sb_puts(b, c->m[i].role);
        sb_puts(b, "|>\n");
        sb_puts(b, c->m[i].content);
        sb_puts(b, c->eos);
        sb_puts(b, "\n"); /* the newline after }} survives trim_blocks */
        if (i == c->n - 1 && c->gen) sb_puts(b, "<|assistant|>\n");
    }
    return 0;
}

/* ------------------------------------------------------ Qwen3 reasoning */

/* The last occurrence of needle in s[0..n), or NULL. */
static const char *last_in(const char *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = n >= k ? n - k + 1 : 0; i-- > 0;)
        if (!memcmp(s + i, needle, k)) return s + i;
    return NULL;
}

/* content.startswith('<tool_response>') and content.endswith('</tool_response>') */
static bool is_tool_response(const char *s) {
    static const char OPEN[] = "<tool_response>", CLOSE[] = "</tool_response>";
    size_t n = strlen(s), k = sizeof CLOSE - 1;
    return !strncmp(s, OPEN, sizeof OPEN - 1) && n >= k && !memcmp(s + n - k, CLOSE, k);
}

/* s[*a..*b) without the newlines Python's strip('\n') takes off the sides
 * named (left, right). */
static void nl_strip(const char *s, size_t *a, size_t *b, bool left, bool right) {
    while (left && *a < *b && s[*a] == '\n') ++*a;
    while (right && *b > *a && s[*b - 1] == '\n') --*b;
}

static void qwen3_assistant(const rctx *c, int i, bool after_query, sbuf *b) {
    const char *s = c->m[i].content;
    size_t n = strlen(s), c0 = 0, c1 = n, r0 = 0, r1 = 0;
    const char *close = strstr(s, "</think>");
    if (close) {
        /* content = content.split('</think>')[-1].lstrip('\n') */
        c0 = (size_t)(last_in(s, n, "</think>") - s) + 8;
        nl_strip(s, &c0, &c1, true, false);
        /* reasoning = split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
        r1 = (size_t)(close - s);
        nl_strip(s, &r0, &r1, false, true);
        const char *open = last_in(s, r1, "<think>");
        r0 = open ? (size_t)(open - s) + 7 : 0;
        nl_strip(s, &r0, &r1, true, false);
    }
    sb_puts(b, "<|im_start|>assistant\n");
    if (after_query && (i == c->n - 1 || r1 > r0)) {
        nl_strip(s, &r0, &r1, true, true);  /* reasoning_content.strip('\n') */
        nl_strip(s, &c0, &c1, true, false); /* content.lstrip('\n') */
        sb_puts(b, "<think>\n");
        sb_put(b, s + r0, r1 - r0);
        sb_puts(b, "\n</think>\n\n");
    }
    sb_put(b, s + c0, c1 - c0);
    sb_puts(b, "<|im_end|>\n");
}

static int render_qwen3(const rctx *c, sbuf *b, char *err, size_t errlen) {
    (void)err, (void)errlen;
    /* ns.last_query_index: the last user message that is no tool response */
    int last_query = c->n - 1;
    for (int i = c->n - 1; i >= 0; i--)
        if (role_at(c, i) == ROLE_USER && !is_tool_response(c->m[i].content)) {
            last_query = i;
            break;
        }
    for (int i = 0; i < c->n; i++) {
        if (role_at(c, i) == ROLE_ASSISTANT) {
            qwen3_assistant(c, i, i > last_query, b);
            continue;
        }
        sb_puts(b, "<|im_start|>");
        sb_puts(b, c->m[i].role);
        sb_puts(b, "\n");
        sb_puts(b, c->m[i].content);
        sb_puts(b, "<|im_end|>\n");
    }
    if (c->gen) sb_puts(b, "<|im_start|>assistant\n");
    return 0;
}

/* The qwen3.5 renderer is chat_tools.c's (it writes tools and calls too):
 * the plain messages as messages without calls. */
static int render_qwen35(const rctx *c, sbuf *b, char *err, size_t errlen) {
    lm_chat_xmsg *x = lm_calloc((size_t)c->n, sizeof *x);
    if (!x) {
        b->failed = true;
        return 0;
    }
    for (int i = 0; i < c->n; i++) x[i] = (lm_chat_xmsg){c->m[i].role, c->m[i].content, NULL, 0, NULL, NULL};
    int rc = chat_render_qwen35(x, c->n, NULL, 0, c->gen, b, err, errlen);
    lm_free(x);
    return rc;
}

/* gpt-oss: chat_harmony.c's renderer, the template's defaults. */
static int render_gpt_oss(const rctx *c, sbuf *b, char *err, size_t errlen) {
    lm_chat_xmsg *x = lm_calloc((size_t)c->n, sizeof *x);
    if (!x) {
        b->failed = true;
        return 0;
    }
    for (int i = 0; i < c->n; i++) x[i] = (lm_chat_xmsg){c->m[i].role, c->m[i].content, NULL, 0, NULL, NULL};
    int rc = chat_render_harmony(x, c->n, NULL, 0, NULL, c->gen, b, err, errlen);
    lm_free(x);
    return rc;
}

/* ------------------------------------------------------------- DeepSeek */

#define DS_USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define DS_ASSISTANT                                                                                                   \
    "<\xef\xbd\x9c"                                                                                                    \
    "Assistant\xef\xbd\x9c>"
#define DS_EOS                                                                                                         \
    "<\xef\xbd\x9c"                                                                                                    \
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"

/* DeepSeek-V3 and the R1 form (r1): see chat.h. */
static void render_deepseek_any(const rctx *c, sbuf *b, bool r1) {
    sb_puts(b, c->bos);
    int last_sys = -1;
    bool first_sp = true;
    for (int i = 0; i < c->n; i++) {
        if (role_at(c, i) != ROLE_SYSTEM) continue;
        last_sys = i;
        if (!r1) { /* ns.system_prompt + ('\n\n' unless first) + content */
            if (!first_sp) sb_puts(b, "\n\n");
            sb_puts(b, c->m[i].content);
            first_sp = false;
        }
    }
    if (r1 && last_sys >= 0) sb_puts(b, c->m[last_sys].content);
    for (int i = 0; i < c->n; i++) {
        const char *s = c->m[i].content;
        int r = role_at(c, i);
        if (r == ROLE_USER) {
            sb_puts(b, DS_USER);
            sb_puts(b, s);
        } else if (r == ROLE_ASSISTANT) {
            const char *tail = r1 ? last_in(s, strlen(s), "</think>") : NULL;
            sb_puts(b, DS_ASSISTANT);
            sb_puts(b, tail ? tail + 8 : s); /* content.split('</think>')[-1] */
            sb_puts(b, DS_EOS);
        }
    }
    if (c->gen) sb_puts(b, r1 ? DS_ASSISTANT "<think>\n" : DS_ASSISTANT);
}

static int render_deepseek3(const rctx *c, sbuf *b, char *err, size_t errlen) {
    (void)err, (void)errlen;
    render_deepseek_any(c, b, false);
    return 0;
}

static int render_deepseek_r1(const rctx *c, sbuf *b, char *err, size_t errlen) {
    (void)err, (void)errlen;
    render_deepseek_any(c, b, true);
    return 0;
}

static const struct {
    const char *name;
    const char *stop;
    render_fn render;
    bool may_lead_bos; /* the reference writes no BOS; a template may add one */
} FAMILIES[CHAT_N_FAMILIES] = {
    [CHAT_CHATML] = {"chatml", "<|im_end|>", render_chatml, true},
    [CHAT_LLAMA2] = {"llama2", "</s>", render_llama2, false},
    [CHAT_LLAMA3] = {"llama3", "<|eot_id|>", render_llama3, false},
    [CHAT_MISTRAL_LEGACY] = {"mistral-legacy", "</s>", render_mistral_legacy, false},
    [CHAT_MISTRAL_V1] = {"mistral-v1", "</s>", render_mistral_v1, false},
    [CHAT_MISTRAL_V3] = {"mistral-v3", "</s>", render_mistral_v3, false},
    [CHAT_MISTRAL_V3_TEKKEN] = {"mistral-v3-tekken", "</s>", render_mistral_v3_tekken, false},
    [CHAT_GEMMA] = {"gemma", "<end_of_turn>", render_gemma, false},
    [CHAT_PHI3] = {"phi3", "<|end|>", render_phi3, true},
    [CHAT_ZEPHYR] = {"zephyr", "</s>", render_zephyr, true},
    [CHAT_QWEN3] = {"qwen3", "<|im_end|>", render_qwen3, false},
    [CHAT_DEEPSEEK3] = {"deepseek3", DS_EOS, render_deepseek3, false},
    [CHAT_DEEPSEEK_R1] = {"deepseek-r1", DS_EOS, render_deepseek_r1, false},
    [CHAT_QWEN35] = {"qwen3.5", "<|im_end|>", render_qwen35, false},
    [CHAT_GPT_OSS] = {"gpt-oss", "<|return|>", render_gpt_oss, false},
};

/* ------------------------------------------------------------------ names */

static bool ascii_ieq(const char *a, const char *b) {
    for (; *a && *b; a++, b++) {
        char x = *a >= 'A' && *a <= 'Z' ? (char)(*a - 'A' + 'a') : *a;
        if (x != *b) return false;
    }
    return *a == *b;
}

int chat_family_from_name(const char *name) {
    if (!name) return -1;
    if (ascii_ieq(name, "mistral")) return CHAT_MISTRAL_V1;
    if (ascii_ieq(name, "qwen35")) return CHAT_QWEN35;
    for (int f = 0; f < CHAT_N_FAMILIES; f++)
        if (ascii_ieq(name, FAMILIES[f].name)) return f;
    return -1;
}

const char *chat_family_name(int family) {
    return family >= 0 && family < CHAT_N_FAMILIES ? FAMILIES[family].name : NULL;
}

const char *chat_stop_marker(int family) {
    return family >= 0 && family < CHAT_N_FAMILIES ? FAMILIES[family].stop : NULL;
}

const char *chat_thinking_off(int family) {
    return family == CHAT_QWEN3 ? "<think>\n\n</think>\n\n" : family == CHAT_QWEN35 ? "\n</think>\n\n" : NULL;
}

/* -------------------------------------------------------------- detection */

static bool has(const char *t, const char *s) { return strstr(t, s) != NULL; }

/* s between single or between double quotes, e.g. '[INST] ' or "[INST] ". */
static bool has_quoted(const char *t, const char *s) {
    char a[64], b[64];
    size_t n = strlen(s);
    if (n + 3 > sizeof a) return false;
    a[0] = '\'';
    b[0] = '"';
    memcpy(a + 1, s, n);
    memcpy(b + 1, s, n);
    a[n + 1] = '\'';
    b[n + 1] = '"';
    a[n + 2] = b[n + 2] = '\0';
    return has(t, a) || has(t, b);
}

static int detect_inst(const char *t) {
    if (has(t, "<<SYS>>")) return CHAT_LLAMA2;
    if (has(t, "[SYSTEM_PROMPT]")) return -1; /* Mistral v7: not rendered */
    if (has_quoted(t, "[INST]")) return CHAT_MISTRAL_V3_TEKKEN;
    if (has_quoted(t, " [INST] ")) return CHAT_MISTRAL_V1;
    if (has_quoted(t, "[INST] ") && has_quoted(t, "[/INST]")) return CHAT_MISTRAL_V3;
    return CHAT_MISTRAL_LEGACY;
}

int chat_detect(const char *t) {
    if (!t) return -1;
    if (has(t, "<|im_start|>") && has(t, "</think>")) return has(t, "<function=") ? CHAT_QWEN35 : CHAT_QWEN3;
    if (has(t, "<|im_start|>")) return has(t, "<|im_sep|>") ? -1 : CHAT_CHATML;
    if (has(t, "<|start_header_id|>")) return CHAT_LLAMA3;
    if (has(t, "<start_of_turn>")) return CHAT_GEMMA;
    if (has(t, "[INST]")) return detect_inst(t);
    /* Phi-3 templates of mid-2024 spell no role: '<|' + message['role'] + '|>' */
    if ((has(t, "<|user|>") || has(t, "<|assistant|>")) && has(t, "<|end|>")) return CHAT_PHI3;
    if (has(t, "<|user|>") && !has(t, "[gMASK]") && (has(t, "eos_token") || has(t, "</s>"))) return CHAT_ZEPHYR;
    if (has(t, DS_ASSISTANT)) return has(t, "</think>") ? CHAT_DEEPSEEK_R1 : CHAT_DEEPSEEK3;
    if (has(t, "<|channel|>") && has(t, "<|start|>")) return CHAT_GPT_OSS;
    return -1;
}

/* ------------------------------------------ what a template text adds */

static int hex_val(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Appends code point cp as UTF-8; false for a surrogate or out of range. */
static bool put_utf8(sbuf *b, uint32_t cp) {
    char u[4];
    int n = utf8_encode(cp, u);
    if (n == 0) return false;
    sb_put(b, u, (size_t)n);
    return true;
}

/*
 * Decodes s[0..e) as the inside of a Jinja string literal delimited by quote
 * q (Jinja decodes literals as Python's unicode-escape does): false if the
 * literal would end before e (an unescaped q) or an escape is not one of
 * \n \t \r \\ \' \" \xHH \uHHHH \UHHHHHHHH.
 */
static bool decode_literal(const char *s, const char *e, char q, sbuf *out) {
    while (s < e) {
        char c = *s++;
        if (c == q) return false;
        if (c != '\\') {
            sb_put(out, &c, 1);
            continue;
        }
        if (s >= e) return false;
        char x = *s++;
        int digits = x == 'x' ? 2 : x == 'u' ? 4 : x == 'U' ? 8 : 0;
        if (digits) {
            uint32_t cp = 0;
            for (int k = 0; k < digits; k++, s++) {
                int h = s < e ? hex_val(*s) : -1;
                if (h < 0 || cp > 0x10ffff) return false;
                cp = cp * 16 + (uint32_t)h;
            }
            if (!put_utf8(out, cp)) return false;
            continue;
        }
        const char *rep = x == 'n' ? "\n"
            : x == 't'             ? "\t"
            : x == 'r'             ? "\r"
            : x == '\\'            ? "\\"
            : x == '\''            ? "'"
            : x == '"'             ? "\""
                                   : NULL;
        if (!rep) return false;
        sb_puts(out, rep);
    }
    return true;
}

/*
 * The fixed system message of a ChatML template: the first string literal
 * that holds a whole system turn, '<|im_start|>system\n TEXT <|im_end|>',
 * with the newline written raw or as \n. Literals that stop before
 * <|im_end|> (concatenations with the first message's content) are skipped.
 * Returns true with the decoded TEXT in *out.
 */
bool chat_default_system(const char *t, sbuf *out) {
    static const char key[] = "<|im_start|>system";
    for (const char *p = strstr(t, key); p; p = strstr(p + 1, key)) {
        if (p == t || (p[-1] != '\'' && p[-1] != '"')) continue;
        const char *s = p + sizeof key - 1;
        if (s[0] == '\n') s += 1;
        else if (s[0] == '\\' && s[1] == 'n') s += 2;
        else continue;
        const char *e = strstr(s, "<|im_end|>");
        if (!e) return false;
        out->len = 0; /* drop what a rejected candidate left */
        bool ok = decode_literal(s, e, p[-1], out);
        if (out->failed) return false; /* out of memory: the caller reports it */
        if (ok) {
            if (out->p) out->p[out->len] = '\0'; /* cap > len once p is allocated */
            return true;
        }
    }
    return false;
}

/* The template's first output is bos_token: {{ bos_token }}, {{- bos_token -}}. */
static bool opens_with_bos(const char *t) {
    while (*t == ' ' || *t == '\t' || *t == '\n' || *t == '\r') t++;
    if (strncmp(t, "{{", 2)) return false;
    t += 2;
    if (*t == '-') t++;
    while (*t == ' ') t++;
    if (strncmp(t, "bos_token", 9)) return false;
    t += 9;
    while (*t == ' ') t++;
    if (*t == '-') t++;
    return !strncmp(t, "}}", 2);
}

/* ------------------------------------------------------------- rendering */

static int render(int family, rctx *c, char **out, char *err, size_t errlen) {
    if (!out) return lm_err(err, errlen, "chat: no output pointer");
    *out = NULL;
    if (family < 0 || family >= CHAT_N_FAMILIES) return lm_err(err, errlen, "chat: invalid template family %d", family);
    if (check_msgs(c->m, c->n, err, errlen)) return -1;
    c->bos = c->bos ? c->bos : "";
    c->eos = c->eos ? c->eos : "";
    sbuf b = {0};
    if (FAMILIES[family].render(c, &b, err, errlen)) {
        lm_free(b.p);
        return -1;
    }
    if (!b.failed && !b.p) { /* nothing written (llama2 with only a system message) */
        b.p = lm_malloc(1);
        if (b.p) b.p[0] = '\0';
        else b.failed = true;
    }
    if (b.failed) {
        lm_free(b.p);
        return lm_err(err, errlen, "chat: out of memory rendering %d messages", c->n);
    }
    *out = b.p;
    return 0;
}

int chat_render(int family, const lm_chat_msg *msgs, int n, bool add_generation_prompt, const char *bos_text,
                const char *eos_text, char **out, char *err, size_t errlen) {
    rctx c = {msgs, n, add_generation_prompt, bos_text, eos_text, NULL, false};
    return render(family, &c, out, err, errlen);
}

int chat_render_template(const char *template_text, const lm_chat_msg *msgs, int n, bool add_generation_prompt,
                         const char *bos_text, const char *eos_text, char **out, char *err, size_t errlen) {
    if (out) *out = NULL;
    int family = chat_detect(template_text);
    if (family < 0)
        return lm_err(err, errlen,
                      "chat: unrecognized chat template (no family lamina knows); choose one "
                      "by name: chatml, llama2, llama3, mistral-legacy, mistral-v1, mistral-v3, "
                      "mistral-v3-tekken, gemma, phi3, zephyr, qwen3, qwen3.5, deepseek3, deepseek-r1, "
                      "gpt-oss");
    rctx c = {msgs, n, add_generation_prompt, bos_text, eos_text, NULL, false};
    c.lead_bos = FAMILIES[family].may_lead_bos && opens_with_bos(template_text);
    sbuf sys = {0};
    if (family == CHAT_CHATML && chat_default_system(template_text, &sys)) c.default_system = sys.p ? sys.p : "";
    if (sys.failed) {
        lm_free(sys.p);
        return lm_err(err, errlen, "chat: out of memory reading the template");
    }
    int rc = render(family, &c, out, err, errlen);
    lm_free(sys.p);
    return rc;
}
