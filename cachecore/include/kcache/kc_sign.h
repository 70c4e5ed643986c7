/*
 * kc_sign.h - artifact signing (docs/DESIGN.md §8: a puller can refuse
 * artifacts not signed by a trusted key; Ed25519 via OpenSSL).
 *
 * A build host signs each artifact it publishes; the signature travels in
 * the artifact's metadata, so it survives the store, the server and bundles
 * unchanged:
 *
 *   "sig": "ed25519:KEYID:SIGNATURE"
 *
 * KEYID is 16 hex digits (the first 8 bytes of SHA-256 of the 32-byte raw
 * public key), SIGNATURE 128 hex digits. What is signed binds the content to
 * its key, the two things a wrong artifact would change:
 *
 *   "kcache-artifact-sig/1\n" KEY "\n" KIND "\n" PAYLOAD_LEN "\n"
 *   hex(SHA-256 of the payload) "\n"
 *
 * Other metadata (device, tag, created) is not signed: it steers filters,
 * not what a compile loads. Keys are ordinary PEM files:
 *   openssl genpkey -algorithm ed25519 -out sign.pem
 *   openssl pkey -in sign.pem -pubout -out trusted.pem
 * A trust file holds one or more public keys (PEM blocks, concatenated).
 */
#ifndef KC_SIGN_H
#define KC_SIGN_H

#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_envelope.h>
#include <kcache/kc_error.h>

#define KC_SIG_KEYID_HEX 16
#define KC_SIG_TEXT_MAX 160 /* "ed25519:" + keyid + ":" + 128 hex + NUL */

typedef struct kc_signer kc_signer;
typedef struct kc_trust kc_trust;

/* Loads an Ed25519 private key from a PEM file. KC_ERR_NOT_FOUND / KC_ERR_IO
 * for the file, KC_ERR_INVALID when it is not an Ed25519 private key; the
 * message names the path. Free with kc_signer_free. */
kc_code kc_signer_load(const char *pem_path, kc_signer **out, kc_err *err);
void kc_signer_free(kc_signer *s);

/* The signer's key id (16 hex digits, NUL-terminated). */
const char *kc_signer_keyid(const kc_signer *s);

/* Signs an envelope header at the start of buf (an envelope, or a bundle's
 * compressed-artifact record: whatever follows the header is kept as is):
 * *out (malloc'd, caller frees) receives the same bytes with "sig" set in
 * the header's metadata, replacing any earlier signature. KC_ERR_INVALID /
 * KC_ERR_CORRUPT when buf does not start with a valid header. */
kc_code kc_sign_header(const kc_signer *s, const uint8_t *buf, size_t len, uint8_t **out,
                       size_t *out_len, kc_err *err);

/* Loads the public keys of a trust file (at least one). Errors name the
 * path. Free with kc_trust_free. */
kc_code kc_trust_load(const char *pem_path, kc_trust **out, kc_err *err);
void kc_trust_free(kc_trust *t);

/* KC_OK when meta carries a signature by a key of t over (key, kind,
 * payload_len, payload_sha). Otherwise KC_ERR_UNTRUSTED, the message naming
 * the artifact key and why: unsigned, signed by an unknown key (its id), or
 * a signature that does not verify. Thread-safe. */
kc_code kc_trust_check(const kc_trust *t, const char *key, const char *kind, uint64_t payload_len,
                       const uint8_t payload_sha[KC_SHA256_LEN], const char *meta, kc_err *err);

#endif
