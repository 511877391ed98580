/*
 * fuzz_logits.c - libFuzzer entry for the saved-logits reader
 * (format/logits.h: the file `lamina perplexity --save-logits` writes and
 * --kl-divergence reads).
 *
 * The input is a whole file: logits_parse reads its header and tokens with
 * the input's length as the file's size. When it is accepted, the sizes it
 * implies must match the input exactly, every token must lie in the
 * vocabulary, and each logits row is walked through logits_compare against
 * itself (KL exactly 0). The sanitizers catch reads out of bounds.
 *
 *   make fuzz
 * Seeds: fuzz/seeds/fuzz_logits/ (written by fuzz/make_seeds.py).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/logits.h"
#include "base/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    logits_hdr h;
    char err[LM_ERRLEN];
    if (logits_parse(data, size, size, &h, NULL, err, sizeof err) != 0) return 0;
    if (logits_file_bytes(&h) != size) abort();
    size_t nt = (size_t)h.n_chunk * h.n_ctx;
    int32_t *tok = malloc(nt * sizeof *tok);
    if (!tok) return 0;
    if (logits_parse(data, size, size, &h, tok, err, sizeof err) != 0) abort();
    for (size_t i = 0; i < nt; i++)
        if (tok[i] < 0 || (uint32_t)tok[i] >= h.n_vocab) abort();
    const uint8_t *rows = data + LOGITS_HDR_BYTES + 4 * nt;
    size_t n_rows = (size - LOGITS_HDR_BYTES - 4 * nt) / (4 * (size_t)h.n_vocab);
    float *row = malloc((size_t)h.n_vocab * sizeof *row);
    for (size_t r = 0; row && r < n_rows; r++) {
        memcpy(row, rows + r * 4 * (size_t)h.n_vocab, 4 * (size_t)h.n_vocab);
        int finite = 1;
        for (uint32_t v = 0; v < h.n_vocab; v++) finite &= row[v] > -1e30f && row[v] < 1e30f;
        if (!finite) continue; /* NaN or huge values: KL is not defined */
        logits_cmp c;
        logits_compare(row, row, (int)h.n_vocab, tok[0], &c);
        if (c.kl != 0 || !c.top1_same) abort();
    }
    free(row);
    free(tok);
    return 0;
}
