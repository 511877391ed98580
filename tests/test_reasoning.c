/*
 * test_reasoning.c - the reasoning splitter (text/reasoning.h).
 *
 * Each case is an output text, the syntax, whether the prompt opened the
 * reasoning, and what each side must hold: reasoning, content, and the
 * calls written "NAME(ARGS)" one after another. Every case is fed whole,
 * then split in two at every byte boundary, then one byte at a time; each
 * way must give the same sides (a marker split across pieces never leaks
 * into either), and reason_ended must be the same at the end. Also: text
 * released before the end (the splitter holds back only what a marker or
 * surrounding blanks may need), reason_prompt_open on real generation
 * prompts, and allocation failure.
 */
#include "text/reasoning.h"

#include "base/util.h"
#include "test.h"
#include "text/chat.h"

typedef struct {
    strbuf reasoning, content, calls;
} sides;

static void sides_free(sides *s) {
    strbuf_free(&s->reasoning);
    strbuf_free(&s->content);
    strbuf_free(&s->calls);
}

/* Add a feed's segments to the sides; a call is NAME( ... ) in calls. */
static void add(sides *s, const lm_reason_out *o, bool *in_call) {
    for (int i = 0; i < o->n; i++) {
        const lm_reason_seg *g = &o->seg[i];
        const char *t = o->text.p + g->off;
        if (*in_call && g->kind != RSEG_ARGS) strbuf_puts(&s->calls, ")"), *in_call = false;
        switch (g->kind) {
            case RSEG_REASONING: strbuf_put(&s->reasoning, t, g->len); break;
            case RSEG_CONTENT: strbuf_put(&s->content, t, g->len); break;
            case RSEG_CALL:
                strbuf_put(&s->calls, t, g->len);
                strbuf_puts(&s->calls, "(");
                *in_call = true;
                break;
            default: strbuf_put(&s->calls, t, g->len);
        }
    }
}

/* Feed text in pieces cut at cuts[0..n_cuts) (ascending); the sides. */
static bool run(int syntax, bool open, const char *text, const size_t *cuts, int n_cuts, sides *s) {
    lm_reason r;
    lm_reason_out o = {0};
    reason_init(&r, syntax, open);
    bool in_call = false, failed = false;
    size_t len = strlen(text), at = 0;
    for (int i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : len;
        reason_out_clear(&o);
        reason_feed(&r, text + at, to - at, i == n_cuts, &o);
        failed |= o.failed;
        add(s, &o, &in_call);
        at = to;
    }
    if (in_call) strbuf_puts(&s->calls, ")");
    reason_out_free(&o);
    reason_free(&r);
    return !failed;
}

static bool ended_of(int syntax, bool open, const char *text) {
    lm_reason r;
    lm_reason_out o = {0};
    reason_init(&r, syntax, open);
    reason_feed(&r, text, strlen(text), true, &o);
    bool e = reason_ended(&r);
    reason_out_free(&o);
    reason_free(&r);
    return e;
}

static const char *str(const strbuf *b) { return b->p ? b->p : ""; }

typedef struct {
    int syntax;
    bool open;
    const char *text, *reasoning, *content, *calls;
    bool ended;
} tcase;

static const tcase CASES[] = {
    /* qwen3: the model opens the block */
    {REASON_THINK, false, "<think>\nLet me think.\n</think>\n\nThe answer.", "Let me think.", "The answer.", "", true},
    {REASON_THINK, false, "  \n<think>a</think>b", "a", "b", "", true},
    /* no block: all content, blanks kept */
    {REASON_THINK, false, "\n\nJust an answer.", "", "\n\nJust an answer.", "", true},
    {REASON_THINK, false, "An <think> later is text", "", "An <think> later is text", "", true},
    {REASON_THINK, false, "<thin", "", "<thin", "", true},
    {REASON_THINK, false, "", "", "", "", false},
    /* unterminated at max_tokens: all reasoning, trailing blanks and a
     * marker's start kept as they are only where they are not blanks */
    {REASON_THINK, false, "<think>\nstill going\n\n", "still going", "", "", false},
    {REASON_THINK, false, "<think>cut at </thi", "cut at </thi", "", "", false},
    /* a near-marker inside the reasoning is reasoning */
    {REASON_THINK, false, "<think>a </th b</think>c", "a </th b", "c", "", true},
    {REASON_THINK, false, "<think></think>\n\nC", "", "C", "", true},
    /* qwen3.5 / deepseek-r1: the prompt opened the block */
    {REASON_THINK, true, "Thinking here.\n</think>\n\nAnswer.", "Thinking here.", "Answer.", "", true},
    {REASON_THINK, true, "<think>\nagain\n</think>A", "again", "A", "", true},
    {REASON_THINK, true, "never closed", "never closed", "", "", false},
    {REASON_THINK, true, "\n</think>\n\nOff.", "", "Off.", "", true},
    /* a tool call after the reasoning is content (the server reads calls there) */
    {REASON_THINK, true, "r</think>\n\n<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "r",
     "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "", true},
    /* two </think>: the second is content */
    {REASON_THINK, true, "a</think>b</think>c", "a", "b</think>c", "", true},
    /* multi-byte characters across the splits */
    {REASON_THINK, true, "d\xc3\xa9j\xc3\xa0</think>\xe2\x82\xac", "d\xc3\xa9j\xc3\xa0", "\xe2\x82\xac", "", true},

    /* harmony */
    {REASON_HARMONY, false,
     "<|channel|>analysis<|message|>User asks. Answer 4.<|end|><|start|>assistant<|channel|>final<|message|>4",
     "User asks. Answer 4.", "4", "", true},
    {REASON_HARMONY, false,
     "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
     "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
     "Need weather.", "", "get_weather({\"city\":\"Paris\"})", true},
    {REASON_HARMONY, false,
     "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.f<|channel|>commentary "
     "json<|message|>{}<|call|>",
     "x", "", "f({})", true},
    /* two calls after a preamble to the user (commentary to no one) */
    {REASON_HARMONY, false,
     "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary to=functions.a "
     "<|constrain|>json<|message|>{\"x\":1}<|end|><|start|>assistant<|channel|>commentary to=functions.b "
     "<|constrain|>json<|message|>{}",
     "", "Checking.", "a({\"x\":1})b({})", true},
    {REASON_HARMONY, false, "<|channel|>final<|message|>Direct answer.<|return|>", "", "Direct answer.", "", true},
    /* unterminated analysis at max_tokens */
    {REASON_HARMONY, false, "<|channel|>analysis<|message|>thinking <|en", "thinking <|en", "", "", false},
    /* no header at all: content as it is */
    {REASON_HARMONY, false, "plain text", "", "plain text", "", true},
    /* a header cut short: dropped; the reasoning before it kept */
    {REASON_HARMONY, false, "<|channel|>analysis", "", "", "", false},
    {REASON_HARMONY, false, "<|channel|>analysis<|message|>r<|end|><|start|>assistant<|channel|>final<|me", "r", "", "",
     false},
    {REASON_HARMONY, false, "hello <|channel|>", "", "hello <|channel|>", "", true},
    {REASON_HARMONY, false, "", "", "", "", false},
};
#define N_CASES (int)(sizeof CASES / sizeof *CASES)

static bool same(const tcase *c, const sides *s) {
    return !strcmp(str(&s->reasoning), c->reasoning) && !strcmp(str(&s->content), c->content) &&
        !strcmp(str(&s->calls), c->calls);
}

static void test_whole(void) {
    for (int i = 0; i < N_CASES; i++) {
        const tcase *c = &CASES[i];
        sides s = {0};
        CHECK(run(c->syntax, c->open, c->text, NULL, 0, &s));
        bool ok = same(c, &s);
        if (!ok)
            fprintf(stderr, "  case %d: reasoning [%s] content [%s] calls [%s]\n", i, str(&s.reasoning),
                    str(&s.content), str(&s.calls));
        sides_free(&s);
        CHECKF(ok, "case %d", i);
        CHECKF(ended_of(c->syntax, c->open, c->text) == c->ended, "case %d: ended", i);
    }
}

/* Every two-piece split, then every one-byte piece (and mixed three-way
 * splits for the shorter texts). */
static void test_every_split(void) {
    for (int i = 0; i < N_CASES; i++) {
        const tcase *c = &CASES[i];
        size_t len = strlen(c->text);
        for (size_t a = 0; a <= len; a++) {
            sides s = {0};
            size_t cuts[1] = {a};
            CHECK(run(c->syntax, c->open, c->text, cuts, 1, &s));
            bool ok = same(c, &s);
            sides_free(&s);
            CHECKF(ok, "case %d split at %zu", i, a);
        }
        for (size_t a = 0; len <= 80 && a <= len; a++)
            for (size_t b = a; b <= len; b++) {
                sides s = {0};
                size_t cuts[2] = {a, b};
                CHECK(run(c->syntax, c->open, c->text, cuts, 2, &s));
                bool ok = same(c, &s);
                sides_free(&s);
                CHECKF(ok, "case %d split at %zu, %zu", i, a, b);
            }
        size_t *cuts = lm_malloc((len + 1) * sizeof *cuts);
        CHECK(cuts != NULL);
        for (size_t k = 0; k < len; k++) cuts[k] = k;
        sides s = {0};
        bool fed = run(c->syntax, c->open, c->text, cuts, (int)len, &s);
        bool ok = fed && same(c, &s);
        sides_free(&s);
        lm_free(cuts);
        CHECKF(ok, "case %d byte by byte", i);
    }
}

/* What a feed releases before the end: reasoning as soon as it cannot be
 * part of a marker or trailing blanks; content at once. */
static void test_released_early(void) {
    lm_reason r;
    lm_reason_out o = {0};
    reason_init(&r, REASON_THINK, true);
    reason_feed(&r, "abc </th", 8, false, &o);
    CHECK(o.n == 1 && o.seg[0].kind == RSEG_REASONING && o.seg[0].len == 3);
    CHECK(!reason_ended(&r));
    reason_out_clear(&o);
    reason_feed(&r, "ink>\n\nX", 7, false, &o);
    CHECK(reason_ended(&r));
    CHECK(o.n == 1 && o.seg[0].kind == RSEG_CONTENT && o.seg[0].len == 1 && o.text.p[o.seg[0].off] == 'X');
    reason_out_free(&o);
    reason_free(&r);

    reason_init(&r, REASON_HARMONY, false);
    reason_feed(&r, "<|channel|>analysis<|message|>ab<|e", 35, false, &o);
    CHECK(o.n == 1 && o.seg[0].kind == RSEG_REASONING && o.seg[0].len == 2);
    reason_out_clear(&o);
    reason_feed(&r, "nd|><|start|>assistant<|channel|>final<|message|>", 49, false, &o);
    CHECK(o.n == 0 && reason_ended(&r));
    reason_out_free(&o);
    reason_free(&r);
}

static void test_prompt_open(void) {
    const char *q35 = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n";
    const char *r1 = "<\xef\xbd\x9c"
                     "User\xef\xbd\x9c>hi<\xef\xbd\x9c"
                     "Assistant\xef\xbd\x9c><think>\n";
    const char *q3 = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    const char *off = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    CHECK(reason_prompt_open(q35, strlen(q35)));
    CHECK(reason_prompt_open(r1, strlen(r1)));
    CHECK(!reason_prompt_open(q3, strlen(q3)));
    CHECK(!reason_prompt_open(off, strlen(off)));
    CHECK(!reason_prompt_open("", 0));
    CHECK(reason_prompt_closed(off, strlen(off)));
    CHECK(!reason_prompt_closed(q35, strlen(q35)) && !reason_prompt_closed(q3, strlen(q3)));
    CHECK(reason_syntax(CHAT_QWEN3) == REASON_THINK && reason_syntax(CHAT_QWEN35) == REASON_THINK);
    CHECK(reason_syntax(CHAT_DEEPSEEK_R1) == REASON_THINK && reason_syntax(CHAT_GPT_OSS) == REASON_HARMONY);
    CHECK(reason_syntax(CHAT_CHATML) == REASON_NONE && reason_syntax(CHAT_DEEPSEEK3) == REASON_NONE &&
          reason_syntax(-1) == REASON_NONE);
}

/* A harmony header must close within REASON_MAX_HEADER bytes: a longer
 * text without <|message|> there is content, from there on, whatever
 * follows and however it is split. */
static void test_long_header(void) {
    size_t n = REASON_MAX_HEADER + 40;
    char *text = lm_malloc(n + 64);
    CHECK(text != NULL);
    memset(text, 'x', n);
    strcpy(text + n, "<|message|>after");
    size_t len = strlen(text);
    for (size_t cut = 0; cut <= len; cut += 7) {
        sides s = {0};
        size_t cuts[1] = {cut};
        bool fed = run(REASON_HARMONY, false, text, cuts, 1, &s);
        bool ok = fed && s.content.len == len && !strcmp(s.content.p, text) && !s.reasoning.len;
        sides_free(&s);
        if (!ok) lm_free(text);
        CHECKF(ok, "cut at %zu", cut);
    }
    lm_free(text);
}

/* Every allocation failing in turn: no crash, the failure reported. */
static void test_alloc_failure(void) {
    const char *text = CASES[1].text;
    int seen = 0;
    for (long k = 0; k < 16; k++) {
        lm_reason r;
        lm_reason_out o = {0};
        reason_init(&r, REASON_THINK, false);
        lm_alloc_fail_after(k);
        reason_feed(&r, text, strlen(text), true, &o);
        lm_alloc_fail_after(-1);
        seen += o.failed;
        reason_out_free(&o);
        reason_free(&r);
    }
    CHECK(seen > 0);
}

int main(void) {
    TEST_RUN(test_whole);
    TEST_RUN(test_every_split);
    TEST_RUN(test_released_early);
    TEST_RUN(test_prompt_open);
    TEST_RUN(test_long_header);
    TEST_RUN(test_alloc_failure);
    return TEST_DONE();
}
