/*
 * test_metrics_lint.c - kcached's /metrics passes Prometheus's own linter:
 * `promtool check metrics` (Debian's prometheus package) reads the text a
 * real kcached serves after traffic on every route family (hits, misses,
 * uploads, a bundle, an error), so a new metric with a bad name, a missing
 * HELP/TYPE or a counter without _total fails CI; also with an S3 tier
 * (s3rver), whose kcached_s3_* metrics follow.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kc_s3server.h"
#include "kc_s3server_test.h"
#include "kc_testserver.h"
#include "kc_testutil.h"

static long req(const kc_testserver *ts, const char *method, const char *path, const char *body,
                kc_http_result *out)
{
    kc_http_result r;
    cr_assert_eq(
        kc_testserver_http(ts, method, path, NULL, body, body ? strlen(body) : 0, false, &r), 0);
    long st = r.status;
    if (out)
        *out = r;
    else
        kc_http_result_free(&r);
    return st;
}

/* promtool check metrics on text: passes, or says why. */
static void lint(const kc_http_result *m)
{
    kc_test_result r;
    char *const argv[] = {"promtool", "check", "metrics", NULL};
    cr_assert_eq(kc_test_run(argv, m->body, m->len, 60, &r), 0, "promtool could not be started");
    cr_expect_eq(r.exit_code, 0, "promtool check metrics:\n%s%s\n--- text ---\n%s", r.out, r.err,
                 m->body);
    kc_test_result_free(&r);
}

Test(metrics_lint, promtool_accepts_the_s3_tier_metrics, .timeout = 120)
{
    kc_s3server s3;
    kc_s3server_start_or_skip(&s3, "kcd-lint", true);
    kc_testserver ts;
    memset(&ts, 0, sizeof ts);
    const char *args[] = {"--log-level", "error", "--s3-endpoint", s3.endpoint, "--s3-bucket",
                          "kcd-lint",    NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0);
    const char *missing = "/v1/artifacts/"
                          "00000000000000000000000000000000000000000000000000000000000000ff";
    cr_expect_eq(req(&ts, "GET", missing, NULL, NULL), 404); /* a read through that misses */
    kc_http_result m;
    cr_assert_eq(req(&ts, "GET", "/metrics", NULL, &m), 200);
    cr_assert(strstr((char *)m.body, "kcached_s3_refresh_checks_total"), "metrics text:\n%s",
              m.body);
    cr_assert(strstr((char *)m.body, "kcached_s3_refresh_dropped_total"));
    lint(&m);
    kc_http_result_free(&m);
    kc_testserver_cleanup(&ts);
    kc_s3server_stop(&s3);
}

Test(metrics_lint, promtool_accepts_the_metrics_text, .timeout = 120)
{
    kc_testserver ts;
    memset(&ts, 0, sizeof ts);
    const char *args[] = {"--log-level", "error", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0);
    cr_expect_eq(req(&ts, "PUT", "/ccache/lint/a", "payload", NULL), 201);
    cr_expect_eq(req(&ts, "GET", "/ccache/lint/a", NULL, NULL), 200);
    cr_expect_eq(req(&ts, "GET", "/ccache/lint/missing", NULL, NULL), 404);
    cr_expect_eq(req(&ts, "GET", "/v1/bundle", NULL, NULL), 200);
    cr_expect_eq(req(&ts, "GET", "/no/such/route", NULL, NULL), 404);
    kc_http_result m;
    cr_assert_eq(req(&ts, "GET", "/metrics", NULL, &m), 200);
    cr_assert(strstr((char *)m.body, "kcached_"), "metrics text:\n%s", m.body);

    lint(&m);
    kc_test_result r;
    char *const argv[] = {"promtool", "check", "metrics", NULL};

    /* the linter itself must catch a bad exposition, or this test proves nothing */
    const char bad[] = "kcached_bad_counter 1\n# TYPE kcached_late counter\nkcached_late 2\n";
    cr_assert_eq(kc_test_run(argv, bad, sizeof bad - 1, 60, &r), 0);
    cr_expect_neq(r.exit_code, 0, "promtool accepted a counter without _total or HELP");
    kc_test_result_free(&r);
    kc_http_result_free(&m);
    kc_testserver_cleanup(&ts);
}
