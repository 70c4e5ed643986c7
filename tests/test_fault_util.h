/*
 * test_fault_util.h - helpers shared by the fault and concurrency tests
 * (tests/test_fault_*.c, tests/test_concurrency_*.c): deterministic
 * artifacts, one-call HTTP requests through libcurl, and store checks
 * (PRAGMA integrity_check, `kcache verify`). Header-only (static functions)
 * because every tests/test_*.c is its own executable.
 */
#ifndef TEST_FAULT_UTIL_H
#define TEST_FAULT_UTIL_H

#include <criterion/criterion.h>
#include <curl/curl.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_envelope.h>
#include <kcache/kc_hash.h>
#include "kc_testutil.h"

/* A test artifact: its key and encoded envelope (owned). The payload is
 * pseudo-random (incompressible) and a pure function of seed and size, so any
 * reader can rebuild the expected bytes. */
typedef struct ft_art {
    char key[KC_KEY_HEX_LEN + 1];
    uint8_t *env;
    size_t env_len;
} ft_art;

static inline void ft_art_make(ft_art *out, uint64_t seed, size_t payload_len)
{
    uint8_t *payload = malloc(payload_len ? payload_len : 1);
    kc_test_fill_random(payload, payload_len, seed * 2654435761u + payload_len);
    char name[64];
    snprintf(name, sizeof name, "fault-art-%llu-%zu", (unsigned long long)seed, payload_len);
    kc_sha256_hex(name, strlen(name), out->key);
    kc_artifact a;
    kc_err err = {0};
    cr_assert_eq(
        kc_artifact_init(&a, out->key, "blob", "{\"tag\":\"fault\"}", payload, payload_len, &err),
        KC_OK, "%s", err.msg);
    cr_assert_eq(kc_envelope_encode(&a, &out->env, &out->env_len, &err), KC_OK, "%s", err.msg);
    kc_artifact_free(&a);
    free(payload);
}

static inline void ft_art_free(ft_art *a)
{
    free(a->env);
    a->env = NULL;
}

typedef struct ft_buf {
    uint8_t *data;
    size_t len;
} ft_buf;

static size_t ft_buf_write(char *p, size_t size, size_t n, void *ctx)
{
    ft_buf *b = ctx;
    size_t add = size * n;
    uint8_t *d = realloc(b->data, b->len + add + 1);
    if (!d)
        return 0;
    b->data = d;
    memcpy(b->data + b->len, p, add);
    b->len += add;
    b->data[b->len] = 0;
    return add;
}

/* One HTTP request (a fresh connection each time unless h is reused by the
 * caller). Returns the status, or -1 when no response came (connection
 * refused, reset, timeout): the curl error text goes to errbuf if given.
 * *resp (may be NULL) receives the body (caller frees resp->data). */
static inline long ft_http(CURL *h, const char *method, const char *url, const void *body,
                           size_t body_len, const char *header, ft_buf *resp, long timeout_ms,
                           char *errbuf)
{
    bool own = h == NULL;
    if (own)
        h = curl_easy_init();
    else
        curl_easy_reset(h);
    ft_buf tmp = {0};
    ft_buf *out = resp ? resp : &tmp;
    memset(out, 0, sizeof *out);
    struct curl_slist *hs = NULL;
    hs = curl_slist_append(hs, "Expect:");
    if (header)
        hs = curl_slist_append(hs, header);
    char eb[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, ft_buf_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, eb);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    if (!strcmp(method, "HEAD"))
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    else if (strcmp(method, "GET") != 0)
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    if (body || !strcmp(method, "PUT") || !strcmp(method, "POST")) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body ? body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    }
    long status = -1;
    CURLcode cc = curl_easy_perform(h);
    if (cc == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    else if (errbuf)
        snprintf(errbuf, CURL_ERROR_SIZE, "%s", eb[0] ? eb : curl_easy_strerror(cc));
    curl_slist_free_all(hs);
    if (own)
        curl_easy_cleanup(h);
    free(tmp.data);
    return status;
}

/* Runs PRAGMA integrity_check on a store's database (read-only open, safe
 * next to a running server). Returns 1 when the answer is "ok". */
static inline int ft_integrity_ok(const char *data_dir, char *why, size_t cap)
{
    char *db = kc_test_path(data_dir, "kcache.db");
    sqlite3 *s = NULL;
    int ok = 0;
    if (sqlite3_open_v2(db, &s, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK) {
        sqlite3_busy_timeout(s, 10000);
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(s, "PRAGMA integrity_check", -1, &st, NULL) == SQLITE_OK &&
            sqlite3_step(st) == SQLITE_ROW) {
            const char *r = (const char *)sqlite3_column_text(st, 0);
            ok = r && !strcmp(r, "ok");
            snprintf(why, cap, "%s", r ? r : "(null)");
        } else {
            snprintf(why, cap, "%s", sqlite3_errmsg(s));
        }
        sqlite3_finalize(st);
    } else {
        snprintf(why, cap, "cannot open %s", db);
    }
    sqlite3_close(s);
    free(db);
    return ok;
}

/* Runs `kcache --cache-dir DIR verify`; returns its exit code and copies
 * its output into why. */
static inline int ft_kcache_verify(const char *data_dir, char *why, size_t cap)
{
    kc_test_result r;
    if (kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", data_dir, "verify", (char *)NULL) != 0) {
        snprintf(why, cap, "cannot run %s", KC_TEST_KCACHE);
        return -1;
    }
    snprintf(why, cap, "%s%s", r.out ? r.out : "", r.err ? r.err : "");
    int code = r.exit_code;
    kc_test_result_free(&r);
    return code;
}

#endif
