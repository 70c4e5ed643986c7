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
    for (int i = 0; i < KC_KEY_HEX_LEN; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

kc_code kc_toolid_get(const char *prog, const char *state_dir, kc_toolid *out, kc_err *err)
{
    memset(out, 0, sizeof *out);
    struct stat st;
    kc_code rc = kc_toolid_resolve(prog, out->path, &st, err);
    if (rc)
        return rc;
    char buf[4400];
    int n =
        snprintf(buf, sizeof buf, "toolid/1\n%s\n%lld\n%lld.%09ld\n%lld.%09ld\n%llu", out->path,
                 (long long)st.st_size, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
                 (long long)st.st_ctim.tv_sec, st.st_ctim.tv_nsec, (unsigned long long)st.st_ino);
    kc_sha256_hex(buf, (size_t)n, out->stamp);
    char cache[4096] = "";
    if (state_dir) {
        snprintf(cache, sizeof cache, "%s/tool-sha256-%.32s.txt", state_dir, out->stamp);
        uint8_t *text = NULL;
        size_t len = 0;
        kc_err ignore;
        if (kc_read_file(cache, &text, &len, &ignore) == KC_OK && len >= KC_KEY_HEX_LEN &&
            is_hex64((const char *)text)) {
            memcpy(out->sha256, text, KC_KEY_HEX_LEN);
            out->sha256[KC_KEY_HEX_LEN] = 0;
            free(text);
            return KC_OK;
        }
        free(text);
    }
    if ((rc = hash_file(out->path, out->sha256, err)))
        return rc;
    if (cache[0]) {
        char body[KC_KEY_HEX_LEN + 2];
        snprintf(body, sizeof body, "%s\n", out->sha256);
        kc_err ignore;
        kc_write_file_atomic(cache, body, KC_KEY_HEX_LEN + 1, &ignore); /* best effort */
    }
    return KC_OK;
}
