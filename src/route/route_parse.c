/*
 * route_parse.c - the router's pure parsing: what it reads of a client's
 * request body (stream flag, prompt text), the block keys of a prompt, the
 * Server-Sent Events a replica streams back (with the ": lamina
 * queue_time=" comment lamina serve ends a stream with), the
 * X-Lamina-Queue-Time header of a whole answer, and a replica's Prometheus
 * /metrics. No sockets, no locks; every function takes untrusted bytes with
 * their length and never reads past it (fuzz/fuzz_route.c).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/strbuf.h"
#include "base/util.h"
#include "kv/kv.h"
#include "route/route.h"

/* ------------------------------------------------------------ requests */

static void put_str_field(strbuf *b, const cJSON *o, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (cJSON_IsString(v) && v->valuestring) strbuf_puts(b, v->valuestring);
}

/* Chat content may be a string or an array of parts with "text". */
static void put_content(strbuf *b, const cJSON *m) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (cJSON_IsString(c) && c->valuestring) strbuf_puts(b, c->valuestring);
    else if (cJSON_IsArray(c)) {
        const cJSON *part;
        cJSON_ArrayForEach(part, c) if (cJSON_IsObject(part)) put_str_field(b, part, "text");
    }
}

int route_peek(bool chat, const char *body, size_t len, rt_peek *out) {
    memset(out, 0, sizeof *out);
    cJSON *o = cJSON_ParseWithLength(body, len);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return -1;
    }
    out->stream = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "stream"));
    strbuf b = {0};
    if (chat) {
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages"), *m;
        if (cJSON_IsArray(msgs)) cJSON_ArrayForEach(m, msgs) {
                if (!cJSON_IsObject(m)) continue;
                strbuf_puts(&b, "\x1e");
                put_str_field(&b, m, "role");
                strbuf_puts(&b, "\x1f");
                put_content(&b, m);
            }
    } else {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prompt");
        if (cJSON_IsArray(p)) p = cJSON_GetArrayItem(p, 0);
        if (cJSON_IsString(p) && p->valuestring) strbuf_puts(&b, p->valuestring);
    }
    cJSON_Delete(o);
    if (b.failed) {
        strbuf_free(&b);
        return 0; /* no text: no affinity, still forwarded */
    }
    out->text = b.p;
    return 0;
}

void rt_peek_free(rt_peek *p) {
    lm_free(p->text);
    p->text = NULL;
}

/* ---------------------------------------------------------------- keys */

int route_keys_tokens(const int32_t *tokens, int n, int block_size, uint64_t *keys, int max) {
    if (block_size < 1) return 0;
    uint8_t parent[KV_KEY_LEN], key[KV_KEY_LEN];
    int k = 0;
    for (int b = 0; k < max && (b + 1) * block_size <= n; b++) {
        kv_prefix_key(b ? parent : NULL, 0, tokens + b * block_size, block_size, key);
        uint64_t v = 0;
        for (int i = 0; i < 8; i++) v |= (uint64_t)key[i] << (8 * i);
        keys[k++] = v | 1; /* never 0: 0 marks an empty slot in the router's tables */
        memcpy(parent, key, KV_KEY_LEN);
    }
    return k;
}

int route_keys_text(const char *text, size_t len, uint64_t *keys, int max) {
    uint64_t h = 0xcbf29ce484222325ull;
    int k = 0;
    for (size_t b = 0; k < max && b + RT_TEXT_BLOCK <= len; b += RT_TEXT_BLOCK) {
        for (size_t i = 0; i < RT_TEXT_BLOCK; i++) {
            h ^= (unsigned char)text[b + i];
            h *= 0x100000001b3ull;
        }
        keys[k++] = h | 1; /* the chain: h carries every earlier block */
    }
    return k;
}

/* ------------------------------------------------------------------ SSE */

/* Seconds written as a plain decimal number (digits, at most one '.',
 * surrounding blanks), in [0, 1e7); else -1. */
static double parse_seconds(const char *p, size_t n) {
    while (n && (*p == ' ' || *p == '\t')) p++, n--;
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t' || p[n - 1] == '\r' || p[n - 1] == '\n')) n--;
    char buf[40];
    if (n == 0 || n >= sizeof buf) return -1;
    int dots = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '.') dots++;
        else if (p[i] < '0' || p[i] > '9') return -1;
    }
    if (dots > 1 || (dots && n == 1)) return -1;
    memcpy(buf, p, n);
    buf[n] = 0;
    double v = strtod(buf, NULL);
    return isfinite(v) && v >= 0 && v < 1e7 ? v : -1;
}

double route_parse_queue_header(const char *line, size_t n) {
    static const char name[] = "x-lamina-queue-time:";
    size_t k = sizeof name - 1;
    if (n <= k) return -1;
    for (size_t i = 0; i < k; i++) {
        char c = line[i];
        if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
        if (c != name[i]) return -1;
    }
    return parse_seconds(line + k, n - k);
}

void route_sse_init(rt_sse *s) {
    memset(s, 0, sizeof *s);
    s->queue_time = -1;
}

/* One complete line (its first bytes in s->line, line_len its full length). */
static void sse_line(rt_sse *s) {
    size_t n = s->line_len < sizeof s->line ? s->line_len : sizeof s->line;
    if (n && s->line[n - 1] == '\r') n--;
    static const char qt[] = ": lamina queue_time=";
    if (n > sizeof qt - 1 && s->line_len <= sizeof s->line && !memcmp(s->line, qt, sizeof qt - 1)) {
        double v = parse_seconds(s->line + sizeof qt - 1, n - (sizeof qt - 1));
        if (v >= 0) s->queue_time = v;
        return;
    }
    if (n < 5 || memcmp(s->line, "data:", 5) != 0) return;
    const char *d = s->line + 5;
    size_t m = n - 5;
    if (m && *d == ' ') d++, m--;
    s->events++;
    if (m == 6 && !memcmp(d, "[DONE]", 6)) s->done = true;
    else if (m >= 8 && !memcmp(d, "{\"error\"", 8)) s->error = true;
}

void route_sse_feed(rt_sse *s, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\n') {
            sse_line(s);
            s->line_len = 0;
            continue;
        }
        if (s->line_len < sizeof s->line) s->line[s->line_len] = p[i];
        if (s->line_len < (size_t)-1) s->line_len++;
    }
}

/* -------------------------------------------------------------- metrics */

/* The value of an unlabelled sample "name value" at line start, or NAN. */
static double sample(const char *line, size_t n, const char *name) {
    size_t k = strlen(name);
    if (n <= k + 1 || memcmp(line, name, k) != 0 || line[k] != ' ') return NAN;
    char buf[64];
    size_t m = n - k - 1 < sizeof buf - 1 ? n - k - 1 : sizeof buf - 1;
    memcpy(buf, line + k + 1, m);
    buf[m] = 0;
    char *end;
    double v = strtod(buf, &end);
    return end == buf ? NAN : v;
}

int route_parse_metrics(const char *text, size_t len, rt_upstats *out) {
    static const char *names[] = {"lamina_requests_running", "lamina_requests_waiting", "lamina_kv_blocks_free",
                                  "lamina_kv_blocks_total",  "lamina_iterations_total", "lamina_batch_size_sum",
                                  "lamina_batch_size_count"};
    double *vals[] = {&out->running,    &out->waiting,   &out->kv_free,    &out->kv_total,
                      &out->iterations, &out->batch_sum, &out->batch_count};
    for (int i = 0; i < 7; i++) *vals[i] = -1;
    int found = 0;
    size_t pos = 0;
    while (pos < len) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - (text + pos)) : len - pos;
        if (n && text[pos] != '#')
            for (int i = 0; i < 7; i++) {
                double v = sample(text + pos, n, names[i]);
                if (!isnan(v) && *vals[i] < 0 && v >= 0) {
                    *vals[i] = v;
                    found++;
                }
            }
        pos += n + 1;
    }
    return found;
}
