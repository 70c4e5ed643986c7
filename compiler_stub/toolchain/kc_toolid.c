/*
 * kc_toolid.c - resolves a toolchain program through $PATH and hashes its
 * bytes (OpenSSL EVP through kc_hash), caching the hash by file stamp so warm
 * compiles do not reread a large compiler binary.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kc_memo.h"
#include "kc_toolid.h"
#include <kcache/kc_util.h>

kc_code kc_toolid_resolve(const char *prog, char real[4096], struct stat *st, kc_err *err)
{
    char found[4096] = "";
    if (strchr(prog, '/')) {
        snprintf(found, sizeof found, "%s", prog);
    } else {
        const char *path = getenv("PATH");
        char *copy = strdup(path && *path ? path : "/usr/bin:/bin");
        if (!copy)
            return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
        char *save = NULL;
        for (char *d = strtok_r(copy, ":", &save); d && !found[0]; d = strtok_r(NULL, ":", &save)) {
            char cand[4096];
            snprintf(cand, sizeof cand, "%s/%s", *d ? d : ".", prog);
            if (access(cand, X_OK) == 0)
                snprintf(found, sizeof found, "%s", cand);
        }
        free(copy);
    }
    if (!found[0] || !realpath(found, real) || stat(real, st) != 0 || access(real, X_OK) != 0)
        return kc_err_set(err, KC_ERR_UNSUPPORTED, "cannot find the program '%s' in $PATH", prog);
    return KC_OK;
}

static kc_code hash_file(const char *path, char hex[KC_KEY_HEX_LEN + 1], kc_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return kc_err_errno(err, KC_ERR_IO, errno, "cannot read the program %s", path);
    kc_sha256_ctx *h = kc_sha256_new();
    if (!h) {
        fclose(f);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    }
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        kc_sha256_update(h, buf, n);
    bool bad = ferror(f);
    fclose(f);
    uint8_t d[KC_SHA256_LEN];
    kc_sha256_final(h, d);
    kc_sha256_free(h);
    if (bad)
        return kc_err_set(err, KC_ERR_IO, "reading the program %s failed", path);
    kc_hex_encode(d, KC_SHA256_LEN, hex);
    return KC_OK;
}

static bool is_hex64(const char *s)
{
    return strlen(s) == KC_KEY_HEX_LEN && strspn(s, "0123456789abcdef") == KC_KEY_HEX_LEN;
}

kc_code kc_toolid_get(const char *prog, const char *state_dir, kc_toolid *out, kc_err *err)
{
    memset(out, 0, sizeof *out);
    struct stat st;
    kc_code rc = kc_toolid_resolve(prog, out->path, &st, err);
    if (rc)
        return rc;
    kc_stamp stamp;
    kc_stamp_of("toolid/1", out->path, &st, &stamp);
    memcpy(out->stamp, stamp.hex, sizeof out->stamp);
    out->settled = stamp.settled;
    bool memo = state_dir && stamp.settled;
    char text[KC_KEY_HEX_LEN + 1];
    if (memo &&
        kc_memo_get(state_dir, "tool-sha256", stamp.hex, text, sizeof text) == KC_KEY_HEX_LEN &&
        is_hex64(text)) {
        memcpy(out->sha256, text, sizeof out->sha256);
        return KC_OK;
    }
    if ((rc = hash_file(out->path, out->sha256, err)))
        return rc;
    if (memo)
        kc_memo_put(state_dir, "tool-sha256", stamp.hex, out->sha256, KC_KEY_HEX_LEN);
    return KC_OK;
}
