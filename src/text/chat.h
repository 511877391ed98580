/*
 * chat.h - chat templates: a conversation (role + content messages) to the
 * prompt text a model was tuned on.
 *
 * Models ship their chat format as a Jinja template (the GGUF metadata string
 * tokenizer.chat_template, copied from tokenizer_config.json). lamina has no
 * Jinja interpreter. It recognizes the template's family from marker
 * substrings, as other engines do, and renders that family in C, reproducing
 * one real template byte for byte as transformers' apply_chat_template renders
 * it (tests/test_chat.c compares against jinja2 output of the real templates
 * kept in tests/data/chat/, made by make_golden.py there).
 *
 * Families, and the exact template each reproduces:
 *
 *   chatml             <|im_start|>ROLE\nCONTENT<|im_end|>\n per message, then
 *                      <|im_start|>assistant\n. Reproduces plain ChatML
 *                      (OpenHermes-2.5, Felladrin/Llama-68M-Chat) and, through
 *                      chat_render_template, Qwen2/Qwen2.5-Instruct and
 *                      SmolLM2-Instruct (their default system message) and
 *                      Nous-Hermes-2-Mixtral (a leading BOS).
 *   llama2             meta-llama/Llama-2-7b-chat-hf: BOS before every
 *                      "[INST] ", the system message inside <<SYS>> in the first
 *                      user turn, contents strip()ped, " </s>" after answers.
 *                      Never adds a generation prompt (the template has none).
 *   llama3             meta-llama/Meta-Llama-3-8B-Instruct (the revision that
 *                      tests add_generation_prompt). Llama 3.1/3.2/3.3 templates
 *                      are detected as llama3 too, but they also write a system
 *                      header ("Cutting Knowledge Date: ...") that lamina does
 *                      not: an approximation for those.
 *   mistral-legacy     the first Mistral-7B-Instruct-v0.1/v0.2 and
 *                      Mixtral-8x7B-Instruct-v0.1 template:
 *                      <s>[INST] U [/INST]A</s>[INST] U2 [/INST]; no system role.
 *   mistral-v1         Mistral-7B-Instruct-v0.2 (and v0.1) as published now:
 *                      <s> [INST] U [/INST] A</s> [INST] U2 [/INST], system text
 *                      + "\n\n" before the FIRST user message.
 *                      Also the name "mistral". Mixtral-8x22B's template is
 *                      detected as mistral-v1 but writes one more space before
 *                      </s>: an approximation.
 *   mistral-v3         Mistral-7B-Instruct-v0.3: <s>[INST] U[/INST] A</s>,
 *                      assistant content trim()med, system text + "\n\n"
 *                      before the LAST user message (and dropped when the
 *                      conversation ends with an assistant message, as there).
 *   mistral-v3-tekken  Mistral-Nemo-Instruct-2407: as mistral-v3 without the
 *                      spaces: <s>[INST]U[/INST]A</s>, content not trimmed.
 *                      (Mistral "v7" templates, with [SYSTEM_PROMPT], are not
 *                      supported: chat_detect returns -1.)
 *   gemma              Gemma 3 -it: <bos><start_of_turn>user\nU<end_of_turn>\n
 *                      <start_of_turn>model\nA<end_of_turn>\n, contents
 *                      trim()med, the system text + "\n\n" (untrimmed) at the
 *                      start of the first user turn. Gemma 2's template
 *                      (google/gemma-2-2b-it) writes the same for every
 *                      conversation it accepts; Gemma 1/2 templates raise an
 *                      error on a system message, and lamina folds it in the
 *                      Gemma 3 way instead.
 *   phi3               microsoft/Phi-3-mini-4k-instruct as published now:
 *                      <|user|>\nU<|end|>\n..., then <|assistant|>\n, or EOS
 *                      without the generation prompt. The mid-2024 revision
 *                      with a leading BOS is reproduced by
 *                      chat_render_template. Phi-3.5-mini skips an empty system
 *                      message, which lamina writes: an approximation there.
 *   zephyr             HuggingFaceH4/zephyr-7b-beta (= TinyLlama-1.1B-Chat):
 *                      <|user|>\nU</s>\n..., then <|assistant|>\n.
 *   qwen3              Qwen/Qwen3-0.6B (all Qwen3 chat models): ChatML, and
 *                      an assistant turn's reasoning: text up to </think> is
 *                      dropped from the assistant turns before the last real
 *                      user message (one that is not a <tool_response> block);
 *                      after it, a turn with reasoning, and the last message
 *                      always, is written <think>\nR\n</think>\n\nC (R without
 *                      surrounding newlines, empty when there was none). The
 *                      generation prompt is <|im_start|>assistant\n: thinking
 *                      on, as the template renders when enable_thinking is not
 *                      given; chat_thinking_off gives what it adds when it is
 *                      false.
 *                      QwQ-32B's template is detected as qwen3: an
 *                      approximation there.
 *   qwen3.5            Qwen/Qwen3.5-4B (the Qwen3.5 models' template, also
 *                      the name "qwen35"): ChatML with every content
 *                      strip()ped, a system message only first (a later
 *                      one is an error, and so is a conversation with no
 *                      user message that is not a <tool_response> block),
 *                      and an assistant turn's reasoning: text up to
 *                      </think> is dropped before the last real user
 *                      message; after it every assistant turn is written
 *                      <think>\nR\n</think>\n\nC (R strip()ped, empty when
 *                      there was none). The generation prompt opens the
 *                      reasoning: <|im_start|>assistant\n<think>\n;
 *                      chat_thinking_off gives what closes it when
 *                      enable_thinking is false. Tool calls in its XML form
 *                      (CHAT_TOOLS_XML). StepFun-3.5-Flash's and Nemotron 3
 *                      Nano's templates (ChatML, </think>, <function=) are
 *                      detected as qwen3.5: an approximation there.
 *   deepseek3          deepseek-ai/DeepSeek-V3 (and V2.5's markers): BOS, the
 *                      system messages joined by "\n\n" wherever they stand,
 *                      then <｜User｜>U per user message and
 *                      <｜Assistant｜>A<｜end▁of▁sentence｜> per answer (the
 *                      marker text is written, not eos_text), then
 *                      <｜Assistant｜>.
 *   deepseek-r1        DeepSeek-R1-Distill-Llama-8B (the R1 form): as
 *                      deepseek3, but the system prompt is the LAST system
 *                      message, an answer keeps only the text after its last
 *                      </think>, and the generation prompt is
 *                      <｜Assistant｜><think>\n.
 *   gpt-oss            openai/gpt-oss-20b and -120b (OpenAI's harmony format,
 *                      llama.cpp's models/templates/openai-gpt-oss-120b.jinja):
 *                      <|start|>ROLE<|message|>TEXT<|end|> per message, a
 *                      system message of the template's own first (model
 *                      identity, knowledge cutoff, the current date, the
 *                      reasoning effort, the valid channels), a request's
 *                      leading system message as the developer message's
 *                      "# Instructions", answers in the final channel
 *                      (<|start|>assistant<|channel|>final<|message|>A<|end|>).
 *                      The generation prompt is <|start|>assistant. The
 *                      date and the reasoning effort are lm_chat_conv's
 *                      (chat_render_conv, chat_prompt); chat_render writes
 *                      today's date and the default effort, medium. Tools,
 *                      calls, results and an answer's reasoning
 *                      (lm_chat_xmsg.reasoning) as chat_harmony.c says;
 *                      one difference: a tool without a description is
 *                      written with an empty one (jinja2 raises there,
 *                      llama.cpp's engine writes ""). Detected by
 *                      <|channel|> with <|start|>.
 *
 * Where the real template raises an exception, chat_render fails with a
 * message: roles not alternating user/assistant (after an optional leading
 * system message) in llama2, mistral-* and gemma, a system message later in
 * the conversation in mistral-*; in gpt-oss, channel tags in an answer, a
 * tool result with no call before it, tool calls with both content and
 * reasoning. Where the real template silently drops a message (llama2
 * ignores a system message at an odd position, gpt-oss every system message
 * after the first), so does lamina. Roles other than system/user/assistant, a NULL role or content,
 * and an empty conversation are errors in every family.
 *
 * Contents are copied byte for byte; "trim"/"strip" removes leading and
 * trailing characters that Python's str.isspace() accepts (ASCII blanks,
 * U+001C-001F, U+0085, U+00A0, U+1680, U+2000-200A, U+2028, U+2029, U+202F,
 * U+205F, U+3000), decoded from UTF-8; bytes that are not valid UTF-8 are
 * never stripped. Contents are not parsed for template syntax.
 *
 * BOS and double BOS. The rendered text contains bos_text wherever the
 * template writes bos_token (at the start for llama3, mistral-*, gemma; before
 * each user turn for llama2) and eos_text wherever it writes eos_token. The
 * tokenizer must then see special tokens (parse_special = true), and must not
 * add a second BOS. The rule, which is what llama.cpp's server does:
 *     if the model adds BOS when tokenizing (tok_add_bos) and the text starts
 *     with bos_text, skip that prefix and tokenize with add_bos = true;
 *     otherwise tokenize the whole text with add_bos = tok_add_bos.
 * (Skipping the leading BOS text and letting the tokenizer add the BOS token
 * gives one BOS either way.) Pass the vocabulary's BOS/EOS token texts
 * ("<s>", "<|begin_of_text|>", "<bos>"; NULL means ""): rendering without
 * bos_text would lose the BOS that llama2 writes before later turns.
 *
 * Selecting a family: chat_detect on the model's template text; or a name for
 * a --chat-template NAME flag (chat_family_from_name; a value that is no
 * family name can be read as a file holding a template's text and passed to
 * chat_detect / chat_render_template).
 */
#ifndef LAMINA_CHAT_H
#define LAMINA_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "lamina.h"
#include "base/strbuf.h"
#include "format/gguf.h"
#include "text/tokenizer.h"

/* lm_chat_msg is in lamina.h. */

enum {
    CHAT_CHATML,
    CHAT_LLAMA2,
    CHAT_LLAMA3,
    CHAT_MISTRAL_LEGACY,
    CHAT_MISTRAL_V1,
    CHAT_MISTRAL_V3,
    CHAT_MISTRAL_V3_TEKKEN,
    CHAT_GEMMA,
    CHAT_PHI3,
    CHAT_ZEPHYR,
    CHAT_QWEN3,
    CHAT_DEEPSEEK3,
    CHAT_DEEPSEEK_R1,
    CHAT_QWEN35,
    CHAT_GPT_OSS,
    CHAT_N_FAMILIES
};

/*
 * The family of a Jinja template text, or -1 when no rule matches (NULL and
 * "" included). Rules, first match wins:
 *   <|im_start|>, </think>, <function=  qwen3.5
 *   <|im_start|> and </think>           qwen3
 *   <|im_start|>                        chatml (but -1 with <|im_sep|>: Phi-4)
 *   <|start_header_id|>                 llama3
 *   <start_of_turn>                     gemma
 *   [INST] and <<SYS>>                  llama2
 *   [INST] and [SYSTEM_PROMPT]          -1 (Mistral v7)
 *   '[INST]' or "[INST]" (quoted)       mistral-v3-tekken
 *   ' [INST] ' or " [INST] "            mistral-v1
 *   '[INST] ' and '[/INST]' (or "...")  mistral-v3
 *   any other [INST]                    mistral-legacy ('[INST] ' ... ' [/INST]')
 *   <|user|> or <|assistant|>, <|end|>  phi3
 *   <|user|>, eos_token or </s>         zephyr (but -1 with [gMASK]: GLM)
 *   <｜Assistant｜> and </think>          deepseek-r1
 *   <｜Assistant｜>                       deepseek3
 *   <|channel|> and <|start|>           gpt-oss
 */
int chat_detect(const char *template_text);

/* Family by name ("chatml", "llama2", "llama3", "mistral-legacy",
 * "mistral-v1" or "mistral", "mistral-v3", "mistral-v3-tekken", "gemma",
 * "phi3", "zephyr", "qwen3", "qwen3.5" or "qwen35", "deepseek3",
 * "deepseek-r1", "gpt-oss"; ASCII case ignored), or -1. */
int chat_family_from_name(const char *name);
/* Canonical name of a family; NULL for an invalid id. */
const char *chat_family_name(int family);

/*
 * The text that ends an assistant turn: "<|im_end|>", "<|eot_id|>",
 * "<end_of_turn>", "<|end|>", and "</s>" for the families whose turns end
 * with the model's EOS token (llama2, mistral-*, zephyr); "<|return|>" for
 * gpt-oss, whose answer ends there (a tool call ends with <|call|>, also an
 * end-of-generation token of its vocabulary). A generation loop
 * stops on it (as a token, through tok_is_eog, or as text). NULL for an
 * invalid id.
 */
const char *chat_stop_marker(int family);

/*
 * What the family's template writes after the generation prompt when the
 * request turns thinking off (transformers' enable_thinking=False, which
 * OpenAI-style servers take as chat_template_kwargs.enable_thinking):
 * "<think>\n\n</think>\n\n" for qwen3 (an empty reasoning block, so the
 * model answers at once), "\n</think>\n\n" for qwen3.5 (whose generation
 * prompt already opens <think>\n: the same empty block); NULL for the
 * families without that switch (deepseek-r1 always opens <think>). Append
 * it to a render made with the generation prompt.
 */
const char *chat_thinking_off(int family);

/*
 * Render n messages in a family. add_generation_prompt appends the header of
 * an assistant turn (families without one ignore it). bos_text/eos_text may
 * be NULL (""). On success returns 0 and *out holds a NUL-terminated string
 * allocated with lm_malloc (the caller lm_frees it). On failure returns -1,
 * sets *out to NULL and writes a message into err.
 */
int chat_render(int family, const lm_chat_msg *msgs, int n, bool add_generation_prompt, const char *bos_text,
                const char *eos_text, char **out, char *err, size_t errlen);

/*
 * chat_detect + chat_render for a model's own template text, also applying
 * what the text says beyond its family: a fixed system message a ChatML
 * template writes when the conversation has none (Qwen2/2.5, SmolLM2: found as
 * one string literal "<|im_start|>system\n...<|im_end|>" in the template,
 * prepended when msgs[0] is not a system message), and a template that opens
 * with {{ bos_token }} in the families that otherwise write no BOS (chatml,
 * phi3, zephyr). Fails (-1) on an unrecognized template.
 */
int chat_render_template(const char *template_text, const lm_chat_msg *msgs, int n, bool add_generation_prompt,
                         const char *bos_text, const char *eos_text, char **out, char *err, size_t errlen);

/*
 * A model's chat template, resolved once (text/chat_model.c), for every
 * caller that renders conversations for a model (lamina run --chat, serve).
 *
 * Resolution order:
 *   1. the user's choice: a family name (chat_family_from_name), or the text
 *      of a template file the user gave (its family must be detected);
 *   2. the model's own template, the GGUF string tokenizer.chat_template
 *      (its family must be detected);
 *   3. the family fallback of the architecture (general.architecture): a
 *      Gemma 3 file without a template speaks Gemma's turn format.
 * Exactly one of family >= 0 / text != NULL holds: a template text renders
 * through chat_render_template (which applies what the text says beyond its
 * family), a family through chat_render.
 */
typedef enum {
    CHAT_SRC_NAME,     /* a family named by the user */
    CHAT_SRC_FILE,     /* a template text given by the user */
    CHAT_SRC_MODEL,    /* tokenizer.chat_template */
    CHAT_SRC_FALLBACK, /* the architecture's family */
} lm_chat_source;

typedef struct {
    int family; /* >= 0: render this family by name; -1 with text */
    char *text; /* (owned, lm_malloc) template text, or NULL with family */
    lm_chat_source source;
} lm_chat_template;

enum { CHAT_OK = 0, CHAT_ERR = -1, CHAT_NONE = -2 };

/*
 * Resolve the template of the GGUF file g (may be NULL: no model template,
 * no fallback) given the user's choice: name (a family name, or NULL) or
 * user_text (a template's text, or NULL); name wins when both are given.
 * Returns CHAT_OK with *t filled (chat_template_free it), or, with *t empty
 * (family -1, text NULL) and a message in err:
 *   CHAT_ERR   the name is no family, or the chosen or the model's template
 *              is not one chat_detect recognizes;
 *   CHAT_NONE  no choice, no model template and no fallback ("the model has
 *              no chat template (tokenizer.chat_template)": callers add how
 *              to choose one).
 * Never prints or exits.
 */
int chat_template_resolve(lm_chat_template *t, const gguf_ctx *g, const char *name, const char *user_text, char *err,
                          size_t errlen);
void chat_template_free(lm_chat_template *t);

/*
 * Render msgs with the generation prompt, by family (family >= 0) or template
 * text (chat_render_template), for tokenizer tok: bos_text/eos_text are its
 * BOS/EOS token texts, and the BOS rule above is applied: when tok adds BOS
 * and the rendered text starts with its BOS text, that prefix is removed.
 * On success *out (lm_malloc, NUL-terminated) is to be tokenized with
 * parse_special and add_bos = *add_bos (which is tok_add_bos). On failure
 * returns -1, *out NULL, a message in err.
 */
int chat_apply(int family, const char *text, const lm_tokenizer *tok, const lm_chat_msg *msgs, int n, char **out,
               bool *add_bos, char *err, size_t errlen);

/* ------------------------------------------------------------------ tools */

/*
 * Conversations with tools (text/chat_tools.c): OpenAI's function tools, the
 * assistant's tool calls and the tool results, rendered the way each family
 * shows them. Five tool-call syntaxes; the family picks one:
 *
 *   CHAT_TOOLS_HERMES   <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>,
 *                       one block per call; results in a user turn as
 *                       <tool_response>\nRESULT\n</tool_response>; the tools
 *                       listed in the system turn inside <tools></tools>.
 *                       Reproduces Qwen2.5-Instruct's template (chatml) and
 *                       Qwen3's (qwen3: no default system text). The
 *                       generic fallback of the families that have no tool
 *                       format of their own (gemma, phi3, zephyr, llama2,
 *                       mistral-legacy, mistral-v1): the same text, in the
 *                       system turn (mistral-legacy, which has none: at the
 *                       start of the first user turn); a tool turn is a user
 *                       turn, joined to an adjacent user turn in the families
 *                       whose roles must alternate.
 *   CHAT_TOOLS_LLAMA3   {"name": N, "parameters": {...}}, the whole assistant
 *                       turn (one call a line); results in an "ipython" turn;
 *                       the tools (JSON, indent 4) and Llama 3.1's
 *                       instructions at the start of the first user turn,
 *                       "Environment: ipython" in the system turn. Llama
 *                       3.1's template, less its date lines (lamina's llama3
 *                       writes none either).
 *   CHAT_TOOLS_MISTRAL  [TOOL_CALLS] [{"name": N, "arguments": {...}, "id": I}, ...]
 *                       then EOS; results as [TOOL_RESULTS] {"content": R,
 *                       "call_id": I}[/TOOL_RESULTS]; the tools in
 *                       [AVAILABLE_TOOLS] [...][/AVAILABLE_TOOLS] before the
 *                       last user turn. Reproduces Mistral-7B-Instruct-v0.3
 *                       (mistral-v3) and Mistral-Nemo (mistral-v3-tekken,
 *                       without the spaces after the markers), except that
 *                       ids are written as given (the templates refuse ids
 *                       that are not 9 characters).
 *   CHAT_TOOLS_XML      <tool_call>\n<function=N>\n<parameter=K>\nV\n</parameter>\n
 *                       ...</function>\n</tool_call>, one block per call,
 *                       a parameter per member of the arguments object (V:
 *                       a string as it is, an object or array as JSON,
 *                       any other value as Python's str() writes it: True,
 *                       None, 1.5); results as in hermes, contents
 *                       strip()ped; the tools listed in the system turn
 *                       inside <tools></tools> with the instructions of
 *                       the format. Reproduces Qwen3.5's template
 *                       (qwen3.5); arguments must be a JSON object there.
 *   CHAT_TOOLS_HARMONY  gpt-oss's: <|start|>assistant to=functions.N<|channel|>commentary
 *                       json<|message|>ARGS<|call|>, the first call of a
 *                       message only (the template assumes one); results
 *                       as <|start|>functions.N to=assistant<|channel|>
 *                       commentary<|message|>"RESULT"<|end|> (the result as
 *                       a JSON string, N the last call's name); the tools in
 *                       the developer message as a TypeScript-like
 *                       namespace functions { ... } (chat_harmony.c).
 *
 * JSON written into prompts (tools, arguments) is re-printed as Python's
 * json.dumps(ensure_ascii=False) prints it (", " and ": " separators, strings
 * re-escaped, numbers as written), which is what transformers' tojson gives;
 * arguments that are not valid JSON are written as they are.
 */
enum { CHAT_TOOLS_HERMES, CHAT_TOOLS_LLAMA3, CHAT_TOOLS_MISTRAL, CHAT_TOOLS_XML, CHAT_TOOLS_HARMONY };

/* The tool-call syntax of a family (hermes for the families without one). */
int chat_tool_syntax(int family);

typedef struct {
    const char *id;        /* the call's id, or NULL */
    const char *name;      /* the function's name */
    const char *arguments; /* JSON text of the arguments (an object) */
} lm_chat_call;

/* A message of a conversation with tools: role "system", "user",
 * "assistant" or "tool"; content never NULL (""); an assistant message may
 * carry calls, a tool message names the call it answers. */
typedef struct {
    const char *role;
    const char *content;
    const lm_chat_call *calls; /* (n_calls) */
    int n_calls;
    const char *call_id;   /* tool: the id of the call answered, or NULL */
    const char *reasoning; /* assistant: its reasoning apart from the content (the
                              gpt-oss template's "thinking"), or NULL for none */
} lm_chat_xmsg;

/*
 * Render a conversation with tools (n_tools JSON texts, each one tool
 * object as the request gave it: {"type": "function", "function": {"name",
 * "description", "parameters"}}; n_tools may be 0 with tool messages) by
 * family, or by template text when family < 0 (chat_render_template's
 * rules). Output and errors as chat_render.
 */
int chat_render_tools(int family, const char *template_text, const lm_chat_xmsg *msgs, int n, const char *const *tools,
                      int n_tools, bool add_generation_prompt, const char *bos_text, const char *eos_text, char **out,
                      char *err, size_t errlen);

/* chat_apply for a conversation with tools (chat_render_tools, then the BOS
 * rule). Without tools, tool messages and calls it renders exactly as
 * chat_apply. */
int chat_apply_tools(int family, const char *text, const lm_tokenizer *tok, const lm_chat_xmsg *msgs, int n,
                     const char *const *tools, int n_tools, char **out, bool *add_bos, char *err, size_t errlen);

/* A conversation as the server receives it: messages, tools, and what
 * requests set beside them for a template (chat_template_kwargs'
 * enable_thinking, reasoning_effort) or a test fixes (the date). */
typedef struct {
    const lm_chat_xmsg *msgs; /* (n) */
    int n;
    const char *const *tools; /* (n_tools) tool objects as JSON text; NULL with 0 */
    int n_tools;
    bool thinking_off; /* enable_thinking false: chat_thinking_off's text follows */
    /* gpt-oss's template inputs (other families have none and ignore them): */
    const char *reasoning_effort; /* "low", "medium" or "high"; NULL: the template's default, medium */
    const char *date;             /* "YYYY-MM-DD" for strftime_now; NULL: today, local time */
    const char *model_identity;   /* the system message's first line; NULL: the template's ("You are
                                     ChatGPT, a large language model trained by OpenAI.") */
} lm_chat_conv;

/* A reasoning effort gpt-oss's template takes: "low", "medium" or "high". */
bool chat_effort_valid(const char *effort);

/*
 * chat_render_tools with the template inputs of conv (reasoning_effort,
 * date; thinking_off is not applied here). Output and errors as chat_render.
 */
int chat_render_conv(int family, const char *template_text, const lm_chat_conv *conv, bool add_generation_prompt,
                     const char *bos_text, const char *eos_text, char **out, char *err, size_t errlen);

/*
 * The prompt of a conversation in one call, for a template choice (family
 * >= 0, or a template text, as chat_apply) and tokenizer tok:
 * chat_apply_tools, then, with thinking_off, chat_thinking_off's text of
 * the family (chat_detect of the text when family < 0) appended. Output,
 * the BOS rule and errors as chat_apply.
 */
int chat_prompt(int family, const char *text, const lm_tokenizer *tok, const lm_chat_conv *conv, char **out,
                bool *add_bos, char *err, size_t errlen);

/* Python's json.dumps(x, ensure_ascii=False, indent=indent) of the JSON
 * text json[0..len) (indent < 0: none), appended to out. -1 when the text
 * is not one valid JSON value (out then holds a partial print). */
int chat_json_dump(const char *json, size_t len, int indent, strbuf *out);

#endif
