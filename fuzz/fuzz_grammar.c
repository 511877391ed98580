/*
 * fuzz_grammar.c - libFuzzer target for the GBNF compiler and the matcher
 * (decode/grammar.h): the input up to its first NUL byte is grammar text
 * (at most 4 KiB), the rest are bytes fed to the matcher one at a time (at
 * most 512).
 *
 * The vocabulary: 256 one-byte tokens (token b is byte b), a few multi-byte
 * ones (UTF-8 characters, a character cut in two, JSON-ish pieces), an
 * empty control token and an EOG token.
 *
 * Invariants checked (abort on violation): a refused grammar leaves a
 * message starting "line " or naming the missing root; a compiled one gives
 * a matcher whose mask count equals its set bits, where each token's bit
 * equals gmatch_allows, the EOG bit equals gmatch_can_end, the control token
 * is never allowed, and must_end implies can_end and an EOG-only mask;
 * accepting a byte succeeds exactly when its token's bit was set, and a
 * refused byte leaves the mask as it was; a copy stays in step with the
 * original. A mask, an acceptance or gmatch_probe that fails past the
 * matcher's bounds (a grammar too ambiguous) is an outcome, but it must say
 * why (gmatch_error, the probe's message) and leave the grammar spoiled;
 * the probe runs on inputs whose feed starts with an odd byte. ASan/LSan
 * catch crashes and leaks.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "decode/grammar.h"

enum { N_BYTES = 256, N_EXTRA = 8, N_VOCAB = N_BYTES + N_EXTRA + 2, CONTROL = N_VOCAB - 2, EOG = N_VOCAB - 1 };
enum { MAX_GRAMMAR = 4096, MAX_FEED = 512, WORDS = (N_VOCAB + 31) / 32 };

static const char *EXTRA[N_EXTRA] = {"\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f", "\x98\x80", "{\"", "\": ", "ab", "\n  "};
static lm_gvocab *vocab;

static bool bit(const uint32_t *m, int t) { return (m[t >> 5] >> (t & 31)) & 1; }

/* false when the state is past the matcher's bound on stacks (a grammar
 * too ambiguous: the engine ends such a request with an error), which is
 * an outcome, not a failure */
static bool check_mask(lm_gmatch *m, uint32_t *mask) {
    int32_t n = gmatch_mask(m, mask), count = 0;
    if (n < 0) {
        if (!gmatch_error(m)) abort(); /* a failure always says why */
        return false;
    }
    for (int t = 0; t < N_VOCAB; t++) {
        count += bit(mask, t);
        if (bit(mask, t) != gmatch_allows(m, t)) abort();
    }
    if (count != n || bit(mask, CONTROL) || bit(mask, EOG) != gmatch_can_end(m)) abort();
    if (n == 0) abort(); /* never stuck */
    if (gmatch_must_end(m) && (!gmatch_can_end(m) || n != 1)) abort();
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!vocab) {
        static char bytes[N_BYTES];
        const char *ptr[N_VOCAB];
        int len[N_VOCAB];
        bool eog[N_VOCAB] = {0};
        for (int i = 0; i < N_BYTES; i++) bytes[i] = (char)i, ptr[i] = &bytes[i], len[i] = 1;
        for (int i = 0; i < N_EXTRA; i++) ptr[N_BYTES + i] = EXTRA[i], len[N_BYTES + i] = (int)strlen(EXTRA[i]);
        ptr[CONTROL] = ptr[EOG] = NULL, len[CONTROL] = len[EOG] = 0, eog[EOG] = true;
        if (!(vocab = grammar_vocab_from_bytes(N_VOCAB, ptr, len, eog, NULL, 0))) abort();
    }
    const uint8_t *nul = memchr(data, 0, size);
    size_t glen = nul ? (size_t)(nul - data) : size;
    if (glen > MAX_GRAMMAR) return 0;
    const char *feed = nul ? (const char *)nul + 1 : "";
    size_t n_feed = nul ? size - glen - 1 : 0;
    if (n_feed > MAX_FEED) n_feed = MAX_FEED;

    char err[LM_ERRLEN] = "";
    lm_grammar *g = grammar_parse((const char *)data, glen, NULL, err, sizeof err);
    if (!g) {
        if (strncmp(err, "line ", 5) != 0 && !strstr(err, "no rule named") && !strstr(err, "out of memory")) abort();
        return 0;
    }
    lm_gmatch *m = gmatch_new(g, vocab, err, sizeof err);
    if (!m) {
        if (!strstr(err, "too ambiguous") && !strstr(err, "outgrew")) abort();
        grammar_free(g);
        return 0;
    }
    if (n_feed > 0 && (feed[0] & 1) && gmatch_probe(m, err, sizeof err) < 0) {
        if (!strstr(err, "too ambiguous") && !strstr(err, "outgrew") && !strstr(err, "memory")) abort();
        if (!gmatch_spoiled(m) && !strstr(err, "memory")) abort();
    }
    uint32_t mask[WORDS], again[WORDS];
    lm_gmatch *k = NULL;
    if (!check_mask(m, mask)) goto done;
    for (size_t i = 0; i < n_feed; i++) {
        uint8_t b = (uint8_t)feed[i];
        bool allowed = bit(mask, b);
        int rc = gmatch_accept_bytes(m, (const char *)&b, 1);
        if ((rc == 0) != allowed) abort();
        if (rc != 0) {
            gmatch_mask(m, again);
            if (memcmp(mask, again, sizeof mask)) abort();
            continue;
        }
        if (k && gmatch_accept(k, b) != 0) abort();
        if (!check_mask(m, mask)) goto done;
        if (i == 3) k = gmatch_copy(m);
    }
    if (k) {
        gmatch_mask(k, again);
        if (memcmp(mask, again, sizeof mask) || gmatch_can_end(k) != gmatch_can_end(m)) abort();
    }
    gmatch_reset(m);
    check_mask(m, mask);
done:
    gmatch_free(k);
    gmatch_free(m);
    grammar_free(g);
    return 0;
}
