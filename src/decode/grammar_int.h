/*
 * grammar_int.h - the compiled grammar and the vocabulary tables, shared by
 * the GBNF compiler (grammar.c) and the matcher (grammar_match.c). Not part
 * of any other module's contract.
 */
#ifndef LAMINA_GRAMMAR_INT_H
#define LAMINA_GRAMMAR_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "decode/grammar.h"

enum { E_CLASS, E_REF, E_ALT, E_END };

typedef struct {
    uint8_t type;
    int32_t val; /* class index (E_CLASS), rule index (E_REF) */
} gelem;

typedef struct {
    uint32_t lo, hi;
} grange;

typedef struct {
    int32_t off, n;    /* ranges[off .. off + n), sorted, disjoint, not adjacent */
    uint64_t ascii[2]; /* bit c: code point c < 128 is in the class */
} gclass;

struct lm_grammar {
    gelem *el; /* (n_el) every rule's alternatives, E_ALT between, E_END after */
    int32_t n_el;
    grange *ranges; /* (n_ranges) the classes' ranges */
    gclass *cls;    /* (n_cls) */
    int32_t n_cls;
    int32_t *alt_off; /* (n_rules + 1) rule r's alternatives are alt_pos[alt_off[r] .. alt_off[r+1]) */
    int32_t *alt_pos; /* (n_alts) element index where each alternative starts */
    int32_t n_rules;
    int32_t root;
};

/* ---- code points --------------------------------------------------------- */

#define CP_MAX 0x10FFFFu

static inline bool class_has(const lm_grammar *g, const gclass *c, uint32_t cp) {
    if (cp < 128) return (c->ascii[cp >> 6] >> (cp & 63)) & 1;
    const grange *r = g->ranges + c->off;
    int32_t lo = 0, hi = c->n - 1;
    while (lo <= hi) {
        int32_t mid = (lo + hi) / 2;
        if (cp < r[mid].lo) hi = mid - 1;
        else if (cp > r[mid].hi) lo = mid + 1;
        else return true;
    }
    return false;
}

/* Whether the class holds some code point in [lo, hi]. */
static inline bool class_meets(const lm_grammar *g, const gclass *c, uint32_t lo, uint32_t hi) {
    const grange *r = g->ranges + c->off;
    for (int32_t i = 0; i < c->n; i++)
        if (r[i].lo <= hi && r[i].hi >= lo) return true;
    return false;
}

struct lm_gvocab {
    int32_t n_vocab;
    char *bytes;      /* (total) every token's bytes, concatenated */
    int64_t *off;     /* (n_vocab + 1) token t is bytes[off[t] .. off[t+1]) */
    uint8_t *eog;     /* (n_vocab) 1: ends generation */
    int32_t n_nodes;  /* trie nodes; node 0 is the root */
    uint8_t *nb;      /* (n_nodes) the byte on the edge into the node */
    uint16_t *depth;  /* (n_nodes) bytes from the root */
    int32_t *end;     /* (n_nodes) one past the node's subtree (preorder) */
    int32_t *tok_off; /* (n_nodes + 1) tokens ending at node i: toks[tok_off[i] .. tok_off[i+1]) */
    int32_t *toks;    /* (n in trie) token ids, sorted by bytes */
    int max_depth;
};

#endif
