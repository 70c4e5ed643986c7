/*
 * test_cli_store.c - the local store commands through the real kcache
 * binary (KC_TEST_KCACHE): put/get/has/rm/ls/stats/gc/verify/export/import,
 * --json output, exit codes 0/1/2 and errors that name the key or file.
 */
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_hash.h>
#include "kc_testutil.h"

static char *dir, *cache, *cache2;

static void setup(void)
{
    dir = kc_test_mkdtemp("cli");
    cr_assert_not_null(dir);
    cache = kc_test_path(dir, "cache");
    cache2 = kc_test_path(dir, "cache2");
    unsetenv("KCACHE_DIR");
}

static void teardown(void)
{
    kc_test_rmtree(dir);
    free(dir);
    free(cache);
    free(cache2);
}

TestSuite(cli_store, .init = setup, .fini = teardown, .timeout = 60);

/* Runs kcache --cache-dir CACHE args...; NULL-terminated. */
#define KC(r, ...) kc_test_runl(r, KC_TEST_KCACHE, "--cache-dir", cache, __VA_ARGS__, NULL)

static char *write_input(const char *name, const char *text)
{
    char *p = kc_test_path(dir, name);
    cr_assert_eq(kc_test_write_file(p, text, strlen(text)), 0);
    return p;
}

static void trim(char *s)
{
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r'))
        s[--n] = '\0';
}

Test(cli_store, put_get_has_rm_round_trip)
{
    char *in = write_input("k.so", "compiled kernel bytes\n");
    kc_test_result r;
    KC(&r, "put", in, "--kind", "cpu-so", "--meta", "{\"device\":\"cpu-a\",\"tag\":\"ci\"}");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char key[128];
    snprintf(key, sizeof key, "%s", r.out);
    trim(key);
    char want[65];
    kc_sha256_hex("compiled kernel bytes\n", 22, want);
    cr_assert_str_eq(key, want, "default key is the payload's SHA-256");
    kc_test_result_free(&r);

    KC(&r, "get", key);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_str_eq(r.out, "compiled kernel bytes\n");
    kc_test_result_free(&r);

    char *out = kc_test_path(dir, "out.so");
    KC(&r, "get", key, "-o", out);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char *back = kc_test_read_file(out, NULL);
    cr_assert_str_eq(back, "compiled kernel bytes\n");
    free(back);
    kc_test_result_free(&r);

    KC(&r, "has", key);
    cr_assert_eq(r.exit_code, 0);
    kc_test_result_free(&r);
    KC(&r, "rm", key);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    KC(&r, "has", key);
    cr_assert_eq(r.exit_code, 1);
    kc_test_result_free(&r);
    KC(&r, "get", key);
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(r.err, key), "error names the key: %s", r.err);
    kc_test_result_free(&r);
    free(in);
    free(out);
}

Test(cli_store, get_into_a_fifo_writes_through_and_keeps_the_node)
{
    /* `kcache get KEY -o /dev/null` must not replace the device with a
     * file; a FIFO stands in for it here. */
    char *in = write_input("k2.so", "payload for a pipe\n");
    kc_test_result r;
    KC(&r, "put", in, "--kind", "cpu-so");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char key[128];
    snprintf(key, sizeof key, "%s", r.out);
    trim(key);
    kc_test_result_free(&r);

    char *fifo = kc_test_path(dir, "pipe");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    int rd = open(fifo, O_RDONLY | O_NONBLOCK); /* a reader, so the writer's open succeeds */
    cr_assert_geq(rd, 0);
    KC(&r, "get", key, "-o", fifo);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    char buf[64] = {0};
    ssize_t n = read(rd, buf, sizeof buf - 1);
    close(rd);
    struct stat st;
    cr_assert_eq(stat(fifo, &st), 0);
    cr_expect(S_ISFIFO(st.st_mode), "the FIFO was replaced by a regular file");
    cr_expect_eq(n, 19);
    cr_expect_str_eq(buf, "payload for a pipe\n");
    free(fifo);
    free(in);
}

Test(cli_store, put_with_explicit_key_and_json_output)
{
    char *in = write_input("g.json", "{\"ops\":[]}");
    char key[65];
    kc_sha256_hex("my-graph", 8, key);
    kc_test_result r;
    KC(&r, "--json", "put", in, "--kind", "graph", "--key", key);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert_not_null(j, "stdout is JSON: %s", r.out);
    cr_assert_str_eq(json_string_value(json_object_get(j, "key")), key);
    cr_assert(json_is_true(json_object_get(j, "created")));
    json_decref(j);
    kc_test_result_free(&r);

    KC(&r, "get", key, "--json");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    j = json_loads(r.out, 0, NULL);
    cr_assert_not_null(j, "%s", r.out);
    cr_assert_str_eq(json_string_value(json_object_get(j, "kind")), "graph");
    cr_assert_eq(json_integer_value(json_object_get(j, "size")), 10);
    json_decref(j);
    kc_test_result_free(&r);

    KC(&r, "has", key, "--json");
    j = json_loads(r.out, 0, NULL);
    cr_assert(json_is_true(json_object_get(j, "present")));
    json_decref(j);
    kc_test_result_free(&r);
    free(in);
}

Test(cli_store, ls_stats_verify_gc_with_json)
{
    const char *kinds[] = {"cpu-so", "spirv", "cpu-so"};
    const char *devs[] = {"cpu-a", "xpu-b", "cpu-a"};
    for (int i = 0; i < 3; i++) {
        char name[16], text[64], meta[64];
        snprintf(name, sizeof name, "f%d", i);
        snprintf(text, sizeof text, "payload number %d", i);
        snprintf(meta, sizeof meta, "{\"device\":\"%s\"}", devs[i]);
        char *in = write_input(name, text);
        kc_test_result r;
        KC(&r, "put", in, "--kind", kinds[i], "--meta", meta);
        cr_assert_eq(r.exit_code, 0, "%s", r.err);
        kc_test_result_free(&r);
        free(in);
    }
    kc_test_result r;
    KC(&r, "--json", "ls");
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert(json_is_array(j), "%s", r.out);
    cr_assert_eq(json_array_size(j), 3);
    json_decref(j);
    kc_test_result_free(&r);

    KC(&r, "ls", "--kind", "cpu-so", "--json");
    j = json_loads(r.out, 0, NULL);
    cr_assert_eq(json_array_size(j), 2);
    json_decref(j);
    kc_test_result_free(&r);

    KC(&r, "ls", "--device", "xpu-b");
    cr_assert_eq(r.exit_code, 0);
    cr_assert(strstr(r.out, "spirv"), "%s", r.out);
    cr_assert_null(strstr(r.out, "cpu-so"));
    kc_test_result_free(&r);

    KC(&r, "stats", "--json");
    j = json_loads(r.out, 0, NULL);
    cr_assert_eq(json_integer_value(json_object_get(j, "entries")), 3);
    json_decref(j);
    kc_test_result_free(&r);

    KC(&r, "verify", "--json");
    cr_assert_eq(r.exit_code, 0, "%s%s", r.out, r.err);
    j = json_loads(r.out, 0, NULL);
    cr_assert_eq(json_integer_value(json_object_get(j, "checked")), 3);
    cr_assert(json_is_true(json_object_get(j, "ok")));
    json_decref(j);
    kc_test_result_free(&r);

    KC(&r, "gc", "--max-size", "0", "--json");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    j = json_loads(r.out, 0, NULL);
    cr_assert_eq(json_integer_value(json_object_get(j, "evicted")), 3);
    json_decref(j);
    kc_test_result_free(&r);

    KC(&r, "gc", "--max-size", "10G");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
}

Test(cli_store, export_import_round_trip_and_truncated_bundle)
{
    for (int i = 0; i < 4; i++) {
        char name[16], text[600];
        snprintf(name, sizeof name, "a%d", i);
        snprintf(text, sizeof text, "artifact %d %0500d", i, i);
        char *in = write_input(name, text);
        kc_test_result r;
        KC(&r, "put", in, "--kind", "cpu-so", "--meta",
           i % 2 ? "{\"tag\":\"odd\"}" : "{\"tag\":\"even\"}");
        cr_assert_eq(r.exit_code, 0, "%s", r.err);
        kc_test_result_free(&r);
        free(in);
    }
    char *bundle = kc_test_path(dir, "odd.kcb");
    kc_test_result r;
    KC(&r, "export", bundle, "--tag", "odd");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", cache2, "--json", "import", bundle, NULL);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert_eq(json_integer_value(json_object_get(j, "imported")), 2, "%s", r.out);
    json_decref(j);
    kc_test_result_free(&r);

    size_t n;
    char *bytes = kc_test_read_file(bundle, &n);
    char *cut = kc_test_path(dir, "cut.kcb");
    cr_assert_eq(kc_test_write_file(cut, bytes, n - 10), 0);
    free(bytes);
    kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", cache2, "import", cut, NULL);
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(r.err, "cut.kcb"), "error names the file: %s", r.err);
    cr_assert(strstr(r.err, "truncated"), "%s", r.err);
    kc_test_result_free(&r);

    KC(&r, "import", "/nonexistent/x.kcb");
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(r.err, "/nonexistent/x.kcb"), "%s", r.err);
    kc_test_result_free(&r);
    free(bundle);
    free(cut);
}

Test(cli_store, usage_errors_exit_2_and_failures_exit_1)
{
    kc_test_result r;
    KC(&r, "put");
    cr_assert_eq(r.exit_code, 2);
    kc_test_result_free(&r);
    KC(&r, "put", "/nonexistent/file", "--kind", "blob");
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(r.err, "/nonexistent/file"), "%s", r.err);
    kc_test_result_free(&r);
    char *in = write_input("x", "x");
    KC(&r, "put", in, "--kind", "Not-A-Kind"); /* kinds are open, but lowercase */
    cr_assert_eq(r.exit_code, 2);
    cr_assert(strstr(r.err, "Not-A-Kind"), "%s", r.err);
    kc_test_result_free(&r);
    KC(&r, "gc", "--max-size", "12Q");
    cr_assert_eq(r.exit_code, 2);
    cr_assert(strstr(r.err, "12Q"), "%s", r.err);
    kc_test_result_free(&r);
    KC(&r, "has", "not-a-key");
    cr_assert_eq(r.exit_code, 1);
    kc_test_result_free(&r);
    KC(&r, "ls", "--since", "yesterday");
    cr_assert_eq(r.exit_code, 2);
    kc_test_result_free(&r);
    free(in);
}

Test(cli_store, cache_dir_comes_from_kcache_dir)
{
    setenv("KCACHE_DIR", cache2, 1);
    char *in = write_input("e", "env payload");
    kc_test_result r;
    kc_test_runl(&r, KC_TEST_KCACHE, "put", in, "--kind", "blob", NULL);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char key[128];
    snprintf(key, sizeof key, "%s", r.out);
    trim(key);
    kc_test_result_free(&r);
    kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", cache2, "has", key, NULL);
    cr_assert_eq(r.exit_code, 0);
    kc_test_result_free(&r);
    unsetenv("KCACHE_DIR");
    free(in);
}

Test(cli_store, put_reads_stdin_for_dash)
{
    char *argv[] = {KC_TEST_KCACHE, "--cache-dir", cache, "put", "-", "--kind", "blob", NULL};
    kc_test_result r;
    cr_assert_eq(kc_test_run(argv, "from stdin", 10, 30, &r), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char key[128], want[65];
    snprintf(key, sizeof key, "%s", r.out);
    trim(key);
    kc_sha256_hex("from stdin", 10, want);
    cr_assert_str_eq(key, want);
    kc_test_result_free(&r);
    KC(&r, "get", key);
    cr_assert_str_eq(r.out, "from stdin");
    kc_test_result_free(&r);
}

Test(cli_store, export_to_stdout_pipes_into_import_from_stdin)
{
    for (int i = 0; i < 3; i++) {
        char name[16], text[200];
        snprintf(name, sizeof name, "p%d", i);
        snprintf(text, sizeof text, "piped artifact %d %0100d", i, i);
        char *in = write_input(name, text);
        kc_test_result r;
        KC(&r, "put", in, "--kind", "cpu-so");
        cr_assert_eq(r.exit_code, 0, "%s", r.err);
        kc_test_result_free(&r);
        free(in);
    }
    kc_test_result ex;
    KC(&ex, "export", "-");
    cr_assert_eq(ex.exit_code, 0, "%s", ex.err);
    cr_assert(ex.out_len > 8 && !memcmp(ex.out, "KCBUNDLE", 8), "the bundle is on stdout");
    cr_assert(strstr(ex.err, "exported 3 artifacts"), "the report is on stderr: %s", ex.err);
    char *argv[] = {KC_TEST_KCACHE, "--cache-dir", cache2, "--json", "import", "-", NULL};
    kc_test_result im;
    cr_assert_eq(kc_test_run(argv, ex.out, ex.out_len, 60, &im), 0);
    cr_assert_eq(im.exit_code, 0, "%s", im.err);
    json_t *j = json_loads(im.out, 0, NULL);
    cr_assert_eq(json_integer_value(json_object_get(j, "imported")), 3, "%s", im.out);
    json_decref(j);
    kc_test_result_free(&ex);
    kc_test_result_free(&im);
}
