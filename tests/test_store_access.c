/*
 * test_store_access.c - the store's bookkeeping of reads (hits, misses,
 * access times for LRU): a read never writes or syncs the database; the
 * bookkeeping goes, unsynced, to the access log beside it and reaches the
 * statistics and the LRU order all the same, folded in by the next write.
 * Writes and syncs are counted by a SQLite VFS that wraps the default one,
 * so every file SQLite touches is seen.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include <kcache/kc_store.h>
#include "kc_testutil.h"

static char *dir;

static void setup(void)
{
    dir = kc_test_mkdtemp("store-access");
    cr_assert_not_null(dir);
    unsetenv("KCACHE_REMOTE");
}

static void teardown(void)
{
    kc_test_rmtree(dir);
    free(dir);
}

TestSuite(store_access, .init = setup, .fini = teardown);

/* ---- a VFS that counts what SQLite writes and syncs ------------------ */

typedef struct counted_file {
    sqlite3_file base;
    sqlite3_file *real; /* the wrapped VFS's file, right after this struct */
} counted_file;

static sqlite3_vfs *real_vfs;
static int n_writes, n_syncs, n_truncates;

#define REAL(f) (((counted_file *)(f))->real)

static int c_close(sqlite3_file *f)
{
    return REAL(f)->pMethods->xClose(REAL(f));
}
static int c_read(sqlite3_file *f, void *p, int n, sqlite3_int64 off)
{
    return REAL(f)->pMethods->xRead(REAL(f), p, n, off);
}
static int c_write(sqlite3_file *f, const void *p, int n, sqlite3_int64 off)
{
    n_writes++;
    return REAL(f)->pMethods->xWrite(REAL(f), p, n, off);
}
static int c_truncate(sqlite3_file *f, sqlite3_int64 size)
{
    n_truncates++;
    return REAL(f)->pMethods->xTruncate(REAL(f), size);
}
static int c_sync(sqlite3_file *f, int flags)
{
    n_syncs++;
    return REAL(f)->pMethods->xSync(REAL(f), flags);
}
static int c_size(sqlite3_file *f, sqlite3_int64 *size)
{
    return REAL(f)->pMethods->xFileSize(REAL(f), size);
}
static int c_lock(sqlite3_file *f, int l)
{
    return REAL(f)->pMethods->xLock(REAL(f), l);
}
static int c_unlock(sqlite3_file *f, int l)
{
    return REAL(f)->pMethods->xUnlock(REAL(f), l);
}
static int c_check(sqlite3_file *f, int *out)
{
    return REAL(f)->pMethods->xCheckReservedLock(REAL(f), out);
}
static int c_fcntl(sqlite3_file *f, int op, void *arg)
{
    return REAL(f)->pMethods->xFileControl(REAL(f), op, arg);
}
static int c_sector(sqlite3_file *f)
{
    return REAL(f)->pMethods->xSectorSize(REAL(f));
}
static int c_caps(sqlite3_file *f)
{
    return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f));
}
static int c_shm_map(sqlite3_file *f, int pg, int sz, int extend, void volatile **pp)
{
    return REAL(f)->pMethods->xShmMap(REAL(f), pg, sz, extend, pp);
}
static int c_shm_lock(sqlite3_file *f, int off, int n, int flags)
{
    return REAL(f)->pMethods->xShmLock(REAL(f), off, n, flags);
}
static void c_shm_barrier(sqlite3_file *f)
{
    REAL(f)->pMethods->xShmBarrier(REAL(f));
}
static int c_shm_unmap(sqlite3_file *f, int del)
{
    return REAL(f)->pMethods->xShmUnmap(REAL(f), del);
}
static int c_fetch(sqlite3_file *f, sqlite3_int64 off, int n, void **pp)
{
    return REAL(f)->pMethods->xFetch(REAL(f), off, n, pp);
}
static int c_unfetch(sqlite3_file *f, sqlite3_int64 off, void *p)
{
    return REAL(f)->pMethods->xUnfetch(REAL(f), off, p);
}

static const sqlite3_io_methods counted_io = {
    .iVersion = 3,
    .xClose = c_close,
    .xRead = c_read,
    .xWrite = c_write,
    .xTruncate = c_truncate,
    .xSync = c_sync,
    .xFileSize = c_size,
    .xLock = c_lock,
    .xUnlock = c_unlock,
    .xCheckReservedLock = c_check,
    .xFileControl = c_fcntl,
    .xSectorSize = c_sector,
    .xDeviceCharacteristics = c_caps,
    .xShmMap = c_shm_map,
    .xShmLock = c_shm_lock,
    .xShmBarrier = c_shm_barrier,
    .xShmUnmap = c_shm_unmap,
    .xFetch = c_fetch,
    .xUnfetch = c_unfetch,
};

static int c_open(sqlite3_vfs *vfs, sqlite3_filename name, sqlite3_file *f, int flags,
                  int *out_flags)
{
    (void)vfs;
    counted_file *c = (counted_file *)f;
    c->real = (sqlite3_file *)(c + 1);
    int rc = real_vfs->xOpen(real_vfs, name, c->real, flags, out_flags);
    c->base.pMethods = rc == SQLITE_OK && c->real->pMethods ? &counted_io : NULL;
    return rc;
}

/* Makes the counting VFS the default for this process (each Criterion test
 * runs in a process of its own) and zeroes the counts. */
static void count_sqlite_io(void)
{
    static sqlite3_vfs counted;
    if (!real_vfs) {
        real_vfs = sqlite3_vfs_find(NULL);
        cr_assert_not_null(real_vfs);
        cr_assert_geq(real_vfs->iVersion, 1);
        counted = *real_vfs;
        counted.zName = "kc-counted";
        counted.szOsFile = (int)sizeof(counted_file) + real_vfs->szOsFile;
        counted.xOpen = c_open;
        cr_assert_eq(sqlite3_vfs_register(&counted, 1), SQLITE_OK);
    }
    n_writes = n_syncs = n_truncates = 0;
}

/* ---- helpers ---------------------------------------------------------- */

static void make(kc_artifact *a, int seed, size_t n)
{
    uint8_t *p = malloc(n);
    kc_test_fill_random(p, n, (uint64_t)seed); /* incompressible: n >= 16 KiB goes to a pack */
    char key[65], salt[32];
    snprintf(salt, sizeof salt, "access-%d", seed);
    kc_sha256_hex(salt, strlen(salt), key);
    kc_err e;
    cr_assert_eq(kc_artifact_init(a, key, "cpu-so", NULL, p, n, &e), KC_OK, "%s", e.msg);
    free(p);
}

static kc_store *open_store(void)
{
    kc_store *s;
    kc_err e;
    cr_assert_eq(kc_store_open(dir, NULL, &s, &e), KC_OK, "%s", e.msg);
    return s;
}

/* Stores n artifacts (every third one large enough for a pack file) and
 * closes the store, so the database is checkpointed and alone. */
static void fill(kc_artifact *a, int n)
{
    kc_store *s = open_store();
    kc_err e;
    for (int i = 0; i < n; i++) {
        make(&a[i], i, i % 3 == 2 ? 40000 : 3000);
        cr_assert_eq(kc_store_put(s, &a[i], NULL, &e), KC_OK, "%s", e.msg);
    }
    kc_store_close(s);
}

static void get(kc_store *s, const kc_artifact *want)
{
    kc_artifact got;
    kc_err e;
    cr_assert_eq(kc_store_get(s, want->key, &got, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(got.payload_len, want->payload_len);
    kc_artifact_free(&got);
}

static char *file_of(const char *name, size_t *len)
{
    char *path = kc_test_path(dir, name);
    char *bytes = kc_test_read_file(path, len);
    free(path);
    return bytes;
}

static off_t size_of(const char *name)
{
    char *path = kc_test_path(dir, name);
    struct stat sb;
    off_t n = stat(path, &sb) == 0 ? sb.st_size : -1;
    free(path);
    return n;
}

/* One value from the database, read with SQLite directly. */
static int64_t db_value(const char *sql)
{
    char *path = kc_test_path(dir, "kcache.db");
    sqlite3 *db;
    cr_assert_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
    int64_t v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    sqlite3_finalize(st);
    sqlite3_close(db);
    free(path);
    return v;
}

static int64_t atime_of(const char *key)
{
    char sql[160];
    snprintf(sql, sizeof sql, "SELECT atime FROM entries WHERE key = '%s'", key);
    return db_value(sql);
}

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* A line of the access log as the store writes it (kc_store_access.c). */
static void log_line(FILE *f, const char *body)
{
    fprintf(f, "%s %016llx\n", body, (unsigned long long)XXH3_64bits(body, strlen(body)));
}

/* ---- tests ------------------------------------------------------------ */

Test(store_access, a_read_only_hit_writes_and_syncs_nothing_in_the_database)
{
    kc_artifact a[6];
    fill(a, 6);
    size_t len0;
    char *db0 = file_of("kcache.db", &len0);
    cr_assert_not_null(db0);

    count_sqlite_io();
    kc_store *s = open_store();
    kc_err e;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 6; i++) {
            get(s, &a[i]);
            cr_assert_eq(kc_store_check(s, a[i].key, &e), KC_OK, "%s", e.msg);
            uint8_t *z;
            size_t zlen, env_len;
            cr_assert_eq(kc_store_get_zstd(s, a[i].key, &z, &zlen, &env_len, &e), KC_OK);
            free(z);
        }
        char miss[65];
        kc_sha256_hex("no such artifact", 16, miss);
        kc_artifact none;
        cr_assert_eq(kc_store_get(s, miss, &none, &e), KC_ERR_NOT_FOUND);
        cr_assert_eq(kc_store_flush(s, &e), KC_OK, "%s", e.msg);
    }
    kc_store_close(s);

    cr_expect_eq(n_syncs, 0, "a read-only session synced %d times", n_syncs);
    cr_expect_eq(n_writes, 0, "a read-only session wrote %d times through SQLite", n_writes);
    cr_expect_eq(n_truncates, 0);
    size_t len1;
    char *db1 = file_of("kcache.db", &len1);
    cr_assert(len0 == len1 && memcmp(db0, db1, len0) == 0, "kcache.db changed on hits");
    cr_expect_leq(size_of("kcache.db-wal"), 0, "the WAL grew on hits");
    free(db0);
    free(db1);
    for (int i = 0; i < 6; i++)
        kc_artifact_free(&a[i]);
}

Test(store_access, hits_of_another_process_reach_stats_and_the_lru_order)
{
    kc_artifact a[3];
    fill(a, 3); /* a[0] is the least recently used */
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        kc_store *s;
        kc_err e;
        if (kc_store_open(dir, NULL, &s, &e) != KC_OK)
            _exit(1);
        kc_artifact got;
        if (kc_store_get(s, a[0].key, &got, &e) != KC_OK)
            _exit(2);
        kc_artifact_free(&got);
        kc_store_close(s);
        _exit(0);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the reader failed: %d", status);

    kc_store *s = open_store();
    kc_store_stats st;
    kc_err e;
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK, "%s", e.msg);
    cr_expect_eq(st.hits, 1, "the other process's hit is counted");
    cr_expect_eq(st.misses, 0);
    uint64_t evicted = 0;
    cr_assert_eq(kc_store_gc(s, st.stored_bytes - 1, &evicted, &e), KC_OK, "%s", e.msg);
    cr_assert_geq(evicted, 1);
    cr_expect_eq(kc_store_has(s, a[0].key, &e), KC_OK, "the entry just read was evicted");
    cr_expect_eq(kc_store_has(s, a[1].key, &e), KC_ERR_NOT_FOUND, "LRU order ignored the hit");
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK);
    cr_expect_eq(st.hits, 1, "counted once after the fold");
    kc_store_close(s);
    for (int i = 0; i < 3; i++)
        kc_artifact_free(&a[i]);
}

Test(store_access, the_access_log_is_private_whatever_the_umask)
{
    kc_artifact a[1];
    fill(a, 1);
    mode_t old = umask(0);
    kc_store *s = open_store();
    get(s, &a[0]);
    kc_store_close(s);
    umask(old);
    char *path = kc_test_path(dir, "kcache.db-access");
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0, "no access log after a hit");
    cr_expect_eq(sb.st_mode & 0777, 0600, "access log mode %o", sb.st_mode & 0777);
    free(path);
    kc_artifact_free(&a[0]);
}

Test(store_access, the_next_write_folds_the_access_log_into_the_database)
{
    kc_artifact a[4];
    fill(a, 3);
    int64_t before = atime_of(a[1].key);
    kc_store *s = open_store();
    get(s, &a[1]);
    get(s, &a[1]);
    kc_store_close(s);
    cr_expect_eq(atime_of(a[1].key), before, "a read wrote the database");
    cr_expect_eq(db_value("SELECT value FROM counters WHERE name = 'hits'"), 0);
    cr_assert_gt(size_of("kcache.db-access"), 0, "no access log after hits");

    s = open_store();
    kc_err e;
    make(&a[3], 3, 1000);
    cr_assert_eq(kc_store_put(s, &a[3], NULL, &e), KC_OK, "%s", e.msg);
    kc_store_close(s);
    cr_expect_eq(size_of("kcache.db-access"), 0, "the write left the log unfolded");
    cr_expect_gt(atime_of(a[1].key), before, "the hit's access time was not folded in");
    cr_expect_eq(db_value("SELECT value FROM counters WHERE name = 'hits'"), 2);
    for (int i = 0; i < 4; i++)
        kc_artifact_free(&a[i]);
}

Test(store_access, damaged_access_log_lines_are_skipped_and_times_kept_sane)
{
    kc_artifact a[3];
    fill(a, 3);
    int64_t before = atime_of(a[0].key);
    char *path = kc_test_path(dir, "kcache.db-access");
    FILE *f = fopen(path, "a");
    cr_assert_not_null(f);
    char body[160];
    fputs("garbage that is no record\n", f);
    fwrite("\0\0\0\0\0\0\0\0\0\0\0\0", 1, 12, f);               /* zeros after a crash */
    snprintf(body, sizeof body, "a %s %lld", a[1].key, 1000LL); /* cut short: no check */
    fputs(body, f);
    fputs("\n", f);
    snprintf(body, sizeof body, "a %s %lld", a[1].key, (long long)now_us());
    fprintf(f, "%s 0123456789abcdef\n", body); /* a wrong check */
    snprintf(body, sizeof body, "a %s %lld", a[2].key, (long long)now_us() + 3600000000LL);
    log_line(f, body); /* an hour ahead: kept, but not in the future */
    snprintf(body, sizeof body, "a %s %lld", a[0].key, (long long)now_us());
    log_line(f, body);
    log_line(f, "c 5 2 0");
    fclose(f);
    free(path);

    kc_store *s = open_store();
    kc_store_stats st;
    kc_err e;
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK, "%s", e.msg);
    cr_expect_eq(st.hits, 5);
    cr_expect_eq(st.misses, 2);
    cr_assert_eq(kc_store_gc(s, UINT64_MAX, NULL, &e), KC_OK, "%s",
                 e.msg); /* folds, evicts nothing */
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK);
    cr_expect_eq(st.hits, 5);
    cr_expect_eq(st.entries, 3);
    kc_store_close(s);
    cr_expect_gt(atime_of(a[0].key), before);
    cr_expect_eq(atime_of(a[1].key) < before + 60000000LL, true, "a damaged line was applied");
    cr_expect_leq(atime_of(a[2].key), now_us(), "an access time from the future was kept");
    cr_expect_eq(size_of("kcache.db-access"), 0);
    for (int i = 0; i < 3; i++)
        kc_artifact_free(&a[i]);
}

Test(store_access, many_hits_keep_the_access_log_small_without_a_database_write)
{
    kc_artifact a[4];
    fill(a, 4);
    count_sqlite_io();
    kc_store *s = open_store();
    kc_err e;
    off_t largest = 0;
    for (int round = 0; round < 3000; round++) {
        for (int i = 0; i < 4; i++) {
            cr_assert_eq(kc_store_check(s, a[i].key, &e), KC_OK, "%s", e.msg);
        }
        cr_assert_eq(kc_store_flush(s, &e), KC_OK, "%s", e.msg);
        off_t n = size_of("kcache.db-access");
        largest = n > largest ? n : largest;
    }
    kc_store_stats st;
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK, "%s", e.msg);
    kc_store_close(s);
    cr_expect_eq(st.hits, 12000, "hits lost when the log was shrunk");
    /* 12,000 lines of 101 bytes: over 1 MiB unless shrunk on the way */
    cr_expect_lt(largest, (1 << 20) + 4096, "the access log grew to %lld bytes",
                 (long long)largest);
    cr_expect_lt(size_of("kcache.db-access"), largest);
    cr_expect_eq(n_syncs, 0, "shrinking the log synced %d times", n_syncs);
    cr_expect_eq(n_writes, 0, "shrinking the log wrote the database");
    for (int i = 0; i < 4; i++)
        kc_artifact_free(&a[i]);
}

/* The "hits" of `kcache --json stats` on the test's cache. */
static json_int_t stats_hits(void)
{
    const char *args[] = {"--json", "stats", NULL};
    kc_test_result r;
    cr_assert_eq(kc_test_kcache(&r, KC_TEST_KCACHE, dir, NULL, args), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert(json_is_integer(json_object_get(j, "hits")), "%s", r.out);
    json_int_t hits = json_integer_value(json_object_get(j, "hits"));
    json_decref(j);
    kc_test_result_free(&r);
    return hits;
}

Test(store_access, a_log_of_many_keys_is_folded_into_the_database)
{
    enum { KEYS = 3000 }; /* one line each: more than a shrunk log may keep */
    kc_store *s = open_store();
    kc_err e;
    static char keys[KEYS][65];
    cr_assert_eq(kc_store_batch_begin(s, &e), KC_OK, "%s", e.msg);
    for (int i = 0; i < KEYS; i++) {
        char body[32];
        snprintf(body, sizeof body, "small %d", i);
        kc_sha256_hex(body, strlen(body), keys[i]);
        kc_artifact a;
        cr_assert_eq(kc_artifact_init(&a, keys[i], "blob", NULL, body, strlen(body), &e), KC_OK);
        cr_assert_eq(kc_store_put(s, &a, NULL, &e), KC_OK, "%s", e.msg);
        kc_artifact_free(&a);
    }
    cr_assert_eq(kc_store_batch_end(s, true, &e), KC_OK, "%s", e.msg);
    kc_store_close(s);
    s = open_store();
    for (int pass = 0; pass < 4; pass++) {
        for (int i = 0; i < KEYS; i++)
            cr_assert_eq(kc_store_check(s, keys[i], &e), KC_OK, "%s", e.msg);
        cr_assert_eq(kc_store_flush(s, &e), KC_OK, "%s", e.msg);
    }
    kc_store_close(s);
    int64_t folded = db_value("SELECT value FROM counters WHERE name = 'hits'");
    cr_expect_gt(folded, 0, "the oversized log was not folded");
    cr_expect_lt(size_of("kcache.db-access"), 1 << 20);
    s = open_store();
    kc_store_stats st;
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK, "%s", e.msg);
    cr_expect_eq(st.hits, 4 * KEYS, "hits lost or doubled by the fold");
    kc_store_close(s);
}

Test(store_access, a_warm_compile_leaves_the_database_untouched)
{
    char *mlp = kc_test_path(KC_TEST_SOURCE_DIR, "examples/mlp.json");
    const char *args[] = {"--json", "compile", mlp, NULL};
    kc_test_result r;
    cr_assert_eq(kc_test_kcache(&r, KC_TEST_KCACHE, dir, NULL, args), 0);
    cr_assert_eq(r.exit_code, 0, "cold compile: %s", r.err);
    kc_test_result_free(&r);
    json_int_t hits0 = stats_hits();
    size_t len0, len1;
    char *db0 = file_of("kcache.db", &len0);
    cr_assert_not_null(db0);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(kc_test_kcache(&r, KC_TEST_KCACHE, dir, NULL, args), 0);
        cr_assert_eq(r.exit_code, 0, "warm compile: %s", r.err);
        json_t *j = json_loads(r.out, 0, NULL);
        cr_assert_eq(json_integer_value(json_object_get(j, "misses")), 0, "%s", r.out);
        cr_assert_eq(json_integer_value(json_object_get(j, "hits")), 4, "%s", r.out);
        json_decref(j);
        kc_test_result_free(&r);
    }
    char *db1 = file_of("kcache.db", &len1);
    cr_assert(len0 == len1 && memcmp(db0, db1, len0) == 0, "kcache.db changed on warm hits");
    cr_expect_leq(size_of("kcache.db-wal"), 0, "the WAL grew on warm hits");
    cr_expect_geq(stats_hits(), hits0 + 8, "the warm hits were not counted");
    free(db0);
    free(db1);
    free(mlp);
}
