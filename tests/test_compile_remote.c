/*
 * test_compile_remote.c - the compile path's remote tier against a real
 * kcached: fresh artifacts are uploaded, another machine's empty cache then
 * compiles with zero compiler runs; prewarm --push fills the server; a dead
 * server costs a warning, never a failure.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kc_testserver.h"
#include "kc_testutil.h"

#define TOKEN "compile-test-token-0123456789"

#define TINY                                                                                       \
    "{\"format\":\"kcache-graph/1\",\"name\":\"tiny\","                                            \
    "\"inputs\":[{\"name\":\"x\",\"dtype\":\"f32\",\"shape\":[4,16]}],"                            \
    "\"params\":[{\"name\":\"w\",\"dtype\":\"f32\",\"shape\":[16,8]}],"                            \
    "\"nodes\":[{\"op\":\"matmul\",\"in\":[\"x\",\"w\"],\"out\":\"h\"},"                           \
    "{\"op\":\"tanh\",\"in\":[\"h\"],\"out\":\"t\"},"                                              \
    "{\"op\":\"softmax\",\"in\":[\"t\"],\"out\":\"y\"}],\"outputs\":[\"y\"]}"

#define OTHER                                                                                      \
    "{\"format\":\"kcache-graph/1\",\"name\":\"other\","                                           \
    "\"inputs\":[{\"name\":\"x\",\"dtype\":\"f32\",\"shape\":[4,12]}],"                            \
    "\"nodes\":[{\"op\":\"gelu\",\"in\":[\"x\"],\"out\":\"y\"}],\"outputs\":[\"y\"]}"

static char *tmp;
static kc_testserver ts;

static void setup(void)
{
    tmp = kc_test_mkdtemp("compile-remote");
    cr_assert_not_null(tmp);
    char *tok = kc_test_path(tmp, "tokens");
    const char *tokens = TOKEN " read,write builder\n";
    cr_assert_eq(kc_test_write_file(tok, tokens, strlen(tokens)), 0);
    const char *args[] = {"--tokens", tok, NULL};
    memset(&ts, 0, sizeof ts);
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0, "kcached did not start");
    free(tok);
}

static void teardown(void)
{
    kc_testserver_cleanup(&ts);
    kc_test_rmtree(tmp);
    free(tmp);
}

/* kcache --cache-dir TMP/cache --remote URL --token T --json CMD FILE [A...] */
static json_t *kcache(const char *cache, const char *url, int *code, const char *cmd,
                      const char *file, const char *a1, const char *a2)
{
    char *dir = kc_test_path(tmp, cache);
    const char *argv[16] = {KC_TEST_KCACHE, "--cache-dir", dir, "--json", "--token", TOKEN};
    int n = 6;
    if (url) {
        argv[n++] = "--remote";
        argv[n++] = url;
    }
    argv[n++] = cmd;
    argv[n++] = file;
    argv[n++] = a1;
    argv[n++] = a1 ? a2 : NULL;
    kc_test_result r;
    cr_assert_eq(kc_test_run((char *const *)argv, NULL, 0, 120, &r), 0);
    *code = r.exit_code;
    json_t *j = json_loads(r.out ? r.out : "", 0, NULL);
    if (r.exit_code != 0)
        cr_log_info("kcache %s stderr: %s", cmd, r.err);
    kc_test_result_free(&r);
    free(dir);
    return j;
}

static json_int_t geti(json_t *j, const char *k)
{
    cr_assert(json_is_integer(json_object_get(j, k)), "no '%s' in summary", k);
    return json_integer_value(json_object_get(j, k));
}

TestSuite(compile_remote, .init = setup, .fini = teardown, .timeout = 240);

Test(compile_remote, second_machine_compiles_nothing)
{
    char *g = kc_test_path(tmp, "tiny.json");
    kc_test_write_file(g, TINY, strlen(TINY));
    int code;
    json_t *a = kcache("a", ts.url, &code, "compile", g, NULL, NULL);
    cr_assert_eq(code, 0);
    cr_assert_eq(geti(a, "compiled"), 2);
    /* a fresh cache on "another machine" finds everything on the server */
    json_t *b = kcache("b", ts.url, &code, "compile", g, NULL, NULL);
    cr_assert_eq(code, 0);
    cr_assert_eq(geti(b, "compiled"), 0, "the server should have had every kernel");
    cr_assert(json_is_true(json_object_get(b, "graph_hit")));
    cr_assert_eq(geti(b, "remote_hits"), 2);
    /* and wrote them back locally: offline now works */
    json_t *c = kcache("b", NULL, &code, "compile", g, "--require-hit", "--offline");
    cr_assert_eq(code, 0);
    cr_assert_eq(geti(c, "compiled"), 0);
    json_decref(a);
    json_decref(b);
    json_decref(c);
    free(g);
}

Test(compile_remote, prewarm_push_then_pull_by_compile)
{
    char *g = kc_test_path(tmp, "other.json"), *m = kc_test_path(tmp, "manifest.json");
    kc_test_write_file(g, OTHER, strlen(OTHER));
    const char *man = "{\"format\":\"kcache-manifest/1\",\"graphs\":[\"other.json\"],"
                      "\"targets\":[{\"device\":\"cpu\",\"target\":\"x86-64-v2\"}]}";
    kc_test_write_file(m, man, strlen(man));
    int code;
    json_t *p = kcache("builder", ts.url, &code, "prewarm", m, "--push", NULL);
    cr_assert_eq(code, 0);
    cr_assert_eq(geti(p, "compiled"), 1);
    cr_assert_eq(geti(p, "failed"), 0);
    json_t *c = kcache("ci", ts.url, &code, "compile", g, "--target", "x86-64-v2");
    cr_assert_eq(code, 0);
    cr_assert_eq(geti(c, "compiled"), 0);
    json_decref(p);
    json_decref(c);
    free(g);
    free(m);
}

Test(compile_remote, dead_server_falls_back_to_the_compiler)
{
    char *g = kc_test_path(tmp, "tiny.json");
    kc_test_write_file(g, TINY, strlen(TINY));
    char url[128];
    snprintf(url, sizeof url, "%s", ts.url);
    kc_testserver_stop(&ts);
    int code;
    json_t *a = kcache("dead", url, &code, "compile", g, NULL, NULL);
    cr_assert_eq(code, 0, "a dead server must not fail the compile");
    cr_assert_eq(geti(a, "compiled"), 2);
    json_decref(a);
    free(g);
}

/* The implementation column of `kcache explain --autotune` for the tunable kernels, one
 * word per kernel ("onednn(tuned) tile:6x16(tuned) ..."), from cache dir `cache` offline. */
static char *tuned_impls(const char *cache, const char *g)
{
    char *dir = kc_test_path(tmp, cache);
    const char *argv[] = {KC_TEST_KCACHE, "--cache-dir", dir, "explain", g,
                          "--autotune",   "--offline",   NULL};
    kc_test_result r;
    cr_assert_eq(kc_test_run((char *const *)argv, NULL, 0, 120, &r), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char *out = calloc(1, strlen(r.out) + 1);
    for (char *l = strtok(r.out, "\n"); l; l = strtok(NULL, "\n")) {
        char kind[32], shape[96], impl[64], from[64];
        if (sscanf(l, " %*d %31s %95s %63s (%63[^)])", kind, shape, impl, from) == 4 &&
            (!strcmp(kind, "gemm") || !strcmp(kind, "conv2d")))
            sprintf(out + strlen(out), "%s(%s) ", impl, from);
    }
    kc_test_result_free(&r);
    free(dir);
    return out;
}

Test(compile_remote, a_pulling_client_gets_the_build_hosts_tuned_choice)
{
    /* the build host tunes and uploads; a fresh machine compiles the same graph with
     * --autotune: no compiler run, no benchmark, and the host's choice for every kernel */
    char *g = kc_test_path(KC_TEST_SOURCE_DIR, "examples/convnet.json");
    int code;
    json_t *host = kcache("host", ts.url, &code, "compile", g, "--autotune", NULL);
    cr_assert_eq(code, 0);
    cr_assert_gt(geti(host, "autotuned"), 0);
    json_t *ci = kcache("ci", ts.url, &code, "compile", g, "--autotune", NULL);
    cr_assert_eq(code, 0);
    cr_expect_eq(geti(ci, "compiled"), 0);
    cr_expect_eq(geti(ci, "autotuned"), 0, "the client must not tune again");
    cr_expect(json_is_true(json_object_get(ci, "graph_hit")));
    char *want = tuned_impls("host", g), *got = tuned_impls("ci", g);
    cr_expect_eq(strlen(want) > 0 && !strstr(want, "cost model"), true, "host: %s", want);
    cr_expect_str_eq(got, want, "the client's implementations differ from the build host's");
    free(want);
    free(got);
    json_decref(host);
    json_decref(ci);
    free(g);
}

/* A compile that misses on the server tells it, as request headers, what it asked for:
 * kcached's /status shows the graph's name and the device id beside the missed graph
 * record and kernels, with their kinds. */
Test(compile_remote, missed_keys_on_status_carry_the_graph_and_device_the_compile_sent)
{
    char *g = kc_test_path(tmp, "tiny.json");
    kc_test_write_file(g, TINY, strlen(TINY));
    int code;
    json_t *a = kcache("a", ts.url, &code, "compile", g, NULL, NULL);
    cr_assert_eq(code, 0);
    const char *device = json_string_value(json_object_get(a, "device"));
    cr_assert_not_null(device, "no device in the compile summary");
    const char *headers[] = {"Authorization: Bearer " TOKEN, NULL};
    kc_http_result r;
    cr_assert_eq(kc_testserver_http(&ts, "GET", "/status", headers, NULL, 0, false, &r), 0);
    cr_assert_eq(r.status, 200);
    char want[256];
    snprintf(want, sizeof want, "</td><td>graph</td><td>%s</td><td>tiny</td></tr>", device);
    cr_expect(strstr((const char *)r.body, want), "want %s in:\n%s", want, r.body);
    snprintf(want, sizeof want, "</td><td>cpu-so</td><td>%s</td><td>tiny</td></tr>", device);
    cr_expect(strstr((const char *)r.body, want), "want %s in:\n%s", want, r.body);
    kc_http_result_free(&r);
    json_decref(a);
    free(g);
}
