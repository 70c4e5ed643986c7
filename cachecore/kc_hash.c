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

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

bool kc_hex_decode(const char *hex, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(hex[2 * i]);
        if (hi < 0)
            return false;
        int lo = hexval(hex[2 * i + 1]);
        if (lo < 0)
            return false;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return true;
}

bool kc_key_valid(const char *s)
{
    if (!s)
        return false;
    for (int i = 0; i < KC_KEY_HEX_LEN; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return false;
    }
    return s[KC_KEY_HEX_LEN] == '\0';
}

bool kc_ct_equal(const void *a, const void *b, size_t len)
{
    return memeql_sec(a, b, len) != 0;
}
