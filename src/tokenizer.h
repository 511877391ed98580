/*
 * tokenizer.h - text <-> token ids from a GGUF file's tokenizer metadata.
 *
 * Two families, chosen by `tokenizer.ggml.model`:
 *   "llama"  SentencePiece-style BPE: merges driven by the vocab scores,
 *            "▁" for spaces, a space prefix (tokenizer.ggml.add_space_prefix,
 *            default true), byte fallback through <0xXX> tokens.
 *   "gpt2"   byte-level BPE: a pre-tokenizer regex chosen by
 *            `tokenizer.ggml.pre` splits the text (PCRE2 with Unicode
 *            properties), each piece is mapped byte->unicode as GPT-2 does,
 *            then merged by rank from `tokenizer.ggml.merges`.
 * Special/control tokens (token_type 3 = control, 4 = user-defined) are
 * matched verbatim in the input when parse_special is set.
 *
 * The tokenizer keeps no pointers into the GGUF mapping after tok_load
 * returns (it copies what it needs), so the gguf context may be closed.
 */
#ifndef LAMINA_TOKENIZER_H
#define LAMINA_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

typedef struct lm_tokenizer lm_tokenizer;

lm_tokenizer *tok_load(const gguf_ctx *g, char *err, size_t errlen);
void tok_free(lm_tokenizer *t);

int32_t tok_n_vocab(const lm_tokenizer *t);
const char *tok_model_name(const lm_tokenizer *t); /* "llama" / "gpt2" */
int32_t tok_bos(const lm_tokenizer *t);            /* -1 if none */
int32_t tok_eos(const lm_tokenizer *t);            /* -1 if none */
int32_t tok_eot(const lm_tokenizer *t);            /* -1 if none */
bool tok_add_bos(const lm_tokenizer *t);           /* tokenizer.ggml.add_bos_token */
/* End of generation: EOS, EOT or another end-of-generation token. */
bool tok_is_eog(const lm_tokenizer *t, int32_t id);
bool tok_is_control(const lm_tokenizer *t, int32_t id);
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
int tok_encode(const lm_tokenizer *t, const char *text, size_t len, bool add_bos,
               bool parse_special, int32_t *out, int cap);

/*
 * The bytes a token stands for (may be a partial UTF-8 character). Control
 * tokens give their text only when `special` is true, else nothing. Returns
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
/* Returns bytes written to out (at most cap; cap >= 256 is always enough). */
int detok_push(lm_detok *d, int32_t id, char *out, int cap);
/* Emit anything still pending (as U+FFFD for each incomplete sequence). */
int detok_flush(lm_detok *d, char *out, int cap);

#endif
