/*
 * test_sha256.c - SHA-256 against the FIPS 180-2 example vectors (empty,
 * "abc", the two-block 448-bit and 896-bit messages, one million 'a'),
 * lengths on each side of the padding boundary (digests from coreutils
 * sha256sum), and streaming in random pieces against the one-shot digest.
 */
#include <stdint.h>

#include "base/sha256.h"
#include "test.h"
#include "base/util.h"

static int hex_eq(const uint8_t d[SHA256_LEN], const char *hex) {
    char s[2 * SHA256_LEN + 1];
    for (int i = 0; i < SHA256_LEN; i++) snprintf(s + 2 * i, 3, "%02x", d[i]);
    if (strcmp(s, hex)) {
        fprintf(stderr, "  got  %s\n  want %s\n", s, hex);
        return 0;
    }
    return 1;
}

static void test_fips_vectors(void) {
    uint8_t d[SHA256_LEN];
    sha256("", 0, d);
    CHECK(hex_eq(d, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
    sha256("abc", 3, d);
    CHECK(hex_eq(d, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha256(m448, strlen(m448), d);
    CHECK(hex_eq(d, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
    const char *m896 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmn"
                       "hijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    sha256(m896, strlen(m896), d);
    CHECK(hex_eq(d, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"));
}

static void test_million_a(void) {
    /* fed in 1000-byte pieces, so update's buffering is exercised too */
    char chunk[1000];
    memset(chunk, 'a', sizeof chunk);
    sha256_ctx c;
    sha256_init(&c);
    for (int i = 0; i < 1000; i++) sha256_update(&c, chunk, sizeof chunk);
    uint8_t d[SHA256_LEN];
    sha256_final(&c, d);
    CHECK(hex_eq(d, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"));
}

static void test_padding_boundaries(void) {
    static const struct {
        int n;
        const char *hex;
    } v[] = {
        {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
        {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
        {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
        {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
        {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
    };
    char a[128];
    memset(a, 'a', sizeof a);
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        uint8_t d[SHA256_LEN];
        sha256(a, (size_t)v[i].n, d);
        CHECKF(hex_eq(d, v[i].hex), "length %d", v[i].n);
    }
}

static void test_streaming_matches_oneshot(void) {
    lm_rng r;
    lm_rng_seed(&r, 7);
    uint8_t msg[700];
    for (size_t i = 0; i < sizeof msg; i++) msg[i] = (uint8_t)lm_rng_u64(&r);
    for (int trial = 0; trial < 200; trial++) {
        size_t len = (size_t)(lm_rng_u64(&r) % sizeof msg);
        uint8_t want[SHA256_LEN], got[SHA256_LEN];
        sha256(msg, len, want);
        sha256_ctx c;
        sha256_init(&c);
        for (size_t off = 0; off < len;) {
            size_t piece = 1 + (size_t)(lm_rng_u64(&r) % 90);
            if (piece > len - off) piece = len - off;
            sha256_update(&c, msg + off, piece);
            off += piece;
        }
        sha256_final(&c, got);
        CHECKF(!memcmp(want, got, SHA256_LEN), "length %zu", len);
    }
    /* a one-bit change changes the digest */
    uint8_t d1[SHA256_LEN], d2[SHA256_LEN];
    sha256(msg, 100, d1);
    msg[50] ^= 1;
    sha256(msg, 100, d2);
    CHECK(memcmp(d1, d2, SHA256_LEN) != 0);
}

int main(void) {
    TEST_RUN(test_fips_vectors);
    TEST_RUN(test_million_a);
    TEST_RUN(test_padding_boundaries);
    TEST_RUN(test_streaming_matches_oneshot);
    return TEST_DONE();
}
