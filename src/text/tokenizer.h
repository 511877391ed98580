/*
 * tokenizer.h - text <-> token ids from a GGUF file's tokenizer metadata.
 *
 * Three families, chosen by `tokenizer.ggml.model`:
 *   "llama"  SentencePiece-style BPE: merges driven by the vocab scores,
 *            "▁" for spaces, a space prefix (tokenizer.ggml.add_space_prefix,
 *            default true), byte fallback through <0xXX> tokens.
 *   "gpt2"   byte-level BPE: a pre-tokenizer regex chosen by
 *            `tokenizer.ggml.pre` splits the text (PCRE2 with Unicode
 *            properties), each piece is mapped byte->unicode as GPT-2 does,
 *            then merged by rank from `tokenizer.ggml.merges`.
 *   "bert"   WordPiece (BERT; llama.cpp's WPM): the text normalized and
 *            split into words (wpm.h: lowercasing and accent stripping per
 *            tokenizer.ggml.normalizer.*, default on; punctuation split
 *            off), each word cut greedily into the longest vocabulary tokens
 *            from its start (a word's first piece is stored "▁piece", a
 *            "##" continuation bare), a word that cannot be cut being one
 *            [UNK]. The BOS is [CLS] (cls_token_id), and adding it adds
 *            [SEP] (seperator_token_id, llama.cpp's spelling) after the text.
 * Special tokens are matched verbatim in the input (leftmost-longest) before
 * the rest is tokenized: control (token_type 3) and unknown (2) tokens only
 * when parse_special is set, user-defined (4) tokens always, as Hugging Face
 * added tokens and SentencePiece user symbols are.
 * A missing tokenizer.ggml.pre means the GPT-2 pattern; a `pre` that lamina
 * does not know makes tok_load fail, naming it.
 *
 * The tokenizer keeps no pointers into the GGUF mapping after tok_load
 * returns (it copies what it needs), so the gguf context may be closed.
 */
#ifndef LAMINA_TOKENIZER_H
#define LAMINA_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lamina.h" /* lm_status */
#include "format/gguf.h"

typedef struct lm_tokenizer lm_tokenizer;

lm_tokenizer *tok_load(const gguf_ctx *g, char *err, size_t errlen);
/* The same, saying what kind of failure it was in *status: LM_ERR_FORMAT
 * (missing or malformed metadata), LM_ERR_UNSUPPORTED (a tokenizer model or
 * pre-tokenizer lamina does not know), LM_ERR_NOMEM; LM_OK on success. */
lm_tokenizer *tok_load_status(const gguf_ctx *g, lm_status *status, char *err, size_t errlen);
void tok_free(lm_tokenizer *t);

int32_t tok_n_vocab(const lm_tokenizer *t);
const char *tok_model_name(const lm_tokenizer *t); /* "llama" / "gpt2" / "bert" */
int32_t tok_sep(const lm_tokenizer *t);            /* "bert": [SEP], added with the BOS; else -1 */
int32_t tok_bos(const lm_tokenizer *t);            /* -1 if none */
int32_t tok_eos(const lm_tokenizer *t);            /* -1 if none */
int32_t tok_eot(const lm_tokenizer *t);            /* -1 if none */
bool tok_add_bos(const lm_tokenizer *t);           /* tokenizer.ggml.add_bos_token */
/* tokenizer.ggml.add_eos_token (default false): an input ends with EOS, as
 * an embedding model's (Qwen3-Embedding's) inputs do; tok_encode never adds
 * it, its callers append it */
bool tok_add_eos(const lm_tokenizer *t);
/* End of generation: EOS, EOT or another end-of-generation token. */
bool tok_is_eog(const lm_tokenizer *t, int32_t id);
bool tok_is_control(const lm_tokenizer *t, int32_t id);
/* The vocabulary's scores (n_vocab; SentencePiece's, higher = more
 * frequent), or NULL when the file has none (byte-level BPE). */
const float *tok_scores(const lm_tokenizer *t);
/* Look up a token by its exact vocab text; -1 if absent. */
int32_t tok_find(const lm_tokenizer *t, const char *text, size_t len);
/* The raw vocab string of a token (e.g. "▁the", "<0x0A>", "Ġthe"). */
const char *tok_piece(const lm_tokenizer *t, int32_t id, size_t *len);

/*
 * Encode len bytes of text (need not be NUL-terminated). Writes up to cap ids
 * into out and returns the total number of ids the text encodes to (may be
 * more than cap: call again with a larger buffer), or -1 on error (bad UTF-8
 * is not an error: invalid bytes become byte tokens).
 */
int tok_encode(const lm_tokenizer *t, const char *text, size_t len, bool add_bos, bool parse_special, int32_t *out,
               int cap);
/* ("bert": add_bos puts [CLS] before the text and [SEP] after it.) */

/*
 * The "gpt2" family's pre-tokenizer split alone (for tests and tools): the
 * pieces tile the text in order; writes the start offset of up to cap pieces
 * and returns the piece count, or -1 on error or for the "llama" family.
 */
int tok_pretokenize(const lm_tokenizer *t, const char *text, size_t len, size_t *starts, int cap);

/*
 * The bytes a token stands for (may be a partial UTF-8 character). Control,
 * unknown and unused tokens give their text only when `special` is true,
 * else nothing; user-defined tokens always give their text. Returns
 * the byte count (may exceed cap, in which case only cap bytes are written).
 */
int tok_token_bytes(const lm_tokenizer *t, int32_t id, bool special, char *buf, int cap);

/*
 * Streaming detokenizer: feed tokens one at a time, get back only complete
 * UTF-8 (a character split across tokens is held until its last byte
 * arrives; a sequence that can never complete is emitted as U+FFFD). For the
 * "llama" family the space prefix of the very first token is dropped when
 * strip_space is set (as when detokenizing a whole generated text).
 */
typedef struct {
    const lm_tokenizer *tok;
    unsigned char pending[8];
    int n_pending;
    bool at_start;
    bool strip_space;
    bool special;
} lm_detok;

void detok_init(lm_detok *d, const lm_tokenizer *t, bool strip_space, bool special);
/* Returns bytes written to out, or -1 (state unchanged) when they would not
 * fit in cap. cap >= detok_max_out(t) is always enough: 3 plus the most
 * bytes one token decodes to, each non-ASCII byte counted as a possible
 * U+FFFD (Llama 2: 82, GPT-2: 387; 512 covers the common vocabs). */
int detok_push(lm_detok *d, int32_t id, char *out, int cap);
int detok_max_out(const lm_tokenizer *t);
/* Emit anything still pending (as U+FFFD for each incomplete sequence);
 * returns bytes written (0 or 3), -1 if cap < 3 and something is pending. */
int detok_flush(lm_detok *d, char *out, int cap);

#endif
