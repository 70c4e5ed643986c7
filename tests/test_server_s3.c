/*
 * test_server_s3.c - two real kcached instances sharing one S3 bucket
 * (s3rver on loopback) through the kcd_s3 tier: an artifact PUT to one is
 * read through by the other, and the tier's counters appear in /metrics.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kc_envelope.h"
#include "kc_hash.h"
#include "kc_s3server.h"
#include "kc_testserver.h"
#include "kc_testutil.h"

#define BUCKET "kcd-share"

Test(server_s3, instances_share_a_bucket, .timeout = 120)
{
    if (!kc_s3server_bin())
        cr_skip_test("s3rver not installed: run tests/s3/install.sh");
    kc_s3server s3;
    cr_assert_eq(kc_s3server_start(&s3, BUCKET), 0, "s3rver did not start");
    setenv("AWS_ACCESS_KEY_ID", KC_S3SERVER_KEY, 1);
    setenv("AWS_SECRET_ACCESS_KEY", KC_S3SERVER_SECRET, 1);
    const char *args[] = {"--s3-endpoint", s3.endpoint,          "--s3-bucket",
                          BUCKET,          "--s3-write-through", NULL};
    kc_testserver a, b;
    cr_assert_eq(kc_testserver_start(&a, NULL, args), 0, "log %s", a.log);
    cr_assert_eq(kc_testserver_start(&b, NULL, args), 0, "log %s", b.log);

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
    kc_testserver_http(&b, "GET", path, NULL, NULL, 0, false, &r);
    cr_expect_eq(r.status, 200, "read-through from the bucket: %s", r.body);
    cr_expect(r.len == len && !memcmp(r.body, env, len));
    kc_http_result_free(&r);
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
