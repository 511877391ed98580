/*
 * fuzz_route.c - libFuzzer target for the router's own parsing (route.h):
 * what it reads of a client's request body (route_peek), the block keys of
 * a prompt (route_keys_text, route_keys_tokens), the Server-Sent Events a
 * replica streams back, cut into arbitrary pieces as a slow or failing
 * replica sends them (route_sse_feed: malformed lines, lines longer than
 * its buffer, a stream truncated anywhere, the ": lamina queue_time="
 * comment), and a replica's /metrics text (route_parse_metrics) and, the
 * same bytes, a response header line (route_parse_queue_header). Each must take any bytes without reading past
 * them and keep its invariants; the SSE parser must also give the same
 * answer however the bytes are split.
 *
 * Byte 0 picks the part (low 2 bits) and options; the rest is the input.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "route/route.h"

static void check_sse(const uint8_t *d, size_t n, unsigned seed) {
    rt_sse whole, cut;
    route_sse_init(&whole);
    route_sse_init(&cut);
    route_sse_feed(&whole, (const char *)d, n);
    /* the same bytes in pieces of 1..16 bytes, sizes from the seed */
    size_t pos = 0;
    while (pos < n) {
        size_t k = 1 + (seed % 16);
        seed = seed * 1103515245u + 12345u;
        if (k > n - pos) k = n - pos;
        route_sse_feed(&cut, (const char *)d + pos, k);
        pos += k;
    }
    if (whole.events != cut.events || whole.done != cut.done || whole.error != cut.error ||
        whole.queue_time != cut.queue_time)
        abort();
    if (whole.queue_time != -1 &&
        (!(whole.queue_time >= 0 && whole.queue_time < 1e7) || !memmem(d, n, ": lamina queue_time=", 20)))
        abort();
    size_t lines = 0;
    for (size_t i = 0; i < n; i++) lines += d[i] == '\n';
    if ((size_t)whole.events > lines) abort();
    if (whole.done && !memmem(d, n, "[DONE]", 6)) abort();
    if (whole.error && !memmem(d, n, "{\"error\"", 8)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t opt = data[0];
    const uint8_t *d = data + 1;
    size_t n = size - 1;
    switch (opt & 3) {
        case 0: {
            rt_peek p;
            if (route_peek(opt & 4, (const char *)d, n, &p) == 0) {
                uint64_t keys[64];
                int k = p.text ? route_keys_text(p.text, strlen(p.text), keys, 64) : 0;
                if (k < 0 || k > 64 || (p.text && (size_t)k > strlen(p.text) / RT_TEXT_BLOCK)) abort();
                for (int i = 0; i < k; i++)
                    if (!keys[i]) abort();
                rt_peek_free(&p);
            }
            break;
        }
        case 1: check_sse(d, n, opt); break;
        case 2: {
            rt_upstats st;
            int found = route_parse_metrics((const char *)d, n, &st);
            if (found < 0 || found > 7) abort();
            double qt = route_parse_queue_header((const char *)d, n); /* the same bytes as a header line */
            if (qt != -1 && !(qt >= 0 && qt < 1e7)) abort();
            break;
        }
        default: {
            uint64_t keys[32], again[32];
            int nt = (int)(n / 4);
            int32_t *tok = lm_malloc((size_t)(nt ? nt : 1) * sizeof *tok);
            if (!tok) return 0;
            memcpy(tok, d, (size_t)nt * 4);
            int bs = 1 + (opt >> 2) % 32;
            int k = route_keys_tokens(tok, nt, bs, keys, 32);
            int k2 = route_keys_tokens(tok, nt, bs, again, 32);
            /* one key per full block, a chain: the same tokens give the same keys */
            if (k != (nt / bs < 32 ? nt / bs : 32) || k2 != k || memcmp(keys, again, (size_t)k * sizeof *keys)) abort();
            lm_free(tok);
            break;
        }
    }
    return 0;
}
