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
#include <time.h>

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

/* The value of the first sample line that starts with series (name plus any
 * labels, then a space); fails the test when there is none. */
static double sample_of(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, series, n) && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    cr_assert_fail("no sample %s in:\n%s", series, text);
    return 0;
}

Test(metrics_lint, metrics_export_the_limit_build_and_process_series, .timeout = 120)
{
    kc_testserver ts;
    memset(&ts, 0, sizeof ts);
    const char *args[] = {"--log-level", "error", "--max-size", "3M", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0);
    cr_expect_eq(req(&ts, "PUT", "/ccache/lint/a", "payload", NULL), 201);
    kc_http_result m;
    cr_assert_eq(req(&ts, "GET", "/metrics", NULL, &m), 200);
    const char *t = (const char *)m.body;
    cr_expect_eq(sample_of(t, "kcached_store_max_bytes"), 3.0 * 1024 * 1024);
    char build[256];
    snprintf(build, sizeof build, "kcached_build_info{version=\"%s\",commit=\"", KC_VERSION);
    const char *b = strstr(t, build);
    cr_assert(b, "no %s in:\n%s", build, t);
    b += strlen(build);
    size_t hex = strspn(b, "0123456789abcdef");
    cr_expect(hex >= 7 || !strncmp(b, "unknown\"", 8), "commit label: %.40s", b);
    cr_expect(!strncmp(strchr(b, '}'), "} 1\n", 4));
    double cpu = sample_of(t, "process_cpu_seconds_total");
    cr_expect(cpu > 0 && cpu < 600, "process_cpu_seconds_total %g", cpu);
    double rss = sample_of(t, "process_resident_memory_bytes");
    cr_expect(rss > 1e6 && rss < 4e9, "process_resident_memory_bytes %g", rss);
    double fds = sample_of(t, "process_open_fds");
    cr_expect(fds >= 4 && fds < 1000, "process_open_fds %g", fds); /* std{in,out,err}, a socket */
    double start = sample_of(t, "process_start_time_seconds");
    double now = (double)time(NULL);
    cr_expect(start > now - 120 && start <= now + 1, "process_start_time_seconds %f, now %f", start,
              now);
    lint(&m);
    kc_http_result_free(&m);
    kc_testserver_cleanup(&ts);

    /* without a limit there is nothing to compare against: no series */
    const char *unlimited[] = {"--log-level", "error", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, unlimited), 0);
    cr_assert_eq(req(&ts, "GET", "/metrics", NULL, &m), 200);
    cr_expect_null(strstr((char *)m.body, "kcached_store_max_bytes"));
    kc_http_result_free(&m);
    kc_testserver_cleanup(&ts);
}
