/*
 * grammar.h - grammar-constrained decoding: GBNF grammars, a byte-level
 * parser state per sequence, and the mask of tokens that may come next.
 *
 * Three objects, by lifetime:
 *
 *   lm_grammar  a compiled GBNF grammar (immutable after grammar_parse;
 *               shared by every sequence that uses it).
 *   lm_gvocab   what can be computed once per vocabulary: every token's
 *               bytes (as tok_token_bytes gives them, specials included),
 *               a byte trie over them, which tokens end generation (EOG).
 *   lm_gmatch   one sequence's parse state over (grammar, vocabulary):
 *               the set of positions the bytes so far may have reached,
 *               and a cache of masks per state. Copyable (n > 1 forks),
 *               resettable and replayable (preemption recomputes by
 *               accepting the same tokens again).
 *
 * GBNF as llama.cpp's users write it: `name ::= alternatives`, `|`,
 * grouping `( )`, `*` `+` `?` `{m}` `{m,}` `{m,n}`, literals "..." with
 * escapes (\n \t \r \\ \" \xHH \uHHHH \UHHHHHHHH), UTF-8 in literals and
 * classes, character classes `[a-z]` `[^"\\]` with ranges and negation,
 * `.` (any character), `#` comments, rules that refer to each other
 * (recursion allowed, left recursion refused). The root rule is "root"
 * unless another name is given. Matching is over UTF-8 characters, fed
 * as bytes: a token may end inside a multi-byte character or cross rule
 * boundaries.
 *
 * The matcher is a set-of-stacks pushdown recognizer (as llama.cpp's),
 * its parse states interned and their byte transitions cached, so it runs
 * as a lazily built automaton; masks come from one pass over a preorder
 * byte trie of the vocabulary and are cached per state (grammar_match.c).
 * Refused at compile time: undefined rules, left recursion (also through
 * rules that can be empty, e.g. a repetition of something that can be
 * empty), rules that can never finish, empty classes.
 *
 * A token is allowed iff its bytes extend the bytes accepted so far to a
 * prefix of some string of the grammar's language; an EOG token is
 * allowed iff the bytes so far are a complete string of the language. A
 * token with no bytes that is not EOG (a control token) is never allowed.
 */
#ifndef LAMINA_GRAMMAR_H
#define LAMINA_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lamina.h"
#include "text/tokenizer.h"

typedef struct lm_grammar lm_grammar;
typedef struct lm_gvocab lm_gvocab;
typedef struct lm_gmatch lm_gmatch;

/* Compile GBNF text (len bytes, need not be NUL-terminated). root: the
 * start rule's name, NULL for "root". NULL on error, with err saying
 * "line L, column C: what" (1-based) or naming an undefined rule. */
lm_grammar *grammar_parse(const char *text, size_t len, const char *root, char *err, size_t errlen);
void grammar_free(lm_grammar *g);
/* The memory the compiled grammar holds. */
size_t grammar_bytes(const lm_grammar *g);

/* Per-vocabulary tables (NULL on allocation failure). The tokenizer must
 * outlive it. */
lm_gvocab *grammar_vocab_new(const lm_tokenizer *tok, char *err, size_t errlen);
void grammar_vocab_free(lm_gvocab *v);
int32_t grammar_vocab_size(const lm_gvocab *v);
/* The same tables from explicit token bytes (tests, tools): token t is
 * lens[t] bytes at bytes[t] (0: none), eog[t] (eog may be NULL) says it
 * ends generation. Tokens' bytes are copied. */
lm_gvocab *grammar_vocab_from_bytes(int32_t n, const char *const *bytes, const int *lens, const bool *eog, char *err,
                                    size_t errlen);

/* A parse state at the grammar's start. g and v must outlive it. */
lm_gmatch *gmatch_new(const lm_grammar *g, const lm_gvocab *v, char *err, size_t errlen);
lm_gmatch *gmatch_copy(const lm_gmatch *m); /* an independent copy (NULL: no memory) */
void gmatch_free(lm_gmatch *m);
/* Give the grammar m was made from to m's shared cache: it is freed with the
 * last copy, so the copies may outlive whoever compiled it. */
void gmatch_own_grammar(lm_gmatch *m, lm_grammar *g);
/* The memory m's shared cache holds now (states, transitions, masks) and
 * its grammar's when the cache owns it. Reads what steps change: call it
 * only where no copy is being stepped. */
size_t gmatch_bytes(const lm_gmatch *m);
void gmatch_reset(lm_gmatch *m); /* back to the start */

/* The allowed tokens now: bit t of allow (n_vocab bits, (n_vocab + 31) / 32
 * words) is set iff token t is allowed. Returns the number allowed (0: the
 * grammar is stuck, which accept never lets happen). */
int32_t gmatch_mask(lm_gmatch *m, uint32_t *allow);
/* (A negative count: memory ran out while computing the mask, or the work
 * passed one of the matcher's bounds (gmatch_error says which); gmatch_allows,
 * gmatch_accept and gmatch_accept_bytes then refuse.)
 *
 * Bounds. Every call (a mask, a token, a run of bytes) may spend at most
 * 16,777,216 operations (frames expanded, stacks stepped: a quarter of a
 * second at most), a parse state may hold at most 65,536 stacks, and one grammar's
 * cache at most 256 MiB. Highly ambiguous grammars (repetitions nested in
 * repetitions that match the same text many ways) multiply their stacks
 * with every byte; past a bound the call fails, gmatch_error gives the
 * reason, and the grammar is spoiled (gmatch_spoiled) for every copy. A
 * JSON Schema's grammar stays far below them. */
/* Why the last call on m (or a copy sharing its cache) failed: NULL when it
 * did not fail, else one line (a bound passed, or memory ran out). */
const char *gmatch_error(const lm_gmatch *m);
/* NULL, or (some call on any copy passed a bound) the bound it passed; safe
 * from any thread. */
const char *gmatch_spoiled(const lm_gmatch *m);
/* Check a new grammar against the bounds before it is used: explore the
 * parse states the first bytes lead to, those with the most stacks first
 * (up to 96 states, every byte that may follow each, a sixteenth of a
 * call's budget in all: a few milliseconds). 0 (nothing found, which
 * proves nothing), or -1 with err saying which bound the grammar passed.
 * Changes only the shared cache, not m's state. */
int gmatch_probe(lm_gmatch *m, char *err, size_t errlen);
/* The same allowed tokens as a list, after gmatch_mask on the current
 * state: *n ascending token ids, or NULL (*n = 0) when the mask allows more
 * than an eighth of the vocabulary (the list is kept only when it is
 * short, where sampling over it beats a pass over the whole row) or was
 * not cached. Valid until the next gmatch_mask on any copy of the matcher. */
const int32_t *gmatch_mask_ids(const lm_gmatch *m, int32_t *n);
/* Whether the current state's mask is cached (gmatch_mask then copies it). */
bool gmatch_mask_cached(const lm_gmatch *m);
/* Whether one token is allowed (cheaper than a mask when the sampler's
 * first choice is usually right). */
bool gmatch_allows(lm_gmatch *m, int32_t tok);
/* Advance by a token. 0, or -1 (state unchanged) when it is not allowed. */
int gmatch_accept(lm_gmatch *m, int32_t tok);
/* Advance by raw bytes (lazy grammars start after a trigger's text). 0, or
 * -1 (state unchanged) when they do not continue a valid prefix. */
int gmatch_accept_bytes(lm_gmatch *m, const char *bytes, size_t n);
/* The bytes so far form a complete string of the language. */
bool gmatch_can_end(const lm_gmatch *m);
/* No byte can follow: only ending is possible. */
bool gmatch_must_end(const lm_gmatch *m);

/* Apply a mask to a row of logits: every token whose bit in allow is clear
 * becomes -INFINITY, as does every token at or past n_mask (the tokens the
 * vocabulary tables do not cover). row holds n_vocab entries. Whole words
 * that are all allowed or all refused are handled at once; mixed words
 * with a select that does not branch (inside a JSON string most tokens are
 * allowed and a few scattered ones are not, which branches mispredict). */
void grammar_mask_apply(const uint32_t *allow, int32_t n_mask, float *row, int32_t n_vocab);

#endif
