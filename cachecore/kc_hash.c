/*
 * kc_hash.c - SHA-256 through GNU Nettle (streaming and one-shot), hex
 * encoding, key validation and constant-time comparison.
 *
 * Nettle, not OpenSSL EVP (docs/DESIGN.md, hashing and keys): libcrypto's
 * loading, relocations and constructors were the largest part of a fresh
 * kcache process's start-up, and a warm hit needs nothing else from it.
 * The digests are the same bytes (tests/test_hash.c pins known vectors).
 */
#include <stdlib.h>
#include <string.h>

#include <nettle/memops.h>
#include <nettle/sha2.h>

#include <kcache/kc_hash.h>

struct kc_sha256_ctx {
    struct sha256_ctx sha;
};

kc_sha256_ctx *kc_sha256_new(void)
{
    kc_sha256_ctx *c = malloc(sizeof *c);
    if (!c)
        return NULL;
    sha256_init(&c->sha);
    return c;
}

void kc_sha256_update(kc_sha256_ctx *ctx, const void *data, size_t len)
{
    if (len)
        sha256_update(&ctx->sha, len, data);
}

void kc_sha256_final(kc_sha256_ctx *ctx, uint8_t out[KC_SHA256_LEN])
{
    /* sha256_digest also resets the context; kc_sha256_reset stays valid */
    sha256_digest(&ctx->sha, KC_SHA256_LEN, out);
}

void kc_sha256_reset(kc_sha256_ctx *ctx)
{
    sha256_init(&ctx->sha);
}

void kc_sha256_free(kc_sha256_ctx *ctx)
{
    free(ctx);
}

void kc_sha256(const void *data, size_t len, uint8_t out[KC_SHA256_LEN])
{
    struct sha256_ctx c;
    sha256_init(&c);
    if (len)
        sha256_update(&c, len, data);
    sha256_digest(&c, KC_SHA256_LEN, out);
}

void kc_sha256_hex(const void *data, size_t len, char out[KC_KEY_HEX_LEN + 1])
{
    uint8_t d[KC_SHA256_LEN];
    kc_sha256(data, len, d);
    kc_hex_encode(d, sizeof d, out);
}

void kc_hex_encode(const uint8_t *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

/* a hex digit's value | 0x10, 0 for anything else: one load per character */
static const uint8_t hex_table[256] = {
    ['0'] = 0x10, ['1'] = 0x11, ['2'] = 0x12, ['3'] = 0x13, ['4'] = 0x14, ['5'] = 0x15,
    ['6'] = 0x16, ['7'] = 0x17, ['8'] = 0x18, ['9'] = 0x19, ['a'] = 0x1a, ['b'] = 0x1b,
    ['c'] = 0x1c, ['d'] = 0x1d, ['e'] = 0x1e, ['f'] = 0x1f, ['A'] = 0x1a, ['B'] = 0x1b,
    ['C'] = 0x1c, ['D'] = 0x1d, ['E'] = 0x1e, ['F'] = 0x1f,
};

bool kc_hex_decode(const char *hex, uint8_t *out, size_t n)
{
    /* entries are value | 0x10, so 0 marks a non-digit */
    for (size_t i = 0; i < n; i++) {
        unsigned hi = hex_table[(unsigned char)hex[2 * i]];
        if (!hi) /* before the next character: a short string ends here */
            return false;
        unsigned lo = hex_table[(unsigned char)hex[2 * i + 1]];
        if (!lo)
            return false;
        out[i] = (uint8_t)((hi & 15) << 4 | (lo & 15));
    }
    return true;
}

bool kc_key_valid(const char *s)
{
    if (!s || strnlen(s, KC_KEY_HEX_LEN + 1) != KC_KEY_HEX_LEN)
        return false;
    /* no test per digit: every store call and memory-cache drop checks its
     * key, and a branch on "digit or letter" mispredicts on half of them
     * (208 ns a key here, against 14 without) */
    unsigned bad = 0;
    for (int i = 0; i < KC_KEY_HEX_LEN; i++) {
        unsigned c = (unsigned char)s[i];
        bad |= (c - '0' > 9u) & (c - 'a' > 5u);
    }
    return bad == 0;
}

bool kc_ct_equal(const void *a, const void *b, size_t len)
{
    return memeql_sec(a, b, len) != 0;
}
