/*
 * fuzz_key.c - libFuzzer target for the small validators every request and
 * command runs first: artifact keys (kc_key_valid), hex decoding
 * (kc_hex_decode) and size text ("512M", kc_parse_size). Each is compared
 * with an obvious reference implementation written here.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kc_fuzz.h"
#include <kcache/kc_hash.h>
#include <kcache/kc_util.h>

static bool ref_key_valid(const char *s)
{
    size_t n = strlen(s);
    if (n != KC_KEY_HEX_LEN)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!strchr("0123456789abcdef", s[i]))
            return false;
    return true;
}

static int ref_hexval(char c)
{
    const char *digits = "0123456789abcdef";
    const char *upper = "0123456789ABCDEF";
    const char *p;
    if (c && (p = strchr(digits, c)))
        return (int)(p - digits);
    if (c && (p = strchr(upper, c)))
        return (int)(p - upper);
    return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    kc_fuzz_in in;
    kc_fuzz_in_init(&in, data, len);
    char *s = kc_fuzz_take_rest_str(&in, NULL);

    /* Keys: exactly 64 lowercase hex characters. */
    KC_FUZZ_CHECK(kc_key_valid(s) == ref_key_valid(s), "kc_key_valid(\"%.80s\") = %d", s,
                  kc_key_valid(s));

    /* Hex: decode as many bytes as the (NUL-terminated) text may hold. */
    size_t slen = strlen(s);
    size_t n = slen / 2;
    uint8_t *out = malloc(n ? n : 1);
    bool ok = kc_hex_decode(s, out, n);
    bool ref_ok = true;
    for (size_t i = 0; i < n && ref_ok; i++) {
        int hi = ref_hexval(s[2 * i]), lo = ref_hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            ref_ok = false;
        else
            KC_FUZZ_CHECK(!ok || out[i] == (uint8_t)(hi << 4 | lo), "hex byte %zu wrong", i);
    }
    KC_FUZZ_CHECK(ok == ref_ok, "kc_hex_decode(\"%.80s\") = %d", s, ok);
    if (ok && n) {
        char *back = malloc(2 * n + 1);
        kc_hex_encode(out, n, back);
        for (size_t i = 0; i < 2 * n; i++)
            KC_FUZZ_CHECK(back[i] == (s[i] | ((s[i] >= 'A' && s[i] <= 'F') ? 0x20 : 0)),
                          "hex round trip differs at %zu", i);
        free(back);
    }
    free(out);

    /* Sizes: never crash; a rejected text gets a message; plain digits
     * parse to their value. */
    uint64_t v = 0;
    kc_err err = {0};
    kc_code rc = kc_parse_size(s, &v, &err);
    if (rc != KC_OK)
        KC_FUZZ_CHECK(err.msg[0] != '\0', "kc_parse_size error without a message");
    if (slen > 0 && slen <= 18 && strspn(s, "0123456789") == slen) {
        errno = 0;
        unsigned long long ref = strtoull(s, NULL, 10);
        KC_FUZZ_CHECK(rc == KC_OK && v == ref, "kc_parse_size(\"%s\") = %llu, want %llu", s,
                      (unsigned long long)v, ref);
    }
    free(s);
    return 0;
}
