/*
 * test_cli_output.c - what the tool writes to a terminal or a log besides its
 * results: the plain-http credentials warning (decided on the resolved address,
 * said once per host and remembered in CACHE/state, never under -q), -q keeping
 * everything but errors quiet, and a piped log (2>&1 | cat) that reads in the
 * order things happened.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kc_testutil.h"

static char *dir, *cache, *tok;

static void setup(void)
{
    dir = kc_test_mkdtemp("cliout");
    cr_assert_not_null(dir);
    cache = kc_test_path(dir, "cache");
    tok = kc_test_path(dir, "token");
    cr_assert_eq(kc_test_write_file(tok, "a-token-for-the-test\n", 21), 0);
    chmod(tok, 0600);
    unsetenv("KCACHE_DIR");
    unsetenv("KCACHE_REMOTE");
    unsetenv("KCACHE_TOKEN");
    unsetenv("KCACHE_TOKEN_FILE");
    setenv("XDG_CONFIG_HOME", dir, 1);
}

static void teardown(void)
{
    kc_test_rmtree(dir);
    free(dir);
    free(cache);
    free(tok);
}

TestSuite(cli_output, .init = setup, .fini = teardown, .timeout = 120);

static const char *const warning = "go over plain http to a machine that is not this one";

/* `kcache [-q] --remote URL --token-file TOK push` on an empty cache: the
 * server is opened (and the warning decided) but nothing is sent, so no packet
 * leaves this machine whatever URL names. */
static void push_to(kc_test_result *r, const char *url, bool quiet)
{
    char *argv[] = {KC_TEST_KCACHE, "--cache-dir", cache,  "--remote",          (char *)url,
                    "--token-file", tok,           "push", quiet ? "-q" : NULL, NULL};
    cr_assert_eq(kc_test_run(argv, NULL, 0, 60, r), 0);
    cr_assert_eq(r->exit_code, 0, "push of nothing to %s: %s", url, r->err);
}

static int count(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

Test(cli_output, plain_http_warning_is_said_once_per_host)
{
    kc_test_result r;
    /* 192.0.2.0/24 is for documentation (RFC 5737): not this machine */
    push_to(&r, "http://192.0.2.10:7070", false);
    cr_expect_eq(count(r.err, warning), 1, "%s", r.err);
    cr_expect(strstr(r.err, "http://192.0.2.10:7070"), "names the host: %s", r.err);
    kc_test_result_free(&r);
    /* a second process, the same host: remembered in the cache's state */
    push_to(&r, "http://192.0.2.10:7070/", false);
    cr_expect_eq(count(r.err, warning), 0, "said again: %s", r.err);
    kc_test_result_free(&r);
    char *state = kc_test_path(cache, "state/plain-http-warned");
    char *text = kc_test_read_file(state, NULL);
    cr_expect(text && strstr(text, "http://192.0.2.10:7070\n"), "%s", text ? text : "(none)");
    free(text);
    free(state);
    /* another host is another warning; user:password in a URL counts too */
    push_to(&r, "http://192.0.2.10:7070,http://u:pw@192.0.2.11:7070", false);
    cr_expect_eq(count(r.err, warning), 1, "%s", r.err);
    cr_expect(strstr(r.err, "192.0.2.11") && !strstr(r.err, "pw"), "%s", r.err);
    kc_test_result_free(&r);
}

Test(cli_output, q_silences_everything_that_is_not_an_error)
{
    kc_test_result r;
    push_to(&r, "http://192.0.2.10:7070", true);
    cr_expect_eq(r.err_len, 0, "-q: %s", r.err);
    kc_test_result_free(&r);
    /* and nothing was remembered: without -q the warning still comes once */
    push_to(&r, "http://192.0.2.10:7070", false);
    cr_expect_eq(count(r.err, warning), 1, "%s", r.err);
    kc_test_result_free(&r);
    /* a token file others can read: a warning, so not under -q */
    chmod(tok, 0644);
    push_to(&r, "http://127.0.0.1:9", true);
    cr_expect_eq(r.err_len, 0, "-q: %s", r.err);
    kc_test_result_free(&r);
    push_to(&r, "http://127.0.0.1:9", false);
    cr_expect(strstr(r.err, "can be read by other users"), "%s", r.err);
    kc_test_result_free(&r);
}

/* A host name (not "localhost") whose every address is a loopback one: this
 * machine's own name, as Debian's /etc/hosts maps it to 127.0.1.1, or another
 * such name of /etc/hosts. Empty when there is none. */
static void loopback_name(char *name, size_t cap)
{
    char candidates[8][256];
    int n = 0;
    if (gethostname(candidates[n], sizeof candidates[n]) == 0)
        n++;
    FILE *f = fopen("/etc/hosts", "r");
    char line[512];
    while (f && n < 8 && fgets(line, sizeof line, f)) {
        char addr[64], host[256];
        if (sscanf(line, "%63s %255s", addr, host) == 2 && addr[0] != '#' &&
            (strncmp(addr, "127.", 4) == 0 || strcmp(addr, "::1") == 0))
            snprintf(candidates[n++], sizeof candidates[0], "%s", host);
    }
    if (f)
        fclose(f);
    name[0] = '\0';
    for (int i = 0; i < n && !name[0]; i++) {
        if (strcmp(candidates[i], "localhost") == 0 || strchr(candidates[i], ':'))
            continue;
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL, *a;
        if (getaddrinfo(candidates[i], NULL, &hints, &res) != 0)
            continue;
        bool all = true;
        for (a = res; a; a = a->ai_next) {
            char buf[64] = "";
            getnameinfo(a->ai_addr, a->ai_addrlen, buf, sizeof buf, NULL, 0, NI_NUMERICHOST);
            all &= strncmp(buf, "127.", 4) == 0 || strcmp(buf, "::1") == 0;
        }
        freeaddrinfo(res);
        if (all)
            snprintf(name, cap, "%.*s", 255, candidates[i]);
    }
}

Test(cli_output, plain_http_warning_decides_on_the_resolved_address)
{
    char name[256], url[300];
    loopback_name(name, sizeof name);
    if (!name[0])
        cr_skip_test("no host name other than localhost resolves to loopback here");
    snprintf(url, sizeof url, "http://%s:7070", name);
    kc_test_result r;
    push_to(&r, url, false);
    cr_expect_eq(count(r.err, warning), 0, "%s resolves to this machine: %s", name, r.err);
    kc_test_result_free(&r);
}

Test(cli_output, a_piped_log_keeps_the_order_of_events)
{
    /* a graph that compiles (its summary on stdout), then one that does not
     * exist (an error on stderr), through one pipe as CI logs are, then into
     * one file (the second time the graph is a hit: quick) */
    static const char *const into[] = {"2>&1 | cat", "> '%s/log' 2>&1; cat '%s/log'"};
    for (int i = 0; i < 2; i++) {
        char redirect[1200], cmd[4096];
        snprintf(redirect, sizeof redirect, into[i], dir, dir);
        snprintf(cmd, sizeof cmd,
                 "'%s' --cache-dir '%s' compile '%s/examples/mlp.json' '%s/missing.json' %s",
                 KC_TEST_KCACHE, cache, KC_TEST_SOURCE_DIR, dir, redirect);
        kc_test_result r;
        cr_assert_eq(kc_test_runl(&r, "sh", "-c", cmd, NULL), 0);
        const char *summary = strstr(r.out, "mlp.json: "), *error = strstr(r.out, "missing.json");
        cr_assert(summary && error, "%s", r.out);
        cr_expect(summary < error, "%s: the first graph's summary comes first: %s", into[i], r.out);
        kc_test_result_free(&r);
    }
}
