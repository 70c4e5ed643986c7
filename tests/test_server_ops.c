/*
 * test_server_ops.c - kcached as an operator runs it (issue 27) and the
 * hardening of issue 25.14, against a real kcached on loopback: the status
 * page opened in headless Chromium and with curl through HTTP Basic, the
 * security headers of HTML answers, an unknown Transfer-Encoding, /v1/bundle's
 * Allow, duplicate and short tokens, bare ports, --check-config's bind
 * addresses and data directory, --help, and SIGHUP reloads under load.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "kc_testserver.h"
#include "kc_testutil.h"

#define TOK_R "tok-read-3f9a1c2e7b0a"
#define TOK_W "tok-write-8d4e2a6f1c0b"

static char *root;

static void setup(void)
{
    root = kc_test_mkdtemp("ops");
    cr_assert_not_null(root);
}

static void teardown(void)
{
    kc_test_rmtree(root);
    free(root);
}

TestSuite(server_ops, .init = setup, .fini = teardown, .timeout = 240);

/* Writes text to root/name with mode 0600; returns the path (caller frees). */
static char *write_private(const char *name, const char *text)
{
    char *path = kc_test_path(root, name);
    cr_assert_eq(kc_test_write_file(path, text, strlen(text)), 0);
    chmod(path, 0600);
    return path;
}

/* Stops kcached expecting a clean exit, then removes its files. */
static void finish(kc_testserver *ts)
{
    int st = kc_testserver_stop(ts);
    char *log = st ? kc_testserver_read_log(ts) : NULL;
    cr_expect_eq(st, 0, "kcached exit status %d; log:\n%s", st, log ? log : "");
    free(log);
    kc_testserver_cleanup(ts);
}

static kc_test_result check_config(const char *const *args)
{
    char *argv[24] = {KC_TEST_KCACHED, "--check-config"};
    int n = 2;
    for (; args && *args && n < 23; args++)
        argv[n++] = (char *)*args;
    argv[n] = NULL;
    kc_test_result r;
    cr_assert_eq(kc_test_run(argv, NULL, 0, 60, &r), 0);
    return r;
}

/* --------------------------------------------- 27.1: a browser can log in */

/* Loads url in headless Chromium; returns the DOM it ended with. */
static char *chromium_dom(const char *url)
{
    char *profile = kc_test_path(root, "chromium-profile");
    char dir_arg[512];
    snprintf(dir_arg, sizeof dir_arg, "--user-data-dir=%s", profile);
    free(profile);
    char *const argv[] = {"chromium",      "--headless",     "--no-sandbox",
                          "--disable-gpu", "--no-first-run", dir_arg,
                          "--dump-dom",    (char *)url,      NULL};
    kc_test_result r;
    cr_assert_eq(kc_test_run(argv, NULL, 0, 120, &r), 0, "chromium could not be started");
    cr_assert_eq(r.exit_code, 0, "chromium: %s", r.err);
    char *dom = r.out;
    r.out = NULL;
    kc_test_result_free(&r);
    return dom;
}

Test(server_ops, status_page_offers_basic_so_a_browser_logs_in, .timeout = 300)
{
    char *tok = write_private("tokens", TOK_R " read reader\n" TOK_W " write ci\n");
    kc_testserver ts;
    const char *args[] = {"--tokens", tok, NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0, "log %s", ts.log);

    /* the challenge a browser understands, beside the Bearer one for API clients */
    kc_http_result r;
    kc_testserver_http(&ts, "GET", "/status", NULL, NULL, 0, false, &r);
    cr_expect_eq(r.status, 401);
    cr_expect(strstr(r.headers, "WWW-Authenticate: Basic realm=\"kcached\""), "%s", r.headers);
    cr_expect(strstr(r.headers, "WWW-Authenticate: Bearer realm=\"kcached\""), "%s", r.headers);
    kc_http_result_free(&r);
    /* the API keeps its Bearer-only answer (no prompt in a browser for JSON) */
    kc_testserver_http(&ts, "GET", "/v1/stats", NULL, NULL, 0, false, &r);
    cr_expect_eq(r.status, 401);
    cr_expect(!strstr(r.headers, "Basic realm"), "%s", r.headers);
    kc_http_result_free(&r);

    /* Chromium answers the Basic challenge with the URL's credentials: the
     * token's name as user, or no user */
    char url[256];
    snprintf(url, sizeof url, "http://reader:%s@127.0.0.1:%u/status", TOK_R, ts.port);
    char *dom = chromium_dom(url);
    cr_expect(strstr(dom, "<h1>kcached status</h1>"), "page not shown:\n%.400s", dom);
    free(dom);
    snprintf(url, sizeof url, "http://:%s@127.0.0.1:%u/status", TOK_R, ts.port);
    dom = chromium_dom(url);
    cr_expect(strstr(dom, "<h1>kcached status</h1>"), "page not shown:\n%.400s", dom);
    free(dom);
    snprintf(url, sizeof url, "http://127.0.0.1:%u/status", ts.port);
    dom = chromium_dom(url);
    cr_expect(!strstr(dom, "<h1>kcached status</h1>"), "page shown without credentials");
    free(dom);

    /* curl -u, as an operator's script would; a wrong user name is refused */
    snprintf(url, sizeof url, "http://127.0.0.1:%u/status", ts.port);
    kc_test_result c;
    kc_test_runl(&c, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-u", ":" TOK_R, url,
                 NULL);
    cr_expect_str_eq(c.out, "200");
    kc_test_result_free(&c);
    kc_test_runl(&c, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-u", "someone:" TOK_R,
                 url, NULL);
    cr_expect_str_eq(c.out, "401");
    kc_test_result_free(&c);
    finish(&ts);
    free(tok);
}

/* -------------------------------- 25.14: headers, framing, Allow, warnings */

Test(server_ops, html_gets_csp_and_every_answer_nosniff)
{
    kc_testserver ts;
    cr_assert_eq(kc_testserver_start(&ts, NULL, NULL), 0, "log %s", ts.log);
    kc_http_result r;
    kc_testserver_http(&ts, "GET", "/status", NULL, NULL, 0, false, &r);
    cr_assert_eq(r.status, 200);
    char *csp = kc_http_header(&r, "Content-Security-Policy");
    cr_assert_not_null(csp, "%s", r.headers);
    cr_expect(strstr(csp, "default-src 'none'"), "%s", csp);
    cr_expect(strstr(csp, "frame-ancestors 'none'"), "%s", csp);
    cr_expect(strstr(csp, "script-src"), "%s", csp);
    cr_expect(!strstr(csp, "unsafe-eval"), "%s", csp);
    free(csp);
    char *nosniff = kc_http_header(&r, "X-Content-Type-Options");
    cr_expect(nosniff && !strcmp(nosniff, "nosniff"), "%s", r.headers);
    free(nosniff);
    kc_http_result_free(&r);
    kc_testserver_http(&ts, "GET", "/v1/stats", NULL, NULL, 0, false, &r);
    nosniff = kc_http_header(&r, "X-Content-Type-Options");
    cr_expect(nosniff && !strcmp(nosniff, "nosniff"), "%s", r.headers);
    free(nosniff);
    kc_http_result_free(&r);
    finish(&ts);
}

static int dial(unsigned port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    struct timeval tv = {15, 0}; /* "at once": far below --timeout's 60 s */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "%s", strerror(errno));
    return fd;
}

Test(server_ops, unknown_transfer_encoding_is_400_at_once)
{
    kc_testserver ts;
    cr_assert_eq(kc_testserver_start(&ts, NULL, NULL), 0, "log %s", ts.log);
    const char *codings[] = {"gzip", "chunked, gzip", "identity"};
    for (size_t i = 0; i < sizeof codings / sizeof codings[0]; i++) {
        char req[256];
        int n = snprintf(req, sizeof req,
                         "PUT /ccache/te HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: %s\r\n"
                         "\r\nhello",
                         codings[i]);
        int fd = dial(ts.port);
        cr_assert_eq(send(fd, req, (size_t)n, 0), n);
        char buf[256] = "";
        ssize_t got = recv(fd, buf, sizeof buf - 1, 0);
        cr_expect_gt(got, 0, "no answer to Transfer-Encoding: %s (%s)", codings[i],
                     strerror(errno));
        cr_expect(!strncmp(buf, "HTTP/1.1 400", 12), "Transfer-Encoding: %s: %s", codings[i], buf);
        close(fd);
    }
    kc_http_result r; /* chunked still works */
    kc_testserver_http(&ts, "PUT", "/ccache/te", NULL, "hello", 5, true, &r);
    cr_expect_eq(r.status, 201, "%s", r.body);
    kc_http_result_free(&r);
    finish(&ts);
}

Test(server_ops, bundle_allow_lists_head)
{
    kc_testserver ts;
    cr_assert_eq(kc_testserver_start(&ts, NULL, NULL), 0, "log %s", ts.log);
    kc_http_result r;
    kc_testserver_http(&ts, "DELETE", "/v1/bundle", NULL, NULL, 0, false, &r);
    cr_expect_eq(r.status, 405);
    char *allow = kc_http_header(&r, "Allow");
    cr_expect(allow && !strcmp(allow, "GET, HEAD, POST"), "Allow: %s", allow ? allow : "(none)");
    free(allow);
    kc_http_result_free(&r);
    kc_testserver_http(&ts, "HEAD", "/v1/bundle", NULL, NULL, 0, false, &r);
    cr_expect_eq(r.status, 200, "HEAD is listed, so it must work");
    kc_http_result_free(&r);
    finish(&ts);
}

Test(server_ops, duplicate_tokens_and_names_are_warned)
{
    char *tok =
        write_private("tokens", TOK_R " read reader\n"                     /* 1 */
                      TOK_W " write ci\n"                                  /* 2 */
                      TOK_R " admin again\n"                               /* 3: same token */
                                      "tok-other-55aa66bb77cc read ci\n"); /* 4: same name */
    const char *args[] = {"--tokens", tok, NULL};
    kc_test_result r = check_config(args);
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "tokens:3: the same token as line 1"), "%s", r.err);
    cr_expect(strstr(r.err, "tokens:4: the name 'ci' is also line 2's"), "%s", r.err);
    kc_test_result_free(&r);
    /* the running server says so too */
    kc_testserver ts;
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0, "log %s", ts.log);
    char *log = kc_testserver_read_log(&ts);
    cr_expect(strstr(log, "tokens:3: the same token as line 1"), "%s", log);
    free(log);
    finish(&ts);
    free(tok);
}

/* ------------------------------------------- 27.8: short tokens, by choice */

Test(server_ops, short_tokens_need_an_explicit_warned_option)
{
    char *tok = write_private("tokens", "secret123 read,write ccache\n"); /* 9 characters */
    kc_testserver ts;
    const char *plain[] = {"--tokens", tok, NULL};
    cr_expect_neq(kc_testserver_start(&ts, NULL, plain), 0, "started with a 9-character token");
    char *log = kc_testserver_read_log(&ts);
    cr_expect(strstr(log, "tokens:1: token of 9 characters is too short") &&
                  strstr(log, "--insecure-short-tokens"),
              "%s", log);
    free(log);
    kc_testserver_cleanup(&ts);

    const char *allowed[] = {"--tokens", tok, "--insecure-short-tokens", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, allowed), 0, "log %s", ts.log);
    log = kc_testserver_read_log(&ts);
    cr_expect(strstr(log, "warn") && strstr(log, "1 token shorter than 16 characters") &&
                  strstr(log, "(lines 1)"),
              "%s", log);
    free(log);
    const char *hs[] = {"Authorization: Bearer secret123", NULL};
    kc_http_result r;
    kc_testserver_http(&ts, "PUT", "/ccache/short", hs, "x", 1, false, &r);
    cr_expect_eq(r.status, 201);
    kc_http_result_free(&r);
    finish(&ts);
    kc_test_result c = check_config(allowed);
    cr_expect_eq(c.exit_code, 0, "%s", c.err);
    cr_expect(strstr(c.err, "warning: ") && strstr(c.err, "shorter than 16"), "%s", c.err);
    kc_test_result_free(&c);
    free(tok);
}

/* ------------------------------ 25.14 (client side): an exposed client key */

Test(server_ops, a_client_key_others_can_read_is_warned_about)
{
    char *key = kc_test_path(root, "client.key");
    kc_test_result r;
    kc_test_runl(&r, "openssl", "genpkey", "-algorithm", "ed25519", "-out", key, NULL);
    cr_assert_eq(r.exit_code, 0, "openssl genpkey: %s", r.err);
    kc_test_result_free(&r);
    char *cache = kc_test_path(root, "cache");
    chmod(key, 0644);
    kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", cache, "--client-key", key, "stats", NULL);
    cr_expect(strstr(r.err, "warning: client key") && strstr(r.err, "mode 644") &&
                  strstr(r.err, "chmod 600"),
              "%s", r.err);
    kc_test_result_free(&r);
    chmod(key, 0600);
    setenv("KCACHE_CLIENT_KEY", key, 1);
    kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", cache, "stats", NULL);
    unsetenv("KCACHE_CLIENT_KEY");
    cr_expect(!strstr(r.err, "client key"), "a private key was warned about: %s", r.err);
    kc_test_result_free(&r);
    free(cache);
    free(key);
}

/* ----------------------------------- 27.6: bare ports, binds, data directory */

Test(server_ops, a_bare_port_is_refused_with_want_host_port)
{
    const char *forms[] = {"7070", ":7070"};
    for (size_t i = 0; i < 2; i++) {
        const char *args[] = {"--listen", forms[i], NULL};
        kc_test_result r = check_config(args);
        cr_expect_eq(r.exit_code, 2, "--listen %s: %s", forms[i], r.out);
        cr_expect(strstr(r.err, "want HOST:PORT") && strstr(r.err, "127.0.0.1:7070"),
                  "--listen %s: %s", forms[i], r.err);
        kc_test_result_free(&r);
        /* and the server does not start on it (it used to bind 0.0.0.0) */
        kc_test_result s;
        kc_test_runl(&s, KC_TEST_KCACHED, "--listen", forms[i], "--data", root, NULL);
        cr_expect_eq(s.exit_code, 2, "--listen %s started: %s", forms[i], s.err);
        kc_test_result_free(&s);
    }
    const char *redis[] = {"--redis-listen", "6379", NULL};
    kc_test_result r = check_config(redis);
    cr_expect_eq(r.exit_code, 2);
    cr_expect(strstr(r.err, "--redis-listen") && strstr(r.err, "want HOST:PORT"), "%s", r.err);
    kc_test_result_free(&r);
}

Test(server_ops, check_config_prints_the_bind_addresses)
{
    char *tok = write_private("tokens", TOK_R " read reader\n");
    char *data = kc_test_path(root, "data");
    const char *args[] = {
        "--data",   data, "--listen", "localhost:7070", "--redis-listen", "0.0.0.0:6390",
        "--tokens", tok,  NULL};
    kc_test_result r = check_config(args);
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "# --listen binds 127.0.0.1:7070 (loopback only)") ||
                  strstr(r.out, "# --listen binds [::1]:7070 (loopback only)"),
              "%s", r.out);
    cr_expect(strstr(r.out, "# --redis-listen binds 0.0.0.0:6390 (every interface)"), "%s", r.out);
    kc_test_result_free(&r);
    struct stat st;
    cr_expect_neq(stat(data, &st), 0, "--check-config created the data directory");
    free(data);
    free(tok);
}

Test(server_ops, check_config_fails_on_a_data_directory_it_cannot_create_or_write)
{
    char *file = write_private("plain-file", "x");
    char *below_file = kc_test_path(file, "data");
    const char *cases[][2] = {
        {below_file, "cannot create it"}, /* a parent is a file */
        {file, "is not a directory"},
        {"/proc/kcache-data", "cannot create it in /proc"}, /* no mkdir there, even for root */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *args[] = {"--data", cases[i][0], NULL};
        kc_test_result r = check_config(args);
        cr_expect_eq(r.exit_code, 2, "--data %s: %s", cases[i][0], r.out);
        cr_expect(strstr(r.err, "--data ") && strstr(r.err, cases[i][1]), "--data %s: %s",
                  cases[i][0], r.err);
        cr_expect(!strstr(r.out, "configuration OK"), "%s", r.out);
        kc_test_result_free(&r);
    }
    /* a directory that can be made, and one that exists, pass; nothing is left behind */
    char *fresh = kc_test_path(root, "a/b/data");
    const char *args[] = {"--data", fresh, NULL};
    kc_test_result r = check_config(args);
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    const char *here[] = {"--data", root, NULL};
    r = check_config(here);
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    char *a = kc_test_path(root, "a");
    struct stat st;
    cr_expect_neq(stat(a, &st), 0, "--check-config created %s", a);
    free(a);
    free(fresh);
    free(below_file);
    free(file);
}

/* --------------------------------------- 27.7: --help names every default */

Test(server_ops, help_shows_every_option_with_its_placeholder_and_default)
{
    kc_test_result r;
    kc_test_runl(&r, KC_TEST_KCACHED, "--help", NULL);
    cr_assert_eq(r.exit_code, 0);
    const char *want[] = {"--listen HOST:PORT",
                          "(default 127.0.0.1:7070)",
                          "--data DIR",
                          "(default kcached-data)",
                          "--max-blob SIZE",
                          "(default 1G)",
                          "--upload-memory SIZE",
                          "(default 2G)",
                          "--memory-cache SIZE",
                          "(default 128M)",
                          "--tokens FILE",
                          "--timeout SECONDS",
                          "(default 60)",
                          "--max-connections N",
                          "(default 4096)",
                          "--send-mode MODE",
                          "(default auto)",
                          "--log-level LEVEL",
                          "(default info)",
                          "--redis-timeout SECONDS",
                          "(default 300)",
                          "--tls-priorities STRING",
                          "(default TLS 1.2 and 1.3 only)",
                          "--anonymous-read"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect(strstr(r.out, want[i]), "--help lacks '%s':\n%s", want[i], r.out);
    /* every option line of kcached's own section names a default */
    const char *own = strstr(r.out, "options (");
    const char *s3 = strstr(r.out, "S3-compatible");
    cr_assert(own && s3);
    unsigned options = 0, defaults = 0;
    for (const char *p = own; p < s3 && (p = strstr(p, "\n  --")) && p < s3; p++) {
        const char *next = strstr(p + 1, "\n  --");
        if (!next || next > s3)
            next = s3;
        if (!strncmp(p, "\n  --config", 11) || !strncmp(p, "\n  --check-config", 17) ||
            !strncmp(p, "\n  --help", 9))
            continue;
        options++;
        const char *d = strstr(p, "(default ");
        defaults += d && d < next;
    }
    cr_expect_geq(options, 25);
    cr_expect_eq(defaults, options, "%u of %u options show a default", defaults, options);
    kc_test_result_free(&r);
}

/* -------------------------------------------- 27.5: SIGHUP reloads tokens */

#define TOK_OLD "tok-old-1a2b3c4d5e6f7a8b"
#define TOK_NEW "tok-new-9f8e7d6c5b4a3928"
#define TOK_KEEP "tok-keep-0123456789abcdef"

typedef struct load_worker {
    const kc_testserver *ts;
    int id;
    volatile int *stop;
    unsigned done, failed;
    char first_failure[160];
} load_worker;

/* PUTs and GETs with the token that stays, until *stop. */
static void *load_main(void *arg)
{
    load_worker *w = arg;
    const char *hs[] = {"Authorization: Bearer " TOK_KEEP, NULL};
    for (unsigned i = 0; !*w->stop; i++) {
        char path[64];
        snprintf(path, sizeof path, "/ccache/load/%d/%u", w->id, i % 16);
        kc_http_result r;
        kc_testserver_http(w->ts, "PUT", path, hs, path, strlen(path), false, &r);
        long put = r.status;
        kc_http_result_free(&r);
        kc_testserver_http(w->ts, "GET", path, hs, NULL, 0, false, &r);
        long get = r.status;
        bool same = r.len == strlen(path) && r.body && !memcmp(r.body, path, r.len);
        if ((put != 201 && put != 200) || get != 200 || !same) {
            if (!w->failed++)
                snprintf(w->first_failure, sizeof w->first_failure, "PUT %ld, GET %ld%s (%.100s)",
                         put, get, same ? "" : " with other bytes", r.curl_error);
        }
        kc_http_result_free(&r);
        w->done++;
    }
    return NULL;
}

static long status_with(const kc_testserver *ts, const char *token)
{
    char h[128];
    snprintf(h, sizeof h, "Authorization: Bearer %s", token);
    const char *hs[] = {h, NULL};
    kc_http_result r;
    kc_testserver_http(ts, "GET", "/v1/stats", hs, NULL, 0, false, &r);
    long st = r.status;
    kc_http_result_free(&r);
    return st;
}

/* Waits (up to 20 s) until the log holds what, n times at least. */
static bool log_shows(const kc_testserver *ts, const char *what, int n)
{
    for (int tries = 0; tries < 200; tries++) {
        char *log = kc_testserver_read_log(ts);
        int seen = 0;
        for (const char *p = log; p && (p = strstr(p, what)); p++)
            seen++;
        free(log);
        if (seen >= n)
            return true;
        usleep(100 * 1000);
    }
    return false;
}

/* Replaces path atomically (as an editor or a config manager does). */
static void replace_file(const char *path, const char *text)
{
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s.new", path);
    cr_assert_eq(kc_test_write_file(tmp, text, strlen(text)), 0);
    chmod(tmp, 0600);
    cr_assert_eq(rename(tmp, path), 0);
}

Test(server_ops, sighup_replaces_a_token_under_load_without_failing_a_request, .timeout = 300)
{
    char *tok = write_private("tokens", TOK_OLD " read old-ci\n" TOK_KEEP " read,write builder\n");
    kc_testserver ts;
    const char *args[] = {"--tokens", tok, "--log-level", "info", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0, "log %s", ts.log);
    cr_assert_eq(status_with(&ts, TOK_OLD), 200);
    cr_assert_eq(status_with(&ts, TOK_NEW), 401);

    volatile int stop = 0;
    load_worker w[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (load_worker){.ts = &ts, .id = i, .stop = &stop};
        cr_assert_eq(pthread_create(&th[i], NULL, load_main, &w[i]), 0);
    }
    usleep(500 * 1000);
    replace_file(tok, TOK_NEW " read new-ci\n" TOK_KEEP " read,write builder\n");
    cr_assert_eq(kill(ts.pid, SIGHUP), 0);
    cr_expect(log_shows(&ts,
                        "tokens reloaded: 2 tokens, 0 certificate subjects; added new-ci; "
                        "removed old-ci",
                        1),
              "no reload logged");
    cr_expect_eq(status_with(&ts, TOK_OLD), 401, "the replaced token still works");
    cr_expect_eq(status_with(&ts, TOK_NEW), 200, "the new token does not work");

    /* a broken file changes nothing: logged with FILE:LINE, the new set stays */
    replace_file(tok, TOK_NEW " read new-ci\nshort read\n");
    cr_assert_eq(kill(ts.pid, SIGHUP), 0);
    cr_expect(log_shows(&ts, "tokens not reloaded, the old set stays in force: ", 1));
    cr_expect(log_shows(&ts, "tokens:2: token of 5 characters is too short", 1));
    cr_expect_eq(status_with(&ts, TOK_NEW), 200);
    cr_expect_eq(status_with(&ts, TOK_OLD), 401);
    usleep(300 * 1000);
    stop = 1;
    unsigned done = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        done += w[i].done;
        cr_expect_eq(w[i].failed, 0, "worker %d: %u of %u requests failed, first: %s", i,
                     w[i].failed, w[i].done, w[i].first_failure);
    }
    cr_expect_gt(done, 20, "too little load to mean anything (%u rounds)", done);
    finish(&ts); /* still running, exits cleanly */
    free(tok);
}

/* ------------------------------- 27.5: SIGHUP reloads the TLS certificate */

static void self_signed(const char *cert, const char *key, const char *cn)
{
    char subj[64];
    snprintf(subj, sizeof subj, "/CN=%s", cn);
    kc_test_result r;
    kc_test_runl(&r, "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                 "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", cert, "-days", "2",
                 "-subj", subj, "-addext", "subjectAltName=IP:127.0.0.1", NULL);
    cr_assert_eq(r.exit_code, 0, "openssl req: %s", r.err);
    kc_test_result_free(&r);
}

/* The subject line of the certificate a fresh handshake gets. */
static char *served_subject(unsigned port)
{
    char connect[64];
    snprintf(connect, sizeof connect, "127.0.0.1:%u", port);
    char *const argv[] = {"openssl", "s_client", "-connect", connect, NULL};
    kc_test_result r;
    cr_assert_eq(kc_test_run(argv, "Q\n", 2, 30, &r), 0);
    char *line = strstr(r.out, "subject=");
    char *out = strndup(line ? line : "(none)", line ? strcspn(line, "\n") : 6);
    kc_test_result_free(&r);
    return out;
}

Test(server_ops, sighup_reloads_the_tls_certificate_and_keeps_it_on_a_bad_pair)
{
    char *cert = kc_test_path(root, "cert.pem"), *key = kc_test_path(root, "key.pem");
    char *cert2 = kc_test_path(root, "cert2.pem"), *key2 = kc_test_path(root, "key2.pem");
    self_signed(cert, key, "first-cert");
    self_signed(cert2, key2, "second-cert");
    kc_testserver ts;
    const char *args[] = {"--tls-cert", cert, "--tls-key", key, NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0, "log %s", ts.log);
    snprintf(ts.cainfo, sizeof ts.cainfo, "%s", cert);
    char *subj = served_subject(ts.port);
    cr_expect(strstr(subj, "first-cert"), "%s", subj);
    free(subj);

    /* the new pair: later handshakes get it */
    cr_assert_eq(rename(cert2, cert), 0);
    cr_assert_eq(rename(key2, key), 0);
    cr_assert_eq(kill(ts.pid, SIGHUP), 0);
    cr_expect(log_shows(&ts, "TLS certificate reloaded: CN=second-cert, was CN=first-cert", 1));
    subj = served_subject(ts.port);
    cr_expect(strstr(subj, "second-cert"), "%s", subj);
    free(subj);

    /* a key that is not the certificate's: logged, the served pair stays */
    self_signed(cert2, key2, "third-cert");
    cr_assert_eq(rename(key2, key), 0); /* cert.pem is still second-cert's */
    cr_assert_eq(kill(ts.pid, SIGHUP), 0);
    cr_expect(log_shows(&ts, "TLS certificate not reloaded, the old one stays in use", 1));
    subj = served_subject(ts.port);
    cr_expect(strstr(subj, "second-cert"), "%s", subj);
    free(subj);
    finish(&ts);
    free(cert);
    free(key);
    free(cert2);
    free(key2);
}
