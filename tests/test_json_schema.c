/*
 * test_json_schema.c - JSON Schema -> GBNF (src/decode/json_schema.c).
 *
 * Each keyword compiles and unsupported ones are refused naming the keyword
 * and its JSON pointer. For every schema of the corpus (tests/data/schemas:
 * a schema with valid and invalid instances, checked against Python's
 * jsonschema by tests/e2e_schema.py) the grammar accepts the valid
 * instances and rejects the invalid ones, and strings drawn by a random
 * walk of the grammar parse as JSON. Matching and walking use the slow
 * reference of tests/gbnf_ref.h; the grammar engine (decode/grammar.h)
 * parses every corpus grammar and agrees with the reference on instances,
 * samples, cut and mutated samples, and a byte vocabulary's masks.
 *
 * With --samples N the program instead prints, per corpus schema, one JSON
 * line {"file": name, "samples": [N texts]} of random-walk strings, which
 * tests/e2e_schema.py validates with jsonschema; --check (below) says
 * whether a model's output cut short by its token limit is a viable prefix.
 */
#include <cjson/cJSON.h>
#include <dirent.h>

#include "base/strbuf.h"
#include "base/util.h"
#include "decode/grammar.h"
#include "decode/json_schema.h"
#include "gbnf_ref.h"
#include "test.h"

#define CORPUS "tests/data/schemas"

static char *compile(const char *schema, char *err) {
    err[0] = 0;
    return json_schema_to_gbnf(schema, strlen(schema), err, LM_ERRLEN);
}

/* Compile and parse with the reference; NULL (and a message) on failure. */
static int load(gref *g, const char *schema, char *err) {
    char *t = compile(schema, err);
    if (!t) return -1;
    int rc = gref_parse(g, t);
    if (rc) snprintf(err, LM_ERRLEN, "reference parse: %s\n%s", g->err, t);
    lm_free(t);
    return rc;
}

static bool accepts(gref *g, const char *text) { return gref_accepts(g, text, strlen(text)); }

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
    b[n] = 0;
    fclose(f);
    return b;
}

static int cmpstr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The .json files in dir, sorted (names malloc'd). */
static int list_dir(const char *dir, char ***names) {
    DIR *d = opendir(dir);
    int n = 0;
    *names = NULL;
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".json")) continue;
        *names = realloc(*names, (size_t)(n + 1) * sizeof **names);
        (*names)[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(*names, (size_t)n, sizeof **names, cmpstr);
    return n;
}

static int corpus(char ***names) { return list_dir(CORPUS, names); }

/* ---- keywords compile ---- */

static void test_each_keyword(void) {
    static const char *const ok[] = {
        "{\"type\":\"object\"}",
        "{\"type\":\"array\"}",
        "{\"type\":\"string\"}",
        "{\"type\":\"number\"}",
        "{\"type\":\"integer\"}",
        "{\"type\":\"boolean\"}",
        "{\"type\":\"null\"}",
        "{\"type\":[\"string\",\"integer\"]}",
        "{\"properties\":{\"a\":{}}}",
        "{\"required\":[\"a\"]}",
        "{\"additionalProperties\":false}",
        "{\"additionalProperties\":{\"type\":\"integer\"}}",
        "{\"items\":{\"type\":\"string\"}}",
        "{\"prefixItems\":[{\"type\":\"string\"}]}",
        "{\"minItems\":1}",
        "{\"maxItems\":2}",
        "{\"enum\":[1,\"a\",null]}",
        "{\"const\":{\"a\":1}}",
        "{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}",
        "{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}",
        "{\"allOf\":[{\"type\":\"integer\"},{\"minimum\":2}]}",
        "{\"$defs\":{\"a\":{\"type\":\"string\"}},\"$ref\":\"#/$defs/a\"}",
        "{\"definitions\":{\"a\":{\"type\":\"string\"}},\"$ref\":\"#/definitions/a\"}",
        "{\"minLength\":1}",
        "{\"maxLength\":3}",
        "{\"minimum\":-3}",
        "{\"maximum\":9}",
        "{\"exclusiveMinimum\":0}",
        "{\"exclusiveMaximum\":0}",
        "{\"pattern\":\"^a+$\"}",
        "{\"format\":\"date\"}",
        "{\"format\":\"time\"}",
        "{\"format\":\"date-time\"}",
        "{\"format\":\"uuid\"}",
        "{\"format\":\"email\"}",
        "true",
        "{}",
        "{\"title\":\"t\",\"description\":\"d\",\"$schema\":\"x\",\"$id\":\"y\",\"examples\":[1],\"default\":1}",
        "{\"uniqueItems\":false}"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char err[LM_ERRLEN];
        gref g;
        int rc = load(&g, ok[i], err);
        CHECKF(rc == 0, "%s: %s", ok[i], err);
        for (int k = 0; k < 20; k++) {
            char *s = gref_sample(&g, 6);
            cJSON *j = cJSON_ParseWithOpts(s, NULL, true);
            bool good = j && accepts(&g, s);
            cJSON_Delete(j);
            if (!good) fprintf(stderr, "  %s: sample %s\n", ok[i], s);
            free(s);
            CHECK(good);
        }
        gref_free(&g);
    }
}

/* ---- refusals name the keyword and the place ---- */

static void test_refusals(void) {
    static const struct {
        const char *schema, *what, *where;
    } bad[] = {
        {"{\"not\":{}}", "\"not\"", "#/not"},
        /* no finite text: a required property that is the object itself */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}},\"required\":[\"a\"]}", "no finite JSON text",
         ""},
        {"{\"properties\":{\"a\":{\"multipleOf\":2}}}", "\"multipleOf\"", "#/properties/a/multipleOf"},
        {"{\"items\":{\"patternProperties\":{}}}", "\"patternProperties\"", "#/items/patternProperties"},
        {"{\"if\":{},\"then\":{}}", "\"if\"", "#/if"},
        {"{\"type\":\"array\",\"contains\":{}}", "\"contains\"", "#/contains"},
        {"{\"minProperties\":1}", "\"minProperties\"", "#/minProperties"},
        {"{\"dependentRequired\":{}}", "\"dependentRequired\"", "#/dependentRequired"},
        {"{\"uniqueItems\":true}", "uniqueItems", "#"},
        {"{\"properties\":{\"d\":{\"format\":\"hostname\"}}}", "hostname", "#/properties/d/format"},
        {"{\"pattern\":\"(?=a)b\"}", "(?=", "#/pattern"},
        {"{\"pattern\":\"\\\\bword\"}", "\\b", "#/pattern"},
        {"{\"pattern\":\"(a)\\\\1\"}", "\\1", "#/pattern"},
        {"{\"pattern\":\"a^b\"}", "^", "#/pattern"},
        {"{\"pattern\":\"a$b\"}", "$", "#/pattern"},
        {"{\"pattern\":\"a++\"}", "possessive", "#/pattern"},
        {"{\"pattern\":\"[[:alpha:]]\"}", "POSIX", "#/pattern"},
        {"{\"pattern\":\"(ab\"}", "unclosed", "#/pattern"},
        {"{\"pattern\":\"*a\"}", "nothing to repeat", "#/pattern"},
        {"{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", "oneOf", "#/oneOf/0"},
        {"{\"oneOf\":[{\"type\":\"object\"},{\"type\":\"object\",\"required\":[\"a\"]}]}", "overlap", "#/oneOf"},
        {"{\"$ref\":\"http://example.com/s.json\"}", "not local", "#"},
        {"{\"$ref\":\"#/$defs/missing\"}", "points at nothing", "#"},
        {"{\"$defs\":{\"a\":{\"not\":1}},\"items\":{\"$ref\":\"#/$defs/a\"}}", "\"not\"", "#/$defs/a/not"},
        {"{\"type\":\"fraction\"}", "fraction", "#"},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "minItems", "#"},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "minimum above maximum", "#"},
        {"{\"enum\":[1],\"minLength\":2}", "minLength", "#"},
        {"{\"type\":\"string\",\"enum\":[1,2]}", "nothing fits", "#"},
        {"{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":3}", "only one of", "#"},
        {"{\"allOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}", "do not intersect", "#"},
        {"{\"allOf\":[{\"pattern\":\"a\"},{\"pattern\":\"b\"}]}", "\"pattern\"", "#"},
        {"{\"required\":[\"x\"],\"additionalProperties\":false}", "\"x\"", "#"},
        {"false", "false", "#"},
        {"{\"anyOf\":[]}", "anyOf", "#"},
        {"{\"minLength\":100000}", "minLength", "#"},
        {"{\"type\":", "not valid JSON", ""},
        {"{} {}", "after the JSON", ""},
        {"[1]", "must be an object or a boolean", "#"},
        {"{\"enum\":[\"\xff\"]}", "UTF-8", ""},
        {"{\"const\":\"\\ud800\"}", "not valid JSON", ""},
        {"{\"properties\":{\"a\\u0000b\":{}}}", "u0000", ""},
        {"{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}", "left recursion", "#/anyOf/0"},
        {"{\"allOf\":[{\"additionalProperties\":false},{\"properties\":{\"a\":{}}}]}", "additionalProperties", "#"},
        {"{\"allOf\":[{\"properties\":{\"b\":{}}}],\"additionalProperties\":false,\"properties\":{\"a\":{}}}",
         "additionalProperties", "#"},
        {"{\"$defs\":{\"b\":{\"properties\":{\"x\":{}},\"additionalProperties\":false}},\"$ref\":\"#/$defs/b\","
         "\"properties\":{\"y\":{}}}",
         "additionalProperties", "#"},
        {"{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}",
         "left recursion", "#/$defs/b"},
        {"{\"$defs\":{\"a\":{\"allOf\":[{\"$ref\":\"#/$defs/a\"},{\"$ref\":\"#/$defs/a\"}]}},\"$ref\":\"#/$defs/a\"}",
         "allOf", "#/$defs/a"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[LM_ERRLEN];
        char *t = compile(bad[i].schema, err);
        CHECKF(!t, "%s compiled:\n%s", bad[i].schema, t);
        CHECKF(strstr(err, bad[i].what), "%s: \"%s\" lacks %s", bad[i].schema, err, bad[i].what);
        if (*bad[i].where) {
            char at[128];
            snprintf(at, sizeof at, "at %s", bad[i].where);
            CHECKF(strstr(err, at), "%s: \"%s\" lacks \"%s\"", bad[i].schema, err, at);
        }
    }
    /* Nesting past the bound is refused, not a stack overflow. */
    strbuf deep = {0};
    for (int i = 0; i < 200; i++) strbuf_puts(&deep, "{\"items\":");
    strbuf_puts(&deep, "{}");
    for (int i = 0; i < 200; i++) strbuf_puts(&deep, "}");
    char err[LM_ERRLEN];
    char *t = compile(deep.p, err);
    strbuf_free(&deep);
    CHECK(!t && strstr(err, "deeper"));
}

/* ---- integer ranges are exact ---- */

static void check_range(const char *schema, bool hl, long lo, bool hh, long hi) {
    char err[LM_ERRLEN];
    gref g;
    CHECKF(load(&g, schema, err) == 0, "%s: %s", schema, err);
    for (long v = -1300; v <= 1300; v++) {
        char s[32];
        snprintf(s, sizeof s, "%ld", v);
        bool want = (!hl || v >= lo) && (!hh || v <= hi);
        bool got = accepts(&g, s);
        if (got != want) fprintf(stderr, "  %s: %ld %s\n", schema, v, got ? "accepted" : "rejected");
        CHECK(got == want);
    }
    /* Far values: accepted only when the side is unbounded. */
    CHECK(accepts(&g, "123456789012") == !hh);
    CHECK(accepts(&g, "-123456789012") == !hl);
    CHECK(!accepts(&g, "007") && !accepts(&g, "-0") && !accepts(&g, "+1") && !accepts(&g, "1.0"));
    gref_free(&g);
}

static void test_integer_ranges(void) {
    uint64_t r = 12345;
    for (int i = 0; i < 40 && !test_cur_failed_; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        long a = (long)(r >> 33) % 2400 - 1200;
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        long b = (long)(r >> 33) % 2400 - 1200;
        if (i % 5 == 0) b = a + (long)(r >> 60); /* narrow ranges */
        if (a > b) {
            long t = a;
            a = b;
            b = t;
        }
        int mode = i % 4; /* both bounds, min only, max only, exclusive */
        char s[160];
        if (mode == 0 || mode == 3) {
            snprintf(s, sizeof s,
                     mode ? "{\"type\":\"integer\",\"exclusiveMinimum\":%ld,\"exclusiveMaximum\":%ld}"
                          : "{\"type\":\"integer\",\"minimum\":%ld,\"maximum\":%ld}",
                     a, b);
            if (mode == 3 && b - a < 2) continue;
            check_range(s, true, mode ? a + 1 : a, true, mode ? b - 1 : b);
        } else if (mode == 1) {
            snprintf(s, sizeof s, "{\"type\":\"integer\",\"minimum\":%ld}", a);
            check_range(s, true, a, false, 0);
        } else {
            snprintf(s, sizeof s, "{\"type\":\"integer\",\"maximum\":%ld}", b);
            check_range(s, false, 0, true, b);
        }
    }
    check_range("{\"type\":\"integer\",\"minimum\":0,\"maximum\":0}", true, 0, true, 0);
    check_range("{\"type\":\"integer\",\"minimum\":-1,\"maximum\":1}", true, -1, true, 1);
    check_range("{\"type\":\"integer\",\"minimum\":1.5,\"maximum\":9.5}", true, 2, true, 9);
    check_range("{\"type\":\"integer\",\"minimum\":10,\"maximum\":1000}", true, 10, true, 1000);
    check_range("{\"type\":\"integer\",\"minimum\":-999,\"maximum\":-100}", true, -999, true, -100);
    check_range("{\"type\":\"integer\",\"minimum\":0}", true, 0, false, 0);
    check_range("{\"minimum\":3,\"exclusiveMinimum\":true}", true, 4, false, 0);
}

/* Bounded numbers: everything accepted is in range (checked on a grid of
 * decimals); the integers in range and the decimals whose unit interval
 * is inside are accepted. */
static void test_number_ranges(void) {
    static const struct {
        const char *schema;
        double lo, hi;
        bool xlo, xhi;
    } cases[] = {
        {"{\"type\":\"number\",\"minimum\":-3,\"maximum\":5}", -3, 5, false, false},
        {"{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":7.25}", -2.5, 7.25, false, false},
        {"{\"type\":\"number\",\"exclusiveMinimum\":-4,\"exclusiveMaximum\":4}", -4, 4, true, true},
        {"{\"type\":\"number\",\"minimum\":0}", 0, 1e300, false, false},
        {"{\"type\":\"number\",\"maximum\":-1}", -1e300, -1, false, false},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1}", 0, 1, true, false},
        {"{\"type\":\"number\",\"minimum\":-10,\"maximum\":-6}", -10, -6, false, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[LM_ERRLEN];
        gref g;
        CHECKF(load(&g, cases[i].schema, err) == 0, "%s: %s", cases[i].schema, err);
        double lo = cases[i].lo, hi = cases[i].hi;
        for (int k = -48; k <= 48; k++) {
            static const char *const frac[] = {"", ".0", ".25", ".5", ".999"};
            for (int f = 0; f < 5; f++) {
                char t[32];
                int whole = k / 2 < 0 ? -(k / 2) : k / 2;
                bool neg = k < 0;
                snprintf(t, sizeof t, "%s%d%s", neg ? "-" : "", whole, frac[f]);
                double v = atof(t);
                bool in = (cases[i].xlo ? v > lo : v >= lo) && (cases[i].xhi ? v < hi : v <= hi);
                bool got = accepts(&g, t);
                if (got && !in) fprintf(stderr, "  %s: %s accepted\n", cases[i].schema, t);
                CHECK(!got || in);
                /* complete where promised: integers, and intervals inside */
                double base = neg ? -(double)whole : whole;
                bool whole_in = f == 0 ? in
                    : neg
                    ? (base - 1 > lo || (!cases[i].xlo && base - 1 >= lo)) && (cases[i].xhi ? base < hi : base <= hi)
                    : (cases[i].xlo ? base > lo : base >= lo) && base + 1 <= hi - (cases[i].xhi ? 1e-9 : 0);
                if (whole_in && !got && !(neg && whole == 0))
                    fprintf(stderr, "  %s: %s rejected\n", cases[i].schema, t);
                CHECK(got || !whole_in || (neg && whole == 0) || (f == 0 && !in));
            }
        }
        gref_free(&g);
    }
}

/* ---- strings: exactly the JSON strings ---- */

static void test_strings(void) {
    char err[LM_ERRLEN];
    gref g;
    CHECKF(load(&g, "{\"type\":\"string\"}", err) == 0, "%s", err);
    static const char *const yes[] = {
        "\"\"",        "\"a\\\"b\"",         "\"\\\\\"",           "\"\\/\\b\\f\\n\\r\\t\"",
        "\"\\u00e9\"", "\"\\ud83d\\ude00\"", "\"\\uD83D\\uDE00\"", "\"é中😀\"",
        "\"\\u0000\""};
    static const char *const no[] = {"\"\\ud800\"", "\"\\ude00\"", "\"\\ud83dx\"", "\"\\x41\"", "\"\\u12\"", "\"a\nb\"",
                                     "\"\t\"",      "\"a",         "a\"",          "\"\\\"",    "\"a\"b\""};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) CHECKF(accepts(&g, yes[i]), "%s rejected", yes[i]);
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) CHECKF(!accepts(&g, no[i]), "%s accepted", no[i]);
    for (int k = 0; k < 300; k++) { /* every drawn string decodes */
        char *s = gref_sample(&g, 8);
        cJSON *j = cJSON_ParseWithOpts(s, NULL, true);
        bool good = cJSON_IsString(j);
        cJSON_Delete(j);
        CHECKF(good, "%s", s);
        free(s);
    }
    gref_free(&g);
    /* Lengths count characters: an escape or a multi-byte character is one. */
    CHECKF(load(&g, "{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", err) == 0, "%s", err);
    CHECK(accepts(&g, "\"ab\"") && accepts(&g, "\"\\n中😀\"") && accepts(&g, "\"\\ud83d\\ude00a\""));
    CHECK(!accepts(&g, "\"a\"") && !accepts(&g, "\"abcd\"") && !accepts(&g, "\"\\n\""));
    gref_free(&g);
}

/* ---- whitespace between tokens is bounded ---- */

static void test_whitespace(void) {
    char err[LM_ERRLEN];
    gref g;
    CHECKF(load(&g, "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\"}}}", err) == 0, "%s", err);
    CHECK(accepts(&g, "{\"a\":[1,2]}"));
    CHECK(accepts(&g, "{ \"a\" : [ 1 , 2 ] }"));
    CHECK(accepts(&g, "{\n  \"a\": [\n    1,\n    2\n  ]\n}"));
    CHECK(!accepts(&g, "{  \"a\":[]}"));                       /* two blanks */
    CHECK(!accepts(&g, "{\n                      \"a\":[]}")); /* newline and 22 blanks */
    CHECK(!accepts(&g, " {\"a\":[]}") && !accepts(&g, "{\"a\":[]} "));
    gref_free(&g);
}

/* ---- objects: order, optional members, extra keys ---- */

static void test_objects(void) {
    char err[LM_ERRLEN];
    gref g;
    CHECKF(load(&g,
                "{\"properties\":{\"id\":{\"type\":\"integer\"},\"name\":{\"type\":\"string\"}},"
                "\"additionalProperties\":{\"type\":\"boolean\"}}",
                err) == 0,
           "%s", err);
    CHECK(accepts(&g, "{}") && accepts(&g, "{\"id\":1}") && accepts(&g, "{\"name\":\"x\"}"));
    CHECK(accepts(&g, "{\"id\":1,\"x\":true,\"i\":false,\"idx\":true,\"nam\":false,\"names\":true}"));
    CHECK(accepts(&g, "{\"x\":true}"));
    CHECK(!accepts(&g, "{\"id\":1,\"id\":true}")); /* a declared name as an extra key */
    CHECK(!accepts(&g, "{\"x\":true,\"name\":true}"));
    CHECK(!accepts(&g, "{\"\\u0069d\":true}"));       /* escapes could spell one */
    CHECK(!accepts(&g, "{\"name\":\"x\",\"id\":1}")); /* the schema's order */
    CHECK(!accepts(&g, "{,\"id\":1}") && !accepts(&g, "{\"id\":1,}"));
    gref_free(&g);
    /* Patterns search unless anchored; JSON escapes in what they match. */
    CHECKF(load(&g, "{\"pattern\":\"a\\\"\\\\\\\\\\n\"}", err) == 0, "%s", err);
    CHECK(accepts(&g, "\"xa\\\"\\\\\\ny\"") && !accepts(&g, "\"a\\\"\\\\n\""));
    gref_free(&g);
    CHECKF(load(&g, "{\"pattern\":\"^[^a]$\"}", err) == 0, "%s", err);
    CHECK(accepts(&g, "\"b\"") && accepts(&g, "\"\\\"\"") && accepts(&g, "\"\\\\\"") && !accepts(&g, "\"a\""));
    gref_free(&g);
}

/* ---- any object ---- */

static void test_any_object(void) {
    char *t = json_schema_any_object_gbnf();
    CHECK(t);
    gref g;
    int rc = gref_parse(&g, t);
    lm_free(t);
    CHECKF(rc == 0, "%s", g.err);
    for (int k = 0; k < 100; k++) {
        char *s = gref_sample(&g, 6);
        cJSON *j = cJSON_ParseWithOpts(s, NULL, true);
        bool good = cJSON_IsObject(j) && accepts(&g, s);
        cJSON_Delete(j);
        CHECKF(good, "%s", s);
        free(s);
    }
    CHECK(!accepts(&g, "[]") && !accepts(&g, "1") && accepts(&g, "{\"a\":[1,{\"b\":null}]}"));
    gref_free(&g);
}

/* ---- the corpus ---- */

static void test_corpus(void) {
    char **names;
    int n = corpus(&names);
    CHECKF(n >= 50, "only %d schemas in " CORPUS, n);
    int samples = 0;
    for (int i = 0; i < n; i++) {
        char path[512];
        snprintf(path, sizeof path, CORPUS "/%s", names[i]);
        char *text = read_all(path);
        cJSON *doc = text ? cJSON_Parse(text) : NULL;
        free(text);
        CHECKF(doc, "%s: not JSON", names[i]);
        char *schema = cJSON_PrintUnformatted(cJSON_GetObjectItem(doc, "schema"));
        char err[LM_ERRLEN];
        gref g;
        int rc = load(&g, schema, err);
        cJSON_free(schema);
        if (rc) fprintf(stderr, "  %s: %s\n", names[i], err);
        CHECK(rc == 0);
        const char *sets[2] = {"valid", "invalid"};
        for (int s = 0; s < 2; s++) {
            const cJSON *it;
            cJSON_ArrayForEach(it, cJSON_GetObjectItem(doc, sets[s])) {
                char *inst = cJSON_PrintUnformatted(it);
                bool ok = accepts(&g, inst) == (s == 0);
                if (!ok)
                    fprintf(stderr, "  %s: %s instance %s %s\n", names[i], sets[s], inst, s ? "accepted" : "rejected");
                cJSON_free(inst);
                CHECK(ok);
            }
        }
        for (int k = 0; k < 40; k++) {
            char *smp = gref_sample(&g, 5 + k % 4);
            cJSON *j = cJSON_ParseWithOpts(smp, NULL, true);
            bool ok = j != NULL && (strlen(smp) > 4000 || accepts(&g, smp));
            if (!ok) fprintf(stderr, "  %s: sample %s\n", names[i], smp);
            cJSON_Delete(j);
            free(smp);
            CHECK(ok);
            samples++;
        }
        gref_free(&g);
        cJSON_Delete(doc);
        free(names[i]);
    }
    free(names);
    printf("NOTE %d corpus schemas, %d random-walk samples parsed\n", n, samples);
}

/* ---- viable prefixes (for outputs a token limit cut short) ---- */

static void test_prefixes(void) {
    char err[LM_ERRLEN];
    gref g;
    const char *schema = "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":10,"
                         "\"maximum\":20},\"s\":{\"enum\":[\"ab\",\"cd\"]}},\"required\":[\"n\",\"s\"]}";
    CHECKF(load(&g, schema, err) == 0, "%s", err);
    const char *full = "{\"n\":15,\"s\":\"cd\"}";
    for (size_t k = 0; k <= strlen(full); k++) CHECKF(gref_accepts_prefix(&g, full, k), "%.*s", (int)k, full);
    static const char *const no[] = {
        "[", "{\"s\"", "{\"n\":3", "{\"n\":21", "{\"n\":15,\"s\":\"ac", "{\"n\":15,\"s\":\"cd\"}x", "{\"n\":15}"};
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        bool bad = !gref_accepts_prefix(&g, no[i], strlen(no[i]));
        CHECKF(bad, "%s taken as a prefix", no[i]);
    }
    CHECK(gref_accepts_prefix(&g, "{\"n\":15", 7) && !gref_accepts(&g, "{\"n\":15", 7));
    gref_free(&g);
    /* Every prefix of every drawn sample, for a recursive schema. */
    CHECKF(load(&g,
                "{\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"string\"},"
                "\"k\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/t\"}}}}},\"$ref\":\"#/$defs/t\"}",
                err) == 0,
           "%s", err);
    for (int r = 0; r < 20; r++) {
        char *smp = gref_sample(&g, 5);
        size_t n = strlen(smp);
        for (size_t k = 0; k <= n; k++) {
            bool ok = gref_accepts_prefix(&g, smp, k);
            if (!ok) fprintf(stderr, "  prefix %zu of %s\n", k, smp);
            if (!ok) free(smp);
            CHECK(ok);
        }
        free(smp);
    }
    gref_free(&g);
}

/* ---- the grammar engine agrees with the reference ---- */

/* A vocabulary of the 256 single bytes and one end-of-generation token. */
static lm_gvocab *byte_vocab(void) {
    static char bytes[256];
    const char *ptr[257];
    int lens[257];
    bool eog[257];
    for (int t = 0; t < 257; t++) {
        if (t < 256) bytes[t] = (char)t;
        ptr[t] = t < 256 ? &bytes[t] : "";
        lens[t] = t < 256 ? 1 : 0;
        eog[t] = t == 256;
    }
    char err[LM_ERRLEN];
    return grammar_vocab_from_bytes(257, ptr, lens, eog, err, sizeof err);
}

/* The engine's verdict on text: 2 complete, 1 a viable prefix, 0 neither. */
static int engine_verdict(lm_gmatch *m, const char *text, size_t n) {
    gmatch_reset(m);
    if (gmatch_accept_bytes(m, text, n) != 0) return 0;
    return gmatch_can_end(m) ? 2 : 1;
}

static int ref_verdict(gref *g, const char *text, size_t n) {
    return gref_accepts(g, text, n) ? 2 : gref_accepts_prefix(g, text, n) ? 1 : 0;
}

static void test_engine_agrees(void) {
    char **names;
    int n = corpus(&names);
    lm_gvocab *v = byte_vocab();
    CHECK(v);
    uint32_t *allow = calloc((257 + 31) / 32, sizeof *allow);
    long checks = 0;
    uint64_t rng = 99;
    for (int i = 0; i < n && !test_cur_failed_; i++) {
        char path[512];
        snprintf(path, sizeof path, CORPUS "/%s", names[i]);
        char *text = read_all(path);
        cJSON *doc = cJSON_Parse(text);
        free(text);
        char *schema = cJSON_PrintUnformatted(cJSON_GetObjectItem(doc, "schema"));
        char err[LM_ERRLEN];
        char *gbnf = compile(schema, err);
        cJSON_free(schema);
        CHECKF(gbnf, "%s: %s", names[i], err);
        lm_grammar *gr = grammar_parse(gbnf, strlen(gbnf), NULL, err, sizeof err);
        CHECKF(gr, "%s: the engine refuses the grammar: %s\n%s", names[i], err, gbnf);
        gref g;
        CHECK(gref_parse(&g, gbnf) == 0);
        lm_free(gbnf);
        lm_gmatch *m = gmatch_new(gr, v, err, sizeof err);
        CHECKF(m, "%s", err);
        const char *sets[2] = {"valid", "invalid"};
        for (int s = 0; s < 2; s++) {
            const cJSON *it;
            cJSON_ArrayForEach(it, cJSON_GetObjectItem(doc, sets[s])) {
                char *inst = cJSON_PrintUnformatted(it);
                int e = engine_verdict(m, inst, strlen(inst));
                bool ok = s == 0 ? e == 2 : e != 2;
                if (!ok) fprintf(stderr, "  %s: engine: %s instance %s: %d\n", names[i], sets[s], inst, e);
                cJSON_free(inst);
                CHECK(ok);
            }
        }
        for (int k = 0; k < 12 && !test_cur_failed_; k++) {
            char *smp = gref_sample(&g, 5 + k % 3);
            size_t len = strlen(smp);
            /* the sample, a random cut of it, and a random one-byte change */
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t cut = len ? (size_t)(rng >> 33) % (len + 1) : 0;
            char *mut = malloc(len + 2);
            memcpy(mut, smp, len + 1);
            size_t at = len ? (size_t)(rng >> 20) % len : 0;
            static const char pool[] = "{}[]\",:0123456789-.eE \\ntfaxu\n";
            if (len) mut[at] = pool[(rng >> 40) % (sizeof pool - 1)];
            const char *texts[3] = {smp, smp, mut};
            size_t lens[3] = {len, cut, len};
            for (int t = 0; t < 3; t++) {
                int e = engine_verdict(m, texts[t], lens[t]), r = ref_verdict(&g, texts[t], lens[t]);
                if (e != r)
                    fprintf(stderr, "  %s: engine %d, reference %d on %.*s\n", names[i], e, r, (int)lens[t], texts[t]);
                checks++;
                if (e != r) {
                    free(smp);
                    free(mut);
                }
                CHECK(e == r);
            }
            /* the mask at the cut: byte b allowed iff the reference takes it */
            if (k == 0) {
                gmatch_reset(m);
                CHECK(gmatch_accept_bytes(m, smp, cut) == 0);
                gmatch_mask(m, allow);
                char *buf = malloc(cut + 2);
                memcpy(buf, smp, cut);
                for (int b = 1; b < 256; b++) {
                    buf[cut] = (char)b;
                    bool want = gref_accepts_prefix(&g, buf, cut + 1);
                    /* a lone lead byte of a multi-byte character: the
                     * reference needs the whole character */
                    if (b >= 0xC0) continue;
                    bool got = (allow[b / 32] >> (b % 32)) & 1;
                    if (got != want)
                        fprintf(stderr, "  %s: mask byte 0x%02x after %.*s: %d\n", names[i], b, (int)cut, smp, got);
                    CHECK(got == want);
                }
                bool eog = (allow[256 / 32] >> (256 % 32)) & 1;
                CHECK(eog == gref_accepts(&g, smp, cut));
                free(buf);
                checks += 256;
            }
            free(smp);
            free(mut);
        }
        gmatch_free(m);
        grammar_free(gr);
        gref_free(&g);
        cJSON_Delete(doc);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    free(allow);
    grammar_vocab_free(v);
    printf("NOTE the engine and the reference agree on %ld texts and mask bits\n", checks);
}

/* ---- allocation failures: NULL with a message, never a crash ---- */

static void test_alloc_failures(void) {
    char *text = read_all(CORPUS "/72_pydantic_style.json");
    CHECK(text);
    cJSON *doc = cJSON_Parse(text);
    free(text);
    char *schema = cJSON_PrintUnformatted(cJSON_GetObjectItem(doc, "schema"));
    cJSON_Delete(doc);
    char err[LM_ERRLEN];
    char *want = compile(schema, err);
    CHECK(want);
    bool done = false;
    for (long k = 0; k < 2000 && !done; k++) { /* the k-th allocation fails */
        lm_alloc_fail_after(k);
        char *t = compile(schema, err);
        lm_alloc_fail_after(-1);
        if (t) {
            CHECK(!strcmp(t, want));
            lm_free(t);
            done = true;
        } else {
            CHECKF(strstr(err, "memory"), "%s", err);
        }
    }
    CHECK(done);
    lm_free(want);
    cJSON_free(schema);
}

/* --samples N [DIR]: one JSON line per schema file of DIR (default: the
 * corpus) with N random-walk texts, or the compiler's error. */
static int print_samples(int count, const char *dir) {
    char **names;
    int n = list_dir(dir, &names);
    for (int i = 0; i < n; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        char *text = read_all(path);
        cJSON *doc = text ? cJSON_Parse(text) : NULL;
        free(text);
        char *schema = doc ? cJSON_PrintUnformatted(cJSON_GetObjectItem(doc, "schema")) : NULL;
        char err[LM_ERRLEN];
        gref g;
        cJSON *line = cJSON_CreateObject();
        cJSON_AddStringToObject(line, "file", names[i]);
        cJSON *arr = cJSON_AddArrayToObject(line, "samples");
        if (schema && load(&g, schema, err) == 0) {
            g.rng ^= (uint64_t)(i + 1) * 0x2545F4914F6CDD1Dull;
            for (int k = 0; k < count; k++) {
                char *s = gref_sample(&g, 5 + k % 4);
                cJSON_AddItemToArray(arr, cJSON_CreateString(s));
                free(s);
            }
            gref_free(&g);
        } else {
            cJSON_AddStringToObject(line, "error", schema ? err : "unreadable");
        }
        char *out = cJSON_PrintUnformatted(line);
        puts(out);
        cJSON_free(out);
        cJSON_Delete(line);
        cJSON_free(schema);
        cJSON_Delete(doc);
        free(names[i]);
    }
    free(names);
    return 0;
}

/* --check CORPUS_FILE TEXT_FILE: prints "complete" when the text is a string
 * of the schema's grammar, "prefix" when only the beginning of one, else
 * "invalid" (for tests/e2e_schema.py, on outputs a token limit cut). */
static int check_text(const char *corpus_file, const char *text_file) {
    char *text = read_all(corpus_file), *out = read_all(text_file);
    cJSON *doc = text ? cJSON_Parse(text) : NULL;
    char *schema = doc ? cJSON_PrintUnformatted(cJSON_GetObjectItem(doc, "schema")) : NULL;
    char err[LM_ERRLEN];
    gref g;
    int rc = 1;
    if (!schema || !out) {
        fprintf(stderr, "cannot read %s or %s\n", corpus_file, text_file);
    } else if (load(&g, schema, err)) {
        fprintf(stderr, "%s\n", err);
    } else {
        size_t n = strlen(out);
        puts(gref_accepts(&g, out, n) ? "complete" : gref_accepts_prefix(&g, out, n) ? "prefix" : "invalid");
        gref_free(&g);
        rc = 0;
    }
    cJSON_free(schema);
    cJSON_Delete(doc);
    free(text);
    free(out);
    return rc;
}

int main(int argc, char **argv) {
    if ((argc == 3 || argc == 4) && !strcmp(argv[1], "--samples"))
        return print_samples(atoi(argv[2]), argc == 4 ? argv[3] : CORPUS);
    if (argc == 4 && !strcmp(argv[1], "--check")) return check_text(argv[2], argv[3]);
    TEST_RUN(test_each_keyword);
    TEST_RUN(test_refusals);
    TEST_RUN(test_integer_ranges);
    TEST_RUN(test_number_ranges);
    TEST_RUN(test_strings);
    TEST_RUN(test_whitespace);
    TEST_RUN(test_objects);
    TEST_RUN(test_any_object);
    TEST_RUN(test_corpus);
    TEST_RUN(test_prefixes);
    TEST_RUN(test_engine_agrees);
    TEST_RUN(test_alloc_failures);
    return TEST_DONE();
}
