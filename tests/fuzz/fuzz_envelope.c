/*
 * fuzz_envelope.c - libFuzzer target for the artifact envelope decoder
 * (kc_envelope_decode, kc_envelope_parse_header): whatever the bytes, no
 * crash, and whatever is accepted is self-consistent and re-encodes to the
 * very same bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_envelope.h>
#include "kc_fuzz.h"
#include <kcache/kc_hash.h>

/* The header parser must be total on every prefix it is given. */
static void check_header(const uint8_t *data, size_t len)
{
    kc_envelope_header h;
    memset(&h, 0, sizeof h);
    kc_err err = {0};
    kc_code rc = kc_envelope_parse_header(data, len, &h, &err);
    if (rc == KC_OK) {
        KC_FUZZ_CHECK(h.header_len <= len, "header_len %zu > input %zu", h.header_len, len);
        KC_FUZZ_CHECK(h.header_len >= KC_ENVELOPE_FIXED_LEN, "header_len %zu", h.header_len);
        KC_FUZZ_CHECK(kc_key_valid(h.key), "accepted header with bad key");
        KC_FUZZ_CHECK(h.meta != NULL, "accepted header without metadata");
        KC_FUZZ_CHECK(strlen(h.kind) >= 1 && strlen(h.kind) <= KC_KIND_MAX, "kind length");
        kc_envelope_header_free(&h);
    } else {
        KC_FUZZ_CHECK(err.code == rc, "error code %d but err.code %d", rc, err.code);
        KC_FUZZ_CHECK(err.msg[0] != '\0', "error %s without a message", kc_code_name(rc));
        if (h.meta)
            kc_envelope_header_free(&h);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    /* Copy into an exact-size heap buffer so ASan sees any over-read. */
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, len);

    check_header(buf, len);
    /* Every proper prefix of a header is "need more", never a crash. */
    if (len > 0)
        check_header(buf, len / 2);

    kc_artifact a;
    memset(&a, 0, sizeof a);
    kc_err err = {0};
    kc_code rc = kc_envelope_decode(buf, len, &a, &err);
    if (rc == KC_OK) {
        KC_FUZZ_CHECK(kc_key_valid(a.key), "decoded bad key");
        KC_FUZZ_CHECK(kc_kind_valid(a.kind) || a.kind[0], "decoded empty kind");
        KC_FUZZ_CHECK(a.meta != NULL, "decoded without metadata");
        uint8_t sha[KC_SHA256_LEN];
        kc_sha256(a.payload, a.payload_len, sha);
        KC_FUZZ_CHECK(memcmp(sha, a.payload_sha, sizeof sha) == 0,
                      "decoded payload does not match its digest");

        /* A strict decoder accepts exactly one encoding: re-encode and compare. */
        uint8_t *again = NULL;
        size_t again_len = 0;
        kc_err e2 = {0};
        kc_code rc2 = kc_envelope_encode(&a, &again, &again_len, &e2);
        KC_FUZZ_CHECK(rc2 == KC_OK, "re-encoding a decoded envelope failed: %s", e2.msg);
        KC_FUZZ_CHECK(again_len == len && memcmp(again, buf, len) == 0,
                      "re-encoding differs (%zu vs %zu bytes)", again_len, len);
        free(again);

        kc_envelope_header h;
        memset(&h, 0, sizeof h);
        rc2 = kc_envelope_parse_header(buf, len, &h, &e2);
        KC_FUZZ_CHECK(rc2 == KC_OK, "decode ok but header rejected: %s", e2.msg);
        KC_FUZZ_CHECK(h.header_len + h.payload_len == len, "header says %zu + %llu, input %zu",
                      h.header_len, (unsigned long long)h.payload_len, len);
        KC_FUZZ_CHECK(strcmp(h.key, a.key) == 0, "header and decode disagree on the key");
        kc_envelope_header_free(&h);
        kc_artifact_free(&a);
    } else {
        KC_FUZZ_CHECK(err.msg[0] != '\0', "decode error %s without a message", kc_code_name(rc));
        KC_FUZZ_CHECK(a.payload == NULL && a.meta == NULL, "failed decode left memory");
    }
    free(buf);
    return 0;
}
