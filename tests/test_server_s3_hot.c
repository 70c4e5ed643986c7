/*
 * test_server_s3_hot.c - S3 keeps what is hot: a kcached (in process, real
 * HTTP on an ephemeral port, its S3 tier's clock moved by the test) that
 * serves an artifact from its own store keeps the bucket copy (s3rver on
 * loopback) young for the bucket's lifecycle rule, puts back a copy the rule
 * deleted, and a server without the tier does nothing of the kind.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <kcache/kc_envelope.h>
#include <kcache/kc_hash.h>
#include "kc_s3server.h"
#include "kc_s3server_test.h"
#include "kc_testserver.h"
#include "kc_testutil.h"
#include "kcd_config.h"
#include "kcd_log.h"
#include "kcd_routes.h"
#include "kcd_server.h"

#define BUCKET "kcd-hot"
#define DAY 86400.0

/* A kcached in this process, so the test can move its S3 tier's clock. */
typedef struct hot_server {
    kcd_server *srv;
    kc_testserver ts; /* only url is set: for kc_testserver_http */
    char *dir;
} hot_server;

/* The tier's clock: the wall clock plus an offset the test moves. */
static double moved_clock(void *ud)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9 + *(double *)ud;
}

/* Starts a server; with endpoint, an S3 tier on it (write-through, default
 * refresh interval: one day) whose clock is moved_clock(offset). */
static void server_start(hot_server *h, const char *endpoint, double *offset)
{
    signal(SIGPIPE, SIG_IGN);
    kcd_log_set_level(KCD_LOG_ERROR);
    setenv("AWS_ACCESS_KEY_ID", KC_S3SERVER_KEY, 1);
    setenv("AWS_SECRET_ACCESS_KEY", KC_S3SERVER_SECRET, 1);
    memset(h, 0, sizeof *h);
    h->dir = kc_test_mkdtemp("kcds3hot");
    char *data = kc_test_path(h->dir, "data");
    kcd_config cfg;
    kcd_config_defaults(&cfg);
    kc_err err = {0};
    const char *opts[][2] = {{"listen", "127.0.0.1:0"},
                             {"data", data},
                             {"threads", "2"},
                             {"grace", "5"},
                             {"s3-endpoint", endpoint},
                             {"s3-bucket", BUCKET},
                             {"s3-write-through", "yes"},
                             {"s3-timeout", "10000"}};
    size_t n = sizeof opts / sizeof opts[0];
    for (size_t i = 0; i < (endpoint ? n : 4); i++)
        cr_assert_eq(kcd_config_set(&cfg, opts[i][0], opts[i][1], "test", &err), KC_OK, "%s: %s",
                     opts[i][0], err.msg);
    cr_assert_eq(kcd_server_start(&cfg, &h->srv, &err), KC_OK, "%s", err.msg);
    kcd_config_free(&cfg);
    free(data);
    kcd_s3 *s3 = kcd_ctx_s3(kcd_server_ctx(h->srv));
    cr_assert_eq(s3 != NULL, endpoint != NULL);
    if (s3)
        kcd_s3_set_clock(s3, moved_clock, offset);
    snprintf(h->ts.url, sizeof h->ts.url, "http://127.0.0.1:%u", kcd_server_port(h->srv));
}

static void server_stop(hot_server *h)
{
    kcd_server_stop(h->srv);
    kc_test_rmtree(h->dir);
    free(h->dir);
}

static kcd_s3 *tier(hot_server *h)
{
    return kcd_ctx_s3(kcd_server_ctx(h->srv));
}

static uint8_t *envelope_of(const char *seed, char key[65], size_t *len)
{
    uint8_t *env = kc_test_envelope(seed, 6000, key, len);
    cr_assert_not_null(env, "could not encode the envelope for '%s'", seed);
    return env;
}

static long request(hot_server *h, const char *method, const char *key, const void *body,
                    size_t len)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/artifacts/%s", key);
    kc_http_result r;
    cr_assert_eq(kc_testserver_http(&h->ts, method, path, NULL, body, len, false, &r), 0, "%s",
                 r.curl_error);
    long st = r.status;
    kc_http_result_free(&r);
    return st;
}

/* count GETs (and a HEAD) of key, each answered 200, then waits for the
 * tier's queue to drain: whatever the hits set off has happened. */
static void hits(hot_server *h, const char *key, int count)
{
    for (int i = 0; i < count; i++)
        cr_assert_eq(request(h, "GET", key, NULL, 0), 200);
    cr_assert_eq(request(h, "HEAD", key, NULL, 0), 200);
    cr_assert_eq(kcd_s3_flush(tier(h), 20000), 0);
}

static kcd_s3_stats stats_of(hot_server *h)
{
    kcd_s3_stats st;
    kcd_s3_stats_get(tier(h), &st);
    return st;
}

static void object_url(const kc_s3server *s3, const char *key, char *url, size_t cap)
{
    snprintf(url, cap, "%s/%s/kcache/v1/%s", s3->endpoint, BUCKET, key);
}

static long long bucket_mtime(const char *url)
{
    long long mtime = -1;
    return kc_s3server_object(url, "HEAD", NULL, NULL, &mtime) == 200 ? mtime : -1;
}

/* The bucket copy is exactly env. */
static void expect_bucket_holds(const char *url, const uint8_t *env, size_t len)
{
    uint8_t *got = NULL;
    size_t got_len = 0;
    cr_expect_eq(kc_s3server_object(url, "GET", &got, &got_len, NULL), 200, "%s", url);
    cr_expect(got_len == len && got && memcmp(got, env, len) == 0,
              "bucket copy differs from the envelope written (%zu of %zu bytes)", got_len, len);
    free(got);
}

/* Last-Modified has one-second resolution: a rewrite after this shows a
 * later time than lm. */
static void pass_second(long long lm)
{
    while ((long long)time(NULL) <= lm)
        usleep(50 * 1000);
}

/* The "s3" object of /v1/stats (caller json_decref's the root *root). */
static json_t *stats_s3(hot_server *h, json_t **root)
{
    kc_http_result r;
    cr_assert_eq(kc_testserver_http(&h->ts, "GET", "/v1/stats", NULL, NULL, 0, false, &r), 0);
    json_error_t je;
    *root = json_loads((const char *)r.body, 0, &je);
    cr_assert_not_null(*root, "/v1/stats: %s", je.text);
    kc_http_result_free(&r);
    return json_object_get(*root, "s3");
}

static long long json_int(json_t *o, const char *name)
{
    json_t *v = json_object_get(o, name);
    cr_assert(json_is_integer(v), "/v1/stats s3.%s missing", name);
    return (long long)json_integer_value(v);
}

Test(server_s3_hot, local_hits_renew_an_old_bucket_copy_once_per_interval, .timeout = 120)
{
    kc_s3server s3;
    kc_s3server_start_or_skip(&s3, BUCKET, false);
    double offset = 0;
    hot_server h;
    server_start(&h, s3.endpoint, &offset);

    char key[65], cold[65], url[512], cold_url[512];
    size_t len, cold_len;
    uint8_t *env = envelope_of("hot-artifact", key, &len);
    uint8_t *cold_env = envelope_of("cold-artifact", cold, &cold_len);
    cr_assert_eq(request(&h, "PUT", key, env, len), 201);
    cr_assert_eq(request(&h, "PUT", cold, cold_env, cold_len), 201); /* never read */
    object_url(&s3, key, url, sizeof url);
    object_url(&s3, cold, cold_url, sizeof cold_url);
    long long lm0 = bucket_mtime(url), cold_lm0 = bucket_mtime(cold_url);
    cr_assert_gt(lm0, 0, "written through to the bucket");

    /* A fresh copy: hits check its age once and leave it alone. */
    hits(&h, key, 5);
    kcd_s3_stats st = stats_of(&h);
    cr_expect_eq(st.get_hits + st.get_misses, 0, "served locally, never read through");
    cr_expect_eq(st.refresh_checks, 1, "one age check for the new key");
    cr_expect_eq(st.refreshes, 0);
    cr_expect_eq(bucket_mtime(url), lm0);

    /* Two days on, the bucket copy is older than the interval: the next local
     * hit has it uploaded again, once, whatever the number of hits. */
    pass_second(lm0);
    offset = 2 * DAY;
    hits(&h, key, 20);
    st = stats_of(&h);
    cr_expect_eq(st.refreshes, 1, "a hot local key was not refreshed in the bucket");
    cr_expect_eq(st.refresh_checks, 2);
    cr_expect_eq(st.refresh_errors + st.refresh_dropped + st.refresh_restored, 0);
    long long lm1 = bucket_mtime(url);
    cr_expect_gt(lm1, lm0, "Last-Modified was not renewed");
    expect_bucket_holds(url, env, len);
    hits(&h, key, 20); /* still within the interval of that refresh */
    cr_expect_eq(stats_of(&h).refreshes, 1, "refreshed twice within one interval");
    cr_expect_eq(stats_of(&h).refresh_checks, 2, "checked again within the interval");
    cr_expect_eq(bucket_mtime(url), lm1);

    /* Another interval on: refreshed again. A key never read is left alone. */
    pass_second(lm1);
    offset = 3 * DAY + 60;
    hits(&h, key, 3);
    cr_expect_eq(stats_of(&h).refreshes, 2);
    cr_expect_gt(bucket_mtime(url), lm1);
    cr_expect_eq(bucket_mtime(cold_url), cold_lm0, "a key never hit was touched");

    /* The figures in /v1/stats and /metrics. */
    json_t *root, *o = stats_s3(&h, &root);
    cr_assert(json_is_object(o), "/v1/stats has no s3 object");
    cr_expect_eq(json_int(o, "refreshes"), 2);
    cr_expect_eq(json_int(o, "refresh_checks"), 3);
    cr_expect_eq(json_int(o, "refresh_dropped"), 0);
    json_decref(root);
    kc_http_result r;
    cr_assert_eq(kc_testserver_http(&h.ts, "GET", "/metrics", NULL, NULL, 0, false, &r), 0);
    cr_expect(strstr((char *)r.body, "kcached_s3_refreshes_total{result=\"ok\"} 2\n"), "%s",
              r.body);
    cr_expect(strstr((char *)r.body, "kcached_s3_refresh_checks_total 3\n"), "%s", r.body);
    cr_expect(strstr((char *)r.body, "kcached_s3_refresh_dropped_total 0\n"), "%s", r.body);
    kc_http_result_free(&r);

    server_stop(&h);
    free(env);
    free(cold_env);
    kc_s3server_stop(&s3);
}

Test(server_s3_hot, a_copy_the_lifecycle_deleted_is_put_back_by_a_local_hit, .timeout = 120)
{
    kc_s3server s3;
    kc_s3server_start_or_skip(&s3, BUCKET, false);
    double offset = 0;
    hot_server h;
    server_start(&h, s3.endpoint, &offset);
    char key[65], url[512];
    size_t len;
    uint8_t *env = envelope_of("expired-artifact", key, &len);
    cr_assert_eq(request(&h, "PUT", key, env, len), 201);
    object_url(&s3, key, url, sizeof url);
    hits(&h, key, 2);

    /* The bucket's lifecycle rule expires the object (deleted here). */
    cr_assert_eq(kc_s3server_object(url, "DELETE", NULL, NULL, NULL), 204);
    cr_assert_eq(bucket_mtime(url), -1);
    hits(&h, key, 5); /* within the interval: not looked at */
    cr_expect_eq(bucket_mtime(url), -1);
    cr_expect_eq(stats_of(&h).refresh_checks, 1);

    /* The next local hit after the interval puts it back, same bytes. */
    offset = 2 * DAY;
    hits(&h, key, 1);
    kcd_s3_stats st = stats_of(&h);
    cr_expect_eq(st.refreshes, 1, "a hot key gone from the bucket was not put back");
    cr_expect_eq(st.refresh_restored, 1);
    expect_bucket_holds(url, env, len);

    /* So a second server sharing the bucket (a real kcached) reads it
     * through instead of missing it. */
    const char *args[] = {"--s3-endpoint", s3.endpoint, "--s3-bucket", BUCKET, NULL};
    kc_testserver b;
    cr_assert_eq(kc_testserver_start(&b, NULL, args), 0, "log %s", b.log);
    char path[128];
    snprintf(path, sizeof path, "/v1/artifacts/%s", key);
    kc_http_result r;
    cr_assert_eq(kc_testserver_http(&b, "GET", path, NULL, NULL, 0, false, &r), 0);
    cr_expect_eq(r.status, 200, "the new server missed the hot key");
    cr_expect(r.len == len && memcmp(r.body, env, len) == 0);
    kc_http_result_free(&r);
    cr_expect_eq(kc_testserver_stop(&b), 0);
    kc_testserver_cleanup(&b);

    server_stop(&h);
    free(env);
    kc_s3server_stop(&s3);
}

Test(server_s3_hot, a_server_without_s3_reports_no_tier_and_serves_as_before, .timeout = 120)
{
    kc_s3server s3;
    kc_s3server_start_or_skip(&s3, BUCKET, false);
    double offset = 2 * DAY;
    hot_server with, without;
    server_start(&with, s3.endpoint, &offset);
    server_start(&without, NULL, NULL);
    char key[65];
    size_t len;
    uint8_t *env = envelope_of("plain-artifact", key, &len);
    cr_assert_eq(request(&without, "PUT", key, env, len), 201);
    for (int i = 0; i < 10; i++)
        cr_expect_eq(request(&without, "GET", key, NULL, 0), 200);
    char url[512];
    object_url(&s3, key, url, sizeof url);
    cr_expect_eq(bucket_mtime(url), -1, "a server without the tier wrote to the bucket");

    /* /v1/stats: an s3 object only where there is a tier. */
    json_t *root;
    cr_expect_null(stats_s3(&without, &root), "s3 figures without a tier");
    json_decref(root);
    json_t *o = stats_s3(&with, &root);
    cr_expect(json_is_object(o), "no s3 figures with a tier");
    json_decref(root);
    kc_http_result r;
    cr_assert_eq(kc_testserver_http(&without.ts, "GET", "/metrics", NULL, NULL, 0, false, &r), 0);
    cr_expect_null(strstr((char *)r.body, "kcached_s3_"), "s3 metrics without a tier");
    kc_http_result_free(&r);
    server_stop(&without);
    server_stop(&with);
    free(env);
    kc_s3server_stop(&s3);
}
