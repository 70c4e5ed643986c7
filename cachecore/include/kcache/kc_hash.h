/*
 * kc_hash.h - SHA-256 (GNU Nettle, streaming) and key helpers.
 *
 * Every key in kcache is 64 lowercase hex characters of a SHA-256. Keys are
 * validated with kc_key_valid before they touch storage or a URL.
 */
#ifndef KC_HASH_H
#define KC_HASH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KC_SHA256_LEN 32
#define KC_KEY_HEX_LEN 64

typedef struct kc_sha256_ctx kc_sha256_ctx; /* opaque streaming context */

/* Returns a new context ready for updates, or NULL when out of memory.
 * Free with kc_sha256_free. */
kc_sha256_ctx *kc_sha256_new(void);
void kc_sha256_update(kc_sha256_ctx *ctx, const void *data, size_t len);
/* Writes the digest; the context may then be reused after kc_sha256_reset. */
void kc_sha256_final(kc_sha256_ctx *ctx, uint8_t out[KC_SHA256_LEN]);
void kc_sha256_reset(kc_sha256_ctx *ctx);
void kc_sha256_free(kc_sha256_ctx *ctx);

/* One-shot digest of a buffer. */
void kc_sha256(const void *data, size_t len, uint8_t out[KC_SHA256_LEN]);
/* One-shot digest as 64 lowercase hex characters plus NUL. */
void kc_sha256_hex(const void *data, size_t len, char out[KC_KEY_HEX_LEN + 1]);

/* Lowercase hex of n bytes into out (2n+1 bytes, NUL-terminated). */
void kc_hex_encode(const uint8_t *in, size_t n, char *out);
/* Parses 2n hex characters into n bytes; false on any non-hex character. */
bool kc_hex_decode(const char *hex, uint8_t *out, size_t n);

/* True when s is exactly 64 lowercase hex characters (NUL-terminated). */
bool kc_key_valid(const char *s);

/* Constant-time comparison of two equal-length buffers (tokens, digests). */
bool kc_ct_equal(const void *a, const void *b, size_t len);

#endif
