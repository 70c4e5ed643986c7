/*
 * test_server.c - kcached's HTTP contract (docs/DESIGN.md §6) tested from
 * the outside: a real kcached on loopback (kc_testserver), libcurl as the
 * client, one scenario per test.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <kcache/kc_envelope.h>
#include <kcache/kc_hash.h>
#include "kc_testserver.h"
#include "kc_testutil.h"

/* Stops kcached expecting a clean exit (sanitizer reports make it fail) and
 * removes its files. */
static void finish(kc_testserver *ts)
{
    if (ts->pid) {
        int st = kc_testserver_stop(ts);
        char *log = st ? kc_testserver_read_log(ts) : NULL;
        cr_expect_eq(st, 0, "kcached exit status %d; log:\n%s", st, log ? log : "");
        free(log);
    }
    kc_testserver_cleanup(ts);
}

/* An envelope for a random payload of n bytes; key derived from seed. */
static uint8_t *make_env(const char *kind, size_t n, uint64_t seed, const char *meta,
                         char key[KC_KEY_HEX_LEN + 1], size_t *len)
{
    uint8_t *payload = malloc(n ? n : 1);
    kc_test_fill_random(payload, n, seed);
    char seedtxt[64];
    snprintf(seedtxt, sizeof seedtxt, "test-key-%llu", (unsigned long long)seed);
    kc_sha256_hex(seedtxt, strlen(seedtxt), key);
    kc_artifact a;
    kc_err err = {0};
    cr_assert_eq(kc_artifact_init(&a, key, kind, meta, payload, n, &err), KC_OK, "%s", err.msg);
    uint8_t *env = NULL;
    cr_assert_eq(kc_envelope_encode(&a, &env, len, &err), KC_OK, "%s", err.msg);
    kc_artifact_free(&a);
    free(payload);
    return env;
}

static long req(kc_testserver *ts, const char *method, const char *path, const void *body,
                size_t len, kc_http_result *r)
{
    kc_http_result tmp;
    kc_http_result *res = r ? r : &tmp;
    kc_testserver_http(ts, method, path, NULL, body, len, false, res);
    long st = res->status;
    if (!r)
        kc_http_result_free(&tmp);
    return st;
}

static void start(kc_testserver *ts, const char *const *args)
{
    cr_assert_eq(kc_testserver_start(ts, NULL, args), 0, "kcached did not start (log %s)", ts->log);
}

static char *apath(const char *key)
{
    static __thread char buf[4096];
    snprintf(buf, sizeof buf, "/v1/artifacts/%s", key);
    return buf;
}

Test(server, healthz_routes_and_methods)
{
    kc_testserver ts;
    start(&ts, NULL);
    kc_http_result r;
    cr_expect_eq(req(&ts, "GET", "/healthz", NULL, 0, &r), 200);
    cr_expect_str_eq((char *)r.body, "ok\n");
    kc_http_result_free(&r);
    cr_expect_eq(req(&ts, "GET", "/nope", NULL, 0, NULL), 404);
    cr_expect_eq(req(&ts, "POST", "/healthz", "x", 1, NULL), 405);
    cr_expect_eq(req(&ts, "PATCH", apath("00"), NULL, 0, NULL), 405);
    cr_expect_eq(req(&ts, "GET", "/v1/artifacts/missing", NULL, 0, NULL), 405);
    char want[64];
    snprintf(want, sizeof want, "kcached listening on 127.0.0.1:%u", ts.port);
    /* the port file (readiness) is written before main() prints this line,
     * so on a busy machine the requests above can be answered first */
    char *log = kc_testserver_read_log(&ts);
    for (int i = 0; i < 100 && !strstr(log, want); i++) {
        usleep(50 * 1000);
        free(log);
        log = kc_testserver_read_log(&ts);
    }
    cr_expect(strstr(log, want) != NULL, "stdout line missing: %s", log);
    cr_expect(strstr(log, "\"GET /healthz\" 200") != NULL, "no access log line: %s", log);
    free(log);
    cr_expect_eq(kc_testserver_stop(&ts), 0, "SIGTERM must exit 0");
    finish(&ts);
}

Test(server, put_get_head_delete_artifact)
{
    kc_testserver ts;
    start(&ts, NULL);
    char key[65];
    size_t len;
    uint8_t *env = make_env("cpu-so", 10000, 1, "{\"device\":\"cpu-test\"}", key, &len);
    kc_http_result r;
    cr_expect_eq(req(&ts, "GET", apath(key), NULL, 0, NULL), 404);
    cr_expect_eq(req(&ts, "HEAD", apath(key), NULL, 0, NULL), 404);
    cr_expect_eq(req(&ts, "PUT", apath(key), env, len, NULL), 201);
    cr_expect_eq(req(&ts, "PUT", apath(key), env, len, NULL), 200);
    cr_assert_eq(req(&ts, "GET", apath(key), NULL, 0, &r), 200);
    cr_expect_eq(r.len, len);
    cr_expect(r.len == len && memcmp(r.body, env, len) == 0, "GET returns the envelope");
    kc_http_result_free(&r);
    cr_expect_eq(req(&ts, "HEAD", apath(key), NULL, 0, &r), 200);
    char *cl = kc_http_header(&r, "Content-Length");
    cr_expect(cl && strtoull(cl, NULL, 10) == len, "HEAD Content-Length %s", cl ? cl : "none");
    free(cl);
    kc_http_result_free(&r);
    cr_expect_eq(req(&ts, "DELETE", apath(key), NULL, 0, NULL), 204);
    cr_expect_eq(req(&ts, "DELETE", apath(key), NULL, 0, NULL), 404);
    cr_expect_eq(req(&ts, "GET", apath(key), NULL, 0, NULL), 404);
    free(env);
    finish(&ts);
}

Test(server, rejects_bad_envelopes_and_stores_nothing)
{
    kc_testserver ts;
    start(&ts, NULL);
    char key[65], other[65];
    size_t len, olen;
    uint8_t *env = make_env("cpu-so", 5000, 2, NULL, key, &len);
    uint8_t *oenv = make_env("cpu-so", 5000, 3, NULL, other, &olen);
    /* Envelope for another key. */
    cr_expect_eq(req(&ts, "PUT", apath(key), oenv, olen, NULL), 400);
    /* Flipped payload byte: checksum mismatch. */
    env[len - 10] ^= 0x55;
    cr_expect_eq(req(&ts, "PUT", apath(key), env, len, NULL), 400);
    env[len - 10] ^= 0x55;
    /* Truncated body and garbage. */
    cr_expect_eq(req(&ts, "PUT", apath(key), env, len - 100, NULL), 400);
    cr_expect_eq(req(&ts, "PUT", apath(key), env, 50, NULL), 400);
    cr_expect_eq(req(&ts, "PUT", apath(key), "not an envelope at all, really not.....", 40, NULL),
                 400);
    /* Extra trailing bytes. */
    uint8_t *longer = malloc(len + 7);
    memcpy(longer, env, len);
    memset(longer + len, 'x', 7);
    cr_expect_eq(req(&ts, "PUT", apath(key), longer, len + 7, NULL), 400);
    cr_expect_eq(req(&ts, "PUT", apath(key), NULL, 0, NULL), 400);
    cr_expect_eq(req(&ts, "GET", apath(key), NULL, 0, NULL), 404, "nothing partial stored");
    cr_expect_eq(req(&ts, "GET", apath(other), NULL, 0, NULL), 404);
    /* The good one still goes in, also chunked. */
    kc_http_result r;
    kc_testserver_http(&ts, "PUT", apath(key), NULL, env, len, true, &r);
    cr_expect_eq(r.status, 201, "chunked PUT: %ld %s", r.status, r.body);
    kc_http_result_free(&r);
    free(longer);
    free(env);
    free(oenv);
    finish(&ts);
}

Test(server, bad_keys_and_paths)
{
    kc_testserver ts;
    start(&ts, NULL);
    char upper[65];
    memset(upper, 'A', 64);
    upper[64] = 0;
    cr_expect_eq(req(&ts, "GET", apath(upper), NULL, 0, NULL), 400, "uppercase hex");
    cr_expect_eq(req(&ts, "GET", apath("abc123"), NULL, 0, NULL), 400, "short key");
    char longk[70];
    memset(longk, 'a', 65);
    longk[65] = 0;
    cr_expect_eq(req(&ts, "GET", apath(longk), NULL, 0, NULL), 400, "65 chars");
    char nonhex[65];
    memset(nonhex, 'g', 64);
    nonhex[64] = 0;
    cr_expect_eq(req(&ts, "GET", apath(nonhex), NULL, 0, NULL), 400, "non-hex");
    cr_expect_eq(req(&ts, "GET", "/v1/artifacts/../../etc/passwd", NULL, 0, NULL), 400);
    cr_expect_eq(req(&ts, "GET", "/v1/artifacts/%2e%2e/%2e%2e/etc/passwd", NULL, 0, NULL), 400);
    cr_expect_eq(req(&ts, "PUT", "/v1/artifacts/%2e%2e%2fx", "abc", 3, NULL), 400);
    cr_expect_eq(req(&ts, "GET", "/ccache/../x", NULL, 0, NULL), 400);
    cr_expect_eq(req(&ts, "GET", "/ccache/a/%2e%2e/b", NULL, 0, NULL), 400);
    cr_expect_eq(req(&ts, "PUT", "/ccache/a//b", "x", 1, NULL), 400);
    cr_expect_eq(req(&ts, "PUT", "/ccache/a%00b", "x", 1, NULL), 400);
    cr_expect_eq(req(&ts, "GET", "/ccache/a%20b", NULL, 0, NULL), 400);
    /* Very long paths: refused, never a crash. */
    size_t n = 6000;
    char *p = malloc(n + 20);
    strcpy(p, "/ccache/");
    memset(p + 8, 'a', n);
    p[8 + n] = 0;
    long st = req(&ts, "GET", p, NULL, 0, NULL);
    cr_expect(st == 400 || st == 414 || st == 431, "long ccache path got %ld", st);
    strcpy(p, "/v1/artifacts/");
    memset(p + 14, 'b', n);
    p[14 + n] = 0;
    st = req(&ts, "GET", p, NULL, 0, NULL);
    cr_expect(st == 400 || st == 414 || st == 431, "long key got %ld", st);
    char *huge = malloc(200000);
    strcpy(huge, "/ccache/");
    memset(huge + 8, 'c', 199000);
    huge[199008] = 0;
    st = req(&ts, "GET", huge, NULL, 0, NULL);
    cr_expect(st == 0 || st == 400 || st == 414 || st == 431, "huge path got %ld", st);
    cr_expect_eq(req(&ts, "GET", "/healthz", NULL, 0, NULL), 200, "still alive");
    free(huge);
    free(p);
    finish(&ts);
}

Test(server, oversized_bodies_get_413)
{
    const char *args[] = {"--max-blob", "4K", NULL};
    kc_testserver ts;
    start(&ts, args);
    char key[65];
    size_t len;
    uint8_t *env = make_env("cpu-so", 8000, 4, NULL, key, &len);
    kc_http_result r;
    cr_expect_eq(req(&ts, "PUT", apath(key), env, len, &r), 413, "%s", r.body);
    kc_http_result_free(&r);
    kc_testserver_http(&ts, "PUT", apath(key), NULL, env, len, true, &r);
    cr_expect(r.status == 413 || r.status == 0, "chunked oversized: %ld", r.status);
    kc_http_result_free(&r);
    cr_expect_eq(req(&ts, "PUT", "/ccache/big/one", env, len, NULL), 413);
    cr_expect_eq(req(&ts, "GET", apath(key), NULL, 0, NULL), 404);
    cr_expect_eq(req(&ts, "GET", "/healthz", NULL, 0, NULL), 200);
    /* Under the limit is fine. */
    free(env);
    env = make_env("cpu-so", 1000, 5, NULL, key, &len);
    cr_expect_eq(req(&ts, "PUT", apath(key), env, len, NULL), 201);
    free(env);
    finish(&ts);
}

Test(server, full_store_gets_507)
{
    const char *args[] = {"--max-size", "16K", NULL};
    kc_testserver ts;
    start(&ts, args);
    char key[65];
    size_t len;
    uint8_t *env = make_env("cpu-so", 64 * 1024, 6, NULL, key, &len); /* incompressible */
    kc_http_result r;
    cr_expect_eq(req(&ts, "PUT", apath(key), env, len, &r), 507, "%s", r.body);
    kc_http_result_free(&r);
    cr_expect_eq(req(&ts, "GET", apath(key), NULL, 0, NULL), 404);
    cr_expect_eq(req(&ts, "PUT", "/ccache/x/y", env, len, NULL), 507);
    free(env);
    finish(&ts);
}

Test(server, zstd_negotiation)
{
    kc_testserver ts;
    start(&ts, NULL);
    char key[65];
    size_t len;
    uint8_t *env = NULL;
    /* A compressible payload. */
    uint8_t *payload = malloc(100000);
    for (size_t i = 0; i < 100000; i++)
        payload[i] = (uint8_t)("kcache"[i % 6] + (i / 997) % 3);
    kc_sha256_hex("zstd-key", 8, key);
    kc_artifact a;
    kc_err err = {0};
    cr_assert_eq(kc_artifact_init(&a, key, "spirv", NULL, payload, 100000, &err), KC_OK);
    cr_assert_eq(kc_envelope_encode(&a, &env, &len, &err), KC_OK);
    kc_artifact_free(&a);
    free(payload);
    cr_assert_eq(req(&ts, "PUT", apath(key), env, len, NULL), 201);

    const char *hz[] = {"Accept-Encoding: gzip, zstd", NULL};
    kc_http_result r;
    kc_testserver_http(&ts, "GET", apath(key), hz, NULL, 0, false, &r);
    cr_assert_eq(r.status, 200);
    char *ce = kc_http_header(&r, "Content-Encoding");
    cr_expect(ce && !strcmp(ce, "zstd"), "Content-Encoding %s", ce ? ce : "none");
    free(ce);
    cr_expect_lt(r.len, len, "compressed is smaller");
    uint8_t *plain = malloc(len + 1);
    size_t dn = ZSTD_decompress(plain, len + 1, r.body, r.len);
    cr_assert(!ZSTD_isError(dn), "zstd: %s", ZSTD_getErrorName(dn));
    cr_expect_eq(dn, len);
    cr_expect(memcmp(plain, env, len) == 0, "decompressed bytes equal the envelope");
    free(plain);
    kc_http_result_free(&r);

    const char *hq[] = {"Accept-Encoding: zstd;q=0, gzip", NULL};
    kc_testserver_http(&ts, "GET", apath(key), hq, NULL, 0, false, &r);
    cr_expect_eq(r.status, 200);
    ce = kc_http_header(&r, "Content-Encoding");
    cr_expect_null(ce, "q=0 refuses zstd");
    free(ce);
    cr_expect(r.len == len && !memcmp(r.body, env, len));
    kc_http_result_free(&r);
    free(env);
    finish(&ts);
}

Test(server, missing_batch)
{
    kc_testserver ts;
    start(&ts, NULL);
    char k1[65], k2[65];
    size_t l1, l2;
    uint8_t *e1 = make_env("graph", 100, 11, NULL, k1, &l1);
    uint8_t *e2 = make_env("graph", 100, 12, NULL, k2, &l2);
    cr_assert_eq(req(&ts, "PUT", apath(k1), e1, l1, NULL), 201);
    char body[256];
    int n = snprintf(body, sizeof body, "{\"keys\":[\"%s\",\"%s\"]}", k1, k2);
    kc_http_result r;
    cr_assert_eq(req(&ts, "POST", "/v1/artifacts/missing", body, (size_t)n, &r), 200);
    json_t *j = json_loadb((char *)r.body, r.len, 0, NULL);
    cr_assert_not_null(j);
    json_t *m = json_object_get(j, "missing");
    cr_assert_eq(json_array_size(m), 1);
    cr_expect_str_eq(json_string_value(json_array_get(m, 0)), k2);
    json_decref(j);
    kc_http_result_free(&r);
    cr_expect_eq(req(&ts, "POST", "/v1/artifacts/missing", "{\"keys\":[\"../x\"]}", 17, NULL), 400);
    cr_expect_eq(req(&ts, "POST", "/v1/artifacts/missing", "not json", 8, NULL), 400);
    cr_expect_eq(req(&ts, "POST", "/v1/artifacts/missing", "{\"keys\":[]}", 11, &r), 200);
    cr_expect(strstr((char *)r.body, "\"missing\":[]") != NULL, "%s", r.body);
    kc_http_result_free(&r);
    free(e1);
    free(e2);
    finish(&ts);
}

Test(server, bundle_stream_round_trip)
{
    kc_testserver a, b;
    start(&a, NULL);
    start(&b, NULL);
    enum { N = 25 };
    char keys[N][65];
    uint8_t *envs[N];
    size_t lens[N];
    for (int i = 0; i < N; i++) {
        const char *meta =
            i % 2 ? "{\"device\":\"cpu-odd\",\"tag\":\"t1\"}" : "{\"device\":\"cpu-even\"}";
        envs[i] = make_env(i % 3 ? "cpu-so" : "graph", 1000 + (size_t)i * 3000, 100 + i, meta,
                           keys[i], &lens[i]);
        cr_assert_eq(req(&a, "PUT", apath(keys[i]), envs[i], lens[i], NULL), 201);
    }
    kc_http_result bun;
    cr_assert_eq(req(&a, "GET", "/v1/bundle", NULL, 0, &bun), 200);
    cr_expect(bun.len > 8 && !memcmp(bun.body, "KCBUNDLE", 8), "bundle magic");
    kc_http_result r;
    cr_assert_eq(req(&b, "POST", "/v1/bundle", bun.body, bun.len, &r), 200, "%s", r.body);
    cr_expect(strstr((char *)r.body, "\"imported\":25") != NULL, "%s", r.body);
    kc_http_result_free(&r);
    for (int i = 0; i < N; i++) {
        cr_expect_eq(req(&b, "GET", apath(keys[i]), NULL, 0, &r), 200);
        cr_expect(r.len == lens[i] && !memcmp(r.body, envs[i], lens[i]), "artifact %d", i);
        kc_http_result_free(&r);
    }
    /* Idempotent re-import. */
    cr_expect_eq(req(&b, "POST", "/v1/bundle", bun.body, bun.len, &r), 200);
    cr_expect(strstr((char *)r.body, "\"imported\":0") != NULL, "%s", r.body);
    kc_http_result_free(&r);
    /* Truncated bundle is refused. */
    kc_testserver c;
    start(&c, NULL);
    cr_expect_eq(req(&c, "POST", "/v1/bundle", bun.body, bun.len - 5, NULL), 400);
    cr_expect_eq(req(&c, "POST", "/v1/bundle", "garbage!garbage!", 16, NULL), 400);
    finish(&c);
    kc_http_result_free(&bun);
    /* Filters. */
    cr_assert_eq(req(&a, "GET", "/v1/bundle?device=cpu-odd&kind=cpu-so", NULL, 0, &bun), 200);
    kc_testserver d;
    start(&d, NULL);
    cr_assert_eq(req(&d, "POST", "/v1/bundle", bun.body, bun.len, &r), 200);
    int expect = 0;
    for (int i = 0; i < N; i++)
        expect += (i % 2) && (i % 3);
    char want[64];
    snprintf(want, sizeof want, "\"imported\":%d", expect);
    cr_expect(strstr((char *)r.body, want) != NULL, "%s want %s", r.body, want);
    kc_http_result_free(&r);
    kc_http_result_free(&bun);
    cr_expect_eq(req(&a, "GET", "/v1/bundle?kind=Non%20sense", NULL, 0, NULL), 400);
    cr_expect_eq(req(&a, "GET", "/v1/bundle?since=yesterday", NULL, 0, NULL), 400);
    finish(&d);
    for (int i = 0; i < N; i++)
        free(envs[i]);
    finish(&a);
    finish(&b);
}

Test(server, restart_serves_everything)
{
    kc_testserver ts;
    start(&ts, NULL);
    enum { N = 10 };
    char keys[N][65];
    uint8_t *envs[N];
    size_t lens[N];
    for (int i = 0; i < N; i++) {
        envs[i] = make_env("ze-native", 3000, 200 + i, NULL, keys[i], &lens[i]);
        cr_assert_eq(req(&ts, "PUT", apath(keys[i]), envs[i], lens[i], NULL), 201);
    }
    cr_assert_eq(req(&ts, "PUT", "/ccache/aa/bb", "payload", 7, NULL), 201);
    cr_expect_eq(kc_testserver_stop(&ts), 0);
    cr_assert_eq(kc_testserver_restart(&ts), 0);
    kc_http_result r;
    for (int i = 0; i < N; i++) {
        cr_expect_eq(req(&ts, "GET", apath(keys[i]), NULL, 0, &r), 200);
        cr_expect(r.len == lens[i] && !memcmp(r.body, envs[i], lens[i]));
        kc_http_result_free(&r);
    }
    /* kill -9 right after an acknowledged write loses nothing. */
    char k2[65];
    size_t l2;
    uint8_t *e2 = make_env("cpu-so", 4000, 299, NULL, k2, &l2);
    cr_assert_eq(req(&ts, "PUT", apath(k2), e2, l2, NULL), 201);
    kc_testserver_kill(&ts);
    cr_assert_eq(kc_testserver_restart(&ts), 0);
    cr_expect_eq(req(&ts, "GET", apath(k2), NULL, 0, &r), 200);
    cr_expect(r.len == l2 && !memcmp(r.body, e2, l2));
    kc_http_result_free(&r);
    cr_expect_eq(req(&ts, "GET", "/ccache/aa/bb", NULL, 0, &r), 200);
    cr_expect(r.len == 7 && !memcmp(r.body, "payload", 7));
    kc_http_result_free(&r);
    free(e2);
    for (int i = 0; i < N; i++)
        free(envs[i]);
    finish(&ts);
}

Test(server, ccache_blob_routes)
{
    kc_testserver ts;
    start(&ts, NULL);
    kc_http_result r;
    cr_expect_eq(req(&ts, "GET", "/ccache/ab/cdef0123", NULL, 0, NULL), 404);
    cr_expect_eq(req(&ts, "HEAD", "/ccache/ab/cdef0123", NULL, 0, NULL), 404);
    cr_expect_eq(req(&ts, "PUT", "/ccache/ab/cdef0123", "blobdata", 8, NULL), 201);
    cr_expect_eq(req(&ts, "HEAD", "/ccache/ab/cdef0123", NULL, 0, NULL), 200);
    cr_expect_eq(req(&ts, "GET", "/ccache/ab/cdef0123", NULL, 0, &r), 200);
    cr_expect(r.len == 8 && !memcmp(r.body, "blobdata", 8));
    kc_http_result_free(&r);
    cr_expect_eq(req(&ts, "PUT", "/ccache/empty", "", 0, NULL), 201);
    cr_expect_eq(req(&ts, "GET", "/ccache/empty", NULL, 0, &r), 200);
    cr_expect_eq(r.len, 0);
    kc_http_result_free(&r);
    cr_expect_eq(req(&ts, "DELETE", "/ccache/ab/cdef0123", NULL, 0, NULL), 204);
    cr_expect_eq(req(&ts, "GET", "/ccache/ab/cdef0123", NULL, 0, NULL), 404);
    finish(&ts);
}

Test(server, metrics_and_stats)
{
    kc_testserver ts;
    start(&ts, NULL);
    char key[65];
    size_t len;
    uint8_t *env = make_env("cpu-so", 1234, 300, NULL, key, &len);
    req(&ts, "PUT", apath(key), env, len, NULL);
    req(&ts, "GET", apath(key), NULL, 0, NULL);
    kc_sha256_hex("absent", 6, key);
    req(&ts, "GET", apath(key), NULL, 0, NULL);
    kc_http_result r;
    const char *want[] = {"kcached_requests_total{route=\"artifact_put\",code=\"201\"} 1",
                          "kcached_requests_total{route=\"artifact_get\",code=\"404\"} 1",
                          "kcached_cache_hits_total 1",
                          "kcached_cache_misses_total 1",
                          "kcached_store_entries 1",
                          "kcached_store_evictions_total 0",
                          "kcached_request_duration_seconds_bucket{le=\"+Inf\"}",
                          "kcached_received_bytes_total"};
    /* A request is counted when libmicrohttpd reports it completed, which
     * can be just after its response reached us: poll briefly. */
    size_t found = 0;
    for (int attempt = 0; attempt < 100; attempt++) {
        if (attempt) {
            kc_http_result_free(&r);
            usleep(20000);
        }
        cr_assert_eq(req(&ts, "GET", "/metrics", NULL, 0, &r), 200);
        for (found = 0; found < sizeof want / sizeof want[0]; found++)
            if (!strstr((char *)r.body, want[found]))
                break;
        if (found == sizeof want / sizeof want[0])
            break;
    }
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect(strstr((char *)r.body, want[i]) != NULL, "missing %s in\n%s", want[i], r.body);
    kc_http_result_free(&r);
    cr_assert_eq(req(&ts, "GET", "/v1/stats", NULL, 0, &r), 200);
    json_t *j = json_loadb((char *)r.body, r.len, 0, NULL);
    cr_assert_not_null(j);
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(j, "store"), "entries")), 1);
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(j, "server"), "hits")), 1);
    json_decref(j);
    kc_http_result_free(&r);
    free(env);
    finish(&ts);
}

extern char **environ;

Test(server, config_file_env_and_flags)
{
    for (char **e = environ; *e;) { /* only this test's settings count */
        if (!strncmp(*e, "KCACHED_", 8)) {
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)strcspn(*e, "="), *e);
            unsetenv(name);
        } else
            e++;
    }
    char *dir = kc_test_mkdtemp("kcdcfg");
    char *conf = kc_test_path(dir, "kcached.conf");
    const char *text = "# test\nmax-size = 1M\nlog_level = warn\nthreads = 3\nsend-mode = copy\n";
    kc_test_write_file(conf, text, strlen(text));
    kc_test_result r;
    setenv("KCACHED_THREADS", "5", 1);
    kc_test_runl(&r, KC_TEST_KCACHED, "--config", conf, "--data", dir, "--check-config",
                 "--log-level", "debug", NULL);
    unsetenv("KCACHED_THREADS");
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "max-size = 1048576") != NULL, "%s", r.out);
    cr_expect(strstr(r.out, "threads = 5") != NULL, "env beats file: %s", r.out);
    cr_expect(strstr(r.out, "log-level = debug") != NULL, "flag beats file: %s", r.out);
    cr_expect(strstr(r.out, "send-mode = copy") != NULL, "a choice from the file: %s", r.out);
    kc_test_result_free(&r);
    kc_test_runl(&r, KC_TEST_KCACHED, "--data", dir, "--check-config", NULL);
    cr_expect(strstr(r.out, "send-mode = auto") != NULL, "the default choice: %s", r.out);
    kc_test_result_free(&r);
    setenv("KCACHED_SEND_MODE", "zerocopy", 1);
    kc_test_runl(&r, KC_TEST_KCACHED, "--data", dir, "--check-config", NULL);
    unsetenv("KCACHED_SEND_MODE");
    cr_expect_eq(r.exit_code, 2);
    cr_expect(strstr(r.err, "KCACHED_SEND_MODE") && strstr(r.err, "'send-mode'") &&
                  strstr(r.err, "bad value 'zerocopy' (want auto, sendfile, copy)"),
              "a bad choice names its source, the option and the choices: %s", r.err);
    kc_test_result_free(&r);
    const char *bad = "max-size = lots\n";
    kc_test_write_file(conf, bad, strlen(bad));
    kc_test_runl(&r, KC_TEST_KCACHED, "--config", conf, "--check-config", NULL);
    cr_expect_eq(r.exit_code, 2);
    cr_expect(strstr(r.err, "kcached.conf:1") != NULL, "error names file:line: %s", r.err);
    kc_test_result_free(&r);
    kc_test_runl(&r, KC_TEST_KCACHED, "--no-such-flag", NULL);
    cr_expect_eq(r.exit_code, 2);
    kc_test_result_free(&r);
    kc_test_runl(&r, KC_TEST_KCACHED, "--tls-cert", "/nonexistent.pem", "--check-config", NULL);
    cr_expect_eq(r.exit_code, 2);
    kc_test_result_free(&r);
    free(conf);
    kc_test_rmtree(dir);
    free(dir);
}

/* ---- raw-socket scenarios: slow clients and in-flight requests ---- */

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

static int raw_connect(unsigned port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = {20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static void raw_send(int fd, const void *p, size_t n)
{
    cr_assert_eq(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Reads until `until` appears (or EOF); returns what was read (static). */
static const char *raw_recv_until(int fd, const char *until)
{
    static __thread char buf[8192];
    size_t len = 0;
    buf[0] = 0;
    while (len < sizeof buf - 1 && !strstr(buf, until)) {
        ssize_t n = recv(fd, buf + len, sizeof buf - 1 - len, 0);
        if (n <= 0)
            break;
        len += (size_t)n;
        buf[len] = 0;
    }
    return buf;
}

Test(server, slow_client_does_not_block_others)
{
    const char *args[] = {"--threads", "1", NULL};
    kc_testserver ts;
    start(&ts, args);
    /* Half a request line, then silence: a single worker must still serve others. */
    int slow = raw_connect(ts.port);
    raw_send(slow, "GET /healthz HT", 15);
    int slow2 = raw_connect(ts.port);
    raw_send(slow2, "PUT /ccache/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc", 63);
    for (int i = 0; i < 20; i++)
        cr_expect_eq(req(&ts, "GET", "/healthz", NULL, 0, NULL), 200);
    /* The slow one can still finish. */
    raw_send(slow, "TP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 38);
    cr_expect(strstr(raw_recv_until(slow, "ok\n"), "200 OK") != NULL);
    close(slow);
    close(slow2);
    finish(&ts);
}

Test(server, sigterm_finishes_in_flight_upload)
{
    kc_testserver ts;
    start(&ts, NULL);
    char key[65];
    size_t len;
    uint8_t *env = make_env("cpu-so", 20000, 400, NULL, key, &len);
    int fd = raw_connect(ts.port);
    char head[512];
    int n = snprintf(head, sizeof head,
                     "PUT /v1/artifacts/%s HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n"
                     "Expect: 100-continue\r\nConnection: close\r\n\r\n",
                     key, len);
    raw_send(fd, head, (size_t)n);
    /* "100 Continue" proves the server has started this request. */
    cr_assert(strstr(raw_recv_until(fd, "\r\n\r\n"), "100 Continue") != NULL);
    raw_send(fd, env, len / 2);
    kill(ts.pid, SIGTERM);
    /* New connections are refused or closed while the upload completes. */
    raw_send(fd, env + len / 2, len - len / 2);
    const char *resp = raw_recv_until(fd, "\n\n");
    cr_expect(strstr(resp, "201 Created") != NULL, "in-flight PUT answered: %s", resp);
    close(fd);
    cr_expect_eq(kc_testserver_stop(&ts), 0, "clean exit after SIGTERM");
    cr_assert_eq(kc_testserver_restart(&ts), 0);
    kc_http_result r;
    cr_expect_eq(req(&ts, "GET", apath(key), NULL, 0, &r), 200);
    cr_expect(r.len == len && !memcmp(r.body, env, len));
    kc_http_result_free(&r);
    free(env);
    finish(&ts);
}

Test(server, periodic_upkeep_sweeps_unused_pack_files)
{
    kc_testserver ts = {0};
    const char *args[] = {"--compact-interval", "1", "--log-level", "error", NULL};
    start(&ts, args);
    /* a pack file no row knows, as a process killed between its commit and
     * the unlink leaves behind */
    char packs[512], orphan[600];
    snprintf(packs, sizeof packs, "%s/packs", ts.data);
    snprintf(orphan, sizeof orphan, "%s/pack-000077.kcp", packs);
    mkdir(packs, 0755);
    cr_assert_eq(kc_test_write_file(orphan, "KCPACK1\nstale bytes", 19), 0);
    bool gone = false;
    for (int i = 0; i < 100 && !gone; i++) { /* the first run is due after 1 s */
        usleep(100 * 1000);
        gone = access(orphan, F_OK) != 0;
    }
    cr_assert(gone, "the upkeep thread removed the orphan pack");
    /* the run is counted once it returns, just after the file went */
    unsigned long long runs = 0;
    for (int i = 0; i < 50 && runs == 0; i++) {
        kc_http_result r;
        cr_assert_eq(req(&ts, "GET", "/metrics", NULL, 0, &r), 200);
        const char *m = strstr((char *)r.body, "\nkcached_compactions_total ");
        cr_assert_not_null(m, "%s", r.body);
        runs = strtoull(m + strlen("\nkcached_compactions_total "), NULL, 10);
        kc_http_result_free(&r);
        if (!runs)
            usleep(100 * 1000);
    }
    cr_assert_geq(runs, 1, "kcached_compactions_total counts the run");
    finish(&ts); /* SIGTERM wakes the sleeping upkeep thread: a clean exit */
}
