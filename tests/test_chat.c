/*
 * test_chat.c - chat templates against jinja2 renders of the real templates.
 *
 * tests/data/chat/ holds real models' chat templates (templates/<id>.jinja), the
 * family chat_detect must find for each (manifest.txt), a set of
 * conversations (conversations.txt) and, for the templates lamina reproduces
 * exactly, what jinja2 renders for every conversation with and without the
 * generation prompt, or the error the template raises (golden/<id>.txt). All
 * of it is written by tests/data/chat/make_golden.py; this test needs no
 * Python. Renders are compared byte for byte; a template error must be a
 * failed render with a message. A template whose text is not kept here
 * (manifest golden 2: Qwen3.5's) is rendered by its family, and its markers
 * are among the detection rules.
 *
 * Also: detection rules one by one, names and stop markers, argument errors,
 * NULL bos/eos, bytes that are not UTF-8, the default system message and
 * leading-BOS rules of chat_render_template, and allocation failure at every
 * allocation. And a model's template resolution (chat_template_resolve:
 * the user's name or file, the model's own, the architecture's fallback, none)
 * and rendering for a tokenizer with the BOS strip (chat_apply), on small
 * GGUF files written here and the bundled model's tokenizer.
 */
#include "text/chat.h"

#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "format/gguf.h"
#include "test.h"
#include "text/tokenizer.h"
#include "base/util.h"

#define DATA "tests/data/chat/"
#define MAX_CONVS 64
#define MAX_MSGS 16
#define MAX_TEMPLATES 64

/* ---------------------------------------------------------------- data */

/* Whole file, NUL-terminated (len excludes the NUL); NULL if unreadable. */
static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *p = malloc(cap);
    while (p) {
        size_t got = fread(p + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
        if (cap - n - 1 == 0) {
            char *q = realloc(p, cap * 2);
            if (!q) {
                free(p);
                p = NULL;
                break;
            }
            p = q;
            cap *= 2;
        }
    }
    fclose(f);
    if (p) {
        p[n] = '\0';
        if (len) *len = n;
    }
    return p;
}

typedef struct {
    char name[64];
    int n;
    lm_chat_msg msgs[MAX_MSGS];
} conv;

static conv convs[MAX_CONVS];
static int n_convs = -1; /* -1: not loaded yet */

/* Reads "N\n" + N bytes + "\n" at *pp; returns a malloc'd NUL-terminated copy. */
static char *take_counted(char **pp, size_t n) {
    char *p = *pp;
    if (strlen(p) < n + 1 || p[n] != '\n') return NULL;
    char *s = malloc(n + 1);
    if (!s) return NULL;
    memcpy(s, p, n);
    s[n] = '\0';
    *pp = p + n + 1;
    return s;
}

/* The rest of the current line (NUL-terminated in place); advances *pp. */
static char *take_line(char **pp) {
    char *p = *pp, *nl = strchr(p, '\n');
    if (!nl) return NULL;
    *nl = '\0';
    *pp = nl + 1;
    return p;
}

static int load_convs(void) {
    if (n_convs >= 0) return n_convs;
    char *text = read_all(DATA "conversations.txt", NULL);
    if (!text) return n_convs = 0;
    char *p = text, *line;
    int nc = 0;
    conv *c = NULL;
    while ((line = take_line(&p)) != NULL) {
        char a[64], b[64];
        size_t len;
        if (line[0] == '#' || line[0] == '\0') continue;
        if (sscanf(line, "conv %63s", a) == 1) {
            if (nc == MAX_CONVS) break;
            c = &convs[nc++];
            snprintf(c->name, sizeof c->name, "%s", a);
            c->n = 0;
        } else if (c && sscanf(line, "msg %63s %zu", b, &len) == 2 && c->n < MAX_MSGS) {
            char *content = take_counted(&p, len);
            if (!content) break;
            c->msgs[c->n].role = strdup(b);
            c->msgs[c->n].content = content;
            c->n++;
        }
    }
    free(text);
    return n_convs = nc;
}

static const conv *find_conv(const char *name) {
    for (int i = 0; i < load_convs(); i++)
        if (!strcmp(convs[i].name, name)) return &convs[i];
    return NULL;
}

typedef struct {
    char id[96], family[32], bos[48], eos[48];
    int golden;
} tmpl_entry;

static tmpl_entry entries[MAX_TEMPLATES];
static int n_entries = -1;

static int load_manifest(void) {
    if (n_entries >= 0) return n_entries;
    char *text = read_all(DATA "manifest.txt", NULL);
    n_entries = 0;
    if (!text) return 0;
    char *p = text, *line;
    while ((line = take_line(&p)) != NULL && n_entries < MAX_TEMPLATES) {
        tmpl_entry *e = &entries[n_entries];
        if (line[0] == '#') continue;
        if (sscanf(line, "%95s %31s %47s %47s %d", e->id, e->family, e->bos, e->eos, &e->golden) == 5) n_entries++;
    }
    free(text);
    return n_entries;
}

static char *load_template(const tmpl_entry *e) {
    char path[256];
    snprintf(path, sizeof path, DATA "templates/%.95s.jinja", e->id);
    return read_all(path, NULL);
}

static const char *dash_null(const char *s) { return strcmp(s, "-") ? s : NULL; }

/* Prints where two renders first differ, with a little context, escaped. */
static void show_diff(const char *got, size_t gn, const char *want, size_t wn) {
    size_t i = 0;
    while (i < gn && i < wn && got[i] == want[i]) i++;
    size_t from = i > 24 ? i - 24 : 0;
    const char *what[2] = {"got ", "want"};
    const char *s[2] = {got, want};
    size_t n[2] = {gn, wn};
    fprintf(stderr, "    first difference at byte %zu (got %zu bytes, want %zu)\n", i, gn, wn);
    for (int k = 0; k < 2; k++) {
        fprintf(stderr, "    %s: ", what[k]);
        for (size_t j = from; j < n[k] && j < i + 40; j++) {
            unsigned char c = (unsigned char)s[k][j];
            if (c == '\n') fprintf(stderr, "\\n");
            else if (c < 0x20 || c == 0x7f) fprintf(stderr, "\\x%02x", c);
            else fputc(c, stderr);
        }
        fputc('\n', stderr);
    }
}

/* -------------------------------------------------------------- golden */

/* Templates whose render needs more than the family: a default system
 * message or a leading BOS that chat_render_template reads from the text. */
static int needs_template_text(const char *id) {
    static const char *ids[] = {"qwen2.5-7b-instruct", "qwen2-7b-instruct", "smollm2-135m-instruct",
                                "nous-hermes-2-mixtral-8x7b-dpo", "phi-3-mini-4k-instruct-3a811845"};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (!strcmp(id, ids[i])) return 1;
    return 0;
}

/* The day make_golden.py's strftime_now gives (FIXED_DATE). */
#define GOLDEN_DATE "2025-08-05"

/* One golden case rendered by family (by_family) or template text; a
 * family that writes today's date (gpt-oss) gets the goldens' day. */
static int render_golden(int family, bool by_family, const char *tmpl, const conv *c, bool gen, const char *bos,
                         const char *eos, char **out, char *err, size_t errlen) {
    if (family != CHAT_GPT_OSS)
        return by_family ? chat_render(family, c->msgs, c->n, gen, bos, eos, out, err, errlen)
                         : chat_render_template(tmpl, c->msgs, c->n, gen, bos, eos, out, err, errlen);
    lm_chat_xmsg x[MAX_MSGS];
    for (int i = 0; i < c->n; i++) x[i] = (lm_chat_xmsg){c->msgs[i].role, c->msgs[i].content, NULL, 0, NULL, NULL};
    lm_chat_conv cv = {.msgs = x, .n = c->n, .date = GOLDEN_DATE};
    return chat_render_conv(by_family ? family : -1, by_family ? NULL : tmpl, &cv, gen, bos, eos, out, err, errlen);
}

static int golden_cases, golden_errors, golden_templates, golden_folds, golden_fold_renders, golden_thinking_off;

/* Checks one template's golden file; returns 0 or -1 (message printed). */
static int check_golden(const tmpl_entry *e) {
    char path[256];
    snprintf(path, sizeof path, DATA "golden/%.95s.txt", e->id);
    /* golden 2: the template text is not kept here; the family renders it */
    bool by_family = e->golden == 2;
    char *gold = read_all(path, NULL), *tmpl = by_family ? NULL : load_template(e);
    int rc = -1, family = by_family ? chat_family_from_name(e->family) : tmpl ? chat_detect(tmpl) : -1;
    int family_differs = 0;
    const char *bos = dash_null(e->bos), *eos = dash_null(e->eos);
    if (!gold || (!tmpl && !by_family) || family < 0 || family != chat_family_from_name(e->family)) {
        fprintf(stderr, "  %s: missing data or detected %s\n", e->id, chat_family_name(family));
        goto done;
    }
    char *p = gold, *line;
    while ((line = take_line(&p)) != NULL) {
        char name[64], kind[8];
        int gen;
        size_t len = 0;
        int fields = sscanf(line, "case %63s %d %7s %zu", name, &gen, kind, &len);
        const conv *c = find_conv(name);
        if (fields < 3 || !c) {
            fprintf(stderr, "  %s: bad golden line '%s'\n", e->id, line);
            goto done;
        }
        int ok = !strcmp(kind, "ok"), fold = !strcmp(kind, "fold");
        char *want = ok ? take_counted(&p, len) : NULL;
        char *want_err = ok ? NULL : take_line(&p);
        if (ok ? !want : !want_err) {
            fprintf(stderr, "  %s: truncated golden file at %s\n", e->id, name);
            goto done;
        }
        /* gen 2: enable_thinking=False, i.e. the render with the generation
         * prompt followed by chat_thinking_off's text (or the same error) */
        int thinking_off = gen == 2;
        if (thinking_off) {
            const char *sfx = chat_thinking_off(family);
            size_t sl = sfx ? strlen(sfx) : 0;
            if (!sfx || (ok && (len < sl || memcmp(want + len - sl, sfx, sl)))) {
                fprintf(stderr, "  %s / %s: enable_thinking=False does not end with the family's text\n", e->id, name);
                free(want);
                goto done;
            }
            if (ok) len -= sl;
            gen = 1;
        }
        char *out = (char *)"unset", err[LM_ERRLEN] = "";
        int r = render_golden(family, by_family, tmpl, c, gen, bos, eos, &out, err, sizeof err);
        int good = ok ? r == 0 && out && strlen(out) == len && !memcmp(out, want, len)
                      : r == -1 && out == NULL && err[0] != '\0';
        if (fold) { /* the template refuses a system message; lamina folds it in as its family does */
            char *out3 = NULL;
            int r3 = chat_render(family, c->msgs, c->n, gen, bos, eos, &out3, err, sizeof err);
            good = c->n > 0 && !strcmp(c->msgs[0].role, "system") &&
                (r == 0 ? r3 == 0 && !strcmp(out, out3) : r3 == -1 && out == NULL);
            golden_fold_renders += good && r == 0;
            if (r3 == 0) lm_free(out3);
            if (!good) fprintf(stderr, "  %s / %s / gen=%d: no fold of the system message\n", e->id, name, gen);
        }
        if (!good) {
            fprintf(stderr, "  %s / %s / gen=%d: ", e->id, name, gen);
            if (ok && r == 0) {
                fprintf(stderr, "render differs\n");
                show_diff(out, strlen(out), want, len);
            } else if (ok) fprintf(stderr, "render failed: %s\n", err);
            else if (!fold) fprintf(stderr, "rendered where the template raises '%s'\n", want_err);
            else fprintf(stderr, "(fold)\n");
        }
        if (r == 0) lm_free(out);
        /* The family alone gives the same, unless the text adds something. */
        if (good && ok && !by_family) {
            char *out2 = NULL;
            int r2 = chat_render(family, c->msgs, c->n, gen, bos, eos, &out2, err, sizeof err);
            int same = r2 == 0 && strlen(out2) == len && !memcmp(out2, want, len);
            if (!same && !needs_template_text(e->id)) {
                fprintf(stderr, "  %s / %s / gen=%d: chat_render(%s) differs\n", e->id, name, gen,
                        chat_family_name(family));
                good = 0;
            }
            family_differs |= !same;
            if (r2 == 0) lm_free(out2);
        }
        free(want);
        if (!good) goto done;
        golden_thinking_off += thinking_off;
        if (thinking_off) continue;
        golden_cases++;
        golden_errors += !ok && !fold;
        golden_folds += fold;
    }
    /* Where the text adds a default system message or a BOS, it shows. */
    if (needs_template_text(e->id) && !family_differs) {
        fprintf(stderr, "  %s: chat_render_template added nothing to the family render\n", e->id);
        goto done;
    }
    golden_templates++;
    rc = 0;
done:
    free(gold);
    free(tmpl);
    return rc;
}

static void test_golden_renders(void) {
    CHECKF(load_convs() >= 15, "conversations.txt not found or short (%d)", load_convs());
    CHECKF(load_manifest() >= 20, "manifest.txt not found or short");
    int expected_templates = 0, failed = 0;
    golden_cases = golden_errors = golden_templates = golden_folds = golden_fold_renders = golden_thinking_off = 0;
    for (int i = 0; i < n_entries; i++) {
        if (!entries[i].golden) continue;
        expected_templates++;
        failed |= check_golden(&entries[i]) != 0;
    }
    CHECK(!failed);
    /* Every family has a golden template; every conversation twice each. */
    CHECKF(golden_templates == expected_templates && expected_templates >= CHAT_N_FAMILIES, "%d of %d templates",
           golden_templates, expected_templates);
    CHECKF(golden_cases == expected_templates * load_convs() * 2, "%d cases", golden_cases);
    CHECKF(golden_errors >= 40, "only %d template errors checked", golden_errors);
    /* Gemma 2 refuses every conversation that opens with a system message */
    CHECKF(golden_folds >= 10 && golden_fold_renders >= 10, "only %d system folds checked (%d rendered)", golden_folds,
           golden_fold_renders);
    /* Qwen3 and Qwen3.5 with enable_thinking=False, every conversation once */
    CHECKF(golden_thinking_off == 2 * load_convs(), "%d enable_thinking=False renders", golden_thinking_off);
    printf("NOTE %d templates, %d renders compared, %d template errors matched, %d system folds, "
           "%d with thinking off\n",
           golden_templates, golden_cases - golden_errors - golden_folds, golden_errors, golden_folds,
           golden_thinking_off);
}

/* ------------------------------------------------------------ detection */

static void test_detect_real_templates(void) {
    CHECK(load_manifest() >= 20);
    int seen[CHAT_N_FAMILIES] = {0}, unknown = 0;
    for (int i = 0; i < n_entries; i++) {
        const tmpl_entry *e = &entries[i];
        if (e->golden == 2) { /* no text here: test_detect_rules holds its markers */
            int f = chat_family_from_name(e->family);
            CHECKF(f >= 0, "bad family %s", e->family);
            if (f >= 0) seen[f]++;
            continue;
        }
        char *t = load_template(e);
        CHECKF(t != NULL, "templates/%s.jinja missing", e->id);
        int want = strcmp(e->family, "unknown") ? chat_family_from_name(e->family) : -1;
        int got = chat_detect(t);
        free(t);
        CHECKF(strcmp(e->family, "unknown") == 0 || want >= 0, "bad family %s", e->family);
        CHECKF(got == want, "%s: detected %s, want %s", e->id, got < 0 ? "unknown" : chat_family_name(got), e->family);
        if (got >= 0) seen[got]++;
        else unknown++;
    }
    for (int f = 0; f < CHAT_N_FAMILIES; f++) CHECKF(seen[f] > 0, "no real template of family %s", chat_family_name(f));
    CHECK(unknown >= 5);
}

static void test_detect_rules(void) {
    static const struct {
        const char *text;
        int family;
    } cases[] = {
        {NULL, -1},
        {"", -1},
        {"{% for m in messages %}{{ m.content }}{% endfor %}", -1},
        {"{{ '<|im_start|>' + m.role }}", CHAT_CHATML},
        {"{{'<|im_start|>system<|im_sep|>'}}", -1},
        {"'<|start_header_id|>' + role + '<|end_header_id|>'", CHAT_LLAMA3},
        {"<start_of_turn>model", CHAT_GEMMA},
        {"'[INST] <<SYS>>\\n'", CHAT_LLAMA2},
        {"[SYSTEM_PROMPT] [INST]", -1},
        {"\"[INST]\" + content + \"[/INST]\"", CHAT_MISTRAL_V3_TEKKEN},
        {"'[INST]' + content", CHAT_MISTRAL_V3_TEKKEN},
        {"' [INST] ' + content + ' [/INST]'", CHAT_MISTRAL_V1},
        {"\"[INST] \" + content + \"[/INST]\"", CHAT_MISTRAL_V3},
        {"'[INST] ' + content + ' [/INST]'", CHAT_MISTRAL_LEGACY},
        {"[INST]", CHAT_MISTRAL_LEGACY},
        {"'<|user|>\\n' + content + '<|end|>'", CHAT_PHI3},
        {"'<|' + role + '|>' + content + '<|end|>' + '<|assistant|>'", CHAT_PHI3},
        {"'<|user|>\\n' + content + eos_token", CHAT_ZEPHYR},
        {"<|user|>hi</s>", CHAT_ZEPHYR},
        {"[gMASK]<sop><|user|>{{ eos_token }}", -1},
        {"<|user|> alone", -1},
        /* first rule wins: a ChatML template that mentions [INST] */
        {"<|im_start|> [INST]", CHAT_CHATML},
        /* ChatML with reasoning is Qwen3; <think> alone is not enough */
        {"'<|im_start|>' + role + '\\n<think>\\n' + r + '\\n</think>\\n\\n'", CHAT_QWEN3},
        {"'<|im_start|>assistant\\n<think>'", CHAT_CHATML},
        {"</think> <|im_start|>system<|im_sep|>", CHAT_QWEN3},
        /* ChatML with reasoning and XML tool calls is Qwen3.5 (the markers
         * of Qwen3.5-4B.jinja); XML calls without reasoning are not */
        {"'<|im_start|>system\\n' '</think>' '<tool_call>\\n<function=' + tool_call.name", CHAT_QWEN35},
        {"'<|im_start|>assistant\\n' '<tool_call>\\n<function=' + name", CHAT_CHATML},
        {"'<function=' '</think>'", -1},
        {"{{'<｜User｜>' + c}}{{'<｜Assistant｜>'}}", CHAT_DEEPSEEK3},
        {"'<｜Assistant｜><think>\\n'", CHAT_DEEPSEEK3},
        {"split('</think>') '<｜Assistant｜>'", CHAT_DEEPSEEK_R1},
        /* ASCII look-alikes of DeepSeek's full-width bars are not it */
        {"'<|Assistant|>' + content + '</think>'", -1},
        /* gpt-oss (harmony): both markers */
        {"{{- \"<|start|>system<|message|>\" }} '<|channel|>analysis<|message|>'", CHAT_GPT_OSS},
        {"'<|start|>assistant'", -1},
        {"'<|channel|>final'", -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int got = chat_detect(cases[i].text);
        CHECKF(got == cases[i].family, "case %zu '%s': got %d want %d", i, cases[i].text ? cases[i].text : "(null)",
               got, cases[i].family);
    }
}

static void test_names_and_stops(void) {
    for (int f = 0; f < CHAT_N_FAMILIES; f++) {
        const char *name = chat_family_name(f);
        CHECK(name != NULL);
        CHECKF(chat_family_from_name(name) == f, "%s", name);
        CHECK(chat_stop_marker(f) != NULL && chat_stop_marker(f)[0] != '\0');
    }
    CHECK(chat_family_from_name("mistral") == CHAT_MISTRAL_V1);
    CHECK(chat_family_from_name("ChatML") == CHAT_CHATML);
    CHECK(chat_family_from_name("LLAMA3") == CHAT_LLAMA3);
    CHECK(chat_family_from_name("mistral-v3-tekken") == CHAT_MISTRAL_V3_TEKKEN);
    CHECK(chat_family_from_name("llama") == -1);
    CHECK(chat_family_from_name("chatml ") == -1);
    CHECK(chat_family_from_name("") == -1);
    CHECK(chat_family_from_name(NULL) == -1);
    CHECK(chat_family_name(-1) == NULL && chat_family_name(CHAT_N_FAMILIES) == NULL);
    CHECK(chat_stop_marker(-1) == NULL && chat_stop_marker(CHAT_N_FAMILIES) == NULL);
    CHECK(!strcmp(chat_stop_marker(CHAT_CHATML), "<|im_end|>"));
    CHECK(!strcmp(chat_stop_marker(CHAT_LLAMA3), "<|eot_id|>"));
    CHECK(!strcmp(chat_stop_marker(CHAT_GEMMA), "<end_of_turn>"));
    CHECK(!strcmp(chat_stop_marker(CHAT_GPT_OSS), "<|return|>"));
    CHECK(chat_family_from_name("GPT-OSS") == CHAT_GPT_OSS && chat_family_from_name("gptoss") == -1);
    CHECK(chat_family_from_name("qwen3") == CHAT_QWEN3 && chat_family_from_name("Qwen3") == CHAT_QWEN3);
    CHECK(chat_family_from_name("deepseek3") == CHAT_DEEPSEEK3);
    CHECK(chat_family_from_name("DeepSeek-R1") == CHAT_DEEPSEEK_R1);
    CHECK(chat_family_from_name("deepseek") == -1);
    CHECK(!strcmp(chat_stop_marker(CHAT_QWEN3), "<|im_end|>"));
    for (int f = 0; f < CHAT_N_FAMILIES; f++)
        CHECK((chat_thinking_off(f) != NULL) == (f == CHAT_QWEN3 || f == CHAT_QWEN35));
    CHECK(!strcmp(chat_thinking_off(CHAT_QWEN35), "\n</think>\n\n"));
    CHECK(chat_family_from_name("qwen3.5") == CHAT_QWEN35 && chat_family_from_name("Qwen35") == CHAT_QWEN35);
    CHECK(!strcmp(chat_family_name(CHAT_QWEN35), "qwen3.5") && !strcmp(chat_stop_marker(CHAT_QWEN35), "<|im_end|>"));
    CHECK(chat_family_from_name("qwen3.6") == -1 && chat_family_from_name("qwen3 5") == -1);
    CHECK(chat_thinking_off(-1) == NULL && chat_thinking_off(CHAT_N_FAMILIES) == NULL);
    CHECK(!strcmp(chat_stop_marker(CHAT_DEEPSEEK_R1),
                  "<\xef\xbd\x9c"
                  "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"));
    CHECK(!strcmp(chat_stop_marker(CHAT_PHI3), "<|end|>"));
    CHECK(!strcmp(chat_stop_marker(CHAT_ZEPHYR), "</s>"));
    CHECK(!strcmp(chat_stop_marker(CHAT_LLAMA2), "</s>"));
    CHECK(!strcmp(chat_stop_marker(CHAT_MISTRAL_V3), "</s>"));
}

/* --------------------------------------------------------------- errors */

/* Renders and expects failure with a message containing `needle`. */
static int fails_with(int family, const lm_chat_msg *m, int n, const char *needle) {
    char *out = (char *)"unset", err[LM_ERRLEN] = "";
    int r = chat_render(family, m, n, true, "<s>", "</s>", &out, err, sizeof err);
    if (r == 0) lm_free(out);
    if (r != -1 || out != NULL || !strstr(err, needle)) {
        fprintf(stderr, "  family %d: r=%d err='%s' (want '%s')\n", family, r, err, needle);
        return 0;
    }
    return 1;
}

static void test_errors(void) {
    lm_chat_msg tool[] = {{"user", "hi"}, {"tool", "42"}};
    lm_chat_msg upper[] = {{"User", "hi"}};
    lm_chat_msg no_role[] = {{NULL, "hi"}};
    lm_chat_msg no_content[] = {{"user", NULL}};
    lm_chat_msg ok[] = {{"user", "hi"}};
    for (int f = 0; f < CHAT_N_FAMILIES; f++) {
        CHECK(fails_with(f, tool, 2, "unknown role 'tool'"));
        CHECK(fails_with(f, upper, 1, "unknown role 'User'"));
        CHECK(fails_with(f, no_role, 1, "no role"));
        CHECK(fails_with(f, no_content, 1, "no content"));
        CHECK(fails_with(f, ok, 0, "no messages"));
        CHECK(fails_with(f, NULL, 1, "no messages"));
    }
    CHECK(fails_with(-1, ok, 1, "invalid template family"));
    CHECK(fails_with(CHAT_N_FAMILIES, ok, 1, "invalid template family"));
    /* NULL err buffer and NULL out pointer are tolerated. */
    char *out = NULL;
    CHECK(chat_render(CHAT_CHATML, tool, 2, true, NULL, NULL, &out, NULL, 0) == -1);
    CHECK(out == NULL);
    CHECK(chat_render(CHAT_CHATML, ok, 1, true, NULL, NULL, NULL, NULL, 0) == -1);

    /* Alternation, where the reference template raises. */
    lm_chat_msg two_users[] = {{"user", "a"}, {"user", "b"}};
    CHECK(fails_with(CHAT_LLAMA2, two_users, 2, "must alternate"));
    CHECK(fails_with(CHAT_MISTRAL_LEGACY, two_users, 2, "must alternate"));
    CHECK(fails_with(CHAT_MISTRAL_V1, two_users, 2, "must alternate"));
    CHECK(fails_with(CHAT_MISTRAL_V3, two_users, 2, "must alternate"));
    CHECK(fails_with(CHAT_MISTRAL_V3_TEKKEN, two_users, 2, "must alternate"));
    CHECK(fails_with(CHAT_GEMMA, two_users, 2, "message 1 is user"));
    lm_chat_msg late[] = {{"user", "a"}, {"system", "s"}, {"user", "b"}};
    CHECK(fails_with(CHAT_MISTRAL_V1, late, 3, "message 1 is system"));
    CHECK(fails_with(CHAT_MISTRAL_V3, late, 3, "initial optional system message"));
    int free_form[] = {CHAT_CHATML, CHAT_LLAMA3, CHAT_PHI3, CHAT_ZEPHYR};
    for (size_t i = 0; i < 4; i++) {
        char *o = NULL, err[LM_ERRLEN];
        CHECK(chat_render(free_form[i], two_users, 2, true, "<s>", "</s>", &o, err, sizeof err) == 0);
        lm_free(o);
    }

    /* chat_render_template on text lamina does not know. */
    out = (char *)"unset";
    char err[LM_ERRLEN] = "";
    CHECK(chat_render_template("{{ messages }}", ok, 1, true, NULL, NULL, &out, err, sizeof err) == -1);
    CHECK(out == NULL && strstr(err, "unrecognized chat template"));
    CHECK(chat_render_template(NULL, ok, 1, true, NULL, NULL, &out, err, sizeof err) == -1);
}

/* ------------------------------------------------------- small renders */

static int renders_to(int family, const lm_chat_msg *m, int n, bool gen, const char *bos, const char *eos,
                      const char *want) {
    char *out = NULL, err[LM_ERRLEN] = "";
    int r = chat_render(family, m, n, gen, bos, eos, &out, err, sizeof err);
    int good = r == 0 && out && !strcmp(out, want);
    if (!good) {
        fprintf(stderr, "  family %s: r=%d err='%s'\n", chat_family_name(family), r, err);
        if (r == 0) show_diff(out, strlen(out), want, strlen(want));
    }
    lm_free(out);
    return good;
}

static void test_null_bos_eos(void) {
    lm_chat_msg m[] = {{"user", "Hi"}, {"assistant", "Yo"}, {"user", "Q"}};
    CHECK(renders_to(CHAT_LLAMA2, m, 3, true, NULL, NULL, "[INST] Hi [/INST] Yo [INST] Q [/INST]"));
    CHECK(renders_to(CHAT_LLAMA2, m, 3, true, "<s>", "</s>", "<s>[INST] Hi [/INST] Yo </s><s>[INST] Q [/INST]"));
    CHECK(
        renders_to(CHAT_GEMMA, m, 1, true, NULL, NULL, "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"));
    CHECK(renders_to(CHAT_PHI3, m, 1, false, NULL, NULL, "<|user|>\nHi<|end|>\n"));
    /* Families that write no BOS do not gain one from bos_text. */
    CHECK(
        renders_to(CHAT_CHATML, m, 1, true, "<s>", "</s>", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
    /* llama2 with only a system message renders nothing, as its template. */
    lm_chat_msg sys[] = {{"system", "S"}};
    CHECK(renders_to(CHAT_LLAMA2, sys, 1, true, "<s>", "</s>", ""));
}

/* Stripping looks at UTF-8 whitespace only; other bytes, valid or not, stay. */
static void test_strip_bytes(void) {
    lm_chat_msg m1[] = {{"user", " \xff\xfe \xc2 "}};
    CHECK(renders_to(CHAT_LLAMA3, m1, 1, false, "", "",
                     "<|start_header_id|>user<|end_header_id|>\n\n\xff\xfe \xc2<|eot_id|>"));
    /* A truncated U+2000 (E2 80) is not whitespace; a whole one is. */
    lm_chat_msg m2[] = {{"user", "a\xe2\x80"}};
    CHECK(renders_to(CHAT_GEMMA, m2, 1, false, "", "", "<start_of_turn>user\na\xe2\x80<end_of_turn>\n"));
    lm_chat_msg m3[] = {{"user",
                         "\xe2\x80\x80"
                         "a\xe2\x80\x80\xc2\xa0"}};
    CHECK(renders_to(CHAT_GEMMA, m3, 1, false, "", "", "<start_of_turn>user\na<end_of_turn>\n"));
    /* U+200B ZERO WIDTH SPACE (E2 80 8B) is not whitespace to Python. */
    lm_chat_msg m4[] = {{"user",
                         "\xe2\x80\x8b"
                         "a"}};
    CHECK(renders_to(CHAT_GEMMA, m4, 1, false, "", "",
                     "<start_of_turn>user\n\xe2\x80\x8b"
                     "a<end_of_turn>\n"));
    /* Only blanks: nothing left. */
    lm_chat_msg m5[] = {{"user", " \t\n\xe3\x80\x80"}};
    CHECK(renders_to(CHAT_GEMMA, m5, 1, false, "", "", "<start_of_turn>user\n<end_of_turn>\n"));
}

static int template_renders_to(const char *tmpl, const lm_chat_msg *m, int n, const char *want) {
    char *out = NULL, err[LM_ERRLEN] = "";
    int r = chat_render_template(tmpl, m, n, true, "<s>", "</s>", &out, err, sizeof err);
    int good = r == 0 && !strcmp(out, want);
    if (!good) {
        fprintf(stderr, "  template '%.60s...': r=%d err='%s'\n", tmpl, r, err);
        if (r == 0) show_diff(out, strlen(out), want, strlen(want));
    }
    lm_free(out);
    return good;
}

#define CHATML_LOOP                                                                                                    \
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "                                       \
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt "                              \
    "%}{{ '<|im_start|>assistant\\n' }}{% endif %}"

static void test_template_text_rules(void) {
    lm_chat_msg u[] = {{"user", "Q"}};
    lm_chat_msg su[] = {{"system", "Mine."}, {"user", "Q"}};
    const char *plain = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n";
    /* Escapes in the default system literal are decoded as Jinja does. */
    const char *esc = "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nIt\\'s "
                      "\\u00e9 \\x41 \"q\" \\\\ \\t<|im_end|>\\n' }}{% endif %}" CHATML_LOOP;
    CHECK(template_renders_to(esc, u, 1,
                              "<|im_start|>system\nIt's \xc3\xa9 A \"q\" \\ \t<|im_end|>\n"
                              "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"));
    /* A conversation with its own system message keeps it alone. */
    CHECK(template_renders_to(esc, su, 2,
                              "<|im_start|>system\nMine.<|im_end|>\n<|im_start|>user\nQ"
                              "<|im_end|>\n<|im_start|>assistant\n"));
    /* A double-quoted literal with a raw newline and an apostrophe. */
    const char *dq = "{{ \"<|im_start|>system\nYou're kind.<|im_end|>\n\" }}" CHATML_LOOP;
    CHECK(template_renders_to(dq, u, 1,
                              "<|im_start|>system\nYou're kind.<|im_end|>\n<|im_start|>user\nQ"
                              "<|im_end|>\n<|im_start|>assistant\n"));
    /* An escape Jinja has but lamina does not decode: no default rather than a wrong one. */
    const char *odd = "{{ '<|im_start|>system\\nBell\\a<|im_end|>\\n' }}" CHATML_LOOP;
    CHECK(template_renders_to(odd, u, 1, plain));
    /* A system turn built from the first message is no default. */
    const char *concat = "{{ '<|im_start|>system\\n' + messages[0]['content'] + "
                         "'<|im_end|>\\n' }}" CHATML_LOOP;
    CHECK(template_renders_to(concat, u, 1, plain));
    /* An empty default system message is still written. */
    const char *empty = "{{ '<|im_start|>system\\n<|im_end|>\\n' }}" CHATML_LOOP;
    CHECK(template_renders_to(empty, u, 1,
                              "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
                              "<|im_start|>assistant\n"));
    /* A rejected candidate before the real one leaves nothing behind. */
    const char *two = "{{ '<|im_start|>system\\nlong rejected text' + x + '<|im_end|>' }}"
                      "{{ '<|im_start|>system\\nOK<|im_end|>\\n' }}" CHATML_LOOP;
    CHECK(template_renders_to(two, u, 1,
                              "<|im_start|>system\nOK<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
                              "<|im_start|>assistant\n"));
    /* A leading {{ bos_token }} in the families that write none. */
    CHECK(template_renders_to("  {{- bos_token -}}" CHATML_LOOP, u, 1,
                              "<s><|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"));
    CHECK(
        template_renders_to("{{ '<|user|>\\n' }}{{ bos_token }}<|end|>", u, 1, "<|user|>\nQ<|end|>\n<|assistant|>\n"));
    CHECK(template_renders_to("{{bos_token}}'<|user|>\\n' + eos_token", u, 1, "<s><|user|>\nQ</s>\n<|assistant|>\n"));
    /* ... but not where the family writes the BOS itself. */
    CHECK(template_renders_to("{{ bos_token }}<|start_header_id|>", u, 1,
                              "<s><|start_header_id|>user<|end_header_id|>\n\nQ<|eot_id|>"
                              "<|start_header_id|>assistant<|end_header_id|>\n\n"));
}

/* ------------------------------------------------------ allocation failure */

static void test_alloc_failure(void) {
    CHECK(load_convs() > 0);
    const conv *c = find_conv("long");
    CHECK(c != NULL);
    char *qwen_text = NULL;
    for (int i = 0; i < load_manifest(); i++)
        if (!strcmp(entries[i].id, "qwen2.5-7b-instruct")) qwen_text = load_template(&entries[i]);
    CHECK(qwen_text != NULL);
    int failures_seen = 0;
    for (int f = 0; f <= CHAT_N_FAMILIES; f++) { /* f == N: chat_render_template */
        const lm_chat_msg *m = c->msgs;
        int n = c->n;
        lm_chat_msg user_first[MAX_MSGS];
        if (f == CHAT_MISTRAL_LEGACY) { /* no system role there */
            memcpy(user_first, c->msgs + 1, sizeof(lm_chat_msg) * (size_t)(c->n - 1));
            m = user_first;
            n = c->n - 1;
        }
        char *want = NULL, err[LM_ERRLEN];
        int r = f < CHAT_N_FAMILIES ? chat_render(f, m, n, true, "<s>", "</s>", &want, err, sizeof err)
                                    : chat_render_template(qwen_text, m, n, true, NULL, NULL, &want, err, sizeof err);
        CHECKF(r == 0, "family %d: %s", f, err);
        int done = 0;
        for (long k = 0; k < 64 && !done; k++) {
            char *out = (char *)"unset";
            err[0] = '\0';
            lm_alloc_fail_after(k);
            r = f < CHAT_N_FAMILIES ? chat_render(f, m, n, true, "<s>", "</s>", &out, err, sizeof err)
                                    : chat_render_template(qwen_text, m, n, true, NULL, NULL, &out, err, sizeof err);
            lm_alloc_fail_after(-1);
            if (r == 0) {
                CHECKF(!strcmp(out, want), "family %d, %ld allocations", f, k);
                lm_free(out);
                done = 1;
            } else {
                CHECKF(out == NULL && strstr(err, "out of memory"), "family %d: '%s'", f, err);
                failures_seen++;
            }
        }
        lm_free(want);
        CHECKF(done, "family %d never succeeded", f);
    }
    free(qwen_text);
    CHECK(failures_seen > CHAT_N_FAMILIES);
}

/* ------------------------------------------------- a model's template */

#define TEST_MODEL "models/stories260K.gguf"

/* A GGUF file holding only the given metadata (NULL: key absent), read back. */
static gguf_ctx *meta_file(const char *arch, const char *tmpl) {
    char path[] = "/tmp/lamina_test_chat_XXXXXX", err[LM_ERRLEN];
    int fd = mkstemp(path);
    if (fd < 0) return NULL;
    close(fd);
    gguf_writer *w = gguf_writer_new();
    if (arch) gguf_w_set_str(w, "general.architecture", arch);
    if (tmpl) gguf_w_set_str(w, "tokenizer.chat_template", tmpl);
    gguf_ctx *g = NULL;
    if (gguf_writer_write(w, path, err, sizeof err) == 0) g = gguf_open(path, err, sizeof err);
    gguf_writer_free(w);
    unlink(path);
    return g;
}

/* The bundled model's tokenizer, with add_bos_token forced to add_bos. */
static lm_tokenizer *model_tok(bool add_bos) {
    char path[] = "/tmp/lamina_test_chat_XXXXXX", err[LM_ERRLEN];
    gguf_ctx *src = gguf_open(TEST_MODEL, err, sizeof err);
    int fd = mkstemp(path);
    if (!src || fd < 0) {
        gguf_close(src);
        return NULL;
    }
    close(fd);
    gguf_writer *w = gguf_writer_new();
    for (int64_t i = 0; i < gguf_n_kv(src); i++) gguf_w_copy_kv(w, src, i);
    gguf_w_set_bool(w, "tokenizer.ggml.add_bos_token", add_bos);
    lm_tokenizer *t = NULL;
    gguf_ctx *g = gguf_writer_write(w, path, err, sizeof err) == 0 ? gguf_open(path, err, sizeof err) : NULL;
    if (g) t = tok_load(g, err, sizeof err);
    gguf_close(g);
    gguf_writer_free(w);
    gguf_close(src);
    unlink(path);
    return t;
}

static char *template_file(const char *id) {
    char p[256];
    size_t len;
    snprintf(p, sizeof p, DATA "templates/%s.jinja", id);
    return read_all(p, &len);
}

static void test_resolve_branches(void) {
    char err[LM_ERRLEN];
    lm_chat_template t;
    char *qwen = template_file("qwen2.5-7b-instruct"), *llama2 = template_file("llama-2-7b-chat");
    char *phi4 = template_file("phi-4");
    CHECK(qwen && llama2 && phi4);
    gguf_ctx *with = meta_file("llama", qwen), *plain = meta_file("llama", NULL);
    gguf_ctx *gemma = meta_file("gemma3", NULL), *gemma_own = meta_file("gemma3", llama2);
    gguf_ctx *unknown = meta_file("llama", phi4), *noarch = meta_file(NULL, NULL);
    CHECK(with && plain && gemma && gemma_own && unknown && noarch);

    /* 1. the user's family name wins over everything */
    CHECK(chat_template_resolve(&t, with, "llama3", llama2, err, sizeof err) == CHAT_OK);
    CHECK(t.family == CHAT_LLAMA3 && t.text == NULL && t.source == CHAT_SRC_NAME);
    chat_template_free(&t);
    CHECK(chat_template_resolve(&t, gemma, "Mistral", NULL, err, sizeof err) == CHAT_OK);
    CHECK(t.family == CHAT_MISTRAL_V1 && t.source == CHAT_SRC_NAME);
    chat_template_free(&t);
    /* ... and an unknown name is an error naming it, not a fall-through */
    err[0] = '\0';
    CHECK(chat_template_resolve(&t, with, "chatmlx", NULL, err, sizeof err) == CHAT_ERR);
    CHECKF(strstr(err, "'chatmlx'") && strstr(err, "family name"), "%s", err);
    CHECK(t.family == -1 && t.text == NULL);

    /* 2. a template file's text wins over the model's own (copied) */
    CHECK(chat_template_resolve(&t, with, NULL, llama2, err, sizeof err) == CHAT_OK);
    CHECK(t.family == -1 && t.text && t.text != llama2 && !strcmp(t.text, llama2) && t.source == CHAT_SRC_FILE);
    chat_template_free(&t);
    CHECK(chat_template_resolve(&t, with, NULL, phi4, err, sizeof err) == CHAT_ERR);
    CHECKF(strstr(err, "given chat template is not one lamina recognizes"), "%s", err);
    CHECK(t.family == -1 && t.text == NULL);

    /* 3. the model's own tokenizer.chat_template */
    CHECK(chat_template_resolve(&t, with, NULL, NULL, err, sizeof err) == CHAT_OK);
    CHECK(t.family == -1 && t.text && !strcmp(t.text, qwen) && t.source == CHAT_SRC_MODEL);
    chat_template_free(&t);
    chat_template_free(&t); /* twice is harmless */
    CHECK(t.text == NULL && t.family == -1);
    CHECK(chat_template_resolve(&t, gemma_own, NULL, NULL, err, sizeof err) == CHAT_OK);
    CHECK(t.source == CHAT_SRC_MODEL && !strcmp(t.text, llama2)); /* a Gemma file's own template first */
    chat_template_free(&t);
    CHECK(chat_template_resolve(&t, unknown, NULL, NULL, err, sizeof err) == CHAT_ERR);
    CHECKF(strstr(err, "model's chat template is not one lamina recognizes"), "%s", err);

    /* 4. the architecture's fallback: Gemma 3 without a template speaks Gemma */
    CHECK(chat_template_resolve(&t, gemma, NULL, NULL, err, sizeof err) == CHAT_OK);
    CHECK(t.family == CHAT_GEMMA && t.text == NULL && t.source == CHAT_SRC_FALLBACK);
    chat_template_free(&t);

    /* ... and so do the other architectures whose turn format is fixed */
    static const struct {
        const char *arch;
        int family;
    } fallbacks[] = {{"gemma2", CHAT_GEMMA},  {"qwen3", CHAT_QWEN3},      {"qwen3moe", CHAT_QWEN3},
                     {"qwen35", CHAT_QWEN35}, {"qwen35moe", CHAT_QWEN35}, {"qwen3next", CHAT_QWEN3},
                     {"phi3", CHAT_PHI3},     {"deepseek2", -1},          {"qwen2", -1}};
    for (size_t i = 0; i < sizeof fallbacks / sizeof fallbacks[0]; i++) {
        gguf_ctx *g = meta_file(fallbacks[i].arch, NULL);
        CHECK(g != NULL);
        int rc = chat_template_resolve(&t, g, NULL, NULL, err, sizeof err);
        CHECKF(fallbacks[i].family < 0
                   ? rc == CHAT_NONE
                   : rc == CHAT_OK && t.family == fallbacks[i].family && t.source == CHAT_SRC_FALLBACK,
               "%s: rc %d family %d", fallbacks[i].arch, rc, t.family);
        chat_template_free(&t);
        gguf_close(g);
    }
    /* a gemma2 / qwen3 / deepseek2 file's own template resolves to its family */
    static const struct {
        const char *arch, *id;
        int family;
    } own[] = {{"gemma2", "gemma-2-2b-it", CHAT_GEMMA},
               {"qwen3", "qwen3-0.6b", CHAT_QWEN3},
               {"phi3", "phi-3-mini-4k-instruct", CHAT_PHI3},
               {"deepseek2", "deepseek-v3", CHAT_DEEPSEEK3},
               {"llama", "deepseek-r1-distill-llama-8b", CHAT_DEEPSEEK_R1}};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) {
        char *text = template_file(own[i].id);
        gguf_ctx *g = text ? meta_file(own[i].arch, text) : NULL;
        CHECK(g != NULL);
        CHECK(chat_template_resolve(&t, g, NULL, NULL, err, sizeof err) == CHAT_OK);
        CHECKF(t.source == CHAT_SRC_MODEL && chat_detect(t.text) == own[i].family, "%s", own[i].id);
        chat_template_free(&t);
        gguf_close(g);
        free(text);
    }

    /* 5. nothing: CHAT_NONE with a message naming the key */
    gguf_ctx *none[] = {plain, noarch, NULL};
    for (int i = 0; i < 3; i++) {
        err[0] = '\0';
        CHECK(chat_template_resolve(&t, none[i], NULL, NULL, err, sizeof err) == CHAT_NONE);
        CHECKF(strstr(err, "no chat template") && strstr(err, "tokenizer.chat_template"), "%s", err);
        CHECK(t.family == -1 && t.text == NULL);
    }

    gguf_close(with);
    gguf_close(plain);
    gguf_close(gemma);
    gguf_close(gemma_own);
    gguf_close(unknown);
    gguf_close(noarch);
    free(qwen);
    free(llama2);
    free(phi4);
}

/* chat_apply: the tokenizer's BOS/EOS texts go in, and the leading BOS text
 * comes out again exactly when the tokenizer adds BOS itself. */
static void test_apply_bos_strip(void) {
    char err[LM_ERRLEN];
    lm_tokenizer *adds = model_tok(true), *keeps = model_tok(false);
    CHECK(adds && keeps);
    size_t bl, el;
    const char *bp = tok_piece(adds, tok_bos(adds), &bl), *ep = tok_piece(adds, tok_eos(adds), &el);
    char bos[64], eos[64];
    CHECK(bl > 0 && bl < sizeof bos && el > 0 && el < sizeof eos);
    memcpy(bos, bp, bl);
    bos[bl] = '\0';
    memcpy(eos, ep, el);
    eos[el] = '\0';
    CHECK(!strcmp(bos, "<s>") && !strcmp(eos, "</s>"));
    const lm_chat_msg talk[] = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}};
    const int fams[] = {CHAT_LLAMA2, CHAT_LLAMA3, CHAT_GEMMA, CHAT_CHATML, CHAT_ZEPHYR};
    for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++) {
        char *want = NULL, *a = NULL, *k = NULL;
        bool ab = false, kb = true;
        CHECK(chat_render(fams[f], talk, 4, true, bos, eos, &want, err, sizeof err) == 0);
        CHECKF(chat_apply(fams[f], NULL, adds, talk, 4, &a, &ab, err, sizeof err) == 0, "%s", err);
        CHECKF(chat_apply(fams[f], NULL, keeps, talk, 4, &k, &kb, err, sizeof err) == 0, "%s", err);
        CHECK(ab == true && kb == false);
        bool leads = !strncmp(want, bos, bl);
        /* llama2, llama3 and gemma write the BOS first; chatml and zephyr do not */
        CHECK(leads == (fams[f] == CHAT_LLAMA2 || fams[f] == CHAT_LLAMA3 || fams[f] == CHAT_GEMMA));
        CHECKF(!strcmp(a, leads ? want + bl : want), "family %d: '%s'", fams[f], a);
        CHECKF(!strcmp(k, want), "family %d: '%s'", fams[f], k);
        if (fams[f] == CHAT_LLAMA2) /* only the leading BOS goes: the later turn keeps its own */
            CHECK(strstr(a, "<s>[INST] Bye [/INST]") != NULL);
        if (fams[f] == CHAT_ZEPHYR) /* the EOS text ends a turn */
            CHECK(strstr(a, "Hello.</s>") != NULL);
        lm_free(want);
        lm_free(a);
        lm_free(k);
    }
    /* by template text: the same as chat_render_template, stripped */
    char *llama2 = template_file("llama-2-7b-chat"), *want = NULL, *a = NULL;
    bool ab;
    CHECK(llama2 && chat_render_template(llama2, talk, 4, true, bos, eos, &want, err, sizeof err) == 0);
    CHECK(chat_apply(-1, llama2, adds, talk, 4, &a, &ab, err, sizeof err) == 0 && ab);
    CHECK(!strncmp(want, "<s>", 3) && !strcmp(a, want + 3));
    lm_free(want);
    lm_free(a);
    free(llama2);
    /* no template, or a render error: -1, *out NULL, a message */
    a = (char *)"unset";
    CHECK(chat_apply(-1, NULL, adds, talk, 4, &a, &ab, err, sizeof err) == -1 && a == NULL);
    const lm_chat_msg two_users[] = {{"user", "a"}, {"user", "b"}};
    err[0] = '\0';
    CHECK(chat_apply(CHAT_LLAMA2, NULL, adds, two_users, 2, &a, &ab, err, sizeof err) == -1 && a == NULL && err[0]);
    tok_free(adds);
    tok_free(keeps);
}

static void free_convs(void) {
    for (int i = 0; i < n_convs; i++)
        for (int j = 0; j < convs[i].n; j++) {
            free((char *)convs[i].msgs[j].role);
            free((char *)convs[i].msgs[j].content);
        }
}

/* ------------------------------------------------------------------ tools */

/* tools_golden.txt (make_tools_golden.py): conversations with tools rendered
 * by jinja2 with the real Qwen2.5, Qwen3 and Mistral v0.3 / Nemo templates;
 * the same through chat_render_tools, by template text and by family name.
 * tools_golden_<id>.txt: the same for a template not kept here (Qwen3.5,
 * gpt-oss), by family name, with gpt-oss's reasoning ("think"), its
 * reasoning_effort ("effort") and the goldens' date. */
typedef struct {
    char tid[64], name[64], bos[32], eos[32], effort[16];
    char *identity; /* model_identity, or NULL */
    int gen;
    char *tools[8];
    int n_tools;
    lm_chat_xmsg m[MAX_MSGS];
    lm_chat_call calls[MAX_MSGS][4];
    int n;
    char *expect; /* NULL: the template raises */
} tool_case;

static void tool_case_free(tool_case *c) {
    for (int i = 0; i < c->n_tools; i++) free(c->tools[i]);
    for (int i = 0; i < c->n; i++) {
        free((char *)c->m[i].role);
        free((char *)c->m[i].content);
        free((char *)c->m[i].call_id);
        free((char *)c->m[i].reasoning);
        for (int k = 0; k < c->m[i].n_calls; k++) {
            free((char *)c->calls[i][k].id);
            free((char *)c->calls[i][k].name);
            free((char *)c->calls[i][k].arguments);
        }
    }
    free(c->expect);
    free(c->identity);
    memset(c, 0, sizeof *c);
}

/* The cases of one tools golden file: by template text and, where the
 * template adds nothing to its family, by family name; by family only for
 * a template whose text is not kept (by_family: the manifest's family).
 * Adds to *n_cases and *n_ok. */
static void tools_golden_file(const char *path, int by_family, int *n_cases, int *n_ok) {
    char *text = read_all(path, NULL);
    CHECKF(text, "%s missing", path);
    if (!text) return;
    char *p = text, *line;
    tool_case c;
    memset(&c, 0, sizeof c);
    bool open_case = false;
    for (;;) {
        line = take_line(&p);
        char a[64], b[64];
        size_t len;
        bool end = !line || !strncmp(line, "case ", 5);
        if (end && open_case) {
            char tpath[256];
            snprintf(tpath, sizeof tpath, DATA "templates/%s.jinja", c.tid);
            char *tmpl = by_family >= 0 ? NULL : read_all(tpath, NULL);
            CHECKF(tmpl || by_family >= 0, "no template %s", tpath);
            const char *bos = strcmp(c.bos, "-") ? c.bos : NULL, *eos = strcmp(c.eos, "-") ? c.eos : NULL;
            for (int by_name = by_family >= 0; by_name < 2; by_name++) {
                /* by family name only where the template adds nothing to its family (Mistral) */
                int fam = by_family >= 0 ? by_family : chat_detect(tmpl);
                if (by_name && fam == CHAT_CHATML) continue;
                char *out = NULL, err[LM_ERRLEN] = "";
                lm_chat_conv cv = {.msgs = c.m,
                                   .n = c.n,
                                   .tools = (const char *const *)c.tools,
                                   .n_tools = c.n_tools,
                                   .reasoning_effort = c.effort[0] ? c.effort : NULL,
                                   .date = GOLDEN_DATE,
                                   .model_identity = c.identity};
                int rc = chat_render_conv(by_name ? fam : -1, by_name ? NULL : tmpl, &cv, c.gen, bos, eos, &out, err,
                                          sizeof err);
                if (c.expect) {
                    CHECKF(rc == 0, "%s %s gen %d: %s", c.tid, c.name, c.gen, err);
                    CHECKF(!strcmp(out, c.expect), "%s %s gen %d (by %s):\n--- got\n%s\n--- want\n%s", c.tid, c.name,
                           c.gen, by_name ? "name" : "text", out, c.expect);
                    ++*n_ok;
                } else {
                    CHECKF(rc == -1 && !out && err[0], "%s %s: the template raises, lamina rendered", c.tid, c.name);
                }
                lm_free(out);
            }
            free(tmpl);
            tool_case_free(&c);
            open_case = false;
            ++*n_cases;
        }
        if (!line) break;
        if (line[0] == '#' || !line[0]) continue;
        if (!strncmp(line, "case ", 5)) {
            CHECK(sscanf(line, "case %63s %d %63s %31s %31s", c.tid, &c.gen, c.name, c.bos, c.eos) == 5);
            open_case = true;
        } else if (sscanf(line, "tool %zu", &len) == 1) {
            CHECK(c.n_tools < 8 && (c.tools[c.n_tools++] = take_counted(&p, len)));
        } else if (sscanf(line, "msg %63s %zu", a, &len) == 2) {
            CHECK(c.n < MAX_MSGS);
            c.m[c.n].role = strdup(a);
            CHECK((c.m[c.n].content = take_counted(&p, len)));
            c.m[c.n].calls = c.calls[c.n];
            c.n++;
        } else if (sscanf(line, "call %63s %63s %zu", a, b, &len) == 3) {
            lm_chat_xmsg *m = &c.m[c.n - 1];
            CHECK(c.n > 0 && m->n_calls < 4);
            lm_chat_call *k = &c.calls[c.n - 1][m->n_calls++];
            k->id = strdup(a);
            k->name = strdup(b);
            CHECK((k->arguments = take_counted(&p, len)));
        } else if (sscanf(line, "effort %15s", c.effort) == 1) {
        } else if (sscanf(line, "identity %zu", &len) == 1) {
            CHECK((c.identity = take_counted(&p, len)));
        } else if (sscanf(line, "think %zu", &len) == 1) {
            CHECK(c.n > 0 && (c.m[c.n - 1].reasoning = take_counted(&p, len)));
        } else if (sscanf(line, "callid %63s", a) == 1) {
            c.m[c.n - 1].call_id = strdup(a);
        } else if (sscanf(line, "ok %zu", &len) == 1) {
            CHECK((c.expect = take_counted(&p, len)));
        } else if (!strcmp(line, "error")) {
            take_line(&p);
        }
    }
    free(text);
}

static void test_tools_golden(void) {
    int n_cases = 0, n_ok = 0;
    tools_golden_file(DATA "tools_golden.txt", -1, &n_cases, &n_ok);
    CHECKF(n_cases == 40 && n_ok >= 60, "%d cases, %d renders compared", n_cases, n_ok);
    /* the templates not kept here (manifest golden 2): tools_golden_<id>.txt */
    CHECK(load_manifest() >= 20);
    int n_ext = 0;
    n_cases = n_ok = 0;
    for (int i = 0; i < n_entries; i++) {
        if (entries[i].golden != 2) continue;
        char path[256];
        snprintf(path, sizeof path, DATA "tools_golden_%.95s.txt", entries[i].id);
        tools_golden_file(path, chat_family_from_name(entries[i].family), &n_cases, &n_ok);
        n_ext++;
    }
    /* Qwen3.5: the 5 shared conversations and 6 of its own, gpt-oss: the 5
     * and 11 of its own, each with and without the prompt */
    CHECKF(n_ext == 2 && n_cases == 22 + 32 && n_ok == 18 + 22, "%d external templates: %d cases, %d renders compared",
           n_ext, n_cases, n_ok);
}

/* The families without a tool format of their own: the hermes text in the
 * system turn, calls in the assistant turn, results as user turns joined to
 * their neighbours where roles must alternate; Llama 3's ipython turns. */
static void test_tools_fallback(void) {
    const char *tool = "{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}";
    lm_chat_call call = {"id1", "f", "{\"a\":1}"};
    lm_chat_xmsg m[] = {{"user", "Hi", NULL, 0, NULL, NULL},
                        {"assistant", "", &call, 1, NULL, NULL},
                        {"tool", "42", NULL, 0, "id1", NULL},
                        {"user", "thanks", NULL, 0, NULL, NULL}};
    char *out = NULL, err[LM_ERRLEN];
    CHECKF(chat_render_tools(CHAT_GEMMA, NULL, m, 4, &tool, 1, true, "<bos>", "<eos>", &out, err, sizeof err) == 0,
           "%s", err);
    const char *want_gemma =
        "<bos><start_of_turn>user\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": "
        "\"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}\n</tools>\n\nFor "
        "each function call, return a json object with function name and arguments within <tool_call></tool_call> "
        "XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>\n\n"
        "Hi<end_of_turn>\n<start_of_turn>model\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n"
        "</tool_call><end_of_turn>\n<start_of_turn>user\n<tool_response>\n42\n</tool_response>\nthanks<end_of_turn>\n"
        "<start_of_turn>model\n";
    CHECKF(!strcmp(out, want_gemma), "gemma:\n%s", out);
    lm_free(out);
    /* llama3: tools in the first user turn (indent 4), calls as JSON, results as ipython */
    CHECKF(chat_render_tools(CHAT_LLAMA3, NULL, m, 3, &tool, 1, true, "<|begin_of_text|>", "", &out, err, sizeof err) ==
               0,
           "%s", err);
    const char *want_llama3 =
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for "
        "a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format "
        "{\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use "
        "variables.\n\n{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"f\",\n        "
        "\"parameters\": {\n            \"type\": \"object\"\n        }\n    }\n}\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"f\", \"parameters\": {\"a\": 1}}<|eot_id|>"
        "<|start_header_id|>ipython<|end_header_id|>\n\n42<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
        "\n\n";
    CHECKF(!strcmp(out, want_llama3), "llama3:\n%s", out);
    lm_free(out);
    /* without tools and tool messages: exactly chat_render */
    lm_chat_msg plain[] = {{"user", "Hi"}};
    char *a = NULL, *b = NULL;
    for (int f = 0; f < CHAT_N_FAMILIES; f++) {
        CHECK(chat_render(f, plain, 1, true, "<s>", "</s>", &a, err, sizeof err) == 0);
        CHECK(chat_render_tools(f, NULL, m, 1, NULL, 0, true, "<s>", "</s>", &b, err, sizeof err) == 0);
        CHECKF(!strcmp(a, b), "family %d", f);
        lm_free(a);
        lm_free(b);
    }
    /* syntaxes by family */
    CHECK(chat_tool_syntax(CHAT_CHATML) == CHAT_TOOLS_HERMES && chat_tool_syntax(CHAT_GEMMA) == CHAT_TOOLS_HERMES);
    CHECK(chat_tool_syntax(CHAT_LLAMA3) == CHAT_TOOLS_LLAMA3 &&
          chat_tool_syntax(CHAT_MISTRAL_V3) == CHAT_TOOLS_MISTRAL);
    CHECK(chat_tool_syntax(CHAT_MISTRAL_V3_TEKKEN) == CHAT_TOOLS_MISTRAL);
    CHECK(chat_tool_syntax(CHAT_QWEN35) == CHAT_TOOLS_XML && chat_tool_syntax(CHAT_QWEN3) == CHAT_TOOLS_HERMES);
    /* qwen3.5: arguments that are not a JSON object have no parameters to write */
    static const char *const not_objects[] = {"[1, 2]", "\"x\"", "{\"a\": }", "", "{} {}", "3"};
    for (size_t k = 0; k < sizeof not_objects / sizeof *not_objects; k++) {
        lm_chat_call bad = {"id1", "f", not_objects[k]};
        lm_chat_xmsg q[] = {{"user", "Hi", NULL, 0, NULL, NULL}, {"assistant", "", &bad, 1, NULL, NULL}};
        out = (char *)"unset";
        CHECKF(chat_render_tools(CHAT_QWEN35, NULL, q, 2, &tool, 1, true, NULL, NULL, &out, err, sizeof err) == -1 &&
                   !out && strstr(err, "not a JSON object"),
               "'%s'", not_objects[k]);
    }
    /* ... and blanks around an object are fine */
    lm_chat_call spaced = {"id1", "f", " \n{ \"a\" : [1,2] }\t"};
    lm_chat_xmsg q[] = {{"user", "Hi", NULL, 0, NULL, NULL}, {"assistant", "", &spaced, 1, NULL, NULL}};
    CHECKF(chat_render_tools(CHAT_QWEN35, NULL, q, 2, NULL, 0, false, NULL, NULL, &out, err, sizeof err) == 0, "%s",
           err);
    CHECKF(!strcmp(out,
                   "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n"
                   "<function=f>\n<parameter=a>\n[1, 2]\n</parameter>\n</function>\n</tool_call><|im_end|>\n"),
           "%s", out);
    lm_free(out);
    /* errors: unknown role, calls on a user message, a bad tool */
    lm_chat_xmsg bad1[] = {{"robot", "x", NULL, 0, NULL, NULL}};
    CHECK(chat_render_tools(CHAT_CHATML, NULL, bad1, 1, NULL, 0, true, NULL, NULL, &out, err, sizeof err) == -1 &&
          !out);
    lm_chat_xmsg bad2[] = {{"user", "x", &call, 1, NULL, NULL}};
    CHECK(chat_render_tools(CHAT_CHATML, NULL, bad2, 1, NULL, 0, true, NULL, NULL, &out, err, sizeof err) == -1);
    const char *badtool = "{\"type\":\"function\"}";
    CHECK(chat_render_tools(CHAT_MISTRAL_V3, NULL, m, 1, &badtool, 1, true, NULL, NULL, &out, err, sizeof err) == -1);
    CHECK(strstr(err, "function"));
}

/* Python's json.dumps: separators, indent, string escapes, invalid JSON. */
static void test_json_dump(void) {
    static const struct {
        const char *in;
        int indent;
        const char *want;
    } cases[] = {
        {"{\"a\":1,\"b\":[true,false,null,-1.5e3,\"x\"]}", -1, "{\"a\": 1, \"b\": [true, false, null, -1.5e3, \"x\"]}"},
        {" [ ] ", -1, "[]"},
        {"{}", 4, "{}"},
        {"{\"a\":[1,{}]}", 2, "{\n  \"a\": [\n    1,\n    {}\n  ]\n}"},
        {"\"\\u00e9\\/\\u0001\\ud83d\\ude00\\\"\\t\"", -1, "\"\xc3\xa9/\\u0001\xf0\x9f\x98\x80\\\"\\t\""},
        {"\"\x7f\xe2\x80\xa8\"", -1, "\"\x7f\xe2\x80\xa8\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        strbuf b = {0};
        CHECKF(chat_json_dump(cases[i].in, strlen(cases[i].in), cases[i].indent, &b) == 0, "case %zu", i);
        CHECKF(b.p && !strcmp(b.p, cases[i].want), "case %zu: %s", i, b.p);
        strbuf_free(&b);
    }
    static const char *const bad[] = {"",    "{",    "{\"a\"}",  "[1,]",  "01", "1.", "\"\\x\"",
                                      "tru", "{} x", "\"\x01\"", "[1 2]", "-",  "1e"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        strbuf b = {0};
        CHECKF(chat_json_dump(bad[i], strlen(bad[i]), -1, &b) == -1, "'%s' accepted", bad[i]);
        strbuf_free(&b);
    }
    char deep[400];
    memset(deep, '[', 200);
    memset(deep + 200, ']', 200);
    strbuf b = {0};
    CHECK(chat_json_dump(deep, 400, -1, &b) == -1); /* past the depth limit: refused, no crash */
    strbuf_free(&b);
}

/* chat_prompt, the server's one call: chat_apply_tools's text, then the
 * thinking switch's text where the family has one (Qwen3's empty think
 * block) and nothing where it has none; a template text with Qwen3's
 * markers gets the switch by detection. */
static void test_prompt_one_call(void) {
    char err[LM_ERRLEN];
    lm_tokenizer *tok = model_tok(true);
    CHECK(tok != NULL);
    const lm_chat_xmsg msgs[] = {{.role = "system", .content = "Be brief."}, {.role = "user", .content = "Hi"}};
    const int fams[] = {CHAT_CHATML, CHAT_QWEN3, CHAT_LLAMA3, CHAT_QWEN35};
    for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++) {
        for (int off = 0; off < 2; off++) {
            char *want = NULL, *got = NULL;
            bool wb = false, gb = true;
            CHECKF(chat_apply_tools(fams[f], NULL, tok, msgs, 2, NULL, 0, &want, &wb, err, sizeof err) == 0, "%s", err);
            lm_chat_conv cv = {.msgs = msgs, .n = 2, .thinking_off = off};
            CHECKF(chat_prompt(fams[f], NULL, tok, &cv, &got, &gb, err, sizeof err) == 0, "%s", err);
            const char *sw = off ? chat_thinking_off(fams[f]) : NULL;
            size_t wl = strlen(want);
            CHECKF(gb == wb && !strncmp(got, want, wl) && !strcmp(got + wl, sw ? sw : ""), "family %d off %d: '%s'",
                   fams[f], off, got);
            CHECK(fams[f] != CHAT_QWEN3 || !off || !strcmp(got + wl, "<think>\n\n</think>\n\n"));
            /* Qwen3.5's prompt opens <think>: thinking off closes it at once */
            const char *end =
                off ? "<|im_start|>assistant\n<think>\n\n</think>\n\n" : "<|im_start|>assistant\n<think>\n";
            size_t gl = strlen(got), el = strlen(end);
            CHECK(fams[f] != CHAT_QWEN35 || (gl >= el && !strcmp(got + gl - el, end)));
            lm_free(want);
            lm_free(got);
        }
    }
    tok_free(tok);
}

/* gpt-oss beyond the goldens: today's date when none is given, the
 * effort through chat_prompt, tools that are not function objects, and
 * schemas nested past the depth bound. */
static void test_harmony(void) {
    char err[LM_ERRLEN], *out = NULL, day0[16], day1[16];
    const lm_chat_msg hi[] = {{"user", "Hi"}};
    time_t now = time(NULL);
    struct tm tm;
    strftime(day0, sizeof day0, "%Y-%m-%d", localtime_r(&now, &tm));
    CHECKF(chat_render(CHAT_GPT_OSS, hi, 1, true, NULL, NULL, &out, err, sizeof err) == 0, "%s", err);
    now = time(NULL);
    strftime(day1, sizeof day1, "%Y-%m-%d", localtime_r(&now, &tm));
    char want0[64], want1[64];
    snprintf(want0, sizeof want0, "\nCurrent date: %s\n\nReasoning: medium\n\n", day0);
    snprintf(want1, sizeof want1, "\nCurrent date: %s\n\nReasoning: medium\n\n", day1);
    CHECKF(out && (strstr(out, want0) || strstr(out, want1)), "%s", out);
    lm_free(out);
    /* chat_prompt carries the effort and the date; other families ignore them */
    lm_tokenizer *tok = model_tok(true);
    CHECK(tok != NULL);
    const lm_chat_xmsg msgs[] = {{.role = "system", .content = "Be brief."}, {.role = "user", .content = "Hi"}};
    lm_chat_conv cv = {.msgs = msgs, .n = 2, .reasoning_effort = "high", .date = "2031-02-03"};
    bool ab = true;
    CHECKF(chat_prompt(CHAT_GPT_OSS, NULL, tok, &cv, &out, &ab, err, sizeof err) == 0, "%s", err);
    CHECKF(strstr(out, "\nCurrent date: 2031-02-03\n\nReasoning: high\n\n") &&
               strstr(out, "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>"),
           "%s", out);
    lm_free(out);
    char *plain = NULL;
    CHECK(chat_prompt(CHAT_QWEN3, NULL, tok, &cv, &out, &ab, err, sizeof err) == 0);
    cv.reasoning_effort = cv.date = NULL;
    CHECK(chat_prompt(CHAT_QWEN3, NULL, tok, &cv, &plain, &ab, err, sizeof err) == 0);
    CHECK(out && plain && !strcmp(out, plain));
    lm_free(out);
    lm_free(plain);
    tok_free(tok);
    /* a tool that is no function object: an error, no output */
    const char *bad[] = {"{\"type\":\"function\"}", "[1]", "not json"};
    for (int i = 0; i < 3; i++) {
        out = (char *)"unset";
        CHECKF(chat_render_tools(CHAT_GPT_OSS, NULL, msgs, 2, &bad[i], 1, true, NULL, NULL, &out, err, sizeof err) ==
                       -1 &&
                   !out && strstr(err, "tool 0"),
               "%s", bad[i]);
    }
    /* 200 nested arrays: past the bound the type is any, and no crash */
    strbuf deep = {0};
    strbuf_puts(&deep,
                "{\"type\":\"function\",\"function\":{\"name\":\"d\",\"description\":\"D\",\"parameters\":"
                "{\"type\":\"object\",\"properties\":{\"p\":");
    for (int i = 0; i < 200; i++) strbuf_puts(&deep, "{\"type\":\"array\",\"items\":");
    strbuf_puts(&deep, "{\"type\":\"object\"}");
    for (int i = 0; i < 200; i++) strbuf_puts(&deep, "}");
    strbuf_puts(&deep, "}}}}");
    const char *dt = deep.p;
    CHECKF(chat_render_tools(CHAT_GPT_OSS, NULL, msgs, 2, &dt, 1, true, NULL, NULL, &out, err, sizeof err) == 0, "%s",
           err);
    CHECKF(out && strstr(out, "p?: any[][]") && !strstr(out, "object"), "%s", out ? out : err);
    lm_free(out);
    strbuf_free(&deep);
}

int main(void) {
    TEST_RUN(test_golden_renders);
    TEST_RUN(test_detect_real_templates);
    TEST_RUN(test_detect_rules);
    TEST_RUN(test_names_and_stops);
    TEST_RUN(test_errors);
    TEST_RUN(test_null_bos_eos);
    TEST_RUN(test_strip_bytes);
    TEST_RUN(test_template_text_rules);
    TEST_RUN(test_alloc_failure);
    TEST_RUN(test_resolve_branches);
    TEST_RUN(test_apply_bos_strip);
    TEST_RUN(test_tools_golden);
    TEST_RUN(test_tools_fallback);
    TEST_RUN(test_json_dump);
    TEST_RUN(test_prompt_one_call);
    TEST_RUN(test_harmony);
    free_convs();
    return TEST_DONE();
}
