/*
 * test_cli_options.c - every kcache command parses its options the same way
 * (client/kcache/kc_cli_opts.c), checked through the real binary: unknown
 * options, missing and bad values are usage errors (exit 2) naming what is
 * wrong, and ages (--since 7d) and sizes (10G) mean the same everywhere.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kc_testutil.h"

static char *dir, *cache;

static void setup(void)
{
    dir = kc_test_mkdtemp("cliopts");
    cr_assert_not_null(dir);
    cache = kc_test_path(dir, "cache");
    unsetenv("KCACHE_DIR");
    unsetenv("KCACHE_REMOTE");
    unsetenv("KCACHE_MAX_SIZE");
}

static void teardown(void)
{
    kc_test_rmtree(dir);
    free(dir);
    free(cache);
}

TestSuite(cli_opts, .init = setup, .fini = teardown, .timeout = 60);

/* Runs kcache --cache-dir CACHE args... (args NULL-terminated). */
static void kcache(kc_test_result *r, const char *const *args)
{
    char *argv[32] = {KC_TEST_KCACHE, "--cache-dir", cache};
    int n = 3;
    for (int i = 0; args[i]; i++) {
        cr_assert_lt(n, 31);
        argv[n++] = (char *)args[i];
    }
    argv[n] = NULL;
    cr_assert_eq(kc_test_run(argv, NULL, 0, 30, r), 0);
}

#define KC(r, ...) kcache(r, (const char *const[]){__VA_ARGS__, NULL})

/* Expects exit 2 with every one of the NULL-terminated needles in stderr. */
static void expect_usage(const char *const *args, const char *const *needles)
{
    kc_test_result r;
    kcache(&r, args);
    char line[512] = "";
    for (int i = 0; args[i]; i++) {
        strncat(line, " ", sizeof line - strlen(line) - 1);
        strncat(line, args[i], sizeof line - strlen(line) - 1);
    }
    cr_expect_eq(r.exit_code, 2, "kcache%s: exit %d, stderr: %s", line, r.exit_code, r.err);
    for (int i = 0; needles[i]; i++)
        cr_expect(strstr(r.err, needles[i]), "kcache%s: stderr lacks '%s': %s", line, needles[i],
                  r.err);
    cr_expect(strstr(r.err, "usage: kcache"), "kcache%s: no usage line: %s", line, r.err);
    kc_test_result_free(&r);
}

#define USAGE(args, ...)                                                                           \
    expect_usage((const char *const[]){args, NULL}, (const char *const[]){__VA_ARGS__, NULL})
#define ARGS(...) __VA_ARGS__

/* A stored blob; returns its key in key. */
static void put_blob(const char *text, char key[65])
{
    char *in = kc_test_path(dir, "in.txt");
    cr_assert_eq(kc_test_write_file(in, text, strlen(text)), 0);
    kc_test_result r;
    KC(&r, "put", in, "--kind", "blob", "--meta", "{\"tag\":\"t1\"}");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    snprintf(key, 65, "%s", r.out);
    kc_test_result_free(&r);
    free(in);
}

static size_t ls_count(const char *const *filter)
{
    const char *args[16] = {"--json", "ls"};
    int n = 2;
    for (int i = 0; filter[i]; i++)
        args[n++] = filter[i];
    args[n] = NULL;
    kc_test_result r;
    kcache(&r, args);
    cr_assert_eq(r.exit_code, 0, "ls %s: %s", filter[0] ? filter[0] : "", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert(json_is_array(j), "ls --json prints an array: %s", r.out);
    size_t count = json_array_size(j);
    json_decref(j);
    kc_test_result_free(&r);
    return count;
}

Test(cli_opts, ls_since_takes_ages_like_pull)
{
    char key[65];
    put_blob("recent artifact\n", key);
    cr_expect_eq(ls_count((const char *const[]){"--since", "7d", NULL}), 1);
    cr_expect_eq(ls_count((const char *const[]){"--since=12h", NULL}), 1);
    cr_expect_eq(ls_count((const char *const[]){"--since", "30m", NULL}), 1);
    cr_expect_eq(ls_count((const char *const[]){"--since", "2w", "--tag", "t1", NULL}), 1);
    cr_expect_eq(ls_count((const char *const[]){"--since", "0", NULL}), 1, "unix seconds");
    /* 2100-01-01: nothing was created after it */
    cr_expect_eq(ls_count((const char *const[]){"--since", "4102444800", NULL}), 0);
    /* an age longer than the epoch is "everything" */
    cr_expect_eq(ls_count((const char *const[]){"--since", "99999999w", NULL}), 1);
}

Test(cli_opts, export_since_age_is_resolved_to_unix_seconds)
{
    char key[65];
    put_blob("exported artifact\n", key);
    char *bundle = kc_test_path(dir, "b.kcb");
    time_t before = time(NULL);
    kc_test_result r;
    KC(&r, "--json", "export", bundle, "--since", "7d");
    time_t after = time(NULL);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert_not_null(j, "%s", r.out);
    cr_expect_eq(json_integer_value(json_object_get(j, "artifacts")), 1);
    json_int_t since = json_integer_value(json_object_get(json_object_get(j, "filter"), "since"));
    cr_expect(since >= before - 7 * 86400 && since <= after - 7 * 86400,
              "--since 7d is now minus 7 days: %lld", (long long)since);
    json_decref(j);
    kc_test_result_free(&r);
    free(bundle);
}

Test(cli_opts, every_command_rejects_an_unknown_option)
{
    static const char *const commands[] = {
        "compile", "run", "explain", "fingerprint", "put",    "get",  "has",  "rm",     "ls",
        "stats",   "gc",  "verify",  "export",      "import", "pull", "push", "prewarm"};
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        USAGE(ARGS(commands[i], "--no-such-option"), commands[i],
              "unknown option --no-such-option");
        /* the same with a value attached: the message names the option only */
        USAGE(ARGS(commands[i], "--bogus=1"), "unknown option --bogus");
    }
    USAGE(ARGS("get", "-x"), "unknown option -x");
}

Test(cli_opts, a_missing_value_is_a_usage_error)
{
    USAGE(ARGS("ls", "--since"), "kcache ls: --since needs a value");
    USAGE(ARGS("ls", "--kind"), "kcache ls: --kind needs a value");
    USAGE(ARGS("export", "b.kcb", "--device"), "kcache export: --device needs a value");
    USAGE(ARGS("pull", "--since"), "kcache pull: --since needs a value");
    USAGE(ARGS("push", "--jobs"), "kcache push: --jobs needs a value");
    USAGE(ARGS("push", "-j"), "kcache push: -j needs a value");
    USAGE(ARGS("gc", "--max-size"), "kcache gc: --max-size needs a value");
    USAGE(ARGS("get", "k", "-o"), "kcache get: -o needs a value");
    USAGE(ARGS("put", "f", "--kind"), "kcache put: --kind needs a value");
    USAGE(ARGS("compile", "g.json", "--device"), "kcache compile: --device needs a value");
    USAGE(ARGS("run", "g.json", "--iters"), "kcache run: --iters needs a value");
    USAGE(ARGS("explain", "g.json", "--cflags"), "kcache explain: --cflags needs a value");
    USAGE(ARGS("fingerprint", "--target"), "kcache fingerprint: --target needs a value");
    USAGE(ARGS("prewarm", "m.json", "--tag"), "kcache prewarm: --tag needs a value");
    /* an empty value is no value */
    USAGE(ARGS("ls", "--tag="), "kcache ls: --tag needs a value");
    USAGE(ARGS("compile", "g.json", "--target", ""), "--target needs a value");
    /* a flag takes none */
    USAGE(ARGS("compile", "g.json", "--offline=yes"), "--offline takes no value");
}

Test(cli_opts, bad_ages_sizes_and_numbers_name_the_value)
{
    USAGE(ARGS("ls", "--since", "yesterday"), "--since", "'yesterday'");
    USAGE(ARGS("ls", "--since", "-5"), "--since", "'-5'");
    USAGE(ARGS("export", "b.kcb", "--since=3x"), "--since", "'3x'");
    USAGE(ARGS("pull", "--since", "soon"), "--since", "'soon'");
    USAGE(ARGS("push", "--since", "7y"), "--since", "'7y'");
    USAGE(ARGS("gc", "--max-size", "12Q"), "--max-size", "'12Q'");
    USAGE(ARGS("gc", "--max-size", "ten"), "--max-size", "'ten'");
    USAGE(ARGS("push", "--jobs", "0"), "--jobs", "'0'", "1 to 64");
    USAGE(ARGS("pull", "--connect-timeout", "fast"), "--connect-timeout", "'fast'");
    USAGE(ARGS("compile", "g.json", "--jobs", "many"), "--jobs", "'many'");
    USAGE(ARGS("run", "g.json", "--iters", "0"), "--iters", "'0'");
    USAGE(ARGS("run", "g.json", "--seed", "abc"), "--seed", "'abc'");

    /* a bad setting is refused before any command runs (no command usage line) */
    setenv("KCACHE_MAX_SIZE", "lots", 1);
    kc_test_result r;
    KC(&r, "gc");
    cr_expect_eq(r.exit_code, 2, "%s", r.err);
    cr_expect(strstr(r.err, "$KCACHE_MAX_SIZE: bad size 'lots'"), "%s", r.err);
    kc_test_result_free(&r);
    unsetenv("KCACHE_MAX_SIZE");
    USAGE(ARGS("gc"), "--max-size");
}

Test(cli_opts, arguments_are_counted_the_same_way)
{
    USAGE(ARGS("get"), "kcache get: missing KEY");
    USAGE(ARGS("get", "a", "b"), "unexpected argument 'b'");
    USAGE(ARGS("stats", "extra"), "unexpected argument 'extra'");
    USAGE(ARGS("verify", "extra"), "unexpected argument 'extra'");
    USAGE(ARGS("import"), "missing BUNDLE");
    USAGE(ARGS("run", "a.json", "b.json"), "unexpected argument 'b.json'");
    USAGE(ARGS("push", "extra"), "unexpected argument 'extra'");
    USAGE(ARGS("pull", "extra"), "unexpected argument 'extra'");
    USAGE(ARGS("put", "f"), "--kind is required");

    /* "--" ends the options: "-x" is a key (an invalid one: exit 1) */
    kc_test_result r;
    KC(&r, "rm", "--", "-x");
    cr_expect_eq(r.exit_code, 1, "%s", r.err);
    cr_expect(strstr(r.err, "-x"), "%s", r.err);
    kc_test_result_free(&r);

    /* --help still wins over everything else */
    KC(&r, "ls", "--bogus", "--help");
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "--since SECONDS|AGE"), "%s", r.out);
    kc_test_result_free(&r);
}

Test(cli_opts, values_work_as_separate_words_or_after_equals)
{
    char key[65];
    put_blob("two spellings\n", key);
    char *out1 = kc_test_path(dir, "o1"), *out2 = kc_test_path(dir, "o2");
    char eq[4200];
    snprintf(eq, sizeof eq, "--output=%s", out2);
    kc_test_result r;
    KC(&r, "get", key, "-o", out1);
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    KC(&r, "get", eq, key);
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    char *a = kc_test_read_file(out1, NULL), *b = kc_test_read_file(out2, NULL);
    cr_expect_str_eq(a ? a : "", "two spellings\n");
    cr_expect_str_eq(b ? b : "", "two spellings\n");
    free(a);
    free(b);
    KC(&r, "gc", "--max-size=10G");
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "10.0 GiB"), "%s", r.out);
    kc_test_result_free(&r);
    free(out1);
    free(out2);
}
