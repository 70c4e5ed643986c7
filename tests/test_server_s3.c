/*
 * test_server_s3.c - two real kcached instances sharing one S3 bucket
 * (s3rver on loopback) through the kcd_s3 tier: an artifact PUT to one is
 * read through by the other, and the tier's counters appear in /metrics;
 * a --trusted-keys instance serves only signed objects from the bucket;
 * Redis SETs (real redis-cli) and ccache PUTs reach the bucket too.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <kcache/kc_envelope.h>
#include <kcache/kc_hash.h>
#include <kcache/kc_sign.h>
#include "kcd_s3.h"
#include "kc_s3server.h"
#include "kc_s3server_test.h"
#include "kc_testserver.h"
#include "kc_testutil.h"

#define BUCKET "kcd-share"

Test(server_s3, instances_share_a_bucket, .timeout = 120)
{
    kc_s3server s3;
    kc_s3server_start_or_skip(&s3, BUCKET, true);
    const char *args[] = {"--s3-endpoint", s3.endpoint,          "--s3-bucket",
                          BUCKET,          "--s3-write-through", NULL};
    kc_testserver a, b;
    cr_assert_eq(kc_testserver_start(&a, NULL, args), 0, "log %s", a.log);
    /* b refreshes what it reads once the bucket copy is a second old. */
    const char *args_b[] = {
        "--s3-endpoint",         s3.endpoint, "--s3-bucket", BUCKET, "--s3-write-through",
        "--s3-refresh-interval", "1s",        NULL};
    cr_assert_eq(kc_testserver_start(&b, NULL, args_b), 0, "log %s", b.log);

    char key[65], path[128];
    kc_sha256_hex("shared-artifact", 15, key);
    uint8_t payload[5000];
    kc_test_fill_random(payload, sizeof payload, 77);
    kc_artifact art;
    kc_err e = {0};
    cr_assert_eq(kc_artifact_init(&art, key, "cpu-so", NULL, payload, sizeof payload, &e), KC_OK);
    uint8_t *env;
    size_t len;
    cr_assert_eq(kc_envelope_encode(&art, &env, &len, &e), KC_OK);
    kc_artifact_free(&art);
    snprintf(path, sizeof path, "/v1/artifacts/%s", key);

    kc_http_result r;
    kc_testserver_http(&a, "PUT", path, NULL, env, len, false, &r);
    cr_expect_eq(r.status, 201, "%s", r.body);
    kc_http_result_free(&r);
    /* Last-Modified has one-second resolution: let the object get older than
     * b's refresh interval. */
    time_t put_at = time(NULL);
    while (time(NULL) < put_at + 2)
        usleep(50 * 1000);
    kc_testserver_http(&b, "GET", path, NULL, NULL, 0, false, &r);
    cr_expect_eq(r.status, 200, "read-through from the bucket: %s", r.body);
    cr_expect(r.len == len && !memcmp(r.body, env, len));
    kc_http_result_free(&r);
    /* The refresh runs on b's upload queue: wait for it to count. */
    bool refreshed = false;
    for (int i = 0; i < 200 && !refreshed; i++) {
        kc_testserver_http(&b, "GET", "/metrics", NULL, NULL, 0, false, &r);
        refreshed = r.body && strstr((char *)r.body, "kcached_s3_refreshes_total{result=\"ok\"} 1");
        kc_http_result_free(&r);
        if (!refreshed)
            usleep(50 * 1000);
    }
    cr_expect(refreshed, "b did not refresh the object it read through");
    /* Now it is local to b as well: survives the bucket going away. */
    kc_s3server_stop(&s3);
    kc_testserver_http(&b, "GET", path, NULL, NULL, 0, false, &r);
    cr_expect_eq(r.status, 200);
    kc_http_result_free(&r);
    kc_sha256_hex("never-stored", 12, key);
    snprintf(path, sizeof path, "/v1/artifacts/%s", key);
    kc_testserver_http(&b, "GET", path, NULL, NULL, 0, false, &r);
    cr_expect_eq(r.status, 404, "bucket down: a miss, not an error");
    kc_http_result_free(&r);
    kc_testserver_http(&b, "GET", "/metrics", NULL, NULL, 0, false, &r);
    cr_expect(strstr((char *)r.body, "kcached_s3_get_total{result=\"hit\"} 1") != NULL, "%s",
              r.body);
    kc_http_result_free(&r);
    cr_expect_eq(kc_testserver_stop(&a), 0);
    cr_expect_eq(kc_testserver_stop(&b), 0);
    kc_testserver_cleanup(&a);
    kc_testserver_cleanup(&b);
    free(env);
}

static uint8_t *envelope_of(const char *seed, size_t n, char key[65], size_t *len)
{
    kc_sha256_hex(seed, strlen(seed), key);
    uint8_t *payload = malloc(n);
    kc_test_fill_random(payload, n, 5);
    kc_artifact art;
    kc_err e = {0};
    cr_assert_eq(kc_artifact_init(&art, key, "cpu-so", NULL, payload, n, &e), KC_OK);
    uint8_t *env;
    cr_assert_eq(kc_envelope_encode(&art, &env, len, &e), KC_OK);
    kc_artifact_free(&art);
    free(payload);
    return env;
}

/* Writes env to the bucket the way a fleet member without --trusted-keys
 * (or anyone holding the S3 credentials) would, and waits until it reads
 * back whole. */
static void plant(kcd_s3 *s3, const char *key, const uint8_t *env, size_t len)
{
    kc_err e = {0};
    cr_assert_eq(kcd_s3_put_sync(s3, key, env, len, &e), KC_OK, "%s", e.msg);
    uint8_t *got = NULL;
    size_t got_len = 0;
    for (int i = 0; i < 200 && (kcd_s3_get(s3, key, &got, &got_len, &e) != KC_OK || got_len != len);
         i++) {
        free(got);
        got = NULL;
        usleep(20 * 1000);
    }
    cr_assert_eq(got_len, len, "planted object never read back whole");
    free(got);
}

/* Issue 14 item 1: read-through used to serve (and keep in memory) an
 * unsigned object to clients of a --trusted-keys server. */
Test(server_s3, trusted_keys_hold_for_objects_read_from_the_bucket, .timeout = 120)
{
    kc_s3server s3;
    kc_s3server_start_or_skip(&s3, BUCKET, true);
    char *root = kc_test_mkdtemp("s3trust");
    char *sign_pem = kc_test_path(root, "sign.pem"), *pub_pem = kc_test_path(root, "trusted.pem");
    cr_assert_eq(kc_test_make_ed25519(sign_pem, pub_pem), 0, "openssl could not make a key pair");

    kcd_s3_config c;
    kcd_s3_config_defaults(&c);
    kc_err e = {0};
    c.endpoint = strdup(s3.endpoint);
    c.bucket = strdup(BUCKET);
    kcd_s3 *fleet;
    cr_assert_eq(kcd_s3_open(&c, &fleet, &e), KC_OK, "%s", e.msg);

    char bad[65], good[65];
    size_t bad_len, good_len0, good_len;
    uint8_t *bad_env = envelope_of("planted-unsigned", 3000, bad, &bad_len);
    uint8_t *good_env0 = envelope_of("published-signed", 3000, good, &good_len0);
    kc_signer *sg;
    cr_assert_eq(kc_signer_load(sign_pem, &sg, &e), KC_OK, "%s", e.msg);
    uint8_t *good_env;
    cr_assert_eq(kc_sign_header(sg, good_env0, good_len0, &good_env, &good_len, &e), KC_OK);
    kc_signer_free(sg);
    plant(fleet, bad, bad_env, bad_len);
    plant(fleet, good, good_env, good_len);

    const char *args[] = {"--s3-endpoint",  s3.endpoint, "--s3-bucket", BUCKET,
                          "--trusted-keys", pub_pem,     NULL};
    kc_testserver ts;
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0, "log %s", ts.log);
    char path[128];
    kc_http_result r;
    snprintf(path, sizeof path, "/v1/artifacts/%s", bad);
    for (int i = 0; i < 2; i++) { /* twice: nothing of it was kept in memory either */
        kc_testserver_http(&ts, "GET", path, NULL, NULL, 0, false, &r);
        cr_expect_eq(r.status, 404, "unsigned object from the bucket served: %ld", r.status);
        kc_http_result_free(&r);
    }
    const char *zstd[] = {"Accept-Encoding: zstd", NULL};
    kc_testserver_http(&ts, "GET", path, zstd, NULL, 0, false, &r);
    cr_expect_eq(r.status, 404, "unsigned object served on the zstd path: %ld", r.status);
    kc_http_result_free(&r);
    snprintf(path, sizeof path, "/v1/artifacts/%s", good);
    kc_testserver_http(&ts, "GET", path, NULL, NULL, 0, false, &r);
    cr_expect_eq(r.status, 200, "signed object refused: %s", r.body);
    cr_expect(r.len == good_len && !memcmp(r.body, good_env, good_len));
    kc_http_result_free(&r);
    kc_testserver_http(&ts, "GET", "/metrics", NULL, NULL, 0, false, &r);
    cr_expect(strstr((char *)r.body, "kcached_s3_untrusted_total 3\n") != NULL, "%s", r.body);
    cr_expect(strstr((char *)r.body, "kcached_s3_get_total{result=\"hit\"} 1\n") != NULL, "%s",
              r.body);
    kc_http_result_free(&r);
    cr_expect_eq(kc_testserver_stop(&ts), 0);
    kc_testserver_cleanup(&ts);
    kcd_s3_close(fleet, 0);
    kcd_s3_config_free(&c);
    kc_s3server_stop(&s3);
    free(bad_env);
    free(good_env0);
    free(good_env);
    kc_test_rmtree(root);
    free(root);
    free(sign_pem);
    free(pub_pem);
}

/* out, what kc_test_redis_cli printed, is want; frees out. */
static void expect_cli(const char *want, char *out)
{
    cr_assert_not_null(out, "redis-cli did not run");
    cr_expect_str_eq(out, want);
    free(out);
}

/* The object the server wrote for key decodes to an envelope of this kind
 * and payload. */
static void expect_object(const kc_s3server *s3, const char *key, const char *kind,
                          const char *payload, const char *meta_part)
{
    char url[256];
    snprintf(url, sizeof url, "%s/%s/kcache/v1/%s", s3->endpoint, BUCKET, key);
    uint8_t *got = NULL;
    size_t len = 0;
    cr_assert_eq(kc_s3server_object(url, "GET", &got, &len, NULL), 200,
                 "no object for %s in the bucket", key);
    kc_artifact a;
    kc_err e = {0};
    cr_assert_eq(kc_envelope_decode(got, len, &a, &e), KC_OK, "%s", e.msg);
    cr_expect_str_eq(a.key, key);
    cr_expect_str_eq(a.kind, kind);
    cr_expect(a.payload_len == strlen(payload) && !memcmp(a.payload, payload, a.payload_len),
              "the bucket holds another value for %s", key);
    cr_expect(strstr(a.meta, meta_part) != NULL, "%s", a.meta);
    kc_artifact_free(&a);
    free(got);
}

/* Issue 24: S3 write-through was written into the HTTP artifact PUT alone,
 * so a Redis SET (and a ccache PUT) never reached the bucket. Every write
 * now goes through the context's one door, which copies every put and
 * replace to the tier: with --s3-write-through the object is there when
 * the client's OK arrives, and another server reads it through. */
Test(server_s3, redis_and_ccache_writes_reach_the_bucket_like_an_http_put, .timeout = 120)
{
    kc_s3server s3;
    kc_s3server_start_or_skip(&s3, BUCKET, true);
    char *root = kc_test_mkdtemp("s3redis");
    char *rpf = kc_test_path(root, "redis.port");
    const char *args[] = {
        "--s3-endpoint",  s3.endpoint,   "--s3-bucket",       BUCKET, "--s3-write-through",
        "--redis-listen", "127.0.0.1:0", "--redis-port-file", rpf,    NULL};
    kc_testserver a;
    cr_assert_eq(kc_testserver_start(&a, NULL, args), 0, "log %s", a.log);
    size_t n;
    char *port = kc_test_read_file(rpf, &n);
    cr_assert_not_null(port, "no Redis port file");
    port[strcspn(port, "\n")] = 0;

    expect_cli("OK", kc_test_redis_cli(port, "SET", "pt2:fx-graph:9f1c", "value-one", NULL));
    char rkey[65];
    kc_sha256_hex("redis:pt2:fx-graph:9f1c", 23, rkey);
    expect_object(&s3, rkey, "redis", "value-one", "\"redis_key\":\"pt2:fx-graph:9f1c\"");
    /* a replace, with an expiry: the bucket follows */
    expect_cli(
        "OK", kc_test_redis_cli(port, "SET", "pt2:fx-graph:9f1c", "value-two", "EX", "3600", NULL));
    expect_object(&s3, rkey, "redis", "value-two", "\"expire_ms\":");

    kc_http_result r;
    kc_testserver_http(&a, "PUT", "/ccache/ab/cdef0123", NULL, "ccache-result", 13, false, &r);
    cr_expect_eq(r.status, 201, "%s", r.body);
    kc_http_result_free(&r);
    char ckey[65];
    kc_sha256_hex("ccache:ab/cdef0123", 18, ckey);
    expect_object(&s3, ckey, "blob", "ccache-result", "\"ccache_path\":\"ab/cdef0123\"");

    /* another server on the bucket reads the value through and then has it
     * for its own Redis clients */
    char *rpf_b = kc_test_path(root, "redis-b.port");
    const char *args_b[] = {
        "--s3-endpoint", s3.endpoint,         "--s3-bucket", BUCKET, "--redis-listen",
        "127.0.0.1:0",   "--redis-port-file", rpf_b,         NULL};
    kc_testserver b;
    cr_assert_eq(kc_testserver_start(&b, NULL, args_b), 0, "log %s", b.log);
    char *port_b = kc_test_read_file(rpf_b, &n);
    cr_assert_not_null(port_b);
    port_b[strcspn(port_b, "\n")] = 0;
    char path[128];
    snprintf(path, sizeof path, "/v1/artifacts/%s", rkey);
    kc_testserver_http(&b, "GET", path, NULL, NULL, 0, false, &r);
    cr_expect_eq(r.status, 200, "read-through of the Redis value: %s", r.body);
    kc_http_result_free(&r);
    expect_cli("value-two", kc_test_redis_cli(port_b, "GET", "pt2:fx-graph:9f1c", NULL));

    cr_expect_eq(kc_testserver_stop(&a), 0);
    cr_expect_eq(kc_testserver_stop(&b), 0);
    kc_testserver_cleanup(&a);
    kc_testserver_cleanup(&b);
    kc_s3server_stop(&s3);
    free(port);
    free(port_b);
    free(rpf);
    free(rpf_b);
    kc_test_rmtree(root);
    free(root);
}
