/*
 * test_ccache.c - the real ccache binary (Debian's 4.7) using kcached as its
 * remote storage, over HTTP (/ccache) and over the Redis protocol
 * (redis://): build a small C project, wipe the local cache, rebuild, and
 * check that ccache reports remote hits and the objects match; a rewritten
 * manifest must give a direct hit, as with ccache's reference server.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kc_testserver.h"
#include "kc_testutil.h"

/* Stops kcached expecting a clean exit (sanitizer reports make it fail) and
 * removes its files. */
static void finish(kc_testserver *ts)
{
    if (ts->pid) {
        int st = kc_testserver_stop(ts);
        char *log = st ? kc_testserver_read_log(ts) : NULL;
        cr_expect_eq(st, 0, "kcached exit status %d; log:\n%s", st, log ? log : "");
        free(log);
    }
    kc_testserver_cleanup(ts);
}

#define TOKEN "ccache-token-6e1f0d2c"

static const char *const sources[] = {
    "int add(int a, int b) { return a + b; }\n",
    "#include <stdio.h>\nint add(int, int);\nint main(void) { printf(\"%d\\n\", add(2, 3)); "
    "return 0; }\n",
    "static const char table[] = \"kcache ccache round trip\";\nconst char *name(void) { "
    "return table; }\n",
};

/* Value of one `key=value` line of `ccache --print-stats`. */
static long stat_value(const char *stats, const char *key)
{
    size_t n = strlen(key);
    for (const char *l = stats; l && *l;) {
        if (!strncmp(l, key, n) && l[n] == '\t')
            return strtol(l + n + 1, NULL, 10);
        l = strchr(l, '\n');
        if (l)
            l++;
    }
    return -1;
}

static void build(const char *dir, char **objects, size_t *lens)
{
    for (int i = 0; i < 3; i++) {
        char src[512], obj[512];
        snprintf(src, sizeof src, "%s/src%d.c", dir, i);
        snprintf(obj, sizeof obj, "%s/src%d.o", dir, i);
        kc_test_result r;
        kc_test_runl(&r, "ccache", "gcc", "-O2", "-c", src, "-o", obj, NULL);
        cr_assert_eq(r.exit_code, 0, "ccache gcc %s: %s", src, r.err);
        kc_test_result_free(&r);
        objects[i] = kc_test_read_file(obj, &lens[i]);
        cr_assert_not_null(objects[i]);
        unlink(obj);
    }
}

/* Ends a test: ccache's environment, the server, the directories. */
static void finish_ccache(kc_testserver *ts, char *dir, char *ccdir)
{
    unsetenv("CCACHE_CONFIGPATH");
    unsetenv("CCACHE_DIR");
    finish(ts);
    free(ccdir);
    kc_test_rmtree(dir);
    free(dir);
}

/* Points ccache at remote (a remote_storage value) with a fresh cache
 * directory dir/NAME; returns that directory (caller frees). */
static char *use_ccache(const char *dir, const char *name, const char *remote)
{
    char *ccdir = kc_test_path(dir, name);
    char *conf = kc_test_path(dir, "ccache.conf");
    char line[512];
    int n = snprintf(line, sizeof line, "remote_storage = %s\n", remote);
    kc_test_write_file(conf, line, (size_t)n);
    setenv("CCACHE_CONFIGPATH", conf, 1);
    setenv("CCACHE_DIR", ccdir, 1);
    unsetenv("CCACHE_DISABLE");
    unsetenv("CCACHE_REMOTE_STORAGE");
    unsetenv("CCACHE_READONLY");
    unsetenv("CCACHE_RECACHE");
    unsetenv("CCACHE_NODIRECT");
    free(conf);
    return ccdir;
}

Test(ccache, remote_storage_round_trip, .timeout = 120)
{
    char *dir = kc_test_mkdtemp("kcdccache");
    char *tokens = kc_test_path(dir, "tokens");
    kc_test_write_file(tokens, TOKEN " read,write ccache\n", strlen(TOKEN) + 19);
    const char *args[] = {"--tokens", tokens, NULL};
    kc_testserver ts;
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0);
    for (int i = 0; i < 3; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/src%d.c", dir, i);
        kc_test_write_file(p, sources[i], strlen(sources[i]));
    }
    char remote[256];
    snprintf(remote, sizeof remote, "%s/ccache|bearer-token=" TOKEN, ts.url);
    char *ccdir = use_ccache(dir, "ccache", remote);

    char *first[3], *second[3];
    size_t flen[3], slen[3];
    build(dir, first, flen);
    kc_test_result r;
    kc_test_runl(&r, "ccache", "--print-stats", NULL);
    cr_expect_eq(stat_value(r.out, "remote_storage_hit"), 0, "cold build: %s", r.out);
    cr_expect_gt(stat_value(r.out, "cache_miss"), 0, "%s", r.out);
    kc_test_result_free(&r);

    /* Wipe the local cache (and its statistics) completely. */
    kc_test_rmtree(ccdir);
    build(dir, second, slen);
    kc_test_runl(&r, "ccache", "--print-stats", NULL);
    cr_expect_eq(stat_value(r.out, "remote_storage_hit"), 3, "warm build from kcached: %s", r.out);
    cr_expect_eq(stat_value(r.out, "cache_miss"), 0, "%s", r.out);
    cr_expect_leq(stat_value(r.out, "remote_storage_error"), 0, "%s", r.out);
    kc_test_result_free(&r);
    for (int i = 0; i < 3; i++) {
        cr_expect(flen[i] == slen[i] && !memcmp(first[i], second[i], flen[i]),
                  "object %d differs after the remote hit", i);
        free(first[i]);
        free(second[i]);
    }
    /* The server saw ccache's traffic. */
    kc_http_result m;
    const char *auth[] = {"Authorization: Bearer " TOKEN, NULL};
    kc_testserver_http(&ts, "GET", "/metrics", auth, NULL, 0, false, &m);
    cr_expect(strstr((char *)m.body, "route=\"ccache_get\",code=\"200\"") != NULL, "%s", m.body);
    cr_expect(strstr((char *)m.body, "route=\"ccache_put\",code=\"201\"") != NULL, "%s", m.body);
    kc_http_result_free(&m);
    free(tokens);
    finish_ccache(&ts, dir, ccdir);
}

/* `ccache --print-stats` output (caller frees). */
static char *ccache_stats(void)
{
    kc_test_result r;
    kc_test_runl(&r, "ccache", "--print-stats", NULL);
    char *out = strdup(r.out ? r.out : "");
    kc_test_result_free(&r);
    return out;
}

static void compile_one(const char *dir)
{
    char src[512], obj[512];
    snprintf(src, sizeof src, "%s/main.c", dir);
    snprintf(obj, sizeof obj, "%s/main.o", dir);
    kc_test_result r;
    kc_test_runl(&r, "ccache", "gcc", "-O2", "-c", src, "-o", obj, NULL);
    cr_assert_eq(r.exit_code, 0, "ccache gcc %s: %s", src, r.err);
    kc_test_result_free(&r);
}

/* The scenario that needs PUT to replace: after a header change ccache
 * adds an entry to the source's manifest and uploads it again under the
 * same name. A rebuild from an empty local cache must then find the new
 * entry (a direct hit); with the first manifest kept it only gets a
 * preprocessed hit. */
Test(ccache, rewritten_manifest_gives_a_direct_hit, .timeout = 120)
{
    char *dir = kc_test_mkdtemp("kcdccman");
    kc_testserver ts;
    cr_assert_eq(kc_testserver_start(&ts, NULL, NULL), 0);
    char *src = kc_test_path(dir, "main.c"), *hdr = kc_test_path(dir, "conf.h");
    const char *main_c = "#include \"conf.h\"\nint value(void) { return VALUE; }\n";
    kc_test_write_file(src, main_c, strlen(main_c));
    kc_test_write_file(hdr, "#define VALUE 1\n", 16);
    char remote[256];
    snprintf(remote, sizeof remote, "%s/ccache", ts.url);
    char *ccdir = use_ccache(dir, "cc", remote);

    compile_one(dir); /* cold: result and manifest uploaded */
    kc_test_write_file(hdr, "#define VALUE 2\n", 16);
    kc_test_rmtree(ccdir);
    compile_one(dir); /* manifest fetched, misses, new entry added and uploaded again */
    char *st = ccache_stats();
    cr_expect_eq(stat_value(st, "cache_miss"), 1, "%s", st);
    free(st);

    kc_test_rmtree(ccdir);
    compile_one(dir);
    st = ccache_stats();
    cr_expect_eq(stat_value(st, "direct_cache_hit"), 1, "the rewritten manifest was served: %s",
                 st);
    cr_expect_eq(stat_value(st, "preprocessed_cache_hit"), 0, "%s", st);
    cr_expect_eq(stat_value(st, "remote_storage_hit"), 1, "%s", st);
    free(st);

    free(src);
    free(hdr);
    finish_ccache(&ts, dir, ccdir);
}

/* Starts kcached with the Redis listener as well; ts->port is HTTP, the
 * Redis port is returned. */
static unsigned start_with_redis(kc_testserver *ts, const char *dir, const char *tokens)
{
    char *rpf = kc_test_path(dir, "redis.port");
    const char *args[] = {
        "--redis-listen", "127.0.0.1:0", "--redis-port-file", rpf, tokens ? "--tokens" : NULL,
        tokens,           NULL};
    cr_assert_eq(kc_testserver_start(ts, NULL, args), 0);
    size_t n;
    char *text = kc_test_read_file(rpf, &n);
    cr_assert_not_null(text, "kcached wrote no %s", rpf);
    unsigned port = (unsigned)strtoul(text, NULL, 10);
    cr_assert_gt(port, 0);
    free(text);
    free(rpf);
    return port;
}

/* ccache's own remote_redis suite, adapted: a cold build fills kcached, a
 * second build hits locally, and after the local cache is wiped every
 * object comes back from kcached; with a password (a kcached token), and
 * an unreachable server is a remote storage error, not a failed build. */
static void redis_round_trip(const char *password)
{
    char *dir = kc_test_mkdtemp("kcdccredis");
    char *tokens = NULL;
    if (password) {
        tokens = kc_test_path(dir, "tokens");
        char line[128];
        int n = snprintf(line, sizeof line, "%s read,write ccache\n", password);
        kc_test_write_file(tokens, line, (size_t)n);
    }
    kc_testserver ts;
    unsigned rport = start_with_redis(&ts, dir, tokens);
    for (int i = 0; i < 3; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/src%d.c", dir, i);
        kc_test_write_file(p, sources[i], strlen(sources[i]));
    }
    char remote[256];
    snprintf(remote, sizeof remote, "redis://%s%s127.0.0.1:%u", password ? password : "",
             password ? "@" : "", rport);
    char *ccdir = use_ccache(dir, "cc", remote);

    char *first[3], *second[3];
    size_t flen[3], slen[3];
    build(dir, first, flen);
    char *st = ccache_stats();
    cr_expect_eq(stat_value(st, "cache_miss"), 3, "cold build: %s", st);
    cr_expect_leq(stat_value(st, "remote_storage_error"), 0, "%s", st);
    free(st);
    kc_test_result r;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%u", rport);
    if (password)
        kc_test_runl(&r, "redis-cli", "-p", portstr, "--no-auth-warning", "-a", password, "DBSIZE",
                     NULL);
    else
        kc_test_runl(&r, "redis-cli", "-p", portstr, "DBSIZE", NULL);
    cr_expect_eq(strtol(r.out, NULL, 10), 6, "result + manifest per source: %s", r.out);
    kc_test_result_free(&r);

    kc_test_rmtree(ccdir); /* a fresh ccache directory */
    build(dir, second, slen);
    st = ccache_stats();
    cr_expect_eq(stat_value(st, "remote_storage_hit"), 3, "warm build from kcached: %s", st);
    cr_expect_eq(stat_value(st, "direct_cache_hit"), 3, "%s", st);
    cr_expect_eq(stat_value(st, "cache_miss"), 0, "%s", st);
    free(st);
    for (int i = 0; i < 3; i++) {
        cr_expect(flen[i] == slen[i] && !memcmp(first[i], second[i], flen[i]),
                  "object %d differs after the remote hit", i);
        free(first[i]);
        free(second[i]);
    }
    if (password) { /* a wrong password: an error ccache counts, the build still works */
        char bad[256];
        snprintf(bad, sizeof bad, "redis://wrong-password@127.0.0.1:%u", rport);
        free(use_ccache(dir, "cc-bad", bad));
        build(dir, first, flen);
        st = ccache_stats();
        cr_expect_gt(stat_value(st, "remote_storage_error"), 0, "%s", st);
        free(st);
        for (int i = 0; i < 3; i++)
            free(first[i]);
        char *log = kc_testserver_read_log(&ts);
        cr_expect(strstr(log, password) == NULL, "the token reached kcached's log");
        cr_expect(strstr(log, "wrong-password") == NULL, "a password reached kcached's log");
        free(log);
    }
    kc_http_result m;
    char auth[128];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", password ? password : "");
    const char *h[] = {auth, NULL};
    kc_testserver_http(&ts, "GET", "/metrics", password ? h : NULL, NULL, 0, false, &m);
    cr_expect(strstr((char *)m.body, "kcached_redis_commands_total{command=\"get\"}") != NULL, "%s",
              m.body);
    kc_http_result_free(&m);
    free(tokens);
    finish_ccache(&ts, dir, ccdir);
}

Test(ccache, redis_remote_storage_round_trip, .timeout = 120)
{
    redis_round_trip(NULL);
}

Test(ccache, redis_remote_storage_with_a_token_as_password, .timeout = 120)
{
    redis_round_trip(TOKEN);
}
