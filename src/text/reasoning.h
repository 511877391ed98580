/*
 * reasoning.h - a thinking model's output split into its reasoning and its
 * answer, as the text comes.
 *
 * Models with reasoning write it before the answer in a syntax of their
 * family; a server returns it apart (OpenAI-style reasoning_content, as vLLM
 * and llama-server do) and a chat front end folds it away. Two syntaxes:
 *
 *   REASON_THINK    <think>R</think>C (Qwen3, Qwen3.5, DeepSeek-R1 and its
 *                   distills). The reasoning opens only at the very start
 *                   of the output (after blanks), or is already open when
 *                   the prompt ended inside it (Qwen3.5's and DeepSeek-R1's
 *                   generation prompts end with <think>; reason_init's
 *                   `open`): then a <think> the model writes again at the
 *                   start is dropped. R loses its surrounding blanks, C its
 *                   leading ones (as the templates write them back:
 *                   <think>\nR\n</think>\n\nC). Output that does not open
 *                   with <think> is all content; reasoning never closed
 *                   (max_tokens reached inside it) is all reasoning.
 *   REASON_HARMONY  gpt-oss's harmony messages, with their special tokens
 *                   in the text: [<|start|>assistant]<|channel|>CH[ to=R]
 *                   [<|constrain|>json]<|message|>BODY<|end|> (or <|return|>,
 *                   <|call|>, or the end of the output). CH analysis is
 *                   reasoning; final is content; commentary addressed to
 *                   functions.NAME is a tool call (RSEG_CALL with NAME, then
 *                   the body as RSEG_ARGS), commentary to no one (a preamble)
 *                   and any other channel are content. The recipient may
 *                   also stand before <|channel|> ("assistant to=functions.f").
 *                   Bodies are kept byte for byte. A header never closed by
 *                   <|message|> (max_tokens reached inside it) is dropped
 *                   when it opens with <|start|> or <|channel|>, else
 *                   released as content at the end: text that is no
 *                   harmony message is content as it is.
 *
 * Streaming. reason_feed takes the text piece by piece (any split, even
 * inside a marker or a UTF-8 character) and releases each byte at most once,
 * in order, once its side is known: a possible marker's start, and blanks
 * that may turn out to surround the reasoning, are held back until the next
 * piece decides them, or until the final feed. The segments released for any
 * split of one text concatenate, per kind, to those of the whole text fed at
 * once: a stream and a whole answer agree.
 *
 * reason_ended tells whether the reasoning is over (the answer or a call
 * has begun): what a grammar over the answer waits for.
 *
 * Bounds: the held bytes are at most a marker's length plus the blanks
 * around it (think), or one harmony header (capped at REASON_MAX_HEADER
 * bytes: text without <|message|> in its first REASON_MAX_HEADER bytes is
 * no header, and from there on all content); out grows with what a feed
 * releases. Out of memory sets out->failed (events may be lost).
 */
#ifndef LAMINA_REASONING_H
#define LAMINA_REASONING_H

#include <stdbool.h>
#include <stddef.h>

#include "base/strbuf.h"

enum { REASON_NONE, REASON_THINK, REASON_HARMONY };

#define REASON_MAX_HEADER 512

/* The kind of a released piece. RSEG_CALL starts a tool call: its text is
 * the function's name; RSEG_ARGS pieces that follow are its arguments. */
enum { RSEG_REASONING, RSEG_CONTENT, RSEG_CALL, RSEG_ARGS };

typedef struct {
    int kind;        /* RSEG_* */
    size_t off, len; /* into lm_reason_out.text */
} lm_reason_seg;

/* What one feed releases, in order; consecutive pieces of one kind are
 * merged (but every RSEG_CALL is its own segment). */
typedef struct {
    strbuf text;
    lm_reason_seg *seg; /* (n) */
    int n, cap;
    bool failed; /* out of memory: pieces were lost */
} lm_reason_out;

typedef struct {
    int syntax;    /* REASON_* */
    int state;     /* internal */
    int body;      /* harmony: the current message's kind (RSEG_*) */
    strbuf hold;   /* bytes not yet released */
    bool ended;    /* the reasoning is over */
    bool anything; /* think: a byte of the answer is out (blanks then belong to it) */
} lm_reason;

/* Start a splitter. open: the prompt ended inside the reasoning (think:
 * the generation prompt wrote <think>); ignored by harmony. */
void reason_init(lm_reason *r, int syntax, bool open);
void reason_free(lm_reason *r);
/* Feed n bytes; final: nothing follows (held bytes are released). */
void reason_feed(lm_reason *r, const char *s, size_t n, bool final, lm_reason_out *o);
/* The reasoning is over: the answer (or a call) has begun. */
bool reason_ended(const lm_reason *r);
/* Empty out (keeping its memory). */
void reason_out_clear(lm_reason_out *o);
void reason_out_free(lm_reason_out *o);

/* The syntax of a chat family's reasoning (chat.h): REASON_THINK for
 * qwen3, qwen3.5 and deepseek-r1, REASON_HARMONY for gpt-oss; REASON_NONE
 * for the others. */
int reason_syntax(int family);

/* Whether a rendered prompt ends inside a think block (it ends with
 * <think> and blanks: Qwen3.5's and DeepSeek-R1's generation prompts), and
 * whether it ends with a closed one (</think> and blanks: thinking turned
 * off by the template's switch). */
bool reason_prompt_open(const char *prompt, size_t n);
bool reason_prompt_closed(const char *prompt, size_t n);

#endif
