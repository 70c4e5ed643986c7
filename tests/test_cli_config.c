/*
 * test_cli_config.c - the client's settings (client/kc_config.c, kc_config.h):
 * the configuration file $XDG_CONFIG_HOME/kcache/config, the order option >
 * environment > file > default, `kcache config` naming where each value came
 * from, errors that name FILE:LINE and the nearest known key, and the server and
 * token of the file reaching a real kcached through the tool's one remote builder.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <kcache/kc_config.h>
#include <kcache/kc_util.h>

#include "kc_testserver.h"
#include "kc_testutil.h"

static char *dir, *xdg, *conf;

static void clear_env(void)
{
    for (int s = 0; s < KC_SETTING_COUNT; s++)
        unsetenv(kc_setting_describe((kc_setting)s)->env);
}

static void setup(void)
{
    dir = kc_test_mkdtemp("clicfg");
    cr_assert_not_null(dir);
    xdg = kc_test_path(dir, "xdg");
    char *kdir = kc_test_path(xdg, "kcache");
    cr_assert_eq(mkdir(xdg, 0700), 0);
    cr_assert_eq(mkdir(kdir, 0700), 0);
    conf = kc_test_path(kdir, "config");
    free(kdir);
    clear_env();
    setenv("XDG_CONFIG_HOME", xdg, 1);
    setenv("HOME", dir, 1); /* "~/" in the file, and no file of the person running this */
}

static void teardown(void)
{
    clear_env();
    kc_test_rmtree(dir);
    free(dir);
    free(xdg);
    free(conf);
}

TestSuite(cli_config, .init = setup, .fini = teardown, .timeout = 120);

static void write_conf(const char *text)
{
    cr_assert_eq(kc_test_write_file(conf, text, strlen(text)), 0);
    chmod(conf, 0600);
}

/* Runs kcache with the NULL-terminated args (no --cache-dir: the settings decide). */
static void run(kc_test_result *r, const char *const *args)
{
    char *argv[32] = {KC_TEST_KCACHE};
    int n = 1;
    for (int i = 0; args[i]; i++) {
        cr_assert_lt(n, 31);
        argv[n++] = (char *)args[i];
    }
    argv[n] = NULL;
    cr_assert_eq(kc_test_run(argv, NULL, 0, 60, r), 0);
}

#define RUN(r, ...) run(r, (const char *const[]){__VA_ARGS__, NULL})

/* The line of `kcache config` for key ("(SOURCE) key = value"), copied into buf. */
static const char *config_line(const char *key, char *buf, size_t cap)
{
    kc_test_result r;
    RUN(&r, "config");
    cr_assert_eq(r.exit_code, 0, "kcache config: %s", r.err);
    char needle[64];
    snprintf(needle, sizeof needle, ") %s = ", key);
    const char *p = strstr(r.out, needle);
    cr_assert_not_null(p, "no %s in: %s", key, r.out);
    while (p > r.out && p[-1] != '\n')
        p--;
    snprintf(buf, cap, "%.*s", (int)strcspn(p, "\n"), p);
    kc_test_result_free(&r);
    return buf;
}

Test(cli_config, option_beats_environment_beats_file_beats_default)
{
    char *d_file = kc_test_path(dir, "from-file"), *d_env = kc_test_path(dir, "from-env"),
         *d_flag = kc_test_path(dir, "from-flag"), want[600], line[600];
    snprintf(want, sizeof want, "(default) cache-dir = %s/.cache/kcache", dir);
    cr_expect_str_eq(config_line("cache-dir", line, sizeof line), want);

    char text[600];
    snprintf(text, sizeof text, "# my cache\n\ncache-dir = %s\n", d_file);
    write_conf(text);
    snprintf(want, sizeof want, "(%s:3) cache-dir = %s", conf, d_file);
    cr_expect_str_eq(config_line("cache-dir", line, sizeof line), want);

    setenv("KCACHE_DIR", d_env, 1);
    snprintf(want, sizeof want, "($KCACHE_DIR) cache-dir = %s", d_env);
    cr_expect_str_eq(config_line("cache-dir", line, sizeof line), want);

    kc_test_result r;
    RUN(&r, "--cache-dir", d_flag, "config", "cache-dir");
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    snprintf(want, sizeof want, "%s\n", d_flag);
    cr_expect_str_eq(r.out, want);
    kc_test_result_free(&r);

    /* and the commands use it: the store lands in the directory in effect */
    unsetenv("KCACHE_DIR");
    char *in = kc_test_path(dir, "in.txt");
    cr_assert_eq(kc_test_write_file(in, "x\n", 2), 0);
    RUN(&r, "put", in, "--kind", "blob");
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    char *db = kc_test_path(d_file, "kcache.db");
    struct stat st;
    cr_expect_eq(stat(db, &st), 0, "the store is where the file says: %s", db);
    free(db);
    free(in);
    free(d_file);
    free(d_env);
    free(d_flag);
}

Test(cli_config, kcache_config_prints_every_setting_and_where_it_came_from)
{
    char *tok = kc_test_path(dir, "tok");
    cr_assert_eq(kc_test_write_file(tok, "file-token\n", 11), 0);
    chmod(tok, 0600);
    write_conf("remote = http://127.0.0.1:9\ntoken-file = ~/tok\nmax-size = 10G\n");
    setenv("KCACHE_TOKEN", "env-token", 1);
    setenv("KCACHE_MAX_ARTIFACT", "1M", 1);
    kc_test_result r;
    RUN(&r, "config");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    for (int s = 0; s < KC_SETTING_COUNT; s++) {
        char needle[64];
        snprintf(needle, sizeof needle, ") %s =", kc_setting_describe((kc_setting)s)->name);
        cr_expect(strstr(r.out, needle), "no %s in: %s", needle, r.out);
    }
    char want[600];
    snprintf(want, sizeof want, "(%s:1) remote = http://127.0.0.1:9\n", conf);
    cr_expect(strstr(r.out, want), "%s", r.out);
    snprintf(want, sizeof want, "(%s:2) token-file = %s\n  # not used", conf, tok);
    cr_expect(strstr(r.out, want), "~ expands; the environment's token wins: %s", r.out);
    cr_expect(strstr(r.out, "($KCACHE_TOKEN) token = (hidden)\n"), "%s", r.out);
    cr_expect(!strstr(r.out, "env-token") && !strstr(r.out, "file-token"), "%s", r.out);
    cr_expect(strstr(r.out, "($KCACHE_MAX_ARTIFACT) max-artifact = 1M\n"), "%s", r.out);
    cr_expect(strstr(r.out, "(default) ca-file = (the system's certificate authorities)\n"), "%s",
              r.out);
    kc_test_result_free(&r);

    RUN(&r, "--json", "config");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert(json_is_object(j), "%s", r.out);
    cr_expect_str_eq(json_string_value(json_object_get(j, "file")), conf);
    json_t *ms = json_object_get(j, "max-size");
    cr_expect_str_eq(json_string_value(json_object_get(ms, "source")), "file");
    cr_expect_str_eq(json_string_value(json_object_get(ms, "value")), "10G");
    json_t *tf = json_object_get(j, "token-file");
    cr_expect(json_is_false(json_object_get(tf, "used")), "%s", r.out);
    json_decref(j);
    kc_test_result_free(&r);
    free(tok);
}

/* Expects exit 2 with every needle in stderr, for the file text and the command. */
static void expect_bad(const char *text, const char *const *needles)
{
    write_conf(text);
    kc_test_result r;
    RUN(&r, "ls");
    cr_expect_eq(r.exit_code, 2, "'%s': exit %d: %s", text, r.exit_code, r.err);
    for (int i = 0; needles[i]; i++)
        cr_expect(strstr(r.err, needles[i]), "'%s': stderr lacks '%s': %s", text, needles[i],
                  r.err);
    kc_test_result_free(&r);
}

#define BAD(text, ...) expect_bad(text, (const char *const[]){__VA_ARGS__, NULL})

Test(cli_config, bad_lines_name_file_line_and_the_nearest_key)
{
    char at[600];
    snprintf(at, sizeof at, "%s:2: ", conf);
    BAD("# ok\nremtoe = http://x\n", at, "unknown setting 'remtoe' (did you mean 'remote'?)");
    BAD("\ntoken_flie = /x\n", at, "did you mean 'token-file'?");
    BAD("# ok\nno equals sign here\n", at, "expected `key = value`");
    BAD("cache-dir = /x\nmax-size = lots\n", at, "max-size", "'lots'");
    BAD("\ncache-dir = relative/dir\n", at, "not an absolute path");
    BAD("\nremote = ftp://x\n", at, "http://");
    BAD("\nremote =\n", at, "remote has no value");
    /* a key nothing resembles gets no guess */
    BAD("\nzzzzzzzz = 1\n", at, "unknown setting 'zzzzzzzz'");
    /* a bad variable is named the same way */
    unlink(conf);
    setenv("KCACHE_MAX_ARTIFACT", "huge", 1);
    kc_test_result r;
    RUN(&r, "stats");
    cr_expect_eq(r.exit_code, 2, "%s", r.err);
    cr_expect(strstr(r.err, "$KCACHE_MAX_ARTIFACT: artifact size limit 'huge': bad size 'huge'"),
              "%s", r.err);
    kc_test_result_free(&r);
    /* underscores stand for dashes, quotes are taken off, as in kcached's file */
    unsetenv("KCACHE_MAX_ARTIFACT");
    write_conf("max_size = \"2G\"\n");
    char line[600], want[600];
    snprintf(want, sizeof want, "(%s:1) max-size = 2G", conf);
    cr_expect_str_eq(config_line("max-size", line, sizeof line), want);
}

Test(cli_config, the_files_server_and_token_reach_kcached)
{
    char *tokens = kc_test_path(dir, "tokens"), *tok = kc_test_path(dir, "tok");
    const char *secret = "0123456789abcdef0123456789abcdef-writer";
    char text[600];
    snprintf(text, sizeof text, "%s read,write ci\n", secret);
    cr_assert_eq(kc_test_write_file(tokens, text, strlen(text)), 0);
    cr_assert_eq(kc_test_write_file(tok, secret, strlen(secret)), 0);
    chmod(tok, 0600);
    kc_testserver ts = {0};
    const char *args[] = {"--tokens", tokens, NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0);
    char *host = kc_test_path(dir, "host"), *ci = kc_test_path(dir, "ci"),
         *in = kc_test_path(dir, "in.txt");
    snprintf(text, sizeof text, "remote = %s\ntoken-file = ~/tok\n", ts.url);
    write_conf(text);
    cr_assert_eq(kc_test_write_file(in, "shared\n", 7), 0);
    kc_test_result r;
    RUN(&r, "--cache-dir", host, "put", in, "--kind", "blob");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char key[65];
    snprintf(key, sizeof key, "%.64s", r.out);
    kc_test_result_free(&r);
    RUN(&r, "--cache-dir", host, "push");
    cr_expect_eq(r.exit_code, 0, "push with the file's server and token: %s", r.err);
    kc_test_result_free(&r);
    RUN(&r, "--cache-dir", ci, "pull", "--device", "all");
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    RUN(&r, "--cache-dir", ci, "has", key);
    cr_expect_eq(r.exit_code, 0, "pulled through the configuration file: %s", r.err);
    kc_test_result_free(&r);
    /* the variable wins over the file: a wrong token from it is refused */
    setenv("KCACHE_TOKEN", "not-a-token-the-server-knows", 1);
    RUN(&r, "--cache-dir", host, "push");
    cr_expect_neq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    unsetenv("KCACHE_TOKEN");
    kc_testserver_cleanup(&ts);
    free(tokens);
    free(tok);
    free(host);
    free(ci);
    free(in);
}

Test(cli_config, commands_that_need_no_settings_ignore_a_broken_file)
{
    write_conf("this is not a configuration\n");
    kc_test_result r;
    RUN(&r, "--version");
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    RUN(&r, "help", "ls");
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    RUN(&r, "completion", "bash");
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
}

/* ---- the library itself --------------------------------------------------- */

Test(cli_config, library_resolves_given_over_env_over_file)
{
    write_conf("remote = http://file:1\nmax-size = 1K\ntoken = file-token\n");
    setenv("KCACHE_REMOTE", "http://env:1", 1);
    kc_config *c = kc_config_new();
    kc_err err = {0};
    cr_assert_eq(kc_config_give(c, KC_SET_TOKEN_FILE, NULL, "token_file=", &err), KC_OK);
    cr_assert_eq(kc_config_load(c, &err), KC_OK, "%s", err.msg);
    const char *where;
    cr_expect_str_eq(kc_config_get(c, KC_SET_REMOTE), "http://env:1");
    cr_expect_eq(kc_config_origin(c, KC_SET_REMOTE, &where), KC_SOURCE_ENV);
    cr_expect_str_eq(where, "$KCACHE_REMOTE");
    cr_expect_eq(kc_config_size(c, KC_SET_MAX_SIZE), 1024);
    cr_expect_eq(kc_config_origin(c, KC_SET_MAX_SIZE, NULL), KC_SOURCE_FILE);
    cr_expect_null(kc_config_token(c, NULL), "not read before kc_config_read_token");
    cr_assert_eq(kc_config_read_token(c, &err), KC_OK, "%s", err.msg);
    cr_expect_str_eq(kc_config_token(c, &where), "file-token");
    kc_remote_opts o = {0};
    kc_config_remote_opts(c, &o);
    cr_expect_str_eq(o.token, "file-token");
    kc_config_free(c);

    /* a given value wins; an empty one counts as not given */
    c = kc_config_new();
    cr_assert_eq(kc_config_give(c, KC_SET_REMOTE, "https://given:1", "url=", &err), KC_OK);
    cr_assert_eq(kc_config_give(c, KC_SET_MAX_SIZE, "", "max_size=", &err), KC_OK);
    cr_assert_eq(kc_config_load(c, &err), KC_OK, "%s", err.msg);
    cr_expect_str_eq(kc_config_get(c, KC_SET_REMOTE), "https://given:1");
    cr_expect_eq(kc_config_origin(c, KC_SET_REMOTE, &where), KC_SOURCE_GIVEN);
    cr_expect_str_eq(where, "url=");
    cr_expect_eq(kc_config_origin(c, KC_SET_MAX_SIZE, NULL), KC_SOURCE_FILE);
    kc_config_free(c);

    c = kc_config_new();
    cr_expect_eq(kc_config_give(c, KC_SET_MAX_SIZE, "big", "max_size=", &err), KC_ERR_INVALID);
    cr_expect(strstr(err.msg, "max_size=: bad size 'big'"), "%s", err.msg);
    kc_config_free(c);
}

Test(cli_config, nearest_name_is_a_small_edit_or_a_unique_prefix)
{
    static const char *const names[] = {"compile", "config", "completion", "remote", "--kind"};
    size_t n = sizeof names / sizeof names[0];
    cr_expect_str_eq(kc_nearest("comple", names, n, sizeof names[0], 0), "compile");
    cr_expect_str_eq(kc_nearest("remtoe", names, n, sizeof names[0], 0), "remote");
    cr_expect_str_eq(kc_nearest("--knd", names, n, sizeof names[0], 0), "--kind");
    cr_expect_str_eq(kc_nearest("confi", names, n, sizeof names[0], 0), "config");
    cr_expect_str_eq(kc_nearest("complet", names, n, sizeof names[0], 0), "completion");
    cr_expect_null(kc_nearest("xyz", names, n, sizeof names[0], 0));
    cr_expect_null(kc_nearest("co", names, n, sizeof names[0], 0), "too short to guess");
}
