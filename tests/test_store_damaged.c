/*
 * test_store_damaged.c - a damaged store database (cut short, or overwritten
 * with garbage) never bricks the client: kcache moves it aside once, says so
 * once, and works on an empty cache; kcached refuses to start on it, names
 * the file and the recovery command, and changes nothing.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <kcache/kc_hash.h>
#include <kcache/kc_store.h>
#include "kc_testutil.h"

static char *dir;

static void setup(void)
{
    dir = kc_test_mkdtemp("damaged");
    cr_assert_not_null(dir);
}

static void teardown(void)
{
    kc_test_rmtree(dir);
    free(dir);
}

TestSuite(store_damaged, .init = setup, .fini = teardown, .timeout = 120);

/* A store with enough rows to span many pages, closed (so its WAL is
 * checkpointed into kcache.db), then damaged: cut to half its size, or
 * overwritten with random bytes. */
static void make_damaged_store(const char *d, bool garbage)
{
    kc_store *s;
    kc_err e = {0};
    cr_assert_eq(kc_store_open(d, NULL, &s, &e), KC_OK, "%s", e.msg);
    uint8_t buf[3000];
    for (int i = 0; i < 200; i++) {
        char key[KC_KEY_HEX_LEN + 1], tag[32];
        snprintf(tag, sizeof tag, "damaged-%d", i);
        kc_sha256_hex(tag, strlen(tag), key);
        kc_test_fill_random(buf, sizeof buf, (uint64_t)i + 1);
        kc_artifact a;
        cr_assert_eq(kc_artifact_init(&a, key, "blob", "{}", buf, sizeof buf, &e), KC_OK);
        cr_assert_eq(kc_store_put(s, &a, NULL, &e), KC_OK, "%s", e.msg);
        kc_artifact_free(&a);
    }
    kc_store_close(s);
    char *db = kc_test_path(d, "kcache.db");
    size_t len;
    char *bytes = kc_test_read_file(db, &len);
    cr_assert(bytes && len > 64 * 1024, "a multi-page database");
    if (garbage)
        kc_test_fill_random(bytes, len, 42);
    cr_assert_eq(kc_test_write_file(db, bytes, garbage ? len : len / 2), 0);
    free(bytes);
    free(db);
}

/* Names in d starting with prefix. */
static int count_prefixed(const char *d, const char *prefix)
{
    DIR *dd = opendir(d);
    cr_assert(dd);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(dd)))
        n += strncmp(de->d_name, prefix, strlen(prefix)) == 0;
    closedir(dd);
    return n;
}

static void kcache_recovers(bool garbage)
{
    make_damaged_store(dir, garbage);
    const char *stats[] = {"stats", NULL};
    kc_test_result r;
    cr_assert_eq(kc_test_kcache(&r, KC_TEST_KCACHE, dir, NULL, stats), 0);
    cr_assert_eq(r.exit_code, 0, "stderr: %s", r.err);
    cr_assert(strstr(r.err, "damaged") && strstr(r.err, "kcache.db.corrupt-"),
              "says where the damaged database went: %s", r.err);
    const char *first = strstr(r.err, "warning"), *again = first ? strstr(first + 1, "warning") : 0;
    cr_assert_null(again, "said once: %s", r.err);
    kc_test_result_free(&r);
    cr_assert_eq(count_prefixed(dir, "kcache.db.corrupt-"), 1, "the damaged file is kept aside");
    /* the cache works again, and the next command has nothing to say */
    const char *compile[] = {"compile", KC_TEST_SOURCE_DIR "/examples/mlp.json", NULL};
    cr_assert_eq(kc_test_kcache(&r, KC_TEST_KCACHE, dir, NULL, compile), 0);
    cr_assert_eq(r.exit_code, 0, "stderr: %s", r.err);
    cr_assert_null(strstr(r.err, "damaged"), "%s", r.err);
    kc_test_result_free(&r);
    const char *warm[] = {"compile", KC_TEST_SOURCE_DIR "/examples/mlp.json", "--offline",
                          "--require-hit", NULL};
    cr_assert_eq(kc_test_kcache(&r, KC_TEST_KCACHE, dir, NULL, warm), 0);
    cr_assert_eq(r.exit_code, 0, "stderr: %s", r.err);
    kc_test_result_free(&r);
    cr_assert_eq(count_prefixed(dir, "kcache.db.corrupt-"), 1);
}

Test(store_damaged, kcache_recovers_from_a_truncated_database)
{
    kcache_recovers(false);
}

Test(store_damaged, kcache_recovers_from_a_garbage_database)
{
    kcache_recovers(true);
}

static void kcached_refuses(bool garbage)
{
    make_damaged_store(dir, garbage);
    char *db = kc_test_path(dir, "kcache.db");
    size_t before_len, after_len;
    char *before = kc_test_read_file(db, &before_len);
    kc_test_result r;
    cr_assert_eq(
        kc_test_runl(&r, KC_TEST_KCACHED, "--listen", "127.0.0.1:0", "--data", dir, (char *)NULL),
        0);
    cr_assert_eq(r.exit_code, 1, "kcached started on a damaged store: %s", r.err);
    cr_assert(strstr(r.err, db) && strstr(r.err, "damaged"), "names the file: %s", r.err);
    cr_assert(strstr(r.err, "kcache --cache-dir") && strstr(r.err, " verify"),
              "names the recovery command: %s", r.err);
    kc_test_result_free(&r);
    char *after = kc_test_read_file(db, &after_len);
    cr_assert(after && after_len == before_len && memcmp(before, after, before_len) == 0,
              "kcached changed the damaged file");
    cr_assert_eq(count_prefixed(dir, "kcache.db.corrupt-"), 0, "kcached moved nothing");
    free(before);
    free(after);
    free(db);
}

Test(store_damaged, kcached_refuses_a_truncated_store_and_changes_nothing)
{
    kcached_refuses(false);
}

Test(store_damaged, kcached_refuses_a_garbage_store_and_changes_nothing)
{
    kcached_refuses(true);
}

/* The library: without recover_corrupt the open fails and moves nothing;
 * with it, the handle says what it did. */
Test(store_damaged, library_moves_aside_only_when_asked)
{
    make_damaged_store(dir, false);
    kc_store *s = NULL;
    kc_err e = {0};
    cr_assert_eq(kc_store_open(dir, NULL, &s, &e), KC_ERR_CORRUPT, "%s", e.msg);
    cr_assert(strstr(e.msg, "damaged"), "%s", e.msg);
    cr_assert_eq(count_prefixed(dir, "kcache.db.corrupt-"), 0);
    kc_store_opts o = {.recover_corrupt = true};
    cr_assert_eq(kc_store_open(dir, &o, &s, &e), KC_OK, "%s", e.msg);
    const char *why = NULL, *moved = kc_store_recovered(s, &why);
    cr_assert(moved && strstr(moved, "kcache.db.corrupt-") && why && strstr(why, "damaged"));
    struct stat st;
    cr_assert_eq(stat(moved, &st), 0, "%s kept", moved);
    kc_store_stats stats;
    cr_assert_eq(kc_store_stats_get(s, &stats, &e), KC_OK);
    cr_assert_eq(stats.entries, 0);
    kc_store_close(s);
    cr_assert_eq(kc_store_open(dir, &o, &s, &e), KC_OK, "%s", e.msg);
    cr_assert_null(kc_store_recovered(s, NULL), "a healthy store is left alone");
    kc_store_close(s);
}
