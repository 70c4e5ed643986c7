/*
 * test_hash.c - SHA-256 (known vectors, streaming == one-shot), hex, key
 * validation, constant-time compare, size parsing and the error helpers.
 */
#include <criterion/criterion.h>
#include <string.h>

#include <kcache/kc_error.h>
#include <kcache/kc_hash.h>
#include <kcache/kc_util.h>

Test(hash, sha256_matches_known_vectors)
{
    char hex[65];
    kc_sha256_hex("", 0, hex);
    cr_assert_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    kc_sha256_hex("abc", 3, hex);
    cr_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    kc_sha256_hex(two_blocks, strlen(two_blocks), hex);
    cr_assert_str_eq(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

/* FIPS 180-2's million 'a's, streamed in pieces that straddle the 64-byte
 * blocks, and again after a reset: the digests keys are made of, pinned
 * whichever library computes them (OpenSSL EVP before, Nettle now). */
Test(hash, streamed_million_a_matches_known_vector)
{
    static char a[2048]; /* more than any piece */
    memset(a, 'a', sizeof a);
    kc_sha256_ctx *c = kc_sha256_new();
    cr_assert_not_null(c);
    for (int round = 0; round < 2; round++) {
        size_t left = 1000000;
        for (size_t n = 1; left; n = n % 997 + 37) {
            size_t take = n < left ? n : left;
            kc_sha256_update(c, a, take);
            left -= take;
        }
        uint8_t d[KC_SHA256_LEN];
        char hex[KC_KEY_HEX_LEN + 1];
        kc_sha256_final(c, d);
        kc_hex_encode(d, sizeof d, hex);
        cr_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
        kc_sha256_reset(c);
    }
    kc_sha256_free(c);
}

Test(hash, streaming_equals_one_shot)
{
    uint8_t buf[100000];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)(i * 7 + i / 13);
    uint8_t one[32], two[32];
    kc_sha256(buf, sizeof buf, one);
    kc_sha256_ctx *c = kc_sha256_new();
    cr_assert_not_null(c);
    for (size_t off = 0; off < sizeof buf; off += 777) {
        size_t n = sizeof buf - off < 777 ? sizeof buf - off : 777;
        kc_sha256_update(c, buf + off, n);
    }
    kc_sha256_final(c, two);
    cr_assert(memcmp(one, two, 32) == 0);
    kc_sha256_reset(c);
    kc_sha256_update(c, buf, sizeof buf);
    kc_sha256_final(c, two);
    cr_assert(memcmp(one, two, 32) == 0);
    kc_sha256_free(c);
}

Test(hash, hex_round_trips_and_rejects_non_hex)
{
    uint8_t in[4] = {0x00, 0xab, 0xff, 0x10}, out[4];
    char hex[9];
    kc_hex_encode(in, 4, hex);
    cr_assert_str_eq(hex, "00abff10");
    cr_assert(kc_hex_decode(hex, out, 4));
    cr_assert(memcmp(in, out, 4) == 0);
    cr_assert_not(kc_hex_decode("00zz", out, 2));
}

Test(hash, key_validation_accepts_only_64_lowercase_hex)
{
    char key[65];
    kc_sha256_hex("x", 1, key);
    cr_assert(kc_key_valid(key));
    key[10] = 'A';
    cr_assert_not(kc_key_valid(key));
    cr_assert_not(kc_key_valid(NULL));
    cr_assert_not(kc_key_valid(""));
    cr_assert_not(kc_key_valid("../../etc/passwd"));
    char longer[70];
    kc_sha256_hex("x", 1, longer);
    strcat(longer, "0");
    cr_assert_not(kc_key_valid(longer));
    cr_assert_not(kc_key_valid("abc"));
}

Test(hash, key_validation_checks_every_byte_value_at_every_position)
{
    char key[65];
    kc_sha256_hex("x", 1, key);
    for (int pos = 0; pos < 64; pos += 21) { /* first, middle and last digits */
        for (int b = 1; b < 256; b++) {
            char k[65];
            memcpy(k, key, sizeof k);
            k[pos] = (char)b;
            bool hex = (b >= '0' && b <= '9') || (b >= 'a' && b <= 'f');
            cr_assert_eq(kc_key_valid(k), hex, "byte 0x%02x at %d", b, pos);
        }
    }
    char cut[70];
    memcpy(cut, key, sizeof key);
    cut[63] = '\0'; /* 63 digits, then digits again past the end */
    memcpy(cut + 64, "abcde", 6);
    cr_assert_not(kc_key_valid(cut));
}

Test(hash, ct_equal_compares_contents)
{
    cr_assert(kc_ct_equal("abcd", "abcd", 4));
    cr_assert_not(kc_ct_equal("abcd", "abce", 4));
}

Test(util, parse_size_accepts_binary_units)
{
    uint64_t v;
    kc_err e;
    cr_assert_eq(kc_parse_size("4096", &v, &e), KC_OK);
    cr_assert_eq(v, 4096);
    cr_assert_eq(kc_parse_size("512M", &v, &e), KC_OK);
    cr_assert_eq(v, 512ull << 20);
    cr_assert_eq(kc_parse_size("10G", &v, &e), KC_OK);
    cr_assert_eq(v, 10ull << 30);
    cr_assert_eq(kc_parse_size("1T", &v, &e), KC_OK);
    cr_assert_eq(v, 1ull << 40);
    cr_assert_eq(kc_parse_size("2KiB", &v, &e), KC_OK);
    cr_assert_eq(v, 2048);
    cr_assert_eq(kc_parse_size("3mb", &v, &e), KC_OK);
    cr_assert_eq(v, 3ull << 20);
}

Test(util, parse_size_rejects_garbage_naming_it)
{
    uint64_t v;
    kc_err e;
    cr_assert_eq(kc_parse_size("12X", &v, &e), KC_ERR_INVALID);
    cr_assert(strstr(e.msg, "12X"));
    cr_assert_eq(kc_parse_size("", &v, &e), KC_ERR_INVALID);
    cr_assert_eq(kc_parse_size("-1", &v, &e), KC_ERR_INVALID);
    cr_assert_eq(kc_parse_size("99999999999999999999", &v, &e), KC_ERR_INVALID);
    cr_assert_eq(kc_parse_size("99999999999T", &v, &e), KC_ERR_INVALID);
}

Test(util, format_size_is_readable)
{
    char b[32];
    cr_assert_str_eq(kc_format_size(100, b, sizeof b), "100 B");
    cr_assert_str_eq(kc_format_size(1536, b, sizeof b), "1.5 KiB");
    cr_assert_str_eq(kc_format_size(10ull << 30, b, sizeof b), "10.0 GiB");
}

Test(util, edit_distance_counts_swaps_as_one)
{
    cr_expect_eq(kc_edit_distance("target", "target"), 0);
    cr_expect_eq(kc_edit_distance("taget", "target"), 1, "a dropped letter");
    cr_expect_eq(kc_edit_distance("tagret", "target"), 1, "two neighbours swapped");
    cr_expect_eq(kc_edit_distance("", "abc"), 3);
    cr_expect_eq(kc_edit_distance("kitten", "sitting"), 3);
    cr_expect_eq(kc_edit_distance("Target", "target"), 1, "case matters");
}

Test(util, nearest_names_the_likely_word_or_nothing)
{
    const char *const keys[] = {"device", "target", "cflags"};
    cr_expect_str_eq(kc_nearest("taget", keys, 3, sizeof keys[0], 0), "target");
    cr_expect_str_eq(kc_nearest("cflag", keys, 3, sizeof keys[0], 0), "cflags");
    cr_expect_str_eq(kc_nearest("devcie", keys, 3, sizeof keys[0], 0), "device");
    cr_expect_null(kc_nearest("shape", keys, 3, sizeof keys[0], 0), "too far to be a typo");
    cr_expect_null(kc_nearest("x", keys, 3, sizeof keys[0], 0));
    cr_expect_str_eq(kc_nearest("xyz", keys, 3, sizeof keys[0], 6), "device", "an explicit limit");
    const char *const sparse[] = {NULL, "graph", NULL};
    cr_expect_str_eq(kc_nearest("grahp", sparse, 3, sizeof sparse[0], 0), "graph",
                     "NULL entries skipped");
    cr_expect_null(kc_nearest("graph", NULL, 0, sizeof(char *), 0));
}

Test(error, messages_are_set_prefixed_and_cleared)
{
    kc_err e;
    cr_assert_eq(kc_err_set(&e, KC_ERR_IO, "reading %s", "f.bin"), KC_ERR_IO);
    cr_assert_str_eq(e.msg, "reading f.bin");
    kc_err_prefix(&e, "import %d", 3);
    cr_assert_str_eq(e.msg, "import 3: reading f.bin");
    kc_err_errno(&e, KC_ERR_IO, 2, "open %s", "x");
    cr_assert(strstr(e.msg, "open x: "));
    kc_err_clear(&e);
    cr_assert_eq(e.code, KC_OK);
    cr_assert_str_eq(e.msg, "");
    cr_assert_str_eq(kc_code_name(KC_ERR_CORRUPT), "corrupt");
    cr_assert_eq(kc_err_set(NULL, KC_ERR_FULL, "x"), KC_ERR_FULL);
}
