/*
 * test_status_page.c - GET /status: a real kcached's page, loaded in headless
 * Chromium (Debian's chromium), logs no console message and shows the
 * figures /v1/stats reports (hits, misses, entries, stored bytes), the
 * sizes by kind and device and the most missed key; in process, the hit
 * ratio sparkline follows the samples it is fed (the sampling clock is a
 * parameter) and the top-N of missed keys keeps the most missed. With an S3
 * tier (s3rver), the page's S3 section shows the refresh figures of
 * /v1/stats. The size limit, errors by code, the ccache and Redis sections
 * and human units are checked against /v1/stats too, with the page's
 * script allowed to run (Chromium's virtual time) and refresh them.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <kcache/kc_envelope.h>
#include <kcache/kc_hash.h>
#include <kcache/kc_snapshot.h>
#include "kc_s3server.h"
#include "kc_s3server_test.h"
#include "kc_testserver.h"
#include "kc_testutil.h"
#include "kcd_status.h"

static void put_artifact_meta(const kc_testserver *ts, const char *seed, const char *kind,
                              const char *meta, char key[65])
{
    kc_sha256_hex(seed, strlen(seed), key);
    uint8_t payload[2000];
    kc_test_fill_random(payload, sizeof payload, strlen(seed));
    kc_artifact a;
    kc_err e = {0};
    cr_assert_eq(kc_artifact_init(&a, key, kind, meta, payload, sizeof payload, &e), KC_OK);
    uint8_t *env;
    size_t len;
    cr_assert_eq(kc_envelope_encode(&a, &env, &len, &e), KC_OK);
    kc_artifact_free(&a);
    char path[128];
    snprintf(path, sizeof path, "/v1/artifacts/%s", key);
    kc_http_result r;
    cr_assert_eq(kc_testserver_http(ts, "PUT", path, NULL, env, len, false, &r), 0);
    cr_assert_eq(r.status, 201);
    kc_http_result_free(&r);
    free(env);
}

static void put_artifact(const kc_testserver *ts, const char *seed, const char *kind,
                         const char *device, char key[65])
{
    char meta[128];
    snprintf(meta, sizeof meta, "{\"device\":\"%s\"}", device);
    put_artifact_meta(ts, seed, kind, meta, key);
}

static long get(const kc_testserver *ts, const char *path)
{
    kc_http_result r;
    cr_assert_eq(kc_testserver_http(ts, "GET", path, NULL, NULL, 0, false, &r), 0);
    long st = r.status;
    kc_http_result_free(&r);
    return st;
}

/* The number of the page's element id="ID": its data-v attribute (the raw
 * figure behind a value shown in human units) when it has one, else the
 * text that follows the tag; -1 when there is no such element. */
static long long dom_figure(const char *dom, const char *id)
{
    char pat[64];
    int n = snprintf(pat, sizeof pat, "id=\"%s\"", id);
    cr_assert(n > 0 && n < (int)sizeof pat, "element id too long: %s", id);
    const char *p = strstr(dom, pat);
    if (!p)
        return -1;
    const char *end = strchr(p, '>'), *dv = strstr(p, "data-v=\"");
    if (dv && end && dv < end)
        return strtoll(dv + 8, NULL, 10);
    return end ? strtoll(end + 1, NULL, 10) : -1;
}

/* The text of the page's element id="ID" up to the next tag (static). */
static const char *dom_text(const char *dom, const char *id)
{
    static char text[128];
    char pat[64];
    snprintf(pat, sizeof pat, "id=\"%s\"", id);
    const char *p = strstr(dom, pat);
    text[0] = 0;
    if (p && (p = strchr(p, '>'))) {
        size_t n = strcspn(p + 1, "<");
        snprintf(text, sizeof text, "%.*s", (int)(n < sizeof text ? n : sizeof text - 1), p + 1);
    }
    return text;
}

static long long json_figure(json_t *stats, const char *section, const char *name)
{
    json_t *v = json_object_get(json_object_get(stats, section), name);
    cr_assert(json_is_integer(v), "/v1/stats has no %s.%s", section, name);
    return (long long)json_integer_value(v);
}

/* Loads url in headless Chromium, letting its timers run for budget_ms of
 * virtual time (0: none); returns the DOM, *console the console lines. */
static char *chromium_dom_after(const char *url, const char *profile, int budget_ms, char **console)
{
    char dir_arg[512], budget[64];
    snprintf(budget, sizeof budget, "--virtual-time-budget=%d", budget_ms);
    snprintf(dir_arg, sizeof dir_arg, "--user-data-dir=%s", profile);
    char *const argv[] = {"chromium",
                          "--headless",
                          "--no-sandbox",
                          "--disable-gpu",
                          "--no-first-run",
                          dir_arg,
                          "--enable-logging=stderr",
                          "--v=0",
                          "--dump-dom",
                          budget_ms ? budget : (char *)url,
                          budget_ms ? (char *)url : NULL,
                          NULL};
    kc_test_result r;
    cr_assert_eq(kc_test_run(argv, NULL, 0, 120, &r), 0, "chromium could not be started");
    cr_assert_eq(r.exit_code, 0, "chromium: %s", r.err);
    /* console messages: "[...:INFO:CONSOLE:LINE] "text", source: URL (LINE)" */
    size_t cap = 1, n = 0;
    char *lines = calloc(1, 1);
    for (char *l = strtok(r.err, "\n"); l; l = strtok(NULL, "\n")) {
        if (!strstr(l, ":CONSOLE"))
            continue;
        lines = realloc(lines, cap += strlen(l) + 1);
        n += (size_t)sprintf(lines + n, "%s\n", l);
    }
    *console = lines;
    char *dom = r.out;
    r.out = NULL;
    kc_test_result_free(&r);
    return dom;
}

static char *chromium_dom(const char *url, const char *profile, char **console)
{
    return chromium_dom_after(url, profile, 0, console);
}

Test(status_page, chromium_shows_the_figures_of_v1_stats_without_console_messages, .timeout = 300)
{
    kc_testserver ts;
    memset(&ts, 0, sizeof ts);
    const char *args[] = {"--log-level", "error", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0);
    char k1[65], k2[65], k3[65], path[128];
    put_artifact(&ts, "status-1", "cpu-so", "cpu-x86_64-v3", k1);
    put_artifact(&ts, "status-2", "spirv", "xpu-<8086:56a0>", k2); /* needs escaping */
    put_artifact(&ts, "status-3", "spirv", "xpu-<8086:56a0>", k3);
    snprintf(path, sizeof path, "/v1/artifacts/%s", k1);
    cr_expect_eq(get(&ts, path), 200);
    cr_expect_eq(get(&ts, path), 200);
    const char *missed = "/v1/artifacts/00000000000000000000000000000000000000000000000000000000000"
                         "0beef";
    for (int i = 0; i < 3; i++)
        cr_expect_eq(get(&ts, missed), 404);
    cr_expect_eq(get(&ts, "/ccache/never/there"), 404);

    char url[256], *profile = kc_test_path(ts.root, "chromium-profile"), *console = NULL;
    snprintf(url, sizeof url, "%s/status", ts.url);
    char *dom = chromium_dom(url, profile, &console);
    cr_expect_str_empty(console, "console messages while loading /status:\n%s", console);

    kc_http_result r;
    cr_assert_eq(kc_testserver_http(&ts, "GET", "/v1/stats", NULL, NULL, 0, false, &r), 0);
    json_error_t je;
    json_t *stats = json_loads((const char *)r.body, 0, &je);
    cr_assert_not_null(stats, "/v1/stats: %s", je.text);
    const char *server_figures[] = {"hits", "misses", "memory_cache_hits", "corrupt"};
    for (size_t i = 0; i < sizeof server_figures / sizeof *server_figures; i++)
        cr_expect_eq(dom_figure(dom, server_figures[i]),
                     json_figure(stats, "server", server_figures[i]), "%s", server_figures[i]);
    const char *store_figures[] = {"entries", "stored_bytes", "logical_bytes", "quarantined"};
    for (size_t i = 0; i < sizeof store_figures / sizeof *store_figures; i++)
        cr_expect_eq(dom_figure(dom, store_figures[i]),
                     json_figure(stats, "store", store_figures[i]), "%s", store_figures[i]);
    cr_expect_eq(dom_figure(dom, "hits"), 2);
    cr_expect_eq(dom_figure(dom, "misses"), 4);
    long long out = dom_figure(dom, "bytes_out");
    cr_expect(out > 0 && out <= json_figure(stats, "server", "bytes_out"), "bytes_out %lld", out);
    json_decref(stats);
    kc_http_result_free(&r);

    cr_expect(strstr(dom, "00000000000000000000000000000000000000000000000000000000000"
                          "0beef</code></td><td>3<"),
              "the most missed key and its count:\n%s", dom);
    cr_expect(strstr(dom, "never/there"), "a missed ccache path");
    cr_expect(strstr(dom, "<td>spirv</td><td>2</td>"), "sizes by kind:\n%s", dom);
    cr_expect(strstr(dom, "<td>xpu-&lt;8086:56a0&gt;</td><td>2</td>"), "sizes by device, escaped");
    cr_expect(strstr(dom, "<svg id=\"hit-ratio\""), "the sparkline");
    cr_expect(strstr(dom, "id=\"s3_state\">not configured"), "S3 tier state");
    cr_expect(strstr(dom, "id=\"version\">"), "build info");
    free(dom);
    free(console);

    /* the console check can fail: a page that logs is caught */
    dom = chromium_dom("data:text/html,<script>console.error('kc-probe')</script>", profile,
                       &console);
    cr_expect(strstr(console, "kc-probe"), "chromium's console log was not captured");
    free(dom);
    free(console);
    free(profile);
    kc_testserver_cleanup(&ts);
}

/* /v1/stats parsed (caller json_decref's). */
static json_t *stats_json(const kc_testserver *ts)
{
    kc_http_result r;
    cr_assert_eq(kc_testserver_http(ts, "GET", "/v1/stats", NULL, NULL, 0, false, &r), 0);
    json_error_t je;
    json_t *stats = json_loads((const char *)r.body, 0, &je);
    cr_assert_not_null(stats, "/v1/stats: %s", je.text);
    kc_http_result_free(&r);
    return stats;
}

Test(status_page, s3_section_shows_the_refresh_figures_of_v1_stats, .timeout = 300)
{
    kc_s3server s3;
    kc_s3server_start_or_skip(&s3, "kcd-status", true);
    kc_testserver ts;
    memset(&ts, 0, sizeof ts);
    const char *args[] = {
        "--log-level", "error",      "--s3-endpoint",      s3.endpoint,
        "--s3-bucket", "kcd-status", "--s3-write-through", "--s3-refresh-interval",
        "1s",          NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0, "log %s", ts.log);
    char key[65], path[128];
    time_t put_at = time(NULL);
    put_artifact(&ts, "status-s3", "cpu-so", "cpu-x86_64-v3", key);
    /* Last-Modified has one-second resolution: let the bucket copy get
     * older than the 1 s interval, then serve it once from the local store. */
    while (time(NULL) < put_at + 2)
        usleep(50 * 1000);
    snprintf(path, sizeof path, "/v1/artifacts/%s", key);
    cr_expect_eq(get(&ts, path), 200);
    json_t *stats = NULL, *s3s = NULL;
    for (int i = 0; i < 400; i++) { /* the refresh runs on the tier's worker */
        json_decref(stats);
        stats = stats_json(&ts);
        s3s = json_object_get(stats, "s3");
        if (json_integer_value(json_object_get(s3s, "refreshes")) >= 1 &&
            json_integer_value(json_object_get(s3s, "queue_depth")) == 0)
            break;
        usleep(50 * 1000);
    }
    cr_assert(json_is_object(s3s), "/v1/stats has no s3 object");

    char url[256], *profile = kc_test_path(ts.root, "chromium-profile"), *console = NULL;
    snprintf(url, sizeof url, "%s/status", ts.url);
    char *dom = chromium_dom(url, profile, &console);
    cr_expect_str_empty(console, "console messages while loading /status:\n%s", console);
    cr_expect(strstr(dom, "id=\"s3_state\">up"), "S3 tier state:\n%s", dom);
    const char *figures[] = {"refreshes", "refresh_checks", "refresh_restored", "refresh_errors",
                             "refresh_dropped"};
    for (size_t i = 0; i < sizeof figures / sizeof *figures; i++) {
        char id[64];
        snprintf(id, sizeof id, "s3_%s", figures[i]);
        cr_expect_eq(dom_figure(dom, id), json_figure(stats, "s3", figures[i]), "%s", figures[i]);
    }
    cr_expect_eq(dom_figure(dom, "s3_refreshes"), 1, "the local hit refreshed the bucket copy");
    json_decref(stats);
    free(dom);
    free(console);
    free(profile);
    kc_testserver_cleanup(&ts);
    kc_s3server_stop(&s3);
}

Test(status_page, sparkline_follows_the_samples_and_top_misses_keep_the_most_missed)
{
    kcd_status *s = kcd_status_new();
    cr_assert_not_null(s);
    kcd_metrics m;
    kcd_metrics_init(&m);
    kcd_status_tick(s, &m, 1000.0); /* 0 / 0 */
    m.hits = 10;                    /* +10 hits, 0 misses: ratio 1 */
    kcd_status_tick(s, &m, 1005.0); /* not due yet: ignored */
    kcd_status_tick(s, &m, 1010.0);
    m.misses = 10; /* +0 hits, +10 misses: ratio 0 */
    kcd_status_tick(s, &m, 1020.0);
    for (int i = 0; i < 40; i++) { /* more names than slots; "hot" missed most */
        char name[32];
        snprintf(name, sizeof name, "cold-%d", i);
        kcd_status_note_miss(s, name, NULL);
        kcd_status_note_miss(s, "hot", NULL);
    }
    kcd_status_view v = {&m, NULL, NULL, NULL, "/data", "off"};
    size_t len = 0;
    char *html = kcd_status_html(s, &v, &len);
    cr_assert_not_null(html);
    cr_expect_eq(strlen(html), len);
    /* two intervals: ratio 1 at the top (y = 2), then 0 at the bottom (y = 58) */
    cr_expect(strstr(html, "points=\"0.0,2.0 300.0,58.0\""), "sparkline:\n%s", html);
    cr_expect(strstr(html, "3 sample(s)"));
    const char *hot = strstr(html, "<code>hot</code></td><td>40<");
    const char *table = strstr(html, "id=\"top-misses\"");
    const char *cold = table ? strstr(table, "<code>cold") : NULL;
    cr_expect(hot && table && hot > table && (!cold || hot < cold), "the most missed first:\n%s",
              html);
    cr_expect(strstr(html, "statistics unavailable"), "no store statistics given");
    free(html);
    kcd_status_free(s);
}

/* The operator's figures: the size limit and how full the store is, errors
 * by status code, ccache's and Redis's sections, in human units, and the
 * page's script refreshing them from /v1/stats (Chromium runs it: the
 * "updated" line is written only after a fetch of /v1/stats succeeded). */
#define MISSED_KEY "000000000000000000000000000000000000000000000000000000000000f00d"

Test(status_page, chromium_shows_limit_errors_ccache_redis_in_human_units_and_refreshes,
     .timeout = 300)
{
    kc_testserver ts;
    memset(&ts, 0, sizeof ts);
    char *rdir = kc_test_mkdtemp("kcdstatus-redis"), *rpf = kc_test_path(rdir, "redis.port");
    const char *args[] = {
        "--log-level",       "error", "--max-size", "1M", "--redis-listen", "127.0.0.1:0",
        "--redis-port-file", rpf,     NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0);
    size_t plen;
    char *port = kc_test_read_file(rpf, &plen);
    cr_assert_not_null(port, "no Redis port file");
    port[strcspn(port, "\n")] = 0;
    /* three keys, two of them with a TTL (EX and PX), as the real redis-cli sets them */
    const char *sets[][6] = {{"SET", "ttl-a", "1", "EX", "1000", NULL},
                             {"SET", "ttl-b", "2", "PX", "900000", NULL},
                             {"SET", "no-ttl", "3", NULL}};
    for (size_t i = 0; i < 3; i++) {
        char *out = kc_test_redis_cli(port, sets[i][0], sets[i][1], sets[i][2], sets[i][3],
                                      sets[i][4], NULL);
        cr_assert_not_null(out, "redis-cli did not run");
        cr_expect_str_eq(out, "OK", "redis-cli SET %s", sets[i][1]);
        free(out);
    }
    char k1[65], slot[65], meta[256];
    put_artifact(&ts, "status-limit", "cpu-so", "cpu-x86_64-v3", k1);
    /* a directory snapshot's manifest, as kcache dir push stores it: the
     * slot's key as its device, "dir:NAME" as its tag */
    kc_snapshot_key("inductor-cache", "cpu-x86_64-v3", "torch-2.5", slot);
    snprintf(meta, sizeof meta, "{\"device\":\"%s\",\"tag\":\"dir:inductor-cache\"}", slot);
    put_artifact_meta(&ts, "status-manifest", "dir-manifest", meta, k1);
    kc_http_result r;
    cr_assert_eq(kc_testserver_http(&ts, "PUT", "/ccache/cc/a", NULL, "abc", 3, false, &r), 0);
    cr_assert_eq(r.status, 201);
    kc_http_result_free(&r);
    cr_expect_eq(get(&ts, "/ccache/cc/a"), 200);
    cr_expect_eq(get(&ts, "/ccache/cc/b"), 404);
    cr_expect_eq(get(&ts, "/v1/artifacts/not-a-key"), 400);
    for (int i = 0; i < 2; i++)
        cr_expect_eq(get(&ts, "/v1/artifacts/" MISSED_KEY), 404);

    char url[256], *profile = kc_test_path(ts.root, "chromium-profile"), *console = NULL;
    snprintf(url, sizeof url, "%s/status", ts.url);
    char *dom = chromium_dom_after(url, profile, 5000, &console);
    cr_expect_str_empty(console, "console messages while loading /status:\n%s", console);
    cr_expect(strstr(dom, "id=\"refreshed\" data-ok=\"1\""),
              "the script never refreshed the page from /v1/stats:\n%s", dom);
    cr_expect(!strncmp(dom_text(dom, "refreshed"), "updated ", 8), "%s",
              dom_text(dom, "refreshed"));

    json_t *stats = stats_json(&ts);
    cr_expect_eq(dom_figure(dom, "store_max_bytes"), 1 << 20);
    cr_expect_eq(json_figure(stats, "server", "store_max_bytes"), 1 << 20);
    cr_expect_str_eq(dom_text(dom, "store_max_bytes"), "1.0 MiB");
    long long stored = json_figure(stats, "store", "stored_bytes");
    char want[32];
    snprintf(want, sizeof want, "%.1f %%", 100.0 * (double)stored / (1 << 20));
    cr_expect_str_eq(dom_text(dom, "store_full"), want);
    cr_expect_eq(dom_figure(dom, "stored_bytes"), stored);
    cr_expect(strstr(dom_text(dom, "stored_bytes"), " KiB"), "stored bytes of ~2 KB in KiB: %s",
              dom_text(dom, "stored_bytes"));
    json_t *errors = json_object_get(json_object_get(stats, "server"), "errors_by_code");
    cr_assert(json_is_object(errors), "/v1/stats has no server.errors_by_code");
    cr_expect_eq(json_integer_value(json_object_get(errors, "404")), 3); /* ccache + 2 artifacts */
    cr_expect_eq(json_integer_value(json_object_get(errors, "400")), 1);
    cr_expect_eq(dom_figure(dom, "errors_404"), 3);
    cr_expect_eq(dom_figure(dom, "errors_400"), 1);
    cr_expect_eq(dom_figure(dom, "errors_200"), -1, "successes are not errors");
    cr_expect_eq(dom_figure(dom, "ccache_hits"), json_figure(stats, "ccache", "hits"));
    cr_expect_eq(dom_figure(dom, "ccache_hits"), 1);
    cr_expect_eq(dom_figure(dom, "ccache_misses"), 1);
    cr_expect_eq(dom_figure(dom, "ccache_entries"), 1);
    cr_expect_eq(dom_figure(dom, "redis_connected_clients"),
                 json_figure(stats, "redis", "connected_clients"));
    cr_expect_eq(dom_figure(dom, "redis_commands"), json_figure(stats, "redis", "commands"));
    cr_expect_eq(dom_figure(dom, "redis_keys"), 3);
    cr_expect_eq(json_figure(stats, "redis", "keys"), 3);
    cr_expect_eq(json_figure(stats, "redis", "keys_with_ttl"), 2);
    cr_expect_eq(dom_figure(dom, "redis_keys_with_ttl"), 2);
    long long ttl = dom_figure(dom, "redis_avg_ttl");
    cr_expect(ttl > 900000 && ttl <= 950000, "mean TTL of 1000 s and 900 s: %lld ms", ttl);
    char *info = kc_test_redis_cli(port, "INFO", "keyspace", NULL);
    cr_expect(info && strstr(info, "db0:keys=3,expires=2,"), "INFO keyspace agrees: %s", info);
    free(info);
    char shown[256];
    snprintf(shown, sizeof shown, "snapshot <b>inductor-cache</b> <code title=\"%s\">%.12s</code>",
             slot, slot);
    cr_expect(strstr(dom, shown), "the snapshot's slot named as a snapshot in by-device:\n%s", dom);
    snprintf(shown, sizeof shown, "<td>%s</td>", slot);
    cr_expect_null(strstr(dom, shown), "the slot's bare hash in the device column");
    cr_expect(strstr(dom, "<td>inductor-cache</td><td><code"), "the snapshots table:\n%s", dom);
    const char *up = dom_text(dom, "uptime");
    int mins = -1, secs = -1;
    cr_expect(sscanf(up, "%dm %ds", &mins, &secs) == 2 && mins >= 0 && secs >= 0 && secs < 60,
              "uptime in minutes and seconds: %s", up);
    json_decref(stats);
    free(dom);
    free(console);
    free(profile);
    kc_testserver_cleanup(&ts);
    free(port);
    unlink(rpf);
    rmdir(rdir);
    free(rpf);
    free(rdir);
}

/* Refused requests by the name they came under: a read token writing (403
 * under its NAME, escaped on the page), no token (401 "anonymous"), a token
 * the file does not hold (401 "unknown token"), in /v1/stats and on the
 * page Chromium shows after its script refreshed it. */
#define TOK_READER "tok-status-reader-51c2a9"
#define TOK_OPS "tok-status-ops-7d3e0b84"

static long request_as(const kc_testserver *ts, const char *method, const char *path,
                       const char *token)
{
    char authz[128];
    snprintf(authz, sizeof authz, "Authorization: Bearer %s", token);
    const char *headers[] = {authz, NULL};
    kc_http_result r;
    cr_assert_eq(kc_testserver_http(ts, method, path, token ? headers : NULL, "x", 1, false, &r),
                 0);
    long st = r.status;
    kc_http_result_free(&r);
    return st;
}

static long long auth_json(json_t *stats, const char *name, const char *code)
{
    json_t *af = json_object_get(json_object_get(stats, "server"), "auth_failures");
    cr_assert(json_is_object(af), "/v1/stats has no server.auth_failures");
    json_t *v = name ? json_object_get(json_object_get(json_object_get(af, "by_name"), name), code)
                     : json_object_get(af, code);
    return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

Test(status_page, refused_requests_are_counted_by_token_name_and_code, .timeout = 300)
{
    char *dir = kc_test_mkdtemp("kcdstatus-auth"), *tokens = kc_test_path(dir, "tokens");
    const char *text = TOK_READER " read reader\n" TOK_OPS " read <ops>\n";
    cr_assert_eq(kc_test_write_file(tokens, text, strlen(text)), 0);
    kc_testserver ts;
    memset(&ts, 0, sizeof ts);
    const char *args[] = {"--log-level", "error", "--tokens", tokens, "--anonymous-read", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0, "log %s", ts.log);
    const char *art = "/v1/artifacts/"
                      "00000000000000000000000000000000000000000000000000000000000000aa";
    for (int i = 0; i < 2; i++)
        cr_expect_eq(request_as(&ts, "PUT", art, TOK_READER), 403);
    cr_expect_eq(request_as(&ts, "PUT", art, TOK_OPS), 403);
    cr_expect_eq(request_as(&ts, "PUT", art, NULL), 401);
    cr_expect_eq(request_as(&ts, "GET", art, "tok-nobody-has-this-one"), 401);
    cr_expect_eq(request_as(&ts, "DELETE", art, "tok-nobody-has-this-one"), 401);

    json_t *stats = stats_json(&ts);
    cr_expect_eq(auth_json(stats, "reader", "403"), 2);
    cr_expect_eq(auth_json(stats, "reader", "401"), 0);
    cr_expect_eq(auth_json(stats, "<ops>", "403"), 1);
    cr_expect_eq(auth_json(stats, "anonymous", "401"), 1);
    cr_expect_eq(auth_json(stats, "unknown token", "401"), 2);
    cr_expect_eq(auth_json(stats, NULL, "401"), 3);
    cr_expect_eq(auth_json(stats, NULL, "403"), 3);
    json_decref(stats);

    /* counted after the page was served: only the script's refresh shows it */
    char url[256], *profile = kc_test_path(ts.root, "chromium-profile"), *console = NULL;
    snprintf(url, sizeof url, "%s/status", ts.url);
    char *dom = chromium_dom_after(url, profile, 5000, &console);
    cr_expect_str_empty(console, "console messages while loading /status:\n%s", console);
    cr_expect(strstr(dom, "id=\"refreshed\" data-ok=\"1\""), "no refresh:\n%s", dom);
    cr_expect_eq(dom_figure(dom, "auth_403_reader"), 2, "%s", dom);
    cr_expect_eq(dom_figure(dom, "auth_401_reader"), 0);
    cr_expect_eq(dom_figure(dom, "auth_401_anonymous"), 1);
    cr_expect_eq(dom_figure(dom, "auth_401_unknown token"), 2);
    cr_expect(strstr(dom, "<td>&lt;ops&gt;</td><td id=\"auth_401_&lt;ops&gt;\""),
              "the name escaped:\n%s", dom);
    cr_expect_eq(dom_figure(dom, "auth_403_&lt;ops&gt;"), 1);
    cr_expect_null(strstr(dom, "<ops>"), "a name reached the page unescaped");
    free(dom);
    free(console);
    free(profile);
    kc_testserver_cleanup(&ts);
    unlink(tokens);
    rmdir(dir);
    free(tokens);
    free(dir);
}

Test(status_page, refused_names_past_the_table_are_summed_and_never_take_two_slots)
{
    kcd_metrics m;
    kcd_metrics_init(&m);
    for (int i = 0; i < KCD_AUTH_FAIL_SLOTS + 8; i++) {
        char name[32];
        snprintf(name, sizeof name, "name-%d", i);
        kcd_metrics_auth_failure(&m, name, 401);
        kcd_metrics_auth_failure(&m, "name-0", 403); /* the same name: the same slot */
    }
    kcd_metrics_auth_failure(&m, "name-1", 200); /* not a refusal: not counted */
    size_t len;
    char *text = kcd_metrics_json(&m, NULL, NULL, &len);
    json_t *stats = json_loads(text, 0, NULL);
    cr_assert_not_null(stats);
    cr_expect_eq(auth_json(stats, NULL, "401"), KCD_AUTH_FAIL_SLOTS + 8);
    cr_expect_eq(auth_json(stats, NULL, "403"), KCD_AUTH_FAIL_SLOTS + 8);
    cr_expect_eq(auth_json(stats, "name-0", "403"), KCD_AUTH_FAIL_SLOTS + 8);
    cr_expect_eq(auth_json(stats, "name-1", "401"), 1);
    cr_expect_eq(auth_json(stats, KCD_AUTH_OTHER_NAMES, "401"), 8);
    json_t *by_name = json_object_get(
        json_object_get(json_object_get(stats, "server"), "auth_failures"), "by_name");
    cr_expect_eq(json_object_size(by_name), KCD_AUTH_FAIL_SLOTS + 1);
    json_decref(stats);
    free(text);
}

/* The most missed keys carry what the client said about them (kind, device,
 * graph), bounded and escaped; a ccache path's kind is ccache. */
Test(status_page, missed_keys_show_the_kind_device_and_graph_the_client_sent, .timeout = 120)
{
    kc_testserver ts;
    memset(&ts, 0, sizeof ts);
    const char *args[] = {"--log-level", "error", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0);
    char graph[256 + 16];
    snprintf(graph, sizeof graph, "X-Kcache-Graph: <b>g%0200d", 7); /* past the bound */
    const char *headers[] = {"X-Kcache-Kind: spirv", "X-Kcache-Device: xpu-<8086:56a0>", graph,
                             NULL};
    kc_http_result r;
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(kc_testserver_http(&ts, i ? "HEAD" : "GET", "/v1/artifacts/" MISSED_KEY,
                                        headers, NULL, 0, false, &r),
                     0);
        cr_expect_eq(r.status, 404);
        kc_http_result_free(&r);
    }
    cr_expect_eq(get(&ts, "/ccache/cc/never"), 404);
    cr_assert_eq(kc_testserver_http(&ts, "GET", "/status", NULL, NULL, 0, false, &r), 0);
    cr_assert_eq(r.status, 200);
    const char *html = (const char *)r.body;
    char want[512];
    snprintf(want, sizeof want,
             "<code>%s</code></td><td>2</td><td>spirv</td><td>xpu-&lt;8086:56a0&gt;</td>"
             "<td>&lt;b&gt;g%0*d</td></tr>",
             MISSED_KEY, KCD_MISS_HINT_MAX - 1 - 4, 0);
    cr_expect(strstr(html, want), "want %s in:\n%s", want, html);
    cr_expect(strstr(html, "<code>cc/never</code></td><td>1</td><td>ccache</td><td></td><td></td>"),
              "a ccache path's kind:\n%s", html);
    cr_expect_null(strstr(html, "<b>g"), "the graph reached the page unescaped");
    kc_http_result_free(&r);
    kc_testserver_cleanup(&ts);
}
