/*
 * test_ccache.c - the real ccache binary (Debian's 4.7) using kcached as its
 * HTTP remote storage: build a small C project, wipe the local cache,
 * rebuild, and check that ccache reports remote hits and the objects match.
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
    char *ccdir = kc_test_path(dir, "ccache");
    char *conf = kc_test_path(dir, "ccache.conf");
    char remote[256];
    snprintf(remote, sizeof remote, "remote_storage = %s/ccache|bearer-token=" TOKEN "\n", ts.url);
    kc_test_write_file(conf, remote, strlen(remote));
    setenv("CCACHE_CONFIGPATH", conf, 1);
    setenv("CCACHE_DIR", ccdir, 1);
    unsetenv("CCACHE_DISABLE");
    unsetenv("CCACHE_REMOTE_STORAGE");
    unsetenv("CCACHE_READONLY");
    unsetenv("CCACHE_RECACHE");

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
    unsetenv("CCACHE_CONFIGPATH");
    unsetenv("CCACHE_DIR");
    finish(&ts);
    free(ccdir);
    free(conf);
    free(tokens);
    kc_test_rmtree(dir);
    free(dir);
}
