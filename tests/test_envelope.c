/*
 * test_envelope.c - the envelope encoder and its strict decoder: round trips,
 * and truncated, bit-flipped, trailing and garbage input all rejected with an
 * error (never a crash, never a wrong artifact).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_envelope.h>
#include "kc_testutil.h"

static void make(kc_artifact *a, size_t n, const char *meta)
{
    uint8_t *p = malloc(n + 1);
    kc_test_fill_random(p, n, n);
    char key[65];
    kc_sha256_hex(p, n, key);
    kc_err e;
    cr_assert_eq(kc_artifact_init(a, key, "cpu-so", meta, p, n, &e), KC_OK, "%s", e.msg);
    free(p);
}

Test(envelope, round_trips_artifacts)
{
    size_t sizes[] = {0, 1, 100, 4096, 100000};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        kc_artifact a, b;
        make(&a, sizes[i], "{\"device\":\"cpu-x86_64-v3\",\"tag\":\"nightly\"}");
        uint8_t *buf;
        size_t len;
        kc_err e;
        cr_assert_eq(kc_envelope_encode(&a, &buf, &len, &e), KC_OK);
        cr_assert_eq(len, kc_envelope_header_size(6, strlen(a.meta)) + sizes[i]);
        cr_assert_eq(kc_envelope_decode(buf, len, &b, &e), KC_OK, "%s", e.msg);
        cr_assert_str_eq(a.key, b.key);
        cr_assert_str_eq(b.kind, "cpu-so");
        cr_assert_str_eq(a.meta, b.meta);
        cr_assert_eq(a.payload_len, b.payload_len);
        cr_assert(memcmp(a.payload, b.payload, a.payload_len) == 0);
        cr_assert(memcmp(a.payload_sha, b.payload_sha, 32) == 0);
        kc_envelope_header h;
        cr_assert_eq(kc_envelope_parse_header(buf, len, &h, &e), KC_OK);
        cr_assert_eq(h.payload_len, sizes[i]);
        cr_assert_eq(h.header_len, len - sizes[i]);
        kc_envelope_header_free(&h);
        free(buf);
        kc_artifact_free(&a);
        kc_artifact_free(&b);
    }
}

Test(envelope, null_meta_becomes_empty_object)
{
    kc_artifact a;
    make(&a, 10, NULL);
    cr_assert_str_eq(a.meta, "{}");
    kc_artifact_free(&a);
}

Test(envelope, init_rejects_bad_key_kind_and_meta)
{
    kc_artifact a;
    kc_err e;
    char key[65];
    kc_sha256_hex("x", 1, key);
    cr_assert_eq(kc_artifact_init(&a, "nothex", "blob", NULL, "x", 1, &e), KC_ERR_INVALID);
    cr_assert_eq(kc_artifact_init(&a, key, "", NULL, "x", 1, &e), KC_ERR_INVALID);
    cr_assert_eq(kc_artifact_init(&a, key, "Bad Kind!", NULL, "x", 1, &e), KC_ERR_INVALID);
    cr_assert_eq(kc_artifact_init(&a, key, "blob", "[1,2]", "x", 1, &e), KC_ERR_INVALID);
    cr_assert_eq(kc_artifact_init(&a, key, "blob", "{bad json", "x", 1, &e), KC_ERR_INVALID);
    cr_assert(kc_kind_valid("spirv"));
    cr_assert(kc_kind_valid("exe")); /* kinds are open */
    cr_assert_not(kc_kind_valid("Exe"));
}

Test(envelope, rejects_every_truncation)
{
    kc_artifact a, b;
    make(&a, 300, "{\"tag\":\"t\"}");
    uint8_t *buf;
    size_t len;
    kc_err e;
    cr_assert_eq(kc_envelope_encode(&a, &buf, &len, &e), KC_OK);
    for (size_t n = 0; n < len; n++) {
        uint8_t *copy = malloc(n ? n : 1); /* exact-size copy so ASan sees overreads */
        memcpy(copy, buf, n);
        kc_code rc = kc_envelope_decode(copy, n, &b, &e);
        cr_assert_neq(rc, KC_OK, "truncated to %zu bytes accepted", n);
        cr_assert(e.msg[0] != '\0');
        cr_assert_null(b.payload);
        free(copy);
    }
    free(buf);
    kc_artifact_free(&a);
}

Test(envelope, rejects_every_single_bit_flip)
{
    kc_artifact a, b;
    make(&a, 64, "{\"device\":\"d\"}");
    uint8_t *buf;
    size_t len;
    kc_err e;
    cr_assert_eq(kc_envelope_encode(&a, &buf, &len, &e), KC_OK);
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit++) {
            buf[i] ^= (uint8_t)(1 << bit);
            kc_code rc = kc_envelope_decode(buf, len, &b, &e);
            cr_assert_neq(rc, KC_OK, "flip of bit %d in byte %zu accepted", bit, i);
            buf[i] ^= (uint8_t)(1 << bit);
        }
    }
    cr_assert_eq(kc_envelope_decode(buf, len, &b, &e), KC_OK);
    kc_artifact_free(&b);
    free(buf);
    kc_artifact_free(&a);
}

Test(envelope, rejects_trailing_bytes_and_garbage)
{
    kc_artifact a, b;
    make(&a, 50, NULL);
    uint8_t *buf;
    size_t len;
    kc_err e;
    cr_assert_eq(kc_envelope_encode(&a, &buf, &len, &e), KC_OK);
    uint8_t *longer = malloc(len + 1);
    memcpy(longer, buf, len);
    longer[len] = 0;
    cr_assert_eq(kc_envelope_decode(longer, len + 1, &b, &e), KC_ERR_INVALID);
    cr_assert(strstr(e.msg, "trailing"));
    free(longer);
    for (uint64_t seed = 1; seed < 2000; seed++) {
        uint8_t g[512];
        size_t n = (size_t)(seed * 37 % sizeof g);
        kc_test_fill_random(g, n, seed);
        if (seed % 3 == 0 && n >= 4)
            memcpy(g, "KCAE\x01\x00", n >= 6 ? 6 : 4); /* get past the magic */
        cr_assert_neq(kc_envelope_decode(g, n, &b, &e), KC_OK);
    }
    free(buf);
    kc_artifact_free(&a);
}

Test(envelope, rejects_unknown_version_and_huge_lengths)
{
    kc_artifact a, b;
    make(&a, 10, NULL);
    uint8_t *buf;
    size_t len;
    kc_err e;
    cr_assert_eq(kc_envelope_encode(&a, &buf, &len, &e), KC_OK);
    buf[4] = 9;
    cr_assert_eq(kc_envelope_decode(buf, len, &b, &e), KC_ERR_VERSION);
    buf[4] = 1;
    buf[8] = 0xff, buf[9] = 0xff, buf[10] = 0xff, buf[11] = 0x7f; /* meta length 2 GiB */
    cr_assert_eq(kc_envelope_decode(buf, len, &b, &e), KC_ERR_INVALID);
    free(buf);
    kc_artifact_free(&a);
}

Test(envelope, parse_header_reports_bytes_needed)
{
    kc_artifact a;
    make(&a, 1000, "{\"k\":1}");
    uint8_t *buf;
    size_t len;
    kc_err e;
    cr_assert_eq(kc_envelope_encode(&a, &buf, &len, &e), KC_OK);
    kc_envelope_header h;
    cr_assert_eq(kc_envelope_parse_header(buf, 20, &h, &e), KC_ERR_TRUNCATED);
    cr_assert_eq(h.header_len, kc_envelope_header_size(6, 7));
    cr_assert_eq(kc_envelope_parse_header(buf, h.header_len, &h, &e), KC_OK);
    cr_assert_eq(h.payload_len, 1000);
    kc_envelope_header_free(&h);
    free(buf);
    kc_artifact_free(&a);
}
