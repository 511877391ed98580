/*
 * fuzz_convert.c - libFuzzer target for the llama2.c importer
 * (format/convert.c): the fuzzer's bytes become a checkpoint file and a
 * tokenizer file, convert_llama2c turns them into a GGUF, and a GGUF that
 * was written must open again with gguf_open.
 *
 * Input layout: a 4-byte little-endian length L, then min(L, rest) bytes of
 * checkpoint, then the rest is the tokenizer. Inputs shorter than 4 bytes
 * are all checkpoint with an empty tokenizer.
 *
 * The files live in a per-process directory under /tmp (removed at exit);
 * the output GGUF is removed after every input. Invariants (abort on
 * violation): a failure writes a non-empty message and leaves no output
 * file; a success leaves a GGUF that gguf_open accepts.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/convert.h"
#include "format/gguf.h"

static char dir[64], ckpt[96], tok[96], out[96];

static void cleanup(void) {
    unlink(ckpt);
    unlink(tok);
    unlink(out);
    rmdir(dir);
}

static void put(const char *path, const uint8_t *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (n && fwrite(p, 1, n, f) != n) abort();
    if (fclose(f) != 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/fuzz_convert.XXXXXX");
        if (!mkdtemp(dir)) abort();
        snprintf(ckpt, sizeof ckpt, "%s/model.bin", dir);
        snprintf(tok, sizeof tok, "%s/tokenizer.bin", dir);
        snprintf(out, sizeof out, "%s/out.gguf", dir);
        atexit(cleanup);
    }
    size_t nc = size, off = 0;
    if (size >= 4) {
        uint32_t l = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 | (uint32_t)data[3] << 24;
        off = 4;
        nc = l < size - 4 ? l : size - 4;
    }
    put(ckpt, data + off, nc);
    put(tok, data + off + nc, size - off - nc);

    char err[512];
    err[0] = '\0';
    int rc = convert_llama2c(ckpt, tok, out, err, sizeof err);
    if (rc != 0) {
        if (err[0] == '\0') abort();
        if (access(out, F_OK) == 0) abort();
        return 0;
    }
    gguf_ctx *g = gguf_open(out, err, sizeof err);
    if (!g) abort();
    gguf_close(g);
    unlink(out);
    return 0;
}
