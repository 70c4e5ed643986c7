/*
 * test_cli_publish.c - a build host that publishes nothing says so (issue 26.2), against
 * a real kcached with tokens and anonymous reads: a token given and refused (401) fails
 * the command naming where it came from while reads go on; a client without credentials
 * is a quiet reader (one upload attempt at most, exit 0); a valid read-only token is
 * quiet; push, prewarm --push and dir push fail whenever anything they were asked to
 * publish was not; "offline" is said only of a server that cannot be reached.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kc_testserver.h"
#include "kc_testutil.h"

#define TOK_READ "reader-token-0123456789abcdef"
#define TOK_WRITE "writer-token-0123456789abcdef"

static char *dir;
static kc_testserver ts;

static void setup(void)
{
    dir = kc_test_mkdtemp("clipublish");
    cr_assert_not_null(dir);
    unsetenv("KCACHE_DIR");
    unsetenv("KCACHE_REMOTE");
    unsetenv("KCACHE_TOKEN");
    unsetenv("KCACHE_TOKEN_FILE");
    unsetenv("KCACHE_MAX_SIZE");
    char *tok = kc_test_path(dir, "tokens");
    const char *tokens = TOK_READ " read ci\n" TOK_WRITE " read,write builder\n";
    cr_assert_eq(kc_test_write_file(tok, tokens, strlen(tokens)), 0);
    const char *args[] = {"--tokens", tok, "--anonymous-read", NULL};
    memset(&ts, 0, sizeof ts);
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0);
    free(tok);
}

static void teardown(void)
{
    kc_testserver_cleanup(&ts);
    kc_test_rmtree(dir);
    free(dir);
}

TestSuite(cli_publish, .init = setup, .fini = teardown, .timeout = 240);

/* Runs kcache --cache-dir DIR/cache --remote SERVER args... with $KCACHE_TOKEN set to
 * token (NULL: unset). */
static void kc_run(kc_test_result *r, const char *cache, const char *token, const char *const *args)
{
    if (token)
        setenv("KCACHE_TOKEN", token, 1);
    else
        unsetenv("KCACHE_TOKEN");
    char *c = kc_test_path(dir, cache);
    cr_assert_eq(kc_test_kcache(r, KC_TEST_KCACHE, c, ts.url, args), 0);
    free(c);
    unsetenv("KCACHE_TOKEN");
}

#define KC(r, cache, token, ...) kc_run(r, cache, token, (const char *const[]){__VA_ARGS__, NULL})

/* A one-kernel graph written to DIR/name (caller frees the path). */
static char *tiny_graph(const char *name, const char *op)
{
    char text[512];
    snprintf(text, sizeof text,
             "{\"format\":\"kcache-graph/1\",\"name\":\"%s\",\"inputs\":[{\"name\":\"x\","
             "\"dtype\":\"f32\",\"shape\":[4,4]}],\"nodes\":[{\"op\":\"%s\",\"in\":[\"x\"],"
             "\"out\":\"y\"}],\"outputs\":[\"y\"]}",
             op, op);
    char *p = kc_test_path(dir, name);
    cr_assert_eq(kc_test_write_file(p, text, strlen(text)), 0);
    return p;
}

/* JSON line i of stdout (the caller frees). */
static json_t *line(const kc_test_result *r, int i)
{
    const char *p = r->out;
    for (int k = 0; k < i && p; k++)
        p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL;
    cr_assert(p && *p, "no line %d: %s / stderr: %s", i, r->out, r->err);
    json_t *j = json_loadb(p, strcspn(p, "\n"), 0, NULL);
    cr_assert(j, "line %d is not JSON: %s", i, r->out);
    return j;
}

static json_int_t num(json_t *j, const char *k)
{
    return json_integer_value(json_object_get(j, k));
}

/* How many lines of text contain needle. */
static int lines_with(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; p && *p;) {
        size_t len = strcspn(p, "\n");
        char l[2048];
        snprintf(l, sizeof l, "%.*s", (int)len, p);
        n += strstr(l, needle) != NULL;
        p += len + (p[len] == '\n');
    }
    return n;
}

/* kcached_requests_total{route="artifact_put",code="CODE"} from /metrics. */
static long puts_answered(const char *code)
{
    kc_http_result h;
    const char *hdr[] = {"Authorization: Bearer " TOK_READ, NULL};
    cr_assert_eq(kc_testserver_http(&ts, "GET", "/metrics", hdr, NULL, 0, false, &h), 0);
    cr_assert_eq(h.status, 200);
    char needle[96];
    snprintf(needle, sizeof needle, "route=\"artifact_put\",code=\"%s\"} ", code);
    const char *p = strstr((const char *)h.body, needle);
    long n = p ? strtol(p + strlen(needle), NULL, 10) : 0;
    kc_http_result_free(&h);
    return n;
}

/* The build host publishes graph g (its kernel and graph record). */
static void publish(const char *g)
{
    kc_test_result r;
    KC(&r, "host", TOK_WRITE, "compile", g);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
}

Test(cli_publish, a_refused_token_fails_naming_its_source_while_reads_go_on)
{
    char *g1 = tiny_graph("g1.json", "relu"), *g2 = tiny_graph("g2.json", "tanh");
    publish(g1);
    kc_test_result r;
    KC(&r, "b", "wrong-token", "--json", "compile", g1, g2);
    cr_expect_eq(r.exit_code, 1, "a refused token is an error: %s", r.err);
    json_t *a = line(&r, 0), *b = line(&r, 1), *end = line(&r, 2);
    cr_expect_eq(num(a, "remote_hits"), 1, "reads went on without the token: %s", r.out);
    cr_expect_eq(num(a, "compiled"), 0, "%s", r.out);
    cr_expect_eq(num(b, "compiled"), 1, "%s", r.out);
    cr_expect(json_is_false(json_object_get(end, "ok")), "%s", r.out);
    cr_expect_str_eq(json_string_value(json_object_get(end, "code")), "auth");
    cr_expect(strstr(r.err, "2 artifact(s) not published") &&
                  strstr(r.err, "refused the token from $KCACHE_TOKEN"),
              "%s", r.err);
    cr_expect(!strstr(r.err, "offline"), "the server was reachable: %s", r.err);
    json_decref(a);
    json_decref(b);
    json_decref(end);
    kc_test_result_free(&r);

    /* nothing left to upload (every kernel a hit): the refusal is still an error, and
     * no "0 artifact(s)" count is made up for it */
    KC(&r, "b2", "wrong-token", "compile", g1);
    cr_expect_eq(r.exit_code, 1, "%s", r.err);
    cr_expect(strstr(r.err, "refused the token from $KCACHE_TOKEN (HTTP 401)"), "%s", r.err);
    cr_expect(!strstr(r.err, "0 artifact(s)"), "%s", r.err);
    kc_test_result_free(&r);

    /* the source is named whatever it is */
    char *tf = kc_test_path(dir, "token"), flag[600];
    cr_assert_eq(kc_test_write_file(tf, "stale-token\n", 12), 0);
    snprintf(flag, sizeof flag, "--token-file=%s", tf);
    KC(&r, "c", NULL, flag, "compile", g2);
    cr_expect_eq(r.exit_code, 1, "%s", r.err);
    char want[700];
    snprintf(want, sizeof want, "refused the token from --token-file %s", tf);
    cr_expect(strstr(r.err, want), "%s", r.err);
    kc_test_result_free(&r);
    free(tf);
    free(g1);
    free(g2);
}

Test(cli_publish, a_client_without_credentials_is_a_quiet_reader)
{
    char *g1 = tiny_graph("g1.json", "relu"), *g2 = tiny_graph("g2.json", "tanh"),
         *g3 = tiny_graph("g3.json", "exp");
    publish(g1);
    long before = puts_answered("401");
    kc_test_result r;
    KC(&r, "ci", NULL, "--json", "compile", g1, g2, g3);
    cr_expect_eq(r.exit_code, 0, "a reader exits 0: %s", r.err);
    json_t *a = line(&r, 0);
    cr_expect_eq(num(a, "remote_hits"), 1, "reads go on: %s / %s", r.out, r.err);
    json_decref(a);
    cr_expect(!strstr(r.err, "warning"), "quiet: %s", r.err);
    cr_expect_eq(lines_with(r.err, "not published"), 1, "one info line: %s", r.err);
    cr_expect_leq(puts_answered("401") - before, 1, "one upload tried at most");
    kc_test_result_free(&r);
    free(g1);
    free(g2);
    free(g3);
}

Test(cli_publish, a_read_only_token_is_quiet)
{
    char *g1 = tiny_graph("g1.json", "relu"), *g2 = tiny_graph("g2.json", "tanh");
    publish(g1);
    kc_test_result r;
    KC(&r, "ci", TOK_READ, "--json", "compile", g1, g2);
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    json_t *a = line(&r, 0);
    cr_expect_eq(num(a, "remote_hits"), 1, "%s", r.out);
    json_decref(a);
    cr_expect(!strstr(r.err, "warning"), "a reader on purpose is no warning: %s", r.err);
    cr_expect_leq(lines_with(r.err, "kcache"), 1, "one info line at most: %s", r.err);
    kc_test_result_free(&r);
    free(g1);
    free(g2);
}

Test(cli_publish, push_fails_whenever_anything_is_not_published)
{
    char *in = kc_test_path(dir, "blob");
    cr_assert_eq(kc_test_write_file(in, "payload\n", 8), 0);
    kc_test_result r;
    KC(&r, "a", NULL, "put", in, "--kind", "blob");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);

    const char *tokens[] = {TOK_READ, NULL, "wrong-token"};
    const char *says[] = {"lacks the write scope", "wants a token",
                          "refused the token from $KCACHE_TOKEN"};
    for (int i = 0; i < 3; i++) {
        KC(&r, "a", tokens[i], "push");
        cr_expect_eq(r.exit_code, 1, "token %s: %s", tokens[i] ? tokens[i] : "(none)", r.err);
        cr_expect(strstr(r.err, "1 of 1 artifact(s) not published"), "%s", r.err);
        cr_expect(strstr(r.err, says[i]), "token %s: %s", tokens[i] ? tokens[i] : "(none)", r.err);
        cr_expect(!strstr(r.err, "offline"), "%s", r.err);
        kc_test_result_free(&r);
    }
    KC(&r, "a", TOK_WRITE, "--json", "push");
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);

    /* prewarm --push with a refused token: an error about the token, not "offline" */
    char *g = tiny_graph("g.json", "relu"), *m = kc_test_path(dir, "m.json");
    char mt[600];
    snprintf(mt, sizeof mt,
             "{\"format\":\"kcache-manifest/1\",\"graphs\":[\"%s\"],\"targets\":[{\"device\":"
             "\"cpu\",\"target\":\"native\"}]}",
             g);
    cr_assert_eq(kc_test_write_file(m, mt, strlen(mt)), 0);
    KC(&r, "p", "wrong-token", "prewarm", m, "--push");
    cr_expect_eq(r.exit_code, 1, "%s", r.err);
    cr_expect(strstr(r.err, "refused the token from $KCACHE_TOKEN"), "%s", r.err);
    cr_expect(!strstr(r.err, "offline"), "%s", r.err);
    kc_test_result_free(&r);

    /* dir push with a read-only token */
    char *src = kc_test_path(dir, "cachedir"), *f = kc_test_path(dir, "cachedir/k.bin");
    cr_assert_eq(kc_test_runl(&r, "mkdir", "-p", src, (char *)NULL), 0);
    kc_test_result_free(&r);
    cr_assert_eq(kc_test_write_file(f, "kernel\n", 7), 0);
    KC(&r, "d", TOK_READ, "dir", "push", src, "--name", "t", "--version-key", "v1", "--device-key",
       "d1");
    cr_expect_eq(r.exit_code, 1, "%s", r.err);
    cr_expect(strstr(r.err, "not published"), "%s", r.err);
    kc_test_result_free(&r);
    free(src);
    free(f);
    free(g);
    free(m);
    free(in);
}
