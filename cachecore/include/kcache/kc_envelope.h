/*
 * kc_envelope.h - the artifact envelope: what travels between store, bundle
 * and server.
 *
 * Wire format (all integers little-endian), version 1:
 *
 *   off  size  field
 *     0     4  magic "KCAE"
 *     4     2  format version (1)
 *     6     2  kind length K (1..KC_KIND_MAX)
 *     8     4  metadata length M (0..KC_META_MAX), a JSON object
 *    12     8  payload length P
 *    20    32  SHA-256 of the payload
 *    52    64  artifact key, lowercase hex
 *   116     K  kind (e.g. "cpu-so")
 *     .     M  metadata JSON
 *     .    32  SHA-256 of every byte above (the header checksum)
 *     .     P  payload
 *
 * The header carries the payload's digest, so a store that keeps payloads by
 * content hash can rebuild the exact envelope without rehashing, and a reader
 * can check the header before it trusts any length in it.
 *
 * Metadata keys with meaning to the store (all optional): "device" (device
 * fingerprint id, string), "tag" (string), "created" (unix seconds),
 * "graph_fp", "compile_ms" (compile time this artifact saves).
 */
#ifndef KC_ENVELOPE_H
#define KC_ENVELOPE_H

#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_error.h>
#include <kcache/kc_hash.h>

#define KC_ENVELOPE_MAGIC "KCAE"
#define KC_ENVELOPE_VERSION 1
#define KC_ENVELOPE_FIXED_LEN 116
#define KC_KIND_MAX 32
#define KC_META_MAX (1u << 20)
#define KC_PAYLOAD_MAX (1ull << 32) /* 4 GiB: anything larger is rejected */

/* An artifact in memory. kc_artifact_free releases meta and payload. */
typedef struct kc_artifact {
    char key[KC_KEY_HEX_LEN + 1];
    char kind[KC_KIND_MAX + 1];
    char *meta;       /* NUL-terminated JSON object text, owned; never NULL after decode */
    uint8_t *payload; /* owned */
    size_t payload_len;
    uint8_t payload_sha[KC_SHA256_LEN];
} kc_artifact;

/* Parsed header of an envelope (everything before the payload). */
typedef struct kc_envelope_header {
    char key[KC_KEY_HEX_LEN + 1];
    char kind[KC_KIND_MAX + 1];
    char *meta; /* owned by the header: free with kc_envelope_header_free */
    uint64_t payload_len;
    uint8_t payload_sha[KC_SHA256_LEN];
    size_t header_len; /* bytes before the payload */
} kc_envelope_header;

/* Artifact kinds are open: any name matching [a-z0-9][a-z0-9._-]{0,31} is
 * accepted everywhere (store, envelope, bundle, server, CLI filters), so other
 * tools' artifacts can carry their own kind; the built-in kinds kcache writes
 * and interprets are graph, cpu-so, spirv, ze-native, autotune, onednn-blob,
 * blob, and dir-manifest and dir-file (directory snapshots, kc_snapshot.h).
 * kc_kind_valid says whether kind
 * (NULL-safe) is such a name; KC_KIND_RULE is the rule for error messages. */
#define KC_KIND_RULE                                                                               \
    "a kind is 1-32 characters of a-z, 0-9, '.', '_' or '-', starting with a-z or 0-9"
int kc_kind_valid(const char *kind);

/* Tags ("tag" metadata, --tag): 1..KC_TAG_MAX characters from
 * [A-Za-z0-9._+@/:=-], so a tag can never be JSON, shell or URL syntax
 * (a git branch name with other characters must be mapped first).
 * KC_OK, or KC_ERR_INVALID with a message naming the tag and the rule. */
#define KC_TAG_MAX 128
kc_code kc_tag_check(const char *tag, kc_err *err);

/* Builds an artifact from parts; copies everything. meta may be NULL ("{}").
 * The payload digest is computed here. Returns KC_ERR_INVALID for a bad key,
 * kind or meta that is not a JSON object. Caller frees with kc_artifact_free. */
kc_code kc_artifact_init(kc_artifact *a, const char *key, const char *kind, const char *meta,
                         const void *payload, size_t payload_len, kc_err *err);
void kc_artifact_free(kc_artifact *a);

/* Size of the header for a kind and metadata of the given lengths. */
size_t kc_envelope_header_size(size_t kind_len, size_t meta_len);

/* Writes the header of a (kind, meta, payload_len, payload_sha) into buf,
 * which must hold kc_envelope_header_size() bytes. Returns bytes written. */
size_t kc_envelope_write_header(uint8_t *buf, const char *key, const char *kind, const char *meta,
                                uint64_t payload_len, const uint8_t payload_sha[KC_SHA256_LEN]);

/* Encodes a whole envelope into a malloc'd buffer (*out, *out_len; caller
 * frees with free()). */
kc_code kc_envelope_encode(const kc_artifact *a, uint8_t **out, size_t *out_len, kc_err *err);

/* Parses a header from the first len bytes of buf. Returns KC_ERR_TRUNCATED
 * when more bytes are needed (h->header_len is then the bytes needed if known,
 * else 0), KC_ERR_INVALID / KC_ERR_VERSION / KC_ERR_CORRUPT for a bad header.
 * On success the caller owns h->meta (kc_envelope_header_free). */
kc_code kc_envelope_parse_header(const uint8_t *buf, size_t len, kc_envelope_header *h,
                                 kc_err *err);
void kc_envelope_header_free(kc_envelope_header *h);

/* Strict decoder of a complete envelope: exactly header + payload, nothing
 * more. Verifies both checksums. On success fills a (caller frees with
 * kc_artifact_free); on failure a is left empty. */
kc_code kc_envelope_decode(const uint8_t *buf, size_t len, kc_artifact *a, kc_err *err);

#endif
