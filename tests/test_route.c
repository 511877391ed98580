/*
 * test_route.c - the router's pure parsing (src/route/route_parse.c): the
 * block keys prefix-affinity routes by (the SHA-256 chain of the replicas'
 * prefix cache, recomputed here from its documented definition; and the
 * text-block fallback), what it reads of a request body, the SSE events of
 * a replica's stream however they are split, and a replica's /metrics.
 */
#include <stdint.h>

#include "base/sha256.h"
#include "base/util.h"
#include "route/route.h"
#include "test.h"

/* The cache's key of each full block, from kv.h's definition: SHA-256(parent key || salt as 8
 * little-endian bytes || block_size token ids as 4 little-endian bytes), the first parent 32 zero
 * bytes; the router keeps the first 8 bytes little-endian, with bit 0 set. */
static uint64_t ref_key(uint8_t parent[32], const int32_t *tok, int bs) {
    uint8_t buf[32 + 8 + 4 * 64];
    memcpy(buf, parent, 32);
    memset(buf + 32, 0, 8);
    for (int i = 0; i < bs; i++)
        for (int b = 0; b < 4; b++) buf[40 + 4 * i + b] = (uint8_t)((uint32_t)tok[i] >> (8 * b));
    sha256(buf, 40 + 4 * (size_t)bs, parent);
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)parent[i] << (8 * i);
    return v | 1;
}

static void test_token_keys(void) {
    int32_t tok[70];
    for (int i = 0; i < 70; i++) tok[i] = i * 37 - 5;
    uint64_t k[8];
    int n = route_keys_tokens(tok, 70, 16, k, 8);
    CHECK(n == 4); /* 70 tokens: 4 full blocks of 16, the tail does not count */
    uint8_t parent[32] = {0};
    for (int b = 0; b < 4; b++) CHECKF(k[b] == ref_key(parent, tok + 16 * b, 16), "block %d", b);
    /* a different first block changes every later key (a chain), the same prefix keeps them */
    int32_t t2[70];
    memcpy(t2, tok, sizeof tok);
    t2[3]++;
    uint64_t k2[8];
    CHECK(route_keys_tokens(t2, 70, 16, k2, 8) == 4);
    for (int b = 0; b < 4; b++) CHECK(k2[b] != k[b]);
    memcpy(t2, tok, sizeof tok);
    t2[40]++;
    CHECK(route_keys_tokens(t2, 70, 16, k2, 8) == 4);
    CHECK(k2[0] == k[0] && k2[1] == k[1] && k2[2] != k[2] && k2[3] != k[3]);
    CHECK(route_keys_tokens(tok, 70, 16, k, 2) == 2); /* at most max */
    CHECK(route_keys_tokens(tok, 15, 16, k, 8) == 0);
}

static void test_text_keys(void) {
    char a[200], b[200];
    memset(a, 'x', sizeof a);
    memcpy(b, a, sizeof b);
    b[150] = 'y';
    uint64_t ka[4], kb[4];
    CHECK(route_keys_text(a, 200, ka, 4) == 3 && route_keys_text(b, 200, kb, 4) == 3); /* 3 blocks of 64 */
    CHECK(ka[0] == kb[0] && ka[1] == kb[1] && ka[2] != kb[2]);
    CHECK(ka[0] != ka[1]); /* the same bytes in another block: another key */
    CHECK(route_keys_text(a, 63, ka, 4) == 0);
}

static void test_peek(void) {
    rt_peek p;
    const char *c = "{\"prompt\":\"Once upon a time\",\"stream\":true}";
    CHECK(route_peek(false, c, strlen(c), &p) == 0);
    CHECK(p.stream && p.text && !strcmp(p.text, "Once upon a time"));
    rt_peek_free(&p);
    const char *arr = "{\"prompt\":[\"first\",\"second\"]}";
    CHECK(route_peek(false, arr, strlen(arr), &p) == 0 && !p.stream && p.text && !strcmp(p.text, "first"));
    rt_peek_free(&p);
    const char *chat = "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":"
                       "[{\"type\":\"text\",\"text\":\"U\"}]}],\"stream\":false}";
    CHECK(route_peek(true, chat, strlen(chat), &p) == 0 && !p.stream && p.text);
    CHECK(!strcmp(p.text, "\x1esystem\x1fS\x1euser\x1fU"));
    rt_peek_free(&p);
    CHECK(route_peek(false, "[1,2]", 5, &p) == -1); /* no object: forwarded as is */
    CHECK(route_peek(false, "{\"prompt\":\"a\"", 13, &p) == -1);
    const char *tokens = "{\"prompt\":[1,2,3]}";
    CHECK(route_peek(false, tokens, strlen(tokens), &p) == 0 && !p.text);
    rt_peek_free(&p);
}

static void test_sse(void) {
    const char *s = ": keep-alive\n\ndata: {\"choices\":[]}\n\ndata:{\"error\":{\"message\":\"x\"}}\r\n\r\n"
                    "data: [DONE]\n\n";
    size_t n = strlen(s);
    for (size_t cut = 1; cut <= n; cut++) {
        rt_sse e = {0};
        for (size_t i = 0; i < n; i += cut) route_sse_feed(&e, s + i, i + cut <= n ? cut : n - i);
        CHECKF(e.events == 3 && e.done && e.error, "pieces of %zu: %d events", cut, e.events);
    }
    rt_sse t = {0};
    route_sse_feed(&t, s, (size_t)(strstr(s, "data:{") - s) + 9); /* cut in the second event: one, no [DONE] */
    CHECK(t.events == 1 && !t.done && !t.error);
    char big[3000];
    memset(big, 'x', sizeof big);
    memcpy(big, "data: ", 6);
    rt_sse l = {0};
    route_sse_feed(&l, big, sizeof big);
    route_sse_feed(&l, "\ndata: [DONE]\n", 14);
    CHECK(l.events == 2 && l.done && !l.error); /* a line longer than the buffer */
}

/* The replica engine's queue time: a stream's comment (in any pieces), a
 * whole answer's header; malformed values are no value. */
static void test_queue_time(void) {
    const char *s = "data: {\"choices\":[]}\n\n: keep-alive\n\n: lamina queue_time=0.125000\r\n\ndata: [DONE]\n\n";
    size_t n = strlen(s);
    for (size_t cut = 1; cut <= n; cut++) {
        rt_sse e;
        route_sse_init(&e);
        CHECK(e.queue_time == -1);
        for (size_t i = 0; i < n; i += cut) route_sse_feed(&e, s + i, i + cut <= n ? cut : n - i);
        CHECKF(e.events == 2 && e.done && e.queue_time == 0.125, "pieces of %zu: %d events, %g", cut, e.events,
               e.queue_time);
    }
    static const char *bad[] = {
        ": lamina queue_time=\n",         ": lamina queue_time=-1\n",    ": lamina queue_time=1e3\n",
        ": lamina queue_time=nan\n",      ": lamina queue_time=1.2.3\n", ": lamina queue_time=.\n",
        ": lamina queue_time=99999999\n", ":lamina queue_time=1\n",      "data: lamina queue_time=1\n"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        rt_sse e;
        route_sse_init(&e);
        route_sse_feed(&e, bad[i], strlen(bad[i]));
        CHECKF(e.queue_time == -1, "%s", bad[i]);
    }
    char big[700];
    memset(big, '1', sizeof big);
    memcpy(big, ": lamina queue_time=", 20);
    big[sizeof big - 1] = '\n';
    rt_sse l;
    route_sse_init(&l);
    route_sse_feed(&l, big, sizeof big);
    CHECK(l.queue_time == -1); /* longer than the line buffer: not a value */
    const char *h = "X-Lamina-Queue-Time: 0.500000\r\n";
    CHECK(route_parse_queue_header(h, strlen(h)) == 0.5);
    const char *hl = "x-lamina-queue-time:3\r\n";
    CHECK(route_parse_queue_header(hl, strlen(hl)) == 3);
    CHECK(route_parse_queue_header(h, 20) == -1); /* the name alone */
    static const char *hbad[] = {"Content-Type: application/json\r\n",
                                 "X-Lamina-Queue-Time: soon\r\n",
                                 "X-Lamina-Queue-Times: 1\r\n",
                                 "HTTP/1.1 200 OK\r\n",
                                 "\r\n",
                                 "X-Lamina-Queue-Time: -0.5\r\n"};
    for (size_t i = 0; i < sizeof hbad / sizeof *hbad; i++)
        CHECKF(route_parse_queue_header(hbad[i], strlen(hbad[i])) == -1, "%s", hbad[i]);
}

static void test_metrics(void) {
    const char *m = "# HELP lamina_requests_running x\n# TYPE lamina_requests_running gauge\n"
                    "lamina_requests_running 3\nlamina_requests_waiting 12\nlamina_kv_blocks_free 100\n"
                    "lamina_kv_blocks_total 128\nlamina_iterations_total 7\nlamina_batch_size_sum 20\n"
                    "lamina_batch_size_count 7\nlamina_requests_running_total 99\n"
                    "lamina_batch_size_bucket{le=\"1\"} 1\n";
    rt_upstats st;
    CHECK(route_parse_metrics(m, strlen(m), &st) == 7);
    CHECK(st.running == 3 && st.waiting == 12 && st.kv_free == 100 && st.kv_total == 128);
    CHECK(st.iterations == 7 && st.batch_sum == 20 && st.batch_count == 7);
    CHECK(route_parse_metrics("lamina_requests_running\nfoo 1\n", 30, &st) == 0 && st.running == -1);
}

int main(void) {
    TEST_RUN(test_token_keys);
    TEST_RUN(test_text_keys);
    TEST_RUN(test_peek);
    TEST_RUN(test_sse);
    TEST_RUN(test_queue_time);
    TEST_RUN(test_metrics);
    return TEST_DONE();
}
