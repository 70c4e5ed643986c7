/*
 * kc_envelope.c - encoder and strict decoder of the artifact envelope (see
 * kc_envelope.h for the wire format). The decoder checks every length before
 * trusting it and both checksums before returning anything.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "kc_bytes.h"
#include <kcache/kc_envelope.h>

/* A kind: [a-z0-9][a-z0-9._-]{0,31} (1..KC_KIND_MAX characters). */
static int kind_chars_ok(const uint8_t *k, size_t n)
{
    if (n == 0 || n > KC_KIND_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = k[i];
        bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
        if (!alnum && (i == 0 || (c != '.' && c != '_' && c != '-')))
            return 0;
    }
    return 1;
}

int kc_kind_valid(const char *kind)
{
    return kind && kind_chars_ok((const uint8_t *)kind, strnlen(kind, KC_KIND_MAX + 1));
}

kc_code kc_tag_check(const char *tag, kc_err *err)
{
    static const char extra[] = "._+@/:=-";
    size_t n = tag ? strlen(tag) : 0;
    if (n == 0 || n > KC_TAG_MAX)
        return kc_err_set(err, KC_ERR_INVALID, "tag of %zu characters: a tag has 1 to %d", n,
                          KC_TAG_MAX);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)tag[i];
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            (c && strchr(extra, c)))
            continue;
        return kc_err_set(err, KC_ERR_INVALID,
                          "tag '%.*s': character %zu (0x%02x) is not allowed (tags use "
                          "A-Z a-z 0-9 and %s)",
                          (int)(n < 80 ? n : 80), c >= 32 && c < 127 ? tag : "(not printable)",
                          i + 1, c, extra);
    }
    return KC_OK;
}

/* True when meta (len bytes) is a JSON object with no embedded NUL. */
static int meta_is_object(const char *meta, size_t len)
{
    if (memchr(meta, '\0', len))
        return 0;
    json_error_t jerr;
    json_t *j = json_loadb(meta, len, 0, &jerr);
    int ok = j && json_is_object(j);
    json_decref(j);
    return ok;
}

kc_code kc_artifact_init(kc_artifact *a, const char *key, const char *kind, const char *meta,
                         const void *payload, size_t payload_len, kc_err *err)
{
    memset(a, 0, sizeof *a);
    if (!kc_key_valid(key))
        return kc_err_set(err, KC_ERR_INVALID, "invalid key '%.80s' (need 64 lowercase hex)",
                          key ? key : "(null)");
    if (!kc_kind_valid(kind))
        return kc_err_set(err, KC_ERR_INVALID, "invalid kind '%.40s' for key %s (" KC_KIND_RULE ")",
                          kind ? kind : "(null)", key);
    if (!meta)
        meta = "{}";
    size_t mlen = strlen(meta);
    if (mlen > KC_META_MAX)
        return kc_err_set(err, KC_ERR_TOO_LARGE, "metadata of key %s is %zu bytes (max %u)", key,
                          mlen, KC_META_MAX);
    if (!meta_is_object(meta, mlen))
        return kc_err_set(err, KC_ERR_INVALID, "metadata of key %s is not a JSON object", key);
    if ((uint64_t)payload_len > KC_PAYLOAD_MAX)
        return kc_err_set(err, KC_ERR_TOO_LARGE, "payload of key %s is too large (%zu bytes)", key,
                          payload_len);
    a->meta = strdup(meta);
    a->payload = malloc(payload_len ? payload_len : 1);
    if (!a->meta || !a->payload) {
        kc_artifact_free(a);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory building artifact %s", key);
    }
    if (payload_len)
        memcpy(a->payload, payload, payload_len);
    a->payload_len = payload_len;
    memcpy(a->key, key, KC_KEY_HEX_LEN + 1);
    snprintf(a->kind, sizeof a->kind, "%s", kind);
    kc_sha256(payload, payload_len, a->payload_sha);
    return KC_OK;
}

void kc_artifact_free(kc_artifact *a)
{
    if (!a)
        return;
    free(a->meta);
    free(a->payload);
    memset(a, 0, sizeof *a);
}

size_t kc_envelope_header_size(size_t kind_len, size_t meta_len)
{
    return KC_ENVELOPE_FIXED_LEN + kind_len + meta_len + KC_SHA256_LEN;
}

size_t kc_envelope_write_header(uint8_t *buf, const char *key, const char *kind, const char *meta,
                                uint64_t payload_len, const uint8_t payload_sha[KC_SHA256_LEN])
{
    size_t klen = strlen(kind), mlen = meta ? strlen(meta) : 0;
    memcpy(buf, KC_ENVELOPE_MAGIC, 4);
    kc_put_u16(buf + 4, KC_ENVELOPE_VERSION);
    kc_put_u16(buf + 6, (uint16_t)klen);
    kc_put_u32(buf + 8, (uint32_t)mlen);
    kc_put_u64(buf + 12, payload_len);
    memcpy(buf + 20, payload_sha, KC_SHA256_LEN);
    memcpy(buf + 52, key, KC_KEY_HEX_LEN);
    size_t off = KC_ENVELOPE_FIXED_LEN;
    memcpy(buf + off, kind, klen);
    off += klen;
    if (mlen)
        memcpy(buf + off, meta, mlen);
    off += mlen;
    kc_sha256(buf, off, buf + off);
    return off + KC_SHA256_LEN;
}

kc_code kc_envelope_encode(const kc_artifact *a, uint8_t **out, size_t *out_len, kc_err *err)
{
    *out = NULL;
    *out_len = 0;
    const char *meta = a->meta ? a->meta : "{}";
    size_t hlen = kc_envelope_header_size(strlen(a->kind), strlen(meta));
    if (hlen + a->payload_len < hlen)
        return kc_err_set(err, KC_ERR_TOO_LARGE, "artifact %s is too large", a->key);
    uint8_t *buf = malloc(hlen + a->payload_len);
    if (!buf)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory encoding artifact %s", a->key);
    kc_envelope_write_header(buf, a->key, a->kind, meta, a->payload_len, a->payload_sha);
    if (a->payload_len)
        memcpy(buf + hlen, a->payload, a->payload_len);
    *out = buf;
    *out_len = hlen + a->payload_len;
    return KC_OK;
}

kc_code kc_envelope_parse_header(const uint8_t *buf, size_t len, kc_envelope_header *h, kc_err *err)
{
    memset(h, 0, sizeof *h);
    size_t m = len < 4 ? len : 4;
    if (memcmp(buf, KC_ENVELOPE_MAGIC, m) != 0)
        return kc_err_set(err, KC_ERR_INVALID, "not an artifact envelope (bad magic)");
    if (len >= 6 && kc_get_u16(buf + 4) != KC_ENVELOPE_VERSION)
        return kc_err_set(err, KC_ERR_VERSION,
                          "unsupported envelope version %u (this build reads %d)",
                          kc_get_u16(buf + 4), KC_ENVELOPE_VERSION);
    if (len < 12)
        return kc_err_set(err, KC_ERR_TRUNCATED,
                          "envelope truncated in its fixed header (%zu bytes)", len);
    uint16_t klen = kc_get_u16(buf + 6);
    uint32_t mlen = kc_get_u32(buf + 8);
    if (klen == 0 || klen > KC_KIND_MAX)
        return kc_err_set(err, KC_ERR_INVALID, "envelope kind length %u out of range 1..%d", klen,
                          KC_KIND_MAX);
    if (mlen > KC_META_MAX)
        return kc_err_set(err, KC_ERR_INVALID, "envelope metadata length %u exceeds %u", mlen,
                          KC_META_MAX);
    size_t hlen = kc_envelope_header_size(klen, mlen);
    if (len < hlen) {
        h->header_len = hlen;
        return kc_err_set(err, KC_ERR_TRUNCATED,
                          "envelope truncated: header needs %zu bytes, have %zu", hlen, len);
    }
    uint8_t sum[KC_SHA256_LEN];
    kc_sha256(buf, hlen - KC_SHA256_LEN, sum);
    if (!kc_ct_equal(sum, buf + hlen - KC_SHA256_LEN, KC_SHA256_LEN))
        return kc_err_set(err, KC_ERR_CORRUPT, "envelope header checksum mismatch");
    uint64_t plen = kc_get_u64(buf + 12);
    if (plen > KC_PAYLOAD_MAX)
        return kc_err_set(err, KC_ERR_INVALID, "envelope payload length %llu exceeds the maximum",
                          (unsigned long long)plen);
    char key[KC_KEY_HEX_LEN + 1];
    memcpy(key, buf + 52, KC_KEY_HEX_LEN);
    key[KC_KEY_HEX_LEN] = '\0';
    if (!kc_key_valid(key))
        return kc_err_set(err, KC_ERR_INVALID, "envelope carries an invalid key");
    const uint8_t *kind = buf + KC_ENVELOPE_FIXED_LEN;
    if (!kind_chars_ok(kind, klen))
        return kc_err_set(err, KC_ERR_INVALID,
                          "envelope for %s carries an invalid kind (" KC_KIND_RULE ")", key);
    const char *meta = (const char *)kind + klen;
    if (mlen && !meta_is_object(meta, mlen))
        return kc_err_set(err, KC_ERR_INVALID, "envelope for %s: metadata is not a JSON object",
                          key);
    h->meta = malloc(mlen ? mlen + 1 : 3);
    if (!h->meta)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory parsing envelope %s", key);
    if (mlen) {
        memcpy(h->meta, meta, mlen);
        h->meta[mlen] = '\0';
    } else {
        strcpy(h->meta, "{}");
    }
    memcpy(h->key, key, sizeof key);
    memcpy(h->kind, kind, klen);
    h->kind[klen] = '\0';
    h->payload_len = plen;
    memcpy(h->payload_sha, buf + 20, KC_SHA256_LEN);
    h->header_len = hlen;
    return KC_OK;
}

void kc_envelope_header_free(kc_envelope_header *h)
{
    if (!h)
        return;
    free(h->meta);
    h->meta = NULL;
}

kc_code kc_envelope_decode(const uint8_t *buf, size_t len, kc_artifact *a, kc_err *err)
{
    memset(a, 0, sizeof *a);
    kc_envelope_header h;
    kc_code rc = kc_envelope_parse_header(buf, len, &h, err);
    if (rc != KC_OK)
        return rc;
    size_t avail = len - h.header_len;
    if ((uint64_t)avail < h.payload_len) {
        kc_envelope_header_free(&h);
        return kc_err_set(err, KC_ERR_TRUNCATED,
                          "envelope for %s truncated: payload needs %llu bytes, have %zu", h.key,
                          (unsigned long long)h.payload_len, avail);
    }
    if ((uint64_t)avail > h.payload_len) {
        kc_envelope_header_free(&h);
        return kc_err_set(err, KC_ERR_INVALID, "envelope for %s has %llu trailing bytes", h.key,
                          (unsigned long long)(avail - h.payload_len));
    }
    const uint8_t *payload = buf + h.header_len;
    uint8_t sum[KC_SHA256_LEN];
    kc_sha256(payload, (size_t)h.payload_len, sum);
    if (!kc_ct_equal(sum, h.payload_sha, KC_SHA256_LEN)) {
        kc_envelope_header_free(&h);
        return kc_err_set(err, KC_ERR_CORRUPT, "envelope for %s: payload checksum mismatch", h.key);
    }
    a->payload = malloc(h.payload_len ? (size_t)h.payload_len : 1);
    if (!a->payload) {
        kc_envelope_header_free(&h);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory decoding envelope %s", h.key);
    }
    if (h.payload_len)
        memcpy(a->payload, payload, (size_t)h.payload_len);
    a->payload_len = (size_t)h.payload_len;
    memcpy(a->key, h.key, sizeof a->key);
    memcpy(a->kind, h.kind, sizeof a->kind);
    memcpy(a->payload_sha, h.payload_sha, KC_SHA256_LEN);
    a->meta = h.meta; /* ownership moves to the artifact */
    return KC_OK;
}
