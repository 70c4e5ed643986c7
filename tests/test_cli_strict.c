/*
 * test_cli_strict.c - the kcache command line says what it did not do (issue 26): one
 * meaning of --device everywhere and a pull that matched nothing says what exists,
 * a malformed value is a usage error (exit 2), a typo in a manifest fails, compile
 * goes on past a bad file, --json prints JSON on failure too, and a progress line
 * appears on a terminal only. Through the real binary and a real kcached.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kc_testserver.h"
#include "kc_testutil.h"

static char *dir;

static void setup(void)
{
    dir = kc_test_mkdtemp("clistrict");
    cr_assert_not_null(dir);
    unsetenv("KCACHE_DIR");
    unsetenv("KCACHE_REMOTE");
    unsetenv("KCACHE_TOKEN");
    unsetenv("KCACHE_TOKEN_FILE");
    unsetenv("KCACHE_MAX_SIZE");
}

static void teardown(void)
{
    kc_test_rmtree(dir);
    free(dir);
}

TestSuite(cli_strict, .init = setup, .fini = teardown, .timeout = 180);

/* Runs kcache --cache-dir DIR/cache [--remote url] args... (NULL-terminated). */
static void kc_run(kc_test_result *r, const char *cache, const char *url, const char *const *args)
{
    char *c = kc_test_path(dir, cache);
    cr_assert_eq(kc_test_kcache(r, KC_TEST_KCACHE, c, url, args), 0);
    free(c);
}

#define KC(r, cache, url, ...) kc_run(r, cache, url, (const char *const[]){__VA_ARGS__, NULL})

/* A one-kernel graph (op: relu, tanh ...) written to DIR/name; the path (caller frees). */
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

/* The JSON lines of stdout, parsed; the caller frees with json_decref. */
static json_t *json_lines(const kc_test_result *r)
{
    json_t *all = json_array();
    const char *p = r->out;
    while (p && *p) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        json_error_t je;
        json_t *j = json_loadb(p, n, 0, &je);
        cr_assert(j, "not a JSON line (%s): %.*s / stderr: %s", je.text, (int)n, p, r->err);
        json_array_append_new(all, j);
        p += n + (nl != NULL);
    }
    return all;
}

static json_t *json_one(const kc_test_result *r)
{
    json_t *whole = json_loads(r->out, 0, NULL); /* ls and the store commands indent */
    if (whole)
        return whole;
    json_t *all = json_lines(r);
    cr_assert_eq(json_array_size(all), 1, "one JSON document: %s / stderr: %s", r->out, r->err);
    json_t *j = json_incref(json_array_get(all, 0));
    json_decref(all);
    return j;
}

/* This machine's CPU fingerprint id for the native target. */
static char *native_id(void)
{
    kc_test_result r;
    KC(&r, "fp", NULL, "--json", "fingerprint", "--target", "native");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = json_one(&r);
    char *id = strdup(json_string_value(json_object_get(json_array_get(j, 0), "id")));
    json_decref(j);
    kc_test_result_free(&r);
    return id;
}

/* Stores a blob for device id in cache and pushes every artifact of cache to url. */
static void put_for_device(const char *cache, const char *url, const char *id, const char *text)
{
    char *in = kc_test_path(dir, "blob.txt"), meta[300];
    cr_assert_eq(kc_test_write_file(in, text, strlen(text)), 0);
    snprintf(meta, sizeof meta, "{\"device\":\"%s\"}", id);
    kc_test_result r;
    KC(&r, cache, NULL, "put", in, "--kind", "blob", "--meta", meta);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    KC(&r, cache, url, "push", "--device", "all");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    free(in);
}

/* ---- 26.1: --device is a backend everywhere; ids have --device-id ---------------------- */

Test(cli_strict, pull_device_backend_takes_this_machines_fingerprints)
{
    kc_testserver ts = {0};
    cr_assert_eq(kc_testserver_start(&ts, NULL, NULL), 0);
    char *id = native_id();
    put_for_device("host", ts.url, id, "for this machine\n");
    put_for_device("host", ts.url, "xpu-8086-0bd5-drv00000001-00000000", "for an XPU\n");

    kc_test_result r;
    KC(&r, "ci", ts.url, "--json", "pull", "--device", "cpu");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = json_one(&r);
    cr_expect_eq(json_integer_value(json_object_get(j, "artifacts")), 1,
                 "--device cpu means this machine's CPU ids, not an id 'cpu': %s", r.out);
    json_decref(j);
    kc_test_result_free(&r);

    /* an id has its own option */
    KC(&r, "ci2", ts.url, "--json", "pull", "--device-id", "xpu-8086-0bd5-drv00000001-00000000");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    j = json_one(&r);
    cr_expect_eq(json_integer_value(json_object_get(j, "artifacts")), 1, "%s", r.out);
    json_decref(j);
    kc_test_result_free(&r);
    free(id);
    kc_testserver_cleanup(&ts);
}

Test(cli_strict, pull_that_matches_nothing_says_what_exists)
{
    kc_testserver ts = {0};
    cr_assert_eq(kc_testserver_start(&ts, NULL, NULL), 0);
    char *id = native_id();
    /* the same machine with another compiler: same words but the compiler's */
    char other[256];
    snprintf(other, sizeof other, "cpu-x86_64-native-gcc99-0badf00d");
    put_for_device("host", ts.url, other, "built elsewhere\n");

    kc_test_result r;
    KC(&r, "ci", ts.url, "pull");
    cr_assert_eq(r.exit_code, 0, "without --require-match a pull of nothing is no failure: %s",
                 r.err);
    cr_expect(strstr(r.err, "nothing on") && strstr(r.err, "matched"), "%s", r.err);
    cr_expect(strstr(r.err, "wanted: device") && strstr(r.err, id), "names what it asked: %s",
              r.err);
    cr_expect(strstr(r.err, "exists: device cpu-x86_64-native-gcc99-0badf00d"), "%s", r.err);
    cr_expect(strstr(r.err, "compiler (gcc12 here, gcc99 there)") || strstr(r.err, "compiler ("),
              "names what differs: %s", r.err);
    kc_test_result_free(&r);

    KC(&r, "ci", ts.url, "pull", "--require-match");
    cr_expect_eq(r.exit_code, 3, "--require-match: nothing matched is exit 3: %s", r.err);
    kc_test_result_free(&r);

    KC(&r, "ci", ts.url, "--json", "pull", "--require-match");
    cr_expect_eq(r.exit_code, 3, "%s", r.err);
    json_t *j = json_one(&r);
    cr_expect(json_is_false(json_object_get(j, "ok")), "%s", r.out);
    json_t *ex = json_object_get(j, "exists");
    cr_assert(json_is_array(ex) && json_array_size(ex) == 1, "%s", r.out);
    cr_expect_str_eq(json_string_value(json_object_get(json_array_get(ex, 0), "device")), other);
    json_decref(j);
    kc_test_result_free(&r);
    free(id);
    kc_testserver_cleanup(&ts);
}

Test(cli_strict, device_id_has_its_own_option_and_backends_are_checked)
{
    char *in = kc_test_path(dir, "b.txt");
    cr_assert_eq(kc_test_write_file(in, "x\n", 2), 0);
    kc_test_result r;
    KC(&r, "c", NULL, "put", in, "--kind", "blob", "--meta", "{\"device\":\"cpu-a-native-b-c\"}");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);

    KC(&r, "c", NULL, "--json", "ls", "--device-id", "cpu-a-native-b-c");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = json_one(&r);
    cr_expect_eq(json_array_size(j), 1, "%s", r.out);
    json_decref(j);
    kc_test_result_free(&r);

    /* the old spelling still works, unambiguously (no id is a backend name), with a note */
    KC(&r, "c", NULL, "--json", "ls", "--device", "cpu-a-native-b-c");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    j = json_one(&r);
    cr_expect_eq(json_array_size(j), 1, "%s", r.out);
    cr_expect(strstr(r.err, "--device-id"), "a deprecation note: %s", r.err);
    json_decref(j);
    kc_test_result_free(&r);

    KC(&r, "c", NULL, "ls", "--device", "gpu");
    cr_expect_eq(r.exit_code, 2, "%s", r.err);
    cr_expect(strstr(r.err, "unknown backend 'gpu'") && strstr(r.err, "did you mean 'cpu'?"), "%s",
              r.err);
    kc_test_result_free(&r);
    free(in);
}

/* ---- 26.14: a malformed value is a usage error --------------------------------------- */

Test(cli_strict, malformed_device_and_target_are_usage_errors)
{
    char *g = tiny_graph("g.json", "relu");
    const char *const cases[][6] = {
        {"compile", g, "--target", "avx2", NULL},  {"compile", g, "--device", "gpu", NULL},
        {"run", g, "--device", "gpu", NULL},       {"explain", g, "--target", "x86-64-v9", NULL},
        {"fingerprint", "--target", "avx2", NULL}, {"prewarm", g, "--device", "gpu", NULL},
        {"pull", "--device", "gpu", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kc_test_result r;
        kc_run(&r, "c", NULL, cases[i]);
        cr_expect_eq(r.exit_code, 2, "kcache %s %s %s: exit %d: %s", cases[i][0], cases[i][1],
                     cases[i][2], r.exit_code, r.err);
        cr_expect(strstr(r.err, "usage: kcache"), "%s", r.err);
        kc_test_result_free(&r);
    }
    kc_test_result r;
    KC(&r, "c", NULL, "compile", g, "--target", "x86-64-v33");
    cr_expect(strstr(r.err, "did you mean 'x86-64-v3'?"), "%s", r.err);
    kc_test_result_free(&r);
    free(g);
}

/* ---- 26.3 and 26.4: typos fail; compile goes on past a bad file ------------------------ */

Test(cli_strict, prewarm_refuses_a_manifest_typo)
{
    char *g = tiny_graph("g.json", "relu"), *m = kc_test_path(dir, "m.json");
    char text[600];
    snprintf(text, sizeof text,
             "{\"format\":\"kcache-manifest/1\",\"graphs\":[\"%s\"],\"targets\":[{\"device\":"
             "\"cpu\",\"taget\":\"native\"}]}",
             g);
    cr_assert_eq(kc_test_write_file(m, text, strlen(text)), 0);
    kc_test_result r;
    KC(&r, "c", NULL, "prewarm", m);
    cr_expect_eq(r.exit_code, 1, "a typo prewarmed the default target, exit 0: %s", r.err);
    cr_expect(strstr(r.err, "unknown key 'taget' (did you mean 'target'?)"), "%s", r.err);
    cr_expect(!strstr(r.out, "graph record"), "nothing compiled: %s", r.out);
    kc_test_result_free(&r);
    free(g);
    free(m);
}

Test(cli_strict, compile_goes_on_past_a_bad_file_and_points_a_manifest_to_prewarm)
{
    char *a = tiny_graph("a.json", "relu"), *b = tiny_graph("b.json", "tanh");
    char *m = kc_test_path(dir, "manifest.json");
    const char *mt = "{\"format\":\"kcache-manifest/1\",\"graphs\":[\"a.json\"],\"targets\":[]}";
    cr_assert_eq(kc_test_write_file(m, mt, strlen(mt)), 0);
    char *missing = kc_test_path(dir, "missing.json");
    kc_test_result r;
    KC(&r, "c", NULL, "--json", "compile", a, m, missing, b);
    cr_expect_eq(r.exit_code, 1, "%s", r.err);
    json_t *lines = json_lines(&r);
    cr_assert_eq(json_array_size(lines), 4, "one line per file: %s", r.out);
    cr_expect(json_is_true(json_object_get(json_array_get(lines, 0), "ok")), "%s", r.out);
    json_t *bad = json_array_get(lines, 1);
    cr_expect(json_is_false(json_object_get(bad, "ok")), "%s", r.out);
    cr_expect(strstr(json_string_value(json_object_get(bad, "error")), "kcache prewarm"), "%s",
              r.out);
    cr_expect_str_eq(json_string_value(json_object_get(json_array_get(lines, 2), "code")),
                     "not-found");
    json_t *last = json_array_get(lines, 3);
    cr_expect(json_is_true(json_object_get(last, "ok")), "b.json compiled after the bad ones: %s",
              r.out);
    cr_expect_str_eq(json_string_value(json_object_get(last, "graph")), b);
    cr_expect(strstr(r.err, "2 of 4 graphs failed"), "%s", r.err);
    json_decref(lines);
    kc_test_result_free(&r);
    free(a);
    free(b);
    free(m);
    free(missing);
}

/* ---- 26.5: --json prints JSON on failure too ----------------------------------------- */

/* The single JSON document of a failed run: ok false, the error, the code. */
static void expect_json_failure(const char *const *args, int exit_code, const char *code,
                                const char *needle)
{
    kc_test_result r;
    kc_run(&r, "c", NULL, args);
    cr_expect_eq(r.exit_code, exit_code, "%s %s: %s", args[1], args[2], r.err);
    json_t *all = json_lines(&r);
    json_t *j = json_array_get(all, json_array_size(all) - 1);
    cr_assert(j, "%s %s: nothing on stdout under --json (stderr: %s)", args[1], args[2], r.err);
    cr_expect(json_is_false(json_object_get(j, "ok")), "%s", r.out);
    cr_expect_str_eq(json_string_value(json_object_get(j, "code")), code, "%s", r.out);
    const char *e = json_string_value(json_object_get(j, "error"));
    cr_expect(e && strstr(e, needle), "error lacks '%s': %s", needle, r.out);
    json_decref(all);
    kc_test_result_free(&r);
}

Test(cli_strict, json_failures_print_json)
{
    char *g = tiny_graph("g.json", "relu"), *missing = kc_test_path(dir, "missing.json");
    expect_json_failure((const char *const[]){"--json", "compile", missing, NULL}, 1, "not-found",
                        "missing.json");
    expect_json_failure((const char *const[]){"--json", "compile", g, "--target", "avx2", NULL}, 2,
                        "usage", "avx2");
    expect_json_failure(
        (const char *const[]){"--json", "compile", g, "--offline", "--require-hit", NULL}, 1,
        "miss", "--require-hit");
    expect_json_failure((const char *const[]){"--json", "run", missing, NULL}, 1, "not-found",
                        "missing.json");
    expect_json_failure((const char *const[]){"--json", "ls", "--since", "yesterday", NULL}, 2,
                        "usage", "yesterday");
    expect_json_failure((const char *const[]){"--json", "get", "0123", NULL}, 1, "invalid", "0123");
    expect_json_failure((const char *const[]){"--json", "pull", NULL}, 1, "invalid", "no server");
    expect_json_failure((const char *const[]){"--json", "frobnicate", NULL}, 2, "usage",
                        "unknown command");
    free(g);
    free(missing);
}

Test(cli_strict, explain_and_rm_print_json_under_json)
{
    char *g = tiny_graph("g.json", "relu");
    kc_test_result r;
    KC(&r, "c", NULL, "--json", "explain", g);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = json_one(&r);
    cr_expect(json_is_true(json_object_get(j, "ok")), "%s", r.out);
    cr_expect_str_eq(json_string_value(json_object_get(j, "status")), "miss");
    cr_expect_eq(json_array_size(json_object_get(j, "kernels")), 1, "%s", r.out);
    json_decref(j);
    kc_test_result_free(&r);
    KC(&r, "c", NULL, "--json", "rm",
       "0000000000000000000000000000000000000000000000000000000000000000");
    cr_expect_eq(r.exit_code, 1, "%s", r.err);
    j = json_one(&r);
    cr_expect(json_is_false(json_object_get(j, "ok")), "%s", r.out);
    cr_expect_eq(json_array_size(json_object_get(j, "failed")), 1, "%s", r.out);
    json_decref(j);
    kc_test_result_free(&r);
    free(g);
}

Test(cli_strict, json_seconds_are_rounded_to_microseconds)
{
    char *g = tiny_graph("g.json", "relu");
    kc_test_result r;
    KC(&r, "c", NULL, "--json", "compile", g);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    const char *s = strstr(r.out, "\"seconds\":");
    cr_assert(s, "%s", r.out);
    s += strlen("\"seconds\":");
    const char *dot = strchr(s, '.');
    size_t digits = dot ? strspn(dot + 1, "0123456789") : 0;
    cr_expect(digits <= 6, "at most six decimals: %s", r.out);
    kc_test_result_free(&r);
    free(g);
}

/* ---- 26.10: a progress line on a terminal, and only there ---------------------------- */

/* Runs "kcache --cache-dir DIR/cache args" inside a pseudo-terminal (script(1)); stdout
 * and stderr come back together in r->out. */
static void on_a_tty(kc_test_result *r, const char *cache, const char *args)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s --cache-dir %s/%s %s", KC_TEST_KCACHE, dir, cache, args);
    cr_assert_eq(kc_test_runl(r, "script", "-qfec", cmd, "/dev/null", (char *)NULL), 0);
}

Test(cli_strict, compile_and_prewarm_show_kernels_on_a_terminal_only)
{
    char *g = tiny_graph("g.json", "relu"), *h = tiny_graph("h.json", "tanh");
    char args[2048];
    snprintf(args, sizeof args, "compile %s", g);
    kc_test_result r;
    on_a_tty(&r, "c", args);
    cr_assert_eq(r.exit_code, 0, "%s", r.out);
    cr_expect(strstr(r.out, "compile: ") && strstr(r.out, "1/1 kernels"),
              "kernels done / total on a terminal: %s", r.out);
    kc_test_result_free(&r);

    KC(&r, "c2", NULL, "compile", g);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(!strstr(r.err, "kernels") && !strchr(r.err, '\r'), "nothing extra in a pipe: %s",
              r.err);
    kc_test_result_free(&r);

    char *m = kc_test_path(dir, "m.json");
    char mt[600];
    snprintf(mt, sizeof mt,
             "{\"format\":\"kcache-manifest/1\",\"graphs\":[\"%s\",\"%s\"],\"targets\":"
             "[{\"device\":\"cpu\",\"target\":\"native\"}]}",
             g, h);
    cr_assert_eq(kc_test_write_file(m, mt, strlen(mt)), 0);
    snprintf(args, sizeof args, "prewarm %s", m);
    on_a_tty(&r, "c3", args);
    cr_assert_eq(r.exit_code, 0, "%s", r.out);
    cr_expect(strstr(r.out, "prewarm: 2/2 ") && strstr(r.out, "1/1 kernels"), "%s", r.out);
    kc_test_result_free(&r);
    free(g);
    free(h);
    free(m);
}

Test(cli_strict, pull_and_dir_show_progress_on_a_terminal_only)
{
    kc_testserver ts = {0};
    cr_assert_eq(kc_testserver_start(&ts, NULL, NULL), 0);
    put_for_device("host", ts.url, "cpu-a-native-b-c", "one\n");
    char args[2048];
    snprintf(args, sizeof args, "--remote %s pull --device all", ts.url);
    kc_test_result r;
    on_a_tty(&r, "ci", args);
    cr_assert_eq(r.exit_code, 0, "%s", r.out);
    cr_expect(strstr(r.out, "pull: 1/1 artifacts"), "%s", r.out);
    kc_test_result_free(&r);

    /* a directory snapshot: files, bytes, rate */
    char *src = kc_test_path(dir, "triton");
    cr_assert_eq(kc_test_runl(&r, "mkdir", "-p", src, (char *)NULL), 0);
    kc_test_result_free(&r);
    for (int i = 0; i < 3; i++) {
        char name[64];
        snprintf(name, sizeof name, "triton/k%d.bin", i);
        char *p = kc_test_path(dir, name);
        cr_assert_eq(kc_test_write_file(p, name, strlen(name)), 0);
        free(p);
    }
    snprintf(args, sizeof args, "--remote %s dir push %s --name t --version-key v1 --device-key d1",
             ts.url, src);
    on_a_tty(&r, "dA", args);
    cr_assert_eq(r.exit_code, 0, "%s", r.out);
    cr_expect(strstr(r.out, "dir push: 3/3 files") && strstr(r.out, "/s"), "%s", r.out);
    kc_test_result_free(&r);
    char *dst = kc_test_path(dir, "restored");
    snprintf(args, sizeof args, "--remote %s dir pull t %s --version-key v1 --device-key d1",
             ts.url, dst);
    on_a_tty(&r, "dB", args);
    cr_assert_eq(r.exit_code, 0, "%s", r.out);
    cr_expect(strstr(r.out, "dir pull: ") && strstr(r.out, " files"), "%s", r.out);
    kc_test_result_free(&r);

    /* not a terminal: nothing extra */
    KC(&r, "ci2", ts.url, "pull", "--device", "all");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(!strchr(r.err, '\r') && !strstr(r.err, "pull: "), "%s", r.err);
    kc_test_result_free(&r);
    free(src);
    free(dst);
    kc_testserver_cleanup(&ts);
}
