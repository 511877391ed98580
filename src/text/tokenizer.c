/*
 * tokenizer.c - text <-> token ids from a GGUF file's tokenizer metadata.
 *
 * What is built at load time (all copied out of the GGUF mapping):
 *   - the vocab: one pool of NUL-terminated token texts with an offset table,
 *     the per-token type (tokenizer.ggml.token_type) and, for the "llama"
 *     family, the merge scores; an open-addressing hash maps text -> id;
 *   - for "gpt2": the merges, hashed by the pair of token ids they join, each
 *     with its rank and the id of the joined token; GPT-2's byte <-> unicode
 *     tables; the pre-tokenizer regexes (PCRE2, UTF + UCP, JIT when present);
 *   - the special-token matcher: the first bytes and the distinct lengths of
 *     the tokens that are matched verbatim in the input (user-defined tokens
 *     always, control and unknown tokens only when parse_special is set);
 *   - BOS/EOS/EOT/EOM and a per-token end-of-generation flag.
 *
 * Encoding ("llama", SentencePiece BPE): ' ' becomes U+2581, a U+2581 is put
 * in front of the text (add_space_prefix) at the start and after every
 * special token, the text is cut into UTF-8 characters (an invalid byte is a
 * character of its own), and adjacent symbols are merged greedily: always
 * the pair whose joined text is a vocab token with the highest score, ties to
 * the leftmost. Leftover symbols that are not tokens fall back to <0xXX> byte
 * tokens (or to the unknown token when the vocab has no byte tokens).
 *
 * Encoding ("gpt2", byte-level BPE): the pre-tokenizer regexes split the text
 * (each regex splits every piece of the previous one, keeping the text
 * between matches as pieces too), every byte of a piece starts as the token
 * of its GPT-2 unicode stand-in, and pairs merge lowest rank first, ties to
 * the leftmost. Both families use one binary heap of candidate pairs;
 * a popped pair whose symbols changed since it was pushed is stale and
 * skipped (symbols only grow, so "both alive and the lengths still add up" is
 * the check). Work is O(n log n) in the length of a piece.
 *
 * Special tokens are matched leftmost-longest (as Hugging Face's added-token
 * matcher does). Metadata problems (missing or mistyped arrays, lengths that
 * disagree, ids out of range, unknown tokenizer model or pre-tokenizer) make
 * tok_load fail with a message; nothing is trusted before it is checked.
 *
 * Decisions worth knowing:
 *   - tokenizer.ggml.pre missing -> the GPT-2 pattern (what byte-level BPE
 *     used before the key existed); present but unknown -> tok_load refuses
 *     by name, since a wrong split silently degrades every prompt.
 *   - A special-id key holding -1 (or 0xFFFFFFFF) means "none"; any other
 *     value outside the vocab is an error.
 *   - End of generation: control tokens with one of EOG_TEXTS, and the
 *     EOS/EOT/EOM ids; for gpt-oss's vocabulary (<|return|> and <|call|>
 *     present), not <|end|>, and its framing tokens are user-defined
 *     (harmony_specials), as llama.cpp has it.
 *   - SPM merges only produce normal and user-defined tokens (as
 *     SentencePiece does): control, unknown, unused and byte tokens are never
 *     formed from text.
 *
 * Bounds: at most TOK_MAX_VOCAB tokens and merges, token texts up to 64 KiB
 * in all 4 GiB; encode works on texts below 512 MiB.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "text/tokenizer.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "text/wpm.h"
#include "base/utf8.h"
#include "base/util.h"

#define TOK_MAX_VOCAB (1 << 24)        /* ranks and ids stay exact in a float */
#define TOK_MAX_TEXT ((size_t)1 << 29) /* encode refuses longer input */
#define TOK_MAX_PIECE 65536            /* longest token text accepted */
#define MAX_RE 6                       /* regexes per pre-tokenizer */

/* What the loading helpers return besides 0 and -1 (malformed metadata), so
 * tok_load_status can tell the caller what kind of failure it was. */
enum { TOK_EUNSUPPORTED = -2, TOK_ENOMEM = -3 };

/* tokenizer.ggml.token_type values. */
enum { TT_UNDEF = 0, TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

/* Per-token flags. */
enum {
    F_MERGE = 1,     /* may be produced from text by merging (normal, user-defined) */
    F_EOG = 2,       /* ends generation */
    F_SP_ALWAYS = 4, /* matched verbatim in the input always (user-defined) */
    F_SP_PARSE = 8,  /* matched verbatim only with parse_special (control, unknown) */
};

enum { FAM_SPM, FAM_BPE, FAM_WPM };

typedef struct {
    int32_t left, right; /* token ids joined; left == -1 marks an empty slot */
    int32_t rank;        /* position in tokenizer.ggml.merges (lower merges first) */
    int32_t result;      /* id of the joined token */
} merge_ent;

struct lm_tokenizer {
    int family;
    int32_t n_vocab;
    char *pool;     /* token texts, each NUL-terminated */
    uint32_t *off;  /* (n_vocab + 1) start of token i in pool */
    float *score;   /* (n_vocab) SPM merge scores; NULL for BPE */
    uint8_t *type;  /* (n_vocab) TT_* */
    uint8_t *flag;  /* (n_vocab) F_* */
    int32_t *vslot; /* (vmask + 1) vocab hash: token id or -1 */
    uint64_t vmask;
    merge_ent *mslot; /* (mmask + 1) merge hash, BPE only */
    uint64_t mmask;
    int32_t byte_tok[256]; /* SPM: <0xXX>; BPE: the token of the byte's stand-in; -1 none */
    uint32_t b2u[256];     /* BPE byte -> unicode code point */
    int16_t u2b[324];      /* BPE code point -> byte, -1 if not a stand-in */
    int32_t bos, eos, eot, eom, unk;
    int32_t sep;    /* WPM: [SEP], added after the text with the BOS ([CLS]); else -1 */
    int max_piece;  /* WPM: the longest token text, in bytes */
    bool wpm_lower; /* WPM: tokenizer.ggml.normalizer.lowercase (default true) */
    bool wpm_strip; /* WPM: ...normalizer.strip_accents (default: as lowercase) */
    bool add_bos, add_eos, add_space_prefix, ignore_merges;
    uint8_t sp_first[256]; /* F_SP_* bits of tokens starting with this byte */
    uint32_t *sp_len;      /* (n_sp_len) distinct special-token lengths, descending */
    int n_sp_len;
    pcre2_code *re[MAX_RE];
    int n_re;
    int detok_max; /* detok_push never writes more than this */
};

/* ---- small helpers --------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a, then a final mix */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ULL;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_pair(int32_t a, int32_t b) {
    uint64_t x = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; /* splitmix64 finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static uint64_t pow2_at_least(uint64_t n) {
    uint64_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

static const char *piece_of(const lm_tokenizer *t, int32_t id, size_t *len) {
    *len = t->off[id + 1] - t->off[id] - 1;
    return t->pool + t->off[id];
}

/* Length of the valid UTF-8 sequence at s (n bytes available), 0 if invalid
 * or cut off. */
static inline size_t utf8_valid_len(const unsigned char *s, size_t n) {
    int l = utf8_seq(s, n);
    return l > 0 ? (size_t)l : 0;
}

/* ---- vocab hash ------------------------------------------------------------ */

static int32_t vocab_find(const lm_tokenizer *t, const char *s, size_t n) {
    uint64_t i = hash_bytes(s, n) & t->vmask;
    for (;;) {
        int32_t id = t->vslot[i];
        if (id < 0) return -1;
        size_t len;
        const char *p = piece_of(t, id, &len);
        if (len == n && memcmp(p, s, n) == 0) return id;
        i = (i + 1) & t->vmask;
    }
}

/* Insert every non-empty token; a duplicate text keeps its lowest id. */
static int vocab_build(lm_tokenizer *t) {
    t->vmask = pow2_at_least((uint64_t)t->n_vocab * 2) - 1;
    t->vslot = lm_malloc((t->vmask + 1) * sizeof *t->vslot);
    if (!t->vslot) return -1;
    memset(t->vslot, 0xFF, (t->vmask + 1) * sizeof *t->vslot);
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t len;
        const char *p = piece_of(t, id, &len);
        if (len == 0 || vocab_find(t, p, len) >= 0) continue;
        uint64_t i = hash_bytes(p, len) & t->vmask;
        while (t->vslot[i] >= 0) i = (i + 1) & t->vmask;
        t->vslot[i] = id;
    }
    return 0;
}

/* ---- merges (BPE) ---------------------------------------------------------- */

static const merge_ent *merge_find(const lm_tokenizer *t, int32_t a, int32_t b) {
    uint64_t i = hash_pair(a, b) & t->mmask;
    for (;;) {
        const merge_ent *e = &t->mslot[i];
        if (e->left < 0) return NULL;
        if (e->left == a && e->right == b) return e;
        i = (i + 1) & t->mmask;
    }
}

/* "left right" -> hash entry. Merges whose parts or result are not tokens can
 * never fire and are dropped; a repeated pair keeps its first (best) rank. */
static int merges_build(lm_tokenizer *t, const gguf_arr *arr, char *err, size_t errlen) {
    if (arr->type != GGUF_STRING)
        return lm_err(err, errlen, "tokenizer.ggml.merges must be an array of strings, not %s",
                      gguf_vtype_name(arr->type));
    if (arr->n > TOK_MAX_VOCAB)
        return lm_err(err, errlen, "tokenizer.ggml.merges has %llu entries (limit %d)", (unsigned long long)arr->n,
                      TOK_MAX_VOCAB);
    t->mmask = pow2_at_least(arr->n * 2 + 1) - 1;
    t->mslot = lm_malloc((t->mmask + 1) * sizeof *t->mslot);
    char *cat = lm_malloc(2 * TOK_MAX_PIECE);
    if (!t->mslot || !cat) {
        lm_free(cat);
        return lm_err(err, errlen, "out of memory for %llu merges", (unsigned long long)arr->n), TOK_ENOMEM;
    }
    for (uint64_t i = 0; i <= t->mmask; i++) t->mslot[i].left = -1;
    for (uint64_t r = 0; r < arr->n; r++) {
        gguf_str s;
        if (!gguf_arr_str(arr, r, &s)) {
            lm_free(cat);
            return lm_err(err, errlen, "tokenizer.ggml.merges[%llu] is unreadable", (unsigned long long)r);
        }
        /* split at the first space after the first byte */
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        if (!sp || s.len > 2 * TOK_MAX_PIECE) continue;
        size_t la = (size_t)(sp - s.ptr), lb = s.len - la - 1;
        int32_t a = vocab_find(t, s.ptr, la), b = vocab_find(t, sp + 1, lb);
        if (a < 0 || b < 0) continue;
        memcpy(cat, s.ptr, la);
        memcpy(cat + la, sp + 1, lb);
        int32_t res = vocab_find(t, cat, la + lb);
        if (res < 0 || merge_find(t, a, b)) continue;
        uint64_t h = hash_pair(a, b) & t->mmask;
        while (t->mslot[h].left >= 0) h = (h + 1) & t->mmask;
        t->mslot[h] = (merge_ent){a, b, (int32_t)r, res};
    }
    lm_free(cat);
    return 0;
}

/* GPT-2's table: printable Latin-1 bytes stand for themselves, the other 68
 * bytes map in order to U+0100.. so that every byte is a visible character. */
static void byte_unicode_build(lm_tokenizer *t) {
    uint32_t next = 256;
    for (int i = 0; i < 324; i++) t->u2b[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        t->b2u[b] = printable ? (uint32_t)b : next++;
        t->u2b[t->b2u[b]] = (int16_t)b;
    }
}

/* ---- pre-tokenizers -------------------------------------------------------- */

/* The patterns come from the models' tokenizer.json files. */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3_HEAD "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
#define RE_LLAMA3_TAIL "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3 RE_LLAMA3_HEAD "\\p{N}{1,3}" RE_LLAMA3_TAIL
#define RE_QWEN2 RE_LLAMA3_HEAD "\\p{N}" RE_LLAMA3_TAIL
#define RE_CJK "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
/* DeepSeek LLM's explicit list of cased-letter ranges. */
#define RE_DS_LETTERS                                                                                                  \
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"                                \
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"                             \
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}"                     \
    "\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}"                      \
    "\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}"                                     \
    "\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}"                                     \
    "\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"                             \
    "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}"                            \
    "\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}"                                     \
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}"                             \
    "\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}"                                       \
    "\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}"                             \
    "\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"                                      \
    "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}"                                     \
    "\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}"                                     \
    "\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}"                               \
    "\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+"
#define RE_BLOOM " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{0964}\\x{06D4}\\x{060C})]+"
#define RE_CASED_UP "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define RE_CASED_LO "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define RE_CONTR "(?i:'s|'t|'re|'ve|'m|'ll|'d)"

typedef struct {
    const char *names[24];  /* NULL-terminated */
    const char *re[MAX_RE]; /* NULL-terminated */
    bool ignore_merges;     /* look a whole piece up in the vocab before merging */
    bool add_bos;           /* the family's default for add_bos_token */
} pre_spec;

static const pre_spec PRE_SPECS[] = {
    {{"default",    "gpt-2",      "gpt2",       "phi-2",        "jina-es",         "jina-de", "gigachat",
      "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code", "roberta-bpe",     "a.x-4.0", "mellum",
      "mpt",        "olmo",       "jais",       "trillion",     "granite-docling", "exaone4", NULL},
     {RE_GPT2, NULL},
     false,
     false},
    {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", NULL},
     {RE_LLAMA3, NULL},
     true,
     true},
    {{"dbrx", "smaug-bpe", "chatglm-bpe", "glm4", NULL}, {RE_LLAMA3, NULL}, false, false},
    {{"qwen2", "deepseek-r1-qwen", "kormo", "stablelm2", "megrez", "hunyuan", "grok-2", NULL},
     {RE_QWEN2, NULL},
     false,
     false},
    {{"deepseek-llm", NULL},
     {"[\\r\\n]", RE_DS_LETTERS,
      "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+", "\\s+$", RE_CJK,
      "\\p{N}+"},
     false,
     false},
    {{"deepseek-coder", NULL}, {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK, "\\p{N}", NULL}, false, false},
    {{"deepseek-v3", "hunyuan-dense", NULL},
     {"\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
      "| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      NULL},
     false,
     false},
    {{"falcon", NULL}, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]", NULL}, false, false},
    {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", NULL},
     {"\\p{N}", RE_GPT2, NULL},
     false,
     false},
    {{"bloom", "poro-chat", "gpt3-finnish", NULL}, {RE_BLOOM, NULL}, false, false},
    {{"viking", NULL}, {RE_BLOOM, "\\p{N}", NULL}, false, false},
    {{"tekken", NULL},
     {"[^\\r\\n\\p{L}\\p{N}]?" RE_CASED_UP "*" RE_CASED_LO "+|[^\\r\\n\\p{L}\\p{N}]?" RE_CASED_UP "+" RE_CASED_LO
      "*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      NULL},
     true,
     true},
    {{"gpt-4o", "llama4", NULL},
     {"[^\\r\\n\\p{L}\\p{N}]?" RE_CASED_UP "*" RE_CASED_LO "+" RE_CONTR "?|[^\\r\\n\\p{L}\\p{N}]?" RE_CASED_UP
      "+" RE_CASED_LO "*" RE_CONTR "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*"
      "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      NULL},
     false,
     false},
    {{"seed-coder", NULL},
     {RE_CONTR "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+"
               "|\\s+(?!\\S)|\\s+",
      NULL},
     false,
     false},
    {{"bailingmoe", "bailingmoe2", "llada-moe", NULL},
     {"'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*"
      "|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
      NULL},
     false,
     false},
};

static const pre_spec *pre_lookup(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof PRE_SPECS / sizeof PRE_SPECS[0]; i++)
        for (const char *const *n = PRE_SPECS[i].names; *n; n++)
            if (strlen(*n) == len && memcmp(*n, name, len) == 0) return &PRE_SPECS[i];
    return NULL;
}

static int pre_compile(lm_tokenizer *t, const pre_spec *ps, const char *name, char *err, size_t errlen) {
    t->ignore_merges = ps->ignore_merges;
    for (int i = 0; i < MAX_RE && ps->re[i]; i++) {
        int code;
        PCRE2_SIZE at;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)ps->re[i], PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &at, NULL);
        if (!re) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(code, msg, sizeof msg);
            return lm_err(err, errlen, "pre-tokenizer '%s': regex %d does not compile at %zu: %s", name, i, (size_t)at,
                          (const char *)msg);
        }
        (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter is the fallback */
        t->re[t->n_re++] = re;
    }
    return 0;
}

/* ---- loading --------------------------------------------------------------- */

/* Copy the token texts into one pool. Empty texts are kept (they never match). */
static int load_tokens(lm_tokenizer *t, const gguf_ctx *g, char *err, size_t errlen) {
    gguf_arr arr;
    if (gguf_find_key(g, "tokenizer.ggml.tokens") < 0) return lm_err(err, errlen, "tokenizer.ggml.tokens is missing");
    if (!gguf_get_arr(g, "tokenizer.ggml.tokens", &arr) || arr.type != GGUF_STRING)
        return lm_err(err, errlen, "tokenizer.ggml.tokens must be an array of strings");
    if (arr.n == 0 || arr.n > TOK_MAX_VOCAB)
        return lm_err(err, errlen, "tokenizer.ggml.tokens has %llu entries (need 1..%d)", (unsigned long long)arr.n,
                      TOK_MAX_VOCAB);
    t->n_vocab = (int32_t)arr.n;
    uint64_t total = 0;
    for (uint64_t i = 0; i < arr.n; i++) {
        gguf_str s;
        if (!gguf_arr_str(&arr, i, &s))
            return lm_err(err, errlen, "tokenizer.ggml.tokens[%llu] is unreadable", (unsigned long long)i);
        if (s.len > TOK_MAX_PIECE)
            return lm_err(err, errlen, "tokenizer.ggml.tokens[%llu] is %llu bytes long (limit %d)",
                          (unsigned long long)i, (unsigned long long)s.len, TOK_MAX_PIECE);
        total += s.len + 1;
    }
    if (total >= UINT32_MAX) return lm_err(err, errlen, "tokenizer.ggml.tokens: texts too large");
    t->pool = lm_malloc(total);
    t->off = lm_malloc((arr.n + 1) * sizeof *t->off);
    t->type = lm_calloc(arr.n, 1);
    t->flag = lm_calloc(arr.n, 1);
    if (!t->pool || !t->off || !t->type || !t->flag)
        return lm_err(err, errlen, "out of memory for %llu tokens", (unsigned long long)arr.n), TOK_ENOMEM;
    uint32_t pos = 0;
    for (uint64_t i = 0; i < arr.n; i++) {
        gguf_str s;
        gguf_arr_str(&arr, i, &s);
        t->off[i] = pos;
        memcpy(t->pool + pos, s.ptr, s.len);
        pos += (uint32_t)s.len;
        t->pool[pos++] = 0;
    }
    t->off[arr.n] = pos;
    return 0;
}

/* Numeric per-token array `key` of exactly n_vocab elements; false if absent. */
static int get_token_arr(const gguf_ctx *g, const char *key, int32_t n, gguf_arr *arr, bool *present, char *err,
                         size_t errlen) {
    *present = gguf_find_key(g, key) >= 0;
    if (!*present) return 0;
    if (!gguf_get_arr(g, key, arr)) return lm_err(err, errlen, "%s must be an array", key);
    if (arr->n != (uint64_t)n)
        return lm_err(err, errlen, "%s has %llu entries but the vocab has %d tokens", key, (unsigned long long)arr->n,
                      n);
    return 0;
}

static int load_types_scores(lm_tokenizer *t, const gguf_ctx *g, char *err, size_t errlen) {
    gguf_arr arr;
    bool present;
    if (get_token_arr(g, "tokenizer.ggml.token_type", t->n_vocab, &arr, &present, err, errlen)) return -1;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        int64_t v = TT_NORMAL;
        if (present && !gguf_arr_int(&arr, (uint64_t)i, &v))
            return lm_err(err, errlen, "tokenizer.ggml.token_type must hold integers, not %s",
                          gguf_vtype_name(arr.type));
        if (v < TT_UNDEF || v > TT_BYTE)
            return lm_err(err, errlen, "tokenizer.ggml.token_type[%d] = %lld is not a token type", i, (long long)v);
        t->type[i] = (uint8_t)(v == TT_UNDEF ? TT_NORMAL : v);
    }
    if (t->family != FAM_SPM) return 0;
    if (get_token_arr(g, "tokenizer.ggml.scores", t->n_vocab, &arr, &present, err, errlen)) return -1;
    if (!present) return lm_err(err, errlen, "tokenizer.ggml.scores is missing (needed by the llama tokenizer)");
    t->score = lm_malloc((size_t)t->n_vocab * sizeof *t->score);
    if (!t->score) return lm_err(err, errlen, "out of memory for scores"), TOK_ENOMEM;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        double v;
        if (!gguf_arr_float(&arr, (uint64_t)i, &v))
            return lm_err(err, errlen, "tokenizer.ggml.scores must hold numbers, not %s", gguf_vtype_name(arr.type));
        if (v != v) return lm_err(err, errlen, "tokenizer.ggml.scores[%d] is NaN", i); /* would break the heap order */
        t->score[i] = (float)v;
    }
    return 0;
}

/* Special id `key` into *id: unchanged when absent, -1 for a stored -1 or
 * 0xFFFFFFFF, an error when outside the vocab or not an integer. */
static int get_special_id(const lm_tokenizer *t, const gguf_ctx *g, const char *key, int32_t *id, char *err,
                          size_t errlen) {
    if (gguf_find_key(g, key) < 0) return 0;
    int64_t v;
    if (!gguf_get_int(g, key, &v)) return lm_err(err, errlen, "%s must be an integer", key);
    if (v == -1 || v == (int64_t)UINT32_MAX) {
        *id = -1;
        return 0;
    }
    if (v < 0 || v >= t->n_vocab)
        return lm_err(err, errlen, "%s = %lld is out of range (the vocab has %d tokens)", key, (long long)v,
                      t->n_vocab);
    *id = (int32_t)v;
    return 0;
}

static int get_bool(const gguf_ctx *g, const char *key, bool *v, char *err, size_t errlen) {
    if (gguf_find_key(g, key) < 0) return 0;
    if (!gguf_get_bool(g, key, v)) return lm_err(err, errlen, "%s must be a bool", key);
    return 0;
}

/* Control tokens with one of these texts end generation. */
static const char *const EOG_TEXTS[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<EOT>",
    "<\xEF\xBD\x9C"
    "end\xE2\x96\x81"
    "of\xE2\x96\x81"
    "sentence\xEF\xBD\x9C>", /* <｜end▁of▁sentence｜> */
    "</s>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|return|>", /* o200k_harmony (gpt-oss): the end of an answer */
    "<|call|>",   /* ... and of a tool call */
    NULL,
};
#define N_EOT_TEXTS 7 /* the first entries double as end-of-turn candidates */

static int32_t find_control(const lm_tokenizer *t, const char *text) {
    int32_t id = vocab_find(t, text, strlen(text));
    return id >= 0 && t->type[id] == TT_CONTROL ? id : -1;
}

/*
 * o200k_harmony (gpt-oss), as llama.cpp treats it. Its framing tokens
 * <|start|>, <|channel|>, <|message|> and <|constrain|> are made
 * user-defined: matched in any text and kept in decoded text, so that the
 * channels of an answer can be told apart in its text. When the vocabulary
 * ends generation on both <|return|> and <|call|>, <|end|> (which closes
 * every message, the analysis before an answer included) does not end
 * generation, and is user-defined too.
 */
static void harmony_specials(lm_tokenizer *t) {
    static const char *const framing[] = {"<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"};
    for (int i = 0; i < 4; i++) {
        int32_t id = vocab_find(t, framing[i], strlen(framing[i]));
        if (id >= 0) t->type[id] = TT_USER;
    }
    int32_t ret = find_control(t, "<|return|>"), call = find_control(t, "<|call|>"), end = find_control(t, "<|end|>");
    if (ret >= 0 && call >= 0 && end >= 0 && (t->flag[ret] & t->flag[call] & t->flag[end] & F_EOG)) {
        t->flag[end] &= (uint8_t)~F_EOG;
        t->type[end] = TT_USER;
    }
}

static int load_specials(lm_tokenizer *t, const gguf_ctx *g, char *err, size_t errlen) {
    t->bos = t->eos = t->eot = t->eom = t->unk = -1;
    /* A user-defined token whose text is an end-of-generation marker is
     * treated as control (matched only with parse_special, ends generation),
     * as llama.cpp does: Gemma 3 stores "</s>" as user-defined. */
    for (int i = 0; EOG_TEXTS[i]; i++) {
        int32_t id = vocab_find(t, EOG_TEXTS[i], strlen(EOG_TEXTS[i]));
        if (id >= 0 && t->type[id] == TT_USER) t->type[id] = TT_CONTROL;
    }
    if (t->family == FAM_SPM) { /* SentencePiece's conventional texts when the ids are not stored */
        t->bos = vocab_find(t, "<s>", 3);
        t->eos = vocab_find(t, "</s>", 4);
        t->unk = vocab_find(t, "<unk>", 5);
    }
    t->sep = -1;
    if (t->family == FAM_WPM) { /* BERT's conventional texts; the ids as files store them */
        t->bos = vocab_find(t, "[CLS]", 5);
        t->sep = vocab_find(t, "[SEP]", 5);
        t->unk = vocab_find(t, "[UNK]", 5);
        if (get_special_id(t, g, "tokenizer.ggml.cls_token_id", &t->bos, err, errlen) ||
            get_special_id(t, g, "tokenizer.ggml.seperator_token_id", &t->sep, err, errlen))
            return -1;
        t->wpm_lower = true;
        if (get_bool(g, "tokenizer.ggml.normalizer.lowercase", &t->wpm_lower, err, errlen)) return -1;
        t->wpm_strip = t->wpm_lower;
        if (get_bool(g, "tokenizer.ggml.normalizer.strip_accents", &t->wpm_strip, err, errlen)) return -1;
        for (int32_t i = 0; i < t->n_vocab; i++)
            if ((int)(t->off[i + 1] - t->off[i] - 1) > t->max_piece)
                t->max_piece = (int)(t->off[i + 1] - t->off[i] - 1);
    }
    if (get_special_id(t, g, "tokenizer.ggml.bos_token_id", &t->bos, err, errlen) ||
        get_special_id(t, g, "tokenizer.ggml.eos_token_id", &t->eos, err, errlen) ||
        get_special_id(t, g, "tokenizer.ggml.eot_token_id", &t->eot, err, errlen) ||
        get_special_id(t, g, "tokenizer.ggml.eom_token_id", &t->eom, err, errlen) ||
        get_special_id(t, g, "tokenizer.ggml.unknown_token_id", &t->unk, err, errlen))
        return -1;
    if (t->unk < 0)
        for (int32_t i = 0; i < t->n_vocab && t->unk < 0; i++)
            if (t->type[i] == TT_UNKNOWN) t->unk = i;
    for (int i = 0; t->eot < 0 && i < N_EOT_TEXTS; i++) t->eot = find_control(t, EOG_TEXTS[i]);
    if (t->eom < 0) t->eom = find_control(t, "<|eom_id|>");
    for (int i = 0; EOG_TEXTS[i]; i++) {
        int32_t id = find_control(t, EOG_TEXTS[i]);
        if (id >= 0) t->flag[id] |= F_EOG;
    }
    int32_t eog[3] = {t->eos, t->eot, t->eom};
    for (int i = 0; i < 3; i++)
        if (eog[i] >= 0) t->flag[eog[i]] |= F_EOG;
    harmony_specials(t);
    if (t->bos < 0) t->add_bos = false; /* a family default cannot ask for a missing token */
    if (get_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err, errlen) ||
        get_bool(g, "tokenizer.ggml.add_eos_token", &t->add_eos, err, errlen) ||
        get_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err, errlen))
        return -1;
    if (t->add_bos && t->bos < 0)
        return lm_err(err, errlen, "tokenizer.ggml.add_bos_token is true but there is no BOS token");
    if (t->family == FAM_WPM && t->unk < 0)
        return lm_err(err, errlen, "a bert (WordPiece) vocabulary without an unknown token ([UNK])");
    if (t->add_eos && t->eos < 0 && t->family != FAM_WPM)
        return lm_err(err, errlen, "tokenizer.ggml.add_eos_token is true but there is no EOS token");
    return 0;
}

/* Byte tokens, merge/special flags, the special matcher and the detok bound. */
static int derive_tables(lm_tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        char buf[8];
        size_t n;
        if (t->family == FAM_SPM) {
            static const char hex[] = "0123456789ABCDEF";
            memcpy(buf, "<0x", 3);
            buf[3] = hex[b >> 4];
            buf[4] = hex[b & 15];
            buf[5] = '>';
            n = 6;
        } else {
            n = (size_t)utf8_encode(t->b2u[b], buf);
        }
        t->byte_tok[b] = vocab_find(t, buf, n);
        /* vocabs without token_type still mean <0xXX> as a byte */
        if (t->family == FAM_SPM && t->byte_tok[b] >= 0 && t->type[t->byte_tok[b]] == TT_NORMAL)
            t->type[t->byte_tok[b]] = TT_BYTE;
    }
    /* lengths of the verbatim-matched tokens, as a bitmap (token texts are at
     * most TOK_MAX_PIECE bytes), then listed longest first */
    uint8_t *seen = lm_calloc(TOK_MAX_PIECE / 8 + 1, 1);
    if (!seen) return -1;
    int nd = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t len;
        const char *p = piece_of(t, id, &len);
        uint8_t ty = t->type[id];
        if (ty == TT_NORMAL || ty == TT_USER) t->flag[id] |= F_MERGE;
        uint8_t sp = ty == TT_USER ? F_SP_ALWAYS : (ty == TT_CONTROL || ty == TT_UNKNOWN) ? F_SP_PARSE : 0;
        if (sp && len > 0) {
            t->flag[id] |= sp;
            t->sp_first[(unsigned char)p[0]] |= sp;
            if (!(seen[len / 8] & (1u << (len % 8)))) nd++;
            seen[len / 8] |= (uint8_t)(1u << (len % 8));
        }
    }
    uint32_t *lens = lm_malloc(((size_t)nd + 1) * sizeof *lens);
    if (!lens) {
        lm_free(seen);
        return -1;
    }
    int k = 0;
    for (uint32_t len = TOK_MAX_PIECE; len > 0; len--)
        if (seen[len / 8] & (1u << (len % 8))) lens[k++] = len;
    lm_free(seen);
    t->sp_len = lens;
    t->n_sp_len = nd;
    return 0;
}

/* The most one detok_push can write: a pending partial character turned into
 * U+FFFD (3 bytes) plus the token's decoded bytes, each non-ASCII byte
 * counted as a possible U+FFFD. Decoded bytes never outnumber the text's. */
static int detok_bound(lm_tokenizer *t) {
    char *buf = lm_malloc(TOK_MAX_PIECE);
    if (!buf) return -1;
    int worst = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        int n = tok_token_bytes(t, id, true, buf, TOK_MAX_PIECE);
        int w = 3;
        for (int i = 0; i < n; i++) w += (unsigned char)buf[i] < 0x80 ? 1 : 3;
        if (w > worst) worst = w;
    }
    lm_free(buf);
    t->detok_max = worst < 16 ? 16 : worst;
    return 0;
}

static int load_family(lm_tokenizer *t, const gguf_ctx *g, char *err, size_t errlen) {
    gguf_str model;
    if (!gguf_get_str(g, "tokenizer.ggml.model", &model))
        return lm_err(err, errlen, "tokenizer.ggml.model is missing or not a string");
    if (gguf_str_eq(model, "llama")) {
        t->family = FAM_SPM;
        t->add_bos = true;
        t->add_space_prefix = true;
    } else if (gguf_str_eq(model, "gpt2")) {
        t->family = FAM_BPE;
    } else if (gguf_str_eq(model, "bert")) {
        t->family = FAM_WPM;
        t->add_bos = true; /* [CLS] ... [SEP] */
    } else {
        return lm_err(err, errlen, "unsupported tokenizer model '%.*s' (lamina knows 'llama', 'gpt2' and 'bert')",
                      (int)(model.len > 64 ? 64 : model.len), model.ptr),
               TOK_EUNSUPPORTED;
    }
    return 0;
}

/* BPE only: the pre-tokenizer, its add_bos default, and the merges. */
static int load_bpe(lm_tokenizer *t, const gguf_ctx *g, char *err, size_t errlen) {
    const pre_spec *ps = &PRE_SPECS[0];
    const char *name = "default";
    char namebuf[72];
    if (gguf_find_key(g, "tokenizer.ggml.pre") >= 0) {
        gguf_str pre;
        if (!gguf_get_str(g, "tokenizer.ggml.pre", &pre))
            return lm_err(err, errlen, "tokenizer.ggml.pre must be a string");
        int n = (int)(pre.len > 64 ? 64 : pre.len);
        snprintf(namebuf, sizeof namebuf, "%.*s", n, pre.ptr);
        name = namebuf;
        ps = pre_lookup(pre.ptr, pre.len);
        if (!ps)
            return lm_err(err, errlen, "unsupported pre-tokenizer '%s' (tokenizer.ggml.pre)", name), TOK_EUNSUPPORTED;
    }
    t->add_bos = ps->add_bos;
    if (pre_compile(t, ps, name, err, errlen)) return -1;
    gguf_arr merges;
    if (gguf_find_key(g, "tokenizer.ggml.merges") < 0)
        return lm_err(err, errlen, "tokenizer.ggml.merges is missing (needed by the gpt2 tokenizer)");
    if (!gguf_get_arr(g, "tokenizer.ggml.merges", &merges))
        return lm_err(err, errlen, "tokenizer.ggml.merges must be an array");
    return merges_build(t, &merges, err, errlen);
}

lm_tokenizer *tok_load(const gguf_ctx *g, char *err, size_t errlen) {
    lm_status st;
    return tok_load_status(g, &st, err, errlen);
}

lm_tokenizer *tok_load_status(const gguf_ctx *g, lm_status *status, char *err, size_t errlen) {
    *status = LM_ERR_NOMEM;
    lm_tokenizer *t = lm_calloc(1, sizeof *t);
    if (!t) {
        lm_err(err, errlen, "out of memory");
        return NULL;
    }
    int rc = load_family(t, g, err, errlen);
    if (!rc) rc = load_tokens(t, g, err, errlen);
    if (!rc) rc = load_types_scores(t, g, err, errlen);
    if (rc) goto fail;
    if (vocab_build(t)) {
        rc = (lm_err(err, errlen, "out of memory for the vocab hash"), TOK_ENOMEM);
        goto fail;
    }
    if (t->family == FAM_BPE) {
        byte_unicode_build(t);
        if ((rc = load_bpe(t, g, err, errlen))) goto fail;
    }
    if ((rc = load_specials(t, g, err, errlen))) goto fail;
    if (derive_tables(t) || detok_bound(t)) {
        rc = (lm_err(err, errlen, "out of memory"), TOK_ENOMEM);
        goto fail;
    }
    *status = LM_OK;
    return t;
fail:
    *status = rc == TOK_ENOMEM ? LM_ERR_NOMEM : rc == TOK_EUNSUPPORTED ? LM_ERR_UNSUPPORTED : LM_ERR_FORMAT;
    tok_free(t);
    return NULL;
}

void tok_free(lm_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_re; i++) pcre2_code_free(t->re[i]);
    lm_free(t->pool);
    lm_free(t->off);
    lm_free(t->score);
    lm_free(t->type);
    lm_free(t->flag);
    lm_free(t->vslot);
    lm_free(t->mslot);
    lm_free(t->sp_len);
    lm_free(t);
}

/* ---- accessors ------------------------------------------------------------- */

int32_t tok_n_vocab(const lm_tokenizer *t) { return t->n_vocab; }
const char *tok_model_name(const lm_tokenizer *t) {
    return t->family == FAM_SPM ? "llama" : t->family == FAM_WPM ? "bert" : "gpt2";
}
int32_t tok_sep(const lm_tokenizer *t) { return t->sep; }
int32_t tok_bos(const lm_tokenizer *t) { return t->bos; }
int32_t tok_eos(const lm_tokenizer *t) { return t->eos; }
int32_t tok_eot(const lm_tokenizer *t) { return t->eot; }
bool tok_add_bos(const lm_tokenizer *t) { return t->add_bos; }
/* (WordPiece ends an input with [SEP] in tok_encode, as llama.cpp does, never with EOS) */
bool tok_add_eos(const lm_tokenizer *t) { return t->add_eos && t->family != FAM_WPM; }
const float *tok_scores(const lm_tokenizer *t) { return t->family == FAM_SPM ? t->score : NULL; }

bool tok_is_eog(const lm_tokenizer *t, int32_t id) { return id >= 0 && id < t->n_vocab && (t->flag[id] & F_EOG); }

bool tok_is_control(const lm_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->type[id] == TT_CONTROL;
}

int32_t tok_find(const lm_tokenizer *t, const char *text, size_t len) { return len ? vocab_find(t, text, len) : -1; }

const char *tok_piece(const lm_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) {
        if (len) *len = 0;
        return NULL;
    }
    size_t n;
    const char *p = piece_of(t, id, &n);
    if (len) *len = n;
    return p;
}

/* ---- encoding: shared merge engine ---------------------------------------- */

typedef struct {
    int32_t prev, next; /* linked list over live symbols; -1 at the ends */
    uint32_t start, n;  /* bytes [start, start+n) of the work text; n == 0: merged away */
    int32_t id;         /* token of the symbol, -1 if none */
} symbol;

typedef struct {
    float prio; /* lower pops first: -score (SPM) or rank (BPE) */
    int32_t left, right;
    uint32_t size; /* left.n + right.n when pushed; a mismatch means stale */
    int32_t id;    /* token the pair forms */
} bigram;

typedef struct {
    int32_t *out;
    int cap;
    int64_t n;
} emitter;

/* Per-call scratch, sized for the whole input once (about 60 bytes per
 * input byte). Every fragment has at most len + 1 symbols (SPM turns a space
 * into one U+2581 character and may add one in front). */
typedef struct {
    symbol *sym;  /* (len + 2) */
    bigram *heap; /* (heap_cap) grows on demand; pushes stay below 3 * symbols */
    size_t nheap, heap_cap;
    char *buf;         /* (3 * len + 4) SPM escaped text / BPE mapped piece */
    uint32_t *pa, *pb; /* (2 * (len + 1)) pre-tokenizer pieces as (start, length) pairs */
    pcre2_match_data *md;
} work;

static void emit(emitter *e, int32_t id) {
    if (e->n < e->cap) e->out[e->n] = id;
    e->n++;
}

static bool bg_less(const bigram *a, const bigram *b) {
    return a->prio < b->prio || (a->prio == b->prio && a->left < b->left);
}

static int heap_push(work *w, bigram b) {
    if (w->nheap == w->heap_cap) {
        size_t cap = w->heap_cap * 2;
        bigram *h = lm_realloc(w->heap, cap * sizeof *h);
        if (!h) return -1;
        w->heap = h;
        w->heap_cap = cap;
    }
    size_t i = w->nheap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bg_less(&b, &w->heap[p])) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = b;
    return 0;
}

static bigram heap_pop(work *w) {
    bigram top = w->heap[0], last = w->heap[--w->nheap];
    size_t i = 0, n = w->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && bg_less(&w->heap[c + 1], &w->heap[c])) c++;
        if (!bg_less(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

/* Push the pair (l, r) if it forms a token; -1 only when out of memory. */
static int try_pair(const lm_tokenizer *t, work *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return 0;
    const symbol *a = &w->sym[l], *b = &w->sym[r];
    bigram bg = {0, l, r, a->n + b->n, -1};
    if (t->family == FAM_SPM) {
        int32_t id = vocab_find(t, w->buf + a->start, bg.size); /* a and b are adjacent bytes */
        if (id < 0 || !(t->flag[id] & F_MERGE)) return 0;
        bg.prio = -t->score[id];
        bg.id = id;
    } else {
        if (a->id < 0 || b->id < 0) return 0;
        const merge_ent *m = merge_find(t, a->id, b->id);
        if (!m) return 0;
        bg.prio = (float)m->rank;
        bg.id = m->result;
    }
    return heap_push(w, bg);
}

/* Merge symbols 0..n-1 (already linked) until no pair forms a token. */
static int merge_all(const lm_tokenizer *t, work *w, int32_t n) {
    w->nheap = 0;
    for (int32_t i = 0; i + 1 < n; i++)
        if (try_pair(t, w, i, i + 1)) return -1;
    while (w->nheap) {
        bigram bg = heap_pop(w);
        symbol *a = &w->sym[bg.left], *b = &w->sym[bg.right];
        if (a->n == 0 || b->n == 0 || a->n + b->n != bg.size) continue; /* stale */
        a->n += b->n;
        a->id = bg.id;
        a->next = b->next;
        if (b->next >= 0) w->sym[b->next].prev = bg.left;
        b->n = 0;
        if (try_pair(t, w, a->prev, bg.left) || try_pair(t, w, bg.left, a->next)) return -1;
    }
    return 0;
}

/* A byte with no token of its own: the unknown token, or failure. */
static int emit_byte(const lm_tokenizer *t, emitter *e, unsigned char b) {
    int32_t id = t->byte_tok[b] >= 0 ? t->byte_tok[b] : t->unk;
    if (id < 0) return -1;
    emit(e, id);
    return 0;
}

/* ---- encoding: SentencePiece ---------------------------------------------- */

static int encode_spm(const lm_tokenizer *t, work *w, const char *text, size_t len, bool prefix, emitter *e) {
    size_t n = 0;
    if (prefix) {
        memcpy(w->buf, "\xE2\x96\x81", 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(w->buf + n, "\xE2\x96\x81", 3);
            n += 3;
        } else {
            w->buf[n++] = text[i];
        }
    }
    int32_t ns = 0;
    for (size_t i = 0; i < n;) {
        size_t cl = utf8_valid_len((const unsigned char *)w->buf + i, n - i);
        if (cl == 0) cl = 1; /* an invalid byte stands alone and falls back to a byte token */
        int32_t id = vocab_find(t, w->buf + i, cl);
        if (id >= 0 && !(t->flag[id] & F_MERGE)) id = -1;
        w->sym[ns] = (symbol){ns - 1, -1, (uint32_t)i, (uint32_t)cl, id};
        if (ns > 0) w->sym[ns - 1].next = ns;
        ns++;
        i += cl;
    }
    if (merge_all(t, w, ns)) return -1;
    /* symbol 0 never dies: merges always absorb the right symbol */
    for (int32_t i = ns ? 0 : -1; i >= 0; i = w->sym[i].next) {
        const symbol *s = &w->sym[i];
        if (s->id >= 0) {
            emit(e, s->id);
        } else {
            for (uint32_t k = 0; k < s->n; k++)
                if (emit_byte(t, e, (unsigned char)w->buf[s->start + k])) return -1;
        }
    }
    return 0;
}

/* ---- encoding: byte-level BPE --------------------------------------------- */

/* Split the pieces in w->pa (np of them, each a (start, len) pair over text)
 * with every regex in turn; returns the final count or -1. Text between
 * matches stays a piece of its own, so the pieces always tile the input. */
static int64_t pretokenize(const lm_tokenizer *t, work *w, const char *text, size_t len) {
    size_t np = 0;
    if (len) {
        w->pa[0] = 0;
        w->pa[1] = (uint32_t)len; /* len < TOK_MAX_TEXT */
        np = 1;
    }
    for (int r = 0; r < t->n_re; r++) {
        size_t nq = 0;
        for (size_t p = 0; p < np; p++) {
            PCRE2_SPTR s = (PCRE2_SPTR)text + w->pa[2 * p];
            size_t n = w->pa[2 * p + 1], pos = 0, last = 0;
            while (pos < n) {
                int rc = pcre2_match(t->re[r], s, n, pos, 0, w->md, NULL);
                if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* deep backtracking: let the interpreter do it */
                    rc = pcre2_match(t->re[r], s, n, pos, PCRE2_NO_JIT, w->md, NULL);
                if (rc == PCRE2_ERROR_NOMATCH) break;
                if (rc < 0) return -1;
                const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
                size_t ms = ov[0], me = ov[1];
                if (me <= ms) { /* empty match: step over one character */
                    pos = ms + 1;
                    while (pos < n && (s[pos] & 0xC0) == 0x80) pos++;
                    continue;
                }
                if (ms > last) {
                    w->pb[2 * nq] = w->pa[2 * p] + (uint32_t)last;
                    w->pb[2 * nq++ + 1] = (uint32_t)(ms - last);
                }
                w->pb[2 * nq] = w->pa[2 * p] + (uint32_t)ms;
                w->pb[2 * nq++ + 1] = (uint32_t)(me - ms);
                last = pos = me;
            }
            if (last < n) {
                w->pb[2 * nq] = w->pa[2 * p] + (uint32_t)last;
                w->pb[2 * nq++ + 1] = (uint32_t)(n - last);
            }
        }
        uint32_t *tmp = w->pa;
        w->pa = w->pb;
        w->pb = tmp;
        np = nq;
    }
    return (int64_t)np;
}

static int encode_bpe_piece(const lm_tokenizer *t, work *w, const unsigned char *s, size_t n, emitter *e) {
    if (t->ignore_merges) { /* the whole piece may already be a token */
        size_t m = 0;
        for (size_t i = 0; i < n; i++) m += (size_t)utf8_encode(t->b2u[s[i]], w->buf + m);
        int32_t id = vocab_find(t, w->buf, m);
        if (id >= 0 && (t->flag[id] & F_MERGE)) {
            emit(e, id);
            return 0;
        }
    }
    for (size_t i = 0; i < n; i++)
        w->sym[i] = (symbol){(int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1, (uint32_t)i, 1, t->byte_tok[s[i]]};
    if (merge_all(t, w, (int32_t)n)) return -1;
    for (int32_t i = n ? 0 : -1; i >= 0; i = w->sym[i].next) {
        const symbol *sy = &w->sym[i];
        if (sy->id >= 0) emit(e, sy->id);
        else if (emit_byte(t, e, s[sy->start])) return -1; /* only single bytes lack a token */
    }
    return 0;
}

static int encode_bpe(const lm_tokenizer *t, work *w, const char *text, size_t len, emitter *e) {
    int64_t np = pretokenize(t, w, text, len);
    if (np < 0) return -1;
    for (int64_t p = 0; p < np; p++)
        if (encode_bpe_piece(t, w, (const unsigned char *)text + w->pa[2 * p], w->pa[2 * p + 1], e)) return -1;
    return 0;
}

/* ---- encoding: special tokens and the driver ------------------------------ */

/* The longest special token at s (n bytes left) allowed by `mask`, or -1. */
static int32_t match_special(const lm_tokenizer *t, const char *s, size_t n, uint8_t mask, size_t *mlen) {
    if (!(t->sp_first[(unsigned char)s[0]] & mask)) return -1;
    for (int i = 0; i < t->n_sp_len; i++) {
        size_t L = t->sp_len[i];
        if (L > n) continue;
        int32_t id = vocab_find(t, s, L);
        if (id >= 0 && (t->flag[id] & mask)) {
            *mlen = L;
            return id;
        }
    }
    return -1;
}

/* WordPiece: each word of wpm_words (U+2581 in front) cut greedily into the
 * longest vocabulary tokens from its start; a word with a position no token
 * starts at is one unknown token. */
static int encode_wpm(const lm_tokenizer *t, const char *text, size_t len, emitter *e) {
    char *buf = lm_malloc(wpm_out_cap(len));
    if (!buf) return -1;
    size_t n = wpm_words(text, len, t->wpm_lower, t->wpm_strip, buf);
    for (size_t w0 = 0; w0 < n;) {
        size_t wl = strlen(buf + w0);
        int64_t first = e->n;
        for (size_t i = 0; i < wl;) {
            size_t j = wl - i < (size_t)t->max_piece ? wl : i + (size_t)t->max_piece;
            int32_t id = -1;
            for (; j > i && (id = vocab_find(t, buf + w0 + i, j - i)) < 0; j--) {}
            if (id < 0) { /* discard the word's pieces: one unknown token stands for it */
                e->n = first;
                break;
            }
            emit(e, id);
            i = j;
        }
        if (e->n == first) emit(e, t->unk);
        w0 += wl + 1;
    }
    lm_free(buf);
    return 0;
}

static int encode_raw(const lm_tokenizer *t, work *w, const char *text, size_t len, bool after_special, emitter *e) {
    if (t->family == FAM_WPM) return encode_wpm(t, text, len, e);
    if (t->family == FAM_SPM) return encode_spm(t, w, text, len, t->add_space_prefix && after_special, e);
    return encode_bpe(t, w, text, len, e);
}

static int work_init(work *w, size_t len) {
    memset(w, 0, sizeof *w);
    w->heap_cap = len + 16;
    w->sym = lm_malloc((len + 2) * sizeof *w->sym);
    w->heap = lm_malloc(w->heap_cap * sizeof *w->heap);
    w->buf = lm_malloc(3 * len + 4); /* SPM text grows 3x when every byte is a space */
    w->pa = lm_malloc(2 * (len + 1) * sizeof *w->pa);
    w->pb = lm_malloc(2 * (len + 1) * sizeof *w->pb);
    w->md = pcre2_match_data_create(4, NULL);
    return w->sym && w->heap && w->buf && w->pa && w->pb && w->md ? 0 : -1;
}

static void work_free(work *w) {
    lm_free(w->sym);
    lm_free(w->heap);
    lm_free(w->buf);
    lm_free(w->pa);
    lm_free(w->pb);
    if (w->md) pcre2_match_data_free(w->md);
}

int tok_encode(const lm_tokenizer *t, const char *text, size_t len, bool add_bos, bool parse_special, int32_t *out,
               int cap) {
    if (!t || (len && !text) || len >= TOK_MAX_TEXT || (cap > 0 && !out)) return -1;
    emitter e = {out, cap < 0 ? 0 : cap, 0};
    if (add_bos) {
        if (t->bos < 0) return -1;
        emit(&e, t->bos);
    }
    if (len == 0) {
        if (add_bos && t->sep >= 0) emit(&e, t->sep);
        return (int)e.n;
    }
    work w;
    int rc = -1;
    if (work_init(&w, len)) goto done;
    uint8_t mask = F_SP_ALWAYS | (parse_special ? F_SP_PARSE : 0);
    bool after_special = true;
    size_t raw = 0;
    for (size_t i = 0; i < len;) {
        size_t mlen = 0;
        int32_t id = t->n_sp_len ? match_special(t, text + i, len - i, mask, &mlen) : -1;
        if (id < 0) {
            i++;
            continue;
        }
        if (i > raw && encode_raw(t, &w, text + raw, i - raw, after_special, &e)) goto done;
        emit(&e, id);
        after_special = true;
        i += mlen;
        raw = i;
    }
    if (raw < len && encode_raw(t, &w, text + raw, len - raw, after_special, &e)) goto done;
    if (add_bos && t->sep >= 0) emit(&e, t->sep); /* WPM: [CLS] text [SEP] */
    rc = e.n > INT_MAX ? -1 : (int)e.n;
done:
    work_free(&w);
    return rc;
}

int tok_pretokenize(const lm_tokenizer *t, const char *text, size_t len, size_t *starts, int cap) {
    if (!t || (len && !text) || len >= TOK_MAX_TEXT || (cap > 0 && !starts)) return -1;
    if (t->family != FAM_BPE) return -1;
    work w;
    int rc = -1;
    if (work_init(&w, len) == 0) {
        int64_t np = pretokenize(t, &w, text, len);
        for (int64_t i = 0; i < np && i < cap; i++) starts[i] = w.pa[2 * i];
        rc = np > INT_MAX ? -1 : (int)np;
    }
    work_free(&w);
    return rc;
}

/* ---- decoding -------------------------------------------------------------- */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Bounded writer: counts everything, stores what fits. */
typedef struct {
    char *buf;
    int cap;
    int n;
} sink;

static void put(sink *k, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++, k->n++)
        if (k->n < k->cap) k->buf[k->n] = p[i];
}

/* Normal BPE text back to bytes through the inverse GPT-2 map; a character
 * outside the map is copied as it is. */
static void bpe_unmap(const lm_tokenizer *t, const char *p, size_t len, sink *k) {
    for (size_t i = 0; i < len;) {
        const unsigned char *u = (const unsigned char *)p + i;
        size_t cl = utf8_valid_len(u, len - i);
        uint32_t cp = 0x110000;
        if (cl == 1) cp = u[0];
        else if (cl == 2) cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
        if (cl == 0) cl = 1;
        if (cp < 324 && t->u2b[cp] >= 0) {
            char b = (char)t->u2b[cp];
            put(k, &b, 1);
        } else {
            put(k, p + i, cl);
        }
        i += cl;
    }
}

int tok_token_bytes(const lm_tokenizer *t, int32_t id, bool special, char *buf, int cap) {
    if (!t || id < 0 || id >= t->n_vocab) return 0;
    sink k = {buf, cap < 0 ? 0 : cap, 0};
    size_t len;
    const char *p = piece_of(t, id, &len);
    switch (t->type[id]) {
        case TT_CONTROL:
        case TT_UNKNOWN:
        case TT_UNUSED:
            if (special) put(&k, p, len);
            break;
        case TT_USER: put(&k, p, len); break;
        case TT_BYTE:
            if (len == 6 && memcmp(p, "<0x", 3) == 0 && p[5] == '>' && hexval(p[3]) >= 0 && hexval(p[4]) >= 0) {
                char b = (char)(hexval(p[3]) * 16 + hexval(p[4]));
                put(&k, &b, 1);
            } else {
                put(&k, p, len);
            }
            break;
        default:
            if (t->family == FAM_BPE) {
                bpe_unmap(t, p, len, &k);
                break;
            }
            for (size_t i = 0; i < len; i++) { /* U+2581 -> ' ' */
                if (i + 3 <= len && memcmp(p + i, "\xE2\x96\x81", 3) == 0) {
                    put(&k, " ", 1);
                    i += 2;
                } else {
                    put(&k, p + i, 1);
                }
            }
            break;
    }
    return k.n;
}

/* ---- streaming detokenizer ------------------------------------------------- */

static const char REPL[3] = {'\xEF', '\xBF', '\xBD'}; /* U+FFFD */

void detok_init(lm_detok *d, const lm_tokenizer *t, bool strip_space, bool special) {
    memset(d, 0, sizeof *d);
    d->tok = t;
    d->at_start = true;
    d->strip_space = strip_space;
    d->special = special;
}

int detok_max_out(const lm_tokenizer *t) { return t->detok_max; }

/* Feed one byte through the UTF-8 assembler. A byte that cannot continue the
 * pending sequence turns the pending part into one U+FFFD and starts over. */
static void feed(lm_detok *d, unsigned char c, sink *k) {
    unsigned char lo, hi;
    if (d->n_pending > 0) {
        int need = utf8_lead(d->pending[0], &lo, &hi);
        if (d->n_pending > 1) { /* only the second byte has a narrowed range */
            lo = 0x80;
            hi = 0xBF;
        }
        if (c >= lo && c <= hi) {
            d->pending[d->n_pending++] = c;
            if (d->n_pending == need) {
                put(k, (const char *)d->pending, (size_t)need);
                d->n_pending = 0;
            }
            return;
        }
        put(k, REPL, 3);
        d->n_pending = 0;
    }
    if (c < 0x80) put(k, (const char *)&c, 1);
    else if (utf8_lead(c, &lo, &hi)) d->pending[d->n_pending++] = c;
    else put(k, REPL, 3);
}

int detok_push(lm_detok *d, int32_t id, char *out, int cap) {
    const lm_tokenizer *t = d->tok;
    char small[512];
    int n = tok_token_bytes(t, id, d->special, small, (int)sizeof small);
    char *bytes = small;
    if (n > (int)sizeof small) {
        bytes = lm_malloc((size_t)n);
        if (!bytes) return -1;
        tok_token_bytes(t, id, d->special, bytes, n);
    }
    lm_detok saved = *d;
    sink k = {out, cap < 0 ? 0 : cap, 0};
    int i = 0;
    if (n > 0 && d->at_start) {
        if (d->strip_space && ((t->family == FAM_SPM && t->add_space_prefix) || t->family == FAM_WPM) &&
            bytes[0] == ' ')
            i = 1;
        d->at_start = false;
    }
    for (; i < n; i++) feed(d, (unsigned char)bytes[i], &k);
    if (bytes != small) lm_free(bytes);
    if (k.n > k.cap) { /* did not fit: leave the state as it was */
        *d = saved;
        return -1;
    }
    return k.n;
}

int detok_flush(lm_detok *d, char *out, int cap) {
    if (d->n_pending == 0) return 0;
    if (cap < 3) return -1;
    memcpy(out, REPL, 3);
    d->n_pending = 0;
    return 3;
}
