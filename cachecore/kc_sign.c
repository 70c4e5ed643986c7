/*
 * kc_sign.c - Ed25519 artifact signatures through OpenSSL EVP (format and
 * rules in kc_sign.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <kcache/kc_hash.h>
#include <kcache/kc_sign.h>

#define SIG_LEN 64
#define MSG_MAX 256
#define TRUST_MAX 64

struct kc_signer {
    EVP_PKEY *pkey;
    char keyid[KC_SIG_KEYID_HEX + 1];
};

typedef struct trusted_key {
    EVP_PKEY *pkey;
    char keyid[KC_SIG_KEYID_HEX + 1];
} trusted_key;

struct kc_trust {
    trusted_key keys[TRUST_MAX];
    size_t n;
};

/* First 8 bytes of SHA-256 of the raw public key, in hex. */
static bool key_id(EVP_PKEY *pkey, char out[KC_SIG_KEYID_HEX + 1])
{
    uint8_t raw[32], digest[KC_SHA256_LEN];
    size_t n = sizeof raw;
    if (EVP_PKEY_get_raw_public_key(pkey, raw, &n) != 1 || n != sizeof raw)
        return false;
    kc_sha256(raw, n, digest);
    kc_hex_encode(digest, KC_SIG_KEYID_HEX / 2, out);
    out[KC_SIG_KEYID_HEX] = '\0';
    return true;
}

/* The signed message (kc_sign.h); returns its length. */
static size_t signed_message(char *buf, const char *key, const char *kind, uint64_t payload_len,
                             const uint8_t sha[KC_SHA256_LEN])
{
    char hex[KC_SHA256_LEN * 2 + 1];
    kc_hex_encode(sha, KC_SHA256_LEN, hex);
    hex[KC_SHA256_LEN * 2] = '\0';
    int n = snprintf(buf, MSG_MAX, "kcache-artifact-sig/1\n%.64s\n%.32s\n%llu\n%s\n", key, kind,
                     (unsigned long long)payload_len, hex);
    return n > 0 && n < MSG_MAX ? (size_t)n : 0;
}

static FILE *open_pem(const char *path, kc_err *err)
{
    FILE *f = fopen(path, "r");
    if (!f)
        kc_err_errno(err, errno == ENOENT ? KC_ERR_NOT_FOUND : KC_ERR_IO, errno,
                     "cannot open key %s", path);
    return f;
}

kc_code kc_signer_load(const char *pem_path, kc_signer **out, kc_err *err)
{
    *out = NULL;
    FILE *f = open_pem(pem_path, err);
    if (!f)
        return err ? err->code : KC_ERR_IO;
    EVP_PKEY *pkey = PEM_read_PrivateKey(f, NULL, NULL, NULL);
    fclose(f);
    ERR_clear_error();
    if (!pkey || EVP_PKEY_get_id(pkey) != EVP_PKEY_ED25519) {
        EVP_PKEY_free(pkey);
        return kc_err_set(err, KC_ERR_INVALID,
                          "%s is not an Ed25519 private key in PEM (make one with: openssl "
                          "genpkey -algorithm ed25519 -out %s)",
                          pem_path, pem_path);
    }
    kc_signer *s = calloc(1, sizeof *s);
    if (!s || !key_id(pkey, s->keyid)) {
        free(s);
        EVP_PKEY_free(pkey);
        return kc_err_set(err, KC_ERR_NOMEM, "loading key %s: out of memory", pem_path);
    }
    s->pkey = pkey;
    *out = s;
    return KC_OK;
}

void kc_signer_free(kc_signer *s)
{
    if (!s)
        return;
    EVP_PKEY_free(s->pkey);
    free(s);
}

const char *kc_signer_keyid(const kc_signer *s)
{
    return s->keyid;
}

/* The "sig" text for one artifact. */
static kc_code sign_text(const kc_signer *s, const kc_envelope_header *h, char out[KC_SIG_TEXT_MAX],
                         kc_err *err)
{
    char msg[MSG_MAX];
    size_t mlen = signed_message(msg, h->key, h->kind, h->payload_len, h->payload_sha);
    uint8_t sig[SIG_LEN];
    size_t slen = sizeof sig;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int ok = ctx && mlen && EVP_DigestSignInit(ctx, NULL, NULL, NULL, s->pkey) == 1 &&
             EVP_DigestSign(ctx, sig, &slen, (const uint8_t *)msg, mlen) == 1 && slen == SIG_LEN;
    EVP_MD_CTX_free(ctx);
    ERR_clear_error();
    if (!ok)
        return kc_err_set(err, KC_ERR_INVALID, "signing %s failed", h->key);
    char hex[SIG_LEN * 2 + 1];
    kc_hex_encode(sig, SIG_LEN, hex);
    hex[SIG_LEN * 2] = '\0';
    snprintf(out, KC_SIG_TEXT_MAX, "ed25519:%s:%s", s->keyid, hex);
    return KC_OK;
}

kc_code kc_sign_header(const kc_signer *s, const uint8_t *buf, size_t len, uint8_t **out,
                       size_t *out_len, kc_err *err)
{
    *out = NULL;
    *out_len = 0;
    kc_envelope_header h;
    kc_code code = kc_envelope_parse_header(buf, len, &h, err);
    if (code == KC_ERR_TRUNCATED)
        return kc_err_set(err, KC_ERR_INVALID, "cannot sign: the envelope header is cut short");
    if (code != KC_OK)
        return code;
    char sig[KC_SIG_TEXT_MAX];
    char *meta = NULL;
    json_t *j = NULL;
    if ((code = sign_text(s, &h, sig, err)) == KC_OK) {
        j = json_loads(h.meta, 0, NULL);
        if (j && json_is_object(j) && json_object_set_new(j, "sig", json_string(sig)) == 0)
            meta = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!meta)
            code = kc_err_set(err, KC_ERR_NOMEM, "signing %s: out of memory", h.key);
        else if (strlen(meta) > KC_META_MAX)
            code = kc_err_set(err, KC_ERR_TOO_LARGE, "signing %s: metadata too large", h.key);
    }
    json_decref(j);
    size_t rest = len - h.header_len;
    size_t hlen = meta ? kc_envelope_header_size(strlen(h.kind), strlen(meta)) : 0;
    uint8_t *b = code == KC_OK ? malloc(hlen + rest) : NULL;
    if (code == KC_OK && !b)
        code = kc_err_set(err, KC_ERR_NOMEM, "signing %s: out of memory", h.key);
    if (code == KC_OK) {
        kc_envelope_write_header(b, h.key, h.kind, meta, h.payload_len, h.payload_sha);
        memcpy(b + hlen, buf + h.header_len, rest);
        *out = b;
        *out_len = hlen + rest;
    }
    free(meta);
    kc_envelope_header_free(&h);
    return code;
}

kc_code kc_trust_load(const char *pem_path, kc_trust **out, kc_err *err)
{
    *out = NULL;
    FILE *f = open_pem(pem_path, err);
    if (!f)
        return err ? err->code : KC_ERR_IO;
    kc_trust *t = calloc(1, sizeof *t);
    if (!t) {
        fclose(f);
        return kc_err_set(err, KC_ERR_NOMEM, "loading %s: out of memory", pem_path);
    }
    kc_code code = KC_OK;
    EVP_PKEY *pkey;
    while (code == KC_OK && (pkey = PEM_read_PUBKEY(f, NULL, NULL, NULL))) {
        if (EVP_PKEY_get_id(pkey) != EVP_PKEY_ED25519 || t->n == TRUST_MAX ||
            !key_id(pkey, t->keys[t->n].keyid)) {
            EVP_PKEY_free(pkey);
            code = kc_err_set(err, KC_ERR_INVALID,
                              "%s: public key %zu is not Ed25519 (or more than %d keys)", pem_path,
                              t->n + 1, TRUST_MAX);
            break;
        }
        t->keys[t->n++].pkey = pkey;
    }
    fclose(f);
    ERR_clear_error();
    if (code == KC_OK && t->n == 0)
        code = kc_err_set(err, KC_ERR_INVALID,
                          "%s holds no Ed25519 public key in PEM (make one with: openssl pkey "
                          "-in sign.pem -pubout)",
                          pem_path);
    if (code != KC_OK) {
        kc_trust_free(t);
        return code;
    }
    *out = t;
    return KC_OK;
}

void kc_trust_free(kc_trust *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++)
        EVP_PKEY_free(t->keys[i].pkey);
    free(t);
}

kc_code kc_trust_check(const kc_trust *t, const char *key, const char *kind, uint64_t payload_len,
                       const uint8_t payload_sha[KC_SHA256_LEN], const char *meta, kc_err *err)
{
    json_t *j = meta ? json_loads(meta, 0, NULL) : NULL;
    const char *text = json_string_value(json_object_get(j, "sig"));
    char keyid[KC_SIG_KEYID_HEX + 1], hex[SIG_LEN * 2 + 1];
    int used = 0;
    bool parsed =
        text && sscanf(text, "ed25519:%16[0-9a-f]:%128[0-9a-f]%n", keyid, hex, &used) == 2 &&
        text[used] == '\0' && strlen(keyid) == KC_SIG_KEYID_HEX && strlen(hex) == SIG_LEN * 2;
    json_decref(j);
    if (!parsed)
        return kc_err_set(err, KC_ERR_UNTRUSTED, "%s: not signed%s", key,
                          text ? " (malformed signature)" : "");
    const trusted_key *tk = NULL;
    for (size_t i = 0; i < t->n && !tk; i++)
        if (!strcmp(t->keys[i].keyid, keyid))
            tk = &t->keys[i];
    if (!tk)
        return kc_err_set(err, KC_ERR_UNTRUSTED, "%s: signed by key %s, which is not trusted", key,
                          keyid);
    uint8_t sig[SIG_LEN];
    char msg[MSG_MAX];
    size_t mlen = signed_message(msg, key, kind, payload_len, payload_sha);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int ok = ctx && mlen && kc_hex_decode(hex, sig, SIG_LEN) &&
             EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, tk->pkey) == 1 &&
             EVP_DigestVerify(ctx, sig, SIG_LEN, (const uint8_t *)msg, mlen) == 1;
    EVP_MD_CTX_free(ctx);
    ERR_clear_error();
    if (!ok)
        return kc_err_set(err, KC_ERR_UNTRUSTED,
                          "%s: the signature by key %s does not match the artifact", key, keyid);
    return KC_OK;
}
